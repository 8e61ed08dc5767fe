"""Locating a reference stage's tensor among the tensors a foreign forward computed, whatever their layout.

Layer: the verify tool (NumPy; torch only inside :func:`recorder`, the op recorder both verifiers use).  A port
splits heads as it likes: (B, h, N, d), (B, N, h, d), (B h, N, d),
(B, N, C) with the heads merged, transposed for a contraction...  :func:`locate` tries each recorded tensor of
the right size in every axis order, read either as the reference's layout or as merged heads, and keeps the
layout closest to the teacher-forced reference value (relative Frobenius distance).  It only finds the tensor;
the verdict then judges it (config.VERIFY_LOCATE_GATE).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Collection, Iterator, Sequence

import numpy as np

__all__ = ["layouts", "locate", "recorder", "to_foreign"]

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


def locate(pool: Sequence[tuple[str, np.ndarray]], ref: np.ndarray, tie: float = 0.0
           ) -> tuple[np.ndarray, str, float, int] | None:
    """The (tensor in the reference's layout, "label: layout", relative distance, first position) of the
    recorded tensor closest to ``ref``; None when no recorded tensor has ``ref``'s size.  A cheap invariant (the
    sum of squares, which no layout changes) skips tensors far from it first.

    ``tie``: candidates within 2 x the best distance + ``tie`` are indistinguishable from the best by value
    (a chain of element-wise steps such as den -> den + eps gives successive tensors that differ by rounding
    only; copies and reshapes give equal ones).  Of those the one recorded last, the end of the chain, is
    taken, and the position of the first is returned: when the value first existed, the earliest point a
    later stage can have been computed from it."""
    nr = float(np.sqrt(np.sum(ref ** 2)))
    found: list[tuple[int, np.ndarray, str, float]] = []
    best = math.inf
    for pos, (label, f) in enumerate(pool):
        if f.size != ref.size:
            continue
        nf = float(np.sqrt(np.sum(f ** 2)))
        if abs(nf - nr) > (2 * best + tie) * nr:                    # no layout can be close enough
            continue
        cand = None
        for arr, how in layouts(f, ref.shape):
            d = _rel(arr, ref, nr)
            if cand is None or d < cand[3]:
                cand = (pos, arr, f"{label}: {how}", d)
        if cand is not None:
            found.append(cand)
            best = min(best, cand[3])
    if not found:
        return None
    close = [c for c in found if c[3] <= 2 * best + tie]
    pos, arr, label, d = max(close, key=lambda c: c[0])
    return arr, label, d, min(c[0] for c in close)


def to_foreign(value: np.ndarray, foreign: np.ndarray, ref: np.ndarray) -> np.ndarray | None:
    """``value``, in the reference's layout (the shape of ``ref``), in the layout of the foreign tensor
    ``foreign``: the inverse of the reading of ``foreign`` (:func:`layouts`: an axis order and a reshape, a
    permutation of the elements) closest to ``ref``; the identity when the shapes agree; None when the sizes
    differ.  Used to feed a foreign submodule the reference's own value of its input (shadow mode)."""
    if foreign.shape == value.shape:
        return value
    nr = float(np.sqrt(np.sum(ref ** 2)))
    idx = np.arange(foreign.size).reshape(foreign.shape)
    best = None
    for (arr, _how), (where, _) in zip(layouts(foreign, ref.shape), layouts(idx, ref.shape)):
        d = _rel(arr, ref, nr)
        if best is None or d < best[0]:
            best = (d, where)
    if best is None:
        return None
    out = np.empty(foreign.size, dtype=value.dtype)
    out[best[1].ravel()] = np.asarray(value).ravel()
    return out.reshape(foreign.shape)


def recorder(asked: Any, sizes: Collection[int], recorded: list, other_dtypes: dict[Any, list[str]],
             tag: Callable[[], Any] | None = None) -> Any:
    """A ``torch.overrides.TorchFunctionMode`` that records, for :func:`locate`, every floating tensor an op of
    the forward computes whose size is in ``sizes`` (appended to ``recorded`` as ``("#i op", tensor)``, or
    ``("#i op", tag(), tensor)`` with ``tag``: the unit it was computed in), and every op that computes in another
    dtype than ``asked`` (``other_dtypes``: dtype -> op names).  Torch is imported here only."""
    import torch

    class _Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args_=(), kwargs_=None):
            res = func(*args_, **(kwargs_ or {}))
            fname = getattr(func, "__name__", str(func))
            for t in (res if isinstance(res, (tuple, list)) else (res,)):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    if t.dtype != asked:
                        other_dtypes.setdefault(t.dtype, []).append(fname)
                    if t.numel() in sizes:
                        label = f"#{len(recorded)} {fname}"
                        recorded.append((label, t.detach()) if tag is None else (label, tag(), t.detach()))
            return res

    return _Recorder()
