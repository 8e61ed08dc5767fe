"""Range safety of FLatten's focused linear attention (FLatten Eq. 4-6 and 10-12): finite inputs of any
magnitude give the finite result the mathematics has, or a FloatingPointError naming the stage where that
result is beyond float64.

The mathematics.  With phi_p(x) = f_p(ReLU(x)) (Eq. 6), a = ReLU(x) (+ relu_eps) (/ softplus(s)) >= 0 the
pre-features of a query row or key token,

  (H1) f_p is homogeneous of degree 1: f_p(2^-e a) = 2^-e f_p(a), exactly in floating point for a power of two
       (the max-scaled form computes r = a / max a, which does not change, and ||a|| = max ||r||, which scales
       exactly) as long as nothing over- or underflows;
  (H2) Eq. 4, and the released mean-of-keys normaliser (Eq. 4 with eps n, see focused_core), are of degree 0 in
       each row of phi(Q) and in each head's keys phi(K) together, with eps scaled along, and of degree 1 in
       each column of V (normaliser_range's R2);
  (H3) f_p(a)_c = ||a|| r_c^p / ||r^p|| with r = a / max a, so log f_p(a)_c = log max a + log ||r|| +
       p log r_c - log ||r^p||: the norms ||r||, ||r^p|| lie in [1, sqrt d] (their largest entry is 1), so this
       log-feature has no underflow, even where r_c^p is below 2^-1074 (a key channel 2^-400 below the key's
       largest with p = 3).

What fails without them (tests/test_range_safety.py reproduces each case):

- subnormal and tiny pre-features (the paper preset, q, k below 2^-1000): f_p's output is rounded to the
  subnormal grid (f_p([0, 2, 1, 1] 2^-1074) = [0, 2.41, 0.30, 0.30] 2^-1074 is returned as [0, 2, 0, 0] 2^-1074),
  so the products phi(Q_i)_c phi(K_j)_c are 0 or wrong: a zero normaliser (0/0) for rows whose exact normaliser
  is > 0, or a finite output with an O(1) relative error;
- huge pre-features (the official preset at 2^600 .. 2^1000): relu_eps's channels give r_c^p below 2^-1074 (f_p's
  small entries underflow to 0, their exact values being below float64 too), and the normaliser's eps, scaled by
  2^-(e_q + e_k) with the features (e_q + e_k > 1100), underflows to 0: a row whose live channels meet only
  underflowed key channels is 0/0 although its exact normaliser is about eps; near 2^1023 the pre-features
  (ReLU + relu_eps) / softplus(s), softplus(s) < 1, and ||a|| overflow;
- a key channel far below the key's largest entry (ratio below 2^-358 for p = 3, at any magnitude): f_p's entry
  underflows to 0, and a query row whose only live channels are those has a zero normaliser (0/0);
- the DWC branch (Eq. 10-12) of values near 2^1023: the convolution's sum overflows.

The remedy: each query row's and each head's keys' pre-features are scaled by the exact power of two
(:func:`band_exponent`) that brings their largest entry into [1/2, 1) where it lies outside [2^-B, 2^B]
(B = config.RANGE_RESCALE_EXPONENT; inside the band the exponent is 0 and the computation is literally the
unscaled one, bit for bit); the attention runs on those features with V's columns scaled alike and eps scaled
with the normaliser (normaliser_range.normaliser_scaled, quotient: :func:`attend_rescaled`; in the presets the
projections are scaled before the division by softplus(s), focused_core._pre_features_scaled); a live row (exact
normaliser > 0: some channel where the query's and some key's pre-features are both > 0, or eps > 0) whose
normaliser as computed is 0, not finite or below 2^-960 (where products may have underflowed) is recomputed from
the log-features of H3 (normaliser_range.rebalanced_output: :func:`recompute_rows`); the DWC branch runs on V's
columns scaled alike (:func:`dwc_rescaled`), and a sum beyond float64 raises FloatingPointError naming the stage
(:func:`checked_sum`).  ``power_scaling="none"`` (x**p as written, the released code's overflow) is left as it is.

References: FLatten Eq. 4-6, 10-12, Appendix Eq. 18-21; normaliser_range's docstring (R1, R2, Cody-Waite).

Layer: attention: imports config and :mod:`.normaliser_range` only; imported by :mod:`.focused_core` (the
definition) and :mod:`.focused_bounds` (the bounds follow the same paths).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import config
from .normaliser_range import normaliser_scaled, quotient, rebalanced_output

__all__ = ["band_exponent", "log_focused", "RangeInfo", "attend_rescaled", "live_rows", "flagged_rows",
           "recompute_rows", "dwc_rescaled", "checked_sum"]

_BAND = 2.0 ** config.RANGE_RESCALE_EXPONENT
#: Below this (in units where each group's largest feature is about 1) a normaliser may have lost products
#: to underflow (normaliser_range.underflow_rows uses the same edge).
_SMALL_NORMALISER = 2.0 ** -960


def band_exponent(x: np.ndarray, axis: Any) -> np.ndarray:
    """The exponent e (int64, ``keepdims`` along ``axis``) of an exact rescaling x -> x 2^-e: frexp's exponent of
    m = max |x| (so m 2^-e lies in [1/2, 1)) where m is finite, > 0 and outside [2^-B, 2^B], B =
    config.RANGE_RESCALE_EXPONENT; 0 elsewhere (inside the band: the unscaled computation).  Unlike
    numerics.pow2_exponent also tiny and subnormal groups are scaled (up), for f_p's output and V's products."""
    with np.errstate(invalid="ignore"):
        m = np.max(np.abs(x), axis=axis, keepdims=True).astype(np.float64)
        out = np.isfinite(m) & (m > 0) & ((m > _BAND) | (m < 1.0 / _BAND))
    return np.where(out, np.frexp(m)[1], 0).astype(np.int64)


def log_focused(la: np.ndarray, p: float, axis: int = -1) -> np.ndarray:
    """log f_p(a) along ``axis`` from the log pre-features la = log a (-inf where a = 0), for a of any magnitude
    (H3), also one whose a itself is beyond float64 (a huge projection divided by softplus(s) < 1):
    lm + log ||r|| + p lr - log ||r^p|| with lm = max la, lr = la - lm <= 0 (so ||r||^2 = sum exp(2 lr) and
    ||r^p||^2 = sum exp(2 p lr) lie in [1, d]); -inf for a zero vector, NaN propagates."""
    with np.errstate(invalid="ignore", under="ignore", over="ignore"):
        lm = np.max(la, axis=axis, keepdims=True)
        safe = np.where(np.isfinite(lm), lm, 0.0)
        lr = la - safe
        out = safe + 0.5 * np.log(np.sum(np.exp(2.0 * lr), axis=axis, keepdims=True)) + p * lr \
            - 0.5 * np.log(np.sum(np.exp(2.0 * p * lr), axis=axis, keepdims=True))
    return np.where(lm == -np.inf, -np.inf, out)


class RangeInfo:
    """What the range-safe attention needs beside the (rescaled) features phi(Q) 2^-e_q, phi(K) 2^-e_k:
    ``e_q`` (B, h, N, 1) and ``e_k`` (B, h, 1, 1) (broadcastable) the exponents, ``a_q`` (B, h, N, d) and
    ``a_k`` (B, h, n, d) the pre-features (their support decides which rows are live), ``logs`` a callable
    giving the log-features (log phi(Q), log phi(K)) in the original units (H3), computed once.
    :meth:`sub` restricts all of it to a window's query and key groups (the shifted-window mask)."""

    def __init__(self, e_q, e_k, a_q, a_k, logs: Callable[[], tuple], p: float):
        """Store the exponents ``e_q``, ``e_k``, the pre-features ``a_q``, ``a_k``, the focusing factor ``p`` and the
        callable ``logs`` (first called by :meth:`logs`)."""
        self.e_q, self.e_k, self.a_q, self.a_k, self._logs, self.p = e_q, e_k, a_q, a_k, logs, p
        self._cache: tuple | None = None

    def logs(self) -> tuple:
        """(log phi(Q), log phi(K)) in the original units (H3): computed on the first call, then kept."""
        if self._cache is None:
            self._cache = self._logs()
        return self._cache

    @property
    def scaled(self) -> bool:
        """Whether any exponent e_q or e_k is non-zero (some features are held as phi 2^-e)."""
        return bool(np.any(self.e_q) or np.any(self.e_k))

    def sub(self, w: int, nw: int, qi: np.ndarray, kj: np.ndarray) -> "RangeInfo":
        """This RangeInfo restricted to window ``w`` of ``nw`` (batch entries b nW + w) and one shifted-window mask
        group: the query rows ``qi``, the key rows ``kj`` (the log-features restricted when first asked for)."""
        def rows(t, idx):
            t = t[w::nw]
            return t[:, :, idx] if t.shape[2] > 1 else t
        return RangeInfo(rows(self.e_q, qi), rows(self.e_k, kj), rows(self.a_q, qi), rows(self.a_k, kj),
                         lambda: (rows(self.logs()[0], qi), rows(self.logs()[1], kj)), self.p)


