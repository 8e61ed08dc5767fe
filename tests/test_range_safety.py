"""Range safety and bounded work (issue 15, items 2 and 3).

1. Exact power-of-two rescaling (``numerics.pow2_exponent``): where the mathematics is homogeneous, inputs
   scaled by 2^k give the unscaled result times the right power of two, bit for bit where that is a normal
   number (within one subnormal spacing where it is subnormal), for k from -1060 to 1000: groups above 2^256
   are scaled down and, in linear attention and RALA's core (``scale_up``), groups below 2^-256 up, so the tiny
   and subnormal range is exact too: linear attention (relu / identity maps, degree 0 in phi(Q) and phi(K),
   degree 1 in V; both orders; every map for V), RALA without reweighting (degree 0 in (Q, K), 1 in V; with
   Eq. 4's reweighting V's degree 1), on every backend (the C wrappers answer out-of-band inputs, tiny ones
   included, with the NumPy definition, whose bits are then the expectation); focused attention and softmax
   attention (degree 1 in V; q 2^a with k 2^-a leaves the logits unchanged) from -250.  An eps or clamp_min is
   not scale-invariant: L(2^a q, 2^b k, 2^c v; eps) is 2^c L(q, k, v; eps 2^-(a+b)) bit for bit, and where
   eps 2^-(a+b) is beyond float64 the limits (eps negligible, or the normaliser eps alone) hold exactly.  The
   inputs carry 10 fractional bits (at most 14 significant bits) so that 2^k x is exact for k >= -1060.
2. Ordinary inputs are computed bit for bit as the unscaled formulas written out here (the equations
   without any rescaling), taps included; every backend gives NumPy's finite/non-finite pattern on
   1e150-sized and mixed inputs, and out of the band the C wrappers return the NumPy bits.
3. Softmax of logits beyond the float64 range (q, k ~ 2^600) is the saturated softmax: each output row is
   the value row of the largest logit, exactly.
4. A finite result beyond the float64 range raises FloatingPointError naming the stage.
5. Bounded work: arcsin_series(order=10**7) and angular_similarity_series(order=10**6) answer at once and
   equal a modest order's result; orders that would need more terms than config.ARCSIN_SERIES_MAX_TERMS
   raise ValueError naming 'order'.
6. The arcsin series family and the exponential kernel beyond their range or domain: the polynomials T_K,
   T_K' and their bound raise FloatingPointError naming the stage where the value overflows; the tail bound
   and its tightness refuse |x| > 1 (+ a 2^-20 rounding slack) with an ArgumentError naming 'x'; the
   exponential kernel raises FloatingPointError naming the stage where exp overflows; the error bounds of
   enhanced, focused and RALA attention (not rescaled) raise FloatingPointError naming the stage where an
   input beyond 2^256 makes them overflow (numerics.check_bound_range).
7. Issue 15, finite input never gives a silent NaN: linear attention (every map, both orders, normalize
   True / False, eps policies, clamp_min) and RALA's core (paper and official settings) for q, k, v each of
   magnitude 2^-1074 .. 2^1023, on every backend: finite, or FloatingPointError naming the stage, NaN only
   where the exact normaliser is 0; normal-range outputs bit for bit the unscaled formulas; the bounds
   finite, inf (no bound) or FloatingPointError naming the bound's stage.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from refimpl import backends, config, numerics
from refimpl.errors import ArgumentError
from refimpl.attention import angular as A, focused as F, linear as L, rala as R, softmax as S
from refimpl.attention import angular_series, rala_core
from tests.kernel_helpers import STATUS, available_backends, backend_available

SUBNORMAL = 2.0 ** -1022


def _arrays(seed: int, shape: tuple[int, ...], n: int = 3) -> list[np.ndarray]:
    """Standard-normal arrays rounded to 10 fractional bits (|x| < 8: at most 14 significant bits), so that
    x 2^k is exact for every k >= -1060 and no product of three of them underflows for k >= -250."""
    rng = np.random.default_rng(seed)
    return [np.round(rng.standard_normal(shape) * 1024) / 1024 for _ in range(n)]


def _same_scaled(got: np.ndarray, base: np.ndarray, k: int) -> bool:
    """got == base 2^k bit for bit where base 2^k is a normal number (or 0, NaN); within one subnormal
    spacing where it is subnormal (base 2^k then rounds twice, got once)."""
    with np.errstate(over="ignore"):
        want = np.ldexp(base, k)
    tiny = (np.abs(want) < SUBNORMAL) & (want != 0)
    exact = np.array_equal(np.where(tiny, 0.0, got), np.where(tiny, 0.0, want), equal_nan=True)
    return exact and bool(np.all(np.abs(got[tiny] - want[tiny]) <= 2.0 ** -1074))


def _run(backend: str, fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # "runs on the NumPy definition" notices
        with backends.use(backend):
            return fn(*args, **kwargs)


def _outcome(backend: str, fn, *args, **kwargs):
    """The result on ``backend``, or the stage named by its FloatingPointError (the text before ':')."""
    try:
        with np.errstate(all="ignore"):
            return _run(backend, fn, *args, **kwargs)
    except FloatingPointError as exc:
        return str(exc).split(":")[0]


def _same_pattern(a, b) -> bool:
    """Both the same FloatingPointError stage, or both arrays with the same finite/non-finite pattern."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return np.array_equal(np.isfinite(a), np.isfinite(b))


scales = st.integers(-250, 1000)
#: Linear attention and RALA's core scale tiny groups up as well: exact down to the subnormal range.
all_scales = st.integers(-1060, 1000)


