"""Compute counts reconciled with the papers' tables, and the table variants reachable by documented overrides
in tests/test_macs.py's style: exact counts pinned, the paper's printed figure next to
them, and where they do not round to it the arithmetic of the gap asserted.

- LiSANet: the FLOPs the paper prints include FFTs, which counting.py's MACs leave out (all seven 3.4-7.7%
  low).  With the FFT convention of counting.fft_macs (n/2 log2 n complex MACs per complex length-n transform,
  4 real MACs each, real transforms half: n log2 n) the counts land within -2.1% .. +5.9% (H-T rounds).  No
  convention can reproduce Table 3d: every operation's count is affine in D, and the printed D = 4 -> 8 step
  needs a slope the D = 1 -> 16 step excludes.
- RAVLT Table 1 (2.4 / 4.6 / 9.9 / 16.0G): every printed figure lies strictly between the paper preset's and
  the official (released) preset's count; no variant of the released code (all-RALA stages, MLP ratio 3,
  no FFN depthwise conv) reproduces all four.
- L2ViT-B at 384^2 (Table 3: 47.5G, window 12): 47.28G (official 47.32G), 0.5% below, like the 0.7% at 224; one
  extra of 18.5 .. 29.5 MACs per token and channel per block would make all four L2ViT figures round.
- FLatten-Swin-B at 384^2 (Table 8: 91M, 46.5G): 91.43M (91M), 46.38G; Swin-B 384 in the same convention
  47.08G (Swin prints 47.0G).  FLatten Tables 6-7 (Swin-T with focused windows 7/14/28/56; focused stages
  LSSS..LLLL): every FLOPs figure (4.5G) and the Table 7 parameters reproduce; windows 7 and 14 give 28.32M /
  28.40M where Table 6 prints 29M.
- Castling-DeiT-T / -B (Castling-ViT Table 2: 1.18G / 17.28G; ours 1.137G / 17.097G): both gaps are one extra of
  97.9 .. 103.4 MACs per token and channel per block; no N C^2 term fits both.
- FLatten-CSwin-B at 384^2 (Table 8: 78M, 46.4G): 78.37M (78M), 46.30G, 0.21% below; CSwin-B at 384^2 in the same
  convention 46.96G (printed 47.0G), and the printed 0.6G difference of the two rows admits our 0.659G.
- FLatten-DeiT-T: 1,139,086,848 = 1.139G, 3.55% above the printed 1.1G (one decimal admits -4.5% .. +4.5%);
  FLatten's softmax DeiT-T row (1.2G) is our count without a class token (1.247G), not with one (1.254G).
- LiSA Table 3b (operators in LiSANet-I-T, registered as lisanet_i_t_selfattn, .._selfattn_rpe, .._selfattn_hrpe,
  .._sa_eq4, .._sa_eq4_hrpe, .._sa_eq5, .._sa_eq5_bias, .._sa_eq7; "LiSA (ours)" is lisanet_i_t): every FLOPs
  figure reproduces (1.25G, 3.92G: tests/test_macs.py); the parameters of Self-attn (5.72M) and LiSA (6.36M)
  reproduce, every row with an RPE is 0.01M high with Eq. 2's 729-offset Toeplitz RPE, and no single RPE size
  fits the printed rows together (COUNT_GAPS, asserted here).
- LiSA Table 3c (local k x k kernels in LiSANet-I-T, lisanet_i_t_local3/5/7): the parameters reproduce
  (5.75 / 5.80 / 5.88M); the FLOPs, 1.214 / 1.445 / 1.792G with Ga and Gb by direct convolution, round to 5 x 5's
  1.45G, and 3 x 3, 7 x 7 are 0.01G low.  Table 3a's Depthwise conv (7x7) and GF layer rows (lisanet_i_t_dwconv,
  lisanet_i_t_gf): 4.49M / 4.90M as printed; 0.832G (0.84G printed) and 0.817G with FFTs (0.82G).  One extra of
  0.29-0.64M MACs per block, common to every row counted without LiSA's FFTs (3a-3c), reproduces them all.
- LiSANet-I-T at 384^2 (Table 9: 3.62G): 3.28G MACs, 3.69G with FFTs: 1.9% above the paper, the same ratio
  as at 224^2.
- L2ViT in DeiT-T (Table 11: 5.7M, 1.3G with blocks 2, 4, ..., 12 enhanced; Table 8: 5.8M, 1.3G with all twelve):
  5.84M / 5.96M parameters with the 7 x 7 LCM (a 3 x 3 LCM gives 5.75M / 5.77M, both as printed); 1.216G / 1.178G
  MACs in the linear order (the quadratic order gives 1.276G / 1.298G, both 1.3G as printed).
- RALA in DeiT-T, Swin-T and Swin-S (RALA Table 8: 6M / 1.1G, 29M / 4.5G, 50M / 8.7G): 5.72M / 1.128G, 28.29M /
  4.462G, 49.60M / 8.712G - all as printed but Swin-T's 29M (COUNT_GAPS: Swin-T itself has 28.29M, which the Swin
  paper prints as 29M); closed forms from Swin-T / Swin-S (FLatten-Swin with every stage softmax) and DeiT-T.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from refimpl import models as rm
from refimpl.models import counting, flatten, flatten_cswin, l2vit, l2vit_deit, lisanet, rala_variants, ravlt

HW = (224, 224)


def _pct(ours: int, paper_g: float) -> float:
    """Our count's relative distance from the paper's figure, in percent, to 0.01."""
    return round(100 * (ours / (paper_g * 1e9) - 1), 2)


# ===================================================================================================
# LiSANet: the FFT convention, against the printed FLOPs
# ===================================================================================================

#: name -> (MACs + FFT MACs (counting.fft_macs), FFT MACs alone, paper G, decimals, where)
LISANET_FFT = {
    "lisanet_i_t_d1": (1_086_265_188, 13_754_724, 1.11, 2, "LiSA Table 3d (D = 1)"),
    "lisanet_i_t_d4": (1_115_799_936, 34_386_816, 1.13, 2, "LiSA Table 3d (D = 4)"),
    "lisanet_i_t_d8": (1_155_179_592, 61_896_264, 1.17, 2, "LiSA Table 3d (D = 8)"),
    "lisanet_i_t": (1_233_938_904, 116_915_160, 1.21, 2, "LiSA Table 3d (D = 16)"),
    "lisanet_h_t": (1_780_558_271, 116_152_767, 1.8, 1, "LiSA Table 8b"),
    "lisanet_h_s": (3_070_236_806, 297_343_110, 2.9, 1, "LiSA Table 4"),
    "lisanet_h_b": (9_720_591_913, 718_722_601, 9.6, 1, "LiSA Table 4"),
}

#: name -> (% gap of the MACs without FFTs, % gap with them) to the paper's figure.
LISANET_GAPS = {
    "lisanet_i_t_d1": (-3.38, -2.14), "lisanet_i_t_d4": (-4.30, -1.26), "lisanet_i_t_d8": (-6.56, -1.27),
    "lisanet_i_t": (-7.68, 1.98), "lisanet_h_t": (-7.53, -1.08), "lisanet_h_s": (-4.38, 5.87),
    "lisanet_h_b": (-6.23, 1.26),
}


def _fft_closed_form(cfg) -> int:
    """Per block 2 C forward (K-bar, V) and 2 C D inverse (G_a, G_b) real transforms of the stage grid, n log2 n
    real MACs each (n/2 log2 n complex MACs x 4, halved for real input), rounded once per block."""
    out = 0
    for (gh, gw), c, depth in zip(lisanet.stage_grids(cfg, cfg.image_size), cfg.dims, cfg.depths):
        n = gh * gw
        out += depth * int(round((2 * c + 2 * c * cfg.latent) * n * math.log2(n)))
    return out


@pytest.mark.parametrize("name", sorted(LISANET_FFT))
def test_lisanet_counts_with_ffts(name):
    """LiSA prints FLOPs that include its FFTs.  ``macs(cfg, fft=True)`` adds them by counting.fft_macs's
    convention: the total is pinned, the FFT part equals the closed form and elementwise()["fft"] (to one
    rounding per block), and the gaps to the paper are recorded: MACs alone 3.4-7.7% below every figure, with
    the FFTs -2.1% .. +5.9%; only H-T rounds to its printed figure (1.78G -> 1.8G)."""
    total, fft, g, digits, _ = LISANET_FFT[name]
    cfg = rm.create(name)[0]
    m = lisanet.macs(cfg, fft=True)
    ffts = {k: v for k, v in m.items() if k.endswith(".attn.fft")}
    assert counting.total(m) == total and sum(ffts.values()) == fft == _fft_closed_form(cfg)
    assert len(ffts) == sum(cfg.depths)
    assert abs(fft - lisanet.elementwise(cfg)["fft"]) <= len(ffts)
    plain = counting.total(lisanet.macs(cfg))
    assert plain == total - fft
    assert (_pct(plain, g), _pct(total, g)) == LISANET_GAPS[name]
    assert (round(total / 1e9, digits) == g) == (name == "lisanet_h_t")
    assert plain < g * 1e9


def test_table3d_is_not_affine_in_d():
    """LiSA Table 3d prints 1.11 / 1.13 / 1.17 / 1.21G for D = 1, 4, 8, 16 (same network otherwise).  Every
    operation of LiSANet-I-T counts a + b D (projections and MLP: none; spectral products, contraction,
    inverse FFTs, bias sums: linear in D), ours included (checked), so any counting convention gives an affine
    count.  The printed figures, at their precision (+-0.005G), need a slope of at least (1.165 - 1.135) / 4 =
    7.5M per unit of D between D = 4 and 8, and at most (1.215 - 1.105) / 15 = 7.33M between D = 1 and 16: no
    affine count, hence no convention, reproduces all four."""
    ds = (1, 4, 8, 16)
    for fft in (False, True):
        t = [counting.total(lisanet.macs(rm.create("lisanet_i_t", latent=d)[0], fft=fft)) for d in ds]
        slopes = [Fraction(t[i + 1] - t[i], ds[i + 1] - ds[i]) for i in range(3)]
        if fft:                                    # fft_macs rounds once per block: 12 roundings of <= 1/2
            assert max(slopes) - min(slopes) <= Fraction(12, 1)
        else:
            assert slopes[0] == slopes[1] == slopes[2]
    half = Fraction(5, 1000)
    printed = {1: Fraction(111, 100), 4: Fraction(113, 100), 8: Fraction(117, 100), 16: Fraction(121, 100)}
    min_slope_4_8 = (printed[8] - half - (printed[4] + half)) / 4
    max_slope_1_16 = (printed[16] + half - (printed[1] - half)) / 15
    assert min_slope_4_8 == Fraction(75, 10000) and max_slope_1_16 == Fraction(11, 1500)
    assert min_slope_4_8 > max_slope_1_16


def test_lisanet_i_t_384():
    """LiSA Table 9, LiSANet-I-T at 384^2: 3.62G.  ``create("lisanet_i_t", image_size=(384, 384))``: 3.277G
    MACs, 3.691G with the FFTs, 1.9% above the paper, the same ratio as at 224^2 (1.21 / 1.234 = 0.981 =
    3.62 / 3.691); the parameter gap (7.68M vs 7.82M) is tests/test_models_l2vit_ravlt_lisanet.py's."""
    cfg = rm.create("lisanet_i_t", image_size=(384, 384))[0]
    plain, total = counting.total(lisanet.macs(cfg)), counting.total(lisanet.macs(cfg, fft=True))
    assert (plain, total) == (3_277_254_144, 3_691_015_248)
    assert round(total / 1e9, 2) != 3.62 and _pct(total, 3.62) == 1.96
    assert round(3.62e9 / total, 3) == round(1.21e9 / LISANET_FFT["lisanet_i_t"][0], 3) == 0.981


