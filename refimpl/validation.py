"""Validation at the public boundary: scalars, option arguments, token grids, ``taps`` and parameter mappings.

Layer: constants (imports :mod:`refimpl.errors` and NumPy only), so configs, layers, attention modules and
networks all use the same checks.  Arrays have theirs in :mod:`refimpl.numerics` (``as_float``: real floating
dtypes only, promoted to the working precision; ``check_shapes``: ranks and named dimensions).  Every check
raises a class of :mod:`refimpl.errors` whose message names the argument (for a parameter: its full
state_dict key), what was expected and what was given, and never prints an array (shapes, dtypes and single
values only).

One check per concept:

- :func:`check_real` / :func:`check_eps` / :func:`check_positive`: real scalars (bool, str, None, arrays and
  NaN refused; eps finite and >= 0; ratios and bases finite and > 0);
- :func:`check_int` and :func:`check_kernel`: integral fields (a float such as 2.5, or 5.0, is refused; kernel
  sizes odd, or 0 where "no kernel" is allowed);
- :func:`check_option`: an option argument is one of its allowed strings;
- :func:`check_seed`: a random seed is an integer >= 0 (or, where allowed, a ``numpy.random.Generator``);
- :func:`check_int_tuple`: a tuple of integers of a given length (a kernel size, a stride, a grid);
- :func:`check_mapping`: an argument is a mapping (a ``params`` table, a ``shapes`` table);
- :func:`check_param_values`: every value of an open-keyed parameter mapping is a real floating array;
- :func:`check_float_array`: a real floating array returned as is (layout functions that move values without
  computing: no promotion, which :func:`refimpl.numerics.as_float` does);
- :func:`check_taps`: the ``taps`` argument is None or a dict;
- :func:`check_max_elements`: a memory guard ``max_elements`` is None (the default limit) or an integer >= 0;
- :func:`check_config`: a configuration argument is an instance of its config class (not None, a str, a dict);
- :func:`check_axis`: an axis of an array of known rank;
- :func:`check_grid`: an (H, W) pair of positive ints whose product is the number of tokens;
- :func:`check_params`: a state_dict-keyed parameter mapping against the expected keys and shapes;
  :func:`checked_params` the same check returning a :class:`CheckedParams` (checked once, see below).

The parameter check (:func:`check_params`) is strict:

1. ``params`` is a mapping with string keys;
2. every expected key that is present has the expected shape (``blocks.3.attn.qkv.weight: expected shape
   (288, 96), got (289, 96)``) and a real floating dtype (float16/32/64; values are promoted by the consumers);
3. the key sets are equal: missing and unexpected keys are listed by their full names, each unexpected key with
   the closest expected one ("did you mean 'cpe.0.proj.bias'?", :mod:`difflib`);
4. BatchNorm running variances (keys ending in ``.running_var``) are >= 0 (NaN refused): sqrt(rv + eps) of a
   negative variance would be a silent NaN.

**Checked once.**  :func:`checked_params` runs the same check and returns a :class:`CheckedParams`: an immutable
snapshot of the mapping (its own dict of the same arrays) that records the table it was checked against.
:func:`check_params` returns such a mapping at once when its table is the one asked for (the same object, or equal
key -> shape entries), and :meth:`CheckedParams.sub` (what :func:`refimpl.layers.subparams` uses) gives the
entries under a prefix as a ``CheckedParams`` of the matching part of the table, from a tree of sub-mappings made
once per level (not a pass over the whole mapping per call).  So a
network checks its parameters once at its public entry and passes the checked mapping down: the units, blocks,
attention and MLP functions it calls accept their part without checking again, while the same functions called
with a plain mapping check it in full, with the same messages.  The fast path is exact: a sub-mapping is taken
without a check only where the full check would pass (the same keys, shapes and optional buffers).  A snapshot
cannot see later changes to the mapping it was taken from (that mapping, passed again, is checked in full); it
assumes its arrays are not reshaped or rewritten in place afterwards.

Weights may otherwise hold any values, NaN and Inf included: a non-finite weight gives the non-finite result the
mathematics implies (not a silent one), so values are not scanned for finiteness.

**Buffers.**  The expected tables (each family's ``param_shapes``) hold every *floating* state_dict entry of the
PyTorch twin: parameters and BatchNorm's ``running_mean`` / ``running_var``, which are required.  Derived
buffers are not parameters of the reference: the relative-position indices, the RoPE tables and the attention
masks are computed from the configuration (they are non-persistent in the twins), so a key with such a name is
refused as unexpected, with a note that the reference derives it.  The one integer persistent buffer,
BatchNorm's ``num_batches_tracked`` (what ``{k: v.double().numpy() for k, v in module.state_dict().items()}``
also copies), is optional: accepted next to an expected ``.running_var`` of the same prefix if it is a
non-negative integral scalar, and unused (eval-mode BatchNorm does not read it).
"""

