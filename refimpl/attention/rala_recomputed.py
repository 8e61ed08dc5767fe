"""RALA's error bound on the rows the core recomputes from log-features (rala_core.recomputed_rows: the direct
normaliser underflows although the exact one is > 0; normaliser_range.rebalanced_output recomputes them),
without RoPE (the paper preset: normalised linear attention on rebalanced features, :func:`_plain_error`) and
with it (the official preset: a rotated numerator over the unrotated normaliser, :func:`_rope_error`).

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

import numpy as np

from .. import bounds, config, numerics
from .normaliser_range import log_features, rebalance, rebalance_parts
from .rala_core import RALAConfig, apply_rope_2d, rope_2d_angles

__all__: list[str] = []

def recomputed_error(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                     alpha: np.ndarray, ealpha: np.ndarray | None, cfg: RALAConfig, hw: tuple[int, int] | None,
                     pr: bounds.Precision) -> np.ndarray:
    """E (B, h, N, d) with the rows ``hit`` (B, h, N) given the bound of their recomputation from log-features,
    every other element ``e`` (the direct model's bound) unchanged.  q, k, v (B, h, N, d) float64 as
    rala_core's; ``alpha`` (B, h, N) Eq. 4's coefficients the core uses (rala_core.recomputed_rows) and
    ``ealpha`` their absolute error bound (rala_bounds._alpha_error; None without reweighting); ``hw`` the grid
    (RoPE); ``pr`` the tested precision.  Without RoPE :func:`_plain_error`, with it :func:`_rope_error`."""
    if not np.any(hit):
        return e
    if cfg.rope:
        return _rope_error(e, hit, q, k, v, alpha, ealpha, cfg, hw, pr)
    return _plain_error(e, hit, q, k, v, alpha, ealpha, cfg, pr)


def _plain_error(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                 ealpha: np.ndarray | None, cfg: RALAConfig, pr: bounds.Precision) -> np.ndarray:
    """E (B, h, N, d) with the rows ``hit`` (rala_core.recomputed_rows: the direct normaliser underflows, the
    core recomputes them from log-features) given the bound of that computation.  Without RoPE, Eq. 2 is
    normalised linear attention with features kappa(Q_i) and s alpha_j kappa(K_j) (s = 1/N "mean", 1 "sum"),
    rebalanced (normaliser_range.rebalance; log alpha_j + log s folded into the keys' logs) into phi_q', phi_k'
    with phi(Q_i)_c phi(K_j)_c = exp(r_i) phi_q'_ic phi_k'_jc; the output and the terms of kernelized attention's
    bound (linear.kernelized_attention_bound: ratios of sums of such products) are invariant, so that bound of
    phi_q', phi_k' applies, with relative error coefficients (units of u_T): c for exp (every phi' is an exp);
    alpha_j's absolute error E_alpha (``ealpha``, rala_bounds._alpha_error, valid where alpha_j underflowed to 0
    too) times s kappa(K_j) (its terms phi(Q_i) exp(-r_i) E_alpha s kappa(K_j) added to F_num, F_D directly) and 2 for
    k * softmax * N; with "mean" 2 more per side (N^(-1/2) and its product on K_j and on V_j,
    whose relative perturbation enters as the query's would); the exp arguments' roundings, first order
    (exp(x + dx) = exp(x)(1 + dx)): c |log phi|, c |log alpha|, |log alpha + log s| and |lk| for the logs and
    their sums, |lk - m|, |lq + m|, |lq + m - r| for the differences (the computed m and r are exact, consistent
    rescalings), 2 for exp(r) = f 2^s's two products.  eps in these units is rho_i = eps exp(-r_i); where rho
    is beyond float64 the output is below the underflow threshold and E = (k + 4) eta_T.  Otherwise
    E = gamma_k (S_num + F_num + |O| (S_D + F_D)) / D_low + underflow terms + (k + 4) eta_T, k = d + M + 2,
    D_low = S_D + rho - gamma_k (S_D + F_D) (inf where <= 0).  Where the direct E is finite too (a feature below
    2^-1022, not a zero normaliser), the larger: the tested computation may take either path (the C kernel
    keeps a finite direct result, the definition recomputes).  Where no bound follows (NaN) inf."""
    hit4 = hit[..., None]
    kernel = cfg.kernel
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    base = c + (2.0 if cfg.token_scaling == "mean" else 0.0)     # exp's c ulps; N^(-1/2) and its product
    log_s = math.log(1.0 / q.shape[-2]) if cfg.token_scaling == "mean" else 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_alpha = np.log(alpha)[..., None]
        lq, lkk = log_features(q, kernel, {}), log_features(k, kernel, {})
        lk = lkk + (log_alpha + log_s)
        pq, pk, r = rebalance(lq, lk)
        m = np.max(lk, axis=-2, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        a = lq + m
        coef_q = base + c * np.abs(lq) + np.abs(a) + np.abs(a - r) + 2.0
        coef_k = (base + (2.0 if cfg.reweight else 0.0) + c * (np.abs(lkk) + np.abs(log_alpha))
                  + np.abs(log_alpha + log_s) + np.abs(lk) + np.abs(lk - m))
        eq_ = np.where(pq > 0, coef_q * pq, 0.0)
        ek_ = np.where(pk > 0, coef_k * pk, 0.0)
        # kernelized attention's bound on phi_q', phi_k', eps in their units: rho_i = eps exp(-r_i)
        n_k, d = k.shape[-2], k.shape[-1]
        depth = pr.sums(d) + pr.sums(n_k) + 2
        gk = pr.g(depth)
        av = np.abs(v)
        kv_abs = pk.swapaxes(-1, -2) @ av
        s_num = pq @ kv_abs
        f_num = eq_ @ kv_abs + pq @ (ek_.swapaxes(-1, -2) @ av)
        ks = np.sum(pk, axis=-2)
        s_d = np.einsum("bhnd,bhd->bhn", pq, ks)
        f_d = np.einsum("bhnd,bhd->bhn", eq_, ks) + np.einsum("bhnd,bhd->bhn", pq, np.sum(ek_, axis=-2))
        if cfg.reweight:    # alpha_j's absolute error E_alpha s kappa(K_j) times phi(Q_i) exp(-r_i) (m cancels):
            la = np.log(ealpha)[..., None] + log_s + lkk          # shifted per channel by its own max t
            t = np.max(la, axis=-2, keepdims=True)
            t = np.where(np.isfinite(t), t, 0.0)
            ea_k, ea_q = np.exp(la - t) / pr.u, np.exp(lq - r + t)
            f_num = f_num + ea_q @ (ea_k.swapaxes(-1, -2) @ av)
            f_d = f_d + np.einsum("bhnd,bhd->bhn", ea_q, np.sum(ea_k, axis=-2))
        rho = np.exp(math.log(cfg.eps) - r[..., 0]) if cfg.eps else 0.0
        den = s_d + rho
        d_low = np.where(den > gk * (s_d + f_d), den - gk * (s_d + f_d), 0.0)
        q1 = np.sum(pq, axis=-1)[..., None]
        v1 = np.sum(av, axis=-2)[..., None, :]
        eta_num = pr.eta * (n_k * q1 + d * v1 + d + n_k + np.sum(kv_abs, axis=-2)[..., None, :] + q1 * v1)
        eta_den = pr.eta * (n_k * q1 + d * n_k + d + n_k + np.sum(ks, axis=-1)[..., None, None] + n_k * q1)
        o_abs = s_num / den[..., None]
        fix = ((gk * (s_num + f_num + o_abs * (s_d + f_d)[..., None]) + eta_num + o_abs * eta_den)
               / d_low[..., None] + (depth + 4) * pr.eta)
        big = np.isinf(den)[..., None]
        fix = np.where(big, (depth + 4) * pr.eta, np.where((d_low[..., None] == 0) | np.isnan(fix), np.inf, fix))
        fix = np.where(np.isfinite(e), np.maximum(e, fix), fix)
    return np.where(hit4, fix, e)


def _pairs(x: np.ndarray) -> np.ndarray:
    """The Euclidean norm of each RoPE channel pair (2t, 2t+1) of the last axis: (..., d / 2)."""
    return np.hypot(x[..., 0::2], x[..., 1::2])


def _rope_error(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                ealpha: np.ndarray | None, cfg: RALAConfig, hw: tuple[int, int], pr: bounds.Precision) -> np.ndarray:
    """:func:`recomputed_error` with RoPE: E of the rows ``hit`` as normaliser_range.rebalanced_output computes
    them (``pairs=True``, ``rotate`` = RoPE of the token's angle; rala_core._finish).

    The computation.  With lq = log kappa(Q), lk = log kappa(K) + (log alpha + log s) (s = 1/N "mean", 1 "sum"),
    m_c = max_j lk_jc taken per channel pair (both channels of a pair share it: a rotation mixes the pair, and it
    commutes with a common factor only), c* the row's channel of largest lq + m, lq* = lq_ic*, m* = m_c* and
    r = lq* + m* (normaliser_range.rebalance_parts; a pair where every key is 0 takes no part and has phi_q' = 0):
    phi_q'_ic = exp((lq_ic - lq*) + (m_c - m*)), phi_k'_jc = exp(lk_jc - m_c), so that
    kappa(Q_i)_c s alpha_j kappa(K_j)_c = exp(r) phi_q'_ic phi_k'_jc for any such constants m, lq*, m* (the
    computed floats are exact, consistent rescalings; RoPE's rotation R commutes with the pair factor);
    numerator N_i = R_i phi_q'_i (sum_j (R_j phi_k'_j)^T V_j) (linear order), normaliser D_i = phi_q'_i .
    sum_j phi_k'_j (unrotated, RALA Eq. 2), exp(r) = f 2^s (exp(lq*) and exp(m*) each by Cody-Waite), and the
    output (N f) / ((D f) 2^-g + eps 2^(-s-g)) 2^(e_v - g) (normaliser_range.normaliser_scaled and quotient;
    V 2^-e_v).  Dividing numerator and normaliser by f: O = N / (D + rho) 2^e_v, rho = eps exp(-r).  D is not
    >= 1 here (the pair factor is the pair's largest key; channel c*'s own may be smaller), so the bound divides
    by the computed D + rho less its error, and no bound (inf) where that is <= 0.

    Feature errors (units of u, first order in the arguments, exp's rule exp(x)(exp(dx)(1 + c u) - 1) + c eta):
    the logs err by c |lq| (log1p for x > 0, log for relu; elu1's x <= 0 is its own log, exact), likewise
    c |log kappa(K)|, c |log alpha| (of the computed alpha; alpha's own error is below), c |log s| + 1 (the
    rounded 1/N), and the two sums round by |log alpha + log s| and |lk| (none where an addend is 0); the
    arguments' differences round by |lk - m|, |lq - lq*|, |m - m*| and their sum's |(lq - lq*) + (m - m*)|.
    f errs by at most (2c + 4) u: each factor's reduced argument (x - s ln2_hi exact, s ln2_lo and the
    difference rounded: below u absolute) and exp's c ulps, and their product; f cancels between numerator and
    normaliser except against eps: rho errs relatively by gamma_(2c+5).

    The rotation.  Entry 2t of R x is x_2t cos - x_2t+1 sin (2t+1 alike), cos and sin of the float64 table,
    |cos~ - cos|, |sin~ - sin| <= tau = u |entry| + eta + gamma_R(u_64)(1 + |theta|) (rala_bounds._e_rope,
    R = config.RALA_ROPE_TABLE_ULPS).  A rotation preserves each pair's norm and |x_a| |cos| + |x_b| |sin| <=
    ||x_t|| (Cauchy-Schwarz, cos^2 + sin^2 = 1), so for computed features x~ with |x~ - x| <= E_x:
    |fl(R~ x~) - R x| <= (gamma_2 (1 + sqrt2 tau) + sqrt2 tau) ||x~_t|| + ||E_x,t|| + 3 eta (two products and
    their difference; the table; the features' errors through the exact rotation).  The numerator is then a
    signed three-factor contraction of the rotated features and V (refimpl.bounds.e_contract3: gamma_(M+d) on
    the magnitudes |R x|, the propagated errors and the products' underflow), the normaliser a non-negative one
    (bounds.e_contract), before the product by f (one rounding each, eta / f <= 2 eta).

    alpha.  The core's keys carry the computed alpha~, |alpha~_j - alpha_j| <= E_alpha_j (also where alpha~_j
    underflowed to 0): numerator and normaliser are linear in the keys, so the exact difference is
    sum_j (R_i x_i) . (R_j y_j) V_j with x = kappa(Q_i) exp(-r), y_j = s E_alpha_j kappa(K_j), of magnitude at most
    sum_j sum_t ||x_t|| ||y_jt|| |V_j| (each pair's rotated inner product is at most the product of the pair
    norms), and kappa(Q_i) exp(-r) . sum_j y_j in the normaliser, evaluated with a shift per pair in the logs
    (the shifts cancel in each pair's product): added to E_N and E_D.

    The quotient.  b = D + rho with E_b = E_D (1 + u) + u D (the product by f) + u (D + rho) (the addition of
    eps) + gamma_(2c+5) rho (f against eps) + eta terms (2 eta each for the two products' and the scaled eps's
    underflow, 6 eta b for normaliser_scaled's 2^-g frame); E_a = E_N + u (|N| + E_N) + 2 eta; then
    E_O = 2^e_v [(1 + gamma_1)(E_a + |y| E_b) / (b - E_b) + gamma_1 |y|] + 2 eta (the division; the scaled-back
    result's rounding into the subnormal range, normaliser_range.quotient rounding once), with y = N / b.  A
    huge rho (eps beside exp(r) below float64) is carried as rho 2^-kk with b, E_b (kk = floor(log2 rho)) and
    2^-kk joins the final exponent, so the bound stays finite where the output is; a row with lq* or m* below
    -2^29 (exp_pow2_split's stand-in s = -2^30) and eps > 0 has an exact output below 2^-(7 10^8) and a
    computed one that underflows to 0: 2 eta.

    As the plain rows: where the direct E is finite too, the larger (either path may be the tested one); NaN
    (no bound follows) is inf.  Tested against 60-digit mpmath (tests/test_range_bounds.py, item 5)."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    u, eta = pr.u, pr.eta
    n_k, d = k.shape[-2], k.shape[-1]
    mean = cfg.token_scaling == "mean"
    log_s = math.log(1.0 / n_k) if mean else 0.0
    elu1 = cfg.kernel == "elu1"
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        # the log-features and their absolute errors (units of u)
        lq, lkk = log_features(q, cfg.kernel, {}), log_features(k, cfg.kernel, {})
        log_alpha = np.log(alpha)[..., None]
        t1 = log_alpha + log_s
        lk = lkk + t1
        err_lq = np.where(elu1 & (q <= 0), 0.0, c * np.abs(lq))
        err_lk = (np.where(elu1 & (k <= 0), 0.0, c * np.abs(lkk)) + c * np.abs(log_alpha)
                  + ((c * abs(log_s) + 1.0) if mean else 0.0)
                  + np.where((log_alpha != 0) & (log_s != 0), np.abs(t1), 0.0)
                  + np.where(t1 != 0, np.abs(lk), 0.0))
        pq, pk, r, lq_t, m_t = rebalance_parts(lq, lk, True)
        m = np.max(lk, axis=-2, keepdims=True)
        m = np.repeat(np.max(m.reshape(*m.shape[:-1], -1, 2), axis=-1), 2, axis=-1)
        m = np.where(np.isfinite(m), m, 0.0)
        dq, dm = lq - lq_t, m - m_t
        arg_q = err_lq + np.abs(dq) + np.abs(dm) + np.abs(dq + dm)
        arg_k = err_lk + np.abs(lk - m)
        ep = lambda x, arg: np.where(x > 0, x * (np.exp(u * arg) * (1 + c * u) - 1.0), 0.0) + c * eta
        e_pq, e_pk = ep(pq, arg_q), ep(pk, arg_k)

        # the rotation of the rebalanced features
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        t_err = numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64")) * (1.0 + np.abs(ang))
        tau = np.maximum(np.abs(np.cos(ang)), np.abs(np.sin(ang))) * u + eta + t_err        # (N, d)
        s2 = math.sqrt(2.0)
        grow = np.repeat((pr.g(2) * (1 + s2 * tau) + s2 * tau)[:, 0::2], 2, axis=-1)
        rot_err = lambda x, ex: (grow * np.repeat(_pairs(x), 2, axis=-1) + np.repeat(_pairs(ex), 2, axis=-1)
                                 + 3 * eta)
        nq, nk = apply_rope_2d(pq, ang), apply_rope_2d(pk, ang)
        e_nq, e_nk = rot_err(pq, e_pq), rot_err(pk, e_pk)

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
            la = np.log(ealpha)[..., None] + log_s + lkk
            t = np.max(la, axis=-2, keepdims=True)
            t = np.repeat(np.max(t.reshape(*t.shape[:-1], -1, 2), axis=-1), 2, axis=-1)
            t = np.where(np.isfinite(t), t, 0.0)
            xq, yk = np.exp(lq - r + t), np.exp(la - t)
            e_num = e_num + _pairs(xq) @ (_pairs(yk).swapaxes(-1, -2) @ np.abs(v_s))
            e_den = e_den + np.einsum("bhnd,bhd->bhn", xq, np.sum(yk, axis=-2))

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
        fix = np.ldexp(np.where(low > 0, inner, np.inf), e_v - kk[..., None]) + 2 * eta
        fix = np.where(far[..., None], 2 * eta, fix)
        fix = np.where(np.isnan(fix), np.inf, fix)
        fix = np.where(np.isfinite(e), np.maximum(e, fix), fix)
    return np.where(hit[..., None], fix, e)
