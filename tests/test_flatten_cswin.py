"""FLatten-CSwin-T/S/B (refimpl.models.flatten_cswin): parameter counts and MACs against FLatten's Table 8, re-derived
by independent closed-form arithmetic (Table 15 / CSwin §3 / the released factories), the stage and stripe
geometry, the cross-shaped attention against a direct loop oracle on a tiny grid (softmax stripes with LePE,
focused linear attention written from FLatten Eq. 4-6, 10-12), feature maps, batched == per-sample, the released
initialisation, and argument validation (config, params, units).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import refimpl.models as rm
from refimpl import numerics
from refimpl.errors import ArgumentError, ArgumentTypeError, ParameterKeyError, ParameterShapeError
from refimpl.models import common, counting, flatten_cswin as fc
from tests import kernel_helpers as kh
from tests.test_initialisers import Checker

SEED = 5
NAMES = ("flatten_cswin_t", "flatten_cswin_s", "flatten_cswin_b")

#: FLatten Table 8 (Appendix C): #Params (M) and FLOPs (G) at 224^2 (and B at 384^2).
PAPER = {"flatten_cswin_t": (21, 4.3), "flatten_cswin_s": (35, 6.9), "flatten_cswin_b": (75, 15.0)}
PAPER_B_384 = (78, 46.4)

#: (C, depths, heads) of FLatten Table 15 = the released factories FLatten_CSWin_64_24181_tiny_224, ..._24322_small,
#: FLatten_CSWin_96_36292_base.
ARCH = {"flatten_cswin_t": (64, (2, 4, 18, 1), (2, 4, 8, 16)), "flatten_cswin_s": (64, (2, 4, 32, 2), (2, 4, 8, 16)),
        "flatten_cswin_b": (96, (3, 6, 29, 2), (4, 8, 16, 32))}


# ===================================================================================================
# Independent closed-form arithmetic
# ===================================================================================================

def cswin_count(c0, depths, heads, *, preset="official", img=224, types="LLSS", k=5, classes=1000):
    """Parameters: stem conv 7x7 (+ bias) and LN; per block 2 LN, qkv (3C^2 + 3C), proj, MLP (C -> 4C -> C), LePE
    (3x3 depthwise + bias over all C channels, whatever the branches: 10 C); focused blocks (one branch over the
    whole grid) add the DWC (official: a shared bank d(k^2 + 1), + scale C + positional encoding N C; paper:
    C (k^2 + 1)); merges conv 3x3 (+ bias) and LN; final LN; head."""
    total = 3 * 49 * c0 + c0 + 2 * c0
    for i in range(4):
        c, n, d = c0 << i, (img // 4 >> i) ** 2, (c0 << i) // heads[i]
        if i:
            total += 9 * (c // 2) * c + c + 2 * c
        block = 4 * c + 3 * c * c + 3 * c + c * c + c + 8 * c * c + 5 * c + 10 * c
        if types[i] == "L":
            block += d * (k * k + 1) + c + n * c if preset == "official" else c * (k * k + 1)
        total += depths[i] * block
    cl = c0 << 3
    return total + 2 * cl + cl * classes + classes


def cswin_macs(c0, depths, heads, *, img=224, sw=(1, 2, 7, 7), types="LLSS", k=5, classes=1000):
    """MACs: stem N_1 C 3 49; per block qkv 3 N C^2, proj N C^2, MLP 8 N C^2, LePE 9 N C; the core: focused (whole
    grid) K^T V and Q (K^T V) 2 N C d + normaliser N C + DWC N C k^2; softmax Q K^T and A V 2 N n C with n the
    window's tokens (stripes: sw x W and H x sw, both sw W on a square grid; the last stage: the whole grid);
    merges N_i 9 C_{i-1} C_i; head."""
    g = img // 4
    total = g * g * c0 * 3 * 49
    for i in range(4):
        c, gi = c0 << i, g >> i
        n, d = gi * gi, c // heads[i]
        if i:
            total += n * 9 * (c // 2) * c
        block = 12 * n * c * c + 9 * n * c
        if types[i] == "L":
            block += 2 * n * c * d + n * c + n * c * k * k
        else:
            window = gi * gi if i == 3 else sw[i] * gi
            block += 2 * n * window * c
        total += depths[i] * block
    return total + (c0 << 3) * classes


# ===================================================================================================
# Parameter counts and MACs against FLatten Table 8
# ===================================================================================================

EXACT = {"flatten_cswin_t": 21_201_768, "flatten_cswin_s": 35_451_752, "flatten_cswin_b": 74_867_032}
EXACT_PAPER_PRESET = {"flatten_cswin_t": 20_409_960, "flatten_cswin_s": 34_659_944, "flatten_cswin_b": 73_091_080}
MACS = {"flatten_cswin_t": 4_324_253_184, "flatten_cswin_s": 6_783_052_800, "flatten_cswin_b": 14_913_275_904}


@pytest.mark.parametrize("name", NAMES)
def test_param_counts_reproduce_table_8(name):
    """FLatten Table 8: FLatten-CSwin-T/S/B 21M / 35M / 75M.  With the released module (preset "official": the
    positional encodings over the whole 56 x 56 / 28 x 28 grids are in the count) ours are 21,201,768 /
    35,451,752 / 74,867,032, which round to the printed figures; they equal the closed-form arithmetic for
    both presets ("paper": 20.41M / 34.66M / 73.09M)."""
    c, depths, heads = ARCH[name]
    official = rm.param_count(rm.create(name, **fc.PAPER_COUNT_OVERRIDES[name])[0])
    assert official == EXACT[name] == cswin_count(c, depths, heads)
    assert counting._round_m(official, 0) == PAPER[name][0]
    assert rm.param_count(name) == EXACT_PAPER_PRESET[name] == cswin_count(c, depths, heads, preset="paper")
    assert name not in fc.COUNT_GAPS


def test_b_384_counts():
    """FLatten Table 8, FLatten-CSwin-B at 384^2: 78M / 46.4G.  Built as released (split_size (1, 2, 12, 12), the
    focused stages over the whole 96 x 96 / 48 x 48 grids): 78,369,112 parameters (78M, the positional
    encodings grow with the grid) and 46,304,753,664 MACs (46.3G: 0.2% below the printed 46.4G)."""
    cfg = rm.create("flatten_cswin_b", preset="official", **fc.B_384)[0]
    assert rm.param_count(cfg) == 78_369_112 == cswin_count(96, (3, 6, 29, 2), (4, 8, 16, 32), img=384)
    assert counting._round_m(rm.param_count(cfg), 0) == PAPER_B_384[0]
    total = counting.total(fc.macs(cfg))
    assert total == 46_304_753_664 == cswin_macs(96, (3, 6, 29, 2), (4, 8, 16, 32), img=384, sw=(1, 2, 12, 12))
    assert round(total / 1e9, 1) == 46.3


@pytest.mark.parametrize("name", NAMES)
def test_macs_against_table_8(name):
    """FLatten Table 8 FLOPs 4.3G / 6.9G / 15.0G (= CSwin-T/S/B's own column, repeated).  Ours (counting.py's
    convention, both presets): 4.324G (4.3: matches), 6.783G (6.8), 14.913G (14.9), equal to the closed form.
    The same arithmetic gives the CSwin baselines 4.324G / 6.801G / 14.955G against CSwin's printed 4.3G / 6.9G /
    15.0G: S is 0.1G short in CSwin's own row, and FLatten's T and B rows print CSwin's figures although their
    depths differ (tests/test_macs.py GAPS)."""
    c, depths, heads = ARCH[name]
    cfg = rm.create(name)[0]
    total = counting.total(fc.macs(cfg))
    assert total == MACS[name] == cswin_macs(c, depths, heads)
    assert counting.total(fc.macs(rm.create(name, preset="official")[0])) == total
    assert (round(total / 1e9, 1) == PAPER[name][1]) == (name == "flatten_cswin_t")
    baseline = {"flatten_cswin_t": ((1, 2, 21, 1), 4.3), "flatten_cswin_s": ((2, 4, 32, 2), 6.8),
                "flatten_cswin_b": ((2, 4, 32, 2), 15.0)}[name]
    cs = counting.total(fc.macs(fc.FlattenCSwinConfig(embed_dim=c, depths=baseline[0], num_heads=heads,
                                                      attn_types="SSSS")))
    assert cs == cswin_macs(c, baseline[0], heads, types="SSSS") and round(cs / 1e9, 1) == baseline[1]


# ===================================================================================================
# Geometry, presets, feature maps
# ===================================================================================================

def test_stage_geometry_and_stripe_order():
    """At 224: grids 56, 28, 14, 7; stages 1-2 focused over the whole grid (released CSWIN_LA_SPLIT_SIZE
    56-28-14-7), stage 3 two branches of 7-wide stripes (horizontal 7 x 14, vertical 14 x 7), stage 4 global.
    "paper": horizontal stripes first (CSwin Eq. 2); "official": vertical first (released idx 0)."""
    p = rm.create("flatten_cswin_t")[0]
    o = rm.create("flatten_cswin_t", preset="official")[0]
    assert p.stage_grids == [(56, 56), (28, 28), (14, 14), (7, 7)]
    assert [p.stripe_width(i) for i in range(4)] == [None, None, 7, None]
    assert p.branch_windows(2) == [(7, 14), (14, 7)] and o.branch_windows(2) == [(14, 7), (7, 14)]
    assert rm.create("flatten_cswin_t", stripe_order="vertical_first")[0].branch_windows(2) == [(14, 7), (7, 14)]
    assert p.branch_dims(2) == (128, 4) and p.branch_dims(0) == (64, 2)
    assert p.attention_config(0).positional_encoding is False and o.attention_config(0).positional_encoding is True
    assert rm.create("flatten_cswin_b")[0].branch_dims(3) == (768, 32)
    # CSwin's own stripes in the focused stages (not released): two branches of C/2 channels
    s = rm.create("flatten_cswin_t", focused_split=(1, 2, None, None))[0]
    assert s.branch_windows(0) == [(1, 56), (56, 1)] and s.attention_config(0).dim == 32


def test_features_shapes_and_batched_equals_per_sample():
    """Feature maps (B, C_i, H_i, W_i) of the reduced non-square network; every unit's batched output equals
    the unit run sample by sample through the unit's float64 bound."""
    cfg = fc.reduced(rm.create("flatten_cswin_t", preset="official")[0])
    params = fc.init_params(cfg, SEED)
    images = np.random.default_rng(SEED).standard_normal((2, 3, *cfg.img_size))
    taps: dict = {}
    logits, feats = fc.run(params, images, cfg, taps=taps)
    assert logits.shape == (2, 10)
    assert [f.shape for f in feats] == [(2, 32, 8, 16), (2, 64, 4, 8), (2, 128, 2, 4), (2, 256, 1, 2)]
    np.testing.assert_array_equal(fc.forward(params, images, cfg), logits)
    x = images
    for unit in fc.unit_names(cfg):
        bnd = fc.unit_bound(params, unit, x, cfg, dtype="float64")
        one = fc.run_unit(params, unit, x[1:], cfg)
        numerics.assert_close(one, taps[unit][1:], numerics.Bound(np.asarray(bnd.scale)[1:], bnd.k, bnd.note),
                              "float64", name=f"{unit} sample 1")
        x = taps[unit]


