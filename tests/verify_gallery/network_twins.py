"""Whole networks for `refimpl verify --reference NETWORK`: the PyTorch twins of the registered networks
(refimpl/twins/models, the test suite's own PyTorch implementation), in the reduced configuration of the
equivalence suite, optionally with a planted bug in one unit.

``twin(name, preset=None, reduced=True, bug_unit=None, bug_rel=1e-3)``: the twin of the registered network
``name`` (its default preset: "official" where its attention has released code); with ``bug_unit`` a forward hook
perturbs that submodule's output by ``bug_rel`` relative (out * (1 + bug_rel)): a porting bug that lives in one
block.  ``bug="row_index"``: instead, the unit computes each token's grid row as (flat index) // H instead of
// W (a position table built for the transposed grid) and scales its output by (1 + bug_rel (wrong row - row)):
right on every square grid, wrong on the others (channels-first outputs (B, C, H, W))."""

from __future__ import annotations

from typing import Any

import refimpl.twins.models as em
from refimpl.verify.networks import network_config


def _row_index_bug(out: Any, rel: float) -> Any:
    import torch
    h, w = out.shape[-2:]
    flat = torch.arange(h * w, dtype=out.dtype, device=out.device).reshape(h, w)
    wrong = torch.div(flat, h, rounding_mode="floor") - torch.div(flat, w, rounding_mode="floor")
    return out * (1 + rel * wrong)


def twin(name: str, preset: str | None = None, reduced: bool = True, bug_unit: str | None = None,
         bug_rel: float = 1e-3, bug: str = "scale") -> Any:
    cfg = network_config(name, preset, {"reduced": True} if reduced else None, None)[0]
    module = em.build(cfg)
    if bug_unit is not None:
        sub = dict(module.named_modules())[bug_unit]
        if bug == "row_index":
            sub.register_forward_hook(lambda _m, _inp, out: _row_index_bug(out, bug_rel))
        else:
            sub.register_forward_hook(lambda _m, _inp, out: out * (1 + bug_rel))
    return module
