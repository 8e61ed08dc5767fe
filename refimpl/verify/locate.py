"""Locating a reference stage's tensor among the tensors a foreign forward computed, whatever their layout.

Layer: the verify tool (NumPy; torch only inside :func:`recorder`, the op recorder both verifiers use).  A port
splits heads as it likes: (B, h, N, d), (B, N, h, d), (B h, N, d),
(B, N, C) with the heads merged, transposed for a contraction...  :func:`locate` tries each recorded tensor of
the right size in every axis order, read either as the reference's layout or as merged heads, and keeps the
layout closest to the teacher-forced reference value (relative Frobenius distance); of the tensors within the
stage's own bound it takes the last.  It only finds the tensor; the verdict then judges it
(config.VERIFY_LOCATE_GATE).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Collection, Iterator, Sequence

import numpy as np

from .. import verdict as _verdict

__all__ = ["conclusive", "layouts", "locate", "recorder", "to_foreign", "within"]

#: tensors with more axes are not permuted (5! = 120 orders at most)
_MAX_PERMUTED_AXES = 5


def layouts(f: np.ndarray, shape: Sequence[int]) -> Iterator[tuple[np.ndarray, str]]:
    """``f`` read in the reference ``shape``: every order of its axes, then a reshape to ``shape``; for a 4-axis
    (B, h, N, d) reference also as merged heads (B, N, h, d) moved to (B, h, N, d)."""
    shape = tuple(int(s) for s in shape)
    if f.size != math.prod(shape):
        return
    perms = itertools.permutations(range(f.ndim)) if f.ndim <= _MAX_PERMUTED_AXES else [tuple(range(f.ndim))]
    for perm in perms:
        g = f.transpose(perm) if perm != tuple(range(f.ndim)) else f
        how = "" if perm == tuple(range(f.ndim)) else f"axes {perm}, "
        yield g.reshape(shape), how + f"read as {shape}"
        if len(shape) == 4:
            b, h, n, d = shape
            yield g.reshape(b, n, h, d).transpose(0, 2, 1, 3), how + f"heads split from ({b}, {n}, {h}x{d})"


def _rel(a: np.ndarray, r: np.ndarray, nr: float) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        d = float(np.sqrt(np.sum((a - r) ** 2)))
    return d / nr if nr > 0 else (0.0 if d == 0 else math.inf)


def _norm_slack(n: int) -> float:
    """The relative float64 rounding of one Frobenius norm of ``n`` elements, ``np.sqrt(np.sum(f ** 2))``: the n
    squares and the (n - 1)-term sum are gamma_n(u_64) relative (every term is non-negative, Higham §3.1), the
    square root halves that and adds one rounding: at most gamma_{n+1}(u_64)."""
    return _verdict.gamma(n + 1, _verdict.unit_roundoff("float64"))


def conclusive(bound: np.ndarray | None, ref: np.ndarray) -> bool:
    """Whether the element-wise ``bound`` on |a legitimate evaluation of ``ref`` - ``ref``| can tell a
    legitimate value from another: finite everywhere and, at every element, below the quantity's size
    max(|ref_i|, rms(ref)) (the verdict's relative bound below 1, without its floor for T's subnormal range: a
    stricter condition).  A bound that is not says nothing about which candidate is the stage."""
    if bound is None:
        return False
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), ref.shape)
    if not np.all(np.isfinite(b)) or not np.all(np.isfinite(ref)):
        return False
    rms = float(np.sqrt(np.mean(ref ** 2))) if ref.size else 0.0
    return bool(np.all(b < np.maximum(np.abs(ref), rms)))


def within(a: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> bool:
    """|a - ref| <= bound at every element (equal non-finite values count as equal): ``a`` is a value the error
    model allows for the quantity ``ref`` whose legitimate evaluations it bounds by ``bound``."""
    with np.errstate(over="ignore", invalid="ignore"):
        ok = (np.abs(a - ref) <= bound) | (a == ref) | (np.isnan(a) & np.isnan(ref))
    return bool(np.all(ok))


def locate(pool: Sequence[tuple[str, np.ndarray]], ref: np.ndarray, bound: np.ndarray | None = None
           ) -> tuple[np.ndarray, str, float, int] | None:
    """The (tensor in the reference's layout, "label: layout", relative distance, first position) of the
    recorded tensor taken for the stage whose reference value is ``ref``; None when no recorded tensor has
    ``ref``'s size.  Each recorded tensor is read in the layout closest to ``ref`` (relative Frobenius distance).

    ``bound``: the stage's element-wise bound on |a legitimate evaluation - ``ref``| (its
    ``Bound.array(dtype, shape)``: the tested evaluation's roundings in T, the float64 reference's own, the
    underflow terms), or None.  Where it is conclusive (:func:`conclusive`), the recorded tensors within it at
    every element (:func:`within`) are each a value the error model allows for the stage: they cannot be told
    apart by value (a chain of element-wise steps such as den -> den + eps whose steps are below the rounding,
    copies, reshapes, V and the attention output with one token).  Of those, the one recorded last, the end of
    the chain, is taken, and the position of the first is returned: when the value first existed, the earliest
    point a later stage can have been computed from it.  Where none is within the bound, or the bound is None or
    not conclusive, the closest tensor is taken, with its exact copies (equal distance: the same values).

    Why the bound decides: a tensor outside the stage's deterministic bound at some element is no legitimate
    evaluation of the stage, and the verdict, whose probabilistic bound never exceeds the deterministic one,
    would judge it outside its bound; among the tensors within it the error model has no preference, and the end
    of the chain is the value the module computes on with.  Where none is within it, every candidate is outside
    it (or non-finite where ``ref`` is not) and no choice among them is a match; where the bound cannot tell
    values apart, the closest is the one taken.

    A cheap invariant skips tensors first: the Frobenius norm, which no layout changes, differs from ``ref``'s by
    at most the distance (the triangle inequality), so a tensor whose norm differs by more than the best distance
    so far and more than ``||bound||`` (what a value within the bound can be at most) is neither of those, up to
    the float64 rounding of the two norms (:func:`_norm_slack`)."""
    nr = float(np.sqrt(np.sum(ref ** 2)))
    use = conclusive(bound, ref)
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), ref.shape) if use else None
    beta = float(np.sqrt(np.sum(b ** 2))) / nr if use and nr > 0 else 0.0
    slack = _norm_slack(ref.size)
    found: list[tuple[int, np.ndarray, str, float, bool]] = []
    best = math.inf
    for pos, (label, f) in enumerate(pool):
        if f.size != ref.size:
            continue
        nf = float(np.sqrt(np.sum(f ** 2)))
        if abs(nf - nr) > max(best, beta) * nr + slack * (nf + nr):     # neither closest nor within the bound
            continue
        cand = None
        for arr, how in layouts(f, ref.shape):
            d = _rel(arr, ref, nr)
            if cand is None or d < cand[3]:
                cand = (pos, arr, f"{label}: {how}", d)
        if cand is not None:
            found.append(cand + (use and within(cand[1], ref, b),))
            best = min(best, cand[3])
    if not found:
        return None
    close = [c for c in found if c[4]] or [c for c in found if c[3] <= best]
    pos, arr, label, d, _ok = max(close, key=lambda c: c[0])
    return arr, label, d, min(c[0] for c in close)


def to_foreign(value: np.ndarray, foreign: np.ndarray, ref: np.ndarray) -> np.ndarray | None:
    """``value``, in the reference's layout (the shape of ``ref``), in the layout of the foreign tensor
    ``foreign``: the inverse of the reading of ``foreign`` (:func:`layouts`: an axis order and a reshape, a
    permutation of the elements) closest to ``ref``; the identity when the shapes agree; None when the sizes
    differ.  Used to feed a foreign submodule the reference's own value of its input (shadow mode)."""
    if foreign.shape == value.shape:
        return value
    nr = float(np.sqrt(np.sum(ref ** 2)))
    idx = np.arange(foreign.size).reshape(foreign.shape)
    best = None
    for (arr, _how), (where, _) in zip(layouts(foreign, ref.shape), layouts(idx, ref.shape)):
        d = _rel(arr, ref, nr)
        if best is None or d < best[0]:
            best = (d, where)
    if best is None:
        return None
    out = np.empty(foreign.size, dtype=value.dtype)
    out[best[1].ravel()] = np.asarray(value).ravel()
    return out.reshape(foreign.shape)


