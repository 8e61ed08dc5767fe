"""Generic kernelized linear attention, both association orders, with its error model.

Shapes (per head; the head split is the caller's business):
    B batch, h heads, N query tokens, M key/value tokens, d query/key head dim, e value head dim.
    q : (B, h, N, d), k : (B, h, M, d), v : (B, h, M, e)  -> output (B, h, N, e).

The mechanism (L2ViT Eq. 2-4; FLatten Eq. 1-4; Katharopoulos et al. 2020): with a feature map phi,

    O_i = sum_j [phi(Q_i) . phi(K_j)] V_j / sum_j [phi(Q_i) . phi(K_j)]                      (quadratic order)
        = phi(Q_i) (sum_j phi(K_j)^T V_j) / (phi(Q_i) . sum_j phi(K_j))                      (linear order)

The two orders are equal in exact arithmetic (associativity of the matrix product); in floating point
they differ by rounding only, which :func:`linear_attention_bound` bounds.  The normaliser policy is
explicit: ``clamp_min`` first (den -> max(den, clamp_min), L2ViT Appendix 8, Table 10), then ``eps``
("add": den + eps, "clamp": max(den, eps)).

Contents, top to bottom: the feature maps and their error coefficients (:mod:`refimpl.attention.linear_maps`,
re-exported here); the attention core on feature maps
already applied (:func:`kernelized_attention`, usable with any phi, e.g. FLatten's focused map);
:func:`linear_attention` (feature map + core); the error bounds.  The range safety of the core (docs/guarantees.md:
the normaliser's constants scaled with it, the rows whose normaliser underflows recomputed from log-features) is
:mod:`refimpl.attention.normaliser_range`, shared with RALA's core.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import backends, config, feature_maps, numerics, validation
from ..errors import ArgumentError
from .linear_maps import (_POSITIVE_MAPS, FEATURE_MAPS, NON_NEGATIVE_MAPS, _map_and_error,  # noqa: F401
                          feature_map, feature_map_error)
from .normaliser_range import (apply_policy, log_error, log_pair, normalised_up, normaliser_scaled, quotient,
                               rebalance_factor, rebalanced_output, scaling_exponents, underflow_rows, unscaled)

__all__ = [
    "FEATURE_MAPS", "NON_NEGATIVE_MAPS", "feature_map", "feature_map_error", "apply_normaliser",
    "kernelized_attention", "linear_attention",
    "kernelized_attention_bound", "linear_attention_bound",
]

# ===================================================================================================
# The attention core (feature maps already applied)
# ===================================================================================================

_ORDERS = ("linear", "quadratic")
_EPS_POLICIES = ("add", "clamp")


def _eta_times(count: np.ndarray | float, dtype: Any) -> np.ndarray:
    """count * eta_T (eta_T = half the smallest subnormal of T, Higham eq. 2.8), formed as
    (count * tiny) / 2 so that float64's eta = 2^-1075 (not representable) does not round to 0."""
    name = str(np.dtype(dtype)) if str(dtype) != "bfloat16" else "bfloat16"
    return np.asarray(count, dtype=np.float64) * config.FORMAT_MIN_SUBNORMAL[name.replace("torch.", "")] / 2.0


def _check_policy(order: str | None, eps: float, eps_policy: str, clamp_min: float | None) -> None:
    if order is not None and order not in _ORDERS:
        raise ArgumentError(f"argument 'order': expected 'linear' or 'quadratic', got {order!r}")
    if eps_policy not in _EPS_POLICIES:
        raise ArgumentError(f"argument 'eps_policy': expected 'add' or 'clamp', got {eps_policy!r}")
    validation.check_eps(eps, "eps")                       # finite, >= 0
    if clamp_min is not None:
        validation.check_real(clamp_min, "clamp_min", minimum=0.0)   # finite, >= 0 (L2ViT's C_min)


def _guard(elements: int, max_elements: int | None, what: str) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if elements > limit:
        raise ArgumentError(
            f"{what}: the N x M attention matrix would have B*h*N*M = {elements} elements, above "
            f"max_elements = {limit} (config.QUADRATIC_MAX_ELEMENTS); use order='linear' "
            f"(refimpl.attention.linear.linear_attention / kernelized_attention), which never forms it, "
            f"and do not request the 'attn' tap")


def _wants_attn(taps: dict | None) -> bool:
    return validation.check_taps(taps) is not None and bool(taps.get("want_attn", False))


def apply_normaliser(den: np.ndarray, *, eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                     clamp_min: float | None = None) -> np.ndarray:
    """The normaliser policy: den -> max(den, clamp_min) (if given), then den + eps ("add") or
    max(den, eps) ("clamp").  ``np.maximum`` returns its first argument bitwise where den >= clamp_min and
    propagates NaN.  eps = 0 with "add" is the identity (Eq. 4 unmodified).

    References
    ----------
    L2ViT Appendix 8 (clamp to [C_min, inf), Table 10); FLatten Eq. 4.

    ``den`` is a real floating array (or a Python number); float16/float32 are promoted to the working
    precision (numerics.as_float), strings, None, object and integer arrays are refused.
    """
    den = numerics.as_float(den, "den", allow_empty=True)
    _check_policy(None, eps, eps_policy, clamp_min)
    return apply_policy(den, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min)


