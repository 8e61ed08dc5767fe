"""RALA's layer bound (rala.rala_attention_bound) on the rows the core recomputes from log-features
(rala_core.recomputed_rows), where the core's inputs q, k, v carry the projections' errors eq, ek, ev: the
recomputation's own rounding error (rala_recomputed._rows_error, as rala_core_bound uses it) plus the propagation
of the input errors through the exact core.

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_01b0ccc7f7225e8b.txt), Eq. 2-4 (the computation bounded: O_i = sum_j w_ij V_j /
(sum_j w_ij + eps), w_ij = s alpha_j kappa(Q_i) . kappa(K_j), with RoPE on the numerator's features); Su et al.,
RoFormer (2021), Eq. 34; Higham (2002) eq. 2.8.

Layer: attention: imports bounds, config, numerics, :mod:`.rala_core`, :mod:`.rala_bounds` (alpha's error,
kappa's rule) and :mod:`.rala_recomputed` (the rounding bound of the rows); imported by :mod:`.rala` only.
"""

from __future__ import annotations

import math

import numpy as np

from .. import bounds, config, numerics
from .rala_bounds import _alpha_error, _e_kappa
from .rala_core import RALAConfig, kappa, rala_core, recomputed_rows, rope_2d_angles, rope_shared_pairs
from .normaliser_range import log_features
from .rala_recomputed import _alpha_terms, _log_args, _pairs, _rows_error

__all__: list[str] = []


