"""Issue 6 benchmarks: refimpl on every backend against PyTorch CPU eager, in the same process and window.

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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
AUTO_TABLE = ROOT / "refimpl" / "backends" / "auto_table.json"   # package data (refimpl.backends.auto_order)
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


# ===================================================================================================
# Parent: one worker per thread count, then tables, fits and the auto table
# ===================================================================================================

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, few repeats")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--out", default=str(RESULTS / "run.json"))
    ap.add_argument("--no-auto-table", action="store_true")
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
    if not args.quick and not args.no_auto_table and not args.only:
        table = auto_table(columns[str(max(result["threads"]))])
        path = AUTO_TABLE
        path.write_text(json.dumps(table, indent=1))
        print(f"wrote {path}")
    return 1 if failed else 0


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    return info


def fit(ns: list[float], ts: list[float]) -> float | None:
    """Least-squares slope of log t against log N."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if t and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def fit_all(col: dict) -> dict:
    """{series: {impl: {dtype: exponent}}} over the workloads that share a 'series' key."""
    series: dict = {}
    for w in col["workloads"]:
        if not w.get("series"):
            continue
        for impl, m in w["impls"].items():
            if m.get("median_s"):
                series.setdefault(w["series"], {}).setdefault(impl, {}).setdefault(w["dtype"], []).append(
                    (w["N"], m["median_s"]))
    out: dict = {}
    for s, impls in series.items():
        for impl, by_dt in impls.items():
            for dt, pts in by_dt.items():
                if len(pts) >= 2:
                    pts.sort()
                    out.setdefault(s, {}).setdefault(impl, {})[dt] = {
                        "exponent": fit([p[0] for p in pts], [p[1] for p in pts]), "N": [p[0] for p in pts]}
    return out


