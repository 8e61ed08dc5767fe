"""The typical error of FLatten's normalised linear attention (refimpl.attention.focused_typical
attention_typical / attention_variances): the expected squared l2 coefficient of each output's roundings, the z
unit of the stage-wise verdict for the stage "attention".

The model is an expectation over random orders of every sum, first order in u.  A random-rounding simulation of
the same evaluation (every rounding an independent uniform relative error in [-u, u], of variance u^2 / 3; every
sum left to right in a fresh random order of its terms) therefore has E[err^2] = u^2 var / 3 exactly to first
order, and the test is two-sided: the simulated mean of z^2 = err^2 / (u^2 var) lies within five standard errors
(estimated from the trials themselves) of 1/3 - safe and tight at once.  Both orders, both normalisers, T's own
accumulation (float32) and mixed precision (float16 data, float32 sums).  Real torch evaluations in float32,
float16 and bfloat16 (the twin's order) stay within F_max u typical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from refimpl import config, numerics, verdict
from refimpl.attention import focused as r_foc
from refimpl.attention.focused_typical import attention_typical, attention_variances
from refimpl.twins.modules.focused import _attend as twin_attend

EPS = 1e-6
TRIALS = 160
#: Standard errors allowed between the simulated mean of z^2 and its expectation 1/3: a normal deviate beyond 5
#: has probability 5.7e-7 (the trial means are independent; each averages many elements).
SE = 5.0


def _inputs(rng, n=24, d=8, e=6):
    q = np.abs(rng.standard_normal((1, 2, n, d))) + 0.05
    k = np.abs(rng.standard_normal((1, 2, n, d))) + 0.05
    v = rng.standard_normal((1, 2, n, e))
    return q, k, v


class _Rounder:
    """fl(x) = x (1 + delta), delta uniform in [-u, u]; u = 0 is exact."""

    def __init__(self, rng):
        self.rng = rng

    def __call__(self, x, u):
        return x * (1.0 + self.rng.uniform(-u, u, size=np.shape(x))) if u else x


def _sum(rnd, terms, axis, u_add, u_store):
    """sum over ``axis`` left to right in a random order, each addition rounded at u_add, the result stored at
    u_store (0: already T's last addition)."""
    terms = np.moveaxis(terms, axis, 0)
    order = rnd.rng.permutation(terms.shape[0])
    acc = terms[order[0]]
    for j in order[1:]:
        acc = rnd(acc + terms[j], u_add)
    return rnd(acc, u_store)


def _simulate(q, k, v, normaliser, order, mixed, rnd):
    """One evaluation with random roundings: the linear order as the twin computes it (``mean_scaled``: K and V
    scaled by n^-1/2, z = 1 / (Q . mean(K) + eps), y = (Q (K^T V)) z), the quadratic order with the normaliser
    "sum" (y = (S V) / (sum_j S_j + eps), S = Q K^T)."""
    u_t = numerics.unit_roundoff("float16" if mixed else "float32")
    u_a = numerics.unit_roundoff("float32")
    u_prod = 0.0 if mixed else u_t                   # half-precision products are exact in float32
    u_store = u_t if mixed else 0.0
    n = k.shape[-2]
    if order == "linear":
        assert normaliser == "mean_scaled"
        c = n ** -0.5
        kc, vc = rnd(k * c, u_t), rnd(v * c, u_t)
        kv = _sum(rnd, rnd(kc[..., :, :, None] * vc[..., :, None, :], u_prod), -3, u_a, u_store)
        num = _sum(rnd, rnd(q[..., :, :, None] * kv[..., None, :, :], u_prod), -2, u_a, u_store)
        ksum = _sum(rnd, k, -2, u_a, 0.0)
        mean = rnd(rnd(ksum / n, u_a if mixed else u_t), u_store)
        den = _sum(rnd, rnd(q * mean[..., None, :], u_prod), -1, u_a, u_store)
        z = rnd(1.0 / rnd(den + EPS, u_t), u_t)
        return rnd(num * z[..., None], u_t)
    assert normaliser == "sum"
    s = _sum(rnd, rnd(q[..., :, None, :] * k[..., None, :, :], u_prod), -1, u_a, u_store)
    num = _sum(rnd, rnd(s[..., :, :, None] * v[..., None, :, :], u_prod), -2, u_a, u_store)
    den = _sum(rnd, s, -1, u_a, u_store)
    return rnd(num / rnd(den + EPS, u_t)[..., None], u_t)


@pytest.mark.parametrize("normaliser,order", [("mean_scaled", "linear"), ("sum", "quadratic")])
@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "float16-in-float32"])
def test_variance_matches_random_rounding(normaliser, order, mixed):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng)
    dtype = "float16" if mixed else "float32"
    exact = r_foc._attend(q, k, v, normaliser=normaliser, eps=EPS, order="linear", mask=None, taps=None,
                          max_elements=None)
    var_lin, var_quad = attention_variances(q, k, v, normaliser=normaliser, eps=EPS, dtype=dtype)
    var = var_lin if order == "linear" else var_quad
    u = numerics.unit_roundoff(dtype)
    rnd = _Rounder(rng)
    means = np.array([np.mean((_simulate(q, k, v, normaliser, order, mixed, rnd) - exact) ** 2 / (u * u * var))
                      for _ in range(TRIALS)])
    se = np.std(means, ddof=1) / np.sqrt(TRIALS)
    assert abs(np.mean(means) - 1.0 / 3.0) <= SE * se, (np.mean(means), se)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_real_evaluations_within_the_factor(dtype):
    """The twin's attention in T (torch; the released normaliser, linear order, and the quadratic order): every
    element within F_max u_T typical + eta_T."""
    rng = np.random.default_rng(9)
    tdt = getattr(torch, dtype)
    q, k, v = (np.asarray(torch.from_numpy(t).to(tdt).double()) for t in _inputs(rng, n=49, d=32, e=32))
    typ = attention_typical(q, k, v, normaliser="mean_scaled", eps=EPS, dtype=dtype)
    ref = r_foc._attend(q, k, v, normaliser="mean_scaled", eps=EPS, order="linear", mask=None, taps=None,
                        max_elements=None)
    u, eta = numerics.unit_roundoff(dtype), numerics.underflow_eta(dtype)
    for order in ("linear", "quadratic"):
        y = twin_attend(*(torch.from_numpy(t).to(tdt) for t in (q, k, v)), "mean_scaled", EPS, order)
        err = np.abs(y.double().numpy() - ref)
        assert np.all(err <= config.VERDICT_MAX_FACTOR * u * typ + eta), order


