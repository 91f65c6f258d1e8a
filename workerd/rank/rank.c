/* The rank runtime (rank.h): rank-mode main, events to workerd, and the rendezvous
 * store relayed through workerd.
 *
 * Theory of operation. workerd spawns chorus-rank with one end of a socketpair
 * as fd 3 and the rank's identity in the environment (proc.c). Unless workerd lets its
 * ranks outlive it (below), the rank first arms PR_SET_PDEATHSIG so it cannot outlive
 * workerd, then reads its identity and job file,
 * reports RANK_STARTED, runs the job kind and reports RANK_DONE or RANK_FAILED before
 * exiting. workerd sees the exit itself and reports RANK_EXITED.
 *
 * Rendezvous calls are blocking request/reply on the link: workerd relays them to
 * coordinatord and routes the reply back by request id. While workerd has no
 * coordinator link it answers -ENOTCONN at once; the rank retries until its own
 * deadline, so a coordinator restart during init is survived.
 *
 * With CHORUS_AGENT_SOCK set instead of CHORUS_PARENT_PID (workerd --keep-ranks), a rank
 * outlives its workerd (a restart, e.g. an upgrade): when its link closes it redials
 * CHORUS_AGENT_SOCK, where the next workerd re-adopts it (workerd/adopt.h), blocking the
 * report (and so training) meanwhile; after CHORUS_RELINK_GRACE_MS (default
 * 60 s) without a workerd it exits, so no rank outlives a workerd gone
 * for good. */
#include "workerd/rank/rank.h"

#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "chorus/config.h"
#include "common/auth.h"
#include "common/err.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/plan.h"
#include "common/util.h"
#include "workerd/engine/backend.h"
#include "workerd/rank/evalproc.h"

#define LINK_FD            3
#define JOB_FILE_MAX       (1u << 20)
#define KV_SET_DEADLINE_MS 60000
#define KV_REPLY_MARGIN_MS 5000 /* on top of a KvGet's own timeout */
#define KV_RETRY_MS        100
#define RELINK_RETRY_MS    200
#define RELINK_GRACE_MS    60000

// ----------------------------------------------------------------------------
// the link to workerd

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The link closed (its workerd ended): redial agent_sock until a workerd takes the rank
 * back. A rank no workerd takes within the grace exits here: it could report nothing,
 * and its job is restarted elsewhere. */
static void relink(wrk_rank_t *r)
{
    uint64_t deadline = ch_now_ms() + r->relink_grace_ms;
    ch_client_destroy(r->link);
    r->link = NULL;
    if (!r->agent_sock[0]) {
        CH_LOGE("rank", "job=%s rank=%u: link to workerd closed; exiting", r->job_id, r->rank);
        exit(1);
    }
    CH_LOGW("rank", "job=%s rank=%u: link to workerd closed; redialling %s for %" PRIu64 " ms",
            r->job_id, r->rank, r->agent_sock, r->relink_grace_ms);
    while (ch_now_ms() < deadline) {
        if (ch_client_connect_unix(r->agent_sock, 1000, &r->link) == 0) {
            CH_LOGI("rank", "job=%s rank=%u: back with workerd", r->job_id, r->rank);
            return;
        }
        r->link = NULL;
        sleep_ms(RELINK_RETRY_MS);
    }
    CH_LOGE("rank", "job=%s rank=%u: no workerd took this rank back in %" PRIu64 " ms; exiting",
            r->job_id, r->rank, r->relink_grace_ms);
    exit(1);
}

/* Send, redialling once if the link has closed. */
static int link_send(wrk_rank_t *r, Chorus__Envelope *env)
{
    int rc = ch_client_send(r->link, env);
    if (rc != -EPIPE)
        return rc;
    relink(r);
    return ch_client_send(r->link, env);
}

// ----------------------------------------------------------------------------
// events

/* FNV-1a over the metric names of ev, in order. */
static uint64_t metric_names(const Chorus__RankEvent *ev)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < ev->n_metrics; i++) {
        for (const char *p = ev->metrics[i]->name; p && *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
    }
    return h;
}