def auto_table(col: dict) -> dict:
    """Per op and dtype: the backends that ran a kernel for it, fastest first (sum of medians over the
    workloads where every one of them was measured), then numpy."""
    acc: dict = {}
    for w in col["workloads"]:
        for op, used in w.get("ops", {}).items():
            timed = {b: w["impls"][b]["median_s"] for b in ("numpy", "numba", "c")
                     if b in w["impls"] and w["impls"][b].get("median_s") and (b == "numpy" or b in used)}
            if len(timed) < 2:
                continue
            d = acc.setdefault(op, {}).setdefault(w["dtype"], {})
            d.setdefault("_n", {})
            key = tuple(sorted(timed))
            d["_n"].setdefault(key, {})
            for b, t in timed.items():
                d["_n"][key][b] = d["_n"][key].get(b, 0.0) + t
    ops: dict = {}
    for op, by_dt in acc.items():
        entry = {}
        for dt, d in by_dt.items():
            best_key = max(d["_n"], key=len)
            sums = d["_n"][best_key]
            order = sorted(sums, key=lambda b: sums[b])
            entry[dt] = order + (["numpy"] if "numpy" not in order else [])
        entry["default"] = entry.get("float64") or next(iter(entry.values()))
        ops[op] = entry
    return {"generated_by": "benchmarks/run.py", "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "threads": col.get("threads"), "ops": ops}


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def print_report(result: dict) -> None:
    m = result["machine"]
    print(f"\nrefimpl benchmarks  {result['started']}  {m.get('cpu', '?')}  ({m.get('cpus')} CPUs)  "
          f"load {m.get('load_average')}")
    for t, col in result["columns"].items():
        print(f"\n=== {t} thread(s)  (torch {col.get('torch') or 'absent'}, numpy {col['numpy']}, backends: "
              f"{', '.join(b for b, s in col['backends'].items() if s['ok'])})")
        for name, p in col["peak"].items():
            print(f"peak {name}: {p['gflops']:.1f} GFLOP/s")
        hdr = f"{'workload':44s} {'dtype':7s} " + " ".join(f"{i:>20s}" for i in ("numpy", "numba", "c", "torch")) + \
            f" {'best/torch':>10s}"
        print(hdr)
        for w in col["workloads"]:
            cells = []
            for impl in ("numpy", "numba", "c", "torch"):
                mm = w["impls"].get(impl)
                if not mm:
                    cells.append(f"{'-':>20s}")
                elif mm.get("median_s") is None:
                    cells.append(f"{mm.get('status', 'n/a')[:20]:>20s}")
                else:
                    frac = mm.get("peak_fraction")
                    cells.append(f"{_fmt_t(mm['median_s']):>10s} {100 * frac:5.1f}%pk" if frac is not None
                                 else f"{_fmt_t(mm['median_s']):>20s}")
            r = w.get("best_over_torch")
            print(f"{w['name'][:44]:44s} {w['dtype']:7s} " + " ".join(cells) +
                  (f" {r['ratio']:6.2f} {r['backend']}" if r else ""))
        print("targets of issue 6:")
        for label, res, status in targets(col):
            print(f"  {status.strip('*'):7s} {label}: {res}")
        mem = col.get("memory")
        if mem:
            print("peak memory, linear attention N=65536 float64 (tracemalloc; multiple of N*C*8 bytes):")
            for k, v in mem.items():
                print(f"  {k:36s} {v['peak_mib']:8.1f} MiB = {v['per_NC8']:.2f} x N C 8 B")
    print("\nscaling exponents (slope of log time vs log N):")
    for t, fits in result["scaling"].items():
        for s, impls in fits.items():
            line = ", ".join(f"{impl}/{dt}={v['exponent']:.2f}" for impl, by in impls.items()
                             for dt, v in by.items() if v["exponent"] is not None)
            print(f"  [{t} thr] {s}: {line}")


#: The issue-6 targets that the tables decide (float64 unless stated): (label, workload-name prefix, dtype,
#: kind, limit).  kind "ratio": best accelerated backend / torch <= limit (every matching workload);
#: "peak": the accelerated backend's fraction of the same column's NumPy matmul peak >= limit, over the
#: matching workloads with N >= 16384.
TARGETS = [
    ("depthwise (C) <= 0.5x torch, float64", "depthwise", "float64", "ratio", 0.5),
    ("depthwise (C) <= 2x torch, float32", "depthwise", "float32", "ratio", 2.0),
] + [(f"linear attention {fam}: no slower than torch, every N", f"linattn {fam} N=", "float64", "ratio", 1.0)
     for fam in ("relu (generic)", "L2ViT", "FLatten focused", "RALA", "Castling")] + \
    [(f"linear attention {fam}: >= 40% of the float64 matmul peak at N >= 16384", f"linattn {fam} N=", "float64",
      "peak", 0.40) for fam in ("relu (generic)", "L2ViT", "FLatten focused", "RALA", "Castling")] + [
    ("window attention no slower than torch", "window attn", "float64", "ratio", 1.0),
    ("LiSA (14x14 C=192 D=16, 56x56 C=64 D=16) no slower than torch", "LiSA ", "float64", "ratio", 1.0),
]


def _accelerated(w: dict) -> tuple[str, float] | None:
    """(backend, median) of the fastest accelerated backend (numba, c) that ran a kernel, or None."""
    acc = {b: w["impls"][b]["median_s"] for b in ("numba", "c") if w["impls"].get(b, {}).get("median_s")}
    if not acc:
        return None
    b = min(acc, key=acc.get)
    return b, acc[b]


def targets(col: dict) -> list[tuple[str, str, str]]:
    """[(target, result, "met" | "missed")] for one thread column, from :data:`TARGETS`.  LiSA counts only
    the issue's two workloads (not the "(scaling)" rows); the result lists each matching workload's value."""
    rows = []
    for label, prefix, dtype, kind, limit in TARGETS:
        vals = []
        for w in col["workloads"]:
            if not w["name"].startswith(prefix) or w["dtype"] != dtype or "(scaling)" in w["name"]:
                continue
            acc = _accelerated(w)
            if acc is None or "torch" not in w["impls"] or not w["impls"]["torch"].get("median_s"):
                continue
            if kind == "ratio":
                vals.append((w["name"], acc[1] / w["impls"]["torch"]["median_s"]))
            elif (w.get("N") or 0) >= 16384:
                frac = w["impls"][acc[0]].get("peak_fraction")
                if frac is not None:
                    vals.append((w["name"], frac))
        if not vals:
            rows.append((label, "not measured", "missed"))
            continue
        ok = all(v <= limit for _, v in vals) if kind == "ratio" else all(v >= limit for _, v in vals)
        fmt = (lambda v: f"{v:.2f}x") if kind == "ratio" else (lambda v: f"{100 * v:.0f}%")
        rows.append((label, ", ".join(fmt(v) for _, v in vals), "met" if ok else "**missed**"))
    return rows


def markdown(result: dict) -> str:
    """The run as Markdown: machine and peaks, one table per thread count, memory, scaling exponents."""
    m = result["machine"]
    lines = [f"Run {result['started']} to {result['finished']}{' (--quick)' if result.get('quick') else ''}; "
             f"{m.get('cpu', '?')}, {m.get('cpus')} CPUs, {m.get('platform')}, Python {m.get('python')}; "
             f"load average at start {tuple(round(x, 2) for x in m.get('load_average', ()))}.", ""]
    for t, col in result["columns"].items():
        lines.append(f"#### {t} thread(s): numpy {col['numpy']}, torch {col.get('torch')}")
        lines.append("")
        lines.append("Matmul peak: " + "; ".join(f"{k} {v['gflops']:.1f} GFLOP/s (n = {v['n']})"
                                               for k, v in col["peak"].items()) + ".")
        lines.append("")
        lines.append("| workload | dtype | NumPy | Numba | C | torch | best refimpl / torch |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for w in col["workloads"]:
            cells = []
            for impl in ("numpy", "numba", "c", "torch"):
                mm = w["impls"].get(impl)
                if not mm:
                    cells.append("-")
                elif mm.get("median_s") is None:
                    cells.append(mm.get("status", "n/a"))
                else:
                    frac = mm.get("peak_fraction")
                    cells.append(_fmt_t(mm["median_s"]) + (f" ({100 * frac:.0f}%)" if frac is not None else ""))
            r = w.get("best_over_torch")
            lines.append(f"| {w['name']} | {w['dtype']} | " + " | ".join(cells) + " | " +
                         (f"{r['ratio']:.2f} ({r['backend']})" if r else "-") + " |")
        lines.append("")
        lines.append(f"Targets of issue 6, {t} thread(s), computed from the table above (benchmarks/run.py, "
                     f"`TARGETS`; each result lists the matching workloads in table order):")
        lines.append("")
        lines.append("| target | result | status |")
        lines.append("| --- | --- | --- |")
        for label, res, status in targets(col):
            lines.append(f"| {label} | {res} | {status} |")
        lines.append("")
        mem = col.get("memory")
        if mem:
            lines.append("Peak traced memory of one float64 linear-attention call (tracemalloc):")
            lines.append("")
            lines.append("| family [backend] | peak | / (N C 8 bytes) | an N x N float64 matrix would be |")
            lines.append("| --- | --- | --- | --- |")
            for k, v in mem.items():
                lines.append(f"| {k} | {v['peak_mib']:.1f} MiB | {v['per_NC8']:.2f} | {v['NxN_would_be_mib']:.0f} MiB |")
            lines.append("")
    lines.append("Scaling exponents (least-squares slope of log time against log N):")
    lines.append("")
    lines.append("| threads | series | exponents (impl/dtype) |")
    lines.append("| --- | --- | --- |")
    for t, fits in result["scaling"].items():
        for s, impls in fits.items():
            ex = ", ".join(f"{impl}/{dt} {v['exponent']:.2f}" for impl, by in impls.items()
                           for dt, v in by.items() if v["exponent"] is not None)
            ns = next(iter(next(iter(impls.values())).values()))["N"]
            lines.append(f"| {t} | {s} (N = {', '.join(str(n) for n in ns)}) | {ex} |")
    return "\n".join(lines)


# ===================================================================================================
# Worker: one process, one thread count
# ===================================================================================================

def worker(args) -> int:
    threads = int(args.threads)
    for var in THREAD_VARS:
        if os.environ.get(var) != str(threads):
            print(f"warning: {var}={os.environ.get(var)!r}, expected {threads} (run through the parent)",
                  file=sys.stderr)
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from refimpl import backends, config, numerics
    config.C_KERNEL_THREADS_MAX = threads
    try:
        import torch
        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)
    except Exception:  # torch is optional
        torch = None

    only = set(filter(None, args.only.split(",")))
    quick = args.quick
    status = backends.available()
    rec = Recorder(backends)
    bench = Bench(np, torch, numerics, backends, rec, status, quick)
    col = {"threads": threads, "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
           "backends": {b: {"ok": s.ok, "reason": s.reason} for b, s in status.items()},
           "peak": {}, "workloads": [], "memory": {}}
    if not only or "peak" in only:
        col["peak"] = bench.peaks()
    groups = [("dwconv", workloads_dwconv), ("linear", workloads_linear), ("window", workloads_window),
              ("lisa", workloads_lisa), ("ops", workloads_ops), ("softmax", workloads_softmax)]
    for gname, make in groups:
        if only and gname not in only:
            continue
        for wl in make(np, torch, quick):
            res = bench.run(wl, col["peak"])
            col["workloads"].append(res)
            print(f"  [{threads} thr] {res['name']:44s} {res['dtype']:7s} " + "  ".join(
                f"{k}={_fmt_t(v.get('median_s'))}" if v.get("median_s") else f"{k}:{v.get('status')}"
                for k, v in res["impls"].items()), flush=True)
    if not only or "linear" in only:
        col["memory"] = bench.memory(np, quick)
    Path(args.worker_out).write_text(json.dumps(col, default=float))
    return 0


class Recorder:
    """Wraps backends.get to record {op: set(backend)} resolved while a call runs."""

    def __init__(self, backends):
        self.backends = backends
        self.orig = backends.get
        self.seen: dict = {}

        def get(op, backend=None, *, dtype=None):
            impl = self.orig(op, backend, dtype=dtype)
            for name, fn in backends._REGISTRY.get(op, {}).items():
                if fn is impl:
                    self.seen.setdefault(op, set()).add(name)
            return impl

        backends.get = get

    def capture(self, fn):
        self.seen = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = fn()
        return out, {k: sorted(v) for k, v in self.seen.items()}


class Workload:
    """name, dtype, flops, refimpl callable (run under each backend), torch callable, series/N for fits."""

    def __init__(self, name, dtype, flops, flop_note, ref, torch_fn=None, series=None, n=None, direct=None):
        self.name, self.dtype, self.flops, self.flop_note = name, dtype, flops, flop_note
        self.ref, self.torch_fn, self.series, self.n = ref, torch_fn, series, n
        self.direct = direct or {}   # backend -> callable that bypasses the switch (e.g. kernels with out=)


class Bench:
    def __init__(self, np, torch, numerics, backends, rec, status, quick):
        self.np, self.torch, self.numerics, self.backends = np, torch, numerics, backends
        self.rec, self.status, self.quick = rec, status, quick
        self.repeats = 3 if quick else 7

    def peaks(self) -> dict:
        np, torch = self.np, self.torch
        n = 1024 if self.quick else 2048
        out = {}
        rng = np.random.default_rng(0)
        for dt in ("float64", "float32"):
            a = rng.standard_normal((n, n)).astype(dt)
            b = rng.standard_normal((n, n)).astype(dt)
            fns = {f"numpy matmul {dt}": lambda a=a, b=b: a @ b}
            if torch is not None:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                fns[f"torch matmul {dt}"] = lambda ta=ta, tb=tb: ta @ tb
            times = self.interleaved(fns, 5)
            for k, ts in times.items():
                med = statistics.median(ts)
                out[k] = {"n": n, "median_s": med, "gflops": 2 * n ** 3 / med / 1e9}
        return out

    def interleaved(self, fns: dict, repeats: int, settle: bool = True) -> dict:
        """Median inputs: ``repeats`` rounds, each calling every implementation in turn.  With ``settle``,
        each timed call follows one untimed call of the same implementation, so the timing is the steady
        state of that implementation (its threads awake, its buffers recycled, the other implementation's
        cache footprint and idle BLAS/OpenMP workers flushed out) while drift on the shared machine still
        affects all implementations alike."""
        for f in fns.values():       # warm-up
            f()
            f()
        times = {k: [] for k in fns}
        for _ in range(repeats):
            for k, f in fns.items():
                if settle:
                    f()
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        return times

    def run(self, wl: Workload, peak: dict) -> dict:
        np = self.np
        res = {"name": wl.name, "dtype": wl.dtype, "flops": wl.flops, "flop_note": wl.flop_note,
               "series": wl.series, "N": wl.n, "impls": {}, "ops": {}}
        dt = np.dtype(wl.dtype)

        def under(b):
            def call():
                with self.backends.use(b), self.numerics.precision(dt):
                    return wl.ref()
            return call

        fns = {}
        ref_out, ops = self.rec.capture(under("numpy"))
        fns["numpy"] = under("numpy")
        res["ops"] = {}
        for b in ("numba", "c"):
            if b in wl.direct:
                if not self.status[b].ok:
                    res["impls"][b] = {"status": "unavailable"}
                    continue
                fns[b] = wl.direct[b]
                res["ops"].setdefault(wl.direct.get("op", "?"), []).append(b)
                continue
            if not self.status[b].ok:
                res["impls"][b] = {"status": "unavailable"}
                continue
            _, used = self.rec.capture(under(b))
            ran = [op for op, bs in used.items() if b in bs]
            for op in ran:
                res["ops"].setdefault(op, []).append(b)
            if ran:
                fns[b] = under(b)
            else:
                res["impls"][b] = {"status": "no kernel"}
        for op in ops:
            res["ops"].setdefault(op, [])
        if wl.torch_fn is not None:
            fns["torch"] = wl.torch_fn
        # informational agreement (not a test): max |impl - numpy| / max |numpy|
        ref64 = np.asarray(ref_out, dtype=np.float64)
        scale = float(np.nanmax(np.abs(ref64))) or 1.0
        first_t = time.perf_counter()
        del ref_out
        reps = self.repeats
        t_one = time.perf_counter()
        fns["numpy"]()
        slow = time.perf_counter() - t_one
        if slow > 1.0:
            reps = 3
        times = self.interleaved(fns, reps, settle=slow < 0.25)
        for k, f in fns.items():
            out = f()
            if hasattr(out, "detach"):
                out = out.detach().numpy()
            if isinstance(out, tuple):
                out = out[-1]
            diff = float(np.nanmax(np.abs(np.asarray(out, dtype=np.float64) - ref64))) / scale \
                if np.shape(out) == ref64.shape else None
            med = statistics.median(times[k])
            pk = peak.get(f"numpy matmul {wl.dtype}", {}).get("gflops")
            gf = wl.flops / med / 1e9 if wl.flops else None
            res["impls"][k] = {"median_s": med, "times_s": times[k], "gflops": gf,
                               "peak_fraction": gf / pk if gf and pk else None, "max_rel_diff_vs_numpy": diff}
        res["window_s"] = time.perf_counter() - first_t
        if "torch" in res["impls"]:
            acc = {b: res["impls"][b]["median_s"] for b in ("numpy", "numba", "c")
                   if res["impls"].get(b, {}).get("median_s")}
            best = min(acc, key=acc.get)
            res["best_over_torch"] = {"backend": best, "ratio": acc[best] / res["impls"]["torch"]["median_s"]}
            res["ratios_over_torch"] = {b: t / res["impls"]["torch"]["median_s"] for b, t in acc.items()}
        return res

    def memory(self, np, quick) -> dict:
        """tracemalloc peak of one float64 linear-attention call per family and backend at N = 65536."""
        n = 16384 if quick else 65536
        out = {}
        for fam, make in LINEAR_FAMILIES.items():
            q, k, v = qkv(np, 1, 3, n, 32, np.float64, seed=1)
            ref = make(np, q, k, v)
            for b in ("numpy", "numba", "c"):
                if b != "numpy" and not self.status[b].ok:
                    continue
                with self.backends.use(b):
                    _, used = self.rec.capture(ref)
                    if b != "numpy" and not any(b in bs for bs in used.values()):
                        continue
                    tracemalloc.start()
                    ref()
                    _, peak_b = tracemalloc.get_traced_memory()
                    tracemalloc.stop()
                nc8 = n * 3 * 32 * 8
                out[f"{fam} [{b}] N={n}"] = {"peak_mib": peak_b / 2 ** 20, "per_NC8": peak_b / nc8,
                                             "NxN_would_be_mib": 3 * n * n * 8 / 2 ** 20}
        return out


# ===================================================================================================
# Workloads
# ===================================================================================================

def qkv(np, b, h, n, d, dt, seed=0, e=None):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((b, h, n, dd)).astype(dt) for dd in (d, d, e or d))


