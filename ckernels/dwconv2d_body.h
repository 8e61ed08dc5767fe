/*
 * Depthwise conv2d forward: the fast plane loop for one floating type and one instruction set.
 * Included by dwconv2d.c once per (type, ISA) with
 *   REAL       the element type (double / float),
 *   SUF        the name suffix (avx512_f64, base_f32, ...),
 *   VBYTES     the vector width in bytes (64 AVX-512, 32 AVX2, 16 SSE2/baseline),
 *   RI_ROWS    the tile height (independent addition chains; 8 where there are 32 vector registers),
 *   RI_TARGET  the function attribute that enables the ISA (empty for the baseline).
 * Not a standalone translation unit (hence the .h suffix: the build compiles only the .c files).
 *
 * ---------------------------------------------------------------------------------------------------
 * The definition (refimpl/layers.py, _depthwise_conv2d_numpy; PyTorch conv2d with groups = C):
 *
 *     acc = 0
 *     for u in range(KH):                       # kernel row
 *         for v in range(KW):                   # kernel column
 *             acc += w[c, u, v] * xpad[b, c, oh*sh + u, ow*sw + v]
 *     out[b, c, oh, ow] = acc + bias[c]          # (no addition when bias is NULL)
 *
 * where xpad is x zero-padded by pad_top rows above and pad_left columns on the left (the bottom and
 * right padding are whatever OH and OW imply).  Every output element here is computed with exactly
 * these operations in exactly this order: a product rounded to REAL, then a sum rounded to REAL, over
 * (u, v) in row-major order starting from +0, then the bias added last.  With no FMA contraction
 * (build_ext.py passes -ffp-contract=off) the result is therefore bitwise the NumPy definition
 * evaluated in REAL, whatever the vector width: vectorisation runs across output columns, never
 * across the (u, v) sum of one output.
 *
 * How it is made fast without changing that order:
 *   - The staged path (dw_planes_staged, at the end of this file; every plane whose zero-padded copy
 *     fits RI_STAGE_BYTES, e.g. 56x56 with 7x7 taps in both types): each plane is copied once into a
 *     zero-padded stack buffer with a fixed row pitch, then every tile (the register-blocked tiles
 *     described next) reads that buffer directly: no edge tiles, no bounds checks, no overlapping last
 *     tile (AVX-512 stores a partial last tile with a mask, or computes it at half width), and rows
 *     narrower than a vector are one masked tile instead of the element-by-element loop.  The rest of
 *     this list describes the tile-by-tile path (dw_plane), used for planes too large for the buffer.
 *   - Outputs are computed in tiles of RI_ROWS output rows x VLEN output columns held in vector
 *     registers across all KH x KW taps (register blocking: each output is stored once; each tap costs
 *     one broadcast weight and RI_ROWS vector loads, multiplies and adds; the RI_ROWS independent
 *     addition chains hide the adder latency).  The loop order is: plane (b, c) > group of RI_ROWS
 *     output rows > tile of VLEN contiguous output columns > kernel row u > kernel column v > tile row.
 *   - Tiles whose taps all lie inside the image horizontally read x directly (no bounds checks in the
 *     loop; tap rows in the top/bottom padding read a static row of zeros).  The few tiles that touch
 *     the left/right padding first copy the input segment they need into a small zero-padded buffer.
 *     Padded taps therefore add w * 0 exactly as the definition does: this path is only taken for
 *     channels whose weights are all finite, where w * 0 = +-0; a channel with an Inf or NaN weight
 *     takes dw_plane_literal (dwconv2d_entry.h), the definition's loop written out, where w * 0 = NaN.
 *   - A partial last tile of a row is a full tile that overlaps the previous one: the overlapped
 *     outputs are recomputed by the same operations and so rewritten with the same bits.  Rows
 *     narrower than one vector (and kernels too wide for the edge buffer) are done element by element,
 *     skipping padded taps: that can differ from the definition only in the sign of a zero output.
 * ---------------------------------------------------------------------------------------------------
 */

