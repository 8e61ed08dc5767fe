"""Where a network's forward spends the time that PyTorch does not.

For each chosen network (float64, 224 x 224 or the config's img_size, batch 1, random parameters loaded into
both sides, one process, BLAS/OpenMP pools limited by threadpoolctl, torch and Numba set to the same count, and
``config.C_KERNEL_THREADS_MAX`` too: the C kernels and LiSA's fused Numba core size their own threads from it and
from the CPU count, which threadpoolctl does not reach):

(a) units: the reference run unit by unit (``unit_names(cfg)``, ``run_unit(params, name, x, cfg)``) next to the
    twin's ``run_unit(name, x)`` fed the same input (the reference's input of that unit), timed interleaved
    (repeat r runs the reference unit, then the twin unit), best of ``--repeats``; the ratio per unit and
    the same aggregated by unit group (blocks of one stage together);
(b) profiles: cProfile of ``--runs`` reference forwards, aggregated by function (top 15 by own time, with the
    share of the profiled total); torch.profiler of as many twin forwards, by op (top 15 by self CPU time);
(c) categories: each side's time split into matmul/BLAS, elementwise (GELU, norms, softmax, reductions),
    layout copies (reshape/transpose copies, window partition/reverse, pad, concatenate), convolution, FFT,
    attention core, network glue (the models' own lines: residual adds, layer scales), Python overhead
    (validation, parameter checks, dispatch; on the torch side the time outside any op), other.  Each
    category's share of the profiled total times the *unprofiled* forward time gives milliseconds; the
    difference refimpl - torch per category is where the gap is.

How the categories are assigned.  Reference: a function's own time (cProfile ``tottime``: its Python lines
and the NumPy operators and ufuncs it evaluates inline, which cProfile does not see as calls) goes to the
category of the first rule of ``REF_RULES`` its ``path:function`` matches; NumPy/SciPy helpers that match no
rule (einsum, reductions, np.pad's internals ...) are split among their callers in proportion to the time
each caller spent in them, recursively, so an einsum inside ``layers.conv2d`` counts as convolution and one
inside an attention function as attention.  Torch: an op's self CPU time goes to its name's category when
that is a layout op or an FFT, else to the innermost marked module around it (nn.Linear: matmul; Conv:
convolution; norms and activations: elementwise; classes named ``*Attention*``: attention core; marked
with ``record_function`` from forward hooks, only while profiling), else to its name's category.

Caveats: cProfile charges its own per-call cost to the callers (the Python overhead share of the reference
is an upper estimate: compare its profiled total with the unprofiled time printed beside it); the torch
profiler adds a few microseconds per op.  The machine is shared: prefer the shares and the ratios of one run.

Run:  python benchmarks/profile_networks.py                                  (default networks, auto, 1 thread)
      python benchmarks/profile_networks.py --models ravlt_t,flatten_swin_t --backend numpy,auto --threads 1
Writes benchmarks/results/profile_networks.json (``--out``).  Never run as a test.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from typing import Any, Callable, Iterable

DEFAULT_MODELS = "ravlt_t,lisanet_h_t,flatten_swin_t,castling_deit_t,flatten_deit_t,l2vit_tiny"

CATEGORIES = ("matmul/BLAS", "elementwise", "layout copies", "convolution", "FFT", "attention core",
              "network glue", "Python overhead", "other")

#: Reference side: (regex on "path:function" or on cProfile's "{built-in ...}" / "{method ...}" name, category);
#: the first match wins.  Paths are relative to the repository or to site-packages.
REF_RULES: tuple[tuple[str, str], ...] = (
    # compiled kernels and their Python wrappers (a Numba dispatcher call is not a call cProfile sees: the
    # kernel's time is the wrapper's own time)
    (r"dwconv|backends/_(numba|c)(_depthwise)?\.py:(depthwise_conv2d|_call|_dwconv2d_compiled|_dwconv2d_kernel)$", "convolution"),
    (r"numpy/fft/|scipy/fft/|pocketfft|backends/_numba(_lisa)?\.py:c2c$", "FFT"),
    (r"refimpl\._native|_kernels\.|backends/_numba(_lisa)?\.py:(_\w+_kernel|lisa_\w+|angular_series_features|focused_function|head|"
     r"spectra|forward|product_inverse|drain|_run_shared)$", "attention core"),
    # layout: copies between layouts
    (r"[{<]method '(copy|reshape|astype|flatten|ravel|swapaxes)' of 'numpy\.ndarray' objects[}>]|ascontiguousarray|"
     r"[{<]built-in method numpy\.(_core\.)?(_multiarray_umath\.)?(concatenate|copyto|stack)[}>]|_arraypad_impl\.py|"
     r"numpy/_core/shape_base\.py|numpy/_core/numeric\.py:roll$|"
     r"layers\.py:(window_partition|window_reverse|pad_to_multiple)$|"
     r"_netparts\.py:(tokens_to_grid|grid_to_tokens|pad_bottom_right)$|"
     r"backends/_validate\.py:_contiguous$|models/\w+\.py:(_to_layout|_to_cf|_tokens|_grid|_roll|_layout_tok)$|attention/rala(_core)?\.py:_grid_to_tokens$",
     "layout copies"),
    # matmul: the projections and MLPs
    (r"layers\.py:linear$|common\.py:linear2d$|[{<]built-in method numpy\.(_core\.)?(_multiarray_umath\.)?"
     r"(dot|matmul|vdot|inner)[}>]|numeric\.py:tensordot$", "matmul/BLAS"),
    (r"layers\.py:(conv2d|_depthwise_conv2d_numpy|depthwise_conv2d|cpe|_windows)$|common\.py:patch_embed$|"
     r"sliding_window_view", "convolution"),
    (r"numerics\.py:(gelu|softmax|softmax_shifted|relu|elu|leaky_relu|softplus|l2_normalize|pow2_exponent)$|"
     r"layers\.py:(layer_norm|layer_norm_cf|batch_norm2d)$|_netparts\.py:swish$|models/\w+\.py:(_bn|swish|gelu)$|"
     r"scipy/special", "elementwise"),
    # Python overhead: validation, parameter checks, dispatch, small Python helpers
    (r"refimpl/validation\.py|numerics\.py:(as_float|check_shapes|check_positive_int|working_dtype)$|"
     r"layers\.py:(subparams|_param|check_vector|_check_\w+|_pair|_validate\w*|conv_padding|_output_size|_rows|"
     r"_mlp_params|_ln_input|<dictcomp>|<listcomp>)$|check_network_params|check_images|_check_params|_check_cfg|"
     r"refimpl/backends/|refimpl/config\.py|refimpl/errors\.py|[{<]built-in method builtins\.|"
     r"[{<]method '(get|items|keys|values|startswith|endswith|split|rsplit|join|format|append|update|"
     r"disable)' of|fromnumeric\.py:(shape|ndim|_shape_dispatcher|_ndim_dispatcher)$|<genexpr>$|<listcomp>$|"
     r"<dictcomp>$|dataclasses\.py|functools\.py|contextlib\.py|typing\.py|abc\.py|enum\.py|"
     r"[{<]built-in method _abc|[{<]built-in method _operator|[{<]method '__exit__'|[{<]method '__enter__'|"
     r"numpy/_core/_ufunc_config\.py|errstate|[{<]method '\w+' of '(str|dict|list|tuple|set)' objects[}>]|"
     r"<frozen |<string>:|_contextvars|_cffi_backend|numerics\.py:_check_\w+$", "Python overhead"),
    (r"refimpl/attention/|refimpl/feature_maps\.py|refimpl/toeplitz\.py", "attention core"),
    (r"refimpl/models/", "network glue"),
)

#: NumPy/SciPy helpers whose own time is the caller's operation (split among callers, see the docstring).
REF_INHERIT = r"numpy/|scipy/|[{<]built-in method numpy|[{<]method '\w+' of 'numpy|[{<]built-in method scipy|" \
              r"[{<]method 'reduce' of|[{<]method '\w+' of 'numpy\.ufunc'"

#: Torch side, by op name (see the docstring for the order with the module markers).
TORCH_NAME_FIRST: tuple[tuple[str, str], ...] = (
    (r"fft", "FFT"),
    (r"^aten::(copy_|contiguous|clone|cat|stack|constant_pad_nd|pad|reflection_pad\w*|replication_pad\w*|roll|"
     r"_unsafe_view|reshape|view|permute|transpose|t|expand|expand_as|flatten|unflatten|as_strided|select|slice|"
     r"narrow|split|split_with_sizes|chunk|unbind|unsqueeze|squeeze|empty|empty_like|empty_strided|zeros|"
     r"zeros_like|new_zeros|new_empty|fill_|zero_|index|index_select|gather|repeat|unfold|im2col|col2im|"
     r"resolve_conj|resolve_neg|detach|alias|lift_fresh|_reshape_alias|view_as_real|view_as_complex|to|"
     r"_to_copy|movedim|moveaxis|swapaxes|contiguous_|tile|broadcast_to)$", "layout copies"),
)
TORCH_NAME_LAST: tuple[tuple[str, str], ...] = (
    (r"^aten::(mm|bmm|addmm|addmv|mv|matmul|linear|baddbmm|addbmm|dot|einsum|tensordot|_addmm_activation)$",
     "matmul/BLAS"),
    (r"conv", "convolution"),
    (r"^aten::(add|sub|mul|div|exp|log|erf|gelu|silu|relu|elu|sigmoid|tanh|_?softmax|_?log_softmax|\w*layer_norm|"
     r"\w*batch_norm\w*|\w*group_norm|mean|sum|max|min|amax|amin|\w*norm|sqrt|rsqrt|pow|abs|clamp\w*|where|neg|"
     r"reciprocal|maximum|minimum|square|sign|expm1|log1p|softplus|hardswish|cumsum|var|std|var_mean|eq|gt|lt|ge|"
     r"le|ne|masked_fill\w*|addcmul|addcdiv|lerp|\w*pool\w*|arcsin|asin|acos|atan|cos|sin|floor|round|mish|"
     r"elu_|relu_|add_|mul_|div_|sub_|exp_|erfc|sgn|all|any|isfinite|isnan|sort|topk|nan_to_num)_?$",
     "elementwise"),
)


def _match(rules: Iterable[tuple[str, str]], key: str) -> str | None:
    for pattern, cat in rules:
        if re.search(pattern, key):
            return cat
    return None


def ref_key(func: tuple[str, int, str]) -> str:
    """cProfile's (filename, line, function) as "path:function", the path relative to the repository or to
    site-packages; built-ins keep cProfile's name ("{built-in method ...}", "{method ... objects}")."""
    filename, _, name = func
    if filename == "~" or not filename:
        return name
    path = filename.replace(os.sep, "/")
    for marker in ("/site-packages/", "/refimpl/", "/equivalence/", "/benchmarks/"):
        i = path.rfind(marker)
        if i >= 0:
            path = path[i + (len("/site-packages/") if marker == "/site-packages/" else 1):]
            break
    return f"{path}:{name}"


