"""The fused kernelized linear attention kernels (operation "linear_attention") against their NumPy twin.

The twin is refimpl.attention.linear._linear_attention_numpy (linear_attention in linear order,
normalised, ReLU or ELU + 1 feature map, the L2ViT clamp and the eps policy; L2ViT Eq. 2-4 and
Appendix 8, FLatten Eq. 1-4, Katharopoulos et al. 2020 Eq. 7).  What is checked:

1. Agreement: on every Hypothesis draw, float64 and float32, the C kernel lies within
   linear_attention_bound (k = d + M + 2: inner products of length M and d, the eps add, the quotient;
   any summation order, so BLAS's and the kernel's chunked order alike) of the float64 definition on the
   same dtype-rounded inputs, and (float32) within the ensemble criterion (refimpl.verdict) of NumPy's own float32
   computation.  Shapes: the networks' (N = 196, d = 64; N = 3136-like tokens, d = 32) and adversarial
   ones: one token, odd sizes, M != N, head dim 1 and above 64, e != d, all-negative / large /
   near-duplicate / mixed-scale / subnormal inputs, every normaliser policy.
2. NaN exactly where the definition has NaN: ReLU rows of q that are all negative have a zero
   normaliser and a zero numerator, 0/0 = NaN, in both.
3. NaN poisoning: the output is filled with NaN before the kernel runs (caller's out= too).
4. Determinism: repeated runs, every thread count and every vector level give the same bits (the
   reduction order is fixed by the sizes: ckernels/linattn.c).
5. Bad input: mixed dtypes, wrong ranks/shapes, non-contiguous / read-only / wrong-dtype / aliased out=,
   too small a workspace, an unknown feature map or eps policy, bad threads -> TypeError/ValueError naming
   the argument; refused raw calls return a status and write nothing.
6. Dispatch: linear.linear_attention under backends.use("c") returns the C kernel's bits; under the
   default (NumPy) backend it is the definition.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, numerics
from refimpl.attention import linear
from refimpl.backends import _c, _c_linear, _c_softmax
from tests.kernel_helpers import (STATUS, backend_available, c_kernel_that_writes_nothing, kernel_verdict,
                                  registered_kernel)

DEFINITION = linear._linear_attention_numpy
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])


def c_kernel():
    """The registered C implementation (no fallback); without the compiled module the NumPy twin stands in
    (the dispatch path is then what is tested) unless REFIMPL_REQUIRE_BACKENDS=1
    (tests.kernel_helpers.registered_kernel)."""
    return registered_kernel("linear_attention", "c")


def needs_c():
    """Whether the compiled module is there (tests.kernel_helpers.backend_available)."""
    return backend_available("c", "linear_attention")


# ---------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------

KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale", "subnormal")
POLICIES = ({}, {"eps": 1e-6}, {"eps": 1e-3, "eps_policy": "clamp"}, {"clamp_min": 1e-2},
            {"clamp_min": 1.0, "eps": 1e-6}, {"clamp_min": 1e2, "eps": 0.5, "eps_policy": "clamp"})


@st.composite
def la_cases(draw):
    """A linear-attention problem: sizes, feature map, normaliser policy and value kinds (as seeds)."""
    b = draw(st.integers(1, 2))
    h = draw(st.integers(1, 3))
    n = draw(st.one_of(st.just(1), st.integers(2, 300)))
    m = draw(st.one_of(st.just(n), st.just(1), st.integers(2, 300)))
    d = draw(st.one_of(st.just(1), st.sampled_from((32, 64)), st.integers(2, 80)))
    e = draw(st.one_of(st.just(d), st.just(1), st.integers(2, 80)))
    return dict(shape=(b, h, n, m, d, e), feature_map=draw(st.sampled_from(("relu", "elu1"))),
                policy=draw(st.sampled_from(POLICIES)), seed=draw(st.integers(0, 2**32 - 1)),
                q_kind=draw(st.sampled_from(KINDS)), k_kind=draw(st.sampled_from(KINDS)),
                v_kind=draw(st.sampled_from(("normal", "large", "mixed_scale"))))


def make(case, dtype):
    """(q, k, v) of the case rounded to ``dtype`` and returned in ``dtype``."""
    b, h, n, m, d, e = case["shape"]
    s = case["seed"]
    q = generate(s, case["q_kind"], (b, h, n, d))
    k = generate(s + 1, case["k_kind"], (b, h, m, d))
    v = generate(s + 2, case["v_kind"], (b, h, m, e))
    return tuple(np.asarray(a, dtype=dtype) for a in (q, k, v))


def case(shape, fm="relu", policy=None, seed=3, q="normal", k="normal", v="normal"):
    return dict(shape=shape, feature_map=fm, policy=policy or {}, seed=seed, q_kind=q, k_kind=k, v_kind=v)


NETWORK_196 = case((1, 3, 196, 196, 64, 64))                       # DeiT-like 14 x 14 tokens, d = 64
NETWORK_STAGE1 = case((1, 3, 784, 784, 32, 32), fm="elu1")         # 28 x 28 tokens, d = 32 (3 heads)
ONE_TOKEN = case((1, 1, 1, 1, 1, 1))
HEAD_DIM_1 = case((2, 2, 37, 41, 1, 1), fm="elu1", policy={"clamp_min": 1e-2})
WIDE_HEAD = case((1, 1, 67, 129, 96, 81), policy={"eps": 1e-6})   # d, e > 64, odd, M != N
ALL_NEGATIVE_Q = case((1, 2, 50, 60, 8, 8), q="all_negative")       # ReLU: every normaliser 0 -> NaN
CLAMPED = case((1, 2, 40, 40, 16, 16), k="all_negative", fm="elu1", policy={"clamp_min": 1e2})
LARGE = case((1, 2, 33, 65, 17, 19), q="large", k="large", v="large", fm="elu1")


# ---------------------------------------------------------------------------------------------------
# 1. Agreement through the error model
# ---------------------------------------------------------------------------------------------------

@DTYPES
@given(case=la_cases())
@example(case=NETWORK_196)
@example(case=NETWORK_STAGE1)
@example(case=ONE_TOKEN)
@example(case=HEAD_DIM_1)
@example(case=WIDE_HEAD)
@example(case=ALL_NEGATIVE_Q)
@example(case=CLAMPED)
@example(case=LARGE)
def test_c_kernel_agrees_with_definition_through_error_model(dtype, case):
    """|C - definition| <= linear_attention_bound(dtype) element-wise (L2ViT Eq. 4 with Appendix 8's
    clamp; k = d + M + 2), NaN/Inf patterns equal, and (float32) the C kernel's error is at most
    the ensemble criterion's factors times that of the NumPy definition evaluated in float32 (refimpl.verdict)."""
    q, k, v = make(case, dtype)
    fm, pol = case["feature_map"], case["policy"]
    got = c_kernel()(q, k, v, fm, **pol)
    assert got.dtype == dtype and got.shape == q.shape[:3] + v.shape[3:] and got.flags.c_contiguous
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = DEFINITION(q64, k64, v64, fm, **pol)
        bound = linear.linear_attention_bound(q64, k64, v64, feature_map=fm, dtype=dtype, **pol)
        naive = None
        if dtype == np.float32:
            naive = numerics.naive_same_precision(DEFINITION, q64, k64, v64, fm, dtype=np.float32, **pol)
    numerics.assert_close(got, ref, bound, dtype, naive=naive, name=f"linear_attention[c, {fm}, {pol}]")


