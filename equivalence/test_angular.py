"""Equivalence of the PyTorch twin (refimpl/twins/modules/angular.py) with refimpl.attention.angular
(Castling-ViT, CVPR 2023, Eq. 4-10), in float32 and float64 on every available device, through the error model.

Inputs and weights are rounded to the tested dtype first, so both sides see identical values; the bound of
every comparison is the reference's first-order running error bound (castling_attention_bound,
castling_core_bound, angular_attention_bound) and the naive same-precision NumPy computation sets the
accuracy floor.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, strategies as st

from equivalence.assertions import (assert_matches, load_numpy_state, naive, round_params, to_torch,
                                    torch_dtype)
from refimpl.twins.modules.angular import (CastlingAttention, angular_attention_t, castling_core_t,
                                         masked_softmax_branch_t)
from equivalence.strategies import adversarial_arrays, grids
from refimpl import config, numerics
from refimpl.attention import angular as A


# ---------------------------------------------------------------------------------------------------
# Strategies (Castling-specific)
# ---------------------------------------------------------------------------------------------------

@st.composite
def castling_configs(draw, h: int, d: int) -> A.CastlingConfig:
    """A valid CastlingConfig: the two presets with their named options varied."""
    preset = draw(st.sampled_from(["paper", "official"]))
    over = {"conv_kernel": draw(st.sampled_from([1, 3, 9]))}
    if preset == "paper":
        over.update(normaliser=draw(st.sampled_from(["none", "similarity_sum"])),
                    constant=draw(st.sampled_from(["sum", "own"])),
                    order=draw(st.sampled_from([0, 0, 1])) if d <= 3 else 0,
                    conv=draw(st.sampled_from(["tokens1d", "grid2d", "none"])),
                    sparse_logits=draw(st.sampled_from(["unit", "scaled_raw"])),
                    qkv_bias=draw(st.booleans()), conv_bias=draw(st.booleans()))
    else:
        over["sparse"] = draw(st.sampled_from(["off", "always"]))
    return A.CastlingConfig.preset(preset, dim=h * d, num_heads=h, **over)


@st.composite
def layer_cases(draw):
    h = draw(st.integers(1, 3))
    d = draw(st.integers(1, 8))
    cfg = draw(castling_configs(h, d))
    hw = draw(grids(1, 6))
    b = draw(st.integers(1, 2))
    x = draw(adversarial_arrays((b, hw[0] * hw[1], cfg.dim)))
    params = A.init_castling_params(cfg, draw(st.integers(0, 2**32 - 1)))
    return cfg, hw, x, params, draw(st.booleans())


def adversarial_qk(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """q, k with zero rows, near-zero rows, rows (anti)parallel to a q row (exactly and up to 1e-7), and
    dead (all-zero) feature columns.  Near-zero rows are scaled by 10^-U(1, 15): in float32 their sum of
    squares stays in the normal range (see test_official_float32_norm_underflow for what happens below)."""
    q = rng.standard_normal(shape)
    k = rng.standard_normal(shape)
    n, d = shape[-2], shape[-1]
    for arr in (q, k):
        for idx in np.ndindex(shape[:-1]):
            r = rng.random()
            if r < 0.12:
                arr[idx] = 0.0
            elif r < 0.3:
                arr[idx] *= 10.0 ** -rng.uniform(1, 15)
        if d > 1 and rng.random() < 0.5:
            arr[..., rng.integers(d)] = 0.0  # a dead feature
    for idx in np.ndindex(shape[:-2]):
        i, j = rng.integers(n), rng.integers(n)
        s = rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-2, 2)
        k[idx + (j,)] = s * q[idx + (i,)] * (1.0 + (1e-7 if rng.random() < 0.5 else 0.0) * rng.standard_normal(d))
    return q, k


def _module(cfg, params, dtype_name, device):
    m = CastlingAttention(cfg).double()
    load_numpy_state(m, params)
    return m.to(device=device, dtype=torch_dtype(dtype_name))


# ---------------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------------

@given(case=layer_cases())
def test_castling_attention_matches(case, device, dtype_name):
    """Eq. 8-10, both presets and their options (normaliser, constant term, order, conv layout, sparse
    logits, biases), train and eval mode: the nn.Module equals castling_attention within
    castling_attention_bound, on adversarial inputs (all-negative, large, near-duplicate, subnormal,
    mixed-scale tokens)."""
    cfg, hw, x, params, training = case
    x = numerics.round_to(x, dtype_name)
    params = round_params(params, dtype_name)
    module = _module(cfg, params, dtype_name, device).train(training)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        y = module(xt, hw=hw)
    ref = A.castling_attention(x, params, cfg, training=training, hw=hw)
    bound = A.castling_attention_bound(x, params, cfg, dtype=dtype_name, training=training, hw=hw)
    assert_matches(y, ref, bound, dtype_name, name=f"castling {cfg}",
                   naive=naive(A.castling_attention, x, params, cfg, dtype_name=dtype_name, training=training,
                               hw=hw),
                   rerun=lambda: module(xt, hw=hw))


@given(seed=st.integers(0, 2**32 - 1), h=st.integers(1, 2), n=st.integers(1, 24), d=st.integers(1, 6),
       preset=st.sampled_from(["paper", "paper-normalised", "official", "official-sparse"]))
def test_castling_core_adversarial_qk(seed, h, n, d, preset, device, dtype_name):
    """Zero and near-zero q/k rows, nearly parallel q and k, dead features, dead (all-zero) V heads.  The
    official preset divides by ||q||, ||k|| and ||output|| with no eps: the NaN pattern (a zero k row poisons
    its whole head through K^^T V; a zero q row its own token; a zero V head makes every output row of that
    head 0/0) must be reproduced exactly; the paper mode (clamp eps) must stay finite on both sides."""
    rng = np.random.default_rng(seed)
    q, k = adversarial_qk(rng, (2, h, n, d))
    v = rng.standard_normal((2, h, n, d))
    for idx in np.ndindex(2, h):
        if rng.random() < 0.2:
            v[idx] = 0.0  # a dead head: the official output l2 norm is 0 there (0/0 = NaN)
    if preset.startswith("paper"):
        cfg = A.CastlingConfig(dim=h * d, num_heads=h, conv_kernel=3, sparse="always",
                               normaliser="similarity_sum" if preset.endswith("normalised") else "none")
    else:
        cfg = A.CastlingConfig.preset("official", dim=h * d, num_heads=h, conv_kernel=3,
                                      sparse="always" if preset.endswith("sparse") else "off")
    w = numerics.round_to(rng.standard_normal((h, 1, 3, 1)) / math.sqrt(3), dtype_name)
    q, k, v = (numerics.round_to(a, dtype_name) for a in (q, k, v))
    tq, tk, tv, tw = (to_torch(a, dtype_name, device) for a in (q, k, v, w))
    with torch.no_grad():
        y = castling_core_t(tq, tk, tv, cfg, conv_weight=tw, training=True)
    ref = A.castling_core(q, k, v, cfg, conv_weight=w, training=True)
    bound = A.castling_core_bound(q, k, v, cfg, dtype=dtype_name, conv_weight=w, training=True)
    assert_matches(y, ref, bound, dtype_name, name=f"core {preset}",
                   naive=naive(A.castling_core, q, k, v, cfg, dtype_name=dtype_name, conv_weight=w,
                               training=True),
                   rerun=lambda: castling_core_t(tq, tk, tv, cfg, conv_weight=tw, training=True))
    if preset.startswith("paper"):
        assert np.all(np.isfinite(ref)) and bool(torch.isfinite(y).all())


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), m=st.integers(1, 12), d=st.integers(1, 6),
       order=st.sampled_from([None, None, 0, 1, 3]), normalize=st.booleans(),
       method=st.sampled_from(["atan2", "arccos"]), parallel=st.booleans())
def test_angular_attention_matches(seed, n, m, d, order, normalize, method, parallel, device, dtype_name):
    """The full quadratic angular attention (Eq. 5 exact kernel by atan2 or arccos, or Eq. 8 truncated at K),
    with and without the similarity-sum normaliser; nearly parallel and antiparallel q, k included (where
    arccos' error is governed by its Hoelder bound and atan2 stays u-accurate)."""
    # The exact kernel's similarity sum is 0 when the only key is antiparallel to the query (0/0), and within
    # rounding of 0 when it is nearly so: the normalised output has no bound there (angular_attention_bound
    # returns inf; tests/test_angular.py checks the exact 0/0 case).  Keep a second, random key.
    if normalize and order is None and parallel:
        m = max(m, 2)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, n, d))
    k = rng.standard_normal((1, 2, m, d))
    if parallel:
        k[..., : min(n, m), :] = (rng.choice([-1.0, 1.0]) * q[..., : min(n, m), :]
                                  * (1.0 + 1e-6 * rng.standard_normal((1, 2, min(n, m), d))))
    v = rng.standard_normal((1, 2, m, d))
    q, k, v = (numerics.round_to(a, dtype_name) for a in (q, k, v))
    kw = dict(order=order, normalize=normalize, method=method)
    tq, tk, tv = (to_torch(a, dtype_name, device) for a in (q, k, v))
    with torch.no_grad():
        y = angular_attention_t(tq, tk, tv, **kw)
    ref = A.angular_attention(q, k, v, **kw)
    bound = A.angular_attention_bound(q, k, v, dtype=dtype_name, **kw)
    # Nearly (anti)parallel draws can leave a float32 output all near zero by cancellation, where T cannot resolve
    # it (thorough profile: relative bound 10.9): the float64 run of the same twin on the same inputs must match.
    t64 = [t.double() for t in (tq, tk, tv)]
    assert_matches(y, ref, bound, dtype_name, name=f"angular attention {kw}",
                   naive=naive(A.angular_attention, q, k, v, dtype_name=dtype_name, **kw),
                   rerun=lambda: angular_attention_t(tq, tk, tv, **kw),
                   higher=lambda: angular_attention_t(*t64, **kw),
                   higher_bound=lambda: A.angular_attention_bound(q, k, v, dtype="float64", **kw))


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 30), d=st.integers(1, 6),
       thr=st.sampled_from([config.CASTLING_SPARSE_EPS, 0.0, 0.3]))
