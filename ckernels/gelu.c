/*
 * GELU, element-wise, float64.  Plain C99 with libm; no allocation; int status return.
 *
 *   int refimpl_gelu_f64(out, x, n, approximate, nthreads)
 *   int refimpl_erf_f64(out, x, n, impl)
 *
 *   out  (n,)  written completely on success, untouched on a nonzero status; may be x itself (in place:
 *              each element is read before it is written, and no other element is touched)
 *   x    (n,)  any float64 values (NaN, +-Inf, subnormals included)
 *   approximate  0 (GELU_ERF): the exact form with the vectorised erf of ckernels/erf_vec.h, 1 (GELU_TANH):
 *                the tanh form, or 2 (GELU_ERF_LIBM): the exact form with libm's scalar erf (the plain
 *                version, kept beside the fast one for testing and timing)
 *   nthreads     threads to use (>= 1; capped at PAR_MAX_THREADS and at the number of work items)
 *   impl         refimpl_erf_f64 only: 0 the vectorised erf (ri_erf), 1 libm's erf; out = erf(x), for the
 *                accuracy tests of the erf itself
 *
 * The NumPy definition is refimpl.numerics.gelu; this kernel performs its operations, in its order, on each
 * element, with an erf / tanh in place of scipy.special.erf / np.tanh:
 *
 *   exact ("none"):  y = (0.5 * x) * (1.0 + erf(x / sqrt(2.0)))
 *   tanh:            y = (0.5 * x) * (1.0 + tanh(c * (x + ((k * x) * x) * x))),  c = sqrt(2 / pi),
 *                    k = 0.044715 (config.GELU_TANH_COEF)
 *
 * x / sqrt(2.0) is a division by the double nearest sqrt 2, as in the definition (not a product with
 * M_SQRT1_2, which rounds differently).  The build's -fno-fast-math -ffp-contract=off keep every product,
 * sum and quotient a separately rounded IEEE operation (no FMA, no reciprocal), so the result differs from
 * the definition's only through erf (tanh): ri_erf is within about 1 ulp (ckernels/erf_vec.h; measured by
 * tests/test_kernels_gelu.py), libm's and SciPy's within an ulp or two, and the error model assumes
 * config.ELEMENTARY_FUNCTION_ULPS (refimpl.layers.gelu_bound).  The IEEE special values come out of the
 * same operations exactly as in the definition: gelu(+-0) = +-0, gelu(+Inf) = +Inf, gelu(-Inf) = (-Inf) * 0
 * = NaN (the definition's value, which it inherits from IEEE), NaN -> NaN, and for x << 0, where
 * erf(x / sqrt 2) = -1 exactly, (0.5 x) * 0 = -0.
 *
 * Vectorisation.  ri_erf has no branch and no call, so the exact form's loop vectorises.  It is compiled
 * three times, for the instruction-set levels of ckernels/dwconv2d.c (SSE2, AVX2, AVX-512 through target
 * attributes, the level in use chosen by refimpl_isa_in_use(), capped by refimpl_set_max_isa()); all three
 * perform the same IEEE operations and return the same bits.  The loop runs on blocks of GELU_CHUNK elements
 * into a local buffer (restrict-qualified pointers that cannot alias; copied to out afterwards), which keeps
 * the in-place call (out == x) on the vector path.
 *
 * Threading.  Work items are blocks of GELU_BLOCK elements, run by the package's one parallel runtime
 * (ckernels/parallel.h, par_run: one phase, items claimed from an atomic counter; a worker that cannot be
 * created claims nothing).  The map is element-wise, so the result does not depend on the
 * thread count or on which thread ran which block.  Calls under GELU_PARALLEL_MIN elements run on the
 * calling thread (creating a thread costs some 10-50 us; an element costs a few ns with ri_erf, some
 * 10-20 ns with libm's erf).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "erf_vec.h"
#include "parallel.h"
#include "refimpl_kernels.h"

#define GELU_ERF 0   /* approximate="none" */
#define GELU_TANH 1  /* approximate="tanh" */
#define GELU_ERF_LIBM 2  /* approximate="none" with libm's erf: the plain version */
#define GELU_CHUNK 256   /* elements per call of the vectorised loop (a local buffer of 2 KiB) */
#define GELU_BLOCK 16384
#define GELU_PARALLEL_MIN 32768

/* tanh form: c = sqrt(2/pi) and the cubic coefficient, as the definition forms them (math.sqrt(2 / pi) and
 * config.GELU_TANH_COEF). */
#define GELU_TANH_COEF 0.044715

/* The instruction-set levels (as ckernels/dwconv2d.c). */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(REFIMPL_NO_ISA_DISPATCH)
#define REFIMPL_GELU_X86 1
#else
#define REFIMPL_GELU_X86 0
#endif

/* The plain version: libm's scalar erf (does not vectorise). */
static void gelu_erf_libm_run(double *out, const double *x, int64_t n)
{
    const double s2 = sqrt(2.0);
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double half = 0.5 * v;
        out[i] = half * (1.0 + erf(v / s2));
    }
}

/* The vectorised version: the same operations with ri_erf, once per instruction-set level. */
#define GELU_ERF_CHUNK_FN(NAME, ATTR)                                                                    \
    ATTR static void NAME(double *restrict out, const double *restrict x, int64_t n)                   \
    {                                                                                                   \
        const double s2 = sqrt(2.0);                                                                    \
        for (int64_t i = 0; i < n; ++i) {                                                               \
            const double v = x[i];                                                                      \
            const double half = 0.5 * v;                                                                \
            out[i] = half * (1.0 + ri_erf(v / s2));                                                     \
        }                                                                                               \
    }
