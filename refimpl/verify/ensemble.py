"""The verifier's ensemble of legitimate evaluations: refimpl's PyTorch twin of the reference, run in the tested
precision under every variant of :mod:`refimpl.ensemble`.

Layer: the verify tool (torch and the twins imported inside the functions).  The ensemble criterion of
:func:`refimpl.verdict.compare` judges the tested error against the largest error of legitimate evaluations of the
same computation in the same precision (docs/verdict.md, "The statistic").  The test suite forms them by re-running
the twin under other summation orders, elementary-function evaluations, FFT convolution and oneDNN in its other
setting; here the verifier does the same with the twin of the reference (:data:`refimpl.verify.gradients.TWINS`,
the mapping ``--grad`` uses), loaded with the module's mapped weights (the values the module computes with, exact in
the tested dtype) and cast to that dtype:

* the whole module: the twin on the same rounded input, plainly (member ``"twin"``) and under each variant of
  :data:`refimpl.ensemble.DEFAULT_VARIANTS`;
* stage by stage (teacher-forced, :func:`refimpl.ensemble.stage_ensemble`): the twin with every stage tensor of the
  tested run forced in, so that each stage is evaluated from exactly the inputs its stage-wise reference is
  evaluated on.  A stage gets members only where the twin records it with the tested tensor's shape and every
  tensor it reads was forced (or is the input).

The members are our twin's outputs, never the module under test's, so a defect of the tested code cannot enlarge
the ensemble that judges it.  A member that raises (a twin op with no kernel in this precision on this device, such
as a half-precision op on the CPU) is left out and named; LiSA's FFT convolutions below float32 run in the
accumulation format and round to T once, as the equivalence suite runs them.  Where no twin covers the reference or its
configuration, the ensemble stays what it was: the NumPy definition run in T and the verdict's random-rounding
model (:func:`refimpl.verdict.compare` adds it when fewer than two distinct evaluations exist).

A registered network (:func:`network_twin`, :func:`unit_members`) is judged unit by unit, so its members are unit
by unit too, teacher-forced: the network's twin (:func:`refimpl.twins.models.build`, the one ``--grad`` uses),
loaded with the network's values and cast to the tested dtype, runs each unit (``run_unit``) on exactly the input
the foreign network's unit received (rounded to the dtype), plainly and under each variant; a unit judged part by
part (its own bound void) gets the twin's ``run_unit_part`` on the part's tested input likewise.  The network's
logits (:func:`logits_members`) get the twin's whole forward on the same rounded images, plainly and under each
variant, as a module's output does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import ensemble as _ensemble
from .. import verdict as _verdict
from ..numerics import round_to
from .loading import VerifyError
from .steps import _to64, _torch_dtype

__all__ = ["TwinEnsemble", "twin_ensemble", "stage_members", "members_summary", "PLAIN", "NetworkEnsemble",
           "network_twin", "unit_members", "logits_members", "network_section"]

#: the member name of the twin run plainly in the tested dtype
PLAIN = "twin"


@dataclasses.dataclass
class TwinEnsemble:
    """The twin's legitimate evaluations of the whole module (``outputs``: member -> float64 array), or why there
    are none (``why``)."""

    twin: str = ""
    why: str = ""
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: member -> the error it raised (left out)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    #: stage -> why the stage has no teacher-forced members (filled by :func:`stage_members`)
    stage_notes: dict[str, str] = dataclasses.field(default_factory=dict)
    module: Any = None
    forward: Callable | None = None
    x: Any = None

    @property
    def ran(self) -> bool:
        """Whether the twin gave at least one member's output (if not, ``why`` and ``failed`` say why)."""
        return bool(self.outputs)


def _stage_capture(m: Any, s: Any) -> Callable[..., dict] | None:
    """``tensors_of(run, force=None)``: the twin's stage tensors (refimpl.twins' capture), named as the reference's
    stage list; None for a twin without one (the shifted-window layouts, run between their own data movement)."""
    from refimpl.twins.modules import angular as t_ang
    from refimpl.twins.modules import enhanced as t_enh
    from refimpl.twins.modules import focused as t_foc
    from refimpl.twins.modules import lisa as t_lisa
    from refimpl.twins.modules import rala as t_rala
    from refimpl.twins.taps import QKV_PROJ_POINTS, capture
    if isinstance(m, t_foc.FocusedLinearAttention):
        return lambda run, force=None: t_foc.stage_tensors(m, run, force=force)
    if isinstance(m, t_rala.RALAttention):
        return lambda run, force=None: t_rala.stage_tensors(m, run, tuple(s.hw), force=force)
    if isinstance(m, t_lisa.LiSAAttention):
        return lambda run, force=None: t_lisa.stage_tensors(m, run, force=force)
    if isinstance(m, (t_enh.EnhancedLinearAttention, t_ang.CastlingAttention)):
        return lambda run, force=None: capture(m, run, QKV_PROJ_POINTS, force=force)
    return None


