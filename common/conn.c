/* Authenticated message links on libuv streams (conn.h).
 *
 * Theory of operation. A link is one stream handle (TCP or pipe) plus one timer,
 * both embedded in ch_conn_t. Bytes read go through a frame reader (the 4-byte
 * header is checked against max_frame before the buffer grows) and then through the
 * handshake state machine of auth.h:
 *
 *   client: CONNECTING -> WAIT_CHALLENGE -> WAIT_RESULT -> READY
 *   server:               WAIT_HELLO     -> WAIT_PROOF  -> READY
 *
 * Plain links (no key) start READY. The timer bounds connect + handshake; for plain
 * links it is reused, with timeout 0, to report ready_cb from the loop rather than
 * from inside the constructor. Any failure goes through conn_fail(): one log line
 * naming the peer and the reason, then uv_close on both handles. The memory is freed
 * only when every handle has closed and a pending getaddrinfo has returned, so a
 * callback may close its own link. */
#include "common/conn.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/util.h"

#define CONN_RDBUF (16u << 10)
/* Backpressure: a peer that sends requests but does not read the replies stops being
 * read once CONN_WQ_HIGH bytes wait in our write queue, and is read again below
 * CONN_WQ_LOW; a link whose queue still grows past CONN_WQ_MAX (messages we send on our
 * own, to a peer that never reads) is cut. */
#define CONN_WQ_HIGH  (256u << 10)
#define CONN_WQ_LOW   (64u << 10)
#define CONN_WQ_MAX   (64u << 20)
#define CONN_ROLE_MAX 32
#define CONN_PEER_MAX 80

enum conn_state {
    ST_RESOLVING,
    ST_CONNECTING,
    ST_WAIT_HELLO,     /* server */
    ST_WAIT_PROOF,     /* server */
    ST_WAIT_CHALLENGE, /* client */
    ST_WAIT_RESULT,    /* client */
    ST_READY,
    ST_CLOSING,
};

struct ch_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    uv_timer_t timer;
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai_req;
    uv_loop_t *loop;
    int is_tcp;
    enum conn_state state;
    int refs; /* 1 for the handles + 1 while getaddrinfo is pending */
    int handles_closing;
    int handles_closed; /* of the two handles */
    int nwrites;        /* writes queued and not yet completed */
    int paused;         /* reading stopped: the peer does not read our replies */
    int draining;       /* local close waiting for queued writes */
    int corked;         /* ch_conn_cork: frames gather in cork until ch_conn_uncork */
    uint8_t *cork;
    size_t cork_len, cork_cap;
    uv_shutdown_t shutdown_req;
    int notify_close; /* 0 when a constructor failed: no close_cb */
    int ready_notified;
    int close_reason;
    int port; /* connect target while resolving */

    int keyed;
    ch_key_t key;
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN];
    int mac; /* server: the frame tag picked from the hello (CH_MAC_*) */
    ch_session_t sess;
    ch_frame_reader_t rd;
    uint32_t max_frame; /* once ready; before, a server takes handshake frames only */
    uint32_t hs_timeout_ms;
    ch_ratelimit_t *unauth_log;
    int is_server;

    ch_conn_cbs_t cbs;
    void *ud;
    char role[CONN_ROLE_MAX];
    char peer[CONN_PEER_MAX];
    uint8_t rdbuf[CONN_RDBUF];
};

typedef struct write_req {
    uv_write_t req;
    ch_conn_t *conn;
    uint8_t *buf;
} write_req_t;

static void conn_close_with(ch_conn_t *c, int reason);
static void on_timer(uv_timer_t *t);
static void conn_drain_frames(ch_conn_t *c, const uint8_t *data, size_t n);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* ---------------------------------------------------------------- lifetime */

