"""The plain C kernels (ckernels/*_plain.c, refimpl.backends._c_plain) and the checker of the fast ones.

Each fast C kernel (threaded, chunked, vectorised) has beside it a plain version of the same entry point's
mathematics: scalar loops in the order of the papers' equations, one thread, libm.  The plain version is the
fast one's specification.  What is checked, for random shapes and options (Hypothesis), float64 and float32:

(a) plain C vs the NumPy definition, within the error model's bound of that operation (the bounds of the
    existing kernel tests): linear.linear_attention_bound (ReLU, ELU + 1; L2ViT Eq. 2-4, Appendix 8),
    focused.focused_attention_bound (FLatten Eq. 4-6), angular.linear_angular_attention_bound (Castling-ViT
    Eq. 9), rala.rala_core_bound (RALA Eq. 2-4: the plain alpha of
    Eq. 4 fed to the plain linear attention with key weights), softmax.softmax_attention_bound (Swin Eq. 4 per
    window).  float32 also takes the ensemble criterion against NumPy's float32 run
    (tests.kernel_helpers.kernel_verdict).
(b) fast C vs plain C: the fast kernel lies within the same bound on the same draw, and where it performs the
    same operations in the same order it returns the plain kernel's bits:
    - linear attention (and RALA's reweighted form: key weights, kv_scale, v_scale): bit-identical for the ReLU
      map whenever the keys form one chunk (refimpl_linear_attention_chunks(M) == 1, i.e. M < 128), at every
      thread count.  Not identical for ELU + 1 (the fast kernel's own exp against libm's), for the focused map
      (8-lane sums of the row norms, r^p by repeated products against libm's pow) or for M >= 128 (key chunks
      summed in chunk order);
    - Castling-ViT's linear-angular attention (Eq. 9): bit-identical for d < 8 with one key chunk (the fast
      kernel sums a unit row's squares in 8 lanes); elsewhere within linear_angular_attention_bound;
    - RALA's alpha: never bit-identical in general (8-lane dot products and exponential sums, token chunks, the
      fast exp): within the bound only;
    - window attention: the same operations in the same order except exp (fast: the kernel's vector exp;
      plain: libm's), so bit-identical exactly where every exp argument is 0 or -inf (one key per row: M = 1,
      or a mask that leaves one key), which pins the bias / mask / value indexing bit for bit; elsewhere within
      the bound;
    - the feature maps alone (ELU + 1, FLatten's phi_p): within elu1_bound / focused_function_bound, plain and
      fast; bit-identical where x > 0 (ELU + 1) and for d < 8 with r^p by pow in both (focused);
    - depthwise conv2d (MobileNets Eq. 3): the plain kernel is the definition's bits in its own precision and
      within dw_bound; the fast kernel is the plain kernel's bits on every draw (strides, asymmetric padding,
      subnormal and non-finite inputs).
Plus: the plain wrappers have the registered wrappers' range policy (out-of-band float64 inputs and NaN / Inf
results answered by the NumPy definition, bit for bit), they refuse bad input naming the argument, their outputs are NaN-poisoned before the call,
the raw plain entry points refuse bad sizes / options / workspaces with a status (for the maps and the depthwise
convolution the fast entry point's) and write nothing, and they are not registered as backends.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics
from refimpl.attention import focused, linear, rala, softmax
from refimpl.backends import _c, _c_depthwise, _c_linear, _c_plain, _c_softmax
from tests.kernel_helpers import backend_available, c_kernel_that_writes_nothing, kernel_verdict
from tests.test_backends import (DEFINITION as DW_DEFINITION, EVEN_ASYMMETRIC as DW_EVEN_ASYMMETRIC,
                                 ONE_PIXEL_PADDED as DW_ONE_PIXEL_PADDED, WIDE_ROW as DW_WIDE_ROW, dw_bound,
                                 dw_cases, make as dw_make)
from tests.test_kernels_focused import _map_input as focused_map_input
from tests.test_kernels_rala import elu1_bound

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
#: Input kinds of q and k (equivalence.strategies.generate), every one: "mixed_scale" and "large" rows, whose
#: ELU + 1 features underflow (exp(-1e4)) to a zero normaliser that the definition recomputes from log-features,
#: and "subnormal" ones (around 1e-310, below the kernels' band) are answered by the definition in float64 by
#: the plain wrappers as by the registered ones (the range policy of refimpl.backends._c.run_kernel).
KINDS = ("normal", "near_duplicate", "all_negative", "mixed_scale", "large", "subnormal")
POLICIES = ({}, {"eps": 1e-6}, {"eps": 1e-3, "eps_policy": "clamp"}, {"clamp_min": 1e-2},
            {"clamp_min": 1.0, "eps": 1e-6})


def needs_c() -> bool:
    """Whether the compiled module is there; its absence is allowed (these tests then check nothing but the
    registry) unless REFIMPL_REQUIRE_BACKENDS=1 (tests.kernel_helpers.backend_available)."""
    return backend_available("c", "linear_attention")


def one_chunk(m: int) -> bool:
    """Whether the fast linear-attention kernel sums the M keys as one chunk (the plain kernel's order)."""
    return int(_c._load().lib.refimpl_linear_attention_chunks(m)) == 1


# ---------------------------------------------------------------------------------------------------
# Linear attention: refimpl_linear_attention_plain
# ---------------------------------------------------------------------------------------------------

@st.composite
def la_cases(draw):
    """Sizes (M up to 160: one key chunk below 128, several above), map, normaliser policy, kinds (seeds)."""
    fm = draw(st.sampled_from(("relu", "elu1", "focused")))
    policy = draw(st.sampled_from(({}, {"eps": 1e-6}) if fm == "focused" else POLICIES))
    return dict(shape=(draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 40)),
                       draw(st.one_of(st.integers(1, 127), st.integers(128, 160))), draw(st.integers(1, 20)),
                       draw(st.integers(1, 12))),
                feature_map=fm, policy=policy, p=draw(st.sampled_from((1.0, 2.0, 3.0, 2.5))),
                seed=draw(st.integers(0, 2**32 - 1)), q_kind=draw(st.sampled_from(KINDS)),
                k_kind=draw(st.sampled_from(KINDS)), v_kind=draw(st.sampled_from(("normal", "mixed_scale"))))


def la_inputs(c, dtype):
    b, h, n, m, d, e = c["shape"]
    s = c["seed"]
    return tuple(np.asarray(generate(s + i, kind, shape), dtype=dtype) for i, (kind, shape) in enumerate(
        ((c["q_kind"], (b, h, n, d)), (c["k_kind"], (b, h, m, d)), (c["v_kind"], (b, h, m, e)))))


def la_reference(c, q, k, v, dtype):
    """(float64 definition, bound for ``dtype``, NumPy's own run in float32 or None) of a linear-attention case."""
    fm, pol, p = c["feature_map"], c["policy"], c["p"]
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    definition = linear._linear_attention_numpy
    with np.errstate(all="ignore"):
        ref = definition(q64, k64, v64, fm, p=p, **pol)
        if fm == "focused":
            bound = focused.focused_attention_bound(q64, k64, v64, p=p, eps=pol.get("eps", 0.0),
                                                    dtype=np.dtype(dtype).name)
        else:
            bound = linear.linear_attention_bound(q64, k64, v64, feature_map=fm, dtype=dtype, **pol)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(definition, q64, k64, v64, fm,
                                                                              p=p, dtype=np.float32, **pol)
    return ref, bound, naive


