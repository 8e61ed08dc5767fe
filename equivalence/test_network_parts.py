"""Every block part of the reduced RAVLT networks (both presets) and LiSANet networks (isotropic and hierarchical),
teacher-forced: each part of the twin (``run_unit_part``), fed the reference's input of that part rounded to T, is
judged by the verdict against the reference's part through the part's own running bound (``unit_part_bound``),
with the NumPy naive run and the twin's legitimate variants as the ensemble (equivalence/test_models.py's
``_check_stage``), and must match in every dtype of the suite; the twin's unit is its parts composed, bit for bit.
test_models.py goes part by part only where a unit's own bound is void; here every part is compared, so that a
part's comparison is known to be conclusive before a deeper or lower-precision network needs it (a RAVLT block's
own float32 bound is void at widths 64 / 128, its parts' are not: tests/test_verify_ravlt_parts.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from equivalence.assertions import to_numpy, to_torch
from equivalence.test_models import _check_stage, _setup
from refimpl import numerics
from refimpl.verdict import MATCH

CASES = [("ravlt_t", "paper"), ("ravlt_t", "official"), ("lisanet_i_t", "paper"), ("lisanet_h_t", "paper")]


@pytest.mark.parametrize("name,preset", CASES)
def test_every_block_part_matches_teacher_forced(name, preset, device, dtype_name):
    fam, cfg, params, images, twin = _setup(name, preset, device, dtype_name)
    x = images
    for unit in fam.unit_names(cfg):
        parts = fam.unit_parts(cfg, unit)
        if parts:
            xp, x_t = x, to_torch(x, dtype_name, device)
            chain = x_t
            for part in parts:
                r = _check_stage(f"{name}/{preset} unit {unit}, part {part}", xp, dtype_name, device,
                                 reference=lambda v, q=part, u=unit: fam.run_unit_part(params, u, q, v, cfg),
                                 bound=lambda v, q=part, u=unit: fam.unit_part_bound(params, u, q, v, cfg,
                                                                                      dtype=dtype_name),
                                 twin_fn=lambda v, q=part, u=unit: twin.run_unit_part(u, q, v))
                assert r.verdict == MATCH, str(r)
                with torch.no_grad():
                    chain = twin.run_unit_part(unit, part, chain)
                xp = numerics.round_to(fam.run_unit_part(params, unit, part, xp, cfg), dtype_name)
            with torch.no_grad():
                np.testing.assert_array_equal(to_numpy(chain), to_numpy(twin.run_unit(unit, x_t)))
        x = numerics.round_to(fam.run_unit(params, unit, x, cfg), dtype_name)