def _out_of_band(*arrays: np.ndarray) -> bool:
    """Whether the C wrappers answer these (float64) inputs with the NumPy definition (refimpl.backends._c:
    above 2^B, or a nonzero entry below 2^-B)."""
    from refimpl.backends import _c
    return _c._outside_band(*arrays) or _c._below_band(*arrays)


def _base_for(bk: str, bases: dict, *scaled: np.ndarray) -> np.ndarray:
    """The unscaled result a backend's call on ``scaled`` inputs is compared with: its own, except where the C
    wrapper answers the scaled inputs with the NumPy definition (then NumPy's: the kernel computed the base)."""
    return bases["numpy"] if bk == "c" and _out_of_band(*scaled) else bases[bk]


# ---------------------------------------------------------------------------------------------------
# 1. Exact homogeneity across the whole float64 range
# ---------------------------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), all_scales, all_scales, all_scales, st.sampled_from(["relu", "identity"]),
       st.sampled_from(["linear", "quadratic"]))
def test_linear_attention_is_exactly_homogeneous(seed, a, b, c, fmap, order):
    """L(2^a q, 2^b k, 2^c v) = 2^c L(q, k, v) bit for bit (relu and identity maps are positively
    homogeneous; the output is of degree 0 in phi(Q), phi(K) and 1 in V; L2ViT Eq. 4), a, b, c from -1060
    (subnormal inputs) to 1000, on every backend."""
    q, k, v = _arrays(seed, (1, 2, 7, 4))
    bases = {bk: _run(bk, L.linear_attention, q, k, v, feature_map=fmap, order=order) for bk in available_backends()}
    qs, ks, vs = np.ldexp(q, a), np.ldexp(k, b), np.ldexp(v, c)
    for bk in available_backends():
        with np.errstate(all="ignore"):
            got = _run(bk, L.linear_attention, qs, ks, vs, feature_map=fmap, order=order)
        base = _base_for(bk, bases, qs, ks, vs)
        assert np.array_equal(np.isfinite(got), np.isfinite(base)), (bk, a, b, c)
        assert _same_scaled(got, base, c), (bk, a, b, c)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), all_scales, all_scales, all_scales, st.sampled_from(["add", "clamp"]),
       st.integers(-60, 10), st.booleans(), st.sampled_from(["linear", "quadratic"]))
def test_linear_attention_eps_is_scaled_exactly(seed, a, b, c, policy, t, with_clamp, order):
    """An eps (and clamp_min) is not scale-invariant (L2ViT Eq. 4 with Appendix 8's clamp): the reference
    computes L(2^a q, 2^b k, 2^c v; eps, C) as 2^c L(q, k, v; eps 2^-(a+b), C 2^-(a+b)), bit for bit where the
    scaled constants are normal numbers below 2^1000 (normaliser_range.normaliser_scaled).  Beyond that the
    float64 evaluation with an unbounded exponent is matched exactly too: a constant 2^-(a+b) times it above
    2^1000 leaves the normaliser that constant (den below 2^-53 of it: num / eps, formed on the mantissas so that
    the quotient does not underflow first), one below 2^-1000 leaves it den (eps irrelevant; a dead ReLU row
    then 0 / eps = 0).  Every backend."""
    q, k, v = _arrays(seed, (1, 2, 7, 4))
    eps = float(np.ldexp(1.0 + (seed % 1024) / 1024, t))
    cm = float(np.ldexp(1.25, t + 3)) if with_clamp else None
    s = -(a + b)
    with np.errstate(over="ignore", under="ignore"):
        eps_s, cm_s = np.ldexp(eps, s), None if cm is None else np.ldexp(cm, s)
    consts = [eps_s] + ([] if cm_s is None else [cm_s])
    qs, ks, vs = np.ldexp(q, a), np.ldexp(k, b), np.ldexp(v, c)
    kw = dict(eps_policy=policy, order=order)
    with np.errstate(all="ignore"):
        if all(2.0 ** -1000 < x < 2.0 ** 1000 for x in consts):          # the scaled constants, exactly
            bases = {bk: _run(bk, L.linear_attention, q, k, v, eps=float(eps_s), clamp_min=cm_s, **kw)
                     for bk in available_backends()}
        elif min(consts) > 2.0 ** 1000:                                  # the normaliser is the larger constant
            num = L.linear_attention(q, k, v, normalize=False, order=order)
            want = np.ldexp(num / max(eps, cm or 0.0), a + b)
            bases = {bk: want for bk in available_backends()}
        elif max(consts) < 2.0 ** -1000:                                 # the constants are negligible
            want = L.linear_attention(q, k, v, order=order)
            bases = {bk: np.where(np.isnan(want), 0.0, want) for bk in available_backends()}
        else:                                                            # one of each: not this test's case
            return
    for bk in available_backends():
        with np.errstate(all="ignore"):
            got = _run(bk, L.linear_attention, qs, ks, vs, eps=eps, clamp_min=cm, **kw)
        base = _base_for(bk, bases, qs, ks, vs)
        assert _same_scaled(got, base, c), (bk, a, b, c, eps, cm)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), all_scales, scales)
