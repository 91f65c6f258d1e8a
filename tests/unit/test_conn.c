/* Links end to end: a libuv server on its own thread, ch_client and raw sockets as
 * peers. Each bad peer must lose only its own link, with the right reason, and the
 * server must go on serving a good client afterwards. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/auth.h"
#include "common/client.h"
#include "common/conn.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/msg.h"

#define MAX_CONNS 32
#define WAIT_MS   5000

/* ---------------------------------------------------------------- test server */

typedef struct srv {
    uv_loop_t loop;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    int has_pipe;
    uv_async_t stop;
    pthread_t thread;
    ch_key_t key;
    int keyed;
    uint32_t hs_timeout_ms;
    int cork; /* srv_msg corks its replies to a request into one write */
    int port;
    char sock_path[256];
    ch_conn_t *conns[MAX_CONNS];

    /* Shared with the test thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int closes, readies, msgs;
    int last_reason;
    char last_role[32];
    pid_t last_pid;
    const char *failed; /* first failed check on the server thread */
} srv_t;

/* Criterion asserts may only run on the test thread: the server records failures and
 * srv_stop reports them. */
#define SRV_CHECK(s, cond)                                                                         \
    do {                                                                                           \
        if (!(cond))                                                                               \
            srv_failed(s, #cond);                                                                  \
    } while (0)

static void srv_failed(srv_t *s, const char *what)
{
    pthread_mutex_lock(&s->mu);
    if (!s->failed)
        s->failed = what;
    pthread_mutex_unlock(&s->mu);
}

static void srv_track(srv_t *s, ch_conn_t *c, int add)
{
    for (int i = 0; i < MAX_CONNS; i++) {
        if (add ? s->conns[i] == NULL : s->conns[i] == c) {
            s->conns[i] = add ? c : NULL;
            return;
        }
    }
}

static void srv_ready(ch_conn_t *c, void *ud)
{
    srv_t *s = ud;
    pthread_mutex_lock(&s->mu);
    s->readies++;
    snprintf(s->last_role, sizeof s->last_role, "%s", ch_conn_role(c));
    pid_t pid = 0;
    if (ch_conn_peer_cred(c, &pid, NULL, NULL) == 0)
        s->last_pid = pid;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Echo server: every request gets an unsolicited heartbeat first (ch_client_call must
 * skip it), then an Ok carrying the request id, or an Error for a Cancel. */
static void srv_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    srv_t *s = ud;
    pthread_mutex_lock(&s->mu);
    s->msgs++;
    pthread_mutex_unlock(&s->mu);
    if (s->cork)
        ch_conn_cork(c);

    Chorus__Envelope noise = CHORUS__ENVELOPE__INIT;
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    noise.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    noise.heartbeat = &hb;
    SRV_CHECK(s, ch_conn_send(c, &noise) == 0);

    Chorus__Envelope rep = CHORUS__ENVELOPE__INIT;
    Chorus__Ok ok = CHORUS__OK__INIT;
    Chorus__Error err = CHORUS__ERROR__INIT;
    rep.request_id = env->request_id;
    if (env->body_case == CHORUS__ENVELOPE__BODY_CANCEL) {
        err.code = CH_E_NOTFOUND;
        err.message = "no such job";
        rep.body_case = CHORUS__ENVELOPE__BODY_ERROR;
        rep.error = &err;
    } else {
        rep.body_case = CHORUS__ENVELOPE__BODY_OK;
        rep.ok = &ok;
    }
    SRV_CHECK(s, ch_conn_send(c, &rep) == 0);
    /* KillRank: answer, then hang up at once; the queued replies must still go out. */
    if (env->body_case == CHORUS__ENVELOPE__BODY_KILL_RANK)
        ch_conn_close(c); /* corked or not */
    else if (s->cork)
        SRV_CHECK(s, ch_conn_uncork(c) == 0);
}

static void srv_closed(ch_conn_t *c, int reason, void *ud)
{
    srv_t *s = ud;
    srv_track(s, c, 0);
    pthread_mutex_lock(&s->mu);
    s->closes++;
    s->last_reason = reason;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static const ch_conn_cbs_t srv_cbs = {srv_ready, srv_msg, srv_closed};

static void srv_opts(srv_t *s, ch_conn_opts_t *o, int keyed)
{
    memset(o, 0, sizeof *o);
    o->key = keyed ? &s->key : NULL;
    o->is_server = 1;
    o->max_frame = 1u << 20;
    o->handshake_timeout_ms = s->hs_timeout_ms;
}

static void on_tcp_conn(uv_stream_t *server, int status)
{
    srv_t *s = server->data;
    SRV_CHECK(s, status == 0);
    ch_conn_opts_t o;
    srv_opts(s, &o, s->keyed);
    ch_conn_t *c = NULL;
    SRV_CHECK(s, ch_conn_accept(&s->loop, server, &o, &srv_cbs, s, &c) == 0);
    srv_track(s, c, 1);
}

static void on_pipe_conn(uv_stream_t *server, int status)
{
    srv_t *s = server->data;
    SRV_CHECK(s, status == 0);
    ch_conn_opts_t o;
    srv_opts(s, &o, 0); /* control socket: SO_PEERCRED instead of a key */
    ch_conn_t *c = NULL;
    SRV_CHECK(s, ch_conn_accept(&s->loop, server, &o, &srv_cbs, s, &c) == 0);
    srv_track(s, c, 1);
}

static void on_stop(uv_async_t *a)
{
    srv_t *s = a->data;
    for (int i = 0; i < MAX_CONNS; i++) {
        if (s->conns[i])
            ch_conn_close(s->conns[i]);
    }
    uv_close((uv_handle_t *)&s->tcp, NULL);
    if (s->has_pipe)
        uv_close((uv_handle_t *)&s->pipe, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *srv_main(void *arg)
{
    srv_t *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Listen on 127.0.0.1:0 (and optionally a Unix socket); srv_run starts the thread. */
static srv_t *srv_init(int keyed, int with_pipe)
{
    srv_t *s = calloc(1, sizeof *s);
    cr_assert_not_null(s);
    cr_assert_eq(ch_auth_global_init(), 0);
    for (int i = 0; i < CH_KEY_LEN; i++)
        s->key.bytes[i] = (uint8_t)(i * 13 + 5);
    s->keyed = keyed;
    s->hs_timeout_ms = 500;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    cr_assert_eq(uv_loop_init(&s->loop), 0);
    cr_assert_eq(uv_async_init(&s->loop, &s->stop, on_stop), 0);
    s->stop.data = s;

    cr_assert_eq(uv_tcp_init(&s->loop, &s->tcp), 0);
    s->tcp.data = s;
    struct sockaddr_in sa;
    cr_assert_eq(uv_ip4_addr("127.0.0.1", 0, &sa), 0);
    cr_assert_eq(uv_tcp_bind(&s->tcp, (struct sockaddr *)&sa, 0), 0);
    cr_assert_eq(uv_listen((uv_stream_t *)&s->tcp, 16, on_tcp_conn), 0);
    struct sockaddr_in bound;
    int n = sizeof bound;
    cr_assert_eq(uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&bound, &n), 0);
    s->port = ntohs(bound.sin_port);

    if (with_pipe) {
        const char *base = getenv("CHORUS_TEST_TMP");
        if (!base || !*base)
            base = "/tmp";
        mkdir(base, 0700);
        snprintf(s->sock_path, sizeof s->sock_path, "%s/test_conn.%d.sock", base, (int)getpid());
        unlink(s->sock_path);
        cr_assert_eq(uv_pipe_init(&s->loop, &s->pipe, 0), 0);
        s->pipe.data = s;
        s->has_pipe = 1;
        cr_assert_eq(uv_pipe_bind(&s->pipe, s->sock_path), 0);
        cr_assert_eq(uv_listen((uv_stream_t *)&s->pipe, 16, on_pipe_conn), 0);
    }
    return s;
}

static void srv_run(srv_t *s)
{
    cr_assert_eq(pthread_create(&s->thread, NULL, srv_main, s), 0);
}

static srv_t *srv_start(int keyed, int with_pipe)
{
    srv_t *s = srv_init(keyed, with_pipe);
    srv_run(s);
    return s;
}

/* Stop, join, and check that nothing was left open on the loop. */
static void srv_stop(srv_t *s)
{
    uv_async_send(&s->stop);
    pthread_join(s->thread, NULL);
    cr_assert_eq(uv_loop_close(&s->loop), 0, "server loop left handles open");
    cr_assert_null(s->failed, "server check failed: %s", s->failed);
    if (s->has_pipe)
        unlink(s->sock_path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Wait until the server has seen n closes; returns the last close reason. */
static int srv_wait_closes(srv_t *s, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&s->mu);
    while (s->closes < n) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0)
            break;
    }
    int got = s->closes, reason = s->last_reason;
    pthread_mutex_unlock(&s->mu);
    cr_assert_geq(got, n, "server saw %d closes, wanted %d", got, n);
    return reason;
}

/* ---------------------------------------------------------------- peers */

static ch_client_t *good_client(srv_t *s)
{
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", s->port);
    ch_client_t *c = NULL;
    cr_assert_eq(ch_client_connect_tcp(hp, &s->key, "ctl", WAIT_MS, &c), 0);
    return c;
}

static void roundtrip(ch_client_t *c)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    Chorus__Envelope *resp = NULL;
    cr_assert_eq(ch_client_call(c, &req, WAIT_MS, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_OK);
    cr_assert_eq(resp->request_id, req.request_id);
    ch_msg_free(resp);
}

/* The server is still healthy: a fresh good client completes a call. */
static void assert_still_serving(srv_t *s)
{
    ch_client_t *c = good_client(s);
    roundtrip(c);
    ch_client_destroy(c);
}

static int raw_connect(srv_t *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa;
    cr_assert_eq(uv_ip4_addr("127.0.0.1", s->port, &sa), 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = WAIT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void raw_write(int fd, const void *p, size_t n)
{
    cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* The server hung up: reads reach EOF (or a reset) before the receive timeout. */
static void assert_hung_up(int fd)
{
    uint8_t buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return;
        cr_assert_gt(n, 0, "server kept the link open (errno %d)", errno);
    }
}

static void raw_send_env(int fd, ch_session_t *sess, Chorus__Envelope *env)
{
    uint8_t *f = NULL;
    size_t n = 0;
    cr_assert_eq(ch_msg_encode(sess, env, &f, &n), 0);
    raw_write(fd, f, n);
    free(f);
}

static Chorus__Envelope *raw_recv_env(int fd, ch_frame_reader_t *rd, ch_session_t *sess)
{
    for (;;) {
        const uint8_t *p, *tag;
        size_t len;
        int rc = ch_frame_reader_next(rd, &p, &len, &tag);
        cr_assert_geq(rc, 0);
        if (rc == 1) {
            Chorus__Envelope *env = NULL;
            cr_assert_eq(ch_msg_decode(sess, p, len, tag, &env), 0);
            return env;
        }
        uint8_t buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        cr_assert_gt(n, 0, "server closed during raw handshake");
        cr_assert_eq(ch_frame_reader_feed(rd, buf, (size_t)n), 0);
    }
}

/* Run the client side of the handshake by hand; proof_key lets a peer lie. Returns
 * after sending the proof; *ok says whether AuthResult came back. */
static void raw_handshake_macs(int fd, const ch_key_t *key, const ch_key_t *proof_key,
                               uint32_t macs, ch_session_t *sess, int *ok)
{
    ch_frame_reader_t rd;
    ch_frame_reader_init(&rd, 0);
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN], proof[CH_PROOF_LEN];
    ch_auth_nonce(nc);
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__AuthHello hello = CHORUS__AUTH_HELLO__INIT;
    hello.nonce.data = nc;
    hello.nonce.len = sizeof nc;
    hello.role = "raw";
    hello.macs = macs;
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &hello;
    raw_send_env(fd, NULL, &env);

    Chorus__Envelope *in = raw_recv_env(fd, &rd, NULL);
    cr_assert_eq(in->body_case, CHORUS__ENVELOPE__BODY_AUTH_CHALLENGE);
    memcpy(ns, in->auth_challenge->nonce.data, CH_NONCE_LEN);
    /* The server picks a tag we offered, and ChaCha20-Poly1305 when we did. */
    uint32_t mac = in->auth_challenge->mac;
    cr_assert_eq(mac, macs & (1u << CH_MAC_POLY1305) ? CH_MAC_POLY1305 : CH_MAC_HMAC_SHA256);
    ch_msg_free(in);

    ch_auth_proof(proof_key, "chorus-c", nc, ns, proof);
    Chorus__Envelope penv = CHORUS__ENVELOPE__INIT;
    Chorus__AuthProof p = CHORUS__AUTH_PROOF__INIT;
    p.proof.data = proof;
    p.proof.len = sizeof proof;
    penv.body_case = CHORUS__ENVELOPE__BODY_AUTH_PROOF;
    penv.auth_proof = &p;
    raw_send_env(fd, NULL, &penv);

    ch_session_init_keyed(sess, 0, key, nc, ns, (int)mac);
    *ok = 0;
    if (memcmp(key, proof_key, sizeof *key) == 0) {
        in = raw_recv_env(fd, &rd, sess);
        *ok = in->body_case == CHORUS__ENVELOPE__BODY_AUTH_RESULT && in->auth_result->ok;
        ch_msg_free(in);
    }
    ch_frame_reader_fini(&rd);
}

/* The handshake of a client older than frame tags other than HMAC-SHA256: it offers none. */
static void raw_handshake(int fd, const ch_key_t *key, const ch_key_t *proof_key,
                          ch_session_t *sess, int *ok)
{
    raw_handshake_macs(fd, key, proof_key, 0, sess, ok);
}

static void heartbeat_env(Chorus__Envelope *env, Chorus__Heartbeat *hb)
{
    Chorus__Envelope e = CHORUS__ENVELOPE__INIT;
    Chorus__Heartbeat h = CHORUS__HEARTBEAT__INIT;
    *env = e;
    *hb = h;
    env->body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env->heartbeat = hb;
    env->request_id = 9;
}

/* Encode one heartbeat under sess and write it to fd. */
static void raw_send_heartbeat(int fd, ch_session_t *sess)
{
    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    uint8_t *f = NULL;
    size_t n = 0;
    cr_assert_eq(ch_msg_encode(sess, &env, &f, &n), 0);
    raw_write(fd, f, n);
    free(f);
}

/* How many messages the server delivered so far. */
static int srv_msgs(srv_t *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->msgs;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---------------------------------------------------------------- tests */

Test(conn, handshake_and_roundtrip)
{
    srv_t *s = srv_start(1, 0);
    ch_client_t *c = good_client(s);
    for (int i = 0; i < 3; i++)
        roundtrip(c);

    /* An Error reply comes back as its code, with the message readable. */
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__Cancel cancel = CHORUS__CANCEL__INIT;
    cancel.job_id = "j-404";
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &cancel;
    Chorus__Envelope *resp = NULL;
    cr_assert_eq(ch_client_call(c, &req, WAIT_MS, &resp), CH_E_NOTFOUND);
    cr_assert_not_null(resp);
    cr_assert_str_eq(resp->error->message, "no such job");
    ch_msg_free(resp);

    pthread_mutex_lock(&s->mu);
    cr_assert_str_eq(s->last_role, "ctl");
    cr_assert_eq(s->msgs, 4);
    pthread_mutex_unlock(&s->mu);
    ch_client_destroy(c);
    srv_wait_closes(s, 1);
    srv_stop(s);
}

Test(conn, wrong_key_refused_both_ways)
{
    srv_t *s = srv_start(1, 0);
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", s->port);
    ch_key_t bad = s->key;
    bad.bytes[0] ^= 1;

    /* A client with the wrong key rejects the server's proof. */
    ch_client_t *c = NULL;
    cr_assert_eq(ch_client_connect_tcp(hp, &bad, "ctl", WAIT_MS, &c), CH_E_AUTH);
    cr_assert_null(c);
    srv_wait_closes(s, 1);

    /* A peer that forges its proof is cut by the server. */
    int fd = raw_connect(s);
    ch_session_t sess;
    int ok = 1;
    raw_handshake(fd, &s->key, &bad, &sess, &ok);
    cr_assert_eq(srv_wait_closes(s, 2), CH_E_AUTH);
    assert_hung_up(fd);
    close(fd);

    pthread_mutex_lock(&s->mu);
    cr_assert_eq(s->readies, 0);
    pthread_mutex_unlock(&s->mu);
    assert_still_serving(s);
    srv_stop(s);
}

Test(conn, garbage_bytes_close_the_link)
{
    srv_t *s = srv_start(1, 0);
    /* Text: its first four bytes read as a ~1 GiB length. */
    int fd = raw_connect(s);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_write(fd, http, strlen(http));
    cr_assert_eq(srv_wait_closes(s, 1), CH_E_TOOBIG);
    assert_hung_up(fd);
    close(fd);

    /* A well-sized frame whose payload is not an Envelope. */
    fd = raw_connect(s);
    uint8_t junk[CH_FRAME_HDR + 6 + CH_FRAME_TAG];
    memset(junk, 0xff, sizeof junk);
    ch_frame_put_header(junk, 6);
    raw_write(fd, junk, sizeof junk);
    cr_assert_eq(srv_wait_closes(s, 2), CH_E_FRAME);
    assert_hung_up(fd);
    close(fd);

    /* A valid Envelope that is not the expected handshake step. */
    fd = raw_connect(s);
    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    raw_send_env(fd, NULL, &env);
    cr_assert_eq(srv_wait_closes(s, 3), CH_E_AUTH);
    assert_hung_up(fd);
    close(fd);

    assert_still_serving(s);
    srv_stop(s);
}

Test(conn, oversized_frame_closes_the_link)
{
    srv_t *s = srv_start(1, 0);
    ch_client_t *c = good_client(s);
    roundtrip(c);
    /* Server max is 1 MiB: announce one byte more, send only the header. */
    uint8_t hdr[CH_FRAME_HDR];
    ch_frame_put_header(hdr, (1u << 20) + 1);
    raw_write(ch_client_fd(c), hdr, sizeof hdr);
    cr_assert_eq(srv_wait_closes(s, 1), CH_E_TOOBIG);
    Chorus__Envelope *in = NULL;
    int rc;
    /* Whatever was in flight may still arrive; then the link ends. */
    while ((rc = ch_client_recv(c, WAIT_MS, &in)) == 0)
        ch_msg_free(in);
    cr_assert_eq(rc, -EPIPE);
    ch_client_destroy(c);
    assert_still_serving(s);
    srv_stop(s);
}

Test(conn, bad_tag_closes_the_link)
{
    srv_t *s = srv_start(1, 0);
    int fd = raw_connect(s);
    ch_session_t sess;
    int ok = 0;
    raw_handshake(fd, &s->key, &s->key, &sess, &ok);
    cr_assert(ok);

    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    uint8_t *f = NULL;
    size_t n = 0;
    cr_assert_eq(ch_msg_encode(&sess, &env, &f, &n), 0);
    f[n - 1] ^= 0x01; /* last tag byte */
    raw_write(fd, f, n);
    free(f);
    cr_assert_eq(srv_wait_closes(s, 1), CH_E_AUTH);
    assert_hung_up(fd);
    close(fd);
    cr_assert_eq(srv_msgs(s), 0, "a frame with a bad tag was delivered");
    assert_still_serving(s);
    srv_stop(s);
}

/* Both frame tags on one server: an older client's HMAC-SHA256 frames and a newer one's
 * ChaCha20-Poly1305 frames are delivered; a frame tagged with the other kind than the
 * session's, or with the other kind's session key, closes the link. */
Test(conn, each_client_gets_the_tag_it_offered)
{
    srv_t *s = srv_start(1, 0);
    for (uint32_t macs = 0; macs <= (1u << CH_MAC_POLY1305); macs += 1u << CH_MAC_POLY1305) {
        int fd = raw_connect(s);
        ch_session_t sess;
        int ok = 0;
        raw_handshake_macs(fd, &s->key, &s->key, macs, &sess, &ok);
        cr_assert(ok, "macs %u: no AuthResult", macs);
        cr_assert_eq(sess.mac, macs ? CH_MAC_POLY1305 : CH_MAC_HMAC_SHA256);
        raw_send_heartbeat(fd, &sess);
        /* The same session's next frame under the other tag: refused. */
        ch_session_t other = sess;
        other.mac = sess.mac == CH_MAC_POLY1305 ? CH_MAC_HMAC_SHA256 : CH_MAC_POLY1305;
        raw_send_heartbeat(fd, &other);
        cr_assert_eq(srv_wait_closes(s, (int)(macs ? 2 : 1)), CH_E_AUTH);
        assert_hung_up(fd);
        close(fd);
        int got = srv_msgs(s);
        cr_assert_eq(got, macs ? 2 : 1, "macs %u: %d frames delivered", macs, got);
    }
    assert_still_serving(s);
    srv_stop(s);
}

Test(conn, replayed_frame_closes_the_link)
{
    srv_t *s = srv_start(1, 0);
    int fd = raw_connect(s);
    ch_session_t sess;
    int ok = 0;
    raw_handshake(fd, &s->key, &s->key, &sess, &ok);
    cr_assert(ok);

    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    uint8_t *f = NULL;
    size_t n = 0;
    cr_assert_eq(ch_msg_encode(&sess, &env, &f, &n), 0);
    raw_write(fd, f, n);
    raw_write(fd, f, n); /* the same authentic frame again */
    free(f);
    cr_assert_eq(srv_wait_closes(s, 1), CH_E_REPLAY);
    assert_hung_up(fd);
    close(fd);
    cr_assert_eq(srv_msgs(s), 1, "the replayed frame was delivered");
    assert_still_serving(s);
    srv_stop(s);
}

/* A KillRank, which srv_msg answers and then hangs up at once: the answer must arrive, then
 * the link's end (the server's closes reach n). */
static void call_then_hang_up(srv_t *s, ch_client_t *c, int n)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__KillRank kr = CHORUS__KILL_RANK__INIT;
    kr.job_id = "j1";
    req.body_case = CHORUS__ENVELOPE__BODY_KILL_RANK;
    req.kill_rank = &kr;
    Chorus__Envelope *resp = NULL;
    cr_assert_eq(ch_client_call(c, &req, WAIT_MS, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_OK);
    ch_msg_free(resp);
    cr_assert_eq(srv_wait_closes(s, n), 0);
    cr_assert_eq(ch_client_recv(c, WAIT_MS, &resp), -EPIPE);
}

Test(conn, close_right_after_send_flushes_the_reply)
{
    srv_t *s = srv_start(1, 0);
    ch_client_t *c = good_client(s);
    call_then_hang_up(s, c, 1);
    ch_client_destroy(c);
    srv_stop(s);
}

/* A corked link's frames leave in one write: the heartbeat and the reply to one request
 * arrive in the peer's first read, in order, and each passes its tag and sequence check. */
Test(conn, corked_replies_leave_in_one_write)
{
    srv_t *s = srv_init(1, 0);
    s->cork = 1;
    srv_run(s);
    int fd = raw_connect(s);
    ch_session_t sess;
    int ok = 0;
    raw_handshake(fd, &s->key, &s->key, &sess, &ok);
    cr_assert(ok);
    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    raw_send_env(fd, &sess, &env);
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    cr_assert_gt(n, 0);
    ch_frame_reader_t rd;
    ch_frame_reader_init(&rd, 0);
    cr_assert_eq(ch_frame_reader_feed(&rd, buf, (size_t)n), 0);
    int want[2] = {CHORUS__ENVELOPE__BODY_HEARTBEAT, CHORUS__ENVELOPE__BODY_OK};
    for (int i = 0; i < 2; i++) {
        const uint8_t *p, *tag;
        size_t len;
        cr_assert_eq(ch_frame_reader_next(&rd, &p, &len, &tag), 1, "frame %d not in the read", i);
        Chorus__Envelope *in = NULL;
        cr_assert_eq(ch_msg_decode(&sess, p, len, tag, &in), 0);
        cr_assert_eq(in->body_case, want[i]);
        ch_msg_free(in);
    }
    ch_frame_reader_fini(&rd);
    close(fd);
    srv_wait_closes(s, 1);

    /* A call through ch_client, and a close right after corked sends writes them first. */
    ch_client_t *c = good_client(s);
    roundtrip(c);
    call_then_hang_up(s, c, 2);
    ch_client_destroy(c);
    srv_stop(s);
}

Test(conn, silent_peer_cut_after_handshake_timeout)
{
    srv_t *s = srv_start(1, 0);
    int fd = raw_connect(s);
    cr_assert_eq(srv_wait_closes(s, 1), -ETIMEDOUT);
    assert_hung_up(fd);
    close(fd);
    assert_still_serving(s);
    srv_stop(s);
}

Test(conn, unix_socket_with_peer_cred)
{
    srv_t *s = srv_start(1, 1);
    ch_client_t *c = NULL;
    cr_assert_eq(ch_client_connect_unix(s->sock_path, WAIT_MS, &c), 0);
    roundtrip(c);
    pthread_mutex_lock(&s->mu);
    cr_assert_eq(s->last_pid, getpid());
    pthread_mutex_unlock(&s->mu);
    ch_client_destroy(c);
    srv_wait_closes(s, 1);
    srv_stop(s);
}

/* ---------------------------------------------------------------- same-loop tests */

typedef struct pair_state {
    int srv_ready, cli_ready, got_reply, cli_closed, cli_reason, srv_closed;
    ch_conn_t *srv_conn;
    uv_tcp_t listener;
    uv_timer_t guard;
    const ch_key_t *key;
} pair_state_t;

static void pair_srv_ready(ch_conn_t *c, void *ud)
{
    ((pair_state_t *)ud)->srv_ready = 1;
}

static void pair_srv_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    Chorus__Envelope rep = CHORUS__ENVELOPE__INIT;
    Chorus__Ok ok = CHORUS__OK__INIT;
    rep.request_id = env->request_id;
    rep.body_case = CHORUS__ENVELOPE__BODY_OK;
    rep.ok = &ok;
    cr_assert_eq(ch_conn_send(c, &rep), 0);
}

static void pair_srv_closed(ch_conn_t *c, int reason, void *ud)
{
    pair_state_t *p = ud;
    p->srv_closed = 1;
    p->srv_conn = NULL;
    if (!uv_is_closing((uv_handle_t *)&p->listener))
        uv_close((uv_handle_t *)&p->listener, NULL);
}

static void pair_cli_ready(ch_conn_t *c, void *ud)
{
    pair_state_t *p = ud;
    p->cli_ready = 1;
    cr_assert(ch_conn_is_ready(c));
    Chorus__Envelope env;
    Chorus__Heartbeat hb;
    heartbeat_env(&env, &hb);
    env.request_id = 42;
    cr_assert_eq(ch_conn_send(c, &env), 0);
}

static void pair_cli_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    pair_state_t *p = ud;
    cr_assert_eq(env->request_id, 42);
    cr_assert_eq(env->body_case, CHORUS__ENVELOPE__BODY_OK);
    p->got_reply = 1;
    ch_conn_close(c); /* closing from inside its own callback is allowed */
}

static void pair_cli_closed(ch_conn_t *c, int reason, void *ud)
{
    pair_state_t *p = ud;
    p->cli_closed = 1;
    p->cli_reason = reason;
    if (p->srv_conn)
        ch_conn_close(p->srv_conn);
    else if (!uv_is_closing((uv_handle_t *)&p->listener))
        uv_close((uv_handle_t *)&p->listener, NULL);
    uv_close((uv_handle_t *)&p->guard, NULL);
}

static void pair_on_conn(uv_stream_t *server, int status)
{
    pair_state_t *p = server->data;
    ch_conn_opts_t o = {.key = p->key, .is_server = 1};
    ch_conn_cbs_t cbs = {pair_srv_ready, pair_srv_msg, pair_srv_closed};
    cr_assert_eq(ch_conn_accept(server->loop, server, &o, &cbs, p, &p->srv_conn), 0);
}

static void pair_guard(uv_timer_t *t)
{
    cr_assert_fail("same-loop test did not finish in time");
}

/* Both ends of the handshake on one loop: ch_conn as the client too (workerd's case). */
static void run_pair(const ch_key_t *srv_key, const ch_key_t *cli_key, pair_state_t *p)
{
    uv_loop_t loop;
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(uv_loop_init(&loop), 0);
    memset(p, 0, sizeof *p);
    p->key = srv_key;
    cr_assert_eq(uv_tcp_init(&loop, &p->listener), 0);
    p->listener.data = p;
    struct sockaddr_in sa;
    cr_assert_eq(uv_ip4_addr("127.0.0.1", 0, &sa), 0);
    cr_assert_eq(uv_tcp_bind(&p->listener, (struct sockaddr *)&sa, 0), 0);
    cr_assert_eq(uv_listen((uv_stream_t *)&p->listener, 4, pair_on_conn), 0);
    struct sockaddr_in bound;
    int n = sizeof bound;
    cr_assert_eq(uv_tcp_getsockname(&p->listener, (struct sockaddr *)&bound, &n), 0);
    cr_assert_eq(uv_timer_init(&loop, &p->guard), 0);
    cr_assert_eq(uv_timer_start(&p->guard, pair_guard, WAIT_MS, 0), 0);

    ch_conn_opts_t o = {.key = cli_key, .role = "worker"};
    ch_conn_cbs_t cbs = {pair_cli_ready, pair_cli_msg, pair_cli_closed};
    ch_conn_t *c = NULL;
    cr_assert_eq(ch_conn_connect_tcp(&loop, "127.0.0.1", ntohs(bound.sin_port), &o, &cbs, p, &c),
                 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0, "loop left handles open");
}

Test(conn, same_loop_conn_client_handshake)
{
    ch_key_t k;
    for (int i = 0; i < CH_KEY_LEN; i++)
        k.bytes[i] = (uint8_t)(3 * i);
    pair_state_t p;
    run_pair(&k, &k, &p);
    cr_assert(p.srv_ready && p.cli_ready && p.got_reply);
    cr_assert(p.cli_closed);
    cr_assert_eq(p.cli_reason, 0);
}

Test(conn, same_loop_conn_client_wrong_key)
{
    ch_key_t k, bad;
    for (int i = 0; i < CH_KEY_LEN; i++)
        k.bytes[i] = bad.bytes[i] = (uint8_t)(3 * i);
    bad.bytes[5] ^= 0x40;
    pair_state_t p;
    run_pair(&k, &bad, &p);
    cr_assert(!p.cli_ready && !p.got_reply && !p.srv_ready);
    cr_assert(p.cli_closed);
    cr_assert_eq(p.cli_reason, CH_E_AUTH);
}

/* ---------------------------------------------------------------- socketpair */

Test(conn, plain_socketpair_link)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    /* Attach one end to the server loop before its thread starts. */
    srv_t *s = srv_init(0, 0);
    ch_conn_opts_t o;
    srv_opts(s, &o, 0);
    ch_conn_t *sc = NULL;
    cr_assert_eq(ch_conn_open_fd(&s->loop, sv[0], &o, &srv_cbs, s, &sc), 0);
    cr_assert(ch_conn_is_ready(sc), "a plain link is ready at once");
    srv_track(s, sc, 1);
    srv_run(s);

    ch_client_t *cli = NULL;
    cr_assert_eq(ch_client_from_fd(sv[1], &cli), 0);
    roundtrip(cli);
    roundtrip(cli);
    pthread_mutex_lock(&s->mu);
    cr_assert_eq(s->readies, 1);
    cr_assert_eq(s->last_pid, getpid());
    pthread_mutex_unlock(&s->mu);
    ch_client_destroy(cli);
    cr_assert_eq(srv_wait_closes(s, 1), -EPIPE);
    srv_stop(s);
}

/* A frame's payload (untagged: a plain session) for env. */
static uint8_t *packed(Chorus__Envelope *env, size_t *len)
{
    *len = chorus__envelope__get_packed_size(env);
    uint8_t *buf = malloc(*len);
    cr_assert_eq(chorus__envelope__pack(env, buf), *len);
    return buf;
}

/* The decoding arena (msg.h) gives what ch_msg_decode gives: a message decoded while another
 * holds it falls back to malloc, one larger than the arena spills over, and each is released
 * on its own. */
Test(conn, arena_decode_matches_plain_decode)
{
    Chorus__KvSet kv = CHORUS__KV_SET__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *a = NULL, *b = NULL, *plain = NULL;
    uint8_t *value = malloc(200000), tag[CH_FRAME_TAG] = {0};
    for (size_t i = 0; i < 200000; i++)
        value[i] = (uint8_t)(i * 7);
    kv.job_id = "j1";
    kv.key = "nccl";
    kv.value.data = value;
    kv.value.len = 200000; /* larger than the arena's block */
    env.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
    env.kv_set = &kv;
    size_t len1, len2;
    uint8_t *big = packed(&env, &len1);
    kv.value.len = 10;
    uint8_t *small = packed(&env, &len2);
    for (int round = 0; round < 3; round++) { /* the block grows once, then is reused */
        cr_assert_eq(ch_msg_decode_fast(NULL, big, len1, tag, &a), 0);
        cr_assert_eq(ch_msg_decode_fast(NULL, small, len2, tag, &b), 0); /* while a is held */
        cr_assert_eq(ch_msg_decode(NULL, big, len1, tag, &plain), 0);
        cr_assert_str_eq(a->kv_set->key, "nccl");
        cr_assert_eq(a->kv_set->value.len, 200000);
        cr_assert_eq(memcmp(a->kv_set->value.data, plain->kv_set->value.data, 200000), 0);
        cr_assert_eq(b->kv_set->value.len, 10);
        cr_assert_eq(memcmp(b->kv_set->value.data, value, 10), 0);
        ch_msg_release(b);
        ch_msg_release(a);
        ch_msg_free(plain);
    }
    /* Undecodable: refused, and the arena is free again for the next. */
    cr_assert_lt(ch_msg_decode_fast(NULL, value, 100, tag, &a), 0);
    cr_assert_eq(ch_msg_decode_fast(NULL, small, len2, tag, &a), 0);
    ch_msg_release(a);
    free(big);
    free(small);
    free(value);
}

/* Read one frame from a non-blocking fd while loop runs (what the link sends is written by
 * it): the decoded envelope. */
static Chorus__Envelope *pump_recv(uv_loop_t *loop, int fd, ch_frame_reader_t *rd)
{
    const uint8_t *p, *tag;
    size_t len;
    uint8_t buf[65536];
    for (int i = 0; i < 200000; i++) {
        int rc = ch_frame_reader_next(rd, &p, &len, &tag);
        cr_assert(rc >= 0);
        if (rc == 1) {
            Chorus__Envelope *env = NULL;
            cr_assert_eq(ch_msg_decode(NULL, p, len, tag, &env), 0);
            return env;
        }
        uv_run(loop, UV_RUN_NOWAIT);
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0)
            cr_assert_eq(ch_frame_reader_feed(rd, buf, (size_t)n), 0);
        else
            usleep(100);
    }
    cr_assert_fail("no frame");
    return NULL;
}

/* A frame larger than the socket takes at once goes partly now and the rest from the write
 * queue, and a frame sent after it follows it whole: the bytes arrive in order, unchanged. */
Test(conn, large_frame_then_small_arrive_in_order)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    ch_conn_opts_t o = {.is_server = 1};
    ch_conn_cbs_t cbs = {0};
    ch_conn_t *c = NULL;
    cr_assert_eq(ch_conn_open_fd(&loop, sv[0], &o, &cbs, NULL, &c), 0);
    size_t big = 4u << 20; /* far over a socket buffer */
    uint8_t *val = malloc(big);
    cr_assert(val);
    for (size_t i = 0; i < big; i++)
        val[i] = (uint8_t)(i * 131 + (i >> 12));
    Chorus__KvReply kr = CHORUS__KV_REPLY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    kr.value.data = val;
    kr.value.len = big;
    env.request_id = 1;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_REPLY;
    env.kv_reply = &kr;
    cr_assert_eq(ch_conn_send(c, &env), 0);
    kr.value.len = 3;
    env.request_id = 2;
    cr_assert_eq(ch_conn_send(c, &env), 0);

    ch_frame_reader_t rd;
    ch_frame_reader_init(&rd, 0);
    Chorus__Envelope *got = pump_recv(&loop, sv[1], &rd);
    cr_assert_eq(got->request_id, 1);
    cr_assert_eq(got->kv_reply->value.len, big);
    cr_assert(memcmp(got->kv_reply->value.data, val, big) == 0);
    ch_msg_free(got);
    got = pump_recv(&loop, sv[1], &rd);
    cr_assert_eq(got->request_id, 2);
    cr_assert(got->kv_reply->value.len == 3 && memcmp(got->kv_reply->value.data, val, 3) == 0);
    ch_msg_free(got);

    ch_frame_reader_fini(&rd);
    ch_conn_close(c);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    close(sv[1]);
    free(val);
}
