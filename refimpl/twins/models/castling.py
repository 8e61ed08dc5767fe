"""PyTorch twin of refimpl.models.castling: Castling-DeiT (timm-style DeiT with refimpl.twins.modules.angular's
CastlingAttention in every block).  state_dict keys equal refimpl.models.castling.param_shapes.  Built in
eval mode by refimpl.twins.models.build: the paper preset's auxiliary branch is then dropped, as the
reference's inference forward does.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.models.flatten import DeiT, PatchEmbed  # noqa: F401  (PatchEmbed: the frame's)
from refimpl.twins.modules.angular import CastlingAttention
from refimpl.twins.modules.layers import Mlp
from refimpl.models.castling import CastlingDeiTConfig

CONFIG_TYPES = (CastlingDeiTConfig,)

__all__ = ["CONFIG_TYPES", "build", "CastlingDeiT"]


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


class CastlingDeiT(DeiT):
    """DeiT with Castling attention: patch embedding, class token, positional embedding, blocks, LayerNorm,
    head on the class token (refimpl.twins.models.flatten.DeiT's frame)."""

    def __init__(self, cfg: CastlingDeiTConfig):
        """The DeiT frame with a class token around ``cfg.depth`` Castling blocks."""
        super().__init__(cfg, lambda: (Block(cfg) for _ in range(cfg.depth)), cls_token=True)


def build(cfg: CastlingDeiTConfig) -> nn.Module:
    """The twin of a Castling-DeiT config."""
    if not isinstance(cfg, CastlingDeiTConfig):
        raise TypeError(f"argument 'cfg': expected CastlingDeiTConfig, got {type(cfg).__name__}")
    return CastlingDeiT(cfg)