# ===================================================================================================
# LiSA Table 3b: the operator variants of LiSANet-I-T
# ===================================================================================================

#: name -> (paper params M, paper GFLOPs) as printed in LiSA Table 3b (two decimals each)
TABLE3B = {
    "lisanet_i_t_selfattn": (5.72, 1.25), "lisanet_i_t_selfattn_rpe": (5.72, 1.25),
    "lisanet_i_t_selfattn_hrpe": (5.81, 1.25), "lisanet_i_t_sa_eq4": (5.72, 1.25),
    "lisanet_i_t_sa_eq4_hrpe": (5.81, 1.25), "lisanet_i_t_sa_eq5": (5.99, 3.92),
    "lisanet_i_t_sa_eq5_bias": (5.99, 3.92), "lisanet_i_t_sa_eq7": (8.09, 3.92), "lisanet_i_t": (6.36, 1.21),
}


def _table3b_params(name: str) -> int:
    """Hand-written: LiSANet-I-T without LiSA (patch embedding 3 x 16 x 16 x 192 + 192, position embedding 196 x
    192, 12 blocks of 2 LN, qkv 192 x 576 + 576, proj 192^2 + 192, MLP 192 x 768 x 2 + 768 + 192, final LN, head
    192 x 1000 + 1000) plus per block the operator's own: P = 27 x 27 Toeplitz offsets (Eq. 2 on 14 x 14), c = D
    = 16, h = 12."""
    base = (3 * 256 * 192 + 192) + 196 * 192 + 12 * (4 * 192 + 192 * 576 + 576 + 192 * 192 + 192
                                                     + 2 * 192 * 768 + 768 + 192) + 2 * 192 + 192 * 1000 + 1000
    p, c, d, h = 27 * 27, 16, 16, 12
    per_block = {"lisanet_i_t_selfattn": 0, "lisanet_i_t_selfattn_rpe": p, "lisanet_i_t_selfattn_hrpe": h * p,
                 "lisanet_i_t_sa_eq4": p, "lisanet_i_t_sa_eq4_hrpe": h * p,
                 "lisanet_i_t_sa_eq5": 2 * p * d + c * d, "lisanet_i_t_sa_eq5_bias": 2 * p * d + 2 * c * d,
                 "lisanet_i_t_sa_eq7": p * c * d + p * d + 2 * c * d,
                 "lisanet_i_t": 196 * c * d + 196 * d + 2 * c * d}[name]
    return base + 12 * per_block


