"""The steps shared by a module's verification (:mod:`.run`) and a network's (:mod:`.networks`): the dtypes and
their torch names, the argument checks, the precision findings of a run, and the conclusion (the verdict, the
first divergence, the shadow run's verdict).

Layer: the verify tool (torch, imported inside the functions).  Imports the verdict and :mod:`.loading` /
:mod:`.report` only, so that :mod:`.run` and :mod:`.networks` both sit above it (architecture issue 12: the
former ``networks -> run -> networks`` import cycle).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import verdict as _verdict
from .loading import VerifyError
from .report import StageResult, _f

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
    return findings


NOT_SHADOWED = "not shadowed"


def _first(results: list[StageResult]) -> dict[str, Any] | None:
    """The first diverging stage of ``results`` (a first_divergence), or None."""
    first = next((r for r in results if r.verdict == _verdict.DIVERGES), None)
    if first is None:
        return None
    return {"stage": first.name,
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
