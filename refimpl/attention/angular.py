"""Castling-ViT: the angular kernel, its arcsin series, and linear-angular attention.

Reference: H. You et al., "Castling-ViT: Compressing Self-Attention via Switching Towards Linear-Angular
Attention at Vision Transformer Inference", CVPR 2023 (../shared/seeds/003_b81e2e603475c765.txt).  Equation
numbers are the paper's.

Shapes: B batch, h heads, N query tokens, M key/value tokens, d head dim, C = h d channels, H x W grid
(N = H W).  Per-head tensors are (B, h, N, d); token tensors (B, N, C).

The mathematics, top to bottom in this file:

1. **The arcsin series** (Eq. 8).  arcsin x = sum_{k>=0} c_k x^(2k+1), c_k = (2k)! / (4^k (k!)^2 (2k+1)),
   truncated after order K: T_K(x) = sum_{k<=K} c_k x^(2k+1), with two proven tail bounds
   (:func:`arcsin_tail_bound`).
2. **The angular kernel** (Eq. 4-5): theta = arccos(q^.k^), Sim = 1 - theta/pi = 1/2 + arcsin(q^.k^)/pi
   (the identity behind Eq. 8), evaluated stably near |q^.k^| = 1 by Kahan's half-angle formula.
3. **Feature maps**: tensor powers x^{(x)p} with <x^{(x)p}, y^{(x)p}> = (x.y)^p exactly, so every order of
   the expansion is a linear-attention term; the implicit map phi of Eq. 6-7 realised by random-hyperplane
   sign features; the exponential / Gaussian-RBF kernels of Eq. 2.
4. **Attention**: the full quadratic angular attention (exact or truncated kernel, with or without the
   similarity-sum normaliser); the same truncated kernel in linear time through tensor-power features; the
   linear-angular attention of Eq. 9; the depthwise-conv branch on V; the auxiliary masked softmax branch of
   Eq. 10; the Castling attention module (qkv, core, proj) with its presets ``paper`` and ``official``.
5. **Error bounds** (numerics' model): first-order running error analysis of every path above.

What "official" means (the authors' released ``LinAngularAttention``; each item is a :class:`CastlingConfig`
field):  constant term 1/2 v_i (the token's own value); no similarity-sum normaliser, instead each token's
per-head output divided by its own L2 norm with no eps, the conv branch added after that; the conv is a (k, 1)
depthwise conv along the flattened token axis with heads as channels, no bias, k = 9, applied to V; q and k
normalised with no eps, every norm computed as sqrt(sum x^2) (``tensor.norm()``, which underflows for tiny
rows); the sparse branch's softmax taken from the unnormalised q and k scaled by head_dim^-1/2, added before
the output normalisation, and present (or absent) regardless of train/eval.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any, Mapping

import numpy as np

from .. import backends, config, layers, numerics, validation
from ..errors import ArgumentError
from ..numerics import Bound

__all__ = [
    "arcsin_coefficients_exact", "arcsin_coefficients", "arcsin_series", "arcsin_series_derivative",
    "arcsin_series_bound", "arcsin_tail_bound", "arcsin_tail_tightness", "TAIL_BOUND_FLOOR",
    "unit_rows", "cosine_matrix", "spectral_angle", "angular_similarity", "angular_similarity_series",
    "tensor_power", "angular_series_features", "hyperplane_features", "exponential_kernel",
    "gaussian_rbf_kernel",
    "angular_attention", "angular_attention_features", "linear_angular_attention",
    "linear_angular_attention_bound", "token_conv",
    "grid_conv", "masked_softmax_branch",
    "CastlingConfig", "init_castling_params", "castling_core", "castling_attention",
    "angular_similarity_bound", "angular_attention_bound", "castling_core_bound", "castling_attention_bound",
]

_METHODS = ("atan2", "arccos", "arcsin")

#: Absolute floor added to :func:`arcsin_tail_bound` for x != 0: each of its ELEMENTARY_FUNCTION_ULPS + 8
#: roundings may lose up to one subnormal spacing 2^-1074 when |x|^(2K+3) is in or below the subnormal range.
TAIL_BOUND_FLOOR = (config.ELEMENTARY_FUNCTION_ULPS + 8) * 2.0 ** -1074
_POLICIES = ("clamp", "none")


# ===================================================================================================
# 1. The arcsin series (Eq. 8)
# ===================================================================================================

def _check_order(order: Any, name: str = "order") -> int:
    return numerics.check_positive_int(order, name, minimum=0)


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
    order = _check_order(order)
    return tuple(Fraction(math.comb(2 * k, k), 4 ** k * (2 * k + 1)) for k in range(order + 1))


def arcsin_coefficients(order: int) -> np.ndarray:
    """c_0..c_K of Eq. 8 correctly rounded to float64 (then to the working precision).

    Returns
    -------
    (K + 1,) array of the working dtype.  Each entry is float(Fraction), i.e. correctly rounded in float64;
    inside ``numerics.precision(float32)`` it is rounded once more to float32.

    References
    ----------
    Castling-ViT Eq. 8.
    """
    c = np.array([float(f) for f in arcsin_coefficients_exact(order)], dtype=np.float64)
    return c.astype(numerics.working_dtype())


def arcsin_series(x: Any, order: int) -> np.ndarray:
    """The truncated series T_K(x) = sum_{k=0}^{K} c_k x^(2k+1) of Eq. 8, by Horner's rule in t = x^2.

    T_K(x) = x (c_0 + t (c_1 + t (c_2 + ... + t c_K))).  Any real x is accepted (T_K is a polynomial); it
    approximates arcsin x only for |x| <= 1, with the error bounded by :func:`arcsin_tail_bound`.

    Parameters
    ----------
    x : array_like float, any shape.
    order : int >= 0, K.

    Returns
    -------
    ndarray of x's shape, working dtype.

    Bounded work: with m = max |x| < 1, the terms of order k > K0 sum to at most
    sum_{k > K0} c_k |x|^(2k+1) <= |x| m^(2 K0 + 2) / (1 - m^2) (c_k <= c_0 = 1, the tail bound (G) of
    :func:`arcsin_tail_bound`), i.e. to at most 2^-56 |T_K(x)| (|T_K(x)| >= |x|) once
    m^(2 K0 + 2) <= 2^-56 (1 - m^2): below a quarter of float64's unit roundoff, so they are not summed and the
    result is Horner's rule on T_min(K, K0), within :func:`arcsin_series_bound` (x, order) of the exact
    T_K(x) (``order=10**7`` on |x| <= 0.9 sums about 180 terms and returns the same bits as ``order=1000``).
    Where max |x| >= 1 (or is so close to 1 that more terms matter) every term up to K is summed, and more
    than ``config.ARCSIN_SERIES_MAX_TERMS`` terms raise ValueError (a work bound: at |x| = 1 no feasible
    order reaches float64 accuracy, see the constant).

    References
    ----------
    Castling-ViT Eq. 8 (the K-th partial sum of the "high-order residuals").
    """
    x = numerics.as_float(x, "x", allow_empty=True)
    c = arcsin_coefficients(_terms(x, order, "arcsin_series"))
    t = x * x
    acc = np.full_like(x, c[-1])
    for ck in c[-2::-1]:
        acc = acc * t + ck
    return x * acc


def arcsin_series_derivative(x: Any, order: int) -> np.ndarray:
    """T_K'(x) = sum_{k<=K} (2k+1) c_k x^(2k), used to propagate an error in x through T_K (Eq. 8).

    Bounded work as :func:`arcsin_series` ((2k+1) c_k = binom(2k, k) / 4^k <= 1 and T_K' >= 1, so the same
    K0 makes the unsummed tail <= 2^-56 T_K'(x)); more than ``config.ARCSIN_SERIES_MAX_TERMS`` terms raise."""
    x = numerics.as_float(x, "x", allow_empty=True)
    order = _terms(x, order, "arcsin_series_derivative")
    c = arcsin_coefficients(order)
    t = x * x
    acc = np.full_like(x, c[-1] * (2 * order + 1))
    for k in range(order - 1, -1, -1):
        acc = acc * t + c[k] * (2 * k + 1)
    return acc


def arcsin_series_bound(x: Any, order: int) -> Bound:
    """Rounding-error bound of :func:`arcsin_series` evaluated in precision T.

    Horner's rule on the degree-K polynomial in t = x^2 with non-negative coefficients has error
    <= gamma_{2K} sum_k c_k |t|^k (Higham 2002, eq. 5.3); t = fl(x^2) carries relative error u, so t^k
    carries <= k u <= K u; each c_k is rounded once (u); the final product by x rounds once (u).  Since all
    c_k > 0 the running sum on absolute values is T_K(|x|) = |T_K(x)|, so

        |fl(T_K(x)) - T_K(x)| <= gamma_{3K+2} |T_K(x)|      (first order in u; k = 3K + 2).

    References
    ----------
    Castling-ViT Eq. 8; Higham (2002) eq. (5.3).
    """
    order = _check_order(order)
    x = numerics.as_float(x, "x", allow_empty=True)
    return Bound(np.abs(arcsin_series(np.abs(x), order)), 3 * order + 2,
                 f"Horner on T_K, K = {order}: gamma_(2K) + K u (t^k) + u (c_k) + u (times x), first order")


def _tail_constant_uniform(order: int) -> float:
    # c_{K+1} + 1 / sqrt(pi (K + 1)): an upper bound of sum_{k > K} c_k (proof in arcsin_tail_bound).
    c_next = float(arcsin_coefficients_exact(order + 1)[-1])
    return c_next + 1.0 / math.sqrt(math.pi * (order + 1))


def arcsin_tail_bound(x: Any, order: int, kind: str = "geometric") -> np.ndarray:
    """A proven upper bound of the truncation error |arcsin x - T_K(x)| of Eq. 8.

    Let R_K(x) = arcsin x - T_K(x) = sum_{k > K} c_k x^(2k+1) (|x| <= 1; the series converges absolutely on
    [-1, 1] because sum_k c_k = arcsin 1 = pi/2 by Abel's theorem and all c_k > 0).

    **Lemma (the coefficients decrease).**  c_{k+1}/c_k = (2k+1)^2 / ((2k+2)(2k+3))
    = (4k^2 + 4k + 1) / (4k^2 + 10k + 6) < 1 for every k >= 0, so c_0 > c_1 > c_2 > ... > 0.

    **kind="geometric"** (|x| < 1; +inf for |x| >= 1):

        |R_K(x)| <= sum_{j>=0} c_{K+1+j} |x|^(2K+3+2j) <= c_{K+1} |x|^(2K+3) sum_{j>=0} x^(2j)
                  = c_{K+1} |x|^(2K+3) / (1 - x^2)                                         (G)

    by the Lemma (c_{K+1+j} <= c_{K+1}) and the geometric series.  *Tightness*: every term of R_K(|x|) is
    positive and the first one is c_{K+1}|x|^(2K+3), so |R_K(x)| >= c_{K+1}|x|^(2K+3) and
    1 <= G / |R_K| <= 1 / (1 - x^2): within a factor 4/3 for |x| <= 1/2, 1/(1 - r^2) for |x| <= r.
    G blows up at |x| -> 1 although R_K(1) = pi/2 - T_K(1) is finite; hence:

    **kind="uniform"** (|x| <= 1; +inf for |x| > 1):

        |R_K(x)| <= |x|^(2K+3) sum_{k>K} c_k <= |x|^(2K+3) (c_{K+1} + 1/sqrt(pi (K+1)))       (U)

    Proof: |x|^(2k+1) <= |x|^(2K+3) for k >= K+1 and |x| <= 1.  Wallis' inequality
    binom(2k, k)/4^k <= 1/sqrt(pi k) (k >= 1) gives c_k <= 1/(sqrt(pi k)(2k+1)) < k^(-3/2)/(2 sqrt(pi)),
    and sum_{k>=K+2} k^(-3/2) <= int_{K+1}^inf t^(-3/2) dt = 2/sqrt(K+1) (decreasing integrand).
    *Tightness at x = 1*: the lower Wallis bound binom(2k,k)/4^k >= 1/sqrt(pi(k + 1/2)) gives
    c_k >= (k + 1/2)^(-3/2) / (2 sqrt(pi)), a decreasing function, so R_K(1) >= int_{K+1}^inf of it
    = 1/sqrt(pi (K + 3/2)) and U(1)/R_K(1) <= sqrt((K + 3/2)/(K + 1)) (1 + 1/(2(K+1))) <= 1.84 (K = 0),
    -> 1 as K grows.

    **kind="best"**: min(G, U), valid on |x| <= 1.

    The bound is evaluated in float64, inflated by (1 + gamma_m), m = config.ELEMENTARY_FUNCTION_ULPS + 8
    (one pow, six basic operations, the rounding of c_{K+1} to float64), and TAIL_BOUND_FLOOR =
    m 2^-1074 is added for x != 0 (|x|^(2K+3) underflows for tiny x), so that the computed number is itself an
    upper bound.  The tightness factors hold up to that inflation and that absolute floor.

    Parameters
    ----------
    x : array_like float, any shape.
    order : int >= 0, K.
    kind : "geometric" (default, the bound (G) asked for by the issue), "uniform" or "best".

    Returns
    -------
    float64 ndarray of x's shape, >= |arcsin x - T_K(x)| for every |x| <= 1 where it is finite.

    References
    ----------
    Castling-ViT Eq. 8; Wallis' inequality for the central binomial coefficient (e.g. Graham, Knuth &
    Patashnik, Concrete Mathematics, exercise 9.60 and its answer).
    """
    order = _check_order(order)
    ax = np.abs(np.asarray(numerics.as_float(x, "x", allow_empty=True), dtype=np.float64))
    if kind not in ("geometric", "uniform", "best"):
        raise ArgumentError(f"argument 'kind': expected 'geometric', 'uniform' or 'best', got {kind!r}")
    inflate = 1.0 + numerics.gamma(config.ELEMENTARY_FUNCTION_ULPS + 8, numerics.unit_roundoff(np.float64))
    c_next = float(arcsin_coefficients_exact(order + 1)[-1])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        power = ax ** (2 * order + 3)
        one_minus = (1.0 - ax) * (1.0 + ax)  # 1 - x^2 without cancellation near |x| = 1
        geo = np.where(ax < 1.0, c_next * power / one_minus, np.inf)
        uni = np.where(ax <= 1.0, power * _tail_constant_uniform(order), np.inf)
    out = {"geometric": geo, "uniform": uni, "best": np.minimum(geo, uni)}[kind]
    # |x|^(2K+3) may underflow (or lose bits in the subnormal range): the floor keeps the computed number an
    # upper bound of a true tail that float64 cannot represent accurately.
    out = out * inflate + np.where(ax > 0, TAIL_BOUND_FLOOR, 0.0)
    return np.where(np.isnan(ax), np.nan, out)


def arcsin_tail_tightness(x: Any, order: int, kind: str = "geometric") -> np.ndarray:
    """The proven factor F with bound / |R_K(x)| <= F (Eq. 8 tail; see :func:`arcsin_tail_bound`).

    geometric: F = 1/(1 - x^2) (|x| < 1).  uniform at |x| = 1: F = sqrt((K+3/2)/(K+1)) (1 + 1/(2(K+1))).
    Returns float64 ndarray of x's shape (inf where no factor is proven).
    """
    order = _check_order(order)
    ax = np.abs(np.asarray(numerics.as_float(x, "x", allow_empty=True), dtype=np.float64))
    with np.errstate(divide="ignore"):
        if kind == "geometric":
            return np.where(ax < 1.0, 1.0 / ((1.0 - ax) * (1.0 + ax)), np.inf)
    if kind == "uniform":
        f1 = math.sqrt((order + 1.5) / (order + 1)) * (1.0 + 1.0 / (2 * (order + 1)))
        return np.where(ax == 1.0, f1, np.inf)
    raise ArgumentError(f"argument 'kind': expected 'geometric' or 'uniform', got {kind!r}")


# ===================================================================================================
# 2. The angular kernel (Eq. 4-5, 8)
# ===================================================================================================

def _check_pair(q: np.ndarray, k: np.ndarray, names: tuple[str, str] = ("q", "k")) -> None:
    a, b = names
    if q.ndim < 2 or k.ndim < 2:
        raise ArgumentError(f"arguments '{a}', '{b}': expected arrays of shape (..., N, d) and (..., M, d), got "
                         f"{q.shape} and {k.shape}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ArgumentError(f"arguments '{a}', '{b}': expected shapes (..., N, d) and (..., M, d) with equal leading "
                         f"dims and d, got {q.shape} and {k.shape}")


def _check_policy(policy: str) -> None:
    if policy not in _POLICIES:
        raise ArgumentError(f"argument 'policy': expected one of {_POLICIES}, got {policy!r}")


def _guard(elements: int, max_elements: int | None, what: str, instead: str) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if elements > limit:
        raise ArgumentError(f"{what} would allocate {elements} elements (limit {limit}, "
                         f"config.QUADRATIC_MAX_ELEMENTS or max_elements); use {instead} instead")


def unit_rows(x: Any, *, eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
              arithmetic: str = "scaled") -> np.ndarray:
    """q^ = q / ||q|| row-wise, the normalisation inside Eq. 4 and Eq. 8 ("Q_i . K_j^T denotes the normalised
    linear kernel <Q_i, K_j> / ||Q_i|| ||K_j||").

    policy="clamp": x / max(||x||, eps) (paper mode; a zero row maps to 0 and stays finite);
    policy="none": x / ||x|| (official; a zero row gives 0/0 = NaN, as the released code does).
    arithmetic="scaled": ||x|| = m ||x/m||, m = max|x| (numerics.l2_normalize), which neither underflows nor
        overflows, so x^ depends on the direction of x only;
    arithmetic="naive": ||x|| = sqrt(sum x^2), what ``tensor.norm()`` in the released code computes: sum x^2
        underflows to 0 when every |x_i| is below about sqrt(smallest subnormal) (1.5e-162 in float64,
        3.7e-23 in float32), and x / 0 is then +-inf or NaN although the exact x^ is finite.  For d = 1 it
        is |x| (torch reduces a one-element 2-norm to the absolute value, without squaring - observed in
        torch 2.x, found by the equivalence suite).  The official preset uses it so that the reference
        produces NaN exactly where the released arithmetic does.

    Parameters
    ----------
    x : (..., d) float.  eps : float >= 0.  policy : "clamp" or "none".  arithmetic : "scaled" or "naive".

    Returns
    -------
    (..., d) working dtype.
    """
    validation.check_eps(eps)
    _check_policy(policy)
    if arithmetic == "scaled":
        return numerics.l2_normalize(x, axis=-1, eps=eps, policy=policy)
    if arithmetic != "naive":
        raise ArgumentError(f"argument 'arithmetic': expected 'scaled' or 'naive', got {arithmetic!r}")
    x = numerics.as_float(x, "x")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        n = np.abs(x) if x.shape[-1] == 1 else np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
        return x / (np.maximum(n, eps) if policy == "clamp" else n)


def cosine_matrix(q: Any, k: Any, *, eps: float = config.CASTLING_QK_NORM_EPS,
                  policy: str = "clamp", max_elements: int | None = None) -> np.ndarray:
    """c_ij = q^_i . k^_j, the argument of arccos in Eq. 4 (and of arcsin in Eq. 8).

    Parameters
    ----------
    q : (..., N, d) float; k : (..., M, d) float with the same leading dims.
    max_elements : limit on the (..., N, M) output (config.QUADRATIC_MAX_ELEMENTS by default).

    Returns
    -------
    (..., N, M) working dtype.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    _check_pair(q, k)
    _guard(int(np.prod(q.shape[:-1])) * k.shape[-2], max_elements, "the pairwise angular kernel",
           "linear_angular_attention (order 0) or angular_attention_features (order K)")
    return unit_rows(q, eps=eps, policy=policy) @ np.swapaxes(unit_rows(k, eps=eps, policy=policy), -1, -2)


def _row_is_unit(x: np.ndarray, eps: float, policy: str) -> np.ndarray:
    """True where the normalised row is a unit vector (its norm was >= eps, or policy none)."""
    if policy == "none":
        return np.ones(x.shape[:-1], dtype=bool)
    return np.linalg.norm(x, axis=-1) >= eps


def spectral_angle(q: Any, k: Any, *, method: str = "atan2", eps: float = config.CASTLING_QK_NORM_EPS,
                   policy: str = "clamp", max_elements: int | None = None) -> np.ndarray:
    """The spectral angle theta(q_i, k_j) = arccos(q^_i . k^_j) in [0, pi] (Castling-ViT Eq. 4).

    Methods (equal in exact arithmetic; they differ in accuracy where |q^.k^| -> 1):

    - "atan2" (default): Kahan's half-angle formula theta = 2 atan2(||q^ - k^||, ||q^ + k^||) for unit q^, k^.
      Its absolute error is a small multiple of u for every angle, including theta -> 0 and theta -> pi.
      Rows whose norm is below eps (only with policy "clamp": q^ = q/eps is then not a unit vector, and the
      angle is undefined for a zero row) use arccos(clip(q^.k^)) instead, so that theta = arccos(q^.k^)
      holds for every row: a zero row gives theta = pi/2, the value Eq. 8 gives at q^.k^ = 0.
    - "arccos": arccos(clip(q^.k^, -1, 1)) (Eq. 4 as written).  The clip keeps it finite when rounding makes
      |q^.k^| exceed 1.  Accuracy: for a, b in [-1, 1], |arccos a - arccos b| <= pi sqrt(|a - b| / 2)
      (from |cos t1 - cos t2| = 2 sin((t1+t2)/2) |sin((t1-t2)/2)| >= 2 sin^2(|t1-t2|/2) >= 2 (|t1-t2|/pi)^2
      on [0, pi]); so an error delta in q^.k^ costs up to pi sqrt(delta/2) in theta: about 1e-7 in float64
      and 3e-3 in float32 for d = 16 at |q^.k^| = 1, against u-level away from it (derivative
      1/sqrt(1 - c^2)).
    - "arcsin": pi/2 - arcsin(clip(q^.k^, -1, 1)) (the first step of Eq. 8); same accuracy as "arccos".

    Parameters
    ----------
    q : (..., N, d) float; k : (..., M, d) float, same leading dims.
    method : "atan2" | "arccos" | "arcsin".  eps, policy : as :func:`unit_rows`.
    max_elements : int or None, limit on the (..., N, M, d) pairwise differences of "atan2".

    Returns
    -------
    (..., N, M) working dtype, in [0, pi] (NaN only where an input or a policy-"none" normalisation is NaN).

    References
    ----------
    Castling-ViT Eq. 4, Eq. 8; W. Kahan, "How futile are mindless assessments of roundoff in floating-point
    computation?" (2006), Sec. 12 (angle between vectors).
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    if method not in _METHODS:
        raise ArgumentError(f"argument 'method': expected one of {_METHODS}, got {method!r}")
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    _check_pair(q, k)
    c = cosine_matrix(q, k, eps=eps, policy=policy, max_elements=max_elements)
    cc = np.clip(c, -1.0, 1.0)
    if method == "arccos":
        return np.arccos(cc)
    if method == "arcsin":
        return math.pi / 2 - np.arcsin(cc)
    n_el = int(np.prod(c.shape)) * q.shape[-1]
    _guard(n_el, max_elements, "spectral_angle(method='atan2') pairwise differences",
           "method='arccos', or linear_angular_attention / angular_attention_features")
    qh = unit_rows(q, eps=eps, policy=policy)
    kh = unit_rows(k, eps=eps, policy=policy)
    diff = qh[..., :, None, :] - kh[..., None, :, :]
    summ = qh[..., :, None, :] + kh[..., None, :, :]
    with np.errstate(invalid="ignore"):
        theta = 2.0 * np.arctan2(np.sqrt(np.sum(diff * diff, axis=-1)), np.sqrt(np.sum(summ * summ, axis=-1)))
    unit = _row_is_unit(q, eps, policy)[..., :, None] & _row_is_unit(k, eps, policy)[..., None, :]
    return np.where(unit, theta, np.arccos(cc))


def angular_similarity(q: Any, k: Any, *, method: str = "atan2", eps: float = config.CASTLING_QK_NORM_EPS,
                       policy: str = "clamp", max_elements: int | None = None) -> np.ndarray:
    """The angular kernel Sim(q_i, k_j) = 1 - theta(q_i, k_j) / pi in [0, 1] (Castling-ViT Eq. 5).

    Equals 1/2 + arcsin(q^.k^)/pi (Eq. 8, first line).  Arguments as :func:`spectral_angle`.

    Returns
    -------
    (..., N, M) working dtype.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    theta = spectral_angle(q, k, method=method, eps=eps, policy=policy, max_elements=max_elements)
    return 1.0 - theta / math.pi


def angular_similarity_series(q: Any, k: Any, order: int, *, eps: float = config.CASTLING_QK_NORM_EPS,
                              policy: str = "clamp", max_elements: int | None = None) -> np.ndarray:
    """The order-K truncated angular kernel Sim_K = 1/2 + T_K(q^.k^)/pi (Castling-ViT Eq. 8).

    Order 0 is the "linear-angular term" 1/2 + (q^.k^)/pi; |Sim - Sim_K| <= arcsin_tail_bound(q^.k^, K)/pi.
    Sim_K > 0 for every finite K and |q^.k^| <= 1 (|T_K(x)| <= T_K(1) < pi/2), so its row sums never vanish.

    Parameters
    ----------
    q : (..., N, d); k : (..., M, d); order : int >= 0; eps, policy : as :func:`unit_rows`.
    max_elements : limit on the (..., N, M) output.

    Returns
    -------
    (..., N, M) working dtype.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    c = cosine_matrix(q, k, eps=eps, policy=policy, max_elements=max_elements)
    return 0.5 + arcsin_series(c, order) / math.pi


# ===================================================================================================
# 3. Feature maps
# ===================================================================================================

def tensor_power(x: Any, p: int) -> np.ndarray:
    """The p-fold tensor power x^{(x)p}, flattened in row-major order: (..., d) -> (..., d^p).

    <x^{(x)p}, y^{(x)p}> = sum_{i1..ip} prod_l x_il y_il = (x . y)^p exactly (in exact arithmetic), so the
    odd powers (q^.k^)^(2k+1) of Eq. 8 are inner products of explicit features and each order of the
    angular series is a linear-attention term (cost O(N d^(2k+1)) instead of O(N^2 d)).

    Parameters
    ----------
    x : (..., d) float.  p : int >= 1.

    Returns
    -------
    (..., d**p) working dtype.

    References
    ----------
    Castling-ViT Eq. 8; the polynomial-kernel feature map (e.g. Scholkopf & Smola, Learning with Kernels,
    Prop. 2.1).
    """
    p = numerics.check_positive_int(p, "p")
    x = numerics.as_float(x, "x")
    out = x
    for _ in range(p - 1):
        out = (out[..., :, None] * x[..., None, :]).reshape(*x.shape[:-1], -1)
    return out


def _feature_dim(d: int, order: int, constant: bool) -> int:
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


def angular_series_features(x: Any, order: int, *, constant: bool = True,
                            eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> np.ndarray:
    """Phi_K(x) = [sqrt(1/2), sqrt(c_0/pi) x^, sqrt(c_1/pi) x^{(x)3}, ..., sqrt(c_K/pi) x^{(x)(2K+1)}].

    <Phi_K(q), Phi_K(k)> = 1/2 + sum_{k<=K} (c_k/pi)(q^.k^)^(2k+1) = Sim_K(q, k) (Eq. 8 truncated), all
    coefficients being positive so the square roots are real.  ``constant=False`` drops the sqrt(1/2).

    Parameters
    ----------
    x : (..., d) float; order : K >= 0; constant : bool; eps, policy : as :func:`unit_rows`.

    Returns
    -------
    (..., D) working dtype, D = [constant] + d + d^3 + ... + d^(2K+1).

    Under a backend other than NumPy (:func:`refimpl.backends.use`) this runs as operation
    "angular_series_features" (the Numba kernel, within the error model of this definition).

    References
    ----------
    Castling-ViT Eq. 8.
    """
    validation.check_eps(eps)
    order = _check_order(order)
    x = numerics.as_float(x, "x")
    if (backends.current() != "numpy" and x.dtype in (np.float32, np.float64) and policy in ("clamp", "none")
            and isinstance(eps, (int, float, np.integer, np.floating)) and not isinstance(eps, (bool, np.bool_))):
        # Operation "angular_series_features" (the Numba kernel); its NumPy twin calls the body below, so
        # the default backend's result is unchanged and nothing recurses.
        return backends.get("angular_series_features", dtype=x.dtype)(x, order, constant=constant, eps=eps,
                                                                        policy=policy)
    return _angular_series_features_numpy(x, order, constant=constant, eps=eps, policy=policy)


def _angular_series_features_numpy(x: Any, order: int, *, constant: bool = True,
                                   eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> np.ndarray:
    """The NumPy body of :func:`angular_series_features` (the definition; what operation
    "angular_series_features" of refimpl.backends specifies)."""
    order = _check_order(order)
    x = numerics.as_float(x, "x")
    dim = _feature_dim(x.shape[-1], order, constant)
    n_el = int(np.prod(x.shape[:-1])) * dim
    if n_el > config.CASTLING_MAX_FEATURE_ELEMENTS:
        raise ArgumentError(f"angular_series_features: {n_el} elements exceed config.CASTLING_MAX_FEATURE_ELEMENTS="
                         f"{config.CASTLING_MAX_FEATURE_ELEMENTS} (d = {x.shape[-1]}, order = {order}); lower the "
                         f"order, or use angular_attention (quadratic in N) for small N")
    xh = unit_rows(x, eps=eps, policy=policy)
    c = arcsin_coefficients(order)
    parts = [np.full((*x.shape[:-1], 1), math.sqrt(0.5), dtype=xh.dtype)] if constant else []
    power = xh
    for kk in range(order + 1):
        if kk:
            power = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).reshape(
                *xh.shape[:-1], -1)
        parts.append(np.sqrt(c[kk] / math.pi) * power)
    return np.concatenate(parts, axis=-1)


def hyperplane_features(x: Any, directions: Any) -> np.ndarray:
    """Sign features realising the implicit angular feature map phi of Eq. 6-7 (Charikar's SimHash).

    psi(x) = [1/sqrt 2, s_1(x)/sqrt(2m), ..., s_m(x)/sqrt(2m)], s_l(x) = +1 if w_l . x >= 0 else -1.

    <psi(x), psi(y)> = 1/2 + (1/2m) sum_l s_l(x) s_l(y) = 1 - (#separating hyperplanes)/m, and
    ||psi(x) - psi(y)||^2 = 2 (#separating)/m.  For w ~ N(0, I), P[w separates x and y] = theta/pi
    (Goemans & Williamson 1995, Lemma 3.2), so E <psi(x), psi(y)> = 1 - theta/pi = Sim (Eq. 5) and
    E ||psi(x) - psi(y)||^2 = 2 theta/pi (Eq. 7); ||psi(x)||^2 = 1 exactly (Eq. 6).

    Parameters
    ----------
    x : (..., d) float.  directions : (m, d) float, the hyperplane normals w_l.

    Returns
    -------
    (..., m + 1) working dtype.
    """
    x = numerics.as_float(x, "x")
    w = numerics.as_float(directions, "directions")
    numerics.check_shapes(directions=(w, "m d"), sizes=None)
    if w.shape[1] != x.shape[-1]:
        raise ArgumentError(f"argument 'directions': expected shape (m, {x.shape[-1]}), got {w.shape}")
    m = w.shape[0]
    s = np.where(x @ w.T >= 0, 1.0, -1.0).astype(x.dtype)
    head = np.full((*x.shape[:-1], 1), math.sqrt(0.5), dtype=x.dtype)
    return np.concatenate([head, s / math.sqrt(2.0 * m)], axis=-1)


def exponential_kernel(x: Any, y: Any, sigma: float = 1.0) -> np.ndarray:
    """exp(<x_i, y_j> / sigma^2), the left side of Castling-ViT Eq. 2.  x : (..., N, d), y : (..., M, d)
    -> (..., N, M)."""
    validation.check_positive(sigma, "sigma")
    x = numerics.as_float(x, "x")
    y = numerics.as_float(y, "y")
    _check_pair(x, y, ("x", "y"))
    return np.exp((x @ np.swapaxes(y, -1, -2)) / (sigma * sigma))


def gaussian_rbf_kernel(x: Any, y: Any, sigma: float = 1.0) -> np.ndarray:
    """exp(-||x_i - y_j||^2 / (2 sigma^2)), the Gaussian RBF kernel of Castling-ViT Eq. 2, with the
    squared distance summed from explicit differences (no cancellation).  x : (..., N, d), y : (..., M, d)
    -> (..., N, M)."""
    validation.check_positive(sigma, "sigma")
    x = numerics.as_float(x, "x")
    y = numerics.as_float(y, "y")
    _check_pair(x, y, ("x", "y"))
    diff = x[..., :, None, :] - y[..., None, :, :]
    return np.exp(-np.sum(diff * diff, axis=-1) / (2.0 * sigma * sigma))


# ===================================================================================================
# 4. Attention
# ===================================================================================================

def _nan_quiet(fn):
    """Run ``fn`` under np.errstate(invalid/divide="ignore"): the official preset's eps-free norms produce
    NaN/inf by design (0/0 for zero rows), and NaN propagating through later products is the honest result,
    not a condition to warn about.  Nothing is replaced or masked."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)
    return wrapper


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    return q, k, v, sz


def _tap(taps: dict | None, name: str, value: np.ndarray) -> None:
    if taps is not None:
        taps[name] = value


def angular_attention(q: Any, k: Any, v: Any, *, order: int | None = None, normalize: bool = False,
                      method: str = "atan2", eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                      max_elements: int | None = None, taps: dict | None = None) -> np.ndarray:
    """Full (quadratic) angular attention: O = A V or O = (A V) / (A 1), A_ij = Sim(q_i, k_j).

    With ``order=None`` A is the exact angular kernel of Eq. 5 (:func:`angular_similarity`); with an integer
    order K it is the truncated series Sim_K of Eq. 8.  ``normalize=True`` divides by the similarity sum
    sum_j A_ij (Eq. 3's normaliser with Sim in place of phi phi^T); Sim >= 0 and Sim_K > 0 make it positive
    unless every key is exactly opposite to the query (exact kernel only).  Eq. 9 itself has no normaliser.

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float.
    order : None or int >= 0.  normalize : bool.  method, eps, policy : as :func:`spectral_angle`.
    max_elements : limit on B h N M (times d for "atan2"); above it use :func:`angular_attention_features`
        or :func:`linear_angular_attention`.
    taps : optional dict, receives "q_hat", "k_hat", "similarity" (B,h,N,M), "denominator" (B,h,N).

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 5, 8, 9 (H = Sim(Q, K) V).
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    pairs = sz["B"] * sz["h"] * sz["N"] * sz["M"]
    _guard(pairs * (sz["d"] if (order is None and method == "atan2") else 1), max_elements,
           "angular_attention", "angular_attention_features (order K, linear in N) or linear_angular_attention")
    if order is None:
        a = angular_similarity(q, k, method=method, eps=eps, policy=policy, max_elements=max_elements)
    else:
        a = angular_similarity_series(q, k, order, eps=eps, policy=policy, max_elements=max_elements)
    if taps is not None:
        taps["q_hat"] = unit_rows(q, eps=eps, policy=policy)
        taps["k_hat"] = unit_rows(k, eps=eps, policy=policy)
        taps["similarity"] = a
    out = a @ v
    if normalize:
        den = np.sum(a, axis=-1)
        _tap(taps, "denominator", den)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = out / den[..., None]
    return out


def angular_attention_features(q: Any, k: Any, v: Any, *, order: int, normalize: bool = False,
                               eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                               taps: dict | None = None) -> np.ndarray:
    """The order-K truncated angular attention in linear time through tensor-power features.

    O_i = Phi_K(q_i) (sum_j Phi_K(k_j)^T v_j) [/ Phi_K(q_i) . sum_j Phi_K(k_j)], Phi_K from
    :func:`angular_series_features`; equal to ``angular_attention(q, k, v, order=K)`` by associativity
    (O(N D e) with D = 1 + d + ... + d^(2K+1) instead of O(N M d)).

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float; order : K >= 0; normalize : bool.
    taps : optional dict, receives "phi_q" (B,h,N,D), "phi_k" (B,h,M,D), "kv" (B,h,D,e), "denominator".

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 8-9; Katharopoulos et al. (2020) Eq. 5 (associativity).
    """
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, _ = _check_qkv(q, k, v)
    phi_q = angular_series_features(q, order, eps=eps, policy=policy)
    phi_k = angular_series_features(k, order, eps=eps, policy=policy)
    kv = np.swapaxes(phi_k, -1, -2) @ v
    if taps is not None:
        taps.update(phi_q=phi_q, phi_k=phi_k, kv=kv)
    out = phi_q @ kv
    if normalize:
        den = np.einsum("bhnf,bhf->bhn", phi_q, np.sum(phi_k, axis=-2))
        _tap(taps, "denominator", den)
        out = out / den[..., None]
    return out


_CONSTANTS = ("sum", "own")
_NORMALIZERS = ("none", "similarity_sum", "output_l2")


def _constant_term(v: np.ndarray, constant: str, n: int) -> np.ndarray:
    if constant == "own":
        if v.shape[-2] != n:
            raise ArgumentError(f"constant='own' needs as many keys as queries (the token's own value), got "
                             f"N = {n} queries and M = {v.shape[-2]} values")
        return 0.5 * v
    return np.broadcast_to(0.5 * np.sum(v, axis=-2, keepdims=True), (*v.shape[:-2], n, v.shape[-1]))


@_nan_quiet
def linear_angular_attention(q: Any, k: Any, v: Any, *, constant: str = "sum", normalizer: str = "none",
                             eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                             arithmetic: str = "scaled", taps: dict | None = None) -> np.ndarray:
    """The linear-angular attention of Castling-ViT Eq. 9 (without its DWConv and sparse branches).

    H = C + (1/pi) Q^ (K^^T V), the order-0 truncation of Sim(Q, K) V (Eq. 8), computed in O(N d e).

    constant="sum" (paper default): C_i = 1/2 sum_j v_j, the constant 1/2 of Eq. 8 applied to every key,
        so that H = Sim_0(Q, K) V exactly (the left side of Eq. 9).
    constant="own" (official): C_i = 1/2 v_i, the token's own value ("1/2 . V" read literally).
    normalizer="none" (paper default, Eq. 9 as printed): H as above.
    normalizer="similarity_sum": H_i / sum_j Sim_0(q_i, k_j), with sum_j Sim_0 = M/2 + (1/pi) q^_i . sum_j k^_j
        >= M (1/2 - 1/pi) > 0 (|q^_i . k^_j| <= 1 with either eps policy), so it never vanishes.
    normalizer="output_l2" (official): H_i / ||H_i||, no eps (a zero H_i gives NaN, as released).

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float.  eps, policy, arithmetic : as
    :func:`unit_rows` (arithmetic also applies to the output_l2 norm).
    taps : optional dict: "q_hat", "k_hat", "kv" (B,h,d,e), "linear" ((1/pi) Q^ kv), "constant",
        "denominator" (similarity_sum, (B,h,N)), "output_norm" (output_l2, (B,h,N,1)).

    Returns
    -------
    (B, h, N, e) working dtype.

    Backends: with policy="clamp", arithmetic="scaled", normalizer "none" or "similarity_sum", a real
    eps >= 0, no taps, one float32/float64 working dtype (and M = N for "own") and a selected backend other
    than NumPy (:func:`refimpl.backends.use`), the computation runs as operation "linear_angular_attention"
    (the fused C kernel; its NumPy twin, refimpl.backends.twins, calls
    :func:`_linear_angular_attention_numpy`, the body of this function).  Everything else, and the default
    NumPy backend, runs that body directly.

    References
    ----------
    Castling-ViT Eq. 8-9; Katharopoulos et al. (2020) for the association order.
    """
    validation.check_eps(eps)
    validation.check_taps(taps)
    if constant not in _CONSTANTS:
        raise ArgumentError(f"argument 'constant': expected one of {_CONSTANTS}, got {constant!r}")
    if normalizer not in _NORMALIZERS:
        raise ArgumentError(f"argument 'normalizer': expected one of {_NORMALIZERS}, got {normalizer!r}")
    if (taps is None and policy == "clamp" and arithmetic == "scaled" and normalizer != "output_l2"
            and backends.current() != "numpy" and isinstance(eps, (int, float, np.integer, np.floating))
            and not isinstance(eps, (bool, np.bool_)) and eps >= 0):
        q, k, v, sz = _check_qkv(q, k, v)
        if (q.dtype == k.dtype == v.dtype and q.dtype in (np.float32, np.float64)
                and (constant == "sum" or sz["M"] == sz["N"])):
            return backends.get("linear_angular_attention", dtype=q.dtype)(q, k, v, constant, normalizer, eps)
    return _linear_angular_attention_numpy(q, k, v, constant=constant, normalizer=normalizer, eps=eps,
                                           policy=policy, arithmetic=arithmetic, taps=taps)


@_nan_quiet
def _linear_angular_attention_numpy(q: Any, k: Any, v: Any, *, constant: str = "sum", normalizer: str = "none",
                                    eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                                    arithmetic: str = "scaled", taps: dict | None = None) -> np.ndarray:
    """The NumPy body of :func:`linear_angular_attention` (same arguments and result; Castling-ViT Eq. 9):
    what that function computes on the NumPy backend, and what the NumPy twin of operation
    "linear_angular_attention" (refimpl.backends.twins) calls, so that the twin never dispatches again."""
    if constant not in _CONSTANTS:
        raise ArgumentError(f"argument 'constant': expected one of {_CONSTANTS}, got {constant!r}")
    if normalizer not in _NORMALIZERS:
        raise ArgumentError(f"argument 'normalizer': expected one of {_NORMALIZERS}, got {normalizer!r}")
    q, k, v, sz = _check_qkv(q, k, v)
    qh = unit_rows(q, eps=eps, policy=policy, arithmetic=arithmetic)
    kh = unit_rows(k, eps=eps, policy=policy, arithmetic=arithmetic)
    kv = np.swapaxes(kh, -1, -2) @ v
    lin = (1.0 / math.pi) * (qh @ kv)
    const = _constant_term(v, constant, sz["N"])
    if taps is not None:
        taps.update(q_hat=qh, k_hat=kh, kv=kv, linear=lin, constant=const)
    out = const + lin
    if normalizer == "similarity_sum":
        den = sz["M"] / 2.0 + (1.0 / math.pi) * np.einsum("bhnd,bhd->bhn", qh, np.sum(kh, axis=-2))
        _tap(taps, "denominator", den)
        out = out / den[..., None]
    elif normalizer == "output_l2":
        norm = np.linalg.norm(out, axis=-1, keepdims=True)
        _tap(taps, "output_norm", norm)
        out = unit_rows(out, eps=0.0, policy="none", arithmetic=arithmetic)
    return out


def token_conv(v: Any, weight: Any, bias: Any = None) -> np.ndarray:
    """The DWConv branch M_DW V of Eq. 9 as released: a depthwise (k, 1) convolution along the flattened
    token axis, heads as channels, the same filter for every column of a head's V, zero padding k//2.

    out[b, c, n, j] = sum_{t=0}^{k-1} w[c, 0, t, 0] v[b, c, n + t - k//2, j]   (+ bias[c])

    i.e. per head a banded Toeplitz N x N matrix M_DW times V, exactly "the matrix form of DWConv" of Eq. 9.

    Parameters
    ----------
    v : (B, h, N, d) float.  weight : (h, 1, k, 1) float, k odd.  bias : (h,) or None.

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Eq. 9 and Sec. 3.2.1 ("a learnable depthwise convolution ... applied on all the value
    tokens"); the released code's ``dconv`` (Conv2d(h, h, (k, 1), padding=(k//2, 0), groups=h, bias=False)).
    """
    v = numerics.as_float(v, "v")
    weight = numerics.as_float(weight, "weight")
    sz = numerics.check_shapes(v=(v, "B h N d"), weight=(weight, "h 1 k 1"))
    if sz["k"] % 2 == 0:
        raise ArgumentError(f"argument 'weight': expected an odd kernel length k (padding k//2 keeps N tokens), "
                         f"got shape {weight.shape}")
    return layers.depthwise_conv2d(v, weight, bias, padding=(sz["k"] // 2, 0))


def _heads_to_image(v: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    b, h, n, d = v.shape
    return v.transpose(0, 1, 3, 2).reshape(b, h * d, hw[0], hw[1])


def _image_to_heads(x: np.ndarray, h: int) -> np.ndarray:
    b, c, hh, ww = x.shape
    return x.reshape(b, h, c // h, hh * ww).transpose(0, 1, 3, 2)


def _check_hw(hw: Any, n: int) -> tuple[int, int]:
    if hw is None:
        raise ArgumentError(f"argument 'hw': expected (H, W) with H * W = N = {n} (the grid of the tokens), got None")
    return validation.check_grid(hw, n, tokens="q")


def grid_conv(v: Any, weight: Any, bias: Any = None, *, hw: tuple[int, int]) -> np.ndarray:
    """Alternative DWConv branch: a k x k depthwise conv of V on the H x W token grid, channel c = head * d + j
    (the channel order of the merged heads), zero padding k//2.  An option, not the released layout.

    Parameters
    ----------
    v : (B, h, N, d) float, N = H W.  weight : (h d, 1, k, k), k odd.  bias : (h d,) or None.
    hw : (H, W).

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Sec. 3.2.1 and Fig. 4 (DWConv on V "attends to nearby tokens").
    """
    v = numerics.as_float(v, "v")
    weight = numerics.as_float(weight, "weight")
    sz = numerics.check_shapes(v=(v, "B h N d"))
    hw = _check_hw(hw, sz["N"])
    numerics.check_shapes(weight=(weight, "C 1 k k"), sizes={"C": sz["h"] * sz["d"]})
    if weight.shape[2] % 2 == 0:
        raise ArgumentError(f"argument 'weight': expected an odd kernel size, got shape {weight.shape}")
    img = _heads_to_image(v, hw)
    out = layers.depthwise_conv2d(img, weight, bias, padding=weight.shape[2] // 2)
    return _image_to_heads(out, sz["h"])


@_nan_quiet
def masked_softmax_branch(q: Any, k: Any, v: Any, *, threshold: float = config.CASTLING_SPARSE_EPS,
                          scale: float = 1.0, max_elements: int | None = None,
                          taps: dict | None = None) -> np.ndarray:
    """The auxiliary sparse branch Mask_eps(Softmax(Q K^T)) V of Castling-ViT Eq. 10.

    P = softmax_j((s q_i) . k_j); Mask_eps(P)_ij = P_ij if P_ij > eps (strictly) else 0; no renormalisation
    (the kept weights of a row sum to at most 1).  The mask is applied as P * [P > eps], so a NaN weight
    propagates (NaN * 0 = NaN), as in the released code's ``mask * attn``.  When every P_ij <= eps the output
    is exactly 0 (a sum of exact zeros), so dropping the branch at inference changes nothing, bit for bit.

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float (paper mode passes q^, k^ and s = 1; the
        official preset passes the raw q, k and s = d^-1/2).
    threshold : eps >= 0 (config.CASTLING_SPARSE_EPS = 0.02).  scale : s.
    taps : optional dict: "sparse_weights" (P), "sparse_mask" (bool), "sparse" (the output).

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 10 and Sec. 3.2.2.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(threshold, "threshold")
    validation.check_real(scale, "scale")
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    _guard(sz["B"] * sz["h"] * sz["N"] * sz["M"], max_elements, "masked_softmax_branch",
           "the inference mode (training=False), which drops the branch")
    p = numerics.softmax((q * scale) @ np.swapaxes(k, -1, -2), axis=-1)
    mask = p > threshold
    out = (p * mask) @ v
    if taps is not None:
        taps.update(sparse_weights=p, sparse_mask=mask, sparse=out)
    return out


# ===================================================================================================
# 4b. The Castling attention module: config, presets, core, block
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class CastlingConfig:
    """Configuration of one Castling-ViT attention layer (Eq. 8-10).  Frozen; build with
    ``CastlingConfig(dim, num_heads, ...)`` or ``CastlingConfig.preset("paper" | "official", dim=..., ...)``.

    Fields
    ------
    dim, num_heads : C and h (C divisible by h; head dim d = C / h).
    qkv_bias : bias of the qkv projection (official default False).
    order : K, the number of arcsin-series orders kept beyond the constant (0 = Eq. 9's linear term).
    constant : "sum" (paper: 1/2 sum_j v_j, the exact expansion of Sim(Q,K) V) | "own" (official: 1/2 v_i).
    normalizer : "none" (paper, Eq. 9 as printed) | "similarity_sum" (divide the angular part by
        sum_j Sim_K(q_i, k_j)) | "output_l2" (official: divide (sparse + constant + linear) by its own L2 norm,
        no eps, then add the conv branch).
    qk_norm : "clamp" (paper: q / max(||q||, eps)) | "none" (official: q / ||q||).  qk_norm_eps : eps.
    norm_arithmetic : "scaled" (paper: overflow/underflow-free norms) | "naive" (official: sqrt(sum x^2) as
        torch's ``.norm()`` computes it, for q, k and the output l2; see :func:`unit_rows`).
    conv : "tokens1d" ((k, 1) conv along tokens, heads as channels; default and official) | "grid2d"
        (k x k depthwise conv on the H x W grid, channels h d) | "none".
    conv_kernel : k (odd).  conv_bias : bool (official False).
    sparse : "train_only" (paper: the auxiliary branch is used in training and dropped at inference) |
        "always" (official with sparse_reg=True) | "off" (official default sparse_reg=False).
    sparse_eps : the threshold of Eq. 10.
    sparse_logits : "unit" (paper: softmax(q^ k^^T), Q and K being the normalised ones of Eq. 8-10) |
        "scaled_raw" (official: softmax(d^-1/2 q k^T) of the raw projections).

    Placement of the branches: with "none"/"similarity_sum", H = angular + conv + sparse (the sparse branch
    is added last, so dropping an all-zero branch is exact); with "output_l2", H = l2(sparse + constant +
    linear) + conv (the released order).
    """

    dim: int
    num_heads: int
    qkv_bias: bool = False
    order: int = 0
    constant: str = "sum"
    normalizer: str = "none"
    qk_norm: str = "clamp"
    qk_norm_eps: float = config.CASTLING_QK_NORM_EPS
    norm_arithmetic: str = "scaled"
    conv: str = "tokens1d"
    conv_kernel: int = config.CASTLING_CONV_KERNEL
    conv_bias: bool = False
    sparse: str = "train_only"
    sparse_eps: float = config.CASTLING_SPARSE_EPS
    sparse_logits: str = "unit"

    def __post_init__(self) -> None:
        numerics.check_positive_int(self.dim, "dim")
        numerics.check_positive_int(self.num_heads, "num_heads")
        if self.dim % self.num_heads:
            raise ArgumentError(f"argument 'dim': expected a multiple of num_heads={self.num_heads}, got {self.dim}")
        _check_order(self.order)
        choices = {"constant": _CONSTANTS, "normalizer": _NORMALIZERS, "qk_norm": _POLICIES,
                   "norm_arithmetic": ("scaled", "naive"),
                   "conv": ("tokens1d", "grid2d", "none"), "sparse": ("train_only", "always", "off"),
                   "sparse_logits": ("unit", "scaled_raw")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ArgumentError(f"argument '{name}': expected one of {allowed}, got {getattr(self, name)!r}")
        k = numerics.check_positive_int(self.conv_kernel, "conv_kernel")
        if k % 2 == 0:
            raise ArgumentError(f"argument 'conv_kernel': expected an odd size (padding k//2 keeps N), got {k}")
        validation.check_eps(self.qk_norm_eps, "qk_norm_eps")
        validation.check_eps(self.sparse_eps, "sparse_eps")
        if self.normalizer == "output_l2" and self.order != 0:
            raise ArgumentError("normalizer='output_l2' (the official preset) is defined for order 0 only")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "CastlingConfig":
        """"paper" (the defaults: Eq. 8-10 as written) or "official" (the released code), then overrides."""
        presets = {
            "paper": {},
            "official": dict(qkv_bias=False, order=0, constant="own", normalizer="output_l2", qk_norm="none",
                             norm_arithmetic="naive",
                             conv="tokens1d", conv_kernel=config.CASTLING_CONV_KERNEL, conv_bias=False,
                             sparse="off", sparse_eps=config.CASTLING_SPARSE_EPS, sparse_logits="scaled_raw"),
        }
        if name not in presets:
            raise ArgumentError(f"argument 'name': expected 'paper' or 'official', got {name!r}")
        return cls(**{**presets[name], **overrides})

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The parameter keys (the PyTorch twin's state_dict keys) and their shapes."""
        c, h, k = self.dim, self.num_heads, self.conv_kernel
        shapes: dict[str, tuple[int, ...]] = {"qkv.weight": (3 * c, c)}
        if self.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
        shapes.update({"proj.weight": (c, c), "proj.bias": (c,)})
        if self.conv == "tokens1d":
            shapes["dconv.weight"] = (h, 1, k, 1)
            if self.conv_bias:
                shapes["dconv.bias"] = (h,)
        elif self.conv == "grid2d":
            shapes["dconv.weight"] = (c, 1, k, k)
            if self.conv_bias:
                shapes["dconv.bias"] = (c,)
        return shapes

    def sparse_active(self, training: bool) -> bool:
        """Whether the auxiliary branch of Eq. 10 is computed (the training/inference switch, Sec. 3.2.2)."""
        return self.sparse == "always" or (self.sparse == "train_only" and bool(training))


def init_castling_params(cfg: CastlingConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Random float64 parameters keyed like the twin's state_dict: weights N(0, 1/fan_in), biases N(0, 0.01^2)."""
    validation.check_config(cfg, CastlingConfig)
    rng = np.random.default_rng(validation.check_seed(rng, "rng", allow_generator=True))
    out = {}
    for key, shape in cfg.param_shapes().items():
        if key.endswith("bias"):
            out[key] = 0.01 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[key] = rng.standard_normal(shape) / math.sqrt(fan_in)
    return out


def _series_part(qh: np.ndarray, kh: np.ndarray, v: np.ndarray, order: int,
                 taps: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sum_{k<=K} (c_k/pi) (Q^K^^T)^(2k+1) V and the features (without the constant) for the normaliser."""
    if order == 0:
        kv = np.swapaxes(kh, -1, -2) @ v
        lin = (1.0 / math.pi) * (qh @ kv)
        fq, fk = qh, kh
        _tap(taps, "kv", kv)
        return lin, fq, fk
    fq = _features_no_norm(qh, order)
    fk = _features_no_norm(kh, order)
    kv = np.swapaxes(fk, -1, -2) @ v
    if taps is not None:
        taps.update(phi_q=fq, phi_k=fk, kv=kv)
    return fq @ kv, fq, fk


def _features_no_norm(xh: np.ndarray, order: int) -> np.ndarray:
    """[sqrt(c_k/pi) xh^{(x)(2k+1)}]_k on already normalised rows (no constant component)."""
    dim = _feature_dim(xh.shape[-1], order, False)
    if int(np.prod(xh.shape[:-1])) * dim > config.CASTLING_MAX_FEATURE_ELEMENTS:
        raise ArgumentError(f"order {order} with d = {xh.shape[-1]}: {dim} features per token exceed "
                         f"config.CASTLING_MAX_FEATURE_ELEMENTS; lower the order")
    c = arcsin_coefficients(order)
    parts, power = [], xh
    for kk in range(order + 1):
        if kk:
            power = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).reshape(
                *xh.shape[:-1], -1)
        parts.append(np.sqrt(c[kk] / math.pi) * power)
    return np.concatenate(parts, axis=-1)


@_nan_quiet
def _check_self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sz: dict, where: str) -> None:
    if sz["N"] != sz["M"] or sz["e"] != sz["d"]:
        raise ArgumentError(f"{where}: arguments 'q', 'k', 'v': self-attention expects one shape (B, h, N, d), got "
                            f"{q.shape}, {k.shape}, {v.shape}")


def _check_conv_weight(conv_weight: Any, cfg: CastlingConfig, sz: dict) -> None:
    """conv_weight checked where the caller passed it (its type and the shape of cfg.conv), not inside the conv."""
    if cfg.conv == "none":
        return
    if conv_weight is None:
        raise ArgumentError(f"argument 'conv_weight': required for conv={cfg.conv!r}")
    w = numerics.as_float(conv_weight, "conv_weight")
    if cfg.conv == "tokens1d":
        numerics.check_shapes(conv_weight=(w, "h 1 k 1"), sizes={"h": sz["h"]})
    else:
        numerics.check_shapes(conv_weight=(w, "C 1 k k"), sizes={"C": sz["h"] * sz["d"]})


def castling_core(q: Any, k: Any, v: Any, cfg: CastlingConfig, *, conv_weight: Any = None,
                  conv_bias: Any = None, training: bool = False, hw: tuple[int, int] | None = None,
                  taps: dict | None = None) -> np.ndarray:
    """The Castling-ViT attention of Eq. 9-10 on per-head q, k, v (no projections).

    Paper preset (defaults), per head:  H = C + S_K + M_DW V [+ Mask_eps(Softmax(Q^K^^T)) V in training],
        C = 1/2 sum_j v_j, S_K = sum_{k<=K} (c_k/pi) (Q^K^^T)^(2k+1) V (K = 0: (1/pi) Q^(K^^T V)),
        optionally divided by the similarity sum (normalizer="similarity_sum").
    Official preset:  H = l2(Mask_eps(Softmax(d^-1/2 Q K^T)) V + 1/2 V + (1/pi) Q^(K^^T V)) + conv(V), the
        sparse term only when cfg.sparse == "always".

    Parameters
    ----------
    q, k, v : (B, h, N, d) float (self-attention: M = N).
    cfg : :class:`CastlingConfig` (num_heads = h, head_dim = d).
    conv_weight : (h, 1, k, 1) for conv "tokens1d", (h d, 1, k, k) for "grid2d", ignored for "none".
    conv_bias : (h,) / (h d,) or None.  training : the train/inference switch of the auxiliary branch.
    hw : (H, W) with H W = N, required for conv "grid2d".
    taps : optional dict: "q_hat", "k_hat", "kv", "linear" (the series part S_K), "constant",
        "denominator" (similarity_sum), "angular" (the attention before conv/sparse or the l2 argument),
        "output_norm" (output_l2), "dwc", and with the sparse branch "sparse_weights", "sparse_mask",
        "sparse"; with order > 0 also "phi_q", "phi_k".

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Eq. 8, 9, 10; Sec. 3.2.2 (castling at inference).
    """
    validation.check_config(cfg, CastlingConfig)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    _check_self_attention(q, k, v, sz, "castling_core")
    if sz["h"] != cfg.num_heads or sz["d"] != cfg.head_dim:
        raise ArgumentError(f"castling_core: q has h = {sz['h']}, d = {sz['d']}; cfg expects h = {cfg.num_heads}, "
                         f"d = {cfg.head_dim}")
    _check_conv_weight(conv_weight, cfg, sz)
    qh = unit_rows(q, eps=cfg.qk_norm_eps, policy=cfg.qk_norm, arithmetic=cfg.norm_arithmetic)
    kh = unit_rows(k, eps=cfg.qk_norm_eps, policy=cfg.qk_norm, arithmetic=cfg.norm_arithmetic)
    _tap(taps, "q_hat", qh)
    _tap(taps, "k_hat", kh)
    series, fq, fk = _series_part(qh, kh, v, cfg.order, taps)
    const = _constant_term(v, cfg.constant, sz["N"])
    if taps is not None:
        taps.update(linear=series, constant=const)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            sparse = masked_softmax_branch(qh, kh, v, threshold=cfg.sparse_eps, scale=1.0, taps=taps)
        else:
            sparse = masked_softmax_branch(q, k, v, threshold=cfg.sparse_eps, scale=cfg.head_dim ** -0.5,
                                           taps=taps)
    if cfg.normalizer == "output_l2":
        ang = const + series if sparse is None else (sparse + const) + series
        _tap(taps, "angular", ang)
        _tap(taps, "output_norm", np.linalg.norm(ang, axis=-1, keepdims=True))
        out = unit_rows(ang, eps=0.0, policy="none", arithmetic=cfg.norm_arithmetic)
    else:
        out = const + series
        if cfg.normalizer == "similarity_sum":
            den = sz["M"] / 2.0 + _dot_sum(fq, fk, cfg.order)
            _tap(taps, "denominator", den)
            out = out / den[..., None]
        _tap(taps, "angular", out)
    if cfg.conv != "none":
        if conv_weight is None:
            raise ArgumentError(f"argument 'conv_weight': required for conv={cfg.conv!r}")
        dwc = token_conv(v, conv_weight, conv_bias) if cfg.conv == "tokens1d" else \
            grid_conv(v, conv_weight, conv_bias, hw=hw)
        _tap(taps, "dwc", dwc)
        out = out + dwc
    if sparse is not None and cfg.normalizer != "output_l2":
        out = out + sparse
    return out


def _dot_sum(fq: np.ndarray, fk: np.ndarray, order: int) -> np.ndarray:
    """sum_j of the series part of Sim_K(q_i, k_j) = F(q_i) . sum_j F(k_j) ((1/pi) q^ . sum k^ at order 0)."""
    s = np.einsum("bhnf,bhf->bhn", fq, np.sum(fk, axis=-2))
    return (1.0 / math.pi) * s if order == 0 else s


def _split_heads(qkv: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, n, c3 = qkv.shape
    t = qkv.reshape(b, n, 3, h, c3 // (3 * h)).transpose(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


@_nan_quiet
def castling_attention(x: Any, params: Mapping[str, Any], cfg: CastlingConfig, *, training: bool = False,
                       hw: tuple[int, int] | None = None, taps: dict | None = None) -> np.ndarray:
    """One Castling-ViT attention layer: qkv projection, :func:`castling_core`, merge heads, output projection.

    qkv = x W_qkv^T (+ b) split as (B, N, 3, h, d) -> q, k, v (B, h, N, d) (the released layout);
    out = merge(castling_core(q, k, v)) W_proj^T + b_proj.

    Parameters
    ----------
    x : (B, N, C) float.
    params : {"qkv.weight": (3C, C), ["qkv.bias": (3C,)], "proj.weight": (C, C), "proj.bias": (C,),
        "dconv.weight": (h, 1, k, 1) or (C, 1, k, k), ["dconv.bias"]} (keys of :meth:`CastlingConfig.param_shapes`).
    cfg : :class:`CastlingConfig`.  training : the auxiliary-branch switch.  hw : (H, W) for conv "grid2d".
    taps : optional dict: "q", "k", "v" and every tap of :func:`castling_core`, plus "heads" (B, N, C).

    Returns
    -------
    (B, N, C) working dtype.

    References
    ----------
    Castling-ViT Eq. 1 (heads, projections), Eq. 9-10.
    """
    validation.check_config(cfg, CastlingConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg)
    validation.check_taps(taps)
    qkv = layers.linear(x, params["qkv.weight"], params.get("qkv.bias"))
    q, k, v = _split_heads(qkv, cfg.num_heads)
    if taps is not None:
        taps.update(q=q, k=k, v=v)
    heads = castling_core(q, k, v, cfg, conv_weight=params.get("dconv.weight"),
                          conv_bias=params.get("dconv.bias"), training=training, hw=hw, taps=taps)
    merged = heads.transpose(0, 2, 1, 3).reshape(x.shape)
    _tap(taps, "heads", merged)
    return layers.linear(merged, params["proj.weight"], params["proj.bias"])


def _check_params(params: Mapping[str, Any], cfg: CastlingConfig) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against ``cfg.param_shapes()``."""
    validation.check_params(params, cfg.param_shapes(), where="castling_attention")


# ===================================================================================================
# 5. Error bounds (first-order running error analysis; docs/design.md "The verdict")
# ===================================================================================================
#
# Every helper below returns, next to the reference value, an error coefficient E >= 0 with
#     |fl_T(value) - value| <= u_T E        (to first order in u_T),
# built stage by stage: each stage's own rounding (gamma_n on the stage run on absolute values) plus the
# earlier errors propagated through the stage's first-order sensitivity (on absolute values), and a depth
# counter K (the sum of the stages' own k along the longest path).  The returned Bound is
# Bound(scale = E / K, k = K): gamma_K(u) E / K >= u E, so its first-order content is exactly u E; products
# of two error terms (O(u^2)) are neglected.  Rigorous otherwise (gamma_n bounds hold for any summation order,
# Higham Lemma 3.1 and eq. 3.5) except where a note says "assumed" (library exp/atan2/arccos accuracy,
# config.ELEMENTARY_FUNCTION_ULPS).

_ELEM = config.ELEMENTARY_FUNCTION_ULPS


def _e_matmul(a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray, eta_u: float = 0.0,
              dtype: Any = None) -> np.ndarray:
    """E(AB) = E(A)|B| + |A|E(B) + n |A||B| + n eta/u (Higham 3.5 with gradual underflow, eq. 2.8); the n of the
    rounding term counted by numerics.sum_depth for a mixed-precision ``dtype``."""
    n = a.shape[-1]
    aa, ab = np.abs(a), np.abs(b)
    return ea @ ab + aa @ eb + numerics.sum_depth(n, dtype) * (aa @ ab) + n * eta_u


def _e_normalize(x: np.ndarray, ex: np.ndarray, eps: float, policy: str, arithmetic: str = "scaled",
                 eta_u: float = 0.0, dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """x^ = x / D, D = max(||x||, eps) or ||x||: |dD| <= ||dx||_2 + (d/2 + 1) u ||x|| (sum of squares gamma_d,
    halved by the sqrt, plus its rounding) + d eta / (2 ||x||) (each square may underflow by eta, and the
    tested code may square without scaling), and the quotient rounds once, so
    E(x^) = E(x)/D + |x^| (||E(x)||_2 / D + d/2 + 2 + [||x|| >= eps] d eta/u / (2 ||x||^2))."""
    xh = unit_rows(x, eps=eps, policy=policy, arithmetic=arithmetic)
    d = x.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        nrm = _scaled_norm(x)  # the exact norm (never underflows), not the tested code's
        den = np.maximum(nrm, eps) if policy == "clamp" else nrm
        under = np.where((nrm >= eps) & (d > 1), d * eta_u / (2.0 * nrm * nrm), 0.0)
        e = ex / den + np.abs(xh) * (_scaled_norm(ex) / den + numerics.sum_depth(d, dtype) / 2.0 + 2.0 + under)
    return xh, e


def _scaled_norm(x: np.ndarray) -> np.ndarray:
    """||x||_2 over the last axis as m ||x/m|| (m = max|x|), free of underflow for subnormal rows."""
    m = np.max(np.abs(x), axis=-1, keepdims=True)
    safe = np.where(m > 0, m, 1.0)
    return m * np.sqrt(np.sum((x / safe) ** 2, axis=-1, keepdims=True))


def _e_softmax_masked(logits: np.ndarray, el: np.ndarray, threshold: float, u: float,
                      tested_threshold_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax by max-subtraction and the mask P * [P > eps].

    dP_ij = P_ij (dL_ij - sum_l P_il dL_il) to first order; the rounding of L - max (u |L - max|, an absolute
    error of the exponent), exp (ELEM u relative), the sum of M positive terms (gamma_M) and the quotient (u):
        E(P_ij) = P_ij ((1 - 2 P_ij)(E(L_ij) + |L_ij - m_i|) + sum_l P_il (E(L_il) + |L_il - m_i|) + 2 ELEM + M + 1)
    (|P_ij ((1 - P_ij) x_j - sum_{l != j} P_il x_l)| <= P_ij ((1 - 2 P_ij)|x_j| + sum_l P_il |x_l|)).
    The mask is discontinuous: where |P_ij - eps| <= u E(P_ij) + |eps - fl_T(eps)| the tested code may decide
    either way, so the whole weight P_ij is admitted as error (returned as ``amb``, a 0/1 array)."""
    m = np.max(logits, axis=-1, keepdims=True)
    p = numerics.softmax(logits, axis=-1)
    shift = np.abs(logits - m)
    width = logits.shape[-1]
    # The Jacobian p_ij (delta_jl - p_il) taken exactly: (1 - 2 p) x + sum_l p x >= (1 - p) x >= 0.
    e = p * ((1 - 2 * p) * el + np.sum(p * el, axis=-1, keepdims=True) + (1 - 2 * p) * shift
             + np.sum(p * shift, axis=-1, keepdims=True) + 2 * _ELEM + width + 1)
    amb = np.abs(p - threshold) <= u * e + tested_threshold_gap
    return p, e, amb


def _rounded_gap(value: float, dtype: Any) -> float:
    return abs(value - float(numerics.round_to(np.array(value), dtype)))


def angular_similarity_bound(q: Any, k: Any, *, dtype: Any, order: int | None = None,
                             method: str = "atan2", eps: float = config.CASTLING_QK_NORM_EPS,
                             policy: str = "clamp", err_q: Any = None, err_k: Any = None
                             ) -> tuple[np.ndarray, np.ndarray]:
    """Reference similarity matrix and its error coefficient E (|err| <= u_T E, first order).

    c = q^ . k^: E(c) = E(q^)|k^| + |q^|E(k^) + d |q^||k^|.
    Truncated kernel (order K): Sim_K = 1/2 + T_K(c)/pi:
        E = (T_K'(|c|) E(c) + (3K+2) T_K(|c|)) / pi + 2 |T_K(c)|/pi + |Sim_K|   (Horner, 1/pi, the add).
    Exact kernel, "atan2" rows: a = ||q^ - k^||, b = ||q^ + k^||, E(a) <= ||E(q^)||_2 + ||E(k^)||_2 +
        (d/2 + 2) a (likewise b); theta = 2 atan2(a, b): |dtheta| <= 2 (b da + a db)/(a^2 + b^2) + ELEM theta
        (atan2 assumed within ELEM u of its result).
    "arccos"/"arcsin" (and rows below eps): E(theta) = min(E(c)/sqrt(1 - c^2), pi sqrt(E(c)/(2u))) + ELEM
        theta, in units of u: the derivative bound, or the Hoelder bound pi sqrt(u E(c)/2) of
        :func:`spectral_angle` divided by u (finite at |c| = 1; it makes the bound dtype-dependent).
    Sim = 1 - theta/pi: E(Sim) = E(theta)/pi + 2 theta/pi + Sim.

    Parameters
    ----------
    q : (..., N, d); k : (..., M, d) float (T-rounded values).  dtype : the tested precision T.
    order, method, eps, policy : as :func:`angular_similarity` / :func:`angular_similarity_series`.
    err_q, err_k : error coefficients of q and k (same shapes) or None (exact inputs).

    Returns
    -------
    (Sim, E) float64 arrays (..., N, M).
    """
    validation.check_eps(eps)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    _check_pair(q, k)
    u = numerics.unit_roundoff(dtype)
    eq = np.zeros_like(q) if err_q is None else numerics.as_float(err_q, "err_q")
    ek = np.zeros_like(k) if err_k is None else numerics.as_float(err_k, "err_k")
    qh, eqh = _e_normalize(q, eq, eps, policy)
    kh, ekh = _e_normalize(k, ek, eps, policy)
    kt, ekt = np.swapaxes(kh, -1, -2), np.swapaxes(ekh, -1, -2)
    c = qh @ kt
    ec = _e_matmul(qh, eqh, kt, ekt)
    if order is not None:
        t = arcsin_series(c, order)
        sim = 0.5 + t / math.pi
        e = (arcsin_series_derivative(np.abs(c), order) * ec + (3 * order + 2) * np.abs(t)) / math.pi \
            + 2 * np.abs(t) / math.pi + np.abs(sim)
        return sim, e
    theta = spectral_angle(q, k, method=method, eps=eps, policy=policy)
    with np.errstate(divide="ignore", invalid="ignore"):
        cc = np.clip(c, -1.0, 1.0)
        e_acos = np.minimum(ec / np.sqrt((1.0 - cc) * (1.0 + cc)), math.pi * np.sqrt(ec / (2.0 * u)))
        e_acos = np.where(ec == 0, 0.0, e_acos) + _ELEM * theta
        if method == "atan2":
            d = q.shape[-1]
            diff = qh[..., :, None, :] - kh[..., None, :, :]
            summ = qh[..., :, None, :] + kh[..., None, :, :]
            a = np.sqrt(np.sum(diff * diff, axis=-1))
            b = np.sqrt(np.sum(summ * summ, axis=-1))
            en_q = np.linalg.norm(eqh, axis=-1)[..., :, None]
            en_k = np.linalg.norm(ekh, axis=-1)[..., None, :]
            ea = en_q + en_k + (d / 2.0 + 2.0) * a
            eb = en_q + en_k + (d / 2.0 + 2.0) * b
            e_at = 2.0 * (b * ea + a * eb) / (a * a + b * b) + _ELEM * theta
            unit = _row_is_unit(q, eps, policy)[..., :, None] & _row_is_unit(k, eps, policy)[..., None, :]
            e_theta = np.where(unit, e_at, e_acos)
        else:
            e_theta = e_acos
    sim = 1.0 - theta / math.pi
    e = e_theta / math.pi + 2.0 * theta / math.pi + np.abs(sim)
    return sim, e


def angular_attention_bound(q: Any, k: Any, v: Any, *, dtype: Any, order: int | None = None,
                            normalize: bool = False, method: str = "atan2",
                            eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> Bound:
    """Error bound of :func:`angular_attention` computed in precision T (first-order running analysis).

    A = Sim with E(A) from :func:`angular_similarity_bound`; O = A V (length M): E = E(A)|V| + M |A||V|;
    with the normaliser den = A 1 (A >= 0, no cancellation): E(den) = E(A) 1 + M den, and
    E(O/den) = (E(num) + |O| E(den)) / (den - u E(den)) + |O|, inf where den - u E(den) <= 0: the exact
    kernel's similarity sum vanishes when every key is antiparallel to the query, and with arccos in
    float32 a key within about 2.4e-4 rad of antiparallel (1 - cos < u/2) already rounds to Sim = 0 - no
    bound exists there.  K = d + M + 2 (+ the kernel's depth); see the module's section 5 comment for the
    Bound(scale = E/K, k = K) convention.

    Parameters
    ----------
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e) : float (T-rounded).  dtype : T.  Others as
    :func:`angular_attention`.

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).
    """
    validation.check_eps(eps)
    q, k, v, sz = _check_qkv(q, k, v)
    a, ea = angular_similarity_bound(q, k, dtype=dtype, order=order, method=method, eps=eps, policy=policy)
    m = sz["M"]
    num = a @ v
    e = ea @ np.abs(v) + m * (np.abs(a) @ np.abs(v))
    depth = sz["d"] + m + 3 * (order or 0) + 2 * _ELEM + 8
    if normalize:
        den = np.sum(a, axis=-1)[..., None]
        eden = np.sum(ea, axis=-1)[..., None] + m * np.abs(den)
        u = numerics.unit_roundoff(dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            o = num / den
            # exact quotient bound (|den| - u E(den) in the divisor); inf where rounding can reach den = 0
            # (the exact kernel with every key (nearly) antiparallel to the query: Sim = 0 for all of them)
            low = np.abs(den) - u * eden
            e = np.where(low > 0, (e + np.abs(o) * eden) / low + np.abs(o), np.inf)
        depth += m + 1
    return Bound(e / depth, depth, f"angular attention (order {order}, normalize={normalize}, {method}): "
                                   f"first-order running error, k = d + M (+M+1) + kernel depth = {depth}")


def _core_with_error(q, k, v, eq, ek, ev, cfg: CastlingConfig, conv_weight, conv_bias, training, hw, dtype):
    """castling_core's value and error coefficient, stage by stage (see castling_core_bound)."""
    u = numerics.unit_roundoff(dtype)
    eta_u = numerics.underflow_eta(dtype) / u
    b, h, n, d = q.shape
    sn, sd = numerics.sum_depth(n, dtype), numerics.sum_depth(d, dtype)   # sums of N and d terms (mixed: fewer)
    depth = 0.0
    qh, eqh = _e_normalize(q, eq, cfg.qk_norm_eps, cfg.qk_norm, cfg.norm_arithmetic, eta_u, dtype)
    kh, ekh = _e_normalize(k, ek, cfg.qk_norm_eps, cfg.qk_norm, cfg.norm_arithmetic, eta_u, dtype)
    depth += sd / 2 + 2
    av = np.abs(v)
    if cfg.order == 0:
        kt, ekt = np.swapaxes(kh, -1, -2), np.swapaxes(ekh, -1, -2)
        kv = kt @ v
        ekv = _e_matmul(kt, ekt, v, ev, eta_u, dtype)
        raw = qh @ kv
        eraw = _e_matmul(qh, eqh, kv, ekv, eta_u, dtype)
        series = (1.0 / math.pi) * raw
        es = eraw / math.pi + 2.0 * np.abs(series)
        fq, efq, fk, efk = qh, eqh / math.pi, kh, ekh  # for the normaliser: (1/pi) q^ . sum k^
        depth += sn + sd + 2
    else:
        fq, efq = _e_features(qh, eqh, cfg.order)
        fk, efk = _e_features(kh, ekh, cfg.order)
        ft, eft = np.swapaxes(fk, -1, -2), np.swapaxes(efk, -1, -2)
        kv = ft @ v
        ekv = _e_matmul(ft, eft, v, ev, eta_u, dtype)
        series = fq @ kv
        es = _e_matmul(fq, efq, kv, ekv, eta_u, dtype)
        depth += sn + numerics.sum_depth(fq.shape[-1], dtype) + 2 * cfg.order + 4
    if cfg.constant == "own":
        const, ec = 0.5 * v, 0.5 * ev
    else:
        const = np.broadcast_to(0.5 * np.sum(v, axis=-2, keepdims=True), v.shape)
        ec = np.broadcast_to(0.5 * np.sum(ev, axis=-2, keepdims=True) + 0.5 * sn * np.sum(av, axis=-2,
                                                                                           keepdims=True), v.shape)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            lq, elq, lk, elk = qh, eqh, kh, ekh
        else:
            s = cfg.head_dim ** -0.5
            lq, elq, lk, elk = s * q, s * eq + 2.0 * np.abs(s * q), k, ek
        logits = lq @ np.swapaxes(lk, -1, -2)
        el = _e_matmul(lq, elq, np.swapaxes(lk, -1, -2), np.swapaxes(elk, -1, -2), eta_u)
        p, ep, amb = _e_softmax_masked(logits, el, cfg.sparse_eps, u, _rounded_gap(cfg.sparse_eps, dtype))
        pm = p * (p > cfg.sparse_eps)
        sparse = pm @ v
        epm = np.where(amb, 0.0, np.where(p > cfg.sparse_eps, ep, 0.0))
        e_sp = _e_matmul(pm, epm, v, ev, eta_u) + (np.where(amb, p, 0.0) @ av) / u
        depth += d + 2 * _ELEM + n + 4
    if cfg.normalizer == "output_l2":
        if sparse is None:
            ang, e_ang = const + series, ec + es + np.abs(const + series)
        else:
            t = sparse + const
            et = e_sp + ec + np.abs(t)
            ang, e_ang = t + series, et + es + np.abs(t + series)
        out, e_out = _e_normalize(ang, e_ang, 0.0, "none", cfg.norm_arithmetic, eta_u, dtype)
        depth += sd / 2 + 4
    else:
        out = const + series
        e_out = ec + es + np.abs(out)
        depth += 1
        if cfg.normalizer == "similarity_sum":
            ksum, eks = np.sum(fk, axis=-2), np.sum(efk, axis=-2) + sn * np.sum(np.abs(fk), axis=-2)
            dot = np.einsum("bhnf,bhf->bhn", fq, ksum)
            edot = np.einsum("bhnf,bhf->bhn", efq, np.abs(ksum)) + np.einsum("bhnf,bhf->bhn", np.abs(fq), eks) \
                + numerics.sum_depth(fq.shape[-1], dtype) * np.einsum("bhnf,bhf->bhn", np.abs(fq), np.abs(ksum))
            if cfg.order == 0:
                dot, edot = dot / math.pi, edot / math.pi + 2.0 * np.abs(dot / math.pi)
            den = (n / 2.0 + dot)[..., None]
            eden = (edot + np.abs(n / 2.0 + dot))[..., None]
            o = out / den
            e_out = (e_out + np.abs(o) * eden) / np.abs(den) + np.abs(o)
            out = o
            depth += sn + numerics.sum_depth(fq.shape[-1], dtype) + 4
    if cfg.conv != "none":
        w = numerics.as_float(conv_weight, "conv_weight")
        aw = np.abs(w)
        bias_abs = None if conv_bias is None else np.abs(numerics.as_float(conv_bias, "conv_bias"))
        if cfg.conv == "tokens1d":
            dwc = token_conv(v, w, conv_bias)
            s_abs = token_conv(av, aw, bias_abs)
            prop = token_conv(ev, aw)
            taps_k = w.shape[2]
        else:
            dwc = grid_conv(v, w, conv_bias, hw=hw)
            s_abs = grid_conv(av, aw, bias_abs, hw=hw)
            prop = grid_conv(ev, aw, hw=hw)
            taps_k = w.shape[2] * w.shape[3]
        k_dwc = numerics.sum_depth(taps_k, dtype) + (conv_bias is not None)
        e_dwc = prop + k_dwc * s_abs
        out = out + dwc
        e_out = e_out + e_dwc + np.abs(out)
        depth += k_dwc + 1
    if sparse is not None and cfg.normalizer != "output_l2":
        out = out + sparse
        e_out = e_out + e_sp + np.abs(out)
        depth += 1
    return out, e_out, depth


def _e_features(xh: np.ndarray, exh: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Series features without the constant and their errors: P_{p} = P_{p-2} (x) x (x) x;
    E(P_p) = E(P_{p-2}) (x)|x|(x)|x| + |P_{p-2}| (x) (E(x)(x)|x| + |x|(x)E(x)) + 2 |P_p|; scaling by the rounded
    sqrt(c_k/pi) adds 3 |.| (the constant's rounding, the sqrt, the product)."""
    c = arcsin_coefficients(order)
    ax = np.abs(xh)
    parts, eparts = [], []
    power, epower = xh, exh
    shape = xh.shape[:-1]
    for kk in range(order + 1):
        if kk:
            ap = np.abs(power)
            new = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).reshape(*shape, -1)
            epower = (epower[..., :, None, None] * ax[..., None, :, None] * ax[..., None, None, :]
                      + ap[..., :, None, None] * exh[..., None, :, None] * ax[..., None, None, :]
                      + ap[..., :, None, None] * ax[..., None, :, None] * exh[..., None, None, :]
                      ).reshape(*shape, -1) + 2.0 * np.abs(new)
            power = new
        s = math.sqrt(float(c[kk]) / math.pi)
        parts.append(s * power)
        eparts.append(s * epower + 3.0 * np.abs(s * power))
    return np.concatenate(parts, axis=-1), np.concatenate(eparts, axis=-1)


def linear_angular_attention_bound(q: Any, k: Any, v: Any, *, constant: str = "sum", normalizer: str = "none",
                                   eps: float = config.CASTLING_QK_NORM_EPS) -> Bound:
    """Error bound of :func:`linear_angular_attention` in paper mode (policy "clamp", arithmetic "scaled";
    normalizer "none" or "similarity_sum") computed in precision T on T-rounded inputs, any summation order.

    First-order running error E in units of u_T (|.| element-wise):

      q^ = q / max(m sqrt(sum (q/m)^2), eps): q/m (u), the square (2u + u), the sum of d non-negative
          terms ((d - 1) u), sqrt (half of that, + u), times m (u), the quotient (u):  E(q^) = (d/2 + 4)|q^|;
          likewise k^.
      kv = k^^T v (length M):  E(kv) = E(k^)^T |v| + M |k^|^T |v|.
      num = q^ kv (length d):  E(num) = E(q^)(|k^|^T |v|) + |q^| E(kv) + d |q^|(|k^|^T |v|).
      lin = (1/pi) num:  fl(1/pi) and the product, E(lin) = E(num)/pi + 2 |lin|.
      C:  "own" 1/2 v is exact; "sum" 1/2 sum_j v_j adds (M/2) sum_j |v_j|.  H = C + lin adds |C| + |lin|.
      similarity_sum:  den = M/2 + (1/pi) q^ . sum_j k^_j with E(den) = (E(q^) . S_k + |q^| . sum_j E(k^_j)
          + (M + d)|q^| . S_k)/pi + 3 (M/2 + |q^| . S_k/pi) (S_k = sum_j |k^_j|); den >= M (1/2 - 1/pi) > 0,
          so the quotient adds (E(H) + |H/den| E(den))/den + |H/den|.

    Returned as Bound(E / K, K) with K = d + M + 12 (the two inner products plus the elementwise stages), so
    that gamma_K(u) * scale >= u E.  First order in u (products of errors neglected); no underflow term
    (unit rows are >= 1 in their largest entry unless clamped by eps).  Moved here from the kernel tests,
    where it was derived for the C kernel's agreement test (tests/test_kernels_linear.py).

    Parameters
    ----------
    q : (B, h, N, d), k : (B, h, M, d), v : (B, h, M, e) float (T-rounded values).
    constant : "sum" | "own".  normalizer : "none" | "similarity_sum".  eps : the clamp of the row norms.

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).

    References
    ----------
    Castling-ViT Eq. 8-9; Higham (2002) §3.1 (running error of inner products).
    """
    validation.check_eps(eps)
    q, k, v, _ = _check_qkv(q, k, v)
    if constant not in ("sum", "own"):
        raise ArgumentError(f"argument 'constant': expected 'sum' or 'own', got {constant!r}")
    if normalizer not in ("none", "similarity_sum"):
        raise ArgumentError(f"argument 'normalizer': the bound covers 'none' and 'similarity_sum', got {normalizer!r}")
    with np.errstate(all="ignore"):
        qh = unit_rows(q, eps=eps, policy="clamp")
        kh = unit_rows(k, eps=eps, policy="clamp")
        d, m = q.shape[-1], k.shape[-2]
        aq, ak, av = np.abs(qh), np.abs(kh), np.abs(v)
        eq, ek = (d / 2 + 4) * aq, (d / 2 + 4) * ak
        kv_abs = ak.swapaxes(-1, -2) @ av
        e_kv = ek.swapaxes(-1, -2) @ av + m * kv_abs
        num_abs = aq @ kv_abs
        e_num = eq @ kv_abs + aq @ e_kv + d * num_abs
        lin_abs = num_abs / np.pi
        e = e_num / np.pi + 2 * lin_abs
        if constant == "own":
            c_abs = 0.5 * av
        else:
            c_abs = np.broadcast_to(0.5 * np.sum(av, axis=-2, keepdims=True), lin_abs.shape)
            e = e + (m / 2) * np.sum(av, axis=-2, keepdims=True)
        h_abs = c_abs + lin_abs
        e = e + h_abs
        if normalizer == "similarity_sum":
            sk = np.sum(ak, axis=-2)
            dot = np.einsum("bhnd,bhd->bhn", aq, sk)
            den = m / 2 + np.einsum("bhnd,bhd->bhn", qh, np.sum(kh, axis=-2)) / np.pi
            e_den = (np.einsum("bhnd,bhd->bhn", eq, sk) + np.einsum("bhnd,bhd->bhn", aq, np.sum(ek, axis=-2))
                     + (m + d) * dot) / np.pi + 3 * (m / 2 + dot / np.pi)
            o_abs = h_abs / den[..., None]
            e = (e + o_abs * e_den[..., None]) / den[..., None] + o_abs
    depth = d + m + 12
    return Bound(e / depth, depth, f"linear-angular (Castling Eq. 9, {constant}, {normalizer}): first-order running "
                                   f"error, K = d + M + 12 = {depth}")


def castling_core_bound(q: Any, k: Any, v: Any, cfg: CastlingConfig, *, dtype: Any, conv_weight: Any = None,
                        conv_bias: Any = None, training: bool = False, hw: tuple[int, int] | None = None,
                        err_q: Any = None, err_k: Any = None, err_v: Any = None) -> Bound:
    """Error bound of :func:`castling_core` computed in precision T.

    Stages (E in units of u_T, first order; |.| element-wise):
      q^ = q / D:   E(q^) = E(q)/D + |q^| (||E(q)||_2/D + d/2 + 2)                     (norm, quotient)
      kv = k^^T v:  E = E(k^)^T|v| + |k^|^T E(v) + N |k^|^T|v|; q^ kv likewise with d; (1/pi) x: + 2|.|
      order K > 0:  tensor-power features with their product errors, then the same two products.
      constant:     own 1/2 v exact; sum 1/2 sum_j v_j: + N/2 sum_j |v_j|.
      sparse:       logits E(L) as a product (+2|s q| for the rounded scale), softmax E(P) (see
                    _e_softmax_masked), kept weights' errors through P V; weights within u E(P) +
                    |eps - fl_T(eps)| of eps are ambiguous (the mask is discontinuous) and their whole
                    contribution sum_j P_ij |v_j| is admitted.
      output_l2:    as q^, with D = ||angular||, no eps (a zero row is NaN on both sides).
      similarity_sum: den = N/2 + F(q^) . sum_j F(k^_j) >= N (1/2 - 1/pi), quotient rule.
      conv:         conv(E(v), |w|) + k conv(|v|, |w|).
      each addition: + |result|.
    K = the sum of the stages' depths (reported in the note); Bound(scale = E/K, k = K).

    Parameters
    ----------
    q, k, v : (B, h, N, d) float (T-rounded).  cfg, conv_weight, conv_bias, training, hw : as
    :func:`castling_core`.  dtype : T.  err_q, err_k, err_v : error coefficients of q, k, v or None.

    Returns
    -------
    numerics.Bound with scale (B, h, N, d).
    """
    validation.check_config(cfg, CastlingConfig)
    q, k, v, sz = _check_qkv(q, k, v)
    _check_self_attention(q, k, v, sz, "castling_core_bound")
    _check_conv_weight(conv_weight, cfg, sz)
    z = np.zeros_like(q)
    eq = z if err_q is None else numerics.as_float(err_q, "err_q")
    ek = z if err_k is None else numerics.as_float(err_k, "err_k")
    ev = z if err_v is None else numerics.as_float(err_v, "err_v")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _, e, depth = _core_with_error(q, k, v, eq, ek, ev, cfg, conv_weight, conv_bias, training, hw, dtype)
    return numerics.running_bound(e, depth, f"castling core ({cfg.normalizer}, constant {cfg.constant}, order "
                                            f"{cfg.order}, sparse {cfg.sparse_active(training)})", dtype)


def castling_attention_stages(params: Mapping[str, Any], cfg: CastlingConfig, *, training: bool = False,
                              hw: tuple[int, int] | None = None) -> list[numerics.Stage]:
    """The stages of :func:`castling_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C) (the qkv projection's input); "qkv" (B, N, 3C); "core" (B, N, C),
    :func:`castling_core` with heads merged (the output projection's input); "proj" (B, N, C).

    References
    ----------
    Castling-ViT Eq. 1, 9-10; docs/design.md "Stages".
    """
    _check_params(params, cfg)
    conv_w, conv_b = params.get("dconv.weight"), params.get("dconv.bias")

    def merge(t):
        return t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], cfg.dim)

    def core(qkv):
        return merge(castling_core(*_split_heads(qkv, cfg.num_heads), cfg, conv_weight=conv_w, conv_bias=conv_b,
                                   training=training, hw=hw))

    def core_bound(qkv, dtype=None):
        b = castling_core_bound(*_split_heads(qkv, cfg.num_heads), cfg, dtype=dtype, conv_weight=conv_w,
                                conv_bias=conv_b, training=training, hw=hw)
        return Bound(merge(np.asarray(b.scale)), b.k, b.note, ref_depth=b.ref_depth)

    def lin(name, source, key):
        w, bias = params[key + ".weight"], params.get(key + ".bias")
        return numerics.Stage(name, (source,), lambda t: layers.linear(t, w, bias),
                              lambda t, dtype=None: layers.linear_bound(t, w, bias),
                              f"Castling-ViT Eq. 1: the {key} projection")

    return [lin("qkv", "x", "qkv"),
            numerics.Stage("core", ("qkv",), core, core_bound,
                           "Castling-ViT Eq. 9-10: linear-angular attention (+ the depthwise conv of V)"),
            lin("proj", "core", "proj")]


def castling_attention_bound(x: Any, params: Mapping[str, Any], cfg: CastlingConfig, *, dtype: Any,
                             training: bool = False, hw: tuple[int, int] | None = None) -> Bound:
    """Error bound of :func:`castling_attention` computed in precision T.

    qkv = x W^T (+ b): E = (C + 1)(|x||W|^T + |b|) (Higham 3.12); the core as :func:`castling_core_bound`
    with these input errors; the output projection E = E(heads)|W_p|^T + (C + 1)(|heads||W_p|^T + |b_p|).
    K = 2 (C + 1) + the core's depth.  First order; the exp/atan2 accuracy is assumed
    (config.ELEMENTARY_FUNCTION_ULPS).

    Parameters
    ----------
    x : (B, N, C) float (T-rounded); params : T-rounded parameters; cfg, training, hw : as
    :func:`castling_attention`; dtype : T.

    Returns
    -------
    numerics.Bound with scale (B, N, C).
    """
    validation.check_config(cfg, CastlingConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg)
    c = cfg.dim
    w = numerics.as_float(params["qkv.weight"], "qkv.weight")
    bq = params.get("qkv.bias")
    qkv = layers.linear(x, w, bq)
    eta_u = numerics.underflow_eta(dtype) / numerics.unit_roundoff(dtype)
    e_qkv = (c + 1) * (layers.linear(np.abs(x), np.abs(w), None if bq is None else np.abs(bq)) + eta_u)
    q, k, v = _split_heads(qkv, cfg.num_heads)
    eq, ek, ev = _split_heads(e_qkv, cfg.num_heads)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        heads, e_heads, depth = _core_with_error(q, k, v, eq, ek, ev, cfg, params.get("dconv.weight"),
                                                 params.get("dconv.bias"), training, hw, dtype)
        merged = heads.transpose(0, 2, 1, 3).reshape(x.shape)
        e_merged = e_heads.transpose(0, 2, 1, 3).reshape(x.shape)
        wp = np.abs(numerics.as_float(params["proj.weight"], "proj.weight"))
        bp = np.abs(numerics.as_float(params["proj.bias"], "proj.bias"))
        e = e_merged @ wp.T + (c + 1) * (np.abs(merged) @ wp.T + bp + eta_u)
    depth += 2 * (c + 1)
    return Bound(e / depth, depth, f"castling attention ({cfg.normalizer}, constant {cfg.constant}, order "
                                   f"{cfg.order}, conv {cfg.conv}, sparse {cfg.sparse_active(training)}): "
                                   f"first-order running error, k = 2(C+1) + core depth = {depth}")