@pytest.mark.parametrize("name", sorted(TABLE3B))
def test_lisa_table3b_counts(name):
    """Each registered Table 3b variant: parameters equal the hand-written arithmetic; they round to the printed
    figure exactly for Self-attn and LiSA, and for every other row are 0.01M above it with the gap recorded
    (lisanet.COUNT_GAPS, derived = ours); the FLOPs (MACs; no FFTs but LiSA's) round to the printed figure
    (LiSA's with the FFT convention: 1.234G, test_lisanet_counts_with_ffts)."""
    from refimpl.models import lisanet
    paper_m, paper_g = TABLE3B[name]
    cfg = rm.create(name)[0]
    ours = rm.param_count(cfg)
    assert ours == _table3b_params(name)
    rounded = counting._round_m(ours, 2)
    if name in ("lisanet_i_t_selfattn", "lisanet_i_t"):
        assert rounded == paper_m and name not in lisanet.COUNT_GAPS
    else:
        assert round(rounded - paper_m, 2) == 0.01
        assert lisanet.COUNT_GAPS[name].derived == ours
    flops = counting.total(lisanet.macs(cfg, fft=True))
    assert round(flops / 1e9, 2) == (paper_g if name != "lisanet_i_t" else 1.23)


def test_lisa_table3b_no_single_rpe_size():
    """The printed Table 3b parameters (+-0.005M) as constraints on the RPE size P (offsets per kernel): the
    shared-RPE rows need P <= 663, the h-RPE rows 611 <= P <= 680, Eq. 5 P <= 715, + Ba P <= 707 and
    + Hadamard 724 <= P <= 726.  Empty intersection: no RPE size reproduces the table, and Eq. 2's is 729."""
    base = _table3b_params("lisanet_i_t_selfattn")
    c = d = 16
    rows = {"shared": (5.72, lambda p: p), "h": (5.81, lambda p: 12 * p), "eq5": (5.99, lambda p: 2 * p * d + c * d),
            "eq5_bias": (5.99, lambda p: 2 * p * d + 2 * c * d),
            "eq7": (8.09, lambda p: p * c * d + p * d + 2 * c * d)}
    fits = {k: {p for p in range(1, 2000) if counting._round_m(base + 12 * f(p), 2) == m}
            for k, (m, f) in rows.items()}
    assert (min(fits["shared"]), max(fits["shared"])) == (1, 663)
    assert (min(fits["h"]), max(fits["h"])) == (611, 680)
    assert max(fits["eq5"]) == 715 and max(fits["eq5_bias"]) == 707
    assert (min(fits["eq7"]), max(fits["eq7"])) == (724, 726)
    assert not set.intersection(*fits.values()) and all(729 not in f for f in fits.values())


# ===================================================================================================
# LiSA Table 3c: local k x k kernels in LiSANet-I-T
# ===================================================================================================

#: name -> (k, paper params M, paper GFLOPs, our exact MACs) as printed in LiSA Table 3c ("Local - k x k")
TABLE3C = {"lisanet_i_t_local3": (3, 5.75, 1.22, 1_214_049_792), "lisanet_i_t_local5": (5, 5.80, 1.45, 1_445_260_800),
           "lisanet_i_t_local7": (7, 5.88, 1.80, 1_792_077_312)}


@pytest.mark.parametrize("name", sorted(TABLE3C))
def test_lisa_table3c_counts(name):
    """Table 3c, LiSA with local k x k kernels (refimpl.attention.lisa_local).  Parameters: LiSANet-I-T without
    LiSA (5,717,032, _table3b_params) plus per block Wa (k^2, c, D), Wb (k^2, D), Ba, Bb (c, D) - exactly the
    printed 5.75 / 5.80 / 5.88M.  MACs: LiSANet-I-T's projections, MLP, embedding, head and contraction
    (1,083,993,600) plus Ga and Gb by direct convolution, 2 N C D k^2 per block: 1.214 / 1.445 / 1.792G against
    the printed 1.22 / 1.45 / 1.80G - 5 x 5 rounds, 3 x 3 and 7 x 7 are 0.01G low (the gap:
    test_lisa_direct_flops_gap).  No FFTs, so fft=True adds nothing."""
    k, paper_m, paper_g, macs = TABLE3C[name]
    cfg = rm.create(name)[0]
    ours = rm.param_count(cfg)
    c = d = 16
    assert ours == _table3b_params("lisanet_i_t_selfattn") + 12 * (k * k * c * d + k * k * d + 2 * c * d)
    assert counting._round_m(ours, 2) == paper_m and name not in lisanet.COUNT_GAPS
    flops = counting.total(lisanet.macs(cfg, fft=True))
    assert flops == counting.total(lisanet.macs(cfg)) == macs
    assert macs == 1_083_993_600 + 12 * 2 * 196 * 192 * 16 * k * k
    assert round(round(macs / 1e9, 2) - paper_g, 2) == (0.0 if k == 5 else -0.01)


