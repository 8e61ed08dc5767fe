/*
 * Fused kernelized linear attention forward: the per-(type, ISA) work items.  Included by linattn.c once
 * per (type, ISA) with
 *   REAL       the element type (double / float),
 *   SUF        the name suffix (avx512_f64, base_f32, ...),
 *   VBYTES     the vector width in bytes (64 AVX-512, 32 AVX2, 16 SSE2/baseline),
 *   LA_TARGET  the function attribute that enables the ISA (empty for the baseline).
 * Not a standalone translation unit (hence .h: the build compiles only the .c files).
 *
 * ---------------------------------------------------------------------------------------------------
 * What one head (b, h) computes (the NumPy twin: refimpl.attention.linear._linear_attention_numpy, i.e.
 * kernelized_attention(phi(q), phi(k), v, order="linear")):
 *
 *   phi(x)   = max(x, 0)                      (LA_MAP_RELU; NaN stays NaN)
 *            = x + 1 (x > 0), exp(x) (x <= 0) (LA_MAP_ELU1; the reference's exp form of ELU(x) + 1)
 *            = f_p(ReLU(x)) per row of d      (LA_MAP_FOCUSED; FLatten Eq. 6, the twin
 *              refimpl.attention.focused.focused_feature_map(x, p, power_scaling="max"); see la_map_focused_row)
 *   KV       = s sum_j w_j phi(K_j)^T V_j     (d x e),     ksum = s sum_j w_j phi(K_j)   (d)
 *            (w_j the optional key weights, RALA's alpha_j of Eq. 3, the product w_j phi(K_j) rounded
 *            once; s the optional scale kv_scale, applied once after the sum; w = 1, s = 1 otherwise)
 *   num_i    = phi(Q_i) KV                    (e),         den_i = phi(Q_i) . ksum
 *   den_eff  = max(den, clamp_min) (if clamp), then den + eps (policy add, eps != 0) or max(den, eps)
 *   O_i      = num_i / den_eff_i              (NaN where den_eff = 0 and num = 0, as the definition)
 *
 * Order of operations (fixed, whatever the thread count or vector width, so the result is reproducible
 * bit for bit):
 *   pass 1  the M keys are split into NC chunks (NC depends on M only, see linattn.c).  For each chunk c,
 *           partial KV_c[i, j] and ksum_c[i] start at +0 and add phi(K_t)_i * V_t,j (one rounded product,
 *           one rounded sum; no FMA: -ffp-contract=off) for t in the chunk in increasing order.
 *   reduce  KV = ((KV_0 + KV_1) + KV_2) + ... in chunk order (likewise ksum).
 *   pass 2  num_i,j = (((0 + q_i0 KV_0j) + q_i1 KV_1j) + ...) over the feature index in increasing order;
 *           den_i the same with ksum; then the normaliser and the quotient.
 * Vectorisation runs across the value columns j (and the chunk of KV rows i), never across a sum, so
 * the AVX-512, AVX2 and baseline versions give the same bits (tested).  The NumPy twin uses BLAS, whose
 * summation order differs: agreement with it is within the error model (linear_attention_bound), not
 * bitwise.
 *
 * Register blocking.  Pass 1 is a rank-T update of the d x e matrix KV per token block: a tile of NR rows
 * of KV x NV vectors of columns stays in registers over the T tokens of the block (each token: NV vector
 * loads of V_t, NR broadcasts of phi(K_t)_i, NR*NV multiplies and adds).  Pass 2 is the product of a block
 * of NR tokens of phi(Q) with KV: a tile of NR tokens x NV vectors of output columns stays in registers
 * over the d features.  The NR*NV independent addition chains hide the adder latency.
 * ---------------------------------------------------------------------------------------------------
 */

#define LA_CAT2(a, b) a##_##b
#define LA_CAT(a, b) LA_CAT2(a, b)
#define LA_FN(name) LA_CAT(name, SUF)
#define LA_VLEN ((int64_t)(VBYTES / sizeof(REAL)))

typedef REAL LA_FN(vec) __attribute__((vector_size(VBYTES)));
/* 8 elements, whatever the ISA (GCC splits it into the target's vectors): the 8 lanes of the focused
 * map's fixed-order sums, and the matching comparison-mask type. */
