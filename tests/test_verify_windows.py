"""The verify tool on shifted-window attention and on RALA's token layout (tests/verify_gallery/swin_port.py,
rala_port.py): ports in a style we did not choose (torch.roll, their own mask construction, einsum, their own key
names) match; a shift mask off by one diverges at the stage where the mask enters (Swin: ``core``, SoftMax(Q K^T /
sqrt(d) + B + mask) V; FLatten: ``attention``), a roll in the wrong direction at ``windows``, earlier stages ok;
foreign derived buffers (the mask, the relative-position index) are compared with the recomputed ones; the layout,
window and shift are inferred from the module and can be set by ``--config``; the command line gives the same."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from refimpl import cli
from refimpl import layers
from refimpl import verify as V
from tests.verify_gallery.rala_port import PortRALA, PortRALATokens
from tests.verify_gallery.swin_port import PortShiftedFocused, PortShiftedWindowAttention, PortWindowAttentionMasked

HERE = os.path.join(os.path.dirname(__file__), "verify_gallery")
SWIN = os.path.join(HERE, "swin_port.py")
RALA = os.path.join(HERE, "rala_port.py")
SOFTMAX_STAGES = ["windows", "qkv", "core", "proj", "out"]


def _swin(bug=None, layout="tokens", **kw):
    return PortShiftedWindowAttention(16, 2, window_size=4, shift_size=2, input_resolution=(8, 8), layout=layout,
                                      bug=bug, **kw)


def _verdicts(r):
    return {s.name: s.verdict for s in r.stages}


def _before_ok(r, stage):
    """Every stage before ``stage`` matches."""
    names = [s.name for s in r.stages]
    return all(s.verdict == "match" for s in r.stages[:names.index(stage)])


@pytest.mark.parametrize("layout", ["tokens", "nhwc"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_shifted_window_port_matches(layout, dtype):
    r = V.verify(_swin(layout=layout), "softmax.window_attention", dtype=dtype)
    assert r.verdict == "match", r
    assert [s.name for s in r.stages] == SOFTMAX_STAGES and set(_verdicts(r).values()) == {"match"}
    assert r.config["window_size"] == 4 and r.config["shift"] == 2 and r.config["layout"] == layout
    assert r.config_sources["shift"] == "module attribute shift_size"
    assert r.config_sources["window_size"] == "module attribute window_size"
    assert r.config["hw"] == [8, 8]
    assert not [f for f in r.findings if f["kind"] == "derived buffer"]      # the port's own mask and index agree
    if layout == "tokens":
        assert "input_resolution" in r.config_sources["layout"] and "attn_mask" in r.derived_buffers


@pytest.mark.parametrize("layout", ["tokens", "nhwc"])
def test_mask_off_by_one_diverges_where_the_mask_enters(layout):
    r = V.verify(_swin("mask_off_by_one", layout=layout), "softmax.window_attention", dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core"
    assert _before_ok(r, "core") and _verdicts(r)["proj"] == "match"
    derived = [f["message"] for f in r.findings if f["kind"] == "derived buffer"]
    if layout == "tokens":                      # the mask is a buffer: named, with its first differing entry
        assert len(derived) == 1 and "'attn_mask'" in derived[0] and "first at (window " in derived[0]
    else:                                       # built in the forward: the stage alone finds it
        assert derived == []


def test_roll_in_the_wrong_direction_diverges_at_the_windows():
    r = V.verify(_swin("roll_direction"), "softmax.window_attention", dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "windows"
    assert r.stages[0].foreign == "to_qkv:input"
    assert r.first_divergence["why"].startswith("an exact stage (padding, cyclic shift and window partition")


def test_relative_position_index_is_compared():
    r = V.verify(_swin("index_transposed"), "softmax.window_attention", dtype="float64")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core"
    derived = [f["message"] for f in r.findings if f["kind"] == "derived buffer"]
    ours = layers.relative_position_index(4, 4)
    exchanged = (ours % 7) * 7 + ours // 7                   # rows and columns of the 7 x 7 offsets exchanged
    i, j = np.argwhere(exchanged != ours)[0]
    assert len(derived) == 1 and "'rel_index'" in derived[0] and "relative-position index" in derived[0]
    assert f"(query {i}, key {j})" in derived[0]


def test_shift_from_config_overrides_the_attribute():
    # the module shifts by 2; told the shift is 0, the windows it cuts are not the reference's
    r = V.verify(_swin(layout="nhwc"), "softmax.window_attention", config={"shift": 0}, dtype="float64")
    assert r.config["shift"] == 0 and r.config_sources["shift"] == "--config"
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "windows"
    # an unshifted module (shift_size 0) matches with the attribute read
    m = PortShiftedWindowAttention(16, 2, window_size=4, shift_size=0, layout="nhwc")
    assert V.verify(m, "softmax.window_attention", hw=(8, 12), dtype="float64").verdict == "match"


@pytest.mark.parametrize("preset", ["official", "paper"])
def test_pre_windowed_input_gets_the_shift_mask(preset):
    """Swin's WindowAttention(x, mask) on the windows of the shifted grid: the layout inferred from the forward's
    ``mask`` parameter, the mask (0 / -100, or -inf for the paper's exact exclusion) passed by the verifier; a
    module that drops the mask diverges at ``core``."""
    r = V.verify(PortWindowAttentionMasked(16, 4, 2), "softmax.window_attention", preset=preset,
                 config={"shift": 2}, hw=(8, 12), dtype="float32")
    assert r.verdict == "match", r
    assert r.config["layout"] == "windows" and "mask" in r.config_sources["layout"]
    assert [s.name for s in r.stages] == ["qkv", "core", "proj"]
    r = V.verify(PortWindowAttentionMasked(16, 4, 2, bug="ignore_mask"), "softmax.window_attention", preset=preset,
                 config={"shift": 2}, dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core" and _before_ok(r, "core")
    # unshifted (no --config shift): no mask, and dropping it changes nothing
    r = V.verify(PortWindowAttentionMasked(16, 4, 2, bug="ignore_mask"), "softmax.window_attention", preset=preset)
    assert r.verdict == "match" and r.config["shift"] == 0


def test_window_usage_errors():
    with pytest.raises(V.VerifyError, match="layout expected one of"):
        V.verify(_swin(), "softmax.window_attention", config={"layout": "nchw"})
    with pytest.raises(V.VerifyError, match="shift"):
        V.verify(_swin(layout="nhwc"), "softmax.window_attention", config={"shift": 4})


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_flatten_on_the_shifted_grid_matches(dtype):
    r = V.verify(PortShiftedFocused(32, 2), "flatten.attention", preset="paper", dtype=dtype)
    assert r.verdict == "match", r
    assert [s.name for s in r.stages] == ["windows", "qkv", "phi_q", "phi_k", "attention", "dwc_in", "dwc", "core",
                                          "proj", "out"]
    assert r.config["shift"] == 2 and r.config["shift_mask"] == "apply" and r.config["layout"] == "tokens"
    assert "(x, H, W)" in r.config_sources["layout"]


@pytest.mark.parametrize("bug, stage", [("mask_off_by_one", "attention"), ("roll_direction", "windows")])
def test_flatten_shifted_bugs_diverge_at_their_stage(bug, stage):
    r = V.verify(PortShiftedFocused(32, 2, bug=bug), "flatten.attention", preset="paper", dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == stage
    assert _before_ok(r, stage)


def test_flatten_mask_ignored_by_the_official_preset_is_found():
    # the released FLatten-Swin ignores the shift mask: a port applying it differs at the attention
    r = V.verify(PortShiftedFocused(32, 2), "flatten.attention", preset="paper", config={"shift_mask": "ignore"},
                 dtype="float64")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "attention"
    assert any("shift_mask = 'ignore'" in f["message"] for f in r.findings if f["kind"] == "config")


def test_examples_draw_grids_in_window_multiples():
    r = V.verify_examples(PortShiftedWindowAttention, "softmax.window_attention", 3, max_side=8,
                          init={"dim": 8, "num_heads": 2, "layout": "nhwc"})
    assert r.verdict == "match" and all(v % 4 == 0 for v in r.config["hw"])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_rala_token_layout_matches(dtype):
    r = V.verify(PortRALATokens(16, 2), "rala.attention", hw=(6, 4), dtype=dtype)
    assert r.verdict == "match", r
    assert r.config["layout"] == "tokens" and r.config["input_layout"] == "tokens (B, N, C)"
    assert "forward(x, H, W)" in r.config_sources["layout"]
    assert {s.name: s.foreign for s in r.stages}["proj_in"].startswith("to_qkvg:output (read as (2, 6, 4, 64))")
    # the twin runs the tokens layout (the channels-first twin between views: refimpl.verify.gradients._twin_rala):
    # the whole module's torch ensemble, and --grad against the float64 twin
    assert r.ensemble["torch"] is True, r.ensemble
    g = V.verify(PortRALATokens(16, 2), "rala.attention", hw=(6, 4), dtype=dtype, grad=True)
    assert g.verdict == "match" and g.gradients["verdict"] == "match", g
    assert g.gradients["twin_forward"]["verdict"] == "match"
    assert {t["name"] for t in g.gradients["tensors"]} == {"input", "qkvo.weight", "qkvo.bias", "lepe.weight",
                                                          "lepe.bias", "proj.weight", "proj.bias"}


def test_rala_token_layout_planted_bugs_with_gradients():
    """With --grad on the tokens layout: a backward-only bug (the output projection's weight gradient scaled by
    1.01) leaves the forward matching and diverges in that gradient only; the forward bug still diverges at the
    stage the forward tests name."""
    m = PortRALATokens(16, 2)
    m.out.weight.register_hook(lambda grad: grad * 1.01)
    r = V.verify(m, "rala.attention", hw=(6, 4), dtype="float32", grad=True)
    assert r.whole_module["verdict"] == "match" and all(s.verdict == "match" for s in r.stages), r
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges", r
    assert r.gradients["first_divergence"]["tensor"] == "proj.weight"
    assert [t["name"] for t in r.gradients["tensors"] if t["verdict"] == "diverges"] == ["proj.weight"]
    r = V.verify(PortRALATokens(16, 2, bug="softmax_axis"), "rala.attention", hw=(6, 4), dtype="float32", grad=True)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "alpha" and _before_ok(r, "alpha")
    assert r.gradients["twin_forward"]["verdict"] == "match" and r.gradients["verdict"] == "diverges"


def test_rala_token_layout_bug_and_the_channels_first_port_unchanged():
    r = V.verify(PortRALATokens(16, 2, bug="softmax_axis"), "rala.attention", hw=(6, 4))
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "alpha" and _before_ok(r, "alpha")
    r = V.verify(PortRALA(16, 2), "rala.attention", hw=(6, 4))
    assert r.verdict == "match" and r.config["layout"] == "channels_first"
    assert r.config["input_layout"] == "channels-first (B, C, H, W)"
    with pytest.raises(V.VerifyError, match="layout expected one of"):
        V.verify(PortRALATokens(16, 2), "rala.attention", config={"layout": "windows"})


def test_rala_tokens_transposed_rope_grid_shows_on_non_square_grids_only():
    # the tables built for the transposed grid are right on a square grid (the grid comes from forward(x, H, W))
    assert V.verify(PortRALATokens(16, 2, bug="rope_grid"), "rala.attention", hw=(4, 4)).verdict == "match"
    r = V.verify(PortRALATokens(16, 2, bug="rope_grid"), "rala.attention", hw=(2, 4))
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "numerator" and _before_ok(r, "numerator")


def test_cli_shifted_windows_and_rala_tokens(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["verify", f"{SWIN}:PortShiftedWindowAttention", "--reference", "softmax.window_attention",
                     "--init", '{"dim": 16, "num_heads": 2}', "--json", str(out)])
    assert code == 0
    capsys.readouterr()
    rep = json.loads(out.read_text())
    assert [s["name"] for s in rep["stages"]] == SOFTMAX_STAGES and rep["config"]["shift"] == 2
    code = cli.main(["verify", f"{SWIN}:PortShiftedWindowAttention", "--reference", "softmax.window_attention",
                     "--init", '{"dim": 16, "num_heads": 2, "bug": "mask_off_by_one"}', "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["first_divergence"]["stage"] == "core"
    assert any("attn_mask" in f["message"] for f in rep["findings"])
    code = cli.main(["verify", f"{SWIN}:PortShiftedFocused", "--reference", "flatten.attention", "--preset", "paper",
                     "--init", '{"dim": 16, "num_heads": 2, "shift_size": 0}', "--config", '{"shift": 2}',
                     "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["first_divergence"]["stage"] == "windows" and rep["config"]["shift"] == 2
    code = cli.main(["verify", f"{RALA}:PortRALATokens", "--reference", "rala.attention", "--init",
                     '{"dim": 16, "num_heads": 2}', "--hw", "4,6", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["config"]["hw"] == [4, 6] and rep["config"]["input_layout"] == "tokens (B, N, C)"
    assert cli.main(["verify", "--list"]) == 0 and "softmax.window_attention" in capsys.readouterr().out
    assert cli.main(["verify", f"{SWIN}:PortShiftedWindowAttention", "--reference", "softmax.window_attention",
                     "--init", '{"dim": 16, "num_heads": 2}', "--config", '{"shift": 7}']) == 2
    assert V.assert_matches(_swin(), "softmax.window_attention").verdict == "match"
    with pytest.raises(AssertionError, match="core"):
        V.assert_matches(_swin("mask_off_by_one"), "softmax.window_attention")


def test_a_module_scale_is_the_default_within_two_evaluations_of_d_to_the_minus_half():
    """A module's ``scale`` attribute is d^-1/2 (no ``scale`` in the configuration) when it is within the
    rounding of two float64 evaluations of it (config.ELEMENTARY_FUNCTION_ULPS u_64 each): 1 / sqrt(8), one ulp
    from 8 ** -0.5.  A scale 1e-13 relative away is the module's own and the reference uses it: float64 matches
    (the former 1e-12 tolerance took it for d^-1/2, and the reference's logits then differ by 1e-13 relative)."""
    import math
    d = 8
    assert 1 / math.sqrt(d) != d ** -0.5
    for scale, inferred in ((1 / math.sqrt(d), None), (d ** -0.5 * (1 + 1e-13), d ** -0.5 * (1 + 1e-13))):
        port = _swin()
        port.scale = scale
        r = V.verify(port, "softmax.window_attention", dtype="float64")
        assert r.config["scale"] == inferred and r.config_sources["scale"] == "module attribute scale", r.config
        assert r.verdict == "match", str(r)