#: name -> (paper params M, paper GFLOPs, our exact MACs with FFTs) as printed in LiSA Table 3a (convolution rows)
TABLE3A = {"lisanet_i_t_dwconv": (4.49, 0.84, 831_558_144), "lisanet_i_t_gf": (4.90, 0.82, 817_340_088)}


@pytest.mark.parametrize("name", sorted(TABLE3A))
def test_lisa_table3a_counts(name):
    """Table 3a, "Depthwise conv (7x7)" and "GF layer" in LiSANet-I-T's blocks (lisanet_operators.CONV_OPERATORS):
    LiSANet-I-T without its operators (5,717,032 - 12 (qkv 192 x 576 + 576, proj 192 x 192 + 192) = 3,938,344) plus
    per block 7 x 7 x 192 (dwconv) or GFNet's 2 x 14 x 8 x 192 (complex filter), and the bias-free 192 x 192
    projection: 4,493,608 = 4.49M and 4,896,808 = 4.90M as printed.  MACs: the depthwise conv N C 49,
    the filter's F C complex products (4 real MACs, F = 14 x 8) and, with fft=True, its 2 C real transforms;
    GF 0.817G rounds to 0.82G, the depthwise row's 0.832G is 0.01G below the printed 0.84G
    (test_lisa_direct_flops_gap)."""
    paper_m, paper_g, macs = TABLE3A[name]
    cfg = rm.create(name)[0]
    ours = rm.param_count(cfg)
    base = _table3b_params("lisanet_i_t_selfattn") - 12 * (192 * 576 + 576 + 192 * 192 + 192)
    assert base == 3_938_344
    op = 49 * 192 if name.endswith("dwconv") else 2 * 14 * 8 * 192
    assert ours == base + 12 * (op + 192 * 192)
    assert counting._round_m(ours, 2) == paper_m and name not in lisanet.COUNT_GAPS
    assert counting.total(lisanet.macs(cfg, fft=True)) == macs
    assert round(round(macs / 1e9, 2) - paper_g, 2) == (0.0 if name.endswith("gf") else -0.01)


def test_lisa_direct_flops_gap():
    """Where the 0.01G of the 3 x 3 and 7 x 7 rows of Table 3c goes.  Our per-tap cost, Ga and Gb by direct
    convolution, 12 x 2 N C D = 14,450,688 MACs, lies in the slope the printed figures admit ((1.795 - 1.225) / 40
    .. (1.805 - 1.215) / 40 G per tap); with that slope the three printed figures (+-0.005G) need the rest of the
    network to count X = 2,922,688 .. 9,739,199 MACs more than ours (1,083,993,600).  The same holds across
    tables: the rows we count without FFT approximations of LiSA (Table 3a's two convolution rows, 3b, 3c; global
    LiSA's own FFT count is a separate gap, test_lisanet_counts_with_ffts) all round to the printed figures for
    one common X in [3,441,856, 7,659,912), i.e. 0.29M .. 0.64M per block, e.g. 16 N C = 602,112 per block
    (4 per element of the N x 4C MLP hidden, or one N C D term); X = 0 (ours) misses 3 x 3, 7 x 7 and the
    depthwise row.  The paper's counting tool is not stated, so the counts keep counting.py's convention (bias
    additions and activations are not MACs) and the gap is recorded."""
    slope, base, ncd = 12 * 2 * 196 * 192 * 16, 1_083_993_600, 196 * 192 * 16
    assert Fraction(1_795 - 1_225, 40) * 10 ** 6 <= slope <= Fraction(1_805 - 1_215, 40) * 10 ** 6
    half = 5 * 10 ** 6
    lo = max(round(g * 1e9) - half - slope * k * k - base for k, _, g, _ in TABLE3C.values())
    hi = min(round(g * 1e9) + half - slope * k * k - base for k, _, g, _ in TABLE3C.values())
    assert (lo, hi) == (2_922_688, 9_739_200)
    rows = {n: (g, macs) for n, (_, _, g, macs) in TABLE3C.items()}
    rows.update({n: (g, macs) for n, (_, g, macs) in TABLE3A.items()})
    rows.update({n: (g, counting.total(lisanet.macs(rm.create(n)[0]))) for n, (_, g) in TABLE3B.items()
                 if n != "lisanet_i_t"})
    lo = max(round(g * 1e9) - half - t for g, t in rows.values())
    hi = min(round(g * 1e9) + half - t for g, t in rows.values())
    assert (lo, hi) == (3_441_856, 7_659_912) and len(rows) == 13

    def misses(extra):
        return sorted(n for n, (g, t) in rows.items() if round((t + extra) / 1e9, 2) != g)
    assert misses(12 * ncd) == []
    assert misses(0) == ["lisanet_i_t_dwconv", "lisanet_i_t_local3", "lisanet_i_t_local7"]


# ===================================================================================================
# RAVLT Table 1
# ===================================================================================================

RAVLT_PAPER = {"ravlt_t": 2.4, "ravlt_s": 4.6, "ravlt_b": 9.9, "ravlt_l": 16.0}

