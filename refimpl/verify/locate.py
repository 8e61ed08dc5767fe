"""Locating a reference stage's tensor among the tensors a foreign forward computed, whatever their layout.

Layer: the verify tool (NumPy only).  A port splits heads as it likes: (B, h, N, d), (B, N, h, d), (B h, N, d),
(B, N, C) with the heads merged, transposed for a contraction...  :func:`locate` tries each recorded tensor of
the right size in every axis order, read either as the reference's layout or as merged heads, and keeps the
layout closest to the teacher-forced reference value (relative Frobenius distance).  It only finds the tensor;
the verdict then judges it (config.VERIFY_LOCATE_GATE).
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import numpy as np

__all__ = ["layouts", "locate"]

#: tensors with more axes are not permuted (5! = 120 orders at most)
_MAX_PERMUTED_AXES = 5


def layouts(f: np.ndarray, shape: Sequence[int]) -> Iterator[tuple[np.ndarray, str]]:
    """``f`` read in the reference ``shape``: every order of its axes, then a reshape to ``shape``; for a 4-axis
    (B, h, N, d) reference also as merged heads (B, N, h, d) moved to (B, h, N, d)."""
    shape = tuple(int(s) for s in shape)
    if f.size != math.prod(shape):
        return
    perms = itertools.permutations(range(f.ndim)) if f.ndim <= _MAX_PERMUTED_AXES else [tuple(range(f.ndim))]
    for perm in perms:
        g = f.transpose(perm) if perm != tuple(range(f.ndim)) else f
        how = "" if perm == tuple(range(f.ndim)) else f"axes {perm}, "
        yield g.reshape(shape), how + f"read as {shape}"
        if len(shape) == 4:
            b, h, n, d = shape
            yield g.reshape(b, n, h, d).transpose(0, 2, 1, 3), how + f"heads split from ({b}, {n}, {h}x{d})"


def _rel(a: np.ndarray, r: np.ndarray, nr: float) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        d = float(np.sqrt(np.sum((a - r) ** 2)))
    return d / nr if nr > 0 else (0.0 if d == 0 else math.inf)


def locate(pool: Sequence[tuple[str, np.ndarray]], ref: np.ndarray) -> tuple[np.ndarray, str, float] | None:
    """The (tensor in the reference's layout, "label: layout", relative distance) of the recorded tensor
    closest to ``ref``; None when no recorded tensor has ``ref``'s size.  A cheap invariant (the sum of squares,
    which no layout changes) skips tensors far from it first."""
    nr = float(np.sqrt(np.sum(ref ** 2)))
    best: tuple[np.ndarray, str, float] | None = None
    for label, f in pool:
        if f.size != ref.size:
            continue
        nf = float(np.sqrt(np.sum(f ** 2)))
        if best is not None and abs(nf - nr) > best[2] * nr:      # no layout can be closer than this
            continue
        for arr, how in layouts(f, ref.shape):
            d = _rel(arr, ref, nr)
            if best is None or d < best[2]:
                best = (arr, f"{label}: {how}", d)
                if d == 0.0:
                    return best
    return best
