"""PyTorch twin of refimpl.models.l2vit: L2ViT-T/S/B (Zheng, "The Linear Attention Resurrection in Vision
Transformer", §4.3, Table 13).

Written in the structure of the released classification model: ``downsample_layers`` (the convolutional stem
``proj = ConvStem(proj = Sequential(conv, BN, ReLU, conv, BN))`` + LayerNorm, then LayerNorm + 2x2 stride-2 convs), each
input zero-padded at the bottom/right to a multiple of the patch size as the released PatchEmbed does;
``stages`` of alternating LWA / LGA blocks (refimpl.twins.modules.enhanced, the attention helper's twins)
on tokens (B, N, C) with their grid size passed along; final LayerNorm, average pooling, Linear head.
state_dict keys equal refimpl.models.l2vit.param_shapes.  Unit values (``run_unit``) are channels-first
grids, as in the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.modules.enhanced import LGABlock, LWABlock
from refimpl.errors import ArgumentError
from refimpl.models.l2vit import L2ViTNetConfig, block_config, unit_names, unit_parts

CONFIG_TYPES = (L2ViTNetConfig,)

__all__ = ["CONFIG_TYPES", "build", "L2ViT", "PatchEmbed"]


def _pad_to(x: torch.Tensor, multiple: int) -> torch.Tensor:
    ph, pw = (-x.shape[2]) % multiple, (-x.shape[3]) % multiple
    return F.pad(x, (0, pw, 0, ph)) if (ph or pw) else x


class ConvStem(nn.Module):
    """conv 3x3/2 -> BN -> ReLU -> conv 3x3/2 -> BN (the released ConvStem, whose ``proj`` Sequential nests
    inside PatchEmbed's ``proj``: keys "downsample_layers.0.proj.proj.{0,1,3,4}.*")."""

    def __init__(self, in_chans: int, dim: int, hidden: int, bn_eps: float):
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_chans, hidden, 3, stride=2, padding=1),
                                  nn.BatchNorm2d(hidden, eps=bn_eps), nn.ReLU(),
                                  nn.Conv2d(hidden, dim, 3, stride=2, padding=1), nn.BatchNorm2d(dim, eps=bn_eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stem's grid (B, dim, H / 4, W / 4); its gradient is handed to the last BatchNorm's backward contiguous.

        PyTorch 2.13's CPU batch-norm backward returns wrong input, weight and bias gradients (O(1) off; the bias's
        ~1e-16 instead of its sum of the output gradient) for a batch of one whose gradient is channels-last with a
        batch stride other than C H W: the layout the LayerNorm over ``x.flatten(2).transpose(1, 2)`` (PatchEmbed)
        hands back.  Without this every ConvStem parameter's float64 reference gradient was wrong at batch 1 (the
        verify tool's images)."""
        y = self.proj(x)
        if y.requires_grad:
            y.register_hook(lambda g: g.contiguous())
        return y


class PatchEmbed(nn.Module):
    """The stem (``stem=True``: images -> tokens) or a downsampling layer (tokens -> tokens).

    forward(x, size) -> (tokens (B, N', C_out), new size).  Stem: pad to 4, conv/BN/ReLU/conv/BN, flatten,
    LayerNorm.  Downsampling: LayerNorm, to the grid, pad to 2, conv 2x2 stride 2, flatten.
    """

    def __init__(self, in_chans: int, dim: int, *, stem: bool, hidden: int = 0, ln_eps: float = 1e-5,
                 bn_eps: float = 1e-5):
        """The stem (``stem=True``: ConvStem in_chans -> ``hidden`` -> dim, then LayerNorm over dim) or a downsampling
        layer (LayerNorm over in_chans, then the 2 x 2 stride-2 conv to dim)."""
        super().__init__()
        self.stem = stem
        if stem:
            self.proj = ConvStem(in_chans, dim, hidden, bn_eps)
            self.norm = nn.LayerNorm(dim, eps=ln_eps)
        else:
            self.norm = nn.LayerNorm(in_chans, eps=ln_eps)
            self.proj = nn.Conv2d(in_chans, dim, 2, stride=2)

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        """(tokens (B, N', dim), new grid size): the stem from images (B, in_chans, H, W) zero-padded to multiples of 4;
        a downsampling layer from tokens (B, N, in_chans) on the grid ``size``, normalised, then zero-padded to
        multiples of 2."""
        if not self.stem:
            b, n, c = x.shape
            x = self.norm(x).transpose(1, 2).reshape(b, c, size[0], size[1])
        x = self.proj(_pad_to(x, 4 if self.stem else 2))
        new = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)
        if self.stem:
            x = self.norm(x)
        return x, new


