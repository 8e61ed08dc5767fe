"""Properties of FLatten's focused linear attention (refimpl.attention.focused), each citing its equation.

Comparisons of two float64 computations use the reference's running bound for *both* sides (the bound
limits each side's distance to the exact value, so their difference is within twice it):
``tests.kernel_helpers.twice_bound``.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from equivalence.strategies import KINDS, generate
from refimpl import analysis, config, numerics
from refimpl.attention import focused as F
from tests import naive_focused as NF
from tests.kernel_helpers import twice_bound

mpmath.mp.dps = 50
PS = (1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 32.0)


def _assert_orders_close(a, b, bound, den, n_terms: int) -> None:
    """assert_close, except that rows whose normaliser is so small that subnormal products (absolute error up
    to 2^-1074 each, n_terms of them) rival u * den are held to the bound and the NaN/Inf pattern only: there
    both orders lose relative accuracy legitimately (the verdict on the other rows gets a zero bound here)."""
    normal = (np.abs(den) > n_terms * 2.0 ** -1074 / numerics.unit_roundoff("float64"))[..., None]
    numerics.assert_close(np.where(normal, a, 0.0), np.where(normal, b, 0.0),
                          numerics.Bound(np.where(normal, np.asarray(bound.scale), 0.0), bound.k, bound.note),
                          "float64")
    rep = numerics.compare(a, b, bound, "float64")
    assert rep.pattern_ok and rep.within_bound, str(rep)


def _norm(x: np.ndarray) -> np.ndarray:
    """||x|| along the last axis as m ||x / m|| (no overflow / underflow), independent of refimpl."""
    m = np.max(np.abs(x), axis=-1, keepdims=True)
    safe = np.where(m > 0, m, 1.0)
    return (m * np.sqrt(np.sum((x / safe) ** 2, axis=-1, keepdims=True)))[..., 0]


# ===================================================================================================
# The focused function (Eq. 6, Appendix Eq. 18-21)
# ===================================================================================================

@given(st.integers(0, 2**32 - 1), st.sampled_from(KINDS), st.integers(1, 5), st.integers(1, 70),
       st.sampled_from(PS + (200.0,)), st.integers(-280, 280))
def test_focused_function_keeps_the_norm_and_is_non_negative(seed, kind, n, d, p, e10):
    """||f_p(x)|| = ||x|| (Appendix Eq. 18) and f_p(x) >= 0, for p up to 200 and |x| from 1e-280 to 1e280:
    the max-scaled evaluation never overflows nor gives 0/0.  Norm error bound: ||E_f|| + 2 (d + 2) ||x||
    (f's coefficient, then both norms' roundings)."""
    x = numerics.relu(generate(seed, kind, (n, d))) * 10.0 ** e10
    f = F.focused_function(x, p)
    assert np.all(f >= 0)
    assert np.all(np.isfinite(f))
    nf, nx = _norm(f), _norm(x)
    e = _norm(F.focused_function_error(x, p)) + 2.0 * (d + 2) * nx
    kk = int(2 * p + 2 * d + 20)
    numerics.assert_close(nf, nx, numerics.Bound(e / kk, kk, "||f|| vs ||x||: E_f propagated + two norms"),
                          "float64", name="norm")


@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 40), st.sampled_from(PS),
       st.integers(-200, 200))
def test_focused_function_is_exactly_homogeneous_under_powers_of_two(seed, n, d, p, k2):
    """f_p(2^k x) = 2^k f_p(x) bit for bit: f_p is homogeneous of degree 1 (Eq. 6), and the max-scaled
    evaluation sees exactly the same r = x / max(x) (scaling by 2^k is exact away from over/underflow)."""
    x = np.abs(np.random.default_rng(seed).standard_normal((n, d))) + 0.1
    np.testing.assert_array_equal(F.focused_function(x * 2.0 ** k2, p), F.focused_function(x, p) * 2.0 ** k2)


def test_large_p_underflow_is_avoided_by_max_scaling_only():
    """x**p as written underflows: for x = (1e-3, 5e-4) and p = 200, ||x**p|| = 0 and Eq. (6) evaluates to
    0/0 = NaN (what the released arithmetic does, power_scaling="none"); the max-scaled evaluation gives the
    limit (||x||, 0) up to 2^-200 relative."""
    x = np.array([[1e-3, 5e-4]])
    assert np.all(np.isnan(F.focused_function(x, 200.0, power_scaling="none")))
    f = F.focused_function(x, 200.0)
    # exactly f_1 / f_0 = (x_1 / x_0)^200 = 2^-200 (fl(5e-4) = fl(1e-3) / 2: rounding commutes with scaling by 2);
    # computed, r_1's quotient (raised to the power 200: 200 roundings), the two powers (c each), the two
    # quotients by ||t|| and the two products by ||x|| (4) separate the ratio from it: n = 200 + 2c + 4
    n = 200 + 2 * config.ELEMENTARY_FUNCTION_ULPS + 4
    assert f[0, 1] <= 2.0 ** -200 * (1 + numerics.gamma(n, numerics.unit_roundoff("float64"))) * f[0, 0]
    numerics.assert_close(f[0, 0], math.hypot(1e-3, 5e-4), numerics.Bound(np.array(1e-3 * 2), 410,
                          "2p + 2d + 8 roundings of f_p"), "float64")


def test_zero_vector_maps_to_zero_and_nan_propagates():
    """f_p(0) = 0 (the limit; ||f_p(x)|| = ||x||); a NaN feature makes the token NaN (never hidden)."""
    np.testing.assert_array_equal(F.focused_function(np.zeros((2, 3)), 3.0), np.zeros((2, 3)))
    f = F.focused_function(np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]]), 3.0)
    assert np.all(np.isnan(f[0])) and np.all(np.isfinite(f[1]))


@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from((1.0, 2.0, 3.0, 5.0, 8.0, 32.0)))
@settings(max_examples=10)  # 50-digit mpmath evaluation per example; lowered for runtime
def test_focused_function_matches_mpmath(seed, d, p):
    """The float64 f_p against Eq. (6) evaluated with 50 significant digits, within f_p's bound."""
    x = np.abs(np.random.default_rng(seed).standard_normal((1, d)))
    xm = [mpmath.mpf(float(t)) for t in x[0]]
    nx = mpmath.sqrt(sum(t * t for t in xm))
    xp = [t ** int(p) for t in xm]
    nxp = mpmath.sqrt(sum(t * t for t in xp))
    want = np.array([[float(nx / nxp * t) for t in xp]])
    numerics.assert_close(F.focused_function(x, p), want, F.focused_function_bound(x, p), "float64")


