"""Castling-ViT: the angular kernel, its arcsin series, and linear-angular attention (the public API), and the
Castling attention module with its bounds and stages.

Reference: H. You et al., "Castling-ViT: Compressing Self-Attention via Switching Towards Linear-Angular
Attention at Vision Transformer Inference", CVPR 2023 (../shared/seeds/003_b81e2e603475c765.txt).  Equation
numbers are the paper's.

Shapes: B batch, h heads, N query tokens, M key/value tokens, d head dim, C = h d channels, H x W grid
(N = H W).  Per-head tensors are (B, h, N, d); token tensors (B, N, C).

The mathematics, in three files (this module re-exports the public names of the other two, so every name
of ``__all__`` is importable from here, its documented home):

:mod:`refimpl.attention.angular_series` (§3.2, Eq. 2, 4-8; the bottom, imports neither of the others):

1. **The arcsin series** (Eq. 8).  arcsin x = sum_{k>=0} c_k x^(2k+1), c_k = (2k)! / (4^k (k!)^2 (2k+1)),
   truncated after order K: T_K(x) = sum_{k<=K} c_k x^(2k+1), with two proven tail bounds
   (:func:`arcsin_tail_bound`).
2. **The angular kernel** (Eq. 4-5): theta = arccos(q^.k^), Sim = 1 - theta/pi = 1/2 + arcsin(q^.k^)/pi
   (the identity behind Eq. 8), evaluated stably near |q^.k^| = 1 by Kahan's half-angle formula.
3. **Feature maps**: tensor powers x^{(x)p} with <x^{(x)p}, y^{(x)p}> = (x.y)^p exactly, so every order of
   the expansion is a linear-attention term; the implicit map phi of Eq. 6-7 realised by random-hyperplane
   sign features; the exponential / Gaussian-RBF kernels of Eq. 2.
5. the error model (numerics' first-order running error analysis) and the bound of the angular similarity.

:mod:`refimpl.attention.angular_linear` (Eq. 8-10; imports angular_series):

4. **Attention**: the full quadratic angular attention (exact or truncated kernel, with or without the
   similarity-sum normaliser); the same truncated kernel in linear time through tensor-power features; the
   linear-angular attention of Eq. 9; the depthwise-conv branch on V; the auxiliary masked softmax branch of
   Eq. 10; and their bounds.

This file (imports both; layer: attention, as its parts):

4b. the Castling attention module (qkv, core, proj) with its presets ``paper`` and ``official``;
5. its error bounds (:func:`castling_core_bound`, :func:`castling_attention_bound`) and its stage list
   (:func:`castling_attention_stages`).

What "official" means (the authors' released ``LinAngularAttention``; each item is a :class:`CastlingConfig`
field):  constant term 1/2 v_i (the token's own value); no similarity-sum normaliser, instead each token's
per-head output divided by its own L2 norm with no eps, the conv branch added after that; the conv is a (k, 1)
depthwise conv along the flattened token axis with heads as channels, no bias, k = 9, applied to V; q and k
normalised with no eps, every norm computed as sqrt(sum x^2) (``tensor.norm()``, which underflows for tiny
rows); the sparse branch's softmax taken from the unnormalised q and k scaled by head_dim^-1/2, added before
the output normalisation, and present (or absent) regardless of train/eval.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Mapping

import numpy as np

from .. import bounds, config, layers, numerics, validation
from ..errors import ArgumentError
from ..feature_maps import check_series_order as _check_order
from ..feature_maps import series_feature_dim as _feature_dim
from ..numerics import Bound
from .angular_linear import (_CONSTANTS, _NORMALISERS, _check_qkv, _constant_term, _e_softmax_masked, _nan_quiet,
                             _rounded_gap, _tap, angular_attention, angular_attention_bound,
                             angular_attention_features, grid_conv, linear_angular_attention,
                             linear_angular_attention_bound, masked_softmax_branch, token_conv)
from .angular_series import (TAIL_BOUND_FLOOR, _ELEM, _POLICIES, _e_matmul, _e_normalize, angular_series_features,
                             angular_similarity, angular_similarity_bound, angular_similarity_series,
                             arcsin_coefficients, arcsin_coefficients_exact, arcsin_series, arcsin_series_bound,
                             arcsin_series_derivative, arcsin_tail_bound, arcsin_tail_tightness, cosine_matrix,
                             exponential_kernel, gaussian_rbf_kernel, hyperplane_features, spectral_angle,
                             tensor_power, unit_rows)

__all__ = [
    "arcsin_coefficients_exact", "arcsin_coefficients", "arcsin_series", "arcsin_series_derivative",
    "arcsin_series_bound", "arcsin_tail_bound", "arcsin_tail_tightness", "TAIL_BOUND_FLOOR",
    "unit_rows", "cosine_matrix", "spectral_angle", "angular_similarity", "angular_similarity_series",
    "tensor_power", "angular_series_features", "hyperplane_features", "exponential_kernel",
    "gaussian_rbf_kernel",
    "angular_attention", "angular_attention_features", "linear_angular_attention",
    "linear_angular_attention_bound", "token_conv",
    "grid_conv", "masked_softmax_branch",
    "CastlingConfig", "init_castling_params", "castling_core", "castling_attention",
    "angular_similarity_bound", "angular_attention_bound", "castling_core_bound", "castling_attention_bound",
]


# ===================================================================================================
# 4b. The Castling attention module: config, presets, core, block
# ===================================================================================================

class _RenamedOptions(type):
    """The metaclass of :class:`CastlingConfig`: its constructor (and so ``preset`` and ``dataclasses.replace``)
    takes the deprecated keyword ``normalizer=`` as ``normaliser=`` (validation.renamed_keyword)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        """Construct with ``normalizer=`` mapped to ``normaliser=``."""
        return super().__call__(*args, **_renamed(kwargs, cls.__name__))


