"""LiSA Table 3a's convolution rows in LiSANet-I-T (registered as lisanet_i_t_dwconv, lisanet_i_t_gf;
refimpl.models.lisanet_operators.CONV_OPERATORS): "Depthwise conv (7 x 7)" and "GF layer" (GFNet's global filter)
replacing LiSA in the block (§5.2: "we only replace our operator with others in the LiSA blocks"; "all the
receptive fields are set as global, except for the 7 x 7 depthwise convolution").

Properties: the global filter is the circular convolution with the kernel irfft2(K) (convolution theorem; an
independent loop over circulant indices, tests/naive_lisa.py), the depthwise row a 'same' 7 x 7 cross-correlation
(loop), and the block is x + proj(op(LN x)) then + MLP(LN .).  Counts: tests/test_paper_counts.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import models as rm, numerics, toeplitz as tz
from refimpl.models import _netparts as nets, common, lisanet, lisanet_operators as ops
from tests.naive_lisa import naive_circulant

F64 = "float64"


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 3), st.integers(0, 2**16))
def test_global_filter_is_the_circular_convolution_with_irfft2_of_k(h, w, c, seed):
    """GFNet's filter irfft2(rfft2(X) o K) = C(k) X with k = irfft2(K) (the circulant of Eq. 10, built by the
    loop oracle), for any complex K (irfft2 keeps its Hermitian part), within the FFT bound of the product; and
    for K = rfft2(k) of a real kernel, irfft2(K) = k: the filter is exactly a learnable circular convolution."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, h * w, c))
    weight = rng.standard_normal((h, w // 2 + 1, c, 2))
    got = ops.global_filter(x, weight, (h, w))
    kern = ops._gf_kernel(weight, (h, w))
    dense = naive_circulant(kern, (h, w))                                  # (N, N, c)
    want = np.einsum("ijc,bjc->bic", dense, x)
    b1 = tz.circulant_product_bound(kern, x.reshape(2, h, w, c), 2)
    b2 = tz.dense_product_bound(dense, x.reshape(2, h * w, c), 1)
    e = (b1.k * np.broadcast_to(b1.scale, (2, h, w, c)).reshape(got.shape)
         + b2.k * np.broadcast_to(b2.scale, got.shape))             # |error| <= u E for each, summed
    numerics.assert_close(got, want, numerics.Bound(e / (b1.k + b2.k), b1.k + b2.k, "GF + dense loop"), F64,
                          name="GF vs circulant loop")
    k_real = rng.standard_normal((h, w, c))
    spec = np.fft.rfft2(k_real, axes=(0, 1))
    # irfft2(rfft2(k)) is the FFT circular convolution of k with the unit impulse (whose transform, 1, is exact):
    # two of its three transforms, so its error is within that convolution's bound (toeplitz.fft_convolution_bound)
    delta = np.zeros((h, w, 1))
    delta[0, 0] = 1.0
    numerics.assert_close(ops._gf_kernel(np.stack([spec.real, spec.imag], -1), (h, w)), k_real,
                          tz.fft_convolution_bound(k_real, delta, 2), F64, name="irfft2(rfft2(k))")


def _block_parts(name, seed=0):
    cfg = lisanet.reduced(rm.create(name)[0])
    params = lisanet.init_params(cfg, seed)
    x = np.random.default_rng(seed + 1).standard_normal((2, cfg.dims[0], 5, 6))
    taps: dict = {}
    lisanet.run_unit(params, "stages.0.0", x, cfg, taps=taps)
    p = {key[len("stages.0.0.attn."):]: v for key, v in params.items() if key.startswith("stages.0.0.attn.")}
    return cfg, p, taps


def test_dwconv_row_is_a_same_7x7_cross_correlation_then_proj():
    """The "Depthwise conv (7 x 7)" operator: y[c, i, j] = sum_{u, v} W[c, 0, u, v] X[c, i + u - 3, j + v - 3]
    (zero outside the grid; PyTorch's orientation), then the bias-free projection - written as a loop here."""
    cfg, p, taps = _block_parts("lisanet_i_t_dwconv")
    ln1 = taps["ln1"]                                                      # (B, N, C) tokens of the 5 x 6 grid
    b, n, c = ln1.shape
    g = ln1.reshape(b, 5, 6, c)
    wt = p["dwconv.weight"][:, 0]
    conv = np.zeros_like(g)
    for i in range(5):
        for j in range(6):
            for u in range(7):
                for v in range(7):
                    ii, jj = i + u - 3, j + v - 3
                    if 0 <= ii < 5 and 0 <= jj < 6:
                        conv[:, i, j] += wt[:, u, v] * g[:, ii, jj]
    want = conv.reshape(b, n, c) @ p["proj.weight"].T
    bound = nets.to_bound(ops._e_conv_operator(common.e_exact(ln1), p, "dwconv", (5, 6)), "dwconv operator")
    numerics.assert_close(taps["attn"], want, bound, F64, name="dwconv operator vs loop")
    assert set(p) == {"dwconv.weight", "proj.weight"}


def test_gf_row_block_structure_and_keys():
    """The "GF layer" block: attn = proj(GF(LN1 x)), resid1 = x + attn; its only parameters are GFNet's
    complex_weight (H, W // 2 + 1, C, 2) and the bias-free projection."""
    cfg, p, taps = _block_parts("lisanet_i_t_gf")
    want = ops.global_filter(taps["ln1"], p["complex_weight"], (5, 6)) @ p["proj.weight"].T
    np.testing.assert_array_equal(taps["attn"], want)
    assert p["complex_weight"].shape == (5, 4, cfg.dims[0], 2) and set(p) == {"complex_weight", "proj.weight"}


def test_table3a_layouts_and_resize():
    """Parameters per block besides LN and MLP: 7 x 7 x C + C^2 (dwconv), 2 H (W // 2 + 1) C + C^2 (gf); the
    depthwise kernels move to any resolution unchanged, the global filter has no resampling rule (clear error)."""
    for name, extra in (("lisanet_i_t_dwconv", 49 * 192 + 192 * 192), ("lisanet_i_t_gf", 2 * 14 * 8 * 192 + 192 ** 2)):
        shapes = rm.param_shapes(rm.create(name)[0])
        assert sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("stages.0.0.attn.")) == extra
    cfg = lisanet.reduced(rm.create("lisanet_i_t_dwconv")[0])
    params = lisanet.init_params(cfg, 0)
    moved, new_cfg = lisanet.resize_params(params, cfg, (28, 32))
    np.testing.assert_array_equal(moved["stages.0.1.attn.dwconv.weight"], params["stages.0.1.attn.dwconv.weight"])
    assert np.all(np.isfinite(lisanet.forward(moved, np.zeros((1, 3, 28, 32)), new_cfg)))
    gcfg = lisanet.reduced(rm.create("lisanet_i_t_gf")[0])
    with pytest.raises(ValueError, match="GF layer"):
        lisanet.resize_params(lisanet.init_params(gcfg, 0), gcfg, (28, 32))
