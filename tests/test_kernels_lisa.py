"""The accelerated LiSA core against its NumPy definition, through the error model.

Operation ``lisa_fft_core`` (registered in refimpl.backends on "numpy", "numba" and "c"; the C kernel's tests
are tests/test_kernels_lisa_c.py): after the L2
normalisation, Ga = Kb (*) Wa and Gb = V (*) Wb by FFT (LiSA Eq. 10; zero-padded linear convolutions with
exact_toeplitz, Eq. 9), then S = sum_c Qb (Ga + Ba) and Y = sum_d S (Gb + Bb).  The definition is
refimpl.attention.lisa_cores._lisa_fft_core_numpy (the very calls lisa_core makes); the Numba twin
refimpl.backends._numba_lisa.lisa_fft_core computes the same by packed complex FFTs (a real transform of even
length 2K as a complex one of length K plus a twiddle pass), fused spectral products and a blocked
contraction.  lisa_core takes it under any non-NumPy backend when no taps are requested; with taps it
keeps Ga, Gb and dispatches "lisa_spectral_product" and "lisa_contraction" instead.

What is checked, float32 and float64 (inputs rounded to the tested dtype, the reference in float64 on the
same inputs; float32 also against NumPy's own float32 run): lisa_core[numba] within lisa_core_bound on
1-, 2- and 3-axis grids, odd / even / non-square, one token, c = 1, D = 1, D > c, circular and
exact_toeplitz with odd and even padded lengths; the kernel's S and Y against the twin's (S through the
same running-error rules, lisa_cores._tr_conv / _tr_einsum); NaN-poisoned outputs (a kernel that writes
nothing returns all NaN, also into a caller's out=, also on 2 threads); out= / s_out= written in place;
repeated runs bitwise identical; 1, 2, 3 and 4 threads bitwise identical (every Hypothesis draw on 1 and 3
threads, plus fixed cases), worker exceptions reaching the caller, the thread rule; bad arguments refused by name; dispatch (which operation runs under which backend);
the default backend bit-identical to the definition.

Drawn values exclude the 'subnormal' kind: a product that underflows in the S stage is multiplied by |Bv|
in the Y stage, which the additive k eta_T underflow term does not cover (tests/test_kernels_numba.py
says the same of the contraction).
"""

from __future__ import annotations

import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics, toeplitz as tz
from refimpl.attention import lisa, lisa_cores
from refimpl.backends import _numba, _numba_lisa
from tests.kernel_helpers import STATUS, backend_available, registered_kernel

HAVE_NUMBA = STATUS["numba"].ok
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale")


def numba_kernel():
    """The registered Numba lisa_fft_core (its NumPy twin when Numba is unavailable and
    REFIMPL_REQUIRE_BACKENDS is not set: tests.kernel_helpers.registered_kernel)."""
    return registered_kernel("lisa_fft_core", "numba")


@st.composite
def core_cases(draw):
    """Grids of 1-3 axes (odd, even, non-square, one token), B, h, c (1, small, > D), D (1, small, c + 3),
    circular or exact_toeplitz with extra padding 0..3 (so padded lengths of both parities)."""
    r = draw(st.sampled_from((1, 2, 2, 3)))
    side = {1: 16, 2: 9, 3: 4}[r]
    grid = tuple(draw(st.one_of(st.just(1), st.integers(2, side))) for _ in range(r))
    c = draw(st.one_of(st.just(1), st.integers(2, 6)))
    d = draw(st.one_of(st.just(1), st.integers(2, 5), st.just(c + 3)))
    return dict(grid=grid, B=draw(st.integers(1, 2)), h=draw(st.integers(1, 2)), c=c, D=d,
                exact=draw(st.booleans()), extra=draw(st.integers(0, 3)),
                kind=draw(st.sampled_from(KINDS)), seed=draw(st.integers(0, 2**31)))


