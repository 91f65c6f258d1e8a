/* Makes the binary seeds in tests/fuzz/corpus with Chorus's own writers, so they are
 * exactly what the product writes:
 *
 *   fuzz-mkseeds DIR   writes DIR/frame, DIR/safetensors, DIR/tokens, DIR/coord and
 *                      DIR/agent
 *
 * Output is deterministic (fixed key, nonces and contents). Text seeds (job files, INI,
 * JSON, daemon configs) are written by hand in the corpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/frame.h"
#include "common/msg.h"
#include "common/safetensors.h"
#include "common/tokens.h"
#include "common/util.h"
#include "fuzz.h"

// ----------------------------------------------------------------------------
// frames

typedef struct stream {
    uint8_t buf[16384];
    size_t len;
} stream_t;

/* Append env as one frame; s NULL: untagged (handshake). */
static void put(stream_t *st, ch_session_t *s, Chorus__Envelope *env)
{
    uint8_t *f = NULL;
    size_t n = 0;
    FUZZ_ASSERT(ch_msg_encode(s, env, &f, &n) == 0);
    FUZZ_ASSERT(st->len + n <= sizeof st->buf);
    memcpy(st->buf + st->len, f, n);
    st->len += n;
    free(f);
}

static void save(const char *dir, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FUZZ_ASSERT(ch_file_write_atomic(path, data, len, 0644) == 0);
}

static void frames(const char *dir)
{
    ch_session_t client, server;
    stream_t *st = calloc(1, sizeof *st);
    FUZZ_ASSERT(st != NULL);
    fuzz_keyed_pair(&client, &server);

    /* The handshake as the client sends it: untagged. */
    uint8_t nonce[CH_NONCE_LEN], proof[CH_PROOF_LEN];
    memset(nonce, 0x11, sizeof nonce);
    memset(proof, 0x22, sizeof proof);
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__AuthHello hello = CHORUS__AUTH_HELLO__INIT;
    hello.nonce.data = nonce;
    hello.nonce.len = sizeof nonce;
    hello.role = "worker";
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &hello;
    put(st, NULL, &env);
    Chorus__AuthProof pr = CHORUS__AUTH_PROOF__INIT;
    pr.proof.data = proof;
    pr.proof.len = sizeof proof;
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_PROOF;
    env.auth_proof = &pr;
    put(st, NULL, &env);
    save(dir, "handshake.bin", st->buf, st->len);

    /* A worker's first keyed frames: register (re-adopting a rank), heartbeat, events. */
    st->len = 0;
    Chorus__RankRef ref = CHORUS__RANK_REF__INIT;
    ref.job_id = "j-000001";
    ref.generation = 2;
    ref.rank = 3;
    ref.pid = 4242;
    Chorus__RankRef *running[] = {&ref};
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    reg.name = "node-a";
    reg.slots = 8;
    reg.rack = "r1";
    reg.device = "cpu";
    reg.n_running = 1;
    reg.running = running;
    env = (Chorus__Envelope)CHORUS__ENVELOPE__INIT;
    env.request_id = 7;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    put(st, &client, &env);
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    hb.time_ms = 1700000000123ull;
    hb.free_slots = 5;
    env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    put(st, &client, &env);
    Chorus__Metric m1 = CHORUS__METRIC__INIT, m2 = CHORUS__METRIC__INIT;
    m1.name = "gflops";
    m1.value = 812.5;
    m2.name = "busbw.dp.allreduce";
    m2.value = 11.25;
    Chorus__Metric *metrics[] = {&m1, &m2};
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = "j-000001";
    ev.generation = 2;
    ev.rank = 3;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = 120;
    ev.total_steps = 300;
    ev.loss = 3.25;
    ev.tokens_per_s = 51234.5;
    ev.n_metrics = 2;
    ev.metrics = metrics;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    put(st, &client, &env);
    uint8_t value[40];
    memset(value, 0x5a, sizeof value);
    Chorus__KvSet kv = CHORUS__KV_SET__INIT;
    kv.job_id = "j-000001";
    kv.generation = 2;
    kv.key = "ucx.addr.3";
    kv.value.data = value;
    kv.value.len = sizeof value;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
    env.kv_set = &kv;
    put(st, &client, &env);
    save(dir, "worker-keyed.bin", st->buf, st->len);

    /* chorusctl over the Unix socket (plain session: zero tags): submit a job. */
    st->len = 0;
    ch_session_t plain;
    ch_session_init_plain(&plain, 0);
    Chorus__Submit sub = CHORUS__SUBMIT__INIT;
    sub.job_ini = "[job]\nname = demo\nkind = train\n\n[model]\nlayers = 4\nheads = 4\n";
    env = (Chorus__Envelope)CHORUS__ENVELOPE__INIT;
    env.request_id = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    put(st, &plain, &env);
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    env.request_id = 2;
    env.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    env.list_jobs = &lj;
    put(st, &plain, &env);
    save(dir, "ctl-plain.bin", st->buf, st->len);
    free(st);
}

