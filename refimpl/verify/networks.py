"""Verifying a whole registered network (refimpl.models: ``flatten_swin_t``, ``ravlt_t``, ``l2vit_tiny``...)
against a foreign PyTorch network, unit by unit.

Layer: the verify tool (torch).  :func:`verify_network` is what :func:`refimpl.verify.verify` runs when the
reference is a registered network name.  What happens::

    configuration: the registered config in ``preset`` (default "official"), ``config`` fields over it
        (``{"reduced": true}``: the family's reduced config, the equivalence suite's small one on the same code
        path); the image size from ``hw`` (a model built for one resolution is rebuilt for it) or 224 x 224
    naming: the foreign state_dict keys (the module's, and the weights file's) are read as the reference's
        keys, or as the released code's (refimpl.models.convert: renames and derived buffers), strictly
    weights: the file's values (or the reference's init_params drawn from ``seed``) loaded into the module
        through its naming, the module cast to ``dtype``, its parameters read back as the reference's
    units: the family's ``unit_names`` (stem, every block, downsampling, head), each observed at the foreign
        submodule of that name (or the one holding the unit's parameters, through the naming) with forward
        hooks: its input and output; the stem's output is the first block's input, the head's the logits
    judged teacher-forced: ``run_unit`` on the foreign network's own input to the unit, against
        ``unit_bound`` in ``dtype``; where a unit's bound is void and the family has ``unit_parts`` (a block's
        attention and MLP residual branches), each part is judged, the intermediate located by value among
        the tensors the unit's forward computed (every part's result in the unit's ``parts``)
    wiring (:func:`_wiring`): a unit's output must be what the next unit receives; a skipped unit, or a unit whose
        submodule is right while the next unit receives another tensor (blocks swapped, an output not used, the
        residual around the unit dropped), is a wiring divergence naming the unit and what was received; into
        the head (:func:`_head_wiring`): its classifier (the submodule holding head.weight) must receive the
        head's features of the last unit's output, not another unit's output, another token, or the tokens
        without the final normalisation
    ensemble (``ensemble=True``, :func:`refimpl.verify.ensemble.unit_members`): each unit's comparison also
        against the network's twin in ``dtype`` run on the same unit input, plainly and under every variant of
        refimpl.ensemble.DEFAULT_VARIANTS (a part judged alone: the twin's part likewise); the members per unit
        in the report (False: the NumPy naive run and the random-rounding model only)
    whole network: the logits against ``forward_bounds`` (void at depth: then the units decide) and the
        ensemble criterion, with the twin's whole forward on the same images as members where ``ensemble=True``
        (:func:`refimpl.verify.ensemble.logits_members`)
    shadow mode (``shadow=True``): each unit's submodule also run on the reference's own input to the unit
    examples (:func:`refimpl.verify.network_examples.verify_network_examples`): image sizes, batch and seed drawn by Hypothesis, a network built for
        one resolution rebuilt per size through the target's size keyword, the worst or the shrunk failing reported
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from typing import Any, Mapping

import numpy as np

from .. import config as _config
from .. import verdict as _verdict
from ..errors import RefimplError
from ..numerics import naive_same_precision, round_to
from .ensemble import logits_members, members_summary, network_section, network_twin, unit_members
from .head_wiring import _classifier_module, _head_wiring
from .loading import VerifyError, instantiate, load_target, load_weights
from .locate import locate, recorder, to_foreign
from .network_values import _as_layout, _same_value, unit_modules
from .report import Report, StageResult, _f

__all__ = ["network_names", "is_network", "network_presets", "network_config", "verify_network"]


def network_names() -> list[str]:
    """The registered network names (refimpl.models)."""
    from .. import models as rm
    return rm.names()


def is_network(name: Any) -> bool:
    """Whether ``name`` is a registered network's name (not a layer reference such as ``rala.attention``)."""
    return isinstance(name, str) and "." not in name and name in network_names()


def network_presets(cfg: Any) -> tuple[str, ...]:
    """The presets a network config accepts ("official" first where its attention has released code)."""
    if not any(f.name == "preset" for f in dataclasses.fields(cfg)):
        return ()
    out = []
    for p in ("official", "paper"):
        try:
            dataclasses.replace(cfg, preset=p)
            out.append(p)
        except (ValueError, TypeError):
            pass
    return tuple(out)