@DTYPES
@pytest.mark.parametrize("fm", ["relu", "elu1", "focused"])
def test_nan_exactly_where_the_definition_has_nan(dtype, fm):
    """Rows of q that are all negative (ReLU and focused: phi(q) = 0, normaliser 0, numerator 0, 0/0 = NaN),
    and NaN inputs (NaN propagates through every feature map; the focused map makes the whole row NaN), give NaN in exactly the definition's slots - in
    the same precision and against the float64 reference."""
    q, k, v = make(case((2, 2, 30, 45, 12, 7), seed=11), dtype)
    q[0, 1, ::3] = -np.abs(q[0, 1, ::3]) - 1                      # all-negative rows
    q[1, 0, 5, 3] = np.nan                                         # one NaN query feature: row 5 NaN
    k[1, 1, 7, 0] = np.nan                                         # one NaN key: the whole head NaN
    got = c_kernel()(q, k, v, fm)
    with np.errstate(all="ignore"):
        same = DEFINITION(q, k, v, fm)
        ref = DEFINITION(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), fm)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(same))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[1, 1]).all() and np.isnan(got[1, 0, 5]).all()
    assert np.isnan(got[0, 1, ::3]).all() == (fm in ("relu", "focused"))   # f_p(ReLU(x)) = 0 there too
    assert np.isfinite(got[0, 0]).all()


# ---------------------------------------------------------------------------------------------------
# 2. NaN poisoning, out= and workspace= reuse
# ---------------------------------------------------------------------------------------------------

@DTYPES
def test_out_and_workspace_are_used_in_place_and_reused(dtype):
    """out= is written in place and returned; the same out= and workspace= serve repeated calls on
    different inputs, each result equal to a fresh call's (nothing of the previous call leaks through)."""
    if not needs_c():
        return
    qa, ka, va = make(case((1, 3, 200, 150, 32, 32), seed=1), dtype)
    qb, kb, vb = make(case((1, 3, 200, 150, 32, 32), seed=2, q="mixed_scale"), dtype)
    out = backends.empty_aligned((1, 3, 200, 32), dtype)
    ws = _c_linear.linear_attention_workspace(1, 3, 150, 32, 32, dtype, threads=2)
    assert backends.is_aligned(out) and backends.is_aligned(ws)
    for q, k, v in ((qa, ka, va), (qb, kb, vb), (qa, ka, va)):
        res = _c_linear.linear_attention(q, k, v, "elu1", out=out, workspace=ws, threads=2)
        assert res is out
        np.testing.assert_array_equal(out, _c_linear.linear_attention(q, k, v, "elu1"))


