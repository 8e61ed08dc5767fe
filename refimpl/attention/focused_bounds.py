"""FLatten's error model: the running first-order error bounds (E, and with ``l2=True`` the l2 coefficient sigma)
of the focused function (:func:`focused_function_error`, :func:`focused_function_bound`), of the linear
resampling (:func:`resample_linear_bound`), the stage helpers shared with L2ViT, RALA and the networks
(``err_linear``, ``err_layer_norm``, ``err_norm_linear_l2``, ``err_dwconv``, ``err_attention``,
``_token_quadrature``, ``relu_error``), the errors of the modules' core (``_err_core``, ``_err_heads_and_dwc``),
``_bound`` / ``_both`` (E and sigma as a :class:`refimpl.numerics.Bound`), the underflow of a direct
(unrescaled) evaluation (:func:`direct_underflow`) and the bound of the attention, :func:`focused_attention_bound`.

Reference: D. Han et al., "FLatten Transformer", ICCV 2023 (../shared/seeds/001_f3b1223f03d702ca.txt), Eq. 4-6
and 10-12 (the computation bounded: :mod:`.focused_core`); Higham (2002) §3.1; docs/design.md "The verdict".

Layer: attention: imports bounds, config, numerics, validation, feature_maps, layers, :mod:`.linear` and
:mod:`.focused_core` (the computation the bounds follow), nothing from :mod:`.focused`, which imports it and
holds the modules' bounds and stage lists.  The public names are re-exported by
:mod:`refimpl.attention.focused`, their documented home.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from .. import bounds, config, numerics, validation
from ..feature_maps import focused_function as _focused_function_numpy
from ..feature_maps import norm_scaled as _norm_scaled
from ..layers import depthwise_conv2d, layer_norm, linear
from .linear import apply_normaliser, kernelized_attention_bound
from .focused_core import (FocusedConfig, _attend, _check_dwc_args, _check_p, _mask_groups,
                           _merge_heads, _p, _range_features, _resample_plan, _scaled_features, _split_heads,
                           _to_grid)
from .focused_range import band_exponent, log_focused
from .focused_underflow import (RecomputedRows, _no_bound, _range_rows, _tiny_rows, direct_underflow,
                                log_direct_underflow, log_focused_error, recomputed_rows)
from .focused_underflow import eta_in_u as _eta_in_u

__all__ = ["focused_function_error", "focused_function_bound", "resample_linear_bound", "focused_attention_bound"]

# ===================================================================================================
# The focused function's error coefficient (Eq. 6)
# ===================================================================================================

def focused_function_error(x: Any, p: float, err_x: Any = None, *, axis: int = -1, dtype: Any = None,
                           l2: bool = False) -> np.ndarray:
    """Error coefficient E of f_p: |fl_T(f_p(x~)) - f_p(x)| <= u_T E to first order in u_T, where x~ is x
    with absolute errors <= u_T err_x (err_x None: x exact).

    Derivation.  Write g = x**p / ||x**p|| (a unit vector, homogeneous of degree 0) so f = ||x|| g, and
    A_j = p x_j**(p-1) / ||x**p|| = p r_j**(p-1) / (m ||r**p||) with m = max x, r = x / m.  The Jacobian is
    df_i/dx_j = g_i x_j / ||x|| + ||x|| (A_i delta_ij - g_i A_j g_j), so input errors contribute

        g_i (x . err_x) / ||x||  +  ||x|| (A_i err_x_i + g_i sum_j A_j g_j err_x_j).

    ||x|| A_i <= p ||x|| / m <= p sqrt(d): f_p amplifies input errors by up to p sqrt(d), which is its honest
    condition number.  Rounding of the evaluation itself (either ``power_scaling``): r or x**p carries a
    relative error (p + c + 1) u (c = config.ELEMENTARY_FUNCTION_ULPS for pow, p from the argument's own
    rounding), the two norms (d + 2) u and (p + c + d + 3) u, the final product and quotient 2 u:
    (2 p + 2 c + 2 d + 8) f_i in all.  A zero vector x = 0 maps to 0 and f(0 + delta) has norm ||delta||,
    so there E = ||err_x||_2.  Underflow (``dtype`` given): r**p and the quotient t / ||t|| may fall into
    T's subnormal range (large p), each of their p + c + 4 roundings adding up to eta_T absolutely, scaled by
    ||x|| / ||t|| <= ||x|| (||t|| >= 1, its largest entry is 1): (p + c + 4) ||x|| eta_T / u_T.  First
    order: not rigorous when p u err_x / m is not small (a token whose features are all at rounding level).

    ``l2``: the probabilistic coefficient (numerics.Bound's sigma) instead: the input coefficients propagate
    through the same Jacobian bound, and the evaluation's own roundings count sqrt(M K) f_i instead of K f_i,
    K = 2 p + 2 c + 2 d + 8 their l1 count (the norms' sums by numerics.sum_depth_l2) and M = max(p, c, 1) the
    largest single coefficient (r's rounding is raised to the power p; pow errs by c ulps at once), since
    sum_r c_r^2 <= max |c_r| sum_r |c_r|; the underflow term is kept at its l1 size.

    Parameters
    ----------
    x : float array (..., d) >= 0, the exact (reference) input.  p : float >= 1.
    err_x : float array of x's shape >= 0 or None.  axis : the feature axis.
    dtype : the tested precision T (adds the underflow term) or None.

    Returns
    -------
    ndarray of x's shape >= 0.

    References
    ----------
    FLatten Eq. 6, 18-21; Higham (2002) §3.1; docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    p = _check_p(p)
    validation.check_axis(axis, x.ndim)
    ex = np.zeros_like(x) if err_x is None else numerics.as_float(err_x, "err_x")
    d = x.shape[axis]
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    f = _focused_function_numpy(x, p, axis=axis)
    m, nx = _norm_scaled(x, axis)
    with np.errstate(invalid="ignore", divide="ignore", under="ignore", over="ignore"):
        safe_m = np.where(m > 0, m, 1.0)
        r = x / safe_m
        t = r ** p
        nt = np.sqrt(np.sum(t * t, axis=axis, keepdims=True))
        safe_nt = np.where(nt > 0, nt, 1.0)
        g = t / safe_nt
        # Scale-free forms (no 1/m, which overflows for subnormal m): x / ||x|| = r / ||r|| and
        # ||x|| A_i = p ||r|| r_i**(p-1) / ||t||.
        nr = np.sqrt(np.sum(r * r, axis=axis, keepdims=True))
        safe_nr = np.where(nr > 0, nr, 1.0)
        a = r ** (p - 1.0)
        prop = g * np.sum(r * ex, axis=axis, keepdims=True) / safe_nr \
            + p * nr / safe_nt * (a * ex + g * np.sum(a * g * ex, axis=axis, keepdims=True))
        # the two length-d norms count numerics.sum_depth(d) each (d, or d u_A / u_T + 1 in mixed precision)
        under = (p + c + 4.0) * nx * _eta_in_u(dtype)
        if l2:
            count = 2.0 * p + 2.0 * c + 2.0 * numerics.sum_depth_l2(d, dtype) + 8.0
            rounding = np.hypot(math.sqrt(max(p, c, 1.0)) * math.sqrt(count) * f, under)
            total = np.hypot(prop, rounding)
        else:
            rounding = (2.0 * p + 2.0 * c + 2.0 * numerics.sum_depth(d, dtype) + 8.0) * f + under
            total = prop + rounding
        zero = np.sqrt(np.sum(ex * ex, axis=axis, keepdims=True)) + 0.0 * x
    return np.where(m == 0, zero, total)


def focused_function_bound(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                           dtype: Any = None) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`focused_function` on exact (T-rounded) inputs x >= 0, from
    :func:`focused_function_error`: scale E / K, k = K = 2 p + 2 c + 2 d + 8 (the rounding count derived
    there), plus the underflow term for ``dtype``.  Either ``power_scaling``.

    References
    ----------
    FLatten Eq. 6; docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    validation.check_axis(axis, x.ndim)
    e = focused_function_error(x, p, axis=axis, dtype=dtype)
    kk = int(math.ceil(2 * _check_p(p) + 2 * config.ELEMENTARY_FUNCTION_ULPS + 2 * x.shape[axis] + 8))
    return numerics.Bound(e / kk, kk, f"focused function f_p (p = {p:g}, d = {x.shape[axis]}): "
                                      f"first-order rounding count 2p + 2c + 2d + 8 = {kk}")


# ===================================================================================================
# The linear resampling's bound (Eq. 10-12, sr > 1)
# ===================================================================================================

def resample_linear_bound(x: Any, size: int, axis: int = -1) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`resample_linear` on exact inputs: the interpolation weight's
    absolute error (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS roundings of size u (src + 1), src the source
    coordinate) times the local slope (<= 2 max of the four neighbours, covering a floor() that falls in the
    adjacent interval), plus 3 roundings of (1 - lambda) a + lambda b.  Scale E / K, K = roundings + 3.

    References
    ----------
    FLatten Eq. 10-12 (V for the DWC with sr > 1); docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    validation.check_axis(axis, x.ndim)
    _, e = _err_resample(x, np.zeros_like(x), numerics.check_positive_int(size, "size"), axis)
    kk = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
    return numerics.Bound(e / kk, kk, f"linear resampling: {config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS} roundings "
                                      f"in the source coordinate x local slope + 3 in the blend; first order")


# ===================================================================================================
# The error model
# ===================================================================================================
#
# Every bound below is a running first-order error bound (Higham §3.1; docs/design.md): each intermediate t of
# the reference carries a coefficient E_t >= 0 with |fl_T(t) - t| <= u_T E_t, propagated through each stage
# by the stage's (absolute) Jacobian and increased by the stage's own rounding (its k times its scale S).
# The final Bound has k = K, the summed depth of the stages, and scale E_out / K, so that
# gamma_K(u) scale >= u E_out.  Products of two error terms (O(u^2)) are neglected; elementary functions
# are assumed accurate to config.ELEMENTARY_FUNCTION_ULPS.  The helpers are shared with enhanced.py.
#
# With ``l2=True`` the same helpers compute the probabilistic (l2) coefficient sigma of numerics.Bound instead
# of E: a stage's own roundings count sqrt(numerics.sum_depth_l2(n)) S for an n-term sum instead of k S (every
# rounding coefficient of a sum is at most S, so sum_r c_r^2 <= n S^2; elementwise terms are kept at their l1
# size, which bounds their l2 size), input coefficients propagate through the same absolute Jacobians
# (Minkowski: ||sum_j a_j c_j||_2 <= sum_j |a_j| ||c_j||_2, valid whatever roundings the inputs share), and a
# stage's own roundings, disjoint from its inputs', join the propagated part in quadrature (_join).


def _join(prop: np.ndarray, own: np.ndarray, l2: bool) -> np.ndarray:
    """Propagated plus own rounding terms: summed (E, l1) or in quadrature (sigma, l2: disjoint roundings)."""
    return np.hypot(prop, own) if l2 else prop + own


def _own(count: float, count_l2: float, s: np.ndarray, l2: bool) -> np.ndarray:
    """A stage's own rounding term on the magnitude s: count s (E) or sqrt(count_l2) s (sigma)."""
    return (math.sqrt(count_l2) if l2 else count) * s


def err_linear(x: np.ndarray, e_x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dtype: Any = None,
               l2: bool = False):
    """y = x W^T + b: returns (y, E_y, k), E_y = |W| e_x + k (|x||W|^T + |b|), k = in + 1 (Higham 3.12;
    :func:`refimpl.bounds.e_linear`, first-order model); with a mixed-precision ``dtype`` the in-term sum counts
    numerics.sum_depth(in) (the bias add one more).
    ``l2``: sigma_y = hypot(|W| sigma_x, sqrt(sum_depth_l2(in) + 1) (|x||W|^T + |b|))."""
    y = linear(x, weight, bias)
    extra = 1 if bias is not None else 0
    pr = bounds.Precision.coefficients(dtype)
    k = pr.sums(weight.shape[-1]) + extra
    if not l2:
        return y, bounds.e_linear(x, e_x, weight, bias, pr, flat=True), k
    s = linear(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias))
    own = _own(k, numerics.sum_depth_l2(weight.shape[-1], dtype) + extra, s, l2)
    return y, _join(e_x @ np.abs(weight).T, own, l2), k


def err_layer_norm(x: np.ndarray, e_x: np.ndarray, weight, bias, eps: float, dtype: Any = None, l2: bool = False):
    """LayerNorm over the last axis: input errors through the Jacobian (w_i / s)(delta_ij - 1/n - xh_i xh_j / n),
    bounded by |w_i| / s (e_i + mean(e) + |xh_i| mean(|xh| e)), plus the LayerNorm's own rounding, k =
    sum_depth(n) + bounds.LAYER_NORM_ROUNDINGS (n in T itself, fewer with a wider accumulator;
    :func:`refimpl.bounds.layer_norm_parts`; ``l2``: its k roundings, each of coefficient at most its scale, as
    sqrt(k - n + sum_depth_l2(n)) scale).  Returns (y, E_y, k)."""
    y = layer_norm(x, weight, bias, eps)
    pr = bounds.Precision.coefficients(dtype)
    if not l2:
        e, k = bounds.e_layer_norm(x, e_x, weight, bias, eps, pr)
        return y, e, k
    scale, prop, k = bounds.layer_norm_parts(x, e_x, weight, bias, eps, pr)
    n = x.shape[-1]
    count_l2 = k - numerics.sum_depth(n, dtype) + numerics.sum_depth_l2(n, dtype)
    return y, _join(prop, _own(k, count_l2, scale, l2), l2), k


def err_norm_linear_l2(x: np.ndarray, sigma_x: np.ndarray, norm_weight, norm_bias, eps: float, weight: np.ndarray,
                       bias: np.ndarray | None, dtype: Any = None):
    """LayerNorm over the last axis, then y = LN(x) W^T + b, in l2 mode, for an input whose entries' errors
    come from disjoint roundings (PVT's reduction conv: each output is its own inner product).

    The input part goes through the composite Jacobian M = W J exactly, in quadrature over the independent
    input entries: sigma_i^2 = sum_j M_ij^2 sigma_x_j^2 with J_cj = (w_c / s)(delta_cj - 1/n - xh_c xh_j / n), so
    M_ij = (G_ij - alpha_i / n - beta_i xh_j / n) / s, G = W diag(w), alpha = G 1, beta = G xh (the square
    expanded into matrix products; its float64 evaluation error, 4 u_64 times the sum of the expansion's
    magnitudes, is added so that the result stays an upper bound).  The LayerNorm's own roundings (shared by
    a token's channels through the mean and variance) go through |W| (Minkowski), the projection's own
    roundings count sqrt(sum_depth_l2(in) + 1) S; the three sets of roundings are disjoint (quadrature).
    Returns (y, sigma_y, k) with k the two stages' summed depth (as :func:`err_layer_norm` + :func:`err_linear`).
    """
    n = x.shape[-1]
    ln, s_own, k_ln = err_layer_norm(x, np.zeros_like(x), norm_weight, norm_bias, eps, dtype, l2=True)
    y, s_lin, k_lin = err_linear(ln, s_own, weight, bias, dtype, l2=True)
    if n == 1:                      # over one channel the LayerNorm's output is its bias: no input term
        return y, s_lin, k_ln + k_lin
    mu = np.mean(x, axis=-1, keepdims=True)
    sd = np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    xh = (x - mu) / sd
    g = weight * (1.0 if norm_weight is None else norm_weight)          # G = W diag(w), (out, n)
    alpha = np.sum(g, axis=-1) / n                                      # alpha_i / n
    beta = (xh @ g.T) / n                                               # beta_i / n, per token
    v2 = sigma_x * sigma_x
    terms = [v2 @ (g * g).T, alpha ** 2 * np.sum(v2, axis=-1, keepdims=True),
             beta ** 2 * np.sum(xh * xh * v2, axis=-1, keepdims=True), -2.0 * alpha * (v2 @ g.T),
             -2.0 * beta * ((xh * v2) @ g.T), 2.0 * alpha * beta * np.sum(xh * v2, axis=-1, keepdims=True)]
    total = sum(terms)
    slack = 4.0 * numerics.unit_roundoff("float64") * sum(np.abs(t) for t in terms)
    prop = np.sqrt(np.maximum(total, 0.0) + slack) / sd
    return y, np.hypot(prop, s_lin), k_ln + k_lin


def err_dwconv(x: np.ndarray, e_x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dtype: Any = None,
               l2: bool = False):
    """Depthwise 'same' conv (B, C, H, W): E = conv(e_x, |W|) + k (conv(|x|, |W|) + |b|), k = KH KW + 1
    (:func:`refimpl.bounds.e_depthwise`, first-order model; the KH KW-term sum counted by numerics.sum_depth for
    a mixed-precision ``dtype``; ``l2``: as :func:`err_linear`)."""
    pad = weight.shape[-1] // 2
    y = depthwise_conv2d(x, weight, bias, padding=pad)
    taps, extra = weight.shape[-1] * weight.shape[-2], (1 if bias is not None else 0)
    pr = bounds.Precision.coefficients(dtype)
    k = pr.sums(taps) + extra
    conv = lambda z, w, b: depthwise_conv2d(z, w, b, padding=pad)     # noqa: E731
    if not l2:
        return y, bounds.e_depthwise(x, e_x, weight, bias, pr, conv, padding=pad), k
    s = bounds.conv_scale(conv(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias)), k, x, weight,
                          bias, pad, 1, 1, groups=weight.shape[0])
    own = _own(k, numerics.sum_depth_l2(taps, dtype) + extra, s, l2)
    return y, _join(conv(e_x, np.abs(weight), None), own, l2), k


def err_attention(phi_q, phi_k, v, e_q, e_k, e_v, *, eps: float, clamp_min: float | None = None,
                  extra_roundings: int = 0, dtype: Any = None, l2: bool = False):
    """Error coefficient of the normalised kernelized attention (either order) with input errors e_q, e_k
    (features) and e_v (values), all >= 0 in units of u.  Returns (E, k).

    E = k S (the attention's own rounding: :func:`refimpl.attention.linear.kernelized_attention_bound` on
    exact inputs, its k times its scale) + (F_num + |O| F_den) / |den_eff| (first-order propagation of the
    input errors through num / den, with F_num = e_q (|phi_k|^T |v|) + |phi_q| (e_k^T |v|) + |phi_q| (|phi_k|^T
    e_v) and F_den = e_q . sum |phi_k| + |phi_q| . sum e_k; max(., C_min) is 1-Lipschitz) + extra_roundings
    relative roundings of numerator or normaliser (each <= u S_num / |den_eff|).  The input errors are
    propagated once, not multiplied by the attention's depth k.

    ``l2`` (numerics.Bound's sigma; the caller's inputs must make the queries' errors and each key token's
    errors depend on disjoint sets of roundings, as they do when the module input is exact: every projected
    entry is its own inner product, and a token's LayerNorm and reduction conv are its own): the queries'
    part e_q (|phi_k|^T |v| + |O| sum_j |phi_k_j|) / den is propagated as above (it is correlated across
    the d features); each key token j contributes t_j = [(|phi_q| . e_k_j) (|v_j| + |O|) + (|phi_q| .
    |phi_k_j|) e_v_j] / den (Minkowski within the token), and the tokens, whose roundings are disjoint, join in
    quadrature: sqrt(sum_j t_j^2) (:func:`_token_quadrature`); the queries' and the keys' parts join in
    quadrature, and so do the attention's own roundings, hypot(sqrt(k) S, sqrt(extra_roundings) |O|) (each
    rounding's coefficient is at most S, resp. |O|)."""
    b = kernelized_attention_bound(phi_q, phi_k, v, eps=eps, eps_policy="add", clamp_min=clamp_min, dtype=dtype)
    aq, ak, av = np.abs(phi_q), np.abs(phi_k), np.abs(v)
    den = np.abs(apply_normaliser(np.einsum("bhnd,bhd->bhn", phi_q, np.sum(phi_k, axis=-2)), eps=eps,
                                  clamp_min=clamp_min))[..., None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kv_abs = ak.swapaxes(-1, -2) @ av
        s_num = aq @ kv_abs
        f_num = e_q @ kv_abs + aq @ (e_k.swapaxes(-1, -2) @ av) + aq @ (ak.swapaxes(-1, -2) @ e_v)
        f_den = (np.einsum("bhnd,bhd->bhn", e_q, np.sum(ak, axis=-2))
                 + np.einsum("bhnd,bhd->bhn", aq, np.sum(e_k, axis=-2)))[..., None]
        o_abs = s_num / den
        if l2:
            q_part = (e_q @ kv_abs + o_abs * np.einsum("bhnd,bhd->bhn", e_q, np.sum(ak, axis=-2))[..., None]) / den
            prop = np.hypot(q_part, _token_quadrature(aq, ak, av, e_k, e_v, o_abs) / den)
            e = np.hypot(prop, np.hypot(math.sqrt(b.k) * np.asarray(b.scale), math.sqrt(extra_roundings) * o_abs))
        else:
            prop = (f_num + o_abs * f_den) / den
            e = b.k * np.asarray(b.scale) + prop + extra_roundings * o_abs
    return e, b.k + extra_roundings


def _token_quadrature(aq, ak, av, e_k, e_v, o_abs, block: int = 1024) -> np.ndarray:
    """sqrt(sum_j t_ije^2), t_ije = a_ij (|v_je| + |O_ie|) + A_ij e_v_je with a = |phi_q| e_k^T and
    A = |phi_q| |phi_k|^T (both (B, h, N, M)): the square expanded into matrix products, query rows in blocks of
    ``block`` so that memory stays O(block M) per head.  Every term is >= 0 (no cancellation)."""
    out = np.empty(o_abs.shape)
    ekt, akt = e_k.swapaxes(-1, -2), ak.swapaxes(-1, -2)
    av2, ev2, avev = av * av, e_v * e_v, av * e_v
    for i0 in range(0, aq.shape[-2], block):
        rows = slice(i0, i0 + block)
        a = aq[..., rows, :] @ ekt
        big_a = aq[..., rows, :] @ akt
        o = o_abs[..., rows, :]
        aa, a_big = a * a, a * big_a
        t = aa @ av2 + (big_a * big_a) @ ev2 + 2.0 * (a_big @ avev) \
            + o * (2.0 * (aa @ av + a_big @ e_v) + o * np.sum(aa, axis=-1, keepdims=True))
        out[..., rows, :] = np.sqrt(t)
    return out


def relu_error(t: np.ndarray, e_t: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Error coefficient of ReLU(t~) for t~ within u e_t of t: ReLU is exact and 1-Lipschitz, and where
    t < -u_T e_t (``dtype`` given) both sides are exactly 0, so the error vanishes there."""
    if dtype is None:
        return e_t
    return np.where(t > -numerics.unit_roundoff(dtype) * e_t, e_t, 0.0)


def _err_resample(x, e_x, size, axis, dtype=None):
    """Linear resampling along ``axis``: the weights' absolute error (FLATTEN_RESAMPLE_INDEX_ROUNDINGS
    roundings of size <= u (src + 1)) times the local slope (<= twice the largest of the four neighbours,
    which also covers a floor() that lands in the adjacent interval), 3 roundings of the two products and
    the sum, and the inputs' errors (weights >= 0 summing to 1).  With a mixed-precision ``dtype`` the source
    coordinate is computed in the accumulation format (torch's upsampling computes it in its opmath type,
    float for Half/BFloat16): its roundings count u_A / u_T each."""
    ax = axis % x.ndim
    n_in = x.shape[ax]
    src, i0, i1, lam = _resample_plan(n_in, size)
    shape = [1] * x.ndim
    shape[ax] = size
    lam_b, src_b = lam.reshape(shape), src.reshape(shape)
    a, b = np.take(x, i0, axis=ax), np.take(x, i1, axis=ax)
    lo, hi = np.take(np.abs(x), np.maximum(i0 - 1, 0), axis=ax), np.take(np.abs(x), np.minimum(i1 + 1, n_in - 1),
                                                                           axis=ax)
    local = np.maximum(np.maximum(np.abs(a), np.abs(b)), np.maximum(lo, hi))
    y = a * (1 - lam_b) + b * lam_b
    e = (np.take(e_x, i0, axis=ax) * (1 - lam_b) + np.take(e_x, i1, axis=ax) * lam_b
         + config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS * numerics.accumulation_ratio(dtype) * (src_b + 1.0) * 2.0 * local
         + 3.0 * (np.abs(a) * (1 - lam_b) + np.abs(b) * lam_b))
    return y, e


def _err_dwc(vh, e_v, hw_v, hw_out, weight, bias, shared, resample, dtype=None, l2=False):
    """E of the DWC branch (B, h, N, e) (resampling + depthwise conv); returns (dwc, E, k)."""
    b, h, _, e = vh.shape
    k_res = 0
    if tuple(hw_v) != tuple(hw_out):
        if resample == "linear_flat":
            vh, e_v = _err_resample(vh, e_v, hw_out[0] * hw_out[1], 2)
            k_res = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
        else:
            g, eg = _to_grid(vh, hw_v), _to_grid(e_v, hw_v)
            g, eg = _err_resample(g, eg, hw_out[0], 2)
            g, eg = _err_resample(g, eg, hw_out[1], 3)
            n = hw_out[0] * hw_out[1]
            vh, e_v = g.reshape(b, h, n, e), eg.reshape(b, h, n, e)
            k_res = 2 * (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3)
    big_h, big_w = hw_out

    def grid(t):
        g = _to_grid(t, hw_out).transpose(0, 1, 4, 2, 3)
        return g.reshape(b * h, e, big_h, big_w) if shared else g.reshape(b, h * e, big_h, big_w)

    y, ey, k = err_dwconv(grid(vh), grid(e_v), weight, bias, dtype, l2)

    def back(t):
        return t.reshape(b, h, e, big_h * big_w).swapaxes(-1, -2)

    return back(y), back(ey), k + k_res


def _err_pre_features(t, e_t, params, cfg, dtype=None):
    """E of ReLU(t) (+ eps) (/ softplus(s)): ReLU is exact and 1-Lipschitz (:func:`relu_error`); + eps
    rounds once; softplus has relative error (2c + 1) u (exp and log1p, c ulps each, plus the sum) and the
    quotient u."""
    a = numerics.relu(t)
    e = relu_error(t, e_t, dtype)
    if cfg.relu_eps:
        a = a + cfg.relu_eps
        e = e + a
    if cfg.learnable_scale:
        sp = numerics.softplus(_p(params, "scale"))
        a = a / sp
        e = e / sp + (2.0 * config.ELEMENTARY_FUNCTION_ULPS + 3.0) * a
    return a, e


def _err_features(t, e_t, params, cfg, dtype=None, l2=False):
    a, e = _err_pre_features(t, e_t, params, cfg, dtype)
    h = cfg.num_heads
    if cfg.norm_scope == "token":
        phi = _focused_function_numpy(a, cfg.p, power_scaling=cfg.power_scaling)
        ephi = focused_function_error(a, cfg.p, e, dtype=dtype, l2=l2)
        return _split_heads(phi, h), _split_heads(ephi, h), a.shape[-1]
    ah, eh = _split_heads(a, h), _split_heads(e, h)
    return _focused_function_numpy(ah, cfg.p, power_scaling=cfg.power_scaling), \
        focused_function_error(ah, cfg.p, eh, dtype=dtype, l2=l2), \
        ah.shape[-1]


def _feature_depth(p: float, d: int, dtype: Any = None) -> float:
    """Rounding count of the feature map: f_p's (:func:`focused_function_error`, its two length-d norms
    counted by numerics.sum_depth) plus the pre-features' 2 c + 4 (ReLU, + eps, softplus, the quotient)."""
    return math.ceil(2 * p + 2 * config.ELEMENTARY_FUNCTION_ULPS + 8) + 2 * numerics.sum_depth(d, dtype) + \
        2 * config.ELEMENTARY_FUNCTION_ULPS + 4


def _err_attend(phi_q, phi_k, vh, eq, ek, ev, cfg, mask, dtype, l2=False):
    """E of the attention term, honouring the normaliser variant and the mask (grouped like _attend)."""
    extra = 6 if cfg.normaliser == "mean_scaled" else 0  # n^-1/2 (x2 scalings), the mean, 1/den, the product

    def one(pq, pk, v, e_q, e_k, e_v):
        eps = cfg.eps * pk.shape[-2] if cfg.normaliser == "mean_scaled" else cfg.eps
        return err_attention(pq, pk, v, e_q, e_k, e_v, eps=eps, extra_roundings=extra, dtype=dtype, l2=l2)

    if mask is None:
        return one(phi_q, phi_k, vh, eq, ek, ev)
    nw = mask.shape[0]
    out = np.empty(phi_q.shape[:-1] + (vh.shape[-1],))
    k_max = 0
    for w in range(nw):
        for qi, kj in _mask_groups(mask[w]):
            e, k = one(phi_q[w::nw, :, qi], phi_k[w::nw, :, kj], vh[w::nw, :, kj], eq[w::nw, :, qi],
                       ek[w::nw, :, kj], ev[w::nw, :, kj])
            out[w::nw, :, qi] = e
            k_max = max(k_max, k)
    return out, k_max


def _err_heads_and_dwc(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2=False):
    y, ey, depth = _err_core(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2)
    bias = params.get("proj.bias")
    out, eo, k_proj = err_linear(y, ey, _p(params, "proj.weight"), None if bias is None else _p(params, "proj.bias"),
                                 dtype, l2)
    return out, eo, depth + k_proj


def _by_window(fn: Callable, mask, q_side: tuple, k_side: tuple, rows: np.ndarray, e: int) -> np.ndarray:
    """fn(q_side, k_side, rows) -> (B,h,N,e) over all keys, or window group by window group under a
    shifted-window ``mask`` (as :func:`_err_attend` groups them): each group's query rows see its keys only."""
    if mask is None:
        return fn(q_side, k_side, rows)
    out = np.zeros(rows.shape + (e,))
    nw = mask.shape[0]
    for w in range(nw):
        for qi, kj in _mask_groups(mask[w]):
            out[w::nw, :, qi] = fn(tuple(x[w::nw, :, qi] for x in q_side), tuple(x[w::nw, :, kj] for x in k_side),
                                   rows[w::nw, :, qi])
    return out


def _module_underflow(info, vh, cfg, mask, dtype, rows) -> np.ndarray:
    """focused_underflow.log_direct_underflow of a module's attention (the log-features of ``info``, a
    focused_range.RangeInfo; the config's norm scope, eps and normaliser); E (B,h,N,e) in ``rows``, 0
    elsewhere."""
    lq, lk = info.logs()
    kw = dict(token_scope=cfg.norm_scope == "token", eps=cfg.eps,
              normaliser=cfg.normaliser, dtype=dtype)
    return _by_window(lambda qs, ks, r: log_direct_underflow(qs[0], ks[0], ks[1], rows=r, **kw), mask, (lq,),
                      (lk, vh), rows, vh.shape[-1])


def _module_recomputed(q, eq, k, ek, vh, evh, params, cfg, mask, dtype, rows, l2) -> np.ndarray:
    """:func:`recomputed_error` of a module's rows ``rows``: the log-features of the pre-features
    (:func:`_err_pre_features`: ReLU, relu_eps, the scale, with their errors, relative ones propagated by
    focused_underflow.log_focused_error's ``rel``) per the config's norm scope, V's errors; by window group."""
    h = cfg.num_heads

    def logs(t, et):
        a, e = _err_pre_features(t, et, params, cfg, dtype)
        if cfg.norm_scope != "token":
            a, e = _split_heads(a, h), _split_heads(e, h)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            lx = log_focused(np.log(a), cfg.p)
            el = log_focused_error(a, cfg.p, rel=np.where(a > 0, e / a, 0.0))
        return (lx, el) if cfg.norm_scope != "token" else (_split_heads(lx, h), _split_heads(el, h))
    (lq, elq), (lk, elk) = logs(q, eq), logs(k, ek)

    def one(qs, ks, r):
        return recomputed_error(None, None, ks[2], r, p=cfg.p, eps=cfg.eps, normaliser=cfg.normaliser,
                                dtype=dtype, l2=l2, logs=(qs[0], ks[0], qs[1], ks[1]), e_v=ks[3])
    return _by_window(one, mask, (lq, elq), (lk, elk, vh, evh), rows, vh.shape[-1])

def _err_core(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2=False):
    """(y, E_y, depth) of :func:`_core` (``l2``: sigma instead of E)."""
    if cfg.positional_encoding:
        pe = _p(params, "positional_encoding")
        k = k + pe
        ek = _join(ek, np.abs(k), l2)
    phi_q, e_phi_q, dq = _err_features(q, eq, params, cfg, dtype, l2)
    phi_k, e_phi_k, _ = _err_features(k, ek, params, cfg, dtype, l2)
    vh, evh = _split_heads(v, cfg.num_heads), _split_heads(ev, cfg.num_heads)
    e_att, k_att = _err_attend(phi_q, phi_k, vh, e_phi_q, e_phi_k, evh, cfg, mask, dtype, l2)
    if cfg.power_scaling == "max":      # the definition's range-safe paths (focused_range) and their rows
        reset, live, (pq, pk, rng) = _range_rows(_scaled_features(q, k, params, cfg, fp=_focused_function_numpy),
                                                 cfg.eps, cfg.normaliser, phi_q, phi_k, tiny_resets=False)
        # rows whose features are all below 2^-969 (a head far below its token's largest channel, the token
        # norm scope): every product's eta_T counted from the log-features, which also covers the model's own
        # float64 terms that underflow there (eta_64 <= eta_T); without a tested format (no underflow model)
        # they have no bound, nor have the recomputed rows
        tiny = _tiny_rows(rng, phi_q, phi_k) & live & ~reset
        if dtype is None:
            reset = reset | tiny
        elif np.any(tiny | reset):
            under = tiny | reset
            e_att = np.where(under[..., None], _join(e_att, _module_underflow(rng, vh, cfg, mask, dtype, under), l2),
                             e_att)
        if dtype is not None and np.any(reset):
            # the rows the definition recomputes from log-features: the larger of that computation's bound
            # (recomputed_error, the pre-features' errors propagated into the log-features) and the direct
            # model's (a tested implementation may take either path; inf where the direct one has no bound)
            e_att = np.where(reset[..., None], np.fmax(_no_bound(e_att, np.zeros_like(reset), live),
                                                       _module_recomputed(q, eq, k, ek, vh, evh, params, cfg, mask,
                                                                          dtype, reset, l2)), e_att)
            reset = np.zeros_like(reset)
        e_att = _no_bound(e_att, reset, live)
        att = _attend(pq, pk, vh, normaliser=cfg.normaliser, eps=cfg.eps, order="linear", mask=mask, taps=None,
                      max_elements=None, rng=rng)
    else:
        att = _attend(phi_q, phi_k, vh, normaliser=cfg.normaliser, eps=cfg.eps, order="linear", mask=mask,
                      taps=None, max_elements=None)
    dwc, e_dwc, k_dwc = _err_dwc(vh, evh, hw_kv, hw_q, _p(params, "dwc.weight"),
                                 None if params.get("dwc.bias") is None else _p(params, "dwc.bias"),
                                 cfg.dwc_shared, cfg.dwc_resample, dtype, l2)
    y = _merge_heads(att + dwc)
    # e_att and e_dwc share V's roundings: summed (Minkowski) in either mode; the addition's own rounding joins
    ey = _join(e_att + e_dwc, np.abs(att) + np.abs(dwc), l2)
    if cfg.power_scaling == "max":
        ey = _no_bound(ey, reset, live)
    return y, _merge_heads(ey), _feature_depth(cfg.p, dq, dtype) + k_att + k_dwc + 1


def recomputed_error(a_q: np.ndarray, a_k: np.ndarray, v: np.ndarray, rows: np.ndarray, *, p: float, eps: float,
                     normaliser: str, dtype: Any = None, l2: bool = False, logs: Any = None,
                     e_v: Any = None) -> np.ndarray:
    """E (B, h, N, e), units of u_T, of the attention term in the ``rows`` (B, h, N) that the definition
    recomputes from log-features (focused_range.recompute_rows: a live row whose normaliser underflowed);
    0 elsewhere.  a_q, a_k: the exact pre-features (>= 0, original units); v the values.

    The computation bounded (normaliser_range.rebalanced_output): lq = log phi(Q), lk = log phi(K)
    (focused_range.log_focused), rebalanced into phi_q' = exp((lq - lq*) + (m - m*)), phi_k' = exp(lk - m)
    (m the keys' per-channel max, lq* and m* those of the row's largest channel; the largest of each factor 1,
    the normaliser >= 1), then Eq. 4 on phi_q', phi_k' and V, numerator and normaliser times the common factor
    f = exp(lq*) exp(m*), eps (eps n for the mean-of-keys normaliser) added in those units, rho = eps exp(-r).
    Every product exp(lq_ic + lk_jc) = exp(r_i) phi_q'_ic phi_k'_jc, so Eq. 4 of the rebalanced features is
    the row's output and :func:`err_attention` applies to them with relative feature errors (units of u):
    phi_q': log_focused_error(a_q) (the log-feature's absolute error is the feature's relative one) + c (exp)
    + |lq - lq*| + |m - m*| + |(lq - lq*) + (m - m*)| (the argument's three roundings); phi_k':
    log_focused_error(a_k) + c + |lk - m|; with eps > 0 also f's error (the row's largest log-feature errors
    and 2 c + 2 for the two exps and their product), which cancels in num / den otherwise; the two products
    by f are extra roundings.  Where rho is beyond float64 the output is below the underflow threshold: E =
    (k + 4) eta_T / u_T.  ``logs``: None, or (lq, lk, elq, elk), the log-features and their error coefficients
    computed by the caller (a module: f_p over the token, pre-features with errors, :func:`_err_core`; a_q, a_k
    then unused); ``e_v``: V's error coefficients (None: exact).  focused_underflow.recomputed_rows (the
    parts above, formed once) then :func:`recomputed_rows_error` (per format and model).

    References: FLatten Eq. 4-6 (focused_range H2-H3); normaliser_range (R1, R2); Higham (2002) §3.1."""
    return recomputed_rows_error(recomputed_rows(a_q, a_k, v, rows, p=p, eps=eps, normaliser=normaliser, logs=logs,
                                                 e_v=e_v), dtype, l2)


def recomputed_rows_error(rec: RecomputedRows, dtype: Any = None, l2: bool = False) -> np.ndarray:
    """:func:`recomputed_error` from its rows' parts ``rec`` (focused_underflow.recomputed_rows): E (B, h, N, e)
    in units of u_T of ``dtype`` (``l2``: sigma), 0 outside the rows."""
    out = np.zeros(rec.rows.shape + (rec.e,))
    if rec.pq is None:
        return out
    pq, pk, rho = rec.pq, rec.pk, rec.rho
    for b, h in sorted({(int(i), int(j)) for i, j, _ in np.argwhere(rec.rows)}):
        one = (slice(b, b + 1), slice(h, h + 1))
        idx = np.flatnonzero(rec.rows[b, h])
        # rows sharing one rho (all of them with eps = 0) in one call; rho beyond float64: an output below
        # the underflow threshold, k = d + M + 4 roundings of eta_T each
        groups = [idx] if rec.eps_eff == 0 else [idx[rho[b, h, idx] == t] for t in np.unique(rho[b, h, idx])]
        for g in groups:
            t = float(rho[b, h, g[0]])
            if not math.isfinite(t):
                out[b, h, g] = (pk.shape[-1] + rec.vs.shape[-2] + 8) * _eta_in_u(dtype)
                continue
            sl = one + (g,)
            e, _ = err_attention(pq[sl], pk[one], rec.vs[one], rec.eq[sl], rec.ek[one], rec.evs[one], eps=t,
                                 extra_roundings=2, dtype=dtype, l2=l2)
            out[b, h, g] = e[0, 0]
    return np.ldexp(out, rec.x_v)


def _bound(e: np.ndarray, depth: float, what: str, dtype: Any = None, sigma: Any = None) -> numerics.Bound:
    return numerics.running_bound(e, depth, what, dtype, sigma=sigma)


def _both(err: Callable[[bool], tuple[np.ndarray, float]], what: str, dtype: Any) -> numerics.Bound:
    """The running bound of a computation whose coefficient ``err(l2)`` returns (E or sigma, depth): the
    deterministic E and the probabilistic sigma (numerics.Bound) from the same propagation.  E >= sum_r |c_r|
    also bounds the l2 norm sqrt(sum_r c_r^2), so sigma is capped at E, and E stands in where sigma's own
    arithmetic overflowed (a square of a huge coefficient) while E's did not."""
    e, depth = err(False)
    sigma, _ = err(True)
    with np.errstate(invalid="ignore"):
        sigma = np.where(np.isfinite(sigma), np.fmin(sigma, e), e)
    return _bound(e, depth, what, dtype, sigma=sigma)


def focused_attention_bound(q: Any, k: Any, v: Any, *, p: float = config.FLATTEN_FOCUSING_FACTOR,
                            hw: tuple[int, int] | None = None, dwc_weight: Any = None, dwc_bias: Any = None,
                            eps: float = 0.0, normaliser: str = "sum", dtype: Any = None,
                            order: str | None = None, power_scaling: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_attention` (either order; inputs exact, i.e. already rounded to T).

    E = E_attention (kernelized-attention bound with f_p's error coefficients
    :func:`focused_function_error` as feature errors) + E_dwc (depthwise conv) + |attention| + |dwc| (the sum).

    Parameters
    ----------
    As :func:`focused_attention`; dtype : the tested precision T (for the exact quotient bound) or None.
    ``order`` and ``power_scaling`` are accepted and ignored (the bound covers both).

    Range (focused_range): with eps = 0 the bound is that of the definition's rescaled query rows and key
    groups (degree 0; the identity inside the band); with eps > 0 and q (or k) entirely below the band that of
    q, k and eps scaled up together by one power of two each (the scaled eps kept below 2^1000).  The bound
    covers a direct evaluation as well (any implementation that does not rescale, such as the PyTorch twin):
    :func:`direct_underflow` adds the absolute eta_T errors of its subnormal products and of f_p's last
    products, amplified through the quotient (inf where they may reach a zero normaliser); inside 2^-200 ..
    2^200 that term is below the bound's last bit.  The float64 reference's own error (``ref_scale``) has it
    only where the definition computes directly (inside the band).  A live row the definition recomputes from
    log-features has no bound (inf: a comparison there is inconclusive); NaN only in a dead row (0/0 exactly).

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h n d"), v=(v, "B h n e"))
    cfg = FocusedConfig(dim=sz["h"] * sz["d"], num_heads=sz["h"], p=p, normaliser=normaliser, eps=eps)
    a_q, a_k, eps0 = numerics.relu(q), numerics.relu(k), eps
    if eps == 0:
        # The attention term is of degree 0 in each query row and in each head's keys (eps = 0), and the
        # definition computes it on rows scaled by focused_range.band_exponent: so is the bound, whose rounding
        # terms are then those of the definition's arithmetic (the identity inside the band).
        e_q, e_k = band_exponent(a_q, -1), band_exponent(a_k, (-2, -1))
        q, k = np.ldexp(a_q, -e_q), np.ldexp(a_k, -e_k)
        rescaled = (e_q != 0)[..., 0] | (e_k != 0)[..., 0]
    else:
        # With eps > 0 the term is of degree 0 in (Q, K, eps) together: all of q (all of k) below the band is
        # scaled up by one exponent, eps along, as far as the scaled eps stays below 2^1000 (beyond, eps
        # dominates the normaliser; the rows keep normal features).  Large inputs keep the direct model.
        e_q = min(int(band_exponent(a_q, None).item()), 0)
        e_k = min(int(band_exponent(a_k, None).item()), 0)
        t = int(np.frexp(eps)[1]) - e_q - e_k
        shift = max(t - 1000, min(t + 1000, 0))         # > 0: scale up less; < 0: scale down less
        for _ in range(2):
            if shift > 0 and e_q < 0:
                step = min(shift, -e_q)
                e_q, shift = e_q + step, shift - step
            if shift > 0 and e_k < 0:
                step = min(shift, -e_k)
                e_k, shift = e_k + step, shift - step
            if shift < 0 and e_q > 0:
                step = min(-shift, e_q)
                e_q, shift = e_q - step, shift + step
            if shift < 0 and e_k > 0:
                step = min(-shift, e_k)
                e_k, shift = e_k - step, shift + step
        rescaled = bool(e_q or e_k)
        q, k = a_q, a_k
        if rescaled:
            q, k, eps = np.ldexp(a_q, -e_q), np.ldexp(a_k, -e_k), float(np.ldexp(eps, -(e_q + e_k)))
            cfg = FocusedConfig(dim=sz["h"] * sz["d"], num_heads=sz["h"], p=p, normaliser=normaliser, eps=eps)
    phi_q = _focused_function_numpy(q, p)
    phi_k = _focused_function_numpy(k, p)
    if dwc_weight is not None:
        hw = validation.check_grid(hw, sz["n"], tokens="v")
        _check_dwc_args(dwc_weight, dwc_bias, sz)
        dwc_weight = numerics.as_float(dwc_weight, "dwc_weight")
        dwc_bias = None if dwc_bias is None else numerics.as_float(dwc_bias, "dwc_bias")

    scaled = _range_features(q, k, _check_p(p), None, fp=_focused_function_numpy)
    recomputed, live, (pq, pk, rng) = _range_rows(scaled, eps, normaliser, phi_q, phi_k, tiny_resets=False)
    # rows whose model features are below 2^-969 (eps > 0 with rows far below the others), and the rows the
    # definition recomputes (their products underflowed): the model's own float64 arithmetic is not relative
    # there; direct_underflow counts every product's eta_T for them, which also covers the model's own
    # subnormal roundings (eta_64 <= eta_T)
    rescaled = rescaled | _tiny_rows(scaled[2], phi_q, phi_k) | recomputed
    no_reset = np.zeros_like(recomputed)
    # a direct evaluation's underflow (any implementation that does not rescale: the twin, plain NumPy or C):
    # the tested side in T; the definition's own in float64 where it computes directly (inside the band)
    under = dict(p=p, eps=eps0, normaliser=normaliser, rescaled=rescaled)
    u_tested = direct_underflow(a_q, a_k, v, dtype=dtype, **under)
    u_ref = np.where(np.broadcast_to(np.asarray(rescaled)[..., None] if np.ndim(rescaled) else rescaled,
                                     u_tested.shape), 0.0,
                     direct_underflow(a_q, a_k, v, dtype="float64" if dtype is not None else None, **under))

    # the recomputed rows' rebalanced features and coefficients, formed once for E, sigma and the reference
    rec = recomputed_rows(a_q, a_k, v, recomputed, p=p, eps=eps0, normaliser=normaliser)

    def err(l2, u_direct, tested=True):
        e_q = focused_function_error(q, p, dtype=dtype, l2=l2)
        e_k = focused_function_error(k, p, dtype=dtype, l2=l2)
        e_att, k_att = _err_attend(phi_q, phi_k, v, e_q, e_k, np.zeros_like(v), cfg, None, dtype, l2)
        e_att = _no_bound(_join(e_att, u_direct, l2), no_reset, live)
        if np.any(recomputed):
            # the recomputed rows: the definition's log-feature computation (recomputed_error); a tested
            # implementation may take either path (a direct one: the model above, inf where it has none)
            e_rec = recomputed_rows_error(rec, dtype if tested else "float64", l2)
            e_att = np.where(recomputed[..., None], np.fmax(e_att, e_rec) if tested else e_rec, e_att)
        depth = _feature_depth(p, sz["d"], dtype) + k_att
        if dwc_weight is None:
            return e_att, depth
        shared = dwc_weight.shape[0] == sz["e"] and sz["h"] > 1
        att = _attend(pq, pk, v, normaliser=normaliser, eps=eps, order="linear", mask=None, taps=None,
                      max_elements=None, rng=rng)
        dwc, e_dwc, k_dwc = _err_dwc(v, np.zeros_like(v), tuple(hw), tuple(hw), dwc_weight, dwc_bias, shared,
                                     "bilinear", dtype, l2)
        return _no_bound(_join(e_att + e_dwc, np.abs(att) + np.abs(dwc), l2), no_reset, live), depth + k_dwc + 1

    what = "focused attention" if dwc_weight is None else "focused attention + DWC"
    bound = _both(lambda l2: err(l2, u_tested), what, dtype)
    if dtype is None:
        return bound
    # the float64 reference's own error: the definition rescales outside the band (no direct underflow there)
    e_ref, depth = err(False, u_ref, tested=False)
    with np.errstate(invalid="ignore", over="ignore"):
        return dataclasses.replace(bound, ref_scale=e_ref / max(float(depth), 1.0))

