"""The Numba backend: validated wrappers around kernels compiled with explicit signatures.

Numba is optional: it is imported, and each kernel compiled, on first use (never at ``import refimpl``).
Each kernel is a private ``_..._kernel`` function compiled per dtype with an explicit signature on
C-contiguous arrays (``float64[:, :, :, ::1]``...), so a call with any other layout or dtype is a type
error rather than a silent recompilation; the public wrapper validates (refimpl.backends._validate),
poisons the output with NaN and calls it.  ``cache=True`` keeps the machine code on disk (next to this
file in ``__pycache__``, or in NUMBA_CACHE_DIR), so the compile cost is paid once per machine.
``fastmath`` is ``config.NUMBA_FASTMATH`` (False: see config.py).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from .. import config, feature_maps, validation
from . import _validate
from ._registry import register
from ._validate import depthwise_supported, empty_aligned, float_arrays, real_scalar

_LOCK = threading.Lock()
_NUMBA: list[Any] = []
_ERROR: list[BaseException] = []
_COMPILED: dict[tuple[str, str], Callable[..., Any]] = {}


def _import_numba(refresh: bool = False) -> Any:
    with _LOCK:
        if refresh:
            _NUMBA.clear()
            _ERROR.clear()
        if not _NUMBA and not _ERROR:
            try:
                import numba
                _NUMBA.append(numba)
            except Exception as exc:  # ImportError, or a broken llvmlite
                _ERROR.append(exc)
        if _ERROR:
            raise ImportError(f"numba is not installed or failed to import: {_ERROR[0]!r}") from _ERROR[0]
        return _NUMBA[0]


def status(refresh: bool = False) -> tuple[bool, str]:
    """(ok, reason) for :func:`refimpl.backends.available`."""
    try:
        numba = _import_numba(refresh)
    except ImportError as exc:
        return False, f"{exc}; install it with `pip install numba` (it is in the `test` extra)"
    return True, f"numba {numba.__version__}, fastmath={config.NUMBA_FASTMATH}, kernels compiled on first use"


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

    Same arguments, results and errors as the C kernel (:func:`refimpl.backends._c.depthwise_conv2d`):
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


# ---------------------------------------------------------------------------------------------------
# Shared helpers of the kernels below (LiSA contraction, angular series features, f_p)
# ---------------------------------------------------------------------------------------------------

def _compile(name: str, fn: Callable[..., Any], sig: str) -> Callable[..., Any]:
    """``fn`` compiled with the explicit signature ``sig`` (once per (name, signature)); lazy, cached."""
    key = (name, sig)
    kern = _COMPILED.get(key)
    if kern is None:
        numba = _import_numba()
        with _LOCK:
            kern = _COMPILED.get(key)
            if kern is None:
                # error_model="numpy": x / 0 gives +-inf or NaN as in IEEE/NumPy (Python's model raises).
                kern = numba.njit(sig, cache=True, nogil=True, fastmath=config.NUMBA_FASTMATH,
                                  error_model="numpy")(fn)
                _COMPILED[key] = kern
    return kern


def _float_array(a: Any, name: str, dtype: np.dtype | None = None) -> np.ndarray:
    """``a`` as a float32/float64 native-order array (of ``dtype`` if given); TypeError naming it otherwise."""
    arr = np.asarray(a)
    if arr.dtype not in _validate.KERNEL_DTYPES or not arr.dtype.isnative:
        raise TypeError(f"argument '{name}': the Numba kernel takes float32 or float64 arrays in native byte "
                        f"order, got dtype {arr.dtype}")
    if dtype is not None and arr.dtype != dtype:
        raise TypeError(f"argument '{name}': expected dtype {dtype} (the dtype of the first argument), got "
                        f"{arr.dtype}; the Numba kernel does not mix precisions")
    return arr


def _kernel_input(a: np.ndarray) -> np.ndarray:
    """C-contiguous, aligned, writeable (Numba types read-only arrays differently) - copied if not."""
    if a.flags.c_contiguous and a.flags.aligned and a.flags.writeable:
        return a
    return np.array(a, order="C", copy=True)


def _output(out: Any, shape: tuple[int, ...], dtype: np.dtype, name: str,
            inputs: tuple[tuple[str, np.ndarray], ...]) -> np.ndarray:
    """The caller's ``out`` checked (exact dtype/shape, C-contiguous, aligned, writeable, no aliasing) or a
    fresh 64-byte aligned buffer; NaN-poisoned either way."""
    if out is None:
        res = empty_aligned(shape, dtype)
    else:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"argument '{name}': expected a numpy.ndarray, got {type(out).__name__}")
        if out.dtype != dtype:
            raise TypeError(f"argument '{name}': expected dtype {dtype}, got {out.dtype}")
        if out.shape != tuple(shape):
            raise ValueError(f"argument '{name}': expected shape {tuple(shape)}, got {out.shape}")
        if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
            raise ValueError(f"argument '{name}': expected a C-contiguous, aligned, writeable array (refused: "
                             f"the kernel would write into a copy); allocate it with "
                             f"refimpl.backends.empty_aligned")
        for iname, a in inputs:
            if np.may_share_memory(out, a):
                raise ValueError(f"argument '{name}': shares memory with argument '{iname}'")
        res = out
    res.fill(np.nan)  # poison: an element the kernel does not write stays NaN
    return res


# ---------------------------------------------------------------------------------------------------
# LiSA contraction (Eq. 9): S = sum_c Qb (Ga + Ba), out = sum_d S (Gb + Bb)
# ---------------------------------------------------------------------------------------------------

def _lisa_contract_kernel(s, out, qb, a, bv, zero):  # pragma: no cover - runs compiled
    """Per row m (a token of one head): s[m, d] = sum_c qb[m, c] a[m, c, d] (c ascending from +0), then
    out[m, v] = sum_d s[m, d] bv[m, v, d] (d ascending from +0).  qb (M, c), a and bv (M, c, D),
    s (M, D), out (M, c).  The (M, c, D) tensors are streamed once; nothing is allocated."""
    nm, nc = qb.shape
    nd = a.shape[2]
    for m in range(nm):
        srow = s[m]
        for d in range(nd):
            srow[d] = zero
        for c in range(nc):
            qv = qb[m, c]
            arow = a[m, c]
            for d in range(nd):
                srow[d] += qv * arow[d]
        orow = out[m]
        bm = bv[m]
        for v in range(nc):
            orow[v] = zero
        for d in range(nd):           # per out[m, v] still d ascending from +0; the v loop vectorises
            sd = srow[d]
            for v in range(nc):
                orow[v] += sd * bm[v, d]


@register("lisa_contraction", "numba")
def lisa_contraction(qb: np.ndarray, a: np.ndarray, bv: np.ndarray, *, out: np.ndarray | None = None,
                     s_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The LiSA contraction in Numba: the twin of ``refimpl.attention.lisa_cores._lisa_contraction_numpy``.

    S[..., n, d] = sum_c Qb[..., n, c] A[..., n, c, d];  Y[..., n, v] = sum_d S[..., n, d] Bv[..., n, v, d],
    i.e. Y = sum_{c, d} Qb A Bv with A = Ga + Ba and Bv = Gb + Bb (LiSA Eq. 9).

    Parameters
    ----------
    qb : (..., N, c) float32/float64, the L2-normalised queries.
    a : (..., N, c, D) same dtype, Ga + Ba.   bv : (..., N, c, D) same dtype, Gb + Bb.
    out : optional (..., N, c) buffer; s_out : optional (..., N, D) buffer (C-contiguous, aligned,
        writeable, exact dtype; see :func:`refimpl.backends.empty_aligned`).

    Returns
    -------
    (S, Y): (..., N, D) and (..., N, c) arrays of qb's dtype (``s_out`` and ``out`` if given).

    References
    ----------
    LiSA Eq. 9 (Kim et al.), Fig. 7.
    """
    _import_numba()
    qb = _float_array(qb, "qb")
    dt = qb.dtype
    a, bv = _float_array(a, "a", dt), _float_array(bv, "bv", dt)
    if qb.ndim < 2 or min(qb.shape) < 1:
        raise ValueError(f"argument 'qb': expected a non-empty array of shape (..., N, c), got {qb.shape}")
    lead, nc = qb.shape[:-1], qb.shape[-1]
    if a.ndim != qb.ndim + 1 or a.shape[:-1] != qb.shape or a.shape[-1] < 1:
        raise ValueError(f"argument 'a': expected shape {qb.shape + ('D',)} for qb of shape {qb.shape}, got "
                         f"{a.shape}")
    if bv.shape != a.shape:
        raise ValueError(f"argument 'bv': expected shape {a.shape} (the shape of 'a'), got {bv.shape}")
    nd = a.shape[-1]
    m = int(np.prod(lead))
    ins = (("qb", qb), ("a", a), ("bv", bv))
    res = _output(out, lead + (nc,), dt, "out", ins)
    s = _output(s_out, lead + (nd,), dt, "s_out", ins + (("out", res),))
    t = dt.name
    kern = _compile("lisa_contraction", _lisa_contract_kernel,
                    f"void({t}[:, ::1], {t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, :, ::1], {t})")
    kern(s.reshape(m, nd), res.reshape(m, nc), _kernel_input(qb).reshape(m, nc),
         _kernel_input(a).reshape(m, nc, nd), _kernel_input(bv).reshape(m, nc, nd), dt.type(0))
    return s, res


