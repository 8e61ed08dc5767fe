/* The depthwise convolution's argument check, shared by the fast entry point (dwconv2d_entry.h) and the
 * plain version (dwconv2d_plain.c), so that both refuse exactly the same calls with the same status.
 *
 * Every element count, and every coordinate formed in the loops, must fit in ptrdiff_t: lim is
 * PTRDIFF_MAX / sizeof(element), and each product is checked factor by factor before it is formed. */
#ifndef REFIMPL_DWCONV2D_CHECK_H
#define REFIMPL_DWCONV2D_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"

/* *r = a * b * c * d, returning nonzero if any partial product exceeds lim (all arguments >= 1). */
static int dwconv2d_mul4(int64_t a, int64_t b, int64_t c, int64_t d, int64_t lim, int64_t *r)
{
    int64_t p = a;
    if (b > lim / p)
        return 1;
    p *= b;
    if (c > lim / p)
        return 1;
    p *= c;
    if (d > lim / p)
        return 1;
    *r = p * d;
    return 0;
}

/* REFIMPL_OK, or the status refusing the call (null buffer, size, stride, padding, overflow). */
static int dwconv2d_check(const void *out, const void *x, const void *weight, size_t elem, int64_t stride_h,
                          int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t B, int64_t C, int64_t H,
                          int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW)
{
    if (!out || !x || !weight)
        return REFIMPL_ERR_NULL;
    if (B < 1 || C < 1 || H < 1 || W < 1 || KH < 1 || KW < 1 || OH < 1 || OW < 1)
        return REFIMPL_ERR_SIZE;
    if (stride_h < 1 || stride_w < 1)
        return REFIMPL_ERR_STRIDE;
    if (pad_top < 0 || pad_left < 0)
        return REFIMPL_ERR_PADDING;
    const int64_t lim = PTRDIFF_MAX / (int64_t)elem;
    int64_t n;
    if (dwconv2d_mul4(B, C, H, W, lim, &n) || dwconv2d_mul4(B, C, OH, OW, lim, &n) ||
        dwconv2d_mul4(C, KH, KW, 1, lim, &n) || dwconv2d_mul4(OH, stride_h, 1, 1, lim, &n) ||
        n > lim - KH - H - pad_top || dwconv2d_mul4(OW, stride_w, 1, 1, lim, &n) || n > lim - KW - W - pad_left)
        return REFIMPL_ERR_OVERFLOW;
    return REFIMPL_OK;
}

#endif
