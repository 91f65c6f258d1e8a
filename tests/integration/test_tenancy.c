/* A cluster many people share: per-user limits and fair share, privacy of jobs, admin-only
 * node commands, output that cannot be forged, reports bound to what was launched.
 *
 * Each test runs a real coordinatord with its own configuration and a fake worker (a
 * thread holding an authenticated worker link, which runs each job it is given for a set
 * time). Users other than root are uids 60001 and 60002 in the group of uid 65534: CI
 * runs as root and switches to them in forked children. They reach nothing of the build
 * tree: the coordinator's socket, state and logs live in a scratch folder under /tmp that
 * every user may traverse, and the children talk to the socket with the library linked
 * into this test. */
#include <criterion/criterion.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attack.h"
#include "common/client.h"
#include "common/err.h"
#include "common/msg.h"
#include "common/util.h"
#include "harness.h"
#include "support.h"

#define U1       60001u
#define U2       60002u
#define USER_GID 65534u

// ---------------------------------------------------------------------------------------
// A coordinatord of our own, in a folder every user can traverse.

typedef struct coord_proc {
    char dir[64], sock[96], key[96], conf[96], state[96], log[96], addr[64];
    char args[512]; /* the config's text, to start it again */
    pid_t pid;
    ch_key_t k;
} coord_proc_t;

static coord_proc_t P;

/* The fake worker: registers, heartbeats, runs each rank it is given for run_ms (0: for
 * ever), then reports it done (or failed with fail_msg) with its launch token. */
#define FAKE_RANKS  64
#define FAKE_STARTS 256

typedef struct fake_rank {
    char job[32];
    uint64_t gen, token, end_ms;
    uint32_t rank;
    int live;
} fake_rank_t;

typedef struct fake {
    char name[32];
    uint32_t slots;
    int run_ms;
    const char *fail_msg;
    ch_client_t *cl;
    pthread_t th;
    pthread_mutex_t mu;
    volatile int stop, gone;
    fake_rank_t r[FAKE_RANKS];
    char started[FAKE_STARTS][32]; /* job ids, in the order they were started here */
    char last_ini[4096];           /* the job file of the last StartRanks */
    int n_started;
} fake_t;

static fake_t F;

static void need_root(void)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to act as other users");
}

static int addr_written(void *ud)
{
    char path[160];
    (void)ud;
    snprintf(path, sizeof path, "%s/coordinatord.addr", P.state);
    return access(path, R_OK) == 0;
}

static void coord_spawn(const char *listen)
{
    char exe[PATH_MAX], path[160];
    h_bin("coordinatord", exe);
    snprintf(path, sizeof path, "%s/coordinatord.addr", P.state);
    unlink(path);
    P.pid = fork();
    cr_assert(P.pid >= 0);
    if (P.pid == 0) {
        FILE *f = freopen(P.log, "a", stdout);
        if (!f || dup2(1, 2) < 0)
            _exit(126);
        execl(exe, exe, "--config", P.conf, "--listen", listen, "--ctl-socket", P.sock,
              "--state-dir", P.state, "--key", P.key, (char *)NULL);
        _exit(127);
    }
    cr_assert(h_wait_until(addr_written, NULL, 10000, 10), "coordinatord did not start: see %s",
              P.log);
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(path, 128, &text, &len), 0);
    text[strcspn(text, "\n")] = 0;
    snprintf(P.addr, sizeof P.addr, "%s", text);
    free(text);
}

/* Write coordinatord's config (the test's lines, then extra) into a fresh scratch
 * folder; root's jobs run as root unless the extra lines say otherwise. */
