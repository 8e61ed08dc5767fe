"""FLatten's mechanism: the configuration of the modules (:class:`FocusedConfig`), the focused function f_p and
the focused feature map phi_p (Eq. 6), focused linear attention (Eq. 4-5 with f_p; both association orders,
both normalisers, the optional shifted-window mask), the DWC branch (Eq. 10-12) with its resampling for sr > 1,
and the modules' core on projected tokens (APE on K, per-head features, attention, DWC, their sum).

Reference: D. Han, X. Pan, Y. Han, S. Song, G. Huang, "FLatten Transformer: Vision Transformer using Focused
Linear Attention", ICCV 2023 (../shared/seeds/001_f3b1223f03d702ca.txt), §4, Eq. 4-6 and 10-12.  Equation
numbers are the paper's; the mechanism, the presets and the numerics of f_p are stated in
:mod:`refimpl.attention.focused`.

Shapes: B batch, H x W token grid, N = H W query tokens, n key/value tokens, C channels, h heads, d = C / h
head dim.

Range safety (finite inputs of any magnitude: the finite result, or FloatingPointError naming the stage where
it is beyond float64; inside [2^-256, 2^256] the unscaled computation bit for bit) is
:mod:`refimpl.attention.focused_range`: f_p on rescaled rows, the attention with eps scaled along, the rows
whose normaliser underflowed recomputed from log-features, the DWC branch on rescaled values.

Layer: attention, the bottom of FLatten's three files: imports config, numerics, validation, backends (registers
feature_maps' f_p as the NumPy kernel of operation "focused_function"), feature_maps, layers, :mod:`.linear` and
:mod:`.focused_range`, nothing from :mod:`.focused_bounds` or :mod:`.focused`, which import it.  The public
names are re-exported by :mod:`refimpl.attention.focused`, their documented home.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from .. import backends, config, numerics, validation
from ..errors import ArgumentError, ParameterKeyError
from ..feature_maps import check_focusing_factor as _check_p
from ..feature_maps import focused_function as _focused_function_numpy
from ..layers import depthwise_conv2d
from ..validation import check_attention_order as _check_order  # also focused.py's, under this name
from .focused_range import RangeInfo, attend_rescaled, band_exponent, checked_sum, dwc_rescaled, log_focused, \
    recompute_rows
from .linear import kernelized_attention

__all__ = ["FocusedConfig", "focused_function", "focused_feature_map", "focused_attention", "resample_linear"]


# ===================================================================================================
# Configuration and presets
# ===================================================================================================

@dataclasses.dataclass(frozen=True)
class FocusedConfig:
    """Configuration of a focused linear attention module (FLatten §4.3).

    Attributes
    ----------
    dim : int, C.  num_heads : int, h (C % h == 0).
    p : float >= 1, the focusing factor (§5.6: p = 3 for all models; Table 5 ablates 2..32).
    kernel_size : odd int, the DWC kernel (the paper gives none; released default 5).
    sr_ratio : int >= 1, PVT's spatial reduction of K, V (global layout only).
    qkv_bias : bool, biases of the q / kv / qkv projections.
    layer_norm_eps : eps of the spatial-reduction LayerNorm (PyTorch default 1e-5).
    relu_eps, learnable_scale, norm_scope, positional_encoding, normaliser, eps, dwc_shared, dwc_resample,
    shift_mask : the departures of the released code, see the module docstring's table.
    power_scaling : "max" (stable, default) or "none" (x**p as written); equal in exact arithmetic.
    """

    dim: int
    num_heads: int
    p: float = config.FLATTEN_FOCUSING_FACTOR
    kernel_size: int = config.FLATTEN_DWC_KERNEL
    sr_ratio: int = 1
    qkv_bias: bool = True
    layer_norm_eps: float = config.LAYER_NORM_EPS
    relu_eps: float = 0.0
    learnable_scale: bool = False
    norm_scope: str = "head"
    positional_encoding: bool = False
    normaliser: str = "sum"
    eps: float = 0.0
    dwc_shared: bool = False
    dwc_resample: str = "bilinear"
    shift_mask: str = "apply"
    power_scaling: str = "max"

    def __post_init__(self) -> None:
        """Raises ArgumentError / ArgumentTypeError for dim, num_heads not integers >= 1 with C % h == 0, a focusing
        factor p that is not finite and >= 1, an even or non-positive DWC kernel, sr_ratio < 1, an option outside its
        choices, and relu_eps, eps, layer_norm_eps that are not finite and >= 0."""
        validation.check_heads(self.dim, self.num_heads)
        _check_p(self.p)
        numerics.check_positive_int(self.kernel_size, "kernel_size")
        if self.kernel_size % 2 == 0:
            raise ArgumentError(f"argument 'kernel_size': expected an odd size ('same' padding k // 2), "
                             f"got {self.kernel_size}")
        numerics.check_positive_int(self.sr_ratio, "sr_ratio")
        validation.check_config_options(self, {"norm_scope": ("head", "token"), "normaliser": ("sum", "mean_scaled"),
                                               "dwc_resample": ("bilinear", "linear_flat"),
                                               "shift_mask": ("apply", "ignore"), "power_scaling": ("max", "none")})
        for name in ("relu_eps", "eps", "layer_norm_eps"):
            validation.check_eps(getattr(self, name), name)            # finite, >= 0

    @property
    def head_dim(self) -> int:
        """d = C / h, the head dimension."""
        return self.dim // self.num_heads

    @classmethod
    def preset(cls, name: str = "paper", **overrides: Any) -> "FocusedConfig":
        """``"paper"``: Eq. 5-12 as written.  ``"official"``: the released modules' arithmetic (ReLU + 1e-6,
        / softplus(s) per channel, norms over all C channels, APE on K, n^-1/2-scaled K and V with the
        mean-of-keys normaliser + 1e-6, a DWC kernel bank shared by the heads, 1-D flat interpolation of V
        for sr > 1, the shift mask ignored).  ``overrides`` set any field (``dim`` and ``num_heads`` are
        required)."""
        if name == "paper":
            fields: dict[str, Any] = {}
        elif name == "official":
            fields = dict(relu_eps=config.FLATTEN_OFFICIAL_RELU_EPS, learnable_scale=True, norm_scope="token",
                          positional_encoding=True, normaliser="mean_scaled",
                          eps=config.FLATTEN_OFFICIAL_NORMALISER_EPS, dwc_shared=True,
                          dwc_resample="linear_flat", shift_mask="ignore")
        else:
            raise ArgumentError(f"argument 'name': expected 'paper' or 'official', got {name!r}")
        fields.update(overrides)
        return cls(**fields)


# ===================================================================================================
# The focused function (Eq. 6) (its error coefficient: focused_bounds)
# ===================================================================================================

def focused_function(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                     power_scaling: str = "max") -> np.ndarray:
    """The focused function f_p(x) = ||x|| / ||x**p|| * x**p along ``axis`` (FLatten Eq. 6).

    Parameters
    ----------
    x : float array (..., d), every entry >= 0 (f_p acts after the ReLU; NaN propagates).
    p : float >= 1, the focusing factor.
    axis : the feature axis (norms and powers are taken along it).
    power_scaling : "max" (default): evaluate on r = x / max(x) in [0, 1], f_p(x) = ||x|| r**p / ||r**p||,
        which is exactly f_p(x) (f_p is homogeneous of degree 1) and never overflows or gives 0/0 for
        large p; "none": x**p, ||x**p|| and ||x|| as written (overflows / underflows like the released code).

    Returns
    -------
    ndarray of x's shape, working precision.  f_p(0) = 0 (the limit; ||f_p(x)|| = ||x|| -> 0) with "max";
    0/0 = NaN with "none", as IEEE arithmetic says.

    This is operation "focused_function" of refimpl.backends: under a non-NumPy backend the Numba kernel
    (float32/float64 inputs), within :func:`focused_function_bound` of this definition; the default NumPy
    backend computes the definition, refimpl.feature_maps.focused_function.

    References
    ----------
    FLatten Eq. 6 (and Appendix Eq. 14, 18: ||f_p(x)|| = ||x||; Eq. 20-21: the max-normalised form).
    """
    x = numerics.as_float(x, "x")
    validation.check_axis(axis, x.ndim)          # before dispatch: every backend refuses the same axes
    return backends.call("focused_function", x, p, axis=axis, power_scaling=power_scaling)


#: The NumPy definition of f_p lives in refimpl.feature_maps (shared with operation "linear_attention"'s
#: "focused" map and the kernels); registered here as the NumPy kernel of operation "focused_function".
backends.register("focused_function", "numpy", _focused_function_numpy)


def focused_feature_map(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                        power_scaling: str = "max") -> np.ndarray:
    """phi_p(x) = f_p(ReLU(x)) (FLatten Eq. 6).

    x : float array (..., d), any sign.  Other arguments and the result as :func:`focused_function`.

    References
    ----------
    FLatten Eq. 5-6.
    """
    x = numerics.as_float(x, "x")
    return focused_function(numerics.relu(x), p, axis=axis, power_scaling=power_scaling)


# ===================================================================================================
# The attention core
# ===================================================================================================

def _attend_mean_scaled(phi_q, phi_k, v, *, order, eps, taps, max_elements):
    """The released normaliser: O = phi_q ((phi_k n^-1/2)^T (v n^-1/2)) / (phi_q . mean_j phi_k_j + eps).
    Equal to Eq. (4) with den + n eps in exact arithmetic.

    Range safety as in :func:`refimpl.attention.linear.kernelized_attention`: each row of phi_q, each head's
    phi_k and each value column is rescaled by the exact power of two of ``numerics.pow2_exponent`` (2^0, the
    unscaled computation bit for bit, inside the band), eps with the normaliser; taps are scaled back."""
    if taps is not None:
        taps.update(phi_q=phi_q, phi_k=phi_k)
    e_q = numerics.pow2_exponent(phi_q, axis=-1)                   # (B,h,N,1)
    e_k = numerics.pow2_exponent(phi_k, axis=(-2, -1))             # (B,h,1,1)
    e_v = numerics.pow2_exponent(v, axis=-2)                       # (B,h,1,e)
    phi_q, phi_k, v = np.ldexp(phi_q, -e_q), np.ldexp(phi_k, -e_k), np.ldexp(v, -e_v)
    e_qk = e_q + e_k
    with np.errstate(over="ignore"):
        eps_s = np.ldexp(phi_q.dtype.type(eps), -e_qk[..., 0]) if np.any(e_qk) else eps
    n = phi_k.shape[-2]
    r = n ** -0.5
    k_mean = np.mean(phi_k, axis=-2)                               # (B,h,d)
    den = np.einsum("bhnd,bhd->bhn", phi_q, k_mean) + eps_s
    if order == "linear":
        kv = (phi_k * r).swapaxes(-1, -2) @ (v * r)                # (B,h,d,e) = phi_k^T v / n
        num = phi_q @ kv
        scores = None
    else:
        _guard(phi_q.shape[0] * phi_q.shape[1] * phi_q.shape[2] * n, max_elements)
        scores = phi_q @ (phi_k * r).swapaxes(-1, -2)             # (B,h,N,n) = phi_q phi_k^T / sqrt n
        num = scores @ (v * r)
        kv = None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.ldexp(num / den[..., None], e_v)
    if taps is not None:
        with np.errstate(over="ignore"):
            taps.update(k_mean=np.ldexp(k_mean, e_k[..., 0]), numerator=np.ldexp(num, e_qk + e_v),
                        denominator=np.ldexp(den, e_qk[..., 0]))
            if kv is not None:
                taps["kv"] = np.ldexp(kv, e_k + e_v)
        if scores is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                taps["attn"] = scores * r / den[..., None]
    return out


def _guard(elements: int, max_elements: int | None) -> None:
    limit = config.QUADRATIC_MAX_ELEMENTS if max_elements is None else max_elements
    if elements > limit:
        raise ArgumentError(f"focused attention (order='quadratic'): the N x n attention matrix would have "
                         f"B*h*N*n = {elements} elements, above max_elements = {limit} "
                         f"(config.QUADRATIC_MAX_ELEMENTS); use order='linear', which never forms it")


_STAGE = "focused attention: output phi_p(Q) KV / normaliser"


def _attend_unmasked(phi_q, phi_k, v, *, normaliser, eps, order, taps, max_elements, rng=None):
    """One group's normalised attention.  ``rng``: None (power_scaling "none": as written), or the
    :class:`focused_range.RangeInfo` of features computed on rescaled pre-features (phi_q = phi(Q) 2^-e_q,
    phi_k = phi(K) 2^-e_k): with every exponent 0, V's columns included (inside the band), the unscaled
    computation bit for bit, else :func:`focused_range.attend_rescaled`; then the live rows whose normaliser
    underflowed are recomputed from log-features (:func:`focused_range.recompute_rows`)."""
    if rng is not None and (rng.scaled or np.any(band_exponent(v, -2))):
        if order == "quadratic":
            _guard(phi_q.shape[0] * phi_q.shape[1] * phi_q.shape[2] * phi_k.shape[2], max_elements)
        out = attend_rescaled(phi_q, phi_k, v, rng.e_q, rng.e_k, normaliser=normaliser, eps=eps, order=order,
                              taps=taps, stage=_STAGE)
    elif normaliser == "sum":
        out = kernelized_attention(phi_q, phi_k, v, order=order, eps=eps, eps_policy="add", taps=taps,
                                   max_elements=max_elements)
    else:
        out = _attend_mean_scaled(phi_q, phi_k, v, order=order, eps=eps, taps=taps, max_elements=max_elements)
    if rng is None:
        return out
    return recompute_rows(out, phi_q, phi_k, v, rng, eps=eps, normaliser=normaliser, stage=_STAGE)


def _mask_groups(mask_w: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Queries with identical mask rows share one key set: [(query indices, allowed key indices), ...].
    For Swin's mask (regions) there are at most 4 groups per window, so the masked linear order stays
    linear."""
    rows, inverse = np.unique(mask_w, axis=0, return_inverse=True)
    return [(np.flatnonzero(inverse.ravel() == g), np.flatnonzero(rows[g])) for g in range(rows.shape[0])]


