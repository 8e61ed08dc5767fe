"""LiSA with local k x k kernels (LiSA Table 3c "Local - k x k", §5.2; refimpl.attention.lisa_local) and the
LiSANet-I-T networks built on it (lisanet_i_t_local3 / _local5 / _local7).

Properties, each with the equation it checks:
- Eq. 9 with local kernels against an independent element-by-element loop (tests/naive_lisa.py);
- the reading "Eq. 2's Toeplitz RPE restricted to the k x k window": the operator equals SA Eq. 7 with the dense
  Toeplitz RPEs of the window's taps (zero elsewhere), and, where the window covers every offset of the grid
  (k_a >= 2 n_a - 1), LiSA's exact Toeplitz form (Eq. 9 without Eq. 10's circular approximation, by padded FFTs);
- locality: the output at token i depends on no token outside i's window;
- the network: parameter layout, MACs in closed form, resolution independence of the kernels, clear errors.
Tolerances are the error bounds of the functions compared (lisa_local_core_bound, lisa_core_bound,
sa_core_bound), summed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import models as rm, numerics
from refimpl.attention import lisa, lisa_local as ll
from refimpl.models import counting, lisanet
from tests.naive_lisa import naive_lisa_local, naive_toeplitz

F64 = "float64"


@st.composite
def local_cases(draw, max_tokens: int = 24):
    """(grid, B, h, c, D, k, seed): 1-3 axes, odd k from 1 to 7 (larger than the grid allowed)."""
    r = draw(st.sampled_from((1, 2, 2, 3)))
    side = {1: 10, 2: 5, 3: 3}[r]
    grid = tuple(draw(st.integers(1, side)) for _ in range(r))
    while int(np.prod(grid)) > max_tokens:
        grid = grid[:-1] + (max(1, grid[-1] - 1),)
    c = draw(st.integers(1, 3))
    d = draw(st.integers(1, 3))
    k = draw(st.sampled_from((1, 3, 5, 7)))
    return grid, draw(st.integers(1, 2)), draw(st.integers(1, 2)), c, d, k, draw(st.integers(0, 2**16))


def _inputs(case, kernel=None):
    grid, b, h, c, d, k, seed = case
    kern = k if kernel is None else kernel
    taps = int(np.prod(kern)) if isinstance(kern, tuple) else kern ** len(grid)
    rng = np.random.default_rng(seed)
    n = int(np.prod(grid))
    q, kk, v = (rng.standard_normal((b, h, n, c)) for _ in range(3))
    w = (rng.standard_normal((taps, c, d)), rng.standard_normal((taps, d)), rng.standard_normal((c, d)),
         rng.standard_normal((c, d)))
    return (q, kk, v), w, kern


def _bound(qkv, w, grid, kern):
    return ll.lisa_local_core_bound(*qkv, *w, grid, kern, dtype=F64)


@given(local_cases(max_tokens=12))
def test_local_core_against_the_loop_oracle(case):
    """Eq. 9 with the window sums written as loops over tokens and offsets (naive_lisa_local), per batch and
    head, within lisa_local_core_bound."""
    grid = case[0]
    qkv, w, kern = _inputs(case)
    got = ll.lisa_local_core(*qkv, *w, grid, kern)
    want = np.empty_like(got)
    for bi in range(got.shape[0]):
        for hi in range(got.shape[1]):
            want[bi, hi] = naive_lisa_local(*(t[bi, hi] for t in qkv), *w, grid, kern)
    numerics.assert_close(got, want, _bound(qkv, w, grid, kern), F64, name="local LiSA vs loop oracle")


@given(local_cases())
def test_local_is_eq7_with_the_windowed_toeplitz_rpe(case):
    """The reading: the local operator is SA Eq. 7 whose RPEs Ra~, Rb are Eq. 2's Toeplitz matrices with e equal
    to the window's taps and zero outside (local_to_toeplitz; the dense RPE built by the loop oracle of Eq. 2)."""
    grid = case[0]
    qkv, (wa, wb, ba, bb), kern = _inputs(case)
    ea, eb = ll.local_to_toeplitz(wa, grid, kern), ll.local_to_toeplitz(wb, grid, kern)
    kg = tuple(2 * n - 1 for n in grid)
    ra, rb = naive_toeplitz(ea.reshape(kg + ea.shape[1:]), grid), naive_toeplitz(eb.reshape(kg + eb.shape[1:]), grid)
    got = ll.lisa_local_core(*qkv, wa, wb, ba, bb, grid, kern)
    want = lisa.sa_eq7(*qkv, ra, rb, ba, bb)
    bound = _bound(qkv, (wa, wb, ba, bb), grid, kern).chain(
        lisa.sa_core_bound(*qkv, "eq7", ra_tilde=ra, rb=rb, bias_a=ba, bias_b=bb, dtype=F64))
    numerics.assert_close(got, want, bound, F64, name="local LiSA vs SA Eq. 7 (windowed Toeplitz RPEs)")


