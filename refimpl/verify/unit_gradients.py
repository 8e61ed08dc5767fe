"""Gradient verification of a registered network unit by unit, teacher-forced: each unit's backward judged on
the foreign network's own input to the unit and the cotangent that reached its output in the foreign backward,
the way :mod:`refimpl.verify.networks` judges each unit's forward.

Layer: the verify tool (torch).  :func:`foreign_backward` is the foreign network's one gradient run (its input
and parameter gradients, and the values and gradients at the units' boundaries); :func:`judge_units` is what
:func:`refimpl.verify.network_gradients.verify_network_gradients` adds to the whole-network judgement.  What
happens (docs/verify.md, "Gradients"), for each unit u of the family's ``unit_names``:

1. the boundaries: unit u's input x_u is the foreign input to the submodule computing u (the images for the
   stem; the previous unit's output where u has no submodule), its output the next unit's input (the logits
   for the head), as the forward's units are observed; a tensor hook on each captures the gradient reaching it
   in the foreign backward for L = <g, logits>: g_u at u's output, dL/dx_u at its input; both are read in the
   reference's layout by the reading (axes order, reshape) that makes the values the reference's;
2. the reference: the float64 twin's unit (``run_unit(u, x_u)``) differentiated with the cotangent g_u: dL/dx_u
   and the gradients of the unit's parameters (the twin's parameters that receive one from that unit);
3. the bound: :class:`refimpl.verify.gradients.GradientBound` on the magnitudes of the unit's backward terms,
   with the unit's own forward relative bound as rho: ``F_bwd (rho_T + rho_64)``, rho_dt the family's
   ``unit_bound`` on x_u in dt over the unit's largest output magnitude (not the whole network's: a unit's is
   conclusive where the logits' is void at depth); the ensemble is the twin's unit in T on (x_u, g_u);
4. the unit's verdict is its tensors' (:func:`refimpl.verify.gradients.judge_tensors`, the unit's share of the
   false-alarm budget split evenly between its tensors); the units' budget is split evenly between the units
   (union bound, as :func:`refimpl.verdict.compare_stages` does);
5. part by part (``fam.unit_parts``, the twin's ``run_unit_part``): a unit whose own bound is void for its
   gradients takes its parts' verdict; a unit that diverges as a whole keeps its verdict, and its parts, judged
   the same way, locate the bug inside it (the first diverging part in its ``why`` and in the first divergence's
   ``part``; where every part matches, the divergence lies in how the parts compose).

A parameter that more than one unit uses (its foreign gradient sums over them) is not compared unit-wise; the
foreign parameter gradients are those of the whole run (a unit's parameters receive a gradient only from it).
"""

from __future__ import annotations

import copy
from typing import Any, Collection, Mapping

import numpy as np

from .. import config
from .. import verdict as _verdict
from ..numerics import round_to
from .gradients import _magnitudes, backward_pass, forward_relative_bound, judge_tensors
from .locate import layouts
from .report import _f
from .steps import _to64, _torch_dtype

__all__ = ["foreign_backward", "judge_units"]


