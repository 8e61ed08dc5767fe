"""PyTorch counterparts of refimpl.layers, written independently of the NumPy reference.

Where PyTorch has the layer built in (Linear, LayerNorm, BatchNorm2d, GELU, Conv2d) the built-in *is* the
counterpart; the modules below cover the rest.  State-dict keys equal the refimpl parameter keys.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import nn


class LayerNormChannelsFirst(nn.Module):
    """LayerNorm over dim 1 of (B, C, H, W), computed directly (not by permuting to channels-last)."""

    def __init__(self, c: int, eps: float = 1e-5):
        """The per-channel weight (ones) and bias (zeros) of ``c`` channels, and ``eps``."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C, H, W) normalised over C at each position (mean, biased variance, eps inside the square root), scaled
        and shifted per channel; returns (B, C, H, W)."""
        mu = x.mean(1, keepdim=True)
        var = (x - mu).pow(2).mean(1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight[:, None, None] + self.bias[:, None, None]


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2."""

    def __init__(self, c: int, hidden: int, out: int | None = None, approximate: str = "none"):
        """fc1 (c -> hidden), GELU (``approximate``: "none" or "tanh"), fc2 (hidden -> ``out``, default c)."""
        super().__init__()
        self.fc1 = nn.Linear(c, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, out or c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """fc2(GELU(fc1 x)) on the last axis of x (..., c); returns (..., out)."""
        return self.fc2(self.act(self.fc1(x)))


class CPE(nn.Module):
    """x + DWConv_kxk(x), 'same' padding (conditional positional encoding)."""

    def __init__(self, c: int, k: int = 3):
        """The k x k depthwise conv ``proj`` (with bias, padding k // 2) on ``c`` channels."""
        super().__init__()
        self.proj = nn.Conv2d(c, c, k, padding=k // 2, groups=c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + DWConv_kxk(x) for x (B, C, H, W); returns (B, C, H, W)."""
        return x + self.proj(x)


class PatchMerging(nn.Module):
    """Swin patch merging with bottom/right zero padding of odd grids; input (B, H, W, C)."""

    def __init__(self, c: int, eps: float = 1e-5):
        """The LayerNorm over the 4C concatenated channels and the bias-free reduction Linear 4C -> 2C."""
        super().__init__()
        self.norm = nn.LayerNorm(4 * c, eps=eps)
        self.reduction = nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, H, W, C), an odd H or W zero-padded at the bottom / right: each 2 x 2 neighbourhood's tokens
        concatenated in Swin's order (x0, x1, x2, x3), normalised and reduced; returns (B, ceil(H/2), ceil(W/2), 2C)."""
        h, w = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.reduction(self.norm(torch.cat(parts, dim=-1)))


def pair(v, name: str) -> tuple[int, int]:
    """A window or shift given as an int n (n, n) or a pair (a, b) of ints, as a pair; a clear error otherwise."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in v):
        return int(v[0]), int(v[1])
    raise TypeError(f"argument '{name}': expected an int or a pair of ints, got {v!r}")


def window_partition(x: torch.Tensor, ws) -> torch.Tensor:
    """(B, H, W, C) -> (B * nW, wh * ww, C) by unfolding each window (a different route from refimpl's
    reshape/transpose: ``unfold`` over both grid axes).  ws : an int or a pair (wh, ww)."""
    b, h, w, c = x.shape
    wh, ww = pair(ws, "ws")
    win = x.unfold(1, wh, wh).unfold(2, ww, ww)  # (B, H/wh, W/ww, C, wh, ww)
    return win.permute(0, 1, 2, 4, 5, 3).reshape(-1, wh * ww, c)


def window_reverse(windows: torch.Tensor, ws, h: int, w: int) -> torch.Tensor:
    """(B * nW, wh * ww, C) -> (B, H, W, C) by writing each window into place.  ws : an int or (wh, ww)."""
    c = windows.shape[-1]
    wh, ww = pair(ws, "ws")
    nh, nw = h // wh, w // ww
    b = windows.shape[0] // (nh * nw)
    out = windows.new_empty(b, h, w, c)
    win = windows.reshape(b, nh, nw, wh, ww, c)
    for i in range(nh):
        for j in range(nw):
            out[:, i * wh:(i + 1) * wh, j * ww:(j + 1) * ww] = win[:, i, j]
    return out


def shifted_window_mask(h: int, w: int, ws, shift) -> torch.Tensor:
    """bool (nW, wh*ww, wh*ww), True where attention is allowed, derived from the roll itself rather than
    from Swin's region slices: the token at rolled position p came from (p + s) mod n, so it *wrapped*
    iff p + s >= n (s the axis's shift).  Two tokens of one window were neighbours before the roll iff, along
    each axis, both wrapped or neither did.  ws, shift : ints or pairs (wh, ww), (sh, sw)."""
    sh, sw = pair(shift, "shift")

    def wrapped(n: int, s: int) -> torch.Tensor:
        return (torch.arange(n) + s >= n).long()
    lab = (wrapped(h, sh)[:, None] * 2 + wrapped(w, sw)[None, :]).reshape(1, h, w, 1).double()
    lab = window_partition(lab, ws)[..., 0]
    return lab[:, :, None] == lab[:, None, :]


def relative_position_index(ws, ww: int | None = None) -> torch.Tensor:
    """Swin's (wh*ww, wh*ww) index into the ((2wh-1)(2ww-1), h) table, built with explicit loops.  ws : an int
    (square window, or wh with ``ww``) or a pair (wh, ww)."""
    wh, ww = pair(ws, "ws") if ww is None else (ws, ww)
    n = wh * ww
    idx = torch.empty(n, n, dtype=torch.long)
    for i in range(n):
        for j in range(n):
            dy = i // ww - j // ww + wh - 1
            dx = i % ww - j % ww + ww - 1
            idx[i, j] = dy * (2 * ww - 1) + dx
    return idx
