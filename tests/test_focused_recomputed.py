"""FLatten's rows recomputed from log-features (focused_range.recompute_rows): the rebalancing they use, the
error of the log-features (focused_underflow.log_focused_error) against 200-bit mpmath, and the bound those
rows now have (focused_bounds.recomputed_error; before, they had none: inf, "inconclusive").

The case that found it (the equivalence suite's thorough profile, ``test_focused_attention_core[cpu-float64]``,
subnormal kind, one token): a query row whose largest channel meets only zero keys and whose other channels
meet keys through products near 2^-1030.  The rebalancing picked the keyless channel as the row's largest
product, left the rebalanced normaliser subnormal and the recomputed output 4.9e-13 off (relative); a channel
where every key is 0 now takes no part in the rebalancing (normaliser_range.rebalance_parts).

References: FLatten Eq. 4-6 (focused_range H2-H3); normaliser_range (R1, R2); Higham (2002) §3.1.
"""

from __future__ import annotations

import dataclasses

import mpmath
import numpy as np
from hypothesis import given, settings, strategies as st

from refimpl import numerics
from refimpl.attention import focused as F
from refimpl.attention.focused_range import flagged_rows, live_rows, log_focused
from refimpl.attention.focused_underflow import log_focused_error
from refimpl.attention.normaliser_range import rebalance
from tests.test_focused_range import _direct, _mp_attention, _mp_fp

U = numerics.unit_roundoff("float64")

# the thorough profile's case: B = 1, h = 1, one token, d = 8 (head 0 of the drawn example)
_Q = np.array([-1.13165961e-310, 8.42986879e-311, -1.38231235e+000, 1.99863724e+000,
               7.62908595e-311, 1.31665867e-310, 5.27960096e-311, 1.66596798e-310])
_K = np.array([1.51281897e+000, -8.16822660e-001, -4.87742423e-001, -2.93563187e-001,
               -1.71431521e-310, -1.56705580e-310, 1.12184279e-310, 4.96289536e-001])


def _case(n_keys: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = _Q.reshape(1, 1, 1, 8)
    k = np.tile(_K, (n_keys, 1)).reshape(1, 1, n_keys, 8)
    k = k * np.where(k > 1e-300, 1.0 + rng.random(k.shape), 1.0)        # distinct keys, same support
    v = rng.standard_normal((1, 1, n_keys, 8))
    return q, k, v


def _flagged(q, k, p, eps=0.0, normaliser="sum"):
    from refimpl.attention.focused_core import _range_features
    from refimpl.feature_maps import focused_function
    pq, pk, info = _range_features(np.maximum(q, 0), np.maximum(k, 0), p, None, fp=focused_function)
    return flagged_rows(pq, pk, info, eps, normaliser) & live_rows(info.a_q, info.a_k, eps)


def test_rebalanced_normaliser_is_at_least_one_with_a_keyless_channel():
    """normaliser_range.rebalance: the largest of each rebalanced factor is 1 and the normaliser
    phi_q' . sum_j phi_k' is >= 1 (its defining property), also where the row's largest log-feature is in a
    channel every key has 0 in (before: 4e-311)."""
    a_q, a_k = np.maximum(_Q, 0).reshape(1, 1, 1, 8), np.maximum(_K, 0).reshape(1, 1, 1, 8)
    with np.errstate(divide="ignore"):
        lq, lk = log_focused(np.log(a_q), 1.0), log_focused(np.log(a_k), 1.0)
    pq, pk, _ = rebalance(lq, lk)
    den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
    assert np.all(den >= 1.0) and np.all(np.isfinite(pq)) and np.max(pq) == 1.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1.0, 2.0, 3.0, 8.0, 32.0]), st.integers(-1074, 1000),
       st.integers(2, 9))
def test_log_focused_error_bounds_the_log_features(seed, p, e, d):
    """|log_focused(log a) - log f_p(a)| <= u E (E = log_focused_error) against 200-bit mpmath, for pre-features
    spread over 2^e .. 2^(e+60) with zeros (the log-features of any magnitude, H3)."""
    rng = np.random.default_rng(seed)
    a = np.ldexp(1.0 + rng.random((3, d)), e + rng.integers(0, 60, (3, d)))
    a = np.where(rng.random((3, d)) < 0.25, 0.0, a)
    a[:, 0] = np.where(np.all(a == 0, axis=-1), 1.0, a[:, 0])
    with np.errstate(divide="ignore"):
        got = log_focused(np.log(a), p)
    e_log = log_focused_error(a, p)
    for i in range(a.shape[0]):
        exact = _mp_fp(a[i], p)
        for c in range(d):
            if a[i, c] == 0:
                assert got[i, c] == -np.inf and e_log[i, c] == 0.0
                continue
            err = abs(mpmath.mpf(float(got[i, c])) - mpmath.log(exact[c]))
            assert err <= e_log[i, c] * U, (float(err / U), e_log[i, c])