def foreign_backward(module: Any, x: np.ndarray, g: np.ndarray, units: list[str], mods: Mapping[str, str],
                     dtype: str, device: str, call: Mapping[str, Any] | None, inner: Collection[str] = ()
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, tuple]]:
    """(dL/dx, dL/dtheta in the module's parameter names, boundaries) of the foreign network ``module`` in
    ``dtype`` for L = <g, logits>.  boundaries: unit -> (x_u, dL/dx_u, y_u, g_u, within) as float64 arrays in the
    foreign layout (None where the tensor was not observed or received no gradient), ``within`` the tensors the
    units named in ``inner`` (those with parts) computed of their input's size, in order, as ("#i op", value,
    gradient or None) (an empty list for the other units): where a part's input is located by value, and the
    gradient that reached it.  ``mods``: unit -> the foreign submodule computing it.  Every floating parameter is
    made to require a gradient for the run, then restored."""
    import torch
    from torch.overrides import TorchFunctionMode
    subs = dict(module.named_modules())
    seen_in: dict[str, Any] = {}
    seen_out: dict[str, Any] = {}
    grads: dict[int, Any] = {}
    handles = []
    inside: list[Any] = [None]                       # (unit, its input's size) while a unit of ``inner`` runs
    within: dict[str, list] = {u: [] for u in units}

    class _Within(TorchFunctionMode):
        """Every floating tensor that needs a gradient, of the running unit's input size, computed in it."""

        def __torch_function__(self, func, types, args_=(), kwargs_=None):
            """Run ``func``; keep (and watch) its outputs of interest."""
            res = func(*args_, **(kwargs_ or {}))
            if inside[0] is not None:
                u, size = inside[0]
                for t in (res if isinstance(res, (tuple, list)) else (res,)):
                    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad \
                            and t.numel() == size:
                        within[u].append((f"#{len(within[u])} {getattr(func, '__name__', func)}", t))
                        watch(t)
            return res

    def watch(t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in grads:
            grads[id(t)] = None

            def keep(gr, key=id(t)):
                grads[key] = gr.detach() if grads[key] is None else grads[key] + gr.detach()
            t.register_hook(keep)
    for u, path in mods.items():
        def pre(_m, inp, u=u):
            if u not in seen_in and inp and isinstance(inp[0], torch.Tensor):
                seen_in[u] = inp[0]
                watch(inp[0])
                if u in inner:
                    inside[0] = (u, inp[0].numel())

        def post(_m, _inp, out, u=u):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if inside[0] is not None and inside[0][0] == u:
                inside[0] = None
            if u not in seen_out and isinstance(t, torch.Tensor):
                seen_out[u] = t
                watch(t)
        handles.append(subs[path].register_forward_pre_hook(pre))
        handles.append(subs[path].register_forward_hook(post))
    try:
        with _Within():
            xt, out, dx, fgrads = backward_pass(module, lambda t: module(t, **dict(call or {})), x, g, dtype,
                                                device, "the network", f"the logits {tuple(g.shape)}", reshape=True)
    finally:
        for h in handles:
            h.remove()

    def pair(t: Any) -> tuple[Any, Any]:
        if t is None:
            return None, None
        gr = grads.get(id(t))
        return _to64(t.detach()), (None if gr is None else _to64(gr))
    bounds: dict[str, tuple] = {}
    for k, u in enumerate(units):
        if k == 0:
            xin, dxin = _to64(xt.detach()), dx
        else:
            xin, dxin = pair(seen_in.get(u, seen_out.get(units[k - 1])))
        if k == len(units) - 1:
            yout, gout = _to64(out.detach()), np.asarray(g, dtype=np.float64)
        else:
            nxt = units[k + 1]
            yout, gout = pair(seen_in[nxt] if nxt in seen_in else seen_out.get(u))
        bounds[u] = (xin, dxin, yout, gout, [(label,) + pair(t) for label, t in within[u]])
    return dx, fgrads, bounds


def _reading(f: np.ndarray, like: np.ndarray) -> str | None:
    """The layout reading (:func:`refimpl.verify.locate.layouts`' label) that brings the foreign value ``f``
    closest to the reference's ``like``; "" where the shapes agree; None where no reading has its size."""
    if f.shape == like.shape:
        return ""
    nr = float(np.sqrt(np.sum(like ** 2))) or 1.0
    best = None
    for arr, how in layouts(f, like.shape):
        d = float(np.sqrt(np.sum((arr - like) ** 2))) / nr
        if best is None or d < best[1]:
            best = (how, d)
    return None if best is None else best[0]


def _read(f: np.ndarray, shape: tuple, how: str) -> np.ndarray:
    """``f`` (a foreign gradient) read in the reference's ``shape`` by the reading ``how`` of its value."""
    if how == "":
        return f.reshape(shape)
    return next(arr for arr, h in layouts(f, shape) if h == how)


def _twin_grads(m: Any, run: Any, x: np.ndarray, g: np.ndarray, keys: list[str] | None, dtype: str
                ) -> tuple[np.ndarray, dict[str, np.ndarray], Any, Any, Any]:
    """The twin ``m`` run as ``run(m, x)`` (a unit or a part of one) differentiated in ``dtype`` at ``x`` with
    cotangent ``g`` (reference layout): (dL/dx, parameter name -> gradient (only those that received one;
    ``keys``: those, zeros where none), output, the input leaf, the cotangent tensor)."""
    import torch
    dt = _torch_dtype(dtype)
    tp = dict(m.named_parameters())
    names = sorted(tp) if keys is None else keys
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(dtype=dt).requires_grad_(True)
    with torch.enable_grad():
        y = run(m, xt)
        gt = torch.from_numpy(np.ascontiguousarray(g).reshape(tuple(y.shape))).to(dtype=dt)
        rg = torch.autograd.grad(y, [xt] + [tp[k] for k in names], gt, allow_unused=True)
    if keys is None:
        out = {k: _to64(t) for k, t in zip(names, rg[1:]) if t is not None}
    else:
        out = {k: (_to64(t) if t is not None else np.zeros(tuple(tp[k].shape))) for k, t in zip(names, rg[1:])}
    return (_to64(rg[0]) if rg[0] is not None else np.zeros(x.shape)), out, y.detach(), xt.detach(), gt


def _twin_unit_grads(m: Any, u: str, x: np.ndarray, g: np.ndarray, keys: list[str] | None, dtype: str
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], Any, Any, Any]:
    """:func:`_twin_grads` of the twin's unit ``u``."""
    return _twin_grads(m, lambda mod, t: mod.run_unit(u, t), x, g, keys, dtype)


