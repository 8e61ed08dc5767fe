"""Toeplitz and circulant structures on 1-D, 2-D and 3-D token grids, and products with them.

LiSA (Kim et al., "Learning Structure-Aware Attention ... LiSA") uses relative-position embeddings (RPEs),
which are Toeplitz matrices, as multiplicative weights (Eq. 2-8), then replaces them by circulant matrices
so that products become FFT circular convolutions (Eq. 9-10).  This module is the exact bookkeeping of
both structures and of the maps between them.

Conventions (used by every function here and by refimpl/attention/lisa.py)
------------------------------------------------------------------------
grid     (n_1, ..., n_r), r = ``ndim`` in {1, 2, 3} (sequence, H x W image, T x H x W video).  Tokens are
         flattened row-major: N = n_1 ... n_r, token (i_1, ..., i_r) -> i_r + n_r (i_{r-1} + ...).
Toeplitz parameters ``e`` : shape (2 n_1 - 1, ..., 2 n_r - 1, *ch).  Per axis exactly Eq. 2 of the paper,
         0-based: T[i, j] = e[n - 1 + j - i]; so row 0 is (e[n-1], ..., e[2n-2]) and the last row is
         (e[0], ..., e[n-1]), i.e. (e_N ... e_2N-1) and (e_1 ... e_N) in the paper's 1-based notation.
         On a grid, T[(i_1..i_r), (j_1..j_r)] = e[n_1 - 1 + j_1 - i_1, ..., n_r - 1 + j_r - i_r]: block
         Toeplitz with Toeplitz blocks (BTTB) for r = 2, with prod(2 n_a - 1) parameters.
Convolution offset s = i - j (query minus key).  T x is the linear convolution of x with the kernel
         h(s) = e[n - 1 - s], |s| <= n - 1  ("RPE x value is a global convolution", §4.1).
Circulant kernel ``w`` : shape (n_1, ..., n_r, *ch);  C[i, j] = w[(i - j) mod n] per axis (BCCB for r = 2),
         so C x = w (*) x, the circular convolution of Eq. 10:  F^-1(F(x) F(w)).
Channels ``*ch`` (any number of trailing axes) broadcast: a product takes x of shape
         (*batch, n_1, ..., n_r, *ch_x) with len(ch_x) == kernel.ndim - r, and returns
         (*batch, n_1, ..., n_r, *broadcast(ch_x, ch_kernel)).

Maps between the two (they make "the same kernel" precise):
* :func:`periodize` (Toeplitz -> circulant, optionally of a larger length L): w[m] = sum over s = m (mod L)
  of h(s).  For L = n this is the circulant counterpart: circulant(periodize(e)) = toeplitz(e) + A, where
  A[i, j] = h(i - j - n) + h(i - j + n) holds exactly the wrap-around taps.  For L >= 2n - 1 nothing
  aliases and the zero-padded circular convolution of length L *is* the Toeplitz product.
* :func:`embed_circulant` (circulant -> Toeplitz): places w[m] at its centred offset (numpy.fft.fftfreq
  convention; for even n the Nyquist tap m = n/2 is split in halves between s = +n/2 and s = -n/2), so that
  periodize(embed_circulant(w)) == w exactly.

Products, three ways (each for both structures): ``method="dense"`` (explicit N x N matrix, guarded by
config.QUADRATIC_MAX_ELEMENTS), ``"rfft"`` (real FFTs, as the paper's Appendix A says is used) and
``"fft"`` (complex FFTs; the imaginary part of the result, zero in exact arithmetic, goes to
``taps["imag"]``).  Toeplitz products by FFT zero-pad every grid axis to ``lengths`` >= 2 n - 1 (exact).

Error model of an FFT convolution (:func:`fft_convolution_depth`): see config.FFT_* and the docstring of
:func:`circulant_product_bound`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.fft as sfft

from . import config, validation
from .errors import ArgumentError, ArgumentTypeError
from .numerics import Bound, as_float

__all__ = [
    "toeplitz", "circulant", "num_toeplitz_params", "num_circulant_params", "toeplitz_grid",
    "circulant_grid", "periodize", "embed_circulant", "restrict_support", "offset_kernel",
    "dense_product", "circulant_product", "toeplitz_product", "wraparound_matrix",
    "fft_convolution_depth", "fft_convolution_bound", "dense_product_bound", "circulant_product_bound",
    "toeplitz_product_bound", "abs_convolution", "default_lengths",
]

METHODS = ("dense", "rfft", "fft")


# ===================================================================================================
# Validation helpers
# ===================================================================================================

def _check_ndim(ndim: Any) -> int:
    if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)) or int(ndim) not in (1, 2, 3):
        raise ArgumentError(f"argument 'ndim': expected 1, 2 or 3 grid axes, got {ndim!r}")
    return int(ndim)


def _tuple(v: int | Sequence[int], ndim: int, name: str) -> tuple[int, ...]:
    """An int (the same on every grid axis) or ``ndim`` ints (a tuple, list or 1-d integer array); bool, float
    and str entries refused."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return (int(v),) * ndim
    if isinstance(v, np.ndarray) and v.ndim == 1:
        v = v.tolist()
    if not isinstance(v, (tuple, list)):
        raise ArgumentTypeError(f"argument '{name}': expected an integer or {ndim} integers (one per grid axis), "
                                f"got {validation.describe(v)}")
    if len(v) != ndim:
        raise ArgumentError(f"argument '{name}': expected {ndim} values (one per grid axis), "
                            f"got {validation.describe(v)}")
    return tuple(validation.check_int(i, f"{name}[{a}]") for a, i in enumerate(v))


