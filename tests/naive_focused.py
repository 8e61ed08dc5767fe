"""Naive loop oracles for FLatten (refimpl.attention.focused): straightforward formulations written token by
token, with explicit index arithmetic, no vectorised reshapes, used to check the reference's presets.

Everything is float64 and slow by design (Python loops); use tiny sizes.  The focused function is written
as the paper's Eq. (6) literally: ||x|| / ||x**p|| * x**p (no max-scaling; the test inputs keep x**p finite).
"""

from __future__ import annotations

import math

import numpy as np


def conv_same_1ch(img: np.ndarray, kernel: np.ndarray, bias: float) -> np.ndarray:
    """One channel, 'same' zero padding (odd k), PyTorch cross-correlation, by explicit loops."""
    h, w = img.shape
    k = kernel.shape[0]
    r = k // 2
    out = np.zeros((h, w))
    for y in range(h):
        for x in range(w):
            acc = 0.0
            for a in range(k):
                for b in range(k):
                    yy, xx = y - r + a, x - r + b
                    if 0 <= yy < h and 0 <= xx < w:
                        acc += kernel[a, b] * img[yy, xx]
            out[y, x] = acc + bias
    return out


def interp_linear(values: list[float], size: int) -> list[float]:
    """1-D linear interpolation, align_corners=False (half-pixel centres), clamped at the ends."""
    n = len(values)
    out = []
    for i in range(size):
        src = (i + 0.5) * n / size - 0.5
        if src < 0:
            src = 0.0
        i0 = min(int(math.floor(src)), n - 1)
        i1 = min(i0 + 1, n - 1)
        lam = src - i0
        out.append((1 - lam) * values[i0] + lam * values[i1])
    return out


def focused_vec(x: np.ndarray, p: float) -> np.ndarray:
    """f_p(x) = ||x|| / ||x**p|| x**p for one vector x >= 0 (Eq. 6 as written)."""
    nx = math.sqrt(sum(float(t) * float(t) for t in x))
    xp = [float(t) ** p for t in x]
    nxp = math.sqrt(sum(t * t for t in xp))
    if nx == 0.0:
        return np.zeros(len(x))
    return np.array([nx / nxp * t for t in xp])


def softplus(s: float) -> float:
    return math.log1p(math.exp(-abs(s))) + max(s, 0.0)


