/* chorusctl logs through the coordinator: a LogRead from a control link goes to the
 * workerd that ran the rank, and its LogChunk (or Error) comes back to the asker under
 * the asker's request id. Only the job's owner, root and admins may read (users.h).
 *
 * One read is one chunk (at most 256 KiB): a follower asks again for what came after,
 * so a reader that stops reading costs nothing but its pending entry, answered or
 * expired within COORD_LOGS_TIMEOUT_MS. Pending reads are bounded per control link
 * (COORD_LOGS_PER_LINK) and in all (COORD_LOGS_MAX): beyond, the read is refused. */
#ifndef COORD_LOGS_H
#define COORD_LOGS_H

#include <stdint.h>

#include "chorus.pb-c.h"

typedef struct coord coord_t;
typedef struct coord_link coord_link_t;
typedef struct coord_node coord_node_t;

#define COORD_LOGS_TIMEOUT_MS 10000
#define COORD_LOGS_PER_LINK   16
#define COORD_LOGS_MAX        4096

/* A control link's LogRead. */
void coord_logs_read(coord_t *c, coord_link_t *l, const Chorus__Envelope *req);
/* A worker's LogChunk or Error: 1 when it answered a pending read (sent on), else 0. */
int coord_logs_reply(coord_t *c, coord_link_t *from, const Chorus__Envelope *env);
/* A link closed: drop its reads (a control link), answer those waiting on it (a node's). */
void coord_logs_link_gone(coord_t *c, coord_link_t *l);
/* Periodic: answer reads older than COORD_LOGS_TIMEOUT_MS with -ETIMEDOUT. */
void coord_logs_expire(coord_t *c, uint64_t now_ms);
void coord_logs_fini(coord_t *c);

#endif
