"""The units of a network verified unit by unit, and the parts of a unit judged part by part, in the verify tool's
reports: ``stages[i].parts`` in the JSON, the "Units and their parts" section of the Markdown report (``--report``)
and the compact summary of the terminal (rich table, or ``print(report)``).  The foreign networks are the twins of
tests/verify_gallery/network_twins.py in the reduced configuration of Castling-DeiT (two blocks; in float32
blocks.0's own bound is void and it is judged part by part: its attention and MLP residual branches), with a
planted bug in one branch (a forward hook scaling the branch's output by 1 + 1e-3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refimpl import cli
from refimpl import config
from refimpl import verify as V
from refimpl.verify import networks as VN
from refimpl.verify.report import Report, StageResult
from tests.verify_gallery.network_twins import twin

NAME = "castling_deit_t"
KW = dict(config={"reduced": True}, dtype="float32", ensemble=False)
TARGET = "tests.verify_gallery.network_twins:twin"
UNITS = ["stem", "blocks.0", "blocks.1", "head"]


def _md_rows(md: str) -> dict[str, list[str]]:
    """The rows of the Markdown report's "Units and their parts" table: name -> the other cells."""
    sec = md.split("## Units and their parts", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in sec.splitlines() if ln.startswith("| ")]
    assert rows[0] == ["unit / part", "observed at", "verdict", "worst err / bound", "first divergence"], rows[0]
    return {r[0]: r[1:] for r in rows[1:]}


def _md_order(md: str) -> list[str]:
    sec = md.split("## Units and their parts", 1)[1].split("\n## ", 1)[0]
    return [ln.split("|")[1].strip() for ln in sec.splitlines() if ln.startswith("| ")][1:]


def test_a_correct_network_lists_every_unit_and_part_in_the_reference_order():
    r = V.verify(twin(NAME), NAME, **KW)
    assert r.verdict == "match", str(r)
    d = r.as_dict()
    assert d["schema_version"] == V.SCHEMA_VERSION == 5
    assert [s["name"] for s in d["stages"]] == UNITS
    blk = d["stages"][1]
    assert [q["name"] for q in blk["parts"]] == ["attn", "mlp"] and all(q["ok"] for q in blk["parts"]), blk
    assert set(blk["parts"][0]) == {"name", "foreign", "verdict", "ok", "max_abs_err", "max_rel_err", "bound",
                                    "err_over_bound", "detail"}
    assert blk["parts"][0]["foreign"].endswith("(by value)") and blk["parts"][1]["foreign"] == blk["foreign"]
    # the unit's worst err/bound is its worst part's; the units judged as a whole have no parts
    assert blk["err_over_bound"] == max(q["err_over_bound"] for q in blk["parts"]) < 1
    assert all(d["stages"][i]["parts"] is None for i in (0, 2, 3))
    md = r.to_markdown()
    assert _md_order(md) == ["stem", "blocks.0", "blocks.0/attn", "blocks.0/mlp", "blocks.1", "head"]
    rows = _md_rows(md)
    for s in r.stages:
        assert rows[s.name][1:] == ["match", f"{s.err_over_bound:.3g}", "-"], (s.name, rows[s.name])
    for q in r.stages[1].parts:
        assert rows[f"blocks.0/{q.name}"] == [q.foreign, "match", f"{q.err_over_bound:.3g}", "-"]
    assert ("units: 4 (4 match); parts of the units judged part by part (their own bound void in float32, or the unit "
            "diverging): 2 (2 match)") in md
    # the terminal (plain text): all six rows, fewer than config.VERIFY_SUMMARY_ROWS
    text = str(r)
    assert all(f"\n{n} " in text for n in _md_order(md)) and "more units and parts match" not in text, text


@pytest.mark.parametrize("branch,other", [("attn", "mlp"), ("mlp", "attn")])
def test_a_bug_in_one_part_diverges_at_that_part_in_the_json_the_markdown_and_the_terminal(branch, other, tmp_path,
                                                                                          capsys):
    """The bug in blocks.0's ``branch`` (inside the unit's void bound): blocks.0 diverges with its first divergence
    at that part; its other part, judged on the foreign block's own intermediate, matches."""
    out, js = tmp_path / "r.md", tmp_path / "r.json"
    init = {"name": NAME, "bug_unit": f"blocks.0.{branch}", "bug_rel": 1e-3}
    code = cli.main(["verify", TARGET, "--reference", NAME, "--init", json.dumps(init), "--config",
                     '{"reduced": true}', "--no-ensemble", "--report", str(out), "--json", str(js)])
    term = capsys.readouterr().out
    assert code == 1, term
    rep = json.loads(js.read_text())
    assert rep["first_divergence"]["stage"] == "blocks.0" and f"part {branch!r}" in rep["first_divergence"]["why"]
    parts = {q["name"]: q for q in rep["stages"][1]["parts"]}
    assert parts[branch]["verdict"] == "diverges" and parts[other]["verdict"] == "match", parts
    rows = _md_rows(out.read_text())
    assert rows["blocks.0"][1] == "diverges" and rows["blocks.0"][3] == f"blocks.0/{branch}", rows["blocks.0"]
    assert rows[f"blocks.0/{branch}"][1:] == ["diverges", f"{parts[branch]['err_over_bound']:.3g}",
                                              f"blocks.0/{branch}"], rows
    assert rows[f"blocks.0/{other}"][1] == "match" and rows[f"blocks.0/{other}"][3] == "-", rows
    assert all(rows[u][1] == "match" and rows[u][3] == "-" for u in ("stem", "blocks.1", "head")), rows
    # the terminal's rich table: the same rows (six, so all of them), the diverging part with its stage
    lines = [ln for ln in term.splitlines() if f"blocks.0/{branch}" in ln]
    assert any("diverges" in ln for ln in lines) and "units: 4 (3 match, 1 diverges)" in term, term


