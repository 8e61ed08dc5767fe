"""LiSA scaling and circular-vs-Toeplitz error, measured on the NumPy reference.

1. Scaling: time and peak memory (tracemalloc, which sees NumPy's buffers) of the LiSA operator
   (refimpl.attention.lisa.lisa_attention: FFT path, Eq. 9-10; circular and exact_toeplitz) against the
   direct structure-aware attention (structure_aware_attention, SA Eq. 7 with dense Toeplitz RPEs) as the
   token grid grows over 7^2, 14^2, 28^2, 56^2, 112^2.  The direct path is skipped past its memory guard
   (config.QUADRATIC_MAX_ELEMENTS).  Fitted exponents: least squares slope of log(time) and log(peak
   memory) against log N over the measured sizes >= 28^2 (smaller sizes are dominated by fixed costs).
2. Wrap-around: the relative difference between LiSA (circular, Eq. 10) and SA Eq. 7 with the Toeplitz
   RPEs whose circulant counterparts LiSA uses (refimpl.toeplitz.periodize), as a function of the kernel
   support radius, on the paper's 14 x 14 grid.

Run:  python benchmarks/lisa_scaling.py            (writes benchmarks/results/lisa_scaling.json)
      python benchmarks/lisa_scaling.py --quick    (smaller sizes, for a smoke run)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import tracemalloc

# Single-threaded BLAS / FFT: the measurement is of the algorithm, and a shared machine's thread contention
# would otherwise dominate small sizes.  Set before NumPy is imported; override from the environment.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refimpl import config, toeplitz as tz  # noqa: E402
from refimpl.attention import lisa  # noqa: E402

SIDES = (7, 14, 28, 56, 112)


def _measure(fn, repeats: int, min_total_s: float = 1.0) -> tuple[float, float]:
    """(best wall time in s over at least ``repeats`` runs - more until ``min_total_s`` has been spent,
    so that millisecond timings are not one noisy sample - and the peak traced memory in MiB of one
    extra run)."""
    best, spent, runs = math.inf, 0.0, 0
    while runs < repeats or spent < min_total_s:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, peak / 2**20


def _fit(ns, ys, n_min):
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y is not None and n >= n_min]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def scaling(sides, dim, heads, latent, batch, repeats, seed=0):
    rows = []
    for side in sides:
        grid = (side, side)
        n_tok = side * side
        x = np.random.default_rng(seed).standard_normal((batch, n_tok, dim))
        row = {"side": side, "N": n_tok}
        for name, cfg in (("fft_circular", lisa.LiSAConfig(dim=dim, num_heads=heads, grid=grid, latent=latent)),
                          ("fft_exact_toeplitz", lisa.LiSAConfig(dim=dim, num_heads=heads, grid=grid, latent=latent,
                                                                 exact_toeplitz=True))):
            p = lisa.init_params(lisa.lisa_param_shapes(cfg), seed)
            t, m = _measure(lambda: lisa.lisa_attention(x, p, cfg), repeats)
            row[name] = {"time_s": t, "peak_mib": m}
        sa = lisa.SAConfig(dim=dim, num_heads=heads, grid=grid, latent=latent, form="eq7", rpe="toeplitz")
        elems = lisa.sa_elements(batch, heads, n_tok, sa.head_dim, latent, "eq7")
        if elems > config.QUADRATIC_MAX_ELEMENTS:
            row["direct_eq7"] = {"skipped": f"{elems} elements > QUADRATIC_MAX_ELEMENTS = {config.QUADRATIC_MAX_ELEMENTS}"}
        else:
            p = lisa.init_params(lisa.sa_param_shapes(sa), seed)
            t, m = _measure(lambda: lisa.structure_aware_attention(x, p, sa), repeats)
            row["direct_eq7"] = {"time_s": t, "peak_mib": m}
        rows.append(row)
        print(f"  N = {n_tok:6d} done", flush=True)
    ns = [r["N"] for r in rows]
    fits = {}
    for path in ("fft_circular", "fft_exact_toeplitz", "direct_eq7"):
        for q in ("time_s", "peak_mib"):
            ys = [r[path].get(q) for r in rows]
            fits[f"{path}.{q}"] = _fit(ns, ys, 28 * 28)
    nlogn = [n * math.log2(n) for n in ns]
    fits["reference: d log(N log2 N) / d log N over the same sizes"] = _fit(ns, nlogn, 28 * 28)
    for path in ("fft_circular", "fft_exact_toeplitz", "direct_eq7"):
        ts = [r[path].get("time_s") for r in rows]
        fits[f"{path}.time_s pairwise"] = [
            None if a is None or b is None else round(math.log(b / a) / math.log(n2 / n1), 3)
            for n1, n2, a, b in zip(ns, ns[1:], ts, ts[1:])]
    fits["reference: N log2 N pairwise"] = [round(math.log(b / a) / math.log(n2 / n1), 3)
                                             for n1, n2, a, b in zip(ns, ns[1:], nlogn, nlogn[1:])]
    return rows, fits


def wraparound(side, heads, c, latent, batch, radii, seed=0):
    grid = (side, side)
    r = 2
    rng = np.random.default_rng(seed)
    n_tok = side * side
    q, k, v = (rng.standard_normal((batch, heads, n_tok, c)) for _ in range(3))
    kg = tuple(2 * n - 1 for n in grid)
    ea0 = rng.standard_normal(kg + (c, latent))
    eb0 = rng.standard_normal(kg + (latent,))
    ba, bb = rng.standard_normal((c, latent)), rng.standard_normal((c, latent))
    rows = []
    for rad in radii:
        ea = tz.restrict_support(ea0, r, rad)
        eb = tz.restrict_support(eb0, r, rad)
        wa, wb = tz.periodize(ea, r).reshape(-1, c, latent), tz.periodize(eb, r).reshape(-1, latent)
        tc, tt = {}, {}
        yc = lisa.lisa_core(q, k, v, wa, wb, ba, bb, grid, taps=tc)
        yt = lisa.lisa_core(q, k, v, ea.reshape(-1, c, latent), eb.reshape(-1, latent), ba, bb, grid,
                            exact_toeplitz=True, taps=tt)
        diff = yc - yt
        fits = np.zeros(grid, dtype=bool)
        fits[rad:side - rad, rad:side - rad] = True
        fits = fits.reshape(-1)
        rows.append({
            "radius": rad,
            "taps_per_kernel": int(np.count_nonzero(tz.restrict_support(np.ones(kg), r, rad))),
            "tokens_with_wrap_frac": float(1.0 - fits.mean()),
            "rel_err_out_fro": float(np.linalg.norm(diff) / np.linalg.norm(yt)),
            "rel_err_out_max": float(np.abs(diff).max() / np.abs(yt).max()),
            "rel_err_G_a_fro": float(np.linalg.norm(tc["G_a"] - tt["G_a"]) / np.linalg.norm(tt["G_a"])),
            "rel_err_G_b_fro": float(np.linalg.norm(tc["G_b"] - tt["G_b"]) / np.linalg.norm(tt["G_b"])),
            "max_abs_err_where_window_fits": float(np.abs(diff[:, :, fits]).max()) if fits.any() else None,
            "max_abs_out": float(np.abs(yt).max()),
        })
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sides 7, 14, 28 only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "lisa_scaling.json"))
    args = ap.parse_args(argv)
    sides = SIDES[:3] if args.quick else SIDES
    result = {"command": "python benchmarks/lisa_scaling.py" + (" --quick" if args.quick else ""),
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "numpy": np.__version__,
                          "threads": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}}
    setups = {"small (C=8, h=2, c=4, D=2, B=1)": dict(dim=8, heads=2, latent=2, batch=1),
              "paper head (C=192, h=12, c=16, D=16, B=1)": dict(dim=192, heads=12, latent=16, batch=1)}
    result["scaling"] = {}
    for label, s in setups.items():
        print(f"scaling, {label}")
        rows, fits = scaling(sides, s["dim"], s["heads"], s["latent"], s["batch"], repeats=3)
        result["scaling"][label] = {"rows": rows, "fitted_exponents": fits}
        print(f"{'N':>7} {'fft circ s':>11} {'fft exact s':>11} {'direct s':>10} | {'fft circ MiB':>12} "
              f"{'fft exact MiB':>13} {'direct MiB':>10}")
        for r in rows:
            d = r["direct_eq7"]
            print(f"{r['N']:7d} {r['fft_circular']['time_s']:11.4f} {r['fft_exact_toeplitz']['time_s']:11.4f} "
                  f"{d.get('time_s', float('nan')):10.4f} | {r['fft_circular']['peak_mib']:12.2f} "
                  f"{r['fft_exact_toeplitz']['peak_mib']:13.2f} {d.get('peak_mib', float('nan')):10.2f}"
                  + ("  (direct skipped: memory guard)" if "skipped" in d else ""))
        for k, v in fits.items():
            print(f"  slope {k}: {v if v is None or isinstance(v, list) else round(v, 3)}")
    print("wrap-around (14 x 14 grid, h=2, c=8, D=4, B=2)")
    radii = (0, 1, 2, 3, 4, 5, 6, 13)
    rows = wraparound(14, 2, 8, 4, 2, radii)
    result["wraparound_14x14"] = rows
    print(f"{'radius':>6} {'taps':>5} {'wrap tok':>8} {'rel|dY|_F':>10} {'rel|dY|max':>10} {'rel|dGa|_F':>10} "
          f"{'rel|dGb|_F':>10} {'max|dY| fit':>11}")
    for r in rows:
        fit = r["max_abs_err_where_window_fits"]
        print(f"{r['radius']:6d} {r['taps_per_kernel']:5d} {r['tokens_with_wrap_frac']:8.3f} {r['rel_err_out_fro']:10.3e} "
              f"{r['rel_err_out_max']:10.3e} {r['rel_err_G_a_fro']:10.3e} {r['rel_err_G_b_fro']:10.3e} "
              f"{'-' if fit is None else f'{fit:.1e}':>11}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
