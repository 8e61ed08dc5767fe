"""The PyTorch twins of refimpl.models' networks, under the same registry names.

How it fits together
--------------------
refimpl.models registers every named model (config + family module).  This package maps each refimpl family
module to its twin module; ``build(name)`` (or ``build(cfg)``) returns an ``nn.Module`` whose ``state_dict``
keys are exactly ``refimpl.models.param_shapes(cfg)``'s keys, in eval mode (the inference path of the
reference: Castling's auxiliary branch is dropped, as ``forward(..., training=False)`` does).

Adding a family is one import line and one dict entry::

    from . import flatten, castling, l2vit          # <- import the twin module
    TWINS = {"flatten": flatten, "castling": castling, "l2vit": l2vit}   # <- refimpl family name -> twin

Contract of a twin module (refimpl/twins/models/<family>.py)
----------------------------------------------------------
- ``CONFIG_TYPES``: the refimpl config classes it builds;
- ``build(cfg) -> nn.Module`` with ``forward(images) -> logits`` and ``features(images) -> list[Tensor]``
  (the reference's ``features``: same order, shapes and channels-first layout);
- optional ``run_unit(name, x)`` method on the module, mirroring the refimpl family's ``unit_names(cfg)`` /
  ``run_unit(params, name, x, cfg)``: the registry-driven test then feeds each twin unit the reference's
  input of that unit (teacher forcing) and compares it through the unit's own error bound
  (``unit_bound``), and checks that ``forward`` is exactly the composition of the units.

Contract of the refimpl family module (besides refimpl.models' ``param_shapes``, ``init_params``,
``forward``, ``features``, ``macs``): ``forward_bounds(params, images, cfg, *, dtype) -> (list[Bound],
Bound)`` (features, logits); ``reduced(cfg) -> cfg`` (a small config on the same code path, or register a
"<family>_tiny_test" name); the test image size: ``cfg.img_size`` for models built for one resolution, else
``test_image_hw(cfg) -> (H, W)`` for the reduced config (full size runs at config.NET_PAPER_RESOLUTION);
optionally ``unit_names``, ``run_unit``, ``unit_bound`` (see above).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from torch import nn

import refimpl.models as rm

from . import castling, flatten
from . import l2vit, lisanet, ravlt
from . import flatten_pvt
from . import flatten_cswin
from . import castling_levit
from . import castling_mvitv2
from . import l2vit_deit
from . import rala_variants

#: refimpl family module name (refimpl.models.<name>) -> twin module.
TWINS: dict[str, ModuleType] = {"flatten": flatten, "castling": castling}
TWINS.update({"l2vit": l2vit, "ravlt": ravlt, "lisanet": lisanet})
TWINS["flatten_pvt"] = flatten_pvt
TWINS["flatten_cswin"] = flatten_cswin
TWINS["castling_levit"] = castling_levit
TWINS["castling_mvitv2"] = castling_mvitv2
TWINS["l2vit_deit"] = l2vit_deit
TWINS["rala_variants"] = rala_variants

__all__ = ["TWINS", "twin_of", "build", "names"]


def twin_of(name_or_cfg: Any) -> ModuleType:
    """The twin module of a registered model name or of a config object."""
    if isinstance(name_or_cfg, str):
        fam = rm.family_of(name_or_cfg).__name__.rsplit(".", 1)[-1]
        if fam not in TWINS:
            raise KeyError(f"model {name_or_cfg!r}: family {fam!r} has no PyTorch twin registered in "
                           f"refimpl.twins.models.TWINS (have {sorted(TWINS)})")
        return TWINS[fam]
    for twin in TWINS.values():
        if isinstance(name_or_cfg, tuple(twin.CONFIG_TYPES)):
            return twin
    raise TypeError(f"argument 'name_or_cfg': no twin builds config type {type(name_or_cfg).__name__}")


def build(name_or_cfg: Any, **overrides: Any) -> nn.Module:
    """The twin ``nn.Module`` (float32, eval mode, PyTorch's default init) of a registered name (with config
    ``overrides``, as refimpl.models.create) or of a config object."""
    cfg = rm.create(name_or_cfg, **overrides)[0] if isinstance(name_or_cfg, str) else name_or_cfg
    return twin_of(cfg).build(cfg).eval()


def names() -> list[str]:
    """Registered model names whose family has a twin."""
    return [n for n in rm.names() if rm.family_of(n).__name__.rsplit(".", 1)[-1] in TWINS]