@contextlib.contextmanager
def _transforms_in_accumulation_format(dtype: str):
    """LiSA's twin below float32: its FFT convolutions computed in T's accumulation format and rounded to T once
    (torch has no half-precision FFT on the CPU, and cuFFT's is for powers of two only; autocast's rule, as the
    equivalence suite runs the twin: config.ACCUMULATION_FORMAT).  Nothing changes where T accumulates in itself."""
    from refimpl.twins.modules import lisa as t_lisa
    acc = _verdict.accumulation_format(dtype)
    if acc == _verdict.format_name(dtype):
        yield
        return
    orig, acc_t = t_lisa.fft_convolve, _torch_dtype(acc)

    def fft_convolve(x, kernel, grid, lengths, transform="rfft"):
        return orig(x.to(acc_t), kernel.to(acc_t), grid, lengths, transform).to(x.dtype)
    t_lisa.fft_convolve = fft_convolve
    try:
        yield
    finally:
        t_lisa.fft_convolve = orig


def twin_ensemble(ref: Any, s: Any, params: Mapping[str, np.ndarray], x: np.ndarray, out_shape: tuple[int, ...],
                  dtype: str, device: str, variants: Sequence[str] = _ensemble.DEFAULT_VARIANTS) -> TwinEnsemble:
    """The twin of ``ref`` in ``dtype`` on ``device``, loaded with ``params`` (reference keys), run on ``x`` plainly
    and under each of ``variants``: the whole-module members (output in the reference's layout, ``out_shape``)."""
    import torch

    from .gradients import TWINS, _build_twin
    t0 = time.perf_counter()
    if ref.name not in TWINS:
        return TwinEnsemble(why=f"no PyTorch twin of {ref.name} ships with refimpl (twins: {sorted(TWINS)})")
    if getattr(s, "no_twin", ""):
        return TwinEnsemble(why=s.no_twin)
    try:
        m, fwd = _build_twin(ref.name, s, params)
    except VerifyError as exc:
        return TwinEnsemble(why=str(exc).replace("argument 'grad': ", ""))
    asked = _torch_dtype(dtype)
    m = m.to(device=device, dtype=asked).eval()
    xt = torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=asked)
    te = TwinEnsemble(twin=type(m).__module__ + "." + type(m).__name__, module=m, forward=fwd, x=xt)
    for name in (PLAIN,) + tuple(variants):
        try:
            with torch.no_grad(), _transforms_in_accumulation_format(dtype):
                if name == PLAIN:
                    y = fwd(xt)
                else:
                    with _ensemble.variant(name):
                        y = fwd(xt)
            y = _to64(y[0] if isinstance(y, (tuple, list)) else y)
            if y.shape != tuple(out_shape):
                raise ValueError(f"the twin's output has shape {y.shape}, the reference's {tuple(out_shape)}")
            te.outputs[name] = y
        except Exception as exc:        # a twin op without a kernel in this precision on this device
            te.failed[name] = f"{type(exc).__name__}: {exc}"
    if not te.outputs:
        te.why = (f"the twin ({te.twin}) could not be run on this input in {dtype} on {device}: "
                  + next(iter(te.failed.values())))
    te.seconds = time.perf_counter() - t0
    return te


