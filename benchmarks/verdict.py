"""The verdict at the networks' real stage sizes: calibration of the ensemble criterion, tightness, sensitivity to
planted bugs, and the count of void / inconclusive verdicts (docs/verdict.md).

Run (from the repository root; never part of the test suite's default run):

    python benchmarks/verdict.py                 # full run (about 10-15 minutes on 2 cores); writes
                                                 # benchmarks/results/verdict.json and docs/verdict.md
    python benchmarks/verdict.py --quick         # smoke run: reduced grids, fewer bisection steps (about a
                                                 # minute); prints only, unless --out / --doc are given
    python benchmarks/verdict.py --modules flatten_pvt rala --dtypes float32     # a subset (prints only)
    python benchmarks/verdict.py --markdown benchmarks/results/verdict.json   # regenerate docs/verdict.md only
    python benchmarks/verdict.py --modules lisa --merge benchmarks/results/verdict.json   # rerun some rows of a
                                                 # full run and rewrite both files (refused if calibration moves)

For every attention module (``MODULES`` of benchmarks/verdict_setups.py: the five papers' attention layers at
their networks' stage-1 sizes, Castling at its 14 x 14 DeiT grid) and every tested precision T in float32,
float16, bfloat16:

1. the PyTorch twin (refimpl/twins/modules) is built in T with random parameters from the module's own init
   function, rounded to T (``refimpl.numerics.round_to``) and loaded with ``load_numpy_state``; inputs are
   rounded to T; batch 2;
2. it runs once (the *tested* output), then under every variant of ``refimpl.ensemble.VARIANTS`` (four
   summation orders, libm formulas, FFT convolution, oneDNN toggled, 1/2/16 threads); the NumPy definition runs in T
   (``naive_same_precision``); the float64 reference and its bound run on the rounded values;
   ``refimpl.verdict.compare`` gives the verdict;
3. calibration: for every module and T, each legitimate evaluation (the tested default run included) is left
   out in turn and its zmax (zrms) is divided by the largest zmax (zrms) of the others (the output's own final
   rounding, always a member of the verdict's ensemble, counts among the others; members the verdict drops
   because they are outside the bound do not).  The largest ratio over everything, times a margin of 2,
   rounded up to a half-integer, gives VERDICT_MAX_FACTOR (VERDICT_RMS_FACTOR); it is computed twice: with
   every member left out in turn, and with only torch evaluations left out (the NumPy naive run, always in the
   verdict's ensemble, stays among the others).  Every case is then judged under three factor sets: the
   current config, and the two calibrated ones (``SETS``; the torch-members one is the recommendation);
4. tightness (a): the threshold the verdict applies to element i is min(b_i, F_max Z w_i) (b_i the bound,
   w_i the verdict's z units - ``refimpl.verdict._weights``, S_i + eta_T / u_T, or sigma_i + eta_T / u_T where S_i is not finite -, Z the largest zmax of the usable
   members); reported as max_i threshold_i over the largest error of any legitimate evaluation at any element,
   and the same for the plain bound;
5. sensitivity (b): planted-bug versions of each twin (wrappers, hooks and patched module globals defined in
   benchmarks/verdict_setups.py; the twins are not edited): one batch item using another item's state, an eps
   dropped, a scale applied twice, one boundary row off by one.  The blend out_t = correct + t (buggy -
   correct) (float64, then rounded to T) is bisected on log t for the smallest t the verdict does not call
   "match" (where the correct output is itself not "match": the smallest t it calls "diverges"); its relative
   Frobenius error is compared with 10 x the ensemble's largest relative error and with 30 u_T.  A fast
   replica of the decision brackets the bisection; both ends are confirmed with ``compare`` itself;
6. counts (c): void (relative bound >= 1 or non-finite) and inconclusive verdicts per precision, whole-module
   and stage-wise;
7. stage-wise (teacher-forced) verdicts, where the module has a stage list (``refimpl.verdict.compare_stages``:
   every module): each stage of the twin compared with the
   reference stage on the twin's own inputs to it, for the correct twin and for every planted bug (at full
   size; the first stage that diverges is reported).

LiSA in float16 / bfloat16: torch has no half-precision CPU FFT (``torch.fft`` raises "Unsupported dtype
Half"), so its FFT convolutions run in float32 with the result rounded to T, as ``torch.autocast`` does; every
other operation of the twin runs in T.  The table marks it.

The parts, each a module of benchmarks/: ``verdict_setups`` (step 1: the modules, their planted bugs and stage
lists), ``verdict_measure`` (steps 2, 4-7 on one case), ``verdict_calibration`` (step 3), ``verdict_targets``
(the checks (a), (b), (c)), ``verdict_driver`` (every case, the result JSON, ``--merge``), ``verdict_tables`` and
``verdict_doc`` (the console tables and docs/verdict.md); this file is the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.verdict_doc import markdown  # noqa: E402
from benchmarks.verdict_driver import run_all  # noqa: E402
from benchmarks.verdict_measure import _f  # noqa: E402
from benchmarks.verdict_setups import DTYPES, MODULES, SEED  # noqa: E402
from benchmarks.verdict_tables import print_report  # noqa: E402

DOC = ROOT / "docs" / "verdict.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: reduced grids, fewer bisection steps")
    ap.add_argument("--modules", nargs="+", default=list(MODULES), help=f"subset of {', '.join(MODULES)}")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), help="subset of float32 float16 bfloat16")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/verdict.json for a full "
                                                "run of every module and dtype; none for --quick or a subset)")
    ap.add_argument("--doc", default=None, help="Markdown path (default: docs/verdict.md when the JSON goes to its "
                                                "default place)")
    ap.add_argument("--markdown", default="", metavar="VERDICT_JSON",
                    help="regenerate the Markdown from a verdict.json and exit")
    ap.add_argument("--merge", default="", metavar="VERDICT_JSON",
                    help="replace the selected modules' rows of an earlier full run's JSON by this run's and write "
                         "the merged JSON and Markdown to the default places (refused when the merged calibration "
                         "changes a factor set)")
    args = ap.parse_args(argv)
    if args.markdown:
        result = json.loads(Path(args.markdown).read_text())
        path = Path(args.doc) if args.doc else DOC
        path.write_text(markdown(result))
        print(f"wrote {path}")
        return 0
    args.modules = [x for m in args.modules for x in m.split(",") if x]
    args.dtypes = [x for d in args.dtypes for x in d.split(",") if x]
    bad = [m for m in args.modules if m not in MODULES] + [d for d in args.dtypes if d not in DTYPES]
    if bad:
        ap.error(f"unknown module(s) / dtype(s): {bad}; modules {list(MODULES)}, dtypes {list(DTYPES)}")
    full = not args.quick and (bool(args.merge) or (set(args.modules) == set(MODULES)
                                                    and set(args.dtypes) == set(DTYPES)))
    out = Path(args.out) if args.out else (RESULTS / "verdict.json" if full else None)
    doc = Path(args.doc) if args.doc else (DOC if full and not args.out else None)
    torch.manual_seed(SEED)
    result = run_all(args)
    print_report(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=_f))
        print(f"wrote {out}")
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(markdown(result))
        print(f"wrote {doc}")
    return 1 if not result["cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
