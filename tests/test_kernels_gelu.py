"""GELU on the C and Numba backends (operation "gelu") against its NumPy definition, refimpl.numerics.gelu,
the dispatch of refimpl.layers.gelu / layers.mlp to them, and the vectorisable erf they use.

The kernels (ckernels/gelu.c, refimpl/backends/_c_elementwise.py, _numba_elementwise.py) perform the
definition's operations in its order with the branch-free erf of ckernels/erf_vec.h (exact form) or libm's
tanh in place of scipy.special.erf / np.tanh.  What is checked, on every backend available here
(tests.kernel_helpers.available_backends; the NumPy backend checks the dispatch path itself):

1. Every float64 (Hypothesis: any bit pattern's value, subnormals, +-Inf and NaN included, and ordinary
   activations): the kernel lies within layers.gelu_bound of the definition, NaN exactly where the definition
   has NaN; both forms ("none" and "tanh").
2. The kernels lie within layers.gelu_bound of the exact value (mpmath, 50 digits) on finite inputs.
3. IEEE special values bit for bit as the definition: +-0 -> +-0 (the sign kept), +Inf -> +Inf, -Inf -> NaN
   (the definition's (-Inf) * 0), NaN -> NaN, subnormals, x = -40 and -1e300 -> -0, 1e300 -> 1e300.
4. Layout and dtype: non-contiguous and negative-stride float64 inputs are taken (copied to C order: the
   same bits as the contiguous input); float32 under numerics.precision(float32), 0-d inputs, empty arrays,
   integer arrays and unknown forms are refused by the predicate and run on the definition (the NumPy
   backend's bits or its errors); a direct kernel call with float32 raises TypeError.
5. out= (in place allowed, overlap and wrong dtype refused), threads 1/2/3 give the same bits, the NaN
   poisoning (a C kernel that writes nothing returns all NaN).
6. layers.mlp on the C / Numba backend lies within layers.mlp_bound of the NumPy backend; the default
   backend's bits are numerics.gelu's.
7. The erf itself: its error in ulps against mpmath (50 digits) on a dense sweep of [-6.5, 6.5], the piece
   boundaries, the saturation region, tiny and subnormal arguments, and (Hypothesis) any float64, is at most
   config.ELEMENTARY_FUNCTION_ULPS (the budget gelu_bound charges for erf); special values exactly (+-0,
   +-Inf -> +-1, NaN); odd symmetry bit for bit; the same bits at every instruction-set level and in C and
   Numba; the two copies of the coefficients (C header, Numba module) equal; the plain libm versions
   (gelu_libm) within gelu_bound of the vectorised ones.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from refimpl import backends, config, layers, numerics
from refimpl.backends import _c_elementwise, _numba_elementwise
from tests.kernel_helpers import (agree_float64, available_backends, backend_available, c_kernel_that_writes_nothing,
                                  registered_kernel)

FORMS = pytest.mark.parametrize("approximate", ["none", "tanh"])
ACCEL = ("c", "numba")

#: The special inputs and what the definition gives for them, as (x, gelu(x), gelu_tanh(x)); None = NaN.
TINY = np.finfo(np.float64).tiny
MAXF = np.finfo(np.float64).max
SPECIALS = [
    (0.0, 0.0, 0.0), (-0.0, -0.0, -0.0), (math.inf, math.inf, math.inf), (-math.inf, None, None),
    (math.nan, None, None), (-40.0, -0.0, -0.0), (-1e300, -0.0, -0.0), (-MAXF, -0.0, -0.0),
    (1e300, 1e300, 1e300), (MAXF, MAXF, MAXF), (5e-324, 0.0, 0.0), (-5e-324, -0.0, -0.0),
    (TINY, TINY / 2, TINY / 2), (-TINY, -TINY / 2, -TINY / 2), (1e-300, 5e-301, 5e-301), (-1e-300, -5e-301, -5e-301),
]


def kernel(name: str):
    """The registered "gelu" kernel of backend ``name`` (the NumPy definition where it is unavailable)."""
    return registered_kernel("gelu", name)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)


def same_bits_or_nan(actual, expected) -> None:
    """Bit for bit where the expected value is not NaN (the sign of a zero included); NaN where it is."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    np.testing.assert_array_equal(bits(actual[~nan]), bits(expected[~nan]))


