"""The results of benchmarks/run.py: scaling fits, the "auto" backend table, the performance targets
(``TARGETS``), and the run printed as tables or written as the Markdown of docs/benchmarks.md.
"""

from __future__ import annotations

import math
import time


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
        print("targets of the attention kernels (docs/benchmarks.md):")
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


#: The attention kernels' targets that the tables decide (float64 unless stated): (label, workload-name prefix, dtype,
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
    the target's two workloads (not the "(scaling)" rows); the result lists each matching workload's value."""
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
        lines.append(f"Targets of the attention kernels, {t} thread(s), computed from the table above (benchmarks/run_report.py, "
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
