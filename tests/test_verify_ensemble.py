"""The verifier's ensemble of legitimate evaluations (refimpl.verify.ensemble): refimpl's PyTorch twin of the
reference, loaded with the module's mapped weights in the tested dtype and re-run under refimpl.ensemble's
variants (whole module, and per stage teacher-forced), judges the module's error.  A correct port matches with
it; a planted bug just above the legitimate error is caught with it and passes the looser NumPy naive +
random-rounding-model ensemble (``--no-ensemble``), whose threshold is the larger."""

from __future__ import annotations

import json
import os

import pytest
import torch

from refimpl import cli
from refimpl import ensemble as E
from refimpl import verify as V
from refimpl.verify import ensemble as VE
from tests.verify_gallery.flatten_port import PortFocusedAttention

GALLERY = os.path.join(os.path.dirname(__file__), "verify_gallery", "flatten_port.py")
#: the members compare() forms itself, without a torch ensemble
OWN = {"numpy naive", "final rounding", "rounding model", "reference's own error"}


def _port(**kw):
    return PortFocusedAttention(16, 2, sr_ratio=2, n_kv=16, **kw)


class _Blended(PortFocusedAttention):
    """A port whose output is the correct one blended towards a planted bug: y + t (y_bug - y), with the bug
    "batch_state" (item 0's attention reads item 1's K and V), computed in the module's precision.  The correct
    forward runs first, so the stage tensors the verifier hooks are the correct run's: only the output carries
    the bug."""

    def __init__(self, t: float):
        super().__init__(16, 2, sr_ratio=2, n_kv=16)
        self.t = t

    def forward(self, x, H, W):
        y = super().forward(x, H, W)
        if self.t == 0.0:
            return y
        self.bug = "batch_state"
        try:
            yb = super().forward(x, H, W)
        finally:
            self.bug = None
        return y + self.t * (yb - y)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_correct_port_matches_with_the_twin_ensemble(dtype):
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype=dtype)
    assert r.verdict == "match" and all(s.verdict == "match" for s in r.stages), str(r)
    en = r.ensemble
    assert en["torch"] and en["twin"].endswith("FocusedLinearAttention") and not en["failed"], en
    assert set(en["members"]) == {VE.PLAIN, *E.DEFAULT_VARIANTS} and en["seconds"] > 0
    whole = r.whole_module["ensemble"]["members"]
    assert set(whole) == OWN - {"rounding model", "reference's own error"} | set(en["members"]), whole
    # with two or more distinct evaluations the random-rounding model is not a member; every twin member is listed
    # with its statistics or with why it was dropped
    for name in en["members"]:
        assert whole[name]["status"] in ("used", "outside the bound: not used",
                                         "equal to the tested output bit for bit: dropped"), whole[name]
    # stage by stage: teacher-forced twin members for every stage of this layout
    assert not en["stages_without_members"], en["stages_without_members"]
    used = {s.name: {k for k, m in s.ensemble["members"].items() if m["status"] == "used"} for s in r.stages}
    # (in float16 the four summation orders of a stage often coincide with the port bit for bit: dropped)
    assert all(used[n] - OWN for n in (("sr", "attention", "dwc") if dtype == "float32" else ("q", "phi_q", "dwc"))), used
    json.dumps(r.as_dict())
    text, md = str(r), r.to_markdown()
    assert "ensemble: refimpl's PyTorch twin" in text and "## Ensemble" in md and "| whole module |" in md


def test_a_bug_just_above_the_legitimate_error_is_caught_only_with_the_twin_ensemble():
    """t chosen from the measured ensemble: the blend's largest error 4x the threshold the twin's members set
    (benchmarks/verdict_measure.py's blend).  Inside the bound, it passes the NumPy naive + rounding-model
    ensemble, whose threshold is larger; the twin's ensemble catches it."""
    kw = dict(hw=(8, 8), dtype="float32")
    thr = V.verify(_Blended(0.0), "flatten.attention", **kw).whole_module["ensemble"]["zmax_threshold"]
    z1 = V.verify(_Blended(1.0), "flatten.attention", **kw).whole_module["ensemble"]["zmax"]
    t = 4.0 * thr / z1
    r = V.verify(_Blended(t), "flatten.attention", **kw)
    plain = V.verify(_Blended(t), "flatten.attention", ensemble=False, **kw)
    w, wp = r.whole_module, plain.whole_module
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "output", str(r)
    assert w["err_over_bound"] <= 1.0 and any("legitimate evaluations" in s for s in w["reasons"]), w["reasons"]
    assert all(s.verdict == "match" for s in r.stages), str(r)
    # the point of the torch ensemble: a tighter threshold on the same output, which the looser one passes
    assert w["ensemble"]["zmax_threshold"] < wp["ensemble"]["zmax_threshold"], (w["ensemble"], wp["ensemble"])
    assert w["ensemble"]["zmax"] == wp["ensemble"]["zmax"]
    assert plain.verdict == "match", str(plain)