#define RI_CAT2(a, b) a##_##b
#define RI_CAT(a, b) RI_CAT2(a, b)
#define RI_FN(name) RI_CAT(name, SUF)
#define RI_VLEN ((int)(VBYTES / sizeof(REAL)))
/* Fully unrolled 3x3 and 7x7 staged tiles: measured faster with AVX-512 only (32 vector registers). */
#define RI_UNROLL (VBYTES == 64)

typedef REAL RI_FN(vec) __attribute__((vector_size(VBYTES)));

/* One output, taps restricted to those inside the image (the padded ones add w * 0 = +-0 and are
 * skipped).  ih0, iw0: image coordinates of tap (0, 0) (negative inside the top/left padding). */
static REFIMPL_INLINE REAL RI_FN(dw_point)(const REAL *restrict xp, const REAL *restrict wc, int64_t ih0,
                                           int64_t iw0, int64_t H, int64_t W, int64_t KH, int64_t KW,
                                           const REAL *bias_c)
{
    const int64_t u_lo = ih0 < 0 ? -ih0 : 0;
    const int64_t u_hi = H - ih0 < KH ? H - ih0 : KH;
    const int64_t v_lo = iw0 < 0 ? -iw0 : 0;
    const int64_t v_hi = W - iw0 < KW ? W - iw0 : KW;
    REAL acc = 0;
    for (int64_t u = u_lo; u < u_hi; ++u) {
        const REAL *xr = xp + (ih0 + u) * W + iw0;
        const REAL *wr = wc + u * KW;
        for (int64_t v = v_lo; v < v_hi; ++v)
            acc += wr[v] * xr[v];
    }
    return bias_c ? acc + *bias_c : acc;
}

/* *v = (xr[0], xr[SW], ..., xr[(VLEN-1) SW]) (SW is a literal 1 on the stride-1 path, where this is
 * one unaligned vector load). */
static REFIMPL_INLINE void RI_FN(dw_load)(RI_FN(vec) *v, const REAL *xr, const int64_t SW)
{
    if (SW == 1) {
        memcpy(v, xr, sizeof *v);
    } else {
        for (int t = 0; t < RI_VLEN; ++t)
            (*v)[t] = xr[t * SW];
    }
}

/* Store NR finished accumulators (adding the bias last) to rows o, o + OW, ... */
static REFIMPL_INLINE void RI_FN(dw_store)(REAL *restrict o, int64_t OW, RI_FN(vec) *acc,
                                           const REAL *bias_c, const int NR)
{
    for (int r = 0; r < NR; ++r) {
        if (bias_c)
            acc[r] += *bias_c;
        memcpy(o + r * OW, &acc[r], sizeof acc[r]);
    }
}

/* Copy input row ih, columns [iw0, iw0 + len), into b with explicit zeros outside the image; k_lo, k_hi
 * delimit the columns inside the image (relative to iw0). */
static REFIMPL_INLINE void RI_FN(dw_stage)(REAL *restrict b, const REAL *restrict xp, int64_t ih, int64_t W,
                                           int64_t iw0, int64_t len, int64_t k_lo, int64_t k_hi)
{
    /* One loop with a select (not memset/memcpy/memset: GCC turns those into library calls, whose
     * overhead dominates for these few elements).  xr[k] is only read for k inside the image. */
    const REAL *xr = xp + ih * W + iw0;
    for (int64_t k = 0; k < len; ++k)
        b[k] = (k >= k_lo && k < k_hi) ? xr[k] : (REAL)0;
}

/* A tile of NR rows x VLEN outputs at o (row pitch OW): output (r, t) is the sum over taps (u, v) of
 * w[u, v] * xpad(ih0 + r*sh + u, iw0 + t*SW + v).  For every tap row, each tile row reads its inputs
 * from a row pointer: directly into x when that input row is inside the image and EDGE is 0 (the
 * caller guarantees the columns are then inside too); from a row of zeros when the input row is in
 * the top/bottom padding; and, when EDGE is 1 (some columns in the left/right padding), from a staged
 * copy of columns [iw0, iw0 + (VLEN-1) SW + KW) with explicit zeros outside the image.  Each of the
 * (NR-1) sh + KH input rows the tile reads is staged once (if they fit in RI_EDGE_ROWS; otherwise once
 * per tap row and tile row).  The weights are finite on this path, so every padded tap adds
 * w * 0 = +-0, exactly as in the definition.  (VLEN-1) SW + KW <= RI_BUF is the caller's guarantee. */
