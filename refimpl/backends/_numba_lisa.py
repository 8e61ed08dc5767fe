"""Numba kernels of LiSA: the contraction (Eq. 9), the spectral products (Eq. 10) and the fused FFT core.

- ``"lisa_contraction"``: twin of ``refimpl.attention.lisa_cores._lisa_contraction_numpy``;
- ``"lisa_spectral_product"``: twin of ``refimpl.attention.lisa_cores._lisa_spectral_product_numpy``;
- ``"lisa_fft_core"``: twin of ``refimpl.attention.lisa_cores._lisa_fft_core_numpy``.

Compiled on first use with explicit signatures (refimpl.backends._numba._compile); the fused core runs on
the worker pool and per-thread scratch of refimpl.backends._numba (``_run_shared``, ``_scratch``,
``lisa_threads``).  This module imports nothing from refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from ._numba import (_compile, _float_array, _import_numba, _kernel_input, _output, _run_shared, _scratch,
                     lisa_threads)
from ._registry import register
from ._validate import check_lisa_core_shapes


# ---------------------------------------------------------------------------------------------------
# LiSA contraction (Eq. 9): S = sum_c Qb (Ga + Ba), out = sum_d S (Gb + Bb)
# ---------------------------------------------------------------------------------------------------

def _lisa_contract_kernel(s, out, qb, a, bv, zero):  # pragma: no cover - runs compiled
    """Per row m (a token of one head): s[m, d] = sum_c qb[m, c] a[m, c, d] (c ascending from +0), then
    out[m, v] = sum_d s[m, d] bv[m, v, d] (d ascending from +0).  qb (M, c), a and bv (M, c, D),
    s (M, D), out (M, c).  The (M, c, D) tensors are streamed once; nothing is allocated."""
    nm, nc = qb.shape
    nd = a.shape[2]
    for m in range(nm):
        srow = s[m]
        for d in range(nd):
            srow[d] = zero
        for c in range(nc):
            qv = qb[m, c]
            arow = a[m, c]
            for d in range(nd):
                srow[d] += qv * arow[d]
        orow = out[m]
        bm = bv[m]
        for v in range(nc):
            orow[v] = zero
        for d in range(nd):           # per out[m, v] still d ascending from +0; the v loop vectorises
            sd = srow[d]
            for v in range(nc):
                orow[v] += sd * bm[v, d]


@register("lisa_contraction", "numba")
def lisa_contraction(qb: np.ndarray, a: np.ndarray, bv: np.ndarray, *, out: np.ndarray | None = None,
                     s_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The LiSA contraction in Numba: the twin of ``refimpl.attention.lisa_cores._lisa_contraction_numpy``.

    S[..., n, d] = sum_c Qb[..., n, c] A[..., n, c, d];  Y[..., n, v] = sum_d S[..., n, d] Bv[..., n, v, d],
    i.e. Y = sum_{c, d} Qb A Bv with A = Ga + Ba and Bv = Gb + Bb (LiSA Eq. 9).

    Parameters
    ----------
    qb : (..., N, c) float32/float64, the L2-normalised queries.
    a : (..., N, c, D) same dtype, Ga + Ba.   bv : (..., N, c, D) same dtype, Gb + Bb.
    out : optional (..., N, c) buffer; s_out : optional (..., N, D) buffer (C-contiguous, aligned,
        writeable, exact dtype; see :func:`refimpl.backends.empty_aligned`).

    Returns
    -------
    (S, Y): (..., N, D) and (..., N, c) arrays of qb's dtype (``s_out`` and ``out`` if given).

    References
    ----------
    LiSA Eq. 9 (Kim et al.), Fig. 7.
    """
    _import_numba()
    qb = _float_array(qb, "qb")
    dt = qb.dtype
    a, bv = _float_array(a, "a", dt), _float_array(bv, "bv", dt)
    if qb.ndim < 2 or min(qb.shape) < 1:
        raise ValueError(f"argument 'qb': expected a non-empty array of shape (..., N, c), got {qb.shape}")
    lead, nc = qb.shape[:-1], qb.shape[-1]
    if a.ndim != qb.ndim + 1 or a.shape[:-1] != qb.shape or a.shape[-1] < 1:
        raise ValueError(f"argument 'a': expected shape {qb.shape + ('D',)} for qb of shape {qb.shape}, got "
                         f"{a.shape}")
    if bv.shape != a.shape:
        raise ValueError(f"argument 'bv': expected shape {a.shape} (the shape of 'a'), got {bv.shape}")
    nd = a.shape[-1]
    m = int(np.prod(lead))
    ins = (("qb", qb), ("a", a), ("bv", bv))
    res = _output(out, lead + (nc,), dt, "out", ins)
    s = _output(s_out, lead + (nd,), dt, "s_out", ins + (("out", res),))
    t = dt.name
    kern = _compile("lisa_contraction", _lisa_contract_kernel,
                    f"void({t}[:, ::1], {t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, :, ::1], {t})")
    kern(s.reshape(m, nd), res.reshape(m, nc), _kernel_input(qb).reshape(m, nc),
         _kernel_input(a).reshape(m, nc, nd), _kernel_input(bv).reshape(m, nc, nd), dt.type(0))
    return s, res


