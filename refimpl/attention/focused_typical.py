"""The random-rounding model's typical error of FLatten's feature map phi_p (:attr:`refimpl.numerics.Bound.typical`).

Layer: attention: imports config, numerics, feature_maps and .focused_underflow; :mod:`.focused` (the stage lists) imports it.

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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import config, numerics
from ..feature_maps import focused_function
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
