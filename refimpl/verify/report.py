"""The verifier's report: one :class:`StageResult` per stage of the reference, the verdict, the first divergence,
the findings; as text, JSON (schema in docs/verify.md) and Markdown with a plot.

Layer: the verify tool (no torch; matplotlib imported by :meth:`Report.save_plot` only).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from .. import verdict as _verdict

__all__ = ["SCHEMA_VERSION", "StageResult", "Report"]

#: Version of the JSON report's schema (docs/verify.md).
SCHEMA_VERSION = 5


def _f(x: Any) -> Any:
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else ("inf" if x > 0 else ("-inf" if x < 0 else "nan"))


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _num(x: Any) -> float | None:
    """A JSON number of the report (:func:`_f`: "inf", "nan" as strings) back as a float; None stays None."""
    return None if x is None else float(x)



@dataclasses.dataclass
class StageResult:
    """One stage of the reference, as observed in the foreign module."""

    name: str
    foreign: str | None                  # "submodule:output" where it was observed, None if not observed
    verdict: str                         # match / diverges / inconclusive / not observed
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    bound: float | None = None           # the largest element-wise bound
    err_over_bound: float | None = None
    detail: str = ""
    #: the comparison's ensemble (refimpl.verify.ensemble.members_summary): each member's zmax, zrms and status,
    #: the thresholds; None where the stage was not compared
    ensemble: dict[str, Any] | None = None
    #: a network unit judged part by part (its own bound void, or the unit diverging: the parts locate the bug
    #: inside it): one result per part, in the order the reference
    #: computes them (``foreign``: the tensor located by value; verdict "not judged" where its input was not
    #: located); None where the stage was judged as a whole
    parts: list[StageResult] | None = None

    def as_dict(self) -> dict:
        """The stage as the report's JSON (docs/verify.md): non-finite numbers as strings (:func:`_f`), each part
        without its ensemble and parts."""
        return {"name": self.name, "foreign": self.foreign, "verdict": self.verdict, "ok": self.verdict == "match",
                "max_abs_err": _f(self.max_abs_err), "max_rel_err": _f(self.max_rel_err), "bound": _f(self.bound),
                "err_over_bound": _f(self.err_over_bound), "detail": self.detail, "ensemble": self.ensemble,
                "parts": None if self.parts is None else [
                    {k: v for k, v in q.as_dict().items() if k not in ("ensemble", "parts")} for q in self.parts]}

    def first_divergence(self) -> str:
        """Where the stage first diverges, at the finest level known: "unit/part" (its first diverging part), the
        stage's own name (judged as a whole), "name (wiring)" (a wiring divergence); "-" where it does not."""
        if self.verdict != _verdict.DIVERGES:
            return "-"
        if self.detail.startswith("wiring:"):
            return f"{self.name} (wiring)"
        q = next((q for q in self.parts or () if q.verdict == _verdict.DIVERGES), None)
        return self.name if q is None else f"{self.name}/{q.name}"


