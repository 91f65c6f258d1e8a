/* Same-host shared memory for the UCX backend's collectives (coll_ucx.c only).
 *
 * A group whose members all run on one host gets one shared segment: member 0 creates it
 * (a memfd), the others map it through /proc/<pid>/fd/<fd>, so nothing is left behind in
 * /dev/shm when a rank dies. Collectives then move data through the segment instead of
 * through UCX messages: each member copies into the segment only the parts others reduce,
 * reduces its own part straight from its private buffer and the peers' copies, and copies
 * the others' results out. Per byte that is one read and one write of main memory more or
 * less, against two copies through UCX's shared-memory transport.
 *
 * Theory of operation
 * - An operation is cut into steps; step t moves one piece (piece_bytes at most) of every
 *   member's block. The segment holds SLOTS slots per member, step t uses slot t % SLOTS,
 *   so up to SLOTS steps are in flight and copying, reducing and waiting overlap.
 * - Each member publishes three step counters in its own cache line: posted (its pieces of
 *   step t are in its slot), reduced (its result piece of step t is in its slot), done (it
 *   has read everything of step t). A member reuses slot t % SLOTS only when every member is
 *   done with step t - SLOTS. Counters only grow (release stores, acquire loads).
 * - Steps are numbered per group across operations (every member starts the group's
 *   collectives in the same order, so the numbering agrees); an operation runs only when
 *   the one before it in the group has finished.
 * - Nothing here blocks or knows about failures: advance does what the counters allow and
 *   says whether it moved. The caller's wait loop, liveness checks and timeouts (coll.c,
 *   coll_ucx.c) cover a peer that never comes.
 * - Registered memory. Buffers from wrk_coll_mem_alloc are memfds of their own (the
 *   registry, wrk_shm_reg_t). When every member's buffers of a large allreduce,
 *   reduce_scatter or allgather are registered, nothing is staged: each member maps the
 *   others' buffers (cached per allocation) and reduces its block straight out of their
 *   send buffers into every member's receive buffer. Whether to do that is decided per
 *   operation from descriptors every member announces in its control lines, so all members
 *   decide alike; a final counter tells each member that the others are done with its
 *   buffers.
 * - Fixed reduction order: element i of the result is ((x_0 + x_1) + x_2) + ... over the
 *   members in group order, computed by the member that owns the block, so every member
 *   gets the same bits in every run. */
#ifndef WRK_COLL_SHM_H
#define WRK_COLL_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/coll/coll_impl.h"

#define WRK_SHM_MAX_MEMBERS 16
#define WRK_SHM_REF_MAX     64 /* "/proc/<pid>/fd/<fd>" */

typedef struct wrk_shm wrk_shm_t;
typedef struct wrk_shm_reg wrk_shm_reg_t;

/* One collective's progress through the segment. Plain data, embedded in the caller's
 * operation; filled by wrk_shm_op_init. */
typedef struct wrk_shm_op {
    wrk_coll_args_t a;
    uint32_t n, me;
    size_t esz, piece;        /* element size; piece in elements */
    size_t blk;               /* block length in elements (allreduce: per member) */
    uint64_t ticket;          /* the operation's place in the group's order */
    uint64_t base, end;       /* steps [base, end) of the group's numbering */
    uint64_t post, red, gath; /* next step to post, reduce, gather */
    uint64_t announce;        /* > 0: the group's announcement number of this operation */
    int phase;                /* see wrk_shm_op_advance */
    const char *peer_send[WRK_SHM_MAX_MEMBERS]; /* zero-copy: every member's buffers, mapped */
    char *peer_recv[WRK_SHM_MAX_MEMBERS];
} wrk_shm_op_t;

/* The registry of one context's registered memory. Allocations are page-granular memfds;
 * freeing one another member still maps keeps its pages until that member unmaps it. */
int wrk_shm_reg_create(wrk_shm_reg_t **out);
void wrk_shm_reg_destroy(wrk_shm_reg_t *r); /* frees what is still allocated */
/* -ERANGE for sizes below the zero-copy threshold (the caller uses plain memory). */
int wrk_shm_mem_alloc(wrk_shm_reg_t *r, size_t bytes, void **out);
/* 0, or -ENOENT when p did not come from wrk_shm_mem_alloc. */
int wrk_shm_mem_free(wrk_shm_reg_t *r, void *p);

/* Member 0: create the segment of a group of n members (2..WRK_SHM_MAX_MEMBERS) and write
 * the reference the others attach with into ref (WRK_SHM_REF_MAX bytes). Caller owns *out. */
int wrk_shm_create(uint32_t n, wrk_shm_reg_t *reg, wrk_shm_t **out, char *ref);
/* Member me > 0: map the segment ref names; checks that it was made for n members. reg is
 * borrowed (both): the caller's registry, which must outlive the segment. */
int wrk_shm_attach(const char *ref, uint32_t n, uint32_t me, wrk_shm_reg_t *reg, wrk_shm_t **out);
/* Member 0, once every member has attached: drop the descriptor the others opened. */
void wrk_shm_seal(wrk_shm_t *s);
void wrk_shm_destroy(wrk_shm_t *s);

/* 1 when the segment can run this operation (allreduce, reduce_scatter, allgather,
 * broadcast with count > 0). */
int wrk_shm_supports(const wrk_coll_args_t *a);
/* Number the operation's steps. Must be called in the group's start order, on every
 * member; sendbuf/recvbuf are borrowed until it is done. */
void wrk_shm_op_init(wrk_shm_t *s, wrk_shm_op_t *op, const wrk_coll_args_t *a);
/* Do what the counters allow: 0 done, 1 pending, < 0 failed (a peer's registered buffer
 * could not be mapped). *moved = 1 when something was done. */
int wrk_shm_op_advance(wrk_shm_t *s, wrk_shm_op_t *op, int *moved);

#endif
