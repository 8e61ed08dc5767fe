"""Shifted-window references for foreign modules that take the whole token grid and do Swin's cyclic shift, window
partition, attention mask and window reverse themselves.

Layer: the verify tool (NumPy; the foreign module is only inspected here).  Two references:

- ``softmax.window_attention``: Swin's (shifted) window attention (:func:`refimpl.attention.softmax.window_attention`;
  Swin §3.2, Eq. 4, Fig. 4): pad, roll by -shift, partition, per window qkv, SoftMax(Q K^T / sqrt(d) + B + mask) V,
  proj, reverse, roll by +shift, crop;
- ``flatten.attention`` in the Swin layout on the whole grid (:func:`refimpl.attention.focused.focused_window_attention`;
  FLatten §4.3): the same geometry around the focused linear attention of each window, the shift mask applied
  (preset ``paper``) or ignored (``official``, as released).  The pre-windowed layout (windows as the batch) and
  the DeiT / PVT global layout stay with :class:`refimpl.verify.references.FlattenAttention`; the window layout
  is taken when ``--config`` names ``window_size`` / ``shift`` / ``layout`` or the module has a ``shift_size``
  (or ``shift``) attribute.

The foreign input is tokens (B, H W, C) (``layout`` "tokens": the grid from ``--hw``, a module attribute
``input_resolution`` / ``resolution`` / ..., and ``forward(x, H, W)`` when the forward takes them) or channels-last
(B, H, W, C) (``layout`` "nhwc", the default when the forward takes x alone and the module names no grid); for
``softmax.window_attention`` also Swin's pre-windowed input (``layout`` "windows", inferred from a ``mask``
parameter of the forward: ``WindowAttention(x, mask)`` on the windows (B nW, ws^2, C) of the shifted grid, the
verifier passing the additive shift mask; stages ``qkv``, ``core``, ``proj``).
Window and shift: ``--config`` (``window_size``, ``shift``), else the module attributes ``window_size`` /
``shift_size`` (Swin's names), else FLatten's positional encoding (n = ws^2 tokens) and shift 0.

Stages, in the order the module computes them: ``windows`` (the padded, shifted grid cut into windows: exact data
movement, observed at the qkv projection's input, so a roll in the wrong direction is found there), the
reference's per-window stages (``qkv``; ``core`` for softmax, where the relative-position bias and the shift mask
enter; FLatten's ``phi_q``, ``phi_k``, ``attention`` (the mask enters here), ``dwc_in``, ``dwc``, ``core``; ``proj``),
then ``out`` (the windows merged, rolled back and cropped: located by value among the forward's tensors).

Derived buffers (:meth:`_ShiftedWindows.derived_findings`): a foreign integer buffer named like a relative-position
index is compared exactly with :func:`refimpl.layers.relative_position_index`; a buffer named like a mask (float:
0 = attend, anything else = masked; bool: True = attend, or the inverse convention throughout) with
:func:`refimpl.layers.shifted_window_mask` of the padded grid.  A difference is a finding naming the buffer and its
first differing entry.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

import numpy as np

from .. import config as _cfg
from .. import layers
from ..attention import focused as r_foc
from ..attention import softmax as r_soft
from ..verdict import Bound, Stage
from .loading import VerifyError
from .references import (FlattenAttention, Point, Reference, Setup, _PROJ_ALIASES, _QKV_ALIASES, _SPLIT_QKV,
                         _check_options, _config, _find, _forward_takes_hw, _infer_qkv_layer, _int_tuple,
                         _top_attr)

__all__ = ["WindowConfig", "SoftmaxWindowAttention", "FlattenAttentionLayouts", "WindowSetup"]

_LAYOUTS = ("tokens", "nhwc", "windows")
_GRID_ATTRS = ("input_resolution", "resolution", "hw", "grid_size", "grid", "feat_size")
_WINDOW_ATTRS = ("window_size", "window", "win_size", "ws")
_SHIFT_ATTRS = ("shift_size", "shift", "shift_len", "displacement")


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """Options of :func:`refimpl.attention.softmax.window_attention` as one configuration (square windows).

    dim, num_heads : C and h.  window_size, shift : ws and the cyclic shift (0 <= shift < ws; Swin: 0 or ws // 2).
    rel_pos_bias, mask_padding, mask_value : the options of :mod:`refimpl.attention.softmax` (presets: "official" =
    Swin's released masking, -100 additive, padded keys unmasked; "paper" = exact exclusion, padded keys masked;
    "l2vit_official" = L2ViT's local windows, no bias, no shift).  qkv_bias, proj_bias : whether the projections
    have biases.  scale : the logits' scale, None for d^-1/2."""

    dim: int
    num_heads: int
    window_size: int = 7
    shift: int = 0
    rel_pos_bias: bool = True
    mask_padding: bool = False
    mask_value: float | None = _cfg.SWIN_MASK_VALUE_OFFICIAL
    qkv_bias: bool = True
    proj_bias: bool = True
    scale: float | None = None

    PRESETS = {"official": "swin_official", "paper": "swin", "l2vit_official": "l2vit_official"}

    def __post_init__(self) -> None:
        for name in ("dim", "num_heads", "window_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim = {self.dim} is not divisible by num_heads = {self.num_heads}")
        if isinstance(self.shift, bool) or not isinstance(self.shift, (int, np.integer)) or \
                not 0 <= self.shift < self.window_size:
            raise ValueError(f"shift: expected 0 <= shift < window_size = {self.window_size}, got {self.shift!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "WindowConfig":
        opts = dict(r_soft.WINDOW_PRESETS[cls.PRESETS[name]])
        opts.update(overrides)
        return cls(**opts)

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``window_attention`` (and its bound and stages)."""
        return dict(num_heads=self.num_heads, window_size=self.window_size, shift=self.shift, pad=True,
                    rel_pos_bias=self.rel_pos_bias, mask_padding=self.mask_padding, mask_value=self.mask_value,
                    scale=self.scale)


@dataclasses.dataclass
class WindowSetup(Setup):
    """A :class:`Setup` for a module that shifts and cuts the grid itself: the window, the shift, the foreign input
    layout, whether its forward takes (H, W), and the configuration fields that are not the reference config's."""

    window: int = 1
    shift: int = 0
    layout: str = "nhwc"
    hw_args: bool = False
    grid_fixed: bool = False
    #: why ``--grad`` is refused (no PyTorch twin of this layout), or ""
    no_twin: str = ""


def _square(v: Any, name: str) -> int | None:
    """An int, or a pair of equal ints, as one int; None for anything else."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in v):
        if v[0] != v[1]:
            raise VerifyError(f"config: {name} {tuple(v)} is not square; the shifted-window references take square "
                              f"windows")
        return int(v[0])
    return None


def _forward_takes_mask(module: Any) -> bool:
    """Whether the module's forward has a parameter ``mask`` / ``attn_mask`` (Swin's ``WindowAttention(x, mask)``)."""
    try:
        return bool({"mask", "attn_mask"} & set(inspect.signature(module.forward).parameters))
    except (TypeError, ValueError):
        return False


def _geometry(module: Any, over: dict[str, Any], hw: Any, fields: dict[str, str], pe_tokens: int | None = None,
              windows: bool = True) -> tuple[int, int, str, bool, tuple[int, int], bool]:
    """(window, shift, layout, forward takes (H, W), grid, grid fixed by the module) from ``--config`` (popped from
    ``over``), the module's attributes and ``hw``; ``windows``: the pre-windowed layout is allowed."""
    ws = over.pop("window_size", None)
    if ws is not None:
        fields["window_size"] = "--config"
    elif (got := _top_attr(module, _WINDOW_ATTRS, lambda v: _square(v, "window_size") is not None)) is not None:
        ws, fields["window_size"] = got[0], f"module attribute {got[1]}"
    elif pe_tokens is not None and int(round(pe_tokens ** 0.5)) ** 2 == pe_tokens:
        ws, fields["window_size"] = int(round(pe_tokens ** 0.5)), f"positional encoding covers {pe_tokens} tokens"
    else:
        raise VerifyError("config: cannot infer 'window_size' (no module attribute window_size/window/win_size); give "
                          "--config '{\"window_size\": ws}'")
    ws = _square(ws, "window_size")
    sh = over.pop("shift", None)
    if sh is not None:
        fields["shift"] = "--config"
    elif (got := _top_attr(module, _SHIFT_ATTRS, lambda v: _square(v, "shift") is not None)) is not None:
        sh, fields["shift"] = got[0], f"module attribute {got[1]}"
    else:
        sh, fields["shift"] = 0, "no module attribute shift_size/shift: unshifted"
    sh = _square(sh, "shift")
    if ws is None or ws < 1 or sh is None or not 0 <= sh < ws:
        raise VerifyError(f"config: expected window_size >= 1 and 0 <= shift < window_size, got window_size {ws!r}, "
                          f"shift {sh!r}")
    grid_attr = _top_attr(module, _GRID_ATTRS, lambda v: _int_tuple(v, 2))
    takes_hw = _forward_takes_hw(module)
    layout = over.pop("layout", None)
    allowed = _LAYOUTS if windows else _LAYOUTS[:2]
    if layout is not None:
        if layout not in allowed:
            raise VerifyError(f"argument 'config': layout expected one of {allowed}, got {layout!r}")
        fields["layout"] = "--config"
    elif windows and _forward_takes_mask(module):
        layout = "windows"
        fields["layout"] = ("windows (B nW, ws^2, C) of the shifted grid: the forward takes the mask (Swin's "
                            "WindowAttention(x, mask))")
    elif takes_hw or grid_attr is not None:
        layout = "tokens"
        fields["layout"] = ("tokens (B, H W, C): the forward takes (x, H, W)" if takes_hw else
                            f"tokens (B, H W, C): the module names its grid ({grid_attr[1]})")
    else:
        layout, fields["layout"] = "nhwc", "channels-last (B, H, W, C): the forward takes x alone"
    fixed = False
    if hw is not None:
        g, fields["hw"] = (int(hw[0]), int(hw[1])), "--hw"
        if grid_attr is not None and tuple(grid_attr[0]) != g and not takes_hw and layout != "windows":
            raise VerifyError(f"argument 'hw': {g} disagrees with the module's {grid_attr[1]} = {tuple(grid_attr[0])}")
    elif grid_attr is not None and layout != "windows":
        g, fields["hw"] = tuple(int(t) for t in grid_attr[0]), f"module attribute {grid_attr[1]}"
        fixed = not takes_hw
    else:
        g, fields["hw"] = (2 * ws, 2 * ws), f"default (2 x the window, {2 * ws} x {2 * ws})"
    if layout == "windows" and (g[0] % ws or g[1] % ws):
        raise VerifyError(f"argument 'hw': pre-windowed input needs a grid that is a multiple of the window {ws}, "
                          f"got {g} ({fields['hw']})")
    return ws, sh, layout, takes_hw, g, fixed


def _to_grid(x: np.ndarray, s: WindowSetup) -> np.ndarray:
    """The foreign input (or output) as the grid (B, H, W, C): tokens reshaped; windows (of the grid rolled by
    -shift) merged and rolled back."""
    if s.layout == "windows":
        g = layers.window_reverse(x, s.window, s.hw[0], s.hw[1])
        return np.roll(g, (s.shift, s.shift), axis=(1, 2)) if s.shift else g
    return x.reshape(x.shape[0], s.hw[0], s.hw[1], x.shape[-1]) if s.layout == "tokens" else x


def _from_grid(g: np.ndarray, s: WindowSetup) -> np.ndarray:
    """The inverse of :func:`_to_grid`."""
    if s.layout == "windows":
        return layers.window_partition(np.roll(g, (-s.shift, -s.shift), axis=(1, 2)) if s.shift else g, s.window)
    return g.reshape(g.shape[0], g.shape[1] * g.shape[2], g.shape[3]) if s.layout == "tokens" else g


def _bound_in_layout(b: Bound, s: WindowSetup) -> Bound:
    """``b`` (of a (B, N, C) or (B, H, W, C) output) with its arrays in the foreign layout."""
    def fix(a: Any) -> Any:
        if a is None or np.ndim(a) < 3:
            return a
        a = np.asarray(a)
        if s.layout == "nhwc" and a.ndim == 3:
            a = a.reshape(a.shape[0], s.hw[0], s.hw[1], a.shape[-1])
        return _from_grid(a, s) if a.ndim == 4 else a
    return dataclasses.replace(b, scale=fix(b.scale), sigma=fix(b.sigma), ref_scale=fix(b.ref_scale))


def _window_step(s: Any) -> int | None:
    """The grid step of a shifted-window module (``verify_examples``): the window, or None when the module fixes its
    grid; ``s`` a :class:`WindowSetup` or the configuration read back from a report (its ``grid_fixed``)."""
    if getattr(s, "grid_fixed", False) or getattr(s.cfg, "grid_fixed", False):
        return None
    return int(getattr(s, "window", 0) or s.cfg.window_size)


_EXACT = "padding, cyclic shift and window partition / reverse: exact data movement"


def _data_stages(s: WindowSetup, pad: bool, per_window: list[Stage]) -> list[Stage]:
    """``windows`` (x -> the padded, shifted windows), the reference's per-window stages with their first stage
    reading ``windows``, and ``out`` (proj -> the grid, rolled back and cropped, in the foreign layout)."""
    ws, sh = s.window, s.shift
    big_h, big_w = s.hw
    hp, wp = (-(-big_h // ws) * ws, -(-big_w // ws) * ws) if pad else (big_h, big_w)

    def windows(x):
        g = _to_grid(x, s)
        if pad:
            g, _ = layers.pad_to_multiple(g, ws)
        if sh:
            g = np.roll(g, (-sh, -sh), axis=(1, 2))
        return layers.window_partition(g, ws)

    def out(p):
        g = layers.window_reverse(p, ws, hp, wp)
        if sh:
            g = np.roll(g, (sh, sh), axis=(1, 2))
        return _from_grid(g[:, :big_h, :big_w], s)

    def exact(*_t, dtype=None):
        return Bound(np.zeros(1), 1.0, _EXACT)

    first = dataclasses.replace(per_window[0], inputs=tuple("windows" if i == "x" else i for i in per_window[0].inputs))
    return ([Stage("windows", ("x",), windows, exact, f"Swin §3.2, Fig. 4: pad, roll by -{sh}, partition into "
                                                      f"{ws} x {ws} windows")] + [first] + per_window[1:] +
            [Stage("out", ("proj",), out, exact, f"Swin §3.2: merge the windows, roll by +{sh}, crop")])


def _scalar(v: Any) -> str:
    return str(v.item() if hasattr(v, "item") else v)


class _ShiftedWindows(Reference):
    """What both shifted-window references share: the foreign layout and call, the input, the grid step, the
    stages located by value, the derived buffers."""

    def draw_input(self, s, batch, rng):
        c = s.shapes["proj.weight"][0]
        n_w = (s.hw[0] // s.window) * (s.hw[1] // s.window)
        shape = {"tokens": (batch, s.hw[0] * s.hw[1], c), "nhwc": (batch, s.hw[0], s.hw[1], c),
                 "windows": (batch * n_w, s.window ** 2, c)}[s.layout]
        return rng.standard_normal(shape)

    def call(self, s, call):
        if call is None and s.layout == "windows":     # Swin's additive mask for the windows of the shifted grid
            if not s.shift:
                return (), {"mask": None}
            keep = layers.shifted_window_mask(s.hw[0], s.hw[1], s.window, s.shift)
            value = -np.inf if s.cfg.mask_value is None else s.cfg.mask_value
            return (), {"mask": np.where(keep, 0.0, value)}
        if call is None:
            return ((s.hw[0], s.hw[1]) if s.hw_args else ()), {}
        subs = {"$H": s.hw[0], "$W": s.hw[1], "$HW": list(s.hw)}
        return (), {k: subs.get(v, v) if isinstance(v, str) else v for k, v in call.items()}

    def grid_step(self, s):
        return _window_step(s)

    def value_shapes(self, s, x):
        return [tuple(x.shape)]

    def derived_findings(self, s: WindowSetup, state: Mapping[str, np.ndarray], keys: list[str]) -> list[dict]:
        """Each foreign derived buffer named like a relative-position index or an attention mask against the value
        recomputed from the configuration: a finding per buffer that differs (its first differing entry)."""
        ws, sh = s.window, s.shift
        hp, wp = -(-s.hw[0] // ws) * ws, -(-s.hw[1] // ws) * ws
        out: list[dict] = []
        for k in keys:
            leaf = k.rpartition(".")[2].lower()
            arr = np.asarray(state[k])
            if "index" in leaf and ("rel" in leaf or "pos" in leaf or "rp" in leaf):
                ours = layers.relative_position_index(ws, ws)
                what = f"relative-position index of the {ws} x {ws} window"
                given = arr
                desc = (lambda a, i: str(int(a[i])))
            elif "mask" in leaf:
                ours = layers.shifted_window_mask(hp, wp, ws, sh)
                what = f"shifted-window mask of the {hp} x {wp} grid, window {ws}, shift {sh}"
                given = arr.reshape(arr.shape[0], *arr.shape[-2:]) if arr.ndim >= 3 else arr
                if given.dtype == bool:
                    given = given if np.sum(given == ours) >= np.sum(given != ours) else ~given
                else:
                    given = given == 0
                desc = (lambda a, i: "attend" if a[i] else "masked")
            else:
                continue
            if given.shape != ours.shape:
                out.append({"kind": "derived buffer", "message": f"derived buffer {k!r} ({what}) has shape "
                                                                 f"{tuple(arr.shape)}; recomputed: {ours.shape}"})
                continue
            bad = given != ours
            if bad.any():
                i = tuple(int(t) for t in np.argwhere(bad)[0])
                at = (f"(window {i[0]}, query {i[1]}, key {i[2]})" if len(i) == 3 else
                      f"(query {i[0]}, key {i[1]})")
                out.append({"kind": "derived buffer", "message": (
                    f"derived buffer {k!r} ({what}) differs from the value recomputed from the configuration: "
                    f"{int(bad.sum())} of {bad.size} entries, first at {at}: given {desc(given, i)} "
                    f"({_scalar(arr.reshape(given.shape)[i])}), recomputed {desc(ours, i)}")})
        return out


class SoftmaxWindowAttention(_ShiftedWindows):
    """Swin's (shifted) window attention on the whole grid (:func:`refimpl.attention.softmax.window_attention`):
    the foreign module pads, rolls, partitions, attends per window with the relative-position bias and the shift
    mask, projects, merges and rolls back.  Stages ``windows``, ``qkv``, ``core`` (SoftMax(Q K^T / sqrt(d) + B +
    mask) V: where the bias and the mask enter), ``proj``, ``out``."""

    name = "softmax.window_attention"
    summary = ("Swin (shifted) window attention on the grid: pad, cyclic shift, windows, qkv, SoftMax(QK^T/sqrt(d) "
               "+ B + mask) V, proj, reverse (Swin Eq. 4, Fig. 4); tokens (B, HW, C), (B, H, W, C), or the windows with "
               "the mask passed to forward(x, mask)")
    presets = ("official", "paper", "l2vit_official")
    structural = frozenset({"dim", "num_heads", "window_size", "shift", "qkv_bias", "proj_bias"})
    aliases = {"qkv": _QKV_ALIASES, "proj": _PROJ_ALIASES,
               "relative_position_bias_table": ("relative_position_bias_table", "rel_bias", "rel_pos_bias",
                                                "rpb", "bias_table", "relative_bias", "pos_bias", "rel_table")}
    joined = {"qkv": _SPLIT_QKV}
    value_stages = ("out",)

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        geo = {k: over.pop(k) for k in ("layout",) if k in over}
        _check_options(WindowConfig, preset, self.presets, self.name, over)
        _infer_qkv_layer(module, state, self.name, over, inferred, fields)
        ws, sh, layout, takes_hw, g, fixed = _geometry(module, {**over, **geo}, hw, fields)
        for k, v in (("window_size", ws), ("shift", sh)):
            if k not in over:
                inferred[k] = v
        if "rel_pos_bias" not in over:
            inferred["rel_pos_bias"] = bool(_find(state, self.aliases["relative_position_bias_table"], ""))
            fields["rel_pos_bias"] = "presence of a relative-position bias table"
        if "proj_bias" not in over:
            inferred["proj_bias"] = bool(_find(state, self.aliases["proj"], "bias"))
            fields["proj_bias"] = "presence of a projection bias"
        if "scale" not in over and (got := _top_attr(module, ("scale", "qk_scale"),
                                                      lambda v: isinstance(v, (int, float)) and v > 0)) is not None:
            d = over.get("dim", inferred["dim"]) // over.get("num_heads", inferred["num_heads"])
            if abs(float(got[0]) - d ** -0.5) > 1e-12 * d ** -0.5:
                inferred["scale"] = float(got[0])
            fields["scale"] = f"module attribute {got[1]}"
        cfg = _config(WindowConfig, preset, self.presets, self.name, inferred, over, fields)
        ws, sh = cfg.window_size, cfg.shift
        c = cfg.dim
        shapes = {"qkv.weight": (3 * c, c), "proj.weight": (c, c)}
        if cfg.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
        if cfg.proj_bias:
            shapes["proj.bias"] = (c,)
        if cfg.rel_pos_bias:
            shapes["relative_position_bias_table"] = ((2 * ws - 1) ** 2, cfg.num_heads)
        points = {"windows": Point("qkv", "input"), "qkv": Point("qkv", "output"), "core": Point("proj", "input"),
                  "proj": Point("proj", "output")}
        if layout == "windows":
            del points["windows"]                       # the module's input is the windows
        return WindowSetup(cfg, fields, g, shapes, points, [], window=ws, shift=sh, layout=layout, hw_args=takes_hw,
                           grid_fixed=fixed, extra={"layout": layout, "grid_fixed": fixed},
                           no_twin="no PyTorch twin of Swin's window attention is registered")

    def preset_config(self, preset, s):
        return WindowConfig.preset(preset, dim=s.cfg.dim, num_heads=s.cfg.num_heads, window_size=s.cfg.window_size)

    def forward(self, x, params, s):
        return _from_grid(r_soft.window_attention(_to_grid(x, s), params, **s.cfg.options()), s)

    def bound(self, x, params, s, dtype):
        return _bound_in_layout(r_soft.window_attention_bound(_to_grid(x, s), params, dtype=dtype,
                                                              **s.cfg.options()), s)

    def stages(self, params, s):
        per_window = r_soft.window_attention_stages(params, s.hw, **s.cfg.options())
        return per_window if s.layout == "windows" else _data_stages(s, True, per_window)


class FlattenAttentionLayouts(FlattenAttention):
    """``flatten.attention``: the DeiT / PVT global layout and the pre-windowed Swin layout
    (:class:`FlattenAttention`), and the Swin layout on the whole grid with its cyclic shift and shift mask
    (:func:`refimpl.attention.focused.focused_window_attention`), taken when ``--config`` names ``window_size``,
    ``shift`` or ``layout``, or the module has a ``shift_size`` / ``shift`` attribute."""

    summary = FlattenAttention.summary + "; or the Swin layout on the grid with cyclic shift and shift mask"
    aliases = {**FlattenAttention.aliases, "qkv": _QKV_ALIASES}
    value_stages = FlattenAttention.value_stages + ("out",)
    structural = FlattenAttention.structural | {"window_size", "shift", "layout"}

    @staticmethod
    def _windowed(module: Any, over: Mapping[str, Any]) -> bool:
        return bool({"window_size", "shift", "layout"} & set(over)) or \
            _top_attr(module, ("shift_size", "shift"), lambda v: _square(v, "shift") is not None) is not None

    def setup(self, module, state, preset, config, hw):
        over = dict(config or {})
        if not self._windowed(module, over):
            return super().setup(module, state, preset, over, hw)
        geo = {k: over.pop(k) for k in ("window_size", "shift", "layout") if k in over}
        fields: dict[str, str] = {}
        pe = _find(state, self.aliases["positional_encoding"], "")
        pe_tokens = int(state[pe[0]].shape[1]) if len(pe) == 1 and state[pe[0]].ndim == 3 else None
        ws, sh, layout, takes_hw, g, fixed = _geometry(module, geo, hw, fields, pe_tokens, windows=False)
        if g[0] % ws or g[1] % ws:
            raise VerifyError(f"argument 'hw': the grid {g} ({fields['hw']}) is not a multiple of the window {ws} "
                              f"(FLatten's Swin layout does not pad)")
        if over.get("sr_ratio", 1) != 1:
            raise VerifyError("argument 'config': the Swin layout has no spatial reduction (sr_ratio = 1)")
        base = super().setup(module, state, preset, {**over, "sr_ratio": 1}, (ws, ws))
        fields = {**{k: v for k, v in base.fields.items() if k != "hw"}, **fields}
        fields["sr_ratio"] = "the Swin layout"
        cfg = base.cfg
        shapes = r_foc.focused_param_shapes(cfg, layout="window", n_kv=ws * ws)
        points = {"windows": Point("qkv", "input"), "qkv": Point("qkv", "output"), "dwc_in": Point("dwc", "input"),
                  "dwc": Point("dwc", "output"), "core": Point("proj", "input"), "proj": Point("proj", "output")}
        return WindowSetup(cfg, fields, g, shapes, points, [], window=ws, shift=sh, layout=layout, hw_args=takes_hw,
                           grid_fixed=fixed, extra={"window_size": ws, "shift": sh, "layout": layout,
                                                    "grid_fixed": fixed},
                           no_twin="no PyTorch twin of FLatten's attention on the shifted grid is registered")

    def _w(self, s: Setup) -> bool:
        return isinstance(s, WindowSetup)

    def draw_input(self, s, batch, rng):
        return _ShiftedWindows.draw_input(self, s, batch, rng) if self._w(s) else super().draw_input(s, batch, rng)

    def call(self, s, call):
        return _ShiftedWindows.call(self, s, call) if self._w(s) else super().call(s, call)

    def grid_step(self, s):
        if self._w(s) or hasattr(s.cfg, "window_size"):
            return _window_step(s)
        return super().grid_step(s)

    def value_shapes(self, s, x):
        return [tuple(x.shape)] if self._w(s) else super().value_shapes(s, x)

    def derived_findings(self, s, state, keys):
        return _ShiftedWindows.derived_findings(self, s, state, keys) if self._w(s) else []

    def _tokens(self, x, s):
        return x.reshape(x.shape[0], -1, x.shape[-1])

    def forward(self, x, params, s):
        if not self._w(s):
            return super().forward(x, params, s)
        y = r_foc.focused_window_attention(self._tokens(x, s), params, s.cfg, s.hw, window_size=s.window,
                                           shift=s.shift)
        return y.reshape(x.shape)

    def bound(self, x, params, s, dtype):
        if not self._w(s):
            return super().bound(x, params, s, dtype)
        b = r_foc.focused_window_attention_bound(self._tokens(x, s), params, s.cfg, s.hw, window_size=s.window,
                                                 shift=s.shift, dtype=dtype)
        return _bound_in_layout(b, s)

    def stages(self, params, s):
        if not self._w(s):
            return super().stages(params, s)
        per_window = r_foc.focused_window_attention_stages(params, s.cfg, s.hw, window_size=s.window,
                                                           shift=s.shift, fine=True)
        return _data_stages(s, False, per_window)
