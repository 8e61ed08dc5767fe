"""`refimpl verify --reference NETWORK` (refimpl.verify.networks): a released model file, in the released code's
own key names, verified against the registered network in its official preset, unit by unit.  The foreign
networks are the PyTorch twins of the equivalence suite (tests/verify_gallery/network_twins.py), in the reduced
configurations (``--config '{"reduced": true}'``); the weights are the reference's, renamed to the released
names by hand from refimpl.models.convert's layout (the inverse of convert_state_dict)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refimpl import cli, verdict
from refimpl import models as rm
from refimpl import verify as V
from refimpl.models.convert import released_layout
from refimpl.verify.networks import network_config
from tests.verify_gallery.network_twins import L2VIT_WIDE, twin

TARGET = "tests.verify_gallery.network_twins:twin"
#: (network, a block to plant a bug in) of two families with released code: RAVLT renames its blocks' norms
#: (norm1.norm.weight) and carries RoPE angle tables and BatchNorm counters; FLatten-Swin keeps our names but
#: carries the relative-position indices and the shift masks.
CASES = [("ravlt_t", "layers.2.blocks.0"), ("flatten_swin_t", "layers.1.blocks.1")]
#: The relative size of the planted porting bug (the block's output times 1 + BUG_REL): a scenario, not a
#: tolerance.  1e-6 is far above the float64 unit bounds (relative ~1e-10 for these blocks), so the verdict must
#: resolve it, and far below anything float32 could see, so only a float64 verification finds it.
BUG_REL = 1e-6


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
    """A block whose output is off by BUG_REL relative (in float64, where the unit bounds resolve it): the verdict
    diverges at that block's unit, every unit before it matched, the units after it (teacher-forced on the
    network's own inputs) match again."""
    path = tmp_path / "released.safetensors"
    _released_file(name, path)
    init = {"name": name, "bug_unit": unit, "bug_rel": BUG_REL}
    code = cli.main(["verify", TARGET, "--reference", name, "--init", json.dumps(init), "--config",
                     '{"reduced": true}', "--weights", str(path), "--dtype", "float64", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["verdict"] == "diverges" and rep["first_divergence"]["stage"] == unit, rep["stages"]
    names = [s["name"] for s in rep["stages"]]
    i = names.index(unit)
    assert all(s["ok"] for s in rep["stages"][:i]) and all(s["ok"] for s in rep["stages"][i + 1:]), rep["stages"]
    # the diverging block is judged part by part to locate the bug: its output is off, which only its last part
    # (the MLP residual step, whose output is the block's) shows; the parts before it match
    parts = [(q["name"], q["verdict"]) for q in rep["stages"][i]["parts"]]
    assert parts[-1] == ("mlp", "diverges") and all(v == "match" for _, v in parts[:-1]), parts
    assert rep["first_divergence"]["part"] == "mlp" and "first diverging part 'mlp'" in rep["first_divergence"]["why"]


def test_a_diverging_unit_whose_parts_do_not_diverge_says_so():
    """networks._located on a diverging unit: every part matching sends the divergence to how the parts compose;
    a part not judged (its input not located) is named, not passed over as matching."""
    from refimpl.verify.networks import _located
    from refimpl.verify.report import StageResult

    def unit():
        return StageResult("blocks.1", "blocks.1:output", "diverges", detail="error over the bound")

    def parts(*verdicts):
        return StageResult("blocks.1", None, "diverges", parts=[StageResult(n, None, v) for n, v in
                                                                zip(("attn", "mlp"), verdicts)])
    every = _located(unit(), parts("match", "match"))
    assert every.verdict == "diverges" and "every part matches on its own" in every.detail
    assert "how the parts compose" in every.detail and every.first_divergence() == "blocks.1"
    some = _located(unit(), parts("match", "not judged"))
    assert some.verdict == "diverges" and "every part matches" not in some.detail
    assert "no part diverges on its own" in some.detail and "not judged conclusively (mlp)" in some.detail
    first = _located(unit(), parts("diverges", "match"))
    assert "first diverging part 'attn'" in first.detail and first.first_divergence() == "blocks.1/attn"


@pytest.mark.parametrize("name,unit", CASES)
def test_a_bug_in_one_part_of_a_block_is_located_at_that_part(name, unit):
    """The attention submodule of one block off by BUG_REL relative, in float64 (the block's own bound resolves it):
    the block diverges as a whole, and judged part by part (each part teacher-forced on the port's own
    intermediates) its "attn" part diverges while the parts before it match and the MLP part after it, fed the
    port's (wrong) attention residual, matches: the report's first divergence is the block, part "attn"."""
    r = V.verify(twin(name, bug_unit=f"{unit}.attn", bug_rel=BUG_REL), name, config={"reduced": True},
                 dtype="float64", ensemble=False)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    assert r.first_divergence["part"] == "attn" and "first diverging part 'attn'" in r.first_divergence["why"]
    u = {s.name: s for s in r.stages}
    verdicts = {q.name: q.verdict for q in u[unit].parts}
    assert verdicts["attn"] == "diverges" and all(v == "match" for p, v in verdicts.items() if p != "attn"), verdicts
    assert u[unit].first_divergence() == f"{unit}/attn"
    assert all(s.verdict == "match" for n, s in u.items() if n != unit), str(r)


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
    output is off by BUG_REL relative diverges at that unit in both runs; in the shadow run every later block and
    downsampling (fed the reference's values) matches; the stem and the head have no submodule of their own.

    What the next unit receives: fed_0 = fl(o fl(1 + b)) in the propagating run (o the block's correct output,
    within the unit's largest element-wise bound B of the reference's value, the stage being "match" without the
    bug) and fed_1 = ref in the shadow run.  So fed_0 - fed_1 = b ref + (1 + b)(o - ref) + (1 + b) o delta with
    |delta| <= gamma_2(u_64), |o| <= M + B (M = max |ref|), and rel = max |fed_0 - fed_1| / M (two more
    roundings) is within (1 + b)((1 + gamma_2) B / M + gamma_2) + gamma_2 (b + that) of b."""
    module = twin(name, bug_unit=unit, bug_rel=BUG_REL)
    units = rm.family_of(name).unit_names(network_config(name, None, {"reduced": True}, None)[0])
    fed = []                                    # what the unit after the buggy one receives, in each run
    dict(module.named_modules())[units[units.index(unit) + 1]].register_forward_pre_hook(
        lambda _m, inp: fed.append(inp[0].detach().clone()))
    r = V.verify(module, name, config={"reduced": True}, dtype="float64", shadow=True)
    assert len(fed) == 2                        # propagating: the buggy block's output; shadow: the reference's
    m = float(fed[1].abs().max())
    rel = float((fed[0] - fed[1]).abs().max()) / m
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    g2 = verdict.gamma(2, verdict.unit_roundoff("float64"))
    dev = (1 + BUG_REL) * ((1 + g2) * r.stages[units.index(unit)].bound / m + g2)
    assert abs(rel - BUG_REL) <= dev + g2 * (BUG_REL + dev), (rel, dev)
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
    init = {"name": "ravlt_t", "bug_unit": "layers.0.blocks.0", "bug_rel": BUG_REL, "bug": "row_index"}
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
    # the command line asks for the twin's members (no --no-ensemble): every example's units are judged with them
    assert rep["ensemble"]["torch"] and all("twin" in s["ensemble"]["members"] for s in rep["stages"]), rep["ensemble"]
    assert good.ensemble is None or not good.ensemble.get("torch")       # the Python API's default: without


def test_ops_on_values_float32_holds_exactly_are_not_a_precision_finding():
    """The recorder reports an op computing in another dtype only where its result differs from the
    same op computed in the dtype asked.  A Swin shift mask built in torch's default float32 (zeros, labels set in
    place, rolled, cut into windows, 0 / -100) is exact; a float32 sin table, a float32 matmul of float64
    activations, a float64 activation written into a float32 buffer and a random float32 draw are not."""
    import torch

    from refimpl.verify.locate import recorder
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    other: dict = {}
    with recorder(torch.float64, set(), [], other):
        lab = torch.zeros(1, 4, 4, 1)                          # float32: torch's default dtype
        lab[:, 2:, :, :] = 1
        lab[:, :, 2:, :] += 2
        lab = torch.roll(lab, shifts=(-1, -1), dims=(1, 2)).reshape(16)
        mask = (lab[:, None] - lab[None, :]).ne(0).float() * -100.0
        idx = torch.arange(16).reshape(4, 4).float()
        y = x.reshape(2, 16)[:, :, None] + mask + idx.reshape(16)[None, None, :1]
    assert other == {} and y.dtype == torch.float64, other
    with recorder(torch.float64, set(), [], other):
        table = torch.sin(torch.arange(16) / 3.0)               # float32 values float64 does not give
        z = x.float() @ x.float()                              # an activation rounded, a float32 product
        buf = torch.zeros(2, 4, 4)
        buf[:] = x                                             # a float64 activation stored in float32
        noise = torch.rand(3)
    ops = sorted(set(other[torch.float32]))
    assert set(other) == {torch.float32} and {"sin", "float", "matmul", "__setitem__", "rand"} <= set(ops), ops
    assert "zeros" not in ops and "arange" not in ops, ops      # exact creations stay unreported
    assert table.dtype == z.dtype == buf.dtype == noise.dtype == torch.float32


def test_a_float64_swin_network_has_no_float32_finding_unless_a_block_rounds_an_activation():
    """flatten_swin_t's twin builds its shifted-window masks and padding indicators in torch's default float32:
    in a float64 run that is no finding (they hold 0, 1, region labels exactly).  A block that rounds its output
    to float32 and back is a 'dtype' finding naming the conversion, and diverges at that block."""
    r = V.verify(twin("flatten_swin_t"), "flatten_swin_t", config={"reduced": True}, dtype="float64")
    assert r.verdict == "match" and not [f for f in r.findings if f["kind"] in ("dtype", "note")], r.findings
    module = twin("flatten_swin_t")
    unit = "layers.1.blocks.1"
    dict(module.named_modules())[unit].register_forward_hook(lambda _m, _i, out: out.float().double())
    r = V.verify(module, "flatten_swin_t", config={"reduced": True}, dtype="float64")
    msgs = [f["message"] for f in r.findings if f["kind"] == "dtype"]
    assert any("compute in float32, a lower precision than the float64 asked (float)" in m for m in msgs), msgs
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)


def sized(name: str, img_size=None, bug_unit: str | None = None, calls: list | None = None):
    """The twin of the reduced ``name`` built for the image size ``img_size`` (H, W) (default: the reduced
    config's); with ``bug_unit`` that unit's output is off by BUG_REL relative at every size but the default one (a
    table computed for the default resolution).  ``calls`` collects the sizes it was built for."""
    import refimpl.twins.models as em
    from refimpl.verify.networks import size_field
    base = network_config(name, None, {"reduced": True}, None)[0]
    cfg = network_config(name, None, {"reduced": True}, None if img_size is None else tuple(img_size))[0]
    size = tuple(getattr(cfg, size_field(cfg)))
    if calls is not None:
        calls.append(size)
    module = em.build(cfg)
    if bug_unit is not None and size != tuple(getattr(base, size_field(base))):
        dict(module.named_modules())[bug_unit].register_forward_hook(lambda _m, _i, out: out * (1 + BUG_REL))
    return module


def test_examples_rebuild_a_network_built_for_one_resolution_for_each_drawn_size(monkeypatch):
    """--examples for a network with a fixed image size (Castling-DeiT: its position embedding has one
    row per patch) rebuilds both networks for each drawn size through the target's img_size keyword, and draws
    the batch and the seed too.  A port right at its default size only is found, shrunk to the smallest size."""
    kw = dict(config={"reduced": True}, dtype="float64")
    assert V.verify(sized, "castling_deit_t", init={"name": "castling_deit_t", "bug_unit": "blocks.1"},
                    **kw).verdict == "match"
    r = V.verify_examples(sized, "castling_deit_t", 4, init={"name": "castling_deit_t", "bug_unit": "blocks.1"},
                          max_side=24, **kw)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "blocks.1", str(r)
    assert r.network["image_hw"] == [8, 8] and r.network["batch"] == 1, r.network
    assert "smallest failing example of 4: image 8 x 8 (both networks rebuilt for it: img_size=(8, 8)), batch 1" \
        in r.findings[-1]["message"], r.findings
    from refimpl.verify import network_examples
    calls: list = []
    drawn: list = []
    inner = network_examples.verify_network

    def recording(module, reference, **kwargs):
        drawn.append((tuple(kwargs["hw"] or ()), kwargs.get("batch"), kwargs["seed"]))
        return inner(module, reference, **kwargs)
    monkeypatch.setattr(network_examples, "verify_network", recording)
    good = V.verify_examples(lambda **init: sized(**init, calls=calls), "castling_deit_t", 6,
                             init={"name": "castling_deit_t", "img_size": [16, 24]}, max_side=24, **kw)
    assert good.verdict == "match" and "all 6 example(s) match" in good.findings[-1]["message"], good.findings
    assert calls[0] == (16, 24) and len(set(calls)) > 2, calls            # the user's size first, then drawn ones
    assert drawn[0] == ((16, 24), None, 0) and len(drawn) == 7, drawn
    assert {d[1] for d in drawn[1:]} == {1, 2} and len({d[2] for d in drawn[1:]}) > 1, drawn  # batches, seeds
    assert all(calls[i] == d[0] for i, d in enumerate(drawn)), (calls, drawn)  # the module built for each size
    h, w = good.network["image_hw"]
    assert good.config["img_size"] == [h, w] and h % 8 == 0 and w % 8 == 0, good.config


def test_examples_refuse_a_fixed_resolution_target_without_a_size_keyword_and_size_dependent_weights(capsys):
    with pytest.raises(V.VerifyError) as exc:
        V.verify_examples(twin, "castling_deit_t", 2, init={"name": "castling_deit_t"}, config={"reduced": True})
    msg = str(exc.value)
    assert "argument 'examples'" in msg and "img_size = (32, 48)" in msg and "img_size, image_size" in msg, msg
    assert "got twin(name: 'str'" in msg and "takes none" in msg, msg
    weights = {k: v.numpy() for k, v in sized("castling_deit_t").state_dict().items()}
    with pytest.raises(V.VerifyError, match=r"argument 'weights': .* pos_embed has shape \(1, \d+, 64\), the "
                                            r"weights' \(1, 25, 64\)"):
        V.verify_examples(sized, "castling_deit_t", 3, init={"name": "castling_deit_t"}, config={"reduced": True},
                          weights=weights, max_side=16)
    with pytest.raises(V.VerifyError, match=r"argument 'init': 'img_size' expected an image size H x W .* got 'big'"):
        V.verify_examples(sized, "castling_deit_t", 2, init={"name": "castling_deit_t", "img_size": "big"},
                          config={"reduced": True})
    assert cli.main(["verify", "tests.test_verify_networks:sized", "--reference", "castling_deit_t", "--init",
                     '{"name": "castling_deit_t"}', "--examples", "2", "--max-side", "0"]) == 2
    assert "argument --max-side: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_examples_keep_a_released_checkpoints_weights_at_every_drawn_size(tmp_path, capsys):
    """FLatten-Swin's parameters do not depend on the image size: a released file (with its shift masks for
    48 x 72) is verified at its own size, then at drawn sizes with the same weights (the masks recomputed)."""
    path = tmp_path / "released.safetensors"
    _released_file("flatten_swin_t", path)
    out = tmp_path / "r.json"
    code = cli.main(["verify", "tests.test_verify_networks:sized", "--reference", "flatten_swin_t", "--init",
                     '{"name": "flatten_swin_t"}', "--config", '{"reduced": true}', "--weights", str(path),
                     "--dtype", "float64", "--examples", "2", "--max-side", "48", "--json", str(out)])
    assert code == 0, capsys.readouterr()
    rep = json.loads(out.read_text())
    # 24 x 24 would clamp stage 4's window to its 1 x 1 grid (other table shapes): only 48 x 48 keeps the weights;
    # without its derived buffers (left out at the drawn sizes) the file is in the reference's names (Swin keeps them)
    assert rep["network"]["image_hw"] == [48, 48] and rep["network"]["weights_naming"] == "reference", rep["network"]
    assert rep["verdict"] == "match" and rep["derived_buffers"] == [], rep["derived_buffers"]
    assert "all 2 example(s) match" in rep["findings"][-1]["message"], rep["findings"]


def _rewired(kind: str, stage: int = 1):
    """flatten_swin_t's twin with each block right and the network wired wrongly in ``stage``: "swap" runs its two
    blocks in the other order, "skip" never calls block 1, "drop" calls block 1 and does not use its output,
    "residual" has block 1's submodule return its residual branch only (output - input) and the network add the
    input back ("residual_ok") or not ("residual")."""
    import types

    from refimpl.twins.models.flatten import SwinBlock
    m = twin("flatten_swin_t")
    blk1 = m.layers[stage].blocks[1]
    if kind.startswith("residual"):
        blk1.forward = types.MethodType(lambda self, x: SwinBlock.forward(self, x) - x, blk1)

    def _run(self, images):
        x = self.stem(images)
        for i, st in enumerate(self.layers):
            b0, b1 = st.blocks
            if i != stage:
                x = b1(b0(x))
            elif kind == "swap":
                x = b0(b1(x))
            elif kind == "skip":
                x = b0(x)
            elif kind == "drop":
                x = b0(x)
                b1(x)
            elif kind == "residual":
                x = b1(b0(x))
            else:                                           # residual_ok
                x = b0(x)
                x = x + b1(x)
            if st.downsample is not None:
                x = st.downsample(x)
        return self.head_unit(x), None
    m._run = types.MethodType(_run, m)
    return m


@pytest.mark.parametrize("kind,unit,says", [
    ("swap", "layers.0.downsample", "receives the output of unit 'layers.1.blocks.1'"),
    ("drop", "layers.1.blocks.1", "receives the unit's own input: the unit's output is not used"),
    ("residual", "layers.1.blocks.1", "the residual around unit 'layers.1.blocks.1' is dropped")])
def test_a_wiring_bug_between_correct_units_is_a_wiring_divergence_naming_the_unit(kind, unit, says):
    """Every block of the port is right; the network feeds them wrongly.  The first divergence is a
    wiring one at the unit whose output the next unit does not receive, saying what it receives instead."""
    r = V.verify(_rewired(kind), "flatten_swin_t", config={"reduced": True}, dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    assert r.first_divergence["why"].startswith("wiring: ") and says in r.first_divergence["why"], r.first_divergence
    wiring = [f["message"] for f in r.findings if f["kind"] == "wiring"]
    assert wiring and says in wiring[0], r.findings
    ok = V.verify(_rewired("residual_ok"), "flatten_swin_t", config={"reduced": True}, dtype="float32")
    assert ok.verdict == "match" and not [f for f in ok.findings if f["kind"] == "wiring"], str(ok)


def test_a_skipped_block_that_passes_unit_wise_is_a_wiring_divergence():
    """A block whose residual branches are ~1e-3 of its input (its output projections scaled down) is, skipped,
    within its unit's float16 bound: unit-wise it matches, no unit and not the logits diverge.  Its submodule was
    never called and the next unit receives the block's own input: a wiring divergence at that block."""
    cfg = network_config("flatten_swin_t", None, {"reduced": True}, None)[0]
    params = rm.family_of("flatten_swin_t").init_params(cfg, np.random.default_rng(3))
    for k in ("attn.proj.weight", "attn.proj.bias", "mlp.fc2.weight", "mlp.fc2.bias"):
        params[f"layers.1.blocks.1.{k}"] = params[f"layers.1.blocks.1.{k}"] * 1e-3
    kw = dict(config={"reduced": True}, dtype="float16", weights=params)
    r = V.verify(_rewired("skip"), "flatten_swin_t", **kw)
    unit = "layers.1.blocks.1"
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    res = r.stages[[s.name for s in r.stages].index(unit)]
    assert "is skipped: its submodule layers.1.blocks.1 was never called" in res.detail, res.detail
    assert "(numerically: match" in res.detail and res.err_over_bound < 1, res      # unit-wise it would pass
    assert r.whole_module["verdict"] != "diverges" and [s.name for s in r.stages if s.verdict == "diverges"] == [
        unit], str(r)
    good = V.verify(twin("flatten_swin_t"), "flatten_swin_t", **kw)
    assert good.verdict != "diverges" and not [f for f in good.findings if f["kind"] == "wiring"], str(good)


def _head_rewired(name: str, kind: str):
    """``name``'s twin with every unit right and the head fed wrongly: "skip_norm" gives the classifier the
    pooled tokens without the final LayerNorm, "token" the normalised token 1 in place of the class token,
    "unit" the head the output of blocks.0 (blocks.1 computed, its output not used)."""
    import types
    m = twin(name)
    if kind == "skip_norm" and name == "flatten_swin_t":
        m.head_unit = types.MethodType(lambda self, x: self.head(x.mean(dim=(1, 2))), m)
    elif kind == "skip_norm":
        m.head_unit = types.MethodType(lambda self, x: self.head(x[:, 0]), m)
    elif kind == "token":
        m.head_unit = types.MethodType(lambda self, x: self.head(self.norm(x[:, 1])), m)
    else:
        def forward(self, images):
            x = self.blocks[0](self.stem(images))
            self.blocks[1](x)
            return self.head_unit(x)
        m.forward = types.MethodType(forward, m)
    return m


@pytest.mark.parametrize("name,kind,says", [
    ("castling_deit_t", "skip_norm", "it receives token 0 of the head's input without the head's normalisation"),
    ("castling_deit_t", "token", "it receives the head's features of token 1 of its input where the reference reads "
                                 "token 0"),
    ("castling_deit_t", "unit", "it receives the head's features of the output of unit 'blocks.0', not of the last "
                                "unit 'blocks.1'"),
    ("flatten_swin_t", "skip_norm", "it receives the mean over the grid of the head's input without the head's "
                                    "normalisation")])
def test_a_head_fed_the_wrong_tensor_is_a_wiring_divergence_naming_the_head(name, kind, says):
    """Every block right, the classifier right on what it receives, and what it receives is not the head's
    features of the last block's output: a wiring divergence at the head, naming it and what the classifier
    receives; the twin as it is has no wiring finding."""
    r = V.verify(_head_rewired(name, kind), name, config={"reduced": True}, dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "head", str(r)
    why = r.first_divergence["why"]
    assert why.startswith("wiring: unit 'head': its classifier head computes correctly") and says in why, why
    wiring = [f["message"] for f in r.findings if f["kind"] == "wiring"]
    assert len(wiring) == 1 and wiring[0].startswith("into the head: unit 'head'") and says in wiring[0], r.findings
    assert all(s.verdict == "match" for s in r.stages[:-1]), str(r)
    ok = V.verify(twin(name), name, config={"reduced": True}, dtype="float32")
    assert ok.verdict == "match" and not [f for f in ok.findings if f["kind"] == "wiring"], str(ok)


def test_the_head_wiring_bounds_accept_within_and_reject_beyond():
    """The two bounds of the head's wiring check, at their edges (Castling-DeiT reduced, float32, the head's input
    from the reference's own run, the classifier observed directly).  The classifier's output within 0.9 of its
    bound (bounds.e_linear in float32 plus in float64) at one element: it computes right, and what it receives
    (token 0 without the normalisation) is named; 1.5 of it, either sign: no wiring finding.  What it receives
    within 0.9 of the candidate's bound (the head's features of token 1: the head's bound with the identity
    classifier; the mean over the tokens: bounds.e_mean in float32 plus in float64) is named, 1.5 of it is not.
    The float32 rounding of each perturbed value moves it by at most u |value|, under a tenth of the bound (each
    bound is at least 25 u |value| here), so the two sides stay on their sides; the unperturbed float32
    evaluations are well within (named too)."""
    import dataclasses

    import torch

    from refimpl import bounds
    from refimpl.verdict import DIVERGES, round_to
    from refimpl.verify import head_wiring as hw
    from refimpl.verify.networks import _NetRun
    from refimpl.verify.report import StageResult
    cfg = network_config("castling_deit_t", None, {"reduced": True}, None)[0]
    fam = rm.family_of("castling_deit_t")
    rng = np.random.default_rng(0)
    params = {k: round_to(v, "float32") for k, v in fam.init_params(cfg, rng).items()}
    units, taps = list(fam.unit_names(cfg)), {}
    fam.run(params, round_to(rng.standard_normal((2, 3, *cfg.img_size)), "float32"), cfg, taps=taps)
    xin = taps[units[-2]]
    w, b = params["head.weight"], params["head.bias"]
    p32, p64 = bounds.Precision.of("float32"), bounds.Precision.of("float64")

    def classifier(g, s=0.0):
        o = round_to(torch.nn.functional.linear(torch.tensor(g, dtype=torch.float32), torch.tensor(
            w, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)).double().numpy(), "float32")
        if s:
            e = bounds.e_linear(g, 0 * g, w, b, p32) + bounds.e_linear(g, 0 * g, w, b, p64)
            o[0, 3] = round_to((g @ w.T + b)[0, 3] + s * e[0, 3], "float32")
        return o

    def says(g, o):
        run = _NetRun(None, {}, {}, [], {}, classifier=("head", g, o))
        out = hw._head_wiring(fam, params, cfg, units, run, xin, fam.run_unit(params, "head", xin, cfg),
                              StageResult("head", "head:output", DIVERGES), "float32")
        return None if out is None else out[1]["message"]

    tok0 = "it receives token 0 of the head's input without the head's normalisation"
    g0 = xin[:, 0].copy()
    assert tok0 in says(g0, classifier(g0)) and tok0 in says(g0, classifier(g0, 0.9))
    assert says(g0, classifier(g0, 1.5)) is None and says(g0, classifier(g0, -1.5)) is None
    sw = xin.copy()
    sw[:, [0, 1]] = xin[:, [1, 0]]
    d = xin.shape[2]        # the head with the identity classifier: its output is the features, its bound theirs
    cfg_d = dataclasses.replace(cfg, num_classes=d)
    p_d = dict(params, **{"head.weight": np.eye(d), "head.bias": np.zeros(d)})
    c1 = fam.run_unit(p_d, "head", sw, cfg_d)
    e1 = fam.unit_bound(p_d, "head", sw, cfg_d, dtype="float32").array("float32", c1.shape)
    ln = torch.nn.functional.layer_norm(torch.tensor(xin[:, 1], dtype=torch.float32), (xin.shape[2],),
                                        torch.tensor(params["norm.weight"], dtype=torch.float32),
                                        torch.tensor(params["norm.bias"], dtype=torch.float32), eps=cfg.layer_norm_eps)
    m = xin.mean(1)
    em = bounds.e_mean(xin, 0 * xin, 1, p32) + bounds.e_mean(xin, 0 * xin, 1, p64)
    for c, e, t32, what in [(c1, e1, ln.double().numpy(), "the head's features of token 1 of its input"),
                            (m, em, xin.astype(np.float32).mean(1).astype(np.float64),
                             "the mean over the tokens of the head's input")]:
        assert np.all(np.abs(t32 - c) <= e) and what in says(t32, classifier(t32)), what
        g = round_to(c + 0.9 * e, "float32")
        assert what in says(g, classifier(g)), what
        g = round_to(c + 1.5 * e, "float32")
        assert says(g, classifier(g)) is None, what


@pytest.mark.parametrize("bug", ["classifier", "norm_eps"])
def test_a_bug_inside_the_head_is_not_a_wiring_divergence(bug):
    """The classifier itself wrong (its bias off by 1e-2 relative, the features fed right), or the final norm's eps
    1e-2: an ordinary divergence at the head, no wiring finding."""
    import types
    m = twin("castling_deit_t")
    if bug == "classifier":
        m.head_unit = types.MethodType(lambda self, x: self.head(self.norm(x[:, 0])) + 1e-2 * self.head.bias, m)
    else:
        m.norm.eps = 1e-2
    r = V.verify(m, "castling_deit_t", config={"reduced": True}, dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "head", str(r)
    assert not r.first_divergence["why"].startswith("wiring") and not [
        f for f in r.findings if f["kind"] == "wiring"], str(r)


def test_a_castling_deit_file_in_the_released_names_is_verified(tmp_path, capsys):
    """Castling-DeiT's released layout (refimpl.models.convert: DeiT's frame around the released attention) is
    our naming: such a file verifies against the official network; a misspelled key is named."""
    path = tmp_path / "released.safetensors"
    renames = _released_file("castling_deit_t", path)
    assert all(r == o for r, o in renames.items()) and "blocks.1.attn.dconv.weight" in renames
    args = ["verify", TARGET, "--reference", "castling_deit_t", "--init", '{"name": "castling_deit_t"}', "--config",
            '{"reduced": true}', "--weights", str(path), "--json", str(tmp_path / "r.json")]
    assert cli.main(args) == 0, capsys.readouterr()
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["verdict"] == "match" and rep["preset"] == "official" and rep["derived_buffers"] == [], rep
    _released_file("castling_deit_t", path, misspell="blocks.0.attn.dconv.weight")
    assert cli.main(args[:-2]) == 2
    err = capsys.readouterr().err
    assert "'blocks.0.attn.dconv.weightx' (did you mean 'blocks.0.attn.dconv.weight'?)" in err, err


def _unit_case(name: str, unit: str, seed: int = 0):
    """(family, config, float32 parameters, units, index of ``unit``, its float32 input from the reference's own
    run, its reference output) of the reduced ``name``."""
    from refimpl.verdict import round_to
    cfg = network_config(name, None, {"reduced": True}, None)[0]
    fam = rm.family_of(name)
    rng = np.random.default_rng(seed)
    params = {k: round_to(v, "float32") for k, v in fam.init_params(cfg, rng).items()}
    units, taps = list(fam.unit_names(cfg)), {}
    fam.run(params, round_to(rng.standard_normal((1, 3, *cfg.img_size)), "float32"), cfg, taps=taps)
    k = units.index(unit)
    xin = round_to(taps[units[k - 1]], "float32")
    return fam, cfg, params, units, k, xin, fam.run_unit(params, unit, xin, cfg)


def test_the_residual_and_wire_checks_take_the_units_bound_and_exact_copies():
    """The network-level wiring checks of one unit (flatten_swin_t's layers.1.blocks.1, float32, the runs given
    directly).  A dropped residual: the next unit receives the submodule's output, the branch; the branch plus the
    unit's input must compute the unit by the verdict on the unit's own bound, as a submodule's output must.  The
    exact branch rounded once to float32 is named, and so is the branch off at one element by half the verdict's
    threshold there (the ensemble criterion's, in units of the element's magnitude; the former criterion,
    |branch + input - ref| <= 1e-3 |branch - ref|, refused it: too tight); twice the threshold is not named.  A
    wire is a copy (no rounding between): the next unit receiving the unit's input is named so, and receiving that
    input one rounding away (another computation, which the former 16 u tolerance took for the input) is not."""
    from refimpl import verdict as rv
    from refimpl.verdict import DIVERGES, round_to, unit_roundoff
    from refimpl.verify import networks as vn
    from refimpl.verify.report import StageResult
    u = "layers.1.blocks.1"
    fam, cfg, params, units, k, xin, r = _unit_case("flatten_swin_t", u)
    nxt, p = units[k + 1], 1e-6 / len(units)

    def says(own, nin):
        run = vn._NetRun(None, {u: xin, nxt: nin}, {u: own}, [], {})
        out = vn._wiring(fam, params, cfg, units, k, {u: u, nxt: nxt}, run, xin, r,
                         StageResult(u, f"{nxt}:input", DIVERGES), "float32", p)
        return None if out is None else out[1]["message"]

    branch = round_to(r - xin, "float32")
    dropped = f"the residual around unit {u!r} is dropped"
    assert dropped in says(branch, branch)
    bound = fam.unit_bound(params, u, xin, cfg, dtype="float32")
    rep = vn._compare(branch + xin, r, bound, lambda prm, v: fam.run_unit(prm, u, v, cfg), (params, xin), "float32",
                      u, p)
    w = rv._weights(bound, r, np.isfinite(r), "float32")        # the ensemble criterion's unit of each element
    i = np.unravel_index(int(np.argmax(w)), r.shape)
    for c, named in ((0.5, True), (2.0, False)):
        off = branch.copy()
        off[i] = round_to(np.array(branch[i] + c * rep.zmax_threshold * w[i]), "float32")
        assert (dropped in (says(off, off) or "")) == named, c
        if named:
            assert np.max(np.abs(off + xin - r)) > 1e-3 * np.max(np.abs(off - r))    # the former criterion
    own = round_to(r, "float32")                              # the unit computed right, its output not used
    assert "receives the unit's own input: the unit's output is not used" in says(own, xin.copy())
    near = round_to(xin * (1 + 2 * unit_roundoff("float32")), "float32")
    assert np.any(near != xin) and np.max(np.abs(near - xin)) <= 16 * unit_roundoff("float32") * np.max(np.abs(xin))
    assert "receives a tensor no unit computed" in says(own, near)


def test_the_head_wiring_takes_what_the_classifier_receives_as_the_features_within_their_bound(monkeypatch):
    """Whether the classifier receives the head's features is judged by their own bound (the head with the
    identity classifier in float32, plus the float64 reference's rounding), not by 16 u.  With every candidate
    made to match (so only that judgement decides): the features 0.9 of their bound off at every element are the
    features (no wiring finding; the former 16 u max|f| took them for something else: too tight), and 1.5 of it
    at the element of the smallest bound are not (a finding)."""
    from refimpl.verdict import DIVERGES, unit_roundoff
    from refimpl.verify import head_wiring as hw
    from refimpl.verify.networks import _NetRun
    from refimpl.verify.report import StageResult
    fam, cfg, params, units, k, xin, r = _unit_case("castling_deit_t", "head")
    f = hw._head_features(fam, params, cfg, xin)
    e_f = hw._features_bound(fam, params, cfg, xin, f.shape, "float32")
    assert f is not None and e_f is not None and np.all(np.isfinite(e_f))
    w, b = params["head.weight"], params["head.bias"]
    g_now: list = [None]                # what the classifier receives: the one candidate, with a finite bound
    monkeypatch.setattr(hw, "_head_candidates", lambda *a: [("any tensor", g_now[0], np.full(f.shape, 1e300))])

    def says(g):
        g_now[0] = g
        run = _NetRun(None, {}, {}, [], {}, classifier=("head", g, g @ w.T + b))
        out = hw._head_wiring(fam, params, cfg, units, run, xin, r, StageResult("head", "head:output", DIVERGES),
                              "float32")
        return None if out is None else out[1]["message"]

    sixteen_u = 16 * unit_roundoff("float32") * np.max(np.abs(f))
    inside = f + 0.9 * e_f * np.where(np.arange(f.size).reshape(f.shape) % 2, 1.0, -1.0)
    assert says(inside) is None and np.max(np.abs(inside - f)) > sixteen_u
    i = np.unravel_index(int(np.argmin(e_f)), f.shape)
    beyond = f.copy()
    beyond[i] += 1.5 * e_f[i]
    assert "it receives any tensor" in says(beyond)


# --- L2ViT's blocks part by part (refimpl.models.l2vit.unit_parts) --------------------------------------------------

def _l2vit_wide(bug_unit: str | None = None, bug_rel: float = 0.0):
    """The reduced L2ViT-T at head dim 32 (network_twins.L2VIT_WIDE), official preset."""
    return twin("l2vit_tiny", "official", config=L2VIT_WIDE, bug_unit=bug_unit, bug_rel=bug_rel)


def test_l2vit_blocks_whose_own_bound_is_void_are_judged_part_by_part():
    """The twin as the foreign network in float32: the LWA blocks' own bounds are void, so each is judged by its
    parts (CPE, window attention, second CPE, MLP), every part within its bound: the network matches."""
    r = V.verify(_l2vit_wide(), "l2vit_tiny", preset="official", config=L2VIT_WIDE, dtype="float32", ensemble=False)
    assert r.verdict == "match", str(r)
    u = {s.name: s for s in r.stages}
    for name in ("stages.0.0", "stages.1.0"):
        assert "stage-wise: the unit's own bound is void in float32" in u[name].detail, u[name].detail
        assert [(q.name, q.verdict) for q in u[name].parts] == [(p, "match") for p in ("cpe", "attn", "cpe1", "mlp")]
        assert all(q.err_over_bound < 1.0 for q in u[name].parts)
    assert u["stages.0.1"].parts is None and u["stages.0.1"].verdict == "match"     # an LGA block: its bound holds


def test_l2vit_a_bug_in_one_part_of_a_void_block_diverges_at_that_part():
    """stages.1.0's MLP output off by 1e-2 relative: invisible to the block's void bound, outside its "mlp" part's.
    The network diverges first at stages.1.0, part 'mlp'; the block's other parts and the other units match."""
    r = V.verify(_l2vit_wide("stages.1.0.mlp", 1e-2), "l2vit_tiny", preset="official", config=L2VIT_WIDE,
                 dtype="float32", ensemble=False)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "stages.1.0", str(r)
    assert "part 'mlp'" in r.first_divergence["why"], r.first_divergence
    u = {s.name: s for s in r.stages}
    assert [(q.name, q.verdict) for q in u["stages.1.0"].parts] == [("cpe", "match"), ("attn", "match"),
                                                                     ("cpe1", "match"), ("mlp", "diverges")]
    assert all(s.verdict == "match" for n, s in u.items() if n != "stages.1.0"), str(r)
