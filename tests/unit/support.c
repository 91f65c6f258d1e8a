/* Helpers shared by the unit tests (support.h). */
#include "support.h"

#include <errno.h>
#include <grp.h>
#include <ftw.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/gpt2.h"
#include "common/safetensors.h"
#include "common/util.h"

int ts_tmpdir(const char *tag, char *out, size_t n)
{
    const char *base = getenv("CHORUS_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    int rc = ch_mkdirs(base, 0755);
    if (rc < 0)
        return rc;
    int len = snprintf(out, n, "%s/%s.XXXXXX", base, tag);
    if (len < 0 || (size_t)len >= n)
        return -ENAMETOOLONG;
    return mkdtemp(out) ? 0 : -errno;
}

/* Whether uid/gid may search path (every folder on the way): a child switches and looks. */
static int reachable(const char *path, unsigned uid, unsigned gid)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
            _exit(2);
        _exit(access(path, X_OK) == 0 ? 0 : 1);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int ts_tmp_reachable_by(unsigned uid, unsigned gid)
{
    const char *base = getenv("CHORUS_TEST_TMP");
    if (base && *base && ch_mkdirs(base, 0755) == 0 && reachable(base, uid, gid))
        return 0;
    if (!reachable("/tmp", uid, gid))
        return -EACCES;
    return setenv("CHORUS_TEST_TMP", "/tmp", 1) < 0 ? -errno : 0;
}

/* Children come before their directory (FTW_DEPTH), so each directory is empty when
 * removed. A failure stops the walk with its (positive) errno, which nftw returns. */
static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int r = (type == FTW_DP) ? rmdir(path) : unlink(path);
    return r < 0 ? errno : 0;
}

int ts_rmrf(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    int rc = nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (rc < 0) /* nftw itself failed */
        return -errno;
    return -rc;
}

// ----------------------------------------------------------------------------
// in-process rendezvous table

void ts_rdzv_table_init(ts_rdzv_table_t *t)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    t->head = NULL;
}

void ts_rdzv_table_fini(ts_rdzv_table_t *t)
{
    while (t->head) {
        ts_kv_t *e = t->head;
        t->head = e->next;
        free(e->key);
        free(e->val);
        free(e);
    }
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

int ts_rdzv_table_set(void *ud, const char *key, const void *val, size_t len)
{
    ts_rdzv_table_t *t = ud;
    ts_kv_t *e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key)) || !(e->val = malloc(len ? len : 1))) {
        if (e)
            free(e->key);
        free(e);
        return -ENOMEM;
    }
    memcpy(e->val, val, len);
    e->len = len;
    pthread_mutex_lock(&t->mu);
    e->next = t->head;
    t->head = e;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int ts_rdzv_table_get(void *ud, const char *key, int timeout_ms, void **val, size_t *len)
{
    ts_rdzv_table_t *t = ud;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L)
        dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        ts_kv_t *e = t->head;
        while (e && strcmp(e->key, key) != 0)
            e = e->next;
        if (e) {
            *val = malloc(e->len ? e->len : 1);
            if (!*val)
                rc = -ENOMEM;
            else
                memcpy(*val, e->val, e->len), *len = e->len;
            break;
        }
        if (pthread_cond_timedwait(&t->cv, &t->mu, &dl) != 0) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int ts_run_threads(void *ranks, size_t stride, uint32_t n, void *(*fn)(void *))
{
    pthread_t *th = calloc(n ? n : 1, sizeof *th);
    uint32_t started = 0;
    int rc = th ? 0 : -ENOMEM;
    for (; rc == 0 && started < n; started++) {
        int e = pthread_create(&th[started], NULL, fn, (char *)ranks + started * stride);
        if (e != 0) {
            rc = -e;
            break;
        }
    }
    for (uint32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    return rc;
}

int ts_write_gpt2(const char *path, const struct ch_model_cfg *cfg, uint32_t positions, int dtype,
                  int prefixed)
{
    ch_st_writer_t *w = NULL;
    size_t n = ch_gpt2_count(cfg);
    void **bufs = calloc(n, sizeof *bufs);
    int rc = bufs ? ch_st_writer_create(path, &w) : -ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i++) {
        ch_gpt2_tensor_t t;
        char name[96];
        ch_gpt2_tensor(cfg, i, &t);
        if (i == 1)
            t.shape[0] = positions;
        size_t numel = t.shape[0] * (t.ndim > 1 ? t.shape[1] : 1);
        float *f = malloc((numel ? numel : 1) * sizeof *f);
        bufs[i] = malloc((numel ? numel : 1) * ch_st_dtype_size((ch_st_dtype_t)dtype));
        if (!f || !bufs[i]) {
            free(f);
            rc = -ENOMEM;
            break;
        }
        for (size_t k = 0; k < numel; k++)
            f[k] = 0.02f * (float)sin((double)(k * 7 + i * 131) * 0.37);
        rc = ch_st_convert_f32((ch_st_dtype_t)dtype, f, bufs[i], numel);
        free(f);
        snprintf(name, sizeof name, "%s%s", prefixed ? "transformer." : "", t.name);
        if (rc == 0)
            rc = ch_st_writer_add(w, name, (ch_st_dtype_t)dtype, t.ndim, t.shape, bufs[i]);
    }
    if (rc == 0)
        rc = ch_st_writer_meta(w, "format", "pt");
    if (rc == 0)
        rc = ch_st_writer_finish(w, NULL, NULL, NULL, 0);
    else
        ch_st_writer_destroy(w);
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    return rc;
}

int ts_fail(char *msg, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return -1;
}
