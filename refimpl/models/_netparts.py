"""Pieces shared by the L2ViT, RAVLT and LiSANet network references (models/l2vit.py, ravlt.py,
lisanet.py) on top of :mod:`refimpl.models.common`: layout changes, bottom/right padding, image checks for
any resolution, random initialisation with BatchNorm statistics, and the running-error stages that
common.py does not have (BatchNorm, ReLU, Swish, depthwise conv, per-channel scale, channels-first
LayerNorm) plus adapters to the attention modules' own error propagation; and the unit framework: the unit
loops of these families (:func:`run_units`, :func:`bound_units`) and the interpreter of the token-stage networks
Castling-LeViT and Castling-MViTv2 (:func:`run_stages`, :func:`bound_stages`, :func:`stage_feature_map`: the
family declares unit_names, run_unit and stage_grids; one loop runs them).

Shapes: B batch, C channels, H x W grid, N = H W tokens (row-major).  Image tensors are channels-first
(B, C, H, W) as in PyTorch; token tensors are (B, N, C).

Error convention: :class:`refimpl.models.common.Err` - every intermediate carries E with
|fl_T(value) - value| <= u_T E to first order (common.py's module docstring).  The RALA module tracks
absolute errors (u included) instead; :func:`to_abs` / :func:`from_abs` convert.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np
from scipy.special import expit

from .. import config, layers, numerics, validation
from ..attention import focused_bounds as _focused_bounds
from . import common
from .common import Err

__all__ = ["init_params_from_shapes", "tokens_to_grid", "grid_to_tokens", "pad_bottom_right", "check_images",
           "e_batch_norm", "e_relu", "e_swish", "e_dwconv", "e_scale", "e_layer_norm", "e_layer_norm_cf", "e_tokens",
           "e_grid", "e_pad", "swish", "to_abs", "from_abs", "to_bound", "run_units", "bound_units", "stage_end_units",
           "stage_feature_map", "run_stages", "bound_stages"]


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
    6 roundings on the magnitudes of layers.batch_norm2d_bound."""
    w, b = p[prefix + ".weight"], p[prefix + ".bias"]
    rm, rv = p[prefix + ".running_mean"], p[prefix + ".running_var"]
    y = layers.batch_norm2d(t.value, w, b, rm, rv, eps)
    own = layers.batch_norm2d_bound(t.value, w, b, rm, rv, eps)
    col = (slice(None), None, None)
    gain = (np.abs(numerics.as_float(w, "weight")) / np.sqrt(numerics.as_float(rv, "running_var") + eps))[col]
    return Err(y, gain * t.err + own.k * np.asarray(own.scale), t.depth + int(own.k))


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
    return Err(y, config.SWISH_LIPSCHITZ * t.err + k * np.abs(y), t.depth + k)


def e_dwconv(t: Err, weight: Any, bias: Any) -> Err:
    """'Same'-padded depthwise conv (B, C, H, W) (:func:`refimpl.attention.focused_bounds.err_dwconv`)."""
    w = numerics.as_float(weight, "weight")
    b = None if bias is None else numerics.as_float(bias, "bias")
    y, e, k = _focused_bounds.err_dwconv(t.value, t.err, w, b)
    return Err(y, e, t.depth + k)


def e_scale(t: Err, gamma: Any) -> Err:
    """A per-channel scale g x (layer scale): E = |g| E_x + |g x| (one rounding)."""
    g = numerics.as_float(gamma, "gamma")
    y = g * t.value
    return Err(y, np.abs(g) * t.err + np.abs(y), t.depth + 1)


def e_layer_norm(t: Err, weight: Any, bias: Any, eps: float, dtype: Any) -> Err:
    """LayerNorm over the last axis (:func:`refimpl.models.common.e_layer_norm`) with its output cap.

    A LayerNorm output is bounded whatever its input: xh = (x - mean) / sqrt(var + eps) has
    sum_i xh_i^2 <= C, so |xh_i| <= sqrt(C), and the computed xh' obeys the same up to its own rounding
    (gamma_(C+8), layers.layer_norm_bound's depth).  Hence |y' - y| <= |w| (|xh| + sqrt(C)(1 + gamma_(C+8)))
    + 2 u (|w| sqrt(C) + |b|) for ANY input error, rigorous (no first-order assumption).  The propagated
    coefficient is replaced by this cap (divided by u_T) where it is smaller: it keeps a network's running
    bound finite once the propagated input error exceeds the LayerNorm's output range (where the
    first-order propagation through 1 / std is void anyway)."""
    r = common.e_layer_norm(t, weight, bias, eps)
    x = t.value
    c = x.shape[-1]
    u = numerics.unit_roundoff(dtype)
    mu = np.mean(x, axis=-1, keepdims=True)
    xh = np.abs(x - mu) / np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    w = np.abs(numerics.as_float(weight, "weight"))
    b = np.abs(numerics.as_float(bias, "bias"))
    root = math.sqrt(c)
    cap = (w * (xh + root * (1.0 + numerics.gamma(c + 8, u))) + 2 * u * (w * root + b)) / u
    with np.errstate(invalid="ignore"):
        err = np.where(np.isnan(r.err), cap, np.minimum(r.err, cap))
    return Err(r.value, err, r.depth)


