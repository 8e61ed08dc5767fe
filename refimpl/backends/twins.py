"""NumPy twins of compiled kernels whose definition lives in a module that does not register them itself.

A twin is the NumPy definition of a ``refimpl.backends`` operation: same signature as the kernels (plus the
kernels' ``out=``, ``workspace=`` and ``threads=``, accepted here for parity), computing exactly what the
cited reference function computes by calling it.  The reference function is the specification; the twin
only adapts its signature.

- ``"linear_angular_attention"``: Castling-ViT's linear-angular attention, Eq. 9 (without the DWConv and
  sparse branches), specified by :func:`refimpl.attention.angular.linear_angular_attention` (paper mode:
  ``policy="clamp"``, ``arithmetic="scaled"``); C kernel ``refimpl.backends._c.linear_angular_attention``.
- ``"elu1_feature_map"``: ELU(x) + 1 = x + 1 (x > 0), exp(x) otherwise (Katharopoulos et al. 2020, Eq. 7),
  specified by ``refimpl.attention.linear.feature_map(x, "elu1")``; C kernel
  ``refimpl.backends._c.elu1_feature_map`` (used by RALA's alpha, Eq. 4, on the fused path).
- ``"angular_series_features"``: Castling-ViT's feature map Phi_K (Eq. 8), specified by
  :func:`refimpl.attention.angular.angular_series_features`; Numba kernel in refimpl/backends/_numba.py.
- ``"focused_function"``: FLatten's f_p (Eq. 6), specified by
  :func:`refimpl.attention.focused.focused_function`; Numba kernel in refimpl/backends/_numba.py.
- ``"lisa_spectral_product"``: LiSA's pointwise spectral products (Eq. 10), specified by the ``xf * kf``
  of :func:`refimpl.toeplitz._fft_convolve`; Numba kernel in refimpl/backends/_numba.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from . import register

__all__ = ["linear_angular_attention", "elu1_feature_map", "angular_series_features", "focused_function",
           "lisa_spectral_product"]


@register("linear_angular_attention", "numpy")
def linear_angular_attention(q: Any, k: Any, v: Any, constant: str = "sum", normalizer: str = "none",
                             eps: float = config.CASTLING_QK_NORM_EPS, *, out: np.ndarray | None = None,
                             workspace: Any = None, threads: Any = None) -> np.ndarray:
    """H = C + (1/pi) Q^ (K^^T V) (Castling-ViT Eq. 9, the order-0 truncation of Eq. 8), Q^, K^ the rows of
    q, k divided by max(||.||_2, eps); C_i = 1/2 sum_j V_j (constant "sum", the paper) or 1/2 V_i ("own",
    the released code); normalizer "none" (Eq. 9) or "similarity_sum" (H_i / (M/2 + (1/pi) Q^_i . sum_j K^_j)).

    The specification is :func:`refimpl.attention.angular.linear_angular_attention` with policy="clamp",
    arithmetic="scaled"; this function calls its NumPy body ``angular._linear_angular_attention_numpy``
    (the public function dispatches to this operation when a non-NumPy backend is selected).

    Parameters
    ----------
    q : (B, h, N, d), k : (B, h, M, d), v : (B, h, M, e) float arrays (M = N for constant "own").
    constant : "sum" | "own".  normalizer : "none" | "similarity_sum" (the kernels do not implement the
        official "output_l2"; call angular.linear_angular_attention for it).  eps : float >= 0.
    out : optional (B, h, N, e) array the result is copied into and returned.  workspace, threads :
        accepted and ignored.

    Returns
    -------
    ndarray (B, h, N, e).

    References
    ----------
    Castling-ViT (You et al., CVPR 2023) Eq. 8-9; refimpl.attention.angular.linear_angular_attention.
    """
    from ..attention import angular  # at call time: refimpl.backends never imports attention modules eagerly

    if normalizer not in ("none", "similarity_sum"):
        raise ValueError(f"argument 'normalizer': operation 'linear_angular_attention' takes 'none' or "
                         f"'similarity_sum', got {normalizer!r}; use angular.linear_angular_attention for "
                         f"'output_l2'")
    # The NumPy body, not the public function: that one dispatches through this operation again.
    res = angular._linear_angular_attention_numpy(q, k, v, constant=constant, normalizer=normalizer, eps=eps,
                                                  policy="clamp", arithmetic="scaled")
    if out is not None:
        out[...] = res
        return out
    return res


# ---------------------------------------------------------------------------------------------------
# ELU + 1 feature map (specification: refimpl.attention.linear.feature_map)
# ---------------------------------------------------------------------------------------------------

@register("elu1_feature_map", "numpy")
def elu1_feature_map(x: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """The NumPy definition of operation "elu1_feature_map": ELU(x) + 1 = x + 1 for x > 0, exp(x) otherwise,
    element-wise (exp form, relative accuracy kept as x -> -inf), by calling
    ``refimpl.attention.linear.feature_map(x, "elu1")``.

    Parameters
    ----------
    x : float array, any shape.  out : optional array of x's shape the result is copied into and returned.

    Returns
    -------
    ndarray of x's shape (working precision, as ``linear.feature_map``).

    References
    ----------
    Katharopoulos et al. (2020) Eq. 7; RALA (Fan et al., CVPR 2025) Sec. 3.2 (kappa).
    """
    from ..attention import linear  # at call time: refimpl.backends never imports attention modules eagerly

    res = linear.feature_map(x, "elu1")
    if out is not None:
        out[...] = res
        return out
    return res


# ---------------------------------------------------------------------------------------------------
# Castling-ViT: angular series feature map (specification: refimpl.attention.angular)
# ---------------------------------------------------------------------------------------------------

@register("angular_series_features", "numpy")
def angular_series_features(x: Any, order: int, *, constant: bool = True,
                            eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> np.ndarray:
    """Phi_K(x) = [sqrt(1/2), sqrt(c_0/pi) x^, sqrt(c_1/pi) x^(x)3, ..., sqrt(c_K/pi) x^(x)(2K+1)].

    The NumPy twin of the ``"angular_series_features"`` operation: exactly
    :func:`refimpl.attention.angular.angular_series_features` (the specification; same arguments).

    Parameters
    ----------
    x : (..., d) float.  order : K >= 0.  constant : include sqrt(1/2).  eps, policy : row normalisation
        x^ = x / max(||x||, eps) ("clamp") or x / ||x|| ("none").

    Returns
    -------
    (..., D) float, D = [constant] + d + d^3 + ... + d^(2K+1).

    References
    ----------
    Castling-ViT Eq. 8 (arcsin series of the angular kernel, written as explicit feature maps).
    """
    from ..attention import angular
    # The NumPy body, not the public function: that one dispatches through this operation again.
    return angular._angular_series_features_numpy(x, order, constant=constant, eps=eps, policy=policy)


# ---------------------------------------------------------------------------------------------------
# FLatten: the per-row focused function f_p (specification: refimpl.attention.focused)
# ---------------------------------------------------------------------------------------------------

@register("focused_function", "numpy")
def focused_function(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                     power_scaling: str = "max") -> np.ndarray:
    """f_p(x) = ||x|| / ||x**p|| * x**p along ``axis`` (x >= 0).

    The NumPy twin of the ``"focused_function"`` operation: exactly
    :func:`refimpl.attention.focused.focused_function` (the specification; same arguments), by calling its
    NumPy body ``focused._focused_function_numpy`` (the public function dispatches to this operation when
    a non-NumPy backend is selected).

    Parameters
    ----------
    x : (..., d) float >= 0.  p : float >= 1.  axis : feature axis.  power_scaling : "max" | "none".

    Returns
    -------
    ndarray of x's shape.

    References
    ----------
    FLatten Eq. 6 (and Eq. 20-21, the max-normalised form).
    """
    from ..attention import focused
    # The NumPy body, not the public function: that one dispatches through this operation again.
    return focused._focused_function_numpy(x, p, axis=axis, power_scaling=power_scaling)


# ---------------------------------------------------------------------------------------------------
# LiSA: the spectral products of Eq. 10 (specification: refimpl.toeplitz._fft_convolve, "xf * kf")
# ---------------------------------------------------------------------------------------------------

@register("lisa_spectral_product", "numpy")
def lisa_spectral_product(xf: Any, kf: Any) -> np.ndarray:
    """P[m, f, c, d] = Xf[m, f, c] * Kf[f, c', d], c' = c (Ga = Kb (*) Wa) or 0 (Gb = V (*) Wb, the kernel
    shared by the c channels): the pointwise product of spectra that refimpl.toeplitz._fft_convolve
    forms as ``xf * kf`` for x = (..., c, 1) inputs (the specification), one complex multiplication per
    element.

    Parameters
    ----------
    xf : (M, F, c) complex64/complex128, the spectra of M = B h token signals (F frequency bins, grid
        flattened row-major).  kf : (F, c, D) or (F, 1, D), same dtype, the kernels' spectra.

    Returns
    -------
    (M, F, c, D) complex array of xf's dtype.

    References
    ----------
    LiSA Eq. 10 (convolution theorem), Fig. 7, Appendix A.
    """
    xf, kf = np.asarray(xf), np.asarray(kf)
    return xf[..., None] * kf[None]
