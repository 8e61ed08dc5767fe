/*
 * A self-test of the parallel runtime (parallel.h), for tests/test_kernels_parallel.py: it runs par_run
 * with work items that only count and check, and with chosen worker starts made to fail.
 *
 *   int refimpl_parallel_selftest(runs, runs_len, items, nphases, nthreads, fail_mask, report)
 *
 *   items      (nphases) the work items of each phase (>= 0), 1 <= nphases
 *   runs       (runs_len >= sum of items) set to how often each item ran, phase after phase
 *   fail_mask  bit k set (1 <= k < 64): the k-th worker start fails (as pthread_create failing would)
 *   report     (4) the team size par_run returned; the number of ordering violations seen (an item of
 *              phase p that ran before every item of phase p - 1 had returned, or before between(p - 1);
 *              a between(p) that ran before every item of phase p had returned, or out of turn; a tid
 *              outside the team); the largest tid seen plus 1; how often between ran.
 *   returns    REFIMPL_OK, or REFIMPL_ERR_NULL / REFIMPL_ERR_SIZE (then nothing is written)
 *
 * The contract it checks (parallel.h): every item of every phase runs exactly once; phases run in order,
 * separated by between; a worker that does not start claims nothing, and the team still finishes every
 * item.  Calls are serialised (the failing-start hook has process-wide state).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "refimpl_kernels.h"

static pthread_mutex_t pt_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t pt_fail_mask, pt_starts;

/* pthread_create, except that the starts named by pt_fail_mask fail (called by par_run's thread only). */
static int pt_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    const int64_t k = ++pt_starts;
    if (k < 64 && (pt_fail_mask >> k) & 1)
        return EAGAIN;
    return pthread_create(th, attr, fn, arg);
}

#define PAR_THREAD_CREATE pt_create
#include "parallel.h"

struct pt_ctx {
    int64_t *runs;
    const int64_t *items, *offset;
    int64_t nthreads;
    int64_t done[64];       /* items of each phase that have returned (atomic) */
    int64_t betweens;       /* between calls so far (atomic) */
    int64_t violations;     /* (atomic) */
    int64_t tid_end;        /* largest tid seen plus 1 (atomic max) */
};

static void pt_item(void *ctx, int64_t p, int64_t i, int64_t tid)
{
    struct pt_ctx *c = (struct pt_ctx *)ctx;
    int bad = tid < 0 || tid >= c->nthreads || __atomic_load_n(&c->betweens, __ATOMIC_ACQUIRE) != p;
    if (p > 0)
        bad |= __atomic_load_n(&c->done[p - 1], __ATOMIC_ACQUIRE) != c->items[p - 1];
    if (bad)
        __atomic_fetch_add(&c->violations, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->runs[c->offset[p] + i], 1, __ATOMIC_RELAXED);
    int64_t seen = __atomic_load_n(&c->tid_end, __ATOMIC_RELAXED);
    while (tid + 1 > seen && !__atomic_compare_exchange_n(&c->tid_end, &seen, tid + 1, 0, __ATOMIC_RELAXED,
                                                          __ATOMIC_RELAXED))
        ;
    __atomic_fetch_add(&c->done[p], 1, __ATOMIC_RELEASE);
}

static void pt_between(void *ctx, int64_t p)
{
    struct pt_ctx *c = (struct pt_ctx *)ctx;
    if (__atomic_load_n(&c->done[p], __ATOMIC_ACQUIRE) != c->items[p] ||
        __atomic_load_n(&c->betweens, __ATOMIC_ACQUIRE) != p)
        __atomic_fetch_add(&c->violations, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->betweens, 1, __ATOMIC_RELEASE);
}

int refimpl_parallel_selftest(int64_t *runs, int64_t runs_len, const int64_t *items, int64_t nphases,
                              int64_t nthreads, int64_t fail_mask, int64_t *report)
{
    if (!runs || !items || !report)
        return REFIMPL_ERR_NULL;
    if (nphases < 1 || nphases > 64 || nthreads < 1)
        return REFIMPL_ERR_SIZE;
    int64_t offset[64], total = 0;
    for (int64_t p = 0; p < nphases; ++p) {
        if (items[p] < 0 || items[p] > runs_len - total)
            return REFIMPL_ERR_SIZE;
        offset[p] = total;
        total += items[p];
    }
    for (int64_t x = 0; x < total; ++x)
        runs[x] = 0;
    struct pt_ctx c;
    c.runs = runs;
    c.items = items;
    c.offset = offset;
    c.nthreads = nthreads;
    for (int64_t p = 0; p < 64; ++p)
        c.done[p] = 0;
    c.betweens = 0;
    c.violations = 0;
    c.tid_end = 0;
    pthread_mutex_lock(&pt_lock);
    pt_fail_mask = fail_mask;
    pt_starts = 0;
    report[0] = par_run(&c, nphases, items, pt_item, pt_between, nthreads);
    pthread_mutex_unlock(&pt_lock);
    report[1] = c.violations;
    report[2] = c.tid_end;
    report[3] = c.betweens;
    return REFIMPL_OK;
}
