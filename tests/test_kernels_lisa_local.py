"""The Numba kernel of LiSA's local Toeplitz product (LiSA Table 3c "Local - k x k") against its NumPy definition.

Operation ``lisa_local_convolve`` (registered on "numpy" and "numba"): y[..., i, c, d] = sum_s w[s + rad, c|0, d]
x[..., i + s, c] over the k_1 x .. x k_r window with zero padding (LiSA Eq. 2, 9, Table 3c).  The definition is
refimpl.attention.lisa_local._local_convolve_numpy (the tap-by-tap loop local_convolve always ran, now reached
through refimpl.backends.call after local_convolve's argument checks); the twin is
refimpl.backends._numba_lisa_local.lisa_local_convolve (one output row at a time, every tap added in the
definition's order).

What is checked, float32 and float64 (inputs rounded to the tested dtype, the reference in float64 on the same
inputs): the kernel within the error model's bound of the product (lisa_local._tr_local_conv: gamma_T |W| * |x|
over the T = k^r taps, finished by lisa_cores._finish as lisa_local_core_bound does), float32 also against the
definition's own float32 run (the ensemble criterion), on 1-, 2- and 3-axis grids, one token, non-square grids,
windows larger than the grid, non-square windows, depth-wise and shared weights, c = 1, D = 1, leading shapes
(), (B,), (B, h); the design property on every draw: the definition's bits in the same dtype (same products,
same order) and the same bits on 1 and 3 threads; the same bits from work units that start and end anywhere
(the kernel's ring of expanded token rows, its terms four per pass); NaN / Inf in x and in the weights (an
infinite weight in a tap that meets the zero padding gives the definition's NaN at the border);
lisa_local_core under use("numba") within lisa_local_core_bound; NaN-poisoned and in-place outputs; bad input
refused through local_convolve with the definition's messages on every backend, and by the kernel itself naming
the argument; dispatch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics
from refimpl.attention import lisa_cores, lisa_local as ll
from refimpl.backends import _numba_lisa_local
from tests.kernel_helpers import STATUS, backend_available, registered_kernel

HAVE_NUMBA = STATUS["numba"].ok
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale")


def kernel():
    """The registered Numba lisa_local_convolve (the NumPy definition where Numba is unavailable and
    REFIMPL_REQUIRE_BACKENDS is not set: tests.kernel_helpers.registered_kernel)."""
    return registered_kernel("lisa_local_convolve", "numba")


@st.composite
def conv_cases(draw):
    """Grids of 1-3 axes (one token, non-square), a window per axis (odd, 1 .. 2 n + 3: larger than the grid
    included; non-square windows), leading shape (), (B,) or (B, h), c, D in 1..5, depth-wise or shared."""
    r = draw(st.sampled_from((1, 2, 2, 3)))
    side = {1: 12, 2: 7, 3: 4}[r]
    grid = tuple(draw(st.one_of(st.just(1), st.integers(2, side))) for _ in range(r))
    ks = tuple(2 * draw(st.integers(0, n + 1)) + 1 for n in grid)
    lead = draw(st.sampled_from(((), (2,), (1, 2), (2, 3))))
    return dict(grid=grid, ks=ks, lead=lead, c=draw(st.integers(1, 5)), D=draw(st.integers(1, 5)),
                shared=draw(st.booleans()), kind=draw(st.sampled_from(KINDS)), seed=draw(st.integers(0, 2**31)))


def conv_inputs(case, dtype):
    """(x, w) rounded to ``dtype`` and returned in ``dtype``."""
    n, taps = int(np.prod(case["grid"])), int(np.prod(case["ks"]))
    x = generate(case["seed"], case["kind"], case["lead"] + (n, case["c"]))
    w = generate(case["seed"] + 1, "mixed_scale", (taps, 1 if case["shared"] else case["c"], case["D"]))
    return np.asarray(x, dtype=dtype), np.asarray(w, dtype=dtype)


def conv_bound(x64, w64, grid, ks, dtype) -> numerics.Bound:
    """The error model of the product in precision ``dtype`` (lisa_local_core_bound's stage for Ga, Gb)."""
    y, err, depth = ll._tr_local_conv(x64, None, w64, grid, ks)
    return lisa_cores._finish(y, err, depth, dtype, "lisa_local_convolve")


NET_3 = dict(grid=(14, 14), ks=(3, 3), lead=(1, 3), c=16, D=16, shared=False, kind="normal", seed=1)  # LiSANet-I-T
NET_7_SHARED = dict(grid=(14, 14), ks=(7, 7), lead=(1, 2), c=16, D=16, shared=True, kind="normal", seed=2)
ONE_TOKEN_WIDE = dict(grid=(1, 1), ks=(5, 3), lead=(), c=1, D=1, shared=False, kind="normal", seed=3)
VIDEO = dict(grid=(2, 3, 4), ks=(3, 5, 9), lead=(2,), c=2, D=5, shared=False, kind="mixed_scale", seed=4)


@DTYPES
@given(case=conv_cases())
@example(case=NET_3)
@example(case=NET_7_SHARED)
@example(case=ONE_TOKEN_WIDE)
@example(case=VIDEO)
def test_kernel_agrees_with_the_definition(dtype, case):
    """The kernel in ``dtype`` vs the definition in float64 on the same inputs: within the product's error
    bound (LiSA Eq. 2, 9; float32 also against the definition's float32 run).  On every draw also the
    design property: the definition's bits in the same dtype, and the same bits on 1 and 3 threads."""
    x, w = conv_inputs(case, dtype)
    grid, ks = case["grid"], case["ks"]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = ll._local_convolve_numpy(x64, w64, grid, ks)
    if HAVE_NUMBA:
        got = kernel()(x, w, grid, ks, threads=1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
            np.testing.assert_array_equal(kernel()(x, w, grid, ks, threads=3), got)
    else:
        got = kernel()(x, w, grid, ks)
    assert got.dtype == dtype and got.shape == ref.shape
    same = ll._local_convolve_numpy(x, w, grid, ks)
    numerics.assert_close(got, ref, conv_bound(x64, w64, grid, ks, dtype), dtype,
                          naive=same if dtype == np.float32 else None, name="lisa_local_convolve[numba]")
    np.testing.assert_array_equal(got, same)


@DTYPES
@pytest.mark.parametrize("k", [3, 7])
def test_lisa_local_core_on_numba_agrees_with_the_definition(dtype, k):
    """lisa_local_core under use("numba") (both products on the kernel) vs the float64 definition: within
    lisa_local_core_bound (LiSA Eq. 9, Table 3c), on a non-square grid smaller than the 7 x 7 window."""
    grid, n, c, d = (5, 6), 30, 4, 3
    rng = np.random.default_rng(k)
    q, kk, v = (rng.standard_normal((2, 2, n, c)).astype(dtype) for _ in range(3))
    wa, wb = rng.standard_normal((k * k, c, d)).astype(dtype), rng.standard_normal((k * k, d)).astype(dtype)
    ba, bb = rng.standard_normal((c, d)).astype(dtype), rng.standard_normal((c, d)).astype(dtype)
    a64 = tuple(t.astype(np.float64) for t in (q, kk, v, wa, wb, ba, bb))
    ref = ll.lisa_local_core(*a64, grid, k)
    with backends.use("numba"), numerics.precision(dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # the fallback warning when Numba is absent
        got = ll.lisa_local_core(q, kk, v, wa, wb, ba, bb, grid, k)
    assert got.dtype == dtype
    numerics.assert_close(got, ref, ll.lisa_local_core_bound(*a64, grid, k, dtype=dtype), dtype,
                          name="lisa_local_core[numba]")


# ---------------------------------------------------------------------------------------------------
# Non-finite values: propagated as the definition does
# ---------------------------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("shared", [False, True], ids=["depthwise", "shared"])
def test_nan_and_inf_propagate_as_in_the_definition(dtype, shared):
    """NaN and +-Inf in x, and an infinite / NaN weight in a tap that meets the zero padding at the border
    (the definition adds (+0) * inf = NaN there): the kernel's output has the definition's values, NaN at
    the same places, infinities of the same sign."""
    grid, ks, c, d = (4, 5), (3, 3), 3, 2
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 20, c)).astype(dtype)
    w = rng.standard_normal((9, 1 if shared else c, d)).astype(dtype)
    x[0, 6, 1], x[0, 13, 0], x[1, 0, 2] = np.nan, np.inf, -np.inf
    w[0, 0, 1] = np.inf                      # tap (-1, -1): meets the padding on the top row and left column
    w[8, -1, 0] = np.nan                     # tap (+1, +1): bottom row and right column
    with np.errstate(invalid="ignore"):
        want = ll._local_convolve_numpy(x, w, grid, ks)
        got = kernel()(x, w, grid, ks)
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got[np.isinf(got)]), np.signbit(want[np.isinf(want)]))