int wrk_rank_report(wrk_rank_t *r, Chorus__RankEvent *ev)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev->job_id = r->job_id;
    ev->generation = r->generation;
    ev->rank = r->rank;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = ev;
    return link_send(r, &env);
}

int wrk_rank_poll_checkpoint(wrk_rank_t *r)
{
    Chorus__Envelope *env = NULL;
    int asked = 0;
    /* drain what workerd sent: only CheckpointRanks of this job and generation counts */
    int rc;
    while ((rc = ch_client_recv(r->link, 0, &env)) == 0) {
        const Chorus__CheckpointRanks *cr =
            env->body_case == CHORUS__ENVELOPE__BODY_CHECKPOINT_RANKS ? env->checkpoint_ranks
                                                                      : NULL;
        if (cr && cr->generation == r->generation && strcmp(cr->job_id, r->job_id) == 0)
            asked = 1;
        ch_msg_free(env);
        env = NULL;
    }
    if (rc == -EPIPE)
        relink(r); /* a request sent to the old workerd is asked again by the next */
    return asked;
}

int wrk_rank_progress(wrk_rank_t *r, uint64_t step, uint64_t total, double loss,
                      double tokens_per_s, double mfu, Chorus__Metric **metrics, size_t n)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = step;
    ev.total_steps = total;
    ev.loss = loss;
    ev.tokens_per_s = tokens_per_s;
    ev.mfu = mfu;
    ev.n_metrics = n;
    ev.metrics = metrics;
    uint64_t now = ch_now_ms(), names = metric_names(&ev);
    if (step < total && names == r->progress_names && r->progress_ms &&
        now - r->progress_ms < WRK_RANK_PROGRESS_MIN_MS)
        return 0; /* a later report carries the same figures, newer */
    r->progress_ms = now;
    r->progress_names = names;
    return wrk_rank_report(r, &ev);
}

int wrk_rank_fail(wrk_rank_t *r, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    return rc; /* logged once, with the code, when the rank reports RANK_FAILED */
}

static int report_kind(wrk_rank_t *r, Chorus__RankEventKind kind, const char *message)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = kind;
    if (message)
        ev.message = (char *)message;
    return wrk_rank_report(r, &ev);
}

void wrk_rank_place(const wrk_rank_t *r, Chorus__RankEvent *ev)
{
    const ch_jobspec_t *s = &r->spec;
    ch_layout_t l = ch_jobspec_layout(s);
    if (s->kind != CH_JOB_TRAIN || ch_layout_world(l) != r->world_size)
        return;
    ch_place_t p;
    if (ch_plan_place(s, r->rank, &p) == 0)
        ch_msg_place_to_event(&p, ev);
}

/* RANK_STARTED, with the rank's place in the layout. */
static int report_started(wrk_rank_t *r)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_STARTED;
    wrk_rank_place(r, &ev);
    if (ev.placed)
        CH_LOGI("rank",
                "job=%s gen=%" PRIu64 " rank=%u: tp %u pp %u dp %u, blocks %u..%u, ZeRO-3 shard %u "
                "of %u (%" PRIu64 " parameters owned)",
                r->job_id, r->generation, r->rank, ev.coord_tp, ev.coord_pp, ev.coord_dp,
                ev.first_block, ev.first_block + ev.blocks - 1, ev.coord_dp, ev.shards,
                ev.owned_params);
    return wrk_rank_report(r, &ev);
}

// ----------------------------------------------------------------------------
// rendezvous through workerd

/* workerd answers these while it has no coordinator link: worth a retry. */
static int retryable(int rc)
{
    return rc == -ENOTCONN || rc == -ECONNRESET || rc == -EAGAIN;
}

