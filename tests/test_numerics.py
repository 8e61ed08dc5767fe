"""Properties of refimpl.numerics: the dtype policy, the stable primitives (against mpmath at 50 digits)
and the error model itself (it must catch what it claims to catch)."""

from __future__ import annotations

import math
import textwrap

import mpmath
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import config, numerics
from refimpl.verdict import DIVERGES, INCONCLUSIVE
from refimpl.numerics import Bound

mpmath.mp.dps = 50

finite = st.floats(-30, 30, allow_nan=False, allow_infinity=False)


# ----------------------------------------------------------------------------------------------------
# dtype policy
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_real_floats_are_promoted_exactly(dtype):
    x = (np.arange(7, dtype=np.float64) / 3).astype(dtype)
    y = numerics.as_float(x, "x")
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, x.astype(np.float64))


@pytest.mark.parametrize("bad, kind", [(np.arange(3), "integer"), (np.ones(3, bool), "bool"),
                                       (np.ones(3, complex), "complex"), (np.array([1.0, None]), "object"),
                                       (np.arange(3, dtype=np.uint8), "unsigned")])
def test_non_real_float_inputs_raise_type_error_naming_the_argument(bad, kind):
    with pytest.raises(TypeError, match=rf"argument 'query'.*{kind}"):
        numerics.as_float(bad, "query")


def test_empty_arrays_raise_value_error():
    with pytest.raises(ValueError, match=r"argument 'k'.*non-empty.*\(0, 3\)"):
        numerics.as_float(np.zeros((0, 3)), "k")


def test_precision_context_computes_in_float32_and_restores():
    with numerics.precision(np.float32):
        assert numerics.softmax(np.ones(3)).dtype == np.float32
    assert numerics.softmax(np.ones(3, np.float32)).dtype == np.float64


def test_check_shapes_binds_dimensions_and_names_the_argument():
    dims = numerics.check_shapes(q=(np.zeros((2, 3, 5, 4)), "B h N d"), k=(np.zeros((2, 3, 7, 4)), "B h M d"))
    assert dims == {"B": 2, "h": 3, "N": 5, "d": 4, "M": 7}
    with pytest.raises(ValueError, match=r"argument 'k'.*dimension d is 4, not 6"):
        numerics.check_shapes(q=(np.zeros((2, 3, 5, 4)), "B h N d"), k=(np.zeros((2, 3, 7, 6)), "B h M d"))
    with pytest.raises(ValueError, match=r"argument 'x'.*4-d.*got 2-d"):
        numerics.check_shapes(x=(np.zeros((2, 3)), "B C H W"))


# ----------------------------------------------------------------------------------------------------
# Primitives against mpmath (the float64 reference must be within its own error model of the truth)
# ----------------------------------------------------------------------------------------------------

def _mp(fn, x):
    return np.array([float(fn(mpmath.mpf(float(v)))) for v in np.ravel(x)]).reshape(np.shape(x))


@given(st.lists(finite, min_size=1, max_size=8), st.sampled_from(["none", "tanh"]))
def test_gelu_matches_mpmath(xs, approximate):
    x = np.array(xs)
    if approximate == "none":
        # 1 + erf(t) = erfc(-t): written so that mpmath does not cancel at 50 digits for t << 0
        truth = _mp(lambda v: v / 2 * mpmath.erfc(-v / mpmath.sqrt(2)), x)
    else:
        c = mpmath.sqrt(2 / mpmath.pi)
        # 1 + tanh(t) = 2 / (1 + exp(-2t)), free of cancellation for t << 0
        truth = _mp(lambda v: v / (1 + mpmath.exp(-2 * c * (v + mpmath.mpf(config.GELU_TANH_COEF) * v ** 3))), x)
    # The bound's safety (it must hold for the reference itself).  Its verdict can be "inconclusive": the bound
    # is written on |x| because implementations (torch included) evaluate 1 + erf(x / sqrt 2), which cancels
    # for x << 0 (GELU(-8) = -5e-15 with an absolute error of a few u |x|), so relative to the value the bound
    # is void there.
    report = numerics.compare(numerics.gelu(x, approximate), truth, _gelu_b(x, approximate), "float64")
    assert report.pattern_ok and report.within_bound and report.verdict != "diverges", str(report)


