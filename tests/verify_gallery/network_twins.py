"""Whole networks for `refimpl verify --reference NETWORK`: the PyTorch twins of the registered networks
(equivalence/models, the test suite's own PyTorch implementation), in the reduced configuration of the
equivalence suite, optionally with a planted bug in one unit.

``twin(name, preset=None, reduced=True, bug_unit=None, bug_rel=1e-3)``: the twin of the registered network
``name`` (its default preset: "official" where its attention has released code); with ``bug_unit`` a forward hook
perturbs that submodule's output by ``bug_rel`` relative (out * (1 + bug_rel)): a porting bug that lives in one
block."""

from __future__ import annotations

from typing import Any

import equivalence.models as em
from refimpl.verify.networks import network_config


def twin(name: str, preset: str | None = None, reduced: bool = True, bug_unit: str | None = None,
         bug_rel: float = 1e-3) -> Any:
    cfg = network_config(name, preset, {"reduced": True} if reduced else None, None)[0]
    module = em.build(cfg)
    if bug_unit is not None:
        sub = dict(module.named_modules())[bug_unit]
        sub.register_forward_hook(lambda _m, _inp, out: out * (1 + bug_rel))
    return module
