"""Convolution bounds that cover other algorithms (refimpl.bounds.covering_conv_algorithms): Winograd
F(6 x 6, 3 x 3) and FFT on tiles, the algorithms of NNPACK (PyTorch's CPU convolution with oneDNN off, batch >= 16)
and of cuDNN.

Their errors are not a direct convolution's: Winograd's transforms cancel and FFT errs normwise over a tile, so
next to a large input a small output errs by up to 10^5 times the direct bound gamma_n conv(|x|, |w|).  Checked
here: the default bounds are the direct ones bit for bit; covering changes only the convolutions the algorithms
apply to; our own float32 evaluations by each algorithm (refimpl.ensemble's Winograd, a tiled FFT written
below) lie within the covering bound, worst case, on N(0, 1) and on mixed-scale input, where they break the
direct bound; and PyTorch's own NNPACK path does too where this build has it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from refimpl import bounds, config, ensemble, layers, verdict  # noqa: E402
from refimpl.attention import focused_bounds  # noqa: E402
from tests.test_bound_tightness import TIGHTNESS_MARGIN  # noqa: E402

COVER = ("winograd", "fft")


def _data(hw: int, mixed: bool, k: int = 3, c: int = 8, batch: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 31 * hw + k)
    x = torch.randn(batch, c, hw, hw, generator=g)
    if mixed:                       # one large entry per image and channel: small outputs beside a large input
        x[:, :, hw // 2, hw // 2] *= 1e4
    return x, torch.randn(c, 1, k, k, generator=g), torch.randn(c, generator=g)


def _ratio(got: torch.Tensor, x, w, b, k: int, cover: tuple[str, ...]) -> float:
    """max |err| / worst-case bound of the float32 result ``got`` under the bounds covering ``cover``."""
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=k // 2, groups=x.shape[1]).numpy()
    with bounds.covering_conv_algorithms(*cover):
        bd = layers.depthwise_conv2d_bound(x.double().numpy(), w.double().numpy(), b.double().numpy(), padding=k // 2)
    err = np.abs(got.double().numpy() - ref)
    return float(np.max(err / bd.array("float32", err.shape)))


def _tiled_fft_conv(x, w, b, tile: int):
    """Depthwise 'same' correlation by FFT on tiles (overlap-save, as NNPACK's ft8x8 / ft16x16): each
    (tile - k + 1)^2 output block from the tile x tile input around it, its real 2-D spectrum times the
    kernel's, in float32."""
    k = w.shape[-1]
    step = tile - k + 1
    bsz, c, h, wd = x.shape
    th, tw = -(-h // step), -(-wd // step)
    xp = F.pad(x, (k // 2, step * tw + tile - wd - k // 2 - step, k // 2, step * th + tile - h - k // 2 - step))
    tiles = xp.unfold(2, tile, step).unfold(3, tile, step)                       # (B, C, th, tw, T, T)
    kern = torch.zeros(c, tile, tile, dtype=x.dtype)
    kern[:, :k, :k] = w[:, 0]
    spec = torch.fft.rfft2(tiles) * torch.conj(torch.fft.rfft2(kern))[None, :, None, None]
    y = torch.fft.irfft2(spec, s=(tile, tile))[..., :step, :step]               # correlation: valid part first
    y = y.permute(0, 1, 2, 4, 3, 5).reshape(bsz, c, th * step, tw * step)[:, :, :h, :wd]
    return y + b[None, :, None, None]


def test_default_bounds_are_the_direct_ones():
    assert bounds.conv_algorithms() == ("direct",)
    x, w, b = (t.double().numpy() for t in _data(9, False, batch=2))
    bd = layers.depthwise_conv2d_bound(x, w, b, padding=1)
    direct = F.conv2d(torch.from_numpy(np.abs(x)), torch.from_numpy(np.abs(w)), torch.from_numpy(np.abs(b)),
                      padding=1, groups=8).numpy()
    # both sides sum 9 non-negative products and the bias in float64 (10 roundings each, so each is within
    # gamma_10 of the exact sum, relatively): they differ by at most gamma_20 of the direct one
    rtol = verdict.gamma(20, verdict.unit_roundoff("float64"))
    assert np.allclose(bd.scale, direct, rtol=rtol, atol=0) and bd.k == 10 and "Winograd" not in bd.note


def test_covering_changes_only_the_convolutions_the_algorithms_apply_to():
    x = np.random.default_rng(0).standard_normal((2, 4, 9, 9))
    w3, w5 = (np.random.default_rng(1).standard_normal(s) for s in ((4, 4, 3, 3), (4, 4, 5, 5)))
    cases = [(w3, dict(padding=1), True), (w5, dict(padding=2), True), (w3, dict(stride=2, padding=1), False),
             (w3, dict(dilation=2, padding=2), False)]
    for w, kw, applies in cases:
        plain = layers.conv2d_bound(x, w, **kw)
        with bounds.covering_conv_algorithms("winograd"):
            wino = layers.conv2d_bound(x, w, **kw)
        with bounds.covering_conv_algorithms("fft"):
            fft = layers.conv2d_bound(x, w, **kw)
        assert np.array_equal(wino.scale, plain.scale) == (not applies or w.shape[-1] != 3), kw
        assert np.array_equal(fft.scale, plain.scale) == (not applies), kw
        if applies:
            assert np.all(fft.scale >= plain.scale) and np.all(wino.scale >= plain.scale)
    assert bounds.conv_algorithms() == ("direct",)


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="argument 'names'.*'bogus'"):
        with bounds.covering_conv_algorithms("bogus"):
            pass


#: Measured on these inputs (seed 0; measurements, not tolerances): the largest err / direct bound of the two
#: Winograd alignments, where the direct bound is broken ((hw, mixed)), and err / covering bound of the aligned
#: Winograd on mixed-scale input.  Checked as test_bound_tightness checks its cases: at least the measured value /
#: TIGHTNESS_MARGIN (a covering bound loosened tenfold fails).
WINOGRAD_OVER_DIRECT = {(2, True): 151.0, (7, False): 33.1, (7, True): 1.55e5, (14, False): 75.2, (14, True): 7.02e3}
WINOGRAD_OVER_COVER = {2: 0.0168, 7: 0.0140, 14: 0.0133}


@pytest.mark.parametrize("hw", [2, 7, 14])
@pytest.mark.parametrize("mixed", [False, True])
def test_winograd_float32_lies_within_the_covering_bound(hw, mixed):
    """Both tile alignments; on mixed-scale input (and for grids of a tile or more on N(0, 1)) the direct
    bound is broken by far (WINOGRAD_OVER_DIRECT), and the covering bound is not vacuous there
    (WINOGRAD_OVER_COVER of it reached)."""
    x, w, b = _data(hw, mixed)
    worst = []
    for name in ("winograd conv", "winograd conv end-aligned"):
        with ensemble.variant(name):
            got = F.conv2d(x, w, b, padding=1, groups=8)
        assert _ratio(got, x, w, b, 3, COVER) <= 1.0
        worst.append(_ratio(got, x, w, b, 3, ()))
    if mixed or hw >= 7:
        assert max(worst) >= WINOGRAD_OVER_DIRECT[hw, mixed] / TIGHTNESS_MARGIN, worst
    if mixed:
        with ensemble.variant("winograd conv"):
            got = F.conv2d(x, w, b, padding=1, groups=8)
        assert _ratio(got, x, w, b, 3, COVER) >= WINOGRAD_OVER_COVER[hw] / TIGHTNESS_MARGIN


@pytest.mark.parametrize("tile", [8, 16, 32])
@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("mixed", [False, True])
def test_tiled_fft_float32_lies_within_the_covering_bound(tile, k, mixed):
    x, w, b = _data(20, mixed, k=k, batch=2)
    with torch.no_grad():
        got = _tiled_fft_conv(x, w, b, tile)
        exact = _tiled_fft_conv(x.double(), w.double(), b.double(), tile)
    direct = F.conv2d(x.double(), w.double(), b.double(), padding=k // 2, groups=8).numpy()
    # Both are float64 evaluations of one convolution y: the tiled FFT errs by at most gamma_kf(u_64) S_f + kf eta
    # (bounds.fft_tile_scale with this tile and fft_tile_roundings: Higham 2002 Thm 24.2's normwise FFT error
    # per tile, each output charged the tile's sum |x| times sum |w|), the direct sum by gamma_kd(u_64) S_d + kd eta
    # (layers.depthwise_conv2d_bound: Higham eq. 3.12, S_d = conv(|x|, |w|) + |b|); |fft - direct| is within the
    # sum (first-order bounds, as the project's: O(u^2) and their own float64 evaluation, relative O(u), dropped,
    # as Bound.array drops them).  Reached to 0.15 at most
    # (tile 8, k 7, mixed; typically 1e-4 .. 5e-3): a worst-case bound over 175 .. 259 roundings per output,
    # which random rounding errors do not line up to reach, so halving it cannot fail on these data.
    xd, wd, bd = (t.double().numpy() for t in (x, w, b))
    u, eta = verdict.unit_roundoff("float64"), verdict.underflow_eta("float64")
    s_f = bounds.fft_tile_scale(xd, wd, bd, k // 2, groups=8, tile=tile)
    k_f = bounds.fft_tile_roundings(1, True, tile)
    d = layers.depthwise_conv2d_bound(xd, wd, bd, padding=k // 2)
    tol = verdict.gamma(k_f, u) * s_f + verdict.gamma(d.k, u) * d.scale + (k_f + d.k) * eta
    assert np.all(np.abs(exact.numpy() - direct) <= tol)
    assert tile <= config.CONV_FFT_TILE
    assert _ratio(got, x, w, b, k, ("fft",)) <= 1.0
    if mixed:
        assert _ratio(got, x, w, b, k, ()) > 1.0        # normwise: the direct bound does not cover it


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("hw", [2, 7, 14, 28])
@pytest.mark.parametrize("mixed", [False, True])
def test_pytorch_nnpack_path_lies_within_the_covering_bound(k, hw, mixed):
    """PyTorch's CPU convolution with oneDNN off (NNPACK at batch 16), as it is on this build."""
    if not ensemble.nnpack_available():
        pytest.skip("this PyTorch build has no NNPACK")
    x, w, b = _data(hw, mixed, k=k)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        got = F.conv2d(x, w, b, padding=k // 2, groups=8)
    assert _ratio(got, x, w, b, k, COVER) <= 1.0


def test_running_bounds_cover_them_too():
    """The running form (bounds.e_depthwise through focused_bounds.err_dwconv, as FLatten's, L2ViT's and the
    networks' bounds use it) takes the same coverage: Winograd's float32 output within it, and outside the
    direct running bound; the l2 coefficient widens with it."""
    x, w, b = _data(7, True)
    with ensemble.variant("winograd conv"):
        got = F.conv2d(x, w, b, padding=1, groups=8).double().numpy()
    xd, wd, bd = (t.double().numpy() for t in (x, w, b))
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1, groups=8).numpy()
    u = verdict.unit_roundoff("float32")
    zero = np.zeros_like(xd)
    _, e_direct, _ = focused_bounds.err_dwconv(xd, zero, wd, bd, dtype="float32")
    with bounds.covering_conv_algorithms(*COVER):
        _, e_cover, _ = focused_bounds.err_dwconv(xd, zero, wd, bd, dtype="float32")
        _, s_l2, _ = focused_bounds.err_dwconv(xd, zero, wd, bd, dtype="float32", l2=True)
    err = np.abs(got - ref) / u                      # first-order coefficients: units of u
    assert np.all(err <= e_cover) and np.max(err / e_direct) > 10
    # the l2 coefficient sigma (the probabilistic bound lam u sigma; lam = 6: P <= 2 exp(-18) per element) covers it
    assert np.all(np.isfinite(s_l2)) and np.all(err <= 6.0 * s_l2)


def test_min_batch_limits_the_covering():
    x2, x16 = (np.random.default_rng(2).standard_normal((b, 4, 9, 9)) for b in (2, 16))
    w = np.random.default_rng(3).standard_normal((4, 1, 3, 3))
    with bounds.covering_conv_algorithms("winograd", min_batch=16):
        small = layers.depthwise_conv2d_bound(x2, w, padding=1)
        large = layers.depthwise_conv2d_bound(x16, w, padding=1)
    assert np.array_equal(small.scale, layers.depthwise_conv2d_bound(x2, w, padding=1).scale)
    assert np.all(large.scale >= layers.depthwise_conv2d_bound(x16, w, padding=1).scale)
    assert not np.array_equal(large.scale, layers.depthwise_conv2d_bound(x16, w, padding=1).scale)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="argument 'min_batch'"):
            with bounds.covering_conv_algorithms("winograd", min_batch=bad):
                pass


def test_pytorch_takes_nnpack_from_the_stated_batch():
    """config.NNPACK_MIN_BATCH is PyTorch's rule: with oneDNN off, a float32 3 x 3 convolution of batch 15 errs as
    a direct one (within the direct bound on mixed-scale input), of batch 16 as Winograd (far outside it)."""
    if not ensemble.nnpack_available():
        pytest.skip("this PyTorch build has no NNPACK")
    ratios = {}
    for batch in (config.NNPACK_MIN_BATCH - 1, config.NNPACK_MIN_BATCH):
        x, w, b = _data(7, True, batch=batch)
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            got = F.conv2d(x, w, b, padding=1, groups=8)
        ratios[batch] = _ratio(got, x, w, b, 3, ())
    assert ratios[config.NNPACK_MIN_BATCH - 1] <= 1.0 < 10.0 < ratios[config.NNPACK_MIN_BATCH], ratios


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_cover_rounds_to_t_on_the_output(mixed, dtype):
    """cuDNN evaluates a float16 / bfloat16 convolution's transforms in float32 and rounds the result to T (then
    adds the bias in T): the covering bound charges the transforms at u_32 on the algorithm's magnitude S_a and the
    roundings to T on the output's (Bound.store_scale = the direct S; the running form likewise).  Such
    evaluations (Winograd both alignments, tiled FFT, emulated) lie within both forms; and the bound is conclusive,
    where charging the roundings to T on S_a, as before, made it void (so it was on an H200 run: whole 56 x 56
    depthwise stages at relative bounds of 3.5 - 1.1e3)."""
    tdt = getattr(torch, dtype)
    x, w, b = _data(14, mixed, k=3)
    x, w, b = (t.to(tdt).float() for t in (x / 16, w, b))          # / 16: the spike's outputs inside float16's range
    xd, wd, bd = (t.double().numpy() for t in (x, w, b))
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1, groups=8).numpy()
    with bounds.covering_conv_algorithms(*COVER):
        bd_cover = layers.depthwise_conv2d_bound(xd, wd, bd, padding=1)
        zero = np.zeros_like(xd)
        _, e_run, _ = focused_bounds.err_dwconv(xd, zero, wd, bd, dtype=dtype)
    assert bd_cover.store_scale is not None
    limit = bd_cover.array(dtype, ref.shape)
    runs = []
    for name in ("winograd conv", "winograd conv end-aligned"):
        with torch.no_grad(), ensemble.variant(name):
            runs.append(F.conv2d(x, w, None, padding=1, groups=8))
    with torch.no_grad():
        runs.append(_tiled_fft_conv(x, w, torch.zeros_like(b), config.CONV_FFT_TILE))
    u = verdict.unit_roundoff(dtype)
    for y32 in runs:
        got = (y32.to(tdt) + b.to(tdt)[None, :, None, None]).double().numpy()
        err = np.abs(got - ref)
        assert np.all(err <= limit)
        assert np.all(err <= u * e_run)
    # the verdict's relative bound (refimpl.verdict: b_i / max(|ref_i|, rms(ref))) below 1, conclusive (measured
    # 0.014 - 0.049); with the roundings to T on S_a it is 15 - 330, void
    size = np.maximum(np.abs(ref), np.sqrt(np.mean(ref ** 2)))
    assert np.max(limit / size) < 1.0
    old = dataclasses.replace(bd_cover, store_scale=None).array(dtype, ref.shape)
    assert np.max(old / size) >= 1.0