def core_inputs(case, dtype):
    """(q, k, v, wa, wb, ba, bb) rounded to ``dtype`` and returned in ``dtype``; fft_lengths or None."""
    grid, c, d, s = case["grid"], case["c"], case["D"], case["seed"]
    n = int(np.prod(grid))
    p = int(np.prod([2 * m - 1 for m in grid])) if case["exact"] else n
    shp = (case["B"], case["h"], n, c)
    arrs = (generate(s, case["kind"], shp), generate(s + 1, case["kind"], shp), generate(s + 2, case["kind"], shp),
            generate(s + 3, "mixed_scale", (p, c, d)) / p, generate(s + 4, "normal", (p, d)) / p,
            generate(s + 5, "normal", (c, d)), generate(s + 6, "normal", (c, d)))
    lens = tuple(2 * m - 1 + case["extra"] for m in grid) if case["exact"] else None
    return tuple(np.asarray(a, dtype=dtype) for a in arrs), lens


NET_14 = dict(grid=(14, 14), B=1, h=2, c=32, D=16, exact=False, extra=0, kind="normal", seed=1)  # LiSANet 14x14
ONE_TOKEN = dict(grid=(1, 1), B=1, h=1, c=1, D=1, exact=False, extra=0, kind="normal", seed=2)
VIDEO_EXACT = dict(grid=(2, 3, 4), B=2, h=1, c=2, D=5, exact=True, extra=1, kind="mixed_scale", seed=3)


@DTYPES
@given(case=core_cases())
@example(case=NET_14)
@example(case=ONE_TOKEN)
@example(case=VIDEO_EXACT)
def test_lisa_core_on_numba_agrees_with_the_definition(dtype, case):
    """lisa_core under use("numba") (the fused lisa_fft_core) vs lisa_core on the NumPy definition in
    float64 on the same inputs: within lisa_core_bound (LiSA Eq. 9-10; the FFT stages are charged
    config.FFT_REAL_SPLIT_STAGES for the real split that the packed transforms perform); float32 also
    against NumPy's float32 run (the ensemble criterion)."""
    (q, k, v, wa, wb, ba, bb), lens = core_inputs(case, dtype)
    grid, exact = case["grid"], case["exact"]
    kw = dict(exact_toeplitz=exact, fft_lengths=lens)
    a64 = tuple(x.astype(np.float64) for x in (q, k, v, wa, wb, ba, bb))
    ref = lisa.lisa_core(*a64, grid, **kw)
    with backends.use("numba"), numerics.precision(dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # the fallback warning when Numba is absent
        got = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, **kw)
    assert got.dtype == dtype and got.shape == ref.shape
    bound = lisa.lisa_core_bound(*a64, grid, dtype=dtype, **kw)
    naive = None
    if dtype == np.float32:
        naive = numerics.naive_same_precision(lisa.lisa_core, *a64, grid, dtype=np.float32, **kw)
    numerics.assert_close(got, ref, bound, dtype, naive=naive, name="lisa_core[numba]")


def _kernel_args(case, dtype):
    """Arguments of lisa_fft_core (normalised q, k; kernels on the FFT grid) and of the twin in float64."""
    (q, k, v, wa, wb, ba, bb), lens = core_inputs(case, dtype)
    grid = case["grid"]
    with numerics.precision(dtype):
        qb, kb = lisa_cores._l2(q, config.LISA_L2_EPS), lisa_cores._l2(k, config.LISA_L2_EPS)
    fl = lisa_cores._fft_lengths(grid, case["exact"], lens)
    wal = lisa_cores._kernel_on_lengths(wa.astype(np.float64), grid, case["exact"], fl)
    wbl = lisa_cores._kernel_on_lengths(wb.astype(np.float64), grid, case["exact"], fl)
    args = (qb, kb, v, wal.astype(dtype), wbl.astype(dtype), ba, bb, grid, None if fl == grid else fl)
    return args, (q, k, v, wa, wb, ba, bb), lens


