"""The network framework and the pieces the hierarchical networks share, on top of
:mod:`refimpl.models.common`: layout changes, bottom/right padding, image checks for any resolution, random
initialisation with BatchNorm statistics, and the running-error stages that common.py does not have
(BatchNorm, ReLU, Swish, depthwise conv, per-channel scale; the LayerNorm stage, capped or not, is
common.e_layer_norm) plus adapters to the attention modules' own error propagation; and the interpreter of the
networks declared as units: the family declares unit_names, run_unit, _e_unit, its unit inputs and feature
maps (and its units' parts), and :func:`run_stages`, :func:`bound_network`, :func:`bound_unit`, :func:`run_part`, :func:`bound_part` give it
its run, forward_bounds, unit_bound, run_unit_part and unit_part_bound: every network (RAVLT, L2ViT,
FLatten-PVT, FLatten-CSwin, LiSANet, Castling-LeViT, Castling-MViTv2, and the DeiT and Swin networks on
models._deit's and flatten.py's frames: Castling-DeiT, L2ViT-DeiT, RALA-DeiT / -Swin, FLatten-DeiT / -Swin).

Shapes: B batch, C channels, H x W grid, N = H W tokens (row-major).  Image tensors are channels-first
(B, C, H, W) as in PyTorch; token tensors are (B, N, C).

Error convention: :class:`refimpl.models.common.Err` - every intermediate carries E with
|fl_T(value) - value| <= u_T E to first order (common.py's module docstring).  The RALA module tracks
absolute errors (u included) instead; :func:`to_abs` / :func:`from_abs` convert.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np
from scipy.special import expit

from .. import bounds, config, layers, numerics, validation
from ..attention import focused_bounds as _focused_bounds
from ..errors import ArgumentError
from . import common
from .common import Err

__all__ = ["init_params_from_shapes", "tokens_to_grid", "grid_to_tokens", "pad_bottom_right", "check_images",
           "check_grid_input", "e_batch_norm", "e_relu", "e_swish", "e_dwconv", "e_scale",
           "e_tokens", "e_grid", "e_pad", "swish", "to_abs", "from_abs", "to_bound",
           "stage_end_units", "stage_feature_map",
           "check_unit", "check_part", "run_stages", "bound_stages", "bound_network", "bound_unit", "run_part",
           "bound_part"]


def init_params_from_shapes(shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator, *,
                            special: Mapping[str, Callable[[tuple[int, ...], np.random.Generator], np.ndarray]]
                            | None = None) -> dict[str, np.ndarray]:
    """:func:`refimpl.models.common.init_from_shapes` (matrices N(0, 1/fan_in), norm weights 1 + N(0, s^2),
    other vectors N(0, s^2)) with BatchNorm running variances U(low, high) (config.NET_INIT_RUNNING_VAR_*;
    a variance must be positive).  Tests, docs and benchmarks only - not the papers' training inits."""
    sp = {"running_var": lambda shp, r: r.uniform(config.NET_INIT_RUNNING_VAR_LOW, config.NET_INIT_RUNNING_VAR_HIGH,
                                                  shp)}
    sp.update(special or {})
    return common.init_from_shapes(shapes, rng, special=sp)