@dataclasses.dataclass
class Report:
    """The verifier's report (:meth:`as_dict` is the JSON schema of docs/verify.md)."""

    verdict: str
    reference: str
    preset: str
    dtype: str
    config: dict[str, Any]
    config_sources: dict[str, str]
    mapping: dict[str, str]
    mapping_decisions: list[str]
    ignored_foreign_keys: list[str]
    derived_buffers: list[str]
    whole_module: dict[str, Any]
    stages: list[StageResult]
    first_divergence: dict[str, Any] | None
    findings: list[dict[str, str]]
    whole_module_text: str = ""
    #: a whole network's verification (refimpl.verify.networks): family, units, image size, namings, renames
    network: dict[str, Any] | None = None
    #: shadow mode (``--shadow``): one result per stage, in the order of ``stages`` (None: not run)
    shadow: list[StageResult] | None = None
    shadow_first_divergence: dict[str, Any] | None = None
    #: gradient verification (``--grad``; refimpl.verify.gradients): the twin's forward check, the cotangent and
    #: one entry per gradient tensor (None: not run)
    gradients: dict[str, Any] | None = None
    #: the ensemble of legitimate evaluations (refimpl.verify.ensemble): whether refimpl's PyTorch twin was run
    #: (``torch``), its members, the ones that failed, the cost; None: not recorded
    ensemble: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the verdict is a match."""
        return self.verdict == _verdict.MATCH

    def as_dict(self) -> dict:
        """The report as the JSON object of docs/verify.md (schema :data:`SCHEMA_VERSION`); each stage carries its
        shadow result (None when shadow mode did not run)."""
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict, "reference": self.reference,
                "preset": self.preset, "dtype": self.dtype, "config": self.config,
                "config_sources": self.config_sources, "mapping": self.mapping,
                "mapping_decisions": self.mapping_decisions, "unused_foreign_keys": [],
                "ignored_foreign_keys": self.ignored_foreign_keys, "missing_reference_keys": [],
                "derived_buffers": self.derived_buffers, "whole_module": self.whole_module,
                "stages": [s.as_dict() | {"shadow": None if self.shadow is None else self.shadow[i].as_dict()}
                           for i, s in enumerate(self.stages)],
                "first_divergence": self.first_divergence, "shadow": self.shadow is not None,
                "shadow_first_divergence": self.shadow_first_divergence,
                "gradients": self.gradients, "ensemble": self.ensemble,
                "findings": self.findings} | ({"network": self.network} if self.network is not None else {})

    def to_json(self) -> str:
        """The report as JSON text (:meth:`as_dict`, indent 1)."""
        return json.dumps(self.as_dict(), indent=1)

    def to_markdown(self, plot: str | None = None) -> str:
        """The report as Markdown (``--report OUT.md``); ``plot``: the file name of the per-stage error/bound
        plot (:meth:`save_plot`) to link, if one was written."""
        lines = [f"# refimpl verify: {self.verdict} against `{self.reference}`", "",
                 f"{self.preset} preset, {self.dtype}; whole module: {self.whole_module['verdict']} (max relative "
                 f"bound {self.whole_module['max_relative_bound']:.3g}, err/bound "
                 f"{self.whole_module['err_over_bound']:.3g}).", ""]
        if self.first_divergence:
            lines += [f"**First divergence: stage `{self.first_divergence['stage']}`**: "
                      f"{self.first_divergence['why']}", ""]
        if self.shadow is not None:
            sf = self.shadow_first_divergence
            lines += [f"**Shadow mode: first divergence: stage `{sf['stage']}`**: {sf['why']}" if sf else
                      "Shadow mode: no shadowed stage diverges.", ""]
        sh = self.shadow is not None
        lines += ["| stage | observed at | verdict | max abs err | bound | err / bound |" +
                  (" shadow | shadow err / bound |" if sh else "") + " detail |",
                  "|---|---|---|---|---|---|" + ("---|---|" if sh else "") + "---|"]
        for i, st in enumerate(self.stages):
            shc = (f" {self.shadow[i].verdict} | {_g(self.shadow[i].err_over_bound)} |" if sh else "")
            detail = st.detail + (f" (shadow: {self.shadow[i].detail})" if sh and self.shadow[i].detail and
                                  self.shadow[i].verdict != "not shadowed" else "")
            lines.append(f"| {st.name} | {st.foreign or '-'} | {st.verdict} | {_g(st.max_abs_err)} | "
                         f"{_g(st.bound)} | {_g(st.err_over_bound)} |{shc} {detail.replace('|', '/')} |")
        if self.has_units:
            lines += ["", "## Units and their parts", "", self.units_text(markdown=True)]
        if self.gradients is not None:
            lines += ["", "## Gradients", "", self.gradients_text(markdown=True)]
        lines += ["", "## Ensemble", "", self.ensemble_text(markdown=True)]
        if plot:
            lines += ["", f"![error over bound per stage]({plot})"]
        lines += ["", "## Configuration", ""] + [f"- `{k}` = `{v!r}` ({self.config_sources.get(k, '')})"
                                                  for k, v in self.config.items()]
        lines += ["", "## Weight mapping", ""] + [f"- {d}" for d in self.mapping_decisions]
        if self.findings:
            lines += ["", "## Findings", ""] + [f"- {f['kind']}: {f['message']}" for f in self.findings]
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str) -> bool:
        """A bar chart of error / bound per observed stage (log scale, the line at 1 is the bound); False when
        matplotlib is not installed (an optional extra)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return False
        names = [st.name for st in self.stages]
        known = [st.err_over_bound for st in self.stages if st.err_over_bound]
        top = max([10.0] + [10.0 * v for v in known])
        # a stage with no number: diverging without a located tensor, or not observed - drawn hatched to the top
        from .. import config as _config
        floor = _config.VERIFY_PLOT_RATIO_FLOOR                 # a log axis cannot draw 0: display only
        vals = [max(st.err_over_bound, floor) if st.err_over_bound else (top if st.verdict != "match" else floor)
                for st in self.stages]
        colour = {"match": "tab:green", "diverges": "tab:red"}
        fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names)), 3.0))
        bars = ax.bar(names, vals, color=[colour.get(st.verdict, "tab:gray") for st in self.stages])
        for bar, st in zip(bars, self.stages):
            if not st.err_over_bound and st.verdict != "match":
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_ylabel("max error / bound")
        ax.set_title(f"{self.reference} ({self.dtype}): {self.verdict}")
        ax.tick_params(axis="x", rotation=45)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return True

    def __str__(self) -> str:
        """The report as text: the verdict, the first divergence (and the shadow's), the whole module, a row per stage
        (shadow columns with ``--shadow``), then the units, gradients, ensemble and findings."""
        lines = [(f"refimpl verify: {self.verdict.upper()} against {self.reference} ({self.preset} preset, "
                  f"{self.dtype})")]
        if self.first_divergence:
            fd = self.first_divergence
            lines.append(f"first divergence: stage {fd['stage']!r}: {fd['why']}")
        if self.shadow_first_divergence:
            fd = self.shadow_first_divergence
            lines.append(f"shadow mode, first divergence: stage {fd['stage']!r}: {fd['why']}")
        lines.append(f"whole module: {self.whole_module['verdict']} (max relative bound "
                     f"{self.whole_module['max_relative_bound']:.3g}, err/bound "
                     f"{self.whole_module['err_over_bound']:.3g})")
        sh = self.shadow is not None
        lines.append(f"{'stage':<8} {'observed at':<22} {'verdict':<13} {'max |err|':>10} {'bound':>10} "
                     f"{'err/bound':>9}" + (f"  {'shadow':<13} {'err/bound':>9}" if sh else ""))
        for i, s in enumerate(self.stages):
            shc = f"  {self.shadow[i].verdict:<13} {_g(self.shadow[i].err_over_bound):>9}" if sh else ""
            lines.append(f"{s.name:<8} {s.foreign or '-':<22} {s.verdict:<13} {_g(s.max_abs_err):>10} "
                         f"{_g(s.bound):>10} {_g(s.err_over_bound):>9}{shc}" + (f"  {s.detail}" if s.detail else "")
                         + (f"  (shadow: {self.shadow[i].detail})" if sh and self.shadow[i].detail and
                            self.shadow[i].verdict != "not shadowed" else ""))
        if self.has_units:
            lines.append(self.units_text())
        if self.gradients is not None:
            lines.append(self.gradients_text())
        lines.append(self.ensemble_text())
        for f in self.findings:
            lines.append(f"finding ({f['kind']}): {f['message']}")
        return "\n".join(lines)

    @property
    def has_units(self) -> bool:
        """Whether the report is a network's, verified unit by unit (or has a stage judged part by part, in the
        propagating or the shadow run)."""
        return self.network is not None or any(st.parts for st in self.stages + list(self.shadow or ()))

    def unit_rows(self) -> list[dict[str, Any]]:
        """The units (a network's stages) in the order the reference computes them, each followed by its parts
        where it was judged part by part, then by its parts in the shadow run (``--shadow``) where the shadow run
        judged it part by part: ``name`` ("unit", "unit/part" or "unit/part (shadow)"), ``part`` (whether a
        part), ``shadow`` (whether of the shadow run), ``foreign``, ``verdict``, ``err_over_bound`` (for a unit
        the worst of its own and its parts' in the propagating run; None where nothing was compared) and
        ``first_divergence`` (:meth:`StageResult.first_divergence`; a diverging part: its own name)."""
        rows: list[dict[str, Any]] = []
        for i, st in enumerate(self.stages):
            vals = [v for v in [st.err_over_bound] + [q.err_over_bound for q in st.parts or ()]
                    if v is not None and not np.isnan(v)]
            rows.append({"name": st.name, "part": False, "shadow": False, "foreign": st.foreign,
                         "verdict": st.verdict, "err_over_bound": max(vals) if vals else None,
                         "first_divergence": st.first_divergence()})
            shadow_parts = (self.shadow[i].parts or []) if self.shadow is not None else []
            for q, label, sh in [(q, f"{st.name}/{q.name}", False) for q in st.parts or ()] + \
                                [(q, f"{st.name}/{q.name} (shadow)", True) for q in shadow_parts]:
                rows.append({"name": label, "part": True, "shadow": sh, "foreign": q.foreign, "verdict": q.verdict,
                             "err_over_bound": q.err_over_bound,
                             "first_divergence": label if q.verdict == _verdict.DIVERGES else "-"})
        return rows

    def units_summary(self) -> str:
        """One line: how many units, parts of the units judged part by part, and parts of the units the shadow run
        judged part by part, have each verdict."""
        rows = self.unit_rows()

        def count(kind: list[dict]) -> str:
            by: dict[str, int] = {}
            for r in kind:
                by[r["verdict"]] = by.get(r["verdict"], 0) + 1
            return ", ".join(f"{n} {v}" for v, n in by.items()) or "none"
        units = [r for r in rows if not r["part"]]
        parts = [r for r in rows if r["part"] and not r["shadow"]]
        shadow = [r for r in rows if r["shadow"]]
        return (f"units: {len(units)} ({count(units)})" + (
            f"; parts of the units judged part by part (their own bound void in {self.dtype}, or the unit diverging): "
            f"{len(parts)} "
            f"({count(parts)})" if parts else "") + (
            f"; parts in the shadow run (each unit fed the reference's own input): {len(shadow)} ({count(shadow)})"
            if shadow else ""))

    def units_text(self, markdown: bool = False, limit: int | None = None) -> str:
        """The units and their parts: a count per verdict, then (Markdown) every unit and part, or (text) all of
        them up to ``limit`` rows (default config.VERIFY_SUMMARY_ROWS), beyond it the ones that do not match and
        a count of those left out."""
        rows, head = self.unit_rows(), self.units_summary()
        if markdown:
            lines = [head + "; in the order the reference computes them.", "",
                     "| unit / part | observed at | verdict | worst err / bound | first divergence |",
                     "|---|---|---|---|---|"]
            lines += [f"| {r['name']} | {r['foreign'] or '-'} | {r['verdict']} | {_g(r['err_over_bound'])} | "
                      f"{r['first_divergence']} |" for r in rows]
            if any(r["shadow"] for r in rows):
                lines += ["", "Rows marked (shadow): the part in the shadow run (`--shadow`), your unit's submodule "
                              "fed the reference's own input to the unit (the part's input located among the tensors "
                              "that call computed)."]
            return "\n".join(lines)
        from .. import config as _config
        limit = _config.VERIFY_SUMMARY_ROWS if limit is None else limit
        shown, left = self.compact_unit_rows(limit)
        lines = [head, f"{'unit / part':<28} {'verdict':<13} {'err/bound':>9}  first divergence"]
        lines += [f"{r['name']:<28} {r['verdict']:<13} {_g(r['err_over_bound']):>9}  {r['first_divergence']}"
                  for r in shown]
        if left:
            lines.append(f"({left} more units and parts match)")
        return "\n".join(lines)

    def compact_unit_rows(self, limit: int) -> tuple[list[dict[str, Any]], int]:
        """(the rows of :meth:`unit_rows` to show in a terminal, how many matching ones are left out): all of them
        up to ``limit`` rows, else those that do not match."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"argument 'limit': expected an integer >= 0, got {limit!r}")
        rows = self.unit_rows()
        if len(rows) <= limit:
            return rows, 0
        shown = [r for r in rows if r["verdict"] != _verdict.MATCH]
        return shown, len(rows) - len(shown)

    def gradients_text(self, markdown: bool = False) -> str:
        """The gradient section (``--grad``) as text lines or a Markdown table."""
        gr = self.gradients or {}
        tf = gr.get("twin_forward", {})
        head = (f"gradients: {gr.get('verdict', '-')} (twin {gr.get('twin', '-')}: float64 forward "
                f"{tf.get('verdict', '-')} against the NumPy reference, err/bound {_g(_num(tf.get('err_over_bound')))};"
                f" cotangent {gr.get('cotangent', '-')})")
        if gr.get("why"):
            head += f"\n{gr['why']}"
        fd = gr.get("first_divergence")
        if fd:
            head += f"\nfirst gradient divergence: {fd['tensor']}: {fd['why']}"
        rows = gr.get("tensors", [])
        # the units, each followed by its parts where it was judged part by part ("unit/part")
        units = [dict(e, unit=name) for u in gr.get("units") or [] for name, e in
                 [(u["unit"], u)] + [(f"{u['unit']}/{q['part']}", q) for q in u.get("parts", [])]]
        if units:
            ufd = gr.get("units_first_divergence")
            at = "" if not ufd else ufd["unit"] + (f" (part {ufd['part']})" if ufd.get("part") else "")
            head += (f"\nunit by unit (teacher-forced): {gr.get('units_verdict', '-')}"
                     + (f"; first divergence at unit {at}: {ufd['tensor']}" if ufd else ""))
        if markdown:
            lines = [head]
            if units:
                lines += ["", "| unit | verdict | worst gradient | err / bound | unit forward relative bound | why |",
                          "|---|---|---|---|---|---|"]
                lines += [f"| {e['unit']} | {e['verdict']} | {e['worst'] or '-'} | {_g(_num(e['err_over_bound']))} | "
                          f"{_g(_num(e['forward_relative_bound']))} | {(e['why'] or '').replace('|', '/')} |"
                          for e in units]
            lines += ["", "| gradient of | yours | verdict | max abs err | bound | err / bound | detail |",
                     "|---|---|---|---|---|---|---|"]
            lines += [f"| {t['name']} | {t['foreign'] or '-'} | {t['verdict']} | {_g(_num(t['max_abs_err']))} | "
                      f"{_g(_num(t['bound']))} | {_g(_num(t['err_over_bound']))} | "
                      f"{(t['detail'] or '').replace('|', '/')} |" for t in rows]
            return "\n".join(lines)
        lines = [head]
        if units:
            lines.append(f"{'unit':<24} {'verdict':<13} {'worst gradient':<32} {'err/bound':>9} {'fwd rel':>9}")
            lines += [f"{e['unit']:<24} {e['verdict']:<13} {(e['worst'] or '-'):<32} "
                      f"{_g(_num(e['err_over_bound'])):>9} {_g(_num(e['forward_relative_bound'])):>9}" for e in units]
        lines.append(f"{'gradient of':<24} {'verdict':<13} {'max |err|':>10} {'bound':>10} {'err/bound':>9}")
        lines += [f"{t['name']:<24} {t['verdict']:<13} {_g(_num(t['max_abs_err'])):>10} {_g(_num(t['bound'])):>10} "
                  f"{_g(_num(t['err_over_bound'])):>9}" + (f"  {t['detail']}" if t["detail"] else "") for t in rows]
        return "\n".join(lines)

    def ensemble_rows(self) -> list[tuple[str, dict[str, Any]]]:
        """The comparisons judged against an ensemble, each with its summary
        (:func:`refimpl.verify.ensemble.members_summary`): the whole module ("whole module"; a network's logits),
        each stage, and after a unit judged part by part its parts ("unit/part", from the unit's
        ``ensemble["parts"]``); then the shadow run's units likewise ("unit (shadow)", "unit/part (shadow)")."""
        rows: list[tuple[str, dict[str, Any]]] = [("whole module", self.whole_module.get("ensemble"))]
        for stages, tag in ((self.stages, ""), (self.shadow or [], " (shadow)")):
            for s in stages:
                rows.append((s.name + tag, s.ensemble))
                rows += [(f"{s.name}/{q}{tag}", e) for q, e in ((s.ensemble or {}).get("parts") or {}).items()]
        return [(n, e) for n, e in rows if e and "members" in e]

    def ensemble_text(self, markdown: bool = False) -> str:
        """The ensemble of legitimate evaluations the verdicts were judged against (``ensemble``, and each
        comparison's members, :meth:`ensemble_rows`): as text lines or Markdown tables, each comparison with the
        worst member used (the one with the largest zmax, and with the largest zrms: they set the thresholds)."""
        en = self.ensemble or {}
        if en.get("torch"):
            head = (f"ensemble: refimpl's PyTorch twin ({en.get('twin')}) in {self.dtype}, run as "
                    f"{', '.join(en.get('members', []))} ({en.get('seconds', 0):.3g} s), with the NumPy naive run")
        else:
            head = f"ensemble: the NumPy naive run and the random-rounding model ({en.get('why') or 'no torch ensemble'})"
        if en.get("failed"):
            head += "; left out: " + "; ".join(f"{k} ({v})" for k, v in en["failed"].items())
        rows = self.ensemble_rows()
        if markdown:
            lines = [head] + (["", "| compared | zmax | zmax threshold | zrms | zrms threshold | worst member (zmax; "
                               "zrms) | members used (zmax, zrms) | dropped |", "|---|---|---|---|---|---|---|---|"]
                              if rows else [])
            for n, e in rows:
                used, dropped = _members(e)
                wmax, wrms = _worst(e)
                lines.append(f"| {n} | {_g(_num(e['zmax']))} | {_g(_num(e['zmax_threshold']))} | "
                             f"{_g(_num(e['zrms']))} | {_g(_num(e['zrms_threshold']))} | {wmax}; {wrms} | {used} | "
                             f"{dropped or '-'} |")
            notes = en.get("stages_without_members") or {}
            if notes:
                lines += ["", "Stages without teacher-forced twin members: " + "; ".join(
                    f"`{k}`: {v}" for k, v in notes.items())]
            return "\n".join(lines)
        lines = [head]
        for n, e in rows:
            by = {st: [k for k, m in e["members"].items() if m["status"] == st] for st in (
                "used", "outside the bound: not used", "equal to the tested output bit for bit: dropped")}
            wmax, wrms = _worst(e)
            lines.append(f"  {n}: zmax {_g(_num(e['zmax']))} (threshold {_g(_num(e['zmax_threshold']))}), zrms "
                         f"{_g(_num(e['zrms']))} (threshold {_g(_num(e['zrms_threshold']))}); "
                         f"{len(by['used'])} members used, worst {wmax} (zmax), {wrms} (zrms)"
                         + (f"; outside the bound: {', '.join(by['outside the bound: not used'])}"
                            if by["outside the bound: not used"] else "")
                         + (f"; bit-identical to the tested output: "
                            f"{', '.join(by['equal to the tested output bit for bit: dropped'])}"
                            if by["equal to the tested output bit for bit: dropped"] else ""))
        return "\n".join(lines)


def _worst(e: dict) -> tuple[str, str]:
    """(the member used with the largest zmax, the one with the largest zrms) of one comparison's ensemble: the
    members that set its two thresholds; "-" where no member was used."""
    used = {k: m for k, m in e["members"].items() if m["status"] == "used"}

    def top(stat: str) -> str:
        vals = {k: _num(m[stat]) for k, m in used.items() if m[stat] is not None and not np.isnan(_num(m[stat]))}
        return max(vals, key=vals.get) if vals else "-"
    return top("zmax"), top("zrms")


def _members(e: dict) -> tuple[str, str]:
    """(the members used, with their zmax and zrms; the members dropped, with why) of one comparison's ensemble."""
    used = ", ".join(f"{k} ({_g(_num(m['zmax']))}, {_g(_num(m['zrms']))})" for k, m in e["members"].items()
                     if m["status"] == "used")
    why = {"outside the bound: not used": "outside the bound", "equal to the tested output bit for bit: dropped":
           "bit-identical to the tested output"}
    dropped = ", ".join(f"{k} ({why.get(m['status'], m['status'])})" for k, m in e["members"].items()
                        if m["status"] != "used")
    return used, dropped
