/* Network side of the coordinator: the TCP listener (workers and remote chorusctl,
 * authenticated with the cluster key) and the Unix control socket (plain frames, peer
 * checked with SO_PEERCRED). Each accepted connection is a link; messages go to
 * rpc.c's table. Links are owned here and freed in their close callback. */
#ifndef COORD_SERVER_H
#define COORD_SERVER_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/conn.h"
#include "users.h"

typedef struct coord coord_t;
typedef struct coord_node coord_node_t;

enum { COORD_ROLE_WORKER = 1u << 0, COORD_ROLE_CTL = 1u << 1 };

typedef struct coord_link {
    coord_t *c;
    ch_conn_t *conn;
    int is_unix;
    unsigned role;      /* COORD_ROLE_*; 0 until the handshake is done */
    coord_node_t *node; /* set by Register */
    coord_cred_t cred;  /* control links: who is asking */
    int closing;        /* coord_link_close was called: nothing more is dispatched */
    struct coord_link *prev, *next;
    /* In srv's queue of unauthenticated TCP links (oldest first) while unauth is set. */
    int unauth;
    struct coord_link *uprev, *unext;
    ch_ratelimit_t log_rl; /* lines this peer can cause: coord_link_log_ok */
    /* In srv's list of links whose sends of this loop turn wait in one write while corked
     * is set (coord_link_send, coord_server_flush). */
    int corked;
    struct coord_link *cprev, *cnext;
} coord_link_t;

/* Log lines a peer can cause at will (refused requests, rejected reports): at most
 * COORD_PEER_LOG_BURST per window per link; the next line allowed says how many were
 * left out. */
#define COORD_PEER_LOG_BURST     20
#define COORD_PEER_LOG_WINDOW_MS 10000

/* What the coordinator reads is small (Register, RankEvent, KvSet <= 64 KiB, Submit):
 * a peer's frame over 1 MiB closes its link before anything is allocated for it. */
#define COORD_FRAME_IN_MAX (1u << 20)
/* Peers that fail before authenticating: at most this many WARN lines per window. */
#define COORD_UNAUTH_LOG_BURST     10
#define COORD_UNAUTH_LOG_WINDOW_MS 10000
/* TCP connections still in their handshake, at most: COORD_UNAUTH_MAX, or a quarter of
 * the descriptor limit when that is smaller (the rest stay for workers, the control
 * socket and the store). At the cap a new connection closes the oldest unauthenticated
 * one (a real peer's handshake takes one round trip; a flood's connections only wait),
 * and that is logged at most COORD_UNAUTH_LOG_BURST times per window. */
#define COORD_UNAUTH_MAX 512

typedef struct coord_server {
    ch_ratelimit_t unauth_log, unauth_cap_log;
    coord_link_t *unauth_oldest, *unauth_newest;
    size_t n_unauth, max_unauth;
    uint64_t unauth_evicted; /* connections closed at the cap, since the start */
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    int tcp_open, pipe_open;
    coord_link_t *links;
    coord_link_t *corked; /* links with sends waiting for coord_server_flush */
    char addr[80];        /* actual listen address, "HOST:PORT" */
} coord_server_t;

/* Bind and listen on cfg.listen and cfg.ctl_socket; fills srv.addr. */
int coord_server_start(coord_t *c);
/* Close the listeners and every link (their close callbacks run from the loop). */
void coord_server_stop(coord_t *c);

/* Send env on a link (request id as set by the caller). What a link is sent in one loop
 * turn leaves in one write, at coord_server_flush. */
int coord_link_send(coord_link_t *l, Chorus__Envelope *env);
/* Write what every link was sent this loop turn (before the loop sleeps: coord.c). */
void coord_server_flush(coord_t *c);
/* Reply Error{code, message} to request rid. */
void coord_link_error(coord_link_t *l, uint64_t rid, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void coord_link_close(coord_link_t *l);
/* What a link's end undoes: its rendezvous waits, its node's link (the node then turns
 * suspect). Called from the link's close callback (and by the fuzz targets, whose links
 * have no connection). */
void coord_link_gone(coord_t *c, coord_link_t *l, int reason);
const char *coord_link_peer(const coord_link_t *l);
/* 1 when one more peer-caused line may be logged for l; *suppressed then holds how many
 * were left out before it. */
int coord_link_log_ok(coord_link_t *l, uint32_t *suppressed);

/* "IP:PORT" (IPv6 as "[::1]:PORT") into ss; CH_E_CONFIG when malformed. */
int coord_addr_parse(const char *hostport, struct sockaddr_storage *ss);
/* Bound address of a TCP handle as "IP:PORT" or "[IP6]:PORT". */
void coord_addr_name(const uv_tcp_t *tcp, char *out, size_t cap);

#endif
