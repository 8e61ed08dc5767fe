"""Shared helpers of the tests: backend gating (one reading of REFIMPL_REQUIRE_BACKENDS), the bound of a
comparison of two float64 computations (:func:`twice_bound`, :func:`agree_float64`), and the C kernel stand-ins.

Backend gating.  A backend that is not available here (no compiled module, no Numba) is not skipped: the
tests check the fallback instead (the NumPy twin stands in, or the dispatch path is what is tested), and
with REFIMPL_REQUIRE_BACKENDS=1 (CI, where every backend is built) an unavailable backend fails the test.
:func:`backend_available` is that rule; :func:`registered_kernel` and :func:`accelerated_backend_params` are
built on it.  Tests read :data:`STATUS` and :data:`REQUIRE_BACKENDS` only through this module.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Callable, Iterator

import numpy as np
import pytest

from refimpl import backends, numerics, verdict
from refimpl.backends import _c

#: REFIMPL_REQUIRE_BACKENDS=1 makes an unavailable accelerated backend a test failure instead of a fallback.
REQUIRE_BACKENDS: bool = os.environ.get("REFIMPL_REQUIRE_BACKENDS", "") == "1"
#: backends.available() as this test session found it: {"numpy" | "numba" | "c": Status(ok, reason)}.
STATUS = backends.available()
#: The accelerated backends.
ACCELERATED = ("c", "numba")


def backend_available(name: str, op: str | None = None) -> bool:
    """Whether backend ``name`` ("c", "numba"; "numpy" always) is available in this session.

    When it is not: under REFIMPL_REQUIRE_BACKENDS=1 the calling test fails (pytest.fail, with available()'s
    reason); otherwise the answer is False, after checking, when ``op`` is given, that ``op`` is registered
    both on ``name`` (the registry lists a kernel even where it cannot load) and on "numpy" (the twin the
    caller then tests instead).  Never skips."""
    if name == "numpy" or STATUS[name].ok:
        return True
    if REQUIRE_BACKENDS:
        pytest.fail(f"REFIMPL_REQUIRE_BACKENDS=1 but the {name!r} backend is unavailable: {STATUS[name].reason}")
    if op is not None:
        registered = backends.kernels()[op]
        assert name in registered and "numpy" in registered, (op, registered)
    return False


def registered_kernel(op: str, name: str) -> Callable:
    """The implementation of ``op`` registered on backend ``name`` (no dispatch, no fallback warning); when
    ``name`` is unavailable here (allowed: :func:`backend_available`), the NumPy twin registered for ``op``."""
    return backends._REGISTRY[op][name if backend_available(name, op) else "numpy"]


def available_backends() -> tuple[str, ...]:
    """"numpy" and every accelerated backend available here, in available()'s order; under
    REFIMPL_REQUIRE_BACKENDS=1 an unavailable one fails the calling test (:func:`backend_available`).  Call it
    inside a test, not at import."""
    return tuple(name for name in STATUS if backend_available(name))


def _short(reason: str) -> str:
    """A reason reduced to characters that read well in a test id."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", reason)[:80].strip("-")


def backend_status_id(name: str) -> str:
    """A test id naming backend ``name`` and, when it is unavailable, why ("c-unavailable:no-compiler...")."""
    return f"{name}-{'available' if STATUS[name].ok else 'unavailable:' + _short(STATUS[name].reason)}"


def accelerated_backend_params() -> list:
    """pytest params of the accelerated backends an agreement test runs on: the available ones, plus (under
    REFIMPL_REQUIRE_BACKENDS=1) the unavailable ones, which then fail in :func:`backend_available`.  Never
    empty: with none available the NumPy backend stands in (the tests then check the dispatch path itself)
    and the id says so."""
    params = [pytest.param(name, id=name) for name in ACCELERATED if STATUS[name].ok or REQUIRE_BACKENDS]
    if not params:
        params = [pytest.param("numpy", id="numpy-standing-in:no-accelerated-backend-available")]
    return params


def twice_bound(b: numerics.Bound, why: str = "both sides computed in float64") -> numerics.Bound:
    """The bound for comparing two float64 computations of the same value, each within ``b`` of it:
    the scale doubled (triangle inequality), k kept.

    With dtype "float64", ``Bound.array`` is (gamma_k(u) + gamma_k(u)) 2S + k (eta_64 + eta_64), with
    eta_64 = underflow_eta("float64") = 2^-1074, the smallest subnormal (twice Higham's per-rounding 2^-1075,
    eq. 2.8): it covers two evaluations of k roundings each, subnormal results included, with nothing added.
    (Two of five former copies also added 2^-1074 / u to the scale, when underflow_eta("float64") was 0.0;
    it is not, so that term only loosened the bound: tests/test_kernel_helpers.py pins the difference.)

    The result is a composite, deterministic bound: ``accumulation`` and ``ref_depth`` are not carried over
    (the doubling is a worst-case argument, and float64 has no mixed-precision depth), as in every former copy."""
    return numerics.Bound(2.0 * np.asarray(b.scale), b.k, f"2 x ({b.note}): {why}")


def agree_float64(actual, reference, bound: numerics.Bound, name: str) -> None:
    """Two float64 evaluations of the same definition agree within ``bound`` (and their NaN/Inf patterns
    agree).  The verdict's ensemble criterion is not applied: neither side is an implementation under test
    (both are the reference), and its floor has no underflow term, so two outputs entirely in the subnormal
    range would be judged on a 1-ulp floor."""
    report = numerics.compare(actual, reference, bound, "float64", name=name)
    assert report.pattern_ok and report.within_bound, str(report)


@contextlib.contextmanager
def c_kernel_that_writes_nothing(symbol: str) -> Iterator[list]:
    """Replace the compiled function ``symbol`` (e.g. "refimpl_linear_attention_f64") by one that reports
    success without writing anything, for the duration of the block.  Yields the list of its calls.

    A wrapper that NaN-poisons its output before calling the kernel then returns an all-NaN array, so an
    output slot a kernel never wrote cannot pass a comparison."""
    mod = _c._load()
    calls: list = []

    class Lib:
        def __getattr__(self, name):
            if name == symbol:
                def no_op(*args):
                    calls.append(args)
                    return 0
                return no_op
            return getattr(mod.lib, name)

    class Mod:
        ffi = mod.ffi
        lib = Lib()

    orig = _c._MODULE[0]
    _c._MODULE[0] = Mod()
    try:
        yield calls
    finally:
        _c._MODULE[0] = orig


def kernel_verdict(dtype):
    """The comparison for a kernel against its NumPy definition: in float64 the verdict must be "match"; in
    float32 the running bounds of RALA's reweighting and of window softmax reach the size of the output at some
    elements (worst-case chaining through exp and the quotient), so the verdict there can be "inconclusive":
    everything checkable (NaN/Inf patterns, the bound, the ensemble criterion against NumPy's float32 run) must
    still hold, and it is never counted as a match (refimpl.verdict.assert_no_divergence)."""
    return numerics.assert_close if np.dtype(dtype) == np.float64 else verdict.assert_no_divergence
