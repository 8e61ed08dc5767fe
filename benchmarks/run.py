"""The attention benchmarks: refimpl on every backend against PyTorch CPU eager, in the same process and window.

Run (from the repository root; never part of the test suite):

    python benchmarks/run.py             # full run, 1-thread and 2-thread columns (a few minutes)
    python benchmarks/run.py --quick     # smoke run: smaller N, fewer repeats (about a minute)
    python benchmarks/run.py --threads 1 # one column only

Prints the tables and writes

- benchmarks/results/run.json: every measurement (median, all repeats, GFLOP/s, fraction of peak, ratios),
  the machine, the matmul peaks, fitted scaling exponents and the peak memory of linear attention;
- refimpl/backends/auto_table.json (package data): per operation and dtype, the backends ordered fastest first, in
  the format ``refimpl.backends`` reads for ``use("auto")`` (``{"ops": {op: {"float64": [...],
  "float32": [...], "default": [...]}}}``), from the multi-thread column.  ``--no-auto-table`` skips it;
  ``--auto-table-ops OPS`` (with ``--only``) replaces only those operations' entries, recorded under "merged";
  ``--quick`` never writes it (its sizes are not the ones that matter).

Method
------
- Threads.  Each thread count T runs in its own worker process (this script with ``--worker``), whose
  environment sets OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = NUMBA_NUM_THREADS = T before
  NumPy is imported (the only reliable way to size OpenBLAS's pool without threadpoolctl, which is not a
  dependency), calls ``torch.set_num_threads(T)`` and caps the C kernels at T threads
  (``config.C_KERNEL_THREADS_MAX``).  NumPy, Numba, C and torch of one column therefore share one process.
- Idle threads sleep: the workers run with OMP_WAIT_POLICY=PASSIVE (torch's OpenMP pool) and
  OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's pool), unless set in the environment.  Without them, on this
  2-core machine, the pools' spinning after each call stole the core from the next implementation of
  the interleaved loop (NumPy elementwise code measured 10-30x slower in the 2-thread column).
- Same time window.  After warm-up (2 calls each; Numba compiles then, or loads its cache), the
  implementations of one workload are timed *interleaved*: repeat r calls every implementation once, so
  drift of the shared machine hits all of them alike.  The figure is the median of the repeats; ratios are
  of medians of the same window.
- Which backend really ran.  ``refimpl.backends.get`` is wrapped to record the operations each call
  resolves and to which backend; a backend column whose calls all resolve to NumPy (no kernel for that
  operation yet) is reported as "no kernel" instead of being timed.  The script needs no change as kernels
  are registered: it discovers them through the registry at run time.
- Precision.  float64 and float32.  refimpl computes in float32 only inside ``numerics.precision``, which
  the float32 rows use; inputs are the same arrays (float32-rounded) for every implementation.
- FLOPs.  Nominal counts, stated per workload in ``flop_note``: matmul 2 n^3; depthwise 2 C OH OW KH KW;
  linear attention 4 N d e + 3 N d per head (phi(K)^T V, phi(Q) KV, key sum, normaliser; feature maps
  not counted); window attention the qkv/proj matmuls and 2 n^2 d per window and head for QK^T and AV;
  LiSA the contraction 4 N c D per head plus 5 N log2 N per FFT channel (3 transforms of c D, c D and c
  channels, rfft: half).  GFLOP/s = FLOPs / median time; "of peak" divides by the same process's
  matmul peak of that dtype (NumPy's, OpenBLAS).
- Scaling exponent: least-squares slope of log(time) against log(N) over the sizes of a family.
- Memory: tracemalloc's peak (it sees NumPy's and Numba's buffers, not torch's) for one linear-attention
  call at N = 65536, float64, reported as a multiple of N C 8 bytes (the size of one (N, C) input).

The parts, each a module of benchmarks/: ``run_worker`` (the worker process: backend recording, the interleaved
timing, peaks and memory), ``run_workloads`` (the workloads and their PyTorch eager equivalents) and
``run_report`` (fits, the auto table, the targets, the console tables and the Markdown); this file is the parent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine  # noqa: E402
from benchmarks.run_report import auto_table, fit_all, markdown, print_report  # noqa: E402
from benchmarks.run_worker import THREAD_VARS, worker  # noqa: E402

AUTO_TABLE = ROOT / "refimpl" / "backends" / "auto_table.json"   # package data (refimpl.backends.auto_order)


# ===================================================================================================
# Parent: one worker per thread count, then tables, fits and the auto table
# ===================================================================================================

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, few repeats")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--out", default=str(RESULTS / "run.json"))
    ap.add_argument("--no-auto-table", action="store_true")
    ap.add_argument("--auto-table-ops", default="", metavar="OPS",
                    help="comma-separated operations whose auto-table entries this run replaces in the existing "
                         "table, the others kept (with --only: a row for one operation without a full run)")
    ap.add_argument("--only", default="", help="comma-separated workload groups (dwconv,linear,window,lisa,"
                                               "ops,softmax,peak); default all")
    ap.add_argument("--markdown", default="", metavar="RUN_JSON",
                    help="print a run.json as the Markdown tables of docs/benchmarks.md and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0

    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    columns: dict = {}
    failed: list[int] = []
    for t in threads:
        env = dict(os.environ)
        for var in THREAD_VARS:
            env[var] = str(t)
        # Idle worker threads must sleep, not spin: with 2 cores, torch's OpenMP pool and OpenBLAS's pool
        # spinning after their calls steal the core the next (interleaved) implementation runs on, and a
        # 2-thread column measured 10-30x slower NumPy elementwise code than the 1-thread one.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")   # 2^4 cycles of spinning, the minimum
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "w.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--worker-out", str(out),
                   "--threads", str(t)] + (["--quick"] if args.quick else []) + \
                  (["--only", args.only] if args.only else [])
            print(f"# worker: {t} thread(s)", flush=True)
            proc = subprocess.run(cmd, env=env, cwd=str(ROOT))
            if proc.returncode != 0 or not out.is_file():
                print(f"worker for {t} thread(s) failed (exit {proc.returncode}); its column is left out",
                      file=sys.stderr)
                failed.append(t)
                continue
            columns[str(t)] = json.loads(out.read_text())
    if not columns:
        return 1
    result = {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": args.quick,
              "machine": machine(), "threads": [t for t in threads if t not in failed], "failed_threads": failed,
              "columns": columns}
    result["scaling"] = {t: fit_all(col) for t, col in columns.items()}
    print_report(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    print(f"\nwrote {args.out}")
    if args.auto_table_ops:
        if args.quick:
            print("--auto-table-ops: not with --quick (its sizes are not the ones that matter)", file=sys.stderr)
            return 2
        return merge_auto_table(auto_table(columns[str(max(result["threads"]))]),
                                [o for o in args.auto_table_ops.split(",") if o.strip()]) or (1 if failed else 0)
    if not args.quick and not args.no_auto_table and not args.only:
        table = auto_table(columns[str(max(result["threads"]))])
        path = AUTO_TABLE
        path.write_text(json.dumps(table, indent=1))
        print(f"wrote {path}")
    return 1 if failed else 0


def merge_auto_table(table: dict, ops: list[str], path: Path = AUTO_TABLE) -> int:
    """Replace the entries of ``ops`` in the auto table at ``path`` by this run's (``table``), keeping every
    other entry and recording when and at how many threads each merged entry was measured ("merged")."""
    missing = [o for o in ops if o not in table["ops"]]
    if missing:
        print(f"--auto-table-ops: this run measured no backend kernel for {missing} (measured: "
              f"{sorted(table['ops'])})", file=sys.stderr)
        return 2
    old = json.loads(path.read_text()) if path.is_file() else {"generated_by": table["generated_by"], "ops": {}}
    for o in ops:
        old["ops"][o] = table["ops"][o]
        old.setdefault("merged", {})[o] = {"generated": table["generated"], "threads": table["threads"]}
    path.write_text(json.dumps(old, indent=1))
    print(f"merged {ops} into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
