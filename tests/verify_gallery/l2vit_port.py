"""A port of L2ViT's linear global attention in another style: its own names (to_qkv, to_out, temperature),
heads by reshape/permute of the fused projection, einsum contractions, the released per-head temperature
multiplying the values, the normaliser clamped at 100 (L2ViT App. 8).  ``bug`` plants one porting defect."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PortL2ViTAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, bug: str | None = None):
        super().__init__()
        self.num_heads, self.bug = num_heads, bug
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)
        self.temperature = nn.Parameter(torch.full((num_heads, 1, 1), (dim // num_heads) ** -0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q, k, v = self.to_qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
        q = F.relu(q)
        k = k if self.bug == "no_relu_k" else F.relu(k)
        v = v * self.temperature
        kv = torch.einsum("bhnd,bhne->bhde", k, v)
        den = torch.einsum("bhnd,bhd->bhn", q, k.sum(dim=2))
        den = den.clamp(min=1.0 if self.bug == "clamp" else 100.0)
        out = torch.einsum("bhnd,bhde->bhne", q, kv) / den.unsqueeze(-1)
        return self.to_out(out.transpose(1, 2).reshape(B, N, C))


class PortL2ViTSplit(PortL2ViTAttention):
    """The same with three projections ``query``, ``key``, ``value`` instead of a fused one."""

    def __init__(self, dim: int, num_heads: int, bug: str | None = None):
        super().__init__(dim, num_heads, bug)
        del self.to_qkv
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.to_qkv = lambda t: torch.cat([self.query(t), self.key(t), self.value(t)], dim=-1)
        try:
            return super().forward(x)
        finally:
            del self.to_qkv
