/* Host-staged collectives for a device backend (coll.h: wrk_coll_stage_t): the collectives
 * take the backend's memory and reach it only through the backend's copies. For ranks that
 * share one GPU, where NCCL refuses to run. */
#ifndef ENG_STAGE_H
#define ENG_STAGE_H

#include "workerd/coll/coll.h"
#include "workerd/engine/backend.h"

/* *out: alloc, free and copy of be (borrowed: it must outlive the collectives context). */
void eng_stage_of(const eng_backend_t *be, wrk_coll_stage_t *out);

#endif
