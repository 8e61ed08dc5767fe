"""RALA's fused path on the C backend: operations "rala_alpha" and "elu1_feature_map".

On a non-NumPy backend, rala.rala_core (linear order, no RoPE, no taps) computes alpha (RALA Eq. 4) with
operation "rala_alpha" (on the C backend a multi-threaded kernel, ckernels/rala_body.h), then hands the raw
q, k, v and alpha to operation "reweighted_linear_attention", which applies kappa itself (Eq. 2-3).  The
ELU + 1 map of the fused kernel stays exposed as operation "elu1_feature_map" (before "rala_alpha",
rala_core used it for alpha's kappa(K)).  What is checked:

1. Agreement: the C map lies within the error model of the exp form of ELU + 1
   (linear.feature_map_error: u phi for x > 0, c u phi for x <= 0 with c = config.ELEMENTARY_FUNCTION_ULPS)
   of the float64 definition linear.feature_map(x, "elu1"), float64 and float32 (plus the naive float32
   check); the x > 0 branch (x + 1, one rounding) is the definition's bits; special values (NaN, +-inf,
   +-0, exp underflow) map exactly as in the definition; the same bits at every vector level.
2. NaN poisoning of the output (a kernel that writes nothing leaves NaN, also in a caller's out=) and raw
   refusals that write nothing.
3. Bad input: dtype, empty x, unusable out= -> TypeError/ValueError naming the argument.
4. Dispatch: rala_core under use("c") calls "rala_alpha" once when it reweights (never otherwise) and
   stays within rala_core_bound of the float64 definition; under the default backend, or with taps, it is
   the NumPy definition (no call).  The twin of "rala_alpha" is rala_core's own NumPy alpha, bit for bit.
5. "rala_alpha" in C: end-to-end agreement of rala_core within rala_core_bound (Hypothesis, float64 and
   float32, adversarial inputs: huge logits that saturate the softmax, all-negative, one token, d = 1,
   d > 64, odd N); NaN propagation per head as in the definition; bitwise identical across thread counts
   1/2/3 and vector levels; NaN-poisoned output; raw refusals write nothing; bad input refused naming the
   argument.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics, verdict
from refimpl.attention import linear, rala, rala_core
from refimpl.backends import _c, _c_linear
from tests.kernel_helpers import (STATUS, backend_available, c_kernel_that_writes_nothing, kernel_verdict,
                                  registered_kernel)

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale", "subnormal")


def needs_c() -> bool:
    """True when the compiled module is there; its absence is allowed unless REFIMPL_REQUIRE_BACKENDS=1
    (tests.kernel_helpers.backend_available)."""
    return backend_available("c", "elu1_feature_map")


def elu1_c():
    """The registered C implementation, or (no compiled module) the NumPy twin."""
    return registered_kernel("elu1_feature_map", "c")


def elu1_bound(x64: np.ndarray) -> numerics.Bound:
    """|fl_T(phi(x)) - phi(x)| <= u_T E(x) (linear.feature_map_error, first order; E = phi for x > 0, one
    rounding of x + 1; E = c phi for x <= 0, exp within c ulps, c = config.ELEMENTARY_FUNCTION_ULPS).  As a
    Bound: scale E / c with k = c, so gamma_c(u) E / c >= u E; the k eta_T term admits an exp result in
    the subnormal range (libm's, below the kernel's vector range) off by up to c/2 subnormal spacings.  Not
    rigorous beyond the assumed exp accuracy (the kernel's vector exp: at most 1.14 ulp measured against
    mpmath, docs/kernels_c.md)."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    return numerics.Bound(linear.feature_map_error(x64, "elu1") / c, c,
                          "elu1 exp form: E = phi (x > 0, x + 1 rounded), c phi (x <= 0, exp within c ulps); "
                          "scale E / c, k = c (heuristic only in the exp accuracy assumption)")


# ---------------------------------------------------------------------------------------------------
# 1. Agreement with linear.feature_map(x, "elu1")
# ---------------------------------------------------------------------------------------------------

@st.composite
def map_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=4)))
    return dict(shape=shape, seed=draw(st.integers(0, 2**32 - 1)), kind=draw(st.sampled_from(KINDS)))


