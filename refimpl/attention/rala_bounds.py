"""RALA's error model: the running bound E on the absolute error of a computation in the tested precision T
(``_Prec`` and the generic ``_e_*`` rules are the error calculus's, :mod:`refimpl.bounds`; kappa's and RoPE's
rules, the errors of the core's stages: kappa, Eq. 4's logits and softmax, RoPE, Eq. 2-3's
numerator, normaliser and quotient), the l2 coefficient sigma of the same first-order error (``_core_sigma``,
``_attention_sigma``), ``_as_bound`` (E and sigma as a :class:`refimpl.numerics.Bound`) and the bound of the core,
:func:`rala_core_bound`, with its absolute underflow part ``_core_underflow`` (the part that does not scale).

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_01b0ccc7f7225e8b.txt), Eq. 2-4 and 6 (the computation bounded; :mod:`.rala_core`);
Higham (2002) eq. 2.8, Lemma 3.1, eq. 3.12; docs/design.md "The verdict".

Layer: attention: imports bounds, config, layers, numerics, validation, verdict, :mod:`.rala_core` (the computation the
bounds follow), :mod:`.rala_recomputed` (the bound of the rows recomputed from log-features) and
:mod:`.focused_bounds` (``_token_quadrature``), nothing from :mod:`.rala`, which imports it
and holds the bounds of the layer, the FFN and the residuals and the stage list (built from these helpers).  The
public name is re-exported by :mod:`refimpl.attention.rala`, its documented home.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from .. import bounds, config, layers, numerics, validation, verdict
from .focused_bounds import _token_quadrature
from .normaliser_range import normaliser_scaled, scaling_exponents
from .rala_core import (RALAConfig, _merge_heads, _param, _reweighting, _split_heads, _tokens_to_cf, _weight2d,
                        apply_rope_2d, kappa, rala_core, recomputed_rows, rope_2d_angles)
from .rala_recomputed import recomputed_error

__all__ = ["rala_core_bound"]

# ===================================================================================================
# Error model
# ===================================================================================================
#
# A running bound on the absolute error of a computation in precision T, propagated stage by stage from
# the inputs (exact: the comparison rounds them to T first) to the output.  Every intermediate x carries
# E_x >= |fl_T(x) - x| element-wise.  Model (Higham 2002, eq. 2.8, gradual underflow): a product,
# quotient or library function result is (exact)(1 + delta) + eta, |delta| <= u, |eta| <= eta_T (half the
# smallest subnormal; c eta_T for a library function); additions and subtractions are exact in the
# subnormal range.  Rules (|.| element-wise; A+ = |A| + E_A; c = config.ELEMENTARY_FUNCTION_ULPS):
#
#   contraction with n roundings per term and p products per term, m terms (matmul, einsum):
#       E = gamma_n (A+)(B+) + E_A (B+) + |A| E_B + p m eta
#       (|fl(A'B') - A'B'| <= gamma_n |A'||B'| for any summation order - BLAS, GPU, threads - and
#       |A'B' - AB| <= E_A |B'| + |A| E_B); three factors: gamma_n (A+)(B+)(C+) + E_A (B+)(C+)
#       + |A| E_B (C+) + |A||B| E_C + p m eta;
#   a product with a constant rounded to T: two more roundings in n;
#   exp: |exp(x')(1 + c u) - exp(x)| <= exp(x) (exp(E_x)(1 + c u) - 1) + c eta;
#   quotient y = a / b with r roundings: E = (1 + gamma_r)(E_a + |y| E_b) / (|b| - E_b) + gamma_r |y|
#       + r eta, and +inf where E_b >= |b| (rounding may reach a zero normaliser: no bound exists).
#
# The result is returned as Bound(scale = E / gamma_K(u), k = K) so that the comparison's gamma_K(u) *
# scale is E exactly; K, the depth of the longest chain of roundings, is reported in the note (the
# comparison adds K eta_T on top).  Rigorous except for the libm accuracy assumption
# (config.ELEMENTARY_FUNCTION_ULPS) and the RoPE table's float64 accuracy (config.RALA_ROPE_TABLE_ULPS).
# The linear and quadratic orders share one bound: each term of kappa(Q_i) kappa(K_j)^T V_j passes
# through the same number of roundings (N + d) and products (2) in either association.  The generic rules
# (contractions, products, sums, quotients, linear, depthwise conv) are refimpl.bounds' (rigorous model).


# The precision object and the generic rules are the error calculus's (refimpl.bounds, rigorous model
# Precision.of); the names below are the ones this module, rala.py and the RAVLT networks use.
_Prec = bounds.Precision
_e_contract = bounds.e_contract
_e_contract3 = bounds.e_contract3
_e_product = bounds.e_product
_e_sum2 = bounds.e_sum2
_e_quotient = bounds.e_quotient
_e_linear = bounds.e_linear


def _e_depthwise(x, ex, wgt, bias, pr: _Prec) -> np.ndarray:
    """'same'-padded depthwise conv (B, C, H, W) of x carrying E_x (:func:`refimpl.bounds.e_depthwise`)."""
    pad = wgt.shape[-1] // 2
    return bounds.e_depthwise(x, ex, wgt, bias, pr, lambda z, w, b: layers.depthwise_conv2d(z, w, b, padding=pad),
                              padding=pad)


def _e_kappa(x, ex, kernel: str, pr: _Prec) -> np.ndarray:
    """kappa(x') vs kappa(x) with |x' - x| <= E_x, kappa evaluated as x + 1 / exp(x) (elu1) or max(x, 0)."""
    if kernel == "relu":
        return ex                                              # 1-Lipschitz and exact
    c, u = config.ELEMENTARY_FUNCTION_ULPS, pr.u
    with np.errstate(over="ignore", invalid="ignore"):
        pos = ex + u * (np.abs(x + 1.0) + ex)                  # x' + 1, one rounding
        neg = np.exp(np.minimum(x, 0.0)) * (np.exp(ex) * (1 + c * u) - 1.0) + c * pr.eta
        # exp(E_x) beyond float64 (E_x > 709) beside exp(x) = 0: the product, at most exp(x + E_x)(1 + c u), is
        # formed as that (0 x inf would be NaN); unchanged wherever exp(E_x) is finite
        big = np.exp(np.minimum(x, 0.0) + ex) * (1 + c * u) + c * pr.eta
        neg = np.where(np.isfinite(np.exp(ex)), neg, big)
        # |x| <= E_x: x' may fall on the other branch; |(x + 1) - exp(x)| <= x^2 / 2 there.
        return np.where(np.abs(x) <= ex, np.maximum(pos, neg) + ex * ex, np.where(x > 0, pos, neg))


def _e_rope(x, ex, angles, pr: _Prec) -> np.ndarray:
    """Rotation of pairs with a table computed in float64 and rounded once to T:
    |table - exact| <= u |entry| + eta + gamma_R(u_64)(1 + |theta|), R = config.RALA_ROPE_TABLE_ULPS."""
    c, s = np.cos(angles), np.sin(angles)
    t_err = numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64")) * (1.0 + np.abs(angles))
    ec, es = pr.u * np.abs(c) + pr.eta + t_err, pr.u * np.abs(s) + pr.eta + t_err
    xe, xo, ee, eo = x[..., 0::2], x[..., 1::2], ex[..., 0::2], ex[..., 1::2]
    ce, se, ece, ese = c[:, 0::2], s[:, 0::2], ec[:, 0::2], es[:, 0::2]   # a pair's two channels share theta
    g2 = pr.g(2)

    def pair(a, ea, b, eb):  # a cos -/+ b sin: 2 products, 1 sum
        return (g2 * ((np.abs(a) + ea) * (np.abs(ce) + ece) + (np.abs(b) + eb) * (np.abs(se) + ese))
                + ea * (np.abs(ce) + ece) + np.abs(a) * ece + eb * (np.abs(se) + ese) + np.abs(b) * ese
                + 2 * pr.eta)

    out = np.empty_like(ex)
    out[..., 0::2] = pair(xe, ee, xo, eo)
    out[..., 1::2] = pair(xo, eo, xe, ee)
    return out


def _core_error(q, eq, k, ek, v, ev, cfg: RALAConfig, hw, pr: _Prec) -> tuple[np.ndarray, float]:
    """(E_out, K) for :func:`rala_core` computed in precision pr, inputs carrying errors eq, ek, ev."""
    c = config.ELEMENTARY_FUNCTION_ULPS
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    ekq, ekk = _e_kappa(q, eq, cfg.kernel, pr), _e_kappa(k, ek, cfg.kernel, pr)
    depth = c + 1
    if cfg.reweight:
        alpha, ealpha, d_alpha = _alpha_error(q, eq, kq, ekq, kk, ekk, cfg, pr)
        depth += d_alpha
    else:
        alpha, ealpha = np.ones(q.shape[:-1]), np.zeros(q.shape[:-1])
    kw = alpha[..., None] * kk
    ekw = _e_product(alpha[..., None], ealpha[..., None], kk, ekk, pr) + pr.eta   # k * softmax * N: 2 products
    depth += 2
    ey, d_att = _attention_error(kq, ekq, kw, ekw, v, ev, cfg, hw, pr)
    return ey, depth + d_att


def _alpha_error(q, eq, kq, ekq, kk, ekk, cfg: RALAConfig, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(alpha, E_alpha, depth) of Eq. 4's weights alpha = N softmax(scale mean(Q or kappa(Q)) kappa(K)^T)."""
    s, es, d_s = _scores_error(q, eq, kq, ekq, kk, ekk, cfg, pr)
    alpha, ealpha, d_a = _softmax_alpha_error(s, es, pr)
    return alpha, ealpha, d_s + d_a


def _scores_error(q, eq, kq, ekq, kk, ekk, cfg: RALAConfig, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(s, E_s, depth) of Eq. 4's logits s_j = scale q_g . kappa(K_j), q_g the token mean of Q or kappa(Q)."""
    n, d = q.shape[-2], q.shape[-1]
    u = pr.u
    src, esrc = (q, eq) if cfg.global_query == "q" else (kq, ekq)
    q_g = np.mean(src, axis=-2, keepdims=True)
    # mean: a sum of n terms (gamma_{n-1}) and one division
    eqg = (np.sum(esrc, axis=-2, keepdims=True) * (1 + u)
           + pr.g(pr.sums(n)) * np.sum(np.abs(src) + esrc, axis=-2, keepdims=True)) / n + pr.eta
    scale = d ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0
    n_s = pr.sums(d) + (2 if scale != 1.0 else 0)          # the rounded scale and its product
    s = scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]
    es = scale * _e_contract("bhxd,bhnd->bhxn", q_g, eqg, kk, ekk, n_s, 2 * d, pr)[..., 0, :]
    return s, es, pr.sums(n) + 1 + n_s


def _softmax_alpha_error(s, es, pr: _Prec) -> tuple[np.ndarray, np.ndarray, float]:
    """(alpha, E_alpha, depth) of alpha = N softmax(s) for logits s carrying absolute errors E_s."""
    n = s.shape[-1]
    c, u = config.ELEMENTARY_FUNCTION_ULPS, pr.u
    # softmax by max-subtraction: the shift cancels in the ratio; fl(s'_j - m') adds u |s'_j - m'|.
    # Relative error of alpha_j = N e_j / sum e, with |logit error_l| <= delta_l: e^{delta_j} / sum_l p_l
    # e^{-delta_l} - 1 above, 1 - e^{-delta_j} / sum_l p_l e^{delta_l} below (p the exact softmax), both at most
    # A - 1 with A = e^{delta_j} sum_l p_l e^{delta_l} (Cauchy-Schwarz: (sum p e^d)(sum p e^-d) >= 1, and
    # 1 - 1/A <= A - 1): exp(delta_j) (sum_l p_l exp(delta_l)) (1 + c u)(1 + gamma_3) / ((1 - c u)(1 - gamma_n)) - 1
    # (the quotient, x N and one spare rounding).  The p-weighted mean, not the max, of exp(delta_l): a
    # token with a large logit error but a small weight moves the sum little.  Underflowing exp terms
    # add c eta each, divided by sum e >= 1 (it contains exp(0) = 1) and multiplied by N.  With a wider
    # accumulation format (config.ACCUMULATION_FORMAT) the softmax is one operation evaluated in it: the
    # argument's rounding and exp's c ulps count u_A (ua); the logits it reads and alpha are in T.
    ua = u * numerics.accumulation_ratio(pr.dtype)
    m = np.max(s, axis=-1, keepdims=True)
    es_max = np.max(es, axis=-1, keepdims=True)
    delta = es + ua * (np.abs(s - m) + es + es_max)
    p = numerics.softmax(s, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        fac = (np.exp(delta) * np.sum(p * np.exp(delta), axis=-1, keepdims=True) * (1 + c * ua) * (1 + pr.g(3))
               / ((1 - c * ua) * (1 - pr.g(pr.sums(n)))))
    alpha = n * p
    ealpha = alpha * (fac - 1.0) + n * (c + 3) * pr.eta * (1.0 + alpha)
    # Cap: alpha and alpha~ both lie in [0, N fac_0 + N (c + 3) eta_T (1 + N)] (fac at delta = 0: the computed
    # softmax's own roundings; its underflow terms), so neither differs from the other by more; fmin also
    # replaces the NaN of 0 x inf (alpha 0 where fac overflowed).  Only where E_alpha exceeded it.
    fac0 = (1 + c * ua) * (1 + pr.g(3)) / ((1 - c * ua) * (1 - pr.g(pr.sums(n))))
    ealpha = np.fmin(ealpha, n * fac0 + n * (c + 3) * pr.eta * (1.0 + n))
    return alpha, ealpha, c + pr.sums(n) + 3


def _numerator_denominator(kq, kw, v, cfg: RALAConfig, hw) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2-3's numerator (B, h, N, d) and normaliser (B, h, N), before its + eps, from kappa(Q), the weighted
    keys and V: RoPE on the numerator's operands and the token scaling (the mean), as :func:`rala_core`."""
    n, d = kq.shape[-2], kq.shape[-1]
    if cfg.rope:
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
    else:
        qn, kn = kq, kw
    norm = 1.0 / n if cfg.token_scaling == "mean" else 1.0
    num = norm * np.einsum("bhia,bhja,bhje->bhie", qn, kn, v, optimize=True)
    den = norm * np.einsum("bhia,bhja->bhi", kq, kw, optimize=True)
    return num, den


def _attention_parts_error(kq, ekq, kw, ekw, v, ev, cfg: RALAConfig, hw, pr: _Prec):
    """The numerator and denominator of Eq. 2-3 from kappa(Q), the reweighted keys and V (with RoPE on the
    numerator's operands and the token scaling): (num, E_num, den, E_den, depth) with den including eps."""
    n, d = kq.shape[-2], kq.shape[-1]
    depth = 0.0
    if cfg.rope:
        ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
        qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
        eqn, ekn = _e_rope(kq, ekq, ang, pr), _e_rope(kw, ekw, ang, pr)
        depth += 3
    else:
        qn, kn, eqn, ekn = kq, kw, ekq, ekw
    mean = cfg.token_scaling == "mean"
    norm = 1.0 / n if mean else 1.0
    # numerator: sum_a sum_j qn_ia kn_ja v_je; n + d roundings per term (+4: (HW)^(-1/2) twice, rounded,
    # and their two products), 2 products per term (+2 for the scalings)
    n_num = pr.sums(n) + pr.sums(d) + (4 if mean else 0)
    num, den = _numerator_denominator(kq, kw, v, cfg, hw)
    enum = norm * _e_contract3("bhia,bhja,bhje->bhie", qn, eqn, kn, ekn, v, ev, n_num, n * d, pr) \
        + (2 * n * d * pr.eta if mean else 0.0)
    # denominator: sum_a sum_j kq_ia kw_ja (/ N), + eps
    n_den = pr.sums(n) + pr.sums(d) + (1 if mean else 0)
    eden = norm * _e_contract("bhia,bhja->bhi", kq, ekq, kw, ekw, n_den, d, pr) + (2 * d * pr.eta if mean else 0.0)
    if cfg.eps:
        eden = _e_sum2(den, eden, cfg.eps, 0.0, pr)
        den = den + cfg.eps
    return num, enum, den, eden, depth + n_num


def _attention_error(kq, ekq, kw, ekw, v, ev, cfg: RALAConfig, hw, pr: _Prec) -> tuple[np.ndarray, float]:
    """(E_out, depth) of out = numerator / denominator (:func:`_attention_parts_error`)."""
    num, enum, den, eden, depth = _attention_parts_error(kq, ekq, kw, ekw, v, ev, cfg, hw, pr)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = num / den[..., None]
    return _e_quotient(y, enum, den[..., None], eden[..., None], pr, roundings=2), depth + 3


# ---------------------------------------------------------------------------------------------------
# The l2 (probabilistic) coefficient sigma (numerics.Bound.sigma; docs/design.md "The verdict", item 2)
# ---------------------------------------------------------------------------------------------------
#
# Beside E, :func:`rala_core_bound` and :func:`rala_attention_bound` carry sigma >= sqrt(sum_r c_r^2), in units
# of u_T, over the roundings r of the computation (c_r the coefficient of rounding r in the output's first-order
# error; O(u^2) neglected, as in FLatten's sigma: first-order, not rigorous where E's second-order terms matter).
# Under Higham & Mary's model (independent, mean-zero rounding errors) |err_i| <= lam u sigma_i with probability
# >= 1 - 2 exp(-lam^2 / 2) (Azuma-Hoeffding), and the verdict uses min(E, lam u sigma).  The construction is
# FLatten's (refimpl.attention.focused_bounds, "The error model"):
#
# - an n-term sum counts sqrt(numerics.sum_depth_l2(n)) S instead of sum_depth(n) S;
# - an element-wise operation's rounding keeps its l1 size (coefficient |result| + eta_T / u_T: the error of one
#   rounding, gradual underflow included; a c-ulp library function: c times that);
# - an input's coefficient propagates through the same absolute Jacobian, |J| sigma (Minkowski: valid whatever
#   roundings the inputs share), and sets of roundings known to be disjoint join in quadrature:
#   sum_r c_r^2 = sum_G sum_{r in G} c_r^2 over a partition of the roundings into groups G;
# - sigma is capped at E / u_T (E >= u sum_r |c_r| >= u sqrt(sum_r c_r^2)).
#
# The disjoint groups of the core, for output element (i, e) (proved in :func:`_core_sigma`): the roundings of
# each key token j (its K and V entries - each projected entry is its own inner product when the module input is
# exact - kappa(K_j), its logit's, its softmax output's, alpha_j kappa(K_j), RoPE and the token scaling of its
# rows: in quadrature over j, :func:`refimpl.attention.focused_bounds._token_quadrature`); the queries' (every Q
# entry, kappa(Q), Q_g's own, RoPE of kappa(Q_i)); the RoPE table's (shared by the tokens of a grid row or
# column); and the contractions' own (numerator, normaliser, quotient).  A rounding shared by every alpha_j (the
# softmax's sum, the logits' common shift) scales numerator and normaliser alike and cancels in their quotient,
# up to the eps term.


def _kappa_sigma(x: np.ndarray, sx: np.ndarray, kernel: str, pr: _Prec) -> np.ndarray:
    """sigma of kappa(x~) for x~ carrying sigma ``sx`` (units of u_T): the derivative times sx (1 or exp(x);
    relu: 1 or 0) in quadrature with kappa's own rounding of the same entry (x + 1: one rounding; exp: c ulps,
    l1 size), which is disjoint from the input's roundings."""
    eu = pr.eta / pr.u
    if kernel == "relu":
        return np.where(x >= 0, sx, 0.0)                       # exact, 1-Lipschitz
    c = config.ELEMENTARY_FUNCTION_ULPS
    with np.errstate(over="ignore"):
        ex = np.exp(np.minimum(x, 0.0))
    own = np.where(x > 0, np.abs(x + 1.0) + eu, c * (ex + eu))
    return np.hypot(np.where(x > 0, 1.0, ex) * sx, own)


def _rope_table_error(angles: np.ndarray, pr: _Prec) -> tuple[np.ndarray, np.ndarray]:
    """The cos / sin tables' error in units of u_T (as :func:`_e_rope`: one rounding to T, gradual underflow, and
    the float64 evaluation's gamma_R(u_64)(1 + |theta|), a deterministic term kept at its l1 size)."""
    c, s = np.cos(angles), np.sin(angles)
    t_err = numerics.gamma(config.RALA_ROPE_TABLE_ULPS, numerics.unit_roundoff("float64")) * (1.0 + np.abs(angles))
    eu = pr.eta / pr.u
    return np.abs(c) + eu + t_err / pr.u, np.abs(s) + eu + t_err / pr.u


def _rope_sigma(x: np.ndarray, sx: np.ndarray, angles: np.ndarray, pr: _Prec) -> tuple[np.ndarray, np.ndarray]:
    """(sigma of RoPE(x~) without the table's roundings, the table's l1 coefficient) for x~ carrying sigma ``sx``.

    Output 2p is x_2p cos - x_2p+1 sin: the inputs through |cos|, |sin| (Minkowski: the pair may share
    roundings), in quadrature with the entry's own three roundings (two products, one difference; each of
    coefficient at most its own magnitude + eta_T / u_T, disjoint from the inputs' and from each other); the
    table's roundings (cos, sin of the token's angle, shared with the tokens of the same angle) are returned apart:
    |x_2p| e_cos + |x_2p+1| e_sin."""
    c, s = np.cos(angles), np.sin(angles)
    ec, es = _rope_table_error(angles, pr)
    eu = pr.eta / pr.u
    out = apply_rope_2d(x, angles)
    sig, tab = np.empty_like(sx), np.empty_like(sx)
    for part, (a, sa, b, sb) in ((slice(0, None, 2), (x[..., 0::2], sx[..., 0::2], x[..., 1::2], sx[..., 1::2])),
                                  (slice(1, None, 2), (x[..., 1::2], sx[..., 1::2], x[..., 0::2], sx[..., 0::2]))):
        cc, ss, ecc, ess = c[:, part], s[:, part], ec[:, part], es[:, part]
        prop = np.abs(cc) * sa + np.abs(ss) * sb
        own = np.sqrt((np.abs(a * cc) + eu) ** 2 + (np.abs(b * ss) + eu) ** 2 + (np.abs(out[..., part]) + eu) ** 2)
        sig[..., part] = np.hypot(prop, own)
        tab[..., part] = np.abs(a) * ecc + np.abs(b) * ess
    return sig, tab


def _quadratic_own_sq(qn: np.ndarray, kn_s: np.ndarray, v_s: np.ndarray, pr: _Prec, block: int = 1024) -> np.ndarray:
    """sum_j v_s_je^2 (d r^2 S_A_ij^2 + (|A_ij| + eta/u)^2), A = qn kn_s^T: the squared l2 count of the quadratic
    order's score matrix roundings (its d-term sums in the accumulation format, r = u_A / u_T, and its rounding
    to T), query rows in blocks (memory O(block N) per head)."""
    d, r, eu = qn.shape[-1], numerics.accumulation_ratio(pr.dtype), pr.eta / pr.u
    out = np.empty(qn.shape[:-1] + (v_s.shape[-1],))
    v2 = v_s * v_s
    for i0 in range(0, qn.shape[-2], block):
        rows = slice(i0, i0 + block)
        a = qn[..., rows, :] @ kn_s.swapaxes(-1, -2)
        sa = np.abs(qn[..., rows, :]) @ np.abs(kn_s).swapaxes(-1, -2)
        out[..., rows, :] = (d * r * r * sa * sa + (np.abs(a) + eu) ** 2) @ v2
    return out


def _core_sigma(q, sq, k, sk, v, sv, cfg: RALAConfig, hw, pr: _Prec) -> np.ndarray:
    """sigma (units of u_T, (B, h, N, d)) of :func:`rala_core` computed in precision pr, for inputs whose entries
    carry sigmas sq, sk, sv from disjoint sets of roundings, one set per entry (exact inputs: 0; the module's
    projections: every entry its own inner product).  The tested code's operations are the twin's
    (refimpl/twins/modules/rala.py): kappa; Q_g = mean, times d^-1/2; logits Q_g kappa(K)^T; the softmax; kappa(K)
    softmax N; RoPE; K and V times N^-1/2 (token scaling "mean"); the numerator in either order; the normaliser
    kappa(Q) mean_j(alpha_j kappa(K_j)) (+ eps); num (1 / den) or num / den.

    First order, the output's error is sum_r c_r delta_r.  With G_ije = alpha_j dy_ie / dalpha_j =
    norm (A_ij v_je - y_ie B_ij) / den_i (A_ij = qn_i . kn_j, B_ij = kappa(Q_i) . alpha_j kappa(K_j), norm 1 / N
    or 1, den including eps) and alpha_j's relative error ds_j - sbar + rho_j (ds_j its logit's error, sbar =
    sum_l p_l ds_l plus the softmax sum's rounding, shared, rho_j its own roundings), sum_j G_ije = y_ie eps /
    den_i: the shared sbar enters only as -sbar y eps / den (a common factor of every alpha_j cancels in
    numerator / normaliser).  The roundings fall into four disjoint groups, joined in quadrature:

    G1, key token j (K_j and V_j entries, kappa(K_j), the logit s_j's dot product and scale product, the softmax's
        shifted argument, exp and quotient for j, the stored softmax, the products by N and kappa(K_j), RoPE and
        N^-1/2 of alpha_j kappa(K_j) and V_j): disjoint between tokens, so sqrt(sum_j t_ije^2) with, within the
        token (Minkowski), t_ije = norm / den_i [(|qn_i| . s_kn_j) |v_je| + (|qn_i| . |kn_j|) s_v_je
        + |y_ie| (kappa(Q_i) . s_kw_j)], s_kw_j = alpha_j s_kk_j + |kappa(K_j)| s_alpha_j + product roundings;
        the two parts by :func:`refimpl.attention.focused_bounds._token_quadrature` and
        kq_i^T (sum_j s_kw_j s_kw_j^T) kq_i, added (Minkowski over j's vectors).
    G2, the queries (Q entries, kappa(Q), RoPE's own roundings of kappa(Q_i), Q_g's sum, division and scale
        product, the rounded constant d^-1/2): row i's own entries through the exact Jacobian of y_i in kappa(Q_i),
        norm (R_i^T Bm - y_i zs) / den_i (Bm = kn^T v, zs = sum_j kw_j, R_i the rotation), in quadrature over
        the entries (each entry its own roundings); Q_g's entries (disjoint between channels a, each the mean of
        n entries in quadrature plus its own roundings) through their exact first-order coefficient
        scale |sum_j G_ije kappa(K_ja)| (signed sum, plus its float64 evaluation error), in quadrature over a; the
        constant through |sum_j G_ije s_j| likewise; the three added (Q_i's entries are in Q_g too).
    G3, the RoPE table (an entry is shared by the tokens whose angle it is: one grid row or column, so each
        table rounding is used by at most H + W - 1 tokens and, by Cauchy-Schwarz, sum_rho (sum_j c_rho,j)^2 <=
        (H + W - 1) sum_j (sum_rho |c_rho,j|)^2): sqrt(H + W - 1) sqrt(sum_j t_ije^2) for the keys plus the
        query row's own entries (l1), added.
    G4, the contractions' own roundings (for either order: Bm's or A's d- or n-term sums, r = u_A / u_T per
        rounding in the accumulation format, and their roundings to T; the numerator's; the constant N^-1/2,
        used twice; zs, the normaliser, eps, the reciprocal and product): every rounding's coefficient written
        out, the sum of their squares taken.
    Then sigma = sqrt(G1^2 + G2^2 + G3^2 + G4^2) + |y| eps / den sigma_sbar (sbar's roundings overlap G1, G2).
    """
    n, d = q.shape[-2], q.shape[-1]
    c = config.ELEMENTARY_FUNCTION_ULPS
    eu, r = pr.eta / pr.u, numerics.accumulation_ratio(pr.dtype)
    ea = numerics.underflow_eta(verdict.accumulation_format(pr.dtype)) / pr.u
    l2 = lambda m: numerics.sum_depth_l2(m, pr.dtype)
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    skq, skk = _kappa_sigma(q, sq, cfg.kernel, pr), _kappa_sigma(k, sk, cfg.kernel, pr)
    akk = np.abs(kk)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.reweight:
            q_g, scale, alpha = _reweighting(q, kq, kk, cfg)
            src, ssrc = (q, sq) if cfg.global_query == "q" else (kq, skq)
            rounded = scale != 1.0
            # Q_g_a: the n entries' roundings in quadrature (disjoint), its own (the sum, the division, the product
            # with the scale in the twin's order) added
            sqg = np.hypot(np.sqrt(np.sum(ssrc * ssrc, axis=-2, keepdims=True)) / n,
                           math.sqrt(l2(n)) * np.sum(np.abs(src), axis=-2, keepdims=True) / n
                           + (2.0 if rounded else 1.0) * (np.abs(q_g) + eu))
            s = scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]
            s_mag = scale * (np.abs(q_g) @ akk.swapaxes(-1, -2))[..., 0, :]
            # token j's part of its logit: kappa(K_j)'s entries in quadrature (disjoint), the d-term dot product,
            # and the scale product in the reference's order
            tok_s = np.hypot(scale * np.sqrt(((q_g * q_g) @ (skk * skk).swapaxes(-1, -2))[..., 0, :]),
                             verdict.sum_rounding_l2(d, s_mag, s, pr.dtype)
                             + (1.0 if rounded else 0.0) * (np.abs(s) + eu))
            m = np.max(s, axis=-1, keepdims=True)
            # softmax_j's own: the shifted argument, exp (c ulps) and the quotient in A, stored in T, times N
            rho = r * (np.abs(s - m) + c + 1.0) + 2.0
            # underflow: the softmax stored in T (then times N: N eta_T), and the c + 1 operations in A
            s_alpha = alpha * np.hypot(tok_s, rho) + n * (eu + (c + 1.0) * ea)
            p = numerics.softmax(s, axis=-1)
            qg_part = scale * (sqg @ akk.swapaxes(-1, -2))[..., 0, :]
            sig_sbar = (np.sum(p * (tok_s + qg_part + (np.abs(s) if rounded else 0.0) + rho), axis=-1)
                        + math.sqrt(l2(n)))
        else:
            alpha, s_alpha = np.ones(q.shape[:-1]), np.zeros(q.shape[:-1])
        kw = alpha[..., None] * kk
        s_kw = skk
        if cfg.reweight:    # kappa(K) softmax (of size kw / N: its underflow is N eta_T in kw's units), then times N
            s_kw = alpha[..., None] * skk + akk * s_alpha[..., None] + 2.0 * np.abs(kw) + (n + 1.0) * eu
        if cfg.rope:
            ang = rope_2d_angles(hw[0], hw[1], d, cfg.rope_base)
            qn, kn = apply_rope_2d(kq, ang), apply_rope_2d(kw, ang)
            s_qn_own, tab_q = _rope_sigma(kq, np.zeros_like(kq), ang, pr)
            s_kn, tab_k = _rope_sigma(kw, s_kw, ang, pr)
        else:
            qn, kn, s_kn = kq, kw, s_kw
        mean = cfg.token_scaling == "mean"
        norm = 1.0 / n if mean else 1.0
        s_v = sv
        if mean:    # K and V times N^-1/2: one rounding per entry, in token j's group (underflow: N^1/2 eta_T)
            s_kn = s_kn + np.abs(kn) + math.sqrt(n) * eu
            s_v = sv + np.abs(v) + math.sqrt(n) * eu
        bm = kn.swapaxes(-1, -2) @ v                               # (B, h, d, e), unscaled
        zs = np.sum(kw, axis=-2)                                   # (B, h, d)
        num = norm * (qn @ bm)
        den = norm * np.einsum("bhia,bha->bhi", kq, zs)
        den_e = (den + cfg.eps)[..., None]
        den_eff = np.abs(den_e)
        y = num / den_e
        ay = np.abs(y)
        f = norm / den_eff
        aqn = np.abs(qn)

        # G1: the key tokens
        g1 = f * (_token_quadrature(aqn, np.abs(kn), np.abs(v), s_kn, s_v, np.zeros_like(y))
                  + ay * np.sqrt(np.maximum(np.einsum("zhia,zhab,zhib->zhi", np.abs(kq), s_kw.swapaxes(-1, -2) @ s_kw,
                                                      np.abs(kq)),
                                            0.0))[..., None])

        # G2: the queries
        g2 = np.empty_like(y)
        for b in range(q.shape[0]):
            for hh in range(q.shape[1]):
                bt = np.broadcast_to(bm[b, hh].T[:, None, :], (d, n, d))   # (e, i, a)
                pt = (apply_rope_2d(bt, -ang) if cfg.rope else bt).transpose(1, 0, 2)   # R_i^T Bm: (i, e, a)
                coef = f[b, hh][..., None] * (pt - y[b, hh][..., None] * zs[b, hh])
                direct = np.einsum("iea,ia->ie", coef * coef, skq[b, hh] ** 2)
                if cfg.rope:
                    direct = direct + (f[b, hh] ** 2) * ((s_qn_own[b, hh] ** 2) @ (bm[b, hh] ** 2))
                g2[b, hh] = np.sqrt(direct)
        if cfg.reweight:
            # Q_g's entry a moves every logit by scale dQ_g,a kappa(K_ja): its coefficient on y_ie is the exact
            # first-order sum H_iea = scale sum_j G_ije kappa(K_ja) = scale norm / den_i [qn_i . T1[:, e, a] - y_ie
            # kappa(Q_i) . T2[:, a]], T1 = sum_j kn_jb v_je kappa(K_ja), T2 = sum_j kw_jb kappa(K_ja) (signed: the
            # G_ije sum to y eps / den over j, so a perturbation common to the logits nearly cancels); its float64
            # evaluation error, gamma_{N+d+4}(u_64) times the same sum on magnitudes, is added.  The rounded constant
            # d^-1/2 (one rounding, ds_j = delta s_j) the same way with s_j for kappa(K_ja).
            g64 = numerics.gamma(n + d + 4, numerics.unit_roundoff("float64"))
            avb, akn, akw, akq = np.abs(v), np.abs(kn), np.abs(kw), np.abs(kq)
            for b in range(q.shape[0]):
                for hh in range(q.shape[1]):
                    fb, yb = f[b, hh], y[b, hh]
                    t1 = np.einsum("jb,je,ja->bea", kn[b, hh], v[b, hh], kk[b, hh], optimize=True)
                    t1a = np.einsum("jb,je,ja->bea", akn[b, hh], avb[b, hh], akk[b, hh], optimize=True)
                    hs = fb[..., None] * (np.einsum("ib,bea->iea", qn[b, hh], t1, optimize=True)
                                          - yb[..., None] * (kq[b, hh] @ (kw[b, hh].T @ kk[b, hh]))[:, None, :])
                    ha = fb[..., None] * (np.einsum("ib,bea->iea", aqn[b, hh], t1a, optimize=True)
                                          + np.abs(yb)[..., None]
                                          * (akq[b, hh] @ (akw[b, hh].T @ akk[b, hh]))[:, None, :])
                    hmat = np.abs(hs) + g64 * ha
                    g2[b, hh] += scale * np.sqrt(np.einsum("iea,a->ie", hmat * hmat, sqg[b, hh, 0] ** 2))
                    if rounded:
                        sb = s[b, hh][:, None]
                        cs = fb * (qn[b, hh] @ (kn[b, hh].T @ (sb * v[b, hh])) - yb * (kq[b, hh] @ (kw[b, hh].T @ sb)))
                        ca = fb * (aqn[b, hh] @ (akn[b, hh].T @ (np.abs(sb) * avb[b, hh]))
                                   + np.abs(yb) * (akq[b, hh] @ (akw[b, hh].T @ np.abs(sb))))
                        g2[b, hh] += np.abs(cs) + g64 * ca

        # G3: the RoPE table
        g3 = 0.0
        if cfg.rope:
            g3 = f * (math.sqrt(hw[0] + hw[1] - 1) * _token_quadrature(aqn, np.abs(kn), np.abs(v), tab_k,
                                                                      np.zeros_like(v), np.zeros_like(y))
                      + tab_q @ np.abs(bm))

        # G4: the contractions' own roundings
        sn = math.sqrt(norm)
        kn_s, v_s = sn * kn, sn * v
        bm_s, sbm_s = norm * bm, norm * (np.abs(kn).swapaxes(-1, -2) @ np.abs(v))
        s3 = aqn @ sbm_s
        lin = (qn * qn) @ (n * r * r * sbm_s ** 2 + (np.abs(bm_s) + eu) ** 2) + d * r * r * s3 ** 2
        quad = _quadratic_own_sq(qn, kn_s, v_s, pr) + n * r * r * s3 ** 2
        num_sq = np.maximum(lin, quad) + (np.abs(num) + eu) ** 2 + (4.0 * num * num if mean else 0.0)
        z, sz = norm * zs, norm * np.sum(np.abs(kw), axis=-2)
        sden = np.einsum("bhia,bha->bhi", np.abs(kq), sz)
        den_sq = (np.einsum("bhia,bha->bhi", kq * kq, n * r * r * sz ** 2 + 2.0 * (np.abs(z) + eu) ** 2)
                  + d * r * r * sden ** 2 + (np.abs(den) + eu) ** 2)
        if cfg.eps:
            den_sq = den_sq + (np.abs(den + cfg.eps) + eu) ** 2
        # the quotient: the reciprocal (its underflow eta_T times |num|) and the product, or one division
        g4 = np.sqrt(num_sq / den_eff ** 2 + ay * ay * den_sq[..., None] / den_eff ** 2
                     + (ay + np.abs(num) * eu) ** 2 + (ay + eu) ** 2)

        sigma = np.sqrt(g1 * g1 + g2 * g2 + g3 * g3 + g4 * g4)
        if cfg.reweight and cfg.eps:
            sigma = sigma + ay * cfg.eps / den_eff * sig_sbar[..., None, None]
    return sigma


def _sum_own_sq(n: int, magnitude, value, bias, pr: _Prec) -> np.ndarray:
    """The squared l2 coefficient of an n-term inner product's own roundings stored in T (verdict.sum_rounding_l2
    on the sum without the bias) and, with a bias, of the separate bias addition's rounding (|result| + eta/u)."""
    if bias is None:
        return verdict.sum_rounding_l2(n, magnitude, value, pr.dtype) ** 2
    return (verdict.sum_rounding_l2(n, magnitude - np.abs(bias), value - bias, pr.dtype) ** 2
            + (np.abs(value) + pr.eta / pr.u) ** 2)


def _attention_sigma(tok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int],
                     pr: _Prec) -> np.ndarray:
    """sigma (units of u_T, tokens (B, N, C)) of :func:`rala_attention` on exact x (see the section's comment).

    The fused projection's entries are each its own inner product (:func:`_sum_own_sq`): disjoint rounding sets,
    as :func:`_core_sigma` needs.  After the core, every element carries three parts: ``shared``, the core's sigma,
    whose roundings the channels of a token share (alpha, the normaliser); ``vpart``, LePE's propagated part
    sqrt(conv(s_v^2, W^2)) (V's entries in quadrature, being disjoint), whose roundings (channel e's V entries) are
    disjoint between channels but held by the core's key-token groups too, so that it is added to ``shared``
    (Minkowski) once the channels are combined; and ``own``, the roundings made for that element alone (LePE's own
    sums, the addition, the gate's projection entry or tanh, the gate product), disjoint between elements and from
    the other two.  The gate multiplies all by |g| and adds |y| sigma_g and the product's rounding to ``own``; the
    output projection takes ``shared`` through |W| (Minkowski), ``vpart`` and ``own`` through W^2 (quadrature over
    the channels), and adds its own sums: (|W| shared + sqrt(W^2 vpart^2))^2 + W^2 own^2 + its own^2."""
    c, (h, w) = cfg.dim, hw
    eu = pr.eta / pr.u
    bias = lambda key: None if params.get(key) is None else numerics.as_float(params[key], key)

    def proj(key, rows, x):
        wt = _weight2d(_param(params, key + ".weight"), cfg.layout, key + ".weight", rows, x.shape[-1])
        bt = bias(key + ".bias")
        y = layers.linear(x, wt, bt)
        mag = layers.linear(np.abs(x), np.abs(wt), None if bt is None else np.abs(bt))
        return y, np.sqrt(_sum_own_sq(x.shape[-1], mag, y, bt, pr)), wt

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.gate_source == "qkvo":
            p, sp_, _ = proj("qkvo", 4 * c, tok)
            g, sg = p[..., 3 * c:], sp_[..., 3 * c:]
        else:
            p, sp_, _ = proj("qkv", 3 * c, tok)
            if cfg.gate == "linear":
                g, sg, _ = proj("phi", c, tok)
            elif cfg.gate == "tanh":
                g = np.tanh(tok)
                sg = config.ELEMENTARY_FUNCTION_ULPS * (np.abs(g) + eu)
            elif cfg.gate == "identity":
                g, sg = tok, np.zeros_like(tok)
            else:
                g = sg = None
        q, k, v = p[..., :c], p[..., c:2 * c], p[..., 2 * c:3 * c]
        sq, sk, sv = sp_[..., :c], sp_[..., c:2 * c], sp_[..., 2 * c:3 * c]
        spl = lambda a: _split_heads(a, cfg.num_heads)
        y = _merge_heads(rala_core(spl(q), spl(k), spl(v), cfg, (h, w)))
        shared = _merge_heads(_core_sigma(spl(q), spl(sq), spl(k), spl(sk), spl(v), spl(sv), cfg, (h, w), pr))
        own_sq, vpart = np.zeros_like(y), np.zeros_like(y)
        if cfg.lepe_kernel:
            to_tok = lambda a: a.reshape(a.shape[0], c, h * w).transpose(0, 2, 1)
            wl, bl, pad = _param(params, "lepe.weight"), bias("lepe.bias"), cfg.lepe_kernel // 2
            v_cf, sv_cf = _tokens_to_cf(v, h, w), _tokens_to_cf(sv, h, w)
            lepe = to_tok(layers.depthwise_conv2d(v_cf, wl, bl, padding=pad))
            mag = to_tok(layers.depthwise_conv2d(np.abs(v_cf), np.abs(wl), None if bl is None else np.abs(bl),
                                                 padding=pad))
            vpart = to_tok(np.sqrt(layers.depthwise_conv2d(sv_cf * sv_cf, wl * wl, None, padding=pad)))
            y = y + lepe
            own_sq = _sum_own_sq(cfg.lepe_kernel ** 2, mag, lepe, bl, pr) + (np.abs(y) + eu) ** 2
        if g is not None:
            shared, vpart = np.abs(g) * shared, np.abs(g) * vpart
            own_sq = g * g * own_sq + (np.abs(y) * sg) ** 2 + (np.abs(g * y) + eu) ** 2
            y = g * y
        if cfg.out_proj:
            out, s_own, wt = proj("proj", c, y)
            return np.sqrt((shared @ np.abs(wt).T + np.sqrt((vpart * vpart) @ (wt * wt).T)) ** 2
                           + own_sq @ (wt * wt).T + s_own ** 2)
    return np.sqrt((shared + vpart) ** 2 + own_sq)


