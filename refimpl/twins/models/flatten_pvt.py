"""PyTorch twin of refimpl.models.flatten_pvt: FLatten-PVT-T/S/M/L and FLatten-PVTv2-B0..B4.

Written as an ordinary PVT-style nn.Module (per-stage ``patch_embed{i}``, ``pos_embed{i}``, ``block{i}``
ModuleLists, a final ``norm`` and ``head``), built from the attention twin of refimpl/twins/modules
(focused.FocusedLinearAttention, which carries PVT's spatial reduction for sr > 1) and
refimpl/twins/modules/layers.Mlp.  state_dict keys equal refimpl.models.flatten_pvt.param_shapes.  Tokens are
(B, N, C) between units, as in the reference; ``features`` returns channels-first maps.  ``cfg.version == 2``
(PVT v2): overlapping patch embeddings without positional embeddings, the convolutional feed-forward
(``ConvMlp``: fc1 -> ``dwconv.dwconv`` 3x3 depthwise -> GELU -> fc2) and a LayerNorm ``norm{i}`` per stage.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.modules.focused import FocusedLinearAttention
from refimpl.twins.modules.layers import Mlp
from refimpl import config as _config
from refimpl.models.flatten_pvt import FlattenPVTConfig

CONFIG_TYPES = (FlattenPVTConfig,)

__all__ = ["CONFIG_TYPES", "build", "FlattenPVT"]


class PatchEmbed(nn.Module):
    """Conv(k x k, stride s, padding) on a channels-first grid -> tokens (B, N, C) -> LayerNorm (v1: k = s, no
    padding; v2: k = 2 s - 1, padding s - 1)."""

    def __init__(self, in_chans: int, dim: int, kernel: int, stride: int, padding: int, eps: float):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel, stride=stride, padding=padding)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(grid).flatten(2).transpose(1, 2))


class DWConv(nn.Module):
    """The 3x3 depthwise conv (with bias, zero padding) of PVT v2's feed-forward, on (B, N, C) tokens."""

    def __init__(self, c: int, hw: tuple[int, int]):
        super().__init__()
        k = _config.PVT_V2_MLP_DWCONV_KERNEL
        self.hw = hw
        self.dwconv = nn.Conv2d(c, c, k, padding=k // 2, groups=c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return self.dwconv(x.transpose(1, 2).reshape(b, c, *self.hw)).flatten(2).transpose(1, 2)


class ConvMlp(nn.Module):
    """PVT v2's convolutional feed-forward: fc1 -> DWConv -> GELU -> fc2."""

    def __init__(self, c: int, hidden: int, hw: tuple[int, int]):
        super().__init__()
        self.fc1 = nn.Linear(c, hidden)
        self.dwconv = DWConv(hidden, hw)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.dwconv(self.fc1(x))))


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
        self.mlp = Mlp(c, cfg.hidden(i)) if cfg.version == 1 else ConvMlp(c, cfg.hidden(i), self.hw)

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
        """Per stage i the patch embedding ``patch_embed{i+1}`` (kernel, stride and padding of the config's version),
        the positional embedding ``pos_embed{i+1}`` (v1), the blocks ``block{i+1}`` and the stage LayerNorm
        ``norm{i+1}`` (v2); v1's final LayerNorm ``norm``; the head."""
        super().__init__()
        self.cfg = cfg
        for i in range(cfg.n_stages):
            c, (gh, gw) = cfg.embed_dims[i], cfg.stage_grids[i]
            setattr(self, f"patch_embed{i + 1}", PatchEmbed(cfg.stage_in_chans(i), c, cfg.stage_kernel(i),
                                                            cfg.stage_patch(i), cfg.stage_padding(i),
                                                            cfg.patch_norm_eps))
            if cfg.version == 1:
                setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, gh * gw, c)))
            setattr(self, f"block{i + 1}", nn.ModuleList(Block(cfg, i) for _ in range(cfg.depths[i])))
            if cfg.version == 2:
                setattr(self, f"norm{i + 1}", nn.LayerNorm(c, eps=cfg.layer_norm_eps))
        if cfg.version == 1:
            self.norm = nn.LayerNorm(cfg.embed_dims[-1], eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cfg.embed_dims[-1], cfg.num_classes)

    def _grid(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Stage i's tokens (B, N, C) -> (B, C, H, W)."""
        gh, gw = self.cfg.stage_grids[i]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], gh, gw)

    def embed(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i's patch embedding (images for i = 0, else the previous stage's tokens) + pos_embed (v1)."""
        grid = x if i == 0 else self._grid(x, i - 1)
        y = getattr(self, f"patch_embed{i + 1}")(grid)
        return y if self.cfg.version == 2 else y + getattr(self, f"pos_embed{i + 1}")

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        """The "head" unit: logits (B, num_classes) from the last stage's tokens (B, N, C), through the final LayerNorm
        when the config applies it, averaged over the tokens."""
        if self.cfg.applies_final_norm:
            x = self.norm(x)
        return self.head(x.mean(dim=1))

    def _block(self, name: str) -> Block:
        stage, j = name.split(".")
        return getattr(self, stage)[int(j)]

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` ("patch_embed{i}", "block{i}.{j}", "norm{i}" (v2), "head") on its input: images for
        "patch_embed1", else tokens (B, N, C)."""
        if name == "head":
            return self.head_unit(x)
        if name.startswith("patch_embed"):
            return self.embed(int(name[len("patch_embed"):]) - 1, x)
        if name.startswith("norm"):
            return getattr(self, name)(x)
        return self._block(name)(x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp") of the block unit ``name`` ("block{i}.{j}") on ``x``."""
        return self._block(name).part(part, x)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, feats = images, []
        for i in range(self.cfg.n_stages):
            x = self.embed(i, x)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x)
            if self.cfg.version == 2:
                x = getattr(self, f"norm{i + 1}")(x)
            feats.append(self._grid(x, i))
        return self.head_unit(x), feats

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's tokens after its blocks (and v2's stage norm) as a channels-first
        map (B, C_i, H_i, W_i)."""
        return self._run(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): the stages, head."""
        return self._run(images)[0]


def build(cfg: FlattenPVTConfig) -> nn.Module:
    """The twin of a FLatten-PVT config."""
    if not isinstance(cfg, FlattenPVTConfig):
        raise TypeError(f"argument 'cfg': expected FlattenPVTConfig, got {type(cfg).__name__}")
    return FlattenPVT(cfg)
