"""FLatten-CSwin networks: FLatten-CSwin-T/S/B (Han et al., ICCV 2023), NumPy reference.

Shapes: B batch, C_i channels of stage i (C_i = C 2^i), H_i x W_i its token grid, N_i = H_i W_i tokens
(row-major), h_i heads.  Images (B, 3, H_img, W_img); tokens (B, N, C) throughout; ``features`` returns
channels-first maps.

**CSwin** (Dong et al., "CSWin Transformer", CVPR 2022, §3.1-3.3) with the attention of its first two stages
replaced by FLatten's focused linear attention (FLatten Appendix D: "only adopt our module at early stages of
Swin and CSwin"; Table 15; released ``cfgs/flatten_cswin_*.yaml`` ``ATTN_TYPE: LLSS``)::

    stem: Conv 7 x 7, stride 4, zero padding 2 -> tokens -> LayerNorm          (CSwin §3.1, after CvT)
    4 stages; stage i: depth_i blocks  x + proj(attn(LN1 x)),  x + MLP(LN2 x)   (MLP C -> 4C -> C, GELU)
    between stages: Conv 3 x 3, stride 2, padding 1 (C_i -> 2 C_i) -> tokens -> LayerNorm   (CSwin §3.1)
    LayerNorm -> mean over the N_4 tokens -> linear head

A block's attention (CSwin §3.2, Eq. 1-2): one linear ``qkv`` (C -> 3C) gives Q, K, V over the stage grid.
Where the stage uses stripes (two branches), the first C/2 channels (h/2 heads) attend within stripes of one
orientation and the last C/2 (h/2 heads) within stripes of the other: a horizontal stripe is sw rows x W
columns, a vertical one H rows x sw columns.  A global stage (the last stage; or a stripe as large as the
square grid, the released ``patches_resolution == split_size`` rule) has one branch over the whole grid.  Each
branch, in each of its windows, computes

    softmax stages ("S", CSwin Eq. 1 + LePE Eq. 5):  softmax(Q K^T / sqrt(d)) V + LePE(V)
    focused stages ("L", FLatten Eq. 5-6, 10-12):     normalised phi_p(Q) phi_p(K)^T V + DWC(V) + LePE(V)

LePE(V) (CSwin §3.3) is a 3 x 3 depthwise convolution (with bias, zero padding) of V on the window's grid,
one kernel per channel of the branch.  The branches are concatenated (channels) and the block's ``proj``
(C -> C) follows.  **FLatten keeps CSwin's LePE**: the released FocusedLinearAttention adds ``lepe`` to its
output; FLatten Appendix D keeps the "model structure unchanged" apart from the attention.

**The focused stages attend globally.**  FLatten Table 15's window cells are illegible in our copy of the
paper (OCR "win 3x3" in every early cell), so the focused layout comes from the released code: the focused
blocks' stripe widths are ``CSWIN_LA_SPLIT_SIZE`` ('56-28-14-7' at 224, '96-48-24-12' in
``cfgs/flatten_cswin_b_384.yaml``), i.e. the whole stage grid, so each focused block has one branch over the
whole H x W grid (the "enlarged receptive field" FLatten §D names).  ``focused_split`` (one stripe width per
stage) puts the focused attention in CSwin's stripes instead; our stripes then attend within each stripe (the
released module's ``reshape(B, L, ...)`` assumes one window and would mix stripes, so it defines nothing
there).  Softmax stages use CSwin's widths (1, 2, 7, 7): at 224 stage 3 has 7-wide stripes on its 14 x 14 grid,
stage 4 is global.

**Depths** (FLatten Table 15 and the released factories, "increase the depth of the first and second stages
and correspondingly reduce the depth of the third stage" for T and B, FLatten §D): T (2, 4, 18, 1), S (2, 4,
32, 2), B (3, 6, 29, 2); channels C = 64 (T, S), 96 (B); heads (2, 4, 8, 16) (T, S), (4, 8, 16, 32) (B).

**Presets.**  ``preset`` selects the focused attention's preset (:class:`refimpl.attention.focused.
FocusedConfig`; "official" = the released FocusedLinearAttention: ReLU + 1e-6, / softplus(scale) per channel,
f_p's norms over the branch's channels, a learnable positional encoding (1, window tokens, C_branch) on K,
the mean-of-keys normaliser with K, V scaled by n^-1/2, a DWC bank of d channels shared by the heads, kernel
5) and the stripe order: the CSwin paper (§3.2, Eq. 2: "the first K/2 heads" attend in horizontal stripes,
the other K/2 in vertical ones) for "paper", the released ``idx=0`` branch (H_sp = H, W_sp = sw: vertical
stripes) first for "official" (``stripe_order`` overrides either).  The paper's printed parameter counts are
those of the released modules (their positional encodings over the whole grid are 0.3M of T's 21.2M):
reproduced with ``preset="official"`` (:data:`PAPER_COUNT_OVERRIDES`); its FLOPs are the MACs of
:func:`macs` (the same for both presets).

**Resolutions.**  A model is built for one ``img_size`` (the positional encodings are sized at construction,
as in the released code); any (H, W) that is a multiple of 32 is accepted (the stem and the merges then tile
exactly: grids H/4, H/8, H/16, H/32), non-square included; each stage's stripe width must divide its grid.

Keys equal the PyTorch twin's state_dict (refimpl/twins/models/flatten_cswin.py) and the released module's names:
"stage1_conv_embed.0.weight" (C, 3, 7, 7), "stage1_conv_embed.2.weight" (its LayerNorm), "stage1.0.norm1.weight",
"stage1.0.qkv.weight" (3C, C), "stage1.0.proj.weight", "stage1.0.attns.0.get_v.weight" (C_b, 1, 3, 3),
"stage1.0.attns.0.dwc.weight" (d, 1, 5, 5), "stage1.0.attns.0.scale" (1, 1, C_b),
"stage1.0.attns.0.positional_encoding" (1, n_window, C_b), "stage3.0.attns.1.get_v.weight", "merge1.conv.weight"
(2C, C, 3, 3), "merge1.norm.weight", "norm.weight", "head.weight".

References: FLatten §4.3, Appendix C (Table 8), Appendix D (Table 15); CSwin (Dong et al. 2022) §3.1 (stem,
merging), §3.2 (cross-shaped window attention, Eq. 1-2), §3.3 (LePE).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, validation
from ..attention.focused import FocusedConfig, focused_param_shapes
from ..errors import ArgumentError, ArgumentTypeError
from . import _netparts as nets, common, counting
from . import flatten_cswin_attention as _attn
# The block attention's error propagation, under its former private name here (tests/test_flatten_cswin.py).
from .flatten_cswin_attention import _e_map, e_stripe_attention as _e_stripe_attention
from .registry import register
from .common import Err

__all__ = ["FlattenCSwinConfig", "param_shapes", "init_params", "forward", "features", "run", "unit_names",
           "unit_parts", "run_unit", "run_unit_part", "unit_bound", "unit_part_bound", "forward_bounds", "macs",
           "elementwise", "reduced", "stripe_attention", "PAPER_COUNT_OVERRIDES", "COUNT_GAPS"]

_PRESETS = ("paper", "official")
_STRIPE_ORDERS = ("horizontal_first", "vertical_first")
_DEFAULT_ORDER = {"paper": "horizontal_first", "official": "vertical_first"}
_M = sys.modules[__name__]


# ===================================================================================================
# Configuration
# ===================================================================================================

def _int_tuple(value: Any, name: str, *, none_ok: bool = False) -> tuple:
    if not isinstance(value, (tuple, list)) or not value:
        raise ArgumentTypeError(f"argument '{name}': expected a non-empty tuple with one entry per stage, "
                                f"got {validation.describe(value)}")
    return tuple(None if (none_ok and v is None) else numerics.check_positive_int(v, f"{name}[{i}]")
                 for i, v in enumerate(value))


@dataclasses.dataclass(frozen=True)
class FlattenCSwinConfig:
    """FLatten-CSwin (FLatten Appendix D, Table 15; CSwin §3; released models/flatten_cswin.py).

    embed_dim C (stage i has C 2^i channels); depths, num_heads (per stage); attn_types ("L" focused / "S"
    softmax per stage; "LLSS" released); split_size: CSwin's stripe widths of the softmax stages;
    focused_split: None (every focused stage global, the released configuration) or one stripe width per stage
    (None entries: global) for the focused stages; img_size (int or pair, a multiple of 32); in_chans;
    num_classes; mlp_ratio; qkv_bias; layer_norm_eps (every LayerNorm: released ``nn.LayerNorm`` defaults);
    preset ("paper" | "official"); stripe_order (None: by preset, see the module docstring;
    "horizontal_first" | "vertical_first"); focusing_factor p; kernel_size (DWC); attn_overrides: extra
    :class:`FocusedConfig` fields (mapping or pairs), applied after the preset.
    """

    embed_dim: int = 64
    depths: tuple[int, ...] = (2, 4, 18, 1)
    num_heads: tuple[int, ...] = (2, 4, 8, 16)
    attn_types: str = "LLSS"
    split_size: tuple[int, ...] = config.CSWIN_SPLIT_SIZE
    focused_split: Any = None
    img_size: Any = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000
    mlp_ratio: float = config.NET_MLP_RATIO
    qkv_bias: bool = True
    layer_norm_eps: float = config.LAYER_NORM_EPS
    preset: str = "paper"
    stripe_order: str | None = None
    focusing_factor: float = config.FLATTEN_FOCUSING_FACTOR
    kernel_size: int = config.FLATTEN_DWC_KERNEL
    attn_overrides: Any = ()

    def __post_init__(self) -> None:
        """Stores depths, num_heads, split_size (and focused_split) as int tuples, img_size as (H, W), attn_overrides as
        sorted pairs; raises ArgumentError / ArgumentTypeError for stage lists of unequal length, attn_types other than
        "L" / "S", an unknown preset or stripe_order, a bad size, ratio or eps, an img_size not a multiple of the stem
        stride times 2^(stages - 1), heads not dividing a stage's channels, an odd head count or a stripe width not
        dividing the grid in a two-branch stage, and a focused stage's attention config refused."""
        for name in ("depths", "num_heads", "split_size"):
            object.__setattr__(self, name, _int_tuple(getattr(self, name), name))
        n = len(self.depths)
        if self.focused_split is not None:
            object.__setattr__(self, "focused_split", _int_tuple(self.focused_split, "focused_split", none_ok=True))
        fs = self.focused_split if self.focused_split is not None else (None,) * n
        if not isinstance(self.attn_types, str) or set(self.attn_types) - {"L", "S"}:
            raise ArgumentError(f"argument 'attn_types': expected a string of 'L' (focused) / 'S' (softmax), one "
                                f"per stage, got {self.attn_types!r}")
        if len(self.num_heads) != n or len(self.split_size) != n or len(self.attn_types) != n or len(fs) != n:
            raise ArgumentError(f"arguments 'depths', 'num_heads', 'split_size', 'attn_types', 'focused_split': one "
                                f"entry per stage each, got {self.depths}, {self.num_heads}, {self.split_size}, "
                                f"{self.attn_types!r}, {self.focused_split}")
        object.__setattr__(self, "img_size", common.normalize_img_size(self.img_size))
        object.__setattr__(self, "attn_overrides", common.normalize_overrides(self.attn_overrides))
        if self.preset not in _PRESETS:
            raise ArgumentError(f"argument 'preset': expected one of {_PRESETS}, got {self.preset!r}")
        if self.stripe_order is not None and self.stripe_order not in _STRIPE_ORDERS:
            raise ArgumentError(f"argument 'stripe_order': expected None or one of {_STRIPE_ORDERS}, "
                                f"got {self.stripe_order!r}")
        for name in ("embed_dim", "in_chans", "num_classes"):
            numerics.check_positive_int(getattr(self, name), name)
        validation.check_positive(self.mlp_ratio, "mlp_ratio")
        validation.check_eps(self.layer_norm_eps, "layer_norm_eps")
        if not isinstance(self.qkv_bias, (bool, np.bool_)):
            raise ArgumentTypeError(f"argument 'qkv_bias': expected a bool, got {validation.describe(self.qkv_bias)}")
        tile = config.CSWIN_STEM_STRIDE * 2 ** (n - 1)
        h, w = self.img_size
        if h % tile or w % tile:
            raise ArgumentError(f"argument 'img_size': {self.img_size} must be a multiple of {tile} (stem stride "
                                f"{config.CSWIN_STEM_STRIDE} x 2^{n - 1} merges), so that the stem and every merge "
                                f"tile their grids exactly")
        for i in range(n):
            c, heads = self.stage_dim(i), self.num_heads[i]
            if c % heads:
                raise ArgumentError(f"argument 'num_heads': stage {i + 1} has {c} channels, not divisible by "
                                    f"{heads} heads")
            wins = self.branch_windows(i)
            gh, gw = self.stage_grids[i]
            if len(wins) == 2:
                sw = self.stripe_width(i)
                if heads % 2:
                    raise ArgumentError(f"argument 'num_heads': stage {i + 1} splits its heads between horizontal "
                                        f"and vertical stripes (CSwin Eq. 2) and needs an even count, got {heads}")
                if gh % sw or gw % sw:
                    raise ArgumentError(f"argument '{'focused_split' if self.attn_types[i] == 'L' else 'split_size'}'"
                                        f": stage {i + 1} grid {gh}x{gw} is not a multiple of its stripe width {sw}")
            if self.attn_types[i] == "L":
                self.attention_config(i)   # validates p, kernel, overrides

    # --- geometry ---------------------------------------------------------------------------------

    @property
    def n_stages(self) -> int:
        """The number of stages."""
        return len(self.depths)

    def stage_dim(self, i: int) -> int:
        """C 2^i, the channels of stage ``i``."""
        return self.embed_dim * 2 ** i

    def hidden(self, i: int) -> int:
        """The MLP's hidden width int(C 2^i mlp_ratio) in stage ``i``."""
        return int(self.stage_dim(i) * self.mlp_ratio)

    @property
    def stage_grids(self) -> list[tuple[int, int]]:
        """(H_i, W_i): img / 4 after the stem, halved by each merge (exact: img_size is a multiple of 32)."""
        h, w = self.img_size[0] // config.CSWIN_STEM_STRIDE, self.img_size[1] // config.CSWIN_STEM_STRIDE
        return [(h >> i, w >> i) for i in range(self.n_stages)]

    @property
    def effective_stripe_order(self) -> str:
        """``stripe_order``, or the preset's when it is None ("paper": "horizontal_first", "official":
        "vertical_first")."""
        return self.stripe_order or _DEFAULT_ORDER[self.preset]

    def stripe_width(self, i: int) -> int | None:
        """Stage i's stripe width sw, or None where the stage attends globally (one branch): the last stage
        (released ``last_stage=True``), a focused stage without a ``focused_split`` entry, and a stripe as large
        as a square grid (released ``patches_resolution == split_size``)."""
        if self.attn_types[i] == "L":
            sw = None if self.focused_split is None else self.focused_split[i]
        else:
            sw = self.split_size[i]
        if i == self.n_stages - 1 or sw is None or self.stage_grids[i] == (sw, sw):
            return None
        return sw

    def branch_windows(self, i: int) -> list[tuple[int, int]]:
        """The window (rows, columns) of each branch of stage i: [(H, W)] for a global stage, else the first
        and the second half of the channels' stripes: horizontal (sw, W) and vertical (H, sw), in
        ``stripe_order``."""
        gh, gw = self.stage_grids[i]
        sw = self.stripe_width(i)
        if sw is None:
            return [(gh, gw)]
        hor, ver = (sw, gw), (gh, sw)
        return [hor, ver] if self.effective_stripe_order == "horizontal_first" else [ver, hor]

    def branch_dims(self, i: int) -> tuple[int, int]:
        """(channels, heads) of each branch of stage i."""
        nb = len(self.branch_windows(i))
        return self.stage_dim(i) // nb, self.num_heads[i] // nb

    def attention_config(self, i: int) -> FocusedConfig:
        """The focused attention of one branch of stage i (dim = the branch's channels)."""
        cb, hb = self.branch_dims(i)
        return FocusedConfig.preset(self.preset, dim=cb, num_heads=hb, p=self.focusing_factor,
                                    kernel_size=self.kernel_size, qkv_bias=self.qkv_bias, **dict(self.attn_overrides))


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def _check_cfg(cfg: Any) -> None:
    if not isinstance(cfg, FlattenCSwinConfig):
        raise ArgumentTypeError(f"argument 'cfg': expected FlattenCSwinConfig, got {type(cfg).__name__}")


