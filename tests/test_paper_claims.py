"""Paper claims that had no test, each a property test citing where the paper makes it.

- Castling-ViT §3.2.1 (after Eq. 9): "the MACs of DWConv is also negligible (e.g., < 1% of the total MACs)":
  true for every registered Castling network (0.36% Castling-DeiT-T, 0.10% Castling-DeiT-B, 0.18-0.42% for
  Castling-LeViT), computed from the networks' own MAC counts.
- LiSA §4.2 (after Eq. 10): "The circular convolutions have the half size of parameters since the kernel size
  reduces from (2N - 1) to N": true per axis, so exactly only in 1-D; on an H x W grid the Toeplitz kernel has
  (2H - 1)(2W - 1) parameters and the circular one H W, about a quarter (196 / 729 = 0.27 at 14 x 14; an
  eighth in 3-D).  docs/lisa.md says so.
- LiSA §4.2: "we can additionally reduce the complexity by half via RFFT and inverse RFFT": the count of the
  transforms halves (counting.fft_macs's convention), the spectra our rfftn path forms hold H (W // 2 + 1)
  complex entries per channel against H W, so the spectral products cost (W // 2 + 1) / W, i.e. 1/2 + 1/W of
  the complex path's (4/7 at 14 x 14).
- LiSA Table 1: LiSA (FFT approximation) O(N C D log2 N) computation and O(N C D) memory: the counted MACs
  of the operator are exactly (2 + 2/D) N C D log2 N + 6 N C D + 8 H C D on n x n grids, so MACs / (N C D
  log2 N) falls monotonically to 2 + 2/D; the largest array the operator forms is B N C D (G_a, G_b) at
  every grid size.
- LiSA Eq. 3: softmax attention with an additive Toeplitz RPE (Eq. 2), softmax(A + R) V, against a direct
  loop evaluation with R written out from Eq. 2's index rule on the token coordinates.
- RALA Eq. 2 / Eq. 6: Eq. 6 is printed without a denominator and Eq. 2's denominator has no alpha, so the
  normaliser can be read with alpha (a weighted mean of the V_j: the reference, both presets, and the
  released code, which folds alpha into K before ``z = 1 / (q @ k.mean(...))``) or without it.  The two
  readings agree exactly when alpha = 1 (zero-mean queries, or "w/o KV aug"); otherwise they differ by the
  per-query factor r_i = kappa(Q_i) sum_j alpha_j kappa(K_j)^T / kappa(Q_i) sum_j kappa(K_j)^T, and only the
  alpha reading maps a constant V to itself.  docs/rala.md says which one is used.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from refimpl import config, numerics
from refimpl import models as rm
from refimpl import toeplitz as tz
from refimpl.attention import lisa, rala
from refimpl.attention import softmax as S
from refimpl.models import counting, lisanet
from tests.kernel_helpers import agree_float64, twice_bound
from tests.naive_softmax import softmax_attention_loops

HW = (224, 224)


# ===================================================================================================
# Castling-ViT §3.2.1: DWConv under 1% of the MACs
# ===================================================================================================

#: name -> (tokens T, channels C, blocks) of the Castling-DeiTs: the (9, 1) token conv is T C 9 per block.
CASTLING_DEIT = {"castling_deit_t": (197, 192, 12), "castling_deit_b": (197, 768, 12)}


@pytest.mark.parametrize("name", ["castling_deit_t", "castling_deit_b", "castling_levit_128",
                                  "castling_levit_192", "castling_levit_256", "castling_levit_384"])
def test_castling_dwconv_is_under_one_percent_of_the_macs(name):
    """Castling-ViT §3.2.1: "the MACs of DWConv is also negligible (e.g., < 1% of the total MACs)".  The
    DWConv's share of each registered network's count: 0.36% (DeiT-T), 0.10% (DeiT-B), 0.42 / 0.33 / 0.25 /
    0.18% (LeViT-128/192/256/384).  For the DeiTs the conv count is also written out (T C 9 per block) and
    the share taken against the paper's own MACs (Table 2: 1.18G, 17.28G) as well."""
    m = rm.family_of(name).macs(rm.create(name)[0], HW)
    conv = sum(v for k, v in m.items() if k.endswith(".attn.conv"))
    total = counting.total(m)
    assert conv > 0 and conv / total < 0.01
    if name in CASTLING_DEIT:
        t, c, blocks = CASTLING_DEIT[name]
        assert conv == blocks * t * c * 9
        share = {"castling_deit_t": 0.36, "castling_deit_b": 0.10}[name]
        assert round(100 * conv / total, 2) == share
        paper_macs = {"castling_deit_t": 1.18e9, "castling_deit_b": 17.28e9}[name]
        assert conv / paper_macs < 0.01


