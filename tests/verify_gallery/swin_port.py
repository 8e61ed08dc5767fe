"""Ports of shifted-window attention in a style we did not choose: the whole grid in, ``torch.roll`` for the cyclic
shift, windows cut by view/permute, the shift mask built from region labels computed by coordinate arithmetic
(not Swin's slices), einsum contractions, their own key names (``to_qkv``, ``to_out``, ``rel_bias``, ``rel_index``).

- :class:`PortShiftedWindowAttention`: Swin's window attention (softmax, relative-position bias, the -100 shift
  mask); tokens (B, H W, C) with ``input_resolution`` and the mask a registered buffer, or channels-last
  (B, H, W, C) with the mask built in the forward.
- :class:`PortShiftedFocused`: FLatten's focused linear attention on the shifted grid, the paper's arithmetic, the
  shift mask applied to the (quadratic) similarity matrix, ``forward(x, H, W)`` on tokens.

``bug`` plants one porting defect (tests/test_verify_windows.py): ``"mask_off_by_one"`` (a region boundary one row
and column too early), ``"roll_direction"`` (the grid rolled by +shift before and -shift after),
``"index_transposed"`` (the relative-position index built with rows and columns exchanged).
"""

from __future__ import annotations

import torch
from torch import nn


def _region_labels(n: int, ws: int, shift: int, bug: str | None) -> torch.Tensor:
    """The region of each row (or column) of the rolled grid: 0 before the last window, 1 in the last window before
    the wrapped part, 2 in the wrapped part."""
    r = torch.arange(n)
    cut = n - shift - (1 if bug == "mask_off_by_one" else 0)
    return (r >= n - ws).long() + (r >= cut).long()


def _allowed(h: int, w: int, ws: int, shift: int, bug: str | None) -> torch.Tensor:
    """bool (nW, ws^2, ws^2): may token i attend to token j of the same window of the rolled grid."""
    lab = _region_labels(h, ws, shift, bug)[:, None] * 3 + _region_labels(w, ws, shift, bug)[None, :]
    win = lab.view(h // ws, ws, w // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws)
    return win[:, :, None] == win[:, None, :]


def _windows(g: torch.Tensor, ws: int) -> torch.Tensor:
    b, h, w, c = g.shape
    return g.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)


def _merge(y: torch.Tensor, b: int, h: int, w: int, ws: int) -> torch.Tensor:
    c = y.shape[-1]
    return y.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


class PortShiftedWindowAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, window_size: int = 4, shift_size: int = 2,
                 input_resolution: tuple[int, int] = (8, 8), layout: str = "tokens", bug: str | None = None):
        super().__init__()
        self.num_heads, self.window_size, self.shift_size, self.bug, self.layout = (num_heads, window_size,
                                                                                    shift_size, bug, layout)
        self.scale = (dim // num_heads) ** -0.5
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)
        ws = window_size
        self.rel_bias = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = coords[:, :, None] - coords[:, None, :] + (ws - 1)                  # (2, n, n)
        rows, cols = (rel[1], rel[0]) if bug == "index_transposed" else (rel[0], rel[1])
        self.register_buffer("rel_index", rows * (2 * ws - 1) + cols)
        if layout == "tokens":
            self.input_resolution = tuple(input_resolution)
            if shift_size:
                allowed = _allowed(*input_resolution, ws, shift_size, bug)
                self.register_buffer("attn_mask", torch.zeros(allowed.shape).masked_fill(~allowed, -100.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "tokens":
            B, L, C = x.shape
            H, W = self.input_resolution
            g = x.view(B, H, W, C)
        else:
            g = x
            B, H, W, C = x.shape
        ws, s, h = self.window_size, self.shift_size, self.num_heads
        n, d = ws * ws, C // h
        if s:
            g = torch.roll(g, shifts=(s, s) if self.bug == "roll_direction" else (-s, -s), dims=(1, 2))
        q, k, v = self.to_qkv(_windows(g, ws)).view(-1, n, 3, h, d).unbind(2)      # (B nW, n, h, d) each
        logits = torch.einsum("bihd,bjhd->bhij", q * self.scale, k)
        logits = logits + self.rel_bias[self.rel_index.reshape(-1)].view(n, n, h).permute(2, 0, 1)
        if s:
            if self.layout == "tokens":
                mask = self.attn_mask
            else:
                allowed = _allowed(H, W, ws, s, self.bug)
                mask = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, -100.0)
            logits = (logits.view(B, -1, h, n, n) + mask[None, :, None]).view(-1, h, n, n)
        o = torch.einsum("bhij,bjhd->bihd", logits.softmax(dim=-1), v).reshape(-1, n, C)
        y = _merge(self.to_out(o), B, H, W, ws)
        if s:
            y = torch.roll(y, shifts=(-s, -s) if self.bug == "roll_direction" else (s, s), dims=(1, 2))
        return y.reshape(B, H * W, C) if self.layout == "tokens" else y


class PortShiftedFocused(nn.Module):
    def __init__(self, dim: int, num_heads: int, window_size: int = 4, shift_size: int = 2,
                 focusing_factor: float = 3.0, kernel: int = 3, bug: str | None = None):
        super().__init__()
        self.num_heads, self.window_size, self.shift_size, self.focusing_factor, self.bug = (
            num_heads, window_size, shift_size, focusing_factor, bug)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dwc = nn.Conv2d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.proj = nn.Linear(dim, dim)

    def _feature(self, t: torch.Tensor) -> torch.Tensor:      # phi_p(x) = ||x|| / ||x^p|| x^p of ReLU(x), per head
        t = torch.relu(t)
        tp = t ** self.focusing_factor
        nt, ntp = t.norm(dim=-1, keepdim=True), tp.norm(dim=-1, keepdim=True)
        return torch.where(ntp > 0, tp * nt / torch.where(ntp > 0, ntp, torch.ones_like(ntp)), torch.zeros_like(tp))

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        B, N, C = x.shape
        ws, s, h = self.window_size, self.shift_size, self.num_heads
        n, d = ws * ws, C // h
        g = x.view(B, H, W, C)
        if s:
            g = torch.roll(g, shifts=(s, s) if self.bug == "roll_direction" else (-s, -s), dims=(1, 2))
        q, k, v = self.qkv(_windows(g, ws)).chunk(3, dim=-1)
        q, k, vh = (t.reshape(-1, n, h, d).transpose(1, 2) for t in (q, k, v))      # (B nW, h, n, d)
        sim = torch.einsum("bhid,bhjd->bhij", self._feature(q), self._feature(k))
        if s:
            keep = _allowed(H, W, ws, s, self.bug).to(sim.dtype)
            sim = (sim.view(B, -1, h, n, n) * keep[None, :, None]).view(-1, h, n, n)
        att = torch.einsum("bhij,bhjd->bhid", sim, vh) / sim.sum(dim=-1, keepdim=True)
        dw = self.dwc(v.transpose(1, 2).reshape(-1, C, ws, ws)).reshape(-1, C, n).transpose(1, 2)
        y = self.proj(att.transpose(1, 2).reshape(-1, n, C) + dw)
        y = _merge(y, B, H, W, ws)
        if s:
            y = torch.roll(y, shifts=(-s, -s) if self.bug == "roll_direction" else (s, s), dims=(1, 2))
        return y.reshape(B, N, C)


class PortWindowAttentionMasked(nn.Module):
    """Swin's window attention called as the block calls it: ``forward(x, mask=None)`` on the windows (B nW, ws^2, C)
    of the (shifted) grid, the additive mask (nW, ws^2, ws^2) passed in; a fused ``qkv``, ``proj``, the table
    ``relative_position_bias_table`` gathered by the buffer ``relative_position_index`` (built by broadcasting
    row and column offsets), matmul contractions.  ``bug="ignore_mask"`` drops the mask."""

    def __init__(self, dim: int, window_size: int, num_heads: int, bug: str | None = None):
        super().__init__()
        self.dim, self.window_size, self.num_heads, self.bug = dim, (window_size, window_size), num_heads, bug
        ws = window_size
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, num_heads))
        r = torch.arange(ws * ws)
        dy = (r // ws)[:, None] - (r // ws)[None, :] + ws - 1
        dx = (r % ws)[:, None] - (r % ws)[None, :] + ws - 1
        self.register_buffer("relative_position_index", dy * (2 * ws - 1) + dx)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        bw, n, c = x.shape
        h = self.num_heads
        qkv = self.qkv(x).reshape(bw, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (c // h) ** -0.5, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, h)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None and self.bug != "ignore_mask":
            nw = mask.shape[0]
            attn = (attn.view(bw // nw, nw, h, n, n) + mask.unsqueeze(1).unsqueeze(0)).view(bw, h, n, n)
        out = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(bw, n, c)
        return self.proj(out)
