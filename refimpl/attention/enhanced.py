"""L2ViT: enhanced linear attention, the local concentration module and the LGA / LWA blocks
(Zheng, "The Linear Attention Resurrection in Vision Transformer") - the NumPy reference.

Shapes used throughout:
    B batch, H x W token grid, N = H W tokens (row-major), C channels, h heads, d = C / h head dim.

The mechanism (L2ViT §4, Appendix 8, 10, 12):

    O_i = [phi(Q_i) (sum_j phi(K_j)^T V_j) / s] / max(phi(Q_i) . sum_j phi(K_j), C_min),  phi = ReLU   (Eq. 4, §4.2, App. 8)
    LCM(X) = DWConv_2(BN(GELU(DWConv_1(X))))     (k x k depthwise, k = 7; Eq. 6-7, Fig. 5)
    LGA:  X <- CPE(X);  X <- X + Attn(LN_1 X);  X <- X + LCM(LN_3 X)  (Eq. 8);  X <- X + MLP(LN_2 X)
    LWA:  X <- CPE(X);  X <- X + WindowAttn(LN_1 X);  X <- X + MLP(LN_2 X)        (Fig. 3, §4.3)

Reading of §4.2: "we clamp the denominator and apply a learnable scale parameter s to scale down the
dot-product of key and value" - s divides K^T V (the numerator) only; the clamp acts on the unscaled
denominator.  (Scaling numerator and denominator alike would cancel wherever the clamp is inactive, so s
could not "control the variance"; ``scale_target="similarity"`` offers that reading anyway.)  s is one
scalar initialised to sqrt(C) (Appendix 7), C the block's channel count.

Presets (:meth:`L2ViTConfig.preset`): "paper" (the equations, default) and "official" (the released code):

=====================  ===========================  ==================================================
field                  paper                        official
=====================  ===========================  ==================================================
scale_mode             "scalar": O / s, one s,      "per_head": O * t_h, one temperature per head
                       init sqrt(C) ("attn.scale")  (h, 1, 1), init d^-1/2 ("attn.temperature"),
                                                    multiplying the numerator after the clamp
lwa_cpe                "once": one CPE per block    "twice": CPE before the attention ("cpe.0") and
                                                    again before the MLP ("cpe.1") in LWA blocks
window_mask_padding    True: padded tokens are not  False: zero-padded tokens take part as keys
                       keys
=====================  ===========================  ==================================================

Both presets: ReLU without eps; C_min = 1e2 on the unscaled q . sum k; LCM as a separate residual branch
with its own LayerNorm (norm3) after the attention branch, before the MLP; a CPE before each block; no
relative-position bias and no shift in LWA (the paper replaces the relative position embedding by CPE
"in every block"; L2ViT alternates LWA with global LGA instead of shifting).  All of these are options too
(``scale_target``, ``lcm_placement``, ``window_rel_pos_bias``, ``window_shift``).

Contents, in two files (this one, the public API, re-exports the public names of the other, so every name of
``__all__`` is importable from here, its documented home).  :mod:`refimpl.attention.enhanced_core` (imported by
this one, never the reverse): the configuration (:class:`L2ViTConfig`), the attention core (both orders) and
its error bound.  This file: the attention module; LCM; the LGA and LWA blocks; parameter shapes /
initialisation; the error model of the module, LCM and the blocks (running first-order bounds, using the
propagation helpers of :mod:`refimpl.attention.focused_bounds`); the attention module's stage list.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .. import bounds, config, numerics, validation
from ..errors import ArgumentError, ParameterKeyError
from ..layers import (batch_norm2d, cpe, cpe_error, depthwise_conv2d, gelu, gelu_bound, layer_norm, linear,
                      linear_bound, mlp, pad_to_multiple, relative_position_bias, relative_position_index, shifted_window_mask,
                      subparams, window_partition, window_reverse)
from .enhanced_core import (L2ViTConfig, _bound, _err_core, enhanced_linear_attention,
                            enhanced_linear_attention_bound)
from .focused_bounds import err_dwconv, err_layer_norm, err_linear
from .softmax import softmax_attention, softmax_attention_error, window_attention

__all__ = [
    "L2ViTConfig", "enhanced_linear_attention", "enhanced_attention", "lcm", "lga_block", "lwa_block",
    "l2vit_param_shapes", "init_l2vit_params", "enhanced_linear_attention_bound", "enhanced_attention_bound",
    "lcm_bound", "lga_block_bound", "lwa_block_bound",
]

# ===================================================================================================
# The attention module
# ===================================================================================================

def _p(params: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in params:
        raise ParameterKeyError(f"L2ViT: missing parameter '{key}'")
    return numerics.as_float(params[key], key)


def _check_params(params: Any, cfg: L2ViTConfig, block: str, where: str, prefix: str = "") -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against :func:`l2vit_param_shapes`
    of ``block``; with ``prefix`` ("attn."), against that submodule's entries with the prefix removed."""
    shapes = l2vit_param_shapes(cfg, block)
    if prefix:
        shapes = {k[len(prefix):]: s for k, s in shapes.items() if k.startswith(prefix)}
    validation.check_params(params, shapes, where=where)