def workloads_dwconv(np, torch, quick):
    from refimpl import backends, layers
    out = []
    for (shape, kk) in (((1, 96, 56, 56), 7), ((1, 384, 14, 14), 3)):
        for dt in ("float64", "float32"):
            rng = np.random.default_rng(0)
            c = shape[1]
            x = rng.standard_normal(shape).astype(dt)
            w = rng.standard_normal((c, 1, kk, kk)).astype(dt)
            bias = rng.standard_normal(c).astype(dt)
            p = kk // 2
            pads = (p, p, p, p)
            flops = 2 * c * shape[2] * shape[3] * kk * kk
            direct = {"op": "depthwise_conv2d"}
            for bname in ("numba", "c"):
                impl = backends._REGISTRY["depthwise_conv2d"].get(bname)
                if impl is not None:
                    buf = backends.empty_aligned(shape, dt)
                    direct[bname] = (lambda impl=impl, buf=buf, x=x, w=w, bias=bias, pads=pads:
                                     impl(x, w, bias, (1, 1), pads, out=buf))
            tfn = None
            if torch is not None:
                tx, tw, tb = (torch.from_numpy(a) for a in (x, w, bias))
                tfn = (lambda tx=tx, tw=tw, tb=tb, p=p, c=c:
                       torch.nn.functional.conv2d(tx, tw, tb, padding=p, groups=c))
            out.append(Workload(f"depthwise {kk}x{kk} {shape}", dt, flops, "2 C H W KH KW",
                                lambda x=x, w=w, bias=bias, p=p: layers.depthwise_conv2d(x, w, bias, padding=p),
                                tfn, direct=direct))
    return out


