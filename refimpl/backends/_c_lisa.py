"""C LiSA core: operation ``"lisa_fft_core"`` on the C backend (twin of
``refimpl.attention.lisa_cores._lisa_fft_core_numpy``), float64.

The transforms are scipy.fft's rfftn / irfftn (pocketfft, the definition's own library), run on contiguous
token-last rows (``workers`` = the thread count); the spectral products and the contraction are the C kernels of
ckernels/lisa.c (``refimpl_lisa_spectral_f64``, ``refimpl_lisa_contract_f64``), with their plain versions
(ckernels/lisa_plain.c) behind :func:`lisa_fft_core_plain`, the specification (not registered).  The steps:

1. Kb and V transposed to (B h, c, *grid) rows, Wa to (c, D, *L), Wb to (D, *L); rfftn over the grid axes
   (zero-padded to the FFT lengths L when given: linear convolutions with the periodised Toeplitz kernels);
2. a block of heads at a time (about config.LISA_FUSED_BLOCK_BYTES of spectra, so that the block stays in
   cache): the products Kf Waf and Vf Wbf (C; the textbook complex product, each operation rounded once: the
   definition's ``xf * kf`` within a rounding of each term), irfftn back to (B h, c, D, *L), cropped to the grid;
3. the block's S = sum_c Qb (Ga + Ba), Y = sum_d S (Gb + Bb) (C; token-last, vectorised over tokens, one head
   per work item).

No range fallback: every step is the definition's operation on the same values (no rescaling on either side),
so a non-finite value arises where the definition's does.  This module imports nothing from refimpl.attention,
refimpl.layers or refimpl.models.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from .. import config
from ._c import _check_status, _load
from ._numba import lisa_threads
from ._registry import register
from ._validate import check_lisa_core_shapes, empty_aligned


def _f64(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype != np.float64:
        raise TypeError(f"argument '{name}': the C kernel takes float64 arrays, got dtype {arr.dtype}")
    return arr


def lisa_fft_core_supported(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                            *args: Any, **kwargs: Any) -> bool:
    """The calls the C lisa_fft_core takes: every array float64 (float32 runs on the definition)."""
    return all(getattr(a, "dtype", None) == np.float64 for a in (qb, kb, v, weight_a, weight_b, bias_a, bias_b))


def lisa_fft_core_args(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                       grid: Any, lengths: Any) -> tuple:
    """The checked arguments: (qb, kb, v, wa, wb, ba, bb, grid, lens); ValueError / TypeError naming the argument."""
    qb, kb, v = _f64(qb, "qb"), _f64(kb, "kb"), _f64(v, "v")
    wa, wb = _f64(weight_a, "weight_a"), _f64(weight_b, "weight_b")
    ba, bb = _f64(bias_a, "bias_a"), _f64(bias_b, "bias_b")
    grid, lens = check_lisa_core_shapes(qb, kb, v, wa, wb, ba, bb, grid, lengths)
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise ValueError(f"argument 'grid': expected 1 to 3 positive sizes, got {grid}")
    return qb, kb, v, wa, wb, ba, bb, grid, lens


_LOCAL = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A C-contiguous 64-byte aligned buffer of ``shape`` for this thread, reused across calls (grown when
    too small): the transforms' inputs and outputs are a few MB, and fresh pages cost more than the transforms
    at LiSANet's sizes.  Never returned to a caller."""
    dt = np.dtype(dtype)
    need = math.prod(shape) * dt.itemsize
    pool = _LOCAL.__dict__.setdefault("buffers", {})
    buf = pool.get(name)
    if buf is None or buf.size < need:
        buf = pool[name] = empty_aligned(max(need, 64), np.uint8)
    return buf[:need].view(dt).reshape(shape)


def _fft():
    """(r2c, c2r): scipy.fft's pocketfft routines called directly (no argument handling or backend dispatch:
    the same routine, arguments and bits as scipy.fft.rfftn / irfftn, with the output buffer given), or
    wrappers of the public functions where the private binding cannot be imported."""
    try:
        from scipy.fft._pocketfft import pypocketfft as pp

        def r2c(a, axes, out, nthreads):
            return pp.r2c(a, axes, True, 0, out, nthreads)

        def c2r(a, axes, lastsize, out, nthreads):
            return pp.c2r(a, axes, lastsize, False, 2, out, nthreads)
    except Exception:  # noqa: BLE001 - any failure: the public API
        import scipy.fft as sfft

        def r2c(a, axes, out, nthreads):
            out[...] = sfft.rfftn(a, axes=axes, workers=nthreads)
            return out

        def c2r(a, axes, lastsize, out, nthreads):
            s = [a.shape[ax] for ax in axes[:-1]] + [lastsize]
            out[...] = sfft.irfftn(a, s=s, axes=axes, workers=nthreads)
            return out
    return r2c, c2r


