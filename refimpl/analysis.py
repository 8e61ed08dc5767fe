"""Analyses of attention mechanisms: numerical rank, equivalent attention matrices, concentration and a
precision audit.

Shapes: B batch, h heads, N query tokens, M key tokens, d head dim (queries/keys), e value head dim,
H x W the token grid (N = H W).

Contents:
- :func:`singular_values`, :func:`rank_tolerance`, :func:`numerical_rank` - the SVD rank with its threshold
  stated (``config.RANK_RTOL_FACTOR``);
- :func:`linear_attention_ranks` - rank of phi(Q) phi(K)^T, of the KV buffer and of the output, per head and
  overall (FLatten §4.2, Eq. 9);
- :func:`dwc_matrix`, :func:`equivalent_attention_matrix` - M_DWC as a sparse matrix with PyTorch's
  zero-padding semantics and M_eq = A + M_DWC (FLatten Eq. 11);
- :func:`attention_entropy` - concentration per query (L2ViT §4.2, FLatten §4.1);
- :func:`format_storage`, :func:`precision_audit` - the largest/smallest magnitudes intermediates reach and
  what storing them in float16/bfloat16 does to them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.sparse
import scipy.special

from . import config, numerics
from .layers import conv_padding

__all__ = [
    "singular_values", "rank_tolerance", "numerical_rank", "RankReport", "linear_attention_ranks",
    "dwc_matrix", "equivalent_attention_matrix", "attention_entropy", "FormatVerdict", "AuditEntry",
    "PrecisionAudit", "format_storage", "precision_audit", "lost_normaliser_rows",
]


# ===================================================================================================
# Numerical rank
# ===================================================================================================

def singular_values(a: Any) -> np.ndarray:
    """Singular values, descending, of each matrix in a stack: a (..., m, n) -> (..., min(m, n)).

    LAPACK's gesdd via numpy.linalg.svd (backward stable: the computed values are exact for a + E with
    ||E||_2 <= p(m, n) u ||a||_2, Golub & Van Loan §8.6).  NaN/Inf entries raise ValueError: a rank of a
    non-finite matrix is undefined.
    """
    a = numerics.as_float(a, "a")
    if a.ndim < 2:
        raise ValueError(f"argument 'a': expected a stack of matrices (..., m, n), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("argument 'a': contains NaN or Inf; singular values (and rank) are undefined")
    return np.linalg.svd(a, compute_uv=False)


def rank_tolerance(s: np.ndarray, shape: tuple[int, int], *, dtype: Any = "float64",
                   rtol_factor: float | None = None) -> np.ndarray:
    """The numerical-rank threshold tol = rtol_factor * max(m, n) * eps_T * s_max per matrix.

    eps_T = 2 u_T is the machine epsilon of the precision T the matrix was computed in (float64 by default),
    max(m, n) eps_T s_max is numpy.linalg.matrix_rank's and LAPACK's convention (Golub & Van Loan §5.4.1),
    rtol_factor defaults to ``config.RANK_RTOL_FACTOR``.  s : (..., r) singular values (descending);
    returns (...) thresholds.
    """
    f = config.RANK_RTOL_FACTOR if rtol_factor is None else float(rtol_factor)
    eps_t = 2.0 * numerics.unit_roundoff(dtype)
    smax = s[..., 0] if s.shape[-1] else np.zeros(s.shape[:-1])
    return f * max(shape) * eps_t * smax


def numerical_rank(a: Any, *, dtype: Any = "float64", rtol_factor: float | None = None) -> np.ndarray:
    """Numerical rank of each matrix of a stack: #{i : s_i > tol}, tol from :func:`rank_tolerance`.

    Parameters
    ----------
    a : float array (..., m, n), e.g. (B, h, N, M) per-head attention matrices.
    dtype : the precision T the matrix carries (sets eps_T in the threshold); default float64.
    rtol_factor : multiplier of the threshold, default ``config.RANK_RTOL_FACTOR`` (1, numpy's value).

    Returns
    -------
    int ndarray (...), one rank per matrix.

    References
    ----------
    FLatten §4.2 (Eq. 9, Fig. 5: ranks of attention maps); Golub & Van Loan, *Matrix Computations*, §5.4.1.
    """
    a = numerics.as_float(a, "a")
    s = singular_values(a)
    tol = rank_tolerance(s, a.shape[-2:], dtype=dtype, rtol_factor=rtol_factor)
    return np.sum(s > tol[..., None], axis=-1).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class RankReport:
    """Ranks of linear attention's pieces.  Per-head arrays have shape (B, h); ``*_merged`` (B,) are of the
    head-concatenated matrix (N, h e) (the output as the next layer sees it) or (N, h d)."""

    attn: np.ndarray          # (B, h) rank of the normalised phi(Q) phi(K)^T (N x M)
    kv: np.ndarray            # (B, h) rank of the KV buffer phi(K)^T V (d x e)
    phi_q: np.ndarray         # (B, h) rank of phi(Q) (N x d)
    phi_k: np.ndarray         # (B, h) rank of phi(K) (M x d)
    output: np.ndarray        # (B, h) rank of the per-head output (N x e)
    output_merged: np.ndarray  # (B,) rank of the head-concatenated output (N x h e)
    bound: int                # min(N, M, d): FLatten Eq. 9's bound on rank(phi(Q) phi(K)^T)
    sizes: dict

    def __str__(self) -> str:
        """The ranks as text: the sizes and Eq. 9's bound min(N, M, d), then per head the ranks of phi(Q) phi(K)^T, of
        the KV buffer and of the output, and the head-merged output's."""
        s = self.sizes
        return (f"ranks (N={s['N']}, M={s['M']}, d={s['d']}, e={s['e']}, heads={s['h']}; Eq. 9 bound "
                f"min(N, M, d) = {self.bound}):\n"
                f"  phi(Q)phi(K)^T per head: {self.attn.tolist()}\n"
                f"  KV buffer per head:      {self.kv.tolist()}\n"
                f"  output per head:         {self.output.tolist()}; merged over heads: "
                f"{self.output_merged.tolist()}")


def linear_attention_ranks(q: Any, k: Any, v: Any, *, feature_map: str = "relu",
                           feature_map_options: Mapping[str, Any] | None = None, normalize: bool = True,
                           eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                           clamp_min: float | None = None, dtype: Any = "float64",
                           rtol_factor: float | None = None, max_elements: int | None = None) -> RankReport:
    """Numerical ranks of phi(Q) phi(K)^T (normalised), of the KV buffer, of phi(Q), phi(K) and of the
    output of :func:`refimpl.attention.linear.linear_attention`, per head and over the merged heads.

    FLatten Eq. 9: rank(phi(Q) phi(K)^T) <= min(rank phi(Q), rank phi(K)) <= min(N, d); the normalisation
    diag(1/den) does not change the rank where den != 0.

    Parameters
    ----------
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e) : float arrays; the attention options as ``linear_attention``.
    dtype, rtol_factor : the rank threshold (:func:`numerical_rank`).
    max_elements : guard of the N x M matrix (default ``config.QUADRATIC_MAX_ELEMENTS``).

    Returns
    -------
    :class:`RankReport`.

    References
    ----------
    FLatten §4.2, Eq. 9 and Fig. 5.
    """
    from .attention.linear import linear_attention  # analysis is imported by refimpl users, not vice versa
    taps: dict = {"want_attn": True}
    out = linear_attention(q, k, v, feature_map=feature_map, feature_map_options=feature_map_options,
                           normalize=normalize, eps=eps, eps_policy=eps_policy, clamp_min=clamp_min,
                           taps=taps, max_elements=max_elements)
    b, h, n, e = out.shape
    kw = dict(dtype=dtype, rtol_factor=rtol_factor)
    kv = taps["phi_k"].swapaxes(-1, -2) @ numerics.as_float(v, "v")
    merged = out.transpose(0, 2, 1, 3).reshape(b, n, h * e)
    m, d = taps["phi_k"].shape[-2], taps["phi_q"].shape[-1]
    return RankReport(attn=numerical_rank(taps["attn"], **kw), kv=numerical_rank(kv, **kw),
                      phi_q=numerical_rank(taps["phi_q"], **kw), phi_k=numerical_rank(taps["phi_k"], **kw),
                      output=numerical_rank(out, **kw), output_merged=numerical_rank(merged, **kw),
                      bound=min(n, m, d), sizes={"B": b, "h": h, "N": n, "M": m, "d": d, "e": e})


# ===================================================================================================
# Equivalent attention matrix with a depthwise convolution (FLatten Eq. 11)
# ===================================================================================================

def dwc_matrix(kernel: Any, height: int, width: int, *, padding: Any = "same",
               dilation: int | tuple[int, int] = 1) -> scipy.sparse.csr_matrix:
    """The sparse matrix M of one channel of a stride-1 depthwise convolution on an H x W token grid.

    With tokens in row-major order (n = y W + x), PyTorch's conv (a cross-correlation with zero padding
    (top, bottom, left, right) = :func:`refimpl.layers.conv_padding`) is

        out[y, x] = sum_{a, b} w[a, b] in[y - top + a dh, x - left + b dw]   (terms outside the grid are 0),

    so M[(y, x), (y', x')] = w[a, b] for y' = y - top + a dh, x' = x - left + b dw inside the grid.  Every
    channel of a depthwise conv has this structure with its own kernel; ``conv(V)[:, c] = M_c V[:, c]``.

    Parameters
    ----------
    kernel : float array (kh, kw), odd or even sizes (one channel's filter, weight[c, 0]).
    height, width : the grid H x W.
    padding : int, pair, "same" (PyTorch's: an even kernel pads one more at the bottom/right) or "valid".
    dilation : int or pair.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (OH * OW, H * W), float64 (square when padding is "same").

    References
    ----------
    FLatten Eq. 10-11 (M_DWC); L2ViT Eq. 5 (a conv aggregates rows of the attention matrix).
    """
    kernel = numerics.as_float(kernel, "kernel")
    numerics.check_shapes(kernel=(kernel, "kh kw"))
    height = numerics.check_positive_int(height, "height")
    width = numerics.check_positive_int(width, "width")
    dil = (dilation, dilation) if isinstance(dilation, (int, np.integer)) else tuple(dilation)
    kh, kw = kernel.shape
    top, bottom, left, right = conv_padding(padding, (kh, kw), (1, 1), dil)
    oh = height + top + bottom - dil[0] * (kh - 1)
    ow = width + left + right - dil[1] * (kw - 1)
    if oh < 1 or ow < 1:
        raise ValueError(f"argument 'kernel': a {kh}x{kw} kernel (dilation {dil}) with padding {padding!r} "
                         f"does not fit the {height}x{width} grid")
    rows, cols, vals = [], [], []
    ys, xs = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    for a in range(kh):
        for b in range(kw):
            sy, sx = ys - top + a * dil[0], xs - left + b * dil[1]
            ok = (sy >= 0) & (sy < height) & (sx >= 0) & (sx < width)
            rows.append((ys * ow + xs)[ok])
            cols.append((sy * width + sx)[ok])
            vals.append(np.full(int(ok.sum()), kernel[a, b]))
    coo = scipy.sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                  shape=(oh * ow, height * width))
    return coo.tocsr()  # duplicates cannot occur: each (row, kernel tap) gives one distinct column