def test_linear_attention_v_degree_one_every_map_every_backend(seed, c, b):
    """Degree 1 in V for every feature map (elu1, softmax, l1 included) on every backend, c from -1060: the C
    wrapper answers out-of-band inputs with the NumPy definition, whose rescaling is exact (tiny groups up);
    in band both are the kernel.  And the finite/non-finite pattern of (q, k) 2^b equals NumPy's on every
    backend."""
    q, k, v = _arrays(seed, (1, 2, 6, 4))
    for fmap in ("relu", "elu1", "softmax", "l1"):
        bases = {bk: _run(bk, L.linear_attention, q, k, v, feature_map=fmap) for bk in available_backends()}
        for bk in available_backends():
            with np.errstate(all="ignore"):
                got = _run(bk, L.linear_attention, q, k, np.ldexp(v, c), feature_map=fmap)
            base = _base_for(bk, bases, q, k, np.ldexp(v, c))
            assert np.array_equal(np.isfinite(got), np.isfinite(base)), (fmap, bk)
            assert _same_scaled(got, base, c), (fmap, bk)
            # saturated softmax / ELU + 1 weights may underflow the normaliser: FloatingPointError, on every backend
            pat = _outcome(bk, L.linear_attention, np.ldexp(q, b), np.ldexp(k, b), v, feature_map=fmap)
            ref = _outcome("numpy", L.linear_attention, np.ldexp(q, b), np.ldexp(k, b), v, feature_map=fmap)
            assert _same_pattern(pat, ref), (fmap, bk, b)


@settings(max_examples=20)
@given(st.integers(0, 2**16), scales, scales, st.sampled_from(["linear", "quadratic"]))
def test_focused_attention_is_exactly_homogeneous(seed, a, c, order):
    """FLatten's attention term (Eq. 4-6, normaliser "sum", eps = 0) is of degree 0 in (q, k) (f_p is
    homogeneous of degree 1 and ReLU positively homogeneous) and 1 in V: exact."""
    q, k, v = _arrays(seed, (1, 2, 6, 4))
    base = F.focused_attention(q, k, v, order=order)
    with np.errstate(all="ignore"):
        got = F.focused_attention(np.ldexp(q, a), np.ldexp(k, a), np.ldexp(v, c), order=order)
    assert np.array_equal(np.isfinite(got), np.isfinite(base))
    assert _same_scaled(got, base, c)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), all_scales, all_scales, st.sampled_from(["linear", "quadratic"]), st.booleans())
def test_rala_core_homogeneity(seed, a, c, order, mean):
    """RALA's Eq. 2 with alpha = 1 and the relu kernel is of degree 0 in (Q, K), 1 in V: exact, a and c from
    -1060 (subnormal inputs) to 1000, on every backend.  With the reweighting (Eq. 4) only V's degree 1 is
    exact (alpha depends on the scale of Q and K): the official settings (RoPE, mean token scaling, eps)."""
    q, k, v = _arrays(seed, (1, 2, 9, 4))
    plain = R.RALAConfig(dim=8, num_heads=2, kernel="relu", reweight=False, order=order,
                         token_scaling="mean" if mean else "sum")
    cfg = R.RALAConfig.preset("official", dim=8, num_heads=2, order=order)
    bases = {bk: _run(bk, R.rala_core, q, k, v, plain) for bk in available_backends()}
    official = {bk: _run(bk, R.rala_core, q, k, v, cfg, hw=(3, 3)) for bk in available_backends()}
    qs, ks, vs = np.ldexp(q, a), np.ldexp(k, a), np.ldexp(v, c)
    for bk in available_backends():
        with np.errstate(all="ignore"):
            got = _run(bk, R.rala_core, qs, ks, vs, plain)
        base = _base_for(bk, bases, qs, ks, vs)
        assert np.array_equal(np.isfinite(got), np.isfinite(base)), (bk, a, c)
        assert _same_scaled(got, base, c), (bk, a, c)
        with np.errstate(all="ignore"):
            got = _run(bk, R.rala_core, q, k, vs, cfg, hw=(3, 3))
        assert _same_scaled(got, official[bk], c), (bk, c)      # RoPE: the NumPy path on every backend


@settings(max_examples=25)
@given(st.integers(0, 2**16), st.integers(-1000, 1000), scales)
def test_softmax_attention_scaling(seed, a, c):
    """softmax(q k^T) V: q 2^a with k 2^-a leaves the logits unchanged and V 2^c scales the output: exact,
    with a bias and a mask, across the range (logit overflow and underflow of the unscaled q or k)."""
    q, k, v = _arrays(seed, (1, 2, 5, 4))
    rng = np.random.default_rng(seed + 1)
    bias = rng.standard_normal((2, 5, 5))
    mask = rng.random((1, 2, 5, 5)) > 0.2
    base = S.softmax_attention(q, k, v, bias=bias, mask=mask)
    with np.errstate(all="ignore"):
        got = S.softmax_attention(np.ldexp(q, a), np.ldexp(k, -a), np.ldexp(v, c), bias=bias, mask=mask)
    assert _same_scaled(got, base, c)


def test_softmax_of_logits_beyond_the_range_is_saturated():
    """q, k of size 2^600: logits ~2^1200, beyond float64 (before: inf - inf = NaN).  The softmax is then
    exactly one-hot at each row's largest logit, so each output row is that value row, exactly."""
    q, k, v = _arrays(7, (1, 1, 6, 4))
    logits = q @ k.swapaxes(-1, -2)
    for bk in available_backends():
        out = _run(bk, S.softmax_attention, np.ldexp(q, 600), np.ldexp(k, 600), v, scale=1.0)
        assert np.array_equal(out, v[0, 0][np.argmax(logits, axis=-1)]), bk


# ---------------------------------------------------------------------------------------------------
# 2. Ordinary inputs are the unscaled formulas bit for bit; patterns on every backend
# ---------------------------------------------------------------------------------------------------

