"""L2ViT's enhanced linear attention in DeiT-T: "DeiT-T + Enhanced Linear Attention" (L2ViT Appendix 9,
Table 11) and the all-enhanced DeiT-T of the attention ablation (Table 8) - the NumPy reference.

Reference: Zheng, "The Linear Attention Resurrection in Vision Transformer" (../shared/seeds/000_*.txt).

Shapes: B batch, C channels, H x W patch grid, N = H W patch tokens, T = N + 1 tokens (class token first).

The network is DeiT-T (Touvron et al. 2021; embed 192, depth 12, 3 heads, MLP ratio 4, 16 x 16 patches, class
token, absolute positional embedding, LayerNorm eps 1e-6, head on the class token) whose blocks are of two kinds,
``block_types[i]``:

    "S" (DeiT's block, untouched):     x <- x + SoftmaxAttn(LN_1 x);                          x <- x + MLP(LN_2 x)
    "E" (enhanced linear attention):   x <- x + EnhancedAttn(LN_1 x);  x <- x + LCM(LN_3 x);   x <- x + MLP(LN_2 x)

EnhancedAttn is L2ViT's attention layer (:func:`refimpl.attention.enhanced.enhanced_attention`: qkv, ReLU
features, Eq. 4 with the normaliser clamped at C_min = 1e2 (App. 8) and the learnable scale s of §4.2, proj),
and LCM the local concentration module (Eq. 6-7, Fig. 5: 7 x 7 depthwise conv, GELU, BN, 7 x 7 depthwise conv)
as the residual branch of Eq. 8, exactly as in L2ViT's LGA block but without the CPE: Table 8's DeiT ablation
is run "to avoid influence caused by other factors such as CPE" (§5.4), and DeiT keeps its absolute position
embedding.

**Which blocks** (Appendix 9, "Linear Attention on Vanilla ViT"): "To imitate the LWA (softmax attention) + LCA
(linear attention) layout of L2ViT, we keep attention in half of the blocks in DeiT-T/S/B, i.e., the 1st, 3rd,
5th, 7th, 9th, 11th block, untouched": ``block_types=None`` means "SE" repeated, blocks 1, 3, ..., 11 (1-based;
``blocks.0, 2, ..., 10``) softmax and blocks 2, 4, ..., 12 enhanced (``l2vit_deit_t``).  Table 8 ("we replace
the original softmax attention in DeiT-T with different attention mechanisms", "replace all vanilla softmax
attentions") is ``block_types="E" * 12`` (``l2vit_deit_t_all``).

**The class token and the LCM (our reading).**  The LCM is a 2-D depthwise convolution on the feature map:
Eq. 6-7 rearrange X into C x H x W, and Fig. 5's code reshapes the (B, N, C) tokens to (B, C, H, W) with N = H W,
which 197 tokens cannot fill.  The class token has no position on the 14 x 14 grid, so it cannot take part in
the convolution; the linear attention itself is a function of the token set and takes the class token like
any other token (as query and as key).  We therefore apply LN_3 to all T tokens (token-wise, so the class
token changes nothing for the patches), run the LCM on the N patch tokens on their H x W grid, and add its
output to the patch tokens only: the class token's LCM residual is zero (x_cls <- x_cls).  This is the
reading that keeps Eq. 8 unchanged for every patch token and keeps DeiT's class-token head; the paper does
not state it (its Fig. 5 LCM assumes N = H W) and no released code of the DeiT experiment exists.  The
alternatives - dropping the class token and mean-pooling (as FLatten-DeiT does) or padding the grid with the
class token - change DeiT itself or the convolution.  ``lcm_placement="attention"`` (LCM inside the attention
residual, the Eq. 5 reading) is refused: it would have to decide what the class token's attention output
becomes, which the paper says nothing about.

**Presets** (``preset``, passed to :meth:`refimpl.attention.enhanced.L2ViTConfig.preset`): "paper" (one
scalar s dividing K^T V, init sqrt(C)) or "official" (the released per-head temperature (h, 1, 1) multiplying
it, init d^-1/2).  The softmax blocks are DeiT's (scale d^-1/2, qkv bias).  ``order`` is the association
order of the enhanced core ("linear": phi(K)^T V first, O(N); "quadratic": the N x N matrix, O(N^2)).

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/l2vit_deit.py): "patch_embed.proj.weight",
"cls_token", "pos_embed", "blocks.0.attn.qkv.weight" (softmax), "blocks.1.attn.scale", "blocks.1.norm3.weight",
"blocks.1.local_mp.conv1.weight", "blocks.1.local_mp.bn.running_var", "norm.weight", "head.bias".

Parameter and MAC counts against Tables 8 and 11: :data:`COUNT_GAPS` and docs/models_l2vit_ravlt_lisanet.md
("L2ViT in DeiT-T").

References: L2ViT §4.1-4.2 (Eq. 4-8), §5.4 (Table 8), Appendix 8-10 (C_min, Fig. 5), Appendix 9 (Table 11);
DeiT (Touvron et al. 2021).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, validation
from ..attention import enhanced
from ..attention import softmax as _softmax
from . import _netparts as nets
from ._deit import (DeiTClassTokenGeometry, deit_feature_map, deit_head, deit_head_shapes, deit_stem, deit_stem_shapes,
                    deit_unit_input, deit_unit_names, e_deit_head, e_deit_stem)
from . import common, counting
from .common import Err
from .l2vit import _e_enhanced_attention
from .registry import register

__all__ = ["L2ViTDeiTConfig", "param_shapes", "init_params", "unit_names", "unit_parts", "run_unit",
           "run_unit_part", "run", "forward", "features", "unit_bound", "unit_part_bound", "forward_bounds", "macs",
           "elementwise", "reduced", "PAPER_COUNT_OVERRIDES", "COUNT_GAPS", "LCM_KERNEL_3",
           "deit_stem_shapes", "deit_head_shapes", "deit_stem", "deit_head", "e_deit_stem", "e_deit_head"]

_PRESETS = ("paper", "official")
_ORDERS = ("linear", "quadratic")


@dataclasses.dataclass(frozen=True)
class L2ViTDeiTConfig(DeiTClassTokenGeometry):
    """DeiT with L2ViT's enhanced linear attention in some blocks.  Every architectural choice is a field.

    embed_dim C, depth, num_heads h; block_types: one letter per block, "S" (DeiT's softmax attention) or "E"
    (enhanced linear attention + LCM), or None for "SE" repeated (Appendix 9: blocks 1, 3, ..., 11 untouched);
    img_size (H, W); patch_size; in_chans; num_classes; mlp_ratio; qkv_bias; layer_norm_eps (DeiT's 1e-6, every
    LayerNorm, norm3 included); batch_norm_eps (the LCM's BN); preset ("paper" | "official", the enhanced
    attention's); lcm_kernel (odd; Table 13 / Fig. 5: 7); c_min (App. 8: 1e2); order ("linear" |
    "quadratic"); block_overrides: further :class:`refimpl.attention.enhanced.L2ViTConfig` fields (mapping or
    pairs), e.g. {"scale_target": "similarity"}.
    """

    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    block_types: str | None = None
    img_size: Any = (224, 224)
    patch_size: int = config.DEIT_PATCH
    in_chans: int = 3
    num_classes: int = 1000
    mlp_ratio: float = config.NET_MLP_RATIO
    qkv_bias: bool = True
    layer_norm_eps: float = config.DEIT_LN_EPS
    batch_norm_eps: float = config.BATCH_NORM_EPS
    preset: str = "paper"
    lcm_kernel: int = config.L2VIT_LCM_KERNEL
    c_min: float = config.L2VIT_C_MIN
    order: str = "linear"
    block_overrides: Any = ()

    def __post_init__(self) -> None:
        """Stores img_size as (H, W) and block_overrides as sorted pairs; raises ValueError (TypeError for a wrong type)
        for an unknown preset or order, a size or count that is not a positive integer, mlp_ratio <= 0, a bad eps, an
        img_size that patch_size does not divide, block_types that are not one "S" / "E" per block, a block config
        refused, and lcm_placement "attention" (the class token has no place on the LCM's grid)."""
        object.__setattr__(self, "img_size", common.normalize_img_size(self.img_size))
        object.__setattr__(self, "block_overrides", common.normalize_overrides(self.block_overrides,
                                                                               "block_overrides"))
        if self.preset not in _PRESETS:
            raise ValueError(f"argument 'preset': expected one of {_PRESETS}, got {self.preset!r}")
        if self.order not in _ORDERS:
            raise ValueError(f"argument 'order': expected one of {_ORDERS}, got {self.order!r}")
        for name in ("embed_dim", "depth", "num_heads", "patch_size", "in_chans", "num_classes"):
            numerics.check_positive_int(getattr(self, name), name)
        validation.check_positive(self.mlp_ratio, "mlp_ratio")
        validation.check_eps(self.layer_norm_eps, "layer_norm_eps")
        validation.check_eps(self.batch_norm_eps, "batch_norm_eps")
        h, w = self.img_size
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"argument 'img_size': {self.img_size} must be a multiple of patch_size="
                             f"{self.patch_size} (the patch embedding does not pad)")
        if self.block_types is not None:
            bt = self.block_types
            if not isinstance(bt, str) or len(bt) != self.depth or set(bt) - {"S", "E"}:
                raise ValueError(f"argument 'block_types': expected None or a string of {self.depth} letters 'S' / "
                                 f"'E' (one per block), got {bt!r}")
        bc = self.block_config()  # validates heads, kernel, c_min, overrides
        if bc.lcm_placement != "residual":
            raise ValueError("argument 'block_overrides': lcm_placement='attention' is not supported in DeiT (the "
                             "class token's attention output would have no place on the LCM's grid); the "
                             "network uses Eq. 8's residual LCM")

    @property
    def kinds(self) -> str:
        """The block types, one letter per block ("SE" repeated when ``block_types`` is None)."""
        return self.block_types if self.block_types is not None else ("SE" * self.depth)[:self.depth]

    def block_config(self) -> enhanced.L2ViTConfig:
        """The :class:`refimpl.attention.enhanced.L2ViTConfig` of the enhanced blocks (its window and CPE
        fields are unused here)."""
        kw = dict(dim=self.embed_dim, num_heads=self.num_heads, lcm_kernel=self.lcm_kernel, c_min=self.c_min,
                  mlp_ratio=self.mlp_ratio, qkv_bias=self.qkv_bias, layer_norm_eps=self.layer_norm_eps,
                  batch_norm_eps=self.batch_norm_eps)
        kw.update(dict(self.block_overrides))
        return enhanced.L2ViTConfig.preset(self.preset, **kw)


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, L2ViTDeiTConfig):
        raise TypeError(f"argument 'cfg': expected L2ViTDeiTConfig, got {type(cfg).__name__}")


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def _enhanced_block_shapes(cfg: L2ViTDeiTConfig) -> dict[str, tuple[int, ...]]:
    """An enhanced block's entries: L2ViT's LGA block (enhanced.l2vit_param_shapes) without its CPE."""
    return {k: tuple(v) for k, v in enhanced.l2vit_param_shapes(cfg.block_config(), "lga").items()
            if not k.startswith("cpe.")}


