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

from .. import bounds
from .. import verdict as _verdict
from ..errors import RefimplError
from .network_values import _as_layout
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


def _identity_head(params: Mapping[str, np.ndarray], cfg: Any, d: int) -> tuple[Any, dict[str, np.ndarray]]:
    """(cfg, params) of the head with its classifier made the identity: num_classes = D, head.weight = I,
    head.bias = 0 (the head's output is then its pre-logits features: products by 1 and 0 and sums of zeros are
    exact in every format)."""
    p_d = dict(params, **{"head.weight": np.eye(d)})
    if "head.bias" in params:
        p_d["head.bias"] = np.zeros(d)
    return dataclasses.replace(cfg, num_classes=d), p_d


def _head_features(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, x: np.ndarray) -> np.ndarray | None:
    """The pre-logits features (B, D) the reference's head feeds its classifier ``head.weight`` (num_classes, D),
    from the head's input ``x``: the head run with the classifier made the identity (:func:`_identity_head`).
    None when the head is not "features, then one Linear(head.weight, head.bias)" or cannot be run so.

    The check: the features f times head.weight plus head.bias must be the head's output r.  Both are float64
    evaluations of f0 W^T + b on the head's exact features f0: |f W^T + b - r| <= 2 E_lin + 2 E_f |W|^T, E_lin the
    float64 rounding of the linear map on f (bounds.e_linear in the rigorous model, once for each evaluation) and
    E_f the family's float64 bound on the features (its head bound with the identity classifier), once for f and
    once for the features inside r, carried through |W|."""
    w = params.get("head.weight")
    if w is None or np.ndim(w) != 2:
        return None
    d = int(w.shape[1])
    try:
        cfg_d, p_d = _identity_head(params, cfg, d)
        f = np.asarray(fam.run_unit(p_d, "head", x, cfg_d), dtype=np.float64)
        r = np.asarray(fam.run_unit(params, "head", x, cfg), dtype=np.float64)
        if f.shape != (x.shape[0], d) or r.shape != (x.shape[0], w.shape[0]):
            return None
        e_f = fam.unit_bound(p_d, "head", x, cfg_d, dtype="float64").array("float64", f.shape)
    except (RefimplError, ValueError, TypeError, KeyError):
        return None
    w = np.asarray(w, dtype=np.float64)
    b = params.get("head.bias")
    b = None if b is None else np.asarray(b, dtype=np.float64)
    lin = f @ w.T + (0.0 if b is None else b)
    tol = 2 * bounds.e_linear(f, np.zeros_like(f), w, b, bounds.Precision.of("float64")) + 2 * (e_f @ np.abs(w).T)
    return f if np.all(np.abs(lin - r) <= tol) else None


def _features_bound(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, x: np.ndarray, shape: tuple[int, ...],
                    dtype: str) -> np.ndarray | None:
    """The bound on |the head's features of ``x`` evaluated in ``dtype`` - the float64 ones| (``x`` T values):
    the family's bound of the head with the identity classifier (:func:`_identity_head`), ``Bound.array``: the
    T evaluation's roundings (the head's normalisation, its pooling or token selection, and the identity
    classifier's sum and bias, which are exact: an over-count of gamma_{D+1} |f|) plus the float64 reference's
    own.  None where the family has no such bound."""
    try:
        cfg_d, p_d = _identity_head(params, cfg, shape[-1])
        return fam.unit_bound(p_d, "head", x, cfg_d, dtype=dtype).array(dtype, shape)
    except (RefimplError, ValueError, TypeError, KeyError):
        return None


