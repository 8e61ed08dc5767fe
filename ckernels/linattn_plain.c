/*
 * Kernelized linear attention, the plain version: straight scalar loops in the order of the equations, one
 * thread, no blocking, no vector types, libm for exp, pow and sqrt.  It is the specification of the fast
 * kernel refimpl_linear_attention_f64/_f32 (ckernels/linattn.c, linattn_body.h, linattn_entry.h): the same
 * entry point's mathematics, written to be read.  Not registered as a backend; tests/test_kernels_plain.py
 * checks it against the NumPy definition (refimpl.attention.linear._linear_attention_numpy) within the error
 * model, and the fast kernel against it.
 *
 *   int refimpl_linear_attention_plain_f64(out, workspace, q, k, v, key_weight, v_scale, options, BH, N, M,
 *                                          d, e, workspace_len)   (and _f32)
 *
 *   out (BH, N, e); q (BH, N, d), k (BH, M, d), v (BH, M, e); key_weight (BH, M) or NULL; v_scale (BH) or
 *   NULL; options as for refimpl_linear_attention (struct refimpl_la_options, refimpl_kernels.h);
 *   workspace_len >= refimpl_linear_attention_plain_workspace(d, e).  Returns REFIMPL_OK, or a nonzero
 *   status (and writes nothing to out) for refused arguments.
 *
 * Per head (L2ViT Eq. 2-4 with Appendix 8's clamp; FLatten Eq. 1-6; Katharopoulos et al. 2020 Eq. 2-7;
 * RALA Eq. 2-3 with key weights alpha_j; L2ViT's per-head gain as v_scale):
 *
 *   phi(x)   = max(x, 0) | ELU(x) + 1 = x + 1 (x > 0), exp(x) (x <= 0) | f_p(ReLU(x)) per row (FLatten Eq. 6)
 *   v_eff_j  = V_j / s_v or V_j * s_v                                   (v_scale given; else V_j)
 *   KV       = s sum_j (w_j phi(K_j))^T v_eff_j,   ksum = s sum_j w_j phi(K_j)   (sums over j = 0, 1, ...)
 *   num_i    = phi(Q_i) KV,   den_i = phi(Q_i) . ksum                  (sums over the feature index)
 *   den_eff  = max(den, clamp_min) (clamp), then den + eps (policy 0, eps != 0) or max(den, eps) (policy 1)
 *   O_i      = num_i / den_eff_i
 *
 * Every sum starts at +0 and adds its terms in increasing index order, each product and sum rounded once
 * (the build's -ffp-contract=off: no FMA).  The fast kernel performs exactly these operations in this order
 * for the ReLU map whenever the keys form one chunk (refimpl_linear_attention_chunks(M) == 1, M < 128); it
 * differs elsewhere only in the summation order of the key chunks and of the focused map's norms (8 lanes),
 * in its own exp for ELU + 1 and in r^p by repeated products: all inside linear_attention_bound.
 *
 *   int refimpl_linear_angular_plain_f64(out, workspace, q, k, v, unit_eps, constant_own, similarity_sum, BH, N,
 *                                        M, d, e, workspace_len)   (and _f32)
 *
 *   Castling-ViT's linear-angular attention, the specification of refimpl_linear_angular_f64/_f32
 *   (workspace_len >= refimpl_linear_angular_plain_workspace(d, e); M = N for constant_own).  Per head
 *   (Castling-ViT Eq. 8-9, the order-0 truncation of the angular kernel; numerics.l2_normalize's unit rows):
 *
 *   x^       = x / max(||x||, eps),  ||x|| = m sqrt(sum_i (x_i / m)^2),  m = max_i |x_i|  (1 for m = 0; inf for m = inf)
 *   KV       = sum_j K^_j^T V_j,  ksum = sum_j K^_j,  vsum = sum_j V_j
 *   H_i      = 1/2 C_i + (1/pi) Q^_i KV,   C_i = V_i (constant_own) or vsum
 *   O_i      = H_i, or H_i / (M/2 + (1/pi) Q^_i . ksum) (similarity_sum)
 *
 *   1/pi is the double nearest it, rounded to the type.  The fast kernel sums the squares of a unit row in 8
 *   lanes, so it performs these operations in this order for d < 8 with one key chunk (M < 128).
 *
 *   int refimpl_elu1_feature_map_plain_f64(out, x, n)                   (and _f32)
 *   int refimpl_focused_feature_map_plain_f64(out, x, rows, d, power)   (and _f32)
 *
 *   The feature maps alone, the specification of refimpl_elu1_feature_map / refimpl_focused_feature_map (the
 *   fast kernel's staging code, exposed): phi above applied by the plain kernel's own lp_phi / lp_focused_row,
 *   out (n) or (rows, d) from x of the same shape, not overlapping.  The fast ELU + 1 differs only in its own
 *   exp for x <= 0 (x + 1 is one rounding in both); the fast focused map only in its 8-lane sums of the row
 *   norms (d >= 8) and in r^p by p - 1 products for an integer 2 <= p <= 6 (pow here): for d < 8 with p = 1
 *   or p not such an integer it performs exactly these operations in this order.
 *
 * The file includes itself once per floating type (PLAIN_REAL defined): the body is written once.
 */