# ===================================================================================================
# LiSA §4.2: "half size of parameters" (true per axis; about a quarter on images)
# ===================================================================================================

@pytest.mark.parametrize("grid", [(14,), (196,), (14, 14), (7, 9), (56, 56), (4, 14, 14)])
def test_circular_kernel_parameters_against_toeplitz(grid):
    """LiSA §4.2: the circular kernel has N parameters against the Toeplitz RPE's (Eq. 2); per axis n of 2n - 1,
    so the ratio is prod n_a / (2 n_a - 1): just above 1/2 in 1-D (the claim), just above 1/4 on a 2-D grid,
    1/8 in 3-D.  Counted from the parameter shapes of a LiSA layer in both modes (circular W_a, W_b against
    exact-Toeplitz E_a~, E_b) and from refimpl.toeplitz's counts."""
    r = len(grid)
    ratio = Fraction(tz.num_circulant_params(grid), tz.num_toeplitz_params(grid))
    assert ratio == math.prod(Fraction(n, 2 * n - 1) for n in grid)
    assert Fraction(1, 2 ** r) < ratio <= Fraction(1, 2 ** r) * math.prod(Fraction(2 * n, 2 * n - 1) for n in grid)
    if r >= 2:
        assert ratio < Fraction(3, 10)                           # not "half": about 1 / 2^r
    c, d = 2, 3
    shapes = {ex: lisa.lisa_param_shapes(lisa.LiSAConfig(dim=2 * c, num_heads=2, grid=grid, latent=d,
                                                          exact_toeplitz=ex)) for ex in (False, True)}
    for key in ("weight_a", "weight_b"):
        assert Fraction(math.prod(shapes[False][key]), math.prod(shapes[True][key])) == ratio


def test_circular_parameters_at_lisanet_i_t():
    """At LiSANet-I-T's 14 x 14 grid: 196 against 729 offsets per kernel, 0.269 (not 0.5); the 1-D reading
    of the same 196 tokens would give 196 / 391 = 0.501."""
    assert (tz.num_circulant_params((14, 14)), tz.num_toeplitz_params((14, 14))) == (196, 729)
    assert round(196 / 729, 3) == 0.269
    assert (tz.num_circulant_params((196,)), tz.num_toeplitz_params((196,))) == (196, 391)


# ===================================================================================================
# LiSA §4.2: the RFFT halves the cost (counted)
# ===================================================================================================

