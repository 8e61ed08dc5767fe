"""The torch ensemble of a registered network, unit by unit (refimpl.verify.ensemble.unit_members): each unit's
comparison is also judged against the network's twin in the tested dtype, run teacher-forced on the input the
foreign network's unit received, plainly and under every variant of refimpl.ensemble.DEFAULT_VARIANTS (a unit
judged part by part: the twin's parts likewise).  A correct network matches with it and its report lists the
members of every unit; ``ensemble=False`` is the NumPy naive run and the random-rounding model only (the report as
before); a unit bug just above the legitimate error, inside the unit's bound, is caught only with the twin's
members.  The foreign networks are the twins of tests/verify_gallery/network_twins.py in the reduced
configuration of Castling-DeiT (two blocks: blocks.0 is judged part by part in float32, its own bound void)."""

from __future__ import annotations

import json

import pytest
import torch

from refimpl import cli
from refimpl import config
from refimpl import ensemble as E
from refimpl import verify as V
from refimpl.verify import ensemble as VE
from tests.test_bound_tightness import TIGHTNESS_MARGIN
from tests.verify_gallery.network_twins import twin

NAME = "castling_deit_t"
KW = dict(config={"reduced": True}, dtype="float32")
#: the members compare() forms itself, without a torch ensemble
OWN = {"numpy naive", "final rounding", "rounding model", "reference's own error"}
STATUSES = ("used", "outside the bound: not used", "equal to the tested output bit for bit: dropped")
#: The planted defects' size, a scenario: the blend's largest error BUG_OVER_THRESHOLD times the threshold the
#: twin's members set (just above the legitimate error: caught by the ensemble, far inside the bound).
BUG_OVER_THRESHOLD = 4.0
#: Measured with the calls below (seed 0), measurements and not tolerances, checked within the tightness suite's
#: TIGHTNESS_MARGIN from both sides: the logits' ensemble threshold without the twin's members over the one with
#: them, and the blended unit's err/bound (how far inside the unit's bound a defect the ensemble catches lies).
LOGITS_THRESHOLD_RATIO = 1.44e12
BLEND_ERR_OVER_BOUND = 4.90e-5


def _near(x, measured, what) -> None:
    assert measured / TIGHTNESS_MARGIN <= x <= TIGHTNESS_MARGIN * measured, (what, x, measured)


def _used(e: dict) -> set:
    return {k for k, m in e["members"].items() if m["status"] == "used"}


def _without_ensemble(d: dict) -> dict:
    """The report without what the twin's members add: the ensembles, and the logits comparison's notes on its
    members (dropped bit for bit, outside the bound)."""
    d = {k: v for k, v in d.items() if k != "ensemble"}
    d["stages"] = [{k: v for k, v in s.items() if k != "ensemble"} for s in d["stages"]]
    d["whole_module"] = {k: v for k, v in d["whole_module"].items() if k != "ensemble"}
    d["whole_module"]["reasons"] = [r for r in d["whole_module"]["reasons"] if not r.startswith("ensemble member")]
    return d


def _md_ensemble(md: str) -> dict[str, list[str]]:
    """The rows of the Markdown report's ensemble table: compared -> the other cells."""
    sec = md.split("## Ensemble", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in sec.splitlines() if ln.startswith("| ")]
    assert rows[0] == ["compared", "zmax", "zmax threshold", "zrms", "zrms threshold", "worst member (zmax; zrms)",
                       "members used (zmax, zrms)", "dropped"], rows[0]
    return {r[0]: r[1:] for r in rows[1:]}


@pytest.fixture(scope="module")
def correct():
    return V.verify(twin(NAME), NAME, **KW)