def _tuples(v: Any) -> Any:
    """JSON lists as the tuples the configs hold."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def size_field(cfg: Any) -> str | None:
    """The field of a network config that fixes its image size (``img_size``: FLatten DeiT / PVT / Swin / CSwin,
    Castling, L2ViT-DeiT, RALA variants; ``image_size``: LiSANet), or None for a network that runs any size."""
    return next((f for f in ("img_size", "image_size") if hasattr(cfg, f)), None)


def network_config(name: str, preset: str | None, config: Mapping[str, Any] | None, hw: Any
                   ) -> tuple[Any, dict[str, str], str, tuple[int, int]]:
    """(config, field -> where it came from, preset, image (H, W)) of a registered network."""
    from .. import models as rm
    e = rm.entry(name)
    fam, cfg = e.module, e.config
    presets = network_presets(cfg)
    if preset is None:
        preset = presets[0] if presets else "registered"
    if (presets and preset not in presets) or (not presets and preset != "registered"):
        raise VerifyError(f"argument 'preset': expected one of {presets or ('registered',)} for {name}, got "
                          f"{preset!r}")
    over = dict(config or {})
    reduced = over.pop("reduced", False)
    known = {f.name for f in dataclasses.fields(cfg)}
    if "preset" in over:
        raise VerifyError("argument 'config': give the preset with --preset, not as a config field")
    if set(over) - known:
        raise VerifyError(f"argument 'config': unknown field(s) {sorted(set(over) - known)} of {type(cfg).__name__} "
                          f"(it has {sorted(known)}, and 'reduced')")
    fields = {f: f"registered config {name!r}" for f in known}
    try:
        if presets:
            cfg = dataclasses.replace(cfg, preset=preset)
            fields["preset"] = "--preset" if preset != presets[0] else f"default preset {preset!r}"
        if reduced:
            if not hasattr(fam, "reduced"):
                raise VerifyError(f"argument 'config': {name} has no reduced configuration")
            small = fam.reduced(cfg)
            for f in known:
                if getattr(small, f) != getattr(cfg, f):
                    fields[f] = f"reduced({name}) (the equivalence suite's small config)"
            cfg = small
        if over:
            cfg = dataclasses.replace(cfg, **{k: _tuples(v) for k, v in over.items()})
            fields.update({k: "--config" for k in over})
        field = size_field(cfg)
        if hw is not None and field is not None and tuple(getattr(cfg, field)) != tuple(hw):
            cfg = dataclasses.replace(cfg, **{field: tuple(int(v) for v in hw)})
            fields[field] = "--hw (the model is built for one resolution)"
    except (ValueError, TypeError) as exc:
        raise VerifyError(f"config: {exc}") from exc
    if field is not None:
        image = tuple(int(v) for v in getattr(cfg, field))
        fields["hw"] = fields.get(field, "") if hw is None else "--hw"
    elif hw is not None:
        image, fields["hw"] = (int(hw[0]), int(hw[1])), "--hw"
    elif reduced and hasattr(fam, "test_image_hw"):
        image, fields["hw"] = tuple(fam.test_image_hw(cfg)), f"{fam.__name__}.test_image_hw (reduced config)"
    else:
        image, fields["hw"] = tuple(_config.NET_PAPER_RESOLUTION), "default (the papers' 224 x 224)"
    return cfg, fields, preset, image


# ---------------------------------------------------------------------------------------------------------
# Naming: foreign state_dict keys -> the reference's
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Naming:
    values: dict[str, np.ndarray]        # reference key -> float64
    source: dict[str, str]               # reference key -> foreign key
    decisions: list[str]
    derived: list[str]                   # foreign keys that are derived buffers (checked, not mapped)
    naming: str                          # "reference" or "released"
    renames: dict[str, str]              # foreign (released) key -> reference key, where they differ


def _np(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):
        t = v.detach().cpu()
        return t.double().numpy() if t.is_floating_point() else t.numpy()
    return np.asarray(v)


def _user_map(state: dict[str, Any], user_map: Mapping[str, Any] | None, decisions: list[str]) -> dict[str, Any]:
    user_map = dict(user_map or {})
    if set(user_map) - {"rename", "ignore"}:
        raise VerifyError(f"argument 'map': unknown entries {sorted(set(user_map) - {'rename', 'ignore'})} "
                          f"(expected 'rename' and 'ignore')")
    rename, ignore = dict(user_map.get("rename", {})), list(user_map.get("ignore", []))
    for k in list(rename) + ignore:
        if k not in state:
            raise VerifyError(f"argument 'map': foreign key {k!r} is not in the state_dict (it has "
                              f"{sorted(state)[:12]}...)")
    out = {}
    for k, v in state.items():
        if k in ignore:
            decisions.append(f"{k}: ignored (--map)")
        elif k in rename:
            out[rename[k]] = v
            decisions.append(f"{k} -> {rename[k]}: the user's rename (--map)")
        else:
            out[k] = v
    return out


def _to_reference(state: Mapping[str, Any], fam: Any, cfg: Any, what: str) -> _Naming:
    """Read a foreign state_dict (key -> tensor or array) as the reference's parameters: in the reference's own
    key names (with BatchNorm batch counters), or in the released code's (refimpl.models.convert: renames and
    derived buffers, checked against the configuration), whichever the keys are; strictly (an unused or missing
    key is a :class:`VerifyError` naming it)."""
    from ..models.convert import convert_state_dict, released_layout
    shapes = fam.param_shapes(cfg)
    keys = set(state)
    counters = {k for k in keys if k.endswith(".num_batches_tracked") and
                k[: -len(".num_batches_tracked")] + ".running_var" in shapes}
    ours = set(shapes) | counters
    try:
        layout = released_layout(cfg)
    except RefimplError:
        layout = None
    released = set(layout.renames) | set(layout.derived) if layout is not None else set()
    use_released = layout is not None and not keys <= ours and (
        keys <= released or len(keys & released) > len(keys & ours))
    decisions: list[str] = []
    if use_released:
        try:
            values = convert_state_dict(cfg, dict(state), "official", require_buffers=False)
        except RefimplError as exc:
            raise VerifyError(f"weights: {what}: {exc}") from exc
        source = {o: r for r, o in layout.renames.items()}
        renames = {r: o for r, o in layout.renames.items() if r != o}
        derived = sorted(k for k in keys if k in layout.derived)
        decisions += [f"{o} <- {r}: the released name ({layout.file})" for r, o in renames.items()]
        decisions.append(f"{what}: {len(layout.renames) - len(renames)} key(s) by exact name; the released layout "
                         f"of {layout.file} (refimpl.models.convert)")
        decisions += [f"{k}: derived buffer ({layout.derived[k].what}), checked against the value recomputed from "
                      f"the configuration" for k in derived]
        return _Naming(values, source, decisions, derived, "released", renames)
    unknown = sorted(keys - ours)
    missing = sorted(set(shapes) - keys)
    if unknown or missing:
        cands = sorted(ours - keys) + sorted(released - keys)
        desc = []
        for k in unknown[:8]:
            hint = difflib.get_close_matches(k, cands, n=1, cutoff=0.8)
            desc.append(f"'{k}'" + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        parts = ([f"unknown {', '.join(desc)}" + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")]
                 if unknown else []) + ([f"missing {', '.join(missing[:8])}" +
                                         (f" and {len(missing) - 8} more" if len(missing) > 8 else "")]
                                        if missing else [])
        raise VerifyError(f"weights: {what}: the keys are neither the reference's ({len(shapes)} keys of "
                          f"{fam.__name__}.param_shapes) nor the released code's (strict): " + "; ".join(parts))
    values = {}
    for k, s in shapes.items():
        v = _np(state[k])
        if v.dtype.kind != "f" or tuple(v.shape) != tuple(s):
            raise VerifyError(f"weights: {what}: {k!r} is {v.dtype} {tuple(v.shape)}, expected a floating array of "
                              f"shape {tuple(s)}")
        values[k] = v.astype(np.float64)
    decisions.append(f"{what}: all {len(shapes)} key(s) by exact name (the reference's naming)")
    return _Naming(values, {k: k for k in shapes}, decisions, sorted(counters), "reference", {})


# ---------------------------------------------------------------------------------------------------------
# Observation
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _NetRun:
    out: Any
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    recorded: list[tuple[str, str | None, Any]]      # (label, unit it was computed in, tensor)
    other_dtypes: dict[Any, list[str]]
    #: unit -> (its submodule's positional arguments after the first, its keyword arguments) at the first call
    calls: dict[str, tuple[tuple, dict]] = dataclasses.field(default_factory=dict)
    #: the head's classifier (the foreign submodule holding head.weight): (its path, its input, its output) at its
    #: first call; None when it has none or was not called
    classifier: tuple[str, Any, Any] | None = None


def _run_network(module: Any, x: np.ndarray, mods: Mapping[str, str], sizes: set[int], dtype: str, device: str,
                 call: Mapping[str, Any] | None, classifier: str | None = None) -> _NetRun:
    import torch

    from .steps import _torch_dtype
    asked = _torch_dtype(dtype)
    subs = dict(module.named_modules())
    run = _NetRun(None, {}, {}, [], {})
    stack: list[str] = []
    handles = []
    for u, path in mods.items():
        def pre(_m, inp, kw, u=u):
            stack.append(u)
            if u not in run.inputs and inp and isinstance(inp[0], torch.Tensor):
                run.inputs[u] = inp[0].detach()
                run.calls[u] = (tuple(inp[1:]), dict(kw or {}))

        def post(_m, inp, out, u=u):
            if stack and stack[-1] == u:
                stack.pop()
            t = out[0] if isinstance(out, (tuple, list)) else out
            if u not in run.outputs and isinstance(t, torch.Tensor):
                run.outputs[u] = t.detach()
        handles.append(subs[path].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(subs[path].register_forward_hook(post))
    if classifier is not None:
        def head_hook(_m, inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if run.classifier is None and inp and isinstance(inp[0], torch.Tensor) and isinstance(t, torch.Tensor):
                run.classifier = (classifier, inp[0].detach(), t.detach())
        handles.append(subs[classifier].register_forward_hook(head_hook))

    xt = torch.from_numpy(x).to(device=device, dtype=asked)
    try:
        with torch.no_grad(), recorder(asked, sizes, run.recorded, run.other_dtypes,
                                       tag=lambda: stack[-1] if stack else None):
            out = module(xt, **dict(call or {}))
    except Exception as exc:
        raise VerifyError(f"the network's forward raised {type(exc).__name__}: {exc} (called as forward(images, "
                          f"**{dict(call or {})}))") from exc
    finally:
        for h in handles:
            h.remove()
    run.out = out[0] if isinstance(out, (tuple, list)) else out
    return run


# ---------------------------------------------------------------------------------------------------------
# Judgement
# ---------------------------------------------------------------------------------------------------------

def _compare(got: np.ndarray, ref: np.ndarray, bound: Any, fn: Any, args: tuple, dtype: str, name: str,
             p: float, ensemble: Mapping[str, np.ndarray] | None = None) -> Any:
    return _verdict.compare(got, ref, bound, dtype, naive=naive_same_precision(fn, *args, dtype=dtype), name=name,
                            ensemble=ensemble or None, p_false_alarm=p)


def _result(name: str, where: str | None, got: np.ndarray, ref: np.ndarray, bound: Any, rep: Any, dtype: str,
            detail: str = "") -> StageResult:
    return StageResult(name, where, rep.verdict, max_abs_err=float(np.max(np.abs(got - ref), initial=0.0)),
                       max_rel_err=rep.rel_err,
                       bound=float(np.max(_verdict._nan_to_inf(bound.array(dtype, ref.shape)), initial=0.0)),
                       err_over_bound=rep.max_err_over_bound,
                       detail=detail or ("" if rep.verdict == _verdict.MATCH else "; ".join(rep.reasons)))


def _judge_parts(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, u: str, xin: np.ndarray, got: np.ndarray,
                 where: str, run: _NetRun, dtype: str, p: float, unit_rep: Any, ne: Any = None) -> StageResult | None:
    """A unit whose own bound is void (or that diverges: :func:`_located`), judged part by part (``unit_parts``):
    each part teacher-forced on the
    foreign intermediate (located by value among the tensors the unit's forward computed), with the twin's part on
    it as the ensemble where ``ne`` (:class:`refimpl.verify.ensemble.NetworkEnsemble`) is given (the parts'
    members in the result's ``ensemble["parts"]``).  Every part is judged, also after a diverging one (on the
    foreign intermediate, as the units are); one whose input could not be located is "not judged".  The unit's
    verdict and detail are those of its first diverging part; each part's result is in the result's ``parts``, in
    the order the reference computes them.  None when the family has no parts for the unit."""
    parts = tuple(fam.unit_parts(cfg, u)) if hasattr(fam, "unit_parts") else ()
    if not parts:
        return None
    pool = [(label, t) for label, tag, t in run.recorded if tag == u and t.numel() == got.size]
    xp, after, notes, worst, summaries, judged = xin, 0, [], 0.0, {}, []
    first: StageResult | None = None
    void = (f"the unit's own bound is void in {dtype} (max relative bound {unit_rep.max_relative_bound:.3g})")
    for i, part in enumerate(parts):
        fn = (lambda prm, v, q=part: fam.run_unit_part(prm, u, q, v, cfg))
        rp = fn(params, xp)
        bp = fam.unit_part_bound(params, u, part, xp, cfg, dtype=dtype)
        if i < len(parts) - 1:
            from .steps import _to64
            # the tensors within the part's own bound (its evaluation in dtype, the reference's rounding) tie
            found = locate([(lbl, _to64(t)) for lbl, t in pool[after:]], rp, bp.array(dtype, rp.shape))
            if found is None or found[2] > _config.VERIFY_LOCATE_GATE:
                why = (f"no tensor of the unit's forward is within {_config.VERIFY_LOCATE_GATE:g} (relative) of the "
                       f"reference on the unit's own input" + ("" if found is None else
                                                               f" (closest: {found[1]}, {found[2]:.3g})"))
                judged.append(StageResult(part, None, _verdict.DIVERGES, detail=why))
                judged += [StageResult(q, None, "not judged", detail=f"its input, part {part!r}'s output, was not "
                                                                      f"located") for q in parts[i + 1:]]
                if first is None:
                    first = StageResult(u, where, _verdict.DIVERGES, detail=f"{void}; stage-wise, part {part!r}: {why}")
                break
            gp, after = found[0], after + found[3] + 1
            pwhere = f"{found[1].split(':')[0]} (by value)"
        else:
            gp, pwhere = got, where
        members = unit_members(ne, u, xp, rp.shape, part=part) if ne is not None else None
        rep = _compare(gp, rp, bp, fn, (params, xp), dtype, f"{u}/{part}", p / len(parts), members)
        if ne is not None:
            summaries[part] = members_summary(rep, sorted(members or {}))
        worst = max(worst, rep.max_err_over_bound)
        notes.append(f"{part} {rep.verdict} (err/bound {rep.max_err_over_bound:.3g})")
        judged.append(_result(part, pwhere, gp, rp, bp, rep, dtype))
        if rep.verdict != _verdict.MATCH and first is None:
            first = _result(u, where, gp, rp, bp, rep, dtype, detail=(
                f"stage-wise (the unit's own bound is void in {dtype}): part {part!r}: " + "; ".join(rep.reasons)))
        xp = gp
    if first is not None:
        first.ensemble = {"parts": summaries} if ne is not None else None
        first.parts = judged
        return first
    r = fam.run_unit(params, u, xin, cfg)
    return StageResult(u, where, _verdict.MATCH, max_abs_err=float(np.max(np.abs(got - r), initial=0.0)),
                       max_rel_err=unit_rep.rel_err, bound=None, err_over_bound=worst,
                       detail=f"stage-wise: {void}; its parts: " + ", ".join(notes),
                       ensemble={"parts": summaries} if ne is not None else None, parts=judged)


def _located(unit: StageResult, parts: StageResult | None) -> StageResult:
    """A diverging unit's own result, its verdict kept, with its parts judged teacher-forced on the foreign
    intermediates (:func:`_judge_parts`) attached, so that the report names the first diverging part
    (StageResult.first_divergence): where the bug lives inside the block.  Where every part matches, the
    divergence lies in how the parts compose (the residual additions, a layout between them), and the detail says
    so; where none diverges but some part is inconclusive or not judged, the detail names those too.  ``parts`` None (no parts for the unit): the unit's result unchanged."""
    if parts is None or not parts.parts:
        return unit
    unit.parts, unit.ensemble = parts.parts, parts.ensemble
    bad = next((q for q in parts.parts if q.verdict == _verdict.DIVERGES), None)
    open_ = [q.name for q in parts.parts if q.verdict != _verdict.MATCH]
    judged = ", ".join(f"{q.name} {q.verdict}" for q in parts.parts)
    unit.detail += (f"; part by part (teacher-forced on your intermediates): {judged}; first diverging part "
                    f"{bad.name!r}" if bad is not None else
                    f"; part by part (teacher-forced on your intermediates): {judged}: every part matches on its "
                    f"own, so the divergence lies in how the parts compose (the residual additions, a layout "
                    f"between them)" if not open_ else
                    f"; part by part (teacher-forced on your intermediates): {judged}: no part diverges on its own, "
                    f"so the divergence lies in how the parts compose or in a part not judged conclusively "
                    f"({', '.join(open_)})")
    return unit


def _source(t: Any, run: _NetRun, units: list[str], skip: str) -> str:
    """Which observed tensor of the foreign network ``t`` (a unit's input) holds: the output or the input of
    another unit (by value, in its layout); "" when none."""
    from .steps import _to64
    f = _to64(t)
    for kind, table in (("the output", run.outputs), ("the input", run.inputs)):
        for v in units:
            if v == skip or v not in table:
                continue
            g, _how = _as_layout(table[v], f)
            if _same_value(g, f):
                return f"{kind} of unit {v!r}"
    return ""


def _wiring(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str], k: int,
            mods: Mapping[str, str], run: _NetRun, xin: np.ndarray, r: np.ndarray, res: StageResult,
            dtype: str, p: float) -> tuple[StageResult, dict[str, str]] | None:
    """The wiring check of unit ``units[k]`` (teacher-forced verdict ``res``, observed at the next unit's input):
    the unit's output must be what the next unit receives, as the reference chains them.  A wiring divergence
    (the stage's result replaced, and a "wiring" finding) where

    * the unit's submodule was never called and the next unit receives the unit's own input (a skipped unit);
    * the unit's submodule computes the unit (its output matches ``run_unit`` on the unit's foreign input, within
      ``unit_bound``; where that bound is void, within the locating gate) but the next unit receives something
      else: another unit's output (blocks swapped, an output fed to the wrong block), the unit's own input (its
      output dropped);
    * the submodule does not compute the unit, the next unit receives its output, and that output plus the unit's
      input computes the unit by the same criterion (the residual around the unit dropped at the network level).

    "Receives": holds the same values (:func:`_same_value`: a wire is a copy, no rounding between the two).

    The last unit (the head) has no next unit: :func:`_head_wiring` checks the wire into its classifier.

    None when the unit's verdict is not a divergence or no wire is at fault (a bug inside the unit)."""
    u = units[k]
    nxt = units[k + 1] if k + 1 < len(units) else None
    if nxt is None:
        return _head_wiring(fam, params, cfg, units, run, xin, r, res, dtype)
    if nxt not in run.inputs:
        return None
    nin, _how = _as_layout(run.inputs[nxt], r)
    if nin is None:
        return None
    where = f"{mods[nxt]}:input"
    why = ""
    if u in mods and u not in run.inputs:     # whatever the numbers say (a unit close to the identity passes)
        if _same_value(nin, xin) and not np.array_equal(r, xin):
            why = (f"unit {u!r} is skipped: its submodule {mods[u]} was never called and the next unit {nxt!r} "
                   f"receives the unit's own input")
    elif res.verdict != _verdict.DIVERGES:
        return None
    elif u in run.outputs:
        own, _h = _as_layout(run.outputs[u], r)
        if own is None:
            return None
        bound = fam.unit_bound(params, u, xin, cfg, dtype=dtype)
        fn = (lambda prm, v: fam.run_unit(prm, u, v, cfg))

        def computes(value: np.ndarray) -> tuple[bool, Any]:
            # ``value`` is the unit's output on xin as far as the unit's own bound tells (its evaluation in dtype
            # and the reference's rounding): a match, or, where that bound cannot tell, within the locating gate
            rep = _compare(value, r, bound, fn, (params, xin), dtype, u, p)
            return rep.verdict == _verdict.MATCH or (
                rep.verdict == _verdict.INCONCLUSIVE and float(np.sqrt(np.sum((value - r) ** 2))) <=
                _config.VERIFY_LOCATE_GATE * float(np.sqrt(np.sum(r ** 2)))), rep
        ok, rep = computes(own)
        if ok and not _same_value(nin, own):
            src = ("the unit's own input: the unit's output is not used" if _same_value(nin, xin) else
                   _source(run.inputs[nxt], run, units, nxt) or "a tensor no unit computed")
            why = (f"unit {u!r} computes correctly (its submodule {mods[u]}'s output matches the reference, "
                   f"err/bound {rep.max_err_over_bound:.3g}) but the next unit {nxt!r} does not receive it: it "
                   f"receives {src}")
        elif not ok and _same_value(nin, own) and xin.shape == own.shape and computes(own + xin)[0]:
            # the submodule's output plus the unit's input computes the unit by the same criterion (the sum is one
            # float64 addition of T values, u_64 |own + xin|, below the rounding u_T |output| of the residual
            # addition that the unit's bound charges, common.e_add): the submodule computes the residual branch
            # and the network does not add the input back
            why = (f"the residual around unit {u!r} is dropped: the next unit {nxt!r} receives the output of "
                   f"{mods[u]} alone, and that output plus the unit's input is the reference's unit output")
    if not why:
        return None
    out = StageResult(u, where, _verdict.DIVERGES, max_abs_err=res.max_abs_err, max_rel_err=res.max_rel_err,
                      bound=res.bound, err_over_bound=res.err_over_bound, detail="wiring: " + why + (
                          f" (numerically: {res.verdict}" + (f", err/bound {res.err_over_bound:.3g})"
                                                             if res.err_over_bound is not None else ")")))
    return out, {"kind": "wiring", "message": f"between units {u!r} and {nxt!r}: {why}"}


