"""RALA, rank-augmented linear attention, and the RAVLT block.

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(seed 002).  Equation numbers below are the paper's.

Shapes: B batch, H x W token grid, N = H W tokens (row-major: token i sits at row i // W, column i % W),
C channels, h heads, d = C / h head dim.  Per head, q, k, v are (B, h, N, d).

The mechanism, per head (kappa the kernel feature map, ELU + 1 by default, §3.2 "Design of the block"):

    Q_g     = (1/N) sum_i Q_i                                                         (Eq. 4, first line)
    alpha_j = N exp(Q_g kappa(K_j)^T) / sum_m exp(Q_g kappa(K_m)^T)                   (Eq. 4)
    B       = sum_j alpha_j kappa(K_j)^T V_j,      sum_j alpha_j = N                  (Eq. 3)
    Y_i     = phi(X_i) (.) [kappa(Q_i) B / (kappa(Q_i) sum_j alpha_j kappa(K_j)^T)]   (Eq. 6 with Eq. 2's
                                                                                        normaliser)

phi is a linear projection (§3.2), or the identity or tanh (Table 9).  Eq. 6 as printed has no
denominator; Eq. 2 has one and §3.2 says the scalar denominator does not affect the rank, so the
reference keeps it (both the paper preset and the released code normalise).

The RAVLT block (§3.2, Fig. 6): x <- x + DWConv3x3(x) (CPE), x <- x + RALA(LN(x)), x <- x + FFN(LN(x)).
The paper's text gives "CPE, attention, FFN" and "the classic Transformer block"; Fig. 6 is not in the
text, so the norm placement (pre-norm, LayerNorm over channels) is taken from the released code and is
the same in both presets.

Presets (:meth:`RALAConfig.preset`, :meth:`RAVLTBlockConfig.preset`): ``"paper"`` computes the equations
above; ``"official"`` computes what the authors' released code computes, every departure a named option:

- ``alpha_scale="head_dim"``: the alpha softmax logits are multiplied by d^(-1/2);
- ``global_query="kappa_q"``: Q_g is the mean of kappa(Q), not of Q;
- ``rope=True``: a 2-D rotary position encoding of kappa(Q_i) and alpha_j kappa(K_j) in the *numerator*
  only, on interleaved channel pairs (2p, 2p+1); pairs p < d/4 rotate by (row of the token) * omega_p,
  pairs p >= d/4 by (column) * omega_(p - d/4), omega_p = base^(-p/(d/4 - 1)).  The normaliser uses the
  unrotated vectors;
- ``token_scaling="mean"``: K and V are each scaled by (HW)^(-1/2) in the KV product and the normaliser
  uses mean_j alpha_j kappa(K_j), so numerator and denominator carry the same 1/N (a no-op in exact
  arithmetic, which matters only together with ``eps``);
- ``eps=1e-6`` added to that normaliser;
- ``lepe_kernel=5``: a 5 x 5 depthwise conv of V (LePE) added to the attention output before the gate;
- ``gate_source="qkvo"``: the gate phi(X) is the fourth C-channel block of the same 1 x 1 conv that makes
  Q, K and V (a linear projection, no activation), and ``out_proj=True``: a 1 x 1 output projection after
  the gate;
- ``layout="channels_first"``: (B, C, H, W) tensors and 1 x 1 conv weights (C_out, C_in, 1, 1);
- block: ``ffn_dwconv=True`` (the FFN is fc1 -> GELU -> h + DWConv3x3(h) -> fc2), ``norm_eps=1e-6``,
  ``mlp_ratio=3``.

Numerics: kappa(x) = ELU(x) + 1 is evaluated as x + 1 (x > 0) and exp(x) (x <= 0), the same real
function; computing it literally as (exp(x) - 1) + 1, as ``F.elu(x) + 1`` does, loses all relative
accuracy for x << 0 (see docs/rala.md).  The error bounds (:func:`rala_core_bound`,
:func:`rala_attention_bound`, :func:`ravlt_ffn_bound`) propagate a rigorous running bound on the absolute
error, stage by stage, for a computation in the tested precision T; see "Error model" in
:mod:`refimpl.attention.rala_bounds`.

Contents, in seven files (this one, the public API, re-exports the public names of the others, so every name
of ``__all__`` is importable from here, its documented home):

- :mod:`refimpl.attention.rala_core` (Eq. 2-4, 6; the bottom, imports neither of the others): the layer's
  configuration and presets (:class:`RALAConfig`); kappa, the 2-D RoPE, the layout helpers; the reweighting
  coefficients, the KV buffer and the attention core, with the NumPy definitions of its operations
  "rala_alpha" and "reweighted_linear_attention";
- :mod:`refimpl.attention.rala_recomputed` (imports rala_core): the bound of the rows the core recomputes from
  log-features, with and without RoPE (``recomputed_error``);
- :mod:`refimpl.attention.rala_bounds` (imports rala_core, rala_recomputed): the error model (``_Prec``, the
  ``_e_*`` rules, the errors of the core's stages), the l2 coefficient sigma (``_core_sigma``,
  ``_attention_sigma``) and :func:`rala_core_bound`;
- :mod:`refimpl.attention.rala_module_recomputed` (imports rala_core, rala_bounds, rala_recomputed): the layer
  bound's term for the rows the core recomputes, with the projections' errors (``module_recomputed_error``);
- :mod:`refimpl.attention.rala_layer_error` (imports rala_core, rala_bounds, rala_module_recomputed): the
  projections (``_projections``) and the one error paths on tokens with an input error of the layer
  (``attention_error``), of the block's FFN (``ffn_error``) and of its residuals (``residual_error``), shared by
  :func:`rala_attention_bound` / :func:`ravlt_ffn_bound` / :func:`residual_bound` and the networks
  (refimpl.models.ravlt_bounds; the CPE's path is refimpl.layers.cpe_error);
- :mod:`refimpl.attention.rala_range` (imports rala_core): the range policy of the layer's output
  (``_check_output_range``: FloatingPointError naming the first stage that is not finite from finite inputs);
- this file (imports rala_core, rala_bounds, rala_layer_error, rala_range; layer: attention, as its parts): the
  block's configuration (:class:`RAVLTBlockConfig`); the attention layer; the RAVLT block (FFN, CPE, layerscale);
  parameter shapes; the bounds of the layer, the FFN and the residuals; the stage list.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics, validation
from ..errors import ArgumentError, ArgumentTypeError
from .rala_bounds import (_Prec, _as_bound, _attention_parts_error, _attention_sigma, _e_kappa,
                          _numerator_denominator, _scores_error, _softmax_alpha_error, rala_core_bound)
from .rala_core import (RALAConfig, _grid_to_tokens, _merge_heads, _param, _reweighting, _split_heads,
                        _tokens_to_cf, _tokens_to_grid, _weight2d, apply_rope_2d, kappa, kv_buffer, rala_core,
                        reweighting_coefficients, rope_2d_angles)
# Not used here: kept importable as rala._reweighted_linear_attention_numpy for benchmarks/linattn_c.py (its home is
# rala_core).
from .rala_core import _reweighted_linear_attention_numpy  # noqa: F401
from .rala_layer_error import _projections, attention_error, ffn_error, residual_error
from .rala_range import _check_output_range

__all__ = [
    "RALAConfig", "RAVLTBlockConfig", "kappa", "rope_2d_angles", "apply_rope_2d", "reweighting_coefficients",
    "kv_buffer", "rala_core", "rala_attention", "ravlt_ffn", "ravlt_block", "rala_param_shapes",
    "ravlt_block_param_shapes", "rala_core_bound", "rala_attention_bound", "ravlt_ffn_bound",
    "residual_bound", "ravlt_cpe",
]

# ===================================================================================================
# The block's configuration (the layer's, RALAConfig, lives in rala_core)
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class RAVLTBlockConfig:
    """Options of the RAVLT block: CPE, pre-norm RALA, pre-norm FFN, each with a residual (§3.2, Fig. 6).

    attn : the :class:`RALAConfig` (its ``layout`` is the block's layout).
    mlp_ratio : FFN hidden width / C (config.RALA_PAPER_MLP_RATIO; official RALA_OFFICIAL_MLP_RATIO).
    norm_eps : LayerNorm eps (config.LAYER_NORM_EPS; official RALA_OFFICIAL_NORM_EPS).
    cpe_kernel : CPE depthwise kernel (3, §3.2), 0 = no CPE ("w/o CPE", Table 9).
    ffn_dwconv : False (fc1 -> GELU -> fc2) | True (official: a 3 x 3 depthwise conv with residual after
        the GELU).
    layerscale : False | True (official: every registered RAVLT model scales both branches by learned
        per-channel factors "gamma_1", "gamma_2" before the residual additions).
    """

    attn: RALAConfig
    mlp_ratio: float = config.RALA_PAPER_MLP_RATIO
    norm_eps: float = config.LAYER_NORM_EPS
    cpe_kernel: int = config.RALA_CPE_KERNEL
    ffn_dwconv: bool = False
    layerscale: bool = False

    def __post_init__(self) -> None:
        """Raises ArgumentTypeError when ``attn`` is not a :class:`RALAConfig`, and ArgumentError / ArgumentTypeError
        for mlp_ratio <= 0 or an FFN hidden width < 1, a cpe_kernel that is neither 0 nor odd, and a norm_eps that is
        not finite and >= 0."""
        if not isinstance(self.attn, RALAConfig):
            raise ArgumentTypeError(f"RAVLTBlockConfig.attn: expected a RALAConfig, got {type(self.attn).__name__}")
        validation.check_positive(self.mlp_ratio, "RAVLTBlockConfig.mlp_ratio")
        if self.hidden < 1:
            raise ArgumentError(f"RAVLTBlockConfig.mlp_ratio: hidden width int(mlp_ratio * dim) must be >= 1, "
                                f"got {self.mlp_ratio} * {self.attn.dim}")
        validation.check_kernel(self.cpe_kernel, "RAVLTBlockConfig.cpe_kernel", allow_zero=True)
        validation.check_eps(self.norm_eps, "RAVLTBlockConfig.norm_eps")

    @property
    def hidden(self) -> int:
        """The FFN's hidden width int(mlp_ratio C)."""
        return int(self.mlp_ratio * self.attn.dim)

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "RAVLTBlockConfig":
        """``"paper"`` or ``"official"``.  Overrides naming RALAConfig fields (dim, num_heads, order, ...)
        go to the attention config; the others to the block."""
        block_fields = {f.name for f in dataclasses.fields(cls)} - {"attn"}
        attn_over = {k: v for k, v in overrides.items() if k not in block_fields}
        block_over = {k: v for k, v in overrides.items() if k in block_fields}
        attn = RALAConfig.preset(name, **attn_over)
        base: dict[str, Any] = {}
        if name == "official":
            base = dict(mlp_ratio=config.RALA_OFFICIAL_MLP_RATIO, norm_eps=config.RALA_OFFICIAL_NORM_EPS,
                        ffn_dwconv=True, layerscale=True)
        base.update(block_over)
        return cls(attn=attn, **base)


# ===================================================================================================
# Argument checks of the layer and the block
# ===================================================================================================

def _check_params(params: Any, expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`): expected keys from
    :func:`rala_param_shapes` (the layer) or :func:`ravlt_block_param_shapes` (the block, its FFN)."""
    validation.check_params(params, expected, where=where)


def _ffn_shapes(cfg: RAVLTBlockConfig) -> dict[str, tuple[int, ...]]:
    return {k[len("ffn."):]: s for k, s in ravlt_block_param_shapes(cfg).items() if k.startswith("ffn.")}


def _check_grid(x: Any, layout: str, dim: int, name: str = "x") -> np.ndarray:
    x = numerics.as_float(x, name)
    spec = "B H W C" if layout == "tokens" else "B C H W"
    numerics.check_shapes({"C": dim}, **{name: (x, spec)})
    return x


# ===================================================================================================
# The attention layer
# ===================================================================================================

def rala_attention(x: Any, params: Mapping[str, Any], cfg: RALAConfig, *, taps: dict | None = None,
                   max_elements: int | None = None) -> np.ndarray:
    """The RALA layer: projections, the reweighted core, (LePE), the gate phi(X) of Eq. 6, (projection).

    Parameters
    ----------
    x : (B, H, W, C) (layout "tokens") or (B, C, H, W) (layout "channels_first") float.
    params : flat mapping keyed like the PyTorch twin's state_dict (see :func:`rala_param_shapes`):
        "qkv.weight"/"qkv.bias" (3C rows: Q, K, V blocks, each head-major) and, for gate "linear",
        "phi.weight"/"phi.bias"; or (gate_source "qkvo") "qkvo.weight"/"qkvo.bias" (4C rows: Q, K, V, gate);
        "lepe.weight" (C, 1, k, k)/"lepe.bias" when lepe_kernel; "proj.weight"/"proj.bias" when out_proj.
    cfg : :class:`RALAConfig`.
    taps : optional dict; receives "q", "k", "v" (B,h,N,d), "gate" (B,N,C), "core" (B,N,C, merged heads),
        "lepe" (B,N,C), "pre_gate", "gated", "out" (layout of x) and the core's taps prefixed "core.".
    max_elements : as :func:`rala_core`.

    Returns
    -------
    Array of x's shape and layout.  Range: where x and the parameters are finite but a stage's value is not
    (1e150-sized inputs: a projection or RoPE's rotated numerator overflows, or ELU + 1 and alpha underflow so
    that the normaliser is 0 although the exact one is > 0), FloatingPointError naming the stage; the one
    honest NaN is the relu kernel's dead row with eps = 0 (0/0, undefined), returned as NaN.

    References
    ----------
    RALA Eq. 2-4, 6, §3.2 (phi a linear projection), Table 9 (identity, tanh, "w/o out aug"); released
    code for the official options.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, RALAConfig)
    x = _check_grid(x, cfg.layout, cfg.dim)
    _check_params(params, rala_param_shapes(cfg), "rala_attention")
    validation.check_taps(taps)
    c, heads = cfg.dim, cfg.num_heads
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    t = taps if taps is not None else {}

    q, k, v, g = _projections(tok, params, cfg)
    qh, kh, vh = (_split_heads(a, heads) for a in (q, k, v))
    t["q"], t["k"], t["v"], t["gate"] = qh, kh, vh, g

    core_taps: dict | None = {} if taps is not None else None     # taps keep the core on its NumPy path
    y = _merge_heads(rala_core(qh, kh, vh, cfg, (h, w), taps=core_taps, max_elements=max_elements))
    t.update({"core." + name: val for name, val in (core_taps or {}).items()})
    t["core"] = y
    if cfg.lepe_kernel:
        kl = cfg.lepe_kernel
        lepe = layers.depthwise_conv2d(_tokens_to_cf(v, h, w), _param(params, "lepe.weight"),
                                       _param(params, "lepe.bias") if "lepe.bias" in params else None,
                                       padding=kl // 2)
        lepe = lepe.reshape(lepe.shape[0], c, h * w).transpose(0, 2, 1)
        t["lepe"] = lepe
        y = y + lepe
    t["pre_gate"] = y
    if g is not None:
        y = g * y                                       # Eq. 6: phi(X_i) (.) (...)
    t["gated"] = y
    if cfg.out_proj:
        y = layers.linear(y, _weight2d(params["proj.weight"], cfg.layout, "proj.weight", c, c),
                          params.get("proj.bias"))
    out = _tokens_to_grid(y, h, w, cfg.layout)
    t["out"] = out
    if not np.all(np.isfinite(out)):
        _check_output_range(x, params, cfg, t)
    return out


# ===================================================================================================
# The RAVLT block
# ===================================================================================================

def _norm(x: np.ndarray, p: Mapping[str, Any], prefix: str, cfg: RAVLTBlockConfig) -> np.ndarray:
    wgt, bias = _param(p, prefix + ".weight"), _param(p, prefix + ".bias")
    if cfg.attn.layout == "tokens":
        return layers.layer_norm(x, wgt, bias, cfg.norm_eps)
    return layers.layer_norm_cf(x, wgt, bias, cfg.norm_eps)


def ravlt_ffn(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, taps: dict | None = None) -> np.ndarray:
    """The block's FFN: fc2(GELU(fc1 x)), or with ``ffn_dwconv`` fc2(h + DWConv3x3(h)), h = GELU(fc1 x).

    x : (B, H, W, C) or (B, C, H, W) (cfg.attn.layout).  params : "fc1.weight" (Hd, C[, 1, 1]), "fc1.bias",
    "dwconv.weight" (Hd, 1, 3, 3), "dwconv.bias" (with ffn_dwconv), "fc2.weight" (C, Hd[, 1, 1]), "fc2.bias".
    taps : "hidden" (after GELU), "dw" (after the conv residual), "out".  Returns x's shape.

    References: RALA §3.2 ("classic Transformer block ... FFN"); released code for ffn_dwconv.
    """
    validation.check_config(cfg, RAVLTBlockConfig)
    layout, c, hd = cfg.attn.layout, cfg.attn.dim, cfg.hidden
    x = _check_grid(x, layout, c)
    _check_params(params, _ffn_shapes(cfg), "ravlt_ffn")
    validation.check_taps(taps)
    tok, h, w = _grid_to_tokens(x, layout)
    t = taps if taps is not None else {}
    hid = layers.linear(tok, _weight2d(_param(params, "fc1.weight"), layout, "fc1.weight", hd, c),
                        params.get("fc1.bias"))
    hid = layers.gelu(hid, out=hid)                 # in place on the fresh fc1 output
    t["hidden"] = hid
    if cfg.ffn_dwconv:
        conv = layers.depthwise_conv2d(_tokens_to_cf(hid, h, w), _param(params, "dwconv.weight"),
                                       params.get("dwconv.bias"), padding=1)
        hid = hid + conv.reshape(conv.shape[0], hd, h * w).transpose(0, 2, 1)
        t["dw"] = hid
    y = layers.linear(hid, _weight2d(_param(params, "fc2.weight"), layout, "fc2.weight", c, hd),
                      params.get("fc2.bias"))
    out = _tokens_to_grid(y, h, w, layout)
    t["out"] = out
    return out


def ravlt_cpe(x: np.ndarray, params: Mapping[str, Any], cfg: RAVLTBlockConfig) -> np.ndarray:
    """x + DWConv_kxk(x) (CPE, Chu et al.; RALA §3.2) in the block's layout; the identity if cpe_kernel = 0."""
    validation.check_config(cfg, RAVLTBlockConfig)
    x = _check_grid(x, cfg.attn.layout, cfg.attn.dim)
    validation.check_mapping(params, "params", "a mapping of the block's state_dict keys to float arrays")
    pos = {k: s for k, s in ravlt_block_param_shapes(cfg).items() if k.startswith("pos.")}
    _check_params({k: v for k, v in params.items() if isinstance(k, str) and k.startswith("pos.")}, pos,
                  "ravlt_cpe (the 'pos.' entries of argument 'params')")
    if not cfg.cpe_kernel:
        return x
    cf = x if cfg.attn.layout == "channels_first" else np.moveaxis(x, -1, 1)
    out = layers.cpe(cf, _param(params, "pos.weight"), params.get("pos.bias"))
    return out if cfg.attn.layout == "channels_first" else np.moveaxis(out, 1, -1)


def _layerscale(y: np.ndarray, params: Mapping[str, Any], key: str, cfg: RAVLTBlockConfig) -> np.ndarray:
    """gamma (.) y with gamma (1, C, 1, 1) channels-first or (C,) tokens; the identity without layerscale."""
    if not cfg.layerscale:
        return y
    g = _param(params, key)
    want = (1, cfg.attn.dim, 1, 1) if cfg.attn.layout == "channels_first" else (cfg.attn.dim,)
    if g.shape != want:
        raise ArgumentError(f"parameter '{key}': expected shape {want}, got {g.shape}")
    return g * y


def ravlt_block(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, taps: dict | None = None,
                max_elements: int | None = None) -> np.ndarray:
    """The RAVLT block: x1 = CPE(x); x2 = x1 + RALA(LN1(x1)); out = x2 + FFN(LN2(x2)) (with layerscale:
    x1 + gamma_1 (.) RALA(...), x2 + gamma_2 (.) FFN(...)).

    Parameters
    ----------
    x : (B, H, W, C) or (B, C, H, W) float (cfg.attn.layout).
    params : "pos.weight" (C,1,3,3), "pos.bias", "norm1.weight"/"norm1.bias" (C,), "attn.*" (see
        :func:`rala_attention`), "norm2.*", "ffn.*" (see :func:`ravlt_ffn`), "gamma_1"/"gamma_2" with
        layerscale.
    cfg : :class:`RAVLTBlockConfig`.
    taps : "cpe", "norm1", "attn", "res1", "norm2", "ffn", "out", and the layer's taps prefixed "attn.".

    Returns
    -------
    Array of x's shape.

    References
    ----------
    RALA §3.2 "Design of the block" and Fig. 6; CPE: Chu et al. (2023).
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, RAVLTBlockConfig)
    x = _check_grid(x, cfg.attn.layout, cfg.attn.dim)
    _check_params(params, ravlt_block_param_shapes(cfg), "ravlt_block")
    validation.check_taps(taps)
    t = taps if taps is not None else {}
    x1 = ravlt_cpe(x, params, cfg)
    t["cpe"] = x1
    n1 = _norm(x1, params, "norm1", cfg)
    t["norm1"] = n1
    attn_taps: dict | None = {} if taps is not None else None    # taps keep the core on its NumPy path
    a = rala_attention(n1, layers.subparams(params, "attn"), cfg.attn, taps=attn_taps, max_elements=max_elements)
    t.update({"attn." + name: val for name, val in (attn_taps or {}).items()})
    t["attn"] = a
    x2 = x1 + _layerscale(a, params, "gamma_1", cfg)
    t["res1"] = x2
    n2 = _norm(x2, params, "norm2", cfg)
    t["norm2"] = n2
    f = ravlt_ffn(n2, layers.subparams(params, "ffn"), cfg)
    t["ffn"] = f
    out = x2 + _layerscale(f, params, "gamma_2", cfg)
    t["out"] = out
    return out


# ===================================================================================================
# Parameter shapes (the keys and shapes of the PyTorch twins' state_dicts)
# ===================================================================================================

def rala_param_shapes(cfg: RALAConfig) -> dict[str, tuple[int, ...]]:
    """{state_dict key: shape} of the RALA layer for ``cfg``."""
    validation.check_config(cfg, RALAConfig)
    c = cfg.dim
    tail = () if cfg.layout == "tokens" else (1, 1)
    out: dict[str, tuple[int, ...]] = {}
    if cfg.gate_source == "qkvo":
        out["qkvo.weight"] = (4 * c, c) + tail
        if cfg.qkv_bias:
            out["qkvo.bias"] = (4 * c,)
    else:
        out["qkv.weight"] = (3 * c, c) + tail
        if cfg.qkv_bias:
            out["qkv.bias"] = (3 * c,)
        if cfg.gate == "linear":
            out["phi.weight"] = (c, c) + tail
            if cfg.qkv_bias:
                out["phi.bias"] = (c,)
    if cfg.lepe_kernel:
        out["lepe.weight"] = (c, 1, cfg.lepe_kernel, cfg.lepe_kernel)
        out["lepe.bias"] = (c,)
    if cfg.out_proj:
        out["proj.weight"] = (c, c) + tail
        out["proj.bias"] = (c,)
    return out


def ravlt_block_param_shapes(cfg: RAVLTBlockConfig) -> dict[str, tuple[int, ...]]:
    """{state_dict key: shape} of the RAVLT block for ``cfg``."""
    validation.check_config(cfg, RAVLTBlockConfig)
    c, hd = cfg.attn.dim, cfg.hidden
    tail = () if cfg.attn.layout == "tokens" else (1, 1)
    out: dict[str, tuple[int, ...]] = {}
    if cfg.cpe_kernel:
        out["pos.weight"] = (c, 1, cfg.cpe_kernel, cfg.cpe_kernel)
        out["pos.bias"] = (c,)
    out["norm1.weight"], out["norm1.bias"] = (c,), (c,)
    out.update({"attn." + k: s for k, s in rala_param_shapes(cfg.attn).items()})
    out["norm2.weight"], out["norm2.bias"] = (c,), (c,)
    out["ffn.fc1.weight"], out["ffn.fc1.bias"] = (hd, c) + tail, (hd,)
    if cfg.ffn_dwconv:
        out["ffn.dwconv.weight"], out["ffn.dwconv.bias"] = (hd, 1, 3, 3), (hd,)
    out["ffn.fc2.weight"], out["ffn.fc2.bias"] = (c, hd) + tail, (c,)
    if cfg.layerscale:
        ls = (1, c, 1, 1) if cfg.attn.layout == "channels_first" else (c,)
        out["gamma_1"], out["gamma_2"] = ls, ls
    return out


# ===================================================================================================
# Bounds of the layer, the FFN and the residuals; the stages (the error model: rala_bounds)
# ===================================================================================================

def rala_attention_bound(x: Any, params: Mapping[str, Any], cfg: RALAConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`rala_attention` computed in precision ``dtype`` on the same (T-exact) x and
    parameters: projections (gamma_{C+1}), the core with its inputs' errors, LePE (gamma_{k^2+1} plus the
    propagated error of V), the addition, the gate product (phi's own error: gamma_{C+1} linear, c u
    |tanh| for tanh) and the output projection.  Returns Bound with the output's shape and layout, carrying the
    l2 coefficient sigma (:func:`_attention_sigma`; the verdict uses min(E, lam u sigma)) and, where E is
    infinite in T, the float64 reference's own error (Bound.ref_scale).  Range: the bound is not rescaled;
    where x exceeds 2^256 (config.RANGE_RESCALE_EXPONENT) and the bound overflows, FloatingPointError naming
    the stage (numerics.check_bound_range).

    References: RALA Eq. 2-4, 6; Higham (2002) eq. 3.12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, RALAConfig)
    x = _check_grid(x, cfg.layout, cfg.dim)
    _check_params(params, rala_param_shapes(cfg), "rala_attention_bound")
    pr = _Prec.of(dtype)
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    _, ey, depth = attention_error(tok, None, params, cfg, (h, w), pr)
    e = _tokens_to_grid(ey, h, w, cfg.layout)
    e64 = None
    if not (np.all(np.isfinite(e)) and math.isfinite(pr.g(depth))):    # the reference's own error, finite
        e64 = _tokens_to_grid(attention_error(tok, None, params, cfg, (h, w), _Prec.of("float64"))[1], h, w,
                              cfg.layout)
    bound = _as_bound(e, depth, pr,
                      f"rala_attention: running error bound through projections, core, LePE, gate and projection, "
                      f"depth K = {depth:.4g}; l2 coefficient sigma (_attention_sigma)",
                      sigma=_tokens_to_grid(_attention_sigma(tok, params, cfg, (h, w), pr), h, w, cfg.layout),
                      e_ref=e64)
    return numerics.check_bound_range(bound, "rala_attention_bound", x=x, **{key: params[key] for key in params})


def rala_attention_stages(params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int], *,
                          fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`rala_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors (in the layout of x, ``cfg.layout``): "x"; "proj_in" (B, mC, ...) the fused projection's output
    (qkv, or qkvo with the gate's rows: the output of the twin's ``qkv`` / ``qkvo`` submodule); with gate
    "linear" from its own projection, "phi" (B, C, ...); "core" (B, C, ...), the reweighted attention of
    Eq. 2-4 with heads merged; with LePE, "lepe" (B, C, ...) the depthwise conv of V; "gated" (B, C, ...),
    (core + lepe) * gate (Eq. 6; the output projection's input); with ``out_proj``, "out".  Heads are split
    as the twin splits them (channel h d + e of each of Q, K, V).  ``fine``: the core is cut into "alpha"
    (B, h, N), Eq. 4's weights; "k_weighted" (B, h, N, d), alpha_j kappa(K_j); "numerator" (B, h, N, d) and
    "denominator" (B, h, N) of Eq. 2-3 (RoPE and the token scaling inside); and "core", their quotient with heads
    merged.  The whole core's bound carries alpha's softmax error through both contractions; cut there, each
    stage is judged against its own bound.

    References
    ----------
    RALA Eq. 2-4, 6, §3.2; docs/design.md "Stages".
    """
    c, (h, w), lay, nh = cfg.dim, validation.check_grid(hw), cfg.layout, cfg.num_heads
    _check_params(params, rala_param_shapes(cfg), "rala_attention_stages")
    key = "qkvo" if cfg.gate_source == "qkvo" else "qkv"
    rows = 4 * c if key == "qkvo" else 3 * c

    def bias(name):
        return None if params.get(name) is None else numerics.as_float(params[name], name)

    def tokens(t):
        return _grid_to_tokens(t, lay)[0]

    def grid(t):
        return _tokens_to_grid(t, h, w, lay)

    def lin_stage(name, source, wkey, out):
        wt, bt = _weight2d(_param(params, wkey + ".weight"), lay, wkey + ".weight", out, c), bias(wkey + ".bias")

        def bound(t, dtype=None):
            return layers.linear_bound(tokens(t), wt, bt).relayout(grid)

        return numerics.Stage(name, (source,), lambda t: grid(layers.linear(tokens(t), wt, bt)), bound,
                              f"RALA: the {wkey} projection (1 x 1 conv channels-first)")

    def qkv_heads(p):
        t = tokens(p)
        return tuple(_split_heads(t[..., i * c:(i + 1) * c], nh) for i in range(3))

    def core(p):
        return grid(_merge_heads(rala_core(*qkv_heads(p), cfg, hw)))

    def core_bound(p, dtype=None):
        b = rala_core_bound(*qkv_heads(p), cfg, hw, dtype=dtype)
        return b.relayout(lambda a: grid(_merge_heads(a)))

    stages = [lin_stage("proj_in", "x", key, rows)]
    if key == "qkv" and cfg.gate == "linear":
        stages.append(lin_stage("phi", "x", "phi", c))
    if fine:
        stages += _rala_core_stages(cfg, hw, qkv_heads, grid)
    else:
        stages.append(numerics.Stage("core", ("proj_in",), core, core_bound,
                                     "RALA Eq. 2-4: the reweighted attention"))
    gated_inputs = ["core"]
    if cfg.lepe_kernel:
        wl, bl, pad = _param(params, "lepe.weight"), bias("lepe.bias"), cfg.lepe_kernel // 2

        def v_grid(p):
            return _tokens_to_cf(tokens(p)[..., 2 * c:3 * c], h, w)

        def from_cf(t):
            return grid(t.reshape(t.shape[0], c, h * w).transpose(0, 2, 1))

        def lepe_bound(p, dtype=None):
            return layers.depthwise_conv2d_bound(v_grid(p), wl, bl, padding=pad).relayout(from_cf)

        stages.append(numerics.Stage("lepe", ("proj_in",),
                                     lambda p: from_cf(layers.depthwise_conv2d(v_grid(p), wl, bl, padding=pad)),
                                     lepe_bound, "RALA §3.2: LePE, a depthwise conv of V"))
        gated_inputs.append("lepe")
    gate_source = {"qkvo": "proj_in", "linear": "phi", "identity": "x", "tanh": "x"}.get(
        "qkvo" if key == "qkvo" else cfg.gate)
    if gate_source is not None:
        gated_inputs.append(gate_source)

    def gate_of(src):
        if key == "qkvo":
            return grid(tokens(src)[..., 3 * c:])
        return np.tanh(src) if cfg.gate == "tanh" else src

    def gated(*t):
        y = t[0] + (t[1] if cfg.lepe_kernel else 0.0)
        return y * gate_of(t[-1]) if gate_source is not None else y

    def gated_bound(*t, dtype=None):
        # the sum with LePE and the product with the gate: two roundings on |core| + |lepe| times |gate|;
        # tanh's own c ulps enter as c more roundings of the product
        mag = np.abs(t[0]) + (np.abs(t[1]) if cfg.lepe_kernel else 0.0)
        if gate_source is None:
            return numerics.Bound(mag, 1.0 if cfg.lepe_kernel else 0.0, "core (+ LePE): one addition")
        k = (2.0 if cfg.lepe_kernel else 1.0) + (config.ELEMENTARY_FUNCTION_ULPS if cfg.gate == "tanh" else 0.0)
        return numerics.Bound(mag * np.abs(gate_of(t[-1])), k, "(core + LePE) * gate: the sum and the product")

    stages.append(numerics.Stage("gated", tuple(gated_inputs), gated, gated_bound,
                                 "RALA Eq. 6: (RALA(X) + LePE(V)) * phi(X)"))
    if cfg.out_proj:
        stages.append(lin_stage("out", "gated", "proj", c))
    return stages


def _rala_core_stages(cfg: RALAConfig, hw: tuple[int, int], qkv_heads, grid) -> list[numerics.Stage]:
    """The fine stages of the core (:func:`rala_attention_stages` with ``fine=True``)."""
    n = hw[0] * hw[1]
    z = np.zeros_like

    def kappas(p):
        q, k, v = qkv_heads(p)
        return q, kappa(q, cfg.kernel), kappa(k, cfg.kernel), k, v

    def scores(p):
        q, kq, kk, _, _ = kappas(p)
        q_g, scale, _ = _reweighting(q, kq, kk, cfg)
        return scale * (q_g @ kk.swapaxes(-1, -2))[..., 0, :]

    def scores_bound(p, dtype=None):
        pr = _Prec.of(dtype)
        q, kq, kk, k, _ = kappas(p)
        _, e, depth = _scores_error(q, z(q), kq, _e_kappa(q, z(q), cfg.kernel, pr), kk,
                                    _e_kappa(k, z(k), cfg.kernel, pr), cfg, pr)
        return _as_bound(e, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr, "Eq. 4's logits on exact Q, K")

    def alpha(s):
        return s.shape[-1] * numerics.softmax(s, axis=-1)

    def alpha_bound(s, dtype=None):
        pr = _Prec.of(dtype)
        _, e, depth = _softmax_alpha_error(s, z(s), pr)
        return _as_bound(e, depth, pr, "Eq. 4's alpha = N softmax(s) on exact logits")

    def k_weighted(p, a):
        return a[..., None] * kappas(p)[2]

    def k_weighted_bound(p, a, dtype=None):
        # kappa(K)'s own error times alpha, and three roundings: the tested code may form (kappa(K) softmax) N
        # (the released code's order) while its alpha is fl(softmax N), a rounding away from the one the product
        # saw; kappa(K) softmax, of size 1/N, may fall below T's normal range (float16 at N = 3136): an absolute
        # eta_T there, times N
        pr = _Prec.of(dtype)
        _, _, kk, k, _ = kappas(p)
        e = _e_kappa(k, z(k), cfg.kernel, pr) * np.abs(a[..., None]) + pr.g(3) * np.abs(a[..., None] * kk) \
            + (n + 2) * pr.eta
        return _as_bound(e, config.ELEMENTARY_FUNCTION_ULPS + 4, pr, "alpha_j kappa(K_j) on exact alpha, K")

    def parts(p, kw, dtype):
        pr = _Prec.of(dtype)
        q, kq, _, _, v = kappas(p)
        return _attention_parts_error(kq, _e_kappa(q, z(q), cfg.kernel, pr), kw, z(kw), v, z(v), cfg, hw, pr), pr

    def numerator(p, kw):
        _, kq, _, _, v = kappas(p)
        return _numerator_denominator(kq, kw, v, cfg, hw)[0]

    def denominator(p, kw):
        _, kq, _, _, v = kappas(p)
        den = _numerator_denominator(kq, kw, v, cfg, hw)[1]
        return den + cfg.eps if cfg.eps else den

    def numerator_bound(p, kw, dtype=None):
        (_, enum, _, _, depth), pr = parts(p, kw, dtype)
        return _as_bound(enum, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr,
                         "Eq. 2-3's numerator (RoPE, token scaling) on exact kappa(Q), weighted keys, V")

    def denominator_bound(p, kw, dtype=None):
        (_, _, _, eden, depth), pr = parts(p, kw, dtype)
        return _as_bound(eden, depth + config.ELEMENTARY_FUNCTION_ULPS + 1, pr,
                         "Eq. 2's normaliser on exact kappa(Q), weighted keys")

    def merge(t):
        return grid(_merge_heads(t))

    def quotient(num, den):
        with np.errstate(invalid="ignore", divide="ignore"):
            return merge(num / den[..., None])

    def quotient_bound(num, den, dtype=None):
        with np.errstate(invalid="ignore", divide="ignore"):
            return numerics.Bound(merge(np.abs(num / den[..., None])), 2.0,
                                  "numerator / denominator: a quotient, or a reciprocal and a product")

    reweighting = [
        numerics.Stage("scores", ("proj_in",), scores, scores_bound, "RALA Eq. 4: s = d^-1/2 q_g kappa(K)^T"),
        numerics.Stage("alpha", ("scores",), alpha, alpha_bound, "RALA Eq. 4: alpha = N softmax(s)"),
    ]
    if not cfg.reweight:                     # alpha = 1: the weighted keys are kappa(K) itself
        reweighting = [numerics.Stage("alpha", ("proj_in",), lambda p: np.ones(qkv_heads(p)[0].shape[:-1]),
                                      lambda p, dtype=None: numerics.Bound(np.zeros(1), 1.0, "alpha = 1: exact"),
                                      "RALA without reweighting: alpha = 1")]
    return reweighting + [
        numerics.Stage("k_weighted", ("proj_in", "alpha"), k_weighted, k_weighted_bound,
                       "RALA Eq. 2-3: alpha_j kappa(K_j)"),
        numerics.Stage("numerator", ("proj_in", "k_weighted"), numerator, numerator_bound,
                       "RALA Eq. 3 (RoPE, the released code's token scaling): kappa(Q) sum_j alpha_j kappa(K_j)^T V_j"),
        numerics.Stage("denominator", ("proj_in", "k_weighted"), denominator, denominator_bound,
                       "RALA Eq. 2: kappa(Q) sum_j alpha_j kappa(K_j)^T (+ eps)"),
        numerics.Stage("core", ("numerator", "denominator"), quotient, quotient_bound,
                       "RALA Eq. 2: the quotient"),
    ]


def ravlt_ffn_bound(x: Any, params: Mapping[str, Any], cfg: RAVLTBlockConfig, *, dtype: Any) -> numerics.Bound:
    """Error bound of :func:`ravlt_ffn` in precision ``dtype`` (exact x): the FFN's one error path,
    :func:`refimpl.attention.rala_layer_error.ffn_error` (fc1 and fc2 by Higham eq. 3.12, GELU's Lipschitz constant
    config.GELU_LIPSCHITZ and its own rounding, the depthwise conv residual), which the networks' blocks
    (refimpl.models.ravlt_bounds) share with an input error.  Returns Bound with x's shape.

    References: RALA §3.2; Higham (2002) eq. 3.12.
    """
    validation.check_config(cfg, RAVLTBlockConfig)
    x = _check_grid(x, cfg.attn.layout, cfg.attn.dim)
    _check_params(params, _ffn_shapes(cfg), "ravlt_ffn_bound")
    pr = _Prec.of(dtype)
    tok, h, w = _grid_to_tokens(x, cfg.attn.layout)
    _, e, depth = ffn_error(tok, None, params, cfg, (h, w), pr)
    return _as_bound(_tokens_to_grid(e, h, w, cfg.attn.layout), depth, pr,
                     f"ravlt_ffn: running error bound (fc1, GELU, {'dwconv, ' if cfg.ffn_dwconv else ''}fc2), "
                     f"depth K = {depth}; GELU's Lipschitz constant config.GELU_LIPSCHITZ")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def residual_bound(a: Any, b: Any, gamma: Any = None, *, dtype: Any) -> numerics.Bound:
    """Error bound of the residual a + b, or a + gamma (.) b (layerscale), computed in precision ``dtype`` on
    exact operands (T-exact): the residuals' one error path
    :func:`refimpl.attention.rala_layer_error.residual_error` (the product's rounding, then one rounding charged
    on the sum; Higham 2002 eq. 2.8; rigorous), which the networks' blocks share with input errors.  Returns
    Bound with a's shape (RALA §3.2, Fig. 6)."""
    a, b = numerics.as_float(a, "a"), numerics.as_float(b, "b")
    if a.shape != b.shape:
        raise ArgumentError(f"arguments 'a', 'b': expected the same shape, got {a.shape} and {b.shape}")
    if gamma is not None and not _broadcasts_to(numerics.as_float(gamma, "gamma").shape, b.shape):
        raise ArgumentError(f"argument 'gamma': expected a shape that broadcasts against b {b.shape} (per-channel "
                            f"layerscale), got {np.shape(gamma)}")
    g = None if gamma is None else numerics.as_float(gamma, "gamma")
    pr = _Prec.of(dtype)
    _, e, ks = residual_error(a, None, b, None, g, pr)
    return _as_bound(e, max(ks), pr, "residual addition, one rounding on the sum" if g is None else
                     "layerscale product and residual addition, one rounding on the sum")
