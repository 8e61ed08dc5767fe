"""rala_attention_bound on the rows rala_core recomputes from log-features (issue 15, the campaign's "key_big"):
qkv.weight / qkv.bias scaled by 2^20 make the projected keys' ELU + 1 features exp(-2^20 |x|) underflow, so every
row is recomputed; the layer's bound there (rala_module_recomputed.module_recomputed_error) must be finite and hold
against the exact layer (60-digit mpmath from the float64 x and parameters, projections included).  Ordinary inputs
keep their bounds bit for bit (checked before/after in the commit; here: no row is recomputed, so the module returns
its input unchanged).
"""

from __future__ import annotations

import dataclasses

import mpmath
import numpy as np
import pytest

from refimpl import numerics
from refimpl.attention import rala
from refimpl.attention.rala_core import _split_heads, recomputed_rows
from tests.test_range_bounds import _rot

mpmath.mp.dps = 60


def _case(key: str, log2: int, seed: int = 3, preset: str = "paper"):
    cfg = rala.RALAConfig.preset(preset, dim=8, num_heads=2)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 3, 8) if cfg.layout == "tokens" else (1, 8, 3, 3))
    p = {k: rng.standard_normal(s) * 0.3 for k, s in sorted(rala.rala_param_shapes(cfg).items())}
    for name in key.split("+"):
        p[name] = p[name] * 2.0 ** log2
    return x, p, cfg


def _exact(x: np.ndarray, p: dict, cfg: rala.RALAConfig) -> np.ndarray:
    """The layer in mpmath from the float64 x and parameters: the fused projection (qkv, or qkvo with the gate's
    block), kappa = ELU + 1, Eq. 4's alpha (Q_g the mean of Q or of kappa(Q), the d^-1/2 scale; 1 without
    ``cfg.reweight``), Eq. 2-3 with RoPE on the numerator (exact angles, tests/test_range_bounds._rot), the token
    mean and eps, LePE ('same' depthwise conv of V), the gate (Eq. 6) and the output projection."""
    c, nh = cfg.dim, cfg.num_heads
    d = c // nh
    hh_, ww_ = (x.shape[1], x.shape[2]) if cfg.layout == "tokens" else (x.shape[2], x.shape[3])
    tok = x.reshape(-1, c) if cfg.layout == "tokens" else x[0].reshape(c, -1).T
    n = tok.shape[0]
    mf = lambda t: mpmath.mpf(float(t))
    lin = lambda src, wt, b: [[mpmath.fsum(src[i][a] * mf(wt[r, a]) for a in range(c)) + mf(b[r])
                               for r in range(wt.shape[0])] for i in range(n)]
    src = [[mf(t) for t in row] for row in tok]
    fused = "qkvo" if cfg.gate_source == "qkvo" else "qkv"
    proj = lin(src, p[fused + ".weight"].reshape(-1, c), p[fused + ".bias"])
    gate = [row[3 * c:] for row in proj] if fused == "qkvo" else lin(src, p["phi.weight"].reshape(c, c),
                                                                      p["phi.bias"])
    kap = lambda t: t + 1 if t > 0 else mpmath.exp(t)
    norm = mpmath.mpf(1) / n if cfg.token_scaling == "mean" else 1
    y = [[mpmath.mpf(0)] * c for _ in range(n)]
    for hh in range(nh):
        q = [[proj[i][hh * d + e] for e in range(d)] for i in range(n)]
        k = [[proj[i][c + hh * d + e] for e in range(d)] for i in range(n)]
        v = [[proj[i][2 * c + hh * d + e] for e in range(d)] for i in range(n)]
        kq = [[kap(t) for t in row] for row in q]
        kk = [[kap(t) for t in row] for row in k]
        alpha = [mpmath.mpf(1)] * n
        if cfg.reweight:
            g_src = q if cfg.global_query == "q" else kq
            qg = [mpmath.fsum(g_src[i][e] for i in range(n)) / n for e in range(d)]
            sc = 1 / mpmath.sqrt(d) if cfg.alpha_scale == "head_dim" else 1
            s = [sc * mpmath.fsum(qg[e] * kk[j][e] for e in range(d)) for j in range(n)]
            ex = [mpmath.exp(t - max(s)) for t in s]
            alpha = [n * t / mpmath.fsum(ex) for t in ex]
        kw = [[alpha[j] * t for t in kk[j]] for j in range(n)]
        qn, kn = kq, kw
        if cfg.rope:
            qn = [_rot(kq[i], i, ww_, cfg.rope_base) for i in range(n)]
            kn = [_rot(kw[j], j, ww_, cfg.rope_base) for j in range(n)]
        for i in range(n):
            a = [mpmath.fsum(qn[i][e] * kn[j][e] for e in range(d)) for j in range(n)]
            den = norm * mpmath.fsum(kq[i][e] * kw[j][e] for j in range(n) for e in range(d)) + cfg.eps
            for e in range(d):
                y[i][hh * d + e] = norm * mpmath.fsum(a[j] * v[j][e] for j in range(n)) / den
    if cfg.lepe_kernel:
        wl, r = p["lepe.weight"], cfg.lepe_kernel // 2
        for i in range(n):
            ri, ci = divmod(i, ww_)
            for ch in range(c):
                acc = [mf(wl[ch, 0, a + r, b + r]) * proj[rr * ww_ + cc][2 * c + ch]
                       for a in range(-r, r + 1) for b in range(-r, r + 1)
                       for rr, cc in [(ri + a, ci + b)] if 0 <= rr < hh_ and 0 <= cc < ww_]
                y[i][ch] += mpmath.fsum(acc) + mf(p["lepe.bias"][ch])
    y = [[y[i][ch] * gate[i][ch] for ch in range(c)] for i in range(n)]
    if cfg.out_proj:
        y = lin(y, p["proj.weight"].reshape(c, c), p["proj.bias"])
    out = np.array([[float(t) for t in row] for row in y])
    return out.reshape(x.shape) if cfg.layout == "tokens" else out.T.reshape(x.shape)


