/* Rank logs served to chorusctl logs through the coordinator (DESIGN §10): workerd
 * writes rank r of generation g of job J to RUN_DIR/J/g<g>/rank-<r>.log; a LogRead asks
 * for a chunk of one at an offset. Reading is pull-only: a follower asks again for what
 * came after, so nothing is buffered for a reader that stopped. */
#ifndef WRK_LOGS_H
#define WRK_LOGS_H

#include <stddef.h>

#include "chorus.pb-c.h"

/* Longest chunk served (a LogRead asking more gets this much). */
#define WRK_LOGS_CHUNK_MAX (256u << 10)

/* Fill out's data (malloc'd: the caller frees out->data.data), offset, size, generation
 * and rank from the log that lr names under run_dir (lr->generation must be set; job_id
 * already checked to be one path component); path gets the file's path. An offset past the
 * end gives no data. -ENOENT (err names the path) when there is no such log. */
int wrk_logs_read(const char *run_dir, const Chorus__LogRead *lr, Chorus__LogChunk *out, char *path,
                  size_t pathlen, char *err, size_t errlen);

#endif
