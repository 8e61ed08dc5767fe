"""The verdict (refimpl.verdict): three outcomes, the two bounds, the ensemble criterion.

Each test is a property the verdict promises in its module docstring; the probabilistic bound against
simulated rounding is in tests/test_probabilistic_bound.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import config, verdict
from refimpl.verdict import DIVERGES, INCONCLUSIVE, MATCH, Bound

U32 = 2.0 ** -24


def _data(n: int = 512, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def test_void_deterministic_bound_is_never_a_match():
    """k u >= 1 makes gamma_k infinite: whatever the output (here a 7% error, the size of the planted
    batch-state bug of docs/verdict.md), a composite bound cannot say "match"; with no ensemble it says
    "inconclusive" and tells what would make the check conclusive."""
    ref = _data()
    b = Bound(np.abs(ref), 3526, "FLatten-PVT-sized depth")
    assert verdict.gamma(3526, verdict.unit_roundoff("float16")) == math.inf
    for out in (ref, ref * 1.07):
        r = verdict.compare(out, ref, b, "float16")
        assert r.verdict == INCONCLUSIVE and not r.ok, str(r)
        assert "stage by stage" in str(r) and "higher precision" in str(r)
    with pytest.raises(AssertionError, match="inconclusive"):
        verdict.assert_close(ref, ref, b, "float16")


def test_relative_bound_of_one_is_inconclusive_and_below_one_is_not():
    """An element whose bound reaches max(|ref_i|, rms(ref)) makes the comparison inconclusive."""
    ref = np.ones(8)
    k = 10
    g = verdict.gamma(k, U32) + verdict.gamma(k, verdict.unit_roundoff("float64"))
    at_one = Bound(np.ones(8) / g, k)           # bound exactly |ref| (up to the eta term): void
    below = Bound(np.ones(8) * 0.5 / g, k)
    assert verdict.compare(ref, ref, at_one, "float32").verdict == INCONCLUSIVE
    r = verdict.compare(ref, ref, below, "float32")
    # b_i = fl(g fl(0.5 / g)) + k (eta_32 + eta_64) (Bound.array sums the same two gammas in the same order): two
    # roundings of 0.5 and the sum's third, over |ref_i| = 1
    eta = verdict.underflow_eta("float32") + verdict.underflow_eta("float64")
    assert r.verdict == MATCH, str(r)
    assert abs(r.max_relative_bound - 0.5) <= verdict.gamma(3, verdict.unit_roundoff("float64")) * 0.5 + k * eta


def test_near_zero_elements_are_measured_against_the_tensor_not_themselves():
    """A reference entry near zero by cancellation does not make a tight bound void: the relative bound
    divides by max(|ref_i|, rms(ref))."""
    ref = np.array([1.0, -1.0, 1e-30, 2.0])
    b = Bound(np.full(4, 2.0), 2)
    r = verdict.compare(ref, ref, b, "float32")
    # the largest b_i / max(|ref_i|, rms(ref)) is the 1e-30 element's, b_i / rms(ref) (rms = sqrt(6 / 4)); the
    # quotient, the square root and the mean of squares round (gamma_4 covers them and b_i's product)
    want = float(np.max(b.array("float32", ref.shape))) / math.sqrt(6.0 / 4.0)
    assert r.verdict == MATCH, str(r)
    assert abs(r.max_relative_bound - want) <= verdict.gamma(4, verdict.unit_roundoff("float64")) * want, (r, want)


def test_an_element_outside_the_bound_diverges_even_if_elsewhere_void():
    """Evidence beats ignorance: an element outside a finite bound is "diverges" even when another element's
    bound is void."""
    ref = np.array([1.0, 1.0])
    scale = np.array([1.0, np.inf])
    out = ref + np.array([1e-3, 0.0])
    r = verdict.compare(out, ref, Bound(scale, 4), "float32")
    assert r.verdict == DIVERGES and "outside" in r.reasons[0], str(r)


def test_probabilistic_factor_only_for_accumulation_bounds():
    """gamma~_k(lam) < gamma_k for large k, used only when the bound declares Higham's inner-product form."""
    ref = np.abs(_data(64)) + 1.0
    k = 10_000
    acc, comp = Bound(ref, k, accumulation=True), Bound(ref, k)
    ra, rc = verdict.compare(ref, ref, acc, "float32"), verdict.compare(ref, ref, comp, "float32")
    assert ra.worst_bound < 0.1 * rc.worst_bound
    assert rc.worst_bound == rc.worst_case_bound          # a composite bound: the same deterministic factor
    lam = verdict.confidence_lambda(ref.size * k, config.VERDICT_FALSE_ALARM, U32)
    assert ra.lam == lam
    assert acc.factor("float32", lam) == verdict.probabilistic_gamma(k, U32, lam)
    # for short sums the deterministic factor is the smaller one, and the minimum is used
    assert Bound(ref, 3, accumulation=True).factor("float32", lam) == verdict.gamma(3, U32)


