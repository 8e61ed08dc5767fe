"""Whole networks for `refimpl verify --reference NETWORK`: the PyTorch twins of the registered networks
(refimpl/twins/models, the test suite's own PyTorch implementation), in the reduced configuration of the
equivalence suite, optionally with a planted bug in one unit.

``twin(name, preset=None, reduced=True, bug_unit=None, bug_rel=1e-3, config=None)``: the twin of the registered
network ``name`` (its default preset: "official" where its attention has released code; ``config``: further fields
over the reduced configuration, as ``verify(..., config=...)`` takes them); with ``bug_unit`` a forward hook
perturbs that submodule's output by ``bug_rel`` relative (out * (1 + bug_rel)): a porting bug that lives in one
block.  ``bug="row_index"``: instead, the unit computes each token's grid row as (flat index) // H instead of
// W (a position table built for the transposed grid) and scales its output by (1 + bug_rel (wrong row - row)):
right on every square grid, wrong on the others (channels-first outputs (B, C, H, W))."""

from __future__ import annotations

from typing import Any, Mapping

import refimpl.twins.models as em
from refimpl.verify.networks import network_config


def _row_index_bug(out: Any, rel: float) -> Any:
    import torch
    h, w = out.shape[-2:]
    flat = torch.arange(h * w, dtype=out.dtype, device=out.device).reshape(h, w)
    wrong = torch.div(flat, h, rounding_mode="floor") - torch.div(flat, w, rounding_mode="floor")
    return out * (1 + rel * wrong)


#: The reduced L2ViT-T at the paper's head dim 32 (C 64 / 128): in float32 its LWA blocks' own bounds are void
#: (relative 1.4 and 3.3, official preset) while each of their residual steps' stays below 1e-2.
L2VIT_WIDE = {"reduced": True, "dims": [64, 128], "num_heads": [2, 4]}


def twin(name: str, preset: str | None = None, reduced: bool = True, bug_unit: str | None = None,
         bug_rel: float = 1e-3, bug: str = "scale", config: Mapping[str, Any] | None = None) -> Any:
    fields = {**({"reduced": True} if reduced else {}), **dict(config or {})}
    cfg = network_config(name, preset, fields or None, None)[0]
    module = em.build(cfg)
    if bug_unit is not None:
        sub = dict(module.named_modules())[bug_unit]
        if bug == "row_index":
            sub.register_forward_hook(lambda _m, _inp, out: _row_index_bug(out, bug_rel))
        else:
            sub.register_forward_hook(lambda _m, _inp, out: out * (1 + bug_rel))
    return module
