/*
 * Fused linear attention forward: the public entry point for one floating type.  Included by linattn.c
 * once per type with REAL and TSUF (f64 / f32) defined, after the per-ISA work items of linattn_body.h
 * (la_pass1_<ISA>_<TSUF>, la_pass2_...) have been defined.  The two passes are the two phases of one
 * par_run (parallel.h), with the chunk reduction between them.
 */

#define LE_CAT2(a, b) a##_##b
#define LE_CAT(a, b) LE_CAT2(a, b)
#define LE_FN(name) LE_CAT(name, TSUF)

typedef void (*LE_FN(la_pass1_fn))(REAL *restrict, REAL *restrict, REAL *restrict, REAL *restrict,
                                   const REAL *restrict, const REAL *restrict, const REAL *restrict,
                                   const REAL *restrict, int64_t, int64_t, int64_t, const struct la_policy *);
typedef void (*LE_FN(la_pass2_fn))(REAL *restrict, REAL *restrict, const REAL *restrict, const REAL *restrict,
                                   const REAL *restrict, const REAL *restrict, const REAL *restrict, int64_t,
                                   int64_t, int64_t, const struct la_policy *);

struct LE_FN(la_job) {
    REAL *out, *ws, *scratch0;
    const REAL *q, *k, *v, *kw, *vs;
    int64_t BH, N, M, d, e, nc, nqb, scratch_len;
    REAL kv_scale;
    struct la_policy pol;
    LE_FN(la_pass1_fn) pass1;
    LE_FN(la_pass2_fn) pass2;
};

/* One work item (parallel.h): phase 0 is pass 1, item (head bh, key chunk c) -> that chunk's partial KV,
 * key sum and value sum in its own workspace slot; phase 1 is pass 2, item (head bh, block b of LA_QB
 * queries) -> those rows of out.  tid selects only the staging scratch, which an item writes before it
 * reads, so which thread runs an item changes nothing. */
static void LE_FN(la_item)(void *ctx, int64_t phase, int64_t it, int64_t tid)
{
    const struct LE_FN(la_job) *j = (const struct LE_FN(la_job) *)ctx;
    REAL *scratch = j->scratch0 + tid * j->scratch_len;
    const int64_t slot = j->d * (j->e + 1) + j->e;
    if (phase == 0) {
        const int64_t bh = it / j->nc, c = it % j->nc;
        const int64_t t0 = j->M * c / j->nc, t1 = j->M * (c + 1) / j->nc;
        REAL *kvp = j->ws + (bh * j->nc + c) * slot;
        j->pass1(kvp, kvp + j->d * j->e, kvp + j->d * (j->e + 1), scratch, j->k + (bh * j->M + t0) * j->d,
                 j->v + (bh * j->M + t0) * j->e, j->kw ? j->kw + bh * j->M + t0 : 0, j->vs ? j->vs + bh : 0,
                 t1 - t0, j->d, j->e, &j->pol);
    } else {
        const int64_t bh = it / j->nqb, b = it % j->nqb;
        const int64_t t0 = b * LA_QB, t1 = (t0 + LA_QB < j->N) ? t0 + LA_QB : j->N;
        const REAL *kv = j->ws + bh * j->nc * slot;
        j->pass2(j->out + (bh * j->N + t0) * j->e, scratch, j->q + (bh * j->N + t0) * j->d, kv,
                 kv + j->d * j->e, kv + j->d * (j->e + 1), j->v + (bh * j->M + t0) * j->e, t1 - t0, j->d,
                 j->e, &j->pol);
    }
}

/* Between the passes, on one thread: KV = ((KV_0 + KV_1) + KV_2) + ... per head in chunk order (likewise
 * the key and value sums), into chunk 0's slot; then s * KV (RALA's token scaling, rounded once). */
static void LE_FN(la_reduce)(void *ctx, int64_t phase)
{
    const struct LE_FN(la_job) *j = (const struct LE_FN(la_job) *)ctx;
    (void)phase;
    const int64_t slot = j->d * (j->e + 1) + j->e;
    for (int64_t bh = 0; bh < j->BH; ++bh) {
        REAL *acc = j->ws + bh * j->nc * slot;
        for (int64_t c = 1; c < j->nc; ++c) {
            const REAL *p = acc + c * slot;
            for (int64_t x = 0; x < slot; ++x)
                acc[x] += p[x];
        }
        if (j->kv_scale != 1)
            for (int64_t x = 0; x < slot; ++x)
                acc[x] = j->kv_scale * acc[x];
    }
}