def stage_members(te: TwinEnsemble, s: Any, stage_list: Sequence[Any], tensors: Mapping[str, np.ndarray],
                  dtype: str, device: str, variants: Sequence[str] = _ensemble.DEFAULT_VARIANTS
                  ) -> dict[str, dict[str, np.ndarray]]:
    """Teacher-forced members of each stage: ``{stage: {member: array}}`` (the twin plainly and under each of
    ``variants``, every tested stage tensor of ``tensors`` forced in where the twin records it with that shape).
    Stages left without members get the reason in ``te.stage_notes``."""
    import torch
    t0 = time.perf_counter()
    names = [st.name for st in stage_list]
    if not te.ran:
        return {}
    tensors_of = _stage_capture(te.module, s)
    if tensors_of is None:
        te.stage_notes.update({n: f"the twin ({te.twin}) records no stage tensors in this layout" for n in names})
        return {}
    run = lambda: te.forward(te.x)  # noqa: E731
    asked = _torch_dtype(dtype)
    try:
        with _transforms_in_accumulation_format(dtype):
            own = tensors_of(run)
    except Exception as exc:
        te.stage_notes.update({n: f"the twin's stage tensors: {type(exc).__name__}: {exc}" for n in names})
        return {}
    force = {k: torch.from_numpy(np.ascontiguousarray(tensors[k])).to(device=device, dtype=asked)
             for k, v in own.items() if k in tensors and tuple(v.shape) == np.shape(tensors[k])}
    raw: dict[str, dict[str, Any]] = {}
    try:
        with torch.no_grad(), _transforms_in_accumulation_format(dtype):
            for key, val in tensors_of(run, force=force).items():
                raw.setdefault(key, {})[PLAIN] = val
    except Exception as exc:
        te.failed[f"{PLAIN} (stages)"] = f"{type(exc).__name__}: {exc}"
    for name in variants:
        try:
            with _transforms_in_accumulation_format(dtype):
                got = _ensemble.stage_ensemble(lambda force: tensors_of(run, force=force), force, (name,))
            for key, val in got.items():
                raw.setdefault(key, {}).update(val)
        except Exception as exc:
            te.failed[f"{name} (stages)"] = f"{type(exc).__name__}: {exc}"
    out: dict[str, dict[str, np.ndarray]] = {}
    for st in stage_list:
        unforced = [k for k in st.inputs if k != "x" and k not in force]
        if st.name not in tensors:          # not observed in the tested run: not compared
            continue
        if st.name not in raw:
            te.stage_notes[st.name] = f"the twin ({te.twin}) records no tensor {st.name!r} of this shape"
        elif unforced:
            te.stage_notes[st.name] = (f"the twin could not be forced with the tested {unforced} (not observed, or "
                                       f"another shape): no teacher-forced member")
        else:
            got = {k: _to64(v) for k, v in raw[st.name].items()}
            got = {k: v for k, v in got.items() if v.shape == np.shape(tensors[st.name])}
            if got:
                out[st.name] = got
            else:
                te.stage_notes[st.name] = f"the twin records {st.name!r} in another shape than the tested tensor"
    te.seconds += time.perf_counter() - t0
    return out


def members_summary(rep: Any, given: Sequence[str]) -> dict[str, Any]:
    """The ensemble of one comparison (an :class:`refimpl.verdict.ErrorReport`) for the report: each member's
    zmax and zrms and its status ("used", "outside the bound: not used", "equal to the tested output bit for bit:
    dropped"), and the two thresholds.  ``given``: the names of the torch members passed to the comparison."""
    members: dict[str, dict[str, Any]] = {}
    for name, (zmax, zrms) in rep.ensemble.items():
        outside = any(r.startswith(f"ensemble member {name!r} is outside the bound") for r in rep.reasons)
        members[name] = {"zmax": _num(zmax), "zrms": _num(zrms),
                         "status": "outside the bound: not used" if outside else "used"}
    for name in given:
        if name not in rep.ensemble:
            members[name] = {"zmax": None, "zrms": None, "status": "equal to the tested output bit for bit: dropped"}
    return {"members": members, "zmax": _num(rep.zmax), "zrms": _num(rep.zrms),
            "zmax_threshold": _num(rep.zmax_threshold), "zrms_threshold": _num(rep.zrms_threshold)}


@dataclasses.dataclass
class NetworkEnsemble:
    """The network's twin in the tested dtype (``module``), or why there is none (``why``), and what its unit runs
    gave: the members that ran (``members``), those that raised (``failed``: "member (unit)" -> the error) and the
    units left without members (``unit_notes``)."""

    twin: str = ""
    why: str = ""
    module: Any = None
    dtype: str = "float32"
    device: str = "cpu"
    variants: tuple[str, ...] = ()
    members: set[str] = dataclasses.field(default_factory=set)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    unit_notes: dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


def network_twin(cfg: Any, params: Mapping[str, np.ndarray], dtype: str, device: str,
                 variants: Sequence[str] = _ensemble.DEFAULT_VARIANTS) -> NetworkEnsemble:
    """The twin of the network of config ``cfg`` (:func:`refimpl.twins.models.build`), loaded strictly with
    ``params`` (the values the foreign network computes with, reference keys: exact in ``dtype``) and cast to
    ``dtype`` on ``device``; a :class:`NetworkEnsemble` saying why where none can be built or it has no units."""
    from .network_gradients import _build_twin
    t0 = time.perf_counter()
    try:
        m = _build_twin(cfg, params)
    except VerifyError as exc:
        return NetworkEnsemble(why=str(exc).replace("argument 'grad': ", ""), dtype=dtype, device=device)
    name = type(m).__module__ + "." + type(m).__name__
    if not hasattr(m, "run_unit"):
        return NetworkEnsemble(twin=name, why=f"the network's twin ({name}) has no run_unit: no unit-wise members",
                               dtype=dtype, device=device)
    m = m.to(device=device, dtype=_torch_dtype(dtype)).eval()
    return NetworkEnsemble(twin=name, module=m, dtype=dtype, device=device, variants=tuple(variants),
                           seconds=time.perf_counter() - t0)


