"""The backend switch: NumPy (the definition) | Numba | C, one operation at a time.

Every accelerated kernel implements an operation that a NumPy function in refimpl already defines, with
the same signature (plus optional keyword-only ``out=``-style buffers), and is registered under the same
operation name, with a ``supports`` predicate that says which calls it takes (dtype, shape, layout):

    @backends.register("depthwise_conv2d", "numpy")     # in refimpl/layers.py: the definition
    def _depthwise_conv2d_numpy(x, weight, bias, stride, pads, dilation=(1, 1)): ...

    @register("depthwise_conv2d", "c", supports=_depthwise_supported)   # in refimpl/backends/_c_depthwise.py
    def depthwise_conv2d(x, weight, bias, stride, pads, dilation=(1, 1), *, out=None): ...

A reference function then calls ``backends.call("depthwise_conv2d", x, weight, bias, stride, pads,
dilation)``: the registry picks the kernel of the backend selected now if that kernel ``supports`` the
arguments, and the NumPy definition (or the caller's own NumPy computation, ``otherwise=``) if not.  The
caller never looks at the backend, the dtype or the layout.

- ``use("numpy" | "numba" | "c" | "auto")`` selects the backend, either as a setting
  (``backends.use("c")``) or for a block (``with backends.use("numba"): ...``, which restores the previous
  choice on exit).  The choice lives in a :class:`contextvars.ContextVar`: it is per thread and per asyncio
  task, and a block restores exactly what was there before it.
- Without a choice the backend is ``config.DEFAULT_BACKEND`` ("numpy"), or the environment variable
  ``REFIMPL_BACKEND`` if set when refimpl is imported.
- ``"auto"`` picks, per operation, the first backend that is available and has a kernel that supports the
  call, in the order of ``auto_table.json`` (package data of refimpl.backends, read through
  importlib.resources; written by benchmarks/run.py; fastest first) or, where the table is absent or has
  no entry, ``config.AUTO_FALLBACK_ORDER`` (c > numba > numpy).
- An explicitly selected backend that is not available, or that has no kernel for the operation, falls
  back to the NumPy definition and says so once per (operation, backend) with a ``RuntimeWarning``.

The kernels live with their backend (``_c.py``, ``_numba.py``: the runtime; ``_c_<family>.py``,
``_numba_<family>.py``: one module per kernel family) and import nothing from refimpl.attention,
refimpl.layers or refimpl.models: what they share with the definitions (feature maps, argument checks)
is in :mod:`refimpl.feature_maps`, and where a kernel answers with the NumPy definition (the C kernels'
range fallback) it takes it from the registry (``_registry.definition(op)``).  The NumPy definitions are
registered by the modules that own them, all imported by ``import refimpl``.

``available()`` says which backends can be used and, for the others, why not.  Numba and the compiled
module ``refimpl._native._kernels`` are optional: importing refimpl never imports either (the C module is
loaded, and Numba imported, on first use or by ``available()``), and torch is never involved.
"""

from __future__ import annotations

import contextvars
import importlib.resources
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from .. import config
from ._registry import _REGISTRY, _SUPPORTS, BACKENDS, definition, register, supported  # noqa: F401 (re-exported)
from ._validate import empty_aligned, is_aligned

__all__ = ["BACKENDS", "Status", "available", "use", "current", "register", "call", "get", "definition",
           "kernels", "auto_order", "empty_aligned", "is_aligned"]

_CHOICES = BACKENDS + ("auto",)