def judge(dtype, focused_map: bool):
    """The comparison: assert_close (a "match" verdict), except the focused map and float32 windows / RALA,
    where the running bound may reach the output's size and the verdict "inconclusive" is accepted
    (tests.kernel_helpers.kernel_verdict: never a divergence)."""
    return kernel_verdict(dtype) if focused_map else numerics.assert_close


@DTYPES
@given(c=la_cases())
@example(c=dict(shape=(1, 2, 37, 100, 16, 9), feature_map="relu", policy={"clamp_min": 1e-2}, p=3.0, seed=5,
                q_kind="normal", k_kind="normal", v_kind="normal"))
@example(c=dict(shape=(1, 1, 9, 150, 20, 3), feature_map="elu1", policy={"eps": 1e-6}, p=3.0, seed=6,
                q_kind="mixed_scale", k_kind="all_negative", v_kind="normal"))
@example(c=dict(shape=(2, 1, 11, 13, 12, 5), feature_map="focused", policy={}, p=2.5, seed=7, q_kind="normal",
                k_kind="near_duplicate", v_kind="normal"))
def test_linear_attention_plain_and_fast_against_definition(dtype, c):
    """(a) the plain kernel within the bound of the float64 definition; (b) the fast kernel (1 and 3 threads)
    within the same bound, and bit-identical to the plain kernel for ReLU with one key chunk (M < 128)."""
    if not needs_c():
        return
    q, k, v = la_inputs(c, dtype)
    fm, pol, p = c["feature_map"], c["policy"], c["p"]
    plain = _c_plain.linear_attention(q, k, v, fm, p=p, **pol)
    assert plain.dtype == dtype and plain.shape == q.shape[:3] + v.shape[3:]
    ref, bound, naive = la_reference(c, q, k, v, dtype)
    check = judge(dtype, fm == "focused")
    check(plain, ref, bound, dtype, naive=naive, name=f"linear_attention[plain C, {fm}, {pol}]")
    for t in (1, 3):
        fast = _c_linear.linear_attention(q, k, v, fm, p=p, threads=t, **pol)
        check(fast, ref, bound, dtype, naive=naive, name=f"linear_attention[fast C, {fm}, {pol}, threads={t}]")
        if fm == "relu" and one_chunk(c["shape"][3]):
            np.testing.assert_array_equal(fast, plain, err_msg="fast != plain where they perform the same "
                                                               "operations in the same order")


@DTYPES
@pytest.mark.parametrize("mode", ["divide", "multiply"])
def test_reweighted_and_v_scale_forms_are_the_fast_bits(dtype, mode):
    """The plain kernel's key weights (RALA Eq. 3's alpha_j), kv_scale and v_scale (L2ViT's per-head gain) are
    the operations of the definition (v_scale: the bits of the prescaled v) and, for ReLU with one key chunk,
    the fast kernel's bits at every thread count; with several key chunks both stay within
    linear_attention_bound of the prescaled definition."""
    if not needs_c():
        return
    for m in (90, 200):
        q, k, v = la_inputs(dict(shape=(2, 3, 70, m, 24, 17), seed=21, q_kind="normal", k_kind="normal",
                                 v_kind="mixed_scale"), dtype)
        s = np.asarray([0.5, 3.0, 1.25], dtype=dtype)
        prescaled = v / s.reshape(1, 3, 1, 1) if mode == "divide" else v * s.reshape(1, 3, 1, 1)
        plain = _c_plain.linear_attention(q, k, v, "relu", 1e-6, v_scale=s, v_scale_mode=mode)
        np.testing.assert_array_equal(plain, _c_plain.linear_attention(q, k, prescaled, "relu", 1e-6))
        alpha = np.asarray(np.random.default_rng(m).random((2, 3, m)) * 2, dtype=dtype)
        rw_plain = _c_plain.reweighted_linear_attention(q, k, v, alpha, "relu", 1.0 / m, 1e-6)
        for t in (1, 2, 5):
            fast = _c_linear.linear_attention(q, k, v, "relu", 1e-6, v_scale=s, v_scale_mode=mode, threads=t)
            rw_fast = _c_linear.reweighted_linear_attention(q, k, v, alpha, "relu", 1.0 / m, 1e-6, threads=t)
            if one_chunk(m):
                np.testing.assert_array_equal(fast, plain)
                np.testing.assert_array_equal(rw_fast, rw_plain)
            else:
                q64, k64, v64 = (a.astype(np.float64) for a in (q, k, prescaled))
                ref = linear._linear_attention_numpy(q64, k64, v64, "relu", 1e-6)
                bound = linear.linear_attention_bound(q64, k64, v64, feature_map="relu", eps=1e-6, dtype=dtype)
                for got in (plain, fast):
                    numerics.assert_close(got, ref, bound, dtype, name=f"v_scale {mode}, M = {m}")


# ---------------------------------------------------------------------------------------------------
# Castling-ViT's linear-angular attention: refimpl_linear_angular_plain
# ---------------------------------------------------------------------------------------------------

@st.composite
def angular_cases(draw):
    """A linear-angular problem (M = N for constant "own"; d below and above 8, M below and above 128)."""
    c = draw(la_cases())
    b, h, n, m, d, e = c["shape"]
    constant = draw(st.sampled_from(("sum", "own")))
    c.update(shape=(b, h, n, n if constant == "own" else m, d, e), constant=constant,
             normaliser=draw(st.sampled_from(("none", "similarity_sum"))))
    return c


@DTYPES
@given(c=angular_cases())
@example(c=dict(shape=(1, 2, 30, 30, 5, 7), feature_map="relu", policy={}, p=3.0, seed=9, q_kind="normal",
                k_kind="near_duplicate", v_kind="normal", constant="own", normaliser="similarity_sum"))
