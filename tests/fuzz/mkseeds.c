/* Makes the binary seeds in tests/fuzz/corpus with Chorus's own writers, so they are
 * exactly what the product writes:
 *
 *   fuzz-mkseeds DIR   writes DIR/frame, DIR/safetensors and DIR/tokens
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
    return 0;
}
