"""Loading what the user names: the foreign module (``package.module:Name`` or ``path/to/file.py:Name``) and a
weights file (.safetensors, .npz without pickle, .pt/.pth through ``torch.load(weights_only=True)``).

Layer: the verify tool (imports torch; never imported by ``import refimpl``).  Every failure here is a
:class:`VerifyError` (the command line's exit status 2) whose message names the argument, what was expected and
what was given.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Mapping

import numpy as np

__all__ = ["VerifyError", "load_target", "instantiate", "load_weights"]


class VerifyError(ValueError):
    """A usage, loading or mapping error: the tool cannot run the comparison (exit status 2)."""


def load_target(spec: str) -> Any:
    """The object ``spec`` names: ``package.module:Name`` (importable) or ``path/to/file.py:Name`` (loaded from
    the file; its directory is not added to sys.path)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise VerifyError(f"argument 'target': expected 'package.module:Name' or 'path/to/file.py:Name', got {spec!r}")
    where, _, name = spec.rpartition(":")
    if not name.isidentifier():
        raise VerifyError(f"argument 'target': {name!r} (after ':') is not a Python name")
    if where.endswith(".py") or os.sep in where:
        if not os.path.isfile(where):
            raise VerifyError(f"argument 'target': file {where!r} does not exist")
        mod_name = "_refimpl_verify_target_" + os.path.splitext(os.path.basename(where))[0]
        spec_ = importlib.util.spec_from_file_location(mod_name, where)
        if spec_ is None or spec_.loader is None:
            raise VerifyError(f"argument 'target': cannot load {where!r} as a Python file")
        module = importlib.util.module_from_spec(spec_)
        sys.modules[mod_name] = module
        try:
            spec_.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[mod_name]
            raise VerifyError(f"argument 'target': executing {where!r} raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise VerifyError(f"argument 'target': importing {where!r} raised {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, name):
        raise VerifyError(f"argument 'target': {where!r} has no attribute {name!r}")
    return getattr(module, name)


def instantiate(obj: Any, init: Mapping[str, Any] | None) -> Any:
    """An ``nn.Module`` from ``obj``: a module instance as it is, or a class / factory called with ``init``
    (keyword arguments)."""
    import torch

    if isinstance(obj, torch.nn.Module):
        if init:
            raise VerifyError("argument 'init': the target is already a module instance; it takes no arguments")
        return obj
    if not callable(obj):
        raise VerifyError(f"argument 'target': expected an nn.Module class, instance or factory, got {type(obj)}")
    try:
        mod = obj(**dict(init or {}))
    except TypeError as exc:
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = "(...)"
        raise VerifyError(f"argument 'init': calling {getattr(obj, '__name__', obj)}{sig} with {dict(init or {})} "
                          f"failed: {exc}") from exc
    if not isinstance(mod, torch.nn.Module):
        raise VerifyError(f"argument 'target': the factory returned {type(mod).__name__}, not an nn.Module")
    return mod


def load_weights(path: str, widen: bool = True) -> dict[str, np.ndarray]:
    """name -> array (floating entries widened to float64, exactly, unless ``widen`` is False: then kept in their
    stored format, bfloat16 as float32; integer buffers as stored) from a weights file.  Arbitrary unpickling is refused: .npz is read with
    allow_pickle=False, .pt/.pth with torch.load(weights_only=True) (a checkpoint that needs more is an error,
    never executed).  A checkpoint dict holding its weights under "state_dict" or "model" is unwrapped."""
    if not os.path.isfile(path):
        raise VerifyError(f"argument 'weights': file {path!r} does not exist")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError as exc:  # pragma: no cover - safetensors is a dependency of the verify extra
            raise VerifyError("argument 'weights': reading .safetensors needs the package safetensors "
                              "(pip install safetensors)") from exc
        try:
            raw: Mapping[str, Any] = load_file(path)
        except Exception as exc:
            raise VerifyError(f"argument 'weights': {path!r} is not a valid safetensors file ({exc})") from exc
    elif ext == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                raw = {k: z[k] for k in z.files}
        except ValueError as exc:
            raise VerifyError(f"argument 'weights': {path!r} holds pickled objects; refused (only plain arrays "
                              f"are read, allow_pickle=False): {exc}") from exc
    elif ext in (".pt", ".pth", ".bin", ".ckpt"):
        import pickle

        import torch
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as exc:
            raise VerifyError(f"argument 'weights': {path!r} needs arbitrary unpickling, which is refused "
                              f"(torch.load(weights_only=True) failed: {str(exc).splitlines()[0]}); save the "
                              f"state_dict alone, or as .safetensors") from exc
        for key in ("state_dict", "model"):
            if isinstance(raw, Mapping) and isinstance(raw.get(key), Mapping):
                raw = raw[key]
        if not isinstance(raw, Mapping):
            raise VerifyError(f"argument 'weights': {path!r} holds a {type(raw).__name__}, not a state_dict")
    else:
        raise VerifyError(f"argument 'weights': expected a .safetensors, .npz, .pt or .pth file, got {path!r}")
    out = {}
    for k, v in raw.items():
        if hasattr(v, "detach"):
            v = v.detach().cpu()
            if v.is_floating_point():
                v = v.double() if widen else v.float() if str(v.dtype) == "torch.bfloat16" else v
            v = v.numpy()
        arr = np.asarray(v)
        if arr.dtype == object:
            raise VerifyError(f"argument 'weights': entry {k!r} of {path!r} is not a numeric array")
        out[str(k)] = arr.astype(np.float64) if arr.dtype.kind == "f" and widen else arr   # exact: every float widens
    return out