# ---------------------------------------------------------------------------------------------------
# Castling-ViT angular series feature map (Eq. 8); specification refimpl.attention.angular
# ---------------------------------------------------------------------------------------------------

def _angular_features_kernel(out, x, coef, constant, clamp, eps, half_root,
                             xh, prev, cur):  # pragma: no cover - runs compiled
    """Per row: x^ = x / max(||x||, eps) (clamp) or x / ||x|| with ||x|| = m ||x / m||, m = max|x|
    (numerics.l2_normalize's scaled norm), then out = [sqrt(1/2)] + [coef[k] * x^(x)(2k+1)]_k, each tensor
    power built as (P[i] * x^[j]) * x^[l] at flat index (i d + j) d + l (angular_series.py's order).
    xh (d,), prev and cur (d^(2K+1),) are workspaces."""
    nm, nd = x.shape
    nk = coef.shape[0]
    zero = half_root * 0
    for m in range(nm):
        row = x[m]
        orow = out[m]
        mx = zero
        nan = False
        for j in range(nd):
            v = abs(row[j])
            if v != v:
                nan = True
            elif v > mx:
                mx = v
        safe = mx if mx > zero else mx * 0 + 1
        ss = zero
        for j in range(nd):
            r = row[j] / safe
            ss += r * r
        norm = mx * np.sqrt(ss)
        if np.isinf(mx):
            norm = mx
        if nan:
            norm = norm * np.nan
        if clamp and not (norm != norm) and not (norm > eps):
            norm = eps
        for j in range(nd):
            xh[j] = row[j] / norm
        pos = 0
        if constant:
            orow[0] = half_root
            pos = 1
        plen = nd
        for j in range(nd):
            prev[j] = xh[j]
            orow[pos + j] = coef[0] * xh[j]
        pos += nd
        for k in range(1, nk):
            t = 0
            for i in range(plen):
                pi = prev[i]
                for j in range(nd):
                    pij = pi * xh[j]
                    for l in range(nd):
                        cur[t] = pij * xh[l]
                        t += 1
            plen = t
            ck = coef[k]
            for i in range(plen):
                prev[i] = cur[i]
                orow[pos + i] = ck * cur[i]
            pos += plen


def _angular_features_supported(x: Any, order: Any, *, constant: Any = True, eps: Any = config.CASTLING_QK_NORM_EPS,
                                policy: str = "clamp", **_: Any) -> bool:
    """float32/float64 x, policy "clamp" or "none", a real (non-bool) eps."""
    return float_arrays(x) and policy in ("clamp", "none") and real_scalar(eps)


