"""The verdict benchmark's calibration of the ensemble factors (benchmarks/verdict.py): leave-one-out ratios,
the calibration rule, and the factor sets every case is evaluated under.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from benchmarks.verdict_measure import _num
from refimpl import config

#: The calibration margin: recommended factor = MARGIN x the largest leave-one-out ratio, rounded up to 0.5.
MARGIN = 2.0


#: The factor sets every case is evaluated under: the factors now in refimpl/config.py; the calibration rule
#: (MARGIN x the largest leave-one-out ratio) over every legitimate member; the same rule with only torch
#: evaluations left out (the NumPy naive run, always a member of the verdict's ensemble, stays among the others).
SETS = ("current", "all_members", "torch_members")
HEADLINE = "current"  # the factors in refimpl/config.py head every table
SET_LABELS = {"current": "factors now in refimpl/config.py",
              "all_members": "rule over all members (naive left out too)",
              "torch_members": "rule over torch members (recommended)"}


@contextlib.contextmanager
def factors(fmax: float, frms: float):
    """The verdict's ensemble factors set to (fmax, frms) for the block (refimpl.config is read at call time)."""
    old = config.VERDICT_MAX_FACTOR, config.VERDICT_RMS_FACTOR
    config.VERDICT_MAX_FACTOR, config.VERDICT_RMS_FACTOR = float(fmax), float(frms)
    try:
        yield
    finally:
        config.VERDICT_MAX_FACTOR, config.VERDICT_RMS_FACTOR = old


def loo_ratios(rep: Any) -> dict[str, dict[str, float]]:
    """Leave-one-out: each legitimate evaluation's (zmax, zrms) over the largest of the others' (the tested
    default run is one of them; the final rounding is always among the others; members the verdict drops as
    outside the bound are not)."""
    stats = {"torch default": (rep.zmax, rep.zrms)}
    stats.update({k: v for k, v in rep.ensemble.items() if k != "final rounding"})
    usable = {k: v for k, v in stats.items() if v[0] <= 1.0}
    out: dict[str, dict[str, float]] = {}
    for key, (zm, zr) in stats.items():
        others = [v for k, v in usable.items() if k != key] + [rep.ensemble["final rounding"]]
        row = {}
        for i, stat in ((0, "max"), (1, "rms")):
            mx = max(o[i] for o in others)
            val = (zm, zr)[i]
            row[stat] = (val / mx) if mx > 0 else (math.nan if val == 0 else math.inf)
        out[key] = row
    return out


def round_up_half(x: float) -> float:
    return max(1.0, math.ceil(2.0 * x) / 2.0)


def calibrate(records: list[dict]) -> dict:
    """The largest leave-one-out ratio per statistic, over every member and over torch members only."""
    calib: dict[str, Any] = {}
    for stat in ("max", "rms"):
        entry: dict[str, Any] = {}
        for key, skip in (("all_members", ()), ("torch_members", ("numpy naive",))):
            best: dict[str, Any] = {"ratio": 0.0}
            for rec in records:
                for member, r in rec["loo"].items():
                    v = _num(r[stat])
                    if member not in skip and math.isfinite(v) and v > best["ratio"]:
                        best = {"ratio": v, "module": rec["module"], "dtype": rec["dtype"], "member": member}
            best["factor"] = round_up_half(MARGIN * best["ratio"]) if best["ratio"] > 0 else None
            entry[key] = best
        entry["undefined_in"] = [f"{r['module']}/{r['dtype']}" for r in records
                                 if not any(math.isfinite(_num(x[stat])) for x in r["loo"].values())]
        calib[stat] = entry
    return calib
