"""Gradient verification (``--grad``) of a whole registered network: the foreign network's input gradient and
every parameter gradient for a random cotangent on its logits, judged against the gradients of refimpl's float64
PyTorch twin of the network (:func:`refimpl.twins.models.build`).

Layer: the verify tool (torch; the twins imported inside the functions).  :func:`verify_network_gradients` is
what :func:`refimpl.verify.networks.verify_network` runs with ``grad=True``, after the forward's units.  What
happens (docs/verify.md, "Gradients"), as for a layer reference (:mod:`refimpl.verify.gradients`):

1. the twin is built from the network's configuration, cast to float64 and loaded strictly with the values the
   foreign network computes with (its parameters read back in the reference's keys: every floating key of the
   twin's state_dict both ways);
2. its float64 logits on the same rounded images are judged against the NumPy network forward with the
   family's float64 logits bound (``forward_bounds``); where that bound is void at the network's depth the twin
   is judged unit by unit instead, as the forward is: each twin unit (``run_unit``) on the reference's own input
   to the unit against the family's ``run_unit`` and ``unit_bound`` in float64, and the twin's forward equal to
   the composition of its units bit for bit.  Only a twin that matches is used;
3. a cotangent g ~ N(0, 1) of the logits' shape is drawn from ``seed`` (stream 1) and rounded to T; the foreign
   network (in T) and the twin (float64) are differentiated for L = <g, logits>; the foreign parameter gradients
   are read in the reference's keys through the naming of the weights (renames of the released code's names);
4. each gradient tensor is judged by :func:`refimpl.verify.gradients.judge_tensors` against
   :class:`refimpl.verify.gradients.GradientBound`, with the network's logits bound as the forward's propagated
   relative bound (rho_T in T, rho_64 in float64) and the twin's own gradients in T as the ensemble;
5. unit by unit (:mod:`refimpl.verify.unit_gradients`, where the twin has ``run_unit`` and the family its units):
   each unit's backward teacher-forced on the foreign network's own input to the unit and the cotangent that
   reached its output in the same foreign backward, against the twin's unit with the unit's own forward bound
   (``units``); a unit whose own bound is void for its gradients, or that diverges as a whole, is judged part by
   part too where the family has parts for it (to locate the bug inside the block).  The false-alarm budget is split in half between the whole network and the units; the verdict is
   "diverges" where either diverges, else the whole network's where conclusive, else the units' (stated).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import config
from .. import verdict as _verdict
from ..numerics import round_to
from .gradients import _magnitudes, backward_pass, forward_relative_bound, judge_tensors
from .loading import VerifyError
from .report import _f
from .steps import _to64, _torch_dtype
from .network_values import unit_modules
from .unit_gradients import foreign_backward, judge_units

__all__ = ["verify_network_gradients"]


def _build_twin(cfg: Any, params: Mapping[str, np.ndarray]) -> Any:
    """The network's twin in float64, eval mode, loaded strictly with ``params`` (reference keys)."""
    import torch

    from refimpl.twins.models import build
    try:
        m = build(cfg)
    except (KeyError, TypeError) as exc:
        raise VerifyError(f"argument 'grad': no PyTorch twin of the network ({exc})") from exc
    m = m.to(dtype=torch.float64).eval()
    sd = m.state_dict()
    want = {k for k, v in sd.items() if v.is_floating_point()}
    have = {k for k, v in params.items() if np.issubdtype(np.asarray(v).dtype, np.floating)}
    if want != have:
        raise VerifyError(f"argument 'grad': the network's twin {type(m).__name__} has floating keys the reference "
                          f"lacks {sorted(want - have)[:8]} and lacks {sorted(have - want)[:8]}: it cannot be "
                          f"loaded with the network's weights")
    with torch.no_grad():
        for k in want:
            v = np.asarray(params[k], dtype=np.float64)
            if tuple(sd[k].shape) != tuple(v.shape):
                raise VerifyError(f"argument 'grad': the twin's {k!r} has shape {tuple(sd[k].shape)}, the "
                                  f"reference's {tuple(v.shape)}")
            sd[k].copy_(torch.from_numpy(v))
    return m