def _check_grid_arg(grid: Any, name: str = "grid") -> tuple[int, ...]:
    """A grid or a tuple of FFT lengths: a tuple (or list) of integers >= 1."""
    if isinstance(grid, np.ndarray) and grid.ndim == 1:
        grid = grid.tolist()
    return validation.check_int_tuple(grid, name, minimum=1)


def _check_label(name: Any) -> str:
    """The ``name`` argument of the grid readers: the label their messages use (any string)."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"argument 'name': expected a str (the argument name used in messages), "
                                f"got {validation.describe(name)}")
    return name


def toeplitz_grid(e: np.ndarray, ndim: int, name: str = "e") -> tuple[int, ...]:
    """The grid (n_1..n_r) of Toeplitz parameters of shape (2n_1-1, ..., 2n_r-1, *ch); ValueError if a
    grid axis has even length."""
    ndim = _check_ndim(ndim)
    name = _check_label(name)
    shape = validation.check_float_array(e, name).shape
    if len(shape) < ndim:
        raise ArgumentError(f"argument '{name}': expected at least {ndim} axes (2n-1 per grid axis), got shape "
                         f"{tuple(shape)}")
    for a, s in enumerate(shape[:ndim]):
        if s % 2 == 0 or s < 1:
            raise ArgumentError(f"argument '{name}': grid axis {a} of Toeplitz parameters must have odd length "
                             f"2n-1, got {s} (shape {tuple(shape)})")
    return tuple((s + 1) // 2 for s in shape[:ndim])


def circulant_grid(w: np.ndarray, ndim: int, name: str = "w") -> tuple[int, ...]:
    """The grid (n_1..n_r) of a circulant kernel of shape (n_1, ..., n_r, *ch)."""
    ndim = _check_ndim(ndim)
    name = _check_label(name)
    shape = validation.check_float_array(w, name).shape
    if len(shape) < ndim:
        raise ArgumentError(f"argument '{name}': expected at least {ndim} axes (one per grid axis), got shape "
                         f"{tuple(shape)}")
    return tuple(int(s) for s in shape[:ndim])


def num_toeplitz_params(grid: Sequence[int]) -> int:
    """prod(2 n_a - 1): parameters of a Toeplitz RPE on ``grid`` (Eq. 2; (2H-1)(2W-1) on an H x W grid)."""
    grid = _check_grid_arg(grid)
    return int(np.prod([2 * int(n) - 1 for n in grid]))


def num_circulant_params(grid: Sequence[int]) -> int:
    """prod(n_a) = N: parameters of a circulant kernel on ``grid`` (Eq. 10: "half size of parameters")."""
    grid = _check_grid_arg(grid)
    return int(np.prod([int(n) for n in grid]))


def _guard(elements: int, max_elements: int | None, what: str) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else int(max_elements)
    if elements > limit:
        raise ArgumentError(f"{what}: the dense N x N path would allocate {elements} elements, above the limit "
                         f"{limit} (config.QUADRATIC_MAX_ELEMENTS or max_elements); use method='rfft' "
                         f"(FFT product, O(N log N)) instead")


def _split_x(x: np.ndarray, grid: tuple[int, ...], nch: int,
             name: str = "x") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(batch shape, channel shape) of x = (*batch, *grid, *ch) with len(ch) = nch; ValueError otherwise."""
    r = len(grid)
    if x.ndim < r + nch:
        raise ArgumentError(f"argument '{name}': expected shape (*batch, {', '.join(map(str, grid))}, <{nch} channel "
                         f"axes>), got {x.shape}")
    g = x.shape[x.ndim - nch - r: x.ndim - nch]
    if tuple(g) != tuple(grid):
        raise ArgumentError(f"argument '{name}': expected grid axes {tuple(grid)} at positions "
                         f"{x.ndim - nch - r}..{x.ndim - nch - 1} of shape {x.shape} (the last {nch} axes are "
                         f"channels, matching the kernel), got {tuple(g)}")
    return x.shape[:x.ndim - nch - r], x.shape[x.ndim - nch:]


# ===================================================================================================
# Dense structured matrices
# ===================================================================================================

def _pair_index(grid: tuple[int, ...], fn) -> tuple[np.ndarray, ...]:
    """Per grid axis a, fn(i_a, j_a, n_a) on broadcastable index arrays of shape (n_1..n_r, n_1..n_r)."""
    r = len(grid)
    out = []
    for a, n in enumerate(grid):
        i = np.arange(n).reshape([n if b == a else 1 for b in range(2 * r)])
        j = np.arange(n).reshape([n if b == r + a else 1 for b in range(2 * r)])
        out.append(fn(i, j, n))
    return tuple(out)


def toeplitz(e: Any, ndim: int = 1, *, max_elements: int | None = None) -> np.ndarray:
    """The Toeplitz (r = 1), BTTB (r = 2) or 3-level Toeplitz (r = 3) RPE matrix of Eq. 2.

    T[i, j] = e[n - 1 + j - i] per grid axis (0-based form of the paper's T(e)_{ij} = e_{N+j-i}).

    Parameters
    ----------
    e : float array (2 n_1 - 1, ..., 2 n_r - 1, *ch): the relative-position parameters, any trailing
        channel axes (e.g. D latent channels, Eq. 5).
    ndim : number of grid axes r (1, 2 or 3).
    max_elements : memory guard for N * N * prod(ch) (default config.QUADRATIC_MAX_ELEMENTS).

    Returns
    -------
    (N, N, *ch) float array, N = n_1 ... n_r, tokens row-major.

    References
    ----------
    LiSA Eq. 2 (Toeplitz RPE), Eq. 5 (sets of Toeplitz matrices R = {T(e_1), ..., T(e_D)}).
    """
    validation.check_max_elements(max_elements)
    e = as_float(e, "e")
    grid = toeplitz_grid(e, ndim)
    n_tok = int(np.prod(grid))
    _guard(n_tok * n_tok * int(np.prod(e.shape[ndim:], dtype=np.int64)), max_elements, "toeplitz")
    m = e[_pair_index(grid, lambda i, j, n: n - 1 + j - i)]
    return m.reshape((n_tok, n_tok) + e.shape[ndim:])


