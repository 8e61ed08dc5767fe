"""Properties of L2ViT's enhanced linear attention, LCM and blocks (refimpl.attention.enhanced), each citing
its equation.  Comparisons of two float64 computations use twice the reference's running bound
(``tests.kernel_helpers.twice_bound``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from equivalence.strategies import KINDS, generate
from refimpl import analysis, config, layers, numerics
from refimpl.attention import enhanced as E
from tests import naive_enhanced as NE
from tests.kernel_helpers import twice_bound


def _qkv(seed, kind, b, h, n, d):
    rng = np.random.default_rng(seed)
    return tuple(generate(int(rng.integers(2**32)), kind, (b, h, n, d)) for _ in range(3))


C_MINS = (0.1, 1.0, 10.0, config.L2VIT_C_MIN, 1e3)


# ===================================================================================================
# The clamp (Appendix 8, Table 10) and the scale (§4.2, Appendix 7)
# ===================================================================================================

@given(st.integers(0, 2**32 - 1), st.sampled_from(KINDS), st.integers(1, 3), st.integers(1, 40),
       st.integers(1, 24), st.sampled_from(C_MINS), st.sampled_from(("linear", "quadratic")))
def test_clamp_is_inactive_exactly_where_the_normaliser_reaches_c_min(seed, kind, h, n, d, c_min, order):
    """Appendix 8: the normaliser is clamped into [C_min, inf).  Wherever phi(Q_i) . sum phi(K) >= C_min the
    clamped output equals the unclamped Eq. (4) bit for bit; elsewhere it equals numerator / C_min bit for
    bit (same order, same arithmetic; max() is exact) - except where that quotient is subnormal: tiny groups are
    computed scaled up by a power of two and scaled back (numerics.pow2_exponent(scale_up=True)), so the output
    rounds once into the subnormal range where the tapped numerator, itself rounded there, rounds twice when
    divided: the two differ by at most one subnormal spacing, 2^-1074."""
    q, k, v = _qkv(seed, kind, 1, h, n, d)
    taps: dict = {}
    clamped = E.enhanced_linear_attention(q, k, v, c_min=c_min, order=order, taps=taps)
    raw = E.enhanced_linear_attention(q, k, v, c_min=0.0, order=order)
    den = taps["denominator_raw"]
    active = den >= c_min
    np.testing.assert_array_equal(np.where(active[..., None], clamped, 0.0), np.where(active[..., None], raw, 0.0))
    want = taps["numerator"] / c_min
    sub = np.abs(want) < np.finfo(np.float64).tiny
    inactive = ~active[..., None] & np.ones_like(sub)
    np.testing.assert_array_equal(np.where(inactive & ~sub, clamped, 0.0), np.where(inactive & ~sub, want, 0.0))
    assert np.all(np.abs(np.where(inactive & sub, clamped - want, 0.0)) <= 2.0 ** -1074)


@given(st.integers(0, 2**32 - 1), st.sampled_from(KINDS), st.integers(1, 3), st.integers(1, 40),
       st.integers(1, 24), st.sampled_from(C_MINS + (0.0,)), st.sampled_from((0.5, 1.0, 8.0)))
def test_output_is_a_sub_convex_combination_of_values(seed, kind, h, n, d, c_min, s):
    """With ReLU features O_i = sum_j w_ij V_j, w_ij = phi(Q_i).phi(K_j) / (s max(den_i, C_min)) >= 0 and
    sum_j w_ij = den_i / (s max(den_i, C_min)) <= 1/s: |O_i| <= max_j |V_j| / s for every C_min >= 0.  So the
    clamp (Appendix 8) cannot be what keeps the forward pass bounded; what it bounds is the sensitivity
    dO_i/dphi(Q_i), of size ||phi(K)^T V|| / max(den_i, C_min) (the 'huge activations' of Table 10 with
    C_min = 1e-6 come from training, not from one forward pass).  Rounding: k = d + M + 3 relative, plus
    k absolute roundings of 2^-1074 each in the subnormal range (Higham eq. 2.8)."""
    q, k, v = _qkv(seed, kind, 1, h, n, d)
    taps: dict = {}
    o = E.enhanced_linear_attention(q, k, v, c_min=c_min, scale=s, taps=taps)
    vmax = np.max(np.abs(v), axis=(-2, -1), keepdims=True) / s
    kk = d + n + 3
    # Rows whose (clamped) normaliser is subnormal-range (only with C_min = 0) carry products that lost their
    # relative accuracy to underflow; the weights' sum <= 1 holds there only in exact arithmetic.
    normal = taps["denominator"] > d * n * 2.0 ** -1074 / numerics.unit_roundoff("float64")
    live = np.isfinite(o) & normal[..., None]
    limit = vmax * (1 + numerics.gamma(kk, numerics.unit_roundoff("float64"))) + kk * 2.0 ** -1074
    assert np.all(np.abs(o[live]) <= np.broadcast_to(limit, o.shape)[live])


def test_dead_queries_give_zero_with_the_clamp_and_nan_without():
    """All-negative query pre-activations (dead ReLU): numerator and normaliser are 0; the clamp makes the
    output exactly 0 (0 / C_min), while C_min = 0 leaves Eq. (4)'s 0/0 = NaN (never silently replaced)."""
    q = -np.abs(np.random.default_rng(0).standard_normal((1, 2, 5, 4))) - 0.01
    k, v = np.ones((1, 2, 7, 4)), np.ones((1, 2, 7, 4))
    np.testing.assert_array_equal(E.enhanced_linear_attention(q, k, v), 0.0)
    assert np.all(np.isnan(E.enhanced_linear_attention(q, k, v, c_min=0.0)))


