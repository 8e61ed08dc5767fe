"""PyTorch twins of refimpl.models.flatten: FLatten-DeiT and FLatten-Swin.

Written as ordinary nn.Modules (timm-style DeiT, Swin-style stages), built from the attention twins of
refimpl/twins/modules (focused.FocusedLinearAttention / FocusedWindowAttention, softmax.WindowAttention) and
refimpl/twins/modules/layers (Mlp, PatchMerging).  state_dict keys equal refimpl.models.flatten.param_shapes.
Token layouts follow the reference: DeiT tokens (B, N, C), Swin grids channels-last (B, H, W, C); ``features``
returns channels-first maps.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.modules.focused import FocusedLinearAttention, FocusedWindowAttention
from refimpl.twins.modules.layers import Mlp, PatchMerging
from refimpl.twins.modules.softmax import WindowAttention
from refimpl.models.flatten import FlattenDeiTConfig, FlattenSwinConfig

CONFIG_TYPES = (FlattenDeiTConfig, FlattenSwinConfig)

__all__ = ["CONFIG_TYPES", "build", "DeiT", "FlattenDeiT", "FlattenSwin"]


class PatchEmbed(nn.Module):
    """Patch x patch convolution with stride patch; optional LayerNorm (Swin) applied channels-last."""

    def __init__(self, in_chans: int, dim: int, patch: int, norm_eps: float | None = None):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch)
        if norm_eps is not None:
            self.norm = nn.LayerNorm(dim, eps=norm_eps)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images)


class DeiTBlock(nn.Module):
    def __init__(self, cfg: FlattenDeiTConfig):
        super().__init__()
        c, (gh, gw) = cfg.embed_dim, cfg.grid
        self.hw = (gh, gw)
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.attn = FocusedLinearAttention(cfg.attention_config(), gh * gw)
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.hidden)

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One stage of the block: "attn" (x + attn(LN1 x)) or "mlp" (x + MLP(LN2 x))."""
        if name == "attn":
            return x + self.attn(self.norm1(x), self.hw)
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class DeiT(nn.Module):
    """DeiT's frame, shared by the DeiT twins (FLatten-DeiT, RALA-DeiT, Castling-DeiT, L2ViT-DeiT): the patch
    embedding, the class token (if any), the positional embedding, the blocks ``make_blocks()`` builds, the
    final LayerNorm and the head (on the class token, or the mean over the tokens without one); the unit
    methods (run_unit, run_unit_part), features and forward."""

    def __init__(self, cfg, make_blocks, *, cls_token: bool):
        """The patch embedding, the class token (``cls_token``), the positional embedding (one per patch token, plus one
        for the class token), the blocks ``make_blocks()`` returns, the final LayerNorm and the head, sized by the DeiT
        config ``cfg``."""
        super().__init__()
        self.cfg = cfg
        c, (gh, gw) = cfg.embed_dim, cfg.grid
        self.has_cls_token = cls_token
        self.patch_embed = PatchEmbed(cfg.in_chans, c, cfg.patch_size)
        if cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.pos_embed = nn.Parameter(torch.zeros(1, gh * gw + (1 if cls_token else 0), c))
        self.blocks = nn.ModuleList(make_blocks())
        self.norm = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(c, cfg.num_classes)

    def stem(self, images: torch.Tensor) -> torch.Tensor:
        """The "stem" unit: images (B, in_chans, H, W) -> patch tokens (B, N, C), the class token prepended if there is
        one, plus the positional embedding."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        if self.has_cls_token:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.pos_embed

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        """The "head" unit: logits (B, num_classes) of the LayerNorm of the class token or, without one, of the mean of
        the normalised tokens."""
        return self.head(self.norm(x[:, 0]) if self.has_cls_token else self.norm(x).mean(dim=1))

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` of the reference's ``unit_names`` ("stem", "blocks.i", "head") on its input ``x``."""
        if name == "stem":
            return self.stem(x)
        if name == "head":
            return self.head_unit(x)
        return self.blocks[int(name.split(".")[1])](x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` of the block unit ``name`` ("blocks.i") on ``x``: "attn" or "mlp" (and "lcm" in L2ViT-DeiT's
        enhanced blocks)."""
        return self.blocks[int(name.split(".")[1])].part(part, x)

    def _backbone(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for blk in self.blocks:
            x = blk(x)
        return x

    def _grid(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_cls_token:
            x = x[:, 1:]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *self.cfg.grid)

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: the last block's patch tokens as one channels-first map [(B, C, H', W')] on the
        patch grid (the class token dropped)."""
        return [self._grid(self._backbone(images))]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): stem, blocks, head."""
        return self.head_unit(self._backbone(images))


class FlattenDeiT(DeiT):
    """FLatten-DeiT: patch embedding + positional embedding (no class token), focused blocks, LayerNorm,
    mean over tokens, head."""

    def __init__(self, cfg: FlattenDeiTConfig):
        """The DeiT frame without a class token around ``cfg.depth`` focused blocks."""
        super().__init__(cfg, lambda: (DeiTBlock(cfg) for _ in range(cfg.depth)), cls_token=False)


class SwinBlock(nn.Module):
    """x + attn(LN1 x), x + MLP(LN2 x) on a (B, H, W, C) grid; attn focused (L) or softmax window (S)."""

    def __init__(self, cfg: FlattenSwinConfig, i: int, j: int):
        super().__init__()
        c, ws, sh = cfg.stage_dim(i), *cfg.stage_windows[i]
        self.shift = sh if j % 2 else 0
        self.focused = cfg.attn_types[i] == "L"
        self.norm1 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        if self.focused:
            self.attn = FocusedWindowAttention(cfg.attention_config(i), ws)
        else:
            opts = cfg.window_options
            opts.pop("shift", None)
            self.attn = WindowAttention(c, cfg.num_heads[i], ws, shift=self.shift, pad=True, qkv_bias=cfg.qkv_bias,
                                        **opts)
        self.norm2 = nn.LayerNorm(c, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(c, cfg.hidden(i))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One stage of the block: "attn" (x + attn(LN1 x)) or "mlp" (x + MLP(LN2 x))."""
        if name == "mlp":
            return x + self.mlp(self.norm2(x))
        b, h, w, c = x.shape
        y = self.norm1(x)
        if self.focused:
            y = self.attn(y.reshape(b, h * w, c), (h, w), shift=self.shift).reshape(b, h, w, c)
        else:
            y = self.attn(y)
        return x + y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class SwinStage(nn.Module):
    def __init__(self, cfg: FlattenSwinConfig, i: int):
        super().__init__()
        self.blocks = nn.ModuleList(SwinBlock(cfg, i, j) for j in range(cfg.depths[i]))
        if i < cfg.n_stages - 1:
            self.downsample = PatchMerging(cfg.stage_dim(i), eps=cfg.layer_norm_eps)
        else:
            self.downsample = None


class FlattenSwin(nn.Module):
    """FLatten-Swin: patch embedding + LN, four stages (focused / softmax window blocks, patch merging),
    LN, global average pool, head."""

    def __init__(self, cfg: FlattenSwinConfig):
        """The patch embedding with its LayerNorm, one stage per configured stage (its focused or softmax window blocks,
        then patch merging but after the last), the final LayerNorm and the head."""
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg.in_chans, cfg.embed_dim, cfg.patch_size, norm_eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(SwinStage(cfg, i) for i in range(cfg.n_stages))
        cl = cfg.stage_dim(cfg.n_stages - 1)
        self.norm = nn.LayerNorm(cl, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cl, cfg.num_classes)

    def stem(self, images: torch.Tensor) -> torch.Tensor:
        """The "stem" unit: images (B, in_chans, H, W) -> the patch grid channels-last (B, H', W', C), LayerNorm
        applied."""
        return self.patch_embed.norm(self.patch_embed(images).permute(0, 2, 3, 1))

    def head_unit(self, x: torch.Tensor) -> torch.Tensor:
        """The "head" unit: logits (B, num_classes) from the LayerNorm of the last grid (B, H, W, C), averaged over its
        tokens."""
        return self.head(self.norm(x).mean(dim=(1, 2)))

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` ("stem", "layers.i.blocks.j", "layers.i.downsample", "head") on its input ``x``: images for the
        stem, else a channels-last grid."""
        if name == "stem":
            return self.stem(x)
        if name == "head":
            return self.head_unit(x)
        parts = name.split(".")
        stage = self.layers[int(parts[1])]
        return stage.downsample(x) if parts[2] == "downsample" else stage.blocks[int(parts[3])](x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp") of the block unit ``name`` ("layers.i.blocks.j") on ``x``."""
        parts = name.split(".")
        return self.layers[int(parts[1])].blocks[int(parts[3])].part(part, x)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.stem(images)
        feats = []
        for stage in self.layers:
            for blk in stage.blocks:
                x = blk(x)
            feats.append(x.permute(0, 3, 1, 2))
            if stage.downsample is not None:
                x = stage.downsample(x)
        return self.head_unit(x), feats

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's output before its patch merging, channels-first
        (B, C 2^i, H_i, W_i)."""
        return self._run(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): stem, stages, head."""
        return self._run(images)[0]


def build(cfg: FlattenDeiTConfig | FlattenSwinConfig) -> nn.Module:
    """The twin of a FLatten network config."""
    if isinstance(cfg, FlattenDeiTConfig):
        return FlattenDeiT(cfg)
    if isinstance(cfg, FlattenSwinConfig):
        return FlattenSwin(cfg)
    raise TypeError(f"argument 'cfg': expected a FLatten config, got {type(cfg).__name__}")
