"""The steps shared by a module's verification (:mod:`.run`) and a network's (:mod:`.networks`): the dtypes and
their torch names, the argument checks (``grad`` included), the precision findings of a run, the conclusion (the
verdict, the first divergence, the shadow run's and the gradients' verdicts), and the Hypothesis examples' common
part (the module factory, the score of a matching example, running the examples and picking the report shown).

Layer: the verify tool (torch, imported inside the functions).  Imports the verdict and :mod:`.loading` /
:mod:`.report` only, so that :mod:`.run` and :mod:`.networks` both sit above it (no
``networks -> run -> networks`` import cycle).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import verdict as _verdict
from .loading import VerifyError, load_target
from .report import Report, StageResult, _f

__all__ = ["DTYPES"]

DTYPES = ("float64", "float32", "float16", "bfloat16")


def _torch_dtype(name: str) -> Any:
    import torch
    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def _to64(t: Any) -> np.ndarray:
    return _verdict._to_numpy64(t)


def _check_arguments(dtype: str, batch: Any, seed: Any, hw: Any, device: str) -> None:
    import torch

    if dtype not in DTYPES:
        raise VerifyError(f"argument 'dtype': expected one of {DTYPES}, got {dtype!r}")
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


def _check_grad(grad: Any) -> None:
    """``grad`` is a bool."""
    if not isinstance(grad, bool):
        raise VerifyError(f"argument 'grad': expected True or False, got {grad!r}")


def _example_factory(module: Any) -> Any:
    """The class or factory ``verify_examples`` builds each example's module with: a ``"pkg.mod:Name"`` /
    ``"file.py:Name"`` string loaded; an instance refused (each example needs a fresh module)."""
    import torch
    if isinstance(module, str):
        module = load_target(module)
    if isinstance(module, torch.nn.Module):
        raise VerifyError("argument 'examples': needs the module's class or factory (each example builds a fresh "
                          "module), got an instance")
    return module


def _example_score(r: Report) -> float:
    """How close a matching example came to its bounds: the largest err/bound of its stages, shadow stages, whole
    module and gradients."""
    grads = [t["err_over_bound"] for t in (r.gradients or {}).get("tensors", [])
             if isinstance(t.get("err_over_bound"), float)]
    return max([s_.err_over_bound or 0.0 for s_ in r.stages + (r.shadow or [])] +
               [r.whole_module["err_over_bound"]] + grads)


def _run_examples(run: Any, examples: int, failing: list, worst: dict, failed: Any, shown: Any) -> Report:
    """Run the Hypothesis test ``run`` (which appends (report, example) to ``failing`` and raises AssertionError on
    a verdict other than match, and keeps the example closest to its bound in ``worst``); return the shrunk
    failing example's report, or the closest one's, with a finding naming the example (``failed(ex)`` /
    ``shown(ex)`` describe it)."""
    from hypothesis.errors import HypothesisException
    try:
        run()
    except AssertionError:
        pass
    except HypothesisException as exc:  # pragma: no cover - a Hypothesis usage problem, reported as such
        raise VerifyError(f"argument 'examples': Hypothesis could not run the examples ({exc})") from exc
    if failing:
        report, ex = failing[-1]            # the last failure raised is the shrunk one Hypothesis reports
        report.findings.append({"kind": "example", "message": f"the smallest failing example of {examples}: "
                                                              f"{failed(ex)}"})
        return report
    report = worst["report"]
    report.findings.append({"kind": "example", "message": f"all {examples} example(s) match; shown: the closest to "
                                                          f"its bound, {shown(worst['example'])}"})
    return report


def _precision_findings(run: Any, dtype: str) -> list[dict[str, str]]:
    import torch

    asked = _torch_dtype(dtype)
    findings = []
    if run.out.dtype != asked:
        findings.append({"kind": "dtype", "message": f"the module returned {run.out.dtype} when run in {dtype}"})
    for dt_, ops in run.other_dtypes.items():
        lower = torch.finfo(dt_).eps > torch.finfo(asked).eps
        names = ", ".join(sorted(set(ops))[:8])
        findings.append({"kind": "dtype" if lower else "note", "message": (
            f"{len(ops)} operation(s) of the forward compute in {str(dt_).replace('torch.', '')}, "
            f"{'a lower' if lower else 'a higher'} precision than the {dtype} asked ({names}); the bounds assume "
            f"{dtype}" + (": the module may be judged divergent for it" if lower else ""))})
    if getattr(run.out, "is_cuda", False):
        findings += _cuda_findings(dtype)
    return findings


def _cuda_findings(dtype: str) -> list[dict[str, str]]:
    """What the CUDA backends' settings do to the arithmetic the bounds assume: TF32 for float32 matmuls and
    convolutions (inputs rounded to 10-bit mantissas: a correct module may be judged divergent), and cuBLAS's
    reduced-precision split-K reductions for float16 / bfloat16 (partial sums rounded to T, where the bounds
    assume sums accumulated in config.ACCUMULATION_FORMAT)."""
    import torch

    out = []
    if dtype == "float32":
        tf32 = [name for name, on in (
            ("torch.backends.cuda.matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32
             or torch.get_float32_matmul_precision() != "highest"),
            ("torch.backends.cudnn.allow_tf32", torch.backends.cudnn.allow_tf32)) if on]
        if tf32:
            out.append({"kind": "dtype", "message": (
                f"TF32 is allowed on CUDA ({', '.join(tf32)}): float32 matmuls / convolutions may round their "
                "inputs to 10-bit mantissas, far coarser than float32; the bounds assume float32 arithmetic, so the "
                "module may be judged divergent for it.  Verify float32 arithmetic with these set to False (and "
                "torch.set_float32_matmul_precision('highest'))")})
    elif dtype in ("float16", "bfloat16"):
        flag = f"allow_{'fp16' if dtype == 'float16' else 'bf16'}_reduced_precision_reduction"
        if getattr(torch.backends.cuda.matmul, flag, False):
            out.append({"kind": "note", "message": (
                f"torch.backends.cuda.matmul.{flag} is True: cuBLAS may round split-K partial sums to {dtype}, "
                "where the bounds assume sums accumulated in float32 (config.ACCUMULATION_FORMAT); set it to False "
                "if the verdict is 'diverges' by a small factor")})
    return out


NOT_SHADOWED = "not shadowed"


def _first(results: list[StageResult]) -> dict[str, Any] | None:
    """The first diverging stage of ``results`` (a first_divergence), or None; ``part``: its first diverging part
    where the stage (a network unit) was judged part by part, else None."""
    first = next((r for r in results if r.verdict == _verdict.DIVERGES), None)
    if first is None:
        return None
    part = next((q.name for q in first.parts or () if q.verdict == _verdict.DIVERGES), None)
    return {"stage": first.name, "part": part,
            "why": first.detail or f"error {first.max_abs_err:.3g} against a bound of {first.bound:.3g}",
            "max_abs_err": _f(first.max_abs_err), "err_over_bound": _f(first.err_over_bound)}


def _conclude(results: list[StageResult], whole: Any, got: np.ndarray, want: np.ndarray
              ) -> tuple[str, dict[str, Any] | None]:
    """The verdict and the first divergence.  "diverges" when a stage or the whole module does; "match" when
    the whole module matches, or every stage was observed and matches; otherwise "inconclusive"."""
    first = _first(results)
    observed_all = all(r.verdict != "not observed" for r in results)
    if first is not None or whole.verdict == _verdict.DIVERGES:
        verdict = _verdict.DIVERGES
    elif whole.verdict == _verdict.MATCH or (observed_all and all(r.verdict == _verdict.MATCH for r in results)):
        verdict = _verdict.MATCH
    else:
        verdict = _verdict.INCONCLUSIVE
    if first is not None:
        return verdict, first
    if whole.verdict == _verdict.DIVERGES:
        return verdict, {"stage": "output",
                         "why": "the whole module diverges while every observed stage matches: the defect lies "
                                "between observation points; " + "; ".join(whole.reasons),
                         "max_abs_err": _f(np.max(np.abs(got - want))), "err_over_bound": _f(whole.max_err_over_bound)}
    return verdict, None


def _with_shadow(verdict: str, shadowed: list[StageResult] | None) -> str:
    """The verdict with the shadow run's: "diverges" when a shadowed stage diverges."""
    if shadowed is not None and any(r.verdict == _verdict.DIVERGES for r in shadowed):
        return _verdict.DIVERGES
    return verdict


def _with_gradients(verdict: str, gradients: dict[str, Any] | None) -> str:
    """The verdict with the gradients' (``--grad``): "diverges" when the forward or a gradient diverges; "match"
    when both match; otherwise "inconclusive"."""
    if gradients is None:
        return verdict
    g = gradients.get("verdict", _verdict.INCONCLUSIVE)
    if _verdict.DIVERGES in (verdict, g):
        return _verdict.DIVERGES
    if verdict == _verdict.MATCH and g == _verdict.MATCH:
        return _verdict.MATCH
    return _verdict.INCONCLUSIVE
