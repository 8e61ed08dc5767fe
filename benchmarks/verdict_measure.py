"""The verdict benchmark's measurements of one module in one precision (benchmarks/verdict.py): the outputs
(:class:`Case`), tightness (a), sensitivity (b) by bisection of a blend, and the stage-wise (teacher-forced)
verdicts with their own tightness and sensitivity.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from benchmarks.verdict_setups import BUGS, Setup, StageWise, _tensors64
from equivalence.assertions import to_numpy
from refimpl import config, ensemble, numerics, verdict

#: Bisection on log10 t in [LOG_T_MIN, 0].
LOG_T_MIN = -12.0


def rel_fro(x: np.ndarray, ref: np.ndarray) -> float:
    """||x - ref||_F / ||ref||_F over the slots where both are finite."""
    fin = np.isfinite(x) & np.isfinite(ref)
    d = np.where(fin, x - ref, 0.0)
    nref = float(np.sqrt(np.sum(np.where(fin, ref, 0.0) ** 2)))
    return float(np.sqrt(np.sum(d * d))) / nref if nref > 0 else (0.0 if not d.any() else math.inf)


def bound_array(bound: numerics.Bound, ref: np.ndarray, dt: str) -> np.ndarray:
    """The element-wise bound b_i the verdict applies (refimpl.verdict.compare: lam from the union bound)."""
    u = numerics.unit_roundoff(dt)
    lam = verdict.confidence_lambda(ref.size * max(bound.k, 1.0), config.VERDICT_FALSE_ALARM, u)
    return bound.array(dt, ref.shape, lam)


def _f(x: Any) -> Any:
    """JSON-safe float (inf / nan as strings)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else ("inf" if x > 0 else ("-inf" if x < 0 else "nan"))


def _num(x: Any) -> float:
    if isinstance(x, str):
        return float(x)
    return math.nan if x is None else float(x)


def report_dict(rep: Any) -> dict:
    return {"verdict": rep.verdict, "reasons": list(rep.reasons), "zmax": _f(rep.zmax), "zrms": _f(rep.zrms),
            "zmax_threshold": _f(rep.zmax_threshold), "zrms_threshold": _f(rep.zrms_threshold),
            "max_err_over_bound": _f(rep.max_err_over_bound), "max_relative_bound": _f(rep.max_relative_bound),
            "rel_err": _f(rep.rel_err), "ensemble": {k: [_f(a), _f(b)] for k, (a, b) in rep.ensemble.items()}}


class Case:
    """One module in one precision: every output and the verdicts (kept in memory for the second pass)."""

    def __init__(self, setup: Setup, dt: str, variants: tuple[str, ...]):
        self.setup, self.dt = setup, dt
        self.timing: dict[str, float] = {}
        t0 = time.perf_counter()
        self.tested = to_numpy(setup.run())
        self.timing["tested"] = time.perf_counter() - t0
        t = time.perf_counter()
        self.ref = np.asarray(setup.ref(), dtype=np.float64)
        self.timing["reference"] = time.perf_counter() - t
        t = time.perf_counter()
        self.bound = setup.bound()
        self.timing["bound"] = time.perf_counter() - t
        t = time.perf_counter()
        self.naive = setup.naive()
        self.timing["naive"] = time.perf_counter() - t
        t = time.perf_counter()
        self.members: dict[str, np.ndarray] = {}
        for v in variants:                   # one at a time: a variant that fails is reported, not fatal
            try:
                self.members[v] = to_numpy(ensemble.legitimate_runs(setup.run, variants=(v,))[v])
            except Exception as exc:          # noqa: BLE001 - recorded in the results
                self.timing.setdefault("failed_variants", {})[v] = f"{type(exc).__name__}: {exc}"[:200]
        self.timing["ensemble"] = time.perf_counter() - t
        t = time.perf_counter()
        self.buggy: dict[str, np.ndarray | None] = {}
        for name in BUGS:
            bug = setup.bugs.get(name)
            self.buggy[name] = None if bug is None or bug.run is None else to_numpy(bug.run())
        self.timing["bugs"] = time.perf_counter() - t
        self.bnd = bound_array(self.bound, self.ref, dt)
        self.u = numerics.unit_roundoff(dt)
        self.w = weights(self)

    def compare(self, actual: np.ndarray, *, old_rule: bool = False) -> Any:
        return verdict.compare(actual, self.ref, self.bound, self.dt, naive=self.naive,
                               ensemble=None if old_rule else self.members, name=self.setup.name)

    def legit(self) -> dict[str, np.ndarray]:
        """The legitimate evaluations: the tested default run, the NumPy naive run, every variant."""
        return {"torch default": self.tested, "numpy naive": self.naive, **self.members}