typedef REAL LA_FN(v8) __attribute__((vector_size(8 * sizeof(REAL))));
typedef LA_SINT LA_FN(m8) __attribute__((vector_size(8 * sizeof(REAL))));

/* exp(x) in double for -708 <= x <= 0 (the ELU + 1 map's negative side; any x in that range of a float
 * too), written so that it vectorises: x = k ln2 + r with k = round(x / ln2) (by the 1.5 * 2^52 shift,
 * exact in round-to-nearest), r = (x - k ln2_hi) - k ln2_lo (ln2_hi has 11 trailing zero bits, so
 * k ln2_hi is exact; |r| <= 0.347), exp(r) by its Taylor polynomial of degree 13 in Horner form
 * (truncation < 5e-18 relative), times 2^k built from the exponent bits (k >= -1021: a normal number).
 * Plain IEEE operations only (no FMA, no table), so every vector width returns the same bits.  Measured
 * accuracy against mpmath on 1.7 x 10^5 points of [-708, 0]: at most 1.12 ulp (docs/kernels_c.md); the error
 * model assumes config.ELEMENTARY_FUNCTION_ULPS = 4.  Garbage (never selected) outside [-708, 0]: the
 * caller takes x + 1 for x > 0 and the libm exp below -708 and for NaN. */
static REFIMPL_INLINE double LA_FN(la_exp_core)(double x)
{
    const double shift = 0x1.8p52;
    const double t = x * 0x1.71547652b82fep+0 + shift;
    const double kd = t - shift;
    const double r = (x - kd * 0x1.62e42fefa3800p-1) - kd * 0x1.ef35793c76730p-45;
    double p = 0x1.6124613a86d09p-33;
    p = p * r + 0x1.1eed8eff8d898p-29;
    p = p * r + 0x1.ae64567f544e4p-26;
    p = p * r + 0x1.27e4fb7789f5cp-22;
    p = p * r + 0x1.71de3a556c734p-19;
    p = p * r + 0x1.a01a01a01a01ap-16;
    p = p * r + 0x1.a01a01a01a01ap-13;
    p = p * r + 0x1.6c16c16c16c17p-10;
    p = p * r + 0x1.1111111111111p-7;
    p = p * r + 0x1.5555555555555p-5;
    p = p * r + 0x1.5555555555555p-3;
    p = p * r + 0x1.0p-1;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t tb;
    memcpy(&tb, &t, sizeof tb);
    /* low bits of t hold 2^51 + k; exponent field of 2^k is k + 1023 */
    const uint64_t eb = ((tb - (((uint64_t)1 << 51) - 1023u)) & (((uint64_t)1 << 11) - 1)) << 52;
    double sc;
    memcpy(&sc, &eb, sizeof sc);
    return p * sc;
}

/* The float version, in float arithmetic (so that it vectorises 16 wide): the same reduction with the
 * 1.5 * 2^23 shift, ln2_hi with 16 trailing zero bits, Taylor degree 7 (truncation < 5e-9 relative), 2^k
 * from the exponent bits; valid for -87 <= x <= 0 (2^k normal).  Measured against mpmath at
 * points of [-87, 0]: at most 1.14 ulp (1.7 x 10^5 points; docs/kernels_c.md). */
static REFIMPL_INLINE float LA_FN(la_expf_core)(float x)
{
    const float shift = 0x1.8p23f;
    const float t = x * 0x1.715476p+0f + shift;
    const float kd = t - shift;
    const float r = (x - kd * 0x1.62e4p-1f) - kd * 0x1.7f7d1cp-20f;
    float p = 0x1.a01a02p-13f;
    p = p * r + 0x1.6c16c2p-10f;
    p = p * r + 0x1.111112p-7f;
    p = p * r + 0x1.555556p-5f;
    p = p * r + 0x1.555556p-3f;
    p = p * r + 0x1.0p-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const uint32_t eb = ((tb - (0x4B400000u - 127u)) & 0xFFu) << 23;
    float sc;
    memcpy(&sc, &eb, sizeof sc);
    return p * sc;
}

#define LA_IS_FLOAT (sizeof(REAL) == sizeof(float))

/* ----- The feature maps, phi applied to the rows of a token block (la_stage at the end) ----- */

