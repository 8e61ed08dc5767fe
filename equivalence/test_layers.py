"""Equivalence of the shared layers: PyTorch (built-ins and refimpl/twins/modules/layers.py) against
refimpl.layers, one state_dict loaded into both sides, float32 and float64, every available device."""

from __future__ import annotations

import copy

import numpy as np
import torch
from hypothesis import given, strategies as st
from torch import nn

from equivalence.assertions import (assert_matches, load_numpy_state, naive, round_params,
                                    state_dict_to_numpy, to_numpy, to_torch, torch_dtype)
from refimpl.twins.modules import layers as tl
from equivalence.strategies import adversarial_arrays, conv_configs, window_configs
from refimpl import layers, numerics


def _run(module: nn.Module, x: np.ndarray, dtype_name: str, device: str, *, seed: int, **fwd) -> tuple:
    """Randomise the module's float parameters (N(0,1)), round them and the input to T, load them into the
    module and return (torch output, rounded params, rounded input, rerun), where ``rerun()`` recomputes the
    output from the same module and input tensor (for the verdict's ensemble of legitimate evaluations)."""
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v.shape) for k, v in state_dict_to_numpy(module).items()}
    if "running_var" in params:
        params["running_var"] = np.abs(params["running_var"]) + 0.1
    params = round_params(params, dtype_name)
    xr = numerics.round_to(x, dtype_name)
    module = module.to(device=device, dtype=torch_dtype(dtype_name)).eval()
    load_numpy_state(module, params)
    xt = to_torch(xr, dtype_name, device)
    with torch.no_grad():
        out = module(xt, **fwd)

    def rerun():
        return module(xt, **fwd)

    # the remedy where T is inconclusive (assert_matches' higher), built only when it is taken
    rerun.float64 = lambda: copy.deepcopy(module).double()(xt.double(), **fwd)
    return out, params, xr, rerun