@DTYPES
@given(c=map_cases())
@example(c=dict(shape=(1, 3, 196, 32), seed=1, kind="normal"))
@example(c=dict(shape=(2, 1, 7, 65), seed=2, kind="large"))        # exp underflow: the libm branch
@example(c=dict(shape=(1,), seed=3, kind="all_negative"))
def test_elu1_feature_map_agrees_with_definition_through_error_model(dtype, c):
    """ELU(x) + 1 (Katharopoulos et al. 2020, Eq. 7; RALA's kappa, Sec. 3.2) in C lies within the exp-form
    error model of the float64 definition; (float32) within the ensemble criterion (refimpl.verdict) of NumPy's float32 map;
    where x > 0 it is x + 1 rounded once in T, the definition's bits."""
    x = np.asarray(generate(c["seed"], c["kind"], c["shape"]), dtype=dtype)
    got = elu1_c()(x)
    assert got.dtype == dtype and got.shape == x.shape and got.flags.c_contiguous
    x64 = x.astype(np.float64)
    ref = linear.feature_map(x64, "elu1")
    naive = None if dtype == np.float64 else numerics.naive_same_precision(linear.feature_map, x64, "elu1",
                                                                           dtype=np.float32)
    numerics.assert_close(got, ref, elu1_bound(x64), dtype, naive=naive, name=f"elu1_feature_map[c, {c['kind']}]")
    pos = x > 0
    np.testing.assert_array_equal(got[pos], x[pos] + dtype(1))


@DTYPES
def test_elu1_feature_map_special_values_and_vector_levels(dtype):
    """NaN -> NaN, +inf -> inf, -inf -> 0, +-0 -> 1 (exp(0) = 1 exactly), exp underflow -> 0, as the
    definition; every vector level (AVX-512, AVX2, baseline) returns the same bits (the map is
    element-wise, the same operations at every width)."""
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1e4, 3.0, -1.0], dtype=dtype)
    got = elu1_c()(special)
    with np.errstate(over="ignore"):
        want = linear.feature_map(special.astype(np.float64), "elu1")
    np.testing.assert_array_equal(got[[0, 1, 2, 3, 4, 5, 6]], want[[0, 1, 2, 3, 4, 5, 6]].astype(dtype))
    if not needs_c():
        return
    lib = _c._load().lib
    x = np.asarray(generate(9, "mixed_scale", (3, 37, 29)), dtype=dtype)
    x.flat[::7] = -np.abs(x.flat[::7]) * 200                      # some below the vector exp's range
    results = []
    try:
        for level in range(lib.refimpl_isa_supported() + 1):
            assert lib.refimpl_set_max_isa(level) == level
            results.append(_c_linear.elu1_feature_map(x))
    finally:
        lib.refimpl_set_max_isa(2)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_twin_is_the_definition_and_out_is_used_in_place():
    """The NumPy twin returns linear.feature_map(x, "elu1") bit for bit; out= (C and twin) is written in
    place and returned; a non-contiguous x gives the same bits as its contiguous copy."""
    x = generate(4, "normal", (2, 3, 50, 16))
    np.testing.assert_array_equal(backends.definition("elu1_feature_map")(x), linear.feature_map(x, "elu1"))
    out = np.empty_like(x)
    assert backends.definition("elu1_feature_map")(x, out=out) is out
    np.testing.assert_array_equal(out, linear.feature_map(x, "elu1"))
    if not needs_c():
        return
    buf = backends.empty_aligned(x.shape, np.float64)
    assert _c_linear.elu1_feature_map(x, out=buf) is buf
    np.testing.assert_array_equal(buf, _c_linear.elu1_feature_map(x))
    strided = x[:, :, ::2].swapaxes(-1, -2)
    np.testing.assert_array_equal(_c_linear.elu1_feature_map(strided), _c_linear.elu1_feature_map(strided.copy()))


# ---------------------------------------------------------------------------------------------------
# 2. NaN poisoning, raw refusals
# ---------------------------------------------------------------------------------------------------

