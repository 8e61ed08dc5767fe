"""LiSA with local kernels: the "Local - k x k" rows of LiSA Table 3c ("Impact of global interactions"), the
NumPy reference.

Paper: Kim et al., "Learning Structure-Aware Attention" (shared/seeds/004_5514759081b50066.txt), §5.2 "Effect of
global interactions" and Table 3c: LiSANet-I-T with 3 x 3, 5 x 5, 7 x 7 local kernels (1.22 / 1.45 / 1.80G,
5.75 / 5.80 / 5.88M) against the global LiSA (1.21G, 6.36M).

Reading (the paper gives no formula for the local rows; docs/models_l2vit_ravlt_lisanet.md, "LiSA Table 3
variants", has the evidence).  LiSA is Eq. 9,

    Y_ik = sum_c Qb_ic sum_d (Ga_icd + Ba_cd)(Gb_ikd + Bb_kd),   Ga = Kb * Ea~,  Gb = V * Eb,

where Ga and Gb are the products with the Toeplitz RPEs of Eq. 2 (Ga_icd = sum_n Ra~_incd Kb_nc, the RPE
entry of query i and key n being e[n - i], one entry per relative offset), i.e. global convolutions
whose kernels cover every offset; the global LiSA evaluates them as circular convolutions by FFTs (Eq. 10).
"Local - k x k" keeps Eq. 9 and restricts the kernels to the k x k window of offsets |n_a - i_a| <= (k - 1) / 2
per grid axis, computed directly over the neighbourhood (no FFT):

    Ga_icd = sum_{s in window} Wa[s]_cd Kb_{i+s, c},   Gb_ikd = sum_{s in window} Wb[s]_d V_{i+s, k},

with zero contributions where i + s leaves the grid (the Toeplitz RPE of Eq. 2 with e zero outside the window:
:func:`local_to_toeplitz`; a zero-padded "same" convolution).  Wa (k^r, c, D) depth-wise per channel, Wb (k^r, D)
shared by the c channels, Ba, Bb (c, D), all shared by the heads (LiSA's layout, refimpl.attention.lisa).
Evidence: (1) this layout with P = k^2 taps instead of N gives exactly the printed parameters, 5,752,552 /
5,804,776 / 5,883,112 = 5.75 / 5.80 / 5.88M; (2) the printed FLOPs grow with k by 0.0145G per tap, which is
2 N C D = 1,204,224 MACs per tap per block (Ga and Gb, direct) over 12 blocks (14,450,688), while an FFT
evaluation would not depend on k; (3) the paper's text, "the larger the kernel, the larger the number of
parameters, FLOPs" and "our global version ... smaller FLOPs due to FFT".  Where the window covers every
offset of the grid (k_a >= 2 n_a - 1) the operator is LiSA's exact Toeplitz form (Eq. 9 without Eq. 10's
circular approximation, refimpl.attention.lisa.lisa_core with exact_toeplitz=True); taps beyond 2 n_a - 1 never
meet a token.

Not decided by the counts: the border.  Wrap-around (circular) windows would have the same parameters and FLOPs;
we take zero padding because it is Eq. 2's RPE (the circular form enters only with Eq. 10, as the FFT
approximation of the global operator) and the usual "same" convolution.

Layer: attention (imports backends, config, numerics, validation and lisa_cores' helpers; nothing imports it but the
LiSANet operators, refimpl.models.lisanet_operators).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np

from .. import backends, config, validation
from ..errors import ArgumentError
from ..numerics import Bound, as_float, check_shapes
from .lisa_cores import _check_grid, _finish, _l2, _tr_add, _tr_einsum, _tr_l2
from .lisa_grid import GridHeads

__all__ = ["LocalLiSAConfig", "local_param_shapes", "local_convolve", "local_to_toeplitz", "lisa_local_core",
           "lisa_local_core_bound"]


def _kernel_tuple(kernel: Any, r: int) -> tuple[int, ...]:
    """k per grid axis: one odd int for every axis, or a tuple of r odd ints."""
    if isinstance(kernel, (tuple, list)):
        if len(kernel) != r:
            raise ArgumentError(f"argument 'kernel': expected one odd size per grid axis ({r}), got {kernel!r}")
        return tuple(validation.check_kernel(k, "kernel") for k in kernel)
    return (validation.check_kernel(kernel, "kernel"),) * r


@dataclasses.dataclass(frozen=True)
class LocalLiSAConfig(GridHeads):
    """LiSA with local k x k kernels (Table 3c), the operator of a LiSANet block.

    dim : C.  num_heads : h (c = C / h).  grid : token grid (N,), (H, W) or (T, H, W).  latent : D.
    kernel : k, odd, the window size on every grid axis.  qkv_bias, l2_eps : as refimpl.attention.lisa.LiSAConfig.
    """

    dim: int
    num_heads: int
    grid: tuple[int, ...]
    kernel: int
    latent: int = config.LISA_LATENT_DEFAULT
    qkv_bias: bool = True
    l2_eps: float = config.LISA_L2_EPS

    def __post_init__(self):
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, a grid of
        other than 1 to 3 positive axes, a kernel k that is not an odd integer >= 1, a latent D < 1 and an l2_eps that
        is not finite and >= 0.  Stores the grid as a tuple of ints."""
        validation.check_heads(self.dim, self.num_heads)
        object.__setattr__(self, "grid", _check_grid(self.grid))
        object.__setattr__(self, "kernel", validation.check_kernel(self.kernel, "kernel"))
        validation.check_int(self.latent, "latent", minimum=1)
        validation.check_eps(self.l2_eps, "l2_eps")

    @property
    def kernel_grid(self) -> tuple[int, ...]:
        """The local kernel's extent (k, ..., k), one k per grid axis (``kernel_tokens``: its k^r taps)."""
        return (self.kernel,) * len(self.grid)


