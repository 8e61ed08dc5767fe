/*
 * RALA's reweighting coefficients alpha (Eq. 4): the work items of one (type, ISA).  Included by linattn.c
 * after linattn_body.h (whose staging code la_stage and vector exp it uses) with REAL, SUF, VBYTES,
 * LA_TARGET and LA_EXP defined.  Not a standalone translation unit.
 *
 * The definition (refimpl.attention.rala._rala_alpha_numpy: rala._reweighting(...)[2], i.e.
 * reweighting_coefficients(mean(x, tokens), kappa(K), scale) with x = Q or kappa(Q)), per head:
 *
 *   Q_g   = (sum_t x_t) / N                          (np.mean: the sum, then one division by N)
 *   l_j   = scale * (Q_g . kappa(K_j))               (the logits; one rounded product by scale)
 *   m     = max_j l_j                                (NaN if any l_j is NaN, as np.max)
 *   e_j   = exp(l_j - m)                             (l_j - m rounded, then exp; every argument <= 0)
 *   S     = sum_j e_j
 *   alpha = M * (e_j / S)                            (numerics.softmax's quotient, then the product by M)
 *
 * The work is cut into (head, chunk of tokens) items, with chunk boundaries that depend on N (or M) only
 * (refimpl_linear_attention_chunks); each item writes only its own partial result, and the partials of a
 * head are combined by the calling thread in chunk order (rala_entry.h).  Order of every sum, fixed:
 *   - sum_t x_t: per feature, token order within a chunk from +0, then the chunk partials in chunk order
 *     (vectorised across features, never across the sum);
 *   - the logit dot product over d features: feature i into lane i mod 8 in increasing i (an 8-element
 *     GCC vector, whatever the ISA), then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the d mod 8
 *     tail in order (the focused map's order, linattn_body.h);
 *   - sum_j e_j: token j of a chunk into lane (j - chunk start) mod 8, the same tree, then the tail, then
 *     the chunk sums in chunk order.
 * So every vector level and every thread count gives the same bits (tests/test_kernels_rala.py).  NumPy
 * (BLAS for the dot product, its own reduction orders for the mean and the sum) sums in other orders:
 * agreement is within the error model (rala_core_bound), not bitwise.  exp is the kernel's vector exp
 * (within config.ELEMENTARY_FUNCTION_ULPS; libm below its range, for -inf and NaN).
 */

#define RA_CAT2(a, b) a##_##b
#define RA_CAT(a, b) RA_CAT2(a, b)
#define RA_FN(name) RA_CAT(name, SUF)

/* ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) */
#define RA_TREE8(s) ((((s)[0] + (s)[1]) + ((s)[2] + (s)[3])) + (((s)[4] + (s)[5]) + ((s)[6] + (s)[7])))

/* part[i] = sum_{t < T} x_t,i (token order from +0), x_t = src row t or (kappa_q) phi(src row t) staged
 * LA_TB rows at a time into scratch (LA_TB x d). */
LA_TARGET static void RA_FN(ra_qsum)(REAL *restrict part, REAL *restrict scratch, const REAL *restrict src,
                                     int64_t T, int64_t d, int kappa_q, const struct la_policy *pol)
{
    for (int64_t i = 0; i < d; ++i)
        part[i] = 0;
    for (int64_t t0 = 0; t0 < T; t0 += LA_TB) {
        const int64_t tb = T - t0 < LA_TB ? T - t0 : LA_TB;
        const REAL *x = src + t0 * d;
        if (kappa_q) {
            RA_FN(la_stage)(scratch, x, tb, d, pol);
            x = scratch;
        }
        for (int64_t t = 0; t < tb; ++t)
            for (int64_t i = 0; i < d; ++i)
                part[i] += x[t * d + i];
    }
}

/* l[t] = scale * (qg . phi(k row t)) for t < T (the 8-lane dot product), phi staged LA_TB rows at a time
 * into scratch; returns max_t l[t], NaN if any l[t] is NaN (np.max). */
LA_TARGET static REAL RA_FN(ra_logits)(REAL *restrict l, REAL *restrict scratch, const REAL *restrict k,
                                       const REAL *restrict qg, int64_t T, int64_t d, REAL scale,
                                       const struct la_policy *pol)
{
    typedef RA_FN(v8) v8;
    const int64_t d8 = d - d % 8;
    REAL m = -(REAL)INFINITY;
    int isnan_ = 0;
    for (int64_t t0 = 0; t0 < T; t0 += LA_TB) {
        const int64_t tb = T - t0 < LA_TB ? T - t0 : LA_TB;
        RA_FN(la_stage)(scratch, k + t0 * d, tb, d, pol);
        for (int64_t t = 0; t < tb; ++t) {
            const REAL *p = scratch + t * d;
            v8 sl = {0};
            for (int64_t i0 = 0; i0 < d8; i0 += 8) {
                v8 a, b;
                memcpy(&a, qg + i0, sizeof a);
                memcpy(&b, p + i0, sizeof b);
                sl += a * b;
            }
            REAL s = RA_TREE8(sl);
            for (int64_t i = d8; i < d; ++i)
                s += qg[i] * p[i];
            const REAL x = scale * s;
            l[t0 + t] = x;
            m = x > m ? x : m;
            isnan_ |= x != x;
        }
    }
    return isnan_ ? (REAL)NAN : m;
}

/* e[t] = exp(e[t] - m) in place for t < T (the vector exp; libm below its range, for -inf and NaN, as in
 * la_stage); returns sum_t e[t] in the 8-lane order. */
LA_TARGET static REAL RA_FN(ra_exp)(REAL *restrict e, int64_t T, REAL m)
{
    typedef RA_FN(v8) v8;
    const REAL lo = sizeof(REAL) == sizeof(float) ? (REAL)-87.0 : (REAL)-708.0;
    REAL xb[LA_TB];
    for (int64_t t0 = 0; t0 < T; t0 += LA_TB) {
        const int64_t tb = T - t0 < LA_TB ? T - t0 : LA_TB;
        REAL *eb = e + t0;
        int rare = 0;
        for (int64_t t = 0; t < tb; ++t) {
            const REAL x = eb[t] - m;
            xb[t] = x;
            eb[t] = sizeof(REAL) == sizeof(float) ? (REAL)RA_FN(la_expf_core)((float)x)
                                                  : (REAL)RA_FN(la_exp_core)((double)x);
            rare |= !(x >= lo);
        }
        if (rare)
            for (int64_t t = 0; t < tb; ++t)
                if (!(xb[t] >= lo))
                    eb[t] = LA_EXP(xb[t]);
    }
    v8 sl = {0};
    const int64_t T8 = T - T % 8;
    for (int64_t t0 = 0; t0 < T8; t0 += 8) {
        v8 a;
        memcpy(&a, e + t0, sizeof a);
        sl += a;
    }
    REAL s = RA_TREE8(sl);
    for (int64_t t = T8; t < T; ++t)
        s += e[t];
    return s;
}

/* a[t] = Mr * (a[t] / S) for t < T. */
LA_TARGET static void RA_FN(ra_scale)(REAL *restrict a, int64_t T, REAL Mr, REAL S)
{
    for (int64_t t = 0; t < T; ++t)
        a[t] = Mr * (a[t] / S);
}

#undef RA_TREE8
#undef RA_FN
#undef RA_CAT
#undef RA_CAT2