static void coord_prepare(const char *extra)
{
    struct group *g = getgrgid(USER_GID);
    cr_assert_not_null(g, "no group %u", USER_GID);
    memset(&P, 0, sizeof P);
    snprintf(P.dir, sizeof P.dir, "/tmp/chorus-tenancy.XXXXXX");
    cr_assert_not_null(mkdtemp(P.dir));
    cr_assert_eq(chmod(P.dir, 0755), 0);
    snprintf(P.sock, sizeof P.sock, "%s/ctl.sock", P.dir);
    snprintf(P.key, sizeof P.key, "%s/cluster.key", P.dir);
    snprintf(P.conf, sizeof P.conf, "%s/coordinatord.conf", P.dir);
    snprintf(P.state, sizeof P.state, "%s/state", P.dir);
    snprintf(P.log, sizeof P.log, "%s/coordinatord.log", P.dir);
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(ch_key_generate(P.key), 0);
    cr_assert_eq(ch_key_load(P.key, &P.k), 0);
    cr_assert_eq(mkdir(P.state, 0700), 0);
    snprintf(P.args, sizeof P.args,
             "[coordinatord]\nctl-group = %s\nheartbeat-ms = 100\ndead-after-ms = 1000\n"
             "grace-ms = 3000\nmetrics =\n%s%s",
             g->gr_name, strstr(extra, "run-as-user") ? "" : "allow-root-jobs = yes\n", extra);
    cr_assert_eq(h_write_file(P.conf, P.args), 0);
}

/* Start coordinatord with these config lines (besides the test's own). */
static void coord_start(const char *extra)
{
    coord_prepare(extra);
    coord_spawn("127.0.0.1:0");
}

static void coord_kill(int sig)
{
    if (P.pid <= 0)
        return;
    kill(P.pid, sig);
    waitpid(P.pid, NULL, 0);
    P.pid = -1;
}

// ---------------------------------------------------------------------------------------
// The fake worker.

static void fake_event(fake_t *f, const fake_rank_t *r, int kind, int code, const char *msg)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = (char *)r->job;
    ev.generation = r->gen;
    ev.rank = r->rank;
    ev.kind = kind;
    ev.exit_code = code;
    ev.launch_token = r->token;
    if (msg)
        ev.message = (char *)msg;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    ch_client_send(f->cl, &env);
}

static void fake_start(fake_t *f, const Chorus__StartRanks *s)
{
    pthread_mutex_lock(&f->mu);
    if (f->n_started < FAKE_STARTS)
        snprintf(f->started[f->n_started++], 32, "%s", s->job_id);
    snprintf(f->last_ini, sizeof f->last_ini, "%s", s->job_ini ? s->job_ini : "");
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; i < s->n_ranks; i++) {
        for (int k = 0; k < FAKE_RANKS; k++) {
            fake_rank_t *r = &f->r[k];
            if (r->live)
                continue;
            *r = (fake_rank_t){.gen = s->generation,
                               .token = s->launch_token,
                               .rank = s->ranks[i]->rank,
                               .live = 1};
            snprintf(r->job, sizeof r->job, "%s", s->job_id);
            r->end_ms = f->run_ms ? ch_now_ms() + (uint64_t)f->run_ms : UINT64_MAX;
            fake_event(f, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, NULL);
            break;
        }
    }
}

static void fake_finish_due(fake_t *f)
{
    uint64_t now = ch_now_ms();
    for (int k = 0; k < FAKE_RANKS; k++) {
        fake_rank_t *r = &f->r[k];
        if (!r->live || now < r->end_ms)
            continue;
        if (f->fail_msg)
            fake_event(f, r, CHORUS__RANK_EVENT_KIND__RANK_FAILED, 0, f->fail_msg);
        else
            fake_event(f, r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, NULL);
        fake_event(f, r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, f->fail_msg ? 1 : 0, NULL);
        r->live = 0;
    }
}

static void *fake_loop(void *arg)
{
    fake_t *f = arg;
    uint64_t last_hb = 0;
    while (!f->stop) {
        if (ch_now_ms() - last_hb >= 50) {
            Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
            Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
            env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
            env.heartbeat = &hb;
            ch_client_send(f->cl, &env);
            last_hb = ch_now_ms();
        }
        Chorus__Envelope *in = NULL;
        int rc = ch_client_recv(f->cl, 5, &in);
        if (rc == 0 && in->body_case == CHORUS__ENVELOPE__BODY_START_RANKS)
            fake_start(f, in->start_ranks);
        if (rc == 0)
            ch_msg_free(in);
        else if (rc != -ETIMEDOUT)
            break; /* the coordinator went away */
        fake_finish_due(f);
    }
    f->gone = 1;
    return NULL;
}