def circulant(w: Any, ndim: int = 1, *, max_elements: int | None = None) -> np.ndarray:
    """The circulant (r = 1), BCCB (r = 2) or 3-level circulant (r = 3) matrix of a circular convolution.

    C[i, j] = w[(i - j) mod n] per grid axis, so C x = w (*) x = F^-1(F(x) F(w)) (LiSA Eq. 10, the
    "circular position embeddings consisting of circulant matrices" of §4.3).  ``scipy.linalg.circulant``
    is the r = 1 case.

    Parameters
    ----------
    w : float array (n_1, ..., n_r, *ch): the circular kernel (LiSA's W^a, W^b reshaped to the grid).
    ndim : number of grid axes r (1, 2 or 3).
    max_elements : memory guard for N * N * prod(ch).

    Returns
    -------
    (N, N, *ch) float array.

    References
    ----------
    LiSA Eq. 10 and §4.3.
    """
    validation.check_max_elements(max_elements)
    w = as_float(w, "w")
    grid = circulant_grid(w, ndim)
    n_tok = int(np.prod(grid))
    _guard(n_tok * n_tok * int(np.prod(w.shape[ndim:], dtype=np.int64)), max_elements, "circulant")
    m = w[_pair_index(grid, lambda i, j, n: (i - j) % n)]
    return m.reshape((n_tok, n_tok) + w.shape[ndim:])


def wraparound_matrix(e: Any, ndim: int = 1, *, max_elements: int | None = None) -> np.ndarray:
    """A = circulant(periodize(e)) - toeplitz(e), computed entry by entry without subtraction.

    A[i, j] = sum over (p_1..p_r) != 0 of h(i - j + p n) with h(s) = e[n - 1 - s] (zero outside
    |s| <= n - 1): exactly the taps that wrap around the grid border.  Per axis only p in {-1, 0, 1} can
    land inside |s| <= n - 1, so the sum has at most 3^r - 1 terms.

    Parameters
    ----------
    e : (2n_1-1, ..., 2n_r-1, *ch) Toeplitz parameters; ndim : r; max_elements : memory guard.

    Returns
    -------
    (N, N, *ch) float array.

    References
    ----------
    LiSA Eq. 10 (the circular approximation of the RPE product of Eq. 9).
    """
    validation.check_max_elements(max_elements)
    e = as_float(e, "e")
    grid = toeplitz_grid(e, ndim)
    n_tok = int(np.prod(grid))
    _guard(n_tok * n_tok * int(np.prod(e.shape[ndim:], dtype=np.int64)), max_elements, "wraparound_matrix")
    r = len(grid)
    diffs = _pair_index(grid, lambda i, j, n: i - j)
    out = np.zeros(tuple(grid) + tuple(grid) + e.shape[ndim:], dtype=e.dtype)
    for shifts in np.ndindex(*(3,) * r):
        p = [s - 1 for s in shifts]
        if all(v == 0 for v in p):
            continue
        idx, ok = [], np.ones((1,) * (2 * r), dtype=bool)
        for a, n in enumerate(grid):
            s = diffs[a] + p[a] * n          # offset of this aliased copy
            ok = ok & (np.abs(s) <= n - 1)
            idx.append(np.clip(n - 1 - s, 0, 2 * n - 2))
        vals = e[tuple(idx)]
        mask = ok.reshape(ok.shape + (1,) * (e.ndim - ndim))
        out = out + np.where(mask, vals, 0.0)
    return out.reshape((n_tok, n_tok) + e.shape[ndim:])


# ===================================================================================================
# Maps between Toeplitz parameters and circulant kernels
# ===================================================================================================

def offset_kernel(e: Any, ndim: int = 1) -> np.ndarray:
    """The convolution kernel h of T(e), stored at index s + n - 1: h(s) = e[n - 1 - s], i.e. ``e`` reversed
    along every grid axis.  Shape unchanged (2n_1-1, ..., *ch).  (LiSA §4.1: T(e) V is a global convolution.)"""
    e = as_float(e, "e")
    toeplitz_grid(e, ndim)
    return e[tuple(slice(None, None, -1) for _ in range(ndim))]


def periodize(e: Any, ndim: int = 1, lengths: int | Sequence[int] | None = None) -> np.ndarray:
    """Fold the Toeplitz kernel onto a cyclic grid of ``lengths``: w[m] = sum_{s = m mod L} h(s).

    With ``lengths`` = the grid (default) this is the circulant counterpart of T(e):
    circulant(periodize(e)) = toeplitz(e) + wraparound_matrix(e).  With L_a >= 2 n_a - 1 every tap lands
    on its own slot (no sums, exact), and the length-L circular convolution of zero-padded x, cropped to
    the grid, equals T(e) x exactly (the ``exact_toeplitz`` mode of LiSA).  In between, the result is exact
    for kernels supported on |s_a| <= L_a - n_a.

    Parameters
    ----------
    e : (2n_1-1, ..., 2n_r-1, *ch) float Toeplitz parameters (Eq. 2 indexing).
    ndim : r.  lengths : int or r positive ints (default: the grid).  Lengths below n_a fold several
        offsets onto one slot too (used to resample a kernel to a smaller grid, Appendix B).

    Returns
    -------
    (L_1, ..., L_r, *ch) float array.

    References
    ----------
    LiSA Eq. 9-10 (RPEs "altered by circular position embeddings").
    """
    h = offset_kernel(e, ndim)
    grid = toeplitz_grid(h, ndim, "e")
    lens = grid if lengths is None else _tuple(lengths, ndim, "lengths")
    for a, length in enumerate(lens):
        if length < 1:
            raise ArgumentError(f"argument 'lengths': axis {a} length must be >= 1, got {length}")
    out = h
    for a, (n, length) in enumerate(zip(grid, lens)):
        moved = np.moveaxis(out, a, 0)
        acc = np.zeros((length,) + moved.shape[1:], dtype=h.dtype)
        np.add.at(acc, np.arange(-(n - 1), n) % length, moved)
        out = np.moveaxis(acc, 0, a)
    return out