# --- linear attention families: refimpl calls and PyTorch eager equivalents -----------------------

def _fam_relu(np, q, k, v):
    from refimpl.attention import linear
    return lambda: linear.linear_attention(q, k, v, feature_map="relu")


def _fam_l2vit(np, q, k, v):
    from refimpl.attention import enhanced
    return lambda: enhanced.enhanced_linear_attention(q, k, v)


def _fam_focused(np, q, k, v):
    from refimpl.attention import focused
    return lambda: focused.focused_attention(q, k, v)


def _fam_rala(np, q, k, v):
    from refimpl.attention import rala
    cfg = rala.RALAConfig(dim=q.shape[1] * q.shape[3], num_heads=q.shape[1])
    return lambda: rala.rala_core(q, k, v, cfg)


def _fam_castling(np, q, k, v):
    from refimpl.attention import angular
    return lambda: angular.linear_angular_attention(q, k, v)


LINEAR_FAMILIES = {"relu (generic)": _fam_relu, "L2ViT": _fam_l2vit, "FLatten focused": _fam_focused,
                   "RALA": _fam_rala, "Castling": _fam_castling}


def _torch_linear(torch, fam):
    """PyTorch eager code a user would write for each family (what the released code computes for the
    paper preset's equations; same inputs)."""
    F = torch.nn.functional
    from refimpl import config

    def attend(pq, pk, v, clamp=None):
        kv = pk.transpose(-1, -2) @ v
        ks = pk.sum(dim=-2, keepdim=True)
        den = (pq * ks).sum(dim=-1, keepdim=True)
        if clamp is not None:
            den = den.clamp(min=clamp)
        return (pq @ kv) / den

    if fam == "relu (generic)":
        return lambda q, k, v: attend(F.relu(q), F.relu(k), v)
    if fam == "L2ViT":
        return lambda q, k, v: attend(F.relu(q), F.relu(k), v, clamp=config.L2VIT_C_MIN)
    if fam == "FLatten focused":
        p = config.FLATTEN_FOCUSING_FACTOR

        def focus(x):
            x = F.relu(x)
            t = x ** p
            return x.norm(dim=-1, keepdim=True) / t.norm(dim=-1, keepdim=True) * t
        return lambda q, k, v: attend(focus(q), focus(k), v)
    if fam == "RALA":
        def rala(q, k, v):
            kq, kk = F.elu(q) + 1, F.elu(k) + 1
            qg = q.mean(dim=-2, keepdim=True)
            alpha = k.shape[-2] * torch.softmax((qg @ kk.transpose(-1, -2)), dim=-1)   # (B,h,1,N)
            kw = alpha.transpose(-1, -2) * kk
            return attend(kq, kw, v)
        return rala
    if fam == "Castling":
        def castling(q, k, v):
            qh, kh = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            return 0.5 * v.sum(dim=-2, keepdim=True) + (qh @ (kh.transpose(-1, -2) @ v)) / math.pi
        return castling
    raise KeyError(fam)