def test_a_correct_network_matches_with_the_twin_ensemble_and_lists_the_members_of_every_unit(correct):
    r = correct
    assert r.verdict == "match" and all(s.verdict == "match" for s in r.stages), str(r)
    en = r.ensemble
    assert en["torch"] and en["twin"].endswith("DeiT") and not en["failed"], en
    assert set(en["members"]) == {VE.PLAIN, *E.DEFAULT_VARIANTS} and en["seconds"] > 0, en
    assert not en["stages_without_members"], en["stages_without_members"]
    for s in r.stages:
        e = s.ensemble
        # every twin member is listed with its statistics or why it was dropped; the foreign network is the twin
        # itself, so its plain run is the tested output bit for bit
        assert {VE.PLAIN, *E.DEFAULT_VARIANTS} <= set(e["members"]), (s.name, e)
        assert all(m["status"] in STATUSES for m in e["members"].values()), (s.name, e)
        assert e["members"][VE.PLAIN]["status"] == "equal to the tested output bit for bit: dropped", (s.name, e)
        assert _used(e) & set(E.ORDERS), (s.name, e)
        assert e["zmax"] <= e["zmax_threshold"] and e["zrms"] <= e["zrms_threshold"], (s.name, e)
    # the block whose own bound is void in float32: judged part by part, each part with the twin's part members
    blk = r.stages[[s.name for s in r.stages].index("blocks.0")]
    assert "stage-wise" in blk.detail and set(blk.ensemble["parts"]) == {"attn", "mlp"}, blk
    assert all(_used(p) & set(E.ORDERS) for p in blk.ensemble["parts"].values()), blk.ensemble["parts"]
    json.dumps(r.as_dict())
    text, md = str(r), r.to_markdown()
    assert "ensemble: refimpl's PyTorch twin" in text and "  blocks.1: zmax" in text, text
    assert "## Ensemble" in md and "| blocks.1 |" in md and "| head |" in md, md


def test_the_parts_ensembles_and_the_worst_members_are_in_the_markdown_and_the_terminal(correct):
    """The ensemble of each part of blocks.0 (judged part by part; the JSON's ``stages[1].ensemble.parts``) is a
    row "blocks.0/attn", "blocks.0/mlp" of the Markdown ensemble table after the unit's own, with its zmax, zrms,
    thresholds, and the members used with the largest zmax and zrms (the ones that set the thresholds); the
    terminal has the same lines."""
    r = correct
    md, text = r.to_markdown(), str(r)
    rows = _md_ensemble(md)
    names = list(rows)
    assert names.index("blocks.0") + 1 == names.index("blocks.0/attn") == names.index("blocks.0/mlp") - 1, names
    parts = r.as_dict()["stages"][1]["ensemble"]["parts"]
    for q, e in [("blocks.0", r.stages[1].ensemble)] + [(f"blocks.0/{k}", v) for k, v in parts.items()]:
        used = {k: m for k, m in e["members"].items() if m["status"] == "used"}
        wmax = max(used, key=lambda k: used[k]["zmax"])
        wrms = max(used, key=lambda k: used[k]["zrms"])
        # the worst members set the thresholds: F x their statistic
        assert e["zmax_threshold"] == config.VERDICT_MAX_FACTOR * used[wmax]["zmax"]      # the same product
        assert e["zrms_threshold"] == config.VERDICT_RMS_FACTOR * used[wrms]["zrms"]
        assert rows[q][:5] == [f"{e['zmax']:.3g}", f"{e['zmax_threshold']:.3g}", f"{e['zrms']:.3g}",
                               f"{e['zrms_threshold']:.3g}", f"{wmax}; {wrms}"], (q, rows[q])
        assert f"  {q}: zmax {e['zmax']:.3g} (threshold {e['zmax_threshold']:.3g})" in text, text
        assert f"members used, worst {wmax} (zmax), {wrms} (zrms)" in text.split(f"  {q}: zmax", 1)[1].split("\n")[0]


def test_the_logits_are_judged_against_the_twins_whole_forward(correct):
    """The logits comparison's members: the twin's whole forward on the same images, plainly (the tested network
    is the twin: bit for bit, dropped) and under every variant; listed in ``whole_module.ensemble``, the Markdown
    ensemble table's "whole module" row, and the report's members."""
    e = correct.whole_module["ensemble"]
    assert {VE.PLAIN, *E.DEFAULT_VARIANTS} <= set(e["members"]), e
    assert e["members"][VE.PLAIN]["status"] == "equal to the tested output bit for bit: dropped", e
    assert _used(e) & set(E.ORDERS) and "rounding model" not in e["members"], e
    assert e["zmax"] <= e["zmax_threshold"] and e["zrms"] <= e["zrms_threshold"], e
    assert "whole module" in _md_ensemble(correct.to_markdown())
    assert "logits" in correct.ensemble["per"] and not correct.ensemble["failed"], correct.ensemble


def _blended_logits(t: float):
    """The twin with its logits blended towards a batch-state bug after the network's forward (item 0 gets item
    1's logits), in the network's precision."""
    m = twin(NAME)
    m.register_forward_hook(lambda _m, _inp, y: y if t == 0.0 else y + t * (torch.cat([y[1:2], y[1:]]) - y))
    return m


