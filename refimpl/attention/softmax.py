"""Softmax attention and Swin window attention: the baseline both linear-attention papers compare with,
and L2ViT's local window attention (LWA).

Shapes: B batch, h heads, N query tokens, M key tokens, d head dim, e value head dim; window attention
takes a channels-last grid x (B, H, W, C), C = h d, window ws (int or (wh, ww)), n = wh ww tokens per
window, nW windows.

Contents, top to bottom: the error-coefficient helper; :func:`softmax_attention` (+ bound);
:func:`window_attention` (Swin's WindowAttention + the block's padding / cyclic shift, + bound).

Parameters of :func:`window_attention` are keyed like a Swin ``WindowAttention`` state_dict:
"qkv.weight" (3C, C), "qkv.bias" (3C,) (optional), "proj.weight" (C, C), "proj.bias" (C,) (optional),
"relative_position_bias_table" ((2 wh - 1)(2 ww - 1), h) (only with ``rel_pos_bias=True``).

Options (all named, defaults = Swin's equations with clean masking):

- ``shift``: cyclic shift of the (padded) grid by -shift before partitioning and +shift after, with the
  shifted-window mask (Swin §3.2, Fig. 4);
- ``pad``: zero-pad the grid at the bottom/right to a multiple of the window (Swin's released rule); with
  ``pad=False`` a grid that is not a multiple is refused;
- ``mask_padding``: True (default) excludes padded tokens as keys, so padding never changes the attention
  of real tokens; False lets them take part as keys (their keys are the qkv bias, their values the v bias),
  which is what Swin's and L2ViT's released code compute;
- ``rel_pos_bias``: add Swin's relative-position bias B (Swin Eq. 4); False for L2ViT's official LWA;
- ``mask_value``: None (default) excludes masked pairs exactly (-inf logits, probability exactly 0);
  a finite number (Swin's released -100, ``config.SWIN_MASK_VALUE_OFFICIAL``) adds it to the logits instead.

:data:`WINDOW_PRESETS` names the combinations: "swin" (shifted blocks of the paper with clean masking),
"swin_official" (Swin's released masking: -100 additive shift mask, padded keys unmasked) and
"l2vit_official" (L2ViT's local window attention: no relative-position bias, no shift, no padding mask).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import backends, config, numerics, validation
from ..errors import ArgumentError, ArgumentTypeError
from .linear import _eta_times
from ..layers import (linear, linear_bound, pad_to_multiple, relative_position_bias, relative_position_index,
                      shifted_window_mask, window_partition, window_reverse)

__all__ = ["softmax_attention", "softmax_attention_error", "softmax_attention_bound", "window_attention",
           "window_attention_bound", "WINDOW_PRESETS"]

#: Named option sets of :func:`window_attention` (``shift`` is per block: 0 or ws // 2 in Swin).
WINDOW_PRESETS: dict[str, dict[str, Any]] = {
    "swin": dict(rel_pos_bias=True, mask_padding=True, mask_value=None),
    "swin_official": dict(rel_pos_bias=True, mask_padding=False, mask_value=config.SWIN_MASK_VALUE_OFFICIAL),
    "l2vit_official": dict(rel_pos_bias=False, mask_padding=False, mask_value=None, shift=0),
}


def _pair(ws: Any, name: str) -> tuple[int, int]:
    if isinstance(ws, (int, np.integer)) and not isinstance(ws, bool):
        ws = (int(ws), int(ws))
    if not (isinstance(ws, (tuple, list)) and len(ws) == 2):
        raise ArgumentTypeError(f"argument '{name}': expected an int or a pair of ints, got {ws!r}")
    return (numerics.check_positive_int(ws[0], name, minimum=0 if name == "shift" else 1),
            numerics.check_positive_int(ws[1], name, minimum=0 if name == "shift" else 1))


# ===================================================================================================
# Softmax attention
# ===================================================================================================

def _logits(q, k, scale, bias, mask):
    s = (q * scale) @ k.swapaxes(-1, -2)
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return s


def softmax_attention(q: Any, k: Any, v: Any, *, scale: float | None = None, bias: Any = None,
                      mask: Any = None, taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """O = softmax(scale Q K^T + bias, masked) V, row-wise over the keys.

    Parameters
    ----------
    q : float array (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e).
    scale : float, default d^-1/2 (Vaswani et al.; FLatten §3.1 writes exp(Q K^T / sqrt d)).
    bias : float array broadcastable to (B, h, N, M) (e.g. a relative-position bias (h, N, M)), or None.
    mask : bool array broadcastable to (B, h, N, M), True = may attend, or None.  Masked logits are -inf, so
        their probabilities are exactly 0; a row with every key masked is 0/0 = NaN (reported, not hidden).
    taps : dict or None; records "logits" (B,h,N,M) (scaled, biased, masked) and "attn" (B,h,N,M).
    max_elements : guard on B*h*N*M (default ``config.QUADRATIC_MAX_ELEMENTS``).

    Returns
    -------
    ndarray (B, h, N, e), working precision.

    References
    ----------
    L2ViT Eq. 1; FLatten Eq. 1 and §3.1; Vaswani et al. (2017) Eq. 1.
    """
    validation.check_max_elements(max_elements)
    validation.check_taps(taps)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    full = (sz["B"], sz["h"], sz["N"], sz["M"])
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if int(np.prod(full)) > limit:
        raise ArgumentError(f"softmax_attention: the attention matrix would have B*h*N*M = {int(np.prod(full))} "
                         f"elements, above max_elements = {limit}; use window_attention (local windows) or "
                         f"refimpl.attention.linear.linear_attention(order='linear')")
    scale = sz["d"] ** -0.5 if scale is None else validation.check_real(scale, "scale")
    if bias is not None:
        bias = numerics.as_float(bias, "bias")
        _broadcastable(bias, full, "bias")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise ArgumentTypeError(f"argument 'mask': expected a bool array (True = may attend), got dtype {mask.dtype}")
        _broadcastable(mask, full, "mask")
    # Range safety: the logits are formed from q 2^-e_q (per query row) and k 2^-e_k (per head), with the
    # bias scaled alike, and their differences to the row maximum scaled back (numerics.softmax_shifted), so
    # logits beyond the float64 range (1e150-sized q and k) give the saturated softmax they have instead of
    # inf - inf = NaN; v is rescaled per column and the output scaled back.  Inside numerics.pow2_exponent's
    # band every exponent is 0 and this is the unscaled computation bit for bit.
    e_q = numerics.pow2_exponent(q, axis=-1)                  # (B,h,N,1)
    e_k = numerics.pow2_exponent(k, axis=(-2, -1))            # (B,h,1,1)
    e_v = numerics.pow2_exponent(v, axis=-2)                  # (B,h,1,e)
    e_s = e_q + e_k
    if bias is not None and np.any(e_s):
        bias = np.ldexp(bias, -e_s)
    s = _logits(np.ldexp(q, -e_q), np.ldexp(k, -e_k), scale, bias, mask)
    with np.errstate(invalid="ignore"):
        p = numerics.softmax_shifted(s, e_s, axis=-1)
    if taps is not None:
        with np.errstate(over="ignore"):
            taps["logits"], taps["attn"] = np.ldexp(s, e_s), p
    with np.errstate(over="ignore"):
        return np.ldexp(p @ np.ldexp(v, -e_v), e_v)


@backends.register("window_softmax_attention", "numpy")
def _window_softmax_attention_numpy(q: Any, k: Any, v: Any, scale: float, bias: Any = None, mask: Any = None, *,
                                    out: np.ndarray | None = None, workspace: Any = None,
                                    threads: Any = None) -> np.ndarray:
    """The NumPy definition of operation "window_softmax_attention" (twin of the C kernel): per-window
    :func:`softmax_attention` with a bias shared by the windows and a per-window mask (Swin Eq. 4).

    Parameters
    ----------
    q (BW, h, n, d), k (BW, h, m, d), v (BW, h, m, e) : float arrays, windows batch-major.
    scale : float.  bias : None, (h, n, m), (1, h, n, m) or (BW, h, n, m).  mask : None or bool (nW, n, m) /
        (nW, 1, n, m), True = may attend, with BW a multiple of nW (row b nW + w is window w of image b).
    out : optional (BW, h, n, e) array the result is copied into and returned.  workspace, threads :
        accepted and ignored.

    Returns
    -------
    ndarray (BW, h, n, e).

    References
    ----------
    Swin Transformer (Liu et al., 2021) Eq. 4.
    """
    q = numerics.as_float(q, "q")
    b = None
    if bias is not None:
        b = numerics.as_float(bias, "bias")
        b = b[None] if b.ndim == 3 else b
    mk = None
    if mask is not None:
        mk = np.asarray(mask)
        mk = mk[:, 0] if mk.ndim == 4 else mk
        mk = np.tile(mk, (q.shape[0] // mk.shape[0], 1, 1))[:, None]
    res = softmax_attention(q, k, v, scale=float(scale), bias=b, mask=mk)
    if out is not None:
        out[...] = res
        return out
    return res


def _broadcastable(a: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    try:
        np.broadcast_shapes(a.shape, shape)
        ok = np.broadcast_shapes(a.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ArgumentError(f"argument '{name}': shape {a.shape} does not broadcast to (B, h, N, M) = {shape}")


def softmax_attention_error(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float | None = None,
                            bias: Any = None, mask: Any = None, err_q: Any = None, err_k: Any = None,
                            err_v: Any = None, dtype: Any = None) -> np.ndarray:
    """First-order running error coefficient E of :func:`softmax_attention`: |fl_T(O) - O| <= u_T E.

    Derivation (u = u_T; c = ``config.ELEMENTARY_FUNCTION_ULPS``; r = ``config.SOFTMAX_EXP_ARG_ROUNDINGS``;
    E_q, E_k, E_v the inputs' own error coefficients, 0 for exact inputs):

    1. Logits s = (scale q) k^T + b: the scaling (1 rounding), the length-d dot product (gamma_d) and the bias
       add (1) give |ds_ij| <= u Es_ij with
       Es_ij = (d + 2)(|scale| |q_i| . |k_j| + |b_ij|) + |scale| (E_q_i . |k_j| + |q_i| . E_k_j).
    2. Softmax p = exp(s - m) / sum exp(s - m) (max subtraction; m exact).  A logit error ds changes p by
       |dp_ij| <= p_ij ((1 - p_ij) |ds_ij| + sum_{l != j} p_il |ds_il|) (the Jacobian p_ij (delta_jl - p_il),
       taken exactly: the entry's own logit moves it by (1 - p_ij), not by 1 + p_ij).  Own rounding: the
       argument t = s - m carries r roundings (relative u each), i.e. a relative error r |t| u of exp(t), which
       enters through the same Jacobian; exp adds c u; the sum of M non-negative terms adds (M - 1) u; the
       quotient adds u.  With w_i = sum_l p_il |s_il - m_i| and pes_i = sum_l p_il Es_il:
       Ep_ij = p_ij ((1 - 2 p_ij) Es_ij + pes_i + r ((1 - 2 p_ij) |s_ij - m_i| + w_i) + 2c + M).
    3. O = P V, a length-M product: E = M P|V| + Ep |V| + P E_v.
    4. With ``dtype`` given, gradual underflow (Higham eq. 2.8, each rounding may add eta_T absolutely):
       the probabilities (exp and the quotient) err by up to 2 eta_T each, and the M products and M - 1 sums
       of P V add 2M eta_T: E += (eta_T / u_T)(2 sum_j |V_je| + 2M).  Underflow inside the logits is an
       absolute eta_T in exp's argument, i.e. a relative eta_T << u_T in p, and is neglected.

    With a mixed-precision ``dtype`` (config.ACCUMULATION_FORMAT) the lengths d and M above are replaced by
    numerics.sum_depth(d) and sum_depth(M) (the sums accumulated in the wider format, each result rounded once),
    and the softmax is one operation: c and r count u_A / u_T each (its arithmetic is done in the wider
    format), the probabilities are rounded to T once.  A softmax written as separate operations in T (exp of an
    argument rounded to T) is outside that model.

    Masked entries have p = 0 exactly on both sides and contribute nothing.  Not rigorous beyond the
    assumptions on exp (c, r); products of errors (O(u^2)) neglected.

    Returns
    -------
    ndarray (B, h, N, e): E (multiply by u_T for the bound).

    References
    ----------
    Higham (2002) §3.1, Lemma 3.1; docs/design.md "The verdict"; Blanchard, Higham & Higham (2021),
    "Accurately computing the log-sum-exp and softmax functions", IMA J. Numer. Anal. (the |t| u term).
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    d, m_len = sz["d"], sz["M"]
    scale = d ** -0.5 if scale is None else validation.check_real(scale, "scale")
    full = (sz["B"], sz["h"], sz["N"], sz["M"])
    if bias is not None:
        _broadcastable(numerics.as_float(bias, "bias"), full, "bias")
    if mask is not None:
        if np.asarray(mask).dtype != bool:
            raise ArgumentTypeError(f"argument 'mask': expected a bool array (True = may attend), got "
                                    f"{validation.describe(mask)}")
        _broadcastable(np.asarray(mask), full, "mask")
    eq = np.zeros_like(q) if err_q is None else numerics.as_float(err_q, "err_q")
    ek = np.zeros_like(k) if err_k is None else numerics.as_float(err_k, "err_k")
    ev = np.zeros_like(v) if err_v is None else numerics.as_float(err_v, "err_v")
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    r = float(config.SOFTMAX_EXP_ARG_ROUNDINGS)
    # Sums counted by numerics.sum_depth: d and M (or d u_A / u_T + 1, M u_A / u_T + 1 when T accumulates in a
    # wider format, config.ACCUMULATION_FORMAT).  The softmax is one operation there: exp's argument s - max and
    # exp itself are evaluated in A (their c and r roundings count u_A / u_T each) and the probabilities are
    # rounded to T once (the + 1 of sum_m).
    sum_d, sum_m = numerics.sum_depth(d, dtype), numerics.sum_depth(m_len, dtype)
    c, r = c * numerics.accumulation_ratio(dtype), r * numerics.accumulation_ratio(dtype)
    s = _logits(q, k, scale, None if bias is None else numerics.as_float(bias, "bias"), mask)
    with np.errstate(invalid="ignore", over="ignore"):
        p = numerics.softmax(s, axis=-1)
        ab = 0.0 if bias is None else np.abs(numerics.as_float(bias, "bias"))
        es = (sum_d + 2) * (abs(scale) * (np.abs(q) @ np.abs(k).swapaxes(-1, -2)) + ab) \
            + abs(scale) * (eq @ np.abs(k).swapaxes(-1, -2) + np.abs(q) @ ek.swapaxes(-1, -2))
        live = p > 0
        es = np.where(live, es, 0.0)
        m = np.max(s, axis=-1, keepdims=True)
        dev = np.where(live, np.abs(s - m), 0.0)
        w = np.sum(p * dev, axis=-1, keepdims=True)
        pes = np.sum(p * es, axis=-1, keepdims=True)
        # dp_ij = p_ij ((1 - p_ij) ds_ij - sum_{l != j} p_il ds_il): the exact first-order form, for the logit
        # errors and for exp's argument rounding alike ((1 - 2 p) x + sum p x >= (1 - p) x >= 0).
        ep = np.where(live, p * ((1.0 - 2.0 * p) * es + pes + r * ((1.0 - 2.0 * p) * dev + w) + 2.0 * c + sum_m),
                      0.0)
        e_out = sum_m * (p @ np.abs(v)) + ep @ np.abs(v) + p @ ev
    if dtype is not None:
        e_out = e_out + _eta_times(2.0 * np.sum(np.abs(v), axis=-2)[..., None, :] + 2.0 * m_len, dtype) \
            / numerics.unit_roundoff(dtype)
    return e_out


def softmax_attention_bound(q: Any, k: Any, v: Any, *, scale: float | None = None, bias: Any = None,
                            mask: Any = None, dtype: Any = None) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`softmax_attention` from :func:`softmax_attention_error`.

    The running coefficient E already carries the depth factors (M for P V, d + 2 for the logits, the
    softmax's own terms), so the Bound has scale E and k = 1 (gamma_1(u) E = u E to first order).
    ``dtype`` (the tested precision) adds the propagated underflow terms; None omits them.

    References
    ----------
    docs/design.md "The verdict"; L2ViT Eq. 1.
    """
    e = softmax_attention_error(q, k, v, scale=scale, bias=bias, mask=mask, dtype=dtype)
    return numerics.Bound(e, 1, "softmax attention: running error coefficient (logits gamma_(d+2), softmax with "
                                "exp-argument conditioning r|s - max|, P V gamma_M) carried in the scale, k = 1; "
                                "first order, exp accuracy assumed (config.ELEMENTARY_FUNCTION_ULPS)",
                          ref_depth=1.0 / numerics.accumulation_ratio(dtype))


# ===================================================================================================
# Swin window attention
# ===================================================================================================

def _window_setup(x, p, num_heads, window_size, shift, pad, rel_pos_bias, mask_padding, mask_value):
    x = numerics.as_float(x, "x")
    dims = numerics.check_shapes(x=(x, "B H W C"))
    nh = numerics.check_positive_int(num_heads, "num_heads")
    c = dims["C"]
    if c % nh:
        raise ArgumentError(f"argument 'num_heads': channels C = {c} are not divisible by num_heads = {nh}")
    wh, ww = _pair(window_size, "window_size")
    sh, sw = _pair(shift, "shift")
    if not (sh < wh and sw < ww):
        raise ArgumentError(f"argument 'shift': expected 0 <= shift < window {wh}x{ww}, got {(sh, sw)}")
    if mask_value is not None and not np.isfinite(mask_value):
        raise ArgumentError(f"argument 'mask_value': expected a finite number or None (exact exclusion), "
                         f"got {mask_value!r}")
    validation.check_mapping(p, "p", "a mapping keyed like a Swin WindowAttention state_dict")
    # Strict keys and shapes: the weights always, each bias when present (optional), the table with rel_pos_bias.
    expected = {"qkv.weight": (3 * c, c), "proj.weight": (c, c)}
    expected.update({k: s for k, s in (("qkv.bias", (3 * c,)), ("proj.bias", (c,))) if k in p})
    if rel_pos_bias or "relative_position_bias_table" in p:
        expected["relative_position_bias_table"] = ((2 * wh - 1) * (2 * ww - 1), nh)
    validation.check_params(p, expected, where="window attention (argument 'p')")
    wqkv = numerics.as_float(p["qkv.weight"], "qkv.weight")
    wproj = numerics.as_float(p["proj.weight"], "proj.weight")
    numerics.check_shapes(**{"qkv.weight": (wqkv, "C3 C"), "proj.weight": (wproj, "C C")},
                          sizes={"C3": 3 * c, "C": c})
    table = None
    if rel_pos_bias:
        if "relative_position_bias_table" not in p:
            raise KeyError("params: missing 'relative_position_bias_table' (pass rel_pos_bias=False for L2ViT's "
                           "official local window attention)")
        table = numerics.as_float(p["relative_position_bias_table"], "relative_position_bias_table")
        numerics.check_shapes(relative_position_bias_table=(table, "T h"),
                              sizes={"T": (2 * wh - 1) * (2 * ww - 1), "h": nh})
    h, w = dims["H"], dims["W"]
    if not pad and (h % wh or w % ww):
        raise ArgumentError(f"argument 'x': grid {h}x{w} is not a multiple of the window {wh}x{ww} and pad=False")
    return x, dims, nh, (wh, ww), (sh, sw), table


def _window_pieces(x, p, nh, ws, shift, table, mask_padding, mask_value, scale):
    """Shared by the attention and its bound: padded/rolled windows, q k v per window, bias, mask."""
    b, h, w, c = x.shape
    wh, ww = ws
    xp, (hp, wp) = pad_to_multiple(x, ws)
    real = np.zeros((1, hp, wp, 1))
    real[:, :h, :w] = 1.0
    if shift != (0, 0):
        xp = np.roll(xp, (-shift[0], -shift[1]), axis=(1, 2))
        real = np.roll(real, (-shift[0], -shift[1]), axis=(1, 2))
    xw = window_partition(xp, ws)                                   # (B nW, n, C)
    n = wh * ww
    nw = (hp // wh) * (wp // ww)
    qkv = linear(xw, p["qkv.weight"], p.get("qkv.bias"))            # (B nW, n, 3C)
    qkv = qkv.reshape(-1, n, 3, nh, c // nh).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]                                # (B nW, h, n, d)
    scale = (c // nh) ** -0.5 if scale is None else float(scale)
    bias = None
    if table is not None:
        bias = relative_position_bias(table, relative_position_index(wh, ww))[None]   # (1, h, n, n)
    keep = np.ones((nw, n, n), dtype=bool)
    if shift != (0, 0):
        keep &= shifted_window_mask(hp, wp, ws, shift)
    if mask_padding and (hp != h or wp != w):
        real_w = window_partition(real, ws)[..., 0] > 0              # (nW, n) key is a real token
        keep &= real_w[:, None, :]
    mask = None
    if not keep.all():
        keep_b = np.tile(keep, (b, 1, 1))[:, None]                  # (B nW, 1, n, n), windows batch-major
        if mask_value is None:
            mask = keep_b
        else:
            add = np.where(keep_b, 0.0, float(mask_value))
            bias = add if bias is None else bias + add
    return dict(xw=xw, q=q, k=k, v=v, scale=scale, bias=bias, mask=mask, padded=(hp, wp), n=n)


def window_attention(x: Any, p: Mapping[str, Any], *, num_heads: int, window_size: Any, shift: Any = 0,
                     pad: bool = True, rel_pos_bias: bool = True, mask_padding: bool = True,
                     mask_value: float | None = None, scale: float | None = None,
                     taps: dict | None = None) -> np.ndarray:
    """Swin (shifted) window multi-head self-attention on a token grid, with its projections.

    Steps: zero-pad x at the bottom/right to multiples of the window (``pad``); roll by -shift (cyclic
    shift); partition into windows; per window qkv = x W_qkv^T + b, heads split, O = softmax(scale q k^T + B
    [+ masks]) v; merge heads; proj; reverse windows; roll back by +shift; crop the padding.

    Parameters
    ----------
    x : float array (B, H, W, C), channels-last tokens (C = num_heads * d).
    p : mapping with "qkv.weight" (3C, C), "qkv.bias" (3C,) or absent, "proj.weight" (C, C),
        "proj.bias" (C,) or absent, "relative_position_bias_table" ((2wh-1)(2ww-1), num_heads) when
        ``rel_pos_bias``.
    num_heads : int.  window_size : int or (wh, ww).  shift : int or pair, 0 <= shift < window.
    pad, rel_pos_bias, mask_padding, mask_value : the options of the module docstring.
    scale : float or None (d^-1/2, Swin's default; its ``qk_scale`` override).
    taps : dict or None; records "windows" (B nW, n, C) (padded, shifted), "q", "k", "v" (B nW, h, n, d),
        "rel_pos_bias" (h, n, n) (if any), "mask" (B nW, 1, n, n) bool or None (exact exclusion) / the
        additive mask inside "logits", "logits" and "attn" (B nW, h, n, n), "out_windows" (B nW, n, C)
        before the projection.

    Returns
    -------
    ndarray (B, H, W, C).

    References
    ----------
    Swin Transformer (Liu et al., 2021) §3.2, Eq. 4 and Fig. 4; L2ViT §4.3 and Fig. 3 (LWA blocks);
    FLatten §5 (Swin baseline).
    """
    validation.check_taps(taps)
    x, dims, nh, ws, sh, table = _window_setup(x, p, num_heads, window_size, shift, pad, rel_pos_bias,
                                               mask_padding, mask_value)
    pcs = _window_pieces(x, p, nh, ws, sh, table, mask_padding, mask_value, scale)
    inner: dict | None = {} if taps is not None else None
    if taps is None:
        # The per-window core is operation "window_softmax_attention" (the C kernel's predicate picks the calls
        # it takes; the NumPy backend runs its definition, softmax_attention on the same operands).
        bias = pcs["bias"]
        full = pcs["q"].shape[:2] + pcs["k"].shape[2:3] * 2
        if bias is not None and bias.shape != (1,) + full[1:]:     # additive mask: one bias per window
            bias = np.broadcast_to(bias, full)
        o = backends.call("window_softmax_attention", pcs["q"], pcs["k"], pcs["v"], pcs["scale"], bias,
                          None if pcs["mask"] is None else pcs["mask"][:, 0])
    else:
        o = softmax_attention(pcs["q"], pcs["k"], pcs["v"], scale=pcs["scale"], bias=pcs["bias"], mask=pcs["mask"],
                              taps=inner)
    bw, _, n, d = o.shape
    o = o.transpose(0, 2, 1, 3).reshape(bw, n, nh * d)
    y = linear(o, p["proj.weight"], p.get("proj.bias"))
    hp, wp = pcs["padded"]
    y = window_reverse(y, ws, hp, wp)
    if sh != (0, 0):
        y = np.roll(y, sh, axis=(1, 2))
    y = y[:, :dims["H"], :dims["W"], :]
    if taps is not None:
        taps.update(windows=pcs["xw"], q=pcs["q"], k=pcs["k"], v=pcs["v"], mask=pcs["mask"],
                    logits=inner["logits"], attn=inner["attn"], out_windows=o)
        if table is not None:
            taps["rel_pos_bias"] = relative_position_bias(table, relative_position_index(*ws))
    return y


def window_attention_bound(x: Any, p: Mapping[str, Any], *, num_heads: int, window_size: Any, shift: Any = 0,
                           pad: bool = True, rel_pos_bias: bool = True, mask_padding: bool = True,
                           mask_value: float | None = None, scale: float | None = None,
                           dtype: Any = None) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`window_attention` by a first-order running error coefficient.

    qkv: |dq| <= u (C + 1)(|x| |W_q|^T + |b_q|) (Higham 3.12; likewise k, v); these enter
    :func:`softmax_attention_error` as input errors; the relative-position bias is a lookup (exact); the
    projection adds (C + 1)(|O| |W_p|^T + |b_p|) and propagates E_O |W_p|^T.  Padding, roll, partition and
    crop are exact data movement.  Scale = E (depth factors included), k = 1.  ``dtype`` adds the
    underflow terms (:func:`softmax_attention_error`; qkv/proj products: 2(C + 1) eta_T, propagated).

    References
    ----------
    Swin (Liu et al., 2021) Eq. 4; docs/design.md "The verdict"; Higham (2002) §3.1.
    """
    x, dims, nh, ws, sh, table = _window_setup(x, p, num_heads, window_size, shift, pad, rel_pos_bias,
                                               mask_padding, mask_value)
    pcs = _window_pieces(x, p, nh, ws, sh, table, mask_padding, mask_value, scale)
    c = dims["C"]
    d = c // nh
    babs = {k_: np.abs(numerics.as_float(v_, k_)) for k_, v_ in p.items() if k_ in ("qkv.bias", "proj.bias")}
    sqkv = linear(np.abs(pcs["xw"]), np.abs(numerics.as_float(p["qkv.weight"], "qkv.weight")), babs.get("qkv.bias"))
    k_lin = numerics.sum_depth(c, dtype) + 1
    eqkv = k_lin * sqkv.reshape(-1, pcs["n"], 3, nh, d).transpose(2, 0, 3, 1, 4)
    eo = softmax_attention_error(pcs["q"], pcs["k"], pcs["v"], scale=pcs["scale"], bias=pcs["bias"],
                                 mask=pcs["mask"], err_q=eqkv[0], err_k=eqkv[1], err_v=eqkv[2], dtype=dtype)
    o = softmax_attention(pcs["q"], pcs["k"], pcs["v"], scale=pcs["scale"], bias=pcs["bias"], mask=pcs["mask"])
    bw, _, n, _ = o.shape
    o = o.transpose(0, 2, 1, 3).reshape(bw, n, c)
    eo = eo.transpose(0, 2, 1, 3).reshape(bw, n, c)
    wp_abs = np.abs(numerics.as_float(p["proj.weight"], "proj.weight"))
    ey = k_lin * linear(np.abs(o), wp_abs, babs.get("proj.bias")) + eo @ wp_abs.T
    if dtype is not None:  # underflow in the qkv and proj products: (C + 1) eta each, propagated
        ey = ey + _eta_times(2.0 * (c + 1) * (1.0 + np.sum(wp_abs, axis=1)), dtype) / numerics.unit_roundoff(dtype)
    hp, wpd = pcs["padded"]
    ey = window_reverse(ey, ws, hp, wpd)
    if sh != (0, 0):
        ey = np.roll(ey, sh, axis=(1, 2))
    ey = ey[:, :dims["H"], :dims["W"], :]
    return numerics.Bound(ey, 1, f"window attention: running error coefficient through qkv (gamma_(C+1), "
                                 f"C = {c}), softmax attention (softmax_attention_error) and proj "
                                 f"(gamma_(C+1)); depth factors in the scale, k = 1; first order",
                          ref_depth=1.0 / numerics.accumulation_ratio(dtype))


def window_attention_stages(p: Mapping[str, Any], hw: tuple[int, int], *, num_heads: int, window_size: Any,
                            shift: Any = 0, pad: bool = True, rel_pos_bias: bool = True, mask_padding: bool = True,
                            mask_value: float | None = None, scale: float | None = None) -> list[numerics.Stage]:
    """The stages of :func:`window_attention`, per window, for :func:`refimpl.verdict.compare_stages`.  Padding,
    the shift, the window partition and reverse are exact data movement and are not stages.

    Tensors: "x" (B nW, n, C), the windows (the qkv projection's input); "qkv" (B nW, n, 3C); "core"
    (B nW, n, C), softmax(scale q k^T + B [+ masks]) v with heads merged (the output projection's input);
    "proj" (B nW, n, C).

    References
    ----------
    Swin Transformer (Liu et al., 2021) §3.2, Eq. 4.
    """
    big_h, big_w = hw
    c = p["qkv.weight"].shape[-1]
    pieces: dict[int, dict] = {}

    def geometry(bw):            # bias and mask for B = bw / nW items (they depend on the grid, not the data)
        if bw not in pieces:
            wh, ww = _pair(window_size, "window_size")
            nw = -(-big_h // wh) * -(-big_w // ww)
            x0 = np.zeros((bw // nw, big_h, big_w, c))
            x0, _, nh, ws, sh, table = _window_setup(x0, p, num_heads, window_size, shift, pad, rel_pos_bias,
                                                     mask_padding, mask_value)
            pieces[bw] = _window_pieces(x0, p, nh, ws, sh, table, mask_padding, mask_value, scale)
        return pieces[bw]

    def heads(qkv):
        bw, n, _ = qkv.shape
        t = qkv.reshape(bw, n, 3, num_heads, c // num_heads).transpose(2, 0, 3, 1, 4)
        return t[0], t[1], t[2]

    def merge(o):
        return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], c)

    def core(qkv):
        g = geometry(qkv.shape[0])
        return merge(softmax_attention(*heads(qkv), scale=g["scale"], bias=g["bias"], mask=g["mask"]))

    def core_bound(qkv, dtype=None):
        g = geometry(qkv.shape[0])
        b = softmax_attention_bound(*heads(qkv), scale=g["scale"], bias=g["bias"], mask=g["mask"], dtype=dtype)
        return b.relayout(merge)

    def lin(name, source, key):
        w, bias = p[key + ".weight"], p.get(key + ".bias")
        return numerics.Stage(name, (source,), lambda t: linear(t, w, bias),
                              lambda t, dtype=None: linear_bound(t, w, bias), f"Swin Eq. 4: the {key} projection")

    return [lin("qkv", "x", "qkv"),
            numerics.Stage("core", ("qkv",), core, core_bound, "Swin Eq. 4: SoftMax(Q K^T / sqrt(d) + B) V"),
            lin("proj", "core", "proj")]