# ===================================================================================================
# Proposition 1 (Eq. 7-8; Appendix Eq. 15-29)
# ===================================================================================================

def _prop1_pair(seed: int, d: int, same: bool) -> tuple[np.ndarray, np.ndarray]:
    """x, y >= 0 with single largest coordinates (a gap of at least 1e-3 relative), argmax equal or not,
    and 0 < <x, y> < ||x|| ||y|| (the appendix's assumption)."""
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0, 1, d), rng.uniform(0, 1, d)
    m = int(rng.integers(d))
    n = m if same else (m + 1 + int(rng.integers(d - 1))) % d
    x[m] = (np.max(np.delete(x, m)) if d > 1 else 0.5) * (1.001 + rng.uniform(0, 2))
    y[n] = (np.max(np.delete(y, n)) if d > 1 else 0.5) * (1.001 + rng.uniform(0, 2))
    return x, y


def _first_p(x, y, better) -> float | None:
    """The first p = 2^j (j = 1..24) at which better(<phi_p(x), phi_p(y)>, <x, y>) holds, or None."""
    base = float(np.dot(x, y))
    for j in range(1, 25):
        p = 2.0 ** j
        if better(float(np.dot(F.focused_feature_map(x, p), F.focused_feature_map(y, p))), base):
            return p
    return None


