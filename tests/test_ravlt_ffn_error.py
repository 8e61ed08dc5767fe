"""The RAVLT FFN's one error path (refimpl.attention.rala_layer_error.ffn_error, issue 12), shared by the layer's own
bound (rala.ravlt_ffn_bound, exact tokens) and the networks' blocks (refimpl.models.ravlt_bounds._e_ffn: tokens with
an input error, the network's depth convention).  The two were written twice before (the layer's GELU step lacked the
rigorous model's widening gamma_k E_fc1, the network's path was first order with half-precision sums counted as n
roundings): now the network's absolute bound is the layer's to the last bit, and both hold against the twin
(refimpl.twins.modules.rala.RAVLTFFN) evaluated in float32 and float16, the network's with the input's own rounding
to T as its input error.

References: RALA (Fan, Huang, He) §3.2; Higham (2002) eq. 3.12.
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import numerics
from refimpl.attention import rala, rala_layer_error
from refimpl.attention.rala_bounds import _Prec
from refimpl.attention.rala_core import _grid_to_tokens
from refimpl.models import _netparts as nets, ravlt_bounds
from refimpl.models.common import Err

torch = pytest.importorskip("torch")

PRESETS = ["paper", "official"]        # paper: fc1 -> GELU -> fc2 on (B, H, W, C); official: the dwconv residual, (B, C, H, W)
HW = (5, 6)


def _case(preset: str, dtype: str, seed: int = 0):
    """A block config (C = 8, 2 heads), its FFN parameters and an input, the parameters rounded to ``dtype`` (the
    tested code's weights are exact in T), the input in float64 (the network case rounds it)."""
    cfg = rala.RAVLTBlockConfig.preset(preset, dim=8, num_heads=2)
    rng = np.random.default_rng(seed)
    p = {k[len("ffn."):]: numerics.round_to(rng.standard_normal(s) / np.sqrt(np.prod(s[1:], dtype=float)), dtype)
         for k, s in sorted(rala.ravlt_block_param_shapes(cfg).items()) if k.startswith("ffn.")}
    x = rng.standard_normal((2, 8, *HW) if cfg.attn.layout == "channels_first" else (2, *HW, 8))
    return cfg, p, x


def _tokens(a: np.ndarray, cfg) -> np.ndarray:
    return np.ascontiguousarray(_grid_to_tokens(a, cfg.attn.layout)[0])


def _twin(cfg, p: dict, x: np.ndarray, dtype: str) -> np.ndarray:
    """The twin FFN evaluated in ``dtype`` on x (exact in T), as float64."""
    from refimpl.twins.modules.rala import RAVLTFFN
    tdt = getattr(torch, dtype)
    m = RAVLTFFN(cfg).to(torch.float64)
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in p.items()})
    with torch.no_grad():
        return m.to(tdt)(torch.from_numpy(x).to(tdt)).to(torch.float64).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_layer_and_network_bounds_are_one_path(preset, dtype):
    """On the same exact tokens the network's FFN stage (E in units of u_T) times u_T is ffn_error's absolute bound
    bit for bit (u_T a power of two: the conversion is exact), and so is the layer's, up to the float64 rounding of
    its representation scale = fl(E / gamma_K), gamma_K scale = E (1 + theta_2), |theta_2| <= gamma_2(u_64).  The
    values are the FFN's own (ravlt_ffn); the depth is the same in float32 (an n-term sum counts n either way)."""
    cfg, p, x = _case(preset, dtype)
    x = numerics.round_to(x, dtype)
    tok, hw, pr = _tokens(x, cfg), HW, _Prec.of(dtype)
    y, e, k = rala_layer_error.ffn_error(tok, None, p, cfg, hw, pr)
    t = ravlt_bounds._e_ffn(Err(tok, np.zeros_like(tok), 0), p, cfg, hw, dtype)
    assert np.array_equal(t.value, y) and np.array_equal(y, _tokens(rala.ravlt_ffn(x, p, cfg), cfg))
    assert np.array_equal(nets.to_abs(t.err, dtype), e)
    b = rala.ravlt_ffn_bound(x, p, cfg, dtype=dtype)
    assert b.k == k
    if dtype == "float32":
        assert t.depth == k
    rec = pr.g(b.k) * _tokens(np.asarray(b.scale), cfg)
    assert np.all(np.isfinite(e)) and np.all(np.abs(rec - e) <= numerics.gamma(2, numerics.unit_roundoff("float64")) * e)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_bounds_hold_against_the_twin(preset, dtype):
    """The layer's bound on x rounded to T holds against the twin in T on the same x; the network's, with the
    rounding of x to T as its input error, holds against the twin in T on fl_T(x) compared with the float64 FFN
    of x itself."""
    for seed in range(3):
        cfg, p, x = _case(preset, dtype, seed)
        xt = numerics.round_to(x, dtype)
        got = _twin(cfg, p, xt, dtype)
        err = np.abs(got - rala.ravlt_ffn(xt, p, cfg))
        b = rala.ravlt_ffn_bound(xt, p, cfg, dtype=dtype)
        assert np.all(err <= b.array(dtype, err.shape)), float(np.max(err / b.array(dtype, err.shape)))
        tok = _tokens(x, cfg)
        t = ravlt_bounds._e_ffn(Err(tok, nets.from_abs(np.abs(_tokens(xt, cfg) - tok), dtype), 0), p, cfg, HW, dtype)
        err_in = np.abs(_tokens(got, cfg) - _tokens(rala.ravlt_ffn(x, p, cfg), cfg))
        bn = nets.to_bound(t, "ffn").array(dtype, err_in.shape)
        assert np.all(err_in <= bn), float(np.max(err_in / bn))


def test_ffn_bound_names_its_arguments():
    """The layer bound's checks name the argument: a wrong grid, a missing parameter."""
    cfg, p, x = _case("paper", "float32")
    with pytest.raises(Exception, match="'x'"):
        rala.ravlt_ffn_bound(x[..., :4], p, cfg, dtype="float32")
    q = dict(p)
    del q["fc2.bias"]
    with pytest.raises(Exception, match="fc2.bias"):
        rala.ravlt_ffn_bound(x, q, cfg, dtype="float32")