def _s_bound(qb, kb, wa, ba, grid, exact, lens, dtype) -> numerics.Bound:
    """Bound of S = sum_c Qb (Ga + Ba) by the running-error rules of lisa_core_bound (lisa_cores._tr_conv for the
    FFT convolution, lisa_cores._tr_add for the bias, lisa_cores._tr_einsum for the sum over c); scale (B, h, N, D)."""
    ga, ega, d1 = lisa_cores._tr_conv(kb[..., None], None, wa, grid, exact_toeplitz=exact, fft_lengths=lens)
    a, ea = lisa_cores._tr_add(ga, ega, ba, None)
    s, es, d2 = lisa_cores._tr_einsum("bhnc,bhncd->bhnd", (qb, None), (a, ea))
    return lisa_cores._finish(s, es, d1 + 1 + d2, dtype, "lisa_fft_core S")


@DTYPES
@given(case=core_cases())
@example(case=NET_14)
@example(case=ONE_TOKEN)
def test_lisa_fft_core_kernel_agrees_with_its_twin(dtype, case):
    """The Numba kernel's (S, Y) vs the twin _lisa_fft_core_numpy in float64 on the same (rounded,
    normalised) inputs: S within the S-stage bound, Y within lisa_core_bound (LiSA Eq. 9-10).  The
    kernel on 1 thread and on 3 (crossover forced to 0) gives the same bits on every draw."""
    args, (q, k, v, wa, wb, ba, bb), lens = _kernel_args(case, dtype)
    if HAVE_NUMBA:
        s, y = numba_kernel()(*args, threads=1)
        with mock.patch.object(config, "LISA_PARALLEL_MIN_WORK", 0):
            s3, y3 = numba_kernel()(*args, threads=3)
        np.testing.assert_array_equal(y3, y)
        np.testing.assert_array_equal(s3, s)
    else:
        s, y = numba_kernel()(*args)
    assert s.dtype == dtype and y.dtype == dtype
    a64 = [x.astype(np.float64) if isinstance(x, np.ndarray) else x for x in args]
    s_ref, y_ref = lisa_cores._lisa_fft_core_numpy(*a64)
    grid, exact = case["grid"], case["exact"]
    qb64, kb64 = a64[0], a64[1]
    b_s = _s_bound(qb64, kb64, wa.astype(np.float64), ba.astype(np.float64), grid, exact, lens, dtype)
    b_y = lisa.lisa_core_bound(qb64, kb64, a64[2], wa.astype(np.float64), wb.astype(np.float64),
                               ba.astype(np.float64), bb.astype(np.float64), grid, exact_toeplitz=exact,
                               fft_lengths=lens, dtype=dtype)
    numerics.assert_close(s, s_ref, b_s, dtype, name="lisa_fft_core S")
    numerics.assert_close(y, y_ref, b_y, dtype, name="lisa_fft_core Y")


# ---------------------------------------------------------------------------------------------------
# Dispatch and the default backend
# ---------------------------------------------------------------------------------------------------

def _small(dtype=np.float64, grid=(3, 4), exact=False):
    case = dict(grid=grid, B=1, h=2, c=3, D=2, exact=exact, extra=1, kind="normal", seed=11)
    return core_inputs(case, dtype)


