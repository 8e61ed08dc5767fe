"""Range safety of normalised linear attention (docs/guarantees.md "Linear attention and RALA's core
at every magnitude"): the machinery shared by :mod:`refimpl.attention.linear` (Eq. 4 below) and RALA's core
(:mod:`refimpl.attention.rala_core`, RALA Eq. 2, which is Eq. 4 with keys weighted by alpha_j > 0).

The mathematics.  Normalised linear attention with non-negative features phi,

    O_i = sum_j [phi(Q_i) . phi(K_j)] V_j / (phi(Q_i) . sum_j phi(K_j))                     (Eq. 4; L2ViT Eq. 4,
                                                                                           FLatten Eq. 4)

is invariant under two positive rescalings of the features (every product phi(Q_i)_c phi(K_j)_c, and so
numerator and normaliser, change by the same factor, or not at all):

  (R1) per channel: channel c of phi(Q) multiplied and channel c of phi(K) divided by any a_c > 0 (for
       RALA's RoPE, which mixes the channel pair (2t, 2t+1), both channels of a rotated pair take one factor);
  (R2) per row: row i of phi(Q) (or every key of a head) multiplied by b_i > 0, with the normaliser's
       additive eps and clamp C_min multiplied by b_i too (they are then the same constants in the original
       units).  Likewise O is of degree 1 in each column of V.

With exact powers of two b_i = 2^e (numerics.pow2_exponent; :func:`scaling_exponents`: groups above 2^256 down,
tiny and subnormal groups below 2^-256 up) R2 is the range safety of the direct computation, exact down to the
subnormal range (:func:`normaliser_scaled` scales eps and C_min with the normaliser, exactly; :func:`quotient` raises
FloatingPointError naming the stage where the exact result is finite but beyond float64).  Where the
normaliser underflows to 0 although the exact one is > 0 (ELU + 1 or softmax features of large negative
inputs, whose exp underflows; products of tiny non-negative features: :func:`underflow_rows`), the row is
recomputed from log-features lq = log phi(Q), lk = log phi(K) (:func:`log_features`, without exp's
underflow): R1 with a_c = exp(m_c), m_c = max_j lk_jc, and R2 with b_i = exp(-r_i), r_i = max_c (lq_ic + m_c)
(:func:`rebalance`), so that phi(Q_i)_c phi(K_j)_c = exp(r_i) phi_q'_ic phi_k'_jc with the largest entry of
each factor 1 and the normaliser >= 1 (:func:`rebalanced_output`).  The remaining factor exp(r_i), far
outside float64, is carried as f 2^s by Cody and Waite's argument reduction (numerics.exp_pow2_split:
s = round(r / ln 2), f = exp((r - s ln2_hi) - s ln2_lo) with ln 2 = ln2_hi + ln2_lo split so that s ln2_hi is
exact), as exp(lq*) exp(m*) of the row's largest channel (:func:`rebalance_factor`: not the rounded sum
r = lq* + m*, whose error u |r| eps would not cancel), f multiplying numerator and normaliser and 2^s scaling the
policy's constants (R2 again).  The bounds (linear.linear_attention_bound, rala_bounds.rala_core_bound) bound
those rows on the rebalanced features, whose relative errors are their logs' own (:func:`log_error`), their exp
arguments' roundings (:func:`argument_errors`) and exp's; linear_attention_bound with the normaliser those rows
divide by (eps and clamp_min included) and f's own rounding.

References: L2ViT Eq. 2-4 and Appendix 8 (C_min); FLatten Eq. 1-4; RALA (Fan et al., CVPR 2025) Eq. 2-4;
W. J. Cody and W. Waite, Software Manual for the Elementary Functions (1980), ch. 6 (exp's reduction).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, numerics, validation
from ..errors import ArgumentError

__all__ = ["apply_policy", "quotient", "unscaled", "scaling_exponents", "normaliser_scaled", "underflow_rows",
           "log_features", "rebalanced_output", "rebalance", "rebalance_parts", "rebalance_factor", "argument_errors",
           "log_error", "normalised_up", "underflow_error", "log_pair", "shared_max"]


def apply_policy(den: Any, *, eps: float, eps_policy: str, clamp_min: float | None) -> np.ndarray:
    """The normaliser policy of linear.apply_normaliser: den -> max(den, clamp_min) (if given), then den + eps
    ("add") or max(den, eps) ("clamp"); ``den`` in the working precision (numerics.as_float); eps_policy, eps
    (finite, >= 0) and clamp_min (None or finite, >= 0) checked as there."""
    out = numerics.as_float(den, "den", allow_empty=True)
    if eps_policy not in ("add", "clamp"):
        raise ArgumentError(f"argument 'eps_policy': expected 'add' or 'clamp', got {eps_policy!r}")
    validation.check_eps(eps, "eps")                       # finite, >= 0
    if clamp_min is not None:
        validation.check_real(clamp_min, "clamp_min", minimum=0.0)
        out = np.maximum(out, clamp_min)
    if eps_policy == "add":
        if eps != 0:
            out = out + eps
    else:
        out = np.maximum(out, eps)
    return out


def quotient(num: np.ndarray, den: np.ndarray, e: np.ndarray, stage: str) -> np.ndarray:
    """(num / den) 2^e, the scaled-back output of a normalised core (the range-safety helper shared
    with RALA's core): FloatingPointError naming ``stage`` where num and den are finite, den is nonzero
    and the result is infinite (the exact quotient is finite but beyond float64).  A zero normaliser keeps
    IEEE's quotient (0/0 = NaN, x/0 = +-inf: the mathematics' own singularity, docs/guarantees.md).

    Where e != 0 and num / den itself leaves the normal range (an eps or clamp far above a tiny numerator's
    scale, or the reverse) while the scaled-back result may not, the quotient is formed on the mantissas
    (num = m_n 2^a, den = m_d 2^b, m in [1/2, 1): (m_n / m_d) 2^(a - b + e), frexp and ldexp exact), so the one
    rounding of m_n / m_d is that of an unbounded exponent and only the final ``ldexp`` may round again (into
    the subnormal range).  Elsewhere (every e = 0 entry, every normal quotient) this is ldexp(num / den, e) bit
    for bit."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        r = num / den
        y = np.ldexp(r, e)
        off = (np.abs(r) < np.finfo(r.dtype).tiny) & (num != 0) | np.isinf(r)
        off = off & np.isfinite(num) & np.isfinite(den) & (den != 0) & (np.asarray(e) != 0)
        if np.any(off):
            (mn, a), (md, b) = np.frexp(num), np.frexp(den)
            y = np.where(off, np.ldexp(mn / md, np.clip(a - b + e, -4000, 4000)), y)
    lost = np.isinf(y) & np.isfinite(num) & np.isfinite(den) & (den != 0)
    if np.any(lost):
        idx = tuple(int(i) for i in np.argwhere(lost)[0])
        raise FloatingPointError(f"{stage}: the exact result at index {idx} is finite but beyond the range of "
                                 f"{y.dtype} (it is not representable)")
    return y


