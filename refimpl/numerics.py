"""dtype policy, stable primitives and the error model.

Three things live here and nowhere else:

1. **The dtype policy.**  Every public refimpl function passes its array arguments through
   :func:`as_float`, which accepts real floating arrays (float16/32/64), promotes them to the working
   precision (float64 unless a :func:`precision` context says otherwise) and refuses integer, complex,
   bool and object arrays with a ``TypeError`` that names the argument.  Shapes are checked with
   :func:`check_shapes`, which binds named dimensions ("B h N d") across arguments.
2. **Stable primitives**: softmax by max-subtraction, GELU (erf and tanh forms), ELU, an overflow-free
   softplus, ReLU, LeakyReLU and L2 normalisation with an explicit eps policy.
3. **The naive same-precision computation** (:func:`naive_same_precision`): the NumPy definition run in a
   lower precision T, one member of the verdict's ensemble of legitimate evaluations.

The error model itself (unit roundoffs, ``gamma_k``, :class:`Bound`, :func:`compare`, :func:`assert_close`)
lives in :mod:`refimpl.verdict`; its names are re-exported here, so ``numerics.compare`` is
``verdict.compare``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import scipy.special

from . import config
from .errors import ArgumentError, ArgumentTypeError
from .validation import check_axis, check_eps, check_float_array, check_option, check_real, describe
from .verdict import (Bound, ErrorReport, Stage, StageReport, accumulation_ratio, assert_close, compare,
                      compare_stages, format_name, gamma, round_to, running_bound, sum_depth, sum_depth_l2,
                      ulp_distance,
                      underflow_eta, unit_roundoff)

__all__ = [
    "working_dtype", "precision", "as_float", "check_shapes", "check_positive_int",
    "softmax", "softmax_bound", "gelu", "elu", "softplus", "relu", "leaky_relu", "l2_normalize",
    "pow2_exponent", "softmax_shifted",
    "unit_roundoff", "underflow_eta", "gamma", "sum_depth", "sum_depth_l2", "accumulation_ratio", "running_bound", "round_to", "Bound", "ErrorReport", "compare",
    "assert_close", "naive_same_precision", "ulp_distance", "Stage", "StageReport", "compare_stages",  # the error model's names: refimpl.verdict
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
        raise ArgumentTypeError(f"precision: expected a real floating dtype, got {dt}")
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
        raise ArgumentTypeError(f"argument '{name}': expected a real floating array, got bool")
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        arr = np.asarray(float(x))
    else:
        arr = np.asarray(x)
        if arr.dtype.kind != "f":
            kind = {"i": "integer", "u": "unsigned integer", "b": "bool", "c": "complex",
                    "O": "object"}.get(arr.dtype.kind, str(arr.dtype))
            raise ArgumentTypeError(
                f"argument '{name}': expected a real floating array (float16/float32/float64), "
                f"got {kind} dtype {arr.dtype}")
        if arr.dtype.itemsize > 8:
            raise ArgumentTypeError(f"argument '{name}': extended precision {arr.dtype} is not supported; "
                            f"expected float16/float32/float64")
    if arr.size == 0 and not allow_empty:
        raise ArgumentError(f"argument '{name}': expected a non-empty array, got shape {arr.shape}")
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
            raise ArgumentError(f"argument '{name}': expected a {len(dims)}-d array of shape ({', '.join(dims)}), "
                             f"got {len(shape)}-d shape {tuple(shape)}")
        for dim, size in zip(dims, shape):
            want = int(dim) if dim.isdigit() else bound.get(dim)
            if want is not None and want != size:
                expected = ", ".join(str(bound.get(d, d)) if not d.isdigit() else d for d in dims)
                raise ArgumentError(f"argument '{name}': expected shape ({expected}) for ({', '.join(dims)}), "
                                 f"got {tuple(shape)}; dimension {dim} is {want}, not {size}")
            if not dim.isdigit():
                bound[dim] = size
    return bound


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """Return ``value`` as int, raising ``ValueError``/``TypeError`` naming ``name`` if it is not >= minimum."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"argument '{name}': expected an integer >= {minimum}, got {describe(value)}")
    if value < minimum:
        raise ArgumentError(f"argument '{name}': expected an integer >= {minimum}, got {value}")
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
    axis = check_axis(axis, x.ndim)
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
    axis = check_axis(axis, x.ndim)
    p = softmax(x, axis)
    y = np.abs(x - np.max(x, axis=axis, keepdims=True))
    with np.errstate(invalid="ignore"):
        ey = np.sum(np.where(p > 0, p * y, 0.0), axis=axis, keepdims=True)
    n = x.shape[axis]
    return Bound(p * (n + config.ELEMENTARY_FUNCTION_ULPS + 3 + y + ey), 1,
                 "softmax: k folded into the scale, u p_i (n + ulps + 3 + |x_i - max| + E_p|x - max|)")