/* The focused map's policy: p (finite, >= 1, else 0 is returned) and how r^p is formed (LA_FOCUSED_MUL_MAX
 * in linattn.c: p - 1 multiplications for an integer 1 <= p <= LA_FOCUSED_MUL_MAX, else pow). */
static int LE_FN(la_focused_policy)(struct la_policy *pol, double power)
{
    if (!(power >= 1.0) || !isfinite(power))   /* NaN, < 1 and +Inf refused */
        return 0;
    pol->map = LA_MAP_FOCUSED;
    pol->power = power;
    pol->ipow = (power <= LA_FOCUSED_MUL_MAX && power == floor(power)) ? (int)power : 0;
    return 1;
}

/* Both public entries: checks, then the two passes.  pol is filled by the caller except M. */
static int LE_FN(la_run_all)(REAL *out, REAL *workspace, const REAL *q, const REAL *k, const REAL *v,
                             const REAL *key_weight, const REAL *v_scale, struct la_policy pol, double kv_scale,
                             int64_t BH, int64_t N, int64_t M, int64_t d, int64_t e, int64_t workspace_len,
                             int64_t nthreads)
{
    if (!out || !workspace || !q || !k || !v)
        return REFIMPL_ERR_NULL;
    if (BH < 1 || N < 1 || M < 1 || d < 1 || e < 1 || nthreads < 1)
        return REFIMPL_ERR_SIZE;
    if (pol.castling && pol.own && N != M)
        return REFIMPL_ERR_SIZE;
    const int64_t lim = PTRDIFF_MAX / (int64_t)sizeof(REAL);
    if (N > lim / BH || M > lim / BH || BH * N > lim / d || BH * N > lim / e || BH * M > lim / d ||
        BH * M > lim / e || M > lim / LA_MAX_CHUNKS)
        return REFIMPL_ERR_OVERFLOW;
    const int64_t threads = la_threads(nthreads);
    const int64_t need = refimpl_linear_attention_workspace(BH, M, d, e, threads);
    if (need < 0)
        return REFIMPL_ERR_OVERFLOW;
    if (workspace_len < need)
        return REFIMPL_ERR_WORKSPACE;

    struct LE_FN(la_job) j;
    j.out = out;
    j.ws = workspace;
    j.q = q;
    j.k = k;
    j.v = v;
    j.kw = key_weight;
    j.vs = v_scale;
    j.BH = BH;
    j.N = N;
    j.M = M;
    j.d = d;
    j.e = e;
    j.nc = refimpl_linear_attention_chunks(M);
    j.nqb = (N + LA_QB - 1) / LA_QB;
    j.scratch0 = workspace + BH * j.nc * (d * (e + 1) + e);
    j.scratch_len = LA_TB * (d + e) + LA_TB;
    j.kv_scale = (REAL)kv_scale;
    j.pol = pol;
    j.pol.M = M;
    j.pass1 = LE_FN(la_pass1_base);
    j.pass2 = LE_FN(la_pass2_base);
#if LA_X86_DISPATCH
    {
        const int isa = refimpl_isa_in_use();
        if (isa >= REFIMPL_ISA_AVX512) {
            j.pass1 = LE_FN(la_pass1_avx512);
            j.pass2 = LE_FN(la_pass2_avx512);
        } else if (isa >= REFIMPL_ISA_AVX2) {
            j.pass1 = LE_FN(la_pass1_avx2);
            j.pass2 = LE_FN(la_pass2_avx2);
        }
    }
#endif
    const int small = BH * (N + M) <= LA_PARALLEL_MIN / d / e;
    const int64_t items[2] = {BH * j.nc, BH * j.nqb};   /* pass 1, pass 2 */
    const int64_t most = items[0] > items[1] ? items[0] : items[1];
    par_run(&j, 2, items, LE_FN(la_item), LE_FN(la_reduce), small ? 1 : (threads < most ? threads : most));
    return REFIMPL_OK;
}

