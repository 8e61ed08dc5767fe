"""Naive loop oracles for L2ViT (refimpl.attention.enhanced): the released LGA and LWA blocks written token
by token with explicit loops (pairwise q . k products, per-window softmax with math.exp, convolutions as
sums over taps), used to check the reference's "official" preset.  float64, slow by design: tiny sizes.
"""

from __future__ import annotations

import math

import numpy as np

from tests.naive_focused import conv_same_1ch, layer_norm_vec, lin


def gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _grid_tokens(tokens: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(N, C) -> (C, H, W) by explicit index arithmetic."""
    hh, ww = hw
    c = tokens.shape[1]
    g = np.zeros((c, hh, ww))
    for t in range(hh * ww):
        g[:, t // ww, t % ww] = tokens[t]
    return g


def _tokens_grid(g: np.ndarray) -> np.ndarray:
    c, hh, ww = g.shape
    out = np.zeros((hh * ww, c))
    for t in range(hh * ww):
        out[t] = g[:, t // ww, t % ww]
    return out


def cpe(tokens: np.ndarray, w: np.ndarray, b: np.ndarray, hw) -> np.ndarray:
    g = _grid_tokens(tokens, hw)
    conv = np.stack([conv_same_1ch(g[ch], w[ch, 0], float(b[ch])) for ch in range(g.shape[0])])
    return tokens + _tokens_grid(conv)


def mlp(vec: np.ndarray, p: dict, prefix: str) -> np.ndarray:
    h = lin(vec, p[prefix + "fc1.weight"], p[prefix + "fc1.bias"])
    return lin(np.array([gelu(float(t)) for t in h]), p[prefix + "fc2.weight"], p[prefix + "fc2.bias"])


def ln(vec, p, name, eps=1e-5):
    return layer_norm_vec(vec, p[name + ".weight"], p[name + ".bias"], eps)


def lga_official(x: np.ndarray, p: dict, *, heads: int, hw, c_min: float = 1e2, eps: float = 1e-5,
                 bn_eps: float = 1e-5) -> np.ndarray:
    """Released LGA: x = CPE(x); x += proj(per head: t_h sum_j (q_i.k_j) v_j / max(sum_j q_i.k_j, C_min));
    x += LCM(LN3 x); x += MLP(LN2 x).  q, k = ReLU(.), t_h the per-head temperature."""
    b_sz, n, c = x.shape
    d = c // heads
    out = np.zeros_like(x)
    for b in range(b_sz):
        t0 = cpe(x[b], p["cpe.0.proj.weight"], p["cpe.0.proj.bias"], hw)
        qkv = [lin(ln(t0[i], p, "norm1", eps), p["attn.qkv.weight"], p["attn.qkv.bias"]) for i in range(n)]
        att = np.zeros((n, c))
        for i in range(n):
            y = np.zeros(c)
            for h in range(heads):
                sl = slice(h * d, (h + 1) * d)
                qi = np.maximum(qkv[i][:c][sl], 0.0)
                num, den = np.zeros(d), 0.0
                for j in range(n):
                    kj = np.maximum(qkv[j][c:2 * c][sl], 0.0)
                    s = float(np.dot(qi, kj))
                    num += s * qkv[j][2 * c:][sl]
                    den += s
                y[sl] = float(p["attn.temperature"][h, 0, 0]) * num / max(den, c_min)
            att[i] = lin(y, p["attn.proj.weight"], p["attn.proj.bias"])
        x1 = t0 + att
        # LCM on LN3(x1): conv1 -> GELU -> BN (eval) -> conv2, per channel
        g = _grid_tokens(np.stack([ln(x1[i], p, "norm3", eps) for i in range(n)]), hw)
        lcm = np.zeros_like(g)
        for ch in range(c):
            a = conv_same_1ch(g[ch], p["local_mp.conv1.weight"][ch, 0], float(p["local_mp.conv1.bias"][ch]))
            a = np.vectorize(gelu)(a)
            a = (a - p["local_mp.bn.running_mean"][ch]) / math.sqrt(p["local_mp.bn.running_var"][ch] + bn_eps) \
                * p["local_mp.bn.weight"][ch] + p["local_mp.bn.bias"][ch]
            lcm[ch] = conv_same_1ch(a, p["local_mp.conv2.weight"][ch, 0], float(p["local_mp.conv2.bias"][ch]))
        x2 = x1 + _tokens_grid(lcm)
        out[b] = np.stack([x2[i] + mlp(ln(x2[i], p, "norm2", eps), p, "mlp.") for i in range(n)])
    return out


def lwa_official(x: np.ndarray, p: dict, *, heads: int, hw, ws: int, eps: float = 1e-5) -> np.ndarray:
    """Released LWA: x = CPE_0(x); y = LN1(x) zero-padded at the bottom/right to multiples of ws; per window
    softmax attention (scale d^-1/2, no bias, no mask: padded tokens are keys with k = b_k, v = b_v);
    x += proj(...) on the real tokens; x = CPE_1(x); x += MLP(LN2 x)."""
    b_sz, n, c = x.shape
    hh, ww = hw
    d = c // heads
    hp, wp = -(-hh // ws) * ws, -(-ww // ws) * ws
    out = np.zeros_like(x)
    for b in range(b_sz):
        t0 = cpe(x[b], p["cpe.0.proj.weight"], p["cpe.0.proj.bias"], hw)
        y = {}
        for yy in range(hp):
            for xx in range(wp):
                y[yy, xx] = ln(t0[yy * ww + xx], p, "norm1", eps) if (yy < hh and xx < ww) else np.zeros(c)
        att = np.zeros((n, c))
        for wy in range(hp // ws):
            for wx in range(wp // ws):
                pos = [(wy * ws + a, wx * ws + bb) for a in range(ws) for bb in range(ws)]
                qkv = [lin(y[ps], p["attn.qkv.weight"], p["attn.qkv.bias"]) for ps in pos]
                for i, (yy, xx) in enumerate(pos):
                    if yy >= hh or xx >= ww:
                        continue
                    o = np.zeros(c)
                    for h in range(heads):
                        sl = slice(h * d, (h + 1) * d)
                        logits = [float(np.dot(qkv[i][:c][sl], qkv[j][c:2 * c][sl])) * d ** -0.5
                                  for j in range(len(pos))]
                        mx = max(logits)
                        ex = [math.exp(t - mx) for t in logits]
                        z = sum(ex)
                        o[sl] = sum(ex[j] / z * qkv[j][2 * c:][sl] for j in range(len(pos)))
                    att[yy * ww + xx] = lin(o, p["attn.proj.weight"], p["attn.proj.bias"])
        x1 = cpe(t0 + att, p["cpe.1.proj.weight"], p["cpe.1.proj.bias"], hw)
        out[b] = np.stack([x1[i] + mlp(ln(x1[i], p, "norm2", eps), p, "mlp.") for i in range(n)])
    return out