def judge_units(twin: Any, fam: Any, cfg: Any, params: Mapping[str, np.ndarray], source: Mapping[str, str],
                fgrads: Mapping[str, np.ndarray], bounds: Mapping[str, tuple], x: np.ndarray,
                taps: Mapping[str, np.ndarray], dtype: str, p_false_alarm: float) -> dict[str, Any]:
    """The unit-wise judgement (module docstring): {"verdict", "units": [per unit: verdict, worst tensor,
    err/bound, the unit's forward relative bound, diverging tensors, reason], "first_divergence"}.  ``twin``: the
    float64 twin (checked); ``fgrads``: the foreign parameter gradients (foreign keys); ``bounds``: from
    :func:`foreign_backward`; ``taps``: the reference's unit values on ``x`` (for the layout readings)."""
    units = list(fam.unit_names(cfg))
    p_unit = p_false_alarm / max(len(units), 1)
    member_net = None
    if dtype != "float64":
        member_net = copy.deepcopy(twin).to(dtype=_torch_dtype(dtype))
    # pass 1: each unit's inputs in the reference layout and the twin's float64 backward on them
    prep: dict[str, Any] = {}
    owners: dict[str, list[str]] = {}
    for k, u in enumerate(units):
        xin, dxin, yout, gout, _ = bounds.get(u, (None,) * 4 + ([],))
        like_in = x if k == 0 else taps.get(units[k - 1])
        miss = ("the unit's input was not observed" if xin is None or like_in is None else
                "no gradient reached the unit's input" if dxin is None else
                "the unit's output was not observed or received no gradient" if yout is None or gout is None else "")
        how_in = None if miss else _reading(xin, like_in)
        if not miss and how_in is None:
            miss = f"the unit's input has shape {xin.shape}, the reference's {like_in.shape}"
        if miss:
            prep[u] = miss
            continue
        xu = _read(xin, like_in.shape, how_in)
        r = fam.run_unit(params, u, xu, cfg)
        how_out = _reading(yout, r)
        if how_out is None:
            prep[u] = f"the unit's output has shape {yout.shape}, the reference's {r.shape}"
            continue
        gu = _read(gout, r.shape, how_out)
        rdx, rg, y64, x64, g64 = _twin_unit_grads(twin, u, xu, gu, None, "float64")
        for key in rg:
            owners.setdefault(key, []).append(u)
        prep[u] = (xu, _read(dxin, like_in.shape, how_in), r, gu, rdx, rg, x64, g64)
    entries: list[dict[str, Any]] = []
    verdicts: list[str] = []
    first = None
    tp = dict(twin.named_parameters())
    for u in units:
        item = prep[u]
        if isinstance(item, str):
            entries.append({"unit": u, "verdict": _verdict.INCONCLUSIVE, "tensors": 0, "worst": None,
                            "err_over_bound": None, "forward_relative_bound": None, "diverging": [], "why": item})
            verdicts.append(_verdict.INCONCLUSIVE)
            continue
        xu, fdx, r, gu, rdx, rg, x64, g64 = item
        keys = sorted(rg)
        names = ["input"] + keys
        refg = {"input": rdx, **rg}
        got: dict[str, np.ndarray] = {"input": fdx}
        none: dict[str, str] = {}
        for key in keys:
            fk = source.get(key)
            got[key] = fgrads[fk] if fk in fgrads else np.zeros(rg[key].shape)
            if fk not in fgrads:
                none[key] = (f"{fk!r} is a buffer of the network: no gradient" if fk is not None else
                             "not read from the network's state_dict (a derived value): no gradient")
            elif len(owners[key]) > 1:
                none[key] = f"used by units {owners[key]}: its gradient sums over them"
        mag, length = _magnitudes(lambda v, u=u: twin.run_unit(u, v), x64,
                                  {"input": x64, **{key: tp[key] for key in keys}}, g64)
        member = None
        if member_net is not None:
            try:        # the twin's unit in T: a legitimate evaluation (x_u and g_u are the network's, exact in T)
                mdx, mg, *_ = _twin_unit_grads(member_net, u, round_to(xu, dtype), round_to(gu, dtype), keys,
                                               dtype)
                member = {"input": mdx, **mg}
            except Exception:   # a twin op without a kernel in this precision on the CPU
                member = None
        rho_t = forward_relative_bound(fam.unit_bound(params, u, xu, cfg, dtype=dtype), r, dtype)
        rho_64 = forward_relative_bound(fam.unit_bound(params, u, xu, cfg, dtype="float64"), r, "float64")
        sub: dict[str, Any] = {"tensors": []}
        judge_tensors(sub, names, refg, got, {key: source.get(key, "") for key in keys}, mag, length, member,
                      config.VERIFY_GRAD_BACKWARD_FACTOR * (rho_t + rho_64), dtype, p_unit, none)
        judged = [t for t in sub["tensors"] if t["err_over_bound"] is not None]
        worst = max(judged, key=lambda t: t["err_over_bound"], default=None)
        div = [t["name"] for t in sub["tensors"] if t["verdict"] == _verdict.DIVERGES]
        why = ""
        void = [t["name"] for t in sub["tensors"] if t["verdict"] == _verdict.INCONCLUSIVE]
        parts = located = None
        if sub["verdict"] == _verdict.INCONCLUSIVE and void:
            rho = config.VERIFY_GRAD_BACKWARD_FACTOR * (rho_t + rho_64)
            why = (f"void bound at {len(void)} of {len(names)} tensor(s) (first {void[0]}): the unit's forward "
                   f"relative bound is {rho_t + rho_64:.3g} (rho_T {rho_t:.3g} in {dtype}, rho_64 {rho_64:.3g}), "
                   f"F_bwd times it {rho:.3g} of the gradient's terms")
            parts = _judge_parts(twin, member_net, fam, cfg, params, source, fgrads, owners, u, xu, fdx, gu,
                                 bounds[u][4], dtype, p_unit)
            if parts is not None:
                sub["verdict"], why, first_part = _parts_verdict(parts, why)
                div = sorted({t for e in parts for t in e["diverging"]}, key=lambda t: (t != "input", t))
                if first_part is not None:
                    sub["first_divergence"] = first_part
        elif sub["verdict"] == _verdict.INCONCLUSIVE:
            why = "no gradient of the unit was compared: " + "; ".join(f"{k}: {v}" for k, v in none.items())
        elif div:
            # the unit diverges as a whole: its parts (where the family has them) locate the bug inside it, its
            # own verdict, worst tensor and diverging tensors kept (as the forward's units: networks._located)
            why = sub["first_divergence"]["why"]
            located = _judge_parts(twin, member_net, fam, cfg, params, source, fgrads, owners, u, xu, fdx, gu,
                                   bounds[u][4], dtype, p_unit)
            if located is not None:
                why, first_part = _located(located, why)
                if first_part is not None:
                    sub["first_divergence"] = first_part
        entries.append({"unit": u, "verdict": sub["verdict"], "tensors": len(names),
                        "worst": None if worst is None else worst["name"],
                        "err_over_bound": None if worst is None else worst["err_over_bound"],
                        "forward_relative_bound": _f(rho_t + rho_64), "diverging": div, "why": why})
        if parts is not None:           # the unit's worst tensor is its parts' (the whole unit's bound is void)
            judged_parts = [e for e in parts if e["err_over_bound"] is not None]
            top = max(judged_parts, key=lambda e: e["err_over_bound"], default=None)
            entries[-1].update(parts=parts, worst=None if top is None else f"{top['part']}: {top['worst']}",
                               err_over_bound=None if top is None else top["err_over_bound"])
        elif div and located is not None:
            entries[-1]["parts"] = located
        verdicts.append(sub["verdict"])
        if div and first is None:
            fd = sub["first_divergence"]
            first = {"unit": u, "part": fd.get("part"), "tensor": fd["tensor"], "why": fd["why"],
                     "max_abs_err": fd["max_abs_err"], "err_over_bound": fd["err_over_bound"]}
    verdict = (_verdict.DIVERGES if _verdict.DIVERGES in verdicts else
               _verdict.MATCH if verdicts and all(v == _verdict.MATCH for v in verdicts) else _verdict.INCONCLUSIVE)
    return {"verdict": verdict, "units": entries, "first_divergence": first}


