"""The RALA layer's one error path (refimpl.attention.rala_layer_error.attention_error), shared by the layer's own
bound (rala.rala_attention_bound, exact tokens) and the networks' blocks (refimpl.models.ravlt_bounds._e_attention:
tokens with an input error, the network's depth convention, the convex-combination cap without RoPE).  The
networks' path now carries the term of the rows the core recomputes from log-features (issue 15): with qkv times
2^20 (float64) every row is recomputed, and the networks' bound, with and without an input error, is finite and
holds against the exact layer (60-digit mpmath, tests/test_rala_module_recomputed._exact).  Ordinary inputs keep
every bound bit for bit (checked before/after in the commit).
"""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.attention import rala, rala_layer_error
from refimpl.attention.rala_bounds import _Prec
from refimpl.attention.rala_core import _grid_to_tokens, _split_heads, _tokens_to_grid, recomputed_rows
from refimpl.models import _netparts as nets, common, ravlt_bounds
from refimpl.models.common import Err
from tests.test_rala_module_recomputed import _case, _exact, _tested_bound

CASES = [("paper", "qkv.weight"), ("paper", "qkv.weight+qkv.bias"), ("official", "qkvo.weight+qkvo.bias")]


def _network_bound(tok: np.ndarray, etok: np.ndarray, p: dict, cfg: rala.RALAConfig, hw) -> tuple[Err, np.ndarray]:
    """The networks' attention on tokens with the absolute input error etok: (Err, E = gamma_K(u) scale + K eta)."""
    t = ravlt_bounds._e_attention(Err(tok, nets.from_abs(etok, "float64"), 0), p, cfg, hw, "rala", "float64")
    return t, _tested_bound(common.to_bound(t, "rala"), t.value.shape)


@pytest.mark.parametrize("preset,key", CASES)
def test_network_path_on_recomputed_rows_is_finite_and_safe(preset, key):
    """qkv scaled by 2^20, float64: every row recomputed; the networks' bound is finite and holds against mpmath,
    on exact tokens and on tokens moved by up to 2^-39 |x| (the bound taken with that input error)."""
    x, p, cfg = _case(key, 20, preset=preset)
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    tok = np.ascontiguousarray(tok)
    q, k, _, _ = rala._projections(tok, p, cfg)
    assert np.all(recomputed_rows(_split_heads(q, 2), _split_heads(k, 2), cfg)[0])
    exact = np.ascontiguousarray(_grid_to_tokens(_exact(x, p, cfg), cfg.layout)[0])
    t, e = _network_bound(tok, np.zeros_like(tok), p, cfg, (h, w))
    assert np.all(np.isfinite(e))
    assert np.array_equal(t.value, _grid_to_tokens(rala.rala_attention(x, p, cfg), cfg.layout)[0])
    assert np.all(np.abs(t.value - exact) <= e), float(np.max(np.abs(t.value - exact) / e))
    etok = 2.0 ** -39 * np.abs(tok)
    _, e_in = _network_bound(tok, etok, p, cfg, (h, w))
    assert np.all(np.isfinite(e_in)) and np.all(e_in >= e)
    for seed in range(3):
        s = np.random.default_rng(seed).choice([-1.0, 1.0], size=tok.shape)
        moved = tok * (1.0 + 2.0 ** -40 * s)                    # within 2^-40 |x| (1 + u) of tok
        out = _grid_to_tokens(rala.rala_attention(_tokens_to_grid(moved, h, w, cfg.layout), p, cfg), cfg.layout)[0]
        err = np.abs(out - exact)
        assert np.all(err <= e_in), float(np.max(err / e_in))


@pytest.mark.parametrize("preset", ["paper", "official"])
@pytest.mark.parametrize("log2", [0, 20])
def test_one_path_for_both_callers(preset, log2):
    """The layer's bound is attention_error on exact tokens; the networks' is the same path with the network's
    depth convention and the cap, which only ever lowers or keeps it (and keeps it on ordinary inputs)."""
    key = "qkv.weight" if preset == "paper" else "qkvo.weight"
    x, p, cfg = _case(key, log2, preset=preset)
    tok, h, w = _grid_to_tokens(x, cfg.layout)
    pr = _Prec.of("float64")
    y0, e0, k0 = rala_layer_error.attention_error(tok, None, p, cfg, (h, w), pr)
    y1, e1, k1 = rala_layer_error.attention_error(tok, np.zeros_like(tok), p, cfg, (h, w), pr, convex_cap=True,
                                                  sums=float)
    assert np.array_equal(y0, y1) and k0 == k1             # float64: pr.sums(n) = n
    assert np.all(e1 <= e0)
    if log2 == 0:
        assert np.array_equal(e0, e1)
    b = rala.rala_attention_bound(x, p, cfg, dtype="float64")
    assert b.k == k0
    t = ravlt_bounds._e_attention(Err(np.ascontiguousarray(tok), np.zeros_like(tok), 0), p, cfg, (h, w), "rala",
                                  "float64")
    assert t.depth == k1