def lin(vec: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    out = np.zeros(w.shape[0])
    for o in range(w.shape[0]):
        acc = 0.0 if b is None else float(b[o])
        for i in range(w.shape[1]):
            acc += float(w[o, i]) * float(vec[i])
        out[o] = acc
    return out


def layer_norm_vec(v: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = sum(v) / len(v)
    var = sum((t - mu) ** 2 for t in v) / len(v)
    return np.array([(t - mu) / math.sqrt(var + eps) * wi + bi for t, wi, bi in zip(v, w, b)])


def focused_global(x: np.ndarray, params: dict, *, dim: int, heads: int, hw: tuple[int, int], p: float,
                   sr: int = 1, official: bool = True, ln_eps: float = 1e-5) -> np.ndarray:
    """The DeiT/PVT-layout module for one configuration, token by token.

    official=True: the released module (ReLU + 1e-6, / softplus(scale) per channel, f_p over all C channels,
    APE on K, (q . sum_j k_j (K^T V)/n) with normaliser q . mean(k) + 1e-6, one d-channel DWC bank shared by
    the heads, V resampled along the flattened token order for sr > 1).  official=False: the paper (per-head
    f_p, sum normaliser, one kernel per channel, V resampled bilinearly on the grid for sr > 1).
    """
    b_sz, n_tok, c = x.shape
    hh, ww = hw
    d = dim // heads
    out = np.zeros_like(x)
    for b in range(b_sz):
        toks = [x[b, i] for i in range(n_tok)]
        q = [lin(t, params["q.weight"], params.get("q.bias")) for t in toks]
        if sr > 1:
            hr, wr = hh // sr, ww // sr
            src = []
            for yy in range(hr):
                for xx in range(wr):
                    red = np.zeros(c)
                    for o in range(c):
                        acc = float(params["sr.bias"][o])
                        for ci in range(c):
                            for a in range(sr):
                                for bb in range(sr):
                                    acc += params["sr.weight"][o, ci, a, bb] * x[b, (yy * sr + a) * ww + xx * sr + bb, ci]
                        red[o] = acc
                    src.append(layer_norm_vec(red, params["norm.weight"], params["norm.bias"], ln_eps))
        else:
            hr, wr = hh, ww
            src = toks
        kv = [lin(t, params["kv.weight"], params.get("kv.bias")) for t in src]
        k = [t[:c] for t in kv]
        v = [t[c:] for t in kv]
        n = len(k)
        if official:
            k = [k[j] + params["positional_encoding"][0, j] for j in range(n)]
            sp = np.array([softplus(float(s)) for s in params["scale"][0, 0]])

            def feat(t):
                a = np.array([(max(float(e), 0.0) + 1e-6) / sp[i] for i, e in enumerate(t)])
                f = focused_vec(a, p)
                return [f[h * d:(h + 1) * d] for h in range(heads)]
        else:
            def feat(t):
                return [focused_vec(np.maximum(t[h * d:(h + 1) * d], 0.0), p) for h in range(heads)]
        fq = [feat(t) for t in q]
        fk = [feat(t) for t in k]
        for i in range(n_tok):
            y = np.zeros(c)
            for h in range(heads):
                sims = [float(np.dot(fq[i][h], fk[j][h])) for j in range(n)]
                num = np.zeros(d)
                for j in range(n):
                    num += sims[j] * v[j][h * d:(h + 1) * d]
                if official:
                    den = sum(sims) / n + 1e-6
                    y[h * d:(h + 1) * d] = num / n / den
                else:
                    y[h * d:(h + 1) * d] = num / sum(sims)
            out[b, i] = y
        # DWC branch on V resampled to the H x W grid
        vgrid = np.zeros((c, hh, ww))
        for ch in range(c):
            if sr == 1:
                for t in range(n_tok):
                    vgrid[ch, t // ww, t % ww] = v[t][ch]
            elif official:
                flat = interp_linear([v[j][ch] for j in range(n)], hh * ww)
                for t in range(n_tok):
                    vgrid[ch, t // ww, t % ww] = flat[t]
            else:
                rows = [interp_linear([v[yy * wr + xx][ch] for yy in range(hr)], hh) for xx in range(wr)]
                for yy in range(hh):
                    vgrid[ch, yy, :] = interp_linear([rows[xx][yy] for xx in range(wr)], ww)
        for ch in range(c):
            kidx = ch % d if official else ch
            conv = conv_same_1ch(vgrid[ch], params["dwc.weight"][kidx, 0], float(params["dwc.bias"][kidx]))
            for t in range(n_tok):
                out[b, t, ch] += conv[t // ww, t % ww]
        for t in range(n_tok):
            out[b, t] = lin(out[b, t], params["proj.weight"], params["proj.bias"])
    return out


def focused_swin_official(x: np.ndarray, params: dict, *, dim: int, heads: int, hw: tuple[int, int], ws: int,
                          shift: int, p: float) -> np.ndarray:
    """The released Swin-layout module (mask ignored) window by window, with the cyclic shift written as
    index arithmetic: window token (a, b) of window (wy, wx) is grid token ((wy ws + a + shift) mod H,
    (wx ws + b + shift) mod W)."""
    b_sz, _, c = x.shape
    hh, ww = hw
    d = dim // heads
    out = np.zeros_like(x)
    sp = np.array([softplus(float(s)) for s in params["scale"][0, 0]])
    n = ws * ws

    def feat(t):
        a = np.array([(max(float(e), 0.0) + 1e-6) / sp[i] for i, e in enumerate(t)])
        f = focused_vec(a, p)
        return [f[h * d:(h + 1) * d] for h in range(heads)]

    for b in range(b_sz):
        for wy in range(hh // ws):
            for wx in range(ww // ws):
                pos = [((wy * ws + a + shift) % hh, (wx * ws + bb + shift) % ww) for a in range(ws) for bb in range(ws)]
                toks = [x[b, yy * ww + xx] for yy, xx in pos]
                qkv = [lin(t, params["qkv.weight"], params.get("qkv.bias")) for t in toks]
                q = [t[:c] for t in qkv]
                k = [t[c:2 * c] + params["positional_encoding"][0, j] for j, t in enumerate(qkv)]
                v = [t[2 * c:] for t in qkv]
                fq, fk = [feat(t) for t in q], [feat(t) for t in k]
                ys = []
                for i in range(n):
                    y = np.zeros(c)
                    for h in range(heads):
                        sims = [float(np.dot(fq[i][h], fk[j][h])) for j in range(n)]
                        num = sum(sims[j] * v[j][h * d:(h + 1) * d] for j in range(n))
                        y[h * d:(h + 1) * d] = num / n / (sum(sims) / n + 1e-6)
                    ys.append(y)
                for ch in range(c):
                    img = np.array([[v[a * ws + bb][ch] for bb in range(ws)] for a in range(ws)])
                    conv = conv_same_1ch(img, params["dwc.weight"][ch % d, 0], float(params["dwc.bias"][ch % d]))
                    for i in range(n):
                        ys[i][ch] += conv[i // ws, i % ws]
                for i, (yy, xx) in enumerate(pos):
                    out[b, yy * ww + xx] = lin(ys[i], params["proj.weight"], params["proj.bias"])
    return out
