"""Tests of the L2ViT, RAVLT and LiSANet network references (refimpl/models/l2vit.py, ravlt.py, lisanet.py).

Parameter counts are compared with the papers' tables at the precision they print, and with hand-written
arithmetic that does not use the model code (the formulas of docs/models_l2vit_ravlt_lisanet.md).  Where a
paper's figure cannot be reached by the architecture it states, the test asserts our count equals the
derived arithmetic and records the paper's figure and the gap.  Forward passes run the reduced ("tiny
test") configurations, which take every code path of the full models.

Comparisons of two float64 evaluations (batched vs per sample) go through the units' running error bounds
(unit_bound, refimpl.models.common's error model): both evaluations lie within the bound of the exact
value, and numerics.Bound.array already adds the reference's own error to the tested one's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from refimpl import models, numerics
from refimpl.errors import ArgumentError
from refimpl.attention import lisa, rala
from refimpl.models import counting, l2vit, lisanet, ravlt

F64 = "float64"
FAMILIES = {"l2vit": l2vit, "ravlt": ravlt, "lisanet": lisanet}
OUR_NAMES = [n for n in models.names() if models.family_of(n) in FAMILIES.values()]


def _round_m(n: int, digits: int) -> float:
    """Round n / 1e6 half-up at ``digits`` decimals, in integers (as the papers print 6.36M)."""
    scale = 10 ** (6 - digits)
    q, r = divmod(int(n), scale)
    return (q + (1 if 2 * r >= scale else 0)) / 10 ** digits


# ===================================================================================================
# Hand-written parameter arithmetic (independent of the model code; docs/models_l2vit_ravlt_lisanet.md)
# ===================================================================================================

def l2vit_arithmetic(dims, pairs, heads, *, official: bool, nc: int = 1000, lcm: int = 7) -> int:
    """Stem: conv3x3 3->C0/2 (+b), BN, conv3x3 C0/2->C0 (+b), BN, LN.  Downsampling: LN(C_prev) + conv2x2.
    LWA: CPE 10C (x2 official), LN 2C, qkv 3C^2+3C, proj C^2+C, LN 2C, MLP 8C^2+5C.
    LGA: CPE 10C, LN 2C, qkv, proj, scale 1 (paper) / h temperatures (official), LN3 2C, LCM 2(k^2 C + C)
    + BN 2C, LN 2C, MLP.  Head: LN 2C + C*nc + nc."""
    c0, hid = dims[0], dims[0] // 2
    n = 27 * hid + hid + 2 * hid + 9 * hid * c0 + c0 + 2 * c0 + 2 * c0
    for i, (c, p, h) in enumerate(zip(dims, pairs, heads)):
        if i:
            n += 2 * dims[i - 1] + 4 * dims[i - 1] * c + c
        core = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + 8 * c * c + 5 * c
        lwa = core + (20 if official else 10) * c
        lga = core + 10 * c + (h if official else 1) + 2 * c + 2 * (lcm * lcm * c + c) + 2 * c
        n += p * (lwa + lga)
    return n + 2 * dims[-1] + dims[-1] * nc + nc


def ravlt_arithmetic(dims, depths, *, official: bool, mlp: float = 3.5, proj: int = 1024, nc: int = 1000) -> int:
    """Stem: 4 convs 3x3 (+b) with BN (3->C0/2, C0/2->C0/2 twice, C0/2->C0).  Block: CPE 10C, 2 LN 4C,
    projections 4C^2+4C (qkv + phi, or the fused qkvo), FFN C hd + hd + hd C + C; official adds LePE 26C,
    output projection C^2+C, FFN dwconv 10 hd, layer scales 2C.  Downsampling conv3x3 (+b) + BN.
    Head: conv1x1 C->1024 (+b), BN, conv1x1 1024->nc (+b)."""
    h0 = dims[0] // 2
    n = (27 * h0 + h0 + 2 * h0) + 2 * (9 * h0 * h0 + h0 + 2 * h0) + (9 * h0 * dims[0] + dims[0] + 2 * dims[0])
    for i, (c, d) in enumerate(zip(dims, depths)):
        hd = int(mlp * c)
        blk = 10 * c + 4 * c + 4 * c * c + 4 * c + c * hd + hd + hd * c + c
        if official:
            blk += 26 * c + c * c + c + 10 * hd + 2 * c
        n += d * blk
        if i < len(dims) - 1:
            n += 9 * c * dims[i + 1] + dims[i + 1] + 2 * dims[i + 1]
    return n + dims[-1] * proj + proj + 2 * proj + proj * nc + nc


def lisanet_arithmetic(kind, dims, depths, heads, latent, grids, *, embed="overlap", patch=16, pos=True,
                       nc: int = 1000) -> int:
    """Block: 2 LN 4C, qkv 3C^2+3C, proj C^2+C, MLP 8C^2+5C, LiSA kernels N c D + N D + 2 c D (heads share
    them, c = C/h).  Isotropic: conv patch x patch (+b) + position embedding N C.  Hierarchical: per stage
    conv k x k (+b) + LN 2C (k = 7, 3 overlapping; 4, 2 non-overlapping).  Head: LN 2C + C nc + nc."""
    n = 0
    for i, (c, dep, h, g) in enumerate(zip(dims, depths, heads, grids)):
        tokens, ch = g[0] * g[1], c // h
        cin = 3 if i == 0 else dims[i - 1]
        if kind == "isotropic":
            n += cin * patch * patch * c + c + (tokens * c if pos else 0)
        else:
            k = (7 if i == 0 else 3) if embed == "overlap" else (4 if i == 0 else 2)
            n += cin * k * k * c + c + 2 * c
        n += dep * (4 * c + 4 * c * c + 4 * c + 8 * c * c + 5 * c + tokens * ch * latent + tokens * latent
                    + 2 * ch * latent)
    return n + 2 * dims[-1] + dims[-1] * nc + nc


# ===================================================================================================
# Parameter counts
# ===================================================================================================

@pytest.mark.parametrize("name", OUR_NAMES)
def test_param_count_matches_paper_in_its_setting(name):
    """Every registered model's count, in the setting the paper measured it (PAPER_COUNT_OVERRIDES: the
    official preset for RAVLT), rounds to the paper's figure at the precision it prints (L2ViT Table 2-3,
    RALA Table 1, LiSA Tables 3d, 4, 8b)."""
    e = models.entry(name)
    over = getattr(e.module, "PAPER_COUNT_OVERRIDES", {}).get(name, {})
    cfg, _ = models.create(name, **over)
    assert e.paper_params_m is not None
    gap = getattr(e.module, "COUNT_GAPS", {}).get(name)
    if gap is not None:     # LiSA Table 3b's RPE rows (lisanet.COUNT_GAPS; tests/test_paper_counts.py)
        assert gap.derived == models.param_count(cfg)
        assert _round_m(gap.derived, e.paper_precision) != round(e.paper_params_m, e.paper_precision)
        return
    assert _round_m(models.param_count(cfg), e.paper_precision) == round(e.paper_params_m, e.paper_precision)


@pytest.mark.parametrize("name", list(l2vit.NAMED))
@pytest.mark.parametrize("preset", ["paper", "official"])
def test_l2vit_count_equals_arithmetic(name, preset):
    """L2ViT (Table 13): both presets equal the hand arithmetic; both round to Table 2's 29 / 50 / 89M (the
    official blocks add a second CPE per LWA block and h - 1 more scale parameters per LGA block)."""
    cfg = models.create(name, preset=preset)[0]
    want = l2vit_arithmetic(cfg.dims, cfg.pairs, cfg.num_heads, official=preset == "official")
    assert models.param_count(cfg) == want
    assert _round_m(want, 0) == models.entry(name).paper_params_m


RAVLT_EXPECTED = {  # (paper preset, official preset); Table 1 prints 15 / 26 / 48 / 95 M
    "ravlt_t": (13_750_888, 14_897_768), "ravlt_s": (23_453_096, 25_591_208),
    "ravlt_b": (44_051_080, 48_241_288), "ravlt_l": (86_874_312, 95_242_440),
}


@pytest.mark.parametrize("name", list(ravlt.NAMED))
def test_ravlt_count_equals_arithmetic_and_records_the_paper_preset_gap(name):
    """RALA Table 1 counts the released model: the official preset reproduces it (15 / 26 / 48 / 95M).  The
    paper preset (Eq. 2-6 with a linear phi, a classic FFN, no layer scale) has fewer parameters - exactly the
    released code's LePE (26 C), output projection (C^2 + C), FFN depthwise conv (10 hd) and layer scales
    (2 C) per block fewer.  Recorded gap (paper preset vs Table 1): T 13.75 vs 15, S 23.45 vs 26, B 44.05 vs 48,
    L 86.87 vs 95 M."""
    cfg = models.create(name)[0]
    paper_n, official_n = RAVLT_EXPECTED[name]
    assert models.param_count(cfg) == ravlt_arithmetic(cfg.dims, cfg.depths, official=False) == paper_n
    off = dataclasses.replace(cfg, preset="official")
    assert models.param_count(off) == ravlt_arithmetic(cfg.dims, cfg.depths, official=True) == official_n
    assert _round_m(official_n, 0) == models.entry(name).paper_params_m
    assert _round_m(paper_n, 0) != models.entry(name).paper_params_m


@pytest.mark.parametrize("name", [n for n, v in lisanet.NAMED.items() if v[0].operator == "lisa"])
def test_lisanet_count_equals_arithmetic(name):
    """LiSANet (Tables 2, 3d, 7, 8a): our count equals the hand arithmetic with the LiSA helper's layout
    (heads share W_a (N, c, D), W_b (N, D), B_a, B_b (c, D)) and rounds to the paper's figure."""
    cfg = models.create(name)[0]
    grids = lisanet.stage_grids(cfg, cfg.image_size)
    want = lisanet_arithmetic(cfg.kind, cfg.dims, cfg.depths, cfg.num_heads, cfg.latent, grids, embed=cfg.embed,
                              patch=cfg.patch_size, pos=cfg.pos_embed)
    assert models.param_count(cfg) == want


