/* The interleaved schedule's entries pipeline.c calls (pipeline.h); private to
 * workerd/engine/pipeline*.c. */
#ifndef ENG_PIPELINE_IL_H
#define ENG_PIPELINE_IL_H

#include "workerd/engine/pipeline.h"

/* Release what eng_pipeline_init_interleaved made (its sends completed first). */
void eng_pipeline_il_fini(eng_pipeline_t *p);
/* One step's m micro-batches (the m of init) through ops->chunk_forward / chunk_backward. */
int eng_pipeline_il_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m);

#endif