def classify_ref(key: str) -> str | None:
    """The category of a reference function's own time, or None when it inherits its callers' (a NumPy or
    SciPy helper that no rule names); "other" for anything else."""
    cat = _match(REF_RULES, key)
    if cat is not None:
        return cat
    return None if re.search(REF_INHERIT, key) else "other"


def classify_torch(op: str, module_category: str | None) -> str:
    """The category of a torch op's self time, given the category of the innermost marked module around it."""
    return _match(TORCH_NAME_FIRST, op) or module_category or _match(TORCH_NAME_LAST, op) or "other"


def ref_categories(stats: dict, detail: dict | None = None) -> dict[str, float]:
    """Seconds per category from pstats' ``stats`` dict {func: (cc, nc, tt, ct, callers)}, callers
    {caller: (cc, nc, tt, ct)}: own time by rule, helpers' own time split among their callers by the time each
    caller spent in them (recursively; a cycle or a root helper goes to "other").  ``detail``, when given, receives
    {category: {function that received the time: seconds}}."""
    out: dict[str, float] = defaultdict(float)

    def spread(func: Any, seconds: float, seen: frozenset) -> None:
        cat = classify_ref(ref_key(func))
        if cat is not None:
            out[cat] += seconds
            if detail is not None:
                d = detail.setdefault(cat, {})
                d[ref_key(func)] = d.get(ref_key(func), 0.0) + seconds
            return
        callers = stats.get(func, (0, 0, 0.0, 0.0, {}))[4]
        weights = {c: v[2] + v[3] * 1e-9 for c, v in callers.items() if c not in seen}   # tt, ct as tie-break
        total = sum(weights.values())
        if func in seen or total <= 0:
            out["other"] += seconds
            return
        for c, w in weights.items():
            spread(c, seconds * w / total, seen | {func})

    for func, (_, _, tt, _, _) in stats.items():
        if tt > 0:
            spread(func, tt, frozenset())
    return dict(out)


