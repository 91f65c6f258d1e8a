/* Re-adoption (adopt.h): ranks a previous workerd left running are watched by pid, listed
 * in Register and take their redial on the run dir's AGENT_SOCK; see agent_impl.h. */
#include "workerd/agent_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/conn.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "workerd/adopt.h"

/* 1 while ent's process runs: our child not yet reaped, or an adopted rank still alive. */
int wrk_agent_ent_running(const rank_ent_t *e)
{
    return e->proc != NULL || (e->adopted && !e->exited);
}

/* An adopted rank is still the process recorded (adopt.h). */
int wrk_agent_adopted_alive(const rank_ent_t *e)
{
    wrk_adopt_rank_t r = {.pid = e->pid, .start_ticks = e->start_ticks};
    return wrk_adopt_alive(&r);
}

/* sig to ent's process group: through libuv for a child, by pid for an adopted rank
 * (checked first, so a pid the kernel gave to someone else is never signalled). */
void wrk_agent_ent_kill(rank_ent_t *e, int sig)
{
    if (e->proc) {
        wrk_proc_kill(e->proc, sig);
        return;
    }
    if (e->adopted && !e->exited && wrk_agent_adopted_alive(e) && kill(-e->pid, sig) < 0)
        kill(e->pid, sig);
}

/* An adopted rank is not our child: no SIGCHLD, and its exit code was the previous
 * workerd's (or init's) to reap. So the cron looks at it: gone means exited, with
 * success only if it reported RANK_DONE; one that never redials is killed. 1 when ent was
 * finished (freed). */
int wrk_agent_adopted_check(wrk_agent_t *a, rank_ent_t *e, uint64_t now)
{
    if (e->exited)
        return 0;
    if (wrk_agent_adopted_alive(e)) {
        if (!e->link && !e->orphan_killed && now - e->link_closed_ms >= a->relink_grace_ms) {
            CH_LOGW("adopt",
                    "job=%s gen=%" PRIu64 " rank=%u pid=%d: did not redial in %" PRIu64 " ms; "
                    "killing it",
                    e->job_id, e->gen, e->rank, e->pid, a->relink_grace_ms);
            e->orphan_killed = 1;
            wrk_agent_ent_kill(e, SIGKILL);
        }
        return 0;
    }
    e->exited = 1;
    e->exit_code = e->done ? 0 : 1;
    e->exited_ms = now;
    wrk_agent_ranks_record(a);
    if (e->link)
        return 0; /* the cron closes it after LINK_GRACE_MS, which finishes e */
    wrk_agent_ent_finish(e);
    return 1;
}

/* A rank dials AGENT_SOCK after its workerd went: it is taken back only when the peer's
 * pid (SO_PEERCRED, set by the kernel) is that of a rank we watch without a link. */
static void on_rank_dial(uv_stream_t *srv, int status)
{
    wrk_agent_t *a = srv->data;
    ch_conn_t *c = NULL;
    rank_ent_t *e = NULL;
    pid_t pid = 0;
    uid_t uid;
    gid_t gid;
    ch_conn_opts_t o = {.key = NULL, .is_server = 1};
    ch_conn_cbs_t cbs = {NULL, wrk_agent_rank_msg, wrk_agent_rank_close};
    if (status < 0 || ch_conn_accept(a->loop, srv, &o, &cbs, NULL, &c) < 0)
        return;
    if (ch_conn_peer_cred(c, &pid, &uid, &gid) == 0)
        for (e = a->ranks; e; e = e->next)
            if (e->pid == pid && !e->link && wrk_agent_ent_running(e) &&
                (!e->adopted || wrk_agent_adopted_alive(e)))
                break;
    if (!e) {
        CH_LOGW("adopt", "%s: not a rank of this node; refused", ch_conn_peer(c));
        ch_conn_close(c);
        return;
    }
    e->link = c;
    ch_conn_set_data(c, e);
    CH_LOGI("adopt", "job=%s gen=%" PRIu64 " rank=%u pid=%d: redialled; re-adopted", e->job_id,
            e->gen, e->rank, e->pid);
}

/* Listen on AGENT_SOCK in the run dir (ours: we hold its lock). Ranks run as their job's
 * users, so the socket is open to all; on_rank_dial checks who dials. */
int wrk_agent_listen_ranks(wrk_agent_t *a)
{
    int n = snprintf(a->agent_sock, sizeof a->agent_sock, "%s/%s", a->cfg.run_dir, AGENT_SOCK);
    if (n < 0 || (size_t)n >= sizeof a->agent_sock)
        return -ENAMETOOLONG;
    unlink(a->agent_sock);
    uv_pipe_init(a->loop, &a->listener, 0);
    a->listener.data = a;
    int rc = ch_err_from_uv(uv_pipe_bind(&a->listener, a->agent_sock));
    if (rc == 0 && chmod(a->agent_sock, 0666) < 0)
        rc = -errno;
    if (rc == 0)
        rc = ch_err_from_uv(uv_listen((uv_stream_t *)&a->listener, 128, on_rank_dial));
    if (rc < 0) {
        uv_close((uv_handle_t *)&a->listener, NULL);
        a->agent_sock[0] = 0;
        return rc;
    }
    a->listening = 1;
    return 0;
}

uint64_t wrk_agent_relink_grace_ms(void)
{
    const char *s = getenv("CHORUS_RELINK_GRACE_MS");
    char *end = NULL;
    unsigned long long v = s && *s ? strtoull(s, &end, 10) : 0;
    return s && *s && !*end && v <= UINT32_MAX ? (uint64_t)v : RELINK_GRACE_MS;
}

/* Watch r, a rank the previous workerd left running, until it redials. One that was to die
 * with its workerd (no keep: it is dying of PR_SET_PDEATHSIG now, and its job is the
 * coordinator's to restart) or has no socket to redial is killed, as is one we have no
 * memory for. */
void wrk_agent_adopt_one(wrk_agent_t *a, const wrk_adopt_rank_t *r)
{
    rank_ent_t *e = a->listening && r->keep ? calloc(1, sizeof *e) : NULL;
    if (!e) {
        wrk_adopt_kill(r);
        return;
    }
    e->a = a;
    snprintf(e->job_id, sizeof e->job_id, "%s", r->job_id);
    e->gen = r->gen;
    e->token = r->token;
    e->rank = r->rank;
    e->pid = r->pid;
    e->start_ticks = r->start_ticks;
    e->adopted = 1;
    e->keep = 1;
    e->link_closed_ms = ch_now_ms();
    e->next = a->ranks;
    a->ranks = e;
    CH_LOGI("adopt",
            "job=%s gen=%" PRIu64 " rank=%u pid=%d: left running by the previous "
            "workerd; re-adopting it",
            e->job_id, e->gen, e->rank, e->pid);
}
