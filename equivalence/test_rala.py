"""Equivalence of the RALA twin (refimpl/twins/modules/rala.py) with refimpl.attention.rala, float32 and
float64, every available device, through the error model (rala_core_bound, rala_attention_bound,
ravlt_ffn_bound and the layers' bounds, each built for the tested dtype).

Inputs include the hard cases: dead ELU+1 / ReLU features (pre-activations of -1000, so
kappa is exactly 0 in every precision), whole dead query rows (a zero normaliser: 0/0 = NaN on both sides
in the paper preset, 0 with the official eps), near-zero and exactly-zero rows (kappa = 1), strongly
negative but representable pre-activations (kappa down to e^-60), and large logits (peaked alpha).
Pre-activations in (-745, -88) are excluded on purpose: there exp underflows to 0 (or a subnormal) in
float32 but not in float64, so a fully dead row is NaN in float32 and finite in float64 - a precision
cliff of Eq. 2 without eps, shown by test_float32_underflow_cliff_of_eq2 below, not an implementation
error.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, strategies as st

from equivalence.assertions import (assert_matches, load_numpy_state, naive, round_params, state_dict_to_numpy,
                                    to_numpy, to_torch)
from refimpl.twins.modules import rala as T
from refimpl import config, layers, numerics
from refimpl.attention import rala as R
from refimpl.attention.rala_core import recomputed_rows

INPUT_KINDS = ("normal", "dead_features", "dead_rows", "near_zero_rows", "negative", "large", "mixed_scale")


def _values(rng: np.random.Generator, kind: str, shape: tuple, dead: float) -> np.ndarray:
    """Token-major arrays (..., N, d) of one kind; ``dead`` is the pre-activation that zeroes kappa."""
    x = rng.standard_normal(shape)
    if kind == "dead_features":
        x = np.where(rng.random(shape[-1:]) < 0.5, dead, x)           # whole channels dead for every token
    elif kind == "dead_rows":
        x = np.where(rng.random(shape[:-1] + (1,)) < 0.3, dead, x)
    elif kind == "near_zero_rows":
        rows = rng.random(shape[:-1] + (1,))
        x = np.where(rows < 0.2, 0.0, np.where(rows < 0.4, 1e-30 * x, x))
    elif kind == "negative":
        x = -np.minimum(5.0 + 10.0 * np.abs(x), 40.0)                  # kappa in [e^-40, e^-5]
    elif kind == "large":
        x = 30.0 * x
    elif kind == "mixed_scale":
        x = x * 10.0 ** rng.uniform(-3, 1, size=shape[:-1] + (1,))
    return x


@st.composite
def core_case(draw):
    preset = draw(st.sampled_from(("paper", "official")))
    kernel = draw(st.sampled_from(("elu1", "relu")))
    order = draw(st.sampled_from(("linear", "quadratic")))
    h, w = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    heads = draw(st.integers(1, 2))
    dims = (4, 8, 12, 16) if preset == "official" else (1, 2, 3, 4, 8, 16)
    d = draw(st.sampled_from(dims))
    cfg = R.RALAConfig.preset(preset, dim=heads * d, num_heads=heads, kernel=kernel, order=order,
                              reweight=draw(st.booleans()) if preset == "paper" else True)
    seed = draw(st.integers(0, 2**32 - 1))
    kq, kk = draw(st.sampled_from(INPUT_KINDS)), draw(st.sampled_from(INPUT_KINDS))
    rng = np.random.default_rng(seed)
    dead = -1000.0 if kernel == "elu1" else -1.0
    shape = (draw(st.integers(1, 2)), heads, h * w, d)
    q, k = _values(rng, kq, shape, dead), _values(rng, kk, shape, dead)
    v = _values(rng, draw(st.sampled_from(("normal", "mixed_scale", "large"))), shape, dead)
    return cfg, (h, w), q, k, v


def _assume_representable(nv, ref) -> None:
    """Out of scope: inputs where T's own arithmetic (the naive same-precision computation) turns a finite
    reference into NaN, i.e. products or alpha weights underflow to 0 in T and leave a 0/0 normaliser
    (test_float32_underflow_cliff_of_eq2 documents the cliff).  Everywhere else the twin must reproduce the
    reference's NaN pattern exactly."""
    if nv is not None:
        assume(np.array_equal(np.isnan(nv), np.isnan(ref)))


