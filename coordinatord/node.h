/* Node registry (DESIGN §4): one entry per workerd, by name.
 *
 *   Register -> alive (a reconnect under the same name replaces the old link)
 *   link closed -> suspect at once;  no heartbeat for dead_after_ms -> dead
 *   heartbeat on a suspect node -> alive.
 * Any message of a registered node's link counts as its heartbeat (NodeProgress, RankEvent,
 * KV): a node that reports every interval need not also heartbeat.
 * Drained (`chorusctl drain`) is a mark beside the state, kept across link loss until
 * `chorusctl resume`: the node takes no new ranks and keeps those it runs. It is shown as
 * the state "draining" while the node is alive; not stored (a coordinator restart forgets
 * it).
 * Every change is logged ("node=n1 state alive->dead (no heartbeat for 5012 ms)") and
 * stored. Nodes are never freed before coord_nodes_fini, so jobs keep pointers to them. */
#ifndef COORD_NODE_H
#define COORD_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.pb-c.h"
#include "common/device.h"

typedef struct coord coord_t;
typedef struct coord_link coord_link_t;

typedef enum {
    COORD_NODE_ALIVE = 0,
    COORD_NODE_SUSPECT,
    COORD_NODE_DEAD,
    COORD_NODE_DRAINING,
    COORD_NODE_NSTATES,
} coord_node_state_t;

/* Register's bounds: slots per node, and running ranks it may report (a generation being
 * killed may overlap the next one, never more); the same for finished ranks whose final
 * report awaits its acknowledgement. */
#define COORD_NODE_SLOTS_MAX          65536u
#define COORD_NODE_RUNNING_MAX(slots) ((slots)*2u < 4096u ? (slots)*2u : 4096u)

typedef struct coord_node {
    char name[64], rack[64];
    ch_device_t device;
    uint32_t slots;
    uint64_t memory_bytes; /* as registered; 0: unknown (not checked at admission) */
    uint32_t progress_ms;  /* its ranks' progress is held up to this long (NodeProgress) */
    uint32_t used;         /* slots held by placed ranks that have not exited */
    coord_node_state_t state;
    uint64_t last_hb_ms;    /* monotonic */
    uint64_t last_hb_wall;  /* wall clock, for display */
    coord_link_t *link;     /* NULL while disconnected; owned by the server */
    uint64_t mark;          /* scratch for de-duplicating walks (job.c, node.c) */
    uint64_t dead_since_ms; /* monotonic; while dead */
    int drained;            /* chorusctl drain: no new ranks */
    char drain_reason[128];
    /* The last launch token found right for this node (launch.c): its every message carries
     * one, and recomputing the HMAC for each cost the coordinator more than applying it. */
    char tok_job[32];
    uint64_t tok_gen, tok;
} coord_node_t;

typedef struct coord_nodes {
    coord_node_t **v;
    size_t n, cap;
    /* Forgotten nodes that finished jobs' placements still point at: off the list and
     * the store, freed with the registry. */
    coord_node_t **gone;
    size_t n_gone, cap_gone;
    uint64_t next_expiry_ms; /* the expiry walk runs at most once a second */
    /* No node's silence can pass dead-after before this (coord_node_check) */
    uint64_t next_check_ms;
    /* v's nodes by name: open addressing, linear probing, a power of two at most half
     * full; rebuilt when a node leaves v (rare: forget, expiry). */
    coord_node_t **ix;
    size_t ix_cap;
} coord_nodes_t;

const char *coord_node_state_name(coord_node_state_t s);
/* The state chorusctl nodes shows: "draining" for a drained alive node, else the state. */
const char *coord_node_shown_state(const coord_node_t *n);
/* Drain node name (on = 1: no new ranks, reason shown beside it) or resume it (on = 0).
 * 0, or -ENOENT with the reason in err. */
int coord_node_drain(coord_t *c, const char *name, int on, const char *reason, char *err,
                     size_t errlen);
/* By name, O(1) (a hash of the registered names). */
coord_node_t *coord_node_find(coord_t *c, const char *name);
/* Find or add (as dead, with no slots) a node known only by name, e.g. from a stored
 * placement. NULL when out of memory. */
coord_node_t *coord_node_get(coord_t *c, const char *name);
/* Slots free for scheduling (0 unless alive and not drained). */
uint32_t coord_node_free(const coord_node_t *n);

/* A Register arrived on link: validate, bind the node to the link, mark it alive.
 * CH_E_CONFIG with err set for a bad message (name or rack not printable, bounds);
 * CH_E_STATE when the link is already another node; -EADDRINUSE when the name belongs
 * to a node whose link is still open (the caller closes the new link: workerd retries). */
int coord_node_register(coord_t *c, coord_link_t *link, const Chorus__Register *reg,
                        coord_node_t **out, char *err, size_t errlen);
/* The node was heard from (any message of its registered link): last_hb and suspect ->
 * alive, as a Heartbeat. coord_node_heartbeat also counts heartbeats_total. */
void coord_node_heard(coord_t *c, coord_node_t *n);
void coord_node_heartbeat(coord_t *c, coord_node_t *n, const Chorus__Heartbeat *hb);
/* The node's link closed (not a replacement): suspect at once. */
void coord_node_link_closed(coord_t *c, coord_node_t *n);
/* Declare n dead now (its ranks are lost, its jobs fail over) and cut its link, which a
 * live workerd answers by registering again. */
void coord_node_declare_dead(coord_t *c, coord_node_t *n, const char *why);
/* Periodic liveness check: dead after dead_after_ms without a heartbeat; forgotten after
 * forget_dead_after_ms dead (when no active job has ranks on it). */
void coord_node_check(coord_t *c, uint64_t now_ms);
/* `chorusctl node forget NAME`: drop a node that has no link and no ranks of an active
 * job from the registry and the store. CH_E_NOTFOUND or CH_E_STATE with err set. */
int coord_node_forget(coord_t *c, const char *name, char *err, size_t errlen);
/* Send to the node's link; -EPIPE when it has none. */
int coord_node_send(coord_node_t *n, Chorus__Envelope *env);

/* Reload the stored nodes, all as dead until they register again. */
int coord_nodes_load(coord_t *c);
void coord_nodes_fini(coord_t *c);
/* Count nodes per state (counts has COORD_NODE_NSTATES entries). */
void coord_nodes_count(const coord_t *c, size_t *counts);

#endif
