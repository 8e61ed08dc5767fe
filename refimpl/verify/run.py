"""One verification: the foreign module run once with its stages observed, judged against the reference.

Layer: the verify tool (torch).  :func:`verify` is the whole procedure; each step is a function below, in the
order it runs: prepare (load, cast, infer the configuration, map the weights), run (hooks and the op recorder),
observe (the stage tensors from hooks, the wiring checks, the stages located by value), judge (the whole module
and each stage, teacher-forced, each against its bound and an ensemble that includes refimpl's twin of the
reference run under :mod:`refimpl.ensemble`'s variants: :mod:`.ensemble`), conclude (the verdict and the first
divergence).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from .. import bounds as _bounds, verdict as _verdict
from ..numerics import naive_same_precision, round_to
from .ensemble import members_summary, stage_members, twin_ensemble
from .loading import VerifyError, instantiate, load_target, load_weights
from .locate import locate, recorder, to_foreign
from .mapping import map_weights
from .registry import get_reference
from .report import Report, StageResult, _f
from .steps import (DTYPES, NOT_SHADOWED, _check_arguments, _check_grad, _conclude, _first, _precision_findings,
                    _to64, _torch_dtype, _with_gradients, _with_shadow)

__all__ = ["verify", "DTYPES"]

def _randomise(module: Any, rng: np.random.Generator) -> None:
    """Redraw every floating parameter (a zero-initialised positional encoding or scale would hide bugs):
    weights N(0, 1 / fan_in), LayerNorm-like vectors named weight 1 + N(0, 0.1^2), biases N(0, 0.1^2), every
    other parameter N(0, 0.5^2).  Buffers keep the values the module gave them (RoPE tables, running
    statistics)."""
    import torch
    with torch.no_grad():
        for name, t in module.named_parameters():
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


@dataclasses.dataclass
class _Run:
    """What one forward of the foreign module left behind."""

    out: Any                                        # its output tensor
    captured: dict[tuple[str, str, int], Any]       # (reference submodule, input/output, part) -> tensor
    recorded: list[tuple[str, Any]]                 # ("#i op", tensor) of the sizes a located stage can have
    other_dtypes: dict[Any, list[str]]              # dtype -> the ops that computed in it (not the one asked)
    #: foreign submodule -> (its positional arguments after the first, its keyword arguments) at its first call
    calls: dict[str, tuple[tuple, dict]] = dataclasses.field(default_factory=dict)


def _run(module: Any, x: np.ndarray, ref: Any, s: Any, wm: Any, dtype: str, device: str,
         call: Mapping[str, Any] | None) -> _Run:
    """One forward of the foreign module, with forward hooks on the submodules the mapping pairs with the
    reference's (their inputs and outputs) and a TorchFunctionMode that records every floating tensor the forward
    computes whose size a stage located by value can have, and every op computing in another precision."""
    import torch

    asked = _torch_dtype(dtype)
    xt = torch.from_numpy(x).to(device=device, dtype=asked)
    args, kwargs = ref.call(s, call)
    # arrays the reference passes to the forward (Swin's shift mask for pre-windowed input): in the asked dtype
    kwargs = {k: torch.from_numpy(v).to(device=device, dtype=asked) if isinstance(v, np.ndarray) else v
              for k, v in kwargs.items()}
    subs = dict(module.named_modules())
    run = _Run(None, {}, [], {})
    handles = []
    wanted = {(p.ref_module, p.where) for p in list(s.points.values()) + [w.point for w in s.wires]}
    for ref_mod, where in wanted:
        fmods = (wm.modules.get(ref_mod) or "").split("+")        # "+": the parts of a joined projection
        if not all(f in subs for f in fmods):
            continue
        for i, fmod in enumerate(fmods if where == "output" else fmods[:1]):

            def hook(_m, inp, kw, out, key=(ref_mod, where, i), fmod=fmod):
                t = (inp[0] if inp else None) if key[1] == "input" else (out[0] if isinstance(out, tuple) else out)
                if isinstance(t, torch.Tensor) and key not in run.captured:
                    run.captured[key] = t.detach()
                run.calls.setdefault(fmod, (tuple(inp[1:]), dict(kw or {})))
            handles.append(subs[fmod].register_forward_hook(hook, with_kwargs=True))
    sizes = {int(np.prod(v)) for v in ref.value_shapes(s, x)}

    try:
        with torch.no_grad(), recorder(asked, sizes, run.recorded, run.other_dtypes):
            out = module(xt, *args, **kwargs)
    except Exception as exc:
        raise VerifyError(f"the module's forward raised {type(exc).__name__}: {exc} (called as forward(x, *{args},"
                          f" **{kwargs}); set the call with --call)") from exc
    finally:
        for h in handles:
            h.remove()
    run.out = out[0] if isinstance(out, (tuple, list)) else out
    return run


def _observe(run: _Run, x: np.ndarray, s: Any, wm: Any) -> tuple[dict, dict, dict]:
    """(stage tensors, where each was observed, wiring divergences): the hooked tensors in the reference's
    stage names (a fused projection's rows, a joined projection's parts), and for each wire whether the
    submodule computing a stage received its predecessor stage's output."""
    tensors: dict[str, np.ndarray] = {"x": x}
    seen: dict[str, str] = {"x": "input"}
    for name, p in s.points.items():
        n_parts = len((wm.modules.get(p.ref_module) or "").split("+")) if p.where == "output" else 1
        parts = [run.captured.get((p.ref_module, p.where, i)) for i in range(n_parts)]
        if any(t is None for t in parts):
            continue
        t = np.concatenate([_to64(t) for t in parts], axis=-1)
        if p.rows is not None:
            t = t[..., p.rows[0]:p.rows[1]]
        tensors[name] = t
        seen[name] = f"{wm.modules[p.ref_module]}:{p.where}" + (f"[{p.rows[0]}:{p.rows[1]}]" if p.rows else "")
    wiring: dict[str, str] = {}
    for w in s.wires:
        t = run.captured.get((w.point.ref_module, w.point.where, 0))
        if t is None or w.producer not in tensors:
            continue
        expect = w.transform(tensors[w.producer])
        t = _to64(t)
        if t.shape != expect.shape or not np.array_equal(t, expect):
            diff = (f"(max difference {float(np.max(np.abs(t - expect))):.3g})" if t.shape == expect.shape else
                    f"(shape {t.shape}, expected {expect.shape})")
            wiring[w.stage] = f"its input is not the output of stage {w.producer!r} {diff}"
    return tensors, seen, wiring