def _assume_direct_range(q, k, cfg) -> None:
    """Out of scope: the rows the definition recomputes from log-features (rala_core.recomputed_rows: the
    normaliser of the direct evaluation underflows although the exact one is > 0, e.g. ELU + 1 of -1000 is
    exp(-1000) = 0 in float64).  There the twin, which evaluates directly in the released code's order, gives
    0/0 or loses a row's weights while the reference returns the exact output (or refuses, where even the
    log-features leave the row beyond float64): a range limit of the direct formula, not a defect the twin
    could fix.  Those rows are checked against mpmath in tests/test_range_safety.py."""
    hit, _ = recomputed_rows(np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64), cfg)
    assume(not np.any(hit))


@given(core_case())
def test_rala_core(device, dtype_name, case):
    """rala_core, both presets and orders, ELU+1 and ReLU kernels, with and without reweighting (Eq. 2-4,
    6 before the gate; official: d^(-1/2) logits, mean kappa(Q), RoPE on the numerator, (HW)^(-1/2),
    eps)."""
    cfg, hw, q, k, v = case
    q, k, v = (numerics.round_to(a, dtype_name) for a in (q, k, v))
    _assume_direct_range(q, k, cfg)
    ts = [to_torch(a, dtype_name, device) for a in (q, k, v)]
    with torch.no_grad():
        out = T.rala_core(*ts, cfg, hw)
    ref = R.rala_core(q, k, v, cfg, hw)
    bound = R.rala_core_bound(q, k, v, cfg, hw, dtype=dtype_name)
    nv = naive(R.rala_core, q, k, v, cfg, hw, dtype_name=dtype_name)
    _assume_representable(nv, ref)
    t64 = [t.double() for t in ts]
    assert_matches(out, ref, bound, dtype_name, naive=nv, name=f"rala_core {cfg.order}",
                   rerun=lambda: T.rala_core(*ts, cfg, hw), higher=lambda: T.rala_core(*t64, cfg, hw),
                   higher_bound=lambda: R.rala_core_bound(q, k, v, cfg, hw, dtype="float64"))


@st.composite
def layer_case(draw):
    preset = draw(st.sampled_from(("paper", "official")))
    heads = draw(st.integers(1, 2))
    d = draw(st.sampled_from((4, 8) if preset == "official" else (2, 4, 8)))
    over = dict(dim=heads * d, num_heads=heads, order=draw(st.sampled_from(("linear", "quadratic"))))
    if preset == "paper":
        over["gate"] = draw(st.sampled_from(("linear", "identity", "tanh", "none")))
    # either layout for both presets: the official fused qkvo projection in the tokens layout too
    over["layout"] = draw(st.sampled_from(("tokens", "channels_first")))
    cfg = R.RALAConfig.preset(preset, **over)
    h, w = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(("normal", "mixed_scale", "large", "near_zero_rows")))
    return cfg, h, w, seed, kind


def _module_and_params(module, seed: int, dtype_name: str, device: str, std: float = 0.3):
    rng = np.random.default_rng(seed)
    params = {k: std * rng.standard_normal(v.shape) for k, v in state_dict_to_numpy(module).items()}
    params = round_params(params, dtype_name)
    module = module.to(dtype=torch.float64 if dtype_name == "float64" else torch.float32)
    load_numpy_state(module, params)     # into the module's own dtype: float64 weights stay float64
    return module.to(device=device), params


@given(layer_case())
def test_rala_attention_layer(device, dtype_name, case):
    """The full layer: projections (Linear or 1x1 conv, fused qkvo), core, LePE, gate phi (linear /
    identity / tanh / none, Eq. 6 and Table 9), output projection; state_dict keys equal
    rala_param_shapes."""
    cfg, h, w, seed, kind = case
    mod, params = _module_and_params(T.RALAttention(cfg), seed, dtype_name, device)
    assert {k: v.shape for k, v in params.items()} == R.rala_param_shapes(cfg)
    rng = np.random.default_rng(seed + 1)
    shape = (2, cfg.dim, h, w) if cfg.layout == "channels_first" else (2, h, w, cfg.dim)
    x = numerics.round_to(_values(rng, kind, shape, -1000.0), dtype_name)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        out = mod(xt)
    ref = R.rala_attention(x, params, cfg)
    bound = R.rala_attention_bound(x, params, cfg, dtype=dtype_name)
    nv = naive(R.rala_attention, x, params, cfg, dtype_name=dtype_name)
    _assume_representable(nv, ref)
    mod64, xt64 = copy.deepcopy(mod).double(), xt.double()
    assert_matches(out, ref, bound, dtype_name, naive=nv, name=f"rala_attention ({cfg.layout}, gate {cfg.gate})",
                   rerun=lambda: mod(xt), higher=lambda: mod64(xt64),
                   higher_bound=lambda: R.rala_attention_bound(x, params, cfg, dtype="float64"))


