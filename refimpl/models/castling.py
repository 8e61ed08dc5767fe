"""Castling-ViT networks: Castling-DeiT-T and Castling-DeiT-B (You et al., CVPR 2023), NumPy reference.

Shapes: B batch, C channels, H x W patch grid, N = H W patch tokens, T = N + 1 tokens (class token first).

The paper applies its linear-angular attention to DeiT "as a drop-in replacement" (§2, §4.1, Table 2) and
gives no further architecture table, so Castling-DeiT is DeiT (Touvron et al. 2021) with every attention
replaced by the Castling attention of refimpl.attention.angular (Eq. 9; the auxiliary masked softmax branch
of Eq. 10 is a training device, dropped at inference by the paper preset, Sec. 3.2.2):

    patch embedding (16 x 16 conv, stride 16) -> prepend the class token -> + absolute positional embedding
    (1, T, C) -> depth x [x + attn(LN1 x), x + MLP(LN2 x)] -> LN -> the class token -> linear head.

**The class token is kept.**  Unlike FLatten's 2-D DWC, the released Castling conv branch is a (k, 1)
convolution along the flattened token axis with heads as channels (refimpl.attention.angular.token_conv),
which a class token passes through like any other token: nothing in the mechanism asks for the token grid,
and the paper calls the model DeiT.  (The "grid2d" conv option needs the H x W grid, which the class token
is not part of: it is refused for this network.)  LayerNorm eps 1e-6 and qkv bias as DeiT
(``qkv_bias=True``; the released attention snippet's constructor default is False, a DeiT passes its own).

**Presets**: ``preset`` is the attention's (:class:`refimpl.attention.angular.CastlingConfig`): "paper"
(Eq. 9: constant 1/2 sum_j v_j, no normaliser, q and k normalised with eps, the conv branch; sparse branch
in training only) or "official" (the released LinAngularAttention: 1/2 v_i, per-token L2 normalisation of the
output before the conv branch is added, ...).  Both presets have the same parameters.

**Resolutions**: the positional embedding is sized for ``img_size`` at construction (any multiple of the
patch size, non-square included); images must have that size.

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/castling.py): "patch_embed.proj.weight",
"cls_token", "pos_embed", "blocks.3.attn.qkv.weight", "blocks.3.attn.dconv.weight", "norm.weight", "head.bias".

References: Castling-ViT §3.2 (Eq. 8-10), §4.1-4.2 (Table 2); DeiT (Touvron et al. 2021).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, validation
from ..attention.angular import CastlingConfig, castling_attention
from . import common, counting
from . import _netparts as nets
from ._deit import (DeiTClassTokenGeometry, block_shapes, deit_feature_map, deit_head, deit_head_shapes, deit_stem,
                    deit_stem_shapes, deit_unit_input, deit_unit_names, e_deit_head, e_deit_stem)
from .registry import register
from .common import Err

__all__ = ["CastlingDeiTConfig", "param_shapes", "init_params", "forward", "features", "run", "unit_names",
           "run_unit", "unit_bound", "forward_bounds", "macs", "elementwise", "reduced", "PAPER_COUNT_OVERRIDES",
           "COUNT_GAPS"]

_PRESETS = ("paper", "official")


@dataclasses.dataclass(frozen=True)
class CastlingDeiTConfig(DeiTClassTokenGeometry):
    """Castling-DeiT.  Every architectural choice is a field.

    embed_dim C, depth, num_heads h; img_size (H, W); patch_size; in_chans; num_classes; mlp_ratio; qkv_bias;
    layer_norm_eps; preset ("paper" | "official", the attention's preset); conv_kernel (k of the (k, 1) token
    conv); attn_overrides: extra :class:`CastlingConfig` fields (mapping or pairs) applied after the preset
    (e.g. {"normaliser": "similarity_sum"} or {"order": 1}).
    """

    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    img_size: Any = (224, 224)
    patch_size: int = config.DEIT_PATCH
    in_chans: int = 3
    num_classes: int = 1000
    mlp_ratio: float = config.NET_MLP_RATIO
    qkv_bias: bool = True
    layer_norm_eps: float = config.DEIT_LN_EPS
    preset: str = "paper"
    conv_kernel: int = config.CASTLING_CONV_KERNEL
    attn_overrides: Any = ()

    def __post_init__(self) -> None:
        """Stores img_size as (H, W) and attn_overrides as sorted pairs; raises ValueError (TypeError for a wrong type)
        for an unknown preset, a size or count that is not a positive integer, mlp_ratio <= 0, a bad eps, an img_size
        that patch_size does not divide, and overrides that ask for the "grid2d" conv (the class token has no place on
        the grid)."""
        object.__setattr__(self, "img_size", common.normalize_img_size(self.img_size))
        object.__setattr__(self, "attn_overrides", common.normalize_overrides(self.attn_overrides))
        if self.preset not in _PRESETS:
            raise ValueError(f"argument 'preset': expected one of {_PRESETS}, got {self.preset!r}")
        for name in ("embed_dim", "depth", "num_heads", "patch_size", "in_chans", "num_classes"):
            numerics.check_positive_int(getattr(self, name), name)
        validation.check_positive(self.mlp_ratio, "mlp_ratio")
        validation.check_eps(self.layer_norm_eps, "layer_norm_eps")
        h, w = self.img_size
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"argument 'img_size': {self.img_size} must be a multiple of patch_size="
                             f"{self.patch_size} (the patch embedding does not pad)")
        if self.attention_config().conv == "grid2d":
            raise ValueError("argument 'attn_overrides': conv='grid2d' needs the token grid, which the class token "
                             "is not part of; Castling-DeiT uses the (k, 1) token conv ('tokens1d') or 'none'")

    def attention_config(self) -> CastlingConfig:
        """The :class:`CastlingConfig` of every block: the preset's, at C and h with the network's qkv_bias and
        conv_kernel, then ``attn_overrides``."""
        fields = dict(dim=self.embed_dim, num_heads=self.num_heads, qkv_bias=self.qkv_bias,
                      conv_kernel=self.conv_kernel)
        fields.update(self.attn_overrides)  # an override replaces the network's own field, never collides
        return CastlingConfig.preset(self.preset, **fields)


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, CastlingDeiTConfig):
        raise TypeError(f"argument 'cfg': expected CastlingDeiTConfig, got {type(cfg).__name__}")


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def param_shapes(cfg: CastlingDeiTConfig) -> dict[str, tuple[int, ...]]:
    """Every state_dict key and shape, from the config alone."""
    _check_cfg(cfg)
    s = deit_stem_shapes(cfg, cls_token=True)
    attn = cfg.attention_config().param_shapes()
    for i in range(cfg.depth):
        s.update(block_shapes(f"blocks.{i}", cfg.embed_dim, cfg.hidden, attn))
    s.update(deit_head_shapes(cfg))
    return s


def init_params(cfg: CastlingDeiTConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Fresh random parameters keyed like the twin's state_dict (common.init_from_shapes).  For tests, docs,
    benchmarks; not the paper's training initialisation."""
    return common.init_from_shapes(param_shapes(cfg), np.random.default_rng(rng))