def test_recomputed_row_has_a_bound_that_holds():
    """The found case (and with three keys): the row is recomputed, its bound is finite, and it bounds the
    definition's distance to the 200-bit value and a direct float64 evaluation's (the twin's arithmetic)."""
    for n_keys in (1, 3):
        q, k, v = _case(n_keys)
        assert _flagged(q, k, 1.0).all()
        ref = F.focused_attention(q, k, v, p=1.0)
        exact = _mp_attention(np.maximum(q, 0), np.maximum(k, 0), v, 1.0, 0.0, "sum")
        bound = F.focused_attention_bound(q, k, v, p=1.0, dtype="float64")
        tol = bound.array("float64", ref.shape)
        assert np.all(np.isfinite(tol))
        assert np.all(np.abs(ref - exact) <= tol)
        got = _direct(q, k, v, 1.0, np.float64)
        assert np.all(np.abs(got - exact) <= tol)
        assert numerics.compare(got, ref, bound, "float64").verdict == "match"


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1.0, 3.0, 8.0]), st.integers(-1074, -1000),
       st.sampled_from([(0.0, "sum"), (1e-300, "sum"), (1e-300, "mean_scaled")]))
def test_recomputed_rows_bound_covers_the_definition(seed, p, e, policy):
    """Rows whose products fall below 2^-960 (a query's live channels meet keys only through channels far
    below their largest): where the definition recomputes them, the reference's part of the bound
    (recomputed_error in float64) is finite and bounds its distance to the 200-bit value."""
    eps, normaliser = policy
    rng = np.random.default_rng(seed)
    d, n = 4, 3
    q = np.abs(rng.standard_normal((1, 1, 3, d)))
    k = np.abs(rng.standard_normal((1, 1, n, d)))
    k[..., 0], q[..., 0] = 0.0, 2.0 + q[..., 0]            # channel 0: the queries' largest, no key
    q[..., 3], k[..., 3] = 0.0, 1.0 + k[..., 3]            # channel 3: the keys' largest, no query
    q[..., 1:3] = np.ldexp(q[..., 1:3], e + 500)            # the shared channels far down: products below
    k[..., 1:3] = np.ldexp(k[..., 1:3], -480)               # 2^-960 in every unit the band allows
    rows = _flagged(q, k, p, eps, normaliser)
    assert rows.any()
    v = rng.standard_normal((1, 1, n, d))
    ref = F.focused_attention(q, k, v, p=p, eps=eps, normaliser=normaliser)
    bound = F.focused_attention_bound(q, k, v, p=p, eps=eps, normaliser=normaliser, dtype="float64")
    # the definition's own tolerance: the reference part of the bound (ref_scale), the tested part zeroed
    # (a direct evaluation of these rows may have none: its features or products underflow to 0)
    tol = dataclasses.replace(bound, scale=np.zeros(ref.shape)).array("float64", ref.shape)
    assert np.all(np.isfinite(tol[rows]))
    exact = _mp_attention(q, k, v, p, eps, normaliser)
    ok = np.isfinite(exact)
    assert np.all(np.abs(ref - exact)[ok] <= tol[ok]), float(np.max((np.abs(ref - exact) / tol)[ok]))


