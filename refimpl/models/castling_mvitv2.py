"""Castling-MViTv2-T/S/B (You et al., CVPR 2023; figures of its Table 2), NumPy reference.

Shapes: B batch, C channels, (H, W) token grid, N = H W tokens (row-major), h heads, d = C / h head dim (96 in
every stage of T/S/B), N' the tokens after a stride-2 query pooling.  Unit values are tokens (B, N, C);
feature maps are channels-first (B, C, H, W).

No code was released for these networks.  The skeleton is MViTv2 (Li et al., CVPR 2022, "MViTv2" below: §3,
§4.1 and its Table of the T/S/B/L variants; the released facebookresearch/mvit ``mvit_model.py``,
``attention.py`` and ``configs/MVITv2_{T,S,B}.yaml``), with the attention changed as Castling-ViT describes.
Every choice, and where it comes from:

**MViTv2 skeleton (unchanged by Castling-ViT):**

* Patch embedding: a 7x7 stride-4 conv with bias, padding 3 (``PATCH_KERNEL/STRIDE/PADDING``; config.py
  MVITV2_PATCH_*): 224 -> 56 x 56 tokens, C0 = 96.  No class token and no absolute positional embedding
  (``CLS_EMBED_ON: False``, ``USE_ABS_POS: False`` in the classification configs); the head is mean pooling.
* Four stages, depths T (1, 2, 5, 2), S (1, 2, 11, 2), B (2, 3, 16, 3) (MViTv2's table of variants; configs
  ``DEPTH`` 10 / 16 / 24 with ``DIM_MUL`` / ``HEAD_MUL`` 2.0 at the stage starts), widths 96, 192, 384, 768 and
  heads 1, 2, 4, 8 (d = 96).
* Pre-norm blocks (LayerNorm eps 1e-6, config.MVITV2_LN_EPS): x_res + Attn(LN1 x), then x + MLP(LN2 x), MLP
  ratio 4 with GELU (erf), qkv with bias (``QKV_BIAS: True``), output projection with bias.
* Channel expansion in the attention (configs ``DIM_MUL_IN_ATT: True``; MViTv1 expanded in the previous
  block's MLP instead): the first block of stages 2-4 is the transition block; its qkv
  projection maps C_{s-1} -> 3 C_s, and its skip path is ``proj(LN1 x)`` (Linear C_{s-1} -> C_s with bias,
  applied to the *normalised* input, as the released ``MultiScaleBlock`` does) followed by the skip pooling.
  (The brief calls it the "last block of a stage"; in the released model the expanding block is the one whose
  query pooling halves the grid, i.e. block 1 of T's 10 blocks, the first block of stage 2 by resolution.)
* Query pooling in every block (``POOL_Q_STRIDE`` lists every layer, ``POOL_KVQ_KERNEL: [3, 3]``, ``MODE:
  conv``): a 3x3 depthwise conv (padding 1, no bias) with one filter per channel of a head, shared by the
  heads (``dim_conv = dim_out // num_heads``), stride 2 in the transition blocks and 1 elsewhere, followed by a
  LayerNorm over the head dim (``norm_q``).  The pooled query grid is ((H - 1) // 2 + 1, (W - 1) // 2 + 1).
* Skip pooling at stride-2 blocks: MaxPool2d(kernel 3 = stride + 1, stride 2, padding 1) (``pool_skip``);
  the identity elsewhere.
* The residual pooling connection (MViTv2 §3.2, ``RESIDUAL_POOLING: True``): the attention output per head
  is Attn(Q, K, V) + Q with the pooled (normalised by ``norm_q``) query, in every block.
* Head: LayerNorm (eps 1e-6), mean over tokens, Linear C3 -> classes (released ``head.projection``).

**What Castling-ViT changes (§3.1, Fig. 2, Table 1, §3.2 Eq. 8-10, appendix):**

* The softmax core is replaced by the linear-angular attention of Eq. 9 (:func:`refimpl.attention.angular.
  castling_core`): ½ Σ_j v_j + (1/π) Q̂ (K̂ᵀ V) + M_DW V; the masked softmax branch (Eq. 10) is a training
  device dropped at inference (§3.2.2).  Presets and options as Castling-DeiT / -LeViT (``preset``,
  ``attn_overrides``); M_DW is the released (k, 1) token conv with heads as channels, k = 9
  (config.CASTLING_CONV_KERNEL).  The 1/sqrt(d) softmax scale has no counterpart (Eq. 9 normalises q and k).
* **No key/value pooling.**  The appendix: "we remove token/feature pooling and adopt post-Q pooling and
  residual connections [34] in our attention blocks"; §3.1 names MViTv2's token pooling ("token bottlenecks,
  i.e. insufficient number of tokens") as what costs accuracy, and Table 1's "Token" pooling column is MViTv2's
  K/V pooling (``POOL_KV_STRIDE_ADAPTIVE: [4, 4]``: 14 x 14 keys in every stage-1 block).  With a linear core
  the full K, V cost O(N d^2), so nothing forces the pooling.  K and V are therefore the unpooled
  projections at the block's input grid (no ``pool_k/norm_k/pool_v/norm_v``).  The counts agree: with the
  K/V pooling kept, Castling-MViTv2-S has 34,758,289 parameters (34.8M); without it 34,724,497 (34.7M, as
  printed), and T 24,071,161 (24.1M, as printed) - docs/models_flatten_castling.md "Castling-MViTv2".
  It also makes M_DW V well defined: V lives on the input grid, whose stride-2 positions are the pooled
  queries' positions (with pooled K/V, V would sit on a 14 x 14 grid for 56 x 56 queries).
* The query pooling is kept (MViTv2's post-Q pooling, §3.1: "post-Q pooling (i.e., pooling after linear
  projection) together with residual connections in MViTv2 performs better than pre-Q pooling"), with its
  LayerNorm, at stride 1 and 2 as in MViTv2; the residual pooling connection is kept (Fig. 2, appendix
  "residual connections [34]"; ``q_residual="all"``, "none" an option).  The pooled query itself (before
  Eq. 9's normalisation q̂) is added, as MViTv2 adds its pooled q.
* **No relative positional embeddings.**  MViTv2's decomposed relative positions add q_i · R_h(h_i - h_j) +
  q_i · R_w(w_i - w_j) to the N' x M logit matrix before the softmax.  Eq. 9 has no logits: Sim(Q, K) is the
  angular kernel 1 - θ/π of the normalised q̂, k̂, whose linear form (1/π) Q̂ (K̂ᵀ V) never builds the N' x M
  matrix; an additive logit term would have to enter Sim, which would then be neither an angle nor linear
  (each query's positional row would need its own N-term sum, O(N N') again).  Castling-ViT's positional
  information is M_DW V (Eq. 9; §3.2: the DWConv "to help approximate the high-order residuals" and its
  locality), and §3.1 / Fig. 2 name positional "fixed attention biases" as a generalisation problem (LeViT).
  So ``rel_pos_h`` / ``rel_pos_w`` are removed (T: 81,408 parameters; keeping them unused would give
  24,152,569 = 24.2M against the printed 24.1M).
* In a transition block the core runs over all N keys of the input grid for the N' pooled queries; the token
  conv is taken at the pooled positions (a strided (k, 1) conv on the flattened grid).  The reference evaluates
  it with ``castling_core`` (N = M) on a full-size query matrix whose stride-2 rows hold the pooled queries,
  then keeps those rows (every term of the core is row-wise in Q), as Castling-LeViT's shrink blocks.

**Counts.**  Parameters 24,071,161 / 34,724,497 / 51,250,120 against the printed 24.1 / 34.7 / 51.9M (B: not
reconciled, :data:`COUNT_GAPS`); MACs 4.244 / 6.420 / 9.376G against 4.50 / 6.95 / 9.82G, 4.5-7.6% below
(recorded in tests/test_macs.py GAPS; docs/models_flatten_castling.md shows the arithmetic).  The same skeleton with MViTv2's softmax attention, K/V pooling and relative
positions gives 24,173,320 / 34,870,216 / 51,472,744 parameters and 4.677 / 6.960 / 10.102 GMACs (MViTv2:
24M / 35M / 52M, 4.7 / 7.0 / 10.2G; Castling's Table 2 baseline rows: 24.0 / 34.7 / 51.2M, 4.68 / 6.95 /
10.07G); tests/test_castling_mvitv2.py re-derives all of them in closed form.

**Resolutions**: any (H, W) (the patch embedding gives ((H - 1) // 4 + 1, ...), each stride-2 pooling
ceil(. / 2)); there is no positional table, so ``img_size`` only fixes the grids the units check.

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/castling_mvitv2.py), MViTv2's names with the
blocks grouped by stage: "patch_embed.proj.weight", "stages.1.blocks.0.norm1.weight",
"stages.1.blocks.0.attn.qkv.weight", "stages.1.blocks.0.attn.pool_q.weight", "stages.1.blocks.0.attn.norm_q.bias",
"stages.1.blocks.0.attn.dconv.weight", "stages.1.blocks.0.attn.proj.bias", "stages.1.blocks.0.proj.weight" (the
skip projection), "stages.1.blocks.0.mlp.fc1.weight", "norm.weight", "head.projection.weight".

References: Castling-ViT §3.1 (Fig. 2, Table 1), §3.2 (Eq. 8-10), §4.1-4.2 (Table 2), appendix ("we remove
token/feature pooling and adopt post-Q pooling and residual connections [34]"); MViTv2 (Li et al. 2022).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, validation
from ..attention.angular import CastlingConfig, castling_core
from . import _castling_pool as pq
from . import _netparts as nets
from . import common, counting
from .registry import register
from .common import Err

__all__ = ["CastlingMViTv2Config", "BlockSpec", "block_specs", "stage_grids", "param_shapes", "init_params",
           "forward", "features", "run", "unit_names", "unit_parts", "run_unit", "run_unit_part", "unit_bound",
           "unit_part_bound", "forward_bounds", "macs", "pooling_attention", "max_pool_tokens", "reduced",
           "PAPER_COUNT_OVERRIDES", "COUNT_GAPS", "PAPER_MACS_G"]

_PRESETS = ("paper", "official")
_RESIDUAL = ("all", "none")
_K = config.MVITV2_POOL_KERNEL


@dataclasses.dataclass(frozen=True)
class CastlingMViTv2Config:
    """Castling-MViTv2.  Every architectural choice is a field (sources in the module docstring).

    embed_dim (C0; C_s = C0 2^s), num_heads (h0; h_s = h0 2^s), depths (blocks per stage), mlp_ratio, qkv_bias,
    img_size (H, W), in_chans, num_classes, ln_eps, preset ("paper" | "official", the Castling attention's
    preset), conv_kernel (k of the (k, 1) token conv), q_residual ("all" | "none": the residual pooling
    connection Attn + Q), attn_overrides (extra :class:`refimpl.attention.angular.CastlingConfig` fields).
    """

    embed_dim: int = 96
    num_heads: int = 1
    depths: Any = (1, 2, 5, 2)
    mlp_ratio: int = 4
    qkv_bias: bool = True
    img_size: Any = config.NET_PAPER_RESOLUTION
    in_chans: int = 3
    num_classes: int = 1000
    ln_eps: float = config.MVITV2_LN_EPS
    preset: str = "paper"
    conv_kernel: int = config.CASTLING_CONV_KERNEL
    q_residual: str = "all"
    attn_overrides: Any = ()

    def __post_init__(self) -> None:
        """Stores img_size as (H, W), attn_overrides as sorted pairs and depths as an int tuple; raises
        ValueError / TypeError for empty depths, a size, count or ratio that is not a positive integer, a non-bool
        qkv_bias, a bad ln_eps, an unknown preset or q_residual, C0 not divisible by h0, overrides of dim or num_heads,
        and a stage's attention config that its preset refuses."""
        object.__setattr__(self, "img_size", common.normalize_img_size(self.img_size))
        object.__setattr__(self, "attn_overrides", common.normalize_overrides(self.attn_overrides))
        if not isinstance(self.depths, (tuple, list)) or not self.depths:
            raise TypeError(f"argument 'depths': expected a non-empty tuple of positive ints, got {self.depths!r}")
        object.__setattr__(self, "depths", tuple(numerics.check_positive_int(v, f"depths[{i}]")
                                                 for i, v in enumerate(self.depths)))
        for name in ("embed_dim", "num_heads", "mlp_ratio", "in_chans", "num_classes", "conv_kernel"):
            numerics.check_positive_int(getattr(self, name), name)
        if not isinstance(self.qkv_bias, bool):
            raise TypeError(f"argument 'qkv_bias': expected a bool, got {self.qkv_bias!r}")
        validation.check_eps(self.ln_eps, "ln_eps")
        if self.preset not in _PRESETS:
            raise ValueError(f"argument 'preset': expected one of {_PRESETS}, got {self.preset!r}")
        if self.q_residual not in _RESIDUAL:
            raise ValueError(f"argument 'q_residual': expected one of {_RESIDUAL}, got {self.q_residual!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"argument 'embed_dim': {self.embed_dim} is not divisible by num_heads={self.num_heads}")
        fixed = {"dim", "num_heads"} & set(dict(self.attn_overrides))
        if fixed:
            raise ValueError(f"argument 'attn_overrides': {sorted(fixed)} follow from embed_dim and num_heads; "
                             f"they cannot be overridden")
        for s in range(len(self.depths)):
            self.attention_config(s)          # validates the overrides

    def dim(self, stage: int) -> int:
        """C_s = C0 2^s, the channels of ``stage``."""
        return self.embed_dim * 2 ** stage

    def heads(self, stage: int) -> int:
        """h_s = h0 2^s, the heads of ``stage``."""
        return self.num_heads * 2 ** stage

    @property
    def head_dim(self) -> int:
        """d = C0 / h0, the head dimension of every stage (C_s and h_s both double)."""
        return self.embed_dim // self.num_heads

    def attention_config(self, stage: int) -> CastlingConfig:
        """The Castling core of a block of ``stage``: dim = C_s, heads h_s."""
        return CastlingConfig.preset(self.preset, dim=self.dim(stage), num_heads=self.heads(stage),
                                     **{"conv_kernel": self.conv_kernel, **dict(self.attn_overrides)})


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, CastlingMViTv2Config):
        raise TypeError(f"argument 'cfg': expected CastlingMViTv2Config, got {type(cfg).__name__}")


