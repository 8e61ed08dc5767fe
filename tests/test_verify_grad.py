"""Gradient verification (``refimpl verify --grad``, ``verify(..., grad=True)``; docs/verify.md "Gradients"): the
foreign module's input and parameter gradients for a random cotangent against the gradients of refimpl's float64
PyTorch twin, after the twin's forward is checked against the NumPy reference.  Correct ports of two families
match in float32 and float64; ports whose custom ``torch.autograd.Function`` has a planted backward bug (forward
exact) diverge in the gradient section while every forward stage matches; the command line's exit codes."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from refimpl import cli, config
from refimpl import verify as V
from refimpl.verify import gradients as G
from refimpl.verify.networks import network_config
from tests.test_bound_tightness import TIGHTNESS_MARGIN
from tests.verify_gallery.castling_port import PortCastling
from tests.verify_gallery.grad_port import GradCastling, GradL2ViT
from tests.verify_gallery.l2vit_port import PortL2ViTAttention

GRAD_PORT = os.path.join(os.path.dirname(__file__), "verify_gallery", "grad_port.py")
HW = (6, 6)

#: The correct ports' largest err/bound over their gradient tensors, measured with the calls below (docs/verify.md
#: "Gradients", seed 0, dim 16, 2 heads): a measurement, not a tolerance.  Checked as test_bound_tightness checks
#: the error calculus: safe (each ratio within TIGHTNESS_MARGIN of its measured value from above: a port that got
#: worse, or a bound that got tighter than its errors, fails) and as tight as measured (the largest ratio at least
#: the measured one / TIGHTNESS_MARGIN: a gradient bound loosened tenfold fails).  Castling-ViT in float64 is 0:
#: its float64 gradients equal the twin's bit for bit.
GRAD_MEASURED = {("l2vit", "float32"): 2.48e-3, ("l2vit", "float64"): 3.62e-4,
                 ("castling", "float32"): 3.36e-4, ("castling", "float64"): 0.0,
                 ("rala", "float32"): 3.56e-4, ("flatten", "float32"): 8.73e-5, ("lisa", "float32"): 2.43e-4}


#: Forward relative bounds (``forward_relative_bound``: rho_T + rho_64 of the bound a gradient's propagated part
#: builds on, the error model's output and not a tolerance), measured with the calls below (reduced networks, the
#: twins as the foreign networks, seed 0; docs/verify.md "Gradients"), per unit and per part ("unit/part"): the
#: units whose own bound is void for their gradients (RAVLT's layers.0.blocks.0, Castling-DeiT's blocks, L2ViT's
#: LWA blocks and the paper's stages.0.1) and their parts' far smaller ones.  Checked within TIGHTNESS_MARGIN of the
#: measured value from both sides (:func:`_near`): a unit or part bound loosened (or tightened) fourfold fails.
FORWARD_RELATIVE = {
    ("ravlt_t", "float32"): {
        "stem": 6.13e-3, "layers.0.blocks.0": 0.126, "layers.0.downsample": 2.90e-5, "layers.1.blocks.0": 0.0292,
        "layers.1.downsample": 2.51e-5, "layers.2.blocks.0": 0.0430, "layers.2.downsample": 5.56e-5,
        "layers.3.blocks.0": 2.05e-3, "head": 2.99e-5,
        "layers.0.blocks.0/cpe": 9.07e-7, "layers.0.blocks.0/attn": 4.55e-4, "layers.0.blocks.0/mlp": 8.55e-5},
    ("ravlt_t", "float64"): {
        "stem": 4.57e-11, "layers.0.blocks.0": 9.50e-10, "layers.0.downsample": 2.16e-13, "layers.1.blocks.0": 2.21e-10,
        "layers.1.downsample": 1.87e-13, "layers.2.blocks.0": 3.41e-10, "layers.2.downsample": 4.15e-13,
        "layers.3.blocks.0": 1.53e-11, "head": 2.23e-13},
    ("castling_deit_t", "float32"): {
        "stem": 3.87e-5, "blocks.0": 0.445, "blocks.1": 0.190, "head": 2.78e-5,
        "blocks.0/attn": 2.04e-3, "blocks.0/mlp": 2.44e-4, "blocks.1/attn": 1.40e-3, "blocks.1/mlp": 1.91e-4},
    ("l2vit_tiny/official", "float32"): {
        "stem": 3.39e-4, "stages.0.0": 0.338, "stages.0.1": 0.0172, "downsample_layers.1": 6.48e-5,
        "stages.1.0": 0.802, "stages.1.1": 0.0171, "head": 8.07e-5,
        "stages.0.0/cpe": 5.14e-7, "stages.0.0/attn": 1.26e-3, "stages.0.0/cpe1": 8.13e-7, "stages.0.0/mlp": 1.42e-4,
        "stages.1.0/cpe": 5.84e-7, "stages.1.0/attn": 2.74e-3, "stages.1.0/cpe1": 5.01e-7, "stages.1.0/mlp": 5.09e-4},
    ("l2vit_tiny/paper", "float32"): {
        "stem": 3.46e-4, "stages.0.0": 0.172, "stages.0.1": 0.0453, "downsample_layers.1": 6.29e-5,
        "stages.1.0": 1.22, "stages.1.1": 0.0146, "head": 2.85e-4,
        "stages.0.0/cpe": 5.80e-7, "stages.0.0/attn": 1.17e-3, "stages.0.0/mlp": 1.58e-4,
        "stages.0.1/cpe": 7.86e-7, "stages.0.1/attn": 5.61e-5, "stages.0.1/lcm": 1.11e-5, "stages.0.1/mlp": 9.81e-5,
        "stages.1.0/cpe": 5.91e-7, "stages.1.0/attn": 3.67e-3, "stages.1.0/mlp": 7.17e-4},
    ("lisanet_i_t", "float64"): {"network": 2.67e-3}}


def _forward_as_measured(units, case) -> None:
    """Every unit's and part's forward relative bound (``gradients["units"]``) as measured (FORWARD_RELATIVE)."""
    measured = FORWARD_RELATIVE[case]
    got = {}
    for e in units:
        got[e["unit"]] = e["forward_relative_bound"]
        got.update({f"{e['unit']}/{p['part']}": p["forward_relative_bound"] for p in e.get("parts") or []})
    assert set(got) == set(measured), (case, sorted(got))
    for k, x in got.items():
        _near(x, measured[k], (case, k))


#: The float32 relative error of reduced L2ViT-T's stem BatchNorm bias gradient, measured (seed 0, the twin as the
#: foreign network): a measurement, checked within TIGHTNESS_MARGIN (:func:`_near`).
STEM_BIAS_GRAD_REL_ERR = 7.07e-7


def _near(x, measured, what) -> None:
    """``x`` within TIGHTNESS_MARGIN of its ``measured`` value from both sides."""
    assert measured / TIGHTNESS_MARGIN <= x <= TIGHTNESS_MARGIN * measured, (what, x, measured)


def _as_measured(tensors, case) -> None:
    """Every tensor's err/bound at most TIGHTNESS_MARGIN x the case's measured largest, and the largest at least
    the measured / TIGHTNESS_MARGIN (GRAD_MEASURED)."""
    want = GRAD_MEASURED[case]
    worst = max(t["err_over_bound"] for t in tensors)
    if want == 0.0:
        # bit for bit the twin's gradients here; another float64 GEMM (MKL, other blockings) rounds otherwise,
        # legitimately: only the bound (checked by the caller) applies
        return
    assert worst <= TIGHTNESS_MARGIN * want, (case, worst, want)
    assert worst >= want / TIGHTNESS_MARGIN, (case, worst, want)


def _grads(r):
    return {t["name"]: t for t in r.gradients["tensors"]}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("make,reference,keys", [
    (lambda: PortL2ViTAttention(16, 2), "l2vit.attention",
     {"input", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "temperature"}),
    (lambda: GradCastling(16, 2), "castling.attention",
     {"input", "qkv.weight", "proj.weight", "proj.bias", "dconv.weight"}),
], ids=["l2vit", "castling_custom_function"])
def test_correct_ports_match_with_gradients(make, reference, keys, dtype):
    r = V.verify(make(), reference, hw=HW, dtype=dtype, grad=True)
    assert r.verdict == "match", str(r)
    g = r.gradients
    assert g["twin_forward"]["verdict"] == "match" and g["verdict"] == "match", str(r)
    assert set(_grads(r)) == keys                     # the input and every reference parameter, by reference key
    for t in g["tensors"]:
        assert t["ok"] and 0.0 <= t["err_over_bound"] <= 1.0, t
        assert 0.0 < t["bound"] < float("inf")
    _as_measured(g["tensors"], (reference.split(".")[0], dtype))
    assert g["first_divergence"] is None and g["backward_factor"] == config.VERIFY_GRAD_BACKWARD_FACTOR


@pytest.mark.parametrize("name", ["rala", "flatten", "lisa"])
def test_the_other_layer_references_match_with_gradients_in_float32(name):
    """Every layer reference has a twin: RALA (released layout, 6 x 4), FLatten PVT (sr 2, 8 x 8; its learnable scale
    is shared by the queries and keys), LiSA (4 x 3 circular kernels)."""
    from tests.verify_gallery.flatten_port import PortFocusedAttention
    from tests.verify_gallery.lisa_port import PortLiSA
    from tests.verify_gallery.rala_port import PortRALA
    module, reference, hw = {"rala": (PortRALA(16, 2), "rala.attention", (6, 4)),
                             "flatten": (PortFocusedAttention(16, 2, sr_ratio=2, n_kv=16), "flatten.attention", (8, 8)),
                             "lisa": (PortLiSA(16, 2), "lisa.attention", None)}[name]
    r = V.verify(module, reference, hw=hw, dtype="float32", grad=True)
    assert r.verdict == "match" and r.gradients["verdict"] == "match", str(r)
    _as_measured(r.gradients["tensors"], (name, "float32"))


def test_gradient_names_are_the_reference_keys_read_through_the_mapping():
    """A fused qkv split by the mapping: the foreign gradient rows are read as the reference's q / kv."""
    from tests.verify_gallery.flatten_port import PortFusedDeiT
    r = V.verify(PortFusedDeiT(16, 2, n_kv=16), "flatten.attention", dtype="float32", grad=True)
    assert r.verdict == "match", str(r)
    assert _grads(r)["q.weight"]["foreign"] == "qkv.weight[0:16]"
    assert _grads(r)["kv.weight"]["foreign"] == "qkv.weight[16:48]"
    # split query / key / value projections joined into the reference's fused qkv: their gradients concatenated
    from tests.verify_gallery.l2vit_port import PortL2ViTSplit
    r = V.verify(PortL2ViTSplit(16, 2), "l2vit.attention", hw=HW, dtype="float32", grad=True)
    assert r.verdict == "match", str(r)
    assert _grads(r)["qkv.weight"]["foreign"] == "query.weight + key.weight + value.weight"


