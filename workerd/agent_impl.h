/* The node agent's state, shared by its files (agent.c; agent_kv.c, the rendezvous relay);
 * nothing outside workerd/agent*.c includes this. */
#ifndef WRK_AGENT_IMPL_H
#define WRK_AGENT_IMPL_H

#include <stdint.h>
#include <uv.h>

#include "common/conn.h"
#include "workerd/adopt.h"
#include "workerd/agent.h"
#include "workerd/evqueue.h"
#include "workerd/proc.h"
#include "workerd/progress.h"

#define BACKOFF_MIN_MS       100
#define BACKOFF_MAX_MS       1000
#define CRON_MS              100
#define LINK_GRACE_MS        500 /* between a rank's exit and its link's EOF, either way round */
#define KV_EXPIRE_MARGIN_MS  10000
#define HEARTBEAT_DEFAULT_MS 1000
#define FINISHED_MAX         4096         /* final reports awaiting acknowledgement */
#define RELINK_GRACE_MS      60000        /* CHORUS_RELINK_GRACE_MS unset: the ranks' default */
#define AGENT_SOCK           "agent.sock" /* in the run dir: ranks redial it (proc.h) */

typedef struct rank_ent {
    struct rank_ent *next;
    wrk_agent_t *a;
    char job_id[64];
    uint64_t gen;
    uint64_t token; /* StartRanks.launch_token: every report about the rank presents it */
    uint32_t rank;
    wrk_proc_t *proc; /* NULL once reaped */
    ch_conn_t *link;  /* NULL once closed */
    int pid;
    uint64_t start_ticks; /* /proc/PID/stat's start time: the rank in WRK_ADOPT_FILE */
    int exited, exit_code, signal;
    int done;                /* it reported RANK_DONE */
    uint64_t exited_ms;      /* when the process was reaped */
    uint64_t link_closed_ms; /* when its link closed */
    int orphan_killed;       /* killed for having lost its link */
    int adopted;             /* left by the previous workerd: not our child (no proc) */
    int keep;                /* outlives workerd and redials (proc.h agent_sock) */
} rank_ent_t;

/* A finished rank's final report, kept until the coordinator acknowledges it. */
typedef struct fin_ent {
    struct fin_ent *next;
    char job_id[64];
    uint64_t gen, token;
    uint32_t rank;
    int done, exit_code, signal;
} fin_ent_t;

typedef struct kv_relay {
    struct kv_relay *next;
    uint64_t id;      /* request id toward the coordinator */
    uint64_t rank_id; /* the rank's own request id */
    rank_ent_t *ent;
    uint64_t expire_ms;
} kv_relay_t;

struct wrk_agent {
    uv_loop_t *loop;
    wrk_agent_cfg_t cfg;
    char rank_exe[CH_PATH_LEN]; /* cfg.rank_exe, or the chorus-rank next to workerd */
    ch_conn_t *coord;
    int registered, ever_registered, stopping;
    uint32_t heartbeat_ms, dead_after_ms; /* RegisterAck */
    int coord_checkpoints; /* RegisterAck.node_checkpoints: held in progress (progress.h) */
    uint64_t last_sent_ms; /* monotonic: the last message to the coordinator */
    uint32_t backoff_ms;
    uv_timer_t reconnect, heartbeat, cron;
    /* What a loop turn sends the coordinator goes in one write (several ranks' requests
     * read in one turn): the link is corked at the turn's first send and uncorked before
     * the loop sleeps. */
    uv_prepare_t flush;
    ch_conn_t *corked; /* the coordinator link, while corked */
    rank_ent_t *ranks;
    fin_ent_t *finished; /* newest first */
    size_t n_finished;
    kv_relay_t *relays;
    uint64_t next_request_id;
    wrk_evq_t queue; /* events while the coordinator link is down */
    /* the ranks' progress held for one NodeProgress (NULL: progress-ms 0) */
    wrk_progress_t *progress;
    uint64_t rng;
    wrk_agent_stats_t stats; /* the counters; the gauges are filled in by wrk_agent_stats */
    int record_fd;           /* holds the run dir's rank record (wrk_adopt_lock); -1: none */
    uv_pipe_t listener;      /* AGENT_SOCK, where ranks (re)dial: while listening */
    int listening;
    int detached; /* wrk_agent_detach: the ranks are the next workerd's */
    /* CHORUS_RELINK_GRACE_MS, which the ranks inherit: an adopted rank that has not
     * redialled by then never will (it gives up after as long), so it is killed */
    uint64_t relink_grace_ms;
    char agent_sock[CH_PATH_LEN]; /* its path; "": ranks die with workerd */
};

/* To the coordinator when the link is up; -ENOTCONN otherwise. */
int wrk_agent_coord_send(wrk_agent_t *a, Chorus__Envelope *env);

// rendezvous relay (agent_kv.c)

void wrk_agent_relay_remove(wrk_agent_t *a, kv_relay_t **pp);
/* A KvReply of code to the rank's request rank_id (nothing when its link is gone). */
void wrk_agent_reply_rank_code(rank_ent_t *ent, uint64_t rank_id, int code);
/* Answer every relay (of one rank, or all when ent is NULL) with code and forget it. */
void wrk_agent_relays_fail(wrk_agent_t *a, rank_ent_t *ent, int code);
/* Relay a rank's KvSet or KvGet (env, borrowed) to the coordinator as its own job's. */
void wrk_agent_relay_kv(wrk_agent_t *a, rank_ent_t *ent, Chorus__Envelope *env);
/* A coordinator reply: route it to the rank that asked. 1 if it was a relay's reply. */
int wrk_agent_route_reply(wrk_agent_t *a, Chorus__Envelope *env);

// rank entries and links (agent.c), shared with re-adoption

/* Rewrite WRK_ADOPT_FILE with the ranks whose process runs (a failure is only logged). */
void wrk_agent_ranks_record(wrk_agent_t *a);
/* Both the process and its link are gone: report the exit and forget (free) the rank. */
void wrk_agent_ent_finish(rank_ent_t *ent);
/* A rank link's message and close callbacks (ud: the rank_ent_t, NULL while unmatched). */
void wrk_agent_rank_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud);
void wrk_agent_rank_close(ch_conn_t *c, int reason, void *ud);

// re-adoption (agent_adopt.c)

/* 1 while ent's process runs: our child not yet reaped, or an adopted rank still alive. */
int wrk_agent_ent_running(const rank_ent_t *e);
/* An adopted rank is still the process recorded (adopt.h). */
int wrk_agent_adopted_alive(const rank_ent_t *e);
/* sig to ent's process group (an adopted rank's only while it is still the one recorded). */
void wrk_agent_ent_kill(rank_ent_t *e, int sig);
/* The cron's look at an adopted rank: exited, or never redialled. 1 when e was freed. */
int wrk_agent_adopted_check(wrk_agent_t *a, rank_ent_t *e, uint64_t now);
/* Listen on AGENT_SOCK in the run dir. 0 or a negative code (then nothing listens). */
int wrk_agent_listen_ranks(wrk_agent_t *a);
/* The ranks' redial grace: CHORUS_RELINK_GRACE_MS from the environment, else
 * RELINK_GRACE_MS. */
uint64_t wrk_agent_relink_grace_ms(void);
/* Watch a rank the previous workerd left (killed when nothing listens). */
void wrk_agent_adopt_one(wrk_agent_t *a, const wrk_adopt_rank_t *r);

#endif
