"""The registry of named models: :func:`register` (called by each family module at import), :func:`create`,
:func:`names`, :func:`family_of`, :func:`entry`, the parameter counts from the config alone
(:func:`param_shapes`, :func:`param_count`, :func:`is_buffer`) and :class:`ModelEntry`.

Layer: networks, the bottom of :mod:`refimpl.models`: imports NumPy only and no family module (the families
are loaded by name through importlib on first use, and :mod:`refimpl.models` imports them).  The family
modules, :mod:`.counting` and :mod:`.convert` import this module, never the package, so the package has no
import cycle.  :mod:`refimpl.models` re-exports the public names.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["register", "create", "names", "entry", "family_of", "param_count", "param_shapes", "is_buffer",
           "ModelEntry", "FAMILY_MODULES", "BUFFER_SUFFIXES"]

#: The package the family modules live in.
_PACKAGE = __name__.rpartition(".")[0]

#: The model modules of this package; each registers its configs when imported.
FAMILY_MODULES = ("l2vit", "ravlt", "lisanet", "flatten", "castling", "flatten_pvt", "flatten_cswin",
                  "castling_levit", "castling_mvitv2", "l2vit_deit", "rala_variants")


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered network: its name, default config, family module and the parameter count its paper reports."""

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
            importlib.import_module(f"{_PACKAGE}.{fam}")
        except ModuleNotFoundError as e:  # a family not written yet; any other import error propagates
            if e.name != f"{_PACKAGE}.{fam}":
                raise
    _LOADED[0] = True


def names() -> list[str]:
    """All registered model names."""
    _load_all()
    return sorted(_REGISTRY)


def entry(name: str) -> ModelEntry:
    """The registered network ``name``; KeyError naming the registered ones otherwise."""
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"argument 'name': unknown model {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def family_of(name: str) -> ModuleType:
    """The family module (refimpl.models.<family>) of the registered network ``name``."""
    return entry(name).module


def create(name: str, *, init: bool = False, seed: int = 0, **overrides: Any):
    """Return ``(config, params)`` for a named model; params is None unless ``init``.  ``overrides`` replace
    config fields (``create("l2vit_tiny", preset="official", num_classes=10)``)."""
    e = entry(name)
    cfg = dataclasses.replace(e.config, **overrides) if overrides else e.config
    params = e.module.init_params(cfg, np.random.default_rng(seed)) if init else None
    return cfg, params


def param_shapes(name_or_cfg: Any) -> dict[str, tuple[int, ...]]:
    """state_dict key -> shape of a registered network (by name) or of a config of a registered family."""
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
