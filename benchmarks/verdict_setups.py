"""The verdict benchmark's set-ups: one per attention module (benchmarks/verdict.py runs them), each with its
planted bugs and its stage list.

A set-up builds the module's PyTorch twin in T with random parameters from the module's own init function, rounded
to T and loaded with ``load_numpy_state``, on inputs rounded to T, and gives the float64 reference, its bound, the
NumPy naive run in T, and the planted-bug versions of the twin (wrappers, forward hooks and temporarily patched
module globals defined here; the twins are not edited).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from types import MethodType
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as TF

from equivalence.assertions import (QKV_PROJ_POINTS, capture, load_numpy_state, round_params, stage_ensemble,
                                    to_torch, torch_dtype)
from refimpl.twins.modules import angular as t_ang
from refimpl.twins.modules import enhanced as t_enh
from refimpl.twins.modules import focused as t_foc
from refimpl.twins.modules import lisa as t_lisa
from refimpl.twins.modules import rala as t_rala
from refimpl.twins.modules import softmax as t_soft
from equivalence.strategies import generate
from refimpl import config, ensemble, numerics, verdict
from refimpl.attention import angular as r_ang
from refimpl.attention import enhanced as r_enh
from refimpl.attention import focused as r_foc
from refimpl.attention import lisa as r_lisa
from refimpl.attention import rala as r_rala
from refimpl.attention import softmax as r_soft
from refimpl.layers import subparams
from refimpl.models import common as m_common

#: The tested precisions; the batch size and seed of every set-up; the planted bugs (keys of ``Setup.bugs``).
DTYPES = ("float32", "float16", "bfloat16")
BATCH = 2
SEED = 0
BUGS = ("batch state", "eps dropped", "scale twice", "boundary off by one")


@dataclasses.dataclass
class Bug:
    what: str                                   # the planted defect, in words
    run: Callable[[], Any] | None = None        # -> the buggy output (a tensor in T)
    na: str = ""                                # why there is no such bug in this module


@dataclasses.dataclass
class Setup:
    name: str
    title: str
    run: Callable[[], Any]                      # the tested twin, no arguments
    ref: Callable[[], np.ndarray]
    bound: Callable[[], numerics.Bound]
    naive: Callable[[], np.ndarray]
    bugs: dict[str, Bug]
    note: str = ""
    stagewise: "StageWise | None" = None      # runner -> refimpl.verdict.StageReport, with the stage list


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any):
    """Set ``obj.name = value`` for the duration of the block (a module global of a twin, an attribute of a
    module instance), then restore it."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def hooked(module: torch.nn.Module, pre: Callable | None = None, post: Callable | None = None):
    hs = []
    if pre is not None:
        hs.append(module.register_forward_pre_hook(pre))
    if post is not None:
        hs.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for h in hs:
            h.remove()


