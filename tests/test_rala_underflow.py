"""RALA's core where Eq. 4's weights alpha_j underflow and where RoPE's channel pairs are far apart, against
60-digit mpmath (tests/test_range_bounds.py's reference of Eq. 2-4 with the released code's options).

1. Underflowed alpha_j (rala_recomputed._rows_error, "alpha").  A key whose logit lies far below the largest
   has alpha~_j = 0; its absolute error bound is eta-level (N (c + 3) eta_T, rala_bounds._alpha_error), and
   where the head's surviving weights are themselves tiny (the one surviving key's features near exp(-737) in
   the channels the queries use) that error outweighs them.  The bound then used to subtract it from the
   normaliser and had none (inf); it now divides by the normaliser of the lowered weights max(alpha~ -
   E_alpha, 0) (an underflowed key counts 0) and, without RoPE, is at most the width of the values' range
   (both outputs are convex combinations of the V_j).  Never exceeded, by the definition or by the twin's
   direct float64 evaluation, and finite on every recomputed row for the paper preset without RoPE and the
   official preset (with RoPE); the paper preset with RoPE leaves some rows inf (its far-apart pair, below).
   Not tight there: the model lets an exp of an argument far below the underflow threshold
   return c eta_T, which would make that key dominate; NumPy's exp returns 0 (measured err/E <= 2e-5).
2. The rows recomputed without RoPE (the paper preset) take the rule of the rotated rows with R = 1: the
   exp arguments' roundings as normaliser_range.rebalance_parts forms them, (lq - lq*) + (m - m*) (not the
   older lq + m and a - r), and alpha's error outside gamma_k.  Safe on the four adversarial families of
   tests/test_range_bounds.py item 5 and tight where the arguments' roundings reach the output: >= 1/8 on the
   official preset's binade and eps families (measured 0.31 and 0.85; the former rule 1e-3 and 8e-3), >= 1/1024
   on the others (measured 2e-3 .. 7e-2): tests/test_range_bounds.py, test_rala_core_bound_on_recomputed_rows
   with rope=False.
3. RoPE pairs far apart.  Channels 0 and 1 (one RoPE pair) with key features exp(-1800) and exp(-1000) and a
   query's exp(-1000) and exp(-1800): one factor per pair leaves the rebalanced normaliser exp(-800) + exp(-800)
   = 0 in float64.  On a one-row grid that pair is never rotated (angle row * omega = 0 for every token), so it
   keeps one factor per channel (rala_core.rope_shared_pairs): the exact result, finite and ordinary, comes
   back within its bound (before: FloatingPointError).  On a 2 x 2 grid the pair turns by different angles, its
   cross terms exp(-2000) meet the normaliser exp(-2800): the exact result is beyond float64 (mpmath), and the
   error says so.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from refimpl import numerics
from refimpl.attention import normaliser_range, rala_bounds, rala_recomputed
from refimpl.attention.rala_bounds import rala_core_bound
from refimpl.attention.rala_core import RALAConfig, rala_core, recomputed_rows
from tests.test_range_bounds import _rala_exact

mpmath.mp.dps = 60


def _masked(seed: int) -> tuple:
    """Item 1's inputs (1, 2, 4, 8) on a 2 x 2 grid: key 0 the one surviving weight (its logit through channel
    0 of the global query, which token 0 makes large), key 1 large in channel 1 with its alpha underflowed, the
    other keys' and queries' features near exp(-740) but for channel 1 of queries 1..3."""
    rng = np.random.default_rng(seed)
    sh = (1, 2, 4, 8)
    q, k, v = rng.standard_normal(sh), rng.standard_normal(sh) - 740.0, rng.standard_normal(sh)
    q[..., 0, 0] = rng.uniform(2500, 3500)
    q[..., 1:, 0] = -740.0 + rng.standard_normal((1, 2, 3))
    q[..., 0, 1] = -rng.uniform(2500, 3500)
    q[..., 1:, 1] = rng.uniform(0, 2, (1, 2, 3))
    k[..., 0, 0] = rng.uniform(3, 12)
    k[..., 1, 1] = rng.uniform(3, 60)
    return q, k, v


@pytest.mark.parametrize("preset,rope", [("paper", False), ("paper", True), ("official", True)])
def test_underflowed_alpha_rows_have_a_finite_safe_bound(preset, rope):
    """Item 1 (module docstring): four draws each.  The paper preset with RoPE: tokens 2 and 3 (the grid's
    second row) meet the surviving key through a rotation that mixes its far-apart channels 0 and 1: their
    exact result is beyond float64 (mpmath) and rala_core raises; tokens 0 and 1 share its angle, and where the
    shared pair factor leaves the rebalanced normaliser subnormal their bound is inf (not covered here)."""
    torch = pytest.importorskip("torch")
    from refimpl.twins.modules.rala import rala_core as rala_core_t
    hw, pr = (2, 2), rala_bounds._Prec.of("float64")
    checked = 0
    for seed in range(4):
        q, k, v = _masked(seed)
        cfg = RALAConfig.preset(preset, dim=16, num_heads=2, rope=rope)
        hit, alpha = recomputed_rows(q, k, cfg)
        assert np.any(alpha == 0) and np.all(hit)
        exact = _rala_exact(q, k, v, cfg, hw[1])
        e = rala_core_bound(q, k, v, cfg, hw, dtype="float64").array("float64", q.shape)
        e_rec = rala_bounds._recomputed(np.full(q.shape, np.inf), hit, q, k, v, alpha, cfg, hw, pr)
        live = np.isfinite(exact)
        outs = []
        try:
            outs.append(rala_core(q, k, v, cfg, hw))
        except FloatingPointError:                  # a rotated row beyond float64 (the exact one is too)
            assert rope and not np.all(live)
        with torch.no_grad():
            outs.append(rala_core_t(*(torch.from_numpy(a) for a in (q, k, v)), cfg, hw).numpy())
        if not (preset == "paper" and rope):
            assert np.all(live) and np.all(np.isfinite(e)) and np.all(np.isfinite(e_rec))
        for out in outs:
            ok = live & np.isfinite(out) & np.isfinite(e)
            assert np.all(np.abs(out - exact)[ok] <= e[ok]), np.max((np.abs(out - exact) / e)[ok])
            checked += int(np.sum(ok))
        if not rope:    # the recomputation's bound is at most its rounding terms (alpha exact) plus the width
            # of the range that holds both outputs ([min V, max V], widened to 0 with eps); 4 u: the roundings
            # of that sum and its scaling as _rows_error evaluates it
            rounding = rala_recomputed._rows_error(np.full(q.shape, np.inf), hit, q, k, v, alpha, None, cfg, hw, pr)
            hi, lo = np.max(v, axis=-2, keepdims=True), np.min(v, axis=-2, keepdims=True)
            if cfg.eps:
                hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)
            assert np.all(e_rec <= (rounding + (hi - lo)) * (1 + 4 * pr.u))
    assert checked > 0


def _far_pair(grid: tuple) -> tuple:
    """Item 3's inputs (1, 2, N, 4): channels 0 and 1 (RoPE pair 0, rotated by the row) far apart."""
    rng = np.random.default_rng(0)
    n = grid[0] * grid[1]
    q, k = np.empty((1, 2, n, 4)), np.empty((1, 2, n, 4))
    q[..., 0], q[..., 1], q[..., 2:] = -1000.0, -1800.0, -1800.0
    k[..., 0], k[..., 1], k[..., 2:] = -1800.0, -1000.0, -1800.0
    q += 0.1 * rng.standard_normal(q.shape)
    k += 0.1 * rng.standard_normal(k.shape)
    return q, k, rng.standard_normal((1, 2, n, 4))