#: op names whose result cannot be recomputed (random draws): an op of another dtype among them is always reported
_RANDOM_OPS = ("rand", "normal", "bernoulli", "multinomial", "dropout", "poisson", "uniform_", "exponential_",
               "cauchy_", "geometric_", "log_normal_", "random_")
#: conversion methods: redone as a conversion to the asked dtype (``x.float()`` in a float64 run is ``x`` there)
_CONVERSIONS = ("float", "half", "bfloat16", "double")


def _inplace(fname: str) -> bool:
    return fname == "__setitem__" or (fname.startswith("__i") and fname.endswith("__")) or (
        fname.endswith("_") and not fname.endswith("__"))


def _same(a: Any, b: Any) -> bool:
    """Equal values (NaN equal to NaN), compared in the wider of the two dtypes."""
    import torch
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape or not (
            a.is_floating_point() and b.is_floating_point()):
        return False
    wide = a.dtype if torch.finfo(a.dtype).eps <= torch.finfo(b.dtype).eps else b.dtype
    a, b = a.detach().to(wide), b.detach().to(wide)
    return bool(torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all()))


def _redo(asked: Any, func: Any, fname: str, args: tuple, kwargs: dict) -> Any:
    """``func`` evaluated again with every floating tensor argument in another dtype than ``asked`` converted to
    ``asked``, every floating dtype argument replaced by ``asked``, a conversion method (``.float()``) made a
    conversion to ``asked``, and tensors created without a dtype created in ``asked``: what the same operation
    gives on the same values when computed in the dtype asked.  Raises what ``func`` raises."""
    import torch

    def sub(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != asked:
            return a.detach().to(asked)
        if isinstance(a, torch.dtype) and a.is_floating_point and a != asked:
            return asked
        if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
            return type(a)(sub(v) for v in a)
        return a

    a2, k2 = sub(tuple(args)), {k: sub(v) for k, v in kwargs.items()}
    if _inplace(fname):                     # the target, converted (a copy), is what the op changes
        func(*a2, **k2)
        return a2[0]
    if fname in _CONVERSIONS and a2 and isinstance(a2[0], torch.Tensor):
        return a2[0].to(asked)
    floating_in = any(isinstance(a, torch.Tensor) and a.is_floating_point()
                      for a in list(args) + list(kwargs.values()))
    default = torch.get_default_dtype()
    if floating_in or default == asked:
        return func(*a2, **k2)
    try:                                    # a creation op (zeros, arange, tensor...) in the default dtype
        torch.set_default_dtype(asked)
    except (TypeError, RuntimeError):
        return func(*a2, **k2)
    try:
        return func(*a2, **k2)
    finally:
        torch.set_default_dtype(default)


def _inexact(asked: Any, func: Any, fname: str, args: tuple, kwargs: dict, outs: Sequence[Any],
             which: Sequence[int]) -> list[int]:
    """The positions in ``which`` of the results ``outs`` (computed in another dtype than ``asked``; in place: the
    target after the op, ``args[0]`` its value before) that do not hold exactly what the same operation computed in
    ``asked`` gives (:func:`_redo`).  Values the other dtype holds exactly - a mask of 0 / -100, labels, an index
    table, a roll or a reshape of such values - are exact.  All of ``which`` where the op cannot be recomputed (a
    random draw) or the recomputation fails."""
    import torch
    if any(r in fname for r in _RANDOM_OPS):
        return list(which)
    try:
        again = _redo(asked, func, fname, args, kwargs)
    except Exception:  # noqa: BLE001 - whatever the op raises on the asked dtype: it cannot be shown exact
        return list(which)
    again = again if isinstance(again, (tuple, list)) else (again,)
    if len(again) != len(outs):
        return list(which)
    return [i for i in which if not (isinstance(again[i], torch.Tensor) and _same(outs[i], again[i]))]


def recorder(asked: Any, sizes: Collection[int], recorded: list, other_dtypes: dict[Any, list[str]],
             tag: Callable[[], Any] | None = None) -> Any:
    """A ``torch.overrides.TorchFunctionMode`` that records, for :func:`locate`, every floating tensor an op of
    the forward computes whose size is in ``sizes`` (appended to ``recorded`` as ``("#i op", tensor)``, or
    ``("#i op", tag(), tensor)`` with ``tag``: the unit it was computed in), and every op that computes in another
    dtype than ``asked`` *and changes a value by it* (``other_dtypes``: dtype -> op names): an op whose floating
    result (or, in place, whose target) is of another dtype is evaluated again in ``asked`` on the same values
    (:func:`_redo`: its other-dtype floating arguments converted to ``asked``; ``x.float()`` in a float64 run is
    ``x``) and reported only where the two differ.  Ops on values the other dtype holds exactly (a float32
    shifted-window mask of 0 / -100, region labels, a padding indicator, rolled and cut into windows) are not;
    a ``.float()`` of an activation, a float32 matmul, a float32 sin table are.  Random draws are always
    reported.  Torch is imported here only."""
    import torch

    class _Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args_=(), kwargs_=None):
            kwargs_ = kwargs_ or {}
            fname = getattr(func, "__name__", str(func))
            target = args_[0] if args_ and _inplace(fname) else None
            before = None
            if isinstance(target, torch.Tensor) and target.is_floating_point() and target.dtype != asked:
                before = target.detach().clone()
            res = func(*args_, **kwargs_)
            if before is not None:                  # in place: the target redone from its value before
                if _inexact(asked, func, fname, (before,) + tuple(args_[1:]), kwargs_, (target,), (0,)):
                    other_dtypes.setdefault(target.dtype, []).append(fname)
            outs = res if isinstance(res, (tuple, list)) else (res,)
            other = [i for i, t in enumerate(outs) if isinstance(t, torch.Tensor) and t.is_floating_point()
                     and t.dtype != asked]
            if other and before is None and not _inplace(fname):
                for i in _inexact(asked, func, fname, args_, kwargs_, outs, other):
                    other_dtypes.setdefault(outs[i].dtype, []).append(fname)
            for t in outs:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() in sizes:
                    label = f"#{len(recorded)} {fname}"
                    recorded.append((label, t.detach()) if tag is None else (label, tag(), t.detach()))
            return res

    return _Recorder()