def _nograd(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run():
        with torch.no_grad():
            return fn()
    return run


def _swap_first_item(t: torch.Tensor, batch: int = BATCH) -> torch.Tensor:
    """t (batch * g, ...) with each item's g rows consecutive: item 0's rows replaced by item 1's (item 0 uses
    item 1's state; item 1 stays correct)."""
    g = t.shape[0] // batch
    out = t.clone()
    out[:g] = t[g:2 * g]
    return out


def _last_row_from_above(x: torch.Tensor, axis: int) -> torch.Tensor:
    """The last index along ``axis`` (a grid row) replaced by the one before it: an off-by-one read."""
    out = x.clone()
    idx_last = [slice(None)] * x.dim()
    idx_prev = [slice(None)] * x.dim()
    idx_last[axis], idx_prev[axis] = -1, -2
    out[tuple(idx_last)] = x[tuple(idx_prev)]
    return out


def _shift_pre_hook(axis: int = -2):
    def hook(_mod, args):
        return (_last_row_from_above(args[0], axis),) + tuple(args[1:])
    return hook


def _inputs(shape: tuple[int, ...], dt: str, seed: int = SEED) -> np.ndarray:
    return numerics.round_to(generate(seed, "normal", shape), dt)


def _module(mod: torch.nn.Module, params: dict, dt: str) -> torch.nn.Module:
    mod = mod.to(dtype=torch_dtype(dt))
    load_numpy_state(mod, params)
    return mod.eval()


def _naive(fn: Callable, *args: Any, dt: str, **kw: Any) -> Callable[[], np.ndarray]:
    return lambda: np.asarray(numerics.naive_same_precision(fn, *args, dtype=dt, **kw), dtype=np.float64)


# --- FLatten ----------------------------------------------------------------------------------------

def _flatten_bugs(m: Any, run: Callable[[], Any], cfg: Any, windows: bool) -> dict[str, Bug]:
    orig_attend = t_foc.attend

    def attend_swapped(q, k, v, normaliser, eps, order, mask=None):
        return orig_attend(q, _swap_first_item(k), _swap_first_item(v), normaliser, eps, order, mask)

    def batch():
        with patched(t_foc, "attend", attend_swapped):
            return run()

    def eps():
        with patched(m, "cfg", dataclasses.replace(cfg, eps=0.0)):
            return run()

    def features_scale_twice(self, t):
        c, h = self.cfg, self.cfg.num_heads
        a = TF.relu(t)
        if c.relu_eps:
            a = a + c.relu_eps
        a = a / TF.softplus(self.scale) / TF.softplus(self.scale)       # the bug: the scale applied twice
        b, n, ch = a.shape
        if c.norm_scope == "token":
            return t_foc.focused_function(a, c.p, -1, c.power_scaling).reshape(b, n, h, ch // h).transpose(1, 2)
        return t_foc.focused_function(a.reshape(b, n, h, ch // h).transpose(1, 2), c.p, -1, c.power_scaling)

    def scale():
        m._features = MethodType(features_scale_twice, m)
        try:
            return run()
        finally:
            del m._features

    def boundary():
        with hooked(m.dwc, pre=_shift_pre_hook(-2)):
            return run()

    where = "each window's" if windows else "the grid's"
    return {
        "batch state": Bug("item 0's attention uses item 1's K and V (K^T V and the key mean)", batch),
        "eps dropped": Bug(f"the normaliser eps ({cfg.eps:g}) dropped", eps),
        "scale twice": Bug("the learnable feature scale softplus(s) divided twice", scale),
        "boundary off by one": Bug(f"DWC input: {where} last row read from the row above", boundary),
    }


@dataclasses.dataclass
class StageWise:
    """A module's stage list and how to capture its tensors from one run: ``self(runner)`` is the stage-wise
    report of the run (refimpl.verdict.compare_stages with each stage's NumPy naive run in T, and with the
    teacher-forced torch ensemble once :meth:`calibrate` has measured it)."""

    stages: list
    tensors: Callable[..., dict]          # (runner, force=None) -> stage tensors (torch)
    dt: str
    errors: dict | None = None            # stage -> {variant: member - reference} on the correct run's inputs

    def __call__(self, runner: Callable[[], Any]) -> Any:
        return self.compare(_tensors64(self.tensors(runner)))

    def calibrate(self, runner: Callable[[], Any], tested: dict, variants: Any = ensemble.VARIANTS) -> None:
        """Run the twin under every variant with every stage tensor forced to ``tested`` (the correct run's,
        torch) and keep each member's rounding error, member - reference, per stage."""
        ens = stage_ensemble(lambda force: self.tensors(runner, force=force), tested, variants)
        t64 = _tensors64(tested)
        self.errors = {}
        for st in self.stages:
            ref = np.asarray(st.reference(*[t64[k] for k in st.inputs]), dtype=np.float64)
            self.errors[st.name] = {v: verdict._to_numpy64(x) - ref for v, x in ens.get(st.name, {}).items()}

    def ensembles(self, tensors: dict, stages: list) -> dict | None:
        """Each stage's members on ``tensors``: reference(tensors) + the member's error on the correct run.  On
        the correct run's tensors these are the members themselves; on blended tensors (the sensitivity
        bisection, a few u from the correct ones) each legitimate algorithm is taken to err as it did there,
        which spares a forced re-run of the twin per bisection step."""
        if self.errors is None:
            return None
        out = {}
        for st in stages:
            ref = np.asarray(st.reference(*[tensors[k] for k in st.inputs]), dtype=np.float64)
            out[st.name] = {v: ref + e for v, e in self.errors.get(st.name, {}).items()}
        return out

    def compare(self, tensors: dict, only: set | None = None) -> Any:
        """compare_stages on ``tensors`` (float64 arrays); ``only``: the named stages alone, each with the share of
        the false-alarm budget it has in the full list (so a stage's verdict is the one the full comparison gives
        it)."""
        stages = self.stages if only is None else [st for st in self.stages if st.name in only]
        p = config.VERDICT_FALSE_ALARM * len(stages) / len(self.stages)
        return numerics.compare_stages(stages, tensors, self.dt, naive=numerics.naive_same_precision,
                                       ensembles=self.ensembles(tensors, stages), p_false_alarm=p)


def _stagewise(stages: list, tensors: Callable[[Callable[[], Any]], dict], dt: str) -> StageWise:
    return StageWise(stages, tensors, dt)


def _flatten_stagewise(m: Any, stages: list, dt: str) -> Callable[[Callable[[], Any]], Any]:
    return _stagewise(stages, lambda runner, force=None: t_foc.stage_tensors(m, runner, force=force), dt)


def _projections_stagewise(m: Any, stages: list, dt: str) -> Callable[[Callable[[], Any]], Any]:
    return _stagewise(stages, lambda runner, force=None: capture(m, runner, QKV_PROJ_POINTS, force=force), dt)


def setup_flatten_pvt(dt: str, quick: bool, sr: int = 1) -> Setup:
    """FLatten-PVT's stage-1 layer.  sr = 1 is the registered networks' layout (refimpl.models.flatten_pvt: the
    whole 56 x 56 grid as keys, FLatten Tables 10-11), the layer the verdict's issue measures (its bound depth k
    = 3526 is this layout's; with sr = 8 it is 4616); sr = 8 (``flatten_pvt_sr8``) is PVT's spatial reduction,
    kept as the harder case (4097-term reduction sums)."""
    side = 16 if quick else 56
    cfg = r_foc.FocusedConfig.preset("official", dim=64, num_heads=1, sr_ratio=sr, kernel_size=5)
    hw = (side, side)
    n_kv = (side // sr) ** 2
    params = round_params(r_foc.init_focused_params(cfg, layout="global", n_kv=n_kv, seed=SEED), dt)
    x = _inputs((BATCH, side * side, cfg.dim), dt)
    m = _module(t_foc.FocusedLinearAttention(cfg, n_kv), params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt, hw))
    name = "flatten_pvt" if sr == 1 else f"flatten_pvt_sr{sr}"
    what = "the registered networks' layout" if sr == 1 else "PVT's spatial reduction"
    return Setup(
        name, f"FLatten-PVT stage 1 (official, C 64, 1 head, {side}x{side}, sr {sr}: {what})", run,
        lambda: r_foc.focused_linear_attention(x, params, cfg, hw),
        lambda: r_foc.focused_linear_attention_bound(x, params, cfg, hw, dtype=dt),
        _naive(r_foc.focused_linear_attention, x, params, cfg, hw, dt=dt),
        _flatten_bugs(m, run, cfg, windows=False),
        stagewise=_flatten_stagewise(m, r_foc.focused_linear_attention_stages(params, cfg, hw, fine=True), dt))


def setup_flatten_swin(dt: str, quick: bool) -> Setup:
    side = 14 if quick else 56
    ws = 7
    cfg = r_foc.FocusedConfig.preset("official", dim=96, num_heads=3, kernel_size=5)
    hw = (side, side)
    params = round_params(r_foc.init_focused_params(cfg, layout="window", n_kv=ws * ws, seed=SEED), dt)
    x = _inputs((BATCH, side * side, cfg.dim), dt)
    m = _module(t_foc.FocusedWindowAttention(cfg, ws), params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt, hw, shift=0))
    kw = dict(window_size=ws, shift=0)
    return Setup(
        "flatten_swin", f"FLatten-Swin window (official, C 96, 3 heads, {ws}x{ws} windows of {side}x{side})", run,
        lambda: r_foc.focused_window_attention(x, params, cfg, hw, **kw),
        lambda: r_foc.focused_window_attention_bound(x, params, cfg, hw, dtype=dt, **kw),
        _naive(r_foc.focused_window_attention, x, params, cfg, hw, dt=dt, **kw),
        _flatten_bugs(m, run, cfg, windows=True),
        stagewise=_flatten_stagewise(m, r_foc.focused_window_attention_stages(params, cfg, hw, fine=True, **kw),
                                     dt))


# --- Swin softmax window attention ---------------------------------------------------------------------

def setup_swin_softmax(dt: str, quick: bool) -> Setup:
    side = 14 if quick else 56
    c, heads, ws, shift = 96, 3, 7, 3
    opts = dict(r_soft.WINDOW_PRESETS["swin"])
    mod = t_soft.WindowAttention(c, heads, ws, shift=shift, **opts)
    shapes = {k: tuple(v.shape) for k, v in mod.state_dict().items()}
    std = config.NET_INIT_STD_FC
    raw = m_common.init_from_shapes(shapes, np.random.default_rng(SEED), special={
        "relative_position_bias_table": lambda shp, r: std * r.standard_normal(shp)})
    params = round_params(raw, dt)
    x = _inputs((BATCH, side, side, c), dt)
    m = _module(mod, params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt))
    kw = dict(num_heads=heads, window_size=ws, shift=shift, **opts)

    def batch():
        def post(_mod, _args, out):
            o = out.clone()
            g = o.shape[0] // BATCH
            o[:g, :, c:] = out[g:2 * g, :, c:]          # item 0's windows take item 1's keys and values
            return o
        with hooked(m.qkv, post=post):
            return run()

    def scale():
        with patched(m, "scale", m.scale * m.scale):
            return run()

    def boundary():
        idx = m.relative_position_index
        n = ws * ws
        bad = idx.clone()
        bad[n - ws:] = idx[n - 2 * ws:n - ws]           # last query row of the window: the row above's offsets
        with patched(m, "relative_position_index", bad):
            return run()

    bugs = {
        "batch state": Bug("item 0's windows use item 1's keys and values", batch),
        "eps dropped": Bug("", None, "softmax window attention has no eps (max-subtracted exp, exact mask)"),
        "scale twice": Bug("the logit scale d^-1/2 applied twice", scale),
        "boundary off by one": Bug("relative-position index of each window's last row taken from the row above",
                                   boundary),
    }
    return Setup("swin_softmax", f"Swin softmax window (swin preset, shift {shift}, C {c}, {heads} heads, "
                                 f"{ws}x{ws} windows of {side}x{side})", run,
                 lambda: r_soft.window_attention(x, params, **kw),
                 lambda: r_soft.window_attention_bound(x, params, dtype=dt, **kw),
                 _naive(r_soft.window_attention, x, params, dt=dt, **kw), bugs,
                 stagewise=_projections_stagewise(m, r_soft.window_attention_stages(params, (side, side), **kw), dt))


# --- L2ViT ------------------------------------------------------------------------------------------

def setup_l2vit(dt: str, quick: bool) -> Setup:
    side = 14 if quick else 56
    cfg = r_enh.L2ViTConfig.preset("paper", dim=96, num_heads=3)
    params = round_params(subparams(r_enh.init_l2vit_params(cfg, "lga", seed=SEED), "attn"), dt)
    x = _inputs((BATCH, side * side, cfg.dim), dt)
    m = _module(t_enh.EnhancedLinearAttention(cfg), params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt))
    orig = t_enh.enhanced_linear_attention

    def batch():
        def f(q, k, v, **kw):
            return orig(q, _swap_first_item(k), _swap_first_item(v), **kw)
        with patched(t_enh, "enhanced_linear_attention", f):
            return run()

    def eps():
        with patched(m, "cfg", dataclasses.replace(cfg, c_min=0.0)):
            return run()

    def scale():
        def f(q, k, v, *, scale, **kw):
            return orig(q, k, v, scale=scale * scale, **kw)   # s applied twice: O / s / s
        with patched(t_enh, "enhanced_linear_attention", f):
            return run()

    def boundary():
        def f(q, k, v, **kw):                                 # the key loop stops one grid row short
            return orig(q, k[..., :-side, :], v[..., :-side, :], **kw)
        with patched(t_enh, "enhanced_linear_attention", f):
            return run()

    bugs = {
        "batch state": Bug("item 0's attention uses item 1's K and V (K^T V and the key sum)", batch),
        "eps dropped": Bug(f"the normaliser clamp C_min = {cfg.c_min:g} dropped", eps),
        "scale twice": Bug("the learnable scale s (O / s) applied twice", scale),
        "boundary off by one": Bug("the key range stops one grid row short (last row of keys left out of K^T V "
                                   "and the key sum; the module has no spatial kernel)", boundary),
    }
    return Setup("l2vit", f"L2ViT enhanced linear attention (paper, C 96, 3 heads, {side}x{side})", run,
                 lambda: r_enh.enhanced_attention(x, params, cfg),
                 lambda: r_enh.enhanced_attention_bound(x, params, cfg, dtype=dt),
                 _naive(r_enh.enhanced_attention, x, params, cfg, dt=dt), bugs,
                 stagewise=_projections_stagewise(m, r_enh.enhanced_attention_stages(params, cfg), dt))


# --- RALA -------------------------------------------------------------------------------------------

def setup_rala(dt: str, quick: bool) -> Setup:
    side = 14 if quick else 56
    cfg = r_rala.RALAConfig.preset("official", dim=64, num_heads=1)
    raw = m_common.init_from_shapes(r_rala.rala_param_shapes(cfg), np.random.default_rng(SEED))
    params = round_params(raw, dt)
    x = _inputs((BATCH, cfg.dim, side, side), dt)
    m = _module(t_rala.RALAttention(cfg), params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt))
    orig = t_rala.rala_core

    def batch():
        def f(q, k, v, c, hw=None, taps=None):
            return orig(q, _swap_first_item(k), _swap_first_item(v), c, hw, taps)
        with patched(t_rala, "rala_core", f):
            return run()

    def eps():
        with patched(m, "cfg", dataclasses.replace(cfg, eps=0.0)):
            return run()

    def scale():
        def f(q, k, v, c, hw=None, taps=None):
            return orig(q, k, v * q.shape[-2] ** -0.5, c, hw, taps)   # (HW)^-1/2 applied to V twice
        with patched(t_rala, "rala_core", f):
            return run()

    def boundary():
        with hooked(m.lepe, pre=_shift_pre_hook(-2)):
            return run()

    bugs = {
        "batch state": Bug("item 0's core uses item 1's K and V (alpha, K^T V, key mean)", batch),
        "eps dropped": Bug(f"the normaliser eps ({cfg.eps:g}) dropped", eps),
        "scale twice": Bug("the token scaling (HW)^-1/2 applied to V twice", scale),
        "boundary off by one": Bug("LePE 5x5 input: the grid's last row read from the row above", boundary),
    }
    return Setup("rala", f"RALA (official, C 64, 1 head, {side}x{side}, channels-first)", run,
                 lambda: r_rala.rala_attention(x, params, cfg),
                 lambda: r_rala.rala_attention_bound(x, params, cfg, dtype=dt),
                 _naive(r_rala.rala_attention, x, params, cfg, dt=dt), bugs,
                 stagewise=_stagewise(r_rala.rala_attention_stages(params, cfg, (side, side), fine=True),
                                      lambda runner, force=None: t_rala.stage_tensors(m, runner, (side, side),
                                                                                       force=force), dt))


