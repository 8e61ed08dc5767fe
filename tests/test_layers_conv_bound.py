"""The convolution bounds of refimpl.layers (conv2d_bound, depthwise_conv2d_bound) as the error calculus forms them
(refimpl.bounds.conv_parts): the same scale and depth as their former direct formation in refimpl.layers, with
and without the other algorithms covered, and safe against the exact result (rational arithmetic) of float64
and float32 evaluations on random draws with normal, subnormal, mixed-scale and cancelling operands.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equivalence.strategies import conv_configs
from refimpl import backends, bounds, layers, numerics

torch = pytest.importorskip("torch")
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------
# The former formation (refimpl.layers before the scale and depth moved to refimpl.bounds.conv_parts)
# ---------------------------------------------------------------------------------------------------

def _former_conv2d_bound(x, weight, bias=None, stride=1, padding=0, groups=1, dilation=1):
    w = np.abs(numerics.as_float(weight, "weight"))
    x = np.abs(numerics.as_float(x, "x"))
    s = layers.conv2d(x, w, None if bias is None else np.abs(numerics.as_float(bias, "bias")), stride, padding,
                      groups, dilation)
    k = int(np.prod(w.shape[1:])) + (1 if bias is not None else 0)
    pads = layers.conv_padding(padding, w.shape[2:], layers._pair(stride, "stride"), layers._pair(dilation, "d"))
    return bounds.conv_scale(s, k, x, w, bias, pads, stride, dilation, groups), k


def _former_depthwise_bound(x, weight, bias=None, stride=1, padding=0, dilation=1):
    x, weight, bias, stride, pads, dilation = layers._validate_depthwise(x, weight, bias, stride, padding, dilation)
    s = layers._depthwise_conv2d_numpy(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias), stride,
                                       pads, dilation)
    k = weight.shape[2] * weight.shape[3] + (1 if bias is not None else 0)
    return bounds.conv_scale(s, k, x, weight, bias, pads, stride, dilation, groups=weight.shape[0]), k


_COVER = st.sampled_from([(), ("winograd",), ("fft",), ("winograd", "fft")])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_conv2d_bound_is_its_former_formation_bit_for_bit(data):
    b, c, o, h, w, kh, kw, stride, padding, groups = data.draw(conv_configs(max_side=9, max_k=5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, wt = rng.standard_normal((b, c, h, w)), rng.standard_normal((o, c // groups, kh, kw))
    bias = rng.standard_normal(o) if data.draw(st.booleans()) else None
    dil = data.draw(st.sampled_from([1, (2, 1)])) if stride == 1 and padding != "same" else 1
    pads = layers.conv_padding(padding, (kh, kw), layers._pair(stride, "s"), layers._pair(dil, "d"))
    if h + pads[0] + pads[1] < layers._pair(dil, "d")[0] * (kh - 1) + 1:
        dil = 1
    with bounds.covering_conv_algorithms(*data.draw(_COVER)):
        new = layers.conv2d_bound(x, wt, bias, stride, padding, groups, dil)
        s, k = _former_conv2d_bound(x, wt, bias, stride, padding, groups, dil)
    assert new.k == k and new.accumulation
    assert np.array_equal(new.scale, s)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_depthwise_conv2d_bound_is_its_former_formation_bit_for_bit(data):
    b, c, _, h, w, kh, kw, stride, padding, _ = data.draw(conv_configs(max_side=9, max_k=5, depthwise=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    x, wt = rng.standard_normal((b, c, h, w)), rng.standard_normal((c, 1, kh, kw))
    bias = rng.standard_normal(c) if data.draw(st.booleans()) else None
    with bounds.covering_conv_algorithms(*data.draw(_COVER)):
        new = layers.depthwise_conv2d_bound(x, wt, bias, stride, padding)
        s, k = _former_depthwise_bound(x, wt, bias, stride, padding)
    assert new.k == k and new.accumulation
    assert np.array_equal(new.scale, s)


def test_the_covered_algorithms_are_named_in_the_note():
    x, w = np.ones((1, 2, 6, 6)), np.ones((2, 1, 3, 3))
    assert "Winograd" not in layers.depthwise_conv2d_bound(x, w, padding=1).note
    with bounds.covering_conv_algorithms("winograd"):
        assert "Winograd" in layers.depthwise_conv2d_bound(x, w, padding=1).note
        assert "Winograd" in layers.conv2d_bound(x, np.ones((3, 2, 3, 3)), padding=1).note
        assert "Winograd" not in layers.conv2d_bound(x, np.ones((3, 2, 3, 3)), padding=1, stride=2).note


# ---------------------------------------------------------------------------------------------------
# Safety against the exact result
# ---------------------------------------------------------------------------------------------------

def _exact_conv(x, weight, bias, stride, pads, groups, dilation):
    """The convolution in rational arithmetic (object arrays of Fraction): exact."""
    frac = np.vectorize(Fraction, otypes=[object])
    bsz, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = stride, dilation
    xp = np.full((bsz, c, h + pads[0] + pads[1], w + pads[2] + pads[3]), Fraction(0), dtype=object)
    xp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + w] = frac(x)
    wf = frac(weight)
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.full((bsz, o, oh, ow), Fraction(0), dtype=object)
    og = o // groups
    for oc in range(o):
        if bias is not None:
            out[:, oc] = Fraction(float(bias[oc]))
        for ci in range(cg):
            src = xp[:, (oc // og) * cg + ci]
            for u in range(kh):
                for v in range(kw):
                    patch = src[:, u * dh:u * dh + (oh - 1) * sh + 1:sh, v * dw:v * dw + (ow - 1) * sw + 1:sw]
                    out[:, oc] += wf[oc, ci, u, v] * patch
    return out


def _draw(rng, shape, kind: str, dtype: str) -> np.ndarray:
    """Operands representable in ``dtype``: N(0, 1), subnormal (scaled into T's subnormal range), mixed scales
    (exponents spread over T's range, some subnormal), or cancelling (large values of both signs)."""
    tiny = numerics.underflow_eta(dtype)
    z = rng.standard_normal(shape)
    if kind == "subnormal":
        z = z * tiny * 2.0 ** rng.integers(0, 20, shape)
    elif kind == "mixed":
        lo = np.log2(tiny)
        z = z * 2.0 ** rng.integers(int(lo), 40, shape)
    elif kind == "cancelling":
        z = np.sign(z) * (1e3 + rng.random(shape))
    z[rng.random(shape) < 0.1] = 0.0
    return numerics.round_to(z, dtype)


def _evaluations(x, wt, bias, stride, padding, groups, dtype: str):
    """The tested float evaluations in ``dtype``: torch's convolution, and in float64 also the reference's own
    (layers.conv2d; the depthwise one through the selected backend)."""
    tt = getattr(torch, dtype)
    t = lambda a: None if a is None else torch.from_numpy(a).to(tt)
    got = [F.conv2d(t(x), t(wt), t(bias), stride=stride, padding=padding, groups=groups).double().numpy()]
    if dtype == "float64":
        got.append(layers.conv2d(x, wt, bias, stride, padding, groups))
        if groups == x.shape[1] and wt.shape[0] == groups:
            got.append(layers.depthwise_conv2d(x, wt, bias, stride, padding))
    return got


_CASES = [  # (B, C, O, H, W, KH, KW, stride, padding, groups)
    (2, 3, 4, 6, 5, 3, 3, 1, 1, 1), (1, 4, 4, 7, 7, 3, 3, 1, 1, 4), (2, 4, 6, 6, 6, 2, 3, 2, 0, 2),
    (1, 2, 2, 5, 8, 5, 5, 1, 2, 2), (1, 6, 3, 4, 4, 1, 1, 1, 0, 1),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["normal", "subnormal", "mixed", "cancelling"])
def test_conv_bounds_hold_against_the_exact_result(dtype, kind):
    """|computed - exact| <= gamma_k(u_T) S + k eta_T (the tested part of the Bound, Bound.factor) at every
    element of every evaluation, compared in rational arithmetic; on subnormal draws the k eta_T term is needed
    (the relative part alone is exceeded; also on the mixed-scale draws, which reach it), so the check sees the
    underflow term."""
    rng = np.random.default_rng(["normal", "subnormal", "mixed", "cancelling"].index(kind) + 10 * len(dtype))
    eta = numerics.underflow_eta(dtype)
    needs_eta = False
    for _ in range(4):
        for bsz, c, o, h, w, kh, kw, stride, padding, groups in _CASES:
            x = _draw(rng, (bsz, c, h, w), kind, dtype)
            wt = _draw(rng, (o, c // groups, kh, kw), "normal" if kind == "subnormal" else kind, dtype)
            bias = None if rng.random() < 0.5 else _draw(rng, (o,), kind, dtype)
            bds = [layers.conv2d_bound(x, wt, bias, stride, padding, groups)]
            if groups == c and o == c:
                bds.append(layers.depthwise_conv2d_bound(x, wt, bias, stride, padding))
            pads = layers.conv_padding(padding, (kh, kw), (stride, stride), (1, 1))
            exact = _exact_conv(x, wt, bias, (stride, stride), pads, groups, (1, 1))
            for got in _evaluations(x, wt, bias, stride, padding, groups, dtype):
                err = np.vectorize(lambda g, e: abs(Fraction(float(g)) - e), otypes=[object])(got, exact)
                for bd in bds:
                    rel = bd.factor(dtype) * np.broadcast_to(bd.scale, got.shape)
                    frac = np.vectorize(Fraction, otypes=[object])
                    assert np.all(err <= frac(rel + bd.k * eta)), (kind, dtype, bsz, c, o, kh, stride, groups)
                    needs_eta |= bool(np.any(err > frac(rel)))
    assert needs_eta == (kind in ("subnormal", "mixed")), kind


def test_the_depthwise_bound_is_the_selected_backends_too():
    """The depthwise bound does not depend on the backend that evaluates the convolution (it is formed by the
    NumPy definition), and every available backend's float64 result lies within it of the exact one."""
    rng = np.random.default_rng(7)
    x = _draw(rng, (2, 5, 8, 8), "mixed", "float64")
    wt, bias = _draw(rng, (5, 1, 3, 3), "normal", "float64"), _draw(rng, (5,), "normal", "float64")
    bd = layers.depthwise_conv2d_bound(x, wt, bias, padding=1)
    exact = _exact_conv(x, wt, bias, (1, 1), (1, 1, 1, 1), 5, (1, 1))
    limit = np.vectorize(Fraction, otypes=[object])(bd.factor("float64") * bd.scale
                                                    + bd.k * numerics.underflow_eta("float64"))
    status = backends.available()
    names = [b for b in backends.kernels()["depthwise_conv2d"] if status[b].ok]
    assert "numpy" in names
    for name in names:
        with backends.use(name):
            got = layers.depthwise_conv2d(x, wt, bias, padding=1)
        err = np.vectorize(lambda g, e: abs(Fraction(float(g)) - e), otypes=[object])(got, exact)
        assert np.all(err <= limit), name