static void conn_release(ch_conn_t *c)
{
    if (--c->refs > 0)
        return;
    ch_frame_reader_fini(&c->rd);
    free(c->cork);
    explicit_bzero(&c->key, sizeof c->key);
    explicit_bzero(&c->sess, sizeof c->sess);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    ch_conn_t *c = h->data;
    if (++c->handles_closed < 2)
        return;
    if (c->notify_close && c->cbs.close_cb)
        c->cbs.close_cb(c, c->close_reason, c->ud);
    conn_release(c);
}

static void conn_close_handles(ch_conn_t *c)
{
    if (c->handles_closing)
        return;
    c->handles_closing = 1;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close(&c->u.handle, on_handle_closed);
}

static void conn_close_with(ch_conn_t *c, int reason)
{
    if (c->state == ST_CLOSING)
        return;
    c->state = ST_CLOSING;
    c->close_reason = reason;
    conn_close_handles(c);
}

static void conn_fail(ch_conn_t *c, int reason, const char *what)
{
    if (c->state == ST_CLOSING)
        return;
    uint32_t quiet = 0;
    if (c->is_server && c->state != ST_READY && c->unauth_log &&
        !ch_ratelimit_ok(c->unauth_log, ch_now_ms(), &quiet)) {
        CH_LOGD("net", "peer %s: %s: %s; closing link", c->peer, what, ch_strerror(reason));
    } else if (quiet) {
        CH_LOGW("net",
                "peer %s: %s: %s; closing link (%u more unauthenticated peers cut, not "
                "logged)",
                c->peer, what, ch_strerror(reason), quiet);
    } else {
        CH_LOGW("net", "peer %s: %s: %s; closing link", c->peer, what, ch_strerror(reason));
    }
    conn_close_with(c, reason);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_close_handles(req->data);
}

/* A local close first flushes what the owner queued (a final reply, an Error), bounded
 * by the timer in case the peer stopped reading. */
void ch_conn_close(ch_conn_t *c)
{
    if (!c || c->state == ST_CLOSING)
        return;
    ch_conn_uncork(c); /* what was sent before the close goes before it */
    if (c->nwrites > 0) {
        c->state = ST_CLOSING;
        c->close_reason = 0;
        c->draining = 1;
        uv_read_stop(&c->u.stream);
        c->shutdown_req.data = c;
        if (uv_shutdown(&c->shutdown_req, &c->u.stream, on_shutdown) == 0) {
            uv_timer_start(&c->timer, on_timer, 2000, 0);
            return;
        }
        conn_close_handles(c);
        return;
    }
    conn_close_with(c, 0);
}

/* Allocate and initialise everything but the stream handle. */
static int conn_new(uv_loop_t *loop, const ch_conn_opts_t *opts, const ch_conn_cbs_t *cbs, void *ud,
                    ch_conn_t **out)
{
    *out = NULL;
    if (!loop || !opts || !cbs)
        return -EINVAL;
    ch_conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->loop = loop;
    c->cbs = *cbs;
    c->ud = ud;
    c->keyed = opts->key != NULL;
    if (c->keyed)
        c->key = *opts->key;
    c->hs_timeout_ms = opts->handshake_timeout_ms ? opts->handshake_timeout_ms : 3000;
    c->max_frame = opts->max_frame ? opts->max_frame : CH_FRAME_MAX_DEFAULT;
    c->is_server = opts->is_server;
    c->unauth_log = opts->unauth_log;
    /* A client may get the server's first messages in the same read as AuthResult, so
     * only the server, which speaks second, holds its peer to handshake-sized frames. */
    ch_frame_reader_init(&c->rd,
                         c->keyed && c->is_server && c->max_frame > CH_CONN_HANDSHAKE_FRAME_MAX
                             ? CH_CONN_HANDSHAKE_FRAME_MAX
                             : c->max_frame);
    if (!opts->is_server && opts->role)
        snprintf(c->role, sizeof c->role, "%s", opts->role);
    snprintf(c->peer, sizeof c->peer, "?");
    ch_session_init_plain(&c->sess, opts->is_server);
    c->notify_close = 1;
    c->refs = 1;
    int rc = uv_timer_init(loop, &c->timer);
    if (rc < 0) {
        ch_frame_reader_fini(&c->rd);
        free(c);
        return ch_err_from_uv(rc);
    }
    c->timer.data = c;
    *out = c;
    return 0;
}