# ---------------------------------------------------------------------------------------------------
# LiSA spectral products (Eq. 10); specification refimpl.attention.lisa_cores._lisa_spectral_product_numpy
# ---------------------------------------------------------------------------------------------------

def _spectral_product_kernel(out, xf, kf, shared):  # pragma: no cover - runs compiled
    """out[m, f, c, d] = xf[m, f, c] * kf[f, c or 0, d] on the real views (interleaved re, im):
    (a + ib)(p + iq) = (a p - b q) + i (a q + b p), the textbook product (two products and one addition
    per part, no FMA), streamed in out's memory order.  out (M, F, c, 2D), xf (M, F, 2c), kf (F, c|1, 2D)."""
    nm, nf, nc2 = xf.shape
    nc = nc2 // 2
    nd = kf.shape[2] // 2
    for m in range(nm):
        for f in range(nf):
            for c in range(nc):
                a = xf[m, f, 2 * c]
                b = xf[m, f, 2 * c + 1]
                krow = kf[f, 0] if shared else kf[f, c]
                orow = out[m, f, c]
                for d in range(nd):
                    pr = krow[2 * d]
                    qi = krow[2 * d + 1]
                    orow[2 * d] = a * pr - b * qi
                    orow[2 * d + 1] = a * qi + b * pr


