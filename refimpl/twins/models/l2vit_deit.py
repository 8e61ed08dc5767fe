"""PyTorch twin of refimpl.models.l2vit_deit: DeiT-T with L2ViT's enhanced linear attention in some blocks
(L2ViT Appendix 9, Table 11; Table 8).  timm-style DeiT (patch embedding, class token, positional embedding,
blocks, LayerNorm, head on the class token); the enhanced blocks use refimpl.twins.modules.enhanced's
EnhancedLinearAttention and LCM (the LGA block's modules, without its CPE), the LCM on the patch tokens only
(the class token's LCM residual is zero, the reference's reading).  state_dict keys equal
refimpl.models.l2vit_deit.param_shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.models.flatten import DeiT, PatchEmbed  # noqa: F401  (PatchEmbed: the frame's)
from refimpl.twins.modules.enhanced import LCM, EnhancedLinearAttention
from refimpl.twins.modules.layers import Mlp
from refimpl.twins.modules.softmax import SoftmaxAttention
from refimpl.models.l2vit_deit import L2ViTDeiTConfig

CONFIG_TYPES = (L2ViTDeiTConfig,)

__all__ = ["CONFIG_TYPES", "build", "L2ViTDeiT"]


class Attention(nn.Module):
    """DeiT's multi-head softmax attention: qkv, softmax(q k^T / sqrt d) v, proj."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.core = SoftmaxAttention()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(self.core(q, k, v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """A DeiT block, kind "S" (softmax attention) or "E" (enhanced linear attention + LCM branch)."""

    def __init__(self, cfg: L2ViTDeiTConfig, kind: str):
        super().__init__()
        self.cfg, self.kind = cfg, kind
        c, eps = cfg.embed_dim, cfg.layer_norm_eps
        self.norm1 = nn.LayerNorm(c, eps=eps)
        if kind == "E":
            bc = cfg.block_config()
            self.attn = EnhancedLinearAttention(bc)
            self.norm3 = nn.LayerNorm(c, eps=eps)
            self.local_mp = LCM(c, bc.lcm_kernel, bc.batch_norm_eps)
        else:
            self.attn = Attention(c, cfg.num_heads, cfg.qkv_bias)
        self.norm2 = nn.LayerNorm(c, eps=eps)
        self.mlp = Mlp(c, cfg.hidden)

    def parts(self) -> tuple[str, ...]:
        return ("attn", "lcm", "mlp") if self.kind == "E" else ("attn", "mlp")

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "attn":
            y = self.norm1(x)
            return x + (self.attn(y, self.cfg.order) if self.kind == "E" else self.attn(y))
        if name == "lcm":
            patches = self.local_mp(self.norm3(x)[:, 1:], self.cfg.grid)
            return torch.cat([x[:, :1], x[:, 1:] + patches], dim=1)
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.parts():
            x = self.part(name, x)
        return x


class L2ViTDeiT(DeiT):
    """forward(images) -> logits; features(images) -> [patch tokens on the grid]; run_unit / run_unit_part
    (refimpl.twins.models.flatten.DeiT's frame, with a class token)."""

    def __init__(self, cfg: L2ViTDeiTConfig):
        """The DeiT frame with a class token around one block per letter of ``cfg.kinds`` ("S": softmax attention, "E":
        enhanced linear attention + LCM)."""
        super().__init__(cfg, lambda: (Block(cfg, kind) for kind in cfg.kinds), cls_token=True)


def build(cfg: L2ViTDeiTConfig) -> nn.Module:
    """The twin of an L2ViT-DeiT config."""
    if not isinstance(cfg, L2ViTDeiTConfig):
        raise TypeError(f"argument 'cfg': expected L2ViTDeiTConfig, got {type(cfg).__name__}")
    return L2ViTDeiT(cfg)
