"""Properties of refimpl.analysis: numerical rank, FLatten's rank bound (Eq. 9) and rank restoration by
the DWC (Eq. 11), the DWC matrix against an independent convolution, attention entropy and the precision
audit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.signal
from hypothesis import given, strategies as st

from equivalence.strategies import adversarial_arrays, benign_arrays
from refimpl import analysis as A, config, layers, numerics
from refimpl.attention import linear as L

MAPS = ("relu", "elu1", "softmax", "l1", "identity", "leaky_relu")


@given(st.data())
def test_numerical_rank_is_numpys_convention(data):
    """The documented threshold s > RANK_RTOL_FACTOR max(m, n) eps s_max with factor 1 is exactly
    numpy.linalg.matrix_rank's default; checked on stacks of products of random factors of known rank."""
    m, n, r = data.draw(st.integers(1, 30)), data.draw(st.integers(1, 30)), data.draw(st.integers(1, 30))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    a = rng.standard_normal((3, m, r)) @ rng.standard_normal((3, r, n))
    got = A.numerical_rank(a)
    np.testing.assert_array_equal(got, np.linalg.matrix_rank(a))
    assert np.all(got <= min(m, n, r))


@given(st.data())
def test_rank_bound_eq9(data):
    """FLatten Eq. 9: rank(phi(Q) phi(K)^T) <= min(rank phi(Q), rank phi(K)) <= min(N, d), for every
    feature map, with N < d and N > d (normalised or not - diag(1/den) does not raise the rank); the KV
    buffer's rank is <= min(d, e, M) and the per-head output's <= min(N, d, e)."""
    b, h = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    n, m = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40))
    d, e = data.draw(st.integers(1, 24)), data.draw(st.integers(1, 8))
    q, k = data.draw(benign_arrays((b, h, n, d))), data.draw(benign_arrays((b, h, m, d)))
    v = data.draw(benign_arrays((b, h, m, e)))
    fm = data.draw(st.sampled_from(MAPS))
    rep = A.linear_attention_ranks(q, k, v, feature_map=fm, eps=1e-6)
    assert rep.bound == min(n, m, d)
    assert np.all(rep.attn <= np.minimum(rep.phi_q, rep.phi_k)) and np.all(rep.attn <= min(n, d))
    assert np.all(rep.kv <= min(d, e, m)) and np.all(rep.output <= min(n, d, e))


