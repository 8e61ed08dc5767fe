/*
 * RALA's alpha (Eq. 4): the public entry point for one floating type.  Included by linattn.c once per type
 * with REAL and TSUF (f64 / f32) defined, after the per-ISA work items of rala_body.h.
 *
 *   int refimpl_rala_alpha_f64(alpha, workspace, q, k, feature_map, kappa_q, scale, BH, N, M, d,
 *                              workspace_len, nthreads)   (and _f32)
 *
 *   alpha       (BH, M)  written completely on success, untouched on a nonzero status
 *   workspace   workspace_len >= refimpl_rala_alpha_workspace(BH, N, M, d, nthreads) elements
 *   q (BH, N, d), k (BH, M, d), packed C order
 *   feature_map kappa: LA_MAP_RELU (0) or LA_MAP_ELU1 (1)
 *   kappa_q     nonzero: Q_g is the mean of kappa(Q) (global_query "kappa_q"), else of Q
 *   scale       the logits' factor (d^-1/2 for alpha_scale "head_dim", 1 otherwise), rounded to REAL
 *
 * Four phases of one par_run (parallel.h), each over (head, chunk) items (which thread runs an item
 * changes nothing: an item writes only its own partial result and its own elements of alpha; tid selects
 * only the staging scratch).  Between phases one thread combines the partials of each head in chunk
 * order:
 *   1. partial sums of Q (or kappa(Q)) over the chunk's tokens       -> Q_g = (sum of partials) / N
 *   2. logits l_j (into alpha) and the chunk's max (NaN if any is)     -> m = max of the chunk maxima
 *   3. e_j = exp(l_j - m) (in alpha) and the chunk's sum             -> S = sum of the chunk sums
 *   4. alpha_j = M * (e_j / S)
 * The order of every operation is fixed (rala_body.h), so the result is bitwise identical across runs,
 * thread counts and vector levels.
 */

#define RE_CAT2(a, b) a##_##b
#define RE_CAT(a, b) RE_CAT2(a, b)
#define RE_FN(name) RE_CAT(name, TSUF)

/* Below this many multiply-adds (BH (N + M) d) a call runs on the calling thread: a create/join round and
 * three barriers are not worth it at N = 3136 and below (measured with four create/join rounds, some 10-50
 * us each). */
#define RA_PARALLEL_MIN ((int64_t)1 << 20)

struct RE_FN(ra_isa) {
    void (*qsum)(REAL *restrict, REAL *restrict, const REAL *restrict, int64_t, int64_t, int,
                 const struct la_policy *);
    REAL (*logits)(REAL *restrict, REAL *restrict, const REAL *restrict, const REAL *restrict, int64_t, int64_t,
                   REAL, const struct la_policy *);
    REAL (*exps)(REAL *restrict, int64_t, REAL);
    void (*scale)(REAL *restrict, int64_t, REAL, REAL);
};

struct RE_FN(ra_job) {
    REAL *alpha, *qpart, *qg, *cmax, *csum, *scratch0;
    const REAL *q, *k;
    int64_t BH, N, M, d, ncq, nck, scratch_len;
    int kappa_q;
    REAL scale, Mr;
    struct la_policy pol;
    struct RE_FN(ra_isa) f;
};

/* One work item (parallel.h) of phase p = 0..3 (steps 1-4 above): item it is (head bh, chunk c) of the
 * head's ncq query chunks (step 1) or nck key chunks (steps 2-4).  It writes only its own partial (qpart,
 * cmax, csum slot it) and its own elements of alpha; tid selects only the staging scratch. */
static void RE_FN(ra_item)(void *ctx, int64_t phase, int64_t it, int64_t tid)
{
    const struct RE_FN(ra_job) *j = (const struct RE_FN(ra_job) *)ctx;
    const int64_t nc = phase == 0 ? j->ncq : j->nck;
    REAL *scratch = j->scratch0 + tid * j->scratch_len;
    const int64_t bh = it / nc, c = it % nc;
    if (phase == 0) {
        const int64_t t0 = j->N * c / nc, t1 = j->N * (c + 1) / nc;
        j->f.qsum(j->qpart + it * j->d, scratch, j->q + (bh * j->N + t0) * j->d, t1 - t0, j->d, j->kappa_q,
                  &j->pol);
        return;
    }
    const int64_t t0 = j->M * c / nc, t1 = j->M * (c + 1) / nc;
    REAL *a = j->alpha + bh * j->M + t0;
    if (phase == 1)
        j->cmax[it] = j->f.logits(a, scratch, j->k + (bh * j->M + t0) * j->d, j->qg + bh * j->d, t1 - t0, j->d,
                                  j->scale, &j->pol);
    else if (phase == 2)
        j->csum[it] = j->f.exps(a, t1 - t0, j->cmax[bh * nc]);
    else
        j->f.scale(a, t1 - t0, j->Mr, j->csum[bh * nc]);
}