@register("lisa_spectral_product", "numba")
def lisa_spectral_product(xf: Any, kf: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """The LiSA spectral product in Numba: the twin of ``refimpl.attention.lisa_cores._lisa_spectral_product_numpy``.

    P[m, f, c, d] = Xf[m, f, c] Kf[f, c', d] (c' = c, or 0 when Kf has one channel: Gb's shared kernel).

    Parameters
    ----------
    xf : (M, F, c) complex64/complex128.  kf : (F, c, D) or (F, 1, D), same dtype.
    out : optional (M, F, c, D) buffer of that dtype (C-contiguous, aligned, writeable).

    Returns
    -------
    (M, F, c, D) complex array.

    References
    ----------
    LiSA Eq. 10, Appendix A.
    """
    _import_numba()
    xf, kf = np.asarray(xf), np.asarray(kf)
    if xf.dtype not in (np.complex64, np.complex128) or not xf.dtype.isnative:
        raise TypeError(f"argument 'xf': the Numba kernel takes complex64 or complex128 arrays, got dtype {xf.dtype}")
    if kf.dtype != xf.dtype:
        raise TypeError(f"argument 'kf': expected dtype {xf.dtype} (the dtype of 'xf'), got {kf.dtype}")
    if xf.ndim != 3 or min(xf.shape) < 1:
        raise ValueError(f"argument 'xf': expected a non-empty array of shape (M, F, c), got {xf.shape}")
    nm, nf, nc = xf.shape
    if kf.ndim != 3 or kf.shape[0] != nf or kf.shape[1] not in (1, nc) or kf.shape[2] < 1:
        raise ValueError(f"argument 'kf': expected shape ({nf}, {nc}, D) or ({nf}, 1, D) for xf of shape "
                         f"{xf.shape}, got {kf.shape}")
    nd = kf.shape[2]
    res = _output(out, (nm, nf, nc, nd), xf.dtype, "out", (("xf", xf), ("kf", kf)))
    rt = np.dtype(np.float64 if xf.dtype == np.complex128 else np.float32)
    t = rt.name
    kern = _compile("lisa_spectral_product", _spectral_product_kernel,
                    f"void({t}[:, :, :, ::1], {t}[:, :, ::1], {t}[:, :, ::1], boolean)")
    kern(res.view(rt), _kernel_input(xf).view(rt), _kernel_input(kf).view(rt), kf.shape[1] == 1 and nc > 1)
    return res


# ---------------------------------------------------------------------------------------------------
# LiSA fused FFT core (Eq. 9-10): spectra, spectral products, inverse transforms, biases and the
# contraction, one block of channels at a time; specification refimpl.attention.lisa_cores._lisa_fft_core_numpy
# ---------------------------------------------------------------------------------------------------
#
# Layout: every signal is a contiguous row over the (padded) grid L = (L_1, .., L_r), so each FFT runs
# over the last axes.  A real transform over a grid whose last length L_r = 2K is even is computed as a
# complex transform over (L_1, .., L_{r-1}, K) of the even/odd samples packed as z = y[.., 2j] + i y[.., 2j+1]
# (a free view of the real array), plus one twiddle pass (the "real split" stage that
# refimpl.toeplitz.fft_convolution_depth charges, config.FFT_REAL_SPLIT_STAGES).  With i' the index of
# the leading frequencies negated (-i mod L per axis) and w = exp(2 pi i / L_r):
#   forward   Z = FFT(z);  E = (Z[i, k] + conj Z[i', K-k]) / 2,  O = (Z[i, k] - conj Z[i', K-k]) / (2i),
#             X[i, k] = E + w^-k O                       (k = 0..K; column K reads column 0)
#   inverse   Z[i, k] = E + i O,  E = (X[i, k] + conj X[i', K-k]) / 2,  O = w^k (X[i, k] - conj X[i', K-k]) / 2
#             (k = 0..K-1),  z = IFFT(Z),  y[.., 2j] = Re z[.., j],  y[.., 2j+1] = Im z[.., j]
# (E and O are the spectra of the even and odd samples; the derivation is the 1-D one applied along the
# last axis, using the Hermitian symmetry X[i', L_r - k] = conj X[i, k] of a real signal's spectrum.)  The
# inverse pass is fused with the spectral product X = Xf Kf, so the product spectrum is never stored.
# Every output element still depends on one signal only (no two signals share a complex transform), so
# the error model of the NumPy definition covers it signal by signal.  pocketfft's complex passes have
# radix-7 and radix-11 butterflies that its real passes lack, which is the main reason this is 1.6-2.2x
# faster than scipy.fft.irfft2 at 14x14 .. 112x112 (docs/lisa.md).

def _rfft_post_kernel(x, z, neg, tw, half):  # pragma: no cover - runs compiled
    """x (R, G, 2(K+1)) <- the half spectra of real signals from z (R, G, 2K) = the complex FFT of their
    packed samples (G = prod(L_1..L_{r-1}) leading frequencies, ``neg`` (G,) their negated indices);
    tw (2(K+1),) = exp(-2 pi i k / (2K)), k = 0..K (interleaved re, im).  Real views of complex arrays;
    ``half`` is 0.5 in the element type (a literal would promote float32 arithmetic to float64)."""
    nr, ng = z.shape[0], z.shape[1]
    nk = z.shape[2] // 2
    for r in range(nr):
        for i in range(ng):
            za = z[r, i]
            zb = z[r, neg[i]]
            xr = x[r, i]
            for k in range(nk + 1):
                k1 = k if k < nk else 0
                k2 = nk - k if 0 < k < nk else 0
                ar = za[2 * k1]
                ai = za[2 * k1 + 1]
                br = zb[2 * k2]
                bi = -zb[2 * k2 + 1]               # conj Z[i', K - k]
                er = (ar + br) * half
                ei = (ai + bi) * half
                orr = (ai - bi) * half             # (Z - conj Z') / (2i)
                oi = (br - ar) * half
                tr = tw[2 * k]
                ti = tw[2 * k + 1]
                xr[2 * k] = er + (tr * orr - ti * oi)
                xr[2 * k + 1] = ei + (tr * oi + ti * orr)


def _product_pre_kernel(z, xf, kf, shared, src, tw, half, prow):  # pragma: no cover - runs compiled
    """z[j, d] (G K complex) <- the packed spectrum Z = E + i O (see above) of the product
    P = xf[j] kf[j|0, d] (complex, textbook: two products and one addition per part, no FMA).
    Real views, frequencies flattened: xf (J, 2F), kf (J|1, D, 2F), F = G (K+1); z (J, D, 2 G K);
    src (G K, 3) int64: for output frequency (i, k) the flat indices of (i, k) and (i', K - k) in P and k;
    tw (2K,) = exp(+2 pi i k / (2K)), k = 0..K-1; prow (2F,) workspace holding P of one (j, d)."""
    nj, nd = z.shape[0], z.shape[1]
    nz = z.shape[2] // 2
    nf = xf.shape[1] // 2
    for j in range(nj):
        jj = 0 if shared else j
        xa = xf[j]
        for d in range(nd):
            ka = kf[jj, d]
            for f in range(nf):                    # P of this (j, d), every frequency once
                xr_ = xa[2 * f]
                xi_ = xa[2 * f + 1]
                kr_ = ka[2 * f]
                ki_ = ka[2 * f + 1]
                prow[2 * f] = xr_ * kr_ - xi_ * ki_
                prow[2 * f + 1] = xr_ * ki_ + xi_ * kr_
            zr = z[j, d]
            for f in range(nz):
                a = src[f, 0]
                b = src[f, 1]
                k = src[f, 2]
                p1r = prow[2 * a]
                p1i = prow[2 * a + 1]
                p2r = prow[2 * b]
                p2i = prow[2 * b + 1]
                er = (p1r + p2r) * half            # (P1 + conj P2) / 2
                ei = (p1i - p2i) * half
                dr = (p1r - p2r) * half            # (P1 - conj P2) / 2
                di = (p1i + p2i) * half
                tr = tw[2 * k]
                ti = tw[2 * k + 1]
                zr[2 * f] = er - (tr * di + ti * dr)
                zr[2 * f + 1] = ei + (tr * dr - ti * di)


def _fused_product_kernel(out, xf, kf, shared):  # pragma: no cover - runs compiled
    """out[j, d, f] = xf[j, f] * kf[j or 0, d, f] (complex, textbook product, no FMA) on real views:
    out (J, D, 2F), xf (J, 2F), kf (J|1, D, 2F).  (Odd last FFT length: no packing.)"""
    nj, nd, nf2 = out.shape
    nf = nf2 // 2
    for j in range(nj):
        xrow = xf[j]
        kj = kf[0] if shared else kf[j]
        for d in range(nd):
            krow = kj[d]
            orow = out[j, d]
            for f in range(nf):
                a = xrow[2 * f]
                b = xrow[2 * f + 1]
                p = krow[2 * f]
                q = krow[2 * f + 1]
                orow[2 * f] = a * p - b * q
                orow[2 * f + 1] = a * q + b * p


def _fused_s_kernel(st, qt, ga, ba):  # pragma: no cover - runs compiled
    """st[d, n] += qt[j, n] * (ga[j, d, n] + ba[j, d]) for the J channels of a block, j ascending (so each
    S[n, d] = sum_c Qb (Ga + Ba) is summed over c ascending, starting from st's initial zeros)."""
    nj, nd, nn = ga.shape
    for j in range(nj):
        qrow = qt[j]
        for d in range(nd):
            g = ga[j, d]
            bd = ba[j, d]
            srow = st[d]
            for n in range(nn):
                srow[n] += qrow[n] * (g[n] + bd)


def _fused_y_kernel(out, s_out, st, gb, bb, v0, acc, zero):  # pragma: no cover - runs compiled
    """out[n, v0 + j] = sum_d st[d, n] (gb[j, d, n] + bb[j, d]), d ascending from +0; acc (N,) workspace.
    The first block (v0 = 0) also stores S: s_out[n, d] = st[d, n]."""
    nj, nd, nn = gb.shape
    if v0 == 0:
        for n in range(nn):
            for d in range(nd):
                s_out[n, d] = st[d, n]
    for j in range(nj):
        for n in range(nn):
            acc[n] = zero
        for d in range(nd):
            g = gb[j, d]
            bd = bb[j, d]
            srow = st[d]
            for n in range(nn):
                acc[n] += srow[n] * (g[n] + bd)
        col = v0 + j
        for n in range(nn):
            out[n, col] = acc[n]


def _transpose_kernel(dst, src, c0):  # pragma: no cover - runs compiled
    """dst[m, c, n] = src[m, n, c0 + c] (c < dst.shape[1]) in 32 x 32 tiles (a plain strided copy of a
    transpose misses the cache on one side: 10 ms for Wa at 56 x 56, C = 64 against 1 ms tiled)."""
    nm, nn = src.shape[0], src.shape[1]
    nc = dst.shape[1]
    for m in range(nm):
        for n0 in range(0, nn, 32):
            n1 = min(n0 + 32, nn)
            for t0 in range(0, nc, 32):
                t1 = min(t0 + 32, nc)
                for c in range(t0, t1):
                    drow = dst[m, c]
                    for n in range(n0, n1):
                        drow[n] = src[m, n, c0 + c]


def _twiddles(length: int, sign: int, count: int, rdt: np.dtype) -> np.ndarray:
    """exp(sign 2 pi i k / length), k = 0..count-1, interleaved (re, im) in ``rdt`` (rounded once from
    float64: twiddle error <= u, as the FFT error model assumes)."""
    k = np.arange(count, dtype=np.float64)
    w = np.exp(sign * 2j * np.pi * k / length)
    return np.ascontiguousarray(w.astype(np.complex128).view(np.float64).astype(rdt))


class _SpectralPlan:
    """Transforms over the last r axes of contiguous rows of real signals on the padded grid ``lens``."""

    def __init__(self, lens: tuple[int, ...], dtype: np.dtype):
        import scipy.fft as sfft
        self.sfft = sfft
        try:    # scipy.fft's own pocketfft binding (private; without it the public functions are used)
            from scipy.fft._pocketfft import pypocketfft
            self.pocketfft: Any = pypocketfft
        except Exception:  # noqa: BLE001 - any failure: fall back to the public API
            self.pocketfft = None
        self.lens = lens
        self.r = len(lens)
        self.axes = tuple(range(1, self.r + 1))
        self.rdt = np.dtype(dtype)
        self.cdt = np.dtype(np.complex128 if self.rdt == np.float64 else np.complex64)
        last = lens[-1]
        self.split = last % 2 == 0
        self.lead = lens[:-1]
        self.g = int(np.prod(self.lead))
        self.half = self.lead + (last // 2 + 1,)
        self.nf = int(np.prod(self.half))
        self.ntok = int(np.prod(lens))
        t = self.rdt.name
        if self.split:
            self.k = last // 2
            if self.lead:                    # flat index of the negated leading frequency (-i mod L per axis)
                neg = np.arange(self.g).reshape(self.lead)[np.ix_(*[(-np.arange(n)) % n for n in self.lead])]
            else:
                neg = np.zeros(1, dtype=np.int64)
            self.neg = np.ascontiguousarray(np.reshape(neg, (self.g,)), dtype=np.int64)
            self.tw_fwd = _twiddles(last, -1, self.k + 1, self.rdt)
            self.tw_inv = _twiddles(last, +1, self.k, self.rdt)
            self.half_t = self.rdt.type(0.5)
            self.post_sig = f"void({t}[:, :, ::1], {t}[:, :, ::1], int64[::1], {t}[::1], {t})"
            ii, kk = np.divmod(np.arange(self.g * self.k), self.k)
            self.src = np.ascontiguousarray(np.stack([ii * (self.k + 1) + kk, self.neg[ii] * (self.k + 1) + self.k - kk,
                                                      kk], axis=1), dtype=np.int64)
            self.pre_sig = (f"void({t}[:, :, ::1], {t}[:, ::1], {t}[:, :, ::1], boolean, int64[:, ::1], {t}[::1], "
                            f"{t}, {t}[::1])")
        else:
            self.prod_sig = f"void({t}[:, :, ::1], {t}[:, ::1], {t}[:, :, ::1], boolean)"

    def c2c(self, a: np.ndarray, forward: bool) -> np.ndarray:
        """In-place complex FFT (forward) or inverse FFT scaled by 1 / prod (backward normalisation) over
        the last r axes of ``a``: scipy.fft.fftn / ifftn(a, axes, overwrite_x=True), calling their
        pocketfft routine directly when it can be imported (scipy.fft's argument handling and backend
        dispatch cost about 6 us a call against 0.7 us; same routine, same arguments, same bits)."""
        if self.pocketfft is not None:
            return self.pocketfft.c2c(a, self.axes, forward, 0 if forward else 2, a, 1)
        fn = self.sfft.fftn if forward else self.sfft.ifftn
        return fn(a, axes=self.axes, overwrite_x=True)

    def forward(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """rfftn over the last r axes of y (R, *lens) real C-contiguous (consumed) -> (R, F) complex, in x
        (a complex buffer of R F elements)."""
        sf = self.sfft
        nrow = y.shape[0]
        if not self.split:
            x = x.reshape(nrow, self.nf)
            np.copyto(x, sf.rfftn(y, axes=self.axes).reshape(nrow, self.nf))
            return x
        zc = self.c2c(y.view(self.cdt), True)                              # packed samples, in place
        x = x.reshape(nrow, self.g, self.k + 1)
        post = _compile("lisa_rfft_post", _rfft_post_kernel, self.post_sig)
        post(x.view(self.rdt), zc.reshape(nrow, self.g, self.k).view(self.rdt), self.neg, self.tw_fwd, self.half_t)
        return x.reshape(nrow, self.nf)

    def product_inverse(self, xf: np.ndarray, kf: np.ndarray, shared: bool, work: np.ndarray) -> np.ndarray:
        """irfftn of the products xf[j] kf[j|0, d]: xf (J, F), kf (J|1, D, F) complex -> (J, D, prod(lens))
        real, in ``work`` (a complex scratch buffer of at least J D prod(lens) / 2 + 1 elements)."""
        sf = self.sfft
        nj, nd = xf.shape[0], kf.shape[1]
        if not self.split:
            p = work[:nj * nd * self.nf].reshape(nj, nd, self.nf)
            _compile("lisa_fused_product", _fused_product_kernel, self.prod_sig)(
                p.view(self.rdt), xf.view(self.rdt), kf.view(self.rdt), shared)
            y = sf.irfftn(p.reshape((nj * nd,) + self.half), s=self.lens, axes=self.axes)
            return y.reshape(nj, nd, self.ntok)
        z = work[:nj * nd * self.g * self.k].reshape(nj, nd, self.g, self.k)
        pre = _compile("lisa_product_pre", _product_pre_kernel, self.pre_sig)
        pre(z.reshape(nj, nd, self.g * self.k).view(self.rdt), xf.view(self.rdt), kf.view(self.rdt), shared,
            self.src, self.tw_inv, self.half_t, _scratch("prow", (2 * self.nf,), self.rdt))
        z = self.c2c(z.reshape((nj * nd,) + self.lead + (self.k,)), False)
        return z.view(self.rdt).reshape(nj, nd, self.ntok)


_PLANS: dict[tuple[tuple[int, ...], str], _SpectralPlan] = {}    # read-only after construction


@register("lisa_fft_core", "numba")
def lisa_fft_core(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                  grid: tuple[int, ...], lengths: tuple[int, ...] | None = None, *,
                  out: np.ndarray | None = None, s_out: np.ndarray | None = None,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LiSA's FFT core fused (Eq. 9-10): the twin of ``refimpl.attention.lisa_cores._lisa_fft_core_numpy``.

    Ga = Kb (*) Wa, Gb = V (*) Wb (circular convolutions over the grid; with ``lengths`` linear ones by
    zero padding to ``lengths`` and the Toeplitz kernel already periodised), then S = sum_c Qb (Ga + Ba)
    and Y = sum_d S (Gb + Bb).  Computed one head and one block of channels at a time: the spectral
    products of the block (Numba), its inverse transforms (scipy.fft, complex, see the comment above),
    the bias and the contraction (Numba), so the (N, c, D) tensors Ga, Gb are never formed whole.  The
    kernel spectra are computed once per call (shared by all heads).

    Threads (:func:`lisa_threads`), two rounds: the forward spectra in blocks of rows (the kernels' split
    into one block of (c, D) rows per thread, the signals' into blocks of heads), then the heads (B h),
    each computed whole by one thread (inverse transforms, biases, contraction) on that thread's scratch,
    writing only its own rows of S and Y.  No sum crosses a thread, and a transform's bits do not depend
    on how many others share its pocketfft call, so the result is bitwise identical for any thread count
    (tested).  Scratch buffers are per thread, 64-byte aligned and reused across calls
    (:func:`release_scratch`).

    Parameters
    ----------
    qb, kb : (B, h, N, c) float32/float64, the L2-normalised queries and keys; v : (B, h, N, c) values.
    weight_a : (*lengths, c, D) kernel of Ga on the FFT grid (Wa reshaped to the grid, or the periodised
        Toeplitz kernel); weight_b : (*lengths, D).  bias_a, bias_b : (c, D).  All of qb's dtype.
    grid : token grid (N = prod(grid)).  lengths : FFT lengths per axis (None: the grid, circular).
    out : optional (B, h, N, c) buffer; s_out : optional (B, h, N, D) buffer.
    threads : int >= 1 or None (default: the C kernels' rule, refimpl.backends._c.default_threads());
        at most one thread per head is used, and one below config.LISA_PARALLEL_MIN_WORK.  Changes the
        speed only, never a bit.

    Returns
    -------
    (S, Y): (B, h, N, D) and (B, h, N, c) arrays of qb's dtype.

    References
    ----------
    LiSA Eq. 9, Eq. 10, Fig. 7, Appendix A.
    """
    _import_numba()
    qb = _float_array(qb, "qb")
    dt = qb.dtype
    kb, v = _float_array(kb, "kb", dt), _float_array(v, "v", dt)
    wa, wb = _float_array(weight_a, "weight_a", dt), _float_array(weight_b, "weight_b", dt)
    ba, bb = _float_array(bias_a, "bias_a", dt), _float_array(bias_b, "bias_b", dt)
    grid, lens = check_lisa_core_shapes(qb, kb, v, wa, wb, ba, bb, grid, lengths)
    nb, nh, ntok, nc = qb.shape
    nd = wa.shape[-1]
    ins = (("qb", qb), ("kb", kb), ("v", v))
    res = _output(out, qb.shape, dt, "out", ins)
    s = _output(s_out, (nb, nh, ntok, nd), dt, "s_out", ins + (("out", res),))
    t = dt.name
    skern = _compile("lisa_fused_s", _fused_s_kernel, f"void({t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, ::1])")
    ykern = _compile("lisa_fused_y", _fused_y_kernel,
                     f"void({t}[:, ::1], {t}[:, ::1], {t}[:, ::1], {t}[:, :, ::1], {t}[:, ::1], int64, {t}[::1], {t})")
    transpose = _compile("lisa_transpose", _transpose_kernel, f"void({t}[:, :, ::1], {t}[:, :, ::1], int64)")
    plan = _PLANS.get((lens, dt.name))
    if plan is None:
        plan = _PLANS[(lens, dt.name)] = _SpectralPlan(lens, dt)
    m = nb * nh
    padded = lens != grid
    cdt = plan.cdt
    nf = plan.nf
    cropsl = tuple(slice(0, n) for n in grid)
    nthreads = lisa_threads(threads, m, m * nc * nd * plan.ntok)

    def spectra(name, src, col0, ncol, npos, pad, x):
        """rfftn over the grid of columns col0 .. col0 + ncol of src (M', npos, C) -> x (M' ncol F,) complex:
        the columns transposed into this thread's scratch rows (M', ncol) (zero-padded to lens when
        ``pad``), transformed in place."""
        mm = src.shape[0]
        y = _scratch(name + "_in", (mm * ncol,) + lens, dt)
        if padded and pad:
            yt = _scratch(name + "_t", (mm, ncol, npos), dt)
            transpose(yt, src, col0)
            y.fill(0)
            np.copyto(y[(slice(None),) + cropsl], yt.reshape((mm * ncol,) + grid))
        else:
            transpose(y.reshape(mm, ncol, npos), src, col0)
        return plan.forward(y, x)

    # Spectra, in blocks written into disjoint parts of the calling thread's buffers (nthreads blocks of
    # rows of each kind): the kernels' (rows (c, D) and (D,) over the FFT grid; once per call, shared by
    # the heads) and the signals' (rows (B h, c) of Kb and V, blocks of heads); Qb transposed to (B h, c, N).
    ncd = nc * nd
    wa3 = _kernel_input(wa.reshape(1, plan.ntok, ncd))
    wb3 = _kernel_input(wb.reshape(1, plan.ntok, nd))
    kb3 = _kernel_input(kb.reshape(m, ntok, nc))
    v3 = _kernel_input(v.reshape(m, ntok, nc))
    q3 = _kernel_input(qb.reshape(m, ntok, nc))
    waf, wbf = _scratch("waf", (ncd * nf,), cdt), _scratch("wbf", (nd * nf,), cdt)
    kf, vf = _scratch("kf", (m * nc * nf,), cdt), _scratch("vf", (m * nc * nf,), cdt)
    qt = _scratch("qt", (m, nc, ntok), dt)
    rb, hb = -(-ncd // nthreads), -(-m // nthreads)
    units = [lambda r0=r0, r1=min(ncd, r0 + rb): spectra("wa", wa3, r0, r1 - r0, plan.ntok, False,
                                                          waf[r0 * nf:r1 * nf]) for r0 in range(0, ncd, rb)]
    for name, src, dst in (("kb", kb3, kf), ("v", v3, vf)):
        units += [lambda name=name, src=src, dst=dst, h0=h0, h1=min(m, h0 + hb):
                  spectra(name, src[h0:h1], 0, nc, ntok, True, dst[h0 * nc * nf:h1 * nc * nf])
                  for h0 in range(0, m, hb)]
    units.append(lambda: spectra("wb", wb3, 0, nd, plan.ntok, False, wbf))
    units.append(lambda: transpose(qt, q3, 0))
    _run_shared(units, nthreads)
    waf, wbf = waf.reshape(nc, nd, nf), wbf.reshape(1, nd, nf)
    kf, vf = kf.reshape(m, nc, nf), vf.reshape(m, nc, nf)
    ba, bb = np.ascontiguousarray(ba), np.ascontiguousarray(bb)
    out3 = res.reshape(m, ntok, nc)
    s3 = s.reshape(m, ntok, nd)
    # Channel blocks: about config.LISA_FUSED_BLOCK_BYTES of spectra per block.
    per_channel = nd * nf * cdt.itemsize
    cb = int(max(1, min(nc, config.LISA_FUSED_BLOCK_BYTES // max(per_channel, 1))))
    zero = dt.type(0)

    def head(mi):
        """Head mi (of B h) whole, on this thread's scratch: Ga and Gb a block of channels at a time, into
        the rows of head mi of S and Y."""
        work = _scratch("work", (cb * nd * nf,), cdt)          # >= cb D prod(lens) / 2 (nf >= ntok / 2)
        st = _scratch("st", (nd, ntok), dt)
        acc = _scratch("acc", (ntok,), dt)

        def inverse_block(spec_rows, kern_rows, shared, j):
            g = plan.product_inverse(spec_rows, kern_rows, shared, work)                   # (j, D, prod(lens))
            if padded:
                crop = _scratch("crop", (j, nd) + grid, dt)
                np.copyto(crop, g.reshape((j, nd) + lens)[(slice(None), slice(None)) + cropsl])
                g = crop
            return g.reshape(j, nd, ntok)

        st.fill(0)
        for c0 in range(0, nc, cb):
            j = min(cb, nc - c0)
            ga = inverse_block(kf[mi, c0:c0 + j], waf[c0:c0 + j], False, j)
            skern(st, qt[mi, c0:c0 + j], ga, ba[c0:c0 + j])
        for c0 in range(0, nc, cb):
            j = min(cb, nc - c0)
            gb = inverse_block(vf[mi, c0:c0 + j], wbf, True, j)
            ykern(out3[mi], s3[mi], st, gb, bb[c0:c0 + j], c0, acc, zero)

    _run_shared([lambda mi=mi: head(mi) for mi in range(m)], nthreads)
    return s, res
