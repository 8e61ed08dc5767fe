"""The error calculus: one rule per primitive for the running error bounds of the computations the reference
defines, written once and used by the bounds of RALA (:mod:`refimpl.attention.rala_bounds`), FLatten, L2ViT and
the networks (:mod:`refimpl.attention.focused_bounds`' ``err_linear`` / ``err_layer_norm`` / ``err_dwconv``,
:mod:`refimpl.models.common`, :mod:`refimpl.models._netparts`), Castling-ViT
(:mod:`refimpl.attention.angular_series`' ``_e_matmul``, ``_e_normalize``), the verify tool's head wiring
(:mod:`refimpl.verify.head_wiring`) and the layers' own bounds (:mod:`refimpl.layers`'
``linear_bound``, ``layer_norm_bound``, ``conv2d_bound``, ``depthwise_conv2d_bound``, ``batch_norm2d_bound``,
``gelu_bound``: their magnitudes S and rounding counts are :func:`linear_scale`, :func:`layer_norm_scale`,
:func:`conv_parts`, :func:`batch_norm_scale`, :func:`gelu_roundings`).

Every intermediate x of a computation carries a bound E_x on its error; a rule takes the operands, their bounds
and a :class:`Precision` and returns the bound of the result.  Two models share the rules:

- **rigorous** (``Precision.of(dtype)``): E is an absolute error bound in T.  Rounding model (Higham, "Accuracy
  and Stability of Numerical Algorithms", 2nd ed., 2002: eq. 2.8 with gradual underflow): a product, quotient
  or stored sum is (exact)(1 + delta) + eta, |delta| <= u_T, |eta| <= eta_T (:func:`refimpl.numerics.underflow_eta`);
  additions are exact in the subnormal range; k such factors compound to |theta_k| <= gamma_k = k u / (1 - k u)
  (Lemma 3.1), so an n-term inner product computed in any order errs by at most gamma_n |a|^T |b| (eq. 3.4/3.5)
  plus n eta_T.  A sum accumulated in a wider format A (config.ACCUMULATION_FORMAT) and stored in T counts
  n u_A / u_T + 1 roundings of size u_T (:meth:`Precision.sums`, :func:`refimpl.numerics.sum_depth`); an
  elementary function is accurate to config.ELEMENTARY_FUNCTION_ULPS ulps.  The carried errors enter the
  magnitudes: an operand x' = x + dx, |dx| <= E_x, has |x'| <= |x| + E_x (:meth:`Precision.mag`).
- **first order** (``Precision.coefficients(dtype)``): E is a coefficient in units of u_T,
  |fl_T(x) - x| <= u_T E + O(u_T^2); the same rules with gamma_k -> k, u -> 1, products of two error terms
  dropped (the magnitudes are |x|, not |x| + E_x, and 1 + gamma_r -> 1), the underflow term eta_T / u_T or 0
  (the caller's choice; ``eta``).

Each rule returns the bound only (the caller computes the value itself).  Where a rule needs a forward operation
that lives above this layer (a depthwise convolution, the backends' kernels), the caller passes it in.

Layer: imports refimpl.numerics and NumPy only (refimpl.config at most besides:
tests/test_import_graph.py::test_the_error_calculus_sits_below_the_layers); docs/design.md "The error calculus".
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import config, numerics

__all__ = ["Precision", "e_contract", "e_contract3", "e_matmul", "e_product", "e_sum2", "e_quotient",
           "e_accumulate", "e_linear", "e_depthwise", "layer_norm_parts", "e_layer_norm", "layer_norm_cap",
           "layer_norm_outside",
           "e_elementwise", "e_roundings", "e_mean", "e_normalize", "linear_scale", "conv_parts", "layer_norm_scale",
           "gelu_roundings", "e_gelu", "BATCH_NORM_ROUNDINGS", "batch_norm_scale", "e_batch_norm",
           "LAYER_NORM_ROUNDINGS", "CONV_ALGORITHMS", "conv_algorithms", "covering_conv_algorithms",
           "WINOGRAD_BT", "WINOGRAD_G", "WINOGRAD_AT", "winograd_applies", "winograd_roundings", "winograd_scale",
           "conv_scale", "conv_min_batch", "fft_tile_roundings", "fft_tile_scale", "other_algorithm_scales",
           "rigorous_bound"]


@dataclasses.dataclass(frozen=True)
class Precision:
    """The tested precision T as the calculus sees it: unit roundoff ``u``, underflow unit ``eta``, the format
    name (its sums accumulate in config.ACCUMULATION_FORMAT; None: in T itself) and the model (``first_order``).

    :meth:`of` gives the rigorous model (u = u_T, eta = eta_T); :meth:`coefficients` the first-order model in
    units of u_T (u = 1, eta = eta_T / u_T or 0)."""

    u: float
    eta: float
    dtype: Any = "float64"
    first_order: bool = False

    @classmethod
    def of(cls, dtype: Any) -> "Precision":
        """The rigorous model of ``dtype`` (a NumPy / torch dtype or its name)."""
        return cls(numerics.unit_roundoff(dtype), numerics.underflow_eta(dtype), numerics.format_name(dtype))

    @classmethod
    def coefficients(cls, dtype: Any = None, eta: float = 0.0) -> "Precision":
        """The first-order model, bounds in units of u_T of ``dtype`` (None: sums in T, no mixed precision);
        ``eta`` the underflow term per rounding in units of u_T (0: neglected)."""
        return cls(1.0, float(eta), None if dtype is None else numerics.format_name(dtype), True)

    def g(self, n: float) -> float:
        """gamma_n(u) (Higham Lemma 3.1; inf where n u >= 1: no bound of this form), n in units of u (it may
        count mixed-precision sums as fractions of a rounding, :meth:`sums`: Lemma 3.1 holds with a unit
        roundoff per factor, |theta| <= sum u_i / (1 - sum u_i)); first order: n itself."""
        return float(n) if self.first_order else numerics.gamma(n, self.u)

    def factor(self, n: float) -> float:
        """1 + gamma_n (first order: 1)."""
        return 1.0 if self.first_order else 1 + self.g(n)

    def sums(self, n: float) -> float:
        """The rounding count, in units of u_T, of an n-term sum whose result is stored in T
        (:func:`refimpl.numerics.sum_depth`: n, or n u_A / u_T + 1 with a wider accumulation format A)."""
        return numerics.sum_depth(n, self.dtype)

    def mag(self, x: Any, ex: Any) -> Any:
        """A bound on the magnitude of the computed operand: |x| + E_x (first order: |x|)."""
        return np.abs(x) if self.first_order else np.abs(x) + ex


def rigorous_bound(e: np.ndarray, depth: float, pr: Precision, note: str, sigma: Any = None,
                   e_ref: Any = None) -> numerics.Bound:
    """The :class:`refimpl.numerics.Bound` of a rigorous absolute bound E (:meth:`Precision.of`) of depth K:
    scale = E / gamma_K(u_T) and k = K, so that gamma_K(u_T) scale = E (up to the float64 rounding of the quotient
    and of the product, a factor within gamma_2(u_64)).  With mixed-precision counts (:meth:`Precision.sums`) every
    count c is at least c u_A / u_T, so K u_T / u_A bounds the float64 reference's own count (ref_depth).
    ``sigma``: an l2 coefficient (units of u_T), capped at E / u_T (E bounds the l1 norm of the first-order
    coefficients, hence their l2 norm); E / u_T stands in where sigma is not finite.  ``e_ref``: the same E
    evaluated in float64, the reference's own error, used (Bound.ref_scale) where E in T is not finite (there
    E / gamma_K is no scale for the reference's error).  Where gamma_K is infinite (K u_T >= 1) the scale is
    inf: no bound of this form exists."""
    ratio = numerics.accumulation_ratio(pr.dtype)
    ref_depth = depth / ratio if ratio < 1.0 else None
    ref_scale = None
    if e_ref is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            g_t = pr.g(depth)
            own = e / g_t if math.isfinite(g_t) else np.full_like(e, np.inf)
            ref_scale = np.where(np.isfinite(own), own,
                                 e_ref / numerics.gamma(depth if ref_depth is None else ref_depth,
                                                        numerics.unit_roundoff("float64")))
    if sigma is not None:
        cap = np.asarray(e, dtype=np.float64) / pr.u
        with np.errstate(invalid="ignore"):
            sigma = np.where(np.isfinite(sigma), np.fmin(sigma, cap), cap)
    g = pr.g(depth)
    if not math.isfinite(g):  # K u >= 1: no bound of this form exists (inf, not E / inf = 0 and 0 * inf = NaN)
        return numerics.Bound(np.full_like(e, np.inf), depth, note + f"; gamma_K is infinite (K = {depth}): no bound",
                              sigma=sigma, ref_depth=ref_depth, ref_scale=ref_scale)
    mixed = (f"; sums accumulated in {config.ACCUMULATION_FORMAT[pr.dtype]} and counted as n u_A/u_T + 1"
             if ratio < 1.0 else "")
    return numerics.Bound(e / g, depth,
                          note + mixed + "; scale = E / gamma_K so that gamma_K * scale = E (rigorous up to the "
                                         "libm accuracy assumption)",
                          ref_depth=ref_depth, sigma=sigma, ref_scale=ref_scale)


# ---------------------------------------------------------------------------------------------------
# Contractions and element-wise arithmetic
# ---------------------------------------------------------------------------------------------------

def e_contract(spec: str, a, ea, b, eb, n: float, m: int, pr: Precision) -> np.ndarray:
    """Error of einsum(spec, a, b), m products per output, n roundings per term (the sum's
    :meth:`Precision.sums` plus the roundings of constants folded in):
    gamma_n (A+)(B+) + E_A (B+) + |A| E_B + m eta, A+ = :meth:`Precision.mag` (Higham eq. 3.4/3.5 for any
    summation order, and |A'B' - AB| <= E_A |B'| + |A| E_B)."""
    ap, bp = pr.mag(a, ea), pr.mag(b, eb)
    with np.errstate(over="ignore", invalid="ignore"):
        return (pr.g(n) * np.einsum(spec, ap, bp, optimize=True) + np.einsum(spec, ea, bp, optimize=True)
                + np.einsum(spec, np.abs(a), eb, optimize=True) + m * pr.eta)


def e_contract3(spec: str, a, ea, b, eb, c, ec, n: float, m: int, pr: Precision) -> np.ndarray:
    """Error of einsum(spec, a, b, c), m terms per output, 2 products and n roundings per term:
    gamma_n (A+)(B+)(C+) + E_A (B+)(C+) + |A| E_B (C+) + |A||B| E_C + 2 m eta
    + eta (1 + gamma_n) (sum (A+) + sum (B+) + sum (C+)).

    The last term is the underflow of an intermediate: an evaluation in two stages (say (a b) c) stores the
    partial products in T, each with an underflow of up to eta, which the outer factor then multiplies (by more
    than 1 where it is large: a float16 case in tests/test_bounds_calculus.py errs 29 times the bound without
    it).  The association is the implementation's choice, so each factor's magnitude summed over the output's
    terms (``einsum(spec, ., 1, 1)`` and its two siblings, an over-count by the inner sizes, never an under-count)
    is charged once; the term is eta-sized, so it matters only where the data are near T's underflow."""
    ap, bp, cp = pr.mag(a, ea), pr.mag(b, eb), pr.mag(c, ec)
    with np.errstate(over="ignore", invalid="ignore"):
        e = (pr.g(n) * np.einsum(spec, ap, bp, cp, optimize=True)
             + np.einsum(spec, ea, bp, cp, optimize=True)
             + np.einsum(spec, np.abs(a), eb, cp, optimize=True)
             + np.einsum(spec, np.abs(a), np.abs(b), ec, optimize=True) + 2 * m * pr.eta)
        if pr.eta > 0:
            one_a, one_b, one_c = np.ones_like(ap), np.ones_like(bp), np.ones_like(cp)
            e = e + pr.eta * (1 + pr.g(n)) * (np.einsum(spec, ap, one_b, one_c, optimize=True)
                                              + np.einsum(spec, one_a, bp, one_c, optimize=True)
                                              + np.einsum(spec, one_a, one_b, cp, optimize=True))
        return e


def e_matmul(a, ea, b, eb, pr: Precision) -> np.ndarray:
    """Error of the (stacked) matrix product a @ b, n = a.shape[-1] terms per output:
    E_A (B+) + |A| E_B + gamma_{sums(n)} (A+)(B+) + n eta (Higham eq. 3.5; the sum counted by
    :meth:`Precision.sums`).  The same rule as :func:`e_contract`, evaluated by matmul in this order."""
    n = a.shape[-1]
    aa, bp = np.abs(a), pr.mag(b, eb)
    ap = aa if pr.first_order else aa + ea
    return ea @ bp + aa @ eb + pr.g(pr.sums(n)) * (ap @ bp) + n * pr.eta


def e_product(a, ea, b, eb, pr: Precision) -> np.ndarray:
    """Error of the element-wise product a * b (one rounding): gamma_1 (A+)(B+) + E_A (B+) + |A| E_B + eta."""
    ap, bp = pr.mag(a, ea), pr.mag(b, eb)
    return pr.g(1) * ap * bp + ea * bp + np.abs(a) * eb + pr.eta


def e_sum2(a, ea, b, eb, pr: Precision, *, on_sum: bool = False) -> np.ndarray:
    """Error of a + b (one rounding; no underflow term: additions are exact in the subnormal range):
    E_a + E_b + u (|a| + |b| + E_a + E_b) (first order: u (|a| + |b|)).

    ``on_sum``: the rounding charged on the sum itself, fl(a' + b') = (a' + b')(1 + delta) with
    |a' + b'| <= |a + b| + E_a + E_b: E_a + E_b + u (|a + b| + E_a + E_b) (first order: u |a + b|), never
    larger (a residual connection's bound, :func:`refimpl.models.common.e_add`)."""
    s = np.abs(a + b) if on_sum else np.abs(a) + np.abs(b)
    if not pr.first_order:
        s = s + ea + eb
    return ea + eb + pr.u * s


def e_mean(x, ex, axis: Any, pr: Precision) -> np.ndarray:
    """Error of the mean of x over ``axis`` (an int or a tuple; n terms), x carrying E_x: the sum of n terms
    (n - 1 additions, counted by :meth:`Precision.sums` as sums(n - 1): n - 1, or (n - 1) u_A / u_T + 1 with a
    wider accumulation format) and the division by n (one more rounding, r = sums(n - 1) + 1), each term's
    error passing through the mean: mean(E_x) + gamma_r mean(X+) + eta (the division's underflow; the
    additions are exact in the subnormal range); first order mean(E_x) + r mean(|x|), r = n in T."""
    n = int(np.prod([np.shape(x)[a] for a in np.atleast_1d(axis)]))
    r = pr.sums(n - 1) + 1
    return e_roundings(np.mean(pr.mag(x, ex), axis=axis), np.mean(ex, axis=axis), r, pr, underflows=1)


def e_quotient(y, a_err, b, b_err, pr: Precision, roundings: int = 2) -> np.ndarray:
    """Error of y = a / b computed with r = ``roundings`` roundings (one division, or a reciprocal and a product):
    (1 + gamma_r)(E_a + |y| E_b) / (|b| - E_b) + gamma_r |y| + r eta.

    The low-denominator guard: where E_b >= |b| the computed denominator may be 0 (or of either sign) and no
    bound exists: +inf there, never a finite value (first order: where b = 0)."""
    low = np.abs(b) if pr.first_order else np.abs(b) - b_err
    gr = pr.g(roundings)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = pr.factor(roundings) * (a_err + np.abs(y) * b_err) / low + gr * np.abs(y) + roundings * pr.eta
    return np.where(low > 0, e, np.inf)


def e_normalize(x, ex, eps: float, policy: str, pr: Precision, y: Any = None) -> np.ndarray:
    """Error of the row normalisation y = x / D over the last axis (d terms), D = max(||x||_2, eps) (``policy``
    "clamp") or ||x||_2 ("none"), the norm evaluated as sqrt(sum x_i^2) (torch's ``norm``; d = 1: |x|), x carrying
    E_x; ``y`` the caller's value of x / D (None: |x| / D from the exact norm).  First order only (``pr`` from
    :meth:`Precision.coefficients`, E and the underflow term eta in units of u_T):

        E_y = E_x / D + |y| (||E_x||_2 / D + sums(d) / 2 + 2 + [||x||_2 >= eps, d > 1] d eta / (2 ||x||_2^2))
              + eta.

    Derivation: the input error moves the norm by at most ||E_x||_2 (triangle inequality; the max with eps is
    1-Lipschitz); the sum of squares is the inner product x . x, relative error gamma_{sums(d)} (Higham eq. 3.5,
    :meth:`Precision.sums`), halved by the square root (sqrt(1 + t) = 1 + t/2 + O(t^2)), and the square root
    rounds once (Higham eq. 2.2): |dD| <= ||E_x||_2 + (sums(d)/2 + 1) ||x||_2.  Each of the d squares may
    underflow by eta (eq. 2.8; the evaluation squares without scaling), d eta on the sum and d eta / (2 ||x||_2)
    on the norm, not where the clamp holds D = eps nor for d = 1.  The quotient x'/D' differs from x/D by
    E_x / D + |y| |dD| / D to first order and rounds once more, (1 + delta) y + eta: |y| + eta (a component
    small against the norm has a subnormal quotient, whose absolute error eta no relative term covers: a
    float32 row (1e-42, 1, 2) normalised by torch errs 0.62 eta in its first component, 4.7e3 times the
    relative terms).  ||x||_2 and ||E_x||_2 are computed as
    m ||x/m||, m = max|x|, free of underflow (the exact norm, not the tested evaluation's)."""
    if not pr.first_order:
        raise numerics.ArgumentError("argument 'pr': the normalisation rule is first order; expected "
                                     "Precision.coefficients(dtype), got the rigorous model Precision.of")
    if policy not in ("clamp", "none"):
        raise numerics.ArgumentError(f"argument 'policy': expected 'clamp' or 'none', got {policy!r}")
    d = np.shape(x)[-1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        nrm = _row_norm(x)
        den = np.maximum(nrm, eps) if policy == "clamp" else nrm
        ay = np.abs(x) / den if y is None else np.abs(y)
        under = np.where((nrm >= eps) & (d > 1), d * pr.eta / (2.0 * nrm * nrm), 0.0)
        return ex / den + ay * (_row_norm(ex) / den + pr.sums(d) / 2.0 + 2.0 + under) + pr.eta


def _row_norm(x) -> np.ndarray:
    """||x||_2 over the last axis (keepdims) as m ||x/m||, m = max|x|: free of underflow for subnormal rows."""
    m = np.max(np.abs(x), axis=-1, keepdims=True)
    safe = np.where(m > 0, m, 1.0)
    return m * np.sqrt(np.sum((x / safe) ** 2, axis=-1, keepdims=True))


# ---------------------------------------------------------------------------------------------------
# Layers: linear, depthwise convolution, LayerNorm, element-wise functions
# ---------------------------------------------------------------------------------------------------

def e_accumulate(s, prop, n: int, biased: bool, pr: Precision) -> np.ndarray:
    """The common form of a linear map's bound (Higham eq. 3.12 per output): an n-term inner product with
    magnitude S (the map applied to the operands' magnitudes, plus |b|) and propagated error P (the map's
    absolute value applied to E_x): gamma_{sums(n) + [bias]} S + P + n eta."""
    return pr.g(pr.sums(n) + (1 if biased else 0)) * s + prop + n * pr.eta


def e_linear(x, ex, weight, bias, pr: Precision, *, flat: bool = False) -> np.ndarray:
    """Error of x W^T + b (torch.nn.Linear; weight (out, in), bias (out,) or None), x carrying E_x:
    :func:`e_accumulate` with S = (X+)|W|^T + |b|, P = E_x |W|^T, n = in.

    ``flat``: S as one 2-D product of the rows (refimpl.layers.linear's evaluation) instead of NumPy's stacked
    matmul; the two differ only in the float64 rounding of the bound itself."""
    aw = np.abs(weight)
    s = _linear_s(pr.mag(x, ex), aw, bias, flat)
    return e_accumulate(s, ex @ aw.T, weight.shape[-1], bias is not None, pr)


def linear_scale(x, weight, bias, *, flat: bool = True) -> np.ndarray:
    """The magnitude S = |x||W|^T + |b| of x W^T + b (exact operands; :func:`e_linear`'s S), evaluated as one 2-D
    product of the rows (``flat``, refimpl.layers.linear's evaluation) or as NumPy's stacked matmul."""
    return _linear_s(np.abs(x), np.abs(weight), bias, flat)


def _linear_s(xp, aw, bias, flat: bool) -> np.ndarray:
    n = aw.shape[-1]
    if flat:
        s = (xp.reshape(-1, n) @ aw.T).reshape(*xp.shape[:-1], aw.shape[0])
    else:
        s = xp @ aw.T
    if bias is not None:
        s = s + np.abs(bias)
    return s


def e_depthwise(x, ex, weight, bias, pr: Precision, conv: Callable[..., np.ndarray],
                padding: Any = None) -> np.ndarray:
    """Error of a depthwise convolution (B, C, H, W) with weight (C, 1, KH, KW), x carrying E_x:
    :func:`e_accumulate` with S = conv(X+, |W|, |b|), P = conv(E_x, |W|), n = KH KW.  ``conv(x, w, b)`` is the
    caller's convolution (refimpl.layers.depthwise_conv2d with its padding and stride): the calculus sits below
    the layers.  ``padding`` (top, bottom, left, right, or one int), given where ``conv`` has stride and dilation 1:
    the larger of that and the bound gamma_k S + P of every other algorithm :func:`conv_algorithms` covers
    (:func:`other_algorithm_scales`; the input errors propagate through the same linear map, so P is
    unchanged).  In a mixed-precision T those algorithms' own roundings are the accumulation format's
    (sums(k_a) - 1 in units of u_T: the transforms run in A, as cuDNN's half-precision convolutions do) and the
    result's rounding to T is on the output, whose magnitude the direct S bounds."""
    kk = weight.shape[2] * weight.shape[3]
    aw = np.abs(weight)
    ab = None if bias is None else np.abs(bias)
    mag = pr.mag(x, ex)
    prop = conv(ex, aw, None)
    s = conv(mag, aw, ab)
    e = e_accumulate(s, prop, kk, bias is not None, pr)
    if padding is not None:
        for s_alg, k_alg in other_algorithm_scales(mag, aw, ab, padding, 1, 1, groups=weight.shape[0]):
            e = np.maximum(e, pr.g(pr.sums(k_alg) - 1) * s_alg + pr.g(1) * s + prop + k_alg * pr.eta)
    return e


def conv_parts(x, weight, bias, conv: Callable[..., np.ndarray], padding: Any, stride: Any = 1,
               dilation: Any = 1, groups: int = 1) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(S, k, S_store) of a convolution's own rounding on exact operands, x (B, C, H, W), weight (O, C / groups,
    KH, KW), bias (O,) or None: |fl(y) - y| <= gamma_k S + k eta elementwise (refimpl.layers.conv2d_bound and
    depthwise_conv2d_bound; the :class:`refimpl.numerics.Bound` of scale S and depth k, an accumulation bound).

    Derivation: each output is y = b + sum_j w_j x_j over the n = (C / groups) KH KW taps of its receptive field
    (a tap on the zero padding is an exact zero product).  Each product rounds once; a sum of the n products
    and the bias, in any order, passes every term through at most n additions; so each term carries at most
    n + 1 rounding factors and |fl(y) - y| <= gamma_{n+1} (sum_j |w_j||x_j| + |b|) (Higham eq. 3.12 with the
    bias as one more term, Lemma 3.1).  Each of the n products may also underflow by eta (eq. 2.8; the
    additions are exact in the subnormal range): n eta <= k eta.  So S = conv(|x|, |W|, |b|), k = n + [bias]
    (n without a bias); a sum accumulated in a wider format is the Bound's business (its ``accumulation``
    factor).  ``conv(x, w, b)`` is the caller's convolution with its stride, padding, dilation and groups
    (the calculus sits below the layers); ``padding`` (top, bottom, left, right, or one int), ``stride``,
    ``dilation`` and ``groups`` are the same convolution's, for the other algorithms :func:`conv_algorithms`
    covers (:func:`conv_scale`: S = max(S, S_a k_a / k) where one applies).  S_store: None where none applies,
    else the direct S, the magnitude of the output that the roundings to a mixed-precision T apply to (the other
    algorithms' transforms run in the accumulation format; :attr:`refimpl.numerics.Bound.store_scale`)."""
    aw = np.abs(weight)
    s = conv(np.abs(x), aw, None if bias is None else np.abs(bias))
    k = int(np.prod(np.shape(weight)[1:])) + (1 if bias is not None else 0)
    s2 = conv_scale(s, k, x, aw, bias, padding, stride, dilation, groups)
    return s2, k, (None if s2 is s else s)


def layer_norm_parts(x, ex, weight, bias, eps: float, pr: Precision) -> tuple[np.ndarray, np.ndarray, float]:
    """(S, P, k) of LayerNorm over the last axis, x carrying E_x, first order (the parts of :func:`e_layer_norm`;
    an l2 coefficient joins them in its own way).

    Own rounding (the mean, the centred squares' mean, eps, the sqrt, the quotient, the scale and the shift):
    with d_i = x_i - mean and s = sqrt(var + eps), the computed mean errs by gamma_{n+1} mean|x|, which enters
    d_i additively and var only quadratically, so |err y_i| <= k S_i, S = (|d| + mean|x|) / s |w| + |b|,
    k = sums(n) + 8 (over one channel the mean is exact: the mean|x| term drops; refimpl.layers.layer_norm_bound).
    Input errors through the Jacobian (w_i / s)(delta_ij - 1/n - xh_i xh_j / n), bounded by
    P = |w_i| / s (e_i + mean(e) + |xh_i| mean(|xh| e)); P = 0 over one channel (the output is the bias)."""
    n = x.shape[-1]
    scale, d, s = _layer_norm_s(x, weight, bias, eps, pr.dtype)
    xh = d / s
    w = 1.0 if weight is None else np.abs(weight)
    prop = w / s * (ex + np.mean(ex, axis=-1, keepdims=True) + np.abs(xh) * np.mean(np.abs(xh) * ex, axis=-1,
                                                                                       keepdims=True))
    if n == 1:
        prop = np.zeros_like(prop)
    return scale, np.where(np.isinf(scale), np.inf, prop), pr.sums(n) + LAYER_NORM_ROUNDINGS


def layer_norm_scale(x, weight, bias, eps: float, pr: Precision) -> tuple[np.ndarray, float]:
    """(S, k) of LayerNorm's own rounding over the last axis on an exact input, first order
    (:func:`layer_norm_parts`: S = (|d| + mean|x|) / s |w| + |b|, k = sums(n) + 8;
    refimpl.layers.layer_norm_bound)."""
    return _layer_norm_s(x, weight, bias, eps, pr.dtype)[0], pr.sums(x.shape[-1]) + LAYER_NORM_ROUNDINGS


def layer_norm_outside(x, eps: float, dtype: Any) -> np.ndarray:
    """Rows (keepdims) outside the first-order LayerNorm model's domain in T: rho = (sums(n) + 1) u_T mean|x| / s
    >= 1, the computed mean's error bound at least the standard deviation s = sqrt(var + eps).  There the
    variance is decided by rounding, not by the data: a Welford-type evaluation (PyTorch's CPU kernel) can lose
    it entirely (s' -> sqrt(eps)), and its output then errs by far more than the two-pass model's bound
    (measured: 693 times :func:`layer_norm_parts`' bound at rho ~ 300, tests/test_layer_norm_error.py).  No
    bound of this form is claimed there (inf: the verdict is "inconclusive"); the bounds it replaces were void
    there already (relative size >= k / (sums(n) + 1) rho at the elements where mean|x| / s dominates).  Over
    one channel the output is the bias exactly: never outside.  ``dtype`` None (the dtype-free model): nothing
    is outside."""
    n = x.shape[-1]
    if dtype is None or n == 1:
        return np.zeros(x.shape[:-1] + (1,), dtype=bool)
    mu = np.mean(x, axis=-1, keepdims=True)
    s = np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    u = numerics.unit_roundoff(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (numerics.sum_depth(n, dtype) + 1) * u * np.mean(np.abs(x), axis=-1, keepdims=True) / s
    return ~(rho < 1.0)


def _layer_norm_s(x, weight, bias, eps: float, dtype: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, d, s): the scale of :func:`layer_norm_parts` (inf on the rows :func:`layer_norm_outside` T's
    first-order domain), the centred input d = x - mean and s = sqrt(var + eps)."""
    n = x.shape[-1]
    mu = np.mean(x, axis=-1, keepdims=True)
    d = x - mu
    s = np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)
    mean_err = np.mean(np.abs(x), axis=-1, keepdims=True) if n > 1 else 0.0
    scale = (np.abs(d) + mean_err) / s
    if weight is not None:
        scale = scale * np.abs(weight)
    if bias is not None:
        scale = scale + np.abs(bias)
    return np.where(layer_norm_outside(x, eps, dtype), np.inf, scale), d, s


def e_layer_norm(x, ex, weight, bias, eps: float, pr: Precision, axis: int = -1, *,
                 cap: Any = None) -> tuple[np.ndarray, float]:
    """(E_y, k) of LayerNorm over ``axis`` (-1: channels last; 1: channels first, (B, C, H, W)), x carrying E_x:
    E = k S + P (:func:`layer_norm_parts`), the one LayerNorm error rule: refimpl.layers.layer_norm_bound is its
    own rounding on exact inputs (E = k S), and the networks (refimpl.models.common.e_layer_norm), FLatten / L2ViT
    (refimpl.attention.focused_bounds.err_layer_norm) and LiSA's block carry their input errors through it.
    First order only (``pr`` from :meth:`Precision.coefficients`): the Jacobian bound is a linearisation.

    ``cap``: a precision T; then E is replaced, where smaller (and where it is NaN), by :func:`layer_norm_cap`
    in T (a bound whatever the input's error, under the two-pass evaluation model), which keeps a running bound
    finite once the propagated input error exceeds the LayerNorm's output range."""
    if not pr.first_order:
        raise numerics.ArgumentError("argument 'pr': the LayerNorm rule is first order; expected "
                                     "Precision.coefficients(dtype), got the rigorous model Precision.of")
    last = axis in (-1, x.ndim - 1)
    if not last:
        x, ex = np.moveaxis(x, axis, -1), np.moveaxis(ex, axis, -1)
    scale, prop, k = layer_norm_parts(x, ex, weight, bias, eps, pr)
    e = pr.g(k) * scale + prop
    if cap is not None:
        c = layer_norm_cap(x, weight, bias, eps, cap)
        with np.errstate(invalid="ignore"):
            e = np.where(np.isnan(e), c, np.minimum(e, c))
        e = np.where(layer_norm_outside(x, eps, cap), np.inf, e)
    return (e if last else np.moveaxis(e, -1, axis)), k


#: LayerNorm's roundings besides its n-term sum (the k = sums(n) + 8 of :func:`layer_norm_parts`: n + 1 for the
#: mean, the variance's relative gamma_(n+3) halved by the sqrt, the quotient, the scale and the shift).
LAYER_NORM_ROUNDINGS = 8


def layer_norm_cap(x, weight, bias, eps: float, dtype: Any) -> np.ndarray:
    """A bound, in units of u_T, on the error of LayerNorm over the last axis whatever its input's error
    (weight, bias None: 1 and 0).  xh = (x - mean) / sqrt(var + eps) has sum_i xh_i^2 <= C, so
    |xh_i| <= sqrt(C), and the computed xh' obeys the same up to its own rounding (gamma_{C+8}) when its variance
    is the mean of its own computed centred squares (the two-pass evaluation, :func:`layer_norm_parts`' model);
    hence |y' - y| <= |w| (|xh| + sqrt(C)(1 + gamma_{C+8})) + 2 u (|w| sqrt(C) + |b|), returned divided by u_T.
    A Welford-type variance (PyTorch's CPU kernel) can escape it where the mean's error bound exceeds the standard
    deviation many times (rho = (C + 1) u mean|x| / s >> 1; measured from rho ~ 40, up to 8e3 times the cap): there
    the computed variance can lose all its digits (tests/test_layer_norm_error.py): inf on the rows
    :func:`layer_norm_outside` the model's domain."""
    c = x.shape[-1]
    u = numerics.unit_roundoff(dtype)
    mu = np.mean(x, axis=-1, keepdims=True)
    xh = np.abs(x - mu) / np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    w = 1.0 if weight is None else np.abs(weight)
    b = 0.0 if bias is None else np.abs(bias)
    root = math.sqrt(c)
    cap = (w * (xh + root * (1.0 + numerics.gamma(c + LAYER_NORM_ROUNDINGS, u))) + 2 * u * (w * root + b)) / u
    return np.where(layer_norm_outside(x, eps, dtype), np.inf, cap)


def e_roundings(s, prop, roundings: float, pr: Precision, *, underflows: float | None = None) -> np.ndarray:
    """Error of a stage of r = ``roundings`` relative roundings whose intermediates are bounded by S, the input
    errors P already propagated through it: P + gamma_r S + m eta, m = ``underflows`` (default r: every
    rounding may underflow).  In the rigorous model S must bound the computed operands (the magnitudes widened
    by their errors, :meth:`Precision.mag`); first order: P + r S."""
    m = roundings if underflows is None else underflows
    return prop + pr.g(roundings) * s + m * pr.eta


def e_elementwise(y, ex, lipschitz, roundings: float, pr: Precision) -> np.ndarray:
    """Error of y = f(x) for an element-wise f with Lipschitz constant L (a number, or an array broadcasting
    with E_x: a per-channel scale g x has L = |g|), evaluated with ``roundings`` relative roundings (an
    elementary function counts config.ELEMENTARY_FUNCTION_ULPS, each further operation 1):
    |f(x') - f(x)| <= L E_x (mean value theorem) and |fl(f(x')) - f(x')| <= gamma_r |f(x')| + r eta with
    |f(x')| <= |y| + L E_x, so gamma_r (|y| + L E_x) + L E_x + r eta (first order: r |y| + L E_x;
    :func:`e_roundings`)."""
    ay = np.abs(y)
    mag = ay if pr.first_order else ay + lipschitz * ex
    return e_roundings(mag, lipschitz * ex, roundings, pr)


def gelu_roundings(approximate: str = "none") -> int:
    """The rounding count of GELU relative to |x| (refimpl.numerics.gelu): erf (or tanh) carries
    config.ELEMENTARY_FUNCTION_ULPS ulps relative to |erf| <= 1, and the factor 1 + erf cancels for x << 0, so
    the evaluation errs by at most |x| (ELEMENTARY_FUNCTION_ULPS + 4) u (the argument's scaling, the addition,
    two products); the tanh form 3 more (its cubic polynomial)."""
    if approximate not in ("none", "tanh"):
        raise numerics.ArgumentError(f"argument 'approximate': expected 'none' or 'tanh', got {approximate!r}")
    return config.ELEMENTARY_FUNCTION_ULPS + 4 + (3 if approximate == "tanh" else 0)


def e_gelu(x, ex, pr: Precision, approximate: str = "none") -> np.ndarray:
    """Error of GELU(x), x carrying E_x: its own rounding is bounded relative to |x|, not |GELU(x)|
    (:func:`gelu_roundings`), so gamma_r (|x| + E_x) + L E_x + r eta, L = config.GELU_LIPSCHITZ
    (sup |GELU'| = 1.1289..., both forms); first order r |x| + L E_x (:func:`e_roundings`)."""
    return e_roundings(pr.mag(x, ex), config.GELU_LIPSCHITZ * ex, gelu_roundings(approximate), pr)


#: The roundings of eval BatchNorm per element (subtract, add eps, sqrt, divide, multiply, add; the folded form
#: x * scale + shift, PyTorch's, has as many on the same magnitudes).
BATCH_NORM_ROUNDINGS = 6


def batch_norm_scale(x, weight, bias, running_mean, running_var, eps: float) -> np.ndarray:
    """The magnitude S = (|x| + |rm|) / sqrt(rv + eps) |w| + |b| of eval BatchNorm over the channels of
    (B, C, H, W) (refimpl.layers.batch_norm2d_bound)."""
    col = (slice(None), None, None)
    return (np.abs(x) + np.abs(running_mean)[col]) / np.sqrt(running_var[col] + eps) * np.abs(weight)[col] \
        + np.abs(bias)[col]


def e_batch_norm(x, ex, weight, bias, running_mean, running_var, eps: float, pr: Precision) -> np.ndarray:
    """Error of eval BatchNorm (B, C, H, W), x carrying E_x, an affine map per channel with gain
    g = |w| / sqrt(rv + eps): gamma_6 S(X+) + g E_x + 6 eta (:data:`BATCH_NORM_ROUNDINGS`, :func:`batch_norm_scale`
    on the computed operand's magnitude; first order 6 S + g E_x).  Rigorous model: an underflow of the quotient
    (or of the folded scale) is then multiplied by |w| (or by |x|, |rm|), so eta (1 + gamma_2)(|w| + X+ + |rm|)
    is charged besides."""
    col = (slice(None), None, None)
    xp = pr.mag(x, ex)
    gain = (np.abs(weight) / np.sqrt(running_var + eps))[col]
    e = e_roundings(batch_norm_scale(xp, weight, bias, running_mean, running_var, eps), gain * ex,
                    BATCH_NORM_ROUNDINGS, pr)
    if pr.eta > 0:
        e = e + pr.eta * pr.factor(2) * (np.abs(weight)[col] + xp + np.abs(running_mean)[col])
    return e


# ===================================================================================================
# Convolution algorithms: which the bounds cover, and Winograd's error
# ===================================================================================================

#: The algorithms a convolution's bound may be asked to cover.  "direct": every evaluation as sums of the KH KW
#: (C / groups) products in any order (direct loops, im2col + GEMM, oneDNN's direct kernels): gamma_n on the
#: convolution of absolute values (Higham 3.12).  "winograd": Winograd's minimal filtering F(6 x 6, 3 x 3) for
#: 3 x 3 kernels of stride and dilation 1 (Lavin & Gray, CVPR 2016), which PyTorch's CPU convolution takes
#: through NNPACK when oneDNN is off (batch >= 16) and cuDNN may choose on a GPU: its transforms cancel, so its
#: error is tens to thousands of u on sum |w| |x| (tests/test_ensemble.py) and the direct bound does not cover
#: it.  "fft": FFT convolution on tiles of config.CONV_FFT_TILE (NNPACK's other algorithm, for kernels up to 16;
#: cuDNN's FFT_TILING): its error is normwise over a tile, so an output next to a large input errs in proportion
#: to that input.  FFT over a whole plane larger than the tile (cuDNN's FFT) is not covered.
CONV_ALGORITHMS = ("direct", "winograd", "fft")
_covered: list[tuple[tuple[str, ...], int]] = [(("direct",), 1)]


def conv_algorithms() -> tuple[str, ...]:
    """The convolution algorithms the bounds cover now (default: "direct" only)."""
    return _covered[-1][0]


def conv_min_batch() -> int:
    """The smallest batch from which the other algorithms of :func:`conv_algorithms` are covered."""
    return _covered[-1][1]


@contextlib.contextmanager
def covering_conv_algorithms(*names: str, min_batch: int = 1) -> Iterator[None]:
    """Within the block every convolution bound also covers ``names`` (:data:`CONV_ALGORITHMS`) for inputs of
    batch ``min_batch`` or more: the tested run may take them (PyTorch's CPU convolution with oneDNN off takes
    NNPACK for float32 inputs of batch >= config.NNPACK_MIN_BATCH; cuDNN at any batch).  The stages those
    algorithms apply to get bounds as wide as their errors, 10^2 - 10^4 times the direct bound; elsewhere
    nothing changes."""
    bad = [n for n in names if n not in CONV_ALGORITHMS]
    if bad:
        raise ValueError(f"argument 'names': expected algorithms from {CONV_ALGORITHMS}, got {bad}")
    if isinstance(min_batch, bool) or not isinstance(min_batch, int) or min_batch < 1:
        raise ValueError(f"argument 'min_batch': expected an integer >= 1, got {min_batch!r}")
    _covered.append((tuple(dict.fromkeys(("direct",) + names)), min_batch))
    try:
        yield
    finally:
        _covered.pop()


# F(6, 3): y = A^T [(G g) * (B^T d)] gives the 6 outputs of a 3-tap correlation over 8 inputs, from the
# interpolation points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity (Lavin & Gray 2016, section 4; the exact rationals;
# tests/test_ensemble.py checks the identity).  NNPACK and ncnn scale G's rows for +-1/2 by 1/32 and A^T's columns
# by 32: powers of two, the same computed values.  In two dimensions: Y = A^T [(G g G^T) * (B^T d B)] A on an
# 8 x 8 input tile.
WINOGRAD_BT = ((1, 0, -21 / 4, 0, 21 / 4, 0, -1, 0),
               (0, 1, 1, -17 / 4, -17 / 4, 1, 1, 0),
               (0, -1, 1, 17 / 4, -17 / 4, -1, 1, 0),
               (0, 1 / 2, 1 / 4, -5 / 2, -5 / 4, 2, 1, 0),
               (0, -1 / 2, 1 / 4, 5 / 2, -5 / 4, -2, 1, 0),
               (0, 2, 4, -5 / 2, -5, 1 / 2, 1, 0),
               (0, -2, 4, 5 / 2, -5, -1 / 2, 1, 0),
               (0, -1, 0, 21 / 4, 0, -21 / 4, 0, 1))
WINOGRAD_G = ((1, 0, 0),
              (-2 / 9, -2 / 9, -2 / 9),
              (-2 / 9, 2 / 9, -2 / 9),
              (1 / 90, 1 / 45, 2 / 45),
              (1 / 90, -1 / 45, 2 / 45),
              (32 / 45, 16 / 45, 8 / 45),
              (32 / 45, -16 / 45, 8 / 45),
              (0, 0, 1))
WINOGRAD_AT = ((1, 1, 1, 1, 1, 1, 1, 0),
               (0, 1, -1, 2, -2, 1 / 2, -1 / 2, 0),
               (0, 1, 1, 4, 4, 1 / 4, 1 / 4, 0),
               (0, 1, -1, 8, -8, 1 / 8, -1 / 8, 0),
               (0, 1, 1, 16, 16, 1 / 16, 1 / 16, 0),
               (0, 1, -1, 32, -32, 1 / 32, -1 / 32, 1))


def winograd_applies(kernel: Sequence[int], stride: Any, dilation: Any) -> bool:
    """Whether F(6 x 6, 3 x 3) can evaluate the convolution: a 3 x 3 kernel, stride and dilation 1."""
    return tuple(kernel) == (3, 3) and _unit_steps(stride, dilation)


def _unit_steps(stride: Any, dilation: Any) -> bool:
    """Stride and dilation (ints or pairs) both 1 on both axes."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)     # noqa: E731
    return pair(stride) == (1, 1) and pair(dilation) == (1, 1)


def winograd_roundings(group_channels: int, biased: bool) -> int:
    """The depth kw of Winograd's bound, summed along the computation: the kernel transform G g G^T (two passes
    of 3-term sums and the rounded constants: 8), the input transform B^T d B (two passes of 8-term sums: 16),
    the element-wise product (1), the sum over the group's input channels (C / groups), the output transform
    A^T m A (two passes of 8-term sums: 16) and the bias (1)."""
    return 2 * 3 + 2 + 2 * 8 + 1 + int(group_channels) + 2 * 8 + (1 if biased else 0)


def winograd_scale(x, weight, bias, padding: Sequence[int], groups: int = 1) -> np.ndarray:
    """Winograd's componentwise error magnitude S_w (B, O, OH, OW) for a 3 x 3 convolution of stride 1:
    the algorithm run on |x|, |W|, |b| with its transforms' absolute values, |A^T| (sum_c |G||g_c||G|^T *
    |B^T||d_c||B|) |A| + |b| per 6 x 6 output tile, so that |err| <= gamma_kw S_w to first order (each transform
    is a short sum whose error is gamma of its depth times its transform of absolute values, carried through the
    later transforms by their absolute values).  An output's S_w depends on its place in its tile; the tiling
    may start anywhere, so S_w is the largest over the 36 placements.  x (B, C, H, W), weight (O, C / groups,
    3, 3), padding (top, bottom, left, right) or one int for all four."""
    bt, g, at = (np.abs(np.array(m, dtype=np.float64)) for m in (WINOGRAD_BT, WINOGRAD_G, WINOGRAD_AT))
    padding = (padding,) * 4 if isinstance(padding, (int, np.integer)) else tuple(padding)
    x, w = np.abs(np.asarray(x, dtype=np.float64)), np.abs(np.asarray(weight, dtype=np.float64))
    bsz, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    xp = np.pad(x, ((0, 0), (0, 0), tuple(padding[:2]), tuple(padding[2:])))
    ho, wo = xp.shape[2] - 2, xp.shape[3] - 2
    u = (g @ w @ g.T).reshape(groups, cout // groups, cg, 64)                     # |G| |g| |G|^T
    out = np.zeros((bsz, cout, ho, wo))
    for oh in range(6):
        for ow in range(6):
            th, tw = -(-(ho + oh) // 6), -(-(wo + ow) // 6)
            xq = np.pad(xp, ((0, 0), (0, 0), (oh, 6 * th + 2 - oh - xp.shape[2]), (ow, 6 * tw + 2 - ow - xp.shape[3])))
            d = np.lib.stride_tricks.sliding_window_view(xq, (8, 8), axis=(2, 3))[:, :, ::6, ::6]
            v = (bt @ d @ bt.T).reshape(bsz, groups, cg, th * tw, 64)             # |B^T| d |B| per tile
            # the sum over the group's input channels, per tile and transform coefficient: one batched matmul
            m = np.matmul(v.transpose(1, 4, 0, 3, 2), u.transpose(0, 3, 2, 1)[:, :, None])   # (g, 64, b, ts, o)
            m = m.transpose(2, 0, 4, 3, 1).reshape(bsz, cout, th, tw, 8, 8)
            y = at @ m @ at.T                                                     # |A^T| m |A|: (.., 6, 6)
            y = y.transpose(0, 1, 2, 4, 3, 5).reshape(bsz, cout, 6 * th, 6 * tw)
            np.maximum(out, y[:, :, oh:oh + ho, ow:ow + wo], out=out)
    if bias is not None:
        out = out + np.abs(np.asarray(bias, dtype=np.float64))[:, None, None]
    return out


def fft_tile_roundings(group_channels: int, biased: bool, tile: int = config.CONV_FFT_TILE) -> int:
    """The depth of a tiled FFT convolution's bound: three T x T real 2-D FFTs (input tile, kernel, inverse), each
    2 (log2 T + config.FFT_REAL_SPLIT_STAGES) stages of config.FFT_STAGE_ROUNDINGS (Higham Thm 24.2's per-stage
    eta, as refimpl.toeplitz counts it), the spectral product (config.FFT_PRODUCT_ROUNDINGS), the sum over the
    group's input channels, the 1/T^2 scaling and store (config.FFT_SCALE_ROUNDINGS) and the bias."""
    stages = 2 * (int(math.ceil(math.log2(tile))) + config.FFT_REAL_SPLIT_STAGES)
    return (3 * stages * config.FFT_STAGE_ROUNDINGS + config.FFT_PRODUCT_ROUNDINGS + int(group_channels)
            + config.FFT_SCALE_ROUNDINGS + (1 if biased else 0))


def fft_tile_scale(x, weight, bias, padding: Any, groups: int = 1, tile: int = config.CONV_FFT_TILE) -> np.ndarray:
    """A tiled FFT convolution's componentwise error magnitude S_f (B, O, OH, OW), stride and dilation 1, tiles of
    T x T input (NNPACK's ft8x8 / ft16x16, cuDNN's FFT_TILING; T = config.CONV_FFT_TILE covers them): each spectral coefficient of a
    tile is a sum over the whole tile with unit-modulus weights, so its error is gamma of its depth times
    sum_tile |x| (sum |w| for the kernel's), and the inverse transform (1/T^2 sum over T^2 coefficients) carries
    that to every output of the tile: |err| <= gamma_kf (sum_tile |x|)(sum |w|) per input channel, summed over
    the group.  The tile of an output may sit anywhere around its receptive field, so sum_tile |x| is taken
    over the union of those placements, a (2T - KH) x (2T - KW) box.  Normwise within the box: an output next
    to a large input errs in proportion to it, as FFT convolution does."""
    padding = (padding,) * 4 if isinstance(padding, (int, np.integer)) else tuple(padding)
    x, w = np.abs(np.asarray(x, dtype=np.float64)), np.abs(np.asarray(weight, dtype=np.float64))
    bsz = x.shape[0]
    cout, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), tuple(padding[:2]), tuple(padding[2:])))
    ho, wo = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    bh, bw = 2 * tile - kh, 2 * tile - kw
    # box sums of |x_pad| over rows [i + kh - T, i + T - 1] and columns likewise (outside the plane: zeros)
    c = np.pad(xp, ((0, 0), (0, 0), (tile - kh + 1, tile), (tile - kw + 1, tile))).cumsum(2).cumsum(3)
    c = np.pad(c, ((0, 0), (0, 0), (1, 0), (1, 0)))
    box = c[:, :, bh:bh + ho, bw:bw + wo] - c[:, :, :ho, bw:bw + wo] - c[:, :, bh:bh + ho, :wo] + c[:, :, :ho, :wo]
    box = np.maximum(box, 0.0).reshape(bsz, groups, cg, ho, wo)
    wsum = w.sum(axis=(2, 3)).reshape(groups, cout // groups, cg)
    out = np.einsum("bgcij,goc->bgoij", box, wsum).reshape(bsz, cout, ho, wo)
    if bias is not None:
        out = out + np.abs(np.asarray(bias, dtype=np.float64))[:, None, None]
    return out


def other_algorithm_scales(x, weight, bias, padding: Any, stride: Any, dilation: Any,
                           groups: int) -> list[tuple[np.ndarray, int]]:
    """[(S, k)] of every algorithm besides "direct" that :func:`conv_algorithms` covers and that can evaluate
    this convolution (x (B, C, H, W) with B >= :func:`conv_min_batch`): Winograd for a 3 x 3 kernel of stride and
    dilation 1, tiled FFT for kernels up to the tile of stride and dilation 1."""
    w = np.asarray(weight)
    out: list[tuple[np.ndarray, int]] = []
    if np.shape(x)[0] < conv_min_batch():
        return out
    algorithms = conv_algorithms()
    if "winograd" in algorithms and winograd_applies(w.shape[2:], stride, dilation):
        out.append((winograd_scale(x, w, bias, padding, groups), winograd_roundings(w.shape[1], bias is not None)))
    if "fft" in algorithms and _unit_steps(stride, dilation) and max(w.shape[2:]) <= config.CONV_FFT_TILE:
        out.append((fft_tile_scale(x, w, bias, padding, groups), fft_tile_roundings(w.shape[1], bias is not None)))
    return out


def conv_scale(s_direct: np.ndarray, k_direct: float, x, weight, bias, padding: Any, stride: Any,
               dilation: Any, groups: int) -> np.ndarray:
    """The magnitude that, with the direct bound's depth ``k_direct``, covers every algorithm of
    :func:`conv_algorithms`: ``s_direct``, or max(S_d, S_a k_a / k_d) over the other algorithms a that apply -
    gamma_kd max(...) >= gamma_ka S_a to first order, and the probabilistic bound lam sqrt(k_d) u S_a k_a / k_d
    is at least the algorithm's lam sqrt(k_a) u S_a (k_a >= k_d), so a Bound of depth k_d stays safe for all."""
    out = s_direct
    for s_alg, k_alg in other_algorithm_scales(x, weight, bias, padding, stride, dilation, groups):
        out = np.maximum(out, s_alg * (max(k_alg, k_direct) / k_direct))
    return out