@settings(max_examples=20)
@given(st.integers(0, 2**16), st.sampled_from([1.0, 30.0, 1e-3, 1e100, 1e-100]),
       st.sampled_from([{}, {"eps": 1e-6}, {"clamp_min": 1e-2, "eps": 1e-6, "eps_policy": "clamp"}]))
def test_ordinary_inputs_are_the_unscaled_formulas_bitwise(seed, mag, policy):
    """Inside config.RANGE_RESCALE_EXPONENT's band nothing is rescaled: the outputs and taps are those of the
    equations computed as written (L2ViT Eq. 2-4 with the normaliser policy; softmax by max-subtraction)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, 2, 8, 4)) * mag for _ in range(3))
    taps: dict = {}
    got = L.linear_attention(q, k, v, taps=taps, **policy)
    pq, pk = np.maximum(q, 0.0), np.maximum(k, 0.0)
    kv = pk.swapaxes(-1, -2) @ v
    den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
    den_eff = L.apply_normaliser(den, **policy)
    with np.errstate(all="ignore"):
        want = (pq @ kv) / den_eff[..., None]
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(taps["kv"], kv) and np.array_equal(taps["denominator"], den_eff)
    s = (q * 4 ** -0.5) @ k.swapaxes(-1, -2)
    with np.errstate(invalid="ignore"):
        want_s = numerics.softmax(s, axis=-1) @ v
    assert np.array_equal(S.softmax_attention(q, k, v), want_s)


def _extreme_inputs(seed: int):
    q, k, v = _arrays(seed, (1, 2, 9, 4))
    yield "1e150", q * 1e150, k * 1e150, v * 1e150
    mixed_q, mixed_k = q.copy(), k.copy()
    mixed_q[..., ::2, :] *= 1e150
    mixed_q[..., 1::2, :] *= 1e-150
    mixed_k[..., ::3, :] *= 1e-300
    yield "mixed", mixed_q, mixed_k, v * 1e200


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_backend_gives_numpys_pattern_on_extreme_inputs(seed):
    """1e150-sized and mixed inputs: where the unscaled inputs give a finite result, so do the
    scaled ones (NaN only where a ReLU row is dead, as unscaled), and every backend has NumPy's pattern."""
    q0, k0, v0 = _arrays(seed, (1, 2, 9, 4))
    # RALA without alpha: with it, 1e150-sized q saturate Eq. 4's softmax and exp underflows the other
    # alpha_j to 0, which no power of two undoes (a known limit, as ELU + 1's exp(x) for x < -745).
    rala_cfg = R.RALAConfig(dim=8, num_heads=2, kernel="relu", reweight=False)
    official = R.RALAConfig.preset("official", dim=8, num_heads=2)
    calls = {
        "linear relu": lambda q, k, v: L.linear_attention(q, k, v),
        "linear l1": lambda q, k, v: L.linear_attention(q, k, v, feature_map="l1"),
        "linear identity": lambda q, k, v: L.linear_attention(q, k, v, feature_map="identity", order="quadratic"),
        "focused": lambda q, k, v: F.focused_attention(q, k, v),
        "focused official": lambda q, k, v: F.focused_attention(q, k, v, normaliser="mean_scaled", eps=1e-6),
        "rala relu": lambda q, k, v: R.rala_core(q, k, v, rala_cfg),
        "rala official": lambda q, k, v: R.rala_core(q, k, v, official, hw=(3, 3)),
        "softmax": lambda q, k, v: S.softmax_attention(q, k, v),
    }
    for name, fn in calls.items():
        unscaled = np.isfinite(fn(q0, k0, v0))
        for label, q, k, v in _extreme_inputs(seed):
            ref = _outcome("numpy", fn, q, k, v)
            # Honest overflow, not compared with the unscaled pattern: the signed identity map on mixed
            # inputs, and official RALA at 1e150 (RoPE's rotated numerator ~1e450 over the unrotated
            # normaliser 0 + eps: the exact output is beyond float64), which raises naming the core's output
            # (before issue 15: +-inf, silently) wherever it is not finite.
            if (name, label) in {("rala official", "1e150"), ("rala official", "mixed")}:
                assert isinstance(ref, np.ndarray) and np.all(np.isfinite(ref)) or \
                    ref == "rala_core", (name, label, ref)
            elif (name, label) != ("linear identity", "mixed"):
                assert np.array_equal(np.isfinite(ref), unscaled), (name, label)
            for bk in available_backends():
                assert _same_pattern(_outcome(bk, fn, q, k, v), ref), (name, label, bk)


def test_c_wrappers_return_the_definition_out_of_band():
    """Out of the band the C wrappers answer with the NumPy definition (documented in their docstrings):
    the same bits as the NumPy backend, for linear attention, RALA's alpha and window softmax attention.
    Skipped without the compiled module (nothing to check), failed then under REFIMPL_REQUIRE_BACKENDS=1."""
    if not backend_available("c", "linear_attention"):
        pytest.skip(f"the C backend is not available: {STATUS['c'].reason}")
    from refimpl.backends import _c_linear, _c_softmax
    q, k, v = _arrays(3, (1, 2, 9, 4))
    for s in (2.0 ** 500, 2.0 ** 997):
        qs, ks, vs = q * s, k * s, v * s
        for fmap in ("relu", "elu1", "focused"):
            want = L._linear_attention_numpy(qs, ks, vs, fmap)
            assert np.array_equal(_c_linear.linear_attention(qs, ks, vs, fmap), want, equal_nan=True), (fmap, s)
        assert np.array_equal(_c_linear.rala_alpha(qs, ks), rala_core._rala_alpha_numpy(qs, ks))
        assert np.array_equal(_c_softmax.window_softmax_attention(qs, ks, vs, 0.5),
                              S._window_softmax_attention_numpy(qs, ks, vs, 0.5))


