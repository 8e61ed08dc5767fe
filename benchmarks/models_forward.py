"""Forward time of the full-size networks: refimpl (each available backend) vs the PyTorch twin on CPU.

Each model at 224 x 224, batch 1, float64, random parameters (refimpl.models init) loaded into both sides;
refimpl timed once per available backend and under "auto" (refimpl.backends.use: "numpy" is the definition,
"numba"/"c" swap in the accelerated kernels where an operation has one, "auto" picks per operation from the
auto table), the twin with torch.no_grad() in eval mode, all in the same process and run.  Reported: the best
wall time of ``--repeats`` runs after one warm-up run (Numba compiles on first use), every repeat's time (so
that benchmarks/compare.py can tell a regression from run-to-run noise), and the ratio refimpl / PyTorch (the
goal for the accelerated backends, docs/benchmarks.md: <= 1).

Threads: each thread count of ``--threads`` (default "1,2") is run in turn, with BLAS/OpenMP pools limited by
threadpoolctl (``threadpool_limits``: OpenBLAS, MKL, OpenMP, whichever NumPy and torch loaded), torch by
``torch.set_num_threads``, Numba by ``numba.set_num_threads`` and the C kernels' own thread teams by
``config.C_KERNEL_THREADS_MAX``; rows are keyed by (model, threads).  (Before 2026-11-27 the cap was not
set, so the 1-thread rows of earlier results ran the C kernels and LiSA's fused core on 2 threads.)

Run:  python benchmarks/models_forward.py                    (FLatten + Castling models; writes
                                                              benchmarks/results/models_forward.json)
      python benchmarks/models_forward.py --models all        (every registered model with a twin)
      python benchmarks/models_forward.py --quick             (reduced configs: a smoke run)
      python benchmarks/compare.py OLD.json NEW.json          (what got slower, beyond the noise)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="flatten,castling",
                    help="comma-separated model names or family names, or 'all' (default: flatten,castling)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, each run in turn")
    ap.add_argument("--quick", action="store_true", help="reduced configs (family.reduced), for a smoke run")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "models_forward.json"))
    return ap.parse_args()


ARGS = _parse()
THREADS = [int(t) for t in str(ARGS.threads).split(",") if t.strip()]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import refimpl.twins.models as em  # noqa: E402
import refimpl.models as rm  # noqa: E402
from benchmarks.common import wall_times  # noqa: E402
from equivalence.assertions import load_numpy_state  # noqa: E402
from refimpl import backends, config  # noqa: E402
from refimpl.models import counting  # noqa: E402


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    # The C kernels and LiSA's fused Numba core size their own thread teams from this cap (backends/_c.py
    # default_threads); threadpoolctl does not reach them.  Without it the "1 thread" rows ran them on 2.
    config.C_KERNEL_THREADS_MAX = n
    try:
        import numba
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass


def _selected() -> list[str]:
    names = em.names()
    if ARGS.models == "all":
        return names
    want = [w.strip() for w in ARGS.models.split(",") if w.strip()]
    return [n for n in names if n in want or rm.family_of(n).__name__.rsplit(".", 1)[-1] in want]


def main() -> None:
    avail = [b for b, st in backends.available().items() if st] + ["auto"]
    rows = []
    for threads in THREADS:
        with threadpool_limits(limits=threads):
            _set_threads(threads)
            rows += _run(avail, threads)
    _report(avail, rows)


def _run(avail: list[str], threads: int) -> list[dict]:
    rows = []
    for name in _selected():
        fam = rm.family_of(name)
        cfg = rm.entry(name).config
        if ARGS.quick:
            cfg = fam.reduced(cfg)
        hw = tuple(getattr(cfg, "img_size", config.NET_PAPER_RESOLUTION))
        if ARGS.quick and not hasattr(cfg, "img_size"):
            hw = tuple(fam.test_image_hw(cfg))
        params = fam.init_params(cfg, np.random.default_rng(0))
        images = np.random.default_rng(1).standard_normal((1, cfg.in_chans, *hw))
        twin = em.build(cfg).double()
        load_numpy_state(twin, params)
        x_t = torch.from_numpy(images)
        row = {"model": name, "threads": threads, "params": rm.param_count(cfg), "img_hw": list(hw)}
        try:
            row["gmacs"] = counting.total(fam.macs(cfg, hw)) / 1e9
        except (TypeError, ValueError):
            row["gmacs"] = None
        with torch.no_grad():
            row["torch_times"] = wall_times(lambda: twin(x_t), ARGS.repeats)
            row["torch_s"] = min(row["torch_times"])
            ref_t = twin(x_t).numpy()
        for b in avail:
            with backends.use(b):
                row[f"refimpl_{b}_times"] = wall_times(lambda: fam.forward(params, images, cfg), ARGS.repeats)
                out = fam.forward(params, images, cfg)
            row[f"refimpl_{b}_s"] = min(row[f"refimpl_{b}_times"])
            row[f"ratio_{b}"] = row[f"refimpl_{b}_s"] / row["torch_s"]
            row[f"max_abs_diff_{b}"] = float(np.max(np.abs(out - ref_t)))
        best = min((b for b in avail if b != "auto"), key=lambda b: row[f"refimpl_{b}_s"])
        row["best_backend"], row["auto_over_best"] = best, row["refimpl_auto_s"] / row[f"refimpl_{best}_s"]
        rows.append(row)
        cells = "  ".join(f"{b} {row[f'refimpl_{b}_s']:7.2f}s ({row[f'ratio_{b}']:.2f}x)" for b in avail)
        print(f"{name:18s} {threads}t {row['params'] / 1e6:7.2f}M {row['gmacs'] or float('nan'):6.2f} GMACs  "
              f"torch {row['torch_s']:7.2f}s  {cells}", flush=True)
    return rows


def _report(avail: list[str], rows: list[dict]) -> None:
    meta = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "threads": THREADS, "repeats": ARGS.repeats, "quick": ARGS.quick, "dtype": "float64",
            "batch": 1, "backends": {b: str(st.reason) for b, st in backends.available().items()},
            "threadpools": [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
                            for p in threadpool_info()],
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    heads = " | ".join(f"refimpl {b} (s, ratio)" for b in avail)
    print(f"\n| model | threads | params | GMACs | PyTorch CPU (s) | {heads} | auto / best |")
    print("|---|---|---|---|---|" + "---|" * len(avail) + "---|")
    for r in rows:
        cells = " | ".join(f"{r[f'refimpl_{b}_s']:.2f} ({r[f'ratio_{b}']:.2f}x)" for b in avail)
        print(f"| {r['model']} | {r['threads']} | {r['params'] / 1e6:.2f}M | {r['gmacs'] or float('nan'):.2f} | "
              f"{r['torch_s']:.2f} | {cells} | {r['auto_over_best']:.2f} ({r['best_backend']}) |")
    os.makedirs(os.path.dirname(ARGS.out), exist_ok=True)
    with open(ARGS.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    print(f"\nwrote {ARGS.out}")


if __name__ == "__main__":
    main()
