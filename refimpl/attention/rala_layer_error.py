"""The running error bounds of the RALA layer and of the RAVLT block's FFN on input tokens that carry an error: one
error path each for the layer's own bound (:func:`refimpl.attention.rala.rala_attention_bound`,
:func:`refimpl.attention.rala.ravlt_ffn_bound`, exact tokens: E_X = 0) and for the networks' blocks
(:mod:`refimpl.models.ravlt_bounds`, :mod:`refimpl.models.rala_variants`: E_X the block's incoming error).

The layer, on tokens X (B, N, C) (:func:`refimpl.attention.rala.rala_attention`): the projections Q, K, V and
the gate phi(X) (one fused linear map, or a separate linear phi, or phi = identity / tanh, Table 9), the core
(Eq. 2-4: alpha, the reweighted KV buffer, the normalised output), LePE on V (released code), the gate product of
Eq. 6 and the output projection (released code).  Every stage follows the error model of
:mod:`refimpl.attention.rala_bounds` (absolute errors, u included; the rules of :mod:`refimpl.bounds`):

- projections (``_projections``, the layer's own, :mod:`.rala` imports it): ``_e_linear(X, E_X, W, b)``; tanh
  is 1-Lipschitz, so E_phi = E_X + c (u |tanh X| + eta) (c = config.ELEMENTARY_FUNCTION_ULPS); the identity
  passes E_X on;
- the core: ``rala_bounds._core_error`` with the projections' errors, then, on the rows the core recomputes from
  log-features, :func:`refimpl.attention.rala_module_recomputed.module_recomputed_error` (float64, elu1; every
  other element bit for bit the direct model's);
- optionally (``convex_cap``, the networks' choice), without RoPE and with eps >= 0, the convex-combination cap
  of the core's bound, after the recomputed rows' term (:func:`attention_error`);
- LePE (``_e_depthwise`` and the sum), the gate product, the output projection.

Shared pieces: :func:`projections_error` and :func:`output_error` (LePE, gate, projection) are also the first and
last stages of the released softmax layer of RAVLT's last stage (:mod:`refimpl.models.ravlt_bounds`).

The FFN (:func:`ffn_error`, RALA §3.2's "classic Transformer block ... FFN", with the released code's depthwise
conv residual): fc1, GELU, h + DWConv3x3(h), fc2, each by its rule of :mod:`refimpl.bounds` (Higham eq. 3.12 for
the linear maps and the convolution), in the caller's model: the rigorous one (``Precision.of``) for both callers.

The block's residuals (:func:`residual_error`, RALA §3.2, Fig. 6, with the released code's layer scale):
x + f or x + gamma (.) f, shared by :func:`refimpl.attention.rala.residual_bound` (exact operands) and the
networks' block parts (refimpl.models.ravlt).  The CPE x + DWConv3x3(x) has its one path in
:func:`refimpl.layers.cpe_error` (its home is the layers, below this module).

Reference: Q. Fan, H. Huang, R. He, "Breaking the Low-Rank Dilemma of Linear Attention", CVPR 2025
(../shared/seeds/002_01b0ccc7f7225e8b.txt), Eq. 2-4 and 6, Table 9; Higham (2002) eq. 2.8, 3.12.

Layer: attention: imports bounds, config, layers, numerics, :mod:`.rala_core`, :mod:`.rala_bounds` and
:mod:`.rala_module_recomputed`; imported by :mod:`.rala` and :mod:`refimpl.models.ravlt_bounds`.  Both callers
share every rule of :mod:`refimpl.bounds` (bounds.e_gelu, the residual's rounding on the sum) in the rigorous model
of T; tests/test_ravlt_ffn_error.py pins that the layer's bound and the networks' FFN stage agree, and
tests/test_ravlt_cpe_residual_error.py the same for the CPE and the residuals.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import bounds, config, layers, numerics
from .rala_bounds import _Prec, _core_error, _e_depthwise, _e_linear, _e_product, _e_sum2
from .rala_core import (RALAConfig, _grid_to_tokens, _merge_heads, _param, _split_heads, _tokens_to_cf, _weight2d,
                        rala_core)
from .rala_module_recomputed import module_recomputed_error

__all__: list[str] = []


def _projections(tok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig):
    """Q, K, V (B, N, C) and the gate phi(X) (B, N, C) or None (:func:`refimpl.attention.rala.rala_attention`'s)."""
    c = cfg.dim
    if cfg.gate_source == "qkvo":
        wt = _weight2d(_param(params, "qkvo.weight"), cfg.layout, "qkvo.weight", 4 * c, c)
        p = layers.linear(tok, wt, params.get("qkvo.bias"))
        return p[..., :c], p[..., c:2 * c], p[..., 2 * c:3 * c], p[..., 3 * c:]
    wt = _weight2d(_param(params, "qkv.weight"), cfg.layout, "qkv.weight", 3 * c, c)
    p = layers.linear(tok, wt, params.get("qkv.bias"))
    if cfg.gate == "linear":
        g = layers.linear(tok, _weight2d(_param(params, "phi.weight"), cfg.layout, "phi.weight", c, c),
                          params.get("phi.bias"))
    elif cfg.gate == "identity":
        g = tok
    elif cfg.gate == "tanh":
        g = np.tanh(tok)
    else:
        g = None
    return p[..., :c], p[..., c:2 * c], p[..., 2 * c:], g


def _bias(params: Mapping[str, Any], key: str) -> np.ndarray | None:
    return None if params.get(key) is None else numerics.as_float(params[key], key)


def projections_error(tok: np.ndarray, etok: np.ndarray, params: Mapping[str, Any], cfg: RALAConfig, pr: _Prec):
    """((Q, K, V, phi), (E_Q, E_K, E_V, E_phi)) on tokens (B, N, C): the projections of ``tok`` (its error bound
    ``etok``, absolute) and their error bounds in precision pr; phi and E_phi None without a gate."""
    c = cfg.dim
    if cfg.gate_source == "qkvo":
        wt = _weight2d(params["qkvo.weight"], cfg.layout, "qkvo.weight", 4 * c, c)
        e_all = _e_linear(tok, etok, wt, _bias(params, "qkvo.bias"), pr)
        eq, ek, ev, eg = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:3 * c], e_all[..., 3 * c:]
    else:
        wt = _weight2d(params["qkv.weight"], cfg.layout, "qkv.weight", 3 * c, c)
        e_all = _e_linear(tok, etok, wt, _bias(params, "qkv.bias"), pr)
        eq, ek, ev = e_all[..., :c], e_all[..., c:2 * c], e_all[..., 2 * c:]
        if cfg.gate == "linear":
            eg = _e_linear(tok, etok, _weight2d(params["phi.weight"], cfg.layout, "phi.weight", c, c),
                           _bias(params, "phi.bias"), pr)
        elif cfg.gate == "tanh":            # tanh is 1-Lipschitz; its own error ELEMENTARY_FUNCTION_ULPS u |tanh|
            eg = etok + config.ELEMENTARY_FUNCTION_ULPS * (pr.u * np.abs(np.tanh(tok)) + pr.eta)
        elif cfg.gate == "identity":
            eg = etok
        else:
            eg = None
    return _projections(tok, params, cfg), (eq, ek, ev, eg)