def _check_lcm_params(params: Any, c: int, where: str) -> None:
    """The LCM's entries (:func:`l2vit_param_shapes`' "local_mp." ones) for C channels; the kernel size k is
    read from "conv1.weight" (odd; both convs share it)."""
    w1 = params.get("conv1.weight") if isinstance(params, Mapping) else None
    k = np.shape(w1)[-1] if w1 is not None and np.ndim(w1) == 4 else 1
    if w1 is not None and np.ndim(w1) == 4 and np.shape(w1)[0] != c:     # either may be the wrong one
        raise ArgumentError(f"{where}: argument 'x' has C = {c} channels, parameter 'conv1.weight' has shape "
                            f"{tuple(np.shape(w1))} (expected (C, 1, k, k))")
    validation.check_kernel(int(k), "conv1.weight (its kernel size)")
    shapes = {"conv1.weight": (c, 1, k, k), "conv1.bias": (c,), "bn.weight": (c,), "bn.bias": (c,),
              "bn.running_mean": (c,), "bn.running_var": (c,), "conv2.weight": (c, 1, k, k), "conv2.bias": (c,)}
    validation.check_params(params, shapes, where=where)


def _opt(params: Mapping[str, Any], key: str) -> np.ndarray | None:
    return _p(params, key) if key in params else None


def _scale_args(params: Mapping[str, Any], cfg: L2ViTConfig) -> tuple[np.ndarray, str]:
    if cfg.scale_mode == "scalar":
        return _p(params, "scale"), "divide"
    return _p(params, "temperature"), "multiply"