def module_recomputed_error(e: np.ndarray, q: np.ndarray, eq: np.ndarray, k: np.ndarray, ek: np.ndarray,
                            v: np.ndarray, ev: np.ndarray, cfg: RALAConfig, hw: tuple[int, int],
                            pr: bounds.Precision) -> np.ndarray:
    """E (B, h, N, d) of rala_core inside the layer: the rows rala_core recomputes from log-features
    (rala_core.recomputed_rows on the float64 projections q^, k^) given a finite bound, every other element ``e``
    (the direct model's, rala_bounds._core_error with the input errors) unchanged, bit for bit.  q, k, v (B, h, N,
    d) the float64 projections, eq, ek, ev their error bounds in T (covering the float64 projections' too).

    Only T = float64 and the elu1 kernel: in another T no evaluation recomputes (rala_recomputed.recomputed_error)
    and the direct bound stands (inf where its normaliser has none); relu's features are not relatively stable
    under an input error near 0 (kept ``e``).

    Decomposition.  alpha: Eq. 4's exact weights at the exact inputs (q, k, v); O(.; alpha) the exact core with
    them held fixed; O~ the tested output (inputs q_T, k_T, v_T within E of the exact ones, so within 2 E of the
    float64 projections, its own alpha~); O0 = O(q^, k^, v^; alpha), O^ the reference's output.  Then
    |O~ - O| <= |O~ - O(q_T, k_T, v_T; alpha)| + |O(q_T, k_T, v_T; alpha) - O0| + |O0 - O(q, k, v; alpha)|.

    The first, R_T, the recomputation's rounding with alpha~ against alpha: rala_recomputed._rows_error with
    E_alpha of rala_bounds._alpha_error given the input errors (it bounds |alpha~ - alpha| with their propagation
    through Eq. 4's logits), evaluated as rala_core_bound evaluates it at the reference's values, with the inputs'
    perturbation accounted: V by |V^| + 2 E_V (its magnitudes) and [V^ - 2 E_V, V^ + 2 E_V] (its range, the alpha
    term's width), q, k by the factor G = exp(2 D' + (2c + 8) u D'), D' = 2 delta, delta = max_c E_Q,ic + max_jc
    E_K,jc: every term of that bound but its eta terms is a ratio of non-negative feature products (with |V|,
    E_alpha) to the normaliser, each product moves by exp(+-D') when the inputs move by 2 E, the exp arguments'
    error counts by at most (c + 4) D' units.  R_0, the same at the reference's own values (no G, no widening),
    bounds |O^ - O0|.

    The propagation.  kappa = ELU + 1 has kappa'/kappa = min(1, e^x) / kappa(x) <= 1, so an input moved by at most
    E moves log kappa by at most l(x, E) = E, and by log1p(E / (1 + x - E)) where x - E >= 0 (log(1 + x) is
    concave): every feature kappa(Q_i)_c, kappa(K_j)_c moves relatively by exp(+-l).

    Without RoPE (RALA Eq. 2-3) O_i = sum_(j>=0) p_j V_j, p_j = w_ij / (sum_j w_ij + eps), w_ij = s alpha_j
    sum_c kappa(Q_i)_c kappa(K_j)_c, with the pseudo-key j = 0 of weight eps and V_0 = 0: a convex combination.
    Write w'_ij / w_ij = e^(a_ic*) sum_c f_ijc exp((a_ic - a_ic*) + b_jc), f_ijc = kappa(Q_i)_c kappa(K_j)_c /
    sum_c (.) the channel shares (alpha cancels), |a_ic| <= l_Q,ic, |b_jc| <= l_K,jc, c* one channel of the row
    (the one of largest log kappa(Q_i)_c + max_j log kappa(K_j)_c).  The common e^(a_ic*) cancels in p, so with
    t_j the rest, |t_j| <= U_ij = log(1 + sum_c f_ijc expm1(x_c)), x_c* = l_K,jc*, x_c = l_Q,ic + l_Q,ic* + l_K,jc
    (the lower side by Jensen: sum f e^-x >= 1 / sum f e^x), and the pseudo-key's t_0 = -a_ic* within l_Q,ic*
    (eps > 0).  p'_j = p_j e^(t_j) / Z, Z = sum_l p_l e^(t_l) within the same range, so |p'_j - p_j| <= p_j F,
    F = expm1(W), W = 2 max(max_j U_ij, l_Q,ic* (eps > 0)), and since sum_j (p'_j - p_j) = 0, for any constant c
    |O(q', k', V) - O(q^, k^, V)| = |sum_j (p'_j - p_j)(V_j - c)| <= F sum_j p_j |V_j - c| (and <= 2 max_j |V_j - c|,
    the total variation being <= 2); V's own change moves the convex combination by at most max_j |V'_j - V_j|.
    Two bounds follow, with F_T (moves 2 E: q_T against q^) and F_0 (moves E: q against q^): (a) c = O0,
    E = R_T + 3 W_V + (F_T + F_0)(S + R_0), S >= sum_j p_j |V^_j - O^| (>= sum_j p_j |V^_j - O0| - R_0), W_V =
    max_j E_V,j; (b) c the middle of V^'s range (with 0 where eps > 0), E = R_T + 3 W_V + (min(F_T, 2) + min(F_0,
    2)) H, H half that range's width; (c) :func:`_range_bound`, which needs no feature accuracy at all; (d) (a) key
    by key, :func:`_per_key`: |p'_j - p_j| <= p_j expm1(U_ij + log Z_up), so that a key far below the row's
    largest weight may move by a huge factor and still count for nothing.  E is the smallest.  f is formed from
    the float64 logs, its upper value with the logs' and the sums' errors; S from the rebalanced features
    (:func:`_weighted_sums`).  G takes the largest moves of the head, so for inputs near 2^60 (E ~ 10^3 on
    features exp(-10^18)) it overflows and (c) is what remains.

    With RoPE the numerator's weights a_ij = (R_i kappa(Q_i)) . (R_j s alpha_j kappa(K_j)) have either sign:
    |a_ij| <= sum_t ||kappa(Q_i)_t|| ||s alpha_j kappa(K_j)_t|| (pair norms over the rotated pairs), a relative
    feature change of at most e^l - 1 per entry moves a_ij by at most (e^delta - 1) times that and the normaliser
    D by e^(+-delta), delta = max_c l_Q,ic + max_jc l_K,jc (moves 2 E), so O' - O = (N' - N) / (D' + eps) - O (D' -
    D) / (D' + eps) gives P <= 2 e^delta (e^delta - 1) Y(|V|) + e^(2 delta) Y(E_V) with Y(a) >= sum_j |a_ij| a_j /
    (D + eps) (|O| D <= |N|), formed like S at the reference's values and widened by e^(2 delta) to the exact ones;
    E = R_T + P.

    Then ``e``'s finite value where it has one and is larger (either path may be the tested one, as
    rala_recomputed._either_path), ``e`` as before where this bound is not finite; NaN is inf.  Cost: without RoPE
    (B, h, N, N, d) arrays (the channel shares, (a) per row and key, (d)) up to config.QUADRATIC_MAX_ELEMENTS;
    beyond it every key's log-weight moves by at most delta_i = max_c l_Q,ic + max_jc l_K,jc (W = 2 delta, no
    shares), S <= sum_j p_j |V_j| + |O^| (Y(|V|) of :func:`_weighted_sums`), and (d) is not formed."""
    if pr.dtype != "float64" or cfg.kernel != "elu1":
        return e
    hit, alpha = recomputed_rows(q, k, cfg)
    if not np.any(hit):
        return e
    c, u, eta = float(config.ELEMENTARY_FUNCTION_ULPS), pr.u, pr.eta
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        ealpha = None
        if cfg.reweight:
            kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
            ealpha = _alpha_error(q, eq, kq, _e_kappa(q, eq, cfg.kernel, pr), kk, _e_kappa(k, ek, cfg.kernel, pr),
                                  cfg, pr)[1]
        d2 = 2 * (np.max(eq, axis=-1) + np.max(ek, axis=(-2, -1))[..., None])[..., None]      # (B, h, N, 1)
        g_fac = np.exp(2 * d2 + (2 * c + 8) * u * d2)
        full = np.full(e.shape, np.inf)
        r_t = _rows_error(full, hit, q, k, np.abs(v) + 2 * ev, alpha, ealpha, cfg, hw, pr,
                          spread_of=np.concatenate([v - 2 * ev, v + 2 * ev], axis=-2)) * g_fac
        e_v = numerics.pow2_exponent(v, axis=-2, scale_up=True)
        v_s, ev_s, r_s = np.ldexp(v, -e_v), np.ldexp(ev, -e_v), np.ldexp(r_t, -e_v)
        y_of = _weighted_sums(q, k, alpha, ealpha, cfg, hw, pr)
        w = np.max(ev_s, axis=-2, keepdims=True)
        if cfg.rope:
            delta = (np.max(_log_moves(q, 2 * eq), axis=-1) + np.max(_log_moves(k, 2 * ek), axis=(-2, -1))[..., None])
            delta = delta[..., None]
            amp = np.exp(2 * delta)
            fix = r_s + 2 * np.exp(delta) * np.expm1(delta) * amp * y_of(np.abs(v_s) + ev_s) + \
                np.exp(2 * delta) * amp * y_of(ev_s)
        else:
            r_0 = np.ldexp(_rows_error(full, hit, q, k, v, alpha, ealpha, cfg, hw, pr), -e_v)
            out_s = np.ldexp(rala_core(q, k, v, cfg, hw, taps={}), -e_v)     # taps: the NumPy recomputation
            hi, lo = np.max(v_s, axis=-2, keepdims=True), np.min(v_s, axis=-2, keepdims=True)
            if cfg.eps:
                hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)
            if q.size * k.shape[-2] <= config.QUADRATIC_MAX_ELEMENTS:     # the (B, h, N, M, d) forms
                f_t = np.expm1(_width(q, k, _log_moves(q, 2 * eq), _log_moves(k, 2 * ek), cfg, pr))
                f_0 = np.expm1(_width(q, k, _log_moves(q, eq), _log_moves(k, ek), cfg, pr))
                s = y_of(np.abs(v_s[..., None, :, :] - out_s[..., :, None, :]), np.abs(out_s))
                by_mean = r_s + 3 * w + (f_t + f_0) * (s + r_0)
                dev = np.abs(v_s[..., None, :, :] - out_s[..., :, None, :]) + r_0[..., None, :]
                by_key = r_s + 3 * w + sum(_per_key(y_of, q, k, alpha, ealpha, cfg, _moves(
                    q, k, _log_moves(q, f * eq), _log_moves(k, f * ek), cfg, pr), dev, np.abs(out_s) + r_0, pr)
                    for f in (2, 1))
                by_mean = np.fmin(by_mean, by_key)
            else:       # beyond config.QUADRATIC_MAX_ELEMENTS: no channel shares (width 2 delta), S by |V| + |O^|
                move = lambda f: (np.max(_log_moves(q, f * eq), axis=-1)
                                  + np.max(_log_moves(k, f * ek), axis=(-2, -1))[..., None])[..., None]
                f_t, f_0 = np.expm1(2 * move(2)), np.expm1(2 * move(1))
                by_mean = r_s + 3 * w + (f_t + f_0) * (y_of(np.abs(v_s)) + np.abs(out_s) + r_0)
            by_range = r_s + 3 * w + (np.minimum(f_t, 2.0) + np.minimum(f_0, 2.0)) * (hi - lo) / 2
            fix = np.fmin(np.fmin(by_mean, by_range), _range_bound(v_s, ev_s, cfg, pr))
        fix = np.ldexp(fix, e_v) + 2 * eta
        fix = np.where(np.isnan(fix), np.inf, fix)
        fix = np.where(np.isfinite(fix), np.where(np.isfinite(e), np.maximum(e, fix), fix), e)
    return np.where(hit[..., None], fix, e)