def embed_circulant(w: Any, ndim: int = 1) -> np.ndarray:
    """Toeplitz parameters (Eq. 2 indexing) of the circular kernel w read at its centred offsets.

    Tap m of an axis of length n is placed at offset s = m for m < n/2 and s = m - n for m > n/2
    (numpy.fft.fftfreq order); for even n the Nyquist tap m = n/2 is split, w/2 at s = +n/2 and w/2 at
    s = -n/2, so a symmetric kernel stays symmetric.  Hence periodize(embed_circulant(w)) == w exactly
    (halving is exact in binary floating point except for odd multiples of the smallest subnormal), and
    toeplitz(embed_circulant(w)) is the "same kernel without wrap-around": the global convolution that
    LiSA's circular convolution approximates.

    Parameters
    ----------
    w : (n_1, ..., n_r, *ch) float circular kernel; ndim : r.

    Returns
    -------
    (2n_1-1, ..., 2n_r-1, *ch) float array e.

    References
    ----------
    LiSA Eq. 10; Appendix B (kernels as samples of a continuous spectrum).
    """
    w = as_float(w, "w")
    grid = circulant_grid(w, ndim)
    out = w
    for a, n in enumerate(grid):
        moved = np.moveaxis(out, a, 0)
        h = np.zeros((2 * n - 1,) + moved.shape[1:], dtype=w.dtype)
        for m in range(n):
            if 2 * m < n:
                h[m + n - 1] = moved[m]
            elif 2 * m > n:
                h[m - n + n - 1] = moved[m]
            else:  # Nyquist tap of an even axis: split between s = +n/2 and s = -n/2
                half = moved[m] * 0.5
                h[m + n - 1] = half
                h[-m + n - 1] = half
        out = np.moveaxis(h[::-1], 0, a)   # e[n - 1 - s] = h(s)
    return out


def restrict_support(e: Any, ndim: int = 1, radius: int | Sequence[int] = 0) -> np.ndarray:
    """Zero every tap of the Toeplitz kernel with |s_a| > radius_a on some axis (kernel support radius).

    Parameters
    ----------
    e : (2n_1-1, ..., *ch) float; ndim : r; radius : int or r non-negative ints.

    Returns
    -------
    Array of e's shape.  (Used to measure LiSA's wrap-around error as a function of kernel support.)
    """
    e = as_float(e, "e")
    grid = toeplitz_grid(e, ndim)
    rad = _tuple(radius, ndim, "radius")
    if min(rad) < 0:
        raise ArgumentError(f"argument 'radius': expected non-negative radii, got {radius!r}")
    mask = np.ones((1,) * ndim, dtype=bool)
    for a, n in enumerate(grid):
        s = np.abs(np.arange(2 * n - 1) - (n - 1)).reshape([2 * n - 1 if b == a else 1 for b in range(ndim)])
        mask = mask & (s <= rad[a])
    return e * mask.reshape(mask.shape + (1,) * (e.ndim - ndim))


# ===================================================================================================
# Products
# ===================================================================================================

def dense_product(m: Any, x: Any, ndim: int = 1) -> np.ndarray:
    """y = M x over the grid, channel-wise: y[b, i, c] = sum_j M[i, j, c] x[b, j, c].

    Parameters
    ----------
    m : (N, N, *ch_m) float, from :func:`toeplitz` or :func:`circulant`.
    x : (*batch, n_1, ..., n_r, *ch_x) float with len(ch_x) == m.ndim - 2; prod(n) == N.
    ndim : r.

    Returns
    -------
    (*batch, n_1, ..., n_r, *broadcast(ch_m, ch_x)) float array.

    References
    ----------
    LiSA Eq. 4-8 (RPE tensors applied to keys and values).
    """
    m = as_float(m, "m")
    x = as_float(x, "x")
    ndim = _check_ndim(ndim)
    if m.ndim < 2 or m.shape[0] != m.shape[1]:
        raise ArgumentError(f"argument 'm': expected shape (N, N, *ch), got {m.shape}")
    nch = m.ndim - 2
    if x.ndim < ndim + nch:
        raise ArgumentError(f"argument 'x': expected (*batch, <{ndim} grid axes>, <{nch} channel axes>), got {x.shape}")
    grid = x.shape[x.ndim - nch - ndim: x.ndim - nch]
    if int(np.prod(grid)) != m.shape[0]:
        raise ArgumentError(f"argument 'x': grid {tuple(grid)} has {int(np.prod(grid))} tokens, matrix 'm' is "
                         f"{m.shape[0]} x {m.shape[1]}")
    batch, chx = _split_x(x, tuple(grid), nch)
    ch = np.broadcast_shapes(m.shape[2:], chx)
    n_tok, p = m.shape[0], int(np.prod(ch, dtype=np.int64))
    mb = np.moveaxis(np.broadcast_to(m, (n_tok, n_tok) + ch).reshape(n_tok, n_tok, p), 2, 0)   # (P, N, N)
    xb = np.broadcast_to(x.reshape(batch + (n_tok,) + chx), batch + (n_tok,) + ch).reshape(batch + (n_tok, p))
    y = np.matmul(mb, np.moveaxis(xb, -1, -2)[..., None])[..., 0]                             # (*b, P, N)
    return np.moveaxis(y, -1, -2).reshape(batch + tuple(grid) + ch)


