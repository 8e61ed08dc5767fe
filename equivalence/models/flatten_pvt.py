"""PyTorch twin of refimpl.models.flatten_pvt: FLatten-PVT-T/S/M/L.

Written as an ordinary PVT-style nn.Module (per-stage ``patch_embed{i}``, ``pos_embed{i}``, ``block{i}``
ModuleLists, a final ``norm`` and ``head``), built from the attention twin of equivalence/modules
(focused.FocusedLinearAttention, which carries PVT's spatial reduction for sr > 1) and
equivalence/modules/layers.Mlp.  state_dict keys equal refimpl.models.flatten_pvt.param_shapes.  Tokens are
(B, N, C) between units, as in the reference; ``features`` returns channels-first maps.
"""

from __future__ import annotations

import torch
from torch import nn

from equivalence.modules.focused import FocusedLinearAttention
from equivalence.modules.layers import Mlp
from refimpl.models.flatten_pvt import FlattenPVTConfig

CONFIG_TYPES = (FlattenPVTConfig,)

__all__ = ["CONFIG_TYPES", "build", "FlattenPVT"]


class PatchEmbed(nn.Module):
    """Conv(s x s, stride s) on a channels-first grid -> tokens (B, N, C) -> LayerNorm."""

    def __init__(self, in_chans: int, dim: int, patch: int, eps: float):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(grid).flatten(2).transpose(1, 2))


class Block(nn.Module):
    """x + attn(LN1 x), x + MLP(LN2 x) with the focused linear attention over the stage grid."""

    def __init__(self, cfg: FlattenPVTConfig, i: int):
        super().__init__()
        c = cfg.embed_dims[i]
        self.hw = cfg.stage_grids[i]
        kh, kw = cfg.kv_grid(i)
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.attn = FocusedLinearAttention(cfg.attention_config(i), kh * kw)
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.hidden(i))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One stage of the block: "attn" (x + attn(LN1 x)) or "mlp" (x + MLP(LN2 x))."""
        if name == "attn":
            return x + self.attn(self.norm1(x), self.hw)
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class FlattenPVT(nn.Module):
    """FLatten-PVT: four stages of patch embedding + positional embedding + focused blocks; (final LayerNorm
    if the config applies it), mean over tokens, head."""

    def __init__(self, cfg: FlattenPVTConfig):
        super().__init__()
        self.cfg = cfg
        for i in range(cfg.n_stages):
            c, (gh, gw) = cfg.embed_dims[i], cfg.stage_grids[i]
            setattr(self, f"patch_embed{i + 1}", PatchEmbed(cfg.stage_in_chans(i), c, cfg.stage_patch(i),
                                                            cfg.patch_norm_eps))
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, gh * gw, c)))
            setattr(self, f"block{i + 1}", nn.ModuleList(Block(cfg, i) for _ in range(cfg.depths[i])))
        self.norm = nn.LayerNorm(cfg.embed_dims[-1], eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cfg.embed_dims[-1], cfg.num_classes)

    def _grid(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Stage i's tokens (B, N, C) -> (B, C, H, W)."""
        gh, gw = self.cfg.stage_grids[i]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], gh, gw)

    def embed(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i's patch embedding (images for i = 0, else the previous stage's tokens) + pos_embed."""
        grid = x if i == 0 else self._grid(x, i - 1)
        return getattr(self, f"patch_embed{i + 1}")(grid) + getattr(self, f"pos_embed{i + 1}")

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.applies_final_norm:
            x = self.norm(x)
        return self.head(x.mean(dim=1))

    def _block(self, name: str) -> Block:
        stage, j = name.split(".")
        return getattr(self, stage)[int(j)]

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "head":
            return self.head_unit(x)
        if name.startswith("patch_embed"):
            return self.embed(int(name[len("patch_embed"):]) - 1, x)
        return self._block(name)(x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        return self._block(name).part(part, x)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, feats = images, []
        for i in range(self.cfg.n_stages):
            x = self.embed(i, x)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x)
            feats.append(self._grid(x, i))
        return self.head_unit(x), feats

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        return self._run(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[0]


def build(cfg: FlattenPVTConfig) -> nn.Module:
    """The twin of a FLatten-PVT config."""
    if not isinstance(cfg, FlattenPVTConfig):
        raise TypeError(f"argument 'cfg': expected FlattenPVTConfig, got {type(cfg).__name__}")
    return FlattenPVT(cfg)
