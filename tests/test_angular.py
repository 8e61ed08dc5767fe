"""Property tests of refimpl.attention.angular: the mathematics of Castling-ViT (CVPR 2023), Eq. 2-10.

Every tolerance comes from the error model (refimpl.numerics) or from a bound proven in the reference's
docstrings; mpmath is the oracle at config.CASTLING_MPMATH_DPS significant digits.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from equivalence.strategies import arrays
from refimpl import config, numerics, verdict
from refimpl.attention import angular as A
from refimpl.numerics import Bound
from tests import naive_angular as NA

U64 = numerics.unit_roundoff(np.float64)


def combined(*bounds: Bound) -> Bound:
    """One bound for |a - b| when a and b each have their own bound against the exact value:
    gamma_{k_i} <= (k_i / K) gamma_K for K = max k_i (gamma_k / k increases with k), so
    sum_i gamma_{k_i} S_i <= gamma_K sum_i (k_i / K) S_i."""
    kk = max(b.k for b in bounds)
    scale = sum(np.asarray(b.scale) * (b.k / kk) for b in bounds)
    return Bound(scale, kk, " + ".join(b.note for b in bounds))


def assert_within(actual, reference, bound: Bound, name: str) -> None:
    """Two float64 computations, neither exact, compared through the error model: the NaN/Inf patterns must
    agree and |a - b| must be within the bound.  The naive-ratio criterion of numerics.compare (a tested
    precision against a float64 reference) does not apply to float64 vs float64 and is not asserted."""
    report = numerics.compare(actual, reference, bound, np.float64, name=name)
    assert report.pattern_ok and report.within_bound, str(report)


def e_bound(e: np.ndarray, note: str) -> Bound:
    """A first-order error coefficient E (|err| <= u E) as a Bound: gamma_1(u) E >= u E."""
    return Bound(e, 1, note)


def core_cfg(h: int, d: int, **kw) -> A.CastlingConfig:
    kw.setdefault("conv", "none")
    kw.setdefault("sparse", "off")
    return A.CastlingConfig(dim=h * d, num_heads=h, **kw)


# ===================================================================================================
# Eq. 8: the coefficients and the series
# ===================================================================================================

def test_coefficients_match_factorial_formula_and_decrease():
    """Eq. 8: c_k = (2k)!/(2^(2k) (k!)^2 (2k+1)); c_{k+1}/c_k = (2k+1)^2/((2k+2)(2k+3)) < 1 (the Lemma of
    arcsin_tail_bound); the float64 coefficients are the correctly rounded exact ones."""
    exact = A.arcsin_coefficients_exact(60)
    for k, ck in enumerate(exact):
        assert ck == Fraction(math.factorial(2 * k), 2 ** (2 * k) * math.factorial(k) ** 2 * (2 * k + 1))
    for k in range(60):
        ratio = exact[k + 1] / exact[k]
        assert ratio == Fraction((2 * k + 1) ** 2, (2 * k + 2) * (2 * k + 3))
        assert ratio < 1
    floats = A.arcsin_coefficients(60)
    np.testing.assert_array_equal(floats, np.array([float(c) for c in exact]))


@given(x=st.floats(-1.0, 1.0), order=st.integers(0, 40))
def test_series_matches_mpmath_partial_sum(x, order):
    """Eq. 8: the float64 Horner evaluation of T_K(x) agrees with the exact rational partial sum (mpmath,
    50 digits) within arcsin_series_bound (gamma_{3K+2} |T_K(x)|) plus the oracle's own rounding."""
    with mpmath.workdps(config.CASTLING_MPMATH_DPS):
        ref = float(NA.mp_partial_sum(x, order))
    got = A.arcsin_series(np.array([x]), order)
    b = A.arcsin_series_bound(np.array([x]), order)
    bound = Bound(b.scale + np.abs(ref) / b.k, b.k, b.note + " + rounding of the mpmath value")
    numerics.assert_close(got, np.array([ref]), bound, np.float64, name="T_K(x)")


@given(x=st.floats(-1.0, 1.0))
def test_arccos_arcsin_identity_mpmath(x):
    """Eq. 8, first step: 1 - arccos(x)/pi = 1/2 + arcsin(x)/pi.  At 50 digits the two sides agree to
    k eps_mp with k = 2 ELEMENTARY_FUNCTION_ULPS + 4 (two library functions, two quotients, two sums on
    values <= 1); in float64 the three methods of spectral_angle agree within their error bounds."""
    with mpmath.workdps(config.CASTLING_MPMATH_DPS):
        xm = mpmath.mpf(x)
        diff = (1 - mpmath.acos(xm) / mpmath.pi) - (mpmath.mpf(1) / 2 + mpmath.asin(xm) / mpmath.pi)
        assert abs(diff) <= (2 * config.ELEMENTARY_FUNCTION_ULPS + 4) * mpmath.eps
        ref = float(1 - mpmath.acos(xm) / mpmath.pi)
    # float64: vectors with q^.k^ = x (2-D), Sim by arccos and arcsin vs the mpmath value
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[x, math.sqrt(max(0.0, 1.0 - x * x))]]]])
    for method in ("arccos", "arcsin"):
        got = A.angular_similarity(q, k, method=method)[..., 0, 0]
        sim, e = A.angular_similarity_bound(q, k, dtype=np.float64, method=method)
        # k's second component sqrt(1 - x^2) is rounded, so q^.k^ = x (1 + O(u)): |dc| <= 2u, which moves
        # theta by <= min(2u / sqrt(1 - x^2), pi sqrt(u)) (the Hoelder bound of spectral_angle); in units of u:
        with np.errstate(divide="ignore"):
            e_in = min(2.0 / math.sqrt(max(0.0, 1.0 - x * x)) if abs(x) < 1 else math.inf,
                       math.pi * math.sqrt(1.0 / U64)) / math.pi
        # The bound's validity against mpmath: near x = +-1 arccos amplifies the input's rounding (Hoelder), so
        # the bound exceeds the value and the verdict is "inconclusive" there (never a match).
        verdict.assert_no_divergence(got, np.array([[ref]]), e_bound(e[..., 0, 0] + e_in + abs(ref), "Sim"),
                              np.float64, name=f"Sim via {method}")