from __future__ import annotations

import difflib
import math
import warnings
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from .errors import (ArgumentError, ArgumentTypeError, ParameterKeyError, ParameterShapeError, ParameterTypeError,
                     ParameterValueError)

__all__ = ["describe", "check_real", "check_eps", "check_positive", "check_int", "check_kernel", "check_option",
           "check_seed", "check_int_tuple", "check_mapping", "check_param_values", "check_float_array", "check_taps",
           "check_config", "check_heads", "check_config_options", "check_attention_order", "check_max_elements", "check_axis", "check_grid", "check_params", "renamed_keyword",
           "checked_params", "CheckedParams", "OPTIONAL_BUFFER_SUFFIX", "DERIVED_BUFFER_NAMES"]

#: The optional persistent buffer (BatchNorm's batch counter; unused in eval mode).
OPTIONAL_BUFFER_SUFFIX = ".num_batches_tracked"

#: Leaf names of buffers that the reference derives from the configuration (never parameters).
DERIVED_BUFFER_NAMES = ("relative_position_index", "attn_mask", "mask", "rope", "freqs", "sin", "cos",
                        "rope_sin", "rope_cos", "position_ids")

_MAX_LISTED = 8          # keys listed per category in a key-mismatch message
_MAX_REPR = 60           # characters of a non-array value shown in a message


# ===================================================================================================
# Describing a value without printing arrays
# ===================================================================================================

def describe(value: Any) -> str:
    """A short description of ``value`` for an error message: arrays by shape and dtype, other values by a
    repr truncated to a few dozen characters."""
    if isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "dtype")):
        shape = tuple(getattr(value, "shape", ()))
        if shape == () and isinstance(value, (np.ndarray, np.generic)):
            return f"{np.asarray(value).dtype} scalar {np.asarray(value).item()!r}"
        return f"{type(value).__name__} of shape {shape} and dtype {getattr(value, 'dtype', '?')}"
    if isinstance(value, (list, tuple)) and len(repr(value)) > _MAX_REPR:
        return f"{type(value).__name__} of length {len(value)}"
    text = repr(value)
    if len(text) > _MAX_REPR:
        text = text[:_MAX_REPR] + "..."
    return f"{type(value).__name__} {text}"


def _label(name: str) -> str:
    return f"argument '{name}'"


# ===================================================================================================
# Scalars
# ===================================================================================================

def check_real(value: Any, name: str, *, minimum: float | None = None, exclusive: bool = False,
               allow_inf: bool = False) -> float:
    """Return ``value`` as a float: a real number (Python or NumPy scalar, not bool), not NaN, finite unless
    ``allow_inf``, and >= ``minimum`` (> with ``exclusive``).  ``ArgumentTypeError`` / ``ArgumentError``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{_label(name)}: expected a real number, got {describe(value)}")
    v = float(value)
    rng = "" if minimum is None else f" {'>' if exclusive else '>='} {minimum:g}"
    what = f"a {'real number' if allow_inf else 'finite real number'}{rng}"
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ArgumentError(f"{_label(name)}: expected {what}, got {v}")
    if minimum is not None and (v < minimum or (exclusive and v == minimum)):
        raise ArgumentError(f"{_label(name)}: expected {what}, got {value!r}")
    return v


def check_eps(value: Any, name: str = "eps") -> float:
    """An eps (added to a denominator or a variance): a finite real number >= 0."""
    return check_real(value, name, minimum=0.0)


def check_positive(value: Any, name: str) -> float:
    """A ratio, base or scale: a finite real number > 0."""
    return check_real(value, name, minimum=0.0, exclusive=True)


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """Return ``value`` as int: an integer (Python or NumPy; bool and floats such as 2.5 or 5.0 refused)
    >= ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        rng = "" if minimum is None else f" >= {minimum}"
        raise ArgumentTypeError(f"{_label(name)}: expected an integer{rng}, got {describe(value)}")
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{_label(name)}: expected an integer >= {minimum}, got {value}")
    return int(value)


