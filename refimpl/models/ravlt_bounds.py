"""The running error analysis of RAVLT's block stages (refimpl.models.ravlt), on tokens (B, N, C) in the
common.Err convention: the attention (RALA by rala_bounds.py's stage helpers, or the released RoPE softmax layer
by the RoPE and softmax error models), the CPE, the layer scale and the FFN.  refimpl.models.ravlt composes them
into its blocks' parts (``_e_part``); refimpl.models.rala_variants reuses the attention on DeiT / Swin frames.

References: RALA (Fan, Huang, He) §3.2, Eq. 2-6, Fig. 6; the released code (softmax stages, layer scale).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, layers, numerics
from ..attention import rala, rala_bounds, rala_core
from ..attention.softmax import softmax_attention, softmax_attention_error
from . import _netparts as nets, common
from .common import Err

__all__: list[str] = []

# The blocks are propagated on tokens (B, N, C) whatever the block layout (LayerNorm over C, 1 x 1 convs
# and Linear layers are the same maps).  RALA's own error model (attention/rala_bounds.py) tracks absolute
# errors with u included: the adapters below convert to and from the common.Err coefficients, and call
# rala_bounds.py's stage helpers (private: its public bounds take exact inputs only).

def _layout_tok(x: np.ndarray, layout: str) -> np.ndarray:
    return rala_core._grid_to_tokens(x, layout)[0]


def _e_attention(t: Err, p: Mapping[str, Any], acfg: rala.RALAConfig, hw: tuple[int, int], kind: str,
                 dtype: Any) -> Err:
    """RALA or the released softmax layer with an input error; t and the result on tokens (B, N, C)."""
    pr = rala_bounds._Prec.of(dtype)
    c, heads, d = acfg.dim, acfg.num_heads, acfg.head_dim
    tok, etok = t.value, nets.to_abs(t.err, dtype)
    bias = lambda key: None if p.get(key) is None else numerics.as_float(p[key], key)   # noqa: E731
    sp = lambda a: rala_core._split_heads(a, heads)                                            # noqa: E731
    n = tok.shape[1]
    if acfg.gate_source == "qkvo":
        wt = rala_core._weight2d(p["qkvo.weight"], acfg.layout, "qkvo.weight", 4 * c, c)
        e_all = rala_bounds._e_linear(tok, etok, wt, bias("qkvo.bias"), pr)
        eq, ek, ev, eg = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:3 * c], e_all[..., 3 * c:]
    else:
        wt = rala_core._weight2d(p["qkv.weight"], acfg.layout, "qkv.weight", 3 * c, c)
        e_all = rala_bounds._e_linear(tok, etok, wt, bias("qkv.bias"), pr)
        eq, ek, ev = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:]
        if acfg.gate == "linear":
            eg = rala_bounds._e_linear(tok, etok, rala_core._weight2d(p["phi.weight"], acfg.layout, "phi.weight", c, c),
                                bias("phi.bias"), pr)
        elif acfg.gate == "tanh":            # tanh is 1-Lipschitz; its own error ELEMENTARY_FUNCTION_ULPS u |tanh|
            eg = etok + config.ELEMENTARY_FUNCTION_ULPS * (pr.u * np.abs(np.tanh(tok)) + pr.eta)
        elif acfg.gate == "identity":
            eg = etok
        else:
            eg = None
    q, k, v, g = rala._projections(tok, p, acfg)
    depth = c + 1
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if kind == "rala":
            e_core, dc = rala_bounds._core_error(sp(q), sp(eq), sp(k), sp(ek), sp(v), sp(ev), acfg, hw, pr)
            if not acfg.rope and acfg.eps >= 0:
                # Without RoPE the weights alpha_j kappa(Q_i) . kappa(K_j) are >= 0 and the output is their
                # weighted mean of the V_j, exactly and as computed (non-negative terms: each sum is within
                # gamma_n of its value): |Y| <= max_j |V_j|, |Y'| <= max_j |V'_j| (1 + gamma_(2(N+d)+4)).  So
                # |Y' - Y| is capped whatever the input errors (rigorous; where the first-order bound is
                # larger or infinite, e.g. past the normaliser guard, the cap replaces it).
                vmax = np.max(np.abs(sp(v)), axis=-2, keepdims=True)
                evmax = np.max(sp(ev), axis=-2, keepdims=True)
                cap = vmax + (vmax + evmax) * (1.0 + pr.g(2 * (n + d) + 4))
                e_core = np.where(np.isnan(e_core), cap, np.minimum(e_core, cap))
            y = rala_core._merge_heads(rala.rala_core(sp(q), sp(k), sp(v), acfg, hw))
            ey = rala_core._merge_heads(e_core)
        else:
            ang = rala.rope_2d_angles(hw[0], hw[1], d, acfg.rope_base)
            qh, kh, vh = sp(q), sp(k), sp(v)
            qr, kr = rala.apply_rope_2d(qh, ang), rala.apply_rope_2d(kh, ang)
            eqr, ekr = rala_bounds._e_rope(qh, sp(eq), ang, pr), rala_bounds._e_rope(kh, sp(ek), ang, pr)
            e_core = softmax_attention_error(qr, kr, vh, scale=d ** -0.5, err_q=eqr / pr.u, err_k=ekr / pr.u,
                                             err_v=sp(ev) / pr.u, dtype=dtype)
            y = rala_core._merge_heads(softmax_attention(qr, kr, vh, scale=d ** -0.5, max_elements=None))
            ey = pr.u * rala_core._merge_heads(e_core)
            dc = 3 + d + n + 2 * config.ELEMENTARY_FUNCTION_ULPS + config.SOFTMAX_EXP_ARG_ROUNDINGS + 4
        depth += dc
        if acfg.lepe_kernel:
            cf = lambda a: rala_core._tokens_to_cf(a, hw[0], hw[1])                           # noqa: E731
            wl, bl = numerics.as_float(p["lepe.weight"], "lepe.weight"), bias("lepe.bias")
            lepe = _layout_tok(layers.depthwise_conv2d(cf(v), wl, bl, padding=acfg.lepe_kernel // 2), "channels_first")
            el = _layout_tok(rala_bounds._e_depthwise(cf(v), cf(ev), wl, bl, pr), "channels_first")
            ey = rala_bounds._e_sum2(y, ey, lepe, el, pr)
            y = y + lepe
            depth = max(depth, acfg.lepe_kernel ** 2 + 1 + c + 1) + 1
        if g is not None:
            ey = rala_bounds._e_product(y, ey, g, eg, pr)
            y = g * y
            depth += 1
        if acfg.out_proj:
            wp = rala_core._weight2d(p["proj.weight"], acfg.layout, "proj.weight", c, c)
            ey = rala_bounds._e_linear(y, ey, wp, bias("proj.bias"), pr)
            y = layers.linear(y, wp, bias("proj.bias"))
            depth += c + 1
    return Err(y, nets.from_abs(ey, dtype), t.depth + depth)


def _e_cpe(t: Err, p: Mapping[str, Any], hw: tuple[int, int]) -> Err:
    conv = nets.e_dwconv(nets.e_grid(t, hw), p["pos.weight"], p.get("pos.bias"))
    return common.e_add(t, nets.e_tokens(conv))


def _gamma(p: Mapping[str, Any], key: str) -> np.ndarray:
    g = numerics.as_float(p[key], key)
    return g.reshape(-1)


def _e_ffn(t: Err, p: Mapping[str, Any], bc: rala.RAVLTBlockConfig, hw: tuple[int, int]) -> Err:
    c, hd, layout = bc.attn.dim, bc.hidden, bc.attn.layout
    h = common.e_gelu(common.e_linear(t, rala_core._weight2d(p["fc1.weight"], layout, "fc1.weight", hd, c), p["fc1.bias"]))
    if bc.ffn_dwconv:
        h = common.e_add(h, nets.e_tokens(nets.e_dwconv(nets.e_grid(h, hw), p["dwconv.weight"], p["dwconv.bias"])))
    return common.e_linear(h, rala_core._weight2d(p["fc2.weight"], layout, "fc2.weight", c, hd), p["fc2.bias"])
