"""The Numba kernels against their NumPy twins, through the error model.

Operations (each registered in refimpl.backends under the same name on "numpy" and "numba"):

- ``lisa_contraction``: S = sum_c Qb A, Y = sum_d S Bv (LiSA Eq. 9); the NumPy definition is
  refimpl.attention.lisa_cores._lisa_contraction_numpy, which lisa_core dispatches through backends.call.
- ``angular_series_features``: Phi_K of Castling-ViT Eq. 8; the NumPy definition (backends.definition) is
  the body of the specification refimpl.attention.angular.angular_series_features.
- ``focused_function``: f_p of FLatten Eq. 6; the NumPy definition is refimpl.feature_maps.focused_function,
  the body of refimpl.attention.focused.focused_function.

What is checked, for float32 and float64: agreement within the error model on every Hypothesis draw
(inputs rounded to the tested dtype first; float32 also against NumPy's own float32 computation), on the
network shapes and on adversarial ones (one token, head dim 1 and above 64, D = 1 and D > c, odd sizes,
all-negative / large / near-duplicate / mixed-scale / subnormal values); NaN/Inf patterns equal to the
twin's; NaN-poisoned outputs (a kernel that writes nothing returns all NaN); out= buffers written in
place; bad arguments refused with the argument named; repeated runs bitwise identical; lisa_core
dispatches and its default (NumPy) result is unchanged.

If Numba is unavailable the tests check the fallback instead (REFIMPL_REQUIRE_BACKENDS=1 makes that a
failure), as tests/test_backends.py does.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from equivalence.strategies import generate
from refimpl import backends, config, numerics
from refimpl.attention import focused, lisa, lisa_cores
from refimpl.backends import _numba, _numba_lisa
from tests.kernel_helpers import STATUS, backend_available, registered_kernel

HAVE_NUMBA = STATUS["numba"].ok
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
OPS = ("lisa_contraction", "lisa_spectral_product", "angular_series_features", "focused_function")


def numba_kernel(op: str):
    """The registered Numba kernel of ``op`` (no fallback), or its NumPy twin where Numba is unavailable and
    REFIMPL_REQUIRE_BACKENDS is not set (tests.kernel_helpers.registered_kernel)."""
    return registered_kernel(op, "numba")


def rounded(seed: int, kind: str, shape, dtype) -> np.ndarray:
    """generate(...) rounded to ``dtype`` and returned in ``dtype``."""
    return np.asarray(generate(seed, kind, shape), dtype=dtype)


# ---------------------------------------------------------------------------------------------------
# LiSA contraction
# ---------------------------------------------------------------------------------------------------

def lisa_bounds(qb, a, bv) -> tuple[numerics.Bound, numerics.Bound]:
    """Bounds of (S, Y).  S[d] = sum_c Qb A: a dot product of length c, gamma_c on sum_c |Qb||A|.
    Y[v] = sum_d S[d] Bv[v, d] with S itself carrying gamma_c: gamma_(c + D) on the contraction of
    absolute values sum_{c,d} |Qb||A||Bv| (Higham 3.1-3.5; any summation order; the c + D roundings of
    the longest path).  The underflow term k eta_T covers products that fall into the subnormal range
    only in one stage, so the drawn values exclude the 'subnormal' kind here (a subnormal product error
    in S is multiplied by |Bv| in the second stage, which k eta_T does not cover)."""
    s_abs, y_abs = lisa_cores._lisa_contraction_numpy(np.abs(qb), np.abs(a), np.abs(bv))
    c, d = a.shape[-2], a.shape[-1]
    return (numerics.Bound(s_abs, c, f"S: dot product of length c = {c}"),
            numerics.Bound(y_abs, c + d, f"Y: two chained dot products, c + D = {c} + {d}"))


@st.composite
def lisa_cases(draw):
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    n = draw(st.one_of(st.just(1), st.integers(2, 40)))
    c = draw(st.one_of(st.just(1), st.integers(2, 12), st.integers(65, 70)))
    d = draw(st.one_of(st.just(1), st.integers(2, 16), st.just(c + 3)))
    kind = draw(st.sampled_from(("normal", "all_negative", "large", "near_duplicate", "mixed_scale")))
    return dict(shape=(b, h, n, c), D=d, kind=kind, seed=draw(st.integers(0, 2**31)))


def lisa_inputs(case, dtype):
    b, h, n, c = case["shape"]
    s = case["seed"]
    q = generate(s, case["kind"], (b, h, n, c))
    qb = numerics.l2_normalize(q, axis=-1, eps=config.LISA_L2_EPS)
    a = generate(s + 1, case["kind"], (b, h, n, c, case["D"]))
    bv = generate(s + 2, "normal", (b, h, n, c, case["D"]))
    return tuple(np.asarray(t, dtype=dtype) for t in (qb, a, bv))


LISA_NET_14 = dict(shape=(1, 3, 196, 64), D=16, kind="normal", seed=1)      # LiSANet 14x14, C = 192, h = 3
LISA_ONE_TOKEN_HEAD1 = dict(shape=(1, 1, 1, 1), D=1, kind="normal", seed=2)
LISA_WIDE = dict(shape=(2, 1, 3, 67), D=70, kind="mixed_scale", seed=3)    # c > 64, D > c


@DTYPES
@given(case=lisa_cases())
@example(case=LISA_NET_14)
@example(case=LISA_ONE_TOKEN_HEAD1)
@example(case=LISA_WIDE)
@settings(max_examples=25)  # lowered: c up to 70, D up to 73 makes each draw a few ms of reference work
def test_lisa_contraction_agrees_through_error_model(dtype, case):
    """|kernel - definition| <= bound for both S and Y (LiSA Eq. 9), float32 and float64; float32 also
    within the ensemble criterion (refimpl.verdict) of NumPy's own float32 einsum."""
    qb, a, bv = lisa_inputs(case, dtype)
    s, y = numba_kernel("lisa_contraction")(qb, a, bv)
    assert s.dtype == dtype and y.dtype == dtype and y.shape == qb.shape and s.shape == qb.shape[:-1] + a.shape[-1:]
    q64, a64, b64 = (t.astype(np.float64) for t in (qb, a, bv))
    s_ref, y_ref = lisa_cores._lisa_contraction_numpy(q64, a64, b64)
    bs, by = lisa_bounds(q64, a64, b64)
    naive = (None, None)
    if dtype == np.float32:
        naive = numerics.naive_same_precision(lisa_cores._lisa_contraction_numpy, q64, a64, b64, dtype=np.float32)
    numerics.assert_close(s, s_ref, bs, dtype, naive=naive[0], name="lisa_contraction S")
    numerics.assert_close(y, y_ref, by, dtype, naive=naive[1], name="lisa_contraction Y")


