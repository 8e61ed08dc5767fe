/*
 * Windowed softmax attention, the plain version: straight scalar loops in the order of the equation, one
 * thread, no tiles, no transposed copy, no vector types, libm's exp.  It is the specification of the fast
 * kernel refimpl_window_attention_f64/_f32 (ckernels/winattn_body.h, winattn_entry.h).  Not registered as a
 * backend; tests/test_kernels_plain.py checks it against the NumPy definition
 * (refimpl.attention.softmax._window_softmax_attention_numpy) within softmax_attention_bound, and the fast
 * kernel against it.
 *
 *   int refimpl_window_attention_plain_f64(out, workspace, q, k, v, bias, mask, scale, BH, H, N, M, d, e,
 *                                          bias_count, mask_count, workspace_len)   (and _f32)
 *
 *   out (BH, N, e); q (BH, N, d), k (BH, M, d), v (BH, M, e); BH = windows x heads, head fastest.
 *   bias  NULL or (bias_count, N, M): item bh uses bias[bh % bias_count].
 *   mask  NULL or (mask_count, N, M) bytes, nonzero = may attend: item bh uses mask[(bh / H) % mask_count].
 *   workspace_len >= refimpl_window_attention_plain_workspace(M).  Returns REFIMPL_OK or a nonzero status (and
 *   writes nothing) for refused arguments.
 *
 * Per (window, head) and query i (Swin Eq. 4; Vaswani et al. 2017 Eq. 1):
 *
 *   s_ij = sum_c (q_ic * scale) k_jc              (q * scale rounded first, as the definition)
 *   s_ij = s_ij + bias_ij                         (bias given)
 *   s_ij = -inf where mask_ij is 0                (mask given)
 *   m_i  = max_j s_ij                             (NaN if any s_ij is NaN, as np.max)
 *   p_ij = exp(s_ij - m_i) / z_i,  z_i = sum_j exp(s_ij - m_i)
 *   o_ic = sum_j p_ij v_jc
 *
 * Every sum starts at +0 and adds its terms in increasing index order (-ffp-contract=off: no FMA).  The fast
 * kernel performs the same operations in the same order (its tiles vectorise across j or c, never across a
 * sum, and divide by an exact 1); the only difference is its exp (ckernels/linattn_body.h, within
 * config.ELEMENTARY_FUNCTION_ULPS) where this version calls libm's.
 *
 * The file includes itself once per floating type (PLAIN_REAL defined): the body is written once.
 */
#ifndef PLAIN_REAL

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* One row of logits / probabilities (M). */
int64_t refimpl_window_attention_plain_workspace(int64_t M)
{
    return M < 1 || M > PTRDIFF_MAX / 8 ? -1 : M;
}

#define PLAIN_REAL double
#define PLAIN_FN(name) name##_f64
#define PLAIN_EXP exp
#include "winattn_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP

#define PLAIN_REAL float
#define PLAIN_FN(name) name##_f32
#define PLAIN_EXP expf
#include "winattn_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN
#undef PLAIN_EXP

#else /* the body, once per type */

int PLAIN_FN(refimpl_window_attention_plain)(PLAIN_REAL *out, PLAIN_REAL *workspace, const PLAIN_REAL *q,
                                             const PLAIN_REAL *k, const PLAIN_REAL *v, const PLAIN_REAL *bias,
                                             const unsigned char *mask, double scale, int64_t BH, int64_t H,
                                             int64_t N, int64_t M, int64_t d, int64_t e, int64_t bias_count,
                                             int64_t mask_count, int64_t workspace_len)
{
    if (!out || !workspace || !q || !k || !v)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || H < 1 || N < 1 || M < 1 || d < 1 || e < 1 || BH % H ||
        (bias && (bias_count < 1 || bias_count > BH)) || (mask && (mask_count < 1 || mask_count > BH)))
        return REFIMPL_ERR_SIZE;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(PLAIN_REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * N > lim / e || BH * M > lim / d ||
        BH * M > lim / e || N > lim / M || N * M > lim / BH)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t need = refimpl_window_attention_plain_workspace(M);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    PLAIN_REAL *p = workspace;
    const PLAIN_REAL sc = (PLAIN_REAL)scale;
    for (int64_t bh = 0; bh < BH; ++bh) {
        const PLAIN_REAL *qh = q + bh * N * d, *kh = k + bh * M * d, *vh = v + bh * M * e;
        const PLAIN_REAL *bb = bias ? bias + (bh % bias_count) * N * M : 0;
        const unsigned char *mb = mask ? mask + ((bh / H) % mask_count) * N * M : 0;
        PLAIN_REAL *oh = out + bh * N * e;
        for (int64_t i = 0; i < N; ++i) {
            /* s_ij = sum_c (q_ic scale) k_jc (+ bias_ij; -inf where masked); m_i = max_j s_ij */
            PLAIN_REAL m = -(PLAIN_REAL)INFINITY;
            int nan = 0;
            for (int64_t j = 0; j < M; ++j) {
                PLAIN_REAL s = 0;
                for (int64_t c = 0; c < d; ++c)
                    s = s + (qh[i * d + c] * sc) * kh[j * d + c];
                if (bb)
                    s = s + bb[i * M + j];
                if (mb && !mb[i * M + j])
                    s = -(PLAIN_REAL)INFINITY;
                p[j] = s;
                if (isnan(s))
                    nan = 1;
                else if (s > m)
                    m = s;
            }
            if (nan)
                m = (PLAIN_REAL)NAN;
            /* p_ij = exp(s_ij - m_i) / z_i */
            PLAIN_REAL z = 0;
            for (int64_t j = 0; j < M; ++j) {
                p[j] = PLAIN_EXP(p[j] - m);
                z = z + p[j];
            }
            for (int64_t j = 0; j < M; ++j)
                p[j] = p[j] / z;
            /* o_ic = sum_j p_ij v_jc */
            for (int64_t c = 0; c < e; ++c) {
                PLAIN_REAL o = 0;
                for (int64_t j = 0; j < M; ++j)
                    o = o + p[j] * vh[j * e + c];
                oh[i * e + c] = o;
            }
        }
    }
    return REFIMPL_OK;
}

#endif /* PLAIN_REAL */
