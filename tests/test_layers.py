"""Properties of the shared layers against independent formulations (tests/naive.py loops, mpmath)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, strategies as st

from equivalence.strategies import adversarial_arrays, benign_arrays, conv_configs, window_configs
from refimpl import layers, numerics
from tests import naive

mpmath.mp.dps = 50


@given(st.data())
def test_conv2d_matches_loop_definition(data):
    """conv2d (einsum over sliding windows) equals the index-by-index loop, within gamma_(n+1) of |.|."""
    b, c, o, h, w, kh, kw, stride, padding, groups = data.draw(conv_configs(max_side=8, max_k=4))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    wt = data.draw(benign_arrays((o, c // groups, kh, kw)))
    bias = data.draw(st.none() | benign_arrays((o,)))
    dil = data.draw(st.sampled_from([(1, 1), (2, 1)])) if stride == 1 and padding != "same" else (1, 1)
    if h + 2 * 4 < dil[0] * (kh - 1) + 1:
        dil = (1, 1)
    try:
        pads = layers.conv_padding(padding, (kh, kw), layers._pair(stride, "s"), dil)
        got = layers.conv2d(x, wt, bias, stride, padding, groups, dil)
    except ValueError as e:  # the dilated kernel may not fit: the error must say so
        assert "smaller than the dilated kernel" in str(e)
        return
    want = naive.conv2d_loops(x, wt, bias, layers._pair(stride, "s"), pads, groups, dil)
    numerics.assert_close(got, want, layers.conv2d_bound(x, wt, bias, stride, padding, groups, dil), "float64")


@given(st.data())
def test_depthwise_conv2d_matches_explicit_sliding_window_sum(data):
    """The NumPy depthwise definition equals the explicit sliding-window sum for odd and even kernels,
    strides and PyTorch's asymmetric 'same' padding."""
    b, c, _, h, w, kh, kw, stride, padding, _ = data.draw(conv_configs(max_side=9, max_k=6, depthwise=True))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    wt = data.draw(benign_arrays((c, 1, kh, kw)))
    bias = data.draw(st.none() | benign_arrays((c,)))
    pads = layers.conv_padding(padding, (kh, kw), layers._pair(stride, "s"), (1, 1))
    got = layers.depthwise_conv2d(x, wt, bias, stride, padding)
    want = naive.conv2d_loops(x, wt, bias, layers._pair(stride, "s"), pads, groups=c)
    numerics.assert_close(got, want, layers.depthwise_conv2d_bound(x, wt, bias, stride, padding), "float64")


def test_same_padding_of_even_kernels_is_asymmetric_like_pytorch():
    assert layers.conv_padding("same", (4, 3), (1, 1), (1, 1)) == (1, 2, 1, 1)
    assert layers.conv_padding("same", (2, 2), (1, 1), (3, 1)) == (1, 2, 0, 1)
    with pytest.raises(ValueError, match="'same' requires stride 1"):
        layers.conv_padding("same", (3, 3), (2, 2), (1, 1))