/* One relayed call: 0 and the reply's value (KvReply) or nothing (Ok), else a code. */
static int kv_call(wrk_rank_t *r, Chorus__Envelope *req, int timeout_ms, void **val, size_t *len)
{
    Chorus__Envelope *resp = NULL;
    int rc = ch_client_call(r->link, req, timeout_ms, &resp);
    if (rc == -EPIPE) { /* workerd restarted: ask the next one */
        relink(r);
        rc = -ECONNRESET;
    }
    if (rc < 0)
        goto out;
    if (resp->body_case == CHORUS__ENVELOPE__BODY_OK)
        goto out;
    if (resp->body_case != CHORUS__ENVELOPE__BODY_KV_REPLY) {
        rc = CH_E_FRAME;
        goto out;
    }
    rc = resp->kv_reply->code;
    if (rc > 0)
        rc = CH_E_FRAME;
    if (rc == 0 && val) {
        size_t n = resp->kv_reply->value.len;
        if (n > CH_RDZV_VALUE_MAX) {
            rc = CH_E_TOOBIG;
            goto out;
        }
        if (!(*val = malloc(n ? n : 1))) {
            rc = -ENOMEM;
            goto out;
        }
        if (n)
            memcpy(*val, resp->kv_reply->value.data, n);
        *len = n;
    }
out:
    if (resp)
        ch_msg_free(resp);
    return rc;
}

static int rdzv_set(void *ud, const char *key, const void *val, size_t len)
{
    wrk_rank_t *r = ud;
    Chorus__KvSet ks = CHORUS__KV_SET__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint64_t deadline = ch_now_ms() + KV_SET_DEADLINE_MS;
    int rc;

    if (strlen(key) > CH_RDZV_KEY_MAX)
        return -ENAMETOOLONG;
    if (len > CH_RDZV_VALUE_MAX)
        return CH_E_TOOBIG;
    ks.job_id = r->job_id;
    ks.generation = r->generation;
    ks.key = (char *)key;
    ks.value.data = (uint8_t *)val;
    ks.value.len = len;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
    env.kv_set = &ks;
    for (;;) {
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        rc = kv_call(r, &env, (int)(deadline - now), NULL, NULL);
        if (!retryable(rc))
            return rc;
        sleep_ms(KV_RETRY_MS);
    }
}

static int rdzv_get(void *ud, const char *key, int timeout_ms, void **val, size_t *len)
{
    wrk_rank_t *r = ud;
    Chorus__KvGet kg = CHORUS__KV_GET__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint64_t deadline = ch_now_ms() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms);
    int rc;

    if (strlen(key) > CH_RDZV_KEY_MAX)
        return -ENAMETOOLONG;
    kg.job_id = r->job_id;
    kg.generation = r->generation;
    kg.key = (char *)key;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_GET;
    env.kv_get = &kg;
    for (;;) {
        uint64_t now = ch_now_ms();
        kg.timeout_ms = now < deadline ? (uint32_t)(deadline - now) : 0;
        rc = kv_call(r, &env, (int)kg.timeout_ms + KV_REPLY_MARGIN_MS, val, len);
        if (!retryable(rc))
            return rc;
        if (ch_now_ms() + KV_RETRY_MS >= deadline)
            return -ETIMEDOUT;
        sleep_ms(KV_RETRY_MS);
    }
}

// ----------------------------------------------------------------------------
// rank-mode main

static int env_u64(const char *name, uint64_t max, uint64_t *out)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max || *s == '-')
        return -EINVAL;
    *out = v;
    return 0;
}

static int env_str(const char *name, char *buf, size_t len)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return -EINVAL;
    if (strlen(s) >= len)
        return -ENAMETOOLONG;
    memcpy(buf, s, strlen(s) + 1);
    return 0;
}

