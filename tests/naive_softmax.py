"""Loop oracles for softmax and Swin window attention: one query at a time, index arithmetic written out,
no refimpl.layers helpers (no pad/roll/partition arrays: every token's window, region and relative
position is computed from its coordinates)."""

from __future__ import annotations

import math

import numpy as np


def softmax_attention_loops(q, k, v, scale=None, bias=None, mask=None):
    """q (B,h,N,d), k (B,h,M,d), v (B,h,M,e); bias/mask broadcastable to (B,h,N,M).  Masked keys are
    skipped; a query with no key left gets NaN."""
    b_, h_, n_, d_ = q.shape
    m_, e_ = k.shape[2], v.shape[3]
    scale = d_ ** -0.5 if scale is None else scale
    full = (b_, h_, n_, m_)
    bias = np.broadcast_to(np.zeros(1) if bias is None else bias, full)
    mask = np.broadcast_to(np.ones(1, bool) if mask is None else mask, full)
    out = np.zeros((b_, h_, n_, e_))
    for b in range(b_):
        for h in range(h_):
            for i in range(n_):
                keys = [j for j in range(m_) if mask[b, h, i, j]]
                if not keys:
                    out[b, h, i] = np.nan
                    continue
                logit = {j: sum(scale * q[b, h, i, t] * k[b, h, j, t] for t in range(d_)) + bias[b, h, i, j]
                         for j in keys}
                top = max(logit.values())
                w = {j: math.exp(logit[j] - top) for j in keys}
                z = math.fsum(w.values())
                for c in range(e_):
                    out[b, h, i, c] = math.fsum(w[j] / z * v[b, h, j, c] for j in keys)
    return out


def window_attention_loops(x, p, num_heads, ws, shift=0, rel_pos_bias=True, mask_padding=True,
                           mask_value=None):
    """Swin window attention by coordinates.  The padded grid is Hp x Wp (bottom/right zero padding to
    multiples of ws); after the cyclic shift, rolled position (py, px) holds padded token
    ((py + shift) % Hp, (px + shift) % Wp); its window is (py // ws, px // ws); Swin's region of a rolled
    coordinate p along an axis of length n is 0 if p < n - ws, 1 if p < n - shift, 2 otherwise, and two
    tokens may attend iff their regions agree on both axes; the relative-position row of (query, key) is
    (dy + ws - 1)(2 ws - 1) + (dx + ws - 1) with (dy, dx) their offset inside the window."""
    b_, h_, w_, c_ = x.shape
    hp, wp = -(-h_ // ws) * ws, -(-w_ // ws) * ws
    d_ = c_ // num_heads
    scale = d_ ** -0.5
    wqkv, bqkv = p["qkv.weight"], p.get("qkv.bias", np.zeros(3 * c_))
    wo, bo = p["proj.weight"], p.get("proj.bias", np.zeros(c_))
    table = p.get("relative_position_bias_table")

    def token(b, py, px):
        oy, ox = (py + shift) % hp, (px + shift) % wp
        real = oy < h_ and ox < w_
        return (x[b, oy, ox] if real else np.zeros(c_)), real

    def region(pos, n):
        if pos < n - ws:
            return 0
        if pos < n - shift:
            return 1
        return 2

    out = np.zeros_like(x)
    for b in range(b_):
        for y in range(h_):
            for xx in range(w_):
                py, px = (y - shift) % hp, (xx - shift) % wp
                wy, wx = py // ws, px // ws
                tq, _ = token(b, py, px)
                qkv_q = wqkv @ tq + bqkv
                heads_out = np.zeros(c_)
                keys = []
                for ky in range(wy * ws, wy * ws + ws):
                    for kx in range(wx * ws, wx * ws + ws):
                        tk, real = token(b, ky, kx)
                        allowed = not shift or (region(py, hp), region(px, wp)) == (region(ky, hp), region(kx, wp))
                        if mask_padding and not real:
                            allowed = False
                        keys.append((ky, kx, wqkv @ tk + bqkv, allowed))
                for hd in range(num_heads):
                    qv = qkv_q[hd * d_:(hd + 1) * d_]
                    logits, vals = [], []
                    for ky, kx, kv, allowed in keys:
                        if not allowed and mask_value is None:
                            continue
                        kvec = kv[c_ + hd * d_: c_ + (hd + 1) * d_]
                        vvec = kv[2 * c_ + hd * d_: 2 * c_ + (hd + 1) * d_]
                        s = scale * float(np.dot(qv, kvec))
                        if rel_pos_bias:
                            dy, dx = py % ws - ky % ws, px % ws - kx % ws
                            s += table[(dy + ws - 1) * (2 * ws - 1) + (dx + ws - 1), hd]
                        if not allowed:
                            s += mask_value
                        logits.append(s)
                        vals.append(vvec)
                    top = max(logits)
                    wts = [math.exp(s - top) for s in logits]
                    z = math.fsum(wts)
                    heads_out[hd * d_:(hd + 1) * d_] = sum(wt / z * vv for wt, vv in zip(wts, vals))
                out[b, y, xx] = wo @ heads_out + bo
    return out