/* Register a worker link named name: with refs as its running ranks. */
static ch_client_t *worker_link(const char *name, uint32_t slots, Chorus__RankRef **refs,
                                size_t n_refs)
{
    ch_client_t *cl = NULL;
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    cr_assert_eq(ch_client_connect_tcp(P.addr, &P.k, "worker", 3000, &cl), 0);
    reg.name = (char *)name;
    reg.slots = slots;
    reg.rack = "";
    reg.device = "cpu";
    reg.running = refs;
    reg.n_running = n_refs;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    cr_assert_eq(ch_client_call(cl, &env, 3000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_REGISTER_ACK);
    ch_msg_free(resp);
    return cl;
}

static void fake_up(const char *name, uint32_t slots, int run_ms, const char *fail_msg)
{
    memset(&F, 0, sizeof F);
    snprintf(F.name, sizeof F.name, "%s", name);
    F.slots = slots;
    F.run_ms = run_ms;
    F.fail_msg = fail_msg;
    pthread_mutex_init(&F.mu, NULL);
    F.cl = worker_link(name, slots, NULL, 0);
    cr_assert_eq(pthread_create(&F.th, NULL, fake_loop, &F), 0);
}

static void fake_down(void)
{
    if (!F.cl)
        return;
    F.stop = 1;
    pthread_join(F.th, NULL);
    ch_client_destroy(F.cl);
    F.cl = NULL;
}

static int fake_started(void *ud)
{
    int want = *(int *)ud;
    pthread_mutex_lock(&F.mu);
    int n = F.n_started;
    pthread_mutex_unlock(&F.mu);
    return n >= want;
}

static void teardown(void)
{
    fake_down();
    coord_kill(SIGTERM);
    if (P.dir[0] && !getenv("TENANCY_KEEP"))
        ts_rmrf(P.dir);
    h_teardown();
}

TestSuite(tenancy, .fini = teardown, .timeout = 240);

// ---------------------------------------------------------------------------------------
// Control requests, from this process (root) or from a child as another user.

static Chorus__Envelope *call(ch_client_t *cl, Chorus__Envelope *req)
{
    Chorus__Envelope *resp = NULL;
    /* An Error reply comes back as its code, the message still in resp. */
    int rc = ch_client_call(cl, req, 10000, &resp);
    if (rc < 0 && (!resp || resp->body_case != CHORUS__ENVELOPE__BODY_ERROR)) {
        ch_msg_free(resp);
        return NULL;
    }
    return resp;
}

/* Submit ini; 0 and the id, or the error code and its message. */
static int submit(ch_client_t *cl, const char *ini, char *id, size_t n, char *msg, size_t mlen)
{
    Chorus__Submit s = CHORUS__SUBMIT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    s.job_ini = (char *)ini;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &s;
    Chorus__Envelope *r = call(cl, &env);
    int rc = -EPIPE;
    if (r && r->body_case == CHORUS__ENVELOPE__BODY_SUBMIT_REPLY) {
        snprintf(id, n, "%s", r->submit_reply->job_id);
        rc = 0;
    } else if (r && r->body_case == CHORUS__ENVELOPE__BODY_ERROR) {
        snprintf(msg, mlen, "%s", r->error->message);
        rc = r->error->code;
    }
    ch_msg_free(r);
    return rc;
}

static Chorus__Envelope *job_query(ch_client_t *cl, const char *id)
{
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    q.job_id = (char *)id;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    return call(cl, &env);
}

static ch_client_t *ctl_open(void)
{
    ch_client_t *cl = NULL;
    return ch_client_connect_unix(P.sock, 3000, &cl) == 0 ? cl : NULL;
}

/* Submit ini as root (this process); the job's id into id. */
static void root_submit(const char *ini, char *id, size_t n)
{
    char msg[256] = "";
    ch_client_t *root = ctl_open();
    cr_assert_not_null(root);
    cr_assert_eq(submit(root, ini, id, n, msg, sizeof msg), 0, "%s", msg);
    ch_client_destroy(root);
}

/* Run fn(ud) in a child as uid (group USER_GID, no other groups); its exit status. */
static int as_user(uid_t uid, int (*fn)(void *), void *ud)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(USER_GID) < 0 || setuid(uid) < 0)
            _exit(120);
        _exit(fn(ud));
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "child as uid %u died (status %d)", (unsigned)uid, st);
    return WEXITSTATUS(st);
}