static REFIMPL_INLINE void RI_FN(dw_tile)(REAL *restrict o, int64_t OW, const REAL *restrict xp,
                                          const REAL *restrict wc, int64_t ih0, int64_t sh, int64_t iw0,
                                          int64_t H, int64_t W, int64_t KH, int64_t KW, const int64_t SW,
                                          const REAL *bias_c, REAL *restrict scratch, const int NR,
                                          const int EDGE)
{
    static const REAL zeros[RI_BUF];
    REAL *buf = scratch;                                          /* RI_ROWS rows of RI_BUF */
    REAL *stage = scratch + RI_ROWS * RI_BUF;                     /* RI_EDGE_ROWS rows of RI_BUF */
    const REAL *staged[RI_EDGE_ROWS];
    const int64_t len = (RI_VLEN - 1) * SW + KW;
    /* Columns of [iw0, iw0 + len) inside the image, relative to iw0 (for the EDGE copies). */
    const int64_t k_lo = iw0 < 0 ? (-iw0 < len ? -iw0 : len) : 0;
    const int64_t k_hi = W - iw0 < len ? (W - iw0 > k_lo ? W - iw0 : k_lo) : len;
    const int64_t nrows = (NR - 1) * sh + KH;
    const int once = EDGE && nrows <= RI_EDGE_ROWS;
    if (once) {
        for (int64_t j = 0; j < nrows; ++j) {
            const int64_t ih = ih0 + j;
            if (ih < 0 || ih >= H) {
                staged[j] = zeros;
            } else {
                RI_FN(dw_stage)(stage + j * RI_BUF, xp, ih, W, iw0, len, k_lo, k_hi);
                staged[j] = stage + j * RI_BUF;
            }
        }
    }
    RI_FN(vec) acc[RI_ROWS];
    for (int r = 0; r < RI_ROWS; ++r)                            /* (all: no uninitialised read) */
        acc[r] = (RI_FN(vec)){0};                                /* every lane +0, as the definition */
    for (int64_t u = 0; u < KH; ++u) {
        const REAL *wr = wc + u * KW;
        const REAL *src[RI_ROWS];
        for (int r = 0; r < NR; ++r) {
            const int64_t ih = ih0 + r * sh + u;
            const int inside = ih >= 0 && ih < H;
            if (!EDGE) {
                src[r] = inside ? xp + ih * W + iw0 : zeros;
            } else if (once) {
                src[r] = staged[r * sh + u];
            } else if (!inside) {
                src[r] = zeros;
            } else {
                RI_FN(dw_stage)(buf + r * RI_BUF, xp, ih, W, iw0, len, k_lo, k_hi);
                src[r] = buf + r * RI_BUF;
            }
        }
        for (int64_t v = 0; v < KW; ++v) {
            const REAL wv = wr[v];                               /* vector * scalar: lane-wise products */
            for (int r = 0; r < NR; ++r) {
                RI_FN(vec) xv;
                RI_FN(dw_load)(&xv, src[r] + v, SW);
                acc[r] += xv * wv;
            }
        }
    }
    RI_FN(dw_store)(o, OW, acc, bias_c, NR);
}

/* NR consecutive output rows starting at row pointer orow (image row of their tap (0, 0): ih0, ih0 +
 * sh, ...), in tiles of VLEN columns; a partial last tile overlaps the previous one.  Tiles whose
 * columns' windows are inside the image horizontally ([ow_lo, ow_hi)) read x rows directly, the others
 * through the zero-padded buffer (with 2-lane vectors, where staging costs more than it saves, edge
 * tiles go element by element).  Rows narrower than VLEN (the dispatcher avoids them by choosing a
 * narrower ISA) and absurdly wide kernels go element by element too.  The scratch space for staging
 * lives in the caller's frame (dw_plane), once, not in every inlined copy of dw_tile. */