@pytest.mark.parametrize("exact", [False, True], ids=["circular", "exact_toeplitz"])
def test_default_backend_is_the_definition_bitwise(exact):
    """On the NumPy backend lisa_core is exactly what it always computed - refimpl.toeplitz's FFT
    products and the two einsums - and the twin of lisa_fft_core gives the same bits (it is the
    definition, and it does not dispatch)."""
    (q, k, v, wa, wb, ba, bb), lens = _small(exact=exact)
    grid = (3, 4)
    assert backends.current() == "numpy"
    y = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, exact_toeplitz=exact, fft_lengths=lens)
    qb, kb = lisa_cores._l2(q, config.LISA_L2_EPS), lisa_cores._l2(k, config.LISA_L2_EPS)
    kg = tuple(2 * n - 1 for n in grid) if exact else grid
    ka, kbw = wa.reshape(kg + wa.shape[1:]), wb.reshape(kg + (1, wb.shape[1]))
    xk, xv = kb.reshape((1, 2) + grid + (3, 1)), v.reshape((1, 2) + grid + (3, 1))
    if exact:
        ga, gb = tz.toeplitz_product(ka, xk, 2, "rfft", lens), tz.toeplitz_product(kbw, xv, 2, "rfft", lens)
    else:
        ga, gb = tz.circulant_product(ka, xk, 2, "rfft"), tz.circulant_product(kbw, xv, 2, "rfft")
    a, bv = ga.reshape(1, 2, 12, 3, 2) + ba, gb.reshape(1, 2, 12, 3, 2) + bb
    expected = np.einsum("bhnd,bhnvd->bhnv", np.einsum("bhnc,bhncd->bhnd", qb, a), bv)
    np.testing.assert_array_equal(y, expected)
    fl = lisa_cores._fft_lengths(grid, exact, lens)
    _, y_twin = lisa_cores._lisa_fft_core_numpy(qb, kb, v, lisa_cores._kernel_on_lengths(wa, grid, exact, fl),
                                                lisa_cores._kernel_on_lengths(wb, grid, exact, fl), ba, bb, grid,
                                                None if fl == grid else fl)
    np.testing.assert_array_equal(y_twin, y)


def _recording(monkeypatch, ops):
    calls: list[str] = []
    for op in ops:
        impls = backends._REGISTRY[op]
        for b in ("numpy", "numba", "c"):
            if b in impls:
                fn = impls[b]

                def wrapped(*a, _fn=fn, _name=f"{op}:{b}", **kw):
                    calls.append(_name)
                    return _fn(*a, **kw)
                monkeypatch.setitem(impls, b, wrapped)
    return calls


def test_dispatch_under_each_backend(monkeypatch):
    """numpy: the definition only (contraction twin); numba without taps: the fused lisa_fft_core, once;
    numba with taps: lisa_spectral_product (Ga and Gb) and lisa_contraction on Numba, and the taps hold
    Ga, Gb; transform="fft" has no accelerated spectral path (only the contraction dispatches)."""
    (q, k, v, wa, wb, ba, bb), _ = _small()
    grid = (3, 4)
    calls = _recording(monkeypatch, ("lisa_fft_core", "lisa_spectral_product", "lisa_contraction"))
    lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid)
    assert calls == ["lisa_contraction:numpy"]
    want = "numba" if HAVE_NUMBA else "numpy"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        calls.clear()
        with backends.use("numba"):
            lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid)
        assert calls == [f"lisa_fft_core:{want}"]
        calls.clear()
        taps: dict = {}
        with backends.use("numba"):
            lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, taps=taps)
        assert calls == [f"lisa_spectral_product:{want}"] * 2 + [f"lisa_contraction:{want}"]
        assert taps["G_a"].shape == taps["G_b"].shape == (1, 2, 12, 3, 2)
        calls.clear()
        with backends.use("numba"):
            lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, transform="fft")
        assert calls == [f"lisa_contraction:{want}"]
        calls.clear()
        with backends.use("auto"):
            lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid)
        assert calls and calls[0].startswith("lisa_fft_core:")


@DTYPES
def test_taps_path_on_numba_agrees_with_the_definition(dtype):
    """With taps under use("numba") (spectral products and contraction on Numba, Ga and Gb formed):
    within lisa_core_bound of the float64 definition, and its taps within the same bound's scale."""
    (q, k, v, wa, wb, ba, bb), _ = _small(dtype, grid=(5, 6))
    grid = (5, 6)
    a64 = tuple(x.astype(np.float64) for x in (q, k, v, wa, wb, ba, bb))
    ref = lisa.lisa_core(*a64, grid)
    with backends.use("numba"), numerics.precision(dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        taps: dict = {}
        got = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, taps=taps)
    assert got.dtype == dtype
    numerics.assert_close(got, ref, lisa.lisa_core_bound(*a64, grid, dtype=dtype), dtype, name="lisa_core[numba, taps]")