/* Identity from the environment workerd set (proc.c). err names the bad variable. */
static int read_identity(wrk_rank_t *r, char *err, size_t errlen)
{
    uint64_t v[4];
    const char *names[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    for (int i = 0; i < 4; i++) {
        if (env_u64(names[i], UINT32_MAX, &v[i]) < 0) {
            snprintf(err, errlen, "bad or missing %s", names[i]);
            return CH_E_CONFIG;
        }
    }
    r->rank = (uint32_t)v[0];
    r->world_size = (uint32_t)v[1];
    r->local_rank = (uint32_t)v[2];
    r->local_world_size = (uint32_t)v[3];
    uint64_t th = 0;
    if (getenv("CHORUS_THREADS") && env_u64("CHORUS_THREADS", 1024, &th) < 0) {
        snprintf(err, errlen, "bad CHORUS_THREADS");
        return CH_E_CONFIG;
    }
    r->threads = (uint32_t)th;
    if (r->rank >= r->world_size || r->local_rank >= r->local_world_size) {
        snprintf(err, errlen, "rank %u of %u, local %u of %u", r->rank, r->world_size,
                 r->local_rank, r->local_world_size);
        return CH_E_CONFIG;
    }
    if (env_str("CHORUS_JOB", r->job_id, sizeof r->job_id) < 0 ||
        env_u64("CHORUS_GENERATION", UINT64_MAX, &r->generation) < 0 ||
        env_u64("CHORUS_RESUME_STEP", UINT64_MAX, &r->resume_step) < 0 ||
        env_str("CHORUS_RUN_DIR", r->run_dir, sizeof r->run_dir) < 0) {
        snprintf(err, errlen, "bad or missing CHORUS_JOB/GENERATION/RESUME_STEP/RUN_DIR");
        return CH_E_CONFIG;
    }
    if (env_str("CHORUS_MEMORY_DIR", r->memory_dir, sizeof r->memory_dir) < 0)
        r->memory_dir[0] = '\0'; /* optional: no in-memory checkpoints */
    if (env_str("CHORUS_NODE", r->node, sizeof r->node) < 0)
        r->node[0] = '\0';
    char device[16];
    r->device = CH_DEVICE_CPU;
    if (env_str("CHORUS_DEVICE", device, sizeof device) == 0 &&
        ch_device_parse(device, &r->device) < 0) {
        snprintf(err, errlen, "CHORUS_DEVICE: expected cpu or cuda, got '%s'", device);
        return CH_E_CONFIG;
    }
    return 0;
}

int wrk_rank_on_gpu(const wrk_rank_t *r)
{
    return r->spec.train.device == CH_DEVICE_CUDA ||
           (r->spec.kind == CH_JOB_DIAG && r->device == CH_DEVICE_CUDA);
}

int wrk_rank_gpu_shared(const wrk_rank_t *r)
{
    const char *force = getenv("CHORUS_COLL_STAGED");
    if (force && *force)
        return strcmp(force, "0") != 0;
#if CHORUS_HAVE_CUDA
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (eng_backend_cuda_devices(&n) < 0 || n == 0)
        return 0;
    /* a launcher that pins each rank to one GPU of its own leaves one visible */
    if (n == 1 && visible != NULL && *visible && strchr(visible, ',') == NULL)
        return 0;
    return r->local_world_size > (uint32_t)n;
#else
    (void)r;
    return 0;
#endif
}

int wrk_rank_gpu(const wrk_rank_t *r, const char *what, int *device, char *err, size_t errlen)
{
    *device = -1;
#if CHORUS_HAVE_CUDA
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0, rc = eng_backend_cuda_devices(&n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: cuda requested but the CUDA runtime failed", what);
    if (n == 0)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "%s: cuda requested but no GPU visible (CUDA_VISIBLE_DEVICES=%s)", what,
                       visible ? visible : "unset");
    if (r->local_rank < (uint32_t)n) {
        *device = (int)r->local_rank;
        return 0;
    }
    /* more ranks than GPUs: they share, over host-staged collectives (wrk_rank_gpu_shared) */
    if (wrk_rank_gpu_shared(r)) {
        *device = (int)(r->local_rank % (uint32_t)n);
        return 0;
    }
    /* workerd or the launcher gave this rank one GPU of its own */
    if (n == 1 && visible != NULL && strchr(visible, ',') == NULL) {
        *device = 0;
        return 0;
    }
    return ch_errf(err, errlen, -ENODEV,
                   "%s: cuda requested: LOCAL_RANK %u but %d GPU(s) visible "
                   "(CUDA_VISIBLE_DEVICES=%s); one GPU per rank",
                   what, r->local_rank, n, visible ? visible : "unset");
#else
    (void)r;
    return ch_errf(err, errlen, CH_E_CONFIG,
                   "%s: cuda requested but this build has no CUDA backend", what);
#endif
}

static int load_job(wrk_rank_t *r, char *err, size_t errlen)
{
    const char *path = getenv("CHORUS_JOB_FILE");
    char *text = NULL;
    size_t len;
    int rc;
    if (!path || !*path) {
        snprintf(err, errlen, "CHORUS_JOB_FILE not set");
        return CH_E_CONFIG;
    }
    rc = ch_file_read(path, JOB_FILE_MAX, &text, &len);
    if (rc < 0) {
        snprintf(err, errlen, "%s: %s", path, ch_strerror(rc));
        return rc;
    }
    ch_jobspec_defaults(&r->spec);
    rc = ch_jobspec_parse(text, &r->spec, err, errlen);
    free(text);
    return rc;
}

static int run_kind(wrk_rank_t *r)
{
    int rc;
    switch (r->spec.kind) {
    case CH_JOB_DIAG:
        rc = wrk_diag_run(r);
        if (rc == 0 && r->spec.diag.collectives)
            rc = wrk_diag_coll_run(r);
        return rc;
    case CH_JOB_TRAIN:
        return wrk_train_run(r);
    }
    return wrk_rank_fail(r, CH_E_CONFIG, "unknown job kind %d", (int)r->spec.kind);
}

/* The parent check comes first: a rank told to must never outlive its workerd. */
static int tie_to_parent(void)
{
    uint64_t ppid;
    if (!getenv("CHORUS_PARENT_PID"))
        return 0; /* it redials CHORUS_AGENT_SOCK instead (relink) */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return -errno;
    if (env_u64("CHORUS_PARENT_PID", INT32_MAX, &ppid) < 0)
        return -EINVAL;
    if ((uint64_t)getppid() != ppid)
        return -ESRCH; /* workerd died before the prctl took effect */
    return 0;
}

/* The evaluation child (evalproc.h): `--evaluate DIR STEP OUT PARENT_PID`, with the
 * rank's environment. It dies with the rank that spawned it; its log lines go to the
 * rank's log (the same stderr). */
int wrk_rank_eval_main(int argc, char **argv)
{
    wrk_rank_t *r = NULL;
    char err[CH_PATH_LEN + 256] = "", *end = NULL;
    int rc = CH_E_CONFIG;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || argc != 6)
        return 2;
    unsigned long long step = strtoull(argv[3], &end, 10);
    if (!*argv[3] || *end || (long long)getppid() != strtoll(argv[5], NULL, 10))
        return 2; /* a bad call, or the rank died before the prctl took effect */
    ch_log_init("rank");
    if (!(r = calloc(1, sizeof *r)))
        goto out;
    if ((rc = read_identity(r, err, sizeof err)) == 0 && (rc = load_job(r, err, sizeof err)) == 0)
        rc = wrk_eval_child(r, argv[2], step, argv[4], err, sizeof err);
    if (rc < 0)
        CH_LOGW("train",
                "job=%s rank=%u (evaluation, pid %ld) step=%llu: accuracy not evaluated: %s",
                r->job_id, r->rank, (long)getpid(), step, err[0] ? err : ch_strerror(rc));
out:
    free(r);
    return rc == 0 ? 0 : 1;
}

