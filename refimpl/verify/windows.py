"""Shifted-window references for foreign modules that take the whole token grid and do Swin's cyclic shift, window
partition, attention mask and window reverse themselves, or Swin's pre-windowed ``WindowAttention(x, mask)``.

Layer: the verify tool (NumPy; the foreign module is only inspected here; torch only in the ``--grad`` adapters at
the end).  Two references:

- ``softmax.window_attention``: Swin's (shifted) window attention (:func:`refimpl.attention.softmax.window_attention`;
  Swin §3.2, Eq. 4, Fig. 4): pad, roll by -shift, partition, per window qkv, SoftMax(Q K^T / sqrt(d) + B + mask) V,
  proj, reverse, roll by +shift, crop;
- ``flatten.attention`` in the Swin layout on the whole grid (:func:`refimpl.attention.focused.focused_window_attention`;
  FLatten §4.3): the same geometry around the focused linear attention of each window, the shift mask applied
  (preset ``paper``) or ignored (``official``, as released); no padding.  The pre-windowed layout (windows as the
  batch) and the DeiT / PVT global layout stay with :class:`refimpl.verify.references.FlattenAttention`; the window
  layout is taken when ``--config`` names ``window_size`` / ``shift`` / ``layout`` or the module has a
  ``shift_size`` (or ``shift``) attribute.

Windows and shifts are an int or a pair (wh, ww), (sh, sw) (the references take both): ``--config``
(``window_size``, ``shift``), else the module attributes ``window_size`` / ``shift_size`` (Swin's names; a tuple
attribute included), else FLatten's positional encoding (n = ws^2 tokens, square) and shift 0.

The foreign input is tokens (B, H W, C) (``layout`` "tokens": the grid from ``--hw``, a module attribute
``input_resolution`` / ``resolution`` / ..., and ``forward(x, H, W)`` when the forward takes them) or channels-last
(B, H, W, C) (``layout`` "nhwc", the default when the forward takes x alone and the module names no grid); for
``softmax.window_attention`` also Swin's pre-windowed input (``layout`` "windows", inferred from a ``mask``
parameter of the forward: ``WindowAttention(x, mask)`` on the windows (B nW, wh ww, C) of the grid zero-padded to
window multiples and shifted, as Swin's block forms them, the verifier passing the additive mask of the padded grid;
stages ``qkv``, ``core``, ``proj`` on every window token; the whole output read as the grid, cropped to ``--hw``:
:meth:`_ShiftedWindows.output_view`).

Stages, in the order the module computes them: ``windows`` (the padded, shifted grid cut into windows: exact data
movement, observed at the qkv projection's input, so a roll in the wrong direction is found there), the
reference's per-window stages (``qkv``; ``core`` for softmax, where the relative-position bias and the shift mask
enter; FLatten's ``phi_q``, ``phi_k``, ``attention`` (the mask enters here), ``dwc_in``, ``dwc``, ``core``; ``proj``),
then ``out`` (the windows merged, rolled back and cropped: located by value among the forward's tensors).

Derived buffers (:meth:`_ShiftedWindows.derived_findings`): a foreign integer buffer named like a relative-position
index is compared exactly with :func:`refimpl.layers.relative_position_index` of the (wh, ww) window; a buffer named
like a mask (float: 0 = attend, anything else = masked; bool: True = attend, or the inverse convention throughout)
with :func:`refimpl.layers.shifted_window_mask` of the padded grid.  A difference is a finding naming the buffer and
its first differing entry.

``--grad``: the package's twins (:func:`twin_softmax_window`, :func:`twin_focused_window`, which take the (wh, ww)
window and the (sh, sw) shift) between the layout's data movement in torch; refused (``WindowSetup.no_twin``) where
the reference's gradient is not defined: the paper preset's padded query rows whose every key is masked.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import numpy as np

from .. import config as _cfg
from .. import layers
from ..attention import focused as r_foc
from ..attention import softmax as r_soft
from ..verdict import Bound, Stage, unit_roundoff
from .loading import VerifyError
from .references import (FlattenAttention, Point, Reference, Setup, _PROJ_ALIASES, _QKV_ALIASES, _SPLIT_QKV,
                         _check_options, _config, _find, _forward_takes_hw, _infer_qkv_layer, _int_tuple,
                         _top_attr)

__all__ = ["WindowConfig", "SoftmaxWindowAttention", "FlattenAttentionLayouts", "WindowSetup"]

_LAYOUTS = ("tokens", "nhwc", "windows")
_GRID_ATTRS = ("input_resolution", "resolution", "hw", "grid_size", "grid", "feat_size")
_WINDOW_ATTRS = ("window_size", "window", "win_size", "ws")
_SHIFT_ATTRS = ("shift_size", "shift", "shift_len", "displacement")


def _pair(v: Any) -> tuple[int, int] | None:
    """An int n as (n, n), a pair of ints as a tuple; None for anything else."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in v):
        return int(v[0]), int(v[1])
    return None