def equivalent_attention_matrix(attn: Any, kernel: Any, height: int, width: int, *, padding: Any = "same",
                                dilation: int | tuple[int, int] = 1,
                                max_elements: int | None = None) -> np.ndarray:
    """M_eq = A + M_DWC, the attention matrix equivalent to linear attention plus a DWC on V (one channel).

    Parameters
    ----------
    attn : float array (..., N, N), the (normalised) attention matrices A of one channel's head.
    kernel : float array (kh, kw), the DWC filter of that channel; height * width == N.
    padding, dilation : as :func:`dwc_matrix` (must give a square N x N matrix).
    max_elements : guard on the dense result (default ``config.QUADRATIC_MAX_ELEMENTS``).

    Returns
    -------
    ndarray (..., N, N), dense float64 (A is dense; the sum is formed explicitly).

    References
    ----------
    FLatten Eq. 10-11: O = (phi(Q) phi(K)^T + M_DWC) V = M_eq V.
    """
    attn = numerics.as_float(attn, "attn")
    if attn.ndim < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"argument 'attn': expected square matrices (..., N, N), got shape {attn.shape}")
    n = attn.shape[-1]
    if height * width != n:
        raise ValueError(f"arguments 'height', 'width': grid {height}x{width} has {height * width} tokens, "
                         f"attn has N = {n}")
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if attn.size > limit:
        raise ValueError(f"equivalent_attention_matrix: {attn.size} elements exceed max_elements = {limit}; "
                         f"apply the attention with refimpl.attention.linear.linear_attention "
                         f"(order='linear') and the conv with refimpl.layers.depthwise_conv2d instead")
    m = dwc_matrix(kernel, height, width, padding=padding, dilation=dilation)
    if m.shape != (n, n):
        raise ValueError(f"argument 'padding': {padding!r} gives a {m.shape} conv matrix, not {n}x{n}; use 'same'")
    return attn + m.toarray()