/* LA_MAP_RELU: dst[k] = max(src[k], 0) for k < n, NaN kept (as np.maximum). */
LA_TARGET static REFIMPL_INLINE void LA_FN(la_map_relu)(REAL *restrict dst, const REAL *restrict src, int64_t n)
{
    for (int64_t k = 0; k < n; ++k) {
        const REAL x = src[k];
        dst[k] = (x > 0 || x != x) ? x : (REAL)0;
    }
}

/* LA_MAP_ELU1: dst[k] = ELU(src[k]) + 1 = x + 1 (x > 0), exp(x) (x <= 0) for k < n.  exp is the vector exp
 * above; below its range (a subnormal or zero result) and for NaN, libm's (rare: a second pass). */
LA_TARGET static REFIMPL_INLINE void LA_FN(la_map_elu1)(REAL *restrict dst, const REAL *restrict src, int64_t n)
{
    const REAL lo = LA_IS_FLOAT ? (REAL)-87.0 : (REAL)-708.0;
    int rare = 0;
    for (int64_t k = 0; k < n; ++k) {
        const REAL x = src[k];
        const REAL ex = LA_IS_FLOAT ? (REAL)LA_FN(la_expf_core)((float)x) : (REAL)LA_FN(la_exp_core)((double)x);
        dst[k] = x > 0 ? x + (REAL)1 : ex;
        rare |= !(x > 0) & !(x >= lo);
    }
    if (rare) {
        for (int64_t k = 0; k < n; ++k) {
            const REAL x = src[k];
            if (!(x > 0) && !(x >= lo))
                dst[k] = LA_EXP(x);
        }
    }
}

/* LA_MAP_UNIT, one row: y = x / max(||x||, eps), numerics.l2_normalize(x, eps, policy="clamp"):
 *   m = max_i |x_i|                  (NaN if any x_i is NaN)
 *   ||x|| = m sqrt(sum_i (x_i / m')^2),  m' = m if m > 0 else 1;  ||x|| = inf if m is inf
 * The max is exact in any order; the sum of squares uses 8 interleaved partial sums (element i into lane
 * i mod 8 in increasing i, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the d mod 8 tail in
 * order): a fixed order, so the same bits at every vector width, without the latency chain of one serial
 * sum.  NumPy's pairwise sum uses another order; both lie within the gamma_d bound of a sum of
 * non-negative terms. */
