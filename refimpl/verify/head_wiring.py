"""The wiring check into a network's head (:func:`_head_wiring`, called by ``networks._wiring`` for the last
unit): the head's classifier, the foreign submodule holding the reference's ``head.weight``, must receive the
head's pre-logits features of the last unit's output.  A port that feeds it another unit's output, another token,
or the tokens without the final normalisation is a wiring divergence at the head saying what it receives.

Layer: the verify tool (NumPy; the observed tensors converted through refimpl.verify.steps).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from .. import verdict as _verdict
from ..errors import RefimplError
from .network_values import _as_layout, _same_value
from .report import StageResult

__all__: list[str] = []


def _classifier_module(subs: Mapping[str, Any], source: Mapping[str, str]) -> str | None:
    """The foreign submodule holding the reference's ``head.weight`` (and ``head.bias``) as its own parameters,
    through the naming; None when there is none."""
    fk = source.get("head.weight")
    if fk is None or not fk.endswith(".weight"):
        return None
    path = fk[: -len(".weight")]
    fb = source.get("head.bias")
    if path not in subs or (fb is not None and fb != path + ".bias"):
        return None
    return path


def _head_features(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, x: np.ndarray) -> np.ndarray | None:
    """The pre-logits features (B, D) the reference's head feeds its classifier ``head.weight`` (num_classes, D),
    from the head's input ``x``: the head run with the classifier made the identity (num_classes = D,
    head.weight = I, head.bias = 0).  None when the head is not "features, then one Linear(head.weight,
    head.bias)" (checked: the features times head.weight plus head.bias must be the head's output) or cannot be
    run so."""
    w = params.get("head.weight")
    if w is None or np.ndim(w) != 2:
        return None
    d = int(w.shape[1])
    try:
        cfg_d = dataclasses.replace(cfg, num_classes=d)
        p_d = dict(params, **{"head.weight": np.eye(d)})
        if "head.bias" in params:
            p_d["head.bias"] = np.zeros(d)
        f = np.asarray(fam.run_unit(p_d, "head", x, cfg_d), dtype=np.float64)
        r = np.asarray(fam.run_unit(params, "head", x, cfg), dtype=np.float64)
    except (RefimplError, ValueError, TypeError, KeyError):
        return None
    if f.shape != (x.shape[0], d) or r.shape != (x.shape[0], w.shape[0]):
        return None
    lin = f @ np.asarray(w).T + np.asarray(params.get("head.bias", 0.0))
    scale = float(np.max(np.abs(f), initial=0.0)) * float(np.sum(np.abs(w), axis=1).max(initial=0.0)) + \
        float(np.max(np.abs(params.get("head.bias", 0.0)), initial=0.0))
    return f if np.max(np.abs(lin - r), initial=0.0) <= 1e-10 * max(scale, 1e-300) else None


def _head_candidates(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str], run: Any,
                     xin: np.ndarray, f: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """What a port may feed its classifier in place of the features ``f`` of the head's input ``xin``: the head's
    features of another unit's output (the last unit's output not used), of the input with token j in place of
    token 0 (another token selected), and the input's token j or mean without the head's normalisation."""
    out: list[tuple[str, np.ndarray]] = []
    last = units[-2] if len(units) > 1 else None
    for v in units[:-2]:
        if v in run.outputs:
            t, _how = _as_layout(run.outputs[v], xin)
            g = None if t is None else _head_features(fam, params, cfg, t)
            if g is not None:
                out.append((f"the head's features of the output of unit {v!r}, not of the last unit {last!r}", g))
    d = f.shape[1]
    if xin.ndim == 3 and xin.shape[2] == d:
        for j in range(1, min(xin.shape[1], 1024)):
            sw = xin.copy()
            sw[:, [0, j]] = xin[:, [j, 0]]
            g = _head_features(fam, params, cfg, sw)
            if g is None or np.max(np.abs(g - f), initial=0.0) <= 1e-12 * np.max(np.abs(f), initial=0.0):
                break                          # the head does not read token 0 alone (a mean over the tokens)
            out.append((f"the head's features of token {j} of its input where the reference reads token 0", g))
        out += [(f"token {j} of the head's input without the head's normalisation", xin[:, j])
                for j in range(min(xin.shape[1], 1024))]
        out.append(("the mean over the tokens of the head's input without the head's normalisation", xin.mean(1)))
    elif xin.ndim == 4 and d in (xin.shape[1], xin.shape[3]):
        axes = (2, 3) if xin.shape[1] == d else (1, 2)
        out.append(("the mean over the grid of the head's input without the head's normalisation", xin.mean(axes)))
    return out


def _head_wiring(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str], run: Any,
                 xin: np.ndarray, r: np.ndarray, res: StageResult, dtype: str
                 ) -> tuple[StageResult, dict[str, str]] | None:
    """The wire into the head's classifier (``run``: a ``networks._NetRun`` with its classifier observed).  Where
    the head diverges, its classifier (the foreign submodule holding head.weight) computes right on what it
    receives (its output is its input times head.weight plus head.bias, within gamma_{D+1}(u) of |input|
    |head.weight| + |head.bias|; no check where that gamma is void, D u >= 1), and what it receives is not the
    reference's features of the head's input but, by value, one of :func:`_head_candidates` (another unit's output
    fed to the head, another token selected, the final normalisation skipped): a wiring divergence at the head
    saying what the classifier receives.  None otherwise (a bug inside the head stays an ordinary divergence)."""
    from .steps import _to64
    if res.verdict != _verdict.DIVERGES or run.classifier is None:
        return None
    path, gin, gout = run.classifier
    f = _head_features(fam, params, cfg, xin)
    if f is None:
        return None
    g, o = _to64(gin), _to64(gout)
    if g.size != f.size or o.size != r.size:
        return None
    g, o = g.reshape(f.shape), o.reshape(r.shape)
    w = np.asarray(params["head.weight"], dtype=np.float64)
    b = np.asarray(params.get("head.bias", np.zeros(w.shape[0])), dtype=np.float64)
    gam = _verdict.gamma(w.shape[1] + 1, _verdict.unit_roundoff(dtype))
    if not np.isfinite(gam):
        return None
    bound = gam * (np.abs(g) @ np.abs(w).T + np.abs(b))
    if not np.all(np.abs(o - (g @ w.T + b)) <= bound) or _same_value(g, f, dtype):
        return None
    tol = 64 * _verdict.unit_roundoff(dtype) * max(float(np.max(np.abs(g), initial=0.0)), 1e-300)
    found = [what for what, c in _head_candidates(fam, params, cfg, units, run, xin, f)
             if c.shape == g.shape and float(np.max(np.abs(c - g), initial=0.0)) <= tol]
    if not found:
        return None
    nf = float(np.sqrt(np.sum(f ** 2))) or 1.0
    why = (f"unit 'head': its classifier {path} computes correctly on what it receives (its output is its input "
           f"times head.weight plus head.bias) but does not receive the head's features of its input (relative "
           f"difference {float(np.sqrt(np.sum((g - f) ** 2))) / nf:.3g}): it receives {found[0]}")
    out = StageResult("head", f"{path}:input", _verdict.DIVERGES, max_abs_err=res.max_abs_err,
                      max_rel_err=res.max_rel_err, bound=res.bound, err_over_bound=res.err_over_bound,
                      detail="wiring: " + why + f" (numerically: {res.verdict}" + (
                          f", err/bound {res.err_over_bound:.3g})" if res.err_over_bound is not None else ")"))
    return out, {"kind": "wiring", "message": f"into the head: {why}"}
