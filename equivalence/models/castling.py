"""PyTorch twin of refimpl.models.castling: Castling-DeiT (timm-style DeiT with equivalence.modules.angular's
CastlingAttention in every block).  state_dict keys equal refimpl.models.castling.param_shapes.  Built in
eval mode by equivalence.models.build: the paper preset's auxiliary branch is then dropped, as the
reference's inference forward does.
"""

from __future__ import annotations

import torch
from torch import nn

from equivalence.modules.angular import CastlingAttention
from equivalence.modules.layers import Mlp
from refimpl.models.castling import CastlingDeiTConfig

CONFIG_TYPES = (CastlingDeiTConfig,)

__all__ = ["CONFIG_TYPES", "build", "CastlingDeiT"]


class PatchEmbed(nn.Module):
    def __init__(self, in_chans: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


class Block(nn.Module):
    def __init__(self, cfg: CastlingDeiTConfig):
        super().__init__()
        c = cfg.embed_dim
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.attn = CastlingAttention(cfg.attention_config())
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.hidden)

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One stage of the block: "attn" (x + attn(LN1 x)) or "mlp" (x + MLP(LN2 x))."""
        if name == "attn":
            return x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class CastlingDeiT(nn.Module):
    """DeiT with Castling attention: patch embedding, class token, positional embedding, blocks, LayerNorm,
    head on the class token."""

    def __init__(self, cfg: CastlingDeiTConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.in_chans, c, cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.tokens, c))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
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

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        for blk in self.blocks:
            x = blk(x)
        b, _, c = x.shape
        return [x[:, 1:].transpose(1, 2).reshape(b, c, *self.cfg.grid)]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for blk in self.blocks:
            x = blk(x)
        return self.head_unit(x)


def build(cfg: CastlingDeiTConfig) -> nn.Module:
    """The twin of a Castling-DeiT config."""
    if not isinstance(cfg, CastlingDeiTConfig):
        raise TypeError(f"argument 'cfg': expected CastlingDeiTConfig, got {type(cfg).__name__}")
    return CastlingDeiT(cfg)
