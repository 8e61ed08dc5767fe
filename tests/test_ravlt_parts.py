"""RAVLT's block units split into their residual steps (refimpl.models.ravlt.unit_parts: "cpe" x + DWConv(x),
"attn" x + [g1 *] Attn(LN1 x), "mlp" x + [g2 *] FFN(LN2 x); RALA §3.2, Fig. 6): the part names, bad part names
refused, the unit equal to its parts composed bit for bit on the NumPy side and on the PyTorch twin, and every
part's own error bound holding, and conclusive, for the float64 twin against the reference - across RALA and
softmax stages, layer scale on and off, the FFN's depthwise conv on and off, a block without CPE, and both
presets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import refimpl.models as rm
import refimpl.twins.models as em
from refimpl import verdict
from refimpl.errors import ArgumentError
from refimpl.models import ravlt
from tests.parts_helpers import assert_bad_parts_refused, check_unit_parts

SEED = 5


def _cfg(case: str) -> ravlt.RAVLTNetConfig:
    paper = ravlt.reduced(rm.create("ravlt_t")[0])
    official = ravlt.reduced(rm.create("ravlt_t", preset="official")[0])
    return {"paper": paper, "official": official,
            "paper_layer_scale_ffn_dwconv": dataclasses.replace(paper, layer_scale=True, ffn_dwconv=True),
            "official_rala_plain": dataclasses.replace(official, layer_scale=False, ffn_dwconv=False,
                                                       stage_attention=("rala",) * 4),
            "official_no_cpe": dataclasses.replace(official, attn_overrides={"cpe_kernel": 0})}[case]


CASES = ["paper", "official", "paper_layer_scale_ffn_dwconv", "official_rala_plain", "official_no_cpe"]


def _setup(case: str):
    cfg = _cfg(case)
    params = ravlt.init_params(cfg, SEED)
    images = np.random.default_rng(SEED).standard_normal((2, 3, *ravlt.test_image_hw(cfg)))
    twin = em.build(cfg).double()
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}, strict=True)
    return cfg, params, images, twin.eval()


def test_part_names_follow_the_block():
    """Blocks are ("cpe", "attn", "mlp") - ("attn", "mlp") without a CPE -; the stem, the downsamplings and the
    head have no parts; an unknown unit is refused naming 'name'."""
    cfg = _cfg("official")
    for u in ravlt.unit_names(cfg):
        want = ("cpe", "attn", "mlp") if ".blocks." in u else ()
        assert ravlt.unit_parts(cfg, u) == want, u
    assert ravlt.unit_parts(_cfg("official_no_cpe"), "layers.2.blocks.0") == ("attn", "mlp")
    with pytest.raises(ArgumentError, match="'name'"):
        ravlt.unit_parts(cfg, "layers.9.blocks.0")


def test_bad_part_names_are_refused_naming_part():
    cfg, params, images, twin = _setup("official_no_cpe")
    x = ravlt.run_unit(params, "stem", images, cfg)
    assert_bad_parts_refused(ravlt, params, cfg, twin, x, (("layers.0.blocks.0", "ffn"), ("layers.0.blocks.0", "cpe"), ("stem", "attn")))


@pytest.mark.parametrize("case", CASES)
def test_units_are_their_parts_and_parts_match_the_twin_within_their_bounds(case):
    """Every block unit equals its parts composed, bit for bit, in NumPy (the taps of ``run`` unchanged: the block's
    steps under "<unit>.cpe", ".attn", ".res1", ".ffn", ".out") and on the float64 twin; each part of the twin,
    fed the reference's input of that part, matches the reference's part through the part's own float64 bound,
    which is conclusive (verdict "match": finite and below the size of the output everywhere)."""
    cfg, params, images, twin = _setup(case)
    taps: dict = {}
    ravlt.run(params, images, cfg, taps=taps)
    units = ravlt.unit_names(cfg)
    for k, u in enumerate(units):
        parts = ravlt.unit_parts(cfg, u)
        if not parts:
            continue
        x = taps[units[k - 1]]
        xp = check_unit_parts(ravlt, params, cfg, twin, u, x, case)
        np.testing.assert_array_equal(xp, taps[u])
        layout = ravlt.block_config(cfg, int(u.split(".")[1])).attn.layout
        np.testing.assert_array_equal(taps[f"{u}.out"], ravlt._to_layout(taps[u], layout))
        assert {f"{u}.{t}" for t in ("cpe", "attn", "res1", "ffn", "out")} <= set(taps)


def test_a_wrong_part_is_outside_its_bound():
    """The comparison is not vacuous: the twin's "mlp" part with its FFN output off by 1e-9 relative is outside the
    part's float64 bound (verdict "diverges")."""
    cfg, params, images, twin = _setup("official")
    u = "layers.1.blocks.0"
    x = ravlt.run_unit_part(params, u, "attn", ravlt.run_unit_part(
        params, u, "cpe", ravlt.run_unit(params, "layers.0.downsample", ravlt.run_unit(
            params, "layers.0.blocks.0", ravlt.run_unit(params, "stem", images, cfg), cfg), cfg), cfg), cfg)
    blk = twin.layers[1].blocks[0]
    h = blk.ffn.register_forward_hook(lambda _m, _i, out: out * (1 + 1e-9))
    try:
        with torch.no_grad():
            got = twin.run_unit_part(u, "mlp", torch.from_numpy(x)).numpy()
    finally:
        h.remove()
    rep = verdict.compare(got, ravlt.run_unit_part(params, u, "mlp", x, cfg),
                          ravlt.unit_part_bound(params, u, "mlp", x, cfg, dtype="float64"), "float64")
    assert rep.verdict == verdict.DIVERGES, str(rep)
