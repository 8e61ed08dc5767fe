"""RALA in DeiT-T, Swin-T and Swin-S: "Ours" of RALA Table 8 ("Comparison with Other Linear Attention",
§4.5) - the NumPy reference.

Reference: Fan, Huang, He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_*.txt).  §4.5: "For a fair comparison with other linear attention mechanisms, similar to
FLatten-Transformer [23], we use the DeiT-T [53], Swin-T, and Swin-S [43] network architectures, replacing their
attention mechanisms with linear attention mechanisms."  Table 8 prints for "Ours" 6M / 1.1G (DeiT-T setting),
29M / 4.5G (Swin-T), 50M / 8.7G (Swin-S).  No code of these variants was released; every reading below is
ours, argued from the paper (docs/models_l2vit_ravlt_lisanet.md, "RALA in DeiT-T, Swin-T and Swin-S").

Shapes: B batch, C channels, H x W token grid, N = H W tokens (row-major), h heads.

**The attention** (both networks): RALA's layer as the paper defines it, ``RALAConfig.preset("paper")``
(:func:`refimpl.attention.rala.rala_attention`): kappa = ELU + 1 and phi a linear projection (§3.2, "Design of
the block"), alpha of Eq. 4 in the KV buffer of Eq. 3, the output Eq. 6 with Eq. 2's normaliser; no RoPE, no
LePE, no output projection (none is in §3; they are the released RAVLT code's, ``preset="official"``, offered as
the option it is).  It takes the place of DeiT's / Swin's whole attention module (qkv, core, proj): RALA's phi
gate is a C x C linear map like the proj it replaces, so a RALA layer has exactly the weights of a softmax
attention layer without its relative-position table.  The RAVLT block's CPE (§3.2) is not added: Table 8 replaces
"their attention mechanisms", and the block (LN, attention, LN, MLP) stays DeiT's / Swin's (as
:mod:`refimpl.models.l2vit_deit` does for L2ViT's DeiT experiment).

**DeiT-T** (embed 192, depth 12, 3 heads, MLP ratio 4, 16 x 16 patches, LayerNorm eps 1e-6): *no class token*;
the positional embedding covers the N = 196 patch tokens and the head mean-pools them (FLatten-DeiT's layout,
:mod:`refimpl.models.flatten`).  The paper says so twice: its DeiT-T analyses have N = 196 tokens per layer
("All experiments are conducted based on the DeiT-T architecture, with N = 196 and d = 64", Fig. 2; "Under the
DeiT-T setting, we analyze the rank of different layers of our model (12 layers in total, with each layer's
feature matrix having a shape of N = 196, d = 64", §4.6, Fig. 8), and it follows FLatten, whose DeiT has no
class token.  RALA's Q_g and alpha (Eq. 4) then range over the patch tokens only, and the 2-D operators of the
official preset (RoPE, LePE) have the 14 x 14 grid to themselves.

**Swin-T / Swin-S** (embed 96, depths (2, 2, 6, 2) / (2, 2, 18, 2), heads (3, 6, 12, 24), window 7, patch 4):
RALA in stages 1-2, Swin's shifted-window softmax attention in stages 3-4 (``attn_types="LLSS"``), as
FLatten-Swin, whose "Ours" row of FLatten Table 3b RALA Table 8 reprints for Focused Linear Attn (82.1%, 4.5G;
FLatten Appendix D: "only adopt our module at early stages of Swin", FLatten Table 7).  RALA is *global* over
the stage grid (56 x 56, 28 x 28 at 224^2): FLatten's Swin sets its linear windows to the whole stage-1 grid
(56 at 224^2, 96 at 384^2), so at 224^2 its stages 1-2 are global too, and Eq. 2-4 sum over all N tokens
(Q_g is "the global query").  No shift, no padding in the RALA stages; the softmax stages follow Swin's window
rule (:func:`refimpl.models.common.swin_window`) and masking (``window_preset``: "swin", or Swin's released
"swin_official" with ``preset="official"``, as FLatten-Swin).

**Presets** (``preset``): "paper" (above; the registered setting) or "official" (RALA's released layer,
``RALAConfig.preset("official")``: fused qkvo 1 x 1 conv with the gate, RoPE on the numerator, 5 x 5 LePE,
output projection, d^-1/2 and kappa(Q) in alpha, (HW)^-1/2 scaling, eps; channels-first 1 x 1 conv weights).
``attn_overrides``: further :class:`RALAConfig` fields (e.g. ``{"order": "quadratic"}``).

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/rala_variants.py): DeiT "patch_embed.proj.weight",
"pos_embed", "blocks.3.attn.qkv.weight", "blocks.3.attn.phi.weight", "norm.weight", "head.bias"; Swin
"patch_embed.norm.weight", "layers.0.blocks.1.attn.phi.bias", "layers.2.blocks.1.attn.relative_position_bias_table",
"layers.0.downsample.reduction.weight".

Parameter and MAC counts against Table 8: :data:`COUNT_GAPS`, tests/test_paper_counts.py and the docs section.

References: RALA §3.2 (Eq. 2-6, kappa, phi), §4.5 (Table 8), §4.6 (Fig. 8), Fig. 2; FLatten Appendix D, Tables
3, 7; DeiT (Touvron et al. 2021); Swin (Liu et al. 2021) §3.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention import rala
from . import _netparts as nets
from . import common, counting
from .common import Err
from . import flatten as _flatten
from ._deit import (DeiTGeometry, block_shapes, deit_feature_map, deit_head, deit_head_shapes, deit_stem,
                    deit_stem_shapes, deit_unit_input, deit_unit_names, e_deit_head, e_deit_stem)
from .ravlt_bounds import _e_attention as _e_rala_attention
from .registry import register

__all__ = ["RALADeiTConfig", "RALASwinConfig", "param_shapes", "init_params", "unit_names", "unit_parts", "run_unit",
           "run_unit_part", "run", "forward", "features", "unit_bound", "unit_part_bound", "forward_bounds", "macs",
           "elementwise", "reduced", "PAPER_COUNT_OVERRIDES", "COUNT_GAPS"]



def _check_common(cfg: Any) -> None:
    _flatten._check_common(cfg, pad_note="")


def _rala_config(cfg: Any, dim: int, heads: int) -> rala.RALAConfig:
    return rala.RALAConfig.preset(cfg.preset, dim=dim, num_heads=heads, qkv_bias=cfg.qkv_bias,
                                  **dict(cfg.attn_overrides))


@dataclasses.dataclass(frozen=True)
class RALADeiTConfig(DeiTGeometry):
    """DeiT-T with RALA in every block, no class token (RALA Table 8, DeiT-T setting).

    embed_dim C, depth, num_heads h; img_size (H, W); patch_size; in_chans; num_classes; mlp_ratio; qkv_bias (of
    RALA's projections); layer_norm_eps (DeiT's 1e-6); preset ("paper" | "official", RALA's layer);
    attn_overrides: further :class:`refimpl.attention.rala.RALAConfig` fields (mapping or pairs).
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
    attn_overrides: Any = ()

    def __post_init__(self) -> None:
        """The checks shared with FLatten's DeiT / Swin configs (:func:`_check_common`: img_size to (H, W), overrides to
        pairs, preset, sizes, patch grid, mlp_ratio, eps), a positive depth and the RALA config (heads, overrides);
        ValueError / TypeError on a refused field."""
        _check_common(self)
        numerics.check_positive_int(self.depth, "depth")
        self.attention_config()   # validates heads and overrides

    def attention_config(self) -> rala.RALAConfig:
        """The :class:`refimpl.attention.rala.RALAConfig` of every block: the preset's, at C and h with the network's
        qkv_bias, then ``attn_overrides``."""
        return _rala_config(self, self.embed_dim, self.num_heads)


@dataclasses.dataclass(frozen=True)
class RALASwinConfig(_flatten._SwinStages):
    """Swin with RALA in some stages (RALA Table 8, Swin-T / Swin-S settings).

    embed_dim C (stage i has C 2^i channels), depths, num_heads (per stage), attn_types ("L" global RALA /
    "S" Swin's shifted-window softmax attention, per stage; "LLSS" as FLatten-Swin), window_size (softmax
    stages), img_size, patch_size, in_chans, num_classes, mlp_ratio, qkv_bias, layer_norm_eps, preset,
    attn_overrides (as :class:`RALADeiTConfig`), window_preset (None: "swin" for preset "paper",
    "swin_official" for "official"; see refimpl.attention.softmax).
    """

    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    attn_types: str = "LLSS"
    window_size: int = config.SWIN_WINDOW
    img_size: Any = (224, 224)
    patch_size: int = config.SWIN_PATCH
    in_chans: int = 3
    num_classes: int = 1000
    mlp_ratio: float = config.NET_MLP_RATIO
    qkv_bias: bool = True
    layer_norm_eps: float = config.SWIN_LN_EPS
    preset: str = "paper"
    attn_overrides: Any = ()
    window_preset: str | None = None

    def __post_init__(self) -> None:
        """The shared Swin checks (:meth:`_SwinStages._check_stages`) and the RALA config of every "L" stage;
        ValueError / TypeError on a refused field."""
        self._check_stages(_check_common)
        for i in range(self.n_stages):
            if self.attn_types[i] == "L":
                self.attention_config(i)

    @property
    def stage_windows(self) -> list[tuple[int, int]]:
        """(window, shift of the odd blocks) per softmax stage (Swin's rule, common.swin_window); a RALA stage
        is global: (0, 0)."""
        return [common.swin_window(g, self.window_size) if t == "S" else (0, 0)
                for g, t in zip(self.stage_grids, self.attn_types)]

    def attention_config(self, i: int) -> rala.RALAConfig:
        """The :class:`refimpl.attention.rala.RALAConfig` of stage ``i``'s RALA blocks: the preset's, at C 2^i and the
        stage's heads with the network's qkv_bias, then ``attn_overrides``."""
        return _rala_config(self, self.stage_dim(i), self.num_heads[i])


def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, (RALADeiTConfig, RALASwinConfig)):
        raise TypeError(f"argument 'cfg': expected RALADeiTConfig or RALASwinConfig, got {type(cfg).__name__}")


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def param_shapes(cfg: RALADeiTConfig | RALASwinConfig) -> dict[str, tuple[int, ...]]:
    """Every state_dict key and shape of the network, from the config alone (nothing allocated)."""
    _check_cfg(cfg)
    if isinstance(cfg, RALADeiTConfig):
        s = deit_stem_shapes(cfg, cls_token=False)
        attn = rala.rala_param_shapes(cfg.attention_config())
        for i in range(cfg.depth):
            s.update(block_shapes(f"blocks.{i}", cfg.embed_dim, cfg.hidden, attn))
        s.update(deit_head_shapes(cfg))
        return s
    return _flatten._swin_param_shapes(cfg, lambda i, ws: rala.rala_param_shapes(cfg.attention_config(i)))


