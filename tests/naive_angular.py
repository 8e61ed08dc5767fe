"""Naive oracles for refimpl.attention.angular (Castling-ViT): explicit loops and mpmath.

These are deliberately written token by token and index by index from the paper's equations and the
description of the released code in docs/, sharing nothing with the reference but NumPy scalars, so that a
layout mistake (head split, conv axis, constant term, order of the normalisations) shows up as a mismatch.
Dot products use math.fsum (correctly rounded), so each oracle is at least as accurate as the reference.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

from refimpl import config
from refimpl.attention.angular import CastlingConfig, arcsin_coefficients_exact


# ---------------------------------------------------------------------------------------------------
# mpmath oracles (Eq. 4, 5, 8)
# ---------------------------------------------------------------------------------------------------

def _dps_for(x: float, order: int) -> int:
    """Working digits so that arcsin x - T_K(x) keeps CASTLING_MPMATH_DPS significant digits: the tail is
    about |x|^(2K+3) times arcsin|x|, so (2K+2) log10(1/|x|) digits cancel."""
    ax = abs(float(x))
    lost = 0 if ax == 0 else int(math.ceil((2 * order + 3) * max(0.0, -math.log10(ax)))) + 5
    return config.CASTLING_MPMATH_DPS + lost + 10


def mp_partial_sum(x: float, order: int) -> mpmath.mpf:
    """T_K(x) = sum_{k<=K} c_k x^(2k+1) with exact rational c_k, at the working precision."""
    xm = mpmath.mpf(x)
    return mpmath.fsum(mpmath.mpf(c.numerator) / c.denominator * xm ** (2 * k + 1)
                       for k, c in enumerate(arcsin_coefficients_exact(order)))


def mp_arcsin_tail(x: float, order: int) -> mpmath.mpf:
    """R_K(x) = arcsin x - T_K(x) with CASTLING_MPMATH_DPS significant digits (|x| <= 1)."""
    with mpmath.workdps(_dps_for(x, order)):
        return +(mpmath.asin(mpmath.mpf(x)) - mp_partial_sum(x, order))


def mp_angle(a: np.ndarray, b: np.ndarray) -> mpmath.mpf:
    """theta = arccos(a^.b^) at CASTLING_MPMATH_DPS digits from the float64 vectors (exact inputs), computed
    as 2 atan2(||a^ - b^||, ||a^ + b^||) so that it stays accurate at theta -> 0 and pi."""
    with mpmath.workdps(config.CASTLING_MPMATH_DPS + 20):
        am = [mpmath.mpf(float(t)) for t in a]
        bm = [mpmath.mpf(float(t)) for t in b]
        na = mpmath.sqrt(mpmath.fsum(t * t for t in am))
        nb = mpmath.sqrt(mpmath.fsum(t * t for t in bm))
        ua = [t / na for t in am]
        ub = [t / nb for t in bm]
        dif = mpmath.sqrt(mpmath.fsum((s - t) ** 2 for s, t in zip(ua, ub)))
        summ = mpmath.sqrt(mpmath.fsum((s + t) ** 2 for s, t in zip(ua, ub)))
        return 2 * mpmath.atan2(dif, summ)


def mp_cosine(a: np.ndarray, b: np.ndarray) -> mpmath.mpf:
    """a^.b^ at CASTLING_MPMATH_DPS + 20 digits."""
    with mpmath.workdps(config.CASTLING_MPMATH_DPS + 20):
        am = [mpmath.mpf(float(t)) for t in a]
        bm = [mpmath.mpf(float(t)) for t in b]
        na = mpmath.sqrt(mpmath.fsum(t * t for t in am))
        nb = mpmath.sqrt(mpmath.fsum(t * t for t in bm))
        return mpmath.fsum(s * t for s, t in zip(am, bm)) / (na * nb)


# ---------------------------------------------------------------------------------------------------
# Random-hyperplane quadrature in the plane of two vectors (Eq. 6-7)
# ---------------------------------------------------------------------------------------------------

def plane_directions(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """m unit normals w_l = cos(phi_l) e1 + sin(phi_l) e2, phi_l = pi (l + 1/2)/m, spread evenly over a
    half circle of the plane spanned by a, b (e1 = a^, e2 = the Gram-Schmidt remainder of b).  A hyperplane
    through 0 separates a and b iff its normal's line lies in an arc of length theta (mod pi), so the number
    of separating directions is within 1 of m theta/pi, plus at most one flip at each arc end where
    w . a or w . b is rounded across 0: |#sep/m - theta/pi| <= 3/m."""
    e1 = a / np.linalg.norm(a)
    r = b - (b @ e1) * e1
    nr = np.linalg.norm(r)
    if nr == 0:  # parallel or antiparallel: any orthogonal direction spans the plane with e1
        r = np.zeros_like(a)
        r[np.argmin(np.abs(e1))] = 1.0
        r = r - (r @ e1) * e1
        nr = np.linalg.norm(r)
    e2 = r / nr
    phi = math.pi * (np.arange(m) + 0.5) / m
    return np.cos(phi)[:, None] * e1[None, :] + np.sin(phi)[:, None] * e2[None, :]


# ---------------------------------------------------------------------------------------------------
# Loop oracle of the whole layer (both presets)
# ---------------------------------------------------------------------------------------------------

def _dot(a, b) -> float:
    return math.fsum(float(s) * float(t) for s, t in zip(a, b))


def _unit(x: np.ndarray, eps: float, policy: str) -> np.ndarray:
    n = math.sqrt(math.fsum(float(t) * float(t) for t in x))
    den = max(n, eps) if policy == "clamp" else n
    if den == 0:
        return np.full_like(x, math.nan)
    return x / den