def _renamed(kwargs: dict[str, Any], where: str) -> dict[str, Any]:
    """``kwargs`` with the deprecated ``normalizer`` as ``normaliser`` (validation.renamed_keyword)."""
    if "normalizer" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    old = kwargs.pop("normalizer")
    kwargs["normaliser"] = validation.renamed_keyword(kwargs.get("normaliser", "none"), old, new="normaliser",
                                                      old="normalizer", default="none", where=where, stacklevel=4)
    return kwargs


@dataclasses.dataclass(frozen=True)
class CastlingConfig(metaclass=_RenamedOptions):
    """Configuration of one Castling-ViT attention layer (Eq. 8-10).  Frozen; build with
    ``CastlingConfig(dim, num_heads, ...)`` or ``CastlingConfig.preset("paper" | "official", dim=..., ...)``.

    Fields
    ------
    dim, num_heads : C and h (C divisible by h; head dim d = C / h).
    qkv_bias : bias of the qkv projection (official default False).
    order : K, the number of arcsin-series orders kept beyond the constant (0 = Eq. 9's linear term).
    constant : "sum" (paper: 1/2 sum_j v_j, the exact expansion of Sim(Q,K) V) | "own" (official: 1/2 v_i).
    normaliser : "none" (paper, Eq. 9 as printed) | "similarity_sum" (divide the angular part by
        sum_j Sim_K(q_i, k_j)) | "output_l2" (official: divide (sparse + constant + linear) by its own L2 norm,
        no eps, then add the conv branch).  ``normalizer=`` is the deprecated spelling (a DeprecationWarning).
    qk_norm : "clamp" (paper: q / max(||q||, eps)) | "none" (official: q / ||q||).  qk_norm_eps : eps.
    norm_arithmetic : "scaled" (paper: overflow/underflow-free norms) | "naive" (official: sqrt(sum x^2) as
        torch's ``.norm()`` computes it, for q, k and the output l2; see :func:`unit_rows`).
    conv : "tokens1d" ((k, 1) conv along tokens, heads as channels; default and official) | "grid2d"
        (k x k depthwise conv on the H x W grid, channels h d) | "none".
    conv_kernel : k (odd).  conv_bias : bool (official False).
    sparse : "train_only" (paper: the auxiliary branch is used in training and dropped at inference) |
        "always" (official with sparse_reg=True) | "off" (official default sparse_reg=False).
    sparse_eps : the threshold of Eq. 10.
    sparse_logits : "unit" (paper: softmax(q^ k^^T), Q and K being the normalised ones of Eq. 8-10) |
        "scaled_raw" (official: softmax(d^-1/2 q k^T) of the raw projections).

    Placement of the branches: with "none"/"similarity_sum", H = angular + conv + sparse (the sparse branch
    is added last, so dropping an all-zero branch is exact); with "output_l2", H = l2(sparse + constant +
    linear) + conv (the released order).
    """

    dim: int
    num_heads: int
    qkv_bias: bool = False
    order: int = 0
    constant: str = "sum"
    normaliser: str = "none"
    qk_norm: str = "clamp"
    qk_norm_eps: float = config.CASTLING_QK_NORM_EPS
    norm_arithmetic: str = "scaled"
    conv: str = "tokens1d"
    conv_kernel: int = config.CASTLING_CONV_KERNEL
    conv_bias: bool = False
    sparse: str = "train_only"
    sparse_eps: float = config.CASTLING_SPARSE_EPS
    sparse_logits: str = "unit"

    def __post_init__(self) -> None:
        """Raises ArgumentError / ArgumentTypeError for a dim or num_heads that is not an integer >= 1, a dim not
        divisible by num_heads, an order K < 0, an option outside its choices, a conv_kernel that is not an odd
        integer >= 1, a qk_norm_eps or sparse_eps that is not finite and >= 0, and normaliser "output_l2" with
        order > 0: a bad config cannot exist."""
        numerics.check_positive_int(self.dim, "dim")
        numerics.check_positive_int(self.num_heads, "num_heads")
        if self.dim % self.num_heads:
            raise ArgumentError(f"argument 'dim': expected a multiple of num_heads={self.num_heads}, got {self.dim}")
        _check_order(self.order)
        choices = {"constant": _CONSTANTS, "normaliser": _NORMALISERS, "qk_norm": _POLICIES,
                   "norm_arithmetic": ("scaled", "naive"),
                   "conv": ("tokens1d", "grid2d", "none"), "sparse": ("train_only", "always", "off"),
                   "sparse_logits": ("unit", "scaled_raw")}
        validation.check_config_options(self, choices)
        k = numerics.check_positive_int(self.conv_kernel, "conv_kernel")
        if k % 2 == 0:
            raise ArgumentError(f"argument 'conv_kernel': expected an odd size (padding k//2 keeps N), got {k}")
        validation.check_eps(self.qk_norm_eps, "qk_norm_eps")
        validation.check_eps(self.sparse_eps, "sparse_eps")
        if self.normaliser == "output_l2" and self.order != 0:
            raise ArgumentError("normaliser='output_l2' (the official preset) is defined for order 0 only")

    @property
    def normalizer(self) -> str:
        """The deprecated spelling of :attr:`normaliser` (a DeprecationWarning)."""
        warnings.warn("CastlingConfig.normalizer is deprecated, use .normaliser", DeprecationWarning, stacklevel=2)
        return self.normaliser

    @property
    def head_dim(self) -> int:
        """d = C / h, the head dimension."""
        return self.dim // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "CastlingConfig":
        """"paper" (the defaults: Eq. 8-10 as written) or "official" (the released code), then overrides."""
        presets = {
            "paper": {},
            "official": dict(qkv_bias=False, order=0, constant="own", normaliser="output_l2", qk_norm="none",
                             norm_arithmetic="naive",
                             conv="tokens1d", conv_kernel=config.CASTLING_CONV_KERNEL, conv_bias=False,
                             sparse="off", sparse_eps=config.CASTLING_SPARSE_EPS, sparse_logits="scaled_raw"),
        }
        if name not in presets:
            raise ArgumentError(f"argument 'name': expected 'paper' or 'official', got {name!r}")
        return cls(**{**presets[name], **_renamed(overrides, "CastlingConfig.preset")})

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The parameter keys (the PyTorch twin's state_dict keys) and their shapes."""
        c, h, k = self.dim, self.num_heads, self.conv_kernel
        shapes: dict[str, tuple[int, ...]] = {"qkv.weight": (3 * c, c)}
        if self.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
        shapes.update({"proj.weight": (c, c), "proj.bias": (c,)})
        if self.conv == "tokens1d":
            shapes["dconv.weight"] = (h, 1, k, 1)
            if self.conv_bias:
                shapes["dconv.bias"] = (h,)
        elif self.conv == "grid2d":
            shapes["dconv.weight"] = (c, 1, k, k)
            if self.conv_bias:
                shapes["dconv.bias"] = (c,)
        return shapes

    def sparse_active(self, training: bool) -> bool:
        """Whether the auxiliary branch of Eq. 10 is computed (the training/inference switch, Sec. 3.2.2)."""
        return self.sparse == "always" or (self.sparse == "train_only" and bool(training))


def init_castling_params(cfg: CastlingConfig, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
    """Random float64 parameters keyed like the twin's state_dict: weights N(0, 1/fan_in), biases N(0, 0.01^2)."""
    validation.check_config(cfg, CastlingConfig)
    rng = np.random.default_rng(validation.check_seed(rng, "rng", allow_generator=True))
    out = {}
    for key, shape in cfg.param_shapes().items():
        if key.endswith("bias"):
            out[key] = 0.01 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[key] = rng.standard_normal(shape) / math.sqrt(fan_in)
    return out


def _series_part(qh: np.ndarray, kh: np.ndarray, v: np.ndarray, order: int,
                 taps: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sum_{k<=K} (c_k/pi) (Q^K^^T)^(2k+1) V and the features (without the constant) for the normaliser."""
    if order == 0:
        kv = np.swapaxes(kh, -1, -2) @ v
        lin = (1.0 / math.pi) * (qh @ kv)
        fq, fk = qh, kh
        _tap(taps, "kv", kv)
        return lin, fq, fk
    fq = _features_no_norm(qh, order)
    fk = _features_no_norm(kh, order)
    kv = np.swapaxes(fk, -1, -2) @ v
    if taps is not None:
        taps.update(phi_q=fq, phi_k=fk, kv=kv)
    return fq @ kv, fq, fk


def _features_no_norm(xh: np.ndarray, order: int) -> np.ndarray:
    """[sqrt(c_k/pi) xh^{(x)(2k+1)}]_k on already normalised rows (no constant component)."""
    dim = _feature_dim(xh.shape[-1], order, False)
    if int(np.prod(xh.shape[:-1])) * dim > config.CASTLING_MAX_FEATURE_ELEMENTS:
        raise ArgumentError(f"order {order} with d = {xh.shape[-1]}: {dim} features per token exceed "
                         f"config.CASTLING_MAX_FEATURE_ELEMENTS; lower the order")
    c = arcsin_coefficients(order)
    parts, power = [], xh
    for kk in range(order + 1):
        if kk:
            power = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).reshape(
                *xh.shape[:-1], -1)
        parts.append(np.sqrt(c[kk] / math.pi) * power)
    return np.concatenate(parts, axis=-1)


@_nan_quiet
def _check_self_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sz: dict, where: str) -> None:
    if sz["N"] != sz["M"] or sz["e"] != sz["d"]:
        raise ArgumentError(f"{where}: arguments 'q', 'k', 'v': self-attention expects one shape (B, h, N, d), got "
                            f"{q.shape}, {k.shape}, {v.shape}")


def _check_conv_weight(conv_weight: Any, cfg: CastlingConfig, sz: dict) -> None:
    """conv_weight checked where the caller passed it (its type and the shape of cfg.conv), not inside the conv."""
    if cfg.conv == "none":
        return
    if conv_weight is None:
        raise ArgumentError(f"argument 'conv_weight': required for conv={cfg.conv!r}")
    w = numerics.as_float(conv_weight, "conv_weight")
    if cfg.conv == "tokens1d":
        numerics.check_shapes(conv_weight=(w, "h 1 k 1"), sizes={"h": sz["h"]})
    else:
        numerics.check_shapes(conv_weight=(w, "C 1 k k"), sizes={"C": sz["h"] * sz["d"]})


def castling_core(q: Any, k: Any, v: Any, cfg: CastlingConfig, *, conv_weight: Any = None,
                  conv_bias: Any = None, training: bool = False, hw: tuple[int, int] | None = None,
                  taps: dict | None = None) -> np.ndarray:
    """The Castling-ViT attention of Eq. 9-10 on per-head q, k, v (no projections).

    Paper preset (defaults), per head:  H = C + S_K + M_DW V [+ Mask_eps(Softmax(Q^K^^T)) V in training],
        C = 1/2 sum_j v_j, S_K = sum_{k<=K} (c_k/pi) (Q^K^^T)^(2k+1) V (K = 0: (1/pi) Q^(K^^T V)),
        optionally divided by the similarity sum (normaliser="similarity_sum").
    Official preset:  H = l2(Mask_eps(Softmax(d^-1/2 Q K^T)) V + 1/2 V + (1/pi) Q^(K^^T V)) + conv(V), the
        sparse term only when cfg.sparse == "always".

    Parameters
    ----------
    q, k, v : (B, h, N, d) float (self-attention: M = N).
    cfg : :class:`CastlingConfig` (num_heads = h, head_dim = d).
    conv_weight : (h, 1, k, 1) for conv "tokens1d", (h d, 1, k, k) for "grid2d", ignored for "none".
    conv_bias : (h,) / (h d,) or None.  training : the train/inference switch of the auxiliary branch.
    hw : (H, W) with H W = N, required for conv "grid2d".
    taps : optional dict: "q_hat", "k_hat", "kv", "linear" (the series part S_K), "constant",
        "denominator" (similarity_sum), "angular" (the attention before conv/sparse or the l2 argument),
        "output_norm" (output_l2), "dwc", and with the sparse branch "sparse_weights", "sparse_mask",
        "sparse"; with order > 0 also "phi_q", "phi_k".

    Returns
    -------
    (B, h, N, d) working dtype.

    References
    ----------
    Castling-ViT Eq. 8, 9, 10; Sec. 3.2.2 (castling at inference).
    """
    validation.check_config(cfg, CastlingConfig)
    validation.check_taps(taps)
    q, k, v, sz = _check_qkv(q, k, v)
    _check_self_attention(q, k, v, sz, "castling_core")
    if sz["h"] != cfg.num_heads or sz["d"] != cfg.head_dim:
        raise ArgumentError(f"castling_core: q has h = {sz['h']}, d = {sz['d']}; cfg expects h = {cfg.num_heads}, "
                         f"d = {cfg.head_dim}")
    _check_conv_weight(conv_weight, cfg, sz)
    qh = unit_rows(q, eps=cfg.qk_norm_eps, policy=cfg.qk_norm, arithmetic=cfg.norm_arithmetic)
    kh = unit_rows(k, eps=cfg.qk_norm_eps, policy=cfg.qk_norm, arithmetic=cfg.norm_arithmetic)
    _tap(taps, "q_hat", qh)
    _tap(taps, "k_hat", kh)
    series, fq, fk = _series_part(qh, kh, v, cfg.order, taps)
    const = _constant_term(v, cfg.constant, sz["N"])
    if taps is not None:
        taps.update(linear=series, constant=const)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            sparse = masked_softmax_branch(qh, kh, v, threshold=cfg.sparse_eps, scale=1.0, taps=taps)
        else:
            sparse = masked_softmax_branch(q, k, v, threshold=cfg.sparse_eps, scale=cfg.head_dim ** -0.5,
                                           taps=taps)
    if cfg.normaliser == "output_l2":
        ang = const + series if sparse is None else (sparse + const) + series
        _tap(taps, "angular", ang)
        _tap(taps, "output_norm", np.linalg.norm(ang, axis=-1, keepdims=True))
        out = unit_rows(ang, eps=0.0, policy="none", arithmetic=cfg.norm_arithmetic)
    else:
        out = const + series
        if cfg.normaliser == "similarity_sum":
            den = sz["M"] / 2.0 + _dot_sum(fq, fk, cfg.order)
            _tap(taps, "denominator", den)
            out = out / den[..., None]
        _tap(taps, "angular", out)
    if cfg.conv != "none":
        if conv_weight is None:
            raise ArgumentError(f"argument 'conv_weight': required for conv={cfg.conv!r}")
        dwc = token_conv(v, conv_weight, conv_bias) if cfg.conv == "tokens1d" else \
            grid_conv(v, conv_weight, conv_bias, hw=hw)
        _tap(taps, "dwc", dwc)
        out = out + dwc
    if sparse is not None and cfg.normaliser != "output_l2":
        out = out + sparse
    return out


def _dot_sum(fq: np.ndarray, fk: np.ndarray, order: int) -> np.ndarray:
    """sum_j of the series part of Sim_K(q_i, k_j) = F(q_i) . sum_j F(k_j) ((1/pi) q^ . sum k^ at order 0)."""
    s = np.einsum("bhnf,bhf->bhn", fq, np.sum(fk, axis=-2))
    return (1.0 / math.pi) * s if order == 0 else s


def _split_heads(qkv: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, n, c3 = qkv.shape
    t = qkv.reshape(b, n, 3, h, c3 // (3 * h)).transpose(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


@_nan_quiet
def castling_attention(x: Any, params: Mapping[str, Any], cfg: CastlingConfig, *, training: bool = False,
                       hw: tuple[int, int] | None = None, taps: dict | None = None) -> np.ndarray:
    """One Castling-ViT attention layer: qkv projection, :func:`castling_core`, merge heads, output projection.

    qkv = x W_qkv^T (+ b) split as (B, N, 3, h, d) -> q, k, v (B, h, N, d) (the released layout);
    out = merge(castling_core(q, k, v)) W_proj^T + b_proj.

    Parameters
    ----------
    x : (B, N, C) float.
    params : {"qkv.weight": (3C, C), ["qkv.bias": (3C,)], "proj.weight": (C, C), "proj.bias": (C,),
        "dconv.weight": (h, 1, k, 1) or (C, 1, k, k), ["dconv.bias"]} (keys of :meth:`CastlingConfig.param_shapes`).
    cfg : :class:`CastlingConfig`.  training : the auxiliary-branch switch.  hw : (H, W) for conv "grid2d".
    taps : optional dict: "q", "k", "v" and every tap of :func:`castling_core`, plus "heads" (B, N, C).

    Returns
    -------
    (B, N, C) working dtype.

    References
    ----------
    Castling-ViT Eq. 1 (heads, projections), Eq. 9-10.
    """
    validation.check_config(cfg, CastlingConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg)
    validation.check_taps(taps)
    qkv = layers.linear(x, params["qkv.weight"], params.get("qkv.bias"))
    q, k, v = _split_heads(qkv, cfg.num_heads)
    if taps is not None:
        taps.update(q=q, k=k, v=v)
    heads = castling_core(q, k, v, cfg, conv_weight=params.get("dconv.weight"),
                          conv_bias=params.get("dconv.bias"), training=training, hw=hw, taps=taps)
    merged = heads.transpose(0, 2, 1, 3).reshape(x.shape)
    _tap(taps, "heads", merged)
    return layers.linear(merged, params["proj.weight"], params["proj.bias"])


def _check_params(params: Mapping[str, Any], cfg: CastlingConfig) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against ``cfg.param_shapes()``."""
    validation.check_params(params, cfg.param_shapes(), where="castling_attention")


# ===================================================================================================
# 5. Error bounds of the module (the error model: refimpl.attention.angular_series, section 5)
# ===================================================================================================

def _core_with_error(q, k, v, eq, ek, ev, cfg: CastlingConfig, conv_weight, conv_bias, training, hw, dtype):
    """castling_core's value and error coefficient, stage by stage (see castling_core_bound)."""
    u = numerics.unit_roundoff(dtype)
    eta_u = numerics.underflow_eta(dtype) / u
    b, h, n, d = q.shape
    sn, sd = numerics.sum_depth(n, dtype), numerics.sum_depth(d, dtype)   # sums of N and d terms (mixed: fewer)
    depth = 0.0
    qh, eqh = _e_normalize(q, eq, cfg.qk_norm_eps, cfg.qk_norm, cfg.norm_arithmetic, eta_u, dtype)
    kh, ekh = _e_normalize(k, ek, cfg.qk_norm_eps, cfg.qk_norm, cfg.norm_arithmetic, eta_u, dtype)
    depth += sd / 2 + 2
    av = np.abs(v)
    if cfg.order == 0:
        kt, ekt = np.swapaxes(kh, -1, -2), np.swapaxes(ekh, -1, -2)
        kv = kt @ v
        ekv = _e_matmul(kt, ekt, v, ev, eta_u, dtype)
        raw = qh @ kv
        eraw = _e_matmul(qh, eqh, kv, ekv, eta_u, dtype)
        series = (1.0 / math.pi) * raw
        es = eraw / math.pi + 2.0 * np.abs(series)
        fq, efq, fk, efk = qh, eqh / math.pi, kh, ekh  # for the normaliser: (1/pi) q^ . sum k^
        depth += sn + sd + 2
    else:
        fq, efq = _e_features(qh, eqh, cfg.order)
        fk, efk = _e_features(kh, ekh, cfg.order)
        ft, eft = np.swapaxes(fk, -1, -2), np.swapaxes(efk, -1, -2)
        kv = ft @ v
        ekv = _e_matmul(ft, eft, v, ev, eta_u, dtype)
        series = fq @ kv
        es = _e_matmul(fq, efq, kv, ekv, eta_u, dtype)
        depth += sn + numerics.sum_depth(fq.shape[-1], dtype) + 2 * cfg.order + 4
    if cfg.constant == "own":
        const, ec = 0.5 * v, 0.5 * ev
    else:
        const = np.broadcast_to(0.5 * np.sum(v, axis=-2, keepdims=True), v.shape)
        ec = np.broadcast_to(0.5 * np.sum(ev, axis=-2, keepdims=True) + 0.5 * sn * np.sum(av, axis=-2,
                                                                                           keepdims=True), v.shape)
    sparse = None
    if cfg.sparse_active(training):
        if cfg.sparse_logits == "unit":
            lq, elq, lk, elk = qh, eqh, kh, ekh
        else:
            s = cfg.head_dim ** -0.5
            lq, elq, lk, elk = s * q, s * eq + 2.0 * np.abs(s * q), k, ek
        logits = lq @ np.swapaxes(lk, -1, -2)
        el = _e_matmul(lq, elq, np.swapaxes(lk, -1, -2), np.swapaxes(elk, -1, -2), eta_u)
        p, ep, amb = _e_softmax_masked(logits, el, cfg.sparse_eps, u, _rounded_gap(cfg.sparse_eps, dtype))
        pm = p * (p > cfg.sparse_eps)
        sparse = pm @ v
        epm = np.where(amb, 0.0, np.where(p > cfg.sparse_eps, ep, 0.0))
        e_sp = _e_matmul(pm, epm, v, ev, eta_u) + (np.where(amb, p, 0.0) @ av) / u
        depth += d + 2 * _ELEM + n + 4
    if cfg.normaliser == "output_l2":
        if sparse is None:
            ang, e_ang = const + series, ec + es + np.abs(const + series)
        else:
            t = sparse + const
            et = e_sp + ec + np.abs(t)
            ang, e_ang = t + series, et + es + np.abs(t + series)
        out, e_out = _e_normalize(ang, e_ang, 0.0, "none", cfg.norm_arithmetic, eta_u, dtype)
        depth += sd / 2 + 4
    else:
        out = const + series
        e_out = ec + es + np.abs(out)
        depth += 1
        if cfg.normaliser == "similarity_sum":
            ksum, eks = np.sum(fk, axis=-2), np.sum(efk, axis=-2) + sn * np.sum(np.abs(fk), axis=-2)
            dot = np.einsum("bhnf,bhf->bhn", fq, ksum)
            edot = np.einsum("bhnf,bhf->bhn", efq, np.abs(ksum)) + np.einsum("bhnf,bhf->bhn", np.abs(fq), eks) \
                + numerics.sum_depth(fq.shape[-1], dtype) * np.einsum("bhnf,bhf->bhn", np.abs(fq), np.abs(ksum))
            if cfg.order == 0:
                dot, edot = dot / math.pi, edot / math.pi + 2.0 * np.abs(dot / math.pi)
            den = (n / 2.0 + dot)[..., None]
            eden = (edot + np.abs(n / 2.0 + dot))[..., None]
            o = out / den
            e_out = (e_out + np.abs(o) * eden) / np.abs(den) + np.abs(o)
            out = o
            depth += sn + numerics.sum_depth(fq.shape[-1], dtype) + 4
    if cfg.conv != "none":
        w = numerics.as_float(conv_weight, "conv_weight")
        aw = np.abs(w)
        bias_abs = None if conv_bias is None else np.abs(numerics.as_float(conv_bias, "conv_bias"))
        if cfg.conv == "tokens1d":
            dwc = token_conv(v, w, conv_bias)
            s_abs = token_conv(av, aw, bias_abs)
            prop = token_conv(ev, aw)
            taps_k = w.shape[2]
        else:
            dwc = grid_conv(v, w, conv_bias, hw=hw)
            s_abs = grid_conv(av, aw, bias_abs, hw=hw)
            prop = grid_conv(ev, aw, hw=hw)
            taps_k = w.shape[2] * w.shape[3]
        k_dwc = numerics.sum_depth(taps_k, dtype) + (conv_bias is not None)
        e_dwc = prop + k_dwc * s_abs
        out = out + dwc
        e_out = e_out + e_dwc + np.abs(out)
        depth += k_dwc + 1
    if sparse is not None and cfg.normaliser != "output_l2":
        out = out + sparse
        e_out = e_out + e_sp + np.abs(out)
        depth += 1
    return out, e_out, depth


def _e_features(xh: np.ndarray, exh: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Series features without the constant and their errors: P_{p} = P_{p-2} (x) x (x) x;
    E(P_p) = E(P_{p-2}) (x)|x|(x)|x| + |P_{p-2}| (x) (E(x)(x)|x| + |x|(x)E(x)) + 2 |P_p|; scaling by the rounded
    sqrt(c_k/pi) adds 3 |.| (the constant's rounding, the sqrt, the product)."""
    c = arcsin_coefficients(order)
    ax = np.abs(xh)
    parts, eparts = [], []
    power, epower = xh, exh
    shape = xh.shape[:-1]
    for kk in range(order + 1):
        if kk:
            ap = np.abs(power)
            new = (power[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).reshape(*shape, -1)
            epower = (epower[..., :, None, None] * ax[..., None, :, None] * ax[..., None, None, :]
                      + ap[..., :, None, None] * exh[..., None, :, None] * ax[..., None, None, :]
                      + ap[..., :, None, None] * ax[..., None, :, None] * exh[..., None, None, :]
                      ).reshape(*shape, -1) + 2.0 * np.abs(new)
            power = new
        s = math.sqrt(float(c[kk]) / math.pi)
        parts.append(s * power)
        eparts.append(s * epower + 3.0 * np.abs(s * power))
    return np.concatenate(parts, axis=-1), np.concatenate(eparts, axis=-1)


def castling_core_bound(q: Any, k: Any, v: Any, cfg: CastlingConfig, *, dtype: Any, conv_weight: Any = None,
                        conv_bias: Any = None, training: bool = False, hw: tuple[int, int] | None = None,
                        err_q: Any = None, err_k: Any = None, err_v: Any = None) -> Bound:
    """Error bound of :func:`castling_core` computed in precision T.

    Stages (E in units of u_T, first order; |.| element-wise):
      q^ = q / D:   E(q^) = E(q)/D + |q^| (||E(q)||_2/D + d/2 + 2)                     (norm, quotient)
      kv = k^^T v:  E = E(k^)^T|v| + |k^|^T E(v) + N |k^|^T|v|; q^ kv likewise with d; (1/pi) x: + 2|.|
      order K > 0:  tensor-power features with their product errors, then the same two products.
      constant:     own 1/2 v exact; sum 1/2 sum_j v_j: + N/2 sum_j |v_j|.
      sparse:       logits E(L) as a product (+2|s q| for the rounded scale), softmax E(P) (see
                    _e_softmax_masked), kept weights' errors through P V; weights within u E(P) +
                    |eps - fl_T(eps)| of eps are ambiguous (the mask is discontinuous) and their whole
                    contribution sum_j P_ij |v_j| is admitted.
      output_l2:    as q^, with D = ||angular||, no eps (a zero row is NaN on both sides).
      similarity_sum: den = N/2 + F(q^) . sum_j F(k^_j) >= N (1/2 - 1/pi), quotient rule.
      conv:         conv(E(v), |w|) + k conv(|v|, |w|).
      each addition: + |result|.
    K = the sum of the stages' depths (reported in the note); Bound(scale = E/K, k = K).

    Parameters
    ----------
    q, k, v : (B, h, N, d) float (T-rounded).  cfg, conv_weight, conv_bias, training, hw : as
    :func:`castling_core`.  dtype : T.  err_q, err_k, err_v : error coefficients of q, k, v or None.

    Returns
    -------
    numerics.Bound with scale (B, h, N, d).
    """
    validation.check_config(cfg, CastlingConfig)
    q, k, v, sz = _check_qkv(q, k, v)
    _check_self_attention(q, k, v, sz, "castling_core_bound")
    _check_conv_weight(conv_weight, cfg, sz)
    z = np.zeros_like(q)
    eq = z if err_q is None else numerics.as_float(err_q, "err_q")
    ek = z if err_k is None else numerics.as_float(err_k, "err_k")
    ev = z if err_v is None else numerics.as_float(err_v, "err_v")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _, e, depth = _core_with_error(q, k, v, eq, ek, ev, cfg, conv_weight, conv_bias, training, hw, dtype)
    return numerics.running_bound(e, depth, f"castling core ({cfg.normaliser}, constant {cfg.constant}, order "
                                            f"{cfg.order}, sparse {cfg.sparse_active(training)})", dtype)


def castling_attention_stages(params: Mapping[str, Any], cfg: CastlingConfig, *, training: bool = False,
                              hw: tuple[int, int] | None = None) -> list[numerics.Stage]:
    """The stages of :func:`castling_attention`, for :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C) (the qkv projection's input); "qkv" (B, N, 3C); "core" (B, N, C),
    :func:`castling_core` with heads merged (the output projection's input); "proj" (B, N, C).

    References
    ----------
    Castling-ViT Eq. 1, 9-10; docs/design.md "Stages".
    """
    _check_params(params, cfg)
    conv_w, conv_b = params.get("dconv.weight"), params.get("dconv.bias")

    def merge(t):
        return t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], cfg.dim)

    def core(qkv):
        return merge(castling_core(*_split_heads(qkv, cfg.num_heads), cfg, conv_weight=conv_w, conv_bias=conv_b,
                                   training=training, hw=hw))

    def core_bound(qkv, dtype=None):
        b = castling_core_bound(*_split_heads(qkv, cfg.num_heads), cfg, dtype=dtype, conv_weight=conv_w,
                                conv_bias=conv_b, training=training, hw=hw)
        return b.relayout(merge)

    def lin(name, source, key):
        w, bias = params[key + ".weight"], params.get(key + ".bias")
        return numerics.Stage(name, (source,), lambda t: layers.linear(t, w, bias),
                              lambda t, dtype=None: layers.linear_bound(t, w, bias),
                              f"Castling-ViT Eq. 1: the {key} projection")

    return [lin("qkv", "x", "qkv"),
            numerics.Stage("core", ("qkv",), core, core_bound,
                           "Castling-ViT Eq. 9-10: linear-angular attention (+ the depthwise conv of V)"),
            lin("proj", "core", "proj")]


def castling_attention_bound(x: Any, params: Mapping[str, Any], cfg: CastlingConfig, *, dtype: Any,
                             training: bool = False, hw: tuple[int, int] | None = None) -> Bound:
    """Error bound of :func:`castling_attention` computed in precision T.

    qkv = x W^T (+ b) and the output projection by the calculus's linear rule (refimpl.bounds.e_linear, first
    order, Precision.coefficients(dtype) with the underflow term): E = E_x |W|^T + k (|x||W|^T + |b|) + C eta,
    k = sum_depth(C) + [bias] (Higham 3.12; the C-term sums accumulated in config.ACCUMULATION_FORMAT); the
    core as :func:`castling_core_bound` with the qkv errors.  K = both k + the core's depth.  First order; the
    exp/atan2 accuracy is assumed (config.ELEMENTARY_FUNCTION_ULPS).  Against the rule formerly written here
    (k = C + 1 for both maps, sums at u_T, (C + 1) eta), measured on 24 random layers x train / eval (C = 2 .. 16,
    both presets): the same bits with a qkv bias in float32 / float64; without one (the presets' default) new /
    old 0.85 .. 0.95 (the qkv sum has no bias add); float16 / bfloat16 new / old 0.075 .. 0.82, median 0.21.

    Parameters
    ----------
    x : (B, N, C) float (T-rounded); params : T-rounded parameters; cfg, training, hw : as
    :func:`castling_attention`; dtype : T.

    Returns
    -------
    numerics.Bound with scale (B, N, C).
    """
    validation.check_config(cfg, CastlingConfig)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B N C"), sizes={"C": cfg.dim})
    _check_params(params, cfg)
    c = cfg.dim
    w = numerics.as_float(params["qkv.weight"], "qkv.weight")
    bq = params.get("qkv.bias")
    qkv = layers.linear(x, w, bq)
    pr = bounds.Precision.coefficients(dtype, numerics.underflow_eta(dtype) / numerics.unit_roundoff(dtype))
    e_qkv = bounds.e_linear(x, np.zeros_like(x), w, bq, pr, flat=True)
    q, k, v = _split_heads(qkv, cfg.num_heads)
    eq, ek, ev = _split_heads(e_qkv, cfg.num_heads)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        heads, e_heads, depth = _core_with_error(q, k, v, eq, ek, ev, cfg, params.get("dconv.weight"),
                                                 params.get("dconv.bias"), training, hw, dtype)
        merged = heads.transpose(0, 2, 1, 3).reshape(x.shape)
        e_merged = e_heads.transpose(0, 2, 1, 3).reshape(x.shape)
        e = bounds.e_linear(merged, e_merged, numerics.as_float(params["proj.weight"], "proj.weight"),
                            numerics.as_float(params["proj.bias"], "proj.bias"), pr)
    depth += 2 * pr.sums(c) + (bq is not None) + 1
    return Bound(e / depth, depth, f"castling attention ({cfg.normaliser}, constant {cfg.constant}, order "
                                   f"{cfg.order}, conv {cfg.conv}, sparse {cfg.sparse_active(training)}): "
                                   f"first-order running error, k = qkv's + proj's + core depth = {depth:.6g}")