def _twin_by_units(twin: Any, fam: Any, params: Mapping[str, np.ndarray], cfg: Any, x: np.ndarray,
                   taps: Mapping[str, np.ndarray], p: float) -> tuple[bool, str]:
    """(accepted, what was found): the twin's units each on the reference's own input to the unit, against the
    family's unit and its float64 ``unit_bound``, and the twin's logits equal to its units' composition."""
    import torch
    if not (hasattr(twin, "run_unit") and hasattr(fam, "unit_names") and hasattr(fam, "unit_bound")):
        return False, "the twin or the family has no units to judge it by"
    units = list(fam.unit_names(cfg))
    worst = 0.0
    with torch.no_grad():
        for k, u in enumerate(units):
            xin = x if k == 0 else taps.get(units[k - 1])
            if xin is None:
                return False, f"the reference's input to unit {u!r} was not recorded"
            got = _to64(twin.run_unit(u, torch.from_numpy(np.ascontiguousarray(xin))))
            r = fam.run_unit(params, u, xin, cfg)
            if got.shape != r.shape:
                return False, f"the twin's unit {u!r} has shape {got.shape}, the reference's {r.shape}"
            rep = _verdict.compare(got, r, fam.unit_bound(params, u, xin, cfg, dtype="float64"), "float64",
                                   name=f"twin unit {u}", p_false_alarm=p / max(len(units), 1))
            if rep.verdict != _verdict.MATCH:
                return False, f"the twin's unit {u!r} is {rep.verdict} ({'; '.join(rep.reasons)})"
            worst = max(worst, float(rep.max_err_over_bound))
        xt = torch.from_numpy(np.ascontiguousarray(x))
        chained = xt
        for u in units:
            chained = twin.run_unit(u, chained)
        if not torch.equal(chained, twin(xt)):
            return False, "the twin's forward is not the composition of its units"
    return True, (f"all {len(units)} units match teacher-forced in float64 (largest err/bound {worst:.3g}) and the "
                  f"twin's forward is their composition bit for bit")


