"""Networks of the papers, one file per paper, and the registry of named models.

A model family is a module in this package that defines

- a frozen config dataclass (every architectural choice is a field; attention presets included);
- ``param_shapes(cfg) -> dict[str, tuple[int, ...]]``: every float state_dict entry's key and shape (parameters
  and float buffers such as BatchNorm statistics), computed from the config alone (so :func:`param_count`
  never allocates weights; buffers are recognised by :func:`is_buffer`);
- ``init_params(cfg, rng) -> dict[str, ndarray]``: fresh parameters with exactly those keys and shapes;
- ``forward(params, images, cfg) -> logits`` and ``features(params, images, cfg) -> list[ndarray]``
  (the per-stage feature maps), pure functions over NumPy arrays;
- ``macs(cfg, image_hw) -> dict[str, int]``: the analytic multiply-accumulate count per layer group.

and registers its named configs with :func:`register`.  ``create("l2vit_tiny")`` returns the config and,
with ``init=True``, fresh parameters keyed exactly like the PyTorch twin's state_dict.

The registry itself lives in :mod:`refimpl.models.registry` (which imports no family module); this package
re-exports its public names and imports the family modules, which import ``.registry``, never this package.
"""

from __future__ import annotations

from typing import Any

from .registry import (BUFFER_SUFFIXES, FAMILY_MODULES, ModelEntry, create, entry, family_of, is_buffer, names,
                       param_count, param_shapes, register)

__all__ = ["register", "create", "names", "family_of", "param_count", "param_shapes", "ModelEntry",
           "convert_state_dict", "entry", "is_buffer", "FAMILY_MODULES", "BUFFER_SUFFIXES"]

# The family modules (FAMILY_MODULES): each registers its named configs when imported; they import .registry,
# never this package, so importing them here makes no cycle.
from . import castling, castling_levit, castling_mvitv2, flatten, flatten_cswin  # noqa: E402,F401
from . import flatten_pvt, l2vit, lisanet, ravlt  # noqa: E402,F401
from . import l2vit_deit  # noqa: E402,F401
from . import rala_variants  # noqa: E402,F401


def convert_state_dict(name: Any, state_dict: Any, source: str = "official", **kwargs: Any) -> dict:
    """The reference's params for a released model's state_dict (``source="official"``) or a twin's
    (``source="twin"``), strictly: see :func:`refimpl.models.convert.convert_state_dict`."""
    from .convert import convert_state_dict as _convert
    return _convert(name, state_dict, source, **kwargs)