def _as_bound(e: np.ndarray, depth: float, pr: _Prec, note: str, sigma: Any = None,
              e_ref: Any = None) -> numerics.Bound:
    """:func:`refimpl.bounds.rigorous_bound`: Bound(E / gamma_K, K) with gamma_K(u_T) scale = E."""
    return bounds.rigorous_bound(e, depth, pr, note, sigma=sigma, e_ref=e_ref)


def rala_core_bound(q: Any, k: Any, v: Any, cfg: RALAConfig, hw: tuple[int, int] | None = None, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`rala_core` computed in precision ``dtype`` on the same (T-exact) inputs.

    Parameters: q, k, v (B, h, N, d), cfg, hw as :func:`rala_core`; dtype : the tested precision T.
    Returns numerics.Bound with scale (B, h, N, d) and the l2 coefficient sigma (:func:`_core_sigma`);
    derivation in the module's "Error model" section.  Valid for both orders and for the stage orders of the
    PyTorch twin (official: 1/(den + eps) then a product; k * softmax * N).  The rows whose normaliser
    underflows (the rows rala_core recomputes from log-features, rala_core.recomputed_rows) take the bound of
    that computation (rala_recomputed.recomputed_error, with RoPE too).  Range: for T = float64 the
    elements whose groups rala_core rescales by powers of two (a row of kappa(Q), a head's kappa(K), a column of
    V outside [2^-B, 2^B], B = config.RANGE_RESCALE_EXPONENT: tiny and subnormal inputs, ELU + 1 of inputs
    below -177) take the bound of that rescaled computation (:func:`_rescaled_error`), so that it is finite and
    relative to the output's size there; other precisions do not rescale (float32 holds no magnitude outside the
    band).  Where the bound overflows for inputs above 2^B, FloatingPointError naming the stage
    (numerics.check_bound_range).

    References: RALA Eq. 2-4, 6; Higham (2002) eq. 2.8, Lemma 3.1, eq. 3.12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, RALAConfig)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h N d"), v=(v, "B h N d"))
    if hw is not None:
        hw = validation.check_grid(hw, sz["N"], tokens="q")
    pr = _Prec.of(dtype)
    z = np.zeros_like(q)
    e, depth = _core_error(q, z, k, z, v, z, cfg, hw, pr)
    sigma = _core_sigma(q, z, k, z, v, z, cfg, hw, pr)
    e, scaled = _rescaled_error(e, q, k, v, cfg, hw, pr)
    note = ""
    if np.any(scaled):  # sigma is of the unscaled computation: E / u_T (_as_bound), the worst case, there
        sigma = np.where(scaled, np.inf, sigma)
        note = "; rows rescaled by powers of two: the rescaled computation's bound (_rescaled_error)"
    hit, alpha = recomputed_rows(q, k, cfg)
    if np.any(hit):     # the rows rala_core recomputes from log-features: the bound of that computation
        e = _recomputed(e, hit, q, k, v, alpha, cfg, hw, pr)
        sigma = np.where(hit[..., None], np.inf, sigma)     # (_as_bound: E / u_T, the worst case, there)
        note += "; rows recomputed from log-features: the rebalanced features' bound (recomputed_error)"
    e64 = None
    if not (np.all(np.isfinite(e)) and math.isfinite(pr.g(depth))):    # the reference's own error, finite
        p64 = _Prec.of("float64")
        e64 = _rescaled_error(_core_error(q, z, k, z, v, z, cfg, hw, p64)[0], q, k, v, cfg, hw, p64)[0]
        if np.any(hit):
            e64 = _recomputed(e64, hit, q, k, v, alpha, cfg, hw, p64)
    bound = _as_bound(e, depth, pr, f"rala_core (exact inputs): running error bound, depth K = {depth:.4g}; l2 "
                                    f"coefficient sigma (_core_sigma){note}", sigma=sigma, e_ref=e64)
    return numerics.check_bound_range(bound, "rala_core_bound", q=q, k=k, v=v)


