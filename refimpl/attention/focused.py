"""FLatten: focused linear attention (Han et al., "FLatten Transformer", ICCV 2023) - the NumPy reference.

Shapes used throughout:
    B batch, H x W token grid, N = H W query tokens, n key/value tokens (n = N, or (H // sr)(W // sr) with
    PVT's spatial reduction sr > 1), C channels, h heads, d = C / h head dim, (wh, ww) a window, nW windows.

The mechanism (FLatten §4):

    phi_p(x) = f_p(ReLU(x)),   f_p(x) = ||x|| / ||x**p|| * x**p                                   (Eq. 6)
    O = phi_p(Q) phi_p(K)^T V  (row-normalised as Eq. 4)  +  DWC(V)                          (Eq. 10-12)

f_p keeps the norm (||f_p(x)|| = ||x||, Appendix Eq. 18) and only turns the direction towards the nearest
axis (Proposition 1).  It is homogeneous of degree 1, f_p(c x) = c f_p(x) for c > 0, so it may be evaluated
on x / max(x), whose entries lie in [0, 1]: the power can then neither overflow nor make ||x**p|| underflow
to 0 (which would give 0/0 for any large p), while the exact result is unchanged.  That is the default
``power_scaling="max"``; ``"none"`` evaluates x**p as written (and as the released code does).

Contents, top to bottom: configuration and presets; the focused function and its error coefficient; the
attention core (both association orders, both normalisers, the optional shifted-window mask); the DWC
branch with its resampling for sr > 1; the modules for the DeiT/PVT layout (:func:`focused_linear_attention`)
and the Swin layout (:func:`focused_window_attention`); parameter shapes and initialisation; the error model
(running first-order error bounds of every public function).

Presets (:meth:`FocusedConfig.preset`): "paper" (the equations; the default) and "official" (what the
authors' released modules compute).  Each departure is one named field of :class:`FocusedConfig`:

=========================  ===================  ======================================================
field                      paper                official
=========================  ===================  ======================================================
relu_eps                   0                    1e-6 added to ReLU(q), ReLU(k)
learnable_scale            False                features divided by softplus(s), s per channel ("scale")
norm_scope                 "head"               "token": f_p's two norms over all C channels, before
                                                the head split
positional_encoding        False                learnable absolute encoding added to K only
normaliser                 "sum"                "mean_scaled": K and V scaled by n^-1/2 each, normaliser
                                                q . mean_j(k_j) + 1e-6
eps                        0                    1e-6 (on the mean-of-keys normaliser)
dwc_shared                 False (C kernels)    True: one d-channel kernel bank shared by all heads
dwc_resample (sr > 1)      "bilinear"           "linear_flat": 1-D linear interpolation of V along the
                                                flattened token order (half-pixel convention)
shift_mask                 "apply"              "ignore": the shifted-window mask is not used
=========================  ===================  ======================================================

Both presets use ``power_scaling="max"`` (equal to the released x**p in exact arithmetic; see
docs/flatten.md for the overflow and 0/0 that x**p causes in float16 and, for large p, in float32).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

from .. import backends, config, numerics, validation
from ..errors import ArgumentError, ArgumentTypeError, ParameterKeyError
from ..feature_maps import check_focusing_factor as _check_p
from ..feature_maps import focused_function as _focused_function_numpy
from ..feature_maps import norm_scaled as _norm_scaled
from ..layers import conv2d, conv2d_bound, depthwise_conv2d, depthwise_conv2d_bound, layer_norm, layer_norm_bound, linear, linear_bound, \
    shifted_window_mask, window_partition, window_reverse
from .linear import apply_normaliser, kernelized_attention, kernelized_attention_bound

__all__ = [
    "FocusedConfig", "focused_function", "focused_feature_map", "focused_function_error", "focused_function_bound",
    "focused_attention", "focused_linear_attention", "focused_window_attention", "resample_linear",
    "resample_linear_bound",
    "focused_param_shapes", "init_focused_params", "focused_attention_bound",
    "focused_linear_attention_bound", "focused_window_attention_bound",
]

_ORDERS = ("linear", "quadratic")


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
        numerics.check_positive_int(self.dim, "dim")
        numerics.check_positive_int(self.num_heads, "num_heads")
        if self.dim % self.num_heads:
            raise ArgumentError(f"argument 'dim': {self.dim} is not divisible by num_heads={self.num_heads}")
        _check_p(self.p)
        numerics.check_positive_int(self.kernel_size, "kernel_size")
        if self.kernel_size % 2 == 0:
            raise ArgumentError(f"argument 'kernel_size': expected an odd size ('same' padding k // 2), "
                             f"got {self.kernel_size}")
        numerics.check_positive_int(self.sr_ratio, "sr_ratio")
        for name, allowed in (("norm_scope", ("head", "token")), ("normaliser", ("sum", "mean_scaled")),
                              ("dwc_resample", ("bilinear", "linear_flat")),
                              ("shift_mask", ("apply", "ignore")), ("power_scaling", ("max", "none"))):
            if getattr(self, name) not in allowed:
                raise ArgumentError(f"argument '{name}': expected one of {allowed}, got {getattr(self, name)!r}")
        for name in ("relu_eps", "eps", "layer_norm_eps"):
            validation.check_eps(getattr(self, name), name)            # finite, >= 0

    @property
    def head_dim(self) -> int:
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


def _check_order(order: str) -> None:
    if order not in _ORDERS:
        raise ArgumentError(f"argument 'order': expected 'linear' or 'quadratic', got {order!r}")


# ===================================================================================================
# The focused function (Eq. 6) and its error coefficient
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


def _eta_in_u(dtype: Any) -> float:
    """eta_T / u_T: Higham's absolute underflow error per rounding (eq. 2.8; half the smallest subnormal) in
    units of u_T, formed without underflowing (2^-1022 for float64, 2^-126 for float32 and bfloat16, 2^-14
    for float16); 0 for dtype None.  (numerics.underflow_eta("float64") itself evaluates to 0.0.)"""
    if dtype is None:
        return 0.0
    name = numerics.format_name(dtype)         # torch or NumPy dtypes, or their names; else a named error
    tiny = {"float64": 2.0 ** -1074, "float32": 2.0 ** -149, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}[name]
    return tiny / numerics.unit_roundoff(name) / 2.0


def focused_function_error(x: Any, p: float, err_x: Any = None, *, axis: int = -1, dtype: Any = None,
                           l2: bool = False) -> np.ndarray:
    """Error coefficient E of f_p: |fl_T(f_p(x~)) - f_p(x)| <= u_T E to first order in u_T, where x~ is x
    with absolute errors <= u_T err_x (err_x None: x exact).

    Derivation.  Write g = x**p / ||x**p|| (a unit vector, homogeneous of degree 0) so f = ||x|| g, and
    A_j = p x_j**(p-1) / ||x**p|| = p r_j**(p-1) / (m ||r**p||) with m = max x, r = x / m.  The Jacobian is
    df_i/dx_j = g_i x_j / ||x|| + ||x|| (A_i delta_ij - g_i A_j g_j), so input errors contribute

        g_i (x . err_x) / ||x||  +  ||x|| (A_i err_x_i + g_i sum_j A_j g_j err_x_j).

    ||x|| A_i <= p ||x|| / m <= p sqrt(d): f_p amplifies input errors by up to p sqrt(d), which is its honest
    condition number.  Rounding of the evaluation itself (either ``power_scaling``): r or x**p carries a
    relative error (p + c + 1) u (c = config.ELEMENTARY_FUNCTION_ULPS for pow, p from the argument's own
    rounding), the two norms (d + 2) u and (p + c + d + 3) u, the final product and quotient 2 u:
    (2 p + 2 c + 2 d + 8) f_i in all.  A zero vector x = 0 maps to 0 and f(0 + delta) has norm ||delta||,
    so there E = ||err_x||_2.  Underflow (``dtype`` given): r**p and the quotient t / ||t|| may fall into
    T's subnormal range (large p), each of their p + c + 4 roundings adding up to eta_T absolutely, scaled by
    ||x|| / ||t|| <= ||x|| (||t|| >= 1, its largest entry is 1): (p + c + 4) ||x|| eta_T / u_T.  First
    order: not rigorous when p u err_x / m is not small (a token whose features are all at rounding level).

    ``l2``: the probabilistic coefficient (numerics.Bound's sigma) instead: the input coefficients propagate
    through the same Jacobian bound, and the evaluation's own roundings count sqrt(M K) f_i instead of K f_i,
    K = 2 p + 2 c + 2 d + 8 their l1 count (the norms' sums by numerics.sum_depth_l2) and M = max(p, c, 1) the
    largest single coefficient (r's rounding is raised to the power p; pow errs by c ulps at once), since
    sum_r c_r^2 <= max |c_r| sum_r |c_r|; the underflow term is kept at its l1 size.

    Parameters
    ----------
    x : float array (..., d) >= 0, the exact (reference) input.  p : float >= 1.
    err_x : float array of x's shape >= 0 or None.  axis : the feature axis.
    dtype : the tested precision T (adds the underflow term) or None.

    Returns
    -------
    ndarray of x's shape >= 0.

    References
    ----------
    FLatten Eq. 6, 18-21; Higham (2002) §3.1; docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    p = _check_p(p)
    validation.check_axis(axis, x.ndim)
    ex = np.zeros_like(x) if err_x is None else numerics.as_float(err_x, "err_x")
    d = x.shape[axis]
    c = float(config.ELEMENTARY_FUNCTION_ULPS)
    f = _focused_function_numpy(x, p, axis=axis)
    m, nx = _norm_scaled(x, axis)
    with np.errstate(invalid="ignore", divide="ignore", under="ignore", over="ignore"):
        safe_m = np.where(m > 0, m, 1.0)
        r = x / safe_m
        t = r ** p
        nt = np.sqrt(np.sum(t * t, axis=axis, keepdims=True))
        safe_nt = np.where(nt > 0, nt, 1.0)
        g = t / safe_nt
        # Scale-free forms (no 1/m, which overflows for subnormal m): x / ||x|| = r / ||r|| and
        # ||x|| A_i = p ||r|| r_i**(p-1) / ||t||.
        nr = np.sqrt(np.sum(r * r, axis=axis, keepdims=True))
        safe_nr = np.where(nr > 0, nr, 1.0)
        a = r ** (p - 1.0)
        prop = g * np.sum(r * ex, axis=axis, keepdims=True) / safe_nr \
            + p * nr / safe_nt * (a * ex + g * np.sum(a * g * ex, axis=axis, keepdims=True))
        # the two length-d norms count numerics.sum_depth(d) each (d, or d u_A / u_T + 1 in mixed precision)
        under = (p + c + 4.0) * nx * _eta_in_u(dtype)
        if l2:
            count = 2.0 * p + 2.0 * c + 2.0 * numerics.sum_depth_l2(d, dtype) + 8.0
            rounding = np.hypot(math.sqrt(max(p, c, 1.0)) * math.sqrt(count) * f, under)
            total = np.hypot(prop, rounding)
        else:
            rounding = (2.0 * p + 2.0 * c + 2.0 * numerics.sum_depth(d, dtype) + 8.0) * f + under
            total = prop + rounding
        zero = np.sqrt(np.sum(ex * ex, axis=axis, keepdims=True)) + 0.0 * x
    return np.where(m == 0, zero, total)


def focused_function_bound(x: Any, p: float = config.FLATTEN_FOCUSING_FACTOR, *, axis: int = -1,
                           dtype: Any = None) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`focused_function` on exact (T-rounded) inputs x >= 0, from
    :func:`focused_function_error`: scale E / K, k = K = 2 p + 2 c + 2 d + 8 (the rounding count derived
    there), plus the underflow term for ``dtype``.  Either ``power_scaling``.

    References
    ----------
    FLatten Eq. 6; docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    validation.check_axis(axis, x.ndim)
    e = focused_function_error(x, p, axis=axis, dtype=dtype)
    kk = int(math.ceil(2 * _check_p(p) + 2 * config.ELEMENTARY_FUNCTION_ULPS + 2 * x.shape[axis] + 8))
    return numerics.Bound(e / kk, kk, f"focused function f_p (p = {p:g}, d = {x.shape[axis]}): "
                                      f"first-order rounding count 2p + 2c + 2d + 8 = {kk}")


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


def _attend_unmasked(phi_q, phi_k, v, *, normaliser, eps, order, taps, max_elements):
    if normaliser == "sum":
        return kernelized_attention(phi_q, phi_k, v, order=order, eps=eps, eps_policy="add", taps=taps,
                                    max_elements=max_elements)
    return _attend_mean_scaled(phi_q, phi_k, v, order=order, eps=eps, taps=taps, max_elements=max_elements)


def _mask_groups(mask_w: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Queries with identical mask rows share one key set: [(query indices, allowed key indices), ...].
    For Swin's mask (regions) there are at most 4 groups per window, so the masked linear order stays
    linear."""
    rows, inverse = np.unique(mask_w, axis=0, return_inverse=True)
    return [(np.flatnonzero(inverse.ravel() == g), np.flatnonzero(rows[g])) for g in range(rows.shape[0])]


def _attend(phi_q, phi_k, v, *, normaliser, eps, order, mask, taps, max_elements):
    """Normalised phi_q phi_k^T v (Eq. 4 / the released normaliser), optionally restricted by a boolean
    window mask (nW, N, n) whose windows are interleaved in the batch as b * nW + w (window_partition)."""
    if mask is None:
        return _attend_unmasked(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order=order, taps=taps,
                                max_elements=max_elements)
    nw = mask.shape[0]
    out = np.empty(phi_q.shape[:-1] + (v.shape[-1],), dtype=np.result_type(phi_q, v))
    den = np.empty(phi_q.shape[:-1], dtype=out.dtype)
    for w in range(nw):
        for qi, kj in _mask_groups(mask[w]):
            sub: dict | None = {} if taps is not None else None
            out[w::nw, :, qi] = _attend_unmasked(phi_q[w::nw, :, qi], phi_k[w::nw, :, kj], v[w::nw, :, kj],
                                                 normaliser=normaliser, eps=eps, order=order, taps=sub,
                                                 max_elements=max_elements)
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
    configuration, and the default NumPy backend, computes the definition.

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
        phi_q = focused_feature_map(q, p, power_scaling=power_scaling)
        phi_k = focused_feature_map(k, p, power_scaling=power_scaling)
        return _attend(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order=order, mask=None, taps=taps,
                       max_elements=max_elements)

    if _fused_kernel_applies(order=order, normaliser=normaliser, power_scaling=power_scaling, mask=None, taps=taps):
        att = backends.call("linear_attention", q, k, v, "focused", eps, "add", None, _check_p(p),
                            otherwise=numpy_path)
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
    return att + dwc


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


def resample_linear_bound(x: Any, size: int, axis: int = -1) -> numerics.Bound:
    """:class:`numerics.Bound` of :func:`resample_linear` on exact inputs: the interpolation weight's
    absolute error (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS roundings of size u (src + 1), src the source
    coordinate) times the local slope (<= 2 max of the four neighbours, covering a floor() that falls in the
    adjacent interval), plus 3 roundings of (1 - lambda) a + lambda b.  Scale E / K, K = roundings + 3.

    References
    ----------
    FLatten Eq. 10-12 (V for the DWC with sr > 1); docs/design.md "The verdict".
    """
    x = numerics.as_float(x, "x")
    validation.check_axis(axis, x.ndim)
    _, e = _err_resample(x, np.zeros_like(x), numerics.check_positive_int(size, "size"), axis)
    kk = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
    return numerics.Bound(e / kk, kk, f"linear resampling: {config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS} roundings "
                                      f"in the source coordinate x local slope + 3 in the blend; first order")


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
    vr = _resample_v(v, hw_v, hw_out, resample)
    big_h, big_w = hw_out
    g = _to_grid(vr, hw_out).transpose(0, 1, 4, 2, 3)              # (B, h, e, H, W)
    kk = weight.shape[-1]
    if shared:
        if weight.shape[0] != e:
            raise ArgumentError(f"argument 'dwc.weight': a shared bank needs shape ({e}, 1, k, k), got {weight.shape}")
        out = depthwise_conv2d(g.reshape(b * h, e, big_h, big_w), weight, bias, padding=kk // 2)
    else:
        if weight.shape[0] != h * e:
            raise ArgumentError(f"argument 'dwc.weight': expected shape ({h * e}, 1, k, k) (one kernel per "
                             f"channel), got {weight.shape}")
        out = depthwise_conv2d(g.reshape(b, h * e, big_h, big_w), weight, bias, padding=kk // 2)
    return out.reshape(b, h, e, big_h * big_w).swapaxes(-1, -2)


# ===================================================================================================
# Modules: the DeiT / PVT layout and the Swin layout
# ===================================================================================================

def _p(params: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in params:
        raise ParameterKeyError(f"focused attention: missing parameter '{key}'")
    return numerics.as_float(params[key], key)


def _check_params(params: Any, cfg: FocusedConfig, layout: str, hw: tuple[int, int], where: str) -> None:
    """The strict parameter check (:func:`refimpl.validation.check_params`) against :func:`focused_param_shapes`
    of the layout; the positional encoding covers the key tokens (global: the (H // sr) x (W // sr) reduced
    grid; window: one window of ``hw`` = (wh, ww))."""
    sr = cfg.sr_ratio if layout == "global" else 1
    n_kv = (hw[0] // sr) * (hw[1] // sr)
    validation.check_params(params, focused_param_shapes(cfg, layout=layout, n_kv=n_kv), where=where)


def _opt(params: Mapping[str, Any], key: str, present: bool) -> np.ndarray | None:
    return _p(params, key) if present else None


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


def _features(t: np.ndarray, params: Mapping[str, Any], cfg: FocusedConfig) -> np.ndarray:
    """phi_p of the token-major projections (B, n, C) -> (B, h, n, d), per the config's norm scope."""
    a = _pre_features(t, params, cfg)
    if cfg.norm_scope == "token":
        return _split_heads(focused_function(a, cfg.p, power_scaling=cfg.power_scaling), cfg.num_heads)
    return focused_function(_split_heads(a, cfg.num_heads), cfg.p, power_scaling=cfg.power_scaling)


def _heads_and_dwc(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements):
    """Shared tail of both layouts: :func:`_core`, then the output projection."""
    y = _core(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements)
    return linear(y, _p(params, "proj.weight"), params.get("proj.bias"))


def _core(q, k, v, params, cfg, hw_kv, hw_q, mask, order, taps, max_elements):
    """APE on K, features, attention, DWC and their sum (B, N, C): everything between the projections."""
    if cfg.positional_encoding:
        pe = _p(params, "positional_encoding")
        if pe.shape != (1,) + k.shape[1:]:
            raise ArgumentError(f"argument 'positional_encoding': expected shape {(1,) + k.shape[1:]}, got {pe.shape}")
        k = k + pe
    vh = _split_heads(v, cfg.num_heads)

    def numpy_path() -> np.ndarray:
        phi_q = _features(q, params, cfg)
        phi_k = _features(k, params, cfg)
        return _attend(phi_q, phi_k, vh, normaliser=cfg.normaliser, eps=cfg.eps, order=order, mask=mask,
                       taps=taps, max_elements=max_elements)

    if cfg.norm_scope == "head" and _fused_kernel_applies(order=order, normaliser=cfg.normaliser,
                                                          power_scaling=cfg.power_scaling, mask=mask, taps=taps):
        # The fused kernel applies ReLU then f_p per head row: the pre-features (ReLU (+ relu_eps)
        # (/ softplus(scale))) are >= 0 or NaN, on which its ReLU is the identity, so phi_p of the kernel
        # equals _features' focused_function of them (FLatten Eq. 6 per head).
        h = cfg.num_heads
        aq = _split_heads(_pre_features(q, params, cfg), h)
        ak = _split_heads(_pre_features(k, params, cfg), h)
        att = backends.call("linear_attention", aq, ak, vh, "focused", cfg.eps, "add", None, cfg.p,
                            otherwise=numpy_path)
    else:
        att = numpy_path()
    dwc = _dwc(vh, hw_kv, hw_q, _p(params, "dwc.weight"), params.get("dwc.bias"), cfg.dwc_shared,
               cfg.dwc_resample)
    y = _merge_heads(att + dwc)
    if taps is not None:
        taps.update(k_pe=k, attention=att, dwc=dwc, pre_proj=y)
    return y


def _check_x(x: Any, hw: Any, cfg: FocusedConfig) -> tuple[np.ndarray, int, int]:
    x = numerics.as_float(x, "x")
    if not (isinstance(hw, (tuple, list)) and len(hw) == 2):
        raise ArgumentTypeError(f"argument 'hw': expected a pair (H, W), got {hw!r}")
    big_h = numerics.check_positive_int(hw[0], "hw[0]")
    big_w = numerics.check_positive_int(hw[1], "hw[1]")
    numerics.check_shapes(x=(x, "B N C"), sizes={"N": big_h * big_w, "C": cfg.dim})
    return x, big_h, big_w


def focused_linear_attention(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                             order: str = "linear", taps: dict | None = None,
                             max_elements: int | None = None) -> np.ndarray:
    """The focused linear attention module in the DeiT / PVT layout (global attention over the grid).

    q = x W_q + b_q; K, V from x, or - PVT with sr > 1 - from LayerNorm(Conv_{sr x sr, stride sr}(x)) on the
    (H // sr) x (W // sr) grid; then O = proj(normalised phi_p(Q) phi_p(K)^T V + DWC(V)) per head (Eq. 12).
    DeiT is the case sr = 1 (the released repository has no DeiT file; Table 9's "win 14 x 14" is the whole
    grid).  With sr > 1, V is resampled to the H x W grid for the DWC (``cfg.dwc_resample``).

    Parameters
    ----------
    x : float array (B, N, C), N = H W tokens in row-major grid order (already normalised by the block).
    params : mapping keyed like the PyTorch twin's state_dict: "q.weight" (C, C), "q.bias" (C,),
        "kv.weight" (2C, C), "kv.bias" (2C,) (K = first C outputs, V = last C), with sr > 1 "sr.weight"
        (C, C, sr, sr), "sr.bias" (C,), "norm.weight", "norm.bias" (C,); "dwc.weight" (C or d, 1, k, k),
        "dwc.bias"; "proj.weight" (C, C), "proj.bias" (C,); official: "scale" (1, 1, C),
        "positional_encoding" (1, n, C).  See :func:`focused_param_shapes`.
    cfg : :class:`FocusedConfig`.  hw : (H, W).
    order : "linear" or "quadratic" (equal in exact arithmetic).
    taps : dict or None; records "q", "k", "v" (B, *, C), "phi_q", "phi_k" (B,h,*,d), "kv" / "attn",
        "numerator", "denominator", "attention" (B,h,N,d), "dwc" (B,h,N,d), "pre_proj" (B,N,C), "k_pe".

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    FLatten §4.3, Eq. 5-6, 10-12; Appendix D (PVT layouts); PVT's spatial-reduction attention.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_order(order)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention")
    validation.check_taps(taps)
    c = cfg.dim
    q = linear(x, _p(params, "q.weight"), _opt(params, "q.bias", cfg.qkv_bias))
    if cfg.sr_ratio > 1:
        grid = x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)
        red = conv2d(grid, _p(params, "sr.weight"), _p(params, "sr.bias"), stride=cfg.sr_ratio)
        hw_kv = red.shape[2], red.shape[3]
        src = layer_norm(red.reshape(red.shape[0], c, -1).transpose(0, 2, 1), _p(params, "norm.weight"),
                         _p(params, "norm.bias"), cfg.layer_norm_eps)
    else:
        hw_kv, src = (big_h, big_w), x
    kv = linear(src, _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias))
    k, v = kv[..., :c], kv[..., c:]
    if taps is not None:
        taps.update(q=q, k=k, v=v)
    return _heads_and_dwc(q, k, v, params, cfg, hw_kv, (big_h, big_w), None, order, taps, max_elements)


def _int_pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    """An int (the same on both grid axes) or a pair of ints, each >= ``minimum`` (bool, float, str refused)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        v = validation.check_int(value, name, minimum=minimum)
        return v, v
    if not isinstance(value, (tuple, list)):
        raise ArgumentTypeError(f"argument '{name}': expected an integer >= {minimum} or a pair of them, "
                                f"got {validation.describe(value)}")
    a, b = validation.check_int_tuple(value, name, 2, minimum=minimum)
    return a, b


def _window_geometry(hw, window_size, shift):
    wh, ww = _int_pair(window_size, "window_size", 1)
    sh, sw = _int_pair(shift, "shift", 0)
    if hw[0] % wh or hw[1] % ww:
        raise ArgumentError(f"argument 'window_size': grid {hw[0]}x{hw[1]} is not a multiple of the window "
                         f"{wh}x{ww} (the Swin layout of FLatten does not pad)")
    if not (0 <= sh < wh and 0 <= sw < ww):
        raise ArgumentError(f"argument 'shift': expected 0 <= shift < window {wh}x{ww}, got {(sh, sw)}")
    return (wh, ww), (sh, sw)


def focused_window_attention(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                             window_size: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                             order: str = "linear", taps: dict | None = None,
                             max_elements: int | None = None) -> np.ndarray:
    """The focused linear attention module in the Swin layout (W-MSA / SW-MSA replaced; FLatten §4.3).

    The grid is cyclically shifted by -shift, cut into windows, and each window runs focused linear attention
    with its own DWC on the window grid; outputs are merged and shifted back.  With shift > 0 the paper
    preset restricts each query to keys of its own region (Swin's mask, exactly, also in the linear order by
    grouping queries with equal mask rows); the official preset ignores the mask (``cfg.shift_mask``).

    Parameters
    ----------
    x : float array (B, N, C), N = H W (row-major).  H, W multiples of the window (no padding).
    params : "qkv.weight" (3C, C), "qkv.bias" (3C,) (q, k, v = consecutive C-blocks), "dwc.weight",
        "dwc.bias", "proj.weight", "proj.bias"; official: "scale" (1, 1, C), "positional_encoding"
        (1, wh ww, C).  See :func:`focused_param_shapes`.
    cfg : :class:`FocusedConfig` (sr_ratio must be 1).  hw : (H, W).
    window_size : int or (wh, ww).  shift : int or (sh, sw), 0 <= shift < window.
    order, taps, max_elements : as :func:`focused_linear_attention`; taps hold per-window arrays
        (B nW, ...), plus "mask" (nW, n, n) when a mask is applied.

    Returns
    -------
    ndarray (B, N, C).

    References
    ----------
    FLatten §4.3, Eq. 5-6, 10-12, Tables 6-7 (Swin); Swin Transformer (Liu et al. 2021) §3.2.
    """
    validation.check_max_elements(max_elements)
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_order(order)
    if cfg.sr_ratio != 1:
        raise ArgumentError(f"argument 'cfg': the Swin layout has no spatial reduction, got sr_ratio={cfg.sr_ratio}")
    (wh, ww), (sh, sw) = _window_geometry((big_h, big_w), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention")
    validation.check_taps(taps)
    b, c = x.shape[0], cfg.dim
    grid = x.reshape(b, big_h, big_w, c)
    if sh or sw:
        grid = np.roll(grid, (-sh, -sw), axis=(1, 2))
    win = window_partition(grid, (wh, ww))                          # (B nW, wh ww, C)
    qkv = linear(win, _p(params, "qkv.weight"), _opt(params, "qkv.bias", cfg.qkv_bias))
    q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(big_h, big_w, (wh, ww), (sh, sw))
    if taps is not None:
        taps.update(q=q, k=k, v=v)
        if mask is not None:
            taps["mask"] = mask
    out = _heads_and_dwc(q, k, v, params, cfg, (wh, ww), (wh, ww), mask, order, taps, max_elements)
    grid = window_reverse(out, (wh, ww), big_h, big_w)
    if sh or sw:
        grid = np.roll(grid, (sh, sw), axis=(1, 2))
    return grid.reshape(b, big_h * big_w, c)


# ===================================================================================================
# Parameter shapes and initialisation
# ===================================================================================================

def focused_param_shapes(cfg: FocusedConfig, *, layout: str, n_kv: int) -> dict[str, tuple[int, ...]]:
    """The parameter keys and shapes of a module (= the PyTorch twin's state_dict).

    layout : "global" (DeiT / PVT, :func:`focused_linear_attention`) or "window" (Swin).
    n_kv : number of key tokens the positional encoding covers (global: (H // sr)(W // sr); window: wh ww).
    """
    validation.check_config(cfg, FocusedConfig)
    n_kv = validation.check_int(n_kv, "n_kv", minimum=1)
    c, d, kk = cfg.dim, cfg.head_dim, cfg.kernel_size
    shapes: dict[str, tuple[int, ...]] = {}
    if layout == "global":
        shapes["q.weight"] = (c, c)
        if cfg.qkv_bias:
            shapes["q.bias"] = (c,)
        shapes["kv.weight"] = (2 * c, c)
        if cfg.qkv_bias:
            shapes["kv.bias"] = (2 * c,)
        if cfg.sr_ratio > 1:
            shapes.update({"sr.weight": (c, c, cfg.sr_ratio, cfg.sr_ratio), "sr.bias": (c,),
                           "norm.weight": (c,), "norm.bias": (c,)})
    elif layout == "window":
        shapes["qkv.weight"] = (3 * c, c)
        if cfg.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
    else:
        raise ArgumentError(f"argument 'layout': expected 'global' or 'window', got {layout!r}")
    nb = d if cfg.dwc_shared else c
    shapes.update({"dwc.weight": (nb, 1, kk, kk), "dwc.bias": (nb,), "proj.weight": (c, c), "proj.bias": (c,)})
    if cfg.learnable_scale:
        shapes["scale"] = (1, 1, c)
    if cfg.positional_encoding:
        shapes["positional_encoding"] = (1, n_kv, c)
    return shapes


def init_focused_params(cfg: FocusedConfig, *, layout: str, n_kv: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float64 parameters of the right keys and shapes (weights N(0, 1 / fan_in), biases and the
    positional encoding N(0, 0.1^2), LayerNorm weight 1 + N(0, 0.1^2), scale N(0, 0.5^2)): for tests, docs
    and benchmarks; not the released initialisation (which zeros the scale and the encoding)."""
    validation.check_config(cfg, FocusedConfig)
    validation.check_int(n_kv, "n_kv", minimum=1)
    rng = np.random.default_rng(validation.check_seed(seed))
    out = {}
    for key, shape in focused_param_shapes(cfg, layout=layout, n_kv=n_kv).items():
        if key.endswith("weight") and len(shape) > 1:
            fan_in = int(np.prod(shape[1:]))
            out[key] = rng.standard_normal(shape) / math.sqrt(fan_in)
        elif key == "norm.weight":
            out[key] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif key == "scale":
            out[key] = 0.5 * rng.standard_normal(shape)
        else:
            out[key] = 0.1 * rng.standard_normal(shape)
    return out


# ===================================================================================================
# The error model
# ===================================================================================================
#
# Every bound below is a running first-order error bound (Higham §3.1; docs/design.md): each intermediate t of
# the reference carries a coefficient E_t >= 0 with |fl_T(t) - t| <= u_T E_t, propagated through each stage
# by the stage's (absolute) Jacobian and increased by the stage's own rounding (its k times its scale S).
# The final Bound has k = K, the summed depth of the stages, and scale E_out / K, so that
# gamma_K(u) scale >= u E_out.  Products of two error terms (O(u^2)) are neglected; elementary functions
# are assumed accurate to config.ELEMENTARY_FUNCTION_ULPS.  The helpers are shared with enhanced.py.
#
# With ``l2=True`` the same helpers compute the probabilistic (l2) coefficient sigma of numerics.Bound instead
# of E: a stage's own roundings count sqrt(numerics.sum_depth_l2(n)) S for an n-term sum instead of k S (every
# rounding coefficient of a sum is at most S, so sum_r c_r^2 <= n S^2; elementwise terms are kept at their l1
# size, which bounds their l2 size), input coefficients propagate through the same absolute Jacobians
# (Minkowski: ||sum_j a_j c_j||_2 <= sum_j |a_j| ||c_j||_2, valid whatever roundings the inputs share), and a
# stage's own roundings, disjoint from its inputs', join the propagated part in quadrature (_join).


def _join(prop: np.ndarray, own: np.ndarray, l2: bool) -> np.ndarray:
    """Propagated plus own rounding terms: summed (E, l1) or in quadrature (sigma, l2: disjoint roundings)."""
    return np.hypot(prop, own) if l2 else prop + own


def _own(count: float, count_l2: float, s: np.ndarray, l2: bool) -> np.ndarray:
    """A stage's own rounding term on the magnitude s: count s (E) or sqrt(count_l2) s (sigma)."""
    return (math.sqrt(count_l2) if l2 else count) * s


def err_linear(x: np.ndarray, e_x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dtype: Any = None,
               l2: bool = False):
    """y = x W^T + b: returns (y, E_y, k), E_y = |W| e_x + k (|x||W|^T + |b|), k = in + 1 (Higham 3.12);
    with a mixed-precision ``dtype`` the in-term sum counts numerics.sum_depth(in) (the bias add one more).
    ``l2``: sigma_y = hypot(|W| sigma_x, sqrt(sum_depth_l2(in) + 1) (|x||W|^T + |b|))."""
    y = linear(x, weight, bias)
    extra = 1 if bias is not None else 0
    k = numerics.sum_depth(weight.shape[-1], dtype) + extra
    s = linear(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias))
    own = _own(k, numerics.sum_depth_l2(weight.shape[-1], dtype) + extra, s, l2)
    return y, _join(e_x @ np.abs(weight).T, own, l2), k


def err_layer_norm(x: np.ndarray, e_x: np.ndarray, weight, bias, eps: float, dtype: Any = None, l2: bool = False):
    """LayerNorm over the last axis: input errors through the Jacobian (w_i / s)(delta_ij - 1/n - xh_i xh_j / n),
    bounded by |w_i| / s (e_i + mean(e) + |xh_i| mean(|xh| e)), plus layers.layer_norm_bound's rounding
    (``l2``: its k roundings, each of coefficient at most its scale, as sqrt(k - n + sum_depth_l2(n)) scale)."""
    y = layer_norm(x, weight, bias, eps)
    mu = np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    xh = (x - mu) / s
    w = 1.0 if weight is None else np.abs(weight)
    prop = w / s * (e_x + np.mean(e_x, axis=-1, keepdims=True) + np.abs(xh) * np.mean(np.abs(xh) * e_x, axis=-1,
                                                                                         keepdims=True))
    if x.shape[-1] == 1:  # over one channel the output is the bias whatever x is: the Jacobian is 0
        prop = np.zeros_like(prop)
    b = layer_norm_bound(x, weight, bias, eps, dtype=dtype)
    n = x.shape[-1]
    count_l2 = b.k - numerics.sum_depth(n, dtype) + numerics.sum_depth_l2(n, dtype)
    return y, _join(prop, _own(b.k, count_l2, np.asarray(b.scale), l2), l2), b.k


def err_norm_linear_l2(x: np.ndarray, sigma_x: np.ndarray, norm_weight, norm_bias, eps: float, weight: np.ndarray,
                       bias: np.ndarray | None, dtype: Any = None):
    """LayerNorm over the last axis, then y = LN(x) W^T + b, in l2 mode, for an input whose entries' errors
    come from disjoint roundings (PVT's reduction conv: each output is its own inner product).

    The input part goes through the composite Jacobian M = W J exactly, in quadrature over the independent
    input entries: sigma_i^2 = sum_j M_ij^2 sigma_x_j^2 with J_cj = (w_c / s)(delta_cj - 1/n - xh_c xh_j / n), so
    M_ij = (G_ij - alpha_i / n - beta_i xh_j / n) / s, G = W diag(w), alpha = G 1, beta = G xh (the square
    expanded into matrix products; its float64 evaluation error, 4 u_64 times the sum of the expansion's
    magnitudes, is added so that the result stays an upper bound).  The LayerNorm's own roundings (shared by
    a token's channels through the mean and variance) go through |W| (Minkowski), the projection's own
    roundings count sqrt(sum_depth_l2(in) + 1) S; the three sets of roundings are disjoint (quadrature).
    Returns (y, sigma_y, k) with k the two stages' summed depth (as :func:`err_layer_norm` + :func:`err_linear`).
    """
    n = x.shape[-1]
    ln, s_own, k_ln = err_layer_norm(x, np.zeros_like(x), norm_weight, norm_bias, eps, dtype, l2=True)
    y, s_lin, k_lin = err_linear(ln, s_own, weight, bias, dtype, l2=True)
    if n == 1:                      # over one channel the LayerNorm's output is its bias: no input term
        return y, s_lin, k_ln + k_lin
    mu = np.mean(x, axis=-1, keepdims=True)
    sd = np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    xh = (x - mu) / sd
    g = weight * (1.0 if norm_weight is None else norm_weight)          # G = W diag(w), (out, n)
    alpha = np.sum(g, axis=-1) / n                                      # alpha_i / n
    beta = (xh @ g.T) / n                                               # beta_i / n, per token
    v2 = sigma_x * sigma_x
    terms = [v2 @ (g * g).T, alpha ** 2 * np.sum(v2, axis=-1, keepdims=True),
             beta ** 2 * np.sum(xh * xh * v2, axis=-1, keepdims=True), -2.0 * alpha * (v2 @ g.T),
             -2.0 * beta * ((xh * v2) @ g.T), 2.0 * alpha * beta * np.sum(xh * v2, axis=-1, keepdims=True)]
    total = sum(terms)
    slack = 4.0 * numerics.unit_roundoff("float64") * sum(np.abs(t) for t in terms)
    prop = np.sqrt(np.maximum(total, 0.0) + slack) / sd
    return y, np.hypot(prop, s_lin), k_ln + k_lin


def err_dwconv(x: np.ndarray, e_x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dtype: Any = None,
               l2: bool = False):
    """Depthwise 'same' conv (B, C, H, W): E = conv(e_x, |W|) + k (conv(|x|, |W|) + |b|), k = KH KW + 1
    (the KH KW-term sum counted by numerics.sum_depth for a mixed-precision ``dtype``; ``l2``: as
    :func:`err_linear`)."""
    pad = weight.shape[-1] // 2
    y = depthwise_conv2d(x, weight, bias, padding=pad)
    taps, extra = weight.shape[-1] * weight.shape[-2], (1 if bias is not None else 0)
    k = numerics.sum_depth(taps, dtype) + extra
    s = depthwise_conv2d(np.abs(x), np.abs(weight), None if bias is None else np.abs(bias), padding=pad)
    own = _own(k, numerics.sum_depth_l2(taps, dtype) + extra, s, l2)
    return y, _join(depthwise_conv2d(e_x, np.abs(weight), None, padding=pad), own, l2), k


def err_attention(phi_q, phi_k, v, e_q, e_k, e_v, *, eps: float, clamp_min: float | None = None,
                  extra_roundings: int = 0, dtype: Any = None, l2: bool = False):
    """Error coefficient of the normalised kernelized attention (either order) with input errors e_q, e_k
    (features) and e_v (values), all >= 0 in units of u.  Returns (E, k).

    E = k S (the attention's own rounding: :func:`refimpl.attention.linear.kernelized_attention_bound` on
    exact inputs, its k times its scale) + (F_num + |O| F_den) / |den_eff| (first-order propagation of the
    input errors through num / den, with F_num = e_q (|phi_k|^T |v|) + |phi_q| (e_k^T |v|) + |phi_q| (|phi_k|^T
    e_v) and F_den = e_q . sum |phi_k| + |phi_q| . sum e_k; max(., C_min) is 1-Lipschitz) + extra_roundings
    relative roundings of numerator or normaliser (each <= u S_num / |den_eff|).  The input errors are
    propagated once, not multiplied by the attention's depth k.

    ``l2`` (numerics.Bound's sigma; the caller's inputs must make the queries' errors and each key token's
    errors depend on disjoint sets of roundings, as they do when the module input is exact: every projected
    entry is its own inner product, and a token's LayerNorm and reduction conv are its own): the queries'
    part e_q (|phi_k|^T |v| + |O| sum_j |phi_k_j|) / den is propagated as above (it is correlated across
    the d features); each key token j contributes t_j = [(|phi_q| . e_k_j) (|v_j| + |O|) + (|phi_q| .
    |phi_k_j|) e_v_j] / den (Minkowski within the token), and the tokens, whose roundings are disjoint, join in
    quadrature: sqrt(sum_j t_j^2) (:func:`_token_quadrature`); the queries' and the keys' parts join in
    quadrature, and so do the attention's own roundings, hypot(sqrt(k) S, sqrt(extra_roundings) |O|) (each
    rounding's coefficient is at most S, resp. |O|)."""
    b = kernelized_attention_bound(phi_q, phi_k, v, eps=eps, eps_policy="add", clamp_min=clamp_min, dtype=dtype)
    aq, ak, av = np.abs(phi_q), np.abs(phi_k), np.abs(v)
    den = np.abs(apply_normaliser(np.einsum("bhnd,bhd->bhn", phi_q, np.sum(phi_k, axis=-2)), eps=eps,
                                  clamp_min=clamp_min))[..., None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kv_abs = ak.swapaxes(-1, -2) @ av
        s_num = aq @ kv_abs
        f_num = e_q @ kv_abs + aq @ (e_k.swapaxes(-1, -2) @ av) + aq @ (ak.swapaxes(-1, -2) @ e_v)
        f_den = (np.einsum("bhnd,bhd->bhn", e_q, np.sum(ak, axis=-2))
                 + np.einsum("bhnd,bhd->bhn", aq, np.sum(e_k, axis=-2)))[..., None]
        o_abs = s_num / den
        if l2:
            q_part = (e_q @ kv_abs + o_abs * np.einsum("bhnd,bhd->bhn", e_q, np.sum(ak, axis=-2))[..., None]) / den
            prop = np.hypot(q_part, _token_quadrature(aq, ak, av, e_k, e_v, o_abs) / den)
            e = np.hypot(prop, np.hypot(math.sqrt(b.k) * np.asarray(b.scale), math.sqrt(extra_roundings) * o_abs))
        else:
            prop = (f_num + o_abs * f_den) / den
            e = b.k * np.asarray(b.scale) + prop + extra_roundings * o_abs
    return e, b.k + extra_roundings


def _token_quadrature(aq, ak, av, e_k, e_v, o_abs, block: int = 1024) -> np.ndarray:
    """sqrt(sum_j t_ije^2), t_ije = a_ij (|v_je| + |O_ie|) + A_ij e_v_je with a = |phi_q| e_k^T and
    A = |phi_q| |phi_k|^T (both (B, h, N, M)): the square expanded into matrix products, query rows in blocks of
    ``block`` so that memory stays O(block M) per head.  Every term is >= 0 (no cancellation)."""
    out = np.empty(o_abs.shape)
    ekt, akt = e_k.swapaxes(-1, -2), ak.swapaxes(-1, -2)
    av2, ev2, avev = av * av, e_v * e_v, av * e_v
    for i0 in range(0, aq.shape[-2], block):
        rows = slice(i0, i0 + block)
        a = aq[..., rows, :] @ ekt
        big_a = aq[..., rows, :] @ akt
        o = o_abs[..., rows, :]
        aa, a_big = a * a, a * big_a
        t = aa @ av2 + (big_a * big_a) @ ev2 + 2.0 * (a_big @ avev) \
            + o * (2.0 * (aa @ av + a_big @ e_v) + o * np.sum(aa, axis=-1, keepdims=True))
        out[..., rows, :] = np.sqrt(t)
    return out


def relu_error(t: np.ndarray, e_t: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Error coefficient of ReLU(t~) for t~ within u e_t of t: ReLU is exact and 1-Lipschitz, and where
    t < -u_T e_t (``dtype`` given) both sides are exactly 0, so the error vanishes there."""
    if dtype is None:
        return e_t
    return np.where(t > -numerics.unit_roundoff(dtype) * e_t, e_t, 0.0)


def _err_resample(x, e_x, size, axis, dtype=None):
    """Linear resampling along ``axis``: the weights' absolute error (FLATTEN_RESAMPLE_INDEX_ROUNDINGS
    roundings of size <= u (src + 1)) times the local slope (<= twice the largest of the four neighbours,
    which also covers a floor() that lands in the adjacent interval), 3 roundings of the two products and
    the sum, and the inputs' errors (weights >= 0 summing to 1).  With a mixed-precision ``dtype`` the source
    coordinate is computed in the accumulation format (torch's upsampling computes it in its opmath type,
    float for Half/BFloat16): its roundings count u_A / u_T each."""
    ax = axis % x.ndim
    n_in = x.shape[ax]
    src, i0, i1, lam = _resample_plan(n_in, size)
    shape = [1] * x.ndim
    shape[ax] = size
    lam_b, src_b = lam.reshape(shape), src.reshape(shape)
    a, b = np.take(x, i0, axis=ax), np.take(x, i1, axis=ax)
    lo, hi = np.take(np.abs(x), np.maximum(i0 - 1, 0), axis=ax), np.take(np.abs(x), np.minimum(i1 + 1, n_in - 1),
                                                                           axis=ax)
    local = np.maximum(np.maximum(np.abs(a), np.abs(b)), np.maximum(lo, hi))
    y = a * (1 - lam_b) + b * lam_b
    e = (np.take(e_x, i0, axis=ax) * (1 - lam_b) + np.take(e_x, i1, axis=ax) * lam_b
         + config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS * numerics.accumulation_ratio(dtype) * (src_b + 1.0) * 2.0 * local
         + 3.0 * (np.abs(a) * (1 - lam_b) + np.abs(b) * lam_b))
    return y, e


def _err_dwc(vh, e_v, hw_v, hw_out, weight, bias, shared, resample, dtype=None, l2=False):
    """E of the DWC branch (B, h, N, e) (resampling + depthwise conv); returns (dwc, E, k)."""
    b, h, _, e = vh.shape
    k_res = 0
    if tuple(hw_v) != tuple(hw_out):
        if resample == "linear_flat":
            vh, e_v = _err_resample(vh, e_v, hw_out[0] * hw_out[1], 2)
            k_res = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
        else:
            g, eg = _to_grid(vh, hw_v), _to_grid(e_v, hw_v)
            g, eg = _err_resample(g, eg, hw_out[0], 2)
            g, eg = _err_resample(g, eg, hw_out[1], 3)
            n = hw_out[0] * hw_out[1]
            vh, e_v = g.reshape(b, h, n, e), eg.reshape(b, h, n, e)
            k_res = 2 * (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3)
    big_h, big_w = hw_out

    def grid(t):
        g = _to_grid(t, hw_out).transpose(0, 1, 4, 2, 3)
        return g.reshape(b * h, e, big_h, big_w) if shared else g.reshape(b, h * e, big_h, big_w)

    y, ey, k = err_dwconv(grid(vh), grid(e_v), weight, bias, dtype, l2)

    def back(t):
        return t.reshape(b, h, e, big_h * big_w).swapaxes(-1, -2)

    return back(y), back(ey), k + k_res


def _err_pre_features(t, e_t, params, cfg, dtype=None):
    """E of ReLU(t) (+ eps) (/ softplus(s)): ReLU is exact and 1-Lipschitz (:func:`relu_error`); + eps
    rounds once; softplus has relative error (2c + 1) u (exp and log1p, c ulps each, plus the sum) and the
    quotient u."""
    a = numerics.relu(t)
    e = relu_error(t, e_t, dtype)
    if cfg.relu_eps:
        a = a + cfg.relu_eps
        e = e + a
    if cfg.learnable_scale:
        sp = numerics.softplus(_p(params, "scale"))
        a = a / sp
        e = e / sp + (2.0 * config.ELEMENTARY_FUNCTION_ULPS + 3.0) * a
    return a, e


def _err_features(t, e_t, params, cfg, dtype=None, l2=False):
    a, e = _err_pre_features(t, e_t, params, cfg, dtype)
    h = cfg.num_heads
    if cfg.norm_scope == "token":
        phi = _focused_function_numpy(a, cfg.p, power_scaling=cfg.power_scaling)
        ephi = focused_function_error(a, cfg.p, e, dtype=dtype, l2=l2)
        return _split_heads(phi, h), _split_heads(ephi, h), a.shape[-1]
    ah, eh = _split_heads(a, h), _split_heads(e, h)
    return _focused_function_numpy(ah, cfg.p, power_scaling=cfg.power_scaling), \
        focused_function_error(ah, cfg.p, eh, dtype=dtype, l2=l2), \
        ah.shape[-1]


def _feature_depth(p: float, d: int, dtype: Any = None) -> float:
    """Rounding count of the feature map: f_p's (:func:`focused_function_error`, its two length-d norms
    counted by numerics.sum_depth) plus the pre-features' 2 c + 4 (ReLU, + eps, softplus, the quotient)."""
    return math.ceil(2 * p + 2 * config.ELEMENTARY_FUNCTION_ULPS + 8) + 2 * numerics.sum_depth(d, dtype) + \
        2 * config.ELEMENTARY_FUNCTION_ULPS + 4


def _err_attend(phi_q, phi_k, vh, eq, ek, ev, cfg, mask, dtype, l2=False):
    """E of the attention term, honouring the normaliser variant and the mask (grouped like _attend)."""
    extra = 6 if cfg.normaliser == "mean_scaled" else 0  # n^-1/2 (x2 scalings), the mean, 1/den, the product

    def one(pq, pk, v, e_q, e_k, e_v):
        eps = cfg.eps * pk.shape[-2] if cfg.normaliser == "mean_scaled" else cfg.eps
        return err_attention(pq, pk, v, e_q, e_k, e_v, eps=eps, extra_roundings=extra, dtype=dtype, l2=l2)

    if mask is None:
        return one(phi_q, phi_k, vh, eq, ek, ev)
    nw = mask.shape[0]
    out = np.empty(phi_q.shape[:-1] + (vh.shape[-1],))
    k_max = 0
    for w in range(nw):
        for qi, kj in _mask_groups(mask[w]):
            e, k = one(phi_q[w::nw, :, qi], phi_k[w::nw, :, kj], vh[w::nw, :, kj], eq[w::nw, :, qi],
                       ek[w::nw, :, kj], ev[w::nw, :, kj])
            out[w::nw, :, qi] = e
            k_max = max(k_max, k)
    return out, k_max


def _err_heads_and_dwc(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2=False):
    y, ey, depth = _err_core(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2)
    bias = params.get("proj.bias")
    out, eo, k_proj = err_linear(y, ey, _p(params, "proj.weight"), None if bias is None else _p(params, "proj.bias"),
                                 dtype, l2)
    return out, eo, depth + k_proj


def _err_core(q, eq, k, ek, v, ev, params, cfg, hw_kv, hw_q, mask, dtype, l2=False):
    """(y, E_y, depth) of :func:`_core` (``l2``: sigma instead of E)."""
    if cfg.positional_encoding:
        pe = _p(params, "positional_encoding")
        k = k + pe
        ek = _join(ek, np.abs(k), l2)
    phi_q, e_phi_q, dq = _err_features(q, eq, params, cfg, dtype, l2)
    phi_k, e_phi_k, _ = _err_features(k, ek, params, cfg, dtype, l2)
    vh, evh = _split_heads(v, cfg.num_heads), _split_heads(ev, cfg.num_heads)
    e_att, k_att = _err_attend(phi_q, phi_k, vh, e_phi_q, e_phi_k, evh, cfg, mask, dtype, l2)
    att = _attend(phi_q, phi_k, vh, normaliser=cfg.normaliser, eps=cfg.eps, order="linear", mask=mask, taps=None,
                  max_elements=None)
    dwc, e_dwc, k_dwc = _err_dwc(vh, evh, hw_kv, hw_q, _p(params, "dwc.weight"),
                                 None if params.get("dwc.bias") is None else _p(params, "dwc.bias"),
                                 cfg.dwc_shared, cfg.dwc_resample, dtype, l2)
    y = _merge_heads(att + dwc)
    # e_att and e_dwc share V's roundings: summed (Minkowski) in either mode; the addition's own rounding joins
    ey = _merge_heads(_join(e_att + e_dwc, np.abs(att) + np.abs(dwc), l2))
    return y, ey, _feature_depth(cfg.p, dq, dtype) + k_att + k_dwc + 1


def _bound(e: np.ndarray, depth: float, what: str, dtype: Any = None, sigma: Any = None) -> numerics.Bound:
    return numerics.running_bound(e, depth, what, dtype, sigma=sigma)


def _both(err: Callable[[bool], tuple[np.ndarray, float]], what: str, dtype: Any) -> numerics.Bound:
    """The running bound of a computation whose coefficient ``err(l2)`` returns (E or sigma, depth): the
    deterministic E and the probabilistic sigma (numerics.Bound) from the same propagation.  E >= sum_r |c_r|
    also bounds the l2 norm sqrt(sum_r c_r^2), so sigma is capped at E, and E stands in where sigma's own
    arithmetic overflowed (a square of a huge coefficient) while E's did not."""
    e, depth = err(False)
    sigma, _ = err(True)
    with np.errstate(invalid="ignore"):
        sigma = np.where(np.isfinite(sigma), np.fmin(sigma, e), e)
    return _bound(e, depth, what, dtype, sigma=sigma)


def focused_attention_bound(q: Any, k: Any, v: Any, *, p: float = config.FLATTEN_FOCUSING_FACTOR,
                            hw: tuple[int, int] | None = None, dwc_weight: Any = None, dwc_bias: Any = None,
                            eps: float = 0.0, normaliser: str = "sum", dtype: Any = None,
                            order: str | None = None, power_scaling: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_attention` (either order; inputs exact, i.e. already rounded to T).

    E = E_attention (kernelized-attention bound with f_p's error coefficients
    :func:`focused_function_error` as feature errors) + E_dwc (depthwise conv) + |attention| + |dwc| (the sum).

    Parameters
    ----------
    As :func:`focused_attention`; dtype : the tested precision T (for the exact quotient bound) or None.
    ``order`` and ``power_scaling`` are accepted and ignored (the bound covers both).

    Returns
    -------
    numerics.Bound with scale (B, h, N, e).

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    q = numerics.as_float(q, "q")
    k = numerics.as_float(k, "k")
    v = numerics.as_float(v, "v")
    sz = numerics.check_shapes(q=(q, "B h N d"), k=(k, "B h n d"), v=(v, "B h n e"))
    cfg = FocusedConfig(dim=sz["h"] * sz["d"], num_heads=sz["h"], p=p, normaliser=normaliser, eps=eps)
    phi_q = _focused_function_numpy(numerics.relu(q), p)
    phi_k = _focused_function_numpy(numerics.relu(k), p)
    if dwc_weight is not None:
        hw = validation.check_grid(hw, sz["n"], tokens="v")
        _check_dwc_args(dwc_weight, dwc_bias, sz)
        dwc_weight = numerics.as_float(dwc_weight, "dwc_weight")
        dwc_bias = None if dwc_bias is None else numerics.as_float(dwc_bias, "dwc_bias")

    def err(l2):
        e_q = focused_function_error(numerics.relu(q), p, dtype=dtype, l2=l2)
        e_k = focused_function_error(numerics.relu(k), p, dtype=dtype, l2=l2)
        e_att, k_att = _err_attend(phi_q, phi_k, v, e_q, e_k, np.zeros_like(v), cfg, None, dtype, l2)
        depth = _feature_depth(p, sz["d"], dtype) + k_att
        if dwc_weight is None:
            return e_att, depth
        shared = dwc_weight.shape[0] == sz["e"] and sz["h"] > 1
        att = _attend(phi_q, phi_k, v, normaliser=normaliser, eps=eps, order="linear", mask=None, taps=None,
                      max_elements=None)
        dwc, e_dwc, k_dwc = _err_dwc(v, np.zeros_like(v), tuple(hw), tuple(hw), dwc_weight, dwc_bias, shared,
                                     "bilinear", dtype, l2)
        return _join(e_att + e_dwc, np.abs(att) + np.abs(dwc), l2), depth + k_dwc + 1

    return _both(err, "focused attention" if dwc_weight is None else "focused attention + DWC", dtype)


def focused_linear_attention_bound(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                   dtype: Any = None, order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_linear_attention` (DeiT / PVT layout), either order.

    Stages: q / kv projections (gamma_{C+1}), with sr > 1 the reduction conv (gamma_{C sr^2 + 1}) and its
    LayerNorm (Jacobian + layers.layer_norm_bound), ReLU / eps / softplus scale, f_p
    (:func:`focused_function_error`), attention (:func:`err_attention`), DWC (with resampling), the sum and
    the output projection.  Returns numerics.Bound with scale (B, N, C).

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention_bound")
    c = cfg.dim
    zero = np.zeros_like(x)

    def err(l2):
        q, eq, kq = err_linear(x, zero, _p(params, "q.weight"), _opt(params, "q.bias", cfg.qkv_bias), dtype, l2)
        depth = kq
        if cfg.sr_ratio > 1:
            grid = x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)
            w_sr, b_sr = _p(params, "sr.weight"), _p(params, "sr.bias")
            red = conv2d(grid, w_sr, b_sr, stride=cfg.sr_ratio)
            s_red = conv2d(np.abs(grid), np.abs(w_sr), np.abs(b_sr), stride=cfg.sr_ratio)
            taps = int(np.prod(w_sr.shape[1:]))
            k_sr = numerics.sum_depth(taps, dtype) + 1
            hw_kv = red.shape[2], red.shape[3]
            tok = red.reshape(red.shape[0], c, -1).transpose(0, 2, 1)
            e_tok = _own(k_sr, numerics.sum_depth_l2(taps, dtype) + 1, s_red, l2)
            e_tok = e_tok.reshape(red.shape[0], c, -1).transpose(0, 2, 1)
            w_kv, b_kv = _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias)
            if l2:      # the conv's outputs err independently: through LayerNorm and kv in quadrature
                kv, ekv, k_nkv = err_norm_linear_l2(tok, e_tok, _p(params, "norm.weight"), _p(params, "norm.bias"),
                                                    cfg.layer_norm_eps, w_kv, b_kv, dtype)
            else:
                src, e_src, k_ln = err_layer_norm(tok, e_tok, _p(params, "norm.weight"), _p(params, "norm.bias"),
                                                  cfg.layer_norm_eps, dtype)
                kv, ekv, k_kv = err_linear(src, e_src, w_kv, b_kv, dtype)
                k_nkv = k_ln + k_kv
            depth = max(depth, k_sr + k_nkv)
        else:
            hw_kv = (big_h, big_w)
            kv, ekv, k_kv = err_linear(x, zero, _p(params, "kv.weight"), _opt(params, "kv.bias", cfg.qkv_bias),
                                       dtype, l2)
            depth = max(depth, k_kv)
        _, eo, d2 = _err_heads_and_dwc(q, eq, kv[..., :c], ekv[..., :c], kv[..., c:], ekv[..., c:], params, cfg,
                                       hw_kv, (big_h, big_w), None, dtype, l2)
        return eo, depth + d2

    return _both(err, f"focused_linear_attention ({'sr=' + str(cfg.sr_ratio)})", dtype)


def focused_window_attention_bound(x: Any, params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                   window_size: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                                   dtype: Any = None, order: str | None = None) -> numerics.Bound:
    """Error bound of :func:`focused_window_attention` (Swin layout), either order; stages as
    :func:`focused_linear_attention_bound` (qkv projection, features, attention per window and mask group,
    DWC on the window grid, projection); rolls and window partitions are exact.  Scale (B, N, C).

    References
    ----------
    FLatten Eq. 4-6, 10-12; docs/design.md "The verdict".
    """
    validation.check_config(cfg, FocusedConfig)
    x, big_h, big_w = _check_x(x, hw, cfg)
    (wh, ww), (sh, sw) = _window_geometry((big_h, big_w), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention_bound")
    b, c = x.shape[0], cfg.dim
    grid = x.reshape(b, big_h, big_w, c)
    if sh or sw:
        grid = np.roll(grid, (-sh, -sw), axis=(1, 2))
    win = window_partition(grid, (wh, ww))
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(big_h, big_w, (wh, ww), (sh, sw))

    def err(l2):
        qkv, e, k_lin = err_linear(win, np.zeros_like(win), _p(params, "qkv.weight"),
                                   _opt(params, "qkv.bias", cfg.qkv_bias), dtype, l2)
        _, eo, d2 = _err_heads_and_dwc(qkv[..., :c], e[..., :c], qkv[..., c:2 * c], e[..., c:2 * c],
                                       qkv[..., 2 * c:], e[..., 2 * c:], params, cfg, (wh, ww), (wh, ww), mask,
                                       dtype, l2)
        eg = window_reverse(eo, (wh, ww), big_h, big_w)
        if sh or sw:
            eg = np.roll(eg, (sh, sw), axis=(1, 2))
        return eg.reshape(b, big_h * big_w, c), k_lin + d2

    return _both(err, "focused_window_attention", dtype)


# ===================================================================================================
# Stages (teacher-forced comparison, refimpl.verdict.compare_stages)
# ===================================================================================================
#
# The stages are cut where the released modules (and the PyTorch twins) have submodules: the projections,
# PVT's reduction conv and its LayerNorm, and the output projection.  Between them lies the "core" (APE on K,
# features, attention, DWC and their sum), whose intermediates are not a submodule's input or output in a
# port; its bound holds with exact (tested) q, k, v.  Tensor names: "x" the module input (the windows for the
# Swin layout), then each stage's name.

def _core_stage(params: Mapping[str, Any], cfg: FocusedConfig, hw_kv, hw_q, mask, split) -> numerics.Stage:
    def reference(*t):
        q, k, v = split(*t)
        return _core(q, k, v, params, cfg, hw_kv, hw_q, mask, "linear", None, None)

    def bound(*t, dtype=None):
        q, k, v = split(*t)
        z = np.zeros_like
        _, ey, depth = _err_core(q, z(q), k, z(k), v, z(v), params, cfg, hw_kv, hw_q, mask, dtype)
        return _bound(ey, depth, "core (APE, features, attention, DWC, sum) on exact q, k, v", dtype)

    return numerics.Stage("core", (), reference, bound,
                          "FLatten Eq. 5-6 (f_p features), 10-12 (normalised attention + DWC(V))")


def _linear_stage(name: str, source: str, params: Mapping[str, Any], key: str, bias: bool,
                  equation: str) -> numerics.Stage:
    w, b = _p(params, key + ".weight"), _opt(params, key + ".bias", bias)
    return numerics.Stage(name, (source,), lambda x: linear(x, w, b), lambda x, dtype=None: linear_bound(x, w, b),
                          equation)


def _fine_core_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw_kv, hw_q, mask, qkv_inputs, split
                      ) -> list[numerics.Stage]:
    """The core cut finer, for ports whose features, attention and DWC input can be captured: "phi_q"
    (B, h, N, d), "phi_k" (B, h, n, d) (after the APE), "attention" (B, h, N, d), "dwc_in" (the depthwise
    conv's input, V resampled to the query grid: (B h, d, H, W) for a shared bank, else (B, h d, H, W)), "dwc"
    (its output, same layout) and "core" (B, N, C), their sum with heads merged."""
    h = cfg.num_heads
    shared = cfg.dwc_shared
    w_dwc, b_dwc = _p(params, "dwc.weight"), params.get("dwc.bias")
    pad = w_dwc.shape[-1] // 2
    big_h, big_w = hw_q

    def k_pe(k):
        return k + _p(params, "positional_encoding") if cfg.positional_encoding else k

    def feat_bound(t, e, what, dtype):
        _, ephi, d = _err_features(t, e, params, cfg, dtype)
        return _bound(ephi, _feature_depth(cfg.p, d, dtype) + (1 if cfg.positional_encoding else 0), what, dtype)

    def phi_k_bound(*t, dtype=None):
        k = k_pe(split(*t)[1])
        return feat_bound(k, np.abs(k) if cfg.positional_encoding else np.zeros_like(k),
                          "phi_p(K + APE) on exact K", dtype)

    def vh_of(*t):
        return _split_heads(split(*t)[2], h)

    def attention(phi_q, phi_k, *t):
        return _attend(phi_q, phi_k, vh_of(*t), normaliser=cfg.normaliser, eps=cfg.eps, order="linear", mask=mask,
                       taps=None, max_elements=None)

    def attention_bound(phi_q, phi_k, *t, dtype=None):
        vh = vh_of(*t)
        z = np.zeros_like
        e, k = _err_attend(phi_q, phi_k, vh, z(phi_q), z(phi_k), z(vh), cfg, mask, dtype)
        return _bound(e, k, "normalised attention on exact features and V", dtype)

    def to_conv(vr):            # (B, h, N, d) on the query grid -> the depthwise conv's input layout
        b, _, _, e = vr.shape
        g = _to_grid(vr, hw_q).transpose(0, 1, 4, 2, 3)
        return g.reshape(b * h, e, big_h, big_w) if shared else g.reshape(b, h * e, big_h, big_w)

    def dwc_in(*t):
        return to_conv(_resample_v(vh_of(*t), hw_kv, hw_q, cfg.dwc_resample))

    def dwc_in_bound(*t, dtype=None):
        vh = vh_of(*t)
        if tuple(hw_kv) == tuple(hw_q):
            return numerics.Bound(np.zeros(1), 1.0, "a reshape of V: exact")
        if cfg.dwc_resample == "linear_flat":
            _, e = _err_resample(vh, np.zeros_like(vh), big_h * big_w, 2, dtype)
            k = config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3
        else:
            g = _to_grid(vh, hw_kv)
            g, eg = _err_resample(g, np.zeros_like(g), big_h, 2, dtype)
            g, eg = _err_resample(g, eg, big_w, 3, dtype)
            e = eg.reshape(vh.shape[0], h, big_h * big_w, -1)
            k = 2 * (config.FLATTEN_RESAMPLE_INDEX_ROUNDINGS + 3)
        return _bound(to_conv(e), k, f"V resampled {hw_kv} -> {hw_q} ({cfg.dwc_resample})", dtype)

    def back(dw, like):         # the conv's output layout -> (B, h, N, d)
        b, _, n, e = like.shape
        return dw.reshape(b, h, e, n).swapaxes(-1, -2)

    def core(att, dw):
        return _merge_heads(att + back(dw, att))

    return [
        numerics.Stage("phi_q", qkv_inputs, lambda *t: _features(split(*t)[0], params, cfg),
                       lambda *t, dtype=None: feat_bound(split(*t)[0], np.zeros_like(split(*t)[0]),
                                                         "phi_p(Q) on exact Q", dtype),
                       "FLatten Eq. 5-6: phi_p(ReLU(Q) / softplus(s))"),
        numerics.Stage("phi_k", qkv_inputs, lambda *t: _features(k_pe(split(*t)[1]), params, cfg), phi_k_bound,
                       "FLatten Eq. 5-6: phi_p(ReLU(K + APE) / softplus(s))"),
        numerics.Stage("attention", ("phi_q", "phi_k") + qkv_inputs, attention, attention_bound,
                       "FLatten Eq. 4, 10: the normalised linear attention"),
        numerics.Stage("dwc_in", qkv_inputs, dwc_in, dwc_in_bound, "FLatten Eq. 12: V on the query grid"),
        numerics.Stage("dwc", ("dwc_in",), lambda g: depthwise_conv2d(g, w_dwc, b_dwc, padding=pad),
                       lambda g, dtype=None: depthwise_conv2d_bound(g, w_dwc, b_dwc, padding=pad),
                       "FLatten Eq. 12: DWC(V)"),
        numerics.Stage("core", ("attention", "dwc"), core,
                       lambda att, dw, dtype=None: numerics.Bound(
                           _merge_heads(np.abs(att) + np.abs(back(dw, att))), 1.0,
                           "the sum attention + DWC(V): one addition", accumulation=True),
                       "FLatten Eq. 12: attention + DWC(V)"),
    ]


def focused_linear_attention_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                    fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`focused_linear_attention` (DeiT / PVT layout), for
    :func:`refimpl.verdict.compare_stages`.

    Tensors: "x" (B, N, C); "q" (B, N, C); with sr > 1 "sr" (B, C, H/sr, W/sr) (the reduction conv's output,
    channels-first as nn.Conv2d gives it) and "norm" (B, n, C); "kv" (B, n, 2C); "core" (B, N, C) (the output
    projection's input); "proj" (B, N, C), the module's output.  ``fine``: the core is cut further into
    "phi_q", "phi_k", "attention", "dwc_in", "dwc" and "core" (:func:`_fine_core_stages`), which the bound
    needs in float16 / bfloat16 at real sizes (docs/verdict.md).

    References
    ----------
    FLatten Eq. 5-6, 10-12; PVT's spatial-reduction attention.
    """
    big_h, big_w = validation.check_grid(hw)
    _check_params(params, cfg, "global", (big_h, big_w), "focused_linear_attention_stages")
    c = cfg.dim
    stages = [_linear_stage("q", "x", params, "q", cfg.qkv_bias, "FLatten Eq. 5: Q = x W_Q")]
    if cfg.sr_ratio > 1:
        w_sr, b_sr = _p(params, "sr.weight"), _p(params, "sr.bias")
        sr = cfg.sr_ratio

        def grid(x):
            return x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)

        def tokens(red):
            return red.reshape(red.shape[0], c, -1).transpose(0, 2, 1)

        w_n, b_n = _p(params, "norm.weight"), _p(params, "norm.bias")
        stages += [
            numerics.Stage("sr", ("x",), lambda x: conv2d(grid(x), w_sr, b_sr, stride=sr),
                           lambda x, dtype=None: conv2d_bound(grid(x), w_sr, b_sr, stride=sr),
                           "PVT spatial reduction: Conv_{sr x sr, stride sr}"),
            numerics.Stage("norm", ("sr",), lambda red: layer_norm(tokens(red), w_n, b_n, cfg.layer_norm_eps),
                           lambda red, dtype=None: layer_norm_bound(tokens(red), w_n, b_n, cfg.layer_norm_eps,
                                                                    dtype=dtype),
                           "PVT spatial reduction: LayerNorm"),
        ]
        source, hw_kv = "norm", (big_h // sr, big_w // sr)
    else:
        source, hw_kv = "x", (big_h, big_w)
    stages.append(_linear_stage("kv", source, params, "kv", cfg.qkv_bias, "FLatten Eq. 5: K, V = x W_K, x W_V"))
    split = (lambda q, kv: (q, kv[..., :c], kv[..., c:]))
    if fine:
        stages += _fine_core_stages(params, cfg, hw_kv, (big_h, big_w), None, ("q", "kv"), split)
    else:
        stages.append(dataclasses.replace(_core_stage(params, cfg, hw_kv, (big_h, big_w), None, split),
                                          inputs=("q", "kv")))
    stages.append(_linear_stage("proj", "core", params, "proj", True, "FLatten Eq. 12: the output projection"))
    return stages


def focused_window_attention_stages(params: Mapping[str, Any], cfg: FocusedConfig, hw: tuple[int, int], *,
                                    window_size: int | tuple[int, int],
                                    shift: int | tuple[int, int] = 0, fine: bool = False) -> list[numerics.Stage]:
    """The stages of :func:`focused_window_attention` (Swin layout), per window, for
    :func:`refimpl.verdict.compare_stages`.  The shift and the window partition are exact and are not stages.

    Tensors: "x" (B nW, n, C), the windows of the shifted grid (the qkv projection's input); "qkv"
    (B nW, n, 3C); "core" (B nW, n, C); "proj" (B nW, n, C) (before the window reverse).  ``fine``: as in
    :func:`focused_linear_attention_stages`.

    References
    ----------
    FLatten Eq. 5-6, 10-12, §4.3 (Swin); Swin Transformer §3.2.
    """
    (wh, ww), (sh, sw) = _window_geometry(validation.check_grid(hw), window_size, shift)
    _check_params(params, cfg, "window", (wh, ww), "focused_window_attention_stages")
    c = cfg.dim
    mask = None
    if (sh or sw) and cfg.shift_mask == "apply":
        mask = shifted_window_mask(hw[0], hw[1], (wh, ww), (sh, sw))
    split = (lambda qkv: (qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]))
    if fine:
        core = _fine_core_stages(params, cfg, (wh, ww), (wh, ww), mask, ("qkv",), split)
    else:
        core = [dataclasses.replace(_core_stage(params, cfg, (wh, ww), (wh, ww), mask, split), inputs=("qkv",))]
    return [_linear_stage("qkv", "x", params, "qkv", cfg.qkv_bias, "FLatten Eq. 5: Q, K, V = x W"), *core,
            _linear_stage("proj", "core", params, "proj", True, "FLatten Eq. 12: the output projection")]