def weights(case: "Case") -> np.ndarray:
    """The per-element units w_i of the verdict's z statistics.  refimpl.verdict.compare measures
    z_i = err_i / w_i with w_i = S_i + eta_T / u_T (``verdict._weights``; S the bound's scale, the l2 coefficient sigma_i
    where S_i is not finite); an older verdict used
    the bound b_i itself, which is the fallback when ``_weights`` is absent."""
    fin = np.isfinite(case.ref)
    if hasattr(verdict, "_weights"):
        return np.asarray(verdict._weights(case.bound, case.ref, fin, case.dt), dtype=np.float64)
    return case.bnd


def tightness(case: Case, rep: Any) -> dict[str, float]:
    """(a): the element-wise threshold the verdict applies, threshold_i = min(b_i, Zthr w_i) (b_i the bound,
    Zthr = rep.zmax_threshold = F_max x the ensemble's largest usable zmax, w_i the z units), as
    max_i threshold_i over the largest error of any legitimate evaluation at any element; the same for the plain
    bound b_i.  A NaN b_i (a broken bound) makes the threshold NaN."""
    fin = np.isfinite(case.ref)
    max_err = 0.0
    for x in case.legit().values():
        m = fin & np.isfinite(x)
        if m.any():
            max_err = max(max_err, float(np.max(np.abs(x[m] - case.ref[m]))))
    b = case.bnd[fin]
    w = case.w[fin]
    if b.size == 0:
        return {"max_err": max_err, "max_bound": 0.0, "bound_over_err": math.nan, "threshold_over_err": math.nan,
                "nan_bound": 0}
    nan_b = int(np.count_nonzero(np.isnan(b)))
    with np.errstate(invalid="ignore", over="ignore"):
        thr = np.minimum(b, rep.zmax_threshold * w)          # NaN propagates from b
    bmax = math.nan if nan_b else float(np.max(b))
    tmax = math.nan if nan_b else float(np.max(thr))
    return {"max_err": max_err, "max_bound": bmax, "nan_bound": nan_b,
            "bound_over_err": bmax / max_err if max_err > 0 else math.inf,
            "threshold_over_err": tmax / max_err if max_err > 0 else math.inf}


# --- sensitivity: bisection of the blend --------------------------------------------------------------

class FastJudge:
    """A fast replica of refimpl.verdict.compare's "diverges" decision for blends of the correct output (the
    thresholds, the bound and the z units do not depend on the tested output).  Used only to bracket the
    bisection; both ends of the bracket are confirmed with compare itself, and a disagreement falls back to a
    bisection with compare alone."""

    def __init__(self, case: Case, rep: Any):
        self.ref, self.bnd, self.w = case.ref, case.bnd, case.w
        self.zmax_thr, self.zrms_thr = rep.zmax_threshold, rep.zrms_threshold
        self.nan_ref, self.inf_ref = np.isnan(self.ref), np.isinf(self.ref)

    def diverges(self, x: np.ndarray) -> bool:
        if not np.array_equal(np.isnan(x), self.nan_ref):
            return True
        xi = np.isinf(x)
        if not np.array_equal(xi, self.inf_ref) or not np.array_equal(np.sign(x[xi]), np.sign(self.ref[xi])):
            return True
        fin = np.isfinite(x) & np.isfinite(self.ref)
        if not fin.any():
            return False
        err = np.abs(x[fin] - self.ref[fin])
        b, w = self.bnd[fin], self.w[fin]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(err > 0, err / b, 0.0)
            z = np.where(err > 0, err / w, 0.0)
        if np.any(np.isnan(ratio) | (ratio > 1.0)):
            return True
        z = np.where(np.isnan(z), np.inf, z)
        with np.errstate(over="ignore"):
            zmax, zrms = float(z.max()), float(np.sqrt(np.mean(z * z)))
        return zmax > self.zmax_thr or zrms > self.zrms_thr