# ---------------------------------------------------------------------------------------------------
# Poisoning, out=, determinism, bad input
# ---------------------------------------------------------------------------------------------------

def _kernel_small(dtype=np.float64, grid=(3, 4), exact=False):
    case = dict(grid=grid, B=1, h=2, c=3, D=2, exact=exact, extra=1, kind="normal", seed=11)
    return _kernel_args(case, dtype)[0]


@pytest.mark.parametrize("grid", [(3, 4), (3, 5)], ids=["even-last", "odd-last"])
def test_outputs_are_nan_poisoned_before_the_kernel_runs(grid, monkeypatch):
    """With every compiled kernel replaced by one that writes nothing, S and Y come back all NaN, also
    into a caller's zero-filled out= and s_out=."""
    if not backend_available("numba", "lisa_fft_core"):
        return
    args = _kernel_small(grid=grid)
    monkeypatch.setattr(_numba_lisa, "_compile", lambda name, fn, sig: (lambda *a: None))
    s, y = numba_kernel()(*args)
    assert np.isnan(s).all() and np.isnan(y).all()
    out, s_out = np.zeros_like(y), np.zeros_like(s)
    numba_kernel()(*args, out=out, s_out=s_out)
    assert np.isnan(out).all() and np.isnan(s_out).all()


@DTYPES
@pytest.mark.parametrize("exact", [False, True], ids=["circular", "exact_toeplitz"])
def test_out_buffers_are_written_in_place_and_runs_are_bitwise_repeatable(dtype, exact):
    """out= and s_out= are written in place and returned; repeated runs (inputs copied to new addresses,
    scratch buffers reused) give the same bits; default outputs are 64-byte aligned."""
    args = _kernel_small(dtype, exact=exact)
    kern = numba_kernel()
    s0, y0 = kern(*args)
    if HAVE_NUMBA:
        assert backends.is_aligned(y0) and backends.is_aligned(s0)
        out, s_out = backends.empty_aligned(y0.shape, dtype), backends.empty_aligned(s0.shape, dtype)
        for _ in range(2):
            s1, y1 = kern(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args], out=out, s_out=s_out)
            assert y1 is out and s1 is s_out
        np.testing.assert_array_equal(out, y0)
        np.testing.assert_array_equal(s_out, s0)
    for _ in range(2):
        s2, y2 = kern(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args])
        np.testing.assert_array_equal(y2, y0)
        np.testing.assert_array_equal(s2, s0)


def test_inputs_are_not_modified():
    """The packed transforms work in place on scratch copies, never on the caller's arrays (c = 1 and
    D = 1 make the transposed views contiguous, the case where a copy could be skipped by mistake)."""
    case = dict(grid=(2, 4), B=1, h=1, c=1, D=1, exact=False, extra=0, kind="normal", seed=5)
    args = _kernel_args(case, np.float64)[0]
    before = [np.array(a) if isinstance(a, np.ndarray) else a for a in args]
    numba_kernel()(*args)
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