def test_a_logits_defect_just_above_the_legitimate_error_diverges_there_only_with_the_twins_logits_members():
    """t chosen from the measured ensemble: the blend's largest logits error BUG_OVER_THRESHOLD x the threshold the
    twin's logits members set.  The logits' own bound is void (the network's depth): without the twin's members the
    logits are judged by the NumPy naive run and the random-rounding model (threshold LOGITS_THRESHOLD_RATIO x
    larger) and are inconclusive;
    with them the logits comparison diverges."""
    kw = dict(KW, batch=2)
    thr = V.verify(_blended_logits(0.0), NAME, **kw).whole_module["ensemble"]["zmax_threshold"]
    z1 = V.verify(_blended_logits(1.0), NAME, ensemble=False, **kw).whole_module["ensemble"]["zmax"]
    t = BUG_OVER_THRESHOLD * thr / z1
    r = V.verify(_blended_logits(t), NAME, **kw)
    wm = r.whole_module
    assert r.verdict == "diverges" and wm["verdict"] == "diverges", str(r)
    assert wm["max_relative_bound"] >= 1 and wm["ensemble"]["zmax"] > wm["ensemble"]["zmax_threshold"], wm
    assert any("legitimate evaluations" in x for x in wm["reasons"]), wm["reasons"]
    plain = V.verify(_blended_logits(t), NAME, ensemble=False, **kw).whole_module
    assert plain["verdict"] == "inconclusive" and plain["ensemble"]["zmax"] == wm["ensemble"]["zmax"], plain
    _near(plain["ensemble"]["zmax_threshold"] / wm["ensemble"]["zmax_threshold"], LOGITS_THRESHOLD_RATIO,
          "logits threshold without / with the twin's members")


def test_no_ensemble_gives_the_report_without_twin_members(correct, capsys):
    plain = V.verify(twin(NAME), NAME, ensemble=False, **KW)
    assert plain.verdict == "match" and plain.ensemble["torch"] is False, plain.ensemble
    assert "not asked for" in plain.ensemble["why"] and "random-rounding model" in plain.ensemble["why"]
    assert all(s.ensemble is None for s in plain.stages), plain.stages
    # everything else (verdicts, errors, bounds, the logits) as with the ensemble: its bound part does not depend on it
    assert _without_ensemble(plain.as_dict()) == _without_ensemble(correct.as_dict())
    # verify_network called directly keeps its former behaviour; the command line's --no-ensemble is the same
    direct = V.verify_network(twin(NAME), NAME, **KW)
    assert direct.as_dict() == plain.as_dict()
    args = ["verify", "tests.verify_gallery.network_twins:twin", "--reference", NAME, "--init",
            json.dumps({"name": NAME}), "--config", '{"reduced": true}', "--json", "-", "--no-ensemble"]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(plain.to_json())
    with pytest.raises(V.VerifyError, match="argument 'ensemble': expected True or False, got 1"):
        V.verify(twin(NAME), NAME, ensemble=1, **KW)


def _blended(t: float, unit: str = "blocks.1"):
    """The twin with ``unit``'s output blended towards a batch-state bug: y + t (y_bug - y), where y_bug gives
    batch item 0 item 1's output (a state shared across the batch), in the network's precision."""
    m = twin(NAME)

    def hook(_m, _inp, y):
        return y if t == 0.0 else y + t * (torch.cat([y[1:2], y[1:]]) - y)
    dict(m.named_modules())[unit].register_forward_hook(hook)
    return m


def test_a_unit_bug_just_above_the_legitimate_error_is_caught_only_with_the_twin_ensemble():
    """t chosen from the measured ensemble: the blend's largest error BUG_OVER_THRESHOLD x the threshold the twin's
    members of the unit set (F x their largest).  It is far inside the unit's bound (err/bound
    BLEND_ERR_OVER_BOUND) and passes the NumPy naive + rounding-model
    ensemble; the twin's members catch it at that unit, and only there."""
    unit, kw = "blocks.1", dict(KW, batch=2)

    def at(r):
        return r.stages[[s.name for s in r.stages].index(unit)]
    thr = at(V.verify(_blended(0.0), NAME, **kw)).ensemble["zmax_threshold"]
    z1 = at(V.verify(_blended(1.0), NAME, **kw)).ensemble["zmax"]
    t = BUG_OVER_THRESHOLD * thr / z1
    r = V.verify(_blended(t), NAME, **kw)
    s = at(r)
    assert r.verdict == "diverges" and r.first_divergence["stage"] == unit, str(r)
    assert "legitimate evaluations" in s.detail, s.detail
    _near(s.err_over_bound, BLEND_ERR_OVER_BOUND, "the blend's err/bound")
    assert s.ensemble["zmax"] > s.ensemble["zmax_threshold"] and _used(s.ensemble) - OWN, s.ensemble
    assert [x.name for x in r.stages if x.verdict != "match"] == [unit], str(r)
    plain = V.verify(_blended(t), NAME, ensemble=False, **kw)
    assert plain.verdict == "match" and at(plain).err_over_bound == s.err_over_bound, str(plain)


