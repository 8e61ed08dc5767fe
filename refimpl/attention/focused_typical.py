"""The random-rounding model's typical error of FLatten's feature map phi_p and of its normalised linear attention
(:attr:`refimpl.numerics.Bound.typical`).

Layer: attention: imports config, numerics, feature_maps, .focused_core and .focused_underflow; :mod:`.focused`
(the stage lists) imports it.

The verdict measures each element's error in units of its typical error (refimpl.verdict: the z statistic) and
uses the same typical error as the rounding-model member of a stage whose legitimate evaluations all compute the
same bits.  For phi_p = f_p(x) = ||x|| x**p / ||x**p|| (FLatten Eq. 6) the elements of one row carry very
different errors: the entries that dominate ||x**p|| see their own roundings cancel against the norm's, the rest
do not.  The deterministic bound's scale (an l1 count, the same multiple of |phi_i| for every entry) spreads them
evenly, which puts the largest entries' thresholds several times above anything a correct evaluation errs there
(docs/verdict.md, stage-wise tightness).  This module gives each entry the l2 coefficient of its own roundings.

Derivation (first order, each rounding an independent mean-zero relative perturbation; Higham & Mary 2019).
With s_j = x_j^2 / ||x||^2 and r_j = x_j^(2p) / ||x**p||^2 (each summing to 1 over the row), a relative
perturbation eps_j of x_j moves log phi_i by

    J_ij eps_j,   J_ij = p [i = j] + s_j - p r_j,

so perturbations of l2 size c_in each (the roundings that form x: + relu_eps, softplus(s) and the quotient, the
max-scaling r = x / max x, an added positional encoding) give sum_j J_ij^2 = Q + p^2 + 2 p (s_i - p r_i) with
Q = sum_j (s_j - p r_j)^2.  The power's own rounding (c u, :func:`elementary_count`: config.ELEMENTARY_FUNCTION_ULPS, or one rounding of T in half precision) enters
as ([i = j] - r_j): sum 1 - 2 r_i + sum_j r_j^2.  Each norm's squares and additions are one accumulation, its
roundings of coefficient <= the sum of squares, halved by the square root: sum_depth_l2(d) / 4 each
(numerics.sum_depth_l2; mixed-precision accumulation counted there).  Two square roots, the quotient and the
product: 1 each.  So

    typical_i = |phi_i| sqrt(c_in^2 (Q + p^2 + 2 p (s_i - p r_i)) + c^2 (1 - 2 r_i + sum r^2)
                             + sum_depth_l2(d) / 2 + 4),

in quadrature with the underflow term sqrt(p + c + 4) ||x|| eta_T / u_T (focused_function_error's, its
roundings in quadrature), which sets the size of the entries in T's subnormal range.

Not a bound (the bound is focused_function_error's): a model of the size of a correct evaluation's error.

The attention (FLatten Eq. 4, 10; :func:`attention_typical`) is a chain of inner products whose results are stored
in T.  In an n-term sum s = sum_j a_j the t-th addition's rounding has coefficient P_t, the partial sum of the
first t terms; over a random order of the terms (the model of an order nobody chose for these data)

    E sum_{t<=n} P_t^2 = (n + 1) (2 s^2 + ||a||^2) / 6

(P_t sums t of the n terms drawn without replacement: mean t s / n, variance t (n - t) / (n - 1) (||a||^2 / n
- s^2 / n^2)).  Accumulated in T itself the products' roundings add ||a||^2 and P_n = s is the rounding into T;
accumulated in A (mixed precision, r = u_A / u_T; half-precision products are exact there) the count is
r^2 (n + 1) (2 s^2 + ||a||^2) / 6 + s^2, the last term the one rounding into T (:func:`_sum_count`).  So in half
precision the error of a correct evaluation scales with |s|, and with sqrt(n) |s| or ||a|| in T, not with the
deterministic bound's l1 count S = sum_j |a_j|, which is far larger where the terms cancel (V is signed).  A
stored intermediate X (K^T V, the scores Q K^T, sum_j K_j) propagates through the next product with its entries'
counts in quadrature.  With the numerator N = Q (K^T V) and the normaliser D = Q . sum_j K_j + eps
(``mean_scaled``: K and V each scaled by n^-1/2 and D = Q . mean_j K_j + eps, the same quotient; the mean's
division one more rounding of sum_j K_j; the scalings' roundings add sum_jc (Q_ic K_jc V_je)^2 and
sum_j ((Q K^T)_ij V_je)^2), in either order of the products (a port may take either: the larger of the two),

    typical_ie^2 = var N_ie / D_i^2 + y_ie^2 (var D_i / D_i^2 + the roundings of eps's addition, the quotient and
                   (``mean_scaled``) the product with 1 / D: one each).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import config, numerics
from ..feature_maps import focused_function
from .focused_core import _mask_groups
from .focused_underflow import eta_in_u


def focused_function_typical(x: Any, p: float, c_in2: float, *, axis: int = -1, dtype: Any = None) -> np.ndarray:
    """typical_i of f_p(x) along ``axis`` (module docstring), in units of u_T: x >= 0 the exact input, p >= 1,
    ``c_in2`` the squared l2 rounding count of each x_j's own computation (relative, in units of u_T), ``dtype``
    the tested precision (its accumulation format for the norms).  A zero row has phi = 0 and typical 0."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[axis]
    c = math.sqrt(elementary_count(dtype))
    with np.errstate(invalid="ignore", divide="ignore", under="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        r = x / np.where(m > 0, m, 1.0)                 # f_p is homogeneous: s and r from x / max x, no overflow
        s, rr = _shares(r * r, axis), _shares(r ** (2.0 * p), axis)
        q = np.sum((s - p * rr) ** 2, axis=axis, keepdims=True)
        jac = q + p * p + 2.0 * p * (s - p * rr)
        pw = 1.0 - 2.0 * rr + np.sum(rr * rr, axis=axis, keepdims=True)
        var = c_in2 * jac + c * c * pw + numerics.sum_depth_l2(d, dtype) / 2.0 + 4.0
    phi = focused_function(x, p, axis=axis)
    # gradual underflow: r**p, the quotient and the product may land in T's subnormal range, each of those
    # p + c + 4 roundings erring by up to eta_T absolutely, scaled back by ||x|| / ||r**p|| <= ||x||
    # (focused_function_error's underflow term, its roundings counted in quadrature)
    nx = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    under = math.sqrt(p + c + 4.0) * nx * eta_in_u(dtype)
    return np.where(m > 0, np.hypot(np.abs(phi) * np.sqrt(np.maximum(var, 0.0)), under), 0.0)


def _shares(t: np.ndarray, axis: int) -> np.ndarray:
    """t_j / sum_j t_j along ``axis`` (t >= 0 of a max-scaled row, whose largest entry is 1, so the sum is >= 1;
    an all-zero row gives zeros)."""
    total = np.sum(t, axis=axis, keepdims=True)
    return t / np.where(total > 0, total, 1.0)


def elementary_count(dtype: Any = None, functions: int = 1) -> float:
    """The squared l2 coefficient, in units of u_T^2, of ``functions`` elementary functions composed in one
    operation and stored in T: c = config.ELEMENTARY_FUNCTION_ULPS (in u) each when T is its own evaluation
    format; in a half format (config.ACCUMULATION_FORMAT: torch and NumPy evaluate a half-precision elementwise
    operation in float32 and round the result once) c u_A / u_T each plus that one rounding."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    r = numerics.accumulation_ratio(dtype)
    return functions * c * c if r >= 1.0 else functions * (c * r) ** 2 + 1.0


def pre_feature_count(relu_eps: bool, learnable_scale: bool, positional: bool, dtype: Any = None) -> float:
    """c_in^2 of FLatten's pre-features a = (ReLU(t [+ APE]) [+ relu_eps]) [/ softplus(s)], then scaled by its
    row maximum: one rounding each for the APE sum, + relu_eps, the quotient and the max-scaling; softplus =
    log1p(exp(s)), two elementary functions and the sum inside (:func:`elementary_count`)."""
    softplus = elementary_count(dtype, 2) + (1.0 if numerics.accumulation_ratio(dtype) >= 1.0 else 0.0)
    return 1.0 + float(positional) + float(bool(relu_eps)) + (softplus + 1.0 if learnable_scale else 0.0)


def attention_typical(phi_q: Any, phi_k: Any, v: Any, *, normaliser: str, eps: float, mask: Any = None,
                      dtype: Any = None, block: int = 512) -> np.ndarray:
    """typical_ie of the normalised linear attention (module docstring), in units of u_T, (B, h, N, e): the
    larger of :func:`attention_variances`' two orders, square-rooted.  ``mask`` a shifted-window mask (nW, N, n)
    with windows interleaved in the batch as b * nW + w: each query sees the keys of its mask row, as
    focused_core._attend groups them."""
    phi_q, phi_k, v = (np.asarray(t, dtype=np.float64) for t in (phi_q, phi_k, v))

    def one(q, k, vv):
        with np.errstate(invalid="ignore"):
            return np.sqrt(np.maximum(*attention_variances(q, k, vv, normaliser=normaliser, eps=eps, dtype=dtype,
                                                           block=block)))

    if mask is None:
        return one(phi_q, phi_k, v)
    out = np.empty(phi_q.shape[:-1] + (v.shape[-1],))
    nw = mask.shape[0]
    for w in range(nw):
        for qi, kj in _mask_groups(np.asarray(mask[w])):
            out[w::nw, :, qi] = one(phi_q[w::nw, :, qi], phi_k[w::nw, :, kj], v[w::nw, :, kj])
    return out


def _sum_count(n: int, s: np.ndarray, sumsq: np.ndarray, dtype: Any) -> np.ndarray:
    """The expected squared l2 coefficient, in units of u_T^2, of an n-term sum s = sum_j a_j (``sumsq`` =
    ||a||^2) accumulated left to right in a random order of its terms and stored in T (module docstring; the
    first partial sum is a term, not a rounding: ||a||^2 / n less)."""
    r = numerics.accumulation_ratio(dtype)
    walk = (n + 1) * (2.0 * s * s + sumsq) / 6.0 - sumsq / n
    return r * r * walk + s * s if r < 1.0 else walk + sumsq


def attention_variances(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, normaliser: str, eps: float,
                        dtype: Any = None, block: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(linear order, quadratic order): the expected squared l2 coefficient of each output's roundings, in units
    of u_T^2, (B, h, N, e), over random orders of every sum (module docstring).  q (B, h, N, d), k (B, h, n, d),
    v (B, h, n, e) exact; query rows in blocks of ``block`` (the (N, n) scores).  Linear order: K^T V and
    sum_j K_j (``mean_scaled``: mean_j K_j) stored, then their d-term products with Q.  Quadratic order: the
    scores Q K^T stored, then their n-term products with V and their row sums."""
    n, d = k.shape[-2], k.shape[-1]
    scaled = normaliser == "mean_scaled"
    r2 = numerics.accumulation_ratio(dtype) ** 2
    q2, k2, v2 = q * q, k * k, v * v
    kt, k2t = k.swapaxes(-1, -2), k2.swapaxes(-1, -2)
    kv, ksum = kt @ v, np.sum(k, axis=-2)[..., None]
    num, den = q @ kv, q @ ksum
    den_eff = den + (eps * n if scaled else eps)
    var_num_lin = q2 @ _sum_count(n, kv, k2t @ v2, dtype) + _sum_count(d, num, q2 @ (kv * kv), dtype)
    # the mean's division: in T, or in A before the one rounding into T
    c2_ksum = _sum_count(n, ksum, np.sum(k2, axis=-2)[..., None], dtype) \
        + ((r2 if r2 < 1.0 else 1.0) * ksum * ksum if scaled else 0.0)
    var_den_lin = q2 @ c2_ksum + _sum_count(d, den, q2 @ (ksum * ksum), dtype)
    var_num_quad, var_den_quad, var_scale = np.empty_like(num), np.empty_like(den), np.zeros_like(num)
    for i0 in range(0, q.shape[-2], block):
        rows = slice(i0, i0 + block)
        sc = q[..., rows, :] @ kt
        s2 = sc * sc
        c2_s = _sum_count(d, sc, q2[..., rows, :] @ k2t, dtype)
        var_num_quad[..., rows, :] = c2_s @ v2 + _sum_count(n, num[..., rows, :], s2 @ v2, dtype)
        var_den_quad[..., rows, :] = (np.sum(c2_s, axis=-1, keepdims=True)
                                      + _sum_count(n, den[..., rows, :], np.sum(s2, axis=-1, keepdims=True), dtype))
        if scaled:                  # V's scaling: sum_j ((Q K^T)_ij V_je)^2
            var_scale[..., rows, :] = s2 @ v2
    if scaled:                      # K's scaling: sum_jc (Q_ic K_jc V_je)^2
        var_scale += q2 @ (k2t @ v2)
    extra = float(eps != 0.0) + 1.0 + float(scaled)      # eps's addition, the quotient, the product
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y2 = (num / den_eff) ** 2

        def quotient(var_num, var_den):
            out = (var_num + var_scale) / den_eff ** 2 + y2 * (var_den / den_eff ** 2 + extra)
            return np.where(den_eff != 0, out, np.inf)

        return quotient(var_num_lin, var_den_lin), quotient(var_num_quad, var_den_quad)