def test_module_rows_far_below_their_token_have_a_bound_that_holds():
    """The released norm scope (f_p over the whole token): with p = 32 and large inputs, a head whose channels
    are far below the token's largest gets features near 1e-295, below 2^-969, where the module bound's own
    float64 underflow terms underflow (the thorough profile's ``test_focused_linear_attention_module[float32]``
    case: before, those rows had no bound, and float32 and float64 were both "inconclusive").  Now every
    product's eta_T is counted from the log-features (focused_underflow.log_direct_underflow): the bound is
    finite and the twin, in float32 and float64, is within it."""
    import torch
    from equivalence.assertions import load_numpy_state
    from equivalence.test_focused import _module_inputs
    from refimpl.twins.modules import focused as TF
    cfg = F.FocusedConfig.preset("official", dim=16, num_heads=4, sr_ratio=1, p=32.0, kernel_size=3)
    hw = (4, 4)
    for dtype, tdt in (("float32", torch.float32), ("float64", torch.float64)):
        x, params = _module_inputs(0, cfg, "global", hw, 16, "large", None, dtype)
        ref = F.focused_linear_attention(x, params, cfg, hw)
        bound = F.focused_linear_attention_bound(x, params, cfg, hw, dtype=dtype)
        assert np.all(np.isfinite(np.asarray(bound.scale)))
        m = TF.FocusedLinearAttention(cfg, 16).to(dtype=tdt)
        load_numpy_state(m, params)
        with torch.no_grad():
            got = m(torch.from_numpy(x).to(tdt), hw).double().numpy()
        assert numerics.compare(got, ref, bound, dtype).verdict == "match"


def _module_case(dtype):
    """The paper preset (p = 1) on 4 channels, one head: q = x (channel 0 large, channel 1 at 2^-500), k takes
    x's channel 0 to channel 2 and keeps channel 1: every query meets the keys only through channel 1, products
    near 2^-1000 in every unit the rescaling allows (below 2^-960: the definition recomputes every row; above
    2^-1022: a direct float64 evaluation has a normaliser, with subnormal-free products)."""
    rng = np.random.default_rng(3)
    cfg = F.FocusedConfig.preset("paper", dim=4, num_heads=1, sr_ratio=1, p=1.0, kernel_size=3)
    hw = (2, 2)
    x = np.zeros((1, 4, 4))
    x[..., 0] = 1.0 + rng.random(4)
    x[..., 1] = np.ldexp(1.0 + rng.random(4), -500)
    x[..., 3] = rng.standard_normal(4)
    params = {key: np.asarray(val, dtype=np.float64) for key, val in F.init_focused_params(cfg, layout="global",
                                                                                           n_kv=4, seed=1).items()}
    wq, wkv = np.zeros((4, 4)), np.zeros((8, 4))
    wq[0, 0] = wq[1, 1] = 1.0
    wkv[2, 0] = wkv[1, 1] = 1.0
    wkv[4:, :] = rng.standard_normal((4, 4))           # V
    params["q.weight"], params["kv.weight"] = wq, wkv
    for key in ("q.bias", "kv.bias"):
        if key in params:
            params[key] = np.zeros_like(params[key])
    rounded = {key: numerics.round_to(val, dtype) for key, val in params.items()}
    return cfg, hw, numerics.round_to(x, dtype), rounded


def test_module_recomputed_rows_have_a_bound_that_holds():
    """A module whose rows the definition recomputes from log-features (focused_bounds._module_recomputed:
    recomputed_error with the pre-features' errors propagated into the log-features, the larger of it and the
    direct model): the bound is finite (before: inf, "inconclusive") and the float64 twin is within it.  (With
    p = 3 the direct features of channel 1 underflow to 0, a direct evaluation has no normaliser, and the bound
    stays inf there: a direct implementation's finite output could not be bounded.)"""
    import torch
    from equivalence.assertions import load_numpy_state
    from refimpl.attention.focused_core import _scaled_features
    from refimpl.twins.modules import focused as TF
    cfg, hw, x, params = _module_case("float64")
    q, kv = x @ params["q.weight"].T, x @ params["kv.weight"].T
    pq, pk, info = _scaled_features(q, kv[..., :4], params, cfg)
    from refimpl.attention.focused_range import flagged_rows as fr
    assert np.all(fr(pq, pk, info, cfg.eps, cfg.normaliser) & live_rows(info.a_q, info.a_k, cfg.eps))
    ref = F.focused_linear_attention(x, params, cfg, hw)
    bound = F.focused_linear_attention_bound(x, params, cfg, hw, dtype="float64")
    assert np.all(np.isfinite(np.asarray(bound.scale)))
    m = TF.FocusedLinearAttention(cfg, 4).double()
    load_numpy_state(m, params)
    with torch.no_grad():
        got = m(torch.from_numpy(x), hw).numpy()
    assert numerics.compare(got, ref, bound, "float64").verdict == "match"
