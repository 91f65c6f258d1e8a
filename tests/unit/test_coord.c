/* coordinatord end to end, in process: the daemon's loop runs in a thread; fake workers
 * (blocking clients on TCP with the cluster key) and chorusctl (the Unix control socket)
 * drive it through the real protocol. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <grp.h>

#include "common/client.h"
#include "common/err.h"
#include "common/msg.h"
#include "common/plan.h"
#include "common/util.h"
#include "coord.h"
#include "support.h"

// ---------------------------------------------------------------------------------------
// Harness: one coordinator per test, in its own thread.

typedef struct harness {
    char dir[200], sock[240], addr[80], maddr[80];
    coord_cfg_t cfg;
    ch_key_t key;
    pthread_t th;
    sem_t ready;
    uv_loop_t loop;
    uv_async_t stop;
    coord_t c;
    int rc;
} harness_t;

static harness_t H;

static void on_stop(uv_async_t *a)
{
    harness_t *h = a->data;
    uv_close((uv_handle_t *)a, NULL);
    coord_stop(&h->c);
}

static void *coord_thread(void *arg)
{
    harness_t *h = arg;
    uv_loop_init(&h->loop);
    h->rc = coord_init(&h->c, &h->loop, &h->cfg, &h->key);
    if (h->rc == 0) {
        h->rc = coord_start(&h->c);
        uv_async_init(&h->loop, &h->stop, on_stop);
        h->stop.data = h;
    }
    sem_post(&h->ready);
    if (h->rc == 0)
        uv_run(&h->loop, UV_RUN_DEFAULT);
    coord_fini(&h->c);
    uv_loop_close(&h->loop);
    return NULL;
}

static void read_addr(const char *file, char *out, size_t cap)
{
    char path[600], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/%s", H.dir, file);
    cr_assert_eq(ch_file_read(path, 128, &text, &len), 0, "%s", path);
    cr_assert(len > 1 && text[len - 1] == '\n', "address file ends with a newline");
    text[len - 1] = 0;
    snprintf(out, cap, "%s", text);
    free(text);
}

static void coord_up(void)
{
    sem_init(&H.ready, 0, 0);
    cr_assert_eq(pthread_create(&H.th, NULL, coord_thread, &H), 0);
    sem_wait(&H.ready);
    cr_assert_eq(H.rc, 0, "coordinator start: %s", ch_strerror(H.rc));
    read_addr("coordinatord.addr", H.addr, sizeof(H.addr));
    read_addr("coordinatord.metrics.addr", H.maddr, sizeof(H.maddr));
}

static void coord_down(void)
{
    uv_async_send(&H.stop);
    pthread_join(H.th, NULL);
    sem_destroy(&H.ready);
}

static void setup(void)
{
    memset(&H, 0, sizeof(H));
    cr_assert_eq(ts_tmpdir("test_coord", H.dir, sizeof(H.dir)), 0);
    snprintf(H.sock, sizeof(H.sock), "%s/ctl.sock", H.dir);
    cr_assert_eq(ch_auth_global_init(), 0);
    ch_auth_nonce(H.key.bytes); /* 32 random bytes */
    snprintf(H.cfg.listen, sizeof(H.cfg.listen), "127.0.0.1:0");
    snprintf(H.cfg.ctl_socket, sizeof(H.cfg.ctl_socket), "%s", H.sock);
    snprintf(H.cfg.state_dir, sizeof(H.cfg.state_dir), "%s", H.dir);
    snprintf(H.cfg.metrics, sizeof(H.cfg.metrics), "127.0.0.1:0");
    H.cfg.heartbeat_ms = 50;
    H.cfg.dead_after_ms = 1000;
    H.cfg.grace_ms = 400;
    snprintf(H.cfg.run_as_user, sizeof(H.cfg.run_as_user), "nobody"); /* coordinatord's default */
    signal(SIGPIPE, SIG_IGN);
}

static void teardown(void)
{
    cr_assert_eq(ts_rmrf(H.dir), 0);
}

TestSuite(coord, .init = setup, .fini = teardown, .timeout = 60);

/* The scratch folder (socket, state) starts again where uid 65534, whom the identity tests
 * act as, can reach it; a clone in a 0700 home is not such a place. Skips when none is. */
static void scratch_reachable_by_nobody(void)
{
    if (ts_tmp_reachable_by(65534, 65534) < 0)
        cr_skip_test("uid 65534 can reach neither $CHORUS_TEST_TMP nor /tmp");
    teardown();
    setup();
}

// ---------------------------------------------------------------------------------------
// Fake workers: blocking clients that heartbeat while the test waits.

#define INBOX 64

typedef struct worker {
    ch_client_t *cl;
    char name[16];
    uint64_t last_hb;
    int silent; /* stop heartbeating */
    Chorus__Envelope *inbox[INBOX];
    int n;
} worker_t;

static void wk_register(worker_t *w, const char *name, uint32_t slots, const char *rack,
                        Chorus__RankRef **running, size_t n_running, Chorus__RankRef **finished,
                        size_t n_finished, uint64_t memory, const char *device)
{
    memset(w, 0, sizeof(*w));
    snprintf(w->name, sizeof(w->name), "%s", name);
    cr_assert_eq(ch_client_connect_tcp(H.addr, &H.key, "worker", 2000, &w->cl), 0);
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    reg.name = (char *)name;
    reg.slots = slots;
    reg.rack = (char *)rack;
    reg.device = (char *)device;
    reg.running = running;
    reg.n_running = n_running;
    reg.finished = finished;
    reg.n_finished = n_finished;
    reg.memory_bytes = memory;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    cr_assert_eq(ch_client_call(w->cl, &env, 2000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_REGISTER_ACK);
    cr_assert_eq(resp->register_ack->heartbeat_ms, 50);
    ch_msg_free(resp);
    w->last_hb = ch_now_ms();
}

static void wk_connect(worker_t *w, const char *name, uint32_t slots, const char *rack,
                       Chorus__RankRef **running, size_t n_running)
{
    wk_register(w, name, slots, rack, running, n_running, NULL, 0, 0, "cpu");
}

/* A worker that reports its memory. */
static void wk_connect_memory(worker_t *w, const char *name, uint32_t slots, uint64_t memory)
{
    wk_register(w, name, slots, "", NULL, 0, NULL, 0, memory, "cpu");
}

/* A worker with GPUs (workerd --device cuda). */
static void wk_connect_gpu(worker_t *w, const char *name, uint32_t slots)
{
    wk_register(w, name, slots, "", NULL, 0, NULL, 0, 0, "cuda");
}

/* A worker whose ranks exited while it could not tell the coordinator. */
static void wk_connect_finished(worker_t *w, const char *name, uint32_t slots,
                                Chorus__RankRef **finished, size_t n_finished)
{
    wk_register(w, name, slots, "", NULL, 0, finished, n_finished, 0, "cpu");
}

static void wk_close(worker_t *w)
{
    for (int i = 0; i < w->n; i++)
        ch_msg_free(w->inbox[i]);
    w->n = 0;
    if (w->cl)
        ch_client_destroy(w->cl);
    w->cl = NULL;
}

/* Receive into inboxes and heartbeat, for ms milliseconds. */
static void pump(worker_t **ws, int n, int ms)
{
    uint64_t end = ch_now_ms() + (uint64_t)ms;
    do {
        for (int i = 0; i < n; i++) {
            worker_t *w = ws[i];
            if (!w->cl)
                continue;
            if (!w->silent && ch_now_ms() - w->last_hb >= 25) {
                Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
                Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
                hb.time_ms = ch_now_ms();
                env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
                env.heartbeat = &hb;
                ch_client_send(w->cl, &env);
                w->last_hb = ch_now_ms();
            }
            Chorus__Envelope *in = NULL;
            while (w->n < INBOX && ch_client_recv(w->cl, 2, &in) == 0)
                w->inbox[w->n++] = in;
        }
    } while (ch_now_ms() < end);
}

/* First message of that body in w's inbox (caller frees), pumping up to ms. */
static Chorus__Envelope *take(worker_t **ws, int n, worker_t *w, int body, int ms)
{
    uint64_t end = ch_now_ms() + (uint64_t)ms;
    for (;;) {
        for (int i = 0; i < w->n; i++) {
            if ((int)w->inbox[i]->body_case == body) {
                Chorus__Envelope *e = w->inbox[i];
                memmove(&w->inbox[i], &w->inbox[i + 1], (size_t)(w->n - i - 1) * sizeof(e));
                w->n--;
                return e;
            }
        }
        if (ch_now_ms() >= end)
            return NULL;
        pump(ws, n, 10);
    }
}

static void wk_event(worker_t *w, const char *job, uint64_t gen, uint32_t rank, int kind, int code,
                     int sig)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = (char *)job;
    ev.generation = gen;
    ev.rank = rank;
    ev.kind = kind;
    ev.exit_code = code;
    ev.signal = sig;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

// ---------------------------------------------------------------------------------------
// Control client

/* An event that carries a step (progress, checkpoint). */
static void wk_step(worker_t *w, const char *job, uint64_t gen, uint32_t rank, int kind,
                    uint64_t step)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = (char *)job;
    ev.generation = gen;
    ev.rank = rank;
    ev.kind = kind;
    ev.step = step;
    ev.total_steps = 100;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

static ch_client_t *ctl_open(void)
{
    ch_client_t *c = NULL;
    cr_assert_eq(ch_client_connect_unix(H.sock, 2000, &c), 0);
    return c;
}

static int ctl_submit(ch_client_t *ctl, const char *ini, char *id, size_t idlen, char *msg,
                      size_t msglen)
{
    Chorus__Submit s = CHORUS__SUBMIT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    s.job_ini = (char *)ini;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &s;
    int rc = ch_client_call(ctl, &env, 2000, &resp);
    if (rc == 0)
        snprintf(id, idlen, "%s", resp->submit_reply->job_id);
    else if (resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR)
        snprintf(msg, msglen, "%s", resp->error->message);
    if (resp)
        ch_msg_free(resp);
    return rc;
}

/* JobInfo of job (caller frees the envelope). */
/* The node registry, as `chorusctl nodes` asks for it (caller frees). */
static Chorus__Envelope *ctl_nodes(ch_client_t *ctl)
{
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_NODE_LIST);
    return resp;
}

static Chorus__Envelope *ctl_job(ch_client_t *ctl, const char *job)
{
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    q.job_id = (char *)job;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    cr_assert_eq(ch_client_call(ctl, &env, 2000, &resp), 0, "query %s", job);
    return resp;
}

/* Pump the workers until job reaches state (or ms pass); returns the last JobInfo. */
static Chorus__Envelope *wait_state(ch_client_t *ctl, worker_t **ws, int n, const char *job,
                                    const char *state, int ms)
{
    uint64_t end = ch_now_ms() + (uint64_t)ms;
    for (;;) {
        Chorus__Envelope *e = ctl_job(ctl, job);
        if (strcmp(e->job_info->state, state) == 0 || ch_now_ms() >= end)
            return e;
        ch_msg_free(e);
        pump(ws, n, 20);
    }
}

/* No restarts: the failure path ends the job at once. */
static const char *JOB_2x1x2 = "[job]\nname = t1\nkind = diag\n[parallel]\ntp = 2\npp = 1\ndp = 2\n"
                               "[fault]\nmax_restarts = 0\n";

