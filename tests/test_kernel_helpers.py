"""The shared test helpers of tests/kernel_helpers.py: the backend gate and the bound of two float64 runs.

1. ``backend_available`` / ``registered_kernel`` / ``available_backends`` / ``accelerated_backend_params``
   under a faked ``available()`` (an unavailable backend falls back to the NumPy twin; with
   REFIMPL_REQUIRE_BACKENDS=1 it fails the test, never skips it).  Formerly seven files read the variable
   themselves; tests/test_range_safety.py skipped its C test and left C out of its backend loops even with
   REFIMPL_REQUIRE_BACKENDS=1.
2. ``twice_bound``: two of its five former copies (tests/test_enhanced.py, tests/test_focused.py) added
   2^-1074 / u to the doubled scale, because numerics.underflow_eta("float64") was then 0.0.  It is the
   smallest subnormal now, so the doubled bound already covers both sides' subnormal roundings; the kept
   version doubles the scale and nothing else.  Pinned here: the exact value of the bound, that it covers two
   evaluations of k roundings each (subnormal range included), and that it is smaller than the former
   eta-padded version.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import backends, numerics
from tests import kernel_helpers as kh

FAKE_DOWN = backends.Status(False, "faked: not built")


def _fake(monkeypatch, require: bool, **down) -> None:
    status = dict(kh.STATUS)
    status.update({name: FAKE_DOWN for name in down})
    monkeypatch.setattr(kh, "STATUS", status)
    monkeypatch.setattr(kh, "REQUIRE_BACKENDS", require)


# ---------------------------------------------------------------------------------------------------
# 1. The backend gate
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", kh.ACCELERATED)
def test_an_unavailable_backend_falls_back_to_the_numpy_twin(monkeypatch, name):
    """Without REFIMPL_REQUIRE_BACKENDS: False (checking that the op is registered on the backend and on
    NumPy), the NumPy twin as its kernel, and left out of the backends a test iterates over."""
    _fake(monkeypatch, False, **{name: True})
    op = {"c": "linear_attention", "numba": "lisa_fft_core"}[name]
    assert kh.backend_available(name, op) is False
    assert kh.registered_kernel(op, name) is backends._REGISTRY[op]["numpy"]
    assert name not in kh.available_backends() and "numpy" in kh.available_backends()
    assert name not in [p.values[0] for p in kh.accelerated_backend_params()]
    assert "unavailable:faked" in kh.backend_status_id(name)


@pytest.mark.parametrize("name", kh.ACCELERATED)
def test_an_unavailable_backend_fails_when_backends_are_required(monkeypatch, name):
    """With REFIMPL_REQUIRE_BACKENDS=1 every entry point fails (pytest's Failed, not Skipped), naming the
    backend and available()'s reason; the parametrisation keeps the backend so that its tests fail."""
    _fake(monkeypatch, True, **{name: True})
    for call in (lambda: kh.backend_available(name), lambda: kh.registered_kernel("depthwise_conv2d", name),
                 kh.available_backends):
        with pytest.raises(pytest.fail.Exception, match=f"'{name}' backend is unavailable: faked"):
            call()
    assert name in [p.values[0] for p in kh.accelerated_backend_params()]


def test_numpy_stands_in_when_no_accelerated_backend_is_available(monkeypatch):
    """With neither C nor Numba (and backends not required) the agreement tests run once on NumPy, and the
    test id says so."""
    _fake(monkeypatch, False, c=True, numba=True)
    (param,) = kh.accelerated_backend_params()
    assert param.values == ("numpy",) and "standing-in" in param.id
    assert kh.available_backends() == ("numpy",)


def test_available_backends_are_the_registered_kernels(monkeypatch):
    """An available backend: True, and its own registered kernel (not the twin)."""
    _fake(monkeypatch, True)
    for name in kh.ACCELERATED:
        if kh.STATUS[name].ok:
            assert kh.backend_available(name) is True
            assert kh.registered_kernel("depthwise_conv2d", name) is backends._REGISTRY["depthwise_conv2d"][name]
    assert kh.backend_available("numpy") is True


# ---------------------------------------------------------------------------------------------------
# 2. twice_bound
# ---------------------------------------------------------------------------------------------------

def test_twice_bound_doubles_the_scale_and_nothing_else():
    """Bound.array("float64") of twice_bound(b) is exactly (gamma_k(u) + gamma_k(u)) 2S + k (eta + eta),
    eta = 2^-1074: the scale doubled, k, the underflow term and the deterministic factor as they were."""
    s = np.array([0.0, 2.0 ** -1074, 1e-310, 1.0, 3e5])
    for k in (1.0, 7.0, 130.0):
        for acc in (False, True):
            b = numerics.Bound(s, k, "x", accumulation=acc)
            got = kh.twice_bound(b).array("float64", s.shape)
            g = numerics.gamma(k, numerics.unit_roundoff("float64"))
            want = (g + g) * (2.0 * s) + k * (2.0 * 2.0 ** -1074)
            np.testing.assert_array_equal(got, want)


def test_twice_bound_covers_two_evaluations_including_the_subnormal_range():
    """Each of two float64 evaluations errs by at most gamma_k(u) S + k 2^-1075 (Higham Lemma 3.1 and eq. 2.8:
    half the smallest subnormal per rounding), so they differ by at most twice that: within the kept bound,
    also where S = 0 (results entirely in the subnormal range: 2k 2^-1075 = k 2^-1074 < 2k 2^-1074)."""
    assert numerics.underflow_eta("float64") == 2.0 ** -1074     # the reason the padded copies are obsolete
    u = numerics.unit_roundoff("float64")
    s = np.array([0.0, 1e-320, 1e-300, 1.0, 1e300])
    for k in (1.0, 5.0, 64.0):
        per_side = numerics.gamma(k, u) * s + k * 2.0 ** -1075
        assert np.all(kh.twice_bound(numerics.Bound(s, k)).array("float64", s.shape) >= 2.0 * per_side)


def test_twice_bound_is_tighter_than_the_former_eta_padded_copy():
    """The former copy in test_enhanced.py / test_focused.py (2S + 2^-1074 / u) allowed about 2k 2^-1074 more
    at every element; the kept version does not (pinned: a difference of 3k 2^-1074 at S = 0 is now outside
    the bound, and was inside the padded one)."""
    k, s = 4.0, np.zeros(3)
    padded = numerics.Bound(2.0 * s + 2.0 ** -1074 / numerics.unit_roundoff("float64"), k, "former copy")
    kept = kh.twice_bound(numerics.Bound(s, k))
    diff = np.full(3, 3 * k * 2.0 ** -1074)
    assert np.all(diff > kept.array("float64", s.shape))
    assert np.all(diff <= padded.array("float64", s.shape))
    report = numerics.compare(diff, np.zeros(3), kept, "float64")
    assert not report.within_bound