def _unscale(x: np.ndarray, e: Any) -> np.ndarray:
    """x 2^e for the taps (diagnostics: an entry beyond float64 is inf there, the output itself is checked)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(x, e)


def attend_rescaled(pq: np.ndarray, pk: np.ndarray, v: np.ndarray, e_q: np.ndarray, e_k: np.ndarray, *,
                    normaliser: str, eps: float, order: str, taps: dict | None, stage: str) -> np.ndarray:
    """Normalised attention (Eq. 4, normaliser "sum", or the released "mean_scaled") on rescaled features
    pq = phi(Q) 2^-e_q, pk = phi(K) 2^-e_k (H2): V's columns scaled by :func:`band_exponent` too, the
    normaliser den 2^(e_q + e_k) + eps through normaliser_range.normaliser_scaled (eps scaled along; where it
    would leave [2^-1000, 2^1000] the normaliser's own exponent is divided out first), the quotient scaled
    back by normaliser_range.quotient (FloatingPointError naming ``stage`` beyond float64).  The same
    arithmetic as the unscaled paths (linear.kernelized_attention, focused_core._attend_mean_scaled) in the
    same order; taps scaled back."""
    e_v = band_exponent(v, -2)                                     # (B,h,1,e)
    vs = np.ldexp(v, -e_v)
    e_qk = (e_q + e_k)[..., 0]                                     # (B,h,N)
    n = pk.shape[-2]
    r = n ** -0.5 if normaliser == "mean_scaled" else 1.0
    kv = scores = None
    with np.errstate(under="ignore"):
        if normaliser == "sum":
            k_red = np.sum(pk, axis=-2)                            # (B,h,d)
            pk_r, vs_r = pk, vs
        else:
            k_red = np.mean(pk, axis=-2)
            pk_r, vs_r = pk * r, vs * r
        den = np.einsum("bhnd,bhd->bhn", pq, k_red)
        if order == "linear":
            kv = pk_r.swapaxes(-1, -2) @ vs_r                      # (B,h,d,e)
            num = pq @ kv
        else:
            scores = pq @ pk_r.swapaxes(-1, -2)                    # (B,h,N,n)
            num = scores @ vs_r
            if normaliser == "sum":                                # as kernelized_attention: the row sums
                den = np.sum(scores, axis=-1)
    den_eff, g = normaliser_scaled(den, np.broadcast_to(e_qk, den.shape), eps=eps, eps_policy="add",
                                   clamp_min=None)
    out = quotient(num, den_eff[..., None], e_v - g[..., None], stage)
    if taps is not None:
        taps.update(phi_q=_unscale(pq, e_q), phi_k=_unscale(pk, e_k), numerator=_unscale(num, e_qk[..., None] + e_v),
                    denominator=_unscale(den_eff, e_qk + g))
        if normaliser == "sum":
            taps["denominator_raw"] = _unscale(den, e_qk)
            if kv is not None:
                taps["k_sum"] = _unscale(k_red, e_k[..., 0])
        else:
            taps["k_mean"] = _unscale(k_red, e_k[..., 0])
        if kv is not None:
            taps["kv"] = _unscale(kv, e_k + e_v)
        if scores is not None:
            if normaliser == "sum":
                taps["scores"] = _unscale(scores, e_qk[..., None])
            with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
                taps["attn"] = _unscale(scores * r / den_eff[..., None], -g[..., None])
    return out


def live_rows(a_q: np.ndarray, a_k: np.ndarray, eps: float) -> np.ndarray:
    """(B, h, N): the rows whose exact normaliser is > 0: eps > 0, or a channel where the query's pre-feature
    and some key's are both > 0 (f_p keeps the support).  The others are 0/0 exactly (a dead ReLU row)."""
    if eps > 0:
        return np.ones(a_q.shape[:-1], dtype=bool)
    return np.any((a_q > 0) & np.any(a_k > 0, axis=-2)[..., None, :], axis=-1)


def flagged_rows(pq: np.ndarray, pk: np.ndarray, info: RangeInfo, eps: float, normaliser: str) -> np.ndarray:
    """(B, h, N): the rows whose normaliser as computed (pq . sum pk + eps, in the units of the rescaled
    features; eps n for the mean-of-keys normaliser) is not >= 2^-960 (0, tiny, or not finite), where
    products may have underflowed: :func:`recompute_rows` recomputes the live ones."""
    with np.errstate(all="ignore"):
        den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
        den = den + np.ldexp(np.float64(eps * pk.shape[-2] if normaliser == "mean_scaled" else eps),
                             -(info.e_q + info.e_k)[..., 0])
        return ~(den >= _SMALL_NORMALISER)


def recompute_rows(out: np.ndarray, pq: np.ndarray, pk: np.ndarray, v: np.ndarray, info: RangeInfo, *,
                   eps: float, normaliser: str, stage: str) -> np.ndarray:
    """``out`` with the live rows (:func:`live_rows`) whose result is not finite, or whose normaliser as
    computed (pq . sum pk, in the units of the rescaled features, + eps there) is below 2^-960, recomputed from
    the log-features (H3) by normaliser_range.rebalanced_output (eps n for the mean-of-keys normaliser, which
    is Eq. 4 with that eps); float64 only.  pq, pk: the features as computed (rescaled by info's exponents)."""
    if out.dtype != np.float64:
        return out
    bad = ~np.all(np.isfinite(out), axis=-1) | flagged_rows(pq, pk, info, eps, normaliser)
    if not np.any(bad):
        return out
    hit = bad & live_rows(info.a_q, info.a_k, eps)
    if not np.any(hit):
        return out
    lq, lk = info.logs()
    lq, lk = np.broadcast_to(lq, pq.shape), np.broadcast_to(lk, pk.shape)
    eps4 = float(eps * pk.shape[-2]) if normaliser == "mean_scaled" else eps
    out = out.copy()
    for b, h in {(int(i), int(j)) for i, j, _ in np.argwhere(hit)}:
        rows = np.flatnonzero(hit[b, h])
        vb = v[b, h][None, None]
        e_v = band_exponent(vb, -2)
        fix = rebalanced_output(lq[b, h, rows][None, None], lk[b, h][None, None], np.ldexp(vb, -e_v), e_v,
                                eps=eps4, eps_policy="add", clamp_min=None, stage=stage)
        out[b, h, rows] = fix[0, 0]
    return out


def dwc_rescaled(v: np.ndarray, conv: Callable[[np.ndarray, Any], np.ndarray], bias_add: Callable,
                 stage: str) -> np.ndarray:
    """DWC(V) (Eq. 10-12) for V with a column outside the band: conv (the resampling and the depthwise
    convolution without bias, linear in each column of V) on V 2^-e_v (:func:`band_exponent` per head and
    channel over the tokens), scaled back (FloatingPointError naming ``stage`` where the exact convolution is
    beyond float64), then the bias (``bias_add``)."""
    e_v = band_exponent(v, -2)                                     # (B,h,1,e)
    y = conv(np.ldexp(v, -e_v))
    with np.errstate(over="ignore", under="ignore"):
        back = np.ldexp(y, e_v)
    lost = np.isinf(back) & np.isfinite(y)
    if np.any(lost):
        idx = tuple(int(i) for i in np.argwhere(lost)[0])
        raise FloatingPointError(f"{stage}: the exact result at index {idx} is finite but beyond the range of "
                                 f"{back.dtype} (it is not representable)")
    return checked_sum(back, bias_add, stage)


def checked_sum(x: np.ndarray, y: Any, stage: str) -> np.ndarray:
    """x + y, FloatingPointError naming ``stage`` where both are finite and the sum is not (the exact sum of
    two finite numbers that rounds to inf is beyond float64)."""
    with np.errstate(over="ignore"):
        s = x + y
    if np.all(np.isfinite(s)):
        return s
    lost = np.isinf(s) & np.isfinite(x) & np.isfinite(y)
    if np.any(lost):
        idx = tuple(int(i) for i in np.argwhere(lost)[0])
        raise FloatingPointError(f"{stage}: the exact result at index {idx} is finite but beyond the range of "
                                 f"{s.dtype} (it is not representable)")
    return s
