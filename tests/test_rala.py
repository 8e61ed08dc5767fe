"""Properties of the RALA reference (Fan, Huang & He, CVPR 2025) and its claims about rank.

What is checked (docstrings cite the equation):
- the reference against independent loop oracles (tests/naive_rala.py), paper core and official layer;
- sum_j alpha_j = N (Eq. 3) to rounding; the two association orders agree (Eq. 2); the (HW)^(-1/2)
  scalings are a no-op without eps; RoPE touches the numerator only; RoPE is a rotation whose inner
  products depend on relative position only;
- rank: subadditivity of Eq. 3's buffer for every alpha (rank <= min(N, d)); reweighting can change the
  rank of the buffer but not beyond that bound; without the gate rank(Y) <= min(rank kappa(Q), rank B)
  (Eq. 5); with the gate rank(Y) reaches min(N, d) for generic weights even when rank(kappa(Q) B) = 1
  (Hadamard-product rank, Eq. 6); the §3.2 worked example has rank 2, not the 3 the paper states;
- input validation and the quadratic-size guard.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import config, numerics
from refimpl.analysis import numerical_rank
from refimpl.attention import rala
from tests import naive_rala
from tests.kernel_helpers import twice_bound

#: A scenario check, not a tolerance: in test_eps_matters_only_against_a_tiny_normaliser the dead row of Eq. 2, a
#: weighted mean of standard-normal value rows, is of the values' size ("O(1)"; 0.54 for its draw), while eps pulls
#: the official row to den_0 / (den_0 + eps) ~ 5e-7 of it; at least 1e-2 tells the two apart by orders of magnitude
DEAD_ROW_SIZE_MIN = 1e-2


def _rng_arrays(seed, *shapes, scale=1.0):
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal(s) for s in shapes]


def _random_params(shapes: dict, seed: int, std: float = 0.3) -> dict:
    rng = np.random.default_rng(seed)
    return {k: std * rng.standard_normal(s) for k, s in shapes.items()}


# ---------------------------------------------------------------------------------------------------
# Against the loop oracles
# ---------------------------------------------------------------------------------------------------

@given(st.integers(1, 5), st.integers(1, 4), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2**31))
def test_paper_core_matches_loops(h, w, d, seed):
    """rala_core (paper preset, both orders) equals the loop formulation of Eq. 2-4 and 6 for one head."""
    n = h * w
    q, k, v = _rng_arrays(seed, (1, 1, n, d), (1, 1, n, d), (1, 1, n, d))
    want = naive_rala.naive_paper_core(q[0, 0], k[0, 0], v[0, 0])[None, None]
    for order in ("linear", "quadratic"):
        cfg = rala.RALAConfig(dim=d, num_heads=1, order=order)
        got = rala.rala_core(q, k, v, cfg)
        numerics.assert_close(got, want, twice_bound(rala.rala_core_bound(q, k, v, cfg, dtype="float64")), "float64",
                              name=f"paper core ({order})")


@given(st.integers(1, 4), st.integers(1, 4), st.sampled_from([(1, 4), (2, 4), (1, 8), (2, 8), (1, 12)]),
       st.integers(0, 2**31))
def test_official_layer_matches_loops(h, w, heads_dim, seed):
    """The official preset (fused qkvo conv, ELU+1, mean-of-kappa(Q) global query with d^(-1/2), k *
    softmax * N, 2-D RoPE on the numerator only with row/column halves, (HW)^(-1/2) scalings, eps,
    5x5 LePE, gate, 1x1 projection, channels-first) equals the loop oracle, index by index."""
    nh, d = heads_dim
    c = nh * d
    cfg = rala.RALAConfig.preset("official", dim=c, num_heads=nh)
    params = _random_params(rala.rala_param_shapes(cfg), seed)
    (x,) = _rng_arrays(seed + 1, (1, c, h, w))
    got = rala.rala_attention(x, params, cfg)
    want = naive_rala.naive_official_attention(x, params, nh)
    numerics.assert_close(got, want, twice_bound(rala.rala_attention_bound(x, params, cfg, dtype="float64")),
                          "float64", name="official layer vs loops")


@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from([4, 8, 12, 16, 32]))
def test_rope_angle_table_matches_loop_indexing(h, w, d):
    """rope_2d_angles: channel c of token i has the angle of pair c // 2; pairs below d/4 use row i // W,
    the others column i % W (the released code's layout).  Both evaluate base ** (-q / (d/4 - 1)) once in
    float64 (NumPy vs Python's pow), so they agree within 2 pow ulps."""
    got = rala.rope_2d_angles(h, w, d)
    want = naive_rala.rope_angle_table(h, w, d, config.RALA_ROPE_BASE)
    ulps = config.ELEMENTARY_FUNCTION_ULPS
    numerics.assert_close(got, want, numerics.Bound(np.abs(want), 2 * ulps + 1, "two pows and a product"),
                          "float64")
    # the indexing itself is exact: pairs share angles, and integer rows/columns appear exactly
    np.testing.assert_array_equal(got[:, 0::2], got[:, 1::2])
    np.testing.assert_array_equal(got[:, 0], np.repeat(np.arange(h), w).astype(float))
    np.testing.assert_array_equal(got[:, d // 2], np.tile(np.arange(w), h).astype(float))


# ---------------------------------------------------------------------------------------------------
# Eq. 3-4: alpha, orders, options that are no-ops in exact arithmetic
# ---------------------------------------------------------------------------------------------------

@given(st.integers(1, 300), st.integers(1, 16), st.floats(0.01, 1e3), st.integers(0, 2**31))
def test_alpha_sums_to_n(n, d, spread, seed):
    """Eq. 3: sum_j alpha_j = N.  Computed as N e_j / sum_m e_m then summed, the total is N (sum e / S)
    (1 + theta_2) summed once more: |sum alpha - N| <= gamma_{2N+2} N, whatever the spread of the logits
    (scores up to ~1e5 here; exp never overflows after max-subtraction)."""
    qg, kk = _rng_arrays(seed, (1, 1, 1, d), (1, 1, n, d))
    alpha = rala.reweighting_coefficients(spread * qg, rala.kappa(kk))
    assert alpha.shape == (1, 1, n) and np.all(alpha >= 0)
    numerics.assert_close(np.sum(alpha, axis=-1), np.full((1, 1), float(n)),
                          numerics.Bound(np.full((1, 1), float(n)), 2 * n + 2, "softmax sum and re-sum"),
                          "float64", name="sum alpha")


@given(st.sampled_from(["paper", "official"]), st.sampled_from(["elu1", "relu"]), st.integers(1, 4),
       st.integers(1, 5), st.sampled_from([1, 2]), st.sampled_from([4, 8, 16]), st.integers(0, 2**31))
def test_orders_agree(preset, kernel, h, w, heads, d, seed):
    """Eq. 2: kappa(Q)(sum_j alpha_j kappa(K_j)^T V_j) = (kappa(Q) (alpha kappa(K))^T) V.  Each order
    evaluated in float32 is within the float32 error model of the other order in float64 (so the orders
    compute the same function, and the float64 reference error is negligible at float32 scale)."""
    n = h * w
    q, k, v = (numerics.round_to(a, "float32") for a in _rng_arrays(seed, *[(2, heads, n, d)] * 3))
    base = rala.RALAConfig.preset(preset, dim=heads * d, num_heads=heads, kernel=kernel)
    for lo, hi in (("linear", "quadratic"), ("quadratic", "linear")):
        c32 = dataclasses.replace(base, order=lo)
        c64 = dataclasses.replace(base, order=hi)
        ref = rala.rala_core(q, k, v, c64, (h, w))
        got = numerics.naive_same_precision(rala.rala_core, q, k, v, c32, (h, w), dtype="float32")
        assert got.dtype == np.float32
        numerics.assert_close(got, ref, rala.rala_core_bound(q, k, v, c32, (h, w), dtype="float32"), "float32",
                              name=f"{lo} (float32) vs {hi} (float64)")


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_token_scaling_without_eps_is_a_no_op(h, w, seed):
    """The official (HW)^(-1/2) scalings put the same 1/N on numerator and normaliser: with eps = 0 the
    output equals the unscaled Eq. 2 up to rounding (the float64 bound of either)."""
    n, d = h * w, 8
    q, k, v = _rng_arrays(seed, *[(1, 2, n, d)] * 3)
    mean = rala.RALAConfig.preset("official", dim=16, num_heads=2, eps=0.0)
    total = dataclasses.replace(mean, token_scaling="sum")
    numerics.assert_close(rala.rala_core(q, k, v, mean, (h, w)), rala.rala_core(q, k, v, total, (h, w)),
                          twice_bound(rala.rala_core_bound(q, k, v, mean, (h, w), dtype="float64")), "float64")


def test_eps_matters_only_against_a_tiny_normaliser():
    """With eps = 1e-6 added to the mean-scaled normaliser den_i, row i is scaled by den_i / (den_i + eps): for a
    dead query (kappa(Q_i) -> 0, den_i < eps) the official output is pulled to 0 while Eq. 2's is finite and
    O(1); every other row moves by the relative amount eps / (den_i + eps).

    Both runs form the same num_i and den_i (eps enters only in the normaliser's sum, normaliser_range.
    normaliser_scaled, exact power-of-two scalings aside), so the tapped normalisers satisfy den_eps = fl(den + eps)
    bit for bit, and y_eps = fl(num / den_eps), y = fl(num / den).  The prediction p = fl(fl(y den) / den_eps) is
    then num / den_eps times three rounding factors (y's quotient, the product, the quotient) and y_eps is it times
    one: |y_eps - p| <= gamma_4(u_64) |num / den_eps| <= gamma_5(u_64) |y_eps|."""
    d, n = 4, 6
    q, k, v = _rng_arrays(3, (1, 1, n, d), (1, 1, n, d), (1, 1, n, d))
    q[0, 0, 0] = -30.0                     # kappa(Q_0) = e^-30 ~ 9e-14 per channel: den ~ 1e-13 < eps
    off = rala.RALAConfig.preset("official", dim=d, num_heads=1, rope=False)
    paper_like = dataclasses.replace(off, eps=0.0)
    t_eps, t_exact = {}, {}
    y_eps = rala.rala_core(q, k, v, off, (2, 3), taps=t_eps)
    y_exact = rala.rala_core(q, k, v, paper_like, (2, 3), taps=t_exact)
    den, den_eps = t_exact["denominator"], t_eps["denominator"]
    np.testing.assert_array_equal(den_eps, den + off.eps)
    assert den[0, 0, 0] < off.eps <= np.min(den[0, 0, 1:])          # the scenario: only row 0's query is dead
    assert np.max(np.abs(y_exact[0, 0, 0])) > DEAD_ROW_SIZE_MIN
    predicted = y_exact * den[..., None] / den_eps[..., None]
    assert np.all(np.abs(y_eps - predicted) <= numerics.gamma(5, numerics.unit_roundoff("float64")) * np.abs(y_eps))


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_rope_applies_to_the_numerator_only(h, w, seed):
    """Official preset: the normaliser uses the unrotated kappa(Q_i) and alpha_j kappa(K_j), so it is
    bitwise the same with and without RoPE, while the numerator changes."""
    n, d = h * w, 8
    q, k, v = _rng_arrays(seed, *[(1, 2, n, d)] * 3)
    cfg = rala.RALAConfig.preset("official", dim=16, num_heads=2)
    t_rot, t_plain = {}, {}
    rala.rala_core(q, k, v, cfg, (h, w), taps=t_rot)
    rala.rala_core(q, k, v, dataclasses.replace(cfg, rope=False), (h, w), taps=t_plain)
    np.testing.assert_array_equal(t_rot["denominator"], t_plain["denominator"])
    np.testing.assert_array_equal(t_rot["k_weighted"], t_plain["k_weighted"])
    if n > 1:
        assert not np.array_equal(t_rot["numerator"], t_plain["numerator"])


def test_rope_weights_do_not_sum_to_one():
    """Consequence of the numerator-only RoPE: the effective weights rot(kappa Q_i) . rot(alpha_j kappa K_j)
    / den_i of a row do not sum to 1, while without RoPE they do (to gamma_{N+d+2}: non-negative terms)."""
    h, w, d = 3, 4, 8
    n = h * w
    q, k, v = _rng_arrays(11, *[(1, 1, n, d)] * 3)
    cfg = rala.RALAConfig.preset("official", dim=d, num_heads=1, order="quadratic", eps=0.0)
    ones = np.ones((1, 1, n))
    bound = numerics.Bound(ones, n + d + 2, "row sum of non-negative weights")
    for rope, expect in ((False, True), (True, False)):
        t = {}
        rala.rala_core(q, k, v, dataclasses.replace(cfg, rope=rope), (h, w), taps=t)
        rowsum = np.sum(t["attn"], axis=-1) / t["denominator"]
        assert numerics.compare(rowsum, ones, bound, "float64").within_bound == expect


@given(st.sampled_from([4, 8, 16]), st.integers(0, 5), st.integers(0, 5), st.integers(0, 5), st.integers(0, 5),
       st.integers(0, 3), st.integers(0, 3), st.integers(0, 2**31))
def test_rope_is_relative(d, r1, c1, r2, c2, dr, dc, seed):
    """2-D RoPE is a rotation per channel pair (norms kept) and rot_i(q) . rot_j(k) depends only on
    (row_i - row_j, col_i - col_j): shifting both tokens by (dr, dc) leaves it unchanged (RoFormer Eq. 16,
    applied per axis)."""
    hh, ww = 9, 9
    ang = rala.rope_2d_angles(hh, ww, d)
    q, k = _rng_arrays(seed, (d,), (d,))
    tok = lambda r, c: r * ww + c
    rot = lambda x, i: rala.apply_rope_2d(np.broadcast_to(x, (hh * ww, d)), ang)[i]
    a = rot(q, tok(r1, c1)) @ rot(k, tok(r2, c2))
    b = rot(q, tok(r1 + dr, c1 + dc)) @ rot(k, tok(r2 + dr, c2 + dc))
    scale = np.abs(q) @ np.abs(k)
    numerics.assert_close(np.array([b]), np.array([a]),
                          numerics.Bound(np.array([4 * scale * (1 + 2 * 16.0)]), d + 4 * config.ELEMENTARY_FUNCTION_ULPS,
                                         "4 rotated dot products; cos/sin of angles up to 16 rad"), "float64")
    rq = rot(q, tok(r1, c1))
    pn = lambda x: x[0::2] ** 2 + x[1::2] ** 2
    numerics.assert_close(pn(rq), pn(q), numerics.Bound(pn(q) * (1 + 2 * 16.0), 8 + 4 * config.ELEMENTARY_FUNCTION_ULPS,
                                                        "pair norms"), "float64")


def test_gate_options_are_eq6_hadamard_products():
    """Eq. 6 with phi = identity or tanh (Table 9): Y = phi(X) (.) core, exactly (one product)."""
    c, h, w = 8, 3, 2
    for gate, fn in (("identity", lambda t: t), ("tanh", np.tanh)):
        cfg = rala.RALAConfig(dim=c, num_heads=2, gate=gate)
        params = _random_params(rala.rala_param_shapes(cfg), 1)
        assert "phi.weight" not in params
        (x,) = _rng_arrays(2, (1, h, w, c))
        taps = {}
        y = rala.rala_attention(x, params, cfg, taps=taps)
        np.testing.assert_array_equal(y.reshape(1, h * w, c), fn(x.reshape(1, h * w, c)) * taps["core"])
    cfg = rala.RALAConfig(dim=c, num_heads=2, gate="none")
    params = _random_params(rala.rala_param_shapes(cfg), 1)
    taps = {}
    y = rala.rala_attention(x, params, cfg, taps=taps)
    np.testing.assert_array_equal(y.reshape(1, h * w, c), taps["core"])


def test_gate_from_fused_projection_equals_separate_linear():
    """The official gate is the 4th C-block of the qkvo projection, i.e. a linear phi with those rows:
    splitting the fused weight into "qkv" and "phi" gives the same layer (Eq. 6, phi linear)."""
    c = 8
    fused = rala.RALAConfig(dim=c, num_heads=2, gate_source="qkvo")
    sep = rala.RALAConfig(dim=c, num_heads=2)
    p = _random_params(rala.rala_param_shapes(fused), 5)
    ps = {"qkv.weight": p["qkvo.weight"][:3 * c], "qkv.bias": p["qkvo.bias"][:3 * c],
          "phi.weight": p["qkvo.weight"][3 * c:], "phi.bias": p["qkvo.bias"][3 * c:]}
    (x,) = _rng_arrays(6, (2, 3, 3, c))
    np.testing.assert_array_equal(rala.rala_attention(x, p, fused), rala.rala_attention(x, ps, sep))


def test_layouts_agree():
    """channels-first (B, C, H, W) with 1x1 conv weights and tokens (B, H, W, C) with Linear weights are the
    same layer (a 1x1 conv is a per-pixel linear map)."""
    c = 8
    cf = rala.RALAConfig.preset("official", dim=c, num_heads=2)
    tk = dataclasses.replace(cf, layout="tokens")
    p = _random_params(rala.rala_param_shapes(cf), 7)
    pt = {k: (v[:, :, 0, 0] if v.ndim == 4 and v.shape[2:] == (1, 1) else v) for k, v in p.items()}
    (x,) = _rng_arrays(8, (2, c, 3, 4))
    y_cf = rala.rala_attention(x, p, cf)
    y_tk = rala.rala_attention(np.moveaxis(x, 1, -1), pt, tk)
    np.testing.assert_array_equal(np.moveaxis(y_tk, -1, 1), y_cf)


def test_block_is_its_stages():
    """ravlt_block = CPE, x + RALA(LN x), x + FFN(LN x) (§3.2, Fig. 6; official: layerscale factors on both
    branches), stage by stage from its taps."""
    for preset in ("paper", "official"):
        cfg = rala.RAVLTBlockConfig.preset(preset, dim=8, num_heads=2)
        p = _random_params(rala.ravlt_block_param_shapes(cfg), 9)
        shape = (1, 8, 3, 4) if cfg.attn.layout == "channels_first" else (1, 3, 4, 8)
        (x,) = _rng_arrays(10, shape)
        t = {}
        out = rala.ravlt_block(x, p, cfg, taps=t)
        from refimpl import layers
        cpe = rala.ravlt_cpe(x, p, cfg)
        np.testing.assert_array_equal(t["cpe"], cpe)
        np.testing.assert_array_equal(t["attn"], rala.rala_attention(t["norm1"], layers.subparams(p, "attn"), cfg.attn))
        g1, g2 = (p["gamma_1"], p["gamma_2"]) if cfg.layerscale else (1.0, 1.0)
        assert cfg.layerscale == (preset == "official")
        np.testing.assert_array_equal(t["res1"], cpe + g1 * t["attn"])
        np.testing.assert_array_equal(t["ffn"], rala.ravlt_ffn(t["norm2"], layers.subparams(p, "ffn"), cfg))
        np.testing.assert_array_equal(out, t["res1"] + g2 * t["ffn"])


# ---------------------------------------------------------------------------------------------------
# Rank (§3.2, Eq. 3, 5, 6)
# ---------------------------------------------------------------------------------------------------

def test_section_3_2_worked_example_has_rank_2_not_3():
    """§3.2 prints 1 x [[1,1,1],[2,2,2],[3,3,3]] + 1 x [[1,2,3],[1,2,3],[1,2,3]] = [[2,3,4],[3,4,5],[4,5,6]]
    and states that "a linear combination of two rank-1 matrices can result in a matrix with rank 3".
    The sum is printed correctly, but its rank is 2: rank(A + B) <= rank A + rank B = 2 (subadditivity).
    Exact integer arithmetic: det = 0 and a non-zero 2x2 minor."""
    a = np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]])
    b = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    printed = np.array([[2, 3, 4], [3, 4, 5], [4, 5, 6]])
    np.testing.assert_array_equal(1 * a + 1 * b, printed)
    m = printed.tolist()
    det = (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
           + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    assert det == 0                                   # not rank 3
    assert m[0][0] * m[1][1] - m[0][1] * m[1][0] == -1  # a non-zero 2x2 minor: rank exactly 2
    assert list(numerical_rank(np.stack([a, b, printed]).astype(float))) == [1, 1, 2]


def test_reweighting_can_change_the_buffer_rank_within_the_bound():
    """Eq. 3 with N = 3 tokens, d = 2: for alpha = (1, 1, 1) the buffer sum_j alpha_j k_j^T v_j is singular
    (rank 1); alpha = (1, 1, 2) makes it rank 2 = min(N, d); no alpha exceeds 2.  Exact rationals."""
    k = [(1, 0), (0, 1), (1, 1)]
    v = [(1, 0), (0, 1), (Fraction(-1, 2), Fraction(-1, 2))]

    def buf(alpha):
        return [[sum(Fraction(alpha[j]) * k[j][a] * v[j][b] for j in range(3)) for b in range(2)] for a in range(2)]

    det = lambda m: m[0][0] * m[1][1] - m[0][1] * m[1][0]
    b1, b2 = buf((1, 1, 1)), buf((1, 1, 2))
    assert det(b1) == 0 and any(x != 0 for row in b1 for x in row)      # rank 1
    assert det(b2) != 0                                                  # rank 2
    assert list(numerical_rank(np.array([[[float(x) for x in r] for r in m] for m in (b1, b2)]))) == [1, 2]


@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 12), st.sampled_from(["positive", "any", "spiky"]),
       st.integers(0, 2**31))