LA_TARGET static REFIMPL_INLINE void LA_FN(la_map_unit_row)(REAL *restrict y, const REAL *restrict x, int64_t d,
                                                             REAL eps)
{
    const int64_t d8 = d - d % 8;
    REAL ml[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int nan = 0;
    for (int64_t i0 = 0; i0 < d8; i0 += 8)
        for (int l = 0; l < 8; ++l) {
            const REAL a = x[i0 + l] < 0 ? -x[i0 + l] : x[i0 + l];
            ml[l] = a > ml[l] ? a : ml[l];
            nan |= a != a;
        }
    REAL m = 0;
    for (int l = 0; l < 8; ++l)
        m = ml[l] > m ? ml[l] : m;
    for (int64_t i = d8; i < d; ++i) {
        const REAL a = x[i] < 0 ? -x[i] : x[i];
        m = a > m ? a : m;
        nan |= a != a;
    }
    if (nan)
        m = (REAL)NAN;
    const REAL sm = m > 0 ? m : (REAL)1;
    REAL sl[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i0 = 0; i0 < d8; i0 += 8)
        for (int l = 0; l < 8; ++l) {
            const REAL s = x[i0 + l] / sm;
            sl[l] += s * s;
        }
    REAL ssq = ((sl[0] + sl[1]) + (sl[2] + sl[3])) + ((sl[4] + sl[5]) + (sl[6] + sl[7]));
    for (int64_t i = d8; i < d; ++i) {
        const REAL s = x[i] / sm;
        ssq += s * s;
    }
    REAL nrm = m * (REAL)sqrt((double)ssq);
    if (m == (REAL)INFINITY)
        nrm = (REAL)INFINITY;
    if (!(nrm != nrm) && nrm < eps)
        nrm = eps;
    for (int64_t i = 0; i < d; ++i)
        y[i] = x[i] / nrm;
}

/* LA_MAP_FOCUSED: FLatten's phi_p(x) = f_p(ReLU(x)) (Eq. 6), row by row, with the operations of
 * refimpl.attention.focused.focused_function(power_scaling="max") (the max-scaled form), one step each:
 *   a_i = ReLU(x_i)                    (x_i if x_i > 0 or NaN, else +0)           la_focused_relu_max
 *   m   = max_i a_i                    (NaN if any a_i is NaN)                     la_focused_relu_max
 *   r_i = a_i / s,  s = m if m > 0 else 1        (one rounded division; r in [0, 1])     la_focused_ratio
 *   ||a|| = m * sqrt(sum_i r_i^2)      (each r_i^2 rounded, then the sum; sqrt correctly rounded)  ditto
 *   t_i = r_i^p                        (p - 1 sequential products r * r * ... * r for an integer
 *                                       p <= LA_FOCUSED_MUL_MAX, else libm pow, in double also for
 *                                       float, rounded once; see LA_FOCUSED_MUL_MAX in linattn.c)  la_focused_power
 *   f_i = ||a|| * (t_i / sqrt(sum_j t_j^2))       (quotient first, then the product)   la_focused_rescale
 *   f   = 0 for a row with m == 0      (no positive feature: the limit, ||f|| = ||a|| = 0)
 * A NaN anywhere in the row (or +Inf, through Inf / Inf) makes the whole row NaN, as in the reference;
 * -Inf is a dead feature.  Both sums use the 8-lane order of la_map_unit_row (element i into lane i mod 8
 * in increasing i, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the d mod 8 tail in
 * order) and the max is exact in any order, so every vector width and thread count gives the same bits.
 * NumPy's pairwise sums use another order; both lie within the gamma_d of a sum of non-negative terms
 * that focused_function_error budgets.  The 8 lanes are one 8-element GCC vector (split into the target's
 * registers) and ReLU / max are branch-free selects: written with scalar branches (the signs of x are
 * unpredictable) the map took 5x longer (18 ms against 3.6 ms for 98304 rows of 32 doubles, one thread). */

/* y = a = ReLU(x); returns m = max_i a_i (NaN if any a_i is NaN). */
LA_TARGET static REFIMPL_INLINE REAL LA_FN(la_focused_relu_max)(REAL *restrict y, const REAL *restrict x, int64_t d)
{
    typedef LA_FN(v8) v8;
    typedef LA_FN(m8) m8;
    const int64_t d8 = d - d % 8;
    v8 ml = {0};
    m8 nanm = {0};
    for (int64_t i0 = 0; i0 < d8; i0 += 8) {
        v8 v;
        memcpy(&v, x + i0, sizeof v);
        const m8 keep = (v > 0) | (v != v);
        const v8 a = (v8)((m8)v & keep);
        memcpy(y + i0, &a, sizeof a);
        const m8 gt = a > ml;
        ml = (v8)(((m8)a & gt) | ((m8)ml & ~gt));
        nanm |= a != a;
    }
    REAL m = 0;
    int nan = 0;
    for (int l = 0; l < 8; ++l) {
        m = ml[l] > m ? ml[l] : m;
        nan |= nanm[l] != 0;
    }
    for (int64_t i = d8; i < d; ++i) {
        const REAL v = x[i];
        const REAL a = (v > 0 || v != v) ? v : (REAL)0;
        y[i] = a;
        m = a > m ? a : m;
        nan |= a != a;
    }
    return nan ? (REAL)NAN : m;
}

/* y = r = a / s in place (s = m if m > 0 else 1); returns ||a|| = m sqrt(sum_i r_i^2). */
LA_TARGET static REFIMPL_INLINE REAL LA_FN(la_focused_ratio)(REAL *restrict y, int64_t d, REAL m)
{
    typedef LA_FN(v8) v8;
    const int64_t d8 = d - d % 8;
    const REAL sc = m > 0 ? m : (REAL)1;
    v8 sl = {0};
    for (int64_t i0 = 0; i0 < d8; i0 += 8) {
        v8 r;
        memcpy(&r, y + i0, sizeof r);
        r = r / sc;
        memcpy(y + i0, &r, sizeof r);
        sl += r * r;
    }
    REAL ssq = ((sl[0] + sl[1]) + (sl[2] + sl[3])) + ((sl[4] + sl[5]) + (sl[6] + sl[7]));
    for (int64_t i = d8; i < d; ++i) {
        const REAL r = y[i] / sc;
        y[i] = r;
        ssq += r * r;
    }
    return m * (LA_IS_FLOAT ? (REAL)sqrtf((float)ssq) : (REAL)sqrt((double)ssq));
}

/* y = t = r^p in place (ip > 0: ip - 1 products; else pow(r, pw)); returns ||t|| = sqrt(sum_i t_i^2). */
LA_TARGET static REFIMPL_INLINE REAL LA_FN(la_focused_power)(REAL *restrict y, int64_t d, int ip, double pw)
{
    typedef LA_FN(v8) v8;
    const int64_t d8 = d - d % 8;
    v8 tl = {0};
    for (int64_t i0 = 0; i0 < d8; i0 += 8) {
        v8 tt;
        if (ip > 0) {
            v8 r;
            memcpy(&r, y + i0, sizeof r);
            tt = r;
            for (int k = 1; k < ip; ++k)
                tt = tt * r;
        } else {
            for (int l = 0; l < 8; ++l)
                tt[l] = (REAL)pow((double)y[i0 + l], pw);
        }
        memcpy(y + i0, &tt, sizeof tt);
        tl += tt * tt;
    }
    REAL sst = ((tl[0] + tl[1]) + (tl[2] + tl[3])) + ((tl[4] + tl[5]) + (tl[6] + tl[7]));
    for (int64_t i = d8; i < d; ++i) {
        REAL tt;
        if (ip > 0) {
            tt = y[i];
            for (int k = 1; k < ip; ++k)
                tt = tt * y[i];
        } else {
            tt = (REAL)pow((double)y[i], pw);
        }
        y[i] = tt;
        sst += tt * tt;
    }
    return LA_IS_FLOAT ? (REAL)sqrtf((float)sst) : (REAL)sqrt((double)sst);
}

/* y = f = ||a|| (t / ||t||) in place. */
LA_TARGET static REFIMPL_INLINE void LA_FN(la_focused_rescale)(REAL *restrict y, int64_t d, REAL nx, REAL nt)
{
    typedef LA_FN(v8) v8;
    const int64_t d8 = d - d % 8;
    for (int64_t i0 = 0; i0 < d8; i0 += 8) {
        v8 tt;
        memcpy(&tt, y + i0, sizeof tt);
        tt = nx * (tt / nt);
        memcpy(y + i0, &tt, sizeof tt);
    }
    for (int64_t i = d8; i < d; ++i)
        y[i] = nx * (y[i] / nt);
}

/* One row of the focused map: the steps above in order. */
LA_TARGET static REFIMPL_INLINE void LA_FN(la_map_focused_row)(REAL *restrict y, const REAL *restrict x, int64_t d,
                                                                const struct la_policy *pol)
{
    const REAL m = LA_FN(la_focused_relu_max)(y, x, d);          /* a = ReLU(x), m = max a */
    if (m == 0) {                                                /* no positive feature: f = 0 */
        for (int64_t i = 0; i < d; ++i)
            y[i] = 0;
        return;
    }
    const REAL nx = LA_FN(la_focused_ratio)(y, d, m);            /* r = a / m, ||a|| */
    const REAL nt = LA_FN(la_focused_power)(y, d, pol->ipow, pol->power);   /* t = r^p, ||t|| */
    LA_FN(la_focused_rescale)(y, d, nx, nt);                     /* f = ||a|| (t / ||t||) */
}

/* dst[t*d + i] = phi(src[t*d + i]) for t < T, i < d: the staging of a block of T tokens (keys in pass 1,
 * queries in pass 2), phi the policy's map. */
LA_TARGET static void LA_FN(la_stage)(REAL *restrict dst, const REAL *restrict src, int64_t T, int64_t d,
                                      const struct la_policy *pol)
{
    switch (pol->map) {
    case LA_MAP_FOCUSED:
        for (int64_t t = 0; t < T; ++t)
            LA_FN(la_map_focused_row)(dst + t * d, src + t * d, d, pol);
        break;
    case LA_MAP_UNIT:
        for (int64_t t = 0; t < T; ++t)
            LA_FN(la_map_unit_row)(dst + t * d, src + t * d, d, (REAL)pol->map_eps);
        break;
    case LA_MAP_RELU:
        LA_FN(la_map_relu)(dst, src, T * d);
        break;
    default:
        LA_FN(la_map_elu1)(dst, src, T * d);
        break;
    }
}

/* Pass-1 tile: kv[r*e + j0 + c*VL + l] += sum_t p[t*d + r] * v[t*e + j0 + c*VL + l] for r < NR, c < NV,
 * t < T in increasing order (accumulators loaded from kv, stored back). */
static REFIMPL_INLINE void LA_FN(la_kv_tile)(REAL *restrict kv, const REAL *restrict p,
                                             const REAL *restrict v, int64_t T, int64_t d, int64_t e,
                                             const int NR, const int NV)
{
    LA_FN(vec) acc[8][4];
    for (int r = 0; r < NR; ++r)
        for (int c = 0; c < NV; ++c)
            memcpy(&acc[r][c], kv + r * e + c * LA_VLEN, sizeof acc[r][c]);
    for (int64_t t = 0; t < T; ++t) {
        LA_FN(vec) vv[4];
        for (int c = 0; c < NV; ++c)
            memcpy(&vv[c], v + t * e + c * LA_VLEN, sizeof vv[c]);
        for (int r = 0; r < NR; ++r) {
            const REAL s = p[t * d + r];
            for (int c = 0; c < NV; ++c)
                acc[r][c] += s * vv[c];
        }
    }
    for (int r = 0; r < NR; ++r)
        for (int c = 0; c < NV; ++c)
            memcpy(kv + r * e + c * LA_VLEN, &acc[r][c], sizeof acc[r][c]);
}

/* Rows [i0, i0 + NR) of the pass-1 update over all columns: vector tiles of NV, then single vectors,
 * then scalar columns (same per-element order everywhere). */
static REFIMPL_INLINE void LA_FN(la_kv_rows)(REAL *restrict kv, const REAL *restrict p, const REAL *restrict v,
                                             int64_t T, int64_t d, int64_t e, const int NR, const int NV)
{
    int64_t j = 0;
    for (; j + NV * LA_VLEN <= e; j += NV * LA_VLEN)
        LA_FN(la_kv_tile)(kv + j, p, v + j, T, d, e, NR, NV);
    for (; j + LA_VLEN <= e; j += LA_VLEN)
        LA_FN(la_kv_tile)(kv + j, p, v + j, T, d, e, NR, 1);
    for (; j < e; ++j) {
        for (int r = 0; r < NR; ++r) {
            REAL a = kv[r * e + j];
            for (int64_t t = 0; t < T; ++t)
                a += p[t * d + r] * v[t * e + j];
            kv[r * e + j] = a;
        }
    }
}

/* Pass 1 for one chunk of keys: kvp (d x e) and ksp (d) are this chunk's partials (set to +0 here);
 * k (T x d) and v (T x e) the chunk's rows; scratch holds LA_TB (d + e + 1) elements.  vs: NULL, or this
 * head's V scale s (L2ViT's gain): each V element is replaced by v / s (pol->v_divide) or v * s, one
 * rounded operation, as the definition's v_eff = V / s or V * t, staged LA_TB rows at a time. */
LA_TARGET static void LA_FN(la_pass1)(REAL *restrict kvp, REAL *restrict ksp, REAL *restrict vsp,
                                      REAL *restrict scratch, const REAL *restrict k, const REAL *restrict v,
                                      const REAL *restrict w, const REAL *restrict vs, int64_t T, int64_t d,
                                      int64_t e, const struct la_policy *pol)
{
    for (int64_t x = 0; x < d * e; ++x)
        kvp[x] = 0;
    for (int64_t i = 0; i < d; ++i)
        ksp[i] = 0;
    for (int64_t j = 0; j < e; ++j)
        vsp[j] = 0;
    if (pol->castling && !pol->own)                            /* sum_j V_j, tokens in order */
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < e; ++j)
                vsp[j] += v[t * e + j];
    for (int64_t t0 = 0; t0 < T; t0 += LA_TB) {
        const int64_t tb = T - t0 < LA_TB ? T - t0 : LA_TB;
        const REAL *vb = v + t0 * e;
        if (vs) {                                               /* L2ViT: v_eff = v / s or v * s, rounded */
            REAL *vsb = scratch + LA_TB * d + LA_TB;
            const REAL s = *vs;
            const int64_t n = tb * e;
            if (pol->v_divide)
                for (int64_t x = 0; x < n; ++x)
                    vsb[x] = vb[x] / s;
            else
                for (int64_t x = 0; x < n; ++x)
                    vsb[x] = vb[x] * s;
            vb = vsb;
        }
        LA_FN(la_stage)(scratch, k + t0 * d, tb, d, pol);
        if (w)                                                  /* RALA: alpha_t phi(K_t), rounded */
            for (int64_t t = 0; t < tb; ++t)
                for (int64_t i = 0; i < d; ++i)
                    scratch[t * d + i] = w[t0 + t] * scratch[t * d + i];
        for (int64_t t = 0; t < tb; ++t)                        /* ksum, tokens in order */
            for (int64_t i = 0; i < d; ++i)
                ksp[i] += scratch[t * d + i];
        int64_t i = 0;
#if VBYTES == 64
        if (e >= 4 * LA_VLEN) {
            for (; i + 4 <= d; i += 4)
                LA_FN(la_kv_rows)(kvp + i * e, scratch + i, vb, tb, d, e, 4, 4);
        } else {
            for (; i + 8 <= d; i += 8)
                LA_FN(la_kv_rows)(kvp + i * e, scratch + i, vb, tb, d, e, 8, 2);
        }
#else
        for (; i + 4 <= d; i += 4)
            LA_FN(la_kv_rows)(kvp + i * e, scratch + i, vb, tb, d, e, 4, 2);
#endif
        for (; i < d; ++i)
            LA_FN(la_kv_rows)(kvp + i * e, scratch + i, vb, tb, d, e, 1, 2);
    }
}

