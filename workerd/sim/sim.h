/* Simulated nodes (DESIGN §13): N workerd nodes in one process on one libuv loop, for
 * measuring the coordinator at a scale that cannot run here for real.
 *
 * Each node has its own authenticated link to coordinatord (conn.h, role "worker"), its
 * own name, rack and slots, and speaks workerd's protocol: Register (listing the ranks
 * it still runs), heartbeats at the interval RegisterAck gives, rank events, rendezvous.
 * Its ranks do no arithmetic but behave like real ones towards the coordinator:
 *
 *   StartRanks -> RANK_STARTED; KvSet "ucx/<rank>" (a worker address of ADDR_BYTES) and
 *   KvGet of the peers a 3-D layout's first collectives need (the next rank of its TP
 *   ring, of its DP ring, and the next pipeline stage), each parked at the coordinator
 *   until its owner has set it; then one RANK_PROGRESS per step every step_ms,
 *   RANK_CHECKPOINT every checkpoint.every steps, RANK_DONE and RANK_EXITED(0) after the
 *   job's last step. KillRanks ends ranks as a SIGKILL would (RANK_EXITED, signal 9).
 *
 * Failures are injected by name: hang (no more heartbeats or rank events, the link stays
 * open: a hung machine), crash (the link closes and never comes back: a dead machine),
 * disconnect (the link closes; the node reconnects after a backoff and re-registers with
 * its ranks, as workerd does), exit_rank (a rank exits with a code), revive (a hung or
 * crashed node comes back as a freshly booted one, with no ranks). */
#ifndef WRK_SIM_H
#define WRK_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/auth.h"

typedef struct wrk_sim wrk_sim_t;

typedef struct wrk_sim_cfg {
    char host[256];
    int port;
    const ch_key_t *key; /* borrowed; outlives the sim */
    uint32_t nodes, slots;
    uint32_t racks;       /* nodes are split into this many racks, in name order */
    char prefix[32];      /* node names are <prefix>-<index, 5 digits> */
    uint32_t step_ms;     /* simulated step time */
    uint32_t connect_ms;  /* spread the first connects over this long (0: all at once) */
    uint32_t progress_ms; /* per-node progress as workerd's progress-ms; 0: per rank, at once */
    uint32_t progress_detail_every; /* workerd's progress-detail-every */
} wrk_sim_cfg_t;

/* What the nodes see, summed over all of them (ranks: of every job they run). */
typedef struct wrk_sim_stats {
    uint32_t nodes, registered;
    uint32_t ranks;              /* rank entries alive (started, not exited) */
    uint32_t rdzv_done;          /* of those, past rendezvous (every KvGet answered) */
    uint32_t done;               /* ranks that finished their last step */
    uint64_t min_step, max_step; /* over alive ranks past rendezvous; 0 when none */
    uint64_t events_sent, kv_errors, start_msgs, kill_msgs;
    uint64_t heartbeats_sent; /* Heartbeats (a tick with nothing else sent in its interval) */
} wrk_sim_stats_t;

int wrk_sim_create(uv_loop_t *loop, const wrk_sim_cfg_t *cfg, wrk_sim_t **out);
/* Connect every node (spread over cfg.connect_ms). */
int wrk_sim_start(wrk_sim_t *s);
/* Close every link and timer; the loop ends once their callbacks ran. */
void wrk_sim_stop(wrk_sim_t *s);
void wrk_sim_destroy(wrk_sim_t *s);
void wrk_sim_stats(const wrk_sim_t *s, wrk_sim_stats_t *out);

/* Failure injection; CH_E_NOTFOUND when no node (or rank) has that name (number). */
/* *last_hb_ms: when the node sent its last message, each a heartbeat (monotonic, CLOCK_MONOTONIC ms
 * as ch_now_ms; 0: none yet), from which its silence counts. */
int wrk_sim_hang(wrk_sim_t *s, const char *node, uint64_t *last_hb_ms);
int wrk_sim_crash(wrk_sim_t *s, const char *node);
int wrk_sim_disconnect(wrk_sim_t *s, const char *node);
int wrk_sim_revive(wrk_sim_t *s, const char *node);
/* The rank of job (any generation it runs) exits with code. */
int wrk_sim_exit_rank(wrk_sim_t *s, const char *job, uint32_t rank, int code);
/* Name of node i ("" past the end). */
const char *wrk_sim_node_name(const wrk_sim_t *s, uint32_t i);
/* The node running rank of job, or NULL. */
const char *wrk_sim_rank_node(const wrk_sim_t *s, const char *job, uint32_t rank);

#endif
