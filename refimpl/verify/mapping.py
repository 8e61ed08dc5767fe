"""Mapping a foreign state_dict onto the reference's parameter keys: automatic, listed, strict.

Layer: the verify tool (NumPy only).  The rules, in order, each decision recorded in the report:

1. the user's renames (``--map``: ``{"rename": {foreign_key: reference_key}, "ignore": [foreign_key, ...]}``);
2. exact names;
3. aliases: the reference submodule ``q`` is also found as ``to_q``, ``query``, ``q_proj``..., anywhere in the
   foreign key path and through one wrapper level (RAVLT's ``norm1.norm.weight`` for ``norm1.weight``); each
   reference names its aliases (:mod:`refimpl.verify.references`);
4. fused projections: a foreign ``qkv`` (3C, C) split into the reference's ``q`` (C, C) and ``kv`` (2C, C)
   where the reference keeps them apart, and foreign ``q``, ``k``, ``v`` concatenated where it fuses them;
5. shapes: a 1 x 1 convolution weight (O, I, 1, 1) for a linear weight (O, I), and singleton axes;
6. the one foreign tensor left of a reference parameter's shape, when no other reference parameter left has it.

Strict: a foreign parameter that maps to nothing and a reference parameter that nothing fills are an error
(:class:`VerifyError`) that lists them, unless the user ignores them.  Buffers the reference has no key for
(non-floating ones: indices, counters, masks; floating ones: RoPE tables, precomputed biases) are derived data,
listed, not mapped: what they do is judged by the stages that use them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

import numpy as np

from .loading import VerifyError

__all__ = ["WeightMapping", "map_weights"]


@dataclasses.dataclass
class WeightMapping:
    """The result of :func:`map_weights`."""

    values: dict[str, np.ndarray]                 # reference key -> float64 array in the reference's shape
    source: dict[str, str]                        # reference key -> foreign key (with a transform note)
    decisions: list[str]                          # every decision, in words
    modules: dict[str, str]                       # reference submodule -> foreign submodule path
    ignored: list[str]                            # foreign keys the user ignored
    derived: list[str]                            # non-floating foreign buffers (recomputed, not mapped)


def _split(key: str) -> tuple[str, str]:
    mod, _, leaf = key.rpartition(".")
    return mod, leaf


def _alias_pattern(alias: str, leaf: str) -> re.Pattern:
    # alias as a whole path component, anywhere in the path, optionally one wrapper level below it
    return re.compile(rf"(?:^|.*\.){re.escape(alias)}(?:\.[A-Za-z_]\w*)?\.{re.escape(leaf)}$" if leaf else
                      rf"(?:^|.*\.){re.escape(alias)}$")


def _fit(value: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str]:
    """value reshaped to ``shape`` where only singleton axes differ (a 1x1 conv weight for a linear one)."""
    if value.shape == tuple(shape):
        return value, ""
    if value.size == int(np.prod(shape)) and [s for s in value.shape if s != 1] == [s for s in shape if s != 1]:
        return value.reshape(shape), f" (reshaped {tuple(value.shape)} -> {tuple(shape)})"
    return None, ""


def map_weights(foreign: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], *,
                aliases: Mapping[str, Sequence[str]] | None = None,
                fused: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
                joined: Mapping[str, Sequence[Sequence[str]]] | None = None,
                user_map: Mapping[str, Any] | None = None, buffers: Sequence[str] = ()) -> WeightMapping:
    """Map ``foreign`` (key -> array) onto the reference keys ``shapes`` (key -> shape) by the module
    docstring's rules.

    aliases : reference submodule (or top-level parameter) name -> foreign names it may go by.
    fused : foreign fused name -> (its aliases, the reference submodules it splits into along axis 0, in order).
    joined : reference fused submodule -> the aliases of the foreign parts it is the concatenation of, in order
        (split q / k / v projections for a fused ``qkv``); its ``modules`` entry is the parts' paths joined by
        "+".
    user_map : {"rename": {foreign: reference}, "ignore": [foreign, ...]}.
    buffers : the foreign keys that are buffers, not parameters.  A floating buffer the reference has no key for
        (a RoPE table, a precomputed mask) is derived data: listed in ``derived``, not an error; what it does is
        judged by the stages that use it.
    """
    user_map = dict(user_map or {})
    unknown = set(user_map) - {"rename", "ignore"}
    if unknown:
        raise VerifyError(f"argument 'map': unknown entries {sorted(unknown)} (expected 'rename' and 'ignore')")
    rename = dict(user_map.get("rename", {}))
    ignore = list(user_map.get("ignore", []))
    arrays = {str(k): np.asarray(v) for k, v in foreign.items()}
    for k in list(rename) + ignore:
        if k not in arrays:
            raise VerifyError(f"argument 'map': foreign key {k!r} is not in the module's state_dict "
                              f"(it has {sorted(arrays)})")
    derived = sorted(k for k, v in arrays.items() if not np.issubdtype(v.dtype, np.floating))
    pool = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items() if k not in derived and k not in ignore}
    need = {k: tuple(s) for k, s in shapes.items()}
    values: dict[str, np.ndarray] = {}
    source: dict[str, str] = {}
    decisions: list[str] = []
    modules: dict[str, str] = {}

    def take(ref: str, fk: str, how: str, value: np.ndarray | None = None) -> None:
        val = pool[fk] if value is None else value
        fitted, note = _fit(val, need[ref])
        if fitted is None:
            raise VerifyError(f"weights: {how} maps foreign {fk!r} {tuple(val.shape)} to reference {ref!r}, which has"
                              f" shape {need[ref]}")
        values[ref] = fitted
        source[ref] = fk + note
        decisions.append(f"{ref} <- {fk}{note}: {how}")
        ref_mod = _split(ref)[0]
        f_mod, _ = _split(fk)
        if ref_mod:
            modules.setdefault(ref_mod, f_mod)

    for fk, ref in rename.items():
        if ref not in need:
            raise VerifyError(f"argument 'map': rename {fk!r} -> {ref!r}: the reference has no key {ref!r} "
                              f"(it has {sorted(need)})")
        take(ref, fk, "the user's rename")
        del pool[fk]
    for ref in [r for r in need if r not in values and r in pool]:
        take(ref, ref, "exact name")
        del pool[ref]
    for ref in [r for r in need if r not in values]:
        mod, leaf = _split(ref)
        name = mod or leaf
        cands: list[str] = []
        for alias in (aliases or {}).get(name, ()):
            pat = _alias_pattern(alias, leaf if mod else "")
            cands += [fk for fk in pool if pat.match(fk) and fk not in cands]
        if len(cands) == 1:
            take(ref, cands[0], f"alias of {name!r}")
            del pool[cands[0]]
        elif len(cands) > 1:
            raise VerifyError(f"weights: reference {ref!r} matches several foreign keys by alias ({cands}); name "
                              f"the right one with --map '{{\"rename\": {{\"<foreign>\": \"{ref}\"}}}}'")
    for fname, (falias, parts) in dict(fused or {}).items():
        for leaf in ("weight", "bias"):
            refs = [f"{p}.{leaf}" for p in parts]
            if not all(r in need and r not in values for r in refs):
                continue
            cands = []
            for alias in falias:
                pat = _alias_pattern(alias, leaf)
                cands += [fk for fk in pool if pat.match(fk) and fk not in cands]
            rows = sum(need[r][0] for r in refs)
            cands = [c for c in cands if pool[c].shape[0] == rows]
            if len(cands) != 1:
                continue
            fk = cands[0]
            start = 0
            for r in refs:
                n = need[r][0]
                take(r, fk, f"rows {start}:{start + n} of the fused {fname!r}", pool[fk][start:start + n])
                source[r] = f"{fk}[{start}:{start + n}]"
                start += n
            modules[fname] = _split(fk)[0]
            del pool[fk]
    for ref_mod, part_aliases in dict(joined or {}).items():
        for leaf in ("weight", "bias"):
            ref = f"{ref_mod}.{leaf}"
            if ref not in need or ref in values:
                continue
            parts = []
            for aliases_ in part_aliases:
                cands = []
                for alias in aliases_:
                    pat = _alias_pattern(alias, leaf)
                    cands += [fk for fk in pool if pat.match(fk) and fk not in cands]
                parts.append(cands[0] if len(cands) == 1 else None)
            if None in parts or sum(pool[p].shape[0] for p in parts) != need[ref][0]:
                continue
            take(ref, parts[0], f"the concatenation of {parts} (rows in that order)",
                 np.concatenate([pool[p] for p in parts], axis=0))
            source[ref] = " + ".join(parts)
            modules[ref_mod] = "+".join(_split(p)[0] for p in parts)
            for p in parts:
                del pool[p]
    left = [r for r in need if r not in values]
    for ref in left:
        same = [fk for fk in pool if pool[fk].shape == need[ref]]
        rivals = [r for r in left if r != ref and r not in values and need[r] == need[ref]]
        if len(same) == 1 and not rivals:
            take(ref, same[0], "the only foreign tensor left of its shape")
            del pool[same[0]]
    missing = sorted(r for r in need if r not in values)
    for k in sorted(k for k in pool if k in set(buffers)):
        derived.append(k)
        decisions.append(f"{k}: a floating buffer with no reference key: derived data, judged by the stages "
                         f"that use it")
        del pool[k]
    unused = sorted(pool)
    if missing or unused:
        lines = []
        if missing:
            lines.append("reference parameters nothing fills: " + ", ".join(f"{r} {need[r]}" for r in missing))
        if unused:
            lines.append("foreign tensors that map to nothing: " + ", ".join(f"{k} {tuple(pool[k].shape)}"
                                                                             for k in unused))
        raise VerifyError("weights: the mapping is incomplete (strict):\n  " + "\n  ".join(lines) +
                          "\n  decisions so far:\n    " + "\n    ".join(decisions or ["none"]) +
                          "\n  Name them with --map '{\"rename\": {...}, \"ignore\": [...]}'")
    return WeightMapping(values, source, decisions, modules, ignore, derived)
