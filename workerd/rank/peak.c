/* The node's cached SGEMM peak (peak.h). */
#include "workerd/rank/peak.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/matmul.h"

double wrk_peak_measure(int n, double seconds)
{
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < nn; i++) {
            a[i] = (float)(i % 7) * 0.1f;
            b[i] = (float)(i % 5) * 0.1f;
        }
        kn_matmul_fwd(c, a, b, NULL, n, n, n); /* warm-up: threads, page faults */
        uint64_t start = ch_now_ns(), budget = (uint64_t)(seconds * 1e9);
        /* at least 5 runs and `seconds`, but never past 4 x seconds (a loaded node) */
        for (int runs = 0; (runs < 5 || ch_now_ns() - start < budget) &&
                           (runs == 0 || ch_now_ns() - start < 4 * budget);
             runs++) {
            uint64_t t0 = ch_now_ns();
            kn_matmul_fwd(c, a, b, NULL, n, n, n);
            double dt = (double)(ch_now_ns() - t0) * 1e-9;
            double f = 2.0 * n * n * (double)n / (dt > 0 ? dt : 1e-9);
            best = f > best ? f : best;
        }
    }
    free(a), free(b), free(c);
    return best;
}

int wrk_peak_path(const char *node_dir, int threads, char *out, size_t len)
{
    int k = snprintf(out, len, "%s/sgemm-peak-t%d", node_dir, threads);
    return k < 0 || (size_t)k >= len ? -ENAMETOOLONG : 0;
}

int wrk_peak_read(const char *path, double *flops)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ch_file_read(path, 4096, &text, &len);
    if (rc < 0)
        return rc;
    double f = 0;
    rc = sscanf(text, "flops=%lf", &f) == 1 && f > 0 && f < 1e18 ? 0 : CH_E_FORMAT;
    free(text);
    if (rc == 0)
        *flops = f;
    return rc;
}

/* The node's run directory: three levels above the rank's (agent.c's layout). */
static int node_dir(const char *rank_dir, char *out, size_t len)
{
    int k = snprintf(out, len, "%s", rank_dir);
    if (k < 0 || (size_t)k >= len)
        return -ENAMETOOLONG;
    for (int up = 0; up < 3; up++) {
        size_t n = strlen(out);
        while (n > 1 && out[n - 1] == '/')
            out[--n] = '\0';
        char *slash = strrchr(out, '/');
        if (slash == NULL || slash == out)
            return -EINVAL;
        *slash = '\0';
    }
    return 0;
}

/* The measurement's size and time: WRK_PEAK_N for WRK_PEAK_SECONDS, unless the job's
 * fault.step_timeout (which covers the time before the first step, this included) is
 * short: then a 1024^3 SGEMM for an eighth of it. A restart (generation > 1) placed on a
 * node that never measured, such as a spare, also measures 1024^3 for an eighth of
 * WRK_PEAK_SECONDS: every rank of the job waits for it (it cost 1 to 4.7 s of a node
 * loss's restart), and the next first generation on the node measures in full. */
static void size_for(const wrk_rank_t *r, int *n, double *seconds)
{
    double st = (double)r->spec.fault.step_timeout_s;
    *n = WRK_PEAK_N;
    *seconds = WRK_PEAK_SECONDS;
    if (r->generation > 1)
        *n = 1024, *seconds = WRK_PEAK_SECONDS / 8;
    if (st > 0 && st / 8 < *seconds) {
        *n = 1024;
        *seconds = st / 8;
    }
}

/* The cached figure when it was measured at least at the size this rank would measure
 * (a restart's short figure is measured again in full by a first generation). */
static int read_enough(const wrk_rank_t *r, const char *path, double *flops)
{
    int want, n = 0;
    double secs, f = 0;
    char *text = NULL;
    size_t len = 0;
    size_for(r, &want, &secs);
    if (ch_file_read(path, 4096, &text, &len) < 0)
        return -ENOENT;
    int ok = sscanf(text, "flops=%lf n=%d", &f, &n) == 2 && n >= want;
    free(text);
    return ok && wrk_peak_read(path, flops) == 0 ? 0 : -ENOENT;
}

static double measure_uncached(const wrk_rank_t *r)
{
    int N;
    double secs;
    size_for(r, &N, &secs);
    return wrk_peak_measure(N, secs);
}

static double measure_and_write(const wrk_rank_t *r, const char *path)
{
    int N;
    double secs;
    size_for(r, &N, &secs);
    double f = wrk_peak_measure(N, secs);
    char line[128];
    int k = snprintf(line, sizeof line, "flops=%.6e n=%d seconds=%.2f\n", f, N, secs);
    int rc = f > 0 ? ch_file_write_atomic(path, line, (size_t)k, 0644) : -ENOMEM;
    if (rc < 0)
        CH_LOGW("peak", "%s: not cached: %s", path, ch_strerror(rc));
    return f;
}

double wrk_peak_flops(const wrk_rank_t *r, int threads)
{
    char dir[CH_PATH_LEN], path[CH_PATH_LEN + 32], lock[CH_PATH_LEN + 40];
    double f = 0;
    int rc = node_dir(r->run_dir, dir, sizeof dir);
    if (rc == 0)
        rc = wrk_peak_path(dir, threads, path, sizeof path);
    if (rc == 0 && read_enough(r, path, &f) == 0)
        return f;
    if (rc < 0) {
        CH_LOGW("peak", "run dir %s: %s: measuring the SGEMM peak uncached", r->run_dir,
                ch_strerror(rc));
        return measure_uncached(r);
    }
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        CH_LOGW("peak", "%s: %s: measuring the SGEMM peak uncached", lock, strerror(errno));
        return measure_uncached(r);
    }
    while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
    }
    /* another rank of the node may have measured while this one waited */
    if (read_enough(r, path, &f) != 0) {
        f = measure_and_write(r, path);
        CH_LOGI("peak", "SGEMM peak at %d threads: %.1f GFLOP/s, cached in %s", threads, f * 1e-9,
                path);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return f;
}
