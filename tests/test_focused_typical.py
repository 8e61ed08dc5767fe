"""The typical error of FLatten's feature map phi_p (refimpl.attention.focused_typical): the l2 coefficient of
its roundings per entry, the z unit of the stage-wise verdict for the stages phi_q and phi_k.

Checked against the arithmetic it models: a random-rounding simulation of phi_p = f_p((ReLU(t) + eps) /
softplus(s)) (FLatten Eq. 5-6), every rounding an independent uniform relative error of size <= u (Higham &
Mary 2019), must have mean square <= (u typical)^2 / 3 per entry (first order; the trials' sampling error
allowed as five standard errors of the mean, estimated from the trials themselves) and
exceed lam u typical no more often than the Azuma-Hoeffding tail 2 exp(-lam^2 / 2); real float32 and float16
evaluations (torch, the released code's order of operations) stay within F_max u typical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from refimpl import config, numerics, verdict
from refimpl.attention import focused as r_foc
from refimpl.attention.focused_typical import elementary_count, focused_function_typical, pre_feature_count
from refimpl.feature_maps import focused_function

P = 3.0
EPS = 1e-6


def _uniform(rng, shape, size):
    return rng.uniform(-size, size, size=shape)


def _rows(rng, n=64, d=16):
    t = rng.standard_normal((n, d))
    t[:, 0] = 4.0 * np.abs(t[:, 0])                   # a dominant entry in every row: the cancelling case
    s = rng.standard_normal(d) * 0.5
    return t, s


def _pre(t, s):
    return (np.maximum(t, 0.0) + EPS) / np.log1p(np.exp(s))


def test_typical_random_rounding():
    """Every operation of the pre-features and of f_p perturbed (ReLU exact; + eps, softplus's exp and log1p at
    c u each plus its sum, the quotient, the max-scaling, the power at c u, the squares, the recursive sums, the
    square roots, the quotient and the product): the entries' errors in units of u typical."""
    rng = np.random.default_rng(7)
    t, s = _rows(rng)
    a = _pre(t, s)
    phi = focused_function(a, P)
    typ = focused_function_typical(a, P, pre_feature_count(True, True, False))
    u, c = 2.0 ** -20, float(config.ELEMENTARY_FUNCTION_ULPS)
    errs = []
    for _ in range(300):
        b = (np.maximum(t, 0.0) + EPS) * (1 + _uniform(rng, t.shape, u))
        sp = np.log1p(np.exp(s) * (1 + _uniform(rng, s.shape, c * u)) * (1 + _uniform(rng, s.shape, u))) \
            * (1 + _uniform(rng, s.shape, c * u))
        x = b / sp * (1 + _uniform(rng, t.shape, u))
        r = x / np.max(x, axis=-1, keepdims=True) * (1 + _uniform(rng, t.shape, u))
        rp = r ** P * (1 + _uniform(rng, t.shape, c * u))

        def norm(v):
            sq = v * v * (1 + _uniform(rng, v.shape, u))
            acc = sq[:, 0]
            for j in range(1, v.shape[-1]):
                acc = (acc + sq[:, j]) * (1 + _uniform(rng, acc.shape, u))
            return (np.sqrt(acc) * (1 + _uniform(rng, acc.shape, u)))[:, None]

        y = rp / norm(rp) * (1 + _uniform(rng, t.shape, u)) * norm(r) * (1 + _uniform(rng, t.shape, u))
        errs.append(y * np.max(x, axis=-1, keepdims=True) - phi)
    z = np.stack(errs) / (u * typ)
    # the trials are independent; a normal deviate beyond 5 standard errors has probability 2.9e-7
    per_trial = np.mean(z * z, axis=(1, 2))
    se = np.std(per_trial, ddof=1) / math.sqrt(per_trial.size)
    assert np.mean(per_trial) <= 1.0 / 3.0 + 5.0 * se, (np.mean(per_trial), se)
    for lam in (2.0, 2.5, 3.0):
        assert np.mean(np.abs(z) > lam) <= 2.0 * math.exp(-lam * lam / 2.0)
    # sharper than the deterministic scale where it matters: the dominant entries' own roundings cancel
    # against ||x**p||'s, so their typical error is several times below the rest's (relative to |phi|)
    rel = typ / phi
    assert np.median(rel[:, 0]) < 0.5 * np.median(rel[:, 1:])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_real_evaluations_within_the_factor(dtype):
    """torch in T, the released code's order (+ eps, / softplus(s), ||x||, x**p, x**p / ||x**p|| * ||x||):
    every entry within F_max u_T typical (plus eta_T for entries in T's subnormal range)."""
    rng = np.random.default_rng(11)
    tdt = getattr(torch, dtype)
    t, s = _rows(rng, n=256, d=32)
    t = np.asarray(torch.from_numpy(t).to(tdt).double())
    s = np.asarray(torch.from_numpy(s).to(tdt).double())
    tt, st = torch.from_numpy(t).to(tdt), torch.from_numpy(s).to(tdt)
    x = (torch.relu(tt) + EPS) / torch.nn.functional.softplus(st)
    n1 = x.norm(dim=-1, keepdim=True)
    xp = x ** P
    y = (xp / xp.norm(dim=-1, keepdim=True)) * n1
    a = (np.maximum(t, 0.0) + EPS) / np.log1p(np.exp(s))
    err = np.abs(y.double().numpy() - focused_function(a, P))
    typ = focused_function_typical(a, P, pre_feature_count(True, True, False, dtype), dtype=dtype)
    u, eta = numerics.unit_roundoff(dtype), numerics.underflow_eta(dtype)
    assert np.all(err <= config.VERDICT_MAX_FACTOR * u * typ + eta)