def _half(hw: tuple[int, int]) -> tuple[int, int]:
    return (hw[0] - 1) // 2 + 1, (hw[1] - 1) // 2 + 1


def stage_grids(cfg: CastlingMViTv2Config) -> list[tuple[int, int]]:
    """The token grid of every stage: the patch embedding's (H + 2 3 - 7) // 4 + 1, then each stride-2 query
    pooling (3x3 conv, padding 1) and skip max pooling give (. - 1) // 2 + 1."""
    _check_cfg(cfg)
    k, s, p = config.MVITV2_PATCH_KERNEL, config.MVITV2_PATCH_STRIDE, config.MVITV2_PATCH_PADDING
    hw = tuple((n + 2 * p - k) // s + 1 for n in cfg.img_size)
    if min(hw) < 1:
        raise ValueError(f"argument 'img_size': {cfg.img_size} is smaller than the patch embedding's kernel")
    out = [hw]
    for _ in range(len(cfg.depths) - 1):
        out.append(_half(out[-1]))
    return out


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """One block: its unit name, stage, input and output widths, heads, input and output grids, query stride."""

    name: str
    stage: int
    dim_in: int
    dim_out: int
    heads: int
    hw_in: tuple[int, int]
    hw_out: tuple[int, int]
    stride: int


def block_specs(cfg: CastlingMViTv2Config) -> list[BlockSpec]:
    """Every block in execution order; the first block of stages 2.. is the transition block (channel expansion
    in the attention, query and skip pooling of stride 2)."""
    grids = stage_grids(cfg)
    out = []
    for s, depth in enumerate(cfg.depths):
        for j in range(depth):
            trans = s > 0 and j == 0
            out.append(BlockSpec(f"stages.{s}.blocks.{j}", s, cfg.dim(s - 1) if trans else cfg.dim(s), cfg.dim(s),
                                 cfg.heads(s), grids[s - 1] if trans else grids[s], grids[s], 2 if trans else 1))
    return out


def _spec(cfg: CastlingMViTv2Config, name: str) -> BlockSpec:
    for b in block_specs(cfg):
        if b.name == name:
            return b
    raise ValueError(f"argument 'name': unknown unit {name!r}; units: {unit_names(cfg)}")


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def param_shapes(cfg: CastlingMViTv2Config) -> dict[str, tuple[int, ...]]:
    """Every state_dict key and shape, from the config alone."""
    _check_cfg(cfg)
    k = config.MVITV2_PATCH_KERNEL
    s: dict[str, tuple[int, ...]] = {"patch_embed.proj.weight": (cfg.embed_dim, cfg.in_chans, k, k),
                                     "patch_embed.proj.bias": (cfg.embed_dim,)}
    d = cfg.head_dim
    for b in block_specs(cfg):
        p, ci, co = b.name, b.dim_in, b.dim_out
        s.update(common.ln_shapes(f"{p}.norm1", ci))
        s[f"{p}.attn.qkv.weight"] = (3 * co, ci)
        if cfg.qkv_bias:
            s[f"{p}.attn.qkv.bias"] = (3 * co,)
        s[f"{p}.attn.pool_q.weight"] = (d, 1, _K, _K)
        s.update(common.ln_shapes(f"{p}.attn.norm_q", d))
        s.update({f"{p}.attn.{kk}": tuple(v) for kk, v in cfg.attention_config(b.stage).param_shapes().items()
                  if kk.startswith("dconv.")})
        s.update({f"{p}.attn.proj.weight": (co, co), f"{p}.attn.proj.bias": (co,)})
        if ci != co:
            s.update({f"{p}.proj.weight": (co, ci), f"{p}.proj.bias": (co,)})
        s.update(common.ln_shapes(f"{p}.norm2", co))
        s.update(common.mlp_shapes(f"{p}.mlp", co, cfg.mlp_ratio * co))
    c = cfg.dim(len(cfg.depths) - 1)
    s.update(common.ln_shapes("norm", c))
    s.update({"head.projection.weight": (cfg.num_classes, c), "head.projection.bias": (cfg.num_classes,)})
    return s


def init_params(cfg: CastlingMViTv2Config, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Fresh random parameters keyed like the twin's state_dict (common.init_from_shapes).  For tests, docs,
    benchmarks; not the paper's training initialisation."""
    return common.init_from_shapes(param_shapes(cfg), np.random.default_rng(rng))


def _check_params(params: Any, cfg: CastlingMViTv2Config) -> Mapping[str, Any]:
    return common.check_network_params(params, cfg, param_shapes, "Castling-MViTv2 network")


# ===================================================================================================
# Layers
# ===================================================================================================

def _heads(t: np.ndarray, h: int) -> list[np.ndarray]:
    """(B, N, 3 C) laid out [q | k | v], each [head 0 | head 1 | ...] (MViTv2's ``reshape(B, N, 3, h, -1)``)
    -> q, k, v (B, h, N, d)."""
    b, n, f = t.shape
    a = t.reshape(b, n, 3, h, f // (3 * h)).transpose(2, 0, 3, 1, 4)
    return [a[0], a[1], a[2]]


def max_pool_tokens(x: Any, hw: tuple[int, int]) -> np.ndarray:
    """MViTv2's skip pooling: MaxPool2d(3, stride 2, padding 1) (padding never wins: -inf) on tokens
    (B, N, C) of the grid hw -> (B, N', C).  Exact (no rounding); NaN propagates as in torch."""
    x = numerics.as_float(x, "x")
    b, n, c = x.shape
    ho, wo = _half(hw)
    g = np.pad(x.reshape(b, hw[0], hw[1], c), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    out = np.full((b, ho, wo, c), -np.inf)
    for du in range(_K):
        for dw in range(_K):
            out = np.maximum(out, g[:, du:du + 2 * ho - 1:2, dw:dw + 2 * wo - 1:2, :])
    return out.reshape(b, ho * wo, c)


def pooling_attention(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingMViTv2Config) -> np.ndarray:
    """The attention of block ``name`` on its normalised input LN1(x): (B, N, C_in) -> (B, N', C_out).

    q, k, v = qkv(x) ([q | k | v], heads within each); q = LN_q(Pool_q(q)) (3x3 depthwise conv shared by the
    heads, stride 1 or 2); H = Eq. 9 for the pooled queries against the unpooled k, v (+ q, the residual
    pooling connection); proj(merge(H)).

    At stride 2 the pooled-query core is :func:`refimpl.models._castling_pool.pooled_core` (castling_core on a
    full-size query matrix, its stride-2 rows kept: exact, every term of the core is row-wise in Q).

    References: Castling-ViT Eq. 9, §3.1, appendix; MViTv2 §3.1-3.2 (pooling attention, residual pooling).
    """
    _check_cfg(cfg)
    params = _check_params(params, cfg)
    b = _spec(cfg, name)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": b.hw_in[0] * b.hw_in[1], "C": b.dim_in})
    p = layers.subparams(params, name)
    q, k, v = _heads(common.linear2d(x, p["attn.qkv.weight"], p.get("attn.qkv.bias")), b.heads)
    qp = pq.pool_q(q, p, b.hw_in, b.stride, cfg.ln_eps)
    acfg = cfg.attention_config(b.stage)
    if b.stride == 1:
        out = castling_core(qp, k, v, acfg, hw=b.hw_in, **pq.core_args(p))
    else:
        out = pq.pooled_core(q, qp, k, v, acfg, p, b.hw_in)
    if cfg.q_residual == "all":
        out = out + qp
    return common.linear2d(pq.merge_heads(out), p["attn.proj.weight"], p["attn.proj.bias"])


# ===================================================================================================
# Units ("patch_embed", "stages.s.blocks.j", "head"; values: tokens (B, N, C))
# ===================================================================================================

def unit_names(cfg: CastlingMViTv2Config) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    return ["patch_embed"] + [b.name for b in block_specs(cfg)] + ["head"]


def unit_parts(cfg: CastlingMViTv2Config, name: str) -> tuple[str, ...]:
    """A block is "attn" (pool_skip(x or proj(LN1 x)) + Attn(LN1 x)) then "mlp" (x + MLP(LN2 x)); the patch
    embedding and the head have no parts."""
    nets.check_unit(_M, name, cfg)
    return ("attn", "mlp") if name.startswith("stages.") else ()


def _tokens_in(x: Any, hw: tuple[int, int], c: int) -> np.ndarray:
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": hw[0] * hw[1], "C": c})
    return x


def _unit_input(name: str, x: Any, cfg: CastlingMViTv2Config, part: str | None = None) -> np.ndarray:
    """The input of unit ``name`` (or of its ``part``): images (B, in_chans, H, W), (H, W) = cfg.img_size, for
    "patch_embed"; the last stage's tokens for "head"; a block's input tokens (B, N, C_in) for the block and
    its "attn" part, its output tokens (B, N', C_s) for its "mlp" part (a transition block's reduced grid)."""
    if name == "patch_embed":
        return common.check_images(x, cfg.in_chans, cfg.img_size)
    if name == "head":
        s = len(cfg.depths) - 1
        return _tokens_in(x, stage_grids(cfg)[s], cfg.dim(s))
    b = _spec(cfg, name)
    return _tokens_in(x, b.hw_out, b.dim_out) if part == "mlp" else _tokens_in(x, b.hw_in, b.dim_in)


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: CastlingMViTv2Config) -> np.ndarray:
    b = _spec(cfg, name)
    p = layers.subparams(params, b.name)
    if part == "mlp":
        return x + common.mlp2d(layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], cfg.ln_eps),
                                layers.subparams(p, "mlp"))
    xn = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], cfg.ln_eps)
    att = pooling_attention(params, b.name, xn, cfg)
    skip = common.linear2d(xn, p["proj.weight"], p["proj.bias"]) if b.dim_in != b.dim_out else x
    if b.stride == 2:
        skip = max_pool_tokens(skip, b.hw_in)
    return skip + att


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingMViTv2Config) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order.  The "mlp" part of
    a transition block takes the (B, N', C_s) output of its "attn" part."""
    return nets.run_part(_M, params, name, part, x, cfg)


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingMViTv2Config) -> np.ndarray:
    """One unit: "patch_embed" (images (B, in_chans, H, W) -> tokens (B, N0, C0)), "stages.s.blocks.j" (tokens
    -> tokens, N -> N' and C_{s-1} -> C_s in a transition block) or "head" (tokens -> logits: LayerNorm, mean,
    Linear).

    References: MViTv2 (patch embedding, blocks, head); Castling-ViT Eq. 9 in every attention (inference).
    """
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    if name == "patch_embed":
        y = layers.conv2d(x, params["patch_embed.proj.weight"], params["patch_embed.proj.bias"],
                          stride=config.MVITV2_PATCH_STRIDE, padding=config.MVITV2_PATCH_PADDING)
        return nets.grid_to_tokens(y)
    if name == "head":
        y = np.mean(layers.layer_norm(x, params["norm.weight"], params["norm.bias"], cfg.ln_eps), axis=1)
        return layers.linear(y, params["head.projection.weight"], params["head.projection.bias"])
    return _part(params, name, "mlp", _part(params, name, "attn", x, cfg), cfg)


