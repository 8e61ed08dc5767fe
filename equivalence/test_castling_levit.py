"""Castling-LeViT options beyond the registered configs (the registry-driven equivalence/test_models.py runs the
registered config under both presets): the twin against the reference, unit by unit and teacher-forced, in
float32 and float64, for the query pooling by selection, the residual pooling connection off or in the shrink
blocks only, a 3 x 3 grid DWConv (the twin's stride-2 conv against the reference's full-resolution conv with its
rows selected) and the similarity-sum normaliser (its key count is N, not N', in the shrink blocks).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refimpl.twins.models as em
from equivalence import test_models as T
from equivalence.assertions import load_numpy_state, round_params, to_numpy, to_torch, torch_dtype
from refimpl import numerics
from refimpl.models import castling_levit as L, create
from refimpl.verdict import INCONCLUSIVE

OPTIONS = [dict(q_pool="subsample", q_residual="none"),
           dict(q_residual="downsample", attn_overrides={"conv": "grid2d", "conv_kernel": 3}),
           dict(attn_overrides={"normaliser": "similarity_sum"})]


@pytest.mark.parametrize("over", OPTIONS, ids=["subsample-noresidual", "grid2d-residual-downsample", "similarity-sum"])
def test_castling_levit_options_match_reference(over, device, dtype_name):
    """Every unit of the reduced network (stem, blocks, shrink blocks, head) teacher-forced through its bound
    (stage-wise where the unit's own bound is void), and the twin's forward as the composition of its units."""
    cfg = L.reduced(create("castling_levit_128", **over)[0])
    params = round_params(L.init_params(cfg, np.random.default_rng(T.SEED)), dtype_name)
    images = numerics.round_to(np.random.default_rng(T.SEED + 1).standard_normal((T.BATCH, 3, *cfg.img_size)),
                               dtype_name)
    twin = em.build(cfg).to(dtype=torch_dtype(dtype_name))
    load_numpy_state(twin, params)
    twin = twin.to(device=device).eval()
    img_t = to_torch(images, dtype_name, device)
    x, chain = images, img_t
    label = f"castling_levit {over}"
    for unit in L.unit_names(cfg):
        report = T._check_stage(f"{label} unit {unit}", x, dtype_name, device,
                                reference=lambda v, u=unit: L.run_unit(params, u, v, cfg),
                                bound=lambda v, u=unit: L.unit_bound(params, u, v, cfg, dtype=dtype_name),
                                twin_fn=lambda v, u=unit: twin.run_unit(u, v))
        if report.verdict == INCONCLUSIVE:
            T._check_parts(L, twin, params, cfg, unit, x, dtype_name, device, report, label)
        with torch.no_grad():
            chain = twin.run_unit(unit, chain)
        x = numerics.round_to(L.run_unit(params, unit, x, cfg), dtype_name)
    with torch.no_grad():
        np.testing.assert_array_equal(to_numpy(chain), to_numpy(twin(img_t)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_twin_hardswish_is_the_cpu_kernel_on_every_device(dtype, device):
    """The twin's Hardswish (refimpl.twins.models.castling_levit.hardswish_t) equals torch's CPU kernel bit for
    bit, wherever it runs; in float64 it is within the reference's own 4 roundings
    (castling_levit._HARDSWISH_ROUNDINGS), while the CUDA kernel's product with 1/6 rounded to float32 (its
    formula, emulated here) errs by 2^-25 relative, 2.7e8 float64 units: the divergence this twin avoids."""
    from refimpl.twins.models.castling_levit import hardswish_t
    x = torch.linspace(-5.0, 5.0, 2001, dtype=torch.float64).to(dtype)
    cpu = torch.nn.functional.hardswish(x)
    assert torch.equal(hardswish_t(x.to(device)).cpu(), cpu)
    if dtype != torch.float64:
        return
    ref = L.hardswish(x.numpy())
    u = numerics.unit_roundoff("float64")
    ok = np.abs(to_numpy(hardswish_t(x.to(device))) - ref) <= numerics.gamma(L._HARDSWISH_ROUNDINGS, u) * np.abs(ref)
    assert ok.all()
    cuda_formula = (x * (x + 3).clamp(0, 6) * float(np.float32(1.0 / 6.0))).numpy()
    rel = np.abs(cuda_formula - ref)[ref != 0] / np.abs(ref[ref != 0])
    assert rel.max() > 1e6 * numerics.gamma(L._HARDSWISH_ROUNDINGS, u)