def _branch_shapes(cfg: FlattenCSwinConfig, i: int, b: int) -> dict[str, tuple[int, ...]]:
    """One branch's entries ("attns.{b}.*"): LePE's ``get_v`` (C_b, 1, 3, 3) + bias; focused stages also the
    focused module's DWC, scale and positional encoding (:func:`refimpl.attention.focused.focused_param_shapes`,
    without its projections: CSwin's qkv and proj belong to the block)."""
    cb, _ = cfg.branch_dims(i)
    lk = config.CSWIN_LEPE_KERNEL
    s = {"get_v.weight": (cb, 1, lk, lk), "get_v.bias": (cb,)}
    if cfg.attn_types[i] == "L":
        wh, ww = cfg.branch_windows(i)[b]
        fs = focused_param_shapes(cfg.attention_config(i), layout="window", n_kv=wh * ww)
        s.update({k: tuple(v) for k, v in fs.items() if not k.startswith(("qkv.", "proj."))})
    return {f"attns.{b}.{k}": v for k, v in s.items()}


def param_shapes(cfg: FlattenCSwinConfig) -> dict[str, tuple[int, ...]]:
    """Every state_dict key and shape of the network, from the config alone (nothing allocated)."""
    _check_cfg(cfg)
    c0, k0 = cfg.embed_dim, config.CSWIN_STEM_KERNEL
    s: dict[str, tuple[int, ...]] = {"stage1_conv_embed.0.weight": (c0, cfg.in_chans, k0, k0),
                                     "stage1_conv_embed.0.bias": (c0,)}
    s.update(common.ln_shapes("stage1_conv_embed.2", c0))
    km = config.CSWIN_MERGE_KERNEL
    for i in range(cfg.n_stages):
        c = cfg.stage_dim(i)
        if i:
            s[f"merge{i}.conv.weight"] = (c, c // 2, km, km)
            s[f"merge{i}.conv.bias"] = (c,)
            s.update(common.ln_shapes(f"merge{i}.norm", c))
        for j in range(cfg.depths[i]):
            p = f"stage{i + 1}.{j}"
            s[f"{p}.qkv.weight"] = (3 * c, c)
            if cfg.qkv_bias:
                s[f"{p}.qkv.bias"] = (3 * c,)
            s.update(common.ln_shapes(f"{p}.norm1", c))
            s.update({f"{p}.proj.weight": (c, c), f"{p}.proj.bias": (c,)})
            for b in range(len(cfg.branch_windows(i))):
                s.update({f"{p}.{k}": v for k, v in _branch_shapes(cfg, i, b).items()})
            s.update(common.mlp_shapes(f"{p}.mlp", c, cfg.hidden(i)))
            s.update(common.ln_shapes(f"{p}.norm2", c))
    cl = cfg.stage_dim(cfg.n_stages - 1)
    s.update(common.ln_shapes("norm", cl))
    s.update({"head.weight": (cfg.num_classes, cl), "head.bias": (cfg.num_classes,)})
    return s


def init_params(cfg: FlattenCSwinConfig, rng: np.random.Generator | int = 0, *,
                scheme: str = "test") -> dict[str, np.ndarray]:
    """Fresh parameters keyed like the twin's state_dict.

    scheme "test" (default; for tests, docs, benchmarks): common.init_from_shapes, the learnable scale of the
    official preset N(0, config.FLATTEN_NET_SCALE_INIT_STD^2).  scheme "released": the released model's
    initialisation (flatten_cswin.py ``_init_weights`` and the modules' defaults): Linear weights truncated
    normal std 0.02 (timm's trunc_normal_, cut at +-2, i.e. +-100 std: a plain normal here), Linear biases 0,
    LayerNorm 1 / 0, convolutions PyTorch's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias,
    the scale and the positional encoding zeros."""
    rng = np.random.default_rng(rng)
    shapes = param_shapes(cfg)
    if scheme == "test":
        special = {".scale": lambda shape, r: config.FLATTEN_NET_SCALE_INIT_STD * r.standard_normal(shape)}
        return common.init_from_shapes(shapes, rng, special=special)
    if scheme != "released":
        raise ArgumentError(f"argument 'scheme': expected 'test' or 'released', got {scheme!r}")
    out: dict[str, np.ndarray] = {}
    for key, shape in shapes.items():
        owner = key.rsplit(".", 1)[0]
        conv_w = shapes.get(owner + ".weight", ())
        if key.endswith((".scale", ".positional_encoding")):
            out[key] = np.zeros(shape)
        elif len(conv_w) == 4:                                      # a convolution's weight or bias
            bound = 1.0 / math.sqrt(int(np.prod(conv_w[1:])))
            out[key] = rng.uniform(-bound, bound, shape)
        elif len(conv_w) == 2:                                      # a Linear
            out[key] = 0.02 * rng.standard_normal(shape) if key.endswith(".weight") else np.zeros(shape)
        else:                                                       # a LayerNorm
            out[key] = np.ones(shape) if key.endswith(".weight") else np.zeros(shape)
    return out


def _check_params(params: Any, cfg: FlattenCSwinConfig) -> Mapping[str, Any]:
    """The strict check of :func:`refimpl.models.common.check_network_params` against :func:`param_shapes`."""
    return common.check_network_params(params, cfg, param_shapes, "FLatten-CSwin network")


# ===================================================================================================
# The cross-shaped stripe attention (CSwin §3.2-3.3) with softmax or focused branches
# ===================================================================================================

def stripe_attention(x: Any, params: Mapping[str, Any], cfg: FlattenCSwinConfig, i: int) -> np.ndarray:
    """The attention of a stage-i block (before the residual): qkv, the cross-shaped branches, proj.

    Parameters
    ----------
    x : float array (B, N_i, C_i), the LayerNorm'd tokens (row-major grid).
    params : the block's parameters ("qkv.weight", "proj.weight", "attns.{b}.get_v.weight", ...: the keys of
        :func:`param_shapes` under "stage{i+1}.{j}.").
    cfg : the network's config; i : 0-based stage.

    Returns
    -------
    ndarray (B, N_i, C_i).

    References
    ----------
    CSwin §3.2 Eq. 1-2 (stripes, the head split), §3.3 (LePE); FLatten Eq. 5-6, 10-12 in focused stages.
    """
    _check_cfg(cfg)
    return _attn.stripe_attention(x, params, cfg, i)


# ===================================================================================================
# Forward, unit by unit
# ===================================================================================================
#
# A network is a chain of units: "stem" (images -> stage-1 tokens), "stage1.0", ..., "merge1" (stage-1 tokens
# -> stage-2 tokens), ..., "head" (final LayerNorm, mean, linear); a block is made of the parts "attn" and "mlp".
# The units are the comparison points of the equivalence suite (each twin unit is fed the reference's input of
# that unit); models._netparts' interpreter composes them into run, forward_bounds and the unit and part bounds.
# Unit values (B, N_i, C_i).

def unit_names(cfg: FlattenCSwinConfig) -> list[str]:
    """The units of the network in execution order."""
    _check_cfg(cfg)
    out = ["stem"]
    for i in range(cfg.n_stages):
        if i:
            out.append(f"merge{i}")
        out += [f"stage{i + 1}.{j}" for j in range(cfg.depths[i])]
    return out + ["head"]


def _stage_of(name: str) -> int:
    """0-based stage a unit works in: "stage3.1" -> 2, "merge2" -> 2 (its output stage), "head" -> last."""
    head = name.split(".")[0]
    if head.startswith("stage"):
        return int(head[len("stage"):]) - 1
    if head.startswith("merge"):
        return int(head[len("merge"):])
    raise AssertionError(f"unit {name!r} has no stage")


def _unit_input(name: str, x: Any, cfg: FlattenCSwinConfig, part: str | None = None) -> np.ndarray:
    """The input a unit (or a block's part) takes: images (B, in_chans, H, W) for "stem", the previous stage's
    tokens for "merge{i}", the last stage's for "head", else its stage's tokens (B, N_i, C_i)."""
    if name == "stem":
        return common.check_images(x, cfg.in_chans, cfg.img_size)
    x = numerics.as_float(x, "x")
    i = cfg.n_stages - 1 if name == "head" else _stage_of(name) - (1 if name.startswith("merge") else 0)
    (gh, gw), c = cfg.stage_grids[i], cfg.stage_dim(i)
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": gh * gw, "C": c})
    return x


def _to_grid(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(B, N, C) -> (B, C, H, W)."""
    return x.transpose(0, 2, 1).reshape(x.shape[0], x.shape[2], *hw)


def _to_tokens(g: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B, N, C), N = H W row-major."""
    return np.ascontiguousarray(g.reshape(g.shape[0], g.shape[1], -1).transpose(0, 2, 1))


def run_unit(params: Mapping[str, Any], name: str, x: Any, cfg: FlattenCSwinConfig) -> np.ndarray:
    """One unit of the network (see :func:`unit_names`).

    Parameters
    ----------
    params : the network's parameters (state_dict keys).  name : a unit name.
    x : images (B, in_chans, H, W) for "stem", else tokens (B, N, C) of the previous unit's stage.
    cfg : the network's config.

    Returns
    -------
    Tokens (B, N_i, C_i), or logits (B, num_classes) for "head"; working precision.

    References
    ----------
    CSwin §3.1 (convolutional token embedding, merging, blocks), §3.2-3.3; FLatten §4.3 (Eq. 12 in the focused
    stages), Appendix D Table 15.
    """
    _check_cfg(cfg)
    nets.check_unit(_M, name, cfg)
    params = _check_params(params, cfg)
    x = _unit_input(name, x, cfg)
    eps = cfg.layer_norm_eps
    if name == "stem":
        y = layers.conv2d(x, params["stage1_conv_embed.0.weight"], params["stage1_conv_embed.0.bias"],
                          stride=config.CSWIN_STEM_STRIDE, padding=config.CSWIN_STEM_PADDING)
        return layers.layer_norm(_to_tokens(y), params["stage1_conv_embed.2.weight"],
                                 params["stage1_conv_embed.2.bias"], eps)
    if name == "head":
        pooled = np.mean(layers.layer_norm(x, params["norm.weight"], params["norm.bias"], eps), axis=1)
        return layers.linear(pooled, params["head.weight"], params["head.bias"])
    if name.startswith("merge"):
        i = _stage_of(name)
        y = layers.conv2d(_to_grid(x, cfg.stage_grids[i - 1]), params[f"{name}.conv.weight"],
                          params[f"{name}.conv.bias"], stride=2, padding=config.CSWIN_MERGE_KERNEL // 2)
        return layers.layer_norm(_to_tokens(y), params[f"{name}.norm.weight"], params[f"{name}.norm.bias"], eps)
    return _part(params, name, "mlp", _part(params, name, "attn", x, cfg), cfg)


def unit_parts(cfg: FlattenCSwinConfig, name: str) -> tuple[str, ...]:
    """The stages a unit is made of, in order, for stage-wise comparison: a block is "attn"
    (x + proj(attn(LN1 x))) then "mlp" (x + MLP(LN2 x)); other units have no parts (())."""
    _check_cfg(cfg)
    nets.check_unit(_M, name, cfg)
    return ("attn", "mlp") if name.startswith("stage") else ()


def run_unit_part(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: FlattenCSwinConfig) -> np.ndarray:
    """One part of a block unit (:func:`unit_parts`); the unit is its parts applied in order."""
    return nets.run_part(_M, params, name, part, x, cfg)


def _part(params: Mapping[str, Any], name: str, part: str, x: np.ndarray, cfg: FlattenCSwinConfig) -> np.ndarray:
    """x + proj(attn(LN1 x)) ("attn": :func:`stripe_attention`) or x + MLP(LN2 x) ("mlp")."""
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "mlp":
        return x + common.mlp2d(layers.layer_norm(x, p["norm2.weight"], p["norm2.bias"], eps),
                                layers.subparams(p, "mlp"))
    y = layers.layer_norm(x, p["norm1.weight"], p["norm1.bias"], eps)
    return x + stripe_attention(y, p, cfg, _stage_of(name))


def _feature_map(name: str, y: np.ndarray, cfg: FlattenCSwinConfig) -> np.ndarray | None:
    """The stage feature map (B, C_i, H_i, W_i) if unit ``name`` is the last block of a stage, else None."""
    if not name.startswith("stage"):
        return None
    i = _stage_of(name)
    if int(name.split(".")[1]) != cfg.depths[i] - 1:
        return None
    return _to_grid(y, cfg.stage_grids[i])


def run(params: Mapping[str, Any], images: Any, cfg: FlattenCSwinConfig, *,
        taps: dict | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits and per-stage feature maps in one pass (see :func:`forward`, :func:`features`).
    taps : dict or None; records every unit's output under its name."""
    return nets.run_stages(_M, params, images, cfg, taps)


def forward(params: Mapping[str, Any], images: Any, cfg: FlattenCSwinConfig) -> np.ndarray:
    """Class logits of FLatten-CSwin.

    Parameters
    ----------
    params : mapping keyed like the twin's state_dict (:func:`param_shapes`), float arrays.
    images : float array (B, in_chans, H, W), (H, W) = cfg.img_size.
    cfg : :class:`FlattenCSwinConfig`.

    Returns
    -------
    ndarray (B, num_classes), working precision.

    References
    ----------
    FLatten §4.3 (Eq. 12 in the focused stages), Appendix D Table 15; CSwin §3.
    """
    return run(params, images, cfg)[0]


def features(params: Mapping[str, Any], images: Any, cfg: FlattenCSwinConfig) -> list[np.ndarray]:
    """Per-stage feature maps, channels-first (B, C_i, H_i, W_i): each stage's last block output (stage 4
    before the final LayerNorm).

    References
    ----------
    FLatten Appendix D Table 15 (the "output" column: 56, 28, 14, 7 at 224); CSwin §3.1.
    """
    return run(params, images, cfg)[1]


# ===================================================================================================
# Error bounds (for the equivalence suite)
# ===================================================================================================

def _e_part(params: Mapping[str, Any], name: str, part: str, t: Err, cfg: FlattenCSwinConfig,
            dtype: Any) -> Err:
    """:func:`_part` with the running error analysis."""
    eps = cfg.layer_norm_eps
    p = layers.subparams(params, name)
    if part == "mlp":
        return common.e_add(t, common.e_mlp(common.e_layer_norm(t, p["norm2.weight"], p["norm2.bias"], eps),
                                            layers.subparams(p, "mlp")))
    y = common.e_layer_norm(t, p["norm1.weight"], p["norm1.bias"], eps)
    return common.e_add(t, _e_stripe_attention(y, p, cfg, _stage_of(name), dtype))


def _e_unit(params: Mapping[str, Any], name: str, t: Err, cfg: FlattenCSwinConfig, dtype: Any) -> Err:
    """:func:`run_unit` with the running error analysis of refimpl.models.common."""
    eps = cfg.layer_norm_eps
    if name == "stem":
        images = common.check_images(t.value, cfg.in_chans, cfg.img_size)
        y = common.e_conv2d(Err(images, t.err, t.depth), params["stage1_conv_embed.0.weight"],
                            params["stage1_conv_embed.0.bias"], stride=config.CSWIN_STEM_STRIDE,
                            padding=config.CSWIN_STEM_PADDING)
        return common.e_layer_norm(_e_map(y, _to_tokens), params["stage1_conv_embed.2.weight"],
                                   params["stage1_conv_embed.2.bias"], eps)
    if name == "head":
        pooled = common.e_mean(common.e_layer_norm(t, params["norm.weight"], params["norm.bias"], eps), axis=1)
        return common.e_linear(pooled, params["head.weight"], params["head.bias"])
    if name.startswith("merge"):
        i = _stage_of(name)
        g = _e_map(t, lambda a: _to_grid(a, cfg.stage_grids[i - 1]))
        y = common.e_conv2d(g, params[f"{name}.conv.weight"], params[f"{name}.conv.bias"], stride=2,
                            padding=config.CSWIN_MERGE_KERNEL // 2)
        return common.e_layer_norm(_e_map(y, _to_tokens), params[f"{name}.norm.weight"], params[f"{name}.norm.bias"],
                                   eps)
    return _e_part(params, name, "mlp", _e_part(params, name, "attn", t, cfg, dtype), cfg, dtype)


def unit_bound(params: Mapping[str, Any], name: str, x: Any, cfg: FlattenCSwinConfig, *,
               dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit` computed in precision ``dtype`` from exact (T-rounded) ``x`` and params:
    the running first-order analysis of refimpl.models.common, stage by stage through the unit."""
    return nets.bound_unit(_M, params, name, x, cfg, dtype)


def unit_part_bound(params: Mapping[str, Any], name: str, part: str, x: Any, cfg: FlattenCSwinConfig, *,
                    dtype: Any) -> numerics.Bound:
    """Error bound of :func:`run_unit_part` in precision ``dtype`` from exact (T-rounded) ``x`` and params."""
    return nets.bound_part(_M, params, name, part, x, cfg, dtype)


def forward_bounds(params: Mapping[str, Any], images: Any, cfg: FlattenCSwinConfig, *,
                   dtype: Any) -> tuple[list[numerics.Bound], numerics.Bound]:
    """Running first-order error bounds of :func:`features` and :func:`forward` (the whole chain of units
    from exact images and params).  Rigorous to first order but loose (it compounds the absolute Jacobians of
    every unit), so the sharp comparisons are the per-unit ones (:func:`unit_bound`).  Returns (feature
    bounds, logits bound)."""
    return nets.bound_network(_M, params, images, cfg, dtype)


# ===================================================================================================
# Multiply-accumulate counts (refimpl.models.counting's convention)
# ===================================================================================================

def _check_hw(cfg: FlattenCSwinConfig, image_hw: Any) -> tuple[int, int]:
    _check_cfg(cfg)
    return common.check_image_hw(cfg.img_size, image_hw)


def macs(cfg: FlattenCSwinConfig, image_hw: Any = None) -> dict[str, int]:
    """Multiply-accumulates per layer group for one image (counting.py's convention).  Stem N_1 C in 7^2;
    per block qkv (N 3C^2), per branch and window the core (softmax: Q K^T and A V, counting.
    softmax_attention_macs; focused: counting.linear_attention_macs + the DWC n C_b k^2 (a shared bank is
    applied to every head)), LePE (N C 9 over the branches), proj (N C^2), MLP (2 N C hidden); merges
    N_{i+1} 2C_i C_i 9; head C_4 classes.  The per-stage sums do not depend on the stripe order."""
    _check_hw(cfg, image_hw)
    k0, km, lk = config.CSWIN_STEM_KERNEL, config.CSWIN_MERGE_KERNEL, config.CSWIN_LEPE_KERNEL
    out: dict[str, int] = {"stem": counting.conv2d_macs(cfg.stage_grids[0], cfg.in_chans, cfg.embed_dim, (k0, k0))}
    for i in range(cfg.n_stages):
        c, (gh, gw) = cfg.stage_dim(i), cfg.stage_grids[i]
        n = gh * gw
        cb, hb = cfg.branch_dims(i)
        d = cb // hb
        if i:
            out[f"merge{i}"] = counting.conv2d_macs((gh, gw), c // 2, c, (km, km))
        for j in range(cfg.depths[i]):
            p = f"stage{i + 1}.{j}"
            out[f"{p}.qkv"] = counting.linear_macs(n, c, 3 * c)
            core = dwc = 0
            for wh, ww in cfg.branch_windows(i):
                nw, nt = n // (wh * ww), wh * ww
                if cfg.attn_types[i] == "L":
                    core += nw * counting.linear_attention_macs(hb, nt, nt, d)
                    dwc += nw * counting.depthwise_conv2d_macs((wh, ww), cb, (cfg.kernel_size,) * 2)
                else:
                    core += nw * counting.softmax_attention_macs(hb, nt, nt, d)
            out[f"{p}.attn.core"] = core
            if dwc:
                out[f"{p}.attn.dwc"] = dwc
            out[f"{p}.attn.lepe"] = counting.depthwise_conv2d_macs((gh, gw), c, (lk, lk))
            out[f"{p}.proj"] = counting.linear_macs(n, c, c)
            out[f"{p}.mlp"] = counting.mlp_macs(n, c, cfg.hidden(i))
    out["head"] = counting.linear_macs(1, cfg.stage_dim(cfg.n_stages - 1), cfg.num_classes)
    return out


def elementwise(cfg: FlattenCSwinConfig, image_hw: Any = None) -> dict[str, int]:
    """Element ops per layer group (counting.py: one per output element of each non-MAC stage): the stem's and
    merges' LayerNorms, the blocks' norms, the focused feature maps (once per element of phi(Q), phi(K)), the
    normalisation division and the DWC addition, softmax's exp, the LePE addition, GELU, residual additions,
    the final norm and the pooling."""
    _check_hw(cfg, image_hw)
    out: dict[str, int] = {}
    for i in range(cfg.n_stages):
        c, (gh, gw) = cfg.stage_dim(i), cfg.stage_grids[i]
        n = gh * gw
        out["stem.norm" if i == 0 else f"merge{i}.norm"] = n * c
        _, hb = cfg.branch_dims(i)
        for j in range(cfg.depths[i]):
            p = f"stage{i + 1}.{j}"
            out[f"{p}.norms"] = 2 * n * c
            if cfg.attn_types[i] == "L":
                out[f"{p}.attn.features"] = 2 * n * c
                out[f"{p}.attn.normalise"] = 2 * n * c
            else:
                out[f"{p}.attn.softmax"] = sum(n * wh * ww * hb for wh, ww in cfg.branch_windows(i))
            out[f"{p}.attn.lepe_add"] = n * c
            out[f"{p}.mlp.gelu"] = n * cfg.hidden(i)
            out[f"{p}.residual"] = 2 * n * c
    gh, gw = cfg.stage_grids[-1]
    out["norm_pool"] = 2 * gh * gw * cfg.stage_dim(cfg.n_stages - 1)
    return out


# ===================================================================================================
# Reduced configurations and registration
# ===================================================================================================

def reduced(cfg: FlattenCSwinConfig) -> FlattenCSwinConfig:
    """A small configuration with the same code path, for the equivalence suite: the preset, the stripe order,
    the attention types and options of ``cfg`` are kept.  Head dim 32 in the focused stages (as refimpl.models.
    flatten.reduced: with ReLU features a query whose d features are all <= 0 has phi(q) = 0, and preset
    "paper"'s normaliser is then 0/0; at d = 32 that has probability 2^-32 per token and head).  C = 32,
    heads (1, 2, 4, 8), depths (2, 1, 1, 1) (one block-to-block step), a non-square 32 x 64 image (grids 8x16,
    4x8, 2x4, 1x2): stage 3 has stripes of width 1 (two branches: 1 x 4 and 2 x 1 windows), stage 4 is global;
    stages 1-2 keep ``focused_split`` (None: global; else stripes of width 2, and then C = 64, heads (2, 4, 4, 8)
    so that each branch keeps one head of dim 32).  10 classes."""
    _check_cfg(cfg)
    if cfg.focused_split is None:
        c, heads, fs = 32, (1, 2, 4, 8), None
    else:
        c, heads, fs = 64, (2, 4, 4, 8), (2, 2, None, None)
    return dataclasses.replace(cfg, embed_dim=c, num_heads=heads, depths=(2, 1, 1, 1), img_size=(32, 64),
                               split_size=(1, 2, 1, 1), focused_split=fs, num_classes=10)


#: Config overrides under which the paper's printed counts were measured: the released modules (their
#: positional encodings, learnable scales and head-shared DWC banks are in the counts).
PAPER_COUNT_OVERRIDES: dict[str, dict[str, Any]] = {
    name: {"preset": "official"} for name in ("flatten_cswin_t", "flatten_cswin_s", "flatten_cswin_b")}

#: Counts the paper prints that our model, built as described, does not reach (none: T/S/B reproduce).
COUNT_GAPS: dict[str, counting.CountGap] = {}

#: (embed_dim, depths, heads) of the released factories FLatten_CSWin_64_24181_tiny_224,
#: FLatten_CSWin_64_24322_small_224, FLatten_CSWin_96_36292_base_224 (= FLatten Table 15).
SIZES = {"flatten_cswin_t": (64, (2, 4, 18, 1), (2, 4, 8, 16)),
         "flatten_cswin_s": (64, (2, 4, 32, 2), (2, 4, 8, 16)),
         "flatten_cswin_b": (96, (3, 6, 29, 2), (4, 8, 16, 32))}

for _name, _paper_m in (("flatten_cswin_t", 21), ("flatten_cswin_s", 35), ("flatten_cswin_b", 75)):
    _c, _d, _h = SIZES[_name]
    register(_name, FlattenCSwinConfig(embed_dim=_c, depths=_d, num_heads=_h), _M, paper_params_m=_paper_m,
             paper_source="FLatten Table 8 (App. D Table 15)")
#: FLatten-CSwin-B at 384 x 384 (FLatten Table 8: 78M / 46.4G), as overrides of "flatten_cswin_b": the released
#: FLatten_CSWin_96_36292_base_384 (split_size [1, 2, 12, 12]; the focused stages again global,
#: cfgs/flatten_cswin_b_384.yaml CSWIN_LA_SPLIT_SIZE 96-48-24-12).  Not registered: the registry's MAC table is
#: taken at 224 x 224 for every name (tests/test_macs.py), and a model is built for one resolution.
B_384 = {"img_size": (384, 384), "split_size": (1, 2, 12, 12)}
