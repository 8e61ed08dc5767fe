"""Project-wide pytest configuration for tests/ and equivalence/.

1. Hypothesis profiles: ``ci`` (the default, sized so the whole suite fits the CI budget on a 2-core
   machine) and ``thorough`` (selected with REFIMPL_HYPOTHESIS_PROFILE=thorough).
2. The assertion meta-check: every test must execute at least one assertion.  Counted are plain ``assert``
   statements that pass (pytest's ``pytest_assertion_pass`` hook), error-model comparisons
   (:func:`refimpl.numerics.compare`), ``numpy.testing.assert_*`` calls and ``pytest.raises`` blocks.  A test
   that passes with a count of zero fails with an explanation, so a test that cannot fail cannot hide.
"""

from __future__ import annotations

import os

# Single-threaded BLAS/OpenMP for the test suite, set before NumPy loads OpenBLAS: on a shared 2-core
# machine two spinning BLAS threads made a reduced Swin forward 20x slower (11.7 s vs 0.55 s measured).
# Results do not depend on it (every bound holds for any summation order); users can override it.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import functools  # noqa: E402

import numpy.testing  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

pytest_plugins = ["pytester"]  # tests/test_numerics.py runs the meta-check on a throwaway test file

settings.register_profile(
    # derandomize: CI draws the same examples every run, so a green main stays green; exploration of new
    # examples is the job of the "thorough" profile.
    "ci", max_examples=50, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile(
    "thorough", max_examples=400, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=10, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("REFIMPL_HYPOTHESIS_PROFILE", "ci"))

# ---------------------------------------------------------------------------------------------------
# Assertion meta-check
# ---------------------------------------------------------------------------------------------------

_COUNT = [0]


def _bump() -> None:
    _COUNT[0] += 1


def _counting(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _bump()
        return fn(*args, **kwargs)
    return wrapper


for _name in ("assert_array_equal", "assert_equal", "assert_array_less", "assert_allclose",
              "assert_array_max_ulp", "assert_array_almost_equal_nulp"):
    if hasattr(numpy.testing, _name) and not getattr(getattr(numpy.testing, _name), "_refimpl_counted", False):
        _w = _counting(getattr(numpy.testing, _name))
        _w._refimpl_counted = True
        setattr(numpy.testing, _name, _w)

if not getattr(pytest.raises, "_refimpl_counted", False):
    _raises = _counting(pytest.raises)
    _raises._refimpl_counted = True
    pytest.raises = _raises


def _install_compare_counter() -> None:
    from refimpl import numerics, verdict
    if not getattr(verdict.compare, "_refimpl_counted", False):
        wrapped = _counting(verdict.compare)
        wrapped._refimpl_counted = True
        verdict.compare = wrapped  # assert_close looks compare up at call time
        numerics.compare = wrapped  # the same function under its re-exported name


_install_compare_counter()


def pytest_assertion_pass(item, lineno, orig, expl):  # needs enable_assertion_pass_hook = true
    _bump()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _COUNT[0] = 0
    result = yield  # re-raises if the test failed: only passing tests are checked
    if _COUNT[0] == 0:
        raise AssertionError(
            f"{item.nodeid} finished without executing any assertion: a test that cannot fail is not a test "
            f"(meta-check in conftest.py)")
    return result
