/*
 * A vectorisable float64 erf: branch-free, built only from IEEE +, -, *, /, fabs, copysign and 64-bit
 * integer operations on bit patterns (the range tests and selects), so that GCC -O3 vectorises a loop that
 * calls it (SSE2, AVX2 and AVX-512 alike; checked with -fopt-info-vec) without -ffast-math (and -ffp-contract=off keeps every operation separately rounded:
 * the same bits at every vector width, with or without an FMA unit).  The plain libm erf stays beside it in
 * ckernels/gelu.c (GELU_ERF_LIBM); refimpl/backends/_numba_elementwise.py performs the same operations in
 * the same order, so the C and Numba versions return the same bits.
 *
 *   double ri_erf(double x)
 *
 * All the pieces are computed for every x and the result is selected by integer comparisons of the bits of
 * |x| (no branch; see ERF_A_BITS):
 *
 * 1. |x| < ERF_A = 0.875:   erf(x) = x + x * P(x^2)    (P of degree 11, Horner; the exact leading term x
 *    carries most of the value, so the rounding errors of P are scaled by |P| / (1 + P) < 0.12).
 * 2. ERF_A <= |x| < 6:      erf(|x|) = 1 - exp(-x^2) * R((|x| - 2.5) / (|x| + 3))    (R of degree 12),
 *    evaluated at xt = min(|x|, 6) (so every lane computes finite values):
 *    - x^2 = hi + lo without FMA: Veltkamp's split xt = xh + xl (xh = c xt - (c xt - xt), c = 2^27 + 1;
 *      xh has at most 26 significant bits, xl = xt - xh at most 27, both exact), hi = xh * xh and
 *      2 xh xl exact, lo = (xh + xh) * xl + xl * xl rounded once: x^2 - (hi + lo) is below 2^-77 x^2;
 *    - exp(-hi - lo) by Cody-Waite: k = round(-hi / ln 2) (by adding and subtracting 1.5 * 2^52), r =
 *      ((-hi - k LN2_HI) - k LN2_LO) - lo with LN2_HI = ln 2 to 42 bits (k LN2_HI exact for |k| < 2^11,
 *      and -hi - k LN2_HI exact by Sterbenz's lemma), |r| <= ln2 / 2 + 2^-20; exp(r) = 1 + (r + r^2 E(r))
 *      (E of degree 9); 2^k is built from the bits of k + 1.5 * 2^52 (whose low bits hold k) as the
 *      exponent field k + 1023 (k in [-52, 0] for xt <= 6: no overflow, no subnormal), an exact scaling;
 *    - the product and 1 - erfc.
 * 3. |x| >= 6 (and +-Inf):  erf(x) = +-1 (erfc(x) < 2^-54 from x = 5.9216 on: erf rounds to 1 there).
 * The sign: erf(-x) = -erf(x) (piece 1 is odd as rounded, piece 2 gets the sign of x by copysign).
 * Special values: erf(+-0) = +-0 (piece 1), erf(+-Inf) = +-1, NaN -> NaN (the bits of |NaN| lie above
 * those of +Inf, so NaN takes piece 1, x + x * P = NaN), subnormal x: x + x * P(0) = x (1 + P0) to within
 * the subnormal spacing.
 *
 * Coefficients: derived by benchmarks/erf_coefficients.py (mpmath, 40 digits; Lawson's iteratively
 * reweighted least squares on 150 Chebyshev nodes, i.e. weighted minimax; the two leading coefficients of
 * each polynomial rounded to double first and the rest refitted).  Fitted errors with the rounded
 * coefficients, in exact arithmetic: P 0.10 (relative error of erf, units of 2^-53), E 0.038 (relative
 * error of exp(r)), R 0.036 (absolute error of erf, units of 2^-53; R is weighted by exp(-x^2), so it
 * approximates erfc(x) exp(x^2) well where erfc matters for erf and only loosely near x = 6).
 *
 * Accuracy (tests/test_kernels_gelu.py measures it against mpmath at 50 digits on a dense sweep of
 * [-6.5, 6.5], the piece boundaries, tiny and subnormal x and the saturation region, and on Hypothesis'
 * float64): about 1 ulp of erf(x) at most (0.89 ulp on the test's sweep; 1.10 ulp, at x = 0.93, on 220001
 * points of [0, 6.5] dense near the piece boundary, where glibc's erf reaches 0.95 and SciPy's 2.63), inside
 * the config.ELEMENTARY_FUNCTION_ULPS = 4 that refimpl.layers.gelu_bound charges for erf.
 * The error budget: piece 1, 0.1 (fit) + the Horner roundings scaled by 0.12 + 0.5 (the final sum); piece 2
 * near x = 0.875 (erfc = 0.22): a few roundings relative to erfc, times 0.22, + 0.5 (the final difference).
 * It is an erf, not an erfc: 1 - erf(x) for large x carries the absolute error of erf, as libm's does.
 */