def _log_moves(x: np.ndarray, ex: np.ndarray) -> np.ndarray:
    """l(x, E) >= |log kappa(x') - log kappa(x)| for |x' - x| <= E, kappa = ELU + 1: log1p(E / (1 + x - E)) where
    x - E >= 0 (both on x + 1, log concave: the move down is the larger), else E (d log kappa / dx <= 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x - ex >= 0, np.log1p(ex / (1.0 + x - ex)), ex)


def _moves(q: np.ndarray, k: np.ndarray, l_q: np.ndarray, l_k: np.ndarray, cfg: RALAConfig,
           pr: bounds.Precision) -> np.ndarray:
    """(U (B, h, N, M), l_Q,ic* (B, h, N, 1)) of :func:`module_recomputed_error` (no RoPE): U_ij =
    log1p(sum_c f_ijc expm1(x_c)) bounds the move |t_j| of key j's log-weight relative to the row's common a_ic*.  The channel shares f_ijc = softmax_c(s_ijc), s_ijc = log kappa(Q_i)_c + log
    kappa(K_j)_c (normaliser_range.log_features, float64), taken at their upper values: each log errs by c u |log|
    (exact for x <= 0); formed against the pair's top channel t as s_c - s_t = (lq_c - lq_t) + (lk_c - lk_t), the
    two differences and their sum rounding by u |.| each: A_c u in all (0 at t, exactly).  In logs (no underflow):
    log f_c <= (s_c - s_t) + A_c u - log(sum_l exp((s_l - s_t) - A_l u)), the sum taken low by exp's c u, the
    d-term sum's gamma_d and the log's c u log d, and at least 0 (its top term is 1); u |.| for the addition."""
    c, u = float(config.ELEMENTARY_FUNCTION_ULPS), pr.u
    lq, lk = log_features(q, cfg.kernel, {}), log_features(k, cfg.kernel, {})
    err_q = np.where(q <= 0, 0.0, c * np.abs(lq))
    err_k = np.where(k <= 0, 0.0, c * np.abs(lk))
    d = q.shape[-1]
    lq_i, lk_j = lq[..., :, None, :], lk[..., None, :, :]                 # (B, h, N, 1, d), (B, h, 1, M, d)
    ct = np.argmax(lq_i + lk_j, axis=-1)[..., None]                        # the top channel of (i, j)
    shape = np.broadcast_shapes(lq_i.shape, lk_j.shape)
    at = lambda a: np.take_along_axis(np.broadcast_to(a, shape), ct, axis=-1)
    dq, dk = lq_i - at(lq_i), lk_j - at(lk_j)
    dd = dq + dk                                     # s_c - s_ct, 0 at ct exactly
    eq_i, ek_j = err_q[..., :, None, :], err_k[..., None, :, :]
    a_l = np.where(np.arange(d) == ct, 0.0, eq_i + ek_j + at(eq_i) + at(ek_j) + np.abs(dq) + np.abs(dk) + np.abs(dd))
    log_den = np.log(np.sum(np.exp(dd - u * a_l), axis=-1, keepdims=True))
    log_den = np.maximum(log_den + math.log1p(-c * u) + math.log1p(-pr.g(d)) - c * u * math.log(d), 0.0)
    log_share = dd + u * a_l - log_den
    log_share = log_share + u * np.abs(log_share)
    star = np.argmax(lq + np.max(lk, axis=-2, keepdims=True), axis=-1)[..., None]          # (B, h, N, 1)
    lq_star = np.take_along_axis(l_q, star, axis=-1)                                       # (B, h, N, 1)
    x = (l_q + lq_star)[..., :, None, :] + l_k[..., None, :, :]                            # (B, h, N, M, d)
    own = np.take_along_axis(np.broadcast_to(l_k[..., None, :, :], x.shape), np.broadcast_to(
        star[..., None], x.shape[:-1] + (1,)), axis=-1)
    is_star = np.arange(d) == star[..., None]                                              # (B, h, N, 1, d)
    x = np.where(is_star, own, x)
    terms = log_share + _log_expm1(x)                # U = log(1 + sum_c exp(terms)), formed without overflow
    top_t = np.max(terms, axis=-1, keepdims=True)
    top_t = np.where(np.isfinite(top_t), top_t, 0.0)
    return np.logaddexp(0.0, top_t[..., 0] + np.log(np.sum(np.exp(terms - top_t), axis=-1))), lq_star


def _log_expm1(y: np.ndarray) -> np.ndarray:
    """log(expm1(y)) for y >= 0 (-inf at 0), without overflow for large y."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return np.where(y > 1, y + np.log1p(-np.exp(-np.minimum(y, 1e300))), np.log(np.expm1(np.minimum(y, 1.0))))