def _shadow_units(module: Any, fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str],
                  mods: Mapping[str, str], run: _NetRun, x: np.ndarray, taps: Mapping[str, np.ndarray],
                  sizes: set[int], dtype: str, device: str, p: float, ne: Any = None) -> list[StageResult]:
    """Shadow mode for a network: each unit's foreign submodule called on the reference's own input to the unit
    (the previous unit's output in the float64 reference, rounded to ``dtype``, in the layout the submodule
    received in the tested run), its output judged against ``run_unit`` on that input and ``unit_bound``
    (part by part, as in the propagating run, where the unit's own bound is void).  A unit is shadowed only where
    its submodule's output is the unit's output (nothing of the network is computed between it and the next unit).
    With ``ne`` (the network's twin ensemble) the twin's unit (or parts) on the same input are the ensemble, as in
    the propagating run, and listed in the result's ``ensemble``."""
    import torch

    from .steps import NOT_SHADOWED, _to64, _torch_dtype
    asked = _torch_dtype(dtype)
    subs = dict(module.named_modules())
    results: list[StageResult] = []
    for k, u in enumerate(units):
        nxt = units[k + 1] if k + 1 < len(units) else None
        why = ("no submodule computes it" if u not in mods else
               f"{mods[u]} was not called in the tested run" if u not in run.inputs or u not in run.outputs else "")
        if not why and nxt in run.inputs:
            nin = _to64(run.inputs[nxt])
            sub_out, _how = _as_layout(run.outputs[u], nin)
            if sub_out is None or not np.array_equal(sub_out, nin):
                why = (f"the network computes between the output of {mods[u]} and the input of the next unit "
                       f"{nxt!r}: the unit's output is not its submodule's")
        own_in = round_to(x if k == 0 else taps[units[k - 1]], dtype)
        fin = None if why else _to64(run.inputs[u])
        fed = None if why else to_foreign(own_in, fin, own_in)
        if not why and fed is None:
            why = f"{mods[u]} received shape {fin.shape}; the reference's input to the unit has {own_in.shape}"
        if why:
            results.append(StageResult(u, None, NOT_SHADOWED, detail=why))
            continue
        rec: list = []
        rest, kw = run.calls.get(u, ((), {}))
        t_in = torch.from_numpy(np.ascontiguousarray(fed)).to(device=device, dtype=asked)
        try:
            with torch.no_grad(), recorder(asked, sizes, rec, {}, tag=lambda u=u: u):
                out = subs[mods[u]](t_in, *rest, **kw)
        except Exception as exc:
            raise VerifyError(f"shadow: {mods[u]} raised {type(exc).__name__} on the reference's input to unit "
                              f"{u!r}: {exc}") from exc
        out = out[0] if isinstance(out, (tuple, list)) else out
        fn = (lambda prm, v, u=u: fam.run_unit(prm, u, v, cfg))
        r = fn(params, own_in)
        got, how = _as_layout(out, r)
        where = f"{mods[u]}(the reference's input)" + (how or "")
        if got is None:
            results.append(StageResult(u, where, _verdict.DIVERGES, detail=f"shadow output of {how}"))
            continue
        bound = fam.unit_bound(params, u, own_in, cfg, dtype=dtype)
        members = unit_members(ne, u, own_in, r.shape) if ne is not None else None
        rep = _compare(got, r, bound, fn, (params, own_in), dtype, u, p, members)
        res = None
        if rep.verdict in (_verdict.INCONCLUSIVE, _verdict.DIVERGES) and u != "head":
            res = _judge_parts(fam, params, cfg, u, own_in, got, where, _NetRun(out, {}, {}, rec, {}), dtype, p, rep,
                               ne)
            if rep.verdict == _verdict.DIVERGES:
                res = _located(_result(u, where, got, r, bound, rep, dtype), res)
        parts = res.ensemble if res is not None else None
        results.append(res or _result(u, where, got, r, bound, rep, dtype))
        if ne is not None:
            results[-1].ensemble = {**members_summary(rep, sorted(members or {})), **(parts or {})}
    return results


