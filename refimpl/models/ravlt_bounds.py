"""The running error analysis of RAVLT's block stages (refimpl.models.ravlt), on tokens (B, N, C) in the
common.Err convention: the attention (RALA by the layer's own error path with the input error,
refimpl.attention.rala_layer_error.attention_error; or the released RoPE softmax layer by the RoPE and softmax
error models between that path's projection and output stages), the CPE (its one error path with the input
error, refimpl.layers.cpe_error), the residuals with the layer scale (refimpl.attention.rala_layer_error.
residual_error) and the FFN (the FFN's own error path with the input error, rala_layer_error.ffn_error).
refimpl.models.ravlt composes them into its blocks' parts (``_e_part``); refimpl.models.rala_variants reuses the
attention on DeiT / Swin frames.

References: RALA (Fan, Huang, He) §3.2, Eq. 2-6, Fig. 6; the released code (softmax stages, layer scale).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention import rala, rala_bounds, rala_core, rala_layer_error
from ..attention.softmax import softmax_attention, softmax_attention_error
from . import _netparts as nets
from .common import Err

__all__: list[str] = []

# The blocks are propagated on tokens (B, N, C) whatever the block layout (LayerNorm over C, 1 x 1 convs
# and Linear layers are the same maps).  RALA's own error model (attention/rala_bounds.py) tracks absolute
# errors with u included: the adapter below converts to and from the common.Err coefficients and calls
# rala_layer_error.py (private helpers: the public layer bound takes exact inputs only).

def _e_attention(t: Err, p: Mapping[str, Any], acfg: rala.RALAConfig, hw: tuple[int, int], kind: str,
                 dtype: Any) -> Err:
    """RALA or the released softmax layer with an input error; t and the result on tokens (B, N, C).  RALA is
    rala_layer_error.attention_error (the layer's own error path, with the input error), with the network's
    depth convention (an n-term sum counts n) and the convex-combination cap of the core without RoPE; the softmax
    layer shares its projections and its LePE / gate / projection stages (RoPE on q, k; the softmax error model)."""
    pr = rala_bounds._Prec.of(dtype)
    tok, etok = t.value, nets.to_abs(t.err, dtype)
    if kind == "rala":
        y, ey, depth = rala_layer_error.attention_error(tok, etok, p, acfg, hw, pr, convex_cap=True, sums=float)
        return Err(y, nets.from_abs(ey, dtype), t.depth + depth)
    c, heads, d, n = acfg.dim, acfg.num_heads, acfg.head_dim, tok.shape[1]
    sp = lambda a: rala_core._split_heads(a, heads)                                            # noqa: E731
    (q, k, v, g), (eq, ek, ev, eg) = rala_layer_error.projections_error(tok, etok, p, acfg, pr)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        ang = rala.rope_2d_angles(hw[0], hw[1], d, acfg.rope_base)
        qh, kh, vh = sp(q), sp(k), sp(v)
        qr, kr = rala.apply_rope_2d(qh, ang), rala.apply_rope_2d(kh, ang)
        eqr, ekr = rala_bounds._e_rope(qh, sp(eq), ang, pr), rala_bounds._e_rope(kh, sp(ek), ang, pr)
        e_core = softmax_attention_error(qr, kr, vh, scale=d ** -0.5, err_q=eqr / pr.u, err_k=ekr / pr.u,
                                         err_v=sp(ev) / pr.u, dtype=dtype)
        y = rala_core._merge_heads(softmax_attention(qr, kr, vh, scale=d ** -0.5, max_elements=None))
        ey = pr.u * rala_core._merge_heads(e_core)
        dc = 3 + d + n + 2 * config.ELEMENTARY_FUNCTION_ULPS + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4
        y, ey, depth = rala_layer_error.output_error(y, ey, v, ev, g, eg, p, acfg, hw, pr, c + 1 + dc, float)
    return Err(y, nets.from_abs(ey, dtype), t.depth + depth)


def _e_cpe(t: Err, p: Mapping[str, Any], dtype: Any) -> Err:
    """The CPE x + DWConv3x3(x) with an input error; t and the result on the grid (B, C, H, W):
    layers.cpe_error, the CPE's one error path (the layer's own bound, layers.cpe_bound, is the same path on exact
    inputs), in the rigorous model of ``dtype`` with the network's depth convention (an n-term sum counts n)."""
    pr = rala_bounds._Prec.of(dtype)
    y, ey, depth = layers.cpe_error(t.value, nets.to_abs(t.err, dtype), p["pos.weight"], p.get("pos.bias"), pr,
                                    sums=float)
    return Err(y, nets.from_abs(ey, dtype), t.depth + depth)


def _e_residual(a: Err, b: Err, gamma: Any, dtype: Any) -> Err:
    """The residual a + b, or a + gamma (.) b with the layer scale, of two operands with their errors:
    rala_layer_error.residual_error, the residuals' one error path (the layer's own bound, rala.residual_bound,
    is the same path on exact operands), in the rigorous model of ``dtype``."""
    pr = rala_bounds._Prec.of(dtype)
    y, ey, (ka, kb) = rala_layer_error.residual_error(a.value, nets.to_abs(a.err, dtype), b.value,
                                                      nets.to_abs(b.err, dtype), gamma, pr)
    return Err(y, nets.from_abs(ey, dtype), max(a.depth + ka, b.depth + kb))


def _gamma(p: Mapping[str, Any], key: str) -> np.ndarray:
    g = numerics.as_float(p[key], key)
    return g.reshape(-1)


def _e_ffn(t: Err, p: Mapping[str, Any], bc: rala.RAVLTBlockConfig, hw: tuple[int, int], dtype: Any) -> Err:
    """The FFN with an input error; t and the result on tokens (B, N, C): rala_layer_error.ffn_error, the FFN's one
    error path (the layer's own bound, rala.ravlt_ffn_bound, is the same path on exact tokens), in the rigorous
    model of ``dtype`` with the network's depth convention (an n-term sum counts n)."""
    pr = rala_bounds._Prec.of(dtype)
    y, ey, depth = rala_layer_error.ffn_error(t.value, nets.to_abs(t.err, dtype), p, bc, hw, pr, sums=float)
    return Err(y, nets.from_abs(ey, dtype), t.depth + depth)