def _core_underflow(q: Any, k: Any, v: Any, cfg: RALAConfig, hw: tuple[int, int] | None = None, *,
                    dtype: Any) -> np.ndarray:
    """U (B, h, N, d): the part of ``rala_core_bound(q, k, v, cfg, hw, dtype=dtype).array(dtype, shape)`` that
    does not scale with the data, that array minus A, the array of the same model with eta_T = 0 and without the
    comparison's K (eta_T + eta_64): U = (f_K + gamma_K(u_64)) (E - E_0) / gamma_K + K (eta_T + eta_64)
    (:meth:`refimpl.numerics.Bound.array`), E_0 the running bound with every eta_T of the error model 0 (the
    products', quotients', library functions', RoPE table's and rescaled groups' underflow) and, on the elements
    rala_core rescales, of the rescaled computation alone (the direct model, which :func:`_rescaled_error`
    keeps where larger, is the same homogeneous expression but for its eta_T terms and the float64 evaluation
    of its tiny operands, which underflows: both are in U).  A is homogeneous like the computation (degree 1 in
    V, 0 in a row of kappa(Q) and, without reweighting, in kappa(K); its float64 evaluation commutes with such
    power-of-two scalings wherever it stays in the normal range), U >= 0 its absolute underflow part (the
    model increases with eta_T); inf where the bound is not finite.  Same arguments as :func:`rala_core_bound`
    (the bound is evaluated twice); used by tests/test_range_bounds.py's homogeneity check for its tolerance."""
    bound = rala_core_bound(q, k, v, cfg, hw, dtype=dtype)
    q, k, v = numerics.as_float(q, "q"), numerics.as_float(k, "k"), numerics.as_float(v, "v")
    hw = None if hw is None else validation.check_grid(hw, q.shape[-2], tokens="q")
    pr = dataclasses.replace(_Prec.of(dtype), eta=0.0)
    z = np.zeros_like(q)
    e0, depth = _core_error(q, z, k, z, v, z, cfg, hw, pr)
    e0 = _rescaled_error(e0, q, k, v, cfg, hw, pr, keep_direct=False)[0]
    hit, alpha = recomputed_rows(q, k, cfg)
    if np.any(hit):
        e0 = _recomputed(e0, hit, q, k, v, alpha, cfg, hw, pr)
    eta_k = bound.k * (numerics.underflow_eta(dtype) + numerics.underflow_eta("float64"))
    free = dataclasses.replace(bound, scale=e0 / pr.g(depth), ref_scale=None, sigma=None)
    with np.errstate(invalid="ignore", over="ignore"):
        full = bound.array(dtype, e0.shape)
        u = full - free.array(dtype, e0.shape) + eta_k    # exact where the arrays are subnormal (T = float64)
    return np.where(np.isfinite(full), u, np.inf)


