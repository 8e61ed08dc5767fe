"""Castling-ViT, the arcsin series' checks of domain, work and range (Eq. 8): the order actually summed for a
given x (``_terms``: bounded work, ``config.ARCSIN_SERIES_MAX_TERMS``), the domain |x| <= 1 of the tail
functions with its rounding slack (``ARCSIN_DOMAIN_SLACK``, ``_check_domain``) and the range policy of
docs/guarantees.md for a finite polynomial value beyond the dtype's range (``_check_representable``).

Layer: attention, below :mod:`.angular_series` (which imports and uses them, and re-exports
``ARCSIN_DOMAIN_SLACK``): imports config, errors and feature_maps only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import config
from ..errors import ArgumentError
from ..feature_maps import check_series_order as _check_order

__all__: list[str] = []

#: The arcsin tail functions (:func:`arcsin_tail_bound`, :func:`arcsin_tail_tightness`) are defined on the
#: series' domain |x| <= 1; |x| up to 1 + ARCSIN_DOMAIN_SLACK is accepted as the rounding excess of a computed
#: cosine (q^.k^ of rounded unit rows exceeds 1 by a few units of d u; 2^-20 covers any d below 2^30), and
#: larger |x| (or +-inf) raise ArgumentError naming 'x'.
ARCSIN_DOMAIN_SLACK = 2.0 ** -20


def _terms(x: np.ndarray, order: Any, what: str) -> int:
    """The order actually summed by :func:`arcsin_series` / :func:`arcsin_series_derivative` for ``x``:
    min(K, K0), K0 the smallest order with m^(2 K0 + 2) <= 2^-56 (1 - m^2), m = max |x| over the finite
    entries (0 for m = 0, K for m >= 1; derivation in arcsin_series).  ValueError naming ``order`` when that
    exceeds ``config.ARCSIN_SERIES_MAX_TERMS``."""
    order = _check_order(order)
    ax = np.abs(x[np.isfinite(x)])
    m = float(np.max(ax)) if ax.size else 0.0
    if m == 0.0:
        k0 = 0
    elif m < 1.0:
        # (2 K0 + 2) ln m <= -56 ln 2 + ln(1 - m^2); + 1 absorbs the rounding of the logarithms.
        k0 = max(0, math.ceil(((-56.0 * math.log(2.0) + math.log1p(-m) + math.log1p(m)) / math.log(m) - 2.0) / 2.0) + 1)
    else:
        k0 = order
    terms = min(order, k0)
    limit = config.ARCSIN_SERIES_MAX_TERMS
    if terms > limit:
        raise ArgumentError(f"argument 'order': {what} would sum {terms} terms of the arcsin series (order = {order}; "
                         f"the largest |x| is {m!r}, where the terms up to that order are not negligible in "
                         f"float64), above the limit {limit} (config.ARCSIN_SERIES_MAX_TERMS); use order <= {limit}, "
                         f"or arcsin itself (angular_similarity) for the untruncated kernel")
    return terms


def _check_domain(ax: np.ndarray, what: str) -> None:
    """ArgumentError naming 'x' where a non-NaN |x| exceeds 1 + ARCSIN_DOMAIN_SLACK (the tail functions' domain:
    the arcsin series diverges there and arcsin x is not real, so R_K(x) is undefined)."""
    bad = ax[~np.isnan(ax)]
    m = float(np.max(bad)) if bad.size else 0.0
    if m > 1.0 + ARCSIN_DOMAIN_SLACK:
        raise ArgumentError(f"argument 'x': {what} is defined for |x| <= 1 (the domain of the arcsin series, with "
                            f"a rounding slack of 2^-20), got an entry with |x| = {m!r}")


def _check_representable(x: np.ndarray, out: np.ndarray, order: int, what: str) -> np.ndarray:
    """``out`` unchanged, or FloatingPointError naming the stage where a finite x gave a non-finite value: the
    polynomial (all coefficients > 0, so every Horner step grows with |x| >= 1 and an overflow only happens where
    the exact value exceeds the range) is finite but not representable in x's dtype."""
    lost = ~np.isfinite(out) & np.isfinite(x)
    if np.any(lost):
        m = float(np.max(np.abs(x[lost])))
        raise FloatingPointError(f"{what}: the polynomial of order K = {order} overflows {out.dtype} at |x| = {m!r} "
                                 f"(its exact value is finite but beyond the range; the series approximates arcsin "
                                 f"only on |x| <= 1)")
    return out
