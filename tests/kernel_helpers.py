"""Shared helpers of the C kernel tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

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
