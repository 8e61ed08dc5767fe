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
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["register", "create", "names", "family_of", "param_count", "param_shapes", "ModelEntry",
           "convert_state_dict"]

#: The model modules of this package; each registers its configs when imported.
FAMILY_MODULES = ("l2vit", "ravlt", "lisanet", "flatten", "castling", "flatten_pvt", "flatten_cswin",
                  "castling_levit", "castling_mvitv2")


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    config: Any
    module: ModuleType
    paper_params_m: float | None = None  # the parameter count the paper reports, in millions
    paper_source: str = ""               # where the paper reports it ("Table 13")
    paper_precision: int = 0             # decimals the paper prints (29M -> 0, 6.36M -> 2)


_REGISTRY: dict[str, ModelEntry] = {}
_LOADED = [False]


def register(name: str, config: Any, module: ModuleType, *, paper_params_m: float | None = None,
             paper_source: str = "", paper_precision: int = 0) -> None:
    """Register a named model (called by the family modules at import)."""
    if name in _REGISTRY and _REGISTRY[name].config != config:
        raise ValueError(f"model name {name!r} registered twice with different configs")
    _REGISTRY[name] = ModelEntry(name, config, module, paper_params_m, paper_source, paper_precision)


def _load_all() -> None:
    if _LOADED[0]:
        return
    for fam in FAMILY_MODULES:
        try:
            importlib.import_module(f"{__name__}.{fam}")
        except ModuleNotFoundError as e:  # a family not written yet; any other import error propagates
            if e.name != f"{__name__}.{fam}":
                raise
    _LOADED[0] = True


def names() -> list[str]:
    """All registered model names."""
    _load_all()
    return sorted(_REGISTRY)


def entry(name: str) -> ModelEntry:
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"argument 'name': unknown model {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def family_of(name: str) -> ModuleType:
    return entry(name).module


def create(name: str, *, init: bool = False, seed: int = 0, **overrides: Any):
    """Return ``(config, params)`` for a named model; params is None unless ``init``.  ``overrides`` replace
    config fields (``create("l2vit_tiny", preset="official", num_classes=10)``)."""
    e = entry(name)
    cfg = dataclasses.replace(e.config, **overrides) if overrides else e.config
    params = e.module.init_params(cfg, np.random.default_rng(seed)) if init else None
    return cfg, params


def param_shapes(name_or_cfg: Any) -> dict[str, tuple[int, ...]]:
    if isinstance(name_or_cfg, str):
        e = entry(name_or_cfg)
        return e.module.param_shapes(e.config)
    _load_all()
    for e in _REGISTRY.values():
        if type(e.config) is type(name_or_cfg):
            return e.module.param_shapes(name_or_cfg)
    raise TypeError(f"argument 'name_or_cfg': no registered family has config type {type(name_or_cfg).__name__}")


def param_count(name_or_cfg: Any) -> int:
    """The exact number of parameters (learnable weights; buffers such as BatchNorm running statistics and
    fixed index tables are not counted, as the papers do not count them), from the config alone."""
    return int(sum(int(np.prod(s)) for k, s in param_shapes(name_or_cfg).items() if not is_buffer(k)))


#: state_dict entries that are buffers, not learnable parameters (BatchNorm statistics; fixed tables).
BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")


def is_buffer(key: str) -> bool:
    """Whether a state_dict key names a buffer (kept in params so the state_dict round-trips, but not
    counted as a parameter).  Families with other buffers name them with a suffix listed here."""
    return key.endswith(BUFFER_SUFFIXES)


def convert_state_dict(name: Any, state_dict: Any, source: str = "official", **kwargs: Any) -> dict:
    """The reference's params for a released model's state_dict (``source="official"``) or a twin's
    (``source="twin"``), strictly: see :func:`refimpl.models.convert.convert_state_dict`."""
    from .convert import convert_state_dict as _convert
    return _convert(name, state_dict, source, **kwargs)
