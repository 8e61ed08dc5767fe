"""The verify tool on rectangular (wh, ww) windows, Swin's padded grids and the gradients (``--grad``) of the
shifted-window layouts (tests/verify_gallery/swin_port.py).

Rectangular windows and pair shifts, from the module's attributes (a ``window_size`` tuple) or ``--config``, in
every layout: tokens (B, H W, C), channels-last, Swin's pre-windowed ``WindowAttention(x, mask)``, and FLatten's
Swin layout.  Planted porting bugs diverge where they live: the relative-position index with the axes exchanged,
or with the row stride of the other axis (right on square windows only), at ``core`` (Swin Eq. 4: where the bias
enters) with the buffer named; the padding put at the top and left at ``windows`` (Swin §3.2: exact data
movement).  The pre-windowed layout takes the windows of the zero-padded grid (Swin's block pads before
partitioning) and compares the output on the unpadded grid.  ``--grad`` runs the package's twins
(``refimpl.twins.modules.softmax.WindowAttention``, ``refimpl.twins.modules.focused.FocusedWindowAttention``)
between the layout's own data movement, square or (wh, ww) windows and (sh, sw) shifts; backward-only bugs
(forward exact) diverge at the tensor they corrupt.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from refimpl import cli
from refimpl import layers
from refimpl import verify as V
from tests.verify_gallery.swin_port import PortShiftedFocused, PortShiftedWindowAttention, PortWindowAttentionMasked

SWIN = os.path.join(os.path.dirname(__file__), "verify_gallery", "swin_port.py")
RECT = dict(window_size=(2, 4), shift_size=(1, 2))


def _rect(bug=None, layout="tokens", **kw):
    return PortShiftedWindowAttention(16, 2, input_resolution=(4, 8), layout=layout, bug=bug, **{**RECT, **kw})


def _before_ok(r, stage):
    names = [s.name for s in r.stages]
    return all(s.verdict == "match" for s in r.stages[:names.index(stage)])


def _derived(r):
    return [f["message"] for f in r.findings if f["kind"] == "derived buffer"]


@pytest.mark.parametrize("layout, hw", [("tokens", None), ("nhwc", (6, 8))])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_rectangular_window_port_matches(layout, hw, dtype):
    r = V.verify(_rect(layout=layout), "softmax.window_attention", hw=hw, dtype=dtype)
    assert r.verdict == "match", r
    assert [s.name for s in r.stages] == ["windows", "qkv", "core", "proj", "out"]
    assert tuple(r.config["window_size"]) == (2, 4) and tuple(r.config["shift"]) == (1, 2)
    assert r.config_sources["window_size"] == "module attribute window_size"
    assert not _derived(r)              # the port's own (2, 4) index and (4, 8) shift mask agree with ours


def test_rectangular_window_from_config():
    r = V.verify(_rect(layout="nhwc"), "softmax.window_attention", hw=(4, 8), dtype="float64",
                 config={"window_size": [2, 4], "shift": [1, 2]})
    assert r.verdict == "match" and r.config_sources["window_size"] == "--config"
    # told the transposed window (its table has the same (2 wh - 1)(2 ww - 1) rows): the module's windows are not
    # the reference's, found at the first stage
    r = V.verify(_rect(layout="nhwc"), "softmax.window_attention", hw=(4, 8), config={"window_size": [4, 2],
                                                                                     "shift": [2, 1]})
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "windows"
    with pytest.raises(V.VerifyError, match=r"0 <= shift < window_size on each axis"):
        V.verify(_rect(layout="nhwc"), "softmax.window_attention", hw=(4, 8), config={"shift": [2, 2]})


@pytest.mark.parametrize("bug", ["index_transposed", "index_stride"])
def test_relative_position_index_axes_diverge_at_core(bug):
    r = V.verify(_rect(bug), "softmax.window_attention", dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core" and _before_ok(r, "core")
    ours = layers.relative_position_index(2, 4)
    d = _derived(r)
    assert len(d) == 1 and "'rel_index'" in d[0] and "relative-position index of the 2 x 4 window" in d[0]
    assert f"of {ours.size} entries" in d[0]


def test_row_stride_of_the_other_axis_is_right_on_square_windows_only():
    r = V.verify(PortShiftedWindowAttention(16, 2, bug="index_stride"), "softmax.window_attention", dtype="float64")
    assert r.verdict == "match" and not _derived(r)


@pytest.mark.parametrize("bug, stage", [("mask_off_by_one", "core"), ("roll_direction", "windows")])
def test_rectangular_mask_and_roll_bugs(bug, stage):
    r = V.verify(_rect(bug), "softmax.window_attention", dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == stage and _before_ok(r, stage)
    if bug == "mask_off_by_one":
        assert any("'attn_mask'" in m and "window (2, 4), shift (1, 2)" in m for m in _derived(r))


@pytest.mark.parametrize("window, shift, hw", [((2, 4), (1, 2), (5, 7)), (4, 2, (6, 7))])
def test_padded_grid_matches_and_padding_on_the_wrong_side_diverges(window, shift, hw):
    m = PortShiftedWindowAttention(16, 2, window_size=window, shift_size=shift, layout="nhwc")
    assert V.verify(m, "softmax.window_attention", hw=hw, dtype="float32").verdict == "match"
    m = PortShiftedWindowAttention(16, 2, window_size=window, shift_size=shift, layout="nhwc", bug="pad_top_left")
    r = V.verify(m, "softmax.window_attention", hw=hw, dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "windows"
    assert r.first_divergence["why"].startswith("an exact stage (padding, cyclic shift and window partition")


@pytest.mark.parametrize("preset", ["official", "paper"])
@pytest.mark.parametrize("hw", [(4, 8), (5, 7)])
def test_pre_windowed_rectangular_and_padded(preset, hw):
    r = V.verify(PortWindowAttentionMasked(16, (2, 4), 2), "softmax.window_attention", preset=preset,
                 config={"shift": [1, 2]}, hw=hw, dtype="float32")
    assert r.verdict == "match", r
    assert r.config["layout"] == "windows" and [s.name for s in r.stages] == ["qkv", "core", "proj"]
    assert tuple(r.config["window_size"]) == (2, 4) and r.config_sources["window_size"] == "module attribute window_size"
    padded = hw != (4, 8)
    assert ("padded to 6 x 8" in r.config_sources["hw"]) == padded
    assert "shape (2, 5, 7, 16)" in r.whole_module_text if padded else "shape (2, 4, 8, 16)" in r.whole_module_text
    bad = V.verify(PortWindowAttentionMasked(16, (2, 4), 2, bug="ignore_mask"), "softmax.window_attention",
                   preset=preset, config={"shift": [1, 2]}, hw=hw, dtype="float32")
    assert bad.verdict == "diverges" and bad.first_divergence["stage"] == "core" and _before_ok(bad, "core")


def test_pre_windowed_index_stride_and_padded_input():
    r = V.verify(PortWindowAttentionMasked(16, (2, 4), 2, bug="index_stride"), "softmax.window_attention",
                 config={"shift": [1, 2]}, hw=(5, 7), dtype="float32")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core"
    assert any("'relative_position_index'" in m for m in _derived(r))
    # an input whose padded tokens are not Swin's zeros is refused, naming the argument
    x = np.random.default_rng(0).standard_normal((2 * 3 * 2, 8, 16))
    with pytest.raises(V.VerifyError, match="argument 'input': the windows of the padded 6 x 8 grid must hold zeros"):
        V.verify(PortWindowAttentionMasked(16, (2, 4), 2), "softmax.window_attention", config={"shift": [1, 2]},
                 hw=(5, 7), input=x)


@pytest.mark.parametrize("bug, verdict, stage", [(None, "match", None), ("mask_off_by_one", "diverges", "attention"),
                                                 ("roll_direction", "diverges", "windows")])
def test_flatten_rectangular_windows(bug, verdict, stage):
    r = V.verify(PortShiftedFocused(32, 2, bug=bug, **RECT), "flatten.attention", preset="paper", hw=(4, 8),
                 dtype="float32")
    assert r.verdict == verdict and (r.first_divergence or {}).get("stage") == stage
    assert tuple(r.config["window_size"]) == (2, 4) and tuple(r.config["shift"]) == (1, 2)
    if stage:
        assert _before_ok(r, stage)


def _grads(r):
    return {t["name"]: t["verdict"] for t in r.gradients["tensors"]}


@pytest.mark.parametrize("make, ref, kw", [
    (lambda: PortShiftedWindowAttention(16, 2), "softmax.window_attention", {}),
    (lambda: PortShiftedWindowAttention(16, 2, layout="nhwc"), "softmax.window_attention", {"hw": (6, 7)}),
    (lambda: PortWindowAttentionMasked(16, 4, 2), "softmax.window_attention", {"hw": (6, 7),
                                                                                "config": {"shift": 2}}),
    (lambda: PortShiftedFocused(32, 2), "flatten.attention", {"preset": "paper"}),
])
def test_grad_of_the_shifted_layouts_matches(make, ref, kw):
    r = V.verify(make(), ref, dtype="float32", grad=True, **kw)
    assert r.verdict == "match" and r.gradients["verdict"] == "match", r.gradients
    assert r.gradients["twin_forward"]["verdict"] == "match"
    assert r.gradients["twin"].endswith("WindowAttention")
    assert all(v == "match" for v in _grads(r).values())
    assert max(t["err_over_bound"] for t in r.gradients["tensors"]) < 0.01


@pytest.mark.parametrize("grad_bug, diverging", [
    ("roll_backward", {"input"}),
    ("scale_backward", {"input", "qkv.weight", "qkv.bias"}),
    ("bias_grad_index", {"relative_position_bias_table"}),
    ("bias_grad_nan", {"relative_position_bias_table"})])     # a NaN gradient is compared, not taken for a buffer
def test_backward_bugs_diverge_at_their_tensor(grad_bug, diverging):
    r = V.verify(PortShiftedWindowAttention(16, 2, layout="nhwc", grad_bug=grad_bug), "softmax.window_attention",
                 hw=(6, 8), dtype="float32", grad=True)
    assert all(s.verdict == "match" for s in r.stages) and r.whole_module["verdict"] == "match"
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges"
    assert {k for k, v in _grads(r).items() if v == "diverges"} == diverging
    assert r.gradients["first_divergence"]["tensor"] == sorted(diverging, key=lambda k: k != "input")[0]


class _HalfBackward(torch.autograd.Function):
    """The identity forward; a backward that halves the gradient (a fused kernel's missing factor)."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return 0.5 * g


def _focused_backward_bug(m):
    """``m`` (a :class:`PortShiftedFocused`) with the gradient into its DWC's input halved, the forward exact."""
    m.dwc.register_forward_pre_hook(lambda mod, args: (_HalfBackward.apply(args[0]),))
    return m


@pytest.mark.parametrize("make, ref, kw", [
    (lambda: _rect(), "softmax.window_attention", {}),
    (lambda: _rect(layout="nhwc"), "softmax.window_attention", {"hw": (5, 7)}),
    (lambda: PortWindowAttentionMasked(16, (2, 4), 2), "softmax.window_attention", {"hw": (5, 7),
                                                                                     "config": {"shift": [1, 2]}}),
    (lambda: PortShiftedFocused(32, 2, **RECT), "flatten.attention", {"preset": "paper", "hw": (4, 8)}),
    (lambda: PortShiftedFocused(32, 2, window_size=(4, 2), shift_size=(0, 1)), "flatten.attention",
     {"preset": "paper", "hw": (8, 4)}),
])
def test_grad_of_rectangular_shifted_layouts_matches(make, ref, kw):
    """``--grad`` on (wh, ww) windows and (sh, sw) shifts (one axis unshifted included): the twins take the pairs."""
    r = V.verify(make(), ref, dtype="float32", grad=True, **kw)
    assert r.verdict == "match" and r.gradients["verdict"] == "match", r.gradients
    assert r.gradients["twin_forward"]["verdict"] == "match"
    assert all(v == "match" for v in _grads(r).values())
    assert max(t["err_over_bound"] for t in r.gradients["tensors"]) < 0.01


@pytest.mark.parametrize("grad_bug, diverging", [
    ("roll_backward", {"input"}),
    ("bias_grad_index", {"relative_position_bias_table"})])
def test_rectangular_backward_bugs_diverge_at_their_tensor(grad_bug, diverging):
    """On a (2, 4) window shifted by (1, 2) on a padded grid (the twin pads and rolls each axis by its own
    amounts): the cyclic shift's backward rolled the wrong way, the table's gradient scattered with the axes
    exchanged."""
    r = V.verify(_rect(layout="nhwc", grad_bug=grad_bug), "softmax.window_attention", hw=(5, 7), dtype="float32",
                 grad=True)
    assert all(s.verdict == "match" for s in r.stages) and r.whole_module["verdict"] == "match"
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges"
    assert {k for k, v in _grads(r).items() if v == "diverges"} == diverging
    assert r.gradients["first_divergence"]["tensor"] == sorted(diverging, key=lambda k: k != "input")[0]


def test_rectangular_focused_backward_bug_diverges():
    r = V.verify(_focused_backward_bug(PortShiftedFocused(32, 2, **RECT)), "flatten.attention", preset="paper",
                 hw=(4, 8), dtype="float32", grad=True)
    assert all(s.verdict == "match" for s in r.stages) and r.whole_module["verdict"] == "match"
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges"
    assert {k for k, v in _grads(r).items() if v == "diverges"} == {"input", "qkv.weight", "qkv.bias"}
    assert r.gradients["first_divergence"]["tensor"] == "input"


def test_grad_refusals_name_why():
    with pytest.raises(V.VerifyError, match=r"every key masked.*multiple of the window"):
        V.verify(PortWindowAttentionMasked(16, 4, 2), "softmax.window_attention", preset="paper",
                 config={"shift": 2}, hw=(6, 7), grad=True)
    with pytest.raises(V.VerifyError, match=r"every key masked.*multiple of the window \(2, 4\)"):
        V.verify(PortWindowAttentionMasked(16, (2, 4), 2), "softmax.window_attention", preset="paper",
                 config={"shift": [1, 2]}, hw=(5, 7), grad=True)


def test_examples_draw_grids_in_multiples_of_each_axis():
    r = V.verify_examples(PortShiftedWindowAttention, "softmax.window_attention", 3, max_side=8,
                          init={"dim": 8, "num_heads": 2, "layout": "nhwc", **RECT})
    assert r.verdict == "match" and r.config["hw"][0] % 2 == 0 and r.config["hw"][1] % 4 == 0


def test_cli_rectangular_windows(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["verify", f"{SWIN}:PortWindowAttentionMasked", "--reference", "softmax.window_attention",
                     "--init", '{"dim": 16, "window_size": [2, 4], "num_heads": 2}', "--config", '{"shift": [1, 2]}',
                     "--hw", "5,7", "--json", str(out)])
    capsys.readouterr()
    rep = json.loads(out.read_text())
    assert code == 0 and rep["config"]["window_size"] == [2, 4] and rep["config"]["shift"] == [1, 2]
    code = cli.main(["verify", f"{SWIN}:PortShiftedWindowAttention", "--reference", "softmax.window_attention",
                     "--init", '{"dim": 16, "num_heads": 2, "layout": "nhwc", "grad_bug": "bias_grad_index"}',
                     "--hw", "8,8", "--grad", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["gradients"]["first_divergence"]["tensor"] == "relative_position_bias_table"


@pytest.mark.parametrize("window", [4, (2, 4)])
def test_padded_keys_left_unmasked_diverge_at_core_under_the_paper_preset(window):
    """Swin's released masking leaves padded keys unmasked; the paper preset (``mask_padding``) masks them.  The
    port (-100 additive, padded keys unmasked) is indistinguishable from the paper's exact exclusion on a grid of
    window multiples, and diverges where the padding mask enters, ``core``, on a padded one (unshifted: no query
    has every key masked, so the divergence is the padding mask's alone)."""
    m = PortShiftedWindowAttention(16, 2, window_size=window, shift_size=0, layout="nhwc")
    assert V.verify(m, "softmax.window_attention", preset="paper", hw=(8, 8), dtype="float64").verdict == "match"
    r = V.verify(m, "softmax.window_attention", preset="paper", hw=(6, 7), dtype="float64")
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "core" and _before_ok(r, "core")
    assert "NaN" not in r.first_divergence["why"]
    assert V.verify(m, "softmax.window_attention", preset="official", hw=(6, 7), dtype="float64").verdict == "match"