#: variant -> (overrides, exact MACs of T / S / B / L).  "official" is the released RAVLT_T..L (stages 3-4
#: softmax, LePE, output projection, FFN depthwise conv, MLP ratio 3.5); the others change one released choice.
RAVLT_VARIANTS = {
    "paper": ({}, (2_328_036_352, 4_312_459_520, 9_456_239_616, 15_317_937_920)),
    "official": ({"preset": "official"}, (2_613_312_000, 4_878_388_352, 10_579_554_816, 17_208_927_104)),
    "official, RALA in all stages": ({"preset": "official", "stage_attention": ("rala",) * 4},
                                     (2_536_040_960, 4_732_903_040, 10_347_741_696, 16_779_847_040)),
    "official, MLP ratio 3": ({"preset": "official", "mlp_ratio": 3.0},
                              (2_454_881_280, 4_548_612_864, 9_852_429_312, 15_964_229_888)),
    "official, RALA in all stages, MLP ratio 3": (
        {"preset": "official", "stage_attention": ("rala",) * 4, "mlp_ratio": 3.0},
        (2_377_610_240, 4_403_127_552, 9_620_616_192, 15_535_149_824)),
    "official, no FFN depthwise conv": ({"preset": "official", "ffn_dwconv": False},
                                        (2_583_281_664, 4_823_464_448, 10_479_980_544, 17_077_346_816)),
}

#: variant -> the names whose count rounds to Table 1 (none rounds for all four).
RAVLT_MATCHES = {"paper": set(), "official": set(), "official, RALA in all stages": set(),
                 "official, MLP ratio 3": {"ravlt_b", "ravlt_l"},
                 "official, RALA in all stages, MLP ratio 3": {"ravlt_t"},
                 "official, no FFN depthwise conv": set()}


def test_ravlt_table1_flops():
    """RALA Table 1 FLOPs 2.4 / 4.6 / 9.9 / 16.0G against our counts: each printed figure lies strictly between
    the paper preset's (what the equations describe: 2.33 / 4.31 / 9.46 / 15.32G) and the official preset's
    (the released models: 2.61 / 4.88 / 10.58 / 17.21G, 7-9% above; fvcore, which the released file imports,
    counts the same products plus the norms).  Variants of the released code, one choice changed, reproduce at
    most two of the four; none all four.  Recorded, not fitted (docs/models_l2vit_ravlt_lisanet.md)."""
    names = sorted(RAVLT_PAPER, key=lambda n: "tsbl".index(n[-1]))
    for variant, (over, want) in RAVLT_VARIANTS.items():
        got = tuple(counting.total(ravlt.macs(rm.create(n, **over)[0])) for n in names)
        assert got == want, variant
        assert {n for n, t in zip(names, got) if round(t / 1e9, 1) == RAVLT_PAPER[n]} == RAVLT_MATCHES[variant]
    for i, n in enumerate(names):
        assert RAVLT_VARIANTS["paper"][1][i] < RAVLT_PAPER[n] * 1e9 < RAVLT_VARIANTS["official"][1][i]


# ===================================================================================================
# L2ViT
# ===================================================================================================

def test_l2vit_totals_and_base_384():
    """L2ViT Tables 2-3: 4.7 / 9.0 / 15.9G at 224^2 (T and S round, B is 0.67% below: tests/test_macs.py), and
    47.5G for L2ViT-B at 384^2 with 12 x 12 LWA windows (Appendix 9; ``l2vit.BASE_384``): 47.28G (official
    preset 47.32G), 0.46% below - the same direction and size as at 224^2.  With the 224 window (7) it would
    be 48.75G.  The parameters do not depend on the resolution: 88,516,852 -> Table 3's 89M."""
    base = {pre: rm.create("l2vit_base", preset=pre, **l2vit.BASE_384)[0] for pre in ("paper", "official")}
    got = {pre: counting.total(l2vit.macs(cfg, (384, 384))) for pre, cfg in base.items()}
    assert got == {"paper": 47_280_578_560, "official": 47_321_718_784}
    assert all(round(t / 1e9, 1) != 47.5 for t in got.values())
    assert (_pct(got["paper"], 47.5), _pct(got["official"], 47.5)) == (-0.46, -0.38)
    assert _pct(counting.total(l2vit.macs(rm.create("l2vit_base")[0], HW)), 15.9) == -0.67
    w7 = counting.total(l2vit.macs(rm.create("l2vit_base")[0], (384, 384)))
    assert w7 == 48_750_405_120
    assert rm.param_count(base["paper"]) == 88_516_852 and round(88_516_852 / 1e6) == 89
    for name, g in (("l2vit_tiny", 4.7), ("l2vit_small", 9.0)):
        assert round(counting.total(l2vit.macs(rm.create(name)[0], HW)) / 1e9, 1) == g


def test_l2vit_gap_is_one_per_token_channel_extra():
    """Where L2ViT-B's 0.67% (224^2) and 0.46% (384^2) go.  As an extra X N C MACs per block (N, C of the block's
    stage; the sum of N C over the blocks is S) the printed 4.7 / 9.0 / 15.9G and 47.5G (+-0.05G) admit X in
    [-22.2, 47.7] (T), [-8.4, 34.5] (S), [18.1, 50.3] (B) and [18.5, 29.5] (B at 384^2, window 12): one common
    extra of 18.5 .. 29.5 MACs per token and channel per block reproduces all four, with T and S rounding with
    or without it, while none (ours) misses B at both resolutions.  The paper does not name its counter; the
    counts keep counting.py's convention."""
    rows = [("l2vit_tiny", {}, HW, 4.7), ("l2vit_small", {}, HW, 9.0), ("l2vit_base", {}, HW, 15.9),
            ("l2vit_base", l2vit.BASE_384, (384, 384), 47.5)]
    bounds = []
    for name, over, hw, g in rows:
        cfg = rm.create(name, **over)[0]
        ours = counting.total(l2vit.macs(cfg, hw))
        s = sum(depth * gh * gw * c for (gh, gw), c, depth in zip(l2vit.stage_grids(cfg, hw), cfg.dims, cfg.depths))
        half = 5 * 10 ** 7
        bounds.append((Fraction(round(g * 1e9) - half - ours, s), Fraction(round(g * 1e9) + half - ours, s)))
    assert [(round(float(a), 1), round(float(b), 1)) for a, b in bounds] == [(-22.2, 47.7), (-8.4, 34.5),
                                                                             (18.1, 50.3), (18.5, 29.5)]
    lo, hi = max(a for a, _ in bounds), min(b for _, b in bounds)
    assert lo <= 25 <= hi and lo > 0                       # a common extra exists, and zero (ours) is not in it