def test_masked_branch_matches(seed, n, d, thr, device, dtype_name):
    """Eq. 10 alone: Mask_eps(Softmax(s q k^T)) V with strict > eps and no renormalisation.  The mask is
    discontinuous: weights within rounding of eps may be decided either way, which the bound admits
    (castling_core_bound's ambiguity term; the core bound also covers the linear part, an over-estimate)."""
    rng = np.random.default_rng(seed)
    q, k, v = (numerics.round_to(rng.standard_normal((1, 1, n, d)) * 2, dtype_name) for _ in range(3))
    tq, tk, tv = (to_torch(a, dtype_name, device) for a in (q, k, v))
    with torch.no_grad():
        y = masked_softmax_branch_t(tq, tk, tv, threshold=thr, scale=d ** -0.5)
    ref = A.masked_softmax_branch(q, k, v, threshold=thr, scale=d ** -0.5)
    cfg = A.CastlingConfig(dim=d, num_heads=1, conv="none", sparse="always", sparse_logits="scaled_raw",
                           sparse_eps=thr)
    b = A.castling_core_bound(q, k, v, cfg, dtype=dtype_name, training=True)
    assert_matches(y, ref, b, dtype_name, name="masked branch",
                   naive=naive(A.masked_softmax_branch, q, k, v, dtype_name=dtype_name, threshold=thr,
                               scale=d ** -0.5),
                   rerun=lambda: masked_softmax_branch_t(tq, tk, tv, threshold=thr, scale=d ** -0.5))


