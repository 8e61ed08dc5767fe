"""Shared layers: the NumPy reference of the building blocks every network in the five papers uses.

Shapes (used throughout):  B batch, C channels, H x W grid, N = H*W tokens, h heads, ws window size.
Token tensors are channels-last (B, N, C) or (B, H, W, C); image tensors are channels-first (B, C, H, W),
as in PyTorch.

Parameters of composite layers are a flat mapping whose keys are the PyTorch twin's ``state_dict`` keys
relative to the layer (``{"fc1.weight": ..., "fc1.bias": ...}``); :func:`subparams` cuts a network's mapping
down to one layer's.  Every function also has a ``*_bound`` companion where a comparison needs one: it returns
the :class:`refimpl.numerics.Bound` of the error model (scale S = the same computation on absolute values,
depth k derived in its note).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import backends, bounds, config, validation
from .errors import ArgumentError, ArgumentTypeError, ParameterKeyError
from . import numerics
from .numerics import Bound, as_float, check_positive_int, check_shapes
from .verdict import accumulation_format

__all__ = [
    "subparams", "linear", "linear_bound", "layer_norm", "layer_norm_bound", "layer_norm_cf",
    "layer_norm_cf_bound", "batch_norm2d", "batch_norm2d_bound", "gelu", "gelu_bound", "l2_normalize",
    "l2_normalize_bound", "conv2d",
    "conv2d_bound", "conv_padding", "depthwise_conv2d", "depthwise_conv2d_bound", "mlp", "mlp_bound",
    "pad_to_multiple", "window_partition", "window_reverse", "shifted_window_mask",
    "relative_position_index", "relative_position_bias", "cpe", "cpe_bound", "patch_merging",
]


def subparams(params: Mapping[str, np.ndarray], prefix: str) -> Mapping[str, np.ndarray]:
    """The entries of ``params`` under ``prefix`` with ``prefix + "."`` removed from their keys.

    ``subparams(sd, "blocks.0.mlp")`` -> ``{"fc1.weight": ..., "fc1.bias": ..., ...}``.  Raises KeyError
    naming the prefix when nothing matches, so a typo in a key is never silently an empty layer.  For a
    :class:`refimpl.validation.CheckedParams` (a network's checked parameters) the result is its checked
    sub-mapping (:meth:`~refimpl.validation.CheckedParams.sub`: the same entries, from a tree of sub-mappings made
    once per level instead of a pass over the whole mapping), which the layer's own parameter check accepts
    without checking again.
    """
    validation.check_mapping(params, "params", "a mapping of state_dict keys to float arrays")
    if not isinstance(prefix, str):
        raise ArgumentTypeError(f"argument 'prefix': expected a str (a state_dict key prefix), "
                                f"got {validation.describe(prefix)}")
    if isinstance(params, validation.CheckedParams):
        out = params.sub(prefix)
    else:
        head = prefix + "." if prefix else ""
        out = {k[len(head):]: v for k, v in params.items() if isinstance(k, str) and k.startswith(head)}
    if not out:
        raise ParameterKeyError(f"argument 'prefix': no parameters under prefix '{prefix}' "
                                f"(have e.g. {sorted(map(str, params))[:5]})")
    return out


def _param(p: Mapping[str, np.ndarray], key: str, where: str) -> np.ndarray:
    if key not in p:
        raise ParameterKeyError(f"{where}: missing parameter '{key}' (have {len(p)} others: "
                                f"{', '.join(sorted(p)[:8])}{', ...' if len(p) > 8 else ''})")
    return as_float(p[key], key)


# ===================================================================================================
# Linear
# ===================================================================================================

def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = x W^T + b (torch.nn.Linear).

    x : (..., in) float; weight : (out, in); bias : (out,) or None.  Returns (..., out).
    """
    x, weight, bias, dims = _validate_linear(x, weight, bias)
    # One 2-D product: NumPy's stacked matmul on (..., N, in) inputs is up to 10x slower than BLAS gemm.
    y = (x.reshape(-1, dims["in"]) @ weight.T).reshape(*x.shape[:-1], dims["out"])
    if bias is not None:
        if np.result_type(y, bias) == y.dtype:
            np.add(y, bias, out=y)          # in place on the fresh product: the same sums as y + bias, one pass
        else:
            y = y + bias
    return y


def _validate_linear(x, weight, bias):
    """The boundary checks of :func:`linear` and its bound; returns (x, weight, bias, dims) validated."""
    x = as_float(x, "x")
    weight = as_float(weight, "weight")
    dims = check_shapes(weight=(weight, "out in"))
    if x.shape[-1] != dims["in"]:
        raise ArgumentError(f"argument 'x': expected last dimension in={dims['in']} (weight is {weight.shape}), "
                            f"got shape {x.shape}")
    if bias is not None:
        bias = as_float(bias, "bias")
        if np.shape(bias) != (dims["out"],):     # name both: either may be the wrong one
            raise ArgumentError(f"arguments 'weight', 'bias': expected weight (out, in) and bias (out,) with the "
                                f"same out, got weight {weight.shape} and bias {bias.shape}")
    return x, weight, bias, dims


def linear_bound(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> Bound:
    """Higham (3.12): |fl(xW^T + b) - (xW^T + b)| <= gamma_{n+1} (|x||W|^T + |b|), n = in_features
    (n products and n-1 additions, plus one addition for the bias).  Rigorous for any summation order.
    The scale is :func:`refimpl.bounds.linear_scale` (the S of the calculus's linear rule)."""
    x, weight, bias, _ = _validate_linear(x, weight, bias)
    n = np.shape(weight)[-1]
    s = bounds.linear_scale(x, weight, bias)
    return Bound(s, n + (1 if bias is not None else 0), f"linear: gamma_(n+1), n = {n} (Higham 3.12)",
                 accumulation=True)


# ===================================================================================================
# Norms and activations
# ===================================================================================================

def layer_norm(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
               eps: float = config.LAYER_NORM_EPS) -> np.ndarray:
    """LayerNorm over the last dimension (Ba et al., 2016; torch.nn.LayerNorm):
    y = (x - mean) / sqrt(var + eps) * weight + bias, var the biased (1/n) variance, computed in two passes.
    x : (..., C); weight, bias : (C,) or None (no affine part, as in torch.nn.functional.layer_norm);
    eps finite and >= 0.

    The arguments are checked here, then operation "layer_norm" runs (``backends.call``): its definition is
    :func:`_layer_norm_definition` (the NumPy computation, bit for bit the result under the default backend); the
    C kernel (float64) performs the same operations with the sums in another order, within
    :func:`layer_norm_bound`."""
    x = _ln_input(x)
    eps = validation.check_eps(eps)
    c = x.shape[-1]
    weight = None if weight is None else check_vector(weight, "weight", c)
    bias = None if bias is None else check_vector(bias, "bias", c)
    return backends.call("layer_norm", x, weight, bias, eps)


@backends.register("layer_norm", "numpy")
def _layer_norm_definition(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None,
                           eps: float) -> np.ndarray:
    """The definition of operation "layer_norm" on checked arguments (:func:`layer_norm`): the mean, the
    differences, the mean of their squares (NumPy's pairwise sums), the quotient by sqrt(var + eps), then the
    scale and the shift, each a separately rounded operation."""
    mu = np.mean(x, axis=-1, keepdims=True)
    d = x - mu
    var = np.mean(d * d, axis=-1, keepdims=True)
    y = d / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _ln_input(x: Any) -> np.ndarray:
    """The input of a LayerNorm: a float array of shape (..., C), at least 1-d."""
    x = as_float(x, "x")
    if x.ndim == 0:
        raise ArgumentError("argument 'x': expected an array of shape (..., C), got a 0-d scalar")
    return x


def check_vector(v: np.ndarray, name: str, size: int) -> np.ndarray:
    v = as_float(v, name)
    if v.shape != (size,):
        raise ArgumentError(f"argument '{name}': expected shape ({size},), got {v.shape}")
    return v


def layer_norm_bound(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                     eps: float = config.LAYER_NORM_EPS, dtype: Any = None) -> Bound:
    """First-order running bound for LayerNorm over n channels.

    With d_i = x_i - mean and s = sqrt(var + eps):  the computed mean has absolute error <= gamma_{n+1}
    mean|x|, which enters d_i additively but enters var only quadratically (sum_i (x_i - m)^2 is minimal
    at the exact mean), so var has relative error <= gamma_{n+3} and s <= gamma_{n+3}/2 + 2u.  Hence
    |err y_i| <= [(|d_i| + mean|x|) / s |w| + |b|] * gamma_k with k = n + 8 (n+1 for the mean, the
    quotient, the sqrt, the scale and the shift).  First-order in u (products of two error terms dropped);
    not rigorous for n u close to 1.  Over a single channel (n = 1) the mean is x itself, exactly, so
    d = 0 and y = b exactly: only the bias term remains.  With a mixed-precision ``dtype``
    (config.ACCUMULATION_FORMAT) the two length-n sums count numerics.sum_depth(n) and the 8 other roundings
    stay in T (an implementation may store every intermediate in T): k = sum_depth(n) + 8.
    The scale and k are :func:`refimpl.bounds.layer_norm_scale`, the own rounding of the calculus's one LayerNorm
    rule :func:`refimpl.bounds.e_layer_norm` (k S there on an exact input, bit for bit); with ``dtype`` the scale
    is inf on the rows outside the first-order model's domain (:func:`refimpl.bounds.layer_norm_outside`)."""
    validation.check_eps(eps)
    x = _ln_input(x)
    n = x.shape[-1]
    weight = None if weight is None else check_vector(weight, "weight", n)
    bias = None if bias is None else check_vector(bias, "bias", n)
    scale, k = bounds.layer_norm_scale(x, weight, bias, eps, bounds.Precision.coefficients(dtype))
    how = "" if k == n + 8 else f" (the sums over n accumulated in {accumulation_format(dtype)}: k = {k:.4g})"
    return Bound(scale, k, f"layer_norm over n = {n}: first-order, k = n + 8{how}", ref_depth=n + 8)


def layer_norm_cf(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                  eps: float = config.LAYER_NORM_EPS) -> np.ndarray:
    """LayerNorm over the channel axis of a channels-first (B, C, H, W) tensor (ConvNeXt-style)."""
    x = as_float(x, "x")
    check_shapes(x=(x, "B C H W"))
    return np.moveaxis(layer_norm(np.moveaxis(x, 1, -1), weight, bias, eps), -1, 1)


def layer_norm_cf_bound(x: np.ndarray, weight=None, bias=None, eps: float = config.LAYER_NORM_EPS,
                        dtype: Any = None) -> Bound:
    """:func:`layer_norm_bound` of LayerNorm over the channels of a channels-first x (B, C, H, W), in the same
    precision model (``dtype``: the channel sums accumulated in config.ACCUMULATION_FORMAT)."""
    validation.check_eps(eps)
    x = as_float(x, "x")
    check_shapes(x=(x, "B C H W"))
    b = layer_norm_bound(np.moveaxis(x, 1, -1), weight, bias, eps, dtype)
    return b.relayout(lambda a: np.moveaxis(a, -1, 1), note=b.note + " (channels-first)")


def batch_norm2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, running_mean: np.ndarray,
                 running_var: np.ndarray, eps: float = config.BATCH_NORM_EPS) -> np.ndarray:
    """BatchNorm2d in eval mode (Ioffe & Szegedy, 2015): y = (x - running_mean) / sqrt(running_var + eps)
    * weight + bias, per channel.  x : (B, C, H, W); the four vectors : (C,); running_var >= 0 (a negative
    variance would be a silent NaN); eps finite and >= 0."""
    x = as_float(x, "x")
    c = check_shapes(x=(x, "B C H W"))["C"]
    eps = validation.check_eps(eps)
    w, b = check_vector(weight, "weight", c), check_vector(bias, "bias", c)
    rm, rv = check_vector(running_mean, "running_mean", c), check_vector(running_var, "running_var", c)
    if not np.all(rv >= 0):
        bad = ~(rv >= 0)
        raise ArgumentError(f"argument 'running_var': a BatchNorm running variance must be >= 0, got "
                            f"{int(bad.sum())} of {c} entries below 0 or NaN (first: {float(rv[bad][0])!r})")
    col = (slice(None), None, None)
    return (x - rm[col]) / np.sqrt(rv[col] + eps) * w[col] + b[col]


def batch_norm2d_bound(x, weight, bias, running_mean, running_var, eps=config.BATCH_NORM_EPS) -> Bound:
    """Eval BatchNorm is an affine map per channel; whether computed as above or folded into
    x * scale + shift (as PyTorch does), each element sees at most 6 roundings (subtract, add eps, sqrt,
    divide, multiply, add) on magnitudes bounded by (|x| + |rm|) / sqrt(rv + eps) |w| + |b|.  k = 6."""
    validation.check_eps(eps)
    x = as_float(x, "x")
    c = check_shapes(x=(x, "B C H W"))["C"]
    rm, rv = check_vector(running_mean, "running_mean", c), check_vector(running_var, "running_var", c)
    weight, bias = check_vector(weight, "weight", c), check_vector(bias, "bias", c)
    s = bounds.batch_norm_scale(x, weight, bias, rm, rv, eps)
    return Bound(s, bounds.BATCH_NORM_ROUNDINGS, "batch_norm2d eval: 6 roundings per element")


#: The definition of operation "gelu" is refimpl.numerics.gelu itself (it never dispatches: numerics is below
#: refimpl.backends in the import graph); its C and Numba twins are in refimpl/backends/_c_elementwise.py and
#: _numba_elementwise.py (float64).
backends.register("gelu", "numpy", numerics.gelu)


def gelu(x: np.ndarray, approximate: str = "none", *, out: np.ndarray | None = None) -> np.ndarray:
    """GELU(x) = x Phi(x): :func:`refimpl.numerics.gelu` (the definition: x/2 (1 + erf(x / sqrt 2)), or the
    tanh form for ``approximate="tanh"``) through the backend switch, ``backends.call("gelu", ...)``.

    x is first brought to the working precision (numerics.as_float); a float64 array of at least one
    dimension then runs on the selected backend's kernel (C or Numba: the definition's operations with
    libm's erf / tanh, within :func:`gelu_bound`), everything else on the definition.  Under the default
    NumPy backend this is numerics.gelu, bit for bit.  ``out``: an array of x's shape and working dtype (C
    order for the kernels) receiving the result, x itself for in place (the networks' MLPs, on their fresh
    fc1 output: no allocation and no first touch of a new buffer); the same values as without it.
    """
    x = as_float(x, "x")
    if out is None:
        return backends.call("gelu", x, approximate)
    return backends.call("gelu", x, approximate, out=out)


#: The definition of operation "l2_normalize" (the last axis) is refimpl.numerics.l2_normalize itself (numerics is
#: below refimpl.backends and never dispatches), registered here as gelu's is.
@backends.register("l2_normalize", "numpy")
def _l2_normalize_definition(x: np.ndarray, eps: float, policy: str = "clamp") -> np.ndarray:
    """numerics.l2_normalize(x, axis=-1, eps=eps, policy=policy): the definition of operation "l2_normalize"."""
    return numerics.l2_normalize(x, axis=-1, eps=eps, policy=policy)


def l2_normalize(x: Any, eps: float, policy: str = "clamp") -> np.ndarray:
    """x / ||x|| over the last axis, :func:`refimpl.numerics.l2_normalize` (its eps policies "clamp", "add", "none"
    and its scaled norm) through the backend switch, ``backends.call("l2_normalize", ...)``: under the default
    backend numerics.l2_normalize bit for bit; the C kernel (float64) performs its operations with the sum in
    another order, within :func:`l2_normalize_bound`."""
    validation.check_eps(eps)
    validation.check_option(policy, "policy", ("clamp", "add", "none"))
    x = as_float(x, "x")
    if x.ndim == 0:
        raise ArgumentError("argument 'x': expected an array of shape (..., d), got a 0-d scalar")
    return backends.call("l2_normalize", x, eps, policy)


def l2_normalize_bound(x: Any, eps: float, policy: str = "clamp") -> Bound:
    """The rounding bound of x / ||x|| over the last axis (d entries) in any order of its one sum: |y~ - y| <=
    gamma_(d+5) |y|.  The maximum m is exact; each scaled square (x_i / m)^2 carries 3 roundings and their sum d - 1
    more, so the sum is s (1 + theta_(d+2)); the square root halves that and rounds once, the product with m once:
    the norm (1 + theta_(d/2+3)); eps's addition ("add") once, the quotient once: k = d + 5 covers every policy
    (Higham 2002, Lemma 3.1, eq. 3.12).  Scale: |y| (the definition's own values, first order)."""
    validation.check_eps(eps)
    validation.check_option(policy, "policy", ("clamp", "add", "none"))
    x = as_float(x, "x")
    with np.errstate(all="ignore"):
        y = numerics.l2_normalize(x, axis=-1, eps=eps, policy=policy)
    return Bound(np.abs(y), x.shape[-1] + 5, f"l2_normalize over d = {x.shape[-1]}: k = d + 5, scale |y|")


def gelu_bound(x: np.ndarray, approximate: str = "none") -> Bound:
    """GELU(x) = x/2 (1 + erf(x/sqrt 2)).  erf (or tanh) carries ELEMENTARY_FUNCTION_ULPS ulps of error
    relative to |erf| <= 1; the factor (1 + erf) can cancel for x << 0, so the error is bounded in absolute
    terms by |x| (ELEMENTARY_FUNCTION_ULPS + 4) u: scale S = |x|, k = ulps + 4 (scale, add, two products).
    Not rigorous beyond the assumed libm accuracy (see config.ELEMENTARY_FUNCTION_ULPS)."""
    x = as_float(x, "x")
    validation.check_option(approximate, "approximate", ("none", "tanh"))
    return Bound(np.abs(x), bounds.gelu_roundings(approximate), "gelu: libm ulps + 4 on |x|")


# ===================================================================================================
# Convolutions (PyTorch semantics: cross-correlation, zero padding)
# ===================================================================================================

def _pair(v: int | Sequence[int], name: str, minimum: int | None = None) -> tuple[int, int]:
    """An int or a pair of ints (each >= ``minimum`` when given), as a pair."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        k = validation.check_int(v, name, minimum=minimum)
        return k, k
    if isinstance(v, (tuple, list)) and len(v) == 2:
        a, b = validation.check_int_tuple(v, name, 2, minimum=minimum)
        return a, b
    raise ArgumentTypeError(f"argument '{name}': expected an int or a pair of ints, got {validation.describe(v)}")


def conv_padding(padding, kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """PyTorch's padding rule as explicit (top, bottom, left, right) zero padding.

    int p -> p on every side; (ph, pw) -> ph top/bottom, pw left/right; "valid" -> 0;
    "same" (stride 1 only, as in PyTorch) -> total = dilation * (k - 1) per axis, with total // 2 on the
    top/left and the rest on the bottom/right, so an even kernel pads one more at the bottom/right.
    kernel, stride, dilation : pairs of ints >= 1.
    """
    kernel = validation.check_int_tuple(kernel, "kernel", 2, minimum=1)
    stride = validation.check_int_tuple(stride, "stride", 2, minimum=1)
    dilation = validation.check_int_tuple(dilation, "dilation", 2, minimum=1)
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            if stride != (1, 1):
                raise ArgumentError(f"argument 'padding': 'same' requires stride 1 (as in PyTorch), got stride {stride}")
            th, tw = dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1)
            return th // 2, th - th // 2, tw // 2, tw - tw // 2
        raise ArgumentError(f"argument 'padding': expected an int, a pair, 'same' or 'valid', got {padding!r}")
    ph, pw = _pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ArgumentError(f"argument 'padding': expected non-negative padding, got {padding!r}")
    return ph, ph, pw, pw


def _output_size(n: int, k: int, s: int, d: int, lo: int, hi: int, axis: str) -> int:
    span = d * (k - 1) + 1
    if n + lo + hi < span:
        raise ArgumentError(f"argument 'x': padded {axis} size {n + lo + hi} is smaller than the dilated kernel "
                         f"extent {span}")
    return (n + lo + hi - span) // s + 1


def _validate_conv(x, weight, stride, padding, dilation, groups):
    x = as_float(x, "x")
    weight = as_float(weight, "weight")
    dims = check_shapes(x=(x, "B C H W"), weight=(weight, "O Cg KH KW"))
    groups = check_positive_int(groups, "groups")
    if dims["C"] % groups or dims["O"] % groups:
        raise ArgumentError(f"argument 'groups': in_channels {dims['C']} and out_channels {dims['O']} must both "
                         f"be divisible by groups={groups}")
    if dims["Cg"] != dims["C"] // groups:
        raise ArgumentError(f"argument 'weight': expected shape ({dims['O']}, {dims['C'] // groups}, KH, KW) for "
                         f"in_channels={dims['C']}, groups={groups}; got {weight.shape}")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise ArgumentError(f"arguments 'stride'/'dilation': expected >= 1, got {stride}, {dilation}")
    pads = conv_padding(padding, (dims["KH"], dims["KW"]), stride, dilation)
    return x, weight, dims, groups, stride, dilation, pads


def _windows(xp: np.ndarray, kernel, stride, dilation, out_hw) -> np.ndarray:
    """(B, C, Hp, Wp) -> read-only view (B, C, OH, OW, KH, KW) of the receptive fields."""
    span = (dilation[0] * (kernel[0] - 1) + 1, dilation[1] * (kernel[1] - 1) + 1)
    win = sliding_window_view(xp, span, axis=(2, 3))[..., ::dilation[0], ::dilation[1]]
    return win[:, :, ::stride[0], ::stride[1]][:, :, :out_hw[0], :out_hw[1]]


def conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, stride=1, padding=0,
           groups: int = 1, dilation=1) -> np.ndarray:
    """2-D convolution (cross-correlation) with PyTorch's semantics (torch.nn.functional.conv2d).

    out[b, o, i, j] = bias[o] + sum_{c in group(o), u, v} w[o, c, u, v] x_pad[b, c, i*sh + u*dh, j*sw + v*dw]

    x : (B, C, H, W); weight : (O, C / groups, KH, KW); bias : (O,) or None; stride, dilation : int or pair;
    padding : int, pair, "same" or "valid" (see :func:`conv_padding`).  Returns (B, O, OH, OW) with
    OH = (H + pad_top + pad_bottom - dh (KH - 1) - 1) // sh + 1.
    """
    x, weight, dims, g, stride, dilation, pads = _validate_conv(x, weight, stride, padding, dilation, groups)
    kh, kw = dims["KH"], dims["KW"]
    oh = _output_size(dims["H"], kh, stride[0], dilation[0], pads[0], pads[1], "height")
    ow = _output_size(dims["W"], kw, stride[1], dilation[1], pads[2], pads[3], "width")
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    win = _windows(xp, (kh, kw), stride, dilation, (oh, ow))
    bsz, cg, og = dims["B"], dims["C"] // g, dims["O"] // g
    win = win.reshape(bsz, g, cg, oh, ow, kh, kw)
    w = weight.reshape(g, og, cg, kh, kw)
    out = np.einsum("bgcijuv,gocuv->bgoij", win, w, optimize=True).reshape(bsz, dims["O"], oh, ow)
    if bias is not None:
        out = out + check_vector(bias, "bias", dims["O"])[:, None, None]
    return out


def conv2d_bound(x, weight, bias=None, stride=1, padding=0, groups=1, dilation=1) -> Bound:
    """gamma_{n+1} on the convolution of absolute values, n = (C / groups) KH KW (a dot product per
    output; +1 for the bias).  Rigorous for any summation order (Higham 3.12); S and k are
    :func:`refimpl.bounds.conv_parts` through :func:`conv2d`."""
    x, weight, _, groups, stride, dilation, pads = _validate_conv(x, weight, stride, padding, dilation, groups)
    bias = None if bias is None else as_float(bias, "bias")
    s, k, store = bounds.conv_parts(x, weight, bias,
                                    lambda z, w, b: conv2d(z, w, b, stride, padding, groups, dilation),
                                    pads, stride, dilation, groups)
    n = k - (1 if bias is not None else 0)
    return Bound(s, k, f"conv2d: gamma_(n+1), n = {n}" + _winograd_note(store is not None), accumulation=True,
                 store_scale=store)


def _winograd_note(covered: bool) -> str:
    return ("; or Winograd F(6x6, 3x3) / tiled FFT: S = max(S, S_a k_a / k), their transforms in the accumulation "
            "format (refimpl.bounds.conv_scale)") if covered else ""


def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, stride=1,
                     padding=0, dilation=1) -> np.ndarray:
    """Depthwise 2-D convolution: ``conv2d(..., groups=C)`` with one KH x KW filter per channel.

    out[b, c, i, j] = bias[c] + sum_{u, v} w[c, 0, u, v] x_pad[b, c, i*sh + u*dh, j*sw + v*dw]

    x : (B, C, H, W); weight : (C, 1, KH, KW), odd or even KH, KW; bias : (C,) or None; padding as in
    :func:`conv_padding` (PyTorch semantics, "same" pads an even kernel one more at the bottom/right).
    Used by LCM (L2ViT), DWC (FLatten), CPE, LePE (RALA) and the Castling conv branch.
    Computed by the backend selected with :func:`refimpl.backends.use` (operation "depthwise_conv2d"; the
    kernels' predicates take dilation (1, 1) only); the NumPy definition is :func:`_depthwise_conv2d_numpy`,
    which every accelerated kernel must match.
    """
    x, weight, bias, stride, pads, dilation = _validate_depthwise(x, weight, bias, stride, padding, dilation)
    return backends.call("depthwise_conv2d", x, weight, bias, stride, pads, dilation)


def _validate_depthwise(x, weight, bias, stride, padding, dilation):
    """The boundary checks of :func:`depthwise_conv2d` and its bound; returns (x, weight, bias, stride, pads,
    dilation) validated."""
    x = as_float(x, "x")
    weight = as_float(weight, "weight")
    dims = check_shapes(x=(x, "B C H W"), weight=(weight, "C 1 KH KW"))
    if bias is not None:
        bias = check_vector(bias, "bias", dims["C"])
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise ArgumentError(f"arguments 'stride'/'dilation': expected >= 1, got {stride}, {dilation}")
    pads = conv_padding(padding, (dims["KH"], dims["KW"]), stride, dilation)
    _output_size(dims["H"], dims["KH"], stride[0], dilation[0], pads[0], pads[1], "height")
    _output_size(dims["W"], dims["KW"], stride[1], dilation[1], pads[2], pads[3], "width")
    return x, weight, bias, stride, pads, dilation


@backends.register("depthwise_conv2d", "numpy")
def _depthwise_conv2d_numpy(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                            stride: tuple[int, int], pads: tuple[int, int, int, int],
                            dilation: tuple[int, int] = (1, 1), out: np.ndarray | None = None) -> np.ndarray:
    """The NumPy definition of the depthwise-conv kernel (validated arguments; the specification of the C
    and Numba kernels).  Accumulates the KH KW shifted, strided slices of the zero-padded input in
    row-major (u, v) order, then adds the bias."""
    _, c, h, w = x.shape
    kh, kw = weight.shape[2], weight.shape[3]
    sh, sw = stride
    top, bottom, left, right = pads
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // sh + 1
    ow = (w + left + right - dilation[1] * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    acc = np.zeros((x.shape[0], c, oh, ow), dtype=x.dtype)
    for u in range(kh):
        for v in range(kw):
            r0, c0 = u * dilation[0], v * dilation[1]
            patch = xp[:, :, r0:r0 + (oh - 1) * sh + 1:sh, c0:c0 + (ow - 1) * sw + 1:sw]
            acc += weight[:, 0, u, v][None, :, None, None] * patch
    if bias is not None:
        acc += bias[None, :, None, None]
    if out is not None:
        out[...] = acc
        return out
    return acc


def depthwise_conv2d_bound(x, weight, bias=None, stride=1, padding=0, dilation=1) -> Bound:
    """gamma_{KH KW + 1} on the depthwise convolution of absolute values (Higham 3.12;
    :func:`refimpl.bounds.conv_parts` through the NumPy definition)."""
    x, weight, bias, stride, pads, dilation = _validate_depthwise(x, weight, bias, stride, padding, dilation)
    s, k, store = bounds.conv_parts(x, weight, bias,
                                    lambda z, w, b: _depthwise_conv2d_numpy(z, w, b, stride, pads, dilation),
                                    pads, stride, dilation, groups=weight.shape[0])
    n = k - (1 if bias is not None else 0)
    return Bound(s, k, f"depthwise conv: gamma_(n+1), n = KH KW = {n}" + _winograd_note(store is not None),
                 accumulation=True, store_scale=store)


# ===================================================================================================
# MLP
# ===================================================================================================

def _check_layer_params(p: Any, expected: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The strict parameter check of a layer's ``p`` (:func:`refimpl.validation.check_params`)."""
    validation.check_mapping(p, "p", "a mapping of the layer's state_dict keys to float arrays")
    validation.check_params(p, expected, where=where)


def _rows(p: Mapping[str, Any], key: str, ndim: int, default: int) -> int:
    """The leading size of ``p[key]`` when it is present with ``ndim`` dimensions, else ``default`` (a
    placeholder: the shape check then reports the key)."""
    shape = np.shape(p[key]) if key in p else ()
    return int(shape[0]) if len(shape) == ndim else default


def _check_in_features(x: np.ndarray, p: Mapping[str, Any], key: str, size: int, where: str) -> None:
    """x's last dimension against the input size of parameter ``key`` (either may be the wrong one)."""
    shape = np.shape(p[key]) if key in p else ()
    if shape and shape[-1] != size:
        raise ArgumentError(f"{where}: argument 'x' of shape {x.shape} and parameter '{key}' of shape "
                            f"{tuple(shape)} disagree on the input size ({size} from x, {shape[-1]} from '{key}')")


def _mlp_params(x: Any, p: Any, where: str) -> np.ndarray:
    """Check ``x`` and the MLP's ``p``: fc1/fc2 weights, and both biases or neither (timm's Mlp(bias=False));
    returns x as a float array."""
    x = _ln_input(x)
    validation.check_mapping(p, "p", "a mapping of the layer's state_dict keys to float arrays")
    c = x.shape[-1]
    _check_in_features(x, p, "fc1.weight", c, where)
    hd = _rows(p, "fc1.weight", 2, _rows(p, "fc1.bias", 1, 1))
    co = _rows(p, "fc2.weight", 2, _rows(p, "fc2.bias", 1, 1))
    expected = {"fc1.weight": (hd, c), "fc2.weight": (co, hd)}
    if "fc1.bias" in p or "fc2.bias" in p:
        expected.update({"fc1.bias": (hd,), "fc2.bias": (co,)})
    _check_layer_params(p, expected, where)
    return x


def mlp(x: np.ndarray, p: Mapping[str, np.ndarray], approximate: str = "none") -> np.ndarray:
    """Transformer MLP: fc2(GELU(fc1(x))) (Vaswani et al., 2017; ViT).  x : (..., C);
    p : {"fc1.weight": (Hd, C), "fc1.bias": (Hd,), "fc2.weight": (C_out, Hd), "fc2.bias": (C_out,)}, the two
    biases both present or both absent (checked strictly: missing, unexpected and misshapen keys refused)."""
    x = _mlp_params(x, p, "mlp")
    h = linear(x, _param(p, "fc1.weight", "mlp"), p.get("fc1.bias"))
    return linear(gelu(h, approximate), _param(p, "fc2.weight", "mlp"), p.get("fc2.bias"))


def mlp_bound(x: np.ndarray, p: Mapping[str, np.ndarray], approximate: str = "none") -> Bound:
    """Propagates fc1's bound S1 through GELU (Lipschitz constant config.GELU_LIPSCHITZ) into fc2:
    S = |W2| (L S1 + |GELU(h)|) + |b2|, k = k_fc1 + k_gelu + k_fc2 (first-order)."""
    x = _mlp_params(x, p, "mlp_bound")
    b1 = linear_bound(x, p["fc1.weight"], p.get("fc1.bias"))
    h = linear(x, p["fc1.weight"], p.get("fc1.bias"))
    g = gelu(h, approximate)
    bg = gelu_bound(h, approximate)
    k1 = b1.k + bg.k
    inner = config.GELU_LIPSCHITZ * np.asarray(b1.scale) + np.abs(g)
    b2 = linear_bound(g, p["fc2.weight"], p.get("fc2.bias"))
    s = linear(inner, np.abs(p["fc2.weight"]), None if p.get("fc2.bias") is None else np.abs(p["fc2.bias"]))
    return Bound(np.maximum(s, b2.scale), k1 + b2.k, f"mlp: fc1 ({b1.k}) + gelu ({bg.k}) + fc2 ({b2.k})")


# ===================================================================================================
# Windows and relative positions (Swin Transformer, Liu et al., 2021)
# ===================================================================================================

def pad_to_multiple(x: np.ndarray, ws: int | tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
    """Zero-pad a (B, H, W, C) map at the bottom and right to multiples of the window (Swin's rule).
    Returns the padded map and (Hp, Wp)."""
    x = as_float(x, "x")
    check_shapes(x=(x, "B H W C"))
    wh, ww = _pair(ws, "ws", minimum=1)
    h, w = x.shape[1], x.shape[2]
    ph, pw = (-h) % wh, (-w) % ww
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)))
    return x, (h + ph, w + pw)


