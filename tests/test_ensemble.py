"""refimpl.ensemble: every legitimate variant computes the same mathematics as the torch function it replaces.

In float64 a variant may differ from torch's own kernel only by rounding: each output is compared with the
float64 torch result through the verdict with the operation's inner-product bound (Higham 3.12; no ensemble, so
the bound alone decides), and the variant must actually intercept the call (a summation order that changes no
bit anywhere in a long sum would mean the call went to torch untouched).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from refimpl import bounds, ensemble, layers, verdict  # noqa: E402
from refimpl.verdict import Bound  # noqa: E402

GEN = torch.Generator().manual_seed(7)


def _t(*shape):
    return torch.randn(*shape, generator=GEN, dtype=torch.float64)


def _abs_bound(fn_abs, k):
    """Higham's bound of an inner-product computation: gamma_k times the computation on absolute values."""
    return Bound(np.asarray(fn_abs, dtype=np.float64), k, "test: gamma_k on absolute values", accumulation=True)


CASES = {
    # name: (callable, callable on absolute values, k)
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: F.linear(x.abs(), w.abs(), b.abs()), 65),
    "matmul": (lambda x, w, b: x @ w.t(), lambda x, w, b: x.abs() @ w.abs().t(), 64),
    "einsum": (lambda x, w, b: torch.einsum("bnc,oc->bno", x, w), lambda x, w, b: x.abs() @ w.abs().t(), 64),
    "sum": (lambda x, w, b: x.sum(dim=-1), lambda x, w, b: x.abs().sum(dim=-1), 64),
    "mean": (lambda x, w, b: x.mean(dim=(0, 2)), lambda x, w, b: x.abs().mean(dim=(0, 2)), 6 * 64 + 1),
}