def test_finite_input_gives_finite_output():
    """Finite x and weights, windows reaching far into the padding: every output finite (no NaN from the
    skipped padded taps)."""
    x = np.random.default_rng(8).standard_normal((3, 6, 2))
    w = np.random.default_rng(9).standard_normal((35, 2, 4))
    got = kernel()(x, w, (2, 3), (5, 7))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, ll._local_convolve_numpy(x, w, (2, 3), (5, 7)))


# ---------------------------------------------------------------------------------------------------
# Outputs, threads
# ---------------------------------------------------------------------------------------------------

def _small(dtype=np.float64):
    case = dict(grid=(3, 4), ks=(3, 3), lead=(2,), c=3, D=2, shared=False, kind="normal", seed=11)
    return conv_inputs(case, dtype) + ((3, 4), (3, 3))


@pytest.mark.parametrize("threads", [1, 2])
def test_outputs_are_nan_poisoned_before_the_kernel_runs(threads, monkeypatch):
    """With the compiled kernel replaced by one that writes nothing, the output is all NaN, also into a
    caller's zero-filled out= and on 2 threads."""
    if not backend_available("numba", "lisa_local_convolve"):
        return
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    x, w, g, ks = _small()
    monkeypatch.setattr(_numba_lisa_local, "_compile", lambda name, fn, sig: (lambda *a: None))
    assert np.isnan(kernel()(x, w, g, ks, threads=threads)).all()
    out = np.zeros((2, 12, 3, 2))
    kernel()(x, w, g, ks, out=out, threads=threads)
    assert np.isnan(out).all()


