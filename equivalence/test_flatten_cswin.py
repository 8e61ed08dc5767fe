"""FLatten-CSwin's twin (refimpl/twins/models/flatten_cswin.py) against the reference (refimpl/models/flatten_cswin.py),
through the verdict, in float32 and float64, on every device.

The registry-driven test (equivalence/test_models.py) runs every unit of the reduced network, its composition
and the end-to-end comparison for both presets.  This file is the family's own, shorter check, and covers what
the registered configuration does not:

- one unit of every kind (stem, a focused block over the whole grid, a merge, a softmax block in stripes
  with two branches, the global softmax block, the head), teacher-forced through its unit bound, stage-wise
  (attention, MLP) where the unit bound is void, in both stripe orders (the presets' defaults);
- the focused attention in CSwin's stripes (``focused_split``), which the released configurations do not use;
- the twin's forward as the exact composition of its units;
- the twin's state_dict keys are the released module's names, at full size (meta device, nothing run).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refimpl.twins.models as em
import refimpl.models as rm
from equivalence.assertions import load_numpy_state, round_params, to_numpy, to_torch, torch_dtype
from equivalence.test_models import BATCH, SEED, _check_parts, _check_stage
from refimpl import numerics
from refimpl.models import flatten_cswin as fc
from refimpl.verdict import INCONCLUSIVE

#: one unit of every kind in the reduced network (refimpl.models.flatten_cswin.reduced)
UNITS = ("stem", "stage1.0", "merge1", "stage3.0", "stage4.0", "head")


def _setup(cfg, device, dtype_name):
    params = round_params(fc.init_params(cfg, np.random.default_rng(SEED)), dtype_name)
    images = numerics.round_to(np.random.default_rng(SEED + 1).standard_normal((BATCH, cfg.in_chans, *cfg.img_size)),
                               dtype_name)
    twin = em.build(cfg).to(dtype=torch_dtype(dtype_name))
    load_numpy_state(twin, params)
    return params, images, twin.to(device=device).eval()


def _check_unit(cfg, params, twin, unit, x, dtype_name, device, label):
    report = _check_stage(f"{label} unit {unit}", x, dtype_name, device,
                          reference=lambda v: fc.run_unit(params, unit, v, cfg),
                          bound=lambda v: fc.unit_bound(params, unit, v, cfg, dtype=dtype_name),
                          twin_fn=lambda v: twin.run_unit(unit, v))
    if report.verdict == INCONCLUSIVE:
        _check_parts(fc, twin, params, cfg, unit, x, dtype_name, device, report, label)


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_every_unit_kind_matches_reference(preset, device, dtype_name):
    """Stem, focused block (global), merge, two-branch stripe block, global softmax block and head of the
    reduced FLatten-CSwin match the reference teacher-forced (stage-wise inside a block whose unit bound is
    void); the twin's forward is its units composed, bit for bit.  "paper" puts the horizontal stripes first,
    "official" the vertical ones (the released idx 0)."""
    cfg = fc.reduced(rm.create("flatten_cswin_t", preset=preset)[0])
    assert len(cfg.branch_windows(2)) == 2 and len(cfg.branch_windows(0)) == len(cfg.branch_windows(3)) == 1
    params, images, twin = _setup(cfg, device, dtype_name)
    taps: dict = {}
    fc.run(params, images, cfg, taps=taps)
    names = fc.unit_names(cfg)
    for unit in UNITS:
        i = names.index(unit)
        x = images if i == 0 else numerics.round_to(taps[names[i - 1]], dtype_name)
        _check_unit(cfg, params, twin, unit, x, dtype_name, device, f"flatten_cswin/{preset}")
    img_t = to_torch(images, dtype_name, device)
    with torch.no_grad():
        chain = img_t
        for unit in names:
            chain = twin.run_unit(unit, chain)
        np.testing.assert_array_equal(to_numpy(chain), to_numpy(twin(img_t)))


def test_focused_attention_in_stripes_matches_reference(device, dtype_name):
    """``focused_split=(2, 2, None, None)``: the focused stages in CSwin's stripes (two branches of C/2 channels,
    one focused module per branch with its own positional encoding over the stripe), official preset, matches
    the reference stage-wise."""
    cfg = fc.reduced(rm.create("flatten_cswin_t", preset="official", focused_split=(2, 2, None, None))[0])
    assert cfg.branch_windows(0) == [(8, 2), (2, 16)] and cfg.branch_windows(1) == [(4, 2), (2, 8)]
    assert cfg.branch_dims(0) == (32, 1) and cfg.branch_dims(1) == (64, 2)
    params, images, twin = _setup(cfg, device, dtype_name)
    taps: dict = {}
    fc.run(params, images, cfg, taps=taps)
    names = fc.unit_names(cfg)
    for unit in ("stage1.0", "stage2.0"):
        x = numerics.round_to(taps[names[names.index(unit) - 1]], dtype_name)
        _check_unit(cfg, params, twin, unit, x, dtype_name, device, "flatten_cswin focused stripes")


@pytest.mark.parametrize("name", ["flatten_cswin_t", "flatten_cswin_s", "flatten_cswin_b"])
def test_twin_keys_are_the_released_names(name):
    """At full size (meta device): the twin's state_dict is refimpl's param_shapes, and the names are the
    released flatten_cswin.py's (stage1_conv_embed.{0,2}, stage{i}.{j}.{qkv,norm1,proj,attns.{b}.{get_v,dwc,scale,
    positional_encoding},mlp.fc{1,2},norm2}, merge{i}.{conv,norm}, norm, head)."""
    cfg = rm.create(name, preset="official")[0]
    with torch.device("meta"):
        module = em.build(cfg)
    sd = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    assert sd == rm.param_shapes(cfg)
    c = cfg.embed_dim
    assert sd["stage1_conv_embed.0.weight"] == (c, 3, 7, 7) and sd["stage1_conv_embed.2.weight"] == (c,)
    assert sd["stage1.0.attns.0.positional_encoding"] == (1, 56 * 56, c)
    assert sd["stage1.0.attns.0.dwc.weight"] == (c // cfg.num_heads[0], 1, 5, 5)
    assert sd["stage3.0.attns.1.get_v.weight"] == (2 * c, 1, 3, 3) and "stage3.0.attns.1.dwc.weight" not in sd
    assert sd["stage4.0.attns.0.get_v.weight"] == (8 * c, 1, 3, 3) and "stage4.0.attns.1.get_v.weight" not in sd
    assert sd["merge3.conv.weight"] == (8 * c, 4 * c, 3, 3)
