"""The C LiSA core (operation ``lisa_fft_core`` on the "c" backend) against its NumPy definition.

refimpl.backends._c_lisa.lisa_fft_core computes Ga = Kb (*) Wa, Gb = V (*) Wb with scipy.fft's transforms on
token-last rows and the C spectral products and contraction of ckernels/lisa.c; lisa_fft_core_plain runs the
same steps with the plain scalar versions (ckernels/lisa_plain.c), the specification.  Checked (float64, the C
kernels' precision): lisa_core under use("c") within lisa_core_bound of the definition on the draws of
tests/test_kernels_lisa.py (1-3 axis grids, one token, c = 1, D = 1, D > c, circular and exact_toeplitz with
padded lengths of both parities); the kernel's S within the S-stage bound and Y within lisa_core_bound; the
fast kernels bit for bit the plain ones, and 1, 2 and 3 threads bit for bit; the spectral product bit for bit
the textbook complex product and within two roundings of NumPy's ``xf * kf``; float32 calls left to the definition (bitwise); bad arguments refused by name, and the C
side's own status checks; dispatch.  The plain path is what .ci/run's sanitizer run exercises (this file is one
of tests/test_kernels_*.py).
"""

from __future__ import annotations

import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given

from refimpl import backends, config, numerics
from refimpl.attention import lisa, lisa_cores
from refimpl.backends import _c, _c_lisa
from tests.kernel_helpers import backend_available
from tests.test_kernels_lisa import NET_14, ONE_TOKEN, VIDEO_EXACT, _kernel_args, _s_bound, _small, core_cases, core_inputs


def _have_c() -> bool:
    return backend_available("c", "lisa_fft_core")


@given(case=core_cases())
@example(case=NET_14)
@example(case=ONE_TOKEN)
@example(case=VIDEO_EXACT)
def test_lisa_core_on_c_agrees_with_the_definition(case):
    """lisa_core under use("c") (the C lisa_fft_core) vs lisa_core on the NumPy definition: within lisa_core_bound
    (LiSA Eq. 9-10)."""
    (q, k, v, wa, wb, ba, bb), lens = core_inputs(case, np.float64)
    grid, exact = case["grid"], case["exact"]
    kw = dict(exact_toeplitz=exact, fft_lengths=lens)
    ref = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, **kw)
    with backends.use("c"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # the fallback warning without the compiled module
        got = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, **kw)
    assert got.dtype == np.float64 and got.shape == ref.shape
    bound = lisa.lisa_core_bound(q, k, v, wa, wb, ba, bb, grid, dtype=np.float64, **kw)
    numerics.assert_close(got, ref, bound, np.float64, name="lisa_core[c]")


@given(case=core_cases())
@example(case=NET_14)
@example(case=ONE_TOKEN)
@example(case=VIDEO_EXACT)
def test_kernel_agrees_with_its_twin_and_the_plain_version(case):
    """The C kernel's (S, Y) vs the twin _lisa_fft_core_numpy on the same normalised inputs: S within the S-stage
    bound, Y within lisa_core_bound; the plain version and 1, 2 and 3 threads (parallel threshold forced to 0)
    give the kernel's bits."""
    if not _have_c():
        return
    args, (q, k, v, wa, wb, ba, bb), lens = _kernel_args(case, np.float64)
    s, y = _c_lisa.lisa_fft_core(*args, threads=1)
    sp, yp = _c_lisa.lisa_fft_core_plain(*args)
    np.testing.assert_array_equal(yp, y)
    np.testing.assert_array_equal(sp, s)
    for t in (2, 3):
        with mock.patch.object(config, "LISA_PARALLEL_MIN_WORK", 0):
            st, yt = _c_lisa.lisa_fft_core(*args, threads=t)
        np.testing.assert_array_equal(yt, y)
        np.testing.assert_array_equal(st, s)
    s_ref, y_ref = lisa_cores._lisa_fft_core_numpy(*args)
    assert s.shape == s_ref.shape and y.shape == y_ref.shape
    grid, exact = case["grid"], case["exact"]
    b_s = _s_bound(args[0], args[1], wa, ba, grid, exact, lens, np.float64)
    b_y = lisa.lisa_core_bound(args[0], args[1], args[2], wa, wb, ba, bb, grid, exact_toeplitz=exact,
                               fft_lengths=lens, dtype=np.float64)
    numerics.assert_close(s, s_ref, b_s, np.float64, name="lisa_fft_core[c] S")
    numerics.assert_close(y, y_ref, b_y, np.float64, name="lisa_fft_core[c] Y")