def test_buffer_rank_is_subadditive_for_every_alpha(n, d, e, kind, seed):
    """Eq. 3: B = sum_j alpha_j kappa(K_j)^T V_j is a sum of N rank-<=1 matrices and is (d x e), so
    rank B <= min(N, d, e) for every alpha (positive, signed, or concentrated on one token).  The
    reweighting changes B's singular values (its conditioning) but never this bound."""
    rng = np.random.default_rng(seed)
    kk = rala.kappa(rng.standard_normal((1, 1, n, d)))
    v = rng.standard_normal((1, 1, n, e))
    alpha = {"positive": rng.random((1, 1, n)) * n, "any": rng.standard_normal((1, 1, n)),
             "spiky": np.where(np.arange(n) == 0, float(n), 1e-12)[None, None]}[kind]
    b = rala.kv_buffer(alpha, kk, v)
    assert b.shape == (1, 1, d, e)
    assert int(numerical_rank(b[0, 0])) <= min(n, d, e)


@given(st.integers(1, 4), st.sampled_from([8, 16]), st.integers(0, 2**31))
def test_output_rank_without_gate_is_bounded_by_the_buffer(r, d, seed):
    """Eq. 5: Y = kappa(Q) B (the scalar normaliser is a row scaling) has rank <= min(rank kappa(Q),
    rank B) <= d.  With V of rank r < d, rank(Y) <= r, for the paper core."""
    n = 48
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 1, n, d))
    v = (rng.standard_normal((n, r)) @ rng.standard_normal((r, d)))[None, None]
    taps = {}
    y = rala.rala_core(q, k, v, rala.RALAConfig(dim=d, num_heads=1), taps=taps)
    rb = int(numerical_rank(taps["kv"][0, 0]))
    ry = int(numerical_rank(y[0, 0]))
    assert rb <= r
    assert ry <= min(int(numerical_rank(taps["kappa_q"][0, 0])), rb)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gate_restores_full_rank(seed):
    """Eq. 6: phi(X) (.) Y with phi a generic linear projection reaches rank min(N, d) even when
    rank(kappa(Q) B) = 1 (V of rank 1): Y_i = s_i w, so phi(X) (.) Y = diag(s) phi(X) diag(w), of the rank
    of phi(X).  Without the gate the same layer has rank 1.  (Rank of a Hadamard product: rank(A (.) B)
    <= rank A rank B, and it can reach it.)  Fixed seeds: 'generic' holds with probability 1."""
    n, d = 64, 16
    rng = np.random.default_rng(seed)
    cfg = rala.RALAConfig(dim=d, num_heads=1)
    params = {"qkv.weight": rng.standard_normal((3 * d, d)) / 4, "qkv.bias": np.zeros(3 * d),
              "phi.weight": rng.standard_normal((d, d)) / 4, "phi.bias": rng.standard_normal(d) / 4}
    # rank-1 V: every V row is a multiple of one vector (V weights of rank 1, zero bias)
    params["qkv.weight"][2 * d:] = np.outer(rng.standard_normal(d), rng.standard_normal(d)) / 4
    x = rng.standard_normal((1, 8, 8, d))
    taps = {}
    y = rala.rala_attention(x, params, cfg, taps=taps)
    assert int(numerical_rank(taps["core"][0])) == 1
    assert int(numerical_rank(y.reshape(n, d))) == d
    no_gate = {k: v for k, v in params.items() if not k.startswith("phi.")}   # gate "none" has no phi
    y0 = rala.rala_attention(x, no_gate, dataclasses.replace(cfg, gate="none"))
    assert int(numerical_rank(y0.reshape(n, d))) == 1


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_hadamard_rank_is_submultiplicative(r1, r2, seed):
    """rank(A (.) B) <= rank A * rank B (the bound behind Eq. 6's gate; Horn & Johnson, Topics, Thm 5.1.7)."""
    rng = np.random.default_rng(seed)
    n, d = 40, 20
    a = rng.standard_normal((n, r1)) @ rng.standard_normal((r1, d))
    b = rng.standard_normal((n, r2)) @ rng.standard_normal((r2, d))
    assert int(numerical_rank(a * b)) <= min(r1 * r2, d)


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    cfg = rala.RALAConfig(dim=8, num_heads=2)
    q = np.zeros((1, 2, 6, 4))
    with pytest.raises(ValueError, match="argument 'k'"):
        rala.rala_core(q, np.zeros((1, 2, 5, 4)), q, cfg)
    with pytest.raises(TypeError, match="argument 'q'"):
        rala.rala_core(q.astype(int), q, q, cfg)
    with pytest.raises(ValueError, match="head_dim % 4"):
        rala.RALAConfig(dim=6, num_heads=1, rope=True)
    with pytest.raises(ValueError, match="not divisible"):
        rala.RALAConfig(dim=6, num_heads=4)
    with pytest.raises(ValueError, match="gate_source='qkvo'"):
        rala.RALAConfig(dim=8, num_heads=2, gate="tanh", gate_source="qkvo")
    with pytest.raises(ValueError, match="expected one of"):
        rala.RALAConfig(dim=8, num_heads=2, kernel="softmax")
    with pytest.raises(ValueError, match="'paper' or 'official'"):
        rala.RALAConfig.preset("released", dim=8, num_heads=2)
    with pytest.raises(ValueError, match="argument 'hw'"):
        rala.rala_core(q, q, q, rala.RALAConfig.preset("official", dim=8, num_heads=2), (2, 2))
    with pytest.raises(ValueError, match="argument 'x'"):
        rala.rala_attention(np.zeros((1, 3, 3, 6)), {}, cfg)
    with pytest.raises(KeyError, match="phi.weight"):
        rala.rala_attention(np.zeros((1, 3, 3, 8)), {"qkv.weight": np.zeros((24, 8))}, cfg)
    with pytest.raises(ValueError, match="parameter 'qkv.weight'"):
        rala.rala_attention(np.zeros((1, 3, 3, 8)), {"qkv.weight": np.zeros((24, 8, 1, 1))}, cfg)


