"""C depthwise conv2d: the validated wrapper of ``refimpl_dwconv2d_f32/_f64`` (ckernels/dwconv2d*.c).

- ``"depthwise_conv2d"``: ``depthwise_conv2d(x, weight, bias, stride, pads, dilation=(1, 1), *, out=None)``
  (twin ``refimpl.layers._depthwise_conv2d_numpy``).

The steps of every wrapper of refimpl.backends._c (validate, poison, then refimpl.backends._c.call_kernel:
``ffi.from_buffer``, the call, the status check); the compiled module is the one of refimpl.backends._c
(loaded on first use).  This module
imports nothing from refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

import numpy as np

from . import _validate
from ._c import _load, _poison, call_kernel
from ._registry import register
from ._validate import depthwise_supported, empty_aligned


@register("depthwise_conv2d", "c", supports=depthwise_supported)
def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: tuple[int, int],
                     pads: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1), *,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Depthwise conv2d forward in C: the C twin of ``refimpl.layers._depthwise_conv2d_numpy``.

    out[b, c, i, j] = sum_{u, v} w[c, u, v] x_pad[b, c, i*sh + u, j*sw + v] + bias[c]

    (PyTorch ``conv2d(..., groups=C)`` with zero padding; the layer is used by LCM, DWC, CPE and LePE.)
    Computed in the dtype of ``x`` with the definition's operations in the definition's order, so for
    finite inputs the result equals the NumPy definition evaluated in that dtype, bit for bit (up to the
    sign of a zero), and lies within ``refimpl.layers.depthwise_conv2d_bound`` of the float64 reference.

    Parameters
    ----------
    x : (B, C, H, W) float32 or float64.
    weight : (C, 1, KH, KW) or (C, KH, KW), same dtype; any KH, KW >= 1 (odd or even).
    bias : (C,) same dtype, or None.
    stride : (sh, sw), integers >= 1.
    pads : (top, bottom, left, right), integers >= 0 (asymmetric allowed).
    dilation : must be (1, 1): the kernel has no dilation (``refimpl.layers.depthwise_conv2d`` sends
        dilated convolutions to the NumPy definition); anything else raises ValueError.
    out : optional (B, C, OH, OW) C-contiguous aligned writeable array of the same dtype, written in
        place and returned (see :func:`refimpl.backends.empty_aligned`); allocated 64-byte aligned if None.

    Returns
    -------
    (B, C, OH, OW) array, OH = (H + top + bottom - KH) // sh + 1, OW likewise.

    Raises
    ------
    TypeError for a dtype other than float32/float64 or mixed dtypes; ValueError for inconsistent
    shapes, bad stride/padding, dilation != 1 or an unusable ``out``; ImportError if the compiled module
    is missing; RuntimeError if the kernel refuses its arguments (a validation bug: it never should).

    References
    ----------
    Howard et al., "MobileNets" (2017), Sec. 3.1 (depthwise convolution); PyTorch ``torch.nn.Conv2d``
    documentation (groups, zero padding).
    """
    _load()  # ImportError before any validation when the compiled module is missing
    a = _validate.depthwise_args(x, weight, bias, stride, pads, out, dilation, "C")
    result = a.out if a.out is not None else empty_aligned(a.out_shape, a.x.dtype)
    _poison(result)  # an element the kernel does not write stays NaN
    _call(result, a)
    return result


def _call(result: np.ndarray, a: "_validate.DepthwiseArgs") -> None:
    """Pass validated buffers to refimpl_dwconv2d_f32/_f64 and check the status."""
    b_, c, h, w = a.x.shape
    _, kh, kw = a.weight.shape
    _, _, oh, ow = a.out_shape
    call_kernel("dwconv2d", result, a.x, a.weight, a.bias, a.stride[0], a.stride[1], a.pad_top, a.pad_left, b_, c,
                h, w, kh, kw, oh, ow)