@DTYPES
def test_lisa_core_dispatches_and_default_is_unchanged(dtype):
    """lisa_core under use("numba") with taps runs the Numba spectral products and contraction (within
    lisa_core_bound of the float64 NumPy run; without taps it takes the fused lisa_fft_core, tested in
    tests/test_kernels_lisa.py); the default (NumPy) backend gives exactly the two einsums it always
    computed (bitwise)."""
    rng = np.random.default_rng(5)
    grid, c, dd = (3, 5), 4, 3
    n = 15
    q, k, v = (rng.standard_normal((1, 2, n, c)).astype(dtype) for _ in range(3))
    wa, wb = rng.standard_normal((n, c, dd)).astype(dtype), rng.standard_normal((n, dd)).astype(dtype)
    ba, bb = rng.standard_normal((c, dd)).astype(dtype), rng.standard_normal((c, dd)).astype(dtype)
    with numerics.precision(dtype):
        taps: dict = {}
        y_np = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, taps=taps)
        np.testing.assert_array_equal(taps["S"], np.einsum("bhnc,bhncd->bhnd", taps["q_bar"], taps["A"]))
        np.testing.assert_array_equal(y_np, np.einsum("bhnd,bhnvd->bhnv", taps["S"], taps["Bv"]))
        with backends.use("numba"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the fallback warning when Numba is absent
            y_nb = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, taps={})
    assert y_nb.dtype == dtype
    a64 = tuple(t.astype(np.float64) for t in (q, k, v, wa, wb, ba, bb))
    by = lisa.lisa_core_bound(*a64, grid, dtype=dtype)
    numerics.assert_close(y_nb, lisa.lisa_core(*a64, grid), by, dtype, name="lisa_core[numba] vs lisa_core[numpy]")


# ---------------------------------------------------------------------------------------------------
# LiSA spectral products (Eq. 10)
# ---------------------------------------------------------------------------------------------------

