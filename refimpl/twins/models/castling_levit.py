"""PyTorch twin of refimpl.models.castling_levit: Castling-LeViT-128/192/256/384.

Written in the structure of LeViT's released model (Graham et al. 2021: ``Conv2d_BN`` / ``Linear_BN`` modules
with submodules ``c`` and ``bn``, BatchNorm1d on the flattened tokens, Hardswish, BN + Linear heads ``bn`` /
``l``), with the attention changed as the reference's docstring describes: the Castling core
(refimpl.twins.modules.angular.castling_core_t) in the stage blocks, with Q/K at the value dim and the residual
pooling connection (+ q); in the shrink blocks q is projected at every token and then subsampled (post-Q
pooling: MViTv2's conv + LayerNorm, or the stride-2 selection), and the core is evaluated for the pooled
queries only (the constant over all N keys, Q^ (K^^T V) with N' rows, the token conv taken at the kept
positions).  The reference evaluates the core at full resolution
and subsamples its rows instead, so the two sides agree only because the core is row-wise in Q.
state_dict keys equal refimpl.models.castling_levit.param_shapes; unit values are tokens (B, N, C).

Hardswish is :func:`hardswish_t`, not ``F.hardswish``: PyTorch's CUDA kernel multiplies by 1/6 rounded to float32
(its constant is built from ``1.0f / 6.0f`` in every dtype), so in float64 every output carries a relative error
of 2^-25 = 3.0e-8, hundreds of millions of float64 units (found on an H200 by ``pytest equivalence/``:
Castling-LeViT's stem diverged by 5.1e-8 in float64).  The CPU kernel divides by 6 in the op-math type, as
hardswish_t does on every device, bit for bit the same as ``F.hardswish`` on CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.modules.angular import _features_t, castling_core_t, masked_softmax_branch_t, unit_rows_t
from refimpl.attention.angular import CastlingConfig
from refimpl.models.castling_levit import CastlingLeViTConfig, stage_grids, unit_names

CONFIG_TYPES = (CastlingLeViTConfig,)

__all__ = ["CONFIG_TYPES", "build", "hardswish_t", "CastlingLeViT", "pooled_castling_core_t", "castling_dconv", "TokenStagesNet"]


def hardswish_t(x: torch.Tensor) -> torch.Tensor:
    """x min(max(x + 3, 0), 6) / 6 in the op-math type (float32 for float16 / bfloat16), rounded once to x's dtype:
    torch's CPU kernel on every device (module docstring)."""
    y = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (y * (y + 3.0).clamp(0.0, 6.0) / 6.0).to(x.dtype)


class Hardswish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hardswish_t(x)