@pytest.mark.parametrize("latent", [1, 4, 8, 16])
def test_lisanet_isotropic_count_agrees_with_the_lisa_layout_check(latent):
    """The LiSA helper's own layout check (lisa.lisanet_isotropic_param_count, docs/lisa.md) and this
    network give the same count for every D of Table 3d: the two share one parameter layout."""
    cfg = models.create("lisanet_i_t", latent=latent)[0]
    assert models.param_count(cfg) == lisa.lisanet_isotropic_param_count(latent=latent)["total"]


def test_lisanet_h_t_needs_non_overlapping_embeddings():
    """Table 8b prints 12.7M for LiSANet-H-T (D = 8).  With Table 7's overlapping embeddings (7x7/4, 3x3/2)
    the network has 13,563,608 parameters (13.6M); with non-overlapping ones (4x4/4, 2x2/2, as in the
    Uniformer/MViTv2 comparison setting of Table 8a) 12,697,112 = 12.7M.  The network without its LiSA
    kernels has 11,908,200 (11.9M, the Uniformer-H-T figure of the same table)."""
    ht = models.create("lisanet_h_t")[0]
    assert ht.embed == "patch" and models.param_count(ht) == 12_697_112
    assert models.param_count(dataclasses.replace(ht, embed="overlap")) == 13_563_608
    assert _round_m(13_563_608, 1) != 12.7 and _round_m(12_697_112, 1) == 12.7
    kernels = sum(int(np.prod(s)) for k, s in models.param_shapes(ht).items()
                  if k.endswith(("weight_a", "weight_b", "bias_a", "bias_b")))
    assert models.param_count(ht) - kernels == 11_908_200