def kernelized_attention(phi_q: Any, phi_k: Any, v: Any, *, order: str = "linear", normalize: bool = True,
                         eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                         clamp_min: float | None = None, taps: dict | None = None,
                         max_elements: int | None = None) -> np.ndarray:
    """Kernelized attention on feature maps already applied, in either association order.

    O = num / den_eff with num = phi_q (phi_k^T v), den = phi_q . sum_j phi_k_j       (order="linear")
                       or num = (phi_q phi_k^T) v, den = rowsum(phi_q phi_k^T)         (order="quadratic")
    and den_eff = :func:`apply_normaliser` (den).  normalize=False returns num.

    Parameters
    ----------
    phi_q : float array (B, h, N, d), phi(Q).
    phi_k : float array (B, h, M, d), phi(K).
    v : float array (B, h, M, e).
    order : "linear" (O(N M d e) never forming N x M; the default) or "quadratic" (forms the N x M matrix;
        refused when B*h*N*M > ``max_elements``, default ``config.QUADRATIC_MAX_ELEMENTS``).
    normalize : divide by the normaliser (True, Eq. 4) or return the numerator (False).
    eps, eps_policy, clamp_min : the normaliser policy (:func:`apply_normaliser`).
    taps : dict or None.  Protocol: the function *writes* float arrays under these names:

        - "phi_q" (B,h,N,d), "phi_k" (B,h,M,d) (both orders);
        - linear order: "kv" (B,h,d,e) = phi_k^T v, "k_sum" (B,h,d) = sum_j phi_k_j;
        - quadratic order: "scores" (B,h,N,M) = phi_q phi_k^T (unnormalised);
        - "numerator" (B,h,N,e);
        - normalize=True: "denominator_raw" (B,h,N) = phi_q . sum_j phi_k_j (or the row sums),
          "denominator" (B,h,N) = the value actually divided by (after clamp_min and eps);
        - "attn" (B,h,N,M) = the normalised matrix (or phi_q phi_k^T itself when normalize=False):
          always in quadratic order; in linear order only when the caller *requests* it by passing
          ``taps={"want_attn": True}`` (then guarded by ``max_elements`` like the quadratic order).
    max_elements : int or None, the memory guard for N x M matrices.

    Returns
    -------
    ndarray (B, h, N, e), working precision.

    References
    ----------
    L2ViT Eq. 3-4 and Appendix 8; FLatten Eq. 3-4; Katharopoulos et al. (2020) Eq. 5-6.
    """
    return _kernelized_attention(phi_q, phi_k, v, order=order, normalize=normalize, eps=eps,
                                 eps_policy=eps_policy, clamp_min=clamp_min, taps=taps, max_elements=max_elements)


