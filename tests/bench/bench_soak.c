/* chorus-bench-soak: every attack of issue 11 at once, with real work, for a while.
 *
 *   chorus-bench-soak [SECONDS]     (default 120; CHORUS_SOAK_S overrides)
 *
 * A local cluster (the integration harness: 2 nodes x 2 slots) runs diag jobs while, in
 * rounds of about a second, this process
 *   - opens FLOOD connections that never authenticate (half announce a 16 MiB frame and
 *     push 64 KiB of it, half send nothing) and closes the last round's;
 *   - sends garbage without the key (an HTTP request, a frame of 0xff) on fresh links;
 *   - as a key holder: registers a worker under a random name and sends validly tagged
 *     nonsense (events and rendezvous calls for jobs that do not exist, control requests
 *     on a worker link, a 200-entry Register), then a frame whose tag is wrong;
 *   - pipelines control requests (ListJobs) on a link it never reads, kept for one round;
 *   - submits diag jobs over the control socket and cancels every other one at once;
 *   - when run as root, as another user of the cluster (uid 60001, in the control group):
 *     submits TENANT_SUBMITS jobs a round past its limits (max-queued-jobs 50,
 *     max-running-ranks 1, the default 120 submissions a minute), reads root's latest
 *     job, tries to cancel it, to forget a node and to give its own job a priority.
 * Each round samples coordinatord's RSS and descriptors and times `nodes` (ListNodes
 * over the control socket). At the end the attacks stop, every job is waited for, and
 * each must be in the state its history says (cancelled when the cancel was
 * acknowledged, else completed): one that is missing or in another state counts as
 * lost or wrongly stated.
 *
 * RESULT lines: peak RSS against the 64 MB goal; RSS growth from the first to the last
 * quarter of the run (flat: under 10%); descriptors after the attacks stopped against
 * before they started; `nodes` latency (median, max) against the 100 ms goal; jobs lost
 * or wrongly stated (must be 0); the volume of the attacks; the other user's attempts
 * and how many of the forbidden ones succeeded (must be 0). SAMPLE lines on stderr give
 * the series. Exit status 1 when a goal is missed. */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attack.h"
#include "common/client.h"
#include "common/frame.h"
#include "common/rng.h"
#include "common/msg.h"
#include "common/util.h"
#include "harness.h"

#define FLOOD      100
#define PIPELINE   2000
#define MAX_JOBS   4096
#define MAX_ROUNDS 100000
#define RSS_GOAL   (64 * 1024) /* KiB */
#define NODES_GOAL 100.0       /* ms */

typedef struct job {
    char id[32];
    int cancelled; /* the cancel was acknowledged */
} job_t;

typedef struct sample {
    double t_s, nodes_ms;
    long rss_kb;
    int fds;
} sample_t;

static h_cluster_t C;
static ch_key_t key;
static job_t jobs[MAX_JOBS];
static int n_jobs;
static sample_t samples[MAX_ROUNDS];
static int n_samples;
static uint64_t rng = 0x536f616bull;
static long sent_unauth, sent_garbage, sent_nonsense, sent_pipelined;

#define TENANT_UID     60001u
#define TENANT_GID     65534u
#define TENANT_SUBMITS 20

/* What the other user did, over the run. breaches: forbidden things that worked. */
typedef struct tenant {
    long submitted, accepted, refused, breaches;
} tenant_t;
static tenant_t tenant;
static int tenant_on; /* running as root: the other user takes part */