def sensitivity(case: Case, rep: Any, buggy: np.ndarray, steps: int) -> dict:
    """Smallest t with verdict(round_T(correct + t (buggy - correct))) != "match" (or == "diverges" when the
    correct output is not "match"), by bisection on log10 t in [LOG_T_MIN, 0]."""
    correct, ref, dt = case.tested, case.ref, case.dt
    want = "not match" if rep.verdict == verdict.MATCH else "diverges"
    with np.errstate(invalid="ignore", over="ignore"):
        delta = buggy - correct
    out: dict[str, Any] = {"criterion": want, "bug_rel_effect": _f(_rel_delta(delta, ref))}
    if not np.any(np.where(np.isfinite(delta), delta, 1.0) != 0):
        out.update(status="no effect", detail="the buggy output equals the correct one bit for bit")
        return out
    if not np.all(np.isfinite(delta)):
        out.update(status="caught (NaN/Inf pattern)",
                   detail="the bug makes some element non-finite: the pattern check fails at any t > 0")
        return out

    def blend(log_t: float) -> np.ndarray:
        return numerics.round_to(correct + (10.0 ** log_t) * delta, dt)

    judge = FastJudge(case, rep)

    def fast(log_t: float) -> bool:
        return judge.diverges(blend(log_t))

    def exact(log_t: float) -> tuple[bool, str]:
        r = case.compare(blend(log_t))
        hit = r.verdict != verdict.MATCH if want == "not match" else r.verdict == verdict.DIVERGES
        return hit, r.verdict

    hit1, v1 = exact(0.0)
    out["verdict_at_t1"] = v1
    out["rel_err_at_t1"] = _f(rel_fro(blend(0.0), ref))
    if not hit1:
        out.update(status="not caught", detail=f"verdict {v1!r} even for the whole bug (t = 1)")
        return out
    lo, hi = LOG_T_MIN, 0.0
    hit_lo, v_lo = exact(lo)
    if hit_lo:
        out.update(status="caught", t=_f(10.0 ** lo), rel_err=_f(rel_fro(blend(lo), ref)),
                   detail=f"caught at the smallest t tried (verdict {v_lo!r})")
        return out

    def bisect(pred: Callable[[float], bool], n: int) -> tuple[float, float]:
        return bisect_log_t(pred, lo, hi, n)

    a, b = bisect(fast, steps + 2)
    (ok_b, vb), (ok_a, _) = exact(b), exact(a)
    method = "bracketed by a fast replica of the decision, both ends confirmed by compare"
    if not ok_b or ok_a:
        a, b = bisect(lambda lt: exact(lt)[0], steps)
        vb = exact(b)[1]
        method = "compare-only bisection (the fast replica disagreed with compare)"
    out.update(status="caught", t=_f(10.0 ** b), log10_t=b, verdict_at_t=vb, method=method,
               rel_err=_f(rel_fro(blend(b), ref)), bug_part=_f(10.0 ** b * _rel_delta(delta, ref)),
               rel_err_below=_f(rel_fro(blend(a), ref)))
    return out


def bisect_log_t(pred: Callable[[float], bool], lo: float, hi: float, n: int) -> tuple[float, float]:
    """n halvings of [lo, hi] keeping pred(lo) false and pred(hi) true."""
    for _ in range(n):
        mid = 0.5 * (lo + hi)
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def _rel_delta(delta: np.ndarray, ref: np.ndarray) -> float:
    fin = np.isfinite(delta) & np.isfinite(ref)
    nref = float(np.sqrt(np.sum(np.where(fin, ref, 0.0) ** 2)))
    return float(np.sqrt(np.sum(np.where(fin, delta, 0.0) ** 2))) / nref if nref > 0 else math.inf


def stage_tightness(sw: StageWise, t64: dict, rep: Any) -> dict:
    """(a) per stage: max_i threshold_i over the largest error of the stage's legitimate evaluations (the tested
    twin's stage tensor, the stage's NumPy naive run in T and the teacher-forced torch ensemble, all on the
    twin's inputs to the stage, and the stage's own alternative algorithms run in T, ``Stage.alternatives``);
    threshold_i = min(b_i, F_max Z w_i) as in :func:`tightness`, b_i with the union bound's lam of
    refimpl.verdict.compare (one event per element for a bound with an l2 coefficient).  None for a stage both
    evaluate exactly."""
    dt = sw.dt
    u = numerics.unit_roundoff(dt)
    p = config.VERDICT_FALSE_ALARM / len(sw.stages)
    out = {}
    for st, r in zip(sw.stages, rep.stages):
        args = [t64[k] for k in st.inputs]
        ref = np.asarray(st.reference(*args), dtype=np.float64)
        bound = st.bound(*args, dtype=dt)
        fin = np.isfinite(ref)
        events = ref.size if (bound.sigma is not None and not bound.accumulation) else ref.size * max(bound.k, 1.0)
        lam = verdict.confidence_lambda(events, p, u)
        b = bound.array(dt, ref.shape, lam)
        w = verdict._weights(bound, ref, fin, dt)
        with np.errstate(invalid="ignore", over="ignore"):
            thr = np.minimum(b, r.zmax_threshold * w)
        legit = 0.0
        members = [ref + e for e in (sw.errors or {}).get(st.name, {}).values()]
        members += [np.asarray(numerics.naive_same_precision(fn, *args, dtype=dt), dtype=np.float64)
                    for _, fn in getattr(st, "alternatives", ())]
        for x in [t64[st.name], np.asarray(numerics.naive_same_precision(st.reference, *args, dtype=dt),
                                           dtype=np.float64)] + members:
            m = fin & np.isfinite(x)
            if m.any():
                legit = max(legit, float(np.max(np.abs(x[m] - ref[m]))))
        out[st.name] = None if legit == 0.0 or not fin.any() else float(np.max(thr[fin])) / legit
    return out


