"""Batched equals per-sample, and determinism, for every registered network (registry-driven).

The family test files check these properties for the networks they were written with (FLatten-DeiT / Swin,
Castling-DeiT: tests/test_models.py; L2ViT, RAVLT, LiSANet: tests/test_models_l2vit_ravlt_lisanet.py;
FLatten-PVT / PVTv2: tests/test_flatten_pvt.py; FLatten-CSwin's batched run: tests/test_flatten_cswin.py).  This
file asks the same of every registered name, so a network registered later (Castling-LeViT, Castling-MViTv2,
L2ViT and RALA in DeiT / Swin, the LiSA Table 3 operators) is covered without a new test: the reduced configuration
(``fam.reduced(cfg)``, every block type of the family, as in equivalence/test_models.py) of one name per family,
config type, operator, version (PVT v1 / v2) and attention preset (the sizes of one family share its code path).

- **Batched == per-sample**: every unit (stem, blocks, downsamplings, head) run on a batch of 3 equals the unit run
  on each sample alone within the unit's float64 error bound (``unit_bound``: both runs are float64 evaluations
  of one function in different summation orders, and ``Bound.array`` counts both errors), and the units chained
  give ``run``'s taps.
- **Determinism**: two runs on the same inputs give bit-identical logits and features, and ``init_params`` with
  the same seed gives the same weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from refimpl import config, numerics
from refimpl import models as rm

SEED = 11
F64 = "float64"


def _presets(cfg) -> list[str | None]:
    if not any(f.name == "preset" for f in dataclasses.fields(cfg)):
        return [None]
    out = []
    for p in ("paper", "official"):
        try:
            dataclasses.replace(cfg, preset=p)
            out.append(p)
        except ValueError:       # no released code, so no "official" preset (LiSA)
            pass
    return out


def _reduced(name: str, preset: str | None):
    e = rm.entry(name)
    cfg = e.config if preset is None else dataclasses.replace(e.config, preset=preset)
    return e.module, e.module.reduced(cfg)


def _image_hw(fam, cfg) -> tuple[int, int]:
    if hasattr(cfg, "img_size"):
        return tuple(cfg.img_size)
    if hasattr(fam, "test_image_hw"):
        return tuple(fam.test_image_hw(cfg))
    return tuple(config.NET_PAPER_RESOLUTION)


def _cases() -> list[tuple[str, str | None]]:
    seen, out = set(), []
    for name in rm.names():
        for preset in _presets(rm.entry(name).config):
            fam, cfg = _reduced(name, preset)
            key = (fam.__name__, type(cfg).__name__, preset, getattr(cfg, "operator", None),
                   getattr(cfg, "version", None))
            if key not in seen:
                seen.add(key)
                out.append((name, preset))
    return out


CASES = _cases()


def test_every_family_is_covered():
    """Each family module and config type of the registry has at least one case (a family registered later
    joins by its names)."""
    fams = {(rm.entry(n).module.__name__, type(rm.entry(n).config).__name__) for n in rm.names()}
    covered = {(rm.entry(n).module.__name__, type(rm.entry(n).config).__name__) for n, _ in CASES}
    assert fams == covered
    assert {"refimpl.models.castling_levit", "refimpl.models.castling_mvitv2", "refimpl.models.flatten_cswin",
            "refimpl.models.flatten_pvt"} <= {m for m, _ in covered}


@pytest.mark.parametrize("name,preset", CASES)
def test_batched_equals_per_sample(name, preset):
    fam, cfg = _reduced(name, preset)
    params = fam.init_params(cfg, np.random.default_rng(SEED))
    x = np.random.default_rng(SEED + 1).standard_normal((3, cfg.in_chans, *_image_hw(fam, cfg)))
    taps: dict = {}
    logits, _ = fam.run(params, x, cfg, taps=taps)
    units = fam.unit_names(cfg)
    assert [k for k in taps if k in units] == units and np.array_equal(taps[units[-1]], logits)
    inp = x
    for unit in units:
        batched = fam.run_unit(params, unit, inp, cfg)
        np.testing.assert_array_equal(batched, taps[unit], err_msg=f"{name} {unit}: unit vs run's tap")
        single = np.concatenate([fam.run_unit(params, unit, inp[i:i + 1], cfg) for i in range(3)])
        bound = fam.unit_bound(params, unit, inp, cfg, dtype=F64)
        numerics.assert_close(single, batched, bound, F64, name=f"{name}/{preset} {unit} per sample vs batched")
        inp = taps[unit]


@pytest.mark.parametrize("name,preset", CASES)
def test_deterministic(name, preset):
    fam, cfg = _reduced(name, preset)
    params = fam.init_params(cfg, np.random.default_rng(SEED))
    again = fam.init_params(cfg, np.random.default_rng(SEED))
    assert params.keys() == again.keys() and all(np.array_equal(params[k], again[k]) for k in params)
    x = np.random.default_rng(SEED + 1).standard_normal((2, cfg.in_chans, *_image_hw(fam, cfg)))
    a, fa = fam.run(params, x, cfg)
    b, fb = fam.run(params, x, cfg)
    np.testing.assert_array_equal(a, b)
    assert len(fa) == len(fb) > 0
    for u, v in zip(fa, fb):
        np.testing.assert_array_equal(u, v)