def test_output_is_nan_poisoned_before_the_kernel_runs():
    """The wrapper fills the output (also a caller's out=) with NaN before the kernel runs: a kernel that
    returns without writing leaves all NaN; a refused raw call writes nothing (status != 0)."""
    if not needs_c():
        return
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    q, k, v = make(case((1, 2, 10, 10, 4, 3)), np.float64)
    out = np.zeros((1, 2, 10, 3))
    with c_kernel_that_writes_nothing("refimpl_linear_attention_f64") as calls:
        res = _c_linear.linear_attention(q, k, v, out=out)
    assert calls and res is out and np.isnan(out).all()
    # Raw refusals: status codes, nothing written.
    sentinel = np.full(8, 7.0)
    o = ffi.from_buffer("double[]", sentinel, require_writable=True)
    wsb = np.zeros(4096)
    w = ffi.from_buffer("double[]", wsb, require_writable=True)
    one = ffi.from_buffer("double[]", np.ones(64))
    f = lib.refimpl_linear_attention_f64

    def opts(**kw):
        base = dict(feature_map=0, eps_policy=0, clamp=0, v_scale_divide=1, power=3.0, clamp_min=0.0, eps=0.0,
                    kv_scale=1.0)
        return ffi.new("struct refimpl_la_options *", {**base, **kw})

    ok = opts()
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, ok, 1, 0, 1, 1, 1, 4096, 1) == 1                 # N = 0
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, opts(feature_map=3), 1, 1, 1, 1, 1, 4096, 1) == 6   # unknown map
    for bad_p in (0.5, float("nan"), float("inf")):                                                  # focused: p
        assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, opts(feature_map=2, power=bad_p), 1, 1, 1, 1, 1, 4096, 1) == 6
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, opts(eps_policy=2), 1, 1, 1, 1, 1, 4096, 1) == 6  # unknown eps policy
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, ok, 2**40, 2**40, 1, 1, 1, 4096, 1) == 4        # overflow
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, ok, 1, 2, 2, 2, 2, 3, 1) == 7                   # workspace too small
    assert f(ffi.NULL, w, one, one, one, ffi.NULL, ffi.NULL, ok, 1, 1, 1, 1, 1, 4096, 1) == 5
    assert f(o, w, one, one, one, ffi.NULL, ffi.NULL, ffi.NULL, 1, 1, 1, 1, 1, 4096, 1) == 5          # no options
    np.testing.assert_array_equal(sentinel, 7.0)
    assert "workspace" in ffi.string(lib.refimpl_status_string(7)).decode()


# ---------------------------------------------------------------------------------------------------
# 3. Determinism
# ---------------------------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("fm", ["relu", "elu1", "focused"])
def test_bitwise_identical_across_runs_and_thread_counts(dtype, fm):
    """The reduction order depends on the sizes only (ckernels/linattn.c: key chunks reduced in chunk
    order), so 1, 2, 3, 5 and 16 threads, and repeated runs with inputs at different addresses, give the
    same bits.  M = 1000 has 15 key chunks, N = 1300 six query blocks; B h (N + M) d e = 14.7M multiply-adds,
    above the kernel's single-thread threshold LA_PARALLEL_MIN = 2^23 (ckernels/linattn.c), so the threads
    really run."""
    if not needs_c():
        return
    q, k, v = make(case((2, 2, 1300, 1000, 40, 40), seed=5, q="mixed_scale"), dtype)
    assert 2 * 2 * (1300 + 1000) * 40 * 40 > 2 ** 23
    first = _c_linear.linear_attention(q, k, v, fm, threads=1)
    for t in (2, 3, 5, 16, 2, 1):
        np.testing.assert_array_equal(_c_linear.linear_attention(np.array(q), k.copy(), np.array(v), fm, threads=t),
                                      first)


@DTYPES
@given(case=la_cases())
@example(case=WIDE_HEAD)
@example(case=NETWORK_196)
def test_same_bits_at_every_vector_level_and_thread_count(dtype, case):
    """The AVX-512, AVX2 and baseline work items differ only in vector width and tile shape; every output
    element sees the same operations in the same order, so every level (and thread count) returns the
    same bits."""
    if not needs_c():
        return
    lib = _c._load().lib
    q, k, v = make(case, dtype)
    fm, pol = case["feature_map"], case["policy"]
    results = []
    try:
        for level in range(lib.refimpl_isa_supported() + 1):
            assert lib.refimpl_set_max_isa(level) == level
            for t in (1, 2):
                with np.errstate(all="ignore"):
                    results.append(_c_linear.linear_attention(q, k, v, fm, threads=t, **pol))
    finally:
        lib.refimpl_set_max_isa(2)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


# ---------------------------------------------------------------------------------------------------
# 4. Bad input
# ---------------------------------------------------------------------------------------------------

def _good(dtype=np.float64):
    return make(case((2, 3, 9, 11, 4, 5)), dtype)


