"""Castling-ViT, the angular attentions: the quadratic angular attention (exact or truncated kernel) and its
linear-time tensor-power form, the linear-angular attention of Eq. 9 (its NumPy definition of the operation
"linear_angular_attention"), the depthwise-conv branch on V, the auxiliary masked softmax branch of Eq. 10, and
their error bounds.

Reference: H. You et al., "Castling-ViT: Compressing Self-Attention via Switching Towards Linear-Angular
Attention at Vision Transformer Inference", CVPR 2023 (../shared/seeds/003_b81e2e603475c765.txt), §3.2-3.3
Eq. 8-10.  Shapes: B batch, h heads, N query tokens, M key/value tokens, d head dim; per-head tensors
(B, h, N, d).

Layer: attention: imports config, numerics, validation, layers, backends and :mod:`.angular_series` (the
kernel, the feature maps, the error model); :mod:`.angular` (the Castling module) imports it, never the
reverse.  The public names are re-exported by :mod:`refimpl.attention.angular`, their documented home.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import backends, config, layers, numerics, validation
from ..errors import ArgumentError
from ..numerics import Bound
from .angular_series import (_ELEM, _guard, angular_series_features, angular_similarity, angular_similarity_bound,
                             angular_similarity_series, unit_rows)

__all__ = [
    "angular_attention", "angular_attention_features", "linear_angular_attention",
    "linear_angular_attention_bound", "token_conv", "grid_conv", "masked_softmax_branch",
    "angular_attention_bound",
]

# ===================================================================================================
# 4. Attention
# ===================================================================================================

def _nan_quiet(fn):
    """Run ``fn`` under np.errstate(invalid/divide="ignore"): the official preset's eps-free norms produce
    NaN/inf by design (0/0 for zero rows), and NaN propagating through later products is the honest result,
    not a condition to warn about.  Nothing is replaced or masked."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)
    return wrapper


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h M d"), v=(v, "B h M e"))
    return q, k, v, sz


def _tap(taps: dict | None, name: str, value: np.ndarray) -> None:
    if taps is not None:
        taps[name] = value


