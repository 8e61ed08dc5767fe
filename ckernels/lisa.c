/*
 * LiSA's spectral product and contraction (LiSA Eq. 9-10), float64, threaded: the C parts of operation
 * "lisa_fft_core" (refimpl/backends/_c_lisa.py; definition refimpl.attention.lisa_cores._lisa_fft_core_numpy).
 * The transforms between them are scipy.fft's (the definition's own FFT library), called by the wrapper.
 *
 *   int refimpl_lisa_spectral_f64(out, xf, kf, M, C, D, F, shared, nthreads)
 *
 *     out[m, c, d, f] = xf[m, c, f] * kf[c or 0, d, f]        (complex, interleaved re, im; kf row 0 for every c
 *                                                              when shared: Gb's kernel, shared by the channels)
 *     the textbook complex product: re = a p - b q, im = a q + b p, each product and sum rounded once (no FMA:
 *     -ffp-contract=off); the definition's ``xf * kf`` (NumPy's loops may fuse a multiply-add) is within a
 *     rounding of each term of it.
 *
 *   int refimpl_lisa_contract_f64(st, yt, qt, ga, gb, ba, bb, M, N, C, D, nthreads)
 *
 *     st[m, d, n] = sum_c qt[m, c, n] (ga[m, c, d, n] + ba[c, d])          (c ascending from +0)
 *     yt[m, v, n] = sum_d st[m, d, n] (gb[m, v, d, n] + bb[v, d])          (d ascending from +0)
 *
 *     i.e. S = sum_c Qb (Ga + Ba), Y = sum_d S (Gb + Bb) with every tensor stored token-last (the transforms'
 *     layout), so the inner loops run over contiguous tokens and vectorise; each output element is still one
 *     recursive sum in the stated order, the plain version's (ckernels/lisa_plain.c), bit for bit.  The
 *     definition's einsum may sum in another order: the two agree within the contraction's error bound.
 *
 * Threading: one work item per head m (the rows m of the outputs), claimed through ckernels/parallel.h; no sum
 * crosses an item, so every thread count gives the same bits.  Calls under LISA_PARALLEL_MIN elements run on
 * the calling thread.  No allocation; int status (ckernels/lisa_check.h).
 */
#include <stddef.h>
#include <stdint.h>

#include "lisa_check.h"
#include "parallel.h"
#include "refimpl_kernels.h"

#define LISA_PARALLEL_MIN 32768    /* elements of the largest operand; below it one thread */

struct lisa_spectral_job {
    double *out;
    const double *xf, *kf;
    int64_t C, D, F;
    int shared;
};

static void lisa_spectral_item(void *ctx, int64_t phase, int64_t m, int64_t tid)
{
    (void)phase;
    (void)tid;
    const struct lisa_spectral_job *j = (const struct lisa_spectral_job *)ctx;
    const int64_t C = j->C, D = j->D, F = j->F;
    for (int64_t c = 0; c < C; ++c) {
        const double *restrict x = j->xf + 2 * (m * C + c) * F;
        const double *kc = j->kf + 2 * (j->shared ? 0 : c) * D * F;
        for (int64_t d = 0; d < D; ++d) {
            const double *restrict k = kc + 2 * d * F;
            double *restrict o = j->out + 2 * ((m * C + c) * D + d) * F;
            for (int64_t f = 0; f < F; ++f) {
                const double a = x[2 * f], b = x[2 * f + 1], p = k[2 * f], q = k[2 * f + 1];
                o[2 * f] = a * p - b * q;
                o[2 * f + 1] = a * q + b * p;
            }
        }
    }
}

int refimpl_lisa_spectral_f64(double *out, const double *xf, const double *kf, int64_t M, int64_t C, int64_t D,
                              int64_t F, int shared, int64_t nthreads)
{
    const int st = lisa_spectral_check(out, xf, kf, M, C, D, F);
    if (st != REFIMPL_OK)
        return st;
    struct lisa_spectral_job j = {out, xf, kf, C, D, F, shared != 0};
    int64_t nt = nthreads < 1 ? 1 : nthreads;
    if (M * C * D * F < LISA_PARALLEL_MIN)
        nt = 1;
    if (nt > M)
        nt = M;
    par_run(&j, 1, &M, lisa_spectral_item, 0, nt);
    return REFIMPL_OK;
}

struct lisa_contract_job {
    double *st, *yt;
    const double *qt, *ga, *gb, *ba, *bb;
    int64_t N, C, D;
};

static void lisa_contract_item(void *ctx, int64_t phase, int64_t m, int64_t tid)
{
    (void)phase;
    (void)tid;
    const struct lisa_contract_job *j = (const struct lisa_contract_job *)ctx;
    const int64_t N = j->N, C = j->C, D = j->D;
    double *restrict s = j->st + m * D * N;                  /* (D, N) of head m */
    double *restrict y = j->yt + m * C * N;                  /* (C, N) of head m */
    for (int64_t i = 0; i < D * N; ++i)
        s[i] = 0.0;
    for (int64_t c = 0; c < C; ++c) {                        /* S[n, d] += Qb[n, c] (Ga[n, c, d] + Ba[c, d]) */
        const double *restrict q = j->qt + (m * C + c) * N;
        for (int64_t d = 0; d < D; ++d) {
            const double *restrict g = j->ga + ((m * C + c) * D + d) * N;
            const double b = j->ba[c * D + d];
            double *restrict sd = s + d * N;
            for (int64_t n = 0; n < N; ++n)
                sd[n] += q[n] * (g[n] + b);
        }
    }
    for (int64_t v = 0; v < C; ++v) {                        /* Y[n, v] = sum_d S[n, d] (Gb[n, v, d] + Bb[v, d]) */
        double *restrict yv = y + v * N;
        for (int64_t n = 0; n < N; ++n)
            yv[n] = 0.0;
        for (int64_t d = 0; d < D; ++d) {
            const double *restrict g = j->gb + ((m * C + v) * D + d) * N;
            const double b = j->bb[v * D + d];
            const double *restrict sd = s + d * N;
            for (int64_t n = 0; n < N; ++n)
                yv[n] += sd[n] * (g[n] + b);
        }
    }
}

int refimpl_lisa_contract_f64(double *st, double *yt, const double *qt, const double *ga, const double *gb,
                              const double *ba, const double *bb, int64_t M, int64_t N, int64_t C, int64_t D,
                              int64_t nthreads)
{
    const int status = lisa_contract_check(st, yt, qt, ga, gb, ba, bb, M, N, C, D);
    if (status != REFIMPL_OK)
        return status;
    struct lisa_contract_job j = {st, yt, qt, ga, gb, ba, bb, N, C, D};
    int64_t nt = nthreads < 1 ? 1 : nthreads;
    if (M * C * D * N < LISA_PARALLEL_MIN)
        nt = 1;
    if (nt > M)
        nt = M;
    par_run(&j, 1, &M, lisa_contract_item, 0, nt);
    return REFIMPL_OK;
}