# ===================================================================================================
# Concentration
# ===================================================================================================

def attention_entropy(attn: Any, *, renormalize: bool = True, normalized: bool = False) -> np.ndarray:
    """Shannon entropy of each attention row: H_i = -sum_j p_ij log p_ij (nats, 0 log 0 = 0).

    Low entropy = concentrated attention (softmax's sharp maps); high entropy (up to log M) = dispersed
    (plain linear attention), the focus ability both papers discuss.

    Parameters
    ----------
    attn : float array (..., N, M), non-negative (a signed row has no entropy: ValueError).
    renormalize : divide each row by its sum first (default True; rows of clamped linear attention, or of
        attention with eps, do not sum to 1).  An all-zero row gives NaN (0/0), honestly.
    normalized : divide by log M, giving values in [0, 1] (M = 1 gives 0).

    Returns
    -------
    ndarray (..., N).

    References
    ----------
    L2ViT §4.2 and Fig. 2 (concentration of attention); FLatten §4.1, Fig. 3-4 (focus ability).
    """
    attn = numerics.as_float(attn, "attn")
    if attn.ndim < 2:
        raise ValueError(f"argument 'attn': expected (..., N, M), got shape {attn.shape}")
    if np.any(attn < 0):
        raise ValueError("argument 'attn': has negative entries; entropy needs a non-negative attention matrix "
                         "(use a non-negative feature map)")
    p = attn
    if renormalize:
        with np.errstate(invalid="ignore", divide="ignore"):
            p = attn / np.sum(attn, axis=-1, keepdims=True)
    ent = np.sum(scipy.special.entr(p), axis=-1)
    if normalized:
        m = attn.shape[-1]
        ent = ent / math.log(m) if m > 1 else np.zeros_like(ent)
    return ent