#ifndef PLAIN_REAL

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* KV (d x e), ksum (d), one feature row phi(x) (d). */
int64_t refimpl_linear_attention_plain_workspace(int64_t d, int64_t e)
{
    if (d < 1 || e < 1 || d > (PTRDIFF_MAX / 8) / (e + 2))
        return -1;
    return d * e + 2 * d;
}

/* KV (d x e), ksum (d), vsum (e), one unit row (d). */
int64_t refimpl_linear_angular_plain_workspace(int64_t d, int64_t e)
{
    if (d < 1 || e < 1 || d > (PTRDIFF_MAX / 8) / (e + 3))
        return -1;
    return d * e + 2 * d + e;
}

/* 1 / pi rounded to double (Python's 1.0 / math.pi). */
#define PLAIN_INV_PI 0x1.45f306dc9c883p-2

#define PLAIN_REAL double
#define PLAIN_FN(name) name##_f64
#define PLAIN_EXP exp
#define PLAIN_SQRT sqrt
#include "linattn_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP
#undef PLAIN_SQRT

#define PLAIN_REAL float
#define PLAIN_FN(name) name##_f32
#define PLAIN_EXP expf
#define PLAIN_SQRT sqrtf
#include "linattn_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP
#undef PLAIN_SQRT

#else /* the body, once per type */

/* FLatten Eq. 6, one row, in the max-scaled form of refimpl.feature_maps.focused_function(power_scaling="max")
 * applied to a = ReLU(x):  m = max a,  r = a / m,  ||a|| = m sqrt(sum r^2),  t = r^p,  f = ||a|| (t / ||t||);
 * f = 0 when m = 0; a NaN in the row makes m NaN and so the whole row NaN. */
static void PLAIN_FN(lp_focused_row)(PLAIN_REAL *f, const PLAIN_REAL *x, int64_t d, double power)
{
    PLAIN_REAL m = 0;
    int nan = 0;
    for (int64_t i = 0; i < d; ++i) {
        f[i] = (x[i] > 0 || isnan(x[i])) ? x[i] : (PLAIN_REAL)0;     /* a = ReLU(x) */
        if (isnan(f[i]))
            nan = 1;
        else if (f[i] > m)
            m = f[i];
    }
    if (nan)
        m = (PLAIN_REAL)NAN;
    if (m == 0) {
        for (int64_t i = 0; i < d; ++i)
            f[i] = 0;
        return;
    }
    const PLAIN_REAL s = m > 0 ? m : (PLAIN_REAL)1;
    PLAIN_REAL ssq = 0;
    for (int64_t i = 0; i < d; ++i) {
        f[i] = f[i] / s;                                             /* r = a / m */
        ssq = ssq + f[i] * f[i];
    }
    const PLAIN_REAL norm_a = m * PLAIN_SQRT(ssq);                   /* ||a|| */
    PLAIN_REAL sst = 0;
    for (int64_t i = 0; i < d; ++i) {
        f[i] = (PLAIN_REAL)pow((double)f[i], power);                /* t = r^p */
        sst = sst + f[i] * f[i];
    }
    const PLAIN_REAL norm_t = PLAIN_SQRT(sst);                       /* ||t|| */
    for (int64_t i = 0; i < d; ++i)
        f[i] = norm_a * (f[i] / norm_t);                             /* f = ||a|| (t / ||t||) */
}

