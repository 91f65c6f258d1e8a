/* Cross-field rules of a job file (jobrules.c); ch_jobspec_validate calls them. */
#ifndef CH_JOBRULES_H
#define CH_JOBRULES_H

#include <stddef.h>

#include "common/jobspec.h"

/* 0, or CH_E_CONFIG with err (errlen bytes) naming the field and what it must be; last,
 * whether the model fits (ch_jobcheck_memory). */
int ch_jobrules_check(const ch_jobspec_t *j, char *err, size_t errlen);

#endif
