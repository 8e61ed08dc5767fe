"""The verdict benchmark's driver (benchmarks/verdict.py): every module in every precision, measured, then
evaluated under each factor set, into the result that verdict.json holds; ``--merge`` into an earlier full run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import machine as host_machine
from benchmarks.verdict_calibration import HEADLINE, MARGIN, SETS, calibrate, factors, loo_ratios
from benchmarks.verdict_measure import Case, _f, rel_fro, report_dict, sensitivity, stage_wise, tightness
from benchmarks.verdict_setups import BATCH, BUGS, DTYPES, MODULES, SEED
from benchmarks.verdict_targets import SENS_ENSEMBLE_FACTOR, SENS_U_FACTOR, TIGHTNESS_TARGET, checks
from refimpl import config, ensemble, verdict


def machine() -> dict:
    """benchmarks/common.py's host description plus the library versions and torch's thread count."""
    info = dict(host_machine())
    if "load_average" in info:
        info["load_average"] = list(info["load_average"])
    info.update(torch=torch.__version__, numpy=np.__version__, torch_threads=torch.get_num_threads())
    return info


def evaluate(case: Case, fmax: float, frms: float, steps: int) -> dict:
    """The verdict of the correct output, tightness and sensitivity under factors (fmax, frms)."""
    with factors(fmax, frms):
        rep = case.compare(case.tested)
        out = {"factors": [fmax, frms], "report": report_dict(rep),
               "tightness": {k: _f(v) for k, v in tightness(case, rep).items()}}
        sens = {}
        for name in BUGS:
            bug = case.setup.bugs.get(name)
            if bug is None or bug.run is None:
                sens[name] = {"status": "n/a", "detail": bug.na if bug else "not planted"}
            else:
                sens[name] = sensitivity(case, rep, case.buggy[name], steps)
        out["sensitivity"] = sens
    return out


def run_all(args: argparse.Namespace) -> dict:
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t_start = time.perf_counter()
    variants = tuple(ensemble.VARIANTS)
    steps = 8 if args.quick else 12
    cur = (config.VERDICT_MAX_FACTOR, config.VERDICT_RMS_FACTOR)
    cases: list[Case] = []
    records: list[dict] = []
    failures: list[dict] = []
    for name in args.modules:
        for dt in args.dtypes:
            t0 = time.perf_counter()
            print(f"# {name} {dt} ...", end=" ", flush=True)
            try:
                setup = MODULES[name](dt, args.quick)
                case = Case(setup, dt, variants)
            except Exception as exc:  # noqa: BLE001 - a module that cannot run is a row of the report
                msg = f"{type(exc).__name__}: {exc}"
                print(f"FAILED ({msg[:120]})", flush=True)
                failures.append({"module": name, "dtype": dt, "error": msg[:500]})
                continue
            legit = case.legit()
            rel = {k: rel_fro(v, case.ref) for k, v in legit.items()}
            try:
                with factors(*cur):
                    rep = case.compare(case.tested)
                    old = case.compare(case.tested, old_rule=True)
            except Exception as exc:  # noqa: BLE001 - the verdict itself failed: a row of the report
                msg = f"refimpl.verdict.compare raised {type(exc).__name__}: {exc}"
                finite_b = case.bnd[np.isfinite(case.ref)]
                msg += (f" (bound: {int(np.isnan(finite_b).sum())} NaN and {int(np.isinf(finite_b).sum())} inf "
                        f"element(s) of {finite_b.size}; k = {case.bound.k:g}, k u_T = {case.bound.k * case.u:.3g})")
                print(f"FAILED ({msg[:160]})", flush=True)
                failures.append({"module": name, "dtype": dt, "error": msg[:600], "title": setup.title,
                                 "rel_err": {k: _f(v) for k, v in rel.items()},
                                 "rel_err_over_u": {k: _f(v / case.u) for k, v in rel.items()}})
                continue
            fin_b = case.bnd[np.isfinite(case.ref)]
            rec = {
                "module": name, "dtype": dt, "title": setup.title, "note": setup.note,
                "shape": list(case.ref.shape), "k": _f(case.bound.k), "bound_note": case.bound.note[:300],
                "accumulation_bound": bool(case.bound.accumulation), "u": case.u,
                "bound_nan": int(np.isnan(fin_b).sum()), "bound_inf": int(np.isinf(fin_b).sum()),
                "report": report_dict(rep), "old_rule": report_dict(old),
                "rel_err": {k: _f(v) for k, v in rel.items()},
                "rel_err_over_u": {k: _f(v / case.u) for k, v in rel.items()},
                "k_u": _f(case.bound.k * case.u),
                "ensemble_max_rel_err": _f(max(rel.values())),
                "loo": {k: {s: _f(r) for s, r in v.items()} for k, v in loo_ratios(rep).items()},
                "void": bool(not math.isfinite(rep.max_relative_bound) or rep.max_relative_bound >= 1.0),
                "stage_wise": stage_wise(setup, case, 8 if args.quick else 10),
                "bugs": {b: ({"what": case.setup.bugs[b].what, "na": case.setup.bugs[b].na}
                             if b in case.setup.bugs else {"what": "", "na": "not planted"}) for b in BUGS},
                "timing": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in case.timing.items()},
            }
            cases.append(case)
            records.append(rec)
            print(f"{rep.verdict} (rel err {rep.rel_err:.2e}, max rel bound {rep.max_relative_bound:.3g}; "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)

    calib = calibrate(records)
    sets = {"current": tuple(cur)}
    for key in ("all_members", "torch_members"):
        sets[key] = (calib["max"][key]["factor"] or cur[0], calib["rms"][key]["factor"] or cur[1])
    if getattr(args, "merge", ""):
        # the earlier rows were evaluated under the earlier run's factor sets: the new rows are too (_merge)
        earlier = json.loads(Path(args.merge).read_text())["factor_sets"]
        if tuple(earlier["current"]) != tuple(cur):
            raise SystemExit(f"--merge: the earlier run used the factors {earlier['current']}, config has {cur}: "
                             f"run every module")
        sets = {k: tuple(v) for k, v in earlier.items()}

    # Second pass: verdicts, tightness and sensitivity under each factor set (equal sets computed once).
    kept = []
    for case, rec in zip(cases, records):
        t0 = time.perf_counter()
        try:
            done: dict[tuple, dict] = {}
            rec["sets"] = {}
            for key in SETS:
                if sets[key] not in done:
                    done[sets[key]] = evaluate(case, *sets[key], steps)
                rec["sets"][key] = done[sets[key]]
        except Exception as exc:  # noqa: BLE001 - reported, the other cases go on
            msg = f"second pass failed: {type(exc).__name__}: {exc}"
            print(f"# {rec['module']} {rec['dtype']}: {msg[:160]}", flush=True)
            failures.append({"module": rec["module"], "dtype": rec["dtype"], "error": msg[:600]})
            continue
        rec["timing"]["second_pass"] = round(time.perf_counter() - t0, 2)
        kept.append(rec)
        print(f"# {rec['module']} {rec['dtype']}: sensitivity done ({rec['timing']['second_pass']:.0f} s)",
              flush=True)

    if getattr(args, "merge", ""):
        kept, failures, calib, sets = _merge(Path(args.merge), kept, failures, calib, sets)
        args.modules, args.dtypes = list(MODULES), list(DTYPES)
    counts = {}
    for dt in args.dtypes:
        rs = [r for r in kept if r["dtype"] == dt]
        cnt: dict[str, Any] = {"modules": len(rs) + sum(1 for f in failures if f["dtype"] == dt),
                               "void": sum(r["void"] for r in rs),
                               "failed_to_run": sum(1 for f in failures if f["dtype"] == dt),
                               "stage_wise_match": sum(1 for r in rs if r.get("stage_wise")
                                                       and r["stage_wise"]["verdict"] == verdict.MATCH),
                               "conclusive": sum(1 for r in rs if (not r["void"] and r["sets"][HEADLINE]["report"][
                                   "verdict"] == verdict.MATCH) or (r.get("stage_wise") and r["stage_wise"][
                                       "verdict"] == verdict.MATCH))}
        for key in SETS:
            vs = [r["sets"][key]["report"]["verdict"] for r in rs]
            cnt[key] = {v: vs.count(v) for v in (verdict.MATCH, verdict.DIVERGES, verdict.INCONCLUSIVE)}
        counts[dt] = cnt
    result = {
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runtime_s": round(time.perf_counter() - t_start, 1), "quick": bool(args.quick),
        "command": "python benchmarks/verdict.py " + " ".join(sys.argv[1:]),
        "machine": machine(), "batch": BATCH, "seed": SEED, "variants": list(variants), "bisection_steps": steps,
        "config": {"VERDICT_MAX_FACTOR": cur[0], "VERDICT_RMS_FACTOR": cur[1],
                   "VERDICT_FALSE_ALARM": config.VERDICT_FALSE_ALARM},
        "z_units": "err_i / (S_i + eta_T / u_T), sigma_i + eta_T / u_T where S_i is not finite, typical_i + eta_T / u_T"
                   " where the bound knows each element's typical error (refimpl.verdict._weights)"
                   if hasattr(verdict, "_weights")
        else "err_i / b_i",
        "targets": {"tightness": TIGHTNESS_TARGET, "sens_ensemble_factor": SENS_ENSEMBLE_FACTOR,
                    "sens_u_factor": SENS_U_FACTOR, "margin": MARGIN},
        "calibration": calib, "factor_sets": {k: list(v) for k, v in sets.items()}, "headline": HEADLINE,
        "cases": kept, "failures": failures, "counts": counts,
    }
    result["checks"] = {key: checks(result, key) for key in SETS}
    return result


def _merge(path: Path, kept: list, failures: list, calib: dict, sets: dict) -> tuple[list, list, dict, dict]:
    """--merge: this run's rows replace the same (module, dtype) rows of an earlier full run's JSON, every row
    evaluated under the earlier run's factor sets (the headline set is config's, the same in both); the
    calibration is recomputed over the merged rows, and where its rule would now give other alternative factor
    sets, the result says so (``calibration["merged_note"]``; a full run re-derives them)."""
    old = json.loads(path.read_text())
    new_keys = {(r["module"], r["dtype"]) for r in kept} | {(f["module"], f["dtype"]) for f in failures}
    rows = [r for r in old["cases"] if (r["module"], r["dtype"]) not in new_keys] + kept
    order = {(m, d): i for i, (m, d) in enumerate((m, d) for m in MODULES for d in DTYPES)}
    rows.sort(key=lambda r: order[(r["module"], r["dtype"])])
    fails = [f for f in old["failures"] if (f["module"], f["dtype"]) not in new_keys] + failures
    merged = calibrate(rows)
    cur = tuple(sets["current"])
    merged_sets = {"current": cur}
    for key in ("all_members", "torch_members"):
        merged_sets[key] = (merged["max"][key]["factor"] or cur[0], merged["rms"][key]["factor"] or cur[1])
    differ = [k for k in SETS if tuple(sets[k]) != tuple(merged_sets[k])]
    if differ:
        merged["merged_note"] = (
            "rows merged into an earlier full run (benchmarks/verdict.py --merge): every row is evaluated under "
            "the earlier run's factor sets (" + "; ".join(f"{k} {list(sets[k])}" for k in SETS) + "), while the "
            "calibration rule over the merged rows would now give " + "; ".join(
                f"{k} {list(merged_sets[k])}" for k in differ) + " (a full run re-derives the alternative sets; "
            "the headline set is config's and the same either way)")
    print(f"# merged {len(kept)} new row(s) into {len(rows) - len(kept)} row(s) of {path}", flush=True)
    return rows, fails, merged, {k: tuple(v) for k, v in sets.items()}
