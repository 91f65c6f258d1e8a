/* Request handlers: one table row per message body, carrying the handler and its
 * policy (which roles may send it, whether the sender must be a registered node). */
#ifndef COORD_RPC_H
#define COORD_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.pb-c.h"

typedef struct coord coord_t;
typedef struct coord_link coord_link_t;

/* Handle one message from link (env borrowed for the call). */
void coord_rpc_dispatch(coord_t *c, coord_link_t *l, Chorus__Envelope *env);
/* coord_kv_reply_fn for the rendezvous store: the waiter is a coord_link_t. */
void coord_rpc_kv_reply(void *ud, void *waiter, uint64_t request_id, int code, const uint8_t *val,
                        size_t len);

#endif