def _tested_bound(b, shape) -> np.ndarray:
    """E = gamma_K(u) scale + K eta: the bound on the tested (here: the reference's own float64) evaluation."""
    return b.factor("float64") * np.broadcast_to(np.asarray(b.scale), shape) + b.k * np.finfo(np.float64).smallest_subnormal / 2


# (key, reweight): the floor on the worst err/E over 2^20 and 2^60 (measured: 0.065, 0.026, 0.055, 0.025; at 2^60
# alone the rounding term's factor G overflows and the width bound remains, err/E 5e-15).  None: no floor - with
# Eq. 4's saturated alpha (one key keeps alpha = N, the others underflow to 0) the model lets an underflowed key's
# exp return c eta_T (rala_recomputed._rows_error, "alpha"), which may then dominate the row: the bound is V's
# range there (measured err/E 1e-13), as rala_core_bound's on the same rows.
CASES = [("qkv.weight", True, None), ("qkv.bias", True, 2.0 ** -7), ("qkv.weight+qkv.bias", True, None),
         ("qkv.weight", False, 2.0 ** -7), ("qkv.bias", False, 2.0 ** -7), ("qkv.weight+qkv.bias", False, 2.0 ** -7)]


@pytest.mark.parametrize("key,reweight,floor", CASES)
def test_key_big_rows_have_a_finite_safe_bound(key, reweight, floor):
    """qkv scaled by 2^20 and 2^60 (float64): every row is recomputed, the bound is finite and the reference's
    error is within E = gamma_K(u) scale + K eta, against 60-digit mpmath."""
    worst = 0.0
    for log2 in (20, 60):
        x, p, cfg = _case(key, log2)
        cfg = dataclasses.replace(cfg, reweight=reweight)
        q, k, _, _ = rala._projections(x.reshape(1, 9, 8), p, cfg)
        hit, _ = recomputed_rows(_split_heads(q, 2), _split_heads(k, 2), cfg)
        assert np.all(hit)
        b = rala.rala_attention_bound(x, p, cfg, dtype="float64")
        assert np.all(np.isfinite(np.asarray(b.scale))) and np.all(np.isfinite(np.asarray(b.sigma)))
        out = rala.rala_attention(x, p, cfg)
        e = _tested_bound(b, out.shape)
        err = np.abs(out - _exact(x, p, cfg))
        assert np.all(err <= e), float(np.max(err / e))
        worst = max(worst, float(np.max(err / e)))
    print(key, reweight, "worst err/E", worst)
    if floor is not None:
        assert worst >= floor, worst


