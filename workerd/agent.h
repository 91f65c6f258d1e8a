/* The node agent: workerd's side of the control plane. Registers the node with
 * coordinatord, heartbeats, spawns and supervises rank processes (proc.h), relays
 * their events and rendezvous calls, and reconnects when the coordinator goes away.
 * Everything runs on one libuv loop. */
#ifndef WRK_AGENT_H
#define WRK_AGENT_H

#include <stdint.h>
#include <uv.h>

#include "chorus.pb-c.h"
#include "common/auth.h"
#include "common/jobspec.h"

typedef struct wrk_agent wrk_agent_t;

typedef struct wrk_agent_cfg {
    char host[256]; /* coordinator */
    int port;
    char name[256];            /* node name */
    uint32_t slots;            /* rank processes this node runs at once */
    uint64_t memory_bytes;     /* reported for admission; 0: MemTotal of /proc/meminfo */
    uint32_t threads;          /* compute threads per rank (CHORUS_THREADS); 0: the rank's
                                * share of the node's cores */
    char rack[256];            /* placement label */
    ch_device_t device;        /* workerd --device, resolved */
    const ch_key_t *key;       /* cluster key; borrowed for the agent's life */
    char run_dir[CH_PATH_LEN]; /* job files, rank dirs and rank logs live under here */
    const char *rank_exe;      /* NULL: chorus-rank next to workerd (wrk_proc_rank_exe) */
    /* Ranks' progress goes per node this often (progress.h; 0: each report at once), and
     * every rank's full report every progress_detail_every intervals (0: when asked). */
    uint32_t progress_ms;
    uint32_t progress_detail_every;
    /* Called after each RegisterAck; first is 1 the first time. May be NULL. */
    void (*registered_cb)(void *ud, int first);
    void *ud;
    /* in-memory checkpoints (a tmpfs), per job under here; "": none */
    char memory_dir[CH_PATH_LEN];
    /* Ranks outlive this workerd and redial the run dir's agent.sock (proc.h); 0: they die
     * with it. Ranks a previous workerd left running are re-adopted either way. */
    int keep_ranks;
} wrk_agent_cfg_t;

/* cfg is copied. */
int wrk_agent_create(uv_loop_t *loop, const wrk_agent_cfg_t *cfg, wrk_agent_t **out);
/* Connect (and keep reconnecting) to the coordinator. */
int wrk_agent_start(wrk_agent_t *a);
/* Shut down: SIGKILL every rank, close every link, stop every timer. The loop then
 * runs out once the ranks are reaped; call wrk_agent_destroy after uv_run returns. */
void wrk_agent_stop(wrk_agent_t *a);
/* Shut down leaving the ranks running (a restart): close every link and timer, SIGKILL
 * nobody; the record (adopt.h) keeps them for the next workerd. */
void wrk_agent_detach(wrk_agent_t *a);
/* Free (after wrk_agent_stop and the loop has drained). */
void wrk_agent_destroy(wrk_agent_t *a);

/* Handle one message from the coordinator (env borrowed for the call): what the
 * coordinator link's message callback does, exposed for tests/fuzz/fuzz_agent.c. */
void wrk_agent_coord_msg(wrk_agent_t *a, Chorus__Envelope *env);

/* Rank processes alive now. */
uint32_t wrk_agent_ranks_alive(const wrk_agent_t *a);
/* 1 while registered with the coordinator. */
int wrk_agent_registered(const wrk_agent_t *a);

/* Counters since this workerd started, for its /metrics (workerd/metrics.h). */
typedef struct wrk_agent_stats {
    uint32_t ranks_alive, slots;
    int registered;
    uint64_t registrations;       /* RegisterAcks: 1 + the coordinator links re-made */
    uint64_t rank_starts;         /* rank processes spawned */
    uint64_t rank_spawn_fails;    /* StartRanks entries that could not be spawned */
    uint64_t rank_exits_done;     /* ranks reaped after reporting RANK_DONE */
    uint64_t rank_exits_other;    /* ranks reaped without it: failed, killed, restarted */
    uint32_t events_queued;       /* events held while the coordinator is away */
    uint32_t ranks_left_at_start; /* of a previous workerd, alive at start: re-adopted */
} wrk_agent_stats_t;
void wrk_agent_stats(const wrk_agent_t *a, wrk_agent_stats_t *out);

#endif