# --- LiSA -------------------------------------------------------------------------------------------

def setup_lisa(dt: str, quick: bool) -> Setup:
    side = 14 if quick else 56
    cfg = r_lisa.LiSAConfig.preset("paper", dim=64, num_heads=4, grid=(side, side), latent=8)
    params = round_params(r_lisa.init_params(r_lisa.lisa_param_shapes(cfg), seed=SEED), dt)
    x = _inputs((BATCH, cfg.num_tokens, cfg.dim), dt)
    m = _module(t_lisa.from_config(cfg), params, dt)
    xt = to_torch(x, dt, "cpu")
    half = dt in ("float16", "bfloat16")
    orig = t_lisa.fft_convolve

    def conv_in_t(xx, kernel, grid, lengths, transform="rfft"):
        if not half:
            return orig(xx, kernel, grid, lengths, transform)
        # torch has no half-precision CPU FFT: compute it in float32 and round the result to T (autocast's rule)
        return orig(xx.float(), kernel.float(), grid, lengths, transform).to(xx.dtype)

    def run_with(conv):
        with torch.no_grad(), patched(t_lisa, "fft_convolve", conv):
            return m(xt)

    run = lambda: run_with(conv_in_t)  # noqa: E731

    def batch():
        return run_with(lambda xx, kk, g, L, tr="rfft": conv_in_t(_swap_first_item(xx), kk, g, L, tr))

    def eps():
        with patched(m, "l2_eps", 0.0):
            return run()

    def scale():
        return run_with(lambda xx, kk, g, L, tr="rfft": conv_in_t(xx, kk, g, L, tr) / math.prod(L))

    def boundary():
        return run_with(lambda xx, kk, g, L, tr="rfft": conv_in_t(_last_row_from_above(xx, 2), kk, g, L, tr))

    bugs = {
        "batch state": Bug("item 0 uses item 1's convolved keys and values (G_a, G_b)", batch),
        "eps dropped": Bug(f"the L2-normalisation eps ({cfg.l2_eps:g}) dropped", eps),
        "scale twice": Bug("the inverse FFT's 1/N normalisation applied twice", scale),
        "boundary off by one": Bug("FFT convolution input: the grid's last row read from the row above", boundary),
    }
    note = "FFT in float32, rounded to T (torch has no half CPU FFT)" if half else ""
    return Setup("lisa", f"LiSA (paper, LiSANet-H-T stage 1: C 64, 4 heads, D 8, {side}x{side})", run,
                 lambda: r_lisa.lisa_attention(x, params, cfg),
                 lambda: r_lisa.lisa_attention_bound(x, params, cfg, dtype=dt),
                 _naive(r_lisa.lisa_attention, x, params, cfg, dt=dt), bugs, note,
                 stagewise=_stagewise(r_lisa.lisa_attention_stages(params, cfg, fine=True),
                                      lambda runner, force=None: t_lisa.stage_tensors(m, runner, force=force), dt))