def test_units_compose_run_and_parts_compose_blocks():
    """The network framework (models._netparts) runs the units: run's taps are the units chained from the images,
    its features the stage-closing blocks' tokens on their grids, a block unit is its parts "attn" then "mlp",
    the bounds are named by unit and part, and the stem's bound checks its images as run_unit does."""
    cfg = fc.reduced(rm.create("flatten_cswin_t")[0])
    params = fc.init_params(cfg, SEED)
    images = np.random.default_rng(SEED).standard_normal((1, 3, *cfg.img_size))
    taps: dict = {}
    logits, feats = fc.run(params, images, cfg, taps=taps)
    assert list(taps) == fc.unit_names(cfg)
    x, closing = images, ["stage1.1", "stage2.0", "stage3.0", "stage4.0"]
    for unit in fc.unit_names(cfg):
        y = fc.run_unit(params, unit, x, cfg)
        np.testing.assert_array_equal(y, taps[unit])
        parts = fc.unit_parts(cfg, unit)
        assert parts == (("attn", "mlp") if unit.startswith("stage") else ())
        z = x
        for part in parts:
            assert fc.unit_part_bound(params, unit, part, z, cfg, dtype="float32").note.startswith(
                f"unit {unit}, {part}:")
            z = fc.run_unit_part(params, unit, part, z, cfg)
        if parts:
            np.testing.assert_array_equal(z, y)
        x = y
    np.testing.assert_array_equal(logits, taps["head"])
    for f, unit, (gh, gw) in zip(feats, closing, cfg.stage_grids):
        np.testing.assert_array_equal(f, taps[unit].transpose(0, 2, 1).reshape(1, -1, gh, gw))
    fb, lb = fc.forward_bounds(params, images, cfg, dtype="float32")
    assert [b.note.split(":")[0] for b in fb] == [f"features after {u}" for u in closing]
    assert lb.note.startswith("logits:")
    assert fc.unit_bound(params, "stem", images, cfg, dtype="float32").note.startswith("unit stem:")
    with pytest.raises(ArgumentError, match="images"):
        fc.unit_bound(params, "stem", np.zeros((1, 3, 64, 64)), cfg, dtype="float32")
    with pytest.raises(ArgumentError, match="unknown unit"):
        fc.unit_bound(params, "stage5.0", images, cfg, dtype="float32")
    with pytest.raises(ArgumentError, match="part"):
        fc.unit_part_bound(params, "head", "mlp", taps["stage4.0"], cfg, dtype="float32")


