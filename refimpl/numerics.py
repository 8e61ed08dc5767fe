"""dtype policy, stable primitives and the error model.

Three things live here and nowhere else:

1. **The dtype policy.**  Every public refimpl function passes its array arguments through
   :func:`as_float`, which accepts real floating arrays (float16/32/64), promotes them to the working
   precision (float64 unless a :func:`precision` context says otherwise) and refuses integer, complex,
   bool and object arrays with a ``TypeError`` that names the argument.  Shapes are checked with
   :func:`check_shapes`, which binds named dimensions ("B h N d") across arguments.
2. **Stable primitives**: softmax by max-subtraction, GELU (erf and tanh forms), ELU, an overflow-free
   softplus, ReLU, LeakyReLU and L2 normalisation with an explicit eps policy.
3. **The error model** (DESIGN.md, "The error model"; Higham, *Accuracy and Stability of Numerical
   Algorithms*, 2nd ed., ch. 2-3).  A tested output computed in dtype T is compared element-wise with the
   float64 reference against the bound

       |actual - reference| <= gamma_k(u_T) * S + k * eta_T,

   where ``u_T`` is the unit roundoff of T, ``gamma_k(u) = k u / (1 - k u)``, ``S`` is the same computation
   run on absolute values (a running error bound), ``k`` is derived per operation from the depth of the
   computation and ``eta_T`` is the smallest subnormal of T (a bound on half of it): Higham's model with gradual
   underflow is fl(x op y) = (x op y)(1 + delta) + eta with |delta| <= u, |eta| <= eta_T (Higham eq. 2.8).
   :func:`compare` also requires the NaN/Inf patterns to agree and the tested error to be at most
   ``config.NAIVE_ERROR_RATIO_MAX`` times that of a naive same-precision NumPy computation.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import scipy.special

from . import config

__all__ = [
    "working_dtype", "precision", "as_float", "check_shapes", "check_positive_int",
    "softmax", "softmax_bound", "gelu", "elu", "softplus", "relu", "leaky_relu", "l2_normalize",
    "unit_roundoff", "underflow_eta", "gamma", "round_to", "Bound", "ErrorReport", "compare",
    "assert_close", "naive_same_precision", "ulp_distance",
]

# ===================================================================================================
# dtype policy
# ===================================================================================================

_WORKING = contextvars.ContextVar("refimpl_working_dtype", default=np.dtype(config.DEFAULT_DTYPE))


def working_dtype() -> np.dtype:
    """The dtype reference functions compute in (float64 unless inside :func:`precision`)."""
    return _WORKING.get()


@contextlib.contextmanager
def precision(dtype) -> Iterator[np.dtype]:
    """Run reference functions in another real floating dtype.

    Used for the *naive same-precision computation* of the error model: ``with precision(np.float32):``
    evaluates the same NumPy definition in float32, casting inputs down explicitly.  Outside such a block
    nothing is ever downcast.
    """
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"precision: expected a real floating dtype, got {dt}")
    token = _WORKING.set(dt)
    try:
        yield dt
    finally:
        _WORKING.reset(token)


def as_float(x: Any, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """Validate one array argument and return it in the working precision.

    Parameters
    ----------
    x : array_like of real floating dtype (float16, float32 or float64), or a Python float/int scalar.
    name : the argument's name, used in error messages.
    allow_empty : whether a zero-size array is acceptable.

    Raises
    ------
    TypeError  for integer, bool, complex, object or other non-float arrays.
    ValueError for empty arrays (unless ``allow_empty``).
    """
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"argument '{name}': expected a real floating array, got bool")
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        arr = np.asarray(float(x))
    else:
        arr = np.asarray(x)
        if arr.dtype.kind != "f":
            kind = {"i": "integer", "u": "unsigned integer", "b": "bool", "c": "complex",
                    "O": "object"}.get(arr.dtype.kind, str(arr.dtype))
            raise TypeError(
                f"argument '{name}': expected a real floating array (float16/float32/float64), "
                f"got {kind} dtype {arr.dtype}")
        if arr.dtype.itemsize > 8:
            raise TypeError(f"argument '{name}': extended precision {arr.dtype} is not supported; "
                            f"expected float16/float32/float64")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"argument '{name}': expected a non-empty array, got shape {arr.shape}")
    work = working_dtype()
    if arr.dtype != work:
        # Promotion (float16/32 -> float64) is exact.  A cast down only happens inside precision().
        arr = arr.astype(work)
    return arr


def check_shapes(sizes: Mapping[str, int] | None = None, **args: tuple[np.ndarray, str]) -> dict[str, int]:
    """Check array ranks and bind named dimensions consistently across arguments.

    ``check_shapes(q=(q, "B h N d"), k=(k, "B h M d"))`` checks both ranks, binds B, h, N, M, d and
    raises ``ValueError`` naming the argument, the shape expected (with the sizes bound so far) and the
    shape given when a dimension disagrees.  A spec entry may be an integer literal.  ``sizes`` pre-binds
    dimensions (e.g. ``{"N": H * W}``).  Returns the bound sizes.
    """
    bound: dict[str, int] = dict(sizes or {})
    for name, (arr, spec) in args.items():
        dims = spec.split()
        shape = np.shape(arr)
        if len(shape) != len(dims):
            raise ValueError(f"argument '{name}': expected a {len(dims)}-d array of shape ({', '.join(dims)}), "
                             f"got {len(shape)}-d shape {tuple(shape)}")
        for dim, size in zip(dims, shape):
            want = int(dim) if dim.isdigit() else bound.get(dim)
            if want is not None and want != size:
                expected = ", ".join(str(bound.get(d, d)) if not d.isdigit() else d for d in dims)
                raise ValueError(f"argument '{name}': expected shape ({expected}) for ({', '.join(dims)}), "
                                 f"got {tuple(shape)}; dimension {dim} is {want}, not {size}")
            if not dim.isdigit():
                bound[dim] = size
    return bound


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """Return ``value`` as int, raising ``ValueError``/``TypeError`` naming ``name`` if it is not >= minimum."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"argument '{name}': expected an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"argument '{name}': expected an integer >= {minimum}, got {value}")
    return int(value)