def _softmax_block_shapes(cfg: L2ViTDeiTConfig) -> dict[str, tuple[int, ...]]:
    c = cfg.embed_dim
    s = dict(common.ln_shapes("norm1", c))
    s["attn.qkv.weight"] = (3 * c, c)
    if cfg.qkv_bias:
        s["attn.qkv.bias"] = (3 * c,)
    s.update({"attn.proj.weight": (c, c), "attn.proj.bias": (c,)})
    s.update(common.ln_shapes("norm2", c))
    s.update(common.mlp_shapes("mlp", c, cfg.hidden))
    return s


def param_shapes(cfg: L2ViTDeiTConfig) -> dict[str, tuple[int, ...]]:
    """Every float state_dict entry (the LCM's BatchNorm statistics included) and its shape."""
    _check_cfg(cfg)
    s = deit_stem_shapes(cfg, cls_token=True)
    kinds = {"S": _softmax_block_shapes(cfg), "E": _enhanced_block_shapes(cfg)}
    for i, kind in enumerate(cfg.kinds):
        s.update({f"blocks.{i}.{k}": v for k, v in kinds[kind].items()})
    s.update(deit_head_shapes(cfg))
    return s


def init_params(cfg: L2ViTDeiTConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Fresh float64 parameters (models._netparts.init_params_from_shapes: BN running variances positive), the
    scale s at the paper's init sqrt(C) (Appendix 7) and the released temperature at d^-1/2.  For tests, docs
    and benchmarks; not the paper's training initialisation."""
    c, d = cfg.embed_dim, cfg.embed_dim // cfg.num_heads
    special = {"attn.scale": lambda shp, r: np.full(shp, math.sqrt(c)),
               "attn.temperature": lambda shp, r: np.full(shp, d ** -0.5)}
    return nets.init_params_from_shapes(param_shapes(cfg), np.random.default_rng(rng), special=special)


# ===================================================================================================
# Forward, unit by unit ("stem", "blocks.i", "head"; unit values are tokens (B, T, C))
# ===================================================================================================

def _check_params(params: Any, cfg: L2ViTDeiTConfig) -> Mapping[str, Any]:
    return common.check_network_params(params, cfg, param_shapes, "L2ViT-DeiT network")


def unit_names(cfg: L2ViTDeiTConfig) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    return deit_unit_names(cfg)


def _kind(name: str, cfg: L2ViTDeiTConfig) -> str:
    return cfg.kinds[int(name.split(".")[1])]


def unit_parts(cfg: L2ViTDeiTConfig, name: str) -> tuple[str, ...]:
    """The residual branches a block unit is made of, in order: "attn" (x + attn(LN1 x)), for an enhanced
    block "lcm" (x + LCM(LN3 x) on the patch tokens), then "mlp" (x + MLP(LN2 x)); stem and head: ()."""
    nets.check_unit(_M, name, cfg)
    if not name.startswith("blocks."):
        return ()
    return ("attn", "lcm", "mlp") if _kind(name, cfg) == "E" else ("attn", "mlp")


def _unit_input(name: str, x: Any, cfg: L2ViTDeiTConfig, part: str | None = None) -> np.ndarray:
    """Images for "stem", else the tokens (B, T, C) with the class token first."""
    return deit_unit_input(name, x, cfg, cls_token=True)


def _softmax_attention(y: np.ndarray, p: Mapping[str, Any], heads: int) -> np.ndarray:
    """DeiT's attention: qkv, softmax(q k^T d^-1/2) v per head, heads merged, proj."""
    b, n, c = y.shape
    qkv = layers.linear(y, p["qkv.weight"], p.get("qkv.bias")).reshape(b, n, 3, heads, c // heads)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    o = _softmax.softmax_attention(q, k, v)
    return layers.linear(o.transpose(0, 2, 1, 3).reshape(b, n, c), p["proj.weight"], p["proj.bias"])


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: L2ViTDeiTConfig) -> np.ndarray:
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], eps)
        ap = layers.subparams(p, "attn")
        if _kind(name, cfg) == "E":
            return x + enhanced.enhanced_attention(y, ap, cfg.block_config(), order=cfg.order)
        return x + _softmax_attention(y, ap, cfg.num_heads)
    if part == "lcm":   # Eq. 8 on the patch tokens; the class token's LCM residual is zero (module docstring)
        y = layers.layer_norm(x, p["norm3.weight"], p["norm3.bias"], eps)
        out = enhanced.lcm(y[:, 1:], layers.subparams(p, "local_mp"), cfg.grid, batch_norm_eps=cfg.batch_norm_eps)
        return np.concatenate([x[:, :1], x[:, 1:] + out], axis=1)
    return x + common.mlp2d(layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], eps), layers.subparams(p, "mlp"))


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: L2ViTDeiTConfig) -> np.ndarray:
    """One unit: "stem" (images (B, 3, H, W) -> tokens (B, T, C): patch embedding, class token first,
    + positional embedding), "blocks.i" (tokens -> tokens: its parts in order) or "head" (tokens -> logits
    (B, num_classes): LayerNorm, the class token, linear).

    References
    ----------
    L2ViT Eq. 4-8, Appendix 9 (Table 11), §5.4 (Table 8); DeiT.
    """
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    if name == "stem":
        return deit_stem(params, x, cfg, cls_token=True)
    if name == "head":
        return deit_head(params, x, cfg, cls_token=True)
    for part in unit_parts(cfg, name):
        x = _part(params, name, part, x, cfg)
    return x


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: L2ViTDeiTConfig) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order."""
    return nets.run_part(_M, params, name, part, x, cfg)


def _feature_map(name: str, y: np.ndarray, cfg: L2ViTDeiTConfig) -> np.ndarray | None:
    return deit_feature_map(name, y, cfg, cls_token=True)


def run(params: Mapping[str, Any], images: Any, cfg: L2ViTDeiTConfig, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and the feature map in one pass; taps (dict or None) records every unit's output."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: L2ViTDeiTConfig) -> np.ndarray:
    """Class logits (B, num_classes) of DeiT with enhanced linear attention.

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`).
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`L2ViTDeiTConfig`.

    References
    ----------
    L2ViT Appendix 9 (Table 11), §5.4 (Table 8), Eq. 4-8; DeiT.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: L2ViTDeiTConfig) -> list[np.ndarray]:
    """The single stage's feature map: the last block's patch tokens (class token dropped) on the grid,
    before the final LayerNorm, channels-first (B, C, H / 16, W / 16).  References: DeiT; L2ViT Table 11."""
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (for the equivalence suite; refimpl.models.common's running first-order convention)
# ===================================================================================================

def _e_softmax_attention(t: Err, p: Mapping[str, Any], heads: int) -> Err:
    """:func:`_softmax_attention` with an input error: qkv by e_linear, the core by
    :func:`refimpl.attention.softmax.softmax_attention_error` with the q, k, v errors (depth as
    common.e_window_attention counts it), proj by e_linear."""
    b, n, c = t.value.shape
    d = c // heads
    qkv = common.e_linear(t, p["qkv.weight"], p.get("qkv.bias"))

    def split(a):
        return a.reshape(b, n, 3, heads, d).transpose(2, 0, 3, 1, 4)

    q, k, v = split(qkv.value)
    eq, ek, ev = split(qkv.err)
    o = _softmax.softmax_attention(q, k, v)
    with np.errstate(invalid="ignore", over="ignore"):
        eo = _softmax.softmax_attention_error(q, k, v, err_q=eq, err_k=ek, err_v=ev)

    def merge(a):
        return a.transpose(0, 2, 1, 3).reshape(b, n, c)

    depth = d + n + 2 * config.ELEMENTARY_FUNCTION_ULPS + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4
    return common.e_linear(Err(merge(o), merge(eo), qkv.depth + depth), p["proj.weight"], p.get("proj.bias"))


def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: L2ViTDeiTConfig, dtype: Any) -> Err:
    """:func:`_part` with the running error analysis."""
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], eps, cap=dtype)
        ap = layers.subparams(p, "attn")
        if _kind(name, cfg) == "E":
            return common.e_add(t, _e_enhanced_attention(y, ap, cfg.block_config(), cfg.order, dtype))
        return common.e_add(t, _e_softmax_attention(y, ap, cfg.num_heads))
    if part == "lcm":
        y = common.e_layer_norm(t, p["norm3.weight"], p["norm3.bias"], eps, cap=dtype)
        v, e, k = enhanced._err_lcm(y.value[:, 1:], y.err[:, 1:], layers.subparams(p, "local_mp"), cfg.grid,
                                    cfg.batch_norm_eps)
        s = common.e_add(Err(t.value[:, 1:], t.err[:, 1:], t.depth), Err(v, e, y.depth + k))
        return Err(np.concatenate([t.value[:, :1], s.value], axis=1), np.concatenate([t.err[:, :1], s.err], axis=1),
                   s.depth)
    return common.e_add(t, common.e_mlp(common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], eps, cap=dtype),
                                        layers.subparams(p, "mlp")))


def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: L2ViTDeiTConfig, dtype: Any) -> Err:
    if name == "stem":
        return e_deit_stem(params, t, cfg, cls_token=True)
    if name == "head":
        return e_deit_head(params, t, cfg, dtype, cls_token=True)
    for part in unit_parts(cfg, name):
        t = _e_part(params, name, part, t, cfg, dtype)
    return t


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: L2ViTDeiTConfig, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: L2ViTDeiTConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: L2ViTDeiTConfig, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` from exact images and params
    (rigorous to first order, loose through depth; :func:`unit_bound` restarts at each unit)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate and element-op counts (refimpl.models.counting's convention)
# ===================================================================================================

def macs(cfg: L2ViTDeiTConfig, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention).  Every block: qkv and
    proj on the T tokens, the MLP.  Softmax blocks: Q K^T and A V (2 h T^2 d).  Enhanced blocks, linear
    order: phi(K)^T V and phi(Q) (phi(K)^T V) (2 h T d^2) and the normaliser's dot products (h T d);
    quadratic order: the T x T products (2 h T^2 d) and the normaliser (h T d); the LCM's two k x k depthwise
    convolutions on the H x W patch grid (2 N C k^2)."""
    _check_cfg(cfg)
    common.check_image_hw(cfg.img_size, image_hw)
    c, t, h = cfg.embed_dim, cfg.tokens, cfg.num_heads
    d = c // h
    out = {"patch_embed": counting.conv2d_macs(cfg.grid, cfg.in_chans, c, (cfg.patch_size, cfg.patch_size))}
    for i, kind in enumerate(cfg.kinds):
        p = f"blocks.{i}"
        out[f"{p}.attn.qkv"] = counting.linear_macs(t, c, 3 * c)
        if kind == "S":
            out[f"{p}.attn.core"] = counting.softmax_attention_macs(h, t, t, d)
        elif cfg.order == "linear":
            out[f"{p}.attn.core"] = counting.linear_attention_macs(h, t, t, d)
        else:
            out[f"{p}.attn.core"] = counting.softmax_attention_macs(h, t, t, d) + counting.matmul_macs(h, t, d, 1)
        out[f"{p}.attn.proj"] = counting.linear_macs(t, c, c)
        if kind == "E":
            out[f"{p}.lcm"] = 2 * counting.depthwise_conv2d_macs(cfg.grid, c, (cfg.lcm_kernel,) * 2)
        out[f"{p}.mlp"] = counting.mlp_macs(t, c, cfg.hidden)
    out["head"] = counting.linear_macs(1, c, cfg.num_classes)
    return out


def elementwise(cfg: L2ViTDeiTConfig, image_hw: Any = None) -> dict[str, int]:
    """Element ops per layer group (counting.py): positional embedding, norms (3 in an enhanced block), the
    softmax's exp or the ReLU features and the clamp / division, the LCM's GELU and BN, GELU of the MLP,
    residual additions, the final norm."""
    macs(cfg, image_hw)  # validates
    c, t, h = cfg.embed_dim, cfg.tokens, cfg.num_heads
    n = cfg.grid[0] * cfg.grid[1]
    out = {"pos_embed": t * c}
    for i, kind in enumerate(cfg.kinds):
        p = f"blocks.{i}"
        out[f"{p}.norms"] = (3 if kind == "E" else 2) * t * c
        if kind == "S":
            out[f"{p}.attn.softmax"] = h * t * t
        else:
            out[f"{p}.attn.features"] = 2 * t * c
            out[f"{p}.attn.normalise"] = 2 * t * c
            out[f"{p}.lcm.gelu_bn"] = 2 * n * c
        out[f"{p}.mlp.gelu"] = t * cfg.hidden
        out[f"{p}.residual"] = 2 * t * c + (n * c if kind == "E" else 0)
    out["norm"] = c
    return out


# ===================================================================================================
# Reduced configuration, counts against the paper, registration
# ===================================================================================================

def reduced(cfg: L2ViTDeiTConfig) -> L2ViTDeiTConfig:
    """A small configuration on the same code path with both block types (preset, order and block options
    kept): C = 64, 2 heads (head dim 32, as the other DeiT families' reduced configs), depth 2 ("SE": a softmax block, then an enhanced one), a
    non-square 32 x 48 image (4 x 6 patches + class token), LCM kernel 3 (a 7 x 7 kernel would see the whole
    4 x 6 grid from every patch), 10 classes.  Every registered variant reduces to it."""
    _check_cfg(cfg)
    return dataclasses.replace(cfg, embed_dim=64, depth=2, num_heads=2, block_types="SE", img_size=(32, 48),
                               patch_size=8, lcm_kernel=3, num_classes=10)


#: The registered default (paper preset) is the setting compared; the official preset differs by two
#: parameters per enhanced block (three temperatures instead of one scale).
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {}

#: The printed counts are reproduced by a 3 x 3 LCM (tests/test_paper_counts.py); recorded, not registered:
#: the paper states no LCM kernel for the DeiT experiments, and 7 x 7 is the only one it gives for its
#: enhanced linear attention (Table 13, Fig. 5, Table 6's caption).
LCM_KERNEL_3 = {"lcm_kernel": 3}

_DEIT_T = 5_717_416     # DeiT-T: patch embed 147,648; cls 192; pos 37,824; 12 x 444,864; final LN 384; head 193,000
_ENHANCED_EXTRA = 1 + 2 * 192 + 2 * (49 * 192 + 192) + 2 * 192   # s, norm3, LCM convs, LCM BN = 19,969

COUNT_GAPS: dict[str, counting.CountGap] = {
    "l2vit_deit_t": counting.CountGap(
        derived=_DEIT_T + 6 * _ENHANCED_EXTRA,
        arithmetic=("DeiT-T 5,717,416 + 6 enhanced blocks x (scale s 1 + norm3 2*192 = 384 + LCM two 7x7 depthwise "
                    "convs 2*(49*192 + 192) = 19,200 + LCM BN 2*192 = 384) = 6 x 19,969 = 119,814: 5,837,230 "
                    "(5.84M)"),
        reason=("Table 11 prints 5.7M for DeiT-T + Enhanced Linear Attention, the same as DeiT-T itself.  The "
                "enhanced attention has DeiT's qkv and proj; what it adds per block is s (1), norm3 (384) and the "
                "LCM (19,584 with 7x7 kernels, Table 13 / Fig. 5).  No reading of the block removes enough: "
                "without norm3 5,834,926, without norm3 and the LCM's BN 5,832,622 (5.83M).  A 3x3 LCM (6 x 4,609 "
                "= 27,654: 5,745,070) would print 5.7M; the paper gives no LCM kernel for DeiT.")),
    "l2vit_deit_t_all": counting.CountGap(
        derived=_DEIT_T + 12 * _ENHANCED_EXTRA,
        arithmetic=("DeiT-T 5,717,416 + 12 enhanced blocks x 19,969 = 239,628: 5,957,044 (5.96M)"),
        reason=("Table 8 prints 5.8M for DeiT-T with every attention enhanced.  With 7x7 LCMs the twelve "
                "enhanced blocks add 239,628 parameters (6.0M); a 3x3 LCM (12 x 4,609 = 55,308: 5,772,724) "
                "would print 5.8M, the same kernel that reproduces Table 11's 5.7M.")),
}

_M = sys.modules[__name__]
register("l2vit_deit_t", L2ViTDeiTConfig(), _M, paper_params_m=5.7, paper_source="L2ViT Table 11",
         paper_precision=1)
register("l2vit_deit_t_all", L2ViTDeiTConfig(block_types="E" * 12), _M, paper_params_m=5.8,
         paper_source="L2ViT Table 8", paper_precision=1)