// ----------------------------------------------------------------------------
// safetensors and tokens

static void safetensors(const char *dir)
{
    static float wte[8 * 4], ln[4];
    static uint16_t half[6];
    static int32_t ids[3] = {1, 2, 3};
    for (size_t i = 0; i < sizeof wte / sizeof wte[0]; i++)
        wte[i] = 0.01f * (float)i - 0.1f;
    for (size_t i = 0; i < 4; i++)
        ln[i] = 1.0f;
    for (size_t i = 0; i < 6; i++)
        half[i] = (uint16_t)(0x3c00 + i); /* F16 1.0 and just above */
    char path[1024];
    ch_st_writer_t *w = NULL;
    char err[256];

    snprintf(path, sizeof path, "%s/gpt2-tiny.safetensors", dir);
    FUZZ_ASSERT(ch_st_writer_create(path, &w) == 0);
    uint64_t s_wte[] = {8, 4}, s_ln[] = {4}, s_half[] = {2, 3}, s_ids[] = {3};
    FUZZ_ASSERT(ch_st_writer_meta(w, "format", "pt") == 0);
    FUZZ_ASSERT(ch_st_writer_meta(w, "chorus.step", "120") == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "wte.weight", CH_ST_F32, 2, s_wte, wte) == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "h.0.ln_1.weight", CH_ST_F32, 1, s_ln, ln) == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "h.0.attn.bias", CH_ST_F16, 2, s_half, half) == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "ids", CH_ST_I32, 1, s_ids, ids) == 0);
    FUZZ_ASSERT(ch_st_writer_finish(w, NULL, NULL, err, sizeof err) == 0);

    snprintf(path, sizeof path, "%s/scalar-bf16.safetensors", dir);
    FUZZ_ASSERT(ch_st_writer_create(path, &w) == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "scale", CH_ST_BF16, 0, NULL, half) == 0);
    FUZZ_ASSERT(ch_st_writer_add(w, "empty", CH_ST_F64, 1, (uint64_t[]){0}, ln) == 0);
    FUZZ_ASSERT(ch_st_writer_finish(w, NULL, NULL, err, sizeof err) == 0);
}

static void tokens(const char *dir)
{
    uint16_t tok[96];
    for (size_t i = 0; i < 96; i++)
        tok[i] = (uint16_t)((i * 7919u) % 50257u);
    char path[1024];
    snprintf(path, sizeof path, "%s/llmc.bin", dir);
    FUZZ_ASSERT(ch_tokens_write(path, tok, 96) == 0);
    save(dir, "raw.bin", tok, 64); /* nanoGPT-style bare uint16 array, 32 tokens */
}

// ----------------------------------------------------------------------------
// message sequences for the handlers (fuzz_coord.c, fuzz_agent.c; records as in fuzz.h)

enum { W0 = 0, W1 = 1, ROOT = 2, USER = 3, TCP = 4, CLOSE = 5, TICK = 6 };

typedef struct seq {
    uint8_t buf[16384];
    size_t len;
    uint64_t rid;
} seq_t;

static void msg(seq_t *q, uint8_t op, Chorus__Envelope *env)
{
    env->request_id = ++q->rid;
    fuzz_put_msg(q->buf, sizeof q->buf, &q->len, op, env);
}

static void op_only(seq_t *q, uint8_t op)
{
    fuzz_put_msg(q->buf, sizeof q->buf, &q->len, op, NULL);
}

static void reg(seq_t *q, uint8_t op, const char *name, uint32_t slots, Chorus__RankRef **running,
                size_t n_running, Chorus__RankRef **finished, size_t n_finished)
{
    Chorus__Register r = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    r.name = (char *)name;
    r.slots = slots;
    r.rack = "r1";
    r.device = "cpu";
    r.running = running;
    r.n_running = n_running;
    r.finished = finished;
    r.n_finished = n_finished;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &r;
    msg(q, op, &env);
}

