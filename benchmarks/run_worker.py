"""The worker of benchmarks/run.py: one process, one thread count; times every workload on every backend and
PyTorch, interleaved, and writes the column's measurements as JSON for the parent.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.run_report import _fmt_t
from benchmarks.run_workloads import (LINEAR_FAMILIES, Workload, qkv, workloads_dwconv, workloads_linear,
                                      workloads_lisa, workloads_ops, workloads_softmax, workloads_window)

#: The variables that size the BLAS / OpenMP / Numba pools: the parent sets each to the worker's thread count.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


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
        # (complex outputs, the LiSA spectral product, are compared as complex numbers: |a - b| of the complex
        # difference, not of the real parts alone)
        wide = np.complex128 if np.iscomplexobj(ref_out) else np.float64
        ref64 = np.asarray(ref_out, dtype=wide)
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
            diff = float(np.nanmax(np.abs(np.asarray(out, dtype=wide) - ref64))) / scale \
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