def definition(x, approximate="none"):
    with np.errstate(all="ignore"):
        return numerics.gelu(x, approximate)


# ---------------------------------------------------------------------------------------------------
# 1-2. Agreement with the definition and with the exact value
# ---------------------------------------------------------------------------------------------------

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=64)
ACTIVATION = st.floats(min_value=-12.0, max_value=12.0, allow_nan=False, width=64)
DEEP_NEGATIVE = st.floats(min_value=-40.0, max_value=-5.0, width=64)   # 1 + erf cancels: tiny results
VALUES = st.lists(st.one_of(ANY_FLOAT, ACTIVATION, DEEP_NEGATIVE), min_size=1, max_size=64)


@FORMS
@settings(max_examples=60)
@given(values=VALUES, ncols=st.sampled_from([1, 2, 3]))
@example(values=[s[0] for s in SPECIALS], ncols=1)
@example(values=[-8.3, -10.0, -26.5, -37.9, 1.0, -1.0, 0.5, 3.0], ncols=2)
def test_kernel_within_bound_of_definition(approximate, values, ncols):
    x = np.array(values * ncols, dtype=np.float64).reshape(ncols, -1)
    ref = definition(x, approximate)
    bound = layers.gelu_bound(np.where(np.isfinite(x), x, 0.0), approximate)
    for name in available_backends():
        with np.errstate(all="ignore"):                        # the NumPy backend's -Inf * 0 and x**3 overflow
            got = kernel(name)(x, approximate)
        assert got.shape == x.shape and got.dtype == np.float64
        nonfinite = ~np.isfinite(x) | ~np.isfinite(ref)
        same_bits_or_nan(got[nonfinite], ref[nonfinite])       # Inf and NaN slots: exactly the definition's
        agree_float64(np.where(nonfinite, 0.0, got), np.where(nonfinite, 0.0, ref), bound, f"gelu[{name}]")
        with backends.use(name), np.errstate(all="ignore"):   # the dispatch path gives the kernel's bits
            same_bits_or_nan(layers.gelu(x, approximate), got)


def exact_gelu(x: float, approximate: str) -> float:
    """GELU(x) to 50 digits, rounded to float64: x/2 erfc(-x/sqrt 2) (no cancellation for x << 0), or the tanh
    form with the definition's constants (sqrt(2/pi) and 0.044715 as the doubles it uses)."""
    if approximate == "none" and abs(x) > 40:   # mpmath's erfc overflows for huge arguments; the value is known:
        return x if x > 0 else -0.0             # x (1 - erfc(x/sqrt 2)/2) rounds to x, |GELU| < 1e-340 rounds to -0
    with mpmath.workdps(50):
        v = mpmath.mpf(x)
        if approximate == "none":
            return float(v / 2 * mpmath.erfc(-v / mpmath.sqrt(2)))
        c = mpmath.mpf(math.sqrt(2.0 / math.pi))
        z = c * (v + mpmath.mpf(config.GELU_TANH_COEF) * v ** 3)
        return float(v / 2 * (1 + mpmath.tanh(z)))


@FORMS
@settings(max_examples=40)
@given(values=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True, width=64),
                                 ACTIVATION, DEEP_NEGATIVE), min_size=1, max_size=24))
@example(values=[-8.3, -10.0, -26.5, -37.9, 1e-300, 5e-324, -1e300, 1.7e308, 0.7071067811865476])
def test_kernel_within_bound_of_exact_value(approximate, values):
    x = np.array(values, dtype=np.float64)
    exact = np.array([exact_gelu(v, approximate) for v in values])
    bound = layers.gelu_bound(x, approximate)
    for name in available_backends():
        with np.errstate(over="ignore"):                       # the tanh form's x**3 overflows for |x| > 1e102
            got = kernel(name)(x, approximate)
        agree_float64(got, exact, bound, f"gelu[{name}] vs mpmath")


# ---------------------------------------------------------------------------------------------------
# 3. Special values, bit for bit
# ---------------------------------------------------------------------------------------------------

