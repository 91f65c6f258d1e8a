/* Blocking message link for short-lived clients (chorusctl) and for rank processes
 * talking to their workerd over the inherited socketpair. Same frames and handshake
 * as conn.h. Not thread-safe: one thread uses a client at a time. */
#ifndef CH_CLIENT_H
#define CH_CLIENT_H

#include "chorus.pb-c.h"
#include "common/auth.h"

typedef struct ch_client ch_client_t;

/* Unix control socket (no key: the server checks SO_PEERCRED). */
int ch_client_connect_unix(const char *path, int timeout_ms, ch_client_t **out);
/* TCP "host:port" with the cluster key; runs the handshake as role. */
int ch_client_connect_tcp(const char *hostport, const ch_key_t *key, const char *role,
                          int timeout_ms, ch_client_t **out);
/* An already connected fd (socketpair); plain session. Takes ownership of fd. */
int ch_client_from_fd(int fd, ch_client_t **out);

int ch_client_send(ch_client_t *c, Chorus__Envelope *env);
/* Next message, waiting at most timeout_ms (-1: forever): -ETIMEDOUT, -EPIPE on EOF.
 * Free *out with ch_msg_free. */
int ch_client_recv(ch_client_t *c, int timeout_ms, Chorus__Envelope **out);
/* Send req with a fresh request_id and wait for the reply carrying it (other messages
 * received meanwhile are dropped). A reply whose body is Error is returned as its code,
 * with *resp still set so the caller can print the message. */
int ch_client_call(ch_client_t *c, Chorus__Envelope *req, int timeout_ms, Chorus__Envelope **resp);
int ch_client_fd(const ch_client_t *c);
void ch_client_destroy(ch_client_t *c);

#endif
