"""The backend switch and the compiled depthwise-conv kernels (C and Numba) against their NumPy definition.

What is checked:

1. Agreement: on every Hypothesis draw, float64 and float32, the C and Numba depthwise convolutions lie
   within the error model's bound of the float64 NumPy definition (refimpl.layers._depthwise_conv2d_numpy
   on the same, dtype-rounded inputs), and accepted by the verdict's ensemble criterion with the naive same-precision NumPy
   computation.  Shapes cover odd and even kernels, stride 1-3, asymmetric padding (including padding as
   wide as the kernel), one pixel, odd and non-square grids, C = 1 and many channels, and rows wider and
   narrower than every vector tile of the C kernel.
2. An exact identity, by construction: the kernels perform the definition's operations in its order (a
   product and a sum rounded per tap, (u, v) row-major from +0, bias last, no FMA), so their output is
   bitwise the NumPy definition evaluated in the same dtype.
3. NaN/Inf propagate as the definition says, including an infinite weight meeting the zero padding
   (w * 0 = NaN).
4. Bad input: wrong dtypes, mixed precisions, wrong shapes, bad stride/padding/dilation, unusable ``out``
   buffers raise TypeError/ValueError naming the argument; non-contiguous and negative-stride inputs are
   copied and give the same result.
5. NaN poisoning: the output buffer is filled with NaN before each call, so an element a kernel does not
   write cannot pass; a refused call leaves NaN.
6. Determinism: repeated runs, and (C) every vector instruction-set level the CPU has, give the same bits.
7. The switch: ``use`` as a setting and as a context manager, ``current``, ``available``, ``auto`` and its
   table, the one-time fallback warning, ``empty_aligned``, and ``import refimpl`` without Numba, torch or
   the compiled module.

A backend that is not available here is not skipped: its tests are parametrised away and the reason is
shown in the id of ``test_backend_status`` (which checks that the fallback to NumPy works); with
REFIMPL_REQUIRE_BACKENDS=1 (CI) an unavailable backend fails instead.
"""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, layers, numerics
from refimpl.backends import _c, _c_depthwise, _numba_depthwise
from tests.kernel_helpers import (ACCELERATED, STATUS, accelerated_backend_params, backend_available,
                                  backend_status_id)

DEFINITION = layers._depthwise_conv2d_numpy
#: The accelerated backends the agreement tests run on (tests.kernel_helpers.accelerated_backend_params).
BACKEND_PARAMS = accelerated_backend_params()


def kernel(name: str):
    """The registered depthwise-conv implementation of backend ``name`` (no fallback: an unavailable one is
    a parameter only under REFIMPL_REQUIRE_BACKENDS=1, and fails here)."""
    if not backend_available(name, "depthwise_conv2d"):
        pytest.fail(f"the {name!r} backend is unavailable: {STATUS[name].reason}")
    return backends._REGISTRY["depthwise_conv2d"][name]


# ---------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------

def dw_bound(x, w, b, stride, pads) -> numerics.Bound:
    """gamma_{KH KW + 1} (gamma_{KH KW} without bias) on the convolution of absolute values: one dot product
    of length KH KW per output plus the bias addition (Higham 3.1-3.5; any summation order).  The same
    bound as layers.depthwise_conv2d_bound, which takes only symmetric padding (checked equal below)."""
    s = DEFINITION(np.abs(x), np.abs(w), None if b is None else np.abs(b), stride, pads)
    n = w.shape[-2] * w.shape[-1]
    return numerics.Bound(s, n + (1 if b is not None else 0), f"depthwise conv: gamma_(n+1), n = KH KW = {n}")


@st.composite
def dw_cases(draw, max_c: int = 20, max_h: int = 30, max_w: int = 60):
    """A depthwise-conv problem: sizes, stride, asymmetric pads, and value kinds (as seeds)."""
    b = draw(st.integers(1, 2))
    c = draw(st.one_of(st.just(1), st.integers(2, max_c)))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    top, bottom = draw(st.integers(0, kh)), draw(st.integers(0, kh))
    left, right = draw(st.integers(0, kw)), draw(st.integers(0, kw))
    h = draw(st.integers(max(1, kh - top - bottom), max_h))
    w = draw(st.integers(max(1, kw - left - right), max_w))
    return dict(shape=(b, c, h, w), kernel=(kh, kw), stride=(sh, sw), pads=(top, bottom, left, right),
                bias=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
                x_kind=draw(st.sampled_from(("normal", "all_negative", "large", "near_duplicate", "subnormal",
                                             "mixed_scale"))),
                w_kind=draw(st.sampled_from(("normal", "mixed_scale"))))