def test_probabilistic_bound_stays_finite_where_the_deterministic_one_is_void():
    """float16 at k = 3526 (FLatten-PVT stage 1): gamma_k = inf, gamma~_k(lam) finite."""
    u = verdict.unit_roundoff("float16")
    lam = verdict.confidence_lambda(2 * 3136 * 64 * 3526, 1e-6, u)
    assert verdict.gamma(3526, u) == math.inf
    assert math.isfinite(verdict.probabilistic_gamma(3526, u, lam))


@given(n=st.integers(1, 10**6), p=st.sampled_from([1e-3, 1e-6, 1e-9]))
def test_confidence_lambda_inverts_the_union_bound(n, p):
    u = U32
    lam = verdict.confidence_lambda(n, p, u)
    # The round trip in float64: the exponent lam^2 (1 - u)^2 / 2 equals L = log(2 n / p) up to the quotient's
    # rounding inside the log (absolute u_64) and, relative to L, the log (ELEMENTARY_FUNCTION_ULPS u_64), sqrt and
    # the division by 1 - u (each squared: 4) and the three products here; outside the exponent, exp
    # (ELEMENTARY_FUNCTION_ULPS) and the product by 2 n (1).  A change a of the exponent moves the result by
    # e^|a| - 1 relative.
    c, u64 = config.ELEMENTARY_FUNCTION_ULPS, verdict.unit_roundoff("float64")
    big_l = math.log(2 * n / p)
    rel = math.expm1(verdict.gamma(big_l * (c + 7) + 1, u64)) + verdict.gamma(c + 1, u64)
    assert abs(2 * n * math.exp(-lam ** 2 * (1 - u) ** 2 / 2) - p) <= rel * p


@pytest.mark.parametrize("p", [0.0, 1.0, -1e-6, math.nan, math.inf])
def test_confidence_lambda_refuses_a_non_probability(p):
    with pytest.raises(ValueError, match="argument 'p'"):
        verdict.confidence_lambda(10, p, U32)


def test_ensemble_criterion_max_statistic_catches_a_localised_defect():
    """One element 3 VERDICT_MAX_FACTOR times the legitimate evaluations' largest error fails, inside the bound."""
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(4096)
    b = Bound(np.abs(ref) + 1.0, 4096, accumulation=True)
    legit = {f"m{i}": ref + rng.standard_normal(4096) * 3e-7 for i in range(4)}
    good = ref + rng.standard_normal(4096) * 3e-7
    bad = good.copy()
    bad[17] = ref[17] + 3 * config.VERDICT_MAX_FACTOR * max(np.max(np.abs(v - ref)) for v in legit.values())
    assert verdict.compare(good, ref, b, "float32", ensemble=legit).verdict == MATCH
    r = verdict.compare(bad, ref, b, "float32", ensemble=legit)
    assert r.within_bound and r.verdict == DIVERGES and r.zmax > r.zmax_threshold, str(r)


def test_ensemble_criterion_rms_statistic_catches_a_diffuse_defect():
    """A small error on every element (a scale off by a few u) passes the maximum test yet fails the RMS
    one: the RMS averages over the whole output, so it is sharper than the maximum."""
    rng = np.random.default_rng(2)
    ref = rng.standard_normal(65536)
    b = Bound(np.abs(ref) + 1.0, 4096, accumulation=True)
    noise = 2e-7
    legit = {f"m{i}": ref + rng.standard_normal(ref.size) * noise for i in range(4)}
    zmax_legit = max(np.max(np.abs(v - ref)) for v in legit.values())
    diffuse = ref + np.sign(rng.standard_normal(ref.size)) * 0.8 * zmax_legit  # each below the legit maximum
    r = verdict.compare(diffuse, ref, b, "float32", ensemble=legit)
    assert r.zmax <= r.zmax_threshold and r.zrms > r.zrms_threshold and r.verdict == DIVERGES, str(r)


