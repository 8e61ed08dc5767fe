"""A port of RALA as released (RAVLT's attention layer, channels-first) in another style: one fused 1 x 1 conv
``to_qkvg`` (q, k, v and the gate), heads by view/transpose, kappa = ELU + 1 written with torch.where, the
reweighting softmax of the mean query against the keys, 2-D RoPE on kappa(Q) and the reweighted keys, K and V
scaled by N^-1/2 with the mean-of-keys normaliser + 1e-6, the LePE conv ``pos`` on V, the gate, ``out``.
``bug`` plants one porting defect (tests/test_verify.py)."""

from __future__ import annotations


import torch
from torch import nn


def _rope_tables(h: int, w: int, d: int, dtype, device):
    # pair p of a head's channels rotates by row * f_p (first d/4 pairs) or col * f_p (the others),
    # f_q = 10000^(-q / (d/4 - 1)); tables in float64, rounded once
    m = d // 4
    f = torch.tensor([10000.0 ** (-q / (m - 1)) if m > 1 else 1.0 for q in range(m)], dtype=torch.float64)
    f = torch.repeat_interleave(f, 2)
    rows = torch.arange(h, dtype=torch.float64).view(h, 1, 1).expand(h, w, 1) * f
    cols = torch.arange(w, dtype=torch.float64).view(1, w, 1).expand(h, w, 1) * f
    ang = torch.cat([rows, cols], dim=-1).reshape(h * w, d)
    return ang.cos().to(dtype=dtype, device=device), ang.sin().to(dtype=dtype, device=device)


def _rope(x, cos, sin):
    even, odd = x[..., 0::2], x[..., 1::2]
    rot = torch.stack((-odd, even), dim=-1).reshape(x.shape)
    return x * cos + rot * sin


class PortRALA(nn.Module):
    def __init__(self, dim: int, num_heads: int, bug: str | None = None):
        super().__init__()
        self.num_heads, self.bug = num_heads, bug
        self.to_qkvg = nn.Conv2d(dim, 4 * dim, 1)
        self.pos = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.out = nn.Conv2d(dim, dim, 1)

    def _tables(self, h: int, w: int, d: int, x: torch.Tensor):
        return _rope_tables(h, w, d, x.dtype, x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        h, N = self.num_heads, H * W
        d = C // h
        q, k, v, g = self.to_qkvg(x).chunk(4, dim=1)
        lepe = self.pos(v)
        q, k, v = (t.reshape(B, h, d, N).transpose(2, 3) for t in (q, k, v))     # (B, h, N, d)
        kq = torch.where(q > 0, q + 1, torch.exp(q.clamp(max=0)))
        kk = torch.where(k > 0, k + 1, torch.exp(k.clamp(max=0)))
        q_bar = kq.mean(dim=2, keepdim=True) * d ** -0.5
        logits = torch.einsum("bhqd,bhnd->bhqn", q_bar, kk)
        axis = 2 if self.bug == "softmax_axis" else -1
        alpha = torch.softmax(logits, dim=axis) * N                                 # (B, h, 1, N)
        kw = kk * alpha.transpose(2, 3)
        cos, sin = self._tables(W, H, d, x) if self.bug == "rope_grid" else self._tables(H, W, d, x)
        qr, kr = _rope(kq, cos, sin), _rope(kw, cos, sin)
        s = N ** -0.5
        kv = torch.einsum("bhnd,bhne->bhde", kr * s, v * s)
        z = 1.0 / (torch.einsum("bhnd,bhd->bhn", kq, kw.mean(dim=2)) + 1e-6)
        y = torch.einsum("bhnd,bhde->bhne", qr, kv) * z.unsqueeze(-1)
        y = y.transpose(2, 3).reshape(B, C, H, W)
        return self.out((y + lepe) * g)


class PortRALABuffers(PortRALA):
    """The same with its RoPE tables precomputed for one grid and registered as buffers (``rope_cos``,
    ``rope_sin``), as ports that fix the resolution do; ``bug="stale_tables"`` registers them for another grid."""

    def __init__(self, dim: int, num_heads: int, hw: tuple[int, int] = (8, 6), bug: str | None = None):
        super().__init__(dim, num_heads, bug=None)
        grid = (hw[1], hw[0]) if bug == "stale_tables" else hw
        cos, sin = _rope_tables(grid[0], grid[1], dim // num_heads, torch.float64, "cpu")
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)

    def _tables(self, h: int, w: int, d: int, x: torch.Tensor):
        return self.rope_cos.to(x.dtype), self.rope_sin.to(x.dtype)


class PortRALATokens(PortRALA):
    """RALA in the token layout: ``forward(x, H, W)`` on tokens (B, N, C), the fused projection an ``nn.Linear``
    (4C, C) ``to_qkvg`` and the output one ``out``; LePE by the depthwise conv ``pos`` on V put on the grid.  The same
    arithmetic as :class:`PortRALA` (``bug`` as there)."""

    def __init__(self, dim: int, num_heads: int, bug: str | None = None):
        super().__init__(dim, num_heads, bug=bug)
        self.to_qkvg = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        d = C // h
        q, k, v, g = self.to_qkvg(x).chunk(4, dim=-1)                                # (B, N, C) each
        lepe = self.pos(v.transpose(1, 2).reshape(B, C, H, W)).reshape(B, C, N).transpose(1, 2)
        q, k, v = (t.view(B, N, h, d).transpose(1, 2) for t in (q, k, v))         # (B, h, N, d)
        kq = torch.where(q > 0, q + 1, torch.exp(q.clamp(max=0)))
        kk = torch.where(k > 0, k + 1, torch.exp(k.clamp(max=0)))
        q_bar = kq.mean(dim=2, keepdim=True) * d ** -0.5
        logits = torch.einsum("bhqd,bhnd->bhqn", q_bar, kk)
        alpha = torch.softmax(logits, dim=2 if self.bug == "softmax_axis" else -1) * N
        kw = kk * alpha.transpose(2, 3)
        cos, sin = self._tables(W, H, d, x) if self.bug == "rope_grid" else self._tables(H, W, d, x)
        qr, kr = _rope(kq, cos, sin), _rope(kw, cos, sin)
        s = N ** -0.5
        kv = torch.einsum("bhnd,bhne->bhde", kr * s, v * s)
        z = 1.0 / (torch.einsum("bhnd,bhd->bhn", kq, kw.mean(dim=2)) + 1e-6)
        y = torch.einsum("bhnd,bhde->bhne", qr, kv) * z.unsqueeze(-1)
        y = y.transpose(1, 2).reshape(B, N, C)
        return self.out((y + lepe) * g)
