"""Reading a foreign network's observed tensors as the reference's values: :func:`_as_layout` (a tensor in the
layout of a reference value, the closest reading) and :func:`_same_value` (equal up to a few roundings), shared
by refimpl.verify.networks and its head wiring check (refimpl.verify.head_wiring).

Layer: the verify tool (NumPy; the tensors converted through refimpl.verify.steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import verdict as _verdict
from .locate import layouts

__all__: list[str] = []


def _as_layout(t: Any, like: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The foreign tensor ``t`` read in the layout of ``like`` (the reference's value), the closest reading."""
    from .steps import _to64
    f = _to64(t)
    if f.shape == like.shape:
        return f, ""
    nr = float(np.sqrt(np.sum(like ** 2))) or 1.0
    best = None
    for arr, how in layouts(f, like.shape):
        d = float(np.sqrt(np.sum((arr - like) ** 2))) / nr
        if best is None or d < best[2]:
            best = (arr, how, d)
        if d == 0:
            break
    return (None, f"shape {f.shape}, the reference's {like.shape}") if best is None else (best[0], f" ({best[1]})")


def _same_value(a: np.ndarray | None, b: np.ndarray, dtype: str) -> bool:
    """``a`` holds ``b``'s values (a copy, a reshape: equal up to a few roundings of ``dtype``)."""
    if a is None or a.shape != b.shape:
        return False
    scale = float(np.max(np.abs(b), initial=0.0))
    return bool(np.max(np.abs(a - b), initial=0.0) <= 16 * _verdict.unit_roundoff(dtype) * scale)