static void heartbeat(seq_t *q, uint8_t op)
{
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    hb.time_ms = 1700000000000ull;
    hb.free_slots = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    msg(q, op, &env);
}

static void submit(seq_t *q, uint8_t op, const char *ini)
{
    Chorus__Submit sub = CHORUS__SUBMIT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    sub.job_ini = (char *)ini;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    msg(q, op, &env);
}

static void event(seq_t *q, uint8_t op, const char *job, uint64_t gen, uint32_t rank, int kind,
                  uint64_t step)
{
    Chorus__Metric m = CHORUS__METRIC__INIT, *mp = &m;
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    m.name = "step_ms";
    m.value = 12.5;
    ev.job_id = (char *)job;
    ev.generation = gen;
    ev.rank = rank;
    ev.kind = kind;
    ev.step = step;
    ev.total_steps = 100;
    ev.loss = 2.5;
    ev.tokens_per_s = 1000;
    if (kind == CHORUS__RANK_EVENT_KIND__RANK_PROGRESS) {
        ev.n_metrics = 1;
        ev.metrics = &mp;
    }
    if (kind == CHORUS__RANK_EVENT_KIND__RANK_FAILED) {
        ev.message = "collective timeout";
        ev.timeout_group = "dp";
        ev.timeout_peer = 1;
    }
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = &ev;
    msg(q, op, &env);
}

static void by_job(seq_t *q, uint8_t op, int body, const char *job, uint32_t rank)
{
    Chorus__JobQuery jq = CHORUS__JOB_QUERY__INIT;
    Chorus__Cancel can = CHORUS__CANCEL__INIT;
    Chorus__KillRank kr = CHORUS__KILL_RANK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = body;
    if (body == CHORUS__ENVELOPE__BODY_JOB_QUERY) {
        jq.job_id = (char *)job;
        env.job_query = &jq;
    } else if (body == CHORUS__ENVELOPE__BODY_CANCEL) {
        can.job_id = (char *)job;
        env.cancel = &can;
    } else {
        kr.job_id = (char *)job;
        kr.rank = rank;
        env.kill_rank = &kr;
    }
    msg(q, op, &env);
}

static void listing(seq_t *q, uint8_t op, int body)
{
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = body;
    if (body == CHORUS__ENVELOPE__BODY_LIST_NODES)
        env.list_nodes = &ln;
    else
        env.list_jobs = &lj;
    msg(q, op, &env);
}

static void kv(seq_t *q, uint8_t op, int get, const char *job, uint64_t gen, const char *key)
{
    Chorus__KvSet ks = CHORUS__KV_SET__INIT;
    Chorus__KvGet kg = CHORUS__KV_GET__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint8_t val[16] = "ucx-address-0001";
    if (get) {
        kg.job_id = (char *)job;
        kg.generation = gen;
        kg.key = (char *)key;
        kg.timeout_ms = 500;
        env.body_case = CHORUS__ENVELOPE__BODY_KV_GET;
        env.kv_get = &kg;
    } else {
        ks.job_id = (char *)job;
        ks.generation = gen;
        ks.key = (char *)key;
        ks.value.data = val;
        ks.value.len = sizeof val;
        env.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
        env.kv_set = &ks;
    }
    msg(q, op, &env);
}

static void forget(seq_t *q, uint8_t op, const char *name)
{
    Chorus__ForgetNode f = CHORUS__FORGET_NODE__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    f.name = (char *)name;
    env.body_case = CHORUS__ENVELOPE__BODY_FORGET_NODE;
    env.forget_node = &f;
    msg(q, op, &env);
}

static const char DP2[] = "[job]\nname = fz\nkind = diag\n[parallel]\ndp = 2\n"
                          "[fault]\nmax_restarts = 1\nstep_timeout = 1\n";

/* A 2-rank job on two nodes through its whole life: events of every kind from both
 * links (only the placed node's count), rendezvous, queries, a restart, completion. */