static REFIMPL_INLINE void RI_FN(dw_rows)(REAL *restrict orow, const REAL *restrict xp,
                                          const REAL *restrict wc, const REAL *bias_c, int64_t ih0,
                                          int64_t sh, int64_t sw, int64_t pl, int64_t H, int64_t W,
                                          int64_t KH, int64_t KW, int64_t OW, int64_t ow_lo, int64_t ow_hi,
                                          REAL *restrict scratch, const int NR)
{
    if (OW < RI_VLEN || (RI_VLEN - 1) * sw + KW > RI_BUF) {
        for (int r = 0; r < NR; ++r)
            for (int64_t ow = 0; ow < OW; ++ow)
                orow[r * OW + ow] = RI_FN(dw_point)(xp, wc, ih0 + r * sh, ow * sw - pl, H, W, KH, KW,
                                                    bias_c);
        return;
    }
    for (int64_t ow = 0;; ow += RI_VLEN) {
        if (ow > OW - RI_VLEN)
            ow = OW - RI_VLEN;                                   /* overlapping last tile */
        REAL *o = orow + ow;
        const int64_t iw0 = ow * sw - pl;
        if (ow >= ow_lo && ow + RI_VLEN <= ow_hi) {              /* columns inside the image */
            if (sw == 1)
                RI_FN(dw_tile)(o, OW, xp, wc, ih0, sh, iw0, H, W, KH, KW, 1, bias_c, scratch, NR, 0);
            else
                RI_FN(dw_tile)(o, OW, xp, wc, ih0, sh, iw0, H, W, KH, KW, sw, bias_c, scratch, NR, 0);
        } else if (RI_VLEN <= 2) {                               /* staging does not pay for 2 lanes */
            for (int r = 0; r < NR; ++r)
                for (int64_t t = ow; t < ow + RI_VLEN; ++t)
                    orow[r * OW + t] = RI_FN(dw_point)(xp, wc, ih0 + r * sh, t * sw - pl, H, W, KH, KW,
                                                       bias_c);
        } else {                                                 /* some in the left/right padding */
            if (sw == 1)
                RI_FN(dw_tile)(o, OW, xp, wc, ih0, sh, iw0, H, W, KH, KW, 1, bias_c, scratch, NR, 1);
            else
                RI_FN(dw_tile)(o, OW, xp, wc, ih0, sh, iw0, H, W, KH, KW, sw, bias_c, scratch, NR, 1);
        }
        if (ow == OW - RI_VLEN)
            break;
    }
}