def make(case, dtype):
    """The case's (x, weight, bias) rounded to ``dtype`` and returned in ``dtype``."""
    b, c, h, w = case["shape"]
    kh, kw = case["kernel"]
    seed = case["seed"]
    x = generate(seed, case["x_kind"], (b, c, h, w), token_axis=-1)
    wt = generate(seed + 1, case["w_kind"], (c, 1, kh, kw), token_axis=-1)
    bias = generate(seed + 2, "normal", (c,)) if case["bias"] else None
    cast = (lambda a: None if a is None else np.asarray(a, dtype=dtype))
    return cast(x), cast(wt), cast(bias)


ONE_PIXEL = dict(shape=(1, 1, 1, 1), kernel=(1, 1), stride=(1, 1), pads=(0, 0, 0, 0), bias=True, seed=1,
                 x_kind="normal", w_kind="normal")
ONE_PIXEL_PADDED = dict(ONE_PIXEL, kernel=(3, 3), pads=(1, 1, 1, 1))
EVEN_ASYMMETRIC = dict(shape=(2, 3, 9, 17), kernel=(2, 4), stride=(1, 1), pads=(0, 1, 1, 2), bias=True, seed=7,
                       x_kind="normal", w_kind="normal")
NETWORK_7x7 = dict(shape=(1, 96, 14, 14), kernel=(7, 7), stride=(1, 1), pads=(3, 3, 3, 3), bias=True, seed=3,
                   x_kind="normal", w_kind="normal")   # LCM/DWC-sized 7x7 at stage 3
WIDE_ROW = dict(shape=(1, 2, 11, 70), kernel=(3, 5), stride=(1, 2), pads=(1, 1, 2, 2), bias=False, seed=5,
                x_kind="mixed_scale", w_kind="normal")


# ---------------------------------------------------------------------------------------------------
# 1-2. Agreement with the definition
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@given(case=dw_cases())
@example(case=ONE_PIXEL)
@example(case=ONE_PIXEL_PADDED)
@example(case=EVEN_ASYMMETRIC)
@example(case=NETWORK_7x7)
@example(case=WIDE_ROW)
def test_kernel_agrees_with_definition_through_error_model(backend, dtype, case):
    """|kernel - definition| <= gamma_(KH KW + 1) u_T S element-wise (S: the conv of |x|, |w|, |b|), and the
    kernel's error passes the verdict's ensemble criterion against NumPy's own computation in T."""
    x, w, b = make(case, dtype)
    got = kernel(backend)(x, w, b, case["stride"], case["pads"])
    assert got.dtype == dtype and got.flags.c_contiguous
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    b64 = None if b is None else b.astype(np.float64)
    ref = DEFINITION(x64, w64, b64, case["stride"], case["pads"])
    naive = None
    if dtype == np.float32:
        naive = numerics.naive_same_precision(DEFINITION, x64, w64, b64, case["stride"], case["pads"],
                                              dtype=np.float32)
    numerics.assert_close(got, ref, dw_bound(x64, w64, b64, case["stride"], case["pads"]), dtype, naive=naive,
                          name=f"depthwise_conv2d[{backend}]")


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@given(case=dw_cases())
@example(case=ONE_PIXEL_PADDED)
@example(case=EVEN_ASYMMETRIC)
@example(case=WIDE_ROW)
def test_kernel_is_bitwise_the_definition_in_its_precision(backend, dtype, case):
    """Exact identity by construction (ckernels/dwconv2d_body.h, refimpl/backends/_numba_depthwise.py): the same
    roundings in the same order as the NumPy definition evaluated in T.  (assert_array_equal counts
    -0 == +0; a skipped padded tap can only change the sign of a zero.)"""
    x, w, b = make(case, dtype)
    got = kernel(backend)(x, w, b, case["stride"], case["pads"])
    np.testing.assert_array_equal(got, DEFINITION(x, w, b, case["stride"], case["pads"]))


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_layers_depthwise_conv2d_dispatches_to_the_selected_backend(backend):
    """layers.depthwise_conv2d under use(backend) calls that backend's kernel (same bits as calling it
    directly) and stays within the bound of the NumPy definition; dilation != 1 goes to NumPy."""
    case = dict(EVEN_ASYMMETRIC, pads=(1, 1, 1, 1))
    x, w, b = make(case, np.float64)
    with backends.use(backend):
        assert backends.get("depthwise_conv2d") is kernel(backend)
        got = layers.depthwise_conv2d(x, w, b, stride=1, padding=1)
        dilated = layers.depthwise_conv2d(x, w, b, stride=1, padding=2, dilation=2)
    np.testing.assert_array_equal(got, kernel(backend)(x, w, b, (1, 1), (1, 1, 1, 1)))
    bound = layers.depthwise_conv2d_bound(x, w, b, stride=1, padding=1)
    numerics.assert_close(got, DEFINITION(x, w, b, (1, 1), (1, 1, 1, 1)), bound, np.float64)
    np.testing.assert_array_equal(dilated, DEFINITION(x, w, b, (1, 1), (2, 2, 2, 2), (2, 2)))
    # The local bound helper is layers' bound wherever layers' can express the padding.
    local = dw_bound(x, w, b, (1, 1), (1, 1, 1, 1))
    assert local.k == bound.k
    np.testing.assert_array_equal(local.scale, bound.scale)


