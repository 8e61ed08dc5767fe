"""The feature maps of generic kernelized linear attention and their error coefficients (L2ViT Table 1 and
Eq. 2-4; Katharopoulos et al. 2020 Eq. 7 for ELU + 1; SimA's L1 normalisation): :func:`feature_map`,
:func:`feature_map_error`.  A part of :mod:`refimpl.attention.linear`, which imports and re-exports these names
(their documented home); imports numerics, config and the errors only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config, numerics
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["FEATURE_MAPS", "NON_NEGATIVE_MAPS", "feature_map", "feature_map_error"]

#: Names accepted by :func:`feature_map`.
FEATURE_MAPS = ("identity", "relu", "elu1", "softmax", "l1", "leaky_relu")

#: Feature maps whose output is non-negative (so the normaliser is a sum of non-negative terms).
#: "l1" is non-negative with its default base "relu"; "softmax" always.
NON_NEGATIVE_MAPS = ("relu", "elu1", "softmax", "l1")

_L1_BASES = ("relu", "identity", "elu1", "leaky_relu")

#: Maps whose value is > 0 for every finite input (a zero there is exp's underflow): see
#: normaliser_range.underflow_rows.
_POSITIVE_MAPS = ("elu1", "softmax")


# ===================================================================================================
# Feature maps
# ===================================================================================================

def _check_map_options(name: str, opts: Mapping[str, Any]) -> None:
    allowed = {"leaky_relu": {"negative_slope"}, "softmax": {"axis"},
               "l1": {"axis", "base", "eps", "negative_slope"}}.get(name, set())
    extra = set(opts) - allowed
    if extra:
        raise ArgumentTypeError(f"feature map {name!r}: unexpected option(s) {sorted(extra)}; "
                        f"accepted: {sorted(allowed) or 'none'}")


def _map_and_error(x: np.ndarray, name: str, opts: Mapping[str, Any], want_error: bool):
    """phi(x) and (optionally) its error coefficient E with |fl_T(phi(x)) - phi(x)| <= u_T * E (first
    order in u_T), E >= 0 element-wise.  See :func:`feature_map_error` for the derivation per map."""
    if name not in FEATURE_MAPS:
        raise ArgumentError(f"argument 'feature_map': expected one of {FEATURE_MAPS}, got {name!r}")
    _check_map_options(name, opts)
    c_elem = float(config.ELEMENTARY_FUNCTION_ULPS)
    if name == "identity":
        return x, (np.zeros_like(x) if want_error else None)
    if name == "relu":
        return numerics.relu(x), (np.zeros_like(x) if want_error else None)
    if name == "leaky_relu":
        slope = float(opts.get("negative_slope", config.LINEAR_LEAKY_RELU_SLOPE))
        phi = numerics.leaky_relu(x, slope)
        # slope * x is one rounded multiplication; x >= 0 passes through exactly.
        return phi, (np.where(x < 0, np.abs(phi), 0.0) if want_error else None)
    if name == "elu1":
        # ELU(x) + 1 = x + 1 (x > 0), exp(x) (x <= 0).  The reference evaluates exp(x) directly, which is
        # the same real function and more accurate than (exp(x) - 1) + 1 near x -> -inf.
        with np.errstate(over="ignore"):
            phi = np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
        err = None
        if want_error:
            # x > 0: one rounding of x + 1 -> u phi.  x <= 0: exp(x) with c_elem ulps -> c_elem u phi
            # (relative).  This covers the exp form only: the idiom elu(x) + 1 = (exp(x) - 1) + 1 has an
            # absolute error up to (c_elem + 2) u and returns 0 for exp(x) < u/2 - a documented finding
            # (docs/linear.md), not an error this bound admits.
            err = np.where(x > 0, np.abs(phi), c_elem * np.abs(phi))
        return phi, err
    if name == "softmax":
        axis = int(opts.get("axis", -1))
        phi = numerics.softmax(x, axis=axis)
        err = None
        if want_error:
            # Max-subtraction softmax (derivation in feature_map_error): relative error of phi_c
            # <= (|x_c - m| + w + 2 c_elem + n) u, with w = sum_c phi_c |x_c - m| and n the axis length.
            m = np.max(x, axis=axis, keepdims=True)
            with np.errstate(invalid="ignore"):
                dev = np.abs(x - m)
                w = np.sum(np.where(phi > 0, phi * dev, 0.0), axis=axis, keepdims=True)
            n = x.shape[axis]
            err = phi * (np.where(phi > 0, dev, 0.0) + w + 2.0 * c_elem + n)
        return phi, err
    # name == "l1"
    axis = int(opts.get("axis", -1))
    base = opts.get("base", "relu")
    if base not in _L1_BASES:
        raise ArgumentError(f"feature map 'l1': option 'base' must be one of {_L1_BASES}, got {base!r}")
    eps = float(opts.get("eps", config.LINEAR_L1_EPS))
    base_opts = {"negative_slope": opts["negative_slope"]} if ("negative_slope" in opts
                                                               and base == "leaky_relu") else {}
    b, eb = _map_and_error(x, base, base_opts, want_error)
    # Range safety: b / max(sum|b|, eps) = b' / max(sum|b'|, eps 2^-e) with b' = b 2^-e per row
    # (numerics.pow2_exponent; e = 0, the unscaled computation, inside the band), so a sum of 1e300-sized
    # entries cannot overflow.
    e = numerics.pow2_exponent(b, axis=axis)
    b_s = np.ldexp(b, -e)
    with np.errstate(over="ignore"):
        den_s = np.maximum(np.sum(np.abs(b_s), axis=axis, keepdims=True), np.ldexp(b.dtype.type(eps), -e))
        den = np.ldexp(den_s, e)                            # max(sum|b|, eps), for the error coefficient
    phi = b_s / den_s
    err = None
    if want_error:
        # phi = b / max(sum|b|, eps): base errors eb propagate as eb/den + |phi| sum(eb)/den; the sum of n
        # absolute values has relative error gamma_{n-1} <= (n-1)u (no cancellation) and the quotient u,
        # so n u |phi| in all (first order).
        n = x.shape[axis]
        err = eb / den + np.abs(phi) * (np.sum(eb, axis=axis, keepdims=True) / den + n)
    return phi, err


def feature_map(x: Any, name: str = "relu", **opts: Any) -> np.ndarray:
    """Apply the kernel feature map phi element-wise or row-wise.

    Parameters
    ----------
    x : float array (..., n_tokens, d), any real float dtype (computed in the working precision).
    name : one of :data:`FEATURE_MAPS`:

        - ``"identity"``: phi(x) = x (signed; the normaliser may cancel or vanish);
        - ``"relu"``: max(x, 0) (L2ViT §4.1, Table 1; FLatten Eq. 6 before f_p);
        - ``"elu1"``: ELU(x) + 1 = x + 1 for x > 0, exp(x) otherwise (Katharopoulos et al. 2020, Eq. 7);
        - ``"softmax"``: softmax along ``axis`` (default -1, over d: each token's features sum to 1);
        - ``"l1"``: b(x) / max(||b(x)||_1, eps) along ``axis`` (default -1, over d), with the base map
          ``base`` (default ``"relu"``, so phi is non-negative and each non-dead row sums to 1; an all-zero
          row maps to 0).  ``base="identity", axis=-2`` gives the signed, per-channel-over-tokens L1
          normalisation of SimA (Koohpayegani & Pirsiavash 2022), which L2ViT Table 1 calls "L1 norm" and
          which "keeps negative values".  ``eps`` default ``config.LINEAR_L1_EPS``;
        - ``"leaky_relu"``: x (x >= 0), negative_slope * x otherwise (L2ViT Table 1); option
          ``negative_slope`` default ``config.LINEAR_LEAKY_RELU_SLOPE``.

    Returns
    -------
    ndarray, same shape as x, working precision.

    References
    ----------
    L2ViT §4.1 and Table 1 (ReLU, LeakyReLU, L1 norm); FLatten Eq. 2-3; Katharopoulos et al. (2020) Eq. 7.
    """
    if name not in FEATURE_MAPS:            # checked under this function's argument name
        raise ArgumentError(f"argument 'name': expected one of {FEATURE_MAPS}, got {name!r}")
    x = numerics.as_float(x, "x")
    return _map_and_error(x, name, opts, want_error=False)[0]


def feature_map_error(x: Any, name: str = "relu", **opts: Any) -> np.ndarray:
    """Error coefficient E(x) >= 0 of a feature map: |fl_T(phi(x)) - phi(x)| <= u_T E(x) to first order.

    Derivations (u the unit roundoff of T, c = ``config.ELEMENTARY_FUNCTION_ULPS``, the assumed accuracy of
    exp in units of u; not rigorous beyond that assumption):

    - identity, relu: exact, E = 0.
    - leaky_relu: one rounded product slope*x on the negative side: E = |phi| there, 0 elsewhere.
    - elu1: x > 0: E = phi (x + 1 rounded once).  x <= 0: E = c phi (exp evaluated directly, the
      reference's form).  The idiom ELU(x) + 1 = (exp(x) - 1) + 1 is *not* covered: its error is absolute,
      up to (c + 2) u, and it returns exactly 0 once exp(x) < u/2 (a finding, docs/linear.md).
    - softmax along an axis of length n, computed as exp(x - m) / sum exp(x - m) with m the max (exact):
      t = fl(x_c - m) has relative error u, which exp turns into a relative error |x_c - m| u; exp itself
      adds c u.  The sum of the n non-negative terms has relative error
      <= sum_c phi_c (|x_c - m| + c) u + (n - 1) u = (w + c + n - 1) u with w = sum_c phi_c |x_c - m|;
      the quotient adds u.  Hence E = phi_c (|x_c - m| + w + 2c + n).
    - l1 with base b: phi = b / max(sum |b|, eps); E = E_b / den + |phi| (sum E_b / den + n)  (base errors
      through numerator and sum, n - 1 roundings in the sum of absolute values, 1 in the quotient).

    Parameters and options as :func:`feature_map`.  Returns an array of x's shape.

    References
    ----------
    Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed.), §2.2, §3.1; docs/design.md "The
    verdict".
    """
    if name not in FEATURE_MAPS:            # checked under this function's argument name
        raise ArgumentError(f"argument 'name': expected one of {FEATURE_MAPS}, got {name!r}")
    x = numerics.as_float(x, "x")
    return _map_and_error(x, name, opts, want_error=True)[1]