@FORMS
def test_special_values_bit_for_bit(approximate):
    x = np.array([s[0] for s in SPECIALS])
    col = 1 if approximate == "none" else 2
    expected = np.array([math.nan if s[col] is None else s[col] for s in SPECIALS])
    same_bits_or_nan(definition(x, approximate), expected)       # the definition's values, as listed
    for name in available_backends():
        with np.errstate(all="ignore"):
            same_bits_or_nan(kernel(name)(x, approximate), expected)
        with backends.use(name), np.errstate(all="ignore"):
            same_bits_or_nan(layers.gelu(x, approximate), expected)
    assert np.signbit(kernel(ACCEL[0])(np.array([-0.0, -40.0]))).all()    # -0, not +0


# ---------------------------------------------------------------------------------------------------
# 4. Layout and dtype
# ---------------------------------------------------------------------------------------------------

def test_registration_and_predicate():
    assert backends.kernels()["gelu"] == ("numpy", "numba", "c")
    assert backends.definition("gelu") is numerics.gelu
    ok = _c_elementwise.gelu_supported
    x = np.ones((4, 6))
    assert ok(x) and ok(x, "tanh") and ok(x.T) and ok(x[:, ::-2])          # any layout of float64
    assert not ok(x.astype(np.float32)) and not ok(x.astype(">f8")) and not ok(np.float64(1.0))
    assert not ok(np.array(1.0)) and not ok(np.ones((0, 3))) and not ok(x, "erf") and not ok([1.0, 2.0])


@pytest.mark.parametrize("name", ACCEL)
def test_non_contiguous_inputs_are_taken(name):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 50)) * 4
    fn = kernel(name)
    for view in (base.T, base[::-1], base[:, ::3], base[::2, ::-5], np.asfortranarray(base)):
        assert _c_elementwise.gelu_supported(view)
        got = fn(view)
        same_bits_or_nan(got, fn(np.ascontiguousarray(view)))
        agree_float64(got, definition(view), layers.gelu_bound(view), f"gelu[{name}] non-contiguous")
        with backends.use(name):
            same_bits_or_nan(layers.gelu(view), got)


@pytest.mark.parametrize("name", ACCEL)
def test_refused_calls_run_on_the_definition(name):
    rng = np.random.default_rng(5)
    x32 = (rng.standard_normal((8, 9)) * 3).astype(np.float32)
    with backends.use(name):
        with numerics.precision(np.float32):                   # float32 stays float32: the definition runs
            got = layers.gelu(x32)
        assert got.dtype == np.float32
        with numerics.precision(np.float32):
            expected = numerics.gelu(x32)
        np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))
        promoted = layers.gelu(x32)                            # default precision: promoted, then the kernel
        same_bits_or_nan(promoted, kernel(name)(x32.astype(np.float64)))
        scalar = layers.gelu(1.5)                              # 0-d: the definition (a NumPy scalar)
        assert np.ndim(scalar) == 0 and scalar == numerics.gelu(1.5)
        with pytest.raises(TypeError):
            layers.gelu(np.arange(4))
        with pytest.raises(ValueError):
            layers.gelu(np.ones((0, 2)))
        with pytest.raises(ValueError, match="approximate"):
            layers.gelu(np.ones(3), "erf")
    if backend_available(name, "gelu"):
        with pytest.raises(TypeError, match="float64"):
            kernel(name)(x32)
        with pytest.raises(ValueError, match="non-empty"):
            kernel(name)(np.array(1.0))
        with pytest.raises(ValueError, match="approximate"):
            kernel(name)(np.ones(3), "erf")


# ---------------------------------------------------------------------------------------------------
# 5. out=, threads, poisoning
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ACCEL)
def test_out_buffers(name):
    if not backend_available(name, "gelu"):
        return
    fn = kernel(name)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 33)) * 5
    expected = fn(x)
    out = backends.empty_aligned(x.shape)
    assert fn(x, out=out) is out
    same_bits_or_nan(out, expected)
    y = x.copy()
    assert fn(y, out=y) is y                                   # in place
    same_bits_or_nan(y, expected)
    flat = x.reshape(-1)
    with pytest.raises(ValueError, match="shares memory"):      # overlapping, not the same buffer: refused
        fn(flat[:-1], out=flat[1:])
    with pytest.raises(TypeError):
        fn(x, out=np.empty(x.shape, np.float32))
    with pytest.raises(ValueError):
        fn(x, out=np.empty((16, 32)))