@register("angular_series_features", "numba", supports=_angular_features_supported)
def angular_series_features(x: Any, order: int, *, constant: bool = True,
                            eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                            out: np.ndarray | None = None) -> np.ndarray:
    """Angular series feature map in Numba: the twin of
    ``refimpl.attention.angular_series._angular_series_features_numpy`` (the NumPy definition of
    ``refimpl.attention.angular.angular_series_features``, the specification).

    Phi_K(x) = [sqrt(1/2), sqrt(c_0/pi) x^, sqrt(c_1/pi) x^(x)3, ..., sqrt(c_K/pi) x^(x)(2K+1)], x^ the
    row normalised over its d entries, c_k = binom(2k, k) / (4^k (2k + 1)).

    Parameters
    ----------
    x : (..., d) float32/float64.  order : K >= 0.  constant : bool.  eps : float >= 0.
    policy : "clamp" (x / max(||x||, eps)) or "none" (x / ||x||; a zero row gives NaN).
    out : optional (..., D) buffer, D = [constant] + d + d^3 + ... + d^(2K+1).

    Returns
    -------
    (..., D) array of x's dtype.

    References
    ----------
    Castling-ViT Eq. 8.
    """
    _import_numba()
    order = feature_maps.check_series_order(order)
    x = _float_array(x, "x")
    if x.ndim < 1 or min(x.shape) < 1:
        raise ValueError(f"argument 'x': expected a non-empty array of shape (..., d), got {x.shape}")
    if policy not in ("clamp", "none"):
        raise ValueError(f"argument 'policy': expected 'clamp' or 'none', got {policy!r}")
    dt, d = x.dtype, x.shape[-1]
    dim = feature_maps.series_feature_dim(d, order, bool(constant))
    lead = x.shape[:-1]
    m = int(np.prod(lead))
    if m * dim > config.CASTLING_MAX_FEATURE_ELEMENTS:
        raise ValueError(f"angular_series_features: {m * dim} elements exceed config.CASTLING_MAX_FEATURE_ELEMENTS="
                         f"{config.CASTLING_MAX_FEATURE_ELEMENTS} (d = {d}, order = {order}); lower the order")
    # sqrt(c_k / pi) in the kernel's dtype: c_k correctly rounded to float64, then to dtype (as angular_series.py
    # does under numerics.precision(dtype)), divided by pi and square-rooted in dtype.
    ck = np.array([float(f) for f in feature_maps.arcsin_coefficients_exact(order)]).astype(dt)
    with np.errstate(all="ignore"):
        coef = np.sqrt(ck / dt.type(np.pi)).astype(dt)
    res = _output(out, lead + (dim,), dt, "out", (("x", x),))
    t = dt.name
    kern = _compile("angular_series_features", _angular_features_kernel,
                    f"void({t}[:, ::1], {t}[:, ::1], {t}[::1], boolean, boolean, {t}, {t}, "
                    f"{t}[::1], {t}[::1], {t}[::1])")
    work = d ** (2 * order + 1)
    kern(res.reshape(m, dim), _kernel_input(x).reshape(m, d), coef, bool(constant), policy == "clamp",
         dt.type(eps), dt.type(np.sqrt(0.5)), np.empty(d, dt), np.empty(work, dt), np.empty(work, dt))
    return res


# ---------------------------------------------------------------------------------------------------
# FLatten focused function f_p (Eq. 6); specification refimpl.attention.focused.focused_function
# ---------------------------------------------------------------------------------------------------

def _focused_kernel(out, x, p, ipow, scale_by_max):  # pragma: no cover - runs compiled
    """Per row of x (M, d), x >= 0.  scale_by_max: m = max x (NaN if any NaN), r = x / m (m > 0, else 1),
    ||x|| = m ||r||, t = r**p, f = ||x|| (t / ||t||), and f = 0 * x where m == 0.  Otherwise (power
    scaling "none"): t = x**p, f = (||x|| / ||t||) t.  Sums in index order from +0.
    ipow > 0 (an integer p, 2 <= p <= ELEMENTARY_FUNCTION_ULPS + 2): r**p = r * r * ... * r, p - 1
    sequential multiplications, relative error <= gamma_(p-1) <= (c + 1) u, inside the (c + 1) u that
    focused_function_error budgets for pow itself (c = config.ELEMENTARY_FUNCTION_ULPS); libm's pow costs
    about 10x more per element.  Otherwise pow."""
    nm, nd = x.shape
    zero = p * 0
    one = zero + 1
    for mrow in range(nm):
        row = x[mrow]
        orow = out[mrow]
        if scale_by_max:
            mx = row[0]
            for j in range(nd):
                v = row[j]
                if v != v or v > mx:
                    mx = v
                if v != v:
                    break
            safe = mx if mx > zero else one
            sr = zero
            for j in range(nd):
                r = row[j] / safe
                sr += r * r
            nx = mx * np.sqrt(sr)
            st = zero
            for j in range(nd):
                r = row[j] / safe
                if ipow > 0:
                    t = r
                    for _ in range(ipow - 1):
                        t = t * r
                else:
                    t = r ** p
                orow[j] = t
                st += t * t
            nt = np.sqrt(st)
            if mx == zero:
                for j in range(nd):
                    orow[j] = zero * row[j]
            else:
                for j in range(nd):
                    orow[j] = nx * (orow[j] / nt)
        else:
            sx = zero
            st = zero
            for j in range(nd):
                v = row[j]
                if ipow > 0:
                    t = v
                    for _ in range(ipow - 1):
                        t = t * v
                else:
                    t = v ** p
                orow[j] = t
                sx += v * v
                st += t * t
            ratio = np.sqrt(sx) / np.sqrt(st)
            for j in range(nd):
                orow[j] = ratio * orow[j]


def _focused_supported(x: Any, *args: Any, **_: Any) -> bool:
    """float32/float64 x."""
    return float_arrays(x)


@register("focused_function", "numba", supports=_focused_supported)
def focused_function(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                     power_scaling: str = "max", out: np.ndarray | None = None) -> np.ndarray:
    """The focused function f_p in Numba: the twin of :func:`refimpl.feature_maps.focused_function` (the
    NumPy definition of ``refimpl.attention.focused.focused_function``, the specification).

    f_p(x) = ||x|| / ||x**p|| * x**p along ``axis``; "max" power scaling evaluates it on r = x / max(x).

    Parameters
    ----------
    x : float32/float64 array (..., d), every entry >= 0 (NaN propagates).  p : float >= 1.
    axis : the feature axis.  power_scaling : "max" or "none".
    out : optional buffer of x's shape and dtype (only with axis = -1 / the last axis).

    Returns
    -------
    ndarray of x's shape and dtype.

    References
    ----------
    FLatten Eq. 6, Eq. 20-21.
    """
    _import_numba()
    p = feature_maps.check_focusing_factor(p)
    x = _float_array(x, "x")
    if x.ndim < 1 or x.size < 1:
        raise ValueError(f"argument 'x': expected a non-empty array, got shape {x.shape}")
    validation.check_option(power_scaling, "power_scaling", ("max", "none"))
    if np.any(x < 0):
        raise ValueError("argument 'x': f_p is defined on non-negative features (apply ReLU first); got "
                         "negative entries")
    ax = axis % x.ndim if -x.ndim <= axis < x.ndim else None
    if ax is None:
        raise ValueError(f"argument 'axis': expected an axis of x (ndim {x.ndim}), got {axis}")
    last = ax == x.ndim - 1
    if out is not None and not last:
        raise ValueError("argument 'out': only supported when 'axis' is the last axis")
    xm = x if last else np.moveaxis(x, ax, -1)
    dt, d = x.dtype, xm.shape[-1]
    m = xm.size // d
    res = _output(out, xm.shape, dt, "out", (("x", x),)) if last else _output(None, xm.shape, dt, "out", ())
    t = dt.name
    kern = _compile("focused_function", _focused_kernel, f"void({t}[:, ::1], {t}[:, ::1], {t}, int64, boolean)")
    ipow = int(p) if p == int(p) and 2 <= p <= config.ELEMENTARY_FUNCTION_ULPS + 2 else 0
    kern(res.reshape(m, d), _kernel_input(xm).reshape(m, d), dt.type(p), ipow, power_scaling == "max")
    return res if last else np.moveaxis(res, -1, ax)