@given(st.integers(0, 2**32 - 1), st.integers(2, 40))
def test_proposition_1_same_argmax_raises_similarity(seed, d):
    """Proposition 1, Eq. (7)/(15): x, y >= 0 with the single largest coordinate at the same index m = n:
    some p > 1 gives <phi_p(x), phi_p(y)> > <x, y> (found among p = 2^j, j <= 24; the stable evaluation
    reaches the limit ||x|| ||y|| of Eq. 25 exactly once r**p underflows)."""
    x, y = _prop1_pair(seed, d, same=True)
    # no margin: at p = 2^24 (r**p underflows below the largest entry, 1.001 times the next) the features are
    # ||x|| e_m, ||y|| e_m with the norms evaluated as _norm does (feature_maps.norm_scaled), so their computed
    # dot product is fl(_norm(x) _norm(y)) exactly, and exceeds <x, y> as computed whenever this holds
    assume(np.dot(x, y) < _norm(x) * _norm(y))
    p = _first_p(x, y, lambda a, b: a > b)
    assert p is not None and p > 1


@given(st.integers(0, 2**32 - 1), st.integers(2, 40))
def test_proposition_1_different_argmax_lowers_similarity(seed, d):
    """Proposition 1, Eq. (8)/(16): argmaxes m != n: some p > 1 gives <phi_p(x), phi_p(y)> < <x, y> (the
    limit is 0, Eq. 28)."""
    x, y = _prop1_pair(seed, d, same=False)
    p = _first_p(x, y, lambda a, b: a < b)
    assert p is not None and p > 1


def test_proposition_1_needs_the_appendix_assumption():
    """The main text's Proposition 1 omits the appendix's assumption 0 < <x, y> < ||x|| ||y||, and both
    inequalities fail without it: orthogonal x, y (m != n) keep <phi_p(x), phi_p(y)> = 0 = <x, y> for every
    p (never '<'), and parallel x, y (m = n) keep <phi_p(x), phi_p(y)> = ||x|| ||y|| = <x, y> (never '>')."""
    x, y = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    for p in (2.0, 3.0, 32.0, 1024.0):
        assert float(np.dot(F.focused_feature_map(x, p), F.focused_feature_map(y, p))) == 0.0
    x = np.array([3.0, 1.0, 0.5])
    y = 2.0 * x
    for p in (2.0, 3.0, 32.0):
        got = float(np.dot(F.focused_feature_map(x, p), F.focused_feature_map(y, p)))
        numerics.assert_close(got, float(np.dot(x, y)), numerics.Bound(np.array(2 * float(np.dot(x, y))), 90,
                              "f_p coefficient + dot product, float64"), "float64")


# ===================================================================================================
# Rank (Eq. 9, 11) and the DWC branch as an attention matrix
# ===================================================================================================

def _qkv(seed, b, h, n, d, kind="normal"):
    rng = np.random.default_rng(seed)
    # |.| + 0.1 keeps every query alive (a dead query is 0/0 in Eq. 4, tested separately)
    q = np.abs(generate(int(rng.integers(2**32)), kind, (b, h, n, d))) + 0.1
    k = np.abs(generate(int(rng.integers(2**32)), kind, (b, h, n, d))) + 0.1
    v = generate(int(rng.integers(2**32)), "normal", (b, h, n, d))
    return q, k, v


@given(st.integers(0, 2**32 - 1), st.sampled_from(((4, 4), (3, 5), (5, 6))), st.integers(1, 3),
       st.sampled_from((2.0, 3.0, 8.0)))
@settings(max_examples=10)  # SVDs of N x N matrices; lowered for runtime
def test_rank_of_phi_q_phi_k_is_at_most_d_and_dwc_restores_full_rank(seed, hw, d, p):
    """Eq. (9): rank(phi_p(Q) phi_p(K)^T) <= min(N, d); Eq. (11): M_eq = A + M_DWC (A the normalised
    attention) reaches rank N for a generic (random) 3 x 3 kernel, although A's rank is at most d < N."""
    n = hw[0] * hw[1]
    q, k, v = _qkv(seed, 1, 1, n, d)
    taps: dict = {}
    F.focused_attention(q, k, v, p=p, order="quadratic", taps=taps)
    assert analysis.numerical_rank(taps["scores"])[0, 0] <= min(n, d)
    assert analysis.numerical_rank(taps["attn"])[0, 0] <= min(n, d)
    kernel = np.random.default_rng(seed + 1).standard_normal((3, 3))
    m_eq = analysis.equivalent_attention_matrix(taps["attn"][0, 0], kernel, *hw)
    assert analysis.numerical_rank(m_eq) == n