def _gelu_b(x, approximate):
    from refimpl.layers import gelu_bound
    return gelu_bound(x, approximate)


@given(st.lists(st.floats(-800, 800), min_size=1, max_size=8))
def test_softplus_matches_mpmath_without_overflow(xs):
    """softplus(x) = log(1 + e^x): evaluated as max(x,0) + log1p(exp(-|x|)), three roundings plus the libm
    error of exp and log1p, relative to the result (all terms non-negative, no cancellation)."""
    x = np.array(xs)
    with np.errstate(over="raise"):
        got = numerics.softplus(x)
    truth = _mp(lambda v: mpmath.log1p(mpmath.exp(v)), x)  # log(1 + tiny) would cancel even at 50 digits
    numerics.assert_close(got, truth, Bound(truth, 2 * config.ELEMENTARY_FUNCTION_ULPS + 3,
                                            "softplus: exp + log1p libm ulps + 3 roundings"), "float64")


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=8), st.sampled_from([1.0, 0.5, 2.0]))
def test_elu_matches_mpmath(xs, alpha):
    x = np.array(xs)
    truth = _mp(lambda v: v if v > 0 else alpha * mpmath.expm1(v), x)
    numerics.assert_close(numerics.elu(x, alpha), truth,
                          Bound(np.abs(truth), config.ELEMENTARY_FUNCTION_ULPS + 1, "expm1 ulps + scale"), "float64")


@given(st.lists(st.floats(-700, 700), min_size=1, max_size=6))
def test_softmax_matches_mpmath_and_never_overflows(xs):
    """Against mpmath, within numerics.softmax_bound (whose |x_i - max| terms this test first exposed:
    x = [66, 1.05] gives 40 ulp in float64, the conditioning of exp on the rounded difference)."""
    x = np.array(xs)
    with np.errstate(over="raise"):
        got = numerics.softmax(x)
    m = [mpmath.mpf(float(v)) for v in x]
    z = mpmath.fsum(mpmath.exp(v) for v in m)
    truth = np.array([float(mpmath.exp(v) / z) for v in m])
    numerics.assert_close(got, truth, numerics.softmax_bound(x), "float64")


def test_softmax_of_fully_masked_row_is_nan_and_nan_propagates():
    out = numerics.softmax(np.array([[-np.inf, -np.inf], [0.0, np.nan]]))
    assert np.isnan(out).all()


def test_relu_and_leaky_relu_propagate_nan():
    x = np.array([-1.0, np.nan, 2.0])
    assert np.isnan(numerics.relu(x)[1]) and numerics.relu(x)[0] == 0.0
    np.testing.assert_array_equal(numerics.leaky_relu(x, 0.1)[[0, 2]], [-0.1, 2.0])
    assert np.isnan(numerics.leaky_relu(x)[1]) and np.isnan(numerics.elu(x)[1])


@given(st.lists(st.floats(-1e300, 1e300), min_size=1, max_size=6))
def test_l2_normalize_has_unit_norm_without_overflow(xs):
    """||x / ||x|| || = 1 for every non-zero finite x, including |x| ~ 1e300 (the scaled norm cannot
    overflow) and tiny x; error: n for the sum of squares, sqrt, scale and quotient."""
    x = np.array(xs)
    if not np.any(x):
        x = np.array([0.0])
    with np.errstate(over="raise"):
        y = numerics.l2_normalize(x, policy="none") if np.any(x) else numerics.l2_normalize(x)
    if np.any(x):
        norm = math.sqrt(float(np.sum(y * y)))
        numerics.assert_close(np.array([norm]), np.array([1.0]), Bound(np.ones(1), 2 * len(x) + 6, "norm of y"),
                              "float64")
    else:
        np.testing.assert_array_equal(y, 0.0)