def test_output_is_nan_poisoned_and_refusals_write_nothing():
    """The wrapper fills the output (also a caller's out=) with NaN before the kernel runs, so a kernel
    that returns without writing leaves all NaN; refused raw calls (NULL pointer: status 5, n < 1: status
    1) write nothing."""
    if not needs_c():
        return
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    out = np.zeros((4, 5))
    with c_kernel_that_writes_nothing("refimpl_elu1_feature_map_f64") as calls:
        res = _c_linear.elu1_feature_map(np.ones((4, 5)), out=out)
    assert calls and res is out and np.isnan(out).all()
    sentinel = np.full(8, 7.0)
    o = ffi.from_buffer("double[]", sentinel, require_writable=True)
    one = ffi.from_buffer("double[]", np.ones(8))
    assert lib.refimpl_elu1_feature_map_f64(ffi.NULL, one, 8) == 5
    assert lib.refimpl_elu1_feature_map_f64(o, ffi.NULL, 8) == 5
    assert lib.refimpl_elu1_feature_map_f64(o, one, 0) == 1
    np.testing.assert_array_equal(sentinel, 7.0)


# ---------------------------------------------------------------------------------------------------
# 3. Bad input
# ---------------------------------------------------------------------------------------------------

def test_bad_input_is_refused_naming_the_argument():
    """float16 / integer x -> TypeError naming 'x'; empty x -> ValueError; out= of the wrong shape or
    dtype, read-only, non-contiguous or sharing memory with x -> error naming 'out'."""
    if not needs_c():
        return
    x = np.linspace(-3, 3, 24).reshape(4, 6)
    with pytest.raises(TypeError, match="'x'.*float32 or float64"):
        _c_linear.elu1_feature_map(x.astype(np.float16))
    with pytest.raises(TypeError, match="'x'"):
        _c_linear.elu1_feature_map(np.arange(6))
    with pytest.raises(ValueError, match="'x'.*non-empty.*\\(0, 3\\)"):
        _c_linear.elu1_feature_map(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="'out'.*\\(4, 6\\)"):
        _c_linear.elu1_feature_map(x, out=np.empty((6, 4)))
    with pytest.raises(TypeError, match="'out'.*float64"):
        _c_linear.elu1_feature_map(x, out=np.empty((4, 6), np.float32))
    ro = np.empty((4, 6))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'out'.*writeable"):
        _c_linear.elu1_feature_map(x, out=ro)
    with pytest.raises(ValueError, match="'out'.*C-contiguous"):
        _c_linear.elu1_feature_map(x, out=np.empty((6, 4)).T)
    with pytest.raises(ValueError, match="'out'.*shares memory with argument 'x'"):
        _c_linear.elu1_feature_map(x, out=x)


# ---------------------------------------------------------------------------------------------------
# 4. Dispatch from rala_core
# ---------------------------------------------------------------------------------------------------

def _alpha_impl(name):
    return backends._REGISTRY["rala_alpha"][name]


