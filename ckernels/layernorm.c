/*
 * LayerNorm over the last axis, float64.  Plain C99 with libm (sqrt); no allocation; int status return.
 *
 *   int refimpl_layer_norm_f64(out, flagged, x, weight, bias, rows, n, eps, nthreads)
 *   int refimpl_layer_norm_plain_f64(out, x, weight, bias, rows, n, eps)
 *
 *   out     (rows, n)  written completely on success except in the flagged rows; untouched on a nonzero
 *                      status; must not overlap x
 *   flagged (1,)  refimpl_layer_norm_f64 only: set to the number of rows holding an entry above 2^256 or an
 *                 infinite one, which are left unwritten (the wrapper then gives the call to the definition)
 *   x       (rows, n)  C order, any float64 values
 *   weight  (n,) or NULL (no scale), bias (n,) or NULL (no shift)
 *   eps     finite and >= 0 (the wrapper checks it; the kernel refuses NaN and negative values)
 *   nthreads  threads to use (>= 1; capped at PAR_MAX_THREADS and at the number of work items)
 *
 * The NumPy definition is refimpl.layers.layer_norm (Ba et al. 2016; torch.nn.LayerNorm), per row:
 *
 *   mu  = (sum_i x_i) / n                  (np.mean)
 *   d_i = x_i - mu
 *   var = (sum_i d_i * d_i) / n            (np.mean, the biased variance, two passes)
 *   y_i = d_i / sqrt(var + eps)  [* w_i]  [+ b_i]
 *
 * Both kernels perform these operations, in this order, each a separately rounded IEEE operation (the build's
 * -fno-fast-math -ffp-contract=off: no FMA, no reciprocal in place of the quotient).  They differ from the
 * definition only in the order of the two sums: NumPy's pairwise summation there; here, in the plain version,
 * the recursive order x_0 + x_1 + ... ; in the fast version, LN_LANES interleaved partial sums (lane l adds
 * x_l, x_(l + LN_LANES), ..., the lanes then added pairwise and the tail recursively).  Every order is inside
 * the definition's error model (refimpl.layers.layer_norm_bound: gamma_(n+1) for the mean and the sum of
 * squares, whatever the order; Higham 2002, eq. 4.4), so the kernels agree with the definition within the
 * bound, not bit for bit.  The lanes are independent sums, which the compiler may evaluate in one vector
 * register with the same roundings.  The IEEE special values follow from the operations as in the definition:
 * a NaN in a row makes the whole row NaN.  The fast kernel finds, in its first pass, the rows holding an entry
 * above 2^256 (config.RANGE_RESCALE_EXPONENT) or an infinite one and counts them instead of computing them; the
 * wrapper (refimpl.backends._c_elementwise.layer_norm) then answers with the definition, so the kernel never
 * sums magnitudes where n |x|^2 could overflow and needs no separate range scan.  (The plain version computes
 * every row; its wrapper scans the input first.)
 *
 * Threading.  Work items are blocks of LN_BLOCK_ELEMS / n rows (at least one row), claimed through the package's
 * one parallel runtime (ckernels/parallel.h, par_run).  Each row is computed by one thread with the same
 * operations whatever the thread count, so the result does not depend on it.  Calls under LN_PARALLEL_MIN
 * elements run on the calling thread.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "parallel.h"
#include "refimpl_kernels.h"

#define LN_LANES 4   /* the partial sums s0..s3 / q0..q3 of LN_ROW_FN */
#define LN_BLOCK_ELEMS 16384
#define LN_PARALLEL_MIN 262144   /* about 0.3 ms of work on one thread: below it a thread costs more than it saves */
/* 2^256 (config.RANGE_RESCALE_EXPONENT): a row with an entry above it (or infinite) is not computed here (the
 * wrapper gives the whole call to the definition); within it n x^2 cannot overflow. */
#define LN_BAND 1.157920892373162e77
/* max(m, a) as MAXPD computes it (a NaN a leaves m), so that the lanes vectorise; NaN rows are NaN anyway. */
#define LN_MAX(m, a) ((a) > (m) ? (a) : (m))

/* The instruction-set levels (as ckernels/dwconv2d.c and gelu.c): the row function is compiled once per level
 * through target attributes and the level in use chosen by refimpl_isa_in_use(); every level performs the
 * same IEEE operations and returns the same bits (only the width of the registers holding the lanes differs). */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(REFIMPL_NO_ISA_DISPATCH)