def test_lisanet_i_t_at_384_records_the_table_9_gap():
    """Table 9: LiSANet-I-T has 6.36M at 224 x 224 and 7.82M at 384 x 384.  The kernels and the position
    embedding grow with the token grid (14 x 14 -> 24 x 24): +380 tokens x (12 blocks x (16 x 16 + 16)
    + 192) = +1,313,280, so 7,676,200 = 7.68M.  The printed 7.82M needs about 146K more (~384 per extra token)
    than any layout whose N-dependent parameters are the kernels and the embedding; recorded, not bent."""
    cfg = models.create("lisanet_i_t", image_size=(384, 384))[0]
    n = models.param_count(cfg)
    assert n == 7_676_200 == 6_362_920 + 380 * (12 * (16 * 16 + 16) + 192)
    assert n == lisa.lisanet_isotropic_param_count(img_size=384)["total"]
    assert _round_m(n, 2) == 7.68 and _round_m(n, 2) != 7.82


def test_param_count_does_not_allocate_and_matches_init():
    """param_count works from param_shapes alone; init_params returns exactly those keys and shapes, and
    the BatchNorm statistics are buffers (not counted)."""
    for name in ("l2vit_tiny", "ravlt_t", "lisanet_h_s"):
        cfg = models.create(name)[0]
        shapes = models.param_shapes(cfg)
        small = FAMILIES[cfg.__module__.rsplit(".", 1)[-1]].reduced(cfg)
        p = models.family_of(name).init_params(small, np.random.default_rng(0))
        assert {k: v.shape for k, v in p.items()} == models.param_shapes(small)
        assert models.param_count(cfg) == sum(int(np.prod(s)) for k, s in shapes.items() if not models.is_buffer(k))
    bn = [k for k in models.param_shapes("ravlt_t") if k.endswith("running_var")]
    assert bn and all(models.is_buffer(k) for k in bn)


