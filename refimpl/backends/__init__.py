"""The backend switch: NumPy (the definition) | Numba | C, one operation at a time.

Every accelerated kernel implements an operation that a NumPy function in refimpl already defines, with
the same signature (plus an optional ``out=`` buffer), and is registered under the same operation name:

    @backends.register("depthwise_conv2d", "numpy")     # in refimpl/layers.py: the definition
    def _depthwise_conv2d_numpy(x, weight, bias, stride, pads): ...

    @backends.register("depthwise_conv2d", "c")         # in refimpl/backends/_c.py
    def depthwise_conv2d(x, weight, bias, stride, pads, *, out=None): ...

A reference function then calls ``backends.get("depthwise_conv2d")(x, weight, bias, stride, pads)``, which
resolves the backend selected now:

- ``use("numpy" | "numba" | "c" | "auto")`` selects it, either as a setting (``backends.use("c")``) or
  for a block (``with backends.use("numba"): ...``, which restores the previous choice on exit).  The
  choice lives in a :class:`contextvars.ContextVar`: it is per thread and per asyncio task, and a block
  restores exactly what was there before it.
- Without a choice the backend is ``config.DEFAULT_BACKEND`` ("numpy"), or the environment variable
  ``REFIMPL_BACKEND`` if set when refimpl is imported.
- ``"auto"`` picks, per operation, the first backend that is available and has a kernel for it, in the
  order of ``refimpl/backends/auto_table.json`` (package data, written by benchmarks/run.py; fastest first) or, where the
  table is absent or has no entry, ``config.AUTO_FALLBACK_ORDER`` (c > numba > numpy).
- An explicitly selected backend that is not available, or that has no kernel for the operation, falls
  back to the NumPy definition and says so once per (operation, backend) with a ``RuntimeWarning``.

``available()`` says which backends can be used and, for the others, why not.  Numba and the compiled
module ``refimpl._native._kernels`` are optional: importing refimpl never imports either (the C module is
loaded, and Numba imported, on first use or by ``available()``), and torch is never involved.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from .. import config

__all__ = ["BACKENDS", "Status", "available", "use", "current", "register", "get", "kernels", "auto_order",
           "empty_aligned", "is_aligned"]

#: The backends, the definition first.
BACKENDS = ("numpy", "numba", "c")
_CHOICES = BACKENDS + ("auto",)

#: Modules that register NumPy definitions; imported on demand if ``get`` finds no definition yet.
_DEFINITION_MODULES = ("refimpl.layers", "refimpl.attention.linear", "refimpl.attention.rala",
                       "refimpl.attention.softmax", "refimpl.attention.lisa",
                       "refimpl.backends.twins")


class Status(NamedTuple):
    """Whether a backend can be used (``ok``) and, if not, why (``reason``); truthy iff ``ok``."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:  # so that `if backends.available()["c"]:` reads naturally
        return bool(self.ok)


# ---------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {}