/* Submit a 4-rank job file like JOB_2x1x2 on n1+n2 and bring every rank to started. */
static void start_4_ranks_of(ch_client_t *ctl, worker_t **ws, char *id, const char *ini)
{
    char msg[256] = "";
    cr_assert_eq(ctl_submit(ctl, ini, id, 32, msg, sizeof(msg)), 0, "%s", msg);
    for (int i = 0; i < 2; i++) {
        Chorus__Envelope *e = take(ws, 2, ws[i], CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
        cr_assert_not_null(e, "%s got StartRanks", ws[i]->name);
        Chorus__StartRanks *sr = e->start_ranks;
        cr_assert_str_eq(sr->job_id, id);
        cr_assert_eq(sr->generation, 1);
        cr_assert_eq(sr->world_size, 4);
        cr_assert_eq(sr->n_ranks, 2);
        cr_assert_eq(sr->local_world_size, 2);
        cr_assert(strstr(sr->job_ini, "tp = 2") != NULL, "%s", sr->job_ini);
        /* A TP group (ranks 2g, 2g+1) lands on one node with local ranks 0 and 1. */
        cr_assert_eq(sr->ranks[0]->rank / 2, sr->ranks[1]->rank / 2);
        cr_assert_eq(sr->ranks[0]->local_rank, 0);
        cr_assert_eq(sr->ranks[1]->local_rank, 1);
        for (size_t k = 0; k < sr->n_ranks; k++)
            wk_event(ws[i], id, 1, sr->ranks[k]->rank, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        ch_msg_free(e);
    }
}

/* Submit the 4-rank job on n1+n2 and bring every rank to started. */
static void start_4_ranks(ch_client_t *ctl, worker_t **ws, char *id)
{
    start_4_ranks_of(ctl, ws, id, JOB_2x1x2);
}

/* Which worker runs rank r of a JobInfo. */
static worker_t *owner(Chorus__JobInfo *ji, uint32_t r, worker_t **ws, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ji->ranks[r]->node, ws[i]->name) == 0)
            return ws[i];
    cr_assert_fail("rank %u on unknown node %s", r, ji->ranks[r]->node);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Tests

/* GET path from the coordinator's HTTP endpoint: the whole reply into page. */
static void http_get(const char *path, char *page, size_t len)
{
    char host[64], get[256];
    int port = 0;
    cr_assert_eq(ch_parse_hostport(H.maddr, host, sizeof(host), &port), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    snprintf(get, sizeof get, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    cr_assert_eq(write(fd, get, strlen(get)), (ssize_t)strlen(get));
    size_t got = 0;
    ssize_t k;
    while (got < len - 1 && (k = read(fd, page + got, len - 1 - got)) > 0)
        got += (size_t)k;
    page[got] = 0;
    close(fd);
}

Test(coord, job_runs_to_completion)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    cr_assert_str_eq(id, "j1");

    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    Chorus__JobInfo *ji = e->job_info;
    cr_assert_str_eq(ji->state, "running");
    cr_assert_eq(ji->world_size, 4);
    cr_assert_eq(ji->n_ranks, 4);
    worker_t *own[4];
    for (uint32_t r = 0; r < 4; r++)
        own[r] = owner(ji, r, ws, 2);
    ch_msg_free(e);

    /* Progress: rank 0 reports the job's figures. */
    Chorus__Metric m = CHORUS__METRIC__INIT, *mp = &m;
    m.name = "gflops";
    m.value = 12.5;
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = id;
    ev.generation = 1;
    ev.rank = 0;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = 3;
    ev.total_steps = 10;
    ev.loss = 1.5;
    ev.tokens_per_s = 1000;
    ev.n_metrics = 1;
    ev.metrics = &mp;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(own[0]->cl, &env), 0);
    pump(ws, 2, 100);
    e = ctl_job(ctl, "t1"); /* by name */
    ji = e->job_info;
    cr_assert_str_eq(ji->id, "j1");
    cr_assert_eq(ji->step, 3);
    cr_assert_eq(ji->total_steps, 10);
    cr_assert_float_eq(ji->loss, 1.5, 1e-9);
    cr_assert_float_eq(ji->tokens_per_s, 1000, 1e-9);
    cr_assert_eq(ji->ranks[0]->n_metrics, 1);
    cr_assert_str_eq(ji->ranks[0]->metrics[0]->name, "gflops");
    cr_assert_float_eq(ji->ranks[0]->metrics[0]->value, 12.5, 1e-9);
    ch_msg_free(e);

    /* Metrics endpoint. */
    static char page[65536];
    http_get("/metrics", page, sizeof page);
    cr_assert(strstr(page, "HTTP/1.0 200 OK") != NULL, "%s", page);
    cr_assert(strstr(page, "chorus_nodes{state=\"alive\"} 2\n") != NULL, "%s", page);
    cr_assert(strstr(page, "chorus_jobs{state=\"running\"} 1\n") != NULL, "%s", page);
    cr_assert(strstr(page, "chorus_job_step{job_id=\"j1\",name=\"t1\"} 3\n") != NULL, "%s", page);
    cr_assert(strstr(page, "chorus_job_loss{job_id=\"j1\",name=\"t1\"} 1.5\n") != NULL, "%s", page);
    cr_assert(strstr(page, "chorus_heartbeats_total ") != NULL, "%s", page);

    /* Every rank done, then exited cleanly: completed, slots free again. */
    for (uint32_t r = 0; r < 4; r++) {
        wk_event(own[r], id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, 0);
        wk_event(own[r], id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 0);
    }
    e = wait_state(ctl, ws, 2, id, "completed", 2000);
    cr_assert_str_eq(e->job_info->state, "completed");
    cr_assert_neq(e->job_info->finished_ms, 0);
    ch_msg_free(e);

    Chorus__Envelope *resp = ctl_nodes(ctl);
    cr_assert_eq(resp->node_list->n_nodes, 2);
    for (size_t i = 0; i < 2; i++) {
        cr_assert_str_eq(resp->node_list->nodes[i]->state, "alive");
        cr_assert_eq(resp->node_list->nodes[i]->free_slots, 2);
        cr_assert_str_eq(resp->node_list->nodes[i]->rack, "r1");
    }
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, refusals_name_the_problem)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32] = "", msg[512] = "";
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();

    cr_assert_eq(ctl_submit(ctl, "[job]\nname = big\n[parallel]\ndp = 8\n", id, sizeof(id), msg,
                            sizeof(msg)),
                 CH_E_CAPACITY);
    cr_assert(strstr(msg, "world size 8 (tp 1 x pp 1 x dp 8) exceeds the cluster's 2 slots"), "%s",
              msg);
    /* 4 ranks would fit 2 nodes' slots, but a TP group of 4 fits no node. */
    wk_connect(&b, "n2", 2, "", NULL, 0);
    cr_assert_eq(ctl_submit(ctl, "[parallel]\ntp = 4\n", id, sizeof(id), msg, sizeof(msg)),
                 CH_E_CAPACITY);
    cr_assert(strncmp(msg, "parallel.tp: ", 13) == 0, "%s", msg);
    cr_assert_eq(
        ctl_submit(ctl, "[job]\nname = x\n[parallel]\ntp = 3\n", id, sizeof(id), msg, sizeof(msg)),
        CH_E_CONFIG);
    cr_assert(strstr(msg, "tp") != NULL, "%s", msg);
    cr_assert_eq(ctl_submit(ctl, "[nonsense]\nx = 1\n", id, sizeof(id), msg, sizeof(msg)),
                 CH_E_CONFIG);
    cr_assert(strstr(msg, "nonsense") != NULL, "%s", msg);

    Chorus__Envelope *resp = NULL;
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    q.job_id = "j99";
    req.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    req.job_query = &q;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), CH_E_NOTFOUND);
    ch_msg_free(resp);

    Chorus__KillRank kr = CHORUS__KILL_RANK__INIT;
    kr.job_id = "j1";
    req.body_case = CHORUS__ENVELOPE__BODY_KILL_RANK;
    req.kill_rank = &kr;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), CH_E_NOTFOUND);
    ch_msg_free(resp);

    /* A worker link may not use control requests; a control link may not register. */
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    cr_assert_eq(ch_client_call(a.cl, &req, 2000, &resp), -EPERM);
    ch_msg_free(resp);
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    reg.name = "sneaky";
    reg.slots = 1;
    req.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    req.register_ = &reg;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), -EPERM);
    ch_msg_free(resp);
    pump(ws, 2, 10);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* Jobs the coordinator holds in memory (ListJobs): what `jobs` lists. */
static size_t ctl_job_count(ch_client_t *ctl)
{
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0);
    size_t n = resp->job_list->n_jobs;
    ch_msg_free(resp);
    return n;
}

/* Issue 9's bad layouts: each refused at submit with the field and the reason, and
 * nothing queued (the job table stays empty). */
Test(coord, bad_layouts_are_refused_at_submit_and_nothing_is_queued)
{
    static const struct {
        const char *ini;
        int rc;
        const char *says;
    } cases[] = {
        {"[model]\nheads = 4\nembd = 64\n[parallel]\ntp = 3\n", CH_E_CONFIG,
         "parallel.tp: model.heads 4 is not divisible by tp 3"},
        {"[model]\nlayers = 2\n[parallel]\npp = 3\n", CH_E_CONFIG,
         "parallel.pp: model.layers 2 is less than pp 3"},
        {"[model]\nlayers = 4096\nheads = 16\nembd = 16384\n", CH_E_CONFIG,
         "model.layers: the model needs"},
        {"[model]\nlayers = 1\nheads = 1\nembd = 4\nseq_len = 1\nvocab = 4294967295\n"
         "[parallel]\nmicro_batch_size = 1\n",
         CH_E_CONFIG, "model.vocab: 4294967295 padded for tp 1 (to a multiple of 128)"},
        {"[parallel]\ndp = 5\n", CH_E_CAPACITY,
         "parallel: world size 5 (tp 1 x pp 1 x dp 5) exceeds the cluster's 4 slots"},
        {"[parallel]\ntp = 2\npp = 2\ndp = 2\n", CH_E_CAPACITY,
         "parallel: world size 8 (tp 2 x pp 2 x dp 2) exceeds the cluster's 4 slots"},
        {"[model]\nheads = 4\n[parallel]\ntp = 4\n", CH_E_CAPACITY,
         "parallel.tp: a tensor-parallel group of 4 ranks must sit on one node"},
    };
    worker_t a, b, *ws[2] = {&a, &b};
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r2", NULL, 0);
    ch_client_t *ctl = ctl_open();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char id[32] = "", msg[512] = "";
        int rc = ctl_submit(ctl, cases[i].ini, id, sizeof id, msg, sizeof msg);
        cr_assert_eq(rc, cases[i].rc, "case %zu: rc %d (%s)", i, rc, msg);
        cr_assert(strstr(msg, cases[i].says) != NULL, "case %zu: \"%s\" does not say \"%s\"", i,
                  msg, cases[i].says);
        cr_assert_eq(ctl_job_count(ctl), 0, "case %zu: a refused job was queued", i);
    }
    /* The same cluster takes a layout that fits: tp 2 x pp 2 on 2 nodes of 2 slots. */
    char id[32] = "", msg[512] = "";
    cr_assert_eq(ctl_submit(ctl, "[model]\nheads = 4\n[parallel]\ntp = 2\npp = 2\n", id, sizeof id,
                            msg, sizeof msg),
                 0, "%s", msg);
    cr_assert_eq(ctl_job_count(ctl), 1);
    pump(ws, 2, 10);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* A training rank reports its place at start and a time breakdown with each step; the
 * coordinator keeps the latest per rank and status carries them, with the job's measured
 * bubble (mean over ranks of pp_wait / step) and 1F1B's. */
Test(coord, status_carries_each_ranks_place_and_last_step_breakdown)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32] = "", msg[512] = "";
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r2", NULL, 0);
    ch_client_t *ctl = ctl_open();
    cr_assert_eq(ctl_submit(ctl,
                            "[job]\nname = pp\n[model]\nlayers = 3\nheads = 4\n[parallel]\n"
                            "tp = 2\npp = 2\nmicrobatches = 4\n",
                            id, sizeof id, msg, sizeof msg),
                 0, "%s", msg);
    /* Ranks 0,1 (stage 0) and 2,3 (stage 1): each TP group on one node, the stages on
     * the two racks. */
    worker_t *on[4] = {0};
    for (int i = 0; i < 2; i++) {
        Chorus__Envelope *e = take(ws, 2, ws[i], CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
        cr_assert_not_null(e, "%s got StartRanks", ws[i]->name);
        cr_assert_eq(e->start_ranks->n_ranks, 2);
        cr_assert_eq(e->start_ranks->ranks[0]->rank / 2, e->start_ranks->ranks[1]->rank / 2);
        for (size_t k = 0; k < 2; k++)
            on[e->start_ranks->ranks[k]->rank] = ws[i];
        ch_msg_free(e);
    }
    cr_assert_neq(on[0], on[2]);
    /* Rank 2 reports its place; the others do not (status derives theirs). */
    for (uint32_t r = 0; r < 4; r++) {
        Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
        Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
        ev.job_id = id;
        ev.generation = 1;
        ev.rank = r;
        ev.kind = CHORUS__RANK_EVENT_KIND__RANK_STARTED;
        if (r == 2) {
            ev.placed = 1;
            ev.coord_tp = 0;
            ev.coord_pp = 1;
            ev.first_block = 2;
            ev.blocks = 1;
            ev.shards = 1;
            ev.owned_params = 12345;
        }
        env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
        env.rank_event = &ev;
        cr_assert_eq(ch_client_send(on[r]->cl, &env), 0);
    }
    /* Two steps: only the second's breakdown is kept. Rank r waits r/10 of its step. */
    for (uint64_t step = 1; step <= 2; step++) {
        for (uint32_t r = 0; r < 4; r++) {
            Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
            Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
            ev.job_id = id;
            ev.generation = 1;
            ev.rank = r;
            ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
            ev.step = step;
            ev.total_steps = 10;
            ev.step_s = 0.5 * (double)step;
            ev.t_compute = 0.3 * (double)step;
            ev.t_pp_wait = ev.step_s * r / 10.0;
            ev.t_idle = ev.step_s - ev.t_compute - ev.t_pp_wait;
            ev.bubble = ev.t_pp_wait / ev.step_s;
            env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
            env.rank_event = &ev;
            cr_assert_eq(ch_client_send(on[r]->cl, &env), 0);
        }
    }
    Chorus__Envelope *e = NULL;
    for (int tries = 0; tries < 100; tries++) {
        pump(ws, 2, 20);
        e = ctl_job(ctl, id);
        if (e->job_info->n_ranks == 4 && e->job_info->ranks[3]->time &&
            e->job_info->ranks[3]->time->step_s == 1.0)
            break;
        ch_msg_free(e);
        e = NULL;
    }
    cr_assert_not_null(e, "the second step's breakdown never showed");
    Chorus__JobInfo *ji = e->job_info;
    cr_assert_eq(ji->microbatches, 4);
    cr_assert_float_eq(ji->bubble_theory, 1.0 / 5.0, 1e-12);
    cr_assert_float_eq(ji->bubble, (0 + 0.1 + 0.2 + 0.3) / 4, 1e-9);
    static const uint32_t first[4] = {0, 0, 2, 2}, blocks[4] = {2, 2, 1, 1};
    for (uint32_t r = 0; r < 4; r++) {
        const Chorus__RankInfo *ri = ji->ranks[r];
        cr_assert_not_null(ri->place);
        cr_assert_eq(ri->place->tp, r % 2);
        cr_assert_eq(ri->place->pp, r / 2);
        cr_assert_eq(ri->place->dp, 0);
        cr_assert_eq(ri->place->shards, 1);
        cr_assert_eq(ri->place->first_block, first[r], "rank %u", r);
        cr_assert_eq(ri->place->blocks, blocks[r], "rank %u", r);
        cr_assert_eq(ri->place->reported, r == 2);
        cr_assert(ri->place->owned_params > 0);
        cr_assert_not_null(ri->time);
        cr_assert_float_eq(ri->time->step_s, 1.0, 1e-12);
        cr_assert_float_eq(ri->time->compute, 0.6, 1e-12);
        cr_assert_float_eq(ri->time->pp_wait, r / 10.0, 1e-12);
    }
    cr_assert_eq(ji->ranks[2]->place->owned_params, 12345); /* what the rank said */
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, killed_rank_fails_the_job_and_kills_the_rest)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    cr_assert_str_eq(e->job_info->state, "running");
    worker_t *w1 = owner(e->job_info, 1, ws, 2);
    worker_t *other = w1 == &a ? &b : &a;
    ch_msg_free(e);

    /* An event of another generation is fenced off. */
    wk_event(w1, id, 7, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    pump(ws, 2, 100);
    e = ctl_job(ctl, id);
    cr_assert_str_eq(e->job_info->state, "running");
    ch_msg_free(e);

    wk_event(w1, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = wait_state(ctl, ws, 2, id, "failed", 2000);
    cr_assert_str_eq(e->job_info->state, "failed");
    char want[64];
    snprintf(want, sizeof(want), "rank 1 on node %s killed by signal 9", w1->name);
    cr_assert_str_eq(e->job_info->reason, want);
    ch_msg_free(e);
    Chorus__Envelope *k = take(ws, 2, other, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k, "the other node is told to kill its ranks");
    cr_assert_str_eq(k->kill_ranks->job_id, id);
    cr_assert_eq(k->kill_ranks->generation, 1);
    ch_msg_free(k);
    k = take(ws, 2, w1, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k, "rank 0 shares the node with rank 1 and is killed too");
    ch_msg_free(k);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, dead_node_fails_its_jobs)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    ch_msg_free(e);

    b.silent = 1; /* n2 stops heartbeating */
    uint64_t t0 = ch_now_ms();
    e = wait_state(ctl, ws, 2, id, "failed", 4000);
    uint64_t detect = ch_now_ms() - t0;
    cr_assert_str_eq(e->job_info->state, "failed");
    cr_assert(strncmp(e->job_info->reason, "node n2 dead: no heartbeat for ", 31) == 0, "%s",
              e->job_info->reason);
    cr_assert_lt(detect, 2500, "detected after %llu ms", (unsigned long long)detect);
    ch_msg_free(e);
    Chorus__Envelope *k = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k);
    ch_msg_free(k);

    Chorus__Envelope *resp = ctl_nodes(ctl);
    for (size_t i = 0; i < resp->node_list->n_nodes; i++) {
        Chorus__NodeInfo *ni = resp->node_list->nodes[i];
        cr_assert_str_eq(ni->state, strcmp(ni->name, "n2") == 0 ? "dead" : "alive");
    }
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* A node that keeps heartbeating but never confirms that its ranks exited after the kill
 * of a failed generation is declared dead at dead-after: the restart goes on without it. */