/* A constructor failed after both handles exist: close them without telling the
 * owner (it gets the error code instead). */
static void conn_abort_new(ch_conn_t *c)
{
    c->notify_close = 0;
    conn_close_with(c, 0);
}

/* ---------------------------------------------------------------- writes */

static void on_write(uv_write_t *req, int status)
{
    write_req_t *w = (write_req_t *)req;
    ch_conn_t *c = w->conn;
    free(w->buf);
    free(w);
    c->nwrites--;
    if (status < 0 && status != UV_ECANCELED) {
        conn_fail(c, ch_err_from_uv(status), "write failed");
        return;
    }
    if (c->paused && c->state == ST_READY &&
        uv_stream_get_write_queue_size(&c->u.stream) <= CONN_WQ_LOW) {
        /* The peer reads again: first the frames we held back, then the socket. */
        c->paused = 0;
        conn_drain_frames(c, NULL, 0);
        if (!c->paused && c->state == ST_READY) {
            int rc = uv_read_start(&c->u.stream, on_alloc, on_read);
            if (rc < 0)
                conn_fail(c, ch_err_from_uv(rc), "read restart failed");
        }
    }
}

/* Add a packed frame to the cork (conn_write while corked); takes ownership of buf. */
static int conn_cork_add(ch_conn_t *c, uint8_t *buf, size_t len)
{
    if (!c->cork) { /* the first frame is the buffer: a lone one is written as it came */
        c->cork = buf;
        c->cork_len = c->cork_cap = len;
        return 0;
    }
    if (c->cork_len + len > c->cork_cap) {
        size_t cap = c->cork_cap > 2048 ? c->cork_cap : 4096;
        while (cap < c->cork_len + len)
            cap *= 2;
        uint8_t *v = realloc(c->cork, cap);
        if (!v) {
            free(buf);
            conn_fail(c, -ENOMEM, "write failed");
            return -ENOMEM;
        }
        c->cork = v;
        c->cork_cap = cap;
    }
    memcpy(c->cork + c->cork_len, buf, len);
    c->cork_len += len;
    free(buf);
    return 0;
}

/* Write an already packed frame now if the socket takes it all (nothing queued before
 * it): 1 when it did, 0 with *off = what it took (the rest is queued), or a negative code.
 * A queued write costs libuv a completion in a later turn and an epoll_ctl (its POLLOUT
 * interest dropped again): one per write at a 32,768-rank start, where the sockets take
 * every write whole. */
static int conn_write_now(ch_conn_t *c, const uint8_t *buf, size_t len, size_t *off)
{
    *off = 0;
    /* A paused link's writes go through uv_write: its completion (on_write) reads it again. */
    if (!buf || len == 0 || c->paused || c->nwrites > 0 ||
        uv_stream_get_write_queue_size(&c->u.stream) > 0)
        return 0;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int n = uv_try_write(&c->u.stream, &b, 1);
    if (n == UV_EAGAIN || n == UV_ENOSYS)
        return 0;
    if (n < 0)
        return ch_err_from_uv(n);
    *off = (size_t)n;
    return (size_t)n == len;
}

/* Queue an already packed frame; takes ownership of buf. */
static int conn_write(ch_conn_t *c, uint8_t *buf, size_t len)
{
    if (c->corked && c->state == ST_READY && buf)
        return conn_cork_add(c, buf, len);
    size_t off = 0;
    int rc = conn_write_now(c, buf, len, &off);
    if (rc != 0) {
        free(buf);
        if (rc < 0)
            conn_fail(c, rc, "write failed");
        return rc < 0 ? rc : 0;
    }
    write_req_t *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        return -ENOMEM;
    }
    w->conn = c;
    w->buf = buf;
    if (uv_stream_get_write_queue_size(&c->u.stream) + len > CONN_WQ_MAX) {
        free(buf);
        free(w);
        conn_fail(c, -ENOBUFS, "peer does not read (write queue over 64 MiB)");
        return -ENOBUFS;
    }
    uv_buf_t b = uv_buf_init((char *)buf + off, (unsigned)(len - off));
    rc = uv_write(&w->req, &c->u.stream, &b, 1, on_write);
    if (rc == 0)
        c->nwrites++;
    if (rc < 0) {
        free(buf);
        free(w);
        rc = ch_err_from_uv(rc);
        conn_fail(c, rc, "write failed");
    }
    return rc;
}