# ---------------------------------------------------------------------------------------------------
# 3. Results float64 cannot represent
# ---------------------------------------------------------------------------------------------------

def test_unrepresentable_output_raises_naming_the_stage():
    """Identity feature map (signed): q = (1, 0), keys (1, 0) and (-1 + 2^-40, 0) make the normaliser 2^-40;
    values 2^1000 then give an output 2^1040, finite but beyond float64: FloatingPointError naming the stage
    (before: inf, silently)."""
    q = np.array([1.0, 0.0]).reshape(1, 1, 1, 2)
    k = np.array([[1.0, 0.0], [-1.0 + 2.0 ** -40, 0.0]]).reshape(1, 1, 2, 2)
    v = np.array([[2.0 ** 1000], [0.0]]).reshape(1, 1, 2, 1)
    with pytest.raises(FloatingPointError, match="linear attention: output .* not representable"):
        L.linear_attention(q, k, v, feature_map="identity")
    small = L.linear_attention(q, k, v * 2.0 ** -100, feature_map="identity")   # 2^940: representable
    assert small[0, 0, 0, 0] == 2.0 ** 940


# ---------------------------------------------------------------------------------------------------
# 4. Bounded work
# ---------------------------------------------------------------------------------------------------

def test_arcsin_series_of_huge_order_answers_at_once():
    """arcsin_series(order=10**7) (before: no answer within a minute) sums only the terms the tail bound
    leaves non-negligible: the same bits as order=1000 on |x| <= 0.9, in well under a second."""
    x = np.linspace(-0.9, 0.9, 1001)
    t0 = time.perf_counter()
    big = A.arcsin_series(x, 10**7)
    der = A.arcsin_series_derivative(x, 10**7)
    assert time.perf_counter() - t0 < 5.0
    assert np.array_equal(big, A.arcsin_series(x, 1000))
    assert np.array_equal(der, A.arcsin_series_derivative(x, 1000))
    assert np.max(np.abs(big - np.arcsin(x))) <= 4 * numerics.unit_roundoff(np.float64)


def test_angular_similarity_series_of_huge_order_answers_at_once():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 16, 8)), rng.standard_normal((1, 2, 16, 8))
    c = A.cosine_matrix(q, k)
    order = angular_series._terms(c, 10**6, "test")
    assert order < config.ARCSIN_SERIES_MAX_TERMS
    assert np.array_equal(A.angular_similarity_series(q, k, 10**6), A.angular_similarity_series(q, k, order))


def test_orders_beyond_the_work_limit_raise():
    """At |x| = 1 (a row's cosine with itself) every term matters: orders above the limit raise a
    ValueError naming 'order', the limit and the value; so do the explicit series features."""
    limit = config.ARCSIN_SERIES_MAX_TERMS
    with pytest.raises(ValueError, match=rf"argument 'order'.*{limit + 1} terms.*limit {limit}"):
        A.arcsin_series(np.array([1.0]), limit + 1)
    assert np.isfinite(A.arcsin_series(np.array([1.0]), limit)[0])
    q = np.random.default_rng(1).standard_normal((1, 1, 3, 4))
    with pytest.raises(ValueError, match=r"argument 'order'.*limit"):
        A.angular_similarity_series(q, q, 10**6)
    with pytest.raises(ValueError, match=r"argument 'order'.*1000001 terms"):
        A.angular_series_features(q, 10**6)


# ---------------------------------------------------------------------------------------------------
# 6. The arcsin series family and the exponential kernel beyond their range or domain
# ---------------------------------------------------------------------------------------------------

def test_arcsin_series_polynomials_raise_where_not_representable():
    """T_K, T_K' and the Horner bound are polynomials defined for every real x (their docstrings): where the
    value exceeds float64 (x = 1e150, K = 4: about 1e1350) FloatingPointError names the stage (before: inf);
    finite values outside [-1, 1], order 0 at 1e150, NaN and Inf are unchanged."""
    x = np.array([0.3, -0.5, 1e150])
    for fn in (A.arcsin_series, A.arcsin_series_derivative, A.arcsin_series_bound):
        with pytest.raises(FloatingPointError, match=rf"{fn.__name__}: the polynomial of order K = 4 overflows"):
            fn(x, 4)
    assert A.arcsin_series(np.array([1e150]), 0)[0] == 1e150
    assert A.arcsin_series(np.array([2.0]), 1)[0] == 2.0 + 8.0 / 6.0
    got = A.arcsin_series(np.array([np.nan, np.inf, 0.5]), 3)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == A.arcsin_series(np.array([0.5]), 3)[0]


