/*
 * RALA's reweighting coefficients alpha (Eq. 4), the plain version: straight scalar loops in the order of the
 * equation, one thread, no chunks, no vector types, libm's exp.  It is the specification of the fast kernel
 * refimpl_rala_alpha_f64/_f32 (ckernels/rala_body.h, rala_entry.h).  Not registered as a backend;
 * tests/test_kernels_plain.py checks it (fed to the plain linear attention with key weights, RALA Eq. 2-3)
 * against the NumPy definition within rala_core_bound, and the fast kernel against it.
 *
 *   int refimpl_rala_alpha_plain_f64(alpha, workspace, q, k, feature_map, kappa_q, scale, BH, N, M, d,
 *                                    workspace_len)   (and _f32)
 *
 *   alpha (BH, M); q (BH, N, d), k (BH, M, d); feature_map kappa: REFIMPL_LA_MAP_RELU or _ELU1; kappa_q
 *   nonzero: Q_g is the mean of kappa(Q), else of Q; scale the logits' factor (rounded to the type);
 *   workspace_len >= refimpl_rala_alpha_plain_workspace(d).  Returns REFIMPL_OK or a nonzero status (and
 *   writes nothing) for refused arguments.
 *
 * Per head (RALA Eq. 4, with the operations of refimpl.attention.rala_core._rala_alpha_numpy):
 *
 *   Q_g     = (sum_t x_t) / N,  x_t = Q_t or kappa(Q_t)      (np.mean: the sum, then one division by N)
 *   l_j     = scale * (Q_g . kappa(K_j))                      (the logits)
 *   m       = max_j l_j                                       (NaN if any l_j is NaN, as np.max)
 *   e_j     = exp(l_j - m),  S = sum_j e_j
 *   alpha_j = M * (e_j / S)                                   (softmax's quotient, then the product by M)
 *
 * Every sum starts at +0 and adds its terms in increasing index order (-ffp-contract=off: no FMA).  The fast
 * kernel differs in the order of its sums (token chunks for N, M >= 128; 8 lanes for the dot product and the
 * exponentials' sum) and in its exp; both lie within the error model.
 *
 * The file includes itself once per floating type (PLAIN_REAL defined): the body is written once.
 */
#ifndef PLAIN_REAL

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* Q_g (d) and one kappa row (d). */
int64_t refimpl_rala_alpha_plain_workspace(int64_t d)
{
    if (d < 1 || d > (PTRDIFF_MAX / 8) / 2)
        return -1;
    return 2 * d;
}

#define PLAIN_REAL double
#define PLAIN_FN(name) name##_f64
#define PLAIN_EXP exp
#include "rala_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP

#define PLAIN_REAL float
#define PLAIN_FN(name) name##_f32
#define PLAIN_EXP expf
#include "rala_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP

#else /* the body, once per type */

/* f = kappa(x) for one token's d features: ReLU (max(x, 0), NaN kept) or ELU + 1 (x + 1, or exp(x) for x <= 0);
 * RALA Sec. 3.2. */
static void PLAIN_FN(rp_kappa)(PLAIN_REAL *f, const PLAIN_REAL *x, int64_t d, int map)
{
    for (int64_t i = 0; i < d; ++i) {
        if (map == REFIMPL_LA_MAP_RELU)
            f[i] = (x[i] > 0 || isnan(x[i])) ? x[i] : (PLAIN_REAL)0;
        else
            f[i] = x[i] > 0 ? x[i] + (PLAIN_REAL)1 : PLAIN_EXP(x[i]);
    }
}

int PLAIN_FN(refimpl_rala_alpha_plain)(PLAIN_REAL *alpha, PLAIN_REAL *workspace, const PLAIN_REAL *q,
                                       const PLAIN_REAL *k, int feature_map, int kappa_q, double scale,
                                       int64_t BH, int64_t N, int64_t M, int64_t d, int64_t workspace_len)
{
    if (!alpha || !workspace || !q || !k)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || N < 1 || M < 1 || d < 1)
        return REFIMPL_ERR_SIZE;
    if (feature_map != REFIMPL_LA_MAP_RELU && feature_map != REFIMPL_LA_MAP_ELU1)
        return REFIMPL_ERR_OPTION;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(PLAIN_REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * M > lim / d)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t need = refimpl_rala_alpha_plain_workspace(d);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    PLAIN_REAL *qg = workspace, *f = workspace + d;
    const PLAIN_REAL sc = (PLAIN_REAL)scale, Mr = (PLAIN_REAL)M;
    for (int64_t bh = 0; bh < BH; ++bh) {
        const PLAIN_REAL *qh = q + bh * N * d, *kh = k + bh * M * d;
        PLAIN_REAL *a = alpha + bh * M;
        /* Q_g = (sum_t x_t) / N */
        for (int64_t i = 0; i < d; ++i)
            qg[i] = 0;
        for (int64_t t = 0; t < N; ++t) {
            const PLAIN_REAL *x = qh + t * d;
            if (kappa_q) {
                PLAIN_FN(rp_kappa)(f, x, d, feature_map);
                x = f;
            }
            for (int64_t i = 0; i < d; ++i)
                qg[i] = qg[i] + x[i];
        }
        for (int64_t i = 0; i < d; ++i)
            qg[i] = qg[i] / (PLAIN_REAL)N;
        /* l_j = scale (Q_g . kappa(K_j)), into alpha; m = max_j l_j */
        PLAIN_REAL m = -(PLAIN_REAL)INFINITY;
        int nan = 0;
        for (int64_t j = 0; j < M; ++j) {
            PLAIN_FN(rp_kappa)(f, kh + j * d, d, feature_map);
            PLAIN_REAL dot = 0;
            for (int64_t i = 0; i < d; ++i)
                dot = dot + qg[i] * f[i];
            a[j] = sc * dot;
            if (isnan(a[j]))
                nan = 1;
            else if (a[j] > m)
                m = a[j];
        }
        if (nan)
            m = (PLAIN_REAL)NAN;
        /* e_j = exp(l_j - m), S = sum_j e_j */
        PLAIN_REAL S = 0;
        for (int64_t j = 0; j < M; ++j) {
            a[j] = PLAIN_EXP(a[j] - m);
            S = S + a[j];
        }
        /* alpha_j = M (e_j / S) */
        for (int64_t j = 0; j < M; ++j)
            a[j] = Mr * (a[j] / S);
    }
    return REFIMPL_OK;
}

#endif /* PLAIN_REAL */
