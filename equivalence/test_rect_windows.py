"""Rectangular (wh, ww) windows and per-axis (sh, sw) shifts in the PyTorch window twins
(refimpl/twins/modules/layers.py, softmax.WindowAttention, focused.FocusedWindowAttention) against the NumPy
reference (refimpl.layers, refimpl.attention.softmax.window_attention, refimpl.attention.focused
.focused_window_attention with window_size=(wh, ww), shift=(sh, sw)), float32 and float64 on every available
device: the data movement and the derived buffers exactly, the modules through the error model (the references'
running bounds, the naive same-precision NumPy run and the twin re-run under the legitimate variants).

Windows with wh != ww are where an exchanged axis or the other axis's stride shows: each axis must be padded to
a multiple of its own window side, rolled by its own shift, and the relative-position table must have
(2 wh - 1)(2 ww - 1) rows indexed (dy + wh - 1)(2 ww - 1) + dx + ww - 1 (Swin §3.2, Eq. 4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from equivalence.assertions import (assert_matches, assert_window_twin_matches, load_numpy_state, naive,
                                    round_params, state_dict_to_numpy, to_numpy, to_torch, torch_dtype)
from equivalence.strategies import KINDS, adversarial_arrays, generate
from refimpl import layers, numerics
from refimpl.attention import focused as F
from refimpl.attention import softmax as S
from refimpl.twins.modules import layers as tl
from refimpl.twins.modules.focused import FocusedWindowAttention
from refimpl.twins.modules.softmax import WindowAttention


@st.composite
def rect_windows(draw, max_side: int = 5, max_windows: int = 3, pad: bool = True):
    """(H, W, (wh, ww), (sh, sw)) with wh != ww; with ``pad`` the grid need not be a multiple of the window."""
    wh, ww = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    if wh == ww:
        ww = wh + 1
    sh, sw = draw(st.integers(0, wh - 1)), draw(st.integers(0, ww - 1))
    if pad:
        h, w = draw(st.integers(1, wh * max_windows)), draw(st.integers(1, ww * max_windows))
    else:
        h, w = wh * draw(st.integers(1, max_windows)), ww * draw(st.integers(1, max_windows))
    return h, w, (wh, ww), (sh, sw)


@given(rect_windows(pad=False), st.integers(1, 3))
@settings(max_examples=30)
def test_data_movement_and_buffers_are_exact(geo, c):
    """Partition / reverse, the shift mask and the relative-position index equal refimpl.layers bit for bit."""
    h, w, ws, shift = geo
    x = np.random.default_rng(h * 31 + w).standard_normal((2, h, w, c))
    win = tl.window_partition(torch.from_numpy(x), ws)
    np.testing.assert_array_equal(win.numpy(), layers.window_partition(x, ws))
    np.testing.assert_array_equal(tl.window_reverse(win, ws, h, w).numpy(), x)
    np.testing.assert_array_equal(tl.shifted_window_mask(h, w, ws, shift).numpy(),
                                  layers.shifted_window_mask(h, w, ws, shift))
    np.testing.assert_array_equal(tl.relative_position_index(ws).numpy(), layers.relative_position_index(*ws))
    np.testing.assert_array_equal(tl.relative_position_index(*ws).numpy(), layers.relative_position_index(*ws))


def test_int_window_is_the_square_pair():
    """An int window / shift is the pair (n, n): same buffers, same table rows, same output bits."""
    a = WindowAttention(8, 2, 3, shift=1).double()
    b = WindowAttention(8, 2, (3, 3), shift=(1, 1)).double()
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.relative_position_index, b.relative_position_index)
    x = torch.randn(2, 7, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_bad_windows_and_shifts_are_refused_by_name():
    with pytest.raises(ValueError, match=r"'window_size', 'shift'.*0 <= shift < window"):
        WindowAttention(8, 2, (2, 4), shift=(2, 1))
    with pytest.raises(TypeError, match=r"argument 'window_size': expected an int or a pair of ints, got \(2, 4, 1\)"):
        WindowAttention(8, 2, (2, 4, 1))
    cfg = F.FocusedConfig.preset("paper", dim=8, num_heads=2, kernel_size=3)
    with pytest.raises(ValueError, match=r"argument 'shift': expected 0 <= shift < window \(2, 4\)"):
        FocusedWindowAttention(cfg, (2, 4))(torch.zeros(1, 32, 8), (4, 8), shift=(1, 4))


@given(st.data())
@settings(max_examples=25)  # module forward + running bound + naive float32 run per example
def test_rectangular_window_attention(device, dtype_name, data):
    """Swin window attention on (wh, ww) windows with (sh, sw) shifts, every preset, padded grids."""
    h_, w_, ws, shift = data.draw(rect_windows())
    heads, d = data.draw(st.integers(1, 3)), data.draw(st.sampled_from((1, 2, 4)))
    c = heads * d
    preset = data.draw(st.sampled_from(tuple(S.WINDOW_PRESETS)))
    opts = dict(S.WINDOW_PRESETS[preset])
    opts.setdefault("shift", shift)
    mod = WindowAttention(c, heads, ws, **opts)
    if mod.rel_pos_bias:
        assert mod.relative_position_bias_table.shape[0] == (2 * ws[0] - 1) * (2 * ws[1] - 1)
    seed = data.draw(st.integers(0, 2**31))
    x = numerics.round_to(data.draw(adversarial_arrays((data.draw(st.integers(1, 2)), h_, w_, c))), dtype_name)
    assert_window_twin_matches(mod, seed, x, dict(num_heads=heads, window_size=ws, **opts), dtype_name, device,
                               f"window attention ({preset}, window {ws}, shift {opts['shift']}, grid {h_} x {w_})")


@given(st.integers(0, 2**32 - 1), st.sampled_from(("paper", "official")), rect_windows(max_side=4, pad=False),
       st.sampled_from(((4, 1), (6, 2))), st.sampled_from((1.0, 3.0, 8.0)), st.sampled_from(KINDS),
       st.sampled_from(("linear", "quadratic")))
@settings(max_examples=20)
def test_rectangular_focused_window_attention(device, dtype_name, seed, preset, geo, ch, p, kind, order):
    """FLatten's Swin layout on (wh, ww) windows (its DWC on the wh x ww window grid, the positional encoding over
    wh ww tokens in the official preset) with (sh, sw) shifts: the paper masks, the official ignores the mask."""
    h_, w_, ws, shift = geo
    cfg = F.FocusedConfig.preset(preset, dim=ch[0], num_heads=ch[1], p=p, kernel_size=3)
    x = numerics.round_to(generate(seed, kind, (2, h_ * w_, cfg.dim)), dtype_name)
    params = round_params(F.init_focused_params(cfg, layout="window", n_kv=ws[0] * ws[1], seed=seed % 1000),
                          dtype_name)
    m = FocusedWindowAttention(cfg, ws).to(device=device, dtype=torch_dtype(dtype_name))
    load_numpy_state(m, params)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        got = m(xt, (h_, w_), shift=shift, order=order)
    kw = dict(window_size=ws, shift=shift)
    want = F.focused_window_attention(x, params, cfg, (h_, w_), order=order, **kw)
    assert_matches(got, want, F.focused_window_attention_bound(x, params, cfg, (h_, w_), dtype=dtype_name, **kw),
                   dtype_name, naive=naive(F.focused_window_attention, x, params, cfg, (h_, w_), dtype_name=dtype_name,
                                           order=order, **kw),
                   name=f"focused window attention ({preset}, window {ws}, shift {shift}, {order})",
                   rerun=lambda: m(xt, (h_, w_), shift=shift, order=order))


def test_axes_exchanged_is_caught():
    """The check is not blind to the axes: the twin run on the transposed window (wh, ww) -> (ww, wh), with the
    weights that fit both (the table has (2 wh - 1)(2 ww - 1) rows either way), is far outside the bound."""
    ws, shift, hw = (2, 4), (1, 2), (4, 8)
    rng = np.random.default_rng(1)
    mod = WindowAttention(8, 2, ws, shift=shift).double()
    params = {k: rng.standard_normal(v.shape) for k, v in state_dict_to_numpy(mod).items()}
    x = rng.standard_normal((1, *hw, 8))
    bad = WindowAttention(8, 2, ws[::-1], shift=shift[::-1]).double()
    load_numpy_state(bad, params)
    with torch.no_grad():
        got = to_numpy(bad(torch.from_numpy(x)))
    kw = dict(num_heads=2, window_size=ws, shift=shift, mask_padding=False, mask_value=-100.0)
    ref = S.window_attention(x, params, **kw)
    bound = S.window_attention_bound(x, params, dtype="float64", **kw)
    assert np.max(np.abs(got - ref)) > 1e3 * np.max(bound.array("float64", ref.shape))
