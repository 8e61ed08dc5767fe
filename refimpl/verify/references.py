"""The references a foreign module can be verified against: what each needs and how it is run.

Layer: the verify tool (NumPy; the foreign module is only inspected here, never run).  A :class:`Reference`
says how to infer the reference configuration from a foreign module (its attributes and weight shapes, the
rest from a preset), which parameter keys and aliases it has, how to draw an input and call the foreign
forward, and where its stages can be observed in a foreign module (submodule inputs and outputs, through the
weight mapping).  The arithmetic is the reference's own (:mod:`refimpl.attention`).

Defined here (registered by name in :mod:`.registry`, with the shifted-window references of :mod:`.windows`):
``flatten.attention`` (FLatten's focused linear attention, DeiT / PVT global layout with
spatial reduction; FLatten Eq. 4-6, 10-12), ``l2vit.attention`` (L2ViT's enhanced linear attention; Eq. 4)
``rala.attention`` (RALA as released in RAVLT; Eq. 2-4, 6), ``castling.attention`` (Castling-ViT; Eq. 9-10) and
``lisa.attention`` (LiSA's operator on tokens; Eq. 9-10, Fig. 7).  ``rala.attention`` takes channels-first
(B, C, H, W), tokens (B, N, C) with the grid from ``--hw`` or ``forward(x, H, W)``, or channels-last (B, H, W, C).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attention import angular as r_ang
from ..attention import enhanced as r_enh
from ..attention import focused as r_foc
from ..attention import lisa as r_lisa
from ..attention import rala as r_rala
from .loading import VerifyError
from .mapping import _alias_pattern

__all__ = ["Reference", "Setup", "Point", "Wire"]


@dataclasses.dataclass(frozen=True)
class Point:
    """Where a stage tensor is observed in the foreign module: the input or output of the foreign submodule
    that the weight mapping pairs with the reference submodule ``ref_module``; ``rows``: a slice of the
    last axis (a fused projection's part)."""

    ref_module: str
    where: str
    rows: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Wire:
    """A data-flow check: the foreign submodule computing ``stage`` must receive the tensor ``producer``
    (transformed by ``transform``) as its input; otherwise the module is wired differently from the paper."""

    stage: str
    point: Point
    producer: str
    transform: Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class Setup:
    """One concrete comparison: the configuration (and how each field was obtained), the grid, the reference
    keys and shapes, and the stage observation points."""

    cfg: Any
    fields: dict[str, str]              # config field -> where its value came from
    hw: tuple[int, int]
    shapes: dict[str, tuple[int, ...]]
    points: dict[str, Point]
    wires: list[Wire]
    #: configuration facts outside the reference's config (the foreign input layout, ...), reported with it
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class Reference:
    """Interface of a registered reference (see :class:`FlattenAttention`)."""

    name: str = ""
    summary: str = ""
    presets: tuple[str, ...] = ()
    #: the preset used when none is asked for
    default_preset: str = "official"
    #: configuration fields that describe the module's shape, not its arithmetic (not reported as departures
    #: from the preset)
    structural: frozenset[str] = frozenset()
    aliases: Mapping[str, Sequence[str]] = {}
    fused: Mapping[str, tuple[Sequence[str], Sequence[str]]] = {}
    #: reference fused submodule -> aliases of the foreign parts it concatenates (mapping.map_weights)
    joined: Mapping[str, Sequence[Sequence[str]]] = {}
    #: stages located by value among every tensor the foreign forward computes (no submodule to hook)
    value_stages: tuple[str, ...] = ()

    def setup(self, module: Any, state: Mapping[str, np.ndarray], preset: str, config: Mapping[str, Any],
              hw: tuple[int, int] | None) -> Setup:
        """The comparison's :class:`Setup` from the foreign module, its state (float64 arrays), ``preset``, ``--config``
        and ``--hw`` (None: inferred, or the reference's default grid); raises VerifyError where a field cannot be
        inferred.  Every registered reference implements it."""
        raise NotImplementedError

    def preset_config(self, preset: str, s: Setup) -> Any:
        """The preset's configuration at the module's size, against which departures are reported."""
        return type(s.cfg).preset(preset, dim=s.cfg.dim, num_heads=s.cfg.num_heads)

    def draw_input(self, s: Setup, batch: int, rng: np.random.Generator) -> np.ndarray:
        """N(0, 1) input in the reference's layout; tokens (B, H W, C) unless the reference says otherwise."""
        return rng.standard_normal((batch, s.hw[0] * s.hw[1], s.cfg.dim))

    def value_shapes(self, s: Setup, x: np.ndarray) -> list[tuple[int, ...]]:
        """The shapes of the stages located by value (``value_stages``), so that only tensors of their sizes
        are recorded."""
        return []

    def call(self, s: Setup, call: Mapping[str, Any] | None) -> tuple[tuple, dict]:
        """(positional, keyword) arguments of the foreign forward after x: ``call`` as given, by default none."""
        return (), dict(call or {})

    def grid_step(self, s: Setup) -> int | tuple[int, int] | None:
        """The step of the grid sizes the module accepts (H and W multiples of it; a pair (step of H, step of W)
        for a rectangular window), or None when the module fixes its grid (a positional encoding of a fixed
        number of tokens): for ``examples``."""
        return 1

    def output_view(self, s: Setup, y: Any) -> Any:
        """The foreign output (a NumPy array or a torch tensor) as the whole-module comparison reads it, in the
        layout :meth:`forward` returns: the output itself by default (the pre-windowed Swin layout reads its
        windows as the grid, its padding cropped)."""
        return y

    def input_view(self, s: Setup, a: Any) -> Any:
        """An array of the input's shape (its gradient, ``--grad``) as the reference's input: itself by default
        (the pre-windowed Swin layout: the windows merged into the grid, the zero padding dropped, since the
        reference pads it itself and has no gradient for it)."""
        return a

    def forward(self, x: np.ndarray, params: Mapping[str, np.ndarray], s: Setup) -> np.ndarray:
        """The reference's float64 output on ``x`` with the mapped parameters, in the layout the whole-module comparison
        reads (:meth:`output_view`).  Every registered reference implements it."""
        raise NotImplementedError

    def bound(self, x: np.ndarray, params: Mapping[str, np.ndarray], s: Setup, dtype: str) -> Any:
        """The :class:`refimpl.verdict.Bound` of :meth:`forward` computed in T = ``dtype`` on ``x``, for the
        whole-module comparison.  Every registered reference implements it."""
        raise NotImplementedError

    def stages(self, params: Mapping[str, np.ndarray], s: Setup) -> list:
        """The reference's stages (:class:`refimpl.verdict.Stage`) in the order the module computes them, for the
        teacher-forced stage comparison.  Every registered reference implements it."""
        raise NotImplementedError

    def derived_findings(self, s: Setup, state: Mapping[str, np.ndarray], keys: Sequence[str]) -> list[dict]:
        """Findings on the foreign derived buffers ``keys`` (the mapping's ``derived``) against the values the
        reference recomputes from the configuration; none by default."""
        return []


def _find(state: Mapping[str, np.ndarray], aliases: Sequence[str], leaf: str) -> list[str]:
    out: list[str] = []
    for a in aliases:
        pat = _alias_pattern(a, leaf)
        out += [k for k in state if pat.match(k) and k not in out]
    return out


def _attr(module: Any, names: Sequence[str]) -> tuple[Any, str] | None:
    """The first attribute of ``names`` found on the module or one level of its submodules."""
    for n in names:
        if hasattr(module, n) and isinstance(getattr(module, n), (int, float)) and \
                not isinstance(getattr(module, n), bool):
            return getattr(module, n), n
    for sub_name, sub in getattr(module, "named_children", list)():
        for n in names:
            if hasattr(sub, n) and isinstance(getattr(sub, n), (int, float)) and \
                    not isinstance(getattr(sub, n), bool):
                return getattr(sub, n), f"{sub_name}.{n}"
    return None


def _forward_takes_hw(module: Any) -> bool:
    """Whether the module's forward takes two positional arguments after x without defaults (``forward(x, H, W)``)."""
    import inspect
    try:
        ps = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    pos = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(pos) >= 3 and all(p.default is p.empty for p in pos[1:3])


def _check_options(cls: Any, preset: str, presets: Sequence[str], name: str, over: Mapping[str, Any]) -> None:
    """``preset`` is one of ``presets`` and every ``--config`` field is a field of ``cls``."""
    if preset not in presets:
        raise VerifyError(f"argument 'preset': expected one of {tuple(presets)} for {name}, got {preset!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    if set(over) - known:
        raise VerifyError(f"argument 'config': unknown field(s) {sorted(set(over) - known)} of {cls.__name__} (it "
                          f"has {sorted(known)})")


def _config(cls: Any, preset: str, presets: Sequence[str], name: str, inferred: Mapping[str, Any],
            over: Mapping[str, Any], fields: dict[str, str]) -> Any:
    """The reference configuration: ``preset``, then the inferred fields, then the user's (``--config``);
    ``fields`` gets the source of every field."""
    _check_options(cls, preset, presets, name, over)
    for k in over:
        fields[k] = "--config"
    try:
        cfg = cls.preset(preset, **{**inferred, **over})
    except (TypeError, ValueError) as exc:
        raise VerifyError(f"config: {exc}") from exc
    for f in dataclasses.fields(cfg):
        fields.setdefault(f.name, f"preset {preset!r}")
    return cfg


def _infer_heads(module: Any, over: Mapping[str, Any], inferred: dict[str, Any], fields: dict[str, str]) -> None:
    """num_heads from a module attribute (num_heads, heads, ...) unless ``--config`` gives it."""
    if "num_heads" in over:
        return
    got = _attr(module, ("num_heads", "heads", "n_heads", "nhead", "num_head"))
    if got is None:
        raise VerifyError("config: cannot infer 'num_heads' (no attribute num_heads/heads/n_heads); give "
                          "--config '{\"num_heads\": h}'")
    inferred["num_heads"], fields["num_heads"] = int(got[0]), f"module attribute {got[1]}"


def _grid(hw: tuple[int, int] | None, fields: dict[str, str], default: tuple[int, int] = (8, 8)) -> tuple[int, int]:
    """The token grid: ``--hw``, or ``default`` for a layer that does not fix its grid."""
    fields["hw"] = "--hw" if hw is not None else f"default ({default[0]} x {default[1]}; the layer fixes no grid)"
    return default if hw is None else (int(hw[0]), int(hw[1]))


_PROJ_ALIASES = ("proj", "out", "to_out", "out_proj", "o_proj", "wo")
_QKV_ALIASES = ("qkv", "to_qkv", "qkv_proj", "wqkv", "in_proj")
_SPLIT_QKV = (("q", "to_q", "query", "q_proj", "wq"), ("k", "to_k", "key", "k_proj", "wk"),
              ("v", "to_v", "value", "v_proj", "wv"))


def _infer_qkv_layer(module: Any, state: Mapping[str, np.ndarray], name: str, over: Mapping[str, Any],
                     inferred: dict[str, Any], fields: dict[str, str]) -> None:
    """dim, num_heads and qkv_bias of a layer with a fused qkv projection (3C, C), or split q / k / v ones."""
    fused = _find(state, _QKV_ALIASES, "weight")
    parts = [_find(state, al, "weight") for al in _SPLIT_QKV]
    if len(fused) == 1:
        c_in, has_bias = int(state[fused[0]].shape[-1]), bool(_find(state, _QKV_ALIASES, "bias"))
    elif all(len(p) == 1 for p in parts):
        c_in, has_bias = int(state[parts[0][0]].shape[-1]), bool(_find(state, _SPLIT_QKV[0], "bias"))
    else:
        raise VerifyError(f"weights: {name} expects one fused qkv projection (3C, C) ({', '.join(_QKV_ALIASES)}) "
                          f"or three projections q, k, v; found fused {fused or 'none'}, q/k/v "
                          f"{[p or 'none' for p in parts]}")
    if "dim" not in over:
        inferred["dim"], fields["dim"] = c_in, "qkv weight shape"
    _infer_heads(module, over, inferred, fields)
    if "qkv_bias" not in over:
        inferred["qkv_bias"], fields["qkv_bias"] = has_bias, "presence of a qkv bias"


class FlattenAttention(Reference):
    """FLatten's focused linear attention, DeiT / PVT global layout (sr = 1 or a spatial reduction sr > 1):
    :func:`refimpl.attention.focused.focused_linear_attention` and its bound and stage list.  Input: tokens
    (B, N, C) with N = H W; the foreign forward is called as ``forward(x, H, W)`` (the released signature)
    unless ``call`` says otherwise."""

    name = "flatten.attention"
    summary = ("FLatten focused linear attention, global (DeiT / PVT) layout with optional spatial reduction: "
               "q, [sr conv, LayerNorm], kv, focused features, attention + DWC, proj (Eq. 4-6, 10-12)")
    presets = ("paper", "official")
    structural = frozenset({"dim", "num_heads", "sr_ratio", "kernel_size", "qkv_bias", "layer_norm_eps"})
    aliases = {
        "q": ("q", "to_q", "query", "q_proj", "wq"),
        "kv": ("kv", "to_kv", "kv_proj", "wkv"),
        "sr": ("sr", "reduce", "sr_conv", "spatial_reduction", "reduction"),
        "norm": ("norm", "sr_norm", "reduce_norm", "norm_sr", "ln"),
        "proj": _PROJ_ALIASES,
        "dwc": ("dwc", "dw_conv", "dwconv", "dw", "lepe", "local_conv"),
        "scale": ("scale", "feature_scale", "focus_scale"),
        "positional_encoding": ("positional_encoding", "pos_emb", "pos_embed", "pe", "pos_encoding"),
    }
    fused = {"qkv": (_QKV_ALIASES, ("q", "kv"))}
    value_stages = ("phi_q", "phi_k", "attention")

    def setup(self, module, state, preset, config, hw):
        fields: dict[str, str] = {}
        over = dict(config or {})
        _check_options(r_foc.FocusedConfig, preset, self.presets, self.name, over)
        inferred: dict[str, Any] = {}

        def one(aliases, leaf):
            ks = _find(state, aliases, leaf)
            return state[ks[0]] if len(ks) == 1 else None

        proj_w = one(self.aliases["proj"], "weight")
        q_w = one(self.aliases["q"], "weight")
        qkv_w = one(self.fused["qkv"][0], "weight")
        if "dim" not in over:
            got = _attr(module, ("dim", "embed_dim", "d_model", "hidden_dim"))
            if got is not None:
                inferred["dim"], fields["dim"] = int(got[0]), f"module attribute {got[1]}"
            elif proj_w is not None:
                inferred["dim"], fields["dim"] = int(proj_w.shape[0]), "output projection weight shape"
            else:
                raise VerifyError("config: cannot infer 'dim' (no attribute dim/embed_dim and no projection "
                                  "weight found); give --config '{\"dim\": C}'")
        _infer_heads(module, over, inferred, fields)
        if "p" not in over:
            got = _attr(module, ("focusing_factor", "p", "focus_power", "power"))
            if got is not None:
                inferred["p"], fields["p"] = float(got[0]), f"module attribute {got[1]}"
        if "sr_ratio" not in over:
            sr_w = one(self.aliases["sr"], "weight")
            got = _attr(module, ("sr_ratio", "sr", "reduction_ratio"))
            if got is not None:
                inferred["sr_ratio"], fields["sr_ratio"] = int(got[0]), f"module attribute {got[1]}"
            elif sr_w is not None and sr_w.ndim == 4:
                inferred["sr_ratio"], fields["sr_ratio"] = int(sr_w.shape[-1]), "reduction conv kernel shape"
            else:
                inferred["sr_ratio"], fields["sr_ratio"] = 1, "no reduction conv found"
        dwc_w = one(self.aliases["dwc"], "weight")
        dim = over.get("dim", inferred.get("dim"))
        if dwc_w is not None and dwc_w.ndim == 4:
            if "kernel_size" not in over:
                inferred["kernel_size"], fields["kernel_size"] = int(dwc_w.shape[-1]), "DWC weight shape"
            heads = over.get("num_heads", inferred.get("num_heads"))
            if "dwc_shared" not in over and heads != 1:     # with one head, shared and per-channel coincide
                inferred["dwc_shared"] = bool(dwc_w.shape[0] != dim)
                fields["dwc_shared"] = f"DWC weight has {dwc_w.shape[0]} filters for C = {dim}"
        if "qkv_bias" not in over:
            has_b = bool(_find(state, self.aliases["q"], "bias") or _find(state, self.fused["qkv"][0], "bias"))
            inferred["qkv_bias"], fields["qkv_bias"] = has_b, "presence of a q / qkv bias"
        for fld, key in (("learnable_scale", "scale"), ("positional_encoding", "positional_encoding")):
            if fld not in over:
                inferred[fld] = bool(_find(state, self.aliases[key], ""))
                fields[fld] = f"presence of a {key!r} tensor"
        cfg = _config(r_foc.FocusedConfig, preset, self.presets, self.name, inferred, over, fields)
        if q_w is None and qkv_w is None:
            raise VerifyError("weights: no query projection found (q, to_q, query, q_proj, or a fused qkv)")
        sr = cfg.sr_ratio
        if hw is None:
            pe = one(self.aliases["positional_encoding"], "")
            if pe is not None and pe.ndim == 3 and math.isqrt(pe.shape[1]) ** 2 == pe.shape[1]:
                side = math.isqrt(pe.shape[1]) * sr
                hw = (side, side)
                fields["hw"] = f"positional encoding covers {pe.shape[1]} key tokens"
            else:
                hw = (4 * sr, 4 * sr)
                fields["hw"] = "default (4 sr x 4 sr)"
        else:
            fields["hw"] = "--hw"
        hw = (int(hw[0]), int(hw[1]))
        if hw[0] % sr or hw[1] % sr:
            raise VerifyError(f"argument 'hw': {hw} is not divisible by sr_ratio = {sr}")
        n_kv = (hw[0] // sr) * (hw[1] // sr)
        shapes = r_foc.focused_param_shapes(cfg, layout="global", n_kv=n_kv)
        c = cfg.dim
        fused_q = q_w is None
        points = {"x": Point("qkv" if fused_q else "q", "input")}
        if fused_q:
            if sr > 1:
                raise VerifyError("weights: a fused qkv projection with a spatial reduction (sr > 1) cannot be "
                                  "the PVT layout, where K and V come from the reduced grid")
            points["q"] = Point("qkv", "output", (0, c))
            points["kv"] = Point("qkv", "output", (c, 3 * c))
        else:
            points["q"] = Point("q", "output")
            points["kv"] = Point("kv", "output")
        wires: list[Wire] = []
        if sr > 1:
            big_h, big_w = hw
            points["sr"] = Point("sr", "output")
            points["norm"] = Point("norm", "output")
            wires += [
                Wire("sr", Point("sr", "input"), "x",
                     lambda x: x.reshape(x.shape[0], big_h, big_w, c).transpose(0, 3, 1, 2)),
                Wire("norm", Point("norm", "input"), "sr",
                     lambda r: r.reshape(r.shape[0], c, -1).transpose(0, 2, 1)),
                Wire("kv", Point("kv", "input"), "norm", lambda t: t),
            ]
        elif not fused_q:
            wires.append(Wire("kv", Point("kv", "input"), "x", lambda t: t))
        points["dwc_in"] = Point("dwc", "input")
        points["dwc"] = Point("dwc", "output")
        points["core"] = Point("proj", "input")
        points["proj"] = Point("proj", "output")
        return Setup(cfg, fields, hw, shapes, points, wires)

    def value_shapes(self, s, x):
        b, n, c = x.shape
        n_kv = (s.hw[0] // s.cfg.sr_ratio) * (s.hw[1] // s.cfg.sr_ratio)
        return [(b, n, c), (b, n_kv, c)]

    def grid_step(self, s):
        return None if s.cfg.positional_encoding else s.cfg.sr_ratio

    def call(self, s, call):
        if call is None:
            return (s.hw[0], s.hw[1]), {}
        subs = {"$H": s.hw[0], "$W": s.hw[1], "$HW": list(s.hw)}
        return (), {k: subs.get(v, v) if isinstance(v, str) else v for k, v in call.items()}

    def forward(self, x, params, s):
        return r_foc.focused_linear_attention(x, params, s.cfg, s.hw)

    def bound(self, x, params, s, dtype):
        return r_foc.focused_linear_attention_bound(x, params, s.cfg, s.hw, dtype=dtype)

    def stages(self, params, s):
        return r_foc.focused_linear_attention_stages(params, s.cfg, s.hw, fine=True)


class L2ViTAttention(Reference):
    """L2ViT's linear global attention layer (LGA's attention): the fused qkv projection, ReLU features, the
    numerator scaled by s (paper: / s, one scalar; official: * t_h, a per-head temperature), the normaliser
    clamped at C_min, the output projection: :func:`refimpl.attention.enhanced.enhanced_attention`.  Input:
    tokens (B, N, C); the foreign forward is called as ``forward(x)``."""

    name = "l2vit.attention"
    summary = ("L2ViT enhanced linear attention (LGA's attention layer): qkv, ReLU features, the clamped "
               "normaliser and the learnable scale, proj (Eq. 4, App. 8)")
    presets = ("paper", "official")
    structural = frozenset({"dim", "num_heads", "qkv_bias"})
    aliases = {"qkv": _QKV_ALIASES, "proj": _PROJ_ALIASES, "scale": ("scale", "alpha", "s"),
               "temperature": ("temperature", "temp", "tau", "rescale")}
    joined = {"qkv": _SPLIT_QKV}

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        _check_options(r_enh.L2ViTConfig, preset, self.presets, self.name, over)
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        _infer_qkv_layer(module, state, self.name, over, inferred, fields)
        if "c_min" not in over and (got := _attr(module, ("c_min", "clamp_min", "min_denominator"))) is not None:
            inferred["c_min"], fields["c_min"] = float(got[0]), f"module attribute {got[1]}"
        if "scale_mode" not in over:
            if _find(state, self.aliases["temperature"], ""):
                inferred["scale_mode"], fields["scale_mode"] = "per_head", "a per-head temperature tensor"
            elif _find(state, self.aliases["scale"], ""):
                inferred["scale_mode"], fields["scale_mode"] = "scalar", "a scalar scale tensor"
        cfg = _config(r_enh.L2ViTConfig, preset, self.presets, self.name, inferred, over, fields)
        hw = _grid(hw, fields)
        shapes = {k[len("attn."):]: v for k, v in r_enh.l2vit_param_shapes(cfg, "lga").items()
                  if k.startswith("attn.")}
        points = {"x": Point("qkv", "input"), "qkv": Point("qkv", "output"), "core": Point("proj", "input"),
                  "proj": Point("proj", "output")}
        return Setup(cfg, fields, hw, shapes, points, [])

    def forward(self, x, params, s):
        return r_enh.enhanced_attention(x, params, s.cfg)

    def bound(self, x, params, s, dtype):
        return r_enh.enhanced_attention_bound(x, params, s.cfg, dtype=dtype)

    def stages(self, params, s):
        return r_enh.enhanced_attention_stages(params, s.cfg)


class RALAAttention(Reference):
    """RALA, the rank-augmented linear attention layer of RAVLT (:func:`refimpl.attention.rala.rala_attention`):
    one fused projection for q, k, v and the gate ("qkvo"), LePE, the output projection.  Input layouts: the
    released channels-first (B, C, H, W) with 1 x 1 conv weights; tokens (B, N, C) with nn.Linear weights, the grid
    from ``--hw`` or a module attribute, the forward called as ``forward(x, H, W)`` where it takes them; channels-last
    (B, H, W, C).  Inferred from the fused weight's shape and the forward's signature, or set by ``--config
    '{"layout": "tokens" | "nhwc" | "nchw" | "channels_first"}'``.  Stages: the fused projection, then (located by
    value) Eq. 4's logits and weights, the reweighted keys, Eq. 2-3's numerator and denominator and their quotient,
    then LePE (hooked), the gated sum (the projection's input) and the output."""

    name = "rala.attention"
    summary = ("RALA (RAVLT's attention), a fused qkv + gate projection, channels-first (B, C, H, W), tokens "
               "(B, N, C) with --hw or (B, H, W, C): kappa features, the "
               "softmax reweighting of the keys (Eq. 4), RoPE, the normalised attention (Eq. 2-3), LePE, the gate "
               "(Eq. 6), proj")
    presets = ("official", "paper")
    structural = frozenset({"dim", "num_heads", "qkv_bias", "lepe_kernel", "out_proj", "layout"})
    aliases = {"qkvo": ("qkvo", "to_qkvo", "to_qkvg", "qkvg", "qkv_gate"),
               "lepe": ("lepe", "pos", "pos_conv", "lepe_conv", "local_conv", "dwconv"),
               "proj": _PROJ_ALIASES}
    value_stages = ("scores", "alpha", "k_weighted", "numerator", "denominator", "core")

    _INPUT_LAYOUTS = {"tokens": "tokens", "nhwc": "tokens", "channels_first": "channels_first",
                      "nchw": "channels_first"}

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        asked = over.pop("layout", None)
        if asked is not None and asked not in self._INPUT_LAYOUTS:
            raise VerifyError(f"argument 'config': layout expected one of {tuple(self._INPUT_LAYOUTS)} for "
                              f"{self.name}, got {asked!r}")
        _check_options(r_rala.RALAConfig, preset, self.presets, self.name, over)
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        fused = _find(state, self.aliases["qkvo"], "weight")
        w = state[fused[0]] if len(fused) == 1 else None
        if w is None or w.ndim not in (2, 4) or w.shape[0] != 4 * w.shape[1] or w.shape[2:] not in ((), (1, 1)):
            raise VerifyError(f"weights: expected one fused projection for q, k, v and the gate, an nn.Linear "
                              f"(4C, C) or a 1 x 1 conv (4C, C, 1, 1) ({', '.join(self.aliases['qkvo'])}), found "
                              f"{[(k, tuple(state[k].shape)) for k in fused] or 'none'}")
        if "dim" not in over:
            inferred["dim"], fields["dim"] = int(w.shape[1]), "fused projection weight shape"
        _infer_heads(module, over, inferred, fields)
        if "qkv_bias" not in over:
            inferred["qkv_bias"] = bool(_find(state, self.aliases["qkvo"], "bias"))
            fields["qkv_bias"] = "presence of a fused projection bias"
        lepe = _find(state, self.aliases["lepe"], "weight")
        if "lepe_kernel" not in over:
            inferred["lepe_kernel"] = int(state[lepe[0]].shape[-1]) if len(lepe) == 1 else 0
            fields["lepe_kernel"] = "LePE weight shape" if lepe else "no LePE conv found"
        if "out_proj" not in over:
            inferred["out_proj"] = bool(_find(state, self.aliases["proj"], "weight"))
            fields["out_proj"] = "presence of an output projection"
        # the input layout: --config, else the weights (1 x 1 convs: channels-first) and, for nn.Linear weights, the
        # forward's signature or a grid attribute (tokens (B, N, C)) or neither (channels-last (B, H, W, C))
        takes_hw = _forward_takes_hw(module)
        grid_attr = _top_attr(module, ("input_resolution", "resolution", "hw", "grid_size", "grid"),
                              lambda v: _int_tuple(v, 2))
        if asked is not None:
            layout, fields["layout"] = asked, "--config"
        elif w.ndim == 4:
            layout, fields["layout"] = "channels_first", "1 x 1 conv weights: channels-first (B, C, H, W)"
        elif takes_hw or grid_attr is not None:
            layout = "tokens"
            fields["layout"] = "nn.Linear weights and " + ("forward(x, H, W)" if takes_hw else
                                                           f"the module's grid {grid_attr[1]}") + ": tokens (B, N, C)"
        else:
            layout, fields["layout"] = "nhwc", "nn.Linear weights, forward(x): channels-last (B, H, W, C)"
        inferred["layout"] = self._INPUT_LAYOUTS[layout]
        inferred["gate_source"], fields["gate_source"] = "qkvo", "the fused projection has 4C rows"
        cfg = _config(r_rala.RALAConfig, preset, self.presets, self.name, inferred, over, fields)
        fixed = hw is None and grid_attr is not None and layout in ("tokens", "nhwc")
        if fixed:
            hw = tuple(int(t) for t in grid_attr[0])
        hw = _grid(hw, fields)
        if fixed:
            fields["hw"] = f"module attribute {grid_attr[1]}"
        shapes = r_rala.rala_param_shapes(cfg)
        points = {"x": Point("qkvo", "input"), "proj_in": Point("qkvo", "output")}
        if cfg.lepe_kernel:
            points["lepe"] = Point("lepe", "output")
        if cfg.out_proj:
            points["gated"] = Point("proj", "input")
            points["out"] = Point("proj", "output")
        inp = {"tokens": "tokens (B, N, C)", "nhwc": "channels-last (B, H, W, C)"}.get(layout, "channels-first "
                                                                                              "(B, C, H, W)")
        return Setup(cfg, fields, hw, shapes, points, [],
                     extra={"input_layout": inp, "hw_args": takes_hw and layout == "tokens", "grid_fixed": fixed})

    @staticmethod
    def _tokens_in(s: Setup) -> bool:
        return s.extra.get("input_layout", "").startswith("tokens")

    def _grid_x(self, x: np.ndarray, s: Setup) -> np.ndarray:
        """x in the reference's layout: tokens (B, N, C) as (B, H, W, C); the others as they are."""
        return x.reshape(x.shape[0], s.hw[0], s.hw[1], x.shape[-1]) if self._tokens_in(s) and x.ndim == 3 else x

    def draw_input(self, s, batch, rng):
        c, (h, w) = s.cfg.dim, s.hw
        if s.cfg.layout == "channels_first":
            return rng.standard_normal((batch, c, h, w))
        return rng.standard_normal((batch, h * w, c) if self._tokens_in(s) else (batch, h, w, c))

    def call(self, s, call):
        if call is None and s.extra.get("hw_args"):
            return (s.hw[0], s.hw[1]), {}
        return super().call(s, call)

    def grid_step(self, s):
        fixed = s.extra.get("grid_fixed") if isinstance(getattr(s, "extra", None), dict) else \
            getattr(s.cfg, "grid_fixed", False)
        return None if fixed else 1

    def value_shapes(self, s, x):
        b, c = x.shape[0], s.cfg.dim
        n = s.hw[0] * s.hw[1]
        return [(b, s.cfg.num_heads, n), (b, n, c)]

    def forward(self, x, params, s):
        return r_rala.rala_attention(self._grid_x(x, s), params, s.cfg).reshape(x.shape)

    def bound(self, x, params, s, dtype):
        b = r_rala.rala_attention_bound(self._grid_x(x, s), params, s.cfg, dtype=dtype)
        if not self._tokens_in(s):
            return b
        def tok(a):
            return a if a is None or np.ndim(a) != 4 else np.asarray(a).reshape(x.shape)
        return dataclasses.replace(b, scale=tok(b.scale), sigma=tok(b.sigma), ref_scale=tok(b.ref_scale))

    def stages(self, params, s):
        stages = r_rala.rala_attention_stages(params, s.cfg, s.hw, fine=True)
        if not self._tokens_in(s):
            return stages

        # a stage reading a hooked tensor of the grid (x, the projections, LePE, the gated sum) gets it as the module
        # gave it, tokens (B, N, .), when its own stage could not be evaluated (an earlier stage unlocated)
        grid_like = {"x", "proj_in", "phi", "core", "lepe", "gated", "out"}

        def conv(st, t):
            return [self._grid_x(a, s) if k in grid_like else a for k, a in zip(st.inputs, t)]

        def from_tokens(st):
            ref, bnd = st.reference, st.bound
            return dataclasses.replace(st, reference=lambda *t: ref(*conv(st, t)),
                                       bound=lambda *t, dtype=None: bnd(*conv(st, t), dtype=dtype))
        return [from_tokens(st) if grid_like & set(st.inputs) else st for st in stages]


class CastlingAttention(Reference):
    """Castling-ViT's attention layer (:func:`refimpl.attention.angular.castling_attention`, eval mode): the
    fused qkv projection, the linear-angular core (Eq. 9-10: 1/2 + (1/pi) q k^T applied as 0.5 V + (1/pi)
    Q (K^T V), with the depthwise convolution of V), the output projection.  Input: tokens (B, N, C); the
    foreign forward is called as ``forward(x)``.  Stages: qkv, core (the projection's input), proj."""

    name = "castling.attention"
    summary = ("Castling-ViT linear-angular attention (eval): qkv, 0.5 V + (1/pi) Q (K^T V) (Eq. 9-10) with the "
               "released row normalisation and depthwise conv of V, proj")
    presets = ("official", "paper")
    structural = frozenset({"dim", "num_heads", "qkv_bias", "conv", "conv_kernel", "conv_bias"})
    aliases = {"qkv": _QKV_ALIASES, "proj": _PROJ_ALIASES,
               "dconv": ("dconv", "token_conv", "conv", "dwconv", "dw", "lepe", "v_conv")}
    joined = {"qkv": _SPLIT_QKV}

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        _check_options(r_ang.CastlingConfig, preset, self.presets, self.name, over)
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        _infer_qkv_layer(module, state, self.name, over, inferred, fields)
        conv = _find(state, self.aliases["dconv"], "weight")
        if len(conv) == 1 and state[conv[0]].ndim == 4:
            w = state[conv[0]]
            if "conv" not in over:
                inferred["conv"] = "tokens1d" if w.shape[-1] == 1 and w.shape[-2] > 1 else "grid2d"
                fields["conv"] = f"depthwise conv weight {tuple(w.shape)}"
            if "conv_kernel" not in over:
                inferred["conv_kernel"], fields["conv_kernel"] = int(w.shape[2]), "depthwise conv weight shape"
            if "conv_bias" not in over:
                inferred["conv_bias"] = bool(_find(state, self.aliases["dconv"], "bias"))
                fields["conv_bias"] = "presence of a conv bias"
        elif "conv" not in over:
            inferred["conv"], fields["conv"] = "none", "no depthwise conv found"
        cfg = _config(r_ang.CastlingConfig, preset, self.presets, self.name, inferred, over, fields)
        hw = _grid(hw, fields)
        points = {"x": Point("qkv", "input"), "qkv": Point("qkv", "output"), "core": Point("proj", "input"),
                  "proj": Point("proj", "output")}
        return Setup(cfg, fields, hw, cfg.param_shapes(), points, [])

    def forward(self, x, params, s):
        return r_ang.castling_attention(x, params, s.cfg, hw=s.hw)

    def bound(self, x, params, s, dtype):
        return r_ang.castling_attention_bound(x, params, s.cfg, dtype=dtype, hw=s.hw)

    def stages(self, params, s):
        return r_ang.castling_attention_stages(params, s.cfg, hw=s.hw)


def _top_attr(module: Any, names: Sequence[str], accept: Callable[[Any], bool]) -> tuple[Any, str] | None:
    """The first attribute of ``names`` on the module itself (not its submodules: a LayerNorm's ``eps`` is not the
    module's) whose value ``accept`` takes."""
    for n in names:
        v = getattr(module, n, None)
        if v is not None and not isinstance(v, bool) and accept(v):
            return v, n
    return None


def _int_tuple(v: Any, length: int | None = None) -> bool:
    return (isinstance(v, (tuple, list)) and (length is None or len(v) == length) and len(v) > 0 and
            all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 1 for t in v))


class LiSAAttention(Reference):
    """LiSA's operator on tokens (:func:`refimpl.attention.lisa.lisa_attention`; Eq. 9-10, Fig. 7 with heads): the
    qkv projection, per-head L2 normalisation of Q and K, Ga = Kn (*) Wa + Ba and Gb = V (*) Wb + Bb (circular
    convolutions over the grid, Eq. 10; or, with Toeplitz parameters on the 2n - 1 offsets, the exact linear
    ones of Eq. 9), the contraction sum_c sum_d Qn_c Ga_cd Gb_vd, the output projection.  Heads share Wa, Wb,
    Ba, Bb.  Input: tokens (B, H W, C), row-major over the 2-D grid, which the module fixes (its kernels have one
    row per token or per offset); the foreign forward is called as ``forward(x)``.  Stages: qkv (hooked), the
    normalised Q and K, Ga and Gb (located by value), core (the projection's input), proj."""

    name = "lisa.attention"
    summary = ("LiSA attention (no released code: the paper's equations): qkv, L2-normalised Q and K, the Toeplitz "
               "(FFT) convolutions Ga = Kn * Wa + Ba and Gb = V * Wb + Bb, the contraction of Eq. 9-10, proj")
    presets = ("paper",)
    default_preset = "paper"
    structural = frozenset({"dim", "num_heads", "grid", "latent", "qkv_bias", "ln_eps", "mlp_ratio"})
    aliases = {"qkv": _QKV_ALIASES, "proj": _PROJ_ALIASES,
               "weight_a": ("weight_a", "wa", "w_a", "kernel_a", "k_kernel", "key_kernel", "rpe_a", "ea", "e_a"),
               "weight_b": ("weight_b", "wb", "w_b", "kernel_b", "v_kernel", "value_kernel", "rpe_b", "eb", "e_b"),
               "bias_a": ("bias_a", "ba", "b_a", "k_bias", "key_bias", "k_shift"),
               "bias_b": ("bias_b", "bb", "b_b", "v_bias", "value_bias", "v_shift")}
    joined = {"qkv": _SPLIT_QKV}
    value_stages = ("qn", "kn", "ga", "gb")
    _GRID_ATTRS = ("grid", "hw", "resolution", "input_resolution", "grid_size", "feat_size", "spatial_shape")
    _LENGTH_ATTRS = ("fft_lengths", "lengths", "fft_size", "fft_shape", "pad_to")

    def _grid(self, module, over, hw, fields):
        """The token grid (H, W): --hw, --config grid, or a module attribute (grid, hw, resolution, ...)."""
        if hw is not None:
            g, src = (int(hw[0]), int(hw[1])), "--hw"
            if "grid" in over and tuple(over["grid"]) != g:
                raise VerifyError(f"argument 'hw': {g} disagrees with --config grid {tuple(over['grid'])}")
        elif "grid" in over:
            g, src = tuple(over["grid"]), "--config"
        elif (got := _top_attr(module, self._GRID_ATTRS, _int_tuple)) is not None:
            g, src = tuple(int(t) for t in got[0]), f"module attribute {got[1]}"
        else:
            raise VerifyError(f"argument 'hw': cannot infer the token grid of {self.name} (no module attribute "
                              f"{'/'.join(self._GRID_ATTRS)}); give --hw H,W")
        if len(g) != 2:
            raise VerifyError(f"argument 'hw': {self.name} verifies 2-D token grids (H, W); got {g} ({src})")
        fields["grid"] = fields["hw"] = src
        return g

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        _check_options(r_lisa.LiSAConfig, preset, self.presets, self.name, over)
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        _infer_qkv_layer(module, state, self.name, over, inferred, fields)
        g = self._grid(module, over, hw, fields)
        if "grid" not in over:
            inferred["grid"] = g
        ks = {k: _find(state, self.aliases[k], "") for k in ("weight_a", "weight_b", "bias_a", "bias_b")}
        wa = ks["weight_a"]
        if len(wa) != 1 or state[wa[0]].ndim != 3:
            raise VerifyError(f"weights: {self.name} expects one kernel Wa of shape (P, c, D) (P = H W circular, "
                              f"(2H-1)(2W-1) Toeplitz; {', '.join(self.aliases['weight_a'])}), found "
                              f"{[(k, tuple(state[k].shape)) for k in wa] or 'none'}")
        p, _, d = state[wa[0]].shape
        if "latent" not in over:
            inferred["latent"], fields["latent"] = int(d), f"{wa[0]} shape (last axis)"
        n_circ, n_toep = g[0] * g[1], (2 * g[0] - 1) * (2 * g[1] - 1)
        if "exact_toeplitz" not in over and n_circ != n_toep:
            if p == n_circ:
                inferred["exact_toeplitz"] = False
                fields["exact_toeplitz"] = f"{wa[0]} has H W = {p} rows: circular kernels (Eq. 10)"
            elif p == n_toep:
                inferred["exact_toeplitz"] = True
                fields["exact_toeplitz"] = f"{wa[0]} has (2H-1)(2W-1) = {p} rows: Toeplitz parameters (Eq. 9)"
            else:
                raise VerifyError(f"weights: {wa[0]} has {p} rows; on the grid {g} a LiSA kernel has H W = {n_circ} "
                                  f"(circular, Eq. 10) or (2H-1)(2W-1) = {n_toep} (Toeplitz, Eq. 9); the grid came from "
                                  f"{fields['grid']}: give the module's grid with --hw H,W")
        exact = over.get("exact_toeplitz", inferred.get("exact_toeplitz", False))
        if "fft_lengths" not in over and exact and \
                (got := _top_attr(module, self._LENGTH_ATTRS, lambda v: _int_tuple(v, 2))) is not None:
            inferred["fft_lengths"] = tuple(int(t) for t in got[0])
            fields["fft_lengths"] = f"module attribute {got[1]}"
        if "transform" not in over and (got := _top_attr(
                module, ("transform", "fft_kind"), lambda v: isinstance(v, str) and v in r_lisa.TRANSFORMS)):
            inferred["transform"], fields["transform"] = got[0], f"module attribute {got[1]}"
        if "l2_eps" not in over and (got := _top_attr(
                module, ("l2_eps", "norm_eps", "eps"), lambda v: isinstance(v, (int, float)) and v > 0)):
            inferred["l2_eps"], fields["l2_eps"] = float(got[0]), f"module attribute {got[1]}"
        cfg = _config(r_lisa.LiSAConfig, preset, self.presets, self.name, inferred, over, fields)
        points = {"x": Point("qkv", "input"), "qkv": Point("qkv", "output"), "core": Point("proj", "input"),
                  "proj": Point("proj", "output")}
        return Setup(cfg, fields, tuple(cfg.grid), r_lisa.lisa_param_shapes(cfg), points, [])

    def preset_config(self, preset, s):
        return r_lisa.LiSAConfig.preset(preset, dim=s.cfg.dim, num_heads=s.cfg.num_heads, grid=s.cfg.grid)

    def value_shapes(self, s, x):
        b, c = x.shape[0], s.cfg.head_dim
        n, h = s.cfg.num_tokens, s.cfg.num_heads
        return [(b, h, n, c), (b, h, n, c, s.cfg.latent)]

    def grid_step(self, s):
        return None                     # the kernels fix the grid

    def forward(self, x, params, s):
        return r_lisa.lisa_attention(x, params, s.cfg)

    def bound(self, x, params, s, dtype):
        return r_lisa.lisa_attention_bound(x, params, s.cfg, dtype=dtype)

    def stages(self, params, s):
        return r_lisa.lisa_attention_stages(params, s.cfg, fine=True)