def unit_group(name: str) -> str:
    """Units of one stage together: "layers.1.blocks.3" -> "layers.1.blocks.*", "blocks.7" -> "blocks.*"."""
    return re.sub(r"(^|\.)(blocks|block)\.\d+$", r"\1\2.*", name)


# ===================================================================================================
# Measurement (heavy imports inside: the functions above are imported by the tests without torch)
# ===================================================================================================

def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated registered names (default "
                                                              f"{DEFAULT_MODELS})")
    ap.add_argument("--backend", default="auto", help="numpy, numba, c or auto; comma-separated for several")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5, help="unit timings: best of this many interleaved repeats")
    ap.add_argument("--runs", type=int, default=3, help="forwards under each profiler")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "profile_networks.json"))
    return ap.parse_args(argv)


class _Markers:
    """record_function ranges around the twin's modules that decide a category (only while profiling)."""

    def __init__(self, model: Any) -> None:
        import torch.nn as nn
        self.handles, self.stack = [], []
        for mod in model.modules():
            name = type(mod).__name__
            if isinstance(mod, nn.Linear):
                cat = "matmul/BLAS"
            elif isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                cat = "convolution"
            elif re.search(r"Norm|GELU|ReLU|SiLU|Hardswish|Sigmoid|Softmax|Tanh|ELU|Swish", name):
                cat = "elementwise"
            elif re.search(r"Attention|Attn", name):
                cat = "attention core"
            else:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._enter(cat)))
            self.handles.append(mod.register_forward_hook(self._exit))

    def _enter(self, cat: str) -> Callable[..., None]:
        import torch

        def hook(_mod: Any, _inp: Any) -> None:
            rf = torch.profiler.record_function(f"@{cat}")
            rf.__enter__()
            self.stack.append(rf)
        return hook

    def _exit(self, _mod: Any, _inp: Any, _out: Any) -> None:
        self.stack.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _torch_profile(twin: Any, x_t: Any, runs: int, top: int) -> dict:
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile
    markers = _Markers(twin)
    try:
        with torch.no_grad():
            twin(x_t)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                for _ in range(runs):
                    twin(x_t)
                wall = time.perf_counter() - t0
    finally:
        markers.remove()
    cats: dict[str, float] = defaultdict(float)
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    marker_s = 0.0
    for ev in prof.events():
        self_s = ev.self_cpu_time_total * 1e-6
        if ev.name.startswith("@"):
            marker_s += self_s
            continue
        parent, mcat = ev.cpu_parent, None
        while parent is not None:
            if parent.name.startswith("@"):
                mcat = parent.name[1:]
                break
            parent = parent.cpu_parent
        cats[classify_torch(ev.name, mcat)] += self_s
        by_op[ev.name][0] += self_s
        by_op[ev.name][1] += 1
    ops_s = sum(cats.values())
    cats["Python overhead"] += max(0.0, wall - ops_s - marker_s)
    total = sum(cats.values())
    top_ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return {"profiled_wall_s": wall / runs, "ops_self_s": ops_s / runs, "marker_s": marker_s / runs,
            "shares": {c: cats.get(c, 0.0) / total for c in CATEGORIES},
            "top": [{"op": k, "self_s": v[0] / runs, "calls": v[1] // runs, "share": v[0] / total,
                     "category": classify_torch(k, None)} for k, v in top_ops]}