def test_released_init():
    """scheme="released": Linear weights N(0, 0.02^2) and zero biases, LayerNorm 1 / 0, convolutions
    U(+-1/sqrt(fan_in)), the scale and the positional encoding zeros; the same keys as param_shapes."""
    cfg = rm.create("flatten_cswin_t", preset="official", depths=(1, 1, 1, 1))[0]
    p = fc.init_params(cfg, 0, scheme="released")
    assert {k: v.shape for k, v in p.items()} == rm.param_shapes(cfg)
    assert not p["stage1.0.attns.0.scale"].any() and not p["stage1.0.attns.0.positional_encoding"].any()
    assert not p["stage3.0.qkv.bias"].any()
    law = Checker()                         # N(0, 0.02^2) by the sampling tolerances of the false-alarm budget
    law.add("stage3.0.mlp.fc1.weight", p["stage3.0.mlp.fc1.weight"], ("normal", 0.0, 0.02))
    assert law.run(pooled=False) == 2
    assert (p["norm.weight"] == 1).all() and not p["merge1.norm.bias"].any()
    assert np.abs(p["merge1.conv.weight"]).max() <= 1 / math.sqrt(64 * 9)
    assert np.abs(p["stage1.0.attns.0.dwc.bias"]).max() <= 1 / 5 and p["stage1.0.attns.0.dwc.bias"].any()
    with pytest.raises(ArgumentError, match="scheme"):
        fc.init_params(cfg, 0, scheme="xavier")