def _reused_buffers_linear(np, q, k, v):
    """The fused C kernel called directly with a 64-byte aligned out= and workspace= allocated once and
    reused across calls (issue 6 item 3, steady-state memory): operation "linear_attention", ReLU map.  The
    family rows call the reference functions, which allocate both on every call like any function that
    returns a fresh array; this row shows what the reuse saves."""
    from refimpl import backends
    impl = backends._REGISTRY.get("linear_attention", {}).get("c")
    if impl is None or not backends.available()["c"].ok:
        return {}
    from refimpl.backends import _c_linear
    b, h, n, d = q.shape
    buf = backends.empty_aligned(q.shape[:3] + v.shape[3:], q.dtype)
    ws = _c_linear.linear_attention_workspace(b, h, k.shape[2], d, v.shape[3], q.dtype)
    return {"op": "linear_attention", "c": lambda: impl(q, k, v, "relu", out=buf, workspace=ws)}


def workloads_linear(np, torch, quick):
    sizes = [(196, 64, 1)] + [(n, 32, 3) for n in ((3136, 16384) if quick else (3136, 16384, 65536))]
    out = []
    for fam, make in LINEAR_FAMILIES.items():
        tf = _torch_linear(torch, fam) if torch is not None else None
        for n, d, h in sizes:
            if d == 64:
                h = 3     # N = 196, d = 64: 3 heads (C = 192)
            for dt in ("float64", "float32"):
                q, k, v = qkv(np, 1, h, n, d, dt)
                tfn = None
                if tf is not None:
                    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
                    tfn = (lambda tf=tf, tq=tq, tk=tk, tv=tv: tf(tq, tk, tv))
                flops = h * (4 * n * d * d + 3 * n * d)
                out.append(Workload(f"linattn {fam} N={n} d={d} h={h}", dt, flops,
                                    "4 N d e + 3 N d per head", make(np, q, k, v), tfn,
                                    series=f"linattn {fam} d=32" if d == 32 else None, n=n))
                if fam == "relu (generic)":
                    out.append(Workload(f"linattn relu, reused out=/workspace= N={n} d={d} h={h}", dt, flops,
                                        "4 N d e + 3 N d per head", make(np, q, k, v), tfn, n=n,
                                        direct=_reused_buffers_linear(np, q, k, v)))
    return out


