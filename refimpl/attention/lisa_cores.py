"""LiSA's attention cores: the log-linear Toeplitz / circulant FFT form (Eq. 9-10, Fig. 7; its NumPy definitions
of the operations "lisa_fft_core", "lisa_contraction" and "lisa_spectral_product"), structure-aware attention
computed directly (Eq. 4-8), the RPE matrices (Eq. 2), the resampling of the kernels to another grid
(Appendix B), and the error model with the bounds of the cores.

Paper: Kim et al., "Learning Structure-Aware Attention ... Lightweight Structure-aware Attention (LiSA)"
(shared/seeds/004_5514759081b50066.txt), §3-4 (the mechanism and its interpretation choices are stated in
:mod:`refimpl.attention.lisa` and docs/lisa.md).  Per-head tensors q, k, v are (B, h, N, c).

Layer: attention: imports config, numerics, validation, toeplitz, backends (registers the NumPy definitions)
and nothing from :mod:`refimpl.attention.lisa`, which holds the configurations, the modules on tokens, the
block, the parameter counts, the module bounds and stages, imports this module and re-exports its public
names (their documented home).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.fft as sfft

from .. import backends, config, layers, numerics, toeplitz as tz, validation
from ..errors import ArgumentError, ArgumentTypeError
from ..numerics import Bound, as_float, check_positive_int, check_shapes

__all__ = [
    "lisa_core", "sa_eq4", "sa_eq5", "sa_eq6", "sa_eq7", "sa_eq8_terms", "rpe_matrix",
    "resample_circular_kernel", "resample_toeplitz_kernel", "lisa_core_bound", "sa_core_bound",
]

SA_FORMS = ("eq4", "eq5", "eq6", "eq7")
RPE_KINDS = ("toeplitz", "circulant")
TRANSFORMS = ("rfft", "fft")


def _check_grid(grid: Any, name: str = "grid") -> tuple[int, ...]:
    if isinstance(grid, (int, np.integer)):
        grid = (int(grid),)
    try:
        g = tuple(grid)
    except TypeError:
        raise ArgumentTypeError(f"argument '{name}': expected a token grid ((N,), (H, W) or (T, H, W)), "
                                f"got {validation.describe(grid)}") from None
    if len(g) not in (1, 2, 3):
        raise ArgumentError(f"argument '{name}': expected 1, 2 or 3 axes ((N,), (H, W) or (T, H, W)), got {grid!r}")
    return tuple(check_positive_int(n, name) for n in g)


# ===================================================================================================
# Helpers
# ===================================================================================================

def _l2(x: np.ndarray, eps: float) -> np.ndarray:
    """Per-token, per-head L2 normalisation over the c channels (Eq. 4: Q-bar, K-bar)."""
    return layers.l2_normalize(x, eps, "clamp")


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    sz = check_shapes(q=(q, "B h N c"), k=(k, "B h N c"), v=(v, "B h N c"))
    return q, k, v, sz


def _grid_for(n_tok: int, grid: Any) -> tuple[int, ...]:
    g = _check_grid(grid)
    if math.prod(g) != n_tok:
        raise ArgumentError(f"argument 'grid': {g} has {math.prod(g)} tokens, the inputs have N = {n_tok}")
    return g


def _guard(elements: int, max_elements: int | None, what: str) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else int(max_elements)
    if elements > limit:
        raise ArgumentError(f"{what}: the direct (N x N) structure-aware attention would hold {elements} elements, "
                         f"above the limit {limit} (config.QUADRATIC_MAX_ELEMENTS or max_elements); use "
                         f"refimpl.attention.lisa.lisa_attention / lisa_core (FFT, O(N log N)) instead")


def sa_elements(batch: int, heads: int, n_tok: int, c: int, d: int, form: str) -> int:
    """Largest quadratic intermediate of the direct SA forms: the RPE tensor (N^2 D, or N^2 c D for
    Eq. 6-7 Ra~) or the attention A (B h N^2, Eq. 4-5)."""
    n2 = n_tok * n_tok
    if form == "eq4":
        return max(batch * heads * n2, n2 * heads)
    if form == "eq5":
        return max(batch * heads * n2, n2 * d)
    return n2 * c * d


def rpe_matrix(params: Any, grid: Sequence[int], rpe: str, *, max_elements: int | None = None) -> np.ndarray:
    """Dense RPE tensor (N, N, *ch) from flat parameters (P, *ch).

    rpe="toeplitz": P = prod(2n - 1), R = T(e) of Eq. 2 (BTTB on a 2-D grid); rpe="circulant": P = N,
    R[i, j] = w[(i - j) mod n] per axis (the circular embedding of Eq. 10).  References: LiSA Eq. 2, 5, 6, 10.
    """
    validation.check_max_elements(max_elements)
    params = as_float(params, "params")
    g = _check_grid(grid)
    kg = tuple(2 * n - 1 for n in g) if rpe == "toeplitz" else g
    if rpe not in RPE_KINDS:
        raise ArgumentError(f"argument 'rpe': expected one of {RPE_KINDS}, got {rpe!r}")
    if params.shape[0] != int(np.prod(kg)):
        raise ArgumentError(f"argument 'params': expected leading axis {int(np.prod(kg))} ({rpe} parameters of "
                            f"argument 'grid' {g}), got shape {params.shape}")
    e = params.reshape(kg + params.shape[1:])
    fn = tz.toeplitz if rpe == "toeplitz" else tz.circulant
    return fn(e, len(g), max_elements=max_elements)


# ===================================================================================================
# Attention cores (per head: q, k, v of shape (B, h, N, c))
# ===================================================================================================

def _convolve(x: np.ndarray, kernel: np.ndarray, grid: tuple[int, ...], exact_toeplitz: bool,
              fft_lengths, transform: str) -> np.ndarray:
    """x (B, h, N, c, 1) convolved over the grid with kernel (P, c|1, D) -> (B, h, N, c, D)."""
    r = len(grid)
    b, h, n_tok = x.shape[:3]
    xg = x.reshape((b, h) + grid + x.shape[3:])
    kg = tuple(2 * n - 1 for n in grid) if exact_toeplitz else grid
    kern = kernel.reshape(kg + kernel.shape[1:])
    if exact_toeplitz:
        y = tz.toeplitz_product(kern, xg, r, transform, fft_lengths)
    else:
        y = tz.circulant_product(kern, xg, r, transform)
    return y.reshape((b, h, n_tok) + y.shape[2 + r:])


def _fft_lengths(grid: tuple[int, ...], exact_toeplitz: bool, fft_lengths) -> tuple[int, ...]:
    """The FFT lengths of lisa_core: the grid (circular, Eq. 10) or the padded lengths (exact_toeplitz)."""
    if not exact_toeplitz:
        return grid
    lens = tz.default_lengths(grid) if fft_lengths is None else tz._tuple(fft_lengths, len(grid), "fft_lengths")
    for a, (n, length) in enumerate(zip(grid, lens)):
        if length < n:
            raise ArgumentError(f"argument 'fft_lengths': axis {a} FFT length {length} is smaller than the grid size {n}")
    return lens


def _kernel_on_lengths(kernel: np.ndarray, grid: tuple[int, ...], exact_toeplitz: bool,
                       lens: tuple[int, ...]) -> np.ndarray:
    """kernel (P, *ch) as the circular kernel of the FFT grid ``lens`` (*lens, *ch): Wa / Wb reshaped to the
    grid (Eq. 10), or the Toeplitz parameters periodised to the padded lengths (what
    refimpl.toeplitz.toeplitz_product convolves with)."""
    r = len(grid)
    kg = tuple(2 * n - 1 for n in grid) if exact_toeplitz else grid
    kern = kernel.reshape(kg + kernel.shape[1:])
    return tz.periodize(kern, r, lens) if exact_toeplitz else kern


def _fft_product_typical(x: np.ndarray, kernel: np.ndarray, grid: tuple[int, ...], exact_toeplitz: bool,
                         lens: tuple[int, ...]) -> np.ndarray:
    """The random-rounding model's typical error of :func:`_convolve` by FFT (numerics.Bound.typical, in units of
    u), x (B, h, N, c) and kernel (P, c|1, D) -> (B, h, 1, c, D), the same for every token.

    Each of the three transforms (of x, of the kernel, the inverse) has log2 L stages; a stage's roundings have
    an l2 coefficient of at most 3 times the norm of the stage's output (a complex multiply w b errs by at most
    2 |w b| in modulus, the sum by |a + w b|).  A rounding's error reaches the outputs through unit-modulus
    twiddles, multiplied by the other operand's spectrum: in the worst case by its maximum (what
    refimpl.toeplitz.fft_convolution_bound charges, max|K| ||x||_2), typically by its rms, ||k_p||_2 (or
    ||x||_2; Parseval: the rms of the L-point spectrum of k_p is ||k_p||_2).  The L outputs share the error
    evenly, so an element's typical error is sqrt(3 * 3 log2 L / L) ||x||_2 ||k_p||_2 (norms over the grid per
    channel, k_p the kernel actually transformed: :func:`_kernel_on_lengths`)."""
    kp = _kernel_on_lengths(kernel, grid, exact_toeplitz, lens)                   # (*lens, c|1, D)
    n_len = float(np.prod(lens))
    nk = np.sqrt(np.sum(kp * kp, axis=tuple(range(len(grid)))))                     # (c|1, D)
    nx = np.sqrt(np.sum(x * x, axis=2, keepdims=True))[..., None]                  # (B, h, 1, c, 1)
    return math.sqrt(9.0 * max(math.log2(n_len), 1.0) / n_len) * nx * nk


def _convolve_dispatched(x: np.ndarray, kernel: np.ndarray, grid: tuple[int, ...], exact_toeplitz: bool,
                         fft_lengths) -> np.ndarray | None:
    """:func:`_convolve` (transform "rfft") with the spectral product run by backend operation
    "lisa_spectral_product": the same transforms as refimpl.toeplitz._fft_convolve, whose ``xf * kf`` is
    that operation's definition.  Used by lisa_core with taps (the fused operation is not taken then);
    None where ``backends.call`` runs no kernel for the products (the NumPy backend): lisa_core then
    computes :func:`_convolve`."""
    r = len(grid)
    b, h, n_tok, c = x.shape[:4]
    lens = _fft_lengths(grid, exact_toeplitz, fft_lengths)
    kern = _kernel_on_lengths(kernel, grid, exact_toeplitz, lens)                  # (*lens, c|1, D)
    axes = tuple(range(2, 2 + r))
    xf = sfft.rfftn(x.reshape((b, h) + grid + (c,)), s=lens, axes=axes)           # (B, h, *half, c)
    kf = sfft.rfftn(kern, axes=tuple(range(r)))                                    # (*half, c|1, D)
    half = xf.shape[2:2 + r]
    nf = int(np.prod(half))
    prod = backends.call("lisa_spectral_product", xf.reshape(b * h, nf, c), kf.reshape((nf,) + kf.shape[r:]),
                         otherwise=lambda: None)
    if prod is None:
        return None
    y = sfft.irfftn(prod.reshape((b, h) + half + prod.shape[-2:]), s=lens, axes=axes)
    y = y[(slice(None), slice(None)) + tuple(slice(0, n) for n in grid)]
    return y.reshape((b, h, n_tok) + y.shape[2 + r:])


def _check_lisa_weights(sz, weight_a, weight_b, bias_a, bias_b, grid, exact_toeplitz):
    wa, wb = as_float(weight_a, "weight_a"), as_float(weight_b, "weight_b")
    ba, bb = as_float(bias_a, "bias_a"), as_float(bias_b, "bias_b")
    p = math.prod(2 * n - 1 for n in grid) if exact_toeplitz else math.prod(grid)
    sz = check_shapes(dict(sz, P=p), weight_a=(wa, "P c D"), weight_b=(wb, "P D"), bias_a=(ba, "c D"),
                      bias_b=(bb, "c D"))
    return wa, wb, ba, bb, sz


def lisa_core(q: Any, k: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
              grid: Sequence[int], *, exact_toeplitz: bool = False, fft_lengths: Sequence[int] | None = None,
              transform: str = "rfft", eps: float = config.LISA_L2_EPS, taps: dict | None = None) -> np.ndarray:
    """LiSA per head (Eq. 9-10, Fig. 7): Y = sum_{c,d} Qb[n,c] (Ga + Ba)[n,c,d] (Gb + Bb)[n,v,d].

    Ga = Kb (*) Wa (depth-wise: each of the c channels with its own D kernels), Gb = V (*) Wb (the D
    kernels shared by the c channels), both circular convolutions over the token grid computed as
    irfftn(rfftn(.) rfftn(W)) (Eq. 10); with ``exact_toeplitz`` linear convolutions with Toeplitz kernels
    (Eq. 9 without the approximation) by zero-padded FFTs.

    Parameters
    ----------
    q, k, v : (B, h, N, c) float, per-head queries, keys, values (before normalisation).
    weight_a : (P, c, D) float, Wa (P = N) or Ea~ (P = prod(2n - 1), exact_toeplitz), row-major over the
        (kernel) grid.
    weight_b : (P, D) float, Wb or Eb.  bias_a, bias_b : (c, D) float, Ba and Bb.
    grid : token grid with prod(grid) = N (1, 2 or 3 axes).
    exact_toeplitz, fft_lengths, transform : see :class:`LiSAConfig`.
    eps : L2-normalisation eps.
    taps : optional dict receiving "q_bar", "k_bar" (B,h,N,c), "G_a", "G_b" (B,h,N,c,D), "A" (= G_a + B_a),
        "Bv" (= G_b + B_b), "S" (B,h,N,D; = sum_c Qb (G_a + B_a)), "out" (B,h,N,c).

    Backends: on the default ("numpy") backend this is the NumPy path above.  Under any other backend
    (refimpl.backends.use; ``backends.call``) with transform "rfft", everything after the L2 normalisation
    runs as backend
    operation "lisa_fft_core" (definition :func:`_lisa_fft_core_numpy`; Numba kernel
    refimpl.backends._numba.lisa_fft_core, which never forms G_a, G_b whole and shares the heads out over
    refimpl.backends._c.default_threads() threads, bitwise identical for any count), or, when taps are
    requested, the spectral products and the contraction run as "lisa_spectral_product" and
    "lisa_contraction".  The contraction is dispatched on every path.

    Returns
    -------
    (B, h, N, c) float array.

    References
    ----------
    LiSA Eq. 9, Eq. 10, Fig. 7, Appendix A (RFFT/IRFFT; 3-D variant for video).
    """
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    g = _grid_for(sz["N"], grid)
    wa, wb, ba, bb, sz = _check_lisa_weights(sz, weight_a, weight_b, bias_a, bias_b, g, exact_toeplitz)
    if transform not in TRANSFORMS:
        raise ArgumentError(f"argument 'transform': expected one of {TRANSFORMS}, got {transform!r}")
    qb, kb = _l2(q, eps), _l2(k, eps)

    def numpy_convolutions() -> tuple[np.ndarray, np.ndarray]:
        ga = _convolve(kb[..., None], wa, g, exact_toeplitz, fft_lengths, transform)           # (B,h,N,c,D)
        gb = _convolve(v[..., None], wb[:, None, :], g, exact_toeplitz, fft_lengths, transform)  # (B,h,N,c,D)
        return ga, gb

    def contraction(ga: np.ndarray, gb: np.ndarray) -> np.ndarray:
        a = ga + ba
        bv = gb + bb
        s, out = backends.call("lisa_contraction", qb, a, bv)
        if taps is not None:
            taps.update({"q_bar": qb, "k_bar": kb, "G_a": ga, "G_b": gb, "A": a, "Bv": bv, "S": s, "out": out})
        return out

    if transform == "rfft" and taps is None:
        # fused: Ga, Gb never formed whole (backend operation "lisa_fft_core"); the NumPy backend runs the path
        # below, unchanged
        lens = _fft_lengths(g, exact_toeplitz, fft_lengths)
        _, out = backends.call("lisa_fft_core", qb, kb, v, _kernel_on_lengths(wa, g, exact_toeplitz, lens),
                               _kernel_on_lengths(wb, g, exact_toeplitz, lens), ba, bb, g,
                               None if lens == g else lens,
                               otherwise=lambda: (None, contraction(*numpy_convolutions())))
        return out
    if transform == "rfft":                                                          # taps need Ga, Gb
        ga = _convolve_dispatched(kb, wa, g, exact_toeplitz, fft_lengths)
        gb = _convolve_dispatched(v, wb[:, None, :], g, exact_toeplitz, fft_lengths) if ga is not None else None
        if ga is not None and gb is not None:
            return contraction(ga, gb)
    return contraction(*numpy_convolutions())


@backends.register("lisa_spectral_product", "numpy")
def _lisa_spectral_product_numpy(xf: Any, kf: Any) -> np.ndarray:
    """The NumPy definition of operation "lisa_spectral_product" (twin of the Numba kernel):
    P[m, f, c, d] = Xf[m, f, c] * Kf[f, c', d], c' = c (Ga = Kb (*) Wa) or 0 (Gb = V (*) Wb, the kernel
    shared by the c channels): the pointwise product of spectra that refimpl.toeplitz._fft_convolve forms as
    ``xf * kf`` for x = (..., c, 1) inputs (the specification), one complex multiplication per element.

    Parameters
    ----------
    xf : (M, F, c) complex64/complex128, the spectra of M = B h token signals (F frequency bins, grid
        flattened row-major).  kf : (F, c, D) or (F, 1, D), same dtype, the kernels' spectra.

    Returns
    -------
    (M, F, c, D) complex array of xf's dtype.

    References
    ----------
    LiSA Eq. 10 (convolution theorem), Fig. 7, Appendix A.
    """
    xf, kf = np.asarray(xf), np.asarray(kf)
    return xf[..., None] * kf[None]


@backends.register("lisa_contraction", "numpy")
def _lisa_contraction_numpy(qb: np.ndarray, a: np.ndarray, bv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LiSA contraction of Eq. 9 (the definition of backend operation "lisa_contraction"):
    S[b, h, n, d] = sum_c Qb[b, h, n, c] A[b, h, n, c, d], Y[b, h, n, v] = sum_d S[b, h, n, d] Bv[b, h, n, v, d].

    qb : (B, h, N, c) float; a = Ga + Ba and bv = Gb + Bb : (B, h, N, c, D) float (same dtype).
    Returns (S (B, h, N, D), Y (B, h, N, c)).  Accelerated twins: refimpl/backends/_numba.py.

    References
    ----------
    LiSA Eq. 9, Fig. 7.
    """
    s = np.einsum("bhnc,bhncd->bhnd", qb, a)
    out = np.einsum("bhnd,bhnvd->bhnv", s, bv)
    return s, out


@backends.register("lisa_fft_core", "numpy")
def _lisa_fft_core_numpy(qb: np.ndarray, kb: np.ndarray, v: np.ndarray, weight_a: np.ndarray, weight_b: np.ndarray,
                         bias_a: np.ndarray, bias_b: np.ndarray, grid: tuple[int, ...],
                         lengths: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LiSA's FFT core after the L2 normalisation (the definition of backend operation "lisa_fft_core"):
    Ga = Kb (*) Wa, Gb = V (*) Wb (refimpl.toeplitz's FFT convolution, the very calls :func:`lisa_core`
    makes with transform "rfft"), then :func:`_lisa_contraction_numpy` of (Qb, Ga + Ba, Gb + Bb).

    qb, kb, v : (B, h, N, c) float.  weight_a : (*L, c, D) and weight_b : (*L, D) float, the circular kernels
    on the FFT grid L (Wa, Wb reshaped to the token grid; or, with exact_toeplitz, the Toeplitz parameters
    periodised to the padded lengths).  bias_a, bias_b : (c, D).  grid : the token grid.
    lengths : L (None: the grid, circular convolutions).
    Returns (S (B, h, N, D), Y (B, h, N, c)).  Accelerated twin: refimpl/backends/_numba.py (lisa_fft_core).

    References
    ----------
    LiSA Eq. 9, Eq. 10, Fig. 7, Appendix A.
    """
    r = len(grid)
    lens = tuple(grid) if lengths is None else tuple(lengths)
    b, h, n_tok, c = qb.shape
    d = weight_a.shape[-1]
    gshape = (b, h) + tuple(grid) + (c, 1)
    ga = tz._fft_convolve(kb.reshape(gshape), weight_a, r, lens, "rfft", None).reshape(b, h, n_tok, c, d)
    gb = tz._fft_convolve(v.reshape(gshape), weight_b[..., None, :], r, lens, "rfft", None).reshape(b, h, n_tok, c, d)
    return _lisa_contraction_numpy(qb, ga + bias_a, gb + bias_b)


def sa_eq4(q: Any, k: Any, v: Any, rpe: Any, *, eps: float = config.LISA_L2_EPS, taps: dict | None = None,
           max_elements: int | None = None) -> np.ndarray:
    """Structure-aware attention, Eq. 4: Y_ik = sum_j Abar_ij R_ij V_jk, Abar = Qb Kb^T (no softmax).

    Parameters
    ----------
    q, k, v : (B, h, N, c) float.
    rpe : (N, N) float (one RPE for all heads) or (h, N, N) (one per head, Table 3b "w/ h RPEs").
    eps : L2 eps.  max_elements : memory guard (B h N^2).
    taps : "q_bar", "k_bar", "attn" (B,h,N,N; Abar), "attn_rpe" (Abar * R), "out".

    Returns
    -------
    (B, h, N, c) float array.

    References
    ----------
    LiSA Eq. 4, Fig. 6 (structure_aware_attn_Eq4).
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    r = as_float(rpe, "rpe")
    if r.ndim == 2:
        check_shapes(sz, rpe=(r, "N N"))
    else:
        check_shapes(sz, rpe=(r, "h N N"))
    _guard(sa_elements(sz["B"], sz["h"], sz["N"], sz["c"], 1, "eq4"), max_elements, "sa_eq4")
    qb, kb = _l2(q, eps), _l2(k, eps)
    attn = qb @ kb.swapaxes(-1, -2)
    weighted = attn * r
    out = weighted @ v
    if taps is not None:
        taps.update({"q_bar": qb, "k_bar": kb, "attn": attn, "attn_rpe": weighted, "out": out})
    return out


def sa_eq5(q: Any, k: Any, v: Any, ra: Any, rb: Any, bias_b: Any, *, eps: float = config.LISA_L2_EPS,
           taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """Structure-aware attention, Eq. 5 (first line):
    Y_ik = sum_d [sum_n Abar_in Ra_ind] [sum_j Rb_ijd V_jk + Bb_kd].

    Computed through the attention Abar = Qb Kb^T (the first line of Eq. 5); Eq. 6 with a channel-constant
    Ra~ computes the second line (through Kb Ra, Fig. 6) - their agreement is a property test.

    Parameters
    ----------
    q, k, v : (B, h, N, c) float.  ra, rb : (N, N, D) float RPE tensors.  bias_b : (c, D) float.
    eps, max_elements : as :func:`sa_eq4`.
    taps : "q_bar", "k_bar", "attn" (B,h,N,N), "S" (B,h,N,D; sum_n Abar Ra), "G_b" (B,h,N,c,D; Rb V),
        "Bv" (G_b + Bb), "out".

    Returns
    -------
    (B, h, N, c) float array.

    References
    ----------
    LiSA Eq. 5, Fig. 2, Fig. 6 (structure_aware_attn_Eq5).
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    ra, rb, bb = as_float(ra, "ra"), as_float(rb, "rb"), as_float(bias_b, "bias_b")
    sz = check_shapes(sz, ra=(ra, "N N D"), rb=(rb, "N N D"), bias_b=(bb, "c D"))
    _guard(sa_elements(sz["B"], sz["h"], sz["N"], sz["c"], sz["D"], "eq5"), max_elements, "sa_eq5")
    qb, kb = _l2(q, eps), _l2(k, eps)
    attn = qb @ kb.swapaxes(-1, -2)
    s = np.einsum("bhin,ind->bhid", attn, ra)
    gb = np.einsum("ijd,bhjv->bhivd", rb, v)
    bv = gb + bb
    out = np.einsum("bhid,bhivd->bhiv", s, bv)
    if taps is not None:
        taps.update({"q_bar": qb, "k_bar": kb, "attn": attn, "S": s, "G_b": gb, "Bv": bv, "out": out})
    return out


def _sa_channelwise(q, k, v, ra_tilde, rb, bias_a, bias_b, eps, taps, max_elements, what):
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    rat, rb, bb = as_float(ra_tilde, "ra_tilde"), as_float(rb, "rb"), as_float(bias_b, "bias_b")
    sz = check_shapes(sz, ra_tilde=(rat, "N N c D"), rb=(rb, "N N D"), bias_b=(bb, "c D"))
    if bias_a is not None:
        bias_a = as_float(bias_a, "bias_a")
        check_shapes(sz, bias_a=(bias_a, "c D"))
    _guard(sa_elements(sz["B"], sz["h"], sz["N"], sz["c"], sz["D"], "eq7"), max_elements, what)
    qb, kb = _l2(q, eps), _l2(k, eps)
    ga = np.einsum("incd,bhnc->bhicd", rat, kb)
    gb = np.einsum("ijd,bhjv->bhivd", rb, v)
    a = ga if bias_a is None else ga + bias_a
    bv = gb + bb
    s = np.einsum("bhic,bhicd->bhid", qb, a)
    out = np.einsum("bhid,bhivd->bhiv", s, bv)
    if taps is not None:
        taps.update({"q_bar": qb, "k_bar": kb, "G_a": ga, "G_b": gb, "A": a, "Bv": bv, "S": s, "out": out})
    return out


def sa_eq6(q: Any, k: Any, v: Any, ra_tilde: Any, rb: Any, bias_b: Any, *, eps: float = config.LISA_L2_EPS,
           taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """Structure-aware attention with the Hadamard correlation, Eq. 6:
    Y_ik = sum_c Qb_ic sum_d [sum_n Kb_nc Ra~_incd] [sum_j Rb_ijd V_jk + Bb_kd].

    Parameters
    ----------
    q, k, v : (B, h, N, c) float.  ra_tilde : (N, N, c, D) float, the expanded RPE tensor Ra~.
    rb : (N, N, D) float.  bias_b : (c, D) float.  eps, max_elements : as :func:`sa_eq4`.
    taps : "q_bar", "k_bar", "G_a" (B,h,N,c,D; sum_n Kb Ra~), "G_b", "A" (= G_a here), "Bv", "S", "out".

    Returns
    -------
    (B, h, N, c) float array.

    References
    ----------
    LiSA Eq. 6 (§4.2 "Capturing channel-wise structural patterns").
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    return _sa_channelwise(q, k, v, ra_tilde, rb, None, bias_b, eps, taps, max_elements, "sa_eq6")


def sa_eq7(q: Any, k: Any, v: Any, ra_tilde: Any, rb: Any, bias_a: Any, bias_b: Any, *,
           eps: float = config.LISA_L2_EPS, taps: dict | None = None, max_elements: int | None = None) -> np.ndarray:
    """Structure-aware attention with the bias Ba, Eq. 7:
    Y_ik = sum_c Qb_ic sum_d [sum_n Kb_nc Ra~_incd + Ba_cd] [sum_j Rb_ijd V_jk + Bb_kd].

    Each bias enters once per bracket (interpretation 1; Eq. 9, Fig. 6-7).  With circulant Ra~, Rb this
    is exactly what LiSA (Eq. 10) computes; with Toeplitz ones it is Eq. 9.

    Parameters
    ----------
    q, k, v : (B, h, N, c) float.  ra_tilde : (N, N, c, D) float.  rb : (N, N, D) float.
    bias_a, bias_b : (c, D) float.  eps, max_elements : as :func:`sa_eq4`.
    taps : as :func:`sa_eq6` ("A" = G_a + B_a).

    Returns
    -------
    (B, h, N, c) float array.

    References
    ----------
    LiSA Eq. 7, Eq. 9.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    if bias_a is None:
        raise ArgumentTypeError("argument 'bias_a': expected a (c, D) float array (sa_eq6 is the form without Ba), "
                                "got None")
    return _sa_channelwise(q, k, v, ra_tilde, rb, bias_a, bias_b, eps, taps, max_elements, "sa_eq7")


def sa_eq8_terms(q: Any, k: Any, v: Any, ra_tilde: Any, rb: Any, bias_a: Any, bias_b: Any, *,
                 eps: float = config.LISA_L2_EPS, max_elements: int | None = None) -> dict[str, np.ndarray]:
    """The four terms of Eq. 8, each summed over c, d (biases once, interpretation 1):

    "key_value"  sum Qb_ic (Kb Ra~)_icd (Rb V)_ikd     structure-aware attention
    "bias_value" sum Qb_ic Ba_cd (Rb V)_ikd            dynamic global convolution of V (Lambda-like)
    "key_bias"   sum Qb_ic (Kb Ra~)_icd Bb_kd          structural feature projected by Bb
    "bias_bias"  sum Qb_ic Ba_cd Bb_kd                 a linear projection of the query

    Parameters: as :func:`sa_eq7`.  Returns a dict of four (B, h, N, c) arrays whose sum is Eq. 7.
    References: LiSA Eq. 8 and the paragraph after it.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    taps: dict = {}
    sa_eq7(q, k, v, ra_tilde, rb, np.zeros_like(as_float(bias_a, "bias_a")), bias_b, eps=eps, taps=taps,
           max_elements=max_elements)
    qb, ga, gb = taps["q_bar"], taps["G_a"], taps["G_b"]
    ba, bb = as_float(bias_a, "bias_a"), as_float(bias_b, "bias_b")
    return {
        "key_value": np.einsum("bhic,bhicd,bhivd->bhiv", qb, ga, gb, optimize=True),
        "bias_value": np.einsum("bhic,cd,bhivd->bhiv", qb, ba, gb, optimize=True),
        "key_bias": np.einsum("bhic,bhicd,vd->bhiv", qb, ga, bb, optimize=True),
        "bias_bias": np.einsum("bhic,cd,vd->bhiv", qb, ba, bb, optimize=True),
    }


# ===================================================================================================
# Resolution change of the kernels (Appendix B, Table 9)
# ===================================================================================================

def resample_circular_kernel(w: Any, old_grid: Sequence[int], new_grid: Sequence[int]) -> np.ndarray:
    """Resample a circular kernel to another token grid by sampling its continuous spectrum.

    Appendix B: the circular embeddings are "samplings of continuous spectrums", so changing the resolution
    is "changing the sampling interval of spectrums" ([39], GFNet).  The exact version of that statement:
    read w at its centred offsets (:func:`refimpl.toeplitz.embed_circulant`), take the discrete-time
    Fourier transform H(f) = sum_s h(s) exp(-2 pi i f s) - the continuous spectrum - and sample it at the
    new grid's frequencies k'/n'.  The kernel with that DFT is :func:`refimpl.toeplitz.periodize` of the
    centred kernel to length n': zero-padding when n' >= n (every tap keeps its offset, new long-range
    offsets get 0), aliasing when n' < n.  So F_{n'}(w')[k'] = H(k'/n') exactly, the old DFT values are
    kept at common frequencies, and resampling up then back down returns w exactly.
    (GFNet interpolates the stored spectrum bilinearly/bicubically instead: an approximation of H;
    we implement the exact sampling.)

    Parameters
    ----------
    w : (N_old, *ch) float, row-major over ``old_grid`` (Wa (N, c, D) or Wb (N, D)).
    old_grid, new_grid : token grids with the same number of axes.

    Returns
    -------
    (N_new, *ch) float array.

    References
    ----------
    LiSA Appendix B ("Fine-tuning on higher resolutions"), Table 9.
    """
    w = as_float(w, "w")
    og, ng = _check_grid(old_grid, "old_grid"), _check_grid(new_grid, "new_grid")
    if len(og) != len(ng):
        raise ArgumentError(f"arguments 'old_grid', 'new_grid': same number of axes expected, got {og} and {ng}")
    if w.shape[0] != int(np.prod(og)):
        raise ArgumentError(f"argument 'w': expected leading axis N = {int(np.prod(og))} for grid {og}, got {w.shape}")
    e = tz.embed_circulant(w.reshape(og + w.shape[1:]), len(og))
    out = tz.periodize(e, len(og), ng)
    return out.reshape((int(np.prod(ng)),) + w.shape[1:])


def resample_toeplitz_kernel(e: Any, old_grid: Sequence[int], new_grid: Sequence[int]) -> np.ndarray:
    """Toeplitz parameters ((2n-1).., *ch) flattened, moved to another grid keeping every offset's value:
    offsets that exist on both grids keep their tap, new offsets get 0, offsets beyond the new grid's
    reach (|s| > n' - 1) are dropped (a Toeplitz matrix cannot hold them).  The exact_toeplitz counterpart
    of :func:`resample_circular_kernel`.  References: LiSA Eq. 2, Appendix B."""
    e = as_float(e, "e")
    og, ng = _check_grid(old_grid, "old_grid"), _check_grid(new_grid, "new_grid")
    if len(og) != len(ng):
        raise ArgumentError(f"arguments 'old_grid', 'new_grid': same number of axes expected, got {og} and {ng}")
    okg = tuple(2 * n - 1 for n in og)
    if e.shape[0] != int(np.prod(okg)):
        raise ArgumentError(f"argument 'e': expected leading axis {int(np.prod(okg))} for grid {og}, got {e.shape}")
    eg = e.reshape(okg + e.shape[1:])
    out = np.zeros(tuple(2 * n - 1 for n in ng) + e.shape[1:], dtype=e.dtype)
    src, dst = [], []
    for n, m in zip(og, ng):
        r = min(n, m) - 1                       # offsets |s| <= r exist on both grids
        src.append(slice(n - 1 - r, n + r))
        dst.append(slice(m - 1 - r, m + r))
    out[tuple(dst)] = eg[tuple(src)]
    return out.reshape((int(np.prod(out.shape[:len(ng)])),) + e.shape[1:])


# ===================================================================================================
# Error bounds (first-order running error analysis; docs/design.md "The verdict")
# ===================================================================================================
#
# Every tracked quantity is a pair (value, E) with |fl_T(value) - value| <= u_T E to first order, E >= 0.
# Rules (Higham ch. 3):  a contraction of m factors summed over index sets of sizes n_1..n_q, in any
# order or blocking, has error <= gamma_{max(prod n, sum n) + m - 2} (sum of |factors|) plus, for each
# factor i, the sum with factor i replaced by E_i; a sum a + b adds u(|a| + |b|); a linear map adds
# |W| E_x; an FFT convolution adds k_fft times its norm-wise scale (refimpl.toeplitz.fft_convolution_bound:
# min(||x||_2 ||w||_1, max(||x||_2 max|F w|, max|F x| ||w||_2))) and
# propagates |W| (*) E_x (refimpl.toeplitz.abs_convolution); L2 normalisation is analysed in _tr_l2.
# The final Bound has scale E / K and depth K (so gamma_K(u) E / K >= u E), K = the summed depths along
# the longest path, and E includes the float64 reference's own error (factor 1 + u_64 / u_T).


def _einsum_depth(spec: str, shapes: Sequence[tuple[int, ...]]) -> int:
    ins, out = spec.split("->")
    sizes: dict[str, int] = {}
    for term, shp in zip(ins.split(","), shapes):
        for ch, n in zip(term, shp):
            sizes[ch] = max(sizes.get(ch, 1), n)
    contracted = [sizes[ch] for ch in sizes if ch not in out]
    prod = int(np.prod(contracted)) if contracted else 1
    return max(prod, sum(contracted)) + len(shapes) - 2


def _tr_einsum(spec: str, *ops: tuple[np.ndarray, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, int]:
    vals = [o[0] for o in ops]
    absv = [np.abs(v) for v in vals]
    val = np.einsum(spec, *vals, optimize=True)
    depth = _einsum_depth(spec, [v.shape for v in vals])
    err = depth * np.einsum(spec, *absv, optimize=True)
    for i, (_, e) in enumerate(ops):
        if e is not None:
            args = list(absv)
            args[i] = e
            err = err + np.einsum(spec, *args, optimize=True)
    return val, err, depth


def _tr_add(a, ea, b, eb):
    ea = 0.0 if ea is None else ea
    eb = 0.0 if eb is None else eb
    return a + b, ea + eb + np.abs(a) + np.abs(b)


def _tr_l2(x, ex, eps):
    """x / max(||x||, eps) over the last axis.  Perturbation: d(x/||x||) = (dx - xb (xb . dx)) / ||x||, so
    |d xb| <= (E + |xb| (|xb| . E)) / rho, rho = max(||x||, eps) (the clamped branch gives E / eps, which
    this also bounds).  Local rounding: the norm (c squares and c - 1 additions, halved by the sqrt, plus
    the sqrt, a scaling and the quotient) - charged (c + 4) u |xb|."""
    c = x.shape[-1]
    xb = _l2(x, eps)
    rho = np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)
    err = (c + 4) * np.abs(xb)
    if ex is not None:
        err = err + (ex + np.abs(xb) * np.sum(np.abs(xb) * ex, axis=-1, keepdims=True)) / rho
    return xb, err, c + 4


def _tr_conv(x, ex, kernel, grid, *, exact_toeplitz, fft_lengths, dense_rpe=None):
    """Ga-style product of x (B,h,N,c,1) with kernel (P, c|1, D), by FFT (LiSA) or a dense RPE (SA)."""
    b, h, n_tok = x.shape[:3]
    if dense_rpe is not None:     # (N, N, c|1, D): y[b,h,i,c,d] = sum_n R[i,n,c,d] x[b,h,n,c]
        rr = dense_rpe
        y = np.einsum("incd,bhnc->bhicd", rr, x[..., 0], optimize=True)
        err = n_tok * np.einsum("incd,bhnc->bhicd", np.abs(rr), np.abs(x[..., 0]), optimize=True)
        if ex is not None:
            err = err + np.einsum("incd,bhnc->bhicd", np.abs(rr), ex[..., 0], optimize=True)
        return y, err, n_tok
    r = len(grid)
    kg = tuple(2 * n - 1 for n in grid) if exact_toeplitz else grid
    kern = kernel.reshape(kg + kernel.shape[1:])
    xg = x.reshape((b, h) + grid + x.shape[3:])
    if exact_toeplitz:
        lens = tz.default_lengths(grid) if fft_lengths is None else tuple(fft_lengths)
        y = tz.toeplitz_product(kern, xg, r, "rfft", lens)
        bnd = tz.toeplitz_product_bound(kern, xg, r, "rfft", lens)
    else:
        y = tz.circulant_product(kern, xg, r, "rfft")
        bnd = tz.circulant_product_bound(kern, xg, r, "rfft")
    err = bnd.k * np.asarray(bnd.scale)
    if ex is not None:
        exg = np.broadcast_to(ex, x.shape).reshape(xg.shape)
        err = err + tz.abs_convolution(kern, exg, r, toeplitz_params=exact_toeplitz,
                                       lengths=None if not exact_toeplitz else lens)
    shp = (b, h, n_tok) + y.shape[2 + r:]
    return y.reshape(shp), np.broadcast_to(err, y.shape).reshape(shp), bnd.k


def _finish(val, err, depth, dtype, what) -> Bound:
    ref = 1.0 + (numerics.unit_roundoff(np.float64) / numerics.unit_roundoff(dtype) if dtype is not None else 1.0)
    k = max(int(depth), 1)
    return Bound(err * ref / k, k,
                 f"{what}: first-order running error bound, summed depth K = {k}; scale = E / K with "
                 f"|err| <= u E (E includes the float64 reference's own error, factor {ref:.3g}); heuristic "
                 f"only through the FFT depth (refimpl.toeplitz.fft_convolution_depth) where FFTs are used")


def _tr_core(q, eq, k, ek, v, ev, grid, *, kind, eps, exact_toeplitz=False, fft_lengths=None, weights):
    """Tracked per-head core.  kind: "lisa" (FFT) or "eq4".."eq7" (dense RPEs in ``weights``)."""
    qb, eqb, dq = _tr_l2(q, eq, eps)
    kb, ekb, _ = _tr_l2(k, ek, eps)
    depth = dq
    if kind in ("eq4", "eq5"):
        attn, eattn, d1 = _tr_einsum("bhnc,bhmc->bhnm", (qb, eqb), (kb, ekb))
        if kind == "eq4":
            r = weights["rpe"]
            r = r if r.ndim == 3 else r[None]
            p, ep, d2 = _tr_einsum("bhnm,hnm->bhnm", (attn, eattn), (r, None))
            out, eout, d3 = _tr_einsum("bhnm,bhmv->bhnv", (p, ep), (v, ev))
            return out, eout, depth + d1 + d2 + d3
        s, es, d2 = _tr_einsum("bhin,ind->bhid", (attn, eattn), (weights["ra"], None))
        gb, egb, d3 = _tr_einsum("ijd,bhjv->bhivd", (weights["rb"], None), (v, ev))
        bv, ebv = _tr_add(gb, egb, weights["bias_b"], None)
        out, eout, d4 = _tr_einsum("bhid,bhivd->bhiv", (s, es), (bv, ebv))
        return out, eout, depth + d1 + max(d2, d3 + 1) + d4
    if kind == "lisa":
        ga, ega, d1 = _tr_conv(kb[..., None], ekb[..., None], weights["weight_a"], grid,
                               exact_toeplitz=exact_toeplitz, fft_lengths=fft_lengths)
        gb, egb, _ = _tr_conv(v[..., None], None if ev is None else ev[..., None], weights["weight_b"][:, None, :],
                              grid, exact_toeplitz=exact_toeplitz, fft_lengths=fft_lengths)
    else:
        ga, ega, d1 = _tr_conv(kb[..., None], ekb[..., None], None, grid, exact_toeplitz=False, fft_lengths=None,
                               dense_rpe=weights["ra_tilde"])
        gb, egb, _ = _tr_einsum("ijd,bhjv->bhivd", (weights["rb"], None), (v, ev))
    ba = weights.get("bias_a")
    a, ea = (ga, ega) if ba is None else _tr_add(ga, ega, ba, None)
    bv, ebv = _tr_add(gb, egb, weights["bias_b"], None)
    out, eout, d2 = _tr_einsum("bhic,bhicd,bhivd->bhiv", (qb, eqb), (a, ea), (bv, ebv))
    return out, eout, depth + d1 + 1 + d2


def lisa_core_bound(q: Any, k: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                    grid: Sequence[int], *, exact_toeplitz: bool = False, fft_lengths: Sequence[int] | None = None,
                    eps: float = config.LISA_L2_EPS, dtype: Any = None) -> Bound:
    """Error bound of :func:`lisa_core` computed in precision T (either transform).

    Stages (first order, u = u_T): L2 normalisation (:func:`_tr_l2`); Ga, Gb by FFT convolution
    (k_fft ||Kb_c||_2 ||Wa_cd||_1, refimpl.toeplitz.fft_convolution_bound; propagation |Wa| (*) E_Kb);
    the bias sums (u(|G| + |B|)); the triple contraction over c and D (gamma_{max(cD, c+D)+1}).

    Parameters: as :func:`lisa_core`; dtype : the tested precision T (None: assume the reference's error
    equals the tested one's).  Returns numerics.Bound with scale (B, h, N, c).
    References: LiSA Eq. 9-10; Higham (2002) ch. 3, Thm 24.2.
    """
    validation.check_eps(eps)
    q, k, v, sz = _check_qkv(q, k, v)
    g = _grid_for(sz["N"], grid)
    wa, wb, ba, bb, _ = _check_lisa_weights(sz, weight_a, weight_b, bias_a, bias_b, g, exact_toeplitz)
    out, err, depth = _tr_core(q, None, k, None, v, None, g, kind="lisa", eps=eps, exact_toeplitz=exact_toeplitz,
                               fft_lengths=fft_lengths,
                               weights={"weight_a": wa, "weight_b": wb, "bias_a": ba, "bias_b": bb})
    return _finish(out, err, depth, dtype, "lisa_core")


def sa_core_bound(q: Any, k: Any, v: Any, form: str, *, rpe: Any = None, ra: Any = None, ra_tilde: Any = None,
                  rb: Any = None, bias_a: Any = None, bias_b: Any = None, eps: float = config.LISA_L2_EPS,
                  dtype: Any = None) -> Bound:
    """Error bound of the direct SA cores :func:`sa_eq4` .. :func:`sa_eq7` (form "eq4".."eq7") in precision T.

    Dense products: gamma_N |R| |x| plus |R| E_x; the rest as :func:`lisa_core_bound`.  Arguments as the
    corresponding core.  Returns numerics.Bound with scale (B, h, N, c).  References: LiSA Eq. 4-7.
    """
    validation.check_eps(eps)
    q, k, v, sz = _check_qkv(q, k, v)
    if form not in SA_FORMS:
        raise ArgumentError(f"argument 'form': expected one of {SA_FORMS}, got {form!r}")
    w: dict[str, Any] = {}
    for name, val in (("rpe", rpe), ("ra", ra), ("ra_tilde", ra_tilde), ("rb", rb), ("bias_a", bias_a),
                      ("bias_b", bias_b)):
        if val is not None:
            w[name] = as_float(val, name)
    specs = {"rpe": "h N N" if np.ndim(w.get("rpe")) == 3 else "N N", "ra": "N N D", "ra_tilde": "N N c D",
             "rb": "N N D", "bias_a": "c D", "bias_b": "c D"}
    check_shapes(sz, **{name: (val, specs[name]) for name, val in w.items()})
    if form == "eq6":
        w.pop("bias_a", None)
    out, err, depth = _tr_core(q, None, k, None, v, None, None, kind=form, eps=eps, weights=w)
    return _finish(out, err, depth, dtype, f"sa_{form}")
