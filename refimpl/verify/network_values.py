"""Reading a foreign network's observed tensors as the reference's values: :func:`_as_layout` (a tensor in the
layout of a reference value, the closest reading; shared by refimpl.verify.networks and its head wiring check,
refimpl.verify.head_wiring) and :func:`_same_value` (a copy: equal values; the network's wiring check).

Layer: the verify tool (NumPy; the tensors converted through refimpl.verify.steps).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .locate import layouts

__all__ = ["unit_modules"]


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


def _same_value(a: np.ndarray | None, b: np.ndarray) -> bool:
    """``a`` holds ``b``'s values: the same tensor of the foreign network, or a copy of it (a reshape, an axis
    order read back by :func:`_as_layout`, a transfer, a conversion to float64 by ``_to64``, which is exact).  No
    operation between the two rounds, so the error model allows no difference (gamma_0 = 0): equal element for
    element, NaN where NaN.  Two values that differ by a rounding are two computations, not one wire; comparing a
    tested value with the reference's is the bound's business (the callers use the stage's or the head's own)."""
    if a is None or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=True))


def unit_modules(units: list[str], subs: Mapping[str, Any], source: Mapping[str, str]) -> dict[str, str]:
    """unit -> the foreign submodule computing it, as the forward observes the units: the submodule of the unit's
    name, or the one holding exactly the unit's parameters (through the naming ``source``: reference key ->
    foreign key); the stem and the head have none.  Shared by the forward's observation
    (refimpl.verify.networks) and the unit-wise gradients (refimpl.verify.unit_gradients)."""
    out = {}
    for u in units:
        if u in ("stem", "head"):
            continue
        fk = [source[k] for k in source if k.startswith(u + ".")]
        if not fk:
            continue
        if u in subs and all(f.startswith(u + ".") for f in fk):
            out[u] = u
            continue
        common: list[str] = []
        for comp in zip(*[f.split(".")[:-1] for f in fk]):
            if len(set(comp)) != 1:
                break
            common.append(comp[0])
        prefix = ".".join(common)
        others = [r for r, f in source.items() if f.startswith(prefix + ".") and not r.startswith(u + ".")]
        if prefix and prefix in subs and not others:
            out[u] = prefix
    return out