def _progress(enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    try:
        from rich.console import Console
        from rich.progress import Progress
    except ImportError:  # pragma: no cover - rich is a dependency of the verify extra
        return contextlib.nullcontext(None)
    return Progress(console=Console(stderr=True), transient=True)


def verify_network(module: Any, reference: str, *, preset: str | None = None,
                   config: Mapping[str, Any] | None = None, init: Mapping[str, Any] | None = None,
                   weights: Any = None, map: Mapping[str, Any] | None = None, input: Any = None,
                   hw: tuple[int, int] | None = None, batch: int | None = None, dtype: str = "float32",
                   device: str = "cpu", seed: int = 0, call: Mapping[str, Any] | None = None,
                   progress: bool = False, shadow: bool = False, grad: bool = False, ensemble: bool = False) -> Report:
    """Verify the foreign network ``module`` against the registered network ``reference`` unit by unit (see the
    module docstring); arguments as :func:`refimpl.verify.verify` (``hw``: the image size; ``input``: images
    (B, C, H, W); ``batch`` default 1; ``config`` may hold ``"reduced": true``).  ``progress``: a rich progress
    bar over the units on stderr.  ``shadow``: also each unit's submodule on the reference's own input to the unit
    (:func:`_shadow_units`).  ``grad``: also the network's input and parameter gradients against its float64
    twin's (:mod:`refimpl.verify.network_gradients`; the false-alarm budget then split in half).  ``ensemble``:
    each unit also against the network's twin in ``dtype`` on the unit's tested input, and the logits against its
    whole forward on the images, plainly and under every variant of refimpl.ensemble.DEFAULT_VARIANTS
    (:mod:`refimpl.verify.ensemble`; the report's ``ensemble``, each unit's and the whole module's); False (the
    default here; :func:`refimpl.verify.verify` asks for it by default): the NumPy naive run in ``dtype`` and the
    random-rounding model only."""
    import torch

    from .steps import _check_arguments, _conclude, _first, _precision_findings, _to64, _torch_dtype, _with_shadow
    batch = 1 if batch is None else batch
    _check_arguments(dtype, batch, seed, hw, device)
    if not isinstance(ensemble, bool):
        raise VerifyError(f"argument 'ensemble': expected True or False, got {ensemble!r}")
    if input is not None:
        input = np.asarray(input, dtype=np.float64)
        if input.ndim != 4:
            raise VerifyError(f"argument 'input': expected images (B, C, H, W), got shape {input.shape}")
        if hw is None:
            hw = (int(input.shape[2]), int(input.shape[3]))
    cfg, fields, preset, image = network_config(reference, preset, config, hw)
    from .. import models as rm
    fam = rm.family_of(reference)
    module = instantiate(load_target(module) if isinstance(module, str) else module, init)
    rng = np.random.default_rng(seed)
    decisions: list[str] = []

    # naming: the module's keys, then the file's (or the reference's own random weights)
    mstate = module.state_dict()
    mnaming = _to_reference(_user_map(dict(mstate), map if weights is None else None, decisions), fam, cfg,
                            "the module's state_dict")
    if weights is None:
        values = fam.init_params(cfg, rng)
        naming = mnaming
        decisions.append(f"weights: the reference's init_params drawn from seed {seed}")
    else:
        raw = load_weights(weights, widen=False) if isinstance(weights, str) else dict(weights)
        naming = _to_reference(_user_map(raw, map, decisions), fam, cfg,
                               f"--weights {weights!r}" if isinstance(weights, str) else "the weights")
        values = naming.values
    decisions += naming.decisions + ([d for d in mnaming.decisions] if naming is not mnaming else [])
    # the values into the module (in dtype first: loading float64 values into float32 tensors would round twice)
    module = module.to(device=device, dtype=_torch_dtype(dtype)).eval()
    sd = module.state_dict()
    with torch.no_grad():
        for rk, mk in mnaming.source.items():
            v = np.asarray(values[rk], dtype=np.float64)
            if tuple(v.shape) != tuple(sd[mk].shape):
                raise VerifyError(f"weights: {rk!r} {tuple(v.shape)} does not fit the module's {mk!r} "
                                  f"{tuple(sd[mk].shape)}")
            sd[mk].copy_(torch.from_numpy(v).to(dtype=sd[mk].dtype, device=sd[mk].device))
    params = {rk: _to64(sd[mk]) for rk, mk in mnaming.source.items()}

    x = round_to(rng.standard_normal((batch, getattr(cfg, "in_chans", 3), *image)) if input is None else input, dtype)
    units = list(fam.unit_names(cfg))
    mods = unit_modules(units, dict(module.named_modules()), mnaming.source)
    # the reference's own run: the unit values' sizes (for the intermediates located by value)
    taps: dict[str, np.ndarray] = {}
    try:
        want = fam.run(params, x, cfg, taps=taps)[0]
    except (ValueError, TypeError) as exc:
        raise VerifyError(f"the reference {reference} does not accept images {x.shape}: {exc}") from exc
    sizes = {int(taps[u].size) for u in units if u in taps and u != "head"}
    run = _run_network(module, x, mods, sizes, dtype, device, call,
                       classifier=_classifier_module(dict(module.named_modules()), mnaming.source))
    findings = _precision_findings(run, dtype)
    got_logits = _to64(run.out)
    if got_logits.size != want.size:
        raise VerifyError(f"the network's output has shape {tuple(got_logits.shape)}; the reference's is "
                          f"{want.shape}")
    got_logits = got_logits.reshape(want.shape)
    if not np.all(np.isfinite(got_logits)):
        findings.append({"kind": "non-finite", "message": f"{int(np.sum(~np.isfinite(got_logits)))} non-finite "
                                                          f"logit(s) on finite images"})

    ne = network_twin(cfg, params, dtype, device) if ensemble else None
    p_unit = _verdict.config.VERDICT_FALSE_ALARM / max(len(units), 1) / (2 if shadow else 1) / (2 if grad else 1)
    results: list[StageResult] = []
    prev = x
    with _progress(progress) as prog:
        task = prog.add_task(f"{reference}: units", total=len(units)) if prog is not None else None
        for k, u in enumerate(units):
            if prog is not None:
                prog.update(task, description=f"{reference}: {u}")
            xin = prev
            if u in run.inputs and k > 0:
                xin, _how = _as_layout(run.inputs[u], prev)
                xin = prev if xin is None else xin
            fn = (lambda prm, v, u=u: fam.run_unit(prm, u, v, cfg))
            r = fn(params, xin)
            # the unit's output: the next unit's input (whatever the network computes between the two submodules
            # belongs to this unit), else its submodule's output, the network's output, or located by value
            nxt = units[k + 1] if k + 1 < len(units) else None
            if nxt in run.inputs:
                raw_out, where = run.inputs[nxt], f"{mods[nxt]}:input"
            elif u in run.outputs:
                raw_out, where = run.outputs[u], f"{mods[u]}:output"
            elif nxt is None:
                raw_out, where = run.out, "the network's output"
            else:
                raw_out, where = None, None
            got, how = (None, "") if raw_out is None else _as_layout(raw_out, r)
            bound = fam.unit_bound(params, u, xin, cfg, dtype=dtype)
            if got is None and raw_out is None:
                pool = [(lbl, _to64(t)) for lbl, _tag, t in run.recorded if t.numel() == r.size]
                # the tensors within the unit's own bound (its evaluation in dtype, the reference's rounding) tie
                found = locate(pool, r, bound.array(dtype, r.shape))
                if found is not None and found[2] <= _config.VERIFY_LOCATE_GATE:
                    got, where = found[0], f"{found[1].split(':')[0]} (by value)"
            if got is None:
                results.append(StageResult(u, where, _verdict.DIVERGES, detail=(
                    f"observed at {where} with {how}" if raw_out is not None else
                    f"no submodule computes it and no tensor of the forward is within "
                    f"{_config.VERIFY_LOCATE_GATE:g} (relative) of the reference on the unit's own input")))
            else:
                where = (where or "") + (how or "")
                members = unit_members(ne, u, xin, r.shape) if ne is not None else None
                rep = _compare(got, r, bound, fn, (params, xin), dtype, u, p_unit, members)
                res = None
                if rep.verdict in (_verdict.INCONCLUSIVE, _verdict.DIVERGES) and u != "head":
                    res = _judge_parts(fam, params, cfg, u, xin, got, where, run, dtype, p_unit, rep, ne)
                    if rep.verdict == _verdict.DIVERGES:
                        res = _located(_result(u, where, got, r, bound, rep, dtype), res)
                parts = res.ensemble if res is not None else None
                results.append(res or _result(u, where, got, r, bound, rep, dtype))
                if ne is not None:
                    results[-1].ensemble = {**members_summary(rep, sorted(members or {})), **(parts or {})}
            wired = _wiring(fam, params, cfg, units, k, mods, run, xin, r, results[-1], dtype, p_unit)
            if wired is not None:
                wired[0].ensemble, wired[0].parts = results[-1].ensemble, results[-1].parts
                results[-1] = wired[0]
                findings.append(wired[1])
            prev = got if got is not None else r
            if prog is not None:
                prog.advance(task)

    _, lbound = fam.forward_bounds(params, x, cfg, dtype=dtype)
    lmembers = logits_members(ne, x, want.shape) if ne is not None else {}
    whole = _verdict.compare(got_logits, want, lbound, dtype,
                             naive=naive_same_precision(lambda prm, v: fam.forward(prm, v, cfg), params, x,
                                                        dtype=dtype), name="logits", ensemble=lmembers or None)
    verdict, first = _conclude(results, whole, got_logits, want)
    shadowed = (_shadow_units(module, fam, params, cfg, units, mods, run, x, taps, sizes, dtype, device, p_unit, ne)
                if shadow else None)
    verdict = _with_shadow(verdict, shadowed)
    gradients = None
    if grad:
        from .network_gradients import verify_network_gradients
        from .steps import _with_gradients
        gradients = verify_network_gradients(module, fam, cfg, params, mnaming.source, x, want, taps, lbound, dtype,
                                             device, call, seed, _verdict.config.VERDICT_FALSE_ALARM / 2)
        verdict = _with_gradients(verdict, gradients)
    cfg_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}
    return Report(
        verdict=verdict, reference=reference, preset=preset, dtype=dtype, config={**cfg_dict, "hw": list(image)},
        config_sources=fields, mapping=dict(naming.source), mapping_decisions=decisions, ignored_foreign_keys=list(
            (map or {}).get("ignore", [])), derived_buffers=sorted(set(naming.derived) | set(mnaming.derived)),
        whole_module={"verdict": whole.verdict, "max_relative_bound": float(whole.max_relative_bound),
                      "err_over_bound": float(whole.max_err_over_bound), "rel_err": _f(whole.rel_err),
                      "reasons": list(whole.reasons), "ensemble": members_summary(whole, sorted(lmembers))},
        stages=results, first_divergence=first, findings=findings, whole_module_text=str(whole),
        network={"family": fam.__name__, "units": units, "image_hw": list(image), "batch": int(batch),
                 "weights_naming": "random (init_params)" if weights is None else naming.naming,
                 "module_naming": mnaming.naming, "renames": dict(naming.renames),
                 "module_renames": dict(mnaming.renames), "observed_at": dict(mods)},
        shadow=shadowed, shadow_first_divergence=None if shadowed is None else _first(shadowed),
        gradients=gradients, ensemble=network_section(ne, dtype))