# ===================================================================================================
# The stripe attention against a direct loop oracle
# ===================================================================================================

def _lepe_loop(v, w, b, win):
    """Depthwise 3x3, zero padding, within one window: v (n, C) row-major over win -> (n, C)."""
    wh, ww = win
    g = v.reshape(wh, ww, -1)
    out = np.zeros_like(g)
    for r in range(wh):
        for s in range(ww):
            acc = b.copy()
            for dr in (-1, 0, 1):
                for ds in (-1, 0, 1):
                    if 0 <= r + dr < wh and 0 <= s + ds < ww:
                        acc = acc + w[:, 0, dr + 1, ds + 1] * g[r + dr, s + ds]
            out[r, s] = acc
    return out.reshape(wh * ww, -1)


def _focus(x, p):
    """FLatten Eq. 6 on one head's row: f_p(ReLU(x)) = ||r|| / ||r^p|| r^p."""
    r = np.maximum(x, 0.0)
    t = r ** p
    return t * (np.linalg.norm(r) / np.linalg.norm(t)) if t.any() else t


def _oracle(x, params, cfg, i):
    """The block attention of stage i written as loops: for every branch, every window, every head, every query:
    softmax over the window's keys (CSwin Eq. 1) or FLatten's Eq. 4 with phi_p of Eq. 6 and the per-channel DWC
    of Eq. 10-12 (preset "paper"); + LePE; concatenated; proj."""
    b, n, c = x.shape
    gh, gw = cfg.stage_grids[i]
    qkv = x @ params["qkv.weight"].T + params["qkv.bias"]
    cb, hb = cfg.branch_dims(i)
    d = cb // hb
    out = np.zeros((b, n, c))
    for br, (wh, ww) in enumerate(cfg.branch_windows(i)):
        pa = {k[len(f"attns.{br}."):]: v for k, v in params.items() if k.startswith(f"attns.{br}.")}
        for bi in range(b):
            for r0 in range(0, gh, wh):
                for s0 in range(0, gw, ww):
                    idx = [(r0 + r) * gw + s0 + s for r in range(wh) for s in range(ww)]
                    sl = slice(br * cb, (br + 1) * cb)
                    q, k, v = (qkv[bi, idx, j * c:(j + 1) * c][:, sl] for j in range(3))
                    y = _lepe_loop(v, pa["get_v.weight"], pa["get_v.bias"], (wh, ww))
                    if cfg.attn_types[i] == "L":
                        y = y + _dwc_loop(v, pa["dwc.weight"], pa["dwc.bias"], (wh, ww))
                    for h in range(hb):
                        hs = slice(h * d, (h + 1) * d)
                        for t in range(len(idx)):
                            if cfg.attn_types[i] == "L":
                                fq = _focus(q[t, hs], cfg.focusing_factor)
                                fk = np.stack([_focus(k[u, hs], cfg.focusing_factor) for u in range(len(idx))])
                                wts = fk @ fq
                                y[t, hs] += (wts @ v[:, hs]) / wts.sum()
                            else:
                                logits = k[:, hs] @ q[t, hs] / math.sqrt(d)
                                a = np.exp(logits - logits.max())
                                y[t, hs] += (a / a.sum()) @ v[:, hs]
                    out[bi, idx, sl] = y
    return out @ params["proj.weight"].T + params["proj.bias"]


