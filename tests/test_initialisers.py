"""Initialisers pinned independently of the code under test.

Each init function states its law in its docstring (and config.py's comments); this module writes that law
out again, key by key, and checks the drawn parameters against it:

* exact values exactly (L2ViT's scale sqrt(C) and temperature d^-1/2; RAVLT's layer-scale initial values,
  which are the released code's ``layer_init_values``);
* random values by statistics whose tolerance is derived from the sample size and a false-alarm budget
  (config.VERDICT_FALSE_ALARM, Bonferroni-split over the checks of a test): for N(mu, sigma^2) laws the mean
  of the n standardised draws is N(0, 1/n) and their sum of squares is chi-square(n), both exact; for
  U(lo, hi) laws the range is checked exactly and the mean by Hoeffding's inequality.  No hand-picked
  tolerance: a law off by a factor (an std of 0.02 where 1/sqrt(fan_in) is documented, 0.1 where 0.5 is) is
  rejected by many standard errors.

The network inits (models.*.init_params / create(init=True)) are documented as test initialisations, not the
papers' training ones (config.NET_INIT_*); the released training inits appear in config (e.g.
FLATTEN_OFFICIAL_SCALE_INIT, pinned in tests/test_constants.py) and in the exact values below.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
from scipy.stats import chi2, norm

from refimpl import config
from refimpl import models as rm
from refimpl.attention import angular, enhanced, focused, lisa

# A law: ("normal", mu, sigma) | ("uniform", lo, hi) | ("exact", value) | ("scaled_normal", v, s): v (1 + N(0, s^2))
Law = tuple


class Checker:
    """Collects (key, draws, law) and tests every law with a Bonferroni-split budget."""

    def __init__(self) -> None:
        self.items: list[tuple[str, np.ndarray, Law]] = []

    def add(self, key: str, x: np.ndarray, law: Law) -> None:
        self.items.append((key, np.asarray(x, dtype=np.float64).ravel(), law))

    def run(self, pooled: bool = True) -> int:
        """Test each key, and (``pooled``) the union of all keys of one random law kind (standardised), which
        has the power to see a small deviation.  Returns the number of checks."""
        groups: dict[str, list[np.ndarray]] = {}
        stat_items = [(k, x, law) for k, x, law in self.items if law[0] != "exact"]
        for k, x, law in self.items:
            if law[0] == "exact":
                np.testing.assert_array_equal(x, np.full(x.shape, law[1]), err_msg=k)
        for k, x, law in stat_items:
            if law[0] in ("normal", "scaled_normal"):
                groups.setdefault("normal", []).append(_standardise(x, law))
        n_checks = 2 * (len(stat_items) + (len(groups) if pooled else 0))
        alpha = config.VERDICT_FALSE_ALARM / max(n_checks, 1)
        for k, x, law in stat_items:
            _check(k, x, law, alpha)
        if pooled:
            for g, zs in groups.items():
                _check(f"all {g} keys pooled", np.concatenate(zs), ("normal", 0.0, 1.0), alpha)
        return n_checks


def _standardise(x: np.ndarray, law: Law) -> np.ndarray:
    if law[0] == "normal":
        return (x - law[1]) / law[2]
    v, s = law[1], law[2]                       # x = v (1 + s z)
    return (x / v - 1.0) / s


def _check(key: str, x: np.ndarray, law: Law, alpha: float) -> None:
    """Two checks per law at level alpha each (two-sided)."""
    n = x.size
    assert n > 0, key
    if law[0] == "uniform":
        lo, hi = law[1], law[2]
        assert float(x.min()) >= lo and float(x.max()) <= hi, f"{key}: draws outside [{lo}, {hi}]"
        t = (hi - lo) * math.sqrt(math.log(2.0 / alpha) / (2.0 * n))          # Hoeffding
        assert abs(float(x.mean()) - (lo + hi) / 2) <= t, f"{key}: mean {x.mean()} not (lo + hi) / 2 = {(lo + hi) / 2}"
        return
    z = _standardise(x, law)
    zq = norm.isf(alpha / 2)
    m = float(z.mean())
    assert abs(m) * math.sqrt(n) <= zq, f"{key}: standardised mean {m:.4g} is {abs(m) * math.sqrt(n):.1f} SE off"
    ss = float(np.sum(z * z))                                                   # chi-square(n) under the law
    lo, hi = chi2.ppf(alpha / 2, n), chi2.isf(alpha / 2, n)
    assert lo <= ss <= hi, f"{key}: sum of squares {ss:.4g} outside the chi2({n}) interval [{lo:.4g}, {hi:.4g}] " \
                           f"(empirical std ratio {math.sqrt(ss / n):.4g})"


def fan_in(shape: tuple[int, ...]) -> int:
    """PyTorch's fan-in of a weight (out, in, *kernel): prod(shape[1:])."""
    return int(np.prod(shape[1:]))