def _ref_profile(forward: Callable[[], Any], runs: int, top: int) -> dict:
    import cProfile
    import pstats
    forward()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(runs):
        forward()
    pr.disable()
    st = pstats.Stats(pr)
    stats = st.stats   # type: ignore[attr-defined]
    total = st.total_tt   # type: ignore[attr-defined]
    detail: dict[str, dict[str, float]] = {}
    cats = ref_categories(stats, detail)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    other = sorted(((ref_key(f), v[2]) for f, v in stats.items() if classify_ref(ref_key(f)) == "other"),
                   key=lambda kv: -kv[1])[:8]
    return {"profiled_total_s": total / runs, "calls": st.total_calls // runs,   # type: ignore[attr-defined]
            "other_top": [{"function": k, "tottime_s": t / runs} for k, t in other],
            "category_top": {c: [{"function": k, "s": t / runs, "share": t / total}
                                 for k, t in sorted(detail.get(c, {}).items(), key=lambda kv: -kv[1])[:6]]
                             for c in CATEGORIES},
            "shares": {c: cats.get(c, 0.0) / total for c in CATEGORIES},
            "top": [{"function": ref_key(f), "tottime_s": v[2] / runs, "cumtime_s": v[3] / runs,
                     "calls": v[1] // runs, "share": v[2] / total,
                     "category": classify_ref(ref_key(f)) or "(callers')"} for f, v in rows]}


