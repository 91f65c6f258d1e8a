/* A job's run folders under run_dir; see rundir.h. */
#include "workerd/rundir.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/util.h"

/* A job id becomes a directory name: refuse anything that could leave run_dir. */
int wrk_rundir_safe_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 64 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (; *s; s++)
        if (*s == '/' || (unsigned char)*s < 0x20)
            return 0;
    return 1;
}

int wrk_rundir_gen(const char *run_dir, const char *job, uint64_t gen, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/%s/g%" PRIu64, run_dir, job, gen);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Run folders of a job's failed generations kept next to the running one: their logs
 * say why they failed; older ones go, so a job restarting many times cannot fill the
 * disk. */
#define KEEP_FAILED_GENS 3

static int gen_cmp_desc(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a < b) - (a > b);
}

/* Generation gen of job starts here: remove the run folders of its generations before it
 * but the KEEP_FAILED_GENS newest. */
void wrk_rundir_prune(const char *run_dir, const char *job, uint64_t gen)
{
    char dir[CH_PATH_LEN], path[CH_PATH_LEN + 32];
    uint64_t *olds = NULL;
    size_t n = 0, cap = 0;
    int w = snprintf(dir, sizeof dir, "%s/%s", run_dir, job);
    DIR *d = w < 0 || (size_t)w >= sizeof dir ? NULL : opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        if (e->d_name[0] != 'g' || e->d_name[1] < '0' || e->d_name[1] > '9')
            continue;
        unsigned long long g = strtoull(e->d_name + 1, &end, 10);
        if (*end != '\0' || g >= gen)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *v = realloc(olds, nc * sizeof *v);
            if (!v)
                break;
            olds = v;
            cap = nc;
        }
        olds[n++] = g;
    }
    closedir(d);
    if (n > 1) /* qsort's array may not be NULL, even for no element */
        qsort(olds, n, sizeof *olds, gen_cmp_desc);
    for (size_t i = KEEP_FAILED_GENS; i < n; i++) {
        snprintf(path, sizeof path, "%s/g%" PRIu64, dir, olds[i]);
        int rc = ch_rmtree(path);
        CH_LOGD("agent", "job=%s: run folder %s of a failed generation removed%s%s", job, path,
                rc < 0 ? ": " : "", rc < 0 ? ch_strerror(rc) : "");
    }
    free(olds);
}
