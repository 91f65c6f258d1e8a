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
    /* Called after each RegisterAck; first is 1 the first time. May be NULL. */
    void (*registered_cb)(void *ud, int first);
    void *ud;
} wrk_agent_cfg_t;

/* cfg is copied. */
int wrk_agent_create(uv_loop_t *loop, const wrk_agent_cfg_t *cfg, wrk_agent_t **out);
/* Connect (and keep reconnecting) to the coordinator. */
int wrk_agent_start(wrk_agent_t *a);
/* Shut down: SIGKILL every rank, close every link, stop every timer. The loop then
 * runs out once the ranks are reaped; call wrk_agent_destroy after uv_run returns. */
void wrk_agent_stop(wrk_agent_t *a);
/* Free (after wrk_agent_stop and the loop has drained). */
void wrk_agent_destroy(wrk_agent_t *a);

/* Handle one message from the coordinator (env borrowed for the call): what the
 * coordinator link's message callback does, exposed for tests/fuzz/fuzz_agent.c. */
void wrk_agent_coord_msg(wrk_agent_t *a, Chorus__Envelope *env);

/* Rank processes alive now. */
uint32_t wrk_agent_ranks_alive(const wrk_agent_t *a);
/* 1 while registered with the coordinator. */
int wrk_agent_registered(const wrk_agent_t *a);

#endif