def test_linear_angular_plain_and_fast_against_definition(dtype, c):
    """(a) the plain kernel within linear_angular_attention_bound of angular.linear_angular_attention (Castling-ViT
    Eq. 9, paper-mode unit rows) in float64; (b) the fast kernel (1 and 3 threads) within the same bound, and
    bit-identical to the plain kernel for d < 8 with one key chunk (M < 128): the fast kernel sums the squares
    of a unit row in 8 lanes, so only there are the operations and their order the same."""
    from refimpl.attention import angular
    if not needs_c():
        return
    q, k, v = la_inputs(c, dtype)
    eps, constant, normaliser = 1e-12, c["constant"], c["normaliser"]
    plain = _c_plain.linear_angular_attention(q, k, v, constant, normaliser, eps)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    definition = backends.definition("linear_angular_attention")
    with np.errstate(all="ignore"):
        ref = angular.linear_angular_attention(q64, k64, v64, constant=constant, normaliser=normaliser, eps=eps,
                                               policy="clamp", arithmetic="scaled")
        bound = angular.linear_angular_attention_bound(q64, k64, v64, constant=constant, normaliser=normaliser,
                                                       eps=eps)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(
            definition, q64, k64, v64, constant, normaliser, eps, dtype=np.float32)
    numerics.assert_close(plain, ref, bound, dtype, naive=naive, name=f"linear_angular[plain C, {constant}, "
                                                                      f"{normaliser}]")
    for t in (1, 3):
        fast = _c_linear.linear_angular_attention(q, k, v, constant, normaliser, eps, threads=t)
        numerics.assert_close(fast, ref, bound, dtype, naive=naive, name=f"linear_angular[fast C, threads={t}]")
        if c["shape"][4] < 8 and one_chunk(c["shape"][3]):
            np.testing.assert_array_equal(fast, plain, err_msg="fast != plain where they perform the same "
                                                               "operations in the same order")


# ---------------------------------------------------------------------------------------------------
# RALA: refimpl_rala_alpha_plain (Eq. 4) with the plain linear attention (Eq. 2-3)
# ---------------------------------------------------------------------------------------------------

@st.composite
def rala_cases(draw):
    """A RoPE-free, linear-order RALA core problem (M = N, e = d) and its configuration."""
    h = draw(st.integers(1, 2))
    cfg = dict(kernel=draw(st.sampled_from(("elu1", "relu"))), reweight=True,
               global_query=draw(st.sampled_from(("q", "kappa_q"))),
               alpha_scale=draw(st.sampled_from(("none", "head_dim"))),
               token_scaling=draw(st.sampled_from(("sum", "mean"))), eps=draw(st.sampled_from((0.0, 1e-6))))
    return dict(b=draw(st.integers(1, 2)), h=h, n=draw(st.one_of(st.integers(1, 60), st.integers(128, 150))),
                d=draw(st.integers(1, 20)), cfg=cfg, seed=draw(st.integers(0, 2**32 - 1)),
                kind=draw(st.sampled_from(("normal", "near_duplicate"))))


def rala_pipeline(mod, q, k, v, cfg, n, d):
    """alpha (Eq. 4) then the reweighted attention (Eq. 2-3) by module ``mod`` (_c_plain or _c_linear)."""
    alpha = mod.rala_alpha(q, k, cfg.global_query, cfg.kernel, d ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0)
    kv_scale = 1.0 / n if cfg.token_scaling == "mean" else 1.0
    return alpha, mod.reweighted_linear_attention(q, k, v, alpha, cfg.kernel, kv_scale, cfg.eps)


@DTYPES
@given(c=rala_cases())
@example(c=dict(b=1, h=2, n=49, d=16, seed=8, kind="normal",
                cfg=dict(kernel="elu1", reweight=True, global_query="kappa_q", alpha_scale="head_dim",
                         token_scaling="mean", eps=1e-6)))
