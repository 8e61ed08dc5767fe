"""The RAVLT block's CPE and residuals have one error path each, shared by the layer bounds and the networks' block
parts: the CPE x + DWConv3x3(x) (refimpl.layers.cpe_error: layers.cpe_bound on exact inputs, and
refimpl.models.ravlt_bounds._e_cpe with the input error) and the residual x + f or x + gamma (.) f with the layer
scale (refimpl.attention.rala_layer_error.residual_error: rala.residual_bound on exact operands, and
ravlt_bounds._e_residual, which refimpl.models.ravlt._e_part composes).  The network's absolute bound is the
path's to the last bit, the layer's up to the float64 rounding of its representation, and both hold against the
twin block (refimpl.twins.modules.rala.RAVLTBlock) evaluated in float32 and float16, the network's with the
observed input errors.

References: RALA (Fan, Huang, He) §3.2, Fig. 6; Higham (2002) eq. 2.8, 3.12.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from refimpl import layers, numerics
from refimpl.attention import rala, rala_layer_error
from refimpl.attention.rala_bounds import _Prec
from refimpl.attention.rala_core import _grid_to_tokens
from refimpl.models import _netparts as nets, ravlt_bounds
from refimpl.models.common import Err

torch = pytest.importorskip("torch")

PRESETS = ["paper", "official"]   # paper: (B, H, W, C), no layer scale; official: (B, C, H, W), gamma_1 / gamma_2
HW = (5, 6)
U64 = numerics.unit_roundoff("float64")


def _case(preset: str, dtype: str, seed: int = 0):
    """A block config (C = 8, 2 heads), its parameters rounded to ``dtype`` (the gammas drawn around 1, not the
    twin's ones) and an input in float64 (the network cases round it)."""
    cfg = rala.RAVLTBlockConfig.preset(preset, dim=8, num_heads=2)
    rng = np.random.default_rng(seed)
    p = {}
    for k, s in sorted(rala.ravlt_block_param_shapes(cfg).items()):
        v = (1 + 0.5 * rng.standard_normal(s) if k.startswith("gamma_") else
             rng.standard_normal(s) / np.sqrt(max(np.prod(s[1:], dtype=float), 1.0)))
        p[k] = numerics.round_to(v, dtype)
    x = rng.standard_normal((2, 8, *HW) if cfg.attn.layout == "channels_first" else (2, *HW, 8))
    return cfg, p, x


def _cf(a: np.ndarray, cfg) -> np.ndarray:
    return a if cfg.attn.layout == "channels_first" else np.moveaxis(a, -1, 1)


def _tokens(a: np.ndarray, cfg) -> np.ndarray:
    return np.ascontiguousarray(_grid_to_tokens(a, cfg.attn.layout)[0])


def _gamma(cfg, p: dict, key: str):
    return ravlt_bounds._gamma(p, key) if cfg.layerscale else None


def _twin_taps(cfg, p: dict, x: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """The twin block evaluated in ``dtype`` on x (exact in T): its taps as float64."""
    from refimpl.twins.modules.rala import RAVLTBlock
    m = RAVLTBlock(cfg).to(torch.float64)
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in p.items()})
    taps: dict = {}
    with torch.no_grad():
        m.to(getattr(torch, dtype))(torch.from_numpy(x).to(getattr(torch, dtype)), taps=taps)
    return {k: v.to(torch.float64).numpy() for k, v in taps.items()}