def test_threads_bitwise_on_a_network_size():
    """LiSANet-I-T's size (12 heads of 16 channels on 14 x 14, D = 4) above the parallel threshold: 1 and 2
    threads, and the plain version, give the same bits."""
    if not _have_c():
        return
    case = dict(grid=(14, 14), B=1, h=12, c=16, D=4, exact=False, extra=0, kind="normal", seed=5)
    args, _, _ = _kernel_args(case, np.float64)
    s1, y1 = _c_lisa.lisa_fft_core(*args, threads=1)
    s2, y2 = _c_lisa.lisa_fft_core(*args, threads=2)
    sp, yp = _c_lisa.lisa_fft_core_plain(*args)
    for a in (y2, yp):
        np.testing.assert_array_equal(a, y1)
    for a in (s2, sp):
        np.testing.assert_array_equal(a, s1)


@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("plain", [False, True], ids=["fast", "plain"])
def test_spectral_product_is_numpys_complex_product(shared, plain):
    """refimpl_lisa_spectral(_plain)_f64 is the textbook complex product (re = a p - b q, im = a q + b p, each
    operation rounded once, no FMA) bit for bit, non-finite entries included, and NumPy's ``xf[..., None, :] * kf``
    (whose loops may fuse a multiply-add) within two roundings of the terms' magnitudes."""
    if not _have_c():
        return
    rng = np.random.default_rng(3)
    m, c, d, f = 3, 4, 5, 7
    xf = rng.standard_normal((m, c, f)) + 1j * rng.standard_normal((m, c, f))
    kf = rng.standard_normal((1 if shared else c, d, f)) + 1j * rng.standard_normal((1 if shared else c, d, f))
    xf[0, 0, 0] = complex(np.inf, 1.0)
    xf[1, 1, 1] = complex(np.nan, 0.0)
    kf[0, 0, 2] = complex(1e300, -1e300)
    out = np.full((m, c, d, f), np.nan + 0j)
    _c_lisa._run("lisa_spectral", plain, 2, _c_lisa._flat(out), _c_lisa._flat(xf), _c_lisa._flat(kf), m, c, d, f,
                 shared)
    k = np.broadcast_to(kf[None], out.shape)
    x = xf[:, :, None, :]
    a, b, p, q = x.real, x.imag, k.real, k.imag
    with np.errstate(invalid="ignore", over="ignore"):
        expected = np.empty_like(out)
        expected.real = a * p - b * q               # the textbook formula, each operation rounded once
        expected.imag = a * q + b * p
        numpys = x * k
    np.testing.assert_array_equal(out.view(np.float64), expected.view(np.float64))
    # NumPy's own complex product (which may fuse a multiply-add) within a rounding of each product and the sum
    fin = np.isfinite(expected) & np.isfinite(numpys)
    u = np.finfo(np.float64).eps / 2
    for part in ("real", "imag"):
        got, ref = getattr(expected, part)[fin], getattr(numpys, part)[fin]
        mag = (np.abs(a * p) + np.abs(b * q) if part == "real" else np.abs(a * q) + np.abs(b * p))[fin]
        assert np.all(np.abs(got - ref) <= 2 * 2 * u * mag)
    np.testing.assert_array_equal(np.isfinite(expected), np.isfinite(numpys))


