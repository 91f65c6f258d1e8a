/* A job's checks at submit beyond its fields, for ch_jobspec_validate: what it reads on
 * disk and what a rank must hold. Each fills err naming the field at fault and returns
 * CH_E_CONFIG. */
#ifndef CH_JOBCHECK_H
#define CH_JOBCHECK_H

#include <stddef.h>

#include "common/jobspec.h"

/* train.data and train.val_data (every file: format, size, every token < vocab) and
 * train.init_from (readable; each tensor's name and shape against [model]). */
int ch_jobcheck_files(const ch_jobspec_t *j, char *err, size_t errlen);
/* The plan's memory per rank (common/plan.h) against CH_JOBSPEC_RANK_BYTES_MAX. */
int ch_jobcheck_memory(const ch_jobspec_t *j, char *err, size_t errlen);

#endif
