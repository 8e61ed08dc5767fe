"""PyTorch counterparts of refimpl.attention.lisa (LiSA, Kim et al.), written independently of the NumPy
reference with torch.fft.  State-dict keys equal the refimpl parameter keys:

LiSAAttention            qkv.weight, qkv.bias, weight_a (P, c, D), weight_b (P, D), bias_a (c, D), bias_b (c, D),
                         proj.weight, proj.bias        (P = N circular, prod(2n - 1) exact_toeplitz)
StructureAwareAttention  qkv.*, proj.*, and rpe (eq4) or weight_a, weight_b, bias_b[, bias_a] (eq5-eq7, eq5_bias)
LocalLiSAAttention       LiSAAttention's keys with k^r taps: weight_a (k^r, c, D), weight_b (k^r, D) (Table 3c)
ConvOperator             dwconv.weight (C, 1, 7, 7) or complex_weight (H, W // 2 + 1, C, 2), proj.weight (Table 3a)
SelfAttention            qkv.*, proj.*[, rpe (P,) or (P, h)]   (softmax attention, Eq. 3 with a Toeplitz RPE)
LiSABlock                norm1.*, attn.*, norm2.*, mlp.fc1.*, mlp.fc2.*
OperatorBlock            the same keys, with any of the attentions above (LiSA Table 3b)

Conventions (same as the reference, re-derived here): tokens row-major over the grid; Toeplitz parameters
indexed as LiSA Eq. 2, T[i, j] = e[n - 1 + j - i] per axis; circular kernels act by convolution,
C[i, j] = w[(i - j) mod n] (Eq. 10); heads share the LiSA weights; L2 normalisation per head over c.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.twins.taps import QKV_PROJ_POINTS, capture, tap
from refimpl.twins.modules.layers import Mlp


def _prod(v: Sequence[int]) -> int:
    return int(math.prod(v))


def place_toeplitz_kernel(e: torch.Tensor, grid: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    """Toeplitz parameters (2n_1-1, .., *ch) -> the length-L circular kernel with h(s) = e[n-1-s] at s mod L
    (L >= 2n - 1): flip, zero-pad, roll by -(n - 1) on every grid axis."""
    r = len(grid)
    h = torch.flip(e, dims=list(range(r)))
    out = h.new_zeros(tuple(lengths) + tuple(e.shape[r:]))
    out[tuple(slice(0, 2 * n - 1) for n in grid)] = h
    return torch.roll(out, shifts=[-(n - 1) for n in grid], dims=list(range(r)))


def fft_convolve(x: torch.Tensor, kernel: torch.Tensor, grid: Sequence[int], lengths: Sequence[int],
                 transform: str = "rfft") -> torch.Tensor:
    """Circular convolution of length ``lengths`` of x (B, h, *grid, *ch) (zero-padded) with kernel
    (*lengths, *ch), cropped to the grid."""
    r = len(grid)
    dims = list(range(2, 2 + r))
    if transform == "rfft":
        xf = torch.fft.rfftn(x, s=list(lengths), dim=dims)
        kf = torch.fft.rfftn(kernel, dim=list(range(r)))
        y = torch.fft.irfftn(xf * kf, s=list(lengths), dim=dims)
    else:
        xf = torch.fft.fftn(x, s=list(lengths), dim=dims)
        kf = torch.fft.fftn(kernel, dim=list(range(r)))
        y = torch.fft.ifftn(xf * kf, s=list(lengths), dim=dims).real
    for a, n in zip(dims, grid):
        y = y.narrow(a, 0, n)
    return y


def dense_rpe(params: torch.Tensor, grid: Sequence[int], kind: str) -> torch.Tensor:
    """(P, *ch) -> (N, N, *ch) dense Toeplitz (Eq. 2) or circulant (Eq. 10) RPE tensor by index gathering."""
    r = len(grid)
    kg = [2 * n - 1 for n in grid] if kind == "toeplitz" else list(grid)
    e = params.reshape(kg + list(params.shape[1:]))
    idx = []
    for a, n in enumerate(grid):
        i = torch.arange(n, device=params.device).view([n if b == a else 1 for b in range(2 * r)])
        j = torch.arange(n, device=params.device).view([n if b == r + a else 1 for b in range(2 * r)])
        idx.append(n - 1 + j - i if kind == "toeplitz" else torch.remainder(i - j, n))
    n_tok = _prod(grid)
    return e[tuple(idx)].reshape([n_tok, n_tok] + list(params.shape[1:]))


class _Projections(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        b, h, n, c = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, h * c))


class LiSAAttention(_Projections):
    """LiSA (Eq. 9-10, Fig. 7) with heads sharing Wa, Wb, Ba, Bb; exact_toeplitz = Eq. 9 by zero-padded FFTs."""

    def __init__(self, dim: int, num_heads: int, grid: Sequence[int], latent: int = 16, *,
                 exact_toeplitz: bool = False, fft_lengths: Sequence[int] | None = None, transform: str = "rfft",
                 qkv_bias: bool = True, l2_eps: float = 1e-12):
        """The qkv and proj Linears and the LiSA weights the heads share (zeros): weight_a (P, c, D), weight_b (P, D),
        bias_a, bias_b (c, D), P = N for the circular kernels or prod(2n - 1) with exact_toeplitz; the FFT lengths
        (fft_lengths, default 2n - 1 per axis; the grid for the circular kernels)."""
        super().__init__(dim, num_heads, qkv_bias)
        self.grid = tuple(grid)
        self.exact_toeplitz = exact_toeplitz
        self.transform = transform
        self.l2_eps = l2_eps
        c = dim // num_heads
        if exact_toeplitz:
            p = _prod([2 * n - 1 for n in self.grid])
            self.lengths = tuple(fft_lengths) if fft_lengths is not None else tuple(2 * n - 1 for n in self.grid)
        else:
            p = _prod(self.grid)
            self.lengths = self.grid
        self.weight_a = nn.Parameter(torch.zeros(p, c, latent))
        self.weight_b = nn.Parameter(torch.zeros(p, latent))
        self.bias_a = nn.Parameter(torch.zeros(c, latent))
        self.bias_b = nn.Parameter(torch.zeros(c, latent))

    def _kernel(self, w: torch.Tensor) -> torch.Tensor:
        if self.exact_toeplitz:
            e = w.reshape([2 * n - 1 for n in self.grid] + list(w.shape[1:]))
            return place_toeplitz_kernel(e, self.grid, self.lengths)
        return w.reshape(list(self.grid) + list(w.shape[1:]))

    #: None, or a dict that each forward fills with "qn", "kn", "ga", "gb" (the fine stages of
    #: refimpl.attention.lisa.lisa_attention_stages)
    taps: dict | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """LiSA Eq. 10 (Eq. 9 with exact_toeplitz) on x (B, N, C): Q and K L2-normalised per head, Ga = Wa * K + Ba and
        Gb = Wb * V + Bb by FFT convolution over the grid, out_iv = sum_c,d Q_ic Ga_icd Gb_ivd, merged and projected;
        returns (B, N, C).  The taps receive "qn", "kn", "ga", "gb"."""
        q, k, v = self.split(x)
        b, h, n, c = q.shape
        q = tap(self.taps, "qn", F.normalize(q, dim=-1, eps=self.l2_eps))
        k = tap(self.taps, "kn", F.normalize(k, dim=-1, eps=self.l2_eps))
        shape = [b, h] + list(self.grid) + [c, 1]
        ga = fft_convolve(k.reshape(shape), self._kernel(self.weight_a), self.grid, self.lengths, self.transform)
        gb = fft_convolve(v.reshape(shape), self._kernel(self.weight_b[:, None, :]), self.grid, self.lengths,
                          self.transform)
        ga = tap(self.taps, "ga", ga.reshape(b, h, n, c, -1) + self.bias_a)
        gb = tap(self.taps, "gb", gb.reshape(b, h, n, c, -1) + self.bias_b)
        out = torch.einsum("bhnc,bhncd,bhnvd->bhnv", q, ga, gb)
        return self.merge(out)


def local_windows(x: torch.Tensor, grid: Sequence[int], kernel: int) -> torch.Tensor:
    """x (B, h, *grid, c) -> (B, h, *grid, c, k^r): for every token i the values at i + s, s over the k^r window
    offsets (row-major, s_a = t_a - (k - 1) / 2), zero where i + s leaves the grid."""
    r, rad = len(grid), kernel // 2
    lead = x.shape[:2]
    xp = x.new_zeros(tuple(lead) + tuple(n + 2 * rad for n in grid) + tuple(x.shape[2 + r:]))
    xp[(slice(None), slice(None)) + tuple(slice(rad, rad + n) for n in grid)] = x
    views = []
    for t in range(kernel ** r):
        off = [(t // kernel ** (r - 1 - a)) % kernel for a in range(r)]
        views.append(xp[(slice(None), slice(None)) + tuple(slice(o, o + n) for o, n in zip(off, grid))])
    return torch.stack(views, dim=-1)


class LocalLiSAAttention(_Projections):
    """LiSA Eq. 9 with local k x k kernels (LiSA Table 3c "Local - k x k"): Ga = sum over the window of
    Wa[s] Kb[i + s] (depth-wise), Gb = sum of Wb[s] V[i + s] (shared by the channels), zero outside the grid,
    computed directly from gathered windows (no FFT); heads share Wa, Wb, Ba, Bb."""

    def __init__(self, dim: int, num_heads: int, grid: Sequence[int], latent: int = 16, *, kernel: int,
                 qkv_bias: bool = True, l2_eps: float = 1e-12):
        """The qkv and proj Linears and the local weights the heads share (zeros): weight_a (k^r, c, D), weight_b
        (k^r, D), bias_a, bias_b (c, D), r the number of grid axes."""
        super().__init__(dim, num_heads, qkv_bias)
        self.grid, self.kernel, self.l2_eps = tuple(grid), int(kernel), l2_eps
        c, p = dim // num_heads, int(kernel) ** len(self.grid)
        self.weight_a = nn.Parameter(torch.zeros(p, c, latent))
        self.weight_b = nn.Parameter(torch.zeros(p, latent))
        self.bias_a = nn.Parameter(torch.zeros(c, latent))
        self.bias_b = nn.Parameter(torch.zeros(c, latent))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """LiSA Eq. 9 with local k x k kernels on x (B, N, C): Q and K L2-normalised per head, Ga and Gb summed over
        each token's window of K and V (zero outside the grid), out_iv = sum_c,d Q_ic Ga_icd Gb_ivd, merged and
        projected; returns (B, N, C)."""
        q, k, v = self.split(x)
        b, h, n, c = q.shape
        q = F.normalize(q, dim=-1, eps=self.l2_eps)
        k = F.normalize(k, dim=-1, eps=self.l2_eps)
        shape = [b, h] + list(self.grid) + [c]
        wk = local_windows(k.reshape(shape), self.grid, self.kernel).reshape(b, h, n, c, -1)
        wv = local_windows(v.reshape(shape), self.grid, self.kernel).reshape(b, h, n, c, -1)
        ga = torch.einsum("bhnct,tcd->bhncd", wk, self.weight_a) + self.bias_a
        gb = torch.einsum("bhnct,td->bhncd", wv, self.weight_b) + self.bias_b
        out = torch.einsum("bhnc,bhncd,bhnvd->bhnv", q, ga, gb)
        return self.merge(out)


class ConvOperator(nn.Module):
    """LiSA Table 3a's convolution rows in the LiSA block: a 7 x 7 depthwise convolution ("dwconv") or GFNet's
    global filter ("gf": irfft2(rfft2(X) * K), K complex (H, W // 2 + 1, C)), then a C x C projection; no biases."""

    def __init__(self, dim: int, grid: Sequence[int], op: str):
        """For op "dwconv" the 7 x 7 depthwise conv, else GFNet's ``complex_weight`` (H, W // 2 + 1, C, 2) (zeros); then
        the bias-free C x C projection."""
        super().__init__()
        self.grid, self.op = tuple(grid), op
        if op == "dwconv":
            self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=False)
        else:
            self.complex_weight = nn.Parameter(torch.zeros(self.grid[0], self.grid[1] // 2 + 1, dim, 2))
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The 7 x 7 depthwise conv or the global filter irfft2(rfft2(X) K) of x (B, N, C) on the (H, W) grid, then the
        projection; returns (B, N, C)."""
        b, n, c = x.shape
        h, w = self.grid
        if self.op == "dwconv":
            y = self.dwconv(x.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)
        elif w == 1:
            # The same transform without a real one of length 1 (over W it is the identity, and its inverse takes the
            # real part): Re(ifft_H(fft_H(X) K)).  On an H200, torch.fft's irfft2(rfft2(X) K) on a (3, 1) grid
            # returned 0.41 where the result is 0.039 (cuFFT, float32 and float64; the CPU is right).
            k = torch.view_as_complex(self.complex_weight)[:, 0]
            y = torch.fft.ifft(torch.fft.fft(x.reshape(b, h, c), dim=1) * k, dim=1).real.reshape(b, n, c)
        else:
            xf = torch.fft.rfft2(x.reshape(b, h, w, c), dim=(1, 2))
            y = torch.fft.irfft2(xf * torch.view_as_complex(self.complex_weight), s=(h, w), dim=(1, 2)).reshape(b, n, c)
        return self.proj(y)


class StructureAwareAttention(_Projections):
    """Structure-aware attention computed directly with dense RPE tensors (Eq. 4-7, Fig. 6).  form "eq5_bias"
    (LiSA Table 3b "+ bias term Ba"): Eq. 5 with Ba (c, D) in the first bracket, computed through the
    attention: S_id = sum_n A_in Ra_ind + sum_c Qb_ic Ba_cd."""

    def __init__(self, dim: int, num_heads: int, grid: Sequence[int], latent: int = 16, *, form: str = "eq7",
                 rpe: str = "toeplitz", rpe_per_head: bool = False, qkv_bias: bool = True, l2_eps: float = 1e-12):
        """The qkv and proj Linears and the dense RPE parameters (zeros) over P = prod(2n - 1) Toeplitz offsets or the N
        circulant entries: ``rpe`` (P,) or (P, h) for "eq4"; else weight_a ((P, D) for "eq5" / "eq5_bias", (P, c, D)
        otherwise), weight_b (P, D), bias_b (c, D), and bias_a (c, D) for "eq7" and "eq5_bias"."""
        super().__init__(dim, num_heads, qkv_bias)
        self.grid, self.form, self.kind, self.l2_eps = tuple(grid), form, rpe, l2_eps
        c = dim // num_heads
        p = _prod([2 * n - 1 for n in self.grid]) if rpe == "toeplitz" else _prod(self.grid)
        if form == "eq4":
            self.rpe = nn.Parameter(torch.zeros((p, num_heads) if rpe_per_head else (p,)))
        else:
            self.weight_a = nn.Parameter(torch.zeros((p, latent) if form in ("eq5", "eq5_bias") else (p, c, latent)))
            self.weight_b = nn.Parameter(torch.zeros(p, latent))
            self.bias_b = nn.Parameter(torch.zeros(c, latent))
            if form in ("eq7", "eq5_bias"):
                self.bias_a = nn.Parameter(torch.zeros(c, latent))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Structure-aware attention (LiSA Eq. 4-7) of x (B, N, C) with dense RPE tensors, Q and K L2-normalised per
        head: Eq. 4's (Q K^T times R elementwise) V, or the forms with Ra, Rb of Eq. 5-7; merged and projected; returns
        (B, N, C)."""
        q, k, v = self.split(x)
        q = F.normalize(q, dim=-1, eps=self.l2_eps)
        k = F.normalize(k, dim=-1, eps=self.l2_eps)
        if self.form == "eq4":
            r = dense_rpe(self.rpe, self.grid, self.kind)
            if r.dim() == 3:
                r = r.permute(2, 0, 1)
            out = ((q @ k.transpose(-1, -2)) * r) @ v
            return self.merge(out)
        ra = dense_rpe(self.weight_a, self.grid, self.kind)
        rb = dense_rpe(self.weight_b, self.grid, self.kind)
        gb = torch.einsum("ijd,bhjv->bhivd", rb, v) + self.bias_b
        if self.form in ("eq5", "eq5_bias"):
            s = torch.einsum("bhin,ind->bhid", q @ k.transpose(-1, -2), ra)
            if self.form == "eq5_bias":
                s = s + q @ self.bias_a
            out = torch.einsum("bhid,bhivd->bhiv", s, gb)
        else:
            ga = torch.einsum("incd,bhnc->bhicd", ra, k)
            if self.form == "eq7":
                ga = ga + self.bias_a
            out = torch.einsum("bhic,bhicd,bhivd->bhiv", q, ga, gb)
        return self.merge(out)


class SelfAttention(_Projections):
    """Softmax self-attention, softmax(Q K^T / sqrt(c) + R) V, with R = 0 (rpe=None), one Toeplitz RPE T(e)
    shared by the heads (rpe="shared", e (P,)) or one per head (rpe="per_head", e (P, h)): LiSA Eq. 3, the
    "Self-attn" rows of Table 3a-b."""

    def __init__(self, dim: int, num_heads: int, grid: Sequence[int], *, rpe: str | None = None,
                 qkv_bias: bool = True):
        """The qkv and proj Linears, the scale c^-1/2 and, for rpe "shared" / "per_head", the Toeplitz RPE parameters e
        (P,) / (P, h), P = prod(2n - 1) (zeros)."""
        super().__init__(dim, num_heads, qkv_bias)
        self.grid, self.scale = tuple(grid), (dim // num_heads) ** -0.5
        if rpe is not None:
            p = _prod([2 * n - 1 for n in self.grid])
            self.rpe = nn.Parameter(torch.zeros((p, num_heads) if rpe == "per_head" else (p,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """LiSA Eq. 3: softmax(Q K^T / sqrt(c) + R) V of x (B, N, C), R the dense Toeplitz RPE T(e) (none without rpe),
        merged and projected; returns (B, N, C)."""
        q, k, v = self.split(x)
        logits = (q * self.scale) @ k.transpose(-1, -2)
        if hasattr(self, "rpe"):
            r = dense_rpe(self.rpe, self.grid, "toeplitz")
            logits = logits + (r.permute(2, 0, 1) if r.dim() == 3 else r)
        return self.merge(torch.softmax(logits, dim=-1) @ v)


def _block_part(block: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """Residual branch ``name`` of a pre-norm block (norm1, attn, norm2, mlp) on x (B, N, C)."""
    if name == "attn":
        return x + block.attn(block.norm1(x))
    if name == "mlp":
        return x + block.mlp(block.norm2(x))
    raise ValueError(f"argument 'part': expected 'attn' or 'mlp', got {name!r}")


class OperatorBlock(nn.Module):
    """x + attn(LN(x)), then + MLP(LN(.)) with any operator module ``attn`` (LiSA §5.2: the Table 3 ablations
    replace only the operator in the LiSA block)."""

    def __init__(self, dim: int, attn: nn.Module, *, mlp_ratio: float = 4.0, ln_eps: float = 1e-6):
        """norm1, the given operator ``attn``, norm2 (LayerNorms, eps ``ln_eps``) and the MLP of width
        int(C mlp_ratio)."""
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=ln_eps)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One residual branch on x (B, N, C): "attn" (x + attn(LN_1 x)) or "mlp" (x + MLP(LN_2 x))."""
        return _block_part(self, name, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + attn(LN_1 x), then + MLP(LN_2 .), on x (B, N, C) (its parts in order); returns (B, N, C)."""
        return self.part("mlp", self.part("attn", x))


class LiSABlock(nn.Module):
    """x + LiSA(LN(x)), then + MLP(LN(.)) (LiSA §5.1, Fig. 3)."""

    def __init__(self, dim: int, num_heads: int, grid: Sequence[int], latent: int = 16, *, mlp_ratio: float = 4.0,
                 ln_eps: float = 1e-6, **attn_kwargs):
        """norm1, the :class:`LiSAAttention` built from the arguments (``attn_kwargs`` passed on), norm2 and the MLP of
        width int(C mlp_ratio)."""
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=ln_eps)
        self.attn = LiSAAttention(dim, num_heads, grid, latent, **attn_kwargs)
        self.norm2 = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def part(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """One residual branch on x (B, N, C): "attn" (x + LiSA(LN_1 x)) or "mlp" (x + MLP(LN_2 x))."""
        return _block_part(self, name, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The LiSA block (§5.1, Fig. 3) on x (B, N, C): x + LiSA(LN_1 x), then + MLP(LN_2 .) (its parts in order);
        returns (B, N, C)."""
        return self.part("mlp", self.part("attn", x))


def from_config(cfg) -> nn.Module:
    """The twin of a refimpl LiSAConfig (-> LiSAAttention) or SAConfig (-> StructureAwareAttention)."""
    if hasattr(cfg, "form"):
        return StructureAwareAttention(cfg.dim, cfg.num_heads, cfg.grid, cfg.latent, form=cfg.form, rpe=cfg.rpe,
                                       rpe_per_head=cfg.rpe_per_head, qkv_bias=cfg.qkv_bias, l2_eps=cfg.l2_eps)
    return LiSAAttention(cfg.dim, cfg.num_heads, cfg.grid, cfg.latent, exact_toeplitz=cfg.exact_toeplitz,
                         fft_lengths=cfg.fft_lengths, transform=cfg.transform, qkv_bias=cfg.qkv_bias,
                         l2_eps=cfg.l2_eps)


def block_from_config(cfg) -> LiSABlock:
    """The twin of lisa_block for a refimpl LiSAConfig."""
    return LiSABlock(cfg.dim, cfg.num_heads, cfg.grid, cfg.latent, mlp_ratio=cfg.mlp_ratio, ln_eps=cfg.ln_eps,
                     exact_toeplitz=cfg.exact_toeplitz, fft_lengths=cfg.fft_lengths, transform=cfg.transform,
                     qkv_bias=cfg.qkv_bias, l2_eps=cfg.l2_eps)


def stage_tensors(module: LiSAAttention, run, force=None) -> dict[str, torch.Tensor]:
    """Run ``run()`` (a forward of ``module``) once and return the tensors of
    refimpl.attention.lisa.lisa_attention_stages with ``fine=True``: the projections' inputs and outputs through
    forward hooks, the normalised Q, K and the two convolutions through ``module.taps``.  ``force``: these
    tensors (an earlier call's) replace the twin's own (capture's teacher forcing)."""
    return capture(module, run, QKV_PROJ_POINTS, taps=True, force=force)
