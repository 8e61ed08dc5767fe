"""Castling-ViT, the angular kernel: the arcsin series, its tail bounds, the angular similarity and the feature
maps that linearise it, the exponential / Gaussian-RBF kernels, and the error model of the module with the
bound of the angular similarity.

Reference: H. You et al., "Castling-ViT: Compressing Self-Attention via Switching Towards Linear-Angular
Attention at Vision Transformer Inference", CVPR 2023 (../shared/seeds/003_b81e2e603475c765.txt), §3.2
Eq. 2 and 4-8.  Equation numbers are the paper's.

1. **The arcsin series** (Eq. 8).  arcsin x = sum_{k>=0} c_k x^(2k+1), c_k = (2k)! / (4^k (k!)^2 (2k+1)),
   truncated after order K: T_K(x) = sum_{k<=K} c_k x^(2k+1), with two proven tail bounds
   (:func:`arcsin_tail_bound`) and their tightness.
2. **The angular kernel** (Eq. 4-5): theta = arccos(q^.k^), Sim = 1 - theta/pi = 1/2 + arcsin(q^.k^)/pi
   (the identity behind Eq. 8), evaluated stably near |q^.k^| = 1 by Kahan's half-angle formula.
3. **Feature maps**: tensor powers x^{(x)p} with <x^{(x)p}, y^{(x)p}> = (x.y)^p exactly, so every order of
   the expansion is a linear-attention term; the implicit map phi of Eq. 6-7 realised by random-hyperplane
   sign features; the exponential / Gaussian-RBF kernels of Eq. 2.
5. **Error bounds**: the error model shared by the Castling bounds (``_e_matmul``, ``_e_normalize``) and
   :func:`angular_similarity_bound`.

Layer: attention, the bottom of Castling-ViT's three files (with :mod:`.angular_range`, the series' domain, work
and range checks, below it): imports bounds, config, numerics, validation, backends (registers the NumPy
definition of "angular_series_features"), feature_maps (``arcsin_coefficients_exact`` is feature_maps' own,
re-exported) and angular_range, nothing from :mod:`.angular_linear` or :mod:`.angular`, which import it.  The public names are re-exported by
:mod:`refimpl.attention.angular`, their documented home.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backends, bounds, config, layers, numerics, validation
from ..errors import ArgumentError
# arcsin_coefficients_exact: Eq. 8's exact c_k, public here (re-exported by angular, its documented home); defined
# in feature_maps, which the Numba kernel of "angular_series_features" shares.
from ..feature_maps import arcsin_coefficients_exact
from ..feature_maps import check_series_order as _check_order
from ..feature_maps import series_feature_dim as _feature_dim
from ..numerics import Bound
from .angular_range import ARCSIN_DOMAIN_SLACK  # noqa: F401 - kept importable here (the tail functions' domain)
from .angular_range import _check_domain, _check_representable, _terms

__all__ = [
    "arcsin_coefficients_exact", "arcsin_coefficients", "arcsin_series", "arcsin_series_derivative",
    "arcsin_series_bound", "arcsin_tail_bound", "arcsin_tail_tightness", "TAIL_BOUND_FLOOR",
    "unit_rows", "cosine_matrix", "spectral_angle", "angular_similarity", "angular_similarity_series",
    "tensor_power", "angular_series_features", "hyperplane_features", "exponential_kernel",
    "gaussian_rbf_kernel", "angular_similarity_bound",
]

_METHODS = ("atan2", "arccos", "arcsin")

#: Absolute floor added to :func:`arcsin_tail_bound` for x != 0: each of its ELEMENTARY_FUNCTION_ULPS + 8
#: roundings may lose up to one subnormal spacing 2^-1074 when |x|^(2K+3) is in or below the subnormal range.
TAIL_BOUND_FLOOR = (config.ELEMENTARY_FUNCTION_ULPS + 8) * 2.0 ** -1074
_POLICIES = ("clamp", "none")


# ===================================================================================================
# 1. The arcsin series (Eq. 8)
# ===================================================================================================

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

    Range: T_K(x) is finite for every finite x; where it exceeds the range of the working dtype (|x| > 1
    only, e.g. x = 1e150 with K >= 1) FloatingPointError naming the stage is raised, as the range policy of
    docs/guarantees.md asks for a finite value that is not representable.  NaN and +-inf propagate.

    References
    ----------
    Castling-ViT Eq. 8 (the K-th partial sum of the "high-order residuals").
    """
    x = numerics.as_float(x, "x", allow_empty=True)
    return _series_value(x, _terms(x, order, "arcsin_series"), "arcsin_series")