def _locate_stages(stage_list: list, value_stages: tuple, run: _Run, tensors: dict, seen: dict,
                   dtype: str) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Locate by value, in the forward's recorded tensors, each stage with no submodule of its own (its
    reference evaluated on the module's own inputs to it), and read hooked tensors of another layout in the
    reference's.  Data flow: a stage's tensor is searched after those of its inputs (with one token the
    attention output equals V, which must not be taken for it).  Returns (stage -> why it was not found,
    stage -> its reference on the module's inputs, for the judgement)."""
    pool = [(label, _to64(t)) for label, t in run.recorded]
    gate = _verdict.config.VERIFY_LOCATE_GATE
    order: dict[str, int] = {}
    unlocated: dict[str, str] = {}
    refs: dict[str, np.ndarray] = {}
    for st in stage_list:
        if not all(k in tensors for k in st.inputs):
            continue
        a = [tensors[k] for k in st.inputs]
        r = refs[st.name] = st.reference(*a)
        if st.name in value_stages and st.name not in tensors:
            after = max([order[k] for k in st.inputs if k in order], default=-1)
            # the tensors the stage's own bound allows (its evaluation in dtype and the reference's rounding) tie
            found = locate(pool[after + 1:], r, st.bound(*a, dtype=dtype).array(dtype, r.shape))
            if found is not None and found[2] <= gate:
                tensors[st.name], seen[st.name] = found[0], f"{found[1].split(':')[0]} (by value)"
                order[st.name] = after + 1 + found[3]
            else:
                unlocated[st.name] = (f"no tensor of the forward is within {gate:g} (relative) of the reference "
                                      "computed from the module's own inputs to this stage" +
                                      ("" if found is None else f" (closest: {found[1]}, {found[2]:.3g})"))
        elif st.name in tensors and tensors[st.name].shape != np.shape(r):
            found = locate([(seen[st.name], tensors[st.name])], r)     # a hooked tensor in another layout
            if found is not None:
                tensors[st.name] = found[0]
                seen[st.name] += f" ({found[1].split(': ', 1)[1]})"
    return unlocated, refs


def _judged(st: Any, where: str | None, got: np.ndarray, r: np.ndarray, a: list[np.ndarray], dtype: str,
            p_stage: float, ensemble: Mapping[str, np.ndarray] | None = None) -> StageResult:
    """The stage ``st`` computed as ``got`` from the inputs ``a`` against its reference ``r`` on them and its bound
    in ``dtype``; ``ensemble``: the twin's teacher-forced members of the stage (:mod:`.ensemble`), besides the NumPy
    naive run in ``dtype``."""
    bound = st.bound(*a, dtype=dtype)
    rep = _verdict.compare(got, r, bound, dtype, naive=naive_same_precision(st.reference, *a, dtype=dtype),
                           ensemble=ensemble or None, name=st.name, p_false_alarm=p_stage)
    detail = "" if rep.verdict == _verdict.MATCH else "; ".join(rep.reasons)
    if detail and got.shape == r.shape and not np.any(np.asarray(bound.scale)):
        # an exact stage (data movement: padding, a roll, a window partition): say which element moved wrongly
        bad = got != r
        i = tuple(int(t) for t in np.argwhere(bad)[0]) if bad.any() else None
        if i is not None:
            detail = (f"an exact stage ({bound.note}) differs in {int(bad.sum())} of {bad.size} elements, first at "
                      f"{i}: got {got[i]:.6g}, expected {r[i]:.6g}; " + detail)
    return StageResult(
        st.name, where, rep.verdict, max_abs_err=float(np.max(np.abs(got - r), initial=0.0)),
        max_rel_err=rep.rel_err, bound=float(np.max(_verdict._nan_to_inf(bound.array(dtype, r.shape)), initial=0.0)),
        err_over_bound=rep.max_err_over_bound, detail=detail,
        ensemble=members_summary(rep, sorted(ensemble or {})))


def _judge_stages(stage_list: list, tensors: dict, seen: dict, wiring: dict, unlocated: dict,
                  refs: dict[str, np.ndarray], dtype: str, p_stage: float,
                  ensembles: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> list[StageResult]:
    """Each stage teacher-forced: its reference on the module's own inputs to it, against its bound in
    ``dtype``, with the false-alarm probability ``p_stage`` each; ``ensembles``: stage -> the twin's
    teacher-forced members (:func:`.ensemble.stage_members`)."""
    results: list[StageResult] = []
    for st in stage_list:
        where = seen.get(st.name)
        if st.name in wiring:
            results.append(StageResult(st.name, where, _verdict.DIVERGES, detail=wiring[st.name]))
            continue
        if st.name in unlocated:
            results.append(StageResult(st.name, None, _verdict.DIVERGES, detail=unlocated[st.name]))
            continue
        missing = [k for k in (st.name,) + tuple(st.inputs) if k not in tensors]
        if missing:
            results.append(StageResult(st.name, where, "not observed",
                                       detail=f"tensor(s) {missing} not observed in the module"))
            continue
        a = [tensors[k] for k in st.inputs]
        r = refs[st.name] if st.name in refs else st.reference(*a)
        results.append(_judged(st, where, tensors[st.name], r, a, dtype, p_stage, (ensembles or {}).get(st.name)))
    return results


def _shadow_stages(module: Any, run: _Run, stage_list: list, x: np.ndarray, s: Any, wm: Any, refs: dict,
                   dtype: str, device: str, p_stage: float) -> list[StageResult]:
    """Shadow mode: each foreign submodule the mapping pairs with a reference submodule whose input is a stage
    tensor (a point at its input, or the producer of a wire into it) and whose output is a stage reading exactly
    that tensor, called on the reference's own value of that tensor (the reference chained from ``x`` in float64,
    rounded to ``dtype``, in the layout the submodule received in the tested run), its output judged against the
    stage's reference on the same rounded value and the stage's bound: an error is located without propagation
    (torch.ao.ns's shadow mode).  One :class:`StageResult` per stage (``"not shadowed"`` with the reason where the
    stage has no such submodule)."""
    import torch

    asked = _torch_dtype(dtype)
    subs = dict(module.named_modules())
    own: dict[str, np.ndarray] = {"x": x}                    # the reference's own value of every stage
    for st in stage_list:
        if all(k in own for k in st.inputs):
            own[st.name] = st.reference(*[own[k] for k in st.inputs])
    feeds: dict[str, tuple[str, Any]] = {}                   # reference submodule -> (its input's stage, transform)
    for name, p in s.points.items():
        if p.where == "input":
            feeds.setdefault(p.ref_module, (name, None))
    for w in s.wires:
        feeds.setdefault(w.point.ref_module, (w.producer, w.transform))
    outs: dict[str, np.ndarray] = {}
    results: list[StageResult] = []
    for st in stage_list:
        p = s.points.get(st.name)
        fmods = (wm.modules.get(p.ref_module) or "").split("+") if p is not None else []
        why = ("located by value: no submodule computes it" if p is None else
               f"observed at the input of {wm.modules.get(p.ref_module)}: no submodule computes it"
               if p.where != "output" else
               f"no submodule of the module is mapped to the reference's {p.ref_module!r}" if not fmods[0] else
               f"the input of {wm.modules[p.ref_module]} is not a stage of the reference"
               if p.ref_module not in feeds else
               f"{wm.modules[p.ref_module]} was not called in the tested run"
               if (p.ref_module, "input", 0) not in run.captured or not all(f in subs for f in fmods) else
               f"the stage reads {list(st.inputs)}, its submodule one tensor ({feeds[p.ref_module][0]!r})"
               if tuple(st.inputs) != (feeds[p.ref_module][0],) or st.inputs[0] not in own else "")
        if why:
            results.append(StageResult(st.name, None, NOT_SHADOWED, detail=why))
            continue
        producer, transform = feeds[p.ref_module]
        a = [round_to(own[producer], dtype)]
        where = f"{wm.modules[p.ref_module]}(reference's {producer!r})"
        if p.ref_module not in outs:
            value = a[0] if transform is None else transform(a[0])
            fin = _to64(run.captured[(p.ref_module, "input", 0)])
            fed = to_foreign(value, fin, refs.get(producer, value) if transform is None else value)
            if fed is None:
                results.append(StageResult(st.name, None, NOT_SHADOWED, detail=(
                    f"{wm.modules[p.ref_module]} received shape {fin.shape}; the reference's {producer!r} has "
                    f"{value.shape}")))
                continue
            t_in = torch.from_numpy(np.ascontiguousarray(fed)).to(device=device, dtype=asked)
            parts = []
            try:
                with torch.no_grad():
                    for f in fmods:
                        rest, kw = run.calls.get(f, ((), {}))
                        o = subs[f](t_in, *rest, **kw)
                        parts.append(_to64(o[0] if isinstance(o, (tuple, list)) else o))
            except Exception as exc:
                raise VerifyError(f"shadow: {'+'.join(fmods)} raised {type(exc).__name__} on the reference's "
                                  f"{producer!r}: {exc}") from exc
            outs[p.ref_module] = np.concatenate(parts, axis=-1)
        got = outs[p.ref_module]
        if p.rows is not None:
            got = got[..., p.rows[0]:p.rows[1]]
        r = st.reference(*a)
        if got.shape != r.shape:
            found = locate([(where, got)], r)
            if found is None:
                results.append(StageResult(st.name, where, _verdict.DIVERGES, detail=(
                    f"shadow output of shape {got.shape}; the reference's {r.shape}")))
                continue
            got = found[0]
        results.append(_judged(st, where, got, r, a, dtype, p_stage))
    return results


def verify(module: Any, reference: str, *, preset: str | None = None, config: Mapping[str, Any] | None = None,
           init: Mapping[str, Any] | None = None, weights: Any = None, map: Mapping[str, Any] | None = None,
           input: Any = None, hw: tuple[int, int] | None = None, batch: int | None = None, dtype: str = "float32",
           device: str = "cpu", seed: int = 0, call: Mapping[str, Any] | None = None,
           progress: bool = False, shadow: bool = False, grad: bool = False, ensemble: bool = True,
           conv_algorithms: Sequence[str] | None = None) -> Report:
    """Verify ``module`` (an ``nn.Module``, or a class / factory called with ``init``, or a ``"pkg.mod:Name"`` /
    ``"file.py:Name"`` string) against the registered reference ``reference`` (``REFERENCES``), or against a
    registered network (a ``refimpl.models`` name such as ``"ravlt_t"``: unit by unit, see
    :func:`refimpl.verify.networks.verify_network`; ``hw`` is then the image size, ``batch`` defaults to 1,
    ``progress`` shows a progress bar over the units).

    preset : the reference preset the configuration starts from ("paper", "official"); None: the reference's
        default (``official`` where the paper's code is released, ``paper`` for LiSA, which has none).
    config : reference configuration fields that override inference and preset.
    weights : a path (.safetensors, .npz, .pt/.pth with weights_only) or a dict of arrays, loaded strictly into
        the module; None redraws every floating tensor from ``seed``.
    map : weight-mapping overrides ``{"rename": {foreign: reference}, "ignore": [foreign]}``.
    input : the input array (the reference's layout); None draws N(0, 1) from ``seed``.
    hw : the token grid (H, W); inferred where the module fixes it (a positional encoding).
    dtype : the precision the module is run in ("float64", "float32", "float16", "bfloat16").
    call : keyword arguments of the foreign forward ("$H", "$W", "$HW" are substituted); None: the reference's
        default call (``forward(x, H, W)`` for FLatten).
    shadow : also run each foreign submodule that computes a stage on the reference's own input to it (rounded
        to ``dtype``) and judge its output against the stage (:func:`_shadow_stages`; for a network, each unit's
        submodule on the reference's input to the unit): the report's ``shadow`` column and
        ``shadow_first_divergence``; a shadow divergence makes the verdict "diverges".  The false-alarm budget is
        then split between the two runs.
    grad : also compare the module's input gradient and parameter gradients for a random cotangent (drawn from
        ``seed``, rounded to ``dtype``) with those of refimpl's float64 PyTorch twin of the reference, after
        checking that the twin's forward matches the NumPy reference (:mod:`refimpl.verify.gradients`; the
        report's ``gradients``; a diverging gradient makes the verdict "diverges").  For a registered network the
        twin is the network's (:mod:`refimpl.verify.network_gradients`); the twins
        ship with the package (:mod:`refimpl.twins`).  The false-alarm budget is then split between the
        forward and the gradients.
    ensemble : judge the whole module and each stage against an ensemble of legitimate evaluations that includes
        refimpl's PyTorch twin of the reference, loaded with the module's mapped weights in ``dtype`` and run
        plainly and under every variant of :data:`refimpl.ensemble.DEFAULT_VARIANTS` (per stage teacher-forced on
        the module's own stage tensors; :mod:`refimpl.verify.ensemble`; the report's ``ensemble``).  False: the
        NumPy naive run in ``dtype`` and the verdict's random-rounding model only (faster, looser; ``--no-ensemble``).
        Where no twin covers the reference or its configuration, the report says so and the latter ensemble is used.
        For a registered network: each unit against the network's twin run teacher-forced on the unit's input.

    conv_algorithms : the convolution algorithms besides a direct one that the bounds must cover
        (:func:`refimpl.bounds.covering_conv_algorithms`: "winograd", "fft"; their errors are 10^2 - 10^5 times a
        direct convolution's, so the bounds of the stages they apply to widen as much).  None: what the run may
        take - both on CUDA (cuDNN) and, for float32 convolutions of batch >= config.NNPACK_MIN_BATCH, on a CPU
        whose PyTorch has oneDNN off and NNPACK on (NNPACK's Winograd and FFT tiles), none otherwise; a finding
        names them.  () for direct convolutions only.

    Raises :class:`VerifyError` for any usage, loading or mapping problem (the message names it)."""
    algorithms, min_batch = _conv_algorithms(conv_algorithms, device, dtype)
    with _bounds.covering_conv_algorithms(*algorithms, min_batch=min_batch):
        report = _verify(module, reference, preset=preset, config=config, init=init, weights=weights, map=map,
                         input=input, hw=hw, batch=batch, dtype=dtype, device=device, seed=seed, call=call,
                         progress=progress, shadow=shadow, grad=grad, ensemble=ensemble)
    if algorithms:
        report.findings.append({"kind": "note", "message": (
            f"the convolution bounds cover {' and '.join(algorithms)} besides direct evaluation"
            + (f" for inputs of batch >= {min_batch} " if min_batch > 1 else " ") +
            f"({'given' if conv_algorithms is not None else 'what this ' + device + ' run may take'}): the "
            "convolution stages are checked only to those algorithms' accuracy (refimpl.bounds.conv_algorithms)")})
    return report


def _conv_algorithms(asked: Sequence[str] | None, device: str, dtype: str) -> tuple[tuple[str, ...], int]:
    """(algorithms, smallest batch) :func:`verify` covers (its ``conv_algorithms``; given ones at any batch)."""
    if asked is not None:
        if isinstance(asked, str) or any(a not in _bounds.CONV_ALGORITHMS for a in asked):
            raise VerifyError(f"argument 'conv_algorithms': expected a sequence of {_bounds.CONV_ALGORITHMS[1:]}, "
                              f"got {asked!r}")
        return tuple(a for a in asked if a != "direct"), 1
    if device == "cuda":
        return ("winograd", "fft"), 1
    from ..ensemble import nnpack_may_run

    return (("winograd", "fft"), _verdict.config.NNPACK_MIN_BATCH) if nnpack_may_run(dtype) else ((), 1)


def _verify(module: Any, reference: str, *, preset: str | None = None, config: Mapping[str, Any] | None = None,
           init: Mapping[str, Any] | None = None, weights: Any = None, map: Mapping[str, Any] | None = None,
           input: Any = None, hw: tuple[int, int] | None = None, batch: int | None = None, dtype: str = "float32",
           device: str = "cpu", seed: int = 0, call: Mapping[str, Any] | None = None,
           progress: bool = False, shadow: bool = False, grad: bool = False, ensemble: bool = True) -> Report:
    """The body of :func:`verify`."""
    from .networks import is_network, verify_network
    _check_grad(grad)                   # a registered network's gradients: verify_network(grad=True)
    if not isinstance(ensemble, bool):
        raise VerifyError(f"argument 'ensemble': expected True or False, got {ensemble!r}")
    if is_network(reference):
        report = verify_network(module, reference, preset=preset, config=config, init=init, weights=weights, map=map,
                                input=input, hw=hw, batch=batch, dtype=dtype, device=device, seed=seed, call=call,
                                progress=progress, shadow=shadow, grad=grad, ensemble=ensemble)
        return report
    batch = 2 if batch is None else batch
    _check_arguments(dtype, batch, seed, hw, device)
    ref = get_reference(reference)
    preset = ref.default_preset if preset is None else preset
    # prepare: the module in dtype, its parameters read back (exactly what it computes with), the configuration,
    # the mapping onto the reference's keys
    module = instantiate(load_target(module) if isinstance(module, str) else module, init)
    rng = np.random.default_rng(seed)
    if weights is None:
        _randomise(module, rng)
    else:
        _load_into(module, load_weights(weights) if isinstance(weights, str) else weights)
    module = module.to(device=device, dtype=_torch_dtype(dtype)).eval()
    state = {k: _to64(v) if v.is_floating_point() else v.detach().cpu().numpy()
             for k, v in module.state_dict().items()}
    s = ref.setup(module, state, preset, config or {}, hw)
    wm = map_weights(state, s.shapes, aliases=ref.aliases, fused=ref.fused, joined=ref.joined, user_map=map,
                     buffers=[k for k, _ in module.named_buffers()])
    params = wm.values
    if grad and getattr(s, "no_twin", ""):
        raise VerifyError(f"argument 'grad': {s.no_twin} (verify the forward without --grad)")
    x = round_to(ref.draw_input(s, batch, rng) if input is None else np.asarray(input, dtype=np.float64), dtype)

    run = _run(module, x, ref, s, wm, dtype, device, call)
    findings = _precision_findings(run, dtype) + ref.derived_findings(s, state, wm.derived)
    want = ref.forward(x, params, s)
    try:                                # the output as the reference's (the pre-windowed layout: the grid)
        out = ref.output_view(s, run.out)
    except (RuntimeError, ValueError):
        out = run.out
    if tuple(out.shape) != want.shape:
        raise VerifyError(f"the module's output has shape {tuple(run.out.shape)}; the reference's is {want.shape} "
                          f"(layout {s.hw}, input {x.shape})")
    got = _to64(out)
    if not np.all(np.isfinite(got)):
        findings.append({"kind": "non-finite", "message": f"{int(np.sum(~np.isfinite(got)))} non-finite output "
                                                          f"element(s) on finite input"})
    budget = _verdict.config.VERDICT_FALSE_ALARM / (2 if grad else 1)
    fwd_bound = ref.bound(x, params, s, dtype)
    te = twin_ensemble(ref, s, params, x, want.shape, dtype, device) if ensemble else None
    members = te.outputs if te is not None else {}
    whole = _verdict.compare(got, want, fwd_bound, dtype,
                             naive=naive_same_precision(ref.forward, x, params, s, dtype=dtype), name="output",
                             ensemble=members or None, p_false_alarm=budget)

    stage_list = ref.stages(params, s)
    tensors, seen, wiring = _observe(run, x, s, wm)
    unlocated, refs = _locate_stages(stage_list, ref.value_stages, run, tensors, seen, dtype)
    p_stage = budget / max(len(stage_list), 1) / (2 if shadow else 1)
    stage_ens = stage_members(te, s, stage_list, tensors, dtype, device) if te is not None else {}
    results = _judge_stages(stage_list, tensors, seen, wiring, unlocated, refs, dtype, p_stage, stage_ens)
    verdict, first = _conclude(results, whole, got, want)
    shadowed = _shadow_stages(module, run, stage_list, x, s, wm, refs, dtype, device, p_stage) if shadow else None
    verdict = _with_shadow(verdict, shadowed)
    gradients = None
    if grad:
        from .gradients import verify_gradients
        gradients = verify_gradients(module, x, ref, s, wm, state, map, call, dtype, device, seed, want, fwd_bound,
                                     budget)
        verdict = _with_gradients(verdict, gradients)

    preset_cfg = dataclasses.asdict(ref.preset_config(preset, s))
    diffs = {k: v for k, v in dataclasses.asdict(s.cfg).items() if preset_cfg.get(k) != v and k not in ref.structural}
    if diffs:
        findings.append({"kind": "config", "message": f"{preset} preset except " + ", ".join(
            f"{k} = {v!r} ({s.fields.get(k, '')})" for k, v in diffs.items())})
    return Report(
        verdict=verdict, reference=ref.name, preset=preset, dtype=dtype,
        config={**dataclasses.asdict(s.cfg), **s.extra, "hw": list(s.hw)}, config_sources=s.fields,
        mapping=wm.source,
        mapping_decisions=wm.decisions, ignored_foreign_keys=wm.ignored, derived_buffers=wm.derived,
        whole_module={"verdict": whole.verdict, "max_relative_bound": float(whole.max_relative_bound),
                      "err_over_bound": float(whole.max_err_over_bound), "rel_err": _f(whole.rel_err),
                      "reasons": list(whole.reasons), "ensemble": members_summary(whole, sorted(members))},
        stages=results, first_divergence=first, findings=findings, whole_module_text=str(whole),
        shadow=shadowed, shadow_first_divergence=None if shadowed is None else _first(shadowed),
        gradients=gradients, ensemble=_ensemble_section(te, dtype))


def _ensemble_section(te: Any, dtype: str) -> dict[str, Any]:
    """The report's ``ensemble``: whether the twin's members were used, which, what failed, what it cost, and the
    stages left without teacher-forced members."""
    if te is None:
        return {"torch": False, "why": "not asked for (--no-ensemble / ensemble=False): the NumPy naive run in "
                f"{dtype} and the random-rounding model only"}
    out = {"torch": te.ran, "twin": te.twin or None, "why": te.why or None, "members": sorted(te.outputs),
           "failed": dict(te.failed), "seconds": round(te.seconds, 3),
           "stages_without_members": dict(te.stage_notes)}
    if not te.ran:
        out["why"] = (te.why + f": the ensemble is the NumPy naive run in {dtype} and the random-rounding model")
    return out
