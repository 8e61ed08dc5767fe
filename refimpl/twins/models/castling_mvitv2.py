"""PyTorch twin of refimpl.models.castling_mvitv2: Castling-MViTv2-T/S/B.

Written in the structure of MViTv2's released model (facebookresearch/mvit ``mvit_model.py`` / ``attention.py``:
``PatchEmbed`` with ``proj``, ``MultiScaleBlock`` with ``norm1``, ``attn``, ``proj`` (the skip projection of
the normalised input), ``pool_skip`` (MaxPool2d(3, 2, 1)), ``norm2``, ``mlp``; ``MultiScaleAttention`` with
``qkv``, ``pool_q``, ``norm_q``, ``proj``; final ``norm`` and ``head.projection``), grouped by stage, with the
attention changed as the reference's docstring describes: no K/V pooling, no relative positions, the Castling
core (refimpl.twins.modules.angular.castling_core_t) with the residual pooling connection (+ q), and in the
stride-2 blocks the core evaluated for the pooled queries only (refimpl.twins.models.castling_levit.
pooled_castling_core_t: the constant over all N keys, Q^ (K^^T V) with N' rows, the token conv taken at the
stride-2 positions).  The reference evaluates the core at full resolution and keeps its stride-2 rows
instead, so the two sides agree only because the core is row-wise in Q.
state_dict keys equal refimpl.models.castling_mvitv2.param_shapes; unit values are tokens (B, N, C).
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.twins.models.castling_levit import TokenStagesNet, castling_dconv, pooled_castling_core_t
from refimpl.twins.modules.angular import castling_core_t
from refimpl import config
from refimpl.models.castling_mvitv2 import BlockSpec, CastlingMViTv2Config, block_specs, stage_grids, unit_names

CONFIG_TYPES = (CastlingMViTv2Config,)

__all__ = ["CONFIG_TYPES", "build", "CastlingMViTv2"]

_K = config.MVITV2_POOL_KERNEL


class PatchEmbed(nn.Module):
    def __init__(self, cfg: CastlingMViTv2Config):
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, config.MVITV2_PATCH_KERNEL,
                              stride=config.MVITV2_PATCH_STRIDE, padding=config.MVITV2_PATCH_PADDING)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    def __init__(self, c: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(c, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PoolingAttention(nn.Module):
    """MViTv2's MultiScaleAttention with the Castling core, pooled queries only."""

    def __init__(self, cfg: CastlingMViTv2Config, b: BlockSpec):
        super().__init__()
        self.h, self.hw, self.stride = b.heads, b.hw_in, b.stride
        self.d = b.dim_out // b.heads
        self.acfg = cfg.attention_config(b.stage)
        self.residual = cfg.q_residual == "all"
        self.qkv = nn.Linear(b.dim_in, 3 * b.dim_out, bias=cfg.qkv_bias)
        self.pool_q = nn.Conv2d(self.d, self.d, _K, stride=b.stride, padding=_K // 2, groups=self.d, bias=False)
        self.norm_q = nn.LayerNorm(self.d, eps=cfg.ln_eps)
        self.dconv = castling_dconv(self.acfg)
        self.proj = nn.Linear(b.dim_out, b.dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(bsz, n, 3, self.h, self.d).permute(2, 0, 3, 1, 4).unbind(0)
        img = self.pool_q(q.transpose(-1, -2).reshape(bsz * self.h, self.d, *self.hw))
        q = self.norm_q(img.reshape(bsz, self.h, self.d, -1).transpose(-1, -2))
        cw = None if self.dconv is None else self.dconv.weight
        cb = None if self.dconv is None else self.dconv.bias
        if self.stride == 1:
            out = castling_core_t(q, k, v, self.acfg, conv_weight=cw, conv_bias=cb, training=self.training,
                                  hw=self.hw)
        else:
            out = pooled_castling_core_t(q, k, v, self.acfg, conv_weight=cw, conv_bias=cb, hw=self.hw,
                                         training=self.training)
        if self.residual:
            out = out + q
        return self.proj(out.transpose(1, 2).reshape(bsz, q.shape[2], self.h * self.d))


class Block(nn.Module):
    """MViTv2's MultiScaleBlock (dim_mul_in_att): x_res + attn(norm1 x), then x + mlp(norm2 x)."""

    def __init__(self, cfg: CastlingMViTv2Config, b: BlockSpec):
        super().__init__()
        self.spec = b
        self.norm1 = nn.LayerNorm(b.dim_in, eps=cfg.ln_eps)
        self.attn = PoolingAttention(cfg, b)
        if b.dim_in != b.dim_out:
            self.proj = nn.Linear(b.dim_in, b.dim_out)
        self.pool_skip = nn.MaxPool2d(_K, 2, _K // 2) if b.stride == 2 else None
        self.norm2 = nn.LayerNorm(b.dim_out, eps=cfg.ln_eps)
        self.mlp = Mlp(b.dim_out, cfg.mlp_ratio * b.dim_out)

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One residual step of the block: "attn" (skip + attn(norm1 x), the skip pooled / projected as MultiScaleBlock
        does) or "mlp" (x + mlp(norm2 x))."""
        if name not in ("attn", "mlp"):
            raise ValueError(f"argument 'name': the block has parts ('attn', 'mlp'), got {name!r}")
        if name == "mlp":
            return x + self.mlp(self.norm2(x))
        xn = self.norm1(x)
        att = self.attn(xn)
        skip = self.proj(xn) if self.spec.dim_in != self.spec.dim_out else x
        if self.pool_skip is not None:
            bsz, _, c = skip.shape
            skip = self.pool_skip(skip.transpose(1, 2).reshape(bsz, c, *self.spec.hw_in)).flatten(2).transpose(1, 2)
        return skip + att

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class Stage(nn.Module):
    def __init__(self, cfg: CastlingMViTv2Config, specs: list[BlockSpec]):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg, b) for b in specs)


class Head(nn.Module):
    def __init__(self, c: int, classes: int):
        super().__init__()
        self.projection = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class CastlingMViTv2(TokenStagesNet):
    """MViTv2 patch embedding, four stages of pooling-attention blocks with the Castling core, norm, mean, head."""

    def __init__(self, cfg: CastlingMViTv2Config):
        """MViTv2's patch embedding, one stage of pooling-attention blocks per entry of depths (the reference's
        ``block_specs``), the final LayerNorm and the head; the reference's unit names and stage grids."""
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        specs = block_specs(cfg)
        self.stages = nn.ModuleList(Stage(cfg, [b for b in specs if b.stage == s]) for s in range(len(cfg.depths)))
        c = cfg.dim(len(cfg.depths) - 1)
        self.norm = nn.LayerNorm(c, eps=cfg.ln_eps)
        self.head = Head(c, cfg.num_classes)
        self.units, self.grids = unit_names(cfg), stage_grids(cfg)

    def _block(self, name: str) -> Block:
        parts = name.split(".")
        return self.stages[int(parts[1])].blocks[int(parts[3])]

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` ("patch_embed", "stages.s.blocks.j", "head") on its input: the head normalises the tokens,
        averages them and projects to logits."""
        if name == "patch_embed":
            return self.patch_embed(x)
        if name == "head":
            return self.head(self.norm(x).mean(1))
        return self._block(name)(x)

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp"; refimpl.models.castling_mvitv2.unit_parts) of the block unit ``name``
        ("stages.s.blocks.j") on its tokens (B, N, C); the block is its parts in order."""
        return self._block(name).part(part, x)


def build(cfg: CastlingMViTv2Config) -> nn.Module:
    """The twin of a Castling-MViTv2 config."""
    if not isinstance(cfg, CastlingMViTv2Config):
        raise TypeError(f"argument 'cfg': expected CastlingMViTv2Config, got {type(cfg).__name__}")
    return CastlingMViTv2(cfg)