@given(st.integers(0, 2**32 - 1), st.sampled_from(((4, 4), (3, 5), (2, 7))), st.integers(1, 2),
       st.integers(1, 4), st.sampled_from((3, 5)), st.sampled_from((2.0, 3.0, 32.0)))
@settings(max_examples=15)
def test_dwc_branch_is_the_sparse_matrix_m_dwc(seed, hw, h, d, ks, p):
    """Eq. (10)-(11): O = A V + DWC(V) = (A + M_DWC) V per channel, M_DWC the conv's sparse N x N matrix
    (analysis.dwc_matrix); the module's taps "attention" + "dwc" against M_eq V."""
    n = hw[0] * hw[1]
    q, k, v = _qkv(seed, 1, h, n, d)
    rng = np.random.default_rng(seed + 7)
    w, bias = rng.standard_normal((h * d, 1, ks, ks)), np.zeros(h * d)
    taps: dict = {}
    out = F.focused_attention(q, k, v, p=p, hw=hw, dwc_weight=w, dwc_bias=bias, order="quadratic", taps=taps)
    want = np.empty_like(out)
    for hh in range(h):
        for c in range(d):
            m_eq = analysis.equivalent_attention_matrix(taps["attn"][0, hh], w[hh * d + c, 0], *hw)
            want[0, hh, :, c] = m_eq @ v[0, hh, :, c]
    b = F.focused_attention_bound(q, k, v, p=p, hw=hw, dwc_weight=w, dwc_bias=bias)
    numerics.assert_close(out, want, twice_bound(b), "float64")


# ===================================================================================================
# Associativity and the normaliser variants (Eq. 3-4)
# ===================================================================================================

@given(st.integers(0, 2**32 - 1), st.sampled_from(KINDS), st.integers(1, 2), st.integers(1, 3),
       st.integers(1, 40), st.integers(1, 70), st.sampled_from(PS), st.sampled_from(("sum", "mean_scaled")),
       st.sampled_from((0.0, 1e-6)))
def test_both_association_orders_agree(seed, kind, b, h, n, d, p, normaliser, eps):
    """(phi Q phi K^T) V = phi Q (phi K^T V) (Eq. 3 -> 4), for N < d and N > d, both normalisers, all input
    kinds (dead ReLU features give 0/0 = NaN in both orders when eps = 0)."""
    rng = np.random.default_rng(seed)
    q, k, v = (generate(int(rng.integers(2**32)), kind, (b, h, n, d)) for _ in range(3))
    taps: dict = {}
    lin = F.focused_attention(q, k, v, p=p, normaliser=normaliser, eps=eps, taps=taps)
    quad = F.focused_attention(q, k, v, p=p, normaliser=normaliser, eps=eps, order="quadratic")
    bd = F.focused_attention_bound(q, k, v, p=p, normaliser=normaliser, eps=eps, dtype="float64")
    _assert_orders_close(lin, quad, twice_bound(bd), taps["denominator"], n * d)


@given(st.integers(0, 2**32 - 1), st.integers(1, 30), st.integers(1, 16), st.sampled_from((1e-6, 1e-2)))
def test_mean_scaled_normaliser_is_eq4_with_n_eps(seed, n, d, eps):
    """The released normaliser q.mean(k) + eps with n^-1/2-scaled K, V equals Eq. (4) with den + n eps."""
    q, k, v = _qkv(seed, 1, 2, n, d)
    a = F.focused_attention(q, k, v, normaliser="mean_scaled", eps=eps)
    b = F.focused_attention(q, k, v, normaliser="sum", eps=n * eps)
    bd = F.focused_attention_bound(q, k, v, normaliser="sum", eps=n * eps)
    numerics.assert_close(a, b, numerics.Bound(2 * np.asarray(bd.scale), bd.k + 6, bd.note + "; +6 roundings of "
                          "the scalings, the mean and 1/den; x2 both float64"), "float64")


