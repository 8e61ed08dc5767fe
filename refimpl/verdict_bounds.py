"""The arithmetic of the verdict's bounds: unit roundoffs and the smallest subnormals of the formats, the
accumulation format and the mixed-precision counts (:func:`sum_depth`, :func:`sum_depth_l2`,
:func:`sum_rounding_l2`), Higham's ``gamma_k`` and Higham-Mary's probabilistic ``gamma~_k(lam)`` with the union
bound's ``lam`` (:func:`confidence_lambda`), rounding to a format (:func:`round_to`), :class:`Bound` (with the l2
coefficient ``sigma``), :func:`running_bound` and :func:`ulp_distance`.

The theory (two bounds per element, composite bounds) is stated in :mod:`refimpl.verdict`, which imports this
module and re-exports every public name (its documented home: ``verdict.Bound`` is ``verdict_bounds.Bound``);
the comparison itself (the report, :func:`refimpl.verdict.compare`, the stage-wise comparison) lives there.

Layer: the verdict, its bottom (imports only :mod:`refimpl.config` and :mod:`refimpl.errors`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from . import config
from .errors import ArgumentTypeError

__all__ = ["unit_roundoff", "underflow_eta", "accumulation_format", "accumulation_ratio", "sum_depth", "sum_depth_l2",
           "sum_rounding_l2", "running_bound", "gamma", "probabilistic_gamma", "confidence_lambda", "round_to",
           "Bound", "ulp_distance", "format_name"]

# Unit roundoff u = 2^-p (p = significand bits incl. the implicit one) and the smallest subnormal.
_FORMATS = {
    "float64": (2.0 ** -53, 2.0 ** -1074),
    "float32": (2.0 ** -24, 2.0 ** -149),
    "float16": (2.0 ** -11, 2.0 ** -24),
    "bfloat16": (2.0 ** -8, 2.0 ** -133),
}


def format_name(dtype: Any) -> str:
    """"float16" | "bfloat16" | "float32" | "float64" for a NumPy/torch dtype or its name."""
    name = str(dtype).replace("torch.", "")
    if name in _FORMATS:
        return name
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        pass
    if name not in _FORMATS:
        raise ArgumentTypeError(f"argument 'dtype': expected float16, bfloat16, float32 or float64, got "
                                f"{type(dtype).__name__} {str(dtype)[:60]!r}")
    return name


def unit_roundoff(dtype: Any) -> float:
    """u_T = 2^-p: the largest relative error of rounding to nearest in T (float64: 2^-53)."""
    return _FORMATS[format_name(dtype)][0]


def underflow_eta(dtype: Any) -> float:
    """eta_T: a bound on the absolute error of rounding a result into T's subnormal range.

    Rounding to nearest errs by at most half the smallest subnormal (Higham eq. 2.8), but for float64
    that half, 2^-1075, is not representable (it rounds to 0).  We return the smallest subnormal itself,
    an upper bound twice as large, so the underflow term never vanishes."""
    return _FORMATS[format_name(dtype)][1]


def accumulation_format(dtype: Any) -> str:
    """The format in which the error model assumes tested code in ``dtype`` accumulates its sums
    (``config.ACCUMULATION_FORMAT``; the format itself when not listed)."""
    name = format_name(dtype)
    return format_name(config.ACCUMULATION_FORMAT.get(name, name))


def accumulation_ratio(dtype: Any = None) -> float:
    """u_A / u_T for tested code in ``dtype`` (config.ACCUMULATION_FORMAT); 1.0 when it accumulates in T
    itself or ``dtype`` is None."""
    if dtype is None:
        return 1.0
    return min(1.0, unit_roundoff(accumulation_format(dtype)) / unit_roundoff(dtype))


def sum_depth(n: float, dtype: Any = None) -> float:
    """The rounding count, in units of u_T, of an n-term accumulation whose result is stored in T.

    Accumulated in T itself (``dtype`` None or not mixed): n (Higham 3.12 counts gamma_n for an n-term inner
    product).  Accumulated in A with u_A < u_T and rounded to T once at the end (mixed precision,
    ``config.ACCUMULATION_FORMAT``): |fl_T(fl_A(s)) - s| <= gamma_n(u_A) S + u_T |s| (1 + gamma_n(u_A)), and
    with |s| <= S that is at most (n u_A / u_T + 1) u_T S to first order: n u_A / u_T + 1 roundings of
    size u_T.  For float16 data (u_A / u_T = 2^-13) a 4096-term sum counts 1.5 instead of 4096."""
    r = accumulation_ratio(dtype)
    return float(n) if r >= 1.0 else float(n) * r + 1.0


def sum_depth_l2(n: float, dtype: Any = None) -> float:
    """The squared l2 rounding count of an n-term accumulation stored in T, in units of u_T^2: the bound on
    sum_r (c_r / S)^2 over the sum's roundings r (c_r the coefficient of rounding r in the first-order error,
    S the sum of the terms' magnitudes).  Every |c_r| <= S (a partial sum of magnitudes) and sum_r |c_r| <= n S
    (:func:`sum_depth`), so sum_r c_r^2 <= max |c_r| sum_r |c_r| <= n S^2: the count is n.  Accumulated in A
    (mixed precision) and rounded to T once: n (u_A / u_T)^2 + 1.  Its square root is what a probabilistic
    running bound charges for the sum (Higham & Mary 2019: sqrt(n) u instead of n u)."""
    r = accumulation_ratio(dtype)
    return float(n) if r >= 1.0 else float(n) * r * r + 1.0


def sum_rounding_l2(n: float, magnitude: Any, value: Any, dtype: Any = None) -> np.ndarray:
    """sqrt(sum_r c_r^2), in units of u_T, over the roundings of an n-term sum (inner product) s stored in T,
    to first order: :func:`sum_depth_l2` with its one rounding into T charged at its own coefficient |s| instead
    of S (the rounding of the computed s, eta_T / u_T added for gradual underflow), which in half precision is
    most of the count and |s| << S where the terms cancel.  The n products and n - 1 additions (in A when
    mixed, r = u_A / u_T, else in T: r = 1) have coefficients at most r S each (S = ``magnitude``, the sum of the
    terms' magnitudes; each |term| <= S), so their squares sum to at most n r^2 S^2 (plus n (eta_A / u_T)^2 for
    the products' underflow); in T accumulation the last addition is itself the rounding into T, counted twice
    (safe).  Returns sqrt(n r^2 S^2 + n (eta_A / u_T)^2 + (|s| + eta_T / u_T)^2)."""
    r = accumulation_ratio(dtype)
    eu = ea = 0.0                                  # dtype None: no underflow term
    if dtype is not None:
        u = unit_roundoff(dtype)
        eu, ea = underflow_eta(dtype) / u, underflow_eta(accumulation_format(dtype)) / u
    s, v = np.asarray(magnitude, dtype=np.float64), np.asarray(value, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(float(n) * (r * r * s * s + ea * ea) + (np.abs(v) + eu) ** 2)


def gamma(n: float, u: float) -> float:
    """gamma_n = n u / (1 - n u) (Higham Lemma 3.1); inf when n u >= 1 (no bound exists)."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


def probabilistic_gamma(n: float, u: float, lam: float) -> float:
    """gamma~_n(lam) = exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1 (Higham & Mary 2019, Theorem 2.4).

    |prod_{i<=n} (1 + delta_i)^(+-1) - 1| <= gamma~_n(lam) with probability at least
    1 - 2 exp(-lam^2 (1 - u)^2 / 2) when the delta_i are independent, mean-zero and |delta_i| <= u.
    Finite for every n (inf only if the exponent overflows)."""
    if n <= 0:
        return 0.0
    x = lam * math.sqrt(n) * u + n * u * u / (1.0 - u)
    return math.expm1(x) if x < 700.0 else math.inf


def confidence_lambda(events: float, p: float, u: float) -> float:
    """The smallest lam with events * 2 exp(-lam^2 (1 - u)^2 / 2) <= p: a union bound over ``events``
    products of rounding factors, each outside gamma~(lam) with probability <= 2 exp(-lam^2 (1-u)^2 / 2)."""
    if not (0.0 < p < 1.0) or not math.isfinite(p):
        raise ValueError(f"argument 'p': expected a probability in (0, 1), got {p!r}")
    events = max(float(events), 1.0)
    return math.sqrt(2.0 * math.log(2.0 * events / p)) / (1.0 - u)


def round_to(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Round float64 values to ``dtype`` (float16/bfloat16/float32/float64) and return them as float64.

    Both sides of a comparison then see exactly the same inputs (docs/design.md: "compare on identical
    inputs").  bfloat16 rounding is round-to-nearest-even on the float32 bit pattern, as torch does.
    """
    x = np.asarray(x, dtype=np.float64)
    name = format_name(dtype)
    if name != "bfloat16":
        return x.astype(name).astype(np.float64)
    f = x.astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    out = np.where(np.isnan(f), f, out)  # keep NaN payloads NaN
    return out.astype(np.float64)


@dataclasses.dataclass(frozen=True)
class Bound:
    """A running error bound for one operation: |err| <= gamma_k(u_T) * scale + k * eta_T.

    scale : ndarray broadcastable to the output: the operation evaluated on absolute values (S).
    k     : the depth constant, derived per operation (number of roundings along the longest path,
            counting the final rounding of the output into T).
    note  : how k was derived, and whether the bound is rigorous.
    ref_depth : the depth used for the float64 reference's own error gamma_k(u_64) S, when it differs from
            k: a composite bound whose k counts mixed-precision sums as a few roundings of u_T
            (:func:`sum_depth`) passes the true rounding count here (or an upper bound of it).
    accumulation : True when the bound has Higham's inner-product form: S = sum_j |x_j y_j| and every term
            x_j y_j of the computed sum carries a product of at most k rounding factors (dot products, matrix
            products, convolutions, with or without a bias).  Only then does the probabilistic factor
            gamma~_k(lam) replace gamma_k (Higham & Mary 2019, Theorem 3.1).  A composite first-order bound
            (a running coefficient E written as scale = E / K with k = K, where E already sums every stage's
            rounding terms) is not of that form: a single rounding can carry the whole of E (the final
            rounding of an output does), so it keeps the deterministic factor.
    sigma : the l2 coefficient of a composite bound (module docstring), in units of u_T, or None.
    ref_scale : the scale of the float64 reference's own error gamma_{ref_depth}(u_64) ref_scale, when it differs
            from ``scale``: where a rigorous composite bound is infinite in T (RALA's quotient and softmax rules in
            bfloat16) while the same analysis in float64 is finite, the reference's own error is that finite one.
    typical : the random-rounding model's typical error of each element, in units of u_T, where it is known more
            sharply than sqrt(k) S (:func:`refimpl.verdict.compare` uses that by default): sqrt(sum_r c_r^2) over
            the roundings r of the element's computation (c_r their first-order coefficients; Higham & Mary 2019:
            a sum of independent mean-zero roundings is of the size of its l2 coefficient, not its l1 one), or
            None.  It is the unit of the element's error in the ensemble criterion (its z units) and the size of
            the rounding-model member.  sqrt(k) S bounds it whenever every |c_r| <= S, but where the coefficients
            differ (a resampling's products of lambda x_j; a normalisation whose d-term norm enters every element
            once) the l2 sum of the actual coefficients is several times smaller.  Not a bound: the bound is
            ``scale`` and ``k`` (and ``sigma``, which a rigorous l2 coefficient may also give).
    store_scale : for an accumulation bound in a mixed-precision T, the magnitude its roundings to T apply to,
            where it is smaller than ``scale``, or None (``scale``).  A convolution bound that also covers other
            algorithms (refimpl.bounds.conv_parts: Winograd, tiled FFT) has a scale as wide as their transforms'
            magnitudes, but those transforms run in the accumulation format A (cuDNN computes half-precision
            convolutions in float32, PyTorch's "pseudo-half"); only the result is rounded to T, and it is a
            value of size |y| <= the direct convolution of absolute values.  Without it a float16 depthwise
            conv's bound is u_T times the FFT tile's magnitude, hundreds of times the output itself.
    """

    scale: np.ndarray
    k: float
    note: str = ""
    accumulation: bool = False
    ref_depth: float | None = None
    sigma: Any = None
    ref_scale: Any = None
    typical: Any = None
    store_scale: Any = None

    def factor(self, dtype: Any, lam: float | None = None) -> float:
        """The accumulation factor in T: gamma_k(u_T); with ``lam`` and an accumulation bound,
        min(gamma_k, gamma~_k(lam)).

        An accumulation bound in a mixed-precision format T (``config.ACCUMULATION_FORMAT`` maps T to A with
        u_A < u_T): the k-term sum is accumulated in A and rounded to T, so the factor is
        g_A + 2 u_T (1 + g_A) with g_A = gamma_k(u_A) (or min(gamma_k, gamma~_k(lam)) in u_A): the sum's
        rounding to T, and one more for a bias added in T after it (x @ W.T + b as two operations).
        Rigorous, as |s| <= S for a sum whose scale is the sum of the terms' magnitudes."""
        g_a, store = self._factors(dtype, lam)
        return g_a + store * (1.0 + g_a)

    def _factors(self, dtype: Any, lam: float | None) -> tuple[float, float]:
        """(g, r): the factor of the accumulation (on ``scale``) and of the roundings to T (on the stored
        value, at most (1 + g) ``store_scale``); r = 0 where the accumulation is in T itself (its k counts
        them)."""
        u = unit_roundoff(dtype)
        u_acc = unit_roundoff(accumulation_format(dtype))
        if self.accumulation and u_acc < u:
            g_a = gamma(self.k, u_acc)
            if lam is not None:
                g_a = min(g_a, probabilistic_gamma(self.k, u_acc, lam))
            return g_a, 2.0 * u
        g = gamma(self.k, u)
        if lam is None or not self.accumulation:
            return g, 0.0
        return min(g, probabilistic_gamma(self.k, u, lam)), 0.0

    def _tested(self, dtype: Any, s: np.ndarray, shape: tuple[int, ...], lam: float | None) -> np.ndarray:
        """The tested code's own error bound f_k S (:meth:`factor`), the roundings to T taken on
        ``store_scale`` where one is given: g S + r (1 + g) S_store (g, r: :meth:`_factors`)."""
        if self.store_scale is None:
            return self.factor(dtype, lam) * s
        g, r = self._factors(dtype, lam)
        store = np.broadcast_to(np.asarray(self.store_scale, dtype=np.float64), shape)
        return g * s + r * (1.0 + g) * store

    def array(self, dtype: Any, shape: tuple[int, ...], lam: float | None = None) -> np.ndarray:
        """The element-wise bound on |tested - reference|: the tested code's error in T plus the float64
        reference's own error (the reference is not exact either):
        (f_k(u_T) + gamma_k(u_64)) S + k (eta_T + eta_64), f_k = :meth:`factor` (deterministic when
        ``lam`` is None, else the minimum of the deterministic and the probabilistic factor).  With ``lam``
        and an l2 coefficient (:attr:`sigma`), the tested part is min(f_k(u_T) S, lam u_T sigma)."""
        s = np.broadcast_to(np.asarray(self.scale, dtype=np.float64), shape)
        g_ref = gamma(self.k if self.ref_depth is None else self.ref_depth, unit_roundoff("float64"))
        s_ref = s if self.ref_scale is None else np.broadcast_to(np.asarray(self.ref_scale, dtype=np.float64), shape)
        eta = underflow_eta(dtype) + underflow_eta("float64")
        with np.errstate(over="ignore", invalid="ignore"):
            if lam is not None and self.sigma is not None:
                sig = np.broadcast_to(np.asarray(self.sigma, dtype=np.float64), shape)
                tested = np.fmin(self._tested(dtype, s, shape, lam), lam * unit_roundoff(dtype) * sig)
                return tested + g_ref * s_ref + self.k * eta
            if self.ref_scale is None and self.store_scale is None:
                return (self.factor(dtype, lam) + g_ref) * s + self.k * eta
            return self._tested(dtype, s, shape, lam) + g_ref * s_ref + self.k * eta

    def relayout(self, fn: Callable[[np.ndarray], np.ndarray], note: str | None = None) -> "Bound":
        """The same bound for a rearranged output (a transpose, a head merge, a token grid): ``fn`` applied to
        every per-element field present (scale, store_scale, sigma, ref_scale, typical), the rest kept."""
        m = lambda a: None if a is None else fn(np.asarray(a))      # noqa: E731
        return dataclasses.replace(self, scale=fn(np.asarray(self.scale)), store_scale=m(self.store_scale),
                                   sigma=m(self.sigma), ref_scale=m(self.ref_scale), typical=m(self.typical),
                                   note=self.note if note is None else note)

    def chain(self, other: "Bound") -> "Bound":
        """Combine with a later stage that adds its own k on the same scale (depths add; the result is
        composite, so it keeps the deterministic factor)."""
        ref = None
        if self.ref_depth is not None or other.ref_depth is not None:
            ref = (self.k if self.ref_depth is None else self.ref_depth) + \
                (other.k if other.ref_depth is None else other.ref_depth)
        sig = None
        if self.sigma is not None and other.sigma is not None:
            sig = np.asarray(self.sigma, dtype=np.float64) + np.asarray(other.sigma, dtype=np.float64)
        rs = None
        if self.ref_scale is not None or other.ref_scale is not None:
            rs = np.maximum(self.scale if self.ref_scale is None else self.ref_scale,
                            other.scale if other.ref_scale is None else other.ref_scale)
        return Bound(np.maximum(self.scale, other.scale), self.k + other.k,
                     f"{self.note}; {other.note}".strip("; "), ref_depth=ref, sigma=sig, ref_scale=rs)


def running_bound(e: np.ndarray, depth: float, what: str, dtype: Any = None, sigma: Any = None) -> Bound:
    """The :class:`Bound` of a running first-order error coefficient: |err| <= u_T E, written as scale E / K and
    k = K, so that gamma_K(u_T) E / K >= u_T E (Higham §3.1).  ``depth`` K is the summed rounding count of the
    stages, in units of u_T.  With a mixed-precision ``dtype`` (``config.ACCUMULATION_FORMAT``) those counts
    take each length-n sum as n u_A / u_T + 1 (:func:`sum_depth`); every count c is then at least c u_A / u_T, so
    K u_T / u_A bounds the float64 reference's own rounding count (``ref_depth``).  ``sigma``: the probabilistic
    (l2) running coefficient of the same computation (:class:`Bound`), or None."""
    depth = max(float(depth), 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.asarray(e, dtype=np.float64) / depth
    ratio = accumulation_ratio(dtype)
    how = (f"; sums accumulated in {accumulation_format(dtype)} and counted as n u_A/u_T + 1" if ratio < 1.0
           else "")
    return Bound(scale, depth, f"{what}: running first-order bound (Jacobian propagation of every stage's "
                               f"rounding; O(u^2) neglected; elementary functions {config.ELEMENTARY_FUNCTION_ULPS}"
                               f" u{how}), K = summed stage depths = {depth:.4g}",
                 ref_depth=depth / ratio if ratio < 1.0 else None,
                 sigma=None if sigma is None else np.asarray(sigma, dtype=np.float64))


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: Any) -> np.ndarray:
    """|a - b| in units of the spacing of T at |b| (b the reference).  Uses T's spacing at the
    reference value, floored at T's smallest subnormal."""
    name = format_name(dtype)
    u, tiny = _FORMATS[name]
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mag = np.abs(b)
        exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
        spacing = np.where(mag > 0, np.exp2(exp) * 2.0 * u, tiny)
        spacing = np.maximum(spacing, tiny)
        return np.abs(np.asarray(a, dtype=np.float64) - b) / spacing