@FORMS
@pytest.mark.parametrize("name", ACCEL)
def test_thread_count_changes_no_bit(name, approximate):
    if not backend_available(name, "gelu"):
        return
    rng = np.random.default_rng(11)
    x = rng.standard_normal(3 * 16384 + 123) * 6               # above the one-thread cut-off, a partial block
    one = kernel(name)(x, approximate, threads=1)
    for t in (1, 2, 3, 5):
        same_bits_or_nan(kernel(name)(x, approximate, threads=t), one)
        y = x.copy()                                           # in place, several blocks (Numba: via scratch)
        assert kernel(name)(y, approximate, out=y, threads=t) is y
        same_bits_or_nan(y, one)
    agree_float64(one, definition(x, approximate), layers.gelu_bound(x, approximate), f"gelu[{name}] threads")
    with pytest.raises(ValueError, match="threads"):
        kernel(name)(x, threads=0)


@FORMS
def test_layers_gelu_out_in_place_on_every_backend(approximate):
    """layers.gelu(x, out=x), as the networks' MLPs call it on their fresh fc1 output: the same bits as
    without out on every backend (the NumPy definition copies its result into out), x returned; the
    definition refuses an out of another shape or dtype, naming it."""
    x = np.random.default_rng(3).standard_normal((2, 197, 96)) * 4
    for name in available_backends():
        with backends.use(name):
            fresh = layers.gelu(x, approximate)
            y = x.copy()
            assert layers.gelu(y, approximate, out=y) is y
            same_bits_or_nan(y, fresh)
    for bad in (np.empty((2, 197, 95)), np.empty(x.shape, np.float32), [0.0]):
        with pytest.raises(TypeError, match="argument 'out'"):
            numerics.gelu(x, approximate, out=bad)


def test_c_output_is_poisoned():
    if not backend_available("c", "gelu"):
        return
    with c_kernel_that_writes_nothing("refimpl_gelu_f64") as calls:
        got = kernel("c")(np.ones((3, 4)))
    assert len(calls) == 1 and np.isnan(got).all()


# ---------------------------------------------------------------------------------------------------
# 6. Dispatch from the layers
# ---------------------------------------------------------------------------------------------------

def test_default_backend_is_the_definition_bit_for_bit():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((5, 7)) * 4
    assert backends.current() == config.DEFAULT_BACKEND == "numpy"
    for form in ("none", "tanh"):
        same_bits_or_nan(layers.gelu(x, form), numerics.gelu(x, form))


@FORMS
@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20), c=st.integers(1, 12), hd=st.integers(1, 48),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_mlp_on_each_backend_within_mlp_bound(approximate, seed, n, c, hd, scale):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, n, c)) * scale
    p = {"fc1.weight": rng.standard_normal((hd, c)), "fc1.bias": rng.standard_normal(hd),
         "fc2.weight": rng.standard_normal((c, hd)), "fc2.bias": rng.standard_normal(c)}
    ref = layers.mlp(x, p, approximate)
    bound = layers.mlp_bound(x, p, approximate)
    for name in available_backends():
        with backends.use(name):
            got = layers.mlp(x, p, approximate)
        agree_float64(got, ref, bound, f"mlp[{name}]")


# ---------------------------------------------------------------------------------------------------
# 7. The vectorisable erf (ckernels/erf_vec.h and its Numba twin)
# ---------------------------------------------------------------------------------------------------

BUDGET = config.ELEMENTARY_FUNCTION_ULPS


def erf_impls() -> dict:
    """The erf implementations available here: the C vectorised one, libm's (through C), the Numba twin."""
    impls = {}
    if backend_available("c", "gelu"):
        impls["c"] = lambda x: _c_elementwise.erf(x)
        impls["c libm"] = lambda x: _c_elementwise.erf(x, "libm")
    if backend_available("numba", "gelu"):
        impls["numba"] = lambda x: _numba_elementwise.erf(x, threads=1)
    return impls


def exact_erf(x: np.ndarray) -> tuple[list, list]:
    """erf(x) (mpmath, 50 digits) and its ulp (that of the binade of the exact value; 2^-1074 in the
    subnormal range), for finite x."""
    values, ulps = [], []
    with mpmath.workdps(50):
        for xi in x.tolist():
            e = mpmath.erf(mpmath.mpf(xi))
            values.append(e)
            ulps.append(mpmath.ldexp(1, max(mpmath.frexp(e)[1] - 53, -1074)) if e != 0 else mpmath.ldexp(1, -1074))
    return values, ulps


