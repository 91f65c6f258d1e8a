/* Blocking message link over POSIX sockets (client.h): the same frames and handshake
 * as conn.c, driven by poll() with deadlines instead of an event loop. The socket is
 * non-blocking; every wait is bounded by the caller's timeout. */
#include "common/client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "common/err.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/util.h"

#define CLIENT_SEND_TIMEOUT_MS 30000
#define CLIENT_LINK_ERROR_MS   500 /* reading why a refused link was closed */

struct ch_client {
    int fd;
    int broken; /* a framing or auth error happened: the stream is out of sync */
    ch_session_t sess;
    ch_frame_reader_t rd;
    uint64_t next_request_id;
};

/* Deadline helpers: timeout_ms < 0 means forever. */
static uint64_t deadline_of(int timeout_ms)
{
    return timeout_ms < 0 ? UINT64_MAX : ch_now_ms() + (uint64_t)timeout_ms;
}

static int remaining_ms(uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return -1;
    uint64_t now = ch_now_ms();
    if (now >= deadline)
        return 0;
    uint64_t left = deadline - now;
    return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

/* Wait for events on fd until the deadline: 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int left = remaining_ms(deadline);
        int n = poll(&p, 1, left);
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return 0;
}

static int client_new(int fd, ch_client_t **out)
{
    ch_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->fd = fd;
    ch_session_init_plain(&c->sess, 0);
    ch_frame_reader_init(&c->rd, CH_FRAME_MAX_DEFAULT);
    *out = c;
    return 0;
}

void ch_client_destroy(ch_client_t *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    ch_frame_reader_fini(&c->rd);
    explicit_bzero(&c->sess, sizeof c->sess);
    free(c);
}

int ch_client_fd(const ch_client_t *c)
{
    return c ? c->fd : -1;
}

/* ---------------------------------------------------------------- raw I/O */

static int write_all(ch_client_t *c, const uint8_t *p, size_t n, uint64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(c->fd, POLLOUT, deadline);
                if (rc < 0)
                    return rc;
                continue;
            }
            return errno == ECONNRESET ? -EPIPE : -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_env(ch_client_t *c, ch_session_t *s, Chorus__Envelope *env, uint64_t deadline)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = ch_msg_encode(s, env, &buf, &len);
    if (rc < 0)
        return rc;
    rc = write_all(c, buf, len, deadline);
    free(buf);
    if (rc < 0)
        c->broken = 1; /* a partial frame may be on the wire */
    return rc;
}

/* Next frame decoded with session s (NULL: untagged handshake frame). */
static int recv_env(ch_client_t *c, ch_session_t *s, uint64_t deadline, Chorus__Envelope **out)
{
    *out = NULL;
    if (c->broken)
        return -EPIPE;
    for (;;) {
        const uint8_t *payload, *tag;
        size_t len;
        int rc = ch_frame_reader_next(&c->rd, &payload, &len, &tag);
        if (rc > 0)
            rc = ch_msg_decode(s, payload, len, tag, out);
        if (rc < 0) {
            c->broken = 1;
            return rc;
        }
        if (*out)
            return 0;

        uint8_t buf[16384];
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            rc = ch_frame_reader_feed(&c->rd, buf, (size_t)n);
            if (rc < 0) {
                c->broken = 1;
                return rc;
            }
            continue;
        }
        if (n == 0)
            return -EPIPE;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == ECONNRESET ? -EPIPE : -errno;
        rc = wait_fd(c->fd, POLLIN, deadline);
        if (rc < 0)
            return rc;
    }
}

/* ---------------------------------------------------------------- handshake */