@given(x=st.floats(-0.999, 0.999), order=st.integers(0, 40))
def test_geometric_tail_bound_holds_and_is_tight(x, order):
    """Eq. 8 tail: |arcsin x - T_K(x)| <= c_{K+1}|x|^(2K+3)/(1 - x^2) (proof in arcsin_tail_bound), and the
    bound is within the proven factor 1/(1 - x^2) of the true tail (mpmath, 50 digits)."""
    assume(x != 0.0)
    tail = abs(NA.mp_arcsin_tail(x, order))
    bound = float(A.arcsin_tail_bound(np.array([x]), order)[0])
    factor = float(A.arcsin_tail_tightness(np.array([x]), order)[0])
    assert tail <= bound
    # bound / tail <= factor, up to the bound's own (1 + gamma_m) inflation
    inflate = 1.0 + numerics.gamma(config.ELEMENTARY_FUNCTION_ULPS + 8, U64)
    # The computed bound is G (1 + delta) * inflate with |delta| <= gamma_m (its own roundings), hence the
    # square; + twice the underflow floor (the floor added to the bound, and its own subnormal roundings).
    assert bound <= tail * factor * inflate ** 2 + 2 * A.TAIL_BOUND_FLOOR


@given(order=st.integers(0, 200))
def test_uniform_tail_bound_at_one(order):
    """Eq. 8 at x = 1 (arcsin 1 = pi/2): R_K(1) = pi/2 - T_K(1) <= c_{K+1} + 1/sqrt(pi (K+1)), within the proven
    factor sqrt((K+3/2)/(K+1)) (1 + 1/(2(K+1))) <= 1.84 (Wallis bounds; proof in arcsin_tail_bound)."""
    tail = NA.mp_arcsin_tail(1.0, order)
    bound = float(A.arcsin_tail_bound(np.array([1.0]), order, kind="uniform")[0])
    factor = float(A.arcsin_tail_tightness(np.array([1.0]), order, kind="uniform")[0])
    assert 0 < tail <= bound
    # the computed bound carries its own roundings and the inflation (1 + gamma_m) on top: hence the square
    assert bound <= tail * factor * (1.0 + numerics.gamma(config.ELEMENTARY_FUNCTION_ULPS + 8, U64)) ** 2
    assert factor <= 1.84


@given(x=st.floats(-1.0, 1.0), order=st.integers(0, 30))
def test_best_tail_bound_holds_on_closed_interval(x, order):
    """Eq. 8: min(geometric, uniform) bounds the tail on all of [-1, 1], including x -> +-1 where the
    geometric bound is infinite."""
    tail = abs(NA.mp_arcsin_tail(x, order))
    assert tail <= float(A.arcsin_tail_bound(np.array([x]), order, kind="best")[0])


def test_tail_bound_table_is_what_docs_print():
    """Eq. 8: the table of docs/castling.md: at x = 0.9 the truncation error falls geometrically with K and
    the geometric bound stays within 1/(1 - 0.81) = 5.26 of it; the bound is finite for |x| < 1 only."""
    x = 0.9
    for order in (0, 1, 2, 4, 8, 16, 32):
        tail = float(abs(NA.mp_arcsin_tail(x, order)))
        bound = float(A.arcsin_tail_bound(np.array([x]), order)[0])
        inflate = 1 + numerics.gamma(config.ELEMENTARY_FUNCTION_ULPS + 8, U64)
        assert tail <= bound <= tail / (1 - x * x) * inflate ** 2
    assert np.isinf(A.arcsin_tail_bound(np.array([1.0]), 3)[0])


@given(data=st.data())
def test_truncated_kernel_within_tail_bound_of_exact(data):
    """Eq. 8: |Sim(q, k) - Sim_K(q, k)| = |R_K(q^.k^)|/pi <= best tail bound / pi, plus both float64
    evaluations' rounding errors."""
    d = data.draw(st.integers(1, 6))
    order = data.draw(st.integers(0, 6))
    q = data.draw(arrays((1, 1, 5, d), kinds=("normal", "near_duplicate", "mixed_scale")))
    k = data.draw(arrays((1, 1, 7, d), kinds=("normal", "near_duplicate", "mixed_scale")))
    exact, e1 = A.angular_similarity_bound(q, k, dtype=np.float64)
    trunc, e2 = A.angular_similarity_bound(q, k, dtype=np.float64, order=order)
    c = A.cosine_matrix(q, k)
    tail = A.arcsin_tail_bound(np.clip(c, -1, 1), order, kind="best") / math.pi
    # c itself is off by u E(c); the tail bound is monotone in |c| with slope <= that of arcsin's tail,
    # which is folded into e1 (the exact kernel's sensitivity to c) already.
    bound = Bound(e1 + e2 + tail / U64, 1, "both kernels' rounding + proven truncation tail")
    assert_within(trunc, exact, bound, name="Sim_K vs Sim")


# ===================================================================================================
# Eq. 4-7: the kernel, its range, its feature space
# ===================================================================================================

@given(data=st.data())
def test_sim_range_and_self_similarity(data):
    """Eq. 5-6: Sim in [0, 1] exactly (atan2 in [0, pi/2] doubles to [0, fl(pi)]), and Sim(x, x) = 1 exactly with
    the atan2 method (||x^ - x^|| = 0); arccos gives 1 within its Hoelder bound (|x^.x^ - 1| <= (d+2)u)."""
    d = data.draw(st.integers(1, 8))
    x = data.draw(arrays((2, 1, 6, d)))
    y = data.draw(arrays((2, 1, 5, d)))
    s = A.angular_similarity(x, y)
    s_fin = s[np.isfinite(s)]
    assert np.all((s_fin >= 0.0) & (s_fin <= 1.0))
    nz = np.linalg.norm(x, axis=-1) >= config.CASTLING_QK_NORM_EPS
    diag = np.diagonal(A.angular_similarity(x, x), axis1=-2, axis2=-1)
    np.testing.assert_array_equal(diag[nz], 1.0)
    diag_acos = np.diagonal(A.angular_similarity(x, x, method="arccos"), axis1=-2, axis2=-1)
    # x^.x^ = 1 + delta, |delta| <= (2d + 4) u (normalisation, then a length-d sum); Hoelder: |dSim| <=
    # sqrt(|delta| / 2), plus the roundings of theta / pi and 1 - theta/pi.
    hoelder = math.sqrt((2 * d + 4) * U64 / 2) + 2 * U64
    assert np.all(np.abs(diag_acos[nz] - 1.0) <= hoelder)