# ===================================================================================================
# Forward: shapes, presets, padding rules
# ===================================================================================================

def _reduced(name, **over):
    mod = models.family_of(name)
    cfg = mod.reduced(models.create(name, **over)[0])
    return mod, cfg, mod.init_params(cfg, np.random.default_rng(0))


def _images(cfg, hw, batch=2, seed=1):
    hw = cfg.image_size if hw is None else hw
    return np.random.default_rng(seed).standard_normal((batch, cfg.in_chans) + tuple(hw))


CASES = [("l2vit_tiny", "paper", (15, 13)), ("l2vit_tiny", "official", (9, 20)), ("ravlt_t", "paper", (17, 22)),
         ("ravlt_t", "official", (12, 7)), ("lisanet_h_s", "paper", None), ("lisanet_h_t", "paper", None),
         ("lisanet_i_t", "paper", None)]


@pytest.mark.parametrize("name,preset,hw", CASES)
def test_stage_feature_shapes(name, preset, hw):
    """Every stage's feature map is (B, C_i, H_i, W_i) with the grids of the family's stage_grids (padding
    rules of the module docstrings; non-square images) and the logits are (B, num_classes)."""
    mod, cfg, p = _reduced(name, preset=preset)
    x = _images(cfg, hw)
    logits, feats = mod.run(p, x, cfg)
    grids = mod.stage_grids(cfg, x.shape[2:])
    assert logits.shape == (2, cfg.num_classes)
    assert [f.shape for f in feats] == [(2, c) + g for c, g in zip(cfg.dims, grids)]
    assert np.isfinite(logits).all()


def test_full_size_stage_grids():
    """At 224 x 224 every hierarchical model has the 56/28/14/7 pyramid (strides 4, 8, 16, 32; L2ViT Table
    13, RALA §3.3, LiSA Table 7) and LiSANet-I-T one 14 x 14 stage; non-square 224 x 320 gives 56 x 80 ... 7 x 10."""
    pyramid = [(56, 56), (28, 28), (14, 14), (7, 7)]
    for name in ("l2vit_tiny", "l2vit_base", "ravlt_t", "ravlt_l", "lisanet_h_t", "lisanet_h_s", "lisanet_h_b"):
        cfg = models.create(name)[0]
        assert models.family_of(name).stage_grids(cfg, (224, 224)) == pyramid
        assert models.family_of(name).stage_grids(cfg, (224, 320)) == [(56, 80), (28, 40), (14, 20), (7, 10)]
    assert lisanet.stage_grids(models.create("lisanet_i_t")[0], (224, 224)) == [(14, 14)]


def test_l2vit_padding_rule_is_zero_padding_to_a_multiple_of_four():
    """The released PatchEmbed rule: an image is zero-padded at the bottom/right to a multiple of 4 before the
    stem (and each downsampling input to a multiple of 2), so a 15 x 13 image gives exactly the network
    output of its zero-padded 16 x 16 version."""
    mod, cfg, p = _reduced("l2vit_tiny")
    x = _images(cfg, (15, 13))
    xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 3)))
    np.testing.assert_array_equal(mod.forward(p, x, cfg), mod.forward(p, xp, cfg))


def test_ravlt_stride_two_convs_equal_zero_padding_to_even_sizes():
    """RAVLT pads nothing beyond its 3x3 stride-2 convolutions' own padding of 1: an odd side H gives
    ceil(H/2), and the result is exactly that of the image zero-padded by one row/column at the bottom/right."""
    mod, cfg, p = _reduced("ravlt_t", preset="official")
    x = _images(cfg, (17, 21))
    xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))
    np.testing.assert_array_equal(mod.forward(p, x, cfg), mod.forward(p, xp, cfg))


