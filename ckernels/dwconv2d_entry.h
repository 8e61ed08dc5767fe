/*
 * Depthwise conv2d forward: the public entry point for one floating type.  Included by dwconv2d.c once
 * per type with REAL and TSUF (f64 / f32) defined, after the per-ISA plane loops of dwconv2d_body.h
 * (dw_plane_<TSUF>_avx512 / _avx2 / _base) have been defined.
 */

#define RE_CAT2(a, b) a##_##b
#define RE_CAT(a, b) RE_CAT2(a, b)
#define RE_FN(name) RE_CAT(name, TSUF)

/* The literal definition for one (b, c) plane: every tap, the padding read as explicit zeros.  Used for
 * channels with a non-finite weight, where a padded tap contributes w * 0 = NaN, as in the definition. */
static void RE_FN(dw_plane_literal)(REAL *restrict op, const REAL *restrict xp, const REAL *restrict wc,
                                    const REAL *bias_c, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
                                    int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW)
{
    for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
            REAL acc = 0;
            for (int64_t u = 0; u < KH; ++u) {
                const int64_t ih = oh * sh - pt + u;
                for (int64_t v = 0; v < KW; ++v) {
                    const int64_t iw = ow * sw - pl + v;
                    const REAL xv = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xp[ih * W + iw] : (REAL)0;
                    acc += wc[u * KW + v] * xv;
                }
            }
            op[oh * OW + ow] = bias_c ? acc + *bias_c : acc;
        }
    }
}

typedef void (*RE_FN(dw_plane_fn))(REAL *restrict, const REAL *restrict, const REAL *restrict, const REAL *,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                   int64_t, int64_t);

int RE_FN(refimpl_dwconv2d)(REAL *out, const REAL *x, const REAL *weight, const REAL *bias,
                            int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                            int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                            int64_t OH, int64_t OW)
{
    const int status = dwconv2d_check(out, x, weight, sizeof(REAL), stride_h, stride_w, pad_top, pad_left, B, C, H,
                                      W, KH, KW, OH, OW);
    if (status != REFIMPL_OK)
        return status;

    /* The staged path (dwconv2d_body.h) at the widest level the CPU has: any row width (partial tiles
     * are masked at AVX-512).  It declines planes too large for its buffer. */
    const int isa = refimpl_isa_in_use();
    (void)isa;
    {
        int done;
#if REFIMPL_X86_DISPATCH
        if (isa >= REFIMPL_ISA_AVX512)
            done = RE_FN(dw_planes_staged_avx512)(out, x, weight, bias, stride_h, stride_w, pad_top, pad_left,
                                                  B * C, C, H, W, KH, KW, OH, OW, RE_FN(dw_plane_literal));
        else if (isa >= REFIMPL_ISA_AVX2)
            done = RE_FN(dw_planes_staged_avx2)(out, x, weight, bias, stride_h, stride_w, pad_top, pad_left,
                                                B * C, C, H, W, KH, KW, OH, OW, RE_FN(dw_plane_literal));
        else
#endif
            done = RE_FN(dw_planes_staged_base)(out, x, weight, bias, stride_h, stride_w, pad_top, pad_left,
                                                B * C, C, H, W, KH, KW, OH, OW, RE_FN(dw_plane_literal));
        if (done)
            return REFIMPL_OK;
    }

    /* The widest vector level the CPU has whose tiles (64, 32 or 16 bytes of outputs) fit in a row of
     * OW outputs: a narrower row would be computed element by element at the wider level.  Every level
     * computes the same bits, so this choice changes speed only. */
    RE_FN(dw_plane_fn) plane = RE_FN(dw_plane_base);
#if REFIMPL_X86_DISPATCH
    if (isa >= REFIMPL_ISA_AVX512 && OW * (int64_t)sizeof(REAL) >= 64)
        plane = RE_FN(dw_plane_avx512);
    else if (isa >= REFIMPL_ISA_AVX2 && OW * (int64_t)sizeof(REAL) >= 32)
        plane = RE_FN(dw_plane_avx2);
#endif

    const int64_t ksize = KH * KW;
    for (int64_t p = 0; p < B * C; ++p) {                        /* (b, c) planes are independent */
        const int64_t c = p % C;
        const REAL *wc = weight + c * ksize;
        const REAL *bias_c = bias ? bias + c : 0;
        int finite = 1;
        for (int64_t k = 0; k < ksize; ++k)
            finite &= isfinite(wc[k]) ? 1 : 0;
        if (finite)
            plane(out + p * OH * OW, x + p * H * W, wc, bias_c, stride_h, stride_w, pad_top, pad_left, H, W,
                  KH, KW, OH, OW);
        else
            RE_FN(dw_plane_literal)(out + p * OH * OW, x + p * H * W, wc, bias_c, stride_h, stride_w,
                                    pad_top, pad_left, H, W, KH, KW, OH, OW);
    }
    return REFIMPL_OK;
}

#undef RE_FN
#undef RE_CAT
#undef RE_CAT2
