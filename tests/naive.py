"""Naive oracles for the shared layers: explicit loops that follow the definitions index by index.

They are slow on purpose and share no code with refimpl.layers, so an indexing mistake in one cannot hide
in the other.  Family-specific oracles live in tests/naive_<family>.py.
"""

from __future__ import annotations

import numpy as np


def conv2d_loops(x, weight, bias, stride, pads, groups=1, dilation=(1, 1)):
    """out[b,o,i,j] = bias[o] + sum_{c,u,v} w[o,c,u,v] * x[b, g*Cg + c, i*sh + u*dh - top, j*sw + v*dw - left],
    with out-of-range input positions read as 0.  pads = (top, bottom, left, right)."""
    bsz, cin, h, w = x.shape
    cout, cg, kh, kw = weight.shape
    sh, sw = stride
    dh, dw = dilation
    top, bottom, left, right = pads
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
    og = cout // groups
    out = np.zeros((bsz, cout, oh, ow))
    for b in range(bsz):
        for o in range(cout):
            g = o // og
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0 if bias is None else bias[o]
                    for c in range(cg):
                        for u in range(kh):
                            for v in range(kw):
                                r, s = i * sh + u * dh - top, j * sw + v * dw - left
                                if 0 <= r < h and 0 <= s < w:
                                    acc += weight[o, c, u, v] * x[b, g * cg + c, r, s]
                    out[b, o, i, j] = acc
    return out


def window_partition_loops(x, ws):
    """Window k = (row block a, col block c) in row-major order; token t = (p, q) inside it row-major."""
    b, h, w, c = x.shape
    nh, nw = h // ws, w // ws
    out = np.empty((b * nh * nw, ws * ws, c))
    for bi in range(b):
        for a in range(nh):
            for cc in range(nw):
                k = (bi * nh + a) * nw + cc
                for p in range(ws):
                    for q in range(ws):
                        out[k, p * ws + q] = x[bi, a * ws + p, cc * ws + q]
    return out


def shifted_mask_loops(h, w, ws, shift):
    """Swin's labelling, written out: after rolling by -shift, position (y, x) belongs to region
    (ry, rx) with r = 0 if p < n - ws, 1 if n - ws <= p < n - shift, 2 otherwise; two tokens of a window
    may attend iff their regions are equal."""
    def region(p, n):
        if p < n - ws:
            return 0
        if p < n - shift:
            return 1
        return 2
    nh, nw = h // ws, w // ws
    mask = np.zeros((nh * nw, ws * ws, ws * ws), dtype=bool)
    for a in range(nh):
        for c in range(nw):
            toks = [(a * ws + p, c * ws + q) for p in range(ws) for q in range(ws)]
            for i, (y1, x1) in enumerate(toks):
                for j, (y2, x2) in enumerate(toks):
                    mask[a * nw + c, i, j] = (region(y1, h), region(x1, w)) == (region(y2, h), region(x2, w))
    return mask


def relative_position_index_loops(wh, ww):
    n = wh * ww
    idx = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            yi, xi = divmod(i, ww)
            yj, xj = divmod(j, ww)
            idx[i, j] = (yi - yj + wh - 1) * (2 * ww - 1) + (xi - xj + ww - 1)
    return idx