static void coord_run(const char *dir)
{
    seq_t *q = calloc(1, sizeof *q);
    FUZZ_ASSERT(q != NULL);
    reg(q, W0, "n1", 1, NULL, 0, NULL, 0);
    reg(q, W1, "n2", 1, NULL, 0, NULL, 0);
    submit(q, ROOT, DP2);
    for (uint8_t w = W0; w <= W1; w++)
        for (uint32_t r = 0; r < 2; r++)
            event(q, w, "j1", 1, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0);
    kv(q, W0, 0, "j1", 1, "rank0/ucx");
    kv(q, W1, 1, "j1", 1, "rank0/ucx");
    kv(q, W1, 1, "j1", 1, "rank1/ucx");
    for (uint8_t w = W0; w <= W1; w++)
        for (uint32_t r = 0; r < 2; r++) {
            event(q, w, "j1", 1, r, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS, 5);
            event(q, w, "j1", 1, r, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT, 5);
        }
    heartbeat(q, W0);
    heartbeat(q, W1);
    listing(q, TCP, CHORUS__ENVELOPE__BODY_LIST_JOBS);
    by_job(q, USER, CHORUS__ENVELOPE__BODY_JOB_QUERY, "j1", 0);
    event(q, W1, "j1", 1, 1, CHORUS__RANK_EVENT_KIND__RANK_FAILED, 6);
    event(q, W1, "j1", 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 1);
    event(q, W0, "j1", 1, 0, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0);
    event(q, W0, "j1", 1, 1, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0);
    for (uint8_t w = W0; w <= W1; w++)
        for (uint32_t r = 0; r < 2; r++) {
            event(q, w, "j1", 2, r, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0);
            event(q, w, "j1", 2, r, CHORUS__RANK_EVENT_KIND__RANK_DONE, 9);
            event(q, w, "j1", 2, r, CHORUS__RANK_EVENT_KIND__RANK_EXITED, 0);
        }
    by_job(q, ROOT, CHORUS__ENVELOPE__BODY_JOB_QUERY, "fz", 0);
    listing(q, ROOT, CHORUS__ENVELOPE__BODY_LIST_NODES);
    save(dir, "run-restart-complete.bin", q->buf, q->len);
    free(q);
}

/* Control: submits from every kind of client, refusals, cancel and kill of another
 * user's job, more jobs than memory keeps, forgetting nodes. */
static void coord_control(const char *dir)
{
    seq_t *q = calloc(1, sizeof *q);
    FUZZ_ASSERT(q != NULL);
    reg(q, W0, "n1", 2, NULL, 0, NULL, 0);
    submit(q, USER, DP2);
    submit(q, ROOT, "[job]\nname = q\nkind = diag\n");
    submit(q, TCP,
           "[job]\nname = t\nkind = train\n[model]\nlayers = 2\nembd = 64\nheads = 2\n"
           "vocab = 256\nseq_len = 32\n[train]\nsteps = 10\n");
    submit(q, ROOT, "[job]\nname = bad\n[model]\nvocab = 4294967295\n");
    submit(q, ROOT, "");
    by_job(q, USER, CHORUS__ENVELOPE__BODY_CANCEL, "j2", 0);
    by_job(q, ROOT, CHORUS__ENVELOPE__BODY_KILL_RANK, "j1", 1);
    by_job(q, USER, CHORUS__ENVELOPE__BODY_CANCEL, "j1", 0);
    for (int i = 0; i < 6; i++) {
        submit(q, ROOT, "[job]\nname = many\nkind = diag\n");
        by_job(q, ROOT, CHORUS__ENVELOPE__BODY_CANCEL, "many", 0);
    }
    by_job(q, TCP, CHORUS__ENVELOPE__BODY_JOB_QUERY, "j4", 0);
    listing(q, ROOT, CHORUS__ENVELOPE__BODY_LIST_JOBS);
    forget(q, ROOT, "n1");
    op_only(q, CLOSE + 8 * W0);
    op_only(q, TICK + 8 * 8);
    forget(q, ROOT, "n1");
    listing(q, USER, CHORUS__ENVELOPE__BODY_LIST_NODES);
    save(dir, "control.bin", q->buf, q->len);
    free(q);
}

/* Identities: a second name on one link, a live name taken by another link, a node
 * that dies (time passes) and comes back reporting running and finished ranks. */
