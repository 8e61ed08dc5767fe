/*
 * LiSA's spectral product and contraction, the plain versions: straight scalar loops over each output element
 * in the order of the equations, one thread, no blocking.  The specification of refimpl_lisa_spectral_f64 and
 * refimpl_lisa_contract_f64 (ckernels/lisa.c): the same arguments, the same checks (ckernels/lisa_check.h), the
 * same operations in the same order, so the same bits.  Not registered as a backend; tests/test_kernels_lisa_c.py
 * checks them against the NumPy definition and the fast kernels against them.
 *
 *   out[m, c, d, f] = xf[m, c, f] * kf[c or 0, d, f]                     (LiSA Eq. 10, convolution theorem)
 *   st[m, d, n] = sum_{c ascending} qt[m, c, n] (ga[m, c, d, n] + ba[c, d])      (Eq. 9: S = sum_c Qb (Ga + Ba))
 *   yt[m, v, n] = sum_{d ascending} st[m, d, n] (gb[m, v, d, n] + bb[v, d])      (Eq. 9: Y = sum_d S (Gb + Bb))
 */
#include <stddef.h>
#include <stdint.h>

#include "lisa_check.h"
#include "refimpl_kernels.h"

int refimpl_lisa_spectral_plain_f64(double *out, const double *xf, const double *kf, int64_t M, int64_t C,
                                    int64_t D, int64_t F, int shared)
{
    const int st = lisa_spectral_check(out, xf, kf, M, C, D, F);
    if (st != REFIMPL_OK)
        return st;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t d = 0; d < D; ++d)
                for (int64_t f = 0; f < F; ++f) {
                    const int64_t xi = (m * C + c) * F + f;
                    const int64_t ki = ((shared ? 0 : c) * D + d) * F + f;
                    const int64_t oi = ((m * C + c) * D + d) * F + f;
                    const double a = xf[2 * xi], b = xf[2 * xi + 1];
                    const double p = kf[2 * ki], q = kf[2 * ki + 1];
                    out[2 * oi] = a * p - b * q;
                    out[2 * oi + 1] = a * q + b * p;
                }
    return REFIMPL_OK;
}

int refimpl_lisa_contract_plain_f64(double *st, double *yt, const double *qt, const double *ga, const double *gb,
                                    const double *ba, const double *bb, int64_t M, int64_t N, int64_t C, int64_t D)
{
    const int status = lisa_contract_check(st, yt, qt, ga, gb, ba, bb, M, N, C, D);
    if (status != REFIMPL_OK)
        return status;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t d = 0; d < D; ++d) {
                double acc = 0.0;
                for (int64_t c = 0; c < C; ++c)
                    acc += qt[(m * C + c) * N + n] * (ga[((m * C + c) * D + d) * N + n] + ba[c * D + d]);
                st[(m * D + d) * N + n] = acc;
            }
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t v = 0; v < C; ++v) {
                double acc = 0.0;
                for (int64_t d = 0; d < D; ++d)
                    acc += st[(m * D + d) * N + n] * (gb[((m * C + v) * D + d) * N + n] + bb[v * D + d]);
                yt[(m * C + v) * N + n] = acc;
            }
    return REFIMPL_OK;
}