@given(local_cases(), st.integers(0, 2))
def test_a_window_covering_the_grid_is_the_global_toeplitz_lisa(case, extra):
    """k_a = 2 n_a - 1 (+ 2 extra) on every axis: every relative offset of the grid is a tap, and the local
    operator is LiSA's exact Toeplitz form (Eq. 9 without the circular approximation of Eq. 10; lisa_core with
    exact_toeplitz=True) with the same taps as its Toeplitz parameters (for k_a = 2 n_a - 1 the very same array)."""
    grid = case[0]
    kern = tuple(2 * n - 1 + 2 * extra for n in grid)
    qkv, (wa, wb, ba, bb), _ = _inputs(case, kernel=kern)
    ea, eb = ll.local_to_toeplitz(wa, grid, kern), ll.local_to_toeplitz(wb, grid, kern)
    if extra == 0:
        np.testing.assert_array_equal(ea, wa)
        np.testing.assert_array_equal(eb, wb)
    got = ll.lisa_local_core(*qkv, wa, wb, ba, bb, grid, kern)
    want = lisa.lisa_core(*qkv, ea, eb, ba, bb, grid, exact_toeplitz=True)
    bound = _bound(qkv, (wa, wb, ba, bb), grid, kern).chain(
        lisa.lisa_core_bound(*qkv, ea, eb, ba, bb, grid, exact_toeplitz=True, dtype=F64))
    numerics.assert_close(got, want, bound, F64, name="full-window local LiSA vs exact-Toeplitz LiSA")