/* Pack and queue env; s == NULL for the untagged handshake frames. */
static int conn_send_env(ch_conn_t *c, ch_session_t *s, Chorus__Envelope *env)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = ch_msg_encode(s, env, &buf, &len);
    if (rc < 0)
        return rc;
    return conn_write(c, buf, len);
}

void ch_conn_cork(ch_conn_t *c)
{
    if (c && c->state == ST_READY)
        c->corked = 1;
}

int ch_conn_uncork(ch_conn_t *c)
{
    if (!c || !c->corked)
        return 0;
    c->corked = 0;
    if (!c->cork_len)
        return 0;
    uint8_t *buf = c->cork;
    size_t len = c->cork_len;
    c->cork = NULL;
    c->cork_len = c->cork_cap = 0;
    if (c->state != ST_READY) {
        free(buf);
        return -EPIPE;
    }
    return conn_write(c, buf, len);
}

int ch_conn_send(ch_conn_t *c, Chorus__Envelope *env)
{
    if (!c || !env)
        return -EINVAL;
    if (c->state != ST_READY)
        return -EPIPE;
    return conn_send_env(c, &c->sess, env);
}

/* ---------------------------------------------------------------- handshake */

static void conn_set_ready(ch_conn_t *c)
{
    c->state = ST_READY;
    c->rd.max = c->max_frame;
    uv_timer_stop(&c->timer);
    CH_LOGD("net", "peer %s: link ready%s%s", c->peer, c->role[0] ? " role=" : "", c->role);
    if (!c->ready_notified) {
        c->ready_notified = 1;
        if (c->cbs.ready_cb)
            c->cbs.ready_cb(c, c->ud);
    }
}

static int send_hello(ch_conn_t *c)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__AuthHello hello = CHORUS__AUTH_HELLO__INIT;
    ch_auth_nonce(c->nc);
    hello.nonce.data = c->nc;
    hello.nonce.len = CH_NONCE_LEN;
    hello.role = c->role;
    hello.macs = ch_auth_macs_offered();
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &hello;
    c->state = ST_WAIT_CHALLENGE;
    return conn_send_env(c, NULL, &env);
}

/* Keep the announced role printable: it goes into log lines. */
static void copy_role(char *dst, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < CONN_ROLE_MAX; i++)
        dst[i] = (src[i] > 0x20 && src[i] < 0x7f) ? src[i] : '?';
    dst[i] = '\0';
}

static int on_hello(ch_conn_t *c, const Chorus__Envelope *env)
{
    if (env->body_case != CHORUS__ENVELOPE__BODY_AUTH_HELLO)
        return CH_E_AUTH;
    const Chorus__AuthHello *h = env->auth_hello;
    if (h->nonce.len != CH_NONCE_LEN)
        return CH_E_AUTH;
    memcpy(c->nc, h->nonce.data, CH_NONCE_LEN);
    copy_role(c->role, h->role);
    c->mac = ch_auth_pick_mac(h->macs & ch_auth_macs_offered());
    ch_auth_nonce(c->ns);

    uint8_t proof[CH_PROOF_LEN];
    ch_auth_proof(&c->key, "chorus-s", c->nc, c->ns, proof);
    Chorus__Envelope out = CHORUS__ENVELOPE__INIT;
    Chorus__AuthChallenge ch = CHORUS__AUTH_CHALLENGE__INIT;
    ch.nonce.data = c->ns;
    ch.nonce.len = CH_NONCE_LEN;
    ch.proof.data = proof;
    ch.proof.len = CH_PROOF_LEN;
    ch.mac = (uint32_t)c->mac;
    out.body_case = CHORUS__ENVELOPE__BODY_AUTH_CHALLENGE;
    out.auth_challenge = &ch;
    c->state = ST_WAIT_PROOF;
    return conn_send_env(c, NULL, &out);
}