Test(coord, node_that_never_confirms_its_ranks_exit_is_declared_dead)
{
    worker_t a, b, s, *ws[3] = {&a, &b, &s};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks_of(ctl, ws, id,
                     "[job]\nname = t1\nkind = diag\n[parallel]\ntp = 2\ndp = 2\n"
                     "[fault]\nmax_restarts = 2\n");
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    worker_t *w1 = owner(e->job_info, 1, ws, 2);
    worker_t *mute = w1 == &a ? &b : &a;
    ch_msg_free(e);
    wk_connect(&s, "n3", 2, "", NULL, 0); /* a spare for the next generation */

    /* rank 1 dies; its node confirms both its ranks gone, the other node never does */
    wk_event(w1, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    wk_event(w1, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = wait_state(ctl, ws, 3, id, "starting", 4000);
    cr_assert_str_eq(e->job_info->state, "starting", "job %s: %s", e->job_info->state,
                     e->job_info->reason);
    cr_assert_eq(e->job_info->generation, 2);
    ch_msg_free(e);
    Chorus__Envelope *resp = ctl_nodes(ctl);
    for (size_t i = 0; i < resp->node_list->n_nodes; i++) {
        Chorus__NodeInfo *ni = resp->node_list->nodes[i];
        cr_assert_str_eq(ni->state, strcmp(ni->name, mute->name) == 0 ? "dead" : "alive", "%s",
                         ni->name);
    }
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    wk_close(&s);
    coord_down();
}

Test(coord, fifo_queue_and_cancel)
{
    worker_t a, *ws[1] = {&a};
    char j1[32], j2[32], j3[32], msg[256];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *two = "[job]\nname = two\nkind = diag\n[parallel]\ndp = 2\n";
    const char *one = "[job]\nname = one\nkind = diag\n";
    cr_assert_eq(ctl_submit(ctl, two, j1, 32, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_eq(ctl_submit(ctl, two, j2, 32, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_eq(ctl_submit(ctl, one, j3, 32, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_str_eq(j2, "j2");
    cr_assert_str_eq(j3, "j3");
    Chorus__Envelope *s = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(s);
    cr_assert_str_eq(s->start_ranks->job_id, "j1");
    ch_msg_free(s);
    pump(ws, 1, 100);
    /* j3 would fit nowhere either (0 free slots) and stays behind j2 (FIFO). */
    Chorus__Envelope *e = ctl_job(ctl, j2);
    cr_assert_str_eq(e->job_info->state, "queued");
    ch_msg_free(e);

    /* Cancel the queued j2 at once; then j1 ends and j3 starts. */
    Chorus__Cancel cn = CHORUS__CANCEL__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    cn.job_id = j2;
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &cn;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_OK);
    ch_msg_free(resp);
    e = ctl_job(ctl, j2);
    cr_assert_str_eq(e->job_info->state, "cancelled");
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++) {
        wk_event(&a, j1, 1, r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, 0);
        wk_event(&a, j1, 1, r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 0);
    }
    s = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(s);
    cr_assert_str_eq(s->start_ranks->job_id, "j3");
    ch_msg_free(s);

    /* Cancel the running j3: its node is told to kill it. */
    cn.job_id = j3;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0);
    ch_msg_free(resp);
    Chorus__Envelope *k = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k);
    cr_assert_str_eq(k->kill_ranks->job_id, "j3");
    ch_msg_free(k);
    e = ctl_job(ctl, j3);
    cr_assert_str_eq(e->job_info->state, "cancelled");
    ch_msg_free(e);
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), CH_E_STATE);
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

Test(coord, rendezvous_through_worker_links)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    pump(ws, 2, 50);

    /* a parks a get; b sets the key; a gets the value under its request id. */
    Chorus__KvGet g = CHORUS__KV_GET__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    g.job_id = id;
    g.generation = 1;
    g.key = "nccl-id";
    g.timeout_ms = 3000;
    req.request_id = 1000001;
    req.body_case = CHORUS__ENVELOPE__BODY_KV_GET;
    req.kv_get = &g;
    cr_assert_eq(ch_client_send(a.cl, &req), 0);
    pump(ws, 2, 50);

    Chorus__KvSet s = CHORUS__KV_SET__INIT;
    Chorus__Envelope sreq = CHORUS__ENVELOPE__INIT;
    s.job_id = id;
    s.generation = 1;
    s.key = "nccl-id";
    s.value.data = (uint8_t *)"0123";
    s.value.len = 4;
    sreq.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
    sreq.kv_set = &s;
    cr_assert_eq(ch_client_call(b.cl, &sreq, 2000, &resp), 0);
    cr_assert_eq(resp->kv_reply->code, 0);
    ch_msg_free(resp);
    Chorus__Envelope *r = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_KV_REPLY, 2000);
    cr_assert_not_null(r);
    cr_assert_eq(r->request_id, 1000001);
    cr_assert_eq(r->kv_reply->code, 0);
    cr_assert_eq(r->kv_reply->value.len, 4);
    cr_assert_eq(memcmp(r->kv_reply->value.data, "0123", 4), 0);
    ch_msg_free(r);

    /* A missing key times out. */
    g.key = "never";
    g.timeout_ms = 100;
    uint64_t t0 = ch_now_ms();
    cr_assert_eq(ch_client_call(a.cl, &req, 2000, &resp), 0);
    cr_assert_eq(resp->kv_reply->code, -ETIMEDOUT);
    cr_assert_geq(ch_now_ms() - t0, 90);
    ch_msg_free(resp);

    /* Too big; stale generation. */
    static uint8_t big[CH_RDZV_VALUE_MAX + 1];
    s.value.data = big;
    s.value.len = sizeof(big);
    cr_assert_eq(ch_client_call(b.cl, &sreq, 2000, &resp), CH_E_TOOBIG);
    ch_msg_free(resp);
    s.value.len = 1;
    s.generation = 0;
    cr_assert_eq(ch_client_call(b.cl, &sreq, 2000, &resp), CH_E_STATE);
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* Issue 11 class 4: only the nodes running a job's ranks touch its rendezvous keys. */
Test(coord, rendezvous_belongs_to_the_jobs_nodes)
{
    worker_t a, b, x, *ws[3] = {&a, &b, &x};
    char id[32];
    Chorus__Envelope *resp = NULL;
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    wk_connect(&x, "intruder", 2, "", NULL, 0); /* registered, but runs nothing of id */
    pump(ws, 3, 50);

    Chorus__KvSet s = CHORUS__KV_SET__INIT;
    Chorus__Envelope sreq = CHORUS__ENVELOPE__INIT;
    s.job_id = id;
    s.generation = 1;
    s.key = "ucx/0";
    s.value.data = (uint8_t *)"evil";
    s.value.len = 4;
    sreq.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
    sreq.kv_set = &s;
    cr_assert_eq(ch_client_call(x.cl, &sreq, 2000, &resp), -EPERM, "an outsider set a key");
    ch_msg_free(resp);
    Chorus__KvGet g = CHORUS__KV_GET__INIT;
    Chorus__Envelope greq = CHORUS__ENVELOPE__INIT;
    g.job_id = id;
    g.generation = 1;
    g.key = "ucx/0";
    g.timeout_ms = 0;
    greq.body_case = CHORUS__ENVELOPE__BODY_KV_GET;
    greq.kv_get = &g;
    cr_assert_eq(ch_client_call(x.cl, &greq, 2000, &resp), -EPERM, "an outsider read a key");
    ch_msg_free(resp);
    /* The job's own nodes still can. */
    s.value.data = (uint8_t *)"good";
    cr_assert_eq(ch_client_call(a.cl, &sreq, 2000, &resp), 0);
    ch_msg_free(resp);
    cr_assert_eq(ch_client_call(b.cl, &greq, 2000, &resp), 0);
    cr_assert_eq(resp->kv_reply->code, 0);
    cr_assert_eq(memcmp(resp->kv_reply->value.data, "good", 4), 0);
    ch_msg_free(resp);
    /* Keys are capped per generation (16 per rank + 64). */
    char key[32];
    int rc = 0, i = 0;
    for (; i < 200 && rc == 0; i++) {
        snprintf(key, sizeof key, "k/%d", i);
        s.key = key;
        rc = ch_client_call(a.cl, &sreq, 2000, &resp);
        ch_msg_free(resp);
        resp = NULL;
    }
    cr_assert_eq(rc, -ENOSPC, "200 keys for 4 ranks: %s", ch_strerror(rc));
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    wk_close(&x);
    coord_down();
}

/* One control call whose reply only matters for its status: 0 or the error code. */
static int ctl_status(ch_client_t *ctl, Chorus__Envelope *req)
{
    Chorus__Envelope *resp = NULL;
    int rc = ch_client_call(ctl, req, 2000, &resp);
    ch_msg_free(resp);
    return rc;
}

static int ctl_forget(ch_client_t *ctl, const char *name)
{
    Chorus__ForgetNode f = CHORUS__FORGET_NODE__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    f.name = (char *)name;
    req.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    req.forget_node = &f;
    return ctl_status(ctl, &req);
}

static size_t ctl_node_count(ch_client_t *ctl, const char *name, int *found)
{
    Chorus__Envelope *resp = ctl_nodes(ctl);
    size_t n = resp->node_list->n_nodes;
    *found = 0;
    for (size_t i = 0; i < n; i++)
        *found |= strcmp(resp->node_list->nodes[i]->name, name) == 0;
    ch_msg_free(resp);
    return n;
}

/* Issue 11 class 9: dead nodes expire after forget_dead_after_ms (3,000 fake names used
 * to stay listed for good), and `node forget` drops a gone node at once. */
Test(coord, dead_nodes_are_forgotten)
{
    worker_t a, fake, *ws[1] = {&a};
    int found = 0;
    H.cfg.forget_dead_after_ms = 200;
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&fake, "fake", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    cr_assert_eq(ctl_forget(ctl, "n1"), CH_E_STATE, "a connected node was forgotten");
    cr_assert_eq(ctl_forget(ctl, "nope"), CH_E_NOTFOUND);
    wk_close(&fake);
    /* dead after 1 s without heartbeats, forgotten 200 ms later */
    for (int i = 0; i < 60 && ctl_node_count(ctl, "fake", &found) && found; i++)
        pump(ws, 1, 50);
    cr_assert_not(found, "the dead node is still listed");
    cr_assert_eq(ctl_node_count(ctl, "n1", &found), 1);
    cr_assert(found, "the live node was forgotten");
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

Test(coord, node_forget_drops_a_gone_node)
{
    worker_t a, gone, *ws[1] = {&a};
    int found = 0;
    H.cfg.forget_dead_after_ms = 0; /* never on its own */
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&gone, "gone", 2, "", NULL, 0);
    wk_close(&gone);
    ch_client_t *ctl = ctl_open();
    pump(ws, 1, 1500);
    cr_assert_eq(ctl_node_count(ctl, "gone", &found), 2);
    cr_assert(found, "expired although forget-dead-after-ms is 0");
    cr_assert_eq(ctl_forget(ctl, "gone"), 0);
    cr_assert_eq(ctl_node_count(ctl, "gone", &found), 1);
    cr_assert_not(found);
    /* The name is free again. */
    wk_connect(&gone, "gone", 1, "", NULL, 0);
    cr_assert_eq(ctl_node_count(ctl, "gone", &found), 2);
    ch_client_destroy(ctl);
    wk_close(&gone);
    wk_close(&a);
    coord_down();
}

/* Register on an open client; the reply envelope (caller frees). */
static Chorus__Envelope *raw_register(ch_client_t *cl, const char *name, uint32_t slots)
{
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    reg.name = (char *)name;
    reg.slots = slots;
    reg.rack = "";
    reg.device = "cpu";
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    ch_client_call(cl, &env, 2000, &resp);
    return resp;
}

static void expect_nodes(const char *name, const char *state, uint32_t slots)
{
    ch_client_t *ctl = ctl_open();
    Chorus__Envelope *resp = ctl_nodes(ctl);
    cr_assert_eq(resp->node_list->n_nodes, 1);
    cr_assert_str_eq(resp->node_list->nodes[0]->name, name);
    cr_assert_str_eq(resp->node_list->nodes[0]->state, state);
    cr_assert_eq(resp->node_list->nodes[0]->slots, slots);
    ch_msg_free(resp);
    ch_client_destroy(ctl);
}

/* Issue 11 class 2: a new link may not take the name of a node whose link is open; the
 * refused link is closed (workerd retries) and gets the name once the old link is gone. */
Test(coord, live_name_is_not_taken_over)
{
    worker_t a, *ws[1] = {&a};
    ch_client_t *cl = NULL;
    Chorus__Envelope *in = NULL;
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    cr_assert_eq(ch_client_connect_tcp(H.addr, &H.key, "worker", 2000, &cl), 0);
    Chorus__Envelope *resp = raw_register(cl, "n1", 4);
    cr_assert(resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR, "takeover accepted");
    cr_assert(strstr(resp->error->message, "in use"), "%s", resp->error->message);
    ch_msg_free(resp);
    int rc = 0;
    for (int i = 0; i < 100 && (rc = ch_client_recv(cl, 20, &in)) == -ETIMEDOUT; i++)
        pump(ws, 1, 1);
    cr_assert_eq(rc, -EPIPE, "the refused link is closed (%s)", ch_strerror(rc));
    ch_client_destroy(cl);
    pump(ws, 1, 100);
    expect_nodes("n1", "alive", 2); /* the real node kept its name and its link */
    cr_assert_eq(ch_client_recv(a.cl, 1, &in), -ETIMEDOUT, "the real node's link was cut");

    /* The node restarts: its old link closes, and the new one gets the name back. */
    wk_close(&a);
    cr_assert_eq(ch_client_connect_tcp(H.addr, &H.key, "worker", 2000, &cl), 0);
    resp = NULL;
    for (int i = 0; i < 100; i++) {
        resp = raw_register(cl, "n1", 4);
        if (resp && resp->body_case == CHORUS__ENVELOPE__BODY_REGISTER_ACK)
            break;
        ch_msg_free(resp);
        resp = NULL;
        ch_client_destroy(cl);
        usleep(20000);
        cr_assert_eq(ch_client_connect_tcp(H.addr, &H.key, "worker", 2000, &cl), 0);
    }
    cr_assert(resp, "the restarted node never got its name back");
    ch_msg_free(resp);
    expect_nodes("n1", "alive", 4);
    ch_client_destroy(cl);
    coord_down();
}

/* Issue 11 class 1: one link is one node. A second name on a registered link is refused,
 * and closing the link leaves no node pointing at it (coordinatord used to abort in
 * uv_shutdown a few seconds later). */
Test(coord, one_link_is_one_node)
{
    worker_t a;
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    Chorus__Envelope *resp = raw_register(a.cl, "n2", 2);
    cr_assert(resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR, "second identity accepted");
    cr_assert_eq(resp->error->code, CH_E_STATE);
    ch_msg_free(resp);
    resp = raw_register(a.cl, "n1", 2); /* the same name again is fine */
    cr_assert(resp && resp->body_case == CHORUS__ENVELOPE__BODY_REGISTER_ACK);
    ch_msg_free(resp);
    wk_close(&a);
    /* Past the dead-after time the coordinator walks its nodes and links again. */
    worker_t b, *wb[1] = {&b};
    wk_connect(&b, "n3", 1, "", NULL, 0);
    pump(wb, 1, 1300);
    ch_client_t *ctl = ctl_open();
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0, "the coordinator died");
    cr_assert_eq(resp->node_list->n_nodes, 2); /* n1 and n3; n2 never existed */
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    wk_close(&b);
    coord_down();
}

/* Issue 11 class 9 and 4: names and racks with control characters, and a Register
 * listing far more running ranks than the node has slots, are refused. */
Test(coord, register_refuses_bad_names_and_huge_lists)
{
    coord_up();
    ch_client_t *cl = NULL;
    cr_assert_eq(ch_client_connect_tcp(H.addr, &H.key, "worker", 2000, &cl), 0);
    const char *names[] = {"evil\nnode", "a\x1b[31m", "sp ace"};
    for (int i = 0; i < 3; i++) {
        Chorus__Envelope *resp = raw_register(cl, names[i], 1);
        cr_assert(resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR, "name %d accepted", i);
        cr_assert_eq(resp->error->code, CH_E_CONFIG);
        ch_msg_free(resp);
    }
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    reg.name = "n1";
    reg.slots = 1;
    reg.rack = "r\r1";
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    cr_assert_eq(ch_client_call(cl, &env, 2000, &resp), CH_E_CONFIG);
    ch_msg_free(resp);
    /* 10,000 running ranks from a 1-slot node. */
    size_t n = 10000;
    Chorus__RankRef *refs = calloc(n, sizeof *refs);
    Chorus__RankRef **pr = calloc(n, sizeof *pr);
    cr_assert(refs && pr);
    for (size_t i = 0; i < n; i++) {
        chorus__rank_ref__init(&refs[i]);
        refs[i].job_id = "j999";
        refs[i].rank = (uint32_t)i;
        pr[i] = &refs[i];
    }
    reg.rack = "";
    reg.running = pr;
    reg.n_running = n;
    cr_assert_eq(ch_client_call(cl, &env, 2000, &resp), CH_E_CONFIG);
    cr_assert(strstr(resp->error->message, "running"), "%s", resp->error->message);
    ch_msg_free(resp);
    free(pr);
    free(refs);
    ch_client_destroy(cl);
    coord_down();
}

/* The coordinator stops and starts again on its state; n1 (ws[0]) comes back holding
 * ranks 0 and 1 of job's generation 1, n2 (ws[1]) empty; past the re-adoption grace.
 * Returns a new control client (ctl is closed). */
static ch_client_t *restart_n1_keeps_ranks(ch_client_t *ctl, worker_t **ws, const char *job)
{
    ch_client_destroy(ctl);
    wk_close(ws[0]);
    wk_close(ws[1]);
    coord_down();
    coord_up();
    Chorus__RankRef r0 = CHORUS__RANK_REF__INIT, r1 = CHORUS__RANK_REF__INIT;
    Chorus__RankRef *refs[2] = {&r0, &r1};
    r0.job_id = r1.job_id = (char *)job;
    r0.generation = r1.generation = 1;
    r1.rank = 1;
    wk_connect(ws[0], "n1", 2, "", refs, 2);
    wk_connect(ws[1], "n2", 2, "", NULL, 0);
    ctl = ctl_open();
    pump(ws, 2, (int)H.cfg.grace_ms + 200);
    return ctl;
}

Test(coord, restart_readopts_reported_ranks_and_fails_lost_ones)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char j1[32], j2[32], msg[256];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *two =
        "[job]\nname = two\nkind = diag\n[parallel]\ndp = 2\n[fault]\nmax_restarts = 0\n";
    cr_assert_eq(ctl_submit(ctl, two, j1, 32, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_eq(ctl_submit(ctl, two, j2, 32, msg, sizeof(msg)), 0, "%s", msg);
    /* Each job packs on one node. */
    Chorus__Envelope *sa = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    Chorus__Envelope *sb = take(ws, 2, &b, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert(sa && sb);
    char ja[32], jb[32];
    snprintf(ja, sizeof(ja), "%s", sa->start_ranks->job_id);
    snprintf(jb, sizeof(jb), "%s", sb->start_ranks->job_id);
    for (uint32_t r = 0; r < 2; r++) {
        wk_event(&a, ja, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        wk_event(&b, jb, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    }
    ch_msg_free(sa);
    ch_msg_free(sb);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, ja, "running", 2000);
    ch_msg_free(e);
    e = wait_state(ctl, ws, 2, jb, "running", 2000);
    ch_msg_free(e);
    /* New coordinator on the same state: n1 re-reports its ranks, n2 comes back empty. */
    ctl = restart_n1_keeps_ranks(ctl, ws, ja);
    e = ctl_job(ctl, ja);
    cr_assert_str_eq(e->job_info->state, "running", "%s", e->job_info->reason);
    cr_assert_str_eq(e->job_info->ranks[0]->state, "running");
    ch_msg_free(e);
    e = ctl_job(ctl, jb);
    cr_assert_str_eq(e->job_info->state, "failed");
    cr_assert(strncmp(e->job_info->reason, "ranks lost while the coordinator was down", 41) == 0,
              "%s", e->job_info->reason);
    ch_msg_free(e);

    /* The re-adopted job still completes normally; new ids keep increasing. */
    for (uint32_t r = 0; r < 2; r++) {
        wk_event(&a, ja, 1, r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, 0);
        wk_event(&a, ja, 1, r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 0);
    }
    e = wait_state(ctl, ws, 2, ja, "completed", 2000);
    cr_assert_str_eq(e->job_info->state, "completed");
    ch_msg_free(e);
    char j3[32];
    cr_assert_eq(ctl_submit(ctl, two, j3, 32, msg, sizeof(msg)), 0, "%s", msg);
    cr_assert_str_eq(j3, "j3");
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, control_socket_refuses_other_users)
{
    if (getuid() != 0)
        cr_skip_test("needs root to act as another user");
    scratch_reachable_by_nobody();
    coord_up();
    chmod(H.dir, 0755);
    chmod(H.sock, 0666); /* let the connection through so the SO_PEERCRED check is reached */
    pid_t pid = fork();
    if (pid == 0) {
        ch_client_t *c = NULL;
        Chorus__Envelope *in = NULL;
        if (setgid(65534) < 0 || setuid(65534) < 0)
            _exit(2);
        if (ch_client_connect_unix(H.sock, 2000, &c) < 0)
            _exit(3);
        if (ch_client_recv(c, 2000, &in) < 0)
            _exit(4);
        int ok = in->body_case == CHORUS__ENVELOPE__BODY_ERROR && in->error->code == -EACCES &&
                 strstr(in->error->message, "permission denied: uid 65534") != NULL;
        ch_msg_free(in);
        int closed = ch_client_recv(c, 2000, &in) == -EPIPE;
        ch_client_destroy(c);
        _exit(ok && closed ? 0 : 5);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    ch_client_t *ctl = ctl_open(); /* root is allowed */
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), 0);
    cr_assert_eq(resp->job_list->n_jobs, 0);
    ch_msg_free(resp);
    ch_client_destroy(ctl);
    coord_down();
}

Test(coord, failed_rank_restarts_from_the_committed_checkpoint_until_max_restarts)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32], msg[256];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *job = "[job]\nname = r\nkind = diag\n[parallel]\ndp = 2\n"
                      "[fault]\nmax_restarts = 1\nstep_timeout = 60\n";
    cr_assert_eq(ctl_submit(ctl, job, id, sizeof(id), msg, sizeof(msg)), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "gen 1 packs on n1");
    cr_assert_eq(e->start_ranks->resume_step, 0);
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++) {
        wk_event(&a, id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        wk_step(&a, id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 5);
    }
    wk_step(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS, 7);
    e = wait_state(ctl, ws, 2, id, "running", 2000);
    ch_msg_free(e);

    /* Rank 1 dies: recovering; gen 1 is killed; no restart while rank 0 still runs. */
    wk_event(&a, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = wait_state(ctl, ws, 2, id, "recovering", 2000);
    cr_assert_eq(e->job_info->restarts, 1);
    cr_assert_eq(e->job_info->n_history, 1);
    cr_assert_str_eq(e->job_info->history[0]->cause, "rank_exit");
    cr_assert_eq(e->job_info->history[0]->rank, 1);
    cr_assert_eq(e->job_info->history[0]->resumed_from, -1);
    ch_msg_free(e);
    Chorus__Envelope *k = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k);
    cr_assert_eq(k->kill_ranks->generation, 1);
    ch_msg_free(k);
    cr_assert_null(take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 200));
    cr_assert_null(take(ws, 2, &b, CHORUS__ENVELOPE__BODY_START_RANKS, 1));

    /* Its exit confirmed, gen 2 resumes from the committed step 5. */
    wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "gen 2 starts on the free slots");
    cr_assert_eq(e->start_ranks->generation, 2);
    cr_assert_eq(e->start_ranks->resume_step, 5);
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++)
        wk_event(&a, id, 2, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    wk_step(&a, id, 2, 0, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS, 6);
    e = wait_state(ctl, ws, 2, id, "running", 2000);
    cr_assert_eq(e->job_info->generation, 2);
    cr_assert_eq(e->job_info->history[0]->resumed_from, 5);
    cr_assert_eq(e->job_info->history[0]->steps_lost, 2);
    cr_assert(e->job_info->history[0]->recover_s >= 0);
    ch_msg_free(e);

    /* A rank of gen 1 that still talks is killed. */
    wk_step(&a, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS, 8);
    k = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k);
    cr_assert_eq(k->kill_ranks->generation, 1);
    cr_assert_eq(k->kill_ranks->n_ranks, 1);
    cr_assert_eq(k->kill_ranks->ranks[0], 1);
    ch_msg_free(k);

    /* Restarts exhausted: n1 dies and the job fails naming both causes. */
    a.silent = 1;
    e = wait_state(ctl, ws, 2, id, "failed", 4000);
    cr_assert(strstr(e->job_info->reason, "rank_exit") && strstr(e->job_info->reason, "node_lost"),
              "%s", e->job_info->reason);
    cr_assert_eq(e->job_info->n_history, 2);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, final_reports_resent_at_registration_complete_the_job)
{
    worker_t a, *ws[1] = {&a};
    char id[32], msg[256];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *job = "[job]\nname = f\nkind = diag\n[parallel]\ndp = 2\n";
    cr_assert_eq(ctl_submit(ctl, job, id, sizeof(id), msg, sizeof(msg)), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e);
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++)
        wk_event(&a, id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    e = wait_state(ctl, ws, 1, id, "running", 2000);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();

    /* Both ranks finished while the coordinator was down: the worker reports them. */
    coord_up();
    Chorus__RankRef f0 = CHORUS__RANK_REF__INIT, f1 = CHORUS__RANK_REF__INIT;
    Chorus__RankRef *fin[2] = {&f0, &f1};
    f0.job_id = f1.job_id = id;
    f0.generation = f1.generation = 1;
    f1.rank = 1;
    f0.done = f1.done = 1;
    wk_connect_finished(&a, "n1", 2, fin, 2);
    ctl = ctl_open();
    e = wait_state(ctl, ws, 1, id, "completed", 2000);
    cr_assert_str_eq(e->job_info->state, "completed", "%s", e->job_info->reason);
    ch_msg_free(e);
    e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK, 2000);
    cr_assert_not_null(e, "the final reports are acknowledged");
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

