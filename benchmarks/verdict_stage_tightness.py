"""Stage-wise tightness (a) only: the teacher-forced stage verdicts of the correct twin and each stage's
tightness, max_i threshold_i over the largest error of any legitimate evaluation of the stage
(benchmarks/verdict_measure.py ``stage_tightness``), at the real sizes of benchmarks/verdict_setups.py, without
the whole-module verdict, the calibration of the factors or the sensitivity bisection.

Run (from the repository root; never part of the test suite):

    python benchmarks/verdict_stage_tightness.py                          # flatten_pvt, flatten_swin, lisa
    python benchmarks/verdict_stage_tightness.py --modules lisa --dtypes float32 --detail

The table gives, per stage, the verdict, the tightness (a) (target <= 10), and with ``--detail`` the member
that sets the stage's threshold (the largest zmax among the usable members) with its zmax.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.verdict_measure import stage_tightness  # noqa: E402
from benchmarks.verdict_setups import DTYPES, MODULES, SEED, _tensors64  # noqa: E402

#: The tightness target (a) of docs/verdict.md.
TARGET = 10.0


def measure(module: str, dt: str, quick: bool = False) -> list[dict]:
    """One row per stage: name, verdict, tightness, the member setting the threshold and its zmax, the usable
    members' names and the report's notes on members outside the bound."""
    torch.manual_seed(SEED)
    setup = MODULES[module](dt, quick)
    sw = setup.stagewise
    raw = sw.tensors(setup.run)
    sw.calibrate(setup.run, raw)
    t64 = _tensors64(raw)
    rep = sw.compare(t64)
    tight = stage_tightness(sw, t64, rep)
    rows = []
    for r in rep.stages:
        usable = {k: v for k, v in r.ensemble.items() if not any(repr(k) in n and "outside" in n for n in r.reasons)}
        top = max(usable.items(), key=lambda kv: kv[1][0]) if usable else ("-", (math.nan, math.nan))
        rows.append({"stage": r.name, "verdict": r.verdict, "tightness": tight.get(r.name), "k": r.k,
                     "top_member": top[0], "top_zmax": top[1][0], "members": sorted(usable),
                     "outside": [n for n in r.reasons if "outside the bound" in n]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", nargs="+", default=["flatten_pvt", "flatten_swin", "lisa"])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    ap.add_argument("--quick", action="store_true", help="the set-ups' reduced sizes")
    ap.add_argument("--detail", action="store_true", help="the member setting each threshold, members outside")
    args = ap.parse_args(argv)
    bad = [m for m in args.modules if m not in MODULES] + [d for d in args.dtypes if d not in DTYPES]
    if bad:
        ap.error(f"unknown module(s) / dtype(s): {bad}")
    worst = 0.0
    for mod in args.modules:
        for dt in args.dtypes:
            t0 = time.perf_counter()
            rows = measure(mod, dt, args.quick)
            print(f"{mod} {dt} ({time.perf_counter() - t0:.1f} s)")
            for r in rows:
                t = r["tightness"]
                ts = "   exact" if t is None else f"{t:8.3g}"
                flag = "" if t is None or t <= TARGET else "  > target"
                line = f"  {r['stage']:<10s} {r['verdict']:<12s} (a) {ts}{flag}"
                if args.detail:
                    line += f"   k {r['k']:<8.4g} threshold set by {r['top_member']!r} (zmax {r['top_zmax']:.3g})"
                    line += "".join(f"\n      {o}" for o in r["outside"])
                print(line)
                if t is not None:
                    worst = max(worst, t)
    print(f"largest stage tightness: {worst:.3g} (target <= {TARGET:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
