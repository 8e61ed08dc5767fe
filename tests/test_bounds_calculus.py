"""The error calculus (refimpl/bounds.py) against high-precision evaluation.

- Safety (rigorous model, Precision.of): random expression trees built from the primitives (element-wise sums,
  products and quotients, linear maps, 2- and 3-factor contractions, matrix products, depthwise convolutions
  with or without bias, tanh) on random
  4 x 4 operands (signed, all-positive, integers plus small perturbations for cancellation, subnormal-range
  values, zeros) are evaluated in T = float32 and T = float16 (sums accumulated in float32 and rounded once,
  config.ACCUMULATION_FORMAT) and in mpmath at 120 digits; the computed result's error is within the composed
  bound at every element.
- Safety (first-order model, Precision.coefficients): LayerNorm (channels last and channels first), linear and
  depthwise conv on exact inputs, |err| <= u_T E; the row normalisation x / max(||x||, eps) on exact and on
  rounded inputs, also near T's underflow, and not loose by more than a factor 2 on random rows.
- Safety of the networks' stage rules (a sum charged on itself, the mean, GELU in both forms, a per-column scale,
  eval BatchNorm in the definition's and PyTorch's folded order) on random depth-2 trees and leaves in float32
  and float16, in both models.
- Tightness: on inputs where the worst case of an evaluation order is reached (a sequential sum 1 + u + ... + u
  that rounds every addition down by u, also as a mean; a product and a sum that round by a full u), the bound is
  within the stated factor of the attained error.
- Pins computed by hand in the docstrings.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest

from refimpl import bounds, config, layers, numerics

DPS = 120      # mpmath digits of the reference (mpmath.workdps inside the tests: the global setting is left alone)
SHAPE = (4, 4)
ACC = {"float16": np.float32, "float32": np.float32}


class Node:
    """One intermediate: ``t`` its evaluation in T, ``x`` its exact value (mpmath, object array), ``v`` the
    float64 rounding of x (the value the rules are given), ``e`` the calculus's bound on |t - x|."""

    def __init__(self, t, x, e):
        self.t, self.x, self.e = t, x, e
        self.v = np.vectorize(float, otypes=[np.float64])(x)


def _mp(a):
    return np.vectorize(mpmath.mpf, otypes=[object])(np.asarray(a, dtype=np.float64))


def _leaf(rng, dt):
    kind = rng.choice(["normal", "pos", "cancel", "tiny", "zeros"])
    a = rng.standard_normal(SHAPE) * 2
    if kind == "pos":
        a = np.abs(a)
    elif kind == "cancel":
        a = np.round(a) + rng.standard_normal(SHAPE) * 2.0 ** -9
    elif kind == "tiny":      # deep in T's subnormal range and around its normal threshold
        a = a * (2.0 ** -18 if dt == "float16" else 2.0 ** -140)
    elif kind == "zeros":
        a = np.where(rng.random(SHAPE) < 0.5, 0.0, a)
    t = a.astype(dt)
    return Node(t, _mp(t), np.zeros(SHAPE))


def _acc_matmul(a, b, dt):
    """a @ b in T: products and sums in the accumulation format, the result rounded once to T."""
    acc = ACC[dt]
    return (a.astype(acc) @ b.astype(acc)).astype(dt)


def _mp_matmul(a, b):
    return np.array([[mpmath.fsum(a[i, k] * b[k, j] for k in range(a.shape[1])) for j in range(b.shape[1])]
                     for i in range(a.shape[0])], dtype=object)


def _conv_same(x, w, acc=None):
    """'same' 3 x 3 convolution of one channel, taps summed in the order (u, v); ``acc`` the float type of
    the sums (None: exact mpmath)."""
    h, wd = x.shape
    out = np.empty(x.shape, dtype=object if acc is None else acc)
    for i in range(h):
        for j in range(wd):
            terms = [(x[i + du - 1, j + dv - 1], w[du, dv]) for du in range(3) for dv in range(3)
                     if 0 <= i + du - 1 < h and 0 <= j + dv - 1 < wd]
            if acc is None:
                out[i, j] = mpmath.fsum(a * b for a, b in terms)
            else:
                s = acc(0)
                for a, b in terms:
                    s = acc(s + acc(a) * acc(b))
                out[i, j] = s
    return out


def _in_range(node, dt) -> bool:
    """Whether the node's exact values, widened by their bounds, stay below T's largest finite number (the calculus
    does not model overflow)."""
    reach = np.where(np.isfinite(node.e), np.abs(node.v) + node.e, np.abs(node.v))
    return bool(np.all(reach < float(np.finfo(dt).max)))


def _tree(rng, dt, pr, depth, seen):
    """A random expression of depth <= ``depth``; every node built is appended to ``seen``."""
    node = _op(rng, dt, pr, depth, seen)
    seen.append(node)
    return node


