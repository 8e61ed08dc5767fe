"""A port of LiSA's attention (Kim et al., Eq. 9-10, Fig. 7 with heads) in another style than the equivalence twin:
three projections ``query``, ``key``, ``value``, heads as (B, N, h, c) views, the L2 normalisation written as
x / ||x||.clamp_min(eps), the grid moved last for ``torch.fft.fft2``; Ga = Kn (*) Wa by complex 2-D FFTs of the
kernel placed at its offsets s mod L (L = the grid: circular, Eq. 10; L = 2n - 1: zero-padded, the exact
Toeplitz product of Eq. 9), Gb = V (*) Wb as a dense (N, N, D) Toeplitz / circulant matrix gathered from the
offsets i - j and applied by einsum; its own parameter names ``k_kernel`` (P, c, D), ``v_kernel`` (P, D),
``k_bias``, ``v_bias`` (c, D) and ``to_out``.  torch has no half-precision FFT on the CPU: in float16 / bfloat16
the FFTs run in float32 and the result is rounded once to the input's precision (autocast's rule).

``bug`` plants one porting defect (tests/test_verify.py):

* ``"l2_tokens"``: Q and K normalised over the tokens instead of the c channels of a head (-> ``qn``);
* ``"mirror"``: the offsets of Wa mirrored, T[i, j] = e[n - 1 + i - j] (a cross-correlation, as conv2d
  computes, where Eq. 9-10 convolve) (-> ``ga``);
* ``"circular"``: with Toeplitz parameters, the FFTs left at the grid size, not zero-padded to 2n - 1: the
  offsets wrap around (circular instead of linear convolution) (-> ``ga``);
* ``"bias_swap"``: Ba added to Gb and Bb to Ga (-> ``ga``);
* ``"gb_transposed"``: the dense matrix of Wb applied transposed, sum_j R[j, i] V[j] (-> ``gb``).
"""

from __future__ import annotations

import torch
from torch import nn


class PortLiSA(nn.Module):
    def __init__(self, dim: int, heads: int, resolution: tuple[int, int] = (4, 3), latent: int = 3,
                 linear: bool = False, bug: str | None = None):
        super().__init__()
        self.heads, self.resolution, self.linear, self.bug = heads, tuple(resolution), linear, bug
        self.eps = 1e-12
        c = dim // heads
        hh, ww = self.resolution
        taps = (2 * hh - 1) * (2 * ww - 1) if linear else hh * ww
        if linear:
            self.fft_size = (2 * hh - 1, 2 * ww - 1)
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.k_kernel = nn.Parameter(torch.zeros(taps, c, latent))
        self.v_kernel = nn.Parameter(torch.zeros(taps, latent))
        self.k_bias = nn.Parameter(torch.zeros(c, latent))
        self.v_bias = nn.Parameter(torch.zeros(c, latent))
        self.to_out = nn.Linear(dim, dim)

    def _offsets(self, n: int, taps: int) -> torch.Tensor:
        """The offset s = i - j of each kernel tap: t (circular kernels) or n - 1 - t (Toeplitz parameters)."""
        t = torch.arange(taps)
        s = (n - 1 - t) if self.linear else t
        return -s if self.bug == "mirror" else s

    def _fft_conv(self, xg: torch.Tensor, kern: torch.Tensor) -> torch.Tensor:
        """xg (B, h, c, H, W), kern (P, c, D) -> (B, h, c, D, H, W): sum_j K(i - j) x[j] by fft2."""
        hh, ww = self.resolution
        work = xg.dtype if xg.dtype in (torch.float32, torch.float64) else torch.float32
        kh, kw = (2 * hh - 1, 2 * ww - 1) if self.linear else (hh, ww)
        size = (2 * hh - 1, 2 * ww - 1) if self.linear and self.bug != "circular" else (hh, ww)
        k = kern.to(work).reshape((kh, kw) + tuple(kern.shape[1:]))
        placed = k.new_zeros(size + tuple(kern.shape[1:]))
        rows = torch.remainder(self._offsets(hh, kh), size[0])
        cols = torch.remainder(self._offsets(ww, kw), size[1])
        placed.index_put_((rows[:, None], cols[None, :]), k, accumulate=True)
        kf = torch.fft.fft2(placed.permute(2, 3, 0, 1))                       # (c, D, L0, L1)
        xf = torch.fft.fft2(xg.to(work), s=size)                               # (B, h, c, L0, L1)
        y = torch.fft.ifft2(xf.unsqueeze(3) * kf).real[..., :hh, :ww]
        return y.to(xg.dtype)

    def _dense(self, kern: torch.Tensor) -> torch.Tensor:
        """kern (P, D) -> R (N, N, D) with R[i, j] = K(i - j) per grid axis."""
        hh, ww = self.resolution
        ih, iw = torch.arange(hh), torch.arange(ww)
        dh, dw = ih[:, None] - ih[None, :], iw[:, None] - iw[None, :]
        if self.linear:
            e = kern.reshape(2 * hh - 1, 2 * ww - 1, -1)
            th, tw = hh - 1 - dh, ww - 1 - dw
        else:
            e = kern.reshape(hh, ww, -1)
            th, tw = torch.remainder(dh, hh), torch.remainder(dw, ww)
        r = e[th[:, None, :, None], tw[None, :, None, :]]                      # (H, W, H, W, D)
        return r.reshape(hh * ww, hh * ww, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        h = self.heads
        c = C // h
        hh, ww = self.resolution
        q, k, v = (f(x).view(B, N, h, c) for f in (self.query, self.key, self.value))
        axis = 1 if self.bug == "l2_tokens" else -1
        q = q / q.norm(dim=axis, keepdim=True).clamp_min(self.eps)
        k = k / k.norm(dim=axis, keepdim=True).clamp_min(self.eps)
        ga = self._fft_conv(k.permute(0, 2, 3, 1).reshape(B, h, c, hh, ww), self.k_kernel).flatten(-2)
        rb = self._dense(self.v_kernel)
        gb = torch.einsum("jid,bjhv->bihvd" if self.bug == "gb_transposed" else "ijd,bjhv->bihvd", rb, v)
        bias_ga, bias_gb = (self.v_bias, self.k_bias) if self.bug == "bias_swap" else (self.k_bias, self.v_bias)
        ga = ga + bias_ga.unsqueeze(-1)                                        # (B, h, c, D, N)
        gb = gb + bias_gb                                                      # (B, N, h, c, D)
        out = torch.einsum("bnhc,bhcdn,bnhvd->bnhv", q, ga, gb)
        return self.to_out(out.reshape(B, N, C))