# ===================================================================================================
# Forward, unit by unit ("stem", "blocks.i", "head"; unit values are tokens (B, T, C))
# ===================================================================================================

def _check_params(params: Any, cfg: CastlingDeiTConfig) -> Mapping[str, Any]:
    """The strict check of :func:`refimpl.models.common.check_network_params` against :func:`param_shapes`."""
    return common.check_network_params(params, cfg, param_shapes, "Castling-DeiT network")


def unit_names(cfg: CastlingDeiTConfig) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    return deit_unit_names(cfg)


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingDeiTConfig) -> np.ndarray:
    """One unit: "stem" (images (B, 3, H, W) -> tokens (B, T, C): patch embedding, class token first,
    + positional embedding), "blocks.i" (tokens -> tokens) or "head" (tokens -> logits (B, num_classes):
    LayerNorm, the class token, linear).

    References
    ----------
    Castling-ViT Eq. 9 (inference: no auxiliary branch unless the config keeps it); DeiT.
    """
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    if name == "stem":
        return deit_stem(params, x, cfg, cls_token=True)
    if name == "head":
        return deit_head(params, x, cfg, cls_token=True)
    return _part(params, name, "mlp", _part(params, name, "attn", x, cfg), cfg)


def unit_parts(cfg: CastlingDeiTConfig, name: str) -> tuple[str, ...]:
    """The stages a unit is made of, for stage-wise comparison: a block is "attn" (x + attn(LN1 x)) then
    "mlp" (x + MLP(LN2 x)); the stem and the head have no parts (())."""
    nets.check_unit(_M, name, cfg)
    return ("attn", "mlp") if name.startswith("blocks.") else ()


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingDeiTConfig) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order."""
    return nets.run_part(_M, params, name, part, x, cfg)


def _unit_input(name: str, x: Any, cfg: CastlingDeiTConfig, part: str | None = None) -> np.ndarray:
    """Images for "stem", else the tokens (B, T, C) with the class token first."""
    return deit_unit_input(name, x, cfg, cls_token=True)


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: CastlingDeiTConfig) -> np.ndarray:
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], eps)
        return x + castling_attention(y, layers.subparams(p, "attn"), cfg.attention_config())
    return x + common.mlp2d(layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], eps), layers.subparams(p, "mlp"))


def _feature_map(name: str, y: np.ndarray, cfg: CastlingDeiTConfig) -> np.ndarray | None:
    return deit_feature_map(name, y, cfg, cls_token=True)


def run(params: Mapping[str, Any], images: Any, cfg: CastlingDeiTConfig, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and the feature map in one pass; taps (dict or None) records every unit's output."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: CastlingDeiTConfig) -> np.ndarray:
    """Class logits of Castling-DeiT (inference mode).

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`).
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`CastlingDeiTConfig`.

    Returns
    -------
    ndarray (B, num_classes), working precision.

    References
    ----------
    Castling-ViT Eq. 9 in every block, Table 2; DeiT.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: CastlingDeiTConfig) -> list[np.ndarray]:
    """The single stage's feature map: the last block's patch tokens (class token dropped) on the grid,
    before the final LayerNorm, channels-first (B, C, H / 16, W / 16).

    References
    ----------
    DeiT (one stage of constant resolution); Castling-ViT Table 2.
    """
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (for the equivalence suite)
# ===================================================================================================

def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: CastlingDeiTConfig, dtype: Any) -> Err:
    if name == "stem":
        return e_deit_stem(params, t, cfg, cls_token=True)
    if name == "head":
        return e_deit_head(params, t, cfg, dtype, cls_token=True, capped=False)
    return _e_part(params, name, "mlp", _e_part(params, name, "attn", t, cfg, dtype), cfg, dtype)


def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: CastlingDeiTConfig, dtype: Any) -> Err:
    """:func:`_part` with the running error analysis."""
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], eps)
        return common.e_add(t, common.e_castling(y, layers.subparams(p, "attn"), cfg.attention_config(), dtype=dtype))
    return common.e_add(t, common.e_mlp(common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], eps),
                                        layers.subparams(p, "mlp")))


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: CastlingDeiTConfig, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: CastlingDeiTConfig, *,
               dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: CastlingDeiTConfig, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` from exact images and
    params (rigorous to first order, loose through depth; see flatten.forward_bounds)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate counts