def gelu(x: np.ndarray, approximate: str = "none", *, out: np.ndarray | None = None) -> np.ndarray:
    """GELU(x) = x * Phi(x) (Hendrycks & Gimpel, 2016).

    approximate="none": x/2 * (1 + erf(x / sqrt 2)), the exact form (torch's default);
    approximate="tanh": x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    out: None, or an array of the result's shape and of its dtype or x's (x itself allowed: the map is
    element-wise) that receives the values, rounded to out's dtype, and is returned (the kernels' ``out=``, so
    that a caller writes in place on every backend; under a half precision, where erf computes in float32, out = x
    keeps x's format, as the next operation's as_float would).
    """
    x = as_float(x, "x")
    if approximate == "none":
        y = 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))
    elif approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        y = 0.5 * x * (1.0 + np.tanh(c * (x + config.GELU_TANH_COEF * x * x * x)))
    else:
        raise ArgumentError(f"argument 'approximate': expected 'none' or 'tanh', got {approximate!r}")
    if out is None:
        return y
    if not isinstance(out, np.ndarray) or out.shape != np.shape(y) or out.dtype not in (y.dtype, x.dtype) \
            or not out.flags.writeable:
        raise ArgumentTypeError(f"argument 'out': expected a writeable {x.dtype} array of shape {np.shape(y)}, "
                                f"got {describe(out)}")
    np.copyto(out, y, casting="same_kind")
    return out


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0); NaN propagates (np.maximum propagates NaN, unlike a comparison-based select)."""
    x = as_float(x, "x")
    return np.maximum(x, 0.0)


def leaky_relu(x: np.ndarray, negative_slope: float = 0.01) -> np.ndarray:
    """x for x >= 0, negative_slope * x otherwise (torch's default slope 0.01)."""
    negative_slope = check_real(negative_slope, "negative_slope")
    x = as_float(x, "x")
    return np.where(x >= 0, x, negative_slope * x) + 0.0 * x  # + 0*x keeps NaN in the NaN slots


def elu(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """ELU(x) = x for x > 0, alpha * (exp(x) - 1) otherwise; expm1 keeps relative accuracy near 0."""
    alpha = check_real(alpha, "alpha")
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
    check_real(beta, "beta")
    if threshold is not None:
        check_real(threshold, "threshold", allow_inf=True)
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
    check_eps(eps)
    check_option(policy, "policy", ("clamp", "add", "none"))
    x = as_float(x, "x")
    axis = check_axis(axis, x.ndim)
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
    raise ArgumentError(f"argument 'policy': expected 'clamp', 'add' or 'none', got {policy!r}")


# ===================================================================================================
# Range safety: exact power-of-two rescaling
# ===================================================================================================

def pow2_exponent(x: np.ndarray, axis: Any = None, *, scale_up: bool = False) -> np.ndarray:
    """The exponent e (an int array, ``keepdims`` along ``axis``) of an exact rescaling x -> x 2^-e.

    With m = max |x| along ``axis``: e is frexp's exponent of m (so m 2^-e lies in [1/2, 1)) where m exceeds
    2^B, B = ``config.RANGE_RESCALE_EXPONENT`` (e > 0), and, with ``scale_up``, where 0 < m < 2^-B (e < 0: tiny
    and subnormal groups scaled up); 0 elsewhere (m inside the band [2^-B, 2^B], zero, or not finite: NaN and
    Inf then propagate unchanged).  Multiplying by a power of two is exact unless the product over- or
    underflows, so a computation that is homogeneous in x, run on x 2^-e and scaled back by ``np.ldexp``, is bit
    for bit the unscaled computation wherever the latter neither over- nor underflows, and where it does, the
    computation float64 would give with an unbounded exponent (up to the one rounding of the final ``ldexp``
    into the subnormal range); inside the band e = 0 and the computation is literally the unscaled one (the
    band's derivation is in config).  Used by the attention cores (linear, focused, RALA, softmax) to return the
    finite result that 1e150-sized inputs have, and with ``scale_up`` by linear attention and RALA's core
    (refimpl.attention.linear, rala_core: homogeneous of degree 0 in phi(Q) and phi(K), 1 in V) to return the
    exact result of tiny ones.

    ``scale_up`` is off by default: an additive softmax bias (softmax attention) is not homogeneous, and the
    logits of RALA's Eq. 4 are scaled back by softmax_shifted, which takes shifts >= 0.  Where a normaliser
    underflows to 0 although the exact one is > 0 (exp's underflow inside a group, which no power of two
    undoes) the linear-attention and RALA cores recompute that row from log-features (docs/guarantees.md).
    float32 holds no magnitude outside the band (2^-149 .. 2^128), so its runs (the verdict's naive member,
    which must under- and overflow as the format does) are never rescaled.
    """
    x = check_float_array(x, "x")                       # no cast: the exponent is of the values as given
    axis = _check_axes(axis, x.ndim)
    m = np.max(np.abs(x), axis=axis, keepdims=True).astype(np.float64)   # float64: the band's edge
    e = np.frexp(m)[1].astype(np.int64)
    band = 2.0 ** config.RANGE_RESCALE_EXPONENT
    out = m > band
    if scale_up:
        out = out | ((m > 0) & (m < 1.0 / band))
    return np.where(np.isfinite(m) & out, e, 0)


#: ln 2 split for Cody & Waite's argument reduction: _LN2_HI has 32 significant bits, so s * _LN2_HI is exact
#: for |s| < 2^21 (fdlibm's e_exp.c uses the same split idea).
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
#: The exponent that stands for "below 2^-(2^30)": exp(x) for a group whose largest x is below -2^29 is so
#: small that every quantity it multiplies underflows; the group's shape exp(x - max x) is kept exactly.
_EXP_SPLIT_FLOOR = -(2 ** 30)


def exp_pow2_split(x: np.ndarray, axis: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """exp(x) as (f, s) with exp(x) = f 2^s, s an int array (``keepdims`` along ``axis``), for groups whose
    exp underflows: the log-domain counterpart of :func:`pow2_exponent` (docs/guarantees.md).

    With m = max x along ``axis``, s = round(m / ln 2) and f = exp((x - s ln_hi) - s ln_lo) (Cody-Waite
    reduction with ln 2 = ln_hi + ln_lo; s ln_hi is exact), so the largest f lies in [2^-1/2, 2^1/2] and f
    carries exp's own accuracy (the subtraction is exact by Sterbenz's lemma for the entries that matter,
    those within a factor 2 of m).  For m below -2^29 (s would leave int32, and exp(m) < 2^-(7 10^8))
    f = exp(x - m) and s = -2^30: a stand-in small enough that every product with it underflows to 0, as
    the exact one does.  Float64 only (it is the working precision of the reference's range safety)."""
    x = check_float_array(x, "x")
    axis = _check_axes(axis, x.ndim)
    m = np.max(x, axis=axis, keepdims=True)
    far = ~(m >= -(2.0 ** 29))                          # NaN counts as far: exp(x - NaN) is NaN
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(far | ~(m <= 2.0 ** 29), 0.0, np.round(m / math.log(2.0)))   # beyond +-2^29: s = 0
    with np.errstate(invalid="ignore", over="ignore"):
        f = np.where(far, np.exp(x - m), np.exp((x - s * _LN2_HI) - s * _LN2_LO))
    return f, np.where(far, _EXP_SPLIT_FLOOR, s).astype(np.int64)


def check_bound_range(bound: "Bound", stage: str, **inputs: Any) -> "Bound":
    """The range policy of the error bounds (docs/guarantees.md): ``bound`` unchanged, or FloatingPointError
    naming the stage where every input array is finite, one of them exceeds the rescaling band 2^B
    (B = ``config.RANGE_RESCALE_EXPONENT``) and a field of the bound (scale, sigma, ref_scale) is not finite.

    The bounds are not rescaled (their underflow terms k eta are not homogeneous), so for such inputs the
    products of magnitudes they sum overflow although the attention output may be representable: the bound
    itself is then not representable, and saying so is the honest outcome.  Inside the band (every ordinary
    input, and tiny or subnormal ones: there an inf bound is the documented "no bound exists", rounding or
    underflow may reach a zero normaliser) nothing is checked or changed; NaN and Inf inputs keep their
    non-finite bound."""
    big = None
    for name, a in inputs.items():
        a = np.asarray(a, dtype=np.float64)
        if a.size == 0:
            continue
        if not np.all(np.isfinite(a)):
            return bound
        m = float(np.max(np.abs(a)))
        if m > 2.0 ** config.RANGE_RESCALE_EXPONENT and big is None:
            big = (name, m)
    if big is None:
        return bound
    for field in (bound.scale, bound.sigma, bound.ref_scale):
        if field is not None and not np.all(np.isfinite(np.asarray(field, dtype=np.float64))):
            raise FloatingPointError(f"{stage}: the bound of {stage} overflows float64 for inputs of this magnitude "
                                     f"(max |{big[0]}| = {big[1]:.3g} > 2^{config.RANGE_RESCALE_EXPONENT}; the bound "
                                     f"is not representable)")
    return bound


def _check_axes(axis: Any, ndim: int) -> Any:
    """``axis`` of :func:`pow2_exponent`: None (all axes), an axis or a tuple of distinct axes of a
    ``ndim``-d array."""
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = tuple(check_axis(a, ndim, f"axis[{i}]") for i, a in enumerate(axis))
        if len(set(axes)) != len(axes):
            raise ArgumentError(f"argument 'axis': expected distinct axes, got {describe(axis)}")
        return axes
    return check_axis(axis, ndim)


def _check_shift(shift: Any, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """``shift`` of :func:`softmax_shifted`: an integer array (or int) broadcasting to the keepdims shape of
    the reduction along ``axis`` (one exponent per softmax row)."""
    arr = None if isinstance(shift, (str, bytes)) else np.asarray(shift)
    if arr is None or arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"argument 'shift': expected an integer array of exponents (pow2_exponent), "
                                f"got {describe(shift)}")
    rows = tuple(1 if a == axis else n for a, n in enumerate(shape))
    try:
        ok = np.broadcast_shapes(arr.shape, rows) == rows
    except ValueError:
        ok = False
    if not ok:
        raise ArgumentError(f"argument 'shift': expected a shape broadcasting to {rows} (one exponent per row "
                            f"of 's' of shape {tuple(shape)} along 'axis' = {axis}), got shape {arr.shape}")
    return arr


def softmax_shifted(s: np.ndarray, shift: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax(s 2^shift) along ``axis`` from s (logits divided by 2^shift >= 1, :func:`pow2_exponent`).

    exp(x - max x) with x = s 2^shift is exp((s - max s) 2^shift): the difference is formed on the scaled
    logits (exact scaling, so the same rounding) and scaled back with ``np.ldexp``; a difference that
    overflows is -inf, whose exp is the exact 0 that float64 would give anyway.  With shift = 0 this is
    :func:`softmax` (s) bit for bit (its own max is then exactly 0).  A row of -inf stays NaN.
    """
    s = check_float_array(s, "s")                       # no cast: the difference is formed in s's dtype
    if s.size == 0:
        raise ArgumentError(f"argument 's': expected a non-empty array, got shape {s.shape}")
    axis = check_axis(axis, s.ndim)
    shift = _check_shift(shift, s.shape, axis)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.ldexp(s - np.max(s, axis=axis, keepdims=True), shift)
    return softmax(d, axis=axis)


# ===================================================================================================
# The naive same-precision computation
# ===================================================================================================

def naive_same_precision(fn: Callable[..., Any], *args: Any, dtype: Any, **kwargs: Any) -> Any:
    """Evaluate the NumPy definition ``fn`` in precision T: array arguments (including arrays inside
    dict/list arguments, such as a params mapping) are cast to T and every reference primitive computes
    in T.  bfloat16 has no NumPy type; its naive computation is run in float32 on bfloat16-rounded inputs,
    which is more accurate than bfloat16 arithmetic: the ensemble's torch members (refimpl.ensemble) supply
    genuine bfloat16 rounding."""
    name = format_name(dtype)
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