def ulp_errors(exact: tuple[list, list], y: np.ndarray) -> np.ndarray:
    """|y - erf(x)| in ulps of erf(x), with ``exact`` = exact_erf(x)."""
    with mpmath.workdps(50):
        return np.array([float(abs(mpmath.mpf(yi) - e) / u) for yi, e, u in zip(y.tolist(), *exact)])


def sweep_points() -> np.ndarray:
    """A dense sweep of [-6.5, 6.5] (step ~1e-3), the piece boundaries 0.875 and 6 with their neighbours,
    the saturation region, random points near the boundary where erfc matters most, tiny and subnormal x."""
    rng = np.random.default_rng(2024)
    edges = []
    for b in (0.875, 6.0, 5.9, 5.9215871957945, 5.93):     # erfc(5.9215871957945) = 2^-54
        edges += [b, np.nextafter(b, 0.0), np.nextafter(b, 10.0)]
    tiny = [5e-324, 1e-320, 1e-310, TINY, np.nextafter(TINY, 0.0), 1e-300, 1e-200, 1e-160, 1e-100, 1e-20, 1e-9]
    pos = np.concatenate([np.linspace(0.0, 6.5, 6501), rng.uniform(0.8, 1.6, 1000), rng.uniform(0.0, 0.875, 300),
                          rng.uniform(5.5, 7.0, 100), edges, tiny])
    return np.concatenate([pos, -pos])


def test_erf_accuracy_sweep_against_mpmath():
    x = sweep_points()
    exact = exact_erf(x)
    worst = {}
    for name, f in erf_impls().items():
        y = f(x)
        u = ulp_errors(exact, y)
        worst[name] = (float(u.max()), float(x[u.argmax()]))
        assert u.max() <= BUDGET, f"erf[{name}]: {u.max():.3f} ulps at x = {x[u.argmax()]!r} > {BUDGET}"
    print("erf max ulps (value, at x):", worst)


def test_erf_special_values():
    x = np.array([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 6.0, -6.0, 7.0, -1e300, MAXF, -MAXF,
                  5.93, -5.93, 5e-324, -5e-324])
    expected = np.array([0.0, -0.0, 1.0, -1.0, math.nan, math.nan, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0,
                         5e-324, -5e-324])     # erf(5e-324) = 1.128 * 2^-1074 rounds to 2^-1074
    for name, f in erf_impls().items():
        same_bits_or_nan(f(x), expected)
    for name in ACCEL:                        # the GELU kernels' own values for the same inputs
        if backend_available(name, "gelu"):
            with np.errstate(all="ignore"):
                same_bits_or_nan(kernel(name)(x * math.sqrt(2.0)), definition(x * math.sqrt(2.0)))


@settings(max_examples=80)
@given(values=st.lists(st.one_of(ANY_FLOAT, st.floats(-7.0, 7.0, width=64),
                                 st.floats(-1e-150, 1e-150, allow_subnormal=True, width=64)), min_size=1, max_size=32))
def test_erf_any_float64_within_budget(values):
    x = np.array(values, dtype=np.float64)
    finite = np.isfinite(x)
    exact = exact_erf(x[finite])
    for name, f in erf_impls().items():
        y = f(x)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(x))
        np.testing.assert_array_equal(y[np.isinf(x)], np.sign(x[np.isinf(x)]))
        u = ulp_errors(exact, y[finite])
        assert u.size == 0 or u.max() <= BUDGET, f"erf[{name}]: {u.max():.3f} ulps at {x[finite][u.argmax()]!r}"
        same_bits_or_nan(f(-x), -y)                                 # odd, bit for bit (the sign of 0 included)