def init_params(cfg: RALADeiTConfig | RALASwinConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Fresh float64 parameters keyed like the twin's state_dict (models._netparts.init_params_from_shapes:
    matrices N(0, 1/fan_in), norm weights near 1).  For tests, docs and benchmarks; not a training init."""
    return nets.init_params_from_shapes(param_shapes(cfg), np.random.default_rng(rng))


# ===================================================================================================
# Forward, unit by unit.  Units: "stem", "blocks.i" (DeiT) / "layers.i.blocks.j", "layers.i.downsample" (Swin),
# "head".  Unit values: DeiT tokens (B, N, C); Swin grids channels-last (B, H, W, C).
# ===================================================================================================

def _check_params(params: Any, cfg: Any) -> Mapping[str, Any]:
    kind = "RALA-DeiT" if isinstance(cfg, RALADeiTConfig) else "RALA-Swin"
    return common.check_network_params(params, cfg, param_shapes, f"{kind} network")


def unit_names(cfg: RALADeiTConfig | RALASwinConfig) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    return deit_unit_names(cfg) if isinstance(cfg, RALADeiTConfig) else _flatten._swin_unit_names(cfg)


def unit_parts(cfg: RALADeiTConfig | RALASwinConfig, name: str) -> tuple[str, ...]:
    """The residual branches of a block unit, in order: "attn" (x + attn(LN1 x)), "mlp" (x + MLP(LN2 x));
    other units: ()."""
    nets.check_unit(_M, name, cfg)
    return ("attn", "mlp") if ".blocks." in f".{name}" else ()


def _unit_input(name: str, x: Any, cfg: Any, part: str | None = None) -> np.ndarray:
    """Images for "stem", else DeiT tokens (B, N, C) / the Swin grid of the unit's stage (B, H_i, W_i, C_i)."""
    if isinstance(cfg, RALADeiTConfig):
        return deit_unit_input(name, x, cfg, cls_token=False)
    return _flatten._swin_unit_input(name, x, cfg)