def tokens_to_grid(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(B, N, C) row-major tokens -> (B, C, H, W)."""
    b, n, c = x.shape
    if n != hw[0] * hw[1]:
        raise ValueError(f"argument 'x': {n} tokens do not fill a {hw[0]}x{hw[1]} grid")
    return x.reshape(b, hw[0], hw[1], c).transpose(0, 3, 1, 2)


def grid_to_tokens(x: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B, N, C), tokens row-major."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).transpose(0, 2, 1)


def pad_bottom_right(x: np.ndarray, multiple: int) -> np.ndarray:
    """Zero-pad (B, C, H, W) at the bottom and right so that H and W become multiples of ``multiple``
    (the released L2ViT PatchEmbed rule, F.pad(x, (0, pw, 0, ph)))."""
    ph, pw = (-x.shape[2]) % multiple, (-x.shape[3]) % multiple
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)))
    return x


def check_images(images: Any, in_chans: int) -> np.ndarray:
    """A (B, in_chans, H, W) float batch of any H, W >= 1, in the working precision."""
    images = numerics.as_float(images, "images")
    numerics.check_shapes(images=(images, "B C H W"), sizes={"C": in_chans})
    return images


def check_grid_input(name: str, x: Any, in_chans: int, first: str) -> np.ndarray:
    """The input of unit ``name`` of a network whose units carry channels-first grids (RAVLT, L2ViT): images
    (B, in_chans, H, W) of any H, W for its first unit ``first``, else a (B, C, H, W) grid."""
    if name == first:
        return check_images(x, in_chans)
    x = numerics.as_float(x, "x")
    numerics.check_shapes(x=(x, "B C H W"))
    return x


def swish(x: np.ndarray) -> np.ndarray:
    """x sigmoid(x) (Swish / SiLU; RAVLT's released head), sigmoid by scipy.special.expit."""
    return x * expit(x)


# ===================================================================================================
# Running error stages (common.Err convention)
# ===================================================================================================

def e_tokens(t: Err) -> Err:
    """(B, C, H, W) -> (B, N, C): exact data movement."""
    return Err(grid_to_tokens(t.value), grid_to_tokens(t.err), t.depth)


def e_grid(t: Err, hw: tuple[int, int]) -> Err:
    """(B, N, C) -> (B, C, H, W): exact data movement."""
    return Err(tokens_to_grid(t.value, hw), tokens_to_grid(t.err, hw), t.depth)


def e_pad(t: Err, multiple: int) -> Err:
    """Zero padding at the bottom/right: exact (padded entries carry no error)."""
    return Err(pad_bottom_right(t.value, multiple), pad_bottom_right(t.err, multiple), t.depth)


def e_batch_norm(t: Err, p: Mapping[str, Any], prefix: str, eps: float) -> Err:
    """Eval BatchNorm2d (B, C, H, W), an affine map per channel: E = |w| / sqrt(rv + eps) E_x plus its own
    6 roundings on the magnitudes of layers.batch_norm2d_bound (:func:`refimpl.bounds.e_batch_norm`, first-order
    model)."""
    w, b = p[prefix + ".weight"], p[prefix + ".bias"]
    rm, rv = p[prefix + ".running_mean"], p[prefix + ".running_var"]
    y = layers.batch_norm2d(t.value, w, b, rm, rv, eps)     # validates the five arrays and eps
    f = numerics.as_float
    e = bounds.e_batch_norm(t.value, t.err, f(w, "weight"), f(b, "bias"), f(rm, "running_mean"),
                            f(rv, "running_var"), eps, bounds.Precision.coefficients())
    return Err(y, e, t.depth + bounds.BATCH_NORM_ROUNDINGS)


def e_relu(t: Err) -> Err:
    """ReLU is exact and 1-Lipschitz: the error passes through (no new rounding)."""
    return Err(numerics.relu(t.value), t.err, t.depth)


def e_swish(t: Err) -> Err:
    """Swish x sigmoid(x): input errors through its Lipschitz constant config.SWISH_LIPSCHITZ
    (sup |d/dx x sigmoid(x)| = 1.0998...); own rounding: sigmoid = 1 / (1 + exp(-x)) carries
    ELEMENTARY_FUNCTION_ULPS (exp) + 2 (sum, quotient) relative roundings and the product one more, so
    k = ELEMENTARY_FUNCTION_ULPS + 3 on |x sigmoid(x)| (any of the usual evaluation orders)."""
    y = swish(t.value)
    k = config.ELEMENTARY_FUNCTION_ULPS + 3
    return Err(y, bounds.e_elementwise(y, t.err, config.SWISH_LIPSCHITZ, k, bounds.Precision.coefficients()),
               t.depth + k)


def e_dwconv(t: Err, weight: Any, bias: Any) -> Err:
    """'Same'-padded depthwise conv (B, C, H, W) (:func:`refimpl.attention.focused_bounds.err_dwconv`)."""
    w = numerics.as_float(weight, "weight")
    b = None if bias is None else numerics.as_float(bias, "bias")
    y, e, k = _focused_bounds.err_dwconv(t.value, t.err, w, b)
    return Err(y, e, t.depth + k)


def e_scale(t: Err, gamma: Any) -> Err:
    """A per-channel scale g x (layer scale): E = |g| E_x + |g x| (one rounding; :func:`refimpl.bounds.e_elementwise`
    with Lipschitz constant |g|, first-order model)."""
    g = numerics.as_float(gamma, "gamma")
    y = g * t.value
    return Err(y, bounds.e_elementwise(y, t.err, np.abs(g), 1, bounds.Precision.coefficients()), t.depth + 1)


def to_abs(e: np.ndarray, dtype: Any) -> np.ndarray:
    """E coefficient -> absolute error bound u_T E (for modules that track absolute errors, rala.py)."""
    return numerics.unit_roundoff(dtype) * e


def from_abs(e: np.ndarray, dtype: Any) -> np.ndarray:
    """Absolute error bound -> E coefficient (divide by u_T)."""
    return e / numerics.unit_roundoff(dtype)


def to_bound(t: Err, what: str) -> numerics.Bound:
    """:func:`refimpl.models.common.to_bound`, which treats NaN coefficients (inf - inf or 0 * inf inside a stage
    whose input bound was already infinite) as it treats +inf: no finite bound is known there."""
    return common.to_bound(t, what)


# ===================================================================================================
# The network interpreter: a family declares its units, one interpreter runs them
# ===================================================================================================
#
# A network is a sequence of named units (stem, blocks, downsamplings, head; the comparison points of the
# equivalence suite and the stages the verify tool reports).  A family module declares:
#
#   unit_names(cfg)                        the units in execution order
#   _check_params(params, cfg)             its common.check_network_params, returning the checked mapping
#   run_unit(params, name, x, cfg, **kw)   one unit (kw: what the family's ``run`` passes on, e.g. taps)
#   _e_unit(params, name, t, cfg, dtype)   the same unit with the running error analysis (common.Err)
#   _unit_input(name, x, cfg[, part])      the checked input of a unit (images for the first unit) or of a part
#   _feature_map(name, y, cfg)             the stage feature map after unit ``name`` (B, C_s, H_s, W_s), else
#                                          None; a token-stage network may instead give stage_grids(cfg) and
#                                          its config's depths, stage s closing with "stages.s.blocks.{d_s - 1}"
#
# and, where a unit is made of parts (a block's attention and MLP residual steps), unit_parts(cfg, name),
# _part(params, name, part, x, cfg) and _e_part(params, name, part, t, cfg, dtype).  The interpreter gives
# the family its run (:func:`run_stages`), forward_bounds (:func:`bound_network`), unit_bound
# (:func:`bound_unit`), run_unit_part (:func:`run_part`) and unit_part_bound (:func:`bound_part`).  A bound's
# description names the unit; with a family ``label`` it starts with it ("RAVLT unit stem").

def stage_end_units(depths: Any) -> dict[str, int]:
    """{unit name: stage} of the units that close a stage of a token-stage network: "stages.s.blocks.{d_s - 1}"."""
    return {f"stages.{s}.blocks.{d - 1}": s for s, d in enumerate(depths)}


def stage_feature_map(family: ModuleType, name: str, y: np.ndarray, cfg: Any) -> np.ndarray | None:
    """The feature map after unit ``name``: the family's ``_feature_map``, or for a token-stage network a
    stage-closing unit's tokens on the stage's grid, channels-first (B, C_s, H_s, W_s); None for any other unit."""
    if hasattr(family, "_feature_map"):
        return family._feature_map(name, y, cfg)
    s = stage_end_units(cfg.depths).get(name)
    return None if s is None else tokens_to_grid(y, family.stage_grids(cfg)[s])


def check_unit(family: ModuleType, name: Any, cfg: Any) -> None:
    """``name`` is one of the family's units."""
    if name not in family.unit_names(cfg):
        raise ArgumentError(f"argument 'name': unknown unit {name!r}; units: {family.unit_names(cfg)}")


def check_part(family: ModuleType, name: Any, part: Any, cfg: Any) -> None:
    """``part`` is one of unit ``name``'s parts."""
    parts = family.unit_parts(cfg, name)
    if part not in parts:
        raise ArgumentError(f"argument 'part': unit {name!r} has parts {parts}, got {part!r}")


def _what(label: str | None, name: str) -> str:
    return f"unit {name}" if label is None else f"{label} unit {name}"


def run_stages(family: ModuleType, params: Mapping[str, Any], images: Any, cfg: Any, taps: dict | None, *,
               unit_taps: bool = False, **unit_kw: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """The family's ``run`` (the one forward loop of the networks): its units in order from the images,
    ``x = run_unit(params, name, x, cfg)``; the logits and every stage's feature map (:func:`stage_feature_map`)
    in one pass.  ``taps`` (dict or None) records every unit's output under its name and, with ``unit_taps``,
    the units' own taps (``run_unit(..., taps=inner)``) under "<unit>.<tap>".  ``unit_kw`` goes to every
    run_unit."""
    validation.check_taps(taps)
    names = family.unit_names(cfg)
    params = family._check_params(params, cfg)      # once: the units get the checked mapping
    x, feats = images, []
    for name in names:
        inner: dict | None = {} if (unit_taps and taps is not None) else None
        kw = {"taps": inner} if unit_taps else {}
        x = family.run_unit(params, name, x, cfg, **kw, **unit_kw)
        f = stage_feature_map(family, name, x, cfg)
        if f is not None:
            feats.append(f)
        if taps is not None:
            taps[name] = x
            if inner:
                taps.update({f"{name}.{k}": v for k, v in inner.items()})
    return x, feats


def bound_stages(family: ModuleType, e_unit: Callable[[str, Err], Err], images: Any, cfg: Any, *,
                 label: str | None = None) -> tuple[list[numerics.Bound], numerics.Bound]:
    """The one bound loop of the networks: ``t = e_unit(name, t)`` along the family's units from exact images;
    the bounds of the stages' feature maps (:func:`stage_feature_map`, applied to the value and to its error
    coefficient alike) and of the logits.  They are described as "features after <unit>" and "logits", or with
    a family ``label`` as "<label> stage <s> features" and "<label> logits"."""
    with np.errstate(all="ignore"):
        t, fb = common.e_exact(images), []
        for name in family.unit_names(cfg):
            t = e_unit(name, t)
            fm = stage_feature_map(family, name, t.value, cfg)
            if fm is not None:
                what = f"features after {name}" if label is None else f"{label} stage {len(fb) + 1} features"
                fb.append(common.to_bound(Err(fm, stage_feature_map(family, name, t.err, cfg), t.depth), what))
        return fb, common.to_bound(t, "logits" if label is None else f"{label} logits")


def bound_network(family: ModuleType, params: Mapping[str, Any], images: Any, cfg: Any, dtype: Any, *,
                  label: str | None = None) -> tuple[list[numerics.Bound], numerics.Bound]:
    """The family's ``forward_bounds``: its parameters checked once, then :func:`bound_stages` with its
    ``_e_unit`` in precision ``dtype``."""
    params = family._check_params(params, cfg)
    return bound_stages(family, lambda name, t: family._e_unit(params, name, t, cfg, dtype), images, cfg,
                        label=label)


def bound_unit(family: ModuleType, params: Mapping[str, Any], name: str, x: Any, cfg: Any, dtype: Any, *,
               label: str | None = None) -> numerics.Bound:
    """The family's ``unit_bound``: the error bound of run_unit computed in precision ``dtype`` from exact
    (T-rounded) ``x`` and parameters (the analysis of forward_bounds, restarted at the unit)."""
    check_unit(family, name, cfg)
    x = family._unit_input(name, x, cfg)
    params = family._check_params(params, cfg)
    with np.errstate(all="ignore"):
        return common.to_bound(family._e_unit(params, name, common.e_exact(x), cfg, dtype), _what(label, name))


def run_part(family: ModuleType, params: Mapping[str, Any], name: str, part: str, x: Any, cfg: Any) -> np.ndarray:
    """The family's ``run_unit_part``: one part of a unit (its unit_parts); the unit is its parts in order."""
    check_part(family, name, part, cfg)
    x = family._unit_input(name, x, cfg, part)
    params = family._check_params(params, cfg)
    return family._part(params, name, part, x, cfg)


def bound_part(family: ModuleType, params: Mapping[str, Any], name: str, part: str, x: Any, cfg: Any, dtype: Any,
               *, label: str | None = None) -> numerics.Bound:
    """The family's ``unit_part_bound``: the error bound of :func:`run_part` in precision ``dtype`` from exact
    (T-rounded) ``x`` and parameters."""
    check_part(family, name, part, cfg)
    x = family._unit_input(name, x, cfg, part)
    params = family._check_params(params, cfg)
    with np.errstate(all="ignore"):
        return common.to_bound(family._e_part(params, name, part, common.e_exact(x), cfg, dtype),
                               f"{_what(label, name)}, {part}")
