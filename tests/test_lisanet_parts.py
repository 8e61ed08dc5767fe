"""LiSANet's block units split into their residual branches (refimpl.models.lisanet.unit_parts: "attn"
x + op(LN1 x), "mlp" x + MLP(LN2 x); LiSA §5.1, Fig. 3): the part names, bad part names refused, the unit equal to
its parts composed bit for bit on the NumPy side and on the PyTorch twin, and every part's own error bound holding,
and conclusive, for the float64 twin against the reference - for LiSA (isotropic and hierarchical) and for the
Table 3 operators that replace it (self-attention with RPE, SA Eq. 7, local kernels, depthwise conv, GF layer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refimpl.models as rm
import refimpl.twins.models as em
from refimpl import verdict
from refimpl.errors import ArgumentError
from refimpl.models import lisanet
from tests.parts_helpers import assert_bad_parts_refused, check_unit_parts

SEED = 5
CASES = ["lisanet_i_t", "lisanet_h_t", "lisanet_i_t_selfattn_rpe", "lisanet_i_t_sa_eq7", "lisanet_i_t_local3",
         "lisanet_i_t_dwconv", "lisanet_i_t_gf"]


def _setup(name: str):
    cfg = lisanet.reduced(rm.entry(name).config)
    params = lisanet.init_params(cfg, SEED)
    images = np.random.default_rng(SEED).standard_normal((2, 3, *lisanet.test_image_hw(cfg)))
    twin = em.build(cfg).double()
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}, strict=True)
    return cfg, params, images, twin.eval()


def test_part_names_follow_the_block():
    """Blocks are ("attn", "mlp"); the patch embeddings and the head have no parts; an unknown unit is refused
    naming 'name'."""
    cfg = lisanet.reduced(rm.entry("lisanet_h_t").config)
    for u in lisanet.unit_names(cfg):
        assert lisanet.unit_parts(cfg, u) == (("attn", "mlp") if u.startswith("stages.") else ()), u
    with pytest.raises(ArgumentError, match="'name'"):
        lisanet.unit_parts(cfg, "stages.7.0")


def test_bad_part_names_are_refused_naming_part():
    cfg, params, images, twin = _setup("lisanet_i_t")
    x = lisanet.run_unit(params, "patch_embed.0", images, cfg)
    assert_bad_parts_refused(lisanet, params, cfg, twin, x, (("stages.0.0", "ffn"), ("stages.0.0", "cpe"), ("head", "attn")))


@pytest.mark.parametrize("name", CASES)
def test_units_are_their_parts_and_parts_match_the_twin_within_their_bounds(name):
    """Every block unit equals its parts composed, bit for bit, in NumPy (``run``'s taps of the block unchanged:
    "<unit>.ln1", ".attn", ".resid1", ".ln2", ".mlp", ".out") and on the float64 twin; each part of the twin, fed
    the reference's input of that part, matches the reference's part through the part's own float64 bound, which
    is conclusive (verdict "match")."""
    cfg, params, images, twin = _setup(name)
    taps: dict = {}
    lisanet.run(params, images, cfg, taps=taps)
    units = lisanet.unit_names(cfg)
    for k, u in enumerate(units):
        parts = lisanet.unit_parts(cfg, u)
        if not parts:
            continue
        x = taps[units[k - 1]]
        xp = check_unit_parts(lisanet, params, cfg, twin, u, x, name)
        np.testing.assert_array_equal(xp, taps[u])
        assert {f"{u}.{t}" for t in ("ln1", "attn", "resid1", "ln2", "mlp", "out")} <= set(taps)


def test_a_wrong_part_is_outside_its_bound():
    """Not vacuous: the twin's "attn" part with its operator output off by 1e-9 relative diverges (float64)."""
    cfg, params, images, twin = _setup("lisanet_i_t")
    u = "stages.0.0"
    x = lisanet.run_unit(params, "patch_embed.0", images, cfg)
    h = twin.stages[0][0].attn.register_forward_hook(lambda _m, _i, out: out * (1 + 1e-9))
    try:
        with torch.no_grad():
            got = twin.run_unit_part(u, "attn", torch.from_numpy(x)).numpy()
    finally:
        h.remove()
    rep = verdict.compare(got, lisanet.run_unit_part(params, u, "attn", x, cfg),
                          lisanet.unit_part_bound(params, u, "attn", x, cfg, dtype="float64"), "float64")
    assert rep.verdict == verdict.DIVERGES, str(rep)


def test_verify_gradients_of_void_blocks_part_by_part():
    """verify --grad, LiSANet-I-T reduced in float32 (no torch ensemble): each block's own forward relative bound
    (~0.07) is void for some of its gradients, so its backward is judged part by part (the "mlp" part's input
    located by value among the block's tensors); the parts' bounds (~1e-3, ~6e-5) are conclusive and everything
    matches, where without parts the blocks were "inconclusive"."""
    from refimpl import verify as V
    from refimpl.verify.networks import network_config
    name = "lisanet_i_t"
    r = V.verify(em.build(network_config(name, None, {"reduced": True}, None)[0]), name, config={"reduced": True},
                 dtype="float32", grad=True, ensemble=False)
    g = r.gradients
    assert g["verdict"] == "match" and r.verdict == "match", str(r)
    blocks = [u for u in g["units"] if u["unit"].startswith("stages.")]
    assert blocks and all("void bound" in u["why"] for u in blocks), g["units"]
    for u in blocks:
        assert [(p["part"], p["verdict"]) for p in u["parts"]] == [("attn", "match"), ("mlp", "match")], u
        assert u["parts"][1]["input"].endswith("(by value)"), u
