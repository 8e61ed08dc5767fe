"""Equivalence of softmax attention and Swin window attention: refimpl/twins/modules/softmax.py (PyTorch)
against refimpl.attention.softmax, float32 and float64, every available device, through the error model
(softmax_attention_bound / window_attention_bound: first-order running error coefficients)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, strategies as st

from equivalence.assertions import (assert_matches, assert_window_twin_matches, naive,
                                    to_torch)
from refimpl.twins.modules.softmax import SoftmaxAttention, WindowAttention
from equivalence.strategies import adversarial_arrays, benign_arrays, window_configs
from refimpl import numerics
from refimpl.attention import softmax as S


@given(st.data())
def test_softmax_attention(device, dtype_name, data):
    """L2ViT Eq. 1 / FLatten Eq. 1 with scale d^-1/2, an optional additive bias (N, M) per head and an
    optional boolean mask (True = keep; each query keeps at least one key), adversarial q, k, v."""
    b, h = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    n, m = data.draw(st.integers(1, 30)), data.draw(st.integers(1, 30))
    d, e = data.draw(st.sampled_from((1, 2, 8, 16, 33, 64))), data.draw(st.integers(1, 10))
    q, k, v = (data.draw(adversarial_arrays(s)) for s in ((b, h, n, d), (b, h, m, d), (b, h, m, e)))
    qr, kr, vr = (numerics.round_to(a, dtype_name) for a in (q, k, v))
    bias = numerics.round_to(data.draw(benign_arrays((h, n, m))), dtype_name) if data.draw(st.booleans()) else None
    mask = None
    if data.draw(st.booleans()):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
        mask = rng.random((h, n, m)) < 0.6
        mask[..., 0] = True
    kw = dict(bias=bias, mask=mask)
    dev = lambda a: None if a is None else torch.from_numpy(a).to(device)  # noqa: E731
    tq, tk, tv = (to_torch(a, dtype_name, device) for a in (qr, kr, vr))
    tbias, tmask = None if bias is None else to_torch(bias, dtype_name, device), dev(mask)
    attn = SoftmaxAttention()
    with torch.no_grad():
        out = attn(tq, tk, tv, bias=tbias, mask=tmask)
    ref = S.softmax_attention(qr, kr, vr, **kw)
    assert_matches(out, ref, S.softmax_attention_bound(qr, kr, vr, dtype=dtype_name, **kw), dtype_name,
                   naive=naive(S.softmax_attention, qr, kr, vr, dtype_name=dtype_name, **kw), name="softmax attention",
                   rerun=lambda: attn(tq, tk, tv, bias=tbias, mask=tmask),
                   higher=lambda: attn(tq.double(), tk.double(), tv.double(),
                                       bias=None if tbias is None else tbias.double(), mask=tmask),
                   higher_bound=lambda: S.softmax_attention_bound(qr, kr, vr, dtype="float64", **kw))


@given(st.data())
def test_window_attention(device, dtype_name, data):
    """Swin window attention (Swin Eq. 4, §3.2) with zero padding to the window multiple, cyclic shift and
    its mask, relative-position bias, and every named option: the presets "swin", "swin_official" (-100
    additive mask, padded keys unmasked) and "l2vit_official" (L2ViT's LWA: no bias, no shift, no padding
    mask, zero-padded tokens take part as keys)."""
    h_, w_, ws, shift = data.draw(window_configs(max_windows=3, max_ws=5))
    heads, d = data.draw(st.integers(1, 3)), data.draw(st.sampled_from((1, 2, 4, 8)))
    c = heads * d
    preset = data.draw(st.sampled_from(tuple(S.WINDOW_PRESETS)))
    opts = dict(S.WINDOW_PRESETS[preset])
    opts.setdefault("shift", shift)
    qkv_bias = data.draw(st.booleans())
    mod = WindowAttention(c, heads, ws, qkv_bias=qkv_bias, **opts)
    seed = data.draw(st.integers(0, 2**31))
    x = numerics.round_to(data.draw(adversarial_arrays((data.draw(st.integers(1, 2)), h_, w_, c))), dtype_name)
    assert_window_twin_matches(mod, seed, x, dict(num_heads=heads, window_size=ws, **opts), dtype_name, device,
                               f"window attention ({preset}, shift {opts['shift']})")