def _gradients(m: Any, x: np.ndarray, g: np.ndarray, dtype: str, device: str, call: Mapping[str, Any] | None,
               who: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """dL/dx and dL/dtheta (the module's parameter names) of the network ``m`` in ``dtype`` for L = <g, logits>
    (:func:`refimpl.verify.gradients.backward_pass`)."""
    _, _, dx, grads = backward_pass(m, lambda xt: m(xt, **dict(call or {})), x, g, dtype, device, who,
                                 f"the logits {tuple(g.shape)}", reshape=True)
    return dx, grads


def verify_network_gradients(module: Any, fam: Any, cfg: Any, params: Mapping[str, np.ndarray],
                             source: Mapping[str, str], x: np.ndarray, want: np.ndarray,
                             taps: Mapping[str, np.ndarray], lbound: Any, dtype: str, device: str,
                             call: Mapping[str, Any] | None, seed: int, p_false_alarm: float) -> dict[str, Any]:
    """The report's ``gradients`` section for a network (the layer path's format): the twin's forward check, the
    cotangent, one entry per gradient tensor (the images, then each reference parameter key), the whole network's
    verdict (``whole_verdict``), the units' (``units``, ``units_verdict``, ``units_first_divergence``) and the
    verdict.

    params : the values the foreign network computes with, in the reference's keys; source : reference key ->
    the foreign state_dict key holding it; want : the NumPy network's float64 logits on the rounded images
    ``x``; taps : the reference's unit values on ``x``; lbound : the family's logits bound in ``dtype``."""
    import torch
    twin = _build_twin(cfg, params)
    x64 = torch.from_numpy(np.ascontiguousarray(x))
    with torch.no_grad():
        y64 = _to64(twin(x64)).reshape(want.shape)
    _, b64 = fam.forward_bounds(params, x, cfg, dtype="float64")
    tw = _verdict.compare(y64, want, b64, "float64", name="twin logits")
    name = type(twin).__module__ + "." + type(twin).__name__
    section: dict[str, Any] = {
        "twin": name,
        "twin_forward": {"verdict": tw.verdict, "err_over_bound": _f(tw.max_err_over_bound),
                         "max_abs_err": _f(tw.max_abs_err), "reasons": list(tw.reasons)},
        "cotangent": f"N(0, 1) of shape {list(want.shape)} from seed {seed} (stream 1), rounded to {dtype}",
        "backward_factor": config.VERIFY_GRAD_BACKWARD_FACTOR, "tensors": []}
    if tw.verdict == _verdict.INCONCLUSIVE:
        ok, found = _twin_by_units(twin, fam, params, cfg, x, taps, p_false_alarm)
        section["twin_forward"]["reasons"].append(f"judged by its units: {found}")
        if ok:
            section["twin_forward"]["verdict"] = _verdict.MATCH
    if section["twin_forward"]["verdict"] != _verdict.MATCH:
        section["verdict"] = _verdict.INCONCLUSIVE
        section["why"] = (f"the float64 PyTorch twin ({name}) does not match the NumPy network "
                          f"({'; '.join(section['twin_forward']['reasons'])}): its gradients cannot serve as the "
                          f"reference; no gradient was compared")
        return section

    rng = np.random.default_rng([int(seed), 1])
    g = round_to(rng.standard_normal(want.shape), dtype)
    unitwise = hasattr(twin, "run_unit") and all(hasattr(fam, a) for a in ("unit_names", "run_unit", "unit_bound"))
    units = list(fam.unit_names(cfg)) if unitwise else []
    mods = unit_modules(units, dict(module.named_modules()), source) if unitwise else {}
    # the units a void bound may send part by part: their tensors are kept (with their gradients) in the run
    inner = [u for u in units if hasattr(fam, "unit_parts") and hasattr(twin, "run_unit_part")
             and fam.unit_parts(cfg, u)]
    dx, fgrads, bounds = foreign_backward(module, x, g, units, mods, dtype, device, call, inner)
    tp = dict(twin.named_parameters())
    names = ["input"] + sorted(tp)
    got: dict[str, np.ndarray] = {"input": dx}
    none: dict[str, str] = {}
    for k in names[1:]:
        fk = source.get(k)
        if fk in fgrads:
            got[k] = fgrads[fk]
        else:
            none[k] = (f"{fk!r} is a buffer of the network: no gradient" if fk is not None else
                       "not read from the network's state_dict (a derived value): no gradient")
            got[k] = np.zeros(tuple(tp[k].shape))
    g64 = torch.from_numpy(g)
    xg = x64.clone().requires_grad_(True)
    with torch.enable_grad():
        y = twin(xg).reshape(want.shape)
        rg = torch.autograd.grad(y, [xg] + [tp[k] for k in names[1:]], g64, allow_unused=True)
    refg = {k: (_to64(t) if t is not None else np.zeros(x.shape if k == "input" else tuple(tp[k].shape)))
            for k, t in zip(names, rg)}
    mag, length = _magnitudes(lambda v: twin(v).reshape(want.shape), x64,
                              {"input": x64, **{k: tp[k] for k in names[1:]}}, g64)
    member = None
    if dtype != "float64":
        try:            # the twin in T: a legitimate evaluation (the parameters are the network's, exact in T)
            tdx, tgr = _gradients(_build_twin(cfg, params).to(dtype=_torch_dtype(dtype)), x, g, dtype, "cpu", None,
                                  "the twin")
            member = {"input": tdx, **{k: tgr[k] for k in names[1:]}}
        except VerifyError:     # a twin op without a kernel in this precision on the CPU
            member = None
    rho_t = forward_relative_bound(lbound, want, dtype)
    rho_64 = forward_relative_bound(b64, want, "float64")
    rho = config.VERIFY_GRAD_BACKWARD_FACTOR * (rho_t + rho_64)
    section["forward_relative_bound"] = _f(rho_t + rho_64)
    # the false-alarm budget: half to the whole network's tensors, half to the units (split between them)
    p_whole = p_false_alarm / 2 if unitwise else p_false_alarm
    judge_tensors(section, names, refg, got, {k: source.get(k, "") for k in names[1:]}, mag, length, member,
                  rho, dtype, p_whole, none)
    whole = section["verdict"]
    section["whole_verdict"] = whole
    if whole == _verdict.INCONCLUSIVE:
        void = sum(t["verdict"] == _verdict.INCONCLUSIVE for t in section["tensors"])
        section["why"] = (
            f"{void} gradient tensor(s) have a void bound: the bound builds on the network's propagated logits "
            f"bound, rho_T = {rho_t:.3g} in {dtype} and rho_64 = {rho_64:.3g} in float64 relative to the logits' "
            f"largest magnitude, so F_bwd (rho_T + rho_64) = {rho:.3g} of the gradient's terms; conclusive where "
            f"that is well below 1: float64 (where its logits bound is small), or fewer blocks (--config depths). "
            f"A backward bug is still found where it exceeds the twin's own gradients in {dtype} (the ensemble)")
    if not unitwise:
        section["units"], section["units_verdict"], section["units_first_divergence"] = [], None, None
        return section
    uw = judge_units(twin, fam, cfg, params, source, fgrads, bounds, x, taps, dtype, p_false_alarm / 2)
    section["units"], section["units_verdict"] = uw["units"], uw["verdict"]
    section["units_first_divergence"] = uw["first_divergence"]
    _combine(section, whole, uw)
    return section


def _combine(section: dict[str, Any], whole: str, uw: Mapping[str, Any]) -> None:
    """The gradients' verdict from the whole network's and the units' (teacher-forced): "diverges" where either
    diverges; the whole network's where it is conclusive; the units' where the whole network's is inconclusive
    (stated in ``why``)."""
    units = uw["units"]
    fd = uw["first_divergence"]
    summary = ", ".join(f"{e['unit']} {e['verdict']}" for e in units)
    if uw["verdict"] == _verdict.DIVERGES:
        section["verdict"] = _verdict.DIVERGES
        at = f"unit {fd['unit']!r}" + (f", part {fd['part']!r}" if fd.get("part") else "")
        why = (f"{at} diverges teacher-forced (its backward on the network's own input and "
               f"cotangent to it): {fd['tensor']}: {fd['why']}")
        section["why"] = (section["why"] + "; " if section.get("why") else "") + why
        if section.get("first_divergence") is None:
            where = f"unit {fd['unit']}" + (f", part {fd['part']}" if fd.get("part") else "")
            section["first_divergence"] = {"tensor": f"{fd['tensor']} ({where})", "unit": fd["unit"],
                                           "part": fd.get("part"), "why": fd["why"], "max_abs_err": fd["max_abs_err"],
                                           "err_over_bound": fd["err_over_bound"]}
    elif whole == _verdict.INCONCLUSIVE and uw["verdict"] == _verdict.MATCH:
        section["verdict"] = _verdict.MATCH
        section["why"] += (f". The verdict is the unit-wise one: every unit's backward, teacher-forced on the "
                           f"network's own input and cotangent to it, matches its float64 twin unit within the "
                           f"unit's own bound ({summary})")
    elif whole == _verdict.INCONCLUSIVE:
        void = [e["unit"] for e in units if e["verdict"] == _verdict.INCONCLUSIVE]
        section["why"] += (f". Unit by unit (teacher-forced, each unit's own bound): {summary}; inconclusive at "
                           f"{void} (" + "; ".join(f"{e['unit']}: {e['why']}" for e in units
                                                   if e["verdict"] == _verdict.INCONCLUSIVE) + ")")