# ===================================================================================================
# Precision audit
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class FormatVerdict:
    """What storing one array in a low-precision format does to it.

    n_overflow : entries with |x| >= 2^emax (2 - u_T) (round to +-inf; ``config.FORMAT_MAX_FINITE`` is the
        largest finite value).
    n_underflow : non-zero finite entries that round to 0 (all information lost).
    n_subnormal : non-zero entries rounding into the subnormal range (fewer significant bits).
    n_zero_rows : rows (along the last axis) that are non-zero in float64 but entirely 0 in T (a row
        normalised afterwards then gives 0/0 = NaN); 0 for arrays without a row meaning.
    max_rel_error : max over non-zero finite entries of |fl_T(x) - x| / |x| (inf on overflow, 1 on
        underflow to zero; <= u_T for normal values).
    """

    fmt: str
    n_overflow: int
    n_underflow: int
    n_subnormal: int
    n_zero_rows: int
    max_rel_error: float

    @property
    def nonfinite(self) -> bool:
        """Whether storing the array in T overflows (an entry rounds to +-inf).  Rows that underflow to 0 (0/0 in a
        later normalisation) are not counted here: :meth:`PrecisionAudit.reasons` reports them."""
        return self.n_overflow > 0


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One intermediate: its name, shape, largest |x|, smallest non-zero |x| and a verdict per format."""

    name: str
    shape: tuple
    max_abs: float
    min_nonzero_abs: float
    verdicts: dict


@dataclasses.dataclass(frozen=True)
class PrecisionAudit:
    """The result of :func:`precision_audit`; ``str()`` prints a table, :meth:`predicts_nonfinite` the
    verdict per format, with reasons."""

    entries: tuple
    formats: tuple

    def entry(self, name: str) -> AuditEntry:
        """The entry of the intermediate ``name``; KeyError (listing the entries) if there is none."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no audit entry {name!r}; entries: {[e.name for e in self.entries]}")

    def reasons(self, fmt: str) -> list[str]:
        """Why a computation storing these intermediates in ``fmt`` would produce Inf/NaN (empty: none)."""
        out = []
        for e in self.entries:
            v = e.verdicts[fmt]
            if v.n_overflow:
                out.append(f"{e.name}: {v.n_overflow} entries overflow (max |x| = {e.max_abs:.3g} > "
                           f"{config.FORMAT_MAX_FINITE[fmt]:.5g})")
            if v.n_zero_rows and e.name in _ROW_NORMALISED:
                out.append(f"{e.name}: {v.n_zero_rows} rows underflow entirely to 0 (then 0/0 in the "
                           f"normalisation)")
            if e.name in ("denominator",) and v.n_underflow:
                out.append(f"{e.name}: {v.n_underflow} normalisers underflow to 0 (division by zero)")
        return out

    def predicts_nonfinite(self, fmt: str) -> bool:
        """Whether storing these intermediates in ``fmt`` is predicted to give Inf/NaN (:meth:`reasons` is not
        empty)."""
        return bool(self.reasons(fmt))

    def __str__(self) -> str:
        """The audit as a table: per intermediate its shape, max |x|, smallest non-zero |x| and per format the
        overflow / underflow / subnormal / zero-row counts and the largest relative error; then the verdict per format
        with its reasons."""
        lines = [f"{'intermediate':<22}{'shape':<20}{'max |x|':>11}{'min |x|>0':>11}  " +
                 "  ".join(f"{f}: ovf/unf/sub/zero-rows, max rel err" for f in self.formats)]
        for e in self.entries:
            cells = []
            for f in self.formats:
                v = e.verdicts[f]
                cells.append(f"{f}: {v.n_overflow}/{v.n_underflow}/{v.n_subnormal}/{v.n_zero_rows}, "
                             f"{v.max_rel_error:.2g}")
            lines.append(f"{e.name:<22}{str(e.shape):<20}{e.max_abs:>11.3g}{e.min_nonzero_abs:>11.3g}  "
                         + "  ".join(cells))
        for f in self.formats:
            r = self.reasons(f)
            lines.append(f"{f}: " + ("predicts Inf/NaN - " + "; ".join(r) if r else "no overflow/0-0 predicted"))
        return "\n".join(lines)


