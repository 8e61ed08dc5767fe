"""Argument checks shared by the C and Numba wrappers: nothing unchecked reaches a compiled kernel.

A compiled kernel reads raw memory: cffi's ``from_buffer`` does not look at the dtype (a float32 buffer
passed as ``double[]`` would be silently reinterpreted) and neither the C nor the Numba kernel can see a
stride.  So every wrapper first establishes, in Python:

- dtype: float32 or float64 in native byte order, the same for every array argument (no silent
  promotion or downcast at this level: :func:`refimpl.layers.depthwise_conv2d` promotes before it
  dispatches);
- shapes: ranks and every size consistent, nothing empty, output size >= 1;
- layout: inputs C-contiguous, aligned, native order (non-contiguous and negative-stride inputs are
  copied, never passed on); an ``out=`` buffer must already be a C-contiguous, aligned, writeable array
  of the exact dtype and shape that shares no memory with an input (it is refused otherwise: writing
  into a copy would silently drop the result).

Errors are ``TypeError`` (dtype) or ``ValueError`` (shape, layout) naming the argument, the expected and
the given value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import config

KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def empty_aligned(shape: int | tuple[int, ...], dtype: Any = np.float64,
                  alignment: int = config.KERNEL_BUFFER_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``alignment``-byte boundary.

    For ``out=`` and ``workspace=`` buffers that kernels write into and callers reuse across calls
    (allocate once, outside the loop).  ``alignment`` must be a power of two and a multiple of the
    itemsize.  Made by over-allocating a byte buffer and viewing it from the first aligned byte.
    (Public as ``refimpl.backends.empty_aligned``.)
    """
    dt = np.dtype(dtype)
    shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape_t):
        raise ValueError(f"argument 'shape': expected non-negative sizes, got {shape_t}")
    if not isinstance(alignment, (int, np.integer)) or alignment < 1 or alignment & (alignment - 1) \
            or alignment % dt.itemsize:
        raise ValueError(f"argument 'alignment': expected a power of two that is a multiple of the itemsize "
                         f"{dt.itemsize} of {dt}, got {alignment!r}")
    nbytes = math.prod(shape_t) * dt.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dt).reshape(shape_t)


def is_aligned(a: np.ndarray, alignment: int = config.KERNEL_BUFFER_ALIGNMENT) -> bool:
    """Whether ``a``'s data pointer is a multiple of ``alignment`` bytes (trivially so for an empty array,
    which has no data).  (Public as ``refimpl.backends.is_aligned``.)"""
    return a.size == 0 or a.ctypes.data % alignment == 0


def float_arrays(*arrays: Any) -> bool:
    """The common ``supports`` predicate of the float kernels: every array given (None skipped) has one
    dtype, float32 or float64 (what the kernels compute in; other dtypes run on the NumPy definition)."""
    dts = [getattr(a, "dtype", None) for a in arrays if a is not None]
    return (bool(dts) and all(isinstance(dt, np.dtype) for dt in dts) and dts[0] in KERNEL_DTYPES
            and all(dt == dts[0] for dt in dts))


def depthwise_supported(x: Any, weight: Any, bias: Any, stride: Any, pads: Any, dilation: Any = (1, 1),
                        **_: Any) -> bool:
    """The ``supports`` predicate of the depthwise kernels (C and Numba): dilation (1, 1) only; the dtype and
    everything else are checked by the kernels themselves (refimpl.layers.depthwise_conv2d promotes before
    dispatching)."""
    return tuple(dilation) == (1, 1)


