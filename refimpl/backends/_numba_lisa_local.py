"""Numba kernel of LiSA's local Toeplitz product (Table 3c, "Local - k x k"): operation ``"lisa_local_convolve"``.

The twin of ``refimpl.attention.lisa_local._local_convolve_numpy`` (the definition, the specification):

    y[..., i, c, d] = sum_{s in window} w[s + rad, c | 0, d] x[..., i + s, c]      (LiSA Eq. 2, 9, Table 3c)

over the k_1 x .. x k_r window of offsets |s_a| <= rad_a = (k_a - 1) / 2, with zero padding.  The definition
adds the taps one at a time in row-major window order into zeros (``y += xpad[i + off] * w[t]``); the kernel
performs, per output element, the same products and additions in the same order from +0, so it gives the
definition's bits (no fastmath, no contraction into FMA).  It differs in how it walks memory: one output
row y[m, i] (c x D values, cache-resident) at a time, every tap of the window added before moving on,
instead of one pass over the whole (..., N, c, D) output per tap; nothing else is allocated.

Zero padding: a tap whose token i + s lies outside the grid adds (+0) * w[t] in the definition.  While the
tap's weights are all finite that is +-0 added to a sum that started at +0 (and so is never -0), which
changes nothing, and the kernel skips the tap; for a tap with an infinite or NaN weight it adds zero * w[t]
literally (NaN, as in the definition).

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


def _local_conv_kernel(y, x, w, nbr, tap_finite, shared, r0, r1, zero):  # pragma: no cover - runs compiled
    """Rows p = m N + i in [r0, r1) of y (M, N, c, D): y[m, i, c, d] = sum_t w[t, c|0, d] x[m, nbr[i, t], c],
    t ascending from +0; nbr[i, t] < 0 marks a tap outside the grid (skipped where tap_finite[t], else
    zero * w[t] added).  x (M, N, c), w (T, c | 1, D), nbr (N, T) int64, tap_finite (T,) boolean."""
    nn, nc, nd = y.shape[1], y.shape[2], y.shape[3]
    nt = w.shape[0]
    for p in range(r0, r1):
        m = p // nn
        i = p % nn
        yi = y[m, i]
        for c in range(nc):
            yr = yi[c]
            for d in range(nd):
                yr[d] = zero
        for t in range(nt):
            j = nbr[i, t]
            wt = w[t]
            if j >= 0:
                xr = x[m, j]
                for c in range(nc):
                    xv = xr[c]
                    wr = wt[0] if shared else wt[c]
                    yr = yi[c]
                    for d in range(nd):
                        yr[d] += xv * wr[d]
            elif not tap_finite[t]:
                for c in range(nc):
                    wr = wt[0] if shared else wt[c]
                    yr = yi[c]
                    for d in range(nd):
                        yr[d] += zero * wr[d]


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
                    f"void({t}[:, :, :, ::1], {t}[:, :, ::1], {t}[:, :, ::1], int64[:, ::1], boolean[::1], "
                    f"boolean, int64, int64, {t})")
    ys, xs, ws = res.reshape(m, n_tok, c, nd), _kernel_input(x).reshape(m, n_tok, c), _kernel_input(w)
    nbr = _neighbours(g, ks)
    tap_finite = np.ascontiguousarray(np.isfinite(w).reshape(n_taps, -1).all(axis=1))
    shared, zero = w.shape[1] == 1 and c > 1, dt.type(0)
    rows = m * n_tok
    if nthreads == 1 or rows * n_taps * c * nd < config.LISA_PARALLEL_MIN_WORK:
        kern(ys, xs, ws, nbr, tap_finite, shared, 0, rows, zero)
    else:
        step = -(-rows // (nthreads * _UNITS_PER_THREAD))
        _run_shared([lambda r0=r0: kern(ys, xs, ws, nbr, tap_finite, shared, r0, min(r0 + step, rows), zero)
                     for r0 in range(0, rows, step)], nthreads)
    return res