# ---------------------------------------------------------------------------------------------------
# LiSA spectral products (Eq. 10); specification refimpl.attention.lisa_cores._lisa_spectral_product_numpy
# ---------------------------------------------------------------------------------------------------

def _spectral_product_kernel(out, xf, kf, shared):  # pragma: no cover - runs compiled
    """out[m, f, c, d] = xf[m, f, c] * kf[f, c or 0, d] on the real views (interleaved re, im):
    (a + ib)(p + iq) = (a p - b q) + i (a q + b p), the textbook product (two products and one addition
    per part, no FMA), streamed in out's memory order.  out (M, F, c, 2D), xf (M, F, 2c), kf (F, c|1, 2D)."""
    nm, nf, nc2 = xf.shape
    nc = nc2 // 2
    nd = kf.shape[2] // 2
    for m in range(nm):
        for f in range(nf):
            for c in range(nc):
                a = xf[m, f, 2 * c]
                b = xf[m, f, 2 * c + 1]
                krow = kf[f, 0] if shared else kf[f, c]
                orow = out[m, f, c]
                for d in range(nd):
                    pr = krow[2 * d]
                    qi = krow[2 * d + 1]
                    orow[2 * d] = a * pr - b * qi
                    orow[2 * d + 1] = a * qi + b * pr