def real_scalar(x: Any) -> bool:
    """Whether ``x`` is a real Python/NumPy number and not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_focusing_factor(p: Any) -> float:
    """FLatten's focusing factor p of the C kernels' "focused" map (Eq. 6) as a float: a real number (not bool),
    finite, >= 1; TypeError / ValueError naming 'p' otherwise.  Shared by the fast and the plain C wrappers
    (refimpl.backends._c_linear, refimpl.backends._c_plain)."""
    if not real_scalar(p):
        raise TypeError(f"argument 'p': expected a real number (the focusing factor), got {type(p).__name__}")
    pf = float(p)
    if not np.isfinite(pf) or pf < 1:
        raise ValueError(f"argument 'p': expected a finite focusing factor p >= 1, got {p!r}")
    return pf


@dataclass(frozen=True)
class DepthwiseArgs:
    """Validated arguments of one depthwise-conv kernel call (arrays C-contiguous, one dtype)."""

    x: np.ndarray        # (B, C, H, W)
    weight: np.ndarray   # (C, KH, KW)
    bias: np.ndarray | None  # (C,)
    out: np.ndarray | None   # (B, C, OH, OW) as given by the caller, or None
    stride: tuple[int, int]
    pad_top: int
    pad_left: int
    out_shape: tuple[int, int, int, int]


def _array(a: Any, name: str, backend: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype not in KERNEL_DTYPES or not arr.dtype.isnative:
        raise TypeError(f"argument '{name}': the {backend} kernel takes float32 or float64 arrays in native "
                        f"byte order, got dtype {arr.dtype} (refimpl.layers.depthwise_conv2d promotes other "
                        f"real float dtypes to float64 before dispatching)")
    return arr


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` itself if it is C-contiguous and aligned, else a fresh C-contiguous copy (negative strides,
    views with gaps and misaligned buffers are copied)."""
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    return np.array(a, order="C", copy=True)


def _int_tuple(v: Any, n: int, name: str, minimum: int) -> tuple[int, ...]:
    try:
        items = tuple(v)
    except TypeError:
        items = None
    if items is None or len(items) != n or any(
            isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or i < minimum for i in items):
        raise ValueError(f"argument '{name}': expected a tuple of {n} integers >= {minimum}, got {v!r}")
    return tuple(int(i) for i in items)


def depthwise_args(x: Any, weight: Any, bias: Any, stride: Any, pads: Any, out: Any, dilation: Any,
                   backend: str) -> DepthwiseArgs:
    """Check the arguments of a depthwise-conv kernel (the signature of
    ``refimpl.layers._depthwise_conv2d_numpy``: x (B, C, H, W); weight (C, 1, KH, KW) or (C, KH, KW);
    bias (C,) or None; stride (sh, sw); pads (top, bottom, left, right); dilation must be (1, 1))."""
    if _int_tuple(dilation, 2, "dilation", 1) != (1, 1):
        raise ValueError(f"argument 'dilation': the {backend} kernel implements dilation (1, 1) only, got "
                         f"{tuple(dilation)}; refimpl.layers.depthwise_conv2d sends dilated convolutions "
                         f"to the NumPy definition")
    x = _array(x, "x", backend)
    weight = _array(weight, "weight", backend)
    dt = x.dtype
    if weight.dtype != dt:
        raise TypeError(f"argument 'weight': expected dtype {dt} (the dtype of 'x'), got {weight.dtype}; "
                        f"the {backend} kernel does not mix precisions")
    if x.ndim != 4:
        raise ValueError(f"argument 'x': expected a 4-d array of shape (B, C, H, W), got {x.ndim}-d shape "
                         f"{x.shape}")
    b_, c, h, w = x.shape
    if weight.ndim == 4 and weight.shape[1] == 1:
        weight = weight.reshape(weight.shape[0], weight.shape[2], weight.shape[3])
    if weight.ndim != 3 or weight.shape[0] != c:
        raise ValueError(f"argument 'weight': expected shape ({c}, 1, KH, KW) or ({c}, KH, KW) for x of shape "
                         f"{x.shape}, got {np.shape(weight)}")
    kh, kw = weight.shape[1:]
    if min(x.shape) < 1 or kh < 1 or kw < 1:
        raise ValueError(f"arguments 'x'/'weight': expected non-empty arrays, got x {x.shape}, weight "
                         f"{weight.shape}")
    if bias is not None:
        bias = _array(bias, "bias", backend)
        if bias.dtype != dt:
            raise TypeError(f"argument 'bias': expected dtype {dt} (the dtype of 'x'), got {bias.dtype}; "
                            f"the {backend} kernel does not mix precisions")
        if bias.shape != (c,):
            raise ValueError(f"argument 'bias': expected shape ({c},), got {bias.shape}")
    sh, sw = _int_tuple(stride, 2, "stride", 1)
    top, bottom, left, right = _int_tuple(pads, 4, "pads", 0)
    if h + top + bottom < kh or w + left + right < kw:
        raise ValueError(f"argument 'pads': the padded input ({h + top + bottom}, {w + left + right}) is smaller "
                         f"than the kernel ({kh}, {kw})")
    oh = (h + top + bottom - kh) // sh + 1
    ow = (w + left + right - kw) // sw + 1
    out_shape = (b_, c, oh, ow)
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"argument 'out': expected a numpy.ndarray, got {type(out).__name__}")
        if out.dtype != dt:
            raise TypeError(f"argument 'out': expected dtype {dt} (the dtype of 'x'), got {out.dtype}")
        if out.shape != out_shape:
            raise ValueError(f"argument 'out': expected shape {out_shape}, got {out.shape}")
        if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
            raise ValueError("argument 'out': expected a C-contiguous, aligned, writeable array (refused: the "
                             "kernel would write into a copy); allocate it with "
                             "refimpl.backends.empty_aligned")
        for name, a in (("x", x), ("weight", weight), ("bias", bias)):
            if a is not None and np.may_share_memory(out, a):
                raise ValueError(f"argument 'out': shares memory with argument '{name}'")
    return DepthwiseArgs(x=_contiguous(x), weight=_contiguous(weight),
                         bias=None if bias is None else _contiguous(bias), out=out, stride=(sh, sw),
                         pad_top=top, pad_left=left, out_shape=out_shape)