static int client_handshake(ch_client_t *c, const ch_key_t *key, const char *role,
                            uint64_t deadline)
{
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN], proof[CH_PROOF_LEN];
    Chorus__Envelope *in = NULL;
    uint32_t mac = CH_MAC_HMAC_SHA256;
    int rc;

    ch_auth_nonce(nc);
    Chorus__Envelope hello_env = CHORUS__ENVELOPE__INIT;
    Chorus__AuthHello hello = CHORUS__AUTH_HELLO__INIT;
    hello.nonce.data = nc;
    hello.nonce.len = CH_NONCE_LEN;
    hello.role = (char *)(role ? role : "");
    hello.macs = ch_auth_macs_offered();
    hello_env.body_case = CHORUS__ENVELOPE__BODY_AUTH_HELLO;
    hello_env.auth_hello = &hello;
    CH_CHECK_GOTO(send_env(c, NULL, &hello_env, deadline), rc, out);

    CH_CHECK_GOTO(recv_env(c, NULL, deadline, &in), rc, out);
    if (in->body_case != CHORUS__ENVELOPE__BODY_AUTH_CHALLENGE ||
        in->auth_challenge->nonce.len != CH_NONCE_LEN) {
        rc = CH_E_AUTH;
        goto out;
    }
    mac = in->auth_challenge->mac;
    if (!ch_auth_mac_acceptable(mac)) {
        rc = CH_E_AUTH;
        goto out;
    }
    memcpy(ns, in->auth_challenge->nonce.data, CH_NONCE_LEN);
    /* The server proves it holds the key before we reveal anything derived from it. */
    CH_CHECK_GOTO(ch_auth_check_proof(key, "chorus-s", nc, ns, in->auth_challenge->proof.data,
                                      in->auth_challenge->proof.len),
                  rc, out);
    ch_msg_free(in);
    in = NULL;

    ch_auth_proof(key, "chorus-c", nc, ns, proof);
    Chorus__Envelope proof_env = CHORUS__ENVELOPE__INIT;
    Chorus__AuthProof p = CHORUS__AUTH_PROOF__INIT;
    p.proof.data = proof;
    p.proof.len = CH_PROOF_LEN;
    proof_env.body_case = CHORUS__ENVELOPE__BODY_AUTH_PROOF;
    proof_env.auth_proof = &p;
    CH_CHECK_GOTO(send_env(c, NULL, &proof_env, deadline), rc, out);

    ch_session_init_keyed(&c->sess, 0, key, nc, ns, (int)mac);
    rc = recv_env(c, &c->sess, deadline, &in);
    if (rc == -EPIPE)
        rc = CH_E_AUTH; /* the server hangs up on a proof it rejects */
    if (rc < 0)
        goto out;
    if (in->body_case != CHORUS__ENVELOPE__BODY_AUTH_RESULT || !in->auth_result->ok)
        rc = CH_E_AUTH;
out:
    ch_msg_free(in);
    explicit_bzero(proof, sizeof proof);
    return rc;
}

/* ---------------------------------------------------------------- connect */

/* Non-blocking connect bounded by the deadline; returns a connected fd or -errno. */
static int connect_addr(int family, const struct sockaddr *sa, socklen_t salen, uint64_t deadline)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (connect(fd, sa, salen) < 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            rc = -errno;
            goto out;
        }
        CH_CHECK_GOTO(wait_fd(fd, POLLOUT, deadline), rc, out);
        int err = 0;
        socklen_t n = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) < 0)
            err = errno;
        if (err) {
            rc = -err;
            goto out;
        }
    }
out:
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

int ch_client_connect_unix(const char *path, int timeout_ms, ch_client_t **out)
{
    *out = NULL;
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    if (!path || strlen(path) >= sizeof sun.sun_path)
        return path ? -ENAMETOOLONG : -EINVAL;
    memcpy(sun.sun_path, path, strlen(path));
    int fd = connect_addr(AF_UNIX, (struct sockaddr *)&sun, sizeof sun, deadline_of(timeout_ms));
    if (fd < 0)
        return fd;
    int rc = client_new(fd, out);
    if (rc < 0)
        close(fd);
    return rc;
}