def _series_value(x: np.ndarray, terms: int, what: str) -> np.ndarray:
    """Horner's rule on T_terms(x) (the body of :func:`arcsin_series`), FloatingPointError naming ``what`` where
    the value is not representable."""
    c = arcsin_coefficients(terms)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x * x
        acc = np.full_like(x, c[-1])
        for ck in c[-2::-1]:
            acc = acc * t + ck
        out = x * acc
    return _check_representable(x, out, terms, what)


def arcsin_series_derivative(x: Any, order: int) -> np.ndarray:
    """T_K'(x) = sum_{k<=K} (2k+1) c_k x^(2k), used to propagate an error in x through T_K (Eq. 8).

    Bounded work as :func:`arcsin_series` ((2k+1) c_k = binom(2k, k) / 4^k <= 1 and T_K' >= 1, so the same
    K0 makes the unsummed tail <= 2^-56 T_K'(x)); more than ``config.ARCSIN_SERIES_MAX_TERMS`` terms raise.
    Range as :func:`arcsin_series`: a value beyond the working dtype's range (|x| > 1 only) raises
    FloatingPointError naming the stage."""
    x = numerics.as_float(x, "x", allow_empty=True)
    order = _terms(x, order, "arcsin_series_derivative")
    c = arcsin_coefficients(order)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x * x
        acc = np.full_like(x, c[-1] * (2 * order + 1))
        for k in range(order - 1, -1, -1):
            acc = acc * t + c[k] * (2 * k + 1)
    return _check_representable(x, acc, order, "arcsin_series_derivative")


