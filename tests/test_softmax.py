"""Properties of refimpl.attention.softmax: softmax attention and Swin window attention against loop
oracles (tests/naive_softmax.py), normalisation of the rows, the presets' masking semantics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from equivalence.strategies import adversarial_arrays, benign_arrays, window_configs
from refimpl import config, numerics
from refimpl.attention import softmax as S
from tests.kernel_helpers import agree_float64, twice_bound
from tests.naive_softmax import softmax_attention_loops, window_attention_loops


@given(st.data())
def test_softmax_attention_matches_loops(data):
    """L2ViT Eq. 1 / FLatten Eq. 1 with bias and mask, against the query-by-query loop oracle (float64,
    both sides within the softmax error model of the exact value)."""
    b, h, n, m = (data.draw(st.integers(1, s)) for s in (2, 2, 9, 9))
    d, e = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    q, k, v = (data.draw(adversarial_arrays(s)) for s in ((b, h, n, d), (b, h, m, d), (b, h, m, e)))
    bias = data.draw(benign_arrays((h, n, m))) if data.draw(st.booleans()) else None
    mask = None
    if data.draw(st.booleans()):
        mask = np.random.default_rng(data.draw(st.integers(0, 99))).random((1, h, n, m)) < 0.5
    ref = S.softmax_attention(q, k, v, bias=bias, mask=mask)
    oracle = softmax_attention_loops(q, k, v, bias=bias, mask=mask)
    bound = S.softmax_attention_bound(q, k, v, bias=bias, mask=mask, dtype="float64")
    agree_float64(ref, oracle, twice_bound(bound), "softmax attention vs loops")


@given(st.data())
def test_softmax_rows_sum_to_one(data):
    """Each row of softmax(scale Q K^T + B) sums to 1 (Eq. 1's normalisation) up to its rounding:
    |sum_j p_ij - 1| <= u (2 r w_i + 2c + 2M) (the relative errors of the p_ij from
    softmax_attention_error's step 2, plus the M - 1 additions of the check itself)."""
    b, h, n, m = (data.draw(st.integers(1, s)) for s in (2, 3, 12, 40))
    d = data.draw(st.integers(1, 40))
    q, k = data.draw(adversarial_arrays((b, h, n, d))), data.draw(adversarial_arrays((b, h, m, d)))
    taps: dict = {}
    S.softmax_attention(q, k, np.ones((b, h, m, 1)), taps=taps)
    p, s = taps["attn"], taps["logits"]
    dev = np.abs(s - s.max(axis=-1, keepdims=True))
    w = np.sum(np.where(p > 0, p * dev, 0.0), axis=-1)
    r, c = config.SOFTMAX_EXP_ARG_ROUNDINGS, config.ELEMENTARY_FUNCTION_ULPS
    bound = numerics.Bound(2 * r * w + 2 * c + 2 * m, 1, "row sum of softmax: u (2 r w + 2c + 2M)")
    numerics.assert_close(p.sum(axis=-1), np.ones((b, h, n)), bound, "float64", name="softmax row sums")
    assert np.all(p >= 0)


@settings(max_examples=15)  # lowered: the loop oracle is O(B H W n C) Python steps
@given(st.data())
def test_window_attention_matches_loops(data):
    """Swin window attention (Swin Eq. 4, §3.2: windows, cyclic shift with its region mask, relative-position
    bias, zero padding to the window multiple) and every option against the coordinate-by-coordinate loop
    oracle: padded tokens masked or taking part as keys (L2ViT's official LWA), -inf or additive masks."""
    h_, w_, ws, shift = data.draw(window_configs(max_windows=2, max_ws=4))
    heads, d = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    c = heads * d
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    p = {"qkv.weight": rng.standard_normal((3 * c, c)), "proj.weight": rng.standard_normal((c, c)),
         "relative_position_bias_table": rng.standard_normal(((2 * ws - 1) ** 2, heads))}
    if data.draw(st.booleans()):
        p["qkv.bias"], p["proj.bias"] = rng.standard_normal(3 * c), rng.standard_normal(c)
    opts = dict(rel_pos_bias=data.draw(st.booleans()), mask_padding=data.draw(st.booleans()),
                mask_value=data.draw(st.sampled_from((None, config.SWIN_MASK_VALUE_OFFICIAL))))
    x = data.draw(benign_arrays((data.draw(st.integers(1, 2)), h_, w_, c)))
    ref = S.window_attention(x, p, num_heads=heads, window_size=ws, shift=shift, **opts)
    oracle = window_attention_loops(x, p, heads, ws, shift=shift, **opts)
    bound = S.window_attention_bound(x, p, num_heads=heads, window_size=ws, shift=shift, dtype="float64", **opts)
    agree_float64(ref, oracle, twice_bound(bound), "window attention vs loops")


def test_window_presets_are_named_options():
    """The presets are exactly the documented option sets (L2ViT official LWA: no relative-position bias,
    no shift, padded tokens unmasked; Swin's release: -100 additive mask, padded tokens unmasked)."""
    assert S.WINDOW_PRESETS["l2vit_official"] == dict(rel_pos_bias=False, mask_padding=False, mask_value=None,
                                                      shift=0)
    assert S.WINDOW_PRESETS["swin_official"]["mask_value"] == config.SWIN_MASK_VALUE_OFFICIAL
    assert S.WINDOW_PRESETS["swin"]["mask_padding"] is True


def test_padded_keys_change_real_tokens_only_without_padding_mask():
    """With mask_padding=True the zero padding never reaches a real token's attention (the loop oracle
    attends over real tokens only); with mask_padding=False (Swin's and L2ViT's released code) padded
    tokens take part as keys - their key is the qkv bias - and change the outputs of the windows that
    contain padding, while a window without padding is bitwise identical under both options."""
    rng = np.random.default_rng(0)
    c, ws = 4, 3
    p = {"qkv.weight": rng.standard_normal((3 * c, c)), "qkv.bias": rng.standard_normal(3 * c),
         "proj.weight": rng.standard_normal((c, c))}
    x = rng.standard_normal((1, 4, 4, c))  # padded to 6 x 6
    taps: dict = {}
    y_masked = S.window_attention(x, p, num_heads=1, window_size=ws, rel_pos_bias=False, taps=taps)
    y_open = S.window_attention(x, p, num_heads=1, window_size=ws, rel_pos_bias=False, mask_padding=False)
    # Oracle for the masked case: attention restricted to the real tokens of each window.
    oracle = window_attention_loops(x, p, 1, ws, rel_pos_bias=False, mask_padding=True)
    numerics.assert_close(y_masked, oracle, twice_bound(S.window_attention_bound(
        x, p, num_heads=1, window_size=ws, rel_pos_bias=False, dtype="float64")), "float64")
    # Window (0, 0) holds only real tokens: identical (bitwise) with and without the padding mask.
    np.testing.assert_array_equal(y_masked[:, :3, :3], y_open[:, :3, :3])
    assert np.max(np.abs(y_masked[:, 3:, :] - y_open[:, 3:, :])) > 0  # padded keys (k = qkv bias) take part


def test_additive_mask_leaks_when_logits_spread_beyond_its_magnitude():
    """Finding on Swin's released -100 additive mask (config.SWIN_MASK_VALUE_OFFICIAL): a masked key with
    logit s_mask keeps weight exp(s_mask - 100 - s_top) relative to the best kept key; it is negligible only
    while s_mask - s_top << 100.  With a logit gap of 200 the masked key takes almost all the weight:
    the output equals its value to within exp(-100) relative, while exact (-inf) masking gives the kept value."""
    q = np.array([[[[1.0]]]])
    k = np.array([[[[0.0], [200.0]]]])
    v = np.array([[[[1.0], [-1.0]]]])
    keep = np.array([True, False])[None, None, None, :]
    exact = S.softmax_attention(q, k, v, scale=1.0, mask=keep)
    leaky = S.softmax_attention(q, k, v, scale=1.0, bias=np.where(keep, 0.0, config.SWIN_MASK_VALUE_OFFICIAL))
    np.testing.assert_array_equal(exact, [[[[1.0]]]])
    # Leaked weight w = 1 / (1 + e^-100) on the masked value -1: output e^-100 w - w = -tanh(50), which is
    # exactly -1.0 in float64 (1 - tanh(50) ~ 7e-44 < u): the masked key has taken all the weight.
    np.testing.assert_array_equal(leaky, [[[[-1.0]]]])
    # Within the additive mask's design range (gap 0) the leak is e^-100: invisible in float64.
    leaky_small = S.softmax_attention(q, np.array([[[[0.0], [0.0]]]]), v, scale=1.0,
                                      bias=np.where(keep, 0.0, config.SWIN_MASK_VALUE_OFFICIAL))
    np.testing.assert_array_equal(leaky_small, exact)


def test_fully_masked_row_is_nan_and_guards():
    """A query with every key masked has no softmax (0/0): NaN, not an invented value.  Bad arguments raise
    errors naming the argument; the quadratic guard points to window/linear attention."""
    q = np.ones((1, 1, 2, 3))
    mask = np.array([[True, True], [False, False]])
    out = S.softmax_attention(q, q, q, mask=mask)
    assert np.all(np.isnan(out[0, 0, 1])) and np.all(np.isfinite(out[0, 0, 0]))
    with pytest.raises(TypeError, match="mask"):
        S.softmax_attention(q, q, q, mask=mask.astype(float))
    with pytest.raises(ValueError, match="bias"):
        S.softmax_attention(q, q, q, bias=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="linear_attention"):
        S.softmax_attention(q, q, q, max_elements=3)
    with pytest.raises(ValueError, match="argument 'k'"):
        S.softmax_attention(q, np.ones((1, 1, 2, 4)), q)
    x = np.ones((1, 5, 5, 4))
    p = {"qkv.weight": np.ones((12, 4)), "proj.weight": np.ones((4, 4))}
    with pytest.raises(ValueError, match="pad=False"):
        S.window_attention(x, p, num_heads=1, window_size=3, pad=False, rel_pos_bias=False)
    with pytest.raises(KeyError, match="relative_position_bias_table"):
        S.window_attention(x, p, num_heads=1, window_size=3)
    with pytest.raises(ValueError, match="shift"):
        S.window_attention(x, p, num_heads=1, window_size=3, shift=3, rel_pos_bias=False)
    with pytest.raises(ValueError, match="num_heads"):
        S.window_attention(x, p, num_heads=3, window_size=3, rel_pos_bias=False)