BAD = [
    ("int-qb", TypeError, "'qb'", lambda a: ((a[0].astype(int),) + a[1:], {})),
    ("mixed-v", TypeError, "'v'", lambda a: (a[:2] + (a[2].astype(np.float32),) + a[3:], {})),
    ("shape-kb", ValueError, "'kb'", lambda a: ((a[0], a[1][..., :2]) + a[2:], {})),
    ("shape-wa", ValueError, "'weight_a'", lambda a: (a[:3] + (a[3][..., :2, :],) + a[4:], {})),
    ("shape-wb", ValueError, "'weight_b'", lambda a: (a[:4] + (a[4][..., :1],) + a[5:], {})),
    ("shape-bias", ValueError, "'bias_b'", lambda a: (a[:6] + (a[6][:2],) + a[7:], {})),
    ("grid", ValueError, "'grid'", lambda a: (a[:7] + ((2, 5),) + a[8:], {})),
    ("out-shape", ValueError, "'out'", lambda a: (a, dict(out=np.zeros((1, 2, 12, 2))))),
    ("s-out-dtype", TypeError, "'s_out'", lambda a: (a, dict(s_out=np.zeros((1, 2, 12, 2), np.float32)))),
    ("out-alias", ValueError, "'out'", lambda a: (a, dict(out=a[0]))),
]


