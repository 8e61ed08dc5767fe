"""The verify tool (refimpl.verify, ``refimpl verify``) on third-party-style modules it was not written against
(tests/verify_gallery): correct ports match, planted porting bugs diverge at the stage that holds them, loading
and mapping are strict, the command line's exit codes and JSON report."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from refimpl import cli
from refimpl import verify as V
from tests.verify_gallery.flatten_port import PortFocusedAttention, PortFusedDeiT

GALLERY = os.path.join(os.path.dirname(__file__), "verify_gallery", "flatten_port.py")


def _port(bug=None, sr=2):
    return PortFocusedAttention(16, 2, sr_ratio=sr, n_kv=16 if sr == 2 else 64, bug=bug)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("sr", [1, 2])
def test_a_port_in_another_style_matches(dtype, sr):
    r = V.verify(_port(sr=sr), "flatten.attention", hw=(8, 8), dtype=dtype)
    assert r.verdict == "match" and r.first_divergence is None, str(r)
    assert all(s.verdict == "match" for s in r.stages), str(r)
    assert r.mapping["q.weight"] == "to_q.weight" and r.mapping["positional_encoding"] == "pos_emb"
    assert r.config_sources["num_heads"] == "module attribute heads"
    assert not [f for f in r.findings if f["kind"] == "config"], r.findings   # the official arithmetic


def test_a_fused_qkv_port_is_split_and_matches():
    r = V.verify(PortFusedDeiT(16, 2, n_kv=36), "flatten.attention", dtype="float32")
    assert r.verdict == "match", str(r)
    assert r.mapping["q.weight"] == "qkv.weight[0:16]" and r.mapping["kv.weight"] == "qkv.weight[16:48]"
    assert r.config["hw"] == [6, 6] and "positional encoding" in r.config_sources["hw"]
    assert {s.name: s.foreign for s in r.stages}["kv"] == "qkv:output[16:48]"


@pytest.mark.parametrize("bug,stage", [("skip_norm", "kv"), ("power", "phi_q"), ("sum_normaliser", "attention"),
                                       ("dwc_on_k", "dwc_in"), ("batch_state", "attention")])
def test_planted_porting_bugs_diverge_at_their_stage(bug, stage):
    r = V.verify(_port(bug), "flatten.attention", hw=(8, 8), dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == stage, str(r)
    names = [s.name for s in r.stages]
    assert all(s.verdict == "match" for s in r.stages[:names.index(stage)]), str(r)


def test_skipped_norm_is_named_as_wiring():
    r = V.verify(_port("skip_norm"), "flatten.attention", hw=(8, 8), dtype="float32")
    assert "not the output of stage 'norm'" in r.first_divergence["why"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_ports_match_stage_wise(dtype):
    """In half precision the whole-module bound reaches the output's size at this size (inconclusive): the
    verdict comes from the stages, the features and the attention located by value among the forward's
    tensors.  Planted bugs still diverge at their stage."""
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype=dtype)
    assert r.whole_module["verdict"] == "inconclusive" and r.verdict == "match", str(r)
    assert {s.name: s.foreign for s in r.stages}["phi_q"].endswith("(by value)")
    for bug, stage in (("skip_norm", "kv"), ("power", "phi_q"), ("dwc_on_k", "dwc_in"), ("batch_state", "attention")):
        rb = V.verify(_port(bug), "flatten.attention", hw=(8, 8), dtype=dtype)
        assert rb.verdict == "diverges" and rb.first_divergence["stage"] == stage, str(rb)


class _Extra(PortFocusedAttention):
    def __init__(self):
        super().__init__(16, 2, sr_ratio=2, n_kv=16)
        self.temperature = nn.Parameter(torch.ones(2, 1, 1))


def test_strict_mapping_names_unused_foreign_tensors_and_map_ignores_them():
    with pytest.raises(V.VerifyError, match=r"foreign tensors that map to nothing: temperature \(2, 1, 1\)"):
        V.verify(_Extra(), "flatten.attention", hw=(8, 8))
    r = V.verify(_Extra(), "flatten.attention", hw=(8, 8), map={"ignore": ["temperature"]})
    assert r.verdict == "match" and r.ignored_foreign_keys == ["temperature"]


def test_unknown_map_key_and_config_field_are_errors():
    with pytest.raises(V.VerifyError, match="'map': foreign key 'nope'"):
        V.verify(_port(), "flatten.attention", hw=(8, 8), map={"ignore": ["nope"]})
    with pytest.raises(V.VerifyError, match=r"unknown field\(s\) \['focusing'\]"):
        V.verify(_port(), "flatten.attention", hw=(8, 8), config={"focusing": 3})
    with pytest.raises(V.VerifyError, match="'reference': expected one of"):
        V.verify(_port(), "flatten.nothing")
    for kw, msg in (({"hw": (8, 0)}, "'hw': expected a pair"), ({"batch": 0}, "'batch': expected an integer"),
                    ({"dtype": "half"}, "'dtype': expected one of"), ({"seed": -1}, "'seed'"),
                    ({"preset": "released"}, "'preset': expected one of"), ({"hw": (9, 8)}, "not divisible")):
        with pytest.raises(V.VerifyError, match=msg):
            V.verify(_port(), "flatten.attention", **kw)


def _state(m):
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def test_weights_round_trip_safetensors_npz_pt(tmp_path):
    from safetensors.numpy import save_file
    src = _port()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in src.parameters():
            p.normal_(0, 0.3)
    sd = _state(src)
    files = {"w.safetensors": lambda f: save_file(sd, f), "w.npz": lambda f: np.savez(f, **sd),
             "w.pt": lambda f: torch.save(src.state_dict(), f)}
    verdicts = []
    for name, save in files.items():
        path = str(tmp_path / name)
        save(path)
        r = V.verify(_port(), "flatten.attention", hw=(8, 8), weights=path)
        verdicts.append(r.verdict)
        np.testing.assert_array_equal(r_values := V.load_weights(path)["to_q.weight"], sd["to_q.weight"])
        assert r_values.dtype == np.float64
    assert verdicts == ["match"] * 3


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch " + os.environ.get("REFIMPL_BOOM", "/tmp/refimpl_boom"),))


def test_a_checkpoint_that_needs_unpickling_is_refused_not_executed(tmp_path, monkeypatch):
    flag = tmp_path / "boom"
    monkeypatch.setenv("REFIMPL_BOOM", str(flag))
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        pickle.dump({"to_q.weight": _Boom()}, fh)
    with pytest.raises(V.VerifyError, match="arbitrary unpickling, which is refused"):
        V.load_weights(str(path))
    assert not flag.exists()
    npz = tmp_path / "evil.npz"
    np.savez(npz, a=np.array([_Boom()], dtype=object))
    with pytest.raises(V.VerifyError, match="pickled objects; refused"):
        V.load_weights(str(npz))
    assert not flag.exists()


def test_cli_exit_codes_json_and_list(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention",
                     "--init", '{"dim": 16, "heads": 2, "sr_ratio": 2, "n_kv": 16}', "--hw", "8,8",
                     "--json", str(out)])
    assert code == 0
    capsys.readouterr()
    rep = json.loads(out.read_text())
    for key in ("schema_version", "verdict", "reference", "preset", "dtype", "config", "mapping",
                "unused_foreign_keys", "missing_reference_keys", "stages", "first_divergence", "findings"):
        assert key in rep
    assert [s["name"] for s in rep["stages"]] == ["q", "sr", "norm", "kv", "phi_q", "phi_k", "attention", "dwc_in",
                                                  "dwc", "core", "proj"]
    code = cli.main(["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention",
                     "--init", '{"dim": 16, "heads": 2, "sr_ratio": 2, "n_kv": 16, "bug": "power"}',
                     "--hw", "8,8", "--json", "-"])
    assert code == 1 and json.loads(capsys.readouterr().out)["first_divergence"]["stage"] == "phi_q"
    assert cli.main(["verify", f"{GALLERY}:Nope", "--reference", "flatten.attention"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    assert cli.main(["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention",
                     "--init", "{not json"]) == 2
    assert cli.main(["verify", "--list"]) == 0 and "flatten.attention" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_an_l2vit_port_matches_and_its_bugs_diverge_at_the_core(dtype):
    from tests.verify_gallery.l2vit_port import PortL2ViTAttention
    r = V.verify(PortL2ViTAttention(32, 4), "l2vit.attention", hw=(14, 14), dtype=dtype)
    assert r.verdict == "match", str(r)
    assert r.config["scale_mode"] == "per_head" and r.mapping["temperature"] == "temperature"
    for bug in ("no_relu_k", "clamp"):
        rb = V.verify(PortL2ViTAttention(32, 4, bug=bug), "l2vit.attention", hw=(14, 14), dtype=dtype)
        assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "core", str(rb)
        assert rb.stages[0].verdict == "match"


class _Upcast(PortFocusedAttention):
    """A port that runs its features in float32 whatever it is given (a `.float()` inside)."""

    def _feature(self, t):
        return super()._feature(t.float()).to(t.dtype)


def test_a_precision_change_inside_the_module_is_a_finding():
    r = V.verify(_Upcast(16, 2, sr_ratio=2, n_kv=16), "flatten.attention", hw=(8, 8), dtype="float16")
    msgs = [f["message"] for f in r.findings if f["kind"] == "note"]
    assert any("compute in float32, a higher precision than the float16 asked" in m for m in msgs), r.findings
    assert r.verdict == "match", str(r)
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype="float32")
    assert not [f for f in r.findings if f["kind"] in ("dtype", "note")], r.findings


class _Downcast(PortFocusedAttention):
    """A port that runs its features in bfloat16 whatever it is given."""

    def _feature(self, t):
        return super()._feature(t.bfloat16()).to(t.dtype)


def test_a_lower_precision_inside_the_module_is_a_finding_and_diverges():
    r = V.verify(_Downcast(16, 2, sr_ratio=2, n_kv=16), "flatten.attention", hw=(8, 8), dtype="float32")
    assert any("bfloat16, a lower precision" in f["message"] for f in r.findings if f["kind"] == "dtype")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "phi_q", str(r)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_a_rala_port_matches_and_its_bugs_diverge_at_their_stage(dtype):
    """RALA as released, ported in another style (tests/verify_gallery/rala_port.py), on a non-square grid:
    the reweighting softmax over the wrong axis diverges at "alpha", RoPE tables built for the transposed
    grid at "numerator"; the stages before are matched."""
    from tests.verify_gallery.rala_port import PortRALA
    r = V.verify(PortRALA(16, 2), "rala.attention", hw=(8, 6), dtype=dtype)
    assert r.verdict == "match", str(r)
    assert r.mapping["qkvo.weight"] == "to_qkvg.weight" and r.mapping["lepe.weight"] == "pos.weight"
    for bug, stage in (("softmax_axis", "alpha"), ("rope_grid", "numerator")):
        rb = V.verify(PortRALA(16, 2, bug=bug), "rala.attention", hw=(8, 6), dtype=dtype)
        assert rb.verdict == "diverges" and rb.first_divergence["stage"] == stage, str(rb)
        names = [x.name for x in rb.stages]
        assert all(x.verdict == "match" for x in rb.stages[:names.index(stage)]), str(rb)


def test_examples_find_a_bug_that_only_shows_on_non_square_grids(capsys):
    """RoPE tables built for the transposed grid are right on every square grid: the default 8 x 8 matches,
    and --examples draws grids until a non-square one diverges, shrunk to the smallest."""
    from tests.verify_gallery.rala_port import PortRALA
    init = {"dim": 16, "num_heads": 2, "bug": "rope_grid"}
    assert V.verify(PortRALA, "rala.attention", init=init).verdict == "match"
    r = V.verify_examples(PortRALA, "rala.attention", 8, init=init, max_side=4)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "numerator", str(r)
    h, w = r.config["hw"]
    assert h != w and min(h, w) == 1 and max(h, w) == 2, r.config["hw"]
    good = V.verify_examples(PortRALA, "rala.attention", 3, init={"dim": 16, "num_heads": 2}, max_side=4)
    assert good.verdict == "match" and "all 3 example(s) match" in good.findings[-1]["message"]
    code = cli.main(["verify", f"{os.path.join(os.path.dirname(GALLERY), 'rala_port.py')}:PortRALA",
                     "--reference", "rala.attention", "--init", json.dumps(init), "--examples", "4", "--json", "-"])
    assert code == 1 and json.loads(capsys.readouterr().out)["first_divergence"]["stage"] == "numerator"
    with pytest.raises(V.VerifyError, match="needs the module's class or factory"):
        V.verify_examples(PortRALA(16, 2), "rala.attention", 3)


def test_markdown_report(tmp_path):
    out = tmp_path / "r.md"
    code = cli.main(["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention",
                     "--init", '{"dim": 16, "heads": 2, "sr_ratio": 2, "n_kv": 16, "bug": "power"}', "--hw", "8,8",
                     "--report", str(out)])
    text = out.read_text()
    assert code == 1 and "First divergence: stage `phi_q`" in text and "| phi_q |" in text
    assert ("![error over bound per stage](r.png)" in text) == (tmp_path / "r.png").exists()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_castling_port_matches_and_its_bugs_diverge_at_the_core(dtype):
    """Castling-ViT's attention as released, ported in another style; the angular kernel without 1/pi, the
    token convolution applied to Q, and Q and K left without unit rows all diverge at the core."""
    from tests.verify_gallery.castling_port import PortCastling
    r = V.verify(PortCastling(32, 4), "castling.attention", hw=(14, 14), dtype=dtype)
    assert r.verdict == "match" and r.config["conv"] == "tokens1d" and r.config["conv_kernel"] == 9, str(r)
    assert r.mapping["dconv.weight"] == "token_conv.weight"
    for bug in ("no_pi", "conv_on_q", "no_unit_rows"):
        rb = V.verify(PortCastling(32, 4, bug=bug), "castling.attention", hw=(14, 14), dtype=dtype)
        assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "core", str(rb)


def test_split_q_k_v_projections_are_joined_for_a_fused_reference():
    from tests.verify_gallery.l2vit_port import PortL2ViTSplit
    r = V.verify(PortL2ViTSplit(32, 4), "l2vit.attention", hw=(6, 6), dtype="float32")
    assert r.verdict == "match", str(r)
    assert r.mapping["qkv.weight"] == "query.weight + key.weight + value.weight"
    assert {s.name: s.foreign for s in r.stages}["qkv"] == "query+key+value:output"
    rb = V.verify(PortL2ViTSplit(32, 4, bug="no_relu_k"), "l2vit.attention", hw=(6, 6), dtype="float32")
    assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "core", str(rb)


def test_a_swin_layout_window_module_is_verified_on_its_windows():
    """FLatten-Swin's attention as released runs on windows (B nW, ws^2, C) and ignores the shift mask: each
    window is the global layout on a ws x ws grid, so ``flatten.attention`` verifies it with the windows as the
    batch and ``call={}`` (forward(x)); the grid comes from its positional encoding."""
    from tests.verify_gallery.flatten_port import PortWindowAttention
    r = V.verify(PortWindowAttention(96, 7, 3), "flatten.attention", call={}, batch=8, dtype="float16")
    assert r.verdict == "match" and r.config["hw"] == [7, 7], str(r)
    rb = V.verify(PortWindowAttention(96, 7, 3, bug="batch_state"), "flatten.attention", call={}, batch=8,
                  dtype="float16")
    assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "attention", str(rb)


def test_floating_buffers_are_derived_data_judged_by_their_stages():
    """RoPE tables registered as buffers have no reference key: they are listed as derived (not an error) and
    keep their values (not redrawn); tables built for the transposed grid diverge at the numerator."""
    from tests.verify_gallery.rala_port import PortRALABuffers
    r = V.verify(PortRALABuffers(16, 2), "rala.attention", hw=(8, 6))
    assert r.verdict == "match" and {"rope_cos", "rope_sin"} <= set(r.derived_buffers), str(r)
    rb = V.verify(PortRALABuffers(16, 2, bug="stale_tables"), "rala.attention", hw=(8, 6))
    assert rb.verdict == "diverges" and rb.first_divergence["stage"] == "numerator", str(rb)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("linear", [False, True])
def test_a_lisa_port_matches_and_its_bugs_diverge_at_their_stage(dtype, linear):
    """LiSA ported in another style (tests/verify_gallery/lisa_port.py: split q/k/v, fft2 of the kernel placed at
    its offsets, Gb by a dense Toeplitz / circulant matrix), circular kernels (Eq. 10) or Toeplitz parameters
    (Eq. 9, zero-padded FFTs), on a non-square grid that the module fixes.  In half precision the port's FFTs run
    in float32 (torch has none in half on the CPU) and round once; the whole-module bound is then void and the
    verdict comes from the stages.  Each planted bug diverges at its stage, the stages before it matched."""
    from tests.verify_gallery.lisa_port import PortLiSA
    r = V.verify(PortLiSA(8, 2, (4, 3), 3, linear=linear), "lisa.attention", dtype=dtype)
    assert r.verdict == "match" and r.preset == "paper", str(r)
    assert all(s.verdict == "match" for s in r.stages), str(r)
    assert r.config["exact_toeplitz"] is linear and r.config["latent"] == 3 and r.config["hw"] == [4, 3]
    assert r.config_sources["hw"] == "module attribute resolution" and "rows" in r.config_sources["exact_toeplitz"]
    assert r.mapping["weight_a"] == "k_kernel" and r.mapping["bias_b"] == "v_bias"
    assert r.mapping["qkv.weight"] == "query.weight + key.weight + value.weight"
    assert all({s.name: s.foreign for s in r.stages}[n].endswith("(by value)") for n in ("qn", "kn", "ga", "gb"))
    assert any("exact_toeplitz = True" in f["message"] for f in r.findings if f["kind"] == "config") == linear
    bugs = [("l2_tokens", "qn"), ("mirror", "ga"), ("bias_swap", "ga"), ("gb_transposed", "gb")]
    for bug, stage in bugs + ([("circular", "ga")] if linear else []):
        rb = V.verify(PortLiSA(8, 2, (4, 3), 3, linear=linear, bug=bug), "lisa.attention", dtype=dtype)
        assert rb.verdict == "diverges" and rb.first_divergence["stage"] == stage, (bug, str(rb))
        names = [x.name for x in rb.stages]
        assert all(x.verdict == "match" for x in rb.stages[:names.index(stage)]), (bug, str(rb))


def test_lisa_reference_is_listed_defaults_to_the_paper_preset_and_names_bad_arguments(capsys):
    from tests.verify_gallery.lisa_port import PortLiSA
    assert cli.main(["verify", "--list"]) == 0 and "lisa.attention" in capsys.readouterr().out
    path = os.path.join(os.path.dirname(GALLERY), "lisa_port.py")
    code = cli.main(["verify", f"{path}:PortLiSA", "--reference", "lisa.attention", "--init",
                     '{"dim": 8, "heads": 2, "bug": "mirror"}', "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["preset"] == "paper" and rep["first_divergence"]["stage"] == "ga"
    with pytest.raises(V.VerifyError, match=r"'preset': expected one of \('paper',\)"):
        V.verify(PortLiSA(8, 2), "lisa.attention", preset="official")
    with pytest.raises(V.VerifyError, match=r"k_kernel has 12 rows; on the grid \(5, 5\)"):
        V.verify(PortLiSA(8, 2), "lisa.attention", hw=(5, 5))
    r = V.verify(PortLiSA(8, 2, (3, 3), 2), "lisa.attention", config={"transform": "fft"}, dtype="float32")
    assert r.verdict == "match" and r.config_sources["transform"] == "--config", str(r)


def test_shadow_mode_locates_a_bug_inside_a_submodule_without_propagation():
    """shadow=True: every submodule computing a stage is also run on the reference's own input to it (rounded to
    the dtype) and judged against that stage.  A port whose reduction LayerNorm has TensorFlow's epsilon (a bug
    inside the submodule of stage 'norm'): the propagating run and the shadow run both diverge first at 'norm';
    in the shadow run the later stages computed by submodules (kv, dwc, proj) match.  A wiring bug (the
    LayerNorm's output not used) is a divergence of the propagating run only: its submodules compute correctly."""
    r = V.verify(_port("norm_eps"), "flatten.attention", hw=(8, 8), dtype="float32", shadow=True)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "norm", str(r)
    assert r.shadow_first_divergence["stage"] == "norm", str(r)
    names = [s.name for s in r.stages]
    shadow = {s.name: s.verdict for s in r.shadow}
    assert [s.name for s in r.shadow] == names
    i = names.index("norm")
    assert {shadow[n] for n in names[:i]} == {"match"}, str(r)
    assert [n for n in names[i + 1:] if shadow[n] != "not shadowed"] == ["kv", "dwc", "proj"], str(r)
    assert all(shadow[n] == "match" for n in ("kv", "dwc", "proj")), str(r)
    assert shadow["phi_q"] == "not shadowed" and "located by value" in r.shadow[names.index("phi_q")].detail
    d = r.as_dict()
    assert d["schema_version"] == V.SCHEMA_VERSION == 5 and d["shadow"] is True
    assert d["shadow_first_divergence"]["stage"] == "norm" and d["stages"][i]["shadow"]["verdict"] == "diverges"
    rw = V.verify(_port("skip_norm"), "flatten.attention", hw=(8, 8), dtype="float32", shadow=True)
    assert rw.first_divergence["stage"] == "kv" and rw.shadow_first_divergence is None, str(rw)
    assert {s.name: s.verdict for s in rw.shadow}["kv"] == "match"
    plain = V.verify(_port("norm_eps"), "flatten.attention", hw=(8, 8), dtype="float32")
    assert plain.shadow is None and plain.as_dict()["shadow"] is False and plain.as_dict()["stages"][0]["shadow"] is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_shadow_mode_matches_correct_ports(dtype):
    """Correct ports match in shadow mode, fused and joined projections included (the fused qkv's rows, the
    split q / k / v projections concatenated)."""
    from tests.verify_gallery.l2vit_port import PortL2ViTSplit
    for module, ref, kw, shadowed in (
            (_port(), "flatten.attention", {"hw": (8, 8)}, {"q", "sr", "norm", "kv", "dwc", "proj"}),
            (PortFusedDeiT(16, 2, n_kv=36), "flatten.attention", {}, {"q", "kv", "dwc", "proj"}),
            (PortL2ViTSplit(32, 4), "l2vit.attention", {"hw": (6, 6)}, {"qkv", "proj"})):
        r = V.verify(module, ref, dtype=dtype, shadow=True, **kw)
        assert r.verdict == "match" and r.shadow_first_divergence is None, str(r)
        assert {s.name for s in r.shadow if s.verdict != "not shadowed"} == shadowed, str(r)
        assert all(s.verdict == "match" for s in r.shadow if s.name in shadowed), str(r)


def test_cli_shadow_flag(tmp_path, capsys):
    init = {"dim": 16, "heads": 2, "sr_ratio": 2, "n_kv": 16}
    base = ["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention", "--hw", "8,8", "--shadow"]
    out = tmp_path / "r.json"
    assert cli.main(base + ["--init", json.dumps(init), "--json", str(out)]) == 0
    assert "shadow" in capsys.readouterr().out             # the table has the shadow column
    rep = json.loads(out.read_text())
    assert rep["shadow"] is True and rep["shadow_first_divergence"] is None
    assert {s["name"]: s["shadow"]["verdict"] for s in rep["stages"]}["norm"] == "match"
    md = tmp_path / "r.md"
    code = cli.main(base + ["--init", json.dumps({**init, "bug": "norm_eps"}), "--json", "-", "--report", str(md)])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["first_divergence"]["stage"] == "norm" and rep["shadow_first_divergence"]["stage"] == "norm"
    text = md.read_text()
    assert "Shadow mode: first divergence: stage `norm`" in text and "| shadow | shadow err / bound |" in text
    assert cli.main(base + ["--init", json.dumps({**init, "bug": "norm_eps"})]) == 1
    assert "shadow mode, first divergence" in capsys.readouterr().out