def test_a_part_whose_input_is_not_located_diverges_and_the_parts_after_it_are_not_judged(monkeypatch):
    """No tensor of the block's forward is taken for the attention branch's output (the locating step finds
    none): the block diverges at its first part; the MLP part, with no input to judge it on, is "not judged"."""
    monkeypatch.setattr(VN, "locate", lambda *a, **k: None)
    r = V.verify(twin(NAME), NAME, **KW)
    blk = r.stages[1]
    assert r.verdict == "diverges" and r.first_divergence["stage"] == "blocks.0", str(r)
    assert "part 'attn': no tensor of the unit's forward" in blk.detail, blk.detail
    assert [(q.name, q.verdict) for q in blk.parts] == [("attn", "diverges"), ("mlp", "not judged")], blk.parts
    rows = _md_rows(r.to_markdown())
    assert rows["blocks.0/attn"] == ["-", "diverges", "-", "blocks.0/attn"], rows
    assert rows["blocks.0/mlp"] == ["-", "not judged", "-", "-"] and rows["blocks.0"][3] == "blocks.0/attn", rows
    assert json.loads(r.to_json())["stages"][1]["parts"][1]["verdict"] == "not judged"


def test_the_shadow_runs_parts_are_listed_after_the_units_own_parts_and_labelled():
    """With shadow=True blocks.0 (its own bound void in float32) is judged part by part in the shadow run too:
    its parts there are the JSON's ``stages[1].shadow.parts`` and rows "blocks.0/attn (shadow)", "blocks.0/mlp
    (shadow)" of the Markdown report and the terminal, right after the unit's own parts, counted apart."""
    r = V.verify(twin(NAME), NAME, shadow=True, **KW)
    assert r.verdict == "match", str(r)
    sh = r.as_dict()["stages"][1]["shadow"]
    assert [q["name"] for q in sh["parts"]] == ["attn", "mlp"] and all(q["ok"] for q in sh["parts"]), sh
    md = r.to_markdown()
    assert _md_order(md) == ["stem", "blocks.0", "blocks.0/attn", "blocks.0/mlp", "blocks.0/attn (shadow)",
                             "blocks.0/mlp (shadow)", "blocks.1", "head"], md
    rows = _md_rows(md)
    for q in sh["parts"]:
        assert rows[f"blocks.0/{q['name']} (shadow)"] == [q["foreign"], "match", f"{q['err_over_bound']:.3g}", "-"]
    # the shadow run's last part is where the unit's submodule, fed the reference's input, gave its output
    assert rows["blocks.0/mlp (shadow)"][0].endswith("(the reference's input)"), rows
    assert rows["blocks.0/attn (shadow)"][0].endswith("(by value)"), rows
    assert ("parts of the units judged part by part (their own bound void in float32, or the unit diverging): 2 "
            "(2 match); parts in the shadow run (each unit fed the reference's own input): 2 (2 match)") in md
    assert "Rows marked (shadow): the part in the shadow run" in md
    text = str(r)
    assert "\nblocks.0/attn (shadow) " in text and "\nblocks.0/mlp (shadow) " in text, text
    # without shadow parts: no shadow rows and no note
    plain = V.verify(twin(NAME), NAME, **KW).to_markdown()
    assert "(shadow)" not in plain and "shadow run" not in plain