@dataclass(frozen=True)
class LinearAttentionArgs:
    """Validated arguments of one fused linear-attention kernel call (arrays C-contiguous, one dtype;
    q, k, v reshaped to (B*h, tokens, dim))."""

    q: np.ndarray        # (BH, N, d)
    k: np.ndarray        # (BH, M, d)
    v: np.ndarray        # (BH, M, e)
    out: np.ndarray | None   # (B, h, N, e) as given by the caller, or None
    out_shape: tuple[int, int, int, int]
    sizes: dict


def linear_attention_args(q: Any, k: Any, v: Any, out: Any, backend: str) -> LinearAttentionArgs:
    """Check the arrays of a fused linear-attention kernel (the signature of
    ``refimpl.attention.linear._linear_attention_numpy``: q (B, h, N, d), k (B, h, M, d), v (B, h, M, e),
    one dtype, float32 or float64; ``out`` (B, h, N, e) usable in place or None)."""
    q = _array(q, "q", backend)
    dt = q.dtype
    k = _array(k, "k", backend)
    v = _array(v, "v", backend)
    for name, a in (("k", k), ("v", v)):
        if a.dtype != dt:
            raise TypeError(f"argument '{name}': expected dtype {dt} (the dtype of 'q'), got {a.dtype}; "
                            f"the {backend} kernel does not mix precisions")
    for name, a, spec in (("q", q, "(B, h, N, d)"), ("k", k, "(B, h, M, d)"), ("v", v, "(B, h, M, e)")):
        if a.ndim != 4:
            raise ValueError(f"argument '{name}': expected a 4-d array of shape {spec}, got {a.ndim}-d shape "
                             f"{a.shape}")
        if min(a.shape) < 1:
            raise ValueError(f"argument '{name}': expected a non-empty array of shape {spec}, got {a.shape}")
    b_, h, n, d = q.shape
    if k.shape[:2] != (b_, h) or k.shape[3] != d:
        raise ValueError(f"argument 'k': expected shape ({b_}, {h}, M, {d}) for q of shape {q.shape}, got "
                         f"{k.shape}")
    m = k.shape[2]
    if v.shape[:3] != (b_, h, m):
        raise ValueError(f"argument 'v': expected shape ({b_}, {h}, {m}, e) for k of shape {k.shape}, got "
                         f"{v.shape}")
    e = v.shape[3]
    out_shape = (b_, h, n, e)
    if out is not None:
        _check_out(out, dt, out_shape, (("q", q), ("k", k), ("v", v)), "q")
    bh = b_ * h
    return LinearAttentionArgs(q=_contiguous(q).reshape(bh, n, d), k=_contiguous(k).reshape(bh, m, d),
                               v=_contiguous(v).reshape(bh, m, e), out=out, out_shape=out_shape,
                               sizes=dict(B=b_, h=h, N=n, M=m, d=d, e=e))