# ---------------------------------------------------------------------------------------------------
# 3. NaN / Inf propagation
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@given(case=dw_cases(max_c=4, max_h=12, max_w=24), where=st.sampled_from(["x", "weight", "bias"]),
       special=st.sampled_from([np.nan, np.inf, -np.inf]), n_special=st.integers(1, 3), pick=st.integers(0, 10**6))
def test_nan_and_inf_propagate_as_in_the_definition(backend, dtype, case, where, special, n_special, pick):
    """Planted NaN/Inf in x, the weights or the bias give exactly the definition's NaN/Inf pattern (IEEE:
    Inf * 0 = NaN, Inf - Inf = NaN), including an infinite weight meeting the zero padding."""
    case = dict(case, bias=True)
    x, w, b = make(case, dtype)
    target = {"x": x, "weight": w, "bias": b}[where]
    flat = target.reshape(-1)
    idx = [(pick * (i + 1) * 7919) % flat.size for i in range(n_special)]
    flat[idx] = special
    got = kernel(backend)(x, w, b, case["stride"], case["pads"])
    with np.errstate(invalid="ignore", over="ignore"):
        same = DEFINITION(x, w, b, case["stride"], case["pads"])
        x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
        ref = DEFINITION(x64, w64, b64, case["stride"], case["pads"])
        bound = dw_bound(x64, w64, b64, case["stride"], case["pads"])
        naive = None if dtype == np.float64 else numerics.naive_same_precision(
            DEFINITION, x64, w64, b64, case["stride"], case["pads"], dtype=np.float32)
        numerics.assert_close(got, ref, bound, dtype, naive=naive, name=f"depthwise_conv2d[{backend}] with {special}")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(same))
    np.testing.assert_array_equal(got, same)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_infinite_weight_times_padding_is_nan(backend):
    """An Inf weight over a padded tap contributes Inf * 0 = NaN in the definition (explicit zero
    padding), so every output whose window touches the padding at that tap is NaN; the others are Inf."""
    x = np.ones((1, 1, 4, 4))
    w = np.zeros((1, 1, 3, 3))
    w[0, 0, 0, 0] = np.inf        # top-left tap: in the padding for output row 0 and column 0
    got = kernel(backend)(x, w, None, (1, 1), (1, 1, 1, 1))
    want = np.full((1, 1, 4, 4), np.inf)
    want[0, 0, 0, :] = np.nan
    want[0, 0, :, 0] = np.nan
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------
# 4. Bad input
# ---------------------------------------------------------------------------------------------------

def _good(dtype=np.float64):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, 3, 6, 5)).astype(dtype), rng.standard_normal((3, 1, 3, 2)).astype(dtype),
            rng.standard_normal(3).astype(dtype))


