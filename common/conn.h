/* An authenticated message link on a libuv stream (TCP, Unix socket, socketpair).
 * Knows nothing of the application: it runs the handshake (auth.h), then delivers
 * each decoded Envelope to msg_cb and sends Envelopes given to ch_conn_send.
 *
 * Before authentication a server accepts frames of CH_CONN_HANDSHAKE_FRAME_MAX bytes
 * only; the link's max_frame applies once it is ready.
 *
 * Failure policy: a bad frame (oversized, undecodable, bad tag, replayed seq), a
 * handshake that fails or does not finish within handshake_timeout_ms, or a read
 * error closes the link with one log line naming the peer and the reason; close_cb
 * then runs exactly once. Memory is released only after libuv's close callback, so a
 * callback may call ch_conn_close on its own link safely. */
#ifndef CH_CONN_H
#define CH_CONN_H

#include <sys/types.h>
#include <uv.h>

#include "chorus.pb-c.h"
#include "common/auth.h"
#include "common/log.h"

typedef struct ch_conn ch_conn_t;

typedef struct ch_conn_cbs {
    /* Handshake done (immediately for plain links). May be NULL. */
    void (*ready_cb)(ch_conn_t *c, void *ud);
    /* One message. env is borrowed for the duration of the call. */
    void (*msg_cb)(ch_conn_t *c, Chorus__Envelope *env, void *ud);
    /* The link is closing; reason is 0 for a local ch_conn_close, else a negative code.
     * c stays valid until this returns and must not be used afterwards. */
    void (*close_cb)(ch_conn_t *c, int reason, void *ud);
} ch_conn_cbs_t;

typedef struct ch_conn_opts {
    const ch_key_t *key;           /* NULL: plain link (no handshake, zero tags) */
    int is_server;                 /* this side answers the handshake */
    const char *role;              /* sent in AuthHello by clients ("worker", "ctl") */
    uint32_t max_frame;            /* 0: CH_FRAME_MAX_DEFAULT */
    uint32_t handshake_timeout_ms; /* 0: 3000 */
    /* Server side: the line logged when a peer fails before authenticating goes through
     * this budget (borrowed; outlives the link). NULL: no limit. */
    ch_ratelimit_t *unauth_log;
} ch_conn_opts_t;

/* Largest frame a server accepts before the peer has authenticated: the handshake's
 * frames are under 200 bytes, so an unauthenticated peer costs a few KiB at most. */
#define CH_CONN_HANDSHAKE_FRAME_MAX 1024u

/* Accept a pending connection on a listening stream (TCP or pipe). */
int ch_conn_accept(uv_loop_t *loop, uv_stream_t *server, const ch_conn_opts_t *opts,
                   const ch_conn_cbs_t *cbs, void *ud, ch_conn_t **out);
/* Connect to host:port. ready_cb or close_cb tells how it went. */
int ch_conn_connect_tcp(uv_loop_t *loop, const char *host, int port, const ch_conn_opts_t *opts,
                        const ch_conn_cbs_t *cbs, void *ud, ch_conn_t **out);
/* Wrap an already connected socket fd (socketpair). Takes ownership of fd. */
int ch_conn_open_fd(uv_loop_t *loop, int fd, const ch_conn_opts_t *opts, const ch_conn_cbs_t *cbs,
                    void *ud, ch_conn_t **out);

/* Queue one message; the envelope is packed at once (caller keeps ownership of env).
 * -EPIPE when the link is closing or the handshake is not done. */
int ch_conn_send(ch_conn_t *c, Chorus__Envelope *env);
/* Gather what is sent from now on into one write, made by ch_conn_uncork (or
 * ch_conn_close): a server that answers many requests of one peer in a loop turn makes
 * one system call for them, not one each (on loopback a write also pays the peer's
 * receive). Only on a ready link; the owner must uncork before its loop sleeps. */
void ch_conn_cork(ch_conn_t *c);
/* Write what was gathered since ch_conn_cork; 0 or a negative code (the link then
 * closes, as for any failed write). */
int ch_conn_uncork(ch_conn_t *c);
/* Close (idempotent). close_cb runs later, from the loop. */
void ch_conn_close(ch_conn_t *c);

int ch_conn_is_ready(const ch_conn_t *c);
/* "127.0.0.1:41234" or "unix:pid=123,uid=0" */
const char *ch_conn_peer(const ch_conn_t *c);
/* Credentials of a Unix-socket peer (SO_PEERCRED). -ENOTSUP on TCP. */
int ch_conn_peer_cred(const ch_conn_t *c, pid_t *pid, uid_t *uid, gid_t *gid);
const char *ch_conn_role(const ch_conn_t *c); /* role the client announced ("" if none) */
void *ch_conn_data(const ch_conn_t *c);
void ch_conn_set_data(ch_conn_t *c, void *ud);

#endif