@st.composite
def spectral_cases(draw):
    m = draw(st.integers(1, 4))
    f = draw(st.one_of(st.just(1), st.integers(2, 30)))
    c = draw(st.one_of(st.just(1), st.integers(2, 8), st.integers(65, 67)))
    d = draw(st.one_of(st.just(1), st.integers(2, 16), st.just(c + 2)))
    return dict(m=m, f=f, c=c, d=d, shared=draw(st.booleans()), seed=draw(st.integers(0, 2**31)),
                kind=draw(st.sampled_from(("normal", "large", "mixed_scale", "subnormal"))))


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64], ids=["complex128", "complex64"])
@given(case=spectral_cases())
@example(case=dict(m=1, f=1, c=1, d=1, shared=False, seed=0, kind="normal"))
@example(case=dict(m=3, f=14 * 8, c=32, d=16, shared=True, seed=1, kind="normal"))   # 14x14 rfft grid, Gb
@settings(max_examples=25)  # lowered: c up to 67 and D up to 69 make some draws large
def test_lisa_spectral_product_agrees_through_error_model(dtype, case):
    """Re and Im of Xf Kf within gamma_2 of (|Re x Re k| + |Im x Im k|) and (|Re x Im k| + |Im x Re k|)
    (one complex multiplication: two products and one addition per part, Higham 3.6), against the twin in
    complex128 on the same rounded inputs; complex64 also against NumPy's complex64 product."""
    real = np.float64 if dtype == np.complex128 else np.float32
    m, f, c, d = case["m"], case["f"], case["c"], case["d"]
    kc = 1 if case["shared"] else c
    s, kind = case["seed"], case["kind"]
    xf = (generate(s, kind, (m, f, c)) + 1j * generate(s + 1, kind, (m, f, c))).astype(dtype)
    kf = (generate(s + 2, "normal", (f, kc, d)) + 1j * generate(s + 3, "normal", (f, kc, d))).astype(dtype)
    got = numba_kernel("lisa_spectral_product")(xf, kf)
    assert got.dtype == dtype and got.shape == (m, f, c, d)
    x64, k64 = xf.astype(np.complex128), kf.astype(np.complex128)
    ref = backends.definition("lisa_spectral_product")(x64, k64)
    naive = backends.definition("lisa_spectral_product")(xf, kf) if dtype == np.complex64 else None
    xr, xi = np.abs(x64.real)[..., None], np.abs(x64.imag)[..., None]
    kr, ki = np.abs(k64.real)[None], np.abs(k64.imag)[None]
    for part, scale, name in ((np.real, xr * kr + xi * ki, "Re"), (np.imag, xr * ki + xi * kr, "Im")):
        numerics.assert_close(part(got), part(ref), numerics.Bound(scale, 2, "complex product: 2 roundings"),
                              real, naive=None if naive is None else part(naive),
                              name=f"lisa_spectral_product {name}")


# ---------------------------------------------------------------------------------------------------
# Angular series features
# ---------------------------------------------------------------------------------------------------

def angular_bound(x64, order, constant, eps, policy) -> numerics.Bound:
    """Scale |Phi_K(x)| (the exact features are products, so their errors are relative), k derived per
    feature of order 2k+1: each x^_i = x_i / ||x|| carries d + 5 roundings (x / m, the square, d - 1
    additions, sqrt, the multiplication by m, the division; the clamp is exact); a product of 2K + 1 of
    them adds 2K roundings, sqrt(c_k/pi) three (c_k, / pi, sqrt) and the final multiplication one:
    k = (2K + 1)(d + 5) + 2K + 4.  First order in u (rigorous while k u << 1)."""
    d = x64.shape[-1]
    ref = backends.definition("angular_series_features")(x64, order, constant=constant, eps=eps, policy=policy)
    k = (2 * order + 1) * (d + 5) + 2 * order + 4
    return numerics.Bound(np.abs(ref), k, f"angular features: (2K+1)(d+5) + 2K + 4 = {k} (K = {order}, d = {d})")


@st.composite
def angular_cases(draw):
    d = draw(st.one_of(st.just(1), st.integers(2, 5), st.integers(65, 70)))
    order = draw(st.integers(0, 2)) if d <= 5 else 0
    lead = draw(st.sampled_from([(1,), (3,), (2, 7), (1, 2, 5)]))
    return dict(shape=lead + (d,), order=order, constant=draw(st.booleans()),
                policy=draw(st.sampled_from(("clamp", "none"))),
                kind=draw(st.sampled_from(("normal", "all_negative", "large", "near_duplicate", "subnormal",
                                           "mixed_scale"))), seed=draw(st.integers(0, 2**31)))