def _spectra(name: str, x: np.ndarray, lens: tuple[int, ...], r2c: Any, nthreads: int) -> np.ndarray:
    """rfftn over the last r axes of the rows x (R, *ch, *grid) zero-padded to ``lens`` (R, *ch, *half)."""
    r = len(lens)
    lead = x.shape[:-r]
    if x.shape[-r:] != lens:
        y = _scratch(name + "_pad", lead + lens, np.float64)
        y.fill(0.0)
        y[(Ellipsis,) + tuple(slice(0, n) for n in x.shape[-r:])] = x
        x = y
    half = lens[:-1] + (lens[-1] // 2 + 1,)
    return r2c(x, list(range(len(lead), len(lead) + r)), _scratch(name + "_f", lead + half, np.complex128), nthreads)


def _kernel_rows(name: str, w: np.ndarray, r: int) -> np.ndarray:
    """(*L, *ch) -> (*ch, *L), C-contiguous, in a scratch buffer."""
    moved = np.moveaxis(w, tuple(range(r)), tuple(range(w.ndim - r, w.ndim)))
    rows = _scratch(name, moved.shape, np.float64)
    np.copyto(rows, moved)
    return rows


def _run(name: str, plain: bool, nthreads: int, *args: Any) -> None:
    """refimpl_<name>_f64 (with ``nthreads``) or refimpl_<name>_plain_f64 on the arguments: the first
    ``writable`` arrays passed writable, the other arrays read-only, scalars as they are; the status checked."""
    mod = _load()
    ffi = mod.ffi
    nout = 2 if name == "lisa_contract" else 1
    bufs = [ffi.from_buffer("double[]", a, require_writable=i < nout) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(args)]
    if plain:
        status = getattr(mod.lib, f"refimpl_{name}_plain_f64")(*bufs)
    else:
        status = getattr(mod.lib, f"refimpl_{name}_f64")(*bufs, nthreads)
    _check_status(mod, status, f"refimpl_{name}{'_plain' if plain else ''}")


def _flat(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array (complex viewed as interleaved float64) as a flat float64 view."""
    a = np.ascontiguousarray(a)
    return (a.view(np.float64) if a.dtype == np.complex128 else a).reshape(-1)


def _core(qb, kb, v, weight_a, weight_b, bias_a, bias_b, grid, lengths, threads, plain):
    _load()  # ImportError before any work when the compiled module is missing
    qb, kb, v, wa, wb, ba, bb, grid, lens = lisa_fft_core_args(qb, kb, v, weight_a, weight_b, bias_a, bias_b, grid,
                                                               lengths)
    r2c, c2r = _fft()
    r = len(grid)
    b, h, ntok, nc = qb.shape
    nd = wa.shape[-1]
    m = b * h
    nthreads = 1 if plain else lisa_threads(threads, m, m * nc * nd * math.prod(lens))
    # 1. spectra: the signals Kb and V in one transform call (2, M, c, *half), the kernels (c, D, *half), (D, *half)
    rows = _scratch("rows", (2, m, nc, ntok), np.float64)
    np.copyto(rows[0], kb.reshape(m, ntok, nc).transpose(0, 2, 1))
    np.copyto(rows[1], v.reshape(m, ntok, nc).transpose(0, 2, 1))
    sig = _spectra("sig", rows.reshape((2 * m, nc) + grid), lens, r2c, nthreads)
    waf = _spectra("wa", _kernel_rows("wa", wa, r), lens, r2c, nthreads)
    wbf = _spectra("wb", _kernel_rows("wb", wb, r), lens, r2c, nthreads)
    half = sig.shape[2:]
    nf = math.prod(half)
    sig = sig.reshape((2, m, nc) + half)
    qt = _scratch("qt", (m, nc, ntok), np.float64)
    np.copyto(qt, qb.reshape(m, ntok, nc).transpose(0, 2, 1))
    st = empty_aligned((b, h, nd, ntok), np.float64)
    yt = empty_aligned((b, h, nc, ntok), np.float64)
    st3, yt3 = st.reshape(m, nd, ntok), yt.reshape(m, nc, ntok)
    ba_, bb_ = _flat(ba), _flat(bb)
    # 2.-3. blocks of heads with about config.LISA_FUSED_BLOCK_BYTES of product spectra (cache-resident):
    # the products (C) into one buffer (2, j, c, D, *half), one inverse transform call, cropped to the grid,
    # then the block's contraction (C), token-last
    hb = int(max(1, min(m, config.LISA_FUSED_BLOCK_BYTES // (2 * nc * nd * nf * 16))))
    axes = list(range(4, 4 + r))
    for h0 in range(0, m, hb):
        j = min(hb, m - h0)
        prod = _scratch("prod", (2, j, nc, nd) + half, np.complex128)
        for i, (kern, shared) in enumerate(((waf, 0), (wbf, 1))):
            _run("lisa_spectral", plain, nthreads, _flat(prod[i]), _flat(sig[i, h0:h0 + j]), _flat(kern), j, nc, nd, nf,
                 shared)
        g = c2r(prod, axes, lens[-1], _scratch("g", (2, j, nc, nd) + lens, np.float64), nthreads)
        if lens != grid:
            crop = _scratch("crop", (2, j, nc, nd) + grid, np.float64)
            np.copyto(crop, g[(slice(None),) * 4 + tuple(slice(0, n) for n in grid)])
            g = crop
        g = g.reshape(2, -1)
        _run("lisa_contract", plain, nthreads, st3[h0:h0 + j].reshape(-1), yt3[h0:h0 + j].reshape(-1),
             qt[h0:h0 + j].reshape(-1), g[0], g[1], ba_, bb_, j, ntok, nc, nd)
    return st.transpose(0, 1, 3, 2), yt.transpose(0, 1, 3, 2)


@register("lisa_fft_core", "c", supports=lisa_fft_core_supported)
def lisa_fft_core(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                  grid: tuple[int, ...], lengths: tuple[int, ...] | None = None, *,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LiSA's FFT core in C (Eq. 9-10): the twin of ``refimpl.attention.lisa_cores._lisa_fft_core_numpy``.

    Ga = Kb (*) Wa, Gb = V (*) Wb (circular convolutions over the grid; with ``lengths`` linear ones by zero
    padding to ``lengths``, the Toeplitz kernel already periodised), then S = sum_c Qb (Ga + Ba) and
    Y = sum_d S (Gb + Bb): scipy.fft's transforms, the C spectral products and contraction (module docstring).
    Within lisa_core_bound of the definition (the same transforms on the same values; the contraction's sums in
    a fixed order, the definition's einsum in its own); every thread count gives the same bits.

    Parameters
    ----------
    qb, kb : (B, h, N, c) float64, the L2-normalised queries and keys; v : (B, h, N, c) values.
    weight_a : (*lengths, c, D) kernel of Ga on the FFT grid; weight_b : (*lengths, D).  bias_a, bias_b : (c, D).
    grid : token grid (1-3 axes, N = prod(grid)).  lengths : FFT lengths per axis (None: the grid, circular).
    threads : int >= 1 or None (refimpl.backends._c.default_threads()): the C kernels' threads and scipy.fft's
        ``workers``, at most one per head and one below config.LISA_PARALLEL_MIN_WORK (the Numba kernel's rule,
        refimpl.backends._numba.lisa_threads); speed only.

    Returns
    -------
    (S, Y): (B, h, N, D) and (B, h, N, c) float64 arrays (views of token-last buffers).

    Raises
    ------
    TypeError for a dtype other than float64; ValueError for inconsistent shapes, grid or lengths; ImportError
    if the compiled module is missing.

    References
    ----------
    LiSA Eq. 9, Eq. 10, Fig. 7, Appendix A.
    """
    return _core(qb, kb, v, weight_a, weight_b, bias_a, bias_b, grid, lengths, threads, False)


def lisa_fft_core_plain(qb: Any, kb: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                        grid: tuple[int, ...], lengths: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lisa_fft_core` with the plain C versions (ckernels/lisa_plain.c: scalar loops, one thread) and
    one scipy.fft worker: the specification beside the fast path (not registered); the same bits."""
    return _core(qb, kb, v, weight_a, weight_b, bias_a, bias_b, grid, lengths, None, True)
