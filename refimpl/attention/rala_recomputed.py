"""RALA's error bound on the rows the core recomputes from log-features (rala_core.recomputed_rows: the direct
normaliser underflows although the exact one is > 0; normaliser_range.rebalanced_output recomputes them),
without RoPE (the paper preset: normalised linear attention on rebalanced features) and with it (the official
preset: a rotated numerator over the unrotated normaliser): one derivation, :func:`_rows_error`.

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_01b0ccc7f7225e8b.txt), Eq. 2-4 (the computation bounded); Su et al., RoFormer (2021),
Eq. 34 (the rotation); Higham (2002) eq. 2.8, Lemma 3.1; W. J. Cody and W. Waite (1980), ch. 6 (exp's
reduction, numerics.exp_pow2_split).

Layer: attention: imports bounds, config, :mod:`.normaliser_range` (the recomputation's features) and
:mod:`.rala_core` (the configuration, the RoPE angles and rotation), nothing from :mod:`.rala_bounds`, which
imports it (:func:`recomputed_error` from ``rala_core_bound``, given alpha's error bound from its
``_alpha_error``), or from :mod:`.rala`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import bounds, config, numerics
from .normaliser_range import argument_errors, log_features, rebalance_parts, shared_max
from .rala_core import RALAConfig, apply_rope_2d, rope_2d_angles, rope_shared_pairs

__all__: list[str] = []

def recomputed_error(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                     alpha: np.ndarray, ealpha: np.ndarray | None, cfg: RALAConfig, hw: tuple[int, int] | None,
                     pr: bounds.Precision) -> np.ndarray:
    """E (B, h, N, d) with the rows ``hit`` (B, h, N) given the bound of their recomputation from log-features,
    every other element ``e`` (the direct model's bound) unchanged.  q, k, v (B, h, N, d) float64 as
    rala_core's; ``alpha`` (B, h, N) Eq. 4's coefficients the core uses (rala_core.recomputed_rows) and
    ``ealpha`` their absolute error bound (rala_bounds._alpha_error; None without reweighting); ``hw`` the grid
    (RoPE); ``pr`` the tested precision.  The derivation: :func:`_rows_error`.  In a precision T other than
    float64 no evaluation recomputes (normaliser_range.underflow_rows takes no rows there; the reference's own
    float64 error is Bound.ref_scale's): ``e``, the direct evaluation's bound, unchanged (inf where it has none,
    e.g. where its products overflow T)."""
    if not np.any(hit) or pr.dtype != "float64":
        return e
    return _rows_error(e, hit, q, k, v, alpha, ealpha, cfg, hw, pr)


def _log_args(q: np.ndarray, k: np.ndarray, alpha: np.ndarray, log_s: float, cfg: RALAConfig, pairs: Any) -> tuple:
    """(lq, log kappa(K), lk, phi_q', phi_k', r, lq*, m*, arg_q, arg_k): the rebalanced features as
    normaliser_range.rebalance_parts forms them (``pairs``: the RoPE channel pairs that share one factor m,
    normaliser_range.shared_max) and the absolute
    errors of their exp arguments (units of u, first order), lq = log kappa(Q) and lk = log kappa(K) + (log alpha +
    log s) as rala_core._finish forms them.  The logs err by c |lq| (log1p for x > 0, log for relu; elu1's
    x <= 0 is its own log, exact), c |log kappa(K)| likewise, c |log alpha| (of the computed alpha; alpha's own
    error is E_alpha's), c |log s| + 1 (the rounded 1/N), and the two sums round by |log alpha + log s| and |lk|
    (none where an addend is 0).  phi_k' = exp(lk - m) adds |lk - m|; phi_q' = exp((lq - lq*) + (m - m*)) the
    roundings of the two differences and of their sum, |lq - lq*| + |m - m*| + |(lq - lq*) + (m - m*)|, each
    where it may round (normaliser_range.argument_errors: not within a factor 2, Sterbenz) (m, lq*,
    m* and r = lq* + m* are the computed floats, exact and consistent rescalings: only lq's and lk's own errors
    and the roundings of the arguments as formed reach the features)."""
    c, elu1 = float(config.ELEMENTARY_FUNCTION_ULPS), cfg.kernel == "elu1"
    lq, lkk = log_features(q, cfg.kernel, {}), log_features(k, cfg.kernel, {})
    log_alpha = np.log(alpha)[..., None]
    t1 = log_alpha + log_s
    lk = lkk + t1
    err_lq = np.where(elu1 & (q <= 0), 0.0, c * np.abs(lq))
    err_lk = (np.where(elu1 & (k <= 0), 0.0, c * np.abs(lkk)) + c * np.abs(log_alpha)
              + ((c * abs(log_s) + 1.0) if log_s else 0.0)
              + np.where((log_alpha != 0) & (log_s != 0), np.abs(t1), 0.0)
              + np.where(t1 != 0, np.abs(lk), 0.0))
    pq, pk, r, lq_t, m_t = rebalance_parts(lq, lk, pairs)
    arg_q, arg_k = argument_errors(lq, lk, lq_t, m_t, pairs)
    return lq, lkk, lk, pq, pk, r, lq_t, m_t, err_lq + arg_q, err_lk + arg_k


def _either_path(e: np.ndarray, fix: np.ndarray) -> np.ndarray:
    """The float64 bound of a recomputed row given the direct model's ``e`` and the recomputation's ``fix``:
    either path may be the tested one (the definition recomputes, a twin or the C kernel keeps a finite direct
    result), so the larger where ``e`` is finite, else ``fix``."""
    return np.where(np.isfinite(e), np.maximum(e, fix), fix)


def _alpha_terms(lq: np.ndarray, lkk: np.ndarray, r: np.ndarray, log_s: float, ealpha: np.ndarray,
                 av: np.ndarray, pairs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(A_num (B, h, N, e), A_D (B, h, N)): the exact change of the rebalanced numerator and normaliser when the
    keys' weights move by at most E_alpha_j (``ealpha``, also where alpha~_j underflowed to 0), both linear in
    the keys: A_num = sum_j sum_t ||x_it|| ||y_jt|| |V_j| over the RoPE pairs t marked in ``pairs``
    (normaliser_range.shared_max; a rotated pair's inner product is at most the product of the pair norms) plus
    sum_j sum_c |x_ic| |y_jc| |V_j| over the other channels (not rotated), A_D = sum_j x_i . y_j, with
    x = kappa(Q_i) exp(-r_i) and y_j = s E_alpha_j kappa(K_j), each formed from its logs with a shift t_c per
    channel (one per marked pair) that cancels in each product; ``av`` = |V| in the numerator's units."""
    la = np.log(ealpha)[..., None] + log_s + lkk
    t = shared_max(np.max(la, axis=-2, keepdims=True), pairs)
    t = np.where(np.isfinite(t), t, 0.0)
    xq, yk = np.exp(lq - r + t), np.exp(la - t)
    a_d = np.einsum("bhnd,bhd->bhn", xq, np.sum(yk, axis=-2))
    if np.ndim(pairs) == 0 and not pairs:       # no rotation (d may be odd)
        return xq @ (yk.swapaxes(-1, -2) @ av), a_d
    mark = np.broadcast_to(np.asarray(pairs, dtype=bool), (lq.shape[-1] // 2,))
    lone = ~np.repeat(mark, 2)
    xn = np.concatenate([_pairs(xq)[..., mark], xq[..., lone]], axis=-1)
    yn = np.concatenate([_pairs(yk)[..., mark], yk[..., lone]], axis=-1)
    return xn @ (yn.swapaxes(-1, -2) @ av), a_d


def _shrunk_normaliser(pq: np.ndarray, pk: np.ndarray, alpha: np.ndarray, ealpha: np.ndarray) -> np.ndarray:
    """phi_q' . sum_j (1 - E_alpha_j / alpha_j)^+ phi_k'_j: the rebalanced normaliser with every key's weight
    lowered to max(alpha_j - E_alpha_j, 0) <= the exact alpha_j (a key whose alpha~_j is 0 contributes 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(alpha > 0, np.maximum(1.0 - ealpha / alpha, 0.0), 0.0)[..., None]
    return np.einsum("bhnd,bhd->bhn", pq, np.sum(pk * shrink, axis=-2))


def _pairs(x: np.ndarray) -> np.ndarray:
    """The Euclidean norm of each RoPE channel pair (2t, 2t+1) of the last axis: (..., d / 2)."""
    return np.hypot(x[..., 0::2], x[..., 1::2])


def _rows_error(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                ealpha: np.ndarray | None, cfg: RALAConfig, hw: tuple[int, int] | None,
                pr: bounds.Precision, spread_of: np.ndarray | None = None) -> np.ndarray:
    """:func:`recomputed_error`: E of the rows ``hit`` as normaliser_range.rebalanced_output computes them
    (rala_core._finish: with RoPE ``pairs=True`` and ``rotate`` = RoPE of the token's angle).  ``spread_of``:
    values (B, h, M, d) whose per-column range stands in for V's in the alpha term's width (default V;
    rala_module_recomputed passes the interval V may lie in).

    The computation.  With lq = log kappa(Q), lk = log kappa(K) + (log alpha + log s) (s = 1/N "mean", 1 "sum"),
    m_c = max_j lk_jc (with RoPE taken per channel pair: both channels of a pair share it, since a rotation mixes
    the pair and commutes with a common factor only), c* the row's channel of largest lq + m, lq* = lq_ic*,
    m* = m_c* and r = lq* + m* (normaliser_range.rebalance_parts; a channel, or pair, where every key is 0 takes
    no part and has phi_q' = 0): phi_q'_ic = exp((lq_ic - lq*) + (m_c - m*)), phi_k'_jc = exp(lk_jc - m_c), so
    that kappa(Q_i)_c s alpha_j kappa(K_j)_c = exp(r) phi_q'_ic phi_k'_jc for any such constants m, lq*, m* (the
    computed floats are exact, consistent rescalings; RoPE's rotation R commutes with the pair factor);
    numerator N_i = R_i phi_q'_i (sum_j (R_j phi_k'_j)^T V_j) (linear order; R = 1 without RoPE), normaliser
    D_i = phi_q'_i . sum_j phi_k'_j (unrotated, RALA Eq. 2), exp(r) = f 2^s (exp(lq*) and exp(m*) each by
    Cody-Waite), and the output (N f) / ((D f) 2^-g + eps 2^(-s-g)) 2^(e_v - g) (normaliser_range.
    normaliser_scaled and quotient; V 2^-e_v).  Dividing numerator and normaliser by f: O = N / (D + rho) 2^e_v,
    rho = eps exp(-r).  Without RoPE D >= 1 (phi_q'_ic* = 1 meets the key of phi_k'_jc* = 1); with it not
    necessarily (the pair factor is the pair's largest key; channel c*'s own may be smaller), so the bound
    divides by the computed D + rho less its error, and no bound (inf) where that is <= 0.

    Feature errors (units of u, first order in the arguments, exp's rule exp(x)(exp(dx)(1 + c u) - 1) + c eta):
    the arguments' errors as formed (:func:`_log_args`).
    f errs by at most (2c + 4) u: each factor's reduced argument (x - s ln2_hi exact, s ln2_lo and the
    difference rounded: below u absolute) and exp's c ulps, and their product; f cancels between numerator and
    normaliser except against eps: rho errs relatively by gamma_(2c+5).

    The rotation (RoPE).  Entry 2t of R x is x_2t cos - x_2t+1 sin (2t+1 alike), cos and sin of the float64 table,
    |cos~ - cos|, |sin~ - sin| <= tau = u |entry| + eta + gamma_R(u_64)(1 + |theta|) (rala_bounds._e_rope,
    R = config.RALA_ROPE_TABLE_ULPS).  A rotation preserves each pair's norm and |x_a| |cos| + |x_b| |sin| <=
    ||x_t|| (Cauchy-Schwarz, cos^2 + sin^2 = 1), so for computed features x~ with |x~ - x| <= E_x:
    |fl(R~ x~) - R x| <= (gamma_2 (1 + sqrt2 tau) + sqrt2 tau) ||x~_t|| + ||E_x,t|| + 3 eta (two products and
    their difference; the table; the features' errors through the exact rotation).  The numerator is then a
    three-factor contraction of the (rotated) features and V (refimpl.bounds.e_contract3: gamma_(M+d) on
    the magnitudes, the propagated errors and the products' underflow), the normaliser a non-negative one
    (bounds.e_contract), before the product by f (one rounding each, eta / f <= 2 eta).

    The quotient.  b = D + rho with E_b = E_D (1 + u) + u D (the product by f) + u (D + rho) (the addition of
    eps) + gamma_(2c+5) rho (f against eps) + eta terms (2 eta each for the two products' and the scaled eps's
    underflow, 6 eta b for normaliser_scaled's 2^-g frame); E_a = E_N + u (|N| + E_N) + 2 eta; then
    E_O = 2^e_v [(1 + gamma_1)(E_a + |y| E_b) / (b - E_b) + gamma_1 |y|] + 2 eta (the division; the scaled-back
    result's rounding into the subnormal range, normaliser_range.quotient rounding once), with y = N / b.  A
    huge rho (eps beside exp(r) below float64) is carried as rho 2^-kk with b, E_b (kk = floor(log2 rho)) and
    2^-kk joins the final exponent, so the bound stays finite where the output is; a row with lq* or m* below
    -2^29 (exp_pow2_split's stand-in s = -2^30) and eps > 0 has an exact output below 2^-(7 10^8) and a
    computed one that underflows to 0: 2 eta.

    alpha.  The tested computation's keys carry its alpha~, |alpha~_j - alpha_j| <= E_alpha_j (rala_bounds.
    _alpha_error: alpha_j (fac - 1) + N (c + 3) eta_T (1 + alpha_j), the N-scaled eta_T of the softmax's exp
    terms included, so also where alpha~_j underflowed to 0 and the key left the recomputation: then the exact
    alpha_j <= E_alpha_j).  The rounding bound above is that of the computation with alpha~; through the exact
    output with alpha~, |O~ - O| <= E_O + |O(alpha~) - O(alpha)|.  Numerator and normaliser B = D + rho are
    linear in the weights, so O(alpha~) - O(alpha) = (N(alpha~) - N(alpha)) / B(alpha) + O(alpha~)(B(alpha) -
    B(alpha~)) / B(alpha), at most (A_N + |O(alpha~)| A_D) / B_low (:func:`_alpha_terms`: A_N = sum_j sum_t
    ||x_t|| ||y_jt|| |V_j| with x = kappa(Q_i) exp(-r), y_j = s E_alpha_j kappa(K_j), per pair with RoPE, whose
    rotated inner product is at most the product of the pair norms, per channel without; A_D = x . sum_j y_j),
    with B_low = D(max(alpha~ - E_alpha, 0)) + rho - E_b <= B(alpha) (:func:`_shrunk_normaliser`: the keys whose
    alpha~ underflowed count 0, not -E_alpha, so that their eta-level error no longer meets the surviving keys'
    small weights: the subtraction that had left such rows without a bound) and |O(alpha~)| <= (|N| + E_a) / (b -
    E_b).  Without RoPE both outputs are convex combinations of the V_j times D / (D + eps) <= 1, so they lie in
    [min(0, min_j V_j), max(0, max_j V_j)] (without eps [min_j V_j, max_j V_j]) and differ by at most that
    width: the smaller (and the width where B_low <= 0).  With RoPE |O(alpha~)| + |O(alpha)| <= (|N| + E_a) /
    (b - E_b) + (|N| + E_a + A_N) / B_low is the other candidate.  Where the eta-level E_alpha of an underflowed
    key outweighs the surviving keys' terms the model allows that key to dominate (an exp within c ulps may
    return c eta_T), and without RoPE
    the bound is that width: honest under the model, loose against a libm whose exp returns 0 there.

    Where the direct E is finite too the larger (either path may be the tested one, :func:`_either_path`).  NaN
    (no bound follows) is inf.  Tested against 60-digit mpmath (tests/test_range_bounds.py, item 5;
    tests/test_rala_underflow.py)."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    u, eta = pr.u, pr.eta
    n_k, d = k.shape[-2], k.shape[-1]
    mean = cfg.token_scaling == "mean"
    log_s = math.log(1.0 / n_k) if mean else 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base) if cfg.rope else None
        shared = rope_shared_pairs(ang) if cfg.rope else False       # as rala_core passes it
        lq, lkk, _, pq, pk, r, lq_t, m_t, arg_q, arg_k = _log_args(q, k, alpha, log_s, cfg, shared)
        ep = lambda x, arg: np.where(x > 0, x * (np.exp(u * arg) * (1 + c * u) - 1.0), 0.0) + c * eta
        e_pq, e_pk = ep(pq, arg_q), ep(pk, arg_k)

        if cfg.rope:    # the rotation of the rebalanced features
            t_err = (numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64"))
                     * (1.0 + np.abs(ang)))
            tau = np.maximum(np.abs(np.cos(ang)), np.abs(np.sin(ang))) * u + eta + t_err        # (N, d)
            s2 = math.sqrt(2.0)
            grow = np.repeat((pr.g(2) * (1 + s2 * tau) + s2 * tau)[:, 0::2], 2, axis=-1)
            rot_err = lambda x, ex: (grow * np.repeat(_pairs(x), 2, axis=-1) + np.repeat(_pairs(ex), 2, axis=-1)
                                     + 3 * eta)
            nq, nk = apply_rope_2d(pq, ang), apply_rope_2d(pk, ang)
            turned = ang != 0                       # a token's pair at angle 0 is not rotated (cos 1, sin 0: exact)
            e_nq, e_nk = np.where(turned, rot_err(pq, e_pq), e_pq), np.where(turned, rot_err(pk, e_pk), e_pk)
        else:
            nq, nk, e_nq, e_nk = pq, pk, e_pq, e_pk

        # V 2^-e_v as the core scales it (a column scaled down may underflow: eta per entry)
        e_v = numerics.pow2_exponent(v, axis=-2, scale_up=True)
        v_s = np.ldexp(v, -e_v)
        ev_s = np.where((e_v > 0) & (v != 0), eta, 0.0)

        num = nq @ (nk.swapaxes(-1, -2) @ v_s)
        e_num = bounds.e_contract3("bhia,bhja,bhje->bhie", nq, e_nq, nk, e_nk, v_s, ev_s,
                                   pr.sums(n_k) + pr.sums(d), n_k * d, pr)
        den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
        e_den = bounds.e_contract("bhia,bhja->bhi", pq, e_pq, pk, e_pk, pr.sums(n_k) + pr.sums(d), n_k * d, pr)
        if ealpha is not None:  # alpha~ against alpha: exact in the keys (linear), pair norms bound the rotation
            a_num, a_d = _alpha_terms(lq, lkk, r, log_s, ealpha, np.abs(v_s), shared)
            den_lo = _shrunk_normaliser(pq, pk, alpha, ealpha)

        # the normaliser with eps, in a frame 2^-kk where rho is huge
        stand_in = lambda x: numerics.exp_pow2_split(x, axis=-1)[1] == numerics._EXP_SPLIT_FLOOR
        far = (stand_in(lq_t) | stand_in(m_t))[..., 0] & (cfg.eps > 0)
        if cfg.eps:
            lrho = math.log(cfg.eps) - (lq_t + m_t)[..., 0]
            kk = np.where(lrho > 0, np.floor(lrho / math.log(2.0)), 0.0)
            kk = np.where(np.isfinite(kk), np.minimum(kk, 2.0 ** 30), 0.0).astype(np.int64)
            rho = np.exp(lrho - kk * math.log(2.0))
        else:
            kk, rho = np.zeros(den.shape, dtype=np.int64), 0.0
        d_k, ed_k = np.ldexp(den, -kk), np.ldexp(e_den, -kk)
        b = d_k + rho
        e_b = ed_k * (1 + u) + u * d_k + np.ldexp(2 * eta, -kk) + 6 * eta * b
        if cfg.eps:
            e_b = e_b + u * (d_k + ed_k + rho) + pr.g(2 * c + 5) * rho + np.ldexp(2 * eta, -kk)
        e_a = e_num + u * (np.abs(num) + e_num) + 2 * eta
        low = (b - e_b)[..., None]
        y = np.abs(num) / b[..., None]
        g1 = pr.g(1)
        inner = (1 + g1) * (e_a + y * e_b[..., None]) / low + g1 * y
        if ealpha is not None:  # |O(alpha~) - O(alpha)| in the same frame (docstring, "alpha")
            b_lo = (np.ldexp(den_lo, -kk) + rho - e_b)[..., None]
            y_up = np.where(low > 0, (np.abs(num) + e_a) / low, np.inf)
            if cfg.rope:
                shift = np.fmin((a_num + y_up * np.ldexp(a_d, -kk)[..., None]) / b_lo,
                                y_up + (np.abs(num) + e_a + a_num) / b_lo)
                shift = np.where(b_lo > 0, shift, np.inf)
            else:       # both outputs in [lo, hi] (convex combinations of V_j, times D / (D + eps) <= 1)
                sv = v_s if spread_of is None else np.ldexp(spread_of, -e_v)
                hi, lo = np.max(sv, axis=-2, keepdims=True), np.min(sv, axis=-2, keepdims=True)
                if cfg.eps:
                    hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)
                spread = np.ldexp(hi - lo, kk[..., None])
                shift = (a_num + np.max(np.abs(v_s), axis=-2, keepdims=True) * a_d[..., None]) / b_lo
                shift = np.where(b_lo > 0, np.fmin(shift, spread), spread)
            inner = inner + shift
        fix = np.ldexp(np.where(low > 0, inner, np.inf), e_v - kk[..., None]) + 2 * eta
        fix = np.where(far[..., None], 2 * eta, fix)
        fix = np.where(np.isnan(fix), np.inf, fix)
        fix = _either_path(e, fix)
    return np.where(hit[..., None], fix, e)
