"""The verdict benchmark's targets (a) tightness, (b) sensitivity, (c) void / inconclusive verdicts, checked on
a result of benchmarks/verdict.py, and the number format of their messages and of the tables.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.verdict_calibration import HEADLINE
from benchmarks.verdict_measure import LOG_T_MIN, _num
from refimpl import verdict

#: The verdict's targets (docs/verdict.md): (a) threshold / largest legitimate error; (b) detection at most this many times the
#: ensemble's largest relative error, and at most this many u_T.
TIGHTNESS_TARGET = 10.0
SENS_ENSEMBLE_FACTOR = 10.0
SENS_U_FACTOR = 30.0


def g(x: Any, digits: int = 2) -> str:
    """A number for a table: 3 significant digits, inf / nan spelled out, None as a dash."""
    if x is None or x == "":
        return "-"
    v = _num(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    if v == 0:
        return "0"
    return f"{v:.{digits}e}" if (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.{digits + 1}g}"


def sens_ok(rec: dict, s: dict, key: str = HEADLINE) -> tuple[str, str]:
    """('met' | 'FAILS' | 'not required' | 'n/a', explanation) for one bug of one case, target (b)."""
    u = rec["u"]
    ens = _num(rec["ensemble_max_rel_err"])
    lim = min(SENS_ENSEMBLE_FACTOR * ens, SENS_U_FACTOR * u)
    st = s.get("status")
    if st == "n/a":
        return "n/a", s.get("detail", "")
    if st == "no effect":
        return "not required", "the bug changes no bit of the output on these inputs"
    if st == "caught (NaN/Inf pattern)":
        return "met", "caught by the NaN/Inf pattern at any t > 0"
    full = _num(s.get("bug_rel_effect"))
    if st == "not caught":
        if full + ens <= lim:
            return "not required", (f"the whole bug moves the output by {full:.2g} (relative), below "
                                    f"min(10 x ensemble {ens:.2g}, 30 u) = {lim:.2g}")
        return "FAILS", f"not caught even at t = 1 (bug effect {full:.2g} relative; target <= {lim:.2g})"
    r = _num(s.get("rel_err"))
    if s.get("t") is not None and _num(s.get("t")) <= 10.0 ** LOG_T_MIN and \
            rec["sets"][key]["report"]["verdict"] != verdict.MATCH:
        return "n/a", "the correct output itself is already judged " + rec["sets"][key]["report"]["verdict"]
    parts = []
    if r > SENS_ENSEMBLE_FACTOR * ens:
        parts.append(f"{r:.2g} > 10 x ensemble max {ens:.2g}")
    if r > SENS_U_FACTOR * u:
        parts.append(f"{r:.2g} > 30 u = {SENS_U_FACTOR * u:.2g}")
    return ("FAILS", "; ".join(parts)) if parts else ("met", f"{r:.2g} <= {lim:.2g}")


def checks(result: dict, key: str) -> dict:
    out: dict[str, list[str]] = {"a": [], "b": [], "c": [], "a_stage": [], "b_stage": []}
    for rec in result["cases"]:
        tag = f"{rec['module']} / {rec['dtype']}"
        ev = rec["sets"][key]
        sw = rec.get("stage_wise") or {}
        if sw.get("tightness_max") is not None and not _num(sw["tightness_max"]) <= TIGHTNESS_TARGET:
            out["a_stage"].append(f"{tag}: {g(sw['tightness_max'])} at stage {sw['tightness_stage']} (target <= 10)")
        for bug, s_ in (sw.get("sensitivity") or {}).items():
            st, why = sens_ok(rec, s_, key)
            if st == "FAILS":
                out["b_stage"].append(f"{tag}, {bug}: {why}")
        t = _num(ev["tightness"]["threshold_over_err"])
        if not t <= TIGHTNESS_TARGET:
            why = " (the bound is NaN at some element)" if ev["tightness"].get("nan_bound") else (
                " (the bound is infinite at some element: any error passes there)" if math.isinf(t) else "")
            out["a"].append(f"{tag}: threshold / largest legitimate error = {g(t)} (plain bound "
                            f"{g(ev['tightness']['bound_over_err'])}; target <= 10){why}")
        for bug, s in ev["sensitivity"].items():
            st, why = sens_ok(rec, s, key)
            if st == "FAILS":
                out["b"].append(f"{tag}, {bug}: {why}")
        v = ev["report"]["verdict"]
        if rec.get("bound_nan"):
            out["c"].append(f"{tag}: {v} - a false alarm: the bound is NaN at {rec['bound_nan']} element(s) (the "
                            f"module's bound function, k u_T = {g(rec['k_u'])} >= 1), and compare fails the tested "
                            f"output at every element with a non-zero error against a NaN bound")
        elif v == verdict.INCONCLUSIVE or rec["void"]:
            sw = rec.get("stage_wise")
            if sw and sw["verdict"] == verdict.MATCH and rec["dtype"] != "float32":
                pass                         # conclusive stage by stage: what (c) asks in half precision
            elif sw and sw["verdict"] == verdict.MATCH:
                out["c"].append(f"{tag}: {v}, largest relative bound {g(rec['report']['max_relative_bound'])}"
                                f" (whole-module bound; stage-wise: match - (c) asks for a conclusive whole-module"
                                f" verdict in float32)")
            else:
                why = ("no stage list for this module yet" if not sw else
                       f"stage-wise {sw['verdict']}: " + ", ".join(f"{st['name']} {g(st['max_relative_bound'])}"
                                                                   for st in sw["stages"]
                                                                   if st["verdict"] != verdict.MATCH))
                out["c"].append(f"{tag}: {v}, largest relative bound {g(rec['report']['max_relative_bound'])}"
                                f" (whole-module bound; {why})")
        elif v != verdict.MATCH:
            out["c"].append(f"{tag}: the correct twin is judged {v!r}: " + "; ".join(ev["report"]["reasons"])[:300])
    for f in result["failures"]:
        out["c"].append(f"{f['module']} / {f['dtype']}: no verdict ({f['error'][:300]})")
    return out