def naive_castling(x: np.ndarray, params: dict, cfg: CastlingConfig, *, training: bool = False,
                   hw: tuple[int, int] | None = None) -> np.ndarray:
    """Castling-ViT attention (Eq. 8-10, the presets of CastlingConfig) by explicit loops over tokens."""
    bsz, n, c = x.shape
    h, d = cfg.num_heads, cfg.head_dim
    wq = params["qkv.weight"]
    bq = params.get("qkv.bias")
    qkv = np.zeros((bsz, n, 3 * c))
    for b in range(bsz):
        for t in range(n):
            for o in range(3 * c):
                qkv[b, t, o] = _dot(x[b, t], wq[o]) + (0.0 if bq is None else bq[o])
    q = np.zeros((bsz, h, n, d))
    k = np.zeros_like(q)
    v = np.zeros_like(q)
    for b in range(bsz):
        for hh in range(h):
            for t in range(n):
                for j in range(d):
                    q[b, hh, t, j] = qkv[b, t, 0 * c + hh * d + j]
                    k[b, hh, t, j] = qkv[b, t, 1 * c + hh * d + j]
                    v[b, hh, t, j] = qkv[b, t, 2 * c + hh * d + j]
    coeffs = [float(f) for f in arcsin_coefficients_exact(cfg.order)]
    heads = np.zeros((bsz, n, c))
    sparse_on = cfg.sparse == "always" or (cfg.sparse == "train_only" and training)
    for b in range(bsz):
        for hh in range(h):
            qh = [_unit(q[b, hh, i], cfg.qk_norm_eps, cfg.qk_norm) for i in range(n)]
            kh = [_unit(k[b, hh, j], cfg.qk_norm_eps, cfg.qk_norm) for j in range(n)]
            for i in range(n):
                series = np.zeros(d)
                den = n / 2.0
                for j in range(n):
                    cij = _dot(qh[i], kh[j])
                    s = math.fsum(ck / math.pi * cij ** (2 * kk + 1) for kk, ck in enumerate(coeffs))
                    series += s * v[b, hh, j]
                    den += s
                if cfg.constant == "own":
                    const = 0.5 * v[b, hh, i]
                else:
                    const = 0.5 * np.array([math.fsum(v[b, hh, j, jj] for j in range(n)) for jj in range(d)])
                sp = np.zeros(d)
                if sparse_on:
                    if cfg.sparse_logits == "unit":
                        logits = [_dot(qh[i], kh[j]) for j in range(n)]
                    else:
                        logits = [_dot(q[b, hh, i] * d ** -0.5, k[b, hh, j]) for j in range(n)]
                    mx = max(logits)
                    ex = [math.exp(lg - mx) for lg in logits]
                    tot = math.fsum(ex)
                    for j in range(n):
                        p = ex[j] / tot
                        if p > cfg.sparse_eps:
                            sp += p * v[b, hh, j]
                if cfg.normaliser == "output_l2":
                    a = sp + const + series
                    nrm = math.sqrt(math.fsum(t * t for t in a))
                    out = a / nrm if nrm > 0 else np.full(d, math.nan)
                else:
                    out = const + series
                    if cfg.normaliser == "similarity_sum":
                        out = out / den
                conv = np.zeros(d)
                if cfg.conv == "tokens1d":
                    w = params["dconv.weight"]
                    kk_ = w.shape[2]
                    for t in range(kk_):
                        src = i + t - kk_ // 2
                        if 0 <= src < n:
                            conv += w[hh, 0, t, 0] * v[b, hh, src]
                    if "dconv.bias" in params:
                        conv += params["dconv.bias"][hh]
                elif cfg.conv == "grid2d":
                    w = params["dconv.weight"]
                    kk_ = w.shape[2]
                    rows, cols = hw
                    r0, s0 = divmod(i, cols)
                    for jj in range(d):
                        ch = hh * d + jj
                        acc = []
                        for a_ in range(kk_):
                            for b_ in range(kk_):
                                r, s = r0 + a_ - kk_ // 2, s0 + b_ - kk_ // 2
                                if 0 <= r < rows and 0 <= s < cols:
                                    acc.append(w[ch, 0, a_, b_] * v[b, hh, r * cols + s, jj])
                        conv[jj] = math.fsum(acc) + (params["dconv.bias"][ch] if "dconv.bias" in params else 0.0)
                out = out + conv
                if sparse_on and cfg.normaliser != "output_l2":
                    out = out + sp
                heads[b, i, hh * d:(hh + 1) * d] = out
    wp, bp = params["proj.weight"], params["proj.bias"]
    y = np.zeros((bsz, n, c))
    for b in range(bsz):
        for t in range(n):
            for o in range(c):
                y[b, t, o] = _dot(heads[b, t], wp[o]) + bp[o]
    return y


def naive_masked_softmax(q: np.ndarray, k: np.ndarray, v: np.ndarray, threshold: float,
                         scale: float = 1.0) -> np.ndarray:
    """Mask_eps(Softmax(s q k^T)) V (Eq. 10) by loops; q (N, d), k (M, d), v (M, e)."""
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        logits = [_dot(q[i] * scale, k[j]) for j in range(k.shape[0])]
        mx = max(logits)
        ex = [math.exp(lg - mx) for lg in logits]
        tot = math.fsum(ex)
        for j in range(k.shape[0]):
            p = ex[j] / tot
            if p > threshold:
                out[i] += p * v[j]
    return out