def test_examples_with_gradients_judge_every_example_with_its_gradients():
    """``verify_examples(..., grad=True)``: each drawn example (batch, grid, seed) is verified with its gradients,
    and the one shown is the closest to its bounds, gradients included (a failing example is shrunk as without
    --grad: tests/test_verify.py)."""
    good = V.verify_examples(GradL2ViT, "l2vit.attention", 2, init={"dim": 16, "num_heads": 2}, max_side=4,
                             grad=True)
    assert good.verdict == "match" and good.gradients["verdict"] == "match", str(good)
    assert "all 2 example(s) match" in good.findings[-1]["message"]


@pytest.mark.parametrize("cls,reference,bug,tensor", [
    (GradL2ViT, "l2vit.attention", "linear_dx_transposed", "input"),
    (GradL2ViT, "l2vit.attention", "relu_leaky_backward", "input"),
    (GradL2ViT, "l2vit.attention", "linear_dw_scaled", "proj.weight"),
    (GradCastling, "castling.attention", "linear_db_missing_batch", "proj.bias"),
    (GradCastling, "castling.attention", "linear_dw_scaled", "proj.weight"),
])
def test_planted_backward_bugs_diverge_in_the_gradients_only(cls, reference, bug, tensor):
    r = V.verify(cls(16, 2, bug=bug), reference, hw=HW, dtype="float32", grad=True)
    assert r.whole_module["verdict"] == "match" and all(s.verdict == "match" for s in r.stages), str(r)
    assert r.first_divergence is None
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges", str(r)
    assert r.gradients["first_divergence"]["tensor"] == tensor, r.gradients["first_divergence"]
    assert _grads(r)[tensor]["err_over_bound"] > 1.0
    # the projection's bugs leave the gradients upstream of its input gradient exact
    if bug in ("linear_dw_scaled", "linear_db_missing_batch"):
        assert [t["name"] for t in r.gradients["tensors"] if t["verdict"] == "diverges"] == [tensor]