#: Feature maps of the fused linear-attention kernels and their codes (REFIMPL_LA_MAP_* in
#: ckernels/refimpl_kernels.h); public as ``refimpl.backends._c_linear.LINEAR_ATTENTION_MAPS``.
LINEAR_ATTENTION_MAPS = {"relu": 0, "elu1": 1, "focused": 2}
#: Normaliser policies of the fused kernels and their codes (``struct refimpl_la_options.eps_policy``).
EPS_POLICIES = {"add": 0, "clamp": 1}


def check_real(value: Any, name: str, allow_none: bool = False) -> None:
    """TypeError naming ``name`` unless ``value`` is a real number (not bool), or None where allowed (the
    scalar check of the C wrappers' options)."""
    if value is None and allow_none:
        return
    if not real_scalar(value):
        raise TypeError(f"argument '{name}': expected a real number{' or None' if allow_none else ''}, got "
                        f"{type(value).__name__}")


def _check_finite(value: Any, name: str) -> None:
    """ValueError naming ``name`` unless the real number ``value`` is finite (a NaN or infinite option would
    reach the C kernel and give NaN for finite input)."""
    if not math.isfinite(float(value)):
        raise ValueError(f"argument '{name}': expected a finite real number, got {float(value)!r}")


@dataclass(frozen=True)
class LinearAttentionOptions:
    """Validated arguments of one fused linear-attention kernel call, fast (ckernels/linattn.c) or plain
    (ckernels/linattn_plain.c): the arrays (:class:`LinearAttentionArgs`), the key weights and V scale in the
    kernel's layout, and the scalar options as given (converted to C doubles by :meth:`c_options`, at the
    point of the call)."""

    arrays: LinearAttentionArgs
    key_weight: np.ndarray | None   # (B, h, M), C-contiguous, q's dtype
    v_scale: np.ndarray | None      # (B, h): one per head bh, C-contiguous, q's dtype
    feature_map: str
    power: float                    # the focusing factor p (float, finite, >= 1)
    eps: Any                        # a real number
    eps_policy: str
    clamp_min: Any                  # a real number or None
    v_scale_mode: str
    threads: int | None             # the value of ``threads_check()``, None without one

    def c_options(self, kv_scale: float) -> dict:
        """The fields of ``struct refimpl_la_options`` (ckernels/refimpl_kernels.h); ``kv_scale`` a finite real
        number (TypeError / ValueError naming it)."""
        check_real(kv_scale, "kv_scale")
        _check_finite(kv_scale, "kv_scale")
        return {"feature_map": LINEAR_ATTENTION_MAPS[self.feature_map],
                "eps_policy": EPS_POLICIES[self.eps_policy], "clamp": 0 if self.clamp_min is None else 1,
                "v_scale_divide": 1 if self.v_scale_mode == "divide" else 0,
                "power": self.power, "clamp_min": 0.0 if self.clamp_min is None else float(self.clamp_min),
                "eps": float(self.eps), "kv_scale": float(kv_scale)}