def _compact(p: tuple[int, int]) -> int | tuple[int, int]:
    """A pair as the configuration reports it: one int where both axes agree (Swin's square windows)."""
    return p[0] if p[0] == p[1] else (p[0], p[1])


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """Options of :func:`refimpl.attention.softmax.window_attention` as one configuration.

    dim, num_heads : C and h.  window_size, shift : the window, an int ws or a pair (wh, ww), and the cyclic shift,
    an int or a pair (sh, sw), 0 <= shift < window on each axis (Swin: 0 or ws // 2).
    rel_pos_bias, mask_padding, mask_value : the options of :mod:`refimpl.attention.softmax` (presets: "official" =
    Swin's released masking, -100 additive, padded keys unmasked; "paper" = exact exclusion, padded keys masked;
    "l2vit_official" = L2ViT's local windows, no bias, no shift).  qkv_bias, proj_bias : whether the projections
    have biases.  scale : the logits' scale, None for d^-1/2."""

    dim: int
    num_heads: int
    window_size: int | tuple[int, int] = 7
    shift: int | tuple[int, int] = 0
    rel_pos_bias: bool = True
    mask_padding: bool = False
    mask_value: float | None = _cfg.SWIN_MASK_VALUE_OFFICIAL
    qkv_bias: bool = True
    proj_bias: bool = True
    scale: float | None = None

    PRESETS = {"official": "swin_official", "paper": "swin", "l2vit_official": "l2vit_official"}

    def __post_init__(self) -> None:
        """Raises ValueError for a dim or num_heads that is not an integer >= 1, a dim not divisible by num_heads, a
        window below 1 or a shift outside 0 <= shift < window on an axis."""
        for name in ("dim", "num_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim = {self.dim} is not divisible by num_heads = {self.num_heads}")
        ws, sh = _pair(self.window_size), _pair(self.shift)
        if ws is None or min(ws) < 1:
            raise ValueError(f"window_size: expected an integer >= 1 or a pair (wh, ww) of them, got "
                             f"{self.window_size!r}")
        if sh is None or not (0 <= sh[0] < ws[0] and 0 <= sh[1] < ws[1]):
            raise ValueError(f"shift: expected 0 <= shift < window_size = {self.window_size!r} on each axis (an int "
                             f"or a pair (sh, sw)), got {self.shift!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "WindowConfig":
        """The configuration of preset ``name`` ("official", "paper", "l2vit_official": the options of
        :data:`refimpl.attention.softmax.WINDOW_PRESETS`) with ``overrides`` replacing its fields."""
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
    """A :class:`Setup` for a module that shifts and cuts the grid itself: the window (wh, ww), the shift (sh, sw),
    the foreign input layout, whether its forward takes (H, W), and the configuration fields that are not the
    reference config's.  ``hw`` is the grid before padding (the pre-windowed layout's windows cover
    :attr:`padded`)."""

    window: tuple[int, int] = (1, 1)
    shift: tuple[int, int] = (0, 0)
    layout: str = "nhwc"
    hw_args: bool = False
    grid_fixed: bool = False
    #: why ``--grad`` is refused (the reference's gradient is not defined in this configuration), or ""
    no_twin: str = ""

    @property
    def padded(self) -> tuple[int, int]:
        """The grid padded at the bottom and right to multiples of the window (Swin's rule)."""
        return -(-self.hw[0] // self.window[0]) * self.window[0], -(-self.hw[1] // self.window[1]) * self.window[1]


def _default_scale_slack() -> float:
    """How far, relative, a module's ``scale`` attribute may be from ``d ** -0.5`` and still be the default
    d^-1/2 (no ``scale`` in the configuration): two float64 evaluations of d^-1/2, the module's and ours, each a
    power (config.ELEMENTARY_FUNCTION_ULPS u_64, the libm accuracy assumed) or a square root and a reciprocal (two
    correctly rounded operations, 2 u_64, below it), differ by at most twice the larger.  A value farther away is
    the module's own scale, and the reference then uses it exactly."""
    u64 = unit_roundoff("float64")
    return 2 * max(_cfg.ELEMENTARY_FUNCTION_ULPS * u64, 2 * u64)


def _forward_takes_mask(module: Any) -> bool:
    """Whether the module's forward has a parameter ``mask`` / ``attn_mask`` (Swin's ``WindowAttention(x, mask)``)."""
    try:
        return bool({"mask", "attn_mask"} & set(inspect.signature(module.forward).parameters))
    except (TypeError, ValueError):
        return False


def _geometry(module: Any, over: dict[str, Any], hw: Any, fields: dict[str, str], pe_tokens: int | None = None,
              windows: bool = True) -> tuple[tuple[int, int], tuple[int, int], str, bool, tuple[int, int], bool]:
    """(window (wh, ww), shift (sh, sw), layout, forward takes (H, W), grid, grid fixed by the module) from
    ``--config`` (popped from ``over``), the module's attributes and ``hw``; ``windows``: the pre-windowed layout
    is allowed.  A window or shift is an int or a pair (a tuple attribute ``window_size = (wh, ww)``)."""
    ws = over.pop("window_size", None)
    if ws is not None:
        fields["window_size"] = "--config"
    elif (got := _top_attr(module, _WINDOW_ATTRS, lambda v: _pair(v) is not None)) is not None:
        ws, fields["window_size"] = got[0], f"module attribute {got[1]}"
    elif pe_tokens is not None and int(round(pe_tokens ** 0.5)) ** 2 == pe_tokens:
        ws, fields["window_size"] = int(round(pe_tokens ** 0.5)), f"positional encoding covers {pe_tokens} tokens"
    else:
        raise VerifyError("config: cannot infer 'window_size' (no module attribute window_size/window/win_size); give "
                          "--config '{\"window_size\": ws}' or '{\"window_size\": [wh, ww]}'")
    sh = over.pop("shift", None)
    if sh is not None:
        fields["shift"] = "--config"
    elif (got := _top_attr(module, _SHIFT_ATTRS, lambda v: _pair(v) is not None)) is not None:
        sh, fields["shift"] = got[0], f"module attribute {got[1]}"
    else:
        sh, fields["shift"] = 0, "no module attribute shift_size/shift: unshifted"
    wp_, sp_ = _pair(ws), _pair(sh)
    if wp_ is None or min(wp_) < 1 or sp_ is None or not (0 <= sp_[0] < wp_[0] and 0 <= sp_[1] < wp_[1]):
        raise VerifyError(f"config: expected window_size >= 1 and 0 <= shift < window_size on each axis (ints or "
                          f"pairs (wh, ww), (sh, sw)), got window_size {ws!r}, shift {sh!r}")
    ws, sh = wp_, sp_
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
        fields["layout"] = ("windows (B nW, wh ww, C) of the padded, shifted grid: the forward takes the mask "
                            "(Swin's WindowAttention(x, mask))")
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
        g, fields["hw"] = (2 * ws[0], 2 * ws[1]), f"default (2 x the window, {2 * ws[0]} x {2 * ws[1]})"
    return ws, sh, layout, takes_hw, g, fixed


def _perm(x: Any, axes: tuple[int, ...]) -> Any:
    return x.permute(*axes) if hasattr(x, "permute") else x.transpose(axes)


def _roll(x: Any, shift: tuple[int, int]) -> Any:
    """x (B, H, W, C) rolled by ``shift`` over the grid axes (NumPy or torch)."""
    if not any(shift):
        return x
    if hasattr(x, "permute"):
        import torch
        return torch.roll(x, shifts=tuple(shift), dims=(1, 2))
    return np.roll(x, tuple(shift), axis=(1, 2))


def _partition(g: Any, ws: tuple[int, int]) -> Any:
    """(B, Hp, Wp, C), Hp and Wp multiples of the window -> (B nW, wh ww, C), windows and tokens row-major."""
    b, h, w, c = g.shape
    t = _perm(g.reshape(b, h // ws[0], ws[0], w // ws[1], ws[1], c), (0, 1, 3, 2, 4, 5))
    return t.reshape(-1, ws[0] * ws[1], c)


def _reverse(x: Any, ws: tuple[int, int], hp: int, wp: int) -> Any:
    """The inverse of :func:`_partition` on the (Hp, Wp) grid."""
    c = x.shape[-1]
    b = x.shape[0] // ((hp // ws[0]) * (wp // ws[1]))
    return _perm(x.reshape(b, hp // ws[0], wp // ws[1], ws[0], ws[1], c), (0, 1, 3, 2, 4, 5)).reshape(b, hp, wp, c)


def _to_grid(x: Any, s: WindowSetup) -> Any:
    """The foreign input (or output) as the grid (B, H, W, C), NumPy or torch: tokens reshaped; windows (of the
    padded grid rolled by -shift) merged, rolled back and cropped to the grid."""
    if s.layout == "windows":
        g = _roll(_reverse(x, s.window, *s.padded), s.shift)
        return g[:, :s.hw[0], :s.hw[1]]
    return x.reshape(x.shape[0], s.hw[0], s.hw[1], x.shape[-1]) if s.layout == "tokens" else x


def _from_grid(g: np.ndarray, s: WindowSetup) -> np.ndarray:
    """The inverse of :func:`_to_grid` (windows: zero-padded, rolled by -shift, partitioned)."""
    if s.layout == "windows":
        g, _ = layers.pad_to_multiple(g, s.window)
        return _partition(_roll(g, (-s.shift[0], -s.shift[1])), s.window)
    return g.reshape(g.shape[0], g.shape[1] * g.shape[2], g.shape[3]) if s.layout == "tokens" else g


def _out_layout(y: np.ndarray, s: WindowSetup) -> np.ndarray:
    """The reference's (B, H, W, C) output in the layout the whole-module comparison reads (``output_view``): the
    grid for the pre-windowed layout, the foreign layout otherwise."""
    return y if s.layout == "windows" else _from_grid(y, s)


def _bound_in_layout(b: Bound, s: WindowSetup) -> Bound:
    """``b`` (of a (B, N, C) or (B, H, W, C) output) with its arrays in the layout of :func:`_out_layout`."""
    def fix(a: Any) -> Any:
        if a is None or np.ndim(a) < 3:
            return a
        a = np.asarray(a)
        if s.layout in ("nhwc", "windows") and a.ndim == 3:
            a = a.reshape(a.shape[0], s.hw[0], s.hw[1], a.shape[-1])
        return _out_layout(a, s) if a.ndim == 4 else a
    return dataclasses.replace(b, scale=fix(b.scale), sigma=fix(b.sigma), ref_scale=fix(b.ref_scale))


def _window_step(s: Any) -> tuple[int, int] | None:
    """The grid step (wh, ww) of a shifted-window module (``verify_examples``), or None when the module fixes its
    grid; ``s`` a :class:`WindowSetup` or the configuration read back from a report (its ``grid_fixed``)."""
    if getattr(s, "grid_fixed", False) or getattr(s.cfg, "grid_fixed", False):
        return None
    return tuple(getattr(s, "window", None) or _pair(s.cfg.window_size))


_EXACT = "padding, cyclic shift and window partition / reverse: exact data movement"


def _data_stages(s: WindowSetup, pad: bool, per_window: list[Stage]) -> list[Stage]:
    """``windows`` (x -> the padded, shifted windows), the reference's per-window stages with their first stage
    reading ``windows``, and ``out`` (proj -> the grid, rolled back and cropped, in the foreign layout)."""
    ws, sh = s.window, s.shift
    big_h, big_w = s.hw
    hp, wp = s.padded if pad else s.hw

    def windows(x):
        g = _to_grid(x, s)
        if pad:
            g, _ = layers.pad_to_multiple(g, ws)
        return _partition(_roll(g, (-sh[0], -sh[1])), ws)

    def out(p):
        g = _roll(_reverse(p, ws, hp, wp), sh)
        return _from_grid(g[:, :big_h, :big_w], s)

    def exact(*_t, dtype=None):
        return Bound(np.zeros(1), 1.0, _EXACT)

    first = dataclasses.replace(per_window[0], inputs=tuple("windows" if i == "x" else i for i in per_window[0].inputs))
    return ([Stage("windows", ("x",), windows, exact, f"Swin §3.2, Fig. 4: pad, roll by -{_compact(sh)}, partition "
                                                      f"into {ws[0]} x {ws[1]} windows")] + [first] + per_window[1:] +
            [Stage("out", ("proj",), out, exact, f"Swin §3.2: merge the windows, roll by +{_compact(sh)}, crop")])


def _scalar(v: Any) -> str:
    return str(v.item() if hasattr(v, "item") else v)


def _keep(s: WindowSetup, mask_padding: bool) -> np.ndarray:
    """bool (nW, n, n) of the padded grid: the pairs Swin's shift mask keeps, and, with ``mask_padding``, only real
    (not padded) keys (:func:`refimpl.attention.softmax.window_attention`'s masks)."""
    (wh, ww), (hp, wp) = s.window, s.padded
    keep = np.ones(((hp // wh) * (wp // ww), wh * ww, wh * ww), dtype=bool)
    if any(s.shift):
        keep &= layers.shifted_window_mask(hp, wp, s.window, s.shift)
    if mask_padding and (hp, wp) != tuple(s.hw):
        real = np.zeros((1, hp, wp, 1))
        real[:, :s.hw[0], :s.hw[1]] = 1.0
        keep &= (_partition(_roll(real, (-s.shift[0], -s.shift[1])), s.window)[..., 0] > 0)[:, None, :]
    return keep


class _ShiftedWindows(Reference):
    """What both shifted-window references share: the foreign layout and call, the input, the grid step, the
    stages located by value, the derived buffers."""

    def draw_input(self, s, batch, rng):
        c = s.shapes["proj.weight"][0]
        g = rng.standard_normal((batch, s.hw[0], s.hw[1], c))
        return _from_grid(g, s)          # the pre-windowed layout: Swin's zero padding in the windows

    def call(self, s, call):
        if call is None and s.layout == "windows":     # Swin's additive mask for the windows of the shifted grid
            keep = _keep(s, s.cfg.mask_padding)
            if keep.all():
                return (), {"mask": None}
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

    def output_view(self, s, y):
        return _to_grid(y, s) if isinstance(s, WindowSetup) and s.layout == "windows" else y

    def input_view(self, s, a):
        return self.output_view(s, a)

    def _grid_in(self, x: np.ndarray, s: WindowSetup) -> np.ndarray:
        """The reference's input grid (B, H, W, C); the pre-windowed input's padded tokens must be Swin's zeros."""
        g = _to_grid(x, s)
        if s.layout == "windows" and s.padded != tuple(s.hw) and not np.array_equal(_from_grid(g, s), x):
            raise VerifyError(f"argument 'input': the windows of the padded {s.padded[0]} x {s.padded[1]} grid must "
                              f"hold zeros at the padded tokens (Swin pads the {s.hw[0]} x {s.hw[1]} grid with zeros "
                              f"before partitioning); give the grid's windows as Swin's block forms them")
        return g

    def derived_findings(self, s: WindowSetup, state: Mapping[str, np.ndarray], keys: list[str]) -> list[dict]:
        """Each foreign derived buffer named like a relative-position index or an attention mask against the value
        recomputed from the configuration: a finding per buffer that differs (its first differing entry)."""
        (wh, ww), sh = s.window, s.shift
        hp, wp = s.padded
        out: list[dict] = []
        for k in keys:
            leaf = k.rpartition(".")[2].lower()
            arr = np.asarray(state[k])
            if "index" in leaf and ("rel" in leaf or "pos" in leaf or "rp" in leaf):
                ours = layers.relative_position_index(wh, ww)
                what = f"relative-position index of the {wh} x {ww} window"
                given = arr
                desc = (lambda a, i: str(int(a[i])))
            elif "mask" in leaf:
                ours = layers.shifted_window_mask(hp, wp, (wh, ww), sh)
                what = (f"shifted-window mask of the {hp} x {wp} grid, window {_compact((wh, ww))}, shift "
                        f"{_compact(sh)}")
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
    mask) V: where the bias and the mask enter), ``proj``, ``out``.  Pre-windowed (``WindowAttention(x, mask)``):
    the windows of the padded, shifted grid in, the stages ``qkv``, ``core``, ``proj`` on every window token (padded
    ones included, as the reference computes them before its crop), the whole output read as the cropped grid."""

    name = "softmax.window_attention"
    summary = ("Swin (shifted) window attention on the grid: pad, cyclic shift, windows, qkv, SoftMax(QK^T/sqrt(d) "
               "+ B + mask) V, proj, reverse (Swin Eq. 4, Fig. 4); tokens (B, HW, C), (B, H, W, C), or the windows with "
               "the mask passed to forward(x, mask); square or (wh, ww) windows")
    presets = ("official", "paper", "l2vit_official")
    structural = frozenset({"dim", "num_heads", "window_size", "shift", "qkv_bias", "proj_bias"})
    aliases = {"qkv": _QKV_ALIASES, "proj": _PROJ_ALIASES,
               "relative_position_bias_table": ("relative_position_bias_table", "rel_bias", "rel_pos_bias",
                                                "rpb", "bias_table", "relative_bias", "pos_bias", "rel_table")}
    joined = {"qkv": _SPLIT_QKV}
    value_stages = ("out",)

    def setup(self, module, state, preset, config, hw):
        """A :class:`WindowSetup` from the module, ``--config`` and ``--hw``: the qkv layer, the window, shift, layout
        and grid (:func:`_geometry`), the bias presence and a non-default ``scale`` from the weights and attributes;
        ``no_twin`` says why ``--grad`` is refused where padded query slots have every key masked."""
        over = dict(config or {})
        fields: dict[str, str] = {}
        inferred: dict[str, Any] = {}
        geo = {k: over.pop(k) for k in ("layout",) if k in over}
        _check_options(WindowConfig, preset, self.presets, self.name, over)
        _infer_qkv_layer(module, state, self.name, over, inferred, fields)
        ws, sh, layout, takes_hw, g, fixed = _geometry(module, {**over, **geo}, hw, fields)
        over.update({k: _compact(v) for k, v in (("window_size", ws), ("shift", sh)) if k in over})
        for k, v in (("window_size", ws), ("shift", sh)):
            if k not in over:
                inferred[k] = _compact(v)
        if "rel_pos_bias" not in over:
            inferred["rel_pos_bias"] = bool(_find(state, self.aliases["relative_position_bias_table"], ""))
            fields["rel_pos_bias"] = "presence of a relative-position bias table"
        if "proj_bias" not in over:
            inferred["proj_bias"] = bool(_find(state, self.aliases["proj"], "bias"))
            fields["proj_bias"] = "presence of a projection bias"
        if "scale" not in over and (got := _top_attr(module, ("scale", "qk_scale"),
                                                      lambda v: isinstance(v, (int, float)) and v > 0)) is not None:
            d = over.get("dim", inferred["dim"]) // over.get("num_heads", inferred["num_heads"])
            if abs(float(got[0]) - d ** -0.5) > _default_scale_slack() * d ** -0.5:
                inferred["scale"] = float(got[0])
            fields["scale"] = f"module attribute {got[1]}"
        cfg = _config(WindowConfig, preset, self.presets, self.name, inferred, over, fields)
        (wh, ww), c = _pair(cfg.window_size), cfg.dim
        shapes = {"qkv.weight": (3 * c, c), "proj.weight": (c, c)}
        if cfg.qkv_bias:
            shapes["qkv.bias"] = (3 * c,)
        if cfg.proj_bias:
            shapes["proj.bias"] = (c,)
        if cfg.rel_pos_bias:
            shapes["relative_position_bias_table"] = ((2 * wh - 1) * (2 * ww - 1), cfg.num_heads)
        points = {"windows": Point("qkv", "input"), "qkv": Point("qkv", "output"), "core": Point("proj", "input"),
                  "proj": Point("proj", "output")}
        if layout == "windows":
            del points["windows"]                       # the module's input is the windows
        s = WindowSetup(cfg, fields, g, shapes, points, [], window=(wh, ww), shift=_pair(cfg.shift), layout=layout,
                        hw_args=takes_hw, grid_fixed=fixed, extra={"layout": layout, "grid_fixed": fixed})
        if layout == "windows" and s.padded != g:
            fields["hw"] += (f"; the windows cover the grid padded to {s.padded[0]} x {s.padded[1]} (Swin's zero "
                             f"padding), the output is compared on the {g[0]} x {g[1]} grid")
        dead = int(np.sum(~_keep(s, cfg.mask_padding).any(axis=-1)))
        if dead:
            s.no_twin = (f"with the padded keys masked (mask_padding) and the shift, {dead} padded query slot(s) of "
                         f"the {s.padded[0]} x {s.padded[1]} grid have every key masked: the reference's softmax is "
                         f"0/0 = NaN there (cropped from the output), and the backward carries the NaN into every "
                         f"gradient; use a grid that is a multiple of the window {s.window}")
        return s

    def preset_config(self, preset, s):
        """The preset's configuration at the module's dim, num_heads and window size, against which departures are
        reported."""
        return WindowConfig.preset(preset, dim=s.cfg.dim, num_heads=s.cfg.num_heads, window_size=s.cfg.window_size)

    def forward(self, x, params, s):
        """The reference's output: :func:`refimpl.attention.softmax.window_attention` on the input read as the grid
        (B, H, W, C), returned in the layout the whole-module comparison reads (:func:`_out_layout`)."""
        return _out_layout(r_soft.window_attention(self._grid_in(x, s), params, **s.cfg.options()), s)

    def bound(self, x, params, s, dtype):
        """The bound of :meth:`forward` in T = ``dtype`` (:func:`refimpl.attention.softmax.window_attention_bound`), its
        arrays in the layout of :func:`_out_layout`."""
        return _bound_in_layout(r_soft.window_attention_bound(self._grid_in(x, s), params, dtype=dtype,
                                                              **s.cfg.options()), s)

    def stages(self, params, s):
        """The per-window stages of :func:`refimpl.attention.softmax.window_attention_stages`; for the grid layouts
        between the exact ``windows`` and ``out`` stages (:func:`_data_stages`, padded), for the pre-windowed layout as
        they are."""
        per_window = r_soft.window_attention_stages(params, s.hw, **s.cfg.options())
        return per_window if s.layout == "windows" else _data_stages(s, True, per_window)


class FlattenAttentionLayouts(FlattenAttention):
    """``flatten.attention``: the DeiT / PVT global layout and the pre-windowed Swin layout
    (:class:`FlattenAttention`), and the Swin layout on the whole grid with its cyclic shift and shift mask
    (:func:`refimpl.attention.focused.focused_window_attention`, square or (wh, ww) windows), taken when
    ``--config`` names ``window_size``, ``shift`` or ``layout``, or the module has a ``shift_size`` / ``shift``
    attribute."""

    summary = FlattenAttention.summary + "; or the Swin layout on the grid with cyclic shift and shift mask"
    aliases = {**FlattenAttention.aliases, "qkv": _QKV_ALIASES}
    value_stages = FlattenAttention.value_stages + ("out",)
    structural = FlattenAttention.structural | {"window_size", "shift", "layout"}

    @staticmethod
    def _windowed(module: Any, over: Mapping[str, Any]) -> bool:
        return bool({"window_size", "shift", "layout"} & set(over)) or \
            _top_attr(module, ("shift_size", "shift"), lambda v: _pair(v) is not None) is not None

    def setup(self, module, state, preset, config, hw):
        """:class:`FlattenAttention`'s setup, or in the Swin layout on the grid (:meth:`_windowed`) a
        :class:`WindowSetup`: the window, shift and layout of :func:`_geometry` around the configuration of the
        window-sized FLatten setup (sr_ratio = 1).  Raises VerifyError for a grid that is not a multiple of the window
        or an sr_ratio other than 1."""
        over = dict(config or {})
        if not self._windowed(module, over):
            return super().setup(module, state, preset, over, hw)
        geo = {k: over.pop(k) for k in ("window_size", "shift", "layout") if k in over}
        fields: dict[str, str] = {}
        pe = _find(state, self.aliases["positional_encoding"], "")
        pe_tokens = int(state[pe[0]].shape[1]) if len(pe) == 1 and state[pe[0]].ndim == 3 else None
        ws, sh, layout, takes_hw, g, fixed = _geometry(module, geo, hw, fields, pe_tokens, windows=False)
        if g[0] % ws[0] or g[1] % ws[1]:
            raise VerifyError(f"argument 'hw': the grid {g} ({fields['hw']}) is not a multiple of the window "
                              f"{ws[0]} x {ws[1]} (FLatten's Swin layout does not pad)")
        if over.get("sr_ratio", 1) != 1:
            raise VerifyError("argument 'config': the Swin layout has no spatial reduction (sr_ratio = 1)")
        base = super().setup(module, state, preset, {**over, "sr_ratio": 1}, ws)
        fields = {**{k: v for k, v in base.fields.items() if k != "hw"}, **fields}
        fields["sr_ratio"] = "the Swin layout"
        cfg = base.cfg
        shapes = r_foc.focused_param_shapes(cfg, layout="window", n_kv=ws[0] * ws[1])
        points = {"windows": Point("qkv", "input"), "qkv": Point("qkv", "output"), "dwc_in": Point("dwc", "input"),
                  "dwc": Point("dwc", "output"), "core": Point("proj", "input"), "proj": Point("proj", "output")}
        s = WindowSetup(cfg, fields, g, shapes, points, [], window=ws, shift=sh, layout=layout, hw_args=takes_hw,
                        grid_fixed=fixed, extra={"window_size": _compact(ws), "shift": _compact(sh), "layout": layout,
                                                 "grid_fixed": fixed})
        return s

    def _w(self, s: Setup) -> bool:
        return isinstance(s, WindowSetup)

    def draw_input(self, s, batch, rng):
        """N(0, 1) input: the grid's layout in the Swin layout (as :class:`_ShiftedWindows` draws it), else
        :class:`FlattenAttention`'s tokens."""
        return _ShiftedWindows.draw_input(self, s, batch, rng) if self._w(s) else super().draw_input(s, batch, rng)

    def call(self, s, call):
        """The foreign forward's arguments after x: those of the grid layout (:meth:`_ShiftedWindows.call`) in the Swin
        layout, else :class:`FlattenAttention`'s."""
        return _ShiftedWindows.call(self, s, call) if self._w(s) else super().call(s, call)

    def grid_step(self, s):
        """The window (wh, ww) as the grid step (:func:`_window_step`; None where the module fixes its grid) in the Swin
        layout or for a configuration read back from a report that has a ``window_size``; else
        :class:`FlattenAttention`'s."""
        if self._w(s) or hasattr(s.cfg, "window_size"):
            return _window_step(s)
        return super().grid_step(s)

    def value_shapes(self, s, x):
        """In the Swin layout the input's shape: the stages located by value (``phi_q``, ``phi_k``, ``attention`` per
        window, ``out``) all have its number of elements; else :class:`FlattenAttention`'s."""
        return [tuple(x.shape)] if self._w(s) else super().value_shapes(s, x)

    def derived_findings(self, s, state, keys):
        """In the Swin layout the relative-position index and shift-mask buffers against their recomputed values
        (:meth:`_ShiftedWindows.derived_findings`); no findings in the other layouts."""
        return _ShiftedWindows.derived_findings(self, s, state, keys) if self._w(s) else []

    def _tokens(self, x, s):
        return x.reshape(x.shape[0], -1, x.shape[-1])

    def forward(self, x, params, s):
        """The reference's output: in the Swin layout :func:`refimpl.attention.focused.focused_window_attention` (the
        setup's window and shift) on the input's tokens, reshaped to the input's layout; else
        :class:`FlattenAttention`'s."""
        if not self._w(s):
            return super().forward(x, params, s)
        y = r_foc.focused_window_attention(self._tokens(x, s), params, s.cfg, s.hw, window_size=s.window,
                                           shift=s.shift)
        return y.reshape(x.shape)

    def bound(self, x, params, s, dtype):
        """The bound of :meth:`forward` in T = ``dtype``: in the Swin layout
        :func:`refimpl.attention.focused.focused_window_attention_bound` with its arrays in the foreign layout; else
        :class:`FlattenAttention`'s."""
        if not self._w(s):
            return super().bound(x, params, s, dtype)
        b = r_foc.focused_window_attention_bound(self._tokens(x, s), params, s.cfg, s.hw, window_size=s.window,
                                                 shift=s.shift, dtype=dtype)
        return _bound_in_layout(b, s)

    def stages(self, params, s):
        """In the Swin layout the fine per-window stages of
        :func:`refimpl.attention.focused.focused_window_attention_stages` between the exact ``windows`` and ``out``
        stages (:func:`_data_stages`, no padding); else :class:`FlattenAttention`'s."""
        if not self._w(s):
            return super().stages(params, s)
        per_window = r_foc.focused_window_attention_stages(params, s.cfg, s.hw, window_size=s.window,
                                                           shift=s.shift, fine=True)
        return _data_stages(s, False, per_window)


# ---------------------------------------------------------------------------------------------------
# --grad: the package's PyTorch twins of the two layouts between this layout's own data movement
# ---------------------------------------------------------------------------------------------------

def _twin_io(s: WindowSetup) -> tuple[Callable, Callable]:
    """(foreign input -> the grid (B, H, W, C), the twin's grid output -> the layout :func:`_out_layout` compares):
    exact data movement in torch (reshape, roll, window merge, crop), differentiable."""
    def out(y):
        return y if s.layout in ("nhwc", "windows") else y.reshape(y.shape[0], -1, y.shape[-1])
    return (lambda x: _to_grid(x, s)), out


def twin_softmax_window(s: WindowSetup) -> tuple[Any, Callable]:
    """The twin of ``softmax.window_attention`` (:class:`refimpl.twins.modules.softmax.WindowAttention`, Swin's
    padding, shift and masks on the grid) with the configuration's options, and its forward on the foreign
    layout: the (wh, ww) window and the (sh, sw) shift of the setup."""
    from refimpl.twins.modules.softmax import WindowAttention
    if s.no_twin:
        raise VerifyError(f"argument 'grad': {s.no_twin}")
    c = s.cfg
    m = WindowAttention(c.dim, c.num_heads, tuple(s.window), shift=tuple(s.shift), pad=True,
                        rel_pos_bias=c.rel_pos_bias, mask_padding=c.mask_padding, mask_value=c.mask_value,
                        qkv_bias=c.qkv_bias, proj_bias=c.proj_bias, scale=c.scale)
    to_grid, out = _twin_io(s)
    return m, lambda x: out(m(to_grid(x)))


def twin_focused_window(s: WindowSetup) -> tuple[Any, Callable]:
    """The twin of ``flatten.attention`` in the Swin layout on the grid
    (:class:`refimpl.twins.modules.focused.FocusedWindowAttention`: cyclic shift, windows, the shift mask per
    ``shift_mask``) and its forward on the foreign layout, with the (wh, ww) window and the (sh, sw) shift."""
    from refimpl.twins.modules.focused import FocusedWindowAttention
    if s.no_twin:
        raise VerifyError(f"argument 'grad': {s.no_twin}")
    m = FocusedWindowAttention(s.cfg, tuple(s.window))
    to_grid, out = _twin_io(s)

    def fwd(x):
        g = to_grid(x)
        b, h, w, c = g.shape
        return out(m(g.reshape(b, h * w, c), (h, w), shift=tuple(s.shift)).reshape(b, h, w, c))
    return m, fwd
