/*
 * Depthwise 2-D convolution, the plain version: straight scalar loops in the order of the definition, one
 * thread, no tiles, no staging buffers, no vector types, no instruction-set dispatch.  It is the
 * specification of the fast kernel refimpl_dwconv2d_f64/_f32 (ckernels/dwconv2d.c, dwconv2d_body.h,
 * dwconv2d_entry.h): the same entry point's mathematics and argument checks, written to be read.  Not
 * registered as a backend; tests/test_kernels_plain.py checks it against the NumPy definition
 * (refimpl.layers._depthwise_conv2d_numpy) within the error model and bit for bit in its own precision, and
 * the fast kernel against it.
 *
 *   int refimpl_dwconv2d_plain_f64(out, x, weight, bias, stride_h, stride_w, pad_top, pad_left,
 *                                  B, C, H, W, KH, KW, OH, OW)      (and _f32 with float)
 *
 *   out (B, C, OH, OW); x (B, C, H, W); weight (C, KH, KW), any KH, KW >= 1; bias (C) or NULL;
 *   PyTorch zero padding: pad_top rows above, pad_left columns on the left, the bottom and right padding
 *   implied by OH and OW.  Returns REFIMPL_OK, or a nonzero status (and writes nothing to out) for refused
 *   arguments: the fast entry point's statuses for the same arguments.
 *
 * Per output element (MobileNets, Howard et al. 2017, Sec. 3.1 Eq. 3: one KH x KW filter per channel;
 * L2ViT Eq. 5-7, the local window sum O'_i = sum_{j in Omega_i} w_j O_j of its LCM; FLatten Eq. 10-11, DWC(V)):
 *
 *   out[b, c, oh, ow] = (sum_{u < KH} sum_{v < KW} w[c, u, v] xpad[b, c, oh sh + u, ow sw + v]) + bias[c]
 *   xpad[b, c, i, j]  = x[b, c, i - pad_top, j - pad_left] inside the image, 0 in the padding
 *
 * The sum starts at +0 and adds its KH KW products in row-major (u, v) order, each product and each sum
 * rounded once (the build's -ffp-contract=off: no FMA); the bias is added last (no addition without one).
 * A padded tap adds w * 0 like any other (so an infinite or NaN weight meeting the padding gives NaN, as the
 * definition).  These are the NumPy definition's operations in its order, so the result is its bits in the
 * same precision (up to the sign of a zero).  The fast kernel performs the same operations in the same order
 * for every output (vectorised across output columns only); it skips padded taps of finite weights (w * 0 =
 * +-0), which can change only the sign of a zero output.
 *
 * The file includes itself once per floating type (PLAIN_REAL defined): the body is written once.
 */
#ifndef PLAIN_REAL

#include <stddef.h>
#include <stdint.h>

#include "refimpl_kernels.h"
#include "dwconv2d_check.h"    /* the argument check the fast entry point makes */

#define PLAIN_REAL double
#define PLAIN_FN(name) name##_f64
#include "dwconv2d_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN

#define PLAIN_REAL float
#define PLAIN_FN(name) name##_f32
#include "dwconv2d_plain.c"
#undef PLAIN_REAL
#undef PLAIN_FN

#else /* the body, once per type */

int PLAIN_FN(refimpl_dwconv2d_plain)(PLAIN_REAL *out, const PLAIN_REAL *x, const PLAIN_REAL *weight,
                                     const PLAIN_REAL *bias, int64_t stride_h, int64_t stride_w, int64_t pad_top,
                                     int64_t pad_left, int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH,
                                     int64_t KW, int64_t OH, int64_t OW)
{
    const int status = dwconv2d_check(out, x, weight, sizeof(PLAIN_REAL), stride_h, stride_w, pad_top, pad_left, B,
                                      C, H, W, KH, KW, OH, OW);
    if (status != REFIMPL_OK)
        return status;

    for (int64_t b = 0; b < B; ++b) {
        for (int64_t c = 0; c < C; ++c) {
            const PLAIN_REAL *xp = x + (b * C + c) * H * W;          /* the (b, c) plane */
            const PLAIN_REAL *wc = weight + c * KH * KW;             /* channel c's filter */
            PLAIN_REAL *op = out + (b * C + c) * OH * OW;
            for (int64_t oh = 0; oh < OH; ++oh) {
                for (int64_t ow = 0; ow < OW; ++ow) {
                    /* acc = sum_{u, v} w[c, u, v] xpad[b, c, oh sh + u, ow sw + v]   (MobileNets Eq. 3) */
                    PLAIN_REAL acc = 0;
                    for (int64_t u = 0; u < KH; ++u) {
                        const int64_t ih = oh * stride_h + u - pad_top;
                        for (int64_t v = 0; v < KW; ++v) {
                            const int64_t iw = ow * stride_w + v - pad_left;
                            const PLAIN_REAL xv =
                                (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xp[ih * W + iw] : (PLAIN_REAL)0;
                            const PLAIN_REAL prod = wc[u * KW + v] * xv;
                            acc = acc + prod;
                        }
                    }
                    op[oh * OW + ow] = bias ? acc + bias[c] : acc;   /* the bias added last */
                }
            }
        }
    }
    return REFIMPL_OK;
}

#endif /* PLAIN_REAL */