S = 0.1      # config.NET_INIT_STD_FC, written out: the documented std of biases and norm-weight offsets


def common_law(key: str, shape: tuple[int, ...]) -> Law:
    """models.common.init_from_shapes' documented law: ndim >= 2 N(0, 1/fan_in); 1-D "weight" 1 + N(0, s^2);
    everything else N(0, s^2); with models._netparts, BatchNorm running variances U(0.5, 2)."""
    if key.endswith("running_var"):
        return ("uniform", 0.5, 2.0)
    if len(shape) >= 2:
        return ("normal", 0.0, 1.0 / math.sqrt(fan_in(shape)))
    if key.endswith("weight"):
        return ("normal", 1.0, S)
    return ("normal", 0.0, S)


def _check_network(name: str, law_of: Callable[[str, tuple[int, ...], object], Law], **overrides) -> dict:
    cfg, params = rm.create(name, init=True, seed=7, **overrides)
    shapes = rm.param_shapes(cfg)
    assert params.keys() == shapes.keys()
    chk = Checker()
    for key, shape in shapes.items():
        assert params[key].shape == tuple(shape) and params[key].dtype == np.float64, key
        chk.add(key, params[key], law_of(key, tuple(shape), cfg))
    assert chk.run() > 0
    return params


# ===================================================================================================
# Networks
# ===================================================================================================

