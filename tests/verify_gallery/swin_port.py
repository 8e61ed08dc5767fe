"""Ports of shifted-window attention in a style we did not choose: the whole grid in, ``torch.roll`` for the cyclic
shift, windows cut by view/permute, the shift mask built from region labels computed by coordinate arithmetic
(not Swin's slices), einsum contractions, their own key names (``to_qkv``, ``to_out``, ``rel_bias``, ``rel_index``).
Windows and shifts are an int or a pair (wh, ww), (sh, sw).

- :class:`PortShiftedWindowAttention`: Swin's window attention (softmax, relative-position bias, the -100 shift
  mask); tokens (B, H W, C) with ``input_resolution`` and the mask a registered buffer, or channels-last
  (B, H, W, C) with the grid zero-padded at the bottom and right to window multiples (Swin's rule; padded keys
  not masked, as released) and the mask built in the forward.
- :class:`PortShiftedFocused`: FLatten's focused linear attention on the shifted grid, the paper's arithmetic, the
  shift mask applied to the (quadratic) similarity matrix, ``forward(x, H, W)`` on tokens.
- :class:`PortWindowAttentionMasked`: Swin's ``WindowAttention(x, mask)`` on the windows of the padded, shifted grid.

``bug`` plants one porting defect (tests/test_verify_windows*.py): ``"mask_off_by_one"`` (a region boundary one row
and column too early), ``"roll_direction"`` (the grid rolled by +shift before and -shift after),
``"index_transposed"`` (the relative-position index built with the two axes exchanged: (x offset) (2 wh - 1) + (y
offset)), ``"index_stride"`` (the row offset multiplied by 2 wh - 1 instead of 2 ww - 1: right on square windows
only), ``"pad_top_left"`` (the padding put at the top and left).  ``grad_bug`` plants one in a backward only, the
forward exact (custom ``torch.autograd.Function``s, as a fused kernel writes them): ``"roll_backward"`` (the cyclic
shift's backward rolls the same way as its forward), ``"scale_backward"`` (the logits' scale differentiated with
C^-1/2 instead of d^-1/2), ``"bias_grad_index"`` (the bias table's gradient scattered with the ``index_transposed``
index while the forward gathers with the right one), ``"bias_grad_nan"`` (the table gradient's last row left NaN,
a row the kernel never writes).
"""

from __future__ import annotations

import torch
from torch import nn


def _two(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _region_labels(n: int, ws: int, shift: int, bug: str | None) -> torch.Tensor:
    """The region of each row (or column) of the rolled grid: 0 before the last window, 1 in the last window before
    the wrapped part, 2 in the wrapped part."""
    r = torch.arange(n)
    cut = n - shift - (1 if bug == "mask_off_by_one" else 0)
    return (r >= n - ws).long() + (r >= cut).long()


def _allowed(h: int, w: int, ws: tuple[int, int], shift: tuple[int, int], bug: str | None) -> torch.Tensor:
    """bool (nW, wh ww, wh ww): may token i attend to token j of the same window of the rolled grid."""
    lab = (_region_labels(h, ws[0], shift[0], bug)[:, None] * 3 +
           _region_labels(w, ws[1], shift[1], bug)[None, :])
    win = lab.view(h // ws[0], ws[0], w // ws[1], ws[1]).permute(0, 2, 1, 3).reshape(-1, ws[0] * ws[1])
    return win[:, :, None] == win[:, None, :]


def _windows(g: torch.Tensor, ws: tuple[int, int]) -> torch.Tensor:
    b, h, w, c = g.shape
    return g.view(b, h // ws[0], ws[0], w // ws[1], ws[1], c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws[0] * ws[1], c)


def _merge(y: torch.Tensor, b: int, h: int, w: int, ws: tuple[int, int]) -> torch.Tensor:
    c = y.shape[-1]
    return y.view(b, h // ws[0], w // ws[1], ws[0], ws[1], c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


def _rel_index(ws: tuple[int, int], bug: str | None) -> torch.Tensor:
    """(n, n) index into the ((2 wh - 1)(2 ww - 1), h) table (Swin: (dy + wh - 1)(2 ww - 1) + dx + ww - 1)."""
    wh, ww = ws
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :]
    dy, dx = rel[0] + wh - 1, rel[1] + ww - 1
    if bug == "index_transposed":
        return dx * (2 * wh - 1) + dy
    if bug == "index_stride":
        return dy * (2 * wh - 1) + dx
    return dy * (2 * ww - 1) + dx


class _Roll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shifts, bug):
        ctx.shifts, ctx.bug = shifts, bug
        return torch.roll(x, shifts=shifts, dims=(1, 2))

    @staticmethod
    def backward(ctx, g):
        back = ctx.shifts if ctx.bug == "roll_backward" else tuple(-t for t in ctx.shifts)
        return torch.roll(g, shifts=back, dims=(1, 2)), None, None


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, scale, wrong):
        ctx.scale = wrong if wrong is not None else scale
        return q * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, index, back_index, nan_rows=False):
        ctx.save_for_backward(back_index)
        ctx.nan_rows = nan_rows
        ctx.rows = table.shape[0]
        return table[index.reshape(-1)]

    @staticmethod
    def backward(ctx, g):
        (back,) = ctx.saved_tensors
        gt = g.new_zeros(ctx.rows, g.shape[-1]).index_add_(0, back.reshape(-1), g)
        if ctx.nan_rows:
            gt[-1] = float("nan")
        return gt, None, None, None


class PortShiftedWindowAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, window_size=4, shift_size=2,
                 input_resolution: tuple[int, int] = (8, 8), layout: str = "tokens", bug: str | None = None,
                 grad_bug: str | None = None):
        super().__init__()
        ws, sh = _two(window_size), _two(shift_size)
        self.num_heads, self.window_size, self.shift_size, self.bug, self.layout = (num_heads, window_size,
                                                                                    shift_size, bug, layout)
        self.ws, self.sh, self.grad_bug = ws, sh, grad_bug
        self.scale = (dim // num_heads) ** -0.5
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)
        self.rel_bias = nn.Parameter(torch.zeros((2 * ws[0] - 1) * (2 * ws[1] - 1), num_heads))
        self.register_buffer("rel_index", _rel_index(ws, bug))
        back = _rel_index(ws, "index_transposed" if grad_bug == "bias_grad_index" else bug)
        self.register_buffer("grad_index", back, persistent=False)
        if layout == "tokens":
            self.input_resolution = tuple(input_resolution)
            if any(sh):
                allowed = _allowed(*input_resolution, ws, sh, bug)
                self.register_buffer("attn_mask", torch.zeros(allowed.shape).masked_fill(~allowed, -100.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "tokens":
            B, L, C = x.shape
            H, W = self.input_resolution
            g = x.view(B, H, W, C)
        else:
            g = x
            B, H, W, C = x.shape
        ws, s, h = self.ws, self.sh, self.num_heads
        n, d = ws[0] * ws[1], C // h
        ph, pw = -H % ws[0], -W % ws[1]
        if ph or pw:          # Swin's zero padding to window multiples (bottom / right)
            top = self.bug == "pad_top_left"
            g = nn.functional.pad(g, (0, 0, pw if top else 0, 0 if top else pw, ph if top else 0, 0 if top else ph))
        Hp, Wp = H + ph, W + pw
        if any(s):
            shifts = tuple(s) if self.bug == "roll_direction" else (-s[0], -s[1])
            g = _Roll.apply(g, shifts, self.grad_bug)
        q, k, v = self.to_qkv(_windows(g, ws)).view(-1, n, 3, h, d).unbind(2)      # (B nW, n, h, d) each
        q = _Scale.apply(q, self.scale, C ** -0.5 if self.grad_bug == "scale_backward" else None)
        logits = torch.einsum("bihd,bjhd->bhij", q, k)
        bias = _Gather.apply(self.rel_bias, self.rel_index, self.grad_index, self.grad_bug == "bias_grad_nan")
        logits = logits + bias.view(n, n, h).permute(2, 0, 1)
        if any(s):
            if self.layout == "tokens":
                mask = self.attn_mask
            else:
                allowed = _allowed(Hp, Wp, ws, s, self.bug)
                mask = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, -100.0)
            logits = (logits.view(B, -1, h, n, n) + mask[None, :, None]).view(-1, h, n, n)
        o = torch.einsum("bhij,bjhd->bihd", logits.softmax(dim=-1), v).reshape(-1, n, C)
        y = _merge(self.to_out(o), B, Hp, Wp, ws)
        if any(s):
            y = torch.roll(y, shifts=(-s[0], -s[1]) if self.bug == "roll_direction" else tuple(s), dims=(1, 2))
        if self.bug == "pad_top_left":
            y = y[:, ph:, pw:]
        else:
            y = y[:, :H, :W]
        return y.reshape(B, H * W, C) if self.layout == "tokens" else y


class PortShiftedFocused(nn.Module):
    def __init__(self, dim: int, num_heads: int, window_size=4, shift_size=2,
                 focusing_factor: float = 3.0, kernel: int = 3, bug: str | None = None):
        super().__init__()
        self.num_heads, self.window_size, self.shift_size, self.focusing_factor, self.bug = (
            num_heads, window_size, shift_size, focusing_factor, bug)
        self.ws, self.sh = _two(window_size), _two(shift_size)
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
        ws, s, h = self.ws, self.sh, self.num_heads
        n, d = ws[0] * ws[1], C // h
        g = x.view(B, H, W, C)
        if any(s):
            g = torch.roll(g, shifts=tuple(s) if self.bug == "roll_direction" else (-s[0], -s[1]), dims=(1, 2))
        q, k, v = self.qkv(_windows(g, ws)).chunk(3, dim=-1)
        q, k, vh = (t.reshape(-1, n, h, d).transpose(1, 2) for t in (q, k, v))      # (B nW, h, n, d)
        sim = torch.einsum("bhid,bhjd->bhij", self._feature(q), self._feature(k))
        if any(s):
            keep = _allowed(H, W, ws, s, self.bug).to(sim.dtype)
            sim = (sim.view(B, -1, h, n, n) * keep[None, :, None]).view(-1, h, n, n)
        att = torch.einsum("bhij,bhjd->bhid", sim, vh) / sim.sum(dim=-1, keepdim=True)
        dw = self.dwc(v.transpose(1, 2).reshape(-1, C, ws[0], ws[1])).reshape(-1, C, n).transpose(1, 2)
        y = self.proj(att.transpose(1, 2).reshape(-1, n, C) + dw)
        y = _merge(y, B, H, W, ws)
        if any(s):
            y = torch.roll(y, shifts=(-s[0], -s[1]) if self.bug == "roll_direction" else tuple(s), dims=(1, 2))
        return y.reshape(B, N, C)


class PortWindowAttentionMasked(nn.Module):
    """Swin's window attention called as the block calls it: ``forward(x, mask=None)`` on the windows
    (B nW, wh ww, C) of the (padded, shifted) grid, the additive mask (nW, wh ww, wh ww) passed in; a fused ``qkv``,
    ``proj``, the table ``relative_position_bias_table`` gathered by the buffer ``relative_position_index`` (built by
    broadcasting row and column offsets), matmul contractions; ``window_size`` an int or (wh, ww), kept as the
    pair (Swin's ``to_2tuple``).  ``bug="ignore_mask"`` drops the mask; ``"index_transposed"`` /
    ``"index_stride"`` as in the module docstring."""

    def __init__(self, dim: int, window_size, num_heads: int, bug: str | None = None):
        super().__init__()
        wh, ww = _two(window_size)
        self.dim, self.window_size, self.num_heads, self.bug = dim, (wh, ww), num_heads, bug
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        r = torch.arange(wh * ww)
        dy = (r // ww)[:, None] - (r // ww)[None, :] + wh - 1
        dx = (r % ww)[:, None] - (r % ww)[None, :] + ww - 1
        idx = (dx * (2 * wh - 1) + dy if bug == "index_transposed" else
               dy * (2 * wh - 1) + dx if bug == "index_stride" else dy * (2 * ww - 1) + dx)
        self.register_buffer("relative_position_index", idx)

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