int ch_client_connect_tcp(const char *hostport, const ch_key_t *key, const char *role,
                          int timeout_ms, ch_client_t **out)
{
    char host[256], port_s[8];
    int port, rc, fd = -1;
    struct addrinfo hints, *res = NULL;
    ch_client_t *c = NULL;
    uint64_t deadline = deadline_of(timeout_ms);

    *out = NULL;
    if (!key)
        return -EINVAL;
    CH_CHECK_GOTO(ch_parse_hostport(hostport, host, sizeof host, &port), rc, out);
    snprintf(port_s, sizeof port_s, "%d", port);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port_s, &hints, &res);
    if (g != 0) {
        rc = g == EAI_SYSTEM ? -errno : g == EAI_MEMORY ? -ENOMEM : -ENOENT;
        goto out;
    }
    rc = -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = connect_addr(ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline);
        if (fd >= 0)
            break;
        rc = fd;
    }
    if (fd < 0)
        goto out;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    CH_CHECK_GOTO(client_new(fd, &c), rc, out);
    fd = -1;
    CH_CHECK_GOTO(client_handshake(c, key, role, deadline), rc, out);
    *out = c;
    c = NULL;
    rc = 0;
out:
    if (res)
        freeaddrinfo(res);
    if (fd >= 0)
        close(fd);
    ch_client_destroy(c);
    return rc;
}

int ch_client_from_fd(int fd, ch_client_t **out)
{
    *out = NULL;
    int rc = set_nonblock(fd);
    if (rc == 0)
        rc = client_new(fd, out);
    if (rc < 0)
        close(fd);
    return rc;
}

/* ---------------------------------------------------------------- messages */

int ch_client_send(ch_client_t *c, Chorus__Envelope *env)
{
    if (!c || !env)
        return -EINVAL;
    if (c->broken)
        return -EPIPE;
    return send_env(c, &c->sess, env, deadline_of(CLIENT_SEND_TIMEOUT_MS));
}

int ch_client_recv(ch_client_t *c, int timeout_ms, Chorus__Envelope **out)
{
    if (!c || !out)
        return -EINVAL;
    return recv_env(c, &c->sess, deadline_of(timeout_ms), out);
}

/* The server may refuse a link before reading a request (a control-socket user it does
 * not allow): it sends Error{request id 0} and closes, so our send can fail with EPIPE
 * and the reason waits in our receive buffer. Read it rather than report "Broken pipe". */
static int link_error(ch_client_t *c, Chorus__Envelope **resp)
{
    int broken = c->broken;
    c->broken = 0;
    for (;;) {
        Chorus__Envelope *in = NULL;
        if (recv_env(c, &c->sess, deadline_of(CLIENT_LINK_ERROR_MS), &in) < 0)
            break;
        if (in->body_case == CHORUS__ENVELOPE__BODY_ERROR && in->request_id == 0) {
            c->broken = 1;
            *resp = in;
            return in->error->code < 0 ? in->error->code : -EIO;
        }
        ch_msg_free(in);
    }
    c->broken = broken;
    return 0;
}

int ch_client_call(ch_client_t *c, Chorus__Envelope *req, int timeout_ms, Chorus__Envelope **resp)
{
    if (!c || !req || !resp)
        return -EINVAL;
    *resp = NULL;
    uint64_t deadline = deadline_of(timeout_ms);
    req->request_id = ++c->next_request_id;
    int rc = ch_client_send(c, req);
    if (rc == -EPIPE) {
        int why = link_error(c, resp);
        return why < 0 ? why : rc;
    }
    if (rc < 0)
        return rc;
    for (;;) {
        Chorus__Envelope *in = NULL;
        rc = recv_env(c, &c->sess, deadline, &in);
        if (rc < 0)
            return rc;
        /* Request id 0: an Error about the link itself, the answer to every call. */
        int link_err = in->request_id == 0 && in->body_case == CHORUS__ENVELOPE__BODY_ERROR;
        if (in->request_id != req->request_id && !link_err) {
            ch_msg_free(in);
            continue;
        }
        *resp = in;
        if (in->body_case == CHORUS__ENVELOPE__BODY_ERROR)
            return in->error->code < 0 ? in->error->code : -EIO;
        return 0;
    }
}