def e_layer_norm_cf(t: Err, weight: Any, bias: Any, eps: float, dtype: Any) -> Err:
    """LayerNorm over the channel axis of (B, C, H, W): :func:`e_layer_norm` on the channels-last view."""
    m = Err(np.moveaxis(t.value, 1, -1), np.moveaxis(t.err, 1, -1), t.depth)
    r = e_layer_norm(m, weight, bias, eps, dtype)
    return Err(np.moveaxis(r.value, -1, 1), np.moveaxis(r.err, -1, 1), r.depth)


def to_abs(e: np.ndarray, dtype: Any) -> np.ndarray:
    """E coefficient -> absolute error bound u_T E (for modules that track absolute errors, rala.py)."""
    return numerics.unit_roundoff(dtype) * e


def from_abs(e: np.ndarray, dtype: Any) -> np.ndarray:
    """Absolute error bound -> E coefficient (divide by u_T)."""
    return e / numerics.unit_roundoff(dtype)


def to_bound(t: Err, what: str) -> numerics.Bound:
    """:func:`refimpl.models.common.to_bound` with NaN coefficients (inf - inf or 0 * inf inside a stage whose
    input bound was already infinite) replaced by +inf: no bound is known there, which is what inf says."""
    err = np.where(np.isnan(t.err), np.inf, t.err)
    return common.to_bound(Err(t.value, err, t.depth), what)


# ===================================================================================================
# The unit protocol: a network is a sequence of named units (stem, blocks, downsamplings, head)
# ===================================================================================================

def run_units(names: list[str], run_one: Callable[..., np.ndarray], feature_units: Mapping[str, int],
              x: np.ndarray, taps: dict | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Run the units in order: ``run_one(name, x, taps=inner)`` for each name.  Returns the last output and
    the outputs of the ``feature_units`` (the per-stage feature maps).  With ``taps``, every unit's output
    is recorded under its name and the unit's own taps under "<unit>.<tap>"."""
    feats = []
    for name in names:
        inner: dict | None = {} if taps is not None else None
        x = run_one(name, x, taps=inner)
        if name in feature_units:
            feats.append(x)
        if taps is not None:
            taps[name] = x
            taps.update({f"{name}.{k}": v for k, v in inner.items()})
    return x, feats


def bound_units(names: list[str], e_one: Callable[[str, Err], Err], feature_units: Mapping[str, int],
                t: Err, family: str) -> tuple[list[numerics.Bound], numerics.Bound]:
    """The running error analysis along the same units: ``e_one(name, t)`` carries the error through one
    unit.  Returns the bounds of the feature maps and of the logits."""
    fb = []
    for name in names:
        t = e_one(name, t)
        if name in feature_units:
            fb.append(to_bound(t, f"{family} stage {feature_units[name] + 1} features"))
    return fb, to_bound(t, f"{family} logits")


# ===================================================================================================
# Token-stage networks (Castling-LeViT, Castling-MViTv2): the family declares its units, one interpreter runs
# them.  A family module provides unit_names(cfg), run_unit(params, name, x, cfg), stage_grids(cfg) and
# _check_params(params, cfg) (its common.check_network_params, returning the checked mapping), its config ``depths``; its units carry tokens (B, N, C) and stage s ends with unit "stages.s.blocks.{depth_s - 1}".
# ===================================================================================================

def stage_end_units(depths: Any) -> dict[str, int]:
    """{unit name: stage} of the units that close a stage: "stages.s.blocks.{depths[s] - 1}"."""
    return {f"stages.{s}.blocks.{d - 1}": s for s, d in enumerate(depths)}


def stage_feature_map(family: ModuleType, name: str, y: np.ndarray, cfg: Any) -> np.ndarray | None:
    """The feature map after unit ``name``: a stage-closing unit's tokens on the stage's grid, channels-first
    (B, C_s, H_s, W_s); None for any other unit."""
    s = stage_end_units(cfg.depths).get(name)
    return None if s is None else tokens_to_grid(y, family.stage_grids(cfg)[s])


def run_stages(family: ModuleType, params: Mapping[str, Any], images: Any, cfg: Any,
               taps: dict | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """The family's ``run``: its units in order from the images (:func:`refimpl.models.common.run_feature_units`);
    the logits and every stage's feature map in one pass; ``taps`` (dict or None) records every unit's output."""
    validation.check_taps(taps)
    names = family.unit_names(cfg)
    params = family._check_params(params, cfg)      # once: the units get the checked mapping
    return common.run_feature_units(names, lambda name, x: family.run_unit(params, name, x, cfg),
                                    lambda name, x: stage_feature_map(family, name, x, cfg), images, taps)


def bound_stages(family: ModuleType, e_unit: Callable[[str, Err], Err], images: Any, cfg: Any
                 ) -> tuple[list[numerics.Bound], numerics.Bound]:
    """The family's ``forward_bounds`` after its checks: ``e_unit(name, t)`` along its units from exact images
    (:func:`refimpl.models.common.chain_bounds`), the bounds of the stages' feature maps and of the logits."""
    with np.errstate(all="ignore"):
        return common.chain_bounds(family.unit_names(cfg), e_unit,
                                   lambda name, a: stage_feature_map(family, name, a, cfg), images)