/* What a child submitting many jobs tells the test (in shared memory). */
#define MAX_IDS 64
typedef struct batch {
    int n;        /* to submit */
    int priority; /* [job] priority to ask for */
    const char *tag;
    int accepted, refused, other;
    char first_refusal[512];
    char ids[MAX_IDS][32]; /* the first accepted ids */
} batch_t;

static batch_t *batch_new(int n, const char *tag)
{
    batch_t *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(b != MAP_FAILED);
    memset(b, 0, sizeof *b);
    b->n = n;
    b->tag = tag;
    return b;
}

static void job_text(char *out, size_t n, const char *tag, int i, int priority)
{
    snprintf(out, n,
             "[job]\nname = %s-%d\nkind = diag\npriority = %d\n[parallel]\ndp = 1\n"
             "[diag]\nrounds = 1\ngemm_size = 8\n",
             tag, i, priority);
}

static int submit_batch(void *ud)
{
    batch_t *b = ud;
    ch_client_t *cl = ctl_open();
    if (!cl)
        return 2;
    for (int i = 0; i < b->n; i++) {
        char ini[256], id[32], msg[512] = "";
        job_text(ini, sizeof ini, b->tag, i, b->priority);
        int rc = submit(cl, ini, id, sizeof id, msg, sizeof msg);
        if (rc == 0 && b->accepted < MAX_IDS)
            snprintf(b->ids[b->accepted], 32, "%s", id);
        b->accepted += rc == 0;
        if (rc == -EDQUOT || rc == -EPERM) {
            if (b->refused++ == 0)
                snprintf(b->first_refusal, sizeof b->first_refusal, "%s", msg);
        } else if (rc != 0) {
            b->other++;
            snprintf(b->first_refusal, sizeof b->first_refusal, "%d %s", rc, msg);
        }
    }
    ch_client_destroy(cl);
    return 0;
}