static int ctl_cancel(ch_client_t *ctl, const char *job)
{
    Chorus__Cancel can = CHORUS__CANCEL__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    can.job_id = (char *)job;
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &can;
    return ctl_status(ctl, &req);
}

/* Issue 11 class 5: a job belongs to its submitter (SO_PEERCRED, whatever the job text
 * claims) and runs as them; root's jobs run as the service user; a user cancels only their
 * own jobs, root any. */
Test(coord, jobs_belong_to_their_submitter)
{
    if (getuid() != 0)
        cr_skip_test("needs root to act as another user");
    scratch_reachable_by_nobody();
    struct group *gr = getgrgid(65534);
    if (!gr)
        cr_skip_test("no group 65534");
    snprintf(H.cfg.ctl_group, sizeof(H.cfg.ctl_group), "%s", gr->gr_name);
    worker_t a, *ws[1] = {&a};
    char ja[32], msg[256] = "";
    coord_up();
    wk_connect(&a, "n1", 4, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *root_job = "[job]\nname = roots\nkind = diag\n";
    cr_assert_eq(ctl_submit(ctl, root_job, ja, sizeof ja, msg, sizeof msg), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e);
    cr_assert(strstr(e->start_ranks->job_ini, "owner_uid = 0\n"), "%s", e->start_ranks->job_ini);
    cr_assert(strstr(e->start_ranks->job_ini, "run_uid = 65534\n"), "root's job runs as nobody");
    ch_msg_free(e);

    chmod(H.dir, 0755);
    chmod(H.sock, 0666);
    pid_t pid = fork();
    if (pid == 0) {
        ch_client_t *c = NULL;
        char id[32], m[256];
        if (setgid(65534) < 0 || setuid(65534) < 0)
            _exit(2);
        if (ch_client_connect_unix(H.sock, 2000, &c) < 0)
            _exit(3);
        const char *spoof = "[job]\nname = spoof\nkind = diag\nowner_uid = 0\nrun_uid = 0\n";
        if (ctl_submit(c, spoof, id, sizeof id, m, sizeof m) < 0)
            _exit(4);
        if (ctl_cancel(c, ja) != -EACCES)
            _exit(5); /* root's job */
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e);
    cr_assert(strstr(e->start_ranks->job_ini, "name = spoof"));
    cr_assert(strstr(e->start_ranks->job_ini, "owner_uid = 65534\n"), "the claim was kept");
    cr_assert(strstr(e->start_ranks->job_ini, "run_uid = 65534\n"), "the claim was kept");
    ch_msg_free(e);
    cr_assert_eq(ctl_cancel(ctl, "spoof"), 0, "root may cancel any job");
    cr_assert_eq(ctl_cancel(ctl, ja), 0);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

/* Rank r of job (generation gen) reports n figures "m<first>".."m<first+n-1>", m<i> = i + add. */
static void wk_figures(worker_t *w, const char *job, uint64_t gen, uint32_t rank, size_t first,
                       size_t n, double add)
{
    static char names[80][8];
    Chorus__Metric m[80], *mp[80];
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    cr_assert(n <= 80);
    for (size_t i = 0; i < n; i++) {
        chorus__metric__init(&m[i]);
        snprintf(names[i], sizeof(names[i]), "m%zu", first + i);
        m[i].name = names[i];
        m[i].value = (double)(first + i) + add;
        mp[i] = &m[i];
    }
    ev.job_id = (char *)job;
    ev.generation = gen;
    ev.rank = rank;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = 1;
    ev.n_metrics = n;
    ev.metrics = mp;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

/* Rank r's figures in status: their count, and each named one's value (NaN: absent). */
static size_t figures_of(ch_client_t *ctl, const char *job, uint32_t r, const char *name,
                         double *value)
{
    Chorus__Envelope *e = ctl_job(ctl, job);
    cr_assert(r < e->job_info->n_ranks);
    const Chorus__RankInfo *ri = e->job_info->ranks[r];
    size_t n = ri->n_metrics;
    *value = NAN;
    for (size_t k = 0; k < n; k++)
        if (strcmp(ri->metrics[k]->name, name) == 0)
            *value = ri->metrics[k]->value;
    ch_msg_free(e);
    return n;
}

/* A rank's figures live beside its record (allocated at its first figure, grown as it names
 * more, up to 64): status shows what it last said, a new generation and a reload after a
 * coordinator restart start empty, and every path frees them (run under valgrind/ASan). */
Test(coord, rank_figures_follow_generations_and_a_reload)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32], msg[256];
    double v;
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *job = "[job]\nname = f\nkind = diag\n[parallel]\ndp = 2\n"
                      "[fault]\nmax_restarts = 1\nstep_timeout = 60\n";
    cr_assert_eq(ctl_submit(ctl, job, id, sizeof(id), msg, sizeof(msg)), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "gen 1 packs on n1");
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++)
        wk_event(&a, id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    e = wait_state(ctl, ws, 2, id, "running", 2000);
    ch_msg_free(e);

    /* 70 names in three reports (the slots grow 2, 4, ... 64): the first 64 are kept, the
     * rest dropped; a name reported again changes its value, not the count. */
    wk_figures(&a, id, 1, 0, 0, 1, 0);
    wk_figures(&a, id, 1, 0, 1, 4, 0);
    wk_figures(&a, id, 1, 0, 5, 65, 0);
    wk_figures(&a, id, 1, 0, 3, 1, 100.5);
    wk_figures(&a, id, 1, 1, 7, 1, 0.25);
    pump(ws, 2, 100);
    cr_assert_eq(figures_of(ctl, id, 0, "m3", &v), 64);
    cr_assert_float_eq(v, 103.5, 1e-9);
    cr_assert_eq(figures_of(ctl, id, 0, "m63", &v), 64);
    cr_assert_float_eq(v, 63, 1e-9);
    figures_of(ctl, id, 0, "m64", &v);
    cr_assert(isnan(v), "the 65th name is dropped");
    cr_assert_eq(figures_of(ctl, id, 1, "m7", &v), 1);
    cr_assert_float_eq(v, 7.25, 1e-9);
    /* Reloaded from the store, n1 re-reporting both ranks: no figures until they report. */
    ctl = restart_n1_keeps_ranks(ctl, ws, id);
    e = ctl_job(ctl, id);
    cr_assert_str_eq(e->job_info->state, "running", "%s", e->job_info->reason);
    ch_msg_free(e);
    cr_assert_eq(figures_of(ctl, id, 0, "m3", &v), 0);
    wk_figures(&a, id, 1, 1, 0, 3, 1);
    pump(ws, 2, 100);
    cr_assert_eq(figures_of(ctl, id, 1, "m2", &v), 3);
    cr_assert_float_eq(v, 3, 1e-9);

    /* Rank 1 dies: generation 2's ranks start without figures, then keep their own. */
    wk_event(&a, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = wait_state(ctl, ws, 2, id, "recovering", 2000);
    ch_msg_free(e);
    wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    worker_t *own[2] = {NULL, NULL}; /* gen 2 may go to either node */
    for (int t = 0; t < 200 && (!own[0] || !own[1]); t++)
        for (int i = 0; i < 2; i++) {
            if (!(e = take(ws, 2, ws[i], CHORUS__ENVELOPE__BODY_START_RANKS, 5)))
                continue;
            cr_assert_eq(e->start_ranks->generation, 2);
            for (size_t k = 0; k < e->start_ranks->n_ranks; k++)
                own[e->start_ranks->ranks[k]->rank % 2] = ws[i];
            ch_msg_free(e);
        }
    cr_assert(own[0] && own[1], "gen 2 starts on the free slots");
    for (uint32_t r = 0; r < 2; r++)
        wk_event(own[r], id, 2, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    e = wait_state(ctl, ws, 2, id, "running", 2000);
    ch_msg_free(e);
    cr_assert_eq(figures_of(ctl, id, 1, "m2", &v), 0);
    wk_figures(own[0], id, 2, 0, 9, 2, 0.5);
    pump(ws, 2, 100);
    cr_assert_eq(figures_of(ctl, id, 0, "m10", &v), 2);
    cr_assert_float_eq(v, 10.5, 1e-9);

    /* Cancelled with its figures held, then the coordinator stops: both free them. */
    cr_assert_eq(ctl_cancel(ctl, id), 0);
    cr_assert_eq(figures_of(ctl, id, 0, "m9", &v), 2);
    cr_assert_float_eq(v, 9.5, 1e-9);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, collective_timeout_names_the_peer_as_the_culprit)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    wk_connect(&b, "n2", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    worker_t *w0 = owner(e->job_info, 0, ws, 2), *w3 = owner(e->job_info, 3, ws, 2);
    ch_msg_free(e);

    /* Rank 0 waited for rank 3 in its DP group and gave up. */
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev.job_id = id;
    ev.generation = 1;
    ev.rank = 0;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_FAILED;
    ev.message = "timed out";
    ev.timeout_group = "dp";
    ev.timeout_peer = 3;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(w0->cl, &env), 0);
    e = wait_state(ctl, ws, 2, id, "failed", 2000); /* max_restarts = 0 */
    cr_assert_eq(e->job_info->n_history, 1);
    cr_assert_str_eq(e->job_info->history[0]->cause, "collective_timeout");
    cr_assert_eq(e->job_info->history[0]->rank, 3);
    cr_assert_str_eq(e->job_info->history[0]->node, w3->name);
    cr_assert(strstr(e->job_info->reason, "group dp") && strstr(e->job_info->reason, "rank 3"),
              "%s", e->job_info->reason);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, coordinator_restart_while_recovering_kills_the_old_ranks_before_restarting)
{
    worker_t a, *ws[1] = {&a};
    char id[32], msg[256];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    const char *job = "[job]\nname = rr\nkind = diag\n[parallel]\ndp = 2\n"
                      "[fault]\nmax_restarts = 2\n";
    cr_assert_eq(ctl_submit(ctl, job, id, sizeof(id), msg, sizeof(msg)), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e);
    ch_msg_free(e);
    for (uint32_t r = 0; r < 2; r++)
        wk_event(&a, id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    wk_event(&a, id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = wait_state(ctl, ws, 1, id, "recovering", 2000);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();

    /* Back up: n1 still runs rank 0 of the failed generation. It is killed, and the
     * restart waits for its exit (and for the grace) before generation 2 starts. */
    coord_up();
    Chorus__RankRef r0 = CHORUS__RANK_REF__INIT;
    Chorus__RankRef *refs[1] = {&r0};
    r0.job_id = id;
    r0.generation = 1;
    wk_connect(&a, "n1", 2, "", refs, 1);
    ctl = ctl_open();
    Chorus__Envelope *k = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k, "the old rank is killed");
    cr_assert_eq(k->kill_ranks->generation, 1);
    ch_msg_free(k);
    cr_assert_null(take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, (int)H.cfg.grace_ms + 200),
                   "no restart while the old rank runs");
    wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "generation 2 starts once the old rank is gone");
    cr_assert_eq(e->start_ranks->generation, 2);
    ch_msg_free(e);
    e = ctl_job(ctl, id);
    cr_assert_eq(e->job_info->restarts, 1);
    cr_assert_eq(e->job_info->n_history, 1);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

/* Step of the job's last committed checkpoint as status reports it. */
static int64_t committed_ckpt(ch_client_t *ctl, worker_t **ws, int n, const char *id, int64_t want,
                              int ms)
{
    uint64_t end = ch_now_ms() + (uint64_t)ms;
    for (;;) {
        Chorus__Envelope *e = ctl_job(ctl, id);
        int64_t s = e->job_info->last_checkpoint_step;
        ch_msg_free(e);
        if (s == want || ch_now_ms() >= end)
            return s;
        pump(ws, n, 10);
    }
}

/* Every rank reports a checkpoint step only after rank 0 wrote its manifest, so the
 * first report of a step commits it: the other ranks' reports (which a node lost while
 * the coordinator was down never sends) are not waited for, an older step never moves it
 * back, and the committed step is stored (it survives a coordinator restart). */
Test(coord, checkpoint_is_committed_at_the_first_ranks_report)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    cr_assert_str_eq(e->job_info->state, "running");
    cr_assert_eq(e->job_info->last_checkpoint_step, -1);
    worker_t *own[4];
    for (uint32_t r = 0; r < 4; r++)
        own[r] = owner(e->job_info, r, ws, 2);
    ch_msg_free(e);

    /* Rank 3 alone reports step 10 (not rank 0, not every rank): committed. */
    wk_step(own[3], id, 1, 3, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 10);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 10, 2000), 10);
    /* The other ranks' reports of it change nothing; an older step does not move it back. */
    wk_step(own[0], id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 10);
    wk_step(own[1], id, 1, 1, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 5);
    pump(ws, 2, 100);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 10, 0), 10);
    /* The next step, first reported by rank 0, while rank 1 never reports it. */
    wk_step(own[0], id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 20);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 20, 2000), 20);
    /* A stale generation's report commits nothing. */
    wk_step(own[2], id, 0, 2, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 30);
    pump(ws, 2, 100);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 20, 0), 20);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();

    /* Stored before anything acts on it: a new coordinator resumes from step 20. */
    coord_up();
    ctl = ctl_open();
    e = ctl_job(ctl, id);
    cr_assert_eq(e->job_info->last_checkpoint_step, 20);
    ch_msg_free(e);
    ch_client_destroy(ctl);
    coord_down();
}