def _attend(phi_q, phi_k, v, *, normaliser, eps, order, mask, taps, max_elements, rng=None):
    """Normalised phi_q phi_k^T v (Eq. 4 / the released normaliser), optionally restricted by a boolean
    window mask (nW, N, n) whose windows are interleaved in the batch as b * nW + w (window_partition).
    ``rng``: see :func:`_attend_unmasked` (restricted to each mask group)."""
    if mask is None:
        return _attend_unmasked(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order=order, taps=taps,
                                max_elements=max_elements, rng=rng)
    nw = mask.shape[0]
    out = np.empty(phi_q.shape[:-1] + (v.shape[-1],), dtype=np.result_type(phi_q, v))
    den = np.empty(phi_q.shape[:-1], dtype=out.dtype)
    for w in range(nw):
        for qi, kj in _mask_groups(mask[w]):
            sub: dict | None = {} if taps is not None else None
            out[w::nw, :, qi] = _attend_unmasked(phi_q[w::nw, :, qi], phi_k[w::nw, :, kj], v[w::nw, :, kj],
                                                 normaliser=normaliser, eps=eps, order=order, taps=sub,
                                                 max_elements=max_elements,
                                                 rng=None if rng is None else rng.sub(w, nw, qi, kj))
            if sub is not None:
                den[w::nw, :, qi] = sub["denominator"]
    if taps is not None:
        taps.update(phi_q=phi_q, phi_k=phi_k, denominator=den, numerator=out * den[..., None])
    return out