#: Intermediates that are divided by their own row norm afterwards (f_p of FLatten Eq. 6).
_ROW_NORMALISED = ("q_pow", "k_pow")


def format_storage(x: Any, fmt: str, *, rows: bool = False) -> FormatVerdict:
    """Round ``x`` to ``fmt`` (float16, bfloat16 or float32; numerics.round_to, round-to-nearest-even) and
    report overflow, underflow to zero, subnormals, rows lost entirely (``rows=True``: along the last axis)
    and the largest relative storage error.  See :class:`FormatVerdict`.

    References
    ----------
    IEEE 754-2019 §4.3 (rounding), §7.4 (overflow); Higham (2002) §2.1 (gradual underflow).
    """
    x = numerics.as_float(x, "x", allow_empty=True)
    if fmt not in config.FORMAT_MAX_FINITE:
        raise ValueError(f"argument 'fmt': expected one of {tuple(config.FORMAT_MAX_FINITE)}, got {fmt!r}")
    u = numerics.unit_roundoff(fmt)
    threshold = 2.0 ** config.FORMAT_EMAX[fmt] * (2.0 - u)
    ax = np.abs(x)
    finite = np.isfinite(x)
    with np.errstate(over="ignore", invalid="ignore"):
        r = numerics.round_to(x, fmt)
    nonzero = finite & (ax > 0)
    n_over = int(np.sum(finite & (ax >= threshold)))
    n_under = int(np.sum(nonzero & (r == 0)))
    n_sub = int(np.sum(nonzero & (r != 0) & (np.abs(r) < config.FORMAT_MIN_NORMAL[fmt])))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.where(nonzero, np.abs(r - x) / np.where(nonzero, ax, 1.0), 0.0)
    rel = np.where(nonzero & np.isinf(r), np.inf, rel)
    n_zero_rows = 0
    if rows and x.ndim >= 1 and x.size:
        n_zero_rows = int(np.sum(np.any(nonzero, axis=-1) & np.all(r == 0, axis=-1)))
    return FormatVerdict(fmt, n_over, n_under, n_sub, n_zero_rows, float(rel.max(initial=0.0)))