#define ERF_CHUNK_FN(NAME, ATTR)                                                                         \
    ATTR static void NAME(double *restrict out, const double *restrict x, int64_t n)                   \
    {                                                                                                   \
        for (int64_t i = 0; i < n; ++i)                                                                 \
            out[i] = ri_erf(x[i]);                                                                      \
    }
GELU_ERF_CHUNK_FN(gelu_erf_chunk_base, )
ERF_CHUNK_FN(erf_chunk_base, )
#if REFIMPL_GELU_X86
GELU_ERF_CHUNK_FN(gelu_erf_chunk_avx2, __attribute__((target("avx2"))))
GELU_ERF_CHUNK_FN(gelu_erf_chunk_avx512, __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw"))))
ERF_CHUNK_FN(erf_chunk_avx2, __attribute__((target("avx2"))))
ERF_CHUNK_FN(erf_chunk_avx512, __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw"))))
#endif

typedef void (*gelu_chunk_fn)(double *restrict, const double *restrict, int64_t);

/* out[i] = f(x[i]) for the chunk function of the instruction-set level in use, GELU_CHUNK elements at a
 * time through a local buffer (out may be x). */
static void chunked_run(gelu_chunk_fn f, double *out, const double *x, int64_t n)
{
    double buf[GELU_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += GELU_CHUNK) {
        const int64_t len = (n - i0 < GELU_CHUNK) ? n - i0 : GELU_CHUNK;
        f(buf, x + i0, len);
        memcpy(out + i0, buf, (size_t)len * sizeof(double));
    }
}

/* The chunk function of the instruction-set level in use (refimpl_isa_in_use(), ckernels/dwconv2d.c). */
static gelu_chunk_fn pick(gelu_chunk_fn base, gelu_chunk_fn avx2, gelu_chunk_fn avx512)
{
    const int isa = refimpl_isa_in_use();
    if (isa >= REFIMPL_ISA_AVX512 && avx512 != 0)
        return avx512;
    if (isa >= REFIMPL_ISA_AVX2 && avx2 != 0)
        return avx2;
    return base;
}

#if REFIMPL_GELU_X86
#define PICK(stem) pick(stem##_base, stem##_avx2, stem##_avx512)
#else
#define PICK(stem) pick(stem##_base, 0, 0)
#endif

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
    gelu_chunk_fn chunk;  /* GELU_ERF: the vectorised loop of the level in use */
};

static void gelu_block(const struct gelu_job *j, int64_t it)
{
    const int64_t i0 = it * GELU_BLOCK;
    const int64_t len = (j->n - i0 < GELU_BLOCK) ? j->n - i0 : GELU_BLOCK;
    if (j->approximate == GELU_TANH)
        gelu_tanh_run(j->out + i0, j->x + i0, len);
    else if (j->approximate == GELU_ERF_LIBM)
        gelu_erf_libm_run(j->out + i0, j->x + i0, len);
    else
        chunked_run(j->chunk, j->out + i0, j->x + i0, len);
}

static void gelu_item(void *ctx, int64_t phase, int64_t it, int64_t tid)
{
    (void)phase;
    (void)tid;
    gelu_block((const struct gelu_job *)ctx, it);
}

int refimpl_gelu_f64(double *out, const double *x, int64_t n, int approximate, int64_t nthreads)
{
    if (out == 0 || x == 0)
        return REFIMPL_ERR_NULL;
    if (n < 1)
        return REFIMPL_ERR_SIZE;
    if (n > PTRDIFF_MAX / (int64_t)sizeof(double) - GELU_BLOCK)
        return REFIMPL_ERR_OVERFLOW;
    if (approximate != GELU_ERF && approximate != GELU_TANH && approximate != GELU_ERF_LIBM)
        return REFIMPL_ERR_OPTION;
    struct gelu_job j;
    j.out = out;
    j.x = x;
    j.n = n;
    j.items = (n + GELU_BLOCK - 1) / GELU_BLOCK;
    j.approximate = approximate;
    j.chunk = PICK(gelu_erf_chunk);
    int64_t nt = nthreads < 1 ? 1 : nthreads;   /* par_run caps it at PAR_MAX_THREADS */
    if (nt > j.items)
        nt = j.items;
    if (n < GELU_PARALLEL_MIN)
        nt = 1;
    par_run(&j, 1, &j.items, gelu_item, 0, nt);
    return REFIMPL_OK;
}

int refimpl_erf_f64(double *out, const double *x, int64_t n, int impl)
{
    if (out == 0 || x == 0)
        return REFIMPL_ERR_NULL;
    if (n < 1)
        return REFIMPL_ERR_SIZE;
    if (n > PTRDIFF_MAX / (int64_t)sizeof(double) - GELU_CHUNK)
        return REFIMPL_ERR_OVERFLOW;
    if (impl == 1) {
        for (int64_t i = 0; i < n; ++i)
            out[i] = erf(x[i]);
        return REFIMPL_OK;
    }
    if (impl != 0)
        return REFIMPL_ERR_OPTION;
    chunked_run(PICK(erf_chunk), out, x, n);
    return REFIMPL_OK;
}