def linear_attention_options(q: Any, k: Any, v: Any, out: Any, key_weight: Any, feature_map: Any, eps: Any,
                             eps_policy: Any, clamp_min: Any, p: Any, v_scale: Any, v_scale_mode: Any, *,
                             map_note: str = "", threads_check: Any = None) -> LinearAttentionOptions:
    """Check every argument of a fused linear-attention kernel call (the fast and the plain C wrappers,
    refimpl.backends._c_linear and refimpl.backends._c_plain, call this one function), in this order:

    1. the focusing factor ``p`` (:func:`check_focusing_factor`; checked for every map, used by "focused");
    2. ``feature_map`` in :data:`LINEAR_ATTENTION_MAPS` (``map_note`` is appended to the message);
    3. ``eps_policy`` "add" | "clamp"; ``eps`` a real number; ``clamp_min`` a real number or None;
    4. ``threads_check()`` where given (the fast wrapper's thread count; its value is returned as ``threads``);
    5. q, k, v and ``out`` (:func:`linear_attention_args`);
    6. ``key_weight`` (reported as 'alpha'): q's dtype, shape (B, h, M);
    7. with a ``v_scale``: ``v_scale_mode`` "divide" | "multiply", then q's dtype and 1 or h values (broadcast
       to one per head bh).

    TypeError / ValueError naming the argument, the expected and the given value."""
    power = check_focusing_factor(p)
    if feature_map not in LINEAR_ATTENTION_MAPS:
        raise ValueError(f"argument 'feature_map': the C kernel implements {tuple(LINEAR_ATTENTION_MAPS)}, got "
                         f"{feature_map!r}{map_note}")
    if eps_policy not in EPS_POLICIES:
        raise ValueError(f"argument 'eps_policy': expected 'add' or 'clamp', got {eps_policy!r}")
    check_real(eps, "eps")
    check_real(clamp_min, "clamp_min", allow_none=True)
    _check_finite(eps, "eps")
    if clamp_min is not None:
        _check_finite(clamp_min, "clamp_min")
    nthreads = None if threads_check is None else threads_check()
    a = linear_attention_args(q, k, v, out, "C")
    sz = a.sizes
    dt = a.q.dtype
    kw = None
    if key_weight is not None:
        kw = _array(key_weight, "alpha", "C")
        if kw.dtype != dt:
            raise TypeError(f"argument 'alpha': expected dtype {dt} (the dtype of 'q'), got {kw.dtype}; the C "
                            f"kernel does not mix precisions")
        if kw.shape != (sz["B"], sz["h"], sz["M"]):
            raise ValueError(f"argument 'alpha': expected shape ({sz['B']}, {sz['h']}, {sz['M']}) (B, h, M), got "
                             f"{kw.shape}")
        kw = _contiguous(kw)
    vs = None
    if v_scale is not None:
        if v_scale_mode not in ("divide", "multiply"):
            raise ValueError(f"argument 'v_scale_mode': expected 'divide' or 'multiply', got {v_scale_mode!r}")
        vs = _array(v_scale, "v_scale", "C")
        if vs.dtype != dt:
            raise TypeError(f"argument 'v_scale': expected dtype {dt} (the dtype of 'q'), got {vs.dtype}; the C "
                            f"kernel does not mix precisions")
        if vs.size not in (1, sz["h"]):
            raise ValueError(f"argument 'v_scale': expected 1 value or one per head ({sz['h']}), got shape "
                             f"{vs.shape}")
        vs = np.ascontiguousarray(np.broadcast_to(vs.reshape(1, -1), (sz["B"], sz["h"])))   # (B, h): one per bh
    return LinearAttentionOptions(arrays=a, key_weight=kw, v_scale=vs, feature_map=feature_map, power=power,
                                  eps=eps, eps_policy=eps_policy, clamp_min=clamp_min, v_scale_mode=v_scale_mode,
                                  threads=nthreads)