def test_key_big_float32_bound_keeps_the_reference_error():
    """In float32 the recomputed rows have no bound (a float32 evaluation's normaliser underflows to 0, no
    evaluation recomputes there): scale inf, honestly; the float64 reference's own error (Bound.ref_scale) is
    finite and holds against mpmath."""
    x, p, cfg = _case("qkv.weight", 20)
    b = rala.rala_attention_bound(x, p, cfg, dtype="float32")
    out = rala.rala_attention(x, p, cfg)
    ref = numerics.gamma(b.k if b.ref_depth is None else b.ref_depth, numerics.unit_roundoff("float64")) * \
        np.asarray(b.ref_scale) + b.k * np.finfo(np.float64).smallest_subnormal / 2
    assert np.all(np.isfinite(ref))
    assert np.all(np.abs(out - _exact(x, p, cfg)) <= ref)


def test_ordinary_rows_are_not_touched():
    """No row recomputed at 2^0: the module term returns the direct bound unchanged."""
    from refimpl.attention.rala_bounds import _Prec
    from refimpl.attention.rala_module_recomputed import module_recomputed_error
    x, p, cfg = _case("qkv.weight", 0)
    q, k, v, _ = rala._projections(x.reshape(1, 9, 8), p, cfg)
    sp = lambda a: _split_heads(a, 2)
    e = np.random.default_rng(0).random(sp(q).shape)
    z = np.zeros_like(e)
    assert module_recomputed_error(e, sp(q), z, sp(k), z, sp(v), z, cfg, (3, 3), _Prec.of("float64")) is e


def test_official_preset_key_big_bound_is_safe():
    """The official preset (RoPE on the numerator, token mean, eps, LePE, qkvo gate, output projection), qkvo times
    2^20: every row recomputed; the bound (the RoPE rows' ratio bound, or the direct one where finite and larger)
    is finite and safe against mpmath.  At 2^40 the RoPE rows' alpha error is total (Eq. 4's logits err by ~u
    1e24): no bound, inf, as before."""
    x, p, cfg = _case("qkvo.weight+qkvo.bias", 20, preset="official")
    q, k, _, _ = rala._projections(x[0].reshape(8, 9).T[None], p, cfg)
    hit, _ = recomputed_rows(_split_heads(q, 2), _split_heads(k, 2), cfg)
    assert np.all(hit)
    b = rala.rala_attention_bound(x, p, cfg, dtype="float64")
    out = rala.rala_attention(x, p, cfg)
    e = _tested_bound(b, out.shape)
    assert np.all(np.isfinite(e))
    err = np.abs(out - _exact(x, p, cfg))
    print("official 2^20 worst err/E", float(np.max(err / e)))
    assert np.all(err <= e), float(np.max(err / e))


def test_exact_reference_matches_the_layer_on_ordinary_inputs():
    """The mpmath layer agrees with rala_attention where nothing is recomputed (within the layer's bound), for
    both presets: the reference itself is checked."""
    for preset in ("paper", "official"):
        key = "qkv.weight" if preset == "paper" else "qkvo.weight"
        x, p, cfg = _case(key, 0, preset=preset)
        b = rala.rala_attention_bound(x, p, cfg, dtype="float64")
        out = rala.rala_attention(x, p, cfg)
        assert np.all(np.abs(out - _exact(x, p, cfg)) <= _tested_bound(b, out.shape))


def test_coarse_path_beyond_the_element_limit_is_safe(monkeypatch):
    """Beyond config.QUADRATIC_MAX_ELEMENTS the (B, h, N, N, d) forms are skipped (width 2 delta, S by |V| + |O^|):
    still finite and safe, and no tighter than the full path."""
    from refimpl import config
    x, p, cfg = _case("qkv.weight", 20)
    cfg = dataclasses.replace(cfg, reweight=False)
    out = rala.rala_attention(x, p, cfg)
    full = _tested_bound(rala.rala_attention_bound(x, p, cfg, dtype="float64"), out.shape)
    monkeypatch.setattr(config, "QUADRATIC_MAX_ELEMENTS", 1)
    coarse = _tested_bound(rala.rala_attention_bound(x, p, cfg, dtype="float64"), out.shape)
    err = np.abs(out - _exact(x, p, cfg))
    assert np.all(np.isfinite(coarse)) and np.all(err <= coarse) and np.all(full <= coarse)
