"""The range scan of the C wrappers (ckernels/scan.c; refimpl.backends._c.range_stats) and the range tests built
on it (_outside_band, _below_band, _c_linear.elu1_underflows).

The scan answers three order statistics of a float64 array, (max |x|, min |x| over the nonzero entries, min x),
NaN entries taking no part.  Each is one of the entries or its magnitude, so the vector loop, its plain scalar
version and the NumPy twin ``range_stats_numpy`` (the specification) must agree bit for bit on every array:
signed zeros, subnormals, +-Inf, NaN anywhere (also in every lane of the vector loop and in its tail), empty.
The range tests then decide exactly by the documented thresholds 2^B and 2^-B (B =
config.RANGE_RESCALE_EXPONENT).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from refimpl import config
from refimpl.backends import _c, _c_linear, _c_plain
from tests.kernel_helpers import backend_available

SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, -5e-324, 2.0 ** -1022, 1.0, -1.0, 2.0 ** 300, -(2.0 ** -300)]


def needs_c() -> bool:
    """Whether the compiled module is there (its absence fails under REFIMPL_REQUIRE_BACKENDS=1)."""
    return backend_available("c")


def _bits(stats: tuple[float, float, float]) -> tuple:
    """The statistics as bits, except a zero minimum as the value 0: min x of entries 0 and -0 is either (the
    order of comparisons picks it; nothing reads the sign)."""
    return (*(int(np.float64(s).view(np.uint64)) for s in stats[:2]),
            0.0 if stats[2] == 0 else int(np.float64(stats[2]).view(np.uint64)))


def _arrays() -> st.SearchStrategy:
    entries = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(SPECIAL))
    return hnp.arrays(np.float64, st.integers(0, 37), elements=entries)


@settings(max_examples=300)
@given(_arrays())
def test_scan_vector_and_plain_equal_the_numpy_twin_bit_for_bit(x):
    """C vector loop == plain scalar loop == range_stats_numpy, as bits, for any entries and any length 0-37
    (every position of a NaN or Inf relative to the 8-entry vector step and its tail)."""
    want = _c.range_stats_numpy(x)
    if not needs_c():
        return
    assert _bits(_c.range_stats(x)) == _bits(want), (x, _c.range_stats(x), want)
    assert _bits(_c_plain.range_stats(x)) == _bits(want)


def test_a_nan_after_the_extreme_entry_changes_nothing():
    """Every placement of an extreme entry and a later (or earlier) NaN in a 19-entry array (so in the same
    vector lane, in other lanes and in the tail): a NaN must not replace what a lane has gathered so far."""
    if not needs_c():
        return
    for i in range(19):
        for j in range(19):
            if i == j:
                continue
            for value in (7.0, -7.0, 2.0 ** -1070):
                x = np.full(19, 0.5)
                x[i], x[j] = value, np.nan
                want = _c.range_stats_numpy(x)
                assert _bits(_c.range_stats(x)) == _bits(want), (i, j, value)
                assert _bits(_c_plain.range_stats(x)) == _bits(want), (i, j, value)


def test_scan_statistics_are_the_documented_ones():
    """The twin's values on hand-made arrays: NaN ignored, -0 and 0 have no part in the nonzero minimum,
    an all-NaN or empty array gives (0, Inf, Inf), and Inf counts."""
    nan, inf = np.nan, np.inf
    cases = [(np.array([]), (0.0, inf, inf)),
             (np.array([nan, nan]), (0.0, inf, inf)),
             (np.array([-0.0, 0.0]), (0.0, inf, 0.0)),
             (np.array([3.0, nan, -5.0, 5e-324]), (5.0, 5e-324, -5.0)),
             (np.array([1.0, -inf]), (inf, 1.0, -inf))]
    for x, want in cases:
        assert _c.range_stats_numpy(x) == want, x
        if needs_c():
            assert _c.range_stats(x) == want, x


def test_scan_of_a_long_array_finds_an_entry_anywhere():
    """A single extreme entry at each of several positions of a 100 003-entry array (vector body, lane
    boundaries, the last entry) is what the scan reports."""
    if not needs_c():
        return
    for pos in (0, 1, 7, 8, 50_000, 99_995, 100_002):
        x = np.ones(100_003)
        x[pos] = -(2.0 ** 400)
        assert _c.range_stats(x) == (2.0 ** 400, 1.0, -(2.0 ** 400))
        x[pos] = 2.0 ** -1070
        assert _c.range_stats(x) == (1.0, 2.0 ** -1070, 2.0 ** -1070)


def test_scan_takes_non_contiguous_arrays_through_the_twin_and_the_plain_one_refuses_them():
    """range_stats of a strided view is the twin's (no C call on a buffer it cannot walk); the plain wrapper
    refuses a non-contiguous or non-float64 array, naming 'a'."""
    x = np.arange(-10.0, 10.0).reshape(4, 5)[:, ::2]
    assert _c.range_stats(x) == _c.range_stats_numpy(x) == (10.0, 1.0, -10.0)
    if not needs_c():
        return
    with pytest.raises(ValueError, match="'a'"):
        _c_plain.range_stats(x)
    with pytest.raises(TypeError, match="'a'"):
        _c_plain.range_stats(np.ones(3, dtype=np.float32))


def test_range_tests_decide_exactly_at_their_thresholds():
    """_outside_band flags max |x| > 2^B (and Inf), not 2^B itself, nor NaN, nor float32; _below_band a
    nonzero entry below 2^-B, not 2^-B; elu1_underflows a minimum below log(e 2^-1022)."""
    b = config.RANGE_RESCALE_EXPONENT
    top, edge = 2.0 ** b, 2.0 ** -b
    assert not _c._outside_band(np.array([top, -top, np.nan]), None, np.ones(2, dtype=np.float32))
    assert _c._outside_band(np.array([1.0]), np.array([0.0, -np.nextafter(top, np.inf)]))
    assert _c._outside_band(np.array([np.inf]))
    assert not _c._below_band(np.array([edge, 0.0, -0.0, np.nan]))
    assert _c._below_band(np.array([1.0, np.nextafter(edge, 0.0)]))
    q = np.zeros((1, 1, 2, 2))
    assert not _c_linear.elu1_underflows(q, q, None, "elu1")
    low = q.copy()
    low[0, 0, 1, 1] = _c_linear._EXP_TINY - 1.0
    assert _c_linear.elu1_underflows(low, q, None, "elu1")
    assert _c_linear.elu1_underflows(q, q, np.array([1.0, 0.0]), "elu1")      # log 0 = -Inf
    assert not _c_linear.elu1_underflows(low, q, None, "relu")


def test_run_kernel_scans_each_array_once():
    """run_kernel scans each distinct array once for the three range tests (q, k, v appear in both ``band`` and
    ``tiny``; the ELU + 1 test reads q and k again)."""
    if not needs_c():
        return
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 4)) for _ in range(3))
    calls: list[int] = []
    real = _c.range_stats

    def counting(a):
        calls.append(id(a))
        return real(a)

    _c.range_stats, saved = counting, _c.range_stats
    try:
        _c_linear.linear_attention(q, k, v, "elu1")
    finally:
        _c.range_stats = saved
    assert len(calls) == len(set(calls)) == 3, calls
