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
from tests.verify_gallery.castling_port import PortCastling
from tests.verify_gallery.grad_port import GradCastling, GradL2ViT
from tests.verify_gallery.l2vit_port import PortL2ViTAttention

GRAD_PORT = os.path.join(os.path.dirname(__file__), "verify_gallery", "grad_port.py")
HW = (6, 6)


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
        assert t["ok"] and 0.0 <= t["err_over_bound"] < 0.1, t      # measured <= 3e-3 (docs/verify.md)
        assert 0.0 < t["bound"] < float("inf")
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
    assert all(t["err_over_bound"] < 0.1 for t in r.gradients["tensors"]), str(r)


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
    with pytest.raises(V.VerifyError, match=r"argument 'grad': .*layer references.*got a registered network"):
        V.verify(None, "ravlt_t", grad=True)
    with pytest.raises(V.VerifyError, match=r"argument 'grad': .*layer references"):
        V.verify_examples(None, "ravlt_t", 2, grad=True)


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
    assert rep["schema_version"] == V.SCHEMA_VERSION == 3 and rep["verdict"] == "match"
    for t in rep["gradients"]["tensors"]:
        assert set(t) >= {"name", "max_abs_err", "max_rel_err", "bound", "err_over_bound", "ok"} and t["ok"]
    md = tmp_path / "r.md"
    code = cli.main(base + ["--init", json.dumps({**init, "bug": "linear_dx_transposed"}), "--report", str(md)])
    assert code == 1
    out = capsys.readouterr().out
    assert "first gradient divergence" in out and "input" in out
    assert "## Gradients" in md.read_text() and "| input | input | diverges |" in md.read_text()
    assert cli.main(["verify", f"{GRAD_PORT}:GradL2ViT", "--reference", "ravlt_t", "--grad"]) == 2
    assert "layer references" in capsys.readouterr().err
    # without --grad the report has no gradient section
    assert cli.main(base[:-1] + ["--init", json.dumps(init), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["gradients"] is None