def test_ensemble_member_outside_the_bound_is_named_and_not_used():
    ref = np.ones(32)            # 32 elements x 2 members >= VERDICT_RMS_MIN_ELEMENTS: no rounding-model member
    b = Bound(np.ones(32), 8)
    wild = ref + 1e-2
    ok_member = ref - 1e-7
    r = verdict.compare(ref + 1e-7, ref, b, "float32", ensemble={"wild": wild, "fine": ok_member})
    assert r.verdict == MATCH and any("'wild'" in x and "not used" in x for x in r.reasons), str(r)
    assert r.zmax_threshold == config.VERDICT_MAX_FACTOR * max(r.ensemble["fine"][0], r.ensemble["final rounding"][0])


def test_report_states_both_bounds_probability_and_k():
    ref = _data(256)
    r = verdict.compare(ref, ref, Bound(np.abs(ref) + 1, 300, accumulation=True), "float32")
    text = str(r)
    for piece in ("probabilistic", "worst case", "P(false alarm)", "k = 300", "lam ="):
        assert piece in text, text


def test_rms_criterion_minimum_size_is_the_stated_f_tail():
    """config.VERDICT_RMS_MIN_ELEMENTS is the smallest n at which two equally accurate algorithms' mean squares
    differ by (factor / calibrated ratio)^2 with probability below the false-alarm budget (an F(n, n) tail)."""
    from scipy.stats import f
    r = (config.VERDICT_RMS_FACTOR / config.VERDICT_RMS_CALIBRATED_RATIO) ** 2
    n = config.VERDICT_RMS_MIN_ELEMENTS
    assert f.sf(r, n, n) < config.VERDICT_FALSE_ALARM <= f.sf(r, n - 1, n - 1)


def test_member_equal_to_the_tested_output_is_dropped():
    """A variant that did not change the arithmetic is the tested algorithm again: kept, it would make the
    criterion unable to fail.  It is dropped and named."""
    ref = np.linspace(1.0, 2.0, 64)
    b = Bound(ref, 64, accumulation=True)
    tested = ref + 3e-6
    r = verdict.compare(tested, ref, b, "float32", ensemble={"same": tested.copy(), "other": ref + 1e-7})
    assert "same" not in r.ensemble and any("'same'" in x and "dropped" in x for x in r.reasons), str(r)
    assert r.verdict == DIVERGES, str(r)


def test_ensemble_shape_mismatch_is_an_error():
    ref = np.ones(4)
    with pytest.raises(AssertionError, match="ensemble member 'x' has shape"):
        verdict.compare(ref, ref, Bound(ref, 2), "float32", ensemble={"x": np.ones(5)})


def test_numerics_reexports_are_the_verdict_functions():
    from refimpl import numerics
    for name in ("Bound", "ErrorReport", "gamma", "round_to", "ulp_distance", "unit_roundoff", "underflow_eta"):
        assert getattr(numerics, name) is getattr(verdict, name)


# ---------------------------------------------------------------------------------------------------
# Mixed precision (config.ACCUMULATION_FORMAT) and stage-wise comparison
# ---------------------------------------------------------------------------------------------------

def test_sum_depth_counts_a_wider_accumulation_as_a_fraction_of_a_rounding():
    assert verdict.sum_depth(4096) == 4096 and verdict.sum_depth(4096, "float32") == 4096
    assert verdict.sum_depth(4096, "float16") == 4096 * 2.0 ** -13 + 1       # powers of two: exact
    assert verdict.sum_depth(4096, "bfloat16") == 4096 * 2.0 ** -16 + 1
    assert verdict.accumulation_ratio("float16") == 2.0 ** -13 and verdict.accumulation_ratio("float64") == 1.0


