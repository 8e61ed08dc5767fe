"""The verdict benchmark's tables (benchmarks/verdict.py): built from a result, printed on the console and
written as Markdown by the renderer of docs/verdict.md.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.verdict_calibration import HEADLINE, SET_LABELS, SETS
from benchmarks.verdict_measure import _num
from benchmarks.verdict_setups import BUGS
from benchmarks.verdict_targets import SENS_ENSEMBLE_FACTOR, SENS_U_FACTOR, TIGHTNESS_TARGET, g, sens_ok


def _fs(result: dict, key: str) -> str:
    f = result["factor_sets"][key]
    return f"{f[0]:g}/{f[1]:g}"


def _variants_rel(rec: dict) -> list[float]:
    return [_num(v) for k, v in rec["rel_err"].items() if k not in ("torch default", "numpy naive")]


def table_verdicts(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T"] + [f"verdict, F {_fs(result, k)} ({k.replace('_', ' ')})" for k in SETS] + [
        "compare(naive only)", "max rel. bound", "k", "rel. err torch", "rel. err naive",
        "max rel. err torch variants", "zmax / thr", "zrms / thr", "stage-wise"]
    rows = []
    for r in result["cases"]:
        rp = r["sets"][HEADLINE]["report"]
        var = _variants_rel(r)
        rows.append([r["module"] + (" *" if r["note"] else ""), r["dtype"]]
                    + [r["sets"][k]["report"]["verdict"] for k in SETS]
                    + [r["old_rule"]["verdict"], g(r["report"]["max_relative_bound"]), f"{_num(r['k']):.0f}",
                       g(r["rel_err"]["torch default"]), g(r["rel_err"]["numpy naive"]),
                       g(max(var)) if var else "-",
                       f"{g(rp['zmax'])} / {g(rp['zmax_threshold'])}", f"{g(rp['zrms'])} / {g(rp['zrms_threshold'])}",
                       r["stage_wise"]["verdict"] if r.get("stage_wise") else "-"])
    return hdr, rows


def table_calibration(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T", "largest LOO ratio, zmax (member)", "largest LOO ratio, zrms (member)",
           "same, torch members only (zmax, zrms)", "ensemble zmax", "ensemble zrms",
           "threshold / naive-only threshold (zmax, zrms)", "compare(naive only) threshold / threshold"]
    rows = []
    for r in result["cases"]:
        cells, torch_cells = [], []
        for stat in ("max", "rms"):
            vals = [(k, _num(v[stat])) for k, v in r["loo"].items() if math.isfinite(_num(v[stat]))]
            best = max(vals, key=lambda kv: kv[1], default=None)
            cells.append("undefined (all z = 0)" if best is None else f"{best[1]:.3g} ({best[0]})")
            tb = max((kv for kv in vals if kv[0] != "numpy naive"), key=lambda kv: kv[1], default=None)
            torch_cells.append("-" if tb is None else f"{tb[1]:.3g}")
        rep, old = r["report"], r["old_rule"]
        fm, fr = result["factor_sets"]["current"]

        def ratio(a: Any, b: Any) -> str:
            a, b = _num(a), _num(b)
            return g(a / b) if b > 0 else ("1" if a == b else "inf")
        ens = rep["ensemble"]
        naive_only = [max(_num(ens["numpy naive"][i]), _num(ens["final rounding"][i])) for i in (0, 1)]
        rows.append([r["module"], r["dtype"], cells[0], cells[1], ", ".join(torch_cells),
                     g(_num(rep["zmax_threshold"]) / fm), g(_num(rep["zrms_threshold"]) / fr),
                     f"{ratio(_num(rep['zmax_threshold']) / fm, naive_only[0])}, "
                     f"{ratio(_num(rep['zrms_threshold']) / fr, naive_only[1])}",
                     f"{ratio(old['zmax_threshold'], rep['zmax_threshold'])}, "
                     f"{ratio(old['zrms_threshold'], rep['zrms_threshold'])}"])
    return hdr, rows


def table_tightness(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T", "largest legitimate error", "max bound", "bound / err"] + [
        f"threshold / err, F {_fs(result, k)}" for k in SETS] + ["(a) <= 10 (recommended)"]
    rows = []
    for r in result["cases"]:
        tr = r["sets"][HEADLINE]["tightness"]
        v = _num(tr["threshold_over_err"])
        rows.append([r["module"], r["dtype"], g(tr["max_err"]), g(tr["max_bound"]), g(tr["bound_over_err"])]
                    + [g(r["sets"][k]["tightness"]["threshold_over_err"]) for k in SETS]
                    + ["met" if v <= TIGHTNESS_TARGET else "FAILS"])
    return hdr, rows


def _sens_cell(s: dict) -> str:
    st = s.get("status")
    if st == "caught":
        return g(s.get("rel_err"))
    if st == "not caught":
        return f"not caught ({s.get('verdict_at_t1')} at t = 1)"
    return st or "-"


def table_sensitivity(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T", "bug", "whole bug (rel.)", "criterion"] + [
        f"caught at rel. err, F {_fs(result, k)}" for k in SETS] + [
        "10 x ens. max", "30 u_T", "(b) recommended", "(b) all-member rule"]
    rows = []
    for r in result["cases"]:
        ens = _num(r["ensemble_max_rel_err"])
        for bug in BUGS:
            s = r["sets"][HEADLINE]["sensitivity"][bug]
            rows.append([r["module"], r["dtype"], bug, g(s.get("bug_rel_effect")), s.get("criterion", "-")]
                        + [_sens_cell(r["sets"][k]["sensitivity"][bug]) for k in SETS]
                        + [g(SENS_ENSEMBLE_FACTOR * ens), g(SENS_U_FACTOR * r["u"]),
                           sens_ok(r, s, HEADLINE)[0],
                           sens_ok(r, r["sets"]["all_members"]["sensitivity"][bug], "all_members")[0]])
    return hdr, rows


def table_half(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T", "k (bound depth)", "k u_T", "torch default / u_T", "numpy naive / u_T",
           "torch variants / u_T (min - max)", "max rel. bound"]
    rows = []
    for r in result["cases"]:
        if r["dtype"] == "float32":
            continue
        ro = r["rel_err_over_u"]
        mem = [_num(v) for k, v in ro.items() if k not in ("torch default", "numpy naive")]
        rows.append([r["module"] + (" *" if r["note"] else ""), r["dtype"], f"{_num(r['k']):.0f}", g(r["k_u"]),
                     g(ro["torch default"]), g(ro["numpy naive"]),
                     f"{g(min(mem))} - {g(max(mem))}" if mem else "-", g(r["report"]["max_relative_bound"])])
    for f in result["failures"]:
        ro = f.get("rel_err_over_u")
        if f["dtype"] == "float32" or not ro:
            continue
        mem = [_num(v) for k, v in ro.items() if k not in ("torch default", "numpy naive")]
        rows.append([f["module"], f["dtype"], "-", "-", g(ro["torch default"]), g(ro["numpy naive"]),
                     f"{g(min(mem))} - {g(max(mem))}" if mem else "-", "(no verdict, see below)"])
    return hdr, rows


def table_counts(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["T", "modules", "void bounds", "inconclusive", "diverges", "match", "no verdict", "stage-wise match",
           "conclusive (whole or stage-wise)", "(c)"]
    rows = []
    for dt, c in result["counts"].items():
        rc = c[HEADLINE]
        conclusive = c.get("conclusive", rc["match"])
        ok = conclusive == c["modules"] and (dt != "float32" or c["void"] + rc["inconclusive"] == 0)
        rows.append([dt, str(c["modules"]), str(c["void"]), str(rc["inconclusive"]), str(rc["diverges"]),
                     str(rc["match"]), str(c["failed_to_run"]), str(c.get("stage_wise_match", 0)), str(conclusive),
                     "met" if ok else "FAILS"])
    return hdr, rows


def table_stagewise(result: dict) -> tuple[list[str], list[list[str]]]:
    hdr = ["module", "T", "whole-module verdict (max rel. bound)", "stage-wise verdict",
           "largest stage rel. bound (stage)", "largest stage err / bound", "planted bugs: stage-wise verdict"
           " (first divergence)"]
    rows = []
    for r in result["cases"]:
        sw = r.get("stage_wise")
        if not sw:
            continue
        worst = max(sw["stages"], key=lambda st: _num(st["max_relative_bound"]))
        bugs = "; ".join(f"{k}: {b['verdict']}" + (f" ({b['first_divergence']})" if b["first_divergence"] else "")
                         for k, b in sw["bugs"].items())
        rows.append([r["module"], r["dtype"], f"{r['report']['verdict']} ({g(r['report']['max_relative_bound'])})",
                     sw["verdict"], f"{g(worst['max_relative_bound'])} ({worst['name']})",
                     g(max(_num(st["max_err_over_bound"]) for st in sw["stages"])), bugs or "-"])
    return hdr, rows


def table_stage_targets(result: dict) -> tuple[list[str], list[list[str]]]:
    """(a) and (b) for the stage-wise verdict: the loosest stage's tightness, and per bug the relative error of
    the module output at which the stage-wise verdict first says "diverges" (in u_T), with the stage."""
    hdr = ["module", "T", "stage-wise tightness (stage)"] + [f"{b}: caught at (u_T; stage)" for b in BUGS]
    rows = []
    for r in result["cases"]:
        sw = r.get("stage_wise")
        if not sw or "tightness_max" not in sw:
            continue
        cells = [r["module"], r["dtype"], f"{g(sw['tightness_max'])} ({sw['tightness_stage']})"]
        for b in BUGS:
            s_ = sw["sensitivity"].get(b)
            if s_ is None:
                cells.append("n/a")
            elif s_.get("status") == "caught":
                cells.append(f"{g(_num(s_['rel_err']) / r['u'])} ({s_.get('first_divergence') or '-'}; "
                             f"{sens_ok(r, s_)[0]})")
            else:
                cells.append(f"{s_.get('status')} ({sens_ok(r, s_)[0]})")
        rows.append(cells)
    return hdr, rows


def text_table(hdr: list[str], rows: list[list[str]]) -> str:
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)] if rows else [len(h) for h in hdr]
    line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w))  # noqa: E731
    return "\n".join([line(hdr), line(["-" * n for n in w])] + [line(r) for r in rows])


def md_table(hdr: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(esc(h) for h in hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


TABLES = (("Verdicts of the correct twins", table_verdicts), ("Calibration (leave-one-out)", table_calibration),
          ("(a) Tightness", table_tightness), ("(b) Sensitivity to planted bugs", table_sensitivity),
          ("Half precision: relative errors in units of u_T", table_half),
          ("Stage-wise (teacher-forced) verdicts", table_stagewise),
          ("Stage-wise (a) tightness and (b) sensitivity", table_stage_targets), ("(c) Counts", table_counts))


def calibration_line(result: dict) -> str:
    c = result["calibration"]
    parts = []
    for key in ("all_members", "torch_members"):
        m, r = c["max"][key], c["rms"][key]
        parts.append(f"{key.replace('_', ' ')}: largest LOO ratio zmax {g(m['ratio'])} ({m.get('module')}/"
                     f"{m.get('dtype')}, {m.get('member')}), zrms {g(r['ratio'])} ({r.get('module')}/{r.get('dtype')}, "
                     f"{r.get('member')}) -> VERDICT_MAX_FACTOR = {m['factor']}, VERDICT_RMS_FACTOR = {r['factor']}")
    return "calibration: " + "; ".join(parts) + (f" (config now {result['config']['VERDICT_MAX_FACTOR']:g}, "
                                                  f"{result['config']['VERDICT_RMS_FACTOR']:g})")


def print_report(result: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    for title, fn in TABLES:
        hdr, rows = fn(result)
        if Console is not None:
            t = Table(title=title)
            for h in hdr:
                t.add_column(h)
            for r in rows:
                t.add_row(*[str(c) for c in r])
            Console(width=300).print(t)
        else:
            print(f"\n== {title} ==")
            print(text_table(hdr, rows))
    print("\n" + calibration_line(result))
    for key in (HEADLINE, "all_members", "current"):
        print(f"\nwith F {_fs(result, key)} ({SET_LABELS[key]}):")
        for k, label in (("a", "tightness"), ("b", "sensitivity"), ("c", "void / inconclusive")):
            items = result["checks"][key][k]
            print(f"  ({k}) {label}: {'all met' if not items else f'{len(items)} not met'}")
            if key == HEADLINE:
                for it in items:
                    print(f"    - {it}")
    print(f"\nruntime {result['runtime_s']:.0f} s")
