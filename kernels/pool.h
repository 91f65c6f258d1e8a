/* Threads for the fast CPU kernels that are not BLAS (the optimizer's passes, large fills).
 *
 * One process-wide pool of worker threads that sleep on a condition variable between
 * jobs (no spinning: the machines are shared, and OpenBLAS's own threads want the cores
 * right after). kn_parallel splits a job into parts, runs part 0 on the caller and the
 * others on the workers, and returns when all are done. The thread count is the one
 * kn_blas_set_threads sets (kernels/matmul.h): the rank's threads, for BLAS and pool alike.
 *
 * A kernel that uses the pool must give the same bits for any number of parts (split
 * elementwise work anywhere; reduce in a fixed order of fixed-size blocks), because ranks
 * of one job may run different thread counts. When the pool is busy (another thread of the
 * process is inside kn_parallel, as when a test runs its ranks as threads) the job runs
 * its parts one after another on the caller: the same bits, only slower. */
#ifndef KN_POOL_H
#define KN_POOL_H

#include <stddef.h>

/* fn(ctx, part, nparts) for part in [0, nparts): each part once, concurrently. */
typedef void (*kn_part_fn)(void *ctx, int part, int nparts);

/* Threads kn_parallel uses, including the caller (n >= 1; larger values are capped at
 * KN_POOL_MAX). Workers start on first use. */
#define KN_POOL_MAX 64
void kn_pool_set_threads(int n);
int kn_pool_threads(void);

/* Run fn over nparts parts (nparts <= 0: kn_pool_threads(); more than KN_POOL_MAX run one
 * after another on the caller). */
void kn_parallel(kn_part_fn fn, void *ctx, int nparts);

/* Parts for n elements of work when each part should get at least min_per_part:
 * between 1 and kn_pool_threads(). */
int kn_pool_parts(size_t n, size_t min_per_part);

/* [*lo, *hi) of part `part` of nparts over n elements, the bounds multiples of align
 * (except hi = n at the end). */
void kn_part_range(size_t n, size_t align, int part, int nparts, size_t *lo, size_t *hi);

/* memset over the pool for large sizes (zeroing gradients, filling buffers). */
void kn_memset(void *p, int value, size_t bytes);

#endif