@DTYPES
def test_out_is_written_in_place_and_inputs_are_not_modified(dtype):
    """out= is written in place and returned, with the bits of a default call; x and w are unchanged;
    default outputs are 64-byte aligned."""
    x, w, g, ks = _small(dtype)
    before = (x.copy(), w.copy())
    y0 = kernel()(x, w, g, ks)
    if not HAVE_NUMBA:
        return
    assert backends.is_aligned(y0)
    out = backends.empty_aligned(y0.shape, dtype)
    assert kernel()(x, w, g, ks, out=out) is out
    np.testing.assert_array_equal(out, y0)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(w, before[1])


def test_threaded_errors_reach_the_caller(monkeypatch):
    """An exception raised in a worker unit reaches the caller of a 2-thread call; the next call gives the
    1-thread bits."""
    if not backend_available("numba", "lisa_local_convolve"):
        return
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    x, w, g, ks = _small()
    y1 = kernel()(x, w, g, ks, threads=1)

    def failing(*a):
        raise RuntimeError("unit failed")
    with monkeypatch.context() as mp:
        mp.setattr(_numba_lisa_local, "_compile", lambda name, fn, sig: failing)
        with pytest.raises(RuntimeError, match="unit failed"):
            kernel()(x, w, g, ks, threads=2)
    np.testing.assert_array_equal(kernel()(x, w, g, ks, threads=2), y1)