def test_dead_queries_give_nan_in_the_paper_and_zero_attention_officially():
    """All-negative pre-activations: phi_p(q) = 0, so Eq. (4)'s normaliser is 0 and the paper's output is
    0/0 = NaN (never silently replaced); the released + 1e-6 eps gives attention 0 instead."""
    q = -np.ones((1, 1, 3, 4))
    k = np.abs(np.random.default_rng(0).standard_normal((1, 1, 5, 4)))
    v = np.ones((1, 1, 5, 4))
    assert np.all(np.isnan(F.focused_attention(q, k, v)))
    np.testing.assert_array_equal(F.focused_attention(q, k, v, normaliser="mean_scaled", eps=1e-6), 0.0)


# ===================================================================================================
# Modules: associativity for every layout and preset; presets against the naive oracles
# ===================================================================================================

def _x_and_params(seed, cfg, layout, hw, n_kv, kind, b=1):
    x = generate(seed, kind, (b, hw[0] * hw[1], cfg.dim))
    params = F.init_focused_params(cfg, layout=layout, n_kv=n_kv, seed=seed % 1000)
    return x, params


@given(st.integers(0, 2**32 - 1), st.sampled_from(("paper", "official")), st.sampled_from((1, 2)),
       st.sampled_from(((4, 4), (4, 6), (6, 2))), st.sampled_from(((4, 1), (6, 2), (8, 4))),
       st.sampled_from(PS), st.sampled_from(KINDS))