/* Between the phases, on one thread: each head's partials combined in chunk order. */
static void RE_FN(ra_combine)(void *ctx, int64_t phase)
{
    const struct RE_FN(ra_job) *j = (const struct RE_FN(ra_job) *)ctx;
    const int64_t d = j->d;
    if (phase == 0) {            /* 1. Q_g = (sum of the chunk partials in chunk order) / N */
        for (int64_t bh = 0; bh < j->BH; ++bh) {
            REAL *g = j->qg + bh * d;
            const REAL *p = j->qpart + bh * j->ncq * d;
            for (int64_t i = 0; i < d; ++i)
                g[i] = p[i];
            for (int64_t c = 1; c < j->ncq; ++c)
                for (int64_t i = 0; i < d; ++i)
                    g[i] += p[c * d + i];
            for (int64_t i = 0; i < d; ++i)
                g[i] = g[i] / (REAL)j->N;
        }
    } else if (phase == 1) {     /* 2. m = max_j l_j (NaN if any is NaN), into chunk 0's slot */
        for (int64_t bh = 0; bh < j->BH; ++bh) {
            REAL *mx = j->cmax + bh * j->nck;
            int nan = mx[0] != mx[0];
            for (int64_t c = 1; c < j->nck; ++c) {
                mx[0] = mx[c] > mx[0] ? mx[c] : mx[0];
                nan |= mx[c] != mx[c];
            }
            if (nan)
                mx[0] = (REAL)NAN;
        }
    } else {                     /* 3. S = sum of the chunk sums in chunk order, into chunk 0's slot */
        for (int64_t bh = 0; bh < j->BH; ++bh) {
            REAL *s = j->csum + bh * j->nck;
            for (int64_t c = 1; c < j->nck; ++c)
                s[0] += s[c];
        }
    }
}

int RE_FN(refimpl_rala_alpha)(REAL *alpha, REAL *workspace, const REAL *q, const REAL *k, int feature_map,
                              int kappa_q, double scale, int64_t BH, int64_t N, int64_t M, int64_t d,
                              int64_t workspace_len, int64_t nthreads)
{
    if (!alpha || !workspace || !q || !k)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || N < 1 || M < 1 || d < 1 || nthreads < 1)
        return REFIMPL_ERR_SIZE;
    if (feature_map != LA_MAP_RELU && feature_map != LA_MAP_ELU1)
        return REFIMPL_ERR_OPTION;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * M > lim / d)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t threads = la_threads(nthreads);
    const int64_t need = refimpl_rala_alpha_workspace(BH, N, M, d, threads);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    struct RE_FN(ra_job) j;
    memset(&j, 0, sizeof j);
    j.alpha = alpha;
    j.q = q;
    j.k = k;
    j.BH = BH;
    j.N = N;
    j.M = M;
    j.d = d;
    j.ncq = refimpl_linear_attention_chunks(N);
    j.nck = refimpl_linear_attention_chunks(M);
    j.kappa_q = kappa_q != 0;
    j.scale = (REAL)scale;
    j.Mr = (REAL)M;
    j.pol.map = feature_map;
    /* workspace: qpart (BH ncq d) | qg (BH d) | cmax (BH nck) | csum (BH nck) | scratch (threads x LA_TB d);
     * see refimpl_rala_alpha_workspace in linattn.c */
    j.qpart = workspace;
    j.qg = j.qpart + BH * j.ncq * d;
    j.cmax = j.qg + BH * d;
    j.csum = j.cmax + BH * j.nck;
    j.scratch0 = j.csum + BH * j.nck;
    j.scratch_len = LA_TB * d;
    j.f.qsum = RE_FN(ra_qsum_base);
    j.f.logits = RE_FN(ra_logits_base);
    j.f.exps = RE_FN(ra_exp_base);
    j.f.scale = RE_FN(ra_scale_base);
#if LA_X86_DISPATCH
    {
        const int isa = refimpl_isa_in_use();
        if (isa >= REFIMPL_ISA_AVX512) {
            j.f.qsum = RE_FN(ra_qsum_avx512);
            j.f.logits = RE_FN(ra_logits_avx512);
            j.f.exps = RE_FN(ra_exp_avx512);
            j.f.scale = RE_FN(ra_scale_avx512);
        } else if (isa >= REFIMPL_ISA_AVX2) {
            j.f.qsum = RE_FN(ra_qsum_avx2);
            j.f.logits = RE_FN(ra_logits_avx2);
            j.f.exps = RE_FN(ra_exp_avx2);
            j.f.scale = RE_FN(ra_scale_avx2);
        }
    }
#endif
    const int small = BH * (N + M) <= RA_PARALLEL_MIN / d;
    const int64_t items[4] = {BH * j.ncq, BH * j.nck, BH * j.nck, BH * j.nck};   /* steps 1-4 */
    const int64_t most = items[0] > items[1] ? items[0] : items[1];
    par_run(&j, 4, items, RE_FN(ra_item), RE_FN(ra_combine), small ? 1 : (threads < most ? threads : most));
    return REFIMPL_OK;
}

#undef RA_PARALLEL_MIN
#undef RE_FN
#undef RE_CAT
#undef RE_CAT2