def output_error(y: np.ndarray, ey: np.ndarray, v: np.ndarray, ev: np.ndarray, g: np.ndarray | None,
                 eg: np.ndarray | None, params: Mapping[str, Any], cfg: RALAConfig, hw: tuple[int, int], pr: _Prec,
                 depth: float, sums: Callable[[float], float]) -> tuple[np.ndarray, np.ndarray, float]:
    """(Y, E_Y, K) after the core's output y (tokens (B, N, C), error ey, depth K = ``depth``): LePE on V (error
    ev) added, the gate g (error eg) applied, the output projection; an n-term sum counts ``sums(n)`` roundings."""
    c, (h, w) = cfg.dim, hw
    if cfg.lepe_kernel:
        cf = lambda a: _tokens_to_cf(a, h, w)                                     # noqa: E731
        wl, bl = _param(params, "lepe.weight"), _bias(params, "lepe.bias")
        lepe = _grid_to_tokens(layers.depthwise_conv2d(cf(v), wl, bl, padding=cfg.lepe_kernel // 2),
                               "channels_first")[0]
        el = _grid_to_tokens(_e_depthwise(cf(v), cf(ev), wl, bl, pr), "channels_first")[0]
        ey = _e_sum2(y, ey, lepe, el, pr)
        y = y + lepe
        depth = max(depth, sums(cfg.lepe_kernel ** 2) + 1 + sums(c) + 1) + 1
    if g is not None:
        ey = _e_product(y, ey, g, eg, pr)
        y = g * y
        depth += 1
    if cfg.out_proj:
        wp = _weight2d(params["proj.weight"], cfg.layout, "proj.weight", c, c)
        ey = _e_linear(y, ey, wp, _bias(params, "proj.bias"), pr)
        y = layers.linear(y, wp, _bias(params, "proj.bias"))
        depth += sums(c) + 1
    return y, ey, depth


def attention_error(tok: np.ndarray, etok: np.ndarray | None, params: Mapping[str, Any], cfg: RALAConfig,
                    hw: tuple[int, int], pr: _Prec, *, convex_cap: bool = False,
                    sums: Callable[[float], float] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(Y, E_Y, K): the RALA layer's output on tokens ``tok`` (B, N, C) (float64 reference values) and the running
    bound E_Y (absolute) of its computation in precision pr from inputs within ``etok`` (absolute; None: exact
    inputs) of ``tok``, with the depth K of its longest chain of roundings.

    ``sums`` counts the roundings of an n-term sum of the projections and LePE in K: ``pr.sums`` (default: a
    mixed-precision accumulation counted as n u_A / u_T + 1, the layer's own bound) or ``float`` (n, the
    networks' convention, refimpl.models.common; the core counts with pr.sums either way).

    ``convex_cap`` (the networks' choice): without RoPE and with eps >= 0 the weights alpha_j kappa(Q_i) .
    kappa(K_j) are >= 0 and the output is their weighted mean of the V_j, exactly and as computed (non-negative
    terms: each sum is within gamma_n of its value; the rows recomputed from log-features form the same mean
    with n_k + d + 1 roundings per term, rala_module_recomputed._range_bound): |Y| <= max_j |V_j|, |Y'| <= max_j
    |V'_j| (1 + gamma_(2(N+d)+4)).  So |Y' - Y| is capped by max_j |V_j| + (max_j |V_j| + max_j E_V,j)(1 +
    gamma_(2(N+d)+4)) whatever the input errors: the core's bound (the recomputed rows' term included) is the
    smaller of the two, the cap where it is NaN, so the cap only ever lowers or keeps it.  The layer's own bound
    does not apply it: the argument counts no underflow of the weights' products (the eta terms of the error
    model, which :func:`refimpl.attention.rala.rala_attention_bound` carries: a direct normaliser that underflows
    to 0 with eps = 0 gives 0/0 whatever the cap says); on the ordinary inputs checked it never bites.
    """
    sums = pr.sums if sums is None else sums
    c, heads, d, n = cfg.dim, cfg.num_heads, cfg.head_dim, tok.shape[1]
    etok = np.zeros_like(tok) if etok is None else etok
    (q, k, v, g), (eq, ek, ev, eg) = projections_error(tok, etok, params, cfg, pr)
    sp = lambda a: _split_heads(a, heads)                                         # noqa: E731
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e_core, dc = _core_error(sp(q), sp(eq), sp(k), sp(ek), sp(v), sp(ev), cfg, hw, pr)
        # the rows rala_core recomputes from log-features: their rounding and the input errors' propagation
        e_core = module_recomputed_error(e_core, sp(q), sp(eq), sp(k), sp(ek), sp(v), sp(ev), cfg, hw, pr)
        if convex_cap and not cfg.rope and cfg.eps >= 0:
            vmax = np.max(np.abs(sp(v)), axis=-2, keepdims=True)
            evmax = np.max(sp(ev), axis=-2, keepdims=True)
            cap = vmax + (vmax + evmax) * (1.0 + pr.g(2 * (n + d) + 4))
            e_core = np.where(np.isnan(e_core), cap, np.minimum(e_core, cap))
        y = _merge_heads(rala_core(sp(q), sp(k), sp(v), cfg, hw))
        return output_error(y, _merge_heads(e_core), v, ev, g, eg, params, cfg, hw, pr, sums(c) + 1 + dc, sums)


def ffn_error(tok: np.ndarray, etok: np.ndarray | None, params: Mapping[str, Any], cfg: Any, hw: tuple[int, int],
              pr: _Prec, *, sums: Callable[[float], float] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(Y, E_Y, K): the RAVLT block's FFN (:func:`refimpl.attention.rala.ravlt_ffn`; ``cfg`` a
    :class:`refimpl.attention.rala.RAVLTBlockConfig`, ``params`` its "fc1.*", "dwconv.*", "fc2.*") on tokens
    ``tok`` (B, N, C) of the grid ``hw`` (float64 reference values), the running bound E_Y (absolute) of its
    computation in precision pr from inputs within ``etok`` (absolute; None: exact inputs) of ``tok``, and the depth
    K of its longest chain of roundings.  One error path for the layer's bound (``sums`` None: ``pr.sums``, a
    mixed-precision accumulation counted as n u_A / u_T + 1) and the networks' (``sums=float``: an n-term sum
    counts n in K, refimpl.models.common's convention); ``sums`` changes K only, never E_Y.

    The stages (RALA §3.2; Higham 2002 eq. 3.12 for each linear map, eq. 2.8 for each rounding):

    - fc1 and fc2: :func:`refimpl.bounds.e_linear` (gamma_(sums(n) + 1) (|x| + E_x)|W|^T + E_x |W|^T + n eta);
    - GELU: :func:`refimpl.bounds.e_gelu`, its input error times config.GELU_LIPSCHITZ plus its own
      gamma_k (|x| + E_x) + k eta, k = :func:`refimpl.bounds.gelu_roundings` (relative to |x|: 1 + erf cancels);
    - with ``ffn_dwconv``: the 'same' depthwise conv (:func:`refimpl.bounds.e_depthwise`, every other algorithm
      the conv may use covered) and the residual h + conv(h), one rounding charged on the sum
      (:func:`refimpl.bounds.e_sum2` ``on_sum``: fl(a' + b') = (a' + b')(1 + delta), |a' + b'| <= |a + b| + E_a
      + E_b).
    """
    sums = pr.sums if sums is None else sums
    c, hd, layout = cfg.attn.dim, cfg.hidden, cfg.attn.layout
    etok = np.zeros_like(tok) if etok is None else etok
    w1, b1 = _weight2d(_param(params, "fc1.weight"), layout, "fc1.weight", hd, c), _bias(params, "fc1.bias")
    pre = layers.linear(tok, w1, b1)
    e = bounds.e_linear(tok, etok, w1, b1, pr, flat=True)
    depth = sums(c) + (b1 is not None)
    hid = numerics.gelu(pre)
    e = bounds.e_gelu(pre, e, pr)
    depth += bounds.gelu_roundings()
    if cfg.ffn_dwconv:
        (h, w), wd, bd = hw, _param(params, "dwconv.weight"), _bias(params, "dwconv.bias")
        cf = lambda a: _tokens_to_cf(a, h, w)                                     # noqa: E731
        conv = _grid_to_tokens(layers.depthwise_conv2d(cf(hid), wd, bd, padding=wd.shape[-1] // 2),
                               "channels_first")[0]
        ec = _grid_to_tokens(_e_depthwise(cf(hid), cf(e), wd, bd, pr), "channels_first")[0]
        e = _e_sum2(hid, e, conv, ec, pr, on_sum=True)
        hid = hid + conv
        depth += sums(wd.shape[-2] * wd.shape[-1]) + (bd is not None) + 1
    w2, b2 = _weight2d(_param(params, "fc2.weight"), layout, "fc2.weight", c, hd), _bias(params, "fc2.bias")
    e = bounds.e_linear(hid, e, w2, b2, pr, flat=True)
    depth += sums(hd) + (b2 is not None)
    return layers.linear(hid, w2, b2), e, depth


def residual_error(a: np.ndarray, ea: np.ndarray | None, b: np.ndarray, eb: np.ndarray | None, gamma: Any,
                   pr: _Prec) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """(Y, E_Y, (k_a, k_b)): the residual y = a + b, or a + gamma (.) b with a per-channel layer scale gamma
    (broadcasting against b; None: no scale), of operands a, b (float64 reference values) within ``ea``, ``eb``
    (absolute; None: exact) of them, computed in the precision ``pr``; k_a, k_b the roundings on a's and on b's
    path (1 and 1, or 1 and 2 with gamma).  The one error path of the RAVLT block's residuals (RALA §3.2,
    Fig. 6): :func:`refimpl.attention.rala.residual_bound` and the networks' block parts.

    In the rigorous model of ``pr`` (Higham 2002 eq. 2.8 for each rounding):

    - p = gamma (.) b: :func:`refimpl.bounds.e_elementwise` with Lipschitz constant |gamma|, one rounding:
      E_p = |gamma| E_b + gamma_1 (|gamma b| + |gamma| E_b) + eta;
    - a + p, one rounding charged on the sum (:func:`refimpl.bounds.e_sum2` ``on_sum``: fl(a' + p') =
      (a' + p')(1 + delta), |a' + p'| <= |a + p| + E_a + E_p; additions are exact in the subnormal range):
      E_Y = E_a + E_p + u (|a + p| + E_a + E_p), never more than the rounding charged on |a| + |p|.
    """
    ea = np.zeros_like(a) if ea is None else ea
    eb = np.zeros_like(b) if eb is None else eb
    if gamma is None:
        p, ep, kb = b, eb, 1
    else:
        g = np.asarray(gamma, dtype=np.float64)
        p = g * b
        ep, kb = bounds.e_elementwise(p, eb, np.abs(g), 1, pr), 2
    return a + p, bounds.e_sum2(a, ea, p, ep, pr, on_sum=True), (1, kb)