@DTYPES
@given(case=angular_cases())
@example(case=dict(shape=(1, 1), order=2, constant=True, policy="clamp", kind="normal", seed=0))
@example(case=dict(shape=(2, 3, 67), order=0, constant=False, policy="none", kind="mixed_scale", seed=1))
@example(case=dict(shape=(3, 196, 4), order=1, constant=True, policy="clamp", kind="normal", seed=2))
def test_angular_series_features_agree_through_error_model(dtype, case):
    """Numba Phi_K within the bound of angular.angular_series_features (Castling-ViT Eq. 8) in float64 on
    the same rounded inputs; float32 also against the NumPy float32 computation."""
    x = rounded(case["seed"], case["kind"], case["shape"], dtype)
    kw = dict(constant=case["constant"], eps=config.CASTLING_QK_NORM_EPS, policy=case["policy"])
    got = numba_kernel("angular_series_features")(x, case["order"], **kw)
    assert got.dtype == dtype
    x64 = x.astype(np.float64)
    ref = backends.definition("angular_series_features")(x64, case["order"], **kw)
    naive = None
    if dtype == np.float32:
        naive = numerics.naive_same_precision(backends.definition("angular_series_features"), x64, case["order"], dtype=np.float32,
                                              **kw)
    numerics.assert_close(got, ref, angular_bound(x64, case["order"], **kw), dtype, naive=naive,
                          name="angular_series_features")


@DTYPES
@pytest.mark.parametrize("policy", ["clamp", "none"])
def test_angular_zero_nan_and_inf_rows(dtype, policy):
    """Zero rows (clamp: 0, the constant kept; none: 0/0 = NaN), rows with a NaN (all NaN) and rows with
    an Inf give the twin's NaN/Inf pattern and values."""
    x = np.array([[0.0, 0.0, 0.0], [1.0, np.nan, 2.0], [np.inf, 1.0, 0.0], [3.0, -4.0, 0.5]], dtype=dtype)
    with np.errstate(all="ignore"):
        want = backends.definition("angular_series_features")(x.astype(np.float64), 1, policy=policy)
    got = numba_kernel("angular_series_features")(x, 1, policy=policy)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    # Finite entries: the bound of angular_bound with K = 1, d = 3: k = 3 (d + 5) + 2 + 4 = 30.
    numerics.assert_close(np.where(fin, got, 0), np.where(fin, want, 0),
                          numerics.Bound(np.abs(np.where(fin, want, 0)), 30, "K = 1, d = 3: 3(d+5) + 2 + 4"),
                          dtype, name="angular special rows")


# ---------------------------------------------------------------------------------------------------
# Focused function f_p
# ---------------------------------------------------------------------------------------------------

@st.composite
def focused_cases(draw):
    d = draw(st.one_of(st.just(1), st.integers(2, 40), st.integers(65, 70)))
    lead = draw(st.sampled_from([(1,), (5,), (2, 9), (1, 3, 4)]))
    shape = lead + (d,)
    axis = draw(st.sampled_from([-1, 0])) if len(shape) > 1 else -1
    return dict(shape=shape, axis=axis, p=draw(st.sampled_from([1.0, 1.5, 3.0, 7.5])),
                scaling=draw(st.sampled_from(["max", "max", "none"])), zero_row=draw(st.booleans()),
                kind=draw(st.sampled_from(("normal", "large", "near_duplicate", "subnormal", "mixed_scale"))),
                seed=draw(st.integers(0, 2**31)))