#ifndef REFIMPL_ERF_VEC_H
#define REFIMPL_ERF_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define ERF_A 0.875         /* piece 1 below, piece 2 from here on */
#define ERF_XMAX 6.0        /* piece 3 from here on; piece 2 is evaluated at min(|x|, ERF_XMAX) */
#define ERF_X0 2.5          /* the variable of R: u = (|x| - ERF_X0) / (|x| + ERF_SHIFT) */
#define ERF_SHIFT 3.0
#define ERF_VELTKAMP 134217729.0      /* 2^27 + 1 */
#define ERF_ROUNDER 0x1.8p52          /* 1.5 * 2^52: y + ERF_ROUNDER - ERF_ROUNDER = y rounded to an integer */
/* The bit patterns of ERF_A, ERF_XMAX and +Inf: the pieces are selected by integer comparisons (ri_below) of
 * the bits of |x| (the same order as the values for non-negative doubles, NaN above +Inf) and bit masks
 * (ri_select).  Not by ?: on a floating-point comparison: GCC sinks the work of a ?: operand into a branch
 * and, under the default -ftrapping-math, does not if-convert it back, so the loop would not vectorise. */
#define ERF_A_BITS UINT64_C(0x3fec000000000000)
#define ERF_XMAX_BITS UINT64_C(0x4018000000000000)
#define ERF_INF_BITS UINT64_C(0x7ff0000000000000)

/* Generated by benchmarks/erf_coefficients.py (hex: exact; decimal: for reading). */
/* ERF_P: degree 11, fitted max error 0.102 (relative error of erf on |x| < A, units of 2^-53) */
#define ERF_P0 0x1.06eba8214db69p-3  /* 0.12837916709551259 */
#define ERF_P1 -0x1.812746b037a2ap-2  /* -0.37612638903184126 */
#define ERF_P2 0x1.ce2f21a0460fbp-4  /* 0.1128379167097399 */
#define ERF_P3 -0x1.b82ce3138f5d0p-6  /* -0.026866170648863819 */
#define ERF_P4 0x1.565bcd3819249p-8  /* 0.0052239776633525382 */
#define ERF_P5 -0x1.c02dbbb5ab953p-11  /* -0.00085483292669667266 */
#define ERF_P6 0x1.f9a409a0f72d1p-14  /* 0.00012055415437779304 */
#define ERF_P7 -0x1.f4e2f18b5c4c3p-17  /* -1.4927580898246151e-5 */
#define ERF_P8 0x1.baaafe91ca53dp-20  /* 1.6490666081093378e-6 */
#define ERF_P9 -0x1.64ddf188b03d8p-23  /* -1.6617913114159827e-7 */
#define ERF_P10 0x1.11725665fe451p-26  /* 1.5916688765581367e-8 */
#define ERF_P11 -0x1.62861b4273989p-30  /* -1.2897502654527689e-9 */
/* EXP_E: degree 9, fitted max error 0.0378 (error relative to exp(r), units of 2^-53) */
#define EXP_E0 0x1.000000000000bp-1  /* 0.50000000000000122 */
#define EXP_E1 0x1.55555555554fcp-3  /* 0.16666666666666419 */
#define EXP_E2 0x1.55555555500b0p-5  /* 0.041666666666516303 */
#define EXP_E3 0x1.11111111271fbp-7  /* 0.0083333333334900586 */
#define EXP_E4 0x1.6c16c185dab94p-10  /* 0.0013888888947472853 */
#define EXP_E5 0x1.a01a012eff564p-13  /* 0.00019841269519808436 */
#define EXP_E6 0x1.a019956f3d42ap-16  /* 2.4801488902565787e-5 */
#define EXP_E7 0x1.71df16e9fe150p-19  /* 2.755756999480722e-6 */
#define EXP_E8 0x1.28b1c37e4f129p-22  /* 2.763181824632575e-7 */
#define EXP_E9 0x1.ad9d8b6375a5ep-26  /* 2.500690800079212e-8 */
/* ERF_R: degree 12, fitted max error 0.0363 (absolute error of erf on [A, 6], units of 2^-53) */
#define ERF_R0 0x1.afbb3f3b73432p-3  /* 0.21080636406114334 */
#define ERF_R1 -0x1.a2b968ea24b74p-2  /* -0.40891040734384565 */
#define ERF_R2 0x1.61c150e594f5fp-2  /* 0.34546400452858525 */
#define ERF_R3 -0x1.d9f423990d239p-3  /* -0.23142268954110694 */
#define ERF_R4 0x1.e302959370dd8p-4  /* 0.11792238643743447 */
#define ERF_R5 -0x1.5055a154163bbp-5  /* -0.041056456656128637 */
#define ERF_R6 0x1.965a3baebfa3bp-8  /* 0.0062004466733456788 */
#define ERF_R7 0x1.15058c21273e8p-9  /* 0.0021135076099896185 */
#define ERF_R8 -0x1.40054adba2000p-10  /* -0.0012207819881115966 */
#define ERF_R9 -0x1.20116940a0c80p-15  /* -3.4340383085606533e-5 */
#define ERF_R10 0x1.7f5ba15e8c4c4p-13  /* 0.00018279930641676965 */
#define ERF_R11 0x1.0444441bcb7dap-17  /* 7.7565510348785075e-6 */
#define ERF_R12 -0x1.09f6a841edf0ap-16  /* -1.5852660233155734e-5 */
#define LN2_HI 0x1.62e42fefa3800p-1
#define LN2_LO 0x1.ef35793c76730p-45
#define INV_LN2 0x1.71547652b82fep+0