def test_lisanet_refuses_other_grids_and_resizes_by_appendix_b():
    """LiSA kernels are sized for cfg.image_size's grids: another resolution is refused with a message naming
    resize_params; after resize_params (Appendix B) the model runs at the new size with the count of a model
    built there, and resampling up and back down returns the kernels exactly."""
    mod, cfg, p = _reduced("lisanet_i_t")
    x = _images(cfg, (28, 24))
    with pytest.raises(ValueError, match="resize_params"):
        mod.forward(p, x, cfg)
    p2, cfg2 = mod.resize_params(p, cfg, (28, 24))
    assert mod.forward(p2, x, cfg2).shape == (2, cfg.num_classes)
    assert {k: v.shape for k, v in p2.items()} == models.param_shapes(cfg2)
    p3, cfg3 = mod.resize_params(p2, cfg2, cfg.image_size)
    for k in p:
        if k.endswith(("weight_a", "weight_b")):
            np.testing.assert_array_equal(p3[k], p[k])


def test_presets_select_the_documented_structures():
    """L2ViT official: a second CPE per LWA block and per-head temperatures; RAVLT official: RALA in stages 1-2,
    the released softmax layer in stages 3-4, layer scales, FFN depthwise convs, fused qkvo; paper: RALA
    everywhere, no layer scale; LiSA has no official preset."""
    off = models.param_shapes(models.create("l2vit_tiny", preset="official")[0])
    pap = models.param_shapes("l2vit_tiny")
    assert "stages.0.0.cpe.1.proj.weight" in off and "stages.0.0.cpe.1.proj.weight" not in pap
    assert off["stages.2.1.attn.temperature"] == (12, 1, 1) and pap["stages.2.1.attn.scale"] == (1,)
    ro = models.create("ravlt_t", preset="official")[0]
    rp = models.create("ravlt_t")[0]
    assert [ro.attention(i) for i in range(4)] == ["rala", "rala", "softmax", "softmax"]
    assert [rp.attention(i) for i in range(4)] == ["rala"] * 4
    so = models.param_shapes(ro)
    assert so["layers.0.blocks.0.gamma_1"] == (1, 64, 1, 1) and "layers.0.blocks.0.ffn.dwconv.weight" in so
    assert "layers.0.blocks.0.gamma_1" not in models.param_shapes(rp)
    with pytest.raises(ValueError, match="official"):
        models.create("lisanet_i_t", preset="official")


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_ravlt_network_block_is_the_rala_block(preset):
    """ravlt_net_block composes rala.py's public pieces: with RALA attention it is rala.ravlt_block exactly
    (same operations, same order; layer scales included in the official preset)."""
    bc = rala.RAVLTBlockConfig.preset(preset, dim=16, num_heads=2, mlp_ratio=2.0)
    shapes = rala.ravlt_block_param_shapes(bc)
    rng = np.random.default_rng(3)
    p = {k: rng.standard_normal(s) / np.sqrt(np.prod(s[1:]) if len(s) > 1 else 1.0) for k, s in shapes.items()}
    x = rng.standard_normal((2, 16, 5, 6) if preset == "official" else (2, 5, 6, 16))
    np.testing.assert_array_equal(ravlt.ravlt_net_block(x, p, bc), rala.ravlt_block(x, p, bc))


def test_rope_softmax_attention_reduces_to_softmax_attention_without_rope_lepe_gate():
    """The released softmax layer: with zero rotation angles (a 1 x 1 grid), no LePE and the gate block of the
    fused projection set to give o = 1, it is plain multi-head softmax attention followed by the projection."""
    acfg = rala.RALAConfig.preset("official", dim=8, num_heads=2, lepe_kernel=0)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((32, 8, 1, 1)) / 3
    w[24:] = 0.0
    b = np.concatenate([rng.standard_normal(24) / 3, np.ones(8)])
    wp = rng.standard_normal((8, 8, 1, 1)) / 3
    p = {"qkvo.weight": w, "qkvo.bias": b, "proj.weight": wp, "proj.bias": np.zeros(8)}
    x = rng.standard_normal((1, 8, 1, 1))
    out = ravlt.rope_softmax_attention(x, p, acfg)
    v = (w[16:24, :, 0, 0] @ x[0, :, 0, 0] + b[16:24])          # one token: softmax weight 1, output = v
    ref = wp[:, :, 0, 0] @ v
    bound = numerics.Bound(np.abs(wp[:, :, 0, 0]) @ (np.abs(w[16:24, :, 0, 0]) @ np.abs(x[0, :, 0, 0])
                                                    + np.abs(b[16:24])), 2 * (8 + 1) + 4,
                           "two length-9 products, the softmax of one logit (exactly 1), the gate product")
    numerics.assert_close(out[0, :, 0, 0], ref, bound, F64, name="rope_softmax_attention one token")