def _fft_convolve(x: np.ndarray, k: np.ndarray, ndim: int, lengths: tuple[int, ...], transform: str,
                  taps: dict | None) -> np.ndarray:
    """Circular convolution of length ``lengths`` of zero-padded x (*batch, *grid, *ch) with k (*lengths,
    *ch), cropped back to the grid."""
    nch = k.ndim - ndim
    grid = x.shape[x.ndim - nch - ndim: x.ndim - nch]
    axes = tuple(range(x.ndim - nch - ndim, x.ndim - nch))
    kaxes = tuple(range(ndim))
    if transform == "rfft":
        xf = sfft.rfftn(x, s=lengths, axes=axes)
        kf = sfft.rfftn(k, axes=kaxes)
        y = sfft.irfftn(xf * kf, s=lengths, axes=axes)
    elif transform == "fft":
        xf = sfft.fftn(x, s=lengths, axes=axes)
        kf = sfft.fftn(k, axes=kaxes)
        yc = sfft.ifftn(xf * kf, s=lengths, axes=axes)
        y = yc.real
        if taps is not None:
            taps["imag"] = yc.imag[_crop(y.ndim, axes, grid)]
    else:
        raise ArgumentError(f"argument 'method': expected one of {METHODS}, got {transform!r}")
    if taps is not None:
        taps["spectrum_x"] = xf
        taps["spectrum_kernel"] = kf
    return y[_crop(y.ndim, axes, grid)]


def _crop(nd: int, axes: tuple[int, ...], grid: Sequence[int]) -> tuple[slice, ...]:
    sl = [slice(None)] * nd
    for a, n in zip(axes, grid):
        sl[a] = slice(0, n)
    return tuple(sl)


def circulant_product(w: Any, x: Any, ndim: int = 1, method: str = "rfft", *, taps: dict | None = None,
                      max_elements: int | None = None) -> np.ndarray:
    """y = C(w) x = w (*) x, the circular convolution over the grid (LiSA Eq. 10).

    Parameters
    ----------
    w : (n_1, ..., n_r, *ch_w) float circular kernel.
    x : (*batch, n_1, ..., n_r, *ch_x) float, len(ch_x) == w.ndim - r.
    ndim : r in {1, 2, 3}.
    method : "rfft" (irfftn(rfftn(x) rfftn(w)), the paper's choice), "fft" (complex FFTs; real part
        returned, imaginary part in taps["imag"]) or "dense" (explicit circulant matrix).
    taps : optional dict; receives "spectrum_x", "spectrum_kernel" (FFT methods), "imag" ("fft").
    max_elements : memory guard of the dense method.

    Returns
    -------
    (*batch, n_1, ..., n_r, *broadcast(ch_x, ch_w)) float array.

    References
    ----------
    LiSA Eq. 10 (convolution theorem), Appendix A ("2D RFFT/IRFFT for images and 3D variant for videos").
    """
    validation.check_max_elements(max_elements)
    validation.check_taps(taps)
    validation.check_option(method, "method", METHODS)
    w = as_float(w, "w")
    x = as_float(x, "x")
    grid = circulant_grid(w, ndim)
    _split_x(x, grid, w.ndim - ndim)
    if method == "dense":
        return dense_product(circulant(w, ndim, max_elements=max_elements), x, ndim)
    return _fft_convolve(x, w, ndim, grid, method, taps)


def default_lengths(grid: Sequence[int]) -> tuple[int, ...]:
    """Smallest FFT-friendly (scipy.fft.next_fast_len) length >= 2 n - 1 per axis: exact for any Toeplitz."""
    grid = _check_grid_arg(grid)
    return tuple(sfft.next_fast_len(2 * int(n) - 1, real=True) for n in grid)


def toeplitz_product(e: Any, x: Any, ndim: int = 1, method: str = "rfft",
                     lengths: int | Sequence[int] | None = None, *, taps: dict | None = None,
                     max_elements: int | None = None) -> np.ndarray:
    """y = T(e) x, the linear (non-circular) global convolution over the grid.

    FFT methods zero-pad x on every grid axis to ``lengths`` and convolve circularly with
    :func:`periodize` (e, lengths), then crop: exact for any e when L_a >= 2 n_a - 1 (the default is the
    next fast length >= 2n - 1), and for kernels supported on |s_a| <= L_a - n_a otherwise.

    Parameters
    ----------
    e : (2n_1-1, ..., 2n_r-1, *ch_e) float Toeplitz parameters (Eq. 2).
    x : (*batch, n_1, ..., n_r, *ch_x) float, len(ch_x) == e.ndim - r.
    ndim : r.  method : "rfft", "fft" or "dense".  lengths : FFT lengths per axis (>= n_a).
    taps : optional dict (as :func:`circulant_product`, plus "padded_kernel").
    max_elements : memory guard of the dense method.

    Returns
    -------
    (*batch, n_1, ..., n_r, *broadcast(ch_x, ch_e)) float array.

    References
    ----------
    LiSA Eq. 2-3 (Toeplitz RPE), Eq. 9 (RPE products as global convolutions).
    """
    validation.check_max_elements(max_elements)
    validation.check_taps(taps)
    validation.check_option(method, "method", METHODS)
    e = as_float(e, "e")
    x = as_float(x, "x")
    grid = toeplitz_grid(e, ndim)
    _split_x(x, grid, e.ndim - ndim)
    if method == "dense":
        return dense_product(toeplitz(e, ndim, max_elements=max_elements), x, ndim)
    lens = default_lengths(grid) if lengths is None else _tuple(lengths, ndim, "lengths")
    for a, (n, length) in enumerate(zip(grid, lens)):
        if length < n:
            raise ArgumentError(f"argument 'lengths': axis {a} FFT length {length} is smaller than the grid size {n}")
    k = periodize(e, ndim, lens)
    if taps is not None:
        taps["padded_kernel"] = k
    return _fft_convolve(x, k, ndim, lens, method, taps)