/* mask ? a : b, by bit operations (mask all ones or all zeros): a select the compiler keeps branch-free. */
static inline double ri_select(int64_t mask, double a, double b)
{
    int64_t ab, bb;
    memcpy(&ab, &a, sizeof ab);
    memcpy(&bb, &b, sizeof bb);
    const int64_t rb = (ab & mask) | (bb & ~mask);
    double r;
    memcpy(&r, &rb, sizeof r);
    return r;
}

/* All ones if a < b, else 0, for a, b < 2^63: the sign bit of a - b (no comparison instruction: SSE2 has no
 * 64-bit integer comparison, and GCC does not vectorise a floating-point comparison turned into an int64
 * mask at that level). */
static inline int64_t ri_below(uint64_t a, uint64_t b)
{
    return -(int64_t)((a - b) >> 63);
}

/* erf(x) for any double x; see the comment above.  Branch-free. */
static inline double ri_erf(double x)
{
    const double ax = fabs(x);
    uint64_t abits;                                         /* the bits of |x|: ordered as |x|, NaN above Inf */
    memcpy(&abits, &ax, sizeof abits);
    const int64_t in_tail = ~ri_below(abits, ERF_A_BITS) & ri_below(abits, ERF_INF_BITS + 1u);  /* A <= |x| <= Inf */
    const int64_t below_max = ri_below(abits, ERF_XMAX_BITS);                                /* |x| < 6 */
    /* piece 1 */
    const double s = x * x;
    double p = ERF_P11;
    p = p * s + ERF_P10;
    p = p * s + ERF_P9;
    p = p * s + ERF_P8;
    p = p * s + ERF_P7;
    p = p * s + ERF_P6;
    p = p * s + ERF_P5;
    p = p * s + ERF_P4;
    p = p * s + ERF_P3;
    p = p * s + ERF_P2;
    p = p * s + ERF_P1;
    p = p * s + ERF_P0;
    const double small = x + x * p;
    /* piece 2, at xt = min(|x|, 6) (NaN -> 6) */
    const double xt = ri_select(below_max, ax, ERF_XMAX);
    const double cx = ERF_VELTKAMP * xt;
    const double xh = cx - (cx - xt);
    const double xl = xt - xh;
    const double hi = xh * xh;
    const double lo = (xh + xh) * xl + xl * xl;
    const double kr = -hi * INV_LN2 + ERF_ROUNDER;     /* 1.5 * 2^52 + k */
    const double k = kr - ERF_ROUNDER;
    const double r = ((-hi - k * LN2_HI) - k * LN2_LO) - lo;
    double e = EXP_E9;
    e = e * r + EXP_E8;
    e = e * r + EXP_E7;
    e = e * r + EXP_E6;
    e = e * r + EXP_E5;
    e = e * r + EXP_E4;
    e = e * r + EXP_E3;
    e = e * r + EXP_E2;
    e = e * r + EXP_E1;
    e = e * r + EXP_E0;
    const double er = 1.0 + (r + (r * r) * e);
    uint64_t kbits;
    memcpy(&kbits, &kr, sizeof kbits);
    const uint64_t sbits = ((kbits + 1023u) & 0x7ffu) << 52;   /* the exponent field of 2^k */
    double scale;
    memcpy(&scale, &sbits, sizeof scale);
    const double d = (xt - ERF_X0) / (xt + ERF_SHIFT);
    double q = ERF_R12;
    q = q * d + ERF_R11;
    q = q * d + ERF_R10;
    q = q * d + ERF_R9;
    q = q * d + ERF_R8;
    q = q * d + ERF_R7;
    q = q * d + ERF_R6;
    q = q * d + ERF_R5;
    q = q * d + ERF_R4;
    q = q * d + ERF_R3;
    q = q * d + ERF_R2;
    q = q * d + ERF_R1;
    q = q * d + ERF_R0;
    const double tail = 1.0 - (er * q) * scale;
    /* select: NaN (abits > ERF_INF_BITS) takes piece 1, x + x * p = NaN */
    const double big = ri_select(below_max, tail, 1.0);
    return ri_select(in_tail, copysign(big, x), small);
}

#endif /* REFIMPL_ERF_VEC_H */
