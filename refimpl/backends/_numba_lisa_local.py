"""Numba kernel of LiSA's local Toeplitz product (Table 3c, "Local - k x k"): operation ``"lisa_local_convolve"``.

The twin of ``refimpl.attention.lisa_local._local_convolve_numpy`` (the definition, the specification):

    y[..., i, c, d] = sum_{s in window} w[s + rad, c | 0, d] x[..., i + s, c]      (LiSA Eq. 2, 9, Table 3c)

over the k_1 x .. x k_r window of offsets |s_a| <= rad_a = (k_a - 1) / 2, with zero padding.  The definition
adds the taps one at a time in row-major window order into zeros (``y += xpad[i + off] * w[t]``); the kernel
performs, per output element, the same products and additions in the same order from +0, so it gives the
definition's bits (no fastmath, no contraction into FMA).  It differs in how it walks memory: one output
row y[m, i] (c D values, cache-resident) at a time, every tap of the window added before moving on,
instead of one pass over the whole (..., N, c, D) output per tap.  The row's terms, in tap order, are added
up to four per pass, y = (((y + x_a w_a) + x_b w_b) + x_c w_c) + x_d w_d with every product and sum rounded
(the definition's operations and order per element; fewer loads and stores of y), each pass one loop over
the row's c D values, contiguous in y, in the weights (w[t] as one row of c D values; a shared (T, 1, D)
weight is first repeated over the channels, a copy) and in the token's values x[m, j, c] repeated D times.
Those expanded rows sit in a ring of min(2 reach + 1, N) rows per work unit (reach: the largest |j - i| of
a tap; the ring is the unit's scratch, allocated per call), which each token of the unit's reach enters
once, when the first output row that needs it comes up, and leaves when no later row can reach it.  Only
such a long loop is vectorised at D = 16 in float32: over d alone the vector loop needs more iterations
than D and the scalar remainder ran instead (measured: the row-by-d kernel took 2.2x longer per output
element at D = 16 than at D = 32 in float32).  The expansion copies values, it computes nothing, so the
bits are unchanged.

Zero padding: a tap whose token i + s lies outside the grid adds (+0) * w[t] in the definition.  While the
tap's weights are all finite that is +-0 added to a sum that started at +0 (and so is never -0), which
changes nothing, and the kernel skips the tap; for a tap with an infinite or NaN weight it adds zero * w[t]
literally (a ring row of +0 as the token; NaN, as in the definition).

Threads: the rows (m, i) are cut into contiguous blocks run on the Numba backend's worker pool
(refimpl.backends._numba._run_shared; ``threads`` as the C kernels, refimpl.backends._c.default_threads()
by default, and one thread below config.LISA_PARALLEL_MIN_WORK).  Every output element is computed whole by
one thread, so the thread count changes no bit.  Compiled on first use with an explicit signature
(refimpl.backends._numba._compile: cache=True, nogil=True, fastmath=config.NUMBA_FASTMATH, the NumPy error
model).  This module imports nothing from refimpl.attention, refimpl.layers or refimpl.models.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Sequence

import numpy as np

from .. import config
from ._c import _threads
from ._numba import _compile, _float_array, _import_numba, _kernel_input, _output, _run_shared
from ._registry import register
from ._validate import float_arrays

__all__ = ["lisa_local_convolve"]

#: Rows (m, i) per work unit of the thread pool, as a multiple of the thread count: a few units per thread
#: so that a thread delayed by another process does not hold up the call.
_UNITS_PER_THREAD = 4


def _local_conv_kernel(y, x, w, nbr, tap_finite, reach, r0, r1, zero):  # pragma: no cover - runs compiled
    """Rows p = m N + i in [r0, r1) of y (M N, c D): y[p, c D + d] = sum_t w[t, c D + d] x[m N + nbr[i, t], c],
    t ascending from +0; nbr[i, t] < 0 marks a tap outside the grid (skipped where tap_finite[t], else
    zero * w[t] added).  x (M N, c), w (T, c D) (shared weights already repeated over c), nbr (N, T) int64
    with |nbr[i, t] - i| <= reach where >= 0, tap_finite (T,) boolean."""
    nn, nt = nbr.shape[0], nbr.shape[1]
    nc, ne = x.shape[1], y.shape[1]
    nd = ne // nc
    nr = min(2 * reach + 1, nn)
    ring = np.empty((nr + 1, ne), y.dtype)  # ring[j % nr, c D + d] = x[m N + j, c]; ring[nr]: zeros
    for e in range(ne):
        ring[nr, e] = zero
    slot = np.empty(nt, np.int64)           # per row: the ring row and the tap of each term, in tap order
    tap = np.empty(nt, np.int64)
    cur_m, hi = -1, 0                       # tokens [.., hi) of slice cur_m are in the ring
    for p in range(r0, r1):
        m = p // nn
        i = p - m * nn
        if m != cur_m:
            cur_m, hi = m, max(0, i - reach)
        top = min(nn, i + reach + 1)
        while hi < top:
            xr = x[m * nn + hi]
            rr = ring[hi % nr]
            for c in range(nc):
                xv = xr[c]
                for d in range(nd):
                    rr[c * nd + d] = xv
            hi += 1
        nterm = 0
        for t in range(nt):
            j = nbr[i, t]
            if j >= 0 or not tap_finite[t]:
                slot[nterm] = j % nr if j >= 0 else nr
                tap[nterm] = t
                nterm += 1
        yr = y[p]
        for e in range(ne):
            yr[e] = zero
        # the terms in tap order, up to four per pass over the row: y = (((y + a) + b) + c) + d, each
        # product and sum rounded as in the definition
        q = 0
        while q + 4 <= nterm:
            xa, xb, xc, xd = ring[slot[q]], ring[slot[q + 1]], ring[slot[q + 2]], ring[slot[q + 3]]
            wa, wb, wc, wd = w[tap[q]], w[tap[q + 1]], w[tap[q + 2]], w[tap[q + 3]]
            for e in range(ne):
                yr[e] = (((yr[e] + xa[e] * wa[e]) + xb[e] * wb[e]) + xc[e] * wc[e]) + xd[e] * wd[e]
            q += 4
        if nterm - q == 3:
            xa, xb, xc = ring[slot[q]], ring[slot[q + 1]], ring[slot[q + 2]]
            wa, wb, wc = w[tap[q]], w[tap[q + 1]], w[tap[q + 2]]
            for e in range(ne):
                yr[e] = ((yr[e] + xa[e] * wa[e]) + xb[e] * wb[e]) + xc[e] * wc[e]
        elif nterm - q == 2:
            xa, xb, wa, wb = ring[slot[q]], ring[slot[q + 1]], w[tap[q]], w[tap[q + 1]]
            for e in range(ne):
                yr[e] = (yr[e] + xa[e] * wa[e]) + xb[e] * wb[e]
        elif nterm - q == 1:
            xa, wa = ring[slot[q]], w[tap[q]]
            for e in range(ne):
                yr[e] = yr[e] + xa[e] * wa[e]


@functools.lru_cache(maxsize=64)
def _neighbours(grid: tuple[int, ...], ks: tuple[int, ...]) -> np.ndarray:
    """(N, T) int64: the row-major index of token i + s for output token i and tap t (taps row-major over the
    window, s = off - rad), -1 where i + s leaves the grid.  Cached per (grid, kernel); the kernel only reads it."""
    coords = np.indices(grid).reshape(len(grid), -1).T                                       # (N, r)
    offs = np.array(list(itertools.product(*[range(k) for k in ks])), dtype=np.int64) - np.array([k // 2 for k in ks])
    j = coords[:, None, :] + offs[None, :, :]                                                 # (N, T, r)
    inside = np.all((j >= 0) & (j < np.array(grid)), axis=-1)
    strides = np.array([int(np.prod(grid[a + 1:])) for a in range(len(grid))], dtype=np.int64)
    return np.ascontiguousarray(np.where(inside, j @ strides, -1), dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _reach(grid: tuple[int, ...], ks: tuple[int, ...]) -> int:
    """max |j - i| over the taps inside the grid (row-major token indices): how far back and ahead of an
    output row the rows it reads lie."""
    nbr = _neighbours(grid, ks)
    return int(np.max(np.abs(nbr - np.arange(nbr.shape[0])[:, None]), where=nbr >= 0, initial=0))


def _as_sizes(value: Any, name: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(n) for n in value)
    except (TypeError, ValueError):
        raise TypeError(f"argument '{name}': expected a tuple of positive ints, got {value!r}") from None
    if not sizes or any(n < 1 or n != v for n, v in zip(sizes, value)):
        raise ValueError(f"argument '{name}': expected a non-empty tuple of positive ints, got {value!r}")
    return sizes


def _local_supported(x: Any, weight: Any, grid: Any, ks: Any, **_: Any) -> bool:
    """float32/float64 x and weight of one dtype (the definition's validated arguments)."""
    return float_arrays(x, weight)


@register("lisa_local_convolve", "numba", supports=_local_supported)
def lisa_local_convolve(x: Any, weight: Any, grid: Sequence[int], ks: Sequence[int], *,
                        out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """LiSA's local Toeplitz product in Numba: the twin of ``refimpl.attention.lisa_local._local_convolve_numpy``.

    y[..., i, c, d] = sum_{|s_a| <= rad_a} weight[s + rad, c | 0, d] x[..., i + s, c], zero padding.

    Parameters
    ----------
    x : (..., N, c) float32/float64, tokens row-major over ``grid`` (N = prod(grid)).
    weight : (prod(ks), c, D) (depth-wise, LiSA's Ga) or (prod(ks), 1, D) (shared, Gb), x's dtype; taps
        row-major over the window.
    grid : the token grid (positive ints).  ks : the window size per grid axis (odd positive ints).
    out : optional (..., N, c, D) buffer (C-contiguous, aligned, writeable, x's dtype).
    threads : int >= 1 or None (refimpl.backends._c.default_threads()); changes the speed only, never a bit.

    Returns
    -------
    (..., N, c, D) array of x's dtype: the definition's bits (module docstring).

    References
    ----------
    LiSA Eq. 2, Eq. 9, Table 3c (Kim et al.).
    """
    _import_numba()
    nthreads = _threads(threads)
    x = _float_array(x, "x")
    dt = x.dtype
    w = _float_array(weight, "weight", dt)
    g, ks = _as_sizes(grid, "grid"), _as_sizes(ks, "ks")
    if len(ks) != len(g) or any(k % 2 == 0 for k in ks):
        raise ValueError(f"argument 'ks': expected one odd window size per grid axis ({len(g)}), got {ks!r}")
    n_tok, n_taps = int(np.prod(g)), int(np.prod(ks))
    if x.ndim < 2 or x.shape[-2] != n_tok or x.shape[-1] < 1 or x.size == 0:
        raise ValueError(f"argument 'x': expected (..., N = {n_tok}, c) tokens of grid {g}, got shape {x.shape}")
    c = x.shape[-1]
    if w.ndim != 3 or w.shape[0] != n_taps or w.shape[1] not in (1, c) or w.shape[2] < 1:
        raise ValueError(f"argument 'weight': expected ({n_taps}, {c} or 1, D) for a {ks} window, got shape "
                         f"{w.shape}")
    lead, nd = x.shape[:-2], w.shape[2]
    m = int(np.prod(lead))
    res = _output(out, lead + (n_tok, c, nd), dt, "out", (("x", x), ("weight", w)))
    t = dt.name
    kern = _compile("lisa_local_convolve", _local_conv_kernel,
                    f"void({t}[:, ::1], {t}[:, ::1], {t}[:, ::1], int64[:, ::1], boolean[::1], int64, int64, "
                    f"int64, {t})")
    ys, xs = res.reshape(m * n_tok, c * nd), _kernel_input(x).reshape(m * n_tok, c)
    ws = (_kernel_input(w) if w.shape[1] == c else np.repeat(w, c, axis=1)).reshape(n_taps, c * nd)
    nbr, reach = _neighbours(g, ks), _reach(g, ks)
    tap_finite = np.ascontiguousarray(np.isfinite(w).reshape(n_taps, -1).all(axis=1))
    zero = dt.type(0)
    rows = m * n_tok
    if nthreads == 1 or rows * n_taps * c * nd < config.LISA_PARALLEL_MIN_WORK:
        kern(ys, xs, ws, nbr, tap_finite, reach, 0, rows, zero)
    else:
        step = -(-rows // (nthreads * _UNITS_PER_THREAD))
        _run_shared([lambda r0=r0: kern(ys, xs, ws, nbr, tap_finite, reach, r0, min(r0 + step, rows), zero)
                     for r0 in range(0, rows, step)], nthreads)
    return res
