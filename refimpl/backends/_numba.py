"""The Numba backend: validated wrappers around kernels compiled with explicit signatures.

Numba is optional: it is imported, and each kernel compiled, on first use (never at ``import refimpl``).
Each kernel is a private ``_..._kernel`` function compiled per dtype with an explicit signature on
C-contiguous arrays (``float64[:, :, :, ::1]``...), so a call with any other layout or dtype is a type
error rather than a silent recompilation; the public wrapper validates (refimpl.backends._validate),
poisons the output with NaN and calls it.  ``cache=True`` keeps the machine code on disk (next to this
file in ``__pycache__``, or in NUMBA_CACHE_DIR), so the compile cost is paid once per machine.
``fastmath`` is ``config.NUMBA_FASTMATH`` (False: see config.py).

This module holds the shared runtime (importing Numba, :func:`_compile`, the argument and output helpers,
the per-thread scratch buffers and the worker pool :func:`_run_shared` with its thread rule
:func:`lisa_threads`) and the feature-map kernels (Castling-ViT's angular series features, FLatten's
f_p).  The other kernel families live next to it, each registered with its predicate there:
``_numba_depthwise.py`` (depthwise conv2d), ``_numba_lisa.py`` (LiSA: contraction, spectral products,
the fused FFT core), ``_numba_lisa_local.py`` (LiSA Table 3c's direct local operator),
``_numba_elementwise.py`` (GELU).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from .. import config, feature_maps, validation
from . import _validate
from ._registry import register
from ._validate import empty_aligned, float_arrays, real_scalar

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
# Per-thread scratch and the worker pool (LiSA's fused FFT core, GELU)
# ---------------------------------------------------------------------------------------------------

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