def _parts_verdict(parts: list[dict[str, Any]], void_why: str) -> tuple[str, str, dict[str, Any] | None]:
    """A unit's (verdict, why, first divergence) from its parts' entries (:func:`_judge_parts`): the first
    diverging part's, "match" where every part matches, else "inconclusive"."""
    verdicts = [e["verdict"] for e in parts]
    notes = ", ".join(f"{e['part']} {e['verdict']}" + (f" (err/bound {e['err_over_bound']:.3g})"
                                                         if e["err_over_bound"] is not None else "") for e in parts)
    head = f"{void_why}; part by part (teacher-forced): {notes}"
    for e in parts:
        if e["verdict"] == _verdict.DIVERGES:
            fd = dict(e["first_divergence"] or {}, part=e["part"])
            return _verdict.DIVERGES, f"{head}; first divergence in part {e['part']!r}: {e['why']}", fd
    if verdicts and all(v == _verdict.MATCH for v in verdicts):
        return _verdict.MATCH, head, None
    return _verdict.INCONCLUSIVE, head + "; " + "; ".join(f"{e['part']}: {e['why']}" for e in parts
                                                           if e["verdict"] != _verdict.MATCH and e["why"]), None


def _located(parts: list[dict[str, Any]], why: str) -> tuple[str, dict[str, Any] | None]:
    """A unit that diverges as a whole, its parts judged teacher-forced (:func:`_judge_parts`) to locate the bug
    inside it: (the unit's why, naming its first diverging part; that part's first divergence with ``part``, or
    None).  Where every part matches on its own, the divergence lies in how the parts compose (the residual
    additions, a layout between them), and the why says so; where no part diverges but some is not conclusive,
    it says that too."""
    notes = ", ".join(f"{e['part']} {e['verdict']}" + (f" (err/bound {e['err_over_bound']:.3g})"
                                                         if e["err_over_bound"] is not None else "") for e in parts)
    head = f"{why}; part by part (teacher-forced on your network's intermediates, to locate it): {notes}"
    for e in parts:
        if e["verdict"] == _verdict.DIVERGES:
            return (f"{head}; first divergence in part {e['part']!r}: {e['why']}",
                    dict(e["first_divergence"] or {}, part=e["part"]))
    if all(e["verdict"] == _verdict.MATCH for e in parts):
        return (f"{head}: every part matches on its own, so the divergence lies in how the parts compose (the "
                f"residual additions, a layout between them)"), None
    return (f"{head}: no part diverges on its own, so the divergence lies in how the parts compose or in a part "
            f"not judged conclusively (" + "; ".join(f"{e['part']}: {e['why']}" for e in parts
                                                      if e["verdict"] != _verdict.MATCH) + ")"), None


