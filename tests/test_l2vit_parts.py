"""L2ViT's block units as their residual steps (refimpl/models/l2vit.py ``unit_parts``, ``run_unit_part``,
``unit_part_bound``; the twins' ``run_unit_part`` and blocks' ``part``), and the Castling-MViTv2 twin's
``run_unit_part``.

A block unit "stages.i.j" is "cpe" (X + DWConv(X)), "attn" (the attention residual; LGA with lcm_placement
"attention": X + LCM(Attn(LN_1 X))), "cpe1" (LWA with lwa_cpe "twice"), "lcm" (LGA with the residual LCM, Eq. 8)
and "mlp": on both sides the unit is its parts composed, bit for bit, for both block kinds, both LCM placements and
both LWA CPE options.  Each part's float64 bound holds for the float64 twin (every element within it) and is
conclusive (its relative size below 1: not void).  Tolerances: the error model's bounds only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refimpl.models as rm
import refimpl.twins.models as em
from equivalence.assertions import load_numpy_state
from refimpl import numerics
from refimpl.errors import ArgumentError
from refimpl.models import castling_mvitv2, l2vit
from tests.parts_helpers import check_unit_parts

SEED = 11

#: (preset, block overrides): both presets (paper: one CPE in LWA; official: "twice"), each LCM placement and the
#: other LWA CPE option.
CASES = [("paper", ()), ("official", ()), ("paper", (("lcm_placement", "attention"),)),
         ("official", (("lcm_placement", "attention"),)), ("paper", (("lwa_cpe", "twice"),)),
         ("official", (("lwa_cpe", "once"),))]


def _case(preset, over):
    cfg = l2vit.reduced(rm.create("l2vit_tiny", preset=preset, block_overrides=over)[0])
    params = l2vit.init_params(cfg, np.random.default_rng(SEED))
    images = np.random.default_rng(SEED + 1).standard_normal((2, 3, *l2vit.test_image_hw(cfg)))
    twin = em.build(cfg).double()
    load_numpy_state(twin, params)
    return cfg, params, images, twin.eval()


def _expected_parts(cfg, unit):
    if not unit.startswith("stages."):
        return ()
    bc = l2vit.block_config(cfg, int(unit.split(".")[1]))
    if int(unit.split(".")[2]) % 2 == 0:
        return ("cpe", "attn", "cpe1", "mlp") if bc.lwa_cpe == "twice" else ("cpe", "attn", "mlp")
    return ("cpe", "attn", "lcm", "mlp") if bc.lcm_placement == "residual" else ("cpe", "attn", "mlp")


def test_part_names_follow_the_block_options():
    """Paper: LWA (cpe, attn, mlp), LGA (cpe, attn, lcm, mlp); official's LWA has its second CPE as "cpe1"; the LCM
    inside the attention residual leaves LGA (cpe, attn, mlp); the stem, downsamplings and head have none."""
    paper = l2vit.reduced(rm.create("l2vit_tiny")[0])
    official = l2vit.reduced(rm.create("l2vit_tiny", preset="official")[0])
    inside = l2vit.reduced(rm.create("l2vit_tiny", block_overrides={"lcm_placement": "attention"})[0])
    assert l2vit.unit_parts(paper, "stages.1.0") == ("cpe", "attn", "mlp")
    assert l2vit.unit_parts(paper, "stages.1.1") == ("cpe", "attn", "lcm", "mlp")
    assert l2vit.unit_parts(official, "stages.0.0") == ("cpe", "attn", "cpe1", "mlp")
    assert l2vit.unit_parts(official, "stages.0.1") == ("cpe", "attn", "lcm", "mlp")
    assert l2vit.unit_parts(inside, "stages.0.1") == ("cpe", "attn", "mlp")
    for unit in ("stem", "downsample_layers.1", "head"):
        assert l2vit.unit_parts(paper, unit) == ()
    with pytest.raises(ArgumentError, match="argument 'name'"):
        l2vit.unit_parts(paper, "stages.0.2")


def test_bad_part_names_are_refused_naming_part():
    cfg, params, images, twin = _case("paper", ())
    grid = l2vit.run_unit(params, "stem", images, cfg)
    for unit, part in (("stages.0.0", "lcm"), ("stages.0.0", "cpe1"), ("stages.0.1", "cpe1"), ("stem", "attn"),
                       ("stages.0.0", "ATTN")):
        x = images if unit == "stem" else grid
        with pytest.raises(ArgumentError, match=f"argument 'part': unit '{unit}' has parts"):
            l2vit.run_unit_part(params, unit, part, x, cfg)
        with pytest.raises(ArgumentError, match="argument 'part'"):
            l2vit.unit_part_bound(params, unit, part, x, cfg, dtype="float32")
        with pytest.raises(ArgumentError, match="argument 'part'"):
            twin.run_unit_part(unit, part, torch.from_numpy(x))
    with pytest.raises(ArgumentError, match="unknown unit"):
        l2vit.run_unit_part(params, "stages.0.7", "mlp", grid, cfg)
    with pytest.raises(ValueError, match="argument 'x'"):
        l2vit.run_unit_part(params, "stages.0.0", "mlp", grid[0], cfg)


@pytest.mark.parametrize("preset,over", CASES, ids=lambda v: v if isinstance(v, str) else ",".join(map(str, v)))
def test_units_are_their_parts_composed_and_each_part_bound_holds(preset, over):
    """NumPy and twin (float64): every block unit equals its parts in order bit for bit (the twin's on its own
    outputs); every part of the twin is within the part's float64 bound, which is conclusive (relative < 1)."""
    cfg, params, images, twin = _case(preset, over)
    x = images
    for unit in l2vit.unit_names(cfg):
        assert l2vit.unit_parts(cfg, unit) == _expected_parts(cfg, unit)
        for part in l2vit.unit_parts(cfg, unit):
            note = l2vit.unit_part_bound(params, unit, part, x, cfg, dtype="float64").note
            assert note.startswith(f"L2ViT unit {unit}, {part}:"), note
            break
        x = check_unit_parts(l2vit, params, cfg, twin, unit, x, f"{preset}{over}")