def test_a_bug_in_one_part_shows_at_that_part_in_the_shadow_rows_of_the_markdown_and_the_terminal(tmp_path, capsys):
    """The bug in blocks.0's attention branch: in the shadow run blocks.0 (fed the reference's own input) diverges
    at its part attn, which the Markdown report and the terminal's rich table name as "blocks.0/attn (shadow)";
    the shadow run's MLP part matches."""
    out, js = tmp_path / "r.md", tmp_path / "r.json"
    init = {"name": NAME, "bug_unit": "blocks.0.attn", "bug_rel": 1e-3}
    code = cli.main(["verify", TARGET, "--reference", NAME, "--init", json.dumps(init), "--config",
                     '{"reduced": true}', "--no-ensemble", "--shadow", "--report", str(out), "--json", str(js)])
    term = capsys.readouterr().out
    assert code == 1, term
    rep = json.loads(js.read_text())
    assert rep["shadow_first_divergence"]["stage"] == "blocks.0", rep["shadow_first_divergence"]
    parts = {q["name"]: q for q in rep["stages"][1]["shadow"]["parts"]}
    assert parts["attn"]["verdict"] == "diverges" and parts["mlp"]["verdict"] == "match", parts
    rows = _md_rows(out.read_text())
    assert rows["blocks.0/attn (shadow)"][1:] == ["diverges", f"{parts['attn']['err_over_bound']:.3g}",
                                                  "blocks.0/attn (shadow)"], rows
    assert rows["blocks.0/mlp (shadow)"][1:] == ["match", f"{parts['mlp']['err_over_bound']:.3g}", "-"], rows
    # the terminal (rich wraps long lines and cells: the summary compared without line breaks)
    assert ("parts in the shadow run (each unit fed the reference's own input): 2 (1 diverges, 1 match)"
            in " ".join(term.split())), term
    assert any("diverges" in ln and "blocks.0/attn (shadow)" in ln for ln in term.splitlines()), term


def _report(n: int, diverging: dict[int, StageResult]) -> Report:
    """A network report of ``n`` matching units ``blocks.i`` but the ``diverging`` ones."""
    stages = [diverging.get(i, StageResult(f"blocks.{i}", f"blocks.{i}:output", "match", 1e-7, 1e-7, 1e-5, 1e-2))
              for i in range(n)]
    return Report(verdict="diverges", reference=NAME, preset="official", dtype="float32", config={}, config_sources={},
                  mapping={}, mapping_decisions=[], ignored_foreign_keys=[], derived_buffers=[],
                  whole_module={"verdict": "inconclusive", "max_relative_bound": 1e8, "err_over_bound": 1e-9},
                  stages=stages, first_divergence=None, findings=[], network={"units": [s.name for s in stages]})


def test_many_units_show_in_the_terminal_as_the_ones_that_do_not_match_and_a_count():
    """Beyond config.VERIFY_SUMMARY_ROWS rows the terminal lists only the units and parts that do not match (a
    unit judged part by part, its diverging part, an inconclusive unit, a wiring divergence) and counts the rest;
    the Markdown report lists them all."""
    n = config.VERIFY_SUMMARY_ROWS + 8
    parts = [StageResult("attn", "#3 add (by value)", "match", err_over_bound=0.4),
             StageResult("mlp", "blocks.4:output", "diverges", err_over_bound=7.0, detail="outside")]
    diverging = {4: StageResult("blocks.4", "blocks.4:output", "diverges", err_over_bound=7.0, parts=parts),
                 9: StageResult("blocks.9", "blocks.9:output", "inconclusive", err_over_bound=np.inf),
                 13: StageResult("blocks.13", "blocks.14:input", "diverges", err_over_bound=0.1,
                                 detail="wiring: unit 'blocks.13' is skipped")}
    r = _report(n, diverging)
    assert [q["name"] for q in r.unit_rows()][4:7] == ["blocks.4", "blocks.4/attn", "blocks.4/mlp"]
    shown, left = r.compact_unit_rows(config.VERIFY_SUMMARY_ROWS)
    assert [(q["name"], q["first_divergence"]) for q in shown] == [
        ("blocks.4", "blocks.4/mlp"), ("blocks.4/mlp", "blocks.4/mlp"), ("blocks.9", "-"),
        ("blocks.13", "blocks.13 (wiring)")]
    assert left == n + 2 - 4
    text = r.units_text()
    assert f"({n - 2} more units and parts match)" in text and "blocks.4/attn" not in text, text
    assert f"units: {n} ({n - 3} match, 2 diverges, 1 inconclusive)" in text, text
    assert text in str(r)
    # a unit's worst err/bound: its own or its parts', whichever is larger
    assert r.unit_rows()[4]["err_over_bound"] == 7.0
    rows = _md_rows(r.to_markdown())
    assert len(rows) == n + 2 and rows["blocks.4/attn"][1:] == ["match", "0.4", "-"], rows
    assert rows["blocks.9"][1:] == ["inconclusive", "inf", "-"], rows["blocks.9"]
    # few rows: all of them
    assert r.compact_unit_rows(n + 2) == (r.unit_rows(), 0)
    with pytest.raises(ValueError, match="argument 'limit': expected an integer >= 0, got -1"):
        r.compact_unit_rows(-1)
    # the rich summary: the same rows and count
    from rich.console import Console
    from rich.table import Table
    con = Console(record=True, width=200)
    cli._render_units(con, Table, r)
    out = con.export_text()
    assert "blocks.4/mlp" in out and "blocks.13 (wiring)" in out and "blocks.4/attn" not in out, out
    assert f"({n - 2} more units and parts match)" in out


def test_a_layer_reference_report_has_no_units_section():
    """A layer reference's stages are in the stage table; its report has no units (and no parts in the JSON)."""
    r = _report(3, {})
    r.network = None
    assert not r.has_units and "## Units and their parts" not in r.to_markdown() and "units:" not in str(r)
    assert all(s["parts"] is None for s in r.as_dict()["stages"])
