"""Naive loop oracles for RALA (Fan, Huang & He, CVPR 2025): one token, one head, one channel at a time.

Written independently of refimpl.attention.rala from the paper's equations and the description of
the released code (docs/), with plain Python loops and the math module, so that the reference's vectorised
indexing (the fused projection's channel blocks, the head split, the 2-D RoPE's channel pairs, the
row-major token order, the 'same'-padded depthwise conv) is checked against a second formulation.
Tiny sizes only.
"""

from __future__ import annotations

import math

import numpy as np


def _kappa(t: float) -> float:
    return t + 1.0 if t > 0 else math.exp(t)        # ELU(t) + 1


def _rope_angle(pair: int, token: int, width: int, head_dim: int, base: float) -> float:
    """Angle of channel pair ``pair`` at token ``token``: the first d/4 pairs use the row, the rest the
    column, with frequency base^(-q / (d/4 - 1)) for the pair's index q within its half."""
    quarter = head_dim // 4
    row, col = token // width, token % width
    q = pair if pair < quarter else pair - quarter
    freq = base ** (-(q / (quarter - 1))) if quarter > 1 else 1.0
    return (row if pair < quarter else col) * freq


def rotate(vec: list[float], token: int, width: int, base: float) -> list[float]:
    """2-D RoPE of one head vector at one token (interleaved pairs (2p, 2p+1))."""
    d = len(vec)
    out = [0.0] * d
    for p in range(d // 2):
        th = _rope_angle(p, token, width, d, base)
        a, b = vec[2 * p], vec[2 * p + 1]
        out[2 * p] = a * math.cos(th) - b * math.sin(th)
        out[2 * p + 1] = b * math.cos(th) + a * math.sin(th)
    return out


def rope_angle_table(h: int, w: int, head_dim: int, base: float) -> np.ndarray:
    """(N, d): the angle of every (token, channel), both channels of a pair sharing it."""
    return np.array([[_rope_angle(ch // 2, i, w, head_dim, base) for ch in range(head_dim)]
                     for i in range(h * w)])


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b))


def naive_official_attention(x: np.ndarray, params: dict, num_heads: int, *, base: float = 10000.0,
                             eps: float = 1e-6, lepe_kernel: int = 5) -> np.ndarray:
    """The released code's RALA layer on a (B, C, H, W) input, by loops.

    params: "qkvo.weight" (4C, C, 1, 1), "qkvo.bias" (4C,), "lepe.weight" (C, 1, k, k), "lepe.bias" (C,),
    "proj.weight" (C, C, 1, 1), "proj.bias" (C,).
    Per head: kappa(Q), kappa(K); Q_g = mean_i kappa(Q_i); alpha_j = N softmax_j(Q_g . kappa(K_j) / sqrt d);
    num_i = (1/N) sum_j [rot_i(kappa Q_i) . rot_j(alpha_j kappa K_j)] V_j;
    den_i = (1/N) sum_j kappa(Q_i) . alpha_j kappa(K_j) + eps; y_i = num_i / den_i;
    then + LePE(V), times the gate (4th block), then the 1 x 1 projection.
    """
    bsz, c, h, w = x.shape
    n, d = h * w, c // num_heads
    wq = params["qkvo.weight"][:, :, 0, 0]
    bq = params["qkvo.bias"]
    wl, bl = params["lepe.weight"], params["lepe.bias"]
    wp, bp = params["proj.weight"][:, :, 0, 0], params["proj.bias"]
    out = np.zeros_like(x, dtype=np.float64)
    for b in range(bsz):
        # fused projection, token by token (token i at row i // w, column i % w)
        proj = []
        for i in range(n):
            r, col = divmod(i, w)
            xi = x[b, :, r, col]
            proj.append([_dot(wq[o], xi) + bq[o] for o in range(4 * c)])
        y = [[0.0] * c for _ in range(n)]
        for hd in range(num_heads):
            sl = lambda blk, i: proj[i][blk * c + hd * d: blk * c + (hd + 1) * d]
            kq = [[_kappa(t) for t in sl(0, i)] for i in range(n)]
            kk = [[_kappa(t) for t in sl(1, j)] for j in range(n)]
            vv = [sl(2, j) for j in range(n)]
            qg = [sum(kq[i][a] for i in range(n)) / n for a in range(d)]
            s = [_dot(qg, kk[j]) / math.sqrt(d) for j in range(n)]
            m = max(s)
            e = [math.exp(t - m) for t in s]
            tot = sum(e)
            alpha = [n * t / tot for t in e]
            kw = [[alpha[j] * t for t in kk[j]] for j in range(n)]
            qr = [rotate(kq[i], i, w, base) for i in range(n)]
            kr = [rotate(kw[j], j, w, base) for j in range(n)]
            for i in range(n):
                den = sum(_dot(kq[i], kw[j]) for j in range(n)) / n + eps
                for e_ in range(d):
                    num = sum(_dot(qr[i], kr[j]) * vv[j][e_] for j in range(n)) / n
                    y[i][hd * d + e_] = num / den
        # LePE: depthwise k x k conv of V with zero padding k // 2, plus bias; then the gate
        half = lepe_kernel // 2
        for i in range(n):
            r, col = divmod(i, w)
            gated = []
            for ch in range(c):
                acc = bl[ch]
                for du in range(lepe_kernel):
                    for dv in range(lepe_kernel):
                        rr, cc = r + du - half, col + dv - half
                        if 0 <= rr < h and 0 <= cc < w:
                            acc += wl[ch, 0, du, dv] * proj[rr * w + cc][2 * c + ch]
                gated.append((y[i][ch] + acc) * proj[i][3 * c + ch])
            for o in range(c):
                out[b, o, r, col] = _dot(wp[o], gated) + bp[o]
    return out


def naive_paper_core(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Eq. 2-4 and 6 (before the gate) for one head, by loops: q, k, v (N, d) -> (N, d).

    Q_g = mean_i Q_i; alpha_j = N exp(Q_g . kappa(K_j)) / sum_m exp(Q_g . kappa(K_m));
    y_i = kappa(Q_i) sum_j alpha_j kappa(K_j)^T V_j / (kappa(Q_i) . sum_j alpha_j kappa(K_j)).
    """
    n, d = q.shape
    kq = [[_kappa(t) for t in q[i]] for i in range(n)]
    kk = [[_kappa(t) for t in k[j]] for j in range(n)]
    qg = [sum(q[i][a] for i in range(n)) / n for a in range(d)]
    s = [_dot(qg, kk[j]) for j in range(n)]
    m = max(s)
    e = [math.exp(t - m) for t in s]
    alpha = [n * t / sum(e) for t in e]
    buf = [[sum(alpha[j] * kk[j][a] * v[j][b] for j in range(n)) for b in range(d)] for a in range(d)]
    z = [sum(alpha[j] * kk[j][a] for j in range(n)) for a in range(d)]
    out = np.zeros((n, d))
    for i in range(n):
        den = _dot(kq[i], z)
        for b in range(d):
            out[i, b] = sum(kq[i][a] * buf[a][b] for a in range(d)) / den
    return out