def _check_out(out: Any, dt: np.dtype, shape: tuple[int, ...], inputs: Any, first: str,
               name: str = "out") -> None:
    """Refuse an output buffer the kernel cannot write in place (see the module docstring)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"argument '{name}': expected a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dt:
        raise TypeError(f"argument '{name}': expected dtype {dt} (the dtype of '{first}'), got {out.dtype}")
    if shape is not None and out.shape != shape:
        raise ValueError(f"argument '{name}': expected shape {shape}, got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
        raise ValueError(f"argument '{name}': expected a C-contiguous, aligned, writeable array (refused: the "
                         f"kernel would write into a copy); allocate it with refimpl.backends.empty_aligned")
    for iname, a in inputs:
        if a is not None and np.may_share_memory(out, a):
            raise ValueError(f"argument '{name}': shares memory with argument '{iname}'")


def workspace_buffer(workspace: Any, dt: np.dtype, need: int, inputs: Any, first: str) -> np.ndarray:
    """Check a caller-provided ``workspace=``: a C-contiguous, aligned, writeable array of dtype ``dt``
    with at least ``need`` elements (any shape) sharing no memory with the inputs or the output.
    Returns its flat view."""
    _check_out(workspace, dt, None, inputs, first, name="workspace")
    if workspace.size < need:
        raise ValueError(f"argument 'workspace': expected at least {need} elements of {dt}, got "
                         f"{workspace.size} (shape {workspace.shape}); allocate it with "
                         f"refimpl.backends._c_linear.linear_attention_workspace")
    return workspace.reshape(-1)


def window_bias_mask(bias: Any, mask: Any, sizes: Any, dt: Any) -> tuple[Any, int, Any, int]:
    """The additive bias and boolean mask of window attention, checked against the windows of q (``sizes`` of
    :func:`linear_attention_args`): bias (h, n, m), (1, h, n, m) or (BW, h, n, m) in q's dtype, mask (nW, n, m) or
    (nW, 1, n, m) bool with nW dividing BW.  Returns (bias, bias_count, mask as uint8, mask_count), counts 0 and
    arrays None where absent."""
    bw, h, n, m = sizes["B"], sizes["h"], sizes["N"], sizes["M"]
    bias_c, bias_count = None, 0
    if bias is not None:
        bias_c = _array(bias, "bias", "C")
        if bias_c.dtype != dt:
            raise TypeError(f"argument 'bias': expected dtype {dt} (the dtype of 'q'), got {bias_c.dtype}")
        if bias_c.shape in ((h, n, m), (1, h, n, m)):
            bias_count = h
        elif bias_c.shape == (bw, h, n, m):
            bias_count = bw * h
        else:
            raise ValueError(f"argument 'bias': expected shape ({h}, {n}, {m}), (1, {h}, {n}, {m}) or "
                             f"({bw}, {h}, {n}, {m}), got {bias_c.shape}")
        bias_c = _contiguous(bias_c)
    mask_c, mask_count = None, 0
    if mask is not None:
        mk = np.asarray(mask)
        if mk.dtype != bool:
            raise TypeError(f"argument 'mask': expected a bool array (True = may attend), got dtype {mk.dtype}")
        if mk.ndim == 4 and mk.shape[1] == 1:
            mk = mk[:, 0]
        if mk.ndim != 3 or mk.shape[1:] != (n, m) or mk.shape[0] < 1 or bw % mk.shape[0]:
            raise ValueError(f"argument 'mask': expected shape (nW, {n}, {m}) with nW dividing {bw} (the "
                             f"windows of q), got {np.shape(mask)}")
        mask_c = np.ascontiguousarray(mk).view(np.uint8)
        mask_count = mk.shape[0]
    return bias_c, bias_count, mask_c, mask_count


def check_lisa_core_shapes(qb: Any, kb: Any, v: Any, wa: Any, wb: Any, ba: Any, bb: Any, grid: Any,
                           lengths: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of operation "lisa_fft_core"'s arguments (the Numba and C kernels'): qb, kb, v (B, h, N, c)
    with N = prod(grid), weight_a (*L, c, D), weight_b (*L, D), the biases (c, D), the FFT lengths L >= grid.
    Returns (grid, lengths); ValueError naming the argument."""
    grid = tuple(int(n) for n in grid)
    lens = grid if lengths is None else tuple(int(n) for n in lengths)
    r = len(grid)
    if qb.ndim != 4 or min(qb.shape) < 1:
        raise ValueError(f"argument 'qb': expected a non-empty array of shape (B, h, N, c), got {qb.shape}")
    nc = qb.shape[3]
    if math.prod(grid) != qb.shape[2] or len(lens) != r or any(L < n for L, n in zip(lens, grid)):
        raise ValueError(f"argument 'grid' / 'lengths': grid {grid} (N = {qb.shape[2]}) and lengths {lens} do not fit")
    for name, a in (("kb", kb), ("v", v)):
        if a.shape != qb.shape:
            raise ValueError(f"argument '{name}': expected shape {qb.shape} (the shape of 'qb'), got {a.shape}")
    if wa.ndim != r + 2 or wa.shape[:r] != lens or wa.shape[r] != nc or wa.shape[r + 1] < 1:
        raise ValueError(f"argument 'weight_a': expected shape {lens + (nc, 'D')}, got {wa.shape}")
    nd = wa.shape[-1]
    if wb.shape != lens + (nd,):
        raise ValueError(f"argument 'weight_b': expected shape {lens + (nd,)}, got {wb.shape}")
    for name, a in (("bias_a", ba), ("bias_b", bb)):
        if a.shape != (nc, nd):
            raise ValueError(f"argument '{name}': expected shape {(nc, nd)}, got {a.shape}")
    return grid, lens
