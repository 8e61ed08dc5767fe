"""What the networks' part tests share (tests/test_l2vit_parts.py, test_ravlt_parts.py, test_lisanet_parts.py): one
block unit checked against its parts in float64, on the NumPy side and on the twin."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from refimpl import verdict


def check_unit_parts(fam: ModuleType, params: Any, cfg: Any, twin: Any, unit: str, x: np.ndarray,
                     label: str) -> np.ndarray:
    """Unit ``unit`` of ``fam``'s network on ``x`` as its parts (``fam.unit_parts``): each part of the float64 twin,
    fed the reference's input of that part, is within the part's float64 bound (every element) and the verdict
    is "match" with a conclusive bound (relative < 1); the reference's parts composed equal ``fam.run_unit`` bit
    for bit, and the twin's parts composed on their own outputs equal ``twin.run_unit`` bit for bit.  Returns the
    unit's output."""
    y = fam.run_unit(params, unit, x, cfg)
    x_t = torch.from_numpy(np.ascontiguousarray(x))
    z, z_t = x, x_t
    parts = fam.unit_parts(cfg, unit)
    for part in parts:
        ref = fam.run_unit_part(params, unit, part, z, cfg)
        bound = fam.unit_part_bound(params, unit, part, z, cfg, dtype="float64")
        with torch.no_grad():
            got = twin.run_unit_part(unit, part, torch.from_numpy(np.ascontiguousarray(z))).numpy()
            z_t = twin.run_unit_part(unit, part, z_t)
        rep = verdict.compare(got, ref, bound, "float64", name=f"{label} {unit}/{part}")
        assert np.all(np.abs(got - ref) <= bound.array("float64", ref.shape)), str(rep)
        assert rep.verdict == verdict.MATCH and rep.max_relative_bound < 1.0, str(rep)
        z = ref
    if parts:
        np.testing.assert_array_equal(z, y)
        with torch.no_grad():
            np.testing.assert_array_equal(z_t.numpy(), twin.run_unit(unit, x_t).numpy())
    return y


def assert_bad_parts_refused(fam: ModuleType, params: Any, cfg: Any, twin: Any, x: np.ndarray,
                             cases: tuple[tuple[str, str], ...]) -> None:
    """Each (unit, part) of ``cases`` (a part the unit does not have) is refused naming 'part': by
    ``fam.run_unit_part`` and ``fam.unit_part_bound`` (ArgumentError) and by the twin's ``run_unit_part``
    (ValueError)."""
    from refimpl.errors import ArgumentError
    for unit, part in cases:
        with pytest.raises(ArgumentError, match="'part'"):
            fam.run_unit_part(params, unit, part, x, cfg)
        with pytest.raises(ArgumentError, match="'part'"):
            fam.unit_part_bound(params, unit, part, x, cfg, dtype="float32")
        with pytest.raises(ValueError, match="'part'"):
            twin.run_unit_part(unit, part, torch.from_numpy(x))