/* What workerd sends for a checkpoint step of ranks[] of one node (workerd/progress.h): their
 * reports in one NodeProgress, the RankEvents without their own job and generation. */
static void send_node_ckpt(worker_t *w, const char *job, uint64_t gen, const uint32_t *ranks,
                           size_t n, uint64_t step)
{
    Chorus__NodeProgress np = CHORUS__NODE_PROGRESS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__RankEvent ev[4], *evp[4];
    cr_assert(n <= 4);
    for (size_t i = 0; i < n; i++) {
        chorus__rank_event__init(&ev[i]);
        ev[i].rank = ranks[i];
        ev[i].kind = CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT;
        ev[i].step = step;
        evp[i] = &ev[i];
    }
    np.job_id = (char *)job;
    np.generation = gen;
    np.checkpoints = evp;
    np.n_checkpoints = n;
    env.body_case = CHORUS__ENVELOPE__BODY_NODE_PROGRESS;
    env.node_progress = &np;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

/* A node's checkpoint reports of a step in one NodeProgress commit it as the ranks' own
 * reports do, behind the same fences: a node speaking for ranks placed elsewhere, or for a
 * stale generation, commits nothing. */
Test(coord, node_progress_checkpoints_commit_as_rank_reports_do)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    uint32_t on_a[4], on_b[4];
    size_t na = 0, nb = 0;
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_4_ranks(ctl, ws, id);
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    for (uint32_t r = 0; r < 4; r++) {
        if (owner(e->job_info, r, ws, 2) == &a)
            on_a[na++] = r;
        else
            on_b[nb++] = r;
    }
    ch_msg_free(e);
    cr_assert(na > 0 && nb > 0);
    send_node_ckpt(&a, id, 1, on_b, nb, 10); /* b's ranks, from a */
    send_node_ckpt(&a, id, 0, on_a, na, 10); /* a stale generation */
    pump(ws, 2, 100);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 10, 0), -1);
    send_node_ckpt(&b, id, 1, on_b, nb, 10);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 10, 2000), 10);
    send_node_ckpt(&a, id, 1, on_a, na, 20);
    cr_assert_eq(committed_ckpt(ctl, ws, 2, id, 20, 2000), 20);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* Issue 11 class 9: an ended job's memory is let go once more than keep_ended_jobs have
 * ended after it (each cost ~5 KB for good); its stored row still answers `status`, by id
 * and by name, and a cancel of it says it ended. Active and queued jobs are never let go,
 * nor is an ended job whose ranks still hold slots. */