def test_masked_branch_strict_threshold(device, dtype_name):
    """Eq. 10's Mask_eps keeps x only if x > eps, strictly.  With all logits 0 and N a power of two every
    weight is exactly 1/N in IEEE arithmetic (exp(0) = 1, a sum of N ones, a division by a power of two), so
    with eps = 1/N the branch is exactly 0 on both sides, and with eps one ulp below 1/N it keeps every weight
    (the mean of V, within the bound)."""
    n, d = 8, 3
    q = np.zeros((1, 1, n, d))
    v = numerics.round_to(np.random.default_rng(1).standard_normal((1, 1, n, d)), dtype_name)
    tq, tv = to_torch(q, dtype_name, device), to_torch(v, dtype_name, device)
    with torch.no_grad():
        y = masked_softmax_branch_t(tq, tq, tv, threshold=1.0 / n)
    assert bool((y == 0).all())
    np.testing.assert_array_equal(A.masked_softmax_branch(q, q, v, threshold=1.0 / n), 0.0)
    below = float(np.nextafter(np.float32(1.0 / n), np.float32(0.0)))
    with torch.no_grad():
        y = masked_softmax_branch_t(tq, tq, tv, threshold=below)
    ref = A.masked_softmax_branch(q, q, v, threshold=below)
    # The general bound admits every weight as error here (each lies within rounding of the threshold: the mask
    # could flip either way), which makes it void.  The docstring's argument makes P = 1/N exact on both sides,
    # so the output is a length-N sum of exact products (v / N): Higham's inner-product bound.
    exact_p = numerics.Bound(np.broadcast_to(np.mean(np.abs(v), axis=-2, keepdims=True), ref.shape), n,
                             "P = 1/N exactly: P V is a sum of N exact products", accumulation=True)
    assert_matches(y, ref, exact_p, dtype_name,
                   name="all weights kept",
                   naive=naive(A.masked_softmax_branch, q, q, v, dtype_name=dtype_name, threshold=below),
                   rerun=lambda: masked_softmax_branch_t(tq, tq, tv, threshold=below))