def _fused_kernel_applies(*, order: str, normaliser: str, power_scaling: str, mask: Any, taps: dict | None) -> bool:
    """Whether the attention term is exactly what operation "linear_attention" with the "focused" map
    computes (FLatten Eq. 4-6: f_p per head row in the max-scaled form, linear order, normaliser "sum"
    + eps, no mask): then it goes through ``backends.call`` with the NumPy path as ``otherwise`` (the
    default NumPy backend, and every call the kernels' predicates refuse, keep the NumPy path's bits).
    Taps need the NumPy intermediates."""
    return order == "linear" and normaliser == "sum" and power_scaling == "max" and mask is None and taps is None


#: Below this product of a head's smallest query-row maximum, its key maximum and its smallest value-column
#: maximum (each group's largest feature is within sqrt(d) of its largest pre-feature), products of features
#: and values may fall below the normal range; below _KERNEL_TINY_ROW a row's (or a head's keys') features
#: themselves are rounded to the subnormal grid: the fused kernel, which computes without rescaling, loses
#: precision there, so such calls take the definition (focused_range rescales them exactly).
_KERNEL_TINY = 2.0 ** -990
_KERNEL_TINY_ROW = 2.0 ** -960


def _kernel_unsafe(a_q: np.ndarray, a_k: np.ndarray, v: np.ndarray, heads: int | None = None,
                   pre: Any = None) -> bool:
    """Whether a call must skip the fused kernel for the NumPy definition: a head whose smallest query-row
    maximum or key maximum is below 2^-960 (features on the subnormal grid), or whose smallest query-row
    maximum times its key maximum (times its smallest value-column maximum, where below 1) is below 2^-990
    (subnormal products; a group above 2^256 counts as 1: the kernel's wrapper answers there with the
    definition of operation "linear_attention", which rescales it into [1/2, 1)).  ``heads``: a_q, a_k token-major, split here.
    ``pre``: a non-decreasing entrywise map the features start with (ReLU), applied here to the maxima instead of
    to every entry: max pre(x) = pre(max x), bit for bit (rounding is monotone too; NaN propagates either way)."""
    if heads is not None:
        a_q, a_k = _split_heads(a_q, heads), _split_heads(a_k, heads)
    big = 2.0 ** config.RANGE_RESCALE_EXPONENT

    def eff(m):      # a group above 2^B is rescaled to [1/2, 1) by the wrapper's fallback (numerics.pow2_exponent)
        return np.where(m > big, 1.0, np.where(m > 0, m, np.inf))
    with np.errstate(invalid="ignore", under="ignore"):
        mq, mk = np.max(a_q, axis=-1), np.max(a_k, axis=(-2, -1))
        if pre is not None:
            mq, mk = pre(mq), pre(mk)
        qm = np.min(eff(mq), axis=-1)                                         # (B, h)
        km = eff(mk)
        vm = np.minimum(np.min(eff(np.max(np.abs(v), axis=-2)), axis=-1), 1.0)
        return bool(np.any(qm * km * vm < _KERNEL_TINY) or np.any(np.minimum(qm, km) < _KERNEL_TINY_ROW))