def _bad_cases():
    q, k, v = _good()
    ro = np.zeros((2, 3, 9, 5))
    ro.flags.writeable = False
    return [
        ("k-dtype", TypeError, ["'k'", "float32"], dict(k=k.astype(np.float32))),
        ("v-dtype", TypeError, ["'v'", "float32"], dict(v=v.astype(np.float32))),
        ("q-int", TypeError, ["'q'", "int64"], dict(q=q.astype(np.int64))),
        ("q-float16", TypeError, ["'q'", "float16"], dict(q=q.astype(np.float16))),
        ("q-rank", ValueError, ["'q'", "(B, h, N, d)"], dict(q=q[0])),
        ("k-head-dim", ValueError, ["'k'", "(2, 3, M, 4)"], dict(k=k[..., :3])),
        ("k-heads", ValueError, ["'k'"], dict(k=k[:, :2])),
        ("v-tokens", ValueError, ["'v'", "(2, 3, 11, e)"], dict(v=v[:, :, :10])),
        ("q-empty", ValueError, ["'q'", "non-empty"], dict(q=q[:, :, :0])),
        ("out-shape", ValueError, ["'out'", "(2, 3, 9, 5)"], dict(out=np.zeros((2, 3, 9, 4)))),
        ("out-dtype", TypeError, ["'out'", "float32"], dict(out=np.zeros((2, 3, 9, 5), np.float32))),
        ("out-non-contiguous", ValueError, ["'out'", "C-contiguous"],
         dict(out=np.zeros((2, 3, 9, 10))[..., ::2])),
        ("out-read-only", ValueError, ["'out'", "writeable"], dict(out=ro)),
        ("out-aliases-q", ValueError, ["'out'", "shares memory", "'q'"], {}),
        ("workspace-small", ValueError, ["'workspace'", "at least"], dict(workspace=np.zeros(3))),
        ("workspace-dtype", TypeError, ["'workspace'", "float32"], dict(workspace=np.zeros(10**5, np.float32))),
        ("workspace-strided", ValueError, ["'workspace'", "C-contiguous"],
         dict(workspace=np.zeros(2 * 10**5)[::2])),
        ("feature-map", ValueError, ["'feature_map'", "softmax"], dict(feature_map="softmax")),
        ("eps-policy", ValueError, ["'eps_policy'", "'max'"], dict(eps_policy="max")),
        ("eps-type", TypeError, ["'eps'"], dict(eps="0")),
        ("clamp-type", TypeError, ["'clamp_min'"], dict(clamp_min=[1.0])),
        ("threads-zero", ValueError, ["'threads'"], dict(threads=0)),
        ("threads-float", ValueError, ["'threads'"], dict(threads=2.0)),
    ]


