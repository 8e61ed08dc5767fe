"""How tight each error bound is: the observed error of a same-precision computation against the bound.

A bound must be safe (every legitimate computation's error lies inside it) and tight (the error of a real
computation reaches a stated fraction of it): a bound ten times too loose lets a defect ten times larger pass.
For each bound of the error calculus this module builds one input, adversarial where the bound has a weak
spot (long sums, cancellation, near-unit cosines, dead features, mean >> std), runs the NumPy definition in
float32 (:func:`refimpl.numerics.naive_same_precision`: every operation in float32, sums accumulated in
float32, the format config.ACCUMULATION_FORMAT assumes for float32) and measures

    ratio = max_i |naive_i - ref_i| / b_i,

b_i the element-wise threshold the verdict applies (:meth:`refimpl.verdict.Bound.array` with the lambda of a
comparison of this size at config.VERDICT_FALSE_ALARM: the probabilistic factor on accumulation bounds, the
deterministic one on composite bounds).  A safe bound has ratio <= 1; tests/test_bound_tightness.py pins each
ratio from below, and benchmarks/bound_tightness.py prints the table (docs/verdict.md, "How tight each bound
is").

Layer: tests (imports refimpl and NumPy).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import numpy as np

from refimpl import config, layers, numerics, toeplitz, verdict
from refimpl.attention import angular, enhanced, focused, linear, lisa, rala, softmax

DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class Case:
    """One bound and the input it is measured on."""

    name: str            # the bound function measured
    what: str            # the input, and why it is adversarial for this bound
    fn: Callable[..., Any]
    bound: Callable[..., verdict.Bound]
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Tightness:
    case: str
    ratio: float          # max_i err_i / b_i, the verdict's threshold (probabilistic where it applies)
    ratio_worst: float    # the same against the deterministic bound gamma_k S
    k: float
    accumulation: bool
    elements: int


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _r32(a: np.ndarray) -> np.ndarray:
    return numerics.round_to(a, DTYPE)


def _takes_dtype(fn: Callable[..., Any]) -> bool:
    return "dtype" in inspect.signature(fn).parameters


def measure(case: Case) -> Tightness:
    """The observed float32 error of ``case`` against its bound (module docstring)."""
    ref = np.asarray(case.fn(*case.args, **case.kwargs), dtype=np.float64)
    nv = np.asarray(numerics.naive_same_precision(case.fn, *case.args, dtype=DTYPE, **case.kwargs),
                    dtype=np.float64)
    extra = {"dtype": DTYPE} if _takes_dtype(case.bound) else {}
    b = case.bound(*case.args, **case.kwargs, **extra)
    u = verdict.unit_roundoff(DTYPE)
    lam = verdict.confidence_lambda(ref.size * max(b.k, 1.0), config.VERDICT_FALSE_ALARM, u)
    thr, worst = b.array(DTYPE, ref.shape, lam), b.array(DTYPE, ref.shape)
    fin = np.isfinite(ref) & np.isfinite(nv)
    err = np.abs(nv - ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(fin & (err > 0), err / thr, 0.0)
        rw = np.where(fin & (err > 0), err / worst, 0.0)
    return Tightness(case.name, float(r.max()), float(rw.max()), float(b.k), bool(b.accumulation), int(ref.size))


# ---------------------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------------------

def _positive(shape, seed, lo=0.5, hi=1.5):
    return _r32(_rng(seed).uniform(lo, hi, shape))


def _normal(shape, seed, scale=1.0):
    return _r32(scale * _rng(seed).standard_normal(shape))


def cases() -> list[Case]:
    """Every measured bound, one case each (module docstring)."""
    out: list[Case] = []
    add = out.append

    # --- layers: long sums of positive terms (no cancellation: the error grows with every partial sum)
    x, w, b = _positive((64, 1024), 1), _positive((96, 1024), 2, 0.0, 1.0), _positive((96,), 3)
    add(Case("linear_bound", "1024-term sums of positive terms", layers.linear, layers.linear_bound, (x, w, b)))
    xi, wi = _positive((2, 16, 20, 20), 4), _positive((32, 16, 5, 5), 5, 0.0, 1.0)
    add(Case("conv2d_bound", "401-term positive 5 x 5 x 16 sums", layers.conv2d, layers.conv2d_bound, (xi, wi),
             {"padding": 2}))
    wd = _positive((16, 1, 7, 7), 6, 0.0, 1.0)
    add(Case("depthwise_conv2d_bound", "49-term positive depthwise sums", layers.depthwise_conv2d,
             layers.depthwise_conv2d_bound, (xi, wd), {"padding": 3}))
    xm = _r32(100.0 + _rng(7).standard_normal((256, 384)))
    ln_w, ln_b = _normal((384,), 8), _normal((384,), 9)
    add(Case("layer_norm_bound", "mean 100 >> std 1: the centring cancels", layers.layer_norm,
             layers.layer_norm_bound, (xm, ln_w, ln_b, config.LAYER_NORM_EPS)))
    add(Case("gelu_bound", "x in [-6, 6], erf's whole range", layers.gelu, layers.gelu_bound,
             (_r32(np.linspace(-6.0, 6.0, 20001)),)))
    add(Case("softmax_bound", "logits spread over [-30, 30] along 1024", numerics.softmax, numerics.softmax_bound,
             (_r32(_rng(10).uniform(-30.0, 30.0, (64, 1024))),)))

    # --- attention cores at moderate sizes
    q, k, v = _normal((2, 2, 256, 32), 11), _normal((2, 2, 256, 32), 12), _normal((2, 2, 256, 32), 13)
    add(Case("linear_attention_bound", "ReLU features, 256 tokens", linear.linear_attention,
             linear.linear_attention_bound, (q, k, v)))
    pq, pk = np.abs(q), np.abs(k)
    add(Case("kernelized_attention_bound", "positive features |q|, |k|", linear.kernelized_attention,
             linear.kernelized_attention_bound, (pq, pk, v)))
    add(Case("softmax_attention_bound", "logits scaled by 4 (peaked rows)", softmax.softmax_attention,
             softmax.softmax_attention_bound, (_r32(4 * q), k, v)))
    add(Case("focused_function_bound", "ReLU features: half the entries dead (0), p = 3", focused.focused_function,
             focused.focused_function_bound, (np.maximum(_normal((512, 64), 14), 0.0),)))
    add(Case("focused_attention_bound", "p = 3 features of N(0, 1) q, k", focused.focused_attention,
             focused.focused_attention_bound, (q, k, v)))
    add(Case("resample_linear_bound", "49 -> 3136 linear resampling", focused.resample_linear,
             focused.resample_linear_bound, (_normal((4, 49), 15), 3136)))
    add(Case("enhanced_linear_attention_bound", "L2ViT core, c_min clamp active on some rows",
             enhanced.enhanced_linear_attention, enhanced.enhanced_linear_attention_bound, (q, k, v)))
    uq = _normal((2, 2, 64, 16), 16)
    near = _r32(uq + 1e-3 * _rng(17).standard_normal(uq.shape))
    add(Case("angular_attention_bound", "keys within 1e-3 of the queries: |q^ . k^| near 1 (arccos)",
             angular.angular_attention, angular.angular_attention_bound, (uq, near, _normal(uq.shape, 18)),
             {"method": "arccos"}))
    add(Case("linear_angular_attention_bound", "Eq. 9 on N(0, 1) q, k", angular.linear_angular_attention,
             angular.linear_angular_attention_bound, (q, k, v)))

    # --- FLatten PVT layout (sr conv + LayerNorm + features + attention + DWC): a composite bound
    cfg = focused.FocusedConfig.preset("official", dim=32, num_heads=1, sr_ratio=4, kernel_size=5)
    params = {key: _r32(val) for key, val in focused.init_focused_params(cfg, layout="global", n_kv=16,
                                                                         seed=0).items()}
    add(Case("focused_linear_attention_bound", "FLatten-PVT official, C 32, 16 x 16, sr 4 (composite)",
             focused.focused_linear_attention, focused.focused_linear_attention_bound,
             (_normal((2, 256, 32), 19), params, cfg, (16, 16))))
    wcfg = focused.FocusedConfig.preset("official", dim=32, num_heads=2, kernel_size=5)
    wparams = {key: _r32(val) for key, val in focused.init_focused_params(wcfg, layout="window", n_kv=16,
                                                                          seed=0).items()}
    add(Case("focused_window_attention_bound", "FLatten-Swin official, C 32, 4 x 4 windows of 8 x 8 (composite)",
             focused.focused_window_attention, focused.focused_window_attention_bound,
             (_normal((2, 64, 32), 20), wparams, wcfg, (8, 8)), {"window_size": 4}))

    # --- RALA core (paper and official)
    for preset in ("paper", "official"):
        rcfg = rala.RALAConfig.preset(preset, dim=32, num_heads=2, layout="tokens")
        add(Case(f"rala_core_bound[{preset}]", f"RALA {preset} core, 8 x 8 tokens", rala.rala_core,
                 rala.rala_core_bound, (_normal((2, 2, 64, 16), 21), _normal((2, 2, 64, 16), 22),
                                        _normal((2, 2, 64, 16), 23), rcfg, (8, 8))))

    # --- LiSA core (FFT convolutions) and the Toeplitz products
    lcfg = lisa.LiSAConfig.preset("paper", dim=16, num_heads=2, grid=(8, 8), latent=4)
    lp = {key: _r32(val) for key, val in lisa.init_params(lisa.lisa_param_shapes(lcfg), seed=0).items()}
    lx = _normal((2, 64, 16), 24)
    add(Case("lisa_attention_bound", "LiSA paper, C 16, 8 x 8 (FFT convolutions)", lisa.lisa_attention,
             lisa.lisa_attention_bound, (lx, lp, lcfg)))
    add(Case("circulant_product_bound", "1-D length-512 circulant (FFT) product of positive data",
             toeplitz.circulant_product, toeplitz.circulant_product_bound,
             (_positive((512,), 26), _positive((4, 512), 25))))
    e = _normal((2 * 256 - 1,), 27)
    add(Case("toeplitz_product_bound", "256 x 256 Toeplitz matrix by FFT", toeplitz.toeplitz_product,
             toeplitz.toeplitz_product_bound, (e, _normal((8, 256), 28))))

    # --- Castling core (DeiT-T head dims)
    ccfg = angular.CastlingConfig.preset("paper", dim=32, num_heads=2)
    cp = {key: _r32(val) for key, val in angular.init_castling_params(ccfg, 0).items()}
    add(Case("castling_attention_bound", "Castling paper, C 32, 8 x 8, eval", angular.castling_attention,
             angular.castling_attention_bound, (_normal((2, 64, 32), 29), cp, ccfg), {"hw": (8, 8)}))
    return out