static int on_challenge(ch_conn_t *c, const Chorus__Envelope *env)
{
    if (env->body_case != CHORUS__ENVELOPE__BODY_AUTH_CHALLENGE)
        return CH_E_AUTH;
    const Chorus__AuthChallenge *ch = env->auth_challenge;
    if (ch->nonce.len != CH_NONCE_LEN || !ch_auth_mac_acceptable(ch->mac))
        return CH_E_AUTH;
    memcpy(c->ns, ch->nonce.data, CH_NONCE_LEN);
    int rc = ch_auth_check_proof(&c->key, "chorus-s", c->nc, c->ns, ch->proof.data, ch->proof.len);
    if (rc < 0)
        return rc;

    uint8_t proof[CH_PROOF_LEN];
    ch_auth_proof(&c->key, "chorus-c", c->nc, c->ns, proof);
    Chorus__Envelope out = CHORUS__ENVELOPE__INIT;
    Chorus__AuthProof p = CHORUS__AUTH_PROOF__INIT;
    p.proof.data = proof;
    p.proof.len = CH_PROOF_LEN;
    out.body_case = CHORUS__ENVELOPE__BODY_AUTH_PROOF;
    out.auth_proof = &p;
    ch_session_init_keyed(&c->sess, 0, &c->key, c->nc, c->ns, (int)ch->mac);
    c->state = ST_WAIT_RESULT;
    return conn_send_env(c, NULL, &out);
}

static int on_proof(ch_conn_t *c, const Chorus__Envelope *env)
{
    if (env->body_case != CHORUS__ENVELOPE__BODY_AUTH_PROOF)
        return CH_E_AUTH;
    const Chorus__AuthProof *p = env->auth_proof;
    int rc = ch_auth_check_proof(&c->key, "chorus-c", c->nc, c->ns, p->proof.data, p->proof.len);
    if (rc < 0)
        return rc;
    ch_session_init_keyed(&c->sess, 1, &c->key, c->nc, c->ns, c->mac);
    Chorus__Envelope out = CHORUS__ENVELOPE__INIT;
    Chorus__AuthResult res = CHORUS__AUTH_RESULT__INIT;
    res.ok = 1;
    out.body_case = CHORUS__ENVELOPE__BODY_AUTH_RESULT;
    out.auth_result = &res;
    rc = conn_send_env(c, &c->sess, &out);
    if (rc < 0)
        return rc;
    conn_set_ready(c);
    return 0;
}

/* One whole frame; returns a negative code to close the link. */
static int conn_on_frame(ch_conn_t *c, const uint8_t *payload, size_t len, const uint8_t *tag,
                         const char **what)
{
    Chorus__Envelope *env = NULL;
    int tagged = c->state == ST_READY || c->state == ST_WAIT_RESULT;
    *what = "bad frame";
    int rc = ch_msg_decode_fast(tagged ? &c->sess : NULL, payload, len, tag, &env);
    if (rc < 0)
        return rc;
    *what = "handshake failed";
    switch (c->state) {
    case ST_WAIT_HELLO:
        rc = on_hello(c, env);
        break;
    case ST_WAIT_PROOF:
        rc = on_proof(c, env);
        break;
    case ST_WAIT_CHALLENGE:
        rc = on_challenge(c, env);
        break;
    case ST_WAIT_RESULT:
        if (env->body_case != CHORUS__ENVELOPE__BODY_AUTH_RESULT || !env->auth_result->ok)
            rc = CH_E_AUTH;
        else
            conn_set_ready(c);
        break;
    case ST_READY:
        if (c->cbs.msg_cb)
            c->cbs.msg_cb(c, env, c->ud);
        break;
    default:
        break;
    }
    ch_msg_release(env);
    return rc;
}