def _op(rng, dt, pr, depth, seen):
    if depth == 0 or rng.random() < 0.2:
        return _leaf(rng, dt)
    op = rng.choice(["sum", "product", "quotient", "linear", "contract", "matmul", "contract3", "conv", "tanh"])
    a = _tree(rng, dt, pr, depth - 1, seen)
    if op == "sum":
        b = _tree(rng, dt, pr, depth - 1, seen)
        return Node(a.t + b.t, a.x + b.x, bounds.e_sum2(a.v, a.e, b.v, b.e, pr))
    if op == "product":
        b = _tree(rng, dt, pr, depth - 1, seen)
        return Node(a.t * b.t, a.x * b.x, bounds.e_product(a.v, a.e, b.v, b.e, pr))
    if op == "quotient":
        b = _tree(rng, dt, pr, depth - 1, seen) if rng.random() < 0.5 else _leaf(rng, dt)
        ok = b.v != 0
        x = np.where(ok, a.x / np.where(ok, b.x, 1), 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            t = a.t / b.t
            y = np.where(ok, a.v / np.where(ok, b.v, 1.0), 0.0)
        e = bounds.e_quotient(y, a.e, b.v, b.e, pr, roundings=1)
        return Node(t, x, np.where(ok, e, np.inf))
    if op == "linear":
        w = _leaf(rng, dt)
        bias = _leaf(rng, dt) if rng.random() < 0.5 else None
        t = _acc_matmul(a.t, w.t.T, dt)
        x = _mp_matmul(a.x, w.x.T)
        if bias is not None:
            t, x = t + bias.t[0], x + bias.x[0]
        e = bounds.e_linear(a.v, a.e, w.v, None if bias is None else bias.v[0], pr, flat=bool(rng.random() < 0.5))
        return Node(t, x, e)
    if op == "contract":
        b = _tree(rng, dt, pr, depth - 1, seen)
        e = bounds.e_contract("ij,jk->ik", a.v, a.e, b.v, b.e, pr.sums(4), 4, pr)
        return Node(_acc_matmul(a.t, b.t, dt), _mp_matmul(a.x, b.x), e)
    if op == "matmul":
        b = _tree(rng, dt, pr, depth - 1, seen)
        return Node(_acc_matmul(a.t, b.t, dt), _mp_matmul(a.x, b.x), bounds.e_matmul(a.v, a.e, b.v, b.e, pr))
    if op == "contract3":     # (a b) stored in T, then times c: 2 products and sums(4) + sums(4) roundings a term
        b, c = _tree(rng, dt, pr, depth - 1, seen), _leaf(rng, dt)
        mid = Node(_acc_matmul(a.t, b.t, dt), _mp_matmul(a.x, b.x),
                   bounds.e_contract("ij,jk->ik", a.v, a.e, b.v, b.e, pr.sums(4), 4, pr))
        seen.append(mid)          # the stored intermediate: in T's range too
        e = bounds.e_contract3("ij,jk,kl->il", a.v, a.e, b.v, b.e, c.v, c.e, 2 * pr.sums(4), 16, pr)
        return Node(_acc_matmul(mid.t, c.t, dt), _mp_matmul(mid.x, c.x), e)
    if op == "conv":
        wt = rng.standard_normal((3, 3)).astype(dt)
        bias = np.array([rng.standard_normal()]).astype(dt) if rng.random() < 0.5 else None
        t = _conv_same(a.t, wt, ACC[dt]).astype(dt)
        x = _conv_same(a.x, _mp(wt))
        if bias is not None:      # the bias added to the stored sum: one more rounding in T
            t, x = t + bias[0], x + mpmath.mpf(float(bias[0]))
        e = bounds.e_depthwise(a.v[None, None], a.e[None, None], wt.astype(np.float64)[None, None],
                               None if bias is None else bias.astype(np.float64), pr,
                               lambda z, ww, bb: layers.depthwise_conv2d(z, ww, bb, padding=1))[0, 0]
        return Node(t, x, e)
    # tanh: 1-Lipschitz, ELEMENTARY_FUNCTION_ULPS ulps
    x = np.vectorize(mpmath.tanh, otypes=[object])(a.x)
    xv = np.vectorize(float, otypes=[np.float64])(x)
    return Node(np.tanh(a.t), x, bounds.e_elementwise(xv, a.e, 1.0, config.ELEMENTARY_FUNCTION_ULPS, pr))


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_composed_bound_is_safe_on_random_expression_trees(dt):
    """|fl_T(tree) - tree| <= E at every element of 40 random trees of depth <= 3 (Higham eq. 2.8 model; the
    float16 sums accumulated in float32, counted by Precision.sums).  Trees with an intermediate whose exact value
    plus its bound reaches T's largest finite number are excluded (the calculus does not model overflow); at least
    half must remain.  A non-finite result where the bound is finite fails."""
    rng = np.random.default_rng(12 if dt == "float32" else 13)
    pr = bounds.Precision.of(dt)
    kept, worst = 0, 0.0
    for _ in range(40):
        seen: list = []
        with np.errstate(all="ignore"), mpmath.workdps(DPS):
            node = _tree(rng, dt, pr, 3, seen)
        if not all(_in_range(n, dt) for n in seen):
            continue
        kept += 1
        for idx in np.ndindex(SHAPE):
            if not np.isfinite(node.e[idx]):
                continue
            with mpmath.workdps(DPS):
                err = abs(mpmath.mpf(float(node.t[idx])) - node.x[idx])
            assert err <= node.e[idx], (dt, idx, float(err), node.e[idx])
            if node.e[idx] > 0:
                worst = max(worst, float(err / node.e[idx]))
    assert kept >= 20, kept
    assert worst > 0.0      # the trees make rounding errors (the check is not vacuous)


def _hp(f):
    return np.vectorize(float, otypes=[np.float64])(f)


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_first_order_layer_norm_linear_conv_are_safe(dt):
    """First-order model (Precision.coefficients): |fl_T(f(x)) - f(x)| <= u_T E for LayerNorm over the last
    axis and over channels (axis=1), a linear map and a depthwise conv, on exact inputs in T (LayerNorm
    evaluated in T in two passes as refimpl.layers.layer_norm; the reference in mpmath)."""
    with mpmath.workdps(DPS):
        _first_order_checks(dt)


def _first_order_checks(dt):
    rng = np.random.default_rng(5)
    u = numerics.unit_roundoff(dt)
    pr = bounds.Precision.coefficients(dt)
    for trial in range(8):
        c = int(rng.integers(2, 9))
        x = (rng.standard_normal((3, c)) * 4 + (10.0 if trial % 2 else 0.0)).astype(dt)
        w, b = rng.standard_normal(c).astype(dt), rng.standard_normal(c).astype(dt)
        eps = 1e-5
        xf = x.astype(np.float32)
        mu = np.mean(xf, axis=-1, keepdims=True)
        d = xf - mu
        y_t = (d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + np.float32(eps)) * w + b).astype(dt)
        xm = _mp(x)
        y_x = np.empty(x.shape, dtype=object)
        for r in range(3):
            m = mpmath.fsum(xm[r]) / c
            s = mpmath.sqrt(mpmath.fsum((v - m) ** 2 for v in xm[r]) / c + mpmath.mpf(eps))
            for j in range(c):
                y_x[r, j] = (xm[r, j] - m) / s * mpmath.mpf(float(w[j])) + mpmath.mpf(float(b[j]))
        x64 = x.astype(np.float64)
        e, k = bounds.e_layer_norm(x64, np.zeros_like(x64), w.astype(np.float64), b.astype(np.float64), eps, pr)
        assert k == pr.sums(c) + 8
        err = _hp(np.abs(_mp(y_t) - y_x))
        assert np.all(err <= u * e), (dt, err / (u * e))
        # channels first: the same rows as (1, C, 1, 3)
        e_cf, _ = bounds.e_layer_norm(x64.T[None, :, None, :], np.zeros((1, c, 1, 3)), w.astype(np.float64),
                                      b.astype(np.float64), eps, pr, axis=1)
        assert np.all(err.T[None, :, None, :] <= u * e_cf)
        # linear: x W^T + b with an (out, c) weight
        wt = rng.standard_normal((5, c)).astype(dt)
        lin_t = (_acc_matmul(x, wt.T, dt) + b[:1]).astype(dt)
        lin_x = _mp_matmul(xm, _mp(wt).T) + mpmath.mpf(float(b[0]))
        e_lin = bounds.e_linear(x64, np.zeros_like(x64), wt.astype(np.float64), np.full(5, float(b[0])), pr)
        assert np.all(_hp(np.abs(_mp(lin_t) - lin_x)) <= u * e_lin)
    # depthwise conv with float32 sums
    img = (rng.standard_normal((4, 5)) * 3).astype(dt)
    ker = rng.standard_normal((3, 3)).astype(dt)
    conv_t = _conv_same(img, ker, ACC[dt]).astype(dt)
    conv_x = _conv_same(_mp(img), _mp(ker))
    e_conv = bounds.e_depthwise(img.astype(np.float64)[None, None], np.zeros((1, 1, 4, 5)),
                                ker.astype(np.float64)[None, None], None, pr,
                                lambda z, ww, bb: layers.depthwise_conv2d(z, ww, bb, padding=1))[0, 0]
    assert np.all(_hp(np.abs(_mp(conv_t) - conv_x)) <= u * e_conv)


