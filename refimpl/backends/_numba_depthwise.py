"""Numba depthwise conv2d: the Numba twin of ``refimpl.layers._depthwise_conv2d_numpy``.

Compiled on first use per dtype with an explicit signature (refimpl.backends._numba's runtime: the lock
and cache of compiled kernels, the Numba import).  This module imports nothing from refimpl.attention,
refimpl.layers or refimpl.models.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import config
from . import _validate
from ._numba import _COMPILED, _LOCK, _import_numba
from ._registry import register
from ._validate import depthwise_supported, empty_aligned


# ---------------------------------------------------------------------------------------------------
# depthwise conv2d
# ---------------------------------------------------------------------------------------------------

def _dwconv2d_kernel(out, x, w, b, has_bias, sh, sw, pt, pl, zero):  # pragma: no cover - runs compiled
    """out (B, C, OH, OW) <- depthwise conv of x (B, C, H, W) with w (C, KH, KW) and b (C,) if has_bias.

    The NumPy definition's operations in its order, per output element: acc = 0, then acc += w[u, v] *
    xpad[...] over (u, v) row-major, then acc + b.  Whole output rows are updated one tap at a time (the
    inner loop runs over contiguous output columns, and vectorises).  Taps in the zero padding add
    w * 0: for a channel whose weights are all finite that is +-0 and is skipped (tap rows by clipping
    u, tap columns by clipping the column range); a channel with an infinite or NaN weight takes the
    literal loop, which adds w * 0 (NaN there, as in the definition).  ``zero`` is 0 in the element type.
    (The two paths are separate loop nests: mixing them in one made LLVM give up on vectorising.)
    """
    nb, nc, h, wd = x.shape
    kh, kw = w.shape[1], w.shape[2]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for p in range(nb * nc):
        bi = p // nc
        c = p % nc
        finite = True
        for u in range(kh):
            for v in range(kw):
                if not np.isfinite(w[c, u, v]):
                    finite = False
        if finite:
            for oh in range(oh_n):
                orow = out[bi, c, oh]             # contiguous 1-d views
                for ow in range(ow_n):
                    orow[ow] = zero
                ih0 = oh * sh - pt
                u_lo = max(0, -ih0)               # tap rows above / below the image: padding
                u_hi = min(kh, h - ih0)
                for u in range(u_lo, u_hi):
                    xrow = x[bi, c, ih0 + u]
                    for v in range(kw):
                        wv = w[c, u, v]
                        # Output columns whose input column ow*sw - pl + v is inside [0, wd).
                        lo = (pl - v + sw - 1) // sw if pl - v > 0 else 0
                        hi = (wd - 1 + pl - v) // sw + 1 if wd - 1 + pl - v >= 0 else 0
                        lo = min(lo, ow_n)
                        hi = max(min(hi, ow_n), lo)
                        # Unsigned indices (all >= 0 here) spare Numba's negative-index wraparound,
                        # which would stop the loop from vectorising; slicing instead would cost
                        # reference-count traffic per tap.
                        o0 = np.uint64(lo)
                        x0 = np.uint64(lo * sw + v - pl)
                        if sw == 1:
                            for t in range(hi - lo):
                                ut = np.uint64(t)
                                orow[o0 + ut] += wv * xrow[x0 + ut]
                        else:
                            us = np.uint64(sw)
                            for t in range(hi - lo):
                                ut = np.uint64(t)
                                orow[o0 + ut] += wv * xrow[x0 + ut * us]
                if has_bias:
                    bc = b[c]
                    for ow in range(ow_n):
                        orow[ow] += bc
        else:
            for oh in range(oh_n):
                for ow in range(ow_n):
                    acc = zero
                    for u in range(kh):
                        ih = oh * sh - pt + u
                        for v in range(kw):
                            iw = ow * sw - pl + v
                            xv = x[bi, c, ih, iw] if 0 <= ih < h and 0 <= iw < wd else zero
                            acc += w[c, u, v] * xv
                    out[bi, c, oh, ow] = acc + b[c] if has_bias else acc


def _dwconv2d_compiled(dtype: np.dtype) -> Callable[..., Any]:
    """The kernel compiled for ``dtype`` (float32/float64), compiling it on first use."""
    key = ("dwconv2d", dtype.name)
    fn = _COMPILED.get(key)
    if fn is None:
        numba = _import_numba()
        t = dtype.name
        sig = (f"void({t}[:, :, :, ::1], {t}[:, :, :, ::1], {t}[:, :, ::1], {t}[::1], boolean, "
               f"int64, int64, int64, int64, {t})")
        with _LOCK:
            fn = _COMPILED.get(key)
            if fn is None:
                fn = numba.njit(sig, cache=True, nogil=True, fastmath=config.NUMBA_FASTMATH)(_dwconv2d_kernel)
                _COMPILED[key] = fn
    return fn


@register("depthwise_conv2d", "numba", supports=depthwise_supported)
def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: tuple[int, int],
                     pads: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1), *,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Depthwise conv2d forward in Numba: the Numba twin of ``refimpl.layers._depthwise_conv2d_numpy``.

    out[b, c, i, j] = sum_{u, v} w[c, u, v] x_pad[b, c, i*sh + u, j*sw + v] + bias[c]

    Same arguments, results and errors as the C kernel (:func:`refimpl.backends._c_depthwise.depthwise_conv2d`):
    x (B, C, H, W) float32/float64; weight (C, 1, KH, KW) or (C, KH, KW); bias (C,) or None; stride
    (sh, sw); pads (top, bottom, left, right); dilation must be (1, 1); optional ``out`` (B, C, OH, OW)
    C-contiguous aligned writeable buffer of the same dtype.  Computed in the dtype of ``x`` with the
    definition's operations in its order (bitwise the NumPy definition in that dtype, up to the sign
    of a zero).  Raises ImportError if Numba is missing.

    References
    ----------
    Howard et al., "MobileNets" (2017), Sec. 3.1; PyTorch ``torch.nn.Conv2d`` documentation.
    """
    _import_numba()
    a = _validate.depthwise_args(x, weight, bias, stride, pads, out, dilation, "Numba")
    kernel = _dwconv2d_compiled(a.x.dtype)
    result = a.out if a.out is not None else empty_aligned(a.out_shape, a.x.dtype)
    result.fill(np.nan)  # poison: an element the kernel does not write stays NaN
    dt = a.x.dtype.type
    # Numba types read-only arrays differently from writeable ones; the signature is for writeable ones.
    xs = a.x if a.x.flags.writeable else a.x.copy()
    ws = a.weight if a.weight.flags.writeable else a.weight.copy()
    if a.bias is None:
        bs = np.zeros(0, dtype=a.x.dtype)
    else:
        bs = a.bias if a.bias.flags.writeable else a.bias.copy()
    kernel(result, xs, ws, bs, a.bias is not None, a.stride[0], a.stride[1], a.pad_top, a.pad_left, dt(0))
    return result