@given(data=st.data())
def test_feature_distance_eq7_via_truncated_features(data):
    """Eq. 6-7 with explicit features: ||Phi_K(x)||^2 = Sim_K(x, x) = 1 - R_K(1)/pi -> 1 (Eq. 6) and
    ||Phi_K(x) - Phi_K(y)||^2 = Sim_K(x,x) + Sim_K(y,y) - 2 Sim_K(x,y) = 2 theta/pi + 2 (R_K(c) - R_K(1))/pi
    (Eq. 7 in the limit K -> inf), c = x^.y^, so
    | ||Phi_K(x) - Phi_K(y)||^2 - 2 theta/pi | <= 2 (U_K(1) + best_K(c))/pi, plus rounding."""
    d = data.draw(st.integers(1, 4))
    order = data.draw(st.integers(0, 3))
    x = data.draw(arrays((d,), kinds=("normal",)))
    y = data.draw(arrays((d,), kinds=("normal", "near_duplicate")))
    assume(np.linalg.norm(x) > 0 and np.linalg.norm(y) > 0)
    px = A.angular_series_features(x, order)
    py = A.angular_series_features(y, order)
    dist2 = float(np.sum((px - py) ** 2))
    theta = float(NA.mp_angle(x, y))
    c = float(NA.mp_cosine(x, y))
    trunc = 2 * (float(A.arcsin_tail_bound(np.array([1.0]), order, kind="uniform")[0])
                 + float(A.arcsin_tail_bound(np.array([c]), order, kind="best")[0])) / math.pi
    # rounding: each feature is a product of 2K+1 normalised components (relative error <= (d/2+2)u each)
    # scaled by a rounded sqrt (3u); the squared distance sums D terms.  First order, doubled for the square.
    dim = px.size
    kk = dim + (2 * order + 1) * (d + 4) + 4
    s_abs = float(np.sum((np.abs(px) + np.abs(py)) ** 2))
    rounding = 2 * numerics.gamma(kk, U64) * s_abs
    assert abs(dist2 - 2 * theta / math.pi) <= trunc + rounding
    norm2 = float(np.sum(px * px))
    r1 = float(NA.mp_arcsin_tail(1.0, order))
    assert abs(norm2 - (1 - r1 / math.pi)) <= 2 * numerics.gamma(kk, U64) * norm2


@given(data=st.data())
def test_feature_distance_eq7_via_hyperplanes(data):
    """Eq. 6-7 with the implicit map realised by sign features psi (hyperplane_features): ||psi(x)||^2 = 1
    (Eq. 6) and, over m hyperplanes spread evenly in the plane of x, y, ||psi(x) - psi(y)||^2 = 2 #sep/m
    is within 6/m of 2 theta/pi (plane_directions: |#sep/m - theta/pi| <= 3/m); E over Gaussian w equals
    2 theta/pi exactly (Goemans-Williamson)."""
    d = data.draw(st.integers(2, 8))
    x = data.draw(arrays((d,), kinds=("normal", "mixed_scale")))
    y = data.draw(arrays((d,), kinds=("normal", "mixed_scale")))
    assume(np.linalg.norm(x) > 0 and np.linalg.norm(y) > 0)
    m = config.CASTLING_HYPERPLANE_DIRECTIONS
    w = NA.plane_directions(x, y, m)
    px, py = A.hyperplane_features(x, w), A.hyperplane_features(y, w)
    theta = float(NA.mp_angle(x, y))
    assert abs(float(np.sum(px * px)) - 1.0) <= numerics.gamma(m + 2, U64)
    dist2 = float(np.sum((px - py) ** 2))
    assert abs(dist2 - 2 * theta / math.pi) <= 6.0 / m + numerics.gamma(m + 2, U64) * 2
    sim = float(px @ py)
    assert abs(sim - (1 - theta / math.pi)) <= 3.0 / m + numerics.gamma(m + 2, U64)


@given(data=st.data())
def test_gram_matrix_psd(data):
    """Sec. 3.2.1 / Appendix B ("positive semi-definite"): the angular-kernel Gram matrix G_ij = Sim(x_i, x_j)
    has lambda_min >= -||G_computed - G||_2 - (eigensolver backward error) by Weyl's inequality;
    ||.||_2 <= ||.||_F of the element bounds u E, and LAPACK's symmetric eigensolver is backward stable with
    ||F||_2 <= p(N) u ||G||_2, p(N) taken as N (heuristic constant, Demmel 1997 Sec. 5.2; not rigorous).
    The truncated kernel Sim_K is a Gram matrix of explicit features (PSD in exact arithmetic) likewise."""
    n = data.draw(st.integers(2, 30))
    d = data.draw(st.integers(1, 6))
    x = data.draw(arrays((1, 1, n, d), kinds=("normal", "near_duplicate", "mixed_scale", "all_negative")))
    for order in (None, data.draw(st.integers(0, 3))):
        g, e = A.angular_similarity_bound(x, x, dtype=np.float64, order=order)
        g, e = g[0, 0], e[0, 0]
        g = 0.5 * (g + g.T)
        lam = np.linalg.eigvalsh(g)
        slack = U64 * (np.linalg.norm(e) + n * np.linalg.norm(g, 2))
        numerics.assert_close(np.minimum(lam, 0.0), np.zeros_like(lam), Bound(np.full_like(lam, slack / U64), 1,
                              "Weyl + eigensolver backward error"), np.float64, name=f"lambda_min, order {order}")


