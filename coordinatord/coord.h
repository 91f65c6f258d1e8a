/* The coordinator daemon's state: one struct made in main and passed down to every
 * module. All fields are touched only from the loop thread.
 *
 * Lifecycle: coord_init (open and reload the store) -> coord_start (listen, timers)
 * -> uv_run -> coord_stop (close handles; uv_run then returns) -> coord_fini. */
#ifndef COORD_COORD_H
#define COORD_COORD_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/auth.h"
#include "common/config.h"
#include "fairshare.h"
#include "job.h"
#include "kv.h"
#include "http.h"
#include "node.h"
#include "series.h"
#include "server.h"
#include "store.h"
#include "users.h"

typedef struct coord_cfg {
    char listen[CH_OPT_STRLEN];     /* "HOST:PORT"; port 0: ephemeral */
    char ctl_socket[CH_OPT_STRLEN]; /* "" disables */
    char state_dir[CH_OPT_STRLEN];
    char key[CH_OPT_STRLEN];
    char metrics[CH_OPT_STRLEN]; /* "" disables */
    char ctl_group[CH_OPT_STRLEN];
    char log_level[CH_OPT_STRLEN];
    long heartbeat_ms, dead_after_ms, grace_ms;
    long forget_dead_after_ms;       /* 0: never */
    char run_as_user[CH_OPT_STRLEN]; /* root's jobs run as this user */
    char admin_group[CH_OPT_STRLEN]; /* may act on every job */
    int allow_root_jobs;
    long keep_ended_jobs; /* ended jobs kept in memory; 0: COORD_JOBS_KEEP_ENDED */
    int launch_tokens;    /* rank reports must present their launch token (launch.h) */
    /* fairshare.h: per-user (and per-group) limits, 0: none; the usage half-life */
    long max_queued_jobs, group_max_queued_jobs, max_running_ranks, max_submits_per_minute;
    long fairshare_halflife_s;
} coord_cfg_t;

struct coord {
    uv_loop_t *loop;
    coord_cfg_t cfg;
    ch_key_t key;
    ch_key_t launch_key; /* launch.h: mints the launch tokens */
    int have_ctl_gid;
    gid_t ctl_gid;
    uid_t uid; /* the daemon's own uid, allowed on the control socket */

    coord_store_t *store;
    coord_kv_t *kv;
    coord_nodes_t nodes;
    coord_jobs_t jobs;
    coord_server_t srv;
    coord_http_t http;         /* cfg.metrics: /metrics and the status page */
    coord_series_set_t series; /* the status page's per-job series (series.h) */
    coord_users_t users;
    coord_share_t share;     /* fairshare.h: per-user usage and submission counts */
    struct coord_logs *logs; /* log reads relayed to workers (logs.h); made on first use */

    uv_timer_t cron, kv_timer, watchdog;
    uv_timer_t live_timer; /* the next moment a node can pass dead-after (node.c) */
    uv_prepare_t before_sleep;
    int handles_open; /* timers and prepare initialised */
    int changed;      /* run the scheduler before the next poll */
    int stopping;
    uint64_t stamp; /* increasing counter for de-duplicating walks */
    /* Monotonic ms when the loop last went to poll: every heartbeat that arrived before
     * then has been read. Liveness counts silence up to here, not up to now, so a loop
     * that stalled does not declare dead the nodes whose heartbeats wait unread. */
    uint64_t polled_ms;
    /* Workers' messages read in this loop turn (server.c's on_msg): a turn that read only
     * a few naps before it polls again, so that the next poll reads many (coord.c); none
     * before nap_after_ms (monotonic), which a connection or a control message pushes on,
     * so that a question and its handshake wait for no nap. */
    uint32_t turn_msgs;
    uint64_t nap_after_ms;
    uint64_t rate_ms, rate_msgs, msgs_per_s; /* the workers' messages a second (coord.c) */
    /* The clocks as the first message read after the last poll found them (coord_turn_ms);
     * 0: not read yet in this turn. */
    uint64_t turn_ms, turn_wall_ms;

    uint64_t heartbeats_total, recoveries_total;
    uint64_t restarts_by_cause[COORD_CAUSE_NCAUSES];
    double recover_s_last; /* the last restart: failure -> first completed step */
    char status[128];      /* last STATUS= sent to systemd */
    uint64_t status_ms;    /* when it was last worked out (at most once a second) */
};

/* Open the store under cfg->state_dir and reload nodes and jobs. key is copied. */
int coord_init(coord_t *c, uv_loop_t *loop, const coord_cfg_t *cfg, const ch_key_t *key);
/* Listen (TCP, control socket, metrics), start timers, write <state-dir>/coordinatord.addr. */
int coord_start(coord_t *c);
/* Close every handle; the loop ends once their close callbacks ran. Idempotent. */
void coord_stop(coord_t *c);
/* Free everything (after the loop ended). */
void coord_fini(coord_t *c);

/* Something changed: run the scheduler before the loop sleeps again. */
void coord_changed(coord_t *c);
/* A control client or a new connection is being served: the loop polls without napping
 * for a while (coord.c's coalescing of workers' messages). */
void coord_no_nap(coord_t *c);
/* Monotonic (ch_now_ms) and wall (ch_wall_ms) ms for what the messages of this loop turn
 * did: read once after the poll (two clock reads a message were 3% of the steady state),
 * so they lag by the turn's work, a millisecond or two (a burst: its length). */
uint64_t coord_turn_ms(coord_t *c);
uint64_t coord_turn_wall_ms(coord_t *c);
/* Re-arm the rendezvous timeout timer after a KvGet. */
void coord_kv_rearm(coord_t *c);
/* Run coord_node_check again at due_ms (monotonic), when the node heard longest ago can
 * have passed dead-after: a silent node is declared dead then, not at the cron's next
 * tick (up to 250 ms later). */
void coord_live_rearm(coord_t *c, uint64_t due_ms);
/* Log-and-store helper for events ("state alive->dead"); job/node may be NULL. */
void coord_event(coord_t *c, const char *job, uint64_t gen, int64_t rank, const char *node,
                 const char *what);

#endif