BAD_CALLS = [
    # (id, exception, words the message must contain, mutation of (x, w, b, stride, pads, kwargs))
    ("int-x", TypeError, ["'x'", "int64"], lambda x, w, b, s, p, k: (x.astype(np.int64), w, b, s, p, k)),
    ("float16-x", TypeError, ["'x'", "float16"], lambda x, w, b, s, p, k: (x.astype(np.float16), w, b, s, p, k)),
    ("complex-weight", TypeError, ["'weight'"], lambda x, w, b, s, p, k: (x, w.astype(complex), b, s, p, k)),
    ("mixed-weight", TypeError, ["'weight'", "float32", "float64"],
     lambda x, w, b, s, p, k: (x, w.astype(np.float32), b, s, p, k)),
    ("mixed-bias", TypeError, ["'bias'", "float32"], lambda x, w, b, s, p, k: (x, w, b.astype(np.float32), s, p, k)),
    ("byteswapped-x", TypeError, ["'x'", "byte order"],
     lambda x, w, b, s, p, k: (x.astype(x.dtype.newbyteorder()), w, b, s, p, k)),
    ("3d-x", ValueError, ["'x'", "(B, C, H, W)"], lambda x, w, b, s, p, k: (x[0], w, b, s, p, k)),
    ("weight-channels", ValueError, ["'weight'", "(3, 1, KH, KW)"], lambda x, w, b, s, p, k: (x, w[:2], b, s, p, k)),
    ("weight-groups", ValueError, ["'weight'"], lambda x, w, b, s, p, k: (x, np.repeat(w, 2, axis=1), b, s, p, k)),
    ("bias-shape", ValueError, ["'bias'", "(3,)"], lambda x, w, b, s, p, k: (x, w, b[:2], s, p, k)),
    ("empty-x", ValueError, ["non-empty"], lambda x, w, b, s, p, k: (x[:, :, :0], w, b, s, p, k)),
    ("stride-0", ValueError, ["'stride'"], lambda x, w, b, s, p, k: (x, w, b, (0, 1), p, k)),
    ("stride-float", ValueError, ["'stride'"], lambda x, w, b, s, p, k: (x, w, b, (1.5, 1), p, k)),
    ("pads-negative", ValueError, ["'pads'"], lambda x, w, b, s, p, k: (x, w, b, s, (0, -1, 0, 0), k)),
    ("pads-length", ValueError, ["'pads'"], lambda x, w, b, s, p, k: (x, w, b, s, (1, 1), k)),
    ("kernel-too-big", ValueError, ["'pads'", "smaller than the kernel"],
     lambda x, w, b, s, p, k: (x, np.ones((3, 1, 9, 2)), b, s, p, k)),
    ("dilation", ValueError, ["'dilation'", "NumPy definition"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(k, dilation=(2, 1)))),
    ("out-not-array", TypeError, ["'out'"], lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=[0.0]))),
    ("out-dtype", TypeError, ["'out'", "float32"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=np.zeros((2, 3, 6, 6), np.float32)))),
    ("out-shape", ValueError, ["'out'", "(2, 3, 6, 6)"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=np.zeros((2, 3, 6, 5))))),
    ("out-non-contiguous", ValueError, ["'out'", "C-contiguous"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=np.zeros((2, 3, 6, 12))[..., ::2]))),
    ("out-transposed", ValueError, ["'out'", "C-contiguous"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=np.zeros((6, 6, 3, 2)).T))),
    ("out-read-only", ValueError, ["'out'", "writeable"],
     lambda x, w, b, s, p, k: (x, w, b, s, p, dict(out=np.broadcast_to(np.zeros(1), (2, 3, 6, 6))))),
    ("out-aliases-x", ValueError, ["'out'", "'x'"],
     lambda x, w, b, s, p, k: (np.zeros((2, 3, 6, 6)), np.ones((3, 1, 1, 1)), b, s, (0, 0, 0, 0),
                               dict(out=None))),
]


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("case_id,exc,words,mutate", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_refused_naming_the_argument(backend, case_id, exc, words, mutate):
    """Every malformed call raises TypeError/ValueError whose message names the argument and says what was
    expected; nothing reaches the compiled kernel.  (The kernel itself is replaced by a trap here.)"""
    if backend == "numpy":  # the definition does not validate: layers.depthwise_conv2d does
        assert "depthwise_conv2d" in backends.kernels()
        return
    x, w, b = _good()
    x, w, b, s, p, kw = mutate(x, w, b, (1, 1), (1, 1, 1, 1), {})
    if case_id == "out-aliases-x":
        kw = dict(out=x)
    with pytest.raises(exc) as info:
        kernel(backend)(x, w, b, s, p, **kw)
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_non_contiguous_and_negative_stride_inputs_are_copied(backend):
    """Views with gaps, transposed and negative-stride arrays give exactly the result of their contiguous
    copies (they are made contiguous before the kernel sees them; the inputs are not modified)."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((2, 3, 14, 22))
    x = big[:, :, ::2, ::-2]                                   # gaps and a negative stride
    w = np.ascontiguousarray(rng.standard_normal((3, 3, 1, 4)).transpose(0, 2, 1, 3))[:, :, ::-1, :]
    b = rng.standard_normal(6)[::2]
    before = (x.copy(), w.copy(), b.copy())
    got = kernel(backend)(x, w, b, (1, 2), (1, 2, 0, 3))
    want = kernel(backend)(np.ascontiguousarray(x), np.ascontiguousarray(w), np.ascontiguousarray(b),
                           (1, 2), (1, 2, 0, 3))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, DEFINITION(x, w, b, (1, 2), (1, 2, 0, 3)))
    for a, a0 in zip((x, w, b), before):
        np.testing.assert_array_equal(a, a0)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_out_buffer_is_written_in_place_and_reused(backend, dtype):
    """out= is filled in place and returned (the same object), across repeated calls; the default output is
    64-byte aligned (config.KERNEL_BUFFER_ALIGNMENT)."""
    if backend == "numpy":
        assert backends.is_aligned(backends.empty_aligned((3, 5), dtype))
        return
    x, w, b = _good(dtype)
    out = backends.empty_aligned((2, 3, 6, 6), dtype)
    for _ in range(2):
        res = kernel(backend)(x, w, b, (1, 1), (1, 1, 1, 1), out=out)
        assert res is out
    np.testing.assert_array_equal(out, DEFINITION(x, w, b, (1, 1), (1, 1, 1, 1)))
    assert backends.is_aligned(kernel(backend)(x, w, b, (1, 1), (1, 1, 1, 1)))


# ---------------------------------------------------------------------------------------------------
# 5. NaN poisoning
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_output_is_nan_poisoned_before_the_kernel_runs(backend, monkeypatch):
    """With the compiled kernel replaced by one that writes nothing, the wrapper returns all NaN (also into
    a caller's zero-filled out=), so an output element a kernel never writes cannot pass a comparison."""
    if backend == "c":
        monkeypatch.setattr(_c_depthwise, "_call", lambda result, a: None)
    elif backend == "numba":
        monkeypatch.setattr(_numba_depthwise, "_dwconv2d_compiled", lambda dtype: (lambda *args: None))
    else:
        assert np.isnan(np.full(1, np.nan)).all()  # NumPy computes every element; nothing to poison
        return
    x, w, b = _good()
    assert np.isnan(kernel(backend)(x, w, b, (1, 1), (1, 1, 1, 1))).all()
    out = np.zeros((2, 3, 6, 6))
    kernel(backend)(x, w, b, (1, 1), (1, 1, 1, 1), out=out)
    assert np.isnan(out).all()


def test_refused_c_call_leaves_the_poisoned_output():
    """If the C kernel refuses its arguments (status != 0: here a zero stride smuggled past validation)
    the wrapper raises and the output stays NaN; the raw kernel writes nothing on a nonzero status."""
    if not backend_available("c", "depthwise_conv2d"):
        return
    from refimpl.backends import _validate
    mod = _c._load()
    x, w, b = _good()
    a = _validate.depthwise_args(x, w, b, (1, 1), (1, 1, 1, 1), None, (1, 1), "C")
    bad = _validate.DepthwiseArgs(**{**a.__dict__, "stride": (0, 1)})
    out = np.full(a.out_shape, np.nan)
    with pytest.raises(RuntimeError, match="status 2"):
        _c_depthwise._call(out, bad)
    assert np.isnan(out).all()
    ffi, lib = mod.ffi, mod.lib
    sentinel = np.full(4, 7.0)
    buf = ffi.from_buffer("double[]", sentinel, require_writable=True)
    one = ffi.from_buffer("double[]", np.ones(4))
    for args, code in [((1, 1, 0, 0, 1, 1, 2, 2, 1, 1, 0, 2), 1),    # OH = 0
                       ((0, 1, 0, 0, 1, 1, 2, 2, 1, 1, 2, 2), 2),    # stride_h = 0
                       ((1, 1, -1, 0, 1, 1, 2, 2, 1, 1, 2, 2), 3),   # pad_top < 0
                       ((1, 1, 0, 0, 2**62, 2**62, 2, 2, 1, 1, 2, 2), 4)]:  # overflow
        assert lib.refimpl_dwconv2d_f64(buf, one, one, ffi.NULL, *args) == code
    assert lib.refimpl_dwconv2d_f64(ffi.NULL, one, one, ffi.NULL, 1, 1, 0, 0, 1, 1, 2, 2, 1, 1, 2, 2) == 5
    np.testing.assert_array_equal(sentinel, 7.0)


# ---------------------------------------------------------------------------------------------------
# 6. Determinism
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_repeated_runs_are_bitwise_identical(backend, dtype):
    """Three runs on the same inputs return the same bits (no uninitialised reads, no order that depends
    on timing or alignment: the inputs are also passed at a different address each time)."""
    x, w, b = make(dict(NETWORK_7x7, shape=(2, 5, 19, 37)), dtype)
    runs = [kernel(backend)(np.array(x), w.copy(), b.copy(), (1, 1), (3, 3, 3, 3)) for _ in range(3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@given(case=dw_cases(max_c=3, max_h=20, max_w=70))
@example(case=NETWORK_7x7)
def test_c_kernel_gives_the_same_bits_at_every_vector_level(dtype, case):
    """The AVX-512, AVX2 and baseline versions of the C plane loop (ckernels/dwconv2d.c) differ only in
    vector width, so each level the CPU supports returns the same bits."""
    if not backend_available("c", "depthwise_conv2d"):
        return
    lib = _c._load().lib
    x, w, b = make(case, dtype)
    results = []
    try:
        for level in range(lib.refimpl_isa_supported() + 1):
            assert lib.refimpl_set_max_isa(level) == level
            results.append(_c_depthwise.depthwise_conv2d(x, w, b, case["stride"], case["pads"]))
    finally:
        lib.refimpl_set_max_isa(2)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


PLANE_CASES = [
    # the benchmark's workloads: the staged-plane tiles (7x7 with a half-width last tile, 3x3 one masked tile)
    dict(shape=(1, 4, 56, 56), kernel=(7, 7), stride=(1, 1), pads=(3, 3, 3, 3), bias=True, seed=11,
         x_kind="normal", w_kind="normal"),
    dict(shape=(1, 6, 14, 14), kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), bias=True, seed=12,
         x_kind="mixed_scale", w_kind="normal"),
    # planes too large for the kernel's 64 KiB staging buffer (the tile-by-tile fallback), both dtypes
    dict(shape=(1, 2, 131, 140), kernel=(7, 7), stride=(1, 1), pads=(3, 3, 3, 3), bias=True, seed=13,
         x_kind="normal", w_kind="normal"),
    dict(shape=(1, 2, 150, 171), kernel=(3, 5), stride=(2, 1), pads=(1, 2, 2, 2), bias=False, seed=14,
         x_kind="large", w_kind="mixed_scale"),
    # staged-plane pitch boundaries (row pitch 32 / 64 / 128 elements)
    dict(shape=(1, 3, 40, 26), kernel=(7, 7), stride=(1, 1), pads=(3, 3, 3, 3), bias=True, seed=15,
         x_kind="near_duplicate", w_kind="normal"),
    dict(shape=(1, 3, 33, 58), kernel=(7, 7), stride=(1, 1), pads=(3, 3, 3, 3), bias=False, seed=16,
         x_kind="subnormal", w_kind="normal"),
    dict(shape=(2, 2, 20, 122), kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), bias=True, seed=17,
         x_kind="normal", w_kind="mixed_scale"),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", PLANE_CASES, ids=lambda c: "x".join(map(str, c["shape"][2:])) + f"_k{c['kernel'][0]}")
def test_c_kernel_plane_paths_are_the_definition_at_every_vector_level(dtype, case):
    """The network-size planes (staged into the kernel's zero-padded plane buffer, specialised 7x7 and 3x3
    tiles, masked or half-width last tiles), the planes too large for that buffer (the tile-by-tile
    fallback: Hypothesis' small planes never reach it) and the row-pitch boundaries: at every vector level
    the C kernel returns exactly the NumPy definition's bits in T (same products and sums in the same
    order; ckernels/dwconv2d_body.h)."""
    x, w, b = make(case, dtype)
    want = DEFINITION(x, w, b, case["stride"], case["pads"])
    if not backend_available("c", "depthwise_conv2d"):
        np.testing.assert_array_equal(kernel("numpy")(x, w, b, case["stride"], case["pads"]), want)
        return
    lib = _c._load().lib
    try:
        for level in range(lib.refimpl_isa_supported() + 1):
            assert lib.refimpl_set_max_isa(level) == level
            np.testing.assert_array_equal(_c_depthwise.depthwise_conv2d(x, w, b, case["stride"], case["pads"]), want,
                                          err_msg=f"vector level {level}")
    finally:
        lib.refimpl_set_max_isa(2)


# ---------------------------------------------------------------------------------------------------
# 7. The switch
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ACCELERATED, ids=[backend_status_id(n) for n in ACCELERATED])
def test_backend_status(name):
    """available() reports each backend; with REFIMPL_REQUIRE_BACKENDS=1 every backend must be available.
    An unavailable one (its reason is in this test's id) must fall back to NumPy with a warning."""
    status = backends.available()[name]
    assert isinstance(status, backends.Status) and isinstance(status.reason, str) and status.reason
    backend_available(name)     # fails under REFIMPL_REQUIRE_BACKENDS=1 when unavailable
    if status.ok:
        assert backends.get("depthwise_conv2d", name) is backends._REGISTRY["depthwise_conv2d"][name]
    else:
        backends._WARNED.discard(("depthwise_conv2d", name))
        with pytest.warns(RuntimeWarning, match=name):
            assert backends.get("depthwise_conv2d", name) is DEFINITION


def test_available_reports_every_backend_with_reasons():
    """numpy is always available; every entry is a Status whose truth value is its ok flag; a built C module
    reports the floating-point flags it was compiled with (no fast-math, no contraction)."""
    status = backends.available()
    assert set(status) == {"numpy", "numba", "c"}
    assert status["numpy"].ok and bool(status["numpy"])
    for s in status.values():
        assert bool(s) == s.ok and s.reason
    if status["c"].ok:
        assert "-ffp-contract=off" in status["c"].reason and "-ffast-math" not in status["c"].reason
    if status["numba"].ok:
        assert f"fastmath={config.NUMBA_FASTMATH}" in status["numba"].reason


def test_use_as_setting_and_as_context_manager():
    """use(name) selects immediately (a setting); as a context manager it restores the previous choice on
    exit, also when nested and on an exception.  Run in a copied context so the setting does not leak."""
    def body():
        start = backends.current()
        backends.use("c")
        assert backends.current() == "c"
        with backends.use("numba") as u:
            assert backends.current() == "numba" and u.name == "numba"
            with backends.use("auto"):
                assert backends.current() == "auto"
            assert backends.current() == "numba"
        assert backends.current() == "c"
        with pytest.raises(KeyError):
            with backends.use("numpy"):
                assert backends.current() == "numpy"
                raise KeyError("boom")
        assert backends.current() == "c"
        backends.use(start)
        assert backends.current() == start
        return True

    default = backends.current()
    assert contextvars.copy_context().run(body)
    assert backends.current() == default


@pytest.mark.parametrize("bad", ["cuda", "C", None, 3])
def test_use_rejects_unknown_backends(bad):
    """Unknown names raise ValueError listing the choices (and change nothing)."""
    before = backends.current()
    with pytest.raises(ValueError, match="numpy"):
        backends.use(bad)
    assert backends.current() == before
    with pytest.raises(ValueError, match="'backend'"):
        backends.register("op", bad)


def test_fallback_warns_once_per_operation_and_backend():
    """An op with no kernel on the selected backend runs its NumPy definition and warns once (a
    RuntimeWarning naming the op and the backend); the next calls are silent."""
    op = "_test_only_identity_op"
    definition = backends.register(op, "numpy")(lambda a: a)
    try:
        for name in ACCELERATED:
            with backends.use(name):
                with pytest.warns(RuntimeWarning) as rec:
                    assert backends.get(op) is definition
                assert len(rec) == 1 and op in str(rec[0].message) and repr(name) in str(rec[0].message)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    assert backends.get(op) is definition
        with backends.use("auto"), warnings.catch_warnings():
            warnings.simplefilter("error")       # auto falls back silently: it promised nothing
            assert backends.get(op) is definition
        with pytest.raises(KeyError, match="no NumPy definition"):
            backends.get("_no_such_op")
    finally:
        backends._REGISTRY.pop(op, None)


def test_unavailable_backend_falls_back_with_its_reason(monkeypatch):
    """A selected backend that is unavailable falls back to NumPy; the warning carries available()'s
    reason."""
    fake = dict(backends.available())
    fake["numba"] = backends.Status(False, "numba is not installed (simulated)")
    monkeypatch.setattr(backends, "available", lambda refresh=False: fake)
    backends._WARNED.discard(("depthwise_conv2d", "numba"))
    with backends.use("numba"), pytest.warns(RuntimeWarning, match="simulated"):
        assert backends.get("depthwise_conv2d") is DEFINITION
    backends._WARNED.discard(("depthwise_conv2d", "numba"))


def test_auto_follows_the_table_then_the_fallback_order(monkeypatch, tmp_path):
    """auto takes the first available backend with a kernel, in the benchmark table's order for the op
    (per dtype if given), else c > numba > numpy; names that are not backends are ignored."""
    table = {"ops": {"depthwise_conv2d": {"float32": ["numba", "c"], "default": ["bogus", "numpy"]}}}
    path = tmp_path / "auto_table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("REFIMPL_AUTO_TABLE", str(path))
    monkeypatch.setattr(backends, "_AUTO_CACHE", {})
    assert backends.auto_order("depthwise_conv2d", np.float32) == ("numba", "c", "numpy")
    assert backends.auto_order("depthwise_conv2d") == ("numpy",)
    assert backends.auto_order("other_op") == tuple(config.AUTO_FALLBACK_ORDER)
    impls = backends._REGISTRY["depthwise_conv2d"]
    first32 = next(b for b in ("numba", "c", "numpy") if b == "numpy" or STATUS[b].ok)
    assert backends.get("depthwise_conv2d", "auto", dtype=np.float32) is impls[first32]
    assert backends.get("depthwise_conv2d", "auto") is impls["numpy"]
    monkeypatch.setenv("REFIMPL_AUTO_TABLE", str(tmp_path / "absent.json"))
    first = next(b for b in config.AUTO_FALLBACK_ORDER if b == "numpy" or STATUS[b].ok)
    assert backends.get("depthwise_conv2d", "auto") is impls[first]
    path.write_text("{not json")
    monkeypatch.setenv("REFIMPL_AUTO_TABLE", str(path))
    monkeypatch.setattr(backends, "_AUTO_CACHE", {})
    with pytest.warns(RuntimeWarning, match="ignoring the auto table"):
        assert backends.auto_order("depthwise_conv2d") == tuple(config.AUTO_FALLBACK_ORDER)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5, 2)])
