"""Derivation of the polynomial coefficients of the vectorisable float64 erf (ckernels/erf_vec.h and its
Numba twin refimpl/backends/_numba_elementwise.py) with mpmath (not a test; a minute or two).

    PYTHONPATH=. python benchmarks/erf_coefficients.py [--dps 40] [--iters 30]

The erf is built from three pieces, each a polynomial fitted here in the minimax sense (Lawson's iteratively
reweighted least squares on Chebyshev nodes, in mpmath at ``--dps`` digits, then rounded to the nearest
double, the two leading coefficients first with the others refitted after each; the printed error is that
of the rounded coefficients, in exact arithmetic, on a denser grid):

1. small |x| < A = 0.875:  erf(x) = x + x P(x^2),   P(s) ~ erf(sqrt s) / sqrt s - 1  on [0, A^2], degree 11,
   weighted by x / erf(x) (the error of x P relative to erf(x));
2. exp(r) = 1 + (r + r^2 E(r)),  E(r) ~ (exp(r) - 1 - r) / r^2  on |r| <= 0.35 (Cody-Waite reduced
   argument, |r| <= ln2/2 plus the low part of x^2), degree 9, weighted by r^2 / exp(r) (the error relative
   to exp(r));
3. the tail A <= x <= 6:  erfc(x) = exp(-x^2) R(u),  u = (x - 2.5) / (x + 3),  R ~ erfc(x) exp(x^2), degree 12,
   weighted by exp(-x^2), so the fitted error is the absolute error of erf = 1 - erfc (the quantity whose
   ulp, 2^-53 for erf in [0.5, 1), is the accuracy budget; for x > 5.9216 erf rounds to 1).  The variable
   1/(x + 3) (up to an affine map) was the best of 1/x, x and 1/(x + c), c in {0.5, 1, 2, 3, 4, 6}, at this
   degree; it is formed as (x - 2.5) / (x + 3), whose rounding error near x = A (where erfc matters most)
   is about a third of that of 1/(x + 3) - const.

Also printed: the Cody-Waite constants (ln 2 split into LN2_HI, 42 significant bits so that k LN2_HI is
exact for |k| < 2^11, and LN2_LO = the double nearest ln 2 - LN2_HI) and 1 / ln 2.

The output is the C block of ckernels/erf_vec.h and the Python tuples of refimpl/backends/
_numba_elementwise.py (hex float literals, exact); tests/test_kernels_gelu.py checks that the two copies
hold the same numbers and measures the accuracy of the compiled erf against mpmath.
"""

from __future__ import annotations

import argparse

import mpmath as mp

A = 0.875          # small / tail boundary
XMAX = 6.0         # tail clamp: for |x| >= 6 erf(x) = +-1 (erfc(x) < 2^-54 from x = 5.9216 on)
SHIFT = 3.0        # tail variable u = (x - X0) / (x + SHIFT)
X0 = 2.5
DEG_SMALL, DEG_EXP, DEG_TAIL = 11, 9, 12


def cheb_nodes(a, b, n):
    return [(a + b) / 2 + (b - a) / 2 * mp.cos(mp.pi * (i + mp.mpf(0.5)) / n) for i in range(n)]


def lawson(f, w, t, nodes, deg, iters, fixed=()):
    """Coefficients c_0..c_deg of sum c_j t(x)^j minimising max_i w(x_i) |sum c_j t(x_i)^j - f(x_i)|
    (Lawson's algorithm: weighted least squares, the weights multiplied by the errors each round).  The
    leading coefficients ``fixed`` are given (already rounded to double); the others are fitted."""
    T = [t(x) for x in nodes]
    nf = len(fixed)
    F = [f(x) - sum(c * T[i] ** j for j, c in enumerate(fixed)) for i, x in enumerate(nodes)]
    W = [w(x) for x in nodes]
    lw = [mp.mpf(1) / len(nodes)] * len(nodes)
    m = deg + 1 - nf
    c = None
    for _ in range(iters):
        A_ = mp.matrix(m, m)
        B_ = mp.matrix(m, 1)
        for i in range(len(nodes)):
            s = lw[i] * W[i] ** 2
            p = [T[i] ** (j + nf) for j in range(m)]
            for j in range(m):
                B_[j] += s * p[j] * F[i]
                for k in range(j, m):
                    A_[j, k] += s * p[j] * p[k]
        for j in range(m):
            for k in range(j):
                A_[j, k] = A_[k, j]
        c = mp.lu_solve(A_, B_)
        e = [abs(W[i] * (sum(c[j] * T[i] ** (j + nf) for j in range(m)) - F[i])) for i in range(len(nodes))]
        tot = sum(lw[i] * e[i] for i in range(len(nodes)))
        lw = [lw[i] * e[i] / tot for i in range(len(nodes))]
    return list(fixed) + [c[j] for j in range(m)]