def unscaled(x: np.ndarray, e: np.ndarray, stage: str | None = None) -> np.ndarray:
    """x 2^e (exact unless it over- or underflows; ``np.ldexp``).  With ``stage`` named, a finite entry that
    overflows is a result float64 cannot represent: FloatingPointError naming the stage and the index."""
    with np.errstate(over="ignore"):
        y = np.ldexp(x, e)
    if stage is not None:
        lost = np.isinf(y) & np.isfinite(x)
        if np.any(lost):
            idx = tuple(int(i) for i in np.argwhere(lost)[0])
            raise FloatingPointError(f"{stage}: the exact result at index {idx} is finite but beyond the range of "
                                     f"{y.dtype} (it is not representable)")
    return y


def scaling_exponents(phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray) -> tuple:
    """(e_q, e_k, e_v): numerics.pow2_exponent (``scale_up``) of each row of phi(Q) (B, h, N, 1), each head's
    phi(K) (B, h, 1, 1) and each column of V (B, h, 1, e): the groups of R2 (and V's degree 1) that the direct
    computation of Eq. 4 rescales by exact powers of two, above 2^B down and below 2^-B up (0 inside the band,
    B = config.RANGE_RESCALE_EXPONENT)."""
    return (numerics.pow2_exponent(phi_q, axis=-1, scale_up=True),
            numerics.pow2_exponent(phi_k, axis=(-2, -1), scale_up=True),
            numerics.pow2_exponent(v, axis=-2, scale_up=True))