static long log_count(const char *needle)
{
    FILE *f = fopen(P.log, "r");
    char line[4096];
    long n = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

// ---------------------------------------------------------------------------------------
// Limits

/* One user queues 10,000 jobs: past max-queued-jobs each is refused naming the limit,
 * the coordinator's memory stays flat and its log holds a bounded number of lines;
 * root (exempt) still submits, and an admin's priority puts its job first. */
Test(tenancy, queued_jobs_past_the_limit_are_refused_and_memory_stays_flat)
{
    need_root();
    coord_start("max-queued-jobs = 100\nmax-submits-per-minute = 0\n");
    fake_up("w1", 1, 0, NULL); /* the first job holds the only slot for ever */

    batch_t *b = batch_new(1100, "u1");
    cr_assert_eq(as_user(U1, submit_batch, b), 0);
    cr_assert_eq(b->other, 0, "unexpected answer: %s", b->first_refusal);
    cr_assert_eq(b->accepted, 101, "accepted %d (one runs, 100 queue)", b->accepted);
    cr_assert_eq(b->refused, 999);
    cr_assert(h_has(b->first_refusal, "max-queued-jobs") && h_has(b->first_refusal, "60001"), "%s",
              b->first_refusal);
    long rss1 = a_rss_kb(P.pid);

    batch_t *b2 = batch_new(8900, "u1b");
    uint64_t t0 = ch_now_ms();
    cr_assert_eq(as_user(U1, submit_batch, b2), 0);
    double secs = (double)(ch_now_ms() - t0) / 1000.0;
    long rss2 = a_rss_kb(P.pid);
    cr_assert_eq(b2->accepted, 0);
    cr_assert_eq(b2->refused, 8900);
    fprintf(stderr,
            "tenancy: 10,000 submissions, 101 accepted; 8,900 refused in %.1f s; "
            "coordinator RSS %ld -> %ld KiB\n",
            secs, rss1, rss2);
    cr_assert(rss2 - rss1 < 4096, "coordinator grew %ld KiB over 8,900 refusals", rss2 - rss1);
    long lines = log_count("submit refused");
    cr_assert(lines > 0 && lines < 200, "%ld log lines for 9,899 refusals", lines);

    /* A non-admin cannot ask for a priority. */
    batch_t *bp = batch_new(1, "u1p");
    bp->priority = 5;
    cr_assert_eq(as_user(U1, submit_batch, bp), 0);
    cr_assert_eq(bp->accepted, 0);
    cr_assert(h_has(bp->first_refusal, "job.priority"), "%s", bp->first_refusal);

    /* Root is exempt and may set one: its job is next in line. */
    ch_client_t *root = ctl_open();
    cr_assert_not_null(root);
    char ini[256], id[32];
    job_text(ini, sizeof ini, "root", 0, 5);
    root_submit(ini, id, sizeof id);
    Chorus__Envelope *e = job_query(root, id);
    cr_assert_not_null(e);
    cr_assert_str_eq(e->job_info->state, "queued");
    cr_assert_eq(e->job_info->queue_place, 1, "root's priority job at place %u",
                 e->job_info->queue_place);
    ch_msg_free(e);
    e = job_query(root, b->ids[1]); /* u1's first queued job */
    cr_assert_not_null(e);
    cr_assert_eq(e->job_info->queue_place, 2);
    cr_assert(h_has(e->job_info->reason, "place 2") && h_has(e->job_info->reason, id), "%s",
              e->job_info->reason);
    ch_msg_free(e);
    ch_client_destroy(root);

    /* chorusctl jobs shows the place in the STATE column, and why in REASON. */
    char exe[PATH_MAX];
    h_bin("chorusctl", exe);
    char *argv[] = {exe, "--socket", P.sock, "jobs", NULL};
    h_out_t o;
    cr_assert_eq(h_run(&o, 20000, argv), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    char want[64];
    snprintf(want, sizeof want, "\n%s ", id);
    const char *row = strstr(o.out, want);
    cr_assert_not_null(row, "no row for %s", id);
    cr_assert(strncmp(strstr(row, "queued"), "queued #1", 9) == 0, "%.200s", row);
    h_out_free(&o);
}

/* Root's jobs run as the dedicated chorus-jobs user (deploy/install.sh creates it), and
 * coordinatord refuses to start when the configured run-as user does not exist. */
Test(tenancy, roots_jobs_run_as_chorus_jobs_and_a_missing_user_is_refused)
{
    need_root();
    coord_prepare("run-as-user = chorus-no-such-user\n");
    char exe[PATH_MAX];
    h_bin("coordinatord", exe);
    char *argv[] = {exe,    "--config",    P.conf,  "--listen", "127.0.0.1:0", "--ctl-socket",
                    P.sock, "--state-dir", P.state, "--key",    P.key,         NULL};
    h_out_t o;
    cr_assert_eq(h_run(&o, 10000, argv), 0);
    cr_assert_eq(o.status, 78, "coordinatord with a missing run-as-user: exit %d", o.status);
    cr_assert(h_has(o.err, "chorus-no-such-user"), "%s", o.err);
    h_out_free(&o);
    ts_rmrf(P.dir);

    struct passwd *pw = getpwnam("chorus-jobs");
    if (!pw)
        cr_skip_test("no chorus-jobs user here (deploy/install.sh creates it)");
    uid_t jobs_uid = pw->pw_uid;
    coord_start("run-as-user = chorus-jobs\n");
    fake_up("w1", 1, 0, NULL);
    char id[32], want[64];
    root_submit("[job]\nname = r\nkind = diag\n[parallel]\ndp = 1\n", id, sizeof id);
    int one = 1;
    cr_assert(h_wait_until(fake_started, &one, 5000, 10));
    snprintf(want, sizeof want, "run_uid = %u\n", (unsigned)jobs_uid);
    pthread_mutex_lock(&F.mu);
    int ok = strstr(F.last_ini, want) != NULL && strstr(F.last_ini, "owner_uid = 0\n") != NULL;
    pthread_mutex_unlock(&F.mu);
    cr_assert(ok, "root's job does not run as chorus-jobs (uid %u):\n%s", (unsigned)jobs_uid,
              F.last_ini);
}

/* max-submits-per-minute: the next submission is refused naming the limit. */
Test(tenancy, submissions_per_minute_are_capped)
{
    need_root();
    coord_start("max-submits-per-minute = 3\n");
    fake_up("w1", 4, 100, NULL);
    batch_t *b = batch_new(5, "u2");
    cr_assert_eq(as_user(U2, submit_batch, b), 0);
    cr_assert_eq(b->accepted, 3, "accepted %d: %s", b->accepted, b->first_refusal);
    cr_assert_eq(b->refused, 2, "refused %d, other %d: %s", b->refused, b->other, b->first_refusal);
    cr_assert(h_has(b->first_refusal, "max-submits-per-minute"), "%s", b->first_refusal);
}

/* group-max-queued-jobs: the users of one primary group together; the refusal names it. */
Test(tenancy, queued_jobs_per_group_are_capped)
{
    need_root();
    coord_start("group-max-queued-jobs = 3\nmax-submits-per-minute = 0\n");
    fake_up("w1", 1, 0, NULL); /* the first job holds the only slot */
    batch_t *a = batch_new(3, "u1"), *b = batch_new(2, "u2");
    cr_assert_eq(as_user(U1, submit_batch, a), 0);
    cr_assert_eq(a->accepted, 3, "%s", a->first_refusal); /* one runs, two queue */
    cr_assert_eq(as_user(U2, submit_batch, b), 0);
    cr_assert_eq(b->accepted, 1, "%s", b->first_refusal);
    cr_assert_eq(b->refused, 1);
    cr_assert(h_has(b->first_refusal, "group-max-queued-jobs"), "%s", b->first_refusal);
}

/* Two users with a backlog on a 2-slot cluster, the first having queued all its jobs
 * before the second: over the first 20 starts (10 job lengths) each user gets its fair
 * share, 10 +- 3 (strict FIFO would give the second user none). */
Test(tenancy, two_users_with_a_backlog_share_the_cluster)
{
    enum { JOBS = 20, WINDOW = 20 };
    need_root();
    coord_start("max-queued-jobs = 100\nmax-submits-per-minute = 0\n");
    fake_up("w1", 2, 300, NULL);
    batch_t *a = batch_new(JOBS, "u1"), *b = batch_new(JOBS, "u2");
    cr_assert_eq(as_user(U1, submit_batch, a), 0);
    cr_assert_eq(as_user(U2, submit_batch, b), 0);
    cr_assert_eq(a->accepted + b->accepted, 2 * JOBS);
    int want = WINDOW;
    cr_assert(h_wait_until(fake_started, &want, 30000, 20), "only %d jobs started", F.n_started);
    int of_b = 0;
    pthread_mutex_lock(&F.mu);
    for (int i = 0; i < WINDOW; i++)
        for (int k = 0; k < JOBS; k++)
            of_b += strcmp(F.started[i], b->ids[k]) == 0;
    pthread_mutex_unlock(&F.mu);
    fprintf(stderr, "tenancy: of the first %d starts, user 1 got %d, user 2 got %d\n", WINDOW,
            WINDOW - of_b, of_b);
    cr_assert(of_b >= 7 && of_b <= 13, "user 2 got %d of %d starts", of_b, WINDOW);
}

// ---------------------------------------------------------------------------------------
// Privacy and admin commands

typedef struct peek {
    char job[32];
    int saw_text, saw_reason, cancel_code, forget_code;
    char forget_msg[256];
} peek_t;

static int peek_other(void *ud)
{
    peek_t *p = ud;
    ch_client_t *cl = ctl_open();
    if (!cl)
        return 2;
    Chorus__Envelope *e = job_query(cl, p->job);
    if (!e || e->body_case != CHORUS__ENVELOPE__BODY_JOB_INFO)
        return 3;
    p->saw_text = e->job_info->job_ini && e->job_info->job_ini[0];
    p->saw_reason = e->job_info->reason && strstr(e->job_info->reason, "max-running") != NULL;
    ch_msg_free(e);

    Chorus__Cancel c = CHORUS__CANCEL__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    c.job_id = p->job;
    env.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    e = call(cl, &env);
    p->cancel_code = e && e->body_case == CHORUS__ENVELOPE__BODY_ERROR ? e->error->code : 0;
    ch_msg_free(e);

    Chorus__ForgetNode fn = CHORUS__FORGET_NODE__INIT;
    Chorus__Envelope env2 = CHORUS__ENVELOPE__INIT;
    fn.name = "w1";
    env2.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    env2.forget_node = &fn;
    e = call(cl, &env2);
    if (e && e->body_case == CHORUS__ENVELOPE__BODY_ERROR) {
        p->forget_code = e->error->code;
        snprintf(p->forget_msg, sizeof p->forget_msg, "%s", e->error->message);
    }
    ch_msg_free(e);
    ch_client_destroy(cl);
    return 0;
}

/* Another user sees a job's row, not its text or its reasons, cannot cancel it, and
 * node forget is for admins; the job's owner sees it all. */
Test(tenancy, another_users_job_text_and_admin_commands_are_refused)
{
    need_root();
    coord_start("max-running-ranks = 1\n");
    fake_up("w1", 4, 0, NULL);
    batch_t *a = batch_new(2, "u1");
    cr_assert_eq(as_user(U1, submit_batch, a), 0);
    cr_assert_eq(a->accepted, 2);

    /* u1's second job waits at its running-ranks limit: the reason says so, to u1. */
    peek_t *mine =
        mmap(NULL, sizeof *mine, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(mine != MAP_FAILED);
    memset(mine, 0, sizeof *mine);
    snprintf(mine->job, sizeof mine->job, "%s", a->ids[1]);
    peek_t *other =
        mmap(NULL, sizeof *other, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(other != MAP_FAILED);
    memcpy(other, mine, sizeof *other);

    cr_assert_eq(as_user(U2, peek_other, other), 0);
    cr_assert_not(other->saw_text, "uid 60002 read the job text of uid 60001's job");
    cr_assert_not(other->saw_reason, "uid 60002 read the reason of uid 60001's job");
    cr_assert_eq(other->cancel_code, -EACCES, "cancel by another user: %d", other->cancel_code);
    cr_assert_eq(other->forget_code, -EACCES, "forget by a user: %d %s", other->forget_code,
                 other->forget_msg);
    cr_assert(h_has(other->forget_msg, "admin-group"), "%s", other->forget_msg);

    cr_assert_eq(as_user(U1, peek_other, mine), 0);
    cr_assert(mine->saw_text, "the owner cannot read its own job's text");
    cr_assert(mine->saw_reason, "the owner does not see why its job waits");
    cr_assert_eq(mine->cancel_code, 0, "the owner cannot cancel its job");
    cr_assert_eq(mine->forget_code, -EACCES);

    /* Root may: the node has a link, so the refusal is about the node, not root. */
    ch_client_t *root = ctl_open();
    Chorus__ForgetNode fn = CHORUS__FORGET_NODE__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    fn.name = "w1";
    env.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    env.forget_node = &fn;
    Chorus__Envelope *e = call(root, &env);
    cr_assert_not_null(e);
    cr_assert(e->body_case != CHORUS__ENVELOPE__BODY_ERROR || e->error->code != -EACCES,
              "root was refused: %s", e->error->message);
    ch_msg_free(e);
    ch_client_destroy(root);

    /* Root is exempt from max-running-ranks: both its jobs start (u1's one, then these). */
    char id[32];
    root_submit("[job]\nname = r1\nkind = diag\n[parallel]\ndp = 1\n", id, sizeof id);
    root_submit("[job]\nname = r2\nkind = diag\n[parallel]\ndp = 1\n", id, sizeof id);
    int three = 3;
    cr_assert(h_wait_until(fake_started, &three, 5000, 10), "root's jobs were held: %d started",
              F.n_started);
}

// ---------------------------------------------------------------------------------------
// Output that cannot be forged

/* A rank's failure message full of terminal controls: chorusctl jobs and status print
 * it escaped, and the coordinator's log holds no control byte. */
Test(tenancy, terminal_escapes_are_shown_escaped)
{
    static const char evil[] = "\x1b[2J\x1b[1;1Hj9  completed  (a fake row)\x07\xc2\x9b"
                               "31m";
    need_root();
    coord_start("");
    fake_up("w1", 1, 50, evil);
    char id[32];
    root_submit("[job]\nname = esc\nkind = diag\n[parallel]\ndp = 1\n[fault]\nmax_restarts = 0\n",
                id, sizeof id);
    ch_client_t *root = ctl_open();
    uint64_t end = ch_now_ms() + 10000;
    int failed = 0;
    while (!failed && ch_now_ms() < end) {
        Chorus__Envelope *e = job_query(root, id);
        failed = e && strcmp(e->job_info->state, "failed") == 0;
        ch_msg_free(e);
        if (!failed)
            usleep(20000);
    }
    cr_assert(failed, "job %s did not fail", id);
    ch_client_destroy(root);

    char exe[PATH_MAX];
    h_bin("chorusctl", exe);
    const char *cmds[][2] = {{"jobs", NULL}, {"status", id}};
    for (size_t i = 0; i < 2; i++) {
        char *argv[] = {exe, "--socket", P.sock, (char *)cmds[i][0], (char *)cmds[i][1], NULL};
        h_out_t o;
        cr_assert_eq(h_run(&o, 10000, argv), 0);
        cr_assert_eq(o.status, 0, "%s: %s", cmds[i][0], o.err);
        cr_assert_null(strchr(o.out, '\x1b'), "%s printed a raw ESC:\n%s", cmds[i][0], o.out);
        cr_assert_null(strchr(o.out, '\x07'), "%s printed a raw BEL", cmds[i][0]);
        cr_assert_null(strstr(o.out, "\xc2\x9b"), "%s printed a raw CSI", cmds[i][0]);
        cr_assert(strstr(o.out, "\\x1b[2J") != NULL, "%s: no escaped ESC in:\n%s", cmds[i][0],
                  o.out);
        h_out_free(&o);
    }
    char *log = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(P.log, 64u << 20, &log, &len), 0);
    cr_assert_null(memchr(log, '\x1b', len), "raw ESC in the coordinator's log");
    cr_assert(strstr(log, "\\x1b[2J") != NULL, "the failure is not in the log");
    free(log);
}

/* Right after a coordinator restart, before the real worker is back, a key holder
 * registers under its name, claims its rank and reports it checkpointed, far along and
 * done: none of it counts without the rank's launch token. */
Test(tenancy, a_name_taken_after_a_restart_cannot_report_for_its_ranks)
{
    need_root();
    coord_start("");
    fake_up("node1", 1, 0, NULL);
    char id[32];
    root_submit("[job]\nname = long\nkind = diag\n[parallel]\ndp = 1\n[diag]\nrounds = 100000000\n",
                id, sizeof id);
    int one = 1;
    cr_assert(h_wait_until(fake_started, &one, 5000, 10));

    /* The coordinator dies; the real worker is away (its thread stops with the link). */
    char listen[64];
    snprintf(listen, sizeof listen, "%s", P.addr);
    coord_kill(SIGKILL);
    fake_down();
    coord_spawn(listen);

    Chorus__RankRef ref = CHORUS__RANK_REF__INIT, *refs[1] = {&ref};
    ref.job_id = id;
    ref.generation = 1;
    ref.rank = 0;
    ref.pid = 4242;
    ref.launch_token = 0x5eed; /* a guess */
    ch_client_t *thief = worker_link("node1", 1, refs, 1);
    fake_rank_t r = {.gen = 1, .token = 0x5eed, .rank = 0};
    snprintf(r.job, sizeof r.job, "%s", id);
    fake_t as = {.cl = thief};
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = id;
    ev.generation = 1;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT;
    ev.step = 7;
    ev.launch_token = r.token;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(thief, &env), 0);
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = ev.total_steps = 100000000;
    cr_assert_eq(ch_client_send(thief, &env), 0);
    fake_event(&as, &r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, NULL);
    fake_event(&as, &r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, NULL);

    /* The reports were read (the log says what became of them, or the job ended on
     * them) and counted for nothing. */
    const char *needle = "without the launch token";
    uint64_t end = ch_now_ms() + 5000;
    while (log_count(needle) < 2 && log_count("completed") < 1 && ch_now_ms() < end)
        usleep(20000);
    ch_client_t *root = ctl_open();
    Chorus__Envelope *e = job_query(root, id);
    cr_assert_not_null(e);
    fprintf(stderr, "tenancy: after the takeover: %s step %llu checkpoint %lld\n",
            e->job_info->state, (unsigned long long)e->job_info->step,
            (long long)e->job_info->last_checkpoint_step);
    cr_assert_str_neq(e->job_info->state, "completed", "the thief completed the job");
    cr_assert_neq(e->job_info->step, 100000000);
    cr_assert_neq(e->job_info->last_checkpoint_step, 7, "the thief's checkpoint counted");
    ch_msg_free(e);
    cr_assert(log_count(needle) >= 2, "no log line about the refused reports");
    ch_client_destroy(root);
    ch_client_destroy(thief);
}
