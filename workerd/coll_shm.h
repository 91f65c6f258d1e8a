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
 * - Fixed reduction order: element i of the result is ((x_0 + x_1) + x_2) + ... over the
 *   members in group order, computed by the member that owns the block, so every member
 *   gets the same bits in every run. */
#ifndef WRK_COLL_SHM_H
#define WRK_COLL_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

#define WRK_SHM_MAX_MEMBERS 16
#define WRK_SHM_REF_MAX     64 /* "/proc/<pid>/fd/<fd>" */

typedef struct wrk_shm wrk_shm_t;

/* One collective's progress through the segment. Plain data, embedded in the caller's
 * operation; filled by wrk_shm_op_init. */
typedef struct wrk_shm_op {
    wrk_coll_args_t a;
    uint32_t n, me;
    size_t esz, piece;        /* element size; piece in elements */
    size_t blk;               /* block length in elements (allreduce: per member) */
    uint64_t base, end;       /* steps [base, end) of the group's numbering */
    uint64_t post, red, gath; /* next step to post, reduce, gather */
} wrk_shm_op_t;

/* Member 0: create the segment of a group of n members (2..WRK_SHM_MAX_MEMBERS) and write
 * the reference the others attach with into ref (WRK_SHM_REF_MAX bytes). Caller owns *out. */
int wrk_shm_create(uint32_t n, wrk_shm_t **out, char *ref);
/* Member me > 0: map the segment ref names; checks that it was made for n members. */
int wrk_shm_attach(const char *ref, uint32_t n, uint32_t me, wrk_shm_t **out);
/* Member 0, once every member has attached: drop the descriptor the others opened. */
void wrk_shm_seal(wrk_shm_t *s);
void wrk_shm_destroy(wrk_shm_t *s);

/* 1 when the segment can run this operation (allreduce, reduce_scatter, allgather,
 * broadcast with count > 0). */
int wrk_shm_supports(const wrk_coll_args_t *a);
/* Number the operation's steps. Must be called in the group's start order, on every
 * member; sendbuf/recvbuf are borrowed until it is done. */
void wrk_shm_op_init(wrk_shm_t *s, wrk_shm_op_t *op, const wrk_coll_args_t *a);
/* Do what the counters allow: 0 done, 1 pending. *moved = 1 when something was done. */
int wrk_shm_op_advance(wrk_shm_t *s, wrk_shm_op_t *op, int *moved);

#endif