def normaliser_scaled(den: np.ndarray, e: np.ndarray, *, eps: float, eps_policy: str,
                       clamp_min: float | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`apply_policy` (linear.apply_normaliser) of a normaliser given as den 2^-e, as (den_eff, g) with den_eff =
    apply_policy(den 2^e) 2^-(e + g): the same policy with clamp_min and eps scaled by 2^-(e + g) and den by
    2^-g.  g = 0 (an int array of e's shape) unless a scaled constant 2^-e would leave [2^-1000, 2^1000] (a
    group rescaled a long way, up or down): then g is the exponent of the normaliser's own magnitude (the larger
    of den's - its positive part where a clamp bounds the result below - and the constants'), so the value
    divided by is about 1 and neither a huge constant overflows nor a chosen tiny one underflows (what is
    lost is below 2^-1000 of it).  Where e = 0 everywhere this is apply_policy(den) bit for bit.

    Exactness.  eps and clamp_min are not scale-invariant: a normaliser den 2^-e of features rescaled by 2^-e
    (up or down) meets the constants c 2^-e, the same constants in the original units; multiplying by 2^-e (and
    2^-g) is exact where the product is a normal number, so den_eff is then the float64 value of the policy in
    the original units with an unbounded exponent, bit for bit (L(2^a q, 2^b k, v; eps) = L(q, k, v;
    eps 2^-(a+b)) for linear attention).  Where a scaled constant would leave [2^-1000, 2^1000] it is still
    exact in that sense: either the constant exceeds the normaliser by more than 2^1000 - 2^-g puts it near
    1, den 2^-g (perhaps subnormal) is below half an ulp of it, and both den + c and max(den, c) round to c,
    as they do with an unbounded exponent - or it is below 2^-1000 of the normaliser, which it cannot change
    in 53 bits (den + c rounds to den, max(den, c) is den).  So eps = 0 and no clamp give degree 0 exactly;
    with constants, what is exact is the computation of the policy as written, not a homogeneity."""
    g = np.zeros(np.shape(e), dtype=np.int64)
    if not np.any(e):
        return apply_policy(den, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min), g
    c = den.dtype.type      # eps and clamp_min in the working precision, as in apply_policy
    consts = [float(x) for x in (eps, clamp_min) if x]
    if consts:
        t_c = np.frexp(c(max(consts)))[1] - e               # the largest constant's exponent after 2^-e
        need = (t_c > 1000) | (t_c < -1000)
        if np.any(need):
            clamped = clamp_min is not None or eps_policy == "clamp"
            with np.errstate(invalid="ignore"):
                mag = np.maximum(den, 0.0) if clamped else np.abs(den)
                t_den = np.where(mag > 0, np.frexp(mag)[1], np.iinfo(np.int32).min)
            g = np.where(need, np.maximum(t_den, t_c), 0).astype(np.int64)
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(den, -g) if np.any(g) else den
        if clamp_min is not None:
            out = np.maximum(out, np.ldexp(c(clamp_min), -e - g))
        if eps_policy == "add":
            if eps != 0:
                out = out + np.ldexp(c(eps), -e - g)
        else:
            out = np.maximum(out, np.ldexp(c(eps), -e - g))
    return out, g


def underflow_rows(den_eff: np.ndarray, phi_q: np.ndarray, k_sum: np.ndarray, positive: bool,
                    features: tuple | None = None) -> np.ndarray:
    """The rows (B, h, N) whose (rescaled) normaliser is 0 although the exact one is > 0, float64 only (a
    lower-precision run underflows as its format does): features whose map is positive (``positive``: ELU + 1,
    softmax, whose exp is > 0 but underflowed inside a group, which powers of two cannot undo), or
    non-negative features with a term phi_q_c k_sum_c whose two factors are nonzero (the product underflowed:
    non-negative terms cannot cancel).  A zero normaliser of signed features, or of non-negative ones whose
    every term has a zero factor (a dead ReLU row with eps = 0), is the mathematics' own 0/0 and keeps IEEE's
    NaN (docs/guarantees.md).

    With ``positive`` and ``features`` = (phi(Q), phi(K)) as computed (unscaled) also the rows whose direct
    result may be inaccurate although finite: a feature below 2^-1022 (exp underflowed to a subnormal or 0,
    in the row or anywhere in the head's keys: its true weight may dominate a channel where the others are
    small) or a rescaled normaliser below 2^-960 (its products may have underflowed).  None of this occurs for
    inputs inside the band (ELU + 1 of x >= -177 is >= 2^-256), whose rows are never taken."""
    zero = den_eff == 0
    if den_eff.dtype != np.float64:
        return np.zeros(den_eff.shape, dtype=bool)
    if positive:
        if features is None:
            return zero
        tiny = 2.0 ** np.finfo(np.float64).minexp
        with np.errstate(invalid="ignore"):
            return (zero | (den_eff < 2.0 ** -960) | np.any(features[0] < tiny, axis=-1)
                    | np.any(features[1] < tiny, axis=(-2, -1))[..., None])
    if not np.any(zero):
        return np.zeros(den_eff.shape, dtype=bool)
    nonneg = np.all(phi_q >= 0, axis=-1) & np.all(k_sum >= 0, axis=-1)[..., None]
    term = np.any((phi_q > 0) & (k_sum > 0)[..., None, :], axis=-1)
    return zero & nonneg & term


def log_features(x: np.ndarray, name: str, opts: Mapping[str, Any],
                 phi: np.ndarray | None = None) -> np.ndarray | None:
    """log phi(x) of a non-negative map (-inf where phi = 0) without exp's underflow: ELU + 1 as x (x <= 0) or
    log1p(x) (Eq. R2); softmax as the log-softmax (x - max) - log sum exp(x - max); ReLU as log max(x, 0) and
    L1 (base "relu") as log of its computed features ``phi`` (exact maps, or quotients of them, whose values do
    not underflow; None for L1 without ``phi``).  None for the signed maps."""
    if name == "elu1":
        return np.where(x > 0, np.log1p(np.maximum(x, 0.0)), x)
    if name == "softmax":
        axis = int(opts.get("axis", -1))
        with np.errstate(invalid="ignore"):
            y = x - np.max(x, axis=axis, keepdims=True)
            return y - np.log(np.sum(np.exp(y), axis=axis, keepdims=True))
    if name == "relu" or (name == "l1" and opts.get("base", "relu") == "relu" and phi is not None):
        with np.errstate(divide="ignore"):
            return np.log(numerics.relu(x) if phi is None else phi)
    return None


def rebalanced_output(lq: np.ndarray, lk: np.ndarray, v_s: np.ndarray, e_v: np.ndarray, *, eps: float,
                       eps_policy: str, clamp_min: float | None, stage: str, pairs: Any = False,
                       rotate: Any = None, want_attn: bool = False) -> Any:
    """The normalised output from log-features, where the normaliser of the direct computation underflowed to
    0 (a row of ELU + 1 features meeting keys whose features are far below float64 in the channels
    where the row's are not; saturated softmax features; products of non-negative features below 2^-1074).

    Eq. 4 is invariant when channel c of phi(Q) is multiplied and the same channel of phi(K) divided by a
    positive a_c (the products phi(Q_i)_c phi(K_j)_c are unchanged), and under positive scaling of a row of
    phi(Q) with eps and clamp_min scaled along.  With lq = log phi(Q), lk = log phi(K) (-inf for 0):
    m_c = max_j lk_jc (per channel pair for RoPE where ``pairs`` says so, :func:`shared_max`: a rotation by angles
    that differ between tokens mixes the pair, so both channels take one factor; a pair at angle 0 for every
    token is not rotated, cos 0 = 1 and sin 0 = 0 exactly, and keeps one factor per channel), phi_k' = exp(lk - m),
    a = lq + m, r_i = max_c a_ic and phi_q' = exp(a - r): every product exp(lq_ic + lk_jc) = exp(r_i) phi_q'_ic
    phi_k'_jc, the largest of each factor is 1 and the normaliser phi_q' . sum_j phi_k' is >= 1 (with shared
    pairs not necessarily: a channel's own key maximum may lie far below its pair's; where it lies beyond
    float64's range the normaliser may underflow, and the pair's rotated cross terms then exceed it by as much,
    so that the exact result is beyond float64 unless the rotation cancels them, as it does for keys at the
    query's own angle).  exp(r_i) = f 2^s (numerics.exp_pow2_split) multiplies numerator and normaliser once
    (f) and scales the policy's constants (2^s, :func:`normaliser_scaled`); ``v_s`` is V
    2^-e_v.  ``rotate``: None, or (rot_q, rot_k) applied to phi_q' and phi_k' before the numerator (RALA's
    RoPE).  An output beyond float64 raises FloatingPointError naming ``stage``.  Each exp rounds once more
    than the direct path; used only where that path has no result.  ``want_attn``: also the N x M matrix
    (pairs (out, attn))."""
    pq, pk, f, s = rebalance_factor(lq, lk, pairs)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        nq, nk = (pq, pk) if rotate is None else (rotate[0](pq), rotate[1](pk))
        num = nq @ (nk.swapaxes(-1, -2) @ v_s)
        den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
        num, den = num * f, den * f[..., 0]
    den_eff, g = normaliser_scaled(den, s[..., 0], eps=eps, eps_policy=eps_policy, clamp_min=clamp_min)
    out = quotient(num, den_eff[..., None], e_v - g[..., None], stage)
    if not want_attn:
        return out
    with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
        attn = np.ldexp((nq @ nk.swapaxes(-1, -2)) * f / den_eff[..., None], -g[..., None])
    return out, attn


def shared_max(m: np.ndarray, pairs: Any) -> np.ndarray:
    """m (..., d) with each channel pair (2t, 2t+1) marked in ``pairs`` given the larger of its two entries (both
    channels of a pair that a rotation mixes take one factor, normaliser_range's R1); ``pairs`` False (no pair),
    True (every pair) or a bool array (d / 2,)."""
    if pairs is None or (np.ndim(pairs) == 0 and not pairs):
        return m
    top = np.repeat(np.max(m.reshape(*m.shape[:-1], -1, 2), axis=-1), 2, axis=-1)
    if np.ndim(pairs) == 0:
        return top
    return np.where(np.repeat(np.asarray(pairs, dtype=bool), 2), top, m)


def rebalance_parts(lq: np.ndarray, lk: np.ndarray, pairs: Any) -> tuple:
    """(phi_q', phi_k', r, lq*, m*) of :func:`rebalance`, with r = lq* + m* (the row's largest channel c*).
    ``pairs``: False, True (every channel pair (2t, 2t+1) shares its factor m) or a bool array over the pairs
    (d / 2,) marking those that share it (:func:`shared_max`).
    phi_q' = exp((lq - lq*) + (m - m*)): the differences are formed first (exact by Sterbenz's lemma for the
    channels within a factor 2 of c*'s, the ones that matter), so phi_q' does not carry the rounding of
    lq + m, whose absolute error u |r| would be a relative error u |r| of each feature (|r| ~ 700 where exp
    underflows)."""
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        m = shared_max(np.max(lk, axis=-2, keepdims=True), pairs)          # (B,h,1,d)
        keyed = np.isfinite(m)                         # a channel where every key is 0 (-inf) adds no product:
        m = np.where(keyed, m, 0.0)                    # it takes no part in r and its phi_q' is 0 (else r could
        pk = np.exp(lk - m)                            # pick it and leave a subnormal normaliser)
        a = np.where(keyed, lq + m, -np.inf)
        top = np.argmax(np.where(np.isnan(a), -np.inf, a), axis=-1)[..., None]
        lq_t = np.take_along_axis(lq, top, axis=-1)
        m_t = np.take_along_axis(np.broadcast_to(m, a.shape), top, axis=-1)
        r = np.max(a, axis=-1, keepdims=True)
        ok = np.isfinite(r)
        r = np.where(ok, r, 0.0)
        pq = np.where(ok, np.exp((lq - np.where(ok, lq_t, 0.0)) + (m - np.where(ok, m_t, 0.0))), np.exp(a - r))
        pq = np.where(keyed, pq, 0.0)
        return pq, pk, r, np.where(ok, lq_t, 0.0), np.where(ok, m_t, 0.0)


def rebalance(lq: np.ndarray, lk: np.ndarray, pairs: Any = False) -> tuple:
    """(phi_q', phi_k', r) of :func:`rebalanced_output` from log-features: m_c = max_j lk_jc (per channel pair
    with ``pairs``), phi_k' = exp(lk - m), a = lq + m, r_i = max_c a_ic, phi_q' = exp(a - r) (formed as
    :func:`rebalance_parts` says), so that phi(Q_i)_c phi(K_j)_c = exp(r_i) phi_q'_ic phi_k'_jc with the largest
    of each factor 1."""
    return rebalance_parts(lq, lk, pairs)[:3]


def rebalance_factor(lq: np.ndarray, lk: np.ndarray, pairs: Any = False, *, with_errors: bool = False) -> tuple:
    """(phi_q', phi_k', f, s) with exp(r_i) = f 2^s (s an int array, (B, h, N, 1)): :func:`rebalance`, and the
    factor as exp(lq*) exp(m*) of the row's largest channel (numerics.exp_pow2_split of each: f = f_1 f_2 in
    [1/2, 2], s = s_1 + s_2), so that f carries exp's accuracy (one rounding more) but not the rounding of
    r = lq* + m*: numerator and normaliser share f, but an eps or clamp_min does not, and there an error
    u |r| of f would be one of the output.  ``with_errors``: also (arg_q, arg_k) of :func:`argument_errors`."""
    pq, pk, _, lq_t, m_t = rebalance_parts(lq, lk, pairs)
    f1, s1 = numerics.exp_pow2_split(lq_t, axis=-1)
    f2, s2 = numerics.exp_pow2_split(m_t, axis=-1)
    if with_errors:
        return (pq, pk, f1 * f2, s1 + s2) + argument_errors(lq, lk, lq_t, m_t, pairs)
    return pq, pk, f1 * f2, s1 + s2


def argument_errors(lq: np.ndarray, lk: np.ndarray, lq_t: np.ndarray, m_t: np.ndarray,
                    pairs: Any = False) -> tuple[np.ndarray, np.ndarray]:
    """(arg_q, arg_k): the absolute errors, in units of u (first order), of the exp arguments of the rebalanced
    features as :func:`rebalance_parts` forms them from ``lq``, ``lk`` and its ``lq_t`` = lq*, ``m_t`` = m*:
    phi_q' = exp((lq - lq*) + (m - m*)) rounds the two differences and their sum, |lq - lq*| + |m - m*| +
    |(lq - lq*) + (m - m*)|, and phi_k' = exp(lk - m) the one difference, |lk - m| (m the keys' per-channel max,
    :func:`shared_max` with ``pairs``), each charged only where it may round (:func:`_difference_rounding`:
    not where an operand is 0 or the two lie within a factor 2, Sterbenz's lemma).  An argument that errs by
    delta u makes exp's result err relatively by e^(delta u) - 1 ~ delta u: for a feature far below its row's
    largest (|lq - lq*| ~ 600, a relative error up to 512 u) the charge is what keeps the bound safe where that
    feature meets the only large values of V.  The logs' own errors (the maps' error ratios,
    :func:`log_error`) are the caller's."""
    m = shared_max(np.max(lk, axis=-2, keepdims=True), pairs)
    with np.errstate(invalid="ignore"):
        m = np.where(np.isfinite(m), m, 0.0)
        dq, dm = lq - lq_t, m - m_t
        arg_q = _difference_rounding(lq, lq_t) + _difference_rounding(m, m_t) + _difference_rounding(dq, -dm)
        arg_k = _difference_rounding(lk, m)
    return arg_q, arg_k


def _difference_rounding(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x - y| where fl(x - y) may round (its error is at most u |x - y|), 0 where it is exact: an operand 0,
    or x and y of one sign with |y| / 2 <= |x| <= 2 |y| (Sterbenz's lemma; Higham (2002) Thm. 2.5).  inf or NaN
    where an operand is infinite (a feature of 0, which the callers mask)."""
    with np.errstate(invalid="ignore", over="ignore"):
        ax, ay = np.abs(x), np.abs(y)
        exact = (x == 0) | (y == 0) | ((np.sign(x) == np.sign(y)) & (ay <= 2 * ax) & (ax <= 2 * ay))
        return np.where(exact & np.isfinite(x) & np.isfinite(y), 0.0, np.abs(x - y))


def log_error(x: np.ndarray, name: str, opts: Mapping[str, Any]) -> np.ndarray | None:
    """The absolute error of :func:`log_features` as computed, in units of u (first order; logs and exps within
    c = ``config.ELEMENTARY_FUNCTION_ULPS`` ulps of their results): ELU + 1 0 for x <= 0 (the log is x itself)
    and c |lq| for x > 0 (log1p); ReLU c |lq| (log); softmax, lq = fl(y - L) with y = fl(x - max) and
    L = log sum exp(y): y errs by e_y = |y| where the difference may round (:func:`_difference_rounding`), each
    exp(y_c) relatively by that plus c, the sum S relatively by w + c + n - 1 (w = sum_c softmax_c e_y_c, n - 1
    additions), so L absolutely by
    w + c + n - 1 + c |L|, and the final difference adds |lq|.  None for the other maps (L1's logs are those of
    its computed quotients, whose errors are not tracked here).  A recomputed feature exp(rebalanced lq) errs
    relatively by this, its argument's roundings (:func:`argument_errors`) and exp's own c."""
    c_elem = float(config.ELEMENTARY_FUNCTION_ULPS)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if name == "elu1":
            return np.where(x > 0, c_elem * np.log1p(np.maximum(x, 0.0)), 0.0)
        if name == "relu":
            return np.where(x > 0, c_elem * np.abs(np.log(np.maximum(x, 0.0))), 0.0)
        if name == "softmax":
            axis = int(opts.get("axis", -1))
            top = np.max(x, axis=axis, keepdims=True)
            y = x - top
            e_y = _difference_rounding(x, top)
            phi = np.exp(y)
            big_l = np.log(np.sum(phi, axis=axis, keepdims=True))
            phi = phi / np.sum(phi, axis=axis, keepdims=True)
            w = np.sum(np.where(phi > 0, phi * e_y, 0.0), axis=axis, keepdims=True)
            return e_y + w + c_elem + x.shape[axis] - 1 + c_elem * big_l + _difference_rounding(y, big_l)
    return None


def normalised_up(phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray, *, eps: float, eps_policy: str,
                   clamp_min: float | None, stage: str) -> np.ndarray:
    """Eq. 4 (linear order) with each row of phi_q, each head's phi_k and each column of v scaled by the exact
    power of two that brings its largest magnitude into [1/2, 1) (tiny and subnormal groups up, exact), eps and
    clamp_min along (:func:`normaliser_scaled`): for the rows whose direct normaliser is 0 as computed."""
    def expo(x: np.ndarray, axis: Any) -> np.ndarray:
        m = np.max(np.abs(x), axis=axis, keepdims=True)
        return np.where(np.isfinite(m) & (m > 0), np.frexp(m)[1], 0).astype(np.int64)
    e_q, e_k, e_v = expo(phi_q, -1), expo(phi_k, (-2, -1)), expo(v, -2)
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        pq, pk, vs = np.ldexp(phi_q, -e_q), np.ldexp(phi_k, -e_k), np.ldexp(v, -e_v)
        num = pq @ (pk.swapaxes(-1, -2) @ vs)
        den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
    den_eff, g = normaliser_scaled(den, (e_q + e_k)[..., 0], eps=eps, eps_policy=eps_policy, clamp_min=clamp_min)
    return quotient(num, den_eff[..., None], e_v - g[..., None], stage)


def underflow_error(hit: np.ndarray, stage: str) -> FloatingPointError:
    """FloatingPointError naming ``stage`` and the first row of ``hit`` whose normaliser underflows to 0 although
    the exact one is > 0 and that even log-features cannot recompute."""
    idx = tuple(int(i) for i in np.argwhere(hit)[0])
    return FloatingPointError(f"{stage}: the normaliser at index {idx} underflows to 0 although the exact one is > 0 "
                              f"(feature-map weights below the float64 range); the result is not computable here")


def log_pair(q: np.ndarray, k: np.ndarray, name: str, opts: Mapping[str, Any], phi_q: np.ndarray | None = None,
             phi_k: np.ndarray | None = None) -> tuple | None:
    """(log phi(q), log phi(k)) of :func:`log_features` (``phi_q``, ``phi_k``: the computed features, which
    L1 needs), or None for the signed maps."""
    lq = log_features(q, name, opts, phi_q)
    return None if lq is None else (lq, log_features(k, name, opts, phi_k))