@settings(max_examples=20)
def test_global_module_orders_agree(seed, preset, sr, hw, ch, p, kind):
    """DeiT (sr = 1) / PVT (sr = 2) layout: both association orders agree through the whole module."""
    cfg = F.FocusedConfig.preset(preset, dim=ch[0], num_heads=ch[1], sr_ratio=sr, p=p, kernel_size=3)
    x, params = _x_and_params(seed, cfg, "global", hw, (hw[0] // sr) * (hw[1] // sr), kind)
    lin = F.focused_linear_attention(x, params, cfg, hw)
    quad = F.focused_linear_attention(x, params, cfg, hw, order="quadratic")
    bd = F.focused_linear_attention_bound(x, params, cfg, hw, dtype="float64")
    numerics.assert_close(lin, quad, twice_bound(bd), "float64")


@given(st.integers(0, 2**32 - 1), st.sampled_from(("paper", "official")), st.sampled_from((2, 3)),
       st.integers(0, 2), st.sampled_from(PS), st.sampled_from(KINDS))
@settings(max_examples=20)
def test_window_module_orders_agree_with_and_without_the_shift_mask(seed, preset, ws, shift, p, kind):
    """Swin layout: both orders agree; with a shift the paper preset's masked linear order (queries grouped by
    mask row) equals the masked quadratic order."""
    shift = shift % ws
    hw = (2 * ws, ws)
    cfg = F.FocusedConfig.preset(preset, dim=6, num_heads=2, p=p, kernel_size=3)
    x, params = _x_and_params(seed, cfg, "window", hw, ws * ws, kind)
    kw = dict(window_size=ws, shift=shift)
    lin = F.focused_window_attention(x, params, cfg, hw, **kw)
    quad = F.focused_window_attention(x, params, cfg, hw, order="quadratic", **kw)
    bd = F.focused_window_attention_bound(x, params, cfg, hw, dtype="float64", **kw)
    numerics.assert_close(lin, quad, twice_bound(bd), "float64")


@pytest.mark.parametrize("official,sr,hw", [(True, 1, (3, 4)), (True, 2, (4, 4)), (False, 1, (3, 4)),
                                            (False, 2, (4, 6))])
def test_global_module_matches_the_naive_oracle(official, sr, hw):
    """Official preset (ReLU + 1e-6, / softplus(s), norms over all C channels, APE on K, mean normaliser,
    shared DWC bank, flat 1-D resampling) and paper preset, against tests/naive_focused.py's token loops."""
    cfg = F.FocusedConfig.preset("official" if official else "paper", dim=6, num_heads=2, sr_ratio=sr,
                                 kernel_size=3)
    n_kv = (hw[0] // sr) * (hw[1] // sr)
    x, params = _x_and_params(11 + sr, cfg, "global", hw, n_kv, "normal", b=2)
    params["q.bias"] = params["q.bias"] + 1.0   # keep every head's query alive (no paper 0/0)
    got = F.focused_linear_attention(x, params, cfg, hw)
    want = NF.focused_global(x, params, dim=6, heads=2, hw=hw, p=cfg.p, sr=sr, official=official)
    assert np.all(np.isfinite(got))
    numerics.assert_close(got, want, twice_bound(F.focused_linear_attention_bound(x, params, cfg, hw)), "float64")


@pytest.mark.parametrize("shift", [0, 1])
def test_official_window_module_matches_the_naive_oracle(shift):
    """Official Swin layout (mask ignored even when shifted) against the window-by-window loops, whose cyclic
    shift is index arithmetic rather than np.roll."""
    cfg = F.FocusedConfig.preset("official", dim=6, num_heads=2, kernel_size=3)
    hw = (4, 6)
    x, params = _x_and_params(5, cfg, "window", hw, 4, "normal", b=2)
    got = F.focused_window_attention(x, params, cfg, hw, window_size=2, shift=shift)
    want = NF.focused_swin_official(x, params, dim=6, heads=2, hw=hw, ws=2, shift=shift, p=cfg.p)
    bd = F.focused_window_attention_bound(x, params, cfg, hw, window_size=2, shift=shift)
    numerics.assert_close(got, want, twice_bound(bd), "float64")


def test_official_ignores_the_shift_mask_and_paper_applies_it():
    """With a shift, the official preset equals the paper-mask-off computation exactly (shift_mask is its
    only role here), while the masked output differs in windows that straddle the wrap-around."""
    cfg_o = F.FocusedConfig.preset("official", dim=4, num_heads=1, kernel_size=3)
    hw = (4, 4)
    x, params = _x_and_params(3, cfg_o, "window", hw, 4, "normal")
    a = F.focused_window_attention(x, params, cfg_o, hw, window_size=2, shift=1)
    cfg_m = F.FocusedConfig.preset("official", dim=4, num_heads=1, kernel_size=3, shift_mask="apply")
    taps: dict = {}
    b = F.focused_window_attention(x, params, cfg_m, hw, window_size=2, shift=1, taps=taps)
    cfg_n = F.FocusedConfig.preset("official", dim=4, num_heads=1, kernel_size=3, shift_mask="ignore")
    np.testing.assert_array_equal(a, F.focused_window_attention(x, params, cfg_n, hw, window_size=2, shift=1))
    assert not taps["mask"].all() and np.any(a != b)


def test_resample_linear_matches_loops_and_is_exact_at_equal_size():
    """The half-pixel linear resampling of V (DWC input for sr > 1) against the naive loop, and the identity
    when the size does not change (src = i, lambda = 0)."""
    x = np.random.default_rng(1).standard_normal((3, 5))
    for size in (5, 7, 10, 20):
        got = F.resample_linear(x, size, axis=-1)
        want = np.array([NF.interp_linear(list(row), size) for row in x])
        numerics.assert_close(got, want, twice_bound(F.resample_linear_bound(x, size, axis=-1)), "float64")
    np.testing.assert_array_equal(F.resample_linear(x, 5, axis=-1), x)


# ===================================================================================================
# Presets, taps, validation
# ===================================================================================================

def test_presets_name_every_departure():
    """'paper' is the default (Eq. 5-12), 'official' flips exactly the released departures."""
    assert F.FocusedConfig(dim=8, num_heads=2) == F.FocusedConfig.preset("paper", dim=8, num_heads=2)
    o = F.FocusedConfig.preset("official", dim=8, num_heads=2)
    assert (o.relu_eps, o.learnable_scale, o.norm_scope, o.positional_encoding, o.normaliser, o.eps, o.dwc_shared,
            o.dwc_resample, o.shift_mask, o.power_scaling) == (config.FLATTEN_OFFICIAL_RELU_EPS, True, "token", True,
                                                                "mean_scaled", config.FLATTEN_OFFICIAL_NORMALISER_EPS,
                                                                True, "linear_flat", "ignore", "max")
    assert F.FocusedConfig.preset("official", dim=8, num_heads=2, p=32.0).p == 32.0
    with pytest.raises(ValueError, match="'name'"):
        F.FocusedConfig.preset("released", dim=8, num_heads=2)


def test_taps_record_the_documented_intermediates():
    cfg = F.FocusedConfig.preset("official", dim=6, num_heads=2, sr_ratio=2, kernel_size=3)
    x, params = _x_and_params(0, cfg, "global", (4, 4), 4, "normal")
    taps: dict = {}
    F.focused_linear_attention(x, params, cfg, (4, 4), taps=taps)
    for name, shape in (("q", (1, 16, 6)), ("k", (1, 4, 6)), ("v", (1, 4, 6)), ("phi_q", (1, 2, 16, 3)),
                        ("phi_k", (1, 2, 4, 3)), ("kv", (1, 2, 3, 3)), ("k_mean", (1, 2, 3)),
                        ("denominator", (1, 2, 16)), ("attention", (1, 2, 16, 3)), ("dwc", (1, 2, 16, 3)),
                        ("pre_proj", (1, 16, 6))):
        assert taps[name].shape == shape, name


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="'x'.*non-negative"):
        F.focused_function(np.array([[1.0, -1.0]]), 3.0)
    with pytest.raises(ValueError, match="'p'"):
        F.focused_function(np.ones((1, 2)), 0.5)
    with pytest.raises(ValueError, match="'kernel_size'"):
        F.FocusedConfig(dim=4, num_heads=2, kernel_size=4)
    with pytest.raises(ValueError, match="'dim'"):
        F.FocusedConfig(dim=5, num_heads=2)
    with pytest.raises(ValueError, match="'normaliser'"):
        F.FocusedConfig(dim=4, num_heads=2, normaliser="avg")
    cfg = F.FocusedConfig(dim=4, num_heads=2, kernel_size=3)
    params = F.init_focused_params(cfg, layout="global", n_kv=16)
    with pytest.raises(ValueError, match="argument 'x'"):
        F.focused_linear_attention(np.ones((1, 15, 4)), params, cfg, (4, 4))
    with pytest.raises(ValueError, match="order='linear'"):
        F.focused_linear_attention(np.ones((1, 16, 4)), params, cfg, (4, 4), order="quadratic", max_elements=100)
    with pytest.raises(ValueError, match="'window_size'"):
        F.focused_window_attention(np.ones((1, 16, 4)), F.init_focused_params(cfg, layout="window", n_kv=9), cfg,
                                   (4, 4), window_size=3)
    with pytest.raises(TypeError, match="'q'"):
        F.focused_attention(np.ones((1, 1, 2, 2), dtype=int), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)))
    with pytest.raises(KeyError, match="dwc.weight"):
        F.focused_linear_attention(np.ones((1, 16, 4)), {k: v for k, v in params.items() if k != "dwc.weight"},
                                   cfg, (4, 4))


