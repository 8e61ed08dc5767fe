"""Ports whose backward pass is their own (tests/test_verify_grad.py): the output projection and the ReLU features
computed by custom ``torch.autograd.Function``s, as fused-kernel ports write them.  The forward is exact (the
same ``F.linear`` / ``clamp`` as torch's own); ``bug`` plants one defect in a backward only:

* ``"linear_dx_transposed"``: the projection's input gradient is g W^T instead of g W (W square: the shapes fit);
* ``"linear_dw_scaled"``: the projection's weight gradient scaled by 1 + 1e-3 (a wrong normalisation constant);
* ``"relu_leaky_backward"``: the ReLU's backward passes 0.01 g where the input is negative (a leaky ReLU's);
* ``"linear_db_missing_batch"``: the bias gradient summed over the first sample of the batch only.

``GradL2ViT`` is the L2ViT port (tests/verify_gallery/l2vit_port.py) with both Functions; ``GradCastling`` the
Castling-ViT port (castling_port.py) with the projection Function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.verify_gallery.castling_port import PortCastling
from tests.verify_gallery.l2vit_port import PortL2ViTAttention


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, bug):
        ctx.save_for_backward(x, w)
        ctx.bug = bug
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        bug = ctx.bug
        dx = g @ (w.t() if bug == "linear_dx_transposed" else w)
        dw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        if bug == "linear_dw_scaled":
            dw = dw * (1 + 1e-3)
        gb = g[:1] if bug == "linear_db_missing_batch" else g
        db = gb.reshape(-1, g.shape[-1]).sum(0)
        return dx, dw, db, None


class _ReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bug):
        ctx.save_for_backward(x)
        ctx.bug = bug
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        neg = 0.01 if ctx.bug == "relu_leaky_backward" else 0.0
        return g * torch.where(x > 0, torch.ones_like(x), torch.full_like(x, neg)), None


class FusedLinear(nn.Linear):
    """nn.Linear whose backward is :class:`_Linear`'s."""

    def __init__(self, cin: int, cout: int, bug: str | None = None):
        super().__init__(cin, cout)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Linear.apply(x, self.weight, self.bias, self.bug)


class GradL2ViT(PortL2ViTAttention):
    def __init__(self, dim: int, num_heads: int, bug: str | None = None):
        super().__init__(dim, num_heads)
        self.grad_bug = bug
        self.to_out = FusedLinear(dim, dim, bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q, k, v = self.to_qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
        q, k = _ReLU.apply(q, self.grad_bug), _ReLU.apply(k, self.grad_bug)
        v = v * self.temperature
        kv = torch.einsum("bhnd,bhne->bhde", k, v)
        den = torch.einsum("bhnd,bhd->bhn", q, k.sum(dim=2)).clamp(min=100.0)
        out = torch.einsum("bhnd,bhde->bhne", q, kv) / den.unsqueeze(-1)
        return self.to_out(out.transpose(1, 2).reshape(B, N, C))


class GradCastling(PortCastling):
    def __init__(self, dim: int, num_heads: int, kernel: int = 9, bug: str | None = None):
        super().__init__(dim, num_heads, kernel)
        self.to_out = FusedLinear(dim, dim, bug)


__all__ = ["GradL2ViT", "GradCastling", "FusedLinear"]