/* One (b, c) plane whose weights are all finite. */
RI_TARGET
static void RI_FN(dw_plane)(REAL *restrict op, const REAL *restrict xp, const REAL *restrict wc,
                            const REAL *bias_c, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t H,
                            int64_t W, int64_t KH, int64_t KW, int64_t OH, int64_t OW)
{
    /* Columns whose windows are inside the image: ow*sw - pl >= 0 and ow*sw - pl + KW - 1 <= W - 1. */
    const int64_t ow_lo = (pl + sw - 1) / sw;
    const int64_t ow_hi = (W - KW + pl) < 0 ? 0 : (W - KW + pl) / sw + 1;
    REAL scratch[(RI_ROWS + RI_EDGE_ROWS) * RI_BUF];            /* edge tiles' staged input rows */

    for (int64_t oh = 0; oh < OH;) {
        const int64_t ih0 = oh * sh - pt;
        /* RI_ROWS rows at a time (the last group: the largest power of two that fits). */
        int nr = RI_ROWS;
        while (oh + nr > OH)
            nr /= 2;
        REAL *orow = op + oh * OW;
        if (nr == RI_ROWS)
            RI_FN(dw_rows)(orow, xp, wc, bias_c, ih0, sh, sw, pl, H, W, KH, KW, OW, ow_lo, ow_hi, scratch,
                           RI_ROWS);
#if RI_ROWS > 4
        else if (nr == 4)
            RI_FN(dw_rows)(orow, xp, wc, bias_c, ih0, sh, sw, pl, H, W, KH, KW, OW, ow_lo, ow_hi, scratch, 4);
#endif
        else if (nr == 2)
            RI_FN(dw_rows)(orow, xp, wc, bias_c, ih0, sh, sw, pl, H, W, KH, KW, OW, ow_lo, ow_hi, scratch, 2);
        else
            RI_FN(dw_rows)(orow, xp, wc, bias_c, ih0, sh, sw, pl, H, W, KH, KW, OW, ow_lo, ow_hi, scratch, 1);
        oh += nr;
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The staged path (used whenever the zero-padded plane fits RI_STAGE_BYTES; dw_plane above is the
 * fallback for larger planes).  Each (b, c) plane is copied once into a zero-padded buffer
 *     sb[j * SP + k] = xpad(j, k) = x(j - pt, k - pl) inside the image, 0 outside,
 * j < SR = (OH-1) sh + KH rows, k < SP = (OWT-1) sw + KW columns, OWT = OW rounded up to whole vectors.
 * The border is zeroed once per call (every plane of a call has the same geometry; only the interior is
 * rewritten).  Every tile then reads the buffer directly: no edge tiles, no bounds checks, and rows
 * narrower than a vector are one tile with a partial store.  The operations per output are unchanged:
 * padded taps add w * 0 = +-0 (finite weights only, as above), in (u, v) row-major order from +0, then
 * the bias.  Lanes beyond OW compute on the zero columns and are never stored.
 * --------------------------------------------------------------------------------------------------- */

/* n elements from s to d (vector copies, then a scalar tail). */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_copy)(REAL *restrict d, const REAL *restrict s, int64_t n)
{
    int64_t k = 0;
    for (; k + RI_VLEN <= n; k += RI_VLEN) {
        RI_FN(vec) t;
        memcpy(&t, s + k, sizeof t);
        memcpy(d + k, &t, sizeof t);
    }
    for (; k < n; ++k)
        d[k] = s[k];
}

/* Store the first n (1 <= n <= VLEN) lanes of each of NR accumulators (adding the bias last). */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_store_n)(REAL *restrict o, int64_t OW, RI_FN(vec) *acc,
                                             const REAL *bias_c, const int NR, int n)
{
    for (int r = 0; r < NR; ++r) {
        if (bias_c)
            acc[r] += *bias_c;
#if VBYTES == 64 && REFIMPL_X86_DISPATCH
        if (sizeof(REAL) == 4)
            _mm512_mask_storeu_ps(o + r * OW, (__mmask16)((1u << n) - 1u), (__m512)acc[r]);
        else
            _mm512_mask_storeu_pd(o + r * OW, (__mmask8)((1u << n) - 1u), (__m512d)acc[r]);
#else
        for (int t = 0; t < n; ++t)
            o[r * OW + t] = acc[r][t];
#endif
    }
}

/* A tile of NR rows x VLEN outputs whose tap (0, 0) for row 0 is at s in the staged buffer (pitch SP):
 * acc[r][t] = sum over (u, v) in row-major order of w[u, v] * s[(r sh + u) SP + t SW + v]. */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_tile_s)(RI_FN(vec) *acc, const REAL *restrict s, int64_t SP, int64_t sh,
                                            const REAL *restrict wc, int64_t KH, int64_t KW, const int64_t SW,
                                            const int NR)
{
    for (int r = 0; r < NR; ++r)
        acc[r] = (RI_FN(vec)){0};                                /* every lane +0, as the definition */
    for (int64_t u = 0; u < KH; ++u) {
        const REAL *wr = wc + u * KW;
        for (int64_t v = 0; v < KW; ++v) {
            const REAL wv = wr[v];
            /* One pointer per tap, opaque to the optimiser: the NR loads are then at constant offsets
             * from it when SP and sh are constants, instead of NR row pointers spilled to the stack. */
            const REAL *sv = s + u * SP + v;
            __asm__("" : "+r"(sv));
            for (int r = 0; r < NR; ++r) {
                RI_FN(vec) xv;
                RI_FN(dw_load)(&xv, sv + r * sh * SP, SW);
                acc[r] += xv * wv;
            }
        }
    }
}