def stage_sensitivity(case: "Case", sw: StageWise, correct: dict, buggy: dict, buggy_out: np.ndarray | None,
                      steps: int) -> dict:
    """(b) stage-wise: the smallest t at which the stage-wise verdict of the blended stage tensors
    round_T(C + t (B - C)) is "diverges" (C the correct twin's, B the buggy twin's), by bisection on log10 t;
    rel_err is the relative error of the module output blended the same way (as :func:`sensitivity`).  The
    bisection compares the stages that diverge at t = 1 only (each with its share of the budget); the result
    is confirmed with every stage."""
    dt = sw.dt

    def blend(log_t: float) -> dict:
        t = 10.0 ** log_t
        out = {}
        for k, c in correct.items():
            bk = buggy.get(k)
            if bk is None or bk.shape != c.shape or not np.all(np.isfinite(bk - c)):
                out[k] = bk if bk is not None and log_t == 0.0 else c
            else:
                out[k] = numerics.round_to(c + t * (bk - c), dt)
        return out

    def out_rel(log_t: float) -> float:
        if buggy_out is None:
            return math.nan
        return rel_fro(numerics.round_to(case.tested + 10.0 ** log_t * (buggy_out - case.tested), dt), case.ref)

    res: dict[str, Any] = {"criterion": "diverges (stage-wise)",
                           "bug_rel_effect": _f(_rel_delta(buggy_out - case.tested, case.ref))
                           if buggy_out is not None else None}
    if buggy_out is not None and not np.any(buggy_out != case.tested):
        res.update(status="no effect", detail="the buggy output equals the correct one bit for bit")
        return res
    r1 = sw.compare(blend(0.0))
    res["verdict_at_t1"] = r1.verdict
    if r1.verdict != verdict.DIVERGES:
        res.update(status="not caught", detail=f"stage-wise verdict {r1.verdict!r} even for the whole bug (t = 1)")
        return res
    d = {r.name for r in r1.stages if r.verdict == verdict.DIVERGES}
    res["stages_at_t1"] = sorted(d)

    def hit(log_t: float, only: set | None = d) -> bool:
        return sw.compare(blend(log_t), only=only).verdict == verdict.DIVERGES

    lo, hi = LOG_T_MIN, 0.0
    if hit(lo):
        res.update(status="caught", t=_f(10.0 ** lo), rel_err=_f(out_rel(lo)), detail="caught at the smallest t")
        return res
    lo, hi = bisect_log_t(hit, lo, hi, steps)
    confirmed = hit(hi, None)
    res.update(status="caught", t=_f(10.0 ** hi), log10_t=hi, rel_err=_f(out_rel(hi)),
               rel_err_below=_f(out_rel(lo)), first_divergence=sw.compare(blend(hi)).first_divergence,
               detail="confirmed with every stage" if confirmed else
               "NOT confirmed with every stage at this t (the other stages' budget share differs)")
    return res


def stage_wise(setup: Setup, case: "Case | None" = None, steps: int = 10) -> dict | None:
    """The stage-wise verdicts of the correct twin and of every planted bug (None without a stage list), with
    (given the case) the stage-wise tightness (a) and sensitivity (b)."""
    sw = setup.stagewise
    if sw is None:
        return None
    raw = sw.tensors(setup.run)
    sw.calibrate(setup.run, raw)
    correct = _tensors64(raw)
    rep = sw.compare(correct)
    out = {"verdict": rep.verdict, "first_divergence": rep.first_divergence,
           "stages": [{"name": r.name, "verdict": r.verdict, "max_relative_bound": _f(r.max_relative_bound),
                       "max_err_over_bound": _f(r.max_err_over_bound), "k": _f(r.k), "rel_err": _f(r.rel_err)}
                      for r in rep.stages],
           "bugs": {}, "sensitivity": {}}
    if case is not None:
        tight = stage_tightness(sw, correct, rep)
        out["tightness"] = {k: _f(v) for k, v in tight.items()}
        vals = [(v, k) for k, v in tight.items() if v is not None]
        out["tightness_max"] = _f(max(vals)[0]) if vals else None
        out["tightness_stage"] = max(vals)[1] if vals else None
    for key, bug in setup.bugs.items():
        if bug.run is not None:
            buggy = _tensors64(sw.tensors(bug.run))
            b = sw.compare(buggy)
            out["bugs"][key] = {"verdict": b.verdict, "first_divergence": b.first_divergence}
            if case is not None:
                out["sensitivity"][key] = stage_sensitivity(case, sw, correct, buggy, case.buggy.get(key), steps)
    return out
