"""Element-wise Numba kernels: GELU.

- ``"gelu"``: ``gelu(x, approximate="none", *, out=None, threads=None)``, the Numba twin of
  ``refimpl.numerics.gelu`` (the definition, registered by ``refimpl.layers``), float64 only.

Compiled on first use with an explicit signature on C-contiguous 1-d arrays, ``cache=True``, ``nogil=True``,
``fastmath=config.NUMBA_FASTMATH`` (False) and ``error_model="numpy"`` (refimpl.backends._numba._compile).
Arguments are checked as for the C twin (refimpl.backends._c_elementwise.gelu_args; the checks are
pure Python and load no compiled module).  Large arrays are cut into blocks run on the Numba backend's worker
threads (refimpl.backends._numba._run_shared, the LiSA forward's pool; no prange, as no other Numba kernel
here uses it); the map is element-wise, so the thread count changes no bit.  This module imports nothing
from refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from ._c import _threads
from ._c_elementwise import GELU_FORMS, gelu_args, gelu_supported
from ._numba import _compile, _import_numba, _run_shared
from ._registry import register
from ._validate import empty_aligned

#: The definition's constants: x / sqrt(2.0) (a division, as numerics.gelu) and sqrt(2 / pi) of the tanh form.
_SQRT2 = math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)
#: config.GELU_TANH_COEF (frozen into the compiled kernel; ckernels/gelu.c spells the same literal).
_TANH_COEF = config.GELU_TANH_COEF

#: Elements per block of a multi-threaded call, and the smallest call that uses more than one thread (as
#: GELU_BLOCK / GELU_PARALLEL_MIN in ckernels/gelu.c).
_BLOCK = 16384
_PARALLEL_MIN = 32768


def _gelu_kernel(out, x, form):  # pragma: no cover - runs compiled
    """out[i] = GELU(x[i]) with the definition's operations in its order: (0.5 x) (1 + erf(x / sqrt 2))
    (form 0), or (0.5 x) (1 + tanh(c (x + ((k x) x) x))) (form 1); math.erf / math.tanh are libm's."""
    n = x.shape[0]
    if form == 0:
        for i in range(n):
            v = x[i]
            out[i] = (0.5 * v) * (1.0 + math.erf(v / _SQRT2))
    else:
        for i in range(n):
            v = x[i]
            cube = ((_TANH_COEF * v) * v) * v
            out[i] = (0.5 * v) * (1.0 + math.tanh(_TANH_C * (v + cube)))


@register("gelu", "numba", supports=gelu_supported)
def gelu(x: np.ndarray, approximate: str = "none", *, out: np.ndarray | None = None,
         threads: int | None = None) -> np.ndarray:
    """GELU in Numba: the Numba twin of ``refimpl.numerics.gelu`` (float64).

    The same operations in the same order as the C twin (refimpl.backends._c_elementwise.gelu, ckernels/
    gelu.c) and the definition, with libm's erf / tanh through math.erf / math.tanh: within
    ``refimpl.layers.gelu_bound`` of the definition, the IEEE special values exactly the definition's
    (+-0 -> +-0, +Inf -> +Inf, -Inf -> NaN, NaN -> NaN, x << 0 -> -0).

    Parameters
    ----------
    x : float64 array, any non-empty shape with at least one dimension (copied to C order if it is not).
    approximate : "none" | "tanh".
    out : optional float64 array of x's shape, C-contiguous, aligned, writeable; x itself or an array
        sharing no memory with x.
    threads : int >= 1 or None (refimpl.backends._c.default_threads()); speed only.

    Returns
    -------
    float64 array of x's shape (C order).

    References
    ----------
    Hendrycks & Gimpel (2016), Sec. 2; PyTorch ``torch.nn.functional.gelu``.
    """
    _import_numba()
    nthreads = _threads(threads)
    a, out = gelu_args(x, approximate, out, "Numba")
    result = out if out is not None else empty_aligned(a.shape, a.dtype)
    if not np.may_share_memory(result, a):
        result.fill(np.nan)  # poison: an element the kernel does not write stays NaN
    kern = _compile("gelu", _gelu_kernel, "void(float64[::1], float64[::1], int64)")
    src, dst, form = a.reshape(-1), result.reshape(-1), GELU_FORMS[approximate]
    n = src.size
    if nthreads == 1 or n < _PARALLEL_MIN:
        kern(dst, src, form)
    else:
        bounds = range(0, n, _BLOCK)
        _run_shared([lambda i=i: kern(dst[i:i + _BLOCK], src[i:i + _BLOCK], form) for i in bounds], nthreads)
    return result