@given(data=st.data())
def test_gaussian_identity_eq2(data):
    """Eq. 2: exp(<x,y>/s^2) = exp(-||x-y||^2/(2 s^2)) exp((||x||^2 + ||y||^2)/(2 s^2)).  Both sides in float64:
    the exponents carry |da| <= gamma_{d+1} |x||y|/s^2 and |db|, |dc| <= gamma_{d+3} (|b|, c) (sums of
    non-negative squares), exp ELEM u each, one product: the relative difference is at most
    u [(d+1)|x|.|y|/s^2 + (d+3)(|b| + c) + 3 ELEM + 1], first order."""
    d = data.draw(st.integers(1, 8))
    sigma = data.draw(st.floats(0.5, 4.0))
    x = data.draw(arrays((1, 3, d), kinds=("normal",)))
    y = data.draw(arrays((1, 4, d), kinds=("normal",)))
    lhs = A.exponential_kernel(x, y, sigma)
    nx = np.sum(x * x, axis=-1)[..., :, None]
    ny = np.sum(y * y, axis=-1)[..., None, :]
    c = (nx + ny) / (2 * sigma ** 2)
    rbf = A.gaussian_rbf_kernel(x, y, sigma)
    rhs = rbf * np.exp(c)
    b = np.log(rbf)
    absdot = np.abs(x) @ np.abs(y).swapaxes(-1, -2) / sigma ** 2
    e = lhs * ((d + 1) * absdot + (d + 3) * (np.abs(b) + c) + 3 * config.ELEMENTARY_FUNCTION_ULPS + 1)
    assert_within(rhs, lhs, e_bound(e, "Eq. 2 exponent and exp roundings"), name="Eq. 2")


# ===================================================================================================
# Tensor powers, orders, associativity
# ===================================================================================================

def test_tensor_power_range():
    """tensor_power forms each product on significands with integer exponents (its docstring): a product whose
    partial products leave the range is still correctly rounded, and one whose exact value is beyond the range
    raises.  x = (2^-540, 2^300), p = 3: x_1 x_1 x_2 = 2^-780 (the direct order loses it: 2^-1080 underflows to
    0 first), x_1^3 = 2^-1620 rounds to 0, x_2^3 = 2^900; x = (2^512, 1), p = 2: x_1^2 = 2^1024 overflows."""
    got = A.tensor_power(np.array([[2.0 ** -540, 2.0 ** 300]]), 3)[0]
    exact = [2.0 ** -1620, 2.0 ** -780, 2.0 ** -780, 2.0 ** 60, 2.0 ** -780, 2.0 ** 60, 2.0 ** 60, 2.0 ** 900]
    np.testing.assert_array_equal(got, np.array(exact))       # every exact product is 0 or a power of two
    with pytest.raises(FloatingPointError, match=r"tensor_power: .*index \(0, 0\).*not representable"):
        A.tensor_power(np.array([[2.0 ** 512, 1.0]]), 2)
    nonfinite = A.tensor_power(np.array([[np.nan, np.inf, 0.0]]), 2)[0]      # as the direct products
    with np.errstate(invalid="ignore"):
        direct = np.array([np.nan, np.inf, 0.0])[:, None] * np.array([np.nan, np.inf, 0.0])[None, :]
    np.testing.assert_array_equal(nonfinite, direct.ravel())


@given(data=st.data())
def test_tensor_power_is_the_direct_product_in_the_normal_range(data):
    """Where every partial product is normal, the significand form rounds exactly as the direct product
    x_i1 x_i2 ... x_ip (a power-of-two scaling commutes with rounding): bit for bit, float64 and float32."""
    d = data.draw(st.integers(1, 4))
    p = data.draw(st.integers(1, 4))
    dt = data.draw(st.sampled_from(["float64", "float32"]))
    x = data.draw(arrays((2, d), kinds=("normal",))).astype(dt)
    direct = x
    for _ in range(p - 1):
        direct = (direct[..., :, None] * x[..., None, :]).reshape(2, -1)
    tiny = np.finfo(dt).tiny
    assume(np.all(np.abs(x)[x != 0] >= tiny ** (1.0 / p)) and np.all(np.abs(direct)[direct != 0] >= tiny))
    with numerics.precision(dt):
        got = A.tensor_power(x, p)
    np.testing.assert_array_equal(got, direct)


@given(data=st.data())
def test_tensor_power_inner_product(data):
    """Eq. 8 in linear time: <x^{(x)p}, y^{(x)p}> = (x.y)^p; the computed inner product of d^p products of
    p factors is within gamma_{d^p + p} of sum |x^{(x)p}||y^{(x)p}| = (|x|.|y|)^p."""
    d = data.draw(st.integers(1, 5))
    p = data.draw(st.integers(1, 5))
    x = data.draw(arrays((3, d), kinds=("normal", "mixed_scale")))
    y = data.draw(arrays((3, d), kinds=("normal", "mixed_scale")))
    got = np.sum(A.tensor_power(x, p) * A.tensor_power(y, p), axis=-1)
    with mpmath.workdps(config.CASTLING_MPMATH_DPS):
        ref = np.array([float(mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(xi, yi)) ** p)
                        for xi, yi in zip(x, y)])
    scale = np.sum(np.abs(x) * np.abs(y), axis=-1) ** p
    k = d ** p + 2 * p
    numerics.assert_close(got, ref, Bound(scale + np.abs(ref) / k, k, "d^p terms of p factors"), np.float64,
                          name="tensor power")


def _qkv(data, n_max=12, d_max=6, kinds=("normal", "near_duplicate", "mixed_scale", "all_negative")):
    b = data.draw(st.integers(1, 2))
    h = data.draw(st.integers(1, 2))
    n = data.draw(st.integers(1, n_max))
    d = data.draw(st.integers(1, d_max))
    q = data.draw(arrays((b, h, n, d), kinds=kinds))
    k = data.draw(arrays((b, h, n, d), kinds=kinds))
    v = data.draw(arrays((b, h, n, d), kinds=kinds))
    return q, k, v


@given(data=st.data())
def test_linear_angular_term_equals_order_zero_truncation(data):
    """Eq. 9 = Eq. 8 at K = 0: 1/2 sum_j v_j + (1/pi) Q^(K^^T V) equals the quadratic Sim_0(Q, K) V and the
    feature form Phi_0(Q)(Phi_0(K)^T V), with and without the similarity-sum normaliser, each within the sum
    of both computations' float64 error bounds."""
    q, k, v = _qkv(data)
    h, d = q.shape[1], q.shape[-1]
    for norm in (False, True):
        cfg = core_cfg(h, d, normaliser="similarity_sum" if norm else "none")
        lin = A.linear_angular_attention(q, k, v, normaliser=cfg.normaliser)
        np.testing.assert_array_equal(lin, A.castling_core(q, k, v, cfg))
        b_lin = A.castling_core_bound(q, k, v, cfg, dtype=np.float64)
        quad = A.angular_attention(q, k, v, order=0, normalize=norm)
        b_quad = A.angular_attention_bound(q, k, v, dtype=np.float64, order=0, normalize=norm)
        assert_within(lin, quad, combined(b_lin, b_quad), name=f"order 0, normalize={norm}")
        feat = A.angular_attention_features(q, k, v, order=0, normalize=norm)
        assert_within(feat, quad, combined(b_lin, b_quad), name="features order 0")