/* f = phi(x) for one token's d features. */
static void PLAIN_FN(lp_phi)(PLAIN_REAL *f, const PLAIN_REAL *x, int64_t d, int map, double power)
{
    if (map == REFIMPL_LA_MAP_FOCUSED) {
        PLAIN_FN(lp_focused_row)(f, x, d, power);
        return;
    }
    for (int64_t i = 0; i < d; ++i) {
        if (map == REFIMPL_LA_MAP_RELU)
            f[i] = (x[i] > 0 || isnan(x[i])) ? x[i] : (PLAIN_REAL)0;          /* max(x, 0), NaN kept */
        else
            f[i] = x[i] > 0 ? x[i] + (PLAIN_REAL)1 : PLAIN_EXP(x[i]);         /* ELU(x) + 1 */
    }
}

int PLAIN_FN(refimpl_linear_attention_plain)(PLAIN_REAL *out, PLAIN_REAL *workspace, const PLAIN_REAL *q,
                                             const PLAIN_REAL *k, const PLAIN_REAL *v,
                                             const PLAIN_REAL *key_weight, const PLAIN_REAL *v_scale,
                                             const struct refimpl_la_options *options, int64_t BH, int64_t N,
                                             int64_t M, int64_t d, int64_t e, int64_t workspace_len)
{
    if (!out || !workspace || !q || !k || !v || !options)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || N < 1 || M < 1 || d < 1 || e < 1)
        return REFIMPL_ERR_SIZE;
    const struct refimpl_la_options o = *options;
    if ((o.feature_map != REFIMPL_LA_MAP_RELU && o.feature_map != REFIMPL_LA_MAP_ELU1 &&
         o.feature_map != REFIMPL_LA_MAP_FOCUSED) || (o.eps_policy != 0 && o.eps_policy != 1) ||
        (o.feature_map == REFIMPL_LA_MAP_FOCUSED && !(o.power >= 1.0 && isfinite(o.power))))
        return REFIMPL_ERR_OPTION;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(PLAIN_REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * N > lim / e || BH * M > lim / d ||
        BH * M > lim / e)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t need = refimpl_linear_attention_plain_workspace(d, e);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    PLAIN_REAL *KV = workspace, *ksum = workspace + d * e, *f = workspace + d * e + d;
    const PLAIN_REAL s = (PLAIN_REAL)o.kv_scale, clamp_min = (PLAIN_REAL)o.clamp_min, eps = (PLAIN_REAL)o.eps;
    for (int64_t bh = 0; bh < BH; ++bh) {
        const PLAIN_REAL *qh = q + bh * N * d, *kh = k + bh * M * d, *vh = v + bh * M * e;
        PLAIN_REAL *oh = out + bh * N * e;
        /* KV = s sum_j (w_j phi(K_j))^T v_eff_j,  ksum = s sum_j w_j phi(K_j)   (L2ViT Eq. 3, RALA Eq. 3) */
        for (int64_t x = 0; x < d * e; ++x)
            KV[x] = 0;
        for (int64_t i = 0; i < d; ++i)
            ksum[i] = 0;
        for (int64_t j = 0; j < M; ++j) {
            PLAIN_FN(lp_phi)(f, kh + j * d, d, o.feature_map, o.power);
            if (key_weight)
                for (int64_t i = 0; i < d; ++i)
                    f[i] = key_weight[bh * M + j] * f[i];
            for (int64_t i = 0; i < d; ++i) {
                ksum[i] = ksum[i] + f[i];
                for (int64_t c = 0; c < e; ++c) {
                    PLAIN_REAL vjc = vh[j * e + c];
                    if (v_scale)
                        vjc = o.v_scale_divide ? vjc / v_scale[bh] : vjc * v_scale[bh];
                    KV[i * e + c] = KV[i * e + c] + f[i] * vjc;
                }
            }
        }
        if (s != 1) {
            for (int64_t x = 0; x < d * e; ++x)
                KV[x] = s * KV[x];
            for (int64_t i = 0; i < d; ++i)
                ksum[i] = s * ksum[i];
        }
        /* O_i = phi(Q_i) KV / den_eff(phi(Q_i) . ksum)   (L2ViT Eq. 4 and Appendix 8) */
        for (int64_t n = 0; n < N; ++n) {
            PLAIN_FN(lp_phi)(f, qh + n * d, d, o.feature_map, o.power);
            PLAIN_REAL den = 0;
            for (int64_t i = 0; i < d; ++i)
                den = den + f[i] * ksum[i];
            if (o.clamp && den < clamp_min)                 /* max(den, clamp_min); NaN stays NaN */
                den = clamp_min;
            if (o.eps_policy == 1) {
                if (den < eps)                              /* max(den, eps) */
                    den = eps;
            } else if (eps != 0) {
                den = den + eps;
            }
            for (int64_t c = 0; c < e; ++c) {
                PLAIN_REAL num = 0;
                for (int64_t i = 0; i < d; ++i)
                    num = num + f[i] * KV[i * e + c];
                oh[n * e + c] = num / den;
            }
        }
    }
    return REFIMPL_OK;
}