# ===================================================================================================
# Stable primitives
# ===================================================================================================

def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` by max-subtraction: exp(x - max x) / sum exp(x - max x).

    Subtracting the row maximum makes every exponent <= 0, so exp cannot overflow and the largest term
    is exactly 1, so the sum is >= 1 and cannot underflow to 0.  A row that is entirely -inf (fully
    masked) yields NaN, as IEEE arithmetic says (-inf - (-inf) = NaN); a row containing +inf likewise.
    NaN propagates.
    """
    x = as_float(x, "x")
    m = np.max(x, axis=axis, keepdims=True)
    # Where the max is -inf (fully masked row) x - m is NaN: we let it be, rather than invent a value.
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_bound(x: np.ndarray, axis: int = -1) -> "Bound":
    """Error bound of :func:`softmax` (forward error analysis, first order in u).

    With m = max x and y_i = x_i - m: the subtraction has error <= u |y_i| (absolute), which exp turns
    into a *relative* error of u |y_i| -- so exp(y_i) carries (ULPS + 1 + |y_i|) u relative error, where
    ULPS = config.ELEMENTARY_FUNCTION_ULPS.  The sum Z of the n non-negative terms then has relative error
    <= gamma_n + (ULPS + 1) u + u sum_j p_j |y_j| (p = softmax), and the quotient one more u.  So

        |err p_i| <= u p_i (n + ULPS + 3 + |y_i| + sum_j p_j |y_j|)

    expressed as scale S_i = p_i (n + ULPS + 3 + |y_i| + sum_j p_j |y_j|) with k = 1.  The |y| terms are
    real: x = [66, 1.05] gives a 40-ulp error in p_2 in float64 (tests/test_numerics.py).  Non-rigorous
    only through the assumed libm accuracy of exp.
    """
    x = as_float(x, "x")
    p = softmax(x, axis)
    y = np.abs(x - np.max(x, axis=axis, keepdims=True))
    with np.errstate(invalid="ignore"):
        ey = np.sum(np.where(p > 0, p * y, 0.0), axis=axis, keepdims=True)
    n = x.shape[axis]
    return Bound(p * (n + config.ELEMENTARY_FUNCTION_ULPS + 3 + y + ey), 1,
                 "softmax: k folded into the scale, u p_i (n + ulps + 3 + |x_i - max| + E_p|x - max|)")


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU(x) = x * Phi(x) (Hendrycks & Gimpel, 2016).

    approximate="none": x/2 * (1 + erf(x / sqrt 2)), the exact form (torch's default);
    approximate="tanh": x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    """
    x = as_float(x, "x")
    if approximate == "none":
        return 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + np.tanh(c * (x + config.GELU_TANH_COEF * x * x * x)))
    raise ValueError(f"argument 'approximate': expected 'none' or 'tanh', got {approximate!r}")


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0); NaN propagates (np.maximum propagates NaN, unlike a comparison-based select)."""
    x = as_float(x, "x")
    return np.maximum(x, 0.0)


def leaky_relu(x: np.ndarray, negative_slope: float = 0.01) -> np.ndarray:
    """x for x >= 0, negative_slope * x otherwise (torch's default slope 0.01)."""
    x = as_float(x, "x")
    return np.where(x >= 0, x, negative_slope * x) + 0.0 * x  # + 0*x keeps NaN in the NaN slots


def elu(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """ELU(x) = x for x > 0, alpha * (exp(x) - 1) otherwise; expm1 keeps relative accuracy near 0."""
    x = as_float(x, "x")
    with np.errstate(over="ignore"):
        neg = alpha * np.expm1(np.minimum(x, 0.0))
    return np.where(x > 0, x, neg) + 0.0 * x


def softplus(x: np.ndarray, beta: float = 1.0, threshold: float | None = None) -> np.ndarray:
    """softplus(x) = log(1 + exp(beta x)) / beta without overflow.

    Uses log(1 + e^z) = max(z, 0) + log1p(exp(-|z|)), exact in real arithmetic, which never evaluates
    exp of a positive number.  ``threshold`` mirrors torch's switch to the identity for beta*x > threshold
    (``config.SOFTPLUS_TORCH_THRESHOLD`` in torch); None (default) means no switch.
    """
    x = as_float(x, "x")
    z = beta * x
    out = (np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))) / beta
    if threshold is not None:
        out = np.where(z > threshold, x, out)
    return out


def l2_normalize(x: np.ndarray, axis: int = -1, eps: float = config.L2_NORMALIZE_EPS,
                 policy: str = "clamp") -> np.ndarray:
    """x / norm(x) along ``axis`` with an explicit eps policy.

    policy="clamp": x / max(||x||, eps)  (torch.nn.functional.normalize);
    policy="add":   x / (||x|| + eps);
    policy="none":  x / ||x||  (a zero vector gives 0/0 = NaN, as IEEE says; eps is ignored).

    The norm is computed as m * ||x / m|| with m = max|x| so that it neither overflows nor underflows
    for any finite input (LAPACK dnrm2's scaling idea).
    """
    x = as_float(x, "x")
    m = np.max(np.abs(x), axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        safe_m = np.where(m > 0, m, 1.0)
        norm = m * np.sqrt(np.sum((x / safe_m) ** 2, axis=axis, keepdims=True))
        norm = np.where(np.isinf(m), np.inf, norm)
        if policy == "clamp":
            return x / np.maximum(norm, eps)
        if policy == "add":
            return x / (norm + eps)
        if policy == "none":
            return x / norm
    raise ValueError(f"argument 'policy': expected 'clamp', 'add' or 'none', got {policy!r}")


# ===================================================================================================
# The error model
# ===================================================================================================

# Unit roundoff u = 2^-p (p = significand bits incl. the implicit one) and the smallest subnormal.
_FORMATS = {
    "float64": (2.0 ** -53, 2.0 ** -1074),
    "float32": (2.0 ** -24, 2.0 ** -149),
    "float16": (2.0 ** -11, 2.0 ** -24),
    "bfloat16": (2.0 ** -8, 2.0 ** -133),
}


def _format_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name in _FORMATS:
        return name
    try:
        name = np.dtype(dtype).name
    except TypeError:
        pass
    if name not in _FORMATS:
        raise TypeError(f"argument 'dtype': expected float16, bfloat16, float32 or float64, got {dtype!r}")
    return name


def unit_roundoff(dtype: Any) -> float:
    """u_T = 2^-p: the largest relative error of rounding to nearest in T (float64: 2^-53)."""
    return _FORMATS[_format_name(dtype)][0]


def underflow_eta(dtype: Any) -> float:
    """eta_T: a bound on the absolute error of rounding a result into T's subnormal range.

    Rounding to nearest errs by at most half the smallest subnormal (Higham eq. 2.8), but for float64
    that half, 2^-1075, is not representable (it rounds to 0).  We return the smallest subnormal itself,
    an upper bound twice as large, so the underflow term never vanishes."""
    return _FORMATS[_format_name(dtype)][1]


def gamma(n: float, u: float) -> float:
    """gamma_n = n u / (1 - n u) (Higham Lemma 3.1); inf when n u >= 1 (no bound exists)."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


def round_to(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Round float64 values to ``dtype`` (float16/bfloat16/float32/float64) and return them as float64.

    Both sides of a comparison then see exactly the same inputs (DESIGN.md: "compare on identical
    inputs").  bfloat16 rounding is round-to-nearest-even on the float32 bit pattern, as torch does.
    """
    x = np.asarray(x, dtype=np.float64)
    name = _format_name(dtype)
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
    """

    scale: np.ndarray
    k: float
    note: str = ""

    def array(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The element-wise bound on |tested - reference|: the tested code's error in T plus the float64
        reference's own error (the reference is not exact either):
        (gamma_k(u_T) + gamma_k(u_64)) S + k (eta_T + eta_64)."""
        s = np.broadcast_to(np.asarray(self.scale, dtype=np.float64), shape)
        g = gamma(self.k, unit_roundoff(dtype)) + gamma(self.k, unit_roundoff("float64"))
        eta = underflow_eta(dtype) + underflow_eta("float64")
        with np.errstate(over="ignore", invalid="ignore"):
            return g * s + self.k * eta

    def chain(self, other: "Bound") -> "Bound":
        """Combine with a later stage that adds its own k on the same scale (depths add)."""
        return Bound(np.maximum(self.scale, other.scale), self.k + other.k,
                     f"{self.note}; {other.note}".strip("; "))


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: Any) -> np.ndarray:
    """|a - b| in units of the spacing of T at |b| (b the reference).  Uses T's spacing at the
    reference value, floored at T's smallest subnormal."""
    name = _format_name(dtype)
    u, tiny = _FORMATS[name]
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mag = np.abs(b)
        exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
        spacing = np.where(mag > 0, np.exp2(exp) * 2.0 * u, tiny)
        spacing = np.maximum(spacing, tiny)
        return np.abs(np.asarray(a, dtype=np.float64) - b) / spacing


@dataclasses.dataclass
class ErrorReport:
    """What :func:`compare` measured.  ``ok`` is the verdict; ``str(report)`` explains it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_err_over_bound: float
    worst_index: tuple[int, ...] | None
    worst_actual: float
    worst_reference: float
    worst_bound: float
    ulp_at_worst: float
    max_ulp: float
    naive_max_abs_err: float | None
    naive_floor: float
    naive_ratio: float
    pattern_ok: bool
    pattern_msg: str
    k: float
    note: str

    @property
    def within_bound(self) -> bool:
        return self.max_err_over_bound <= 1.0

    @property
    def naive_ok(self) -> bool:
        return self.naive_ratio <= config.NAIVE_ERROR_RATIO_MAX

    @property
    def ok(self) -> bool:
        return self.pattern_ok and self.within_bound and self.naive_ok

    def __str__(self) -> str:
        lines = [
            f"{self.name}: shape {self.shape}, tested dtype {self.dtype}, k = {self.k:g} ({self.note})",
            f"  max |err| = {self.max_abs_err:.3e}, max err/bound = {self.max_err_over_bound:.3g}"
            f" {'<= 1 ok' if self.within_bound else '> 1 FAIL'}",
            f"  worst index {self.worst_index}: actual {self.worst_actual!r}, reference {self.worst_reference!r},"
            f" bound {self.worst_bound:.3e}, {self.ulp_at_worst:.3g} ulp (max {self.max_ulp:.3g} ulp)",
            f"  naive same-precision max |err| = {self.naive_max_abs_err}, floor {self.naive_floor:.3e},"
            f" ratio {self.naive_ratio:.3g} {'ok' if self.naive_ok else 'FAIL'}"
            f" (limit {config.NAIVE_ERROR_RATIO_MAX:g})",
            f"  NaN/Inf pattern: {self.pattern_msg}",
        ]
        return "\n".join(lines)


def _pattern(actual: np.ndarray, reference: np.ndarray) -> tuple[bool, str]:
    an, rn = np.isnan(actual), np.isnan(reference)
    if not np.array_equal(an, rn):
        bad = np.argwhere(an != rn)[0]
        return False, (f"NaN positions differ ({int(an.sum())} in actual, {int(rn.sum())} in reference);"
                       f" first at {tuple(int(i) for i in bad)}: actual {actual[tuple(bad)]!r},"
                       f" reference {reference[tuple(bad)]!r}")
    ai, ri = np.isinf(actual), np.isinf(reference)
    if not np.array_equal(ai, ri) or not np.array_equal(np.sign(actual[ai]), np.sign(reference[ri])):
        bad = np.argwhere((ai != ri) | (ai & ri & (np.sign(actual) != np.sign(reference))))[0]
        return False, (f"Inf positions or signs differ; first at {tuple(int(i) for i in bad)}: actual"
                       f" {actual[tuple(bad)]!r}, reference {reference[tuple(bad)]!r}")
    return True, f"agree ({int(an.sum())} NaN, {int(ai.sum())} Inf)"


def compare(actual: Any, reference: Any, bound: Bound, dtype: Any, *, naive: Any = None,
            name: str = "output") -> ErrorReport:
    """Compare a tested output with the float64 reference under the error model.

    Parameters
    ----------
    actual : array (any float dtype or a torch tensor), the tested implementation's output, computed in T.
    reference : float64 array of the same shape, the refimpl output on the same (T-rounded) inputs.
    bound : :class:`Bound` for this operation (scale S and depth k).
    dtype : T, the precision the tested code computed in ("float32", np.float32, torch.float32, ...).
    naive : optional array, the same operation computed naively in T by NumPy
        (:func:`naive_same_precision`).  None means the naive error is taken as 0 and only the ULP floor
        applies (the right choice when T is float64, where the naive computation *is* the reference).

    Checks, all reported: shape equality; the NaN/Inf patterns agree exactly (never skipped: non-finite
    slots are excluded from the numeric error only after their pattern matched; the one exception is a
    slot where the naive T computation is itself non-finite while the reference is finite -- T cannot
    represent that result -- which the tested code may match, and the report counts);
    |actual - reference| <= bound element-wise; and max|actual - reference| <= NAIVE_ERROR_RATIO_MAX *
    max(max|naive - reference|, floor), floor = the largest of sqrt(k) u_T max S (the typical size of
    accumulated rounding, Higham §2.8), NAIVE_ULP_FLOOR ulps of max|reference| in T, and k eta_T.

    Known limitation: the floor inherits the looseness of S.  Where an operation's running bound is far above
    the errors actually observed (worst-case chaining through many stages: 10^2-10^4 for several attention
    modules), the floor rather than the naive error decides and the ratio check only catches gross
    inaccuracy.  A pure-ULP floor is no remedy: two correct float64 summation orders of a length-n dot
    product differ by ~sqrt(n) ulps, which would fail by chance.
    """
    act = _to_numpy64(actual)
    ref = _to_numpy64(reference)
    if act.shape != ref.shape:
        raise AssertionError(f"{name}: shape mismatch, actual {act.shape} vs reference {ref.shape}")
    dname = _format_name(dtype)
    u = unit_roundoff(dname)
    # Precision-excused slots: where the float64 reference is finite but the naive computation *in T*
    # is not (x^p, a normaliser or a product that overflows/underflows to 0/0 in T), T-arithmetic cannot
    # represent the result; the tested code may then be non-finite too.  Counted in the report; a finite
    # tested value there is still held to the bound.  Never applies without a naive computation.
    nv = None
    excused = np.zeros(ref.shape, dtype=bool)
    if naive is not None:
        nv = _to_numpy64(naive)
        if nv.shape != ref.shape:
            raise AssertionError(f"{name}: naive shape {nv.shape} differs from reference {ref.shape}")
        excused = np.isfinite(ref) & ~np.isfinite(nv) & ~np.isfinite(act)
    pattern_ok, pattern_msg = _pattern(np.where(excused, ref, act), ref)
    if excused.any():
        pattern_msg += (f"; {int(excused.sum())} slot(s) non-finite in the tested code where the naive"
                        f" {dname} computation is non-finite too (beyond {dname}'s range; excused)")
    finite = np.isfinite(act) & np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(act - ref), 0.0)
    bnd = bound.array(dname, ref.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > 0, err / bnd, 0.0)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)  # err > 0 against a NaN/0 bound is a failure
    if ref.size:
        worst = np.unravel_index(int(np.argmax(ratio)), ref.shape) if ratio.max() > 0 else \
            np.unravel_index(int(np.argmax(err)), ref.shape)
        worst = tuple(int(i) for i in worst)
    else:
        worst = None
    ulps = ulp_distance(np.where(finite, act, 0.0), np.where(finite, ref, 0.0), dname)
    scale = np.broadcast_to(np.asarray(bound.scale, dtype=np.float64), ref.shape)
    # An infinite scale means "no bound" for that element: it must also lift the naive floor, never
    # collapse it (a non-finite scale contributes +inf; a NaN scale is treated the same way).
    fin_scale = np.where(finite, np.where(np.isnan(scale), np.inf, scale), 0.0)
    fin_ref = np.where(finite, np.abs(ref), 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        scale_max = float(fin_scale.max(initial=0.0))
    floor = max(math.sqrt(max(bound.k, 1.0)) * u * scale_max,
                config.NAIVE_ULP_FLOOR * _spacing(float(fin_ref.max(initial=0.0)), dname),
                bound.k * underflow_eta(dname))  # results in the subnormal range err in absolute terms
    naive_err = None
    if nv is not None:
        nfin = finite & np.isfinite(nv)
        naive_err = float(np.max(np.where(nfin, np.abs(nv - ref), 0.0), initial=0.0))
    denom = max(naive_err or 0.0, floor)
    max_err = float(err.max(initial=0.0))
    naive_ratio = max_err / denom if denom > 0 else (0.0 if max_err == 0 else math.inf)
    return ErrorReport(
        name=name, dtype=dname, shape=tuple(ref.shape), max_abs_err=max_err,
        max_err_over_bound=float(ratio.max(initial=0.0)), worst_index=worst,
        worst_actual=float(act[worst]) if worst is not None else math.nan,
        worst_reference=float(ref[worst]) if worst is not None else math.nan,
        worst_bound=float(bnd[worst]) if worst is not None else math.nan,
        ulp_at_worst=float(ulps[worst]) if worst is not None else 0.0,
        max_ulp=float(ulps.max(initial=0.0)), naive_max_abs_err=naive_err, naive_floor=floor,
        naive_ratio=naive_ratio, pattern_ok=pattern_ok, pattern_msg=pattern_msg, k=bound.k, note=bound.note)


def assert_close(actual: Any, reference: Any, bound: Bound, dtype: Any, *, naive: Any = None,
                 name: str = "output") -> ErrorReport:
    """:func:`compare`, raising ``AssertionError`` with the full report when any check fails."""
    report = compare(actual, reference, bound, dtype, naive=naive, name=name)
    if not report.ok:
        raise AssertionError("error-model comparison failed\n" + str(report))
    return report


def naive_same_precision(fn: Callable[..., Any], *args: Any, dtype: Any, **kwargs: Any) -> Any:
    """Evaluate the NumPy definition ``fn`` in precision T: array arguments (including arrays inside
    dict/list arguments, such as a params mapping) are cast to T and every reference primitive computes
    in T.  bfloat16 has no NumPy type; its naive computation is run in float32 on bfloat16-rounded inputs,
    which is more accurate than bfloat16 arithmetic and so never makes the ratio check easier."""
    name = _format_name(dtype)
    np_dtype = np.float32 if name == "bfloat16" else np.dtype(name)

    def cast(a: Any) -> Any:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            return a.astype(np_dtype)
        if isinstance(a, dict):
            return {k: cast(v) for k, v in a.items()}
        if isinstance(a, (list, tuple)):
            return type(a)(cast(v) for v in a)
        return a

    with precision(np_dtype):
        return fn(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})


def _spacing(value: float, dtype_name: str) -> float:
    u, tiny = _FORMATS[dtype_name]
    if value <= 0 or not math.isfinite(value):
        return tiny
    return max(2.0 ** math.floor(math.log2(value)) * 2.0 * u, tiny)


def _to_numpy64(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor; torch is never imported here
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.double().numpy()
    return np.asarray(x, dtype=np.float64)