@DTYPES
@given(case=focused_cases())
@example(case=dict(shape=(1, 1), axis=-1, p=3.0, scaling="max", zero_row=False, kind="normal", seed=0))
@example(case=dict(shape=(3, 196, 32), axis=-1, p=3.0, scaling="max", zero_row=True, kind="normal", seed=1))
@example(case=dict(shape=(2, 67), axis=0, p=7.5, scaling="max", zero_row=False, kind="mixed_scale", seed=2))
def test_focused_function_agrees_through_error_model(dtype, case):
    """Numba f_p within focused.focused_function_bound of focused.focused_function (FLatten Eq. 6) in
    float64 on the same rounded inputs (x = |drawn|, a zero row if drawn); float32 also against NumPy's
    float32 computation.  power_scaling "none" is tested on the benign kinds only: it overflows /
    underflows by design (like the released code) and its NaN pattern is then checked equal, not its
    value."""
    kind = case["kind"] if case["scaling"] == "max" else "normal"
    x = np.abs(rounded(case["seed"], kind, case["shape"], dtype))
    if case["zero_row"]:
        np.moveaxis(x, case["axis"], -1)[(0,) * (x.ndim - 1)] = 0.0
    kw = dict(axis=case["axis"], power_scaling=case["scaling"])
    got = numba_kernel("focused_function")(x, case["p"], **kw)
    assert got.dtype == dtype and got.shape == x.shape
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = backends.definition("focused_function")(x64, case["p"], **kw)
    naive = None
    if dtype == np.float32:
        with np.errstate(all="ignore"):
            naive = numerics.naive_same_precision(backends.definition("focused_function"), x64, case["p"], dtype=np.float32, **kw)
    bound = focused.focused_function_bound(x64, case["p"], axis=case["axis"], dtype=np.dtype(dtype).name)
    if case["scaling"] == "none" and case["zero_row"]:
        # 0/0 = NaN in that row (both sides); elsewhere the bound applies.
        bound = numerics.Bound(np.where(np.isnan(ref), 0.0, bound.scale), bound.k, bound.note)
    numerics.assert_close(got, ref, bound, dtype, naive=naive, name=f"focused_function[{case['scaling']}]")


def test_focused_function_nan_propagates_and_negative_is_refused():
    """A NaN in a row makes that row NaN exactly as in the twin; negative entries raise ValueError."""
    x = np.abs(np.random.default_rng(0).standard_normal((3, 6)))
    x[1, 2] = np.nan
    with np.errstate(all="ignore"):
        want = backends.definition("focused_function")(x, 3.0)
    got = numba_kernel("focused_function")(x, 3.0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()
    with pytest.raises(ValueError, match="'x'"):
        numba_kernel("focused_function")(-x, 3.0)


# ---------------------------------------------------------------------------------------------------
# Poisoning, out=, bad input, determinism, fallback
# ---------------------------------------------------------------------------------------------------

def _small_calls(dtype=np.float64):
    rng = np.random.default_rng(1)
    qb, a, bv = rng.standard_normal((1, 2, 5, 3)), rng.standard_normal((1, 2, 5, 3, 4)), rng.standard_normal((1, 2, 5, 3, 4))
    x = rng.standard_normal((4, 3))
    return {"lisa_contraction": ((qb.astype(dtype), a.astype(dtype), bv.astype(dtype)), {}),
            "lisa_spectral_product": (((x + 1j * x[::-1])[None].astype(np.result_type(dtype, np.complex64)),
                                       (x[:, :, None] - 1j * x[:, :, None]).astype(
                                           np.result_type(dtype, np.complex64))), {}),
            "angular_series_features": ((x.astype(dtype), 1), {}),
            "focused_function": ((np.abs(x).astype(dtype), 3.0), {})}


@pytest.mark.parametrize("op", OPS)
def test_outputs_are_nan_poisoned_before_the_kernel_runs(op, monkeypatch):
    """With the compiled kernel replaced by one that writes nothing, every output (also a caller's
    zero-filled out=) comes back all NaN, so an element a kernel never writes cannot pass a comparison."""
    if not backend_available("numba", op):
        return
    monkeypatch.setattr(_numba, "_compile", lambda name, fn, sig: (lambda *args: None))
    monkeypatch.setattr(_numba_lisa, "_compile", lambda name, fn, sig: (lambda *args: None))
    args, kw = _small_calls()[op]
    res = numba_kernel(op)(*args, **kw)
    for r in (res if isinstance(res, tuple) else (res,)):
        assert np.isnan(r).all()
    out = np.zeros_like(res[1] if isinstance(res, tuple) else res)
    numba_kernel(op)(*args, out=out, **kw)
    assert np.isnan(out).all()


@pytest.mark.parametrize("op", OPS)
@DTYPES
def test_out_buffers_are_written_in_place_and_runs_are_bitwise_repeatable(op, dtype):
    """out= is written in place and returned, across repeated calls; three runs (inputs at new addresses)
    give the same bits; the default output is 64-byte aligned."""
    args, kw = _small_calls(dtype)[op]
    kern = numba_kernel(op)
    first = kern(*args, **kw)
    first_y = first[1] if isinstance(first, tuple) else first
    if HAVE_NUMBA:
        assert backends.is_aligned(first_y)
        out = backends.empty_aligned(first_y.shape, first_y.dtype)
        for _ in range(2):
            res = kern(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args], out=out, **kw)
            assert (res[1] if isinstance(res, tuple) else res) is out
        np.testing.assert_array_equal(out, first_y)
    for _ in range(2):
        again = kern(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args], **kw)
        np.testing.assert_array_equal(again[1] if isinstance(again, tuple) else again, first_y)