@DTYPES
@pytest.mark.parametrize("ks", [(3, 5), (3, 3), (1, 7), (5, 1), (1, 1)])
@pytest.mark.parametrize("units", [1, 5, 13])
def test_work_units_starting_anywhere_give_the_definitions_bits(dtype, ks, units, monkeypatch):
    """The kernel's bookkeeping: work units that start and end anywhere in a slice and cross slices (3
    threads, 1 to 13 units per thread), expanded token rows held in a ring shorter than the grid (9 x 11
    tokens, reach at most 3 grid lines), window terms added up to four per pass with every remainder
    (1 to 15 terms per output row), an infinite weight in a tap that meets the padding (its zero terms
    added, the definition's NaN) and a shared weight: the definition's bits everywhere."""
    if not HAVE_NUMBA:
        return
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(_numba_lisa_local, "_UNITS_PER_THREAD", units)
    grid, taps = (9, 11), ks[0] * ks[1]
    assert 2 * _numba_lisa_local._reach(grid, ks) + 1 < 99 or taps == 1
    rng = np.random.default_rng(taps + units)
    x = rng.standard_normal((3, 99, 4)).astype(dtype)
    x[1, 5, 2] = -0.0
    for w in (rng.standard_normal((taps, 4, 3)).astype(dtype), rng.standard_normal((taps, 1, 3)).astype(dtype)):
        w[0, 0, 1] = np.inf                  # tap 0: outside the grid for the first rows/columns when taps > 1
        with np.errstate(invalid="ignore"):
            want = ll._local_convolve_numpy(x, w, grid, ks)
        for threads in (1, 3):
            got = kernel()(x, w, grid, ks, threads=threads)
            np.testing.assert_array_equal(got, want)
            num = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------

_X, _W = np.ones((2, 12, 3)), np.ones((9, 3, 2))
_BUF = np.zeros((2, 12, 3, 2))
BAD_PUBLIC = [
    ("x-int", (_X.astype(int), _W, (3, 4), 3)),
    ("x-tokens", (_X[:, :10], _W, (3, 4), 3)),
    ("x-1d", (np.ones(12), _W, (3, 4), 3)),
    ("weight-taps", (_X, _W[:8], (3, 4), 3)),
    ("weight-channels", (_X, _W[:, :2], (3, 4), 3)),
    ("weight-2d", (_X, _W[:, 0], (3, 4), 3)),
    ("grid-axes", (_X, _W, (1, 3, 4, 1), 3)),
    ("grid-zero", (_X, _W, (0, 12), 3)),
    ("kernel-even", (_X, _W, (3, 4), 2)),
    ("kernel-axes", (_X, _W, (3, 4), (3,))),
    ("x-empty", (np.ones((0, 12, 3)), _W, (3, 4), 3)),
]


@pytest.mark.parametrize("args", [a for _, a in BAD_PUBLIC], ids=[i for i, _ in BAD_PUBLIC])
def test_bad_input_is_refused_with_the_definitions_message_on_every_backend(args):
    """local_convolve checks its arguments before it dispatches, so every backend refuses bad input with
    the same error, naming the argument."""
    with pytest.raises((TypeError, ValueError)) as base:
        ll.local_convolve(*args)
    name = str(base.value).split("'")[1]
    assert name in ("x", "weight", "grid", "kernel"), str(base.value)
    for b in ("numba", "auto"):
        with backends.use(b), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(type(base.value)) as other:
                ll.local_convolve(*args)
        assert str(other.value) == str(base.value)