/* den_eff from den (the normaliser policy; NaN propagates through both maxima like np.maximum). */
static REFIMPL_INLINE REAL LA_FN(la_norm)(REAL den, const struct la_policy *pol)
{
    if (pol->clamp && !(den != den) && den < (REAL)pol->clamp_min)
        den = (REAL)pol->clamp_min;
    if (pol->eps_clamp) {
        if (!(den != den) && den < (REAL)pol->eps)
            den = (REAL)pol->eps;
    } else if ((REAL)pol->eps != 0) {
        den = den + (REAL)pol->eps;
    }
    return den;
}

/* Pass-2 tile: NR tokens x NV vectors of output columns starting at column j. */
/* The output of one element from its numerator a (see la_epi in la_out_tile for the vector form). */
static REFIMPL_INLINE REAL LA_FN(la_epi1)(REAL a, REAL den, const REAL *cb, const struct la_policy *pol)
{
    if (!pol->castling)
        return a / den;
    const REAL h = (REAL)0.5 * *cb + (REAL)LA_INV_PI * a;
    return pol->simsum ? h / den : h;
}

static REFIMPL_INLINE void LA_FN(la_out_tile)(REAL *restrict o, const REAL *restrict p,
                                              const REAL *restrict kv, const REAL *restrict den, int64_t d,
                                              int64_t e, const REAL *restrict cb, int64_t cs,
                                              const struct la_policy *pol, const int NR, const int NV)
{
    LA_FN(vec) acc[8][4];
    for (int r = 0; r < NR; ++r)
        for (int c = 0; c < NV; ++c)
            acc[r][c] = (LA_FN(vec)){0};
    for (int64_t i = 0; i < d; ++i) {
        LA_FN(vec) kk[4];
        for (int c = 0; c < NV; ++c)
            memcpy(&kk[c], kv + i * e + c * LA_VLEN, sizeof kk[c]);
        for (int r = 0; r < NR; ++r) {
            const REAL s = p[r * d + i];
            for (int c = 0; c < NV; ++c)
                acc[r][c] += s * kk[c];
        }
    }
    if (!pol->castling) {
        for (int r = 0; r < NR; ++r)
            for (int c = 0; c < NV; ++c) {
                acc[r][c] /= den[r];
                memcpy(o + r * e + c * LA_VLEN, &acc[r][c], sizeof acc[r][c]);
            }
    } else {
        /* Castling-ViT Eq. 9: H = 1/2 c + (1/pi) num (then / den with the similarity sum); the constant's
         * row is cb + r cs (cs = 0: the half value sum shared by every query). */
        for (int r = 0; r < NR; ++r)
            for (int c = 0; c < NV; ++c) {
                LA_FN(vec) cv;
                memcpy(&cv, cb + r * cs + c * LA_VLEN, sizeof cv);
                LA_FN(vec) hv = (REAL)0.5 * cv + (REAL)LA_INV_PI * acc[r][c];
                if (pol->simsum)
                    hv /= den[r];
                memcpy(o + r * e + c * LA_VLEN, &hv, sizeof hv);
            }
    }
}