def test_empty_aligned(dtype, shape):
    """empty_aligned returns a C-contiguous writeable array of the shape and dtype whose data pointer is
    a multiple of the alignment; bad alignments are refused."""
    for alignment in (config.KERNEL_BUFFER_ALIGNMENT, 128):
        a = backends.empty_aligned(shape, dtype, alignment)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert backends.is_aligned(a, alignment)
    with pytest.raises(ValueError, match="'alignment'"):
        backends.empty_aligned(shape, dtype, 48)


def test_import_refimpl_without_numba_torch_or_the_compiled_module():
    """In a fresh interpreter where numba, torch and refimpl._native._kernels cannot be imported, refimpl
    imports, available() says why C and Numba are unavailable, and a reference function selected onto
    the C backend falls back to NumPy with a warning; torch is never imported."""
    code = textwrap.dedent("""
        import sys, warnings, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("numba", "torch") or name == "refimpl._native._kernels":
                    raise ImportError(f"blocked for the test: {name}")
        sys.meta_path.insert(0, Block())
        import numpy as np
        import refimpl
        from refimpl import backends, layers
        st = backends.available()
        assert st["numpy"].ok and not st["numba"].ok and not st["c"].ok, st
        assert "numba" in st["numba"].reason and "refimpl._native._kernels" in st["c"].reason, st
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with backends.use("c"):
                y = layers.depthwise_conv2d(np.ones((1, 2, 3, 3)), np.ones((2, 1, 3, 3)), padding=1)
        assert y[0, 0, 1, 1] == 9.0 and any("'c' backend" in str(r.message) for r in rec), rec
        assert "torch" not in sys.modules and "numba" not in sys.modules
        print("ok")
    """)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_the_auto_table_is_package_data():
    """The "auto" order ships with the package: its default table lives inside refimpl/backends and is declared
    as package data, so a regular (non-editable) install reads the same table as a source checkout (it used to be
    read from benchmarks/results/, outside the package, and a regular install silently fell back)."""
    tomllib = pytest.importorskip("tomllib")   # Python >= 3.11
    from pathlib import Path

    import refimpl

    default = backends._AUTO_TABLE_DEFAULT
    assert default.is_file() and default.parent == Path(backends.__file__).resolve().parent
    assert default.is_relative_to(Path(refimpl.__file__).resolve().parent)
    table = json.loads(default.read_text())
    assert isinstance(table.get("ops", table), dict) and table.get("ops", table)
    pyproject = tomllib.loads((Path(refimpl.__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert default.name in pyproject["tool"]["setuptools"]["package-data"]["refimpl.backends"]


def test_call_runs_a_kernel_only_where_its_predicate_holds(monkeypatch):
    """backends.call: the caller names the operation; the registry runs the selected
    backend's kernel where its ``supports`` predicate holds, and elsewhere the NumPy computation (the caller's
    ``otherwise`` if given, else the definition), silently; "auto" skips a kernel that refuses the call; a
    backend without a kernel falls back to the definition with the warning, as get() does."""
    op = "_test_call_predicates"
    seen: list[str] = []
    fake = {name: backends.Status(True, "simulated") for name in backends.BACKENDS}
    monkeypatch.setattr(backends, "available", lambda refresh=False: fake)
    try:
        backends.register(op, "numpy", lambda a, *, flag=False: (seen.append("numpy"), a)[1])
        backends.register(op, "c", lambda a, *, flag=False: (seen.append("c"), a)[1],
                          supports=lambda a, *, flag=False: a.dtype == np.float64 and not flag)
        x64, x32 = np.ones(3), np.ones(3, np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert backends.call(op, x64) is x64 and seen == ["numpy"]                  # default: NumPy
            with backends.use("c"):
                backends.call(op, x64)
                backends.call(op, x32)                                                  # refused: definition
                backends.call(op, x64, flag=True)                                       # keywords reach it
                assert backends.call(op, x32, otherwise=lambda: "mine") == "mine"      # the caller's path
            assert seen == ["numpy", "c", "numpy", "numpy"]
            with backends.use("numpy"):
                assert backends.call(op, x64, otherwise=lambda: "mine") == "mine"
            with backends.use("auto"):
                seen.clear()
                backends.call(op, x64)
                backends.call(op, x32)
                assert seen == ["c", "numpy"]
                assert backends.call(op, x32, otherwise=lambda: "mine") == "mine"      # refused: caller's path
            # "auto" whose table puts NumPy first keeps the caller's own NumPy path too
            monkeypatch.setattr(backends, "auto_order", lambda o, dtype=None: ("numpy", "c"))
            with backends.use("auto"):
                seen.clear()
                assert backends.call(op, x64, otherwise=lambda: "mine") == "mine" and seen == []
        backends._WARNED.discard((op, "numba"))
        with backends.use("numba"), pytest.warns(RuntimeWarning, match="no 'numba' kernel"):
            seen.clear()
            backends.call(op, x64, otherwise=lambda: "mine")       # a kernel exists (c) but not on numba
            assert seen == ["numpy"]
        assert backends.definition(op) is backends._REGISTRY[op]["numpy"]
        with pytest.raises(ValueError, match="'supports'"):
            backends.register(op, "numpy", lambda a: a, supports=lambda a: True)
        with pytest.raises(KeyError, match="no NumPy definition"):
            backends.call("_no_such_op", x64)
    finally:
        backends._REGISTRY.pop(op, None)
        backends._SUPPORTS.pop(op, None)
        backends._WARNED.discard((op, "numba"))