def test_arcsin_tail_functions_refuse_x_outside_the_domain():
    """R_K(x) = arcsin x - T_K(x) is undefined for |x| > 1: the tail bound and its tightness raise a ValueError
    of the hierarchy naming 'x', the domain and the value (before: inf); a computed cosine's rounding excess up
    to 2^-20 is accepted (no bound proven there: inf, as at |x| = 1 for the geometric kind); NaN propagates."""
    for fn in (A.arcsin_tail_bound, A.arcsin_tail_tightness):
        for bad in (1e150, -1.5, np.inf):
            with pytest.raises(ArgumentError, match=r"argument 'x': .*\|x\| <= 1.*got an entry with \|x\| = "):
                fn(np.array([0.5, bad]), 4)
        edge = fn(np.array([1.0 + 2.0 ** -30, -1.0 - 2.0 ** -20, np.nan]), 4)
        assert np.isinf(edge[0]) and np.isinf(edge[1]) and not np.isfinite(edge[2])
    assert np.isnan(A.arcsin_tail_bound(np.array([np.nan]), 4)[0])
    assert np.isfinite(A.arcsin_tail_bound(np.array([1.0]), 4, kind="uniform")[0])
    # the callers' cosines stay inside the slack: q^.k^ of rounded unit rows of width 512
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 64, 512))
    c = A.cosine_matrix(q, q)
    assert np.max(np.abs(c)) <= 1.0 + angular_series.ARCSIN_DOMAIN_SLACK
    assert np.all(np.isfinite(A.arcsin_tail_bound(np.clip(c, -0.99, 0.99), 4)))


def test_exponential_kernel_raises_where_not_representable():
    """exp(<x, y>/sigma^2) of 1e150-sized inputs is finite but beyond float64: FloatingPointError naming the
    stage (before: inf); ordinary values are unchanged, very negative exponents underflow to 0, and an Inf in
    the input propagates as before."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    base = A.exponential_kernel(x, y)
    assert np.array_equal(base, np.exp((x @ y.T) / 1.0))
    for a, b in ((x * 1e150, y), (x, y * 1e150), (np.full((1, 4), 30.0), np.full((1, 4), 30.0))):
        with pytest.raises(FloatingPointError, match=r"exponential_kernel: .* overflows float64 at index"):
            A.exponential_kernel(a, b)
    assert A.exponential_kernel(np.full((1, 4), 30.0), np.full((1, 4), -30.0))[0, 0] == 0.0
    xi = x.copy()
    xi[0, 0] = np.inf
    with np.errstate(invalid="ignore"):
        got = A.exponential_kernel(xi, y)
    assert not np.all(np.isfinite(got[0])) and np.array_equal(got[1:], base[1:])


@pytest.mark.parametrize("qual,args", [("enhanced.enhanced_attention_bound", ("x",)),
                                       ("focused.focused_linear_attention_bound", ("x",)),
                                       ("focused.focused_window_attention_bound", ("x",)),
                                       ("rala.rala_attention_bound", ("x",)),
                                       ("rala.rala_core_bound", ("q", "k"))])
def test_bounds_that_overflow_raise_naming_the_stage(qual, args):
    """The error bounds are not rescaled: for a 1e150-sized input their products of magnitudes overflow
    (before: an inf or NaN bound, silently), and numerics.check_bound_range raises FloatingPointError naming
    the stage.  The ordinary call's bound is finite and the same object check_bound_range was given (nothing
    is recomputed inside the band); an input with a NaN keeps its non-finite bound."""
    from tests.campaign_builders import BUILDERS, MODULES
    key, name = qual.split(".")
    fn = getattr(MODULES[key], name)
    valid = BUILDERS[qual]()
    base = fn(**valid)
    assert np.all(np.isfinite(base.scale))
    for arg in args:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(FloatingPointError, match=rf"{name}: the bound of {name} overflows float64 for "
                                                          rf"inputs of this magnitude \(max \|{arg}\| = "):
                fn(**{**valid, arg: valid[arg] * 1e150})
            bad = np.array(valid[arg], copy=True)
            bad.flat[0] = np.nan
            fn(**{**valid, arg: bad})                     # honest non-finite, no error


def test_check_bound_range_leaves_in_band_bounds_alone():
    """Inside the band (max |input| <= 2^256) a non-finite bound is returned as it is (a bfloat16 quotient
    rule's inf, a dead row's NaN); beyond it with a finite bound nothing happens either."""
    inf_bound = numerics.Bound(np.array([np.inf]), 3)
    assert numerics.check_bound_range(inf_bound, "s", x=np.array([2.0 ** 256])) is inf_bound
    fine = numerics.Bound(np.array([1.0]), 3)
    assert numerics.check_bound_range(fine, "s", x=np.array([2.0 ** 900])) is fine
    with pytest.raises(FloatingPointError, match=r"s: the bound of s overflows"):
        numerics.check_bound_range(inf_bound, "s", x=np.array([2.0 ** 257]))
    assert numerics.check_bound_range(inf_bound, "s", x=np.array([2.0 ** 900, np.nan])) is inf_bound


def test_rala_attention_raises_naming_the_stage_beyond_the_range():
    """rala_attention of 1e150-sized x (ELU + 1 kernel, reweighting, eps = 0): exp underflows so that the
    direct normaliser is 0 although the exact one is > 0 (before issue 15: NaN silently, then a
    FloatingPointError); the core now recomputes those rows from log-features, so the layer's output is
    finite.  A weight large enough for x W to overflow raises FloatingPointError naming the projections.  The
    relu kernel's dead row with eps = 0 stays the documented NaN, and a NaN in x propagates."""
    from tests.campaign_builders import BUILDERS
    valid = BUILDERS["rala.rala_attention"]()
    base = R.rala_attention(**valid)
    assert np.all(np.isfinite(base))
    with np.errstate(all="ignore"):
        assert np.all(np.isfinite(R.rala_attention(**{**valid, "x": valid["x"] * 1e150})))
        params = dict(valid["params"])
        params["qkv.weight"] = params["qkv.weight"] * 2.0 ** 1000
        with pytest.raises(FloatingPointError, match=r"rala_attention: the q, k, v and gate projections"):
            R.rala_attention(**{**valid, "x": valid["x"] * 2.0 ** 100, "params": params})
        bad = np.array(valid["x"], copy=True)
        bad.flat[0] = np.nan
        assert not np.all(np.isfinite(R.rala_attention(**{**valid, "x": bad})))
    # every query dead (zero weights, negative q bias) with the relu kernel and eps = 0: 0/0, undefined
    cfg = R.RALAConfig(dim=8, num_heads=2, kernel="relu", reweight=False, eps=0.0)
    rng = np.random.default_rng(0)
    p = {"qkv.weight": np.zeros((24, 8)), "qkv.bias": np.concatenate([-np.ones(8), rng.standard_normal(16)]),
         "phi.weight": rng.standard_normal((8, 8)), "phi.bias": rng.standard_normal(8)}
    with np.errstate(all="ignore"):
        out = R.rala_attention(rng.standard_normal((1, 3, 3, 8)), p, cfg)
    assert np.all(np.isnan(out))


