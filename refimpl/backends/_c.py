"""The C backend: validated wrappers around the cffi module ``refimpl._native._kernels``.

The compiled module is built from ckernels/ by build_ext.py when the package is installed (see
docs/backends.md).  It is loaded on first use, never at ``import refimpl``, so a missing or broken build
costs nothing until the C backend is asked for, and then :func:`refimpl.backends.available` says why.

Every call goes through the same steps: validate (refimpl.backends._validate: dtype, shapes,
contiguity; inputs copied to C-contiguous if needed, ``out`` refused if it is not usable as is), fill the
output with NaN, pass the buffers with ``ffi.from_buffer`` under the C type that matches the validated
dtype, and check the returned status.  The NaN fill means that an output element the kernel failed to
write cannot pass a comparison with the reference (unless the reference is NaN there too, which the
agreement tests avoid except where they test NaN propagation).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import _validate, register

_LOCK = threading.Lock()
_MODULE: list[Any] = []          # [module] once loaded
_ERROR: list[BaseException] = []  # [import error] once tried and failed


def _load(refresh: bool = False) -> Any:
    """The compiled module, importing it on first use; raises ImportError (with the cause) if absent."""
    with _LOCK:
        if refresh:
            _MODULE.clear()
            _ERROR.clear()
        if not _MODULE and not _ERROR:
            try:
                from refimpl._native import _kernels
                _MODULE.append(_kernels)
            except Exception as exc:  # ImportError, or an OSError from a broken shared object
                _ERROR.append(exc)
        if _ERROR:
            raise ImportError(f"the compiled module refimpl._native._kernels could not be imported: "
                              f"{_ERROR[0]!r}") from _ERROR[0]
        return _MODULE[0]


_ISA_NAMES = {0: "baseline (SSE2 on x86-64)", 1: "AVX2", 2: "AVX-512"}


def status(refresh: bool = False) -> tuple[bool, str]:
    """(ok, reason) for :func:`refimpl.backends.available`."""
    try:
        mod = _load(refresh)
    except ImportError as exc:
        return False, (f"{exc}; build it with `pip install -e .` (or `python build_ext.py` in a checkout), "
                       f"see docs/backends.md")
    lib, ffi = mod.lib, mod.ffi
    flags = ffi.string(lib.refimpl_build_flags()).decode()
    isa = _ISA_NAMES.get(lib.refimpl_isa_in_use(), "unknown")
    others = [p.name for p in Path(mod.__file__).parent.glob("_kernels*") if p.suffix in (".so", ".pyd")
              and p.name != Path(mod.__file__).name]
    stale = f"; NOTE: other builds next to it are ignored: {others}" if others else ""
    return True, f"compiled module {mod.__file__}; vector level {isa}; built with: {flags}{stale}"


def _ctype(dtype: np.dtype) -> str:
    return "double[]" if dtype == np.float64 else "float[]"


@register("depthwise_conv2d", "c")
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
    mod = _load()
    a = _validate.depthwise_args(x, weight, bias, stride, pads, out, dilation, "C")
    from . import empty_aligned
    result = a.out if a.out is not None else empty_aligned(a.out_shape, a.x.dtype)
    result.fill(np.nan)  # poison: an element the kernel does not write stays NaN
    _call(mod, result, a)
    return result


def _call(mod: Any, result: np.ndarray, a: "_validate.DepthwiseArgs") -> None:
    """Pass validated buffers to refimpl_dwconv2d_f32/_f64 and check the status."""
    ffi, lib = mod.ffi, mod.lib
    dt = a.x.dtype
    ct = _ctype(dt)
    fn = lib.refimpl_dwconv2d_f64 if dt == np.float64 else lib.refimpl_dwconv2d_f32
    b_, c, h, w = a.x.shape
    _, kh, kw = a.weight.shape
    _, _, oh, ow = a.out_shape
    status = fn(ffi.from_buffer(ct, result, require_writable=True), ffi.from_buffer(ct, a.x),
                ffi.from_buffer(ct, a.weight), ffi.NULL if a.bias is None else ffi.from_buffer(ct, a.bias),
                a.stride[0], a.stride[1], a.pad_top, a.pad_left, b_, c, h, w, kh, kw, oh, ow)
    if status != 0:
        msg = ffi.string(lib.refimpl_status_string(status)).decode()
        raise RuntimeError(f"C kernel {fn.__name__ if hasattr(fn, '__name__') else 'refimpl_dwconv2d'} refused "
                           f"its arguments (status {status}: {msg}); this is a bug in refimpl.backends._c's "
                           f"validation")