def test_quadratic_order_refuses_large_sizes_and_points_to_linear():
    cfg = rala.RALAConfig(dim=4, num_heads=1, order="quadratic")
    q = np.zeros((1, 1, 64, 4))
    with pytest.raises(ValueError, match="order='linear'"):
        rala.rala_core(q, q, q, cfg, max_elements=64 * 63)
    assert rala.rala_core(q, q, q, dataclasses.replace(cfg, order="linear"), max_elements=1).shape == q.shape


def test_nan_propagates_and_dead_relu_rows_give_nan():
    """A dead ReLU query row (kappa(Q_i) = 0) makes Eq. 2's normaliser 0 and the output 0/0 = NaN in the
    paper preset (no eps); the official eps turns it into 0.  A NaN input propagates."""
    n, d = 6, 4
    q, k, v = _rng_arrays(0, *[(1, 1, n, d)] * 3)
    q, k = np.abs(q), np.abs(k)
    q[0, 0, 2] = -1.0
    y = rala.rala_core(q, k, v, rala.RALAConfig(dim=d, num_heads=1, kernel="relu"))
    assert np.all(np.isnan(y[0, 0, 2])) and np.all(np.isfinite(np.delete(y[0, 0], 2, axis=0)))
    y_off = rala.rala_core(q, k, v, rala.RALAConfig.preset("official", dim=d, num_heads=1, kernel="relu"), (2, 3))
    np.testing.assert_array_equal(y_off[0, 0, 2], np.zeros(d))
    k[0, 0, 1, 1] = np.nan
    assert np.all(np.isnan(rala.rala_core(q, k, v, rala.RALAConfig(dim=d, num_heads=1))))