def _kernelized_attention(phi_q: Any, phi_k: Any, v: Any, *, order: str, normalize: bool,
                          eps: float, eps_policy: str, clamp_min: float | None, taps: dict | None,
                          max_elements: int | None, positive: bool = False,
                          log_features: Any = None) -> np.ndarray:
    """:func:`kernelized_attention`; ``positive``: the map is > 0 everywhere (ELU + 1,
    softmax), so a zero normaliser is an underflow (normaliser_range.underflow_rows); ``log_features``: None or
    a callable giving (log phi(Q), log phi(K)) (normaliser_range.log_pair) for the rows whose normaliser
    underflowed (normaliser_range.rebalanced_output; without it such rows take normaliser_range.normalised_up)."""
    validation.check_max_elements(max_elements)
    phi_q = numerics.as_float(phi_q, "phi_q")
    phi_k = numerics.as_float(phi_k, "phi_k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(phi_q=(phi_q, "B h N d"), phi_k=(phi_k, "B h M d"), v=(v, "B h M e"))
    _check_policy(order, eps, eps_policy, clamp_min)
    n_elements = sz["B"] * sz["h"] * sz["N"] * sz["M"]
    want_attn = _wants_attn(taps)
    if order == "quadratic" or want_attn:
        _guard(n_elements, max_elements, f"kernelized_attention(order={order!r}"
               f"{', want_attn' if want_attn else ''})")
    if taps is not None:
        taps["phi_q"], taps["phi_k"] = phi_q, phi_k

    # Range safety (docs/guarantees.md): O is homogeneous of degree 0 in each row of phi_q and in
    # each head's phi_k (numerator and normaliser scale together) and of degree 1 in each column of v.  Each
    # group is rescaled by the exact power of two of numerics.pow2_exponent (scale_up: groups above 2^B down,
    # groups below 2^-B up, B = config.RANGE_RESCALE_EXPONENT; 2^0 inside the band: then this is the unscaled
    # computation bit for bit); eps and clamp_min are scaled with the normaliser (normaliser_scaled: exact, see
    # there), every recorded tap is scaled back, a result beyond float64 raises FloatingPointError naming the
    # stage (unscaled, quotient), and a row whose normaliser underflowed to 0 although the exact one is > 0 is
    # recomputed from log-features (rebalanced_output).
    e_q, e_k, e_v = scaling_exponents(phi_q, phi_k, v)     # (B,h,N,1), (B,h,1,1), (B,h,1,e)
    phi_q_in, phi_k_in, v_in = phi_q, phi_k, v
    phi_q, phi_k, v = np.ldexp(phi_q, -e_q), np.ldexp(phi_k, -e_k), np.ldexp(v, -e_v)
    e_qk = e_q + e_k                                       # the scores' and the normaliser's exponent

    scores = None
    if order == "linear":
        kv = phi_k.swapaxes(-1, -2) @ v                    # (B,h,d,e): sum_j phi(K_j)^T V_j
        num = phi_q @ kv
        if taps is not None:   # the products of the tapped phi's as written (rescaled: recomputed)
            with np.errstate(all="ignore"):
                taps["kv"] = phi_k_in.swapaxes(-1, -2) @ v_in if np.any(e_k) or np.any(e_v) else kv
        if normalize:
            k_sum = np.sum(phi_k, axis=-2)                 # (B,h,d)
            den = np.einsum("bhnd,bhd->bhn", phi_q, k_sum)
            if taps is not None:
                taps["k_sum"] = np.sum(phi_k_in, axis=-2) if np.any(e_k) else k_sum
        if want_attn:
            scores = phi_q @ phi_k.swapaxes(-1, -2)
    else:
        scores = phi_q @ phi_k.swapaxes(-1, -2)            # (B,h,N,M)
        num = scores @ v
        if normalize:
            den = np.sum(scores, axis=-1)
        if taps is not None:
            taps["scores"] = unscaled(scores, e_qk)
    if taps is not None:
        taps["numerator"] = unscaled(num, e_qk + e_v)
    if not normalize:
        if taps is not None and scores is not None:
            taps["attn"] = unscaled(scores, e_qk)
        return unscaled(num, e_qk + e_v, "linear attention (normalize=False): numerator phi(Q) phi(K)^T V")
    den_eff, g = normaliser_scaled(den, e_qk[..., 0], eps=eps, eps_policy=eps_policy, clamp_min=clamp_min)
    stage = "linear attention: output phi(Q) KV / normaliser"
    out = quotient(num, den_eff[..., None], e_v - g[..., None], stage)
    hit = underflow_rows(den_eff, phi_q, k_sum if order == "linear" else np.sum(phi_k, axis=-2), positive,
                          (phi_q_in, phi_k_in))
    if np.any(hit):            # the normaliser underflowed: those rows from log-features (rebalanced_output)
        logs = None if log_features is None else log_features()
        if logs is None:       # features given, or a signed map: the exact up-scaling of normalised_up
            fix = normalised_up(phi_q_in, phi_k_in, v_in, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min,
                                 stage=stage)
        else:
            fix = rebalanced_output(logs[0], logs[1], v, e_v, eps=eps, eps_policy=eps_policy,
                                     clamp_min=clamp_min, stage=stage,
                                     want_attn=taps is not None and scores is not None)
        fix, attn_fix = fix if isinstance(fix, tuple) else (fix, None)
        out = np.where(hit[..., None], fix, out)
    zero = (den_eff == 0) & ~hit
    if den_eff.dtype == np.float64 and np.any(zero):
        # a zero normaliser as computed that may be products underflowed (signed maps cannot tell it from a
        # cancellation): those rows once more with every group scaled to [1/2, 1), tiny ones up (normalised_up);
        # a normaliser still 0 there is exact, and keeps IEEE's quotient
        up = normalised_up(phi_q_in, phi_k_in, v_in, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min,
                            stage=stage)
        out = np.where(zero[..., None], up, out)
    if taps is not None:
        taps["denominator_raw"] = unscaled(den, e_qk[..., 0])
        taps["denominator"] = unscaled(den_eff, e_qk[..., 0] + g)
        if scores is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                taps["attn"] = unscaled(scores / den_eff[..., None], -g[..., None])
            if np.any(hit) and attn_fix is not None:   # the recomputed rows' matrix: attn @ V is the output
                taps["attn"] = np.where(hit[..., None], attn_fix, taps["attn"])
    return out


# ===================================================================================================
# Linear attention = feature map + core
# ===================================================================================================

def linear_attention(q: Any, k: Any, v: Any, *, feature_map: str = "relu", order: str = "linear",
                     normalize: bool = True, eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                     clamp_min: float | None = None, taps: dict | None = None, max_elements: int | None = None,
                     feature_map_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """Kernelized linear attention O_i = phi(Q_i) sum_j phi(K_j)^T V_j / (phi(Q_i) . sum_j phi(K_j)).

    Parameters
    ----------
    q : float array (B, h, N, d).
    k : float array (B, h, M, d).
    v : float array (B, h, M, e).
    feature_map : a name in :data:`FEATURE_MAPS` (see :func:`feature_map`), applied to q and k alike.
    order : "linear" (default) or "quadratic"; equal in exact arithmetic.
    normalize : bool; False returns the numerator phi(Q) phi(K)^T V.
    eps : float, default ``config.LINEAR_DEFAULT_EPS`` (0).  eps_policy : "add" (den + eps) or "clamp"
        (max(den, eps)).  clamp_min : float or None, L2ViT's C_min, applied before eps.
    taps : dict or None; names as :func:`kernelized_attention` ("phi_q", "phi_k", "kv", "k_sum",
        "scores", "numerator", "denominator_raw", "denominator", "attn"; request "attn" in linear order
        with ``taps={"want_attn": True}``).
    max_elements : memory guard of N x M matrices (default ``config.QUADRATIC_MAX_ELEMENTS``).
    feature_map_options : dict of options of the feature map (e.g. {"negative_slope": 0.2},
        {"base": "identity", "axis": -2}).

    Returns
    -------
    ndarray (B, h, N, e), working precision (float64 by default).

    References
    ----------
    L2ViT Eq. 2-4 (and Appendix 8 for ``clamp_min``); FLatten Eq. 1-4.
    """
    validation.check_max_elements(max_elements)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    _check_policy(order, eps, eps_policy, clamp_min)
    opts = dict(feature_map_options or {})

    if (order == "linear" and normalize and taps is None and not opts and feature_map in FUSED_MAPS
            and feature_map in FEATURE_MAPS):
        # The configurations the fused kernels implement are operation "linear_attention", whose NumPy
        # definition (_linear_attention_numpy) is this function's own computation for them: the kernels'
        # predicates pick the calls they take, the NumPy backend runs the definition.
        return backends.call("linear_attention", q, k, v, feature_map, eps, eps_policy, clamp_min)
    phi_q = _map_and_error(q, feature_map, opts, want_error=False)[0]
    phi_k = _map_and_error(k, feature_map, opts, want_error=False)[0]
    return _kernelized_attention(phi_q, phi_k, v, order=order,
                                 normalize=normalize, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min,
                                 taps=taps, max_elements=max_elements, positive=feature_map in _POSITIVE_MAPS,
                                 log_features=lambda: log_pair(q, k, feature_map, opts, phi_q, phi_k))


#: Feature maps of the fused linear-attention kernels (operation "linear_attention" of refimpl.backends).
#: "focused" is FLatten's phi_p (refimpl.attention.focused.focused_feature_map); it is not one of
#: :data:`FEATURE_MAPS` (focused.focused_attention is its public entry).
FUSED_MAPS = ("relu", "elu1", "focused")


@backends.register("linear_attention", "numpy")
def _linear_attention_numpy(q: Any, k: Any, v: Any, feature_map: str = "relu",
                            eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                            clamp_min: float | None = None, p: float = config.FLATTEN_FOCUSING_FACTOR, *,
                            out: np.ndarray | None = None, workspace: Any = None,
                            threads: Any = None, v_scale: Any = None, v_scale_mode: str = "divide") -> np.ndarray:
    """The NumPy definition of operation "linear_attention" of :mod:`refimpl.backends` (the twin of the
    fused C and Numba kernels): :func:`linear_attention` in linear order, normalised, without taps,
    for ``feature_map`` in :data:`FUSED_MAPS`.

    O_i = phi(Q_i) (sum_j phi(K_j)^T V_j) / apply_normaliser(phi(Q_i) . sum_j phi(K_j))

    Parameters
    ----------
    q (B, h, N, d), k (B, h, M, d), v (B, h, M, e) : float arrays (computed in their working precision).
    feature_map : "relu", "elu1" or "focused" (FLatten Eq. 6: phi_p(x) = f_p(ReLU(x)) per row, computed by
        the NumPy definition :func:`refimpl.feature_maps.focused_function` (power_scaling="max")).
    eps, eps_policy, clamp_min : the normaliser policy (:func:`apply_normaliser`).
    p : the focusing factor of "focused" (real, finite, >= 1; validated for every map, used only there).
    out : optional (B, h, N, e) array the result is copied into (and returned), for signature parity with
        the kernels.  workspace, threads : accepted and ignored (the kernels' buffers and thread count).
    v_scale, v_scale_mode : None, or 1 or h values s (any shape of that size, e.g. L2ViT's (1, h, 1, 1)
        gain) by which V is divided ("divide") or multiplied ("multiply") per head first: v_eff = v / s
        (v * s), s reshaped to (1, h, 1, 1), the operands the C kernel's ``v_scale=`` rounds to.

    Returns
    -------
    ndarray (B, h, N, e).

    References
    ----------
    L2ViT Eq. 2-4 and Appendix 8; FLatten Eq. 1-6; Katharopoulos et al. (2020) Eq. 7.
    """
    if feature_map not in FUSED_MAPS:
        raise ArgumentError(f"argument 'feature_map': operation 'linear_attention' takes {FUSED_MAPS}, got "
                         f"{feature_map!r}; use linear_attention() for the other maps")
    p = feature_maps.check_focusing_factor(p)
    if v_scale is not None:
        if v_scale_mode not in ("divide", "multiply"):
            raise ArgumentError(f"argument 'v_scale_mode': expected 'divide' or 'multiply', got {v_scale_mode!r}")
        s = np.asarray(v_scale).reshape(1, -1, 1, 1)
        v = v / s if v_scale_mode == "divide" else v * s
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    if feature_map == "focused":
        # The NumPy definition of f_p, not the public (dispatching) focused.focused_function.
        phi_q = feature_maps.focused_function(numerics.relu(q), p, axis=-1, power_scaling="max")
        phi_k = feature_maps.focused_function(numerics.relu(k), p, axis=-1, power_scaling="max")
        logs = None
    else:
        phi_q = _map_and_error(q, feature_map, {}, want_error=False)[0]
        phi_k = _map_and_error(k, feature_map, {}, want_error=False)[0]
        logs = lambda: log_pair(q, k, feature_map, {}, phi_q, phi_k)    # noqa: E731
    res = _kernelized_attention(phi_q, phi_k, v, order="linear", normalize=True, eps=eps,
                                eps_policy=eps_policy, clamp_min=clamp_min, taps=None, max_elements=None,
                                positive=feature_map in _POSITIVE_MAPS, log_features=logs)
    if out is not None:
        out[...] = res
        return out
    return res


@backends.register("elu1_feature_map", "numpy")
def _elu1_feature_map_numpy(x: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """The NumPy definition of operation "elu1_feature_map" of refimpl.backends (the twin of the C kernel):
    ELU(x) + 1 = x + 1 for x > 0, exp(x) otherwise, element-wise (exp form, relative accuracy kept as
    x -> -inf): exactly ``feature_map(x, "elu1")``.

    Parameters
    ----------
    x : float array, any shape.  out : optional array of x's shape the result is copied into and returned.

    Returns
    -------
    ndarray of x's shape (working precision, as :func:`feature_map`).

    References
    ----------
    Katharopoulos et al. (2020) Eq. 7; RALA (Fan et al., CVPR 2025) Sec. 3.2 (kappa).
    """
    res = feature_map(x, "elu1")
    if out is not None:
        out[...] = res
        return out
    return res


# ===================================================================================================
# Error bounds
# ===================================================================================================

def kernelized_attention_bound(phi_q: Any, phi_k: Any, v: Any, *, err_q: Any = None, err_k: Any = None,
                               normalize: bool = True, eps: float = config.LINEAR_DEFAULT_EPS,
                               eps_policy: str = "add", clamp_min: float | None = None,
                               dtype: Any = None) -> numerics.Bound:
    """Error bound of :func:`kernelized_attention` computed in precision T, for either order.

    Derivation (Higham ch. 3; u = u_T; |.| element-wise; first order in u).  Let E_q, E_k be the feature
    maps' error coefficients (|fl(phi) - phi| <= u E, :func:`feature_map_error`; zero when the caller
    gives exact feature maps).

    Numerator.  Linear order: KV = phi_k^T v is a length-M inner product, num = phi_q KV length d:
        |d num| <= gamma_d |phi_q| |KV| + |phi_q| |d KV| + u E_q |KV|,  |d KV| <= gamma_M |phi_k|^T|v| + u E_k^T|v|
    and |KV| <= |phi_k|^T |v|, so |d num| <= gamma_{d+M} S_num + u F_num with
        S_num = |phi_q| (|phi_k|^T |v|)   (the same computation on absolute values),
        F_num = E_q (|phi_k|^T |v|) + |phi_q| (E_k^T |v|).
    Quadratic order: scores (length d) then scores @ v (length M): the same two terms.
    Denominator: den = phi_q . sum_j phi_k_j, lengths M and d:  |d den| <= gamma_{d+M} S_D + u F_D,
        S_D = |phi_q| (sum_j |phi_k_j|),  F_D = E_q (sum_j |phi_k_j|) + |phi_q| (sum_j E_k_j).
    The clamp max(den, C) is exact and 1-Lipschitz, so den_eff inherits |d den|; eps "add" rounds once
    (u |den_eff|), eps "clamp" is exact.  The quotient: with a = |d num|, b = |d den_eff|,
        |num'/den' - num/den| <= (a + |O| b) / (|den_eff| - b)     (exact when b < |den_eff|),
    plus u |O| for rounding the quotient.  Using |O| <= S_num / |den_eff| and gamma_n + u <= gamma_{n+1}:

        normalize=True:  k = d + M + 2 (d, M: the two inner products; +1 the eps add; +1 the quotient),
            scale = (S_num + F_num / k + (S_num / |den_eff|) (S_D + F_D / k)) / D_low,
            D_low = |den_eff| (first order; ``dtype=None``) or |den_eff| - gamma_{d+M+2}(u_T) (S_D + F_D / k)
            (``dtype`` given: the exact quotient bound, inf where that is <= 0, i.e. where rounding can
            reach a zero normaliser - then no bound exists and the comparison will say so).
        normalize=False: k = d + M, scale = S_num + F_num / k.
    The features' terms enter as F / k because the bound is gamma_k scale and gamma_k / k = u / (1 - k u) >=
    u (1 + gamma_{d+M}): their u F, and its own rounding in the sums, exactly as derived (F alone, multiplied
    by gamma_k, would charge them k times).

    With ``dtype`` given, gradual underflow is propagated too (Higham eq. 2.8: each rounding may add
    eta_T): the numerator collects at most eta_T (M ||phi_q_i||_1 + d sum_j |v_je| + d + M), the normaliser
    eta_T (M ||phi_q_i||_1 + d M + d + M) (the worse of the two orders), the feature maps' own underflow
    (eta_T per entry) eta_T (sum_c (|phi_k|^T |v|)_ce + ||phi_q_i||_1 sum_j |v_je|) and
    eta_T (sum_cj |phi_k_jc| + M ||phi_q_i||_1) more (only where err_q or err_k is nonzero: maps computed in T;
    exact maps - ReLU, identity, or features whose errors the caller propagates itself - have none), and the
    quotient divides both by
    D_low; the term is added to the scale in units of gamma_k(u_T).  Without ``dtype`` only Bound's own
    k eta_T is included (not propagated through the quotient).

    Rigorous given gamma's assumptions (any summation order, so BLAS/GPU/threads; no FMA-specific
    improvements assumed) except: products of two feature-map errors (O(u^2)) are neglected, and E for
    maps using exp relies on ``config.ELEMENTARY_FUNCTION_ULPS``.  With non-negative feature maps
    S_D = den exactly (no cancellation); with signed maps (identity, leaky_relu, signed l1) S_D may be
    far larger than |den| and the bound is correspondingly wide - that is the honest conditioning.

    Parameters
    ----------
    phi_q (B,h,N,d), phi_k (B,h,M,d), v (B,h,M,e) : float arrays (the reference's values).
    err_q, err_k : error coefficients of phi_q, phi_k (same shapes) or None (exact feature maps).
    normalize, eps, eps_policy, clamp_min : as :func:`kernelized_attention`.
    dtype : the tested precision T, or None for the first-order (dtype-free) scale.

    Returns
    -------
    numerics.Bound with scale (B,h,N,e).

    References
    ----------
    docs/design.md "The verdict"; Higham (2002) Lemma 3.1, eq. (3.4)-(3.5); L2ViT Eq. 4; FLatten Eq. 4.
    """
    return _kernelized_bound(phi_q, phi_k, v, err_q, err_k, normalize, eps, eps_policy, clamp_min, dtype)


def _kernelized_bound(phi_q: Any, phi_k: Any, v: Any, err_q: Any, err_k: Any, normalize: bool, eps: float,
                      eps_policy: str, clamp_min: float | None, dtype: Any, normaliser: Any = None) -> numerics.Bound:
    """:func:`kernelized_attention_bound`; ``normaliser``: None, or (den_eff, g), the effective normaliser
    den_eff 2^g (B, h, N) of a rescaled or recomputed row (normaliser_scaled: eps, clamp_min in) in place of
    apply_normaliser(phi_q . sum_j phi_k_j), the scale formed in units of 2^g (g = 0: the same bits)."""
    phi_q = numerics.as_float(phi_q, "phi_q")
    phi_k = numerics.as_float(phi_k, "phi_k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(phi_q=(phi_q, "B h N d"), phi_k=(phi_k, "B h M d"), v=(v, "B h M e"))
    _check_policy(None, eps, eps_policy, clamp_min)
    eq = np.zeros_like(phi_q) if err_q is None else numerics.as_float(err_q, "err_q")
    ek = np.zeros_like(phi_k) if err_k is None else numerics.as_float(err_k, "err_k")
    numerics.check_shapes(sz, err_q=(eq, "B h N d"), err_k=(ek, "B h M d"))
    d, m = sz["d"], sz["M"]
    computed_features = bool(np.any(eq) or np.any(ek))     # maps with rounding error of their own
    aq, ak, av = np.abs(phi_q), np.abs(phi_k), np.abs(v)
    with np.errstate(over="ignore", invalid="ignore"):
        kv_abs = ak.swapaxes(-1, -2) @ av
        s_num = aq @ kv_abs
        f_num = eq @ kv_abs + aq @ (ek.swapaxes(-1, -2) @ av)
    # Rounding counts in units of u_T: a length-n sum counts n, or n u_A / u_T + 1 when T accumulates in a
    # wider format A (numerics.sum_depth, config.ACCUMULATION_FORMAT); ref_depth keeps the float64 count.
    sum_d, sum_m = numerics.sum_depth(d, dtype), numerics.sum_depth(m, dtype)
    if not normalize:
        k_depth = sum_d + sum_m
        scale = s_num + f_num / k_depth
        if dtype is not None:  # gradual underflow, as in the normalised case below
            # every rounding of the two inner products (eta_T (M ||phi_q_i||_1 + d sum_j |v_je| + d + M)), and,
            # where the feature maps are computed (err_q / err_k given), their own underflow, eta_T per entry of
            # phi_q and phi_k, carried through the products: eta_T (sum_c (|phi_k|^T |v|)_ce + ||phi_q_i||_1 sum_j
            # |v_je|).  Exact features (ReLU, identity; the callers' pre-computed maps) carry none.
            q1 = np.sum(aq, axis=-1)[..., None]
            v1 = np.sum(av, axis=-2)[..., None, :]
            count = m * q1 + d * v1 + d + m
            if computed_features:
                count = count + np.sum(kv_abs, axis=-2)[..., None, :] + q1 * v1
            scale = scale + _eta_times(count, dtype) / numerics.gamma(k_depth, numerics.unit_roundoff(dtype))
        return numerics.Bound(
            scale, k_depth,
            f"kernelized attention numerator: k = d + M = {d} + {m} (two inner products{_mixed_note(dtype)});"
            f" scale |phi_q|(|phi_k|^T|v|) + feature-map error terms (first order)", ref_depth=d + m)
    k_depth = sum_d + sum_m + 2
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ksum_abs = np.sum(ak, axis=-2)
        s_den = np.einsum("bhnd,bhd->bhn", aq, ksum_abs)
        f_den = (np.einsum("bhnd,bhd->bhn", eq, ksum_abs)
                 + np.einsum("bhnd,bhd->bhn", aq, np.sum(ek, axis=-2))) / k_depth
        f_num = f_num / k_depth
        if normaliser is None:
            den = np.einsum("bhnd,bhd->bhn", phi_q, np.sum(phi_k, axis=-2))
            den_eff = np.abs(apply_normaliser(den, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min))
            g = np.zeros(den_eff.shape, dtype=np.int64)
        else:           # den_eff 2^g: |O| = S_num 2^-g / den_eff, |den_eff 2^g| - b = 2^g (den_eff - b 2^-g)
            den_eff, g = np.abs(normaliser[0]), np.asarray(normaliser[1])
        if dtype is None:
            d_low = den_eff
            how = "first order in u (|den_eff| in the quotient)"
        else:
            b = np.ldexp(numerics.gamma(k_depth, numerics.unit_roundoff(dtype)) * (s_den + f_den), -g)
            d_low = np.where(den_eff > b, den_eff - b, 0.0)
            how = (f"exact quotient bound for {dtype} (|den_eff| - b; inf where "
                   f"rounding may reach a zero normaliser)")
        o_abs = np.ldexp(s_num, -g[..., None]) / den_eff[..., None]
        scale = (s_num + f_num + o_abs * (s_den + f_den)[..., None]) / d_low[..., None]
        if dtype is not None:
            # Gradual underflow (Higham eq. 2.8): every rounding may add eta_T absolutely.  Through the two
            # inner products of either order the numerator collects at most
            # eta (M ||phi_q_i||_1 + d sum_j |v_je| + d + M) and the normaliser eta (M ||phi_q_i||_1 + d M + d + M);
            # the quotient divides both by den.  Expressed in units of gamma_k(u) to fit Bound's form.
            # The feature maps' own underflow (an absolute eta per entry of phi_q, phi_k) adds
            # eta (sum_c (|phi_k|^T|v|)_ce + ||phi_q_i||_1 sum_j |v_je|) and eta (sum_c sum_j |phi_k_jc| + M ||phi_q_i||_1).
            q1 = np.sum(aq, axis=-1)[..., None]
            v1 = np.sum(av, axis=-2)[..., None, :]
            own_num = np.sum(kv_abs, axis=-2)[..., None, :] + q1 * v1 if computed_features else 0.0
            own_den = np.sum(ksum_abs, axis=-1)[..., None, None] + m * q1 if computed_features else 0.0
            eta_num = _eta_times(m * q1 + d * v1 + d + m + own_num, dtype)
            eta_den = _eta_times(m * q1 + d * m + d + m + own_den, dtype)
            scale = scale + (eta_num + o_abs * eta_den) / d_low[..., None] / \
                numerics.gamma(k_depth, numerics.unit_roundoff(dtype))
        scale = np.where(np.isnan(scale) & (d_low[..., None] == 0) & (den_eff[..., None] > 0), np.inf,
                         np.ldexp(scale, -g[..., None]))
    note = (f"kernelized attention: k = d + M + 2 = {d} + {m} + 2 (inner products of length d and M"
            f"{_mixed_note(dtype)}, the eps add, the quotient); scale (S_num + F_num + |O| (S_den + F_den)) / |den_eff|, {how}; "
            f"{'underflow terms eta_T propagated through the quotient; ' if dtype is not None else ''}"
            f"feature-map error products O(u^2) neglected")
    return numerics.Bound(scale, k_depth, note, ref_depth=d + m + 2)


def _mixed_note(dtype: Any) -> str:
    """How the sums are counted when T accumulates in a wider format (numerics.sum_depth)."""
    if dtype is None or numerics.sum_depth(2, dtype) == 2:
        return ""
    return (f" accumulated in {config.ACCUMULATION_FORMAT[numerics.format_name(dtype)]} and rounded to "
            f"{numerics.format_name(dtype)}: a length-n sum counts n u_A/u_T + 1")


def linear_attention_bound(q: Any, k: Any, v: Any, *, feature_map: str = "relu", normalize: bool = True,
                           eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                           clamp_min: float | None = None, dtype: Any = None,
                           feature_map_options: Mapping[str, Any] | None = None,
                           order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`linear_attention` in precision T (either order; ``order`` is accepted and
    ignored because the bound is the same for both, see :func:`kernelized_attention_bound`).

    The feature maps are evaluated on the (T-rounded) inputs q, k; their error coefficients
    (:func:`feature_map_error`) enter through F_num and F_den; k = d + M + 2 (normalize) or d + M.

    Range (docs/guarantees.md), normalised: the rows are bounded as :func:`linear_attention` computes them.
    For T = float64 (or ``dtype=None``) a row whose normaliser underflows although the exact one is > 0 (the
    rows it recomputes from log-features) takes the bound of those rebalanced features (relu, elu1, softmax; inf
    for the other maps) with the normaliser it divides by, eps and clamp_min scaled along exactly as in the
    direct rows, or (T = float64) the direct bound where that is larger and finite: a direct evaluation (the
    twins) does not recompute, and its features underflow as T's do, which the direct bound's underflow terms
    eta_T over the tiny normaliser cover (where the float64 normaliser is itself 0 a direct evaluation has no
    result, 0/0 = NaN).  Other precisions evaluate such a row directly: it keeps the direct bound (inf where
    the float64 normaliser is 0).  For T = float64
    (or ``dtype=None``) the rows whose groups it rescales by powers of two (outside [2^-B, 2^B], B =
    ``config.RANGE_RESCALE_EXPONENT``) take the bound of the rescaled computation (float64: or the direct
    bound where that is larger and finite, covering a direct evaluation's underflow); other precisions do not
    rescale, and neither does the unnormalised bound: for inputs above 2^B whose bound overflows,
    FloatingPointError naming the stage (numerics.check_bound_range).

    Parameters
    ----------
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e) : float arrays; other arguments as :func:`linear_attention`;
    dtype : the tested precision T or None (first-order scale).

    Returns
    -------
    numerics.Bound with scale (B,h,N,e).

    References
    ----------
    docs/design.md "The verdict"; L2ViT Eq. 4; FLatten Eq. 4; Higham (2002) ch. 3.
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    _check_policy(order, eps, eps_policy, clamp_min)
    opts = dict(feature_map_options or {})
    phi_q, e_q = _map_and_error(q, feature_map, opts, want_error=True)
    phi_k, e_k = _map_and_error(k, feature_map, opts, want_error=True)
    pol = dict(eps=eps, eps_policy=eps_policy, clamp_min=clamp_min)
    bound = kernelized_attention_bound(phi_q, phi_k, v, err_q=e_q, err_k=e_k, normalize=normalize, dtype=dtype, **pol)
    scale = bound.scale
    if normalize:
        # The rows as linear_attention computes them (the reference; the C wrappers answer out-of-band float64
        # inputs with it): groups rescaled by powers of two (normaliser_range.scaling_exponents), eps and
        # clamp_min with the normaliser; the rows whose normaliser underflowed recomputed from log-features.
        x_q, x_k, x_v = scaling_exponents(phi_q, phi_k, v)
        pq, pk, vs = np.ldexp(phi_q, -x_q), np.ldexp(phi_k, -x_k), np.ldexp(v, -x_v)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            k_sum = np.sum(pk, axis=-2)
            den, g = normaliser_scaled(np.einsum("bhnd,bhd->bhn", pq, k_sum), (x_q + x_k)[..., 0], **pol)
        as_reference = dtype is None or numerics.format_name(dtype) == "float64"
        if (np.any(x_q) or np.any(x_k) or np.any(x_v)) and as_reference:
            # the rescaled rows (only float64 rescales): their bound in the scaled units
            scale = np.ldexp(_kernelized_bound(pq, pk, vs, np.ldexp(e_q, -x_q), np.ldexp(e_k, -x_k), True,
                                               dtype=dtype, normaliser=(den, g), **pol).scale, x_v)
            if dtype is not None:
                # or a direct float64 evaluation (the twins: no rescaling), whose tiny products and values
                # underflow: the direct bound where it is larger and finite (beyond float64 a direct
                # evaluation overflows, which the NaN/Inf patterns catch)
                scale = np.where(np.isfinite(bound.scale), np.maximum(scale, bound.scale), scale)
        hit = underflow_rows(den, pq, k_sum, feature_map in _POSITIVE_MAPS, (phi_q, phi_k))
        # A direct evaluation in T (no rescaling, no recomputation: the twins; every precision but float64)
        # computes such a row with features that underflow as T's do: the direct bound covers it (its eta_T
        # terms are relative to the tiny normaliser); where that is NaN (the float64 normaliser itself is 0,
        # 0/0) no bound exists.
        direct = np.where(hit[..., None] & np.isnan(bound.scale), np.inf, bound.scale)
        if np.any(hit) and not as_reference:
            scale = np.where(hit[..., None], direct, scale)
        elif np.any(hit):
            # the rows linear_attention recomputes from log-features: the bound of the rebalanced features with the
            # normaliser rebalanced_output divides by (eps, clamp_min scaled along; inf without log-features), plus
            # f = exp(lq*) exp(m*)'s own relative error rho u = (2c + 3) u (two reduced exps and their product;
            # its arguments' errors are the features' own, as the products f phi_q'_c phi_k'_jc = exp(lq_c + lk_jc)
            # show), which eps and clamp_min do not share (rho w |O|, w their share of the normaliser), and num f,
            # den f (2u|O|).  A rebalanced feature errs relatively by its log's error (normaliser_range.log_error),
            # its exp argument's roundings (normaliser_range.argument_errors: up to |lq - lq*| u where a feature
            # lies far below its row's top) and exp's c.
            c_elem = float(config.ELEMENTARY_FUNCTION_ULPS)
            logs, l_q = log_pair(q, k, feature_map, opts, phi_q, phi_k), log_error(q, feature_map, opts)
            fix = np.inf
            if logs is not None and l_q is not None:
                l_k = log_error(k, feature_map, opts)
                rq, rk, f, s, arg_q, arg_k = rebalance_factor(*logs, with_errors=True)
                f0 = f[..., 0]
                with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
                    raw = np.einsum("bhnd,bhd->bhn", rq, np.sum(rk, axis=-2)) * f0
                    den_r, g_r = normaliser_scaled(raw, s[..., 0], **pol)
                    e_rq = np.where(rq > 0, (l_q + arg_q + c_elem) * rq, 0.0)
                    e_rk = np.where(rk > 0, (l_k + arg_k + c_elem) * rk, 0.0)
                    b_r = _kernelized_bound(rq, rk, vs, e_rq, e_rk, True, dtype=dtype,
                                            normaliser=(den_r / f0, g_r), **pol)
                    rho = 2.0 * c_elem + 3.0
                    w = np.clip(1.0 - np.ldexp(raw, -g_r) / den_r, 0.0, 1.0)
                    o = np.ldexp(np.abs(rq) @ (np.abs(rk).swapaxes(-1, -2) @ np.abs(vs)), -g_r[..., None]) / \
                        (den_r / f0)[..., None]
                    fix = np.ldexp(b_r.scale + o * ((w * rho + 2.0) / b_r.k)[..., None], x_v)
            if dtype is not None:   # float64: the recomputed rows, or a direct evaluation of them (the larger),
                # where that has a result: with a normaliser 0 in float64 it has none (0/0 = NaN, which no bound
                # can excuse), and only the recomputation is bounded
                fix = np.where(np.isfinite(direct), np.maximum(fix, direct), fix)
            scale = np.where(hit[..., None], fix, scale)
    return numerics.check_bound_range(numerics.Bound(scale, bound.k, f"feature map {feature_map!r}; {bound.note}"),
                                      "linear_attention_bound", q=q, k=k, v=v)
