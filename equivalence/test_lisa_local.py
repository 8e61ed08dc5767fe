"""Equivalence of LiSA Table 3a / 3c operators: the torch twins LocalLiSAAttention (local k x k kernels,
gathered windows and einsum) and ConvOperator (7 x 7 depthwise conv, GFNet's global filter by torch.fft) against
refimpl.models.lisanet_operators.operator, one state_dict on both sides, float32 and float64, every device.

Grids of 1-3 axes (local) and 2-D grids odd, even, non-square, 1 x 1 (convolutions); kernels 1 .. 7, larger than
the grid included.  Bounds: the operators' running error analysis (lisanet_operators.e_operator, the networks'
unit bounds' own stages)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, strategies as st

from equivalence.assertions import assert_matches, load_numpy_state, naive, round_params, to_torch, torch_dtype
from refimpl.twins.modules import lisa as tl
from equivalence.strategies import adversarial_arrays
from refimpl import config, numerics
from refimpl.attention import lisa, lisa_local
from refimpl.models import _netparts as nets, common, lisanet_operators as ops


def _check(module, params, x, op, sc, dtype_name, device, name):
    params = round_params(params, dtype_name)
    module = module.to(device=device, dtype=torch_dtype(dtype_name)).eval()
    load_numpy_state(module, params)
    xt = to_torch(x, dtype_name, device)
    with torch.no_grad():
        out = module(xt)
    ref = ops.operator(x, params, op, sc)
    bound = nets.to_bound(ops.e_operator(common.e_exact(x), params, op, sc), name)
    assert_matches(out, ref, bound, dtype_name, naive=naive(ops.operator, x, params, op, sc, dtype_name=dtype_name),
                   name=name, rerun=lambda: module(xt))


@given(st.sampled_from((1, 2, 2, 3)), st.sampled_from((1, 3, 5, 7)), st.integers(1, 3), st.integers(1, 4),
       st.integers(1, 3), st.data())
def test_local_lisa_operator(device, dtype_name, r, k, h, c, d, data):
    """LiSA with local k x k kernels (Table 3c, Eq. 9 with the window of offsets) vs LocalLiSAAttention."""
    grid = tuple(data.draw(st.integers(1, 5 if r < 3 else 3)) for _ in range(r))
    sc = lisa_local.LocalLiSAConfig(dim=h * c, num_heads=h, grid=grid, kernel=k, latent=d)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    p = {key: rng.standard_normal(s) for key, s in lisa_local.local_param_shapes(sc).items()}
    x = numerics.round_to(data.draw(adversarial_arrays((2, sc.num_tokens, sc.dim))), dtype_name)
    module = tl.LocalLiSAAttention(sc.dim, h, grid, d, kernel=k, l2_eps=config.LISA_L2_EPS)
    _check(module, p, x, "lisa_local", sc, dtype_name, device, f"lisa_local k={k} grid={grid}")


@given(st.sampled_from(("dwconv", "gf")), st.integers(1, 7), st.integers(1, 7), st.integers(1, 6), st.data())
def test_conv_operators(device, dtype_name, op, gh, gw, c, data):
    """Table 3a's Depthwise conv (7 x 7) and GF layer (irfft2(rfft2(X) o K)) with the bias-free projection vs
    ConvOperator."""
    bc = lisa.LiSAConfig(dim=c, num_heads=1, grid=(gh, gw))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    p = {key: rng.standard_normal(s) for key, s in ops.conv_operator_shapes(op, c, (gh, gw)).items()}
    x = numerics.round_to(data.draw(adversarial_arrays((2, gh * gw, c))), dtype_name)
    _check(tl.ConvOperator(c, (gh, gw), op), p, x, op, bc, dtype_name, device, f"{op} grid={(gh, gw)}")