# --- Castling ---------------------------------------------------------------------------------------

def _castling_conv(v: torch.Tensor, cfg: Any, w: Any, b: Any, hw: Any) -> Any:
    """The conv branch of castling_core_t (refimpl/twins/modules/angular.py), for the wrappers below."""
    if cfg.conv == "tokens1d":
        kk = w.shape[2]
        return TF.conv2d(v, w, b, padding=(kk // 2, 0), groups=v.shape[1])
    if cfg.conv == "grid2d":
        bsz, h, n, d = v.shape
        kk = w.shape[2]
        img = v.transpose(-1, -2).reshape(bsz, h * d, hw[0], hw[1])
        return TF.conv2d(img, w, b, padding=kk // 2, groups=h * d).reshape(bsz, h, d, n).transpose(-1, -2)
    return torch.zeros_like(v)


def setup_castling(dt: str, quick: bool) -> Setup:
    from refimpl import models

    side = 7 if quick else 14
    cfg = models.entry("castling_deit_t").config.attention_config()
    hw = (side, side)
    params = round_params(r_ang.init_castling_params(cfg, SEED), dt)
    x = _inputs((BATCH, side * side, cfg.dim), dt)
    m = _module(t_ang.CastlingAttention(cfg), params, dt)
    xt = to_torch(x, dt, "cpu")
    run = _nograd(lambda: m(xt, hw=hw))
    orig = t_ang.castling_core_t

    def wrap(extra):
        def f(q, k, v, c, *, conv_weight=None, conv_bias=None, training=False, hw=None):
            return extra(q, k, v, c, conv_weight, conv_bias, training, hw)
        return f

    def batch():
        def e(q, k, v, c, w, b, tr, g):
            k2, v2 = _swap_first_item(k), _swap_first_item(v)
            out = orig(q, k2, v2, c, conv_weight=w, conv_bias=b, training=tr, hw=g)
            return out + (_castling_conv(v, c, w, b, g) - _castling_conv(v2, c, w, b, g))   # own v in the conv
        with patched(t_ang, "castling_core_t", wrap(e)):
            return run()

    def eps():
        with patched(m, "cfg", dataclasses.replace(cfg, qk_norm_eps=0.0)):
            return run()

    def scale():
        def e(q, k, v, c, w, b, tr, g):
            out = orig(q, k, v, c, conv_weight=w, conv_bias=b, training=tr, hw=g)
            qh = t_ang.unit_rows_t(q, c.qk_norm_eps, c.qk_norm)
            kh = t_ang.unit_rows_t(k, c.qk_norm_eps, c.qk_norm)
            series = (1.0 / math.pi) * (qh @ (kh.transpose(-1, -2) @ v))
            return out + (1.0 / math.pi - 1.0) * series                                    # 1/pi applied twice
        with patched(t_ang, "castling_core_t", wrap(e)):
            return run()

    def boundary():
        def e(q, k, v, c, w, b, tr, g):
            out = orig(q, k, v, c, conv_weight=w, conv_bias=b, training=tr, hw=g)
            n, wdt = v.shape[-2], g[1]
            v2 = v.clone()
            v2[..., n - wdt:, :] = v[..., n - 2 * wdt:n - wdt, :]
            return out + (_castling_conv(v2, c, w, b, g) - _castling_conv(v, c, w, b, g))
        with patched(t_ang, "castling_core_t", wrap(e)):
            return run()

    assert cfg.order == 0, "the scale-twice bug below is written for the order-0 (Eq. 9) series"
    bugs = {
        "batch state": Bug("item 0 uses item 1's K and V (K^T V and the constant 1/2 sum_j v_j)", batch),
        "eps dropped": Bug(f"the q/k normalisation clamp eps ({cfg.qk_norm_eps:g}) dropped", eps),
        "scale twice": Bug("the 1/pi of the linear angular term applied twice", scale),
        "boundary off by one": Bug("token conv input: the grid's last row read from the row above", boundary),
    }
    return Setup("castling", f"Castling-ViT (paper, DeiT-T: C 192, 3 heads, {side}x{side}, eval)", run,
                 lambda: r_ang.castling_attention(x, params, cfg, training=False, hw=hw),
                 lambda: r_ang.castling_attention_bound(x, params, cfg, dtype=dt, training=False, hw=hw),
                 _naive(r_ang.castling_attention, x, params, cfg, dt=dt, training=False, hw=hw), bugs,
                 stagewise=_projections_stagewise(m, r_ang.castling_attention_stages(params, cfg, hw=hw), dt))


MODULES: dict[str, Callable[[str, bool], Setup]] = {
    "flatten_pvt": setup_flatten_pvt,
    "flatten_pvt_sr8": functools.partial(setup_flatten_pvt, sr=8),
    "flatten_swin": setup_flatten_swin,
    "swin_softmax": setup_swin_softmax,
    "l2vit": setup_l2vit,
    "rala": setup_rala,
    "lisa": setup_lisa,
    "castling": setup_castling,
}


def _tensors64(tensors: dict) -> dict:
    """Stage tensors (torch) as float64 arrays."""
    return {k: verdict._to_numpy64(v) for k, v in tensors.items()}
