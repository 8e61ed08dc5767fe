"""Equivalence of generic kernelized linear attention: refimpl/twins/modules/linear.py (PyTorch) against
refimpl.attention.linear, float32 and float64, every available device, through the error model
(refimpl.attention.linear.linear_attention_bound with the tested dtype)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, strategies as st

from equivalence.assertions import assert_matches, naive, to_torch
from refimpl.twins.modules.linear import LinearAttention
from equivalence.strategies import adversarial_arrays
from refimpl import analysis, numerics, verdict
from refimpl.attention import linear as L

NONNEG_MAPS = (("relu", {}), ("elu1", {}), ("softmax", {}), ("l1", {}))
SIGNED_MAPS = (("identity", {}), ("leaky_relu", {"negative_slope": 0.2}), ("leaky_relu", {}),
               ("l1", {"base": "identity", "axis": -2}))


@st.composite
def attention_case(draw, maps):
    """Shapes with N < d and N > d, a feature map, both orders and the normaliser options."""
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    n, m = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    d = draw(st.sampled_from((1, 2, 3, 8, 16, 33, 64)))
    e = draw(st.integers(1, 12))
    fm, opts = draw(st.sampled_from(maps))
    q = draw(adversarial_arrays((b, h, n, d)))
    k = draw(adversarial_arrays((b, h, m, d)))
    v = draw(adversarial_arrays((b, h, m, e)))
    kw = dict(feature_map=fm, feature_map_options=opts,
              eps=draw(st.sampled_from((0.0, 1e-6))), eps_policy=draw(st.sampled_from(("add", "clamp"))),
              clamp_min=draw(st.sampled_from((None, 1.0, 100.0))))
    return q, k, v, kw, draw(st.sampled_from(("linear", "quadratic")))


def _check(device, dtype_name, q, k, v, kw, order, normalize):
    qr, kr, vr = (numerics.round_to(a, dtype_name) for a in (q, k, v))
    mod = LinearAttention(order=order, normalize=normalize, **kw)
    ts = [to_torch(a, dtype_name, device) for a in (qr, kr, vr)]
    with torch.no_grad():
        out = mod(*ts)
    sel = keep = None  # the rows compared (all unless some lose their normaliser in T, below)
    taps: dict = {}
    ref = L.linear_attention(qr, kr, vr, order=order, normalize=normalize, taps=taps, **kw)
    full = ref.shape  # (B, h, N, e): the bounds are broadcast to it before the kept rows are selected
    bound = L.linear_attention_bound(qr, kr, vr, normalize=normalize, dtype=dtype_name, **kw)
    nv = naive(L.linear_attention, qr, kr, vr, order=order, normalize=normalize, dtype_name=dtype_name, **kw)
    if normalize and kw["eps"] == 0 and kw["clamp_min"] is None:
        # Rows whose every feature underflows in T (ELU+1 = exp(x), x < ~-103 in float32) have a zero
        # normaliser in T but not in exact arithmetic: predicted from the reference, they must be NaN in the
        # tested output (0/0) and are excluded from the numeric comparison (no error model covers 0/0).
        fm, opts = kw["feature_map"], kw["feature_map_options"]
        base = {} if fm != "l1" else {"base_q": L.feature_map(qr, opts.get("base", "relu")),
                                      "base_k": L.feature_map(kr, opts.get("base", "relu"))}
        # Also the rows whose normaliser is 0 already in float64 although the exact one is > 0 (features or
        # products below float64's range, which the reference recomputes from log-features and a direct
        # evaluation cannot): positive maps (ELU+1, softmax), or a term with two nonzero non-negative factors.
        positive = (fm in ("elu1", "softmax")) | np.any(
            (taps["phi_q"] > 0) & (taps["phi_k"].sum(axis=-2) > 0)[..., None, :], axis=-1)
        lost = analysis.lost_normaliser_rows(taps["phi_q"], taps["phi_k"], dtype_name, order=order, **base) \
            | ((taps["denominator"] > 0) & (numerics.round_to(taps["denominator"], dtype_name) == 0)) \
            | ((taps["denominator"] == 0) & positive)
        # Rows whose float64 normaliser is subnormal: a direct evaluation in float64 (the twin; float32's
        # fallback) underflows there, so its bound reaches the output's size - no precision available resolves
        # them.  They are checked on their own not to diverge, and left out of the comparison.
        deep = (taps["denominator"] > 0) & (taps["denominator"] < np.finfo(np.float64).tiny) & ~lost
        if lost.any() or deep.any():
            got = out.detach().cpu().double().numpy()
            assert np.all(np.isnan(got[lost])), "rows predicted to lose their normaliser are not NaN"
            if deep.any():
                rep = numerics.compare(got[deep], ref[deep], numerics.Bound(
                    np.broadcast_to(np.asarray(bound.scale), full)[deep], bound.k, bound.note), dtype_name,
                    name="rows with a subnormal float64 normaliser")
                assert rep.verdict != verdict.DIVERGES, str(rep)
            keep = ~(lost | deep)
            bound = numerics.Bound(np.broadcast_to(np.asarray(bound.scale), full)[keep], bound.k, bound.note)
            out, ref = got[keep], ref[keep]
            nv = None if nv is None else nv[keep]
            sel = torch.from_numpy(keep).to(device)
    t64 = [t.double() for t in ts]

    def bound64():
        b = L.linear_attention_bound(qr, kr, vr, normalize=normalize, dtype="float64", **kw)
        return b if sel is None else numerics.Bound(np.broadcast_to(np.asarray(b.scale), full)[keep], b.k, b.note)

    assert_matches(out, ref, bound, dtype_name, naive=nv, name=f"linear attention {kw['feature_map']} {order}",
                   rerun=lambda: mod(*ts) if sel is None else mod(*ts)[sel],
                   higher=lambda: mod(*t64) if sel is None else mod(*t64)[sel], higher_bound=bound64)


@given(attention_case(NONNEG_MAPS), st.booleans())
def test_linear_attention_nonnegative_maps(device, dtype_name, case, normalize):
    """Eq. 4 of L2ViT / FLatten with non-negative feature maps (ReLU, ELU+1, softmax, L1 of ReLU), both
    orders, eps/clamp policies, adversarial inputs: all-negative pre-activations give dead ReLU rows and
    zero normalisers (0/0 = NaN on both sides when eps = 0 and no clamp), large magnitudes, subnormals."""
    q, k, v, kw, order = case
    _check(device, dtype_name, q, k, v, kw, order, normalize)


@given(attention_case(SIGNED_MAPS))
def test_linear_attention_signed_maps_numerator(device, dtype_name, case):
    """Signed feature maps (identity, LeakyReLU, SimA's signed L1; L2ViT Table 1) compared on the numerator
    phi(Q) phi(K)^T V.  With signed maps the normaliser phi(Q_i) . sum phi(K_j) can cancel to ~0, where the
    output is ill-conditioned: the error model's bound becomes infinite there (rounding can reach a zero
    normaliser) and the naive-ratio check compares two noise-dominated errors, so normalised outputs of
    signed maps are compared in tests/test_linear.py (associativity in float64) instead."""
    q, k, v, kw, order = case
    _check(device, dtype_name, q, k, v, kw, order, normalize=False)


def test_elu_plus_one_underflow_finding(device, dtype_name):
    """Finding (ELU+1 feature map, Katharopoulos et al. Eq. 7): the idiomatic ``F.elu(x) + 1`` computes
    (exp(x) - 1) + 1, which is exactly 0 once exp(x) < u/2 (x < about -17 in float32, -37 in float64),
    although ELU(x) + 1 = exp(x) > 0.  A query whose pre-activations are all below that loses every feature:
    its normaliser is 0 and the output 0/0 = NaN, while the reference (exp form) and the exp-form twin
    return the finite convex combination of the values.  Hence the twin's default elu1_form="exp"."""
    q = np.array([[[[-60.0, -45.0], [0.5, -1.0]]]])
    k = np.array([[[[0.3, -0.2], [1.0, 2.0], [-0.5, 0.1]]]])
    v = np.array([[[[1.0], [2.0], [3.0]]]])
    args = [to_torch(a, dtype_name, device) for a in (q, k, v)]
    ref = L.linear_attention(q, k, v, feature_map="elu1")
    assert np.all(np.isfinite(ref))
    exp_mod = LinearAttention(feature_map="elu1", elu1_form="exp")
    with torch.no_grad():
        idiom = LinearAttention(feature_map="elu1", elu1_form="elu_plus_one")(*args).cpu().double().numpy()
        exp_form = exp_mod(*args)
    assert np.isnan(idiom[0, 0, 0, 0]) and np.isfinite(idiom[0, 0, 1, 0])
    assert_matches(exp_form, ref, L.linear_attention_bound(q, k, v, feature_map="elu1", dtype=dtype_name),
                   dtype_name, naive=naive(L.linear_attention, q, k, v, feature_map="elu1", dtype_name=dtype_name),
                   name="exp-form ELU+1", rerun=lambda: exp_mod(*args))