def _rala_on_grid(y: np.ndarray, p: Mapping[str, Any], acfg: rala.RALAConfig) -> np.ndarray:
    """RALA's layer on a channels-last grid (B, H, W, C), in the layer's own layout."""
    if acfg.layout == "tokens":
        return rala.rala_attention(y, p, acfg)
    return rala.rala_attention(np.ascontiguousarray(y.transpose(0, 3, 1, 2)), p, acfg).transpose(0, 2, 3, 1)


def _attention(y: np.ndarray, p: Mapping[str, Any], name: str, cfg: Any) -> np.ndarray:
    """The attention of block ``name`` on its LayerNorm output (DeiT tokens / Swin grid)."""
    if isinstance(cfg, RALADeiTConfig):
        b, n, c = y.shape
        return _rala_on_grid(y.reshape(b, *cfg.grid, c), p, cfg.attention_config()).reshape(b, n, c)
    i, j = _flatten._parse(name)
    if cfg.attn_types[i] == "L":
        return _rala_on_grid(y, p, cfg.attention_config(i))
    ws, sh = cfg.stage_windows[i]
    return _flatten._softmax_window(y, p, cfg, i, ws, sh if j % 2 else 0)


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: Any) -> np.ndarray:
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], eps)
        return x + _attention(y, layers.subparams(p, "attn"), name, cfg)
    return x + common.mlp2d(layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], eps), layers.subparams(p, "mlp"))


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: RALADeiTConfig | RALASwinConfig) -> np.ndarray:
    """One unit: "stem" (images (B, 3, H, W) -> DeiT tokens (B, N, C): patch embedding + positional embedding,
    no class token / Swin grid (B, H/4, W/4, C): patch embedding + LayerNorm), a block (its parts in order),
    "layers.i.downsample" (Swin's patch merging) or "head" (LayerNorm, mean over the tokens, linear).

    References
    ----------
    RALA Eq. 2-6, §4.5 (Table 8); DeiT; Swin §3; FLatten Appendix D (the DeiT layout, the stages with linear
    attention).
    """
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    if name == "stem":
        if isinstance(cfg, RALADeiTConfig):
            return deit_stem(params, x, cfg, cls_token=False)
        return _flatten._swin_stem(params, x, cfg)
    if name == "head":
        if isinstance(cfg, RALADeiTConfig):
            return deit_head(params, x, cfg, cls_token=False)
        return _flatten._swin_head(params, x, cfg)
    if name.endswith("downsample"):
        return common.patch_merging2d(x, layers.subparams(params, name), cfg.layer_norm_eps)
    for part in unit_parts(cfg, name):
        x = _part(params, name, part, x, cfg)
    return x


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any,
                  cfg: RALADeiTConfig | RALASwinConfig) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order."""
    return nets.run_part(_M, params, name, part, x, cfg)


def _feature_map(name: str, y: np.ndarray, cfg: Any) -> np.ndarray | None:
    """The stage feature map (B, C, H, W) if unit ``name`` ends a stage, else None."""
    if isinstance(cfg, RALADeiTConfig):
        return deit_feature_map(name, y, cfg, cls_token=False)
    return _flatten._swin_feature_map(name, y, cfg)


def run(params: Mapping[str, Any], images: Any, cfg: RALADeiTConfig | RALASwinConfig, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and per-stage feature maps in one pass; taps (dict or None) records every unit's output."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: RALADeiTConfig | RALASwinConfig) -> np.ndarray:
    """Class logits (B, num_classes) of RALA-DeiT / RALA-Swin.

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`).
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`RALADeiTConfig` or :class:`RALASwinConfig`.

    References
    ----------
    RALA Eq. 2-6, §4.5 (Table 8); DeiT; Swin §3.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: RALADeiTConfig | RALASwinConfig) -> list[np.ndarray]:
    """Per-stage feature maps, channels-first: DeiT one (the last block's tokens on the grid, before the final
    LayerNorm), Swin four (each stage's output before patch merging)."""
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (refimpl.models.common's running first-order convention; RALA through models.ravlt_bounds's adapter
# of RALA's own error model)
# ===================================================================================================

def _e_attention(y: Err, p: Mapping[str, Any], name: str, cfg: Any, dtype: Any) -> Err:
    if isinstance(cfg, RALADeiTConfig):
        return _e_rala_attention(y, p, cfg.attention_config(), cfg.grid, "rala", dtype)
    i, j = _flatten._parse(name)
    if cfg.attn_types[i] == "L":
        b, h, w, c = y.value.shape
        tok = Err(y.value.reshape(b, h * w, c), y.err.reshape(b, h * w, c), y.depth)
        a = _e_rala_attention(tok, p, cfg.attention_config(i), (h, w), "rala", dtype)
        return Err(a.value.reshape(b, h, w, c), a.err.reshape(b, h, w, c), a.depth)
    ws, sh = cfg.stage_windows[i]
    return _flatten._e_softmax_window(y, p, cfg, i, ws, sh if j % 2 else 0)


def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: Any, dtype: Any) -> Err:
    """:func:`_part` with the running error analysis."""
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "attn":
        y = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], eps, cap=dtype)
        return common.e_add(t, _e_attention(y, layers.subparams(p, "attn"), name, cfg, dtype))
    return common.e_add(t, common.e_mlp(common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], eps, cap=dtype),
                                        layers.subparams(p, "mlp")))


def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: Any, dtype: Any) -> Err:
    eps = cfg.layer_norm_eps
    deit = isinstance(cfg, RALADeiTConfig)
    if name == "stem":
        if deit:
            return e_deit_stem(params, t, cfg, cls_token=False)
        return _flatten._e_swin_stem(params, t, cfg, dtype, capped=True)
    if name == "head":
        if deit:
            return e_deit_head(params, t, cfg, dtype, cls_token=False)
        return _flatten._e_swin_head(params, t, cfg, dtype, capped=True)
    if name.endswith("downsample"):
        return common.e_patch_merging(t, layers.subparams(params, name), eps)
    for part in unit_parts(cfg, name):
        t = _e_part(params, name, part, t, cfg, dtype)
    return t


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any,
                    cfg: RALADeiTConfig | RALASwinConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: RALADeiTConfig | RALASwinConfig, *,
               dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: RALADeiTConfig | RALASwinConfig, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` from exact images and params
    (rigorous to first order, loose through depth; :func:`unit_bound` restarts at each unit)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate and element-op counts (refimpl.models.counting's convention)
# ===================================================================================================

def _rala_macs(out: dict[str, int], prefix: str, a: rala.RALAConfig, hw: tuple[int, int]) -> None:
    """RALA's layer as models.ravlt.macs counts it: the projections (qkv and the gate phi: 4 N C^2), the core
    in the linear order (K^T V and Q (K^T V): 2 N d^2 per head; the normaliser N d per head; the alpha scores
    Q_g kappa(K_j)^T N d per head) or the quadratic order (2 N^2 d + N d per head), LePE, output projection."""
    n, c, h = hw[0] * hw[1], a.dim, a.num_heads
    d = c // h
    nproj = 4 if (a.gate_source == "qkvo" or a.gate == "linear") else 3
    out[f"{prefix}.qkv_gate"] = counting.linear_macs(n, c, nproj * c)
    core = (counting.linear_attention_macs(h, n, n, d) if a.order == "linear" else
            counting.softmax_attention_macs(h, n, n, d) + counting.matmul_macs(h, n, d, 1))
    if a.reweight:
        core += counting.matmul_macs(h, 1, d, n)
    out[f"{prefix}.core"] = core
    if a.lepe_kernel:
        out[f"{prefix}.lepe"] = counting.depthwise_conv2d_macs(hw, c, (a.lepe_kernel,) * 2)
    if a.out_proj:
        out[f"{prefix}.proj"] = counting.linear_macs(n, c, c)


def macs(cfg: RALADeiTConfig | RALASwinConfig, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention; elementwise work in
    :func:`elementwise`)."""
    _check_cfg(cfg)
    common.check_image_hw(cfg.img_size, image_hw)
    out: dict[str, int] = {}
    if isinstance(cfg, RALADeiTConfig):
        c, (gh, gw) = cfg.embed_dim, cfg.grid
        out["patch_embed"] = counting.conv2d_macs((gh, gw), cfg.in_chans, c, (cfg.patch_size, cfg.patch_size))
        for i in range(cfg.depth):
            _rala_macs(out, f"blocks.{i}.attn", cfg.attention_config(), (gh, gw))
            out[f"blocks.{i}.mlp"] = counting.mlp_macs(gh * gw, c, cfg.hidden)
        out["head"] = counting.linear_macs(1, c, cfg.num_classes)
        return out
    return _flatten._swin_macs(
        cfg, lambda out, p, i: _rala_macs(out, p, cfg.attention_config(i), cfg.stage_grids[i]), out)


def _rala_elementwise(out: dict[str, int], prefix: str, a: rala.RALAConfig, n: int) -> None:
    c, h = a.dim, a.num_heads
    out[f"{prefix}.features"] = 2 * n * c                       # kappa of Q and K
    if a.reweight:
        out[f"{prefix}.alpha"] = 2 * h * n                      # exp and the scaling of alpha
    out[f"{prefix}.normalise"] = n * c                          # the division
    if a.gate != "none":
        out[f"{prefix}.gate"] = n * c                           # the Hadamard product of Eq. 6
    if a.lepe_kernel:
        out[f"{prefix}.lepe_add"] = n * c


def elementwise(cfg: RALADeiTConfig | RALASwinConfig, image_hw: Any = None) -> dict[str, int]:
    """Element ops per layer group (counting.py): positional embedding, norms, RALA's kappa, alpha's softmax,
    the division, the gate product (and LePE's addition), softmax's exp, GELU, residual additions, norm and
    pooling."""
    macs(cfg, image_hw)   # validates
    out: dict[str, int] = {}
    if isinstance(cfg, RALADeiTConfig):
        c, (gh, gw) = cfg.embed_dim, cfg.grid
        n = gh * gw
        out["pos_embed"] = n * c
        for i in range(cfg.depth):
            out[f"blocks.{i}.norms"] = 2 * n * c
            _rala_elementwise(out, f"blocks.{i}.attn", cfg.attention_config(), n)
            out[f"blocks.{i}.mlp.gelu"] = n * cfg.hidden
            out[f"blocks.{i}.residual"] = 2 * n * c
        out["norm_pool"] = 2 * n * c
        return out
    return _flatten._swin_elementwise(
        cfg, lambda out, p, i, n: _rala_elementwise(out, p, cfg.attention_config(i), n), out)


# ===================================================================================================
# Reduced configurations, counts against the paper, registration
# ===================================================================================================

def reduced(cfg: RALADeiTConfig | RALASwinConfig) -> RALADeiTConfig | RALASwinConfig:
    """A small configuration on the same code path (preset and attention options kept), head dim 32 throughout
    (as the other reduced DeiT / Swin configs; RoPE needs d % 4 == 0).  DeiT: C = 64, 2 heads, depth 2, a
    non-square 32 x 48 image (4 x 6 grid), 10 classes.  Swin: C = 32, depths (1, 1, 2, 1), heads (1, 2, 4, 8),
    a 48 x 72 image (grids 12x18 and 6x9 with global RALA; 3x5 and 2x3 with softmax window 2: stage 3 padded to
    4x6 and its second block shifted, stage 4 padded to 2x4 and unshifted; odd grids padded by patch merging),
    10 classes."""
    _check_cfg(cfg)
    if isinstance(cfg, RALADeiTConfig):
        return dataclasses.replace(cfg, embed_dim=64, depth=2, num_heads=2, img_size=(32, 48), patch_size=8,
                                   num_classes=10)
    return dataclasses.replace(cfg, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), img_size=(48, 72),
                               window_size=2, num_classes=10)


#: The registered default (paper preset) is the setting compared with Table 8.
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {}

_SWIN_T = 28_288_354     # Swin-T itself (attn_types="SSSS"; tests/test_paper_counts.py)
_RPB_STAGES_12 = 2 * 169 * 3 + 2 * 169 * 6   # the relative-position tables of stages 1-2 that RALA drops: 3,042

COUNT_GAPS: dict[str, counting.CountGap] = {
    "rala_swin_t": counting.CountGap(
        derived=_SWIN_T - _RPB_STAGES_12,
        arithmetic=("Swin-T 28,288,354 - the relative-position bias tables of stages 1-2 (2 x 169 x 3 + 2 x 169 x 6 "
                    "= 3,042; RALA's qkv + phi have exactly the weights of the qkv + proj they replace): "
                    "28,285,312 (28.29M -> 28M)"),
        reason=("Table 8 prints 29M for Ours and for Swin-T itself; Swin-T has 28.29M parameters (printed 29M by the "
                "Swin paper, which Table 8 reprints) and RALA removes 3,042 of them.  With RALA's released layer "
                "(preset 'official': + output projection and 5x5 LePE) stages 1-2 add 107,712: 28,393,024 (28.39M), "
                "still 28M; RALA in all four stages (attn_types 'LLLL') gives 28,265,032 (paper) / 30,540,808 "
                "(official): no reading prints 29M except by rounding up as the Swin paper does.")),
}

_M = sys.modules[__name__]
register("rala_deit_t", RALADeiTConfig(), _M, paper_params_m=6, paper_source="RALA Table 8 (DeiT-T setting)")
register("rala_swin_t", RALASwinConfig(), _M, paper_params_m=29, paper_source="RALA Table 8 (Swin-T setting)")
register("rala_swin_s", RALASwinConfig(depths=(2, 2, 18, 2)), _M, paper_params_m=50,
         paper_source="RALA Table 8 (Swin-S setting)")
