/*
 * Windowed softmax attention: the work item for one (window, head), per (type, ISA).  Included by
 * linattn.c after linattn_body.h (whose exp it uses) with REAL, SUF, LA_TARGET, LA_EXP defined.  Not a
 * standalone translation unit.
 *
 * The definition (refimpl.attention.softmax._window_softmax_attention_numpy = softmax_attention):
 *   s_ij = sum_c (q_ic * scale) k_jc          (q * scale rounded first; c in increasing order)
 *   s_ij = s_ij + bias_ij                     (if bias)
 *   s_ij = -inf where the mask is False       (if mask)
 *   p_ij = exp(s_ij - max_j s_ij) / sum_j exp(...)   (sum over j in increasing order)
 *   o_ie = sum_j p_ij v_je                    (j in increasing order)
 * Every element is computed in this fixed order.  The two products use the register-blocked tiles of
 * linattn_body.h (vectorised across j, with k transposed into the scratch, or across e; never across a
 * sum), so every vector level gives the same bits.
 */

#define WA_CAT2(a, b) a##_##b
#define WA_CAT(a, b) WA_CAT2(a, b)
#define WA_FN(name) WA_CAT(name, SUF)

/* o (R x C) = (p (R x K) b (K x C)) / 1 with the register-blocked tiles of the linear-attention pass 2
 * (linattn_body.h): every element the sum over k in increasing order from +0, then divided by one
 * (exact). */
static REFIMPL_INLINE void WA_FN(wa_matmul)(REAL *restrict o, const REAL *restrict p, const REAL *restrict b,
                                           const REAL *restrict ones, int64_t R, int64_t K, int64_t C,
                                           const struct la_policy *pol)
{
    int64_t t = 0;
#if VBYTES == 64
    if (C >= 4 * (int64_t)(VBYTES / sizeof(REAL))) {
        for (; t + 4 <= R; t += 4)
            WA_FN(la_out_rows)(o + t * C, p + t * K, b, ones, K, C, ones, 0, pol, 4, 4);
    } else {
        for (; t + 8 <= R; t += 8)
            WA_FN(la_out_rows)(o + t * C, p + t * K, b, ones, K, C, ones, 0, pol, 8, 2);
    }
#else
    for (; t + 4 <= R; t += 4)
        WA_FN(la_out_rows)(o + t * C, p + t * K, b, ones, K, C, ones, 0, pol, 4, 2);
#endif
    for (; t < R; ++t)
        WA_FN(la_out_rows)(o + t * C, p + t * K, b, ones, K, C, ones, 0, pol, 1, 2);
}

LA_TARGET static void WA_FN(wa_item)(REAL *restrict o, REAL *restrict scratch, const REAL *restrict q,
                                     const REAL *restrict k, const REAL *restrict v, const REAL *restrict bias,
                                     const unsigned char *restrict mask, REAL scale, int64_t N, int64_t M,
                                     int64_t d, int64_t e)
{
    REAL *kt = scratch;                 /* d x M: k transposed */
    REAL *S = kt + d * M;               /* N x M: logits, then probabilities */
    REAL *qs = S + N * M;               /* N x d: q * scale */
    REAL *ex = qs + N * d;              /* M: one row's exponentials */
    REAL *ones = ex + M;                /* max(N, 1): divisors of the tiles */
    struct la_policy pol;
    memset(&pol, 0, sizeof pol);
    for (int64_t i = 0; i < N; ++i)
        ones[i] = 1;
    for (int64_t j = 0; j < M; ++j)
        for (int64_t c = 0; c < d; ++c)
            kt[c * M + j] = k[j * d + c];
    for (int64_t x = 0; x < N * d; ++x)
        qs[x] = q[x] * scale;
    WA_FN(wa_matmul)(S, qs, kt, ones, N, d, M, &pol);
    const REAL lo = sizeof(REAL) == sizeof(float) ? (REAL)-87.0 : (REAL)-708.0;
    for (int64_t i = 0; i < N; ++i) {
        REAL *s = S + i * M;
        if (bias) {
            const REAL *br = bias + i * M;
            for (int64_t j = 0; j < M; ++j)
                s[j] = s[j] + br[j];
        }
        if (mask) {
            const unsigned char *mr = mask + i * M;
            for (int64_t j = 0; j < M; ++j)
                s[j] = mr[j] ? s[j] : -(REAL)INFINITY;
        }
        /* max with NaN propagation (np.max) */
        REAL m = s[0];
        int nan = s[0] != s[0];
        for (int64_t j = 1; j < M; ++j) {
            m = s[j] > m ? s[j] : m;
            nan |= s[j] != s[j];
        }
        if (nan)
            m = (REAL)NAN;
        for (int64_t j = 0; j < M; ++j)
            s[j] = s[j] - m;
        /* exp(s - m), arguments <= 0: the kernel's vector exp; libm below its range, for -inf and NaN */
        int rare = 0;
        for (int64_t j = 0; j < M; ++j) {
            const REAL x = s[j];
            ex[j] = sizeof(REAL) == sizeof(float) ? (REAL)WA_FN(la_expf_core)((float)x)
                                                  : (REAL)WA_FN(la_exp_core)((double)x);
            rare |= !(x >= lo);
        }
        if (rare)
            for (int64_t j = 0; j < M; ++j)
                if (!(s[j] >= lo))
                    ex[j] = LA_EXP(s[j]);
        REAL z = 0;
        for (int64_t j = 0; j < M; ++j)
            z += ex[j];
        for (int64_t j = 0; j < M; ++j)
            s[j] = ex[j] / z;
    }
    WA_FN(wa_matmul)(o, S, v, ones, N, M, e, &pol);
}

#undef WA_FN
#undef WA_CAT
#undef WA_CAT2
