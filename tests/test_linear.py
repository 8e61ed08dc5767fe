"""Properties of refimpl.attention.linear: associativity of the two orders (the papers' central identity),
clamp/eps semantics, taps, feature maps, the error model's validity and argument checking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from equivalence.strategies import adversarial_arrays, benign_arrays
from refimpl import analysis, config, numerics
from refimpl.attention import linear as L
from tests.kernel_helpers import agree_float64, twice_bound

ALL_MAPS = (("identity", {}), ("relu", {}), ("elu1", {}), ("softmax", {}), ("softmax", {"axis": -2}),
            ("l1", {}), ("l1", {"base": "identity", "axis": -2}), ("l1", {"base": "elu1"}),
            ("leaky_relu", {}), ("leaky_relu", {"negative_slope": 0.3}))
NONNEG_MAPS = tuple(m for m in ALL_MAPS if m[0] in L.NON_NEGATIVE_MAPS and m[1].get("base") != "identity")


@st.composite
def qkv(draw, kinds=adversarial_arrays):
    """(q, k, v) with shapes on both sides of N = d: N, M in 1..48, d in {1, 2, 5, 16, 40, 64}."""
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    n, m = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    d, e = draw(st.sampled_from((1, 2, 5, 16, 40, 64))), draw(st.integers(1, 8))
    return (draw(kinds((b, h, n, d))), draw(kinds((b, h, m, d))), draw(kinds((b, h, m, e))))


@st.composite
def normaliser(draw):
    return dict(eps=draw(st.sampled_from((0.0, 1e-6, 1.0))), eps_policy=draw(st.sampled_from(("add", "clamp"))),
                clamp_min=draw(st.sampled_from((None, 1e-1, 1e2))))


@given(qkv(), st.sampled_from(ALL_MAPS), normaliser(), st.booleans())
def test_associativity_both_orders_agree(arrays, fmap, norm, normalize):
    """L2ViT Eq. 4 / FLatten Eq. 3-4: (phi(Q) phi(K)^T) V = phi(Q) (phi(K)^T V), and the normaliser
    row-sums equal phi(Q) . sum_j phi(K_j).  In float64 the two orders agree within twice the error model
    (linear_attention_bound), for every feature map and normaliser option, N < d and N > d, adversarial
    inputs (dead ReLU rows give 0/0 = NaN in both orders when eps = 0 and no clamp)."""
    q, k, v = arrays
    name, opts = fmap
    kw = dict(feature_map=name, feature_map_options=opts, normalize=normalize, **norm)
    lin = L.linear_attention(q, k, v, order="linear", **kw)
    quad = L.linear_attention(q, k, v, order="quadratic", **kw)
    bound = L.linear_attention_bound(q, k, v, dtype="float64", **kw)
    agree_float64(lin, quad, twice_bound(bound), f"linear vs quadratic order ({name})")


@given(qkv(benign_arrays), st.sampled_from(NONNEG_MAPS))
def test_error_model_covers_naive_float32(arrays, fmap):
    """The error model is valid: a naive float32 evaluation of Eq. 4 (both orders) lies within
    linear_attention_bound(dtype=float32) of the float64 reference on the same float32-rounded inputs.

    Rows whose features all underflow in float32 are predicted, not compared: ELU+1 = exp(x) and the
    softmax over tokens can make every feature of a query 0 in float32 (exp(x) < 2^-150) while the exact
    normaliser is positive, so float32 gives 0/0 = NaN there - no relative error model covers that (the
    finding of test_elu1_feature_underflow_gives_nan_the_audit_predicts).  The test asserts that exactly
    the rows predicted from the float64 reference (analysis.lost_normaliser_rows: the features stored in
    float32 give a zero normaliser; or the normaliser itself rounds to 0) are NaN, and compares all others
    under the bound."""
    q, k, v = (numerics.round_to(a, "float32") for a in arrays)
    name, opts = fmap
    kw = dict(feature_map=name, feature_map_options=opts)
    taps: dict = {}
    ref = L.linear_attention(q, k, v, taps=taps, **kw)
    bound = L.linear_attention_bound(q, k, v, dtype="float32", **kw)
    base = {} if name != "l1" else {"base_q": L.feature_map(q, opts.get("base", "relu")),
                                    "base_k": L.feature_map(k, opts.get("base", "relu"))}
    for order in ("linear", "quadratic"):
        dead32 = analysis.lost_normaliser_rows(taps["phi_q"], taps["phi_k"], "float32", order=order, **base) \
            | ((taps["denominator"] > 0) & (numerics.round_to(taps["denominator"], "float32") == 0))
        keep = ~dead32[..., None] & np.ones(ref.shape, bool)
        scale = np.broadcast_to(np.asarray(bound.scale), ref.shape)[keep]
        out = numerics.naive_same_precision(L.linear_attention, q, k, v, order=order, dtype="float32", **kw)
        assert out.dtype == np.float32
        assert np.all(np.isnan(out[~keep]))
        # The object here is the bound's validity for the naive float32 computation itself, so the naive-ratio
        # part of assert_close (an implementation vs the naive computation) does not apply: pattern + bound.
        report = numerics.compare(out[keep], ref[keep], numerics.Bound(scale, bound.k, bound.note), "float32",
                                  name=f"naive float32 {order} ({name})")
        assert report.pattern_ok and report.within_bound, str(report)


@given(qkv(), st.sampled_from(NONNEG_MAPS + (("identity", {}),)), st.sampled_from((1e-1, 1.0, 1e2)),
       st.sampled_from(("linear", "quadratic")))
def test_clamp_is_exact_where_inactive(arrays, fmap, c_min, order):
    """L2ViT Appendix 8 (Table 10): the normaliser is clamped to [C_min, inf).  Wherever the normaliser is
    >= C_min the clamped output equals the unclamped one bitwise; where it is below, the output is exactly
    the numerator divided by C_min (eps = 0, policy "add")."""
    q, k, v = arrays
    name, opts = fmap
    taps: dict = {}
    free = L.linear_attention(q, k, v, feature_map=name, feature_map_options=opts, order=order, taps=taps)
    clamped = L.linear_attention(q, k, v, feature_map=name, feature_map_options=opts, order=order, clamp_min=c_min)
    den = taps["denominator"]
    active = den >= c_min
    np.testing.assert_array_equal(clamped[active], free[active])
    low = ~active & ~np.isnan(den)
    np.testing.assert_array_equal(clamped[low], (taps["numerator"] / c_min)[low])


@given(qkv(), st.sampled_from(NONNEG_MAPS), st.sampled_from(("linear", "quadratic")))
def test_taps(arrays, fmap, order):
    """The taps protocol: phi(Q), phi(K), KV = phi(K)^T V (exactly the product of the tapped phi's), the
    normaliser, and the N x M matrix "attn" (always in quadratic order, on request in linear order) whose
    rows sum to 1 for non-negative maps without clamp/eps (within the row-sum rounding: the normaliser and
    the row sum are both length-(d + M) computations of the same non-negative terms, so they agree within
    2 gamma_(d+M) relatively), and attn @ V reproduces the output."""
    q, k, v = arrays
    name, opts = fmap
    taps: dict = {"want_attn": True} if order == "linear" else {}
    out = L.linear_attention(q, k, v, feature_map=name, feature_map_options=opts, order=order, taps=taps)
    np.testing.assert_array_equal(taps["phi_q"], L.feature_map(q, name, **opts))
    if order == "linear":
        np.testing.assert_array_equal(taps["kv"], taps["phi_k"].swapaxes(-1, -2) @ v)
        np.testing.assert_array_equal(taps["k_sum"], taps["phi_k"].sum(axis=-2))
    a = taps["attn"]
    assert a.shape == q.shape[:3] + (k.shape[2],)
    live = np.isfinite(taps["denominator"]) & (taps["denominator"] > 0)
    d, m = q.shape[-1], k.shape[2]
    # Gradual underflow: the scores and the normaliser each collect at most eta (d M + M + M ||phi_q_i||_1 + d)
    # absolutely (Higham eq. 2.8), relative to den after the division: added in units of gamma_k(u).
    k_rows = 2 * (d + m) + 1
    eta_rel = (d * m + m + m * np.abs(taps["phi_q"]).sum(axis=-1) + d) * config.FORMAT_MIN_SUBNORMAL["float64"]
    with np.errstate(divide="ignore", invalid="ignore"):
        under = np.where(live, eta_rel / taps["denominator"], 0.0) / numerics.gamma(k_rows, numerics.unit_roundoff("float64"))
    numerics.assert_close(np.where(live, a.sum(axis=-1), 1.0), np.ones(live.shape),
                          numerics.Bound(1.0 + under, k_rows, "row sum vs normaliser, with underflow"),
                          "float64", name="attn row sums")
    bound = L.linear_attention_bound(q, k, v, feature_map=name, feature_map_options=opts, dtype="float64")
    numerics.assert_close(a @ v, out, numerics.Bound(2 * np.asarray(bound.scale), bound.k + m), "float64",
                          name="attn @ v vs output")
    plain: dict = {}
    L.linear_attention(q, k, v, feature_map=name, feature_map_options=opts, taps=plain)
    assert "attn" not in plain and "kv" in plain


@given(qkv(benign_arrays), st.sampled_from(NONNEG_MAPS))
def test_output_is_convex_combination_of_values(arrays, fmap):
    """For non-negative phi, eps = 0 and no clamp, Eq. 3 makes each output row a convex combination of the
    value rows: min_j v_je <= O_ie <= max_j v_je, up to the error model's bound."""
    q, k, v = arrays
    name, opts = fmap
    out = L.linear_attention(q, k, v, feature_map=name, feature_map_options=opts)
    b = L.linear_attention_bound(q, k, v, feature_map=name, feature_map_options=opts, dtype="float64")
    slack = b.array("float64", out.shape)
    ok = np.isnan(out) | ((out >= v.min(axis=2, keepdims=True) - slack) & (out <= v.max(axis=2, keepdims=True) + slack))
    assert ok.all()


@given(st.data())
def test_feature_maps(data):
    """Feature-map definitions (L2ViT Table 1; Katharopoulos et al. Eq. 7): ReLU and ELU+1 are
    non-negative (ELU+1 > 0 for finite x), L1 of ReLU rows sum to 1 unless ||ReLU(x)||_1 < eps (then
    they are ReLU(x) / eps, F.normalize's clamp), row softmax sums to 1,
    LeakyReLU keeps signs; the error coefficients of ReLU and identity are exactly 0."""
    x = data.draw(adversarial_arrays((2, 3, 7, data.draw(st.integers(1, 20)))))
    assert np.all(L.feature_map(x, "relu") >= 0)
    assert np.all(L.feature_map(np.clip(x, -700, None), "elu1") > 0)
    l1 = L.feature_map(x, "l1")
    alive = np.sum(np.maximum(x, 0), axis=-1) >= config.LINEAR_L1_EPS  # below eps the clamp takes over
    row = np.where(alive, l1.sum(axis=-1), 1.0)
    n = x.shape[-1]
    numerics.assert_close(row, np.ones_like(row), numerics.Bound(np.ones_like(row), 2 * n + 1, "l1 row sum"),
                          "float64", name="l1 row sums")
    np.testing.assert_array_equal(l1[~alive], (np.maximum(x, 0) / config.LINEAR_L1_EPS)[~alive])
    sm = L.feature_map(x, "softmax")
    numerics.assert_close(sm.sum(axis=-1), np.ones(sm.shape[:-1]),
                          numerics.Bound(L.feature_map_error(x, "softmax").sum(axis=-1) + n, 1, "softmax row sum"),
                          "float64", name="softmax row sums")
    lr = L.feature_map(x, "leaky_relu", negative_slope=0.5)
    np.testing.assert_array_equal(np.sign(lr), np.sign(x))
    np.testing.assert_array_equal(L.feature_map_error(x, "relu"), 0.0)
    np.testing.assert_array_equal(L.feature_map_error(x, "identity"), 0.0)


def test_quadratic_guard_and_argument_errors():
    """Quadratic paths refuse sizes above max_elements and point to order='linear'; bad arguments raise
    errors naming the argument."""
    q = np.ones((1, 2, 5, 3))
    with pytest.raises(ValueError, match="order='linear'"):
        L.linear_attention(q, q, q, order="quadratic", max_elements=49)
    with pytest.raises(ValueError, match="order='linear'"):
        L.linear_attention(q, q, q, taps={"want_attn": True}, max_elements=49)
    L.linear_attention(q, q, q, order="quadratic", max_elements=50)
    with pytest.raises(ValueError, match="argument 'k'"):
        L.linear_attention(q, np.ones((1, 2, 5, 4)), q)
    with pytest.raises(ValueError, match="argument 'v'"):
        L.linear_attention(q, q, np.ones((1, 2, 4, 3)))
    with pytest.raises(TypeError, match="argument 'q'"):
        L.linear_attention(q.astype(int), q, q)
    with pytest.raises(ValueError, match="feature_map"):
        L.linear_attention(q, q, q, feature_map="gelu")
    with pytest.raises(ValueError, match="order"):
        L.linear_attention(q, q, q, order="fast")
    with pytest.raises(ValueError, match="eps_policy"):
        L.linear_attention(q, q, q, eps_policy="max")
    with pytest.raises(TypeError, match="negative_slope"):
        L.linear_attention(q, q, q, feature_map="relu", feature_map_options={"negative_slope": 0.1})


def test_dead_features_give_nan_not_a_guess():
    """All-negative pre-activations kill every ReLU feature: Eq. 4's normaliser is 0 and the output 0/0 is
    NaN (propagated honestly); an eps or L2ViT's clamp turns it into 0."""
    q = -np.ones((1, 1, 3, 4))
    k = np.ones((1, 1, 5, 4))
    v = np.ones((1, 1, 5, 2))
    assert np.all(np.isnan(L.linear_attention(q, k, v)))
    np.testing.assert_array_equal(L.linear_attention(q, k, v, eps=1e-6), 0.0)
    np.testing.assert_array_equal(L.linear_attention(q, k, v, clamp_min=100.0), 0.0)


def test_elu1_feature_underflow_gives_nan_the_audit_predicts():
    """Finding: phi(x) = ELU(x) + 1 = exp(x) for x <= 0 underflows to exactly 0 in float32 for x below
    about -103.3 (exp(x) < 2^-150).  A query whose features all underflow has a zero normaliser: float32
    gives 0/0 = NaN where the exact (float64) output is a finite convex combination of the values.  The
    precision audit predicts it from the float64 reference alone (the normaliser underflows to 0 in
    float32).  (The idiomatic F.elu(x) + 1 is worse: (exp(x) - 1) + 1 is 0 already below about -17 in
    float32; see equivalence/test_linear.py.)"""
    from refimpl import analysis
    q = np.array([[[[-120.0, -110.0], [0.5, -1.0]]]])
    k = np.array([[[[0.3, -0.2], [1.0, 2.0], [-0.5, 0.1]]]])
    v = np.array([[[[1.0], [2.0], [3.0]]]])
    ref = L.linear_attention(q, k, v, feature_map="elu1")
    f32 = numerics.naive_same_precision(L.linear_attention, q, k, v, feature_map="elu1", dtype="float32")
    assert np.all(np.isfinite(ref)) and np.isnan(f32[0, 0, 0, 0]) and np.isfinite(f32[0, 0, 1, 0])
    audit = analysis.precision_audit(q, k, v, feature_map="elu1", formats=("float32",))
    assert audit.predicts_nonfinite("float32")
    assert audit.entry("denominator").verdicts["float32"].n_underflow == 1
