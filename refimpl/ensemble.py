"""Legitimate evaluations of a PyTorch computation: the ensemble the verdict calibrates against.

Layer: a torch-facing helper beside :mod:`refimpl.verdict` (imports config only; torch is imported when a
function here is first called, never by ``import refimpl``).

A correct implementation of a layer in precision T may sum its inner products in any order, convolve by any
algorithm and split its work over any number of threads; each choice gives a different, equally legitimate
rounding error.  :func:`legitimate_runs` re-runs a torch callable under such choices and returns every output,
for :func:`refimpl.verdict.compare`'s ensemble criterion:

``"recursive"``, ``"reversed"``, ``"pairwise"``, ``"blocked"``
    every contraction (``@``/``matmul``/``bmm``, ``F.linear``, ``einsum``, ``conv2d`` as im2col) and every
    reduction (``sum``, ``mean``, the mean and variance inside ``layer_norm``, the normaliser of ``softmax``,
    2-norms) re-evaluated with that summation order: left to right; right to left; pairwise (a balanced tree);
    blocks of ``config.ENSEMBLE_BLOCK`` terms summed left to right, then the block sums left to right.
    Products are formed first (exact for float16/bfloat16 operands in float32), so only the order of the
    additions changes.  Half-precision inputs accumulate in float32 and round the result to T once, as
    PyTorch's CPU kernels and tensor-core GEMMs do.
``"libm"``
    the elementary functions evaluated another way, as another math library would, each within a few ulps:
    exp(x) as exp(x/2)^2, tanh(|x|) as -t / (2 + t) with t = expm1(-2|x|), the logistic sigmoid from that exp,
    softmax and GELU composed from these instead of the fused kernels (below float64, erf by Abramowitz & Stegun
    7.1.26, absolute error 1.5e-7, as PyTorch's vectorized CPU GELU evaluates it), LayerNorm as one affine map
    y = x a + c (a = w rsqrt(var + eps), c = b - mean a), the fused CPU kernel's form, whose x a and mean a
    cancel where |mean| >> std.  Libraries differ by a few
    ulps in exactly these functions (config.ELEMENTARY_FUNCTION_ULPS), and summation orders alone do not
    show it.
``"fft conv"``
    convolutions by FFT (real transforms of the zero-padded input and kernel): a different algorithm with a
    normwise rather than element-wise error.
``"winograd conv"``
    3 x 3 convolutions of stride and dilation 1 by Winograd's minimal filtering F(6 x 6, 3 x 3) (Lavin & Gray,
    "Fast algorithms for convolutional neural networks", CVPR 2016; interpolation points 0, +-1, +-2, +-1/2 and
    infinity), with the input, kernel and output transforms evaluated in the accumulation dtype: NNPACK's 3 x 3
    algorithm, which PyTorch's CPU convolution takes when oneDNN is off, and one of cuDNN's.  Its transforms
    have entries up to 32 and 21/4, so its error is several times a direct convolution's (tens of u per
    element of sum |w| |x|): a legitimate error that no summation order reproduces.  Other convolutions run
    as PyTorch's own.
``"winograd conv end-aligned"``
    the same with the tiles aligned to the end of the image instead of its start: an output's error depends on
    its place in its 6 x 6 tile, and an image smaller than a tile (a Swin window) sits at the other end of it.
``"onednn toggled"``
    PyTorch with oneDNN (mkldnn) in the other setting: switched off when it is on (PyTorch's own convolution,
    GEMM and activation kernels), switched on when the tested run has it off (REFIMPL_TORCH_ONEDNN=0, a build
    or platform without it).  Both library paths are legitimate, whichever the tested code took; where oneDNN
    is not available the variant changes nothing and the verdict drops it.
``"threads 1"``, ``"threads 2"``, ``"threads 16"``
    PyTorch's own kernels with that intra-op thread count (other work splits and reduction trees).

The re-evaluations implement the same mathematics as the functions they replace; their own tests
(tests/test_ensemble.py) check each against float64 PyTorch.  In :mod:`equivalence` the callable is our own
twin; in the verifier it is our twin too, never the foreign module under test, so a defect of the tested code
cannot enlarge the ensemble that judges it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

from . import config

__all__ = ["ORDERS", "CONV_VARIANTS", "nnpack_available", "nnpack_may_run", "VARIANTS", "DEFAULT_VARIANTS", "legitimate_runs", "stage_ensemble", "variant", "ordered_sum"]

ORDERS = ("recursive", "reversed", "pairwise", "blocked")
CONV_VARIANTS = ("fft conv", "winograd conv", "winograd conv end-aligned")
VARIANTS = ORDERS + ("libm",) + CONV_VARIANTS + ("onednn toggled", "threads 1", "threads 2", "threads 16")
#: What the equivalence suite runs: the four summation orders, other elementary-function evaluations, FFT and
#: Winograd convolution and oneDNN in its other setting.  The thread variants change nothing on most CPU kernels at test
#: sizes (bit-identical outputs) and are run by benchmarks/verdict.py instead.
DEFAULT_VARIANTS = ORDERS + ("libm",) + CONV_VARIANTS + ("onednn toggled",)


def legitimate_runs(fn: Callable[[], Any], variants: Sequence[str] = DEFAULT_VARIANTS) -> dict[str, Any]:
    """``{name: fn()}`` with ``fn`` run once under each variant (module docstring), under ``torch.no_grad``.

    ``fn`` takes no arguments and returns a tensor.  Unknown variant names raise ``ValueError``."""
    import torch

    out = {}
    for name in variants:
        with torch.no_grad(), variant(name):
            out[name] = fn()
    return out


def stage_ensemble(tensors_of: Callable[..., dict[str, Any]], tested: Mapping[str, Any],
                   variants: Sequence[str] = DEFAULT_VARIANTS) -> dict[str, dict[str, Any]]:
    """Teacher-forced legitimate evaluations of every stage: ``{stage: {variant: tensor}}``.

    ``tensors_of(force=...)`` runs the twin once and returns its stage tensors (:func:`refimpl.twins.taps.capture`,
    or a twin module's ``stage_tensors``); ``tested`` is the tested run's.  Under each variant the twin runs with
    every tested tensor forced, so each stage is computed by that variant's arithmetic from exactly the inputs
    the tested run gave it - the inputs its stage-wise reference is computed from
    (:func:`refimpl.verdict.compare_stages`'s ``ensembles``; the verify tool's stage-wise verdict)."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name in variants:
        with torch.no_grad(), variant(name):
            got = tensors_of(force=tested)
        for key, val in got.items():
            out.setdefault(key, {})[name] = val
    return out


def nnpack_available() -> bool:
    """This PyTorch build has NNPACK and it is enabled (``torch.backends.nnpack``)."""
    import torch

    return bool(torch.backends.nnpack.is_available() and torch._C._get_nnpack_enabled())


def nnpack_may_run(dtype: Any = "float32") -> bool:
    """PyTorch's CPU convolution may take NNPACK (Winograd, FFT tiles) now: oneDNN off, NNPACK available, and a
    float32 convolution (its only format; from batch config.NNPACK_MIN_BATCH: refimpl.bounds
    .covering_conv_algorithms's ``min_batch``)."""
    import torch

    return str(dtype).replace("torch.", "") == "float32" and not torch._C._get_mkldnn_enabled() \
        and nnpack_available()


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Run the enclosed torch code under one legitimate-algorithm variant (module docstring)."""
    import torch

    if name in ORDERS or name in CONV_VARIANTS or name == "libm":
        with _AlgorithmMode(name):
            yield
    elif name == "onednn toggled":
        with torch.backends.mkldnn.flags(enabled=not torch._C._get_mkldnn_enabled()):
            yield
    elif name.startswith("threads "):
        n = int(name.split()[1])
        old = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(old)
    else:
        raise ValueError(f"argument 'name': expected one of {VARIANTS}, got {name!r}")


# ===================================================================================================
# Summation orders
# ===================================================================================================

def ordered_sum(t: Any, order: str) -> Any:
    """Sum a tensor over its last axis in the given order (module docstring), in t's dtype."""
    import torch

    k = t.shape[-1]
    if k == 0:
        return t.new_zeros(t.shape[:-1])
    if order == "recursive":
        acc = t[..., 0]
        for j in range(1, k):
            acc = acc + t[..., j]
        return acc
    if order == "reversed":
        acc = t[..., k - 1]
        for j in range(k - 2, -1, -1):
            acc = acc + t[..., j]
        return acc
    if order == "pairwise":
        while t.shape[-1] > 1:
            if t.shape[-1] % 2:
                t = torch.cat([t, t.new_zeros(t.shape[:-1] + (1,))], dim=-1)
            t = t[..., 0::2] + t[..., 1::2]
        return t[..., 0]
    if order == "blocked":
        b = config.ENSEMBLE_BLOCK
        pad = (-k) % b
        if pad:
            t = torch.cat([t, t.new_zeros(t.shape[:-1] + (pad,))], dim=-1)
        blocks = ordered_sum(t.reshape(t.shape[:-1] + (-1, b)), "recursive")
        return ordered_sum(blocks, "recursive")
    raise ValueError(f"argument 'order': expected one of {ORDERS}, got {order!r}")


def _acc_dtype(dtype: Any) -> Any:
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _contract(a: Any, b: Any, order: str) -> Any:
    """a @ b (batched, broadcast) with the products formed exactly and summed in ``order``, in the
    accumulation dtype; the result is rounded to a's dtype once.  Rows are processed in chunks so that the
    products tensor stays below config.ENSEMBLE_CHUNK_ELEMENTS."""
    import torch

    out_dtype = torch.promote_types(a.dtype, b.dtype)
    acc = _acc_dtype(out_dtype)
    a, b = a.to(acc), b.to(acc)
    vec_a, vec_b = a.dim() == 1, b.dim() == 1
    if vec_a:
        a = a.unsqueeze(0)
    if vec_b:
        b = b.unsqueeze(-1)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(batch + a.shape[-2:])
    b = b.expand(batch + b.shape[-2:])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    per_row = max(1, math.prod(batch) * k * n)
    step = max(1, config.ENSEMBLE_CHUNK_ELEMENTS // per_row)
    bt = b.transpose(-1, -2).unsqueeze(-3)                     # (..., 1, n, k)
    parts = []
    for i in range(0, m, step):
        prod = a[..., i:i + step, :].unsqueeze(-2) * bt         # (..., rows, n, k), exact products
        parts.append(ordered_sum(prod, order))
    out = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]
    if vec_a:
        out = out.squeeze(-2)
    if vec_b:
        out = out.squeeze(-1)
    return out.to(out_dtype)


def _einsum(equation: str, operands: Sequence[Any], order: str) -> Any:
    """torch.einsum with every product formed first and the contracted indices summed in ``order``."""
    import torch

    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq:
        raise NotImplementedError(f"einsum variant: only explicit equations without '...' ({equation!r})")
    lhs, out_idx = eq.split("->")
    ins = lhs.split(",")
    contracted = "".join(sorted({c for s in ins for c in s} - set(out_idx)))
    dtype = operands[0].dtype
    for o in operands[1:]:
        dtype = torch.promote_types(dtype, o.dtype)
    acc = _acc_dtype(dtype)
    ops = [o.to(acc) for o in operands]
    prod = torch.einsum(f"{lhs}->{out_idx}{contracted}", *ops)   # no summation: products only
    if contracted:
        prod = prod.reshape(prod.shape[:len(out_idx)] + (-1,))
        prod = ordered_sum(prod, order)
    return prod.to(dtype)


def _reduce(x: Any, dim: Any, keepdim: bool, order: str) -> Any:
    """Sum of x over ``dim`` (int, tuple or None) in ``order``, in the accumulation dtype."""
    dims = tuple(range(x.dim())) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    dims = tuple(sorted(d % x.dim() for d in dims)) if x.dim() else ()
    keep = [d for d in range(x.dim()) if d not in dims]
    t = x.to(_acc_dtype(x.dtype)).permute(keep + list(dims))
    t = t.reshape(t.shape[:len(keep)] + (-1,))
    s = ordered_sum(t, order)
    if keepdim:
        for d in dims:
            s = s.unsqueeze(d)
    return s


def _conv2d_im2col(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int,
                   order: str) -> Any:
    import torch.nn.functional as F

    x, pads = _pad_for_conv(x, w, padding, dilation)
    dtype = x.dtype
    acc = _acc_dtype(dtype)
    bsz, cin, _, _ = x.shape
    cout, cg, kh, kw = w.shape
    cols = F.unfold(x.to(acc), (kh, kw), dilation=dilation, padding=0, stride=stride)   # (B, cin kh kw, L)
    hout = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wout = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = cols.reshape(bsz, groups, cg * kh * kw, hout * wout)
    wm = w.to(acc).reshape(groups, cout // groups, cg * kh * kw).unsqueeze(0)
    out = _contract(wm, cols, order).reshape(bsz, cout, hout, wout)
    if bias is not None:
        out = out + bias.to(acc).reshape(1, -1, 1, 1)
    return out.to(dtype)


def _conv2d_fft(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> Any:
    """Cross-correlation by FFT: dilate the kernel, zero-pad both to the full linear size, multiply the
    real spectra (summing input channels of each group in the frequency domain), invert, crop, stride."""
    import torch

    x, _ = _pad_for_conv(x, w, padding, dilation)
    dtype = x.dtype
    acc = _acc_dtype(dtype)
    bsz, cin, hh, ww = x.shape
    cout, cg, kh, kw = w.shape
    ekh, ekw = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    wd = w.new_zeros((cout, cg, ekh, ekw), dtype=acc)
    wd[:, :, ::dilation[0], ::dilation[1]] = w.to(acc)
    wd = torch.flip(wd, dims=(-2, -1))             # correlation = convolution with the flipped kernel
    fh, fw = hh + ekh - 1, ww + ekw - 1
    fx = torch.fft.rfft2(x.to(acc), s=(fh, fw))                       # (B, cin, fh, fw//2+1)
    fk = torch.fft.rfft2(wd, s=(fh, fw))                              # (cout, cg, ...)
    fx = fx.reshape(bsz, groups, 1, cg, fh, fw // 2 + 1)
    fk = fk.reshape(1, groups, cout // groups, cg, fh, fw // 2 + 1)
    spec = (fx * fk).sum(dim=3).reshape(bsz, cout, fh, fw // 2 + 1)
    full = torch.fft.irfft2(spec, s=(fh, fw))
    valid = full[..., ekh - 1:hh, ekw - 1:ww]
    out = valid[..., ::stride[0], ::stride[1]]
    if bias is not None:
        out = out + bias.to(acc).reshape(1, -1, 1, 1)
    return out.to(dtype)


# Winograd's matrices are the error calculus's (refimpl.bounds.WINOGRAD_BT, _G, _AT), which also bounds its error.


def _conv2d_winograd(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int,
                     align: str = "start") -> Any:
    """Cross-correlation with a 3 x 3 kernel, stride 1 and dilation 1 by Winograd F(6 x 6, 3 x 3): the padded
    input cut into 8 x 8 tiles overlapping by 2, each transformed (B^T d B), multiplied element-wise by the
    transformed kernel (G g G^T) and summed over the group's input channels, then transformed back (A^T m A)
    into a 6 x 6 output tile.  Every step in the accumulation dtype.  ``align="start"``: the first tile starts at
    the first output (NNPACK's tiling); ``"end"``: the last tile ends at the last output, the zeros completing the
    tiles going before the image.  An output's error depends on its position in its tile (A^T's row for output 5
    reaches 32, row 0 is all ones), so the two alignments are two differently placed error patterns.  Other
    convolutions raise NotImplementedError, so that PyTorch's own runs them.  Its error bound:
    refimpl.bounds.winograd_scale."""
    import torch
    import torch.nn.functional as F

    if tuple(w.shape[-2:]) != (3, 3) or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        raise NotImplementedError
    x, _ = _pad_for_conv(x, w, padding, dilation)
    dtype = x.dtype
    acc = _acc_dtype(dtype)
    from .bounds import WINOGRAD_AT, WINOGRAD_BT, WINOGRAD_G

    bt, g, at = (torch.tensor(m, dtype=acc, device=x.device) for m in (WINOGRAD_BT, WINOGRAD_G, WINOGRAD_AT))
    bsz, cin, hh, ww = x.shape
    cout, cg, _, _ = w.shape
    hout, wout = hh - 2, ww - 2
    th, tw = -(-hout // 6), -(-wout // 6)
    eh, ew = 6 * th - hout, 6 * tw - wout                           # the tiles' overhang
    before_h, before_w = (eh, ew) if align == "end" else (0, 0)
    xa = F.pad(x.to(acc), (before_w, ew - before_w, before_h, eh - before_h))
    d = xa.unfold(2, 8, 6).unfold(3, 8, 6)                          # (B, cin, th, tw, 8, 8)
    v = torch.einsum("ij,bctsjk,lk->bctsil", bt, d, bt)             # B^T d B
    u = torch.einsum("ij,ocjk,lk->ocil", g, w.to(acc), g)           # G g G^T
    v = v.reshape(bsz, groups, cg, th, tw, 8, 8)
    u = u.reshape(groups, cout // groups, cg, 8, 8)
    m = torch.einsum("bgctsil,gocil->bgotsil", v, u)                 # element-wise product, summed over channels
    y = torch.einsum("ij,bgotsjk,lk->bgotsil", at, m, at)           # A^T m A: (..., 6, 6)
    y = y.reshape(bsz, cout, th, tw, 6, 6).permute(0, 1, 2, 4, 3, 5).reshape(bsz, cout, 6 * th, 6 * tw)
    out = y[..., before_h:before_h + hout, before_w:before_w + wout]
    if bias is not None:
        out = out + bias.to(acc).reshape(1, -1, 1, 1)
    return out.to(dtype)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pad_for_conv(x: Any, w: Any, padding: Any, dilation: Any) -> tuple[Any, Any]:
    """Apply conv2d's padding explicitly (int, pair, "valid", or "same" with PyTorch's split: the extra
    pixel of an even total goes to the end)."""
    import torch.nn.functional as F

    kh, kw = w.shape[-2:]
    if padding == "valid":
        return x, (0, 0, 0, 0)
    if padding == "same":
        th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
        pads = (tw // 2, tw - tw // 2, th // 2, th - th // 2)
    else:
        ph, pw = _pair(padding)
        pads = (pw, pw, ph, ph)
    return (F.pad(x, pads) if any(pads) else x), pads


def _layer_norm(x: Any, shape: Any, weight: Any, bias: Any, eps: float, order: str) -> Any:
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    acc = _acc_dtype(x.dtype)
    xa = x.to(acc)
    n = math.prod(x.shape[d] for d in dims)
    mu = _reduce(xa, dims, True, order) / n
    d = xa - mu
    var = _reduce(d * d, dims, True, order) / n
    y = d / (var + eps).sqrt()
    if weight is not None:
        y = y * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def _softmax(x: Any, dim: int, order: str, dtype: Any = None) -> Any:
    import torch

    if dtype is not None:
        x = x.to(dtype)
    acc = _acc_dtype(x.dtype)
    xa = x.to(acc)
    m = torch.amax(xa, dim=dim, keepdim=True)
    e = torch.exp(xa - m)
    s = _reduce(e, dim, True, order)
    return (e / s).to(x.dtype)


def _norm2(x: Any, dim: Any, keepdim: bool, order: str) -> Any:
    """2-norm with an exact power-of-two prescaling (no overflow or underflow of the squares)."""
    import torch

    acc = _acc_dtype(x.dtype)
    xa = x.to(acc)
    dims = dim if dim is not None else tuple(range(x.dim()))
    m = torch.amax(xa.abs(), dim=dims, keepdim=True)
    s = torch.where(m > 0, torch.exp2(torch.floor(torch.log2(torch.where(m > 0, m, 1.0)))), 1.0)
    s = torch.where(torch.isfinite(s), s, 1.0)
    r = xa / s
    out = _reduce(r * r, dims, True, order).sqrt() * s
    if not keepdim:
        out = out.squeeze(dims) if isinstance(dims, int) else out.reshape(
            [n for i, n in enumerate(out.shape) if i not in {d % x.dim() for d in dims}])
    return out.to(x.dtype)


class _AlgorithmMode:
    """A TorchFunctionMode that re-evaluates contractions, reductions and convolutions (module docstring).
    Built lazily so that importing this module does not import torch."""

    def __init__(self, name: str):
        self.name = name
        self._mode = None

    def __enter__(self):
        self._mode = _make_mode(self.name)
        return self._mode.__enter__()

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def _libm_handlers() -> dict[Any, Callable[..., Any]]:
    """The "libm" variant: elementary functions by other few-ulp formulas (module docstring)."""
    import torch
    import torch.nn.functional as F

    def exp(x, *_, **__):
        e = torch.exp(x * 0.5)      # x / 2 is exact (outside the subnormal range)
        return e * e

    def tanh(x, *_, **__):
        t = torch.expm1(-2.0 * x.abs())
        return torch.sign(x) * (-t / (2.0 + t))

    def sigmoid(x, *_, **__):
        e = exp(-x.abs())
        return torch.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None:
            x = x.to(dtype)
        acc = _acc_dtype(x.dtype)
        xa = x.to(acc)
        e = exp(xa - torch.amax(xa, dim=dim, keepdim=True))
        return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)

    def erf(x):
        # Below float64, the rational approximation of Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, about
        # 2.5 u of float32 on erf in [-1, 1]), the form of PyTorch's vectorized CPU erf inside its native GELU
        # kernel; float64 keeps the library erf (the approximation is no float64 algorithm).
        if x.dtype == torch.float64:
            return torch.erf(x)
        t = 1.0 / (1.0 + config.ERF_AS_P * x.abs())
        poly = t * (config.ERF_AS_A[0] + t * (config.ERF_AS_A[1] + t * (config.ERF_AS_A[2] + t * (
            config.ERF_AS_A[3] + t * config.ERF_AS_A[4]))))
        return torch.sign(x) * (1.0 - poly * exp(-x * x))

    def gelu(x, approximate="none"):
        acc = _acc_dtype(x.dtype)
        xa = x.to(acc)
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (xa + config.GELU_TANH_COEF * xa * xa * xa)
            return (0.5 * xa * (1.0 + tanh(inner))).to(x.dtype)
        return (0.5 * xa * (1.0 + erf(xa * math.sqrt(0.5)))).to(x.dtype)

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        # As PyTorch's fused CPU kernel evaluates it: the moments, a reciprocal square root, then one affine map
        # y = x a + c with a = w rstd and c = b - mean a.  x a and mean a cancel where |mean| >> std: an error
        # of u (|x| + |mean|) rstd |w| instead of u |x - mean| rstd |w| (layers.layer_norm_bound covers both).
        dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
        acc = _acc_dtype(x.dtype)
        xa = x.to(acc)
        mu = xa.mean(dim=dims, keepdim=True)
        d = xa - mu
        a = torch.rsqrt((d * d).mean(dim=dims, keepdim=True) + eps)
        if weight is not None:
            a = a * weight.to(acc)
        c = -mu * a
        if bias is not None:
            c = c + bias.to(acc)
        return (xa * a + c).to(x.dtype)

    return {torch.exp: exp, torch.Tensor.exp: exp, torch.tanh: tanh, torch.Tensor.tanh: tanh,
            torch.sigmoid: sigmoid, torch.Tensor.sigmoid: sigmoid, F.softmax: softmax, torch.softmax: softmax,
            torch.Tensor.softmax: softmax, F.gelu: gelu, F.layer_norm: layer_norm}


def _make_mode(name: str) -> Any:
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    fft = name == "fft conv"
    winograd = name in ("winograd conv", "winograd conv end-aligned")
    conv_only = fft or winograd               # these variants change the convolutions and nothing else
    order = "pairwise" if conv_only else name

    def floating(*ts: Any) -> bool:
        return all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in ts)

    def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride, dilation = _pair(stride), _pair(dilation)
        if fft:
            return _conv2d_fft(x, w, bias, stride, padding, dilation, groups)
        if winograd:
            return _conv2d_winograd(x, w, bias, stride, padding, dilation, groups,
                                    "end" if name.endswith("end-aligned") else "start")
        return _conv2d_im2col(x, w, bias, stride, padding, dilation, groups, order)

    def linear(x, w, b=None):
        acc = _acc_dtype(torch.promote_types(x.dtype, w.dtype))
        y = _contract(x.to(acc), w.to(acc).t(), order)
        if b is not None:
            y = y + b.to(acc)
        return y.to(x.dtype)

    def matmul(a, b, *_, **__):
        return _contract(a, b, order)

    def tsum(x, dim=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            x = x.to(dtype)
        return _reduce(x, dim, keepdim, order).to(x.dtype)

    def tmean(x, dim=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            x = x.to(dtype)
        dims = tuple(range(x.dim())) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
        n = math.prod(x.shape[d] for d in dims)
        return (_reduce(x, dim, keepdim, order) / n).to(x.dtype)

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        return _layer_norm(x, tuple(normalized_shape), weight, bias, eps, order)

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return _softmax(x, dim, order, dtype)

    def norm(x, p="fro", dim=None, keepdim=False, dtype=None, out=None):
        if p not in (2, 2.0, "fro", None) or dtype is not None or out is not None:
            raise NotImplementedError
        return _norm2(x, dim, keepdim, order)

    def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
        if ord not in (2, 2.0) or dtype is not None or out is not None:
            raise NotImplementedError
        return _norm2(x, dim, keepdim, order)

    def normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
        if p not in (2, 2.0) or out is not None:
            raise NotImplementedError
        return x / _norm2(x, dim, True, order).clamp_min(eps).expand_as(x)

    def einsum(equation, *operands):
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        return _einsum(equation, operands, order)

    libm = name == "libm"
    handlers: dict[Any, Callable[..., Any]] = {torch.conv2d: conv2d, F.conv2d: conv2d}
    if libm:
        handlers = _libm_handlers()
    elif not conv_only:
        handlers.update({
            F.linear: linear, torch.matmul: matmul, torch.Tensor.matmul: matmul, torch.Tensor.__matmul__: matmul,
            torch.bmm: matmul, torch.Tensor.bmm: matmul, torch.mm: matmul, torch.Tensor.mm: matmul,
            torch.sum: tsum, torch.Tensor.sum: tsum, torch.mean: tmean, torch.Tensor.mean: tmean,
            F.layer_norm: layer_norm, F.softmax: softmax, torch.softmax: softmax, torch.Tensor.softmax: softmax,
            torch.Tensor.norm: norm, torch.norm: norm, torch.linalg.vector_norm: vector_norm,
            F.normalize: normalize, torch.einsum: einsum,
        })
    rmatmul = torch.Tensor.__rmatmul__

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is rmatmul and not (conv_only or libm):
                return matmul(args[1], args[0])
            h = handlers.get(func)
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if h is not None and tensors and floating(*tensors[:2]):
                try:
                    return h(*args, **kwargs)
                except NotImplementedError:
                    pass
            return func(*args, **kwargs)

    return Mode()