def _repaired(call: Any, numpy_path: Any) -> np.ndarray:
    """The fused kernel's result (``call()``) with every NaN or Inf replaced by the definition's value
    (computed only then), and the definition's result where the kernel's wrapper raised FloatingPointError
    (its fallback, the definition of operation "linear_attention", computes f_p without rescaling, which
    overflows near 2^1023): a row whose normaliser underflowed, or a feature that overflowed, is computed by
    this definition (focused_range), whose attention term is always finite."""
    try:
        att = call()
    except FloatingPointError:
        return numpy_path()
    if np.all(np.isfinite(att)):
        return att
    return np.where(np.isfinite(att), att, numpy_path())


def focused_attention(q: Any, k: Any, v: Any, *, p: float = config.FLATTEN_FOCUSING_FACTOR,
                      hw: tuple[int, int] | None = None, dwc_weight: Any = None, dwc_bias: Any = None,
                      order: str = "linear", eps: float = 0.0, normaliser: str = "sum",
                      power_scaling: str = "max", taps: dict | None = None,
                      max_elements: int | None = None) -> np.ndarray:
    """Focused linear attention on per-head arrays (FLatten Eq. 5-6 with Eq. 4, plus Eq. 10-12's DWC).

        O = [phi_p(Q) phi_p(K)^T V] / [phi_p(Q) sum_j phi_p(K_j)]  +  DWC(V)

    Parameters
    ----------
    q : float array (B, h, N, d), pre-activation queries.  k : (B, h, n, d).  v : (B, h, n, e).
    p : focusing factor >= 1.
    hw : (H, W) token grid of V (n = H W), required with ``dwc_weight``.
    dwc_weight : float array (h e, 1, k, k) (one kernel per channel, channel index head * e + c) or
        (e, 1, k, k) (one bank shared by the heads), odd k; None: no DWC branch (Eq. 5 + 4 only).
    dwc_bias : (h e,) / (e,) or None.
    order : "linear" (phi_k^T V first, O(n d e)) or "quadratic" (forms N x n; guarded by ``max_elements``).
    eps : added to the normaliser (0: Eq. 4 exactly; an all-dead query then gives 0/0 = NaN).
    normaliser : "sum" (Eq. 4) or "mean_scaled" (the released form, see :class:`FocusedConfig`).
    power_scaling : see :func:`focused_function`.
    taps : dict or None; records "phi_q", "phi_k" (B,h,*,d), "kv" (linear order), "scores"/"attn"
        (quadratic order), "numerator", "denominator", "attention" (the normalised term, B,h,N,e) and,
        with a DWC, "dwc" (B,h,N,e).

    Returns
    -------
    ndarray (B, h, N, e), working precision.

    Backends: under ``refimpl.backends.use("c")`` (any non-NumPy backend) the attention term of the
    linear order with normaliser "sum", power_scaling "max", no taps and one float32/float64 dtype runs
    in the fused C kernel (operation "linear_attention", ``feature_map="focused"``: f_p, KV, key sum and
    outputs in two passes; ckernels/linattn_body.h), within :func:`focused_attention_bound` of this
    definition; the DWC branch goes through ``layers.depthwise_conv2d``'s own dispatch.  Every other
    configuration, and the default NumPy backend, computes the definition; so does a call with products
    below 2^-990 (:func:`_kernel_unsafe`), and a NaN or Inf of the kernel is replaced by the definition's value.

    Range (:mod:`refimpl.attention.focused_range`; power_scaling "max"): finite inputs of any magnitude give
    the finite result (NaN only in a dead row with eps = 0, 0/0 exactly), or FloatingPointError naming the
    DWC branch or the attention + DWC sum where that is beyond float64; inside [2^-256, 2^256] the unscaled
    computation bit for bit.

    References
    ----------
    FLatten Eq. 4-6 and 10-12.
    """
    validation.check_max_elements(max_elements)
    validation.check_eps(eps)
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h n d"), v=(v, "B h n e"))
    _check_order(order)
    if normaliser not in ("sum", "mean_scaled"):
        raise ArgumentError(f"argument 'normaliser': expected 'sum' or 'mean_scaled', got {normaliser!r}")
    def numpy_path() -> np.ndarray:
        if power_scaling != "max":
            phi_q = focused_feature_map(q, p, power_scaling=power_scaling)
            phi_k = focused_feature_map(k, p, power_scaling=power_scaling)
            return _attend(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order=order, mask=None, taps=taps,
                           max_elements=max_elements)
        phi_q, phi_k, rng = _range_features(numerics.relu(q), numerics.relu(k), _check_p(p), None)
        return _attend(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order=order, mask=None, taps=taps,
                       max_elements=max_elements, rng=rng)

    if _fused_kernel_applies(order=order, normaliser=normaliser, power_scaling=power_scaling, mask=None, taps=taps) \
            and not _kernel_unsafe(q, k, v, pre=numerics.relu):
        att = _repaired(lambda: backends.call("linear_attention", q, k, v, "focused", eps, "add", None,
                                              _check_p(p), otherwise=numpy_path), numpy_path)
    else:
        att = numpy_path()
    if taps is not None:
        taps["attention"] = att
    if dwc_weight is None:
        return att
    if hw is None:
        raise ArgumentError("argument 'hw': the DWC branch needs the (H, W) grid of V")
    hw = validation.check_grid(hw, sz["n"], tokens="v")
    _check_dwc_args(dwc_weight, dwc_bias, sz)
    dwc_weight = numerics.as_float(dwc_weight, "dwc_weight")
    shared = dwc_weight.shape[0] == sz["e"] and sz["h"] > 1
    dwc = _dwc(v, tuple(hw), tuple(hw), dwc_weight, None if dwc_bias is None else
               numerics.as_float(dwc_bias, "dwc_bias"), shared, "bilinear")
    if taps is not None:
        taps["dwc"] = dwc
    return checked_sum(att, dwc, "focused attention: attention + DWC")