BAD_KERNEL = [
    ("x-int", TypeError, "'x'", (_X.astype(int), _W, (3, 4), (3, 3)), {}),
    ("weight-mixed", TypeError, "'weight'", (_X, _W.astype(np.float32), (3, 4), (3, 3)), {}),
    ("x-tokens", ValueError, "'x'", (_X[:, :10], _W, (3, 4), (3, 3)), {}),
    ("weight-shape", ValueError, "'weight'", (_X, _W[:, :2], (3, 4), (3, 3)), {}),
    ("grid", ValueError, "'grid'", (_X, _W, (0, 12), (3, 3)), {}),
    ("ks-even", ValueError, "'ks'", (_X, _W, (3, 4), (3, 2)), {}),
    ("ks-axes", ValueError, "'ks'", (_X, _W, (3, 4), (9,)), {}),
    ("out-shape", ValueError, "'out'", (_X, _W, (3, 4), (3, 3)), dict(out=np.zeros((2, 12, 3)))),
    ("out-alias", ValueError, "'out'", (_BUF[..., 0], _W, (3, 4), (3, 3)), dict(out=_BUF)),
    ("threads", ValueError, "'threads'", (_X, _W, (3, 4), (3, 3)), dict(threads=0)),
]


@pytest.mark.parametrize("args,kwargs,exc,name", [(a, kw, e, n) for _, e, n, a, kw in BAD_KERNEL],
                         ids=[i for i, *_ in BAD_KERNEL])
def test_the_kernel_refuses_bad_input_naming_the_argument(args, kwargs, exc, name):
    """Called directly, the kernel checks what it is given (dtype, shapes, window, out=, threads)."""
    if not backend_available("numba", "lisa_local_convolve"):
        return
    with pytest.raises(exc, match=name):
        _numba_lisa_local.lisa_local_convolve(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------------

def test_dispatch_under_each_backend(monkeypatch):
    """numpy: the definition; numba and auto: the kernel (twice per lisa_local_core: Ga and Gb); a
    float16 call (precision float16) stays on the definition under numba (the predicate)."""
    calls: list[str] = []
    impls = backends._REGISTRY["lisa_local_convolve"]
    for b in ("numpy", "numba"):
        fn = impls[b]

        def wrapped(*a, _fn=fn, _b=b, **kw):
            calls.append(_b)
            return _fn(*a, **kw)
        monkeypatch.setitem(impls, b, wrapped)
    x, w, g, ks = _small()
    q = np.ones((1, 1, 12, 3))
    args = (q, q, q, np.ones((9, 3, 2)), np.ones((9, 2)), np.ones((3, 2)), np.ones((3, 2)), g, 3)
    ll.lisa_local_core(*args)
    assert calls == ["numpy", "numpy"]
    want = "numba" if HAVE_NUMBA else "numpy"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for b in ("numba", "auto"):
            calls.clear()
            with backends.use(b):
                ll.lisa_local_core(*args)
            assert calls == [want, want], b
        calls.clear()
        with backends.use("numba"), numerics.precision(np.float16):
            ll.local_convolve(x, w, g, ks)
        assert calls == ["numpy"]


def test_default_backend_is_the_definition_bitwise():
    """On the NumPy backend local_convolve returns exactly the definition's result (it only checks and
    dispatches), and the definition is the zero-padded tap loop."""
    x, w, g, ks = _small()
    assert backends.current() == "numpy"
    y = ll.local_convolve(x, w, g, 3)
    xp = np.pad(x.reshape(2, 3, 4, 3), [(0, 0), (1, 1), (1, 1), (0, 0)])
    want = np.zeros((2, 3, 4, 3, 2))
    for t, (u, v) in enumerate(np.ndindex(3, 3)):
        want += xp[:, u:u + 3, v:v + 4][..., None] * w[t]
    np.testing.assert_array_equal(y, want.reshape(2, 12, 3, 2))
    np.testing.assert_array_equal(ll._local_convolve_numpy(x, w, g, ks), y)


def test_neighbour_table_marks_taps_outside_the_grid():
    """The kernel's cached neighbour table: -1 exactly where the window leaves the grid (here for a 1 x 3 grid and a
    3 x 3 window, 6 of 9 taps of the middle token are outside)."""
    nbr = _numba_lisa_local._neighbours((1, 3), (3, 3))
    assert nbr.shape == (3, 9)
    np.testing.assert_array_equal(nbr[1], [-1, -1, -1, 0, 1, 2, -1, -1, -1])