@given(st.integers(1, 6), st.integers(1, 3), st.sampled_from([1e-5, 1e-6]), st.integers(0, 2**31))
def test_layer_norm_matches_mpmath(n, rows, eps, seed):
    """LayerNorm against its definition evaluated at 50 digits, within layer_norm_bound."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-3, 3, (rows, 1)) + rng.standard_normal((rows, 1))
    wt, bs = rng.standard_normal(n), rng.standard_normal(n)
    truth = np.empty_like(x)
    for r in range(rows):
        v = [mpmath.mpf(float(t)) for t in x[r]]
        mu = mpmath.fsum(v) / n
        var = mpmath.fsum((t - mu) ** 2 for t in v) / n
        for i in range(n):
            truth[r, i] = float((v[i] - mu) / mpmath.sqrt(var + mpmath.mpf(eps)) * mpmath.mpf(float(wt[i]))
                                + mpmath.mpf(float(bs[i])))
    numerics.assert_close(layers.layer_norm(x, wt, bs, eps), truth, layers.layer_norm_bound(x, wt, bs, eps),
                          "float64")


@given(st.data())
def test_batch_norm_eval_matches_mpmath(data):
    c = data.draw(st.integers(1, 4))
    x = data.draw(adversarial_arrays((1, c, 2, 3), token_axis=-1))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    w, b, rm, rv = rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 0.1
    truth = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        ch = idx[1]
        val = (mpmath.mpf(float(x[idx])) - mpmath.mpf(float(rm[ch]))) / mpmath.sqrt(mpmath.mpf(float(rv[ch])) +
                                                                                     mpmath.mpf(1e-5))
        truth[idx] = float(val * mpmath.mpf(float(w[ch])) + mpmath.mpf(float(b[ch])))
    numerics.assert_close(layers.batch_norm2d(x, w, b, rm, rv), truth, layers.batch_norm2d_bound(x, w, b, rm, rv),
                          "float64")


@given(window_configs(pad=True), st.integers(1, 3))
def test_window_partition_matches_loops_and_reverse_inverts_it(cfg, c):
    """Zero padding to the window multiple, then partition (== naive loops) and reverse (== identity)."""
    h, w, ws, _ = cfg
    x = np.random.default_rng(h * 31 + w).standard_normal((2, h, w, c))
    xp, (hp, wp) = layers.pad_to_multiple(x, ws)
    assert hp % ws == 0 and wp % ws == 0 and hp - h < ws and wp - w < ws
    np.testing.assert_array_equal(xp[:, :h, :w], x)
    np.testing.assert_array_equal(xp[:, h:], 0.0)
    np.testing.assert_array_equal(xp[:, :, w:], 0.0)
    win = layers.window_partition(xp, ws)
    np.testing.assert_array_equal(win, naive.window_partition_loops(xp, ws))
    np.testing.assert_array_equal(layers.window_reverse(win, ws, hp, wp), xp)


@given(window_configs(pad=False))
def test_shifted_window_mask_matches_swin_region_labelling(cfg):
    h, w, ws, shift = cfg
    m = layers.shifted_window_mask(h, w, ws, shift)
    np.testing.assert_array_equal(m, naive.shifted_mask_loops(h, w, ws, shift))
    assert np.all(np.diagonal(m, axis1=1, axis2=2)) and np.array_equal(m, np.swapaxes(m, 1, 2))
    if shift == 0:
        assert m.all()


@given(st.integers(1, 7), st.integers(1, 7))
def test_relative_position_index_matches_loops(wh, ww):
    idx = layers.relative_position_index(wh, ww)
    np.testing.assert_array_equal(idx, naive.relative_position_index_loops(wh, ww))
    # a bijection between displacements and table rows: every row used, the diagonal at the centre
    assert set(np.unique(idx)) == set(range((2 * wh - 1) * (2 * ww - 1)))
    assert np.all(np.diagonal(idx) == (wh - 1) * (2 * ww - 1) + ww - 1)


def test_relative_position_bias_looks_up_per_head():
    table = np.arange(9 * 2, dtype=float).reshape(9, 2)
    bias = layers.relative_position_bias(table, layers.relative_position_index(2))
    assert bias.shape == (2, 4, 4)
    np.testing.assert_array_equal(bias[1, 0, 3], table[0, 1])  # token 0 = (0,0), token 3 = (1,1): dy=dx=-1
    with pytest.raises(ValueError, match="argument 'index'"):
        layers.relative_position_bias(table, np.array([[9]]))


@given(st.integers(1, 7), st.integers(1, 7), st.integers(1, 4))
def test_patch_merging_shapes_and_order(h, w, c):
    x = np.random.default_rng(h + 10 * w).standard_normal((1, h, w, c))
    p = {"norm.weight": np.ones(4 * c), "norm.bias": np.zeros(4 * c),
         "reduction.weight": np.eye(2 * c, 4 * c)}  # keeps the first 2C merged features
    y = layers.patch_merging(x, p)
    assert y.shape == (1, (h + 1) // 2, (w + 1) // 2, 2 * c)
    merged = np.concatenate([layers.pad_to_multiple(x, 2)[0][:, 0::2, 0::2],
                             layers.pad_to_multiple(x, 2)[0][:, 1::2, 0::2]], axis=-1)
    xm = layers.pad_to_multiple(x, 2)[0]
    full = np.concatenate([xm[:, 0::2, 0::2], xm[:, 1::2, 0::2], xm[:, 0::2, 1::2], xm[:, 1::2, 1::2]], -1)
    ln = layers.layer_norm(full, p["norm.weight"], p["norm.bias"])
    np.testing.assert_array_equal(y, ln[..., :2 * c])
    assert merged.shape[-1] == 2 * c


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 5))
def test_cpe_is_identity_plus_depthwise_conv(h, w, c):
    x = np.random.default_rng(h * w * c).standard_normal((1, c, h, w))
    wt = np.zeros((c, 1, 3, 3))
    wt[:, 0, 1, 1] = 1.0  # centre tap: the conv is the identity, so CPE doubles x exactly
    np.testing.assert_array_equal(layers.cpe(x, wt), 2 * x)


def test_mlp_is_fc2_gelu_fc1():
    rng = np.random.default_rng(0)
    p = {"fc1.weight": rng.standard_normal((8, 4)), "fc1.bias": rng.standard_normal(8),
         "fc2.weight": rng.standard_normal((4, 8)), "fc2.bias": rng.standard_normal(4)}
    x = rng.standard_normal((2, 3, 4))
    want = layers.gelu(x @ p["fc1.weight"].T + p["fc1.bias"]) @ p["fc2.weight"].T + p["fc2.bias"]
    numerics.assert_close(layers.mlp(x, p), want, layers.mlp_bound(x, p), "float64")
    assert layers.subparams({"blocks.0.mlp.fc1.weight": 1, "blocks.0.norm.weight": 2}, "blocks.0.mlp") == {
        "fc1.weight": 1}
    with pytest.raises(KeyError, match="no parameters under prefix 'blocks.1'"):
        layers.subparams({"blocks.0.mlp.fc1.weight": 1}, "blocks.1")


# ----------------------------------------------------------------------------------------------------
# Bad input: clear errors that name the argument
# ----------------------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    x = np.zeros((1, 4, 5, 5))
    with pytest.raises(ValueError, match=r"argument 'groups'.*divisible"):
        layers.conv2d(x, np.zeros((6, 2, 3, 3)), groups=3)
    with pytest.raises(ValueError, match=r"argument 'weight'.*expected shape \(6, 2, KH, KW\)"):
        layers.conv2d(x, np.zeros((6, 1, 3, 3)), groups=2)
    with pytest.raises(ValueError, match=r"argument 'x'.*4-d"):
        layers.depthwise_conv2d(np.zeros((4, 5, 5)), np.zeros((4, 1, 3, 3)))
    with pytest.raises(ValueError, match=r"argument 'weight'.*dimension C is 4, not 3"):
        layers.depthwise_conv2d(x, np.zeros((3, 1, 3, 3)))
    with pytest.raises(TypeError, match=r"argument 'x'.*integer"):
        layers.depthwise_conv2d(np.zeros((1, 4, 5, 5), dtype=int), np.zeros((4, 1, 3, 3)))
    with pytest.raises(ValueError, match=r"argument 'x'.*non-empty"):
        layers.linear(np.zeros((0, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"argument 'x'.*last dimension in=3"):
        layers.linear(np.zeros((2, 4)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"argument 'x'.*not a multiple of the window"):
        layers.window_partition(np.zeros((1, 5, 7, 2)), 7)
    with pytest.raises(ValueError, match=r"argument 'x'.*smaller than the dilated kernel"):
        layers.conv2d(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 5, 5)))
    with pytest.raises(ValueError, match=r"argument 'shift'"):
        layers.shifted_window_mask(8, 8, 4, 4)
    with pytest.raises(TypeError, match=r"argument 'stride'"):
        layers.conv2d(x, np.zeros((4, 4, 3, 3)), stride=1.5)


def test_nan_and_inf_propagate_through_layers():
    x = np.zeros((1, 2, 4, 4))
    x[0, 0, 1, 1], x[0, 1, 2, 2] = np.nan, np.inf
    y = layers.depthwise_conv2d(x, np.ones((2, 1, 3, 3)), padding=1)
    assert np.isnan(y[0, 0, :3, :3]).all() and np.isnan(y[0, 0]).sum() == 9
    assert np.isinf(y[0, 1, 1:4, 1:4]).all() and np.isfinite(y[0, 1]).sum() == 16 - 9
    z = layers.layer_norm(np.array([[1.0, np.nan, 2.0]]), None, None)
    assert np.isnan(z).all()
