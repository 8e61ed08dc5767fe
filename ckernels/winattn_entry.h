/*
 * Windowed softmax attention: the public entry point for one floating type.  Included by linattn.c once
 * per type (REAL, TSUF) after the per-ISA work items of winattn_body.h.
 *
 *   int refimpl_window_attention_f64(out, workspace, q, k, v, bias, mask, scale, BH, H, N, M, d, e,
 *                                    bias_count, mask_count, workspace_len, nthreads)   (and _f32)
 *
 *   out (BH, N, e); q (BH, N, d), k (BH, M, d), v (BH, M, e); BH = windows x heads, head fastest.
 *   bias  NULL or (bias_count, N, M): item bh uses bias[bh % bias_count] (bias_count = H for a relative-
 *         position bias shared by the windows, BH for one bias per item).
 *   mask  NULL or (mask_count, N, M) bytes, nonzero = may attend: item bh uses mask[(bh / H) % mask_count]
 *         (windows batch-major: window w of image b is item (b nW + w) H + head).
 *   Work items are the BH (window, head) pairs, each independent and written by one thread into its own
 *   rows of out, so the result does not depend on the thread count or on which thread runs an item; they
 *   run as one phase of par_run (parallel.h: threads claim items from an atomic counter).  A thread's
 *   scratch (its tid's slice of the workspace) is written before it is read within each item.
 */

#define WE_CAT2(a, b) a##_##b
#define WE_CAT(a, b) WE_CAT2(a, b)
#define WE_FN(name) WE_CAT(name, TSUF)

typedef void (*WE_FN(wa_item_fn))(REAL *restrict, REAL *restrict, const REAL *restrict, const REAL *restrict,
                                  const REAL *restrict, const REAL *restrict, const unsigned char *restrict,
                                  REAL, int64_t, int64_t, int64_t, int64_t);

struct WE_FN(wa_job) {
    REAL *out, *ws;
    const REAL *q, *k, *v, *bias;
    const unsigned char *mask;
    REAL scale;
    int64_t BH, H, N, M, d, e, bias_count, mask_count, scratch_len;
    WE_FN(wa_item_fn) item;
};

/* One work item (parallel.h): the (window, head) pair bh; tid selects the scratch slice only. */
static void WE_FN(wa_run_item)(void *ctx, int64_t phase, int64_t bh, int64_t tid)
{
    const struct WE_FN(wa_job) *j = (const struct WE_FN(wa_job) *)ctx;
    const int64_t nm = j->N * j->M;
    (void)phase;
    j->item(j->out + bh * j->N * j->e, j->ws + tid * j->scratch_len, j->q + bh * j->N * j->d,
            j->k + bh * j->M * j->d, j->v + bh * j->M * j->e, j->bias ? j->bias + (bh % j->bias_count) * nm : 0,
            j->mask ? j->mask + ((bh / j->H) % j->mask_count) * nm : 0, j->scale, j->N, j->M, j->d, j->e);
}

int WE_FN(refimpl_window_attention)(REAL *out, REAL *workspace, const REAL *q, const REAL *k, const REAL *v,
                                    const REAL *bias, const unsigned char *mask, double scale, int64_t BH,
                                    int64_t H, int64_t N, int64_t M, int64_t d, int64_t e, int64_t bias_count,
                                    int64_t mask_count, int64_t workspace_len, int64_t nthreads)
{
    if (!out || !workspace || !q || !k || !v)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || H < 1 || N < 1 || M < 1 || d < 1 || e < 1 || nthreads < 1 || BH % H ||
        (bias && (bias_count < 1 || bias_count > BH)) || (mask && (mask_count < 1 || mask_count > BH)))
        return REFIMPL_ERR_SIZE;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * N > lim / e || BH * M > lim / d ||
        BH * M > lim / e || N > lim / M || N * M > lim / BH)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t threads = la_threads(nthreads);
    const int64_t need = refimpl_window_attention_workspace(N, M, d, threads);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;
    struct WE_FN(wa_job) j;
    j.out = out;
    j.ws = workspace;
    j.q = q;
    j.k = k;
    j.v = v;
    j.bias = bias;
    j.mask = mask;
    j.scale = (REAL)scale;
    j.BH = BH;
    j.H = H;
    j.N = N;
    j.M = M;
    j.d = d;
    j.e = e;
    j.bias_count = bias_count;
    j.mask_count = mask_count;
    j.scratch_len = d * M + N * M + N * d + M + N;
    j.item = WE_FN(wa_item_base);
#if LA_X86_DISPATCH
    {
        const int isa = refimpl_isa_in_use();
        if (isa >= REFIMPL_ISA_AVX512)
            j.item = WE_FN(wa_item_avx512);
        else if (isa >= REFIMPL_ISA_AVX2)
            j.item = WE_FN(wa_item_avx2);
    }
#endif
    const int small = BH * N * M <= LA_PARALLEL_MIN / (d + e);
    par_run(&j, 1, &BH, WE_FN(wa_run_item), 0, small ? 1 : (threads < BH ? threads : BH));
    return REFIMPL_OK;
}

#undef WE_FN
#undef WE_CAT
#undef WE_CAT2
