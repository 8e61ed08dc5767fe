"""Timing of the element-wise and row-wise operations (float64) on each backend against PyTorch CPU eager (not a
test): GELU (operation "gelu", exact erf form or tanh) and LayerNorm (operation "layer_norm").

    PYTHONPATH=. python benchmarks/elementwise.py [--op gelu|layer_norm] [--reps 21] [--approximate none|tanh]
                                                  [--out benchmarks/results/<op>.json]

GELU.  For each workload (the MLP hidden activations of a 56x56 / 28x28 / 14x14 stage: (1, 3136, 256), (1, 784, 512),
(1, 196, 768)) and each thread count (1, 2), on the same float64 input:

- "numpy": refimpl.numerics.gelu, the definition (scipy.special.erf; single-threaded whatever the count);
- "c" / "numba": refimpl.layers.gelu under backends.use("c" / "numba") with config.C_KERNEL_THREADS_MAX set to
  the count: the dispatch path the networks take (as_float, the predicate, a fresh NaN-poisoned output);
- "c raw": the C wrapper writing into a reused 64-byte aligned out= with threads= the count;
- "c libm" / "numba libm" (exact form only): the plain versions kept beside the vectorised kernels
  (refimpl.backends._c_elementwise.gelu_libm / _numba_elementwise.gelu_libm: libm's scalar erf, the kernels
  as they were before the vectorisable erf of ckernels/erf_vec.h), with out= and threads= as "c raw";
- "torch": torch.nn.functional.gelu on a float64 CPU tensor (torch.set_num_threads(count)).

LayerNorm.  For each workload (the LayerNorms of the networks' stages: Swin-T's 56x56 stage (1, 3136, 96),
PVT's (1, 3136, 64), 28x28 and 14x14 stages (1, 784, 192), (1, 196, 384), DeiT-T's tokens (1, 197, 192), a 7x7
stage (1, 49, 768)), with weight and bias, eps 1e-5: "numpy" the definition (refimpl.layers._layer_norm_definition);
"c" refimpl.layers.layer_norm under backends.use("c") (its argument checks, the dispatch, the kernel); "c raw" the
C wrapper with threads= the count; "c plain" the plain C version (one thread, recursive sums, the range scan
first); "torch" torch.nn.functional.layer_norm.

The variants are interleaved (one call of each per round, ``--reps`` rounds after two warm-up rounds), so a
load change on a shared machine hits them alike; the table gives the median and the minimum per call.
OPENBLAS_THREAD_TIMEOUT=4 and OMP_WAIT_POLICY=PASSIVE are set before NumPy and torch are imported (idle
BLAS / OpenMP workers would otherwise spin on the core the second kernel thread needs; docs/backends.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from refimpl import backends, config, layers, numerics  # noqa: E402
from refimpl.backends import _c_elementwise, _numba_elementwise  # noqa: E402

SHAPES = {"gelu": ((1, 3136, 256), (1, 784, 512), (1, 196, 768)),
          "layer_norm": ((1, 3136, 96), (1, 3136, 64), (1, 784, 192), (1, 196, 384), (1, 197, 192), (1, 49, 768))}
THREADS = (1, 2)


def _layer_norm_variants(x: np.ndarray, threads: int) -> dict:
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal(x.shape[-1]), rng.standard_normal(x.shape[-1])
    definition = backends.definition("layer_norm")
    v = {"numpy": lambda: definition(x, w, b, 1e-5)}
    if backends.available()["c"].ok:
        def disp():
            with backends.use("c"):
                return layers.layer_norm(x, w, b, 1e-5)
        v["c"] = disp
        v["c raw"] = lambda: _c_elementwise.layer_norm(x, w, b, 1e-5, threads=threads)
        v["c plain"] = lambda: _c_elementwise.layer_norm_plain(x, w, b, 1e-5)
    try:
        import torch
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
        v["torch"] = lambda: torch.nn.functional.layer_norm(tx, (x.shape[-1],), tw, tb, 1e-5)
    except ImportError:
        pass
    return v


def _variants(x: np.ndarray, threads: int, approximate: str) -> dict:
    out = backends.empty_aligned(x.shape)
    v = {"numpy": lambda: numerics.gelu(x, approximate)}
    status = backends.available()
    for name in ("c", "numba"):
        if status[name].ok:
            def disp(name=name):
                with backends.use(name):
                    return layers.gelu(x, approximate)
            v[name] = disp
    if status["c"].ok:
        v["c raw"] = lambda: _c_elementwise.gelu(x, approximate, out=out, threads=threads)
        if approximate == "none":
            v["c libm"] = lambda: _c_elementwise.gelu_libm(x, out=out, threads=threads)
    if status["numba"].ok and approximate == "none":
        v["numba libm"] = lambda: _numba_elementwise.gelu_libm(x, out=out, threads=threads)
    try:
        import torch
        tx = torch.from_numpy(x)
        v["torch"] = lambda: torch.nn.functional.gelu(tx, approximate=approximate)
    except ImportError:
        pass
    return v


def run(reps: int, approximate: str, op: str = "gelu") -> dict:
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch, torch_version = None, None
    rng = np.random.default_rng(0)
    rows = []
    saved = config.C_KERNEL_THREADS_MAX
    try:
        for shape in SHAPES[op]:
            x = rng.standard_normal(shape)
            for threads in THREADS:
                config.C_KERNEL_THREADS_MAX = threads
                if torch is not None:
                    torch.set_num_threads(threads)
                variants = (_variants(x, threads, approximate) if op == "gelu" else
                            _layer_norm_variants(x, threads))
                times: dict[str, list[float]] = {k: [] for k in variants}
                for r in range(reps + 2):
                    for name, f in variants.items():
                        t0 = time.perf_counter()
                        f()
                        dt = time.perf_counter() - t0
                        if r >= 2:
                            times[name].append(dt)
                for name, ts in times.items():
                    rows.append({"shape": list(shape), "threads": threads, "impl": name,
                                 "median_ms": 1e3 * float(np.median(ts)), "min_ms": 1e3 * float(np.min(ts)),
                                 "ns_per_element_median": 1e9 * float(np.median(ts)) / x.size})
    finally:
        config.C_KERNEL_THREADS_MAX = saved
    return {"benchmark": op, "approximate": approximate if op == "gelu" else None, "dtype": "float64", "reps": reps,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "load_average_at_start": os.getloadavg()},
            "versions": {"numpy": np.__version__, "torch": torch_version},
            "backends": {k: s.reason for k, s in backends.available().items()},
            "rows": rows}


def table(res: dict) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in res["rows"]))
    lines = ["| shape | threads | " + " | ".join(f"{i} median (min) ms" for i in impls) + " | c / torch (median) |",
             "| --- | --- | " + " | ".join("---" for _ in impls) + " | --- |"]
    for shape in SHAPES[res["benchmark"]]:
        for threads in THREADS:
            sel = {r["impl"]: r for r in res["rows"] if tuple(r["shape"]) == shape and r["threads"] == threads}
            cells = [f"{sel[i]['median_ms']:.2f} ({sel[i]['min_ms']:.2f})" if i in sel else "-" for i in impls]
            ratio = (f"{sel['c']['median_ms'] / sel['torch']['median_ms']:.2f}" if "c" in sel and "torch" in sel
                     else "-")
            lines.append(f"| {shape} | {threads} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--op", choices=tuple(SHAPES), default="gelu")
    ap.add_argument("--approximate", choices=("none", "tanh"), default="none", help="GELU's form")
    ap.add_argument("--out", default=None, help="default benchmarks/results/<op>.json")
    args = ap.parse_args()
    args.out = args.out or str(Path(__file__).parent / "results" / f"{args.op}.json")
    res = run(args.reps, args.approximate, args.op)
    what = f"GELU ({args.approximate})" if args.op == "gelu" else "LayerNorm (weight, bias, eps 1e-5)"
    print(f"{what}, float64, load average at start {res['machine']['load_average_at_start']}")
    print(table(res))
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