def angular_attention(q: Any, k: Any, v: Any, *, order: int | None = None, normalize: bool = False,
                      method: str = "atan2", eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                      max_elements: int | None = None, taps: dict | None = None) -> np.ndarray:
    """Full (quadratic) angular attention: O = A V or O = (A V) / (A 1), A_ij = Sim(q_i, k_j).

    With ``order=None`` A is the exact angular kernel of Eq. 5 (:func:`angular_similarity`); with an integer
    order K it is the truncated series Sim_K of Eq. 8.  ``normalize=True`` divides by the similarity sum
    sum_j A_ij (Eq. 3's normaliser with Sim in place of phi phi^T); Sim >= 0 and Sim_K > 0 make it positive
    unless every key is exactly opposite to the query (exact kernel only).  Eq. 9 itself has no normaliser.

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float.
    order : None or int >= 0.  normalize : bool.  method, eps, policy : as :func:`spectral_angle`.
    max_elements : limit on B h N M (times d for "atan2"); above it use :func:`angular_attention_features`
        or :func:`linear_angular_attention`.
    taps : optional dict, receives "q_hat", "k_hat", "similarity" (B,h,N,M), "denominator" (B,h,N).

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 5, 8, 9 (H = Sim(Q, K) V).
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    pairs = sz["B"] * sz["h"] * sz["N"] * sz["M"]
    _guard(pairs * (sz["d"] if (order is None and method == "atan2") else 1), max_elements,
           "angular_attention", "angular_attention_features (order K, linear in N) or linear_angular_attention")
    if order is None:
        a = angular_similarity(q, k, method=method, eps=eps, policy=policy, max_elements=max_elements)
    else:
        a = angular_similarity_series(q, k, order, eps=eps, policy=policy, max_elements=max_elements)
    if taps is not None:
        taps["q_hat"] = unit_rows(q, eps=eps, policy=policy)
        taps["k_hat"] = unit_rows(k, eps=eps, policy=policy)
        taps["similarity"] = a
    out = a @ v
    if normalize:
        den = np.sum(a, axis=-1)
        _tap(taps, "denominator", den)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = out / den[..., None]
    return out


def angular_attention_features(q: Any, k: Any, v: Any, *, order: int, normalize: bool = False,
                               eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                               taps: dict | None = None) -> np.ndarray:
    """The order-K truncated angular attention in linear time through tensor-power features.

    O_i = Phi_K(q_i) (sum_j Phi_K(k_j)^T v_j) [/ Phi_K(q_i) . sum_j Phi_K(k_j)], Phi_K from
    :func:`angular_series_features`; equal to ``angular_attention(q, k, v, order=K)`` by associativity
    (O(N D e) with D = 1 + d + ... + d^(2K+1) instead of O(N M d)).

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float; order : K >= 0; normalize : bool.
    taps : optional dict, receives "phi_q" (B,h,N,D), "phi_k" (B,h,M,D), "kv" (B,h,D,e), "denominator".

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 8-9; Katharopoulos et al. (2020) Eq. 5 (associativity).
    """
    validation.check_eps(eps)
    validation.check_taps(taps)
    q, k, v, _ = _check_qkv(q, k, v)
    phi_q = angular_series_features(q, order, eps=eps, policy=policy)
    phi_k = angular_series_features(k, order, eps=eps, policy=policy)
    kv = np.swapaxes(phi_k, -1, -2) @ v
    if taps is not None:
        taps.update(phi_q=phi_q, phi_k=phi_k, kv=kv)
    out = phi_q @ kv
    if normalize:
        den = np.einsum("bhnf,bhf->bhn", phi_q, np.sum(phi_k, axis=-2))
        _tap(taps, "denominator", den)
        out = out / den[..., None]
    return out


_CONSTANTS = ("sum", "own")
_NORMALISERS = ("none", "similarity_sum", "output_l2")


def _constant_term(v: np.ndarray, constant: str, n: int) -> np.ndarray:
    if constant == "own":
        if v.shape[-2] != n:
            raise ArgumentError(f"constant='own' needs as many keys as queries (the token's own value), got "
                             f"N = {n} queries and M = {v.shape[-2]} values")
        return 0.5 * v
    return np.broadcast_to(0.5 * np.sum(v, axis=-2, keepdims=True), (*v.shape[:-2], n, v.shape[-1]))


@_nan_quiet
def linear_angular_attention(q: Any, k: Any, v: Any, *, constant: str = "sum", normaliser: str = "none",
                             eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                             arithmetic: str = "scaled", taps: dict | None = None,
                             normalizer: str | None = None) -> np.ndarray:
    """The linear-angular attention of Castling-ViT Eq. 9 (without its DWConv and sparse branches).

    H = C + (1/pi) Q^ (K^^T V), the order-0 truncation of Sim(Q, K) V (Eq. 8), computed in O(N d e).

    constant="sum" (paper default): C_i = 1/2 sum_j v_j, the constant 1/2 of Eq. 8 applied to every key,
        so that H = Sim_0(Q, K) V exactly (the left side of Eq. 9).
    constant="own" (official): C_i = 1/2 v_i, the token's own value ("1/2 . V" read literally).
    normaliser="none" (paper default, Eq. 9 as printed): H as above.
    normaliser="similarity_sum": H_i / sum_j Sim_0(q_i, k_j), with sum_j Sim_0 = M/2 + (1/pi) q^_i . sum_j k^_j
        >= M (1/2 - 1/pi) > 0 (|q^_i . k^_j| <= 1 with either eps policy), so it never vanishes.
    normaliser="output_l2" (official): H_i / ||H_i||, no eps (a zero H_i gives NaN, as released).
    normalizer: the deprecated spelling of normaliser (a DeprecationWarning).

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float.  eps, policy, arithmetic : as
    :func:`unit_rows` (arithmetic also applies to the output_l2 norm).
    taps : optional dict: "q_hat", "k_hat", "kv" (B,h,d,e), "linear" ((1/pi) Q^ kv), "constant",
        "denominator" (similarity_sum, (B,h,N)), "output_norm" (output_l2, (B,h,N,1)).

    Returns
    -------
    (B, h, N, e) working dtype.

    Backends: with policy="clamp", arithmetic="scaled", normaliser "none" or "similarity_sum", a real
    eps >= 0, no taps, one float32/float64 working dtype (and M = N for "own") and a selected backend other
    than NumPy (:func:`refimpl.backends.use`), the computation runs as operation "linear_angular_attention"
    (the fused C kernel; its NumPy definition, :func:`_linear_angular_attention_op`, calls
    :func:`_linear_angular_attention_numpy`, the body of this function; it also answers these calls on the
    NumPy backend).  Everything else runs that body directly.

    References
    ----------
    Castling-ViT Eq. 8-9; Katharopoulos et al. (2020) for the association order.
    """
    normaliser = validation.renamed_keyword(normaliser, normalizer, new="normaliser", old="normalizer",
                                            default="none", where="linear_angular_attention", stacklevel=4)
    validation.check_eps(eps)
    validation.check_taps(taps)
    if constant not in _CONSTANTS:
        raise ArgumentError(f"argument 'constant': expected one of {_CONSTANTS}, got {constant!r}")
    if normaliser not in _NORMALISERS:
        raise ArgumentError(f"argument 'normaliser': expected one of {_NORMALISERS}, got {normaliser!r}")
    if taps is None and policy == "clamp" and arithmetic == "scaled" and normaliser != "output_l2":
        # Operation "linear_angular_attention" (the paper's configuration); the C kernel's predicate picks the
        # calls it takes (dtypes, eps, shapes), the others and the NumPy backend run its definition, which is
        # the body below with these options.
        q, k, v, _ = _check_qkv(q, k, v)
        return backends.call("linear_angular_attention", q, k, v, constant, normaliser, eps)
    return _linear_angular_attention_numpy(q, k, v, constant=constant, normaliser=normaliser, eps=eps,
                                           policy=policy, arithmetic=arithmetic, taps=taps)


@_nan_quiet
def _linear_angular_attention_numpy(q: Any, k: Any, v: Any, *, constant: str = "sum", normaliser: str = "none",
                                    eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp",
                                    arithmetic: str = "scaled", taps: dict | None = None) -> np.ndarray:
    """The NumPy body of :func:`linear_angular_attention` (same arguments and result; Castling-ViT Eq. 9):
    what that function computes on the NumPy backend, and what the NumPy twin of operation
    "linear_angular_attention" (:func:`_linear_angular_attention_op`) calls, so that it never dispatches again."""
    if constant not in _CONSTANTS:
        raise ArgumentError(f"argument 'constant': expected one of {_CONSTANTS}, got {constant!r}")
    if normaliser not in _NORMALISERS:
        raise ArgumentError(f"argument 'normaliser': expected one of {_NORMALISERS}, got {normaliser!r}")
    q, k, v, sz = _check_qkv(q, k, v)
    qh = unit_rows(q, eps=eps, policy=policy, arithmetic=arithmetic)
    kh = unit_rows(k, eps=eps, policy=policy, arithmetic=arithmetic)
    kv = np.swapaxes(kh, -1, -2) @ v
    lin = (1.0 / math.pi) * (qh @ kv)
    const = _constant_term(v, constant, sz["N"])
    if taps is not None:
        taps.update(q_hat=qh, k_hat=kh, kv=kv, linear=lin, constant=const)
    out = const + lin
    if normaliser == "similarity_sum":
        den = sz["M"] / 2.0 + (1.0 / math.pi) * np.einsum("bhnd,bhd->bhn", qh, np.sum(kh, axis=-2))
        _tap(taps, "denominator", den)
        out = out / den[..., None]
    elif normaliser == "output_l2":
        norm = np.linalg.norm(out, axis=-1, keepdims=True)
        _tap(taps, "output_norm", norm)
        out = unit_rows(out, eps=0.0, policy="none", arithmetic=arithmetic)
    return out


@backends.register("linear_angular_attention", "numpy")
def _linear_angular_attention_op(q: Any, k: Any, v: Any, constant: str = "sum", normaliser: str = "none",
                                 eps: float = config.CASTLING_QK_NORM_EPS, *, out: np.ndarray | None = None,
                                 workspace: Any = None, threads: Any = None) -> np.ndarray:
    """The NumPy definition of operation "linear_angular_attention" of refimpl.backends (the twin of the C
    kernel): H = C + (1/pi) Q^ (K^^T V) (Castling-ViT Eq. 9, the order-0 truncation of Eq. 8), Q^, K^ the rows
    of q, k divided by max(||.||_2, eps); C_i = 1/2 sum_j V_j (constant "sum", the paper) or 1/2 V_i ("own",
    the released code); normaliser "none" (Eq. 9) or "similarity_sum".

    Exactly :func:`_linear_angular_attention_numpy` with policy="clamp", arithmetic="scaled" (the body of
    :func:`linear_angular_attention`, which dispatches here), with the kernels' signature.

    Parameters
    ----------
    q : (B, h, N, d), k : (B, h, M, d), v : (B, h, M, e) float arrays (M = N for constant "own").
    constant : "sum" | "own".  normaliser : "none" | "similarity_sum" (the kernels do not implement the
        official "output_l2"; call linear_angular_attention for it).  eps : float >= 0.
    out : optional (B, h, N, e) array the result is copied into and returned.  workspace, threads :
        accepted and ignored.

    Returns
    -------
    ndarray (B, h, N, e).

    References
    ----------
    Castling-ViT (You et al., CVPR 2023) Eq. 8-9.
    """
    if normaliser not in ("none", "similarity_sum"):
        raise ValueError(f"argument 'normaliser': operation 'linear_angular_attention' takes 'none' or "
                         f"'similarity_sum', got {normaliser!r}; use angular.linear_angular_attention for "
                         f"'output_l2'")
    res = _linear_angular_attention_numpy(q, k, v, constant=constant, normaliser=normaliser, eps=eps,
                                          policy="clamp", arithmetic="scaled")
    if out is not None:
        out[...] = res
        return out
    return res


def token_conv(v: Any, weight: Any, bias: Any = None) -> np.ndarray:
    """The DWConv branch M_DW V of Eq. 9 as released: a depthwise (k, 1) convolution along the flattened
    token axis, heads as channels, the same filter for every column of a head's V, zero padding k//2.

    out[b, c, n, j] = sum_{t=0}^{k-1} w[c, 0, t, 0] v[b, c, n + t - k//2, j]   (+ bias[c])

    i.e. per head a banded Toeplitz N x N matrix M_DW times V, exactly "the matrix form of DWConv" of Eq. 9.

    Parameters
    ----------
    v : (B, h, N, d) float.  weight : (h, 1, k, 1) float, k odd.  bias : (h,) or None.

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Eq. 9 and Sec. 3.2.1 ("a learnable depthwise convolution ... applied on all the value
    tokens"); the released code's ``dconv`` (Conv2d(h, h, (k, 1), padding=(k//2, 0), groups=h, bias=False)).
    """
    v = numerics.as_float(v, "v")
    weight = numerics.as_float(weight, "weight")
    sz = numerics.check_shapes(v=(v, "B h N d"), weight=(weight, "h 1 k 1"))
    if sz["k"] % 2 == 0:
        raise ArgumentError(f"argument 'weight': expected an odd kernel length k (padding k//2 keeps N tokens), "
                         f"got shape {weight.shape}")
    return layers.depthwise_conv2d(v, weight, bias, padding=(sz["k"] // 2, 0))


def _heads_to_image(v: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    b, h, n, d = v.shape
    return v.transpose(0, 1, 3, 2).reshape(b, h * d, hw[0], hw[1])


def _image_to_heads(x: np.ndarray, h: int) -> np.ndarray:
    b, c, hh, ww = x.shape
    return x.reshape(b, h, c // h, hh * ww).transpose(0, 1, 3, 2)


def _check_hw(hw: Any, n: int) -> tuple[int, int]:
    if hw is None:
        raise ArgumentError(f"argument 'hw': expected (H, W) with H * W = N = {n} (the grid of the tokens), got None")
    return validation.check_grid(hw, n, tokens="q")


def grid_conv(v: Any, weight: Any, bias: Any = None, *, hw: tuple[int, int]) -> np.ndarray:
    """Alternative DWConv branch: a k x k depthwise conv of V on the H x W token grid, channel c = head * d + j
    (the channel order of the merged heads), zero padding k//2.  An option, not the released layout.

    Parameters
    ----------
    v : (B, h, N, d) float, N = H W.  weight : (h d, 1, k, k), k odd.  bias : (h d,) or None.
    hw : (H, W).

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Sec. 3.2.1 and Fig. 4 (DWConv on V "attends to nearby tokens").
    """
    v = numerics.as_float(v, "v")
    weight = numerics.as_float(weight, "weight")
    sz = numerics.check_shapes(v=(v, "B h N d"))
    hw = _check_hw(hw, sz["N"])
    numerics.check_shapes(weight=(weight, "C 1 k k"), sizes={"C": sz["h"] * sz["d"]})
    if weight.shape[2] % 2 == 0:
        raise ArgumentError(f"argument 'weight': expected an odd kernel size, got shape {weight.shape}")
    img = _heads_to_image(v, hw)
    out = layers.depthwise_conv2d(img, weight, bias, padding=weight.shape[2] // 2)
    return _image_to_heads(out, sz["h"])


@_nan_quiet
def masked_softmax_branch(q: Any, k: Any, v: Any, *, threshold: float = config.CASTLING_SPARSE_EPS,
                          scale: float = 1.0, max_elements: int | None = None,
                          taps: dict | None = None) -> np.ndarray:
    """The auxiliary sparse branch Mask_eps(Softmax(Q K^T)) V of Castling-ViT Eq. 10.

    P = softmax_j((s q_i) . k_j); Mask_eps(P)_ij = P_ij if P_ij > eps (strictly) else 0; no renormalisation
    (the kept weights of a row sum to at most 1).  The mask is applied as P * [P > eps], so a NaN weight
    propagates (NaN * 0 = NaN), as in the released code's ``mask * attn``.  When every P_ij <= eps the output
    is exactly 0 (a sum of exact zeros), so dropping the branch at inference changes nothing, bit for bit.

    Parameters
    ----------
    q : (B, h, N, d); k : (B, h, M, d); v : (B, h, M, e) float (paper mode passes q^, k^ and s = 1; the
        official preset passes the raw q, k and s = d^-1/2).
    threshold : eps >= 0 (config.CASTLING_SPARSE_EPS = 0.02).  scale : s.
    taps : optional dict: "sparse_weights" (P), "sparse_mask" (bool), "sparse" (the output).

    Returns
    -------
    (B, h, N, e) working dtype.

    References
    ----------
    Castling-ViT Eq. 10 and Sec. 3.2.2.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(threshold, "threshold")
    validation.check_real(scale, "scale")
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    _guard(sz["B"] * sz["h"] * sz["N"] * sz["M"], max_elements, "masked_softmax_branch",
           "the inference mode (training=False), which drops the branch")
    p = numerics.softmax((q * scale) @ np.swapaxes(k, -1, -2), axis=-1)
    mask = p > threshold
    out = (p * mask) @ v
    if taps is not None:
        taps.update(sparse_weights=p, sparse_mask=mask, sparse=out)
    return out


# ===================================================================================================
# Error bounds (the error model: angular_series, section 5)
# ===================================================================================================

def _e_softmax_masked(logits: np.ndarray, el: np.ndarray, threshold: float, u: float,
                      tested_threshold_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax by max-subtraction and the mask P * [P > eps].

    dP_ij = P_ij (dL_ij - sum_l P_il dL_il) to first order; the rounding of L - max (u |L - max|, an absolute
    error of the exponent), exp (ELEM u relative), the sum of M positive terms (gamma_M) and the quotient (u):
        E(P_ij) = P_ij ((1 - 2 P_ij)(E(L_ij) + |L_ij - m_i|) + sum_l P_il (E(L_il) + |L_il - m_i|) + 2 ELEM + M + 1)
    (|P_ij ((1 - P_ij) x_j - sum_{l != j} P_il x_l)| <= P_ij ((1 - 2 P_ij)|x_j| + sum_l P_il |x_l|)).
    The mask is discontinuous: where |P_ij - eps| <= u E(P_ij) + |eps - fl_T(eps)| the tested code may decide
    either way, so the whole weight P_ij is admitted as error (returned as ``amb``, a 0/1 array)."""
    m = np.max(logits, axis=-1, keepdims=True)
    p = numerics.softmax(logits, axis=-1)
    shift = np.abs(logits - m)
    width = logits.shape[-1]
    # The Jacobian p_ij (delta_jl - p_il) taken exactly: (1 - 2 p) x + sum_l p x >= (1 - p) x >= 0.
    e = p * ((1 - 2 * p) * el + np.sum(p * el, axis=-1, keepdims=True) + (1 - 2 * p) * shift
             + np.sum(p * shift, axis=-1, keepdims=True) + 2 * _ELEM + width + 1)
    amb = np.abs(p - threshold) <= u * e + tested_threshold_gap
    return p, e, amb


def _rounded_gap(value: float, dtype: Any) -> float:
    return abs(value - float(numerics.round_to(np.array(value), dtype)))


def angular_attention_bound(q: Any, k: Any, v: Any, *, dtype: Any, order: int | None = None,
                            normalize: bool = False, method: str = "atan2",
                            eps: float = config.CASTLING_QK_NORM_EPS, policy: str = "clamp") -> Bound:
    """Error bound of :func:`angular_attention` computed in precision T (first-order running analysis).

    A = Sim with E(A) from :func:`angular_similarity_bound`; O = A V (length M): E = E(A)|V| + M |A||V|;
    with the normaliser den = A 1 (A >= 0, no cancellation): E(den) = E(A) 1 + M den, and
    E(O/den) = (E(num) + |O| E(den)) / (den - u E(den)) + |O|, inf where den - u E(den) <= 0: the exact
    kernel's similarity sum vanishes when every key is antiparallel to the query, and with arccos in
    float32 a key within about 2.4e-4 rad of antiparallel (1 - cos < u/2) already rounds to Sim = 0 - no
    bound exists there.  K = d + M + 2 (+ the kernel's depth); see the module's section 5 comment for the
    Bound(scale = E/K, k = K) convention.

    Parameters
    ----------
    q (B,h,N,d), k (B,h,M,d), v (B,h,M,e) : float (T-rounded).  dtype : T.  Others as
    :func:`angular_attention`.

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).
    """
    validation.check_eps(eps)
    q, k, v, sz = _check_qkv(q, k, v)
    a, ea = angular_similarity_bound(q, k, dtype=dtype, order=order, method=method, eps=eps, policy=policy)
    m = sz["M"]
    num = a @ v
    e = ea @ np.abs(v) + m * (np.abs(a) @ np.abs(v))
    depth = sz["d"] + m + 3 * (order or 0) + 2 * _ELEM + 8
    if normalize:
        den = np.sum(a, axis=-1)[..., None]
        eden = np.sum(ea, axis=-1)[..., None] + m * np.abs(den)
        u = numerics.unit_roundoff(dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            o = num / den
            # exact quotient bound (|den| - u E(den) in the divisor); inf where rounding can reach den = 0
            # (the exact kernel with every key (nearly) antiparallel to the query: Sim = 0 for all of them)
            low = np.abs(den) - u * eden
            e = np.where(low > 0, (e + np.abs(o) * eden) / low + np.abs(o), np.inf)
        depth += m + 1
    return Bound(e / depth, depth, f"angular attention (order {order}, normalize={normalize}, {method}): "
                                   f"first-order running error, k = d + M (+M+1) + kernel depth = {depth}")


def linear_angular_attention_bound(q: Any, k: Any, v: Any, *, constant: str = "sum", normaliser: str = "none",
                                   eps: float = config.CASTLING_QK_NORM_EPS, normalizer: str | None = None) -> Bound:
    """Error bound of :func:`linear_angular_attention` in paper mode (policy "clamp", arithmetic "scaled";
    normaliser "none" or "similarity_sum") computed in precision T on T-rounded inputs, any summation order.

    First-order running error E in units of u_T (|.| element-wise):

      q^ = q / max(m sqrt(sum (q/m)^2), eps): q/m (u), the square (2u + u), the sum of d non-negative
          terms ((d - 1) u), sqrt (half of that, + u), times m (u), the quotient (u):  E(q^) = (d/2 + 4)|q^|;
          likewise k^.
      kv = k^^T v (length M):  E(kv) = E(k^)^T |v| + M |k^|^T |v|.
      num = q^ kv (length d):  E(num) = E(q^)(|k^|^T |v|) + |q^| E(kv) + d |q^|(|k^|^T |v|).
      lin = (1/pi) num:  fl(1/pi) and the product, E(lin) = E(num)/pi + 2 |lin|.
      C:  "own" 1/2 v is exact; "sum" 1/2 sum_j v_j adds (M/2) sum_j |v_j|.  H = C + lin adds |C| + |lin|.
      similarity_sum:  den = M/2 + (1/pi) q^ . sum_j k^_j with E(den) = (E(q^) . S_k + |q^| . sum_j E(k^_j)
          + (M + d)|q^| . S_k)/pi + 3 (M/2 + |q^| . S_k/pi) (S_k = sum_j |k^_j|); den >= M (1/2 - 1/pi) > 0,
          so the quotient adds (E(H) + |H/den| E(den))/den + |H/den|.

    Returned as Bound(E / K, K) with K = d + M + 12 (the two inner products plus the elementwise stages), so
    that gamma_K(u) * scale >= u E.  First order in u (products of errors neglected); no underflow term
    (unit rows are >= 1 in their largest entry unless clamped by eps).  Moved here from the kernel tests,
    where it was derived for the C kernel's agreement test (tests/test_kernels_linear.py).

    Parameters
    ----------
    q : (B, h, N, d), k : (B, h, M, d), v : (B, h, M, e) float (T-rounded values).
    constant : "sum" | "own".  normaliser : "none" | "similarity_sum".  eps : the clamp of the row norms.
    normalizer : the deprecated spelling of normaliser (a DeprecationWarning).

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).

    References
    ----------
    Castling-ViT Eq. 8-9; Higham (2002) §3.1 (running error of inner products).
    """
    normaliser = validation.renamed_keyword(normaliser, normalizer, new="normaliser", old="normalizer",
                                            default="none", where="linear_angular_attention_bound")
    validation.check_eps(eps)
    q, k, v, _ = _check_qkv(q, k, v)
    if constant not in ("sum", "own"):
        raise ArgumentError(f"argument 'constant': expected 'sum' or 'own', got {constant!r}")
    if normaliser not in ("none", "similarity_sum"):
        raise ArgumentError(f"argument 'normaliser': the bound covers 'none' and 'similarity_sum', got {normaliser!r}")
    with np.errstate(all="ignore"):
        qh = unit_rows(q, eps=eps, policy="clamp")
        kh = unit_rows(k, eps=eps, policy="clamp")
        d, m = q.shape[-1], k.shape[-2]
        aq, ak, av = np.abs(qh), np.abs(kh), np.abs(v)
        eq, ek = (d / 2 + 4) * aq, (d / 2 + 4) * ak
        kv_abs = ak.swapaxes(-1, -2) @ av
        e_kv = ek.swapaxes(-1, -2) @ av + m * kv_abs
        num_abs = aq @ kv_abs
        e_num = eq @ kv_abs + aq @ e_kv + d * num_abs
        lin_abs = num_abs / np.pi
        e = e_num / np.pi + 2 * lin_abs
        if constant == "own":
            c_abs = 0.5 * av
        else:
            c_abs = np.broadcast_to(0.5 * np.sum(av, axis=-2, keepdims=True), lin_abs.shape)
            e = e + (m / 2) * np.sum(av, axis=-2, keepdims=True)
        h_abs = c_abs + lin_abs
        e = e + h_abs
        if normaliser == "similarity_sum":
            sk = np.sum(ak, axis=-2)
            dot = np.einsum("bhnd,bhd->bhn", aq, sk)
            den = m / 2 + np.einsum("bhnd,bhd->bhn", qh, np.sum(kh, axis=-2)) / np.pi
            e_den = (np.einsum("bhnd,bhd->bhn", eq, sk) + np.einsum("bhnd,bhd->bhn", aq, np.sum(ek, axis=-2))
                     + (m + d) * dot) / np.pi + 3 * (m / 2 + dot / np.pi)
            o_abs = h_abs / den[..., None]
            e = (e + o_abs * e_den[..., None]) / den[..., None] + o_abs
    depth = d + m + 12
    return Bound(e / depth, depth, f"linear-angular (Castling Eq. 9, {constant}, {normaliser}): first-order running "
                                   f"error, K = d + M + 12 = {depth}")