# ===================================================================================================

def macs(cfg: CastlingDeiTConfig, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention).  The attention core:
    K^^T V and Q^ (K^^T V) (2 h T d^2), the similarity-sum normaliser's dot products if configured (h T d),
    order-K tensor-power features ((d + d^3 + ...) per token) in place of d; the (k, 1) token conv h T d k;
    the auxiliary branch only if the config keeps it at inference."""
    _check_cfg(cfg)
    common.check_image_hw(cfg.img_size, image_hw)
    acfg = cfg.attention_config()
    c, t, h, d = cfg.embed_dim, cfg.tokens, cfg.num_heads, acfg.head_dim
    feat = sum(d ** (2 * kk + 1) for kk in range(acfg.order + 1))
    out = {"patch_embed": counting.conv2d_macs(cfg.grid, cfg.in_chans, c, (cfg.patch_size, cfg.patch_size))}
    for i in range(cfg.depth):
        out[f"blocks.{i}.attn.qkv"] = counting.linear_macs(t, c, 3 * c)
        out[f"blocks.{i}.attn.core"] = counting.linear_attention_macs(
            h, t, t, feat, d, normaliser=acfg.normaliser == "similarity_sum")
        if acfg.conv == "tokens1d":
            out[f"blocks.{i}.attn.conv"] = h * t * d * acfg.conv_kernel
        if acfg.sparse_active(False):
            out[f"blocks.{i}.attn.sparse"] = counting.softmax_attention_macs(h, t, t, d)
        out[f"blocks.{i}.attn.proj"] = counting.linear_macs(t, c, c)
        out[f"blocks.{i}.mlp"] = counting.mlp_macs(t, c, cfg.hidden)
    out["head"] = counting.linear_macs(1, c, cfg.num_classes)
    return out


def elementwise(cfg: CastlingDeiTConfig, image_hw: Any = None) -> dict[str, int]:
    """Element ops per layer group (counting.py): norms, q/k normalisation, the constant term and sums,
    the output normalisation (official), GELU, residual additions."""
    macs(cfg, image_hw)  # validates
    c, t = cfg.embed_dim, cfg.tokens
    out = {"pos_embed": t * c}
    for i in range(cfg.depth):
        out[f"blocks.{i}.norms"] = 2 * t * c
        out[f"blocks.{i}.attn.qk_normalise"] = 2 * t * c
        out[f"blocks.{i}.attn.combine"] = 3 * t * c
        out[f"blocks.{i}.mlp.gelu"] = t * cfg.hidden
        out[f"blocks.{i}.residual"] = 2 * t * c
    out["norm"] = c
    return out


# ===================================================================================================
# Reduced configurations and registration
# ===================================================================================================

def reduced(cfg: CastlingDeiTConfig) -> CastlingDeiTConfig:
    """A small configuration with the same code path (preset and attention options kept): C = 64, 2 heads
    (head dim 32), depth 2, a non-square 32 x 48 image (4 x 6 patches + class token), 10 classes."""
    _check_cfg(cfg)
    return dataclasses.replace(cfg, embed_dim=64, depth=2, num_heads=2, img_size=(32, 48), patch_size=8,
                               num_classes=10)


#: Both presets have the same parameters; the registered config is the paper's setting.
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {}


def _deit_count(c: int, depth: int, tokens: int, heads: int, k: int, classes: int = 1000) -> int:
    block = 4 * c + (3 * c * c + 3 * c) + (c * c + c) + heads * k + (8 * c * c + 5 * c)
    return (3 * 256 * c + c) + c + tokens * c + depth * block + 2 * c + classes * c + classes


COUNT_GAPS: dict[str, counting.CountGap] = {
    "castling_deit_t": counting.CountGap(
        derived=_deit_count(192, 12, 197, 3, 9),
        arithmetic=("DeiT-T 5,717,416 (patch embed 147,648; cls 192; pos 197*192 = 37,824; 12 blocks x 444,864; "
                    "final LN 384; head 193,000) + 12 x (3, 1, 9, 1) token-conv weights = 12 x 27 = 324: "
                    "5,717,740 (5.72M)"),
        reason=("The paper prints 5.64M (Table 2), 0.08M below DeiT-T itself, whose true count is 5.72M (the same "
                "table lists DeiT-T as 5.6M).  Replacing DeiT's attention by the linear-angular attention adds "
                "only the conv branch (324 weights); no reading of 'DeiT with linear-angular attention' removes "
                "77K parameters (dropping the qkv biases removes 6,912, the position embedding 37,824).")),
    "castling_deit_b": counting.CountGap(
        derived=_deit_count(768, 12, 197, 12, 9),
        arithmetic=("DeiT-B 86,567,656 (patch embed 590,592; cls 768; pos 151,296; 12 blocks x 7,087,872; final "
                    "LN 1,536; head 769,000) + 12 x (12, 1, 9, 1) = 1,296: 86,568,952 (86.57M)"),
        reason=("The paper prints 87.22M (Table 2), 0.65M above DeiT-B (true count 86.57M; the table lists 86.3M). "
                "The attention's only new parameters are the 1,296 conv weights; a 0.65M gap would need e.g. a "
                "k x k depthwise conv over all 768 channels (9 x 9 gives 0.75M, 3 x 3 0.09M) that the paper does "
                "not describe, and Castling-DeiT-T's figure moves in the opposite direction.")),
}

_M = sys.modules[__name__]
register("castling_deit_t", CastlingDeiTConfig(), _M, paper_params_m=5.64, paper_source="Castling-ViT Table 2",
         paper_precision=2)
register("castling_deit_b", CastlingDeiTConfig(embed_dim=768, num_heads=12), _M, paper_params_m=87.22,
         paper_source="Castling-ViT Table 2", paper_precision=2)