def test_rala_plain_and_fast_against_definition(dtype, c):
    """(a) plain alpha (Eq. 4) and plain reweighted attention (Eq. 2-3) within rala_core_bound of the float64
    rala_core; (b) the fast pipeline within the same bound (alpha is never bit-identical: other summation
    orders and exp); both alphas non-negative and summing to M within the roundings of that sum."""
    if not needs_c():
        return
    cfg = rala.RALAConfig(dim=c["h"] * c["d"], num_heads=c["h"], **c["cfg"])
    shape = (c["b"], c["h"], c["n"], c["d"])
    q, k, v = (np.asarray(generate(c["seed"] + i, c["kind"] if i < 2 else "normal", shape), dtype=dtype)
               for i in range(3))
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = rala.rala_core(q64, k64, v64, cfg)
        bound = rala.rala_core_bound(q64, k64, v64, cfg, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(rala.rala_core, q64, k64, v64, cfg,
                                                                              dtype=np.float32)
    u = numerics.unit_roundoff(dtype)
    for name, mod in (("plain", _c_plain), ("fast", _c_linear)):
        alpha, got = rala_pipeline(mod, q, k, v, cfg, c["n"], c["d"])
        assert alpha.dtype == dtype and got.dtype == dtype
        assert np.all(alpha >= 0)
        # sum_j M (e_j / S): S's n - 1 roundings, the quotient, the product by M, then this float64 sum's n - 1
        total = np.sum(alpha.astype(np.float64), axis=-1)
        assert np.all(np.abs(total - c["n"]) <= c["n"] * numerics.gamma(2 * c["n"] + 1, u)), total
        kernel_verdict(dtype)(got, ref, bound, dtype, naive=naive, name=f"rala_core[{name} C, {c['cfg']}]")


def test_rala_alpha_plain_is_eq4_on_a_hand_case():
    """alpha = M softmax(scale Q_g . kappa(K_j)) on a case small enough to write out (RALA Eq. 4): kappa = ReLU,
    Q_g = mean of Q, exact in binary; alpha is the float64 evaluation of the written-out formula."""
    if not needs_c():
        return
    q = np.array([[[[1.0, -2.0], [3.0, 4.0]]]])             # Q_g = (2, 1)
    k = np.array([[[[1.0, 0.0], [0.0, 1.0], [-1.0, 2.0]]]])  # kappa(K) = (1, 0), (0, 1), (0, 2); logits 2, 1, 2
    e = np.exp(np.array([0.0, -1.0, 0.0]))
    want = 3.0 * (e / (1.0 + np.exp(-1.0) + 1.0))
    got = _c_plain.rala_alpha(q, k, "q", "relu", 1.0)
    # Both sides: exp (config.ELEMENTARY_FUNCTION_ULPS), the 3-term sum (2), the quotient (1), the product by M (1).
    rel = 2 * numerics.gamma(config.ELEMENTARY_FUNCTION_ULPS + 4, numerics.unit_roundoff(np.float64))
    assert np.all(np.abs(got[0, 0] - want) <= rel * np.abs(want)), (got[0, 0], want)
    assert got[0, 0, 0] == got[0, 0, 2]


# ---------------------------------------------------------------------------------------------------
# Window softmax attention: refimpl_window_attention_plain
# ---------------------------------------------------------------------------------------------------

@st.composite
def window_cases(draw):
    """Windows (nW windows per image, b images), heads, n = m tokens per window (or n != m), d, e, bias kind
    (none, shared by the windows, one per item), mask (none, or random with each row's first key kept)."""
    nw = draw(st.integers(1, 3))
    return dict(b=draw(st.integers(1, 2)), nw=nw, h=draw(st.integers(1, 3)), n=draw(st.integers(1, 20)),
                m=draw(st.integers(1, 20)), d=draw(st.integers(1, 12)), e=draw(st.integers(1, 9)),
                bias=draw(st.sampled_from((None, "shared", "per_item"))), mask=draw(st.booleans()),
                scale=draw(st.sampled_from((1.0, 0.25, 0.3))), seed=draw(st.integers(0, 2**32 - 1)),
                kind=draw(st.sampled_from(("normal", "mixed_scale", "near_duplicate"))))


def window_inputs(c, dtype):
    """(q, k, v, bias, mask) of the case in ``dtype``; the mask keeps each row's first key (no empty row)."""
    bw = c["b"] * c["nw"]
    s, h, n, m = c["seed"], c["h"], c["n"], c["m"]
    q = generate(s, c["kind"], (bw, h, n, c["d"]))
    k = generate(s + 1, c["kind"], (bw, h, m, c["d"]))
    v = generate(s + 2, "normal", (bw, h, m, c["e"]))
    rng = np.random.default_rng(s % 2**32)
    bias = None
    if c["bias"] is not None:
        bias = rng.standard_normal((h, n, m) if c["bias"] == "shared" else (bw, h, n, m))
    mask = None
    if c["mask"]:
        mask = rng.random((c["nw"], n, m)) > 0.4
        mask[..., 0] = True
    as_t = (lambda a: None if a is None else np.asarray(a, dtype=dtype))
    return as_t(q), as_t(k), as_t(v), as_t(bias), mask


def window_reference(q, k, v, scale, bias, mask, dtype):
    """(float64 definition, softmax_attention_bound for ``dtype``, NumPy's float32 run or None)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    b64 = None if bias is None else bias.astype(np.float64)
    bb = None if b64 is None else (b64[None] if b64.ndim == 3 else b64)            # as the definition reads them
    mk = None if mask is None else np.tile(mask, (q.shape[0] // mask.shape[0], 1, 1))[:, None]
    definition = softmax._window_softmax_attention_numpy
    with np.errstate(all="ignore"):
        ref = definition(q64, k64, v64, scale, b64, mask)
        bound = softmax.softmax_attention_bound(q64, k64, v64, scale=scale, bias=bb, mask=mk, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(definition, q64, k64, v64, scale,
                                                                              b64, mask, dtype=np.float32)
    return ref, bound, naive


@DTYPES
@given(c=window_cases())
@example(c=dict(b=1, nw=4, h=3, n=49, m=49, d=32, e=32, bias="shared", mask=True, scale=32 ** -0.5, seed=2,
                kind="normal"))
def test_window_attention_plain_and_fast_against_definition(dtype, c):
    """(a) the plain kernel within softmax_attention_bound of the float64 definition (Swin Eq. 4 per window);
    (b) the fast kernel (1 and 3 threads) within the same bound, and bit-identical where every exp argument
    is 0 or -inf (M = 1): its only difference from the plain kernel is its exp."""
    if not needs_c():
        return
    q, k, v, bias, mask = window_inputs(c, dtype)
    scale = c["scale"]
    plain = _c_plain.window_softmax_attention(q, k, v, scale, bias, mask)
    assert plain.dtype == dtype and plain.shape == q.shape[:3] + v.shape[3:]
    ref, bound, naive = window_reference(q, k, v, scale, bias, mask, dtype)
    kernel_verdict(dtype)(plain, ref, bound, dtype, naive=naive, name=f"window_attention[plain C, {c['bias']}]")
    for t in (1, 3):
        fast = _c_softmax.window_softmax_attention(q, k, v, scale, bias, mask, threads=t)
        kernel_verdict(dtype)(fast, ref, bound, dtype, naive=naive, name=f"window_attention[fast C, threads={t}]")
        if c["m"] == 1:
            np.testing.assert_array_equal(fast, plain)


@DTYPES
def test_window_one_key_per_row_is_bit_identical_and_empty_rows_are_nan(dtype):
    """With a mask that leaves one key per row (a different key per window and row, bias per item) every
    probability is exactly 0 or 1, so fast and plain perform identical operations: the same bits, which pins
    the bias, mask and value indexing (item bh uses bias[bh % count] and mask[(bh / h) % nW]).  A fully masked
    row is NaN (0 / 0) in both, exactly where the definition has NaN."""
    if not needs_c():
        return
    c = dict(b=2, nw=3, h=2, n=7, m=9, d=5, e=4, bias="per_item", mask=False, scale=0.5, seed=31, kind="normal")
    q, k, v, bias, _ = window_inputs(c, dtype)
    rng = np.random.default_rng(4)
    mask = np.zeros((3, 7, 9), dtype=bool)
    mask[np.arange(3)[:, None], np.arange(7)[None, :], rng.integers(0, 9, (3, 7))] = True
    plain = _c_plain.window_softmax_attention(q, k, v, 0.5, bias, mask)
    np.testing.assert_array_equal(_c_softmax.window_softmax_attention(q, k, v, 0.5, bias, mask, threads=2), plain)
    keys = np.argmax(mask, axis=-1)                                   # (nW, n): the one key of each row
    want = v[np.arange(6)[:, None, None], np.arange(2)[None, :, None], np.tile(keys, (2, 1))[:, None, :]]
    np.testing.assert_array_equal(plain, want)
    mask[1, 3] = False                                                # window 1, row 3: no key at all
    plain = _c_plain.window_softmax_attention(q, k, v, 0.5, bias, mask)
    with np.errstate(all="ignore"):
        ref = softmax._window_softmax_attention_numpy(q, k, v, 0.5, bias, mask)
    np.testing.assert_array_equal(np.isnan(plain), np.isnan(ref))
    assert np.isnan(plain[1::3, :, 3]).all() and np.isnan(plain).sum() == 2 * 2 * 4


# ---------------------------------------------------------------------------------------------------
# The feature maps alone: refimpl_elu1_feature_map_plain, refimpl_focused_feature_map_plain
# ---------------------------------------------------------------------------------------------------

@st.composite
def fmap_cases(draw):
    """Rows of d features (d below and above 8, the fast map's lane count), p on both sides of the fast map's
    product / pow switch (integers 2..6 by products), every input kind, rows scaled by 10^+-300 (float64) or
    10^+-30 (float32) or not (tests.test_kernels_focused._map_input)."""
    return dict(rows=draw(st.integers(1, 30)), d=draw(st.one_of(st.integers(1, 7), st.sampled_from((8, 33)))),
                p=draw(st.sampled_from((1.0, 2.0, 3.0, 2.5, 7.0, 32.0))), seed=draw(st.integers(0, 2**32 - 1)),
                kind=draw(st.sampled_from(KINDS)), scaled=draw(st.booleans()))


def focused_same_operations(d: int, p: float) -> bool:
    """Whether the fast focused map performs the plain map's operations in its order: d < 8 (no 8-lane norm
    sums) and r^p by pow in both (p = 1, where the fast r^1 is r = pow(r, 1), or p not an integer in 2..6)."""
    return d < 8 and (p == 1.0 or not (p == int(p) and 2 <= p <= 6))


@DTYPES
@given(c=fmap_cases())
@example(c=dict(rows=5, d=7, p=2.5, seed=1, kind="normal", scaled=True))
@example(c=dict(rows=4, d=33, p=3.0, seed=3, kind="mixed_scale", scaled=True))
@example(c=dict(rows=6, d=5, p=7.0, seed=4, kind="subnormal", scaled=False))
def test_feature_maps_plain_and_fast_against_definition(dtype, c):
    """ELU + 1 (Katharopoulos et al. 2020 Eq. 7) and FLatten's phi_p = f_p(ReLU(x)) (Eq. 5-6, max-scaled form of
    Eq. 20-21): (a) the plain maps within their error models of the float64 definitions (elu1: the exp form,
    tests.test_kernels_rala.elu1_bound; focused: focused.focused_function_bound); (b) the fast maps within the
    same bounds, bit-identical to the plain ones where they perform the same operations: x + 1 for x > 0 (the
    definition's bits), the focused map for focused_same_operations(d, p); a row without a positive entry maps
    to 0 exactly."""
    if not needs_c():
        return
    x64 = focused_map_input(c, dtype)
    x = x64.astype(dtype)
    with np.errstate(all="ignore"):
        ref = linear.feature_map(x64, "elu1")
        naive = None if dtype == np.float64 else numerics.naive_same_precision(linear.feature_map, x64, "elu1",
                                                                               dtype=np.float32)
    plain, fast = _c_plain.elu1_feature_map(x), _c_linear.elu1_feature_map(x)
    assert plain.dtype == dtype and plain.shape == x.shape
    for name, got in (("plain", plain), ("fast", fast)):
        numerics.assert_close(got, ref, elu1_bound(x64), dtype, naive=naive, name=f"elu1 map [{name} C]")
    pos = x > 0
    np.testing.assert_array_equal(plain[pos], x[pos] + dtype(1))
    np.testing.assert_array_equal(fast[pos], plain[pos])

    p = c["p"]
    a = numerics.relu(x64)
    with np.errstate(all="ignore"):
        ref = focused.focused_feature_map(x64, p)
        bound = focused.focused_function_bound(a, p, dtype=np.dtype(dtype).name)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(
            focused.focused_feature_map, x64, p, dtype=np.float32)
    plain, fast = _c_plain.focused_feature_map(x, p), _c_linear.focused_feature_map(x, p)
    assert plain.dtype == dtype and plain.shape == x.shape
    for name, got in (("plain", plain), ("fast", fast)):
        numerics.assert_close(got, ref, bound, dtype, naive=naive, name=f"focused map [{name} C, p={p}]")
    assert np.all(plain[~(a > 0).any(axis=-1)] == 0)
    if focused_same_operations(c["d"], p):
        np.testing.assert_array_equal(fast, plain, err_msg="fast != plain where they perform the same operations")


@DTYPES
def test_feature_maps_plain_special_values(dtype):
    """ELU + 1: NaN -> NaN, +inf -> inf, -inf -> 0, +-0 -> 1, exp underflow -> 0, x > 0 -> x + 1: the definition's
    values.  Focused map: a NaN or +Inf feature makes the row NaN, -Inf is a dead feature, a dead row maps to 0,
    rows at the ends of the range (and the smallest normal / a subnormal entry) map without overflow or 0/0,
    NaN exactly where the definition has it; the fast map's bits for d = 4 where it uses pow (p = 2.5, 7, 32)."""
    if not needs_c():
        return
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1e4, 3.0], dtype=dtype)
    with np.errstate(over="ignore"):
        want = linear.feature_map(special.astype(np.float64), "elu1").astype(dtype)
    np.testing.assert_array_equal(_c_plain.elu1_feature_map(special), want)
    big, small = (1e300, 1e-300) if dtype == np.float64 else (1e30, 1e-30)
    fi = np.finfo(dtype)
    x = np.array([[1.0, np.nan, 2.0, 0.5], [1.0, np.inf, 2.0, 0.5], [1.0, -np.inf, 2.0, 0.5],
                  [-1.0, -2.0, -0.0, 0.0], [big, big / 3, big / 7, -big], [small, small / 3, small / 7, -small],
                  [fi.tiny, 0.0, 0.0, 0.0], [fi.smallest_subnormal, 3 * fi.smallest_subnormal, 0.0, -1.0]],
                 dtype=dtype)
    for p in (2.5, 7.0, 32.0):
        plain = _c_plain.focused_feature_map(x, p)
        with np.errstate(all="ignore"):
            ref = focused.focused_feature_map(x.astype(np.float64), p)
        np.testing.assert_array_equal(np.isnan(plain), np.isnan(ref))
        assert np.isnan(plain[:2]).all() and np.isfinite(plain[2:]).all() and (plain[3] == 0).all()
        np.testing.assert_array_equal(_c_linear.focused_feature_map(x, p), plain)