def test_attention_stage_carries_the_typical():
    """The fine stage "attention" gives its bound this typical error, per shifted-window mask group."""
    cfg = r_foc.FocusedConfig.preset("paper", dim=16, num_heads=2, kernel_size=3)       # the mask applied
    params = r_foc.init_focused_params(cfg, layout="window", n_kv=16, seed=0)
    stages = r_foc.focused_window_attention_stages(params, cfg, (8, 8), window_size=4, shift=2, fine=True)
    rng = np.random.default_rng(3)
    tensors = {"x": rng.standard_normal((4, 16, 16))}
    for st in stages:
        tensors[st.name] = st.reference(*[tensors[k] for k in st.inputs])
    st = next(s for s in stages if s.name == "attention")
    args = [tensors[k] for k in st.inputs]
    b = st.bound(*args, dtype="float16")
    ref = st.reference(*args)
    typ = np.broadcast_to(b.typical, ref.shape)
    assert typ.shape == ref.shape and np.all(np.isfinite(typ)) and np.all(typ > 0)
    mask = r_foc.shifted_window_mask(8, 8, (4, 4), (2, 2))
    expect = attention_typical(tensors["phi_q"], tensors["phi_k"], r_foc._split_heads(tensors["qkv"][..., 32:], 2),
                               normaliser=cfg.normaliser, eps=cfg.eps, mask=mask, dtype="float16")
    assert np.array_equal(typ, expect)
    w = verdict._weights(b, ref, np.isfinite(ref), "float16")
    assert np.array_equal(w, typ + numerics.underflow_eta("float16") / numerics.unit_roundoff("float16"))
