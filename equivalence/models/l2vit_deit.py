"""PyTorch twin of refimpl.models.l2vit_deit: DeiT-T with L2ViT's enhanced linear attention in some blocks
(L2ViT Appendix 9, Table 11; Table 8).  timm-style DeiT (patch embedding, class token, positional embedding,
blocks, LayerNorm, head on the class token); the enhanced blocks use equivalence.modules.enhanced's
EnhancedLinearAttention and LCM (the LGA block's modules, without its CPE), the LCM on the patch tokens only
(the class token's LCM residual is zero, the reference's reading).  state_dict keys equal
refimpl.models.l2vit_deit.param_shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from equivalence.modules.enhanced import LCM, EnhancedLinearAttention
from equivalence.modules.layers import Mlp
from equivalence.modules.softmax import SoftmaxAttention
from refimpl.models.l2vit_deit import L2ViTDeiTConfig

CONFIG_TYPES = (L2ViTDeiTConfig,)

__all__ = ["CONFIG_TYPES", "build", "L2ViTDeiT"]


class PatchEmbed(nn.Module):
    def __init__(self, in_chans: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


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


class L2ViTDeiT(nn.Module):
    """forward(images) -> logits; features(images) -> [patch tokens on the grid]; run_unit / run_unit_part."""

    def __init__(self, cfg: L2ViTDeiTConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.in_chans, c, cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.tokens, c))
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.kinds)
        self.norm = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(c, cfg.num_classes)

    def stem(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x[:, 0]))

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "stem":
            return self.stem(x)
        if name == "head":
            return self.head_unit(x)
        return self.blocks[int(name.split(".")[1])](x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[int(name.split(".")[1])].part(part, x)

    def _backbone(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for blk in self.blocks:
            x = blk(x)
        return x

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self._backbone(images)
        b, _, c = x.shape
        return [x[:, 1:].transpose(1, 2).reshape(b, c, *self.cfg.grid)]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head_unit(self._backbone(images))


def build(cfg: L2ViTDeiTConfig) -> nn.Module:
    """The twin of an L2ViT-DeiT config."""
    if not isinstance(cfg, L2ViTDeiTConfig):
        raise TypeError(f"argument 'cfg': expected L2ViTDeiTConfig, got {type(cfg).__name__}")
    return L2ViTDeiT(cfg)