# ---------------------------------------------------------------------------------------------------
# 7. Issue 15: finite input never gives a silent NaN (magnitudes 2^-1074 .. 2^1023, q, k, v separately)
# ---------------------------------------------------------------------------------------------------

exponents = st.integers(-1074, 1023)
NONNEG = ("relu", "elu1", "softmax", "l1")


def _magnitude_inputs(seed: int, a: int, b: int, c: int, shape=(1, 2, 5, 3), m: int = 4):
    """q, k, v with entries +-(1 + j/1024) 2^a (2^b, 2^c): no entry is 0 (2^-1074 is the smallest), none is
    beyond float64 (|x| < 2^1024)."""
    rng = np.random.default_rng(seed)
    def draw(shp, e):
        mant = (1.0 + rng.integers(0, 1024, size=shp) / 1024.0) * rng.choice([-1.0, 1.0], size=shp)
        return np.ldexp(mant, e)
    return draw(shape, a), draw(shape[:2] + (m, shape[3]), b), draw(shape[:2] + (m, shape[3]), c)


def _dead_rows(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(B, h, N): the rows whose exact ReLU normaliser is 0 (no channel with q_ic > 0 and some k_jc > 0):
    0/0 there with eps = 0, the mathematics' own NaN."""
    live_k = np.any(k > 0, axis=-2)[..., None, :]
    return ~np.any((q > 0) & live_k, axis=-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**16), exponents, exponents, exponents, st.sampled_from(NONNEG + ("identity",)),
       st.sampled_from(["linear", "quadratic"]), st.booleans(),
       st.sampled_from([(0.0, "add", None), (1e-6, "add", None), (1e-6, "clamp", None), (0.0, "add", 1e-3),
                        (1e-300, "clamp", None)]))
def test_linear_attention_finite_or_names_the_stage_every_magnitude(seed, a, b, c, fmap, order, normalize, policy):
    """Issue 15.  For every magnitude of q, k, v (each 2^-1074 .. 2^1023 on its own) and every backend:
    normalised attention with a non-negative map is a convex combination of the values, so it is returned
    finite (no FloatingPointError); NaN only in the rows whose exact ReLU normaliser is 0 with eps = 0 (0/0,
    undefined).  The unnormalised numerator, and the signed identity map, are finite or raise
    FloatingPointError naming the stage (the exact result is beyond float64), never inf or NaN silently
    (identity: where the direct normaliser is not 0, see docs/guarantees.md).  Every backend gives NumPy's
    outcome."""
    q, k, v = _magnitude_inputs(seed, a, b, c)
    eps, pol, cm = policy
    kw = dict(feature_map=fmap, order=order, normalize=normalize, eps=eps, eps_policy=pol, clamp_min=cm)
    ref = _outcome("numpy", L.linear_attention, q, k, v, **kw)
    for bk in available_backends():
        assert _same_pattern(_outcome(bk, L.linear_attention, q, k, v, **kw), ref), (bk, ref)
    if isinstance(ref, str):
        assert not (normalize and fmap in NONNEG), ref           # a convex combination is representable
        assert ref.startswith("linear attention"), ref
        return
    undefined = np.zeros(ref.shape[:-1], dtype=bool)
    if normalize and fmap in ("relu", "l1") and eps == 0 and cm is None:
        undefined = _dead_rows(q, k)
    if fmap == "identity":
        with np.errstate(all="ignore"):
            t: dict = {}
            L.linear_attention(q, k, v, **kw, taps=t)
        if normalize:   # a signed normaliser that is 0 as computed (cancellation or underflow): IEEE's x/0
            undefined = t["denominator"] == 0
    assert np.all(np.isfinite(ref[~undefined])), (fmap, a, b, c)
    assert np.all(np.isnan(ref[undefined])) or fmap == "identity"
    if normalize and fmap in NONNEG:                             # a convex combination of the value rows
        lo, hi = v.min(axis=-2, keepdims=True), v.max(axis=-2, keepdims=True)
        live = ~undefined[..., None] & (cm is None) & (eps == 0)
        slack = 1e-12 * np.maximum(np.abs(lo), np.abs(hi))
        assert np.all(~live | ((ref >= lo - slack) & (ref <= hi + slack))), (fmap, a, b, c)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), exponents, exponents, exponents, st.booleans(),
       st.sampled_from(["paper", "official"]))