def local_param_shapes(cfg: LocalLiSAConfig) -> dict[str, tuple[int, ...]]:
    """qkv.weight (3C, C)[, qkv.bias (3C,)], weight_a (k^r, c, D), weight_b (k^r, D), bias_a, bias_b (c, D),
    proj.weight (C, C), proj.bias (C,): LiSA's layout (refimpl.attention.lisa.lisa_param_shapes) with k^r
    kernel taps instead of N.  References: LiSA Eq. 9, Table 3c."""
    validation.check_config(cfg, LocalLiSAConfig)
    c, d, p, dim = cfg.head_dim, cfg.latent, cfg.kernel_tokens, cfg.dim
    s: dict[str, tuple[int, ...]] = {"qkv.weight": (3 * dim, dim)}
    if cfg.qkv_bias:
        s["qkv.bias"] = (3 * dim,)
    s.update({"proj.weight": (dim, dim), "proj.bias": (dim,), "weight_a": (p, c, d), "weight_b": (p, d),
              "bias_a": (c, d), "bias_b": (c, d)})
    return s


def local_convolve(x: Any, weight: Any, grid: Sequence[int], kernel: Any) -> np.ndarray:
    """The local Toeplitz product over the token grid, computed tap by tap:
    y[..., i, c, d] = sum_s weight[s + rad, c|0, d] x[..., i + s, c], s over the window |s_a| <= rad_a =
    (k_a - 1) / 2, terms with i + s outside the grid absent (zero padding).

    x : (..., N, c) float, tokens row-major over ``grid``.  weight : (k^r, c, D) (depth-wise, Ga) or (k^r, 1, D)
    (one kernel for every channel, Gb), taps row-major over the window.  kernel : k (odd) or one per axis.
    Returns (..., N, c, D).  The arguments are checked here; the product is backend operation
    "lisa_local_convolve" (refimpl.backends.call), whose definition is :func:`_local_convolve_numpy`.
    References: LiSA Eq. 2, 9, Table 3c.
    """
    x, w = as_float(x, "x"), as_float(weight, "weight")
    g = _check_grid(grid)
    ks = _kernel_tuple(kernel, len(g))
    n_tok = int(np.prod(g))
    if x.ndim < 2 or x.shape[-2] != n_tok:
        raise ArgumentError(f"argument 'x': expected (..., N = {n_tok}, c) tokens of grid {g}, got shape {x.shape}")
    c = x.shape[-1]
    if w.ndim != 3 or w.shape[0] != int(np.prod(ks)) or w.shape[1] not in (1, c):
        raise ArgumentError(f"argument 'weight': expected ({int(np.prod(ks))}, {c} or 1, D) for a {ks} window, "
                            f"got shape {w.shape}")
    return backends.call("lisa_local_convolve", x, w, g, ks)