# ---------------------------------------------------------------------------------------------------
# Depthwise conv2d: refimpl_dwconv2d_plain
# ---------------------------------------------------------------------------------------------------

@DTYPES
@given(case=dw_cases(max_c=6, max_h=14, max_w=24))
@example(case=dict(DW_EVEN_ASYMMETRIC))
@example(case=dict(DW_WIDE_ROW))
@example(case=dict(DW_ONE_PIXEL_PADDED))
def test_depthwise_plain_and_fast_against_definition(dtype, case):
    """Odd and even kernels, stride 1-3, asymmetric padding up to the kernel's size, subnormal, large and mixed
    inputs (tests.test_backends.dw_cases): (a) the plain kernel within gamma_(KH KW + 1) u_T S of the float64
    definition (tests.test_backends.dw_bound; MobileNets Eq. 3) and the definition's bits in its own precision
    (the same products and sums in the same order); (b) the fast kernel returns the plain kernel's bits."""
    if not needs_c():
        return
    x, w, b = dw_make(case, dtype)
    stride, pads = case["stride"], case["pads"]
    plain = _c_plain.depthwise_conv2d(x, w, b, stride, pads)
    assert plain.dtype == dtype and plain.flags.c_contiguous
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    b64 = None if b is None else b.astype(np.float64)
    ref = DW_DEFINITION(x64, w64, b64, stride, pads)
    naive = None if dtype == np.float64 else numerics.naive_same_precision(DW_DEFINITION, x64, w64, b64, stride,
                                                                          pads, dtype=np.float32)
    numerics.assert_close(plain, ref, dw_bound(x64, w64, b64, stride, pads), dtype, naive=naive,
                          name="depthwise_conv2d[plain C]")
    np.testing.assert_array_equal(plain, DW_DEFINITION(x, w, b, stride, pads))
    np.testing.assert_array_equal(_c_depthwise.depthwise_conv2d(x, w, b, stride, pads), plain)


