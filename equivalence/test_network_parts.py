"""Every block part of the reduced RAVLT networks (both presets) and LiSANet networks (isotropic and hierarchical),
teacher-forced: each part of the twin (``run_unit_part``), fed the reference's input of that part rounded to T, is
judged by the verdict against the reference's part through the part's own running bound (``unit_part_bound``),
with the NumPy naive run and the twin's legitimate variants as the ensemble (equivalence/test_models.py's
``_check_stage``), and must match in every dtype of the suite; the twin's unit is its parts composed, bit for bit.
test_models.py goes part by part only where a unit's own bound is void; here every part is compared, so that a
part's comparison is known to be conclusive before a deeper or lower-precision network needs it (a RAVLT block's
own float32 bound is void at widths 64 / 128, its parts' are not: tests/test_verify_ravlt_parts.py)."""

from __future__ import annotations

import pytest

from equivalence.test_models import _check_stage, _setup, check_unit_parts
from refimpl import numerics
from refimpl.verdict import INCONCLUSIVE

CASES = [("ravlt_t", "paper"), ("ravlt_t", "official"), ("lisanet_i_t", "paper"), ("lisanet_h_t", "paper")]


def check_every_part(fam, cfg, params, images, twin, label: str, dtype_name: str, device,
                     whole: bool = False) -> list[str]:
    """Every part of every unit of ``fam``'s network teacher-forced (the reference's input of the part, rounded to
    T) against the reference through the part's bound: each must match, and the twin's unit must be its parts
    composed bit for bit.  With ``whole``, each block unit is also compared as a whole (it must not diverge);
    returns the units whose whole comparison is "inconclusive" (their own bound void)."""
    x, void_units = images, []
    for unit in fam.unit_names(cfg):
        parts = fam.unit_parts(cfg, unit)
        if parts:
            if whole:
                r = _check_stage(f"{label} unit {unit}", x, dtype_name, device,
                                 reference=lambda v, u=unit: fam.run_unit(params, u, v, cfg),
                                 bound=lambda v, u=unit: fam.unit_bound(params, u, v, cfg, dtype=dtype_name),
                                 twin_fn=lambda v, u=unit: twin.run_unit(u, v))
                if r.verdict == INCONCLUSIVE:
                    void_units.append(unit)
            check_unit_parts(fam, twin, params, cfg, unit, x, dtype_name, device, label)
        x = numerics.round_to(fam.run_unit(params, unit, x, cfg), dtype_name)
    return void_units


@pytest.mark.parametrize("name,preset", CASES)
def test_every_block_part_matches_teacher_forced(name, preset, device, dtype_name):
    """Each block part of the reduced network matches teacher-forced; units are their parts composed."""
    fam, cfg, params, images, twin = _setup(name, preset, device, dtype_name)
    check_every_part(fam, cfg, params, images, twin, f"{name}/{preset}", dtype_name, device)
