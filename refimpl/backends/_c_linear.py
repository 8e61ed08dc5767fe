"""C fused kernelized linear attention (ckernels/linattn.c) and the kernels built on it.

- ``"linear_attention"`` (L2ViT, FLatten, Katharopoulos et al.): twin
  ``refimpl.attention.linear._linear_attention_numpy``;
- ``"reweighted_linear_attention"`` and ``"rala_alpha"`` (RALA Eq. 2-4): twins in
  ``refimpl.attention.rala_core``;
- ``"elu1_feature_map"`` and the unregistered :func:`focused_feature_map` (the fused kernel's staging code);
- ``"linear_angular_attention"`` (Castling-ViT Eq. 9): twin
  ``refimpl.attention.angular_linear._linear_angular_attention_op``.

Signatures are listed in refimpl.backends._c, whose runtime (module loading, status check, threads, the
range fallback) these wrappers use.  This module imports nothing from refimpl.attention, refimpl.layers
or refimpl.models: the twins are reached through the registry (``_registry.definition(op)``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import config
from . import _validate
from ._c import _load, _threads, range_stats, run_kernel, workspace_for
from ._registry import definition, register
from ._validate import empty_aligned, float_arrays, real_scalar


# ---------------------------------------------------------------------------------------------------
# Fused kernelized linear attention (ckernels/linattn.c)
# ---------------------------------------------------------------------------------------------------

#: Feature maps of the fused kernel and their codes (REFIMPL_LA_MAP_* in ckernels/refimpl_kernels.h); defined
#: with the option checks in refimpl.backends._validate.
LINEAR_ATTENTION_MAPS = _validate.LINEAR_ATTENTION_MAPS


def linear_attention_workspace_size(B: int, h: int, M: int, d: int, e: int, threads: int | None = None) -> int:
    """Elements of the workspace the fused linear attention needs: per head, one partial KV (d x e) and
    key sum (d) for each of its key chunks (ckernels/linattn.c: at most 16 chunks, a function of M only),
    plus per thread a staging buffer of 64 tokens' feature maps, denominators and (with a V scale) values
    (64 (d + e) + 64).  O(B h d e + threads (d + e)), independent of N."""
    lib = _load().lib
    n = lib.refimpl_linear_attention_workspace(B * h, M, d, e, _threads(threads))
    if n < 0:
        raise ValueError(f"arguments 'q'/'k'/'v': sizes B={B}, h={h}, M={M}, d={d}, e={e} overflow the "
                         f"workspace size")
    return int(n)


def linear_attention_workspace(B: int, h: int, M: int, d: int, e: int, dtype: Any = np.float64,
                               threads: int | None = None) -> np.ndarray:
    """A 64-byte aligned workspace for :func:`linear_attention` (allocate once, reuse across calls)."""
    return empty_aligned(linear_attention_workspace_size(B, h, M, d, e, threads), dtype)


def _linear_attention_supported(q: Any, k: Any, v: Any, *args: Any, v_scale: Any = None,
                                v_scale_mode: str = "divide", **_: Any) -> bool:
    """One float32/float64 dtype for q, k, v (and ``v_scale``, which must have 1 or h values, with mode
    "divide" or "multiply")."""
    if v_scale is None:
        return float_arrays(q, k, v)
    return (float_arrays(q, k, v, v_scale) and getattr(q, "ndim", 0) == 4 and v_scale.size in (1, q.shape[1])
            and v_scale_mode in ("divide", "multiply"))


@register("linear_attention", "c", supports=_linear_attention_supported)
def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, feature_map: str = "relu",
                     eps: float = 0.0, eps_policy: str = "add", clamp_min: float | None = None,
                     p: float = config.FLATTEN_FOCUSING_FACTOR, *, out: np.ndarray | None = None,
                     workspace: np.ndarray | None = None, threads: int | None = None, v_scale: Any = None,
                     v_scale_mode: str = "divide") -> np.ndarray:
    """Fused kernelized linear attention forward in C: the C twin of
    ``refimpl.attention.linear._linear_attention_numpy``.

    O_i = phi(Q_i) (sum_j phi(K_j)^T V_j) / den_eff_i,  den_i = phi(Q_i) . sum_j phi(K_j)

    (L2ViT Eq. 2-4, with the clamp of Appendix 8; FLatten Eq. 1-6; Katharopoulos et al. 2020 Eq. 7 for
    ELU + 1), den_eff = max(den, clamp_min) if clamp_min is given, then den + eps ("add", skipped for
    eps = 0) or max(den, eps) ("clamp").  The "focused" map is FLatten's phi_p(x) = f_p(ReLU(x)) per row
    of d features in the max-scaled form of ``refimpl.attention.focused.focused_feature_map(x, p,
    power_scaling="max")``, with r**p formed by p - 1 multiplications for an integer p <= 6
    (``config.ELEMENTARY_FUNCTION_ULPS + 2``, the largest p for which that stays inside the error model's
    budget for pow) and by libm pow otherwise (docs/kernels_c.md).  Two passes over the tokens (KV and key sums, then outputs), the
    N x M matrix never formed; computed in the dtype of q with a fixed summation order (ckernels/
    linattn_body.h), so the result is bitwise reproducible across runs, thread counts and vector levels,
    and lies within ``refimpl.attention.linear.linear_attention_bound`` of the float64 definition.

    Parameters
    ----------
    q : (B, h, N, d) float32 or float64.
    k : (B, h, M, d), same dtype.
    v : (B, h, M, e), same dtype.
    feature_map : "relu" (max(x, 0)), "elu1" (x + 1 for x > 0, exp(x) otherwise) or "focused"
        (f_p(ReLU(x)) per row, FLatten Eq. 6).
    eps : float, eps_policy : "add" | "clamp", clamp_min : float or None - the normaliser policy of
        ``refimpl.attention.linear.apply_normaliser`` (applied in the dtype of q).
    p : real, finite, >= 1: the focusing factor of the "focused" map (default
        ``config.FLATTEN_FOCUSING_FACTOR`` = 3); validated for every map, used only by "focused".
    out : optional (B, h, N, e) C-contiguous aligned writeable array of the same dtype, written in place
        and returned; allocated 64-byte aligned if None.
    workspace : optional C-contiguous aligned writeable array of the same dtype with at least
        :func:`linear_attention_workspace_size` elements (see :func:`linear_attention_workspace`);
        allocated if None.
    threads : int >= 1 or None (:func:`default_threads`).  Speed only: the result is the same bits.
    v_scale : None, or an array of q's dtype with 1 or h values (any shape of that size, e.g. L2ViT's
        (1, h, 1, 1) gain): the kernel then uses V / s ("divide") or V * s ("multiply") per head in place
        of V, each element rounded once as the value rows are staged in pass 1 - the same rounded operands
        as ``v_eff = v / s`` (or ``v * s``) computed beforehand, without that (B, h, M, e) temporary.  The
        NumPy definition takes the same keyword (and forms v_eff first); the kernel's ``supports`` predicate
        takes it for 1 or h values of q's dtype.
    v_scale_mode : "divide" | "multiply".

    Returns
    -------
    (B, h, N, e) array of the dtype of q.

    Raises
    ------
    TypeError for dtypes other than float32/float64 or mixed (v_scale included), or a non-real ``p``;
    ValueError for inconsistent shapes, an unknown feature map / eps policy / v_scale_mode, ``p`` not
    finite or < 1, a v_scale with neither 1 nor h values, bad threads, an unusable ``out``/``workspace``;
    ImportError if the compiled module is missing; RuntimeError if the kernel refuses its arguments (a
    validation bug).

    Range: the kernel computes without rescaling.  For float64 inputs whose largest magnitude exceeds
    2^``config.RANGE_RESCALE_EXPONENT`` (1e150-sized operands), with a nonzero entry below
    2^-``config.RANGE_RESCALE_EXPONENT`` (tiny and subnormal operands, whose groups the definition scales up),
    with ELU + 1 features that may underflow (:func:`elu1_underflows`: inputs below about -707, whose rows the
    definition recomputes from log-features), or where the result has a NaN or Inf, the wrapper returns the NumPy definition's result instead (it
    rescales exactly by powers of two, so it returns the finite result where one exists, and the same NaN as
    the kernel for a dead query row): the same finite/non-finite pattern as NumPy on every input, at the cost
    of one dot product and one pass of |x| per input and one sum over the output on the common path.  float32 keeps the
    kernel's own float32 range (as the naive float32 run of the definition does).

    References
    ----------
    L2ViT Eq. 2-4 and Appendix 8; FLatten Eq. 1-6; Katharopoulos et al. (2020), Eq. 2-7.
    """
    def twin() -> np.ndarray:     # the NumPy definition (it applies v_scale as v / s or v * s first)
        return definition("linear_attention")(q, k, v, feature_map, eps, eps_policy, clamp_min, p,
                                              v_scale=v_scale, v_scale_mode=v_scale_mode)

    return _linear_attention_call(q, k, v, None, feature_map, eps, eps_policy, clamp_min, 1.0, out, workspace,
                                  threads, p, v_scale, v_scale_mode, twin=twin)


#: The C "linear_attention" takes the keywords ``v_scale=`` / ``v_scale_mode=`` (L2ViT's per-head gain applied
#: inside the kernel; so does the NumPy definition).  Informational: the predicate registered with the kernel
#: is what refimpl.backends.call consults.
linear_attention.SUPPORTS_V_SCALE = True  # type: ignore[attr-defined]


#: ELU + 1 features exp(x) below e 2^-1022 (x below this) may be subnormal: the definition recomputes their rows
#: from log-features (refimpl.attention.normaliser_range.underflow_rows), the kernel would lose their bits.
_EXP_TINY = math.log(2.0 ** np.finfo(np.float64).minexp) + 1.0
#: Products of two ELU + 1 features with log-sum below this may make a normaliser below e 2^-960, where the
#: definition recomputes the row too.
_EXP_SMALL = math.log(2.0 ** -960) + 1.0


def elu1_underflows(q: np.ndarray, k: np.ndarray, key_weight: Any, feature_map: str, stats: Any = None) -> bool:
    """Whether float64 ELU + 1 features (``feature_map`` "elu1"; key features alpha_j kappa(K_j) with
    ``key_weight``) may underflow where the NumPy definition recomputes rows from log-features: a lower bound
    of log phi (min(min x, 0), and log min alpha) below log(e 2^-1022), or of a product phi(Q_i)_c phi(K_j)_c
    below e 2^-960.  Then the wrappers answer with the definition (the kernel computes such rows, finite but
    with the subnormal features' few bits, or NaN).  The minima are :func:`refimpl.backends._c.range_stats`'
    (NaN entries take no part), through ``stats`` where run_kernel passes its cache."""
    if feature_map != "elu1" or q.dtype != np.float64:
        return False
    least = (lambda a: (stats or range_stats)(a)[2])     # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        lq = min(least(q), 0.0)
        lk = min(least(k), 0.0) + (0.0 if key_weight is None else float(np.log(least(key_weight))))
    return lq < _EXP_TINY or lk < _EXP_TINY or lq + lk < _EXP_SMALL


def _linear_attention_call(q: Any, k: Any, v: Any, key_weight: Any, feature_map: str, eps: Any, eps_policy: str,
                           clamp_min: Any, kv_scale: float, out: Any, workspace: Any, threads: Any,
                           p: Any = config.FLATTEN_FOCUSING_FACTOR, v_scale: Any = None,
                           v_scale_mode: str = "divide", twin: Any = None) -> np.ndarray:
    """Validate (refimpl.backends._validate.linear_attention_options, the checks shared with the plain
    kernel), then run refimpl_linear_attention_f32/_f64 (refimpl.backends._c.run_kernel: poison, call,
    status); ``twin()`` (the NumPy definition) answers instead where the range check says so."""
    _load()  # ImportError before any validation when the compiled module is missing
    o = _validate.linear_attention_options(q, k, v, out, key_weight, feature_map, eps, eps_policy, clamp_min, p,
                                           v_scale, v_scale_mode,
                                           map_note=" (other maps run on the NumPy definition)",
                                           threads_check=lambda: _threads(threads))
    a, kw, vs, nthreads = o.arrays, o.key_weight, o.v_scale, o.threads
    sz = a.sizes
    dt = a.q.dtype
    need = linear_attention_workspace_size(sz["B"], sz["h"], sz["M"], sz["d"], sz["e"], nthreads)
    ws = workspace_for(workspace, need, dt, (("q", q), ("k", k), ("v", v), ("out", out), ("alpha", key_weight)), "q")
    result = a.out if a.out is not None else empty_aligned(a.out_shape, dt)
    options = _load().ffi.new("struct refimpl_la_options *", o.c_options(kv_scale))
    return run_kernel("linear_attention", result, a.q, a.k, a.v, kw, vs, options, sz["B"] * sz["h"], sz["N"],
                      sz["M"], sz["d"], sz["e"], ws.size, nthreads, workspace=ws, twin=twin,
                      band=(a.q, a.k, a.v, kw, vs), tiny=(a.q, a.k, a.v, vs),
                      outside=lambda st: elu1_underflows(a.q, a.k, kw, feature_map, st))


def _reweighted_supported(q: Any, k: Any, v: Any, alpha: Any, *args: Any, **_: Any) -> bool:
    """One float32/float64 dtype for q, k, v and alpha."""
    return float_arrays(q, k, v, alpha)


@register("reweighted_linear_attention", "c", supports=_reweighted_supported)
def reweighted_linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                                kernel: str = "elu1", kv_scale: float = 1.0, eps: float = 0.0, *,
                                out: np.ndarray | None = None, workspace: np.ndarray | None = None,
                                threads: int | None = None) -> np.ndarray:
    """RALA's reweighted linear attention core in C (linear order, no RoPE): the C twin of
    ``refimpl.attention.rala_core._reweighted_linear_attention_numpy``.

    B = s sum_j alpha_j kappa(K_j)^T V_j (Eq. 3),  O_i = kappa(Q_i) B / (kappa(Q_i) . s sum_j alpha_j kappa(K_j)
    + eps)  (Eq. 2 normaliser), with s = ``kv_scale`` (1 for token_scaling "sum", 1/N for "mean").

    The fused kernel of :func:`linear_attention` with key weights alpha_j multiplying kappa(K_j) (one rounded
    product, as the definition's ``alpha[..., None] * kappa_k``) and s applied once after the sums; the same
    fixed order, so bitwise reproducible across runs, thread counts and vector levels, and within
    ``refimpl.attention.rala.rala_core_bound`` of the float64 definition.

    Parameters
    ----------
    q, k : (B, h, N, d) (M = N for RALA; M != N allowed), v : (B, h, M, e), alpha : (B, h, M), one dtype
        (float32 or float64).  kernel : "elu1" or "relu" (kappa).  kv_scale : float.  eps : float >= 0,
        added to the normaliser when nonzero.  out, workspace, threads : as :func:`linear_attention`.

    Returns
    -------
    (B, h, N, e) array of the dtype of q.

    References
    ----------
    RALA (Fan et al., "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025) Eq. 2-4.

    Range: as :func:`linear_attention` (float64 inputs above 2^``config.RANGE_RESCALE_EXPONENT`` or with a
    nonzero entry below 2^-``config.RANGE_RESCALE_EXPONENT``, or a NaN/Inf result, are answered by the NumPy
    definition, which rescales exactly).
    """
    if kernel not in ("elu1", "relu"):
        raise ValueError(f"argument 'kernel': expected 'elu1' or 'relu', got {kernel!r}")

    def twin() -> np.ndarray:
        return definition("reweighted_linear_attention")(q, k, v, alpha, kernel, kv_scale, eps)

    return _linear_attention_call(q, k, v, alpha, kernel, eps, "add", None, kv_scale, out, workspace, threads,
                                  twin=twin)


def rala_alpha_workspace_size(B: int, h: int, N: int, M: int, d: int, threads: int | None = None) -> int:
    """Elements of the workspace of :func:`rala_alpha`: per head, the partial sums of Q over its token
    chunks (at most 16 x d), Q_g (d) and two values per key chunk; per thread a staging buffer of 64 tokens'
    kappa (64 d).  O(B h d + threads d), independent of N and M."""
    lib = _load().lib
    n = lib.refimpl_rala_alpha_workspace(B * h, N, M, d, _threads(threads))
    if n < 0:
        raise ValueError(f"arguments 'q'/'k': sizes B={B}, h={h}, N={N}, M={M}, d={d} overflow the workspace size")
    return int(n)


_RALA_GLOBAL_QUERIES = {"q": 0, "kappa_q": 1}


def _rala_alpha_supported(q: Any, k: Any, *args: Any, **_: Any) -> bool:
    """One float32/float64 dtype for q and k."""
    return float_arrays(q, k)


@register("rala_alpha", "c", supports=_rala_alpha_supported)
def rala_alpha(q: np.ndarray, k: np.ndarray, global_query: str = "q", kernel: str = "elu1", scale: float = 1.0,
               *, out: np.ndarray | None = None, workspace: np.ndarray | None = None,
               threads: int | None = None) -> np.ndarray:
    """RALA's reweighting coefficients in C: the C twin of ``refimpl.attention.rala_core._rala_alpha_numpy``.

    Q_g = (sum_i x_i) / N with x = Q (global_query "q") or kappa(Q) ("kappa_q"); l_j = scale (Q_g . kappa(K_j));
    alpha_j = M (exp(l_j - max l) / sum_j' exp(l_j' - max l))   (RALA Eq. 4)

    with the definition's operations (the mean as a sum then one division by N; the logits' product by
    scale; max subtraction; the quotient, then the product by M), each sum in a fixed order of the kernel's
    own (ckernels/rala_body.h), the exp of the fused kernel (within ``config.ELEMENTARY_FUNCTION_ULPS``),
    (head, token chunk) work items on ``threads`` threads: bitwise reproducible across runs, thread counts
    and vector levels, within ``refimpl.attention.rala.rala_core_bound`` of the float64 definition when
    fed to :func:`reweighted_linear_attention`.  NaN anywhere in a head's logits makes the head's alpha NaN
    (np.max propagates it), as in the definition.

    Parameters
    ----------
    q : (B, h, N, d) float32 or float64.  k : (B, h, M, d), same dtype.
    global_query : "q" | "kappa_q".  kernel : "elu1" | "relu" (kappa).  scale : real number.
    out : optional (B, h, M) C-contiguous aligned writeable array of q's dtype, written in place and
        returned; allocated 64-byte aligned if None.
    workspace : optional C-contiguous aligned writeable array of q's dtype with at least
        :func:`rala_alpha_workspace_size` elements; allocated if None.
    threads : int >= 1 or None (:func:`default_threads`).  Speed only: the result is the same bits.

    Returns
    -------
    (B, h, M) array of q's dtype.

    Raises
    ------
    TypeError for dtypes other than float32/float64 or mixed, or a non-real scale; ValueError for
    inconsistent shapes, an unknown global query or kernel, bad threads, an unusable ``out``/``workspace``.

    Range: as :func:`linear_attention`: float64 inputs above 2^``config.RANGE_RESCALE_EXPONENT``, or a
    NaN/Inf result, are answered by the NumPy definition (which rescales exactly by powers of two, so
    1e150-sized q and k give the saturated softmax, not NaN); one dot product per input and one sum over
    alpha on the common path.

    References
    ----------
    RALA (Fan et al., "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025) Eq. 4.
    """
    _load()  # ImportError before any validation when the compiled module is missing
    if global_query not in _RALA_GLOBAL_QUERIES:
        raise ValueError(f"argument 'global_query': expected 'q' or 'kappa_q', got {global_query!r}")
    if kernel not in ("elu1", "relu"):
        raise ValueError(f"argument 'kernel': expected 'elu1' or 'relu', got {kernel!r}")
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"argument 'scale': expected a real number, got {type(scale).__name__}")
    nthreads = _threads(threads)
    qa = _validate._array(q, "q", "C")
    ka = _validate._array(k, "k", "C")
    dt = qa.dtype
    if ka.dtype != dt:
        raise TypeError(f"argument 'k': expected dtype {dt} (the dtype of 'q'), got {ka.dtype}; the C kernel "
                        f"does not mix precisions")
    for name, a, spec in (("q", qa, "(B, h, N, d)"), ("k", ka, "(B, h, M, d)")):
        if a.ndim != 4 or min(a.shape) < 1:
            raise ValueError(f"argument '{name}': expected a non-empty 4-d array of shape {spec}, got shape "
                             f"{a.shape}")
    b_, h, n, d = qa.shape
    if ka.shape[:2] != (b_, h) or ka.shape[3] != d:
        raise ValueError(f"argument 'k': expected shape ({b_}, {h}, M, {d}) for q of shape {qa.shape}, got "
                         f"{ka.shape}")
    m = ka.shape[2]
    if out is not None:
        _validate._check_out(out, dt, (b_, h, m), (("q", qa), ("k", ka)), "q")
    need = rala_alpha_workspace_size(b_, h, n, m, d, nthreads)
    ws = workspace_for(workspace, need, dt, (("q", qa), ("k", ka), ("out", out)), "q")
    qa, ka = _validate._contiguous(qa), _validate._contiguous(ka)
    result = out if out is not None else empty_aligned((b_, h, m), dt)

    def twin() -> np.ndarray:
        return definition("rala_alpha")(qa, ka, global_query, kernel, scale)

    return run_kernel("rala_alpha", result, qa, ka, LINEAR_ATTENTION_MAPS[kernel], _RALA_GLOBAL_QUERIES[global_query],
                      float(scale), b_ * h, n, m, d, ws.size, nthreads, workspace=ws, twin=twin, band=(qa, ka))


def _elu1_supported(x: Any, *, out: Any = None) -> bool:
    """The calls the C map takes through ``backends.call``: a non-empty float32 or float64 array (others take
    the NumPy definition; a direct call still refuses them by name)."""
    return isinstance(x, np.ndarray) and x.size > 0 and x.dtype in (np.float32, np.float64)


@register("elu1_feature_map", "c", supports=_elu1_supported)
def elu1_feature_map(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """The ELU + 1 feature map in C: the C twin of ``refimpl.attention.linear._elu1_feature_map_numpy`` (spec:
    ``refimpl.attention.linear.feature_map(x, "elu1")``).

    phi(x) = ELU(x) + 1 = x + 1 for x > 0, exp(x) otherwise, element-wise, with the fused kernel's own
    staging code (ckernels/linattn_body.h): x + 1 rounded once (the definition's bits), exp by the kernel's
    vector exp (at most 1.14 ulp measured, docs/kernels_c.md; the error model assumes
    ``config.ELEMENTARY_FUNCTION_ULPS``), libm exp below its range and for NaN, so NaN and +-inf map as
    in the definition.  (RALA's alpha, Eq. 4, used it for kappa(K) until operation "rala_alpha" took over
    the whole of Eq. 4; the map stays exposed for callers that need kappa outside a kernel.)

    Parameters
    ----------
    x : float32 or float64 array, any non-empty shape.
    out : optional array of x's shape and dtype, C-contiguous, aligned, writeable, sharing no memory with
        x; written in place and returned (allocated 64-byte aligned if None).

    Returns
    -------
    Array of x's shape and dtype.

    Raises
    ------
    TypeError for a dtype other than float32/float64; ValueError for an empty x or an unusable ``out``.

    References
    ----------
    Katharopoulos et al. (2020) Eq. 7; RALA (Fan et al., CVPR 2025) Sec. 3.2 (kappa) and Eq. 4.
    """
    _load()  # ImportError before any validation when the compiled module is missing
    a = _validate._array(x, "x", "C")
    if a.size < 1:
        raise ValueError(f"argument 'x': expected a non-empty array, got shape {a.shape}")
    if out is not None:
        _validate._check_out(out, a.dtype, a.shape, (("x", a),), "x")
    a = _validate._contiguous(a)
    result = out if out is not None else empty_aligned(a.shape, a.dtype)
    return run_kernel("elu1_feature_map", result, a, a.size)


def focused_feature_map(x: np.ndarray, p: float = config.FLATTEN_FOCUSING_FACTOR, *, out: np.ndarray | None = None) -> np.ndarray:
    """FLatten's focused feature map phi_p(x) = f_p(ReLU(x)) along the last axis, in C, with the fused
    kernel's own staging code (the map inside :func:`linear_attention` with ``feature_map="focused"``, the
    same bits); spec ``refimpl.attention.focused.focused_feature_map(x, p, power_scaling="max")``.

    Per row of d features: a = ReLU(x) (NaN stays NaN), m = max a, r = a / m, ||a|| = m sqrt(sum r^2),
    t = r**p (p - 1 multiplications for an integer p <= 6, else pow), f = ||a|| (t / ||t||); f = 0 for a
    row without a positive entry; a NaN or +Inf anywhere makes the row NaN (as the reference).  Not a
    registered operation (focused.focused_function dispatches to the Numba kernel "focused_function");
    used by the tests to check the kernel's map alone, within ``focused.focused_function_bound``.

    Parameters
    ----------
    x : float32 or float64 array (..., d), any sign, non-empty.
    p : real, finite, >= 1 (default ``config.FLATTEN_FOCUSING_FACTOR``).
    out : optional array of x's shape and dtype, C-contiguous, aligned, writeable, sharing no memory with
        x; written in place and returned (allocated 64-byte aligned if None).

    Returns
    -------
    Array of x's shape and dtype.

    References
    ----------
    FLatten (Han et al., ICCV 2023) Eq. 5-6, Appendix Eq. 20-21 (the max-normalised form).
    """
    _load()  # ImportError before any validation when the compiled module is missing
    power = _validate.check_focusing_factor(p)
    a = _validate._array(x, "x", "C")
    if a.size < 1 or a.ndim < 1:
        raise ValueError(f"argument 'x': expected a non-empty array (..., d), got shape {a.shape}")
    if out is not None:
        _validate._check_out(out, a.dtype, a.shape, (("x", a),), "x")
    a = _validate._contiguous(a)
    result = out if out is not None else empty_aligned(a.shape, a.dtype)
    return run_kernel("focused_feature_map", result, a, a.size // a.shape[-1], a.shape[-1], power)


def _linear_angular_supported(q: Any, k: Any, v: Any, constant: str = "sum", normaliser: str = "none",
                              eps: Any = config.CASTLING_QK_NORM_EPS, **_: Any) -> bool:
    """One float32/float64 dtype for q, k, v; a real eps >= 0; M = N for constant "own"."""
    return (float_arrays(q, k, v) and real_scalar(eps) and eps >= 0
            and (constant == "sum" or (getattr(q, "ndim", 0) == getattr(k, "ndim", 0) == 4
                                       and q.shape[2] == k.shape[2])))


@register("linear_angular_attention", "c", supports=_linear_angular_supported)
def linear_angular_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, constant: str = "sum",
                             normaliser: str = "none", eps: float = 1e-12, *, out: np.ndarray | None = None,
                             workspace: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """Castling-ViT's linear-angular attention (Eq. 9) in C: the C twin of
    ``refimpl.attention.angular_linear._linear_angular_attention_op`` (spec: ``refimpl.attention.angular.
    linear_angular_attention`` with policy "clamp", arithmetic "scaled").

    H_i = C_i + (1/pi) Q^_i (sum_j K^_j^T V_j),  Q^ = q / max(||q||, eps) row-wise (||q|| = m ||q/m||,
    m = max|q|), C_i = 1/2 sum_j V_j ("sum") or 1/2 V_i ("own"); "similarity_sum" divides by
    M/2 + (1/pi) Q^_i . sum_j K^_j.  The fused kernel of :func:`linear_attention` with the unit-row feature
    map; same fixed order, so bitwise reproducible across runs, thread counts and vector levels.

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e) : one dtype, float32 or float64 (M = N for "own").
    constant : "sum" | "own".  normaliser : "none" | "similarity_sum".  eps : float >= 0 (default
        config.CASTLING_QK_NORM_EPS).  out, workspace, threads : as :func:`linear_attention`.

    Returns
    -------
    (B, h, N, e) array of the dtype of q.

    References
    ----------
    Castling-ViT (You et al., CVPR 2023) Eq. 8-9.
    """
    _load()  # ImportError before any validation when the compiled module is missing
    if constant not in ("sum", "own"):
        raise ValueError(f"argument 'constant': expected 'sum' or 'own', got {constant!r}")
    if normaliser not in ("none", "similarity_sum"):
        raise ValueError(f"argument 'normaliser': the C kernel implements 'none' and 'similarity_sum', got "
                         f"{normaliser!r} (angular.linear_angular_attention computes 'output_l2')")
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)) or eps < 0:
        raise ValueError(f"argument 'eps': expected a real number >= 0, got {eps!r}")
    nthreads = _threads(threads)
    a = _validate.linear_attention_args(q, k, v, out, "C")
    sz = a.sizes
    if constant == "own" and sz["M"] != sz["N"]:
        raise ValueError(f"argument 'v': constant='own' needs as many values as queries, got N = {sz['N']} "
                         f"queries and M = {sz['M']} values (v shape {np.shape(v)})")
    dt = a.q.dtype
    need = linear_attention_workspace_size(sz["B"], sz["h"], sz["M"], sz["d"], sz["e"], nthreads)
    ws = workspace_for(workspace, need, dt, (("q", q), ("k", k), ("v", v), ("out", out)), "q")
    result = a.out if a.out is not None else empty_aligned(a.out_shape, dt)
    return run_kernel("linear_angular", result, a.q, a.k, a.v, float(eps), 1 if constant == "own" else 0,
                      1 if normaliser == "similarity_sum" else 0, sz["B"] * sz["h"], sz["N"], sz["M"], sz["d"],
                      sz["e"], ws.size, nthreads, workspace=ws)