BAD = [
    ("lisa-int", TypeError, "'qb'", "lisa_contraction", lambda qb, a, bv: ((qb.astype(int), a, bv), {})),
    ("lisa-mixed", TypeError, "'a'", "lisa_contraction", lambda qb, a, bv: ((qb, a.astype(np.float32), bv), {})),
    ("lisa-shape-a", ValueError, "'a'", "lisa_contraction", lambda qb, a, bv: ((qb, a[..., 1:, :], bv), {})),
    ("lisa-shape-bv", ValueError, "'bv'", "lisa_contraction", lambda qb, a, bv: ((qb, a, bv[..., :2]), {})),
    ("lisa-out-shape", ValueError, "'out'", "lisa_contraction",
     lambda qb, a, bv: ((qb, a, bv), dict(out=np.zeros((1, 2, 5, 4))))),
    ("lisa-out-dtype", TypeError, "'s_out'", "lisa_contraction",
     lambda qb, a, bv: ((qb, a, bv), dict(s_out=np.zeros((1, 2, 5, 4), np.float32)))),
    ("lisa-out-strided", ValueError, "'out'", "lisa_contraction",
     lambda qb, a, bv: ((qb, a, bv), dict(out=np.zeros((1, 2, 5, 6))[..., ::2]))),
    ("lisa-out-alias", ValueError, "'out'", "lisa_contraction",
     lambda qb, a, bv: ((qb, a, bv), dict(out=qb))),
]


@pytest.mark.parametrize("case_id,exc,word,op,mutate", BAD, ids=[b[0] for b in BAD])
def test_bad_lisa_arguments_are_refused(case_id, exc, word, op, mutate):
    """Malformed calls raise TypeError/ValueError naming the argument; nothing reaches the kernel."""
    if not backend_available("numba", op):
        return
    (qb, a, bv), _ = _small_calls()[op]
    args, kw = mutate(qb, a, bv)
    with pytest.raises(exc, match=word):
        numba_kernel(op)(*args, **kw)


def test_bad_feature_arguments_are_refused():
    """angular / focused kernels refuse bad dtypes, policies, orders, p, axes and out= buffers by name."""
    if not backend_available("numba", "focused_function"):
        return
    x = np.ones((2, 3))
    ang, foc = numba_kernel("angular_series_features"), numba_kernel("focused_function")
    for call, exc, word in [
            (lambda: ang(x.astype(np.float16), 1), TypeError, "'x'"),
            (lambda: ang(x, 1, policy="add"), ValueError, "'policy'"),
            (lambda: ang(x, -1), ValueError, "order"),
            (lambda: ang(x, 1, out=np.zeros((2, 3))), ValueError, "'out'"),
            (lambda: foc(x.astype(np.int32), 3.0), TypeError, "'x'"),
            (lambda: foc(x, 0.5), ValueError, "'p'"),
            (lambda: foc(x, 3.0, axis=2), ValueError, "'axis'"),
            (lambda: foc(x, 3.0, power_scaling="min"), ValueError, "'power_scaling'"),
            (lambda: foc(x, 3.0, axis=0, out=np.zeros((2, 3))), ValueError, "'out'")]:
        with pytest.raises(exc, match=word):
            call()


@pytest.mark.parametrize("op", OPS)
def test_registered_on_numpy_and_numba(op):
    """Each operation has its NumPy twin and its Numba kernel registered; get(op, "numba") returns the
    kernel when Numba is available and otherwise falls back to the twin."""
    assert backends.kernels()[op] == ("numpy", "numba")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = backends.get(op, "numba")
    assert got is backends._REGISTRY[op]["numba" if HAVE_NUMBA else "numpy"]