/* The same tile for stride 1 (both directions) and constant KH, KW (fully unrolled), with each input
 * vector loaded once and used by every tile row that needs it: staged row j feeds tile row r through
 * kernel row u = j - r.  For a fixed r, u increases with j and v increases within it, so every output
 * still adds its taps in (u, v) row-major order.  Used for 3x3 at AVX-512 (measured: 3x3 on 14x14,
 * float32, 30 -> 26-28 us per 384 planes); for 7x7 the unrolled code (14 x 7 loads, 392 products with
 * broadcast weights per 8-row tile) measured slower than dw_tile_s (409 vs 331 us on (96, 56, 56)). */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_tile_s1)(RI_FN(vec) *acc, const REAL *restrict s, int64_t SP,
                                             const REAL *restrict wc, const int KH, const int KW,
                                             const int NR)
{
    for (int r = 0; r < NR; ++r)
        acc[r] = (RI_FN(vec)){0};                                /* every lane +0, as the definition */
#pragma GCC unroll 16
    for (int j = 0; j < NR + KH - 1; ++j) {
#pragma GCC unroll 8
        for (int v = 0; v < KW; ++v) {
            const REAL *sv = s + j * SP + v;
            __asm__("" : "+r"(sv));
            RI_FN(vec) xv;
            memcpy(&xv, sv, sizeof xv);
            for (int r = 0; r < NR; ++r)
                if (j - r >= 0 && j - r < KH)
                    acc[r] += xv * wc[(j - r) * KW + v];
        }
    }
}

#if VBYTES == 64 && REFIMPL_X86_DISPATCH
/* AVX-512 only: a half-width (256-bit) tile for a last partial tile of at most VLEN/2 columns (e.g. the
 * last 8 of 56 float columns), so that it does not compute 16 lanes to keep 8.  Same operations per
 * lane as dw_tile_s. */
typedef REAL RI_FN(hvec) __attribute__((vector_size(VBYTES / 2)));

RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_tile_h)(REAL *restrict o, int64_t OW, const REAL *restrict s, int64_t SP,
                                            int64_t sh, const REAL *restrict wc, int64_t KH, int64_t KW,
                                            const REAL *bias_c, const int NR, int n)
{
    RI_FN(hvec) acc[RI_ROWS];
    for (int r = 0; r < NR; ++r)
        acc[r] = (RI_FN(hvec)){0};                               /* every lane +0, as the definition */
    for (int64_t u = 0; u < KH; ++u) {
        const REAL *wr = wc + u * KW;
        for (int64_t v = 0; v < KW; ++v) {
            const REAL wv = wr[v];
            const REAL *sv = s + u * SP + v;
            __asm__("" : "+r"(sv));
            for (int r = 0; r < NR; ++r) {
                RI_FN(hvec) xv;
                memcpy(&xv, sv + r * sh * SP, sizeof xv);
                acc[r] += xv * wv;
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        if (bias_c)
            acc[r] += *bias_c;
        if (n == RI_VLEN / 2)
            memcpy(o + r * OW, &acc[r], sizeof acc[r]);
        else if (sizeof(REAL) == 4)
            _mm256_mask_storeu_ps(o + r * OW, (__mmask8)((1u << n) - 1u), (__m256)acc[r]);
        else
            _mm256_mask_storeu_pd(o + r * OW, (__mmask8)((1u << n) - 1u), (__m256d)acc[r]);
    }
}
#endif

/* NR output rows at orow from staged row j0 (= their first output row times sh). */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_rows_s)(REAL *restrict orow, const REAL *restrict sb, int64_t SP,
                                            int64_t j0, const REAL *restrict wc, const REAL *bias_c,
                                            int64_t sh, int64_t sw, int64_t KH, int64_t KW, int64_t OW,
                                            const int NR)
{
    RI_FN(vec) acc[RI_ROWS];
    const REAL *s0 = sb + j0 * SP;
    int64_t ow = 0;
    for (; ow + RI_VLEN <= OW; ow += RI_VLEN) {
        if (RI_UNROLL && sw == 1 && KH == 7 && KW == 7)         /* common sizes, unrolled */
            RI_FN(dw_tile_s)(acc, s0 + ow, SP, sh, wc, 7, 7, 1, NR);
        else if (RI_UNROLL && sw == 1 && sh == 1 && KH == 3 && KW == 3)
            RI_FN(dw_tile_s1)(acc, s0 + ow, SP, wc, 3, 3, NR);
        else if (sw == 1)
            RI_FN(dw_tile_s)(acc, s0 + ow, SP, sh, wc, KH, KW, 1, NR);
        else
            RI_FN(dw_tile_s)(acc, s0 + ow * sw, SP, sh, wc, KH, KW, sw, NR);
        RI_FN(dw_store)(orow + ow, OW, acc, bias_c, NR);
    }
#if VBYTES == 64 && REFIMPL_X86_DISPATCH
    if (ow < OW && sw == 1 && OW - ow <= RI_VLEN / 2) {
        if (KH == 7 && KW == 7)
            RI_FN(dw_tile_h)(orow + ow, OW, s0 + ow, SP, sh, wc, 7, 7, bias_c, NR, (int)(OW - ow));
        else
            RI_FN(dw_tile_h)(orow + ow, OW, s0 + ow, SP, sh, wc, KH, KW, bias_c, NR, (int)(OW - ow));
        return;
    }
#endif
    if (ow < OW) {                                               /* partial last tile */
        int64_t start = ow;
#if !(VBYTES == 64 && REFIMPL_X86_DISPATCH)
        if (OW >= RI_VLEN)
            start = OW - RI_VLEN;                                /* overlap: full store, same bits */
#endif
        if (RI_UNROLL && sw == 1 && KH == 7 && KW == 7)         /* common sizes, unrolled */
            RI_FN(dw_tile_s)(acc, s0 + start, SP, sh, wc, 7, 7, 1, NR);
        else if (RI_UNROLL && sw == 1 && sh == 1 && KH == 3 && KW == 3)
            RI_FN(dw_tile_s1)(acc, s0 + start, SP, wc, 3, 3, NR);
        else if (sw == 1)
            RI_FN(dw_tile_s)(acc, s0 + start, SP, sh, wc, KH, KW, 1, NR);
        else
            RI_FN(dw_tile_s)(acc, s0 + start * sw, SP, sh, wc, KH, KW, sw, NR);
        if (start + RI_VLEN == OW)
            RI_FN(dw_store)(orow + start, OW, acc, bias_c, NR);
        else
            RI_FN(dw_store_n)(orow + start, OW, acc, bias_c, NR, (int)(OW - start));
    }
}

/* One staged plane: groups of RI_ROWS output rows (the last group: the largest power of two that fits). */
RI_TARGET
static REFIMPL_INLINE void RI_FN(dw_plane_s)(REAL *restrict op, const REAL *restrict sb, int64_t SP,
                                             const REAL *restrict wc, const REAL *bias_c, int64_t sh,
                                             int64_t sw, int64_t KH, int64_t KW, int64_t OH, int64_t OW)
{
    for (int64_t oh = 0; oh < OH;) {
        int nr = RI_ROWS;
        while (oh + nr > OH)
            nr /= 2;
        REAL *orow = op + oh * OW;
        const int64_t j0 = oh * sh;
        if (nr == RI_ROWS)
            RI_FN(dw_rows_s)(orow, sb, SP, j0, wc, bias_c, sh, sw, KH, KW, OW, RI_ROWS);
#if RI_ROWS > 4
        else if (nr == 4)
            RI_FN(dw_rows_s)(orow, sb, SP, j0, wc, bias_c, sh, sw, KH, KW, OW, 4);
#endif
        else if (nr == 2)
            RI_FN(dw_rows_s)(orow, sb, SP, j0, wc, bias_c, sh, sw, KH, KW, OW, 2);
        else
            RI_FN(dw_rows_s)(orow, sb, SP, j0, wc, bias_c, sh, sw, KH, KW, OW, 1);
        oh += nr;
    }
}

/*
 * Every (b, c) plane (P = B C of them) through the staged buffer.  Returns 0 when the padded plane does
 * not fit the buffer (nothing is written; the caller uses dw_plane), 1 when done.  Channels with a
 * non-finite weight are passed to literal (dw_plane_literal).
 */
RI_TARGET
static int RI_FN(dw_planes_staged)(REAL *restrict out, const REAL *restrict x, const REAL *restrict weight,
                                   const REAL *bias, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
                                   int64_t P, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                                   int64_t OH, int64_t OW,
                                   void (*literal)(REAL *restrict, const REAL *restrict, const REAL *restrict,
                                                   const REAL *, int64_t, int64_t, int64_t, int64_t, int64_t,
                                                   int64_t, int64_t, int64_t, int64_t, int64_t))
{
    enum { NSTAGE = RI_STAGE_BYTES / sizeof(REAL) };
    const int64_t ntile = (OW + RI_VLEN - 1) / RI_VLEN;
    const int64_t SR = (OH - 1) * sh + KH;                       /* fits: checked by the entry */
    if (SR > NSTAGE || ntile > NSTAGE || sw > NSTAGE || KW > NSTAGE)
        return 0;
    const int64_t SPmin = (ntile * RI_VLEN - 1) * sw + KW;
    if (SPmin > NSTAGE / SR)
        return 0;
    /* The row pitch: the smallest of 32, 64, 128 elements that holds a row and fits, else the minimum. */
    int64_t PITCH = 0;
    for (int64_t q = 32; q <= 128 && !PITCH; q *= 2)
        if (SPmin <= q && q <= NSTAGE / SR)
            PITCH = q;
    const int64_t SP = PITCH ? PITCH : SPmin;
    REAL sb[NSTAGE] __attribute__((aligned(64)));
    /* Image rows [0, nh) and columns [0, nw) are inside the staged window. */
    const int64_t nh = SR - pt < H ? (SR - pt > 0 ? SR - pt : 0) : H;
    const int64_t nw = SP - pl < W ? (SP - pl > 0 ? SP - pl : 0) : W;
    int zeroed = 0;
    const int64_t ksize = KH * KW;
    for (int64_t p = 0; p < P; ++p) {
        const int64_t c = p % C;
        const REAL *wc = weight + c * ksize;
        const REAL *bias_c = bias ? bias + c : 0;
        int finite = 1;
        for (int64_t k = 0; k < ksize; ++k)
            finite &= isfinite(wc[k]) ? 1 : 0;
        if (!finite) {
            literal(out + p * OH * OW, x + p * H * W, wc, bias_c, sh, sw, pt, pl, H, W, KH, KW, OH, OW);
            continue;
        }
        if (!zeroed) {                                           /* the border, once per call */
            for (int64_t k = 0; k < SR * SP; ++k)
                sb[k] = 0;
            zeroed = 1;
        }
        const REAL *xp = x + p * H * W;
        if (nw > 0)
            for (int64_t ih = 0; ih < nh; ++ih)
                RI_FN(dw_copy)(sb + (ih + pt) * SP + pl, xp + ih * W, nw);
        REAL *op = out + p * OH * OW;
        /* With stride 1 down the rows and one of a few fixed pitches, every tap's input vector is at a
         * constant offset from one pointer (no per-row pointers to keep in registers). */
        if (sh == 1 && PITCH == 32)
            RI_FN(dw_plane_s)(op, sb, 32, wc, bias_c, 1, sw, KH, KW, OH, OW);
        else if (sh == 1 && PITCH == 64)
            RI_FN(dw_plane_s)(op, sb, 64, wc, bias_c, 1, sw, KH, KW, OH, OW);
        else if (sh == 1 && PITCH == 128)
            RI_FN(dw_plane_s)(op, sb, 128, wc, bias_c, 1, sw, KH, KW, OH, OW);
        else
            RI_FN(dw_plane_s)(op, sb, SP, wc, bias_c, sh, sw, KH, KW, OH, OW);
    }
    return 1;
}

#undef RI_VLEN
#undef RI_UNROLL
#undef RI_FN
#undef RI_CAT
#undef RI_CAT2
