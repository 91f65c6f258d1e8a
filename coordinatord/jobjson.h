/* /jobs/<id>.json on the status page's address: one job as JSON, for scripts and
 * dashboards: the status fields (chorusctl status --json's, DESIGN §10), the run id, the
 * restart count and the series the page draws (step, loss, tokens/s, MFU, step time), at
 * most the series' bounded points. Like the page: no job file, key or path. */
#ifndef COORD_JOBJSON_H
#define COORD_JOBJSON_H

#include "common/buf.h"

typedef struct coord coord_t;

/* Append job id's document (id or name, ".json" already cut) to b: 0, CH_E_NOTFOUND. */
int coord_page_job_json(coord_t *c, const char *id, ch_buf_t *b);

#endif