def test_l2_normalize_eps_policies():
    z = np.zeros(3)
    np.testing.assert_array_equal(numerics.l2_normalize(z, policy="clamp"), z)
    np.testing.assert_array_equal(numerics.l2_normalize(z, policy="add"), z)
    assert np.isnan(numerics.l2_normalize(z, policy="none")).all()
    x = np.array([3.0, 4.0])
    np.testing.assert_array_equal(numerics.l2_normalize(x, eps=10.0, policy="clamp"), x / 10.0)
    np.testing.assert_array_equal(numerics.l2_normalize(x, eps=1.0, policy="add"), x / 6.0)
    with pytest.raises(ValueError, match="argument 'policy'"):
        numerics.l2_normalize(x, policy="max")


# ----------------------------------------------------------------------------------------------------
# The error model catches what it claims to catch
# ----------------------------------------------------------------------------------------------------

def test_unit_roundoffs_and_gamma():
    assert numerics.unit_roundoff("float64") == np.finfo(np.float64).eps / 2
    assert numerics.unit_roundoff(np.float32) == np.finfo(np.float32).eps / 2
    assert numerics.unit_roundoff("float16") == np.finfo(np.float16).eps / 2
    assert numerics.unit_roundoff("bfloat16") == 2.0 ** -8
    assert numerics.gamma(10, 2.0 ** -24) == 10 * 2.0 ** -24 / (1 - 10 * 2.0 ** -24)     # the same operations
    assert numerics.gamma(2 ** 24, 2.0 ** -24) == math.inf


def test_round_to_bfloat16_matches_torch():
    torch = pytest.importorskip("torch")  # torch is in the test extra; refimpl itself never needs it
    x = np.random.default_rng(0).standard_normal(1000) * 10.0 ** np.random.default_rng(1).uniform(-30, 30, 1000)
    x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9]])
    want = torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(numerics.round_to(x, "bfloat16"), want)


def test_compare_flags_a_violation_of_the_bound():
    ref = np.array([1.0, 2.0, 3.0])
    b = Bound(np.abs(ref), 4, "test")
    bad = ref + np.array([0.0, 100 * numerics.gamma(4, 2.0 ** -24) * 2.0, 0.0])
    report = numerics.compare(bad, ref, b, "float32")
    assert not report.ok and report.worst_index == (1,) and report.max_err_over_bound > 1
    with pytest.raises(AssertionError, match="max err/bound"):
        numerics.assert_close(bad, ref, b, "float32")


def test_compare_requires_identical_nan_and_inf_patterns():
    ref = np.array([1.0, np.nan, np.inf])
    b = Bound(np.ones(3), 1)
    assert numerics.compare(ref.copy(), ref, b, "float64").ok
    assert not numerics.compare(np.array([1.0, 0.0, np.inf]), ref, b, "float64").pattern_ok
    assert not numerics.compare(np.array([1.0, np.nan, -np.inf]), ref, b, "float64").pattern_ok
    assert not numerics.compare(np.array([np.nan, np.nan, np.inf]), ref, b, "float64").ok


def test_compare_checks_the_ensemble_of_legitimate_evaluations():
    """An implementation several times worse than every legitimate evaluation fails even inside the bound;
    when every member is exact, the final-rounding member (u_T |ref|) keeps the check from collapsing to
    'error 0' (refimpl.verdict, "the ensemble criterion")."""
    ref = np.full(4, 1.0)
    b = Bound(np.ones(4), 1000, "loose")  # bound 1000 u = 500 ulp
    ulp = 2.0 ** -23
    naive = ref + np.array([ulp * 50, 0, 0, 0])
    worse = ref + np.array([0, ulp * 50 * (config.VERDICT_MAX_FACTOR + 1), 0, 0])
    report = numerics.compare(worse, ref, b, "float32", naive=naive)
    assert report.within_bound and report.zmax > report.zmax_threshold and report.verdict == "diverges", str(report)
    one_ulp = ref + np.array([ulp, 0, 0, 0])
    report = numerics.compare(one_ulp, ref, Bound(ref, 2), "float32", naive=ref.copy())
    assert report.ok, str(report)
    assert numerics.compare(ref, ref, b, "float32", naive=naive).ok