static REFIMPL_INLINE void LA_FN(la_out_rows)(REAL *restrict o, const REAL *restrict p, const REAL *restrict kv,
                                              const REAL *restrict den, int64_t d, int64_t e,
                                              const REAL *restrict cb, int64_t cs, const struct la_policy *pol,
                                              const int NR, const int NV)
{
    int64_t j = 0;
    for (; j + NV * LA_VLEN <= e; j += NV * LA_VLEN)
        LA_FN(la_out_tile)(o + j, p, kv + j, den, d, e, cb + j, cs, pol, NR, NV);
    for (; j + LA_VLEN <= e; j += LA_VLEN)
        LA_FN(la_out_tile)(o + j, p, kv + j, den, d, e, cb + j, cs, pol, NR, 1);
    for (; j < e; ++j) {
        for (int r = 0; r < NR; ++r) {
            REAL a = 0;
            for (int64_t i = 0; i < d; ++i)
                a += p[r * d + i] * kv[i * e + j];
            o[r * e + j] = LA_FN(la_epi1)(a, den[r], cb + r * cs + j, pol);
        }
    }
}

/* Pass 2 for T query tokens of one head: q (T x d) -> o (T x e); kv (d x e) and ks (d) the reduced sums;
 * scratch holds LA_TB x d + LA_TB elements. */