def arcsin_series_bound(x: Any, order: int) -> Bound:
    """Rounding-error bound of :func:`arcsin_series` evaluated in precision T.

    Horner's rule on the degree-K polynomial in t = x^2 with non-negative coefficients has error
    <= gamma_{2K} sum_k c_k |t|^k (Higham 2002, eq. 5.3); t = fl(x^2) carries relative error u, so t^k
    carries <= k u <= K u; each c_k is rounded once (u); the final product by x rounds once (u).  Since all
    c_k > 0 the running sum on absolute values is T_K(|x|) = |T_K(x)|, so

        |fl(T_K(x)) - T_K(x)| <= gamma_{3K+2} |T_K(x)|      (first order in u; k = 3K + 2).

    Range: where |T_K(x)| itself exceeds the working dtype's range (|x| > 1 only) the bound is not
    representable either, and FloatingPointError naming the stage is raised (as :func:`arcsin_series`).

    References
    ----------
    Castling-ViT Eq. 8; Higham (2002) eq. (5.3).
    """
    order = _check_order(order)
    x = numerics.as_float(x, "x", allow_empty=True)
    ax = np.abs(x)
    scale = np.abs(_series_value(ax, _terms(ax, order, "arcsin_series_bound"), "arcsin_series_bound"))
    return Bound(scale, 3 * order + 2,
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

    **kind="geometric"** (|x| < 1; +inf for 1 <= |x| <= 1 + ARCSIN_DOMAIN_SLACK, an error beyond):

        |R_K(x)| <= sum_{j>=0} c_{K+1+j} |x|^(2K+3+2j) <= c_{K+1} |x|^(2K+3) sum_{j>=0} x^(2j)
                  = c_{K+1} |x|^(2K+3) / (1 - x^2)                                         (G)

    by the Lemma (c_{K+1+j} <= c_{K+1}) and the geometric series.  *Tightness*: every term of R_K(|x|) is
    positive and the first one is c_{K+1}|x|^(2K+3), so |R_K(x)| >= c_{K+1}|x|^(2K+3) and
    1 <= G / |R_K| <= 1 / (1 - x^2): within a factor 4/3 for |x| <= 1/2, 1/(1 - r^2) for |x| <= r.
    G blows up at |x| -> 1 although R_K(1) = pi/2 - T_K(1) is finite; hence:

    **kind="uniform"** (|x| <= 1; +inf for 1 < |x| <= 1 + ARCSIN_DOMAIN_SLACK, an error beyond):

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
    x : array_like float, any shape, with |x| <= 1: the tail R_K(x) is undefined beyond (the series diverges and
        arcsin x is not real), so |x| > 1 + ARCSIN_DOMAIN_SLACK (2^-20, the rounding excess a computed cosine
        may carry) and +-inf raise ArgumentError naming 'x' (the domain and the value); NaN propagates.
        On 1 < |x| <= 1 + 2^-20 (and for "geometric" at |x| = 1) no bound is proven: +inf.
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
    _check_domain(ax, "arcsin_tail_bound")
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
    Returns float64 ndarray of x's shape (inf where no factor is proven).  Domain as
    :func:`arcsin_tail_bound`: |x| > 1 + ARCSIN_DOMAIN_SLACK and +-inf raise ArgumentError naming 'x'.
    """
    order = _check_order(order)
    ax = np.abs(np.asarray(numerics.as_float(x, "x", allow_empty=True), dtype=np.float64))
    if kind not in ("geometric", "uniform"):
        raise ArgumentError(f"argument 'kind': expected 'geometric' or 'uniform', got {kind!r}")
    _check_domain(ax, "arcsin_tail_tightness")
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
        return layers.l2_normalize(x, eps, policy)
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

    Range: each product of p factors is formed on the factors' significands m in [1/2, 1) (``np.frexp``, exact),
    renormalised after every multiplication, with the exponents summed as integers, and scaled once at the end
    (``np.ldexp``).  Where every partial product is a normal number this rounds exactly as the direct product
    x_i1 x_i2 ... x_ip does (scaling by a power of two commutes with rounding), so ordinary results are bit for
    bit the direct ones; but no partial product overflows or underflows on the way: x = (2^-540, 2^300), p = 3
    gives x_1 x_1 x_2 = 2^-780, which the direct order loses to 0 (2^-1080 underflows first), and (2^600,
    2^-600), p = 3 gives x_1 x_1 x_2 = 2^600 where the direct order overflows (and inf x 0 would be NaN).  The
    final scaling rounds once (into the subnormal range: eta_T absolute, the direct product's own rounding).
    Where a product of finite factors exceeds the working dtype's range its exact value is finite but not
    representable: FloatingPointError naming the index.  NaN and +-inf factors propagate as in the direct product.

    References
    ----------
    Castling-ViT Eq. 8; the polynomial-kernel feature map (e.g. Scholkopf & Smola, Learning with Kernels,
    Prop. 2.1).
    """
    p = numerics.check_positive_int(p, "p")
    x = numerics.as_float(x, "x")
    m, e = np.frexp(x)
    out_m, out_e = m, e.astype(np.int64)
    with np.errstate(invalid="ignore"):     # inf x 0 where a factor is inf (finite significands cannot give NaN)
        for _ in range(p - 1):
            prod = (out_m[..., :, None] * m[..., None, :]).reshape(*x.shape[:-1], -1)    # in [1/4, 1): no range
            out_m, shift = np.frexp(prod)                                                 # to [1/2, 1), exact
            out_e = (out_e[..., :, None] + e[..., None, :]).reshape(*x.shape[:-1], -1) + shift
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(out_m, np.clip(out_e, -(2 ** 20), 2 ** 20).astype(np.int32))
    lost = np.isinf(out) & np.isfinite(out_m)
    if np.any(lost):
        idx = tuple(int(i) for i in np.argwhere(lost)[0])
        raise FloatingPointError(f"tensor_power: the product of p = {p} finite factors at index {idx} is about "
                                 f"2^{int(out_e[idx]) - 1} in magnitude, beyond the range of {out.dtype}: the "
                                 f"exact value is finite but not representable")
    return out


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
    # Operation "angular_series_features": its NumPy definition is the body below (so the default backend's
    # result is unchanged and nothing recurses); the Numba kernel's predicate picks the calls it takes.
    return backends.call("angular_series_features", x, order, constant=constant, eps=eps, policy=policy)


@backends.register("angular_series_features", "numpy")
def _angular_series_features_numpy(x: Any, order: int, *, constant: bool = True,
                                   eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> np.ndarray:
    """The NumPy body of :func:`angular_series_features` (the definition; what operation
    "angular_series_features" of refimpl.backends specifies; registered as its NumPy kernel)."""
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
    -> (..., N, M).

    Range: the kernel is not scale-invariant, so nothing is rescaled.  Where an exponent a = <x_i, y_j> / sigma^2
    is finite but exp(a) exceeds the working dtype's range (a > about 709.78 in float64, e.g. 1e150-sized
    inputs), or where <x_i, y_j> / sigma^2 itself overflows although x, y and sigma are finite, the exact value
    is (but for a cancelling overflowed inner product, inf - inf) finite and not representable:
    FloatingPointError naming the stage.  Very negative exponents underflow to
    0 (the correctly rounded result); NaN and +-inf in the input propagate as before."""
    validation.check_positive(sigma, "sigma")
    x = numerics.as_float(x, "x")
    y = numerics.as_float(y, "y")
    _check_pair(x, y, ("x", "y"))
    with np.errstate(over="ignore", invalid="ignore"):
        a = (x @ np.swapaxes(y, -1, -2)) / (sigma * sigma)
        out = np.exp(a)
    if not np.all(np.isfinite(out)):
        finite_in = np.all(np.isfinite(x), axis=-1)[..., :, None] & np.all(np.isfinite(y), axis=-1)[..., None, :]
        lost = ~np.isfinite(out) & finite_in
        if np.any(lost):
            idx = tuple(int(i) for i in np.argwhere(lost)[0])
            raise FloatingPointError(f"exponential_kernel: exp(<x_i, y_j> / sigma^2) overflows {out.dtype} at index "
                                     f"{idx} (exponent {float(a[idx])!r}) for finite inputs of this magnitude: the "
                                     f"kernel value is not representable")
    return out


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
    rounding term counted by numerics.sum_depth for a mixed-precision ``dtype`` (:func:`refimpl.bounds.e_matmul`,
    first-order model in units of u_T)."""
    return bounds.e_matmul(a, ea, b, eb, bounds.Precision.coefficients(dtype, eta_u))


def _e_normalize(x: np.ndarray, ex: np.ndarray, eps: float, policy: str, arithmetic: str = "scaled",
                 eta_u: float = 0.0, dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(x^, E(x^)): x^ = x / max(||x||, eps) or x / ||x|| (:func:`unit_rows` in ``arithmetic``) and its error
    coefficient E(x^) = E(x)/D + |x^| (||E(x)||_2 / D + d/2 + 2 + [||x|| >= eps] d eta/u / (2 ||x||^2)) + eta/u
    (:func:`refimpl.bounds.e_normalize`, first-order model in units of u_T, the sum counted by
    numerics.sum_depth for a mixed-precision ``dtype``)."""
    xh = unit_rows(x, eps=eps, policy=policy, arithmetic=arithmetic)
    return xh, bounds.e_normalize(x, ex, eps, policy, bounds.Precision.coefficients(dtype, eta_u), xh)


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
