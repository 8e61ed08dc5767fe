"""L2 normalisation over the last axis on the C backend (operation "l2_normalize") against its NumPy definition,
refimpl.numerics.l2_normalize (axis -1), and the dispatch of refimpl.layers.l2_normalize to it (Castling-ViT's unit
rows, LiSA's Q-bar and K-bar).

The kernels (ckernels/l2norm.c, refimpl/backends/_c_elementwise.py) perform the definition's operations per row in
its order (the maximum, the scaled squares' sum, the scaled norm, the policy's denominator, the quotient), the sum
in another order than NumPy's pairwise one.  What is checked:

1. (Hypothesis) rows of 1-70 entries of every kind of equivalence.strategies with special values planted (0, -0,
   subnormals, 1e300, +-Inf, NaN), every policy, eps 0 / 1e-12 / 1e-6: the fast and the plain kernel lie within
   layers.l2_normalize_bound of the definition, with its NaN / Inf pattern exactly; the dispatch path gives the
   kernel's bits.
2. Against the exact value (mpmath, 50 digits): both kernels and the definition within the bound.
3. Threads 1/2/3/5 give the same bits above the one-thread cut-off; the default backend is the definition bit for
   bit; float32 runs on the definition; the wrapper refuses bad arguments by name.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from equivalence.strategies import arrays
from refimpl import backends, config, layers, numerics
from refimpl.backends import _c_elementwise, _numba_elementwise
from tests.kernel_helpers import agree_float64, backend_available

SPECIAL_VALUES = (0.0, -0.0, 5e-324, -1e-310, 1e-300, 1e300, -1e300, np.inf, -np.inf, np.nan)
POLICIES = ("clamp", "add", "none")


def kernels():
    """(name, function) of the kernels to check: the fast and the plain C one, the Numba twin (where available)."""
    out = []
    if backend_available("c", "l2_normalize"):
        out += [("fast", _c_elementwise.l2_normalize), ("plain", _c_elementwise.l2_normalize_plain)]
    if backend_available("numba", "l2_normalize"):
        out.append(("numba", _numba_elementwise.l2_normalize))
    return out


def _agree(got, ref, x, eps, policy, name):
    """The same NaN and Inf slots, and the finite ones within the bound."""
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), fin, err_msg=f"{name}: finite pattern")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{name}: NaN pattern")
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)], err_msg=f"{name}: Inf slots")
    b = layers.l2_normalize_bound(np.where(np.isfinite(x), x, 0.0), eps, policy)
    scale = np.where(fin, np.maximum(np.asarray(b.scale), np.abs(np.where(fin, ref, 0.0))), 0.0)
    agree_float64(np.where(fin, got, 0.0), np.where(fin, ref, 0.0), numerics.Bound(scale, b.k, b.note), name)


@settings(max_examples=60)
@given(data=st.data(), d=st.integers(1, 70), rows=st.integers(1, 4), policy=st.sampled_from(POLICIES),
       eps=st.sampled_from([0.0, 1e-12, 1e-6]), planted=st.lists(st.sampled_from(SPECIAL_VALUES), max_size=3))
def test_kernels_within_bound_of_definition(data, d, rows, policy, eps, planted):
    x = data.draw(arrays((rows, d)))
    for i, v in enumerate(planted):
        x.reshape(-1)[(i * 7919) % x.size] = v
    with np.errstate(all="ignore"):
        ref = numerics.l2_normalize(x, -1, eps, policy)
        for name, fn in kernels():
            got = fn(x, eps, policy)
            assert got.shape == x.shape and got.dtype == np.float64
            _agree(got, ref, x, eps, policy, f"l2_normalize[{name}]")
            if name == "fast":
                with backends.use("c"):
                    np.testing.assert_array_equal(layers.l2_normalize(x, eps, policy), got)


def exact(x: np.ndarray, eps: float, policy: str) -> np.ndarray:
    """x / ||x|| per row to 50 digits (mpmath), rounded to float64."""
    out = np.empty_like(x)
    with mpmath.workdps(50):
        for r, row in enumerate(x):
            v = [mpmath.mpf(float(t)) for t in row]
            n = mpmath.sqrt(mpmath.fsum(t * t for t in v))
            den = max(n, mpmath.mpf(eps)) if policy == "clamp" else n + eps if policy == "add" else n
            out[r] = [float(t / den) for t in v]
    return out


@settings(max_examples=20)
@given(seed=st.integers(0, 2 ** 32 - 1), d=st.integers(1, 40), scale=st.sampled_from([1e-300, 1e-3, 1.0, 1e200]),
       policy=st.sampled_from(POLICIES))
def test_kernels_within_bound_of_exact_value(seed, d, scale, policy):
    x = np.random.default_rng(seed).standard_normal((3, d)) * scale
    want = exact(x, 1e-12, policy)
    bound = layers.l2_normalize_bound(x, 1e-12, policy)
    for name, fn in kernels():
        agree_float64(fn(x, 1e-12, policy), want, bound, f"l2_normalize[{name}] vs mpmath")
    agree_float64(numerics.l2_normalize(x, -1, 1e-12, policy), want, bound, "definition vs mpmath")


def test_thread_count_changes_no_bit_and_layouts_are_taken():
    if not kernels():
        return
    x = np.random.default_rng(4).standard_normal((4200, 67)) * 3      # above the cut-off (262144), a partial item
    one = _c_elementwise.l2_normalize(x, 1e-12, "clamp", threads=1)
    for t in (2, 3, 5):
        np.testing.assert_array_equal(_c_elementwise.l2_normalize(x, 1e-12, "clamp", threads=t), one)
    _agree(one, numerics.l2_normalize(x, -1, 1e-12, "clamp"), x, 1e-12, "clamp", "threads")
    view = np.asfortranarray(x)
    np.testing.assert_array_equal(_c_elementwise.l2_normalize(view, 1e-12, "clamp"), one)


def test_dispatch_registration_and_refusals():
    x = np.random.default_rng(5).standard_normal((2, 3, 9))
    assert backends.kernels()["l2_normalize"][0] == "numpy" and "c" in backends.kernels()["l2_normalize"]
    assert backends.current() == config.DEFAULT_BACKEND == "numpy"
    for policy in POLICIES:
        np.testing.assert_array_equal(layers.l2_normalize(x, 1e-12, policy), numerics.l2_normalize(x, -1, 1e-12, policy))
    ok = _c_elementwise.l2_normalize_supported
    assert ok(x, 1e-12, "add") and not ok(x.astype(np.float32), 1e-12) and not ok(np.array(1.0), 1e-12)
    assert not ok(x, 1e-12, "max") and not ok(np.ones((0, 3)), 1e-12)
    with backends.use("c"):
        with numerics.precision(np.float32):
            assert layers.l2_normalize(x.astype(np.float32), 1e-12).dtype == np.float32     # the definition
        with pytest.raises(ValueError, match="argument 'policy'"):
            layers.l2_normalize(x, 1e-12, "max")
        with pytest.raises(ValueError, match="argument 'eps'"):
            layers.l2_normalize(x, float("nan"))
        with pytest.raises(ValueError, match="argument 'x'"):
            layers.l2_normalize(np.float64(2.0), 1e-12)
    if kernels():
        fn = _c_elementwise.l2_normalize
        with pytest.raises(TypeError, match="float64"):
            fn(x.astype(np.float32), 1e-12)
        for bad in (float("nan"), -1.0, float("inf"), True):
            with pytest.raises(ValueError, match="argument 'eps'"):
                fn(x, bad)
        with pytest.raises(ValueError, match="argument 'policy'"):
            fn(x, 1e-12, "max")
        with pytest.raises(ValueError, match="threads"):
            fn(x, 1e-12, threads=0)


def test_numba_twin_is_the_fast_c_kernel_bit_for_bit():
    """The Numba twin performs the fast C kernel's operations in its order: the same bits, special values included."""
    if not (backend_available("c", "l2_normalize") and backend_available("numba", "l2_normalize")):
        return
    rng = np.random.default_rng(9)
    for d in (1, 3, 4, 7, 64, 131):
        x = rng.standard_normal((6, d)) * 5
        x[1, 0], x[2, -1], x[3] = np.nan, np.inf, 0.0
        for policy in POLICIES:
            for eps in (0.0, 1e-12):
                with np.errstate(all="ignore"):
                    np.testing.assert_array_equal(_numba_elementwise.l2_normalize(x, eps, policy),
                                                  _c_elementwise.l2_normalize(x, eps, policy))