class ConvBN(nn.Module):
    def __init__(self, a: int, b: int, eps: float):
        super().__init__()
        self.c = nn.Conv2d(a, b, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(b, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.c(x))


class LinearBN(nn.Module):
    def __init__(self, a: int, b: int, eps: float):
        super().__init__()
        self.c = nn.Linear(a, b, bias=False)
        self.bn = nn.BatchNorm1d(b, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


class BNLinear(nn.Module):
    def __init__(self, a: int, b: int, eps: float):
        super().__init__()
        self.bn = nn.BatchNorm1d(a, eps=eps)
        self.l = nn.Linear(a, b)  # noqa: E741 - LeViT's name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(self.bn(x))


def castling_dconv(acfg: CastlingConfig) -> nn.Module | None:
    """The Castling core's token conv ("tokens1d": (k, 1) over the tokens, heads as channels; "grid2d": k x k
    depthwise on the grid), or None; shared with the Castling-MViTv2 twin."""
    h, c, k = acfg.num_heads, acfg.dim, acfg.conv_kernel
    if acfg.conv == "tokens1d":
        return nn.Conv2d(h, h, (k, 1), padding=(k // 2, 0), groups=h, bias=acfg.conv_bias)
    if acfg.conv == "grid2d":
        return nn.Conv2d(c, c, k, padding=k // 2, groups=c, bias=acfg.conv_bias)
    return None


def _subsample(t: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(..., N, d) -> the tokens at even grid positions (LeViT's Subsample)."""
    lead, d = t.shape[:-2], t.shape[-1]
    return t.reshape(*lead, hw[0], hw[1], d)[..., ::2, ::2, :].reshape(*lead, -1, d)


def pooled_castling_core_t(q, k, v, cfg: CastlingConfig, *, conv_weight=None, conv_bias=None, hw, training=False):
    """Eq. 9 (-10) for pooled queries: q (B, h, N', d) at the stride-2 positions of the (H, W) grid, k, v
    (B, h, N, d).  Constant 1/2 sum_j v_j over all N keys ("sum") or 1/2 v at the kept positions ("own");
    the conv branch evaluated at the kept positions."""
    m = k.shape[-2]
    qh = unit_rows_t(q, cfg.qk_norm_eps, cfg.qk_norm)
    kh = unit_rows_t(k, cfg.qk_norm_eps, cfg.qk_norm)
    if cfg.order == 0:
        series = (1.0 / math.pi) * (qh @ (kh.transpose(-1, -2) @ v))
        fq, fk = qh, kh
    else:
        fq, fk = _features_t(qh, cfg.order), _features_t(kh, cfg.order)
        series = fq @ (fk.transpose(-1, -2) @ v)
    vs = _subsample(v, hw)
    const = 0.5 * vs if cfg.constant == "own" else (0.5 * v.sum(dim=-2, keepdim=True)).expand_as(series)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            sparse = masked_softmax_branch_t(qh, kh, v, threshold=cfg.sparse_eps, scale=1.0)
        else:
            sparse = masked_softmax_branch_t(q, k, v, threshold=cfg.sparse_eps, scale=cfg.head_dim ** -0.5)
    if cfg.normaliser == "output_l2":
        ang = const + series if sparse is None else (sparse + const) + series
        out = ang / ang.norm(dim=-1, keepdim=True)
    else:
        out = const + series
        if cfg.normaliser == "similarity_sum":
            dot = (fq * fk.sum(dim=-2, keepdim=True)).sum(dim=-1, keepdim=True)
            if cfg.order == 0:
                dot = (1.0 / math.pi) * dot
            out = out / (m / 2.0 + dot)
    if cfg.conv == "tokens1d":
        kk = conv_weight.shape[2]
        out = out + _subsample(F.conv2d(v, conv_weight, conv_bias, padding=(kk // 2, 0), groups=v.shape[1]), hw)
    elif cfg.conv == "grid2d":
        b, h, _, d = v.shape
        img = v.transpose(-1, -2).reshape(b, h * d, hw[0], hw[1])
        kk = conv_weight.shape[2]
        dwc = F.conv2d(img, conv_weight, conv_bias, stride=2, padding=kk // 2, groups=h * d)
        out = out + dwc.reshape(b, h, d, -1).transpose(-1, -2)
    if sparse is not None and cfg.normaliser != "output_l2":
        out = out + sparse
    return out


class StageAttention(nn.Module):
    def __init__(self, cfg: CastlingLeViTConfig, stage: int):
        super().__init__()
        c, h, dv, eps = cfg.embed_dims[stage], cfg.num_heads[stage], cfg.value_dim, cfg.batch_norm_eps
        self.acfg = cfg.attention_config(stage)
        self.hw = stage_grids(cfg)[stage]
        self.residual = cfg.residual(False)
        self.h, self.dv = h, dv
        self.qkv = LinearBN(c, h * 3 * dv, eps)
        self.dconv = castling_dconv(self.acfg)
        self.proj = LinearBN(h * dv, c, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, self.h, 3 * self.dv).permute(0, 2, 1, 3).split(self.dv, dim=3)
        out = castling_core_t(q, k, v, self.acfg, conv_weight=None if self.dconv is None else self.dconv.weight,
                              conv_bias=None if self.dconv is None else self.dconv.bias, training=self.training,
                              hw=self.hw)
        if self.residual:
            out = out + q
        return self.proj(hardswish_t(out.transpose(1, 2).reshape(b, n, self.h * self.dv)))


class DownsampleAttention(nn.Module):
    def __init__(self, cfg: CastlingLeViTConfig, stage: int):
        super().__init__()
        cin, c, eps = cfg.embed_dims[stage - 1], cfg.embed_dims[stage], cfg.batch_norm_eps
        self.h, self.dv = cfg.down_heads(stage), cfg.down_value_dim
        self.acfg = cfg.attention_config(stage, downsample=True)
        self.hw = stage_grids(cfg)[stage - 1]
        self.residual = cfg.residual(True)
        self.kv = LinearBN(cin, self.h * 2 * self.dv, eps)
        self.q = LinearBN(cin, self.h * self.dv, eps)
        self.q_pool = cfg.q_pool
        if cfg.q_pool == "conv":       # MViTv2's pool_q / norm_q, shared by the heads
            self.pool_q = nn.Conv2d(self.dv, self.dv, 3, stride=2, padding=1, groups=self.dv, bias=False)
            self.norm_q = nn.LayerNorm(self.dv, eps=cfg.q_pool_ln_eps)
        self.dconv = castling_dconv(self.acfg)
        self.proj = LinearBN(self.h * self.dv, c, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        k, v = self.kv(x).view(b, n, self.h, 2 * self.dv).permute(0, 2, 1, 3).split(self.dv, dim=3)
        q = self.q(x).view(b, n, self.h, self.dv).permute(0, 2, 1, 3)                       # post-Q pooling:
        if self.q_pool == "subsample":
            q = _subsample(q, self.hw)
        else:
            img = self.pool_q(q.transpose(-1, -2).reshape(b * self.h, self.dv, *self.hw))
            q = self.norm_q(img.reshape(b, self.h, self.dv, -1).transpose(-1, -2))
        out = pooled_castling_core_t(q, k, v, self.acfg, conv_weight=None if self.dconv is None else self.dconv.weight,
                                     conv_bias=None if self.dconv is None else self.dconv.bias, hw=self.hw,
                                     training=self.training)
        if self.residual:
            out = out + q
        return self.proj(hardswish_t(out.transpose(1, 2).reshape(b, q.shape[2], self.h * self.dv)))


class Mlp(nn.Module):
    def __init__(self, c: int, hidden: int, eps: float):
        super().__init__()
        self.fc1 = LinearBN(c, hidden, eps)
        self.act = Hardswish()
        self.fc2 = LinearBN(hidden, c, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """A stage block (x + attn(x), x + mlp(x)) or a shrink block (attn(x), then y + mlp(y))."""

    def __init__(self, cfg: CastlingLeViTConfig, stage: int, downsample: bool):
        super().__init__()
        c = cfg.embed_dims[stage]
        self.downsample = downsample
        self.attn = DownsampleAttention(cfg, stage) if downsample else StageAttention(cfg, stage)
        ratio = cfg.down_mlp_ratio if downsample else cfg.mlp_ratio
        self.mlp = Mlp(c, ratio * c, cfg.batch_norm_eps)

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "attn":
            return self.attn(x) if self.downsample else x + self.attn(x)
        return x + self.mlp(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part("mlp", self.part("attn", x))


class Stage(nn.Module):
    def __init__(self, cfg: CastlingLeViTConfig, stage: int):
        super().__init__()
        if stage:
            self.downsample = Block(cfg, stage, True)
        self.blocks = nn.ModuleList(Block(cfg, stage, False) for _ in range(cfg.depths[stage]))


class TokenStagesNet(nn.Module):
    """The unit interpreter shared by the Castling-LeViT and Castling-MViTv2 twins (as refimpl.models._netparts.
    run_stages): ``self.units`` run in order; stage s's feature map is the output of "stages.s.blocks.{depth - 1}"
    on ``self.grids[s]``, channels-first.  A subclass sets cfg, units and grids and defines run_unit, _block."""

    def run_unit_part(self, name: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("attn" or "mlp") of the block unit ``name`` on ``x``."""
        return self._block(name).part(part, x)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        feats, x = [], images
        for name in self.units:
            x = self.run_unit(name, x)
            parts = name.split(".")
            if len(parts) == 4 and int(parts[3]) == self.cfg.depths[int(parts[1])] - 1:
                feats.append(x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *self.grids[int(parts[1])]))
        return x, feats

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The reference's ``features``: the output tokens of each stage's last block as a channels-first map
        (B, C_s, H_s, W_s) on ``self.grids[s]``."""
        return self._run(images)[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W): ``self.units`` run in order."""
        return self._run(images)[0]


class CastlingLeViT(TokenStagesNet):
    """LeViT stem, three stages of Castling blocks with shrink blocks between them, BN + Linear heads."""

    def __init__(self, cfg: CastlingLeViTConfig):
        """LeViT's stem (four 3 x 3 stride-2 conv + BN, widths C0/8, C0/4, C0/2, C0), one stage per entry of embed_dims
        (a shrink block before each but the first, then its blocks), the BN + Linear head and, with distillation,
        ``head_dist``; the reference's unit names and stage grids."""
        super().__init__()
        self.cfg = cfg
        c0, eps = cfg.embed_dims[0], cfg.batch_norm_eps
        w = [cfg.in_chans, c0 // 8, c0 // 4, c0 // 2, c0]
        self.stem = nn.ModuleList(ConvBN(w[i], w[i + 1], eps) for i in range(4))
        self.stages = nn.ModuleList(Stage(cfg, s) for s in range(len(cfg.embed_dims)))
        self.head = BNLinear(cfg.embed_dims[-1], cfg.num_classes, eps)
        if cfg.distillation:
            self.head_dist = BNLinear(cfg.embed_dims[-1], cfg.num_classes, eps)
        self.units, self.grids = unit_names(cfg), stage_grids(cfg)

    def _block(self, name: str) -> Block:
        parts = name.split(".")
        st = self.stages[int(parts[1])]
        return st.downsample if parts[2] == "downsample" else st.blocks[int(parts[3])]

    def _stem(self, images: torch.Tensor) -> torch.Tensor:
        x = images
        for i, m in enumerate(self.stem):
            x = m(x)
            if i < 3:
                x = hardswish_t(x)
        return x.flatten(2).transpose(1, 2)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        x = x.mean(1)
        if self.cfg.distillation:
            return (self.head(x) + self.head_dist(x)) / 2
        return self.head(x)

    def run_unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Unit ``name`` ("stem", "stages.s.downsample", "stages.s.blocks.j", "head") on its input: the stem maps images
        to tokens (B, N, C0) with Hardswish between its convs; the head averages the tokens and, with distillation,
        averages the two heads' logits."""
        if name == "stem":
            return self._stem(x)
        if name == "head":
            return self._head(x)
        return self._block(name)(x)


def build(cfg: CastlingLeViTConfig) -> nn.Module:
    """The twin of a Castling-LeViT config."""
    if not isinstance(cfg, CastlingLeViTConfig):
        raise TypeError(f"argument 'cfg': expected CastlingLeViTConfig, got {type(cfg).__name__}")
    return CastlingLeViT(cfg)