@register("lisa_spectral_product", "numba")
def lisa_spectral_product(xf: Any, kf: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """The LiSA spectral product in Numba: the twin of ``refimpl.attention.lisa_cores._lisa_spectral_product_numpy``.

    P[m, f, c, d] = Xf[m, f, c] Kf[f, c', d] (c' = c, or 0 when Kf has one channel: Gb's shared kernel).

    Parameters
    ----------
    xf : (M, F, c) complex64/complex128.  kf : (F, c, D) or (F, 1, D), same dtype.
    out : optional (M, F, c, D) buffer of that dtype (C-contiguous, aligned, writeable).

    Returns
    -------
    (M, F, c, D) complex array.

    References
    ----------
    LiSA Eq. 10, Appendix A.
    """
    _import_numba()
    xf, kf = np.asarray(xf), np.asarray(kf)
    if xf.dtype not in (np.complex64, np.complex128) or not xf.dtype.isnative:
        raise TypeError(f"argument 'xf': the Numba kernel takes complex64 or complex128 arrays, got dtype {xf.dtype}")
    if kf.dtype != xf.dtype:
        raise TypeError(f"argument 'kf': expected dtype {xf.dtype} (the dtype of 'xf'), got {kf.dtype}")
    if xf.ndim != 3 or min(xf.shape) < 1:
        raise ValueError(f"argument 'xf': expected a non-empty array of shape (M, F, c), got {xf.shape}")
    nm, nf, nc = xf.shape
    if kf.ndim != 3 or kf.shape[0] != nf or kf.shape[1] not in (1, nc) or kf.shape[2] < 1:
        raise ValueError(f"argument 'kf': expected shape ({nf}, {nc}, D) or ({nf}, 1, D) for xf of shape "
                         f"{xf.shape}, got {kf.shape}")
    nd = kf.shape[2]
    res = _output(out, (nm, nf, nc, nd), xf.dtype, "out", (("xf", xf), ("kf", kf)))
    rt = np.dtype(np.float64 if xf.dtype == np.complex128 else np.float32)
    t = rt.name
    kern = _compile("lisa_spectral_product", _spectral_product_kernel,
                    f"void({t}[:, :, :, ::1], {t}[:, :, ::1], {t}[:, :, ::1], boolean)")
    kern(res.view(rt), _kernel_input(xf).view(rt), _kernel_input(kf).view(rt), kf.shape[1] == 1 and nc > 1)
    return res


# ---------------------------------------------------------------------------------------------------
# LiSA fused FFT core (Eq. 9-10): spectra, spectral products, inverse transforms, biases and the
# contraction, one block of channels at a time; specification refimpl.attention.lisa_cores._lisa_fft_core_numpy
# ---------------------------------------------------------------------------------------------------
#
# Layout: every signal is a contiguous row over the (padded) grid L = (L_1, .., L_r), so each FFT runs
# over the last axes.  A real transform over a grid whose last length L_r = 2K is even is computed as a
# complex transform over (L_1, .., L_{r-1}, K) of the even/odd samples packed as z = y[.., 2j] + i y[.., 2j+1]
# (a free view of the real array), plus one twiddle pass (the "real split" stage that
# refimpl.toeplitz.fft_convolution_depth charges, config.FFT_REAL_SPLIT_STAGES).  With i' the index of
# the leading frequencies negated (-i mod L per axis) and w = exp(2 pi i / L_r):
#   forward   Z = FFT(z);  E = (Z[i, k] + conj Z[i', K-k]) / 2,  O = (Z[i, k] - conj Z[i', K-k]) / (2i),
#             X[i, k] = E + w^-k O                       (k = 0..K; column K reads column 0)
#   inverse   Z[i, k] = E + i O,  E = (X[i, k] + conj X[i', K-k]) / 2,  O = w^k (X[i, k] - conj X[i', K-k]) / 2
#             (k = 0..K-1),  z = IFFT(Z),  y[.., 2j] = Re z[.., j],  y[.., 2j+1] = Im z[.., j]
# (E and O are the spectra of the even and odd samples; the derivation is the 1-D one applied along the
# last axis, using the Hermitian symmetry X[i', L_r - k] = conj X[i, k] of a real signal's spectrum.)  The
# inverse pass is fused with the spectral product X = Xf Kf, so the product spectrum is never stored.
# Every output element still depends on one signal only (no two signals share a complex transform), so
# the error model of the NumPy definition covers it signal by signal.  pocketfft's complex passes have
# radix-7 and radix-11 butterflies that its real passes lack, which is the main reason this is 1.6-2.2x
# faster than scipy.fft.irfft2 at 14x14 .. 112x112 (docs/lisa.md).

def _rfft_post_kernel(x, z, neg, tw, half):  # pragma: no cover - runs compiled
    """x (R, G, 2(K+1)) <- the half spectra of real signals from z (R, G, 2K) = the complex FFT of their
    packed samples (G = prod(L_1..L_{r-1}) leading frequencies, ``neg`` (G,) their negated indices);
    tw (2(K+1),) = exp(-2 pi i k / (2K)), k = 0..K (interleaved re, im).  Real views of complex arrays;
    ``half`` is 0.5 in the element type (a literal would promote float32 arithmetic to float64)."""
    nr, ng = z.shape[0], z.shape[1]
    nk = z.shape[2] // 2
    for r in range(nr):
        for i in range(ng):
            za = z[r, i]
            zb = z[r, neg[i]]
            xr = x[r, i]
            for k in range(nk + 1):
                k1 = k if k < nk else 0
                k2 = nk - k if 0 < k < nk else 0
                ar = za[2 * k1]
                ai = za[2 * k1 + 1]
                br = zb[2 * k2]
                bi = -zb[2 * k2 + 1]               # conj Z[i', K - k]
                er = (ar + br) * half
                ei = (ai + bi) * half
                orr = (ai - bi) * half             # (Z - conj Z') / (2i)
                oi = (br - ar) * half
                tr = tw[2 * k]
                ti = tw[2 * k + 1]
                xr[2 * k] = er + (tr * orr - ti * oi)
                xr[2 * k + 1] = ei + (tr * oi + ti * orr)


def _product_pre_kernel(z, xf, kf, shared, src, tw, half, prow):  # pragma: no cover - runs compiled
    """z[j, d] (G K complex) <- the packed spectrum Z = E + i O (see above) of the product
    P = xf[j] kf[j|0, d] (complex, textbook: two products and one addition per part, no FMA).
    Real views, frequencies flattened: xf (J, 2F), kf (J|1, D, 2F), F = G (K+1); z (J, D, 2 G K);
    src (G K, 3) int64: for output frequency (i, k) the flat indices of (i, k) and (i', K - k) in P and k;
    tw (2K,) = exp(+2 pi i k / (2K)), k = 0..K-1; prow (2F,) workspace holding P of one (j, d)."""
    nj, nd = z.shape[0], z.shape[1]
    nz = z.shape[2] // 2
    nf = xf.shape[1] // 2
    for j in range(nj):
        jj = 0 if shared else j
        xa = xf[j]
        for d in range(nd):
            ka = kf[jj, d]
            for f in range(nf):                    # P of this (j, d), every frequency once
                xr_ = xa[2 * f]
                xi_ = xa[2 * f + 1]
                kr_ = ka[2 * f]
                ki_ = ka[2 * f + 1]
                prow[2 * f] = xr_ * kr_ - xi_ * ki_
                prow[2 * f + 1] = xr_ * ki_ + xi_ * kr_
            zr = z[j, d]
            for f in range(nz):
                a = src[f, 0]
                b = src[f, 1]
                k = src[f, 2]
                p1r = prow[2 * a]
                p1i = prow[2 * a + 1]
                p2r = prow[2 * b]
                p2i = prow[2 * b + 1]
                er = (p1r + p2r) * half            # (P1 + conj P2) / 2
                ei = (p1i - p2i) * half
                dr = (p1r - p2r) * half            # (P1 - conj P2) / 2
                di = (p1i + p2i) * half
                tr = tw[2 * k]
                ti = tw[2 * k + 1]
                zr[2 * f] = er - (tr * di + ti * dr)
                zr[2 * f + 1] = ei + (tr * dr - ti * di)


def _fused_product_kernel(out, xf, kf, shared):  # pragma: no cover - runs compiled
    """out[j, d, f] = xf[j, f] * kf[j or 0, d, f] (complex, textbook product, no FMA) on real views:
    out (J, D, 2F), xf (J, 2F), kf (J|1, D, 2F).  (Odd last FFT length: no packing.)"""
    nj, nd, nf2 = out.shape
    nf = nf2 // 2
    for j in range(nj):
        xrow = xf[j]
        kj = kf[0] if shared else kf[j]
        for d in range(nd):
            krow = kj[d]
            orow = out[j, d]
            for f in range(nf):
                a = xrow[2 * f]
                b = xrow[2 * f + 1]
                p = krow[2 * f]
                q = krow[2 * f + 1]
                orow[2 * f] = a * p - b * q
                orow[2 * f + 1] = a * q + b * p


def _fused_s_kernel(st, qt, ga, ba):  # pragma: no cover - runs compiled
    """st[d, n] += qt[j, n] * (ga[j, d, n] + ba[j, d]) for the J channels of a block, j ascending (so each
    S[n, d] = sum_c Qb (Ga + Ba) is summed over c ascending, starting from st's initial zeros)."""
    nj, nd, nn = ga.shape
    for j in range(nj):
        qrow = qt[j]
        for d in range(nd):
            g = ga[j, d]
            bd = ba[j, d]
            srow = st[d]
            for n in range(nn):
                srow[n] += qrow[n] * (g[n] + bd)


def _fused_y_kernel(out, s_out, st, gb, bb, v0, acc, zero):  # pragma: no cover - runs compiled
    """out[n, v0 + j] = sum_d st[d, n] (gb[j, d, n] + bb[j, d]), d ascending from +0; acc (N,) workspace.
    The first block (v0 = 0) also stores S: s_out[n, d] = st[d, n]."""
    nj, nd, nn = gb.shape
    if v0 == 0:
        for n in range(nn):
            for d in range(nd):
                s_out[n, d] = st[d, n]
    for j in range(nj):
        for n in range(nn):
            acc[n] = zero
        for d in range(nd):
            g = gb[j, d]
            bd = bb[j, d]
            srow = st[d]
            for n in range(nn):
                acc[n] += srow[n] * (g[n] + bd)
        col = v0 + j
        for n in range(nn):
            out[n, col] = acc[n]


_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A per-thread, 64-byte aligned scratch array of ``shape`` reused across calls (grown when too small).

    Fresh temporaries of this size cost one minor page fault per 4 KiB on every call (measured: about
    1.8 us each, more than the arithmetic on them); reused buffers are faulted in once."""
    dt = np.dtype(dtype)
    size = math.prod(shape)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    buf = bufs.get((name, dt))
    if buf is None or buf.size < size:
            buf = bufs[(name, dt)] = empty_aligned(max(size, 1), dt)
    return buf[:size].reshape(shape)


def release_scratch() -> None:
    """Drop the scratch buffers of :func:`lisa_fft_core`: this thread's, and those of the worker threads
    (the pool is shut down; the next multi-threaded call starts a new one).  Call it while no
    lisa_fft_core call is running."""
    global _POOL, _POOL_SIZE
    _SCRATCH.bufs = {}
    with _POOL_LOCK:
        pool, _POOL, _POOL_SIZE = _POOL, None, 0
    if pool is not None:
        pool.shutdown(wait=True)


# Worker threads of lisa_fft_core: one persistent pool (threads and their scratch buffers are reused
# across calls); the calling thread always takes a share of the work itself.
_POOL: Any = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()
_IN_WORKER = threading.local()


def _pool_worker_init() -> None:
    _IN_WORKER.flag = True


def _run_shared(units: list[Callable[[], None]], nthreads: int) -> None:
    """Run every callable of ``units`` exactly once on ``nthreads`` threads (the caller and nthreads - 1
    pool threads), each thread claiming the next unclaimed unit in list order (so a descheduled core
    delays nothing).  Each unit writes only its own outputs and uses its executing thread's scratch, so
    the results do not depend on which thread ran which unit.  Re-raises the first exception."""
    global _POOL, _POOL_SIZE
    nthreads = max(1, min(nthreads, len(units)))
    if nthreads == 1 or getattr(_IN_WORKER, "flag", False):    # a worker never waits on its own pool
        for u in units:
            u()
        return
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < nthreads - 1:
            from concurrent.futures import ThreadPoolExecutor
            # A smaller pool is dropped, not shut down: a concurrent call may still hold it (its idle
            # threads exit when it is garbage-collected).
            _POOL = ThreadPoolExecutor(max_workers=nthreads - 1, thread_name_prefix="refimpl-lisa",
                                       initializer=_pool_worker_init)
            _POOL_SIZE = nthreads - 1
        pool = _POOL
    claim = threading.Lock()
    nxt = [0]
    failed: list[BaseException] = []

    def drain() -> None:
        while True:
            with claim:
                i = nxt[0]
                if failed or i >= len(units):
                    return
                nxt[0] = i + 1
            try:
                units[i]()
            except BaseException as e:       # noqa: BLE001 - re-raised by the caller below
                with claim:
                    failed.append(e)
                return

    futs = [pool.submit(drain) for _ in range(nthreads - 1)]
    drain()
    for f in futs:
        f.result()
    if failed:
        raise failed[0]


def lisa_threads(threads: Any, heads: int, work: int) -> int:
    """Threads :func:`lisa_fft_core` uses: ``threads`` (None: refimpl.backends._c.default_threads(), the
    CPUs this process may run on capped at config.C_KERNEL_THREADS_MAX, the rule of the C kernels),
    at most one per head (B h), and 1 when the inverse-transform work ``work`` = B h c D prod(L) is below
    config.LISA_PARALLEL_MIN_WORK (where waking a second thread costs more than it saves)."""
    if threads is None:
        from ._c import default_threads
        threads = default_threads()
    elif isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"argument 'threads': expected an integer >= 1 or None, got {threads!r}")
    if work < config.LISA_PARALLEL_MIN_WORK:
        return 1
    return int(max(1, min(int(threads), heads)))


def _transpose_kernel(dst, src, c0):  # pragma: no cover - runs compiled
    """dst[m, c, n] = src[m, n, c0 + c] (c < dst.shape[1]) in 32 x 32 tiles (a plain strided copy of a
    transpose misses the cache on one side: 10 ms for Wa at 56 x 56, C = 64 against 1 ms tiled)."""
    nm, nn = src.shape[0], src.shape[1]
    nc = dst.shape[1]
    for m in range(nm):
        for n0 in range(0, nn, 32):
            n1 = min(n0 + 32, nn)
            for t0 in range(0, nc, 32):
                t1 = min(t0 + 32, nc)
                for c in range(t0, t1):
                    drow = dst[m, c]
                    for n in range(n0, n1):
                        drow[n] = src[m, n, c0 + c]


def _twiddles(length: int, sign: int, count: int, rdt: np.dtype) -> np.ndarray:
    """exp(sign 2 pi i k / length), k = 0..count-1, interleaved (re, im) in ``rdt`` (rounded once from
    float64: twiddle error <= u, as the FFT error model assumes)."""
    k = np.arange(count, dtype=np.float64)
    w = np.exp(sign * 2j * np.pi * k / length)
    return np.ascontiguousarray(w.astype(np.complex128).view(np.float64).astype(rdt))


class _SpectralPlan:
    """Transforms over the last r axes of contiguous rows of real signals on the padded grid ``lens``."""

    def __init__(self, lens: tuple[int, ...], dtype: np.dtype):
        import scipy.fft as sfft
        self.sfft = sfft
        try:    # scipy.fft's own pocketfft binding (private; without it the public functions are used)
            from scipy.fft._pocketfft import pypocketfft
            self.pocketfft: Any = pypocketfft
        except Exception:  # noqa: BLE001 - any failure: fall back to the public API
            self.pocketfft = None
        self.lens = lens
        self.r = len(lens)
        self.axes = tuple(range(1, self.r + 1))
        self.rdt = np.dtype(dtype)
        self.cdt = np.dtype(np.complex128 if self.rdt == np.float64 else np.complex64)
        last = lens[-1]
        self.split = last % 2 == 0
        self.lead = lens[:-1]
        self.g = int(np.prod(self.lead))
        self.half = self.lead + (last // 2 + 1,)
        self.nf = int(np.prod(self.half))
        self.ntok = int(np.prod(lens))
        t = self.rdt.name
        if self.split:
            self.k = last // 2
            if self.lead:                    # flat index of the negated leading frequency (-i mod L per axis)
                neg = np.arange(self.g).reshape(self.lead)[np.ix_(*[(-np.arange(n)) % n for n in self.lead])]
            else:
                neg = np.zeros(1, dtype=np.int64)
            self.neg = np.ascontiguousarray(np.reshape(neg, (self.g,)), dtype=np.int64)
            self.tw_fwd = _twiddles(last, -1, self.k + 1, self.rdt)
            self.tw_inv = _twiddles(last, +1, self.k, self.rdt)
            self.half_t = self.rdt.type(0.5)
            self.post_sig = f"void({t}[:, :, ::1], {t}[:, :, ::1], int64[::1], {t}[::1], {t})"
            ii, kk = np.divmod(np.arange(self.g * self.k), self.k)
            self.src = np.ascontiguousarray(np.stack([ii * (self.k + 1) + kk, self.neg[ii] * (self.k + 1) + self.k - kk,
                                                      kk], axis=1), dtype=np.int64)
            self.pre_sig = (f"void({t}[:, :, ::1], {t}[:, ::1], {t}[:, :, ::1], boolean, int64[:, ::1], {t}[::1], "
                            f"{t}, {t}[::1])")
        else:
            self.prod_sig = f"void({t}[:, :, ::1], {t}[:, ::1], {t}[:, :, ::1], boolean)"

    def c2c(self, a: np.ndarray, forward: bool) -> np.ndarray:
        """In-place complex FFT (forward) or inverse FFT scaled by 1 / prod (backward normalisation) over
        the last r axes of ``a``: scipy.fft.fftn / ifftn(a, axes, overwrite_x=True), calling their
        pocketfft routine directly when it can be imported (scipy.fft's argument handling and backend
        dispatch cost about 6 us a call against 0.7 us; same routine, same arguments, same bits)."""
        if self.pocketfft is not None:
            return self.pocketfft.c2c(a, self.axes, forward, 0 if forward else 2, a, 1)
        fn = self.sfft.fftn if forward else self.sfft.ifftn
        return fn(a, axes=self.axes, overwrite_x=True)

    def forward(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """rfftn over the last r axes of y (R, *lens) real C-contiguous (consumed) -> (R, F) complex, in x
        (a complex buffer of R F elements)."""
        sf = self.sfft
        nrow = y.shape[0]
        if not self.split:
            x = x.reshape(nrow, self.nf)
            np.copyto(x, sf.rfftn(y, axes=self.axes).reshape(nrow, self.nf))
            return x
        zc = self.c2c(y.view(self.cdt), True)                              # packed samples, in place
        x = x.reshape(nrow, self.g, self.k + 1)
        post = _compile("lisa_rfft_post", _rfft_post_kernel, self.post_sig)
        post(x.view(self.rdt), zc.reshape(nrow, self.g, self.k).view(self.rdt), self.neg, self.tw_fwd, self.half_t)
        return x.reshape(nrow, self.nf)

    def product_inverse(self, xf: np.ndarray, kf: np.ndarray, shared: bool, work: np.ndarray) -> np.ndarray:
        """irfftn of the products xf[j] kf[j|0, d]: xf (J, F), kf (J|1, D, F) complex -> (J, D, prod(lens))
        real, in ``work`` (a complex scratch buffer of at least J D prod(lens) / 2 + 1 elements)."""
        sf = self.sfft
        nj, nd = xf.shape[0], kf.shape[1]
        if not self.split:
            p = work[:nj * nd * self.nf].reshape(nj, nd, self.nf)
            _compile("lisa_fused_product", _fused_product_kernel, self.prod_sig)(
                p.view(self.rdt), xf.view(self.rdt), kf.view(self.rdt), shared)
            y = sf.irfftn(p.reshape((nj * nd,) + self.half), s=self.lens, axes=self.axes)
            return y.reshape(nj, nd, self.ntok)
        z = work[:nj * nd * self.g * self.k].reshape(nj, nd, self.g, self.k)
        pre = _compile("lisa_product_pre", _product_pre_kernel, self.pre_sig)
        pre(z.reshape(nj, nd, self.g * self.k).view(self.rdt), xf.view(self.rdt), kf.view(self.rdt), shared,
            self.src, self.tw_inv, self.half_t, _scratch("prow", (2 * self.nf,), self.rdt))
        z = self.c2c(z.reshape((nj * nd,) + self.lead + (self.k,)), False)
        return z.view(self.rdt).reshape(nj, nd, self.ntok)


_PLANS: dict[tuple[tuple[int, ...], str], _SpectralPlan] = {}    # read-only after construction


@register("lisa_fft_core", "numba")
def lisa_fft_core(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                  grid: tuple[int, ...], lengths: tuple[int, ...] | None = None, *,
                  out: np.ndarray | None = None, s_out: np.ndarray | None = None,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LiSA's FFT core fused (Eq. 9-10): the twin of ``refimpl.attention.lisa_cores._lisa_fft_core_numpy``.

    Ga = Kb (*) Wa, Gb = V (*) Wb (circular convolutions over the grid; with ``lengths`` linear ones by
    zero padding to ``lengths`` and the Toeplitz kernel already periodised), then S = sum_c Qb (Ga + Ba)
    and Y = sum_d S (Gb + Bb).  Computed one head and one block of channels at a time: the spectral
    products of the block (Numba), its inverse transforms (scipy.fft, complex, see the comment above),
    the bias and the contraction (Numba), so the (N, c, D) tensors Ga, Gb are never formed whole.  The
    kernel spectra are computed once per call (shared by all heads).

    Threads (:func:`lisa_threads`), two rounds: the forward spectra in blocks of rows (the kernels' split
    into one block of (c, D) rows per thread, the signals' into blocks of heads), then the heads (B h),
    each computed whole by one thread (inverse transforms, biases, contraction) on that thread's scratch,
    writing only its own rows of S and Y.  No sum crosses a thread, and a transform's bits do not depend
    on how many others share its pocketfft call, so the result is bitwise identical for any thread count
    (tested).  Scratch buffers are per thread, 64-byte aligned and reused across calls
    (:func:`release_scratch`).

    Parameters
    ----------
    qb, kb : (B, h, N, c) float32/float64, the L2-normalised queries and keys; v : (B, h, N, c) values.
    weight_a : (*lengths, c, D) kernel of Ga on the FFT grid (Wa reshaped to the grid, or the periodised
        Toeplitz kernel); weight_b : (*lengths, D).  bias_a, bias_b : (c, D).  All of qb's dtype.
    grid : token grid (N = prod(grid)).  lengths : FFT lengths per axis (None: the grid, circular).
    out : optional (B, h, N, c) buffer; s_out : optional (B, h, N, D) buffer.
    threads : int >= 1 or None (default: the C kernels' rule, refimpl.backends._c.default_threads());
        at most one thread per head is used, and one below config.LISA_PARALLEL_MIN_WORK.  Changes the
        speed only, never a bit.

    Returns
    -------
    (S, Y): (B, h, N, D) and (B, h, N, c) arrays of qb's dtype.

    References
    ----------
    LiSA Eq. 9, Eq. 10, Fig. 7, Appendix A.
    """
    _import_numba()
    qb = _float_array(qb, "qb")
    dt = qb.dtype
    kb, v = _float_array(kb, "kb", dt), _float_array(v, "v", dt)
    wa, wb = _float_array(weight_a, "weight_a", dt), _float_array(weight_b, "weight_b", dt)
    ba, bb = _float_array(bias_a, "bias_a", dt), _float_array(bias_b, "bias_b", dt)
    grid = tuple(int(n) for n in grid)
    lens = grid if lengths is None else tuple(int(n) for n in lengths)
    r = len(grid)
    if qb.ndim != 4 or min(qb.shape) < 1:
        raise ValueError(f"argument 'qb': expected a non-empty array of shape (B, h, N, c), got {qb.shape}")
    nb, nh, ntok, nc = qb.shape
    if int(np.prod(grid)) != ntok or len(lens) != r or any(L < n for L, n in zip(lens, grid)):
        raise ValueError(f"argument 'grid' / 'lengths': grid {grid} (N = {ntok}) and lengths {lens} do not fit")
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
    ins = (("qb", qb), ("kb", kb), ("v", v))
    res = _output(out, qb.shape, dt, "out", ins)
    s = _output(s_out, (nb, nh, ntok, nd), dt, "s_out", ins + (("out", res),))
    t = dt.name
    skern = _compile("lisa_fused_s", _fused_s_kernel, f"void({t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, ::1])")
    ykern = _compile("lisa_fused_y", _fused_y_kernel,
                     f"void({t}[:, ::1], {t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, ::1], int64, {t}[::1], {t})")
    transpose = _compile("lisa_transpose", _transpose_kernel, f"void({t}[:, :, ::1], {t}[:, :, ::1], int64)")
    plan = _PLANS.get((lens, dt.name))
    if plan is None:
        plan = _PLANS[(lens, dt.name)] = _SpectralPlan(lens, dt)
    m = nb * nh
    padded = lens != grid
    cdt = plan.cdt
    nf = plan.nf
    cropsl = tuple(slice(0, n) for n in grid)
    nthreads = lisa_threads(threads, m, m * nc * nd * plan.ntok)

    def spectra(name, src, col0, ncol, npos, pad, x):
        """rfftn over the grid of columns col0 .. col0 + ncol of src (M', npos, C) -> x (M' ncol F,) complex:
        the columns transposed into this thread's scratch rows (M', ncol) (zero-padded to lens when
        ``pad``), transformed in place."""
        mm = src.shape[0]
        y = _scratch(name + "_in", (mm * ncol,) + lens, dt)
        if padded and pad:
            yt = _scratch(name + "_t", (mm, ncol, npos), dt)
            transpose(yt, src, col0)
            y.fill(0)
            np.copyto(y[(slice(None),) + cropsl], yt.reshape((mm * ncol,) + grid))
        else:
            transpose(y.reshape(mm, ncol, npos), src, col0)
        return plan.forward(y, x)

    # Spectra, in blocks written into disjoint parts of the calling thread's buffers (nthreads blocks of
    # rows of each kind): the kernels' (rows (c, D) and (D,) over the FFT grid; once per call, shared by
    # the heads) and the signals' (rows (B h, c) of Kb and V, blocks of heads); Qb transposed to (B h, c, N).
    ncd = nc * nd
    wa3 = _kernel_input(wa.reshape(1, plan.ntok, ncd))
    wb3 = _kernel_input(wb.reshape(1, plan.ntok, nd))
    kb3 = _kernel_input(kb.reshape(m, ntok, nc))
    v3 = _kernel_input(v.reshape(m, ntok, nc))
    q3 = _kernel_input(qb.reshape(m, ntok, nc))
    waf, wbf = _scratch("waf", (ncd * nf,), cdt), _scratch("wbf", (nd * nf,), cdt)
    kf, vf = _scratch("kf", (m * nc * nf,), cdt), _scratch("vf", (m * nc * nf,), cdt)
    qt = _scratch("qt", (m, nc, ntok), dt)
    rb, hb = -(-ncd // nthreads), -(-m // nthreads)
    units = [lambda r0=r0, r1=min(ncd, r0 + rb): spectra("wa", wa3, r0, r1 - r0, plan.ntok, False,
                                                          waf[r0 * nf:r1 * nf]) for r0 in range(0, ncd, rb)]
    for name, src, dst in (("kb", kb3, kf), ("v", v3, vf)):
        units += [lambda name=name, src=src, dst=dst, h0=h0, h1=min(m, h0 + hb):
                  spectra(name, src[h0:h1], 0, nc, ntok, True, dst[h0 * nc * nf:h1 * nc * nf])
                  for h0 in range(0, m, hb)]
    units.append(lambda: spectra("wb", wb3, 0, nd, plan.ntok, False, wbf))
    units.append(lambda: transpose(qt, q3, 0))
    _run_shared(units, nthreads)
    waf, wbf = waf.reshape(nc, nd, nf), wbf.reshape(1, nd, nf)
    kf, vf = kf.reshape(m, nc, nf), vf.reshape(m, nc, nf)
    ba, bb = np.ascontiguousarray(ba), np.ascontiguousarray(bb)
    out3 = res.reshape(m, ntok, nc)
    s3 = s.reshape(m, ntok, nd)
    # Channel blocks: about config.LISA_FUSED_BLOCK_BYTES of spectra per block.
    per_channel = nd * nf * cdt.itemsize
    cb = int(max(1, min(nc, config.LISA_FUSED_BLOCK_BYTES // max(per_channel, 1))))
    zero = dt.type(0)

    def head(mi):
        """Head mi (of B h) whole, on this thread's scratch: Ga and Gb a block of channels at a time, into
        the rows of head mi of S and Y."""
        work = _scratch("work", (cb * nd * nf,), cdt)          # >= cb D prod(lens) / 2 (nf >= ntok / 2)
        st = _scratch("st", (nd, ntok), dt)
        acc = _scratch("acc", (ntok,), dt)

        def inverse_block(spec_rows, kern_rows, shared, j):
            g = plan.product_inverse(spec_rows, kern_rows, shared, work)                   # (j, D, prod(lens))
            if padded:
                crop = _scratch("crop", (j, nd) + grid, dt)
                np.copyto(crop, g.reshape((j, nd) + lens)[(slice(None), slice(None)) + cropsl])
                g = crop
            return g.reshape(j, nd, ntok)

        st.fill(0)
        for c0 in range(0, nc, cb):
            j = min(cb, nc - c0)
            ga = inverse_block(kf[mi, c0:c0 + j], waf[c0:c0 + j], False, j)
            skern(st, qt[mi, c0:c0 + j], ga, ba[c0:c0 + j])
        for c0 in range(0, nc, cb):
            j = min(cb, nc - c0)
            gb = inverse_block(vf[mi, c0:c0 + j], wbf, True, j)
            ykern(out3[mi], s3[mi], st, gb, bb[c0:c0 + j], c0, acc, zero)

    _run_shared([lambda mi=mi: head(mi) for mi in range(m)], nthreads)
    return s, res