def test_assert_matches_raises_on_a_gradient_bug():
    V.assert_matches(GradL2ViT(16, 2), "l2vit.attention", hw=HW, grad=True)
    with pytest.raises(AssertionError, match="gradients: diverges"):
        V.assert_matches(GradL2ViT(16, 2, bug="linear_dx_transposed"), "l2vit.attention", hw=HW, grad=True)


def test_a_twin_that_does_not_match_the_reference_stops_the_gradients(monkeypatch):
    """The twin's float64 forward is checked first; a twin off the NumPy reference (here scaled by 1 + 1e-9,
    far outside its float64 bound) is reported and no gradient is compared: the verdict cannot be "match"."""
    real = G.TWINS["l2vit.attention"]

    def off(s):
        m, fwd = real(s)
        return m, lambda x: fwd(x) * (1 + 1e-9)
    monkeypatch.setitem(G.TWINS, "l2vit.attention", off)
    r = V.verify(PortL2ViTAttention(16, 2), "l2vit.attention", hw=HW, dtype="float32", grad=True)
    assert r.gradients["twin_forward"]["verdict"] == "diverges"
    assert r.gradients["verdict"] == "inconclusive" and r.gradients["tensors"] == []
    assert "does not match the NumPy reference" in r.gradients["why"]
    assert r.verdict == "inconclusive"


def test_grad_needs_nothing_from_the_source_tree(monkeypatch):
    """The twins ship with the package (refimpl.twins): with the source tree's ``equivalence`` package made
    unimportable, as after a regular ``pip install``, the gradients are still judged."""
    monkeypatch.setitem(sys.modules, "equivalence", None)
    for name in [m for m in sys.modules if m.startswith("refimpl.twins")]:
        monkeypatch.delitem(sys.modules, name)
    r = V.verify(PortL2ViTAttention(16, 2), "l2vit.attention", hw=HW, dtype="float32", grad=True)
    assert r.gradients["twin_forward"]["verdict"] == "match"
    assert r.gradients["tensors"], r.gradients


def test_grad_argument_checks():
    with pytest.raises(V.VerifyError, match=r"argument 'grad': expected True or False, got 'yes'"):
        V.verify(PortCastling(16, 2), "castling.attention", hw=HW, grad="yes")


def test_gradient_bound_is_inconclusive_when_void():
    """The gradient bound keeps the verdict's outcomes: a bound reaching the quantity's size is inconclusive,
    a non-finite one too, never "match"."""
    from refimpl import verdict
    ref = np.linspace(-1.0, 1.0, 64)
    void = G.GradientBound(np.float64(1.0), 4.0, "test", accumulation=True, rho=2.0)
    assert verdict.compare(ref, ref, void, "float32").verdict == "inconclusive"
    inf = G.GradientBound(np.float64(1.0), 4.0, "test", accumulation=True, rho=float("inf"))
    assert verdict.compare(ref, ref, inf, "float32").verdict == "inconclusive"
    tight = G.GradientBound(np.float64(1.0), 4.0, "test", accumulation=True, rho=1e-6)
    assert verdict.compare(ref, ref, tight, "float32").verdict == "match"
    assert verdict.compare(ref * (1 + 1e-3), ref, tight, "float32").verdict == "diverges"
    assert G.forward_relative_bound(verdict.Bound(np.float64(1.0), 1.0), np.zeros(3), "float32") == float("inf")