def test_window_geometry_seed_and_n_kv_are_validated_by_name():
    from refimpl.errors import ArgumentError, ArgumentTypeError
    cfg = F.FocusedConfig(dim=8, num_heads=2, kernel_size=3, eps=1e-6)
    params = F.init_focused_params(cfg, layout="window", n_kv=4)
    x = np.random.default_rng(0).standard_normal((1, 16, 8))
    ref = F.focused_window_attention(x, params, cfg, (4, 4), window_size=2, shift=1)
    np.testing.assert_array_equal(F.focused_window_attention(x, params, cfg, (4, 4), window_size=[2, 2],
                                                             shift=(1, 1)), ref)
    for name, bad in (("window_size", 2.5), ("window_size", "2"), ("shift", None), ("shift", True)):
        kw = {"window_size": 2, "shift": 1, name: bad}
        with pytest.raises(ArgumentTypeError, match=f"argument '{name}"):
            F.focused_window_attention(x, params, cfg, (4, 4), **kw)
    with pytest.raises(ArgumentError, match="argument 'seed'"):
        F.init_focused_params(cfg, layout="window", n_kv=4, seed=-1)
    with pytest.raises(ArgumentTypeError, match="argument 'n_kv'"):
        F.focused_param_shapes(cfg, layout="window", n_kv=True)