def _dwc_loop(v, w, b, win):
    """Depthwise k x k (k = w's size), zero padding, within one window, one kernel per channel (preset "paper")."""
    wh, ww = win
    kk = w.shape[-1]
    g = v.reshape(wh, ww, -1)
    out = np.zeros_like(g)
    for r in range(wh):
        for s in range(ww):
            acc = b.copy()
            for dr in range(kk):
                for ds in range(kk):
                    rr, ss = r + dr - kk // 2, s + ds - kk // 2
                    if 0 <= rr < wh and 0 <= ss < ww:
                        acc = acc + w[:, 0, dr, ds] * g[rr, ss]
            out[r, s] = acc
    return out.reshape(wh * ww, -1)


@pytest.mark.parametrize("order", ["horizontal_first", "vertical_first"])
def test_stripe_attention_equals_loop_oracle(order):
    """On a 32 x 64 image (stage grids 8x16 .. 1x2), C = 32: the stripe attention of a two-branch softmax stage
    (stage 2, sw = 2: 2 x 8 and 4 x 2 windows), of the focused stage in stripes (stage 1, sw = 2, preset
    "paper") and of the global softmax stage 4 equal the loop oracle to float64 rounding."""
    cfg = fc.FlattenCSwinConfig(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 8), attn_types="LSSS",
                                split_size=(1, 2, 1, 1), focused_split=(2, None, None, None), img_size=(32, 64),
                                stripe_order=order, num_classes=10)
    assert cfg.branch_windows(1) == ([(2, 8), (4, 2)] if order == "horizontal_first" else [(4, 2), (2, 8)])
    assert cfg.branch_windows(0) == ([(2, 16), (8, 2)] if order == "horizontal_first" else [(8, 2), (2, 16)])
    params = fc.init_params(cfg, SEED)
    rng = np.random.default_rng(SEED)
    for i in (0, 1, 3):
        p = {k[len(f"stage{i + 1}.0."):]: v for k, v in params.items() if k.startswith(f"stage{i + 1}.0.")}
        gh, gw = cfg.stage_grids[i]
        x = rng.standard_normal((2, gh * gw, cfg.stage_dim(i)))
        got = fc.stripe_attention(x, p, cfg, i)
        # both sides float64, each within the stripe attention's own running bound: twice it (error model)
        bound = common.to_bound(fc._e_stripe_attention(common.e_exact(x), p, cfg, i, None), f"stage {i + 1}")
        kh.agree_float64(got, _oracle(x, p, cfg, i), kh.twice_bound(bound), f"stage {i + 1} stripe attention")


# ===================================================================================================
# Validation
# ===================================================================================================

