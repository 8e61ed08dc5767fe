"""Feature maps and argument checks shared by the NumPy definitions and the accelerated kernels.

The attention modules (refimpl.attention.*) define the operations that refimpl.backends dispatches; the
kernels (refimpl/backends/_c.py, _numba.py) implement them.  What both sides need lives here, below both:
the kernels import this module, never an attention module, and the attention modules import it too (and
re-export these names where they were defined before: ``focused_core._focused_function_numpy``,
``focused_core._check_p``, ``angular.arcsin_coefficients_exact``, ``angular._check_order``,
``angular._feature_dim``).  Nothing here dispatches: these are the NumPy definitions themselves.

- :func:`focused_function`: FLatten's f_p (Eq. 6), the NumPy definition of operation "focused_function"
  (registered by refimpl.attention.focused_core) and the "focused" map of operation "linear_attention"
  (refimpl.attention.linear); :func:`check_focusing_factor` validates its p.
- :func:`arcsin_coefficients_exact`, :func:`check_series_order`, :func:`series_feature_dim`: the
  coefficients, the order check and the feature count of Castling-ViT's angular series features (Eq. 8),
  used by refimpl.attention.angular and the Numba kernel "angular_series_features".
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from . import config, numerics
from .errors import ArgumentError

__all__ = ["check_focusing_factor", "focused_function", "check_series_order", "arcsin_coefficients_exact",
           "series_feature_dim"]


# ===================================================================================================
# FLatten: the focused function f_p (Eq. 6)
# ===================================================================================================

def check_focusing_factor(p: Any) -> float:
    """p as a float: a real number (not bool), finite, >= 1; ArgumentError naming 'p' otherwise."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not math.isfinite(p) \
            or p < 1:
        raise ArgumentError(f"argument 'p': expected a finite focusing factor p >= 1, got {p!r}")
    return float(p)


def norm_scaled(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(max, ||x||) along ``axis`` for x >= 0, ||x|| = m ||x / m|| (no overflow or underflow)."""
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        safe = np.where(m > 0, m, 1.0)
        nrm = m * np.sqrt(np.sum((x / safe) ** 2, axis=axis, keepdims=True))
    return m, nrm


def focused_function(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                     power_scaling: str = "max") -> np.ndarray:
    """f_p(x) = ||x|| / ||x**p|| * x**p along ``axis`` (FLatten Eq. 6): the NumPy definition, never
    dispatching (the public, dispatching entry is :func:`refimpl.attention.focused.focused_function`, whose
    docstring has the details).

    Parameters
    ----------
    x : float array (..., d), every entry >= 0.  p : float >= 1.  axis : the feature axis.
    power_scaling : "max" (evaluate on x / max(x): exact, no overflow) or "none" (x**p as written).

    Returns
    -------
    ndarray of x's shape, working precision.

    References
    ----------
    FLatten Eq. 6 (and Eq. 20-21, the max-normalised form).
    """
    x = numerics.as_float(x, "x")
    p = check_focusing_factor(p)
    if np.any(x < 0):
        raise ArgumentError("argument 'x': f_p is defined on non-negative features (apply ReLU first, i.e. use "
                         "focused_feature_map); got negative entries")
    if power_scaling == "none":
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            t = x ** p
            return np.sqrt(np.sum(x * x, axis=axis, keepdims=True)) / \
                np.sqrt(np.sum(t * t, axis=axis, keepdims=True)) * t
    if power_scaling != "max":
        raise ArgumentError(f"argument 'power_scaling': expected 'max' or 'none', got {power_scaling!r}")
    m, nx = norm_scaled(x, axis)
    with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
        t = (x / np.where(m > 0, m, 1.0)) ** p          # in [0, 1], max entry exactly 1 -> ||t|| >= 1
        f = nx * (t / np.sqrt(np.sum(t * t, axis=axis, keepdims=True)))
    # A zero vector (m == 0) maps to 0; NaN in x makes m NaN, so "m == 0" is False and NaN propagates.
    return np.where(m == 0, 0.0 * x, f)


# ===================================================================================================
# Castling-ViT: the angular series (Eq. 8)
# ===================================================================================================

def check_series_order(order: Any, name: str = "order") -> int:
    """The truncation order K of the angular series: an integer >= 0 (errors name ``name``)."""
    return numerics.check_positive_int(order, name, minimum=0)


def arcsin_coefficients_exact(order: int) -> tuple[Fraction, ...]:
    """The exact coefficients c_0, ..., c_K of arcsin x = sum_k c_k x^(2k+1) (Castling-ViT Eq. 8).

    c_k = (2k)! / (4^k (k!)^2 (2k + 1)) = binom(2k, k) / (4^k (2k + 1)):  1, 1/6, 3/40, 5/112, 35/1152, ...

    Parameters
    ----------
    order : int >= 0, the truncation order K.

    Returns
    -------
    tuple of K + 1 ``fractions.Fraction``.

    References
    ----------
    Castling-ViT Eq. 8; Abramowitz & Stegun 4.4.40.
    """
    order = check_series_order(order)
    return tuple(Fraction(math.comb(2 * k, k), 4 ** k * (2 * k + 1)) for k in range(order + 1))


def series_feature_dim(d: int, order: int, constant: bool) -> int:
    """D = [constant] + d + d^3 + ... + d^(2K+1), or (bounded work) the first partial sum above
    config.CASTLING_MAX_FEATURE_ELEMENTS, which every caller refuses anyway: the exact D of order 10**6 is
    an integer of millions of digits.  An order above config.ARCSIN_SERIES_MAX_TERMS (one feature block per
    term, so nothing to truncate) raises ValueError naming 'order'."""
    if order + 1 > config.ARCSIN_SERIES_MAX_TERMS:
        raise ArgumentError(f"argument 'order': the angular series features have one block per term, {order + 1} "
                         f"terms for order = {order}, above the limit {config.ARCSIN_SERIES_MAX_TERMS} "
                         f"(config.ARCSIN_SERIES_MAX_TERMS)")
    dim = int(constant)
    for k in range(order + 1):
        dim += d ** (2 * k + 1)
        if dim > config.CASTLING_MAX_FEATURE_ELEMENTS:
            break
    return dim