def test_without_a_network_twin_or_with_a_failing_member_the_report_says_so(monkeypatch):
    """No twin can be built (its keys do not fit the weights, as ``--grad`` would say): the units are judged by the
    NumPy naive run and the random-rounding model and the report says why.  A variant that raises on one unit (an
    op with no kernel in the precision) is left out there alone and named."""
    from refimpl.verify import network_gradients

    def no_twin(cfg, params):
        raise V.VerifyError("argument 'grad': no PyTorch twin of the network (test)")
    with monkeypatch.context() as mp:
        mp.setattr(network_gradients, "_build_twin", no_twin)
        r = V.verify(twin(NAME), NAME, **KW)
    assert r.verdict == "match" and r.ensemble["torch"] is False, r.ensemble
    assert r.ensemble["why"].startswith("no PyTorch twin of the network (test)"), r.ensemble
    assert all(set(s.ensemble["members"]) <= OWN for s in r.stages), [s.ensemble for s in r.stages]
    assert "the NumPy naive run and the random-rounding model" in str(r)
    inner = E.legitimate_runs

    def flaky(fn, variants):
        if "libm" in variants and fn.__closure__ and any(getattr(c, "cell_contents", None) == "head"
                                                         for c in fn.__closure__):
            raise RuntimeError("no kernel for this dtype")
        return inner(fn, variants)
    monkeypatch.setattr(E, "legitimate_runs", flaky)
    r = V.verify(twin(NAME), NAME, **KW)
    assert r.verdict == "match" and r.ensemble["torch"] and list(r.ensemble["failed"]) == ["libm (head)"], r.ensemble
    assert "no kernel" in r.ensemble["failed"]["libm (head)"] and "libm" in r.ensemble["members"]
    head = r.stages[-1].ensemble["members"]
    assert "libm" not in head and "recursive" in head, head


def test_shadow_units_are_judged_with_the_twins_members_on_the_references_input():
    """Shadow mode: each unit's submodule on the reference's own input is judged with the twin's unit (or parts)
    on that same input as the ensemble, listed with the unit's "(shadow)" rows in the Markdown ensemble table.
    A blend of blocks.1 towards a batch-state bug, its shadow error 4x the threshold the twin's members set there,
    diverges in the shadow run only with those members (without them: the NumPy naive run and the rounding model)."""
    unit, kw = "blocks.1", dict(KW, batch=2, shadow=True)

    def at(r):
        return r.shadow[[s.name for s in r.shadow].index(unit)]
    r0 = V.verify(_blended(0.0), NAME, **kw)
    assert r0.verdict == "match", str(r0)
    judged = [s for s in r0.shadow if s.verdict != "not shadowed"]
    assert unit in [s.name for s in judged], [(s.name, s.verdict, s.detail) for s in r0.shadow]
    for s in judged:
        assert {VE.PLAIN, *E.DEFAULT_VARIANTS} <= set(s.ensemble["members"]), (s.name, s.ensemble)
        assert _used(s.ensemble) & set(E.ORDERS), (s.name, s.ensemble)
    assert f"{unit} (shadow)" in _md_ensemble(r0.to_markdown())
    thr = at(r0).ensemble["zmax_threshold"]
    t = BUG_OVER_THRESHOLD * thr / at(V.verify(_blended(1.0), NAME, **kw)).ensemble["zmax"]
    r = V.verify(_blended(t), NAME, **kw)
    assert at(r).verdict == "diverges" and r.verdict == "diverges", str(r)
    assert at(r).ensemble["zmax"] > at(r).ensemble["zmax_threshold"] and _used(at(r).ensemble) - OWN, at(r).ensemble
    plain = V.verify(_blended(t), NAME, ensemble=False, **kw)
    assert at(plain).verdict == "match", str(plain)