def _seq(values, dt=np.float32):
    """sum of ``values`` left to right in ``dt`` (one legitimate evaluation order)."""
    s = dt(0.0)
    for v in values:
        s = dt(s + dt(v))
    return s


U32 = numerics.unit_roundoff("float32")
PR32 = bounds.Precision.of("float32")


def _ratio(e, err):
    """E / err as an exact fraction, after checking safety err <= E."""
    assert Fraction(float(e)) >= err, (float(e), float(err))
    return Fraction(float(e)) / err


def test_contraction_and_linear_bounds_are_tight_on_sums_that_round_down_at_every_step():
    """x = (1, u, ..., u) (n entries, u = 2^-24) against ones, summed left to right in float32: every 1 + u is a
    tie and rounds to 1 (to even), so the computed sum is 1 and the error (n - 1) u, the worst case of this order.
    e_contract's gamma_n (1 + (n - 1) u) + n eta is within n / (n - 1) (1 + n u) / (1 - n u) <= 1.02 of it
    (n = 64).  With a bias u (one more tie): error n u, e_linear's gamma_{n+1} within (n + 1) / n, <= 1.02."""
    n = 64
    x = np.array([[1.0] + [U32] * (n - 1)])
    assert _seq(x[0]) == np.float32(1.0)
    e = bounds.e_contract("ij,kj->ik", x, np.zeros_like(x), np.ones((1, n)), np.zeros((1, n)), PR32.sums(n), n, PR32)
    assert _ratio(e[0, 0], Fraction(n - 1) * Fraction(U32)) <= Fraction(102, 100)
    assert _seq(list(x[0]) + [U32]) == np.float32(1.0)
    e_lin = bounds.e_linear(x, np.zeros_like(x), np.ones((1, n)), np.array([U32]), PR32)
    assert _ratio(e_lin[0, 0], Fraction(n) * Fraction(U32)) <= Fraction(102, 100)


