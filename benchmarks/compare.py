"""The regression guard: what got slower between two benchmark runs, beyond the run-to-run noise.

    python benchmarks/compare.py OLD.json NEW.json            # prints a table; exit 1 if anything regressed
    python benchmarks/compare.py OLD.json NEW.json --all      # every compared cell, not only the slower ones

Inputs are JSON files with a list ``rows`` of objects (benchmarks/models_forward.py writes them): a row is
identified by its string and integer fields other than counts (``model``, ``threads``, ...), and each of its
timings by a key ``<name>_times`` holding every repeat's wall time in seconds.

The rule.  For one timing of one row, each run gives its best time b and its own spread n = max / min - 1 over
its repeats (the noise of that cell, measured in that run: other processes, frequency scaling, allocator
state).  NEW is *slower* when b_new > b_old (1 + n_old)(1 + n_new): the gap exceeds what either run's repeats
varied by.  A cell with fewer than two repeats in either run has no noise estimate and is listed as such, never
called a regression.  Machines or thread counts that differ between the two files are printed first: a
comparison across machines measures the machines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

SUFFIX = "_times"
#: Row fields that are measurements or outcomes, not identity (never part of a row's key).
NOT_KEYS = {"params", "gmacs", "best_backend"}


def _key(row: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in row.items()
                        if k not in NOT_KEYS and isinstance(v, (str, int)) and not isinstance(v, bool)))


def _rows(path: Path) -> tuple[dict, dict[tuple, dict]]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise SystemExit(f"{path}: expected a JSON object with a list 'rows' (benchmarks/models_forward.py "
                         f"writes one)")
    rows: dict[tuple, dict] = {}
    for row in data["rows"]:
        key = _key(row)
        if key in rows:
            raise SystemExit(f"{path}: two rows with the same identity {dict(key)}")
        rows[key] = row
    return data.get("meta", {}), rows


def _cell(times: Any) -> tuple[float, float | None]:
    """(best time, spread n = max / min - 1, or None with fewer than two repeats)."""
    ts = [float(t) for t in times]
    best = min(ts)
    return best, (max(ts) / best - 1.0 if len(ts) >= 2 and best > 0 else None)


def compare(old_path: Path, new_path: Path) -> tuple[list[dict], dict, dict]:
    """Every timing cell present in both files, with its verdict: "slower", "faster", "same" or "no noise"."""
    meta_old, old = _rows(old_path)
    meta_new, new = _rows(new_path)
    out = []
    for key, row_new in new.items():
        row_old = old.get(key)
        if row_old is None:
            continue
        for name in sorted(k for k in row_new if k.endswith(SUFFIX) and k in row_old):
            b_old, n_old = _cell(row_old[name])
            b_new, n_new = _cell(row_new[name])
            rec = {"row": dict(key), "timing": name[:-len(SUFFIX)], "old_s": b_old, "new_s": b_new,
                   "ratio": b_new / b_old if b_old > 0 else float("inf"), "noise_old": n_old, "noise_new": n_new}
            if n_old is None or n_new is None:
                rec["verdict"] = "no noise"
            else:
                band = (1.0 + n_old) * (1.0 + n_new)
                rec["band"] = band
                rec["verdict"] = ("slower" if b_new > b_old * band else "faster" if b_new * band < b_old
                                  else "same")
            out.append(rec)
    return out, meta_old, meta_new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--all", action="store_true", help="show every compared cell")
    args = ap.parse_args(argv)
    cells, meta_old, meta_new = compare(args.old, args.new)
    console = Console()
    for field in ("processor", "machine", "cpus", "threads", "numpy", "torch"):
        if meta_old.get(field) != meta_new.get(field):
            console.print(f"[yellow]note[/]: {field} differs: {meta_old.get(field)!r} -> {meta_new.get(field)!r}")
    shown = cells if args.all else [c for c in cells if c["verdict"] in ("slower", "no noise")]
    table = Table(title=f"{args.old} -> {args.new}: {len(cells)} timing cells compared")
    for col in ("row", "timing", "old (s)", "new (s)", "new / old", "noise old, new", "verdict"):
        table.add_column(col)
    for c in shown:
        noise = ", ".join("-" if n is None else f"{n:.1%}" for n in (c["noise_old"], c["noise_new"]))
        style = "red" if c["verdict"] == "slower" else None
        table.add_row(" ".join(f"{k}={v}" for k, v in c["row"].items()), c["timing"], f"{c['old_s']:.4g}",
                      f"{c['new_s']:.4g}", f"{c['ratio']:.3f}", noise, c["verdict"], style=style)
    console.print(table)
    counts = {v: sum(c["verdict"] == v for c in cells) for v in ("slower", "faster", "same", "no noise")}
    console.print(", ".join(f"{n} {v}" for v, n in counts.items()))
    return 1 if counts["slower"] else 0


if __name__ == "__main__":
    sys.exit(main())