def test_ulp_distance_counts_representable_steps():
    x = np.float32(1.5)
    nxt = np.nextafter(x, np.float32(2), dtype=np.float32)
    assert numerics.ulp_distance(np.array([nxt], np.float64), np.array([1.5]), "float32")[0] == 1.0


def test_assertion_meta_check_fails_a_test_without_assertions(pytester, monkeypatch):
    """The conftest meta-check turns a passing test that executed no assertion into a failure, and
    counts plain asserts, error-model comparisons, numpy.testing and pytest.raises."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", str(root))  # the copied conftest imports refimpl from this checkout
    pytester.makeconftest((root / "conftest.py").read_text())
    pytester.makepyfile(textwrap.dedent("""
        import numpy as np, pytest
        def test_empty():
            x = 1 + 1
        def test_plain_assert():
            assert 1 + 1 == 2
        def test_numpy_testing():
            np.testing.assert_array_equal(np.zeros(2), np.zeros(2))
        def test_raises():
            with pytest.raises(ZeroDivisionError):
                1 / 0
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "enable_assertion_pass_hook=true")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*test_empty*finished without executing any assertion*"])


def test_nonfinite_slots_are_excused_only_where_the_naive_T_computation_is_nonfinite_too():
    """float32 x^p or a 0/0 normaliser: the reference is finite, T-arithmetic is not.  The tested code may
    be NaN there only if the naive same-precision computation is NaN there as well; even then those slots are
    unchecked, so the verdict is "inconclusive", never "match" (a float16 port whose sums overflow and whose
    output is then zero or NaN is not shown correct by reproducing the overflow)."""
    ref = np.array([1.0, 2.0, 3.0])
    b = Bound(np.abs(ref), 4)
    act = np.array([1.0, np.nan, 3.0])
    assert numerics.compare(act, ref, b, "float32").verdict == DIVERGES  # no naive run: NaN vs finite fails
    assert numerics.compare(act, ref, b, "float32", naive=ref.copy()).verdict == DIVERGES  # naive finite there
    report = numerics.compare(act, ref, b, "float32", naive=np.array([1.0, np.nan, 3.0]))
    assert report.verdict == INCONCLUSIVE and "excused" in report.pattern_msg, str(report)
    assert any("beyond float32's range" in r for r in report.reasons), str(report)


def test_range_rescaling_helpers_validate_their_arguments():
    """pow2_exponent / softmax_shifted refuse bad axes, non-float values and mis-shaped shifts by name, and
    accept what the attention cores pass (a tuple of axes, a keepdims integer shift)."""
    from refimpl.errors import ArgumentError, ArgumentTypeError
    x = np.array([[1.0, 2e300], [3.0, -4.0]])
    assert numerics.pow2_exponent(x, axis=(-2, -1)).shape == (1, 1)
    with pytest.raises(ArgumentError, match=r"argument 'axis'.*distinct"):
        numerics.pow2_exponent(x, axis=(1, -1))
    with pytest.raises(ArgumentTypeError, match=r"argument 'axis\[0\]'"):
        numerics.pow2_exponent(x, axis=(True, 0))
    with pytest.raises(ArgumentTypeError, match=r"argument 'x'"):
        numerics.pow2_exponent(np.array([1, 2]))
    s, shift = np.array([[0.5, -0.25], [0.0, 1.0]]), np.array([[0], [3]])
    np.testing.assert_array_equal(numerics.softmax_shifted(s, shift), numerics.softmax(np.ldexp(s, shift)))
    with pytest.raises(ArgumentTypeError, match=r"argument 'shift'.*integer"):
        numerics.softmax_shifted(s, shift > 0)
    with pytest.raises(ArgumentError, match=r"argument 'shift'.*broadcasting to \(2, 1\)"):
        numerics.softmax_shifted(s, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ArgumentTypeError, match=r"argument 'axis'"):
        numerics.softmax(s, axis=None)