# ===================================================================================================
# Error model of the products
# ===================================================================================================

def fft_convolution_depth(lengths: Sequence[int]) -> int:
    """k of an FFT convolution of lengths L_1..L_r: three transforms (x forward, kernel forward, inverse),
    each of sum_a ceil(log2 L_a) + FFT_REAL_SPLIT_STAGES stages at FFT_STAGE_ROUNDINGS u per stage, plus
    the spectral product and the 1/n scaling:  k = 3 s FFT_STAGE_ROUNDINGS + FFT_PRODUCT_ROUNDINGS +
    FFT_SCALE_ROUNDINGS.  Rigorous for radix-2 (Higham Thm 24.2); heuristic for the mixed-radix, generic
    prime-factor and Bluestein passes of pocketfft / MKL / cuFFT (a direct p-point DFT pass costs about p
    roundings against the 7 ceil(log2 p) charged, which covers every p <= 37)."""
    lengths = _check_grid_arg(lengths, "lengths")
    stages = sum(int(math.ceil(math.log2(int(n)))) if int(n) > 1 else 0 for n in lengths) \
        + config.FFT_REAL_SPLIT_STAGES
    return 3 * stages * config.FFT_STAGE_ROUNDINGS + config.FFT_PRODUCT_ROUNDINGS + config.FFT_SCALE_ROUNDINGS