def _width(q: np.ndarray, k: np.ndarray, l_q: np.ndarray, l_k: np.ndarray, cfg: RALAConfig,
           pr: bounds.Precision) -> np.ndarray:
    """W (B, h, N, 1) = 2 max(max_j U_ij, l_Q,ic* where eps > 0) (:func:`_moves`)."""
    u_ij, lq_star = _moves(q, k, l_q, l_k, cfg, pr)
    up = np.max(u_ij, axis=-1, keepdims=True)
    if cfg.eps:
        up = np.maximum(up, lq_star)
    return 2 * up


def _weighted_sums(q: np.ndarray, k: np.ndarray, alpha: np.ndarray, ealpha: np.ndarray | None, cfg: RALAConfig,
                   hw: tuple[int, int], pr: bounds.Precision):
    """y(a, a0=None) -> (B, h, N, e): an upper bound of sum_j |w_ij| a_j (+ eps a0) / (sum_j w_ij + eps) at the
    reference's values with the exact alpha (|alpha - alpha^| <= E_alpha), w_ij the weights of Eq. 2 (without
    RoPE; a (B, h, N, M, e) per row and key, or (B, h, M, e) per key) or their RoPE bounds sum_t ||.|| ||.||
    (a per key).  Formed on the rebalanced features (normaliser_range.rebalance_parts: w_ij = exp(r_i) phi_q'_i .
    phi_k'_j, exp(-r_i) taken out of numerator and normaliser; eps exp(-r_i) = rho): the numerator with the
    features' upper values phi' + E_phi' (rala_recomputed._log_args: the exp arguments' errors) and rho's upper
    value, the keys alpha^ lost or underweights by E_alpha (rala_recomputed._alpha_terms: their exact weights
    <= E_alpha); the normaliser with lower values (phi' - E_phi')^+, alpha^ shrunk to (alpha^ - E_alpha)^+ and rho's
    lower value.  rho = exp(log eps - (lq* + m*)) errs relatively by exp(u A)(1 + c u), A = c |log eps| + |lq* +
    m*| + |log rho| (the log, the sum and the difference, exp); a huge rho is divided out (rho -> 1)."""
    c, u, eta = float(config.ELEMENTARY_FUNCTION_ULPS), pr.u, pr.eta
    n_k = k.shape[-2]
    log_s = math.log(1.0 / n_k) if cfg.token_scaling == "mean" else 0.0
    ang = rope_2d_angles(hw[0], hw[1], q.shape[-1], cfg.rope_base) if cfg.rope else None
    shared = rope_shared_pairs(ang) if cfg.rope else False
    lq, lkk, _, pq, pk, r, lq_t, m_t, arg_q, arg_k = _log_args(q, k, alpha, log_s, cfg, shared)
    ep = lambda x, arg: np.where(x > 0, x * (np.exp(u * arg) * (1 + c * u) - 1.0), 0.0) + c * eta
    e_pq, e_pk = ep(pq, arg_q), ep(pk, arg_k)
    pq_u, pk_u = pq + e_pq, pk + e_pk
    pq_l, pk_l = np.maximum(pq - e_pq, 0.0), np.maximum(pk - e_pk, 0.0)
    if ealpha is not None:
        shrink = np.where(alpha > 0, np.maximum(1.0 - ealpha / alpha, 0.0), 0.0)[..., None]
        pk_l = pk_l * shrink
        # _alpha_terms forms x = exp(lq - r + t), y = exp(la - t), la = log E_alpha + log s + log kappa(K), in the
        # frame exp(-r) (r = fl(lq* + m*)); against the exact features in the frame exp(-(lq* + m*)): the logs'
        # errors (c u |.| each), r's rounding u |r|, the sums and differences (u |.| each, |t| <= max |la|), exp's
        # c u twice and the two contractions' gamma_(M + d + 2): one factor per head, from the largest terms.
        big = lambda x: np.max(np.where(np.isfinite(x), np.abs(x), 0.0), axis=(-2, -1), keepdims=True)
        la = np.log(ealpha)[..., None] + log_s + lkk
        spread_a = ((c + 2) * (big(lq) + big(lkk) + big(np.log(ealpha)[..., None])) + 3 * big(r) + 4 * big(la)
                    + (c + 1) * abs(log_s))
        alpha_err = np.exp(u * spread_a) * (1 + c * u) ** 2 * (1 + pr.g(n_k + q.shape[-1] + 2))
    den = np.einsum("bhnd,bhd->bhn", pq_l, np.sum(pk_l, axis=-2))[..., None]
    scale = np.ones(den.shape)
    rho_u = rho_l = np.zeros(den.shape)
    if cfg.eps:
        top = (lq_t + m_t)
        lrho = math.log(cfg.eps) - top
        spread = np.exp(u * (c * abs(math.log(cfg.eps)) + np.abs(top) + np.abs(lrho)))
        scale = np.where(lrho > 0, np.exp(-lrho), 1.0)      # divides numerator and normaliser alike
        base = np.where(lrho > 0, 1.0, np.exp(lrho))
        rho_u, rho_l = base * spread * (1 + c * u) + c * eta, base / (spread * (1 + c * u))
    low = den * scale + rho_l

    def y_of(a: np.ndarray, a0: np.ndarray | None = None) -> np.ndarray:
        if a.ndim == q.ndim + 1:        # per row and key (no RoPE)
            num = np.einsum("bhij,bhije->bhie", np.einsum("bhic,bhjc->bhij", pq_u, pk_u), a)
        elif cfg.rope:
            mark = np.broadcast_to(np.asarray(shared, dtype=bool), (q.shape[-1] // 2,))
            lone = ~np.repeat(mark, 2)
            xn = np.concatenate([_pairs(pq_u)[..., mark], pq_u[..., lone]], axis=-1)
            yn = np.concatenate([_pairs(pk_u)[..., mark], pk_u[..., lone]], axis=-1)
            num = xn @ (yn.swapaxes(-1, -2) @ a)
        else:
            num = pq_u @ (pk_u.swapaxes(-1, -2) @ a)
        if ealpha is not None:
            a_key = a if a.ndim == q.ndim else np.max(a, axis=-3)
            num = num + _alpha_terms(lq, lkk, r, log_s, ealpha, a_key, shared)[0] * alpha_err
        num = num * scale
        if a0 is not None:
            num = num + rho_u * a0
        return num / low

    y_of.parts = dict(lq=lq, lkk=lkk, lq_t=lq_t, m_t=m_t, arg_q=arg_q, log_s=log_s, scale=scale, low=low,
                      rho_u=rho_u)
    return y_of


def _per_key(y_of, q: np.ndarray, k: np.ndarray, alpha: np.ndarray, ealpha: np.ndarray | None, cfg: RALAConfig,
             moves: tuple, a: np.ndarray, a0: np.ndarray, pr: bounds.Precision) -> np.ndarray:
    """K (B, h, N, e) >= sum_(j>=0) |p'_j - p_j| a_ij (no RoPE; :func:`module_recomputed_error`, bound (d)), key
    by key: with |t_j| <= U_ij (``moves`` = :func:`_moves`' (U, l_Q,ic*); the pseudo-key's l_Q,ic*) and Z =
    sum_l p_l e^(t_l) <= Z_up = 1 + sum_l p_l expm1(U_l) (and Z >= 1 / Z_up, Jensen), p'_j / p_j lies in
    [e^-U_j / Z_up, e^U_j Z_up], so |p'_j - p_j| <= p_j expm1(U_j + log Z_up): a key whose weight p_j is far below
    the row's largest may move by a huge factor and still count for nothing.  p_j at its upper value in logs (no
    underflow): log p_j <= logsumexp_c(LQ_ic + LK_jc) - log(D_lo + rho_lo) (+ log of the frame's scale), LQ = (lq -
    lq*) + (m - m*) and LK = log kappa(K_j) + log(alpha^_j + E_alpha_j) + log s - m the rebalanced features' logs
    (normaliser_range.rebalance_parts' frame, m from alpha^) with their arguments' errors (rala_recomputed._log_args;
    LK's as it charges lk's, the sum alpha^ + E_alpha one unit more), the sum LQ + LK's rounding, logsumexp's (exp c
    u, the differences to the largest term u |.|, the d-term sum gamma_d, log c u log d, the addition u |.|) and the
    final logs' (c u |log| each, u |.|);
    D_lo + rho_lo from :func:`_weighted_sums`.  The pseudo-key (eps > 0): p_0 <= rho_up / (D_lo + rho_lo).  ``a``
    (B, h, N, M, e) per row and key, ``a0`` (B, h, N, e) the pseudo-key's."""
    c, u = float(config.ELEMENTARY_FUNCTION_ULPS), pr.u
    pt = y_of.parts
    lq, lkk, lq_t, m_t, log_s = pt["lq"], pt["lkk"], pt["lq_t"], pt["m_t"], pt["log_s"]
    u_ij, lq_star = moves
    n_k, d = k.shape[-2], k.shape[-1]
    log_alpha = np.log(alpha)[..., None]
    m = np.max(lkk + (log_alpha + log_s), axis=-2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    lq_err = pt["arg_q"]
    ax = lambda x: np.where(np.isfinite(x), np.abs(x), 0.0)
    la_up = np.log(alpha + ealpha)[..., None] if ealpha is not None else log_alpha
    t1 = la_up + log_s
    lk_up = lkk + t1
    lk_err = (np.where(k <= 0, 0.0, c * ax(lkk)) + c * ax(la_up) + (1.0 if ealpha is not None else 0.0)
              + ((c * abs(log_s) + 1.0) if log_s else 0.0) + np.where((la_up != 0) & (log_s != 0), ax(t1), 0.0)
              + np.where(t1 != 0, ax(lk_up), 0.0) + ax(lk_up - m))
    big_lq = (lq - lq_t) + (m - m_t)
    big_lq = np.where(np.isfinite(big_lq), big_lq, -np.inf)
    x = big_lq[..., :, None, :] + (lk_up - m)[..., None, :, :]                     # (B, h, N, M, d)
    x = x + u * (lq_err[..., :, None, :] + lk_err[..., None, :, :] + ax(x))
    mx = np.max(x, axis=-1, keepdims=True)
    mx_f = np.where(np.isfinite(mx), mx, 0.0)
    # x - mx <= 0 rounds by u |x - mx|: exp((x - mx)(1 - u)) is the term's upper value
    lse = mx_f[..., 0] + np.log(np.sum(np.exp((x - mx_f) * (1 - u)), axis=-1))
    lse = lse + u * (ax(lse) + c * math.log(d)) + math.log1p(c * u) + math.log1p(pr.g(d))
    log_low = np.log(pt["low"]) - np.log(pt["scale"])                               # (B, h, N, 1)
    err_low = u * (c * ax(np.log(pt["low"])) + c * ax(np.log(pt["scale"])) + ax(log_low))
    log_p = lse - log_low + err_low
    log_p = log_p + u * ax(log_p)
    l1 = _log_expm1
    z_up = 1.0 + np.sum(np.exp(log_p + l1(u_ij)), axis=-1, keepdims=True)
    if cfg.eps:
        log_p0 = np.log(pt["rho_u"]) - log_low + err_low + u * c * ax(np.log(pt["rho_u"]))
        log_p0 = log_p0 + u * ax(log_p0)
        z_up = z_up + np.exp(log_p0 + l1(lq_star))
    z_up = z_up * (1 + pr.g(n_k + 2))
    kap = l1(u_ij + np.log(z_up))
    out = np.einsum("bhij,bhije->bhie", np.exp(log_p + kap), a)
    if cfg.eps:
        out = out + np.exp(log_p0 + l1(lq_star + np.log(z_up))) * a0
    return out * (1 + pr.g(n_k + 3))


def _range_bound(v_s: np.ndarray, ev_s: np.ndarray, cfg: RALAConfig, pr: bounds.Precision) -> np.ndarray:
    """A bound (B, h, 1, e), V 2^-e_v's units, on a recomputed row without RoPE that needs no feature accuracy:
    the exact output and the computed one both lie in V's range (up to rounding), so they differ by at most its
    width.  The exact O_i is a convex combination of the exact V_j and (eps > 0) of V_0 = 0: in [lo, hi], the range
    of V^ +- 2 E_V over the keys (with 0 where eps > 0).  The computed one (normaliser_range.rebalanced_output):
    whatever its non-negative features phi_q', phi_k' and factor f, numerator and normaliser are sums of the same
    non-negative products P_jc = phi_q'_c phi_k'_jc, the numerator's term of V_j with n_k + d + 1 roundings
    (the product with V, n_k - 1 sums, the product with phi_q', d - 1 sums, the product with f), the normaliser's
    with as many (n_k - 1 sums, the product, d - 1 sums, f, the addition of eps 2^-(s + g)), eps's own error only
    moving the weight of V_0 = 0.  So the computed output is sum_j pi_j V_j (1 + t_N,j) / (1 + t_D,j) (1 + delta),
    pi a convex combination over the perturbed weights, |t| <= gamma_(n_k + d + 1), plus the underflow of the
    products: it lies within kappa M of [lo, hi], M = max_j |V^_j| + 2 E_V, kappa = (1 + gamma)(1 + u) / (1 - gamma)
    - 1.  Underflow (eta each): n_k d + d + 1 in the numerator and d + 1 in the normaliser, both divided by the
    normaliser den f >= L = (1 - gamma_(4c + n_k + d + 4)) / 2 (its product of phi_q'_c* = exp(0) and its key's
    phi_k' = exp(0), each 1 within c u, with n_k + d roundings; f = f_1 f_2, each factor exp of a reduced argument
    in [-ln2 / 2, ln2 / 2], >= 2^-1/2 within c + 1 roundings, numerics.exp_pow2_split; their product and den f one
    each), the normaliser's by M too; den_eff = den 2^-g + eps 2^-(s + g) rounds den 2^-g (eta where subnormal)
    against den_eff >= 1/2 (g, its exponent where not 0): 2 eta M; the quotient (before 2^(e_v - g), whose rounding
    the caller's 2 eta covers) eta 2^-g <= 2 eta (g >= -1 as den f >= L).  So |O~ - O| <= (hi - lo) + kappa M +
    [(n_k d + d + 1) eta + (d + 1) eta M] / L + 2 eta M + 2 eta."""
    c, u, eta = float(config.ELEMENTARY_FUNCTION_ULPS), pr.u, pr.eta
    n_k, d = v_s.shape[-2], v_s.shape[-1]
    hi = np.max(v_s + 2 * ev_s, axis=-2, keepdims=True)
    lo = np.min(v_s - 2 * ev_s, axis=-2, keepdims=True)
    if cfg.eps:
        hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)
    big = np.max(np.abs(v_s) + 2 * ev_s, axis=-2, keepdims=True)
    g = pr.g(n_k + d + 1)
    kappa_r = (1 + g) * (1 + u) / (1 - g) - 1
    lower = 0.5 * (1 - pr.g(4 * c + n_k + d + 4))
    under = ((n_k * d + d + 1) * eta + (d + 1) * eta * big) / lower
    return (hi - lo) + kappa_r * big + under + 2 * eta * big + 2 * eta