# ===================================================================================================
# FLatten: Swin-B 384, Tables 6-7, DeiT-T
# ===================================================================================================

def test_flatten_swin_b_384():
    """FLatten Table 8's 384^2 row, FLatten-Swin-B: 91M, 46.5G.  ``create("flatten_swin_b", preset="official",
    **flatten.SWIN_B_384)`` (the released flatten_swin_b_384.yaml: focused window 96, softmax window 12):
    91,433,928 parameters (91M, as printed) and 46,382,424,064 MACs (46.4G, 0.25% below 46.5G).  Swin-B at
    384^2 in the same convention (every stage softmax, window 12) is 47,083,134,976 (47.1G; Swin prints 47.0G)
    with 87,903,584 parameters (88M, as printed)."""
    cfg = rm.create("flatten_swin_b", preset="official", **flatten.SWIN_B_384)[0]
    assert rm.param_count(cfg) == 91_433_928 and round(rm.param_count(cfg) / 1e6) == 91
    macs = counting.total(flatten.macs(cfg))
    assert macs == counting.total(flatten.macs(rm.create("flatten_swin_b", **flatten.SWIN_B_384)[0]))
    assert macs == 46_382_424_064 and round(macs / 1e9, 1) == 46.4 and _pct(macs, 46.5) == -0.25
    swin = rm.create("flatten_swin_b", attn_types="SSSS", **flatten.SWIN_B_384)[0]
    assert counting.total(flatten.macs(swin)) == 47_083_134_976 and rm.param_count(swin) == 87_903_584


def test_flatten_cswin_b_384_against_cswin_b_384():
    """FLatten Table 8's 384^2 rows: CSwin-B 78M / 47.0G and FLatten-CSwin-B 78M / 46.4G.
    ``create("flatten_cswin_b", preset="official", **flatten_cswin.B_384)`` (the released
    flatten_cswin_b_384.yaml): 78,369,112 parameters (78M, as printed) and 46,304,753,664 MACs, 46.3G, -0.21%
    from the printed 46.4G (45,246,336 MACs short of rounding to it).  The baseline in the same convention
    (every stage softmax, CSwin-B's depths 2, 4, 32, 2, stripes 1, 2, 12, 12) is 46,963,660,800 = 47.0G as
    printed, and the printed difference of the two rows, 0.6G (+-0.1 with one decimal each), admits ours,
    0.659G: the two rows agree with our counts up to the rounding of each.  Recorded, not fitted (at 224^2:
    14.913G vs 15.0G, tests/test_macs.py GAPS)."""
    cfg = rm.create("flatten_cswin_b", preset="official", **flatten_cswin.B_384)[0]
    ours = counting.total(flatten_cswin.macs(cfg))
    assert rm.param_count(cfg) == 78_369_112 and counting._round_m(rm.param_count(cfg), 0) == 78
    assert ours == 46_304_753_664 and round(ours / 1e9, 1) == 46.3 != 46.4 and _pct(ours, 46.4) == -0.21
    cswin = flatten_cswin.FlattenCSwinConfig(embed_dim=96, depths=(2, 4, 32, 2), num_heads=(4, 8, 16, 32),
                                             attn_types="SSSS", img_size=(384, 384), split_size=(1, 2, 12, 12))
    base = counting.total(flatten_cswin.macs(cswin))
    assert base == 46_963_660_800 and round(base / 1e9, 1) == 47.0
    step = base - ours
    assert step == 658_907_136 and 0.5e9 <= step < 0.7e9
    assert 46.35e9 - ours == 45_246_336


#: focused window -> (params, official preset); FLatten Table 6 prints 29M and 4.5G for every row.
TABLE6 = {7: 28_317_440, 14: 28_402_112, 28: 28_740_800, 56: 29_192_384}
#: focused stages -> (params official, MACs); Table 7 prints 29M, 29M, 30M, 30M and 4.5G.
TABLE7 = {"LSSS": (28_891_308, 4_485_749_760, 29), "LLSS": (29_192_384, 4_483_341_312, 29),
          "LLLS": (29_639_096, 4_479_728_640, 30), "LLLL": (29_709_448, 4_479_126_528, 30)}


def test_flatten_tables_6_and_7():
    """FLatten Table 6 (FLatten-Swin-T with focused windows 7, 14, 28, 56; ``focused_window=``) and Table 7
    (the focused module in stages 1 / 1-2 / 1-3 / 1-4; ``attn_types=``), counted with the released module
    (preset "official").  The MACs do not depend on the focused window (linear attention: the per-window
    costs add up to the same) and all round to 4.5G; Table 7's parameters all round as printed.  Windows 7
    and 14 give 28.32M and 28.40M (28M) where Table 6 prints 29M: the released positional encoding is
    (1, ws^2, C) per focused block, 2 x 49 x 96 + 2 x 49 x 192 = 28,224 at window 7 against 903,168 at 56;
    recorded, not fitted."""
    for ws, params in TABLE6.items():
        cfg = rm.create("flatten_swin_t", preset="official", focused_window=ws)[0]
        assert rm.param_count(cfg) == params
        assert (round(params / 1e6) == 29) == (ws >= 28)
        assert counting.total(flatten.macs(cfg)) == 4_483_341_312
    assert TABLE6[56] - TABLE6[7] == (2 * 96 + 2 * 192) * (56 * 56 - 49) - 2 * 192 * (56 * 56 - 28 * 28)
    for types, (params, macs, printed) in TABLE7.items():
        cfg = rm.create("flatten_swin_t", preset="official", attn_types=types)[0]
        assert (rm.param_count(cfg), counting.total(flatten.macs(cfg))) == (params, macs)
        assert round(params / 1e6) == printed and round(macs / 1e9, 1) == 4.5


def _deit_softmax_macs(tokens: int, c: int = 192, depth: int = 12, classes: int = 1000) -> int:
    """DeiT with softmax attention: patch embedding 196 C 768, per block 12 N C^2 (qkv, proj, MLP) and
    QK^T, AV 2 N^2 C, head C x classes."""
    return 196 * c * 768 + depth * (12 * tokens * c * c + 2 * tokens * tokens * c) + c * classes


