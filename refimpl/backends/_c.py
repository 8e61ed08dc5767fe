"""The C backend: validated wrappers around the cffi module ``refimpl._native._kernels``.

The compiled module is built from ckernels/ by build_ext.py when the package is installed (see
docs/backends.md).  It is loaded on first use, never at ``import refimpl``, so a missing or broken build
costs nothing until the C backend is asked for, and then :func:`refimpl.backends.available` says why.

Every call goes through the same steps: validate (refimpl.backends._validate: dtype, shapes,
contiguity; inputs copied to C-contiguous if needed, ``out`` refused if it is not usable as is), fill the
output with NaN, pass the buffers with ``ffi.from_buffer`` under the C type that matches the validated
dtype, and check the returned status.  The validation is each wrapper's own; the rest is
:func:`run_kernel` (with :func:`call_kernel` and :func:`workspace_for`).  The NaN fill means that an output element the kernel failed to
write cannot pass a comparison with the reference (unless the reference is NaN there too, which the
agreement tests avoid except where they test NaN propagation).

This module is the runtime: loading the compiled module (:func:`_load`, :func:`status`), the call of a
kernel (:func:`run_kernel`, :func:`call_kernel`, :func:`workspace_for`), the status check, the thread count (:func:`default_threads`) and the range safety net of the
range-checked kernels (:func:`range_stats`, the one-pass C scan of ckernels/scan.c; :func:`_outside_band`,
:func:`_below_band`, :func:`_poison`, :func:`_range_fallback`).  The wrappers
live in per-family modules next to it, each kernel registered with its predicate there:
``_c_depthwise.py`` (depthwise conv2d), ``_c_linear.py`` (the fused kernelized linear attention and the
kernels built on it: RALA, ELU + 1, the focused map, Castling-ViT's linear-angular attention),
``_c_softmax.py`` (windowed softmax attention), ``_c_elementwise.py`` (GELU), ``_c_lisa.py`` (LiSA's FFT core,
``"lisa_fft_core"``: scipy.fft's transforms, ckernels/lisa.c's spectral products and contraction, and beside them
its plain path ``lisa_fft_core_plain``); ``_c_plain.py`` holds the plain
scalar versions of the attention, feature-map and depthwise kernels (their specification, checked by
tests/test_kernels_plain.py; not registered).

Operations and signatures (each mirrors its NumPy twin; ``out=``/``workspace=`` are optional caller-owned
buffers, allocate them once with :func:`refimpl.backends.empty_aligned` /
:func:`refimpl.backends._c_linear.linear_attention_workspace` and reuse them across calls):

- ``"depthwise_conv2d"``: ``depthwise_conv2d(x, weight, bias, stride, pads, dilation=(1, 1), *, out=None)``
  (twin ``refimpl.layers._depthwise_conv2d_numpy``);
- ``"linear_attention"``: ``linear_attention(q, k, v, feature_map="relu", eps=0.0, eps_policy="add",
  clamp_min=None, p=config.FLATTEN_FOCUSING_FACTOR, *, out=None, workspace=None, threads=None)`` with
  q (B, h, N, d), k (B, h, M, d), v (B, h, M, e) -> (B, h, N, e); feature maps "relu", "elu1" and
  "focused" (FLatten's f_p(ReLU(x)) per row with focusing factor ``p``) (twin
  ``refimpl.attention.linear._linear_attention_numpy``; ckernels/linattn.c).  ``threads`` (default
  :func:`default_threads`) changes the speed only, never a bit.
- ``"reweighted_linear_attention"`` (RALA Eq. 2-4, linear order, no RoPE):
  ``reweighted_linear_attention(q, k, v, alpha, kernel="elu1", kv_scale=1.0, eps=0.0, *, out=None,
  workspace=None, threads=None)``, alpha (B, h, M) (twin ``refimpl.attention.rala_core.
  _reweighted_linear_attention_numpy``; the same kernel with key weights).
- ``"rala_alpha"`` (RALA Eq. 4): ``rala_alpha(q, k, global_query="q", kernel="elu1", scale=1.0, *,
  out=None, workspace=None, threads=None)``, q (B, h, N, d), k (B, h, M, d) -> alpha (B, h, M) (twin
  ``refimpl.attention.rala_core._rala_alpha_numpy``; ckernels/rala_body.h).
- ``"elu1_feature_map"``: ``elu1_feature_map(x, *, out=None)``, ELU(x) + 1 element-wise with the fused
  kernel's own code (twin ``refimpl.attention.linear._elu1_feature_map_numpy``, spec ``refimpl.attention.linear.
  feature_map(x, "elu1")``).
- ``"linear_angular_attention"`` (Castling-ViT Eq. 9): ``linear_angular_attention(q, k, v, constant="sum",
  normaliser="none", eps=config.CASTLING_QK_NORM_EPS, *, out=None, workspace=None, threads=None)``
  (twin ``refimpl.attention.angular_linear._linear_angular_attention_op``, spec ``refimpl.attention.angular.
  linear_angular_attention``; the same kernel with the unit-row feature map and Eq. 9's output).
- ``"window_softmax_attention"`` (Swin Eq. 4 per window): ``window_softmax_attention(q, k, v, scale,
  bias=None, mask=None, *, out=None, workspace=None, threads=None)`` with q (BW, h, n, d), k (BW, h, m, d),
  v (BW, h, m, e), bias (h, n, m) or (BW, h, n, m), mask bool (nW, n, m) with BW % nW == 0 (windows
  batch-major) (twin ``refimpl.attention.softmax._window_softmax_attention_numpy``).

Each kernel is registered with a ``supports`` predicate (dtype, shapes: which calls it takes; see
refimpl.backends.call), next to it in its family module.  These modules import nothing from
refimpl.attention, refimpl.layers or refimpl.models: the twins named above are reached through the
registry (``_registry.definition(op)``), which is how the range fallback answers with the NumPy definition.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from ._validate import empty_aligned, workspace_buffer

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


def _check_status(mod: Any, status: int, kernel: str) -> None:
    """Raise if a kernel returned a nonzero status: the wrappers validate every argument first, so a
    refusal by the C side's second line of defence is a bug in this module's validation."""
    if status != 0:
        msg = mod.ffi.string(mod.lib.refimpl_status_string(status)).decode()
        raise RuntimeError(f"C kernel {kernel} refused its arguments (status {status}: {msg}); this is a bug in "
                           f"refimpl.backends._c's validation")


def _ctype(dtype: np.dtype) -> str:
    return "double[]" if dtype == np.float64 else "float[]"


_BUFFER_TYPES = {np.dtype(np.float64): "double[]", np.dtype(np.float32): "float[]",
                 np.dtype(np.uint8): "unsigned char[]"}


def call_kernel(kernel: str, out: np.ndarray, *args: Any, workspace: np.ndarray | None = None) -> None:
    """Call ``refimpl_<kernel>_f64`` or ``_f32`` (by the dtype of ``out``) on ``(out, [workspace,] *args)`` and
    check its status (:func:`_check_status`).  ``out`` and ``workspace`` are passed writable; every array in
    ``args`` read-only, as ``double[]``, ``float[]`` or ``unsigned char[]`` by its dtype; None as NULL;
    anything else (sizes, options) as it is.  The arrays must already be validated (refimpl.backends.
    _validate: dtype, shape, C-contiguity, alignment): this only hands them over."""
    mod = _load()
    ffi = mod.ffi
    fn = getattr(mod.lib, f"refimpl_{kernel}_{'f64' if out.dtype == np.float64 else 'f32'}")

    def arg(a: Any) -> Any:
        if a is None:
            return ffi.NULL
        if isinstance(a, np.ndarray):
            return ffi.from_buffer(_BUFFER_TYPES[a.dtype], a)
        return a

    head = [ffi.from_buffer(_ctype(out.dtype), out, require_writable=True)]
    if workspace is not None:
        head.append(ffi.from_buffer(_ctype(workspace.dtype), workspace, require_writable=True))
    _check_status(mod, fn(*head, *map(arg, args)), f"refimpl_{kernel}")


def run_kernel(kernel: str, out: np.ndarray, *args: Any, workspace: np.ndarray | None = None, twin: Any = None,
               band: tuple = (), tiny: tuple = (), outside: Any = False) -> np.ndarray:
    """The steps every wrapper takes once its arguments are validated: with a ``twin`` (the NumPy
    definition, a function of no arguments), answer with it if an array of ``band`` is above the kernels'
    range (:func:`_outside_band`) or one of ``tiny`` below it (:func:`_below_band`: the arrays whose groups the
    definition scales up), or where the wrapper's own range test says so (``outside``: a bool, or a function
    of :func:`range_stats` answering a bool, e.g. refimpl.backends._c_linear.elu1_underflows); otherwise poison
    ``out`` (:func:`_poison`), run the kernel (:func:`call_kernel`) and, with a twin, replace the kernel's
    NaN/Inf by the definition's values (:func:`_range_fallback`).  Each array is scanned once
    (:func:`range_stats`) for all three tests.  Returns ``out``."""
    if twin is not None:
        seen: dict[int, tuple[float, float, float]] = {}

        def stats(a: np.ndarray) -> tuple[float, float, float]:
            if id(a) not in seen:
                seen[id(a)] = range_stats(a)
            return seen[id(a)]

        test = outside(stats) if callable(outside) else bool(outside)
        if test or _outside_band(*band, stats=stats) or _below_band(*tiny, stats=stats):
            out[...] = twin()
            return out
    _poison(out)  # an element the kernel does not write stays NaN (and is never "repaired" by the twin)
    call_kernel(kernel, out, *args, workspace=workspace)
    return _range_fallback(out, twin)


def workspace_for(workspace: Any, need: int, dtype: np.dtype, inputs: Any, first: str) -> np.ndarray:
    """A workspace of at least ``need`` elements of ``dtype``: the caller's (checked by
    refimpl.backends._validate.workspace_buffer against ``inputs``, its flat view) or a new aligned one."""
    if workspace is None:
        return empty_aligned(need, dtype)
    return workspace_buffer(workspace, dtype, need, inputs, first)


def default_threads() -> int:
    """Threads a C kernel uses when the call does not say: the CPUs this process may run on, capped at
    ``config.C_KERNEL_THREADS_MAX``."""
    import os

    from .. import config
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, int(config.C_KERNEL_THREADS_MAX)))


def _threads(threads: Any) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"argument 'threads': expected an integer >= 1 or None, got {threads!r}")
    return int(threads)


def range_stats_numpy(a: Any) -> tuple[float, float, float]:
    """The NumPy twin of the C range scan (ckernels/scan.c, :func:`range_stats`), its specification: of a
    float64 array, (max |x|, min |x| over the nonzero entries, min x), NaN entries taking no part; (0, +Inf,
    +Inf) where no entry is left.  Each value is one of the entries or its magnitude (no arithmetic); a zero
    minimum may be either zero (the order of the comparisons keeps one; nothing reads its sign)."""
    flat = np.asarray(a, dtype=np.float64).reshape(-1)
    kept = flat[~np.isnan(flat)]
    if kept.size == 0:
        return 0.0, np.inf, np.inf
    mag = np.abs(kept)
    nonzero = mag[mag > 0]
    return float(mag.max()), float(nonzero.min()) if nonzero.size else np.inf, float(kept.min())


def range_stats(a: np.ndarray) -> tuple[float, float, float]:
    """:func:`range_stats_numpy`'s three statistics of a float64 array in one pass of the C scan
    (``refimpl_range_scan_f64``, ckernels/scan.c: comparisons only, so the same values bit for bit) where the
    array is C-contiguous (the wrappers' validated buffers), else by the twin itself."""
    if a.dtype != np.float64 or not a.flags.c_contiguous:
        return range_stats_numpy(a)
    mod = _load()
    out = mod.ffi.new("double[3]")
    _check_status(mod, mod.lib.refimpl_range_scan_f64(out, mod.ffi.from_buffer("double[]", a), a.size),
                  "refimpl_range_scan")
    return out[0], out[1], out[2]


def _outside_band(*arrays: Any, stats: Any = range_stats) -> bool:
    """Whether a float64 array among ``arrays`` (None skipped) has an entry of magnitude above 2^B,
    B = config.RANGE_RESCALE_EXPONENT (or an infinite one): where the NumPy definitions rescale
    (numerics.pow2_exponent) and the kernels, which do not, may overflow.  NaN entries are not looked at: the
    kernel's NaN output is handled by :func:`_range_fallback`.  ``stats``: :func:`range_stats` or a cache of
    it."""
    edge = 2.0 ** config.RANGE_RESCALE_EXPONENT
    return any(a is not None and a.dtype == np.float64 and stats(a)[0] > edge for a in arrays)


def _below_band(*arrays: Any, stats: Any = range_stats) -> bool:
    """Whether a float64 array among ``arrays`` (None skipped) has a nonzero entry of magnitude below 2^-B,
    B = config.RANGE_RESCALE_EXPONENT: the arrays where the NumPy definitions of linear attention and RALA's core
    scale a group (a row of phi(Q), a head's phi(K), a column of V) whose largest magnitude is below 2^-B up by
    an exact power of two (numerics.pow2_exponent with ``scale_up``), and the kernels, which do not, lose bits
    to underflow.  Such a group has such an entry (for ReLU and the focused map, a feature below 2^-B is an
    input below 2^-B), so none is missed; an array with one tiny entry beside larger ones is flagged too and
    then simply gets the definition's result.  (ELU + 1 rows of inputs below -177, whose features exp(x) are
    below 2^-256, are the kernel's: features down to 2^-1022 are normal numbers, and a row whose products
    underflow to a zero normaliser is NaN, which :func:`_range_fallback` answers with the definition.)  float32
    holds nothing below 2^-149, so only float64 is looked at.  ``stats``: :func:`range_stats` or a cache of
    it."""
    edge = 2.0 ** -config.RANGE_RESCALE_EXPONENT
    return any(a is not None and a.dtype == np.float64 and stats(a)[1] < edge for a in arrays)


#: The poison of the range-checked kernels' outputs: a quiet NaN with a payload no arithmetic produces from
#: finite operands, so that :func:`_range_fallback` replaces the kernel's own NaN and Inf (0/0, overflow) but
#: never an element the kernel failed to write.
_POISON_BITS = np.uint64(0x7FF8_0000_DEAD_BEEF)


def _poison(result: np.ndarray) -> None:
    if result.dtype == np.float64:
        result.view(np.uint64).fill(_POISON_BITS)
    else:
        result.fill(np.nan)


def _range_fallback(result: np.ndarray, twin: Any) -> np.ndarray:
    """``result`` with (float64 only, ``twin`` given) every NaN or Inf the kernel returned replaced by the
    NumPy definition's value there (``twin()``, computed only then): the definition rescales, so it is
    finite wherever the exact result is, and NaN where the kernel's NaN is the mathematics' (a zero
    normaliser), so both backends give the same pattern; the kernel's finite entries keep their bits (each
    output row, or each head's alpha, is computed independently of the others).  One summation pass over
    the output on the common path."""
    if twin is not None and result.dtype == np.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            total = float(np.sum(result))       # NaN or Inf iff an entry is (or, rarely, the sum overflows)
        if not np.isfinite(total):
            bad = ~np.isfinite(result) & (result.view(np.uint64) != _POISON_BITS)
            if bad.any():
                result[bad] = twin()[bad]
    return result