@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 30), st.integers(1, 16), st.integers(-6, 6),
       st.sampled_from(("linear", "quadratic")))
def test_paper_scale_and_released_temperature_are_one_parametrisation(seed, h, n, d, k2, order):
    """§4.2 divides K^T V by s; the released code multiplies by a temperature t.  With t = 1/s they are the
    same function; for s = 2^k both scalings are exact, so the outputs agree bit for bit."""
    q, k, v = _qkv(seed, "normal", 1, h, n, d)
    s = 2.0 ** k2
    a = E.enhanced_linear_attention(q, k, v, scale=s, scale_mode="divide", order=order)
    b = E.enhanced_linear_attention(q, k, v, scale=np.full((h, 1, 1), 1.0 / s), scale_mode="multiply", order=order)
    np.testing.assert_array_equal(a, b)


@given(st.integers(0, 2**32 - 1), st.integers(1, 2), st.integers(2, 30), st.integers(1, 16),
       st.sampled_from((0.5, 3.0, math.sqrt(96.0))))
def test_scaling_the_whole_similarity_cancels_unless_the_clamp_acts(seed, h, n, d, s):
    """Why §4.2's s scales K^T V only: applied to phi(Q) phi(K)^T (numerator and normaliser), it cancels in
    every row whose scaled normaliser is >= C_min - s would have no effect there (checked within the error
    model) - and changes only the clamped rows."""
    q, k, v = _qkv(seed, "normal", 1, h, n, d)
    taps: dict = {}
    a = E.enhanced_linear_attention(q, k, v, c_min=1.0, scale=s, scale_target="similarity", taps=taps)
    b = E.enhanced_linear_attention(q, k, v, c_min=0.0)
    live = (taps["denominator_raw"] >= 1.0)[..., None]
    bd = E.enhanced_linear_attention_bound(q, k, v, c_min=0.0)
    # Only the live rows are compared (the clamped ones differ by design): the bound is zero elsewhere.
    numerics.assert_close(np.where(live, a, 0.0), np.where(live, b, 0.0),
                          numerics.Bound(np.where(live, 2 * np.asarray(bd.scale), 0.0), bd.k + 2,
                                         bd.note + "; +2: the scaling; x2"),
                          "float64")


# ===================================================================================================
# Eq. 5: a convolution after attention aggregates rows of the attention matrix
# ===================================================================================================

@given(st.integers(0, 2**32 - 1), st.sampled_from(((3, 3), (4, 5), (2, 6))), st.integers(1, 2),
       st.integers(1, 4), st.sampled_from((3, 7)), st.sampled_from((1.0, config.L2VIT_C_MIN)))