def test_bad_configs_raise_clear_errors():
    """Config errors name the argument (refimpl.errors: ArgumentError is a ValueError, ArgumentTypeError a
    TypeError)."""
    bad = [({"preset": "released"}, ArgumentError, "preset"),
           ({"stripe_order": "diagonal"}, ArgumentError, "stripe_order"),
           ({"attn_types": "LLXS"}, ArgumentError, "attn_types"),
           ({"depths": (2, 4, 18)}, ArgumentError, "one entry per stage"),
           ({"depths": 18}, ArgumentTypeError, "depths"),
           ({"num_heads": (2, 4, 7, 16)}, ArgumentError, "num_heads"),
           ({"embed_dim": 63}, ArgumentError, "num_heads"),
           ({"img_size": (224, 200)}, ArgumentError, "img_size"),
           ({"split_size": (1, 2, 5, 7)}, ArgumentError, "split_size"),
           ({"focused_split": (3, None, None, None)}, ArgumentError, "focused_split"),
           ({"focusing_factor": 0.5}, ArgumentError, "'p'"),
           ({"kernel_size": 4}, ArgumentError, "kernel_size"),
           ({"qkv_bias": 1}, ArgumentTypeError, "qkv_bias"),
           ({"layer_norm_eps": -1.0}, ValueError, "layer_norm_eps")]
    for overrides, exc, match in bad:
        with pytest.raises(exc, match=match):
            rm.create("flatten_cswin_t", **overrides)
    with pytest.raises(ArgumentError, match="even count"):
        rm.create("flatten_cswin_t", num_heads=(2, 4, 9, 16), embed_dim=72)


def test_bad_params_and_inputs_raise_clear_errors():
    """Strict state_dict keys (missing, extra with "did you mean", wrong shape), unknown units and parts, wrong
    token or image shapes, wrong config type, a MAC count at another resolution."""
    cfg = fc.reduced(rm.create("flatten_cswin_t")[0])
    params = fc.init_params(cfg, 0)
    images = np.zeros((1, 3, *cfg.img_size))
    missing = dict(params)
    del missing["stage3.0.attns.1.get_v.weight"]
    with pytest.raises(ParameterKeyError, match="stage3.0.attns.1.get_v.weight"):
        fc.forward(missing, images, cfg)
    extra = dict(params, **{"stage1.0.attns.0.positional_encodings": np.zeros((1, 128, 32))})
    with pytest.raises(ParameterKeyError, match="positional_encoding"):
        fc.forward(extra, images, cfg)
    wrong = dict(params, **{"stage1.0.qkv.weight": np.zeros((96, 33))})
    with pytest.raises(ParameterShapeError, match="stage1.0.qkv.weight"):
        fc.forward(wrong, images, cfg)
    with pytest.raises(ArgumentError, match="unknown unit"):
        fc.run_unit(params, "stage5.0", images, cfg)
    with pytest.raises(ArgumentError, match="part"):
        fc.run_unit_part(params, "merge1", "attn", np.zeros((1, 128, 32)), cfg)
    with pytest.raises(ValueError):
        fc.run_unit(params, "stage2.0", np.zeros((1, 128, 32)), cfg)
    with pytest.raises(ValueError):
        fc.forward(params, np.zeros((1, 3, 64, 64)), cfg)
    with pytest.raises(ArgumentTypeError, match="FlattenCSwinConfig"):
        fc.param_shapes(rm.create("flatten_pvt_t")[0])
    with pytest.raises(ArgumentError, match="image_hw"):
        fc.macs(cfg, (224, 224))


def test_released_state_dict_converts_strictly():
    """refimpl.models.convert_state_dict(source="official"): the released names are ours (no renames, no
    buffers: CSwin's modules register none); every key consumed, a stray key refused."""
    cfg = fc.reduced(rm.create("flatten_cswin_t", preset="official")[0])
    released = {k: v.astype(np.float32) for k, v in fc.init_params(cfg, 1).items()}
    params = rm.convert_state_dict(cfg, released, source="official")
    assert list(params) == list(rm.param_shapes(cfg))
    assert all(params[k].dtype == np.float64 and np.array_equal(params[k], released[k]) for k in released)
    with pytest.raises(ParameterKeyError, match="stage1.0.attns.0.attn_drop"):
        rm.convert_state_dict(cfg, dict(released, **{"stage1.0.attns.0.attn_drop": np.zeros(1)}), source="official")
    with pytest.raises(ArgumentError, match="official"):
        rm.convert_state_dict(fc.reduced(rm.create("flatten_cswin_t")[0]), released, source="official")