# ===================================================================================================
# The DWC branch (Eq. 10-12) and its resampling for sr > 1
# ===================================================================================================

def _resample_plan(n_in: int, n_out: int):
    """Source indices and weights of PyTorch's linear interpolation with align_corners=False:
    src = max((i + 1/2) n_in / n_out - 1/2, 0), i0 = floor(src), i1 = min(i0 + 1, n_in - 1),
    lambda = src - i0; out_i = (1 - lambda) x[i0] + lambda x[i1]."""
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return src, i0, i1, src - i0


def resample_linear(x: Any, size: int, axis: int = -1) -> np.ndarray:
    """1-D linear interpolation to ``size`` samples along ``axis``, half-pixel convention
    (torch.nn.functional.interpolate(mode="linear" / "bilinear", align_corners=False) per axis).

    x : float array; size : int >= 1.  Returns x with ``axis`` resized.  Used for V's DWC input when the
    keys were spatially reduced (PVT, sr > 1): along the flattened tokens ("linear_flat", the released
    code) or separably along H and W ("bilinear").

    References
    ----------
    FLatten Eq. 10-12 (DWC(V) needs V on the N-token grid); PyTorch's upsample convention.
    """
    x = numerics.as_float(x, "x")
    size = numerics.check_positive_int(size, "size")
    ax = validation.check_axis(axis, x.ndim)
    _, i0, i1, lam = _resample_plan(x.shape[ax], size)
    lam = lam.astype(x.dtype)
    shape = [1] * x.ndim
    shape[ax] = size
    lam = lam.reshape(shape)
    return np.take(x, i0, axis=ax) * (1 - lam) + np.take(x, i1, axis=ax) * lam


