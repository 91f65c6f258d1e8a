/* ncclsim: a collectives backend (workerd/coll/coll_impl.h) with NCCL's ordering rules, for
 * tests of code that will run on NCCL, on a machine without a GPU.
 *
 * The rules it enforces, as NCCL has them:
 * - Each group of each rank has one stream. Operations run on it one launch after another:
 *   a launch (one operation, or the two halves of a grouped wrk_coll_sendrecv) starts only
 *   when every earlier launch of that stream has finished.
 * - A send finishes only when the peer's stream has reached the matching receive (no eager
 *   buffering, as for any message larger than NCCL's buffers), and a collective only when
 *   every member's stream has reached it. The operations of one launch progress together.
 * - An output is written asynchronously: from the start until a test of its request sees it
 *   done (the wait NCCL's users owe the event), it holds all-ones bytes (NaN as f32) where
 *   it is not also an input, and the result lands only at that test. Code that reads an
 *   output it did not wait for reads NaN, whatever else has progressed meanwhile.
 * - A stream-ordered wait (wrk_coll_wait_stream) is what NCCL's caller enqueues on its
 *   compute stream; the compute stream here is devsim's, which runs kernels on the host at
 *   once, so the fake completes it on the host, and the context counts it as a stream wait
 *   (wrk_coll_wait_counts), apart from the host's own waits.
 * So two ranks that each queue [send][recv] to the other wait on each other for ever, as
 * they would on GPUs. The fake notices: when every rank of the world is blocked in a wait
 * and nothing can move for a second, every operation fails with -EDEADLK (instead of
 * hanging until the collectives' timeout) and the stuck heads are printed on stderr.
 *
 * Each operation's time from its start until a test sees it done is its group's device time
 * (wrk_coll_group_device_ns), as NCCL's events would give it.
 *
 * Ranks are threads of one process sharing one ncclsim_t. Memory is host memory (alloc is
 * posix_memalign, copies are memcpy); reductions add members in index order. */
#ifndef TEST_NCCLSIM_H
#define TEST_NCCLSIM_H

#include <stdint.h>

#include "workerd/coll/coll.h"

typedef struct ncclsim ncclsim_t;

/* A world of `world` ranks (each creates its context with ncclsim_config). 0 or -ENOMEM. */
int ncclsim_create(uint32_t world, ncclsim_t **out);
/* After every context on it is destroyed. NULL is fine. */
void ncclsim_destroy(ncclsim_t *s);
/* Point cfg (from wrk_coll_config_defaults, rank and world filled in) at s. */
void ncclsim_config(ncclsim_t *s, wrk_coll_config_t *cfg);
/* The reduce-scatters world rank `rank` has started and not yet waited (no test of their
 * request has seen them done): in flight, as far as that rank knows. */
uint32_t ncclsim_open_scatters(ncclsim_t *s, uint32_t rank);
/* 1 when the fake declared a deadlock. */
int ncclsim_deadlocked(ncclsim_t *s);

#endif
