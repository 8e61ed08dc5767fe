"""Naive loop oracles for the LiSA family (refimpl.toeplitz, refimpl.attention.lisa).

Written from the paper's index formulas with explicit Python loops, sharing no code with the reference:
Eq. 2 (Toeplitz indexing), circulant matrices of Eq. 10, the wrap-around taps that separate the two, the
sum of Eq. 7 element by element, and the DTFT used by the resolution change of Appendix B.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def _tokens(grid):
    return list(itertools.product(*[range(n) for n in grid]))


def naive_toeplitz(e: np.ndarray, grid) -> np.ndarray:
    """T[i, j] = e[n_1 - 1 + j_1 - i_1, ..., n_r - 1 + j_r - i_r] (LiSA Eq. 2, per grid axis); e has shape
    (2n_1 - 1, ..., *ch).  Returns (N, N, *ch)."""
    toks = _tokens(grid)
    out = np.zeros((len(toks), len(toks)) + e.shape[len(grid):])
    for a, i in enumerate(toks):
        for b, j in enumerate(toks):
            out[a, b] = e[tuple(n - 1 + jj - ii for n, ii, jj in zip(grid, i, j))]
    return out


def naive_circulant(w: np.ndarray, grid) -> np.ndarray:
    """C[i, j] = w[(i_1 - j_1) mod n_1, ...] (circular convolution, LiSA Eq. 10).  Returns (N, N, *ch)."""
    toks = _tokens(grid)
    out = np.zeros((len(toks), len(toks)) + w.shape[len(grid):])
    for a, i in enumerate(toks):
        for b, j in enumerate(toks):
            out[a, b] = w[tuple((ii - jj) % n for n, ii, jj in zip(grid, i, j))]
    return out


def naive_periodize(e: np.ndarray, grid) -> np.ndarray:
    """w[m] = sum over offsets s (|s_a| <= n_a - 1) with s = m (mod n) of h(s), h(s) = e[n - 1 - s]."""
    w = np.zeros(tuple(grid) + e.shape[len(grid):])
    for s in itertools.product(*[range(-(n - 1), n) for n in grid]):
        m = tuple(ss % n for ss, n in zip(s, grid))
        w[m] += e[tuple(n - 1 - ss for n, ss in zip(grid, s))]
    return w


def naive_wrap_terms(e: np.ndarray, x: np.ndarray, grid) -> np.ndarray:
    """The wrap-around taps of the circular product: for each query i, the sum over offsets s in the
    kernel's support with i - s outside the grid of h(s) x[(i - s) mod n].  x : (N, *ch) flat tokens.
    Equals circulant(periodize(e)) x - toeplitz(e) x."""
    toks = _tokens(grid)
    index = {t: a for a, t in enumerate(toks)}
    out = np.zeros(np.broadcast_shapes(x.shape, (len(toks),) + e.shape[len(grid):]))
    for a, i in enumerate(toks):
        for s in itertools.product(*[range(-(n - 1), n) for n in grid]):
            j = tuple(ii - ss for ii, ss in zip(i, s))
            if all(0 <= jj < n for jj, n in zip(j, grid)):
                continue
            jw = tuple(jj % n for jj, n in zip(j, grid))
            out[a] = out[a] + e[tuple(n - 1 - ss for n, ss in zip(grid, s))] * x[index[jw]]
    return out


def naive_l2(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        v = x[idx]
        out[idx] = v / max(math.sqrt(sum(float(t) * float(t) for t in v)), 1e-12)
    return out


def naive_sa_eq7(q, k, v, ra_tilde, rb, bias_a, bias_b) -> np.ndarray:
    """Eq. 7 element by element for one batch and head: q, k, v (N, c); ra_tilde (N, N, c, D); rb (N, N, D);
    bias_a, bias_b (c, D).  Biases enter once per bracket (Eq. 9, Fig. 6-7)."""
    qb, kb = naive_l2(q), naive_l2(k)
    n_tok, c = q.shape
    d_lat = rb.shape[-1]
    y = np.zeros((n_tok, v.shape[1]))
    for i in range(n_tok):
        for kk in range(v.shape[1]):
            acc = 0.0
            for cc in range(c):
                for d in range(d_lat):
                    left = sum(kb[n, cc] * ra_tilde[i, n, cc, d] for n in range(n_tok)) + bias_a[cc, d]
                    right = sum(rb[i, j, d] * v[j, kk] for j in range(n_tok)) + bias_b[kk, d]
                    acc += qb[i, cc] * left * right
            y[i, kk] = acc
    return y


def naive_dtft(e: np.ndarray, grid, freqs) -> np.ndarray:
    """H(f) = sum_s h(s) exp(-2 pi i f . s) of the Toeplitz kernel h(s) = e[n - 1 - s] at each frequency
    vector f in ``freqs`` (list of r-tuples).  Returns (len(freqs), *ch) complex."""
    out = np.zeros((len(freqs),) + e.shape[len(grid):], dtype=complex)
    for a, f in enumerate(freqs):
        for s in itertools.product(*[range(-(n - 1), n) for n in grid]):
            ph = np.exp(-2j * np.pi * sum(ff * ss for ff, ss in zip(f, s)))
            out[a] += e[tuple(n - 1 - ss for n, ss in zip(grid, s))] * ph
    return out


def naive_sa_eq7_literal(q, k, v, ra_tilde, rb, bias_a, bias_b) -> np.ndarray:
    """Eq. 7 read literally: sum over j AND n of (Kb_nc Ra~_incd + Ba_cd)(Rb_ijd V_jk + Bb_kd), so each bias
    is counted N times (one batch and head; shapes as :func:`naive_sa_eq7`)."""
    qb, kb = naive_l2(q), naive_l2(k)
    n_tok, c = q.shape
    y = np.zeros((n_tok, v.shape[1]))
    for i in range(n_tok):
        for kk in range(v.shape[1]):
            acc = 0.0
            for cc in range(c):
                for d in range(rb.shape[-1]):
                    for j in range(n_tok):
                        for n in range(n_tok):
                            acc += qb[i, cc] * (kb[n, cc] * ra_tilde[i, n, cc, d] + bias_a[cc, d]) * \
                                (rb[i, j, d] * v[j, kk] + bias_b[kk, d])
            y[i, kk] = acc
    return y


def naive_lisa_local(q, k, v, wa, wb, bias_a, bias_b, grid, kernel) -> np.ndarray:
    """LiSA Table 3c's local operator element by element for one batch and head, from its definition: Eq. 9 with
    Ga[i, c, d] = sum over window offsets s (|s_a| <= (k - 1) / 2, i + s inside the grid) of Wa[s, c, d] Kb[i + s, c]
    and Gb[i, v, d] = sum of Wb[s, d] V[i + s, v]; taps row-major over the k^r window.  q, k, v (N, c)."""
    qb, kb = naive_l2(q), naive_l2(k)
    toks = _tokens(grid)
    index = {t: a for a, t in enumerate(toks)}
    rad = kernel // 2
    offsets = list(itertools.product(*[range(-rad, rad + 1) for _ in grid]))
    n_tok, c = q.shape
    d_lat = wb.shape[-1]
    y = np.zeros((n_tok, v.shape[1]))
    for a, i in enumerate(toks):
        ga = np.zeros((c, d_lat))
        gb = np.zeros((v.shape[1], d_lat))
        for t, s in enumerate(offsets):
            j = tuple(ii + ss for ii, ss in zip(i, s))
            if j not in index:
                continue
            for cc in range(c):
                for d in range(d_lat):
                    ga[cc, d] += wa[t, cc, d] * kb[index[j], cc]
            for kk in range(v.shape[1]):
                for d in range(d_lat):
                    gb[kk, d] += wb[t, d] * v[index[j], kk]
        for kk in range(v.shape[1]):
            y[a, kk] = sum(qb[a, cc] * (ga[cc, d] + bias_a[cc, d]) * (gb[kk, d] + bias_b[kk, d])
                           for cc in range(c) for d in range(d_lat))
    return y