/* Where to find workerd again if the link closes, and for how long (rank.c's top). */
static void relink_setup(wrk_rank_t *r)
{
    uint64_t grace;
    if (env_str("CHORUS_AGENT_SOCK", r->agent_sock, sizeof r->agent_sock) < 0)
        r->agent_sock[0] = 0;
    r->relink_grace_ms =
        env_u64("CHORUS_RELINK_GRACE_MS", UINT32_MAX, &grace) == 0 ? grace : RELINK_GRACE_MS;
}

int wrk_rank_main(int argc, char **argv)
{
    wrk_rank_t *r = NULL;
    char err[CH_PATH_LEN + 256] = "";
    char msg[CH_PATH_LEN + 512];
    int rc, link_fd = LINK_FD;

    if (tie_to_parent() < 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    ch_log_init("rank");
    CH_LOGI("rank", "chorus-rank %s", CHORUS_VERSION);
    if (ch_auth_global_init() < 0)
        return 1;
    if (!(r = calloc(1, sizeof *r))) {
        CH_LOGE("rank", "out of memory");
        return 1;
    }
    rc = ch_client_from_fd(link_fd, &r->link);
    if (rc < 0) {
        CH_LOGE("rank", "link to workerd (fd 3): %s", ch_strerror(rc));
        goto out;
    }
    relink_setup(r);
    r->rdzv.ud = r;
    r->rdzv.set = rdzv_set;
    r->rdzv.get = rdzv_get;

    /* From here failures can be reported (workerd fills in who we are if we cannot). */
    rc = read_identity(r, err, sizeof err);
    if (rc == 0)
        rc = load_job(r, err, sizeof err);
    if (rc == 0 && (rc = ch_mkdirs(r->run_dir, 0755)) < 0)
        snprintf(err, sizeof err, "%s: %s", r->run_dir, ch_strerror(rc));
    if (rc < 0) {
        wrk_rank_fail(r, rc, "%s", err);
        goto report;
    }
    CH_LOGI("rank", "job=%s gen=%" PRIu64 " rank=%u/%u local=%u/%u kind=%s resume=%" PRIu64,
            r->job_id, r->generation, r->rank, r->world_size, r->local_rank, r->local_world_size,
            ch_job_kind_name(r->spec.kind), r->resume_step);
    rc = report_started(r);
    if (rc < 0) {
        CH_LOGE("rank", "job=%s rank=%u: report to workerd: %s", r->job_id, r->rank,
                ch_strerror(rc));
        goto out;
    }
    rc = run_kind(r);
report:
    if (rc == 0) {
        CH_LOGI("rank", "job=%s gen=%" PRIu64 " rank=%u: done", r->job_id, r->generation, r->rank);
        rc = report_kind(r, CHORUS__RANK_EVENT_KIND__RANK_DONE, NULL);
    } else {
        if (r->detail[0])
            snprintf(msg, sizeof msg, "%s: %s", ch_strerror(rc), r->detail);
        else
            snprintf(msg, sizeof msg, "%s", ch_strerror(rc));
        CH_LOGE("rank", "job=%s gen=%" PRIu64 " rank=%u: failed: %s", r->job_id, r->generation,
                r->rank, msg);
        Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
        ev.kind = CHORUS__RANK_EVENT_KIND__RANK_FAILED;
        ev.message = msg;
        Chorus__Metric gm[4], *gp[4];
        if (r->timeout_group[0]) { /* name the culprit, not only this victim */
            ev.timeout_group = r->timeout_group;
            ev.timeout_peer = r->timeout_peer;
            ev.timeout_seq = r->timeout_seq;
            for (uint32_t i = 0; i < r->n_entered && i < 4; i++) {
                chorus__metric__init(&gm[i]);
                gm[i].name = (char *)r->entered[i].group;
                gm[i].value = (double)r->entered[i].entered;
                gp[i] = &gm[i];
            }
            ev.n_group_entered = r->n_entered < 4 ? r->n_entered : 4;
            ev.group_entered = gp;
        }
        /* What the coordinator needs to tell a cause no restart can change (it decides,
         * seeing every node) from one worth a restart. */
        const char *cls = r->cause_class ? r->cause_class : ch_err_lasting(rc);
        ev.cause_class = cls ? (char *)cls : "";
        ev.before_first_step = !r->stepped;
        ev.nonfinite_batch = r->nonfinite_batch;
        wrk_rank_report(r, &ev);
    }
out:
    if (r && r->link)
        ch_client_destroy(r->link);
    free(r);
    (void)argc;
    (void)argv;
    return rc == 0 ? 0 : 1;
}
