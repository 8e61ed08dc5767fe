"""C windowed softmax attention (Swin Eq. 4 per window): the validated wrapper of
``refimpl_window_attention_f32/_f64``.

- ``"window_softmax_attention"``: ``window_softmax_attention(q, k, v, scale, bias=None, mask=None, *,
  out=None, workspace=None, threads=None)`` (twin ``refimpl.attention.softmax._window_softmax_attention_numpy``,
  reached through the registry for the range fallback).

The runtime (module loading, status check, threads, range fallback) is refimpl.backends._c's.  This module
imports nothing from refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _validate
from ._c import _load, _threads, run_kernel, workspace_for
from ._registry import definition, register
from ._validate import empty_aligned, float_arrays


def _window_softmax_supported(q: Any, k: Any, v: Any, scale: Any, bias: Any = None, mask: Any = None,
                              **_: Any) -> bool:
    """One float32/float64 dtype for q, k, v and the bias (if any)."""
    return float_arrays(q, k, v) and (bias is None or getattr(bias, "dtype", None) == q.dtype)


@register("window_softmax_attention", "c", supports=_window_softmax_supported)
def window_softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bias: Any = None,
                             mask: Any = None, *, out: np.ndarray | None = None, workspace: np.ndarray | None = None,
                             threads: int | None = None) -> np.ndarray:
    """Windowed softmax attention with relative-position bias and shift mask in C: the C twin of
    ``refimpl.attention.softmax._window_softmax_attention_numpy``.

    O = softmax((q scale) k^T + bias, masked) v per (window, head), masked logits -inf (a fully masked row
    is NaN, as the definition).  Each (window, head) is one work item written by one thread, every sum in
    a fixed order: bitwise reproducible across runs, thread counts and vector levels, and within
    ``softmax.softmax_attention_error``'s bound of the float64 definition.

    Parameters
    ----------
    q : (BW, h, n, d); k : (BW, h, m, d); v : (BW, h, m, e); one dtype, float32 or float64.
    scale : float (q is multiplied by it before the products, as the definition does).
    bias : None, (h, n, m) or (1, h, n, m) (shared by the windows: Swin's relative-position bias), or
        (BW, h, n, m); same dtype.
    mask : None or bool (nW, n, m) / (nW, 1, n, m), True = may attend; BW must be a multiple of nW, window
        w of image b being row b nW + w of q (refimpl.layers.window_partition's order).
    out, workspace, threads : as :func:`linear_attention` (workspace: at least
        ``refimpl_window_attention_workspace(n, m, d, threads)`` elements of the compiled module).

    Returns
    -------
    (BW, h, n, e) array of the dtype of q.

    Range: as :func:`linear_attention`: float64 q, k, v or bias above 2^``config.RANGE_RESCALE_EXPONENT``, or
    a NaN/Inf result (a fully masked row included), are answered by the NumPy definition, which
    rescales q, k and v exactly by powers of two (1e150-sized q and k give the saturated softmax, not NaN).

    References
    ----------
    Swin Transformer (Liu et al., 2021) §3.2, Eq. 4; Vaswani et al. (2017) Eq. 1.
    """
    mod = _load()
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"argument 'scale': expected a real number, got {type(scale).__name__}")
    nthreads = _threads(threads)
    a = _validate.linear_attention_args(q, k, v, out, "C")
    sz = a.sizes
    bw, h, n, m, d = sz["B"], sz["h"], sz["N"], sz["M"], sz["d"]
    dt = a.q.dtype
    bias_c, bias_count, mask_c, mask_count = _validate.window_bias_mask(bias, mask, sz, dt)
    need = int(mod.lib.refimpl_window_attention_workspace(n, m, d, nthreads))
    if need < 0:
        raise ValueError(f"arguments 'k'/'q': sizes m={m}, d={d} overflow the workspace size")
    ws = workspace_for(workspace, need, dt, (("q", q), ("k", k), ("v", v), ("out", out), ("bias", bias)), "q")
    result = a.out if a.out is not None else empty_aligned(a.out_shape, dt)

    def twin() -> np.ndarray:
        return definition("window_softmax_attention")(q, k, v, float(scale), bias, mask)

    return run_kernel("window_attention", result, a.q, a.k, a.v, bias_c, mask_c, float(scale), bw * h, h, n, m, d,
                      sz["e"], max(bias_count, 1), max(mask_count, 1), ws.size, nthreads, workspace=ws, twin=twin,
                      band=(a.q, a.k, a.v, bias_c))
