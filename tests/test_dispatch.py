"""Dispatch of reference functions to the fused kernels.

Two reference functions now route their core through the backend switch (docs/backends.md, "Dispatched
operations"):

- :func:`refimpl.attention.enhanced.enhanced_linear_attention` (L2ViT Eq. 4, §4.2, Appendix 8) -> operation
  "linear_attention" (ReLU, eps = 0, clamp_min = C_min, the gain t folded into V), for
  scale_target="numerator" (both presets: the paper's scalar s and the released per-head temperature),
  linear order, no taps;
- :func:`refimpl.attention.angular.linear_angular_attention` (Castling-ViT Eq. 9) -> operation
  "linear_angular_attention", for policy "clamp", arithmetic "scaled", normaliser "none"/"similarity_sum",
  no taps.

Checked here: under ``backends.use("c")`` each agrees with the NumPy backend within the function's error
bound in float64 (the working precision) and in float32 (run under ``numerics.precision(np.float32)``, the
only way the reference computes in float32; compared with the float64 reference on the same rounded
inputs, plus the naive same-precision check), all-negative inputs included (NaN patterns must match);
the default backend returns exactly the NumPy path's bits; taps and unsupported options force NumPy;
the NumPy twin of "linear_angular_attention" does not dispatch again (no recursion when the selected
backend has no kernel for it).  Also the fix of ``focused_bounds._eta_in_u`` for dtype classes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from equivalence.strategies import generate
from refimpl import backends, numerics
from refimpl.attention import angular, angular_linear, angular_series, enhanced, focused_bounds, linear
from tests.kernel_helpers import STATUS, backend_available

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
KINDS = ("normal", "all_negative", "large", "near_duplicate", "mixed_scale")


def test_every_operation_has_its_definition_after_import_refimpl():
    """``import refimpl`` alone (a fresh interpreter, nothing else imported) registers the NumPy definition of
    every operation that has a kernel: ``backends.definition(op)`` and the registry's fallback work without the
    caller importing the module that owns the definition (lisa_local's operator was once missing)."""
    import subprocess
    import sys
    code = ("import refimpl\n"
            "from refimpl import backends\n"
            "from refimpl.backends._registry import _REGISTRY\n"
            "missing = sorted(op for op, impls in _REGISTRY.items() if 'numpy' not in impls)\n"
            "print(repr(missing))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_c_backend_status_is_known():
    """The C backend is available, or its absence is allowed (then every dispatch lands on the NumPy twins
    and the comparisons below still hold); REFIMPL_REQUIRE_BACKENDS=1 makes its absence a failure."""
    backend_available("c")
    kernels = backends.kernels()
    assert "c" in kernels["linear_attention"] and "c" in kernels["linear_angular_attention"]


def _qkv(c, dtype=np.float64):
    b, h, n, m, d, e = c["shape"]
    s = c["seed"]
    q = generate(s, c["q_kind"], (b, h, n, d))
    k = generate(s + 1, c["k_kind"], (b, h, m, d))
    v = generate(s + 2, c["v_kind"], (b, h, m, e))
    return tuple(numerics.round_to(a, dtype) for a in (q, k, v))


@st.composite
def shapes_and_kinds(draw, square=False):
    b = draw(st.integers(1, 2))
    h = draw(st.integers(1, 3))
    n = draw(st.one_of(st.just(1), st.integers(2, 150)))
    m = n if square else draw(st.one_of(st.just(n), st.just(1), st.integers(2, 150)))
    d = draw(st.one_of(st.just(1), st.sampled_from((16, 32)), st.integers(2, 48)))
    e = draw(st.one_of(st.just(d), st.just(1), st.integers(2, 48)))
    return dict(shape=(b, h, n, m, d, e), seed=draw(st.integers(0, 2**32 - 1)),
                q_kind=draw(st.sampled_from(KINDS)), k_kind=draw(st.sampled_from(KINDS)),
                v_kind=draw(st.sampled_from(("normal", "large", "mixed_scale"))))


def _case(shape, seed=5, q="normal", k="normal", v="normal", **extra):
    return dict(shape=shape, seed=seed, q_kind=q, k_kind=k, v_kind=v, **extra)


# ---------------------------------------------------------------------------------------------------
# L2ViT: enhanced_linear_attention -> "linear_attention"
# ---------------------------------------------------------------------------------------------------

@st.composite
def enhanced_cases(draw):
    c = draw(shapes_and_kinds())
    c["preset"] = draw(st.sampled_from(("paper", "official")))
    c["c_min"] = draw(st.sampled_from((1e2, 1.0, 0.0)))
    return c


def _enhanced_scale(c, dtype):
    """(scale array, scale_mode) of the preset: the paper's scalar s (init sqrt(C), Appendix 7, here
    perturbed) dividing; the released per-head temperature t_h (init d^-1/2, here of either sign)
    multiplying.  Rounded to ``dtype``."""
    b, h, n, m, d, e = c["shape"]
    rng = np.random.default_rng(c["seed"] + 3)
    if c["preset"] == "paper":
        s, mode = np.array([np.sqrt(h * d) * rng.uniform(0.5, 2.0)]), "divide"
    else:
        s, mode = rng.uniform(-2.0, 2.0, size=(h, 1, 1)) * d ** -0.5, "multiply"
    return numerics.round_to(s, dtype), mode


@DTYPES
@given(c=enhanced_cases())
@example(c=_case((1, 3, 196, 196, 32, 32), preset="paper", c_min=1e2))
@example(c=_case((1, 3, 196, 196, 32, 32), preset="official", c_min=1e2))
@example(c=_case((1, 2, 50, 60, 8, 8), q="all_negative", preset="paper", c_min=0.0))   # 0/0 = NaN rows
@example(c=_case((1, 2, 50, 60, 8, 8), q="all_negative", preset="official", c_min=1e2))  # dead rows -> 0
@example(c=_case((2, 2, 40, 40, 16, 16), k="all_negative", preset="official", c_min=0.0))  # every row NaN
@example(c=_case((1, 1, 1, 1, 1, 1), preset="paper", c_min=1e2))
def test_enhanced_linear_attention_on_c_agrees_with_numpy(dtype, c):
    """L2ViT Eq. 4 with Appendix 8's clamp and §4.2's scale: enhanced_linear_attention under use("c") equals
    the NumPy backend within enhanced_linear_attention_bound(dtype) element-wise, with the same NaN/Inf
    pattern (all-negative ReLU queries: 0/0 = NaN without the clamp, 0 with C_min > 0); float32 runs in
    float32 (numerics.precision) against the float64 reference on the same rounded inputs and the naive
    float32 NumPy computation."""
    q, k, v = _qkv(c, dtype)
    s, mode = _enhanced_scale(c, dtype)
    kw = dict(c_min=c["c_min"], scale_mode=mode)
    with np.errstate(all="ignore"):
        ref = enhanced.enhanced_linear_attention(q, k, v, scale=s, **kw)
        bound = enhanced.enhanced_linear_attention_bound(q, k, v, scale=s, dtype=dtype, **kw)
        naive = None
        if dtype == np.float32:
            naive = numerics.naive_same_precision(enhanced.enhanced_linear_attention, q, k, v, dtype=np.float32,
                                                  scale=s, **kw)
        with backends.use("c"), numerics.precision(dtype):
            args = [a.astype(dtype) for a in (q, k, v, s)]
            got = enhanced.enhanced_linear_attention(*args[:3], scale=args[3], **kw)
    assert got.dtype == dtype and got.shape == ref.shape
    numerics.assert_close(got, ref, bound, dtype, naive=naive,
                          name=f"enhanced_linear_attention[c, {c['preset']}, c_min={c['c_min']}]")


def _count_calls(monkeypatch, op, backend="c"):
    """Wrap the registered ``backend`` kernel of ``op`` so that each call appends its first argument's dtype."""
    calls = []
    orig = backends._REGISTRY[op][backend]
    monkeypatch.setitem(backends._REGISTRY[op], backend,
                        lambda *a, **kw: (calls.append(a[0].dtype), orig(*a, **kw))[1])
    return calls


@pytest.mark.parametrize("preset", ["paper", "official"])
def test_enhanced_dispatch_default_bits_and_taps(monkeypatch, preset):
    """Default backend (NumPy): exactly the bits of the NumPy path, kernelized_attention(ReLU q, ReLU k, t V)
    with the clamp (L2ViT Eq. 4, App. 8), which the operation's NumPy twin also reproduces bit for bit.
    Under use("c"): one kernel call per enhanced_linear_attention / enhanced_attention call (both presets),
    none with taps, scale_target="similarity" or order="quadratic" (those return the NumPy bits)."""
    c = _case((1, 3, 60, 60, 16, 16), seed=11, q="mixed_scale", preset=preset, c_min=1e2)
    q, k, v = _qkv(c)
    s, mode = _enhanced_scale(c, np.float64)
    kw = dict(c_min=1e2, scale=s, scale_mode=mode)
    assert backends.current() == "numpy"
    ref = enhanced.enhanced_linear_attention(q, k, v, **kw)
    v_eff = v / s.reshape(1, -1, 1, 1) if mode == "divide" else v * s.reshape(1, -1, 1, 1)
    path = linear.kernelized_attention(numerics.relu(q), numerics.relu(k), v_eff, clamp_min=1e2)
    np.testing.assert_array_equal(ref, path)
    np.testing.assert_array_equal(ref, linear._linear_attention_numpy(q, k, v_eff, "relu", 0.0, "add", 1e2))
    sim_ref = enhanced.enhanced_linear_attention(q, k, v, scale_target="similarity", **kw)
    quad_ref = enhanced.enhanced_linear_attention(q, k, v, order="quadratic", **kw)

    calls = _count_calls(monkeypatch, "linear_attention")
    with backends.use("c"):
        got = enhanced.enhanced_linear_attention(q, k, v, **kw)
        taps: dict = {}
        tapped = enhanced.enhanced_linear_attention(q, k, v, taps=taps, **kw)
        sim = enhanced.enhanced_linear_attention(q, k, v, scale_target="similarity", **kw)
        quad = enhanced.enhanced_linear_attention(q, k, v, order="quadratic", **kw)
    ok = STATUS["c"].ok
    assert len(calls) == (1 if ok else 0)
    np.testing.assert_array_equal(tapped, ref)
    assert "kv" in taps and "gain" in taps
    np.testing.assert_array_equal(sim, sim_ref)
    np.testing.assert_array_equal(quad, quad_ref)
    numerics.assert_close(got, ref, enhanced.enhanced_linear_attention_bound(q, k, v, dtype=np.float64, **kw),
                          np.float64, name=f"enhanced dispatched [{preset}]")

    # The attention layer (qkv, heads, core, proj) of the preset goes through the same dispatch.
    cfg = enhanced.L2ViTConfig.preset(preset, dim=48, num_heads=3)
    attn = enhanced.subparams(enhanced.init_l2vit_params(cfg, "lga", seed=0), "attn")
    x = generate(4, "normal", (1, 30, 48))
    layer_ref = enhanced.enhanced_attention(x, attn, cfg)
    with backends.use("c"):
        layer = enhanced.enhanced_attention(x, attn, cfg)
    assert len(calls) == (2 if ok else 0)
    numerics.assert_close(layer, layer_ref, enhanced.enhanced_attention_bound(x, attn, cfg, dtype=np.float64),
                          np.float64, name=f"enhanced_attention dispatched [{preset}]")


@DTYPES
@pytest.mark.parametrize("preset", ["paper", "official"])
def test_enhanced_dispatch_passes_the_gain_to_the_kernel(monkeypatch, dtype, preset):
    """Under use("c") the gain t of L2ViT §4.2 (V / s, paper; V * t_h per head, official) goes to the C
    kernel as ``v_scale`` (applied as V rows are loaded, no t V temporary), and the result is the bits of
    the kernel on the prescaled v_eff = V / s (V * t) that the NumPy path uses: the same rounded operands."""
    if not backend_available("c", "linear_attention"):
        return
    c = _case((1, 3, 90, 90, 16, 16), seed=13, q="mixed_scale", preset=preset, c_min=1e2)
    q, k, v = (a.astype(dtype) for a in _qkv(c, dtype))
    s, mode = _enhanced_scale(c, dtype)
    s = s.astype(dtype)
    orig = backends._REGISTRY["linear_attention"]["c"]
    seen = []

    def wrapped(*a, **kw):
        seen.append(kw)
        return orig(*a, **kw)

    wrapped.SUPPORTS_V_SCALE = True
    monkeypatch.setitem(backends._REGISTRY["linear_attention"], "c", wrapped)
    with backends.use("c"), numerics.precision(dtype):
        got = enhanced.enhanced_linear_attention(q, k, v, c_min=1e2, scale=s, scale_mode=mode)
    assert len(seen) == 1 and seen[0]["v_scale_mode"] == mode and seen[0]["v_scale"].size == s.size
    v_eff = v / s.reshape(1, -1, 1, 1) if mode == "divide" else v * s.reshape(1, -1, 1, 1)
    np.testing.assert_array_equal(got, orig(q, k, v_eff, "relu", 0.0, "add", 1e2))


# ---------------------------------------------------------------------------------------------------
# Castling-ViT: linear_angular_attention -> "linear_angular_attention"
# ---------------------------------------------------------------------------------------------------

@st.composite
def angular_cases(draw):
    constant = draw(st.sampled_from(("sum", "own")))
    c = draw(shapes_and_kinds(square=constant == "own"))
    c.update(constant=constant, normaliser=draw(st.sampled_from(("none", "similarity_sum"))))
    return c


EPS = 1e-12


@DTYPES
@given(c=angular_cases())
@example(c=_case((1, 3, 196, 196, 32, 32), constant="sum", normaliser="none"))
@example(c=_case((1, 3, 196, 196, 32, 32), constant="own", normaliser="similarity_sum"))
@example(c=_case((1, 2, 50, 50, 8, 8), q="all_negative", k="all_negative", constant="own", normaliser="none"))
@example(c=_case((1, 1, 1, 1, 1, 1), constant="sum", normaliser="similarity_sum"))
def test_linear_angular_attention_on_c_agrees_with_numpy(dtype, c):
    """Castling-ViT Eq. 9 (paper-mode unit rows): linear_angular_attention under use("c") equals the NumPy
    backend within angular.linear_angular_attention_bound (the first-order bound derived in its docstring),
    NaN/Inf patterns equal; float32 runs in float32 (numerics.precision) against the float64 reference,
    with the naive float32 check."""
    q, k, v = _qkv(c, dtype)
    kw = dict(constant=c["constant"], normaliser=c["normaliser"], eps=EPS)
    with np.errstate(all="ignore"):
        ref = angular.linear_angular_attention(q, k, v, **kw)
        bound = angular.linear_angular_attention_bound(q, k, v, constant=c["constant"],
                                                         normaliser=c["normaliser"], eps=EPS)
        naive = None if dtype == np.float64 else numerics.naive_same_precision(
            angular.linear_angular_attention, q, k, v, dtype=np.float32, **kw)
        with backends.use("c"), numerics.precision(dtype):
            got = angular.linear_angular_attention(*(a.astype(dtype) for a in (q, k, v)), **kw)
    assert got.dtype == dtype and got.shape == ref.shape
    numerics.assert_close(got, ref, bound, dtype, naive=naive,
                          name=f"linear_angular_attention[c, {c['constant']}, {c['normaliser']}]")


def test_linear_angular_dispatch_default_bits_taps_and_no_recursion(monkeypatch):
    """Default backend: exactly the bits of the NumPy body (angular_linear._linear_angular_attention_numpy).  Under
    use("c"): one kernel call for the paper configuration; none with taps, policy "none", arithmetic
    "naive" or normaliser "output_l2" (the official options), which return the NumPy body's bits under the same
    backend (whose unit rows, operation "l2_normalize", dispatch in turn).  Under a
    backend without a kernel for the operation (Numba), the NumPy twin runs and does not dispatch again."""
    q, k, v = _qkv(_case((2, 2, 45, 45, 12, 10), seed=21, q="mixed_scale"))
    assert backends.current() == "numpy"
    body = angular_linear._linear_angular_attention_numpy
    for kw in (dict(), dict(constant="own", normaliser="similarity_sum")):
        np.testing.assert_array_equal(angular.linear_angular_attention(q, k, v, **kw), body(q, k, v, **kw))
    official = dict(constant="own", normaliser="output_l2", eps=0.0, policy="none", arithmetic="naive")
    numpy_only = [dict(policy="none"), dict(arithmetic="naive"), dict(normaliser="output_l2"), official]
    calls = _count_calls(monkeypatch, "linear_angular_attention")
    with backends.use("c"):
        got = angular.linear_angular_attention(q, k, v)
        taps: dict = {}
        tapped = angular.linear_angular_attention(q, k, v, taps=taps)
        others = [angular.linear_angular_attention(q, k, v, **kw) for kw in numpy_only]
        # the NumPy body under the same backend: its own operations (the unit rows' "l2_normalize") dispatch too
        plain, refs = body(q, k, v), [body(q, k, v, **kw) for kw in numpy_only]
    assert len(calls) == (1 if STATUS["c"].ok else 0)
    np.testing.assert_array_equal(tapped, plain)
    assert "kv" in taps
    for o, r in zip(others, refs):
        np.testing.assert_array_equal(o, r)
    numerics.assert_close(got, body(q, k, v), angular.linear_angular_attention_bound(q, k, v, eps=EPS), np.float64,
                          name="linear_angular dispatched")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "runs on the NumPy definition" (once per op)
        with backends.use("numba"):
            assert "numba" not in backends.kernels()["linear_angular_attention"]
            twin = angular.linear_angular_attention(q, k, v)   # RecursionError before the fix of the twin
            plain = body(q, k, v)                              # (its unit rows on the Numba twin of l2_normalize)
    np.testing.assert_array_equal(twin, plain)
    assert len(calls) == (1 if STATUS["c"].ok else 0)


# ---------------------------------------------------------------------------------------------------
# focused_bounds._eta_in_u accepts dtype-likes
# ---------------------------------------------------------------------------------------------------

def test_eta_in_u_accepts_dtype_classes_and_names():
    """eta_T / u_T (Higham eq. 2.8) for np.float64 / np.float32 classes, np.dtype objects and names alike:
    2^-1074 / 2^-53 / 2 = 2^-1022 and 2^-149 / 2^-24 / 2 = 2^-126 exactly."""
    assert focused_bounds._eta_in_u(None) == 0.0
    for f64 in (np.float64, np.dtype(np.float64), "float64", "f8"):
        assert focused_bounds._eta_in_u(f64) == 2.0 ** -1022
    for f32 in (np.float32, np.dtype("float32"), "float32", "bfloat16"):
        assert focused_bounds._eta_in_u(f32) == 2.0 ** -126
    assert focused_bounds._eta_in_u(np.float16) == 2.0 ** -14


# ---------------------------------------------------------------------------------------------------
# Castling-ViT: angular_series_features -> "angular_series_features" (Numba)
# ---------------------------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("order,d,policy", [(0, 32, "clamp"), (1, 4, "clamp"), (2, 3, "none"), (0, 1, "none")])
def test_angular_series_features_dispatch(monkeypatch, dtype, order, d, policy):
    """Castling-ViT Eq. 8: angular_series_features (and so angular_attention_features, which builds on it)
    under use("numba") runs the Numba kernel once per call and agrees with the NumPy backend within
    tests.test_kernels_numba.angular_bound (float32 runs in float32 with the naive float32 check); the
    default backend returns exactly the NumPy body's bits; the NumPy twin does not dispatch again."""
    from tests.test_kernels_numba import angular_bound

    x = numerics.round_to(generate(5 + order, "mixed_scale", (2, 3, 17, d)), dtype)
    kw = dict(constant=True, eps=EPS, policy=policy)
    body = angular_series._angular_series_features_numpy
    assert backends.current() == "numpy"
    np.testing.assert_array_equal(angular.angular_series_features(x, order, **kw), body(x, order, **kw))
    np.testing.assert_array_equal(backends.definition("angular_series_features")(x, order, **kw), body(x, order, **kw))
    calls = _count_calls(monkeypatch, "angular_series_features", "numba")
    with backends.use("numba"), numerics.precision(dtype):
        got = angular.angular_series_features(x.astype(dtype), order, **kw)
    assert len(calls) == (1 if STATUS["numba"].ok else 0)
    assert got.dtype == dtype
    naive = None if dtype == np.float64 else numerics.naive_same_precision(body, x, order, dtype=np.float32, **kw)
    numerics.assert_close(got, body(x, order, **kw), angular_bound(x, order, **kw), dtype, naive=naive,
                          name=f"angular_series_features dispatched [K={order}, {policy}]")