/* Pass 2 for T query tokens of one head: q (T x d) -> o (T x e); kv (d x e), ks (d) and vs (e) the
 * reduced sums; vown (T x e) the queries' own value rows (Castling "own"); scratch holds LA_TB x d +
 * LA_TB elements. */
LA_TARGET static void LA_FN(la_pass2)(REAL *restrict o, REAL *restrict scratch, const REAL *restrict q,
                                      const REAL *restrict kv, const REAL *restrict ks, const REAL *restrict vs,
                                      const REAL *restrict vown, int64_t T, int64_t d, int64_t e,
                                      const struct la_policy *pol)
{
    REAL *den = scratch + LA_TB * d;
    for (int64_t t0 = 0; t0 < T; t0 += LA_TB) {
        const int64_t tb = T - t0 < LA_TB ? T - t0 : LA_TB;
        LA_FN(la_stage)(scratch, q + t0 * d, tb, d, pol);
        if (!pol->castling || pol->simsum) {
            for (int64_t t = 0; t < tb; ++t) {
                REAL a = 0;
                for (int64_t i = 0; i < d; ++i)
                    a += scratch[t * d + i] * ks[i];
                den[t] = pol->castling ? (REAL)((double)pol->M / 2.0) + (REAL)LA_INV_PI * a
                                       : LA_FN(la_norm)(a, pol);
            }
        }
        const REAL *cb = pol->own ? vown + t0 * e : vs;
        const int64_t cs = pol->own ? e : 0;
        REAL *ob = o + t0 * e;
        int64_t t = 0;
#if VBYTES == 64
        if (e >= 4 * LA_VLEN) {
            for (; t + 4 <= tb; t += 4)
                LA_FN(la_out_rows)(ob + t * e, scratch + t * d, kv, den + t, d, e, cb + t * cs, cs, pol, 4, 4);
        } else {
            for (; t + 8 <= tb; t += 8)
                LA_FN(la_out_rows)(ob + t * e, scratch + t * d, kv, den + t, d, e, cb + t * cs, cs, pol, 8, 2);
        }
#else
        for (; t + 4 <= tb; t += 4)
            LA_FN(la_out_rows)(ob + t * e, scratch + t * d, kv, den + t, d, e, cb + t * cs, cs, pol, 4, 2);
#endif
        for (; t < tb; ++t)
            LA_FN(la_out_rows)(ob + t * e, scratch + t * d, kv, den + t, d, e, cb + t * cs, cs, pol, 1, 2);
    }
}

#undef LA_IS_FLOAT
#undef LA_VLEN
#undef LA_FN
#undef LA_CAT
#undef LA_CAT2