def lost_normaliser_rows(phi_q: Any, phi_k: Any, fmt: Any, *, base_q: Any = None,
                         base_k: Any = None, order: str = "linear") -> np.ndarray:
    """Queries whose normaliser is positive in exact arithmetic but 0 once the features are stored in ``fmt``.

    A feature that underflows in ``fmt`` becomes 0 (exp(x) below half the smallest subnormal, for ELU+1,
    or the token softmax), and so does a product of two tiny features.  For non-negative feature maps the
    normaliser in fmt is 0 exactly when every product it sums rounds to 0: round(round(phi_q_ic) *
    round(sum_j phi_k_jc)) in the linear order, round(round(phi_q_ic) * round(phi_k_jc)) for every j in the
    quadratic order (whose products are smaller, so it loses rows the linear order keeps).  Where that
    happens but the exact normaliser is positive, an implementation in fmt divides 0 by 0 (NaN) unless an
    eps or clamp intervenes.  ``base_q``/``base_k`` (the L1 map's base values b(x), computed - and able to
    underflow - before the division by max(||b||_1, eps)) zero the rows they lose.  A prediction for
    non-negative maps (signed maps can also cancel to 0); the rounding of the sums themselves is not
    modelled (a sum of non-negative terms is 0 only if every term is).

    Parameters
    ----------
    phi_q : float array (B, h, N, d); phi_k : (B, h, M, d) (float64 reference feature maps).
    fmt : the format (float16, bfloat16, float32, float64).  base_q, base_k : optional, shapes as phi_q/phi_k.

    Returns
    -------
    bool ndarray (B, h, N).

    References
    ----------
    L2ViT Eq. 4 / FLatten Eq. 4 (the normaliser); Higham (2002) §2.1 (underflow).
    """
    phi_q = numerics.as_float(phi_q, "phi_q")
    phi_k = numerics.as_float(phi_k, "phi_k")
    numerics.check_shapes(phi_q=(phi_q, "B h N d"), phi_k=(phi_k, "B h M d"))
    with np.errstate(over="ignore", invalid="ignore"):
        rq, rk = numerics.round_to(phi_q, fmt), numerics.round_to(phi_k, fmt)
        for r, base, nm in ((rq, base_q, "base_q"), (rk, base_k, "base_k")):
            if base is not None:
                gone = np.all(numerics.round_to(numerics.as_float(base, nm), fmt) == 0, axis=-1)
                r[gone] = 0.0
        exact = np.einsum("bhnd,bhd->bhn", phi_q, phi_k.sum(axis=-2))
        if order == "linear":
            prods = numerics.round_to(rq * numerics.round_to(rk.sum(axis=-2), fmt)[..., None, :], fmt)
            alive = np.any(prods != 0, axis=-1)
        elif order == "quadratic":
            alive = np.zeros(exact.shape, dtype=bool)
            for j in range(rk.shape[-2]):  # (B,h,N,d) products per key: no (N, M, d) array is formed
                alive |= np.any(numerics.round_to(rq * rk[..., j:j + 1, :], fmt) != 0, axis=-1)
        else:
            raise ValueError(f"argument 'order': expected 'linear' or 'quadratic', got {order!r}")
    return (exact > 0) & ~alive


def _entry(name: str, x: np.ndarray, formats: Sequence[str], rows: bool = False) -> AuditEntry:
    ax = np.abs(x[np.isfinite(x)])
    nz = ax[ax > 0]
    return AuditEntry(name, tuple(x.shape), float(ax.max(initial=0.0)), float(nz.min(initial=np.inf)),
                      {f: format_storage(x, f, rows=rows) for f in formats})