@given(data=st.data())
def test_order_k_features_equal_quadratic(data):
    """Eq. 8 truncated at K, computed in linear time through tensor powers (castling_core order K and
    angular_attention_features) equals the quadratic Sim_K(Q, K) V: associativity at every order."""
    q, k, v = _qkv(data, n_max=8, d_max=3)
    h, d = q.shape[1], q.shape[-1]
    order = data.draw(st.integers(1, 3))
    for norm in (False, True):
        cfg = core_cfg(h, d, order=order, normaliser="similarity_sum" if norm else "none")
        lin = A.castling_core(q, k, v, cfg)
        b_lin = A.castling_core_bound(q, k, v, cfg, dtype=np.float64)
        quad = A.angular_attention(q, k, v, order=order, normalize=norm)
        b_quad = A.angular_attention_bound(q, k, v, dtype=np.float64, order=order, normalize=norm)
        assert_within(lin, quad, combined(b_lin, b_quad), name=f"order {order}")
        feat = A.angular_attention_features(q, k, v, order=order, normalize=norm)
        assert_within(feat, quad, combined(b_lin, b_quad), name=f"features order {order}")


@given(data=st.data())
def test_linear_term_associativity(data):
    """Eq. 9: Q^ (K^^T V) = (Q^ K^^T) V, the association order that makes the linear term O(N); within the sum
    of the two products' bounds (gamma_{N+d} on |Q^|(|K^|^T|V|) each)."""
    q, k, v = _qkv(data)
    qh, kh = A.unit_rows(q), A.unit_rows(k)
    right = qh @ (kh.swapaxes(-1, -2) @ v)
    left = (qh @ kh.swapaxes(-1, -2)) @ v
    s = np.abs(qh) @ (np.abs(kh).swapaxes(-1, -2) @ np.abs(v))
    kk = q.shape[-2] + q.shape[-1]
    assert_within(right, left, Bound(2 * s, kk, "two association orders, gamma_(N+d) each"),
                  name="associativity")


@given(data=st.data())
def test_similarity_sum_denominator_positive(data):
    """Eq. 8-9: sum_j Sim_0(q_i, k_j) = M/2 + (1/pi) q^_i . sum_j k^_j >= M (1/2 - 1/pi) > 0 for every input,
    zero rows included (clamp eps), so the normalised paper mode is finite."""
    q, k, v = _qkv(data, kinds=("normal", "near_duplicate", "all_negative", "subnormal"))
    q[..., 0, :] = 0.0
    taps = {}
    out = A.linear_angular_attention(q, k, v, normaliser="similarity_sum", taps=taps)
    m = k.shape[-2]
    slack = numerics.gamma(m + q.shape[-1] + 4, U64) * m
    assert np.all(taps["denominator"] >= m * (0.5 - 1 / math.pi) - slack)
    assert np.all(np.isfinite(out))


def test_exact_kernel_normaliser_vanishes_for_antiparallel_keys():
    """Eq. 5 with the similarity-sum normaliser: Sim(q, -q) = 0 exactly (atan2(2, 0) = pi/2 exactly), so with
    every key antiparallel the normaliser is 0 and the output 0/0 = NaN, honestly; the truncated kernel cannot
    vanish (Sim_K >= 1/2 - T_K(1)/pi > 0) and stays finite."""
    q = np.random.default_rng(3).standard_normal((1, 1, 3, 4))
    k = -q[:, :, :1]
    v = np.ones((1, 1, 1, 4))
    np.testing.assert_array_equal(A.angular_similarity(q[:, :, :1], k), 0.0)
    assert np.all(np.isnan(A.angular_attention(q[:, :, :1], k, v, normalize=True)))
    assert np.all(np.isfinite(A.angular_attention(q[:, :, :1], k, v, order=5, normalize=True)))
    assert np.all(np.isinf(A.angular_attention_bound(q[:, :, :1], k, v, dtype=np.float32, normalize=True).scale))


# ===================================================================================================
# |q^.k^| -> 1
# ===================================================================================================

@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("delta", [1e-15, 1e-12, 1e-9, 1e-6, 1e-3])
def test_behaviour_near_parallel(sign, delta):
    """Eq. 4 at |q^.k^| -> 1 (arccos' slope is infinite there): every path stays finite; the atan2 method
    matches mpmath within its u-level bound; arccos matches within its proven Hoelder bound
    pi sqrt(|dc|/2) (which is what it loses: at delta = 1e-9 q^.k^ rounds to 1 and theta to 0)."""
    d = 3
    q = np.array([[[[1.0, 0.0, 0.0]]]])
    k = sign * np.array([[[[math.cos(delta), math.sin(delta), 0.0]]]])
    truth = 1 - float(NA.mp_angle(q[0, 0, 0], k[0, 0, 0])) / math.pi
    for method in ("atan2", "arccos"):
        got = A.angular_similarity(q, k, method=method)
        assert np.all(np.isfinite(got))
        _, e = A.angular_similarity_bound(q, k, dtype=np.float64, method=method)
        # Near-parallel q, k: the bound exceeds the value (arccos/atan2 conditioning), so the verdict is
        # "inconclusive" (never a match); the bound must hold.
        verdict.assert_no_divergence(got, np.full_like(got, truth), e_bound(e + abs(truth), method), np.float64,
                              name=f"Sim near parallel, {method}")
    v = np.ones((1, 1, 1, d))
    for cfg in (core_cfg(1, d), core_cfg(1, d, normaliser="similarity_sum"),
                A.CastlingConfig.preset("official", dim=d, num_heads=1, conv="none")):
        assert np.all(np.isfinite(A.castling_core(q, k, v, cfg)))


# ===================================================================================================
# Eq. 10 and the castling switch
# ===================================================================================================