class Status(NamedTuple):
    """Whether a backend can be used (``ok``) and, if not, why (``reason``); truthy iff ``ok``."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:  # so that `if backends.available()["c"]:` reads naturally
        """Truthy iff the backend can be used (``ok``)."""
        return bool(self.ok)


# ---------------------------------------------------------------------------------------------------
# Registry (refimpl/backends/_registry.py: register, definition, _REGISTRY, _SUPPORTS)
# ---------------------------------------------------------------------------------------------------

def kernels() -> dict[str, tuple[str, ...]]:
    """{operation: backends that have a registered implementation of it} (every definition is registered
    by ``import refimpl``)."""
    return {op: tuple(b for b in BACKENDS if b in impls) for op, impls in sorted(_REGISTRY.items())}


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
        """Select ``name`` at once in this thread / task (a context variable), keeping the token that restores the
        previous selection; raises ValueError for a name other than "numpy", "numba", "c", "auto"."""
        self.name = _check_choice(name, "argument 'name'")
        self._token = _CURRENT.set(self.name)

    def __enter__(self) -> "use":
        """This selection (already made by the constructor), for the ``with`` block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the selection that was current before this one, even on an exception."""
        _CURRENT.reset(self._token)

    def __repr__(self) -> str:
        """The call that made this selection, ``backends.use(name)``."""
        return f"backends.use({self.name!r})"


def current() -> str:
    """The backend selected now: "numpy", "numba", "c" or "auto"."""
    return _CURRENT.get() or _DEFAULT


# ---------------------------------------------------------------------------------------------------
# The "auto" table
# ---------------------------------------------------------------------------------------------------

#: The packaged table, read as a resource of this package (importlib.resources), so a regular install reads
#: the copy installed as package data exactly as an editable one reads the source tree's; benchmarks/run.py
#: writes it.  REFIMPL_AUTO_TABLE names another file.
_AUTO_TABLE_DEFAULT = importlib.resources.files(__name__) / "auto_table.json"
_AUTO_CACHE: dict[str, Any] = {}


def _auto_table_path() -> Any:
    """The table's location: a pathlib.Path (REFIMPL_AUTO_TABLE) or the package resource (a Traversable,
    a Path for an installed or source-tree package)."""
    env = os.environ.get("REFIMPL_AUTO_TABLE", "")
    return Path(env) if env else _AUTO_TABLE_DEFAULT


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


def _impls(op: str) -> dict[str, Callable[..., Any]]:
    impls = _REGISTRY.get(op)
    if impls is None or "numpy" not in impls:
        definition(op)          # raises the KeyError naming the registered operations
    return impls  # type: ignore[return-value]


def get(op: str, backend: str | None = None, *, dtype: Any = None) -> Callable[..., Any]:
    """The implementation of ``op`` on ``backend`` (default: the one selected now, see :func:`use`), without
    looking at any arguments (so without the kernels' ``supports`` predicates: reference code calls
    :func:`call`; this is for tests and benchmarks that want one kernel).

    "auto" takes the first backend in :func:`auto_order` (``dtype`` picks a per-dtype entry of the table)
    that is available and has a kernel for ``op``.  An explicitly named backend that is unavailable or
    has no kernel for ``op`` falls back to the NumPy definition with a one-time ``RuntimeWarning`` naming
    the operation, the backend and the reason.  Raises ``KeyError`` if ``op`` has no NumPy definition.
    """
    name = _check_choice(backend if backend is not None else current(), "argument 'backend'")
    impls = _impls(op)
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


def _dtype_of(args: tuple) -> Any:
    """The working precision of a call, for the auto table's per-dtype entries: the dtype of the first
    positional array argument (its real counterpart for a complex one: complex128 -> float64)."""
    for a in args:
        dt = getattr(a, "dtype", None)
        if isinstance(dt, np.dtype):
            return np.finfo(dt).dtype if dt.kind == "c" else dt
    return None


def call(op: str, /, *args: Any, otherwise: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
    """Run operation ``op`` on ``args``, ``kwargs`` with the backend selected now (:func:`use`).

    - On the NumPy backend, and for a call that no registered accelerated kernel ``supports`` (dtype,
      shape, layout: the predicates registered with the kernels), the NumPy computation runs:
      ``otherwise()`` if given (the caller's own NumPy path, where it is not literally the operation's
      definition, so that its bits stay the caller's), else the NumPy definition.  Silently.
    - "auto": the first backend in :func:`auto_order` (per the dtype of the first array argument) that is
      available and whose kernel supports the call; the NumPy definition if that comes first or none does.
    - An explicitly selected backend: its kernel if it supports the call; the NumPy computation (as above)
      if its kernel does not; the NumPy definition with a one-time ``RuntimeWarning`` (see :func:`get`) if
      the backend is unavailable or has no kernel for ``op``.

    Callers state only which operation their computation is; they never decide which kernel may take it.
    Raises ``KeyError`` if ``op`` has no NumPy definition.
    """
    impls = _impls(op)

    def numpy_path() -> Any:
        return otherwise() if otherwise is not None else impls["numpy"](*args, **kwargs)

    name = current()
    if name != "numpy":
        accel = [b for b in BACKENDS[1:] if b in impls and supported(op, b, args, kwargs)]
        if accel:
            if name == "auto":
                status = available()
                for cand in auto_order(op, _dtype_of(args)):
                    if cand == "numpy":
                        break
                    if cand in accel and status[cand].ok:
                        return impls[cand](*args, **kwargs)
                return numpy_path()
            if name not in impls or name in accel:
                return get(op, name)(*args, **kwargs)
    return numpy_path()


# Register the accelerated kernels (cheap: neither imports Numba nor loads the compiled module).
from . import _c, _numba  # noqa: E402,F401
from . import _c_elementwise, _numba_elementwise  # noqa: E402,F401 (GELU: ckernels/gelu.c and its Numba twin)
from . import _c_depthwise, _c_linear, _c_lisa, _c_softmax  # noqa: E402,F401 (the C kernel families)
from . import _numba_depthwise, _numba_lisa, _numba_lisa_local  # noqa: E402,F401 (the Numba kernel families)
