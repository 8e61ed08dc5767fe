"""FLatten: focused linear attention (Han et al., "FLatten Transformer", ICCV 2023) - the NumPy reference.

Shapes used throughout:
    B batch, H x W token grid, N = H W query tokens, n key/value tokens (n = N, or (H // sr)(W // sr) with
    PVT's spatial reduction sr > 1), C channels, h heads, d = C / h head dim, (wh, ww) a window, nW windows.

The mechanism (FLatten §4):

    phi_p(x) = f_p(ReLU(x)),   f_p(x) = ||x|| / ||x**p|| * x**p                                   (Eq. 6)
    O = phi_p(Q) phi_p(K)^T V  (row-normalised as Eq. 4)  +  DWC(V)                          (Eq. 10-12)

f_p keeps the norm (||f_p(x)|| = ||x||, Appendix Eq. 18) and only turns the direction towards the nearest
axis (Proposition 1).  It is homogeneous of degree 1, f_p(c x) = c f_p(x) for c > 0, so it may be evaluated
on x / max(x), whose entries lie in [0, 1]: the power can then neither overflow nor make ||x**p|| underflow
to 0 (which would give 0/0 for any large p), while the exact result is unchanged.  That is the default
``power_scaling="max"``; ``"none"`` evaluates x**p as written (and as the released code does).

Contents, in three files (this one, the public API, re-exports the public names of the other two, so every name
of ``__all__`` is importable from here, its documented home):

- :mod:`refimpl.attention.focused_core` (Eq. 4-6, 10-12; the bottom, imports neither of the others):
  configuration and presets (:class:`FocusedConfig`); the focused function; the attention core (both
  association orders, both normalisers, the optional shifted-window mask); the DWC branch with its resampling
  for sr > 1; the modules' core on projected tokens (APE, per-head features, attention, DWC);
- :mod:`refimpl.attention.focused_bounds` (imports focused_core): the error model (running first-order error
  bounds, E and the l2 coefficient sigma: the focused function's error coefficient, the ``err_*`` stage
  helpers shared with L2ViT, RALA and the networks, the core's errors) and the bounds of the focused function,
  the resampling and the attention;
- this file (imports both; layer: attention, as its parts): the modules for the DeiT/PVT layout
  (:func:`focused_linear_attention`) and the Swin layout (:func:`focused_window_attention`); parameter shapes
  and initialisation; the modules' bounds; the stage lists.

Presets (:meth:`FocusedConfig.preset`): "paper" (the equations; the default) and "official" (what the
authors' released modules compute).  Each departure is one named field of :class:`FocusedConfig`:

=========================  ===================  ======================================================
field                      paper                official
=========================  ===================  ======================================================
relu_eps                   0                    1e-6 added to ReLU(q), ReLU(k)
learnable_scale            False                features divided by softplus(s), s per channel ("scale")
norm_scope                 "head"               "token": f_p's two norms over all C channels, before
                                                the head split
positional_encoding        False                learnable absolute encoding added to K only
normaliser                 "sum"                "mean_scaled": K and V scaled by n^-1/2 each, normaliser
                                                q . mean_j(k_j) + 1e-6
eps                        0                    1e-6 (on the mean-of-keys normaliser)
dwc_shared                 False (C kernels)    True: one d-channel kernel bank shared by all heads
dwc_resample (sr > 1)      "bilinear"           "linear_flat": 1-D linear interpolation of V along the
                                                flattened token order (half-pixel convention)
shift_mask                 "apply"              "ignore": the shifted-window mask is not used
=========================  ===================  ======================================================

Both presets use ``power_scaling="max"`` (equal to the released x**p in exact arithmetic; see
docs/flatten.md for the overflow and 0/0 that x**p causes in float16 and, for large p, in float32).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from .. import config, numerics, validation, verdict
from ..errors import ArgumentError, ArgumentTypeError
from ..layers import conv2d, conv2d_bound, depthwise_conv2d, depthwise_conv2d_bound, layer_norm, layer_norm_bound, linear, linear_bound, \
    shifted_window_mask, window_partition, window_reverse
from .focused_bounds import (_both, _bound, _err_attend, _err_core, _err_features, _err_heads_and_dwc, _err_resample,
                             _feature_depth, _own, err_layer_norm, err_linear, err_norm_linear_l2,
                             focused_attention_bound, focused_function_bound, focused_function_error,
                             resample_linear_bound)
from .focused_typical import attention_typical, focused_function_typical, pre_feature_count
from .focused_core import (FocusedConfig, _attend, _check_order, _core, _features, _merge_heads, _p, _pre_features,
                           _resample_plan, _resample_v, _split_heads, _to_grid, focused_attention, focused_feature_map,
                           focused_function, resample_linear)

__all__ = [
    "FocusedConfig", "focused_function", "focused_feature_map", "focused_function_error", "focused_function_bound",
    "focused_attention", "focused_linear_attention", "focused_window_attention", "resample_linear",
    "resample_linear_bound",
    "focused_param_shapes", "init_focused_params", "focused_attention_bound",
    "focused_linear_attention_bound", "focused_window_attention_bound",
]


# ===================================================================================================
# Modules: the DeiT / PVT layout and the Swin layout
# ===================================================================================================

def _check_params(params: Any, cfg: FocusedConfig, layout: str, hw: tuple[int, int], where: str) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against :func:`focused_param_shapes`
    of the layout; the positional encoding covers the key tokens (global: the (H // sr) x (W // sr) reduced
    grid; window: one window of ``hw`` = (wh, ww))."""
    sr = cfg.sr_ratio if layout == "global" else 1
    n_kv = (hw[0] // sr) * (hw[1] // sr)
    validation.check_params(params, focused_param_shapes(cfg, layout=layout, n_kv=n_kv), where=where)


def _opt(params: Mapping[str, Any], key: str, present: bool) -> np.ndarray | None:
    return _p(params, key) if present else None


def _heads_and_dwc(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements):
    """Shared tail of both layouts: :func:`_core`, then the output projection."""
    y = _core(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements)
    return linear(y, _p(params, "proj.weight"), params.get("proj.bias"))


def _check_x(x: Any, hw: Any, cfg: FocusedConfig) -> tuple[np.ndarray, int, int]:
    x = numerics.as_float(x, "x")
    if not (isinstance(hw, (tuple, list)) and len(hw) == 2):
        raise ArgumentTypeError(f"argument 'hw': expected a pair (H, W), got {hw!r}")
    big_h = numerics.check_positive_int(hw[0], "hw[0]")
    big_w = numerics.check_positive_int(hw[1], "hw[1]")
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": big_h * big_w, "C": cfg.dim})
    return x, big_h, big_w


def focused_linear_attention(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                             order: str = "linear", taps: dict | None = None,
                             max_elements: int | None = None) -> np.ndarray:
    """The focused linear attention module in the DeiT / PVT layout (global attention over the grid).

    q = x W_q + b_q; K, V from x, or - PVT with sr > 1 - from LayerNorm(Conv_{sr x sr, stride sr}(x)) on the
    (H // sr) x (W // sr) grid; then O = proj(normalised phi_p(Q) phi_p(K)^T V + DWC(V)) per head (Eq. 12).
    DeiT is the case sr = 1 (the released repository has no DeiT file; Table 9's "win 14 x 14" is the whole
    grid).  With sr > 1, V is resampled to the H x W grid for the DWC (``cfg.dwc_resample``).

    Parameters
    ----------
    x : float array (B, N, C), N = H W tokens in row-major grid order (already normalised by the block).
    params : mapping keyed like the PyTorch twin's state_dict: "q.weight" (C, C), "q.bias" (C,),
        "kv.weight" (2C, C), "kv.bias" (2C,) (K = first C outputs, V = last C), with sr > 1 "sr.weight"
        (C, C, sr, sr), "sr.bias" (C,), "norm.weight", "norm.bias" (C,); "dwc.weight" (C or d, 1, k, k),
        "dwc.bias"; "proj.weight" (C, C), "proj.bias" (C,); official: "scale" (1, 1, C),
        "positional_encoding" (1, n, C).  See :func:`focused_param_shapes`.
    cfg : :class:`FocusedConfig`.  hw : (H, W).
    order : "linear" or "quadratic" (equal in exact arithmetic).
    taps : dict or None; records "q", "k", "v" (B, *, C), "phi_q", "phi_k" (B,h,*,d), "kv" / "attn",
        "numerator", "denominator", "attention" (B,h,N,d), "dwc" (B,h,N,d), "pre_proj" (B,N,C), "k_pe".

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    FLatten §4.3, Eq. 5-6, 10-12; Appendix D (PVT layouts); PVT's spatial-reduction attention.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_order(order)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention")
    validation.check_taps(taps)
    c = cfg.dim
    q = linear(x, _p(params, "q.weight"), _opt(params, "q.bias", cfg.qkv_bias))
    if cfg.sr_ratio > 1:
        grid = x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)
        red = conv2d(grid, _p(params, "sr.weight"), _p(params, "sr.bias"), stride=cfg.sr_ratio)
        hw_kv = red.shape[2], red.shape[3]
        src = layer_norm(red.reshape(red.shape[0], c, -1).transpose(0, 2, 1), _p(params, "norm.weight"),
                         _p(params, "norm.bias"), cfg.layer_norm_eps)
    else:
        hw_kv, src = (big_h, big_w), x
    kv = linear(src, _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias))
    k, v = kv[..., :c], kv[..., c:]
    if taps is not None:
        taps.update(q=q, k=k, v=v)
    return _heads_and_dwc(q, k, v, params, cfg, hw_kv, (big_h, big_w), None, order, taps, max_elements)


def _int_pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    """An int (the same on both grid axes) or a pair of ints, each >= ``minimum`` (bool, float, str refused)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        v = validation.check_int(value, name, minimum=minimum)
        return v, v
    if not isinstance(value, (tuple, list)):
        raise ArgumentTypeError(f"argument '{name}': expected an integer >= {minimum} or a pair of them, "
                                f"got {validation.describe(value)}")
    a, b = validation.check_int_tuple(value, name, 2, minimum=minimum)
    return a, b


def _window_geometry(hw, window_size, shift):
    wh, ww = _int_pair(window_size, "window_size", 1)
    sh, sw = _int_pair(shift, "shift", 0)
    if hw[0] % wh or hw[1] % ww:
        raise ArgumentError(f"argument 'window_size': grid {hw[0]}x{hw[1]} is not a multiple of the window "
                         f"{wh}x{ww} (the Swin layout of FLatten does not pad)")
    if not (0 <= sh < wh and 0 <= sw < ww):
        raise ArgumentError(f"argument 'shift': expected 0 <= shift < window {wh}x{ww}, got {(sh, sw)}")
    return (wh, ww), (sh, sw)


def focused_window_attention(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                             window_size: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                             order: str = "linear", taps: dict | None = None,
                             max_elements: int | None = None) -> np.ndarray:
    """The focused linear attention module in the Swin layout (W-MSA / SW-MSA replaced; FLatten §4.3).

    The grid is cyclically shifted by -shift, cut into windows, and each window runs focused linear attention
    with its own DWC on the window grid; outputs are merged and shifted back.  With shift > 0 the paper
    preset restricts each query to keys of its own region (Swin's mask, exactly, also in the linear order by
    grouping queries with equal mask rows); the official preset ignores the mask (``cfg.shift_mask``).

    Parameters
    ----------
    x : float array (B, N, C), N = H W (row-major).  H, W multiples of the window (no padding).
    params : "qkv.weight" (3C, C), "qkv.bias" (3C,) (q, k, v = consecutive C-blocks), "dwc.weight",
        "dwc.bias", "proj.weight", "proj.bias"; official: "scale" (1, 1, C), "positional_encoding"
        (1, wh ww, C).  See :func:`focused_param_shapes`.
    cfg : :class:`FocusedConfig` (sr_ratio must be 1).  hw : (H, W).
    window_size : int or (wh, ww).  shift : int or (sh, sw), 0 <= shift < window.
    order, taps, max_elements : as :func:`focused_linear_attention`; taps hold per-window arrays
        (B nW, ...), plus "mask" (nW, n, n) when a mask is applied.

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    FLatten §4.3, Eq. 5-6, 10-12, Tables 6-7 (Swin); Swin Transformer (Liu et al. 2021) §3.2.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_order(order)
    if cfg.sr_ratio != 1:
        raise ArgumentError(f"argument 'cfg': the Swin layout has no spatial reduction, got sr_ratio={cfg.sr_ratio}")
    (wh, ww), (sh, sw) = _window_geometry((big_h, big_w), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention")
    validation.check_taps(taps)
    b, c = x.shape[0], cfg.dim
    grid = x.reshape(b, big_h, big_w, c)
    if sh or sw:
        grid = np.roll(grid, (-sh, -sw), axis=(1, 2))
    win = window_partition(grid, (wh, ww))                          # (B nW, wh ww, C)
    qkv = linear(win, _p(params, "qkv.weight"), _opt(params, "qkv.bias", cfg.qkv_bias))
    q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(big_h, big_w, (wh, ww), (sh, sw))
    if taps is not None:
        taps.update(q=q, k=k, v=v)
        if mask is not None:
            taps["mask"] = mask
    out = _heads_and_dwc(q, k, v, params, cfg, (wh, ww), (wh, ww), mask, order, taps, max_elements)
    grid = window_reverse(out, (wh, ww), big_h, big_w)
    if sh or sw:
        grid = np.roll(grid, (sh, sw), axis=(1, 2))
    return grid.reshape(b, big_h * big_w, c)


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def focused_param_shapes(cfg: FocusedConfig, *, layout: str, n_kv: int) -> dict[str, tuple[int, ...]]:
    """The parameter keys and shapes of a module (= the PyTorch twin's state_dict).

    layout : "global" (DeiT / PVT, :func:`focused_linear_attention`) or "window" (Swin).
    n_kv : number of key tokens the positional encoding covers (global: (H // sr)(W // sr); window: wh ww).
    """
    validation.check_config(cfg, FocusedConfig)
    n_kv = validation.check_int(n_kv, "n_kv", minimum=1)
    c, d, kk = cfg.dim, cfg.head_dim, cfg.kernel_size
    shapes: dict[str, tuple[int, ...]] = {}
    if layout == "global":
        shapes["q.weight"] = (c, c)
        if cfg.qkv_bias:
            shapes["q.bias"] = (c,)
        shapes["kv.weight"] = (2 * c, c)
        if cfg.qkv_bias:
            shapes["kv.bias"] = (2 * c,)
        if cfg.sr_ratio > 1:
            shapes.update({"sr.weight": (c, c, cfg.sr_ratio, cfg.sr_ratio), "sr.bias": (c,),
                           "norm.weight": (c,), "norm.bias": (c,)})
    elif layout == "window":
        shapes["qkv.weight"] = (3 * c, c)
        if cfg.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
    else:
        raise ArgumentError(f"argument 'layout': expected 'global' or 'window', got {layout!r}")
    nb = d if cfg.dwc_shared else c
    shapes.update({"dwc.weight": (nb, 1, kk, kk), "dwc.bias": (nb,), "proj.weight": (c, c), "proj.bias": (c,)})
    if cfg.learnable_scale:
        shapes["scale"] = (1, 1, c)
    if cfg.positional_encoding:
        shapes["positional_encoding"] = (1, n_kv, c)
    return shapes


def init_focused_params(cfg: FocusedConfig, *, layout: str, n_kv: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float64 parameters of the right keys and shapes (weights N(0, 1 / fan_in), biases and the
    positional encoding N(0, 0.1^2), LayerNorm weight 1 + N(0, 0.1^2), scale N(0, 0.5^2)): for tests, docs
    and benchmarks; not the released initialisation (which zeros the scale and the encoding)."""
    validation.check_config(cfg, FocusedConfig)
    validation.check_int(n_kv, "n_kv", minimum=1)
    rng = np.random.default_rng(validation.check_seed(seed))
    out = {}
    for key, shape in focused_param_shapes(cfg, layout=layout, n_kv=n_kv).items():
        if key.endswith("weight") and len(shape) > 1:
            fan_in = int(np.prod(shape[1:]))
            out[key] = rng.standard_normal(shape) / math.sqrt(fan_in)
        elif key == "norm.weight":
            out[key] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif key == "scale":
            out[key] = 0.5 * rng.standard_normal(shape)
        else:
            out[key] = 0.1 * rng.standard_normal(shape)
    return out


# ===================================================================================================
# The modules' bounds (the error model: focused_bounds)
# ===================================================================================================

def focused_linear_attention_bound(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                   dtype: Any = None, order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_linear_attention` (DeiT / PVT layout), either order.

    Stages: q / kv projections (gamma_{C+1}), with sr > 1 the reduction conv (gamma_{C sr^2 + 1}) and its
    LayerNorm (Jacobian + layers.layer_norm_bound), ReLU / eps / softplus scale, f_p
    (:func:`focused_function_error`), attention (:func:`err_attention`), DWC (with resampling), the sum and
    the output projection.  Returns numerics.Bound with scale (B, N, C).  Range: the bound is not rescaled;
    where x exceeds 2^256 (config.RANGE_RESCALE_EXPONENT) and the bound overflows, FloatingPointError naming
    the stage (numerics.check_bound_range).

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention_bound")
    c = cfg.dim
    zero = np.zeros_like(x)

    def err(l2):
        q, eq, kq = err_linear(x, zero, _p(params, "q.weight"), _opt(params, "q.bias", cfg.qkv_bias), dtype, l2)
        depth = kq
        if cfg.sr_ratio > 1:
            grid = x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)
            w_sr, b_sr = _p(params, "sr.weight"), _p(params, "sr.bias")
            red = conv2d(grid, w_sr, b_sr, stride=cfg.sr_ratio)
            s_red = conv2d(np.abs(grid), np.abs(w_sr), np.abs(b_sr), stride=cfg.sr_ratio)
            taps = int(np.prod(w_sr.shape[1:]))
            k_sr = numerics.sum_depth(taps, dtype) + 1
            hw_kv = red.shape[2], red.shape[3]
            tok = red.reshape(red.shape[0], c, -1).transpose(0, 2, 1)
            e_tok = _own(k_sr, numerics.sum_depth_l2(taps, dtype) + 1, s_red, l2)
            e_tok = e_tok.reshape(red.shape[0], c, -1).transpose(0, 2, 1)
            w_kv, b_kv = _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias)
            if l2:      # the conv's outputs err independently: through LayerNorm and kv in quadrature
                kv, ekv, k_nkv = err_norm_linear_l2(tok, e_tok, _p(params, "norm.weight"), _p(params, "norm.bias"),
                                                    cfg.layer_norm_eps, w_kv, b_kv, dtype)
            else:
                src, e_src, k_ln = err_layer_norm(tok, e_tok, _p(params, "norm.weight"), _p(params, "norm.bias"),
                                                  cfg.layer_norm_eps, dtype)
                kv, ekv, k_kv = err_linear(src, e_src, w_kv, b_kv, dtype)
                k_nkv = k_ln + k_kv
            depth = max(depth, k_sr + k_nkv)
        else:
            hw_kv = (big_h, big_w)
            kv, ekv, k_kv = err_linear(x, zero, _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias),
                                       dtype, l2)
            depth = max(depth, k_kv)
        _, eo, d2 = _err_heads_and_dwc(q, eq, kv[..., :c], ekv[..., :c], kv[..., c:], ekv[..., c:], params, cfg,
                                       hw_kv, (big_h, big_w), None, dtype, l2)
        return eo, depth + d2

    return numerics.check_bound_range(_both(err, f"focused_linear_attention ({'sr=' + str(cfg.sr_ratio)})", dtype),
                                      "focused_linear_attention_bound", x=x)


def focused_window_attention_bound(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                   window_size: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                                   dtype: Any = None, order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_window_attention` (Swin layout), either order; stages as
    :func:`focused_linear_attention_bound` (qkv projection, features, attention per window and mask group,
    DWC on the window grid, projection); rolls and window partitions are exact.  Scale (B, N, C).  Range as
    :func:`focused_linear_attention_bound`.

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    (wh, ww), (sh, sw) = _window_geometry((big_h, big_w), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention_bound")
    b, c = x.shape[0], cfg.dim
    grid = x.reshape(b, big_h, big_w, c)
    if sh or sw:
        grid = np.roll(grid, (-sh, -sw), axis=(1, 2))
    win = window_partition(grid, (wh, ww))
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(big_h, big_w, (wh, ww), (sh, sw))

    def err(l2):
        qkv, e, k_lin = err_linear(win, np.zeros_like(win), _p(params, "qkv.weight"),
                                   _opt(params, "qkv.bias", cfg.qkv_bias), dtype, l2)
        _, eo, d2 = _err_heads_and_dwc(qkv[..., :c], e[..., :c], qkv[..., c:2 * c], e[..., c:2 * c],
                                       qkv[..., 2 * c:], e[..., 2 * c:], params, cfg, (wh, ww), (wh, ww), mask,
                                       dtype, l2)
        eg = window_reverse(eo, (wh, ww), big_h, big_w)
        if sh or sw:
            eg = np.roll(eg, (sh, sw), axis=(1, 2))
        return eg.reshape(b, big_h * big_w, c), k_lin + d2

    return numerics.check_bound_range(_both(err, "focused_window_attention", dtype), "focused_window_attention_bound",
                                      x=x)


# ===================================================================================================
# Stages (teacher-forced comparison, refimpl.verdict.compare_stages)
# ===================================================================================================
#
# The stages are cut where the released modules (and the PyTorch twins) have submodules: the projections,
# PVT's reduction conv and its LayerNorm, and the output projection.  Between them lies the "core" (APE on K,
# features, attention, DWC and their sum), whose intermediates are not a submodule's input or output in a
# port; its bound holds with exact (tested) q, k, v.  Tensor names: "x" the module input (the windows for the
# Swin layout), then each stage's name.

def _resample_index_exact(n_in: int, n_out: int, dtype: Any) -> bool:
    """Whether linear resampling n_in -> n_out (:func:`refimpl.attention.focused_core._resample_plan`) computes its
    source coordinates and weights exactly in T: the scale n_in / n_out is a power of two (so the correctly
    rounded quotient is exact), and every intermediate of src = (i + 1/2) scale - 1/2, lambda = src - floor(src)
    and 1 - lambda is representable in the format that computes it (T's accumulation format: torch's upsampling
    computes them in its opmath type), so each correctly rounded operation returns it exactly (Higham eq. 2.4
    with delta = 0).  Then the weights carry no error and the config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS term of
    the general bound vanishes.  False for ``dtype`` None (no format to check)."""
    if dtype is None:
        return False
    mant, _ = math.frexp(n_in / n_out)
    if mant != 0.5:
        return False
    fmt = verdict.accumulation_format(dtype)
    i = np.arange(n_out, dtype=np.float64) + 0.5
    src = np.maximum(i * (n_in / n_out) - 0.5, 0.0)
    lam = src - np.floor(src)
    return all(np.array_equal(numerics.round_to(v, fmt), v) for v in (i, i * (n_in / n_out), src, lam, 1.0 - lam))


def _resample_exact_pass(x, e_x, s_x, size, axis):
    """One pass of linear resampling along ``axis`` whose weights are exact (:func:`_resample_index_exact`):
    y = a (1 - lambda) + b lambda rounds the two products and the sum, with first-order coefficients |a (1 -
    lambda)|, |b lambda| and |y|.  Returns (y, E, sigma): E the l1 coefficient (the inputs' E interpolated, plus
    3 (|a| (1 - lambda) + |b| lambda), which covers the three), sigma the l2 one (the inputs' sigma interpolated,
    by Minkowski, in quadrature with sqrt(|a (1 - lambda)|^2 + |b lambda|^2 + |y|^2)), all in units of u_T."""
    ax = axis % x.ndim
    _, i0, i1, lam = _resample_plan(x.shape[ax], size)
    shape = [1] * x.ndim
    shape[ax] = size
    lam = lam.reshape(shape)
    a, b = np.take(x, i0, axis=ax), np.take(x, i1, axis=ax)
    p1, p2 = np.abs(a) * (1.0 - lam), np.abs(b) * lam
    y = a * (1.0 - lam) + b * lam
    e = np.take(e_x, i0, axis=ax) * (1.0 - lam) + np.take(e_x, i1, axis=ax) * lam + 3.0 * (p1 + p2)
    s = np.hypot(np.take(s_x, i0, axis=ax) * (1.0 - lam) + np.take(s_x, i1, axis=ax) * lam,
                 np.sqrt(p1 * p1 + p2 * p2 + y * y))
    return y, e, s


def _core_stage(params: Mapping[str, Any], cfg: FocusedConfig, hw_kv, hw_q, mask, split) -> numerics.Stage:
    def reference(*t):
        q, k, v = split(*t)
        return _core(q, k, v, params, cfg, hw_kv, hw_q, mask, "linear", None, None)

    def bound(*t, dtype=None):
        q, k, v = split(*t)
        z = np.zeros_like
        _, ey, depth = _err_core(q, z(q), k, z(k), v, z(v), params, cfg, hw_kv, hw_q, mask, dtype)
        return _bound(ey, depth, "core (APE, features, attention, DWC, sum) on exact q, k, v", dtype)

    return numerics.Stage("core", (), reference, bound,
                          "FLatten Eq. 5-6 (f_p features), 10-12 (normalised attention + DWC(V))")


def _linear_stage(name: str, source: str, params: Mapping[str, Any], key: str, bias: bool,
                  equation: str) -> numerics.Stage:
    w, b = _p(params, key + ".weight"), _opt(params, key + ".bias", bias)
    return numerics.Stage(name, (source,), lambda x: linear(x, w, b), lambda x, dtype=None: linear_bound(x, w, b),
                          equation)


def _fine_core_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw_kv, hw_q, mask, qkv_inputs, split
                      ) -> list[numerics.Stage]:
    """The core cut finer, for ports whose features, attention and DWC input can be captured: "phi_q"
    (B, h, N, d), "phi_k" (B, h, n, d) (after the APE), "attention" (B, h, N, d), "dwc_in" (the depthwise
    conv's input, V resampled to the query grid: (B h, d, H, W) for a shared bank, else (B, h d, H, W)), "dwc"
    (its output, same layout) and "core" (B, N, C), their sum with heads merged."""
    h = cfg.num_heads
    shared = cfg.dwc_shared
    w_dwc, b_dwc = _p(params, "dwc.weight"), params.get("dwc.bias")
    pad = w_dwc.shape[-1] // 2
    big_h, big_w = hw_q

    def k_pe(k):
        return k + _p(params, "positional_encoding") if cfg.positional_encoding else k

    def feat_bound(t, e, what, dtype, positional=False):
        _, ephi, d = _err_features(t, e, params, cfg, dtype)
        b = _bound(ephi, _feature_depth(cfg.p, d, dtype) + (1 if cfg.positional_encoding else 0), what, dtype)
        # each entry's own typical error (refimpl.attention.focused_typical): the z unit of the verdict
        a = _pre_features(t, params, cfg)
        c_in2 = pre_feature_count(cfg.relu_eps, cfg.learnable_scale, positional, dtype)
        if cfg.norm_scope == "token":
            typ = _split_heads(focused_function_typical(a, cfg.p, c_in2, dtype=dtype), h)
        else:
            typ = focused_function_typical(_split_heads(a, h), cfg.p, c_in2, dtype=dtype)
        return dataclasses.replace(b, typical=typ)

    def phi_k_bound(*t, dtype=None):
        k = k_pe(split(*t)[1])
        return feat_bound(k, np.abs(k) if cfg.positional_encoding else np.zeros_like(k),
                          "phi_p(K + APE) on exact K", dtype, positional=cfg.positional_encoding)

    def vh_of(*t):
        return _split_heads(split(*t)[2], h)

    def attention(phi_q, phi_k, *t):
        return _attend(phi_q, phi_k, vh_of(*t), normaliser=cfg.normaliser, eps=cfg.eps, order="linear", mask=mask,
                       taps=None, max_elements=None)

    def attention_bound(phi_q, phi_k, *t, dtype=None):
        vh = vh_of(*t)
        z = np.zeros_like
        e, k = _err_attend(phi_q, phi_k, vh, z(phi_q), z(phi_k), z(vh), cfg, mask, dtype)
        b = _bound(e, k, "normalised attention on exact features and V", dtype)
        # each entry's own typical error (refimpl.attention.focused_typical): the z unit of the verdict
        return dataclasses.replace(b, typical=attention_typical(phi_q, phi_k, vh, normaliser=cfg.normaliser,
                                                                 eps=cfg.eps, mask=mask, dtype=dtype))

    def to_conv(vr):            # (B, h, N, d) on the query grid -> the depthwise conv's input layout
        b, _, _, e = vr.shape
        g = _to_grid(vr, hw_q).transpose(0, 1, 4, 2, 3)
        return g.reshape(b * h, e, big_h, big_w) if shared else g.reshape(b, h * e, big_h, big_w)

    def dwc_in(*t):
        return to_conv(_resample_v(vh_of(*t), hw_kv, hw_q, cfg.dwc_resample))

    def dwc_in_bound(*t, dtype=None):
        vh = vh_of(*t)
        if tuple(hw_kv) == tuple(hw_q):
            return numerics.Bound(np.zeros(1), 1.0, "a reshape of V: exact")
        if cfg.dwc_resample == "linear_flat":
            passes = [(hw_kv[0] * hw_kv[1], big_h * big_w)]
        else:
            passes = [(hw_kv[0], big_h), (hw_kv[1], big_w)]
        if all(_resample_index_exact(n_in, n_out, dtype) for n_in, n_out in passes):
            # exact weights (a power-of-two scale: every PVT stage's sr): only the blends' own roundings
            z = np.zeros_like(vh)
            if cfg.dwc_resample == "linear_flat":
                _, e, sig = _resample_exact_pass(vh, z, z, big_h * big_w, 2)
            else:
                g, zg = _to_grid(vh, hw_kv), _to_grid(z, hw_kv)
                g, eg, sg = _resample_exact_pass(g, zg, zg, big_h, 2)
                g, eg, sg = _resample_exact_pass(g, eg, sg, big_w, 3)
                e, sig = (t.reshape(vh.shape[0], h, big_h * big_w, -1) for t in (eg, sg))
            bnd = _bound(to_conv(e), 3 * len(passes), f"V resampled {hw_kv} -> {hw_q} ({cfg.dwc_resample}): "
                                                      f"exact weights, 3 roundings per pass", dtype,
                         sigma=to_conv(sig))
            return dataclasses.replace(bnd, typical=bnd.sigma)
        if cfg.dwc_resample == "linear_flat":
            _, e = _err_resample(vh, np.zeros_like(vh), big_h * big_w, 2, dtype)
            k = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
        else:
            g = _to_grid(vh, hw_kv)
            g, eg = _err_resample(g, np.zeros_like(g), big_h, 2, dtype)
            g, eg = _err_resample(g, eg, big_w, 3, dtype)
            e = eg.reshape(vh.shape[0], h, big_h * big_w, -1)
            k = 2 * (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3)
        return _bound(to_conv(e), k, f"V resampled {hw_kv} -> {hw_q} ({cfg.dwc_resample})", dtype)

    def back(dw, like):         # the conv's output layout -> (B, h, N, d)
        b, _, n, e = like.shape
        return dw.reshape(b, h, e, n).swapaxes(-1, -2)

    def core(att, dw):
        return _merge_heads(att + back(dw, att))

    return [
        numerics.Stage("phi_q", qkv_inputs, lambda *t: _features(split(*t)[0], params, cfg),
                       lambda *t, dtype=None: feat_bound(split(*t)[0], np.zeros_like(split(*t)[0]),
                                                         "phi_p(Q) on exact Q", dtype),
                       "FLatten Eq. 5-6: phi_p(ReLU(Q) / softplus(s))"),
        numerics.Stage("phi_k", qkv_inputs, lambda *t: _features(k_pe(split(*t)[1]), params, cfg), phi_k_bound,
                       "FLatten Eq. 5-6: phi_p(ReLU(K + APE) / softplus(s))"),
        numerics.Stage("attention", ("phi_q", "phi_k") + qkv_inputs, attention, attention_bound,
                       "FLatten Eq. 4, 10: the normalised linear attention"),
        numerics.Stage("dwc_in", qkv_inputs, dwc_in, dwc_in_bound, "FLatten Eq. 12: V on the query grid"),
        numerics.Stage("dwc", ("dwc_in",), lambda g: depthwise_conv2d(g, w_dwc, b_dwc, padding=pad),
                       lambda g, dtype=None: depthwise_conv2d_bound(g, w_dwc, b_dwc, padding=pad),
                       "FLatten Eq. 12: DWC(V)"),
        numerics.Stage("core", ("attention", "dwc"), core,
                       lambda att, dw, dtype=None: numerics.Bound(
                           _merge_heads(np.abs(att) + np.abs(back(dw, att))), 1.0,
                           "the sum attention + DWC(V): one addition", accumulation=True),
                       "FLatten Eq. 12: attention + DWC(V)"),
    ]


def focused_linear_attention_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                    fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`focused_linear_attention` (DeiT / PVT layout), for
    :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C); "q" (B, N, C); with sr > 1 "sr" (B, C, H/sr, W/sr) (the reduction conv's output,
    channels-first as nn.Conv2d gives it) and "norm" (B, n, C); "kv" (B, n, 2C); "core" (B, N, C) (the output
    projection's input); "proj" (B, N, C), the module's output.  ``fine``: the core is cut further into
    "phi_q", "phi_k", "attention", "dwc_in", "dwc" and "core" (:func:`_fine_core_stages`), which the bound
    needs in float16 / bfloat16 at real sizes (docs/verdict.md).

    References
    ----------
    FLatten Eq. 5-6, 10-12; PVT's spatial-reduction attention.
    """
    big_h, big_w = validation.check_grid(hw)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention_stages")
    c = cfg.dim
    stages = [_linear_stage("q", "x", params, "q", cfg.qkv_bias, "FLatten Eq. 5: Q = x W_Q")]
    if cfg.sr_ratio > 1:
        w_sr, b_sr = _p(params, "sr.weight"), _p(params, "sr.bias")
        sr = cfg.sr_ratio

        def grid(x):
            return x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)

        def tokens(red):
            return red.reshape(red.shape[0], c, -1).transpose(0, 2, 1)

        w_n, b_n = _p(params, "norm.weight"), _p(params, "norm.bias")
        stages += [
            numerics.Stage("sr", ("x",), lambda x: conv2d(grid(x), w_sr, b_sr, stride=sr),
                           lambda x, dtype=None: conv2d_bound(grid(x), w_sr, b_sr, stride=sr),
                           "PVT spatial reduction: Conv_{sr x sr, stride sr}"),
            numerics.Stage("norm", ("sr",), lambda red: layer_norm(tokens(red), w_n, b_n, cfg.layer_norm_eps),
                           lambda red, dtype=None: layer_norm_bound(tokens(red), w_n, b_n, cfg.layer_norm_eps,
                                                                    dtype=dtype),
                           "PVT spatial reduction: LayerNorm"),
        ]
        source, hw_kv = "norm", (big_h // sr, big_w // sr)
    else:
        source, hw_kv = "x", (big_h, big_w)
    stages.append(_linear_stage("kv", source, params, "kv", cfg.qkv_bias, "FLatten Eq. 5: K, V = x W_K, x W_V"))
    split = (lambda q, kv: (q, kv[..., :c], kv[..., c:]))
    if fine:
        stages += _fine_core_stages(params, cfg, hw_kv, (big_h, big_w), None, ("q", "kv"), split)
    else:
        stages.append(dataclasses.replace(_core_stage(params, cfg, hw_kv, (big_h, big_w), None, split),
                                          inputs=("q", "kv")))
    stages.append(_linear_stage("proj", "core", params, "proj", True, "FLatten Eq. 12: the output projection"))
    return stages


def focused_window_attention_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                    window_size: int | tuple[int, int],
                                    shift: int | tuple[int, int] = 0, fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`focused_window_attention` (Swin layout), per window, for
    :func:`refimpl.verdict.compare_stages`.  The shift and the window partition are exact and are not stages.

    Tensors: "x" (B nW, n, C), the windows of the shifted grid (the qkv projection's input); "qkv"
    (B nW, n, 3C); "core" (B nW, n, C); "proj" (B nW, n, C) (before the window reverse).  ``fine``: as in
    :func:`focused_linear_attention_stages`.

    References
    ----------
    FLatten Eq. 5-6, 10-12, §4.3 (Swin); Swin Transformer §3.2.
    """
    (wh, ww), (sh, sw) = _window_geometry(validation.check_grid(hw), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention_stages")
    c = cfg.dim
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(hw[0], hw[1], (wh, ww), (sh, sw))
    split = (lambda qkv: (qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]))
    if fine:
        core = _fine_core_stages(params, cfg, (wh, ww), (wh, ww), mask, ("qkv",), split)
    else:
        core = [dataclasses.replace(_core_stage(params, cfg, (wh, ww), (wh, ww), mask, split), inputs=("qkv",))]
    return [_linear_stage("qkv", "x", params, "qkv", cfg.qkv_bias, "FLatten Eq. 5: Q, K, V = x W"), *core,
            _linear_stage("proj", "core", params, "proj", True, "FLatten Eq. 12: the output projection")]