@pytest.mark.parametrize("grid", [(14, 14), (56, 56), (7, 9), (28, 14)])
def test_rfft_halves_the_transform_count_and_almost_halves_the_spectral_products(grid):
    """LiSA §4.2 "reduce the complexity by half via RFFT and inverse RFFT", counted.  Transforms: a real one is
    half a complex one (counting.fft_macs, config.FFT_REAL_INPUT_FACTOR).  Spectral products: the spectra our
    rfft path forms (refimpl.toeplitz, recorded in taps) have H (W // 2 + 1) complex entries per channel,
    the complex path's H W, so the products cost (W // 2 + 1) / W = 1/2 + 1/W of the complex path (even W)
    - 4/7 at 14 x 14, 29/56 at 56 x 56 - and LiSANet's MAC count uses exactly the rfft spectra's size."""
    h, w = grid
    c, d = 3, 2
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal(grid + (c, d))
    x = rng.standard_normal((1,) + grid + (c, 1))
    taps = {m: {} for m in ("rfft", "fft")}
    for m in taps:
        tz.circulant_product(kernel, x, 2, m, taps=taps[m])
    per_channel = {m: math.prod(taps[m]["spectrum_x"].shape[1:3]) for m in taps}
    assert per_channel == {"rfft": h * (w // 2 + 1), "fft": h * w}
    assert taps["rfft"]["spectrum_kernel"].shape == (h, w // 2 + 1, c, d)
    ratio = Fraction(per_channel["rfft"], per_channel["fft"])
    assert ratio == Fraction(w // 2 + 1, w) and ratio > Fraction(1, 2)
    if w % 2 == 0:
        assert ratio == Fraction(1, 2) + Fraction(1, w)
    full, real = counting.fft_macs(grid, real=False), counting.fft_macs(grid, real=True)
    assert abs(full - 2 * real) <= 1 and real == round(h * w * math.log2(h * w))


def test_lisanet_spectral_count_is_the_rfft_spectrum_size():
    """LiSANet's "attn.spectral" group counts 4 real MACs per complex product over the rfft spectra: two
    products (F(Kb) F(W_a), F(V) F(W_b)) of C D each per frequency, 2 x 4 x 14 x 8 x C D at 14 x 14; the
    complex path would need 14 x 14 frequencies, 7/4 times as many."""
    cfg = rm.create("lisanet_i_t")[0]
    m = lisanet.macs(cfg)
    c, d = 192, 16
    assert m["stages.0.0.attn.spectral"] == 2 * config.COMPLEX_MAC_REAL_MACS * (14 * 8) * c * d
    assert Fraction(2 * 4 * 196 * c * d, m["stages.0.0.attn.spectral"]) == Fraction(7, 4)


# ===================================================================================================
# LiSA Table 1: O(N C D log2 N) computation, O(N C D) memory
# ===================================================================================================

def _operator_macs(n: int, depth_d: int = 16) -> int:
    cfg = rm.create("lisanet_i_t", image_size=(16 * n, 16 * n), depths=(1,), latent=depth_d)[0]
    m = lisanet.macs(cfg, fft=True)
    return sum(m[f"stages.0.0.attn.{p}"] for p in ("spectral", "contraction", "fft"))


def test_table1_computation_is_n_c_d_log_n():
    """LiSA Table 1, LiSA (FFT approximation): O(N C D log2 N).  On n x n grids (n a power of two, log2 N
    exact) the operator's counted MACs (spectral products, contraction, the 2C + 2CD real transforms) are
    exactly (2C + 2CD) N log2 N + 4 N C D + 8 n C D + 2 N C D; divided by N C D log2 N this falls
    monotonically towards 2 + 2/D.  The projections (O(N C^2)) are not part of the operator's entry."""
    c, d = 192, 16
    ratios = []
    for n in (2, 4, 8, 16, 32, 64):
        big_n = n * n
        lg = int(math.log2(big_n))
        got = _operator_macs(n, d)
        assert got == (2 * c + 2 * c * d) * big_n * lg + 4 * big_n * c * d + 8 * n * c * d + 2 * big_n * c * d
        ratios.append(Fraction(got, big_n * c * d * lg))
    assert all(a > b for a, b in zip(ratios, ratios[1:]))
    limit = 2 + Fraction(2, d)
    for n, r in zip((2, 4, 8, 16, 32, 64), ratios):
        assert r - limit == (6 + Fraction(8, n)) / int(math.log2(n * n))      # -> 0 like 1 / log2 N


def test_table1_memory_is_n_c_d():
    """LiSA Table 1, LiSA: O(N C D) memory.  The largest arrays lisa_core forms (taps: G_a, G_b, A, Bv of
    shape (B, h, N, c, D)) hold exactly B N C D elements at every grid size, and nothing it records is
    larger; the direct SA Eq. 4 holds B h N^2 (lisa.sa_elements), which outgrows it."""
    b, h, c, d = 1, 2, 3, 2
    rng = np.random.default_rng(1)
    for n in (4, 8, 16):
        big_n = n * n
        q, k, v = (rng.standard_normal((b, h, big_n, c)) for _ in range(3))
        wa, wb = rng.standard_normal((big_n, c, d)), rng.standard_normal((big_n, d))
        ba, bb = rng.standard_normal((c, d)), rng.standard_normal((c, d))
        taps: dict = {}
        lisa.lisa_core(q, k, v, wa, wb, ba, bb, (n, n), taps=taps)
        sizes = {key: np.asarray(val).size for key, val in taps.items()}
        assert max(sizes.values()) == b * big_n * (h * c) * d == sizes["G_a"] == sizes["G_b"]
        assert lisa.sa_elements(b, h, big_n, c, d, "eq4") == b * h * big_n ** 2
    assert lisa.sa_elements(b, h, 16 * 16, c, d, "eq4") > b * 16 * 16 * h * c * d


# ===================================================================================================
# LiSA Eq. 3: softmax attention with a Toeplitz RPE
# ===================================================================================================

def _eq2_bias(e: np.ndarray, grid: tuple[int, ...]) -> np.ndarray:
    """R[i, j] = e[n_a - 1 + (j_a - i_a)] per grid axis (Eq. 2, 0-based), by token coordinates."""
    coords = [tuple(int(t) for t in np.unravel_index(i, grid)) for i in range(math.prod(grid))]
    r = np.empty((len(coords), len(coords)))
    for i, ci in enumerate(coords):
        for j, cj in enumerate(coords):
            r[i, j] = e[tuple(n - 1 + b - a for n, a, b in zip(grid, ci, cj))]
    return r


def test_eq2_rows_as_printed():
    """Eq. 2's first row is (e_N .. e_2N-1) and its last (e_1 .. e_N) (1-based)."""
    e = np.arange(1.0, 10.0)                                      # e_1 .. e_9, N = 5
    t = tz.toeplitz(e, 1)
    np.testing.assert_array_equal(t[0], e[4:])
    np.testing.assert_array_equal(t[-1], e[:5])
    np.testing.assert_array_equal(t, _eq2_bias(e, (5,)))


@pytest.mark.parametrize("grid", [(6,), (3, 4), (2, 2, 3)])
def test_eq3_softmax_with_toeplitz_rpe_against_direct_evaluation(grid):
    """LiSA Eq. 3: Y_ik = sum_j softmax_j(A_ij + R_ij) V_jk with A = Q K^T / sqrt(C) (Eq. 1) and R = T(e) (Eq. 2)
    on the token grid: refimpl's softmax attention with bias toeplitz(e) against a loop over queries and keys
    with R_ij written out from Eq. 2's index rule, within both float64 evaluations' bound.  Adding a constant
    to every e leaves Y unchanged (softmax is shift-invariant), also within the bound."""
    rng = np.random.default_rng(3)
    n_tok, ch = math.prod(grid), 5
    q, k, v = (rng.standard_normal((1, 1, n_tok, ch)) for _ in range(3))
    e = rng.standard_normal(tuple(2 * n - 1 for n in grid))
    r = tz.toeplitz(e, len(grid))
    np.testing.assert_array_equal(r, _eq2_bias(e, grid))
    scale = ch ** -0.5
    y = S.softmax_attention(q, k, v, scale=scale, bias=r)
    direct = softmax_attention_loops(q, k, v, scale=scale, bias=_eq2_bias(e, grid))
    bound = S.softmax_attention_bound(q, k, v, scale=scale, bias=r, dtype="float64")
    agree_float64(y, direct, twice_bound(bound), f"Eq. 3 on grid {grid}")
    shifted = tz.toeplitz(e + 2.5, len(grid))
    y2 = S.softmax_attention(q, k, v, scale=scale, bias=shifted)
    agree_float64(y2, direct, twice_bound(S.softmax_attention_bound(q, k, v, scale=scale, bias=shifted,
                                                                     dtype="float64")), "Eq. 3, e + const")


# ===================================================================================================
# RALA Eq. 2 / Eq. 6: the normaliser with or without alpha
# ===================================================================================================

def _readings(kq, kk, v, alpha):
    """Both readings of the normaliser in exact rational arithmetic (one head): with alpha (A) and as Eq. 2
    prints it (B).  kq, kk: N x d, v: N x e, alpha: N (Fractions)."""
    n, dd, ee = len(kq), len(kq[0]), len(v[0])
    buf = [[sum(alpha[j] * kk[j][a] * v[j][b] for j in range(n)) for b in range(ee)] for a in range(dd)]
    ksum_a = [sum(alpha[j] * kk[j][a] for j in range(n)) for a in range(dd)]
    ksum = [sum(kk[j][a] for j in range(n)) for a in range(dd)]
    num = [[sum(kq[i][a] * buf[a][b] for a in range(dd)) for b in range(ee)] for i in range(n)]
    den_a = [sum(kq[i][a] * ksum_a[a] for a in range(dd)) for i in range(n)]
    den_b = [sum(kq[i][a] * ksum[a] for a in range(dd)) for i in range(n)]
    return ([[x / den_a[i] for x in num[i]] for i in range(n)],
            [[x / den_b[i] for x in num[i]] for i in range(n)], den_a, den_b)


def test_rala_normaliser_readings_exactly():
    """RALA Eq. 2 (denominator kappa(Q_i) sum_m kappa(K_m)^T) with Eq. 3's reweighted buffer, read with and
    without alpha, in exact arithmetic: equal when alpha = 1; otherwise reading B = reading A times
    r_i = den_A / den_B per query; only reading A's row weights sum to 1 (a constant V comes out unchanged);
    with alpha increasing in kappa(K) (Eq. 4 with Q_g kappa(K_j)^T increasing) r_i > 1 for every query."""
    fr = lambda rows: [[Fraction(x) for x in row] for row in rows]          # noqa: E731
    kq = fr([[1, 2], [3, 1], [2, 2], [1, 4]])
    kk = fr([[1, 1], [2, 1], [3, 2], [1, 3]])
    v = fr([[1, -2, 0], [4, 1, 3], [-1, 0, 2], [2, 5, -3]])
    ones = [Fraction(1)] * 4
    a1, b1, _, _ = _readings(kq, kk, v, ones)
    assert a1 == b1
    alpha = [Fraction(1, 2), Fraction(3, 4), Fraction(2), Fraction(3, 4)]   # sum = N = 4; largest at the largest key
    assert sum(alpha) == 4
    a, b, den_a, den_b = _readings(kq, kk, v, alpha)
    for i in range(4):
        r = den_a[i] / den_b[i]
        assert r > 1
        assert b[i] == [x * r for x in a[i]]
    const = [[Fraction(7), Fraction(-2), Fraction(1, 3)]] * 4
    ca, cb, den_a, den_b = _readings(kq, kk, const, alpha)
    assert ca == const
    assert all(cb[i] == [x * den_a[i] / den_b[i] for x in const[i]] != const[i] for i in range(4))


def _rala_case(seed: int, n: int = 12, d: int = 4, heads: int = 2):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, heads, n, d)), rng.standard_normal((1, heads, n, d))
    v0 = rng.standard_normal((1, heads, 1, d))
    return q, k, np.repeat(v0, n, axis=2), heads * d


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_rala_reference_uses_the_alpha_normaliser(preset):
    """The reference's normaliser is reading A (with alpha), in the paper preset and in the official one
    (the released code multiplies K by alpha = softmax * HW before z = 1 / (q @ k.mean(...)); here without
    RoPE and eps, which act on the numerator / add 1e-6): for a constant V its output is V within its own
    error bound, while reading B's output r_i V (r_i from the run's own alpha and features) is outside that
    bound for some query."""
    q, k, v, dim = _rala_case(5)
    over = {"rope": False, "eps": 0.0} if preset == "official" else {}
    cfg = rala.RALAConfig.preset(preset, dim=dim, num_heads=2, **over)
    taps: dict = {}
    y = rala.rala_core(q, k, v, cfg, (3, 4), taps=taps)
    bound = rala.rala_core_bound(q, k, v, cfg, (3, 4), dtype="float64")
    agree_float64(y, v, bound, f"RALA ({preset}) on a constant V")
    kq, kk, alpha = taps["kappa_q"], taps["kappa_k"], taps["alpha"]
    r = np.einsum("bhnd,bhd->bhn", kq, np.einsum("bhm,bhmd->bhd", alpha, kk)) \
        / np.einsum("bhnd,bhd->bhn", kq, kk.sum(axis=2))
    report = numerics.compare(r[..., None] * v, v, bound, "float64", name="reading B")
    assert not report.within_bound, np.max(np.abs(r - 1))       # r_i - 1 beyond the bound, not merely nonzero


def test_rala_readings_agree_for_zero_mean_queries():
    """With zero-mean queries (Eq. 4: Q_g = 0, every logit 0, alpha_j = 1 exactly) the two readings coincide:
    the reweighted reference equals the un-reweighted one ("w/o KV aug", Eq. 2 verbatim) within both
    bounds.  Integer queries make the mean exactly 0."""
    rng = np.random.default_rng(7)
    q = rng.integers(-3, 4, size=(1, 2, 12, 4)).astype(float)
    q[:, :, -1] = -q[:, :, :-1].sum(axis=2)
    assert not np.any(q.mean(axis=2))
    k, v = rng.standard_normal((1, 2, 12, 4)), rng.standard_normal((1, 2, 12, 4))
    cfg = rala.RALAConfig.preset("paper", dim=8, num_heads=2)
    plain = rala.RALAConfig.preset("paper", dim=8, num_heads=2, reweight=False)
    taps: dict = {}
    y = rala.rala_core(q, k, v, cfg, taps=taps)
    y0 = rala.rala_core(q, k, v, plain)
    assert not np.any(taps["scores"])
    agree_float64(y, y0, rala.rala_core_bound(q, k, v, cfg, dtype="float64").chain(
        rala.rala_core_bound(q, k, v, plain, dtype="float64")), "alpha = 1: both readings")