@given(local_cases(), st.data())
def test_output_depends_only_on_the_window(case, data):
    """Locality (Table 3c "Local"): changing q, k, v at token j leaves, bit for bit, every output token i with
    |i_a - j_a| > (k - 1) / 2 on some axis unchanged."""
    grid, k = case[0], case[5]
    qkv, w, kern = _inputs(case)
    n = int(np.prod(grid))
    j = data.draw(st.integers(0, n - 1))
    moved = tuple(t.copy() for t in qkv)
    for t in moved:
        t[:, :, j] += 1.0
    base, changed = ll.lisa_local_core(*qkv, *w, grid, kern), ll.lisa_local_core(*moved, *w, grid, kern)
    coords = np.stack(np.unravel_index(np.arange(n), grid), axis=-1)
    far = np.any(np.abs(coords - coords[j]) > k // 2, axis=-1)
    np.testing.assert_array_equal(base[:, :, far], changed[:, :, far])


def test_local_to_toeplitz_places_offsets_as_eq2():
    """Eq. 2 indexes e by the offset s = j - i (e[n - 1 + s]); the window's tap t sits at s = t - (k - 1) / 2, and
    taps beyond the grid's offsets (|s| > n - 1) are dropped."""
    w = np.arange(1.0, 6.0)                                   # k = 5 on a 1-D grid of 2 tokens: offsets -2..2
    np.testing.assert_array_equal(ll.local_to_toeplitz(w, (2,), 5), [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(ll.local_to_toeplitz(w[1:4], (4,), 3), [0, 0, 2.0, 3.0, 4.0, 0, 0])


def test_bad_arguments():
    q = np.zeros((1, 1, 6, 2))
    wa, wb, b = np.zeros((9, 2, 3)), np.zeros((9, 3)), np.zeros((2, 3))
    with pytest.raises(ValueError, match="odd"):
        ll.lisa_local_core(q, q, q, np.zeros((4, 2, 3)), np.zeros((4, 3)), b, b, (2, 3), 2)
    with pytest.raises(ValueError, match="weight_a"):
        ll.lisa_local_core(q, q, q, wa[:8], wb, b, b, (2, 3), 3)
    with pytest.raises(ValueError, match="grid"):
        ll.lisa_local_core(q, q, q, wa, wb, b, b, (2, 2), 3)
    with pytest.raises(ValueError, match="per grid axis"):
        ll.lisa_local_core(q, q, q, wa, wb, b, b, (2, 3), (3,))
    with pytest.raises(ValueError, match="local_kernel"):
        rm.create("lisanet_i_t", operator="lisa_local")
    with pytest.raises(ValueError, match="local_kernel"):
        rm.create("lisanet_i_t_sa_eq4", local_kernel=3)
    with pytest.raises(ValueError, match="odd"):
        rm.create("lisanet_i_t_local3", local_kernel=4)


# ---------------------------------------------------------------------------------------------------
# The networks (Table 3c)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [3, 5, 7])
def test_network_layout_and_macs(k):
    """lisanet_i_t_local<k>: LiSANet-I-T with every block's LiSA kernels k x k (weight_a (k^2, 16, 16), weight_b
    (k^2, 16)); per block MACs = qkv, proj, MLP as LiSANet-I-T plus Ga and Gb by direct convolution, N C D k^2
    each, and the contraction 2 N C D (N = 196, C = 192, D = 16)."""
    cfg = rm.create(f"lisanet_i_t_local{k}")[0]
    shapes = rm.param_shapes(cfg)
    assert shapes["stages.0.3.attn.weight_a"] == (k * k, 16, 16)
    assert shapes["stages.0.3.attn.weight_b"] == (k * k, 16)
    assert rm.param_count(cfg) == lisa.lisanet_isotropic_param_count(local_kernel=k)["total"]   # LiSA's layout check
    n, c, d = 196, 192, 16
    m = lisanet.macs(cfg)
    glob = lisanet.macs(rm.create("lisanet_i_t")[0])
    assert m["stages.0.5.attn.local_a"] == m["stages.0.5.attn.local_b"] == n * c * d * k * k
    shared = {key: v for key, v in glob.items() if not key.endswith("attn.spectral")}
    assert counting.total(m) == counting.total(shared) + 12 * 2 * n * c * d * k * k
    assert lisanet.macs(cfg, fft=True) == m


@pytest.mark.parametrize("k", [3, 7])
def test_network_block_is_the_local_core_in_the_lisa_block(k):
    """One block of the reduced network = x + proj(local core(heads(qkv(LN x)))) then + MLP(LN .), the core being
    lisa_local_core on the stage grid (§5.2: only the operator is replaced)."""
    cfg = lisanet.reduced(rm.create(f"lisanet_i_t_local{k}")[0])
    params = lisanet.init_params(cfg, 3)
    x = np.random.default_rng(4).standard_normal((2, cfg.dims[0], 5, 6))
    taps: dict = {}
    got = lisanet.run_unit(params, "stages.0.1", x, cfg, taps=taps)
    p = {key[len("stages.0.1."):]: v for key, v in params.items() if key.startswith("stages.0.1.")}
    ln1 = taps["ln1"]
    qkv = ln1 @ p["attn.qkv.weight"].T + p["attn.qkv.bias"]
    b, n, c3 = qkv.shape
    t = qkv.reshape(b, n, 3, 3, c3 // 9).transpose(2, 0, 3, 1, 4)
    core = ll.lisa_local_core(t[0], t[1], t[2], p["attn.weight_a"], p["attn.weight_b"], p["attn.bias_a"],
                              p["attn.bias_b"], (5, 6), k)
    merged = core.transpose(0, 2, 1, 3).reshape(b, n, -1)
    np.testing.assert_array_equal(merged, taps["attn.merged"])
    np.testing.assert_array_equal(taps["resid1"], x.reshape(2, cfg.dims[0], -1).transpose(0, 2, 1) + taps["attn"])
    assert got.shape == x.shape


def test_network_kernels_do_not_depend_on_the_resolution():
    """The local kernels are k x k taps: resize_params keeps them (only the position embedding moves), and the
    resized network runs at the new resolution."""
    cfg = lisanet.reduced(rm.create("lisanet_i_t_local5")[0])
    params = lisanet.init_params(cfg, 0)
    moved, new_cfg = lisanet.resize_params(params, cfg, (28, 32))
    for key, v in params.items():
        if ".attn." in key:
            np.testing.assert_array_equal(moved[key], v)
    assert moved["pos_embed"].shape == (1, 7 * 8, cfg.dims[0])
    out = lisanet.forward(moved, np.zeros((1, 3, 28, 32)), new_cfg)
    assert out.shape == (1, cfg.num_classes) and np.all(np.isfinite(out))