@DTYPES
def test_depthwise_plain_subnormal_and_nonfinite(dtype):
    """Subnormal inputs (products and sums below T's normal range, the k eta_T part of the bound) and weights,
    a stride larger than the kernel, padding as wide as the kernel: within dw_bound, the definition's bits in
    T and the fast kernel's bits.  An infinite weight meeting the zero padding gives NaN (w * 0), and a NaN input
    spreads to exactly the outputs whose window holds it, as in the definition."""
    if not needs_c():
        return
    rng = np.random.default_rng(11)
    sub = np.finfo(dtype).smallest_subnormal
    x = np.asarray(rng.integers(-300, 300, (2, 3, 9, 10)) * sub, dtype=dtype)
    w = np.asarray(rng.standard_normal((3, 1, 3, 2)), dtype=dtype)
    b = np.asarray(rng.integers(-5, 5, 3) * sub, dtype=dtype)
    for stride, pads in (((1, 1), (1, 1, 1, 0)), ((4, 3), (3, 3, 2, 2)), ((2, 1), (0, 2, 1, 0))):
        plain = _c_plain.depthwise_conv2d(x, w, b, stride, pads)
        args64 = [a.astype(np.float64) for a in (x, w, b)]
        numerics.assert_close(plain, DW_DEFINITION(*args64, stride, pads), dw_bound(*args64, stride, pads), dtype,
                              name=f"depthwise_conv2d[plain C, subnormal, {stride}, {pads}]")
        np.testing.assert_array_equal(plain, DW_DEFINITION(x, w, b, stride, pads))
        np.testing.assert_array_equal(_c_depthwise.depthwise_conv2d(x, w, b, stride, pads), plain)
    w_bad, x_bad = w.copy(), np.asarray(rng.standard_normal(x.shape), dtype=dtype)
    w_bad[1, 0, 0, 0] = np.inf
    x_bad[0, 2, 4, 5] = np.nan
    for stride, pads in (((1, 1), (1, 1, 1, 1)), ((2, 2), (0, 1, 2, 0))):
        plain = _c_plain.depthwise_conv2d(x_bad, w_bad, None, stride, pads)
        with np.errstate(invalid="ignore"):
            want = DW_DEFINITION(x_bad, w_bad, None, stride, pads)
        np.testing.assert_array_equal(plain, want)
        assert np.isnan(plain[:, 1]).any() and np.isnan(plain[0, 2]).any() and not np.isnan(plain[1, 2]).any()
        np.testing.assert_array_equal(_c_depthwise.depthwise_conv2d(x_bad, w_bad, None, stride, pads), plain)


# ---------------------------------------------------------------------------------------------------
# The range policy: the registered wrappers' (out of band and NaN / Inf answered by the definition)
# ---------------------------------------------------------------------------------------------------

def test_plain_wrappers_answer_out_of_band_inputs_with_the_definition():
    """float64 inputs above 2^B (B = config.RANGE_RESCALE_EXPONENT), tiny ones below 2^-B (linear attention and
    RALA's core, whose definitions scale such groups up), ELU + 1 inputs whose features underflow (-1e4: a zero
    normaliser, NaN; -732: subnormal features, finite but inexact; the definition recomputes those rows from
    log-features, _c_linear.elu1_underflows) get the NumPy definition's bits from each plain wrapper,
    as from the registered one; in band the plain kernel's own result (not the definition's bits for ELU + 1,
    whose exp is libm's against NumPy's)."""
    if not needs_c():
        return
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    big, tiny = 2.0 ** (config.RANGE_RESCALE_EXPONENT + 40), 2.0 ** (-config.RANGE_RESCALE_EXPONENT - 500)
    alpha = rng.random((1, 2, 6)) + 0.5
    bias = rng.standard_normal((2, 6, 6))
    calls = {   # (plain call, registered call, the operation's NumPy definition) on (q, k, v)
        "linear relu": (lambda a, b, c: _c_plain.linear_attention(a, b, c, "relu", 1e-6),
                        lambda a, b, c: _c_linear.linear_attention(a, b, c, "relu", 1e-6),
                        lambda a, b, c: linear._linear_attention_numpy(a, b, c, "relu", 1e-6)),
        "linear elu1": (lambda a, b, c: _c_plain.linear_attention(a, b, c, "elu1"),
                        lambda a, b, c: _c_linear.linear_attention(a, b, c, "elu1"),
                        lambda a, b, c: linear._linear_attention_numpy(a, b, c, "elu1")),
        "reweighted": (lambda a, b, c: _c_plain.reweighted_linear_attention(a, b, c, alpha, "relu", 0.5),
                       lambda a, b, c: _c_linear.reweighted_linear_attention(a, b, c, alpha, "relu", 0.5),
                       lambda a, b, c: backends.definition("reweighted_linear_attention")(a, b, c, alpha, "relu",
                                                                                          0.5)),
        "rala_alpha": (lambda a, b, c: _c_plain.rala_alpha(a, b, "q", "elu1"),
                       lambda a, b, c: _c_linear.rala_alpha(a, b, "q", "elu1"),
                       lambda a, b, c: backends.definition("rala_alpha")(a, b, "q", "elu1")),
        "window": (lambda a, b, c: _c_plain.window_softmax_attention(a, b, c, 0.5, bias),
                   lambda a, b, c: _c_softmax.window_softmax_attention(a, b, c, 0.5, bias),
                   lambda a, b, c: softmax._window_softmax_attention_numpy(a, b, c, 0.5, bias)),
    }
    for name, (plain, fast, spec) in calls.items():
        cases = [("big q", q * big, k, v),
                 ("big k", q, k * big, v) if name == "rala_alpha" else ("big v", q, k, v * big)]
        if name in ("linear relu", "linear elu1", "reweighted"):
            cases += [("tiny q", q * tiny, k, v), ("tiny v", q, k, v * tiny)]
        if name == "linear elu1":       # exp underflows to 0 (a NaN normaliser) or to subnormal features
            cases += [("exp underflows", q - 1e4, k, v), ("subnormal features", q - 732.0, k, v)]
        for label, a, b, c in cases:
            with np.errstate(all="ignore"):
                want = spec(a, b, c)
                got, reg = plain(a, b, c), fast(a, b, c)
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, {label}")
            np.testing.assert_array_equal(reg, want, err_msg=f"{name}, {label} (registered wrapper)")
    with np.errstate(all="ignore"):                      # in band: the plain kernel's own ELU + 1 (libm's exp)
        own = _c_plain.linear_attention(q - 30.0, k, v, "elu1")
    assert np.all(np.isfinite(own))
    numerics.assert_close(own, linear._linear_attention_numpy(q - 30.0, k, v, "elu1"),
                          linear.linear_attention_bound(q - 30.0, k, v, feature_map="elu1", dtype=np.float64),
                          np.float64, name="plain ELU + 1 in band")


def test_below_band_flags_exactly_the_tiny_nonzero_entries():
    """refimpl.backends._c._below_band: an entry 0 < |x| < 2^-B anywhere (also at the end of a long array)
    flags the array; zeros, float32 arrays and entries of magnitude >= 2^-B do not."""
    edge = 2.0 ** -config.RANGE_RESCALE_EXPONENT
    x = np.ones(3 * (1 << 16) + 5)
    x[::7] = 0.0
    assert not _c._below_band(x, None, x.astype(np.float32))
    x[-1] = edge
    assert not _c._below_band(x)
    x[-1] = -edge / 2
    assert _c._below_band(x)
    x[-1] = 2.0 ** -1074
    assert _c._below_band(np.zeros(3), x)


# ---------------------------------------------------------------------------------------------------
# The wrappers: validation, poisoning, raw refusals, not registered
# ---------------------------------------------------------------------------------------------------

