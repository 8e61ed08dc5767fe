"""RALA's fused path on the C backend: operation "elu1_feature_map" and rala_core's use of it.

On a non-NumPy backend, rala.rala_core (linear order, no RoPE, no taps) computes alpha (RALA Eq. 4) with
kappa(K) (and kappa(Q) when Q_g is its mean) from operation "elu1_feature_map", then hands the raw q, k, v
to operation "reweighted_linear_attention", which applies kappa itself (Eq. 2-3).  Before, it evaluated
kappa(Q) and kappa(K) with NumPy's feature map, which took most of the call's time (docs/benchmarks.md).
What is checked:

1. Agreement: the C map lies within the error model of the exp form of ELU + 1
   (linear.feature_map_error: u phi for x > 0, c u phi for x <= 0 with c = config.ELEMENTARY_FUNCTION_ULPS)
   of the float64 definition linear.feature_map(x, "elu1"), float64 and float32 (plus the naive float32
   check); the x > 0 branch (x + 1, one rounding) is the definition's bits; special values (NaN, +-inf,
   +-0, exp underflow) map exactly as in the definition; the same bits at every vector level.
2. NaN poisoning of the output (a kernel that writes nothing leaves NaN, also in a caller's out=) and raw
   refusals that write nothing.
3. Bad input: dtype, empty x, unusable out= -> TypeError/ValueError naming the argument.
4. Dispatch: rala_core under use("c") calls "elu1_feature_map" exactly where Eq. 4 needs kappa, and stays
   within rala_core_bound of the float64 definition; under the default backend, or with taps, it is the
   NumPy definition (no call).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics
from refimpl.attention import linear, rala
from refimpl.backends import _c, twins
from tests.kernel_helpers import c_kernel_that_writes_nothing

REQUIRE = os.environ.get("REFIMPL_REQUIRE_BACKENDS", "") == "1"
STATUS = backends.available()
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale", "subnormal")


def needs_c() -> bool:
    """True when the compiled module is there; its absence is allowed unless REFIMPL_REQUIRE_BACKENDS=1."""
    if not STATUS["c"].ok:
        assert not REQUIRE, STATUS["c"].reason
        assert "c" in backends.kernels()["elu1_feature_map"]
        return False
    return True


def elu1_c():
    """The registered C implementation, or (no compiled module) the NumPy twin."""
    return backends._REGISTRY["elu1_feature_map"]["c" if STATUS["c"].ok else "numpy"]


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
    error model of the float64 definition; (float32) within NAIVE_ERROR_RATIO_MAX of NumPy's float32 map;
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
            results.append(_c.elu1_feature_map(x))
    finally:
        lib.refimpl_set_max_isa(2)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_twin_is_the_definition_and_out_is_used_in_place():
    """The NumPy twin returns linear.feature_map(x, "elu1") bit for bit; out= (C and twin) is written in
    place and returned; a non-contiguous x gives the same bits as its contiguous copy."""
    x = generate(4, "normal", (2, 3, 50, 16))
    np.testing.assert_array_equal(twins.elu1_feature_map(x), linear.feature_map(x, "elu1"))
    out = np.empty_like(x)
    assert twins.elu1_feature_map(x, out=out) is out
    np.testing.assert_array_equal(out, linear.feature_map(x, "elu1"))
    if not needs_c():
        return
    buf = backends.empty_aligned(x.shape, np.float64)
    assert _c.elu1_feature_map(x, out=buf) is buf
    np.testing.assert_array_equal(buf, _c.elu1_feature_map(x))
    strided = x[:, :, ::2].swapaxes(-1, -2)
    np.testing.assert_array_equal(_c.elu1_feature_map(strided), _c.elu1_feature_map(strided.copy()))


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
        res = _c.elu1_feature_map(np.ones((4, 5)), out=out)
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
        _c.elu1_feature_map(x.astype(np.float16))
    with pytest.raises(TypeError, match="'x'"):
        _c.elu1_feature_map(np.arange(6))
    with pytest.raises(ValueError, match="'x'.*non-empty.*\\(0, 3\\)"):
        _c.elu1_feature_map(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="'out'.*\\(4, 6\\)"):
        _c.elu1_feature_map(x, out=np.empty((6, 4)))
    with pytest.raises(TypeError, match="'out'.*float64"):
        _c.elu1_feature_map(x, out=np.empty((4, 6), np.float32))
    ro = np.empty((4, 6))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'out'.*writeable"):
        _c.elu1_feature_map(x, out=ro)
    with pytest.raises(ValueError, match="'out'.*C-contiguous"):
        _c.elu1_feature_map(x, out=np.empty((6, 4)).T)
    with pytest.raises(ValueError, match="'out'.*shares memory with argument 'x'"):
        _c.elu1_feature_map(x, out=x)


# ---------------------------------------------------------------------------------------------------
# 4. Dispatch from rala_core
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg_kw, calls", [
    (dict(), 1),                                                    # paper: Q_g = mean Q; kappa(K) only
    (dict(global_query="kappa_q", alpha_scale="head_dim", token_scaling="mean", eps=1e-6), 2),
    (dict(reweight=False), 0),                                      # no alpha: no kappa outside the kernel
    (dict(kernel="relu"), 0),                                       # ReLU stays in NumPy (exact)
])
@DTYPES
def test_rala_core_calls_the_feature_map_where_eq4_needs_it(monkeypatch, dtype, cfg_kw, calls):
    """rala_core under use("c") (RALA Eq. 2-4, linear order, no RoPE) evaluates kappa outside the fused
    kernel only for Eq. 4 (kappa(K) in the logits; kappa(Q) when Q_g is its mean), through operation
    "elu1_feature_map"; the result lies within rala_core_bound(dtype) of the float64 definition.  Under
    the default backend, and with taps, the NumPy definition runs and the operation is not called."""
    seen = []
    for name in ("numpy", "c"):
        orig = backends._REGISTRY["elu1_feature_map"][name]
        monkeypatch.setitem(backends._REGISTRY["elu1_feature_map"], name,
                            lambda x, _o=orig, **kw: (seen.append(x.shape), _o(x, **kw))[1])
    cfg = rala.RALAConfig(dim=3 * 24, num_heads=3, **cfg_kw)
    q, k, v = (np.asarray(generate(20 + i, "mixed_scale" if i < 2 else "normal", (2, 3, 81, 24)), dtype=dtype)
               for i in range(3))
    with backends.use("c"), numerics.precision(dtype), np.errstate(all="ignore"):
        got = rala.rala_core(q, k, v, cfg)
    assert len(seen) == calls and all(s == q.shape for s in seen) and got.dtype == dtype
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        ref = rala.rala_core(q64, k64, v64, cfg)
        bound = rala.rala_core_bound(q64, k64, v64, cfg, dtype=dtype)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(rala.rala_core, q64, k64, v64, cfg,
                                                                              dtype=np.float32)
    numerics.assert_close(got, ref, bound, dtype, naive=naive, name=f"rala_core[c, {cfg_kw}]")
    seen.clear()
    with np.errstate(all="ignore"):
        default = rala.rala_core(q64, k64, v64, cfg)
        with backends.use("c"):
            tapped = rala.rala_core(q64, k64, v64, cfg, taps={})
    assert seen == []
    np.testing.assert_array_equal(default, ref)
    np.testing.assert_array_equal(tapped, ref)