@pytest.mark.parametrize("case_id,exc,words,mutate", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_is_refused_naming_the_argument(case_id, exc, words, mutate):
    """TypeError (dtype) / ValueError (shape, layout, option) naming the argument and what was expected."""
    if not needs_c():
        return
    q, k, v = _good()
    args = dict(q=q, k=k, v=v)
    args.update({n: mutate[n] for n in ("q", "k", "v") if n in mutate})
    kwargs = {n: val for n, val in mutate.items() if n not in ("q", "k", "v")}
    if case_id == "out-aliases-q":
        base = np.zeros((2, 3, 9, 5))
        args["q"], kwargs["out"] = base[..., :4], base       # q is a view into out
    with pytest.raises(exc) as info:
        _c_linear.linear_attention(args["q"], args["k"], args["v"], **kwargs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_non_contiguous_inputs_are_copied():
    """Transposed / negative-stride inputs are copied to C order, giving the contiguous call's bits."""
    if not needs_c():
        return
    q, k, v = _good()
    qt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    kr = np.ascontiguousarray(k[:, :, ::-1])[:, :, ::-1]
    assert not qt.flags.c_contiguous and not kr.flags.c_contiguous
    np.testing.assert_array_equal(_c_linear.linear_attention(qt, kr, v), _c_linear.linear_attention(q, k, v))


# ---------------------------------------------------------------------------------------------------
# 5. Dispatch
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fm", ["relu", "elu1"])
def test_linear_attention_dispatches_to_the_selected_backend(fm):
    """linear.linear_attention (linear order, normalised, no taps, ReLU / ELU + 1) runs the selected
    backend's kernel: under use("c") the C kernel's bits; under the default NumPy backend the definition
    (kernelized_attention on the feature maps); unsupported configurations (taps, other maps) always run
    on NumPy."""
    q, k, v = make(case((1, 2, 40, 30, 8, 6), seed=9), np.float64)
    kw = dict(clamp_min=1e-2, eps=1e-6)
    assert backends.current() == "numpy"
    ref = linear.linear_attention(q, k, v, feature_map=fm, **kw)
    np.testing.assert_array_equal(ref, DEFINITION(q, k, v, fm, **kw))
    with backends.use("c"):
        got = linear.linear_attention(q, k, v, feature_map=fm, **kw)
        taps: dict = {}
        tapped = linear.linear_attention(q, k, v, feature_map=fm, taps=taps, **kw)
    np.testing.assert_array_equal(got, c_kernel()(q, k, v, fm, **kw))
    np.testing.assert_array_equal(tapped, ref)
    assert "kv" in taps
    numerics.assert_close(got, ref, linear.linear_attention_bound(q, k, v, feature_map=fm, dtype=np.float64,
                                                                   **kw), np.float64, name="dispatched")


# ---------------------------------------------------------------------------------------------------
# 5b. The V scale (L2ViT's gain applied in the kernel)
# ---------------------------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("mode", ["divide", "multiply"])
@pytest.mark.parametrize("per_head", [False, True])
def test_v_scale_is_the_prescaled_v_bit_for_bit(dtype, mode, per_head):
    """linear_attention(q, k, v, v_scale=s, v_scale_mode=mode) returns the bits of linear_attention(q, k,
    v_eff) with v_eff = v / s (divide) or v * s (multiply) computed in NumPy in the same dtype: the kernel
    replaces each V element by one rounded division (product) with the same operands as it stages the V
    rows (L2ViT §4.2: t V, with the clamp of App. 8), for a scalar and a per-head s, at 1, 2 and 3 threads
    (the shape is above the single-thread threshold) and at every vector level.  Bad v_scale arguments are
    refused naming the argument."""
    if not needs_c():
        return
    q, k, v = make(case((2, 3, 800, 701, 24, 40), seed=21, q="mixed_scale", v="large"), dtype)
    assert 2 * 3 * (800 + 701) * 24 * 40 > 2 ** 23
    rng = np.random.default_rng(5)
    s = np.asarray(rng.uniform(0.3, 3.0, size=(1, 3, 1, 1) if per_head else (1,)) *
                   rng.choice([-1.0, 1.0], size=(1, 3, 1, 1) if per_head else (1,)), dtype=dtype)
    v_eff = v / s.reshape(1, -1, 1, 1) if mode == "divide" else v * s.reshape(1, -1, 1, 1)
    assert v_eff.dtype == dtype
    want = _c_linear.linear_attention(q, k, v_eff, "relu", 0.0, "add", 1e2)
    lib = _c._load().lib
    for t in (1, 2, 3):
        np.testing.assert_array_equal(_c_linear.linear_attention(q, k, v, "relu", 0.0, "add", 1e2, v_scale=s,
                                                          v_scale_mode=mode, threads=t), want)
    try:
        for level in range(lib.refimpl_isa_supported() + 1):
            assert lib.refimpl_set_max_isa(level) == level
            np.testing.assert_array_equal(_c_linear.linear_attention(q, k, v, "relu", 0.0, "add", 1e2, v_scale=s,
                                                              v_scale_mode=mode), want)
    finally:
        lib.refimpl_set_max_isa(2)
    with pytest.raises(TypeError, match="'v_scale'"):
        _c_linear.linear_attention(q, k, v, v_scale=s.astype(np.float16))
    with pytest.raises(ValueError, match="'v_scale'.*one per head \\(3\\)"):
        _c_linear.linear_attention(q, k, v, v_scale=np.ones(2, dtype))
    with pytest.raises(ValueError, match="'v_scale_mode'"):
        _c_linear.linear_attention(q, k, v, v_scale=s, v_scale_mode="add")


# ---------------------------------------------------------------------------------------------------
# 6. RALA's reweighted forward (operation "reweighted_linear_attention")
# ---------------------------------------------------------------------------------------------------

@st.composite
def rala_cases(draw):
    """A RALA core problem (M = N, e = d as in rala_core) and a RoPE-free linear-order configuration."""
    h = draw(st.integers(1, 3))
    d = draw(st.one_of(st.just(1), st.sampled_from((16, 32)), st.integers(2, 72)))
    cfg = dict(kernel=draw(st.sampled_from(("elu1", "relu"))), reweight=draw(st.booleans()),
               global_query=draw(st.sampled_from(("q", "kappa_q"))),
               alpha_scale=draw(st.sampled_from(("none", "head_dim"))),
               token_scaling=draw(st.sampled_from(("sum", "mean"))), eps=draw(st.sampled_from((0.0, 1e-6))))
    n = draw(st.one_of(st.just(1), st.integers(2, 250)))
    return dict(b=draw(st.integers(1, 2)), h=h, n=n, d=d, cfg=cfg, seed=draw(st.integers(0, 2**32 - 1)),
                kind=draw(st.sampled_from(("normal", "mixed_scale", "near_duplicate", "large"))))


RALA_NETWORK = dict(b=1, h=2, n=196, d=32, cfg=dict(), seed=4, kind="normal")   # RAVLT stage-3 tokens
RALA_OFFICIAL_NO_ROPE = dict(b=2, h=3, n=49, d=16, seed=8, kind="normal",
                             cfg=dict(global_query="kappa_q", alpha_scale="head_dim", token_scaling="mean",
                                      eps=1e-6))


def _rala_inputs(c, dtype):
    from refimpl.attention import rala
    cfg = rala.RALAConfig(dim=c["h"] * c["d"], num_heads=c["h"], **c["cfg"])
    shape = (c["b"], c["h"], c["n"], c["d"])
    q, k, v = (np.asarray(generate(c["seed"] + i, c["kind"] if i < 2 else "normal", shape), dtype=dtype)
               for i in range(3))
    return rala, cfg, q, k, v


@DTYPES
@given(c=rala_cases())
@example(c=RALA_NETWORK)
@example(c=RALA_OFFICIAL_NO_ROPE)
def test_rala_core_on_c_agrees_with_definition_through_error_model(dtype, c):
    """rala.rala_core under backends.use("c") (the RoPE-free linear order dispatches to the fused kernel
    with key weights alpha_j, RALA Eq. 2-4) lies within rala_core_bound(dtype) of the float64 definition,
    and (float32) within the ensemble criterion (refimpl.verdict) of NumPy's float32 computation; it is the C kernel's result
    bit for bit, given the alpha of Eq. 4 from the C kernel of operation "rala_alpha" (its own summation
    order and exp, so alpha may differ from the NumPy path's in the last bits)."""
    rala, cfg, q, k, v = _rala_inputs(c, dtype)
    with backends.use("c"), numerics.precision(dtype), np.errstate(all="ignore"):
        got = rala.rala_core(q, k, v, cfg)                    # computed in dtype (alpha too)
    assert got.dtype == dtype
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = rala.rala_core(q64, k64, v64, cfg)
        bound = rala.rala_core_bound(q64, k64, v64, cfg, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(rala.rala_core, q64, k64, v64, cfg,
                                                                              dtype=np.float32)
    kernel_verdict(dtype)(got, ref, bound, dtype, naive=naive, name=f"rala_core[c, {c['cfg']}]")
    if needs_c():
        with numerics.precision(dtype), np.errstate(all="ignore"):
            if cfg.reweight:                                  # Eq. 4 by the C kernel
                alpha = _c_linear.rala_alpha(q, k, cfg.global_query, cfg.kernel,
                                      c["d"] ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0)
            else:
                alpha = np.ones(q.shape[:-1], dtype=dtype)
            direct = _c_linear.reweighted_linear_attention(q, k, v, alpha, cfg.kernel,
                                                    1.0 / c["n"] if cfg.token_scaling == "mean" else 1.0, cfg.eps)
        np.testing.assert_array_equal(got, direct)


@DTYPES
def test_rala_kernel_bitwise_across_thread_counts_and_against_its_twin(dtype):
    """The reweighted kernel is bitwise reproducible across thread counts; against its NumPy twin
    (rala_core._reweighted_linear_attention_numpy, same alpha) it agrees within rala_core_bound's model (checked
    through rala_core above); here: same NaN pattern and finite everywhere on benign inputs."""
    if not needs_c():
        return
    from refimpl.attention import rala_core
    q, k, v = make(case((1, 3, 1500, 1500, 32, 32), seed=12), dtype)   # 9.4M multiply-adds > 2^23: threaded
    alpha = np.asarray(np.random.default_rng(0).random((1, 3, 1500)) * 2, dtype=dtype)
    first = _c_linear.reweighted_linear_attention(q, k, v, alpha, "elu1", 1 / 1500, 1e-6, threads=1)
    for t in (2, 3, 7):
        np.testing.assert_array_equal(_c_linear.reweighted_linear_attention(q, k, v, alpha, "elu1", 1 / 1500, 1e-6,
                                                                     threads=t), first)
    twin = rala_core._reweighted_linear_attention_numpy(q, k, v, alpha, "elu1", 1 / 1500, 1e-6)
    assert np.isfinite(first).all() and np.isfinite(twin).all()
    with pytest.raises(ValueError, match="'alpha'.*\\(1, 3, 1500\\)"):
        _c_linear.reweighted_linear_attention(q, k, v, alpha[..., :-1])
    with pytest.raises(TypeError, match="'alpha'"):
        _c_linear.reweighted_linear_attention(q, k, v, alpha.astype(np.float16))


# ---------------------------------------------------------------------------------------------------
# 7. Castling-ViT's linear-angular forward (operation "linear_angular_attention")
# ---------------------------------------------------------------------------------------------------

def linear_angular_bound(q, k, v, constant, normaliser, eps) -> numerics.Bound:
    """The first-order running error bound of Castling-ViT Eq. 9 in paper mode:
    refimpl.attention.angular.linear_angular_attention_bound (its derivation is in that docstring; it was
    first derived here for this kernel's agreement test)."""
    from refimpl.attention import angular
    return angular.linear_angular_attention_bound(q, k, v, constant=constant, normaliser=normaliser, eps=eps)


@st.composite
def angular_cases(draw):
    c = draw(la_cases())
    b, h, n, m, d, e = c["shape"]
    constant = draw(st.sampled_from(("sum", "own")))
    if constant == "own":
        m = n
    c.update(shape=(b, h, n, m, d, e), constant=constant,
             normaliser=draw(st.sampled_from(("none", "similarity_sum"))))
    return c


@DTYPES
@given(c=angular_cases())
@example(c=dict(NETWORK_196, constant="sum", normaliser="none"))
@example(c=dict(ONE_TOKEN, constant="own", normaliser="similarity_sum"))
@example(c=dict(WIDE_HEAD, constant="sum", normaliser="similarity_sum"))
def test_linear_angular_kernel_agrees_with_angular_py(dtype, c):
    """The C linear-angular kernel against its specification angular.linear_angular_attention (Castling-ViT
    Eq. 9; paper-mode unit rows) in float64 on the dtype-rounded inputs, within linear_angular_bound, with
    (float32) the naive same-precision check; the operation's NumPy definition (backends.definition) is that
    function."""
    from refimpl.attention import angular
    q, k, v = make(c, dtype)
    eps = 1e-12
    got = (backends._REGISTRY["linear_angular_attention"]["c"] if needs_c() else backends.definition("linear_angular_attention"))(
        q, k, v, c["constant"], c["normaliser"], eps)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = angular.linear_angular_attention(q64, k64, v64, constant=c["constant"], normaliser=c["normaliser"],
                                               eps=eps, policy="clamp", arithmetic="scaled")
        np.testing.assert_array_equal(ref, backends.definition("linear_angular_attention")(q64, k64, v64, c["constant"],
                                                                         c["normaliser"], eps))
        naive = None if dtype == np.float64 else numerics.naive_same_precision(
            backends.definition("linear_angular_attention"), q64, k64, v64, c["constant"], c["normaliser"], eps, dtype=np.float32)
    numerics.assert_close(got, ref, linear_angular_bound(q64, k64, v64, c["constant"], c["normaliser"], eps),
                          dtype, naive=naive, name=f"linear_angular[c, {c['constant']}, {c['normaliser']}]")
    if needs_c():
        for t in (1, 3):
            np.testing.assert_array_equal(_c_linear.linear_angular_attention(q, k, v, c["constant"], c["normaliser"],
                                                                      eps, threads=t), got)


def test_linear_angular_bad_input():
    """Options the kernel does not implement, and 'own' with M != N, are refused naming the argument."""
    if not needs_c():
        return
    q, k, v = _good()
    for kw, exc, word in ((dict(constant="mean"), ValueError, "'constant'"),
                          (dict(normaliser="output_l2"), ValueError, "'normaliser'"),
                          (dict(eps=-1.0), ValueError, "'eps'"),
                          (dict(constant="own"), ValueError, "'v'")):
        with pytest.raises(exc, match=word):
            _c_linear.linear_angular_attention(q, k, v, **kw)


# ---------------------------------------------------------------------------------------------------
# 8. Windowed softmax attention (operation "window_softmax_attention")
# ---------------------------------------------------------------------------------------------------

@st.composite
def window_cases(draw):
    """A Swin window-attention problem: grid (padding when not a window multiple), window, shift, heads,
    head dim, and the options (relative-position bias, padding mask, -inf or additive mask)."""
    ws = draw(st.integers(1, 7))
    return dict(b=draw(st.integers(1, 2)), hw=(draw(st.integers(1, 16)), draw(st.integers(1, 16))), ws=ws,
                shift=draw(st.integers(0, ws - 1)), heads=draw(st.integers(1, 3)),
                d=draw(st.one_of(st.just(1), st.integers(2, 40))), qkv_bias=draw(st.booleans()),
                opts=dict(rel_pos_bias=draw(st.booleans()), mask_padding=draw(st.booleans()),
                          mask_value=draw(st.sampled_from((None, -100.0)))),
                seed=draw(st.integers(0, 2**32 - 1)), kind=draw(st.sampled_from(("normal", "mixed_scale", "large"))))


SWIN_STAGE1 = dict(b=1, hw=(14, 14), ws=7, shift=3, heads=3, d=32, qkv_bias=True, seed=2, kind="normal",
                   opts=dict(rel_pos_bias=True, mask_padding=True, mask_value=None))   # 56x56 stage, cropped
SWIN_PADDED = dict(SWIN_STAGE1, hw=(9, 13), shift=2, opts=dict(rel_pos_bias=True, mask_padding=True,
                                                               mask_value=-100.0))


def _window_inputs(c, dtype):
    from refimpl.attention import softmax
    ch = c["heads"] * c["d"]
    rng = np.random.default_rng(c["seed"])
    p = {"qkv.weight": rng.standard_normal((3 * ch, ch)) / np.sqrt(ch),
         "proj.weight": rng.standard_normal((ch, ch)) / np.sqrt(ch),
         "relative_position_bias_table": rng.standard_normal(((2 * c["ws"] - 1) ** 2, c["heads"]))}
    if c["qkv_bias"]:
        p["qkv.bias"], p["proj.bias"] = rng.standard_normal(3 * ch), rng.standard_normal(ch)
    x = generate(c["seed"] + 1, c["kind"], (c["b"], *c["hw"], ch))
    p = {key: numerics.round_to(val, dtype) for key, val in p.items()}
    return softmax, numerics.round_to(x, dtype), p


@DTYPES
@given(c=window_cases())
@example(c=SWIN_STAGE1)
@example(c=SWIN_PADDED)
def test_window_attention_on_c_agrees_with_definition_through_error_model(dtype, c):
    """softmax.window_attention under backends.use("c") (the per-window core of Swin Eq. 4 with the
    relative-position bias and the shift/padding masks runs in the C kernel) lies within
    window_attention_bound(dtype) of the float64 definition on the same dtype-rounded inputs and weights,
    with (float32) the naive same-precision check (that the core really runs in C is checked in
    test_window_attention_dispatches_to_the_c_kernel)."""
    softmax, x64, p64 = _window_inputs(c, dtype)
    kw = dict(num_heads=c["heads"], window_size=c["ws"], shift=c["shift"], **c["opts"])
    with backends.use("c"), numerics.precision(dtype), np.errstate(all="ignore"):
        got = softmax.window_attention(x64.astype(dtype), {k_: v_.astype(dtype) for k_, v_ in p64.items()}, **kw)
    assert got.dtype == dtype
    with np.errstate(all="ignore"):
        ref = softmax.window_attention(x64, p64, **kw)
        bound = softmax.window_attention_bound(x64, p64, dtype=dtype, **kw)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(softmax.window_attention, x64, p64,
                                                                              dtype=np.float32, **kw)
    kernel_verdict(dtype)(got, ref, bound, dtype, naive=naive, name=f"window_attention[c, {c['opts']}]")


@DTYPES
def test_window_kernel_threads_nan_and_bad_input(dtype):
    """The window kernel against its twin: the same bits at 1, 2 and 5 threads; NaN exactly in the fully
    masked rows (0/0, as softmax_attention); bad bias / mask shapes and dtypes refused naming the argument."""
    from refimpl.attention import softmax
    if not needs_c():
        return
    rng = np.random.default_rng(3)
    bw, h, n, d = 64, 3, 49, 32
    q, k, v = (np.asarray(rng.standard_normal((bw, h, n, d)), dtype=dtype) for _ in range(3))
    bias = np.asarray(rng.standard_normal((h, n, n)), dtype=dtype)
    mask = rng.random((16, n, n)) > 0.2
    mask[3, 7] = False                                         # window 3 (and 19, 35, 51): query 7 sees nothing
    first = _c_softmax.window_softmax_attention(q, k, v, d ** -0.5, bias, mask, threads=1)
    for t in (2, 5):
        np.testing.assert_array_equal(_c_softmax.window_softmax_attention(q, k, v, d ** -0.5, bias, mask, threads=t), first)
    with np.errstate(all="ignore"):
        twin = softmax._window_softmax_attention_numpy(q, k, v, d ** -0.5, bias, mask)
    np.testing.assert_array_equal(np.isnan(first), np.isnan(twin))
    assert np.isnan(first[3::16, :, 7]).all() and np.isnan(first).sum() == 4 * h * d
    for kwargs, exc, word in ((dict(bias=bias[:2]), ValueError, "'bias'"),
                              (dict(bias=bias.astype(np.float16)), TypeError, "'bias'"),
                              (dict(mask=mask[:5]), ValueError, "'mask'"),
                              (dict(mask=mask.astype(np.uint8)), TypeError, "'mask'"),
                              (dict(scale="1"), TypeError, "'scale'")):
        args = dict(scale=d ** -0.5, bias=bias, mask=mask)
        args.update(kwargs)
        with pytest.raises(exc, match=word):
            _c_softmax.window_softmax_attention(q, k, v, args["scale"], args["bias"], args["mask"])


def test_window_attention_dispatches_to_the_c_kernel(monkeypatch):
    """Under use("c") window_attention calls the registered C kernel once per call (taps keep NumPy), and its
    result equals the definition within window_attention_bound."""
    from refimpl.attention import softmax
    calls = []
    orig = backends._REGISTRY["window_softmax_attention"]["c"]
    monkeypatch.setitem(backends._REGISTRY["window_softmax_attention"], "c",
                        lambda *a, **k: (calls.append(a[0].shape), orig(*a, **k))[1])
    _, x, p = _window_inputs(dict(SWIN_PADDED, hw=(9, 10)), np.float64)
    kw = dict(num_heads=3, window_size=7, shift=3)
    with backends.use("c"):
        got = softmax.window_attention(x, p, **kw)
        softmax.window_attention(x, p, taps={}, **kw)
    ref = softmax.window_attention(x, p, **kw)
    assert len(calls) == (1 if STATUS["c"].ok else 0)
    numerics.assert_close(got, ref, softmax.window_attention_bound(x, p, dtype=np.float64, **kw), np.float64,
                          name="window_attention dispatched")
