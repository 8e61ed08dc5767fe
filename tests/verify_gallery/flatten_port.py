"""A port of FLatten's PVT attention in another style than ours or the released code's: its own names
(to_q, to_kv, reduce, reduce_norm, dw, to_out, feature_scale, pos_emb), einsum contractions, heads split by
view/permute, the released arithmetic (ReLU + 1e-6, / softplus(s), token-wide norms, the mean-of-keys
normaliser with n^-1/2-scaled K and V, one DWC kernel bank shared by the heads, V resampled linearly over the
flattened tokens when sr > 1).  ``bug`` plants one porting defect (tests/test_verify.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PortFocusedAttention(nn.Module):
    def __init__(self, dim: int, heads: int, sr_ratio: int = 1, focusing_factor: float = 3.0, kernel: int = 5,
                 n_kv: int = 16, bug: str | None = None):
        super().__init__()
        self.heads, self.sr_ratio, self.focusing_factor, self.bug = heads, sr_ratio, focusing_factor, bug
        hd = dim // heads
        self.to_q = nn.Linear(dim, dim)
        self.to_kv = nn.Linear(dim, 2 * dim)
        if sr_ratio > 1:
            self.reduce = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio)
            # "norm_eps": TensorFlow's LayerNorm epsilon (1e-3) carried over: a bug inside a submodule
            self.reduce_norm = nn.LayerNorm(dim, eps=1e-3 if bug == "norm_eps" else 1e-5)
        self.dw = nn.Conv2d(hd, hd, kernel, padding=kernel // 2, groups=hd)
        self.to_out = nn.Linear(dim, dim)
        self.feature_scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_emb = nn.Parameter(torch.zeros(1, n_kv, dim))

    def _feature(self, t: torch.Tensor) -> torch.Tensor:
        p = 2.0 if self.bug == "power" else self.focusing_factor
        t = (F.relu(t) + 1e-6) / F.softplus(self.feature_scale)
        tp = t ** p
        return tp * (t.norm(dim=-1, keepdim=True) / tp.norm(dim=-1, keepdim=True))

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        B, N, C = x.shape
        h = self.heads
        d = C // h
        q = self.to_q(x)
        if self.sr_ratio > 1:
            red = self.reduce(x.permute(0, 2, 1).reshape(B, C, H, W)).reshape(B, C, -1).permute(0, 2, 1)
            normed = self.reduce_norm(red)
            src = red if self.bug == "skip_norm" else normed
        else:
            src = x
        k, v = self.to_kv(src).chunk(2, dim=-1)
        k = k + self.pos_emb
        q, k = self._feature(q), self._feature(k)
        q, k, v = (t.view(B, -1, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
        n = k.shape[2]
        kb, vb = (torch.cat([t[1:2], t[1:]]) for t in (k, v)) if self.bug == "batch_state" else (k, v)
        kv = torch.einsum("bhnd,bhne->bhde", kb * n ** -0.5, vb * n ** -0.5)
        k_stat = k.sum(dim=2) if self.bug == "sum_normaliser" else k.mean(dim=2)
        z = 1.0 / (torch.einsum("bhnd,bhd->bhn", q, k_stat) + 1e-6)
        att = torch.einsum("bhnd,bhde->bhne", q, kv) * z.unsqueeze(-1)
        src_dw = k if self.bug == "dwc_on_k" else v
        g = src_dw.permute(0, 1, 3, 2).reshape(B * h, d, n)
        if n != N:
            g = F.interpolate(g, size=N, mode="linear", align_corners=False)
        dw = self.dw(g.reshape(B * h, d, H, W)).reshape(B, h, d, N).permute(0, 1, 3, 2)
        y = (att + dw).permute(0, 2, 1, 3).reshape(B, N, C)
        return self.to_out(y)


class PortFusedDeiT(PortFocusedAttention):
    """The DeiT case (sr = 1) with one fused projection ``qkv`` (3C, C) and 1 x 1 convolutions for the
    projections' weights' shapes, as some ports write them."""

    def __init__(self, dim: int, heads: int, n_kv: int = 16, **kw):
        super().__init__(dim, heads, sr_ratio=1, n_kv=n_kv, **kw)
        del self.to_q, self.to_kv
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        q, kv = self.qkv(x).split([x.shape[-1], 2 * x.shape[-1]], dim=-1)
        self.to_q = lambda _x: q                  # reuse the parent's arithmetic on the fused outputs
        self.to_kv = lambda _src: kv
        try:
            return super().forward(x, H, W)
        finally:
            del self.to_q, self.to_kv


class PortWindowAttention(PortFusedDeiT):
    """The Swin layout as the released FLatten-Swin module is called: ``forward(x, mask=None)`` on windows
    (B nW, ws^2, C), the grid of each window implied by N; the released code ignores the shift mask."""

    def __init__(self, dim: int, window_size: int, num_heads: int, bug: str | None = None):
        super().__init__(dim, num_heads, n_kv=window_size * window_size, bug=bug)
        self.window_size = window_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, self.window_size, self.window_size)
