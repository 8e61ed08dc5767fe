/*
 * The range scan of the C wrappers: three order statistics of a float64 array in one pass.  Plain C99, one
 * thread, no allocation; int status return.
 *
 *   int refimpl_range_scan_f64(double *stats, const double *x, int64_t n)
 *   int refimpl_range_scan_plain_f64(double *stats, const double *x, int64_t n)   (the scalar loop alone)
 *
 *   stats (3,)  written on success:
 *                 stats[0] = max |x_i|                 (0 for an empty array)
 *                 stats[1] = min |x_i| over x_i != 0   (+Inf where no entry is nonzero)
 *                 stats[2] = min x_i                   (+Inf for an empty array; where it is 0, its sign is
 *                                                       whichever zero the comparisons kept)
 *               NaN entries take no part in any of the three (a NaN is neither above nor below anything
 *               here); +-Inf do (max |x| = +Inf, min x = -Inf).
 *   x    (n,)   any float64 values
 *
 * What it is for (refimpl/backends/_c.py): before a range-checked kernel runs, the wrapper asks whether an
 * input may leave the kernels' range (max |x| above 2^B), whether one has a nonzero entry below 2^-B (the
 * groups the NumPy definition scales up), and, for ELU + 1 features, how far below 0 the smallest input goes
 * (refimpl.backends._c_linear.elu1_underflows); the NumPy definition then answers instead of the kernel.
 * The NumPy twin, the specification, is refimpl.backends._c.range_stats_numpy: np.nanmax(|x|), the
 * minimum of |x| over the nonzero non-NaN entries, np.nanmin(x).  Every value here is one of x's entries or
 * its absolute value (comparisons and fabs, no arithmetic), so the scan, its plain scalar version
 * (refimpl_range_scan_plain_f64) and its twin agree exactly, bit for bit (tests/test_kernels_scan.py).
 *
 * Why in C: the wrappers ask these questions of three to five arrays per attention call, and NumPy needs a
 * temporary or a slow reduction per statistic (np.einsum("i,i->") on 38k entries took 70 us, np.abs(x).min()
 * 65 us plus the temporary); this loop takes one pass over the data, with no temporary.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* The statistics of entries [i0, n) folded into top, low, least (one scalar step per entry: the plain loop,
 * and the tail of the vector one). */
static void scan_scalar(const double *x, int64_t i0, int64_t n, double *top, double *low, double *least)
{
    for (int64_t i = i0; i < n; ++i) {
        const double xi = x[i];
        const double a = fabs(xi);
        const double nz = a > 0.0 ? a : INFINITY;   /* 0 and NaN -> +Inf: no part in the minimum */
        *top = a > *top ? a : *top;                 /* a NaN compares false: top stays */
        *low = nz < *low ? nz : *low;
        *least = xi < *least ? xi : *least;
    }
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* SSE2 (baseline on x86-64): SCAN_VECTORS independent 2-lane accumulators, entries i = 2 j + lane in
 * accumulator j mod SCAN_VECTORS, merged at the end (order statistics: the merge order changes no value).
 * MAXPD / MINPD (a, b) return a where a > b (a < b), else b, also where either is NaN: the scalar loop's
 * "a > top ? a : top" exactly (Intel SDM, MAXPD / MINPD), so a NaN entry leaves the statistics unchanged. */
#define SCAN_VECTORS 4

static int64_t scan_vector(const double *x, int64_t n, double *top, double *low, double *least)
{
    const __m128d sign = _mm_set1_pd(-0.0), zero = _mm_setzero_pd(), inf = _mm_set1_pd(INFINITY);
    __m128d vt[SCAN_VECTORS], vl[SCAN_VECTORS], vm[SCAN_VECTORS];
    for (int j = 0; j < SCAN_VECTORS; ++j) {
        vt[j] = zero;
        vl[j] = inf;
        vm[j] = inf;
    }
    int64_t i = 0;
    for (; i + 2 * SCAN_VECTORS <= n; i += 2 * SCAN_VECTORS) {
        for (int j = 0; j < SCAN_VECTORS; ++j) {
            const __m128d xi = _mm_loadu_pd(x + i + 2 * j);
            const __m128d a = _mm_andnot_pd(sign, xi);                         /* |x| */
            const __m128d pos = _mm_cmpgt_pd(a, zero);                          /* false for 0, NaN */
            const __m128d nz = _mm_or_pd(_mm_and_pd(pos, a), _mm_andnot_pd(pos, inf));
            vt[j] = _mm_max_pd(a, vt[j]);
            vl[j] = _mm_min_pd(nz, vl[j]);
            vm[j] = _mm_min_pd(xi, vm[j]);
        }
    }
    double lanes[2];
    for (int j = 0; j < SCAN_VECTORS; ++j) {
        _mm_storeu_pd(lanes, vt[j]);
        for (int l = 0; l < 2; ++l)
            *top = lanes[l] > *top ? lanes[l] : *top;
        _mm_storeu_pd(lanes, vl[j]);
        for (int l = 0; l < 2; ++l)
            *low = lanes[l] < *low ? lanes[l] : *low;
        _mm_storeu_pd(lanes, vm[j]);
        for (int l = 0; l < 2; ++l)
            *least = lanes[l] < *least ? lanes[l] : *least;
    }
    return i;
}
#endif

int refimpl_range_scan_f64(double *stats, const double *x, int64_t n)
{
    if (stats == NULL || (x == NULL && n > 0))
        return REFIMPL_ERR_NULL;
    if (n < 0)
        return REFIMPL_ERR_SIZE;
    double top = 0.0, low = INFINITY, least = INFINITY;
    int64_t i = 0;
#if defined(__SSE2__)
    i = scan_vector(x, n, &top, &low, &least);
#endif
    scan_scalar(x, i, n, &top, &low, &least);
    stats[0] = top;
    stats[1] = low;
    stats[2] = least;
    return REFIMPL_OK;
}

/* The plain version (the scalar loop alone), the vector path's specification beside it: tests/test_kernels_scan.py
 * checks the two and the NumPy twin agree bit for bit. */
int refimpl_range_scan_plain_f64(double *stats, const double *x, int64_t n)
{
    if (stats == NULL || (x == NULL && n > 0))
        return REFIMPL_ERR_NULL;
    if (n < 0)
        return REFIMPL_ERR_SIZE;
    double top = 0.0, low = INFINITY, least = INFINITY;
    scan_scalar(x, 0, n, &top, &low, &least);
    stats[0] = top;
    stats[1] = low;
    stats[2] = least;
    return REFIMPL_OK;
}