def test_three_factor_bound_is_tight_when_both_stages_round_down():
    """a = (1, u, u, u), B = ones (4 x 4), c = (1, u, u, u)^T evaluated as (a B) c in float32, left to right: each
    (a B)_k = 1 + 3u rounds to 1 (three ties), then 1 + u + u + u rounds to 1 again; the exact value is
    (1 + 3u)^2, the error 6u + 9u^2.  e_contract3 with n = 2 sums(4) = 8 roundings a term: gamma_8 (1 + 3u)^2 +
    2 m eta, within 8/6 (1 + 8u)^2 <= 1.34 of it."""
    a = np.array([[1.0, U32, U32, U32]])
    b, c = np.ones((4, 4)), a.T.copy()
    assert _seq(a[0]) == np.float32(1.0) and _seq([1.0 * ck for ck in c[:, 0]]) == np.float32(1.0)
    err = (1 + 3 * Fraction(U32)) ** 2 - 1
    e = bounds.e_contract3("ij,jk,kl->il", a, 0 * a, b, 0 * b, c, 0 * c, 2 * PR32.sums(4), 16, PR32)
    assert _ratio(e[0, 0], err) <= Fraction(134, 100)


def test_depthwise_bound_is_tight_on_a_window_that_rounds_down_at_every_tap():
    """A 3 x 3 window whose first tap (row-major order) reads 1 and the other eight u, a kernel of ones: the
    taps summed in order round every addition down by u (ties), error 8 u; the bound gamma_9 (1 + 8 u) is within
    9/8 (1 + 9 u) / (1 - 9 u) <= 1.13 of it."""
    img = np.full((3, 3), U32)
    img[0, 0] = 1.0
    assert _seq(img.ravel()) == np.float32(1.0)
    e = bounds.e_depthwise(img[None, None], np.zeros((1, 1, 3, 3)), np.ones((1, 1, 3, 3)), None, PR32,
                           lambda z, w, b: layers.depthwise_conv2d(z, w, b, padding=1))
    assert _ratio(e[0, 0, 1, 1], 8 * Fraction(U32)) <= Fraction(113, 100)


def test_product_sum_and_underflow_bounds_are_tight_on_ties():
    """(1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is a tie in float32 and rounds to 1 + 2^-11: error u, bound
    gamma_1 (1 + 2^-12)^2 + eta, ratio <= 1 + 2^-10.  1 + 2^-24 is a tie and rounds to 1: error u, bound
    u (1 + u).  (2^-75)^2 = 2^-150, half the smallest subnormal, a tie that rounds to 0: error 2^-150; the bound
    gamma_1 2^-150 + eta_32 (eta_32 = 2^-149, numerics.underflow_eta: the smallest subnormal, twice Higham's
    half) is within 2 (1 + u) of it."""
    a = np.float32(1 + 2.0 ** -12)
    err = abs(Fraction(float(a * a)) - Fraction(float(a)) ** 2)
    assert err == Fraction(U32)
    assert _ratio(bounds.e_product(np.float64(a), 0.0, np.float64(a), 0.0, PR32), err) <= 1 + Fraction(1, 1024)
    assert np.float32(1.0) + np.float32(U32) == np.float32(1.0)
    ratio = _ratio(bounds.e_sum2(1.0, 0.0, U32, 0.0, PR32), Fraction(U32))
    assert ratio <= (1 + Fraction(U32)) * (1 + Fraction(1, 2 ** 50))
    t = np.float32(2.0 ** -75)
    assert t * t == np.float32(0.0)
    ratio = _ratio(bounds.e_product(2.0 ** -75, 0.0, 2.0 ** -75, 0.0, PR32), Fraction(2) ** -150)
    assert ratio <= 2 * (1 + Fraction(U32))


def test_quotient_bound_carries_the_denominators_error():
    """b = 1 + 8u computed as the sequential sum 1 + u + ... + u (eight ties: b' = 1, E_b from e_contract), then
    y = 1 / b: the computed 1 / 1 = 1 is exact, the error is 1 - 1 / (1 + 8u) ~ 8u, all of it the denominator's.
    The bound (1 + gamma_1)(|y| E_b) / (|b| - E_b) + gamma_1 |y| + eta is within 1.3 of it."""
    x = np.array([[1.0] + [U32] * 8])
    assert _seq(x[0]) == np.float32(1.0)
    eb = bounds.e_contract("ij,kj->ik", x, np.zeros_like(x), np.ones((1, 9)), np.zeros((1, 9)), PR32.sums(9), 9,
                           PR32)[0, 0]
    b_exact = 1 + 8 * Fraction(U32)
    err = 1 - 1 / b_exact
    e = bounds.e_quotient(np.array(float(1 / b_exact)), np.array(0.0), np.array(float(b_exact)), np.array(eb), PR32,
                          roundings=1)
    assert _ratio(e, err) <= Fraction(13, 10)


def test_three_factor_contraction_with_an_underflowing_intermediate():
    """float16 (sums in float32, stored in float16): a = (2^-13, 2^-13, 2^-13, 0), B = 2^-13 (4 x 4), c = 2^10 (4 x 1),
    evaluated as (a B) c: each (a B)_k = 3 * 2^-26 = 0.75 * 2^-24 is stored as the subnormal 2^-24 (error 2^-26),
    then times 2^10 and summed over four k: error 4 * 2^10 * 2^-26 = 2^-14, while gamma_n S + 2 m eta alone is
    ~2.1e-6 (m = 16, eta_16 = 2^-24), 29 times too small: the rule's intermediate-underflow term (eta times each
    factor's summed magnitude) covers it."""
    pr = bounds.Precision.of("float16")
    a = np.array([[2.0 ** -13] * 3 + [0.0]])
    b, c = np.full((4, 4), 2.0 ** -13), np.full((4, 1), 2.0 ** 10)
    ab = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    out = (ab.astype(np.float32) @ c.astype(np.float32)).astype(np.float16)
    err = abs(Fraction(float(out[0, 0])) - Fraction(3 * 4 * 2 ** 10, 2 ** 26))
    e = bounds.e_contract3("ij,jk,kl->il", a, 0 * a, b, 0 * b, c, 0 * c, 2 * pr.sums(4), 16, pr)
    assert err <= Fraction(float(e[0, 0]))