/* ---------------------------------------------------------------- reads */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    ch_conn_t *c = h->data;
    *buf = uv_buf_init((char *)c->rdbuf, sizeof c->rdbuf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    ch_conn_t *c = s->data;
    if (c->state == ST_CLOSING)
        return;
    if (nread < 0) {
        int rc = ch_err_from_uv((int)nread);
        if (nread == UV_EOF && c->state == ST_READY) {
            CH_LOGD("net", "peer %s: closed the link", c->peer);
            conn_close_with(c, rc);
        } else {
            conn_fail(c, rc, c->state == ST_READY ? "read failed" : "lost during handshake");
        }
        return;
    }
    if (nread == 0)
        return;
    conn_drain_frames(c, (const uint8_t *)buf->base, (size_t)nread);
    if (c->paused && c->state != ST_CLOSING)
        uv_read_stop(&c->u.stream);
}

/* Handle the whole frames of a read (data[0 .. n); NULL for none) and of the reader, until
 * the link closes or pauses: a peer whose replies pile up unread is not read further (its
 * requests wait in the kernel). A read's whole frames are handled where they lie (a node's
 * report comes in one read); only a partial frame, or what a pause holds back, is copied
 * into the reader. */
static void conn_drain_frames(ch_conn_t *c, const uint8_t *data, size_t n)
{
    const uint8_t *payload, *tag;
    size_t len, off = 0;
    while (c->state != ST_CLOSING && !c->paused) {
        int rc = data ? ch_frame_split(&c->rd, data, n, &off, &payload, &len, &tag) : 0;
        if (rc == 0 && data) { /* the rest is no whole frame, or the reader holds bytes */
            rc = ch_frame_reader_feed(&c->rd, data + off, n - off);
            data = NULL;
        }
        if (rc == 0)
            rc = ch_frame_reader_next(&c->rd, &payload, &len, &tag);
        if (rc == 0)
            break;
        const char *what = "oversized frame header";
        if (rc > 0)
            rc = conn_on_frame(c, payload, len, tag, &what);
        if (rc < 0) {
            conn_fail(c, rc, what);
            return;
        }
        /* Replies gathered in the cork count: a loop turn reads a stream up to 32 times,
         * and a turn's replies are written only at its end. */
        if (c->state == ST_READY &&
            uv_stream_get_write_queue_size(&c->u.stream) + c->cork_len > CONN_WQ_HIGH)
            c->paused = 1;
    }
    if (data && c->state != ST_CLOSING) { /* paused: the rest waits in the reader */
        int rc = ch_frame_reader_feed(&c->rd, data + off, n - off);
        if (rc < 0)
            conn_fail(c, rc, "oversized frame header");
    }
}

static void on_timer(uv_timer_t *t)
{
    ch_conn_t *c = t->data;
    if (c->draining)
        conn_close_handles(c); /* peer did not take the last writes in time */
    else if (c->state == ST_READY)
        conn_set_ready(c); /* deferred ready_cb of a plain link */
    else if (c->state != ST_CLOSING)
        conn_fail(c, -ETIMEDOUT, "handshake timed out");
}

/* ---------------------------------------------------------------- peers */

static void conn_name_peer(ch_conn_t *c)
{
    if (c->is_tcp) {
        struct sockaddr_storage ss;
        int n = sizeof ss;
        char ip[64];
        if (uv_tcp_getpeername(&c->u.tcp, (struct sockaddr *)&ss, &n) == 0 &&
            getnameinfo((struct sockaddr *)&ss, (socklen_t)n, ip, sizeof ip, NULL, 0,
                        NI_NUMERICHOST) == 0) {
            int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                      : ((struct sockaddr_in *)&ss)->sin_port);
            if (ss.ss_family == AF_INET6)
                snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, port);
            else
                snprintf(c->peer, sizeof c->peer, "%s:%d", ip, port);
        }
        return;
    }
    pid_t pid;
    uid_t uid;
    gid_t gid;
    if (ch_conn_peer_cred(c, &pid, &uid, &gid) == 0)
        snprintf(c->peer, sizeof c->peer, "unix:pid=%ld,uid=%lu", (long)pid, (unsigned long)uid);
    else
        snprintf(c->peer, sizeof c->peer, "unix:?");
}

