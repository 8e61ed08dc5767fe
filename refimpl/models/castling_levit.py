"""Castling-LeViT-128/192/256/384 (You et al., CVPR 2023; figures of its Table 2), NumPy reference.

Shapes: B batch, C channels, (H, W) token grid of a stage, N = H W tokens (row-major), h heads, d_v value dim
per head, N' tokens after a shrink (subsample) block.  Unit values are tokens (B, N, C); feature maps are
channels-first (B, C, H, W).

No code was released for these networks.  The architecture is LeViT (Graham et al., ICCV 2021; "LeViT paper"
below) with its attention changed as Castling-ViT describes it.  Every choice, and where it comes from:

**LeViT skeleton (LeViT paper §4: its architecture figure and its table of the LeViT-128S ... 384 variants;
unchanged by Castling-ViT):**

* Stem: four 3x3 stride-2 convolutions (padding 1, no bias) each followed by BatchNorm, with Hardswish between
  them (not after the last): 3 -> C0/8 -> C0/4 -> C0/2 -> C0, 224 -> 14 x 14 tokens.
* Three stages of widths C = (C0, C1, C2), each ``depth`` residual pairs x + Attn(x), x + MLP(x).
* Every linear layer is a bias-free Linear followed by BatchNorm over the features ("Linear_BN"; BN eps
  1e-5, inference statistics).  MLP: Linear_BN(C, 2C), Hardswish, Linear_BN(2C, C) (MLP ratio 2).
* Attention: key dim D = 16 (LeViT-128) or 32 (LeViT-192/256/384), value dim d_v = attn_ratio D = 2D per head,
  heads (4, 8, 12) / (3, 5, 6) / (4, 6, 8) / (6, 9, 12); projection Linear_BN(C, h (2 d_qk + d_v)) laid out per
  head as [q | k | v] (LeViT's ``view(B, N, h, -1).split``); output: Hardswish, then Linear_BN(h d_v, C).
* Between stages a shrink attention block without a residual connection (C_i -> C_{i+1}, stride 2, queries
  on the subsampled grid ``[::2, ::2]``, N' = ceil(H/2) ceil(W/2)) with C_i / D heads and value dim 4D
  (attn_ratio 4), followed by a residual MLP (ratio 2) at width C_{i+1}.
* Head: mean over tokens, BatchNorm1d + Linear (classifier) and a second BatchNorm1d + Linear (distillation
  head, DeiT-style); at inference the two logits are averaged.  Castling-ViT trains with distillation (§4.1:
  "we use the distillation [54]"), so the distillation head is kept (``distillation=True``).
* Hardswish is x min(max(x + 3, 0), 6) / 6 (torch.nn.Hardswish).

With the LeViT attention (softmax, key dim D, attention biases, pre-Q subsampling) this skeleton has
9,213,936 / 10,947,069 / 18,893,876 / 39,128,836 parameters: LeViT's 9.2 / 10.9 (LeViT paper: 11.0) / 18.9 /
39.1M as Castling-ViT Table 2 prints them (tests/test_castling_levit.py re-derives these counts).

**What Castling-ViT changes (paper §3.1, Fig. 2, Table 1, §3.2, appendix "Why more parameters ..."):**

* The attention core is Castling-ViT's linear-angular attention (Eq. 9, :func:`refimpl.attention.angular.
  castling_core`): ½ Σ_j v_j + (1/π) Q̂ (K̂ᵀ V) + M_DW V; the auxiliary masked softmax branch (Eq. 10) is a
  training device dropped at inference (§3.2.2).  Presets and options as Castling-DeiT (``preset``,
  ``attn_overrides``); the DWConv is the released (k, 1) token conv with heads as channels, k = 9.
* No attention biases.  Fig. 2 / §3.1 name LeViT's "fixed attention biases" as one of the two reasons it
  does not generalise, and Eq. 9 has no N x N logit matrix to add them to (a bias over token offsets would make
  the attention quadratic again).  This removes h N weights per attention (LeViT-128: 7,824 in all).
* No "feature pooling": LeViT shrinks Q and K to the key dim D ("feature bottlenecks, i.e. insufficient
  feature dimensions", §3.1; Table 1's "Feat." pooling, which the chosen design drops: "we remove token/feature
  pooling", appendix).  Q and K get the value dim d_v per head: "Castling-LeViT uses merely post-Q pooling,
  causing slightly higher hidden dimensions for Q/K than LeViT" (appendix).  ``d_qk = d_v`` in every
  attention (2D in the stage blocks, 4D in the shrink blocks).
* Post-Q pooling in the shrink blocks: "pooling after linear projection" (§3.1, Table 1): Q = Pool(x W_Q)
  instead of LeViT's Q = Pool(x) W_Q, "post-Q pooling ... in MViTv2" (§3.1).  The paper does not name the
  pooling operator; it attributes post-Q pooling to MViTv2 [34], whose query pooling is a 3x3 depthwise conv of
  stride 2 (padding 1, no bias, one filter per channel of a head shared by the heads) followed by LayerNorm over
  the head dim (eps 1e-6): ``q_pool="conv"`` (default; keys ``attn.pool_q.weight`` (d_v, 1, 3, 3),
  ``attn.norm_q.{weight,bias}``).  ``q_pool="subsample"`` applies LeViT's stride-2 selection after the
  projection instead; a per-token projection commutes with a selection, so that option computes exactly
  LeViT's pre-Q values and differs from pre-Q pooling only in cost.  The pooled queries sit at the stride-2
  positions of the grid; the DWConv branch M_DW V is taken at those positions (a strided depthwise conv), the
  constant and K^^T V run over all N keys.
* Softmax's 1/sqrt(D) scale has no counterpart: Eq. 9 normalises q and k.
* Residual connections "[34]" (MViTv2's residual pooling connection): the attention output per head is
  Attn(Q, K, V) + Q, with the (pooled) query (§3.1: "post-Q pooling together with residual connections in
  MViTv2"; appendix: "adopt post-Q pooling and residual connections [34] in our attention blocks").  It needs
  d_qk = d_v, which is the "higher hidden dims for Q/K" above.  MViTv2's attention adds it in every layer (its ``residual_pooling``
  option), and the appendix says "in our attention blocks": ``q_residual="all"`` (default); "downsample" (shrink blocks only)
  and "none" are options (no parameter or MAC changes either way).  The pooled query itself (before Eq. 9's
  normalisation q^) is added, as MViTv2 adds its pooled q.

**Counts.**  Parameters 10,628,376 / 12,782,887 / 22,085,932 / 45,733,448 against the printed 10.5 / 12.7 /
22.0 / 45.8M; MACs 0.468 / 0.797 / 1.369 / 2.856G against 0.49 / 0.82 / 1.40 / 2.90G.  None rounds to the
paper's figure; :data:`COUNT_GAPS` and docs/models_flatten_castling.md ("Castling-LeViT") give the arithmetic
and show that no variant of the paper's description reproduces all eight figures.

**Resolutions**: any (H, W) (the stem halves with ceiling four times); there is no positional table, so the
config's ``img_size`` only fixes the token grids the stages are built for.

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/castling_levit.py): "stem.0.c.weight",
"stem.0.bn.running_var", "stages.0.blocks.1.attn.qkv.c.weight", "stages.0.blocks.1.attn.dconv.weight",
"stages.0.blocks.1.mlp.fc1.bn.bias", "stages.1.downsample.attn.kv.c.weight", "stages.1.downsample.attn.q.c.weight",
"head.bn.weight", "head.l.weight", "head_dist.l.bias".

References: Castling-ViT §3.1 (Fig. 2, Table 1), §3.2 (Eq. 8-10), §4.1-4.2 (Table 2), appendix ("Why More
Parameters Than Others in Low MACs?", Table 11); LeViT (Graham et al. 2021); MViTv2 (Li et al. 2022) for the
residual pooling connection.
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

__all__ = ["CastlingLeViTConfig", "param_shapes", "init_params", "forward", "features", "run", "unit_names",
           "unit_parts", "run_unit", "run_unit_part", "unit_bound", "unit_part_bound", "forward_bounds", "macs",
           "elementwise",
           "hardswish", "stage_attention", "downsample_attention", "reduced", "stage_grids", "HARDSWISH_LIPSCHITZ",
           "PAPER_COUNT_OVERRIDES", "COUNT_GAPS", "PAPER_MACS_G"]

_PRESETS = ("paper", "official")
_RESIDUAL = ("all", "downsample", "none")
_Q_POOL = ("conv", "subsample")

#: sup |d/dx hardswish(x)| (config.py; tests/test_castling_levit.py checks it numerically).
HARDSWISH_LIPSCHITZ = config.HARDSWISH_LIPSCHITZ
#: Roundings of torch's hardswish x * min(max(x + 3, 0), 6) / 6 relative to |y|: the sum, the product, the
#: division (or the product with a rounded 1/6, one more): 4.
_HARDSWISH_ROUNDINGS = 4


def _ints(value: Any, name: str, n: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not value:
        raise TypeError(f"argument '{name}': expected a non-empty tuple of positive ints, got {value!r}")
    out = tuple(numerics.check_positive_int(v, f"{name}[{i}]") for i, v in enumerate(value))
    if n is not None and len(out) != n:
        raise ValueError(f"argument '{name}': expected {n} entries (one per stage), got {len(out)}")
    return out


@dataclasses.dataclass(frozen=True)
class CastlingLeViTConfig:
    """Castling-LeViT.  Every architectural choice is a field (sources in the module docstring).

    embed_dims (C per stage), key_dim D, num_heads (per stage), depths (residual attention + MLP pairs per
    stage); attn_ratio (d_v = attn_ratio D in the stage blocks), mlp_ratio; down_attn_ratio (d_v = 4D in the
    shrink blocks, which have C_i / D heads), down_mlp_ratio; img_size (H, W); in_chans; num_classes;
    distillation (the second head, averaged at inference); batch_norm_eps; preset ("paper" | "official", the
    Castling attention's preset); conv_kernel (k of the (k, 1) token conv); q_residual ("all" | "downsample" |
    "none": where the residual pooling connection Attn + Q is added); q_pool ("conv": MViTv2's 3x3 stride-2
    depthwise conv + LayerNorm(q_pool_ln_eps) on the projected queries | "subsample": LeViT's stride-2
    selection after the projection); attn_overrides (extra
    :class:`refimpl.attention.angular.CastlingConfig` fields, as Castling-DeiT).
    """

    embed_dims: Any = (128, 256, 384)
    key_dim: int = 16
    num_heads: Any = (4, 8, 12)
    depths: Any = (4, 4, 4)
    attn_ratio: int = 2
    mlp_ratio: int = 2
    down_attn_ratio: int = 4
    down_mlp_ratio: int = 2
    img_size: Any = config.NET_PAPER_RESOLUTION
    in_chans: int = 3
    num_classes: int = 1000
    distillation: bool = True
    batch_norm_eps: float = config.BATCH_NORM_EPS
    preset: str = "paper"
    conv_kernel: int = config.CASTLING_CONV_KERNEL
    q_residual: str = "all"
    q_pool: str = "conv"
    q_pool_ln_eps: float = config.DEIT_LN_EPS     # 1e-6: MViTv2's norm_layer, LayerNorm(eps=1e-6)
    attn_overrides: Any = ()

    def __post_init__(self) -> None:
        """Stores img_size as (H, W), attn_overrides as sorted pairs and embed_dims, num_heads, depths as int tuples of
        one entry per stage; raises ValueError / TypeError for a count or ratio that is not a positive integer, a
        non-bool distillation, a bad eps, an unknown preset, q_residual or q_pool, C0 not divisible by 8, a stage width
        (but the last) not divisible by key_dim, overrides of dim or num_heads, and a block's attention config that its
        preset refuses."""
        object.__setattr__(self, "img_size", common.normalize_img_size(self.img_size))
        object.__setattr__(self, "attn_overrides", common.normalize_overrides(self.attn_overrides))
        dims = _ints(self.embed_dims, "embed_dims")
        object.__setattr__(self, "embed_dims", dims)
        object.__setattr__(self, "num_heads", _ints(self.num_heads, "num_heads", len(dims)))
        object.__setattr__(self, "depths", _ints(self.depths, "depths", len(dims)))
        for name in ("key_dim", "attn_ratio", "mlp_ratio", "down_attn_ratio", "down_mlp_ratio", "in_chans",
                     "num_classes", "conv_kernel"):
            numerics.check_positive_int(getattr(self, name), name)
        if not isinstance(self.distillation, bool):
            raise TypeError(f"argument 'distillation': expected a bool, got {self.distillation!r}")
        validation.check_eps(self.batch_norm_eps, "batch_norm_eps")
        if self.preset not in _PRESETS:
            raise ValueError(f"argument 'preset': expected one of {_PRESETS}, got {self.preset!r}")
        if self.q_residual not in _RESIDUAL:
            raise ValueError(f"argument 'q_residual': expected one of {_RESIDUAL}, got {self.q_residual!r}")
        if self.q_pool not in _Q_POOL:
            raise ValueError(f"argument 'q_pool': expected one of {_Q_POOL}, got {self.q_pool!r}")
        validation.check_eps(self.q_pool_ln_eps, "q_pool_ln_eps")
        if dims[0] % 8:
            raise ValueError(f"argument 'embed_dims': the stem widths C0/8, C0/4, C0/2 need C0 divisible by 8, "
                             f"got {dims[0]}")
        for i, c in enumerate(dims[:-1]):
            if c % self.key_dim:
                raise ValueError(f"argument 'embed_dims': shrink block {i + 1} has C_{i} / key_dim heads; "
                                 f"{c} is not divisible by key_dim={self.key_dim}")
        fixed = {"dim", "num_heads"} & set(dict(self.attn_overrides))
        if fixed:
            raise ValueError(f"argument 'attn_overrides': {sorted(fixed)} follow from embed_dims, key_dim, num_heads "
                             f"and the ratios; they cannot be overridden")
        for s in range(len(dims)):
            self.attention_config(s)          # validates the overrides
        for s in range(1, len(dims)):
            self.attention_config(s, downsample=True)

    @property
    def value_dim(self) -> int:
        """d_v (= d_qk) per head in the stage blocks."""
        return self.attn_ratio * self.key_dim

    @property
    def down_value_dim(self) -> int:
        """d_v (= d_qk) per head in the shrink blocks."""
        return self.down_attn_ratio * self.key_dim

    def down_heads(self, stage: int) -> int:
        """Heads of the shrink block entering ``stage`` (>= 1): C_{stage-1} / D (LeViT)."""
        return self.embed_dims[stage - 1] // self.key_dim

    def residual(self, downsample: bool) -> bool:
        """Whether the residual pooling connection Attn + Q is added in a block: every block for q_residual "all", only
        the shrink blocks (``downsample``) for "downsample", none for "none"."""
        return self.q_residual == "all" or (self.q_residual == "downsample" and downsample)

    def attention_config(self, stage: int, downsample: bool = False) -> CastlingConfig:
        """The Castling core of a stage block (or of the shrink block entering ``stage``): dim = h d_v."""
        h = self.down_heads(stage) if downsample else self.num_heads[stage]
        d = self.down_value_dim if downsample else self.value_dim
        return CastlingConfig.preset(self.preset, dim=h * d, num_heads=h,
                                     **{"conv_kernel": self.conv_kernel, **dict(self.attn_overrides)})


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, CastlingLeViTConfig):
        raise TypeError(f"argument 'cfg': expected CastlingLeViTConfig, got {type(cfg).__name__}")


def stage_grids(cfg: CastlingLeViTConfig) -> list[tuple[int, int]]:
    """The token grid of every stage: the stem's four stride-2 3x3 convs (padding 1) give ceil(. / 2) four
    times; each shrink block keeps ceil(. / 2) (LeViT's ``(resolution - 1) // 2 + 1``)."""
    _check_cfg(cfg)
    h, w = cfg.img_size
    for _ in range(4):
        h, w = (h + 1) // 2, (w + 1) // 2
    out = [(h, w)]
    for _ in range(len(cfg.embed_dims) - 1):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        out.append((h, w))
    return out


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def _bn(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{k}": (c,) for k in ("weight", "bias", "running_mean", "running_var")}


def _lbn(prefix: str, a: int, b: int) -> dict[str, tuple[int, ...]]:
    """Linear_BN(a, b): bias-free Linear, BatchNorm1d(b)."""
    return {f"{prefix}.c.weight": (b, a), **_bn(f"{prefix}.bn", b)}


def _dconv(prefix: str, acfg: CastlingConfig) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{k}": tuple(v) for k, v in acfg.param_shapes().items() if k.startswith("dconv.")}


def _stem_widths(cfg: CastlingLeViTConfig) -> list[int]:
    c = cfg.embed_dims[0]
    return [cfg.in_chans, c // 8, c // 4, c // 2, c]


def param_shapes(cfg: CastlingLeViTConfig) -> dict[str, tuple[int, ...]]:
    """Every state_dict key and shape (BatchNorm running statistics included), from the config alone."""
    _check_cfg(cfg)
    s: dict[str, tuple[int, ...]] = {}
    w = _stem_widths(cfg)
    for i in range(4):
        s[f"stem.{i}.c.weight"] = (w[i + 1], w[i], 3, 3)
        s.update(_bn(f"stem.{i}.bn", w[i + 1]))
    for st, c in enumerate(cfg.embed_dims):
        if st:
            p, hs, dv, cin = f"stages.{st}.downsample", cfg.down_heads(st), cfg.down_value_dim, cfg.embed_dims[st - 1]
            s.update(_lbn(f"{p}.attn.kv", cin, hs * 2 * dv))
            s.update(_lbn(f"{p}.attn.q", cin, hs * dv))
            if cfg.q_pool == "conv":
                s.update({f"{p}.attn.pool_q.weight": (dv, 1, 3, 3), f"{p}.attn.norm_q.weight": (dv,),
                          f"{p}.attn.norm_q.bias": (dv,)})
            s.update(_dconv(f"{p}.attn", cfg.attention_config(st, downsample=True)))
            s.update(_lbn(f"{p}.attn.proj", hs * dv, c))
            s.update(_lbn(f"{p}.mlp.fc1", c, cfg.down_mlp_ratio * c))
            s.update(_lbn(f"{p}.mlp.fc2", cfg.down_mlp_ratio * c, c))
        h, dv = cfg.num_heads[st], cfg.value_dim
        for j in range(cfg.depths[st]):
            p = f"stages.{st}.blocks.{j}"
            s.update(_lbn(f"{p}.attn.qkv", c, h * 3 * dv))
            s.update(_dconv(f"{p}.attn", cfg.attention_config(st)))
            s.update(_lbn(f"{p}.attn.proj", h * dv, c))
            s.update(_lbn(f"{p}.mlp.fc1", c, cfg.mlp_ratio * c))
            s.update(_lbn(f"{p}.mlp.fc2", cfg.mlp_ratio * c, c))
    c = cfg.embed_dims[-1]
    for head in ("head", "head_dist") if cfg.distillation else ("head",):
        s.update(_bn(f"{head}.bn", c))
        s.update({f"{head}.l.weight": (cfg.num_classes, c), f"{head}.l.bias": (cfg.num_classes,)})
    return s


def init_params(cfg: CastlingLeViTConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Fresh random parameters keyed like the twin's state_dict (_netparts.init_params_from_shapes: BatchNorm
    running variances U(0.5, 2)).  For tests, docs, benchmarks; not the paper's training initialisation."""
    return nets.init_params_from_shapes(param_shapes(cfg), np.random.default_rng(rng))


def _check_params(params: Any, cfg: CastlingLeViTConfig) -> Mapping[str, Any]:
    return common.check_network_params(params, cfg, param_shapes, "Castling-LeViT network")


# ===================================================================================================
# Layers
# ===================================================================================================

def hardswish(x: Any) -> np.ndarray:
    """x min(max(x + 3, 0), 6) / 6 (torch.nn.Hardswish; Howard et al. 2019), LeViT's activation."""
    x = numerics.as_float(x, "x")
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _bn_last(x: np.ndarray, p: Mapping[str, Any], prefix: str, eps: float) -> np.ndarray:
    """Inference BatchNorm over the last axis of (B, N, C) or (B, C) (LeViT's BatchNorm1d on flattened tokens)."""
    cf = np.moveaxis(x.reshape(x.shape[0], -1, x.shape[-1]), -1, 1)[..., None]           # (B, C, N, 1)
    y = layers.batch_norm2d(cf, p[prefix + ".weight"], p[prefix + ".bias"], p[prefix + ".running_mean"],
                            p[prefix + ".running_var"], eps)
    return np.moveaxis(y[..., 0], 1, -1).reshape(x.shape)


def _linear_bn(x: np.ndarray, p: Mapping[str, Any], prefix: str, eps: float) -> np.ndarray:
    return _bn_last(common.linear2d(x, p[prefix + ".c.weight"]), p, prefix + ".bn", eps)


def _heads(t: np.ndarray, h: int, split: int) -> list[np.ndarray]:
    """(B, N, h * split * d) laid out per head as [part_0 | ... ] -> ``split`` arrays (B, h, N, d)."""
    b, n, f = t.shape
    a = t.reshape(b, n, h, split, f // (h * split)).transpose(3, 0, 2, 1, 4)
    return [a[i] for i in range(split)]


def _subsample(t: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Keep the tokens at even grid positions of (..., N, d), N = H W (LeViT's ``Subsample``, stride 2)."""
    lead, d = t.shape[:-2], t.shape[-1]
    g = t.reshape(*lead, hw[0], hw[1], d)[..., ::2, ::2, :]
    return g.reshape(*lead, -1, d)


def _pool_q(q: np.ndarray, p: Mapping[str, Any], hw: tuple[int, int], cfg: "CastlingLeViTConfig") -> np.ndarray:
    if cfg.q_pool == "subsample":
        return _subsample(q, hw)
    return pq.pool_q(q, p, hw, 2, cfg.q_pool_ln_eps)


def stage_attention(params: Mapping[str, Any], prefix: str, x: Any, cfg: CastlingLeViTConfig, stage: int) -> np.ndarray:
    """The attention of a stage block (without the block residual): (B, N, C) -> (B, N, C).

    qkv = Linear_BN(x) split per head [q | k | v] (each d_v); H = castling_core(q, k, v) (+ q with the residual
    pooling connection); Linear_BN(Hardswish(merge(H))).

    References: Castling-ViT Eq. 9 and §3.1; LeViT's Attention; MViTv2's residual pooling connection.
    """
    _check_cfg(cfg)
    params = _check_params(params, cfg)
    x = numerics.as_float(x, "x")
    hw = stage_grids(cfg)[stage]
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": hw[0] * hw[1], "C": cfg.embed_dims[stage]})
    p, eps = layers.subparams(params, prefix), cfg.batch_norm_eps
    q, k, v = _heads(_linear_bn(x, p, "attn.qkv", eps), cfg.num_heads[stage], 3)
    out = castling_core(q, k, v, cfg.attention_config(stage), hw=hw, **pq.core_args(p))
    if cfg.residual(False):
        out = out + q
    return _linear_bn(hardswish(pq.merge_heads(out)), p, "attn.proj", eps)


def downsample_attention(params: Mapping[str, Any], prefix: str, x: Any, cfg: CastlingLeViTConfig,
                         stage: int) -> np.ndarray:
    """The shrink attention entering ``stage``: (B, N, C_{s-1}) -> (B, N', C_s), no residual around it.

    k, v = Linear_BN_kv(x) per head [k | v] (each 4D); q = Pool(Linear_BN_q(x)) (post-Q pooling: the
    projection at every token, then MViTv2's conv pooling + LayerNorm, or the stride-2 selection); H = Eq. 9
    for the N' pooled queries against all N keys (+ q, the residual pooling connection);
    Linear_BN(Hardswish(merge(H))).

    The pooled-query core is :func:`refimpl.models._castling_pool.pooled_core` (castling_core on a full-size
    query matrix, its stride-2 rows kept: exact, every term of the core is row-wise in Q).

    References: Castling-ViT §3.1 (Table 1: post-Q pooling + residual), Eq. 9; LeViT's AttentionSubsample.
    """
    _check_cfg(cfg)
    params = _check_params(params, cfg)
    x = numerics.as_float(x, "x")
    hw = stage_grids(cfg)[stage - 1]
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": hw[0] * hw[1], "C": cfg.embed_dims[stage - 1]})
    p, eps, hs = layers.subparams(params, prefix), cfg.batch_norm_eps, cfg.down_heads(stage)
    k, v = _heads(_linear_bn(x, p, "attn.kv", eps), hs, 2)
    (qf,) = _heads(_linear_bn(x, p, "attn.q", eps), hs, 1)
    q = _pool_q(qf, p, hw, cfg)
    out = pq.pooled_core(qf, q, k, v, cfg.attention_config(stage, downsample=True), p, hw)
    if cfg.residual(True):
        out = out + q
    return _linear_bn(hardswish(pq.merge_heads(out)), p, "attn.proj", eps)


def _mlp(x: np.ndarray, p: Mapping[str, Any], eps: float) -> np.ndarray:
    return _linear_bn(hardswish(_linear_bn(x, p, "mlp.fc1", eps)), p, "mlp.fc2", eps)


# ===================================================================================================
# Units ("stem", "stages.s.downsample", "stages.s.blocks.j", "head"; values: tokens (B, N, C))
# ===================================================================================================

def unit_names(cfg: CastlingLeViTConfig) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    out = ["stem"]
    for s, depth in enumerate(cfg.depths):
        if s:
            out.append(f"stages.{s}.downsample")
        out += [f"stages.{s}.blocks.{j}" for j in range(depth)]
    return out + ["head"]


def _unit_stage(name: str) -> int:
    return int(name.split(".")[1])


def _unit_input(name: str, x: Any, cfg: CastlingLeViTConfig, part: str | None = None) -> np.ndarray:
    """The input of unit ``name`` (or of its ``part``): images (B, in_chans, H, W), (H, W) = cfg.img_size, for
    "stem", else tokens (B, N_s, C_s) of the stage the unit reads - the previous stage for a shrink block's
    "attn" part (and the whole block), its own stage (the reduced grid) for the shrink block's "mlp" part."""
    if name == "stem":
        return common.check_images(x, cfg.in_chans, cfg.img_size)
    x = numerics.as_float(x, "x")
    s = _unit_stage(name) if name != "head" else len(cfg.embed_dims) - 1
    if name.endswith("downsample") and part != "mlp":
        s -= 1
    hw = stage_grids(cfg)[s]
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": hw[0] * hw[1], "C": cfg.embed_dims[s]})
    return x


def unit_parts(cfg: CastlingLeViTConfig, name: str) -> tuple[str, ...]:
    """A stage block is "attn" (x + Attn(x)) then "mlp" (x + MLP(x)); a shrink block "attn" (Attn(x), no
    residual, N -> N') then "mlp"; the stem and the head have no parts."""
    nets.check_unit(_M, name, cfg)
    return ("attn", "mlp") if name.startswith("stages.") else ()


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: CastlingLeViTConfig) -> np.ndarray:
    s = _unit_stage(name)
    if part == "attn":
        if name.endswith("downsample"):
            return downsample_attention(params, name, x, cfg, s)
        return x + stage_attention(params, name, x, cfg, s)
    return x + _mlp(x, layers.subparams(params, name), cfg.batch_norm_eps)


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingLeViTConfig) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order.  The "mlp" part
    of a shrink block takes the (B, N', C_s) output of its "attn" part."""
    return nets.run_part(_M, params, name, part, x, cfg)


def _stem(params: Mapping[str, Any], images: np.ndarray, cfg: CastlingLeViTConfig) -> np.ndarray:
    y = images
    for i in range(4):
        y = layers.conv2d(y, params[f"stem.{i}.c.weight"], None, stride=2, padding=1)
        y = layers.batch_norm2d(y, params[f"stem.{i}.bn.weight"], params[f"stem.{i}.bn.bias"],
                                params[f"stem.{i}.bn.running_mean"], params[f"stem.{i}.bn.running_var"],
                                cfg.batch_norm_eps)
        if i < 3:
            y = hardswish(y)
    return nets.grid_to_tokens(y)


def _head(params: Mapping[str, Any], x: np.ndarray, cfg: CastlingLeViTConfig) -> np.ndarray:
    pooled = np.mean(x, axis=1)
    outs = [layers.linear(_bn_last(pooled, params, f"{h}.bn", cfg.batch_norm_eps), params[f"{h}.l.weight"],
                          params[f"{h}.l.bias"]) for h in (("head", "head_dist") if cfg.distillation else ("head",))]
    return outs[0] if len(outs) == 1 else (outs[0] + outs[1]) / 2


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingLeViTConfig) -> np.ndarray:
    """One unit: "stem" (images (B, in_chans, H, W) -> tokens (B, N0, C0)), "stages.s.downsample" (tokens of
    stage s-1 -> tokens of stage s), "stages.s.blocks.j" (tokens -> tokens) or "head" (tokens -> logits
    (B, num_classes): mean, BN + Linear, averaged with the distillation head).

    References: LeViT (stem, Linear_BN, heads); Castling-ViT Eq. 9 in every attention (inference).
    """
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    if name == "stem":
        return _stem(params, x, cfg)
    if name == "head":
        return _head(params, x, cfg)
    y = _part(params, name, "attn", x, cfg)
    return _part(params, name, "mlp", y, cfg)


def run(params: Mapping[str, Any], images: Any, cfg: CastlingLeViTConfig, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and the three stages' feature maps in one pass; taps (dict or None) records every unit's output."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: CastlingLeViTConfig) -> np.ndarray:
    """Class logits of Castling-LeViT (inference: auxiliary branch dropped, distillation heads averaged).

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`).
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`CastlingLeViTConfig`.

    Returns
    -------
    ndarray (B, num_classes), working precision.

    References: Castling-ViT §3.1-3.2, Table 2; LeViT.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: CastlingLeViTConfig) -> list[np.ndarray]:
    """The output of each stage's last block on its grid, channels-first (B, C_s, H_s, W_s)."""
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (running first-order analysis, models/common.py convention)
# ===================================================================================================

def _e_hardswish(t: Err) -> Err:
    """Input errors through the Lipschitz constant 1.5; own rounding _HARDSWISH_ROUNDINGS |y|."""
    y = hardswish(t.value)
    return Err(y, HARDSWISH_LIPSCHITZ * t.err + _HARDSWISH_ROUNDINGS * np.abs(y), t.depth + _HARDSWISH_ROUNDINGS)


def _e_bn_last(t: Err, p: Mapping[str, Any], prefix: str, eps: float) -> Err:
    shape = t.value.shape

    def cf(a):
        return np.moveaxis(a.reshape(shape[0], -1, shape[-1]), -1, 1)[..., None]

    def back(a):
        return np.moveaxis(a[..., 0], 1, -1).reshape(shape)

    r = nets.e_batch_norm(Err(cf(t.value), cf(t.err), t.depth), p, prefix, eps)
    return Err(back(r.value), back(r.err), r.depth)


def _e_linear_bn(t: Err, p: Mapping[str, Any], prefix: str, eps: float) -> Err:
    return _e_bn_last(common.e_linear(t, p[prefix + ".c.weight"]), p, prefix + ".bn", eps)


def _e_heads(t: Err, h: int, split: int) -> list[Err]:
    return [Err(v, e, t.depth) for v, e in zip(_heads(t.value, h, split), _heads(t.err, h, split))]


def _e_pool_q(q: Err, p: Mapping[str, Any], hw: tuple[int, int], cfg: CastlingLeViTConfig, dtype: Any) -> Err:
    """Query pooling with its error: the selection is exact; the conv + LayerNorm as _castling_pool.e_pool_q."""
    if cfg.q_pool == "subsample":
        return Err(_subsample(q.value, hw), _subsample(q.err, hw), q.depth)
    return pq.e_pool_q(q, p, hw, 2, cfg.q_pool_ln_eps, dtype)


def _e_merge_out(t: Err, p: Mapping[str, Any], eps: float) -> Err:
    merged = Err(pq.merge_heads(t.value), pq.merge_heads(t.err), t.depth)
    return _e_linear_bn(_e_hardswish(merged), p, "attn.proj", eps)


def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: CastlingLeViTConfig, dtype: Any) -> Err:
    s, eps = _unit_stage(name), cfg.batch_norm_eps
    p = layers.subparams(params, name)
    if part == "mlp":
        h = _e_linear_bn(_e_hardswish(_e_linear_bn(t, p, "mlp.fc1", eps)), p, "mlp.fc2", eps)
        return common.e_add(t, h)
    if name.endswith("downsample"):
        hw, hs = stage_grids(cfg)[s - 1], cfg.down_heads(s)
        k, v = _e_heads(_e_linear_bn(t, p, "attn.kv", eps), hs, 2)
        (qf,) = _e_heads(_e_linear_bn(t, p, "attn.q", eps), hs, 1)
        q = _e_pool_q(qf, p, hw, cfg, dtype)
        core = pq.e_pooled_core(qf, q, k, v, cfg.attention_config(s, downsample=True), p, hw, dtype)
        if cfg.residual(True):
            core = common.e_add(core, q)
        return _e_merge_out(core, p, eps)
    hw = stage_grids(cfg)[s]
    q, k, v = _e_heads(_e_linear_bn(t, p, "attn.qkv", eps), cfg.num_heads[s], 3)
    core = pq.e_core(q, k, v, cfg.attention_config(s), p, hw, dtype)
    if cfg.residual(False):
        core = common.e_add(core, q)
    return common.e_add(t, _e_merge_out(core, p, eps))


def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: CastlingLeViTConfig, dtype: Any) -> Err:
    eps = cfg.batch_norm_eps
    if name == "stem":
        images = common.check_images(t.value, cfg.in_chans, cfg.img_size)
        y = Err(images, t.err, t.depth)
        for i in range(4):
            y = common.e_conv2d(y, params[f"stem.{i}.c.weight"], None, stride=2, padding=1)
            y = nets.e_batch_norm(y, params, f"stem.{i}.bn", eps)
            if i < 3:
                y = _e_hardswish(y)
        return nets.e_tokens(y)
    if name == "head":
        pooled = common.e_mean(t, 1)
        outs = [common.e_linear(_e_bn_last(pooled, params, f"{h}.bn", eps), params[f"{h}.l.weight"],
                                params[f"{h}.l.bias"])
                for h in (("head", "head_dist") if cfg.distillation else ("head",))]
        if len(outs) == 1:
            return outs[0]
        s = common.e_add(outs[0], outs[1])
        return Err(s.value / 2, s.err / 2, s.depth)        # halving is exact (no underflow at these sizes)
    return _e_part(params, name, "mlp", _e_part(params, name, "attn", t, cfg, dtype), cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingLeViTConfig, *,
               dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingLeViTConfig, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: CastlingLeViTConfig, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` from exact images and params
    (rigorous to first order, void through depth; the equivalence suite's conclusive check is unit-wise)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate counts
# ===================================================================================================

def macs(cfg: CastlingLeViTConfig, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention; BatchNorm folded into
    the linear layers as LeViT counts it, Hardswish and additions are not MACs).  Stem: the four 3x3 convs.
    Stage block: qkv N C 3 h d_v, the core K^^T V and Q^ (K^^T V) (2 h N d_v^2), the (k, 1) token conv
    h N d_v k, proj, MLP.  Shrink block: kv and q projections at all N tokens (post-Q pooling), the pooling
    conv at the N' kept positions (q_pool "conv"; its LayerNorm is elementwise), K^^T V over N
    keys and Q^ (K^^T V) over the N' kept queries, the conv at the N' kept positions, proj and MLP at N'.
    Head: both linear heads.  The auxiliary branch only if the config keeps it at inference."""
    _check_cfg(cfg)
    common.check_image_hw(cfg.img_size, image_hw)
    grids = stage_grids(cfg)
    hh, ww = cfg.img_size
    w = _stem_widths(cfg)
    out: dict[str, int] = {}
    for i in range(4):
        hh, ww = (hh + 1) // 2, (ww + 1) // 2
        out[f"stem.{i}"] = counting.conv2d_macs((hh, ww), w[i], w[i + 1], (3, 3))
    for s, c in enumerate(cfg.embed_dims):
        n = grids[s][0] * grids[s][1]
        if s:
            p, hs, dv, cin = f"stages.{s}.downsample", cfg.down_heads(s), cfg.down_value_dim, cfg.embed_dims[s - 1]
            n_in = grids[s - 1][0] * grids[s - 1][1]
            acfg = cfg.attention_config(s, downsample=True)
            out[f"{p}.attn.kv"] = counting.linear_macs(n_in, cin, hs * 2 * dv)
            out[f"{p}.attn.q"] = counting.linear_macs(n_in, cin, hs * dv)
            if cfg.q_pool == "conv":
                out[f"{p}.attn.pool_q"] = hs * counting.depthwise_conv2d_macs(grids[s], dv, (3, 3))
            out.update({f"{p}.attn.{k}": v for k, v in pq.core_macs(acfg, n, n_in, acfg.sparse_active(False)).items()})
            out[f"{p}.attn.proj"] = counting.linear_macs(n, hs * dv, c)
            out[f"{p}.mlp"] = counting.mlp_macs(n, c, cfg.down_mlp_ratio * c)
        h, dv = cfg.num_heads[s], cfg.value_dim
        acfg = cfg.attention_config(s)
        for j in range(cfg.depths[s]):
            p = f"stages.{s}.blocks.{j}"
            out[f"{p}.attn.qkv"] = counting.linear_macs(n, c, h * 3 * dv)
            out.update({f"{p}.attn.{k}": v for k, v in pq.core_macs(acfg, n, n, acfg.sparse_active(False)).items()})
            out[f"{p}.attn.proj"] = counting.linear_macs(n, h * dv, c)
            out[f"{p}.mlp"] = counting.mlp_macs(n, c, cfg.mlp_ratio * c)
    for head in ("head", "head_dist") if cfg.distillation else ("head",):
        out[head] = counting.linear_macs(1, cfg.embed_dims[-1], cfg.num_classes)
    return out


def elementwise(cfg: CastlingLeViTConfig, image_hw: Any = None) -> dict[str, int]:
    """Element ops per layer group (counting.py): BatchNorm and Hardswish outputs, q/k normalisation, the
    combination of the core's terms (constant, linear, conv, residual q), the query pooling's LayerNorm,
    residual additions, the mean pooling and the head BatchNorms."""
    macs(cfg, image_hw)  # validates
    grids, w = stage_grids(cfg), _stem_widths(cfg)
    hh, ww = cfg.img_size
    out: dict[str, int] = {}
    for i in range(4):
        hh, ww = (hh + 1) // 2, (ww + 1) // 2
        out[f"stem.{i}"] = (2 if i < 3 else 1) * hh * ww * w[i + 1]
    for s, c in enumerate(cfg.embed_dims):
        n = grids[s][0] * grids[s][1]
        if s:
            p, hs, dv = f"stages.{s}.downsample", cfg.down_heads(s), cfg.down_value_dim
            n_in = grids[s - 1][0] * grids[s - 1][1]
            out[f"{p}.attn"] = n_in * hs * 3 * dv + (n_in + n) * hs * dv + n * hs * dv * (4 + 1) + n * c
            if cfg.q_pool == "conv":
                out[f"{p}.attn.norm_q"] = n * hs * dv
            out[f"{p}.mlp"] = n * cfg.down_mlp_ratio * c * 2 + n * c * 2
        h, dv = cfg.num_heads[s], cfg.value_dim
        for j in range(cfg.depths[s]):
            p = f"stages.{s}.blocks.{j}"
            out[f"{p}.attn"] = n * h * 3 * dv + 2 * n * h * dv + n * h * dv * (4 + 1) + 2 * n * c
            out[f"{p}.mlp"] = n * cfg.mlp_ratio * c * 2 + n * c * 2
    c = cfg.embed_dims[-1]
    out["head"] = grids[-1][0] * grids[-1][1] * c + (2 if cfg.distillation else 1) * c
    return out


# ===================================================================================================
# Reduced configuration, paper figures, registration
# ===================================================================================================

def reduced(cfg: CastlingLeViTConfig) -> CastlingLeViTConfig:
    """A small configuration on the same code path (preset, residual and attention options kept): widths
    (32, 48, 64), key dim 8 (d_v 16, shrink d_v 32 with 4 and 6 heads), heads (2, 3, 4), one block per stage,
    a non-square 48 x 80 image (grids 3 x 5 -> 2 x 3 -> 1 x 2: odd sizes, ceil subsampling), 10 classes."""
    _check_cfg(cfg)
    return dataclasses.replace(cfg, embed_dims=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4), depths=(1, 1, 1),
                               img_size=(48, 80), num_classes=10)


#: Both presets have the same parameters; the registered config is the paper's setting.
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {}

#: Castling-ViT Table 2: MACs (G), printed with 2 decimals.
PAPER_MACS_G = {"castling_levit_128": 0.49, "castling_levit_192": 0.82, "castling_levit_256": 1.40,
                "castling_levit_384": 2.90}

_SPECS = {  # name -> (embed_dims, key_dim, num_heads, paper params M), LeViT paper model specification
    "castling_levit_128": ((128, 256, 384), 16, (4, 8, 12), 10.5),
    "castling_levit_192": ((192, 288, 384), 32, (3, 5, 6), 12.7),
    "castling_levit_256": ((256, 384, 512), 32, (4, 6, 8), 22.0),
    "castling_levit_384": ((384, 512, 768), 32, (6, 9, 12), 45.8),
}

_GAP_REASON = ("Castling-ViT prints {paper}M (Table 2); our reading of its description (LeViT-{w} with Q/K at the "
               "value dim, no attention biases, post-Q pooling, the 9-tap token conv) gives {ours:,}.  The "
               "paper's figure implies {lo:.2f}-{hi:.2f}M over LeViT-{w} (9.2/10.9/18.9/39.1M reproduced "
               "exactly by the same skeleton); ours adds {add:.3f}M.  No variant of the description reproduces "
               "all four models (docs/models_flatten_castling.md, 'Castling-LeViT': the gap changes sign from "
               "LeViT-256 to LeViT-384, while every option scales with the same per-stage sizes).")


def _gaps() -> dict[str, counting.CountGap]:
    base = {"castling_levit_128": 9_213_936, "castling_levit_192": 10_947_069, "castling_levit_256": 18_893_876,
            "castling_levit_384": 39_128_836}
    out = {}
    for name, (dims, kd, heads, paper) in _SPECS.items():
        cfg = CastlingLeViTConfig(embed_dims=dims, key_dim=kd, num_heads=heads)
        ours = sum(int(np.prod(v)) for k, v in param_shapes(cfg).items() if not k.endswith(("running_mean",
                                                                                           "running_var")))
        reg = sum(4 * (c + 2) * h * 2 * (2 * kd - kd) for c, h in zip(dims, heads))
        down = sum(2 * (c + 2) * (c // kd) * (4 * kd - kd) for c in dims[:-1])
        bias_n = sum(4 * h * g for h, g in zip(heads, (196, 49, 16))) + sum(
            (c // kd) * g for c, g in zip(dims[:-1], (196, 49)))
        conv = sum(4 * h * 9 for h in heads) + sum((c // kd) * 9 for c in dims[:-1])
        pool = 2 * (4 * kd * 9 + 2 * 4 * kd)
        derived = base[name] + reg + down - bias_n + conv + pool
        arith = (f"LeViT-{dims[0]} {base[name]:,} + Q/K from D={kd} to d_v in the 12 stage blocks "
                 f"(4 blocks x (C + 2) h 2 (2D - D), the +2 the BatchNorm of each output: {reg:,}) + q, k from D to 4D in the two shrink blocks "
                 f"(2 (C + 2) (C/D) (4D - D): {down:,}) - attention biases {bias_n:,} + token-conv weights {conv:,} "
                 f"+ the two query-pooling convs and LayerNorms 2 (4D 9 + 2 4D) = {pool:,} = {derived:,}")
        out[name] = counting.CountGap(
            derived=derived, arithmetic=arith,
            reason=_GAP_REASON.format(paper=paper, w=dims[0], ours=ours, lo=paper - 0.05 - base[name] / 1e6,
                                      hi=paper + 0.05 - base[name] / 1e6, add=(ours - base[name]) / 1e6))
    return out


COUNT_GAPS: dict[str, counting.CountGap] = _gaps()

_M = sys.modules[__name__]
for _name, _spec in _SPECS.items():
    register(_name, CastlingLeViTConfig(embed_dims=_spec[0], key_dim=_spec[1], num_heads=_spec[2]), _M,
             paper_params_m=_spec[3], paper_source="Castling-ViT Table 2", paper_precision=1)