def run(params: Mapping[str, Any], images: Any, cfg: CastlingMViTv2Config, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and the four stages' feature maps in one pass; taps (dict or None) records every unit's output."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: CastlingMViTv2Config) -> np.ndarray:
    """Class logits of Castling-MViTv2 (inference: the auxiliary branch dropped).

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`).
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`CastlingMViTv2Config`.

    Returns
    -------
    ndarray (B, num_classes), working precision.

    References: Castling-ViT §3.1-3.2, Table 2; MViTv2.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: CastlingMViTv2Config) -> list[np.ndarray]:
    """The output of each stage's last block on its grid, channels-first (B, C_s, H_s, W_s)."""
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (running first-order analysis, models/common.py convention)
# ===================================================================================================

def _e_heads(t: Err, h: int) -> list[Err]:
    return [Err(v, e, t.depth) for v, e in zip(_heads(t.value, h), _heads(t.err, h))]


def _e_max_pool(t: Err, hw: tuple[int, int]) -> Err:
    """Max pooling is exact and |max(a + e) - max(a)| <= max |e|: E = the window maximum of E."""
    return Err(max_pool_tokens(t.value, hw), max_pool_tokens(t.err, hw), t.depth)


def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: CastlingMViTv2Config, dtype: Any
            ) -> Err:
    b = _spec(cfg, name)
    p = layers.subparams(params, b.name)
    if part == "mlp":
        h = common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], cfg.ln_eps, cap=dtype)
        return common.e_add(t, common.e_mlp(h, layers.subparams(p, "mlp")))
    xn = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], cfg.ln_eps, cap=dtype)
    q, k, v = _e_heads(common.e_linear(xn, p["attn.qkv.weight"], p.get("attn.qkv.bias")), b.heads)
    qp = pq.e_pool_q(q, p, b.hw_in, b.stride, cfg.ln_eps, dtype)
    acfg = cfg.attention_config(b.stage)
    if b.stride == 1:
        core = pq.e_core(qp, k, v, acfg, p, b.hw_in, dtype)
    else:
        core = pq.e_pooled_core(q, qp, k, v, acfg, p, b.hw_in, dtype)
    if cfg.q_residual == "all":
        core = common.e_add(core, qp)
    att = common.e_linear(Err(pq.merge_heads(core.value), pq.merge_heads(core.err), core.depth), p["attn.proj.weight"],
                          p["attn.proj.bias"])
    skip = common.e_linear(xn, p["proj.weight"], p["proj.bias"]) if b.dim_in != b.dim_out else t
    if b.stride == 2:
        skip = _e_max_pool(skip, b.hw_in)
    return common.e_add(skip, att)


