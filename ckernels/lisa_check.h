/* The argument checks of LiSA's spectral product and contraction (ckernels/lisa.c), shared by the fast entry
 * points and the plain versions (ckernels/lisa_plain.c), so that both refuse exactly the same calls with the
 * same status.  Every element count formed in the loops must fit in ptrdiff_t. */
#ifndef REFIMPL_LISA_CHECK_H
#define REFIMPL_LISA_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* Nonzero if a * b * c * d (all >= 1) exceeds lim. */
static int lisa_too_big(int64_t a, int64_t b, int64_t c, int64_t d, int64_t lim)
{
    int64_t p = a;
    if (b > lim / p)
        return 1;
    p *= b;
    if (c > lim / p)
        return 1;
    p *= c;
    return d > lim / p;
}

/* The spectral product: out (M, C, D, F) complex; xf (M, C, F) complex; kf (C or 1, D, F) complex. */
static int lisa_spectral_check(const double *out, const double *xf, const double *kf, int64_t M, int64_t C,
                               int64_t D, int64_t F)
{
    if (!out || !xf || !kf)
        return REFIMPL_ERR_NULL;
    if (M < 1 || C < 1 || D < 1 || F < 1)
        return REFIMPL_ERR_SIZE;
    /* 2 doubles per complex element */
    if (lisa_too_big(M, C, D, F, PTRDIFF_MAX / (int64_t)(2 * sizeof(double))))
        return REFIMPL_ERR_OVERFLOW;
    return REFIMPL_OK;
}

/* The contraction: st (M, D, N), yt (M, C, N); qt (M, C, N); ga, gb (M, C, D, N); ba, bb (C, D). */
static int lisa_contract_check(const double *st, const double *yt, const double *qt, const double *ga,
                               const double *gb, const double *ba, const double *bb, int64_t M, int64_t N,
                               int64_t C, int64_t D)
{
    if (!st || !yt || !qt || !ga || !gb || !ba || !bb)
        return REFIMPL_ERR_NULL;
    if (M < 1 || N < 1 || C < 1 || D < 1)
        return REFIMPL_ERR_SIZE;
    if (lisa_too_big(M, C, D, N, PTRDIFF_MAX / (int64_t)sizeof(double)))
        return REFIMPL_ERR_OVERFLOW;
    return REFIMPL_OK;
}

#endif