def window_partition(x: np.ndarray, ws: int | tuple[int, int]) -> np.ndarray:
    """(B, H, W, C) with H, W multiples of the window -> (B * nW, wh * ww, C), windows in row-major order
    over the grid and tokens in row-major order inside each window."""
    x = validation.check_float_array(x, "x")
    check_shapes(x=(x, "B H W C"))
    wh, ww = _pair(ws, "ws", minimum=1)
    b, h, w, c = x.shape
    if h % wh or w % ww:
        raise ArgumentError(f"argument 'x': grid {h}x{w} is not a multiple of the window {wh}x{ww}; "
                         f"pad it first with pad_to_multiple")
    x = x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def window_reverse(windows: np.ndarray, ws: int | tuple[int, int], h: int, w: int) -> np.ndarray:
    """Inverse of :func:`window_partition`: (B * nW, wh * ww, C) -> (B, H, W, C)."""
    windows = validation.check_float_array(windows, "windows")
    wh, ww = _pair(ws, "ws", minimum=1)
    h, w = validation.check_int(h, "h", minimum=1), validation.check_int(w, "w", minimum=1)
    if h % wh or w % ww:
        raise ArgumentError(f"arguments 'h', 'w': grid {h}x{w} is not a multiple of the window {wh}x{ww}")
    nw = (h // wh) * (w // ww)
    check_shapes(windows=(windows, "BnW n C"), sizes={"n": wh * ww})
    if windows.shape[0] % nw:
        raise ArgumentError(f"argument 'windows': leading size {windows.shape[0]} is not a multiple of the "
                         f"{nw} windows of a {h}x{w} grid")
    b, c = windows.shape[0] // nw, windows.shape[-1]
    x = windows.reshape(b, h // wh, w // ww, wh, ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def shifted_window_mask(h: int, w: int, ws: int | tuple[int, int], shift: int | tuple[int, int]) -> np.ndarray:
    """Which token pairs of each window may attend to each other after Swin's cyclic shift.

    The (already padded) h x w grid is cut into 3 x 3 regions by the offsets (-ws, -shift) per axis; after
    rolling the grid by -shift a window can contain tokens from different regions, which were not
    neighbours before the roll.  Returns bool (nW, wh*ww, wh*ww): True where both tokens lie in the same
    region (attention allowed).  With shift 0 everything is True.
    """
    h, w = validation.check_int(h, "h", minimum=1), validation.check_int(w, "w", minimum=1)
    wh, ww = _pair(ws, "ws", minimum=1)
    sh, sw = _pair(shift, "shift")
    if h % wh or w % ww:
        raise ArgumentError(f"arguments 'h', 'w': grid {h}x{w} must be a multiple of the window {wh}x{ww}")
    if not (0 <= sh < wh and 0 <= sw < ww):
        raise ArgumentError(f"argument 'shift': expected 0 <= shift < window {wh}x{ww}, got {(sh, sw)}")
    region = np.zeros((1, h, w, 1))
    label = 0
    for hs in (slice(0, -wh), slice(-wh, -sh if sh else None), slice(-sh, None) if sh else slice(0, 0)):
        for wsl in (slice(0, -ww), slice(-ww, -sw if sw else None), slice(-sw, None) if sw else slice(0, 0)):
            region[:, hs, wsl, :] = label
            label += 1
    lab = window_partition(region, (wh, ww))[..., 0]  # (nW, n)
    return lab[:, :, None] == lab[:, None, :]


def relative_position_index(wh: int, ww: int | None = None) -> np.ndarray:
    """Swin's relative-position index: (wh*ww, wh*ww) ints into a ((2wh-1)(2ww-1), h) bias table.

    For tokens i = (yi, xi), j = (yj, xj) in a window: index = (yi - yj + wh - 1) (2 ww - 1) + (xi - xj + ww - 1).
    """
    ww = wh if ww is None else ww
    wh, ww = check_positive_int(wh, "wh"), check_positive_int(ww, "ww")
    ys, xs = np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")
    ys, xs = ys.ravel(), xs.ravel()
    dy = ys[:, None] - ys[None, :] + wh - 1
    dx = xs[:, None] - xs[None, :] + ww - 1
    return dy * (2 * ww - 1) + dx


def relative_position_bias(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Look up the bias: table ((2wh-1)(2ww-1), h) and index (n, n) -> (h, n, n)."""
    table = as_float(table, "table")
    check_shapes(table=(table, "T h"))
    index = np.asarray(index)
    if index.dtype.kind not in "iu":
        raise ArgumentTypeError(f"argument 'index': expected an integer array, got {index.dtype}")
    if index.size and (index.min() < 0 or index.max() >= table.shape[0]):
        raise ArgumentError(f"argument 'index': entries must lie in [0, {table.shape[0]}), got "
                         f"[{index.min()}, {index.max()}]")
    return np.moveaxis(table[index], -1, 0)


# ===================================================================================================
# Conditional positional encoding and patch merging
# ===================================================================================================

def cpe(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Conditional positional encoding (Chu et al., 2021): x + DWConv_kxk(x) with 'same' zero padding.
    x : (B, C, H, W); weight : (C, 1, k, k), k odd (3 in the papers); bias : (C,) or None."""
    x = as_float(x, "x")
    weight = _cpe_weight(weight)
    k = weight.shape[-1]
    return x + depthwise_conv2d(x, weight, bias, padding=k // 2)


def _cpe_weight(weight: Any) -> np.ndarray:
    """The CPE kernel: a float array (C, 1, k, k) with odd k."""
    weight = as_float(weight, "weight")
    if weight.ndim != 4 or weight.shape[-2] != weight.shape[-1] or weight.shape[-1] % 2 == 0:
        raise ArgumentError(f"argument 'weight': expected (C, 1, k, k) with odd k, got {weight.shape}")
    return weight


def cpe_error(x: Any, ex: Any, weight: Any, bias: Any, pr: bounds.Precision, *,
              sums: Callable[[float], float] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(Y, E_Y, K): the CPE y = x + DWConv_kxk(x) (:func:`cpe`; Chu et al. 2021; RALA §3.2) of x (B, C, H, W)
    (float64 reference values), the bound E_Y (absolute) of its computation in the precision ``pr`` from inputs
    within ``ex`` (absolute, x's shape; None: exact inputs) of x, and the depth K of its longest chain of
    roundings.  The one error path of the CPE: :func:`cpe_bound` (exact x, ``sums`` None: ``pr.sums``, a
    mixed-precision accumulation counted as n u_A / u_T + 1) and the networks' CPE stage
    (refimpl.models.ravlt_bounds, an input error, ``sums=float``: an n-term sum counts n in K); ``sums`` changes K
    only, never E_Y.  Not in ``__all__``: the public bound is :func:`cpe_bound` (exact inputs, argument checks).

    The stages, in the rigorous model of ``pr`` (:meth:`refimpl.bounds.Precision.of`; Higham 2002 eq. 2.8 for
    each rounding, eq. 3.12 for the convolution):

    - c = DWConv(x), 'same' zero padding: :func:`refimpl.bounds.e_depthwise`,
      E_c = gamma_(sums(k^2) + [bias]) conv(|x| + E_x, |W|, |b|) + conv(E_x, |W|) + k^2 eta, and the larger
      bound of every other algorithm the convolution may use (:func:`refimpl.bounds.conv_algorithms`);
    - the residual x + c, one rounding charged on the sum (:func:`refimpl.bounds.e_sum2` ``on_sum``:
      fl(x' + c') = (x' + c')(1 + delta), |x' + c'| <= |x + c| + E_x + E_c; additions are exact in the
      subnormal range): E_Y = E_x + E_c + u (|x + c| + E_x + E_c).  This never exceeds the rounding charged on
      |x| + |c'|, and it holds whatever the signs.
    """
    x = as_float(x, "x")
    weight = _cpe_weight(weight)
    sums = pr.sums if sums is None else sums
    pad = weight.shape[-1] // 2
    ex = np.zeros_like(x) if ex is None else ex
    conv = lambda z, w, b: depthwise_conv2d(z, w, b, padding=pad)               # noqa: E731
    c = conv(x, weight, bias)
    ec = bounds.e_depthwise(x, ex, weight, bias, pr, conv, padding=pad)
    depth = sums(weight.shape[-2] * weight.shape[-1]) + (bias is not None) + 1
    return x + c, bounds.e_sum2(x, ex, c, ec, pr, on_sum=True), depth


def cpe_bound(x, weight, bias=None, *, dtype: Any) -> Bound:
    """Error bound of :func:`cpe` computed in precision ``dtype`` on the same (T-exact) x: the CPE's one error
    path :func:`cpe_error` on exact inputs (the depthwise conv by Higham eq. 3.12, the residual's rounding on the
    sum; rigorous), as Bound(E / gamma_K, K) (:func:`refimpl.bounds.rigorous_bound`).  Returns Bound with x's
    shape."""
    weight = _cpe_weight(weight)
    x, weight, bias, _, _, _ = _validate_depthwise(x, weight, bias, 1, weight.shape[-1] // 2, 1)
    pr = bounds.Precision.of(dtype)
    _, e, depth = cpe_error(x, None, weight, bias, pr)
    return bounds.rigorous_bound(e, depth, pr, f"cpe: x + DWConv (Higham eq. 3.12) + one rounding on the sum, "
                                               f"depth K = {depth:.4g}")


def patch_merging(x: np.ndarray, p: Mapping[str, np.ndarray], eps: float = config.LAYER_NORM_EPS) -> np.ndarray:
    """Swin patch merging: (B, H, W, C) -> (B, ceil(H/2), ceil(W/2), 2C).

    Odd H or W are zero-padded at the bottom/right first; the 2 x 2 neighbours are concatenated in the
    order (0,0), (1,0), (0,1), (1,1) (row, col offsets), then LayerNorm(4C) and a bias-free Linear 4C -> 2C.
    p : {"norm.weight", "norm.bias", "reduction.weight"}.
    """
    x = as_float(x, "x")
    c4 = 4 * check_shapes(x=(x, "B H W C"))["C"]
    validation.check_mapping(p, "p", "a mapping of the layer's state_dict keys to float arrays")
    _check_in_features(x, p, "norm.weight", c4, "patch_merging")
    _check_layer_params(p, {"norm.weight": (c4,), "norm.bias": (c4,),
                            "reduction.weight": (_rows(p, "reduction.weight", 2, 2 * c4 // 4), c4)},
                        "patch_merging")
    x, _ = pad_to_multiple(x, 2)
    x = np.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], axis=-1)
    x = layer_norm(x, p.get("norm.weight"), p.get("norm.bias"), eps)
    return linear(x, _param(p, "reduction.weight", "patch_merging"))