# ===================================================================================================
# Batched vs per sample, determinism, taps
# ===================================================================================================

@pytest.mark.parametrize("name,preset,hw", CASES)
def test_batched_equals_per_sample(name, preset, hw):
    """Every unit of the network run on a batch of 3 equals the unit run on each sample alone, within the
    unit's float64 error bound (both runs are float64 evaluations of the same function in different
    summation orders; Bound.array counts both errors).  The features and logits are the units' outputs."""
    mod, cfg, p = _reduced(name, preset=preset)
    x = _images(cfg, hw, batch=3)
    taps: dict = {}
    mod.run(p, x, cfg, taps=taps)
    inp = x
    for unit in mod.unit_names(cfg):
        batched = mod.run_unit(p, unit, inp, cfg)
        single = np.concatenate([mod.run_unit(p, unit, inp[i:i + 1], cfg) for i in range(3)])
        bound = mod.unit_bound(p, unit, inp, cfg, dtype=F64)
        numerics.assert_close(single, batched, bound, F64, name=f"{name} {unit} per sample vs batched")
        inp = taps[unit]


@pytest.mark.parametrize("name,preset,hw", CASES[:1] + CASES[3:4] + CASES[5:6])
def test_deterministic(name, preset, hw):
    """Two runs on the same inputs give bit-identical logits and features (pure functions, no state)."""
    mod, cfg, p = _reduced(name, preset=preset)
    x = _images(cfg, hw)
    a, fa = mod.run(p, x, cfg)
    b, fb = mod.run(p, x, cfg)
    np.testing.assert_array_equal(a, b)
    for u, v in zip(fa, fb):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name,preset,hw", CASES)
def test_run_is_the_composition_of_units_and_taps_record_them(name, preset, hw):
    """run() is exactly the chain of run_unit() calls (the comparison points of the equivalence suite), and
    taps record every unit's output; features are the outputs of each stage's last unit."""
    mod, cfg, p = _reduced(name, preset=preset)
    x = _images(cfg, hw)
    taps: dict = {}
    logits, feats = mod.run(p, x, cfg, taps=taps)
    y = x
    for unit in mod.unit_names(cfg):
        y = mod.run_unit(p, unit, y, cfg)
        np.testing.assert_array_equal(y, taps[unit])
    np.testing.assert_array_equal(y, logits)
    np.testing.assert_array_equal(mod.forward(p, x, cfg), logits)
    for f, g in zip(mod.features(p, x, cfg), feats):
        np.testing.assert_array_equal(f, g)


@pytest.mark.parametrize("name,preset,hw", CASES[:4] + CASES[5:])
def test_forward_bounds_cover_every_stage_and_the_logits_and_units_are_checked(name, preset, hw):
    """forward_bounds (models._netparts' interpreter along the units' error analyses) gives one bound per stage
    feature map, shaped like it and described by stage, and one for the logits; run_unit and unit_bound refuse
    a unit outside unit_names, naming it."""
    mod, cfg, p = _reduced(name, preset=preset)
    x = _images(cfg, hw, batch=1)
    logits, feats = mod.run(p, x, cfg)
    fb, lb = mod.forward_bounds(p, x, cfg, dtype="float32")
    assert [np.shape(b.scale) for b in fb] == [f.shape for f in feats]
    assert np.shape(lb.scale) == logits.shape
    assert [b.note.split(":")[0].split(" ", 1)[1] for b in fb] == [f"stage {i + 1} features" for i in range(len(fb))]
    for call in (lambda: mod.run_unit(p, "nope", feats[0], cfg),
                 lambda: mod.unit_bound(p, "nope", feats[0], cfg, dtype="float32")):
        with pytest.raises(ArgumentError, match="unknown unit 'nope'"):
            call()