def test_pinned_linear_and_quotient_values():
    """x = [1, -2], W = [[3, 4]], b = [0.5] in float32: S = 3 + 8 + 0.5 = 11.5, n = 2 products, one bias add:
    E = gamma_3(2^-24) 11.5 + 2 eta_32 = 11.5 * 3u / (1 - 3u) + 2 * 2^-149 (as an exact fraction; the float64
    evaluation of the formula within gamma_4(u_64) of it).  Quotient y = 1 / 2 with E_a = 0, E_b = 1, one rounding:
    (1 + gamma_1)(0 + 0.5) / (2 - 1) + gamma_1 0.5 + eta; with E_b = 2 >= |b| no bound: inf."""
    pr = bounds.Precision.of("float32")
    u = Fraction(2) ** -24
    e = bounds.e_linear(np.array([[1.0, -2.0]]), np.zeros((1, 2)), np.array([[3.0, 4.0]]), np.array([0.5]), pr)
    want = Fraction(23, 2) * 3 * u / (1 - 3 * u) + 2 * Fraction(2) ** -149
    assert abs(Fraction(float(e[0, 0])) - want) <= want * Fraction(numerics.gamma(4, 2.0 ** -53))
    g1 = u / (1 - u)
    q = bounds.e_quotient(np.array([0.5, 0.5]), np.zeros(2), np.array([2.0, 2.0]), np.array([1.0, 2.0]), pr, 1)
    want_q = (1 + g1) * Fraction(1, 2) + g1 / 2 + Fraction(2) ** -149
    assert abs(Fraction(float(q[0])) - want_q) <= want_q * Fraction(numerics.gamma(6, 2.0 ** -53))
    assert q[1] == np.inf


def test_pinned_first_order_layer_norm():
    """x = [1, -1], no affine, eps = 0: mean 0, d = (1, -1), s = 1, mean|x| = 1, so S = (|d| + 1) / s = (2, 2) and
    k = 2 + 8 = 10: E = 20 on exact input.  With E_x = (1, 0): mean(e) = 1/2, xh = (1, -1), mean(|xh| e) = 1/2, so
    P = (1 + 1/2 + 1/2, 0 + 1/2 + 1/2) = (2, 1) and E = (22, 21)."""
    pr = bounds.Precision.coefficients()
    x = np.array([[1.0, -1.0]])
    e0, k = bounds.e_layer_norm(x, np.zeros_like(x), None, None, 0.0, pr)
    assert k == 10 and np.array_equal(e0, [[20.0, 20.0]])
    e1, _ = bounds.e_layer_norm(x, np.array([[1.0, 0.0]]), None, None, 0.0, pr)
    assert np.array_equal(e1, [[22.0, 21.0]])


def test_precision_models_and_errors():
    """Precision.of is Higham's gamma_n (inf where n u >= 1) with the mixed-precision count for float16
    (n u_32 / u_16 + 1); Precision.coefficients counts n; the LayerNorm rule refuses the rigorous model, naming
    the argument; a non-float dtype is refused by name."""
    p16 = bounds.Precision.of("float16")
    assert p16.sums(2 ** 13) == 2.0
    assert p16.g(2 ** 11) == np.inf and 0 < p16.g(2 ** 10) < np.inf
    pc = bounds.Precision.coefficients("float16")
    assert pc.g(7) == 7.0 and pc.sums(2 ** 13) == 2.0 and pc.eta == 0.0
    with pytest.raises(ValueError, match="argument 'pr'"):
        bounds.e_layer_norm(np.ones((1, 2)), np.zeros((1, 2)), None, None, 0.0, p16)
    with pytest.raises(TypeError, match="dtype"):
        bounds.Precision.of("int32")


def _t(v, dt):
    """``v`` rounded to T (a scalar or an array)."""
    return np.asarray(v, dtype=np.float64).astype(dt)


def _mean_t(a, dt, n):
    """The mean of a[:, :n] in T: the n-term sum accumulated in the accumulation format left to right, stored in T,
    then divided by n in T."""
    acc = ACC[dt]
    s = np.array([_seq(list(row[:n]), acc) for row in a]).astype(dt)
    return (s / _t(n, dt))[:, None]


def _gelu_t(x, dt, approximate):
    """GELU evaluated in T operation by operation (every constant rounded to T; erf and tanh evaluated in float64
    and rounded to T, within 1 ulp of T)."""
    from scipy.special import erf
    half, one = _t(0.5, dt), _t(1.0, dt)
    if approximate == "none":
        inner = _t(erf((x * _t(1 / np.sqrt(2.0), dt)).astype(np.float64)), dt)
    else:
        arg = _t(np.sqrt(2.0 / np.pi), dt) * (x + _t(config.GELU_TANH_COEF, dt) * x * x * x)
        inner = _t(np.tanh(arg.astype(np.float64)), dt)
    return half * x * (one + inner)


def _gelu_mp(x, approximate):
    if approximate == "none":
        return x / 2 * (1 + mpmath.erf(x / mpmath.sqrt(2)))
    c = mpmath.mpf(float(np.sqrt(2.0 / np.pi)))       # the definition's float64 constants (refimpl.numerics.gelu)
    return x / 2 * (1 + mpmath.tanh(c * (x + mpmath.mpf(config.GELU_TANH_COEF) * x ** 3)))