@pytest.mark.parametrize("variant", ensemble.ORDERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_summation_orders_compute_the_same_contractions(variant, case):
    fn, fn_abs, k = CASES[case]
    x, w, b = _t(2, 3, 64), _t(5, 64), _t(5)
    ref = fn(x, w, b)
    with torch.no_grad(), ensemble.variant(variant):
        got = fn(x, w, b)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    verdict.assert_close(got, ref.numpy(), _abs_bound(fn_abs(x, w, b).numpy(), 2 * k), "float64",
                         name=f"{case} [{variant}]")


def test_a_long_sum_is_actually_reordered():
    """Recursive and pairwise summation of 4096 terms differ somewhere: the mode intercepts the call."""
    x = _t(64, 4096)
    with ensemble.variant("recursive"):
        a = x.sum(dim=-1)
    with ensemble.variant("pairwise"):
        b = x.sum(dim=-1)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("variant", ensemble.ORDERS + ("fft conv",))
@pytest.mark.parametrize("conv", [dict(padding=1, groups=2), dict(padding="same"), dict(padding="valid", stride=2),
                                  dict(padding=2, dilation=2, groups=4), dict(stride=(2, 1), padding=(0, 1))])
def test_convolution_variants(variant, conv):
    """im2col in each summation order, and FFT convolution, against torch's conv2d (groups, stride,
    dilation, "same"/"valid" padding)."""
    x = _t(2, 4, 9, 8)
    groups = conv.get("groups", 1)
    w = _t(6 if groups < 4 else 4, 4 // groups, 3, 3)
    b = _t(w.shape[0])
    ref = F.conv2d(x, w, b, **conv)
    with torch.no_grad(), ensemble.variant(variant):
        got = F.conv2d(x, w, b, **conv)
    s = F.conv2d(x.abs(), w.abs(), b.abs(), **conv).numpy()
    n = w.shape[1] * 9 + 1
    # FFT convolution errs normwise: each output sees a transform of the padded plane (log2 terms) on the
    # plane's and the kernel's 1-norms; the element-wise inner-product bound covers it at these sizes with the
    # transform's depth added (2 log2(plane) + 2 stages).
    k = n + (2 * int(np.ceil(np.log2(x.shape[-1] * x.shape[-2] * 4))) + 2 if variant == "fft conv" else 0)
    bound = _abs_bound(s, k)
    if variant == "fft conv":
        bound = Bound(np.broadcast_to(np.abs(x).sum().item() * np.abs(w).max().item(), s.shape), k,
                      "FFT convolution: normwise", accumulation=False)
    verdict.assert_close(got, ref.numpy(), bound, "float64", name=f"conv2d {conv} [{variant}]")


@pytest.mark.parametrize("variant", ensemble.ORDERS + ("libm",))
def test_norms_softmax_and_layer_norm(variant):
    x = _t(3, 5, 16) * 3
    ln = torch.nn.LayerNorm(16).double()
    with torch.no_grad():
        ln.weight.copy_(_t(16))
        ln.bias.copy_(_t(16))
        refs = [torch.softmax(x, -1), x.softmax(dim=1), F.softmax(x, dim=-1), x.norm(dim=-1),
                torch.linalg.vector_norm(x, dim=(1, 2)), F.normalize(x, dim=-1), ln(x)]
        with ensemble.variant(variant):
            gots = [torch.softmax(x, -1), x.softmax(dim=1), F.softmax(x, dim=-1), x.norm(dim=-1),
                    torch.linalg.vector_norm(x, dim=(1, 2)), F.normalize(x, dim=-1), ln(x)]
    for i, (g, r) in enumerate(zip(gots, refs)):
        r = r.numpy()
        # softmax rows and norms are well conditioned: a relative bound with the depth of their sums (16 or
        # 80 terms, exp's and sqrt's few ulps); LayerNorm by layers.layer_norm_bound.
        lw, lb = ln.weight.detach().numpy(), ln.bias.detach().numpy()
        b = layers.layer_norm_bound(x.numpy(), lw, lb, ln.eps) if i == 6 else \
            Bound(np.abs(r), 2 * 80 + 16, "sums of <= 80 terms, exp/sqrt ulps")
        verdict.assert_close(g, r, b, "float64", name=f"op {i} [{variant}]")


def test_libm_elementwise_functions():
    x = _t(2000) * 6
    fns = [torch.exp, torch.tanh, torch.sigmoid, lambda t: F.gelu(t), lambda t: F.gelu(t, approximate="tanh")]
    for i, fn in enumerate(fns):
        ref = fn(x)
        with ensemble.variant("libm"):
            got = fn(x)
        # a few ulps of the result, or of |x| for GELU, whose 1 + erf cancels for x << 0
        scale = np.abs(x.numpy()) if i >= 3 else np.abs(ref.numpy())
        verdict.assert_close(got, ref.numpy(), Bound(scale, 16, "few-ulp formulas"), "float64", name=f"libm {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_float32_and_keep_their_dtype(dtype):
    x, w = _t(4, 256).to(dtype), _t(8, 256).to(dtype)
    with ensemble.variant("recursive"):
        got = F.linear(x, w)
    assert got.dtype == dtype
    # y = x w^T exactly, S = |x| |w|^T.  (1) The float32 sum s: each term passes k roundings (T = float32: its
    # product and 255 additions, k = 256; half T: products of <= 11-bit significands are exact in float32, k = 255),
    # and float32's p = 256 rounded products may underflow (Higham 2002 eq. 2.8): |s - y| <= gamma_k(u_32) S
    # + p eta_32 (eq. 3.12, Lemma 3.1).  (2) One rounding into T (half T only; none for float32: u_r = eta_r = 0):
    # |fl_T(s) - s| <= u_T |s| + eta_T (eq. 2.8, a subnormal T result), |s| <= |y| + gamma_k S (p = 0 there).
    # (3) The float64 reference r: exact products (<= 24-bit significands), <= 255 additions per term,
    # |r - y| <= gamma_255(u_64) S, so |y| <= |r| + gamma_255(u_64) S.  Together
    # |got - r| <= (1 + u_r) (gamma_k(u_32) + gamma_255(u_64)) S + u_r |r| + eta_r + p eta_32 =: B.
    # (4) This check's float64 evaluation: the computed S errs by gamma_255(u_64) relatively (non-negative terms),
    # so S <= s / (1 - gamma_255) <= s (1 + gamma_510) (1 / (1 - gamma_n) <= 1 + gamma_2n); B's formula on s
    # (c: gamma's 1 - n u and quotient, the sum, the product by 1 + u_r (itself exact): 4 roundings; c s: 1; two sums:
    # 2; u_r |r| and the eta terms exact) keeps b >= (1 - gamma_7) B(s), and err's subtraction rounds once:
    # err <= b (1 + gamma_525) (Lemma 3.3); forming b (1 + gamma_m) rounds 4 more times (gamma_m's two, 1 + it,
    # the product): m = 529.  Nothing is free: halving the u_r |r|
    # term (the rounding into T) fails for bfloat16 and float16; gamma_k S alone (float32) is a worst case over
    # 256 roundings, reached to 1 % by N(0, 1) data; eta_r and p eta_32 cannot be reached (no output is subnormal
    # in T, no product underflows).
    half = dtype != torch.float32
    u32, u64 = verdict.unit_roundoff("float32"), verdict.unit_roundoff("float64")
    u_r, eta_r = (verdict.unit_roundoff(str(dtype)), verdict.underflow_eta(str(dtype))) if half else (0.0, 0.0)
    k, p = (255, 0) if half else (256, 256)
    r = (x.double() @ w.double().t()).numpy()
    s = (x.double().abs() @ w.double().abs().t()).numpy()
    c = (1 + u_r) * (verdict.gamma(k, u32) + verdict.gamma(255, u64))
    bound = c * s + u_r * np.abs(r) + (eta_r + p * verdict.underflow_eta("float32"))
    err = np.abs(got.double().numpy() - r)
    assert np.all(err <= bound * (1 + verdict.gamma(529, u64))), float(np.max(err / bound))


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="argument 'name'"):
        with ensemble.variant("bogus"):
            pass


def test_legitimate_runs_runs_every_variant_once():
    calls = []

    def fn():
        calls.append(1)
        return _t(3)

    out = ensemble.legitimate_runs(fn)
    assert list(out) == list(ensemble.DEFAULT_VARIANTS) and len(calls) == len(ensemble.DEFAULT_VARIANTS)


@pytest.mark.parametrize("align", ["start", "end"])
@pytest.mark.parametrize("conv", [dict(padding=1, groups=2), dict(padding="same", groups=4), dict(padding=0),
                                  dict(padding=(1, 0), groups=1)])
def test_winograd_convolution_is_the_convolution(align, conv):
    """Winograd F(6 x 6, 3 x 3) in float64 against torch's conv2d, within the algorithm's own componentwise
    bound (refimpl.bounds.winograd_scale and winograd_roundings).  The grid (2 x 13 x 17) needs several tiles
    in each direction and a ragged last one."""
    x = _t(2, 4, 13, 17)
    groups = conv.get("groups", 1)
    w, b = _t(8, 4 // groups, 3, 3), _t(8)
    ref = F.conv2d(x, w, b, **conv)
    name = "winograd conv" if align == "start" else "winograd conv end-aligned"
    with torch.no_grad(), ensemble.variant(name):
        got = F.conv2d(x, w, b, **conv)
    pads = layers.conv_padding(conv["padding"], (3, 3), (1, 1), (1, 1))
    s = bounds.winograd_scale(x.numpy(), w.numpy(), b.numpy(), pads, groups)
    k = bounds.winograd_roundings(4 // groups, True)
    verdict.assert_close(got, ref.numpy(), _abs_bound(s, k), "float64", name=f"winograd {conv} [{align}]")


def test_winograd_leaves_other_convolutions_to_torch():
    """A 5 x 5 kernel, a stride or a dilation is not F(6 x 6, 3 x 3): torch's own kernel runs, bit for bit."""
    x = _t(1, 4, 9, 9)
    for w, kw in [(_t(4, 1, 5, 5), dict(padding=2, groups=4)), (_t(4, 4, 3, 3), dict(stride=2)),
                  (_t(4, 4, 3, 3), dict(dilation=2))]:
        with ensemble.variant("winograd conv"):
            got = F.conv2d(x, w, **kw)
        assert torch.equal(got, F.conv2d(x, w, **kw)), kw


def test_winograd_float32_error_is_its_own_not_a_direct_convolutions():
    """Why the ensemble holds Winograd: in float32 its error stays within its own componentwise bound but is
    tens to thousands of u on the direct convolution's sum |w| |x| (NNPACK's 3 x 3 algorithm, which PyTorch's
    CPU convolution takes with oneDNN off at batch >= 16, errs the same way) - no summation order comes near.
    On a mixed-scale input (a large entry beside small ones in the same tile) the error exceeds even the direct
    convolution's worst-case bound gamma_10 sum |w| |x| at the small outputs: the element-wise bound of a
    direct convolution does not cover Winograd."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 8, 12, 12, generator=g)
    x[:, :, 5, 5] *= 1e4                                     # one large entry per image and channel
    w = torch.randn(8, 1, 3, 3, generator=g)
    ref = F.conv2d(x.double(), w.double(), padding=1, groups=8)
    direct = F.conv2d(x.double().abs(), w.double().abs(), padding=1, groups=8).numpy()
    with ensemble.variant("winograd conv"):
        got = F.conv2d(x, w, padding=1, groups=8)
    err = np.abs(got.double().numpy() - ref.numpy())
    u = verdict.unit_roundoff("float32")
    own = bounds.winograd_scale(x.double().numpy(), w.double().numpy(), None, 1, groups=8)
    assert np.all(err <= verdict.gamma(bounds.winograd_roundings(1, False), u) * own)
    assert np.max(err / (verdict.gamma(10, u) * direct)) > 1
    with ensemble.variant("pairwise"):
        im2col = F.conv2d(x, w, padding=1, groups=8)
    assert np.max(np.abs(im2col.double().numpy() - ref.numpy()) / (u * direct)) < 10