def unit_members(ne: NetworkEnsemble, unit: str, x: np.ndarray, shape: tuple[int, ...],
                 part: str | None = None) -> dict[str, np.ndarray]:
    """``{member: output}``: the twin's unit ``unit`` (or its part ``part``) on ``x`` (the tested input to it, in
    the reference's layout) rounded to the dtype, plainly (member ``"twin"``) and under each variant
    (:func:`refimpl.ensemble.legitimate_runs`, one variant at a time so that one without a kernel in this
    precision is left out alone); outputs of another shape than ``shape`` (the reference's) are left out."""
    if ne.module is None:
        return {}
    what = unit if part is None else f"{unit}/{part}"
    if part is not None and not hasattr(ne.module, "run_unit_part"):
        ne.unit_notes[what] = f"the network's twin ({ne.twin}) has no run_unit_part"
        return {}
    xt = _tensor(ne, x)
    run = ((lambda: ne.module.run_unit(unit, xt)) if part is None else
           (lambda: ne.module.run_unit_part(unit, part, xt)))
    return _runs(ne, run, shape, what)


def logits_members(ne: NetworkEnsemble, x: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """``{member: logits}``: the twin's whole forward on the images ``x`` (already rounded to the dtype, the
    tested network's input), plainly and under each variant as :func:`unit_members` (one network forward per
    member), reshaped to ``shape`` (the reference's logits); the members of the network's logits comparison, as
    :func:`twin_ensemble`'s are of a module's output."""
    if ne.module is None:
        return {}
    xt = _tensor(ne, x)
    return _runs(ne, lambda: ne.module(xt), shape, "logits", reshape=True)


def _tensor(ne: NetworkEnsemble, x: np.ndarray) -> Any:
    import torch
    return torch.from_numpy(np.ascontiguousarray(round_to(x, ne.dtype))).to(device=ne.device,
                                                                            dtype=_torch_dtype(ne.dtype))


def _runs(ne: NetworkEnsemble, run: Callable[[], Any], shape: tuple[int, ...], what: str,
          reshape: bool = False) -> dict[str, np.ndarray]:
    """``run`` plainly (member ``"twin"``) and under each of ``ne.variants``, in float64; a run that raises or
    gives another shape than ``shape`` (another size, with ``reshape``) is named in ``ne.failed`` as
    "member (what)" and left out; ``what`` without members goes into ``ne.unit_notes``."""
    import torch
    t0 = time.perf_counter()
    out: dict[str, np.ndarray] = {}
    for name in (PLAIN,) + ne.variants:
        try:
            with _transforms_in_accumulation_format(ne.dtype):
                if name == PLAIN:
                    with torch.no_grad():
                        y = run()
                else:
                    y = _ensemble.legitimate_runs(run, (name,))[name]
            y = _to64(y[0] if isinstance(y, (tuple, list)) else y)
            if reshape and y.size == int(np.prod(shape)):
                y = y.reshape(shape)
            if y.shape != tuple(shape):
                raise ValueError(f"the twin's output has shape {y.shape}, the reference's {tuple(shape)}")
            out[name] = y
        except Exception as exc:        # a twin op without a kernel in this precision on this device
            ne.failed[f"{name} ({what})"] = f"{type(exc).__name__}: {exc}"
    ne.members.update(out)
    if not out:
        ne.unit_notes[what] = "every twin run raised (see failed)"
    ne.seconds += time.perf_counter() - t0
    return out


def network_section(ne: NetworkEnsemble | None, dtype: str) -> dict[str, Any]:
    """The report's ``ensemble`` for a network (the layer path's keys; ``stages_without_members``: the units and
    parts left without twin members, with why)."""
    if ne is None:
        return {"torch": False, "why": "not asked for (--no-ensemble / ensemble=False): each unit against the NumPy "
                f"naive run in {dtype} and the random-rounding model only"}
    ran = bool(ne.members)
    out = {"torch": ran, "twin": ne.twin or None, "why": ne.why or None, "members": sorted(ne.members),
           "failed": dict(ne.failed), "seconds": round(ne.seconds, 3), "stages_without_members": dict(ne.unit_notes),
           "per": "unit, teacher-forced: the twin's run_unit on the foreign network's own input to the unit; "
                  "the logits: the twin's forward on the same rounded images"}
    if not ran:
        out["why"] = ((ne.why or f"the twin ({ne.twin}) ran no unit in {dtype} on {ne.device}") +
                      f": the ensemble is the NumPy naive run in {dtype} and the random-rounding model")
    return out


def _num(x: Any) -> Any:
    from .report import _f
    return _f(x)