def _batch_norm_t(x, w, b, rm, rv, eps, dt, folded):
    """Eval BatchNorm over the channels (axis 1) of (1, C, H, 1) in T: as refimpl.layers.batch_norm2d
    ((x - rm) / sqrt(rv + eps) * w + b) or folded as PyTorch does (x * scale + (b - rm * scale),
    scale = w / sqrt(rv + eps))."""
    col = (slice(None), None, None)
    root = np.sqrt(rv + _t(eps, dt))
    if folded:
        scale = w / root
        return x * scale[col] + (b - rm * scale)[col]
    return (x - rm[col]) / root[col] * w[col] + b[col]


def _new_rule_nodes(rng, dt, pr, pc):
    """One random operand (a depth-2 tree or a leaf) through each rule added for the networks' stages; yields
    (name, computed in T, exact, rigorous bound, first-order bound or None).  The first-order bound (``pc``, with
    the underflow term) is given where the operand is exact (a leaf)."""
    seen: list = []
    a = _tree(rng, dt, pr, 2, seen)
    b = _tree(rng, dt, pr, 2, seen)
    exact = not np.any(a.e)
    yield (seen, a, b)
    # a + b, the rounding charged on the sum
    yield ("sum on_sum", a.t + b.t, a.x + b.x, bounds.e_sum2(a.v, a.e, b.v, b.e, pr, on_sum=True),
           bounds.e_sum2(a.v, a.e, b.v, b.e, pc, on_sum=True) if exact and not np.any(b.e) else None)
    # mean of the first 3 columns
    xm = np.array([[mpmath.fsum(row[:3]) / 3] for row in a.x], dtype=object)
    yield ("mean", _mean_t(a.t, dt, 3), xm, bounds.e_mean(a.v[:, :3], a.e[:, :3], 1, pr)[:, None],
           bounds.e_mean(a.v[:, :3], a.e[:, :3], 1, pc)[:, None] if exact else None)
    for approximate in ("none", "tanh"):
        gx = np.vectorize(lambda v: _gelu_mp(v, approximate), otypes=[object])(a.x)
        yield (f"gelu {approximate}", _gelu_t(a.t, dt, approximate), gx,
               bounds.e_gelu(a.v, a.e, pr, approximate), bounds.e_gelu(a.v, a.e, pc, approximate) if exact else None)
    # a per-column scale g x: e_elementwise with the Lipschitz constants |g|
    g = _leaf(rng, dt)
    gy = g.x[0][None, :] * a.x
    yield ("scale", g.t[0][None, :] * a.t, gy,
           bounds.e_elementwise(_hp(gy), a.e, np.abs(g.v[0])[None, :], 1, pr),
           bounds.e_elementwise(_hp(gy), a.e, np.abs(g.v[0])[None, :], 1, pc) if exact else None)
    # eval BatchNorm over the 4 rows as channels, in both evaluation orders
    w, bias, rm = (_leaf(rng, dt).t[0] for _ in range(3))
    rv = (np.abs(rng.standard_normal(4)) * 2).astype(dt)
    eps = 2.0 ** -16
    x4, e4 = a.v[None, :, :, None], a.e[None, :, :, None]
    mp_rv = np.array([mpmath.sqrt(mpmath.mpf(float(v)) + mpmath.mpf(eps)) for v in rv], dtype=object)
    bx = np.empty(SHAPE, dtype=object)
    for i, j in np.ndindex(SHAPE):
        bx[i, j] = (a.x[i, j] - mpmath.mpf(float(rm[i]))) / mp_rv[i] * mpmath.mpf(float(w[i])) \
            + mpmath.mpf(float(bias[i]))
    f64 = [v.astype(np.float64) for v in (w, bias, rm, rv)]
    e_bn = bounds.e_batch_norm(x4, e4, *f64, eps, pr)[0, :, :, 0]
    e_bn1 = bounds.e_batch_norm(x4, e4, *f64, eps, pc)[0, :, :, 0] if exact else None
    for folded in (False, True):
        t = _batch_norm_t(a.t[None, :, :, None], w, bias, rm, rv, eps, dt, folded)[0, :, :, 0]
        yield (f"batch_norm folded={folded}", t, bx, e_bn, e_bn1)


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_network_stage_rules_are_safe_on_random_operands(dt):
    """The rules of the networks' stages (e_sum2 charged on the sum, e_mean, e_gelu in both forms, e_elementwise
    with per-column Lipschitz constants, e_batch_norm in the definition's and PyTorch's folded order) on random
    depth-2 expression trees and leaves: |fl_T(f(x')) - f(x)| <= E (rigorous model) at every element, and
    <= u_T E (first-order model with its underflow term) where the operand is exact.  Operands or results
    reaching T's largest finite number are excluded (the calculus does not model overflow); every rule must be
    checked on at least 15 operands and make a rounding error somewhere (the check is not vacuous)."""
    rng = np.random.default_rng(21 if dt == "float32" else 22)
    pr = bounds.Precision.of(dt)
    u = numerics.unit_roundoff(dt)
    pc = bounds.Precision.coefficients(dt, eta=numerics.underflow_eta(dt) / u)
    checked: dict = {}
    worst: dict = {}
    for _ in range(30):
        with np.errstate(all="ignore"), mpmath.workdps(DPS):
            gen = _new_rule_nodes(rng, dt, pr, pc)
            seen, a, b = next(gen)
            results = list(gen)
        if not all(_in_range(n, dt) for n in seen):
            continue
        for name, t, x, e, e1 in results:
            with np.errstate(all="ignore"):
                xv = _hp(x)
                if not np.all(np.abs(xv) + np.where(np.isfinite(e), e, 0) < float(np.finfo(dt).max)):
                    continue
            checked[name] = checked.get(name, 0) + 1
            with mpmath.workdps(DPS), np.errstate(invalid="ignore"):   # NaN only where an operand's bound is inf
                err = _hp(np.vectorize(lambda p, q: abs(mpmath.mpf(float(p)) - q), otypes=[object])(t, x))
            fin = np.isfinite(e)
            assert np.all(err[fin] <= e[fin]), (dt, name, err[fin] / e[fin])
            assert np.all(np.isfinite(t)[fin]), (dt, name)
            if e1 is not None:
                assert np.all(err <= u * e1), (dt, name, err / (u * e1))
            with np.errstate(all="ignore"):
                r = np.where(fin & (e > 0), err / np.where(fin & (e > 0), e, 1), 0.0)
            worst[name] = max(worst.get(name, 0.0), float(np.max(r)))
    assert set(checked) == set(worst) and len(checked) == 7, checked
    assert min(checked.values()) >= 15, checked
    assert min(worst.values()) > 0, worst


