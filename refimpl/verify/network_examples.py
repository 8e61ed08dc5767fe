"""Verifying a registered network on many drawn inputs: ``refimpl verify NET --examples N``.

Layer: the verify tool (torch).  :func:`verify_network_examples` draws image sizes (on the network's size step,
:func:`image_step`), the batch and the seed with Hypothesis and runs :func:`refimpl.verify.networks.verify_network`
on each (with ``grad``, its gradients too); a network built for one resolution is rebuilt per size through the
target's size keyword (:data:`SIZE_KEYWORDS`), with the same weights where every parameter keeps its shape; the
worst report, or the shrunk failing example, is returned.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from .. import verdict as _verdict
from ..errors import RefimplError
from .loading import VerifyError, load_weights
from .networks import network_config, size_field, verify_network
from .report import Report

__all__ = ["verify_network_examples", "image_step", "size_keyword", "SIZE_KEYWORDS"]


def image_step(fam: Any, cfg: Any) -> int | None:
    """The step of the image sizes a network accepts, for ``examples``: the smallest s <= 64 (powers of two first,
    then the other integers) for which the reference runs a (3 s, 2 s) image (non-square, one side an odd
    multiple); a network built for one resolution (:func:`size_field`) is rebuilt for each size tried.  None when
    none is accepted."""
    rng = np.random.default_rng(0)
    field = size_field(cfg)
    params = None if field is not None else fam.init_params(cfg, rng)
    for s in (1, 2, 4, 8, 16, 32, 64) + tuple(v for v in range(3, 65) if v & (v - 1)):
        try:
            c = cfg if field is None else dataclasses.replace(cfg, **{field: (3 * s, 2 * s)})
            p = params if field is None else fam.init_params(c, rng)
            fam.run(p, rng.standard_normal((1, getattr(cfg, "in_chans", 3), 3 * s, 2 * s)), c)
        except (ValueError, TypeError):
            continue
        return s
    return None


#: the keywords a class or factory may take a network's image size by (``examples`` rebuilds it per drawn size)
SIZE_KEYWORDS = ("img_size", "image_size", "input_size", "input_resolution", "resolution", "image_hw", "hw")


def size_keyword(factory: Any, init: Mapping[str, Any] | None) -> str | None:
    """The keyword ``factory`` takes the image size by: one of :data:`SIZE_KEYWORDS` given in ``init``, else one
    its signature names; None when it has none."""
    import inspect
    given = [k for k in SIZE_KEYWORDS if k in (init or {})]
    if given:
        return given[0]
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    return next((k for k in SIZE_KEYWORDS if k in params and params[k].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)), None)


def _size_value(given: Any, h: int, w: int) -> Any:
    """The image size (h, w) in the form the user gave it in ``init`` (an int for a square size, a list, a tuple)."""
    if isinstance(given, (int, np.integer)) and not isinstance(given, bool):
        return int(h)
    return [int(h), int(w)] if isinstance(given, list) else (int(h), int(w))


def _refuse_fixed(reference: str, cfg: Any, factory: Any) -> VerifyError:
    import inspect
    field = size_field(cfg)
    size = tuple(getattr(cfg, field))
    try:
        sig = str(inspect.signature(factory))
    except (TypeError, ValueError):
        sig = "(...)"
    name = getattr(factory, "__qualname__", getattr(factory, "__name__", repr(factory)))
    return VerifyError(
        f"argument 'examples': {reference} is built for one resolution (its config's {field} = {size}), so each "
        f"drawn image size needs the foreign network rebuilt for it; expected a class or factory taking the image "
        f"size by one of the keywords {', '.join(SIZE_KEYWORDS)} (in its signature, or given in --init, e.g. "
        f"--init '{{\"img_size\": [{size[0]}, {size[1]}]}}'), got {name}{sig}, which takes none: add such a "
        f"keyword, or verify at {size[0]} x {size[1]} without --examples")


def _sizes_keeping_shapes(fam: Any, cfg: Any, field: str, step: int, top: int, square: bool
                          ) -> list[tuple[int, int]]:
    """The image sizes (multiples of ``step`` up to ``top``; square ones where ``square``) that the configuration
    accepts and at which every parameter keeps its shape at ``cfg``'s size (the same weights load there), smallest
    first; a :class:`VerifyError` naming a parameter whose shape moves when there is none."""
    base = fam.param_shapes(cfg)
    keep, moved = [], None
    grid = [(m * step, n * step) for m in range(1, top // step + 1) for n in range(1, top // step + 1)
            if not square or m == n]
    for h, w in sorted(grid, key=lambda t: (t[0] * t[1], t)):
        try:
            shapes = fam.param_shapes(dataclasses.replace(cfg, **{field: (h, w)}))
        except (ValueError, TypeError):
            continue
        diff = sorted(k for k in base if tuple(shapes.get(k, ())) != tuple(base[k]))
        if diff:
            moved = moved or (h, w, diff[0], tuple(shapes.get(diff[0], ())), len(diff))
        else:
            keep.append((h, w))
    if not keep:
        h, w, k, shape, n = moved if moved else (None, None, None, None, 0)
        raise VerifyError(
            f"argument 'weights': the same weights at each drawn image size need parameters whose shapes do not "
            f"depend on it; expected an image size up to {top} (--max-side) at which they keep the weights' shapes, "
            f"got none" + (f": at {h} x {w} {k} has shape {shape}, the weights' {tuple(base[k])} ({n} such key(s))"
                           if moved else "") +
            "; drop --weights (random weights drawn per example), raise --max-side, or verify at the weights' "
            "resolution without --examples")
    return keep


def verify_network_examples(module: Any, reference: str, examples: int, *, max_side: int | None = None,
                            seed: int = 0, grad: bool = False, **kwargs: Any) -> Report:
    """:func:`verify_network` on ``examples`` inputs drawn by Hypothesis from ``seed``: the image size (H and W each
    a multiple of the network's :func:`image_step` up to ``max_side``, by default the largest side of the image
    :func:`verify_network` uses without ``hw``; sizes the reference refuses are rejected, not counted), the batch
    (1 or 2) and the seed of the weights and images (0 to 15).  Returns the report of the failing example
    Hypothesis shrinks to, or, when every example matches, of the one closest to its bound; ``findings`` say which
    example it is.  ``module`` must be a class or factory (each example builds a fresh network).

    A network built for one resolution (a config with ``img_size`` / ``image_size``: FLatten DeiT / PVT / Swin /
    CSwin, Castling, LiSANet...) is rebuilt for each drawn size on both sides: the reference's config gets the
    size, and the foreign class or factory is called with it by its size keyword (:func:`size_keyword`: given in
    ``init``, in the form given there, an int meaning square sizes; or named by its signature).  A target without
    one is refused (a :class:`VerifyError` saying what it needs).  With ``weights`` the same weights are loaded at
    every size (their derived buffers - masks, index tables - are checked at the weights' own resolution, in the
    first run, and left out at the drawn sizes, where they are recomputed), the sizes drawn among those at which
    every parameter keeps its shape (:func:`_sizes_keeping_shapes`: a position embedding with a row per patch keeps
    it at none but the weights' own token count, a window clamped to a small grid changes its tables); where there
    is none up to ``max_side``, a :class:`VerifyError` names a parameter that moves.

    ``grad``: each example is also verified with the network's gradients (:func:`verify_network` with
    ``grad=True``: the images' and every parameter's gradient for the example's cotangent, and each unit's backward
    teacher-forced, against the float64 twin, :mod:`refimpl.verify.network_gradients`); an example whose gradients
    diverge (or stay inconclusive) fails as one whose forward does, and the example shown when all match is the
    one closest to its bound over its stages and its gradient tensors."""
    from hypothesis import HealthCheck, Phase, given, reject, settings, strategies as st
    from hypothesis import seed as h_seed

    from .steps import _check_grad, _example_factory, _example_score, _run_examples
    from .. import models as rm

    _check_grad(grad)
    module = _example_factory(module)
    other = {k: v for k, v in kwargs.items() if k not in ("hw", "input", "batch")}
    other["grad"] = grad
    cfg = network_config(reference, other.get("preset"), other.get("config"), None)[0]
    fam = rm.family_of(reference)
    field = size_field(cfg)
    init = dict(other.get("init") or {})
    key = given_size = None
    base_hw = None
    if field is not None:
        key = size_keyword(module, init)
        if key is None:
            raise _refuse_fixed(reference, cfg, module)
        given_size = init.get(key, getattr(cfg, field))
        if key in init:                     # the user's size: the reference is built for it too
            try:
                base_hw = ((int(given_size), int(given_size)) if isinstance(given_size, (int, np.integer)) else
                           tuple(int(v) for v in given_size))
            except (TypeError, ValueError):
                base_hw = ()
            if len(base_hw) != 2 or min(base_hw) < 1 or isinstance(given_size, bool):
                raise VerifyError(f"argument 'init': {key!r} expected an image size H x W (an int >= 1 or a pair of "
                                  f"them), got {given_size!r}")
            cfg = network_config(reference, other.get("preset"), other.get("config"), base_hw)[0]
    if field is not None:                   # the foreign network built for the reference's size, by its keyword
        base = tuple(getattr(cfg, field))
        other["init"] = {**init, key: _size_value(given_size, *base)}
    first = verify_network(module, reference, seed=seed, hw=base_hw, **other)   # the configuration, usage errors
    step = image_step(fam, cfg)
    if step is None:
        raise VerifyError(f"argument 'examples': the reference {reference} accepts no (3 s, 2 s) image for s <= 64")
    top = max(first.network["image_hw"]) if max_side is None else int(max_side)
    if top < step:
        raise VerifyError(f"argument 'max_side': expected at least the network's image step {step}, got {top}")
    sides = st.integers(1, max(1, top // step)).map(lambda m: m * step)
    square = field is not None and isinstance(given_size, (int, np.integer))
    weights = other.pop("weights", None)
    derived: set[str] = set()
    sizes = st.tuples(sides, sides)
    if weights is not None:
        from ..models.convert import released_layout
        if isinstance(weights, str):
            weights = load_weights(weights, widen=False)
        try:
            derived = set(released_layout(cfg).derived)
        except RefimplError:
            derived = set()
        if field is not None:               # the sizes at which the weights fit: drawn among those only
            keep = _sizes_keeping_shapes(fam, cfg, field, step, top, square)
            sizes = st.sampled_from(keep)
    worst: dict[str, Any] = {"report": first, "score": -1.0, "example": None}
    failing: list[tuple[Report, dict]] = []

    def describe(ex: dict) -> str:
        h, w = ex["hw"]
        rebuilt = "" if key is None else f" (both networks rebuilt for it: {key}={_size_value(given_size, h, w)!r})"
        return f"image {h} x {w}{rebuilt}, batch {ex['batch']}, seed {ex['seed']}"

    @h_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[p for p in Phase if p is not Phase.explain])    # each call is a network's verification
    @given(hw=sizes, batch=st.integers(1, 2), ex_seed=st.integers(0, 15))
    def run(hw, batch, ex_seed):
        h, w = hw
        if square:
            w = h
        kw = dict(other)
        if field is not None:
            try:
                dataclasses.replace(cfg, **{field: (h, w)})
            except (ValueError, TypeError):
                reject()                    # a size the reference's configuration refuses
            kw["init"] = {**init, key: _size_value(given_size, h, w)}
        if weights is not None:
            kw["weights"] = {k: v for k, v in weights.items() if k not in derived}
        try:
            r = verify_network(module, reference, hw=(h, w), batch=batch, seed=ex_seed, **kw)
        except VerifyError as exc:
            if "does not accept images" in str(exc) or str(exc).startswith("config:"):
                reject()
            raise
        ex = {"hw": [h, w], "batch": batch, "seed": ex_seed}
        score = _example_score(r)
        if r.verdict != _verdict.MATCH:
            failing.append((r, ex))
            raise AssertionError(r.verdict)
        if score > worst["score"]:
            worst.update(report=r, score=score, example=ex)

    return _run_examples(run, examples, failing, worst, describe, describe)
