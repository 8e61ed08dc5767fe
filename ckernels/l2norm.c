/*
 * Row-wise L2 normalisation over the last axis, float64.  Plain C99 with libm (sqrt); no allocation; int status.
 *
 *   int refimpl_l2_normalize_f64(out, x, rows, d, eps, policy, nthreads)
 *   int refimpl_l2_normalize_plain_f64(out, x, rows, d, eps, policy)
 *
 *   out     (rows, d)  written completely on success, untouched on a nonzero status; must not overlap x
 *   x       (rows, d)  C order, any float64 values (NaN, +-Inf, subnormals included)
 *   eps     finite and >= 0;  policy  0 "clamp" (x / max(||x||, eps)), 1 "add" (x / (||x|| + eps)), 2 "none"
 *           (x / ||x||)
 *   nthreads  threads to use (>= 1; capped at PAR_MAX_THREADS and at the number of work items)
 *
 * The NumPy definition is refimpl.numerics.l2_normalize (axis = -1), per row:
 *
 *   m      = max_i |x_i|                    (NaN if a NaN is in the row: np.max propagates it)
 *   safe_m = m if m > 0 else 1
 *   norm   = m * sqrt(sum_i (x_i / safe_m) * (x_i / safe_m))     (LAPACK dnrm2's scaling: no over/underflow)
 *   norm   = +Inf where m is +Inf
 *   y_i    = x_i / max(norm, eps)  |  x_i / (norm + eps)  |  x_i / norm      (max propagating NaN)
 *
 * Both kernels perform these operations, in this order, each a separately rounded IEEE operation (-fno-fast-math
 * -ffp-contract=off); they differ from the definition only in the order of the one sum (NumPy: pairwise; the plain
 * version: recursive; the fast one: four interleaved partial sums added pairwise, then the tail), so within the
 * rounding bound of the definition (refimpl.layers.l2_normalize_bound: gamma_(d+5) |y|), not bit for bit.  The
 * maximum is exact and the special values follow from the same operations: a row with a NaN is NaN, a row with
 * an infinity gives 0 for its finite entries and NaN for its infinities (x / Inf), a zero row gives 0 ("clamp"
 * with eps > 0, "add") or NaN (0 / 0: "none", or eps = 0).
 *
 * Threading.  Work items are blocks of about L2_BLOCK_ELEMS elements (whole rows), claimed through the package's
 * one parallel runtime (ckernels/parallel.h); a row is computed by one thread whatever the thread count, so no bit
 * depends on it.  Calls under L2_PARALLEL_MIN elements run on the calling thread.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "parallel.h"
#include "refimpl_kernels.h"

#define L2_BLOCK_ELEMS 16384
#define L2_PARALLEL_MIN 262144   /* a few ns per element: below it a thread costs more than it saves */

/* The quotient's denominator of each policy, max propagating NaN as np.maximum does. */
static double l2_denominator(double norm, double eps, int policy)
{
    if (policy == 0)
        return (norm != norm || norm > eps) ? norm : eps;
    if (policy == 1)
        return norm + eps;
    return norm;
}

/* max_i |x_i|, NaN as soon as an entry is NaN (as np.max: the comparison alone would skip it). */
static double l2_max_abs(const double *x, int64_t d)
{
    double m = 0.0;
    for (int64_t i = 0; i < d; ++i) {
        const double a = fabs(x[i]);
        if (a != a)
            return a;
        if (a > m)
            m = a;
    }
    return m;
}