static uint64_t rnd(void)
{
    return ch_mix64_next(&rng);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_l(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* One control call over the control socket; the reply's code. */
static int call(ch_client_t *cl, Chorus__Envelope *env, Chorus__Envelope **resp)
{
    *resp = NULL;
    return ch_client_call(cl, env, 10000, resp);
}

static double time_nodes(ch_client_t *cl)
{
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    env.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    env.list_nodes = &ln;
    uint64_t t0 = ch_now_ns();
    int rc = call(cl, &env, &resp);
    double ms = (double)(ch_now_ns() - t0) / 1e6;
    ch_msg_free(resp);
    return rc == 0 ? ms : -1;
}

/* Submit one diag job; cancel it at once when asked. */
static void job_churn(ch_client_t *cl, int cancel)
{
    if (n_jobs >= MAX_JOBS)
        return;
    Chorus__Submit sub = CHORUS__SUBMIT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    char ini[128];
    snprintf(ini, sizeof ini, "[job]\nname = soak-%d\nkind = diag\n", n_jobs);
    sub.job_ini = ini;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    if (call(cl, &env, &resp) != 0) {
        fprintf(stderr, "soak: submit refused: %s\n",
                resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR ? resp->error->message
                                                                        : "no reply");
        ch_msg_free(resp);
        return;
    }
    job_t *j = &jobs[n_jobs++];
    snprintf(j->id, sizeof j->id, "%s", resp->submit_reply->job_id);
    ch_msg_free(resp);
    if (!cancel)
        return;
    Chorus__Cancel can = CHORUS__CANCEL__INIT;
    Chorus__Envelope cenv = CHORUS__ENVELOPE__INIT;
    can.job_id = j->id;
    cenv.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    cenv.cancel = &can;
    j->cancelled = call(cl, &cenv, &resp) == 0; /* else it had ended already */
    ch_msg_free(resp);
}

/* 1 when the request was answered with an error of code (the refusal expected). */
static int refused_with(ch_client_t *cl, Chorus__Envelope *env, int code)
{
    Chorus__Envelope *resp = NULL;
    int rc = call(cl, env, &resp);
    ch_msg_free(resp);
    return rc == code;
}

/* The other user's round, in the child (already that user): tallies into t. */
static void tenant_try(ch_client_t *cl, const char *root_job, tenant_t *t)
{
    Chorus__Submit sub = CHORUS__SUBMIT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    char ini[128];
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    sub.job_ini = ini;
    for (int i = 0; i < TENANT_SUBMITS; i++) {
        snprintf(ini, sizeof ini, "[job]\nname = tenant-%d\nkind = diag\n", i);
        int rc = call(cl, &env, &resp);
        ch_msg_free(resp);
        t->submitted++;
        t->accepted += rc == 0;
        t->refused += rc == -EDQUOT;
    }
    snprintf(ini, sizeof ini, "[job]\nname = tenant-first\nkind = diag\npriority = 9\n");
    t->breaches += !refused_with(cl, &env, -EPERM);
    if (root_job[0]) {
        Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
        Chorus__Envelope qe = CHORUS__ENVELOPE__INIT;
        q.job_id = (char *)root_job;
        qe.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
        qe.job_query = &q;
        if (call(cl, &qe, &resp) == 0 && resp->job_info->job_ini && resp->job_info->job_ini[0])
            t->breaches++;
        ch_msg_free(resp);
        Chorus__Cancel can = CHORUS__CANCEL__INIT;
        Chorus__Envelope ce = CHORUS__ENVELOPE__INIT;
        can.job_id = (char *)root_job;
        ce.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
        ce.cancel = &can;
        t->breaches += !refused_with(cl, &ce, -EACCES);
    }
    Chorus__ForgetNode fn = CHORUS__FORGET_NODE__INIT;
    Chorus__Envelope fe = CHORUS__ENVELOPE__INIT;
    fn.name = "node1";
    fe.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    fe.forget_node = &fn;
    t->breaches += !refused_with(cl, &fe, -EACCES);
}

/* One round of the other user, in a child as TENANT_UID; its tallies come back over a
 * pipe. */
static void tenant_round(void)
{
    int p[2];
    tenant_t t = {0};
    if (!tenant_on || chmod(C.dir, 0711) < 0 || pipe(p) < 0)
        return;
    const char *root_job = n_jobs ? jobs[n_jobs - 1].id : "";
    pid_t pid = fork();
    if (pid == 0) {
        ch_client_t *cl = NULL;
        close(p[0]);
        /* From inside the cluster folder (0711): the socket is reached by a relative
         * path, whatever the modes of the folders above it (a 0700 home). */
        if (chdir(C.dir) == 0 && setgroups(0, NULL) == 0 && setgid(TENANT_GID) == 0 &&
            setuid(TENANT_UID) == 0 && ch_client_connect_unix("ctl.sock", 5000, &cl) == 0)
            tenant_try(cl, root_job, &t);
        else
            t.breaches = -1; /* could not act as the user at all */
        ssize_t w = write(p[1], &t, sizeof t);
        _exit(w == (ssize_t)sizeof t ? 0 : 1);
    }
    close(p[1]);
    if (pid > 0 && read(p[0], &t, sizeof t) == (ssize_t)sizeof t && t.breaches >= 0) {
        tenant.submitted += t.submitted;
        tenant.accepted += t.accepted;
        tenant.refused += t.refused;
        tenant.breaches += t.breaches;
    } else {
        fprintf(stderr, "soak: the other user's round did not run\n");
    }
    close(p[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

/* As root: let uid 60001 (group 65534) on the control socket, with limits that a round
 * of its submissions reaches. Set before `local up`, which passes the environment on to
 * coordinatord (CHORUS_<OPTION>). */
static void tenant_setup(void)
{
    const struct group *g = getgrgid(TENANT_GID);
    if (geteuid() != 0 || !g) {
        fprintf(stderr, "soak: not root: no attacks as another user\n");
        return;
    }
    setenv("CHORUS_CTL_GROUP", g->gr_name, 1);
    setenv("CHORUS_MAX_QUEUED_JOBS", "50", 1);
    setenv("CHORUS_MAX_RUNNING_RANKS", "1", 1);
    tenant_on = 1;
}

/* The job's state now ("" when status does not know it). */
static void job_state(ch_client_t *cl, const char *id, char *state, size_t n)
{
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    q.job_id = (char *)id;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    state[0] = 0;
    if (call(cl, &env, &resp) == 0)
        snprintf(state, n, "%s", resp->job_info->state);
    ch_msg_free(resp);
}

static void send_env(int fd, ch_session_t *s, Chorus__Envelope *env, int corrupt)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    if (ch_msg_encode(s, env, &frame, &len) < 0)
        return;
    if (corrupt)
        frame[len - 1] ^= 0x40;
    (void)h_send_all(fd, frame, len);
    free(frame);
}

/* A key holder talking nonsense as a worker, then a frame with a wrong tag. */
static void nonsense_worker(void)
{
    ch_session_t s;
    int fd = h_tcp_connect(C.addr);
    if (fd < 0)
        return;
    if (h_raw_handshake(fd, &key, "worker", 0, &s) < 0) {
        close(fd);
        return;
    }
    char name[32], job[32];
    snprintf(name, sizeof name, "soak-%llx", (unsigned long long)(rnd() & 0xffffff));
    snprintf(job, sizeof job, "j%llu", (unsigned long long)(rnd() % 100000 + 50000));
    Chorus__RankRef refs[200], *rp[200];
    for (int i = 0; i < 200; i++) {
        Chorus__RankRef init = CHORUS__RANK_REF__INIT;
        refs[i] = init;
        refs[i].job_id = job;
        refs[i].generation = 1;
        refs[i].rank = (uint32_t)i;
        rp[i] = &refs[i];
    }
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    reg.name = name;
    reg.slots = 1;
    reg.rack = "soak";
    reg.device = "cpu";
    reg.running = rp;
    reg.n_running = 200;
    env.request_id = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    send_env(fd, &s, &env, 0);
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = job;
    ev.generation = rnd() % 3;
    ev.rank = (uint32_t)(rnd() % 1000);
    ev.kind = (int)(rnd() % 6);
    ev.step = rnd();
    Chorus__KvSet ks = CHORUS__KV_SET__INIT;
    uint8_t val[256];
    memset(val, 0xab, sizeof val);
    ks.job_id = job;
    ks.generation = 1;
    ks.key = "addr";
    ks.value.data = val;
    ks.value.len = sizeof val;
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    Chorus__Cancel can = CHORUS__CANCEL__INIT;
    can.job_id = "j1";
    for (int i = 0; i < 20; i++) {
        Chorus__Envelope e = CHORUS__ENVELOPE__INIT;
        e.request_id = (uint64_t)i + 2;
        switch (i % 4) {
        case 0:
            e.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
            e.rank_event = &ev;
            break;
        case 1:
            e.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
            e.kv_set = &ks;
            break;
        case 2:
            e.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS; /* not on a worker link */
            e.list_jobs = &lj;
            break;
        default:
            e.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
            e.cancel = &can;
            break;
        }
        send_env(fd, &s, &e, 0);
        sent_nonsense++;
    }
    Chorus__Envelope last = CHORUS__ENVELOPE__INIT;
    last.request_id = 99;
    last.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    last.list_jobs = &lj;
    send_env(fd, &s, &last, 1); /* a wrong tag closes the link */
    (void)h_peer_closed(fd, 500);
    close(fd);
}

/* Garbage without the key. */
static void garbage(void)
{
    static const char http[] = "GET /metrics HTTP/1.1\r\nHost: chorus\r\n\r\n";
    uint8_t frame[CH_FRAME_HDR + 64];
    memset(frame, 0xff, sizeof frame);
    ch_frame_put_header(frame, 64);
    for (int i = 0; i < 4; i++) {
        int fd = h_tcp_connect(C.addr);
        if (fd < 0)
            continue;
        if (i % 2)
            (void)h_send_all(fd, http, sizeof http - 1);
        else
            (void)h_send_all(fd, frame, sizeof frame);
        sent_garbage++;
        (void)h_peer_closed(fd, 200);
        close(fd);
    }
}

static void sample(pid_t pid, ch_client_t *cl, double t_s)
{
    if (n_samples >= MAX_ROUNDS)
        return;
    sample_t *s = &samples[n_samples++];
    s->t_s = t_s;
    s->nodes_ms = time_nodes(cl);
    s->rss_kb = a_rss_kb(pid);
    s->fds = a_fd_count(pid);
    fprintf(stderr, "SAMPLE t=%.1f rss_kb=%ld fds=%d nodes_ms=%.1f jobs=%d\n", s->t_s, s->rss_kb,
            s->fds, s->nodes_ms, n_jobs);
}

static long quarter_median(int from, int to)
{
    long v[MAX_ROUNDS];
    int n = 0;
    for (int i = from; i < to; i++)
        v[n++] = samples[i].rss_kb;
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof v[0], cmp_l);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 120;
    if (getenv("CHORUS_SOAK_S"))
        secs = atof(getenv("CHORUS_SOAK_S"));
    if (secs <= 0) {
        fprintf(stderr, "usage: %s [SECONDS]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    tenant_setup();
    if (ch_auth_global_init() < 0 || h_cluster_up(&C, 2, 2) < 0) {
        fprintf(stderr, "soak: local cluster did not start\n");
        return 2;
    }
    int rc = 2;
    ch_client_t *cl = NULL;
    pid_t pid = h_pid(&C, "coordinatord");
    if (pid <= 0 || ch_key_load(C.key, &key) < 0 || ch_client_connect_unix(C.sock, 5000, &cl) < 0)
        goto out;

    int fd0 = a_fd_count(pid);
    int flood[FLOOD], pipe_fd = -1;
    for (int i = 0; i < FLOOD; i++)
        flood[i] = -1;
    uint64_t t0 = ch_now_ms(), end = t0 + (uint64_t)(secs * 1000);
    fprintf(stderr, "soak: %.0f s against coordinatord pid %d (%d fds at rest)\n", secs, (int)pid,
            fd0);
    for (int round = 0; ch_now_ms() < end; round++) {
        a_close_all(flood, FLOOD);
        a_unauth_flood(C.addr, FLOOD / 2, 16u << 20, 64u << 10, 50, flood);
        a_unauth_flood(C.addr, FLOOD / 2, 64, 0, 50, flood + FLOOD / 2);
        sent_unauth += FLOOD;
        garbage();
        nonsense_worker();
        if (pipe_fd >= 0)
            close(pipe_fd);
        int n = a_pipeline_unread(C.addr, &key, PIPELINE, 100, &pipe_fd);
        sent_pipelined += n > 0 ? n : 0;
        int pending = 0;
        for (int i = n_jobs - 8 < 0 ? 0 : n_jobs - 8; i < n_jobs; i++) {
            char st[32];
            job_state(cl, jobs[i].id, st, sizeof st);
            pending += strcmp(st, "queued") == 0 || strcmp(st, "starting") == 0 ||
                       strcmp(st, "running") == 0;
        }
        if (pending < 4) {
            job_churn(cl, 0);
            job_churn(cl, 1);
        }
        tenant_round();
        sample(pid, cl, (double)(ch_now_ms() - t0) / 1000);
        (void)round;
    }
    a_close_all(flood, FLOOD);
    if (pipe_fd >= 0)
        close(pipe_fd);

    /* Every job to its end, then what it says. */
    int lost = 0, wrong = 0;
    uint64_t deadline = ch_now_ms() + 120000;
    for (int i = 0; i < n_jobs; i++) {
        char st[32] = "";
        for (;;) {
            job_state(cl, jobs[i].id, st, sizeof st);
            int ended = !strcmp(st, "completed") || !strcmp(st, "failed") ||
                        !strcmp(st, "cancelled") || !st[0];
            if (ended || ch_now_ms() > deadline)
                break;
            usleep(100 * 1000);
        }
        const char *want = jobs[i].cancelled ? "cancelled" : "completed";
        if (!st[0]) {
            lost++;
            fprintf(stderr, "soak: job %s lost\n", jobs[i].id);
        } else if (strcmp(st, want) != 0) {
            wrong++;
            fprintf(stderr, "soak: job %s is %s, expected %s\n", jobs[i].id, st, want);
        }
    }
    usleep(4000 * 1000); /* past the handshake timeout: every attack's link is gone */
    int fd_end = a_fd_count(pid);
    sample(pid, cl, (double)(ch_now_ms() - t0) / 1000);

    long peak = a_peak_rss_kb(pid);
    int q = n_samples / 4 ? n_samples / 4 : 1;
    long rss_first = quarter_median(0, q), rss_last = quarter_median(n_samples - q, n_samples);
    double growth = rss_first ? (double)(rss_last - rss_first) / (double)rss_first : 0;
    double lat[MAX_ROUNDS];
    int nl = 0, failed_calls = 0;
    for (int i = 0; i < n_samples; i++) {
        if (samples[i].nodes_ms >= 0)
            lat[nl++] = samples[i].nodes_ms;
        else
            failed_calls++;
    }
    qsort(lat, (size_t)nl, sizeof lat[0], cmp_d);
    double med = nl ? lat[nl / 2] : -1, max = nl ? lat[nl - 1] : -1;

    printf("RESULT name=soak.rss_peak value=%ld unit=KiB ref=goal ref_value=%d ratio=%.3f\n", peak,
           RSS_GOAL, (double)peak / RSS_GOAL);
    printf("RESULT name=soak.rss_growth value=%.3f unit=fraction ref=first_quarter_kib "
           "ref_value=%ld last_quarter_kib=%ld flat=%d\n",
           growth, rss_first, rss_last, growth < 0.10);
    printf("RESULT name=soak.fds_after value=%d unit=fds ref=before ref_value=%d flat=%d\n", fd_end,
           fd0, fd_end <= fd0 + 2);
    printf("RESULT name=soak.nodes_ms.median value=%.1f unit=ms ref=goal ref_value=%.0f\n", med,
           NODES_GOAL);
    printf("RESULT name=soak.nodes_ms.max value=%.1f unit=ms ref=goal ref_value=%.0f "
           "unanswered=%d\n",
           max, NODES_GOAL, failed_calls);
    printf("RESULT name=soak.jobs_lost value=%d unit=jobs ref=goal ref_value=0 submitted=%d\n",
           lost, n_jobs);
    printf("RESULT name=soak.jobs_wrong value=%d unit=jobs ref=goal ref_value=0\n", wrong);
    printf("RESULT name=soak.attacks value=%.0f unit=s unauth_connections=%ld garbage_links=%ld "
           "nonsense_frames=%ld pipelined_requests=%ld rounds=%d\n",
           secs, sent_unauth, sent_garbage, sent_nonsense, sent_pipelined, n_samples - 1);
    printf("RESULT name=soak.tenant_breaches value=%ld unit=requests ref=goal ref_value=0 "
           "submitted=%ld accepted=%ld refused_by_limits=%ld on=%d\n",
           tenant.breaches, tenant.submitted, tenant.accepted, tenant.refused, tenant_on);
    rc = peak < RSS_GOAL && growth < 0.10 && fd_end <= fd0 + 2 && max < NODES_GOAL &&
                 failed_calls == 0 && lost == 0 && wrong == 0 && tenant.breaches == 0
             ? 0
             : 1;
out:
    if (cl)
        ch_client_destroy(cl);
    h_cluster_down(&C);
    return rc;
}