@pytest.mark.parametrize("dtype,np_dtype", [("float16", np.float16)])
@pytest.mark.parametrize("n", [64, 4096, 65536])
def test_mixed_accumulation_bound_holds_for_float32_sums_of_half_data(dtype, np_dtype, n):
    """A half-precision inner product accumulated in float32 and rounded once (torch's Half GEMM) is inside the
    mixed factor g_A + 2 u_T, also where gamma_n(u_T) is void (n u_T >= 1)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((32, n)).astype(np_dtype).astype(np.float64)
    y = rng.standard_normal(n).astype(np_dtype).astype(np.float64)
    exact = x @ y
    tested = (x.astype(np.float32) @ y.astype(np.float32)).astype(np_dtype)
    b = Bound(np.abs(x) @ np.abs(y), n, "dot", accumulation=True)
    assert math.isinf(verdict.gamma(n, verdict.unit_roundoff(dtype))) == (n * 2.0 ** -11 >= 1)
    bound = b.array(dtype, exact.shape)
    assert np.all(np.isfinite(bound)) and np.all(np.abs(tested - exact) <= bound)


def test_a_half_precision_accumulation_is_outside_the_mixed_model_and_diverges():
    """Code that accumulates float16 data in float16 breaks the model's assumption, and the verdict says so:
    a recursive float16 sum of 4096 ones stagnates at 2048 (2049 is not a float16)."""
    ones = np.ones((1, 4096))
    acc = np.float16(0)
    for v in ones[0].astype(np.float16):
        acc = np.float16(acc + v)
    assert float(acc) == 2048.0
    r = verdict.compare(np.array([float(acc)]), np.array([4096.0]),
                        Bound(np.array([4096.0]), 4096, "sum", accumulation=True), "float16")
    assert r.verdict == DIVERGES


def _identity_stage(name, source):
    return verdict.Stage(name, (source,), lambda t: t, lambda t, dtype=None: Bound(np.abs(t), 2, "copy"))


def test_compare_stages_names_the_first_divergence_and_aggregates():
    x = np.linspace(1.0, 2.0, 64)
    stages = [_identity_stage("a", "x"), _identity_stage("b", "a"), _identity_stage("c", "b")]
    good = {"x": x, "a": x, "b": x, "c": x}
    rep = verdict.compare_stages(stages, good, "float32")
    assert rep.verdict == MATCH and rep.first_divergence is None and [r.name for r in rep.stages] == ["a", "b", "c"]
    bad = dict(good, b=x * 1.01, c=x * 1.01)       # b is wrong; c is right *given* b (teacher forcing)
    rep = verdict.compare_stages(stages, bad, "float32")
    assert rep.verdict == DIVERGES and rep.first_divergence == "b"
    assert [r.verdict for r in rep.stages] == [MATCH, DIVERGES, MATCH]
    assert "first divergence at stage 'b'" in str(rep)
    # the false-alarm budget is split between the stages
    assert all(r.p_false_alarm == config.VERDICT_FALSE_ALARM / 3 for r in rep.stages)


def test_compare_stages_is_inconclusive_when_a_stage_is():
    x = np.linspace(1.0, 2.0, 64)
    void = verdict.Stage("v", ("x",), lambda t: t, lambda t, dtype=None: Bound(np.abs(t) * 1e9, 2, "void"))
    rep = verdict.compare_stages([_identity_stage("a", "x"), void], {"x": x, "a": x, "v": x}, "float32")
    assert rep.verdict == INCONCLUSIVE and rep.first_divergence is None


def test_small_ensembles_get_the_rounding_model_member():
    """A two-element output with three members is 6 compared errors: the calibrated factors are for maxima over
    many elements, so the rounding model's sqrt(k) u S joins (thorough profile, LiSA (1, 1, 2) in float32:
    4.5x the largest member, inside the bound)."""
    ref = np.array([1.0, -2.0])
    b = Bound(np.abs(ref), 44)
    members = {f"m{i}": ref * (1 + 1e-8 * (i + 1)) for i in range(3)}
    r = verdict.compare(ref * (1 + 3 * 2.0 ** -24), ref, b, "float32", ensemble=members)
    assert "rounding model" in r.ensemble and r.verdict == MATCH, str(r)
    big = {f"m{i}": np.tile(v, 16) for i, v in enumerate(members.values())}
    r = verdict.compare(np.tile(ref, 16), np.tile(ref, 16), Bound(np.tile(np.abs(ref), 16), 44), "float32",
                        ensemble=big)
    assert "rounding model" not in r.ensemble


def test_members_equal_to_each_other_count_once():
    """Regression (thorough profile, LiSA attention with one channel on a 4 x 4 grid in float64): every sum has one
    term, so the four summation orders gave one output four times; 16 elements x 4 "members" passed the size
    rule, the rounding model stayed out, and torch's fused x w + b (4.9x that single sample, inside the bound)
    diverged.  Identical members are one sample: the rounding model joins."""
    rng = np.random.default_rng(4)
    ref = rng.standard_normal(16)
    b = Bound(np.abs(ref), 123)
    one = ref * (1 + 1e-9 * rng.standard_normal(16))
    r = verdict.compare(ref * (1 + 2e-8), ref, b, "float32", ensemble={f"m{i}": one.copy() for i in range(4)})
    assert "rounding model" in r.ensemble and r.verdict == MATCH, str(r)
    four = {f"m{i}": ref * (1 + 1e-9 * rng.standard_normal(16)) for i in range(4)}
    assert "rounding model" not in verdict.compare(ref * (1 + 2e-9), ref, b, "float32", ensemble=four).ensemble


def test_quantities_below_the_normal_range_are_measured_against_its_floor():
    """exp(-277) = 5e-122 is 0 in float32; its bound k eta_T cannot be relatively small, and T resolves nothing
    finer there: conclusive (thorough profile, elu1 features)."""
    ref = np.array([5.3e-122])
    r = verdict.compare(np.zeros(1), ref, Bound(np.zeros(1), 2), "float32")
    assert r.verdict == MATCH and r.max_relative_bound < 1, str(r)
    r = verdict.compare(np.array([1e-40]), ref, Bound(np.zeros(1), 2), "float32")   # 1e-40: 70000 eta away
    assert r.verdict == DIVERGES


def test_final_rounding_member_includes_the_subnormal_quantum():
    """Regression (CUDA, float64, thorough profile: a numerator with subnormal outputs): the tested output was one
    subnormal quantum (2^-1074) off at an element whose magnitude S is 3e-308, where every other member happened
    to be exact; z = 1.6e-16 there, 8.6x the members' largest.  One rounding into T errs by up to
    u |ref_i| + eta_T (Higham eq. 2.8), so the final-rounding member carries eta_T and one quantum is legitimate;
    two orders of magnitude more is not."""
    eta = verdict.underflow_eta("float64")
    rng = np.random.default_rng(3)
    ref = np.concatenate([rng.standard_normal(64), [-1.0e4 * eta]])
    scale = 20.0 * np.abs(ref) + 1.0         # S >> |ref| (cancellation): one rounding of ref is ~u/20 in z units
    scale[-1] = 3e-308
    b = Bound(scale, 34, accumulation=True)
    members = {f"m{i}": ref + rng.standard_normal(ref.size) * 1e-17 * scale for i in range(4)}
    for m in members.values():
        m[-1] = ref[-1]                                   # exact where the output is subnormal
    one_quantum = ref.copy()
    one_quantum[-1] = ref[-1] + eta
    r = verdict.compare(one_quantum, ref, b, "float64", ensemble=members)
    # z units there: S + eta / u (a rounding errs by u (|x| + eta / u), verdict._weights)
    w_last = 3e-308 + eta / verdict.unit_roundoff("float64")
    assert r.verdict == MATCH and r.ensemble["final rounding"][0] >= eta / w_last, str(r)
    far = ref.copy()
    far[-1] = ref[-1] + 1000 * eta
    assert verdict.compare(far, ref, b, "float64", ensemble=members).verdict == DIVERGES


def test_float64_members_include_the_references_own_error():
    """In float64 the reference is no more accurate than the tested code (equivalence/test_layers.py's
    test_linear[cpu-float64] on an Intel Xeon: torch's MKL GEMM erred 4 u S on one element of a 51-term product,
    every re-run variant at most 1.6 u S, and the 4x criterion called a correct float64 linear layer "diverges").
    The reference's own typical error sqrt(k) u_64 S is a member there; in float32 it is not (the reference is
    2^29 times more accurate), and a defect outside the bound still diverges in float64."""
    rng = np.random.default_rng(7)
    x, wt = rng.standard_normal((4, 51)), rng.standard_normal((51, 12))
    ref = x @ wt
    s = np.abs(x) @ np.abs(wt)
    bound = Bound(s, 52.0, "linear", accumulation=True)
    u = verdict.unit_roundoff("float64")
    members = {f"m{i}": ref + (rng.uniform(-1.6, 1.6, ref.shape) * u * s) for i in range(3)}
    tested = ref.copy()
    tested[1, 1] += 8.0 * u * s[1, 1]
    rep = verdict.compare(tested, ref, bound, "float64", ensemble=members)
    assert rep.verdict == MATCH, str(rep)
    assert rep.zmax > config.VERDICT_MAX_FACTOR * max(z for k, (z, _) in rep.ensemble.items()
                                                      if k != "reference's own error")
    assert "reference's own error" in rep.ensemble
    bad = ref.copy()
    bad[1, 1] += 200.0 * u * s[1, 1]                    # beyond gamma_52(u_64) S: outside the bound
    assert verdict.compare(bad, ref, bound, "float64", ensemble=members).verdict == DIVERGES
    rep32 = verdict.compare(verdict.round_to(ref, "float32"), ref, bound, "float32",
                            ensemble={k: verdict.round_to(v, "float32") for k, v in members.items()})
    assert "reference's own error" not in rep32.ensemble


def test_where_the_worst_case_scale_is_void_the_l2_coefficient_weighs_the_errors():
    """A composite bound whose deterministic scale S is infinite (RALA in bfloat16 at 56 x 56: gamma_K void)
    but whose l2 coefficient sigma is finite: the ensemble criterion measures errors in units of sigma_i, the
    magnitude the probabilistic bound scales with, not of max(|ref_i|, rms(ref)).  sigma_i = |ref_i| + c_i (the
    output's own rounding plus what flows into it, c_i 0.5 or 20) and legitimate errors of 0.3 u sigma_i N(0, 1):
    a defect of 6 u sigma_i (inside the bound lam u sigma_i) on a small element with c_i = 0.5 is caught in units of
    sigma; in units of max(|ref_i|, rms(ref)) the c_i = 20 elements' errors set the threshold everywhere and it
    would pass."""
    rng = np.random.default_rng(7)
    n = 8192
    ref = rng.standard_normal(n)
    sigma = np.abs(ref) + np.where(np.arange(n) % 2 == 0, 0.5, 20.0)
    u = verdict.unit_roundoff("bfloat16")
    b = Bound(np.full(n, np.inf), 40, sigma=sigma, ref_scale=np.abs(ref))
    w = verdict._weights(b, ref, np.isfinite(ref), "bfloat16")
    assert np.array_equal(w, sigma + verdict.underflow_eta("bfloat16"))

    def legit(seed):
        return ref + u * sigma * 0.3 * np.random.default_rng(seed).standard_normal(n)

    members = {f"m{i}": legit(10 + i) for i in range(4)}
    good, bad = legit(99), legit(99)
    i = int(np.argmin(np.where(np.arange(n) % 2 == 0, np.abs(ref), np.inf)))   # the smallest c_i = 0.5 element
    bad[i] = ref[i] + 6 * u * sigma[i]
    assert verdict.compare(good, ref, b, "bfloat16", ensemble=members).verdict == MATCH
    r = verdict.compare(bad, ref, b, "bfloat16", ensemble=members)
    assert r.within_bound and r.verdict == DIVERGES and r.zmax > r.zmax_threshold, str(r)
    # The same comparison in units of max(|ref_i|, rms(ref)) (the weights without sigma) lets the defect through.
    b_plain = Bound(np.full(n, np.inf), 40, ref_scale=np.abs(ref))
    w_plain = verdict._weights(b_plain, ref, np.isfinite(ref), "bfloat16")
    z_bad = abs(bad[i] - ref[i]) / w_plain[i]
    z_legit = max(np.max(np.abs(m - ref) / w_plain) for m in members.values())
    assert z_bad < config.VERDICT_MAX_FACTOR * z_legit


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_subnormal_rounding_weighs_as_much_as_a_normal_one(dtype):
    """z units w_i = S_i + eta_T / u_T: a rounding errs by u_T |x| + eta_T = u_T (|x| + eta_T / u_T) (Higham
    eq. 2.8), so one subnormal quantum at an element of magnitude 0 has z = u_T, as one rounding of a normal
    number of magnitude S has z = u_T S / (S + eta_T / u_T) -> u_T; with the floor eta_T alone the quantum would
    count 1 / u_T times more (lisa's float16 qn stage: entries of 1e-6, below float16's normal range, set the
    stage's threshold at 20 times its normal entries' z)."""
    u, eta = verdict.unit_roundoff(dtype), verdict.underflow_eta(dtype)
    ref = np.array([0.0, 1.0, 1.0e3])
    w = verdict._weights(Bound(np.abs(ref), 1, accumulation=True), ref, np.isfinite(ref), dtype)
    z = np.array([eta, u * 1.0, u * 1.0e3]) / w
    assert z[0] == u
    assert np.all(z[1:] <= u) and np.all(z[1:] >= u / (1.0 + eta / u))