class L2ViT(nn.Module):
    """forward(images) -> logits; features(images) -> [stage outputs (B, C_i, H_i, W_i)]; run_unit(name, x)."""

    def __init__(self, cfg: L2ViTNetConfig):
        """Per stage the downsampling layer (the stem first) and 2 N_i blocks alternating LWA (even) and LGA (odd) with
        the stage's block config; the final LayerNorm and the head."""
        super().__init__()
        self.cfg = cfg
        self.downsample_layers = nn.ModuleList()
        self.stages = nn.ModuleList()
        for i in range(cfg.num_stages):
            if i == 0:
                pe = PatchEmbed(cfg.in_chans, cfg.dims[0], stem=True, hidden=cfg.stem_width, ln_eps=cfg.layer_norm_eps,
                                bn_eps=cfg.batch_norm_eps)
            else:
                pe = PatchEmbed(cfg.dims[i - 1], cfg.dims[i], stem=False, ln_eps=cfg.layer_norm_eps)
            self.downsample_layers.append(pe)
            bc = block_config(cfg, i)
            self.stages.append(nn.ModuleList((LWABlock if j % 2 == 0 else LGABlock)(bc) for j in range(cfg.depths[i])))
        self.norm = nn.LayerNorm(cfg.dims[-1], eps=cfg.layer_norm_eps)
        self.head = nn.Linear(cfg.dims[-1], cfg.num_classes)

    def _block(self, i: int, j: int, x: torch.Tensor, size, part: str | None = None) -> torch.Tensor:
        blk = self.stages[i][j]
        args = (x, size) if isinstance(blk, LWABlock) else (x, size, self.cfg.order)
        return blk(*args) if part is None else blk.part(part, *args)

    def _backbone(self, images: torch.Tensor):
        size = (images.shape[2], images.shape[3])
        x, feats = images, []
        for i in range(self.cfg.num_stages):
            x, size = self.downsample_layers[i](x, size)
            for j in range(len(self.stages[i])):
                x = self._block(i, j, x, size)
            feats.append(x.transpose(1, 2).reshape(x.shape[0], x.shape[2], size[0], size[1]))
        return x, feats

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x).mean(dim=1))

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The unit ``name`` of refimpl.models.l2vit.unit_names on a channels-first grid (images for "stem")."""
        if name not in unit_names(self.cfg):
            raise ValueError(f"unknown unit {name!r}")
        if name == "stem":
            t, size = self.downsample_layers[0](x, (x.shape[2], x.shape[3]))
            return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], size[0], size[1])
        b, c, h, w = x.shape
        tok = x.flatten(2).transpose(1, 2)
        if name == "head":
            return self._head(tok)
        parts = name.split(".")
        if parts[0] == "downsample_layers":
            t, size = self.downsample_layers[int(parts[1])](tok, (h, w))
        else:
            t, size = self._block(int(parts[1]), int(parts[2]), tok, (h, w)), (h, w)
        return t.transpose(1, 2).reshape(b, t.shape[2], size[0], size[1])

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` of the block unit ``name`` ("stages.i.j"; refimpl.models.l2vit.unit_parts) on a channels-first
        grid (B, C, H, W) -> the same; the block's ``run_unit`` is its parts in order."""
        parts = unit_parts(self.cfg, name)        # refuses an unknown unit, naming 'name'
        if part not in parts:
            raise ArgumentError(f"argument 'part': unit {name!r} has parts {parts}, got {part!r}")
        b, c, h, w = x.shape
        _, i, j = name.split(".")
        t = self._block(int(i), int(j), x.flatten(2).transpose(1, 2), (h, w), part)
        return t.transpose(1, 2).reshape(b, c, h, w)

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: each stage's output tokens as a channels-first grid (B, C_i, H_i, W_i)."""
        return self._backbone(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): the stages, then LayerNorm, the mean over the tokens
        and the head."""
        return self._head(self._backbone(images)[0])


def build(cfg: L2ViTNetConfig) -> nn.Module:
    """The twin of an L2ViT network config."""
    if not isinstance(cfg, L2ViTNetConfig):
        raise TypeError(f"argument 'cfg': expected L2ViTNetConfig, got {type(cfg).__name__}")
    return L2ViT(cfg)