def test_rope_pair_far_apart_on_a_one_row_grid():
    """Item 3: the unrotated pair keeps a factor per channel; the result is the exact one, within its bound."""
    cfg = RALAConfig.preset("paper", dim=8, num_heads=2, rope=True, reweight=False)
    q, k, v = _far_pair((1, 4))
    exact = _rala_exact(q, k, v, cfg, 4)
    assert np.all(np.isfinite(exact))
    out = rala_core(q, k, v, cfg, (1, 4))
    bound = rala_core_bound(q, k, v, cfg, (1, 4), dtype="float64")
    e = bound.array("float64", q.shape)
    assert np.all(np.isfinite(e)) and np.all(np.abs(out - exact) <= e)
    # tight as the rows rala_core rescales (tests/test_range_bounds.py item 4: E <= 8 K u max |v|, the
    # threshold <= 16 gamma_K max |v| + 2 K eta): the exp arguments here are differences of logs within a
    # factor 2 of each other (-1000, -1800 and 0.1 apart), exact by Sterbenz, so they add nothing (measured 1.5)
    g, eta = numerics.gamma(bound.k, numerics.unit_roundoff("float64")), numerics.underflow_eta("float64")
    assert np.all(e <= 16 * g * np.max(np.abs(v)) + 2 * bound.k * eta)
    # one factor for every pair (the former rule) leaves the rebalanced normaliser 0: no result
    lq, lk = q, k                                                  # ELU + 1 of x <= 0 is exp(x): its log is x
    with np.errstate(all="ignore"):
        pq, pk, _ = normaliser_range.rebalance(lq, lk, True)
        assert np.any(np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2)) == 0)
        pq, pk, _ = normaliser_range.rebalance(lq, lk, np.array([False, True]))
        assert np.all(np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2)) >= 1)


def test_rope_pair_far_apart_rotated_is_beyond_float64():
    """Item 3: on a 2 x 2 grid the pair rotates; the exact result is beyond float64 and the error says why."""
    cfg = RALAConfig.preset("paper", dim=8, num_heads=2, rope=True, reweight=False)
    q, k, v = _far_pair((2, 2))
    with np.errstate(over="ignore"):
        exact = _rala_exact(q, k, v, cfg, 2)
    assert not np.all(np.isfinite(exact))
    with pytest.raises(FloatingPointError, match=r"rala_core: .* RoPE channel pair rotated by angles that differ "
                                                 r"between tokens .* the exact result is beyond float64"):
        rala_core(q, k, v, cfg, (2, 2))