@given(data=st.data())
def test_masked_branch_matches_loop_oracle(data):
    """Eq. 10: keep P_ij strictly > eps, no renormalisation (kept row sums <= 1); matches the loop oracle
    within the branch's error bound (both sides), weights within rounding of eps being ambiguous."""
    n = data.draw(st.integers(1, 30))
    d = data.draw(st.integers(1, 6))
    thr = data.draw(st.sampled_from([config.CASTLING_SPARSE_EPS, 0.0, 0.1, 0.5]))
    q = data.draw(arrays((1, 1, n, d), kinds=("normal", "near_duplicate", "large")))
    k = data.draw(arrays((1, 1, n, d), kinds=("normal", "near_duplicate", "large")))
    v = data.draw(arrays((1, 1, n, d), kinds=("normal",)))
    taps = {}
    got = A.masked_softmax_branch(q, k, v, threshold=thr, scale=d ** -0.5, taps=taps)
    p, mask = taps["sparse_weights"], taps["sparse_mask"]
    np.testing.assert_array_equal(mask, p > thr)
    assert np.all(np.sum(p * mask, axis=-1) <= 1.0 + numerics.gamma(n, U64))
    ref = NA.naive_masked_softmax(q[0, 0], k[0, 0], v[0, 0], thr, scale=d ** -0.5)
    cfg = core_cfg(1, d, sparse="always", sparse_logits="scaled_raw", sparse_eps=thr)
    full = A.castling_core_bound(q, k, v, cfg, dtype=np.float64, training=True)
    # bound of the sparse stage alone: the core bound minus nothing is an over-estimate (it also covers the
    # linear part), which is valid for this comparison.
    assert_within(got[0, 0], ref, Bound(2 * full.scale[0, 0], full.k, full.note), name="masked branch")


