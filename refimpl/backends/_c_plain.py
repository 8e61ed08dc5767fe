"""The plain C versions of the fast C kernels: validated wrappers of ckernels/linattn_plain.c, rala_plain.c,
winattn_plain.c and dwconv2d_plain.c.

Each fast C kernel (threaded, blocked, vectorised: ckernels/linattn*.h, rala_*.h, winattn_*.h, dwconv2d*.h) has
beside it a plain version of the same entry point's mathematics: straight scalar loops in the order of the papers'
equations, one thread, libm's exp / pow / sqrt.  The plain versions are the specification of the fast ones
(as ``refimpl.backends._c_elementwise.gelu_libm`` is for GELU): tests/test_kernels_plain.py checks each
against its NumPy definition within the error model, and the fast kernel against it.  They are **not
registered** as backends: ``auto`` and ``backends.call`` never reach them.

The functions mirror the registered C wrappers' names and signatures (without ``out=``, ``workspace=`` and
``threads=``: a plain call allocates its own buffers and runs on the calling thread):

- :func:`linear_attention` (twin ``refimpl.backends._c_linear.linear_attention``; definition
  ``refimpl.attention.linear._linear_attention_numpy``);
- :func:`reweighted_linear_attention` (twin ``_c_linear.reweighted_linear_attention``; the same C function with
  key weights);
- :func:`linear_angular_attention` (twin ``_c_linear.linear_angular_attention``; definition
  ``refimpl.attention.angular.linear_angular_attention`` with policy "clamp", arithmetic "scaled");
- :func:`rala_alpha` (twin ``_c_linear.rala_alpha``; definition ``refimpl.attention.rala_core._rala_alpha_numpy``);
- :func:`window_softmax_attention` (twin ``refimpl.backends._c_softmax.window_softmax_attention``; definition
  ``refimpl.attention.softmax._window_softmax_attention_numpy``);
- :func:`elu1_feature_map` and :func:`focused_feature_map` (twins ``_c_linear.elu1_feature_map`` and
  ``_c_linear.focused_feature_map``; definitions ``refimpl.attention.linear.feature_map(x, "elu1")`` and
  ``refimpl.attention.focused.focused_feature_map(x, p)``): the plain linear attention's own maps;
- :func:`depthwise_conv2d` (twin ``refimpl.backends._c_depthwise.depthwise_conv2d``; definition
  ``refimpl.layers._depthwise_conv2d_numpy``).

Every call takes the steps of refimpl.backends._c: validate (refimpl.backends._validate: dtype, shapes,
contiguity; non-contiguous inputs copied), fill the output with NaN, pass the buffers, check the status
(:func:`refimpl.backends._c.run_kernel`).  The range policy is the registered wrappers' (the same
``run_kernel`` arguments): float64 inputs outside the kernels' band (above 2^``config.RANGE_RESCALE_EXPONENT``;
for linear attention and RALA's core also a nonzero entry below 2^-``config.RANGE_RESCALE_EXPONENT`` and ELU + 1
features that may underflow, refimpl.backends._c_linear.elu1_underflows) are answered
by the NumPy definition of the operation, taken from the registry (``_registry.definition(op)``), and so is every
NaN or Inf of a float64 result (refimpl.backends._c._range_fallback); the linear-angular kernel, like its
registered wrapper, has none, and neither have the feature maps and the depthwise convolution (their
registered wrappers have none).  This module imports nothing from refimpl.attention, refimpl.layers or
refimpl.models.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from . import _validate
from ._c import _load, run_kernel
from ._c_linear import LINEAR_ATTENTION_MAPS, elu1_underflows
from ._registry import definition
from ._validate import empty_aligned

_RALA_KERNELS = ("elu1", "relu")
_RALA_GLOBAL_QUERIES = {"q": 0, "kappa_q": 1}


def _workspace(fn: str, *sizes: int, dtype: np.dtype) -> np.ndarray:
    n = int(getattr(_load().lib, fn)(*sizes))
    if n < 0:
        raise ValueError(f"arguments 'q'/'k'/'v': sizes {sizes} overflow the workspace size")
    return empty_aligned(n, dtype)


def _linear(q: Any, k: Any, v: Any, key_weight: Any, feature_map: Any, eps: Any, eps_policy: Any, clamp_min: Any,
            kv_scale: float, p: Any, v_scale: Any, v_scale_mode: Any, twin: Any) -> np.ndarray:
    """Validate (refimpl.backends._validate.linear_attention_options, the checks shared with the fast
    kernel), then run refimpl_linear_attention_plain_f32/_f64; ``twin()`` (the NumPy definition) answers
    instead where the range check says so (refimpl.backends._c.run_kernel)."""
    mod = _load()
    o = _validate.linear_attention_options(q, k, v, None, key_weight, feature_map, eps, eps_policy, clamp_min, p,
                                           v_scale, v_scale_mode)
    a, kw, vs = o.arrays, o.key_weight, o.v_scale
    sz = a.sizes
    dt = a.q.dtype
    ws = _workspace("refimpl_linear_attention_plain_workspace", sz["d"], sz["e"], dtype=dt)
    options = mod.ffi.new("struct refimpl_la_options *", o.c_options(kv_scale))
    result = empty_aligned(a.out_shape, dt)
    return run_kernel("linear_attention_plain", result, a.q, a.k, a.v, kw, vs, options, sz["B"] * sz["h"],
                      sz["N"], sz["M"], sz["d"], sz["e"], ws.size, workspace=ws, twin=twin,
                      band=(a.q, a.k, a.v, kw, vs), tiny=(a.q, a.k, a.v, vs),
                      outside=lambda st: elu1_underflows(a.q, a.k, kw, feature_map, st))


def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, feature_map: str = "relu", eps: float = 0.0,
                     eps_policy: str = "add", clamp_min: float | None = None,
                     p: float = config.FLATTEN_FOCUSING_FACTOR, *, v_scale: Any = None,
                     v_scale_mode: str = "divide") -> np.ndarray:
    """Kernelized linear attention by the plain C version (ckernels/linattn_plain.c), the specification of
    ``refimpl.backends._c_linear.linear_attention``.

    O_i = phi(Q_i) (sum_j phi(K_j)^T V_j) / den_eff(phi(Q_i) . sum_j phi(K_j))  (L2ViT Eq. 2-4 and Appendix 8;
    FLatten Eq. 1-6; Katharopoulos et al. 2020 Eq. 7), every sum in increasing index order from +0, one
    thread, libm's exp and pow.

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e) : one dtype, float32 or float64.
    feature_map : "relu" | "elu1" | "focused".  eps, eps_policy ("add" | "clamp"), clamp_min : the normaliser
        policy.  p : the focusing factor of "focused" (real, finite, >= 1).
    v_scale, v_scale_mode : None, or 1 or h values of q's dtype: V / s ("divide") or V * s ("multiply") per head.

    Returns
    -------
    (B, h, N, e) array of q's dtype.

    Raises
    ------
    TypeError / ValueError naming the argument, as the registered C wrapper.

    Range: the registered wrapper's (module docstring): out-of-band float64 inputs and NaN / Inf results are
    answered by the NumPy definition of operation "linear_attention".

    References
    ----------
    L2ViT Eq. 2-4 and Appendix 8; FLatten Eq. 1-6; Katharopoulos et al. (2020) Eq. 2-7.
    """
    def twin() -> np.ndarray:
        return definition("linear_attention")(q, k, v, feature_map, eps, eps_policy, clamp_min, p, v_scale=v_scale,
                                              v_scale_mode=v_scale_mode)

    return _linear(q, k, v, None, feature_map, eps, eps_policy, clamp_min, 1.0, p, v_scale, v_scale_mode, twin)


def reweighted_linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                                kernel: str = "elu1", kv_scale: float = 1.0, eps: float = 0.0) -> np.ndarray:
    """RALA's reweighted linear attention (Eq. 2-3, linear order, no RoPE) by the plain C version: the plain
    linear attention with key weights alpha_j multiplying kappa(K_j) and s = ``kv_scale`` applied once after the
    sums; the specification of ``refimpl.backends._c_linear.reweighted_linear_attention``.

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e), alpha (B, h, M) : one dtype, float32 or float64.
    kernel : "elu1" | "relu".  kv_scale : real.  eps : real, added to the normaliser when nonzero.

    Returns
    -------
    (B, h, N, e) array of q's dtype.

    References
    ----------
    RALA (Fan et al., CVPR 2025) Eq. 2-3.

    Range: as :func:`linear_attention` (the NumPy definition of operation "reweighted_linear_attention").
    """
    if kernel not in _RALA_KERNELS:
        raise ValueError(f"argument 'kernel': expected 'elu1' or 'relu', got {kernel!r}")
    _validate.check_real(kv_scale, "kv_scale")

    def twin() -> np.ndarray:
        return definition("reweighted_linear_attention")(q, k, v, alpha, kernel, kv_scale, eps)

    return _linear(q, k, v, alpha, kernel, eps, "add", None, float(kv_scale), config.FLATTEN_FOCUSING_FACTOR,
                   None, "divide", twin)


def linear_angular_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, constant: str = "sum",
                             normaliser: str = "none", eps: float = config.CASTLING_QK_NORM_EPS) -> np.ndarray:
    """Castling-ViT's linear-angular attention (Eq. 9) by the plain C version (ckernels/linattn_plain.c), the
    specification of ``refimpl.backends._c_linear.linear_angular_attention``:

    H_i = 1/2 C_i + (1/pi) Q^_i (sum_j K^_j^T V_j),  x^ = x / max(||x||, eps) row-wise (||x|| = m ||x / m||,
    m = max|x|),  C_i = sum_j V_j ("sum") or V_i ("own"); "similarity_sum" divides by M/2 + (1/pi) Q^_i . sum_j K^_j.
    Every sum in increasing index order from +0.

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e) : one dtype, float32 or float64 (M = N for "own").
    constant : "sum" | "own".  normaliser : "none" | "similarity_sum".  eps : real >= 0.

    Returns
    -------
    (B, h, N, e) array of q's dtype.

    References
    ----------
    Castling-ViT (You et al., CVPR 2023) Eq. 8-9.
    """
    _load()
    if constant not in ("sum", "own"):
        raise ValueError(f"argument 'constant': expected 'sum' or 'own', got {constant!r}")
    if normaliser not in ("none", "similarity_sum"):
        raise ValueError(f"argument 'normaliser': expected 'none' or 'similarity_sum', got {normaliser!r}")
    _validate.check_real(eps, "eps")
    if not eps >= 0:
        raise ValueError(f"argument 'eps': expected a real number >= 0, got {eps!r}")
    a = _validate.linear_attention_args(q, k, v, None, "C")
    sz = a.sizes
    if constant == "own" and sz["M"] != sz["N"]:
        raise ValueError(f"argument 'v': constant='own' needs as many values as queries, got N = {sz['N']} "
                         f"queries and M = {sz['M']} values (v shape {np.shape(v)})")
    dt = a.q.dtype
    ws = _workspace("refimpl_linear_angular_plain_workspace", sz["d"], sz["e"], dtype=dt)
    result = empty_aligned(a.out_shape, dt)
    return run_kernel("linear_angular_plain", result, a.q, a.k, a.v, float(eps), 1 if constant == "own" else 0,
                      1 if normaliser == "similarity_sum" else 0, sz["B"] * sz["h"], sz["N"], sz["M"], sz["d"],
                      sz["e"], ws.size, workspace=ws)


def rala_alpha(q: np.ndarray, k: np.ndarray, global_query: str = "q", kernel: str = "elu1",
               scale: float = 1.0) -> np.ndarray:
    """RALA's reweighting coefficients (Eq. 4) by the plain C version (ckernels/rala_plain.c), the
    specification of ``refimpl.backends._c_linear.rala_alpha``:

    Q_g = (sum_t x_t) / N (x = Q, or kappa(Q) for "kappa_q"),  alpha_j = M (exp(l_j - max l) / sum exp(l - max l)),
    l_j = scale (Q_g . kappa(K_j)); every sum in increasing index order from +0, libm's exp.

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d) : one dtype, float32 or float64.  global_query : "q" | "kappa_q".
    kernel : "elu1" | "relu".  scale : real.

    Returns
    -------
    (B, h, M) array of q's dtype.

    References
    ----------
    RALA (Fan et al., CVPR 2025) Eq. 4.

    Range: float64 q or k above 2^``config.RANGE_RESCALE_EXPONENT``, or a NaN / Inf result, are answered by the
    NumPy definition of operation "rala_alpha" (as the registered wrapper).
    """
    _load()
    if global_query not in _RALA_GLOBAL_QUERIES:
        raise ValueError(f"argument 'global_query': expected 'q' or 'kappa_q', got {global_query!r}")
    if kernel not in _RALA_KERNELS:
        raise ValueError(f"argument 'kernel': expected 'elu1' or 'relu', got {kernel!r}")
    _validate.check_real(scale, "scale")
    qa = _validate._array(q, "q", "C")
    dt = qa.dtype
    if qa.ndim != 4 or min(qa.shape) < 1:
        raise ValueError(f"argument 'q': expected a non-empty 4-d array of shape (B, h, N, d), got shape {qa.shape}")
    b_, h, n, d = qa.shape
    ka = _validate._array(k, "k", "C")
    if ka.dtype != dt:
        raise TypeError(f"argument 'k': expected dtype {dt} (the dtype of 'q'), got {ka.dtype}; the C kernel "
                        f"does not mix precisions")
    if ka.ndim != 4 or ka.shape[:2] != (b_, h) or ka.shape[3] != d or ka.shape[2] < 1:
        raise ValueError(f"argument 'k': expected shape ({b_}, {h}, M, {d}) for q of shape {qa.shape}, got "
                         f"{ka.shape}")
    m = ka.shape[2]
    qa, ka = _validate._contiguous(qa), _validate._contiguous(ka)
    ws = _workspace("refimpl_rala_alpha_plain_workspace", d, dtype=dt)
    result = empty_aligned((b_, h, m), dt)
    def twin() -> np.ndarray:
        return definition("rala_alpha")(qa, ka, global_query, kernel, scale)

    return run_kernel("rala_alpha_plain", result, qa, ka, LINEAR_ATTENTION_MAPS[kernel],
                      _RALA_GLOBAL_QUERIES[global_query], float(scale), b_ * h, n, m, d, ws.size, workspace=ws,
                      twin=twin, band=(qa, ka))


def window_softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bias: Any = None,
                             mask: Any = None) -> np.ndarray:
    """Windowed softmax attention (Swin Eq. 4 per window) by the plain C version (ckernels/winattn_plain.c),
    the specification of ``refimpl.backends._c_softmax.window_softmax_attention``:

    O = softmax((q scale) k^T + bias, masked) v per (window, head); every sum in increasing index order from +0,
    libm's exp; a fully masked row is NaN (0/0), as the definition.

    Parameters
    ----------
    q (BW, h, n, d), k (BW, h, m, d), v (BW, h, m, e) : one dtype, float32 or float64.  scale : real.
    bias : None, (h, n, m) or (1, h, n, m) (shared by the windows), or (BW, h, n, m); q's dtype.
    mask : None or bool (nW, n, m) / (nW, 1, n, m), True = may attend, nW dividing BW (windows batch-major).

    Returns
    -------
    (BW, h, n, e) array of q's dtype.

    References
    ----------
    Swin Transformer (Liu et al., 2021) Sec. 3.2, Eq. 4; Vaswani et al. (2017) Eq. 1.

    Range: float64 q, k, v or bias above 2^``config.RANGE_RESCALE_EXPONENT``, or a NaN / Inf result (a fully
    masked row included), are answered by the NumPy definition of operation "window_softmax_attention" (as the
    registered wrapper).
    """
    _load()
    _validate.check_real(scale, "scale")
    a = _validate.linear_attention_args(q, k, v, None, "C")
    sz = a.sizes
    bw, h, n, m, d = sz["B"], sz["h"], sz["N"], sz["M"], sz["d"]
    dt = a.q.dtype
    bias_c, bias_count, mask_c, mask_count = _validate.window_bias_mask(bias, mask, sz, dt)
    bias_count, mask_count = max(bias_count, 1), max(mask_count, 1)   # the plain kernel's counts are >= 1
    ws = _workspace("refimpl_window_attention_plain_workspace", m, dtype=dt)
    result = empty_aligned(a.out_shape, dt)
    def twin() -> np.ndarray:
        return definition("window_softmax_attention")(q, k, v, float(scale), bias, mask)

    return run_kernel("window_attention_plain", result, a.q, a.k, a.v, bias_c, mask_c, float(scale), bw * h, h, n,
                      m, d, sz["e"], bias_count, mask_count, ws.size, workspace=ws, twin=twin,
                      band=(a.q, a.k, a.v, bias_c))


def elu1_feature_map(x: np.ndarray) -> np.ndarray:
    """The ELU + 1 feature map by the plain C version (ckernels/linattn_plain.c, the plain linear attention's
    own map), the specification of ``refimpl.backends._c_linear.elu1_feature_map``:

    phi(x) = ELU(x) + 1 = x + 1 (x > 0, one rounding), exp(x) otherwise (libm's exp), element-wise.

    Parameters
    ----------
    x : float32 or float64 array, any non-empty shape.

    Returns
    -------
    Array of x's shape and dtype.

    Raises
    ------
    TypeError for a dtype other than float32/float64; ValueError for an empty x (naming 'x').

    References
    ----------
    Katharopoulos et al. (2020) Eq. 7; RALA (Fan et al., CVPR 2025) Sec. 3.2 (kappa) and Eq. 4.
    """
    _load()
    a = _validate._array(x, "x", "C")
    if a.size < 1:
        raise ValueError(f"argument 'x': expected a non-empty array, got shape {a.shape}")
    a = _validate._contiguous(a)
    result = empty_aligned(a.shape, a.dtype)
    return run_kernel("elu1_feature_map_plain", result, a, a.size)


def focused_feature_map(x: np.ndarray, p: float = config.FLATTEN_FOCUSING_FACTOR) -> np.ndarray:
    """FLatten's focused feature map phi_p(x) = f_p(ReLU(x)) along the last axis by the plain C version
    (ckernels/linattn_plain.c, the plain linear attention's own map), the specification of
    ``refimpl.backends._c_linear.focused_feature_map``:

    per row a = ReLU(x) (NaN kept), m = max a, r = a / m, ||a|| = m sqrt(sum r^2), t = r^p (libm's pow),
    f = ||a|| (t / ||t||), every sum in increasing index order from +0; f = 0 for a row without a positive
    entry, a NaN or +Inf in the row makes it NaN.

    Parameters
    ----------
    x : float32 or float64 array (..., d), any sign, non-empty.
    p : real, finite, >= 1 (default ``config.FLATTEN_FOCUSING_FACTOR``).

    Returns
    -------
    Array of x's shape and dtype.

    Raises
    ------
    TypeError / ValueError naming 'x' or 'p'.

    References
    ----------
    FLatten (Han et al., ICCV 2023) Eq. 5-6, Appendix Eq. 20-21 (the max-normalised form).
    """
    _load()
    power = _validate.check_focusing_factor(p)
    a = _validate._array(x, "x", "C")
    if a.size < 1 or a.ndim < 1:
        raise ValueError(f"argument 'x': expected a non-empty array (..., d), got shape {a.shape}")
    a = _validate._contiguous(a)
    result = empty_aligned(a.shape, a.dtype)
    return run_kernel("focused_feature_map_plain", result, a, a.size // a.shape[-1], a.shape[-1], power)


def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: tuple[int, int],
                     pads: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1)) -> np.ndarray:
    """Depthwise conv2d forward by the plain C version (ckernels/dwconv2d_plain.c), the specification of
    ``refimpl.backends._c_depthwise.depthwise_conv2d``:

    out[b, c, i, j] = (sum_{u, v} w[c, u, v] x_pad[b, c, i*sh + u, j*sw + v]) + bias[c]

    the sum from +0 in row-major (u, v) order, padded taps read as zeros, the bias added last: the operations
    of ``refimpl.layers._depthwise_conv2d_numpy`` in its order, so its bits in x's precision (up to the sign
    of a zero).

    Parameters
    ----------
    x : (B, C, H, W) float32 or float64.
    weight : (C, 1, KH, KW) or (C, KH, KW), same dtype; any KH, KW >= 1.
    bias : (C,) same dtype, or None.
    stride : (sh, sw), integers >= 1.  pads : (top, bottom, left, right), integers >= 0.
    dilation : must be (1, 1), as the fast kernel's (ValueError naming 'dilation' otherwise).

    Returns
    -------
    (B, C, OH, OW) array of x's dtype, OH = (H + top + bottom - KH) // sh + 1, OW likewise.

    Raises
    ------
    TypeError / ValueError naming the argument, as the registered C wrapper
    (refimpl.backends._validate.depthwise_args).

    References
    ----------
    Howard et al., "MobileNets" (2017), Sec. 3.1 Eq. 3; L2ViT Eq. 5-7 (LCM); FLatten Eq. 10-11 (DWC).
    """
    _load()
    a = _validate.depthwise_args(x, weight, bias, stride, pads, None, dilation, "C")
    b_, c, h, w = a.x.shape
    _, kh, kw = a.weight.shape
    _, _, oh, ow = a.out_shape
    result = empty_aligned(a.out_shape, a.x.dtype)
    return run_kernel("dwconv2d_plain", result, a.x, a.weight, a.bias, a.stride[0], a.stride[1], a.pad_top,
                      a.pad_left, b_, c, h, w, kh, kw, oh, ow)


def range_stats(a: np.ndarray) -> tuple[float, float, float]:
    """:func:`refimpl.backends._c.range_stats` by the plain scalar scan (``refimpl_range_scan_plain_f64``,
    ckernels/scan.c), its specification beside the vector loop: (max |x|, min |x| over the nonzero entries,
    min x) of a C-contiguous float64 array, NaN entries taking no part.  TypeError for another dtype,
    ValueError for a non-contiguous array (naming 'a')."""
    mod = _load()
    if not isinstance(a, np.ndarray) or a.dtype != np.float64:
        raise TypeError(f"argument 'a': expected a float64 ndarray, got {getattr(a, 'dtype', type(a).__name__)}")
    if not a.flags.c_contiguous:
        raise ValueError("argument 'a': expected a C-contiguous array")
    out = mod.ffi.new("double[3]")
    status = mod.lib.refimpl_range_scan_plain_f64(out, mod.ffi.from_buffer("double[]", a), a.size)
    if status != 0:
        raise RuntimeError(f"refimpl_range_scan_plain_f64 refused its arguments (status {status})")
    return out[0], out[1], out[2]