def test_cli_grad_exit_codes_and_json(tmp_path, capsys):
    init = {"dim": 16, "num_heads": 2}
    base = ["verify", f"{GRAD_PORT}:GradL2ViT", "--reference", "l2vit.attention", "--hw", "6,6", "--grad"]
    assert cli.main(base + ["--init", json.dumps(init), "--json", "-"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["schema_version"] == V.SCHEMA_VERSION == 5 and rep["verdict"] == "match"
    for t in rep["gradients"]["tensors"]:
        assert set(t) >= {"name", "max_abs_err", "max_rel_err", "bound", "err_over_bound", "ok"} and t["ok"]
    md = tmp_path / "r.md"
    code = cli.main(base + ["--init", json.dumps({**init, "bug": "linear_dx_transposed"}), "--report", str(md)])
    assert code == 1
    out = capsys.readouterr().out
    assert "first gradient divergence" in out and "input" in out
    assert "## Gradients" in md.read_text() and "| input | input | diverges |" in md.read_text()
    # without --grad the report has no gradient section
    assert cli.main(base[:-1] + ["--init", json.dumps(init), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["gradients"] is None


# ---------------------------------------------------------------------------------------------------------
# Whole registered networks (refimpl.verify.network_gradients): the twin of the network as the foreign module,
# reduced configurations
# ---------------------------------------------------------------------------------------------------------

NET_TARGET = os.path.join(os.path.dirname(__file__), "verify_gallery", "network_twins.py") + ":twin"


def _scaled_backward(factor):
    """A hook making a submodule's output carry its gradient times ``factor``: identity forward (a custom
    autograd.Function), so every forward unit still matches."""
    import torch

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * factor

    return lambda _m, _inp, out: Scale.apply(out)


def _net(name, bug_block=None, bug_param=None, factor=1.0, preset=None, config=None):
    """The twin of the registered network ``name`` (tests/verify_gallery/network_twins.py: reduced, ``preset``,
    ``config`` fields over it) as the foreign network; ``bug_block``: that submodule's output carries its gradient
    times ``factor`` (forward exact); ``bug_param``: that parameter's gradient is multiplied by ``factor``."""
    from tests.verify_gallery.network_twins import twin
    m = twin(name, preset, config=config)
    if bug_block is not None:
        dict(m.named_modules())[bug_block].register_forward_hook(_scaled_backward(factor))
    if bug_param is not None:
        dict(m.named_parameters())[bug_param].register_hook(lambda g: g * factor)
    return m


def _twin_keys(name, preset=None, config=None):
    from refimpl.twins.models import build
    cfg = network_config(name, preset, config or {"reduced": True}, None)[0]
    return {k for k, _ in build(cfg).named_parameters()}


def test_network_twin_matches_with_gradients_in_float64():
    """LiSANet-I-T reduced: the float64 twin's logits match the NumPy network, and the network's gradients (the
    images and every parameter, in the reference's keys) match its own (err 0) against finite, conclusive bounds."""
    r = V.verify(_net("lisanet_i_t"), "lisanet_i_t", config={"reduced": True}, dtype="float64", grad=True)
    assert r.verdict == "match", str(r)
    g = r.gradients
    assert g["twin_forward"]["verdict"] == "match" and g["verdict"] == "match", str(r)
    assert set(_grads(r)) == {"input"} | _twin_keys("lisanet_i_t")
    for t in g["tensors"]:
        assert t["ok"] and t["err_over_bound"] == 0.0 and 0.0 < t["bound"] < float("inf"), t
    assert g["first_divergence"] is None
    _near(g["forward_relative_bound"], FORWARD_RELATIVE["lisanet_i_t", "float64"]["network"], "lisanet_i_t")


def test_network_backward_bug_in_one_block_diverges_upstream_of_it():
    """The second block's output carries its gradient times 1.1 (forward exact, every unit matches): every
    gradient upstream of that block diverges - the images, the embedding, both blocks - and the final norm and
    head, downstream of it, match."""
    name = "lisanet_i_t"
    r = V.verify(_net(name, bug_block="stages.0.1", factor=1.1), name, config={"reduced": True}, dtype="float64",
                 grad=True)
    assert all(s.verdict == "match" for s in r.stages) and r.first_divergence is None, str(r)
    assert r.verdict == "diverges" and r.gradients["verdict"] == "diverges", str(r)
    assert r.gradients["first_divergence"]["tensor"] == "input"
    div = {t["name"] for t in r.gradients["tensors"] if t["verdict"] == "diverges"}
    downstream = {k for k in _twin_keys(name) if k.startswith(("norm.", "head."))}
    assert div == {"input"} | _twin_keys(name) - downstream, sorted(div)
    assert all(_grads(r)[k]["verdict"] == "match" for k in downstream)
    # unit by unit (teacher-forced, float64: no ensemble, the bound alone): the bug is in stages.0.1 only
    u = _units(r)
    assert [k for k, e in u.items() if e["verdict"] == "diverges"] == ["stages.0.1"], r.gradients["units"]
    assert r.gradients["units_first_divergence"]["unit"] == "stages.0.1"
    assert u["stages.0.1"]["err_over_bound"] > 1.0 and "input" in u["stages.0.1"]["diverging"]
    assert all(e["verdict"] == "match" for k, e in u.items() if k != "stages.0.1")


def test_network_parameter_gradient_bug_is_named():
    """One parameter's gradient zeroed (a hook): only that tensor diverges, by name."""
    key = "stages.0.0.attn.weight_a"
    r = V.verify(_net("lisanet_i_t", bug_param=key, factor=0.0), "lisanet_i_t", config={"reduced": True},
                 dtype="float64", grad=True)
    assert r.verdict == "diverges" and r.gradients["first_divergence"]["tensor"] == key, str(r)
    assert [t["name"] for t in r.gradients["tensors"] if t["verdict"] == "diverges"] == [key]
    assert _grads(r)[key]["err_over_bound"] > 1.0
    # unit by unit: in the unit holding it, by name, and nowhere else
    assert [(k, e["diverging"]) for k, e in _units(r).items() if e["verdict"] == "diverges"] == [("stages.0.0", [key])]
    assert r.gradients["units_first_divergence"]["tensor"] == key


def _units(r):
    return {e["unit"]: e for e in r.gradients["units"]}


def test_network_gradients_part_by_part_where_a_block_bound_is_void():
    """Castling-DeiT-T reduced in float32: the network's logits bound is void at its depth (relative 4e7), so the
    whole network's gradient bounds are too ("inconclusive", with why).  Unit by unit (teacher-forced) the stem and
    the head match; the blocks' own forward bounds (relative 0.45 and 0.19) are void for their gradients, so each
    block's backward is judged part by part as its forward is: the attention and MLP residual branches, the MLP
    part's input located by value among the block's tensors and its cotangent the gradient that reached that tensor
    in the network's backward.  Each part's own bound (relative 2e-3 and 2e-4) is conclusive and every part
    matches: the gradients are "match", each block listing its parts."""
    name = "castling_deit_t"
    r = V.verify(_net(name), name, config={"reduced": True}, dtype="float32", grad=True)
    g = r.gradients
    assert g["twin_forward"]["verdict"] == "match" and g["whole_verdict"] == "inconclusive", str(r)
    assert all(t["verdict"] == "inconclusive" for t in g["tensors"]) and g["forward_relative_bound"] > 1.0
    assert "void bound" in g["why"] and "float64" in g["why"]
    u = _units(r)
    assert list(u) == ["stem", "blocks.0", "blocks.1", "head"] and g["units_verdict"] == "match", g["units"]
    assert g["verdict"] == "match" and r.verdict == "match"
    assert all(0.0 <= u[k]["err_over_bound"] < 1.0 for k in u)
    _forward_as_measured(g["units"], (name, "float32"))
    for k in ("blocks.0", "blocks.1"):
        parts = u[k]["parts"]
        assert [p["part"] for p in parts] == ["attn", "mlp"] and all(p["verdict"] == "match" for p in parts), parts
        assert parts[0]["input"] == "the unit's input" and parts[1]["input"].endswith("(by value)")
        assert "void bound" in u[k]["why"] and "part by part (teacher-forced): attn match" in u[k]["why"]
        assert all(p["tensors"] >= 2 for p in parts)
    assert g["units_first_divergence"] is None


def test_network_backward_bug_in_one_part_diverges_at_that_part(monkeypatch):
    """As above, with blocks.1's MLP branch carrying its gradient times 1 + 1e-2 (forward exact) and no second
    evaluation in float32 to compare with (the twin's members made to fail: the unit-wise verdicts then rest on the
    bounds alone, void for the whole blocks): blocks.1 diverges in its "mlp" part (the part's input gradient and
    its MLP parameters' gradients), its "attn" part, fed the cotangent that reached the located intermediate,
    matches, and so does blocks.0 (a wrong cotangent, differentiated correctly)."""
    from refimpl.verify import unit_gradients

    def no_member(*_a, **_k):
        raise RuntimeError("no member in this test")
    monkeypatch.setattr(unit_gradients, "round_to", no_member)
    name = "castling_deit_t"
    bad = V.verify(_net(name, bug_block="blocks.1.mlp", factor=1 + 1e-2), name, config={"reduced": True},
                   dtype="float32", grad=True)
    g = bad.gradients
    assert all(s.verdict == "match" for s in bad.stages), str(bad)
    u = _units(bad)
    assert g["units_verdict"] == "diverges" and [k for k, e in u.items() if e["verdict"] == "diverges"] == \
        ["blocks.1"], g["units"]
    attn, mlp = u["blocks.1"]["parts"]
    assert attn["verdict"] == "match" and mlp["verdict"] == "diverges", u["blocks.1"]
    assert "input" in mlp["diverging"] and any(k.startswith("blocks.1.mlp.") for k in mlp["diverging"])
    assert not any(k.startswith(("blocks.1.attn.", "blocks.0.")) for k in mlp["diverging"])
    assert g["units_first_divergence"]["unit"] == "blocks.1" and g["units_first_divergence"]["part"] == "mlp"
    assert "first divergence in part 'mlp'" in u["blocks.1"]["why"]
    assert all(p["verdict"] == "match" for p in u["blocks.0"]["parts"])
    text, md = bad.gradients_text(), bad.gradients_text(markdown=True)
    assert "first divergence at unit blocks.1 (part mlp): input" in text
    assert any(line.split()[:2] == ["blocks.1/mlp", "diverges"] for line in text.splitlines()), text
    assert "| blocks.1/attn | match | " in md
    json.loads(bad.to_json())                                  # the parts' entries serialise


def test_network_backward_bug_in_one_part_located_with_the_float32_member():
    """As above (blocks.1's MLP branch carrying its gradient times 1 + 1e-2, forward exact), with the float32
    comparison run on (the twin's members): blocks.1 diverges as a whole by the ensemble, its list of diverging
    tensors naming the attention's parameters too (right at block level), and is then judged part by part to
    locate the bug inside it: its verdict stays "diverges", its parts are attached, "mlp" diverges by its own
    tensors alone (its input gradient, norm2's and the MLP's parameters) while "attn" matches, and the unit's why
    and the units' first divergence name the part."""
    name = "castling_deit_t"
    bad = V.verify(_net(name, bug_block="blocks.1.mlp", factor=1 + 1e-2), name, config={"reduced": True},
                   dtype="float32", grad=True)
    g = bad.gradients
    assert all(s.verdict == "match" for s in bad.stages) and bad.verdict == "diverges", str(bad)
    u = _units(bad)
    assert [k for k, e in u.items() if e["verdict"] == "diverges"] == ["blocks.1"], g["units"]
    unit = u["blocks.1"]
    assert "blocks.1.attn.qkv.weight" in unit["diverging"] and unit["worst"].startswith("blocks.1."), unit
    assert "legitimate evaluations" in unit["why"] and unit["err_over_bound"] < 1.0      # by the ensemble
    attn, mlp = unit["parts"]
    assert (attn["part"], attn["verdict"], mlp["part"], mlp["verdict"]) == ("attn", "match", "mlp", "diverges"), unit
    assert attn["diverging"] == [] and mlp["input"].endswith("(by value)")
    keys = _twin_keys(name)
    own = {k for k in keys if k.startswith(("blocks.1.mlp.", "blocks.1.norm2."))}
    assert mlp["diverging"][0] == "input" and set(mlp["diverging"]) == {"input"} | own, mlp["diverging"]
    assert "first divergence in part 'mlp'" in unit["why"] and "part by part" in unit["why"]
    fd = g["units_first_divergence"]
    assert fd["unit"] == "blocks.1" and fd["part"] == "mlp" and fd["tensor"] == "input", fd
    assert fd["err_over_bound"] == mlp["first_divergence"]["err_over_bound"]
    assert "unit 'blocks.1', part 'mlp' diverges teacher-forced" in g["why"]
    assert all("parts" not in e or all(q["verdict"] == "match" for q in e["parts"]) for k, e in u.items()
               if k != "blocks.1")
    text = bad.gradients_text()
    assert "first divergence at unit blocks.1 (part mlp): input" in text
    assert any(line.split()[:2] == ["blocks.1/attn", "match"] for line in text.splitlines()), text
    json.loads(bad.to_json())


def test_a_diverging_unit_whose_parts_do_not_diverge_says_so_in_the_gradients():
    """unit_gradients._located on a unit whose gradients diverge as a whole: every part matching sends the
    divergence to how the parts compose (no part named, no first divergence of a part); a part not judged
    conclusively is named instead; a diverging part is named with its first divergence."""
    from refimpl.verify.unit_gradients import _located

    def part(name, verdict, fd=None):
        return {"part": name, "verdict": verdict, "err_over_bound": 0.5 if verdict == "match" else None,
                "why": "" if verdict == "match" else "no gradient reached the part's input",
                "first_divergence": fd}
    why, fd = _located([part("attn", "match"), part("mlp", "match")], "the unit's why")
    assert fd is None and why.startswith("the unit's why; part by part") and "every part matches on its own" in why
    assert "how the parts compose" in why
    why, fd = _located([part("attn", "match"), part("mlp", "inconclusive")], "w")
    assert fd is None and "every part matches" not in why and "no part diverges on its own" in why
    assert "mlp: no gradient reached the part's input" in why
    div = {"tensor": "input", "why": "out", "max_abs_err": 1.0, "err_over_bound": 3.0}
    why, fd = _located([part("attn", "diverges", div), part("mlp", "match")], "w")
    assert fd == dict(div, part="attn") and "first divergence in part 'attn'" in why


def test_network_backward_bug_in_one_block_diverges_at_that_unit():
    """Castling-DeiT-T reduced in float32: blocks.1's output carries its gradient times 1 + 1e-3 (forward exact,
    every forward unit matches).  Unit by unit the bug is in blocks.1 alone: its input gradient and its parameters'
    diverge (against the twin's unit in float32 on the same input and cotangent), the units before it (fed the
    wrong cotangent, but differentiating it correctly) do not; the whole network's ensemble also catches it.  Part
    by part the bug is located in blocks.1's last part, "mlp", whose output (the residual sum) is the block's."""
    name = "castling_deit_t"
    bad = V.verify(_net(name, bug_block="blocks.1", factor=1 + 1e-3), name, config={"reduced": True},
                   dtype="float32", grad=True)
    g = bad.gradients
    assert all(s.verdict == "match" for s in bad.stages), str(bad)
    assert bad.verdict == "diverges" and g["verdict"] == "diverges" and g["units_verdict"] == "diverges", str(bad)
    assert g["units_first_divergence"]["unit"] == "blocks.1"
    assert g["units_first_divergence"]["tensor"] == "input"
    u = _units(bad)
    assert [k for k, e in u.items() if e["verdict"] == "diverges"] == ["blocks.1"]
    # the text and Markdown reports print the unit rows and the first unit that diverges
    text, md = bad.gradients_text(), bad.gradients_text(markdown=True)
    assert "unit by unit (teacher-forced): diverges; first divergence at unit blocks.1 (part mlp): input" in text
    assert any(line.split()[:2] == ["blocks.1", "diverges"] for line in text.splitlines()), text
    assert "| blocks.1 | diverges | " in md and "| unit | verdict | worst gradient |" in md
    assert "input" in u["blocks.1"]["diverging"] and "blocks.1.attn.proj.weight" in u["blocks.1"]["diverging"]
    assert not any(k.startswith(("blocks.0.", "head.", "norm.")) for k in u["blocks.1"]["diverging"])
    # located part by part: the scaled gradient enters at the block's output, the last part's ("mlp": its
    # residual sum is the block's output), which the part fed the cotangent of the unit's output sees; "attn",
    # fed the cotangent that reached the located intermediate, matches
    assert [(q["part"], q["verdict"]) for q in u["blocks.1"]["parts"]] == [("attn", "match"), ("mlp", "diverges")]
    assert g["units_first_divergence"]["part"] == "mlp"
    assert "unit 'blocks.1', part 'mlp' diverges teacher-forced" in g["why"]
    # the whole network: every tensor upstream of the block, by its ensemble
    assert g["whole_verdict"] == "diverges" and g["first_divergence"]["tensor"] == "input", str(bad)
    div = {t["name"] for t in g["tensors"] if t["verdict"] == "diverges"}
    assert "blocks.0.attn.qkv.weight" in div and not any(k.startswith(("head.", "norm.")) for k in div)
    assert "legitimate evaluations" in _grads(bad)["input"]["detail"]


def test_network_gradients_unit_by_unit_in_float32_ravlt():
    """RaViT-T reduced in float32: the whole network's gradient bounds are void (its logits bound is, relative
    6.6e303), but unit by unit (each unit's backward on the network's own input and cotangent to it, each unit's
    own forward bound) the stem, every downsampling, the head and three of the four blocks match, each err/bound
    below 1; layers.0.blocks.0's own forward bound (relative 0.13) is void for its gradients, so it is judged
    part by part (cpe, attn, mlp; each part's bound below 5e-4 relative) and matches: the gradients are "match",
    with the whole network's "inconclusive" kept in why, and no unit diverges."""
    r = V.verify(_net("ravlt_t"), "ravlt_t", config={"reduced": True}, dtype="float32", grad=True)
    g = r.gradients
    assert g["whole_verdict"] == "inconclusive" and g["verdict"] == "match", str(r)
    u = _units(r)
    assert list(u) == list(r.network["units"])
    assert all(e["verdict"] == "match" for e in u.values()), g["units"]
    block = u["layers.0.blocks.0"]
    parts = block["parts"]
    assert [p["part"] for p in parts] == ["cpe", "attn", "mlp"] and all(p["verdict"] == "match" for p in parts)
    _forward_as_measured(g["units"], ("ravlt_t", "float32"))
    assert "void bound" in block["why"] and "part by part (teacher-forced): cpe match" in block["why"]
    for k, e in u.items():
        assert e["tensors"] >= 2 and not e["diverging"], e
        assert 0.0 <= e["err_over_bound"] <= 1.0, e
    assert g["units_first_divergence"] is None and r.verdict == "match"


def test_network_twin_that_does_not_match_stops_the_gradients(monkeypatch):
    """The network's twin is checked first (its logits against the NumPy network's float64 bound); a twin off by
    1e-2 relative is reported and no gradient is compared."""
    import refimpl.twins.models as tm
    real = tm.build

    def off(cfg):
        m = real(cfg)
        m.register_forward_hook(lambda _m, _inp, out: out * (1 + 1e-2))
        return m
    foreign = _net("lisanet_i_t")
    monkeypatch.setattr(tm, "build", off)
    r = V.verify(foreign, "lisanet_i_t", config={"reduced": True}, dtype="float64", grad=True)
    g = r.gradients
    assert g["twin_forward"]["verdict"] == "diverges" and g["verdict"] == "inconclusive" and g["tensors"] == []
    assert "does not match the NumPy network" in g["why"] and r.verdict == "inconclusive"


def test_network_twin_judged_by_its_units_where_its_logits_bound_is_void():
    """RaViT-T reduced: the float64 logits bound is void (relative 3.5e6), so the twin is judged unit by unit
    (each unit teacher-forced against its float64 unit bound, the forward their composition)."""
    r = V.verify(_net("ravlt_t"), "ravlt_t", config={"reduced": True}, dtype="float64", grad=True)
    g = r.gradients
    tf = g["twin_forward"]
    assert tf["verdict"] == "match" and "judged by its units: all" in tf["reasons"][-1], tf
    # the whole network's gradient bounds are void; every unit's backward, teacher-forced, matches within its own
    # bound: the gradients' verdict is the units', stated
    assert g["tensors"] and g["whole_verdict"] == "inconclusive" and g["units_verdict"] == "match", str(r)
    assert g["verdict"] == "match" and r.verdict == "match" and "The verdict is the unit-wise one" in g["why"]
    assert all(e["verdict"] == "match" for e in g["units"]), g["units"]
    _forward_as_measured(g["units"], ("ravlt_t", "float64"))


def test_cli_network_grad(capsys):
    code = cli.main(["verify", NET_TARGET, "--reference", "lisanet_i_t", "--init", '{"name": "lisanet_i_t"}',
                     "--config", '{"reduced": true}', "--dtype", "float64", "--grad", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["verdict"] == "match" and rep["gradients"]["verdict"] == "match"
    assert {t["name"] for t in rep["gradients"]["tensors"]} == {"input"} | _twin_keys("lisanet_i_t")
    # the table: the gradients' verdict and a row per tensor
    code = cli.main(["verify", NET_TARGET, "--reference", "lisanet_i_t", "--init", '{"name": "lisanet_i_t"}',
                     "--config", '{"reduced": true}', "--dtype", "float64", "--grad"])
    out = capsys.readouterr().out
    assert code == 0 and "gradients: MATCH" in out and "pos_embed" in out


def test_l2vit_stem_gradients_are_not_pytorchs_batch_norm_backward_bug():
    """The ConvStem's last BatchNorm feeds a LayerNorm over ``x.flatten(2).transpose(1, 2)``, whose backward hands it,
    for a batch of one (the verify tool's images), a gradient laid out channels-last with batch stride C (not C H W);
    PyTorch 2.13's CPU batch-norm backward is wrong on that layout (its bias gradient ~1e-16 instead of the sum of
    its output gradient, its weight and input gradients O(1) off), so every stem parameter's float64 reference
    gradient was wrong and both BatchNorm biases looked like gradients cancelling to 1e-16, which made the stem
    unit "inconclusive" (its bound void against ~1e-16).  The twin hands that BatchNorm its gradient contiguous
    (refimpl/twins/models/l2vit.py, ConvStem): the bias gradient is the sum of the gradient reaching the
    BatchNorm's output (within 2 gamma_n(u_64) sum |g|, two n-term float64 sums of the same terms), and the reduced
    network's gradients are "match" unit by unit in float32 (the whole network's bound is void: "inconclusive").
    A port built on the plain modules computes PyTorch's wrong stem gradients and diverges there."""
    import torch
    from refimpl import verdict
    m = _net("l2vit_tiny").double().eval()
    bn = m.downsample_layers[0].proj.proj[4]
    seen = {}

    def keep(_m, _i, out):
        out.register_hook(lambda gr: seen.setdefault("g", gr))
    bn.register_forward_hook(keep)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 15, 13)))
    y = m(x)
    y.backward(torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(y.shape))))
    g = seen["g"].detach().numpy()
    n = g.shape[0] * g.shape[2] * g.shape[3]
    want = g.sum(axis=(0, 2, 3))
    gap = np.abs(bn.bias.grad.numpy() - want)
    assert np.all(gap <= 2 * verdict.gamma(n, verdict.unit_roundoff("float64")) * np.abs(g).sum(axis=(0, 2, 3)))
    # not a cancellation: the float64 sum's own error bound is below the value it bounds (a relative bound below 1,
    # the verdict's test of a non-void bound), at every channel
    assert np.all(2 * verdict.gamma(n, verdict.unit_roundoff("float64")) * np.abs(g).sum(axis=(0, 2, 3)) < np.abs(want))
    r = V.verify(_net("l2vit_tiny"), "l2vit_tiny", config={"reduced": True}, dtype="float32", grad=True)
    gr = r.gradients
    assert gr["twin_forward"]["verdict"] == "match" and gr["whole_verdict"] == "inconclusive", str(r)
    assert not [t["name"] for t in gr["tensors"] if t["verdict"] == "diverges"], str(r)
    assert all(e["verdict"] == "match" for e in gr["units"]), gr["units"]
    assert gr["units_verdict"] == "match" and gr["verdict"] == "match" and r.verdict == "match"
    b = _grads(r)["downsample_layers.0.proj.proj.4.bias"]
    # its whole-network bound is void (the network's is), so its error is checked against the one measured with
    # these calls (7.07e-7 relative: float32 rounding, not PyTorch's O(1) error), within TIGHTNESS_MARGIN
    assert b["max_abs_err"] > 0.0, b
    _near(b["max_rel_err"], STEM_BIAS_GRAD_REL_ERR, "stem BatchNorm bias gradient, relative error")
    # a port whose stem is the plain Sequential (PyTorch's wrong gradients at batch 1) diverges, at the stem
    plain = _net("l2vit_tiny")
    stem = plain.downsample_layers[0].proj
    stem.forward = stem.proj.forward
    bad = V.verify(plain, "l2vit_tiny", config={"reduced": True}, dtype="float32", grad=True).gradients
    stem_keys = {k for k in _twin_keys("l2vit_tiny") if k.startswith("downsample_layers.0.proj.")}
    assert bad["verdict"] == "diverges" and bad["units_first_divergence"]["unit"] == "stem", bad["units"]
    assert [(e["unit"], set(e["diverging"])) for e in bad["units"] if e["verdict"] == "diverges"] == \
        [("stem", {"input"} | stem_keys)], bad["units"]


#: The block kinds of L2ViT (refimpl.models.l2vit.unit_parts): block j of a stage is LWA for even j, LGA for odd j.
L2VIT_PARTS = {("official", "lwa"): ["cpe", "attn", "cpe1", "mlp"], ("paper", "lwa"): ["cpe", "attn", "mlp"],
               ("official", "lga"): ["cpe", "attn", "lcm", "mlp"], ("paper", "lga"): ["cpe", "attn", "lcm", "mlp"]}


@pytest.mark.parametrize("preset,by_parts", [("official", ["stages.0.0", "stages.1.0"]),
                                             ("paper", ["stages.0.0", "stages.0.1", "stages.1.0"])])
def test_network_gradients_part_by_part_in_float32_l2vit(preset, by_parts):
    """L2ViT-T reduced at the paper's head dim 32 (network_twins.L2VIT_WIDE), float32, the twin as the foreign
    network: the whole network's gradient bounds are void ("inconclusive"); unit by unit, the LWA blocks' own
    forward bounds (relative 0.34 / 0.80 official, 0.17 / 1.2 paper) and, in the paper preset, stages.0.1's (an LGA
    block, relative 0.045: void for some of its tensors, whose terms cancel) are void for their gradients, so each
    of those blocks is judged part by part: the official LWA block's four residual steps (its second CPE "cpe1"),
    the paper's three, the LGA block's CPE, attention, LCM (Eq. 8) and MLP.  Every part matches, each part's own
    bound conclusive, and the parts' tensors are the part's input gradient and the block's parameters, each in
    exactly one part; every other unit matches on its own bound: the gradients are "match"."""
    from tests.verify_gallery.network_twins import L2VIT_WIDE
    name = "l2vit_tiny"
    r = V.verify(_net(name, preset=preset, config=L2VIT_WIDE), name, preset=preset, config=L2VIT_WIDE,
                 dtype="float32", grad=True)
    g = r.gradients
    assert g["twin_forward"]["verdict"] == "match" and g["whole_verdict"] == "inconclusive", str(r)
    assert g["units_verdict"] == "match" and g["verdict"] == "match" and g["units_first_divergence"] is None, str(r)
    u = _units(r)
    assert all(e["verdict"] == "match" for e in u.values()), g["units"]
    assert [k for k, e in u.items() if e.get("parts")] == by_parts, g["units"]
    keys = _twin_keys(name, preset, L2VIT_WIDE)
    for k in by_parts:
        kind = "lwa" if k.endswith(".0") else "lga"
        parts = u[k]["parts"]
        assert [p["part"] for p in parts] == L2VIT_PARTS[preset, kind], parts
        assert all(p["verdict"] == "match" and 0.0 <= p["err_over_bound"] < 1.0 for p in parts), parts
        assert "void bound" in u[k]["why"] and "part by part (teacher-forced): cpe match" in u[k]["why"]
        assert parts[0]["input"] == "the unit's input" and all(p["input"].endswith("(by value)") for p in parts[1:])
        assert sum(p["tensors"] - 1 for p in parts) == len({q for q in keys if q.startswith(k + ".")}), parts
    for k, e in u.items():
        if k not in by_parts:
            assert "parts" not in e and 0.0 <= e["err_over_bound"] < 1.0, e
    _forward_as_measured(g["units"], (f"{name}/{preset}", "float32"))
    assert r.verdict in ("match", "inconclusive"), str(r)


def test_ravlt_backward_bug_in_one_part_located_with_the_float32_member():
    """RaViT-T reduced in float32 with layers.0.blocks.0's attention output carrying its gradient times 1 + 1e-2
    (forward exact: every forward unit matches) and the float32 comparison run on (the twin's members): the whole
    block diverges by the ensemble (the bug is 1e3 times the twin's own float32 error), its diverging tensors
    naming the parameters of its correct parts too (the cpe's ``pos.*``: right at block level, not where the bug
    is).  The block is then judged part by part to locate it: its verdict stays "diverges", "attn" diverges by its
    own tensors alone (its input gradient, the attention's and norm1's parameters), "cpe" and "mlp" match, and the
    unit's why and the units' first divergence name the part."""
    name, block = "ravlt_t", "layers.0.blocks.0"
    r = V.verify(_net(name, bug_block=block + ".attn", factor=1 + 1e-2), name, config={"reduced": True},
                 dtype="float32", grad=True)
    g = r.gradients
    u = _units(r)
    assert all(s.verdict == "match" for s in r.stages) and r.first_divergence is None, str(r)
    assert g["verdict"] == "diverges" and [k for k, e in u.items() if e["verdict"] == "diverges"] == [block], g["units"]
    unit = u[block]
    assert "legitimate evaluations" in unit["why"], unit
    _near(unit["forward_relative_bound"], FORWARD_RELATIVE["ravlt_t", "float32"][block], block)   # forward exact
    assert any(k.startswith(block + ".pos.") for k in unit["diverging"]), unit["diverging"]
    cpe, attn, mlp = unit["parts"]
    assert [(q["part"], q["verdict"]) for q in unit["parts"]] == [("cpe", "match"), ("attn", "diverges"),
                                                                   ("mlp", "match")], unit
    assert cpe["diverging"] == [] and mlp["diverging"] == [] and attn["input"].endswith("(by value)")
    keys = _twin_keys(name)
    own = {k for k in keys if k.startswith((block + ".attn.", block + ".norm1."))}
    assert attn["diverging"][0] == "input" and set(attn["diverging"]) == {"input"} | own, attn["diverging"]
    assert "first divergence in part 'attn'" in unit["why"]
    fd = g["units_first_divergence"]
    assert fd["unit"] == block and fd["part"] == "attn" and fd["tensor"] == "input", fd
    assert f"unit '{block}', part 'attn' diverges teacher-forced" in g["why"]
    text = r.gradients_text()
    assert f"first divergence at unit {block} (part attn): input" in text
    assert any(line.split()[:2] == [f"{block}/cpe", "match"] for line in text.splitlines()), text


def test_ravlt_backward_bug_in_one_part_diverges_at_that_part(monkeypatch):
    """RaViT-T reduced in float32 (layers.0.blocks.0's own bound void for its gradients, relative 0.13, so it is
    judged part by part: cpe / attn / mlp) with that block's attention output carrying its gradient times 1 + 1e-2
    (forward exact: every forward unit matches).  With no float32 member (the bounds alone, as for a block whose
    bound is void): the block diverges in its "attn" part, by the part's input gradient and the gradients of the
    attention's and norm1's parameters (by their state_dict keys) and of nothing else; its "cpe" part, fed the
    wrong cotangent that reached the located intermediate, and its "mlp" part match; every other unit matches (the
    stem differentiates its wrong cotangent correctly)."""
    from refimpl.verify import unit_gradients
    name, block = "ravlt_t", "layers.0.blocks.0"

    def no_member(*_a, **_k):
        raise RuntimeError("no member in this test")
    monkeypatch.setattr(unit_gradients, "round_to", no_member)
    bad = V.verify(_net(name, bug_block=block + ".attn", factor=1 + 1e-2), name, config={"reduced": True},
                   dtype="float32", grad=True)
    g = bad.gradients
    assert all(s.verdict == "match" for s in bad.stages), str(bad)
    u = _units(bad)
    assert g["units_verdict"] == "diverges" and [k for k, e in u.items() if e["verdict"] == "diverges"] == [block]
    cpe, attn, mlp = u[block]["parts"]
    assert (cpe["part"], attn["part"], mlp["part"]) == ("cpe", "attn", "mlp"), u[block]
    assert cpe["verdict"] == "match" and mlp["verdict"] == "match" and attn["verdict"] == "diverges", u[block]
    assert attn["err_over_bound"] > 1.0 and attn["input"].endswith("(by value)")
    keys = _twin_keys(name)
    attn_keys = {k for k in keys if k.startswith((block + ".attn.", block + ".norm1."))}
    assert attn["diverging"][0] == "input" and set(attn["diverging"]) == {"input"} | attn_keys, attn["diverging"]
    assert u[block]["diverging"] == attn["diverging"]
    fd = g["units_first_divergence"]
    assert fd["unit"] == block and fd["part"] == "attn" and fd["tensor"] == "input", fd
    assert "first divergence in part 'attn'" in u[block]["why"]
    assert all(e["verdict"] == "match" for k, e in u.items() if k != block), g["units"]
    text = bad.gradients_text()
    assert f"first divergence at unit {block} (part attn): input" in text
    assert any(line.split()[:2] == [f"{block}/attn", "diverges"] for line in text.splitlines()), text
    assert any(line.split()[:2] == [f"{block}/cpe", "match"] for line in text.splitlines()), text


def test_network_parameter_held_as_a_buffer_is_not_compared():
    """A reference parameter that the foreign network holds as a buffer (same key, no gradient) is listed as "not
    compared" and the other tensors are judged as usual."""
    import torch
    m = _net("lisanet_i_t")
    value = m.pos_embed.detach().clone()
    del m.pos_embed
    m.register_buffer("pos_embed", value)
    r = V.verify(m, "lisanet_i_t", config={"reduced": True}, dtype="float64", grad=True)
    assert isinstance(m.pos_embed, torch.Tensor) and r.verdict == "match", str(r)
    t = _grads(r)["pos_embed"]
    assert t["verdict"] == "not compared" and "buffer" in t["detail"]
    assert all(x["verdict"] == "match" for x in r.gradients["tensors"] if x["name"] != "pos_embed")