@pytest.mark.parametrize("case_id,exc,word,mutate", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_refused(case_id, exc, word, mutate):
    """Malformed calls raise TypeError/ValueError naming the argument; nothing reaches the kernels."""
    if not backend_available("numba", "lisa_fft_core"):
        return
    args, kw = mutate(_kernel_small())
    with pytest.raises(exc, match=word):
        numba_kernel()(*args, **kw)


def test_registered_on_numpy_and_numba():
    """lisa_fft_core has its NumPy definition, its Numba kernel and its C kernel (tests/test_kernels_lisa_c.py);
    get(op, "numba") returns the kernel when Numba is available and otherwise falls back to the definition."""
    assert backends.kernels()["lisa_fft_core"] == ("numpy", "numba", "c")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = backends.get("lisa_fft_core", "numba")
    assert got is backends._REGISTRY["lisa_fft_core"]["numba" if HAVE_NUMBA else "numpy"]


THREAD_CASES = [
    dict(grid=(4, 6), B=1, h=5, c=3, D=2, exact=False, extra=0, kind="normal", seed=21),    # even last: packed
    dict(grid=(3, 5), B=2, h=2, c=4, D=3, exact=False, extra=0, kind="mixed_scale", seed=22),  # odd last
    dict(grid=(3, 4), B=1, h=3, c=2, D=5, exact=True, extra=1, kind="large", seed=23),      # padded, odd L
    dict(grid=(2, 3, 4), B=3, h=1, c=3, D=2, exact=True, extra=0, kind="normal", seed=24),  # 3 axes, even L
    dict(grid=(1, 1), B=1, h=1, c=1, D=1, exact=False, extra=0, kind="normal", seed=25),    # one head, one token
]


@DTYPES
@pytest.mark.parametrize("case", THREAD_CASES, ids=["packed", "odd-last", "toeplitz-odd", "3d", "one-head"])
def test_thread_counts_give_the_same_bits(dtype, case, monkeypatch):
    """threads = 1, 2, 3, 4 give bitwise identical S and Y (each head is computed whole by one thread, the
    kernel-spectra rows are split in blocks whose transforms do not depend on their batch), and the
    multi-threaded result agrees with the twin within the S-stage bound and lisa_core_bound (LiSA
    Eq. 9-10).  config.LISA_PARALLEL_MIN_WORK = 0 forces the split on these small sizes."""
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    args, (q, k, v, wa, wb, ba, bb), lens = _kernel_args(case, dtype)
    s1, y1 = numba_kernel()(*args, **({"threads": 1} if HAVE_NUMBA else {}))
    if HAVE_NUMBA:
        for t in (2, 3, 4, 2):
            st_, yt = numba_kernel()(*args, threads=t)
            np.testing.assert_array_equal(yt, y1)
            np.testing.assert_array_equal(st_, s1)
    a64 = [x.astype(np.float64) if isinstance(x, np.ndarray) else x for x in args]
    s_ref, y_ref = lisa_cores._lisa_fft_core_numpy(*a64)
    grid, exact = case["grid"], case["exact"]
    w64 = [x.astype(np.float64) for x in (wa, wb, ba, bb)]
    b_s = _s_bound(a64[0], a64[1], w64[0], w64[2], grid, exact, lens, dtype)
    b_y = lisa.lisa_core_bound(a64[0], a64[1], a64[2], *w64, grid, exact_toeplitz=exact, fft_lengths=lens,
                               dtype=dtype)
    numerics.assert_close(s1, s_ref, b_s, dtype, name="lisa_fft_core S (threads)")
    numerics.assert_close(y1, y_ref, b_y, dtype, name="lisa_fft_core Y (threads)")


def test_lisa_core_thread_count_does_not_change_the_bits(monkeypatch):
    """lisa_core under use("numba") (default threads, the C kernels' rule capped by
    config.C_KERNEL_THREADS_MAX) returns the same bits with the cap at 1 and at 3, at the LiSANet 14 x 14
    shape (h = 2, c = 32, D = 16) with the default crossover config.LISA_PARALLEL_MIN_WORK."""
    (q, k, v, wa, wb, ba, bb), _ = core_inputs(NET_14, np.float64)
    got = []
    for cap in (1, 3):
        monkeypatch.setattr(config, "C_KERNEL_THREADS_MAX", cap)
        with backends.use("numba"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got.append(lisa.lisa_core(q, k, v, wa, wb, ba, bb, (14, 14)))
    np.testing.assert_array_equal(got[1], got[0])


def test_thread_rule_and_bad_threads():
    """lisa_threads: at most one thread per head, one below config.LISA_PARALLEL_MIN_WORK, None = the C
    kernels' default; threads that are not integers >= 1 are refused by name."""
    if not backend_available("numba", "lisa_fft_core"):
        return
    big = max(config.LISA_PARALLEL_MIN_WORK, 1)
    assert _numba.lisa_threads(4, 2, big) == 2
    assert _numba.lisa_threads(2, 6, big) == 2
    assert _numba.lisa_threads(3, 1, big) == 1
    from refimpl.backends._c import default_threads
    assert _numba.lisa_threads(None, 64, big) == min(64, default_threads())
    if config.LISA_PARALLEL_MIN_WORK > 0:
        assert _numba.lisa_threads(2, 2, config.LISA_PARALLEL_MIN_WORK - 1) == 1
    args = _kernel_small()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="'threads'"):
            numba_kernel()(*args, threads=bad)


def test_threaded_outputs_are_nan_poisoned(monkeypatch):
    """With threads = 2 and every compiled kernel replaced by one that writes nothing, S and Y come back
    all NaN (the worker threads write only through the kernels)."""
    if not backend_available("numba", "lisa_fft_core"):
        return
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    args = _kernel_small()
    monkeypatch.setattr(_numba_lisa, "_compile", lambda name, fn, sig: (lambda *a: None))
    s, y = numba_kernel()(*args, threads=2)
    assert np.isnan(s).all() and np.isnan(y).all()


def test_threaded_errors_reach_the_caller_and_the_pool_survives(monkeypatch):
    """An exception raised in a unit (here by every compiled kernel) reaches the caller of a 2-thread
    call, and the next call (real kernels again) gives the 1-thread bits."""
    if not backend_available("numba", "lisa_fft_core"):
        return
    monkeypatch.setattr(config, "LISA_PARALLEL_MIN_WORK", 0)
    args = _kernel_small()
    s1, y1 = numba_kernel()(*args, threads=1)

    def failing(*a):
        raise RuntimeError("unit failed")
    with monkeypatch.context() as mp:
        mp.setattr(_numba_lisa, "_compile", lambda name, fn, sig: failing)
        with pytest.raises(RuntimeError, match="unit failed"):
            numba_kernel()(*args, threads=2)
    s2, y2 = numba_kernel()(*args, threads=2)
    np.testing.assert_array_equal(y2, y1)
    np.testing.assert_array_equal(s2, s1)