def test_rala_core_finite_or_names_the_stage_every_magnitude(seed, a, b, c, relu, preset):
    """Issue 15 for RALA's core: the paper's defaults and the official settings (ELU + 1, reweighting, RoPE,
    mean token scaling, eps), every magnitude: finite, or FloatingPointError naming the core's stage where
    the exact output is beyond float64 (RoPE's rotated numerator over the unrotated normaliser, or without
    RoPE an alpha_j that underflowed to 0 for every key that matters); with the relu kernel and eps = 0 NaN
    only in the dead rows.  Every backend gives NumPy's outcome."""
    q, k, v = _magnitude_inputs(seed, a, b, c, shape=(1, 2, 4, 4), m=4)
    cfg = R.RALAConfig.preset(preset, dim=8, num_heads=2, kernel="relu" if relu else "elu1")
    ref = _outcome("numpy", R.rala_core, q, k, v, cfg, (2, 2))
    for bk in available_backends():
        assert _same_pattern(_outcome(bk, R.rala_core, q, k, v, cfg, (2, 2)), ref), (bk, ref)
    if isinstance(ref, str):
        assert ref == "rala_core", ref
        assert cfg.rope or cfg.reweight
        return
    dead = _dead_rows(q, k) if relu and not cfg.eps else np.zeros(ref.shape[:-1], dtype=bool)
    assert np.all(np.isfinite(ref[~dead])), (preset, relu, a, b, c)


def _unscaled_linear(q, k, v, fmap, order, normalize, eps, pol, cm):
    """Eq. 3-4 written out without any rescaling (the computation before issue 15)."""
    pq, pk = L.feature_map(q, fmap), L.feature_map(k, fmap)
    if order == "linear":
        num = pq @ (pk.swapaxes(-1, -2) @ v)
        den = np.einsum("bhnd,bhd->bhn", pq, np.sum(pk, axis=-2))
    else:
        s = pq @ pk.swapaxes(-1, -2)
        num, den = s @ v, np.sum(s, axis=-1)
    if not normalize:
        return num
    return num / L.apply_normaliser(den, eps=eps, eps_policy=pol, clamp_min=cm)[..., None]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.integers(-200, 200), st.integers(-200, 200), st.integers(-200, 200),
       st.sampled_from(NONNEG + ("identity", "leaky_relu")), st.sampled_from(["linear", "quadratic"]),
       st.booleans(), st.sampled_from([(0.0, "add", None), (1e-6, "add", None), (1e-6, "clamp", 1e-3)]))
def test_normal_range_is_bit_identical_to_the_unscaled_computation(seed, a, b, c, fmap, order, normalize,
                                                                    policy):
    """Issue 15's rescaling, log-feature rows and range checks change nothing in the normal range: inputs of
    magnitude 2^-200 .. 2^200 (products and sums stay normal; for the exp maps up to 2^7, where no feature
    underflows) give the unscaled formulas' bits on the NumPy definition."""
    if fmap in ("elu1", "softmax"):       # exp's normal range: |x| < 2^7, so no feature underflows
        a, b = min(a, 8), min(b, 8)
    q, k, v = _magnitude_inputs(seed, a, b, c)
    q, k, v = q / 4, k / 4, v / 4          # |x| < 2^(e-1): also elu1's x + 1 and exp stay normal
    eps, pol, cm = policy
    with np.errstate(all="ignore"):
        want = _unscaled_linear(q, k, v, fmap, order, normalize, eps, pol, cm)
    got = L.linear_attention(q, k, v, feature_map=fmap, order=order, normalize=normalize, eps=eps, eps_policy=pol,
                             clamp_min=cm)
    ok = np.isfinite(want)
    assert np.array_equal(got[ok], want[ok]), (fmap, order, a, b, c)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), exponents, exponents, exponents, st.sampled_from(NONNEG))
def test_linear_attention_bound_every_magnitude(seed, a, b, c, fmap):
    """linear_attention_bound for every magnitude: a finite bound, or inf where no bound exists (rounding or
    underflow may reach a zero normaliser; tiny and subnormal inputs), NaN only in a dead ReLU row, and above
    2^256 where it overflows FloatingPointError naming the bound's stage (numerics.check_bound_range)."""
    q, k, v = _magnitude_inputs(seed, a, b, c)
    try:
        with np.errstate(all="ignore"):
            bound = L.linear_attention_bound(q, k, v, feature_map=fmap, dtype="float64")
    except FloatingPointError as exc:
        assert str(exc).startswith("linear_attention_bound: the bound of linear_attention_bound overflows")
        assert max(a, b, c) > config.RANGE_RESCALE_EXPONENT - 2
        return
    scale = np.asarray(bound.scale)
    dead = _dead_rows(q, k)[..., None] if fmap in ("relu", "l1") else np.zeros(scale.shape[:-1] + (1,), bool)
    assert not np.any(np.isnan(scale) & ~dead), (fmap, a, b, c)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**16), exponents, exponents, exponents)
def test_rala_core_bound_every_magnitude(seed, a, b, c):
    """rala_core_bound (RALA's paper defaults) for every magnitude: finite, or inf (no bound), or above
    2^256 FloatingPointError naming a stage (the bound's own, or the core's where the bounded output is not
    computable)."""
    q, k, v = _magnitude_inputs(seed, a, b, c, shape=(1, 2, 4, 4), m=4)
    cfg = R.RALAConfig(dim=8, num_heads=2)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            bound = R.rala_core_bound(q, k, v, cfg, dtype="float64")
    except FloatingPointError as exc:
        assert str(exc).startswith(("rala_core_bound: the bound of rala_core_bound overflows", "rala_core:")), exc
        return
    assert not np.any(np.isnan(np.asarray(bound.scale))), (a, b, c)