def _profile_model(name: str, backend: str, args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    import refimpl.twins.models as em
    import refimpl.models as rm
    from benchmarks.common import wall_times
    from equivalence.assertions import load_numpy_state
    from refimpl import backends, config

    fam = rm.family_of(name)
    cfg = rm.entry(name).config
    hw = tuple(getattr(cfg, "img_size", config.NET_PAPER_RESOLUTION))
    params = fam.init_params(cfg, np.random.default_rng(0))
    images = np.random.default_rng(1).standard_normal((1, cfg.in_chans, *hw))
    twin = em.build(cfg).double().eval()
    load_numpy_state(twin, params)
    x_t = torch.from_numpy(images)
    units = list(fam.unit_names(cfg))
    row: dict[str, Any] = {"model": name, "backend": backend, "threads": args.threads, "img_hw": list(hw),
                           "units": []}
    with backends.use(backend), torch.no_grad():
        # whole forwards, interleaved
        fwd_ref = lambda: fam.forward(params, images, cfg)   # noqa: E731
        fwd_t = lambda: twin(x_t)                               # noqa: E731
        fwd_ref(), fwd_t()
        ref_ts, t_ts = [], []
        for _ in range(args.repeats):
            ref_ts += wall_times(fwd_ref, 1)
            t_ts += wall_times(fwd_t, 1)
        row["refimpl_times"], row["torch_times"] = ref_ts, t_ts
        row["refimpl_s"], row["torch_s"] = min(ref_ts), min(t_ts)
        # (a) units, each side fed the reference's input of the unit
        x = images
        inputs = []
        for u in units:
            inputs.append(x)
            x = fam.run_unit(params, u, x, cfg)
        out_ref = x
        row["max_abs_diff"] = float(np.max(np.abs(out_ref - twin(x_t).numpy())))
        for u, xin in zip(units, inputs):
            xin_t = torch.from_numpy(np.ascontiguousarray(xin))
            r_ts, u_ts = [], []
            fam.run_unit(params, u, xin, cfg), twin.run_unit(u, xin_t)
            for _ in range(args.repeats):
                r_ts += wall_times(lambda: fam.run_unit(params, u, xin, cfg), 1)
                u_ts += wall_times(lambda: twin.run_unit(u, xin_t), 1)
            row["units"].append({"unit": u, "group": unit_group(u), "refimpl_s": min(r_ts), "torch_s": min(u_ts),
                                 "refimpl_times": r_ts, "torch_times": u_ts})
        # (b), (c) profiles
        row["cprofile"] = _ref_profile(fwd_ref, args.runs, args.top)
        row["torch_profile"] = _torch_profile(twin, x_t, args.runs, args.top)
    row["categories"] = {c: {"refimpl_ms": 1e3 * row["cprofile"]["shares"][c] * row["refimpl_s"],
                             "torch_ms": 1e3 * row["torch_profile"]["shares"][c] * row["torch_s"]}
                         for c in CATEGORIES}
    for c in CATEGORIES:
        d = row["categories"][c]
        d["gap_ms"] = d["refimpl_ms"] - d["torch_ms"]
    return row


def _groups(units: list[dict]) -> list[dict]:
    out: dict[str, dict] = {}
    for u in units:
        g = out.setdefault(u["group"], {"group": u["group"], "n": 0, "refimpl_s": 0.0, "torch_s": 0.0})
        g["n"] += 1
        g["refimpl_s"] += u["refimpl_s"]
        g["torch_s"] += u["torch_s"]
    return list(out.values())


def _print(row: dict, console: Any) -> None:
    from rich.table import Table
    head = (f"{row['model']} [{row['backend']}, {row['threads']} thread(s)]: forward refimpl "
            f"{1e3 * row['refimpl_s']:.1f} ms, torch {1e3 * row['torch_s']:.1f} ms "
            f"({row['refimpl_s'] / row['torch_s']:.2f}x), max |diff| {row['max_abs_diff']:.1e}")
    t = Table(title=head + " - units (a)")
    for col in ("unit group", "units", "refimpl (ms)", "torch (ms)", "ratio", "refimpl - torch (ms)"):
        t.add_column(col, justify="right" if col != "unit group" else "left")
    sr = st = 0.0
    for g in _groups(row["units"]):
        sr, st = sr + g["refimpl_s"], st + g["torch_s"]
        t.add_row(g["group"], str(g["n"]), f"{1e3 * g['refimpl_s']:.2f}", f"{1e3 * g['torch_s']:.2f}",
                  f"{g['refimpl_s'] / g['torch_s']:.2f}", f"{1e3 * (g['refimpl_s'] - g['torch_s']):+.2f}")
    t.add_row("sum of units", str(len(row["units"])), f"{1e3 * sr:.2f}", f"{1e3 * st:.2f}", f"{sr / st:.2f}",
              f"{1e3 * (sr - st):+.2f}", style="bold")
    console.print(t)
    cp = row["cprofile"]
    t = Table(title=f"{row['model']}: cProfile of the reference, top by own time (b); profiled "
                    f"{1e3 * cp['profiled_total_s']:.1f} ms per forward against {1e3 * row['refimpl_s']:.1f} "
                    f"unprofiled")
    for col in ("function", "calls", "own (ms)", "share", "cum (ms)", "category"):
        t.add_column(col)
    for r in cp["top"]:
        t.add_row(r["function"][-70:], str(r["calls"]), f"{1e3 * r['tottime_s']:.2f}", f"{r['share']:.1%}",
                  f"{1e3 * r['cumtime_s']:.2f}", r["category"])
    console.print(t)
    tp = row["torch_profile"]
    t = Table(title=f"{row['model']}: torch.profiler of the twin, top ops by self CPU time (b); profiled "
                    f"{1e3 * tp['profiled_wall_s']:.1f} ms per forward")
    for col in ("op", "calls", "self (ms)", "share"):
        t.add_column(col)
    for r in tp["top"]:
        t.add_row(r["op"], str(r["calls"]), f"{1e3 * r['self_s']:.2f}", f"{r['share']:.1%}")
    console.print(t)
    t = Table(title=f"{row['model']}: time by category (c), share x unprofiled forward time")
    for col in ("category", "refimpl (ms)", "share", "torch (ms)", "share", "refimpl - torch (ms)"):
        t.add_column(col, justify="right" if col != "category" else "left")
    for c in CATEGORIES:
        d = row["categories"][c]
        t.add_row(c, f"{d['refimpl_ms']:.1f}", f"{cp['shares'][c]:.1%}", f"{d['torch_ms']:.1f}",
                  f"{tp['shares'][c]:.1%}", f"{d['gap_ms']:+.1f}")
    console.print(t)


def markdown(rows: list[dict]) -> str:
    """The tables of docs/benchmarks.md, from a run's rows."""
    lines = []
    lines.append("| network [backend] | refimpl (ms) | torch (ms) | ratio | " + " | ".join(CATEGORIES) + " |")
    lines.append("|---|---|---|---|" + "---|" * len(CATEGORIES))
    for r in rows:
        cells = " | ".join(f"{r['categories'][c]['refimpl_ms']:.0f} / {r['categories'][c]['torch_ms']:.0f}"
                           for c in CATEGORIES)
        lines.append(f"| {r['model']} [{r['backend']}] | {1e3 * r['refimpl_s']:.0f} | {1e3 * r['torch_s']:.0f} | "
                     f"{r['refimpl_s'] / r['torch_s']:.2f} | {cells} |")
    for r in rows:
        lines.append("")
        lines.append(f"{r['model']} [{r['backend']}], units:")
        lines.append("")
        lines.append("| unit group | units | refimpl (ms) | torch (ms) | ratio | refimpl - torch (ms) |")
        lines.append("|---|---|---|---|---|---|")
        for g in _groups(r["units"]):
            lines.append(f"| {g['group']} | {g['n']} | {1e3 * g['refimpl_s']:.1f} | {1e3 * g['torch_s']:.1f} | "
                         f"{g['refimpl_s'] / g['torch_s']:.2f} | {1e3 * (g['refimpl_s'] - g['torch_s']):+.1f} |")
        lines.append("")
        lines.append(f"{r['model']} [{r['backend']}], cProfile top 8 by own time (share of the profiled total):")
        lines.append("")
        lines.append("| function | calls | own (ms) | share | category |")
        lines.append("|---|---|---|---|---|")
        for t in r["cprofile"]["top"][:8]:
            lines.append(f"| `{t['function']}` | {t['calls']} | {1e3 * t['tottime_s']:.1f} | {t['share']:.1%} | "
                         f"{t['category']} |")
        lines.append("")
        lines.append(f"{r['model']}, torch.profiler top 6 ops by self CPU time:")
        lines.append("")
        lines.append("| op | calls | self (ms) | share |")
        lines.append("|---|---|---|---|")
        for t in r["torch_profile"]["top"][:6]:
            lines.append(f"| `{t['op']}` | {t['calls']} | {1e3 * t['self_s']:.1f} | {t['share']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import json
    import platform

    args = _parse(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import numpy as np
    import torch
    from rich.console import Console
    from threadpoolctl import threadpool_info, threadpool_limits

    import refimpl.models as rm
    from refimpl import backends, config

    console = Console(width=160)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in rm.names()]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; registered: {rm.names()}")
    rows = []
    # The C kernels and LiSA's fused Numba core size their own threads (backends._c.default_threads: the CPUs
    # this process may use, capped at config.C_KERNEL_THREADS_MAX); threadpoolctl does not reach them.
    kernel_threads_max = config.C_KERNEL_THREADS_MAX
    config.C_KERNEL_THREADS_MAX = args.threads
    with threadpool_limits(limits=args.threads):
        torch.set_num_threads(args.threads)
        try:
            import numba
            numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        except ImportError:
            pass
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        for name in names:
            for backend in [b.strip() for b in args.backend.split(",") if b.strip()]:
                row = _profile_model(name, backend, args)
                _print(row, console)
                rows.append(row)
        meta = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                "machine": platform.machine(), "cpus": os.cpu_count(), "threads": args.threads,
                "repeats": args.repeats, "runs": args.runs, "dtype": "float64", "batch": 1,
                "backends": {b: str(st.reason) for b, st in backends.available().items()},
                "threadpools": [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
                                for p in threadpool_info()],
                "load_average_start": load,
                "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
                "c_kernel_threads_max": config.C_KERNEL_THREADS_MAX,
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
    config.C_KERNEL_THREADS_MAX = kernel_threads_max
    print(markdown(rows))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