def precision_audit(q: Any, k: Any, v: Any, *, feature_map: str | Callable[[np.ndarray], np.ndarray] = "relu",
                    feature_map_options: Mapping[str, Any] | None = None, focus_p: float | None = None,
                    eps: float = config.LINEAR_DEFAULT_EPS, eps_policy: str = "add",
                    clamp_min: float | None = None,
                    formats: Sequence[str] = config.AUDIT_FORMATS) -> PrecisionAudit:
    """Largest magnitudes reached by linear attention's intermediates and their fate in low precision.

    The float64 reference is evaluated (linear order, as real implementations do) and every intermediate is
    rounded to each format: an intermediate that overflows there becomes Inf and the output NaN (Inf/Inf,
    Inf - Inf); a normaliser that underflows to 0 divides by zero; a row of x^p that underflows entirely
    makes f_p's ||x|| / ||x^p|| a 0/0.  This is a storage audit: it assumes each intermediate is rounded to
    the format once (as mixed-precision autocast stores matmul outputs), not the accumulation inside.

    Intermediates (names): "phi_q", "phi_k", "kv" (phi(K)^T V), "k_sum", "numerator", "denominator_raw"
    (phi(Q) . sum phi(K)), "denominator" (after clamp/eps), "output"; with ``focus_p`` also
    "q_pow"/"k_pow" = ReLU(x)^p as computed without rescaling (FLatten Eq. 6 taken literally, and its
    released code), "q_pow_sq_sum"/"k_pow_sq_sum" = sum_c (ReLU(x)_c^p)^2 (what an unscaled 2-norm of x^p
    accumulates), and "q_pow_maxnorm" = (ReLU(x) / max_c ReLU(x)_c)^p (the reference's stable form: every
    row keeps its maximum 1, so it never underflows to an all-zero row).

    Parameters
    ----------
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e) : float arrays, *after* any pre-scaling the audited implementation
        applies before the feature map.
    feature_map : a name of :func:`refimpl.attention.linear.feature_map`, or a callable x -> phi(x) on
        (B,h,n,d) arrays (e.g. FLatten's focused map with p bound).
    focus_p : the focusing power p (>= 1) whose x^p intermediates to audit, or None.
    eps, eps_policy, clamp_min : the normaliser policy.
    formats : formats to check (default ``config.AUDIT_FORMATS`` = float16, bfloat16).

    Returns
    -------
    :class:`PrecisionAudit`.

    References
    ----------
    FLatten Eq. 4, 6 (x^p, the normaliser); L2ViT Appendix 8 (training fails with C_min = 1e-6: huge
    activations); IEEE 754 binary16/bfloat16 ranges (``config.FORMAT_MAX_FINITE``).
    """
    from .attention.linear import feature_map as named_map, kernelized_attention
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    for f in formats:
        if f not in config.FORMAT_MAX_FINITE:
            raise ValueError(f"argument 'formats': {f!r} is not one of {tuple(config.FORMAT_MAX_FINITE)}")
    if callable(feature_map):
        phi_q, phi_k = numerics.as_float(feature_map(q), "phi_q"), numerics.as_float(feature_map(k), "phi_k")
    else:
        opts = dict(feature_map_options or {})
        phi_q, phi_k = named_map(q, feature_map, **opts), named_map(k, feature_map, **opts)
    taps: dict = {}
    with np.errstate(over="ignore", invalid="ignore"):
        out = kernelized_attention(phi_q, phi_k, v, order="linear", eps=eps, eps_policy=eps_policy,
                                   clamp_min=clamp_min, taps=taps)
    entries = []
    if focus_p is not None:
        p = float(focus_p)
        if not p >= 1.0:
            raise ValueError(f"argument 'focus_p': expected p >= 1, got {focus_p!r}")
        for nm, x in (("q", q), ("k", k)):
            r = np.maximum(x, 0.0)
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                xp = r ** p
                entries.append(_entry(f"{nm}_pow", xp, formats, rows=True))
                entries.append(_entry(f"{nm}_pow_sq_sum", np.sum(xp * xp, axis=-1), formats))
                if nm == "q":
                    mx = np.max(r, axis=-1, keepdims=True)
                    entries.append(_entry("q_pow_maxnorm", np.where(mx > 0, r / np.where(mx > 0, mx, 1.0), 0.0)
                                          ** p, formats, rows=True))
    for name in ("phi_q", "phi_k", "kv", "k_sum", "numerator", "denominator_raw", "denominator"):
        entries.append(_entry(name, taps[name], formats, rows=name in ("phi_q", "phi_k")))
    entries.append(_entry("output", out, formats))
    return PrecisionAudit(tuple(entries), tuple(formats))