def test_mean_and_the_sum_charged_on_itself_are_tight():
    """The mean of x = (1, u, ..., u) (n = 64 entries, u = 2^-24) in float32, summed left to right: every 1 + u is
    a tie and rounds to 1, so the computed sum is 1 and the computed mean 1/64 (exact), while the exact mean is
    (1 + 63u) / 64: error 63u / 64.  e_mean's gamma_64 mean|x| + eta (63 additions and the division) is within
    64/63 (1 + 64u) / (1 - 64u) <= 1.02 of it.  1 + u (a tie, rounds to 1, error u) with e_sum2 charged on the
    sum: u (1 + u), within 1 + u; and with E_a = E_b = 0 never above the rule charged on |a| + |b|."""
    n = 64
    x = np.array([[1.0] + [U32] * (n - 1)])
    assert _seq(x[0]) == np.float32(1.0)
    e = bounds.e_mean(x, np.zeros_like(x), 1, PR32)
    assert _ratio(e[0], Fraction(n - 1, n) * Fraction(U32)) <= Fraction(102, 100)
    ratio = _ratio(bounds.e_sum2(1.0, 0.0, U32, 0.0, PR32, on_sum=True), Fraction(U32))
    assert ratio <= (1 + Fraction(U32)) * (1 + Fraction(1, 2 ** 50))
    a, b = np.array([3.0, -3.0, 1e-300]), np.array([-2.0, 1.0, 0.0])
    assert np.all(bounds.e_sum2(a, 0 * a, b, 0 * b, PR32, on_sum=True) <= bounds.e_sum2(a, 0 * a, b, 0 * b, PR32))


def test_pinned_first_order_gelu_batch_norm_and_mean():
    """First order, no underflow term.  GELU at x = (2, -1) with E_x = (0, 1): r = ELEMENTARY_FUNCTION_ULPS + 4 = 8
    (tanh form 11), E = r |x| + 1.13 E_x = (16, 9.13) (tanh: (22, 12.13)).  Eval BatchNorm of one channel,
    x = 3, E_x = 2, w = -2, b = 1, rm = 1, rv = 3, eps = 1: s = 2, S = (3 + 1) / 2 * 2 + 1 = 5, gain 1,
    E = 2 + 6 * 5 = 32.  The mean of (1, -3) with E = (2, 0): 1 + 2 * 2 = 5."""
    pc = bounds.Precision.coefficients()
    assert config.ELEMENTARY_FUNCTION_ULPS == 4 and config.GELU_LIPSCHITZ == 1.13
    x, ex = np.array([2.0, -1.0]), np.array([0.0, 1.0])
    g3 = numerics.gamma(3, 2.0 ** -53)      # a product and a sum in the rule, the decimal literal 9.13 / 12.13
    assert np.all(np.abs(bounds.e_gelu(x, ex, pc) - [16.0, 9.13]) <= g3 * np.array([16.0, 9.13]))
    assert np.all(np.abs(bounds.e_gelu(x, ex, pc, "tanh") - [22.0, 12.13]) <= g3 * np.array([22.0, 12.13]))
    one = np.ones((1, 1, 1, 1))
    e = bounds.e_batch_norm(3 * one, 2 * one, np.array([-2.0]), np.array([1.0]), np.array([1.0]), np.array([3.0]),
                            1.0, pc)
    assert e.shape == (1, 1, 1, 1) and e[0, 0, 0, 0] == 32.0
    assert bounds.e_mean(np.array([[1.0, -3.0]]), np.array([[2.0, 0.0]]), -1, pc)[0] == 5.0
    with pytest.raises(ValueError, match="argument 'approximate'"):
        bounds.gelu_roundings("erf")