def test_no_ensemble_judges_by_the_naive_run_and_the_rounding_model(capsys):
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype="float32", ensemble=False)
    assert r.verdict == "match" and r.ensemble["torch"] is False and "not asked for" in r.ensemble["why"]
    assert set(r.whole_module["ensemble"]["members"]) == {"numpy naive", "final rounding", "rounding model"}
    assert all(set(s.ensemble["members"]) <= OWN for s in r.stages)
    full = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype="float32")
    # the bound part of each comparison does not depend on the ensemble
    assert [s.err_over_bound for s in r.stages] == [s.err_over_bound for s in full.stages]
    assert r.whole_module["err_over_bound"] == full.whole_module["err_over_bound"]
    args = ["verify", f"{GALLERY}:PortFocusedAttention", "--reference", "flatten.attention", "--init",
            '{"dim": 16, "heads": 2, "sr_ratio": 2, "n_kv": 16}', "--hw", "8,8", "--json", "-", "--no-ensemble"]
    assert cli.main(args) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(r.to_json())


def test_without_a_twin_the_report_says_so(monkeypatch):
    """A rectangular shifted window runs its twin (the window twins take (wh, ww) windows); a twin that raises (as
    an op with no kernel in the precision would): the naive run and the rounding model remain, and the report
    says why."""
    from refimpl.verify import gradients
    from tests.verify_gallery.swin_port import PortShiftedWindowAttention
    rect = PortShiftedWindowAttention(16, 2, window_size=(2, 4), shift_size=(1, 2), input_resolution=(4, 8))
    r = V.verify(rect, "softmax.window_attention", dtype="float32")
    assert r.verdict == "match" and r.ensemble["torch"] is True, r.ensemble
    build = gradients.TWINS["flatten.attention"]

    def broken(s):
        m, _ = build(s)

        def fwd(x):
            raise RuntimeError("no kernel for this dtype")
        return m, fwd
    monkeypatch.setitem(gradients.TWINS, "flatten.attention", broken)
    r = V.verify(_port(), "flatten.attention", hw=(8, 8), dtype="float32")
    assert r.verdict == "match" and r.ensemble["torch"] is False, r.ensemble
    assert set(r.ensemble["failed"]) == {VE.PLAIN, *E.DEFAULT_VARIANTS} and "no kernel" in r.ensemble["why"]
    assert "rounding model" in r.whole_module["ensemble"]["members"]
    assert "the NumPy naive run and the random-rounding model" in str(r)


def test_lisa_in_half_precision_gets_the_twin_ensemble():
    """LiSA's twin computes its FFT convolutions in float32 below it (no half-precision FFT on the CPU), as the
    port does: a torch ensemble for the whole module and every stage."""
    from tests.verify_gallery.lisa_port import PortLiSA
    r = V.verify(PortLiSA(8, 2, (4, 3), 3), "lisa.attention", dtype="float16")
    assert r.verdict == "match" and r.ensemble["torch"] and not r.ensemble["failed"], r.ensemble
    assert not r.ensemble["stages_without_members"], r.ensemble


def test_the_ensemble_argument_is_checked_and_the_stage_ensemble_lives_in_the_package():
    with pytest.raises(V.VerifyError, match="argument 'ensemble': expected True or False, got 'yes'"):
        V.verify(_port(), "flatten.attention", hw=(8, 8), ensemble="yes")
    from equivalence import assertions
    assert assertions.stage_ensemble is E.stage_ensemble


class _ScaledItem(PortFocusedAttention):
    """A port whose output projection scales batch item 0 by (1 + t) (a forward hook on ``to_out``, so the stage
    "proj" observed by the verifier carries it)."""

    def __init__(self, t: float):
        super().__init__(16, 2, sr_ratio=2, n_kv=16)
        self.t = t

        def hook(_m, _inp, out):
            return out if self.t == 0.0 else torch.cat([out[:1] * (1.0 + self.t), out[1:]])
        self.to_out.register_forward_hook(hook)


def test_a_small_stage_bug_is_caught_by_the_teacher_forced_twin_members():
    """The stage-wise ensemble: the twin forced with the port's own stage tensors gives each stage legitimate
    members.  A scale error of batch item 0 at "proj" whose RMS is 2x the RMS threshold they set (t from the
    measured ensemble), inside the stage's bound, diverges there; the NumPy naive + rounding-model ensemble's RMS
    threshold is larger and passes it."""
    kw = dict(hw=(8, 8), dtype="float32")

    def proj(r):
        return next(s for s in r.stages if s.name == "proj")
    e0 = proj(V.verify(_ScaledItem(0.0), "flatten.attention", **kw)).ensemble
    assert {k for k, m in e0["members"].items() if m["status"] == "used"} - OWN, e0
    t = 2.0 * e0["zrms_threshold"] / proj(V.verify(_ScaledItem(1.0), "flatten.attention", **kw)).ensemble["zrms"]
    r = V.verify(_ScaledItem(t), "flatten.attention", **kw)
    st = proj(r)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "proj", str(r)
    assert st.err_over_bound <= 1.0 and "legitimate evaluations" in st.detail, st.detail
    plain = proj(V.verify(_ScaledItem(t), "flatten.attention", ensemble=False, **kw))
    assert st.ensemble["zrms_threshold"] < plain.ensemble["zrms_threshold"], (st.ensemble, plain.ensemble)
    assert plain.verdict == "match", plain.detail
