"""Forward time of the full-size networks: refimpl (each available backend) vs the PyTorch twin on CPU.

Each model at 224 x 224, batch 1, float64, random parameters (refimpl.models init) loaded into both sides;
refimpl timed once per available backend (refimpl.backends.use: "numpy" is the definition, "numba"/"c" swap
in the accelerated kernels where an operation has one), the twin with torch.no_grad() in eval mode, all in
the same process and run.  Reported: the best wall time of ``--repeats`` runs after one warm-up run
(Numba compiles on first use), and the ratio refimpl / PyTorch (the issue's goal for the accelerated
backends: <= 1).

Threads: BLAS/OpenMP and torch are pinned to ``--threads`` (default 1) before NumPy and torch load; on a
shared 2-core machine multi-threaded OpenBLAS spins under contention (measured 20x slower for the reduced
Swin test, models docs).

Run:  python benchmarks/models_forward.py                    (FLatten + Castling models; writes
                                                              benchmarks/results/models_forward.json)
      python benchmarks/models_forward.py --models all        (every registered model with a twin)
      python benchmarks/models_forward.py --quick             (reduced configs: a smoke run)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="flatten,castling",
                    help="comma-separated model names or family names, or 'all' (default: flatten,castling)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="reduced configs (family.reduced), for a smoke run")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "models_forward.json"))
    return ap.parse_args()


ARGS = _parse()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(ARGS.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import equivalence.models as em  # noqa: E402
import refimpl.models as rm  # noqa: E402
from equivalence.assertions import load_numpy_state  # noqa: E402
from refimpl import backends, config  # noqa: E402
from refimpl.models import counting  # noqa: E402

torch.set_num_threads(ARGS.threads)


def _best(fn, repeats: int) -> float:
    fn()  # warm-up (Numba compilation, allocator, caches)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _selected() -> list[str]:
    names = em.names()
    if ARGS.models == "all":
        return names
    want = [w.strip() for w in ARGS.models.split(",") if w.strip()]
    return [n for n in names if n in want or rm.family_of(n).__name__.rsplit(".", 1)[-1] in want]


def main() -> None:
    avail = [b for b, st in backends.available().items() if st]
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
        row = {"model": name, "params": rm.param_count(cfg), "img_hw": list(hw)}
        try:
            row["gmacs"] = counting.total(fam.macs(cfg, hw)) / 1e9
        except (TypeError, ValueError):
            row["gmacs"] = None
        with torch.no_grad():
            row["torch_s"] = _best(lambda: twin(x_t), ARGS.repeats)
            ref_t = twin(x_t).numpy()
        for b in avail:
            with backends.use(b):
                row[f"refimpl_{b}_s"] = _best(lambda: fam.forward(params, images, cfg), ARGS.repeats)
                out = fam.forward(params, images, cfg)
            row[f"ratio_{b}"] = row[f"refimpl_{b}_s"] / row["torch_s"]
            row[f"max_abs_diff_{b}"] = float(np.max(np.abs(out - ref_t)))
        rows.append(row)
        cells = "  ".join(f"{b} {row[f'refimpl_{b}_s']:7.2f}s ({row[f'ratio_{b}']:.2f}x)" for b in avail)
        print(f"{name:18s} {row['params'] / 1e6:7.2f}M {row['gmacs'] or float('nan'):6.2f} GMACs  "
              f"torch {row['torch_s']:7.2f}s  {cells}", flush=True)
    meta = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "threads": ARGS.threads, "repeats": ARGS.repeats, "quick": ARGS.quick, "dtype": "float64",
            "batch": 1, "backends": {b: str(st.reason) for b, st in backends.available().items()},
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    heads = " | ".join(f"refimpl {b} (s, ratio)" for b in avail)
    print(f"\n| model | params | GMACs | PyTorch CPU (s) | {heads} |")
    print("|---|---|---|---|" + "---|" * len(avail))
    for r in rows:
        cells = " | ".join(f"{r[f'refimpl_{b}_s']:.2f} ({r[f'ratio_{b}']:.2f}x)" for b in avail)
        print(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['gmacs'] or float('nan'):.2f} | {r['torch_s']:.2f} | "
              f"{cells} |")
    os.makedirs(os.path.dirname(ARGS.out), exist_ok=True)
    with open(ARGS.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    print(f"\nwrote {ARGS.out}")


if __name__ == "__main__":
    main()
