"""Verify a third-party PyTorch implementation against the reference: a verdict, the first stage where it
diverges, and why.

Layer: the verify tool, on top of the verdict (:mod:`refimpl.verdict`), the references
(:mod:`refimpl.attention`) and torch (imported here; ``import refimpl`` never imports this package).  The
command line (:mod:`refimpl.cli`, ``refimpl verify``) is a thin layer over :func:`verify`.

What happens::

    module = your nn.Module (an instance, or a class / factory called with ``init``)
    weights: a file or dict loaded into it (strict), or every floating tensor redrawn from ``seed``
    module cast to ``dtype``; its parameters, read back, are the reference's parameters (mapping.py)
    configuration inferred from the module's attributes and weight shapes, the rest from ``preset``
    input drawn from ``seed`` (or given), rounded to ``dtype``; the reference is fed the same values
    forward hooks on the submodules the mapping pairs with the reference's record each stage's tensors
    whole module: refimpl.verdict.compare against the reference's bound in ``dtype``
    stage by stage (teacher-forced): each observed stage against the reference stage on the module's own
        inputs to it; a submodule fed something other than its predecessor's output is a wiring divergence

The verdict is "match", "diverges" or "inconclusive" (the bound cannot resolve the answer: the report says
what would).  Not yet built (issue 13): the references of LiSA, FLatten's Swin layout, RALA's token
layout and the networks; ``--shadow``, ``--grad``; configurations drawn by ``examples``; the torch ensemble
in the verifier (the NumPy naive run and the rounding model are its members today).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import numpy as np

from .. import verdict as _verdict
from ..numerics import naive_same_precision, round_to
from .loading import VerifyError, instantiate, load_target, load_weights
from .locate import locate
from .mapping import WeightMapping, map_weights
from .references import REFERENCES, get_reference

__all__ = ["verify", "verify_examples", "assert_matches", "Report", "StageResult", "VerifyError", "REFERENCES",
           "SCHEMA_VERSION",
           "load_target", "instantiate", "load_weights", "map_weights", "WeightMapping"]

#: Version of the JSON report's schema (docs/verify.md).
SCHEMA_VERSION = 1

_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclasses.dataclass
class StageResult:
    """One stage of the reference, as observed in the foreign module."""

    name: str
    foreign: str | None                  # "submodule:output" where it was observed, None if not observed
    verdict: str                         # match / diverges / inconclusive / not observed
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    bound: float | None = None           # the largest element-wise bound
    err_over_bound: float | None = None
    detail: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "foreign": self.foreign, "verdict": self.verdict, "ok": self.verdict == "match",
                "max_abs_err": _f(self.max_abs_err), "max_rel_err": _f(self.max_rel_err), "bound": _f(self.bound),
                "err_over_bound": _f(self.err_over_bound), "detail": self.detail}


@dataclasses.dataclass
class Report:
    """The verifier's report (:meth:`as_dict` is the JSON schema of docs/verify.md)."""

    verdict: str
    reference: str
    preset: str
    dtype: str
    config: dict[str, Any]
    config_sources: dict[str, str]
    mapping: dict[str, str]
    mapping_decisions: list[str]
    ignored_foreign_keys: list[str]
    derived_buffers: list[str]
    whole_module: dict[str, Any]
    stages: list[StageResult]
    first_divergence: dict[str, Any] | None
    findings: list[dict[str, str]]
    whole_module_text: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == _verdict.MATCH

    def as_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict, "reference": self.reference,
                "preset": self.preset, "dtype": self.dtype, "config": self.config,
                "config_sources": self.config_sources, "mapping": self.mapping,
                "mapping_decisions": self.mapping_decisions, "unused_foreign_keys": [],
                "ignored_foreign_keys": self.ignored_foreign_keys, "missing_reference_keys": [],
                "derived_buffers": self.derived_buffers, "whole_module": self.whole_module,
                "stages": [s.as_dict() for s in self.stages], "first_divergence": self.first_divergence,
                "findings": self.findings}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    def to_markdown(self, plot: str | None = None) -> str:
        """The report as Markdown (``--report OUT.md``); ``plot``: the file name of the per-stage error/bound
        plot (:meth:`save_plot`) to link, if one was written."""
        lines = [f"# refimpl verify: {self.verdict} against `{self.reference}`", "",
                 f"{self.preset} preset, {self.dtype}; whole module: {self.whole_module['verdict']} (max relative "
                 f"bound {self.whole_module['max_relative_bound']:.3g}, err/bound "
                 f"{self.whole_module['err_over_bound']:.3g}).", ""]
        if self.first_divergence:
            lines += [f"**First divergence: stage `{self.first_divergence['stage']}`**: "
                      f"{self.first_divergence['why']}", ""]
        lines += ["| stage | observed at | verdict | max abs err | bound | err / bound | detail |",
                  "|---|---|---|---|---|---|---|"]
        for st in self.stages:
            lines.append(f"| {st.name} | {st.foreign or '-'} | {st.verdict} | {_g(st.max_abs_err)} | "
                         f"{_g(st.bound)} | {_g(st.err_over_bound)} | {st.detail.replace('|', '/')} |")
        if plot:
            lines += ["", f"![error over bound per stage]({plot})"]
        lines += ["", "## Configuration", ""] + [f"- `{k}` = `{v!r}` ({self.config_sources.get(k, '')})"
                                                  for k, v in self.config.items()]
        lines += ["", "## Weight mapping", ""] + [f"- {d}" for d in self.mapping_decisions]
        if self.findings:
            lines += ["", "## Findings", ""] + [f"- {f['kind']}: {f['message']}" for f in self.findings]
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str) -> bool:
        """A bar chart of error / bound per observed stage (log scale, the line at 1 is the bound); False when
        matplotlib is not installed (an optional extra)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return False
        names = [st.name for st in self.stages]
        known = [st.err_over_bound for st in self.stages if st.err_over_bound]
        top = max([10.0] + [10.0 * v for v in known])
        # a stage with no number: diverging without a located tensor, or not observed - drawn hatched to the top
        vals = [max(st.err_over_bound, 1e-6) if st.err_over_bound else (top if st.verdict != "match" else 1e-6)
                for st in self.stages]
        colour = {"match": "tab:green", "diverges": "tab:red"}
        fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names)), 3.0))
        bars = ax.bar(names, vals, color=[colour.get(st.verdict, "tab:gray") for st in self.stages])
        for bar, st in zip(bars, self.stages):
            if not st.err_over_bound and st.verdict != "match":
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_ylabel("max error / bound")
        ax.set_title(f"{self.reference} ({self.dtype}): {self.verdict}")
        ax.tick_params(axis="x", rotation=45)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return True

    def __str__(self) -> str:
        lines = [(f"refimpl verify: {self.verdict.upper()} against {self.reference} ({self.preset} preset, "
                  f"{self.dtype})")]
        if self.first_divergence:
            fd = self.first_divergence
            lines.append(f"first divergence: stage {fd['stage']!r}: {fd['why']}")
        lines.append(f"whole module: {self.whole_module['verdict']} (max relative bound "
                     f"{self.whole_module['max_relative_bound']:.3g}, err/bound "
                     f"{self.whole_module['err_over_bound']:.3g})")
        lines.append(f"{'stage':<8} {'observed at':<22} {'verdict':<13} {'max |err|':>10} {'bound':>10} "
                     f"{'err/bound':>9}")
        for s in self.stages:
            lines.append(f"{s.name:<8} {s.foreign or '-':<22} {s.verdict:<13} {_g(s.max_abs_err):>10} "
                         f"{_g(s.bound):>10} {_g(s.err_over_bound):>9}" + (f"  {s.detail}" if s.detail else ""))
        for f in self.findings:
            lines.append(f"finding ({f['kind']}): {f['message']}")
        return "\n".join(lines)


def _f(x: Any) -> Any:
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else ("inf" if x > 0 else ("-inf" if x < 0 else "nan"))


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def _torch_dtype(name: str) -> Any:
    import torch
    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def _randomise(module: Any, rng: np.random.Generator) -> None:
    """Redraw every floating parameter and buffer (a zero-initialised positional encoding or scale would hide
    bugs): weights N(0, 1 / fan_in), LayerNorm-like vectors named weight 1 + N(0, 0.1^2), biases N(0, 0.1^2),
    every other tensor N(0, 0.5^2)."""
    import torch
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            leaf = name.rpartition(".")[2]
            shape = tuple(t.shape)
            if leaf == "weight" and len(shape) > 1:
                v = rng.standard_normal(shape) / np.sqrt(max(int(np.prod(shape[1:])), 1))
            elif leaf == "weight":
                v = 1.0 + 0.1 * rng.standard_normal(shape)
            elif leaf == "bias":
                v = 0.1 * rng.standard_normal(shape)
            else:
                v = 0.5 * rng.standard_normal(shape)
            t.copy_(torch.from_numpy(v))


def _load_into(module: Any, weights: Mapping[str, np.ndarray]) -> None:
    import torch
    sd = module.state_dict()
    missing = sorted(k for k, v in sd.items() if v.is_floating_point() and k not in weights)
    unexpected = sorted(k for k in weights if k not in sd)
    if missing or unexpected:
        raise VerifyError(f"argument 'weights': the file does not fit the module's state_dict: missing "
                          f"{missing}, unexpected {unexpected}")
    with torch.no_grad():
        for k, v in weights.items():
            if tuple(np.shape(v)) != tuple(sd[k].shape):
                raise VerifyError(f"argument 'weights': {k!r} has shape {tuple(np.shape(v))}, the module's "
                                  f"{tuple(sd[k].shape)}")
            sd[k].copy_(torch.as_tensor(np.asarray(v)))


def _to64(t: Any) -> np.ndarray:
    return _verdict._to_numpy64(t)


def verify(module: Any, reference: str, *, preset: str = "official", config: Mapping[str, Any] | None = None,
           init: Mapping[str, Any] | None = None, weights: Any = None, map: Mapping[str, Any] | None = None,
           input: Any = None, hw: tuple[int, int] | None = None, batch: int = 2, dtype: str = "float32",
           device: str = "cpu", seed: int = 0, call: Mapping[str, Any] | None = None) -> Report:
    """Verify ``module`` (an ``nn.Module``, or a class / factory called with ``init``, or a ``"pkg.mod:Name"`` /
    ``"file.py:Name"`` string) against the registered reference ``reference`` (``REFERENCES``).

    preset : the reference preset the configuration starts from ("paper", "official").
    config : reference configuration fields that override inference and preset.
    weights : a path (.safetensors, .npz, .pt/.pth with weights_only) or a dict of arrays, loaded strictly into
        the module; None redraws every floating tensor from ``seed``.
    map : weight-mapping overrides ``{"rename": {foreign: reference}, "ignore": [foreign]}``.
    input : the input array (the reference's layout); None draws N(0, 1) from ``seed``.
    hw : the token grid (H, W); inferred where the module fixes it (a positional encoding).
    dtype : the precision the module is run in ("float64", "float32", "float16", "bfloat16").
    call : keyword arguments of the foreign forward ("$H", "$W", "$HW" are substituted); None: the reference's
        default call (``forward(x, H, W)`` for FLatten).

    Raises :class:`VerifyError` for any usage, loading or mapping problem (the message names it)."""
    import torch

    if dtype not in _DTYPES:
        raise VerifyError(f"argument 'dtype': expected one of {_DTYPES}, got {dtype!r}")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise VerifyError(f"argument 'batch': expected an integer >= 1, got {batch!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise VerifyError(f"argument 'seed': expected an integer >= 0, got {seed!r}")
    if hw is not None and not (isinstance(hw, (tuple, list)) and len(hw) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in hw)):
        raise VerifyError(f"argument 'hw': expected a pair (H, W) of integers >= 1, got {hw!r}")
    if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_available()):
        raise VerifyError(f"argument 'device': expected 'cpu'{' or cuda' if torch.cuda.is_available() else ''}"
                          f", got {device!r}")
    ref = get_reference(reference)
    if isinstance(module, str):
        module = load_target(module)
    module = instantiate(module, init)
    rng = np.random.default_rng(seed)
    if weights is None:
        _randomise(module, rng)
    else:
        _load_into(module, load_weights(weights) if isinstance(weights, str) else weights)
    module = module.to(device=device, dtype=_torch_dtype(dtype)).eval()
    state = {k: _to64(v) if v.is_floating_point() else v.detach().cpu().numpy()
             for k, v in module.state_dict().items()}
    s = ref.setup(module, state, preset, config or {}, hw)
    wm = map_weights(state, s.shapes, aliases=ref.aliases, fused=ref.fused, joined=ref.joined, user_map=map)
    params = wm.values

    x = ref.draw_input(s, batch, rng) if input is None else np.asarray(input, dtype=np.float64)
    x = round_to(x, dtype)
    xt = torch.from_numpy(x).to(device=device, dtype=_torch_dtype(dtype))
    args, kwargs = ref.call(s, call)

    subs = dict(module.named_modules())
    captured: dict[tuple[str, str], Any] = {}
    handles = []
    wanted = {(p.ref_module, p.where) for p in list(s.points.values()) + [w.point for w in s.wires]}
    for ref_mod, where in wanted:
        fmods = (wm.modules.get(ref_mod) or "").split("+")        # "+": the parts of a joined projection
        if not all(f in subs for f in fmods):
            continue
        for i, fmod in enumerate(fmods if where == "output" else fmods[:1]):

            def hook(_m, inp, out, key=(ref_mod, where, i)):
                t = (inp[0] if inp else None) if key[1] == "input" else (out[0] if isinstance(out, tuple) else out)
                if isinstance(t, torch.Tensor) and key not in captured:
                    captured[key] = t.detach()
            handles.append(subs[fmod].register_forward_hook(hook))
    recorded: list[tuple[str, Any]] = []
    other_dtypes: dict[Any, list[str]] = {}
    sizes = {int(np.prod(v)) for v in ref.value_shapes(s, x)}
    asked = _torch_dtype(dtype)

    class _Recorder(torch.overrides.TorchFunctionMode):
        # Every floating tensor the forward computes whose size a located stage could have, and every
        # operation whose floating result is not in the precision asked for.
        def __torch_function__(self, func, types, args_=(), kwargs_=None):
            res = func(*args_, **(kwargs_ or {}))
            fname = getattr(func, "__name__", str(func))
            for t in (res if isinstance(res, (tuple, list)) else (res,)):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    if t.dtype != asked:
                        other_dtypes.setdefault(t.dtype, []).append(fname)
                    if t.numel() in sizes:
                        recorded.append((f"#{len(recorded)} {fname}", t.detach()))
            return res

    try:
        with torch.no_grad(), _Recorder():
            out = module(xt, *args, **kwargs)
    except Exception as exc:
        raise VerifyError(f"the module's forward raised {type(exc).__name__}: {exc} (called as forward(x, *{args},"
                          f" **{kwargs}); set the call with --call)") from exc
    finally:
        for h in handles:
            h.remove()
    if isinstance(out, (tuple, list)):
        out = out[0]
    findings: list[dict[str, str]] = []
    if out.dtype != asked:
        findings.append({"kind": "dtype", "message": f"the module returned {out.dtype} when run in {dtype}"})
    for dt_, ops in other_dtypes.items():
        lower = torch.finfo(dt_).eps > torch.finfo(asked).eps
        names = ", ".join(sorted(set(ops))[:8])
        findings.append({"kind": "dtype" if lower else "note", "message": (
            f"{len(ops)} operation(s) of the forward compute in {str(dt_).replace('torch.', '')}, "
            f"{'a lower' if lower else 'a higher'} precision than the {dtype} asked ({names}); the bounds assume "
            f"{dtype}" + (": the module may be judged divergent for it" if lower else ""))})
    want = ref.forward(x, params, s)
    if tuple(out.shape) != want.shape:
        raise VerifyError(f"the module's output has shape {tuple(out.shape)}; the reference's is {want.shape} "
                          f"(layout {s.hw}, input {x.shape})")
    got = _to64(out)
    if not np.all(np.isfinite(got)):
        findings.append({"kind": "non-finite", "message": f"{int(np.sum(~np.isfinite(got)))} non-finite output "
                                                          f"element(s) on finite input"})
    whole = _verdict.compare(got, want, ref.bound(x, params, s, dtype), dtype,
                             naive=naive_same_precision(ref.forward, x, params, s, dtype=dtype), name="output")

    # Stage-wise (teacher-forced), stage by stage in the reference's order.
    tensors: dict[str, np.ndarray] = {"x": x}
    where_seen: dict[str, str] = {"x": "input"}
    for name, p in s.points.items():
        parts = [captured.get((p.ref_module, p.where, i))
                 for i in range(len((wm.modules.get(p.ref_module) or "").split("+")) if p.where == "output" else 1)]
        if any(t is None for t in parts):
            continue
        t = np.concatenate([_to64(t) for t in parts], axis=-1)
        if p.rows is not None:
            t = t[..., p.rows[0]:p.rows[1]]
        tensors[name] = t
        where_seen[name] = f"{wm.modules[p.ref_module]}:{p.where}" + (f"[{p.rows[0]}:{p.rows[1]}]" if p.rows else "")
    wiring: dict[str, str] = {}
    for w in s.wires:
        t = captured.get((w.point.ref_module, w.point.where, 0))
        if t is None or w.producer not in tensors:
            continue
        expect = w.transform(tensors[w.producer])
        t = _to64(t)
        if t.shape != expect.shape or not np.array_equal(t, expect):
            diff = float(np.max(np.abs(t - expect))) if t.shape == expect.shape else float("nan")
            wiring[w.stage] = (f"its input is not the output of stage {w.producer!r} "
                               + (f"(max difference {diff:.3g})" if t.shape == expect.shape else
                                  f"(shape {t.shape}, expected {expect.shape})"))
    stage_list = ref.stages(params, s)
    p_stage = _verdict.config.VERDICT_FALSE_ALARM / max(len(stage_list), 1)
    results: list[StageResult] = []
    pool = [(label, _to64(t)) for label, t in recorded]
    unlocated: dict[str, str] = {}
    # Data flow: a stage located by value is computed after the tensors of its own inputs that were located by
    # value (record order), so a look-alike computed earlier (with one token, the attention output equals V)
    # is not taken for it.
    order: dict[str, int] = {}
    for st in stage_list:
        inputs_ok = all(k in tensors for k in st.inputs)
        if not inputs_ok:
            continue
        r = None
        if st.name in ref.value_stages and st.name not in tensors:
            r = st.reference(*[tensors[k] for k in st.inputs])
            after = max([order[k] for k in st.inputs if k in order], default=-1)
            found = locate(pool[after + 1:], r, tie=16 * _verdict.unit_roundoff(dtype))
            gate = _verdict.config.VERIFY_LOCATE_GATE
            if found is not None and found[2] <= gate:
                tensors[st.name], where_seen[st.name] = found[0], f"{found[1].split(':')[0]} (by value)"
                order[st.name] = after + 1 + found[3]
            else:
                unlocated[st.name] = ("no tensor of the forward is within " f"{gate:g} (relative) of the reference "
                                      "computed from the module's own inputs to this stage" +
                                      ("" if found is None else f" (closest: {found[1]}, {found[2]:.3g})"))
        elif st.name in tensors and tensors[st.name].shape != np.shape(r := st.reference(
                *[tensors[k] for k in st.inputs])):
            found = locate([(where_seen[st.name], tensors[st.name])], r)    # a hooked tensor in another layout
            if found is not None:
                tensors[st.name] = found[0]
                where_seen[st.name] += f" ({found[1].split(': ', 1)[1]})"
    for st in stage_list:
        seen = where_seen.get(st.name)
        if st.name in wiring:
            results.append(StageResult(st.name, seen, _verdict.DIVERGES, detail=wiring[st.name]))
            continue
        if st.name in unlocated:
            results.append(StageResult(st.name, None, _verdict.DIVERGES, detail=unlocated[st.name]))
            continue
        if st.name not in tensors or any(k not in tensors for k in st.inputs):
            missing = [k for k in (st.name,) + tuple(st.inputs) if k not in tensors]
            results.append(StageResult(st.name, seen, "not observed",
                                       detail=f"tensor(s) {missing} not observed in the module"))
            continue
        a = [tensors[k] for k in st.inputs]
        r = st.reference(*a)
        rep = _verdict.compare(tensors[st.name], r, st.bound(*a, dtype=dtype), dtype,
                               naive=naive_same_precision(st.reference, *a, dtype=dtype), name=st.name,
                               p_false_alarm=p_stage)
        err = np.abs(tensors[st.name] - r) if tensors[st.name].shape == r.shape else None
        results.append(StageResult(
            st.name, seen, rep.verdict, max_abs_err=None if err is None else float(np.max(err, initial=0.0)),
            max_rel_err=rep.rel_err, bound=float(np.max(_verdict._nan_to_inf(
                st.bound(*a, dtype=dtype).array(dtype, r.shape)), initial=0.0)),
            err_over_bound=rep.max_err_over_bound,
            detail="" if rep.verdict == _verdict.MATCH else "; ".join(rep.reasons)))

    first = next((r for r in results if r.verdict == _verdict.DIVERGES), None)
    observed_all = all(r.verdict != "not observed" for r in results)
    if first is not None or whole.verdict == _verdict.DIVERGES:
        verdict_ = _verdict.DIVERGES
    elif whole.verdict == _verdict.MATCH or (observed_all and all(r.verdict == _verdict.MATCH for r in results)):
        verdict_ = _verdict.MATCH
    else:
        verdict_ = _verdict.INCONCLUSIVE
    first_div = None
    if first is not None:
        first_div = {"stage": first.name, "why": first.detail or (f"error {first.max_abs_err:.3g} against a bound "
                                                                  f"of {first.bound:.3g}"),
                     "max_abs_err": _f(first.max_abs_err), "err_over_bound": _f(first.err_over_bound)}
    elif whole.verdict == _verdict.DIVERGES:
        first_div = {"stage": "output", "why": "the whole module diverges while every observed stage matches: the "
                                               "defect lies between observation points; " + "; ".join(whole.reasons),
                     "max_abs_err": _f(np.max(np.abs(got - want))), "err_over_bound": _f(whole.max_err_over_bound)}
    preset_cfg = dataclasses.asdict(type(s.cfg).preset(preset, dim=s.cfg.dim, num_heads=s.cfg.num_heads))
    diffs = {k: v for k, v in dataclasses.asdict(s.cfg).items() if preset_cfg.get(k) != v and k not in ref.structural}
    if diffs:
        findings.append({"kind": "config", "message": f"{preset} preset except " + ", ".join(
            f"{k} = {v!r} ({s.fields.get(k, '')})" for k, v in diffs.items())})
    return Report(
        verdict=verdict_, reference=ref.name, preset=preset, dtype=dtype,
        config={**dataclasses.asdict(s.cfg), "hw": list(s.hw)}, config_sources=s.fields, mapping=wm.source,
        mapping_decisions=wm.decisions, ignored_foreign_keys=wm.ignored, derived_buffers=wm.derived,
        whole_module={"verdict": whole.verdict, "max_relative_bound": float(whole.max_relative_bound),
                      "err_over_bound": float(whole.max_err_over_bound), "rel_err": _f(whole.rel_err),
                      "reasons": list(whole.reasons)},
        stages=results, first_divergence=first_div, findings=findings, whole_module_text=str(whole))


def verify_examples(module: Any, reference: str, examples: int, *, max_side: int = 12, seed: int = 0,
                    **kwargs: Any) -> Report:
    """:func:`verify` on ``examples`` inputs drawn by Hypothesis: the batch (1 to 3), the grid (H and W each a
    multiple of the module's step up to ``max_side``, unless the module fixes its grid) and the seed of the
    weights and input.  Returns the report of the failing example Hypothesis shrinks to (the smallest batch and
    grid, square before non-square), or, when every example matches, of the one closest to its bound.  The
    report's ``findings`` say which example it is.  ``module`` must be a class or factory (``init``): each
    example builds a fresh module."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from hypothesis.errors import HypothesisException

    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise VerifyError(f"argument 'examples': expected an integer >= 1, got {examples!r}")
    import torch
    if isinstance(module, str):
        module = load_target(module)
    if isinstance(module, torch.nn.Module):
        raise VerifyError("argument 'examples': needs the module's class or factory (each example builds a fresh "
                          "module), got an instance")
    first = verify(module, reference, seed=seed, **kwargs)          # the configuration, and usage errors, once
    step = get_reference(reference).grid_step(_setup_of(first))
    fixed = step is None
    sides = st.just(tuple(first.config["hw"])) if fixed else st.tuples(
        st.integers(1, max(1, max_side // step)).map(lambda m: m * step),
        st.integers(1, max(1, max_side // step)).map(lambda m: m * step))
    other = {k: v for k, v in kwargs.items() if k not in ("hw", "batch", "input")}
    worst: dict[str, Any] = {"report": first, "score": -1.0, "example": None}
    failing: list[tuple[Report, dict]] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(batch=st.integers(1, 3), hw=sides, ex_seed=st.integers(0, 15))   # a small seed range: cheap to shrink
    def run(batch, hw, ex_seed):
        r = verify(module, reference, hw=hw, batch=batch, seed=ex_seed, **other)
        ex = {"batch": batch, "hw": list(hw), "seed": ex_seed}
        score = max([st_.err_over_bound or 0.0 for st_ in r.stages] + [r.whole_module["err_over_bound"]])
        if r.verdict != _verdict.MATCH:
            failing.append((r, ex))
            raise AssertionError(r.verdict)
        if score > worst["score"]:
            worst.update(report=r, score=score, example=ex)

    try:
        run()
    except AssertionError:
        pass
    except HypothesisException as exc:  # pragma: no cover - a Hypothesis usage problem, reported as such
        raise VerifyError(f"argument 'examples': Hypothesis could not run the examples ({exc})") from exc
    if failing:
        report, ex = failing[-1]            # the last failure raised is the shrunk one Hypothesis reports
        report.findings.append({"kind": "example", "message": f"the smallest failing example of {examples}: "
                                                              f"batch {ex['batch']}, grid {ex['hw']}, seed "
                                                              f"{ex['seed']}"})
        return report
    report = worst["report"]
    report.findings.append({"kind": "example", "message": f"all {examples} example(s) match; shown: the closest to "
                                                          f"its bound, {worst['example']}"})
    return report


def _setup_of(report: Report) -> Any:
    """A minimal object with the configuration and grid of ``report`` (for Reference.grid_step)."""
    cfg_fields = {k: v for k, v in report.config.items() if k != "hw"}
    return type("S", (), {"cfg": type("C", (), cfg_fields), "hw": tuple(report.config["hw"])})


def assert_matches(module: Any, reference: str, **kwargs: Any) -> Report:
    """:func:`verify`, raising ``AssertionError`` with the report unless the verdict is "match" (for a user's
    own test suite)."""
    report = verify(module, reference, **kwargs)
    if not report.ok:
        raise AssertionError(str(report) + "\n" + report.whole_module_text)
    return report