def _grid_norm(a: np.ndarray, axes: tuple[int, ...], order: int) -> np.ndarray:
    aa = np.abs(a)
    if order == 1:
        return np.sum(aa, axis=axes, keepdims=True)
    m = np.max(aa, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        safe = np.where(m > 0, m, 1.0)
        return np.where(m > 0, m * np.sqrt(np.sum((aa / safe) ** 2, axis=axes, keepdims=True)), 0.0)


def _spectral_stats(a: np.ndarray, axes: tuple[int, ...], lens: tuple[int, ...],
                    margin: float) -> tuple[np.ndarray, ...]:
    """Per slice over the grid ``axes`` (keepdims): (m, n2, spec) with m = max|a| (1 where that is 0 or not
    finite), and for the scaled s = a / m (entries in [-1, 1]; non-finite ones set to 0): n2 = ||s||_2 and
    spec = min(max|F s| + margin ||s||_1, ||s||_1) >= max|F s|, F the float64 DFT of s zero-padded to
    ``lens`` (rfftn: for real s the half spectrum holds every |F s| value).  The computed transform errs by
    at most eps_64 ||s||_1 at every frequency (the running bound of a transform with |twiddle| = 1), so
    margin = 2 k u_64 (k = :func:`fft_convolution_depth`, three transforms' worth) makes ``spec`` an upper
    bound; the clip is the trivial |F s| <= ||s||_1.  Scaling keeps huge and subnormal inputs in range."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = np.max(np.abs(a), axis=axes, keepdims=True)
        m = np.where((m > 0) & np.isfinite(m), m, 1.0)
        s = a / m
        s = np.where(np.isfinite(s), s, 0.0)
        n1 = np.sum(np.abs(s), axis=axes, keepdims=True)
        n2 = np.sqrt(np.sum(s * s, axis=axes, keepdims=True))
        top = np.max(np.abs(sfft.rfftn(s, s=lens, axes=axes)), axis=axes, keepdims=True)
        spec = np.minimum(top + margin * n1, n1)
    return m, n2, spec


def _spectral_ratio(x: np.ndarray, k: np.ndarray, ndim: int, axes: tuple[int, ...], grid: tuple[int, ...],
                    lens: tuple[int, ...], depth: int) -> np.ndarray | float:
    """scale_new / scale_old of :func:`fft_convolution_bound` per slice (broadcast like the old scale), or 1.0
    where the kernel actually transformed cannot be identified (then only the old scale is used).

    scale_new = max(||x||_2 max|K|, max|X| ||k_p||_2), scale_old = ||x||_2 ||k||_1; written as
    max(q spec_k, (spec_x / n2_x) q n2_k) with q = max|k_p| / ||k||_1 <= 1, so that nothing overflows or
    underflows for huge or subnormal data (all other factors are O(1) to O(L))."""
    if len(lens) != ndim or any(length < max(n, 1) for n, length in zip(grid, lens)):
        return 1.0
    kgrid = tuple(k.shape[:ndim])
    if kgrid == tuple(lens):
        kp = k                                           # circular kernel, or already on the FFT lengths
    elif kgrid == tuple(2 * n - 1 for n in grid):
        kp = periodize(k, ndim, lens)                    # Toeplitz parameters: the kernel toeplitz_product uses
    else:
        return 1.0
    kaxes = tuple(range(ndim))
    margin = 2.0 * depth * 2.0 ** -53                   # 2 k u_64, see _spectral_stats
    _, n2x, spec_x = _spectral_stats(x, axes, lens, margin)
    mk, n2k, spec_k = _spectral_stats(kp, kaxes, lens, margin)
    with np.errstate(all="ignore"):
        kl1 = _grid_norm(k, kaxes, 1)
        q = mk / kl1
        return np.maximum(q * spec_k, (spec_x / n2x) * (q * n2k))


def fft_convolution_bound(x: Any, k: Any, ndim: int, lengths: Sequence[int] | None = None) -> Bound:
    """Bound of an FFT circular convolution y = F^-1(F x . F k_p) (x zero-padded to ``lengths``).

    k_p is the kernel actually transformed: ``k`` itself when its grid shape is ``lengths`` (a circular
    kernel), or :func:`periodize` (k, lengths) when ``k`` holds Toeplitz parameters (2n_a - 1 per axis), as in
    :func:`toeplitz_product`.  L = prod(lengths); X = F x, K = F k_p (exact DFTs over the grid axes).

    Derivation (u = unit roundoff, eps_F = normwise relative error of one FFT, s stages each < 7u; first
    order; Higham (2002) Thm 24.2 for the transforms, Hoelder's inequality for the spectral products):
      X^ = X + d1, ||d1||_2 <= eps_F ||X||_2 = eps_F sqrt(L) ||x||_2;
      K^ = K + d2, ||d2||_2 <= eps_F sqrt(L) ||k_p||_2, and also |d2| <= eps_F ||k||_1 element-wise (the
      transform of |k_p| through butterflies with |twiddle| = 1 is ||k_p||_1 <= ||k||_1 at every frequency);
      Z^ = X^ K^ (1 + th), |th| <= sqrt 2 gamma_2;  y^ = F^-1 Z^ with ||F^-1||_2 = 1/sqrt(L), plus its own
      eps_F and the 1/L scaling.
    By Hoelder, ||d1 K||_2 <= max|K| ||d1||_2, ||X d2||_2 <= max|X| ||d2||_2 and ||X K||_2 <= min(max|K|
    ||X||_2, max|X| ||K||_2) (||K||_2 = sqrt(L) ||k_p||_2), so after F^-1 every term is at most
      S_new = max(||x||_2 max|K|, max|X| ||k_p||_2)
    times its eps_F, sqrt 2 gamma_2 or u; the previous argument (||d1 K||_2 <= ||k||_1 ||d1||_2, |d2| above,
    ||X K||_2 <= ||k||_1 ||X||_2) gives the same with S_old = ||x||_2 ||k||_1 >= S_new's first entry.  Hence
    |y^_i - y_i| <= ||y^ - y||_2 <= (3 eps_F + sqrt 2 gamma_2 + 2u) min(S_old, S_new):
    scale = min(S_old, S_new) (norms and maxima over the grid axes, per batch and channel slice, broadcast
    over the grid), k = :func:`fft_convolution_depth`.  max|X| and max|K| are computed with float64 FFTs of
    the slices scaled by their max-norm and raised by that transform's own element-wise error bound
    (:func:`_spectral_stats`), then clipped by max|K| <= ||k_p||_1, max|X| <= ||x||_1; float64 errors of the
    norms themselves (relative O(u_64)) are neglected, as before.  Where S_old is not finite it is returned
    unchanged (NaN/Inf inputs); where the kernel transformed cannot be identified, S_old alone is used.
    Since max|X| >= ||X||_2 / sqrt(L) = ||x||_2 and likewise max|K| >= ||k_p||_2, both S_old and S_new are
    >= ||x||_2 ||k_p||_2 >= (|C(k_p)| |x|)_i (Cauchy-Schwarz), so the scale still covers the dense product's
    own error (k_dense = N) for the circulant actually convolved with (for Toeplitz parameters with
    lengths >= 2n - 1, k_p is e rearranged and |T||x| <= |C(k_p)||x_padded| on the grid).  Heuristic k for
    non-radix-2 lengths (see fft_convolution_depth).  For non-negative x and k (:func:`abs_convolution`)
    max|K| = ||k||_1 and the scale is S_old.

    Parameters
    ----------
    x : (*batch, n_1..n_r, *ch) float input; k : (L_1..L_r, *ch) float circular kernel on the FFT lengths, or
        (2n_1-1, .., *ch) Toeplitz parameters (periodised to ``lengths``, as toeplitz_product does).
    ndim : r.  lengths : FFT lengths (default: x's grid).

    Returns
    -------
    numerics.Bound with scale (*batch, n_1..n_r, *broadcast ch).

    References
    ----------
    Higham (2002) §24.1, Thm 24.2; Hoelder's inequality; LiSA Eq. 10.
    """
    x = as_float(x, "x")
    k = as_float(k, "k")
    ndim = _check_ndim(ndim)
    nch = k.ndim - ndim
    if nch < 0:
        raise ArgumentError(f"argument 'k': expected at least {ndim} axes (the grid axes of the kernel, then its "
                            f"channels), got shape {k.shape}")
    if x.ndim < ndim + nch:
        raise ArgumentError(f"argument 'x': expected shape (*batch, <{ndim} grid axes>, <{nch} channel axes>) "
                            f"(the channel axes of argument 'k' of shape {k.shape}), got {x.shape}")
    try:
        np.broadcast_shapes(x.shape[x.ndim - nch:], k.shape[ndim:])
    except ValueError:
        raise ArgumentError(f"arguments 'x', 'k': the channel axes {x.shape[x.ndim - nch:]} of 'x' (shape "
                            f"{x.shape}) and {k.shape[ndim:]} of 'k' (shape {k.shape}) do not broadcast") from None
    if lengths is not None:
        lengths = _tuple(lengths, ndim, "lengths")
        if min(lengths) < 1:
            raise ArgumentError(f"argument 'lengths': expected FFT lengths >= 1, got {lengths}")
    axes = tuple(range(x.ndim - nch - ndim, x.ndim - nch))
    grid = tuple(x.shape[a] for a in axes)
    lens = grid if lengths is None else tuple(int(v) for v in lengths)
    old = _grid_norm(x, axes, 2) * _grid_norm(k, tuple(range(ndim)), 1)
    out_shape = x.shape[:x.ndim - nch] + np.broadcast_shapes(x.shape[x.ndim - nch:], k.shape[ndim:])
    depth = fft_convolution_depth(lens)
    ratio = _spectral_ratio(x, k, ndim, axes, grid, lens, depth)
    with np.errstate(all="ignore"):
        scale = np.where(np.isfinite(old), old * np.fmin(1.0, ratio), old)
    return Bound(np.broadcast_to(scale, out_shape), depth,
                 f"FFT convolution, lengths {lens}: scale min(||x||_2 ||kernel||_1, max(||x||_2 max|F k|, "
                 f"max|F x| ||k||_2)) (Hoelder), k = {depth} "
                 f"(3 transforms x {depth // (3 * config.FFT_STAGE_ROUNDINGS)} stages x "
                 f"{config.FFT_STAGE_ROUNDINGS}u + product + scaling; Higham Thm 24.2, heuristic beyond radix 2)")


def dense_product_bound(m: Any, x: Any, ndim: int = 1) -> Bound:
    """|fl(M x) - M x| <= gamma_N |M| |x| (Higham 3.12; any summation order).  Scale = dense_product(|M|,
    |x|), k = N.  Shapes as :func:`dense_product`.  References: Higham (2002) eq. 3.12."""
    m = as_float(m, "m")
    x = as_float(x, "x")
    n_tok = m.shape[0]
    return Bound(dense_product(np.abs(m), np.abs(x), ndim), n_tok, f"dense structured product: gamma_N, N = {n_tok}")


def circulant_product_bound(w: Any, x: Any, ndim: int = 1, method: str = "rfft") -> Bound:
    """Error bound of :func:`circulant_product` computed in precision T (see :func:`fft_convolution_bound`
    for the FFT methods, :func:`dense_product_bound` for "dense").  Shapes as circulant_product.
    References: LiSA Eq. 10; Higham (2002) Thm 24.2, eq. 3.12."""
    validation.check_option(method, "method", METHODS)
    wf, xf = as_float(w, "w"), as_float(x, "x")           # checked here, under the caller's names
    _split_x(xf, circulant_grid(wf, ndim), wf.ndim - ndim)
    if method == "dense":
        return dense_product_bound(circulant(w, ndim), x, ndim)
    return fft_convolution_bound(x, w, ndim)


def toeplitz_product_bound(e: Any, x: Any, ndim: int = 1, method: str = "rfft",
                           lengths: int | Sequence[int] | None = None) -> Bound:
    """Error bound of :func:`toeplitz_product` (FFT: :func:`fft_convolution_bound` of x and periodize(e,
    lengths), scale min(||x||_2 ||e||_1, spectral Hoelder scale), with the depth of the padded lengths;
    dense: gamma_N |T||x|).  Shapes as toeplitz_product.  References: LiSA Eq. 2, 9;
    Higham (2002) Thm 24.2, eq. 3.12."""
    validation.check_option(method, "method", METHODS)
    ef, xf = as_float(e, "e"), as_float(x, "x")           # checked here, under the caller's names
    _split_x(xf, toeplitz_grid(ef, ndim), ef.ndim - ndim)
    if method == "dense":
        return dense_product_bound(toeplitz(e, ndim), x, ndim)
    grid = toeplitz_grid(e, ndim)
    lens = default_lengths(grid) if lengths is None else _tuple(lengths, ndim, "lengths")
    return fft_convolution_bound(x, e, ndim, lens)


def abs_convolution(w: Any, x: Any, ndim: int = 1, *, toeplitz_params: bool = False,
                    lengths: Sequence[int] | None = None) -> np.ndarray:
    """An upper bound of |C| |x| (circular) or |T| |x| (Toeplitz) computed in O(N log N).

    The FFT product of the non-negative |w|, |x| is computed in float64 and raised by its own FFT error
    bound (:func:`fft_convolution_bound` at u_64) and clipped at 0, so the result is >= the exact
    non-negative convolution element-wise.  Used as the propagation term of running error bounds
    (lisa.py), where the dense |C| would be quadratic.

    Parameters
    ----------
    w : circular kernel (n.., *ch) or, with ``toeplitz_params``, Toeplitz parameters (2n-1.., *ch).
    x : (*batch, n.., *ch_x) non-negative or signed (absolute values are taken).
    ndim : r.  lengths : FFT lengths of the Toeplitz case.

    Returns
    -------
    (*batch, n.., *ch) float64 array >= 0.
    """
    wf = as_float(w, "w")                                  # refuse int/bool/object/complex/str before the abs
    xf = as_float(x, "x")
    grid = toeplitz_grid(wf, ndim, "w") if toeplitz_params else circulant_grid(wf, ndim, "w")
    _split_x(xf, grid, wf.ndim - ndim)                     # checked here, under the caller's names
    w = np.abs(np.asarray(w, dtype=np.float64))
    x = np.abs(np.asarray(x, dtype=np.float64))
    if toeplitz_params:
        y = toeplitz_product(w, x, ndim, "rfft", lengths)
        b = toeplitz_product_bound(w, x, ndim, "rfft", lengths)
    else:
        y = circulant_product(w, x, ndim, "rfft")
        b = circulant_product_bound(w, x, ndim, "rfft")
    return np.maximum(y, 0.0) + b.array(np.float64, y.shape)