int LE_FN(refimpl_linear_attention)(REAL *out, REAL *workspace, const REAL *q, const REAL *k, const REAL *v,
                                    const REAL *key_weight, const REAL *v_scale,
                                    const struct refimpl_la_options *options, int64_t BH, int64_t N, int64_t M,
                                    int64_t d, int64_t e, int64_t workspace_len, int64_t nthreads)
{
    if (!options)
        return REFIMPL_ERR_NULL;
    const struct refimpl_la_options o = *options;
    if ((o.feature_map != LA_MAP_RELU && o.feature_map != LA_MAP_ELU1 && o.feature_map != LA_MAP_FOCUSED) ||
        (o.eps_policy != 0 && o.eps_policy != 1))
        return REFIMPL_ERR_OPTION;
    struct la_policy pol;
    memset(&pol, 0, sizeof pol);
    if (o.feature_map == LA_MAP_FOCUSED && !LE_FN(la_focused_policy)(&pol, o.power))
        return REFIMPL_ERR_OPTION;
    pol.map = o.feature_map;
    pol.clamp = o.clamp != 0;
    pol.clamp_min = o.clamp_min;
    pol.eps = o.eps;
    pol.eps_clamp = o.eps_policy == 1;
    pol.v_divide = o.v_scale_divide != 0;
    return LE_FN(la_run_all)(out, workspace, q, k, v, key_weight, v_scale, pol, o.kv_scale, BH, N, M, d, e,
                             workspace_len, nthreads);
}

int LE_FN(refimpl_linear_angular)(REAL *out, REAL *workspace, const REAL *q, const REAL *k, const REAL *v,
                                  double unit_eps, int constant_own, int similarity_sum, int64_t BH, int64_t N,
                                  int64_t M, int64_t d, int64_t e, int64_t workspace_len, int64_t nthreads)
{
    struct la_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.map = LA_MAP_UNIT;
    pol.map_eps = unit_eps;
    pol.castling = 1;
    pol.own = constant_own != 0;
    pol.simsum = similarity_sum != 0;
    return LE_FN(la_run_all)(out, workspace, q, k, v, 0, 0, pol, 1.0, BH, N, M, d, e, workspace_len, nthreads);
}

/* The staging function (feature map code) of the vector level in use: the same bits at every level. */
typedef void (*LE_FN(la_stage_fn))(REAL *restrict, const REAL *restrict, int64_t, int64_t,
                                   const struct la_policy *);

static LE_FN(la_stage_fn) LE_FN(la_stage_for_isa)(void)
{
#if LA_X86_DISPATCH
    const int isa = refimpl_isa_in_use();
    if (isa >= REFIMPL_ISA_AVX512)
        return LE_FN(la_stage_avx512);
    if (isa >= REFIMPL_ISA_AVX2)
        return LE_FN(la_stage_avx2);
#endif
    return LE_FN(la_stage_base);
}

/* out[i] = ELU(x[i]) + 1 for i < n: the fused kernel's own ELU + 1 staging (la_stage with LA_MAP_ELU1:
 * x + 1 for x > 0, the vector exp of linattn_body.h for x <= 0, libm exp below its range and for NaN),
 * exposed for callers that need the map outside the kernel (RALA's alpha logits, Eq. 4).  One thread;
 * element-wise, so the same bits at every vector level.  out and x must not overlap. */
int LE_FN(refimpl_elu1_feature_map)(REAL *out, const REAL *x, int64_t n)
{
    if (!out || !x)
        return REFIMPL_ERR_NULL;
    if (n < 1)
        return REFIMPL_ERR_SIZE;
    struct la_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.map = LA_MAP_ELU1;
    const LE_FN(la_stage_fn) stage = LE_FN(la_stage_for_isa)();
    stage(out, x, 1, n, &pol);   /* ELU + 1 is element-wise: one "token" of n features */
    return REFIMPL_OK;
}

/* out[r, :] = phi_p(x[r, :]) for r < rows (FLatten Eq. 6, focused.focused_feature_map(x, p,
 * power_scaling="max")): the fused kernel's own LA_MAP_FOCUSED staging (the same bits as the map inside
 * refimpl_linear_attention), exposed for tests of the map alone and for callers that need it outside the
 * kernel.  One thread; row-wise with a fixed order, so the same bits at every vector level.  out and x
 * (rows, d), packed, must not overlap. */
int LE_FN(refimpl_focused_feature_map)(REAL *out, const REAL *x, int64_t rows, int64_t d, double power)
{
    if (!out || !x)
        return REFIMPL_ERR_NULL;
    if (rows < 1 || d < 1)
        return REFIMPL_ERR_SIZE;
    if (rows > (PTRDIFF_MAX / (int64_t)sizeof(REAL)) / d)
        return REFIMPL_ERR_OVERFLOW;
    struct la_policy pol;
    memset(&pol, 0, sizeof pol);
    if (!LE_FN(la_focused_policy)(&pol, power))
        return REFIMPL_ERR_OPTION;
    const LE_FN(la_stage_fn) stage = LE_FN(la_stage_for_isa)();
    stage(out, x, rows, d, &pol);
    return REFIMPL_OK;
}

#undef LE_FN
#undef LE_CAT
#undef LE_CAT2