def test_erf_same_bits_everywhere():
    """Every instruction-set level of the C kernel, and the Numba twin, return the same bits (the same IEEE
    operations in the same order; no FMA contraction)."""
    if not backend_available("c", "gelu"):
        return
    rng = np.random.default_rng(17)
    x = np.concatenate([rng.standard_normal(3000) * 3, sweep_points()[::7], [math.nan, math.inf, -math.inf]])
    lib = backends._c._load().lib
    supported, before = lib.refimpl_isa_supported(), lib.refimpl_isa_in_use()
    ref_erf, ref_gelu = _c_elementwise.erf(x), _c_elementwise.gelu(x)
    try:
        for level in range(supported + 1):
            assert lib.refimpl_set_max_isa(level) == level
            same_bits_or_nan(_c_elementwise.erf(x), ref_erf)
            same_bits_or_nan(_c_elementwise.gelu(x), ref_gelu)
    finally:
        lib.refimpl_set_max_isa(before if before < supported else 2)
    if backend_available("numba", "gelu"):
        same_bits_or_nan(_numba_elementwise.erf(x), ref_erf)
        same_bits_or_nan(_numba_elementwise.gelu(x), ref_gelu)


def test_erf_coefficient_copies_agree():
    """The constants of ckernels/erf_vec.h and of the Numba twin are the same doubles."""
    header = (Path(__file__).resolve().parents[1] / "ckernels" / "erf_vec.h").read_text(encoding="utf-8")
    defs = dict(re.findall(r"^#define (\w+) (\S+)", header, re.M))
    ne = _numba_elementwise
    for stem, values in (("ERF_P", ne._ERF_P), ("EXP_E", ne._EXP_E), ("ERF_R", ne._ERF_R)):
        c_values = [float.fromhex(defs[f"{stem}{j}"]) for j in range(len(values))]
        assert f"{stem}{len(values)}" not in defs and c_values == list(values), stem
    for name in ("LN2_HI", "LN2_LO", "INV_LN2"):
        assert float.fromhex(defs[name]) == getattr(ne, f"_{name}"), name
    for name in ("ERF_A", "ERF_XMAX", "ERF_X0", "ERF_SHIFT"):
        assert float(defs[name]) == getattr(ne, f"_{name}"), name


@pytest.mark.parametrize("name", ACCEL)
def test_plain_libm_version_agrees_within_bound(name):
    """The plain version (libm's scalar erf) beside the vectorised one: both within gelu_bound of the
    definition and of each other; the same special values."""
    if not backend_available(name, "gelu"):
        return
    mod = _c_elementwise if name == "c" else _numba_elementwise
    rng = np.random.default_rng(19)
    x = np.concatenate([rng.standard_normal(5000) * 4, sweep_points()[::5] * math.sqrt(2.0)])
    plain, fast = mod.gelu_libm(x), mod.gelu(x)
    bound = layers.gelu_bound(x)
    agree_float64(fast, plain, bound, f"gelu[{name}] vector vs libm")
    agree_float64(plain, definition(x), bound, f"gelu[{name}] libm vs definition")
    specials = np.array([s[0] for s in SPECIALS])
    with np.errstate(all="ignore"):
        same_bits_or_nan(mod.gelu_libm(specials), definition(specials))


def test_erf_and_plain_wrappers_refuse_bad_input():
    if backend_available("c", "gelu"):
        with pytest.raises(ValueError, match="impl"):
            _c_elementwise.erf(np.ones(3), "fast")
        with pytest.raises(TypeError, match="float64"):
            _c_elementwise.erf(np.ones(3, np.float32))
        with pytest.raises(ValueError, match="non-empty"):
            _c_elementwise.erf(np.ones(0))
        with pytest.raises(ValueError, match="threads"):
            _c_elementwise.gelu_libm(np.ones(3), threads=0)
        lib, ffi = backends._c._load().lib, backends._c._load().ffi
        x = np.ones(4)
        out = np.full(4, 7.0)
        px, po = ffi.from_buffer("double[]", x), ffi.from_buffer("double[]", out, require_writable=True)
        assert lib.refimpl_gelu_f64(po, px, 4, 3, 1) != 0          # an unknown form
        assert lib.refimpl_erf_f64(po, px, 4, 2) != 0              # an unknown impl
        assert lib.refimpl_erf_f64(po, px, 0, 0) != 0              # an empty array
        assert (out == 7.0).all()                                  # refused: nothing written
    if backend_available("numba", "gelu"):
        with pytest.raises(TypeError, match="float64"):
            _numba_elementwise.erf(np.ones(3, np.float32))
        with pytest.raises(ValueError, match="threads"):
            _numba_elementwise.gelu_libm(np.ones(3), threads=0)