def _l2vit_law(key, shape, cfg):
    parts = key.split(".")
    if parts[0] == "stages" and key.endswith("attn.scale"):           # paper: s initialised as sqrt(C)
        return ("exact", math.sqrt(cfg.dims[int(parts[1])]))
    if parts[0] == "stages" and key.endswith("attn.temperature"):     # released: ones(h, 1, 1) * d^-0.5
        i = int(parts[1])
        assert shape == (cfg.num_heads[i], 1, 1), key
        return ("exact", (cfg.dims[i] // cfg.num_heads[i]) ** -0.5)
    return common_law(key, shape)


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_l2vit_init(preset):
    """L2ViT Appendix 7: 'The learnable scale parameter s is initialized as sqrt(C)' (paper preset, one scale
    per LGA block, C its stage's width); the released LinearAttention: temperature = ones(num_heads, 1, 1) *
    head_dim ** -0.5 (official preset).  Every LGA block has exactly one of them."""
    params = _check_network("l2vit_tiny", _l2vit_law, preset=preset)
    key = "attn.scale" if preset == "paper" else "attn.temperature"
    found = [k for k in params if k.endswith(key)]
    assert len(found) == sum(rm.create("l2vit_tiny")[0].pairs) == 6          # one LGA per pair (1, 1, 3, 1)
    assert params["stages.0.1." + key].ravel()[0] == (math.sqrt(96) if preset == "paper" else 32 ** -0.5)
    assert not any(k.endswith("attn.temperature" if preset == "paper" else "attn.scale") for k in params)


def test_ravlt_layer_scale_initial_values_are_the_released_ones():
    """Released RALA.py: RAVLT_T/S layer_init_values [1, 1, 1, 1], RAVLT_B [1, 1, 1e-6, 1e-6], RAVLT_L
    [1e-6] * 4 (layerscales all True)."""
    released = {"ravlt_t": (1.0, 1.0, 1.0, 1.0), "ravlt_s": (1.0, 1.0, 1.0, 1.0),
                "ravlt_b": (1.0, 1.0, 1e-6, 1e-6), "ravlt_l": (1e-6, 1e-6, 1e-6, 1e-6)}
    for name, vals in released.items():
        cfg = rm.create(name, preset="official")[0]
        assert tuple(cfg.layer_scale_init) == vals, name
        assert cfg.mlp_ratio == 3.5 and cfg.head_proj == 1024, name


def _ravlt_law(key, shape, cfg):
    parts = key.split(".")
    if parts[-1] in ("gamma_1", "gamma_2"):
        return ("scaled_normal", cfg.layer_scale_init[int(parts[1])], S)
    return common_law(key, shape)


def test_ravlt_init():
    """RAVLT (official preset: layer scales present): gamma = v (1 + N(0, s^2)) with v the stage's initial
    value (models/ravlt.init_params docstring), here with stages 3-4 at RAVLT-B's released 1e-6; everything
    else by common.init_from_shapes' law with BatchNorm running variances U(0.5, 2)."""
    params = _check_network("ravlt_t", _ravlt_law, preset="official", layer_scale_init=(1.0, 1.0, 1e-6, 1e-6))
    g = params["layers.3.blocks.0.gamma_1"]
    # the 1e-6 scale is applied: _check_network tested these draws against v (1 + N(0, s^2)) with v = 1e-6 (the
    # standardised x / v - 1 of draws without it would be ~1e6 standard errors off)
    assert g.shape == (1, 512, 1, 1)


def _lisanet_law(key, shape, cfg):
    if key.endswith(("attn.weight_a", "attn.weight_b")):
        return ("normal", 0.0, 1.0 / math.sqrt(shape[0]))               # N(0, 1 / P), P kernel taps
    if key.endswith(("attn.bias_a", "attn.bias_b")) or key.endswith("pos_embed"):
        return ("normal", 0.0, S)
    return common_law(key, shape)


@pytest.mark.parametrize("name", ["lisanet_i_t", "lisanet_h_t"])
def test_lisanet_init(name):
    """LiSANet (models/lisanet.init_params docstring): W_a, W_b ~ N(0, 1/P), B_a, B_b ~ N(0, s^2), position
    embedding ~ N(0, s^2); the rest by common.init_from_shapes' law."""
    _check_network(name, _lisanet_law)


def _flatten_law(key, shape, cfg):
    if key.endswith("attn.scale"):
        return ("normal", 0.0, 0.5)                                     # config.FLATTEN_NET_SCALE_INIT_STD
    return common_law(key, shape)


@pytest.mark.parametrize("name", ["flatten_deit_t", "flatten_swin_t", "flatten_pvt_t"])
def test_flatten_init(name):
    """FLatten-DeiT/Swin/PVT, official preset (learnable scale and positional encoding present): the scale
    N(0, 0.5^2) (models/flatten.init_params docstring), the rest by common.init_from_shapes' law."""
    params = _check_network(name, _flatten_law, preset="official")
    assert any(k.endswith("attn.scale") for k in params) and any(k.endswith("positional_encoding") for k in params)


def test_castling_init():
    """Castling-DeiT (models/castling.init_params): common.init_from_shapes' law for every key."""
    _check_network("castling_deit_t", lambda key, shape, cfg: common_law(key, shape))


def test_config_comment_law_for_embeddings_and_tables():
    """config.NET_INIT_STD_FC's comment: entries with two or more axes - positional embeddings and the class token
    included - are N(0, 1/fan_in), fan_in = prod(shape[1:]), as common.init_from_shapes draws them (the comment
    once said N(0, s^2) for these; this test found it)."""
    cfg, params = rm.create("castling_deit_t", init=True, seed=7)
    chk = Checker()
    for key in ("pos_embed", "cls_token"):
        chk.add(key, params[key], ("normal", 0.0, 1.0 / math.sqrt(fan_in(params[key].shape))))
    chk.run(pooled=False)


# ===================================================================================================
# Attention modules
# ===================================================================================================

@pytest.mark.parametrize("preset", ["paper", "official"])
@pytest.mark.parametrize("block", ["lga", "lwa"])
def test_l2vit_block_init(preset, block):
    """enhanced.init_l2vit_params docstring: weights N(0, 1/fan_in), biases N(0, 0.1^2), norm weights
    1 + N(0, 0.1^2), BN running variance U(0.5, 2); scale sqrt(C), temperature d^-1/2, exactly."""
    cfg = enhanced.L2ViTConfig.preset(preset, dim=96, num_heads=3)
    p = enhanced.init_l2vit_params(cfg, block, seed=3)
    chk = Checker()
    for key, x in p.items():
        if key == "attn.scale":
            law = ("exact", math.sqrt(96))
        elif key == "attn.temperature":
            assert x.shape == (3, 1, 1)
            law = ("exact", 32 ** -0.5)
        elif key.endswith("running_var"):
            law = ("uniform", 0.5, 2.0)
        elif key.endswith("weight") and x.ndim > 1:
            law = ("normal", 0.0, 1.0 / math.sqrt(fan_in(x.shape)))
        elif key.endswith("weight"):
            law = ("normal", 1.0, 0.1)
        else:
            law = ("normal", 0.0, 0.1)
        chk.add(key, x, law)
    assert chk.run() > 0
    if block == "lga":
        assert ("attn.scale" in p) == (preset == "paper") and ("attn.temperature" in p) == (preset == "official")


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_focused_init(preset):
    """focused.init_focused_params docstring: weights N(0, 1/fan_in), biases and the positional encoding
    N(0, 0.1^2), LayerNorm weight 1 + N(0, 0.1^2), scale N(0, 0.5^2)."""
    cfg = focused.FocusedConfig.preset(preset, dim=64, num_heads=2, sr_ratio=2)
    p = focused.init_focused_params(cfg, layout="global", n_kv=49, seed=5)
    chk = Checker()
    for key, x in p.items():
        if key.endswith("weight") and x.ndim > 1:
            law = ("normal", 0.0, 1.0 / math.sqrt(fan_in(x.shape)))
        elif key == "norm.weight":
            law = ("normal", 1.0, 0.1)
        elif key == "scale":
            law = ("normal", 0.0, 0.5)
        else:
            law = ("normal", 0.0, 0.1)
        chk.add(key, x, law)
    assert chk.run() > 0
    if preset == "official":
        assert p["positional_encoding"].shape == (1, 49, 64) and p["scale"].shape == (1, 1, 64)


def test_castling_attention_init():
    """angular.init_castling_params docstring: weights N(0, 1/fan_in), biases N(0, 0.01^2)."""
    cfg = angular.CastlingConfig(dim=96, num_heads=3, qkv_bias=True, conv_bias=True)
    p = angular.init_castling_params(cfg, 4)
    chk = Checker()
    for key, x in p.items():
        chk.add(key, x, ("normal", 0.0, 0.01) if key.endswith("bias") else
                ("normal", 0.0, 1.0 / math.sqrt(fan_in(x.shape))))
    assert chk.run() > 0 and "dconv.weight" in p and "qkv.bias" in p


def test_lisa_init():
    """lisa.init_params docstring: N(0, std^2), LayerNorm weights 1 + N(0, std^2), std = 0.02 by default
    (timm's trunc_normal_ std, config.LISA_INIT_STD)."""
    cfg = lisa.LiSAConfig(dim=64, num_heads=4, grid=(14, 14))
    p = lisa.init_params(lisa.lisa_block_param_shapes(cfg), seed=6)
    chk = Checker()
    for key, x in p.items():
        chk.add(key, x, ("normal", 1.0 if key in ("norm1.weight", "norm2.weight") else 0.0, 0.02))
    assert chk.run() > 0


# ===================================================================================================
# The checker rejects wrong laws (so the checks above have power)
# ===================================================================================================

def test_checker_rejects_a_wrong_law():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((384, 96)) * 0.02                 # timm's std where 1/sqrt(fan_in) is documented
    chk = Checker()
    chk.add("w", w, ("normal", 0.0, 1.0 / math.sqrt(96)))
    with pytest.raises(AssertionError, match="sum of squares"):
        chk.run()
    chk = Checker()
    chk.add("scale", rng.standard_normal(192) * 0.1, ("normal", 0.0, 0.5))
    with pytest.raises(AssertionError, match="sum of squares"):
        chk.run()
    chk = Checker()
    chk.add("ln", 0.1 * rng.standard_normal(768), ("normal", 1.0, 0.1))  # weights 0 + N instead of 1 + N
    with pytest.raises(AssertionError, match="mean"):
        chk.run()
    chk = Checker()
    chk.add("var", rng.uniform(0.5, 2.5, 1000), ("uniform", 0.5, 2.0))
    with pytest.raises(AssertionError, match="outside"):
        chk.run()
    chk = Checker()
    chk.add("temperature", np.full((3, 1, 1), 1.0), ("exact", 32 ** -0.5))
    with pytest.raises(AssertionError):
        chk.run()