#define REFIMPL_LN_X86 1
#else
#define REFIMPL_LN_X86 0
#endif

/* One row: the definition's operations, fused into three passes (the sum of x; d_i = x_i - mu written to out
 * while the squares are summed; the quotient, scale and shift).  Each sum in LN_LANES interleaved partial sums
 * (lane l takes the entries l, l + LN_LANES, ...), the lanes added pairwise, then the tail in order. */
#define LN_ROW_FN(NAME, ATTR)                                                                             \
    ATTR static int NAME(double *restrict out, const double *restrict x, const double *restrict w,         \
                         const double *restrict b, int64_t n, double eps)                                 \
    {                                                                                                      \
        const int64_t body = n - n % LN_LANES;                                                             \
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, m0 = 0.0, m1 = 0.0, m2 = 0.0, m3 = 0.0;             \
        for (int64_t i = 0; i < body; i += LN_LANES) {                                                     \
            s0 += x[i];                                                                                    \
            s1 += x[i + 1];                                                                                \
            s2 += x[i + 2];                                                                                \
            s3 += x[i + 3];                                                                                \
            m0 = LN_MAX(m0, fabs(x[i]));                                                                   \
            m1 = LN_MAX(m1, fabs(x[i + 1]));                                                               \
            m2 = LN_MAX(m2, fabs(x[i + 2]));                                                               \
            m3 = LN_MAX(m3, fabs(x[i + 3]));                                                               \
        }                                                                                                  \
        double s = (s0 + s1) + (s2 + s3), m = LN_MAX(LN_MAX(m0, m1), LN_MAX(m2, m3));                    \
        for (int64_t i = body; i < n; ++i) {                                                               \
            s += x[i];                                                                                     \
            m = LN_MAX(m, fabs(x[i]));                                                                     \
        }                                                                                                  \
        if (m > LN_BAND)                                                                                   \
            return 1;                                                                                      \
        const double mu = s / (double)n;                                                                   \
        double q0 = 0.0, q1 = 0.0, q2 = 0.0, q3 = 0.0;                                                     \
        for (int64_t i = 0; i < body; i += LN_LANES) {                                                     \
            const double d0 = x[i] - mu, d1 = x[i + 1] - mu, d2 = x[i + 2] - mu, d3 = x[i + 3] - mu;       \
            out[i] = d0;                                                                                   \
            out[i + 1] = d1;                                                                               \
            out[i + 2] = d2;                                                                               \
            out[i + 3] = d3;                                                                               \
            q0 += d0 * d0;                                                                                 \
            q1 += d1 * d1;                                                                                 \
            q2 += d2 * d2;                                                                                 \
            q3 += d3 * d3;                                                                                 \
        }                                                                                                  \
        double q = (q0 + q1) + (q2 + q3);                                                                  \
        for (int64_t i = body; i < n; ++i) {                                                               \
            const double d = x[i] - mu;                                                                    \
            out[i] = d;                                                                                    \
            q += d * d;                                                                                    \
        }                                                                                                  \
        const double sd = sqrt(q / (double)n + eps);                                                       \
        if (w != 0 && b != 0)                                                                              \
            for (int64_t i = 0; i < n; ++i)                                                                \
                out[i] = (out[i] / sd) * w[i] + b[i];                                                      \
        else if (w != 0)                                                                                   \
            for (int64_t i = 0; i < n; ++i)                                                                \
                out[i] = (out[i] / sd) * w[i];                                                             \
        else if (b != 0)                                                                                   \
            for (int64_t i = 0; i < n; ++i)                                                                \
                out[i] = out[i] / sd + b[i];                                                               \
        else                                                                                               \
            for (int64_t i = 0; i < n; ++i)                                                                \
                out[i] = out[i] / sd;                                                                      \
        return 0;                                                                                          \
    }