def test_fused_qkvo_projection_in_the_tokens_layout(device):
    """The official fused qkvo projection (Q, K, V and the gate from one 4C-row weight) with tokens (B, H, W, C)
    in place of channels-first input: the twin builds only ``qkvo``, and its tokens branch used to call
    ``qkv`` (AttributeError).  It matches the reference in float64."""
    cfg = R.RALAConfig.preset("official", dim=8, num_heads=2, layout="tokens")
    assert cfg.gate_source == "qkvo"
    mod, params = _module_and_params(T.RALAttention(cfg), 3, "float64", device)
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 8))
    with torch.no_grad():
        out = mod(to_torch(x, "float64", device))
    ref = R.rala_attention(x, params, cfg)
    bound = R.rala_attention_bound(x, params, cfg, dtype="float64")
    assert_matches(out, ref, bound, "float64", naive=naive(R.rala_attention, x, params, cfg, dtype_name="float64"),
                   name="rala_attention (tokens, qkvo)", rerun=lambda: mod(to_torch(x, "float64", device)))


@given(st.sampled_from(("paper", "official")), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_ravlt_block_stage_by_stage(device, dtype_name, preset, h, w, seed):
    """The RAVLT block (§3.2, Fig. 6) stage by stage: each stage of the twin (CPE, LN1, RALA, residual
    with layerscale in the official preset, LN2, FFN, residual) is compared with the reference stage applied to the twin's own input to that
    stage (values exact in T), against that stage's bound.  A block-level bound would have to carry
    errors through LayerNorm's 1/sigma; stage by stage every comparison is on identical inputs."""
    cfg = R.RAVLTBlockConfig.preset(preset, dim=8, num_heads=2)
    mod, params = _module_and_params(T.RAVLTBlock(cfg), seed, dtype_name, device)
    assert {k: v.shape for k, v in params.items()} == R.ravlt_block_param_shapes(cfg)
    cf = cfg.attn.layout == "channels_first"
    x = numerics.round_to(np.random.default_rng(seed + 1).standard_normal((2, 8, h, w) if cf else (2, h, w, 8)),
                          dtype_name)
    t = {}
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        mod(xt, taps=t)
    tn = {k: to_numpy(v) for k, v in t.items()}
    p_attn, p_ffn = layers.subparams(params, "attn"), layers.subparams(params, "ffn")
    norm, norm_bound = (layers.layer_norm_cf, layers.layer_norm_cf_bound) if cf else (layers.layer_norm,
                                                                                      layers.layer_norm_bound)
    nargs = lambda i: (params[f"norm{i}.weight"], params[f"norm{i}.bias"], cfg.norm_eps)
    xc = x if cf else np.moveaxis(x, -1, 1)
    ls = lambda key: params[key] if cfg.layerscale else None
    lsv = lambda key: params[key] if cfg.layerscale else 1.0
    cpe_b = layers.cpe_bound(xc, params["pos.weight"], params["pos.bias"], dtype=dtype_name)
    stages = [
        ("cpe", R.ravlt_cpe(x, params, cfg),
         cpe_b if cf else dataclasses.replace(cpe_b, scale=np.moveaxis(np.asarray(cpe_b.scale), 1, -1))),
        ("norm1", norm(tn["cpe"], *nargs(1)), norm_bound(tn["cpe"], *nargs(1))),
        ("attn", R.rala_attention(tn["norm1"], p_attn, cfg.attn),
         R.rala_attention_bound(tn["norm1"], p_attn, cfg.attn, dtype=dtype_name)),
        ("res1", tn["cpe"] + lsv("gamma_1") * tn["attn"], R.residual_bound(tn["cpe"], tn["attn"], ls("gamma_1"), dtype=dtype_name)),
        ("norm2", norm(tn["res1"], *nargs(2)), norm_bound(tn["res1"], *nargs(2))),
        ("ffn", R.ravlt_ffn(tn["norm2"], p_ffn, cfg), R.ravlt_ffn_bound(tn["norm2"], p_ffn, cfg, dtype=dtype_name)),
        ("out", tn["res1"] + lsv("gamma_2") * tn["ffn"], R.residual_bound(tn["res1"], tn["ffn"], ls("gamma_2"), dtype=dtype_name)),
    ]

    def res(x_, key, y_):  # a residual as RAVLTBlock.forward adds it (layerscale in the official preset)
        return x_ + (getattr(mod, key) * y_ if cfg.layerscale else y_)

    # Each stage's tested value recomputed from the twin's own input to that stage (the tapped tensors), as the
    # block's forward computes it; "cpe" is the first stage, so it is the block re-run on x, tapped.
    reruns = {
        "cpe": lambda: _tapped(mod, xt)["cpe"],
        "norm1": lambda: mod.norm1(t["cpe"]),
        "attn": lambda: mod.attn(t["norm1"]),
        "res1": lambda: res(t["cpe"], "gamma_1", t["attn"]),
        "norm2": lambda: mod.norm2(t["res1"]),
        "ffn": lambda: mod.ffn(t["norm2"]),
        "out": lambda: res(t["res1"], "gamma_2", t["ffn"]),
    }
    for name, ref, bound in stages:
        assert_matches(t[name], ref, bound, dtype_name, name=f"block stage {name} ({preset})", rerun=reruns[name])


def _tapped(mod, x):
    """The taps of one forward pass of ``mod`` on ``x``."""
    taps = {}
    mod(x, taps=taps)
    return taps


def test_float32_underflow_cliff_of_eq2(device):
    """Finding: Eq. 2 without eps, in float32, returns 0/0 = NaN for a query row whose pre-activations all
    lie below ~-104 (exp underflows to 0 in float32), while the float64 reference on the same inputs is
    finite (e^-120 is a normal float64).  The official eps turns the float32 row into 0 instead."""
    n, d = 6, 4
    rng = np.random.default_rng(0)
    q, k, v = (numerics.round_to(rng.standard_normal((1, 1, n, d)), "float32") for _ in range(3))
    q[0, 0, 1] = -120.0
    cfg = R.RALAConfig(dim=d, num_heads=1)
    with torch.no_grad():
        out = to_numpy(T.rala_core(*(to_torch(a, "float32", device) for a in (q, k, v)), cfg))
    ref = R.rala_core(q, k, v, cfg)
    assert np.all(np.isnan(out[0, 0, 1])) and np.all(np.isfinite(ref[0, 0, 1]))
    rep = numerics.compare(out, ref, R.rala_core_bound(q, k, v, cfg, dtype="float32"), "float32")
    assert not rep.pattern_ok                       # the comparison reports it as a NaN-pattern mismatch
    off = R.RALAConfig.preset("official", dim=d, num_heads=1, rope=False)
    with torch.no_grad():
        out_off = to_numpy(T.rala_core(*(to_torch(a, "float32", device) for a in (q, k, v)), off, (2, 3)))
    np.testing.assert_array_equal(out_off[0, 0, 1], np.zeros(d))


def test_released_elu_plus_one_loses_relative_accuracy(device):
    """Finding: kappa computed literally as F.elu(x) + 1 = (exp(x) - 1) + 1, as the released code does,
    cancels for x << 0: in float32 its relative error grows like u / e^x (measured: 2e-5 at x = -8, up to
    8e-4 at x = -12, 5e-2 at x = -14.5) and is total below x = -17.3, where exp(x) < u and the result is
    exactly 0, while exp(x) evaluated directly stays within ~1 ulp (naive same-precision error).  It fails
    the error model (bound and ensemble criterion), which is why the twin and the reference evaluate exp(x)."""
    x = numerics.round_to(-np.linspace(8.0, 20.0, 25), "float32")
    literal = to_numpy(F.elu(to_torch(x, "float32", device)) + 1.0)
    ref = R.kappa(x)
    rel = np.abs(literal - ref) / ref
    bound = numerics.Bound(ref, config.ELEMENTARY_FUNCTION_ULPS, "exp: libm ulps, relative")
    # already at x >= -12 outside the relative bound, (gamma_c(u_32) + gamma_c(u_64)) |ref| + c (eta_32 + eta_64)
    assert np.any((np.abs(literal - ref) > bound.array("float32", ref.shape))[x >= -12.0]), np.max(rel[x >= -12.0])
    np.testing.assert_array_equal(literal[x <= -17.5], 0.0)
    nv = numerics.naive_same_precision(R.kappa, x, dtype="float32")
    rep = numerics.compare(literal, ref, bound, "float32", naive=nv)
    assert not rep.within_bound and not rep.ensemble_ok
    xt = to_torch(x, "float32", device)
    with torch.no_grad():
        ours = T.kappa(xt)
    assert_matches(ours, ref, bound, "float32", naive=nv, name="kappa exp form", rerun=lambda: T.kappa(xt))


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_state_dict_keys_equal_param_shapes(preset):
    """The twins' state_dict keys and shapes are exactly the reference's parameter mapping."""
    for over in ({}, {"gate": "tanh", "gate_source": "separate"}, {"lepe_kernel": 3}, {"out_proj": False},
                 {"qkv_bias": False}):
        if preset == "paper" and "gate_source" in over:
            continue
        cfg = R.RAVLTBlockConfig.preset(preset, dim=8, num_heads=2, **over)
        sd = {k: tuple(v.shape) for k, v in T.RAVLTBlock(cfg).state_dict().items()}
        assert sd == R.ravlt_block_param_shapes(cfg)