@pytest.mark.parametrize("cfg_kw, calls", [
    (dict(), 1),                                                    # paper: Q_g = mean Q
    (dict(global_query="kappa_q", alpha_scale="head_dim", token_scaling="mean", eps=1e-6), 1),
    (dict(reweight=False), 0),                                      # no alpha: alpha = 1
    (dict(kernel="relu"), 1),
])
@DTYPES
def test_rala_core_calls_rala_alpha_where_eq4_needs_it(monkeypatch, dtype, cfg_kw, calls):
    """rala_core under use("c") (RALA Eq. 2-4, linear order, no RoPE) computes alpha (Eq. 4) through
    operation "rala_alpha" once per call when it reweights, with the raw q, k (the op applies kappa), and
    never without reweighting; the result lies within rala_core_bound(dtype) of the float64 definition.
    Under the default backend, and with taps, the NumPy definition runs and the operation is not called."""
    seen = []
    for name in ("numpy", "c"):
        orig = _alpha_impl(name)
        monkeypatch.setitem(backends._REGISTRY["rala_alpha"], name,
                            lambda q, k, *a, _o=orig, **kw: (seen.append((q.shape, k.shape) + a),
                                                              _o(q, k, *a, **kw))[1])
    cfg = rala.RALAConfig(dim=3 * 24, num_heads=3, **cfg_kw)
    q, k, v = (np.asarray(generate(20 + i, "mixed_scale" if i < 2 else "normal", (2, 3, 81, 24)), dtype=dtype)
               for i in range(3))
    with backends.use("c"), numerics.precision(dtype), np.errstate(all="ignore"):
        got = rala.rala_core(q, k, v, cfg)
    assert len(seen) == calls and got.dtype == dtype
    if calls:
        assert seen[0] == (q.shape, k.shape, cfg.global_query, cfg.kernel,
                           24 ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = rala.rala_core(q64, k64, v64, cfg)
        bound = rala.rala_core_bound(q64, k64, v64, cfg, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(rala.rala_core, q64, k64, v64, cfg,
                                                                              dtype=np.float32)
    kernel_verdict(dtype)(got, ref, bound, dtype, naive=naive, name=f"rala_core[c, {cfg_kw}]")
    seen.clear()
    with np.errstate(all="ignore"):
        default = rala.rala_core(q64, k64, v64, cfg)
        with backends.use("c"):
            tapped = rala.rala_core(q64, k64, v64, cfg, taps={})
    assert seen == []
    np.testing.assert_array_equal(default, ref)
    np.testing.assert_array_equal(tapped, ref)


@pytest.mark.parametrize("gq", ["q", "kappa_q"])
@pytest.mark.parametrize("kernel", ["elu1", "relu"])
@pytest.mark.parametrize("alpha_scale", ["none", "head_dim"])
def test_rala_alpha_twin_is_rala_cores_alpha(gq, kernel, alpha_scale):
    """The NumPy definition of "rala_alpha" (rala_core._rala_alpha_numpy) is the alpha rala_core computes on
    its NumPy path (Eq. 4: Q_g the mean of Q or kappa(Q), alpha = N softmax_j(scale Q_g kappa(K_j)^T)), bit
    for bit (taps["alpha"]); out= is written in place and returned."""
    cfg = rala.RALAConfig(dim=2 * 20, num_heads=2, global_query=gq, kernel=kernel, alpha_scale=alpha_scale)
    q, k, v = (generate(30 + i, "normal", (2, 2, 37, 20)) for i in range(3))
    taps = {}
    rala.rala_core(q, k, v, cfg, taps=taps)
    scale = 20 ** -0.5 if alpha_scale == "head_dim" else 1.0
    np.testing.assert_array_equal(rala_core._rala_alpha_numpy(q, k, gq, kernel, scale), taps["alpha"])
    out = np.empty((2, 2, 37))
    assert rala_core._rala_alpha_numpy(q, k, gq, kernel, scale, out=out) is out
    np.testing.assert_array_equal(out, taps["alpha"])


# ---------------------------------------------------------------------------------------------------
# 5. Operation "rala_alpha" in C
# ---------------------------------------------------------------------------------------------------

@st.composite
def alpha_cases(draw):
    """A RoPE-free linear-order RALA problem aimed at Eq. 4: adversarial kinds on q and k ("large": logits
    of order 1e6 that saturate the softmax to one key; "all_negative": kappa(K) = exp(K) < 1), one token,
    d = 1, d > 64, odd N."""
    d = draw(st.one_of(st.just(1), st.sampled_from((32, 64)), st.integers(2, 80)))
    n = draw(st.one_of(st.just(1), st.integers(2, 200)))
    cfg = dict(kernel=draw(st.sampled_from(("elu1", "relu"))),
               global_query=draw(st.sampled_from(("q", "kappa_q"))),
               alpha_scale=draw(st.sampled_from(("none", "head_dim"))),
               token_scaling=draw(st.sampled_from(("sum", "mean"))), eps=draw(st.sampled_from((0.0, 1e-6))))
    return dict(b=draw(st.integers(1, 2)), h=draw(st.integers(1, 3)), n=n, d=d, cfg=cfg,
                seed=draw(st.integers(0, 2**32 - 1)),
                kind=draw(st.sampled_from(("normal", "large", "all_negative", "mixed_scale", "near_duplicate"))))


def _alpha_inputs(c, dtype):
    cfg = rala.RALAConfig(dim=c["h"] * c["d"], num_heads=c["h"], **c["cfg"])
    shape = (c["b"], c["h"], c["n"], c["d"])
    q, k, v = (np.asarray(generate(c["seed"] + i, c["kind"] if i < 2 else "normal", shape), dtype=dtype)
               for i in range(3))
    return cfg, q, k, v


@DTYPES
@given(c=alpha_cases())
@example(c=dict(b=1, h=3, n=196, d=64, cfg=dict(), seed=1, kind="normal"))           # network shape
@example(c=dict(b=1, h=2, n=101, d=33, cfg=dict(kernel="elu1"), seed=2, kind="large"))   # saturated softmax
@example(c=dict(b=2, h=1, n=1, d=1, cfg=dict(global_query="kappa_q"), seed=3, kind="all_negative"))
@example(c=dict(b=1, h=1, n=77, d=72, cfg=dict(global_query="kappa_q", alpha_scale="head_dim",
                                               token_scaling="mean", eps=1e-6), seed=5, kind="mixed_scale"))
@example(c=dict(b=1, h=1, n=2, d=1, cfg=dict(kernel="relu"), seed=2, kind="large"))  # alpha underflows: refused
def test_rala_core_with_c_alpha_agrees_through_error_model(dtype, c):
    """rala_core under use("c") (alpha by the C kernel of "rala_alpha", Eq. 4; then the fused kernel,
    Eq. 2-3) lies within rala_core_bound(dtype) of the float64 definition, and (float32) within
    the ensemble criterion of NumPy's float32 computation (refimpl.verdict).  Where NumPy's alpha of the same inputs is finite
    and positive, the C alpha is too, and it sums to M = N within the softmax's rounding (N (n + 4) u)."""
    cfg, q, k, v = _alpha_inputs(c, dtype)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        try:
            ref = rala.rala_core(q64, k64, v64, cfg)
        except FloatingPointError as exc:
            # docs/guarantees.md, "Left": where every alpha_j that matters to a row underflows
            # (Eq. 4's saturated softmax), the float64 definition refuses, naming its stage, instead of
            # returning 0/0: there is no reference to compare with; in float64 the C backend refuses too.
            assert "rala_core" in str(exc), exc
            if dtype == np.float64:
                with backends.use("c"), pytest.raises(FloatingPointError, match="rala_core"):
                    rala.rala_core(q, k, v, cfg)
            return
    with backends.use("c"), numerics.precision(dtype), np.errstate(all="ignore"):
        got = rala.rala_core(q, k, v, cfg)
    assert got.dtype == dtype and got.shape == q.shape
    with np.errstate(all="ignore"):
        bound = rala.rala_core_bound(q64, k64, v64, cfg, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(rala.rala_core, q64, k64, v64, cfg,
                                                                              dtype=np.float32)
    name = f"rala_core[c alpha, {c['kind']}, {c['cfg']}]"
    if dtype == np.float64:
        _float64_verdict(got, ref, bound, q64, k64, cfg, name)
    else:
        kernel_verdict(dtype)(got, ref, bound, dtype, naive=naive, name=name)
    if not needs_c():
        return
    scale = c["d"] ** -0.5 if cfg.alpha_scale == "head_dim" else 1.0
    with np.errstate(all="ignore"):
        a = _c_linear.rala_alpha(q, k, cfg.global_query, cfg.kernel, scale)
    assert a.dtype == dtype and a.shape == q.shape[:3] and np.isfinite(a).all() and (a >= 0).all()
    n = c["n"]
    u = numerics.unit_roundoff(dtype)
    assert np.all(np.abs(a.astype(np.float64).sum(-1) - n) <= n * numerics.gamma(n + 4, u))


def _float64_verdict(got, ref, bound, q, k, cfg, name):
    """float64: "match", except where the error model itself cannot decide.  In a row the core recomputes from
    log-features (rala_core.recomputed_rows) of a head where some alpha_j underflowed to 0 (Eq. 4's softmax
    saturated by logits ~1e6 apart), the model allows that key's alpha~_j to be c eta (an exp within c ulps of an
    exact value below eta returns up to c eta), and where the surviving keys' terms in that row are smaller
    still (kappa(K_j*) ~ exp(-1300) in the channel where the row's kappa(Q) is largest) such a key would decide
    the row: the bound is the width of V's range there (rala_recomputed._rows_error, "alpha"), void, and the
    verdict "inconclusive".  That is the model's honest answer (a real libm returns 0 and the kernel agrees to
    the last bit); every other element must be conclusive, and the bound must hold everywhere."""
    report = verdict.assert_no_divergence(got, ref, bound, np.float64, name=name)
    if report.verdict == verdict.MATCH:
        return
    hit, alpha = rala_core.recomputed_rows(q, k, cfg)
    ill = (hit & np.any(alpha == 0, axis=-1, keepdims=True))[..., None]
    size = np.maximum(np.abs(ref), np.sqrt(np.mean(ref ** 2)))
    void = bound.array(np.float64, ref.shape) >= size
    assert np.any(void) and not np.any(void & ~ill), f"void bound outside the ill-conditioned rows\n{report}"


@DTYPES
def test_rala_alpha_nan_propagates_per_head_like_the_definition(dtype):
    """A NaN in one key of one head makes that head's logits' max NaN (np.max), so all its alpha are NaN,
    in C as in the definition; the other heads are untouched (here: finite).  A +inf feature of a key gives
    kappa = inf and a logit of +-inf (the sign of Q_g's feature): C gives the definition's NaN and zero
    pattern (exp(-inf) = 0 exactly; +inf - inf = NaN)."""
    q, k = (np.asarray(generate(40 + i, "normal", (1, 3, 90, 16)), dtype=dtype) for i in range(2))
    k[0, 0, 17, 3] = np.nan
    k[0, 2, 5, 0] = np.inf
    ref = rala_core._rala_alpha_numpy(q.astype(np.float64), k.astype(np.float64))
    impl = _alpha_impl("c" if STATUS["c"].ok else "numpy")
    with numerics.precision(dtype), np.errstate(all="ignore"):
        got = impl(q, k)
    for a in (ref, got):
        assert np.isnan(a[0, 0]).all() and np.isfinite(a[0, 1]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got == 0, ref == 0)
    q[0, 2, :, 0] = np.abs(q[0, 2, :, 0]) + 1                  # Q_g[0] > 0: a +inf logit, the head is NaN
    ref = rala_core._rala_alpha_numpy(q.astype(np.float64), k.astype(np.float64))
    with numerics.precision(dtype), np.errstate(all="ignore"):
        got = impl(q, k)
    assert np.isnan(ref[0, 2]).all() and np.isnan(got[0, 2]).all() and np.isfinite(got[0, 1]).all()


@DTYPES
@pytest.mark.parametrize("shape", [(1, 3, 6000, 6000, 32), (2, 1, 4099, 3001, 67), (1, 2, 2, 700, 1)])
def test_rala_alpha_bitwise_across_threads_and_vector_levels(dtype, shape):
    """alpha from the C kernel is the same bits for 1, 2 and 3 threads (the first shape, 1.15M
    multiply-adds, is above the kernel's one-thread threshold of 2^20; the odd second one too, with
    M != N) and at every vector level (AVX-512, AVX2, baseline): (head, chunk) items with a fixed summation
    order (ckernels/rala_body.h), whichever thread runs them."""
    if not needs_c():
        return
    b, h, n, m, d = shape
    q = np.asarray(generate(50, "mixed_scale", (b, h, n, d)), dtype=dtype)
    k = np.asarray(generate(51, "normal", (b, h, m, d)), dtype=dtype)
    lib = _c._load().lib
    for gq, kernel in (("q", "elu1"), ("kappa_q", "relu"), ("kappa_q", "elu1")):
        first = _c_linear.rala_alpha(q, k, gq, kernel, d ** -0.5, threads=1)
        assert np.isfinite(first).all()
        for t in (2, 3):
            np.testing.assert_array_equal(_c_linear.rala_alpha(q, k, gq, kernel, d ** -0.5, threads=t), first)
        try:
            for level in range(lib.refimpl_isa_supported() + 1):
                assert lib.refimpl_set_max_isa(level) == level
                np.testing.assert_array_equal(_c_linear.rala_alpha(q, k, gq, kernel, d ** -0.5, threads=2), first)
        finally:
            lib.refimpl_set_max_isa(2)


def test_rala_alpha_output_is_nan_poisoned_and_refusals_write_nothing():
    """The wrapper fills alpha (also a caller's out=) with NaN before the kernel runs, so a kernel that
    returns without writing leaves all NaN; refused raw calls write nothing: NULL pointer (status 5),
    size < 1 (1), a feature map other than ReLU / ELU + 1 (6), a short workspace (7)."""
    if not needs_c():
        return
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    q, k = generate(60, "normal", (1, 2, 30, 8)), generate(61, "normal", (1, 2, 30, 8))
    out = np.zeros((1, 2, 30))
    with c_kernel_that_writes_nothing("refimpl_rala_alpha_f64") as calls:
        res = _c_linear.rala_alpha(q, k, out=out)
    assert calls and res is out and np.isnan(out).all()
    sentinel = np.full(60, 7.0)
    need = lib.refimpl_rala_alpha_workspace(2, 30, 30, 8, 1)
    assert need > 0 and lib.refimpl_rala_alpha_workspace(0, 30, 30, 8, 1) < 0
    ws = np.empty(need)
    o = ffi.from_buffer("double[]", sentinel, require_writable=True)
    w = ffi.from_buffer("double[]", ws, require_writable=True)
    qb, kb = ffi.from_buffer("double[]", q), ffi.from_buffer("double[]", k)
    assert lib.refimpl_rala_alpha_f64(ffi.NULL, w, qb, kb, 1, 0, 1.0, 2, 30, 30, 8, need, 1) == 5
    assert lib.refimpl_rala_alpha_f64(o, w, ffi.NULL, kb, 1, 0, 1.0, 2, 30, 30, 8, need, 1) == 5
    assert lib.refimpl_rala_alpha_f64(o, w, qb, kb, 1, 0, 1.0, 2, 0, 30, 8, need, 1) == 1
    assert lib.refimpl_rala_alpha_f64(o, w, qb, kb, 2, 0, 1.0, 2, 30, 30, 8, need, 1) == 6
    assert lib.refimpl_rala_alpha_f64(o, w, qb, kb, 1, 0, 1.0, 2, 30, 30, 8, need - 1, 1) == 7
    np.testing.assert_array_equal(sentinel, 7.0)
    assert lib.refimpl_rala_alpha_f64(o, w, qb, kb, 1, 0, 1.0, 2, 30, 30, 8, need, 1) == 0
    np.testing.assert_array_equal(sentinel, _c_linear.rala_alpha(q, k).reshape(-1))


def test_rala_alpha_bad_input_is_refused_naming_the_argument():
    """Mixed or unsupported dtypes, wrong ranks and mismatched shapes, unknown global query / kernel, a
    non-real scale, bad threads, an unusable out= or a short workspace= -> TypeError / ValueError naming
    the argument."""
    if not needs_c():
        return
    q, k = generate(70, "normal", (1, 2, 10, 4)), generate(71, "normal", (1, 2, 12, 4))
    with pytest.raises(TypeError, match="'k'.*float64"):
        _c_linear.rala_alpha(q, k.astype(np.float32))
    with pytest.raises(TypeError, match="'q'"):
        _c_linear.rala_alpha(q.astype(np.float16), k)
    with pytest.raises(ValueError, match="'q'.*4-d"):
        _c_linear.rala_alpha(q[0], k)
    with pytest.raises(ValueError, match="'k'.*\\(1, 2, M, 4\\)"):
        _c_linear.rala_alpha(q, k[..., :3])
    with pytest.raises(ValueError, match="'k'.*non-empty"):
        _c_linear.rala_alpha(q, k[:, :, :0])
    with pytest.raises(ValueError, match="'global_query'"):
        _c_linear.rala_alpha(q, k, "mean")
    with pytest.raises(ValueError, match="'kernel'"):
        _c_linear.rala_alpha(q, k, "q", "softmax")
    with pytest.raises(TypeError, match="'scale'"):
        _c_linear.rala_alpha(q, k, "q", "elu1", "1")
    with pytest.raises(ValueError, match="'threads'"):
        _c_linear.rala_alpha(q, k, threads=0)
    with pytest.raises(ValueError, match="'out'.*\\(1, 2, 12\\)"):
        _c_linear.rala_alpha(q, k, out=np.empty((1, 2, 10)))
    with pytest.raises(TypeError, match="'out'"):
        _c_linear.rala_alpha(q, k, out=np.empty((1, 2, 12), np.float32))
    with pytest.raises(ValueError, match="'workspace'.*at least"):
        _c_linear.rala_alpha(q, k, workspace=np.empty(3))
    ws = backends.empty_aligned(_c_linear.rala_alpha_workspace_size(1, 2, 10, 12, 4), np.float64)
    np.testing.assert_array_equal(_c_linear.rala_alpha(q, k, workspace=ws), _c_linear.rala_alpha(q, k))
