"""Shared helpers of the C kernel tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from refimpl import numerics, verdict
from refimpl.backends import _c


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