def enhanced_attention(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, *, order: str = "linear",
                       taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """The linear global attention layer of LGA: qkv projection, heads, :func:`enhanced_linear_attention`,
    heads merged, output projection (L2ViT §4.2-4.3).

    Parameters
    ----------
    x : float array (B, N, C) (already layer-normalised by the block).
    params : "qkv.weight" (3C, C), "qkv.bias" (3C,) (q, k, v = consecutive C-blocks, heads of d channels in
        each), "proj.weight" (C, C), "proj.bias" (C,), and "scale" (1,) (paper) or "temperature" (h, 1, 1)
        (official).
    cfg : :class:`L2ViTConfig`.  order, taps, max_elements : as :func:`enhanced_linear_attention`; taps also
        get "q", "k", "v" (B, h, N, d) and "heads_out" (B, N, C) before the projection.

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    L2ViT Eq. 4, §4.2, Appendix 8.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, L2ViTConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg, "lga", "enhanced_attention", prefix="attn.")
    validation.check_taps(taps)
    b, n, c = x.shape
    h, d = cfg.num_heads, cfg.head_dim
    qkv = linear(x, _p(params, "qkv.weight"), _opt(params, "qkv.bias")).reshape(b, n, 3, h, d)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    s, mode = _scale_args(params, cfg)
    o = enhanced_linear_attention(q, k, v, c_min=cfg.c_min, scale=s, scale_mode=mode, scale_target=cfg.scale_target,
                                  order=order, taps=taps, max_elements=max_elements)
    y = o.transpose(0, 2, 1, 3).reshape(b, n, c)
    if taps is not None:
        taps.update(q=q, k=k, v=v, heads_out=y)
    return linear(y, _p(params, "proj.weight"), _opt(params, "proj.bias"))


# ===================================================================================================
# The local concentration module (Eq. 6-7, Fig. 5)
# ===================================================================================================

def _grid(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(B, N, C) -> (B, C, H, W)."""
    b, _, c = x.shape
    return x.transpose(0, 2, 1).reshape(b, c, hw[0], hw[1])


def _tokens(g: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B, N, C)."""
    b, c = g.shape[:2]
    return g.reshape(b, c, -1).transpose(0, 2, 1)


def _check_hw(x: Any, hw: Any, c: int | None) -> tuple[np.ndarray, tuple[int, int]]:
    """x (B, N, C) float with N = H W (and C = ``c`` unless None); hw a pair of positive ints."""
    x = numerics.as_float(x, "x")
    big_h, big_w = validation.check_grid(hw)
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": big_h * big_w} if c is None else {"N": big_h * big_w, "C": c})
    return x, (big_h, big_w)


def lcm(x: Any, params: Mapping[str, Any], hw: tuple[int, int], *,
        batch_norm_eps: float = config.BATCH_NORM_EPS, taps: dict | None = None) -> np.ndarray:
    """Local concentration module: X_LCM = DWConv_2(BN(GELU(DWConv_1(X)))) on the token grid (L2ViT Eq. 6-7).

    Parameters
    ----------
    x : float array (B, N, C) tokens of an H x W grid (row-major).
    params : "conv1.weight" (C, 1, k, k), "conv1.bias" (C,), "bn.weight", "bn.bias", "bn.running_mean",
        "bn.running_var" (C,) (BatchNorm in eval mode), "conv2.weight" (C, 1, k, k), "conv2.bias" (C,);
        k odd ('same' zero padding k // 2).
    hw : (H, W).  batch_norm_eps : float.
    taps : dict or None; records "conv1", "gelu", "bn", "conv2" as (B, C, H, W).

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    L2ViT Eq. 6-7, Appendix 10 and Fig. 5; the BN follows the GELU as Eq. 6-7 and Fig. 5 order them.
    """
    validation.check_eps(batch_norm_eps, "batch_norm_eps")
    x, hw = _check_hw(x, hw, None)
    _check_lcm_params(params, x.shape[-1], "lcm")
    validation.check_taps(taps)
    w1, w2 = _p(params, "conv1.weight"), _p(params, "conv2.weight")
    g1 = depthwise_conv2d(_grid(x, hw), w1, _opt(params, "conv1.bias"), padding=w1.shape[-1] // 2)
    a = gelu(g1)
    bn = batch_norm2d(a, _p(params, "bn.weight"), _p(params, "bn.bias"), _p(params, "bn.running_mean"),
                      _p(params, "bn.running_var"), batch_norm_eps)
    g2 = depthwise_conv2d(bn, w2, _opt(params, "conv2.bias"), padding=w2.shape[-1] // 2)
    if taps is not None:
        taps.update(conv1=g1, gelu=a, bn=bn, conv2=g2)
    return _tokens(g2)


# ===================================================================================================
# Blocks (Fig. 3, §4.3, Appendix 12)
# ===================================================================================================

def _cpe(x: np.ndarray, params: Mapping[str, Any], prefix: str, hw: tuple[int, int]) -> np.ndarray:
    return _tokens(cpe(_grid(x, hw), _p(params, prefix + ".proj.weight"), _opt(params, prefix + ".proj.bias")))


def _ln(x: np.ndarray, params: Mapping[str, Any], name: str, cfg: L2ViTConfig) -> np.ndarray:
    return layer_norm(x, _p(params, name + ".weight"), _p(params, name + ".bias"), cfg.layer_norm_eps)


def lga_block(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, hw: tuple[int, int], *,
              order: str = "linear", taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """Linear global attention block (L2ViT §4.3, Fig. 3, Eq. 8, Appendix 12).

        X <- X + DWConv_3x3(X)                        (CPE, "cpe.0")
        X <- X + Attn(LN_1 X)                         (enhanced linear attention, "attn")
        X <- X + LCM(LN_3 X)                          (Eq. 8)
    (``lcm_placement="attention"`` instead: X <- X + LCM(Attn(LN_1 X)), the conv of Eq. 5 applied directly
    to the attention output, without norm3.)
        X <- X + MLP(LN_2 X)

    Parameters
    ----------
    x : float array (B, N, C).  hw : (H, W), N = H W.
    params : keyed like the twin's state_dict: "cpe.0.proj.weight" (C, 1, 3, 3), "cpe.0.proj.bias",
        "norm1.*", "attn.*" (see :func:`enhanced_attention`), "norm3.*" (residual placement), "local_mp.*"
        (see :func:`lcm`), "norm2.*", "mlp.fc1.*", "mlp.fc2.*".  See :func:`l2vit_param_shapes`.
    cfg : :class:`L2ViTConfig`.  order : attention association order.
    taps : dict or None; records "cpe" (B, N, C), "attn_out" (B, N, C), "lcm" (B, N, C), "mlp" (B, N, C),
        and the attention's taps under "attn." names (e.g. "attn.kv", "attn.denominator").

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    L2ViT §4.2-4.3, Eq. 4-8, Fig. 3, Appendix 10 and 12.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, L2ViTConfig)
    x, hw = _check_hw(x, hw, cfg.dim)
    _check_params(params, cfg, "lga", "lga_block")
    validation.check_taps(taps)
    inner: dict | None = {} if taps is not None else None
    x = _cpe(x, params, "cpe.0", hw)
    a = enhanced_attention(_ln(x, params, "norm1", cfg), subparams(params, "attn"), cfg, order=order, taps=inner,
                           max_elements=max_elements)
    lp = subparams(params, "local_mp")
    if cfg.lcm_placement == "residual":
        x1 = x + a
        l_out = lcm(_ln(x1, params, "norm3", cfg), lp, hw, batch_norm_eps=cfg.batch_norm_eps)
        x2 = x1 + l_out
    else:
        l_out = lcm(a, lp, hw, batch_norm_eps=cfg.batch_norm_eps)
        x2 = x + l_out
    m = mlp(_ln(x2, params, "norm2", cfg), subparams(params, "mlp"))
    if taps is not None:
        taps.update(cpe=x, attn_out=a, lcm=l_out, mlp=m)
        taps.update({"attn." + key: val for key, val in inner.items()})
    return x2 + m


def _window_kwargs(cfg: L2ViTConfig) -> dict[str, Any]:
    return dict(num_heads=cfg.num_heads, window_size=cfg.window_size, shift=cfg.window_shift, pad=True,
                rel_pos_bias=cfg.window_rel_pos_bias, mask_padding=cfg.window_mask_padding, mask_value=None)


def lwa_block(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, hw: tuple[int, int], *,
              taps: dict | None = None) -> np.ndarray:
    """Local window attention block (L2ViT §4.3, Fig. 3, Appendix 12).

        X <- X + DWConv_3x3(X)                               (CPE, "cpe.0")
        X <- X + WindowAttn(LN_1 X)                          (Swin window attention, softmax, window 7)
        X <- X + DWConv_3x3(X)                               (official only: "cpe.1", ``lwa_cpe="twice"``)
        X <- X + MLP(LN_2 X)

    The window attention is :func:`refimpl.attention.softmax.window_attention` with the config's options:
    no relative-position bias (CPE replaces it), shift ``cfg.window_shift`` (0), and zero padding to the
    window multiple with padded keys masked (paper) or taking part (official: keys = qkv bias).

    Parameters
    ----------
    x : float array (B, N, C).  hw : (H, W), N = H W (any H, W: padded to the window).
    params : "cpe.0.proj.*" (and "cpe.1.proj.*" for "twice"), "norm1.*", "attn.qkv.*", "attn.proj.*"
        (and "attn.relative_position_bias_table" with the bias), "norm2.*", "mlp.*".
    cfg : :class:`L2ViTConfig`.  taps : dict or None; records "cpe", "attn_out", "cpe1", "mlp" (B, N, C)
        and the window attention's taps under "attn." names.

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    L2ViT §4.3, Fig. 3, Appendix 12; Swin Transformer §3.2.
    """
    validation.check_config(cfg, L2ViTConfig)
    x, hw = _check_hw(x, hw, cfg.dim)
    _check_params(params, cfg, "lwa", "lwa_block")
    validation.check_taps(taps)
    inner: dict | None = {} if taps is not None else None
    x = _cpe(x, params, "cpe.0", hw)
    y = _ln(x, params, "norm1", cfg).reshape(x.shape[0], hw[0], hw[1], cfg.dim)
    a = window_attention(y, subparams(params, "attn"), taps=inner, **_window_kwargs(cfg)).reshape(x.shape)
    x1 = x + a
    if cfg.lwa_cpe == "twice":
        x1 = _cpe(x1, params, "cpe.1", hw)
    m = mlp(_ln(x1, params, "norm2", cfg), subparams(params, "mlp"))
    if taps is not None:
        taps.update(cpe=x, attn_out=a, cpe1=x1, mlp=m)
        taps.update({"attn." + key: val for key, val in inner.items()})
    return x1 + m


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def l2vit_param_shapes(cfg: L2ViTConfig, block: str) -> dict[str, tuple[int, ...]]:
    """Parameter keys and shapes of an "lga" or "lwa" block (= the PyTorch twin's state_dict, float entries)."""
    validation.check_config(cfg, L2ViTConfig)
    c, h, kk, kc, hid = cfg.dim, cfg.num_heads, cfg.lcm_kernel, cfg.cpe_kernel, cfg.mlp_hidden
    shapes: dict[str, tuple[int, ...]] = {"cpe.0.proj.weight": (c, 1, kc, kc), "cpe.0.proj.bias": (c,),
                                          "norm1.weight": (c,), "norm1.bias": (c,),
                                          "attn.qkv.weight": (3 * c, c)}
    if cfg.qkv_bias:
        shapes["attn.qkv.bias"] = (3 * c,)
    shapes.update({"attn.proj.weight": (c, c), "attn.proj.bias": (c,)})
    if block == "lga":
        shapes["attn.scale" if cfg.scale_mode == "scalar" else "attn.temperature"] = \
            (1,) if cfg.scale_mode == "scalar" else (h, 1, 1)
        if cfg.lcm_placement == "residual":
            shapes.update({"norm3.weight": (c,), "norm3.bias": (c,)})
        shapes.update({"local_mp.conv1.weight": (c, 1, kk, kk), "local_mp.conv1.bias": (c,),
                       "local_mp.bn.weight": (c,), "local_mp.bn.bias": (c,), "local_mp.bn.running_mean": (c,),
                       "local_mp.bn.running_var": (c,), "local_mp.conv2.weight": (c, 1, kk, kk),
                       "local_mp.conv2.bias": (c,)})
    elif block == "lwa":
        if cfg.window_rel_pos_bias:
            shapes["attn.relative_position_bias_table"] = ((2 * cfg.window_size - 1) ** 2, h)
        if cfg.lwa_cpe == "twice":
            shapes.update({"cpe.1.proj.weight": (c, 1, kc, kc), "cpe.1.proj.bias": (c,)})
    else:
        raise ArgumentError(f"argument 'block': expected 'lga' or 'lwa', got {block!r}")
    shapes.update({"norm2.weight": (c,), "norm2.bias": (c,), "mlp.fc1.weight": (hid, c), "mlp.fc1.bias": (hid,),
                   "mlp.fc2.weight": (c, hid), "mlp.fc2.bias": (c,)})
    return shapes


def init_l2vit_params(cfg: L2ViTConfig, block: str, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float64 parameters of a block: weights N(0, 1 / fan_in), biases N(0, 0.1^2), norm weights
    1 + N(0, 0.1^2), BN running variance U(0.5, 2); the scale at the paper's init sqrt(C) and the temperature
    at the released init d^-1/2 (Appendix 7; the released code).  For tests, docs and benchmarks."""
    validation.check_config(cfg, L2ViTConfig)
    rng = np.random.default_rng(validation.check_seed(seed))
    out: dict[str, np.ndarray] = {}
    for key, shape in l2vit_param_shapes(cfg, block).items():
        if key == "attn.scale":
            out[key] = np.full(shape, math.sqrt(cfg.dim))
        elif key == "attn.temperature":
            out[key] = np.full(shape, cfg.head_dim ** -0.5)
        elif key.endswith("running_var"):
            out[key] = rng.uniform(0.5, 2.0, shape)
        elif key.endswith("weight") and len(shape) > 1:
            out[key] = rng.standard_normal(shape) / math.sqrt(int(np.prod(shape[1:])))
        elif key.endswith("weight"):
            out[key] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            out[key] = 0.1 * rng.standard_normal(shape)
    return out


# ===================================================================================================
# The error model of the module, LCM and the blocks (the core's bound: enhanced_core; conventions of
# refimpl.attention.focused_bounds)
# ===================================================================================================

def _err_attention_module(x, e_x, params, cfg, dtype):
    b, n, c = x.shape
    h, d = cfg.num_heads, cfg.head_dim
    qkv, e, k1 = err_linear(x, e_x, _p(params, "qkv.weight"), _opt(params, "qkv.bias"), dtype)
    qkv, e = qkv.reshape(b, n, 3, h, d), e.reshape(b, n, 3, h, d)
    (q, k, v), (eq, ek, ev) = [[t[:, :, i].transpose(0, 2, 1, 3) for i in range(3)] for t in (qkv, e)]
    s, mode = _scale_args(params, cfg)
    eo, k2 = _err_core(q, k, v, eq, ek, ev, c_min=cfg.c_min, scale=s, scale_mode=mode, scale_target=cfg.scale_target,
                       dtype=dtype)
    o = enhanced_linear_attention(q, k, v, c_min=cfg.c_min, scale=s, scale_mode=mode, scale_target=cfg.scale_target)
    y, ey = o.transpose(0, 2, 1, 3).reshape(b, n, c), eo.transpose(0, 2, 1, 3).reshape(b, n, c)
    out, eout, k3 = err_linear(y, ey, _p(params, "proj.weight"), _opt(params, "proj.bias"), dtype)
    return out, eout, k1 + k2 + 1 + k3


def enhanced_attention_bound(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, *, dtype: Any = None,
                             order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`enhanced_attention`: qkv projection (gamma_{C+1}), the core, the projection.
    Scale (B, N, C).

    Range: the bound is not rescaled; where x exceeds 2^256 (config.RANGE_RESCALE_EXPONENT) and the bound
    overflows, FloatingPointError naming the stage (numerics.check_bound_range).

    References
    ----------
    L2ViT Eq. 4; docs/design.md "The verdict".
    """
    validation.check_config(cfg, L2ViTConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg, "lga", "enhanced_attention_bound", prefix="attn.")
    _, e, depth = _err_attention_module(x, np.zeros_like(x), params, cfg, dtype)
    return numerics.check_bound_range(_bound(e, depth, "enhanced attention", dtype), "enhanced_attention_bound", x=x)


def enhanced_attention_stages(params: Mapping[str, Any], cfg: L2ViTConfig) -> list[numerics.Stage]:
    """The stages of :func:`enhanced_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C) (the qkv projection's input); "qkv" (B, N, 3C); "core" (B, N, C), the enhanced linear
    attention with heads merged (the output projection's input); "proj" (B, N, C).

    References
    ----------
    L2ViT Eq. 4 (and Appendix 8 for the scale); docs/design.md "Stages".
    """
    _check_params(params, cfg, "lga", "enhanced_attention_stages", prefix="attn.")
    h, d, c = cfg.num_heads, cfg.head_dim, cfg.dim
    s, mode = _scale_args(params, cfg)

    def heads(qkv):
        b, n, _ = qkv.shape
        t = qkv.reshape(b, n, 3, h, d)
        return [t[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]

    def merge(o):
        return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], c)

    def core(qkv):
        return merge(enhanced_linear_attention(*heads(qkv), c_min=cfg.c_min, scale=s, scale_mode=mode,
                                               scale_target=cfg.scale_target))

    def core_bound(qkv, dtype=None):
        q, k, v = heads(qkv)
        z = np.zeros_like
        e, depth = _err_core(q, k, v, z(q), z(k), z(v), c_min=cfg.c_min, scale=s, scale_mode=mode,
                             scale_target=cfg.scale_target, dtype=dtype)
        return _bound(merge(e), depth + 1, "enhanced linear attention on exact q, k, v", dtype)

    def lin(name, source, key):
        w, b = _p(params, key + ".weight"), _opt(params, key + ".bias")
        return numerics.Stage(name, (source,), lambda t: linear(t, w, b),
                              lambda t, dtype=None: linear_bound(t, w, b), f"L2ViT: the {key} projection")

    return [lin("qkv", "x", "qkv"),
            numerics.Stage("core", ("qkv",), core, core_bound,
                           "L2ViT Eq. 4: ReLU(Q) (ReLU(K)^T V) / max(ReLU(Q) sum ReLU(K), C_min), scaled by s"),
            lin("proj", "core", "proj")]


def _err_lcm(x, e_x, params, hw, bn_eps):
    g, eg = _grid(x, hw), _grid(e_x, hw)
    g1, e1, k1 = err_dwconv(g, eg, _p(params, "conv1.weight"), _opt(params, "conv1.bias"))
    a = gelu(g1)
    gb = gelu_bound(g1)
    ea = config.GELU_LIPSCHITZ * e1 + gb.k * np.asarray(gb.scale)
    rv = _p(params, "bn.running_var")[:, None, None]
    w = _p(params, "bn.weight")[:, None, None]
    bn = batch_norm2d(a, _p(params, "bn.weight"), _p(params, "bn.bias"), _p(params, "bn.running_mean"),
                      _p(params, "bn.running_var"), bn_eps)
    s_bn = (np.abs(a) + np.abs(_p(params, "bn.running_mean"))[:, None, None]) / np.sqrt(rv + bn_eps) * np.abs(w) \
        + np.abs(_p(params, "bn.bias"))[:, None, None]
    ebn = np.abs(w) / np.sqrt(rv + bn_eps) * ea + 6.0 * s_bn
    g2, e2, k2 = err_dwconv(bn, ebn, _p(params, "conv2.weight"), _opt(params, "conv2.bias"))
    return _tokens(g2), _tokens(e2), k1 + gb.k + 6 + k2


def lcm_bound(x: Any, params: Mapping[str, Any], hw: tuple[int, int], *,
              batch_norm_eps: float = config.BATCH_NORM_EPS) -> numerics.Bound:
    """Error bound of :func:`lcm`: depthwise conv (gamma_{k^2+1}), GELU (Lipschitz config.GELU_LIPSCHITZ on
    the propagated error, layers.gelu_bound's own), eval BatchNorm (|w| / sqrt(var + eps) on the propagated
    error, 6 roundings), depthwise conv.  Scale (B, N, C).

    References
    ----------
    L2ViT Eq. 6-7; docs/design.md "The verdict".
    """
    validation.check_eps(batch_norm_eps, "batch_norm_eps")
    x, hw = _check_hw(x, hw, None)
    _check_lcm_params(params, x.shape[-1], "lcm_bound")
    _, e, depth = _err_lcm(x, np.zeros_like(x), params, hw, batch_norm_eps)
    return _bound(e, depth, "LCM")


def _err_cpe(x, e_x, params, prefix, hw):
    """The CPE x + DWConv3x3(x) on tokens (B, N, C) carrying E_x (units of u_T): layers.cpe_error, the CPE's one
    error path, in the first-order model with every sum charged at u_T.  Returns (y, E_y, k) on tokens."""
    y, ey, k = cpe_error(_grid(x, hw), _grid(e_x, hw), _p(params, prefix + ".proj.weight"),
                         _opt(params, prefix + ".proj.bias"), bounds.Precision.coefficients())
    return np.ascontiguousarray(_tokens(y)), np.ascontiguousarray(_tokens(ey)), k


def _err_ln(x, e_x, params, name, cfg):
    return err_layer_norm(x, e_x, _p(params, name + ".weight"), _p(params, name + ".bias"), cfg.layer_norm_eps)


def _err_mlp(x, e_x, p):
    h, eh, k1 = err_linear(x, e_x, _p(p, "fc1.weight"), _opt(p, "fc1.bias"))
    g = gelu(h)
    gb = gelu_bound(h)
    eg = config.GELU_LIPSCHITZ * eh + gb.k * np.asarray(gb.scale)
    y, ey, k2 = err_linear(g, eg, _p(p, "fc2.weight"), _opt(p, "fc2.bias"))
    return y, ey, k1 + gb.k + k2


def _residual(x, ex, y, ey):
    return x + y, ex + ey + np.abs(x) + np.abs(y)


def lga_block_bound(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, hw: tuple[int, int], *,
                    dtype: Any = None, order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`lga_block` (either order): CPE, LayerNorms (Jacobian propagation +
    layers.layer_norm_bound), the attention, LCM, MLP and the three residual additions, chained stage by
    stage.  Scale (B, N, C).

    References
    ----------
    L2ViT Eq. 4-8, Fig. 3; docs/design.md "The verdict".
    """
    validation.check_config(cfg, L2ViTConfig)
    x, hw = _check_hw(x, hw, cfg.dim)
    _check_params(params, cfg, "lga", "lga_block_bound")
    x, ex, depth = _err_cpe(x, np.zeros_like(x), params, "cpe.0", hw)
    y, ey, k = _err_ln(x, ex, params, "norm1", cfg)
    a, ea, ka = _err_attention_module(y, ey, subparams(params, "attn"), cfg, dtype)
    depth += k + ka
    lp = subparams(params, "local_mp")
    if cfg.lcm_placement == "residual":
        x1, ex1 = _residual(x, ex, a, ea)
        y3, ey3, k3 = _err_ln(x1, ex1, params, "norm3", cfg)
        lo, elo, kl = _err_lcm(y3, ey3, lp, hw, cfg.batch_norm_eps)
        x2, ex2 = _residual(x1, ex1, lo, elo)
        depth += 2 + k3 + kl
    else:
        lo, elo, kl = _err_lcm(a, ea, lp, hw, cfg.batch_norm_eps)
        x2, ex2 = _residual(x, ex, lo, elo)
        depth += 1 + kl
    y2, ey2, k2 = _err_ln(x2, ex2, params, "norm2", cfg)
    m, em, km = _err_mlp(y2, ey2, subparams(params, "mlp"))
    _, eout = _residual(x2, ex2, m, em)
    return _bound(eout, depth + k2 + km + 1, "LGA block")


def _err_window_attention(x, e_x, p, cfg, dtype):
    """E of :func:`refimpl.attention.softmax.window_attention` on a (B, H, W, C) grid with input errors:
    padding, roll and partition move data exactly (E moves with it); qkv and proj by :func:`err_linear`;
    the softmax attention by :func:`refimpl.attention.softmax.softmax_attention_error` with q, k, v errors.
    The mask is built as window_attention builds it (shift regions; padded keys when masked)."""
    b, big_h, big_w, c = x.shape
    ws, sh = cfg.window_size, cfg.window_shift
    h, d = cfg.num_heads, cfg.head_dim
    xp, (hp, wp) = pad_to_multiple(x, ws)
    ep, _ = pad_to_multiple(e_x, ws)
    real = np.zeros((1, hp, wp, 1))
    real[:, :big_h, :big_w] = 1.0
    if sh:
        xp, ep, real = (np.roll(t, (-sh, -sh), axis=(1, 2)) for t in (xp, ep, real))
    xw, ew = window_partition(xp, ws), window_partition(ep, ws)
    n, nw = ws * ws, (hp // ws) * (wp // ws)
    qkv, eqkv, k1 = err_linear(xw, ew, _p(p, "qkv.weight"), _opt(p, "qkv.bias"))
    qkv, eqkv = (t.reshape(-1, n, 3, h, d).transpose(2, 0, 3, 1, 4) for t in (qkv, eqkv))
    keep = np.ones((nw, n, n), dtype=bool)
    if sh:
        keep &= shifted_window_mask(hp, wp, ws, sh)
    if cfg.window_mask_padding and (hp != big_h or wp != big_w):
        keep &= (window_partition(real, ws)[..., 0] > 0)[:, None, :]
    mask = None if keep.all() else np.tile(keep, (b, 1, 1))[:, None]
    bias = None
    if cfg.window_rel_pos_bias:
        bias = relative_position_bias(_p(p, "relative_position_bias_table"), relative_position_index(ws, ws))[None]
    eo = softmax_attention_error(qkv[0], qkv[1], qkv[2], bias=bias, mask=mask, err_q=eqkv[0], err_k=eqkv[1],
                                 err_v=eqkv[2])
    o = softmax_attention(qkv[0], qkv[1], qkv[2], bias=bias, mask=mask)
    o, eo = (t.transpose(0, 2, 1, 3).reshape(-1, n, c) for t in (o, eo))
    y, ey, k3 = err_linear(o, eo, _p(p, "proj.weight"), _opt(p, "proj.bias"))
    ey = window_reverse(ey, ws, hp, wp)
    if sh:
        ey = np.roll(ey, (sh, sh), axis=(1, 2))
    return ey[:, :big_h, :big_w, :], k1 + d + n + 2 * config.ELEMENTARY_FUNCTION_ULPS + k3


def lwa_block_bound(x: Any, params: Mapping[str, Any], cfg: L2ViTConfig, hw: tuple[int, int], *,
                    dtype: Any = None) -> numerics.Bound:
    """Error bound of :func:`lwa_block`: CPE(s), LayerNorms, window attention (with propagated input errors),
    MLP and the residual additions, chained stage by stage.  Scale (B, N, C).

    References
    ----------
    L2ViT §4.3, Fig. 3; Swin §3.2; docs/design.md "The verdict".
    """
    validation.check_config(cfg, L2ViTConfig)
    if dtype is not None:
        numerics.format_name(dtype)         # the check of argument 'dtype' (a float format or its name)
    x, hw = _check_hw(x, hw, cfg.dim)
    _check_params(params, cfg, "lwa", "lwa_block_bound")
    x, ex, depth = _err_cpe(x, np.zeros_like(x), params, "cpe.0", hw)
    y, ey, k = _err_ln(x, ex, params, "norm1", cfg)
    shape4 = (x.shape[0], hw[0], hw[1], cfg.dim)
    ea, ka = _err_window_attention(y.reshape(shape4), ey.reshape(shape4), subparams(params, "attn"), cfg, dtype)
    a = window_attention(y.reshape(shape4), subparams(params, "attn"), **_window_kwargs(cfg)).reshape(x.shape)
    x1, ex1 = _residual(x, ex, a, ea.reshape(x.shape))
    depth += k + ka + 1
    if cfg.lwa_cpe == "twice":
        x1, ex1, kc = _err_cpe(x1, ex1, params, "cpe.1", hw)
        depth += kc
    y2, ey2, k2 = _err_ln(x1, ex1, params, "norm2", cfg)
    m, em, km = _err_mlp(y2, ey2, subparams(params, "mlp"))
    _, eout = _residual(x1, ex1, m, em)
    return _bound(eout, depth + k2 + km + 1, "LWA block")