def _flat_tokens(n: int, c: int, seed: int) -> np.ndarray:
    """Tokens that are nearly equal (x_t = x_0 + 1e-3 noise), so every softmax row is nearly uniform."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((1, 1, c))
    return x0 + 1e-3 * rng.standard_normal((2, n, c))


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_dropping_all_zero_branch_is_bit_for_bit(preset):
    """Sec. 3.2.2: when every softmax weight is <= eps the masked branch is exactly 0 (sums of exact zeros), so
    training output (branch on) and inference output (branch dropped) agree bit for bit."""
    n, c, h = 64, 12, 3
    if preset == "paper":
        cfg_on = A.CastlingConfig(dim=c, num_heads=h)
        on = dict(cfg=cfg_on, training=True)
        off = dict(cfg=cfg_on, training=False)
    else:
        cfg_on = A.CastlingConfig.preset("official", dim=c, num_heads=h, sparse="always")
        on = dict(cfg=cfg_on, training=True)
        off = dict(cfg=A.CastlingConfig.preset("official", dim=c, num_heads=h, sparse="off"), training=True)
    params = A.init_castling_params(cfg_on, 3)
    x = _flat_tokens(n, c, 4)
    taps = {}
    y_on = A.castling_attention(x, params, on["cfg"], training=on["training"], taps=taps)
    assert np.max(taps["sparse_weights"]) <= config.CASTLING_SPARSE_EPS  # the precondition holds
    np.testing.assert_array_equal(taps["sparse"], 0.0)
    y_off = A.castling_attention(x, params, off["cfg"], training=off["training"])
    np.testing.assert_array_equal(y_on, y_off)
    # and the switch matters when some weight exceeds eps (few tokens: the weights are about 1/n > eps)
    xs = x[:, :4]
    assert not np.array_equal(A.castling_attention(xs, params, on["cfg"], training=on["training"]),
                              A.castling_attention(xs, params, off["cfg"], training=off["training"]))


# ===================================================================================================
# The layer: loop oracle, presets, zero rows, taps, validation
# ===================================================================================================

_VARIANTS = [
    ("official", {}),
    ("official", {"sparse": "always"}),
    ("paper", {}),
    ("paper", {"normaliser": "similarity_sum", "qkv_bias": True}),
    ("paper", {"order": 1, "conv": "none"}),
    ("paper", {"conv": "grid2d", "conv_kernel": 3, "conv_bias": True}),
    ("paper", {"constant": "own", "sparse_logits": "scaled_raw", "conv_kernel": 3}),
]


@pytest.mark.parametrize("preset,over", _VARIANTS)
def test_layer_matches_loop_oracle(preset, over):
    """Eq. 8-10 and the official layout (qkv split (B,N,3,h,d), the (k,1) conv along tokens with heads as
    channels, l2 then conv): the vectorised reference equals the token-by-token loop oracle within twice the
    float64 bound (the oracle's fsum dot products are at least as accurate as the reference)."""
    cfg = A.CastlingConfig.preset(preset, dim=6, num_heads=2, **over)
    params = A.init_castling_params(cfg, 11)
    x = np.random.default_rng(12).standard_normal((2, 6, 6))
    for training in (False, True):
        got = A.castling_attention(x, params, cfg, training=training, hw=(2, 3))
        ref = NA.naive_castling(x, params, cfg, training=training, hw=(2, 3))
        b = A.castling_attention_bound(x, params, cfg, dtype=np.float64, training=training, hw=(2, 3))
        assert_within(got, ref, Bound(2 * b.scale, b.k, b.note), name=f"{preset} {over} training={training}")


def test_official_zero_row_nan_and_paper_finite():
    """Official preset: q / ||q|| with no eps, so a zero token (x_t = 0, no qkv bias, hence q_t = k_t = v_t = 0)
    makes k^_t NaN, which reaches every query through K^^T V: the whole batch element is NaN, the others stay
    finite (as the released code computes).  The paper mode (clamp eps) stays finite.  A zero head of V makes
    the official output-l2 argument 0 for every token of that head: 0/0 = NaN there too."""
    cfg_o = A.CastlingConfig.preset("official", dim=6, num_heads=2)
    cfg_p = A.CastlingConfig.preset("paper", dim=6, num_heads=2, normaliser="similarity_sum")
    x = np.random.default_rng(0).standard_normal((2, 5, 6))
    x[1, 2] = 0.0
    y_o = A.castling_attention(x, A.init_castling_params(cfg_o, 1), cfg_o)
    assert np.all(np.isnan(y_o[1])) and np.all(np.isfinite(y_o[0]))
    for training in (False, True):
        assert np.all(np.isfinite(A.castling_attention(x, A.init_castling_params(cfg_p, 1), cfg_p,
                                                       training=training)))
    q = np.random.default_rng(1).standard_normal((1, 2, 4, 3))
    v = q.copy()
    v[0, 1] = 0.0
    out = A.castling_core(q, q, v, cfg_o, conv_weight=np.zeros((2, 1, 9, 1)))
    assert np.all(np.isnan(out[0, 1])) and np.all(np.isfinite(out[0, 0]))
    assert np.all(np.isfinite(A.castling_core(q, q, v, core_cfg(2, 3))))


def test_near_zero_rows_are_scale_invariant():
    """Eq. 4: the angle ignores the norms, so scaling a token's q or k row changes nothing beyond rounding as
    long as the normalisation divides by the true norm: by 1e-150 in the official preset (no eps; its
    sqrt(sum x^2) is still exact to rounding, the squares 1e-300 being normal) and by 1e-10 in the paper preset
    (the norm stays above its clamp eps = 1e-12; below it the paper mode deliberately shrinks q^ towards 0,
    Sim -> 1/2).  At 1e-170 the official (released) arithmetic squares below the subnormal range and gives
    inf/NaN, while norm_arithmetic="scaled" stays exact."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)) for _ in range(3))
    official = A.CastlingConfig.preset("official", dim=4, num_heads=1, conv="none")
    for cfg, factor in ((core_cfg(1, 4), 1e-10), (official, 1e-150),
                        (A.CastlingConfig.preset("official", dim=4, num_heads=1, conv="none",
                                                 norm_arithmetic="scaled"), 1e-170)):
        q2, k2 = q.copy(), k.copy()
        q2[..., 1, :] *= factor
        k2[..., 3, :] *= factor
        a, b = A.castling_core(q, k, v, cfg), A.castling_core(q2, k2, v, cfg)
        bnd = A.castling_core_bound(q, k, v, cfg, dtype=np.float64)
        assert_within(b, a, Bound(2 * bnd.scale, bnd.k, bnd.note), name=f"rows scaled by {factor}")
    q3 = q.copy()
    q3[..., 1, :] *= 1e-170
    out = A.castling_core(q3, k, v, official)
    assert not np.all(np.isfinite(out[..., 1, :])) and np.all(np.isfinite(np.delete(out, 1, axis=-2)))
    tiny = q.copy()
    tiny[..., 1, :] *= 1e-20  # below eps: the paper mode maps the row to q / eps, nearly 0, so Sim ~ 1/2
    taps = {}
    paper = core_cfg(1, 4)
    assert np.linalg.norm(tiny[0, 0, 1]) < paper.qk_norm_eps
    A.castling_core(tiny, k, v, paper, taps=taps)
    # q / max(||q||, eps) with ||q|| < eps is the one division q / eps, correctly rounded on both sides
    np.testing.assert_array_equal(taps["q_hat"][0, 0, 1], tiny[0, 0, 1] / paper.qk_norm_eps)


def test_presets_and_param_keys():
    """Rule 7: the official preset is the released computation, each departure a named field."""
    o = A.CastlingConfig.preset("official", dim=16, num_heads=4)
    assert (o.constant, o.normaliser, o.qk_norm, o.norm_arithmetic, o.conv, o.conv_kernel, o.conv_bias,
            o.sparse, o.sparse_logits, o.order, o.qkv_bias) == ("own", "output_l2", "none", "naive", "tokens1d",
                                                                9, False, "off", "scaled_raw", 0, False)
    p = A.CastlingConfig.preset("paper", dim=16, num_heads=4)
    assert p == A.CastlingConfig(dim=16, num_heads=4)
    assert o.param_shapes() == {"qkv.weight": (48, 16), "proj.weight": (16, 16), "proj.bias": (16,),
                                "dconv.weight": (4, 1, 9, 1)}
    assert A.CastlingConfig.preset("official", dim=16, num_heads=4, sparse="always").sparse_active(False)
    assert not p.sparse_active(False) and p.sparse_active(True)


def test_taps_record_documented_intermediates():
    """Rule 5: the documented taps exist with the documented shapes."""
    cfg = A.CastlingConfig(dim=6, num_heads=2, normaliser="similarity_sum")
    taps = {}
    A.castling_attention(np.ones((1, 4, 6)) + np.arange(24).reshape(1, 4, 6) % 5, A.init_castling_params(cfg),
                         cfg, training=True, taps=taps)
    for name, shape in {"q": (1, 2, 4, 3), "q_hat": (1, 2, 4, 3), "k_hat": (1, 2, 4, 3), "kv": (1, 2, 3, 3),
                        "linear": (1, 2, 4, 3), "constant": (1, 2, 4, 3), "denominator": (1, 2, 4),
                        "angular": (1, 2, 4, 3), "dwc": (1, 2, 4, 3), "sparse_weights": (1, 2, 4, 4),
                        "sparse_mask": (1, 2, 4, 4), "sparse": (1, 2, 4, 3), "heads": (1, 4, 6)}.items():
        assert taps[name].shape == shape, name


def test_validation_errors():
    """Rule 4: bad inputs raise errors naming the argument, expected and given shape/dtype."""
    q = np.zeros((1, 1, 4, 3))
    with pytest.raises(TypeError, match="'q'"):
        A.linear_angular_attention(q.astype(int), q, q)
    with pytest.raises(ValueError, match="'v'"):
        A.linear_angular_attention(q, q, np.zeros((1, 1, 5, 3)))
    with pytest.raises(ValueError, match="odd"):
        A.token_conv(q, np.zeros((1, 1, 4, 1)))
    with pytest.raises(ValueError, match="conv_kernel"):
        A.CastlingConfig(dim=4, num_heads=2, conv_kernel=4)
    with pytest.raises(ValueError, match="dim"):
        A.CastlingConfig(dim=5, num_heads=2)
    with pytest.raises(ValueError, match="normaliser"):
        A.CastlingConfig(dim=4, num_heads=2, normaliser="softmax")
    with pytest.raises(ValueError, match="hw"):
        A.grid_conv(q, np.zeros((3, 1, 3, 3)), hw=(3, 3))
    with pytest.raises(ValueError, match="linear_angular_attention"):
        A.angular_attention(q, q, q, max_elements=3)
    with pytest.raises(ValueError, match="angular_attention_features"):
        A.angular_similarity(q, q, method="arccos", max_elements=3)
    with pytest.raises(ValueError, match="training=False"):
        A.masked_softmax_branch(q, q, q, max_elements=3)
    with pytest.raises(KeyError, match="missing"):
        A.castling_attention(np.zeros((1, 4, 4)), {}, A.CastlingConfig(dim=4, num_heads=2))
    with pytest.raises(ValueError, match="order"):
        A.arcsin_series(np.zeros(2), -1)


def test_token_conv_is_banded_toeplitz_matrix():
    """Eq. 9: M_DW V with M_DW the per-head banded Toeplitz matrix (M_DW)_{n, n + t - k//2} = w_t, identical for
    every column of V: the (k, 1) conv equals that explicit matrix product (exact: same products and sums)."""
    rng = np.random.default_rng(2)
    v = rng.standard_normal((2, 3, 7, 4))
    w = rng.standard_normal((3, 1, 5, 1))
    got = A.token_conv(v, w)
    for hh in range(3):
        m = np.zeros((7, 7))
        for n in range(7):
            for t in range(5):
                if 0 <= n + t - 2 < 7:
                    m[n, n + t - 2] = w[hh, 0, t, 0]
        ref = m @ v[:, hh]
        numerics.assert_close(got[:, hh], ref, Bound(np.abs(m) @ np.abs(v[:, hh]), 5, "length-5 sums"),
                              np.float64, name="toeplitz")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("preset,over", [("paper", {}), ("official", dict(qkv_bias=True, sparse="always"))])
def test_castling_bound_charges_qkv_and_proj_by_the_calculus_linear_rule(dtype, preset, over, monkeypatch):
    """castling_attention_bound takes the error of both linear maps from refimpl.bounds.e_linear in the bound's
    precision (first order with the underflow term): the qkv term is k (|x||W|^T + |b|) + C eta with
    k = sum_depth(C) + [bias] (Higham 3.12, the sums accumulated in config.ACCUMULATION_FORMAT), the bound's
    E is the output projection's e_linear, and K counts both maps' k."""
    from refimpl import bounds, layers
    cfg = A.CastlingConfig.preset(preset, dim=6, num_heads=2, **over)
    params = A.init_castling_params(cfg, 3)
    x = np.random.default_rng(4).standard_normal((2, 6, 6))
    calls = []
    orig = bounds.e_linear

    def spy(x_, ex_, w_, b_, pr_, **kw):
        calls.append((w_, b_, pr_, orig(x_, ex_, w_, b_, pr_, **kw)))
        return calls[-1][-1]

    monkeypatch.setattr(bounds, "e_linear", spy)
    b = A.castling_attention_bound(x, params, cfg, dtype=dtype, training=True, hw=(2, 3))
    monkeypatch.undo()
    assert len(calls) == 2
    (wq, bq, prq, e_qkv), (wp, bp, prp, e_proj) = calls
    eta_u = numerics.underflow_eta(dtype) / numerics.unit_roundoff(dtype)
    assert prq == prp == bounds.Precision.coefficients(dtype, eta_u)
    np.testing.assert_array_equal(wq, params["qkv.weight"])
    np.testing.assert_array_equal(wp, params["proj.weight"])
    assert (bq is None) == (not cfg.qkv_bias) and bp is params["proj.bias"]
    k_qkv = numerics.sum_depth(6, dtype) + (1 if cfg.qkv_bias else 0)
    s_qkv = layers.linear(np.abs(x), np.abs(params["qkv.weight"]),
                          np.abs(params["qkv.bias"]) if cfg.qkv_bias else None)
    # the same float64 formula evaluated in another order: a 6-term sum, the product by k and the eta term
    np.testing.assert_allclose(e_qkv, k_qkv * s_qkv + 6 * eta_u, rtol=verdict.gamma(8, U64), atol=0)
    if dtype in ("float16", "bfloat16"):
        assert k_qkv < 6
    np.testing.assert_allclose(b.scale * b.k, e_proj, rtol=verdict.gamma(2, U64), atol=0)   # E / K, then * K
    assert b.k >= 2 * numerics.sum_depth(6, dtype) + (1 if cfg.qkv_bias else 0) + 1


def test_the_deprecated_spelling_normalizer_still_works_and_warns():
    """The option was spelled ``normalizer`` before the house spelling ``normaliser``: the old keyword of
    CastlingConfig, its preset, linear_angular_attention and its bound, and the old attribute, give the same
    values with a DeprecationWarning on the caller's line; both spellings with different values are refused."""
    import dataclasses
    import warnings

    from refimpl.errors import ArgumentError
    new = A.CastlingConfig(8, 2, normaliser="similarity_sum")
    with pytest.warns(DeprecationWarning, match="'normalizer' is deprecated, use 'normaliser'") as rec:
        old = A.CastlingConfig(8, 2, normalizer="similarity_sum")
    assert old == new and rec[0].filename == __file__
    with pytest.warns(DeprecationWarning):
        assert A.CastlingConfig.preset("official", dim=8, num_heads=2, normalizer="similarity_sum").normaliser == \
            "similarity_sum"
    with pytest.warns(DeprecationWarning, match="CastlingConfig.normalizer is deprecated"):
        assert new.normalizer == "similarity_sum"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # the new spelling warns nowhere
        assert dataclasses.replace(new, order=1).normaliser == "similarity_sum"
    with pytest.raises(ArgumentError, match="disagree"), pytest.warns(DeprecationWarning):
        A.CastlingConfig(8, 2, normaliser="similarity_sum", normalizer="output_l2")
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 3))
    with pytest.warns(DeprecationWarning):
        out = A.linear_angular_attention(q, k, v, normalizer="similarity_sum")
    assert np.array_equal(out, A.linear_angular_attention(q, k, v, normaliser="similarity_sum"))
    with pytest.warns(DeprecationWarning):
        b = A.linear_angular_attention_bound(q, k, v, normalizer="similarity_sum")
    assert np.array_equal(b.scale, A.linear_angular_attention_bound(q, k, v, normaliser="similarity_sum").scale)