def test_half_precision_counts_one_rounding_per_elementwise_operation():
    """In float16 / bfloat16 an elementwise operation is evaluated in float32 and rounded once: the power and
    softplus count about 1, not c^2 = 16 (float32 evaluates them in T: c^2 each)."""
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    assert elementary_count("float32") == c * c
    for dt, n in (("float16", 1), ("bfloat16", 2)):
        r = numerics.unit_roundoff("float32") / numerics.unit_roundoff(dt)
        assert elementary_count(dt, n) == n * (c * r) ** 2 + 1.0
    assert pre_feature_count(True, True, True, "float32") == 3.0 + 2.0 * c * c + 2.0
    assert pre_feature_count(False, False, False) == 1.0


def test_phi_stages_carry_the_typical():
    """The fine stages phi_q and phi_k give their bound this typical error (the verdict's z unit, refimpl.verdict
    compare), in the heads' layout; the deterministic bound is unchanged and still above it (typical < k S)."""
    cfg = r_foc.FocusedConfig.preset("official", dim=16, num_heads=2, kernel_size=5)
    params = r_foc.init_focused_params(cfg, layout="global", n_kv=16, seed=0)
    stages = {st.name: st for st in r_foc.focused_linear_attention_stages(params, cfg, (4, 4), fine=True)}
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 16))
    tensors = {"x": x}
    for st in r_foc.focused_linear_attention_stages(params, cfg, (4, 4), fine=True):
        tensors[st.name] = st.reference(*[tensors[k] for k in st.inputs])
    for name in ("phi_q", "phi_k"):
        st = stages[name]
        args = [tensors[k] for k in st.inputs]
        b = st.bound(*args, dtype="float32")
        ref = st.reference(*args)
        typ = np.broadcast_to(b.typical, ref.shape)
        assert typ.shape == ref.shape and np.all(typ >= 0) and np.all(np.isfinite(typ))
        assert np.all(typ <= b.k * np.broadcast_to(b.scale, ref.shape))
        w = verdict._weights(b, ref, np.isfinite(ref), "float32")
        live = typ > 0
        assert np.array_equal(w[live], typ[live] + numerics.underflow_eta("float32") / numerics.unit_roundoff("float32"))