@settings(max_examples=15)
def test_conv_after_attention_equals_attention_with_rows_aggregated(seed, hw, h, d, ks, c_min):
    """L2ViT Eq. (5): O'_i = sum_{j in Omega_i} w_j O_j = sum_k (sum_{j in Omega_i} w_j A_jk) V_k.  For a
    depthwise conv, channel c uses its own kernel: DWConv(O)[:, c] = (M_c A) V[:, c] with M_c the conv's
    sparse matrix (analysis.dwc_matrix) and A the (clamped) attention matrix from the quadratic-order tap."""
    n = hw[0] * hw[1]
    q, k, v = _qkv(seed, "normal", 1, h, n, d)
    taps: dict = {}
    o = E.enhanced_linear_attention(q, k, v, c_min=c_min, order="quadratic", taps=taps)
    w = np.random.default_rng(seed + 3).standard_normal((h * d, 1, ks, ks))
    grid = o[0].transpose(0, 2, 1).reshape(1, h * d, hw[0], hw[1])
    conv = layers.depthwise_conv2d(grid, w, None, padding=ks // 2).reshape(h, d, n).transpose(0, 2, 1)
    want = np.empty_like(conv)
    for hh in range(h):
        for c in range(d):
            agg = analysis.dwc_matrix(w[hh * d + c, 0], *hw) @ taps["attn"][0, hh]     # rows aggregated
            want[hh, :, c] = agg @ v[0, hh, :, c]
    ob = E.enhanced_linear_attention_bound(q, k, v, c_min=c_min)
    e_o = ob.k * np.asarray(ob.scale)[0].transpose(0, 2, 1).reshape(1, h * d, hw[0], hw[1])
    cb = layers.depthwise_conv2d_bound(grid, w, None, padding=ks // 2)
    e = (layers.depthwise_conv2d(e_o, np.abs(w), None, padding=ks // 2) + cb.k * np.asarray(cb.scale))
    e = e.reshape(h, d, n).transpose(0, 2, 1)
    kk = ob.k + cb.k
    numerics.assert_close(conv, want, numerics.Bound(2 * e / kk, kk, "attention bound through |conv| + conv "
                                                     "rounding; x2 both float64"), "float64")


# ===================================================================================================
# Associativity through the core, the attention layer and the LGA block
# ===================================================================================================

@given(st.integers(0, 2**32 - 1), st.sampled_from(KINDS), st.integers(1, 3), st.integers(1, 40),
       st.integers(1, 70), st.sampled_from(C_MINS + (0.0,)), st.sampled_from(("numerator", "similarity")))
def test_both_association_orders_agree(seed, kind, h, n, d, c_min, target):
    """(phi Q phi K^T) V = phi Q (phi K^T V) (Eq. 4 and §6/Appendix 11: linear attention may choose the
    order), with the clamp and the scale, N < d and N > d, all input kinds."""
    q, k, v = _qkv(seed, kind, 1, h, n, d)
    kw = dict(c_min=c_min, scale=2.5, scale_target=target)
    taps: dict = {}
    a = E.enhanced_linear_attention(q, k, v, taps=taps, **kw)
    b = E.enhanced_linear_attention(q, k, v, order="quadratic", **kw)
    bd = twice_bound(E.enhanced_linear_attention_bound(q, k, v, dtype="float64", **kw))
    # Rows whose normaliser is subnormal-range (only possible with c_min = 0) lose relative accuracy in both
    # orders legitimately: there only the bound and the NaN pattern are required (second check); the verdict
    # on the normal rows is the first (zero bound on the rows it leaves out).
    normal = (taps["denominator"] > n * d * 2.0 ** -1074 / numerics.unit_roundoff("float64"))[..., None]
    numerics.assert_close(np.where(normal, a, 0.0), np.where(normal, b, 0.0),
                          numerics.Bound(np.where(normal, np.asarray(bd.scale), 0.0), bd.k, bd.note), "float64")
    rep = numerics.compare(a, b, bd, "float64")
    assert rep.pattern_ok and rep.within_bound, str(rep)


@given(st.integers(0, 2**32 - 1), st.sampled_from(("paper", "official")), st.sampled_from(KINDS),
       st.sampled_from(((3, 4), (5, 5), (2, 7))), st.sampled_from(((4, 1), (6, 2), (12, 3))),
       st.sampled_from(("residual", "attention")), st.sampled_from((3, 7)))
@settings(max_examples=15)
def test_lga_block_orders_agree(seed, preset, kind, hw, ch, placement, ks):
    """The whole LGA block (CPE, attention, LCM, MLP) gives the same output in both orders."""
    cfg = E.L2ViTConfig.preset(preset, dim=ch[0], num_heads=ch[1], lcm_kernel=ks, lcm_placement=placement)
    x = generate(seed, kind, (1, hw[0] * hw[1], ch[0]))
    p = E.init_l2vit_params(cfg, "lga", seed=seed % 997)
    a = E.lga_block(x, p, cfg, hw)
    b = E.lga_block(x, p, cfg, hw, order="quadratic")
    numerics.assert_close(a, b, twice_bound(E.lga_block_bound(x, p, cfg, hw, dtype="float64")), "float64")


# ===================================================================================================
# LWA: padding and the released departures
# ===================================================================================================

def test_padding_mask_changes_only_windows_that_contain_padding():
    """Zero padding to the window multiple: with the paper's mask padded tokens are never keys; the released
    block lets them take part (keys = the k bias).  Windows without padding compute the same arithmetic in
    both, so their tokens agree bit for bit; windows with padding differ."""
    cfg_p = E.L2ViTConfig.preset("paper", dim=6, num_heads=2, window_size=3)
    cfg_o = E.L2ViTConfig.preset("paper", dim=6, num_heads=2, window_size=3, window_mask_padding=False)
    hw = (4, 5)   # windows: rows 0-2 / 3-5, cols 0-2 / 3-5; padding in rows 4-5 and col 5
    x = generate(1, "normal", (1, 20, 6))
    p = E.init_l2vit_params(cfg_p, "lwa", seed=1)
    a, b = E.lwa_block(x, p, cfg_p, hw).reshape(4, 5, 6), E.lwa_block(x, p, cfg_o, hw).reshape(4, 5, 6)
    np.testing.assert_array_equal(a[:3, :3], b[:3, :3])
    assert np.all(np.any(a[3:] != b[3:], axis=-1)) and np.all(np.any(a[:3, 3:] != b[:3, 3:], axis=-1))


def test_official_padded_keys_are_the_qkv_bias():
    """In the released LWA, a zero-padded token's key and value are exactly the qkv bias (0 W^T + b)."""
    cfg = E.L2ViTConfig.preset("official", dim=4, num_heads=1, window_size=3)
    p = E.init_l2vit_params(cfg, "lwa", seed=2)
    taps: dict = {}
    E.lwa_block(generate(2, "normal", (1, 4, 4)), p, cfg, (2, 2), taps=taps)
    k, v = taps["attn.k"][0, 0], taps["attn.v"][0, 0]          # one window of 3 x 3; real tokens (0,0),(0,1),(1,0),(1,1)
    padded = [2, 5, 6, 7, 8]
    np.testing.assert_array_equal(k[padded], np.broadcast_to(p["attn.qkv.bias"][4:8], (5, 4)))
    np.testing.assert_array_equal(v[padded], np.broadcast_to(p["attn.qkv.bias"][8:], (5, 4)))


# ===================================================================================================
# The official preset against the naive loops
# ===================================================================================================

@pytest.mark.parametrize("hw", [(3, 4), (4, 5)])
def test_official_lga_block_matches_the_naive_oracle(hw):
    """Released LGA (CPE, per-head temperature after the clamp of the unscaled q . sum k, LCM as its own
    residual branch with norm3, MLP) against tests/naive_enhanced.py's pairwise loops."""
    cfg = E.L2ViTConfig.preset("official", dim=6, num_heads=2, lcm_kernel=3, c_min=1.0)
    x = generate(4, "normal", (2, hw[0] * hw[1], 6))
    p = E.init_l2vit_params(cfg, "lga", seed=4)
    got = E.lga_block(x, p, cfg, hw)
    want = NE.lga_official(x, p, heads=2, hw=hw, c_min=1.0)
    numerics.assert_close(got, want, twice_bound(E.lga_block_bound(x, p, cfg, hw)), "float64")


@pytest.mark.parametrize("hw,ws", [((3, 4), 3), ((4, 5), 3), ((4, 4), 2)])
def test_official_lwa_block_matches_the_naive_oracle(hw, ws):
    """Released LWA (CPE, window softmax attention without relative-position bias, shift or padding mask, a
    second CPE, MLP) against explicit per-window loops with padded tokens as keys."""
    cfg = E.L2ViTConfig.preset("official", dim=6, num_heads=2, window_size=ws)
    x = generate(5, "normal", (2, hw[0] * hw[1], 6))
    p = E.init_l2vit_params(cfg, "lwa", seed=5)
    got = E.lwa_block(x, p, cfg, hw)
    want = NE.lwa_official(x, p, heads=2, hw=hw, ws=ws)
    numerics.assert_close(got, want, twice_bound(E.lwa_block_bound(x, p, cfg, hw)), "float64")


# ===================================================================================================
# Presets, parameters, taps, validation
# ===================================================================================================

def test_presets_and_parameter_keys():
    """'paper' is the default; 'official' = per-head temperature, two CPEs in LWA, unmasked padding.  The
    parameters are keyed like the released modules (cpe.0.proj, norm1, attn.qkv, norm3, local_mp.*, ...)."""
    assert E.L2ViTConfig(dim=8, num_heads=2) == E.L2ViTConfig.preset("paper", dim=8, num_heads=2)
    o = E.L2ViTConfig.preset("official", dim=8, num_heads=2)
    assert (o.scale_mode, o.lwa_cpe, o.window_mask_padding, o.c_min, o.window_rel_pos_bias, o.window_shift) == \
        ("per_head", "twice", False, 1e2, False, 0)
    pa = E.init_l2vit_params(E.L2ViTConfig(dim=8, num_heads=2), "lga")
    po = E.init_l2vit_params(o, "lga")
    assert pa["attn.scale"].tolist() == [math.sqrt(8)]                        # Appendix 7: s = sqrt(C)
    np.testing.assert_array_equal(po["attn.temperature"], np.full((2, 1, 1), 4 ** -0.5))
    assert "cpe.1.proj.weight" in E.init_l2vit_params(o, "lwa") and "norm3.weight" in po
    with pytest.raises(ValueError, match="'name'"):
        E.L2ViTConfig.preset("v2", dim=8, num_heads=2)


def test_taps_record_the_documented_intermediates():
    cfg = E.L2ViTConfig(dim=6, num_heads=2, lcm_kernel=3)
    taps: dict = {}
    E.lga_block(generate(0, "normal", (1, 12, 6)), E.init_l2vit_params(cfg, "lga"), cfg, (3, 4), taps=taps)
    for name, shape in (("cpe", (1, 12, 6)), ("attn_out", (1, 12, 6)), ("lcm", (1, 12, 6)), ("mlp", (1, 12, 6)),
                        ("attn.kv", (1, 2, 3, 3)), ("attn.denominator", (1, 2, 12)), ("attn.phi_q", (1, 2, 12, 3))):
        assert taps[name].shape == shape, name
    lt: dict = {}
    E.lcm(generate(0, "normal", (1, 12, 6)), {k[9:]: v for k, v in E.init_l2vit_params(cfg, "lga").items()
                                               if k.startswith("local_mp.")}, (3, 4), taps=lt)
    assert sorted(lt) == ["bn", "conv1", "conv2", "gelu"]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="'lcm_kernel'"):
        E.L2ViTConfig(dim=4, num_heads=2, lcm_kernel=4)
    with pytest.raises(ValueError, match="'window_shift'"):
        E.L2ViTConfig(dim=4, num_heads=2, window_size=3, window_shift=3)
    with pytest.raises(ValueError, match="'scale'"):
        E.enhanced_linear_attention(np.ones((1, 2, 3, 2)), np.ones((1, 2, 3, 2)), np.ones((1, 2, 3, 2)),
                                    scale=np.ones(3))
    with pytest.raises(ValueError, match="'order'"):
        E.enhanced_linear_attention(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2)), order="qk")
    with pytest.raises(ValueError, match="order='linear'"):
        E.enhanced_linear_attention(np.ones((1, 1, 30, 2)), np.ones((1, 1, 30, 2)), np.ones((1, 1, 30, 2)),
                                    order="quadratic", max_elements=100)
    cfg = E.L2ViTConfig(dim=4, num_heads=2, lcm_kernel=3)
    with pytest.raises(ValueError, match="argument 'x'"):
        E.lga_block(np.ones((1, 11, 4)), E.init_l2vit_params(cfg, "lga"), cfg, (3, 4))
    with pytest.raises(KeyError, match="norm3.weight"):
        E.lga_block(np.ones((1, 12, 4)), {k: v for k, v in E.init_l2vit_params(cfg, "lga").items()
                                          if not k.startswith("norm3")}, cfg, (3, 4))
