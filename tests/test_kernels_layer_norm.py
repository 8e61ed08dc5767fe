"""LayerNorm on the C backend (operation "layer_norm") against its NumPy definition,
refimpl.layers._layer_norm_definition, and the dispatch of refimpl.layers.layer_norm to it.

The kernels (ckernels/layernorm.c, refimpl/backends/_c_elementwise.py) perform the definition's operations in its
order per row (mean, differences, mean of squares, quotient by sqrt(var + eps), scale, shift), with the two sums in
another order than NumPy's pairwise one: interleaved partial sums (fast) or the recursive order (plain).  What is
checked:

1. (Hypothesis) rows of 1-70 channels (the lanes' tails), ordinary, mixed-scale, tiny and large values, with and
   without weight / bias, eps 0 / 1e-6 / 1e-5: the fast and the plain kernel, and layers.layer_norm on the C
   backend (the kernel's bits), lie within layers.layer_norm_bound of the definition; NaN rows where it has them.
2. Against the exact value (mpmath, 50 digits): both kernels within layers.layer_norm_bound.
3. Range: an entry above 2^256, or an infinite one, in x, weight or bias gives the definition's result bit for
   bit (the fast kernel flags such rows; the plain wrapper scans); a NaN row is NaN.
4. Threads 1/2/3/5 give the same bits above the one-thread cut-off; the default backend is the definition bit
   for bit; float32 (numerics.precision) runs on the definition; the wrapper refuses bad arguments by name.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from refimpl import backends, config, layers, numerics
from refimpl.backends import _c_elementwise, _numba_elementwise
from equivalence.strategies import arrays
from tests.kernel_helpers import agree_float64, backend_available

#: Values near the kernels' band 2^256 (inside it), tiny and subnormal ones, signed zeros: planted into the rows.
SPECIAL_VALUES = (0.0, -0.0, 5e-324, -1e-310, 1e-300, 2.0 ** 255, -(2.0 ** 250), 1e30)


def definition(x, w=None, b=None, eps=1e-5):
    return backends.definition("layer_norm")(x, w, b, eps)


def kernels():
    """(name, function) of the kernels to check: the fast and the plain C one, the Numba twin (where available)."""
    out = []
    if backend_available("c", "layer_norm"):
        out += [("fast", _c_elementwise.layer_norm), ("plain", _c_elementwise.layer_norm_plain)]
    if backend_available("numba", "layer_norm"):
        out.append(("numba", _numba_elementwise.layer_norm))
    return out


def _bound(x, w, b, eps):
    return layers.layer_norm_bound(np.where(np.isfinite(x), x, 0.0), w, b, eps)


def _agree(got, ref, x, w, b, eps, name):
    """NaN rows (a NaN in x) alike, and every row whose bound is finite within it.  A row whose bound is not
    finite (eps = 0 and a variance that underflows to 0: the quotient d / sqrt(var) is 0 / 0 or d / 0 whatever
    the order of the sums) has no defined result and is not compared."""
    bound = _bound(x, w, b, eps)
    nan_rows = np.isnan(x).any(axis=-1)
    np.testing.assert_array_equal(np.isnan(got).all(axis=-1) & nan_rows, nan_rows, err_msg=f"{name}: NaN rows")
    keep = ~nan_rows[..., None] & np.all(np.isfinite(np.asarray(bound.scale)), axis=-1, keepdims=True)
    agree_float64(np.where(keep, got, 0.0), np.where(keep, ref, 0.0),
                  numerics.Bound(np.where(keep, bound.scale, 0.0), bound.k, bound.note), name)


@settings(max_examples=60)
@given(data=st.data(), n=st.integers(1, 70), rows=st.integers(1, 5), affine=st.sampled_from(["none", "w", "b", "wb"]),
       eps=st.sampled_from([0.0, 1e-6, 1e-5]), planted=st.lists(st.sampled_from(SPECIAL_VALUES), max_size=3))
@example(data=None, n=96, rows=3, affine="wb", eps=1e-5, planted=[])
def test_kernels_within_bound_of_definition(data, n, rows, affine, eps, planted):
    """Rows of every kind of equivalence.strategies (ordinary, all negative, large, near duplicates, subnormal,
    mixed scales), with up to three special values planted."""
    rng = np.random.default_rng(n * 7 + rows)
    x = rng.standard_normal((rows, n)) * 3 + 1 if data is None else data.draw(arrays((rows, n)))
    for i, v in enumerate(planted):
        x.reshape(-1)[(i * 7919) % x.size] = v
    w = rng.standard_normal(n) if "w" in affine else None
    b = rng.standard_normal(n) if "b" in affine else None
    if eps == 0.0:      # a constant row is 0 / 0 = NaN in every implementation: keep the rows varied
        x[:, 0] += 1.0
    with np.errstate(all="ignore"):
        ref = definition(x, w, b, eps)
        for name, fn in kernels():
            got = fn(x, w, b, eps)
            assert got.shape == x.shape and got.dtype == np.float64
            _agree(got, ref, x, w, b, eps, f"layer_norm[{name}]")
            if name == "fast":
                with backends.use("c"):                          # the dispatch path gives the kernel's bits
                    np.testing.assert_array_equal(layers.layer_norm(x, w, b, eps), got)


def exact_layer_norm(x: np.ndarray, w, b, eps: float) -> np.ndarray:
    """LayerNorm of each row to 50 digits (mpmath), rounded to float64."""
    out = np.empty_like(x)
    with mpmath.workdps(50):
        for r, row in enumerate(x.reshape(-1, x.shape[-1])):
            v = [mpmath.mpf(float(t)) for t in row]
            mu = mpmath.fsum(v) / len(v)
            var = mpmath.fsum((t - mu) ** 2 for t in v) / len(v)
            s = mpmath.sqrt(var + mpmath.mpf(eps))
            for i, t in enumerate(v):
                y = (t - mu) / s
                if w is not None:
                    y = y * mpmath.mpf(float(w[i]))
                if b is not None:
                    y = y + mpmath.mpf(float(b[i]))
                out.reshape(-1, x.shape[-1])[r, i] = float(y)
    return out


@settings(max_examples=20)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 40), scale=st.sampled_from([1e-200, 1e-3, 1.0, 1e5, 1e150]),
       offset=st.sampled_from([0.0, 1.0, 1e3]))
def test_kernels_within_bound_of_exact_value(seed, n, scale, offset):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, n)) + offset) * scale
    w, b = rng.standard_normal(n), rng.standard_normal(n)
    exact = exact_layer_norm(x, w, b, 1e-5)
    bound = layers.layer_norm_bound(x, w, b, 1e-5)
    for name, fn in kernels():
        agree_float64(fn(x, w, b, 1e-5), exact, bound, f"layer_norm[{name}] vs mpmath")
    agree_float64(definition(x, w, b, 1e-5), exact, bound, "layer_norm definition vs mpmath")


def test_range_outside_the_band_is_the_definition_bit_for_bit():
    """An entry above 2^256 (the kernels' band, config.RANGE_RESCALE_EXPONENT) or an infinite one, in x, weight
    or bias: the definition's result, bit for bit (there n x^2 may overflow, and how it does depends on the
    order of the sums); NaN rows NaN."""
    if not kernels():
        return
    rng = np.random.default_rng(1)
    big = 2.0 ** (config.RANGE_RESCALE_EXPONENT + 1)
    base = rng.standard_normal((70, 37))
    w, b = rng.standard_normal(37), rng.standard_normal(37)
    cases = []
    for value in (big, -1e300, np.inf, -np.inf):
        x = base.copy()
        x[5, 3] = value
        cases.append((x, w, b))
    cases.append((base, np.where(np.arange(37) == 4, big, w), b))
    cases.append((base, w, np.where(np.arange(37) == 9, -big, b)))
    for x, ww, bb in cases:
        with np.errstate(all="ignore"):
            ref = definition(x, ww, bb, 1e-5)
            for name, fn in kernels():
                np.testing.assert_array_equal(fn(x, ww, bb, 1e-5), ref, err_msg=name)
    x = base.copy()
    x[2, 2] = np.nan            # inside the band: the kernels compute; the NaN row is NaN, the others finite
    for name, fn in kernels():
        got = fn(x, w, b, 1e-5)
        assert np.isnan(got[2]).all() and np.isfinite(np.delete(got, 2, axis=0)).all(), name
        _agree(got, definition(x, w, b, 1e-5), x, w, b, 1e-5, f"layer_norm[{name}] NaN row")


def test_thread_count_changes_no_bit():
    if not kernels():
        return
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2900, 97)) * 4 + 2             # above the one-thread cut-off (262144), a partial item
    w, b = rng.standard_normal(97), rng.standard_normal(97)
    one = _c_elementwise.layer_norm(x, w, b, 1e-6, threads=1)
    for t in (2, 3, 5):
        np.testing.assert_array_equal(_c_elementwise.layer_norm(x, w, b, 1e-6, threads=t), one)
    _agree(one, definition(x, w, b, 1e-6), x, w, b, 1e-6, "layer_norm threads")
    np.testing.assert_array_equal(_c_elementwise.layer_norm(x.T.copy().T, w, b, 1e-6), one)   # any layout


def test_dispatch_registration_and_refusals():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 8))
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    assert backends.kernels()["layer_norm"][0] == "numpy" and "c" in backends.kernels()["layer_norm"]
    assert backends.current() == config.DEFAULT_BACKEND == "numpy"
    np.testing.assert_array_equal(layers.layer_norm(x, w, b, 1e-5), definition(x, w, b, 1e-5))
    ok = _c_elementwise.layer_norm_supported
    assert ok(x, w, b) and ok(x) and ok(x.transpose(1, 0, 2), None, b)
    assert not ok(x.astype(np.float32)) and not ok(np.array(1.0)) and not ok(np.ones((0, 3)))
    assert not ok(x, w.astype(np.float32)) and not ok(x.astype(">f8"))
    with backends.use("c"):
        x32 = x.astype(np.float32)
        with numerics.precision(np.float32):
            got = layers.layer_norm(x32, w.astype(np.float32), b.astype(np.float32))
        assert got.dtype == np.float32          # the definition in float32, not the kernel
        with pytest.raises(ValueError, match="argument 'weight'"):
            layers.layer_norm(x, w[:7], b)
        with pytest.raises(ValueError, match="argument 'eps'"):
            layers.layer_norm(x, w, b, float("nan"))
    if kernels():
        fn = _c_elementwise.layer_norm
        with pytest.raises(TypeError, match="float64"):
            fn(x.astype(np.float32))
        with pytest.raises(ValueError, match="argument 'weight'"):
            fn(x, w[:7])
        with pytest.raises(ValueError, match="argument 'bias'"):
            fn(x, w, b.astype(np.float32))
        for bad in (float("nan"), -1.0, float("inf"), True, "1e-5"):
            with pytest.raises(ValueError, match="argument 'eps'"):
                fn(x, w, b, bad)
        with pytest.raises(ValueError, match="threads"):
            fn(x, w, b, threads=0)
        with pytest.raises(ValueError, match="non-empty"):
            fn(np.array(1.0))


def test_numba_twin_is_the_fast_c_kernel_bit_for_bit():
    """The Numba twin performs the fast C kernel's operations in its order (the same four partial sums): the same
    bits, rows flagged above the band included (both answer with the definition)."""
    if not (backend_available("c", "layer_norm") and backend_available("numba", "layer_norm")):
        return
    rng = np.random.default_rng(9)
    for n in (1, 3, 4, 7, 96, 131):
        x = rng.standard_normal((5, n)) * 7 - 2
        w, b = rng.standard_normal(n), rng.standard_normal(n)
        for ww, bb in ((w, b), (None, b), (w, None), (None, None)):
            np.testing.assert_array_equal(_numba_elementwise.layer_norm(x, ww, bb, 1e-5),
                                          _c_elementwise.layer_norm(x, ww, bb, 1e-5))
    x[2, 0] = 2.0 ** 300
    np.testing.assert_array_equal(_numba_elementwise.layer_norm(x, w, b, 1e-5), definition(x, w, b, 1e-5))