def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: CastlingMViTv2Config, dtype: Any) -> Err:
    if name == "patch_embed":
        images = common.check_images(t.value, cfg.in_chans, cfg.img_size)
        y = common.e_conv2d(Err(images, t.err, t.depth), params["patch_embed.proj.weight"],
                            params["patch_embed.proj.bias"], stride=config.MVITV2_PATCH_STRIDE,
                            padding=config.MVITV2_PATCH_PADDING)
        return nets.e_tokens(y)
    if name == "head":
        y = common.e_layer_norm(t, params["norm.weight"], params["norm.bias"], cfg.ln_eps, cap=dtype)
        return common.e_linear(common.e_mean(y, 1), params["head.projection.weight"], params["head.projection.bias"])
    return _e_part(params, name, "mlp", _e_part(params, name, "attn", t, cfg, dtype), cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingMViTv2Config, *,
               dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingMViTv2Config, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: CastlingMViTv2Config, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` from exact images and params
    (rigorous to first order, void through depth; the equivalence suite's conclusive check is unit-wise)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate counts
# ===================================================================================================

def macs(cfg: CastlingMViTv2Config, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention; LayerNorm, GELU, max
    pooling and additions are not MACs).  Patch embedding: the 7x7 stride-4 conv.  Block: qkv at the N input
    tokens (N C_in 3 C_out), the query pooling conv at the N' pooled positions (N' C_out 9), the core K^^T V over
    the N keys and Q^ (K^^T V) over the N' queries (h d^2 (N + N')), the (k, 1) token conv at the N' positions
    (h N' d k), proj (N' C_out^2), the skip projection of a transition block at the N input tokens
    (N C_in C_out, before the max pooling, as MViTv2 applies it), the MLP (N' 8 C_out^2).  Head: the linear
    classifier.  The auxiliary branch only if the config keeps it at inference."""
    _check_cfg(cfg)
    common.check_image_hw(cfg.img_size, image_hw)
    g0 = stage_grids(cfg)[0]
    k = config.MVITV2_PATCH_KERNEL
    out = {"patch_embed": counting.conv2d_macs(g0, cfg.in_chans, cfg.embed_dim, (k, k))}
    for b in block_specs(cfg):
        n_in, n_q = b.hw_in[0] * b.hw_in[1], b.hw_out[0] * b.hw_out[1]
        acfg = cfg.attention_config(b.stage)
        out[f"{b.name}.attn.qkv"] = counting.linear_macs(n_in, b.dim_in, 3 * b.dim_out)
        out[f"{b.name}.attn.pool_q"] = b.heads * counting.depthwise_conv2d_macs(b.hw_out, acfg.head_dim, (_K, _K))
        out.update({f"{b.name}.attn.{kk}": v for kk, v in pq.core_macs(acfg, n_q, n_in, acfg.sparse_active(False)).items()})
        out[f"{b.name}.attn.proj"] = counting.linear_macs(n_q, b.dim_out, b.dim_out)
        if b.dim_in != b.dim_out:
            out[f"{b.name}.proj"] = counting.linear_macs(n_in, b.dim_in, b.dim_out)
        out[f"{b.name}.mlp"] = counting.mlp_macs(n_q, b.dim_out, cfg.mlp_ratio * b.dim_out)
    out["head"] = counting.linear_macs(1, cfg.dim(len(cfg.depths) - 1), cfg.num_classes)
    return out


# ===================================================================================================
# Reduced configuration, paper figures, registration
# ===================================================================================================

def reduced(cfg: CastlingMViTv2Config) -> CastlingMViTv2Config:
    """A small configuration on the same code path (preset, residual and attention options kept): C0 8 with one
    head (d 8; widths 8, 16, 32, 64 and heads 1, 2, 4, 8), depths (1, 2, 1, 1) (every transition block, and a
    stride-1 block after one), a non-square 36 x 52 image (grids 9 x 13 -> 5 x 7 -> 3 x 4 -> 2 x 2: odd sizes,
    ceiling pooling), 10 classes."""
    _check_cfg(cfg)
    return dataclasses.replace(cfg, embed_dim=8, num_heads=1, depths=(1, 2, 1, 1), img_size=(36, 52),
                               num_classes=10)


#: Both presets have the same parameters; the registered config is the paper's setting.
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {}

#: Castling-ViT Table 2: MACs (G), printed with 2 decimals.
PAPER_MACS_G = {"castling_mvitv2_t": 4.50, "castling_mvitv2_s": 6.95, "castling_mvitv2_b": 9.82}

_SPECS = {  # name -> (depths, paper params M); MViTv2 Table (T/S/B), C0 96, one head in stage 1
    "castling_mvitv2_t": ((1, 2, 5, 2), 24.1),
    "castling_mvitv2_s": ((1, 2, 11, 2), 34.7),
    "castling_mvitv2_b": ((2, 3, 16, 3), 51.9),
}


def _gaps() -> dict[str, counting.CountGap]:
    """Castling-MViTv2-B: 51,250,120 (51.3M) against the printed 51.9M (T and S round to the paper's)."""
    cfg = CastlingMViTv2Config(depths=_SPECS["castling_mvitv2_b"][0])
    ours = sum(int(np.prod(v)) for v in param_shapes(cfg).values())
    base = 51_472_744
    rel = 2 * 96 * (2 * 111 + 4 * 55 + 16 * 27 + 2 * 13)
    kvpool = 24 * 2 * (96 * 9 + 2 * 96)
    conv = 9 * (2 * 1 + 3 * 2 + 16 * 4 + 3 * 8)
    derived = base - rel - kvpool + conv
    arith = (f"MViTv2-B {base:,} (the skeleton with softmax, K/V pooling and relative positions) - relative "
             f"positions 2 x 96 x (2 x 111 + 4 x 55 + 16 x 27 + 2 x 13) = {rel:,} - K/V pooling convs and "
             f"LayerNorms 24 x 2 (96 x 9 + 2 x 96) = {kvpool:,} + token convs 9 x (2 x 1 + 3 x 2 + 16 x 4 + "
             f"3 x 8) = {conv:,} = {derived:,}")
    reason = (f"Castling-ViT prints 51.9M (Table 2) for Castling-MViTv2-B and 51.2M for MViTv2-B; our reading "
              f"(MViTv2-B with linear-angular attention, no K/V pooling, no relative positions, the 9-tap token "
              f"conv) gives {ours:,}, below MViTv2-B's 51,472,744 (51.5M; MViTv2 prints 52M) as for T and S, "
              f"where it reproduces 24.1M and 34.7M.  +0.7M over the paper's own B baseline would need a "
              f"component the paper does not describe (a 9 x 9 depthwise conv over every channel of the 24 "
              f"blocks adds 0.74M; docs/models_flatten_castling.md, 'Castling-MViTv2').")
    return {"castling_mvitv2_b": counting.CountGap(derived=derived, arithmetic=arith, reason=reason)}


COUNT_GAPS: dict[str, counting.CountGap] = _gaps()

_M = sys.modules[__name__]
for _name, _spec_ in _SPECS.items():
    register(_name, CastlingMViTv2Config(depths=_spec_[0]), _M, paper_params_m=_spec_[1],
             paper_source="Castling-ViT Table 2", paper_precision=1)
