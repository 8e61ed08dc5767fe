"""The operation registry of :mod:`refimpl.backends`: {operation: {backend: kernel}} and each kernel's
``supports`` predicate.

This module is the bottom of the backend package: it imports nothing from refimpl, so the kernel modules
(``_c``, ``_numba``), the modules that register NumPy definitions (``refimpl.layers``,
``refimpl.attention.*``) and the dispatcher (``refimpl.backends``) all import it without a cycle.

- ``register(op, backend, kernel=None, *, supports=None)`` registers ``kernel`` as the ``backend``
  implementation of ``op`` (used as a decorator when ``kernel`` is omitted).  The "numpy" kernel is the
  definition; the others take the same arguments (and may add keyword-only ones such as ``out=``).
- ``supports(*args, **kwargs) -> bool`` says whether the kernel takes a call with these arguments
  (dtype, shape, layout, sizes): :func:`refimpl.backends.call` sends a call to a kernel only where its
  predicate holds, so callers never decide eligibility.  No predicate: every call.  The NumPy definition
  takes every call and has none.
- ``definition(op)`` is the NumPy definition, for a kernel that answers with it (the C kernels' range
  fallback) without importing the module that defines it.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["BACKENDS", "register", "definition", "supported"]

#: The backends, the definition first.
BACKENDS = ("numpy", "numba", "c")

#: {operation: {backend: kernel}}; tests monkeypatch entries (refimpl.backends._REGISTRY is this dict).
_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {}

#: {operation: {backend: predicate}}, kept apart from the kernels so that wrapping a kernel keeps its predicate.
_SUPPORTS: dict[str, dict[str, Callable[..., bool]]] = {}


def register(op: str, backend: str, kernel: Callable[..., Any] | None = None, *,
             supports: Callable[..., bool] | None = None) -> Any:
    """Register ``kernel`` as the ``backend`` implementation of operation ``op``.

    ``register(op, backend, kernel, supports=predicate)`` registers and returns ``kernel``;
    ``@register(op, backend, supports=predicate)`` does the same as a decorator.  ``supports`` (not for
    "numpy", the definition, which takes every call) is called with the call's arguments and says whether
    this kernel takes them; None means every call.
    """
    if backend not in BACKENDS:
        raise ValueError(f"argument 'backend': expected one of {BACKENDS}, got {backend!r}")
    if not isinstance(op, str) or not op:
        raise ValueError(f"argument 'op': expected a non-empty operation name, got {op!r}")
    if supports is not None and backend == "numpy":
        raise ValueError(f"argument 'supports': the NumPy definition of {op!r} takes every call; only an "
                         f"accelerated kernel has a predicate")
    if supports is not None and not callable(supports):
        raise TypeError(f"argument 'supports': expected a callable or None, got {type(supports).__name__}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY.setdefault(op, {})[backend] = fn
        if supports is None:
            _SUPPORTS.get(op, {}).pop(backend, None)
        else:
            _SUPPORTS.setdefault(op, {})[backend] = supports
        return fn

    return deco if kernel is None else deco(kernel)


def definition(op: str) -> Callable[..., Any]:
    """The NumPy definition of ``op`` (its "numpy" kernel); KeyError if none is registered."""
    impl = _REGISTRY.get(op, {}).get("numpy")
    if impl is None:
        raise KeyError(f"refimpl.backends: no NumPy definition is registered for operation {op!r}; "
                       f"registered operations: {sorted(_REGISTRY)}")
    return impl


def supported(op: str, backend: str, args: tuple, kwargs: dict) -> bool:
    """Whether the ``backend`` kernel of ``op`` (registered) takes a call with ``args``, ``kwargs``."""
    pred = _SUPPORTS.get(op, {}).get(backend)
    return True if pred is None else bool(pred(*args, **kwargs))
