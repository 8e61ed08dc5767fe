"""PyTorch counterparts of refimpl.attention.softmax: softmax attention and Swin window attention.

WindowAttention follows the structure of Swin's released WindowAttention + the padding/shift part of its
SwinTransformerBlock (F.pad, torch.roll, window partition, additive or -inf masks), written here from the
paper's description; windows are cut with refimpl/twins/modules/layers.py's ``unfold``-based partition.
state_dict keys: qkv.weight, qkv.bias, proj.weight, proj.bias, relative_position_bias_table (the
relative-position index is a non-persistent buffer, so it is not in the state_dict).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.modules.layers import pair, relative_position_index, window_partition, window_reverse


class SoftmaxAttention(nn.Module):
    """forward(q (B,h,N,d), k (B,h,M,d), v (B,h,M,e), bias=None, mask=None) ->
    softmax(scale q k^T + bias, masked_fill(~mask, -inf)) v."""

    def __init__(self, scale: float | None = None):
        """Stores the logits' scale (None: d^-1/2, d the size of the queries' last axis)."""
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, bias=None, mask=None):
        """softmax(scale q k^T + bias) v for q (B, h, N, d), k (B, h, M, d), v (B, h, M, e), the keys where the bool
        ``mask`` is False excluded (-inf); returns (B, h, N, e)."""
        scale = q.shape[-1] ** -0.5 if self.scale is None else self.scale
        a = (q * scale) @ k.transpose(-1, -2)
        if bias is not None:
            a = a + bias
        if mask is not None:
            a = a.masked_fill(~mask, float("-inf"))
        return torch.softmax(a, dim=-1) @ v


def _shift_labels(hp: int, wp: int, wh: int, ww: int, sh: int, sw: int, device) -> torch.Tensor:
    """Swin's region labels of the padded grid (3 slices per shifted axis, cut at -window and -shift of that
    axis), as its released block builds them."""
    img = torch.zeros(1, hp, wp, 1, device=device)
    cnt = 0
    hs = (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)) if sh else (slice(0, None),)
    wsl = (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)) if sw else (slice(0, None),)
    for a in hs:
        for b in wsl:
            img[:, a, b, :] = cnt
            cnt += 1
    return img


class WindowAttention(nn.Module):
    """Swin (shifted) window attention on (B, H, W, C) with the options of refimpl's window_attention:
    shift, pad, rel_pos_bias, mask_padding, mask_value (None = -inf exclusion, else additive).

    window_size : an int ws or a pair (wh, ww); shift : an int or a pair (sh, sw), 0 <= shift < window on each
    axis.  The relative-position table has (2 wh - 1)(2 ww - 1) rows; each axis is padded to a multiple of its
    own window side and rolled by its own shift."""

    def __init__(self, dim: int, num_heads: int, window_size: int, *, shift: int = 0, pad: bool = True,
                 rel_pos_bias: bool = True, mask_padding: bool = True, mask_value: float | None = None,
                 qkv_bias: bool = True, proj_bias: bool = True, scale: float | None = None):
        """The qkv and proj Linears, with ``rel_pos_bias`` the relative-position bias table ((2 wh - 1)(2 ww - 1), h)
        (zeros) and its non-persistent index buffer, and the shift, padding and masking options; the scale defaults to
        d^-1/2.  Raises TypeError / ValueError for a window < 1 or a shift outside [0, window) on an axis."""
        super().__init__()
        self.dim, self.num_heads, self.ws, self.shift = dim, num_heads, window_size, shift
        self.wpair, self.spair = pair(window_size, "window_size"), pair(shift, "shift")
        wh, ww = self.wpair
        if min(self.wpair) < 1 or not (0 <= self.spair[0] < wh and 0 <= self.spair[1] < ww):
            raise ValueError(f"arguments 'window_size', 'shift': expected a window >= 1 and 0 <= shift < window on "
                             f"each axis, got window_size {window_size!r}, shift {shift!r}")
        self.pad, self.mask_padding, self.mask_value = pad, mask_padding, mask_value
        self.scale = (dim // num_heads) ** -0.5 if scale is None else scale
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.rel_pos_bias = rel_pos_bias
        if rel_pos_bias:
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
            self.register_buffer("relative_position_index", relative_position_index(wh, ww), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Swin's (shifted) window attention of x (B, H, W, C): zero-pad to window multiples, roll by -shift, per window
        SoftMax(Q K^T scale + B + mask) V (the shift mask and, with mask_padding, the padded keys: -inf, or the additive
        mask_value), proj, merge, roll back, crop; returns (B, H, W, C).  ValueError for a grid that is not a multiple
        of the window with pad=False."""
        b, h, w, c = x.shape
        ws, (wh, ww), (sh, sw) = self.wpair, self.wpair, self.spair
        ph, pw = (wh - h % wh) % wh, (ww - w % ww) % ww
        if (ph or pw) and not self.pad:
            raise ValueError(f"argument 'x': expected a grid (H, W) that is a multiple of the window {tuple(self.wpair)} "
                             f"with pad=False, got ({h}, {w})")
        x = F.pad(x, (0, 0, 0, pw, 0, ph))
        hp, wp = h + ph, w + pw
        real = torch.zeros(1, hp, wp, 1, device=x.device)
        real[:, :h, :w] = 1
        if sh or sw:
            x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
            real = torch.roll(real, shifts=(-sh, -sw), dims=(1, 2))
        xw = window_partition(x, ws)                                      # (B nW, n, C)
        bw, n, _ = xw.shape
        nw = bw // b
        qkv = self.qkv(xw).reshape(bw, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)                     # (B nW, h, n, n)
        if self.rel_pos_bias:
            bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
            attn = attn + bias.reshape(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        keep = torch.ones(nw, n, n, dtype=torch.bool, device=x.device)
        if sh or sw:
            lab = window_partition(_shift_labels(hp, wp, wh, ww, sh, sw, x.device), ws)[..., 0]
            keep &= lab[:, :, None] == lab[:, None, :]
        if self.mask_padding and (ph or pw):
            keep &= (window_partition(real, ws)[..., 0] > 0)[:, None, :]
        if not bool(keep.all()):
            attn = attn.reshape(b, nw, self.num_heads, n, n)
            if self.mask_value is None:
                attn = attn.masked_fill(~keep[None, :, None], float("-inf"))
            else:
                attn = attn + (~keep).to(attn.dtype)[None, :, None] * self.mask_value
            attn = attn.reshape(bw, self.num_heads, n, n)
        o = (torch.softmax(attn, dim=-1) @ v).transpose(1, 2).reshape(bw, n, c)
        y = window_reverse(self.proj(o), ws, hp, wp)
        if sh or sw:
            y = torch.roll(y, shifts=(sh, sw), dims=(1, 2))
        return y[:, :h, :w, :].contiguous()
