"""The twins' taps: named tensors recorded between a twin's submodules, and teacher forcing.

Layer: refimpl.twins (torch).  A twin calls :func:`tap` at each point of its forward where a stage of the
reference's stage list ends; :func:`capture` runs a module once with forward hooks (and the twin's taps) and
returns the named tensors, optionally replacing each by a forced one (a tested run's) before the twin goes on.
Used by the stage-wise verdict (:func:`refimpl.verdict.compare_stages`), the equivalence suite
(equivalence/assertions.py) and the verify tool.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

__all__ = ["QKV_PROJ_POINTS", "Taps", "forced", "tap", "capture"]


#: The stage tensors of a module made of a qkv projection, a core and an output projection (Swin window
#: attention, L2ViT, LiSA, Castling): tensor name -> (submodule, "input" | "output").
QKV_PROJ_POINTS = {"x": ("qkv", "input"), "qkv": ("qkv", "output"), "core": ("proj", "input"),
                   "proj": ("proj", "output")}


class Taps(dict):
    """The tensors a twin records between its submodules (``module.taps``), name -> tensor, and the tensors that
    replace them: ``forced`` maps a name to the tested run's tensor, which the twin goes on with instead of its
    own (teacher forcing, :func:`capture`'s ``force``).  A plain dict forces nothing."""

    def __init__(self, forced: Mapping[str, torch.Tensor] | None = None):
        """An empty record; ``forced`` (name -> the tested run's tensor; None: nothing forced) is copied into a dict."""
        super().__init__()
        self.forced = dict(forced or {})


def forced(taps: Mapping[str, Any] | None, name: str) -> torch.Tensor | None:
    """The tensor ``taps`` forces for ``name``, or None."""
    return getattr(taps, "forced", {}).get(name)


def tap(taps: dict | None, name: str, value: torch.Tensor) -> torch.Tensor:
    """Record ``value`` under ``name`` in ``taps`` (nothing when None) and return what the twin goes on with:
    the tensor ``taps`` forces for ``name`` (cast to ``value``'s dtype and device), else ``value``."""
    if taps is None:
        return value
    taps[name] = value.detach()
    f = forced(taps, name)
    return value if f is None else _forcing(f, value, name)


def _forcing(f: torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    if tuple(f.shape) != tuple(like.shape):
        raise ValueError(f"argument 'force': {name!r} has shape {tuple(f.shape)}, the twin computes "
                         f"{tuple(like.shape)}")
    return f.to(dtype=like.dtype, device=like.device)


def capture(module: torch.nn.Module, run: Callable[[], Any], points: Mapping[str, tuple[str, str]], *,
            taps: bool = False, force: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Run ``run()`` once with forward hooks that record tensors for a stage-wise comparison
    (:func:`refimpl.verdict.compare_stages`): ``points`` maps a tensor name to (submodule name, "input" or
    "output"), the submodule's first positional input or its output.  ``taps``: also set the module's ``taps``
    attribute to a fresh :class:`Taps` for the run (the twins fill it with tensors between submodules) and merge
    what it receives (a point of ``points`` wins over a tap of the same name: a twin may tap its own output
    after a hook has replaced it).  Returns name -> tensor (detached).

    ``force``: name -> tensor (a tested run's, from an earlier capture).  Each named tensor is recorded as the
    twin computes it and then replaced by the forced one before the twin goes on (a forward hook's returned
    output, a pre-hook's replaced input, :func:`tap` for the twins' taps).  With every stage tensor forced, what
    is recorded for a stage is that stage evaluated on the forced run's inputs to it: run under a legitimate
    variant (:func:`stage_ensemble`), it is a teacher-forced ensemble member of the stage."""
    force = dict(force or {})
    if taps:
        module.taps = Taps(force)
        try:
            hooked = capture(module, run, points, force=force)
            got = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in module.taps.items()}
        finally:
            module.taps = None
        got.update(hooked)       # a point asked for by name wins over a tap of the same name
        return got
    got: dict[str, torch.Tensor] = {}
    subs = dict(module.named_modules())
    handles = []
    for name, (sub, where) in points.items():
        if sub not in subs:
            raise KeyError(f"argument 'points': {name!r} names submodule {sub!r}, which the module does not have"
                           f" (it has {sorted(k for k in subs if k)})")
        if where not in ("input", "output"):
            raise ValueError(f"argument 'points': {name!r}: expected 'input' or 'output', got {where!r}")
        if where == "input":
            def pre_hook(mod, args, name=name):
                got[name] = args[0].detach()
                if name in force:
                    return (_forcing(force[name], args[0], name),) + tuple(args[1:])
                return None

            handles.append(subs[sub].register_forward_pre_hook(pre_hook))
        else:
            def hook(mod, args, out, name=name):
                got[name] = out.detach()
                return _forcing(force[name], out, name) if name in force else None

            handles.append(subs[sub].register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    missing = sorted(set(points) - set(got))
    if missing:
        raise RuntimeError(f"capture: the forward pass did not call the submodules of {missing}")
    return got