def _judge_parts(twin: Any, member_net: Any, fam: Any, cfg: Any, params: Mapping[str, np.ndarray],
                 source: Mapping[str, str], fgrads: Mapping[str, np.ndarray], owners: Mapping[str, list[str]],
                 u: str, xu: np.ndarray, fdx: np.ndarray, gu: np.ndarray, within: list, dtype: str,
                 p_unit: float) -> list[dict[str, Any]] | None:
    """The backward of unit ``u`` (whose own bound is void, or that diverges as a whole: :func:`_located`) part by
    part (``fam.unit_parts``: a block's attention
    and MLP residual branches), teacher-forced as the forward's parts are (refimpl.verify.networks): part i's input
    is the foreign network's value between the parts, located by value among the tensors the unit computed
    (``within``, :func:`refimpl.verify.locate.locate` within part i-1's own bound), and its cotangent the gradient
    that reached the first tensor holding that value in the foreign backward (the unit's output cotangent ``gu``
    for the last part).  Each
    part's tensors (its input gradient: the foreign gradient at the part's input, ``fdx`` for the first; the
    parameters it alone uses, which no other part or unit shares) are judged with the part's own forward bound as
    rho.  None where the family or the twin has no parts for ``u``; a part whose input is not located, or whose
    output has no gradient, is "inconclusive" with why."""
    from .locate import locate
    names_parts = tuple(fam.unit_parts(cfg, u)) if hasattr(fam, "unit_parts") else ()
    if not names_parts or not hasattr(twin, "run_unit_part"):
        return None
    pool = [(label, v) for label, v, _ in within if v is not None]
    grad_of = {label: gr for label, _, gr in within}
    tp = dict(twin.named_parameters())
    # the parts' inputs: x_u, then each located intermediate (value and gradient, reference layout)
    inputs: list[tuple[np.ndarray, np.ndarray | None, str]] = [(xu, fdx, "the unit's input")]
    ref: dict[str, tuple] = {}          # part -> (its reference output, its bound in dtype) on its input
    after = 0
    for i, part in enumerate(names_parts[:-1]):
        xp = inputs[-1][0]
        rp = fam.run_unit_part(params, u, part, xp, cfg)
        bp = fam.unit_part_bound(params, u, part, xp, cfg, dtype=dtype)
        ref[part] = (rp, bp)
        found = locate(pool[after:], rp, bp.array(dtype, rp.shape))
        if found is None or found[2] > config.VERIFY_LOCATE_GATE:
            inputs.append((None, None, f"part {part!r}'s output was not located among the unit's tensors"))
            break
        label = found[1].split(": ", 1)[0]
        # the cotangent is the gradient of the first tensor holding the value: a later one with its values (a
        # permuted view a channels-first LayerNorm reads, a copy) carries only its own consumers' share of it
        first, fval = pool[after + found[3]]
        gr, how = grad_of.get(first), _reading(fval, rp)
        inputs.append((found[0], None if gr is None or how is None else _read(gr, rp.shape, how),
                       f"{label} (by value)"))
        after += found[3] + 1
    # the twin's float64 backward of each part whose input and output cotangent are known; a parameter that
    # more than one part (or unit) uses is not compared part-wise (the network's gradient sums over them)
    twin64: dict[str, Any] = {}
    for i, part in enumerate(names_parts):
        xp, dxp, where = inputs[i] if i < len(inputs) else (None, None, "not located")
        g_out = gu if i + 1 == len(names_parts) else (inputs[i + 1][1] if i + 1 < len(inputs) else None)
        if xp is None or dxp is None or g_out is None:
            twin64[part] = (where if xp is None else "no gradient reached the part's input in the network's backward"
                            if dxp is None else "no gradient reached the part's output in the network's backward")
            continue
        run = (lambda mod, t, q=part: mod.run_unit_part(u, q, t))
        twin64[part] = (xp, dxp, g_out, run) + _twin_grads(twin, run, xp, g_out, None, "float64")
    uses: dict[str, int] = {}
    for item in twin64.values():
        for k in (item[5] if not isinstance(item, str) else ()):
            uses[k] = uses.get(k, 0) + 1
    entries = []
    p_part = p_unit / len(names_parts)
    for i, part in enumerate(names_parts):
        item = twin64[part]
        entry = {"part": part, "input": inputs[i][2] if i < len(inputs) else "not located",
                 "verdict": _verdict.INCONCLUSIVE, "tensors": 0, "worst": None, "err_over_bound": None,
                 "forward_relative_bound": None, "diverging": [], "why": "", "first_divergence": None}
        entries.append(entry)
        if isinstance(item, str):
            entry["why"] = item
            continue
        xp, dxp, g_out, run, rdx, rg, _y, x64, g64 = item
        keys = sorted(k for k in rg if owners.get(k) == [u] and uses[k] == 1)
        names = ["input"] + keys
        refg = {"input": rdx, **{k: rg[k] for k in keys}}
        got = {"input": dxp, **{k: fgrads[source[k]] if source.get(k) in fgrads else np.zeros(rg[k].shape)
                                for k in keys}}
        none = {k: "a buffer or derived value of the network: no gradient" for k in keys if source.get(k) not in fgrads}
        mag, length = _magnitudes(lambda v, run=run: run(twin, v), x64, {"input": x64, **{k: tp[k] for k in keys}},
                                  g64)
        member = None
        if member_net is not None:
            try:
                mdx, mg, *_ = _twin_grads(member_net, run, round_to(xp, dtype), round_to(g_out, dtype), keys, dtype)
                member = {"input": mdx, **mg}
            except Exception:   # a twin op without a kernel in this precision on the CPU
                member = None
        r, b_t = ref.get(part) or (fam.run_unit_part(params, u, part, xp, cfg),
                                   fam.unit_part_bound(params, u, part, xp, cfg, dtype=dtype))
        rho_t = forward_relative_bound(b_t, r, dtype)
        rho_64 = forward_relative_bound(fam.unit_part_bound(params, u, part, xp, cfg, dtype="float64"), r,
                                        "float64")
        sub: dict[str, Any] = {"tensors": []}
        judge_tensors(sub, names, refg, got, {k: source.get(k, "") for k in keys}, mag, length, member,
                      config.VERIFY_GRAD_BACKWARD_FACTOR * (rho_t + rho_64), dtype, p_part, none)
        judged = [t for t in sub["tensors"] if t["err_over_bound"] is not None]
        worst = max(judged, key=lambda t: t["err_over_bound"], default=None)
        entry.update(verdict=sub["verdict"], tensors=len(names), worst=None if worst is None else worst["name"],
                     err_over_bound=None if worst is None else worst["err_over_bound"],
                     forward_relative_bound=_f(rho_t + rho_64),
                     diverging=[t["name"] for t in sub["tensors"] if t["verdict"] == _verdict.DIVERGES])
        if entry["diverging"]:
            entry["first_divergence"] = sub["first_divergence"]
            entry["why"] = sub["first_divergence"]["why"]
        elif sub["verdict"] == _verdict.INCONCLUSIVE:
            entry["why"] = (f"the part's forward relative bound {rho_t + rho_64:.3g} is void for its gradients"
                            if judged or not none else "no gradient of the part was compared")
    return entries
