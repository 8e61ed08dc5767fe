"""Released checkpoints as they are: ``convert_state_dict(name, state_dict, source="official")``.

Layer: networks (NumPy only; torch tensors are accepted as values but torch is never imported here).

``convert_state_dict`` returns the reference's params (keys and shapes of the family's ``param_shapes``,
float64 NumPy arrays) for the state_dict of a released model, strictly:

- every key of the released state_dict is consumed: a parameter (renamed where the released naming differs
  from ours, see :data:`RELEASED`), or a buffer the reference derives from the configuration;
- a key it does not know is an error that lists it (with the closest released key it expected: "did you
  mean"); a parameter or derived buffer that is missing is an error that lists it; a parameter of the wrong
  shape or a non-floating parameter is an error naming the released key (and ours where it differs);
- derived buffers are recomputed from the configuration with the reference's own functions
  (:func:`refimpl.layers.relative_position_index`, :func:`refimpl.layers.shifted_window_mask`,
  :func:`refimpl.attention.rala.rope_2d_angles`) and compared, and a mismatch is a
  :class:`~refimpl.errors.ParameterValueError` naming the buffer.  Integer tables are compared exactly.  A
  floating table is compared in its own dtype T: our float64 value is rounded to T, and the released value may
  differ from it by at most ``gamma_k(u_T) |ours|`` where k is derived from the released formula per buffer
  (:data:`DERIVED_ULPS`: 0 for the Swin shift mask, whose entries 0 and -100 are exact in every format;
  for the RoPE angle table, see :data:`RELEASED_ROPE_ANGLE_ULPS`).  BatchNorm's ``num_batches_tracked`` is
  a training counter that no configuration determines: it is consumed and checked to be a non-negative
  integral scalar (eval-mode BatchNorm does not read it).

``source="twin"``: the state_dict of the PyTorch twin (refimpl/twins/models), whose keys are the reference's:
the identity (values converted to float64 NumPy) with the same strictness (:func:`refimpl.validation.
check_params`; a derived-buffer key is refused, the twins keep them non-persistent; ``num_batches_tracked``
is accepted, checked and dropped).

Released code per family (the facts used here; docs/models_flatten_castling.md and
docs/models_l2vit_ravlt_lisanet.md, "Released checkpoints", list the layouts):

========================  ===============================================  ===================================
family (registry names)   released file                                    renames; derived buffers
========================  ===============================================  ===================================
FLatten-Swin              LeapLabTHU/FLatten-Transformer                   none;
(flatten_swin_t/s/b)      models/flatten_swin.py                           ``layers.i.blocks.j.attn.
                                                                           relative_position_index`` (int64,
                                                                           softmax blocks),
                                                                           ``layers.i.blocks.j.attn_mask``
                                                                           (float32, every block that shifts)
FLatten-PVT v1            models/flatten_pvt.py                            none; none
(flatten_pvt_t/s/m/l)
FLatten-PVTv2             models/flatten_pvt_v2.py                         none; none
(flatten_pvt_v2_b0..b4)
FLatten-CSwin             models/flatten_cswin.py                          none; none
(flatten_cswin_t/s/b)
L2ViT (l2vit_tiny/        ChuanyangZheng/L2ViT                             none; BatchNorm
small/base)               classification/models/l2vit.py                   ``num_batches_tracked``
RAVLT (ravlt_t/s/b/l)     qhfan/RALA classfication/RALA.py                 ``layers.i.blocks.j.norm{1,2}.norm.
                                                                           {weight,bias}`` -> ``...norm{1,2}.
                                                                           {weight,bias}``; ``layers.i.RoPE.
                                                                           angle`` (float32), BatchNorm
                                                                           ``num_batches_tracked``
Castling-DeiT             GATECH-EIC/Castling-ViT castling-vit.py (the     none; none
(castling_deit_t/b)       attention ``LinAngularAttention``: ``qkv``,
                          ``proj``, ``dconv``) inside DeiT's network
                          (facebookresearch/deit models.py: timm's
                          ``VisionTransformer``)
========================  ===============================================  ===================================

Castling-DeiT: the authors released the attention module alone (the repository's README calls it a miniature
release of the attention block) and no network file or checkpoint; the paper uses it as a drop-in replacement in
DeiT.  The layout is therefore DeiT's released state_dict with each block's ``attn`` holding the released
module's parameters, each name taken from one of the two released files (:func:`castling_deit_released_shapes`);
a config whose attention parameters the released module cannot hold is refused.

No released code: FLatten-DeiT (LeapLabTHU/FLatten-Transformer has Swin, PVT, PVTv2 and CSwin models and no
DeiT file), LiSANet (the paper's code was not published), Castling-LeViT and Castling-MViTv2 (only the
attention was released) (source="official" raises :class:`~refimpl.errors.ArgumentError`).

The released model is the reference's ``preset="official"``: with a registry name, ``convert_state_dict``
builds the config with ``preset="official"`` (and any ``overrides``); a config object must have that preset.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any, Callable, Mapping

import numpy as np

from .. import config, layers, validation
from ..attention import rala
from ..errors import ArgumentError, ArgumentTypeError, ParameterKeyError, ParameterShapeError, ParameterTypeError, \
    ParameterValueError
from ..verdict import gamma, round_to, unit_roundoff

__all__ = ["convert_state_dict", "released_layout", "official_config", "RELEASED", "SOURCES", "DERIVED_ULPS",
           "RELEASED_ROPE_ANGLE_ULPS", "DerivedBuffer", "castling_deit_released_shapes"]

SOURCES = ("official", "twin")

#: The released RAVLT's RoPE angle buffer is ``1 / base ** linspace(0, 1, n)`` computed in its dtype T
#: (float32).  The linspace entry t carries an absolute error of at most 2 u_T (the step rounded, then one
#: product and one sum), which base ** (-t) turns into a relative error ln(base) |dt| <= 2 ln(base) u_T; the
#: power costs config.ELEMENTARY_FUNCTION_ULPS, the reciprocal one rounding, and our float64 value rounded to T
#: one more.  So the released value lies within gamma_k(u_T) |ours| of ours rounded to T, with this k
#: (base 10000: 19 + 4 + 2 = 25).  Not rigorous beyond the libm accuracy assumption of
#: ELEMENTARY_FUNCTION_ULPS.  (Measured: torch's float32 table differs from ours rounded by up to 6 ulps
#: = 12 u for head dims 4..256.)
RELEASED_ROPE_ANGLE_ULPS = math.ceil(2 * math.log(config.RALA_ROPE_BASE)) + config.ELEMENTARY_FUNCTION_ULPS + 2

#: Allowed deviation, in units of the buffer dtype's u, of each floating derived buffer (see the module
#: docstring); integer buffers are compared exactly.
DERIVED_ULPS = {"attn_mask": 0, "angle": RELEASED_ROPE_ANGLE_ULPS}

#: The masked value of the released Swin shift mask (``attn_mask``): -100 where two tokens of a shifted window
#: come from different regions, 0 elsewhere.
SWIN_MASK_VALUE = -100.0


@dataclasses.dataclass(frozen=True)
class DerivedBuffer:
    """A buffer of the released state_dict that the reference derives from the configuration."""

    value: np.ndarray | None   # the recomputed value (float64 or int64); None for a counter
    what: str                  # what it is, for messages
    kind: str                  # "index" (exact integers), "table" (floating, DERIVED_ULPS), "counter"
    ulps: int = 0


@dataclasses.dataclass(frozen=True)
class ReleasedLayout:
    """The released state_dict of one config: released key -> our key, and the derived buffers."""

    family: str
    file: str
    renames: dict[str, str]                 # released key -> our key (every parameter, renamed or not)
    derived: dict[str, DerivedBuffer]       # released key -> derived buffer


# ===================================================================================================
# Per-family layouts
# ===================================================================================================

def _bn_counters(shapes: Mapping[str, tuple[int, ...]], renames: Mapping[str, str]) -> dict[str, DerivedBuffer]:
    out = {}
    for k in shapes:
        if k.endswith(".running_var"):
            out[k[: -len(".running_var")] + validation.OPTIONAL_BUFFER_SUFFIX] = DerivedBuffer(
                None, "BatchNorm's batch counter", "counter")
    return out


def _identity(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    return {k: k for k in shapes}


def _swin_layout(cfg: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, str], dict[str, DerivedBuffer]]:
    derived: dict[str, DerivedBuffer] = {}
    for i, (grid, (ws, shift), kind) in enumerate(zip(cfg.stage_grids, cfg.stage_windows, cfg.attn_types)):
        hp, wp = -(-grid[0] // ws) * ws, -(-grid[1] // ws) * ws   # the grid padded to the window multiple
        for j in range(cfg.depths[i]):
            pre = f"layers.{i}.blocks.{j}"
            if kind == "S":
                derived[f"{pre}.attn.relative_position_index"] = DerivedBuffer(
                    layers.relative_position_index(ws, ws).astype(np.int64),
                    f"relative-position index of the {ws}x{ws} window", "index")
            if j % 2 and shift > 0:
                allowed = layers.shifted_window_mask(hp, wp, ws, shift)
                derived[f"{pre}.attn_mask"] = DerivedBuffer(
                    np.where(allowed, 0.0, SWIN_MASK_VALUE), f"shift mask of the {hp}x{wp} grid, window {ws}, "
                    f"shift {shift}", "table", DERIVED_ULPS["attn_mask"])
    return _identity(shapes), derived


def _ravlt_layout(cfg: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, str], dict[str, DerivedBuffer]]:
    from . import ravlt
    pat = re.compile(r"^(layers\.\d+\.blocks\.\d+\.norm[12])\.(weight|bias)$")
    renames = {pat.sub(r"\1.norm.\2", k): k for k in shapes}
    derived = _bn_counters(shapes, renames)
    for i in range(len(cfg.dims)):
        hd = cfg.dims[i] // cfg.num_heads[i]
        base = ravlt.block_config(cfg, i).attn.rope_base
        # token 1 of a 1 x 2 grid: row 0, column 1, so its column half is the angle table itself
        angle = rala.rope_2d_angles(1, 2, hd, base)[1, hd // 2:]
        derived[f"layers.{i}.RoPE.angle"] = DerivedBuffer(
            angle, f"RoPE angle table (head dim {hd}, base {base:g})", "table",
            math.ceil(2 * math.log(base)) + config.ELEMENTARY_FUNCTION_ULPS + 2)
    return renames, derived


def _l2vit_layout(cfg: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, str], dict[str, DerivedBuffer]]:
    renames = _identity(shapes)
    return renames, _bn_counters(shapes, renames)


def _pvt_layout(cfg: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, str], dict[str, DerivedBuffer]]:
    return _identity(shapes), {}


def castling_deit_released_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    """The state_dict keys and shapes of a Castling-DeiT as the released code builds it, stated from the released
    files (not from :func:`refimpl.models.castling.param_shapes`):

    * the network frame is DeiT's (facebookresearch/deit ``models.py`` builds timm's ``VisionTransformer``;
      timm ``models/vision_transformer.py``): ``patch_embed.proj`` (a patch x patch conv with bias),
      ``cls_token`` (1, 1, C), ``pos_embed`` (1, T, C), ``blocks.i.{norm1, attn, norm2, mlp.fc1, mlp.fc2}``,
      ``norm``, ``head``;
    * the attention is the released ``LinAngularAttention`` (GATECH-EIC/Castling-ViT ``castling-vit.py``):
      ``qkv`` Linear(C, 3C) (bias as the network passes it: DeiT passes ``qkv_bias=True``), ``proj``
      Linear(C, C) with bias, ``dconv`` Conv2d(h, h, (k, 1), groups=h, bias=False): weight (h, 1, k, 1).
      Its other submodules (dropouts, the ``MatMul`` wrappers) hold no parameters and no buffers.
    """
    c, h, p, hid = cfg.embed_dim, cfg.num_heads, cfg.patch_size, cfg.hidden
    k = cfg.attention_config().conv_kernel
    s: dict[str, tuple[int, ...]] = {"patch_embed.proj.weight": (c, cfg.in_chans, p, p), "patch_embed.proj.bias": (c,),
                                     "cls_token": (1, 1, c), "pos_embed": (1, cfg.tokens, c)}
    for i in range(cfg.depth):
        b = f"blocks.{i}"
        s.update({f"{b}.norm1.weight": (c,), f"{b}.norm1.bias": (c,), f"{b}.attn.qkv.weight": (3 * c, c)})
        if cfg.attention_config().qkv_bias:
            s[f"{b}.attn.qkv.bias"] = (3 * c,)
        s.update({f"{b}.attn.proj.weight": (c, c), f"{b}.attn.proj.bias": (c,), f"{b}.attn.dconv.weight": (h, 1, k, 1),
                  f"{b}.norm2.weight": (c,), f"{b}.norm2.bias": (c,), f"{b}.mlp.fc1.weight": (hid, c),
                  f"{b}.mlp.fc1.bias": (hid,), f"{b}.mlp.fc2.weight": (c, hid), f"{b}.mlp.fc2.bias": (c,)})
    s.update({"norm.weight": (c,), "norm.bias": (c,), "head.weight": (cfg.num_classes, c),
              "head.bias": (cfg.num_classes,)})
    return s


def _castling_deit_layout(cfg: Any, shapes: Mapping[str, tuple[int, ...]]
                          ) -> tuple[dict[str, str], dict[str, DerivedBuffer]]:
    """Our names are the released ones; a config whose parameters the released code cannot hold (the conv
    branch off or 2-D, a conv bias: the released ``dconv`` is a bias-free (k, 1) conv) is refused."""
    att = cfg.attention_config()
    if att.conv != "tokens1d" or att.conv_bias:
        raise ArgumentError(f"convert_state_dict: argument 'name': the released Castling attention has a bias-free "
                            f"(k, 1) token conv 'dconv' (conv='tokens1d', conv_bias=False); this config has "
                            f"conv={att.conv!r}, conv_bias={att.conv_bias!r} (attn_overrides "
                            f"{dict(cfg.attn_overrides)!r}), which no released state_dict holds")
    released = castling_deit_released_shapes(cfg)
    if dict(released) != {k: tuple(v) for k, v in shapes.items()}:   # our param_shapes drifted from the release
        diff = sorted(set(released) ^ set(shapes)) or sorted(k for k in released if released[k] != tuple(shapes[k]))
        raise AssertionError(f"Castling-DeiT: the reference's parameters differ from the released layout at "
                             f"{_listed(diff)}")
    return _identity(shapes), {}


#: family -> (config class name, released file, layout function)
RELEASED: dict[str, tuple[tuple[str, str, Callable[..., Any]], ...]] = {
    "flatten": (("FlattenSwinConfig", "LeapLabTHU/FLatten-Transformer models/flatten_swin.py", _swin_layout),),
    "flatten_pvt": (("FlattenPVTConfig", "LeapLabTHU/FLatten-Transformer models/flatten_pvt.py (version 1), "
                     "models/flatten_pvt_v2.py (version 2)", _pvt_layout),),
    "flatten_cswin": (("FlattenCSwinConfig", "LeapLabTHU/FLatten-Transformer models/flatten_cswin.py",
                       _pvt_layout),),
    "l2vit": (("L2ViTNetConfig", "ChuanyangZheng/L2ViT classification/models/l2vit.py", _l2vit_layout),),
    "ravlt": (("RAVLTNetConfig", "qhfan/RALA classfication/RALA.py", _ravlt_layout),),
    "castling": (("CastlingDeiTConfig", "GATECH-EIC/Castling-ViT castling-vit.py (the attention) in "
                  "facebookresearch/deit models.py (timm VisionTransformer, the network)", _castling_deit_layout),),
}

_NO_RELEASE = {
    "FlattenDeiTConfig": "FLatten-DeiT: the released FLatten repository has no DeiT model",
    "lisanet": "LiSANet: no code was released",
    "CastlingLeViTConfig": "Castling-LeViT: the released Castling-ViT code is the attention alone, in the "
                           "DeiT-style token layout; its LeViT networks were not released",
    "CastlingMViTv2Config": "Castling-MViTv2: the released Castling-ViT code is the attention alone; its "
                            "MultiScaleAttention form and the MViTv2 networks were not released",
}


def _refuse_unreleased(fam: Any, cfg: Any, label: str) -> None:
    famname = fam.__name__.rsplit(".", 1)[-1]
    cname = type(cfg).__name__
    reason = _NO_RELEASE.get(cname) or _NO_RELEASE.get(famname)
    if reason is not None or famname not in RELEASED or cname not in [r[0] for r in RELEASED[famname]]:
        raise ArgumentError(f"convert_state_dict: argument 'source': model {label!r} has no released code to "
                            f"convert from ({reason or famname + ' ' + cname}); use source='twin' for the PyTorch "
                            f"twin's state_dict")


def _resolve(name: Any, source: str, overrides: Mapping[str, Any]) -> tuple[Any, Any, str]:
    from .registry import create, entry, _load_all, _REGISTRY
    if isinstance(name, str):
        e = entry(name)
        fam = e.module
        ov = dict(overrides)
        if source == "official":
            _refuse_unreleased(fam, e.config, name)
        if source == "official" and any(f.name == "preset" for f in dataclasses.fields(e.config)):
            ov.setdefault("preset", "official")
        cfg, _ = create(name, **ov)
        return cfg, fam, name
    if overrides:
        raise ArgumentError(f"convert_state_dict: overrides {sorted(overrides)} need a registry name, not a config "
                            f"object (use dataclasses.replace on the config)")
    _load_all()
    for e in _REGISTRY.values():
        if type(e.config) is type(name):
            return name, e.module, type(name).__name__
    raise ArgumentTypeError(f"convert_state_dict: argument 'name': expected a registry name or a registered "
                            f"config object, got {validation.describe(name)}")


def official_config(name: str, **overrides: Any) -> Any:
    """The config of a registered model as released (``preset="official"``), with ``overrides``."""
    cfg, _, _ = _resolve(name, "official", overrides)
    return cfg


def released_layout(name_or_cfg: Any, **overrides: Any) -> ReleasedLayout:
    """The released state_dict layout of a model: released key -> our key, and the derived buffers.
    Raises ArgumentError for a family without released code."""
    cfg, fam, label = _resolve(name_or_cfg, "official", overrides)
    _refuse_unreleased(fam, cfg, label)
    famname, cname = fam.__name__.rsplit(".", 1)[-1], type(cfg).__name__
    file, fn = next((f, g) for c, f, g in RELEASED[famname] if c == cname)
    if getattr(cfg, "preset", "official") != "official":
        raise ArgumentError(f"convert_state_dict: argument 'name': the released {label!r} is the reference's "
                            f"preset 'official', got a config with preset {cfg.preset!r}")
    shapes = fam.param_shapes(cfg)
    renames, derived = fn(cfg, shapes)
    return ReleasedLayout(famname, file, renames, derived)


# ===================================================================================================
# Values
# ===================================================================================================

def _to_numpy(value: Any) -> tuple[np.ndarray, str]:
    """(array, dtype name) of a NumPy array, a torch tensor (torch is not imported: duck-typed) or a scalar.
    A bfloat16 tensor is widened to float32 exactly; its dtype name stays 'bfloat16'."""
    mod = type(value).__module__ or ""
    if mod.startswith("torch") and hasattr(value, "detach"):
        t = value.detach().cpu()
        name = str(t.dtype).replace("torch.", "")
        if name == "bfloat16":
            t = t.float()
        return np.asarray(t.numpy()), name
    arr = np.asarray(value)
    return arr, arr.dtype.name


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_derived(key: str, value: Any, buf: DerivedBuffer, where: str) -> None:
    arr, dname = _to_numpy(value)
    if buf.kind == "counter":
        if arr.shape != () or arr.dtype.kind not in "iu" or int(arr) < 0:
            raise ParameterValueError(f"{where}: derived buffer '{key}' ({buf.what}): expected a non-negative "
                                      f"integral scalar, got {validation.describe(value)}")
        return
    ours = buf.value
    if arr.shape != ours.shape:
        raise ParameterShapeError(f"{where}: derived buffer '{key}' ({buf.what}): expected shape {_fmt(ours.shape)}, "
                                  f"got {_fmt(arr.shape)}")
    if buf.kind == "index":
        if arr.dtype.kind not in "iu":
            raise ParameterTypeError(f"{where}: derived buffer '{key}' ({buf.what}): expected an integer array, "
                                     f"got {validation.describe(value)}")
        bad = arr != ours
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ParameterValueError(f"{where}: derived buffer '{key}' ({buf.what}) differs from the value "
                                      f"recomputed from the configuration: {int(bad.sum())} of {arr.size} entries "
                                      f"differ (first at {idx}: given {arr[idx]}, recomputed {ours[idx]})")
        return
    if arr.dtype.kind != "f":
        raise ParameterTypeError(f"{where}: derived buffer '{key}' ({buf.what}): expected a floating array, "
                                 f"got {validation.describe(value)}")
    given = arr.astype(np.float64)
    mine = round_to(ours, dname)
    tol = gamma(buf.ulps, unit_roundoff(dname)) * np.abs(ours) if buf.ulps else 0.0
    bad = ~(np.abs(given - mine) <= tol)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = "exactly" if not buf.ulps else f"within gamma_{buf.ulps}(u_{dname}) |recomputed|"
        raise ParameterValueError(f"{where}: derived buffer '{key}' ({buf.what}) differs from the value recomputed "
                                  f"from the configuration and rounded to {dname} ({allowed}): {int(bad.sum())} of "
                                  f"{arr.size} entries differ (first at {idx}: given {given[idx]!r}, recomputed "
                                  f"{mine[idx]!r})")


def _float64(key: str, value: Any, where: str, label: str) -> np.ndarray:
    arr, _ = _to_numpy(value)
    if arr.dtype.kind != "f":
        raise ParameterTypeError(f"{where}: parameter {label}: expected a real floating array "
                                 f"(float16/bfloat16/float32/float64), got {validation.describe(value)}")
    return arr.astype(np.float64)


def _listed(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(f"'{k}'" for k in keys[:n])
    return shown + (f" and {len(keys) - n} more" if len(keys) > n else "")


# ===================================================================================================
# The converter
# ===================================================================================================

def convert_state_dict(name: Any, state_dict: Any, source: str = "official", *, require_buffers: bool = True,
                       **overrides: Any) -> dict[str, np.ndarray]:
    """The reference's params (float64, keyed like the family's ``param_shapes``) for a state_dict.

    name : a registry name (config built with ``overrides``; for source "official" with preset "official")
        or a registered config object.
    state_dict : mapping of string keys to torch tensors or NumPy arrays (a released checkpoint's
        ``checkpoint["model"]``, or a twin's ``module.state_dict()``).
    source : "official" (the released code's naming and buffers, see the module docstring) or "twin".
    require_buffers : (official) whether a missing derived buffer is an error (a released state_dict has
        them all).

    Raises ParameterKeyError (unknown keys, listed with "did you mean"; missing keys), ParameterShapeError,
    ParameterTypeError, ParameterValueError (a derived buffer that differs: named), ArgumentError (a
    family without released code, an unknown source).
    """
    if source not in SOURCES:
        raise ArgumentError(f"convert_state_dict: argument 'source': expected one of {SOURCES}, got {source!r}")
    if not isinstance(state_dict, Mapping):
        raise ArgumentTypeError(f"convert_state_dict: argument 'state_dict': expected a mapping of state_dict keys "
                                f"to tensors or arrays, got {validation.describe(state_dict)}")
    bad = [k for k in state_dict if not isinstance(k, str)]
    if bad:
        raise ParameterKeyError(f"convert_state_dict: argument 'state_dict': expected string keys, got "
                                f"{validation.describe(bad[0])}")
    if source == "twin":
        cfg, fam, label = _resolve(name, "twin", overrides)
        where = f"convert_state_dict({label!r}, source='twin')"
        expected = fam.param_shapes(cfg)
        view = {}
        for k, v in state_dict.items():
            arr, _ = _to_numpy(v)
            view[k] = arr
        validation.check_params(view, expected, where=where)
        return {k: view[k].astype(np.float64) for k in expected}

    layout = released_layout(name, **overrides)
    cfg, fam, label = _resolve(name, "official", overrides)
    where = f"convert_state_dict({label!r}, source='official')"
    expected = fam.param_shapes(cfg)
    known = set(layout.renames) | set(layout.derived)
    unknown = [k for k in state_dict if k not in known]
    missing = [k for k in layout.renames if k not in state_dict]
    missing_buf = [k for k, b in layout.derived.items() if k not in state_dict and require_buffers]
    if unknown or missing or missing_buf:
        parts = []
        if unknown:
            cands = [k for k in known if k not in state_dict]
            desc = []
            for k in sorted(unknown)[:8]:
                hint = difflib.get_close_matches(k, cands, n=1, cutoff=0.8)
                desc.append(f"'{k}' (did you mean '{hint[0]}'?)" if hint else f"'{k}'")
            more = len(unknown) - 8
            parts.append("unknown " + ", ".join(desc) + (f" and {more} more" if more > 0 else ""))
        if missing:
            parts.append("missing parameters " + _listed(missing))
        if missing_buf:
            parts.append("missing derived buffers " + _listed(missing_buf) + " (the released state_dict carries "
                         "them; pass require_buffers=False to accept their absence)")
        raise ParameterKeyError(f"{where}: the keys differ from the released state_dict of {layout.file} "
                                f"({len(layout.renames)} parameters, {len(layout.derived)} derived buffers): "
                                + "; ".join(parts))
    for k, buf in layout.derived.items():
        if k in state_dict:
            _check_derived(k, state_dict[k], buf, where)
    params = {}
    for rk, ok in layout.renames.items():
        label_k = f"'{rk}'" + (f" (the reference's '{ok}')" if rk != ok else "")
        got = tuple(np.shape(_to_numpy(state_dict[rk])[0]))
        if got != tuple(expected[ok]):
            raise ParameterShapeError(f"{where}: parameter {label_k}: expected shape {_fmt(tuple(expected[ok]))}, "
                                      f"got {_fmt(got)}")
        params[ok] = _float64(rk, state_dict[rk], where, label_k)
    validation.check_params(params, expected, where=where)
    return {k: params[k] for k in expected}