static void coord_nodes(const char *dir)
{
    seq_t *q = calloc(1, sizeof *q);
    FUZZ_ASSERT(q != NULL);
    Chorus__RankRef run = CHORUS__RANK_REF__INIT, fin = CHORUS__RANK_REF__INIT;
    Chorus__RankRef *runp = &run, *finp = &fin;
    run.job_id = fin.job_id = "j1";
    run.generation = fin.generation = 1;
    run.rank = 0;
    run.pid = 4242;
    fin.rank = 1;
    fin.done = 1;
    reg(q, W0, "n1", 2, NULL, 0, NULL, 0);
    reg(q, W0, "n2", 2, NULL, 0, NULL, 0);
    reg(q, W1, "n1", 2, NULL, 0, NULL, 0);
    submit(q, ROOT, DP2);
    event(q, W0, "j1", 1, 0, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0);
    event(q, W0, "j1", 1, 1, CHORUS__RANK_EVENT_KIND__RANK_STARTED, 0);
    op_only(q, TICK + 8 * 6);
    op_only(q, CLOSE + 8 * W0);
    reg(q, W1, "n1", 2, &runp, 1, &finp, 1);
    op_only(q, TICK + 8 * 2);
    heartbeat(q, W1);
    by_job(q, ROOT, CHORUS__ENVELOPE__BODY_JOB_QUERY, "j1", 0);
    op_only(q, TICK + 8 * 31);
    op_only(q, TICK + 8 * 31);
    listing(q, ROOT, CHORUS__ENVELOPE__BODY_LIST_NODES);
    save(dir, "identities.bin", q->buf, q->len);
    free(q);
}

/* What a coordinator sends a worker. */
static void agent_seeds(const char *dir)
{
    seq_t *q = calloc(1, sizeof *q);
    FUZZ_ASSERT(q != NULL);
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__RegisterAck ack = CHORUS__REGISTER_ACK__INIT;
    ack.heartbeat_ms = 100;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER_ACK;
    env.register_ack = &ack;
    msg(q, 0, &env);
    Chorus__RankAssign ra[2] = {CHORUS__RANK_ASSIGN__INIT, CHORUS__RANK_ASSIGN__INIT};
    Chorus__RankAssign *rap[2] = {&ra[0], &ra[1]};
    ra[1].rank = 1;
    ra[1].local_rank = 1;
    Chorus__StartRanks sr = CHORUS__START_RANKS__INIT;
    sr.job_id = "j1";
    sr.generation = 1;
    sr.world_size = 2;
    sr.local_world_size = 2;
    sr.job_ini = (char *)DP2;
    sr.n_ranks = 2;
    sr.ranks = rap;
    env.body_case = CHORUS__ENVELOPE__BODY_START_RANKS;
    env.start_ranks = &sr;
    msg(q, 6, &env);
    sr.generation = 2;
    sr.resume_step = 5;
    msg(q, 0, &env);
    uint32_t kill[1] = {1};
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    kr.job_id = "j1";
    kr.generation = 2;
    kr.reason = "cancelled";
    kr.n_ranks = 1;
    kr.ranks = kill;
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    msg(q, 0, &env);
    Chorus__RankExitAck xa = CHORUS__RANK_EXIT_ACK__INIT;
    xa.job_id = "j1";
    xa.generation = 2;
    xa.rank = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK;
    env.rank_exit_ack = &xa;
    msg(q, 6, &env);
    Chorus__KvReply kv = CHORUS__KV_REPLY__INIT;
    kv.code = -110;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_REPLY;
    env.kv_reply = &kv;
    msg(q, 0, &env);
    Chorus__Error e = CHORUS__ERROR__INIT;
    e.code = -1;
    e.message = "register: node name fuzz-node is in use by a live link";
    env.body_case = CHORUS__ENVELOPE__BODY_ERROR;
    env.error = &e;
    msg(q, 0, &env);
    sr.job_id = "../../etc";
    env.body_case = CHORUS__ENVELOPE__BODY_START_RANKS;
    env.start_ranks = &sr;
    msg(q, 0, &env);
    save(dir, "coordinator-says.bin", q->buf, q->len);
    free(q);
}

static void subdir(char *out, size_t len, const char *root, const char *name)
{
    snprintf(out, len, "%s/%s", root, name);
    FUZZ_ASSERT(ch_mkdirs(out, 0755) == 0);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    char dir[512];
    subdir(dir, sizeof dir, argv[1], "frame");
    frames(dir);
    subdir(dir, sizeof dir, argv[1], "safetensors");
    safetensors(dir);
    subdir(dir, sizeof dir, argv[1], "tokens");
    tokens(dir);
    subdir(dir, sizeof dir, argv[1], "coord");
    coord_run(dir);
    coord_control(dir);
    coord_nodes(dir);
    subdir(dir, sizeof dir, argv[1], "agent");
    agent_seeds(dir);
    return 0;
}