@given(st.data())
def test_linear(device, dtype_name, data):
    b, n, cin, cout = (data.draw(st.integers(1, s)) for s in (2, 9, 70, 70))
    x = data.draw(adversarial_arrays((b, n, cin)))
    bias = data.draw(st.booleans())
    out, p, xr, rerun = _run(nn.Linear(cin, cout, bias=bias), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    ref = layers.linear(xr, p["weight"], p.get("bias"))
    assert_matches(out, ref, layers.linear_bound(xr, p["weight"], p.get("bias")), dtype_name,
                   naive=naive(layers.linear, xr, p["weight"], p.get("bias"), dtype_name=dtype_name),
                   rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_layer_norm(device, dtype_name, data):
    b, n, c = (data.draw(st.integers(1, s)) for s in (2, 9, 96))
    x = data.draw(adversarial_arrays((b, n, c)))
    eps = data.draw(st.sampled_from((1e-5, 1e-6)))
    out, p, xr, rerun = _run(nn.LayerNorm(c, eps=eps), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    ref = layers.layer_norm(xr, p["weight"], p["bias"], eps)
    assert_matches(out, ref, layers.layer_norm_bound(xr, p["weight"], p["bias"], eps), dtype_name,
                   naive=naive(layers.layer_norm, xr, p["weight"], p["bias"], eps, dtype_name=dtype_name),
                   rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_layer_norm_channels_first(device, dtype_name, data):
    b, c, h, w = (data.draw(st.integers(1, s)) for s in (2, 40, 7, 7))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    out, p, xr, rerun = _run(tl.LayerNormChannelsFirst(c, eps=1e-6), x, dtype_name, device,
                             seed=data.draw(st.integers(0, 99)))
    ref = layers.layer_norm_cf(xr, p["weight"], p["bias"], 1e-6)
    assert_matches(out, ref, layers.layer_norm_cf_bound(xr, p["weight"], p["bias"], 1e-6), dtype_name,
                   naive=naive(layers.layer_norm_cf, xr, p["weight"], p["bias"], 1e-6, dtype_name=dtype_name),
                   rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_batch_norm2d_eval(device, dtype_name, data):
    b, c, h, w = (data.draw(st.integers(1, s)) for s in (2, 24, 6, 6))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    out, p, xr, rerun = _run(nn.BatchNorm2d(c), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    args = (xr, p["weight"], p["bias"], p["running_mean"], p["running_var"])
    assert_matches(out, layers.batch_norm2d(*args), layers.batch_norm2d_bound(*args), dtype_name,
                   naive=naive(layers.batch_norm2d, *args, dtype_name=dtype_name), rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_gelu(device, dtype_name, data):
    approximate = data.draw(st.sampled_from(("none", "tanh")))
    x = data.draw(adversarial_arrays((3, 50)))
    out, _, xr, rerun = _run(nn.GELU(approximate=approximate), x, dtype_name, device, seed=0)
    assert_matches(out, layers.gelu(xr, approximate), layers.gelu_bound(xr, approximate), dtype_name,
                   naive=naive(layers.gelu, xr, approximate, dtype_name=dtype_name), rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_conv2d(device, dtype_name, data):
    b, c, o, h, w, kh, kw, stride, padding, groups = data.draw(conv_configs())
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    bias = data.draw(st.booleans())
    mod = nn.Conv2d(c, o, (kh, kw), stride=stride, padding=padding, groups=groups, bias=bias)
    out, p, xr, rerun = _run(mod, x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    args = (xr, p["weight"], p.get("bias"), stride, padding, groups)
    assert_matches(out, layers.conv2d(*args), layers.conv2d_bound(*args), dtype_name,
                   naive=naive(layers.conv2d, *args, dtype_name=dtype_name), rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_depthwise_conv2d(device, dtype_name, data):
    b, c, _, h, w, kh, kw, stride, padding, _ = data.draw(conv_configs(depthwise=True))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    mod = nn.Conv2d(c, c, (kh, kw), stride=stride, padding=padding, groups=c)
    out, p, xr, rerun = _run(mod, x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    args = (xr, p["weight"], p["bias"], stride, padding)
    assert_matches(out, layers.depthwise_conv2d(*args), layers.depthwise_conv2d_bound(*args), dtype_name,
                   naive=naive(layers.depthwise_conv2d, *args, dtype_name=dtype_name),
                   rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_mlp(device, dtype_name, data):
    n, c, hid = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 48)), data.draw(st.integers(1, 96))
    x = data.draw(adversarial_arrays((2, n, c)))
    out, p, xr, rerun = _run(tl.Mlp(c, hid), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    assert_matches(out, layers.mlp(xr, p), layers.mlp_bound(xr, p), dtype_name,
                   naive=naive(layers.mlp, xr, p, dtype_name=dtype_name), rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_cpe(device, dtype_name, data):
    b, c, h, w = (data.draw(st.integers(1, s)) for s in (2, 16, 9, 9))
    x = data.draw(adversarial_arrays((b, c, h, w), token_axis=-1))
    out, p, xr, rerun = _run(tl.CPE(c), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    args = (xr, p["proj.weight"], p["proj.bias"])
    assert_matches(out, layers.cpe(*args), layers.cpe_bound(*args, dtype=dtype_name), dtype_name,
                   naive=naive(layers.cpe, *args, dtype_name=dtype_name), rerun=rerun, higher=rerun.float64)


@given(st.data())
def test_patch_merging(device, dtype_name, data):
    b, h, w, c = (data.draw(st.integers(1, s)) for s in (2, 9, 9, 24))
    x = data.draw(adversarial_arrays((b, h, w, c)))
    out, p, xr, rerun = _run(tl.PatchMerging(c), x, dtype_name, device, seed=data.draw(st.integers(0, 99)))
    ref = layers.patch_merging(xr, p)
    # Bound: LayerNorm on the merged 4C features, then a bias-free linear 4C -> 2C, chained first-order:
    # the LayerNorm error (scale S_ln) passes through |W| into the output.
    xm = np.concatenate([a for a in _merged(xr)], axis=-1)
    ln_b = layers.layer_norm_bound(xm, p["norm.weight"], p["norm.bias"])
    y = layers.layer_norm(xm, p["norm.weight"], p["norm.bias"])
    lin_b = layers.linear_bound(y, p["reduction.weight"])
    s = layers.linear(np.asarray(ln_b.scale) + np.abs(y), np.abs(p["reduction.weight"]))
    bound = numerics.Bound(s, ln_b.k + lin_b.k, "patch merging: layer_norm then linear (first-order chain)")
    assert_matches(out, ref, bound, dtype_name, naive=naive(layers.patch_merging, xr, p, dtype_name=dtype_name),
                   rerun=rerun, higher=rerun.float64)


def _merged(x):
    x, _ = layers.pad_to_multiple(x, 2)
    return x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]


# -------------------------------------------------------------------------------------------------
# Exact data movement: partition, reverse, masks, relative positions (bit-for-bit)
# -------------------------------------------------------------------------------------------------

@given(window_configs(pad=False), st.integers(1, 5))
def test_window_partition_and_reverse_match_torch(cfg, c):
    h, w, ws, _ = cfg
    x = np.random.default_rng(h * 100 + w).standard_normal((2, h, w, c))
    ref = layers.window_partition(x, ws)
    got = tl.window_partition(torch.from_numpy(x), ws)
    np.testing.assert_array_equal(to_numpy(got), ref)
    np.testing.assert_array_equal(to_numpy(tl.window_reverse(got, ws, h, w)), layers.window_reverse(ref, ws, h, w))


@given(window_configs(pad=False))
def test_shifted_window_mask_matches_torch(cfg):
    h, w, ws, shift = cfg
    np.testing.assert_array_equal(tl.shifted_window_mask(h, w, ws, shift).numpy(),
                                  layers.shifted_window_mask(h, w, ws, shift))


@given(st.integers(1, 8), st.integers(1, 4))
def test_relative_position_bias_matches_torch(ws, heads):
    idx = tl.relative_position_index(ws)
    np.testing.assert_array_equal(idx.numpy(), layers.relative_position_index(ws))
    table = np.random.default_rng(ws).standard_normal(((2 * ws - 1) ** 2, heads))
    got = torch.from_numpy(table)[idx.view(-1)].view(ws * ws, ws * ws, heads).permute(2, 0, 1)
    np.testing.assert_array_equal(got.numpy(), layers.relative_position_bias(table, layers.relative_position_index(ws)))