def test_plain_kernels_are_not_registered_backends():
    """The plain versions are specifications, not backends: no registered kernel of any operation is one of
    them, so ``auto`` and backends.call never run them."""
    plain = {_c_plain.linear_attention, _c_plain.reweighted_linear_attention, _c_plain.linear_angular_attention,
             _c_plain.rala_alpha, _c_plain.window_softmax_attention, _c_plain.elu1_feature_map,
             _c_plain.focused_feature_map, _c_plain.depthwise_conv2d}
    for op, impls in backends._REGISTRY.items():
        assert not plain & set(impls.values()), op


def test_bad_input_is_refused_naming_the_argument():
    """Wrong dtypes, shapes and options are refused before C is called, naming the argument."""
    if not needs_c():
        return
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))
    cases = [
        (lambda: _c_plain.linear_attention(q.astype(np.float32), k, v), TypeError, "'k'"),
        (lambda: _c_plain.linear_attention(q, k[..., :2], v), ValueError, "'k'"),
        (lambda: _c_plain.linear_attention(q, k, v, "softmax"), ValueError, "'feature_map'"),
        (lambda: _c_plain.linear_attention(q, k, v, eps_policy="max"), ValueError, "'eps_policy'"),
        (lambda: _c_plain.linear_attention(q, k, v, eps="1"), TypeError, "'eps'"),
        (lambda: _c_plain.linear_attention(q, k, v, "focused", p=0.5), ValueError, "'p'"),
        (lambda: _c_plain.linear_attention(q, k, v, v_scale=np.ones(3)), ValueError, "'v_scale'"),
        (lambda: _c_plain.linear_attention(q, k, v, v_scale=np.ones(2), v_scale_mode="add"), ValueError,
         "'v_scale_mode'"),
        (lambda: _c_plain.reweighted_linear_attention(q, k, v, np.ones((1, 2, 4))), ValueError, "'alpha'"),
        (lambda: _c_plain.reweighted_linear_attention(q, k, v, np.ones((1, 2, 5), np.float32)), TypeError, "'alpha'"),
        (lambda: _c_plain.reweighted_linear_attention(q, k, v, np.ones((1, 2, 5)), "focused"), ValueError,
         "'kernel'"),
        (lambda: _c_plain.linear_angular_attention(q, k, v, "mean"), ValueError, "'constant'"),
        (lambda: _c_plain.linear_angular_attention(q, k, v, normaliser="output_l2"), ValueError, "'normaliser'"),
        (lambda: _c_plain.linear_angular_attention(q, k, v, eps=-1.0), ValueError, "'eps'"),
        (lambda: _c_plain.linear_angular_attention(q, k[:, :, :4], v[:, :, :4], "own"), ValueError, "'v'"),
        (lambda: _c_plain.rala_alpha(q, k, "mean"), ValueError, "'global_query'"),
        (lambda: _c_plain.rala_alpha(q, k[0]), ValueError, "'k'"),
        (lambda: _c_plain.rala_alpha(q, k, scale=None), TypeError, "'scale'"),
        (lambda: _c_plain.window_softmax_attention(q, k, v, 0.5, np.ones((3, 5, 5))), ValueError, "'bias'"),
        (lambda: _c_plain.window_softmax_attention(q, k, v, 0.5, None, np.ones((1, 5, 5))), TypeError, "'mask'"),
        (lambda: _c_plain.window_softmax_attention(q, k, v, 0.5, None, np.ones((2, 5, 5), bool)), ValueError,
         "'mask'"),
        (lambda: _c_plain.elu1_feature_map(q.astype(np.float16)), TypeError, "'x'"),
        (lambda: _c_plain.elu1_feature_map(np.ones((2, 0))), ValueError, "'x'"),
        (lambda: _c_plain.focused_feature_map(q, 0.5), ValueError, "'p'"),
        (lambda: _c_plain.focused_feature_map(q, np.inf), ValueError, "'p'"),
        (lambda: _c_plain.focused_feature_map(q, True), TypeError, "'p'"),
        (lambda: _c_plain.focused_feature_map(np.float64(1.0)), ValueError, "'x'"),
        (lambda: _c_plain.focused_feature_map(q.astype(np.int64)), TypeError, "'x'"),
    ]
    x, w, b = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((2, 1, 3, 3)), rng.standard_normal(2)
    pads = (1, 1, 1, 1)
    cases += [
        (lambda: _c_plain.depthwise_conv2d(x.astype(np.float32), w, b, (1, 1), pads), TypeError, "'weight'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b.astype(np.float32), (1, 1), pads), TypeError, "'bias'"),
        (lambda: _c_plain.depthwise_conv2d(x.astype(np.int32), w, b, (1, 1), pads), TypeError, "'x'"),
        (lambda: _c_plain.depthwise_conv2d(x[0], w, b, (1, 1), pads), ValueError, "'x'"),
        (lambda: _c_plain.depthwise_conv2d(x, w[:1], b, (1, 1), pads), ValueError, "'weight'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b[:1], (1, 1), pads), ValueError, "'bias'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b, (0, 1), pads), ValueError, "'stride'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b, (1.5, 1), pads), ValueError, "'stride'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b, (1, 1), (1, -1, 1, 1)), ValueError, "'pads'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b, (1, 1), (1, 1, 1)), ValueError, "'pads'"),
        (lambda: _c_plain.depthwise_conv2d(x[:, :, :1], w, b, (1, 1), (0, 0, 0, 0)), ValueError, "'pads'"),
        (lambda: _c_plain.depthwise_conv2d(x, w, b, (1, 1), pads, (2, 2)), ValueError, "'dilation'"),
    ]
    for call, exc, word in cases:
        with pytest.raises(exc, match=word):
            call()


@pytest.mark.parametrize("symbol", ["refimpl_linear_attention_plain_f64", "refimpl_linear_angular_plain_f64",
                                    "refimpl_rala_alpha_plain_f64", "refimpl_window_attention_plain_f64",
                                    "refimpl_elu1_feature_map_plain_f32", "refimpl_focused_feature_map_plain_f64",
                                    "refimpl_dwconv2d_plain_f32"])
def test_outputs_are_nan_poisoned_before_the_plain_kernel_runs(symbol):
    """A plain kernel that returns without writing leaves an all-NaN output (the wrappers poison it first)."""
    if not needs_c():
        return
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 6, 3)) for _ in range(3))
    call = {"refimpl_linear_attention_plain_f64": lambda: _c_plain.linear_attention(q, k, v),
            "refimpl_linear_angular_plain_f64": lambda: _c_plain.linear_angular_attention(q, k, v),
            "refimpl_rala_alpha_plain_f64": lambda: _c_plain.rala_alpha(q, k),
            "refimpl_window_attention_plain_f64": lambda: _c_plain.window_softmax_attention(q, k, v, 0.5),
            "refimpl_elu1_feature_map_plain_f32": lambda: _c_plain.elu1_feature_map(q.astype(np.float32)),
            "refimpl_focused_feature_map_plain_f64": lambda: _c_plain.focused_feature_map(q, 3.0),
            "refimpl_dwconv2d_plain_f32": lambda: _c_plain.depthwise_conv2d(
                q.astype(np.float32), k[0, :, :3].astype(np.float32), None, (1, 1), (1, 1, 1, 1))}[symbol]
    with c_kernel_that_writes_nothing(symbol) as calls:
        res = call()
    assert calls and np.isnan(res).all()


