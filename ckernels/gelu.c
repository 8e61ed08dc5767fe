/*
 * GELU, element-wise, float64.  Plain C99 with libm; no allocation; int status return.
 *
 *   int refimpl_gelu_f64(out, x, n, approximate, nthreads)
 *
 *   out  (n,)  written completely on success, untouched on a nonzero status; may be x itself (in place:
 *              each element is read before it is written, and no other element is touched)
 *   x    (n,)  any float64 values (NaN, +-Inf, subnormals included)
 *   approximate  0 (GELU_ERF): the exact form, or 1 (GELU_TANH): the tanh form
 *   nthreads     threads to use (>= 1; capped at GELU_MAX_THREADS and at the number of work items)
 *
 * The NumPy definition is refimpl.numerics.gelu; this kernel performs its operations, in its order, on each
 * element, with libm's erf / tanh in place of scipy.special.erf / np.tanh:
 *
 *   exact ("none"):  y = (0.5 * x) * (1.0 + erf(x / sqrt(2.0)))
 *   tanh:            y = (0.5 * x) * (1.0 + tanh(c * (x + ((k * x) * x) * x))),  c = sqrt(2 / pi),
 *                    k = 0.044715 (config.GELU_TANH_COEF)
 *
 * x / sqrt(2.0) is a division by the double nearest sqrt 2, as in the definition (not a product with
 * M_SQRT1_2, which rounds differently).  The build's -fno-fast-math -ffp-contract=off keep every product,
 * sum and quotient a separately rounded IEEE operation (no FMA, no reciprocal), so the result differs from
 * the definition's only through erf (tanh): both libm's and SciPy's are within an ulp or two, the error
 * model assumes config.ELEMENTARY_FUNCTION_ULPS (refimpl.layers.gelu_bound), and the IEEE special values
 * come out of the same operations exactly as in the definition: gelu(+-0) = +-0, gelu(+Inf) = +Inf,
 * gelu(-Inf) = (-Inf) * 0 = NaN (the definition's value, which it inherits from IEEE), NaN -> NaN, and for
 * x << 0, where erf(x / sqrt 2) = -1 exactly, (0.5 x) * 0 = -0.
 *
 * Threading.  Work items are blocks of GELU_BLOCK elements, claimed one at a time from an atomic counter by
 * POSIX threads created for the call and joined at its end (the pattern of ckernels/linattn.c); a thread
 * that cannot be created claims nothing.  The map is element-wise, so the result does not depend on the
 * thread count or on which thread ran which block.  Calls under GELU_PARALLEL_MIN elements run on the
 * calling thread (creating a thread costs some 10-50 us; an element costs some 10-20 ns).
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

#define GELU_ERF 0   /* approximate="none" */
#define GELU_TANH 1  /* approximate="tanh" */
#define GELU_MAX_THREADS 64
#define GELU_BLOCK 16384
#define GELU_PARALLEL_MIN 32768

/* tanh form: c = sqrt(2/pi) and the cubic coefficient, as the definition forms them (math.sqrt(2 / pi) and
 * config.GELU_TANH_COEF). */
#define GELU_TANH_COEF 0.044715

static void gelu_erf_run(double *out, const double *x, int64_t n)
{
    const double s2 = sqrt(2.0);
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double half = 0.5 * v;
        out[i] = half * (1.0 + erf(v / s2));
    }
}

static void gelu_tanh_run(double *out, const double *x, int64_t n)
{
    const double c = sqrt(2.0 / 3.141592653589793);
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double cube = ((GELU_TANH_COEF * v) * v) * v;
        const double half = 0.5 * v;
        out[i] = half * (1.0 + tanh(c * (v + cube)));
    }
}

struct gelu_job {
    double *out;
    const double *x;
    int64_t n;
    int64_t items;
    int approximate;
    int64_t next;
};

static void gelu_block(const struct gelu_job *j, int64_t it)
{
    const int64_t i0 = it * GELU_BLOCK;
    const int64_t len = (j->n - i0 < GELU_BLOCK) ? j->n - i0 : GELU_BLOCK;
    if (j->approximate == GELU_TANH)
        gelu_tanh_run(j->out + i0, j->x + i0, len);
    else
        gelu_erf_run(j->out + i0, j->x + i0, len);
}

static void *gelu_thread(void *p)
{
    struct gelu_job *j = (struct gelu_job *)p;
    for (;;) {
        const int64_t it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (it >= j->items)
            break;
        gelu_block(j, it);
    }
    return 0;
}

int refimpl_gelu_f64(double *out, const double *x, int64_t n, int approximate, int64_t nthreads)
{
    if (out == 0 || x == 0)
        return REFIMPL_ERR_NULL;
    if (n < 1)
        return REFIMPL_ERR_SIZE;
    if (n > PTRDIFF_MAX / (int64_t)sizeof(double) - GELU_BLOCK)
        return REFIMPL_ERR_OVERFLOW;
    if (approximate != GELU_ERF && approximate != GELU_TANH)
        return REFIMPL_ERR_OPTION;
    struct gelu_job j;
    j.out = out;
    j.x = x;
    j.n = n;
    j.items = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    j.approximate = approximate;
    j.next = 0;
    int64_t nt = nthreads < 1 ? 1 : (nthreads > GELU_MAX_THREADS ? GELU_MAX_THREADS : nthreads);
    if (nt > j.items)
        nt = j.items;
    if (n < GELU_PARALLEL_MIN)
        nt = 1;
    pthread_t th[GELU_MAX_THREADS];
    int started[GELU_MAX_THREADS];
    for (int64_t t = 1; t < nt; ++t)
        started[t] = pthread_create(&th[t], 0, gelu_thread, &j) == 0;
    gelu_thread(&j);
    for (int64_t t = 1; t < nt; ++t)
        if (started[t])
            pthread_join(th[t], 0);
    return REFIMPL_OK;
}