/* out[i] = phi(x[i]) = ELU(x[i]) + 1 for i < n (Katharopoulos et al. 2020 Eq. 7; RALA's kappa, Sec. 3.2): the
 * plain linear attention's own map (lp_phi), the specification of refimpl_elu1_feature_map. */
int PLAIN_FN(refimpl_elu1_feature_map_plain)(PLAIN_REAL *out, const PLAIN_REAL *x, int64_t n)
{
    if (!out || !x)
        return REFIMPL_ERR_NULL;
    if (n < 1)
        return REFIMPL_ERR_SIZE;
    PLAIN_FN(lp_phi)(out, x, n, REFIMPL_LA_MAP_ELU1, 0.0);
    return REFIMPL_OK;
}

/* out[r, :] = phi_p(x[r, :]) = f_p(ReLU(x[r, :])) for r < rows (FLatten Eq. 5-6, the max-scaled form of
 * Appendix Eq. 20-21): the plain linear attention's own map (lp_focused_row), the specification of
 * refimpl_focused_feature_map.  power: finite, >= 1 (else REFIMPL_ERR_OPTION). */
int PLAIN_FN(refimpl_focused_feature_map_plain)(PLAIN_REAL *out, const PLAIN_REAL *x, int64_t rows, int64_t d,
                                                double power)
{
    if (!out || !x)
        return REFIMPL_ERR_NULL;
    if (rows < 1 || d < 1)
        return REFIMPL_ERR_SIZE;
    if (rows > (PTRDIFF_MAX / (int64_t)sizeof(PLAIN_REAL)) / d)
        return REFIMPL_ERR_OVERFLOW;
    if (!(power >= 1.0 && isfinite(power)))
        return REFIMPL_ERR_OPTION;
    for (int64_t r = 0; r < rows; ++r)
        PLAIN_FN(lp_focused_row)(out + r * d, x + r * d, d, power);
    return REFIMPL_OK;
}

/* y = x / max(||x||, eps) for one row of d (numerics.l2_normalize(x, eps, policy="clamp"), the scaled norm);
 * a NaN in the row makes m, and so the row, NaN. */