@given(st.data())
def test_dwc_matrix_is_the_convolution(data):
    """M_DWC (FLatten Eq. 11) is the matrix of PyTorch's zero-padded cross-correlation: M vec(X) equals an
    independent evaluation (scipy.signal.correlate2d on the explicitly padded grid), for odd and even
    kernels, padding "same" (asymmetric for even kernels), integer padding and dilation; and equals
    refimpl.layers.depthwise_conv2d.  Both are float64 sums of kh kw products: within twice gamma_(kh kw)."""
    kh, kw = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    dil = data.draw(st.sampled_from((1, 2)))
    padding = data.draw(st.sampled_from(("same", 0, 1, (kh // 2, kw // 2))))
    pads = layers.conv_padding(padding, (kh, kw), (1, 1), (dil, dil))
    hh = data.draw(st.integers(max(1, dil * (kh - 1) + 1 - pads[0] - pads[1]), 9))
    ww = data.draw(st.integers(max(1, dil * (kw - 1) + 1 - pads[2] - pads[3]), 9))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    ker, img = rng.standard_normal((kh, kw)), rng.standard_normal((hh, ww))
    mat = A.dwc_matrix(ker, hh, ww, padding=padding, dilation=dil)
    dk = np.zeros((dil * (kh - 1) + 1, dil * (kw - 1) + 1))
    dk[::dil, ::dil] = ker
    oracle = scipy.signal.correlate2d(np.pad(img, ((pads[0], pads[1]), (pads[2], pads[3]))), dk, mode="valid")
    got = (mat @ img.ravel()).reshape(oracle.shape)
    scale = scipy.signal.correlate2d(np.pad(np.abs(img), ((pads[0], pads[1]), (pads[2], pads[3]))),
                                     np.abs(dk), mode="valid")
    bound = numerics.Bound(2 * scale, kh * kw, "two float64 sums of kh kw products")
    numerics.assert_close(got, oracle, bound, "float64", name="dwc matrix vs correlate2d")
    conv = layers.depthwise_conv2d(img[None, None], ker[None, None], padding=padding, dilation=dil)[0, 0]
    numerics.assert_close(got, conv, bound, "float64", name="dwc matrix vs depthwise_conv2d")
    assert mat.nnz <= kh * kw * oracle.size


@given(st.data())
def test_dwc_restores_full_rank(data):
    """FLatten §4.2, Eq. 11 and Fig. 5: with N > d, rank(phi(Q) phi(K)^T) <= d < N, while the equivalent
    matrix M_eq = A + M_DWC of generic (Gaussian) weights reaches full rank N, for odd and even kernels."""
    hh, ww = data.draw(st.integers(3, 7)), data.draw(st.integers(3, 7))
    n = hh * ww
    d = data.draw(st.integers(1, min(8, n - 1)))
    ks = data.draw(st.sampled_from((3, 5, 2, 4)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    q, k, v = (rng.standard_normal((1, 1, n, d)) for _ in range(3))
    taps: dict = {"want_attn": True}
    L.linear_attention(q, k, v, taps=taps, eps=1e-6)
    attn = taps["attn"][0, 0]
    meq = A.equivalent_attention_matrix(attn, rng.standard_normal((ks, ks)), hh, ww)
    assert A.numerical_rank(attn) <= d < n
    assert A.numerical_rank(meq) == n


@given(st.data())
def test_attention_entropy(data):
    """Concentration (L2ViT §4.2; FLatten §4.1): 0 <= H_i <= log M, H = log M exactly for uniform rows,
    0 for one-hot rows; invariant under scaling of a row (renormalised)."""
    n, m = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 30))
    a = np.abs(data.draw(benign_arrays((2, n, m)))) + 1e-3
    ent = A.attention_entropy(a)
    assert np.all(ent >= 0) and np.all(ent <= math.log(m) * (1 + 4 * m * numerics.unit_roundoff("float64")))
    np.testing.assert_array_equal(A.attention_entropy(np.eye(m)), 0.0)
    uni = A.attention_entropy(np.ones((1, m)), normalized=True)
    numerics.assert_close(uni, np.ones(1) if m > 1 else np.zeros(1),
                          numerics.Bound(np.ones(1), 2 * m + 4, "m terms of entr + log"), "float64")
    numerics.assert_close(A.attention_entropy(a * 8.0), ent, numerics.Bound(np.full(ent.shape, math.log(m) + 1),
                                                                          4 * m + 8, "entropy"), "float64")
    with pytest.raises(ValueError, match="negative"):
        A.attention_entropy(-a)


def test_softmax_attention_is_more_concentrated_than_relu_linear():
    """The papers' observation (L2ViT Fig. 2, FLatten Fig. 3) as a measurable fact on one fixed example:
    with sharp logits (scale 4 d^-1/2), softmax attention's mean row entropy is below ReLU linear
    attention's on the same Q, K (reported in docs/linear.md)."""
    from refimpl.attention.softmax import softmax_attention
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 1, 64, 16)) * 2, rng.standard_normal((1, 1, 64, 16)) * 2
    ts: dict = {}
    softmax_attention(q, k, np.ones((1, 1, 64, 1)), taps=ts)
    tl: dict = {"want_attn": True}
    L.linear_attention(q, k, np.ones((1, 1, 64, 1)), taps=tl)
    assert A.attention_entropy(ts["attn"]).mean() < A.attention_entropy(tl["attn"]).mean()


@given(adversarial_arrays((3, 17)), st.sampled_from(("float16", "bfloat16", "float32")))
def test_format_storage_matches_rounding(x, fmt):
    """format_storage counts overflow at |x| >= 2^emax (2 - u) - the round-to-nearest threshold - which is
    exactly where rounding to the format gives inf; the largest finite value itself does not overflow."""
    xs = np.concatenate([x.ravel() * s for s in (1.0, 1e3, 1e-3, 1e30, 1e-30)])
    ver = A.format_storage(xs, fmt)
    with np.errstate(over="ignore"):
        r = numerics.round_to(xs, fmt)
    assert ver.n_overflow == int(np.sum(np.isinf(r) & np.isfinite(xs)))
    assert ver.n_underflow == int(np.sum((r == 0) & (xs != 0)))
    edge = np.array([config.FORMAT_MAX_FINITE[fmt]])
    assert A.format_storage(edge, fmt).n_overflow == 0 and A.format_storage(-edge, fmt).max_rel_error == 0.0


def test_precision_audit_predicts_float16_overflow_and_xp_underflow():
    """The audit predicts what float16 does to the intermediates, from the float64 reference alone:
    (1) a KV buffer of magnitude > 65504 (N = 1024 tokens of activations ~ 20, non-negative values)
    overflows in float16, and a naive float16 evaluation of Eq. 4 indeed returns Inf/NaN; with activations
    ~ 0.6 nothing overflows and
    float16 stays finite.  (2) FLatten Eq. 6 taken literally: x^p with p = 32 overflows for x >= 1.42
    (65504^(1/32)) and underflows to all-zero rows for max x < 0.582 (2^(-25/32)), a 0/0 in f_p; the
    max-normalised power never loses a row."""
    rng = np.random.default_rng(1)
    big = [rng.standard_normal((1, 1, 1024, 16)) * 20 for _ in range(3)]
    big[2] = np.abs(big[2])  # non-negative values (e.g. after a GELU/ReLU): the KV sums do not cancel
    audit = A.precision_audit(*big)
    assert audit.entry("kv").verdicts["float16"].n_overflow > 0 and audit.predicts_nonfinite("float16")
    assert not audit.predicts_nonfinite("bfloat16")
    with np.errstate(all="ignore"):
        f16 = numerics.naive_same_precision(L.linear_attention, *big, dtype="float16")
    assert not np.all(np.isfinite(f16))
    small = [a * 0.03 for a in big]
    assert not A.precision_audit(*small).predicts_nonfinite("float16")
    with np.errstate(all="ignore"):
        assert np.all(np.isfinite(numerics.naive_same_precision(L.linear_attention, *small, dtype="float16")))
    q = np.abs(rng.standard_normal((1, 1, 8, 16))) * 0.01  # rows' max set below
    q[0, 0, :, -1] = np.linspace(0.3, 0.57, 8)
    audit = A.precision_audit(q, q, q, focus_p=32.0)
    assert audit.entry("q_pow").verdicts["float16"].n_zero_rows == 8
    assert audit.entry("q_pow_maxnorm").verdicts["float16"].n_zero_rows == 0
    assert any("q_pow" in r for r in audit.reasons("float16"))
    audit_big = A.precision_audit(q * 4, q, q, focus_p=32.0)
    assert audit_big.entry("q_pow").verdicts["float16"].n_overflow > 0


def test_analysis_argument_errors():
    """Bad arguments raise errors naming the argument; quadratic analyses keep the memory guard."""
    with pytest.raises(ValueError, match="NaN"):
        A.numerical_rank(np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="height"):
        A.equivalent_attention_matrix(np.eye(6), np.ones((3, 3)), 2, 2)
    with pytest.raises(ValueError, match="max_elements"):
        A.equivalent_attention_matrix(np.eye(6), np.ones((3, 3)), 2, 3, max_elements=10)
    with pytest.raises(ValueError, match="padding"):
        A.equivalent_attention_matrix(np.eye(4), np.ones((3, 3)), 2, 2, padding=0)
    with pytest.raises(ValueError, match="fmt"):
        A.format_storage(np.ones(2), "float8")
    with pytest.raises(ValueError, match="focus_p"):
        A.precision_audit(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), focus_p=0.5)