@backends.register("lisa_local_convolve", "numpy")
def _local_convolve_numpy(x: np.ndarray, w: np.ndarray, g: tuple[int, ...], ks: tuple[int, ...]) -> np.ndarray:
    """The definition of backend operation "lisa_local_convolve" (the specification of its Numba twin,
    refimpl.backends._numba_lisa_local): :func:`local_convolve` on its checked arguments, x (..., N, c),
    w (prod(ks), c | 1, D), grid g and window ks as tuples.  Each tap t, in row-major window order, adds
    xpad[i + off_t] * w[t] to every output (y starts at zeros; xpad is x zero-padded by rad_a per axis).
    References: LiSA Eq. 2, 9, Table 3c."""
    c = x.shape[-1]
    n_tok = int(np.prod(g))
    lead = x.shape[:-2]
    rad = tuple(k // 2 for k in ks)
    xg = x.reshape(lead + g + (c,))
    pad = [(0, 0)] * len(lead) + [(a, a) for a in rad] + [(0, 0)]
    xp = np.pad(xg, pad)
    y = np.zeros(lead + g + (c, w.shape[2]), dtype=np.result_type(x, w))
    axes = len(lead)
    for t, off in enumerate(itertools.product(*[range(k) for k in ks])):
        # padded index of token i + s is i + s + rad = i + off, with off = s + rad the tap's place in the window
        idx = (slice(None),) * axes + tuple(slice(o, o + n) for o, n in zip(off, g))
        y += xp[idx][..., None] * w[t]
    return y.reshape(lead + (n_tok, c, w.shape[2]))


def local_to_toeplitz(weight: Any, grid: Sequence[int], kernel: Any) -> np.ndarray:
    """Local taps (k^r, *ch) as the Toeplitz parameters of Eq. 2 ((2n-1)^r, *ch, row-major): e[n - 1 + s] =
    weight[s + rad] for |s_a| <= min(rad_a, n_a - 1), zero elsewhere (taps beyond the grid's offsets are
    dropped: they never meet a token).  refimpl.attention.lisa.rpe_matrix(., grid, "toeplitz") of the result
    is the dense RPE that :func:`local_convolve` applies.  References: LiSA Eq. 2, Table 3c."""
    w = as_float(weight, "weight")
    g = _check_grid(grid)
    ks = _kernel_tuple(kernel, len(g))
    if w.ndim < 1 or w.shape[0] != int(np.prod(ks)):
        raise ArgumentError(f"argument 'weight': expected leading axis {int(np.prod(ks))} (a {ks} window), "
                            f"got shape {w.shape}")
    wk = w.reshape(ks + w.shape[1:])
    out = np.zeros(tuple(2 * n - 1 for n in g) + w.shape[1:], dtype=w.dtype)
    src, dst = [], []
    for k, n in zip(ks, g):
        rad, m = k // 2, min(k // 2, n - 1)
        src.append(slice(rad - m, rad + m + 1))
        dst.append(slice(n - 1 - m, n + m))
    out[tuple(dst)] = wk[tuple(src)]
    return out.reshape((-1,) + w.shape[1:])


def _check_local(q, k, v, weight_a, weight_b, bias_a, bias_b, grid, kernel):
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    sz = check_shapes(q=(q, "B h N c"), k=(k, "B h N c"), v=(v, "B h N c"))
    g = _check_grid(grid)
    if int(np.prod(g)) != sz["N"]:
        raise ArgumentError(f"argument 'grid': {g} has {int(np.prod(g))} tokens, the inputs have N = {sz['N']}")
    ks = _kernel_tuple(kernel, len(g))
    wa, wb = as_float(weight_a, "weight_a"), as_float(weight_b, "weight_b")
    ba, bb = as_float(bias_a, "bias_a"), as_float(bias_b, "bias_b")
    check_shapes(dict(sz, P=int(np.prod(ks))), weight_a=(wa, "P c D"), weight_b=(wb, "P D"), bias_a=(ba, "c D"),
                 bias_b=(bb, "c D"))
    return q, k, v, wa, wb, ba, bb, g, ks


def lisa_local_core(q: Any, k: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                    grid: Sequence[int], kernel: Any, *, eps: float = config.LISA_L2_EPS,
                    taps: dict | None = None) -> np.ndarray:
    """LiSA Eq. 9 per head with local kernels (Table 3c): Y = sum_{c,d} Qb[n,c] (Ga + Ba)[n,c,d] (Gb + Bb)[n,v,d],
    Ga = the local product of Kb with Wa (depth-wise), Gb = that of V with Wb (shared by the channels), both
    by :func:`local_convolve` (direct, zero padding; module docstring for the reading).

    q, k, v : (B, h, N, c) float (before normalisation).  weight_a : (k^r, c, D).  weight_b : (k^r, D).
    bias_a, bias_b : (c, D).  grid : token grid, prod(grid) = N.  kernel : k (odd) or one per axis.
    eps : L2-normalisation eps.  taps : optional dict receiving "q_bar", "k_bar", "G_a", "G_b", "A", "Bv",
    "S", "out" as refimpl.attention.lisa.lisa_core does.
    Returns (B, h, N, c).  References: LiSA Eq. 2, 9, Table 3c, §5.2.
    """
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, wa, wb, ba, bb, g, ks = _check_local(q, k, v, weight_a, weight_b, bias_a, bias_b, grid, kernel)
    qb, kb = _l2(q, eps), _l2(k, eps)
    ga = local_convolve(kb, wa, g, ks)                     # (B, h, N, c, D)
    gb = local_convolve(v, wb[:, None, :], g, ks)          # (B, h, N, c, D)
    a, bv = ga + ba, gb + bb
    s = np.einsum("bhnc,bhncd->bhnd", qb, a)
    out = np.einsum("bhnd,bhnvd->bhnv", s, bv)
    if taps is not None:
        taps.update({"q_bar": qb, "k_bar": kb, "G_a": ga, "G_b": gb, "A": a, "Bv": bv, "S": s, "out": out})
    return out


# ===================================================================================================
# Error model (lisa_cores' running first-order convention: |error| <= u E, summed depth K)
# ===================================================================================================

def _tr_local_conv(x, ex, weight, grid, ks):
    """:func:`local_convolve` with its error: each output is a sum of T = k^r products (the zero-padded taps
    included), so the rounding is within gamma_T (|W| * |x|) in any summation order (Higham (2002) eq. 3.5),
    and an input error E propagates as |W| * E."""
    y = local_convolve(x, weight, grid, ks)
    taps = int(np.prod(ks))
    aw = np.abs(weight)
    err = taps * local_convolve(np.abs(x), aw, grid, ks)
    if ex is not None:
        err = err + local_convolve(np.broadcast_to(ex, x.shape), aw, grid, ks)
    return y, err, taps


def _tr_local_core(q, eq, k, ek, v, ev, grid, kernel, *, eps, weights):
    """Tracked :func:`lisa_local_core` (values, E, depth) with input errors eq, ek, ev (None: exact)."""
    g = _check_grid(grid)
    ks = _kernel_tuple(kernel, len(g))
    qb, eqb, dq = _tr_l2(q, eq, eps)
    kb, ekb, _ = _tr_l2(k, ek, eps)
    ga, ega, d1 = _tr_local_conv(kb, ekb, weights["weight_a"], g, ks)
    gb, egb, _ = _tr_local_conv(v, ev, weights["weight_b"][:, None, :], g, ks)
    a, ea = _tr_add(ga, ega, weights["bias_a"], None)
    bv, ebv = _tr_add(gb, egb, weights["bias_b"], None)
    out, eout, d2 = _tr_einsum("bhic,bhicd,bhivd->bhiv", (qb, eqb), (a, ea), (bv, ebv))
    return out, eout, dq + d1 + 1 + d2


def lisa_local_core_bound(q: Any, k: Any, v: Any, weight_a: Any, weight_b: Any, bias_a: Any, bias_b: Any,
                          grid: Sequence[int], kernel: Any, *, eps: float = config.LISA_L2_EPS,
                          dtype: Any = None) -> Bound:
    """Error bound of :func:`lisa_local_core` computed in precision T (dtype; None: the reference's own error
    assumed equal to the tested one's).  Stages (first order, u = u_T): the L2 normalisations
    (lisa_cores._tr_l2), Ga and Gb (gamma_{k^r} |W| * |x| + |W| * E_x, :func:`_tr_local_conv`), the bias sums
    (u (|G| + |B|)), the contraction over c and D (gamma_{max(cD, c+D)+1}).  Returns numerics.Bound with scale
    (B, h, N, c).  References: LiSA Eq. 9, Table 3c; Higham (2002) ch. 3."""
    validation.check_eps(eps)
    q, k, v, wa, wb, ba, bb, g, ks = _check_local(q, k, v, weight_a, weight_b, bias_a, bias_b, grid, kernel)
    with np.errstate(invalid="ignore", over="ignore"):
        out, err, depth = _tr_local_core(q, None, k, None, v, None, g, ks, eps=eps,
                                         weights={"weight_a": wa, "weight_b": wb, "bias_a": ba, "bias_b": bb})
    return _finish(out, err, depth, dtype, "lisa_local_core")