def _tokens(g):
    return g.reshape(g.shape[0], g.shape[1], -1).transpose(0, 2, 1)


def test_block_taps_keep_their_names_and_values():
    """run_unit's taps keep the block's names (enhanced.lwa_block / lga_block: "cpe", "attn_out", "attn.*", "cpe1" or
    "lcm", "mlp"; tokens (B, N, C)) and are the parts' values: "cpe" the first part's output, "cpe1" the LWA block
    before its MLP, "lcm" and "mlp" the branches added to the previous part's output (bit for bit)."""
    for preset in ("paper", "official"):
        cfg, params, images, _ = _case(preset, ())
        x = l2vit.run_unit(params, "stem", images, cfg)
        for unit, extra in (("stages.0.0", "cpe1"), ("stages.0.1", "lcm")):
            taps: dict = {}
            y = l2vit.run_unit(params, unit, x, cfg, taps=taps)
            assert {"cpe", "attn_out", extra, "mlp"} <= set(taps) and any(k.startswith("attn.") for k in taps)
            outs, z = {}, x
            for part in l2vit.unit_parts(cfg, unit):
                prev, z = z, l2vit.run_unit_part(params, unit, part, z, cfg)
                outs[part] = (_tokens(prev), _tokens(z))
            np.testing.assert_array_equal(taps["cpe"], outs["cpe"][1])
            np.testing.assert_array_equal(_tokens(y), outs["mlp"][0] + taps["mlp"])
            if extra == "cpe1":
                np.testing.assert_array_equal(taps["cpe1"], outs["mlp"][0])
            else:
                np.testing.assert_array_equal(outs["lcm"][1], outs["lcm"][0] + taps["lcm"])
            x = y


def test_castling_mvitv2_twin_units_are_their_parts_composed():
    """The MViTv2 twin's run_unit_part: its blocks (stride 1, and the stride-2 transition with channel expansion)
    equal their "attn" then "mlp" parts bit for bit, each part within its float64 bound; a bad part is refused."""
    cfg = castling_mvitv2.reduced(rm.entry("castling_mvitv2_t").config)
    params = castling_mvitv2.init_params(cfg, SEED)
    twin = em.build(cfg).double()
    load_numpy_state(twin, params)
    twin.eval()
    x = np.random.default_rng(SEED).standard_normal((2, 3, *cfg.img_size))
    for unit in castling_mvitv2.unit_names(cfg):
        parts = castling_mvitv2.unit_parts(cfg, unit)
        assert parts == (("attn", "mlp") if unit.startswith("stages.") else ())
        if parts:
            with pytest.raises(ValueError, match="argument 'name'"):
                twin.run_unit_part(unit, "lcm", torch.from_numpy(np.ascontiguousarray(x)))
        x = check_unit_parts(castling_mvitv2, params, cfg, twin, unit, x, "castling_mvitv2")
    assert numerics.as_float(x, "x").shape == (2, cfg.num_classes)