Test(coord, ended_jobs_are_let_go_from_memory)
{
    enum { KEEP = 4, RUN = 8, CANCELLED = 24 };
    worker_t a, *ws[1] = {&a};
    char id[32], first[32] = "", msg[256];
    H.cfg.keep_ended_jobs = KEEP;
    coord_up();
    wk_connect(&a, "n1", 1, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    size_t most = 0;
    for (int i = 0; i < RUN; i++) { /* run to completion on the one slot */
        char ini[128];
        snprintf(ini, sizeof ini, "[job]\nname = run%d\nkind = diag\n", i);
        cr_assert_eq(ctl_submit(ctl, ini, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
        if (!first[0])
            snprintf(first, sizeof first, "%s", id);
        Chorus__Envelope *e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
        cr_assert_not_null(e);
        ch_msg_free(e);
        wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, 0);
        wk_event(&a, id, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 0);
        e = wait_state(ctl, ws, 1, id, "completed", 2000);
        cr_assert_str_eq(e->job_info->state, "completed");
        ch_msg_free(e);
        size_t n = ctl_job_count(ctl);
        most = n > most ? n : most;
    }
    /* A job that holds the slot, then jobs cancelled while queued behind it. */
    char holder[32];
    cr_assert_eq(ctl_submit(ctl, "[job]\nname = holder\nkind = diag\n", holder, sizeof holder, msg,
                            sizeof msg),
                 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 1, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e);
    ch_msg_free(e);
    wk_event(&a, holder, 1, 0, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
    e = wait_state(ctl, ws, 1, holder, "running", 2000);
    ch_msg_free(e);
    for (int i = 0; i < CANCELLED; i++) {
        cr_assert_eq(
            ctl_submit(ctl, "[job]\nname = q\nkind = diag\n", id, sizeof id, msg, sizeof msg), 0,
            "%s", msg);
        cr_assert_eq(ctl_cancel(ctl, id), 0);
        size_t n = ctl_job_count(ctl);
        most = n > most ? n : most;
    }
    /* Bounded: the kept ended jobs, the running holder and the one just submitted. */
    cr_assert_leq(most, KEEP + 2, "%zu jobs in memory after %d ended", most, RUN + CANCELLED);
    e = ctl_job(ctl, holder);
    cr_assert_str_eq(e->job_info->state, "running", "the active job stays");
    ch_msg_free(e);

    /* The first job, long let go, still answers from the store: by id and by name. */
    e = ctl_job(ctl, first);
    cr_assert_str_eq(e->job_info->id, first);
    cr_assert_str_eq(e->job_info->name, "run0");
    cr_assert_str_eq(e->job_info->state, "completed");
    cr_assert_neq(e->job_info->finished_ms, 0);
    cr_assert(strstr(e->job_info->job_ini, "run0") != NULL, "%s", e->job_info->job_ini);
    ch_msg_free(e);
    e = ctl_job(ctl, "run1");
    cr_assert_str_eq(e->job_info->state, "completed");
    ch_msg_free(e);
    Chorus__Cancel can = CHORUS__CANCEL__INIT;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    can.job_id = first;
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &can;
    cr_assert_eq(ch_client_call(ctl, &req, 2000, &resp), CH_E_STATE);
    cr_assert(strstr(resp->error->message, "already completed"), "%s", resp->error->message);
    ch_msg_free(resp);
    cr_assert_eq(ctl_cancel(ctl, "j999"), CH_E_NOTFOUND);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();

    /* A restarted coordinator reloads the store and keeps the same bound. */
    coord_up();
    ctl = ctl_open();
    cr_assert_leq(ctl_job_count(ctl), KEEP + 1);
    e = ctl_job(ctl, holder);
    cr_assert_eq(e->job_info->n_ranks, 1, "the holder is still in memory, with its rank");
    ch_msg_free(e);
    ch_client_destroy(ctl);
    coord_down();
}

// ---------------------------------------------------------------------------------------
// Admission against the nodes' memory, and elastic restarts

/* The per-rank need of a job file as admission computes it (common/plan.h), in MiB. */
static double need_mib(const char *ini)
{
    ch_jobspec_t spec;
    char err[256];
    ch_plan_t p;
    cr_assert_eq(ch_jobspec_parse(ini, &spec, err, sizeof err), 0, "%s", err);
    ch_model_cfg_t m = ch_plan_model_of(&spec);
    cr_assert_eq(ch_plan_peak(&m, ch_jobspec_layout(&spec), spec.parallel.micro_batch_size,
                              spec.parallel.microbatches, spec.parallel.reshard, &p),
                 0);
    return p.total_bytes / 1048576.0;
}

/* A training job whose rank needs more than a slot of the nodes holds (memory / slots)
 * is refused at submit naming the need, its stage and layout, and the best node; nothing
 * is queued. A layout whose ranks fit some nodes only is refused when those hold too few
 * slots; one that fits is taken; a node that reports no memory is not checked. */
Test(coord, submit_refuses_a_rank_larger_than_a_slots_memory)
{
    /* About 57 MiB per rank at dp 1 (12.6 M parameters x 4 floats + activations). */
    const char *big = "[job]\nname = big\n[model]\nlayers = 4\nheads = 8\nembd = 512\n"
                      "[parallel]\ndp = 1\n";
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32] = "", msg[512] = "", want[256];
    coord_up();
    wk_connect_memory(&a, "n1", 4, 64ull << 20); /* 16 MiB a slot */
    wk_connect_memory(&b, "n2", 2, 64ull << 20); /* 32 MiB a slot: the best */
    ch_client_t *ctl = ctl_open();

    double mib = need_mib(big);
    cr_assert(mib > 32 && mib < 1024, "the case needs a rank over 32 MiB, under 1 GiB: %g", mib);
    cr_assert_eq(ctl_submit(ctl, big, id, sizeof id, msg, sizeof msg), CH_E_CAPACITY, "%s", msg);
    snprintf(want, sizeof want,
             "model: needs %.1f MiB per rank (stage 0 of tp 1 pp 1 dp 1), nodes offer at most "
             "32.0 MiB per slot (n2: 64.0 MiB / 2 slots)",
             mib);
    cr_assert_str_eq(msg, want);
    cr_assert_eq(ctl_job_count(ctl), 0, "a refused job was queued");

    /* dp 4 of a model that fits n2's slots only: 2 slots, 4 ranks. */
    const char *mid = "[job]\nname = mid\n[model]\nlayers = 2\nheads = 8\nembd = 256\n"
                      "[parallel]\ndp = 4\nmicro_batch_size = 2\n";
    mib = need_mib(mid);
    cr_assert(mib > 16 && mib < 32, "the case needs a rank between 16 and 32 MiB: %g", mib);
    msg[0] = 0;
    cr_assert_eq(ctl_submit(ctl, mid, id, sizeof id, msg, sizeof msg), CH_E_CAPACITY, "%s", msg);
    snprintf(want, sizeof want,
             "model: needs %.1f MiB per rank (stage 0 of tp 1 pp 1 dp 4), nodes with that much "
             "per slot hold 2 slots (best n2: 64.0 MiB / 2 slots), the job needs 4 ranks",
             mib);
    cr_assert_str_eq(msg, want);
    cr_assert_eq(ctl_job_count(ctl), 0);

    /* dp 2 of it fits n2, and is placed there. */
    const char *fits = "[job]\nname = fits\n[model]\nlayers = 2\nheads = 8\nembd = 256\n"
                       "[parallel]\ndp = 2\nmicro_batch_size = 2\n";
    cr_assert_eq(ctl_submit(ctl, fits, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(ctl_job_count(ctl), 1);
    Chorus__Envelope *e = take(ws, 2, &b, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "the ranks go to n2, whose slots hold them");
    cr_assert_eq(e->start_ranks->n_ranks, 2);
    ch_msg_free(e);

    /* The registry shows what each node reported. */
    Chorus__Envelope *resp = ctl_nodes(ctl);
    cr_assert_eq(resp->node_list->n_nodes, 2);
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(resp->node_list->nodes[i]->memory_bytes, 64ull << 20);
    ch_msg_free(resp);

    /* A node that does not report its memory is not checked: the big job is taken. */
    worker_t x, *all[3] = {&a, &b, &x};
    wk_connect(&x, "n3", 1, "", NULL, 0);
    cr_assert_eq(ctl_submit(ctl, big, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
    e = take(all, 3, &x, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "the big job goes to n3");
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    wk_close(&x);
    coord_down();
}

/* checkpoint.memory_every's copies live in the nodes' host memory: a job whose ranks fit a
 * slot is refused once its in-memory checkpoints (common/plan.h: 2 steps of its own state
 * and of a peer's) no longer do, the refusal saying why. */
Test(coord, submit_refuses_in_memory_checkpoints_the_slots_cannot_hold)
{
    const char *fits = "[job]\nname = fits\n[model]\nlayers = 2\nheads = 8\nembd = 256\n"
                       "[parallel]\ndp = 2\nmicro_batch_size = 2\n";
    const char *mem = "[job]\nname = mem\n[model]\nlayers = 2\nheads = 8\nembd = 256\n"
                      "[parallel]\ndp = 2\nmicro_batch_size = 2\n"
                      "[checkpoint]\nmemory_every = 1\n";
    worker_t a;
    char id[32] = "", msg[512] = "";
    coord_up();
    wk_connect_memory(&a, "n1", 2, 64ull << 20); /* 32 MiB a slot */
    ch_client_t *ctl = ctl_open();

    ch_jobspec_t spec;
    char err[256];
    cr_assert_eq(ch_jobspec_parse(mem, &spec, err, sizeof err), 0, "%s", err);
    ch_model_cfg_t m = ch_plan_model_of(&spec);
    double extra = ch_plan_memckpt_bytes(&m, ch_jobspec_layout(&spec)) / 1048576.0;
    double base = need_mib(fits);
    cr_assert(base < 32 && base + extra > 32, "the case needs %g + %g MiB around 32", base, extra);
    cr_assert_eq(ctl_submit(ctl, mem, id, sizeof id, msg, sizeof msg), CH_E_CAPACITY, "%s", msg);
    cr_assert(strstr(msg, "with checkpoint.memory_every's copies in host memory"), "%s", msg);
    cr_assert_eq(ctl_job_count(ctl), 0, "a refused job was queued");
    cr_assert_eq(ctl_submit(ctl, fits, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
    ch_client_destroy(ctl);
    wk_close(&a);
    coord_down();
}

/* A training job on train.device = cuda runs on the nodes that registered GPUs only: with
 * none it is refused at submit naming the field, with one its ranks go there and never to
 * the CPU node, and a CPU job still runs anywhere. */
Test(coord, cuda_jobs_are_placed_on_gpu_nodes_only)
{
    const char *gpu = "[job]\nname = g\n[train]\ndevice = cuda\n[parallel]\ndp = 2\n";
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32] = "", msg[512] = "";
    coord_up();
    wk_connect(&a, "cpu1", 4, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    cr_assert_eq(ctl_submit(ctl, gpu, id, sizeof id, msg, sizeof msg), CH_E_CAPACITY, "%s", msg);
    cr_assert_str_eq(msg, "train.device: cuda: world size 2 (tp 1 x pp 1 x dp 2) needs one GPU "
                          "slot per rank; the cluster's GPU nodes (workerd --device cuda) offer 0");
    cr_assert_eq(ctl_job_count(ctl), 0, "a refused job was queued");

    wk_connect_gpu(&b, "gpu1", 2);
    cr_assert_eq(ctl_submit(ctl, gpu, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
    Chorus__Envelope *e = take(ws, 2, &b, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "the GPU job's ranks go to the GPU node");
    cr_assert_eq(e->start_ranks->n_ranks, 2);
    ch_msg_free(e);
    cr_assert_null(take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 300),
                   "no rank of the GPU job on the CPU node");

    /* the registry shows each node's device */
    Chorus__Envelope *resp = ctl_nodes(ctl);
    cr_assert_eq(resp->node_list->n_nodes, 2);
    for (size_t i = 0; i < 2; i++) {
        const Chorus__NodeInfo *ni = resp->node_list->nodes[i];
        cr_expect_str_eq(ni->device, strcmp(ni->name, "gpu1") == 0 ? "cuda" : "cpu", "%s",
                         ni->name);
    }
    ch_msg_free(resp);

    const char *cpu = "[job]\nname = c\n[parallel]\ndp = 2\n";
    cr_assert_eq(ctl_submit(ctl, cpu, id, sizeof id, msg, sizeof msg), 0, "%s", msg);
    e = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
    cr_assert_not_null(e, "the CPU job runs on the CPU node (the GPU node is full)");
    ch_msg_free(e);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* A dp = 2 training job on two 1-slot nodes loses one for good. Without fault.elastic it
 * waits for slots (as before); with it, the restart resumes from the committed step in
 * dp = 1 with twice the micro-batches (the global batch kept), the history and the job's
 * layout say so, and the job file its rank gets is the new one. */
static void lose_a_node(int elastic)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32], msg[256], ini[512];
    coord_up();
    wk_connect(&a, "n1", 1, "", NULL, 0);
    wk_connect(&b, "n2", 1, "", NULL, 0);
    ch_client_t *ctl = ctl_open();
    snprintf(ini, sizeof ini,
             "[job]\nname = el\n[parallel]\ndp = 2\nmicro_batch_size = 4\n"
             "[checkpoint]\ndir = /tmp/unused\nevery = 5\n"
             "[fault]\nmax_restarts = 2\nstep_timeout = 60\nelastic = %s\n",
             elastic ? "yes" : "no");
    cr_assert_eq(ctl_submit(ctl, ini, id, sizeof(id), msg, sizeof(msg)), 0, "%s", msg);
    worker_t *w[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        Chorus__Envelope *e = take(ws, 2, w[i], CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
        cr_assert_not_null(e, "gen 1 on %s", w[i]->name);
        uint32_t r = e->start_ranks->ranks[0]->rank;
        ch_msg_free(e);
        wk_event(w[i], id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        wk_step(w[i], id, 1, r, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 5);
    }
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    ch_msg_free(e);

    /* n2 dies; n1's rank is killed and confirmed gone. */
    b.silent = 1;
    e = wait_state(ctl, ws, 2, id, "recovering", 4000);
    cr_assert_str_eq(e->job_info->state, "recovering");
    ch_msg_free(e);
    Chorus__Envelope *k = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_KILL_RANKS, 2000);
    cr_assert_not_null(k);
    uint32_t r0 = k->kill_ranks->n_ranks ? k->kill_ranks->ranks[0] : 0;
    ch_msg_free(k);
    wk_event(&a, id, 1, r0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0, 9);
    /* n2 declared dead: its rank is lost. */
    uint64_t end = ch_now_ms() + 3000;
    for (;;) {
        e = ctl_job(ctl, id);
        int lost =
            e->job_info->n_history && strcmp(e->job_info->history[0]->cause, "node_lost") == 0;
        ch_msg_free(e);
        if (lost || ch_now_ms() >= end)
            break;
        pump(ws, 2, 20);
    }
    e = take(ws, 2, &a, CHORUS__ENVELOPE__BODY_START_RANKS, elastic ? 3000 : 500);
    if (!elastic) {
        cr_assert_null(e, "without fault.elastic the job waits for slots");
        e = ctl_job(ctl, id);
        cr_assert_str_eq(e->job_info->state, "recovering");
        cr_assert(strstr(e->job_info->reason, "restart waits for slots: needs 2") != NULL, "%s",
                  e->job_info->reason);
        cr_assert_eq(e->job_info->dp, 2);
        cr_assert_null(e->job_info->history[0]->layout_to);
        ch_msg_free(e);
    } else {
        cr_assert_not_null(e, "gen 2 starts on n1 alone");
        cr_assert_eq(e->start_ranks->generation, 2);
        cr_assert_eq(e->start_ranks->world_size, 1);
        cr_assert_eq(e->start_ranks->resume_step, 5);
        ch_jobspec_t spec;
        cr_assert_eq(ch_jobspec_parse(e->start_ranks->job_ini, &spec, msg, sizeof msg), 0, "%s",
                     msg);
        cr_assert_eq(spec.parallel.dp, 1);
        cr_assert_eq(spec.parallel.microbatches, 2);
        cr_assert_eq(spec.parallel.micro_batch_size, 4);
        cr_assert_eq(spec.fault.elastic, 1);
        ch_msg_free(e);
        wk_event(&a, id, 2, 0, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0, 0);
        wk_step(&a, id, 2, 0, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS, 6);
        e = wait_state(ctl, ws, 2, id, "running", 2000);
        Chorus__JobInfo *ji = e->job_info;
        cr_assert_eq(ji->world_size, 1);
        cr_assert_eq(ji->dp, 1);
        cr_assert_eq(ji->microbatches, 2);
        cr_assert_eq(ji->n_history, 1);
        Chorus__RestartInfo *h = ji->history[0];
        cr_assert_eq(h->resumed_from, 5);
        cr_assert(h->layout_from && h->layout_to);
        cr_assert_eq(h->layout_from->dp, 2);
        cr_assert_eq(h->layout_from->microbatches, 1);
        cr_assert_eq(h->layout_to->dp, 1);
        cr_assert_eq(h->layout_to->microbatches, 2);
        cr_assert_eq(h->layout_to->micro_batch_size, 4);
        cr_assert_eq(h->layout_to->tp, 1);
        cr_assert_eq(h->layout_to->pp, 1);
        ch_msg_free(e);

        /* a restarted coordinator still shows the layout change: the store keeps it */
        ch_client_destroy(ctl);
        coord_down();
        coord_up();
        ctl = ctl_open();
        e = ctl_job(ctl, id);
        ji = e->job_info;
        cr_assert_eq(ji->n_history, 1);
        h = ji->history[0];
        cr_assert(h->layout_from && h->layout_to, "the layouts were lost across the restart");
        cr_assert_eq(h->layout_from->dp, 2);
        cr_assert_eq(h->layout_from->microbatches, 1);
        cr_assert_eq(h->layout_to->dp, 1);
        cr_assert_eq(h->layout_to->microbatches, 2);
        cr_assert_eq(h->layout_to->micro_batch_size, 4);
        ch_msg_free(e);
    }
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

Test(coord, elastic_restart_shrinks_dp_and_keeps_the_global_batch)
{
    lose_a_node(1);
}

Test(coord, without_elastic_a_restart_waits_for_slots)
{
    lose_a_node(0);
}

// ---------------------------------------------------------------------------------------
// Per-node progress (issue 26)

/* What rank r reports for step s: step time, compute and step_ms change with the step; the
 * rest of the breakdown and the memory metric are the rank's own and stay. */
static void fill_report(Chorus__RankEvent *ev, Chorus__Metric *m, Chorus__Metric **mp, uint32_t r,
                        uint64_t s)
{
    ev->kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev->rank = r;
    ev->step = s;
    ev->total_steps = 10;
    ev->loss = 5.0 - (double)s;
    ev->tokens_per_s = 1000.0 * (double)s;
    ev->step_s = 0.5 * (double)s;
    ev->t_compute = 0.3 * (double)s;
    ev->t_tp = 0.02;
    ev->t_pp_wait = 0.01 * r;
    ev->t_zero = 0.03;
    ev->t_optim = 0.01;
    ev->t_idle = 0.04;
    ev->bubble = 0.001 * r;
    m[0].name = "step_ms";
    m[0].value = 500.0 * (double)s + (r == 1 ? 7 : 0); /* rank 1 differs from its peers */
    m[1].name = "mem_peak_bytes";
    m[1].value = 1000.0 + r;
    mp[0] = &m[0];
    mp[1] = &m[1];
    ev->metrics = mp;
    ev->n_metrics = 2;
}

static void send_report(worker_t *w, const char *job, uint32_t r, uint64_t s)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Metric m[2] = {CHORUS__METRIC__INIT, CHORUS__METRIC__INIT}, *mp[2];
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    fill_report(&ev, m, mp, r, s);
    ev.job_id = (char *)job;
    ev.generation = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

/* What workerd sends for ranks[] of one node at step s: full reports (detail) or summaries,
 * grouped where their figures agree as workerd/progress.c groups them. */
static void send_node_progress(worker_t *w, const char *job, const uint32_t *ranks, size_t n,
                               uint64_t s, int detail)
{
    Chorus__NodeProgress np = CHORUS__NODE_PROGRESS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__RankEvent ev[4], *evp[4];
    Chorus__Metric m[4][2], *mp[4][2];
    Chorus__RankSummary sum[4], *differ[4], common = CHORUS__RANK_SUMMARY__INIT;
    uint32_t same[4];
    cr_assert(n <= 4);
    np.job_id = (char *)job;
    np.generation = 1;
    np.total_steps = 10;
    for (size_t i = 0; i < n; i++) {
        chorus__rank_event__init(&ev[i]);
        chorus__metric__init(&m[i][0]);
        chorus__metric__init(&m[i][1]);
        fill_report(&ev[i], m[i], mp[i], ranks[i], s);
        if (detail) {
            evp[np.n_detail++] = &ev[i];
            continue;
        }
        chorus__rank_summary__init(&sum[i]);
        sum[i].rank = ranks[i];
        sum[i].step = s;
        sum[i].step_ms = m[i][0].value;
        sum[i].step_s = ev[i].step_s;
        sum[i].t_compute = ev[i].t_compute;
        if (ranks[i] == 1) { /* its step_ms differs: a summary of its own */
            differ[np.n_differ++] = &sum[i];
            continue;
        }
        common = sum[i];
        same[np.n_ranks++] = ranks[i];
    }
    np.detail = evp;
    np.differ = differ;
    np.ranks = same;
    if (np.n_ranks)
        np.common = &common;
    env.body_case = CHORUS__ENVELOPE__BODY_NODE_PROGRESS;
    env.node_progress = &np;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

static Chorus__Envelope *ctl_job_all_ranks(ch_client_t *ctl, const char *job)
{
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    q.job_id = (char *)job;
    q.all_ranks = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    cr_assert_eq(ch_client_call(ctl, &env, 2000, &resp), 0, "query %s", job);
    return resp;
}

#define JOB_TRAIN_2x1x2                                                                            \
    "[job]\nname = %s\n[model]\nlayers = 2\nheads = 4\n[parallel]\ntp = 2\npp = 1\ndp = 2\n"       \
    "[fault]\nmax_restarts = 0\n"

/* The ranks of job each of the two workers runs (by StartRanks), started. */
static void start_on(ch_client_t *ctl, worker_t **ws, const char *name, char *id,
                     uint32_t ranks[2][2])
{
    char ini[256];
    snprintf(ini, sizeof ini, JOB_TRAIN_2x1x2, name);
    start_4_ranks_of(ctl, ws, id, ini);
    Chorus__Envelope *e = ctl_job(ctl, id);
    for (int i = 0; i < 2; i++) {
        size_t k = 0;
        for (uint32_t r = 0; r < 4; r++)
            if (strcmp(e->job_info->ranks[r]->node, ws[i]->name) == 0)
                ranks[i][k++] = r;
        cr_assert_eq(k, 2);
    }
    ch_msg_free(e);
}

static int at_step(ch_client_t *ctl, worker_t **ws, const char *id, uint64_t s, int ms)
{
    uint64_t end = ch_now_ms() + (uint64_t)ms;
    for (;;) {
        Chorus__Envelope *e = ctl_job(ctl, id);
        int ok = e->job_info->n_ranks == 4;
        for (uint32_t r = 0; ok && r < 4; r++)
            ok = e->job_info->ranks[r]->step == s;
        ch_msg_free(e);
        if (ok || ch_now_ms() >= end)
            return ok;
        pump(ws, 4, 20);
    }
}

/* Job A's ranks report one event each, job B's nodes speak for theirs (NodeProgress: full
 * reports at step 1, summaries at step 2, rank 0 on its own as workerd sends it): status
 * shows the same for both. */
Test(coord, node_progress_shows_what_the_ranks_reports_showed)
{
    worker_t a, b, c2, d, *ws[4] = {&a, &b, &c2, &d};
    char ida[32], idb[32];
    uint32_t ra[2][2], rb[2][2];
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_on(ctl, ws, "a", ida, ra);
    wk_connect(&c2, "n3", 2, "r1", NULL, 0);
    wk_connect(&d, "n4", 2, "r1", NULL, 0);
    start_on(ctl, ws + 2, "b", idb, rb);
    for (uint64_t s = 1; s <= 2; s++) {
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 2; k++)
                send_report(ws[i], ida, ra[i][k], s);
        for (int i = 0; i < 2; i++) {
            uint32_t others[2];
            size_t n = 0;
            for (int k = 0; k < 2; k++) {
                if (rb[i][k] == 0)
                    send_report(ws[2 + i], idb, 0, s); /* rank 0 goes at once */
                else
                    others[n++] = rb[i][k];
            }
            send_node_progress(ws[2 + i], idb, others, n, s, s == 1);
        }
        cr_assert(at_step(ctl, ws, ida, s, 3000), "job a never reached step %lu", s);
        cr_assert(at_step(ctl, ws, idb, s, 3000), "job b never reached step %lu", s);
    }
    Chorus__Envelope *ea = ctl_job_all_ranks(ctl, ida), *eb = ctl_job_all_ranks(ctl, idb);
    const Chorus__JobInfo *ja = ea->job_info, *jb = eb->job_info;
    cr_assert_eq(ja->step, jb->step);
    cr_assert_float_eq(ja->loss, jb->loss, 1e-12);
    cr_assert_float_eq(ja->tokens_per_s, jb->tokens_per_s, 1e-9);
    cr_assert_float_eq(ja->bubble, jb->bubble, 1e-12);
    cr_assert_eq(ja->n_ranks, 4);
    cr_assert_eq(jb->n_ranks, 4);
    for (uint32_t r = 0; r < 4; r++) {
        const Chorus__RankInfo *x = ja->ranks[r], *y = jb->ranks[r];
        cr_assert_str_eq(x->state, y->state);
        cr_assert_eq(x->step, 2);
        cr_assert_eq(y->step, 2, "rank %u", r);
        cr_assert(x->time && y->time, "rank %u has no step time", r);
        const double *tx = &x->time->step_s, *ty = &y->time->step_s;
        cr_assert_float_eq(x->time->step_s, 1.0, 1e-12);
        for (int f = 0; f < 8; f++) /* StepTime's eight doubles, in order */
            cr_assert_float_eq(tx[f], ty[f], 1e-12, "rank %u field %d", r, f);
        cr_assert_eq(x->n_metrics, y->n_metrics, "rank %u", r);
        for (size_t k = 0; k < x->n_metrics; k++) {
            cr_assert_str_eq(x->metrics[k]->name, y->metrics[k]->name);
            cr_assert_float_eq(x->metrics[k]->value, y->metrics[k]->value, 1e-9, "rank %u %s", r,
                               x->metrics[k]->name);
        }
    }
    ch_msg_free(ea);
    ch_msg_free(eb);
    /* Every rank's detail was asked for: B's nodes are told to send full reports. */
    for (int i = 2; i < 4; i++) {
        Chorus__Envelope *e = take(ws, 4, ws[i], CHORUS__ENVELOPE__BODY_PROGRESS_DETAIL, 2000);
        cr_assert_not_null(e, "%s was not asked for detail", ws[i]->name);
        cr_assert_str_eq(e->progress_detail->job_id, idb);
        ch_msg_free(e);
    }
    ch_client_destroy(ctl);
    for (int i = 0; i < 4; i++)
        wk_close(ws[i]);
    coord_down();
}

/* What workerd sends for its ranks[] whose last nfig steps (up to step s) each took compute
 * 0.2 s, 0.3 s for rank slow: summaries carrying every step's figure (computes, tps). */
static void send_figures(worker_t *w, const char *job, const uint32_t *ranks, uint64_t s,
                         uint32_t nfig, uint32_t slow)
{
    Chorus__NodeProgress np = CHORUS__NODE_PROGRESS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__RankSummary sum[2], *differ[2] = {&sum[0], &sum[1]};
    float computes[2][16], tps[16];
    cr_assert(nfig <= 16);
    for (uint32_t f = 0; f < nfig; f++)
        tps[f] = 0.01f;
    for (int i = 0; i < 2; i++) {
        chorus__rank_summary__init(&sum[i]);
        for (uint32_t f = 0; f < nfig; f++)
            computes[i][f] = ranks[i] == slow ? 0.3f : 0.2f;
        sum[i].rank = ranks[i];
        sum[i].step = s;
        sum[i].step_s = computes[i][0] + 0.05;
        sum[i].t_compute = computes[i][0];
        sum[i].computes = computes[i];
        sum[i].n_computes = nfig;
        sum[i].tps = tps;
        sum[i].n_tps = nfig;
    }
    np.job_id = (char *)job;
    np.generation = 1;
    np.total_steps = 100;
    np.differ = differ;
    np.n_differ = 2;
    env.body_case = CHORUS__ENVELOPE__BODY_NODE_PROGRESS;
    env.node_progress = &np;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

/* Whether the job's ranks[0..n) reach step within 3 s (pumping both workers). */
static int ranks_at_step(ch_client_t *ctl, worker_t **ws, const char *id, const uint32_t *ranks,
                         uint32_t n, uint64_t step)
{
    int ready = 0;
    for (uint64_t end = ch_now_ms() + 3000; !ready && ch_now_ms() < end; pump(ws, 2, 20)) {
        Chorus__Envelope *e = ctl_job(ctl, id);
        uint32_t at = 0;
        for (size_t r = 0; r < e->job_info->n_ranks; r++)
            for (uint32_t i = 0; i < n; i++)
                at +=
                    e->job_info->ranks[r]->rank == ranks[i] && e->job_info->ranks[r]->step == step;
        ready = at == n;
        ch_msg_free(e);
    }
    return ready;
}

/* A node's report carries every step's compute figure since its last (RankSummary
 * computes): through the real apply path they fill the ranks' straggler windows, so a rank
 * 1.5x slower than its peers is named after two reports; one figure a report would leave
 * every window 10 figures short. */
Test(coord, node_progress_step_figures_reach_the_straggler_detector)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    uint32_t ranks[2][2];
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_on(ctl, ws, "s", id, ranks);
    int zero_on = ranks[0][0] == 0 || ranks[0][1] == 0 ? 0 : 1; /* rank 0's node judges */
    uint32_t slow = ranks[1 - zero_on][0];
    /* The peers' report is applied before rank 0's: rank 0's reports trigger the
     * judgement, and two links read in one loop turn come in either order. */
    send_figures(ws[1 - zero_on], id, ranks[1 - zero_on], 13, 13, slow);
    cr_assert(ranks_at_step(ctl, ws, id, ranks[1 - zero_on], 2, 13), "peers never at step 13");
    send_figures(ws[zero_on], id, ranks[zero_on], 13, 13, slow);
    uint32_t all[4] = {0, 1, 2, 3};
    cr_assert(ranks_at_step(ctl, ws, id, all, 4, 13), "never reached step 13");
    send_figures(ws[zero_on], id, ranks[zero_on], 14, 1, slow); /* rank 0 judges again */
    char want[64];
    snprintf(want, sizeof want, "rank %u on node %s: compute 0.300 s", slow, ws[1 - zero_on]->name);
    int named = 0;
    for (uint64_t end = ch_now_ms() + 3000; !named && ch_now_ms() < end;) {
        Chorus__Envelope *e = ctl_job(ctl, id);
        named = e->job_info->stragglers == 1 &&
                strncmp(e->job_info->straggler, want, strlen(want)) == 0;
        if (!named && ch_now_ms() + 20 >= end)
            cr_assert_fail("not named: %u stragglers, \"%s\"", e->job_info->stragglers,
                           e->job_info->straggler);
        ch_msg_free(e);
        pump(ws, 2, 20);
    }
    cr_assert(named);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* A running job's progress costs the store nothing per message: 80 steps of 4 ranks over
 * more than a second write at most its series blob and one row. */
Test(coord, progress_is_not_journaled_per_message)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char id[32];
    uint32_t ranks[2][2];
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r1", NULL, 0);
    ch_client_t *ctl = ctl_open();
    start_on(ctl, ws, "p", id, ranks);
    send_report(&a, id, ranks[0][0], 1); /* the first progress is stored */
    Chorus__Envelope *e = wait_state(ctl, ws, 2, id, "running", 2000);
    cr_assert(e != NULL);
    ch_msg_free(e);
    pump(ws, 2, 100);
    coord_store_stats_t s0, s1;
    coord_store_stats(H.c.store, &s0);
    uint64_t t0 = ch_now_ms();
    int msgs = 0;
    for (uint64_t s = 2; s < 82; s++) {
        for (int i = 0; i < 2; i++) {
            for (int k = 0; k < 2; k++) {
                send_report(ws[i], id, ranks[i][k], s);
                msgs++;
            }
        }
        pump(ws, 2, 15);
    }
    cr_assert(at_step(ctl, ws, id, 81, 3000), "the job never reached step 81");
    coord_store_stats(H.c.store, &s1);
    cr_assert_geq(ch_now_ms() - t0, 1000);
    cr_assert_leq(s1.writes - s0.writes, 2, "%d progress reports wrote the store %lu times", msgs,
                  (unsigned long)(s1.writes - s0.writes));
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}

/* Send one RankEvent of job id, generation 1, from w. */
static void send_ev(worker_t *w, Chorus__RankEvent *ev, const char *id, uint32_t rank)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev->job_id = (char *)id;
    ev->generation = 1;
    ev->rank = rank;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = ev;
    cr_assert_eq(ch_client_send(w->cl, &env), 0);
}

/* Ranks 1..5 of job id show step `step` in status: 1, or 0 after 2 s. */
static int ranks_at(ch_client_t *ctl, worker_t **ws, const char *id, uint64_t step)
{
    for (int tries = 0; tries < 100; tries++) {
        Chorus__Envelope *e = ctl_job(ctl, id);
        size_t at = 0;
        for (size_t r = 1; r < e->job_info->n_ranks; r++)
            at += e->job_info->ranks[r]->step == step;
        ch_msg_free(e);
        if (at == 5)
            return 1;
        pump(ws, 3, 20);
    }
    return 0;
}

/* tp 2 x dp 3 on three nodes (one TP group each): every rank computes alike, and node
 * n3's ranks spend tp_slow s per step in their TP all-reduces, the others 0.05 s. The
 * job's slow-node count and line once 14 steps are in. */
static uint32_t slow_tp_node(double tp_slow, char *line, size_t n)
{
    worker_t a = {0}, b = {0}, d = {0}, *ws[3] = {&a, &b, &d};
    char id[32] = "", msg[512] = "";
    coord_up();
    wk_connect(&a, "n1", 2, "r1", NULL, 0);
    wk_connect(&b, "n2", 2, "r2", NULL, 0);
    wk_connect(&d, "n3", 2, "r3", NULL, 0);
    ch_client_t *ctl = ctl_open();
    cr_assert_eq(ctl_submit(ctl, "[job]\nname = tpslow\n[parallel]\ntp = 2\ndp = 3\n", id,
                            sizeof id, msg, sizeof msg),
                 0, "%s", msg);
    worker_t *on[6] = {0};
    for (int i = 0; i < 3; i++) {
        Chorus__Envelope *e = take(ws, 3, ws[i], CHORUS__ENVELOPE__BODY_START_RANKS, 2000);
        cr_assert_not_null(e, "%s got StartRanks", ws[i]->name);
        for (size_t k = 0; k < e->start_ranks->n_ranks; k++)
            on[e->start_ranks->ranks[k]->rank] = ws[i];
        ch_msg_free(e);
    }
    for (uint32_t r = 0; r < 6; r++) {
        Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
        ev.kind = CHORUS__RANK_EVENT_KIND__RANK_STARTED;
        send_ev(on[r], &ev, id, r);
    }
    for (uint64_t step = 1; step <= 14; step++) {
        for (uint32_t k = 1; k <= 6; k++) {
            uint32_t r = k % 6; /* rank 0 last: its report judges the step */
            if (r == 0)         /* once the coordinator has the others' (other links) */
                cr_assert(ranks_at(ctl, ws, id, step), "step %llu never came in",
                          (unsigned long long)step);
            Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
            ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
            ev.step = step;
            ev.total_steps = 100;
            ev.t_compute = 0.3;
            ev.t_tp = on[r] == &d ? tp_slow : 0.05;
            ev.step_s = ev.t_compute + ev.t_tp;
            send_ev(on[r], &ev, id, r);
        }
    }
    Chorus__Envelope *e = NULL;
    for (int tries = 0; tries < 100; tries++) {
        pump(ws, 3, 20);
        e = ctl_job(ctl, id);
        size_t at = 0; /* every rank's last report taken in: rank 0's judged the last step */
        for (size_t r = 0; r < e->job_info->n_ranks; r++)
            at += e->job_info->ranks[r]->step == 14;
        if (at == 6)
            break;
        ch_msg_free(e);
        e = NULL;
    }
    cr_assert_not_null(e, "step 14 never showed");
    uint32_t count = e->job_info->slow_nodes;
    snprintf(line, n, "%s", e->job_info->slow_node ? e->job_info->slow_node : "");
    cr_expect_eq(e->job_info->stragglers, 0, "a compute straggler: %s", e->job_info->straggler);
    ch_msg_free(e);
    /* the metric and the page's heat map say the same */
    static char page[1 << 18];
    char want[128];
    http_get("/metrics", page, sizeof page);
    snprintf(want, sizeof want,
             "chorus_job_slow_collective_nodes{job_id=\"%s\",name=\"tpslow\"} %u\n", id, count);
    cr_expect(strstr(page, want), "no %s", want);
    snprintf(want, sizeof want, "/jobs/%s", id);
    http_get(want, page, sizeof page);
    cr_expect(count ? strstr(page, "slow collectives: node n3") != NULL
                    : strstr(page, "slow collectives") == NULL,
              "the page's slow line");
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    wk_close(&d);
    coord_down();
    return count;
}

Test(coord, node_with_slow_tensor_parallel_allreduces_is_named)
{
    char line[256];
    cr_assert_eq(slow_tp_node(0.2, line, sizeof line), 1, "%s", line);
    cr_assert(strstr(line, "node n3: tensor-parallel all-reduces 0.200 s, 4.00x the other 2 "
                           "nodes' median (3rd fastest of 12 steps)"),
              "%s", line);
}

Test(coord, calm_nodes_are_not_named_slow)
{
    char line[256];
    cr_assert_eq(slow_tp_node(0.05, line, sizeof line), 0, "%s", line);
    cr_assert_str_eq(line, "");
}

/* State of node name in the registry ("" when not listed). */
static void ctl_node_state(ch_client_t *ctl, const char *name, char *out, size_t len)
{
    Chorus__Envelope *resp = ctl_nodes(ctl);
    out[0] = '\0';
    for (size_t i = 0; i < resp->node_list->n_nodes; i++)
        if (strcmp(resp->node_list->nodes[i]->name, name) == 0)
            snprintf(out, len, "%s", resp->node_list->nodes[i]->state);
    ch_msg_free(resp);
}

/* A node that only reports progress (a NodeProgress every 100 ms, no Heartbeat) stays alive
 * past dead-after (1 s): any message counts as its heartbeat. A silent one beside it is
 * alive until dead-after and dead after it, as before. */
Test(coord, node_progress_counts_as_heartbeat)
{
    worker_t a, b, *ws[2] = {&a, &b};
    char st[16];
    coord_up();
    wk_connect(&a, "n1", 2, "", NULL, 0);
    uint64_t quiet_since = ch_now_ms(); /* n2's Register, its last message, goes after it */
    wk_connect(&b, "n2", 2, "", NULL, 0);
    a.silent = b.silent = 1; /* neither sends a Heartbeat from here on */
    ch_client_t *ctl = ctl_open();
    const uint32_t ranks[1] = {1};
    while (ch_now_ms() - quiet_since < 2500) {
        /* of no job it runs: dropped as progress, but it came from n1 */
        send_node_progress(&a, "nojob", ranks, 1, 1, 0);
        pump(ws, 2, 100);
        ctl_node_state(ctl, "n2", st, sizeof st);
        /* the answer left the coordinator before now: n2 was silent less than dead-after */
        if (ch_now_ms() - quiet_since < (uint64_t)H.cfg.dead_after_ms)
            cr_assert_str_eq(st, "alive", "n2 was declared %s before dead-after", st);
    }
    ctl_node_state(ctl, "n1", st, sizeof st);
    cr_assert_str_eq(st, "alive", "a node sending only NodeProgress was declared %s", st);
    ctl_node_state(ctl, "n2", st, sizeof st);
    cr_assert_str_eq(st, "dead", "a silent node is %s 2.5 s after its last message", st);
    ch_client_destroy(ctl);
    wk_close(&a);
    wk_close(&b);
    coord_down();
}
