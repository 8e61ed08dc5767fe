"""Comparison helpers of the equivalence suite, built on the error model (refimpl.numerics).

Every comparison checks the tensor's shape and dtype first, then values through
:func:`refimpl.numerics.assert_close`: a per-element bound k u_T S, agreement of the NaN/Inf patterns, and
the ratio to a naive same-precision NumPy computation.  No test in this suite uses hand-picked atol/rtol.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch

from refimpl import numerics
from refimpl.numerics import Bound, ErrorReport

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """"float32" -> torch.float32 (float16, bfloat16, float32, float64)."""
    return _TORCH_DTYPES[name]


def to_numpy(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A tensor (any device, any float dtype) as a float64 ndarray."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).double().numpy()
    return np.asarray(t, dtype=np.float64)


def to_torch(a: np.ndarray, dtype_name: str, device: str) -> torch.Tensor:
    """A float64 ndarray as a tensor of the tested dtype on ``device`` (values are rounded to T)."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(device=device,
                                                                         dtype=torch_dtype(dtype_name))


def state_dict_to_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """The module's state_dict as float64 arrays, keyed exactly as PyTorch keys it (DESIGN.md convention 1).
    Integer buffers (e.g. BatchNorm's num_batches_tracked) are dropped: the reference takes floats only."""
    return {k: to_numpy(v) for k, v in module.state_dict().items() if v.is_floating_point()}


def round_params(params: Mapping[str, np.ndarray], dtype_name: str) -> dict[str, np.ndarray]:
    """Round every parameter to the tested dtype (as float64 values) so both sides see identical weights."""
    return {k: numerics.round_to(v, dtype_name) for k, v in params.items()}


def load_numpy_state(module: torch.nn.Module, params: Mapping[str, np.ndarray]) -> None:
    """Load float64 arrays into ``module`` (strict: every key must match both ways)."""
    sd = module.state_dict()
    missing = set(sd) - set(params) - {k for k, v in sd.items() if not v.is_floating_point()}
    extra = set(params) - set(sd)
    if missing or extra:
        raise KeyError(f"state_dict keys differ: missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for k, v in params.items():
            sd[k].copy_(torch.from_numpy(np.asarray(v, dtype=np.float64)))


def assert_matches(actual: torch.Tensor | np.ndarray, reference: np.ndarray, bound: Bound, dtype_name: str,
                   *, naive: Any = None, name: str = "output") -> ErrorReport:
    """Check shape, dtype, then values of a tested output against the float64 reference.

    actual : the PyTorch output (its dtype must be the tested dtype ``dtype_name``).
    reference : the refimpl output on the same T-rounded inputs and weights.
    naive : the naive same-precision NumPy computation (numerics.naive_same_precision), or None for float64.
    """
    if isinstance(actual, torch.Tensor) and actual.dtype != torch_dtype(dtype_name):
        raise AssertionError(f"{name}: dtype {actual.dtype}, expected {torch_dtype(dtype_name)}")
    if tuple(actual.shape) != tuple(np.shape(reference)):
        raise AssertionError(f"{name}: shape {tuple(actual.shape)}, reference {tuple(np.shape(reference))}")
    return numerics.assert_close(to_numpy(actual), reference, bound, dtype_name, naive=naive, name=name)


def naive(fn: Callable[..., Any], *args: Any, dtype_name: str, **kwargs: Any) -> Any:
    """The naive same-precision NumPy computation of ``fn`` (None when T is float64, where the naive
    computation is the reference itself and only the ULP floor applies)."""
    if dtype_name == "float64":
        return None
    return numerics.naive_same_precision(fn, *args, dtype=dtype_name, **kwargs)
