"""FLatten's bounds where a direct evaluation leaves float64's (or the tested format's) normal range: the absolute
(gradual-underflow) errors of an evaluation that does not rescale (:func:`direct_underflow`), the rows the
relative model cannot cover (:func:`_range_rows`, :func:`_tiny_rows`, :func:`_no_bound`), and the error of the
log-features from which the definition recomputes a row whose normaliser underflowed
(:func:`log_focused_error`) and those rows' rebalanced features and coefficients (:func:`recomputed_rows`), both
used by focused_bounds.recomputed_error.

Reference: D. Han et al., "FLatten Transformer", ICCV 2023 (../shared/seeds/001_f3b1223f03d702ca.txt), Eq. 4-6
(focused_range's H1-H3); Higham (2002) §2.1 eq. 2.8 (gradual underflow), §3.1.

Layer: attention: imports config, numerics, feature_maps, :mod:`.focused_range` and :mod:`.normaliser_range`;
imported by :mod:`.focused_bounds`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .. import config, numerics
from ..feature_maps import focused_function as _focused_function_numpy
from ..feature_maps import norm_scaled as _norm_scaled
from .focused_range import band_exponent, flagged_rows, live_rows, log_focused
from .normaliser_range import argument_errors, rebalance_parts

__all__ = ["eta_in_u", "direct_underflow", "log_focused_error", "RecomputedRows", "recomputed_rows"]


def eta_in_u(dtype: Any) -> float:
    """eta_T / u_T: Higham's absolute underflow error per rounding (eq. 2.8; half the smallest subnormal) in
    units of u_T, formed without underflowing (2^-1022 for float64, 2^-126 for float32 and bfloat16, 2^-14
    for float16); 0 for dtype None.  (numerics.underflow_eta("float64") itself evaluates to 0.0.)"""
    if dtype is None:
        return 0.0
    name = numerics.format_name(dtype)         # torch or NumPy dtypes, or their names; else a named error
    tiny = {"float64": 2.0 ** -1074, "float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}[name]
    return tiny / numerics.unit_roundoff(name) / 2.0



#: Below this largest feature (2^-1022 2^53) a row's or a head's direct features carry absolute (subnormal)
#: rounding errors that are not small beside them: the model's relative rounding terms no longer cover them.
_TINY_FEATURE = 2.0 ** -969


def _range_rows(scaled, eps, normaliser, phi_q, phi_k, tiny_resets=True):
    """(reset, live, scaled) for ``scaled`` = (rescaled features pq, pk, their focused_range.RangeInfo) as the
    definition computes them (focused_core._range_features) and the direct features phi_q, phi_k (head-split,
    as the model below uses them): the live rows
    (focused_range.live_rows) whose error the direct model does not bound, because the definition computes
    them otherwise (focused_range): the row's or its head's keys' nonzero pre-features have direct features
    all below 2^-969 (rounded to the subnormal grid, or flushed to 0: an error not relative to them, and the
    model's eta-sized underflow terms underflow themselves in float64), or a normaliser below 2^-960 in the
    rescaled units (recomputed from log-features; products underflowed).  ``scaled`` also gives the output
    the definition returns.  ``tiny_resets`` False: the tiny rows keep their bound (the caller covers them with
    :func:`direct_underflow`, see :func:`focused_attention_bound`); only the recomputed rows are reset."""
    pq, pk, info = scaled
    live = live_rows(info.a_q, info.a_k, eps)
    reset = flagged_rows(pq, pk, info, eps, normaliser)
    if tiny_resets:
        reset = reset | _tiny_rows(info, phi_q, phi_k)
    return live & reset, live, scaled


def _tiny_rows(info, phi_q, phi_k) -> np.ndarray:
    """(B, h, N): the rows whose (or whose head's keys') nonzero pre-features have features phi_q (phi_k) all
    below 2^-969 (:func:`_range_rows`)."""
    with np.errstate(invalid="ignore"):
        tiny_q = (np.max(info.a_q, axis=-1) > 0) & ~(np.max(phi_q, axis=-1) >= _TINY_FEATURE)
        tiny_k = (np.max(info.a_k, axis=(-2, -1)) > 0) & ~(np.max(phi_k, axis=(-2, -1)) >= _TINY_FEATURE)
    return tiny_q | tiny_k[..., None]


def _no_bound(e: np.ndarray, reset: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``e`` with no bound (inf: a comparison there is inconclusive, never "match") in the ``reset`` rows and
    wherever the model's own arithmetic gave NaN in a live row (an overflow inf - inf, 0 inf); NaN stays only
    in the rows whose exact result is 0/0 (dead rows with eps = 0)."""
    return np.where(reset[..., None] | (live[..., None] & np.isnan(e)), np.inf, e)


# ===================================================================================================
# The underflow of a direct evaluation (no rescaling), for the bound of the attention core
# ===================================================================================================

def _frame(x: np.ndarray, axis: Any) -> np.ndarray:
    """frexp's exponent (int64, keepdims) of max |x| along ``axis`` (0 where it is 0 or not finite): the exact
    power-of-two frame in which :func:`direct_underflow` evaluates its terms without under- or overflowing."""
    with np.errstate(invalid="ignore"):
        m = np.max(np.abs(x), axis=axis, keepdims=True)
    return np.where(np.isfinite(m) & (m > 0), np.frexp(m)[1], 0).astype(np.int64)


def direct_underflow(a_q: np.ndarray, a_k: np.ndarray, v: np.ndarray, *, p: float, eps: float, normaliser: str,
                     dtype: Any, rescaled: Any = True) -> np.ndarray:
    """The gradual-underflow part of the error of a DIRECT evaluation of the normalised attention (Eq. 4, or the
    released mean-of-keys normaliser) on the pre-features a_q (B,h,N,d), a_k (B,h,n,d) >= 0 and values v
    (B,h,n,e) in precision T, in units of u_T (an E coefficient, (B,h,N,e)): the absolute errors eta_T (half
    T's smallest subnormal, Higham eq. 2.8) that the products, f_p's last products and the quotient's inputs
    may take in T's subnormal range, amplified through num / den.  0 for ``dtype`` None.

    An implementation that does not rescale (the PyTorch twin, a plain NumPy or C evaluation) computes
    phi_p(Q), phi_p(K) and every product in the original units: where they fall below T's normal range each
    rounding errs by up to eta_T absolutely, which the relative model of the definition's rescaled arithmetic
    does not contain.  Counted (in eta_T, original units; d channels, M keys, q1 = ||phi_q_i||_1,
    v1_e = sum_j |v_je|, O the output):

    - f_p's own: the max-scaled f_p (||x|| = m ||r||, then ||x|| g) has two products that may be subnormal,
      so an entry errs by delta = 2 eta_T where ||x|| < T's smallest normal, 1 elsewhere (only the last product),
      plus 1 where ||x|| < 2^-960 (there focused_function_error's own underflow term (p + c + 4) ||x|| eta_T,
      below eta_T, underflows in the model's float64 arithmetic), 0 for a zero token (f_p(0) = 0 exactly);
      through the attention (first order, either order):
      num: delta_q_i sum_c (|phi_k|^T |v|)_ce + q1 sum_j delta_k_j |v_je|,
      den: delta_q_i sum_c sum_j |phi_k_jc| + q1 sum_j delta_k_j;
    - the products' roundings (as linear.kernelized_attention_bound counts them, covering either order):
      num: M q1 + d v1 + d + M, den: M q1 + d M + d + M (+ 1 for eps);
    - the released normaliser computes (phi_k n^-1/2)^T (v n^-1/2) and phi_q . mean phi_k: the two scalings add
      an eta per entry of phi_k and of v (so delta_k_j r + 1 and 1, r = n^-1/2), the mean one per channel.

    Then the quotient: (err_num + |O| err_den) / (|den| - err_den) (inf where that is <= 0: rounding may reach
    a zero normaliser, no bound exists).  ``rescaled`` (bool or (B,h,N) bool): the rows whose main bound models
    the definition's rescaled arithmetic (its product roundings are not the direct ones), or whose model features
    are below 2^-969 (the model's own float64 arithmetic errs by eta_64-sized terms of the same form, at most
    k u_T of these); in the others the main
    bound (linear.kernelized_attention_bound on the same values) already counts the products' roundings for
    normaliser "sum", so only f_p's own term is added (the released normaliser's main bound is of the
    equivalent Eq. 4 form, in other units: everything is added).

    Every term is evaluated in an exact power-of-two frame (a per query row, b per head's keys, c per value
    column: phi_q = 2^a pq, phi_k = 2^b pk, v = 2^c vs) so that it neither under- nor overflows where the
    result is representable: eta_T 2^x / u_T = ldexp(eta_T / u_T, x), eta_T / u_T being T's smallest normal.

    References: FLatten Eq. 4-6; Higham (2002) §2.1 eq. 2.8 (gradual underflow), §3.1.
    """
    shape = a_q.shape[:-1] + (v.shape[-1],)
    if dtype is None:
        return np.zeros(shape)
    tiny = eta_in_u(dtype)                                   # eta_T / u_T = T's smallest normal number
    a, b = _frame(a_q, -1), _frame(a_k, (-2, -1))            # (B,h,N,1), (B,h,1,1)
    sq, sk = np.ldexp(a_q, -a), np.ldexp(a_k, -b)
    pq, pk = _focused_function_numpy(sq, p), _focused_function_numpy(sk, p)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        def delta(s, e):                                      # f_p's own eta count per token
            nrm = _norm_scaled(s, -1)[1]                      # ||x|| 2^-e
            return np.where(nrm > 0, 1.0 + (nrm < np.ldexp(tiny, np.clip(-e, -2200, 2200)))
                            + (nrm < np.ldexp(1.0, np.clip(-960 - e, -2200, 2200))), 0.0)
        dq = delta(sq, a)                                     # (B,h,N,1)
        dk = delta(sk, b)                                     # (B,h,M,1)
    return _underflow_terms(pq, pk, v, a, b, dq, dk, eps=eps, normaliser=normaliser, dtype=dtype,
                            rescaled=rescaled)


def log_direct_underflow(lq: np.ndarray, lk: np.ndarray, v: np.ndarray, *, token_scope: bool, eps: float,
                         normaliser: str, dtype: Any, rows: np.ndarray) -> np.ndarray:
    """:func:`direct_underflow` with every product counted, from the log-features lq = log phi(Q) (B,h,N,d),
    lk = log phi(K) (B,h,n,d) in the original units (focused_range.log_focused; -inf for 0), for the modules,
    whose features are f_p of the projections' pre-features per head or, ``token_scope``, over the whole
    token (FLatten's released norm scope: a head's features may lie far below the token's largest, 2^-1000 and
    beyond, where the model's own float64 terms underflow).  The frames are the exponents of the largest
    feature (a row's, a head's keys'), the features there exp(l - frame ln 2) (their rounding, relative c u, is
    far below the slack of counting every product's eta_T); f_p's own count per token from ||a|| = ||f_p(a)||
    (f_p keeps the norm over its scope), 0.5 logsumexp(2 l).  E (B,h,N,e) in the ``rows`` (B,h,N), 0 elsewhere.

    References: FLatten Eq. 4-6 (focused_range H1, H3); Higham (2002) eq. 2.8."""
    shape = lq.shape[:-1] + (v.shape[-1],)
    if dtype is None or not np.any(rows):
        return np.zeros(shape)
    tiny = eta_in_u(dtype)
    ln2 = math.log(2.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        def frame(lx, axis):
            m = np.max(lx, axis=axis, keepdims=True)
            return np.where(np.isfinite(m), np.floor(m / ln2) + 1, 0).astype(np.int64)

        def log_norm(lx):                                     # log ||a|| over f_p's scope, (B, h, T, 1)
            if not token_scope:
                t = lx
            else:                                             # the token's channels across its heads
                t = np.moveaxis(lx, 1, -2).reshape(lx.shape[0], lx.shape[2], 1, -1).swapaxes(1, 2)
            m = np.max(t, axis=-1, keepdims=True)
            safe = np.where(np.isfinite(m), m, 0.0)
            out = safe + 0.5 * np.log(np.sum(np.exp(2.0 * (t - safe)), axis=-1, keepdims=True))
            out = np.where(np.isfinite(m), out, -np.inf)
            return out if not token_scope else np.broadcast_to(out, lx.shape[:-1] + (1,))

        def delta(lx):
            ln = log_norm(lx)
            return np.where(ln > -np.inf, 1.0 + (ln < math.log(tiny)) + (ln < -960.0 * ln2), 0.0)
        a, b = frame(lq, -1), frame(lk, (-2, -1))
        pq, pk = np.exp(lq - a * ln2), np.exp(lk - b * ln2)
        dq, dk = delta(lq), delta(lk)
    out = _underflow_terms(pq, pk, v, a, b, dq, dk, eps=eps, normaliser=normaliser, dtype=dtype, rescaled=True)
    return np.where(rows[..., None], out, 0.0)


def _underflow_terms(pq, pk, v, a, b, dq, dk, *, eps, normaliser, dtype, rescaled) -> np.ndarray:
    """The terms of :func:`direct_underflow` from the features in their exact power-of-two frames
    (phi_q = 2^a pq, phi_k = 2^b pk) and f_p's own eta counts dq (B,h,N,1), dk (B,h,M,1)."""
    tiny = eta_in_u(dtype)
    d, m_keys = pq.shape[-1], pk.shape[-2]
    c = _frame(v, -2)                                         # (B,h,1,e)
    vs = np.abs(np.ldexp(v, -c))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        def pw(x, shift=0):                                   # eta_T 2^(x - shift) / u_T
            return np.ldexp(tiny, np.clip(x - shift, -2200, 2200))

        q1 = np.sum(pq, axis=-1, keepdims=True)               # (B,h,N,1)
        v1 = np.sum(vs, axis=-2, keepdims=True)               # (B,h,1,e)
        ksum = np.sum(pk, axis=-2, keepdims=True)             # (B,h,1,d)
        kv = pk.swapaxes(-1, -2) @ vs                         # (B,h,d,e)
        kvsum = np.sum(kv, axis=-2, keepdims=True)            # (B,h,1,e)
        dkv = np.sum(dk * vs, axis=-2, keepdims=True)         # (B,h,1,e): sum_j delta_k_j |v_je|
        dks = np.sum(dk, axis=-2, keepdims=True)              # (B,h,1,1)
        qk = pq @ ksum.swapaxes(-1, -2)                       # (B,h,N,1)
        s_num = pq @ kv                                       # (B,h,N,e)
        # where eps dominates the normaliser beyond 2^1000 in this frame, the frame is shifted down by s
        sh = np.maximum(-(a + b) + int(np.frexp(eps)[1]) - 1000, 0) if eps > 0 else np.zeros_like(a)
        eps_s = np.ldexp(np.float64(eps), np.clip(-(a + b) - sh, -2200, 2200))
        qk, s_num = np.ldexp(qk, -sh), np.ldexp(s_num, -sh)
        rows = np.broadcast_to(np.asarray(rescaled, dtype=bool)[..., None] if np.ndim(rescaled) else
                               np.asarray(rescaled, dtype=bool), a.shape)
        prods = rows if normaliser == "sum" else np.ones_like(rows)
        if normaliser == "sum":
            den = qk + eps_s
            o = s_num / den
            num_t = dq * kvsum * pw(-a, sh) + q1 * dkv * pw(-b, sh)
            den_t = dq * np.sum(ksum, axis=-1, keepdims=True) * pw(-a, sh) + q1 * dks * pw(-b, sh)
            num_r = m_keys * q1 * pw(-b - c, sh) + d * v1 * pw(-a - b, sh) \
                + (d + m_keys) * pw(-a - b - c, sh)
            den_r = m_keys * q1 * pw(-b, sh) + (d * m_keys + d + m_keys + (eps > 0)) * pw(-a - b, sh)
        else:
            r = m_keys ** -0.5
            den = qk / m_keys + eps_s
            o = r * r * s_num / den
            num_t = dq * r * r * kvsum * pw(-a, sh) + q1 * (r * r * dkv + r * v1) * pw(-b, sh) \
                + r * qk * pw(-c)                             # qk is in the shifted frame already
            den_t = dq * np.sum(ksum, axis=-1, keepdims=True) / m_keys * pw(-a, sh) \
                + q1 * (dks / m_keys + 1.0) * pw(-b, sh)
            num_r = m_keys * q1 * pw(-b - c, sh) + d * r * v1 * pw(-a - b, sh) \
                + (d + m_keys) * pw(-a - b - c, sh)
            den_r = m_keys * q1 * pw(-b, sh) + (2 * d + (eps > 0)) * pw(-a - b, sh)
        live = prods & (q1 > 0)                               # a zero query row's products are exactly 0
        num_e = num_t + np.where(live, num_r, 0.0)
        den_e = den_t + np.where(live, den_r, 0.0)
        low = den - numerics.unit_roundoff(dtype) * den_e
        out = np.where(low > 0, (num_e + o * den_e) / low, np.inf)
        out = np.where(den > 0, out, np.nan)                  # a dead row (0/0 exactly) stays NaN
        return np.ldexp(out, c)


# ===================================================================================================
# The error of the log-features (focused_range's H3) of the recomputed rows
# ===================================================================================================

def log_focused_error(a: np.ndarray, p: float, axis: int = -1, rel: np.ndarray | None = None) -> np.ndarray:
    """Absolute error, in units of u (float64's, the only format that recomputes), of the log-feature
    focused_range.log_focused(log a, p) = lm + log||r|| + p lr - log||r^p|| as computed, for exact pre-features
    a >= 0 (0 where a = 0: the feature is 0 exactly, its log -inf).  An absolute error u E of log f is a
    relative one of f = exp(log f) (first order): the relative error coefficient of the rebalanced features.

    Derivation (first order; c = config.ELEMENTARY_FUNCTION_ULPS, each log and exp within c ulps, i.e. an
    absolute error c u |log y| for log y; la = log a, lm = max la, lr = la - lm <= 0, d the length):
    lr carries delta = c (|la| + |lm|) + |lr| (the two logs and the difference's rounding);
    S1 = sum exp(2 lr) in [1, d]: relative error rho_1 = sum_j w1_j (2 delta_j + c) + (d - 1) with
    w1 = exp(2 lr) / S1 (each term's relative error, weighted, and the sum's d - 1 roundings), and log S1
    errs by rho_1 + c |log S1|; likewise S2 = sum exp(2 p lr) with 2 p delta_j + |2 p lr_j| + c per term
    (the product 2 p lr rounds once); p lr errs by p delta + |p lr|; the three additions of
    lm + log(S1)/2 + p lr - log(S2)/2 round by at most |lm| + |p lr| + log d each (a bound on every partial sum):

        E = c |lm| + (rho_1 + c log S1)/2 + p delta + |p lr| + (rho_2 + c log S2)/2 + 3 (|lm| + |p lr| + log d).

    ``rel``: relative error coefficients of the pre-features themselves (units of u; a module's projections and
    their ReLU, eps and scale), propagated through d log f_c / d log a_j = p [c = j] + w1_j - p w2_j (lm
    cancels): p rel_c + sum_j (w1_j + p w2_j) rel_j more.

    References: FLatten Eq. 6 (focused_range H3); Higham (2002) §3.1 (sums), Lemma 3.1."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    d = a.shape[axis]
    with np.errstate(divide="ignore", invalid="ignore", under="ignore", over="ignore"):
        la = np.log(a)
        lm = np.max(la, axis=axis, keepdims=True)
        lm = np.where(np.isfinite(lm), lm, 0.0)
        lr = la - lm
        live = a > 0
        delta = np.where(live, c * (np.abs(la) + np.abs(lm)) + np.abs(lr), 0.0)
        t1, t2 = np.where(live, np.exp(2.0 * lr), 0.0), np.where(live, np.exp(2.0 * p * lr), 0.0)
        s1, s2 = np.sum(t1, axis=axis, keepdims=True), np.sum(t2, axis=axis, keepdims=True)
        safe1, safe2 = np.where(s1 > 0, s1, 1.0), np.where(s2 > 0, s2, 1.0)
        rho1 = np.sum(t1 * (2.0 * delta + c), axis=axis, keepdims=True) / safe1 + (d - 1)
        plr = np.where(live, np.abs(p * lr), 0.0)
        rho2 = np.sum(t2 * (2.0 * p * delta + 2.0 * plr + c), axis=axis, keepdims=True) / safe2 + (d - 1)
        e = c * np.abs(lm) + 0.5 * (rho1 + c * np.log(safe1)) + p * delta + plr \
            + 0.5 * (rho2 + c * np.log(safe2)) + 3.0 * (np.abs(lm) + plr + math.log(d))
        if rel is not None:
            rel = np.where(live, rel, 0.0)
            e = e + p * rel + np.sum((t1 / safe1 + p * t2 / safe2) * rel, axis=axis, keepdims=True)
    return np.where(live, e, 0.0)


@dataclasses.dataclass(frozen=True)
class RecomputedRows:
    """The parts of focused_bounds.recomputed_error that depend on neither the tested format nor the model (E or
    sigma), for the rows ``rows`` (B, h, N) of values with ``e`` channels: the rebalanced features pq, pk, their
    relative error coefficients times the features (eq, ek), V scaled by 2^-x_v (vs, evs), rho per row and
    eps_eff (eps, or eps n for the mean-of-keys normaliser); pq None where no row is recomputed."""

    rows: np.ndarray
    e: int
    pq: Any = None
    pk: Any = None
    eq: Any = None
    ek: Any = None
    vs: Any = None
    evs: Any = None
    x_v: Any = None
    rho: Any = None
    eps_eff: float = 0.0


def recomputed_rows(a_q: np.ndarray, a_k: np.ndarray, v: np.ndarray, rows: np.ndarray, *, p: float, eps: float,
                    normaliser: str, logs: Any = None, e_v: Any = None) -> RecomputedRows:
    """The :class:`RecomputedRows` of focused_bounds.recomputed_error (its arguments less the format and the
    model; the derivation is there): the log-features and their errors (:func:`log_focused_error`), their
    rebalancing (normaliser_range.rebalance_parts), the keys' per-channel max m, the feature coefficients and
    rho, formed once for every format and model (focused_bounds.recomputed_rows_error)."""
    if not np.any(rows):
        return RecomputedRows(rows, v.shape[-1])
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    n_keys = v.shape[-2]
    eps_eff = eps * n_keys if normaliser == "mean_scaled" else eps
    x_v = band_exponent(v, -2)
    vs = np.ldexp(v, -x_v)
    evs = np.zeros_like(vs) if e_v is None else np.ldexp(e_v, -x_v)
    with np.errstate(divide="ignore", invalid="ignore", under="ignore", over="ignore"):
        if logs is None:
            lq, lk = log_focused(np.log(a_q), p), log_focused(np.log(a_k), p)
            elq, elk = log_focused_error(a_q, p), log_focused_error(a_k, p)
        else:
            lq, lk, elq, elk = logs
        pq, pk, r, lq_t, m_t = rebalance_parts(lq, lk, False)
        arg_q, arg_k = argument_errors(lq, lk, lq_t, m_t)
        coef_q = np.where(pq > 0, elq + c + arg_q, 0.0)
        coef_k = np.where(pk > 0, elk + c + arg_k, 0.0)
        if eps_eff > 0:
            coef_q = coef_q + np.where(pq > 0, np.max(elq, axis=-1, keepdims=True)
                                       + np.max(elk, axis=(-2, -1), keepdims=True) + 2.0 * c + 2.0, 0.0)
        rho = np.exp(math.log(eps_eff) - r[..., 0]) if eps_eff > 0 else np.zeros(r.shape[:-1])
    return RecomputedRows(rows, v.shape[-1], pq, pk, coef_q * pq, coef_k * pk, vs, evs, x_v, rho, eps_eff)