def _to_grid(v: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(B, h, n, e) with n = H W (row-major) -> (B, h, H, W, e)."""
    return v.reshape(v.shape[:2] + tuple(hw) + v.shape[-1:])


def _resample_v(v: np.ndarray, hw_in: tuple[int, int], hw_out: tuple[int, int], how: str) -> np.ndarray:
    """V on the reduced grid hw_in -> V on the query grid hw_out, (B, h, n, e) -> (B, h, N, e)."""
    if tuple(hw_in) == tuple(hw_out):
        return v
    if how == "linear_flat":
        return resample_linear(v, hw_out[0] * hw_out[1], axis=2)
    g = _to_grid(v, hw_in)
    g = resample_linear(resample_linear(g, hw_out[0], axis=2), hw_out[1], axis=3)
    return g.reshape(v.shape[:2] + (hw_out[0] * hw_out[1],) + v.shape[-1:])


def _check_dwc_args(dwc_weight: Any, dwc_bias: Any, sz: Mapping[str, int]) -> None:
    """dwc_weight (h e or e, 1, k, k) and dwc_bias (its channels,) or None, checked under the caller's names."""
    w = numerics.as_float(dwc_weight, "dwc_weight")
    numerics.check_shapes(dwc_weight=(w, "C 1 k k"))
    if w.shape[0] not in (sz["h"] * sz["e"], sz["e"]):
        raise ArgumentError(f"argument 'dwc_weight': expected shape ({sz['h'] * sz['e']}, 1, k, k) (one kernel per "
                            f"channel h e of 'v') or ({sz['e']}, 1, k, k) (a bank shared by the heads), got {w.shape}")
    if dwc_bias is not None:
        b = numerics.as_float(dwc_bias, "dwc_bias")
        numerics.check_shapes(dwc_bias=(b, "C"), sizes={"C": w.shape[0]})


def _dwc(v, hw_v, hw_out, weight, bias, shared, resample):
    """DWC(V): V (B, h, n, e) on grid hw_v, resampled to hw_out, depthwise k x k conv ('same' zero
    padding) per channel; ``shared``: one e-channel bank applied to every head.  Returns (B, h, N, e)."""
    b, h, _, e = v.shape
    big_h, big_w = hw_out
    kk = weight.shape[-1]
    if shared and weight.shape[0] != e:
        raise ArgumentError(f"argument 'dwc.weight': a shared bank needs shape ({e}, 1, k, k), got {weight.shape}")
    if not shared and weight.shape[0] != h * e:
        raise ArgumentError(f"argument 'dwc.weight': expected shape ({h * e}, 1, k, k) (one kernel per "
                            f"channel), got {weight.shape}")

    def conv(vv, bb):
        g = _to_grid(_resample_v(vv, hw_v, hw_out, resample), hw_out).transpose(0, 1, 4, 2, 3)   # (B,h,e,H,W)
        g = g.reshape(b * h, e, big_h, big_w) if shared else g.reshape(b, h * e, big_h, big_w)
        out = depthwise_conv2d(g, weight, bb, padding=kk // 2)
        return out.reshape(b, h, e, big_h * big_w).swapaxes(-1, -2)

    if not np.any(band_exponent(v, -2)):
        return conv(v, bias)
    # V beyond the band (range safety, focused_range): the resampling and the convolution are linear in each
    # column of V, so they run on V 2^-e_v and are scaled back, then the bias
    bias_add = 0.0 if bias is None else (np.asarray(bias).reshape(e, 1) if shared else
                                         np.asarray(bias).reshape(h, e, 1)).swapaxes(-1, -2)
    return dwc_rescaled(v, lambda vs: conv(vs, None), bias_add, "focused attention: DWC branch")


# ===================================================================================================
# The modules' core on projected tokens: parameters, heads, features, attention and DWC
# ===================================================================================================

def _p(params: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in params:
        raise ParameterKeyError(f"focused attention: missing parameter '{key}'")
    return numerics.as_float(params[key], key)


def _split_heads(t: np.ndarray, h: int) -> np.ndarray:
    """(B, n, C) -> (B, h, n, C / h), channel index = head * d + c."""
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(0, 2, 1, 3)


def _merge_heads(t: np.ndarray) -> np.ndarray:
    b, h, n, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _pre_features(t: np.ndarray, params: Mapping[str, Any], cfg: FocusedConfig) -> np.ndarray:
    """ReLU(t) (+ relu_eps) (/ softplus(scale)): the input of f_p, token-major (B, n, C)."""
    a = numerics.relu(t)
    if cfg.relu_eps:
        a = a + cfg.relu_eps
    if cfg.learnable_scale:
        a = a / numerics.softplus(_p(params, "scale"))
    return a


def _pre_features_scaled(t: np.ndarray, params: Mapping[str, Any], cfg: FocusedConfig, keys: bool):
    """(a 2^-e, e, log a) for the pre-features a = (ReLU(t) + relu_eps) / softplus(s) (:func:`_pre_features`),
    token-major: e = focused_range.band_exponent of ReLU(t) + relu_eps per token (``keys``: over all tokens of
    a batch element), applied before the division by softplus(s), which would overflow a projection near
    2^1023 where softplus(s) < 1; inside the band e = 0 and a is :func:`_pre_features`' bits.  log a (a
    callable) is log(ReLU(t) + relu_eps) - log softplus(s), without the overflow."""
    b = numerics.relu(t)
    if cfg.relu_eps:
        b = b + cfg.relu_eps
    e = band_exponent(b, (-2, -1) if keys else -1)
    a = np.ldexp(b, -e) if np.any(e) else b
    sp = numerics.softplus(_p(params, "scale")) if cfg.learnable_scale else None
    if sp is not None:
        a = a / sp

    def logs():
        with np.errstate(divide="ignore"):
            return np.log(b) - (0.0 if sp is None else np.log(sp))
    return a, e, logs


def _features(t: np.ndarray, params: Mapping[str, Any], cfg: FocusedConfig) -> np.ndarray:
    """phi_p of the token-major projections (B, n, C) -> (B, h, n, d), per the config's norm scope."""
    a = _pre_features(t, params, cfg)
    if cfg.norm_scope == "token":
        return _split_heads(focused_function(a, cfg.p, power_scaling=cfg.power_scaling), cfg.num_heads)
    return focused_function(_split_heads(a, cfg.num_heads), cfg.p, power_scaling=cfg.power_scaling)


def _range_features(a_q: np.ndarray, a_k: np.ndarray, p: float, heads: int | None, fp: Any = None,
                    pre: tuple | None = None):
    """(phi_q, phi_k, RangeInfo) of the pre-features a_q, a_k (>= 0; head-split (B, h, *, d), or token-major
    (B, *, C) with f_p's norms over all C channels and ``heads`` the head count to split into afterwards): each
    query row and each head's keys (all keys of a batch element for the token scope, whose rows span the
    heads) rescaled by focused_range.band_exponent before f_p (power_scaling "max"), which is exact (f_p is
    homogeneous of degree 1) and the identity inside the band.  ``fp``: f_p (default the dispatching
    :func:`focused_function`; the bounds pass the NumPy definition).  ``pre``: None, or ((e_q, e_k), (lq, lk))
    when a_q, a_k are the pre-features times 2^-e_q, 2^-e_k already (:func:`_pre_features_scaled`, exponents in
    a_q's layout) and lq(), lk() give their logarithms in the original units (the log pre-features)."""
    fp = (lambda a, p, power_scaling: focused_function(a, p, power_scaling=power_scaling)) if fp is None else fp

    def split(t):
        return t if heads is None else _split_heads(t, heads)

    def head_axes(e):
        return e if heads is None else e[:, None]

    e_q, e_k = band_exponent(a_q, -1), band_exponent(a_k, (-2, -1))
    phi_q = fp(np.ldexp(a_q, -e_q) if np.any(e_q) else a_q, p, power_scaling="max")
    phi_k = fp(np.ldexp(a_k, -e_k) if np.any(e_k) else a_k, p, power_scaling="max")
    if pre is None:
        def logs():
            with np.errstate(divide="ignore"):
                return np.log(a_q), np.log(a_k)
    else:
        (e0_q, e0_k), (lq, lk) = pre
        e_q, e_k = e_q + e0_q, e_k + e0_k

        def logs():
            return lq(), lk()
    info = RangeInfo(head_axes(e_q), head_axes(e_k), split(a_q), split(a_k),
                     lambda: tuple(split(log_focused(la, p)) for la in logs()), p)
    return split(phi_q), split(phi_k), info


def _scaled_features(q, k, params, cfg, fp=None):
    """:func:`_range_features` of the projections q, k (B, *, C) per the config's norm scope, on the pre-features
    of :func:`_pre_features_scaled`."""
    (aq, eq, lq), (ak, ek, lk) = (_pre_features_scaled(q, params, cfg, False),
                                  _pre_features_scaled(k, params, cfg, True))
    h = cfg.num_heads
    if cfg.norm_scope == "token":
        return _range_features(aq, ak, cfg.p, h, fp, pre=((eq, ek), (lq, lk)))
    return _range_features(_split_heads(aq, h), _split_heads(ak, h), cfg.p, None, fp,
                           pre=((eq[:, None], ek[:, None]), (lambda: _split_heads(lq(), h),
                                                             lambda: _split_heads(lk(), h))))


def _core(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements):
    """APE on K, features, attention, DWC and their sum (B, N, C): everything between the projections."""
    if cfg.positional_encoding:
        pe = _p(params, "positional_encoding")
        if pe.shape != (1,) + k.shape[1:]:
            raise ArgumentError(f"argument 'positional_encoding': expected shape {(1,) + k.shape[1:]}, got {pe.shape}")
        k = k + pe
    vh = _split_heads(v, cfg.num_heads)

    def numpy_path() -> np.ndarray:
        if cfg.power_scaling != "max":
            phi_q = _features(q, params, cfg)
            phi_k = _features(k, params, cfg)
            return _attend(phi_q, phi_k, vh, normaliser=cfg.normaliser, eps=cfg.eps, order=order, mask=mask,
                           taps=taps, max_elements=max_elements)
        phi_q, phi_k, rng = _scaled_features(q, k, params, cfg)
        return _attend(phi_q, phi_k, vh, normaliser=cfg.normaliser, eps=cfg.eps, order=order, mask=mask,
                       taps=taps, max_elements=max_elements, rng=rng)

    fused = cfg.norm_scope == "head" and _fused_kernel_applies(order=order, normaliser=cfg.normaliser,
                                                               power_scaling=cfg.power_scaling, mask=mask, taps=taps)
    pq = _pre_features(q, params, cfg) if fused else None      # formed once: the range test and the kernel's input
    pk = _pre_features(k, params, cfg) if fused else None
    if fused and not _kernel_unsafe(pq, pk, vh, cfg.num_heads):
        # The fused kernel applies ReLU then f_p per head row: the pre-features (ReLU (+ relu_eps)
        # (/ softplus(scale))) are >= 0 or NaN, on which its ReLU is the identity, so phi_p of the kernel
        # equals _features' focused_function of them (FLatten Eq. 6 per head).
        h = cfg.num_heads
        aq, ak = _split_heads(pq, h), _split_heads(pk, h)
        att = _repaired(lambda: backends.call("linear_attention", aq, ak, vh, "focused", cfg.eps, "add", None,
                                              cfg.p, otherwise=numpy_path), numpy_path)
    else:
        att = numpy_path()
    dwc = _dwc(vh, hw_kv, hw_q, _p(params, "dwc.weight"), params.get("dwc.bias"), cfg.dwc_shared,
               cfg.dwc_resample)
    y = _merge_heads(checked_sum(att, dwc, "focused attention: attention + DWC"))
    if taps is not None:
        taps.update(k_pe=k, attention=att, dwc=dwc, pre_proj=y)
    return y