@dataclasses.dataclass
class _Raw:
    """The compiled module's raw entry points (``ffi``, ``lib``), a 64-double output ``out`` over ``sentinel``
    (filled with 7.0, what a refusal must leave) and a 64-double input of ones (``ones``)."""

    ffi: Any
    lib: Any
    sentinel: np.ndarray
    out: Any
    ones: Any

    def check(self, status: int, want: int, what: Any) -> None:
        """The call returned ``want``; a refusal (want != 0) wrote nothing; the sentinel is restored."""
        assert status == want, (what, status)
        if want:
            assert (self.sentinel == 7.0).all(), what
        self.sentinel[:] = 7.0


def _raw_entry_points() -> _Raw | None:
    """:class:`_Raw` of the compiled module, or None where it is not there (:func:`needs_c`)."""
    if not needs_c():
        return None
    mod = _c._load()
    sentinel = np.full(64, 7.0)
    return _Raw(mod.ffi, mod.lib, sentinel, mod.ffi.from_buffer("double[]", sentinel, require_writable=True),
                mod.ffi.from_buffer("double[]", np.ones(64)))


def test_raw_refusals_write_nothing():
    """The plain entry points' own checks (the second line of defence): NULL buffers, sizes < 1, bad options
    and short workspaces return their status and leave the output untouched."""
    raw = _raw_entry_points()
    if raw is None:
        return
    ffi, lib, o, x = raw.ffi, raw.lib, raw.out, raw.ones
    ws = ffi.from_buffer("double[]", np.zeros(64), require_writable=True)
    opts = ffi.new("struct refimpl_la_options *", dict(feature_map=0, eps_policy=0, clamp=0, v_scale_divide=1,
                                                       power=3.0, clamp_min=0.0, eps=0.0, kv_scale=1.0))
    bad_map = ffi.new("struct refimpl_la_options *", dict(feature_map=7, eps_policy=0, power=3.0, kv_scale=1.0))
    bad_p = ffi.new("struct refimpl_la_options *", dict(feature_map=2, eps_policy=0, power=0.5, kv_scale=1.0))
    la = lib.refimpl_linear_attention_plain_f64
    ra = lib.refimpl_rala_alpha_plain_f64
    wa = lib.refimpl_window_attention_plain_f64
    an = lib.refimpl_linear_angular_plain_f64
    nul = ffi.NULL
    # each call made after the previous one was checked, so that each refusal is seen to write nothing
    for i, (call, want) in enumerate(((lambda: la(o, ws, x, x, x, nul, nul, opts, 1, 2, 2, 2, 2, 64), 0),
                                      (lambda: la(o, ws, nul, x, x, nul, nul, opts, 1, 2, 2, 2, 2, 64), 5),
                                      (lambda: la(o, ws, x, x, x, nul, nul, nul, 1, 2, 2, 2, 2, 64), 5),
                                      (lambda: la(o, ws, x, x, x, nul, nul, opts, 1, 0, 2, 2, 2, 64), 1),
                                      (lambda: la(o, ws, x, x, x, nul, nul, bad_map, 1, 2, 2, 2, 2, 64), 6),
                                      (lambda: la(o, ws, x, x, x, nul, nul, bad_p, 1, 2, 2, 2, 2, 64), 6),
                                      (lambda: la(o, ws, x, x, x, nul, nul, opts, 1, 2, 2, 2, 2, 7), 7),
                                      (lambda: an(o, ws, x, x, x, 1e-12, 1, 0, 1, 2, 3, 2, 2, 64), 1),
                                      (lambda: an(o, ws, x, x, x, 1e-12, 0, 0, 1, 2, 3, 2, 2, 9), 7),
                                      (lambda: ra(o, ws, x, x, 2, 0, 1.0, 1, 2, 2, 2, 64), 6),
                                      (lambda: ra(o, ws, x, x, 0, 0, 1.0, 1, 2, 2, 2, 3), 7),
                                      (lambda: ra(o, ws, x, x, 0, 0, 1.0, 1, 2, 0, 2, 64), 1),
                                      (lambda: wa(o, ws, x, x, x, nul, nul, 1.0, 3, 2, 2, 2, 2, 2, 1, 1, 64), 1),
                                      (lambda: wa(o, ws, x, x, x, x, nul, 1.0, 2, 1, 2, 2, 2, 2, 0, 1, 64), 1),
                                      (lambda: wa(o, ws, x, x, x, nul, nul, 1.0, 2, 1, 2, 2, 2, 2, 1, 1, 1), 7))):
        raw.check(call(), want, i)


def test_raw_refusals_of_the_maps_and_depthwise_match_the_fast_entry_points():
    """The plain feature maps and depthwise conv refuse what their fast entry points refuse, with the same status
    (NULL buffers, sizes < 1, strides < 1, paddings < 0, sizes that overflow ptrdiff_t, a bad power), and write
    nothing then; on valid arguments both return REFIMPL_OK."""
    raw = _raw_entry_points()
    if raw is None:
        return
    lib, o, x = raw.lib, raw.out, raw.ones
    nul, big = raw.ffi.NULL, 2**62
    dw = (1, 1, 1, 1, 1, 1, 3, 3, 2, 2, 2, 2)            # strides, pads, B, C, H, W, KH, KW, OH, OW
    calls = [  # (plain entry point, fast entry point, arguments after out, expected status)
        ("elu1_feature_map", (x, 8), 0), ("elu1_feature_map", (nul, 8), 5), ("elu1_feature_map", (x, 0), 1),
        ("focused_feature_map", (x, 2, 4, 3.0), 0), ("focused_feature_map", (nul, 2, 4, 3.0), 5),
        ("focused_feature_map", (x, 0, 4, 3.0), 1), ("focused_feature_map", (x, 2, 4, 0.5), 6),
        ("focused_feature_map", (x, 2, 4, float("nan")), 6), ("focused_feature_map", (x, big, big, 3.0), 4),
        ("dwconv2d", (x, x, nul) + dw, 0), ("dwconv2d", (x, x, x) + dw, 0), ("dwconv2d", (nul, x, nul) + dw, 5),
        ("dwconv2d", (x, nul, nul) + dw, 5), ("dwconv2d", (x, x, nul, 0) + dw[1:], 2),
        ("dwconv2d", (x, x, nul) + dw[:2] + (-1,) + dw[3:], 3), ("dwconv2d", (x, x, nul) + dw[:4] + (0,) + dw[5:], 1),
        ("dwconv2d", (x, x, nul) + dw[:-1] + (0,), 1), ("dwconv2d", (x, x, nul) + dw[:5] + (big, big) + dw[7:], 4),
    ]
    for name, args, want in calls:
        for fn in (f"refimpl_{name}_plain_f64", f"refimpl_{name}_f64"):
            raw.check(getattr(lib, fn)(o, *args), want, (fn, args))