def check_kernel(value: Any, name: str, *, allow_zero: bool = False) -> int:
    """A kernel size for 'same' padding k // 2: an odd integer >= 1, or 0 ("none") with ``allow_zero``."""
    k = check_int(value, name, minimum=0 if allow_zero else 1)
    if k % 2 == 0 and not (allow_zero and k == 0):
        what = "0 (none) or an odd integer" if allow_zero else "an odd integer"
        raise ArgumentError(f"{_label(name)}: expected {what} ('same' padding k // 2), got {k}")
    return k


def check_option(value: Any, name: str, allowed: Iterable[str]) -> str:
    """An option argument: one of the strings ``allowed`` (an int, None or an unknown name refused)."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ArgumentError(f"{_label(name)}: expected one of {allowed}, got {describe(value)}")
    return value


def check_seed(value: Any, name: str = "seed", *, allow_generator: bool = False) -> Any:
    """A random seed: an integer >= 0 (bool, float, str and None refused: None would draw fresh OS entropy,
    and a reference initialiser is reproducible); with ``allow_generator`` also a ``numpy.random.Generator``,
    returned as is."""
    if allow_generator and isinstance(value, np.random.Generator):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        what = "an integer seed >= 0" + (" or a numpy.random.Generator" if allow_generator else "")
        raise ArgumentTypeError(f"{_label(name)}: expected {what}, got {describe(value)}")
    return check_int(value, name, minimum=0)


def check_int_tuple(value: Any, name: str, length: int | None = None, *, minimum: int | None = None
                    ) -> tuple[int, ...]:
    """A tuple (or list) of integers, of ``length`` entries when given, each >= ``minimum``; returned as a
    tuple of Python ints (bool and float entries such as 2.5 refused)."""
    if not isinstance(value, (tuple, list)) or (length is not None and len(value) != length):
        what = "a tuple of integers" if length is None else f"a tuple of {length} integers"
        raise ArgumentTypeError(f"{_label(name)}: expected {what}, got {describe(value)}")
    return tuple(check_int(v, f"{name}[{i}]", minimum=minimum) for i, v in enumerate(value))


def check_float_array(value: Any, name: str) -> np.ndarray:
    """A real floating array (float16/32/64), returned as ``np.asarray(value)`` without any cast (int, bool,
    complex, object and str refused)."""
    arr = np.asarray(value) if not isinstance(value, (str, bytes)) else None
    if arr is None or arr.dtype.kind != "f":
        raise ArgumentTypeError(f"{_label(name)}: expected a real floating array (float16/float32/float64), "
                                f"got {describe(value)}")
    return arr


def check_param_values(params: Mapping[str, Any], *, where: str) -> Mapping[str, Any]:
    """Every value of a parameter mapping whose key set is open (a resampler working on operator, block or
    network mappings) is a real floating array; ``ParameterTypeError`` naming the key."""
    for key, value in params.items():
        if np.asarray(value).dtype.kind != "f":
            raise ParameterTypeError(f"{where}: parameter '{key}': expected a real floating array "
                                     f"(float16/float32/float64), got {describe(value)}")
    return params


def check_mapping(value: Any, name: str, what: str = "a mapping") -> Mapping[str, Any]:
    """An argument that must be a mapping (``params``, ``shapes``); ``what`` describes the expected mapping."""
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"{_label(name)}: expected {what}, got {describe(value)}")
    return value


# ===================================================================================================
# taps, axes, grids
# ===================================================================================================

def check_taps(taps: Any, name: str = "taps") -> dict | None:
    """``taps`` is None or a dict (the function writes named intermediates into it)."""
    if taps is not None and not isinstance(taps, dict):
        raise ArgumentTypeError(f"{_label(name)}: expected None or a dict (intermediates are written into it), "
                                f"got {describe(taps)}")
    return taps


def check_max_elements(value: Any, name: str = "max_elements") -> int | None:
    """A memory guard: None (the default limit, ``config.QUADRATIC_MAX_ELEMENTS``) or an integer >= 0 (a float
    such as 2.5, a bool or a negative limit refused)."""
    return None if value is None else check_int(value, name, minimum=0)


def check_config(cfg: Any, cls: type, name: str = "cfg") -> Any:
    """``cfg`` is an instance of the config class ``cls`` (a frozen dataclass that validated itself in
    ``__post_init__``); returns it unchanged."""
    if not isinstance(cfg, cls):
        raise ArgumentTypeError(f"{_label(name)}: expected a {cls.__name__} ({cls.__module__}.{cls.__qualname__}), "
                                f"got {describe(cfg)}")
    return cfg


def check_heads(dim: Any, num_heads: Any) -> tuple[int, int]:
    """A multi-head configuration's ``dim`` and ``num_heads``: integers >= 1, ``dim`` divisible by
    ``num_heads`` (the preamble of the attention configs, FocusedConfig and L2ViTConfig)."""
    dim, num_heads = check_int(dim, "dim", minimum=1), check_int(num_heads, "num_heads", minimum=1)
    if dim % num_heads:
        raise ArgumentError(f"argument 'dim': {dim} is not divisible by num_heads={num_heads}")
    return dim, num_heads


def renamed_keyword(value: Any, old_value: Any, *, new: str, old: str, default: Any, where: str,
                    stacklevel: int = 3) -> Any:
    """The value of keyword ``new`` of ``where`` when its deprecated spelling ``old`` may have been passed
    instead (``old_value``: None when it was not): ``value``, or ``old_value`` with a DeprecationWarning naming
    both spellings, attributed ``stacklevel`` frames up (the caller's caller: the user's line, where Python
    shows it); ArgumentError when both were given with different values (neither is silently dropped)."""
    if old_value is None:
        return value
    warnings.warn(f"{where}: argument '{old}' is deprecated, use '{new}' (the same values)", DeprecationWarning,
                  stacklevel=stacklevel)
    if value != default and value != old_value:
        raise ArgumentError(f"{where}: argument '{new}'={value!r} and its deprecated spelling '{old}'={old_value!r} "
                            f"disagree; pass '{new}' only")
    return old_value


def check_config_options(cfg: Any, choices: Mapping[str, Iterable[Any]]) -> None:
    """Every option field of a config is one of its allowed values: ``choices`` maps a field name to them
    (the attention configs' option checks: FocusedConfig, L2ViTConfig, CastlingConfig)."""
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise ArgumentError(f"argument '{name}': expected one of {allowed}, got {getattr(cfg, name)!r}")


def check_attention_order(order: Any) -> None:
    """The contraction order of a linear attention core: "linear" (phi(Q) (phi(K)^T V)) or "quadratic"
    ((phi(Q) phi(K)^T) V) (the focused and enhanced cores' ``order``)."""
    if order not in ("linear", "quadratic"):
        raise ArgumentError(f"argument 'order': expected 'linear' or 'quadratic', got {order!r}")


def check_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    """An axis of a ``ndim``-d array, in [-ndim, ndim); returns it non-negative."""
    a = check_int(axis, name)
    if not -ndim <= a < ndim:
        raise ArgumentError(f"{_label(name)}: expected an axis in [{-ndim}, {ndim}) of a {ndim}-d array, got {a}")
    return a % ndim


def check_grid(hw: Any, n_tokens: int | None = None, name: str = "hw", *, tokens: str = "x") -> tuple[int, int]:
    """An (H, W) pair of positive integers; with ``n_tokens``, H W must equal it (the tokens of argument
    ``tokens`` fill the grid row-major)."""
    if not (isinstance(hw, (tuple, list)) and len(hw) == 2):
        raise ArgumentTypeError(f"{_label(name)}: expected a pair (H, W) of positive integers, got {describe(hw)}")
    big_h, big_w = check_int(hw[0], f"{name}[0]", minimum=1), check_int(hw[1], f"{name}[1]", minimum=1)
    if n_tokens is not None and big_h * big_w != n_tokens:
        raise ArgumentError(f"{_label(name)}: expected (H, W) with H * W = N = {n_tokens} (the tokens of "
                            f"argument '{tokens}'), got ({big_h}, {big_w}) with H * W = {big_h * big_w}")
    return big_h, big_w


# ===================================================================================================
# Parameter mappings
# ===================================================================================================

def _listed(keys: Iterable[str]) -> str:
    keys = list(keys)
    shown = ", ".join(f"'{k}'" for k in keys[:_MAX_LISTED])
    return shown + (f" and {len(keys) - _MAX_LISTED} more" if len(keys) > _MAX_LISTED else "")


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _suggest(key: str, candidates: list[str]) -> str | None:
    best = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    return best[0] if best else None


def _is_optional_buffer(key: str, expected: Mapping[str, Any]) -> bool:
    if not key.endswith(OPTIONAL_BUFFER_SUFFIX):
        return False
    return key[: -len(OPTIONAL_BUFFER_SUFFIX)] + ".running_var" in expected


def _check_optional_buffer(key: str, value: Any, where: str) -> None:
    arr = np.asarray(value)
    ok = arr.shape == () and arr.dtype.kind in "iuf" and np.isfinite(arr) and float(arr) >= 0 \
        and float(arr) == math.floor(float(arr))
    if not ok:
        raise ParameterValueError(f"{where}: buffer '{key}' (BatchNorm's batch counter, optional and unused in "
                                  f"eval mode): expected a non-negative integral scalar, got {describe(value)}")


def check_params(params: Any, expected: Mapping[str, tuple[int, ...]], *, where: str) -> Mapping[str, Any]:
    """Check a state_dict-keyed parameter mapping strictly against ``expected`` (key -> shape); returns
    ``params`` unchanged.

    ``where`` names the function or network in the messages (``"l2vit network"``, ``"focused_linear_attention"``).
    Order of the checks: the mapping itself, then each expected key present (shape, dtype, running_var >= 0),
    then the key sets (missing / unexpected / misspelled, with "did you mean").  Raises
    :class:`~refimpl.errors.ArgumentTypeError` (not a mapping), :class:`~refimpl.errors.ParameterShapeError`,
    :class:`~refimpl.errors.ParameterTypeError`, :class:`~refimpl.errors.ParameterValueError` and
    :class:`~refimpl.errors.ParameterKeyError`; see the module docstring for buffers.

    A :class:`CheckedParams` already checked against the same table (or the matching part of it, for one from
    :meth:`CheckedParams.sub`) is returned at once: the check would pass (module docstring, "Checked once").
    """
    if isinstance(params, CheckedParams) and params._matches(expected):
        return params
    return _check_params_full(params, expected, where)


def _check_params_full(params: Any, expected: Mapping[str, tuple[int, ...]], where: str) -> Mapping[str, Any]:
    """The full check of :func:`check_params` (every key, shape, dtype and running variance)."""
    if not isinstance(params, Mapping):
        raise ArgumentTypeError(f"{where}: argument 'params': expected a mapping of state_dict keys to float "
                                f"arrays, got {describe(params)}")
    bad_keys = [k for k in params if not isinstance(k, str)]
    if bad_keys:
        raise ParameterKeyError(f"{where}: argument 'params': expected string keys, got {describe(bad_keys[0])}")
    for key, shape in expected.items():
        if key not in params:
            continue
        value = params[key]
        got = np.shape(value)
        if tuple(got) != tuple(shape):
            raise ParameterShapeError(f"{where}: parameter '{key}': expected shape {_fmt_shape(tuple(shape))}, "
                                      f"got {_fmt_shape(tuple(got))}")
        dtype = getattr(value, "dtype", None)
        kind = np.dtype(dtype).kind if isinstance(dtype, np.dtype) else np.asarray(value).dtype.kind
        if kind != "f":
            raise ParameterTypeError(f"{where}: parameter '{key}': expected a real floating array "
                                     f"(float16/float32/float64), got {describe(value)}")
        if key.endswith(".running_var"):
            rv = np.asarray(value)
            bad = ~(rv >= 0)
            if bad.any():
                worst = rv[bad].flat[0]
                raise ParameterValueError(f"{where}: parameter '{key}': a BatchNorm running variance must be "
                                          f">= 0, got {int(bad.sum())} of {rv.size} entries below 0 or NaN "
                                          f"(first: {float(worst)!r})")
    missing = [k for k in expected if k not in params]
    unexpected = []
    for k in params:
        if k in expected:
            continue
        if _is_optional_buffer(k, expected):
            _check_optional_buffer(k, params[k], where)
            continue
        unexpected.append(k)
    if not (missing or unexpected):
        return params
    parts = []
    if unexpected:
        described = []
        for k in sorted(unexpected)[:_MAX_LISTED]:
            leaf = k.rpartition(".")[2]
            hint = _suggest(k, missing)          # a misspelled key leaves the right one missing
            if hint is not None:
                described.append(f"'{k}' (did you mean '{hint}'?)")
            elif leaf in DERIVED_BUFFER_NAMES:
                described.append(f"'{k}' (a buffer the reference derives from the configuration; remove it)")
            else:
                described.append(f"'{k}'")
        more = len(unexpected) - _MAX_LISTED
        parts.append("unexpected " + ", ".join(described) + (f" and {more} more" if more > 0 else ""))
    if missing:
        parts.append("missing " + _listed(missing))
    raise ParameterKeyError(f"{where}: the parameter keys differ from the expected state_dict keys "
                            f"({len(expected)} expected): " + "; ".join(parts))



# ===================================================================================================
# Checked once: a parameter mapping that carries its check
# ===================================================================================================

def _shape_table(expected: Mapping[str, Any]) -> dict[str, tuple]:
    return {k: tuple(shape) for k, shape in expected.items()}


def _extras_are_optional(data: Mapping[str, Any], shapes: Mapping[str, tuple]) -> bool:
    """Every key of ``data`` outside ``shapes`` is one that :func:`check_params` accepts as an optional buffer
    against ``shapes`` (a sub-mapping's bare "num_batches_tracked" is not)."""
    return all(k in shapes or _is_optional_buffer(k, shapes) for k in data)


class CheckedParams(Mapping):
    """An immutable parameter mapping that passed :func:`check_params` against a known table.

    Made by :func:`checked_params` (a snapshot: its own dict of the checked mapping's entries, so later changes
    to that mapping do not reach it) or by :meth:`sub`.  It reads like the mapping it was made from (same keys
    in the same order, the same array objects) and cannot be changed.  :func:`check_params` returns it at once
    when asked about the table it was checked against, or about a table with the same key -> shape entries; any
    other table gets the full check.  Thread-safe: nothing is shared outside the object; a mapping's
    sub-mappings are made on the first :meth:`sub` (by whichever thread comes first; the result is the same).
    """

    __slots__ = ("_data", "_expected", "_shapes", "_extras_ok", "_children")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Refused (TypeError): a CheckedParams is made only by :func:`checked_params`, which checks the mapping, or by
        :meth:`sub`."""
        raise TypeError("CheckedParams is made by refimpl.validation.checked_params (which checks the mapping)")

    @classmethod
    def _make(cls, data: dict, expected: Mapping[str, Any] | None, shapes: dict) -> "CheckedParams":
        obj = object.__new__(cls)
        obj._data, obj._expected, obj._shapes, obj._children = data, expected, shapes, None
        obj._extras_ok = len(data) == len(shapes) or _extras_are_optional(data, shapes)
        return obj

    # Mapping protocol: read-only delegation to the snapshot
    def __getitem__(self, key: str) -> Any:
        """The snapshot's value of ``key`` (the same array object as the checked mapping's); KeyError if absent."""
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        """The keys in the checked mapping's order."""
        return iter(self._data)

    def __len__(self) -> int:
        """The number of entries of the snapshot."""
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is a key of the snapshot."""
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        """The snapshot's value of ``key``, or ``default`` if absent."""
        return self._data.get(key, default)

    def keys(self):                          # read-only views of the snapshot (dict speed, not Mapping's mixins)
        """A read-only view of the snapshot's keys."""
        return self._data.keys()

    def items(self):
        """A read-only view of the snapshot's (key, value) pairs."""
        return self._data.items()

    def values(self):
        """A read-only view of the snapshot's values."""
        return self._data.values()

    def __repr__(self) -> str:
        """The number of entries and of the expected keys they were checked against (not the arrays)."""
        return f"CheckedParams({len(self._data)} entries checked against {len(self._shapes)} expected keys)"

    @property
    def shapes(self) -> Mapping[str, tuple]:
        """The key -> shape table this mapping was checked against (read-only)."""
        return MappingProxyType(self._shapes)

    def _matches(self, expected: Any) -> bool:
        """Whether :func:`check_params` (self, expected) is known to pass: ``expected`` is the table checked
        (the same object) or has the same key -> shape entries, and every other key is an optional buffer."""
        if expected is not None and expected is self._expected:
            return True
        if not self._extras_ok or not isinstance(expected, Mapping) or len(expected) != len(self._shapes):
            return False
        shapes = self._shapes
        try:
            if expected == shapes:          # one C-level comparison for tables with tuple shapes
                return True
        except (TypeError, ValueError):     # shapes given as arrays: compared entry by entry below
            pass
        try:
            return all(shapes.get(k) == tuple(shape) for k, shape in expected.items())
        except TypeError:                   # an expected shape that is not a sequence: the full check says so
            return False

    def sub(self, prefix: str) -> "CheckedParams | None":
        """The entries under ``prefix`` with ``prefix + "."`` removed from their keys (as
        :func:`refimpl.layers.subparams`), checked against the matching part of this mapping's table; None when
        no entry is under ``prefix``.  The sub-mappings form a tree, one level per key component, each level
        made once (one pass over that level's entries) and kept: a call costs a few dict look-ups, not a pass
        over the whole mapping."""
        if prefix == "":
            return self if self._data else None
        node = self
        for part in prefix.split("."):
            children = node._children
            if children is None:
                children = node._children = _split_first(node._data, node._shapes)
            node = children.get(part)
            if node is None:
                return None
        return node


