/* Launch tokens: reports bound to what was launched.
 *
 * A cluster-key holder can register under any node name. Right after a coordinator
 * restart, before the real workerd is back, such a peer could take a node's name and
 * report that node's ranks finished, failed or checkpointed. So every StartRanks carries
 * a token for its (job, generation, node), and a rank event or a re-adoption counts only
 * when it presents the token of the ranks it speaks for.
 *
 * The token is HMAC(launch key, job | generation | node), the launch key being 32 random
 * bytes the coordinator keeps in its state directory (launch.key, mode 0600, made on
 * first start). So a restarted coordinator knows every token it ever handed out without
 * a row per generation, and no key holder can compute one. Off (launch-tokens = no) only
 * for peers that predate tokens. */
#ifndef COORD_LAUNCH_H
#define COORD_LAUNCH_H

#include <stdint.h>

#include "chorus.pb-c.h"

typedef struct coord coord_t;
typedef struct coord_node coord_node_t;

/* Load <state-dir>/launch.key, creating it when missing. */
int coord_launch_init(coord_t *c);
/* The token of job's generation gen on node (never 0 while tokens are on). */
uint64_t coord_launch_token(const coord_t *c, const char *job_id, uint64_t gen, const char *node);
/* 1 when token is the one handed to node for (job, gen), or tokens are off. The last right
 * one is remembered on node. */
int coord_launch_ok(const coord_t *c, const char *job_id, uint64_t gen, coord_node_t *node,
                    uint64_t token);
/* reg's running and finished ranks without those whose token is wrong, as a shallow copy
 * in *out whose two arrays are malloc'd (coord_launch_register_free). Refused ranks are
 * counted in *refused: to the coordinator they are missing from the node. */
int coord_launch_register(const coord_t *c, coord_node_t *node, const Chorus__Register *reg,
                          Chorus__Register *out, size_t *refused);
void coord_launch_register_free(Chorus__Register *r);

#endif