/* Stream connected (accepted, opened or connected): start the handshake. */
static int conn_start(ch_conn_t *c, int is_server)
{
    conn_name_peer(c);
    if (c->is_tcp) {
        uv_tcp_nodelay(&c->u.tcp, 1);
        uv_tcp_keepalive(&c->u.tcp, 1, 30);
    }
    int rc = uv_read_start(&c->u.stream, on_alloc, on_read);
    if (rc < 0)
        return ch_err_from_uv(rc);
    if (!c->keyed) {
        c->state = ST_READY;
        return 0;
    }
    if (is_server) {
        c->state = ST_WAIT_HELLO;
        return 0;
    }
    return send_hello(c);
}

static int conn_init_stream(ch_conn_t *c, int tcp)
{
    c->is_tcp = tcp;
    int rc = tcp ? uv_tcp_init(c->loop, &c->u.tcp) : uv_pipe_init(c->loop, &c->u.pipe, 0);
    if (rc < 0)
        return ch_err_from_uv(rc);
    c->u.handle.data = c;
    return 0;
}

/* Either the handshake timer or, for plain links, the deferred ready report. */
static void conn_arm_timer(ch_conn_t *c)
{
    uv_timer_start(&c->timer, on_timer, c->state == ST_READY ? 0 : c->hs_timeout_ms, 0);
}

