"""Equivalence of the LiSA family: the torch.fft twins (refimpl/twins/modules/lisa.py) against
refimpl.attention.lisa, one state_dict loaded into both sides, float32 and float64, every available device.

Grids are drawn odd, even, non-square and 1 x 1 (2-D), plus 1-D and 3-D (video) cases; D is drawn to
include D = 1 and D > c (latent channels above the head dim).  Bounds come from the reference's running
error analysis (lisa_attention_bound, structure_aware_attention_bound, lisa_block_bound)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from equivalence.assertions import assert_matches, load_numpy_state, naive, round_params, to_torch, torch_dtype
from refimpl.twins.modules import lisa as tl
from equivalence.strategies import adversarial_arrays
from refimpl import numerics
from refimpl.attention import lisa


@st.composite
def lisa_shapes(draw, ndims=(1, 2, 2, 2, 3), max_side: int = 6):
    """(B, grid, h, c, D) with odd/even/non-square grids, D in {1, c + 1, random}."""
    r = draw(st.sampled_from(ndims))
    side = max_side if r < 3 else 3
    grid = tuple(draw(st.integers(1, side)) for _ in range(r))
    h = draw(st.integers(1, 3))
    c = draw(st.integers(1, 5))
    d = draw(st.sampled_from((1, c + 1, draw(st.integers(1, 6)))))
    return draw(st.integers(1, 2)), grid, h, c, d


def _params(shapes, seed, dtype_name):
    rng = np.random.default_rng(seed)
    p = {k: rng.standard_normal(s) for k, s in shapes.items()}
    for k in p:
        if k.endswith(("norm1.weight", "norm2.weight")):
            p[k] = 1.0 + 0.1 * p[k]
    return round_params(p, dtype_name)


def _run(module, params, x, dtype_name, device):
    """(torch output, rerun): ``rerun()`` recomputes the output from the same module and input tensor."""
    module = module.to(device=device, dtype=torch_dtype(dtype_name)).eval()
    load_numpy_state(module, params)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        return module(xt), lambda: module(xt)


@given(lisa_shapes(), st.booleans(), st.sampled_from(("rfft", "fft")), st.data())
def test_lisa_attention(device, dtype_name, shapes, exact, transform, data):
    """LiSA operator (Eq. 9-10, Fig. 7; exact_toeplitz = Eq. 9) vs the torch.fft twin."""
    b, grid, h, c, d = shapes
    cfg = lisa.LiSAConfig(dim=h * c, num_heads=h, grid=grid, latent=d, exact_toeplitz=exact, transform=transform)
    p = _params(lisa.lisa_param_shapes(cfg), data.draw(st.integers(0, 2**16)), dtype_name)
    x = numerics.round_to(data.draw(adversarial_arrays((b, cfg.num_tokens, cfg.dim))), dtype_name)
    out, rerun = _run(tl.from_config(cfg), p, x, dtype_name, device)
    ref = lisa.lisa_attention(x, p, cfg)
    assert_matches(out, ref, lisa.lisa_attention_bound(x, p, cfg, dtype=dtype_name), dtype_name,
                   naive=naive(lisa.lisa_attention, x, p, cfg, dtype_name=dtype_name),
                   name="lisa_attention", rerun=rerun)


@given(lisa_shapes(ndims=(1, 2, 2, 3), max_side=5), st.sampled_from(lisa.SA_FORMS),
       st.sampled_from(lisa.RPE_KINDS), st.booleans(), st.data())
def test_structure_aware_attention(device, dtype_name, shapes, form, rpe, per_head, data):
    """Direct SA Eq. 4-7 with Toeplitz or circulant RPEs (Fig. 6) vs the torch twin."""
    b, grid, h, c, d = shapes
    cfg = lisa.SAConfig(dim=h * c, num_heads=h, grid=grid, latent=d, form=form, rpe=rpe,
                        rpe_per_head=per_head and form == "eq4")
    p = _params(lisa.sa_param_shapes(cfg), data.draw(st.integers(0, 2**16)), dtype_name)
    x = numerics.round_to(data.draw(adversarial_arrays((b, cfg.num_tokens, cfg.dim))), dtype_name)
    out, rerun = _run(tl.from_config(cfg), p, x, dtype_name, device)
    ref = lisa.structure_aware_attention(x, p, cfg)
    assert_matches(out, ref, lisa.structure_aware_attention_bound(x, p, cfg, dtype=dtype_name), dtype_name,
                   naive=naive(lisa.structure_aware_attention, x, p, cfg, dtype_name=dtype_name),
                   name=f"sa_{form}_{rpe}", rerun=rerun)


@settings(max_examples=15)  # lowered: the block is the slowest comparison of this file
@given(lisa_shapes(ndims=(2, 2, 3), max_side=5), st.booleans(), st.data())
def test_lisa_block(device, dtype_name, shapes, exact, data):
    """LiSA block LN -> LiSA -> LN -> MLP (§5.1, Fig. 3) vs the torch twin.  A LayerNorm over few channels whose
    values nearly agree (C = 2, a residual of (15.9473, 15.9456): its centred values are 1e-4 of the sum) amplifies
    its input's bound by 1 / sigma, so that the float32 block bound can reach the output's size ("inconclusive",
    found by the thorough profile, --hypothesis-seed=5); the remedy the report names is taken there: the float64
    run of the same module on the same rounded weights and input must match (assert_matches' ``higher``)."""
    b, grid, h, c, d = shapes
    cfg = lisa.LiSAConfig(dim=h * c, num_heads=h, grid=grid, latent=d, exact_toeplitz=exact)
    p = _params(lisa.lisa_block_param_shapes(cfg), data.draw(st.integers(0, 2**16)), dtype_name)
    x = numerics.round_to(data.draw(adversarial_arrays((b, cfg.num_tokens, cfg.dim))), dtype_name)
    m = tl.block_from_config(cfg)
    out, rerun = _run(m, p, x, dtype_name, device)
    ref = lisa.lisa_block(x, p, cfg)

    def in_float64():
        with torch.no_grad():
            return copy.deepcopy(m).double()(to_torch(x, "float64", device))
    assert_matches(out, ref, lisa.lisa_block_bound(x, p, cfg, dtype=dtype_name), dtype_name,
                   naive=naive(lisa.lisa_block, x, p, cfg, dtype_name=dtype_name), name="lisa_block", rerun=rerun,
                   higher=in_float64, higher_bound=lambda: lisa.lisa_block_bound(x, p, cfg, dtype="float64"))


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**16))
def test_paper_sized_head_and_rectangular_video(device, dtype_name, hh, ww, seed):
    """Paper head layout (c = 16, D = 16; LiSANet-I-T has C = 192, h = 12) on a small grid, one head pair."""
    cfg = lisa.LiSAConfig(dim=32, num_heads=2, grid=(hh, ww), latent=16)
    p = _params(lisa.lisa_param_shapes(cfg), seed, dtype_name)
    x = numerics.round_to(np.random.default_rng(seed).standard_normal((1, cfg.num_tokens, 32)), dtype_name)
    out, rerun = _run(tl.from_config(cfg), p, x, dtype_name, device)
    ref = lisa.lisa_attention(x, p, cfg)
    assert_matches(out, ref, lisa.lisa_attention_bound(x, p, cfg, dtype=dtype_name), dtype_name,
                   naive=naive(lisa.lisa_attention, x, p, cfg, dtype_name=dtype_name),
                   name="lisa_paper_head", rerun=rerun)