def fit(f, w, t, nodes, deg, iters, nround=2):
    """lawson(), then the first ``nround`` coefficients rounded to double one at a time, the rest refitted
    after each (the rounding of the large leading coefficients is otherwise the main error)."""
    fixed: list = []
    c = lawson(f, w, t, nodes, deg, iters)
    for k in range(nround):
        fixed.append(mp.mpf(float(c[k])))
        c = lawson(f, w, t, nodes, deg, iters, tuple(fixed))
    return c


def rounded_error(f, w, t, coefs, a, b, n=2000):
    """max w |poly - f| with the coefficients rounded to double, on n equispaced points of [a, b]."""
    cd = [mp.mpf(float(c)) for c in reversed(coefs)]
    worst = mp.mpf(0)
    for i in range(n + 1):
        x = a + (b - a) * mp.mpf(i) / n
        worst = max(worst, abs(w(x) * (mp.polyval(cd, t(x)) - f(x))))
    return worst


def derive(iters: int) -> dict:
    out = {}
    ulp1 = mp.mpf(2) ** -53
    # 1. small range: P(s), s = x^2
    a2 = mp.mpf(A) ** 2

    def p_target(s):
        return mp.erf(mp.sqrt(s)) / mp.sqrt(s) - 1 if s > 0 else 2 / mp.sqrt(mp.pi) - 1

    def p_weight(s):
        return mp.sqrt(s) / mp.erf(mp.sqrt(s)) if s > 0 else mp.sqrt(mp.pi) / 2

    cs = fit(p_target, p_weight, lambda s: s, cheb_nodes(mp.mpf(0), a2, 150), DEG_SMALL, iters)
    out["ERF_P"] = (cs, rounded_error(p_target, p_weight, lambda s: s, cs, mp.mpf(0), a2) / ulp1,
                    "relative error of erf on |x| < A, units of 2^-53")
    # 2. exp(r) = 1 + r + r^2 E(r)
    rr = mp.mpf("0.35")

    def e_target(r):
        return (mp.exp(r) - 1 - r) / r ** 2 if r != 0 else mp.mpf(0.5)

    def e_weight(r):
        return r ** 2 / mp.exp(r)

    ce = fit(e_target, e_weight, lambda r: r, cheb_nodes(-rr, rr, 150), DEG_EXP, iters)
    out["EXP_E"] = (ce, rounded_error(e_target, e_weight, lambda r: r, ce, -rr, rr) / ulp1,
                    "error relative to exp(r), units of 2^-53")
    # 3. tail: R(u), u = (x - X0) / (x + SHIFT)

    def d_of(x):
        return (x - X0) / (x + SHIFT)

    def r_target(x):
        return mp.erfc(x) * mp.exp(x * x)

    def r_weight(x):
        return mp.exp(-x * x)

    cr = fit(r_target, r_weight, d_of, cheb_nodes(mp.mpf(A), mp.mpf(XMAX), 150), DEG_TAIL, iters)
    out["ERF_R"] = (cr, rounded_error(r_target, r_weight, d_of, cr, mp.mpf(A), mp.mpf(XMAX)) / ulp1,
                    "absolute error of erf on [A, 6], units of 2^-53")
    # Cody-Waite constants
    ln2 = mp.log(2)
    ln2_hi = mp.floor(ln2 * 2 ** 42) / 2 ** 42          # 42 significant bits (ln2 < 1: bit 2^-1 is the first)
    out["LN2_HI"] = ln2_hi
    out["LN2_LO"] = mp.mpf(float(ln2 - ln2_hi))
    out["INV_LN2"] = mp.mpf(float(1 / ln2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dps", type=int, default=40)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    mp.mp.dps = args.dps
    res = derive(args.iters)
    print("/* C (ckernels/erf_vec.h) */")
    for name in ("ERF_P", "EXP_E", "ERF_R"):
        coefs, err, what = res[name]
        print(f"/* {name}: degree {len(coefs) - 1}, fitted max error {mp.nstr(err, 3)} ({what}) */")
        for j, c in enumerate(coefs):
            print(f"#define {name}{j} {float(c).hex()}  /* {mp.nstr(c, 17)} */")
    for name in ("LN2_HI", "LN2_LO", "INV_LN2"):
        print(f"#define {name} {float(res[name]).hex()}")
    print("\n# Python (refimpl/backends/_numba_elementwise.py)")
    for name in ("ERF_P", "EXP_E", "ERF_R"):
        print(f"_{name} = ({', '.join(repr(float(c).hex()) for c in res[name][0])})")
    for name in ("LN2_HI", "LN2_LO", "INV_LN2"):
        print(f"_{name} = {float(res[name]).hex()!r}")


if __name__ == "__main__":
    main()
