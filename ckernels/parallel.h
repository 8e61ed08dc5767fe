/*
 * The kernels' parallel runtime: run the work items of one or more phases on a team of POSIX threads.
 * Header-only (static functions), included by every translation unit that threads its work.
 *
 *   int64_t par_run(void *ctx, int64_t nphases, const int64_t *items, par_item_fn item,
 *                   par_serial_fn between, int64_t nthreads)
 *
 * runs, for p = 0, 1, ..., nphases - 1 in turn,
 *
 *   item(ctx, p, i, tid)   once for every i < items[p], on some thread tid in [0, team size), then
 *   between(ctx, p)        (if between is not NULL and p < nphases - 1) on one thread, once every item of
 *                          phase p has returned and before any item of phase p + 1 starts,
 *
 * and returns when every item of the last phase has returned.  Every thread count computes what this
 * serial version computes:
 *
 *   for (p = 0; p < nphases; ++p) {
 *       for (i = 0; i < items[p]; ++i)
 *           item(ctx, p, i, 0);
 *       if (between && p < nphases - 1)
 *           between(ctx, p);
 *   }
 *
 * provided that each item writes only memory that no other item of its phase reads or writes, and that
 * tid selects nothing but scratch memory the item writes before it reads.  The kernels cut their work
 * into items whose boundaries depend on the problem sizes only, each item writing its own partial result
 * or its own rows of the output, and combine the partials in item order in `between` (or after par_run):
 * so every thread count, and every assignment of items to threads, gives the same bits.
 *
 * How.  The caller is thread 0; it creates nthreads - 1 workers (tid 1, 2, ...), capped at
 * PAR_MAX_THREADS.  Within a phase every thread claims items one at a time from an atomic counter (reset
 * between phases) until none is left, so a thread that the OS schedules late (a loaded or shared machine)
 * delays nothing: the others take its items.  A worker that cannot be created claims no items (the others claim
 * them all), so a failure changes the speed, never the result.  Between phases the team meets at a
 * barrier (a mutex and a condition variable; the last thread to arrive runs `between`, then releases the
 * others), so one create/join round serves every phase.  The mutex also orders memory: whatever an item
 * of phase p wrote is visible to `between` and to every item of phase p + 1; pthread_join orders the last
 * phase's writes before par_run returns.  With nthreads <= 1 (or if the barrier cannot be set up) the
 * serial version above runs on the calling thread.
 *
 * Why POSIX threads and not OpenMP: no second OpenMP runtime in a process that may also hold torch's, and
 * a thread count that is an argument of each call rather than process-wide state.  Threads are created
 * for each call (some 10-50 us per create/join round); callers run small problems on one thread.
 *
 * Returns the team size that took part (1 + the workers that started); for tests and diagnostics only.
 */
#ifndef REFIMPL_PARALLEL_H
#define REFIMPL_PARALLEL_H

#include <pthread.h>
#include <stdint.h>

#define PAR_MAX_THREADS 64

/* How a worker is started: pthread_create, unless the including file names another function of its
 * signature first (ckernels/parallel.c's self-test does, to make chosen starts fail). */
#ifndef PAR_THREAD_CREATE
#define PAR_THREAD_CREATE pthread_create
#endif

typedef void (*par_item_fn)(void *ctx, int64_t phase, int64_t item, int64_t tid);
typedef void (*par_serial_fn)(void *ctx, int64_t phase);

struct par_team {
    void *ctx;
    par_item_fn item;
    par_serial_fn between;
    int64_t nphases;
    const int64_t *items;
    int64_t next;                  /* the current phase's next unclaimed item (atomic; reset by the barrier) */
    pthread_mutex_t mu;            /* the barrier: */
    pthread_cond_t cv;
    int64_t members;               /* threads taking part; INT64_MAX until the caller has created them */
    int64_t arrived;               /* threads at the current barrier */
    int64_t released;              /* phases whose barrier has opened */
};

struct par_worker {
    struct par_team *team;
    int64_t tid;
};

/* Claim and run items of phase p until none is left. */
static void par_claim(struct par_team *t, int64_t p, int64_t tid)
{
    for (;;) {
        const int64_t i = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
        if (i >= t->items[p])
            break;
        t->item(t->ctx, p, i, tid);
    }
}

/* The end of phase p for one thread: wait until every member has arrived (each has then found phase p's
 * counter exhausted); the last one runs between and resets the counter for phase p + 1. */
static void par_barrier(struct par_team *t, int64_t p)
{
    pthread_mutex_lock(&t->mu);
    if (++t->arrived == t->members) {
        if (t->between)
            t->between(t->ctx, p);
        __atomic_store_n(&t->next, 0, __ATOMIC_RELAXED);
        t->arrived = 0;
        t->released = p + 1;
        pthread_cond_broadcast(&t->cv);
    } else {
        while (t->released <= p)
            pthread_cond_wait(&t->cv, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
}

static void par_phases(struct par_team *t, int64_t tid)
{
    for (int64_t p = 0; p < t->nphases; ++p) {
        par_claim(t, p, tid);
        if (p + 1 < t->nphases)
            par_barrier(t, p);
    }
}

static void *par_worker_main(void *arg)
{
    const struct par_worker *w = (const struct par_worker *)arg;
    par_phases(w->team, w->tid);
    return 0;
}

static int64_t par_run(void *ctx, int64_t nphases, const int64_t *items, par_item_fn item, par_serial_fn between,
                       int64_t nthreads)
{
    struct par_team t;
    t.ctx = ctx;
    t.item = item;
    t.between = between;
    t.nphases = nphases;
    t.items = items;
    t.next = 0;
    const int64_t nt = nthreads < 1 ? 1 : (nthreads > PAR_MAX_THREADS ? PAR_MAX_THREADS : nthreads);
    int barrier = 0;
    if (nt > 1 && pthread_mutex_init(&t.mu, 0) == 0) {
        if (pthread_cond_init(&t.cv, 0) == 0)
            barrier = 1;
        else
            pthread_mutex_destroy(&t.mu);
    }
    if (!barrier) {                              /* the serial version */
        for (int64_t p = 0; p < t.nphases; ++p) {
            for (int64_t i = 0; i < items[p]; ++i)
                item(ctx, p, i, 0);
            if (between && p + 1 < t.nphases)
                between(ctx, p);
        }
        return 1;
    }
    t.members = INT64_MAX;
    t.arrived = 0;
    t.released = 0;
    pthread_t th[PAR_MAX_THREADS];
    struct par_worker w[PAR_MAX_THREADS];
    int started[PAR_MAX_THREADS];
    int64_t members = 1;
    for (int64_t k = 1; k < nt; ++k) {
        w[k].team = &t;
        w[k].tid = members;                      /* tids stay dense: a failed start leaves no hole */
        started[k] = PAR_THREAD_CREATE(&th[k], 0, par_worker_main, &w[k]) == 0;
        members += started[k];
    }
    pthread_mutex_lock(&t.mu);                   /* no barrier can open before every member is counted */
    t.members = members;
    pthread_mutex_unlock(&t.mu);
    par_phases(&t, 0);
    for (int64_t k = 1; k < nt; ++k)
        if (started[k])
            pthread_join(th[k], 0);
    pthread_cond_destroy(&t.cv);
    pthread_mutex_destroy(&t.mu);
    return members;
}

#endif /* REFIMPL_PARALLEL_H */