def _layer_rec(b: numerics.Bound, e: np.ndarray, k: float, pr: _Prec) -> None:
    """The layer's Bound is E up to the float64 rounding of scale = fl(E / gamma_K) and of gamma_K scale (each
    within u_64 relative, so |rec - E| <= gamma_2(u_64) E), with the path's depth K."""
    assert b.k == k
    rec = pr.g(b.k) * np.asarray(b.scale)
    assert np.all(np.isfinite(e)) and np.all(np.abs(rec - e) <= numerics.gamma(2, U64) * e)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_cpe_layer_and_network_are_one_path(preset, dtype):
    """On the same exact input the network's CPE stage (E in units of u_T) times u_T is cpe_error's absolute bound
    bit for bit (u_T a power of two: the conversion is exact), and so is the layer's cpe_bound up to the float64
    rounding of its representation; the values are layers.cpe's (the block's ravlt_cpe)."""
    cfg, p, x = _case(preset, dtype)
    x = numerics.round_to(x, dtype)
    xc, pr = _cf(x, cfg), _Prec.of(dtype)
    y, e, k = layers.cpe_error(xc, None, p["pos.weight"], p["pos.bias"], pr)
    t = ravlt_bounds._e_cpe(Err(xc, np.zeros_like(xc), 0), p, dtype)
    assert np.array_equal(t.value, y) and np.array_equal(y, _cf(rala.ravlt_cpe(x, p, cfg), cfg))
    assert np.array_equal(nets.to_abs(t.err, dtype), e)
    if dtype == "float32":
        assert t.depth == k          # an n-term sum counts n either way in T = float32
    _layer_rec(layers.cpe_bound(xc, p["pos.weight"], p["pos.bias"], dtype=dtype), e, k, pr)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_residual_layer_and_network_are_one_path(preset, dtype):
    """The same for the residual a + [gamma (.)] b on tokens: the network's stage (ravlt_bounds._e_residual, as
    ravlt._e_part composes it) is residual_error's bound bit for bit, the layer's residual_bound up to its
    float64 representation; with input errors the network's stage is residual_error's with the same errors."""
    cfg, p, _ = _case(preset, dtype)
    rng = np.random.default_rng(7)
    a, b = (numerics.round_to(rng.standard_normal((2, 30, 8)), dtype) for _ in range(2))
    pr, g = _Prec.of(dtype), _gamma(cfg, p, "gamma_1")
    y, e, ks = rala_layer_error.residual_error(a, None, b, None, g, pr)
    t = ravlt_bounds._e_residual(Err(a, np.zeros_like(a), 3), Err(b, np.zeros_like(b), 5), g, dtype)
    assert np.array_equal(t.value, y) and np.array_equal(y, a + (b if g is None else g * b))
    assert np.array_equal(nets.to_abs(t.err, dtype), e) and t.depth == max(3 + ks[0], 5 + ks[1])
    _layer_rec(rala.residual_bound(a, b, g, dtype=dtype), e, max(ks), pr)
    ea, eb = (numerics.unit_roundoff(dtype) * np.abs(rng.standard_normal(a.shape)) for _ in range(2))
    t = ravlt_bounds._e_residual(Err(a, nets.from_abs(ea, dtype), 0), Err(b, nets.from_abs(eb, dtype), 0), g, dtype)
    assert np.array_equal(nets.to_abs(t.err, dtype), rala_layer_error.residual_error(a, ea, b, eb, g, pr)[1])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_bounds_hold_against_the_twin(preset, dtype):
    """Layer bounds: cpe_bound and residual_bound on the twin's own (T-exact) inputs to each step hold against
    the twin's step in T.  Network bounds: the CPE stage with the rounding of x to T as its input error, and the
    residual stages with the twin's observed errors in its operands (its taps against the float64 block's), hold
    against the twin's steps compared with the float64 block on x itself."""
    for seed in range(3):
        cfg, p, x = _case(preset, dtype, seed)
        xt = numerics.round_to(x, dtype)
        tw = _twin_taps(cfg, p, xt, dtype)
        # layer bounds, on the twin's own inputs to each step
        err = np.abs(_cf(tw["cpe"], cfg) - layers.cpe(_cf(xt, cfg), p["pos.weight"], p["pos.bias"]))
        bd = layers.cpe_bound(_cf(xt, cfg), p["pos.weight"], p["pos.bias"], dtype=dtype).array(dtype, err.shape)
        assert np.all(err <= bd), float(np.max(err / bd))
        for res, a, f, key in (("res1", "cpe", "attn", "gamma_1"), ("out", "res1", "ffn", "gamma_2")):
            g = p[key] if cfg.layerscale else None
            err = np.abs(tw[res] - (tw[a] + (tw[f] if g is None else g * tw[f])))
            bd = rala.residual_bound(tw[a], tw[f], g, dtype=dtype).array(dtype, err.shape)
            assert np.all(err <= bd), (res, float(np.max(err / bd)))
        # network bounds, against the float64 block on x
        ref: dict = {}
        rala.ravlt_block(x, p, cfg, taps=ref)
        xc = _cf(x, cfg)
        t = ravlt_bounds._e_cpe(Err(xc, nets.from_abs(np.abs(_cf(xt, cfg) - xc), dtype), 0), p, dtype)
        err = np.abs(_cf(tw["cpe"], cfg) - _cf(ref["cpe"], cfg))
        bd = nets.to_bound(t, "cpe").array(dtype, err.shape)
        assert np.all(err <= bd), float(np.max(err / bd))
        for res, a, f, key in (("res1", "cpe", "attn", "gamma_1"), ("out", "res1", "ffn", "gamma_2")):
            ops = [Err(_tokens(ref[n], cfg), nets.from_abs(np.abs(_tokens(tw[n], cfg) - _tokens(ref[n], cfg)),
                                                              dtype), 0) for n in (a, f)]
            t = ravlt_bounds._e_residual(*ops, _gamma(cfg, p, key), dtype)
            assert np.array_equal(t.value, _tokens(ref[res], cfg))
            err = np.abs(_tokens(tw[res], cfg) - t.value)
            bd = nets.to_bound(t, res).array(dtype, err.shape)
            assert np.all(err <= bd), (res, float(np.max(err / bd)))


def test_layer_bounds_name_their_arguments():
    """The layer bounds' checks name the argument: a CPE kernel of even size, operands of different shapes."""
    cfg, p, x = _case("official", "float32")
    with pytest.raises(Exception, match="'weight'"):
        layers.cpe_bound(x, p["pos.weight"][..., :2, :2], p["pos.bias"], dtype="float32")
    with pytest.raises(Exception, match="'a', 'b'"):
        rala.residual_bound(x, x[..., :3], dtype="float32")
    assert dataclasses.is_dataclass(layers.cpe_bound(x, p["pos.weight"], None, dtype="float32"))