def _rescaled_error(e: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: RALAConfig, hw: Any,
                    pr: _Prec, keep_direct: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(E, scaled): E (B, h, N, d) with the elements that :func:`rala_core` computes on groups rescaled by powers
    of two (``scaled``: e_q of the row, e_k of the head or e_v of the column nonzero, normaliser_range.
    scaling_exponents; T = float64 only, the one format with magnitudes outside the band) given the bound of that
    computation; every other element keeps ``e``, bit for bit.  The computation: kappa(Q), kappa(K) and alpha as
    unscaled (alpha's logits are not scaled up: their absolute underflow moves alpha relatively by eta_T);
    kappa(Q_i) 2^-e_q, kappa(K) 2^-e_k, V 2^-e_v exact (a group scaled down may underflow: eta_T per entry);
    Eq. 2-3 on them (:func:`_attention_parts_error` without eps); the normaliser den (eps = 0) as
    normaliser_range.normaliser_scaled forms it, den 2^-g + eps 2^-(e_q + e_k + g) (the ldexp of den and of the
    constant each eta_T where they underflow, the addition one rounding, :func:`refimpl.bounds.e_sum2`); the
    quotient (two roundings, the twin's order included) scaled back by 2^(e_v - g), whose rounding into the
    subnormal range adds eta_T.  That bound is homogeneous like the computation: on tiny inputs it is the bound
    of the same inputs moved into the normal range, scaled back (up to its eta_T terms).  Where the direct bound
    ``e`` is finite and larger (a direct evaluation, which does not rescale, underflows), it is kept: the
    bound covers both evaluations (``keep_direct`` False: the rescaled computation's bound alone)."""
    kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
    e_q, e_k, e_v = scaling_exponents(kq, kk, v)
    scaled = np.broadcast_to((e_q != 0) | (e_k != 0) | (e_v != 0), e.shape)
    if pr.dtype != "float64" or not np.any(scaled):
        return e, np.zeros(e.shape, dtype=bool)
    z = np.zeros_like(q)
    ekq, ekk = _e_kappa(q, z, cfg.kernel, pr), _e_kappa(k, z, cfg.kernel, pr)
    if cfg.reweight:
        alpha, ealpha, _ = _alpha_error(q, z, kq, ekq, kk, ekk, cfg, pr)
    else:
        alpha, ealpha = np.ones(q.shape[:-1]), np.zeros(q.shape[:-1])
    down = lambda x: np.where(x > 0, pr.eta, 0.0)      # a group scaled down: an entry may underflow
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        kq_s, ekq_s = np.ldexp(kq, -e_q), np.ldexp(ekq, -e_q) + down(e_q)
        kk_s, ekk_s = np.ldexp(kk, -e_k), np.ldexp(ekk, -e_k) + down(e_k)
        kw_s = alpha[..., None] * kk_s
        ekw_s = _e_product(alpha[..., None], ealpha[..., None], kk_s, ekk_s, pr) + pr.eta
        v_s, ev_s = np.ldexp(v, -e_v), np.broadcast_to(down(e_v), v.shape)
        num, enum, den, eden, _ = _attention_parts_error(kq_s, ekq_s, kw_s, ekw_s, v_s, ev_s,
                                                         dataclasses.replace(cfg, eps=0.0), hw, pr)
        e_qk = (e_q + e_k)[..., 0]
        den_eff, g = normaliser_scaled(den, e_qk, eps=cfg.eps, eps_policy="add", clamp_min=None)
        den_g, eden_g = np.ldexp(den, -g), np.ldexp(eden, -g) + down(g)
        if cfg.eps:
            eps_c = np.ldexp(cfg.eps, -e_qk - g)
            eden_g = _e_sum2(den_g, eden_g, eps_c, np.where(eps_c < np.finfo(np.float64).tiny, pr.eta, 0.0), pr)
        y = num / den_eff[..., None]
        fix = np.ldexp(_e_quotient(y, enum, den_eff[..., None], eden_g[..., None], pr, roundings=2),
                       e_v - g[..., None]) + pr.eta
    fix = np.where(np.isnan(fix), np.inf, fix)
    # A direct float64 evaluation (the twins: no rescaling) computes these rows with products that underflow,
    # which the direct bound's eta_T terms cover: the larger of the two where the direct one is finite.
    if keep_direct:
        fix = np.where(np.isfinite(e), np.maximum(fix, e), fix)
    return np.where(scaled, fix, e), scaled



def _recomputed(e: np.ndarray, hit: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, alpha: np.ndarray,
                cfg: RALAConfig, hw: Any, pr: _Prec) -> np.ndarray:
    """rala_recomputed.recomputed_error on the rows ``hit``, with alpha's absolute error bound from
    :func:`_alpha_error` (exact inputs; None without reweighting)."""
    ealpha = None
    if cfg.reweight:
        z = np.zeros_like(q)
        kq, kk = kappa(q, cfg.kernel), kappa(k, cfg.kernel)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ealpha = _alpha_error(q, z, kq, _e_kappa(q, z, cfg.kernel, pr), kk, _e_kappa(k, z, cfg.kernel, pr), cfg,
                                  pr)[1]
    return recomputed_error(e, hit, q, k, v, alpha, ealpha, cfg, hw, pr)