/* One row, fast: the maximum (NaN-propagating), the scaled squares in four interleaved partial sums, the quotient. */
static void l2_row(double *restrict out, const double *restrict x, int64_t d, double eps, int policy)
{
    const double m = l2_max_abs(x, d);
    const double safe = (m > 0.0) ? m : 1.0;
    const int64_t body = d - d % 4;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t i = 0; i < body; i += 4) {
        const double t0 = x[i] / safe, t1 = x[i + 1] / safe, t2 = x[i + 2] / safe, t3 = x[i + 3] / safe;
        s0 += t0 * t0;
        s1 += t1 * t1;
        s2 += t2 * t2;
        s3 += t3 * t3;
    }
    double s = (s0 + s1) + (s2 + s3);
    for (int64_t i = body; i < d; ++i) {
        const double t = x[i] / safe;
        s += t * t;
    }
    double norm = m * sqrt(s);
    if (isinf(m))
        norm = INFINITY;
    const double den = l2_denominator(norm, eps, policy);
    for (int64_t i = 0; i < d; ++i)
        out[i] = x[i] / den;
}

struct l2_job {
    double *out;
    const double *x;
    int64_t rows, d, rows_per_item;
    double eps;
    int policy;
};

static void l2_item(void *ctx, int64_t phase, int64_t it, int64_t tid)
{
    (void)phase;
    (void)tid;
    const struct l2_job *j = (const struct l2_job *)ctx;
    const int64_t r0 = it * j->rows_per_item;
    const int64_t r1 = (r0 + j->rows_per_item < j->rows) ? r0 + j->rows_per_item : j->rows;
    for (int64_t r = r0; r < r1; ++r)
        l2_row(j->out + r * j->d, j->x + r * j->d, j->d, j->eps, j->policy);
}

static int l2_check(const double *out, const double *x, int64_t rows, int64_t d, double eps, int policy)
{
    if (out == 0 || x == 0)
        return REFIMPL_ERR_NULL;
    if (rows < 1 || d < 1)
        return REFIMPL_ERR_SIZE;
    if (rows > PTRDIFF_MAX / (int64_t)sizeof(double) / d)
        return REFIMPL_ERR_OVERFLOW;
    if (!(eps >= 0.0) || eps > 1.7976931348623157e308 || policy < 0 || policy > 2)
        return REFIMPL_ERR_OPTION;
    return REFIMPL_OK;
}

int refimpl_l2_normalize_f64(double *out, const double *x, int64_t rows, int64_t d, double eps, int policy,
                             int64_t nthreads)
{
    const int st = l2_check(out, x, rows, d, eps, policy);
    if (st != REFIMPL_OK)
        return st;
    struct l2_job j;
    j.out = out;
    j.x = x;
    j.rows = rows;
    j.d = d;
    j.eps = eps;
    j.policy = policy;
    j.rows_per_item = (L2_BLOCK_ELEMS / d > 1) ? L2_BLOCK_ELEMS / d : 1;
    int64_t items = (rows + j.rows_per_item - 1) / j.rows_per_item;
    int64_t nt = nthreads < 1 ? 1 : nthreads;   /* par_run caps it at PAR_MAX_THREADS */
    if (nt > items)
        nt = items;
    if (rows * d < L2_PARALLEL_MIN)
        nt = 1;
    par_run(&j, 1, &items, l2_item, 0, nt);
    return REFIMPL_OK;
}

/* The plain version: the same operations, the sum in the recursive order, one thread (the specification). */
int refimpl_l2_normalize_plain_f64(double *out, const double *x, int64_t rows, int64_t d, double eps, int policy)
{
    const int st = l2_check(out, x, rows, d, eps, policy);
    if (st != REFIMPL_OK)
        return st;
    for (int64_t r = 0; r < rows; ++r) {
        const double *xr = x + r * d;
        const double m = l2_max_abs(xr, d);
        const double safe = (m > 0.0) ? m : 1.0;
        double s = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            const double t = xr[i] / safe;
            s += t * t;
        }
        double norm = m * sqrt(s);
        if (isinf(m))
            norm = INFINITY;
        const double den = l2_denominator(norm, eps, policy);
        for (int64_t i = 0; i < d; ++i)
            out[r * d + i] = xr[i] / den;
    }
    return REFIMPL_OK;
}
