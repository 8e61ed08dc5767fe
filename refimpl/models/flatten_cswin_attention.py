"""FLatten-CSwin's cross-shaped window attention (CSwin §3.2, Eq. 1-2) with LePE (CSwin §3.3), softmax or
FLatten's focused branches, and its running error analysis: the block attention of
:mod:`refimpl.models.flatten_cswin` (the network: configuration, parameters, units, bounds, counts), which imports
this module and keeps the public :func:`refimpl.models.flatten_cswin.stripe_attention` (its documented home).

Shapes: B batch, (H_i, W_i) the stage grid, N_i = H_i W_i tokens (row-major), C_i channels, C_b = C_i / (number
of branches) the channels of a branch, nW windows, n = wh ww tokens of a window.  ``cfg`` is the network's
:class:`refimpl.models.flatten_cswin.FlattenCSwinConfig` (read: stage_grids, stage_dim, branch_dims,
branch_windows, attn_types, attention_config).

Each branch, in each of its windows, computes

    softmax stages ("S", CSwin Eq. 1 + LePE Eq. 5):  softmax(Q K^T / sqrt(d)) V + LePE(V)
    focused stages ("L", FLatten Eq. 5-6, 10-12):     normalised phi_p(Q) phi_p(K)^T V + DWC(V) + LePE(V)

Layer: networks (imports attention.focused_core, focused_bounds, softmax, layers, numerics and models.common;
no family module).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention import focused_bounds as _focused_bounds, focused_core as _focused_core
from ..attention import softmax as _softmax
from ..attention.focused import FocusedConfig
from . import common
from .common import Err

__all__ = ["lepe", "branch", "stripe_attention", "e_lepe", "e_branch", "e_stripe_attention"]


# ===================================================================================================
# The cross-shaped stripe attention (CSwin §3.2-3.3) with softmax or focused branches
# ===================================================================================================

def lepe(v: np.ndarray, weight: Any, bias: Any, win: tuple[int, int]) -> np.ndarray:
    """LePE (CSwin §3.3): depthwise k x k conv (zero padding k // 2, bias) of V on each window's grid.
    v (B nW, wh ww, C_b) -> (B nW, wh ww, C_b)."""
    bw, n, cb = v.shape
    w = numerics.as_float(weight, "get_v.weight")
    g = np.ascontiguousarray(v.transpose(0, 2, 1)).reshape(bw, cb, *win)
    y = layers.depthwise_conv2d(g, w, numerics.as_float(bias, "get_v.bias"), padding=w.shape[-1] // 2)
    return y.reshape(bw, cb, n).transpose(0, 2, 1)


def branch(q: np.ndarray, k: np.ndarray, v: np.ndarray, p: Mapping[str, Any], kind: str, heads: int,
           fcfg: FocusedConfig | None, win: tuple[int, int]) -> np.ndarray:
    """One branch in its windows: q, k, v (B nW, n, C_b) -> (B nW, n, C_b).  "S": softmax(Q K^T / sqrt(d)) V
    per head (CSwin Eq. 1) + LePE(V); "L": the focused core (FLatten Eq. 5-6, 10-12: features, attention,
    DWC; refimpl.attention.focused's ``_core``, the same arithmetic as its public modules) + LePE(V)."""
    if kind == "L":
        att = _focused_core._core(q, k, v, p, fcfg, win, win, None, "linear", None, None)
    else:
        bw, n, cb = q.shape
        d = cb // heads

        def split(t):
            return t.reshape(bw, n, heads, d).transpose(0, 2, 1, 3)

        o = _softmax.softmax_attention(split(q), split(k), split(v), scale=d ** -0.5)
        att = o.transpose(0, 2, 1, 3).reshape(bw, n, cb)
    return att + lepe(v, p["get_v.weight"], p["get_v.bias"], win)


def stripe_attention(x: Any, params: Mapping[str, Any], cfg: Any, i: int) -> np.ndarray:
    """:func:`refimpl.models.flatten_cswin.stripe_attention` after its config check (``cfg`` a
    FlattenCSwinConfig): qkv, the cross-shaped branches in their windows, their concatenation, proj."""
    x = numerics.as_float(x, "x")
    (gh, gw), c = cfg.stage_grids[i], cfg.stage_dim(i)
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": gh * gw, "C": c})
    b = x.shape[0]
    qkv = common.linear2d(x, params["qkv.weight"], params.get("qkv.bias"))
    cb, hb = cfg.branch_dims(i)
    kind = cfg.attn_types[i]
    fcfg = cfg.attention_config(i) if kind == "L" else None
    outs = []
    for br, win in enumerate(cfg.branch_windows(i)):
        def part(t, j, br=br):
            g = t[..., j * c + br * cb: j * c + (br + 1) * cb].reshape(b, gh, gw, cb)
            return layers.window_partition(np.ascontiguousarray(g), win)
        y = branch(part(qkv, 0), part(qkv, 1), part(qkv, 2), layers.subparams(params, f"attns.{br}"), kind, hb,
                   fcfg, win)
        outs.append(layers.window_reverse(y, win, gh, gw).reshape(b, gh * gw, cb))
    return common.linear2d(np.concatenate(outs, axis=-1), params["proj.weight"], params["proj.bias"])


# ===================================================================================================
# Its running error analysis (refimpl.models.common's convention)
# ===================================================================================================

def _e_map(t: Err, fn) -> Err:
    return Err(fn(t.value), fn(t.err), t.depth)


def e_lepe(t: Err, weight: Any, bias: Any, win: tuple[int, int], dtype: Any) -> Err:
    """:func:`lepe` with its error (refimpl.attention.focused_bounds.err_dwconv: the 9-term sums and the bias)."""
    bw, n, cb = t.value.shape

    def grid(a):
        return np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(bw, cb, *win)

    y, e, k = _focused_bounds.err_dwconv(grid(t.value), grid(t.err), numerics.as_float(weight, "get_v.weight"),
                                  numerics.as_float(bias, "get_v.bias"), dtype)

    def back(a):
        return a.reshape(bw, cb, n).transpose(0, 2, 1)

    return Err(back(y), back(e), t.depth + k)


def e_branch(q: Err, k: Err, v: Err, p: Mapping[str, Any], kind: str, heads: int, fcfg: FocusedConfig | None,
             win: tuple[int, int], dtype: Any) -> Err:
    """:func:`branch` with the running error analysis: the focused core by focused_bounds.py's stage
    propagation (``_err_core``, as common.e_focused_window uses ``_err_heads_and_dwc``), the softmax core by
    :func:`refimpl.attention.softmax.softmax_attention_error` (as common.e_window_attention), LePE by
    :func:`e_lepe`, then their sum."""
    depth_in = max(q.depth, k.depth, v.depth)
    if kind == "L":
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            y, ey, d_core = _focused_bounds._err_core(q.value, q.err, k.value, k.err, v.value, v.err, p, fcfg, win, win,
                                               None, dtype)
        att = Err(y, ey, depth_in + int(math.ceil(d_core)))
    else:
        bw, n, cb = q.value.shape
        d = cb // heads

        def split(a):
            return a.reshape(bw, n, heads, d).transpose(0, 2, 1, 3)

        def merge(a):
            return a.transpose(0, 2, 1, 3).reshape(bw, n, cb)

        sc = d ** -0.5
        o = _softmax.softmax_attention(split(q.value), split(k.value), split(v.value), scale=sc)
        with np.errstate(invalid="ignore", over="ignore"):
            eo = _softmax.softmax_attention_error(split(q.value), split(k.value), split(v.value), scale=sc,
                                                  err_q=split(q.err), err_k=split(k.err), err_v=split(v.err))
        core_depth = d + n + 2 * config.ELEMENTARY_FUNCTION_ULPS + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4
        att = Err(merge(o), merge(eo), depth_in + core_depth)
    return common.e_add(att, e_lepe(v, p["get_v.weight"], p["get_v.bias"], win, dtype))


def e_stripe_attention(t: Err, params: Mapping[str, Any], cfg: Any, i: int, dtype: Any) -> Err:
    """:func:`stripe_attention` with the running error analysis (window partition and concatenation exact)."""
    (gh, gw), c = cfg.stage_grids[i], cfg.stage_dim(i)
    b = t.value.shape[0]
    qkv = common.e_linear(t, params["qkv.weight"], params.get("qkv.bias"))
    cb, hb = cfg.branch_dims(i)
    kind = cfg.attn_types[i]
    fcfg = cfg.attention_config(i) if kind == "L" else None
    outs = []
    for br, win in enumerate(cfg.branch_windows(i)):
        def part(j, br=br, win=win):
            def cut(a):
                g = a[..., j * c + br * cb: j * c + (br + 1) * cb].reshape(b, gh, gw, cb)
                return layers.window_partition(np.ascontiguousarray(g), win)
            return _e_map(qkv, cut)
        y = e_branch(part(0), part(1), part(2), layers.subparams(params, f"attns.{br}"), kind, hb, fcfg, win, dtype)
        outs.append(_e_map(y, lambda a, win=win: layers.window_reverse(a, win, gh, gw).reshape(b, gh * gw, cb)))
    cat = Err(np.concatenate([o.value for o in outs], axis=-1), np.concatenate([o.err for o in outs], axis=-1),
              max(o.depth for o in outs))
    return common.e_linear(cat, params["proj.weight"], params["proj.bias"])