static void PLAIN_FN(lp_unit_row)(PLAIN_REAL *y, const PLAIN_REAL *x, int64_t d, PLAIN_REAL eps)
{
    PLAIN_REAL m = 0;
    int nan = 0;
    for (int64_t i = 0; i < d; ++i) {
        const PLAIN_REAL a = x[i] < 0 ? -x[i] : x[i];
        if (isnan(a))
            nan = 1;
        else if (a > m)
            m = a;
    }
    if (nan)
        m = (PLAIN_REAL)NAN;
    const PLAIN_REAL s = m > 0 ? m : (PLAIN_REAL)1;
    PLAIN_REAL ssq = 0;
    for (int64_t i = 0; i < d; ++i)
        ssq = ssq + (x[i] / s) * (x[i] / s);
    PLAIN_REAL norm = m * PLAIN_SQRT(ssq);
    if (m == (PLAIN_REAL)INFINITY)
        norm = (PLAIN_REAL)INFINITY;
    if (norm < eps)                                      /* max(||x||, eps); NaN stays NaN */
        norm = eps;
    for (int64_t i = 0; i < d; ++i)
        y[i] = x[i] / norm;
}

int PLAIN_FN(refimpl_linear_angular_plain)(PLAIN_REAL *out, PLAIN_REAL *workspace, const PLAIN_REAL *q,
                                           const PLAIN_REAL *k, const PLAIN_REAL *v, double unit_eps,
                                           int constant_own, int similarity_sum, int64_t BH, int64_t N, int64_t M,
                                           int64_t d, int64_t e, int64_t workspace_len)
{
    if (!out || !workspace || !q || !k || !v)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || N < 1 || M < 1 || d < 1 || e < 1 || (constant_own && N != M))
        return REFIMPL_ERR_SIZE;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(PLAIN_REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * N > lim / e || BH * M > lim / d ||
        BH * M > lim / e)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t need = refimpl_linear_angular_plain_workspace(d, e);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    PLAIN_REAL *KV = workspace, *ksum = KV + d * e, *vsum = ksum + d, *f = vsum + e;
    const PLAIN_REAL eps = (PLAIN_REAL)unit_eps, inv_pi = (PLAIN_REAL)PLAIN_INV_PI, half = (PLAIN_REAL)0.5;
    const PLAIN_REAL half_m = (PLAIN_REAL)((double)M / 2.0);
    for (int64_t bh = 0; bh < BH; ++bh) {
        const PLAIN_REAL *qh = q + bh * N * d, *kh = k + bh * M * d, *vh = v + bh * M * e;
        PLAIN_REAL *oh = out + bh * N * e;
        /* KV = sum_j K^_j^T V_j, ksum = sum_j K^_j, vsum = sum_j V_j */
        for (int64_t x = 0; x < d * e; ++x)
            KV[x] = 0;
        for (int64_t i = 0; i < d; ++i)
            ksum[i] = 0;
        for (int64_t c = 0; c < e; ++c)
            vsum[c] = 0;
        for (int64_t j = 0; j < M; ++j) {
            for (int64_t c = 0; c < e; ++c)
                vsum[c] = vsum[c] + vh[j * e + c];
            PLAIN_FN(lp_unit_row)(f, kh + j * d, d, eps);
            for (int64_t i = 0; i < d; ++i) {
                ksum[i] = ksum[i] + f[i];
                for (int64_t c = 0; c < e; ++c)
                    KV[i * e + c] = KV[i * e + c] + f[i] * vh[j * e + c];
            }
        }
        /* H_i = 1/2 C_i + (1/pi) Q^_i KV  [/ (M/2 + (1/pi) Q^_i . ksum)]   (Castling-ViT Eq. 9) */
        for (int64_t n = 0; n < N; ++n) {
            PLAIN_FN(lp_unit_row)(f, qh + n * d, d, eps);
            PLAIN_REAL den = 1;
            if (similarity_sum) {
                PLAIN_REAL a = 0;
                for (int64_t i = 0; i < d; ++i)
                    a = a + f[i] * ksum[i];
                den = half_m + inv_pi * a;
            }
            for (int64_t c = 0; c < e; ++c) {
                PLAIN_REAL num = 0;
                for (int64_t i = 0; i < d; ++i)
                    num = num + f[i] * KV[i * e + c];
                const PLAIN_REAL cst = constant_own ? vh[n * e + c] : vsum[c];
                const PLAIN_REAL h = half * cst + inv_pi * num;
                oh[n * e + c] = similarity_sum ? h / den : h;
            }
        }
    }
    return REFIMPL_OK;
}

#endif /* PLAIN_REAL */