def _split_first(data: Mapping[str, Any], shapes: Mapping[str, tuple]) -> dict[str, CheckedParams]:
    """The children of a checked mapping: its entries grouped by their keys' first component ("blocks" for
    "blocks.0.mlp.fc1.weight"), that component and its dot removed, in the mapping's order, each with its part
    of the table (one pass)."""
    groups: dict[str, tuple[dict, dict]] = {}
    for key, value in data.items():
        head, dot, rest = key.partition(".")
        if not dot:
            continue
        group = groups.get(head)
        if group is None:
            group = groups[head] = ({}, {})
        group[0][rest] = value
        shape = shapes.get(key)
        if shape is not None:
            group[1][rest] = shape
    return {head: CheckedParams._make(d, None, s) for head, (d, s) in groups.items()}


def checked_params(params: Any, expected: Mapping[str, tuple[int, ...]], *, where: str) -> CheckedParams:
    """:func:`check_params` (the same checks and messages), returning the mapping as a :class:`CheckedParams`
    (a snapshot) that later :func:`check_params` calls against ``expected`` accept at once: by identity when
    ``expected`` is a read-only table (``types.MappingProxyType``, as :func:`refimpl.models.common.
    check_network_params` passes), else entry by entry.  A ``CheckedParams`` that already matches ``expected`` is
    returned as it is."""
    checked = check_params(params, expected, where=where)
    if isinstance(checked, CheckedParams):
        return checked
    same = expected if isinstance(expected, MappingProxyType) else None    # a mutable table is compared each time
    return CheckedParams._make(dict(params), same, _shape_table(expected))