LN_ROW_FN(ln_row_base, )
#if REFIMPL_LN_X86
LN_ROW_FN(ln_row_avx2, __attribute__((target("avx2"))))
LN_ROW_FN(ln_row_avx512, __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw"))))
#endif

typedef int (*ln_row_fn)(double *restrict, const double *restrict, const double *restrict,
                          const double *restrict, int64_t, double);

static ln_row_fn ln_pick(void)
{
#if REFIMPL_LN_X86
    const int isa = refimpl_isa_in_use();
    if (isa >= REFIMPL_ISA_AVX512)
        return ln_row_avx512;
    if (isa >= REFIMPL_ISA_AVX2)
        return ln_row_avx2;
#endif
    return ln_row_base;
}

struct ln_job {
    double *out;
    const double *x, *w, *b;
    int64_t rows, n, rows_per_item;
    double eps;
    ln_row_fn row;      /* the row function of the instruction-set level in use */
    int64_t flagged;    /* rows with an entry above LN_BAND (atomic) */
};

static void ln_item(void *ctx, int64_t phase, int64_t it, int64_t tid)
{
    (void)phase;
    (void)tid;
    const struct ln_job *j = (const struct ln_job *)ctx;
    const int64_t r0 = it * j->rows_per_item;
    const int64_t r1 = (r0 + j->rows_per_item < j->rows) ? r0 + j->rows_per_item : j->rows;
    int64_t flagged = 0;
    for (int64_t r = r0; r < r1; ++r)
        flagged += j->row(j->out + r * j->n, j->x + r * j->n, j->w, j->b, j->n, j->eps);
    if (flagged)
        __atomic_fetch_add(&((struct ln_job *)ctx)->flagged, flagged, __ATOMIC_RELAXED);
}

static int ln_check(const double *out, const double *x, int64_t rows, int64_t n, double eps)
{
    if (out == 0 || x == 0)
        return REFIMPL_ERR_NULL;
    if (rows < 1 || n < 1)
        return REFIMPL_ERR_SIZE;
    if (rows > PTRDIFF_MAX / (int64_t)sizeof(double) / n)
        return REFIMPL_ERR_OVERFLOW;
    if (!(eps >= 0.0) || eps > 1.7976931348623157e308)   /* NaN, negative or infinite */
        return REFIMPL_ERR_OPTION;
    return REFIMPL_OK;
}

int refimpl_layer_norm_f64(double *out, int64_t *flagged, const double *x, const double *weight, const double *bias,
                           int64_t rows, int64_t n, double eps, int64_t nthreads)
{
    const int st = ln_check(out, x, rows, n, eps);
    if (st != REFIMPL_OK)
        return st;
    if (flagged == 0)
        return REFIMPL_ERR_NULL;
    struct ln_job j;
    j.out = out;
    j.x = x;
    j.w = weight;
    j.b = bias;
    j.rows = rows;
    j.n = n;
    j.eps = eps;
    j.row = ln_pick();
    j.flagged = 0;
    j.rows_per_item = (LN_BLOCK_ELEMS / n > 1) ? LN_BLOCK_ELEMS / n : 1;
    int64_t items = (rows + j.rows_per_item - 1) / j.rows_per_item;
    int64_t nt = nthreads < 1 ? 1 : nthreads;     /* par_run caps it at PAR_MAX_THREADS */
    if (nt > items)
        nt = items;
    if (rows * n < LN_PARALLEL_MIN)
        nt = 1;
    par_run(&j, 1, &items, ln_item, 0, nt);
    *flagged = j.flagged;
    return REFIMPL_OK;
}

/* The plain version: the same operations with both sums in the recursive order, one thread: the fast kernel's
 * specification (tests/test_kernels_layer_norm.py). */
int refimpl_layer_norm_plain_f64(double *out, const double *x, const double *weight, const double *bias,
                                 int64_t rows, int64_t n, double eps)
{
    const int st = ln_check(out, x, rows, n, eps);
    if (st != REFIMPL_OK)
        return st;
    for (int64_t r = 0; r < rows; ++r) {
        const double *xr = x + r * n;
        double *yr = out + r * n;
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i)
            s += xr[i];
        const double mu = s / (double)n;
        double q = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            yr[i] = xr[i] - mu;
            q += yr[i] * yr[i];
        }
        const double sd = sqrt(q / (double)n + eps);
        for (int64_t i = 0; i < n; ++i) {
            double y = yr[i] / sd;
            if (weight != 0)
                y = y * weight[i];
            if (bias != 0)
                y = y + bias[i];
            yr[i] = y;
        }
    }
    return REFIMPL_OK;
}