def workloads_window(np, torch, quick):
    from refimpl.attention import softmax
    from refimpl import layers
    out = []
    hgt = wid = 56
    c, heads, ws = 96, 3, 7
    rng = np.random.default_rng(0)
    for dt in ("float64", "float32"):
        x = rng.standard_normal((1, hgt, wid, c)).astype(dt)
        p = {"qkv.weight": (rng.standard_normal((3 * c, c)) / math.sqrt(c)).astype(dt),
             "qkv.bias": rng.standard_normal(3 * c).astype(dt) * 0.1,
             "proj.weight": (rng.standard_normal((c, c)) / math.sqrt(c)).astype(dt),
             "proj.bias": rng.standard_normal(c).astype(dt) * 0.1,
             "relative_position_bias_table": rng.standard_normal(((2 * ws - 1) ** 2, heads)).astype(dt) * 0.1}
        n_tok, n_win, d = ws * ws, (hgt // ws) * (wid // ws), c // heads
        flops = n_win * (2 * n_tok * c * 3 * c + 2 * n_tok * c * c + heads * 4 * n_tok * n_tok * d)
        tfn = None
        if torch is not None:
            idx = layers.relative_position_index(ws, ws)
            tp = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}
            tidx = torch.from_numpy(np.asarray(idx, dtype=np.int64))
            tx = torch.from_numpy(x)

            def tfn(tx=tx, tp=tp, tidx=tidx):
                F = torch.nn.functional
                b = tx.shape[0]
                xw = tx.view(b, hgt // ws, ws, wid // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, n_tok, c)
                qkv_ = F.linear(xw, tp["qkv.weight"], tp["qkv.bias"]).reshape(-1, n_tok, 3, heads, d)
                qkv_ = qkv_.permute(2, 0, 3, 1, 4)
                q, k, v = qkv_[0], qkv_[1], qkv_[2]
                attn = (q * d ** -0.5) @ k.transpose(-2, -1)
                bias = tp["relative_position_bias_table"][tidx.view(-1)].view(n_tok, n_tok, -1).permute(2, 0, 1)
                attn = torch.softmax(attn + bias.unsqueeze(0), dim=-1)
                o = (attn @ v).transpose(1, 2).reshape(-1, n_tok, c)
                o = F.linear(o, tp["proj.weight"], tp["proj.bias"])
                return o.view(b, hgt // ws, wid // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hgt, wid, c)
        out.append(Workload("window attn 7x7 56x56 C=96 h=3", dt, flops,
                            "qkv + proj matmuls + 4 n^2 d per window and head",
                            lambda x=x, p=p: softmax.window_attention(x, p, num_heads=heads, window_size=ws), tfn))
    return out


def workloads_lisa(np, torch, quick):
    from refimpl.attention import lisa
    cases = [((14, 14), 192, 6, "LiSA 14x14 C=192 D=16"), ((56, 56), 64, 2, "LiSA 56x56 C=64 D=16")]
    series = [((s, s), 64, 2) for s in ((14, 28) if quick else (14, 28, 56, 112))]
    out = []
    dd = 16
    for grid, c_all, h, name, ser in [(g, c, h, nm, None) for g, c, h, nm in cases] + \
            [(g, c, h, f"LiSA {g[0]}x{g[1]} C={c} (scaling)", "lisa C=64") for g, c, h in series]:
        n = grid[0] * grid[1]
        c = c_all // h
        for dt in ("float64", "float32"):
            if ser and dt == "float32":
                continue
            rng = np.random.default_rng(0)
            q, k, v = qkv(np, 1, h, n, c, dt)
            wa = (rng.standard_normal((n, c, dd)) / n).astype(dt)
            wb = (rng.standard_normal((n, dd)) / n).astype(dt)
            ba, bb = (rng.standard_normal((c, dd)) * 0.1).astype(dt), (rng.standard_normal((c, dd)) * 0.1).astype(dt)
            fft = 5 * n * math.log2(n) / 2 * (2 * c * dd + c)
            flops = h * (4 * n * c * dd + fft)
            tfn = None
            if torch is not None:
                t = {kk: torch.from_numpy(a) for kk, a in dict(q=q, k=k, v=v, wa=wa, wb=wb, ba=ba, bb=bb).items()}

                def tfn(t=t, grid=grid, n=n, c=c, h=h):
                    F = torch.nn.functional
                    qb, kb = F.normalize(t["q"], dim=-1), F.normalize(t["k"], dim=-1)
                    gshape = (1, h) + grid
                    dims = (2, 3)
                    kf = torch.fft.rfftn(kb.reshape(gshape + (c, 1)), dim=dims)
                    waf = torch.fft.rfftn(t["wa"].reshape(grid + (c, dd)), dim=(0, 1))
                    ga = torch.fft.irfftn(kf * waf, s=grid, dim=dims).reshape(1, h, n, c, dd)
                    vf = torch.fft.rfftn(t["v"].reshape(gshape + (c, 1)), dim=dims)
                    wbf = torch.fft.rfftn(t["wb"].reshape(grid + (1, dd)), dim=(0, 1))
                    gb = torch.fft.irfftn(vf * wbf, s=grid, dim=dims).reshape(1, h, n, c, dd)
                    s = torch.einsum("bhnc,bhncd->bhnd", qb, ga + t["ba"])
                    return torch.einsum("bhnd,bhnvd->bhnv", s, gb + t["bb"])
            out.append(Workload(name, dt, flops, "contraction 4 N c D + rfft 2.5 N log2 N per channel, per head",
                                lambda q=q, k=k, v=v, wa=wa, wb=wb, ba=ba, bb=bb, grid=grid:
                                lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid), tfn, series=ser, n=n))
    return out


def workloads_ops(np, torch, quick):
    """The Numba operations on their own (refimpl/backends/_numba*.py): the NumPy twin (the "numpy"
    column), the registered Numba kernel with a reused out= buffer, and the PyTorch eager expression."""
    from refimpl import backends
    from refimpl.attention import lisa_cores
    out = []
    reg = backends._REGISTRY
    n = 3136 if quick else 16384

    def direct(op, args, shape_dtype):
        d = {"op": op}
        impl = reg[op].get("numba")
        if impl is not None:
            buf = backends.empty_aligned(*shape_dtype)
            d["numba"] = lambda: impl(*args, out=buf)
        return d

    for dt in ("float64", "float32"):
        rng = np.random.default_rng(0)
        # LiSA contraction at 56x56, C = 64 (h = 2, c = 32), D = 16
        m, c, dd = 3136, 32, 16
        qb = rng.standard_normal((1, 2, m, c)).astype(dt)
        a, bv = (rng.standard_normal((1, 2, m, c, dd)).astype(dt) for _ in range(2))
        tfn = None
        if torch is not None:
            tq, ta, tb = (torch.from_numpy(x) for x in (qb, a, bv))
            tfn = (lambda tq=tq, ta=ta, tb=tb: torch.einsum("bhnd,bhnvd->bhnv",
                                                            torch.einsum("bhnc,bhncd->bhnd", tq, ta), tb))
        out.append(Workload("op lisa_contraction 56x56 c=32 D=16 h=2", dt, 2 * 4 * m * c * dd, "4 N c D per head",
                            lambda qb=qb, a=a, bv=bv: lisa_cores._lisa_contraction_numpy(qb, a, bv)[1], tfn,
                            direct=direct("lisa_contraction", (qb, a, bv), ((1, 2, m, c), dt))))
        # spectral product of Ga at 56x56 (rfft bins 56 x 29), c = 32, D = 16, 2 heads
        cdt = "complex128" if dt == "float64" else "complex64"
        nf = 56 * 29
        xf = (rng.standard_normal((2, nf, c)) + 1j * rng.standard_normal((2, nf, c))).astype(cdt)
        kf = (rng.standard_normal((nf, c, dd)) + 1j * rng.standard_normal((nf, c, dd))).astype(cdt)
        tfn = None
        if torch is not None:
            tx, tk = torch.from_numpy(xf), torch.from_numpy(kf)
            tfn = (lambda tx=tx, tk=tk: tx[..., None] * tk[None])
        out.append(Workload("op lisa_spectral_product 56x56 c=32 D=16 h=2", dt, 6 * 2 * nf * c * dd,
                            "6 real flops per complex product",
                            lambda xf=xf, kf=kf: backends.definition("lisa_spectral_product")(xf, kf), tfn,
                            direct=direct("lisa_spectral_product", (xf, kf), ((2, nf, c, dd), cdt))))
        # focused function f_p, p = 3, on (1, 3, N, 32)
        x = np.abs(rng.standard_normal((1, 3, n, 32))).astype(dt)
        tfn = None
        if torch is not None:
            tx = torch.from_numpy(x)

            def tfn(tx=tx):
                t = tx ** 3.0
                return tx.norm(dim=-1, keepdim=True) / t.norm(dim=-1, keepdim=True) * t
        out.append(Workload(f"op focused_function p=3 N={n} d=32 h=3", dt, None, "elementwise (no FLOP count)",
                            lambda x=x: backends.definition("focused_function")(x, 3.0), tfn,
                            direct=direct("focused_function", (x, 3.0), (x.shape, dt))))
        # angular series features, order 1 (d + d^3 + 1 features), Castling d = 8 heads-like rows
        xa = rng.standard_normal((1, 3, n // 4, 8)).astype(dt)
        dim = 1 + 8 + 8 ** 3
        tfn = None
        if torch is not None:
            txa = torch.from_numpy(xa)
            c1 = math.sqrt(1 / 6 / math.pi)
            c0 = math.sqrt(1 / math.pi)

            def tfn(txa=txa, c0=c0, c1=c1):
                xh = torch.nn.functional.normalize(txa, dim=-1)
                p3 = (xh[..., :, None, None] * xh[..., None, :, None] * xh[..., None, None, :]).flatten(-3)
                const = torch.full(xh.shape[:-1] + (1,), math.sqrt(0.5), dtype=xh.dtype)
                return torch.cat([const, c0 * xh, c1 * p3], dim=-1)
        out.append(Workload(f"op angular_series_features K=1 N={n // 4} d=8 h=3", dt, None,
                            "elementwise (no FLOP count)",
                            lambda xa=xa: backends.definition("angular_series_features")(xa, 1), tfn,
                            direct=direct("angular_series_features", (xa, 1), ((1, 3, n // 4, dim), dt))))
    return out


def workloads_softmax(np, torch, quick):
    """Global softmax attention (quadratic) for the scaling-exponent comparison only."""
    from refimpl.attention import softmax
    out = []
    for n in ((196, 784) if quick else (196, 784, 1568)):
        dt = "float64"
        q, k, v = qkv(np, 1, 3, n, 32, dt)
        tfn = None
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            tfn = (lambda tq=tq, tk=tk, tv=tv: torch.softmax((tq * 32 ** -0.5) @ tk.transpose(-1, -2), dim=-1) @ tv)
        out.append(Workload(f"softmax attn N={n} d=32 h=3", dt, 3 * 4 * n * n * 32, "4 N^2 d per head",
                            lambda q=q, k=k, v=v: softmax.softmax_attention(q, k, v), tfn,
                            series="softmax (global) d=32", n=n))
    return out


if __name__ == "__main__":
    sys.exit(main())
