/* Jobs: what the workers report. Rank events (started, progress, checkpoint, done,
 * failed, exited) move a rank's state; a node's (re-)registration re-adopts the ranks it
 * still runs and kills those no current job owns. */
#ifndef COORD_JOBEVENT_H
#define COORD_JOBEVENT_H

#include "chorus.pb-c.h"
#include "job.h"

void coord_job_rank_event(coord_t *c, coord_node_t *from, const Chorus__RankEvent *ev);
/* The same for j, the job ev->job_id names, already found (NULL: none): a node's progress
 * applies its ranks' events with one lookup, not one each. */
void coord_job_rank_event_in(coord_t *c, coord_job_t *j, coord_node_t *from,
                             const Chorus__RankEvent *ev);
/* Node (re-)registered reporting the ranks it still runs: re-adopt known ones, kill
 * unknown ones, count the missing ones as lost. */
void coord_job_node_registered(coord_t *c, coord_node_t *n, const Chorus__Register *reg);

#endif