/* Free a conn whose stream handle was never initialised. */
static void conn_discard_bare(ch_conn_t *c)
{
    c->notify_close = 0;
    c->state = ST_CLOSING;
    c->handles_closed = 1; /* the stream never existed */
    c->handles_closing = 1;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

int ch_conn_accept(uv_loop_t *loop, uv_stream_t *server, const ch_conn_opts_t *opts,
                   const ch_conn_cbs_t *cbs, void *ud, ch_conn_t **out)
{
    ch_conn_t *c = NULL;
    *out = NULL;
    if (!server)
        return -EINVAL;
    int rc = conn_new(loop, opts, cbs, ud, &c);
    if (rc < 0)
        return rc;
    int tcp = uv_handle_get_type((uv_handle_t *)server) == UV_TCP;
    rc = conn_init_stream(c, tcp);
    if (rc < 0) {
        conn_discard_bare(c);
        return rc;
    }
    rc = uv_accept(server, &c->u.stream);
    if (rc == 0)
        rc = conn_start(c, 1);
    if (rc < 0) {
        conn_abort_new(c);
        return ch_err_from_uv(rc);
    }
    conn_arm_timer(c);
    *out = c;
    return 0;
}

int ch_conn_open_fd(uv_loop_t *loop, int fd, const ch_conn_opts_t *opts, const ch_conn_cbs_t *cbs,
                    void *ud, ch_conn_t **out)
{
    ch_conn_t *c = NULL;
    *out = NULL;
    int rc = conn_new(loop, opts, cbs, ud, &c);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    rc = conn_init_stream(c, 0);
    if (rc < 0) {
        close(fd);
        conn_discard_bare(c);
        return rc;
    }
    rc = uv_pipe_open(&c->u.pipe, fd);
    if (rc < 0) {
        close(fd);
        conn_abort_new(c);
        return ch_err_from_uv(rc);
    }
    rc = conn_start(c, opts->is_server);
    if (rc < 0) {
        conn_abort_new(c);
        return rc;
    }
    conn_arm_timer(c);
    *out = c;
    return 0;
}

static void on_connect(uv_connect_t *req, int status)
{
    ch_conn_t *c = req->data;
    if (c->state == ST_CLOSING)
        return;
    if (status < 0) {
        CH_LOGI("net", "connect to %s failed: %s", c->peer, uv_strerror(status));
        conn_close_with(c, ch_err_from_uv(status));
        return;
    }
    int rc = conn_start(c, 0);
    if (rc < 0) {
        conn_fail(c, rc, "link setup failed");
        return;
    }
    if (c->state == ST_READY)
        conn_set_ready(c);
}

static int conn_do_connect(ch_conn_t *c, const struct sockaddr *sa)
{
    c->state = ST_CONNECTING;
    c->connect_req.data = c;
    return ch_err_from_uv(uv_tcp_connect(&c->connect_req, &c->u.tcp, sa, on_connect));
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    ch_conn_t *c = req->data;
    if (c->state != ST_CLOSING) {
        int rc = status < 0 ? ch_err_from_uv(status) : -ENOENT;
        if (status == 0 && res) {
            if (res->ai_family == AF_INET6)
                ((struct sockaddr_in6 *)res->ai_addr)->sin6_port = htons((uint16_t)c->port);
            else
                ((struct sockaddr_in *)res->ai_addr)->sin_port = htons((uint16_t)c->port);
            rc = conn_do_connect(c, res->ai_addr);
        }
        if (rc < 0) {
            CH_LOGI("net", "connect to %s failed: %s", c->peer, ch_strerror(rc));
            conn_close_with(c, rc);
        }
    }
    uv_freeaddrinfo(res);
    conn_release(c);
}

int ch_conn_connect_tcp(uv_loop_t *loop, const char *host, int port, const ch_conn_opts_t *opts,
                        const ch_conn_cbs_t *cbs, void *ud, ch_conn_t **out)
{
    ch_conn_t *c = NULL;
    *out = NULL;
    if (!host || port <= 0 || port > 65535)
        return -EINVAL;
    int rc = conn_new(loop, opts, cbs, ud, &c);
    if (rc < 0)
        return rc;
    c->port = port;
    snprintf(c->peer, sizeof c->peer, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    rc = conn_init_stream(c, 1);
    if (rc < 0) {
        conn_discard_bare(c);
        return rc;
    }
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) {
        rc = conn_do_connect(c, (struct sockaddr *)&ss);
    } else {
        /* A host name: resolve off the loop thread. The request holds a reference so
         * the conn outlives it even if the link is closed meanwhile. */
        struct addrinfo hints;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        c->state = ST_RESOLVING;
        c->gai_req.data = c;
        rc = ch_err_from_uv(uv_getaddrinfo(loop, &c->gai_req, on_resolved, host, NULL, &hints));
        if (rc == 0)
            c->refs++;
    }
    if (rc < 0) {
        conn_abort_new(c);
        return rc;
    }
    conn_arm_timer(c);
    *out = c;
    return 0;
}

/* ---------------------------------------------------------------- accessors */

int ch_conn_is_ready(const ch_conn_t *c)
{
    return c && c->state == ST_READY;
}

const char *ch_conn_peer(const ch_conn_t *c)
{
    return c ? c->peer : "?";
}

int ch_conn_peer_cred(const ch_conn_t *c, pid_t *pid, uid_t *uid, gid_t *gid)
{
    if (!c)
        return -EINVAL;
    if (c->is_tcp)
        return -ENOTSUP;
    uv_os_fd_t fd;
    int rc = uv_fileno(&c->u.handle, &fd);
    if (rc < 0)
        return ch_err_from_uv(rc);
    struct ucred cr;
    socklen_t n = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) < 0)
        return -errno;
    if (pid)
        *pid = cr.pid;
    if (uid)
        *uid = cr.uid;
    if (gid)
        *gid = cr.gid;
    return 0;
}

const char *ch_conn_role(const ch_conn_t *c)
{
    return c ? c->role : "";
}

void *ch_conn_data(const ch_conn_t *c)
{
    return c ? c->ud : NULL;
}

void ch_conn_set_data(ch_conn_t *c, void *ud)
{
    if (c)
        c->ud = ud;
}