def _head_candidates(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str], run: Any,
                     xin: np.ndarray, f: np.ndarray, dtype: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """What a port may feed its classifier in place of the features ``f`` of the head's input ``xin``: the head's
    features of another unit's output (the last unit's output not used), of the input with token j in place of
    token 0 (another token selected), and the input's token j or mean without the head's normalisation.  Each as
    (what, c, e): c the candidate in float64 from the tested run's tensors (T values), e the bound on |g - c| for
    g the same computation in T (:func:`_features_bound` for the head's features; 0 for a token, a copy; for a
    mean, bounds.e_mean in T plus in float64, the reference's own rounding)."""
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    last = units[-2] if len(units) > 1 else None
    for v in units[:-2]:
        if v in run.outputs:
            t, _how = _as_layout(run.outputs[v], xin)
            g = None if t is None else _head_features(fam, params, cfg, t)
            e = None if g is None else _features_bound(fam, params, cfg, t, g.shape, dtype)
            if e is not None:
                out.append((f"the head's features of the output of unit {v!r}, not of the last unit {last!r}", g, e))
    d = f.shape[1]
    pt, p64 = bounds.Precision.of(dtype), bounds.Precision.of("float64")

    def mean(axes: Any) -> tuple[np.ndarray, np.ndarray]:
        zero = np.zeros_like(xin)
        return xin.mean(axes), bounds.e_mean(xin, zero, axes, pt) + bounds.e_mean(xin, zero, axes, p64)
    if xin.ndim == 3 and xin.shape[2] == d:
        e64_f = _features_bound(fam, params, cfg, xin, f.shape, "float64")
        for j in range(1, min(xin.shape[1], 1024)):
            sw = xin.copy()
            sw[:, [0, j]] = xin[:, [j, 0]]
            g = _head_features(fam, params, cfg, sw)
            e64 = None if g is None else _features_bound(fam, params, cfg, sw, g.shape, "float64")
            if e64 is None or e64_f is None or np.all(np.abs(g - f) <= e64 + e64_f):
                break       # the head does not read token 0 alone (a mean over the tokens: the same features,
                            # up to the float64 rounding of each evaluation)
            e = _features_bound(fam, params, cfg, sw, g.shape, dtype)
            if e is not None:
                out.append((f"the head's features of token {j} of its input where the reference reads token 0", g, e))
        out += [(f"token {j} of the head's input without the head's normalisation", xin[:, j], np.zeros_like(f))
                for j in range(min(xin.shape[1], 1024))]
        out.append(("the mean over the tokens of the head's input without the head's normalisation", *mean(1)))
    elif xin.ndim == 4 and d in (xin.shape[1], xin.shape[3]):
        axes = (2, 3) if xin.shape[1] == d else (1, 2)
        out.append(("the mean over the grid of the head's input without the head's normalisation", *mean(axes)))
    return out


def _head_wiring(fam: Any, params: Mapping[str, np.ndarray], cfg: Any, units: list[str], run: Any,
                 xin: np.ndarray, r: np.ndarray, res: StageResult, dtype: str
                 ) -> tuple[StageResult, dict[str, str]] | None:
    """The wire into the head's classifier (``run``: a ``networks._NetRun`` with its classifier observed).  Where
    the head diverges, its classifier (the foreign submodule holding head.weight) computes right on what it
    receives (its output is its input times head.weight plus head.bias within bounds.e_linear's rule in T and in
    float64; no check where that bound is void, sums(D) u >= 1), and what it receives is not the reference's
    features of the head's input (not within their bound, :func:`_features_bound`, at some element; a void bound
    shows nothing to be them) but one of :func:`_head_candidates` (another unit's output fed to the head, another
    token selected, the final normalisation skipped), within that candidate's bound at every element (a void
    bound names nothing): a wiring divergence at the head saying what the classifier receives.  None otherwise (a
    bug inside the head stays an ordinary divergence)."""
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
    b = params.get("head.bias")
    b = None if b is None else np.asarray(b, dtype=np.float64)
    # the classifier's output o is g W^T + b evaluated in T on exact operands (g, W, b are T values): within
    # bounds.e_linear in T's rigorous model (the D-term sum as Precision.sums counts it, the bias, D eta), and the
    # float64 value it is compared with carries the same rule in float64
    zero = np.zeros_like(g)
    bound = bounds.e_linear(g, zero, w, b, bounds.Precision.of(dtype)) + \
        bounds.e_linear(g, zero, w, b, bounds.Precision.of("float64"))
    lin = g @ w.T + (0.0 if b is None else b)
    if not np.all(np.isfinite(bound)) or not np.all(np.abs(o - lin) <= bound):
        return None
    # what it receives is the head's features of its input where it is within their bound (the head with the
    # identity classifier evaluated in T on the T values xin, and the float64 reference's own rounding)
    e_f = _features_bound(fam, params, cfg, xin, f.shape, dtype)
    if e_f is not None and np.all(np.isfinite(e_f)) and np.all(np.abs(g - f) <= e_f):
        return None
    found = [what for what, c, e in _head_candidates(fam, params, cfg, units, run, xin, f, dtype)
             if c.shape == g.shape and np.all(np.isfinite(e)) and np.all(np.abs(c - g) <= e)]
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