def test_flatten_deit_t_flops_recorded_precisely():
    """FLatten Table 8: FLatten-DeiT-T 1.1G.  Ours is exactly 1,139,086,848: 3.55% above the printed figure,
    which at one decimal admits any count from -4.5% to +4.5%.  The same table's DeiT-T (softmax) is 1.2G:
    our DeiT-T count without a class token (N = 196) is 1,246,563,840 (1.2G), with one (N = 197, as DeiT has,
    and Castling-ViT's 1.25G) 1,253,683,200 (1.3G) - FLatten's counter agrees with N = 196, as our
    FLatten-DeiT (no class token) has."""
    ours = counting.total(flatten.macs(rm.create("flatten_deit_t")[0]))
    assert ours == 1_139_086_848 and _pct(ours, 1.1) == 3.55
    assert 1.05e9 <= ours < 1.15e9
    assert _deit_softmax_macs(196) == 1_246_563_840 and round(_deit_softmax_macs(196) / 1e9, 1) == 1.2
    assert _deit_softmax_macs(197) == 1_253_683_200 and round(_deit_softmax_macs(197) / 1e9, 1) == 1.3


def test_castling_deit_macs_gap_is_one_per_token_channel_extra():
    """Castling-ViT Table 2: Castling-DeiT-T 1.18G and -B 17.28G MACs; ours 1,137,033,984 and 17,097,231,360
    (tests/test_macs.py GAPS; its DeiT-T baseline, 1.25G, is our softmax DeiT-T with a class token, so the
    difference lies in the linear-angular blocks).  As an extra X N C MACs per block (N = 197 tokens, C channels,
    12 blocks) the printed figures (+-0.005G) admit X in [83.6, 105.7] for T and [97.9, 103.4] for B: one common
    extra of about 100 MACs per token and channel per block reproduces both.  A term in N C^2 does not: it would
    need 0.44-0.55 C for T and 0.127-0.135 C for B.  The paper does not say what it counts there; recorded, not
    fitted (the counts keep counting.py's convention)."""
    rows = {"castling_deit_t": (1.18, 192), "castling_deit_b": (17.28, 768)}
    lo, hi, per_c = {}, {}, {}
    for name, (g, c) in rows.items():
        ours = counting.total(rm.family_of(name).macs(rm.create(name)[0], HW))
        assert round(ours / 1e9, 2) != g
        unit = 12 * 197 * c
        lo[name] = Fraction(round(g * 1e9) - 5 * 10 ** 6 - ours, unit)
        hi[name] = Fraction(round(g * 1e9) + 5 * 10 ** 6 - ours, unit)
        per_c[name] = (lo[name] / c, hi[name] / c)
        assert round(float(lo[name]), 1) > 0
    assert [round(float(v), 1) for v in (lo["castling_deit_t"], hi["castling_deit_t"])] == [83.6, 105.7]
    assert [round(float(v), 1) for v in (lo["castling_deit_b"], hi["castling_deit_b"])] == [97.9, 103.4]
    common = (max(lo.values()), min(hi.values()))
    assert common[0] <= 100 <= common[1]
    assert per_c["castling_deit_b"][1] < per_c["castling_deit_t"][0]            # no common N C^2 coefficient


# ===================================================================================================
# L2ViT in DeiT-T (Appendix 9 Table 11; Table 8)
# ===================================================================================================

def _l2vit_deit_params(enhanced: int, *, k: int = 7, temperatures: int = 0, c: int = 192) -> int:
    """DeiT-T (5,717,416: patch embed 3*16*16*C + C, class token C, pos embed 197 C, 12 blocks of 2 LN 4C, qkv
    3C^2 + 3C, proj C^2 + C, MLP 8C^2 + 5C, final LN 2C, head 1000 C + 1000) + per enhanced block the scale s
    (1, or h temperatures), norm3 2C, the LCM's two k x k depthwise convs 2 (k^2 C + C) and its BN 2C."""
    deit = (3 * 256 * c + c) + c + 197 * c + 12 * (4 * c + 3 * c * c + 3 * c + c * c + c + 8 * c * c + 5 * c) \
        + 2 * c + 1000 * c + 1000
    return deit + enhanced * ((temperatures or 1) + 2 * c + 2 * (k * k * c + c) + 2 * c)


def test_l2vit_deit_counts():
    """L2ViT Appendix 9, Table 11: DeiT-T 5.7M / 1.3G and DeiT-T + Enhanced Linear Attention (blocks 2, 4, ..., 12
    enhanced) 5.7M / 1.3G; Table 8: all twelve blocks enhanced, 5.8M / 1.3G.  Ours, as the paper describes the
    block (Eq. 4-8, the 7 x 7 LCM of Table 13 / Fig. 5, no CPE): 5,837,230 (5.8M) and 5,957,044 (6.0M)
    parameters - neither as printed (COUNT_GAPS) - and 1.216G / 1.178G MACs in the linear order (1.2G; the
    paper's "some FLOPs reduction" against DeiT-T's 1.254G).  Recorded, not fitted: a 3 x 3 LCM
    (``l2vit_deit.LCM_KERNEL_3``) reproduces both printed parameter counts (5.745M -> 5.7M, 5.773M -> 5.8M), the
    only odd kernel that does (1 x 1 fits Table 11 alone, 5 x 5 Table 8 alone); the quadratic order ((phi(Q) phi(K)^T) V, O(N^2)) reproduces both printed 1.3G
    (1.276G, 1.298G) but is no reduction; no single setting reproduces all four figures."""
    rows = {"l2vit_deit_t": (6, 5.7, 5_837_230, 1_215_670_656, 1_276_037_760),
            "l2vit_deit_t_all": (12, 5.8, 5_957_044, 1_177_658_112, 1_298_392_320)}
    deit_t = _l2vit_deit_params(0)
    assert deit_t == 5_717_416 and counting._round_m(deit_t, 1) == 5.7               # Table 11's DeiT-T row
    deit_macs = 1_253_683_200                                                       # tests/test_macs.py closed form
    for name, (n_enh, printed, params, lin, quad) in rows.items():
        cfg = rm.create(name)[0]
        assert rm.param_count(cfg) == params == _l2vit_deit_params(n_enh)
        assert l2vit_deit.COUNT_GAPS[name].derived == params
        assert counting._round_m(params, 1) != printed
        assert rm.param_count(rm.create(name, preset="official")[0]) == _l2vit_deit_params(n_enh, temperatures=3)
        ks = {k for k in (1, 3, 5, 7, 9) if counting._round_m(_l2vit_deit_params(n_enh, k=k), 1) == printed}
        assert ks == ({1, 3} if n_enh == 6 else {3, 5})
        k3 = rm.param_count(rm.create(name, **l2vit_deit.LCM_KERNEL_3)[0])
        assert k3 == _l2vit_deit_params(n_enh, k=3) and counting._round_m(k3, 1) == printed
        assert counting.total(l2vit_deit.macs(cfg)) == lin < deit_macs and round(lin / 1e9, 1) == 1.2
        q = counting.total(l2vit_deit.macs(rm.create(name, order="quadratic")[0]))
        assert q == quad > deit_macs and round(quad / 1e9, 1) == 1.3
    assert _pct(rows["l2vit_deit_t"][3], 1.3) == -6.49 and _pct(rows["l2vit_deit_t_all"][3], 1.3) == -9.41


