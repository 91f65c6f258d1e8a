/* The kernels' worker pool (kernels/pool.h). A job is published under the mutex with a
 * new generation number; each worker runs the part matching its index and counts itself
 * done; the caller runs part 0 and waits for the count. kn_parallel holds `busy` for the
 * whole job, so a second caller (another thread) runs its job alone instead of waiting. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kernels/pool.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_mutex_t busy;
    int started;   /* workers running (indices 1..started) */
    uint64_t gen;  /* bumped per job */
    kn_part_fn fn; /* the job */
    void *ctx;
    int nparts;
    int pending;                /* parts still running on workers */
    uint64_t born[KN_POOL_MAX]; /* gen when worker i started: jobs after that are its */
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .go = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .busy = PTHREAD_MUTEX_INITIALIZER,
};

static atomic_int wanted = 1;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    uint64_t seen = pool.born[id];
    for (;;) {
        while (pool.gen == seen) {
            pthread_cond_wait(&pool.go, &pool.mu);
        }
        seen = pool.gen;
        if (id >= pool.nparts) {
            continue;
        }
        kn_part_fn fn = pool.fn;
        void *ctx = pool.ctx;
        int nparts = pool.nparts;
        pthread_mutex_unlock(&pool.mu);
        fn(ctx, id, nparts);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) {
            pthread_cond_signal(&pool.done);
        }
    }
    return NULL;
}

/* Workers 1..n-1 running; returns how many parts can run concurrently. Under pool.mu. */
static int ensure_workers(int n)
{
    while (pool.started + 1 < n) {
        pthread_t th;
        pthread_attr_t attr;
        pool.born[pool.started + 1] = pool.gen;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker, (void *)(intptr_t)(pool.started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            break;
        }
        pool.started++;
    }
    return pool.started + 1;
}

void kn_pool_set_threads(int n)
{
    n = n < 1 ? 1 : n > KN_POOL_MAX ? KN_POOL_MAX : n;
    atomic_store(&wanted, n);
}

int kn_pool_threads(void)
{
    return atomic_load(&wanted);
}

static void run_alone(kn_part_fn fn, void *ctx, int nparts)
{
    for (int i = 0; i < nparts; i++) {
        fn(ctx, i, nparts);
    }
}

void kn_parallel(kn_part_fn fn, void *ctx, int nparts)
{
    if (nparts <= 0) {
        nparts = kn_pool_threads();
    }
    if (nparts == 1 || nparts > KN_POOL_MAX || pthread_mutex_trylock(&pool.busy) != 0) {
        run_alone(fn, ctx, nparts);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    int lanes = ensure_workers(nparts);
    if (lanes < nparts) { /* could not start enough threads: the same parts, serially */
        pthread_mutex_unlock(&pool.mu);
        pthread_mutex_unlock(&pool.busy);
        run_alone(fn, ctx, nparts);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.nparts = nparts;
    pool.pending = nparts - 1;
    pool.gen++;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, nparts);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) {
        pthread_cond_wait(&pool.done, &pool.mu);
    }
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
}

int kn_pool_parts(size_t n, size_t min_per_part)
{
    size_t t = (size_t)kn_pool_threads();
    size_t by_work = min_per_part ? n / min_per_part : t;
    size_t parts = by_work < t ? by_work : t;
    return parts < 1 ? 1 : (int)parts;
}

void kn_part_range(size_t n, size_t align, int part, int nparts, size_t *lo, size_t *hi)
{
    size_t units = (n + align - 1) / align;
    size_t a = units * (size_t)part / (size_t)nparts,
           b = units * (size_t)(part + 1) / (size_t)nparts;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

typedef struct memset_job {
    unsigned char *p;
    int value;
    size_t bytes;
} memset_job_t;

static void memset_part(void *ctx, int part, int nparts)
{
    const memset_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->bytes, 4096, part, nparts, &lo, &hi);
    memset(j->p + lo, j->value, hi - lo);
}

void kn_memset(void *p, int value, size_t bytes)
{
    memset_job_t j = {p, value, bytes};
    kn_parallel(memset_part, &j, kn_pool_parts(bytes, (size_t)1 << 20));
}