# ---------------------------------------------------------------------------------------------------
# The castling switch, bit for bit
# ---------------------------------------------------------------------------------------------------

def test_train_eval_switch_bit_for_bit(device, dtype_name):
    """Sec. 3.2.2: when every weight of the auxiliary softmax is <= eps (checked on the twin itself), the
    masked branch is exactly zero and train() (branch on) and eval() (branch dropped) outputs are identical
    bit for bit; with few tokens (weights ~ 1/N > eps) they differ."""
    cfg = A.CastlingConfig(dim=12, num_heads=3)
    params = round_params(A.init_castling_params(cfg, 7), dtype_name)
    rng = np.random.default_rng(8)
    x = numerics.round_to(rng.standard_normal((1, 1, 12)) + 1e-3 * rng.standard_normal((2, 64, 12)), dtype_name)
    module = _module(cfg, params, dtype_name, device)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        b, n, c = xt.shape
        qkv = module.qkv(xt).reshape(b, n, 3, 3, 4).permute(2, 0, 3, 1, 4)
        qh = qkv[0] / qkv[0].norm(dim=-1, keepdim=True).clamp_min(cfg.qk_norm_eps)
        kh = qkv[1] / qkv[1].norm(dim=-1, keepdim=True).clamp_min(cfg.qk_norm_eps)
        p = (qh @ kh.transpose(-1, -2)).softmax(dim=-1)
        assert bool((p <= cfg.sparse_eps).all())  # the precondition, on the tested side
        y_train = module.train()(xt)
        y_eval = module.eval()(xt)
        assert torch.equal(y_train, y_eval)
        y_train4 = module.train()(xt[:, :4])
        y_eval4 = module.eval()(xt[:, :4])
    assert not torch.equal(y_train4, y_eval4)


# ---------------------------------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------------------------------

def test_official_float32_norm_underflow(device):
    """Finding: the released normalisation q / q.norm() squares without scaling, so in float32 a q row whose
    entries are about 1e-25 has a sum of squares below the smallest subnormal (1.4e-45): the norm is 0 and the
    output inf/NaN, while the exact result (and the float64 reference on the same float32 inputs, whose norm
    is scaled) is finite - the angle does not depend on the norm.  The paper mode clamps at eps = 1e-12 and
    stays finite.  (This is the twin reproducing the released arithmetic, not a twin bug.)"""
    rng = np.random.default_rng(0)
    q = numerics.round_to(rng.standard_normal((1, 1, 4, 3)), "float32")
    q[0, 0, 1] = numerics.round_to(q[0, 0, 1] * 1e-25, "float32")
    k, v = (numerics.round_to(rng.standard_normal((1, 1, 4, 3)), "float32") for _ in range(2))
    cfg = A.CastlingConfig.preset("official", dim=3, num_heads=1, conv="none")
    ref = A.castling_core(q, k, v, cfg)
    with torch.no_grad():
        y = castling_core_t(*(to_torch(a, "float32", device) for a in (q, k, v)), cfg)
    assert np.all(np.isfinite(ref))
    assert not bool(torch.isfinite(y[0, 0, 1]).all())
    assert bool(torch.isfinite(y[0, 0, [0, 2, 3]]).all())
    paper = A.CastlingConfig(dim=3, num_heads=1, conv="none", sparse="off")
    with torch.no_grad():
        yp = castling_core_t(*(to_torch(a, "float32", device) for a in (q, k, v)), paper)
    assert bool(torch.isfinite(yp).all())