# ===================================================================================================
# RALA in DeiT-T, Swin-T and Swin-S (RALA §4.5, Table 8)
# ===================================================================================================

def _rala_swin_closed_form(depths, *, official=False, c=96, heads=(3, 6, 12, 24), ws=7):
    """RALA-Swin at 224^2 from Swin itself (FLatten-Swin with every stage softmax: another family's count) and
    the arithmetic of the two RALA stages (grids 56^2, 28^2): (params, MACs).  Parameters: RALA's qkv + phi have
    the weights of the qkv + proj they replace, so only the relative-position tables (2 ws - 1)^2 h go; the
    official layer adds its output projection C^2 + C and 5x5 LePE 26 C.  MACs: the windowed softmax core
    nw 2 h ws^4 d goes, RALA's core 2 N C d + N C (normaliser) + N C (alpha's scores) comes (the projections
    are the same 4 N C^2); official + LePE 25 N C + projection N C^2."""
    swin = rm.create("flatten_swin_t", depths=depths, attn_types="SSSS")[0]
    params, macs = rm.param_count(swin), counting.total(flatten.macs(swin))
    for i, g in enumerate((56, 28)):
        ci, h, n = c * 2 ** i, heads[i], g * g
        d = ci // h
        params += depths[i] * (-((2 * ws - 1) ** 2) * h + (ci * ci + 27 * ci if official else 0))
        macs += depths[i] * (-(n // (ws * ws)) * 2 * h * ws ** 4 * d + 2 * n * ci * d + 2 * n * ci
                             + (25 * n * ci + n * ci * ci if official else 0))
    return params, macs


def test_rala_table8_counts():
    """RALA Table 8, "Ours": 6M / 1.1G (DeiT-T setting), 29M / 4.5G (Swin-T), 50M / 8.7G (Swin-S).  Ours (RALA's
    layer as §3.2 defines it, preset "paper"; DeiT-T without a class token; RALA in Swin's stages 1-2, global):
    every figure as printed except Swin-T's 29M: 28,285,312 is 28M, as is Swin-T itself (28,288,354, printed 29M
    by the Swin paper and by Table 8's Swin-T row).  The released layer (preset "official": + LePE, output
    projection) changes no printed parameter figure; its DeiT-T MACs (1.226G) would print 1.2G.  RALA in all four
    Swin stages ("LLLL") would not print 29M either."""
    printed = {"rala_deit_t": (6, 1.1), "rala_swin_t": (29, 4.5), "rala_swin_s": (50, 8.7)}
    ours = {"rala_deit_t": (5_717_032, 1_128_248_832), "rala_swin_t": (28_285_312, 4_461_665_280),
            "rala_swin_s": (49_603_216, 8_711_973_888)}
    official = {"rala_deit_t": (6_221_608, 1_226_242_560), "rala_swin_t": (28_393_024, 4_599_849_984),
                "rala_swin_s": (49_710_928, 8_850_158_592)}
    for name, (p_paper, g_paper) in printed.items():
        cfg = rm.create(name)[0]
        got = (rm.param_count(cfg), counting.total(rala_variants.macs(cfg)))
        assert got == ours[name], name
        off = rm.create(name, preset="official")[0]
        assert (rm.param_count(off), counting.total(rala_variants.macs(off))) == official[name], name
        assert round(got[1] / 1e9, 1) == g_paper
        assert (counting._round_m(got[0], 0) == p_paper) == (name not in rala_variants.COUNT_GAPS), name
        assert counting._round_m(official[name][0], 0) == counting._round_m(got[0], 0)
    # DeiT-T: DeiT-T's own 5,717,416 less the class token and its positional embedding (2 x 192)
    assert _l2vit_deit_params(0) - 2 * 192 == ours["rala_deit_t"][0]
    # Swin: closed forms from Swin itself
    for name, depths in (("rala_swin_t", (2, 2, 6, 2)), ("rala_swin_s", (2, 2, 18, 2))):
        assert _rala_swin_closed_form(depths) == ours[name]
        assert _rala_swin_closed_form(depths, official=True) == official[name]
    swin_t = rm.param_count(rm.create("flatten_swin_t", attn_types="SSSS")[0])
    assert swin_t == 28_288_354 and counting._round_m(swin_t, 0) == 28
    gap = rala_variants.COUNT_GAPS["rala_swin_t"]
    assert gap.derived == ours["rala_swin_t"][0] == swin_t - 3_042
    every = {p: rm.param_count(rm.create("rala_swin_t", attn_types="LLLL", preset=p)[0]) for p in ("paper", "official")}
    assert every == {"paper": 28_265_032, "official": 30_540_808}
    assert {counting._round_m(v, 0) for v in every.values()} == {28, 31}
    assert all(f"{v:,}" in gap.reason for v in every.values())