@pytest.mark.parametrize("name", ["lisa_spectral", "lisa_contract"])
@pytest.mark.parametrize("plain", [False, True], ids=["fast", "plain"])
def test_c_side_refuses_bad_sizes(name, plain):
    """The C entry points' own checks (ckernels/lisa_check.h): a size < 1 is REFIMPL_ERR_SIZE, a count beyond
    ptrdiff_t REFIMPL_ERR_OVERFLOW, a NULL buffer REFIMPL_ERR_NULL; the fast and plain versions alike."""
    if not _have_c():
        return
    mod = _c._load()
    ffi, lib = mod.ffi, mod.lib
    buf = np.zeros(16)
    p = ffi.from_buffer("double[]", buf, require_writable=True)
    fn = getattr(lib, f"refimpl_{name}{'_plain' if plain else ''}_f64")
    extra = () if plain else (1,)
    if name == "lisa_spectral":
        def call(ptr, *sizes):
            return fn(ptr, p, p, *sizes, 0, *extra)
    else:
        def call(ptr, *sizes):
            return fn(ptr, p, p, p, p, p, p, *sizes, *extra)
    assert call(p, 0, 1, 1, 1) == 1
    assert call(p, 1, 1, 1, -2) == 1
    assert call(p, 2 ** 40, 2 ** 20, 1, 1) == 4
    assert call(ffi.NULL, 1, 1, 1, 1) == 5
    assert call(p, 1, 1, 1, 1) == 0


def test_bad_arguments_are_refused_by_name():
    """Shapes, grid / lengths and dtype refused by the wrapper before any buffer reaches C."""
    case = dict(grid=(3, 4), B=1, h=2, c=3, D=2, exact=False, extra=0, kind="normal", seed=7)
    args, _, _ = _kernel_args(case, np.float64)
    qb, kb, v, wa, wb, ba, bb, grid, lens = args
    with pytest.raises(ValueError, match="'kb'"):
        _c_lisa.lisa_fft_core(qb, kb[:, :1], v, wa, wb, ba, bb, grid)
    with pytest.raises(ValueError, match="'grid'"):
        _c_lisa.lisa_fft_core(qb, kb, v, wa, wb, ba, bb, (3, 5))
    with pytest.raises(ValueError, match="'grid'"):
        _c_lisa.lisa_fft_core(qb, kb, v, wa, wb, ba, bb, grid, (2, 4))
    with pytest.raises(ValueError, match="'weight_a'"):
        _c_lisa.lisa_fft_core(qb, kb, v, wa[..., :1, :], wb, ba, bb, grid)
    with pytest.raises(ValueError, match="'weight_b'"):
        _c_lisa.lisa_fft_core(qb, kb, v, wa, wb[..., :1], ba, bb, grid)
    with pytest.raises(ValueError, match="'bias_b'"):
        _c_lisa.lisa_fft_core(qb, kb, v, wa, wb, ba, bb[:1], grid)
    with pytest.raises(TypeError, match="'v'"):
        _c_lisa.lisa_fft_core(qb, kb, v.astype(np.float32), wa, wb, ba, bb, grid)
    with pytest.raises(ValueError, match="'threads'"):
        _c_lisa.lisa_fft_core(*args, threads=0)


def test_float32_runs_on_the_definition_and_dispatch():
    """Under use("c"): a float64 call takes the C kernel once; a float32 call is not supported by it and runs the
    definition (bitwise what the NumPy backend gives)."""
    (q, k, v, wa, wb, ba, bb), _ = _small()
    grid = (3, 4)
    calls: list[str] = []
    fn = backends._REGISTRY["lisa_fft_core"]["c"]

    def wrapped(*a, **kw):
        calls.append("c")
        return fn(*a, **kw)
    with mock.patch.dict(backends._REGISTRY["lisa_fft_core"], {"c": wrapped}), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with backends.use("c"):
            lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid)
            assert calls == (["c"] if _c.status()[0] else [])
            calls.clear()
            a32 = [x.astype(np.float32) for x in (q, k, v, wa, wb, ba, bb)]
            with numerics.precision(np.float32):
                got = lisa.lisa_core(*a32, grid)
            assert calls == []
    with numerics.precision(np.float32):
        want = lisa.lisa_core(*a32, grid)
    np.testing.assert_array_equal(got, want)