def _norm_t(xt, dt):
    """||x|| per row of ``xt`` (T values) as torch's ``norm`` evaluates it: the squares and their sum, left to
    right, in the accumulation format, the square root there, the result rounded to T; one element: |x|."""
    acc, out = ACC[dt], []
    for row in xt:
        s = acc(0.0)
        for v in row:
            s = acc(s + acc(v) * acc(v))
        out.append(np.abs(row[0]) if row.size == 1 else np.sqrt(s).astype(dt))
    return np.array(out, dtype=dt)[:, None]


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_first_order_normalisation_is_safe_and_not_loose(dt):
    """e_normalize (first order, the underflow term eta_T / u_T): |fl_T(x'/D') - x/D| <= u_T E at every element for
    rows x of 1 - 8 entries (signed, near-integers, zeros, rows whose squares underflow in T, rows with one entry
    2^-140 (float32) / 2^-20 (float16) times the rest, whose quotient is subnormal), eps 0 or a power of two
    (representable in T: the clamp then compares the same number), both policies, the input exact in T or the
    float64 row rounded to T (E_x = |x' - x| / u_T; not where the row rounds to 0, whose error is the whole row,
    beyond the first-order model); T evaluates the norm as torch does (:func:`_norm_t`) and
    divides once; the reference in mpmath.  Not loose: over the 1600 rows of each kind of input the largest
    err / (u_T E) is above 1/2 (the bound counts the worst case d/2 + 2 roundings, which random rows approach)."""
    rng = np.random.default_rng(11)
    u = numerics.unit_roundoff(dt)
    pr = bounds.Precision.coefficients(dt, numerics.underflow_eta(dt) / u)
    tiny, small, apart = (2.0 ** -70, 2.0 ** -42, 2.0 ** -140) if dt == "float32" else (2.0 ** -12, 2.0 ** -11,
                                                                                          2.0 ** -20)
    for perturbed in (False, True):
        worst = 0.0
        for _ in range(400):
            d = int(rng.integers(1, 9))
            kind = rng.choice(["normal", "cancel", "tiny", "zeros", "small", "apart"])
            x = rng.standard_normal((4, d)) * 2
            if kind == "cancel":
                x = np.round(x) + rng.standard_normal((4, d)) * 2.0 ** -9
            elif kind == "tiny":
                x = x * tiny
            elif kind == "small":
                x = x * small
            elif kind == "zeros":
                x = np.where(rng.random(x.shape) < 0.5, 0.0, x)
            elif kind == "apart":
                x[:, 0] *= apart
            eps = float(rng.choice([0.0, 2.0 ** -40 if dt == "float32" else 2.0 ** -10]))
            policy = "clamp" if eps > 0 or rng.random() < 0.5 else "none"
            if not perturbed:
                x = _t(x, dt).astype(np.float64)
            xt = _t(x, dt)
            ex = np.abs(xt.astype(np.float64) - x) / u
            with np.errstate(all="ignore"):
                n = _norm_t(xt, dt)
                yt = xt / (np.maximum(n, _t(eps, dt)) if policy == "clamp" else n)
                e = bounds.e_normalize(x, ex, eps, policy, pr)
            with mpmath.workdps(DPS):
                for r in range(4):
                    nr = mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(v)) ** 2 for v in x[r]))
                    den = max(nr, mpmath.mpf(eps)) if policy == "clamp" else nr
                    if den == 0:        # 0/0: NaN in T and no value to bound (a zero row, policy none or eps 0)
                        assert np.all(np.isnan(yt[r]))
                        continue
                    if not np.any(xt[r]):   # the row rounds to 0 in T: an input error as large as the row, beyond
                        continue            # the first-order model (x' = 0 has no direction)
                    err = _hp(np.array([abs(mpmath.mpf(float(yt[r, j])) - mpmath.mpf(float(x[r, j])) / den)
                                        for j in range(d)], dtype=object))
                    assert np.all(err <= u * e[r]), (dt, kind, policy, eps, x[r], err / (u * e[r]))
                    worst = max(worst, float(np.max(err / (u * e[r]))))
        assert worst > 0.5, (dt, perturbed, worst)


def test_pinned_normalisation_and_its_errors():
    """x = (3, 4), first order, sums in T (sums(2) = 2): ||x|| = 5, y = (0.6, 0.8).  Exact input, eps 0: E = |y| (2/2
    + 2) = (1.8, 2.4).  E_x = (1, 0): ||E_x|| / D = 1/5, so E = (1/5 + 0.6 * 3.2, 0.8 * 3.2) = (2.12, 2.56).  With
    eta = 1 (in units of u): the squares' underflow d eta / (2 ||x||^2) = 1/25 joins the relative term and the
    quotient's eta is added: E = (0.6 * 3.04 + 1, 0.8 * 3.04 + 1) = (2.824, 3.432); with the clamp at eps = 10 > ||x||
    the squares' term drops: y = (0.3, 0.4), E = (0.3 * 3 + 1, 0.4 * 3 + 1) = (1.9, 2.2).  A caller's y replaces
    |x| / D.  The rigorous model and an unknown policy are refused by name."""
    pc, pe = bounds.Precision.coefficients(), bounds.Precision.coefficients(eta=1.0)
    x, z = np.array([[3.0, 4.0]]), np.zeros((1, 2))
    g = numerics.gamma(6, 2.0 ** -53)

    def near(a, want):
        return np.all(np.abs(a - want) <= g * np.array(want))
    assert near(bounds.e_normalize(x, z, 0.0, "clamp", pc), [[1.8, 2.4]])
    assert near(bounds.e_normalize(x, z, 0.0, "none", pc), [[1.8, 2.4]])
    assert near(bounds.e_normalize(x, np.array([[1.0, 0.0]]), 0.0, "clamp", pc), [[2.12, 2.56]])
    assert near(bounds.e_normalize(x, z, 0.0, "clamp", pe), [[2.824, 3.432]])
    assert near(bounds.e_normalize(x, z, 10.0, "clamp", pe), [[1.9, 2.2]])
    assert near(bounds.e_normalize(x, z, 0.0, "clamp", pc, y=np.array([[1.0, 1.0]])), [[3.0, 3.0]])
    with pytest.raises(ValueError, match="argument 'pr'"):
        bounds.e_normalize(x, z, 0.0, "clamp", bounds.Precision.of("float32"))
    with pytest.raises(ValueError, match="argument 'policy'"):
        bounds.e_normalize(x, z, 0.0, "add", pc)