@settings(max_examples=5)  # each example runs a whole (reduced) network; 5 keeps the file inside its budget
@given(h=st.integers(1, 20), w=st.integers(1, 20), preset=st.sampled_from(["paper", "official"]))
def test_any_resolution_runs_hypothesis(h, w, preset):
    """L2ViT and RAVLT accept any H, W >= 1 (non-square included): stage grids follow the documented rules
    and the outputs are finite."""
    for name in ("l2vit_tiny", "ravlt_t"):
        mod, cfg, p = _reduced(name, preset=preset)
        logits, feats = mod.run(p, _images(cfg, (h, w), batch=1), cfg)
        assert [f.shape[2:] for f in feats] == mod.stage_grids(cfg, (h, w))
        assert np.isfinite(logits).all()


# ===================================================================================================
# Input validation, MAC counts
# ===================================================================================================

def test_bad_inputs_raise_clear_errors():
    """Wrong channel count, rank or dtype name the argument; bad configs name the field."""
    mod, cfg, p = _reduced("l2vit_tiny")
    with pytest.raises(ValueError, match="images"):
        mod.forward(p, np.zeros((1, 4, 8, 8)), cfg)
    with pytest.raises(ValueError, match="images"):
        mod.forward(p, np.zeros((4, 8, 8)), cfg)
    with pytest.raises(TypeError, match="images"):
        mod.forward(p, np.zeros((1, 3, 8, 8), dtype=np.int64), cfg)
    with pytest.raises(ValueError, match="preset"):
        models.create("ravlt_t", preset="released")
    with pytest.raises(ValueError, match="stage_attention"):
        models.create("ravlt_t", stage_attention=("rala", "softmax"))
    with pytest.raises(ValueError, match="softmax"):
        models.create("ravlt_t", stage_attention=("rala", "rala", "softmax", "softmax"))  # paper: no qkvo
    with pytest.raises(ValueError, match="unit"):
        mod.run_unit(p, "stages.9.9", np.zeros((1, 16, 2, 2)), cfg)


@pytest.mark.parametrize("name,field", [("l2vit_tiny", "dims"), ("l2vit_tiny", "pairs"), ("ravlt_t", "depths"),
                                        ("ravlt_t", "num_heads"), ("lisanet_h_t", "dims"), ("lisanet_h_t", "depths"),
                                        ("flatten_swin_t", "depths"), ("flatten_swin_t", "num_heads")])
def test_per_stage_sizes_refuse_floats_instead_of_truncating(name, field):
    """A per-stage size given as a float (96.9, 2.7) is refused naming the field and the stage, not truncated
    to an int (it was: L2ViTNetConfig(dims=(96.9, ...)) built a 96-channel stage); an empty list and a 0 too."""
    base = models.create(name)[0]
    value = getattr(base, field)
    with pytest.raises(TypeError, match=rf"'{field}\[0\]'.*integer.*{value[0] + 0.5}"):
        dataclasses.replace(base, **{field: (value[0] + 0.5,) + tuple(value[1:])})
    with pytest.raises((TypeError, ValueError), match=field):
        dataclasses.replace(base, **{field: ()})
    with pytest.raises(ValueError, match=rf"'{field}\[0\]'.*>= 1"):
        dataclasses.replace(base, **{field: (0,) + tuple(value[1:])})


@pytest.mark.parametrize("name", ["l2vit_small", "ravlt_b", "lisanet_h_b"])
def test_macs_are_consistent_with_the_parameter_shapes(name):
    """The MAC counter and the parameter shapes agree: every block's MLP/FFN costs tokens x (fc1 + fc2
    weights) MACs, and the totals are positive integers."""
    mod = models.family_of(name)
    cfg = models.create(name)[0]
    m = mod.macs(cfg, (224, 224))
    shapes = models.param_shapes(cfg)
    grids = mod.stage_grids(cfg, (224, 224))
    checked = 0
    for key, val in m.items():
        parts = key.split(".")
        if parts[-1] in ("mlp", "ffn"):
            pre = key
            i = int(parts[1])
            n = grids[i][0] * grids[i][1]
            w = sum(int(np.prod(shapes[f"{pre}.{fc}.weight"])) for fc in ("fc1", "fc2"))
            assert val == n * w
            checked += 1
    assert checked == sum(cfg.depths) and counting.total(m) > 0