def register(op: str, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the ``backend`` implementation of operation ``op``.

    The NumPy implementation is the definition; the others must take the same arguments (and may add
    keyword-only ones such as ``out=``).  Returns ``fn`` unchanged.
    """
    if backend not in BACKENDS:
        raise ValueError(f"argument 'backend': expected one of {BACKENDS}, got {backend!r}")
    if not isinstance(op, str) or not op:
        raise ValueError(f"argument 'op': expected a non-empty operation name, got {op!r}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY.setdefault(op, {})[backend] = fn
        return fn

    return deco


def kernels() -> dict[str, tuple[str, ...]]:
    """{operation: backends that have a registered implementation of it}."""
    _load_definitions()
    return {op: tuple(b for b in BACKENDS if b in impls) for op, impls in sorted(_REGISTRY.items())}


def _load_definitions() -> None:
    for mod in _DEFINITION_MODULES:
        importlib.import_module(mod)


# ---------------------------------------------------------------------------------------------------
# Availability
# ---------------------------------------------------------------------------------------------------

_STATUS_CACHE: dict[str, Status] = {}
_STATUS_LOCK = threading.Lock()


def available(refresh: bool = False) -> dict[str, Status]:
    """{"numpy": Status(True, ...), "numba": Status(ok, reason), "c": Status(ok, reason)}.

    For an unavailable backend the reason carries the import error (Numba not installed; the compiled
    module missing, e.g. because the package was not built).  For the C backend it also reports the
    build flags and the vector instruction set in use.  Results are cached; ``refresh=True`` probes again
    (after building the C module in the same session, say).
    """

    with _STATUS_LOCK:
        if refresh or not _STATUS_CACHE:
            _STATUS_CACHE["numpy"] = Status(True, "the NumPy reference (the definition; always available)")
            _STATUS_CACHE["numba"] = Status(*_numba.status(refresh))
            _STATUS_CACHE["c"] = Status(*_c.status(refresh))
        return dict(_STATUS_CACHE)


# ---------------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------------

def _check_choice(name: Any, what: str) -> str:
    if name not in _CHOICES:
        raise ValueError(f"{what}: expected one of {_CHOICES}, got {name!r}")
    return name


_DEFAULT = _check_choice(os.environ.get("REFIMPL_BACKEND", "").strip() or config.DEFAULT_BACKEND,
                         "environment variable REFIMPL_BACKEND / config.DEFAULT_BACKEND")
_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("refimpl_backend", default=None)


class use:
    """Select the backend, as a setting or for a block.

    ``backends.use("c")`` selects C from now on (in this thread / task); ``with backends.use("numba"):``
    selects Numba inside the block and restores the previous selection when it exits, even on an
    exception.  ``name`` is "numpy", "numba", "c" or "auto".
    """

    def __init__(self, name: str) -> None:
        self.name = _check_choice(name, "argument 'name'")
        self._token = _CURRENT.set(self.name)

    def __enter__(self) -> "use":
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)

    def __repr__(self) -> str:
        return f"backends.use({self.name!r})"


def current() -> str:
    """The backend selected now: "numpy", "numba", "c" or "auto"."""
    return _CURRENT.get() or _DEFAULT


# ---------------------------------------------------------------------------------------------------
# The "auto" table
# ---------------------------------------------------------------------------------------------------

#: The packaged table (package data, so a regular install has it as an editable one does); benchmarks/run.py
#: writes it.  REFIMPL_AUTO_TABLE names another file.
_AUTO_TABLE_DEFAULT = Path(__file__).resolve().parent / "auto_table.json"
_AUTO_CACHE: dict[str, Any] = {}


def _auto_table_path() -> Path:
    return Path(os.environ.get("REFIMPL_AUTO_TABLE", "") or _AUTO_TABLE_DEFAULT)


def _load_auto_table() -> Mapping[str, Any]:
    """The benchmark-written table, {"ops": {op: [backend, ...] | {dtype: [backend, ...]}}, ...}; {} if
    absent.  A malformed file is reported once and ignored (auto then uses the fallback order)."""
    path = _auto_table_path()
    key = str(path)
    if key not in _AUTO_CACHE:
        table: Mapping[str, Any] = {}
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                table = data.get("ops", data) if isinstance(data, dict) else {}
                if not isinstance(table, dict):
                    raise ValueError("'ops' is not a mapping")
            except (OSError, ValueError) as exc:
                warnings.warn(f"refimpl.backends: ignoring the auto table {path}: {exc}", RuntimeWarning,
                              stacklevel=3)
                table = {}
        _AUTO_CACHE[key] = table
    return _AUTO_CACHE[key]


def auto_order(op: str, dtype: Any = None) -> tuple[str, ...]:
    """The order in which "auto" tries backends for ``op`` (fastest first).

    From the auto table when it has an entry for ``op`` (a list, or a mapping from dtype name, e.g.
    "float64", to a list, with an optional "default" key), else ``config.AUTO_FALLBACK_ORDER``.  Names
    that are not backends are dropped; NumPy is always appended last.
    """
    entry = _load_auto_table().get(op)
    if isinstance(entry, dict):
        name = np.dtype(dtype).name if dtype is not None else None
        entry = entry.get(name) if name in entry else entry.get("default")
    order = [b for b in entry if b in BACKENDS] if isinstance(entry, (list, tuple)) else \
        list(config.AUTO_FALLBACK_ORDER)
    return tuple(dict.fromkeys(order + ["numpy"]))


# ---------------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------------

_WARNED: set[tuple[str, str]] = set()
_WARN_LOCK = threading.Lock()


def _warn_once(op: str, backend: str, why: str) -> None:
    with _WARN_LOCK:
        if (op, backend) in _WARNED:
            return
        _WARNED.add((op, backend))
    warnings.warn(f"refimpl.backends: operation {op!r} runs on the NumPy definition instead of the "
                  f"{backend!r} backend: {why}. (Said once per operation and backend.)", RuntimeWarning,
                  stacklevel=4)


def get(op: str, backend: str | None = None, *, dtype: Any = None) -> Callable[..., Any]:
    """The implementation of ``op`` on ``backend`` (default: the one selected now, see :func:`use`).

    "auto" takes the first backend in :func:`auto_order` (``dtype`` picks a per-dtype entry of the table)
    that is available and has a kernel for ``op``.  An explicitly named backend that is unavailable or
    has no kernel for ``op`` falls back to the NumPy definition with a one-time ``RuntimeWarning`` naming
    the operation, the backend and the reason.  Raises ``KeyError`` if ``op`` has no NumPy definition.
    """
    name = _check_choice(backend if backend is not None else current(), "argument 'backend'")
    impls = _REGISTRY.get(op)
    if impls is None or "numpy" not in impls:
        _load_definitions()
        impls = _REGISTRY.get(op)
        if impls is None or "numpy" not in impls:
            raise KeyError(f"refimpl.backends: no NumPy definition is registered for operation {op!r}; "
                           f"registered operations: {sorted(_REGISTRY)}")
    if name == "numpy":
        return impls["numpy"]
    status = available()
    if name == "auto":
        for cand in auto_order(op, dtype):
            if cand in impls and status[cand].ok:
                return impls[cand]
        return impls["numpy"]
    if name not in impls:
        _warn_once(op, name, f"no {name!r} kernel is registered for {op!r} "
                             f"(kernels: {', '.join(b for b in BACKENDS if b in impls)})")
        return impls["numpy"]
    if not status[name].ok:
        _warn_once(op, name, f"the {name!r} backend is not available ({status[name].reason})")
        return impls["numpy"]
    return impls[name]


# ---------------------------------------------------------------------------------------------------
# Aligned buffers for out= / workspace=
# ---------------------------------------------------------------------------------------------------

def empty_aligned(shape: int | tuple[int, ...], dtype: Any = np.float64,
                  alignment: int = config.KERNEL_BUFFER_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``alignment``-byte boundary.

    For ``out=`` and ``workspace=`` buffers that kernels write into and callers reuse across calls
    (allocate once, outside the loop).  ``alignment`` must be a power of two and a multiple of the
    itemsize.  Made by over-allocating a byte buffer and viewing it from the first aligned byte.
    """
    dt = np.dtype(dtype)
    shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape_t):
        raise ValueError(f"argument 'shape': expected non-negative sizes, got {shape_t}")
    if not isinstance(alignment, (int, np.integer)) or alignment < 1 or alignment & (alignment - 1) \
            or alignment % dt.itemsize:
        raise ValueError(f"argument 'alignment': expected a power of two that is a multiple of the itemsize "
                         f"{dt.itemsize} of {dt}, got {alignment!r}")
    nbytes = math.prod(shape_t) * dt.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dt).reshape(shape_t)


def is_aligned(a: np.ndarray, alignment: int = config.KERNEL_BUFFER_ALIGNMENT) -> bool:
    """Whether ``a``'s data pointer is a multiple of ``alignment`` bytes (trivially so for an empty array,
    which has no data)."""
    return a.size == 0 or a.ctypes.data % alignment == 0


# Register the accelerated kernels (cheap: neither imports Numba nor loads the compiled module).
from . import _c, _numba  # noqa: E402,F401
