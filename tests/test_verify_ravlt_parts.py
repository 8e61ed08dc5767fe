"""`refimpl verify` on RAVLT-T reduced at widths (64, 64, 128, 128) (``config={"reduced": true, "dims": ...}``) in
float32: there a block's own running bound is void (measured with the verify tool's weights, official preset:
relative bound 6.6, 2.4 and 4.9 for the blocks of stages 0-2) while each of its parts' is conclusive (cpe
~1e-6, attn ~1e-2, mlp ~1e-3), so the blocks are judged part by part (refimpl.models.ravlt.unit_parts: "cpe",
"attn", "mlp").  The network's own twin as the foreign module matches; a planted bug in one block's FFN diverges
at that unit, in its "mlp" part, while its "cpe" and "attn" parts and the other units match."""

from __future__ import annotations

import pytest

import refimpl.twins.models as em
from refimpl import verify as V
from refimpl.verify.networks import network_config

NAME = "ravlt_t"
CFG = {"reduced": True, "dims": [64, 64, 128, 128]}


def _twin(bug_ffn: str | None = None, rel: float = 0.0):
    module = em.build(network_config(NAME, None, CFG, None)[0])
    if bug_ffn is not None:
        dict(module.named_modules())[bug_ffn].register_forward_hook(lambda _m, _i, out: out * (1 + rel))
    return module


def blk_first(r, unit: str) -> str:
    return next(s for s in r.stages if s.name == unit).first_divergence()


def _void_blocks(r) -> list:
    return [s for s in r.stages if "own bound is void in float32" in (s.detail or "")]


@pytest.fixture(scope="module")
def correct():
    return V.verify(_twin(), NAME, config=CFG, dtype="float32")


def test_void_blocks_are_judged_part_by_part_and_match(correct):
    r = correct
    assert r.verdict == "match" and all(s.verdict == "match" for s in r.stages), str(r)
    void = _void_blocks(r)
    assert [s.name for s in void] and all(".blocks." in s.name for s in void), str(r)
    for s in void:
        assert [p.name for p in s.parts] == ["cpe", "attn", "mlp"], s
        assert all(p.verdict == "match" and p.err_over_bound < 1.0 for p in s.parts), s
        assert s.detail.startswith("stage-wise"), s.detail
        assert set(s.ensemble["parts"]) == {"cpe", "attn", "mlp"}, s.ensemble


def test_a_bug_in_one_blocks_ffn_diverges_at_that_part():
    """layers.1.blocks.0's FFN output times 1 + 1e-2 (no torch ensemble: the part bounds alone decide): that
    block diverges in its "mlp" part; its "cpe" and "attn" parts, and every other unit, match."""
    unit = "layers.1.blocks.0"
    r = V.verify(_twin(f"{unit}.ffn", 1e-2), NAME, config=CFG, dtype="float32", ensemble=False)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    assert blk_first(r, unit) == f"{unit}/mlp"
    blk = next(s for s in r.stages if s.name == unit)
    assert [(p.name, p.verdict) for p in blk.parts] == [("cpe", "match"), ("attn", "match"), ("mlp", "diverges")], blk
    assert "part 'mlp'" in blk.detail, blk.detail
    assert all(s.verdict == "match" for s in r.stages if s.name != unit), str(r)


def test_gradients_of_a_void_block_part_by_part_through_a_channels_first_layer_norm():
    """verify --grad, RAVLT-T reduced (official preset, channels-first blocks) in float32: layers.0.blocks.0's own
    forward bound (relative ~0.13) is void for its gradients, so its backward is judged part by part.  The parts'
    outputs are located by value among the block's tensors; the last tensor with a part's output value is the
    permuted view the next part's channels-first LayerNorm reads, whose gradient is only the norm branch's share:
    the part's cotangent is the gradient of the first tensor holding the value (the residual sum), and every part
    matches (with the view's gradient each part diverged)."""
    r = V.verify(em.build(network_config(NAME, None, {"reduced": True}, None)[0]), NAME, config={"reduced": True},
                 dtype="float32", grad=True, ensemble=False)
    g = r.gradients
    assert g["verdict"] == "match" and r.verdict == "match", str(r)
    blk = next(u for u in g["units"] if u["unit"] == "layers.0.blocks.0")
    assert "void bound" in blk["why"] and blk["verdict"] == "match", blk
    parts = blk["parts"]
    assert [p["part"] for p in parts] == ["cpe", "attn", "mlp"] and all(p["verdict"] == "match" for p in parts), parts
    assert all(p["input"].endswith("(by value)") for p in parts[1:]), parts
