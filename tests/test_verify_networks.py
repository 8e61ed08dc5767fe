"""`refimpl verify --reference NETWORK` (refimpl.verify.networks): a released model file, in the released code's
own key names, verified against the registered network in its official preset, unit by unit.  The foreign
networks are the PyTorch twins of the equivalence suite (tests/verify_gallery/network_twins.py), in the reduced
configurations (``--config '{"reduced": true}'``); the weights are the reference's, renamed to the released
names by hand from refimpl.models.convert's layout (the inverse of convert_state_dict)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refimpl import cli
from refimpl import models as rm
from refimpl import verify as V
from refimpl.models.convert import released_layout
from refimpl.verify.networks import network_config
from tests.verify_gallery.network_twins import twin

TARGET = "tests.verify_gallery.network_twins:twin"
#: (network, a block to plant a bug in) of two families with released code: RAVLT renames its blocks' norms
#: (norm1.norm.weight) and carries RoPE angle tables and BatchNorm counters; FLatten-Swin keeps our names but
#: carries the relative-position indices and the shift masks.
CASES = [("ravlt_t", "layers.2.blocks.0"), ("flatten_swin_t", "layers.1.blocks.1")]


def _released_file(name: str, path, seed: int = 7, misspell: str | None = None) -> dict:
    """The reference's random weights of the reduced ``name`` saved under the released code's key names, with
    the derived buffers a released state_dict carries (float32, as released); returns {released: ours}."""
    from safetensors.numpy import save_file
    cfg = network_config(name, None, {"reduced": True}, None)[0]
    params = rm.family_of(name).init_params(cfg, np.random.default_rng(seed))
    layout = released_layout(cfg)
    sd = {rel: params[ours].astype(np.float32) for rel, ours in layout.renames.items()}
    for k, buf in layout.derived.items():
        sd[k] = (np.array(0, dtype=np.int64) if buf.kind == "counter" else
                 buf.value.astype(np.int64) if buf.kind == "index" else buf.value.astype(np.float32))
    if misspell is not None:
        sd[misspell + "x"] = sd.pop(misspell)
    save_file(sd, str(path))
    return dict(layout.renames)


@pytest.mark.parametrize("name,_unit", CASES)
def test_a_released_checkpoint_is_verified_against_the_official_network(name, _unit, tmp_path, capsys):
    path = tmp_path / "released.safetensors"
    renames = _released_file(name, path)
    out = tmp_path / "r.json"
    code = cli.main(["verify", TARGET, "--reference", name, "--init", json.dumps({"name": name}),
                     "--config", '{"reduced": true}', "--weights", str(path), "--json", str(out)])
    assert code == 0, capsys.readouterr()
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "match" and rep["preset"] == "official" and rep["first_divergence"] is None
    units = rm.family_of(name).unit_names(network_config(name, None, {"reduced": True}, None)[0])
    assert [s["name"] for s in rep["stages"]] == units and all(s["ok"] for s in rep["stages"]), rep["stages"]
    net = rep["network"]
    assert net["weights_naming"] == "released" and net["units"] == units and net["batch"] == 1
    assert net["renames"] == {r: o for r, o in renames.items() if r != o}
    for rel, ours in renames.items():             # every rename is in the mapping (reference key -> file key)
        assert rep["mapping"][ours] == rel
    if name == "ravlt_t":
        assert rep["mapping"]["layers.0.blocks.0.norm1.weight"] == "layers.0.blocks.0.norm1.norm.weight"
        assert any("released name" in d for d in rep["mapping_decisions"])
        assert "layers.0.RoPE.angle" in rep["derived_buffers"]
    else:
        assert "layers.0.blocks.1.attn_mask" in rep["derived_buffers"]


@pytest.mark.parametrize("name,unit", CASES)
def test_a_bug_in_one_block_diverges_at_that_unit(name, unit, tmp_path, capsys):
    """A block whose output is off by 1e-6 relative (in float64, where the unit bounds resolve it): the verdict
    diverges at that block's unit, every unit before it matched, the units after it (teacher-forced on the
    network's own inputs) match again."""
    path = tmp_path / "released.safetensors"
    _released_file(name, path)
    init = {"name": name, "bug_unit": unit, "bug_rel": 1e-6}
    code = cli.main(["verify", TARGET, "--reference", name, "--init", json.dumps(init), "--config",
                     '{"reduced": true}', "--weights", str(path), "--dtype", "float64", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["verdict"] == "diverges" and rep["first_divergence"]["stage"] == unit, rep["stages"]
    names = [s["name"] for s in rep["stages"]]
    i = names.index(unit)
    assert all(s["ok"] for s in rep["stages"][:i]) and all(s["ok"] for s in rep["stages"][i + 1:]), rep["stages"]


def test_a_misspelled_checkpoint_key_is_named(tmp_path, capsys):
    path = tmp_path / "released.safetensors"
    _released_file("ravlt_t", path, misspell="layers.1.blocks.0.norm2.norm.bias")
    code = cli.main(["verify", TARGET, "--reference", "ravlt_t", "--init", '{"name": "ravlt_t"}', "--config",
                     '{"reduced": true}', "--weights", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "'layers.1.blocks.0.norm2.norm.biasx'" in err, err
    assert "did you mean 'layers.1.blocks.0.norm2.norm.bias'" in err


def test_random_weights_list_and_usage_errors(capsys):
    """Without --weights the reference's init_params are drawn from the seed (the module's own naming); the
    networks are listed with their presets; configuration problems exit 2."""
    r = V.verify(twin("l2vit_tiny"), "l2vit_tiny", config={"reduced": True}, progress=True)
    assert r.verdict == "match" and r.as_dict()["network"]["weights_naming"] == "random (init_params)", str(r)
    assert r.stages[0].name == "stem" and r.stages[-1].name == "head"
    r = V.verify(twin("lisanet_i_t"), "lisanet_i_t", config={"reduced": True})
    assert r.verdict == "match" and r.preset == "paper", str(r)          # no released code: the paper preset
    assert cli.main(["verify", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "ravlt_t: network" in listed and "flatten_swin_t: network" in listed
    with pytest.raises(V.VerifyError, match=r"unknown field\(s\) \['depthz'\]"):
        V.verify(twin("ravlt_t"), "ravlt_t", config={"depthz": 1})
    with pytest.raises(V.VerifyError, match=r"'preset': expected one of \('paper',\)"):
        V.verify(twin("lisanet_i_t"), "lisanet_i_t", preset="official", config={"reduced": True})
    with pytest.raises(V.VerifyError, match="built for one resolution"):
        V.verify_examples(twin, "flatten_swin_t", 2, init={"name": "flatten_swin_t"}, config={"reduced": True})


def test_a_checkpoint_in_the_reference_naming_and_map_renames(tmp_path):
    """A .pt state_dict in our own naming (the twin's, with BatchNorm counters) is read as it is; a misspelled key
    is named with "did you mean", and --map renames it."""
    import torch
    src = twin("ravlt_t")
    sd = src.state_dict()
    sd["layers.0.blocks.0.norm1.weigth"] = sd.pop("layers.0.blocks.0.norm1.weight")
    path = str(tmp_path / "w.pt")
    torch.save(sd, path)
    with pytest.raises(V.VerifyError, match=r"unknown 'layers.0.blocks.0.norm1.weigth' \(did you mean "
                                            r"'layers.0.blocks.0.norm1.weight'\?\)"):
        V.verify(twin("ravlt_t"), "ravlt_t", config={"reduced": True}, weights=path)
    r = V.verify(twin("ravlt_t"), "ravlt_t", config={"reduced": True}, weights=path,
                 map={"rename": {"layers.0.blocks.0.norm1.weigth": "layers.0.blocks.0.norm1.weight"}})
    assert r.verdict == "match" and r.as_dict()["network"]["weights_naming"] == "reference", str(r)
    assert any("the user's rename" in d for d in r.mapping_decisions)


@pytest.mark.parametrize("name,unit", CASES)
def test_shadow_mode_names_the_buggy_unit_and_later_units_match(name, unit):
    """shadow=True: each unit's submodule is also run on the reference's own input to the unit.  A block whose
    output is off by 1e-6 relative diverges at that unit in both runs; in the shadow run every later block and
    downsampling (fed the reference's values) matches; the stem and the head have no submodule of their own."""
    module = twin(name, bug_unit=unit, bug_rel=1e-6)
    units = rm.family_of(name).unit_names(network_config(name, None, {"reduced": True}, None)[0])
    fed = []                                    # what the unit after the buggy one receives, in each run
    dict(module.named_modules())[units[units.index(unit) + 1]].register_forward_pre_hook(
        lambda _m, inp: fed.append(inp[0].detach().clone()))
    r = V.verify(module, name, config={"reduced": True}, dtype="float64", shadow=True)
    assert len(fed) == 2                        # propagating: the buggy block's output; shadow: the reference's
    rel = float((fed[0] - fed[1]).abs().max() / fed[1].abs().max())
    assert 1e-7 < rel < 2e-6, rel
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    assert r.shadow_first_divergence["stage"] == unit, str(r)
    names = [s.name for s in r.stages]
    assert [s.name for s in r.shadow] == names
    i = names.index(unit)
    sh = [s.verdict for s in r.shadow]
    assert sh[0] == sh[-1] == "not shadowed" and set(sh[1:i]) == set(sh[i + 1:-1]) == {"match"}, str(r)
    assert r.as_dict()["stages"][i]["shadow"]["verdict"] == "diverges"
    good = V.verify(twin("ravlt_t"), "ravlt_t", config={"reduced": True}, dtype="float64", shadow=True)
    assert good.verdict == "match" and good.shadow_first_divergence is None, str(good)


def test_examples_draw_image_sizes_and_find_a_bug_that_only_shows_on_non_square_grids(capsys):
    """--examples for a network: image sizes drawn by Hypothesis from the seed (multiples of the network's step).
    A block that computes each token's grid row as index // H instead of // W is right on every square grid: a
    16 x 16 image matches, and the drawn sizes diverge at that block, shrunk to a non-square image; a correct
    network matches on every drawn size."""
    init = {"name": "ravlt_t", "bug_unit": "layers.0.blocks.0", "bug_rel": 1e-6, "bug": "row_index"}
    kw = dict(config={"reduced": True}, dtype="float64")
    assert V.verify(twin, "ravlt_t", init=init, hw=(16, 16), **kw).verdict == "match"
    r = V.verify_examples(twin, "ravlt_t", 6, init=init, max_side=8, **kw)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "layers.0.blocks.0", str(r)
    h, w = r.network["image_hw"]
    assert h != w and "smallest failing example" in r.findings[-1]["message"], (r.network["image_hw"], r.findings)
    good = V.verify_examples(twin, "ravlt_t", 3, init={"name": "ravlt_t"}, max_side=8, **kw)
    assert good.verdict == "match" and "all 3 example(s) match" in good.findings[-1]["message"]
    code = cli.main(["verify", TARGET, "--reference", "ravlt_t", "--init", '{"name": "ravlt_t"}', "--config",
                     '{"reduced": true}', "--dtype", "float64", "--examples", "2", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and "all 2 example(s) match" in rep["findings"][-1]["message"], rep["findings"]
