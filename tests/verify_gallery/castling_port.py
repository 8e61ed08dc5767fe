"""A port of Castling-ViT's attention as released (official preset) in another style: ``to_qkv`` without bias,
heads by view/unbind, unit rows of Q and K, einsum contractions, the linear angular kernel 1/2 + (1/pi) q k^T applied as
0.5 V + (1/pi) Q (K^T V), L2-normalised rows, a depthwise token convolution ``token_conv`` of V per head,
``to_out``.  ``bug`` plants one porting defect (tests/test_verify.py)."""

from __future__ import annotations

import math

import torch
from torch import nn


class PortCastling(nn.Module):
    def __init__(self, dim: int, num_heads: int, kernel: int = 9, bug: str | None = None):
        super().__init__()
        self.num_heads, self.bug = num_heads, bug
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim)
        self.token_conv = nn.Conv2d(num_heads, num_heads, (kernel, 1), padding=(kernel // 2, 0), groups=num_heads,
                                    bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q, k, v = (t.transpose(1, 2) for t in self.to_qkv(x).view(B, N, 3, h, C // h).unbind(2))   # (B, h, N, d)
        if self.bug != "no_unit_rows":
            q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)    # unit rows: the angle's cosine is q.k
            k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
        kv = torch.einsum("bhnd,bhne->bhde", k, v)
        gain = 1.0 if self.bug == "no_pi" else 1.0 / math.pi
        ang = 0.5 * v + gain * torch.einsum("bhnd,bhde->bhne", q, kv)
        ang = ang / torch.linalg.vector_norm(ang, dim=-1, keepdim=True)
        out = ang + self.token_conv(q if self.bug == "conv_on_q" else v)
        return self.to_out(out.transpose(1, 2).reshape(B, N, C))
