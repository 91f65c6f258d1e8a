/* The record of a workerd's ranks; see adopt.h. */
#include "workerd/adopt.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/procmetrics.h"
#include "common/util.h"

#define LINE_MAX_BYTES 160 /* two ints, three u64, a 63-byte job id and the spaces */

int wrk_adopt_lock(const char *run_dir)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", run_dir, WRK_ADOPT_LOCK) >= sizeof path)
        return -ENAMETOOLONG;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        close(fd);
        return rc;
    }
    return fd;
}

int wrk_adopt_save(const char *path, const wrk_adopt_rank_t *v, size_t n)
{
    size_t cap = 64 + n * LINE_MAX_BYTES, len = 0;
    char *text = malloc(cap);
    if (!text)
        return -ENOMEM;
    len +=
        (size_t)snprintf(text, cap, "# workerd ranks: pid start_ticks job gen rank token keep\n");
    for (size_t i = 0; i < n; i++) {
        const wrk_adopt_rank_t *r = &v[i];
        int k = snprintf(text + len, cap - len, "%d %" PRIu64 " %s %" PRIu64 " %u %" PRIu64 " %d\n",
                         r->pid, r->start_ticks, r->job_id[0] ? r->job_id : "-", r->gen, r->rank,
                         r->token, r->keep ? 1 : 0);
        if (k < 0 || (size_t)k >= cap - len) {
            free(text);
            return -ENAMETOOLONG;
        }
        len += (size_t)k;
    }
    int rc = ch_file_write_atomic(path, text, len, 0600);
    free(text);
    return rc;
}

void wrk_adopt_record(const char *run_dir, const wrk_adopt_rank_t *v, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", run_dir, WRK_ADOPT_FILE);
    int rc = wrk_adopt_save(path, v, n);
    if (rc < 0)
        CH_LOGW("adopt", "%s: %s", path, ch_strerror(rc));
}

int wrk_adopt_load(const char *path, wrk_adopt_rank_t **out, size_t *n)
{
    char *text = NULL;
    size_t len = 0, cnt = 0;
    *out = NULL;
    *n = 0;
    int rc = ch_file_read(path, (size_t)WRK_ADOPT_MAX * LINE_MAX_BYTES, &text, &len);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    wrk_adopt_rank_t *v = calloc(WRK_ADOPT_MAX, sizeof *v);
    if (!v) {
        free(text);
        return -ENOMEM;
    }
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && cnt < WRK_ADOPT_MAX;
         line = strtok_r(NULL, "\n", &save)) {
        wrk_adopt_rank_t r = {0};
        if (line[0] == '#')
            continue;
        /* keep is the 7th field; a record without it (an older workerd's) is 0 */
        int got = sscanf(line, "%d %" SCNu64 " %63s %" SCNu64 " %" SCNu32 " %" SCNu64 " %d", &r.pid,
                         &r.start_ticks, r.job_id, &r.gen, &r.rank, &r.token, &r.keep);
        if (got < 6 || r.pid <= 1)
            continue;
        v[cnt++] = r;
    }
    free(text);
    if (cnt == 0) {
        free(v);
        return 0;
    }
    *out = v;
    *n = cnt;
    return 0;
}

int wrk_adopt_alive(const wrk_adopt_rank_t *r)
{
    ch_proc_stat_t st;
    if (r->pid <= 1 || ch_proc_stat(r->pid, &st) < 0)
        return 0;
    return st.start_ticks == r->start_ticks && st.state != 'Z' && st.state != 'X';
}

void wrk_adopt_kill(const wrk_adopt_rank_t *r)
{
    /* The rank leads its own process group (proc.h): its helpers go with it. */
    CH_LOGW("adopt",
            "job=%s gen=%" PRIu64 " rank=%u pid=%d: left running by the previous workerd; "
            "it cannot be re-adopted, killing it (the coordinator restarts its job)",
            r->job_id, r->gen, r->rank, r->pid);
    if (kill(-r->pid, SIGKILL) < 0 && errno == ESRCH)
        kill(r->pid, SIGKILL);
}

int wrk_adopt_reap(const char *path, unsigned *found)
{
    wrk_adopt_rank_t *v = NULL;
    size_t n = 0;
    *found = 0;
    int rc = wrk_adopt_load(path, &v, &n);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!wrk_adopt_alive(&v[i]))
            continue;
        (*found)++;
        wrk_adopt_kill(&v[i]);
    }
    free(v);
    return n ? wrk_adopt_save(path, NULL, 0) : 0;
}

int wrk_adopt_start(const char *run_dir, wrk_adopt_rank_t **alive, size_t *n)
{
    char path[4096];
    wrk_adopt_rank_t *v = NULL;
    size_t cnt = 0, k = 0;
    *alive = NULL;
    *n = 0;
    int fd = wrk_adopt_lock(run_dir);
    if (fd < 0) {
        CH_LOGW("adopt", "run dir %s: %s%s; its rank record is not kept or checked", run_dir,
                ch_strerror(fd), fd == -EBUSY ? " (another workerd uses it)" : "");
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", run_dir, WRK_ADOPT_FILE);
    int rc = wrk_adopt_load(path, &v, &cnt);
    if (rc < 0)
        CH_LOGW("adopt", "%s: %s (ranks a previous workerd left are not checked)", path,
                ch_strerror(rc));
    for (size_t i = 0; i < cnt; i++)
        if (wrk_adopt_alive(&v[i]))
            v[k++] = v[i];
    if (k == 0) {
        free(v);
        return fd;
    }
    *alive = v;
    *n = k;
    return fd;
}
