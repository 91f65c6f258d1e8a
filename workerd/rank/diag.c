/* GEMM self-check job kind (see diag.h). One BLAS thread per rank: a slot is a core,
 * and the GFLOP/s reported is per slot. Shapes: A, B, C are n x n, row-major. */
#include "workerd/rank/diag.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "workerd/rank/rank.h"

#define DIAG_MAX_N  32768
#define DIAG_TRIALS 2

/* Uniform in [0, 1) with 24 bits, exact in float. */
static double unit24(uint64_t *s)
{
    return (double)(ch_mix64_next(s) >> 40) * (1.0 / 16777216.0);
}

void wrk_diag_fill(float *m, size_t count, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < count; i++)
        m[i] = (float)(2.0 * unit24(&s) - 1.0);
}

/* y = M x, M n x n fp32 row-major, in double. */
static void matvec(const float *M, const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float *row = M + i * n;
        double acc = 0.0;
        for (size_t j = 0; j < n; j++)
            acc += (double)row[j] * x[j];
        y[i] = acc;
    }
}

int wrk_diag_check(const float *A, const float *B, const float *C, size_t n, uint64_t seed,
                   int trials, double tol, double *rel_err)
{
    double *x = malloc(4 * n * sizeof *x);
    double worst = 0.0;
    uint64_t s = seed ^ 0x5eed5eed5eed5eedull;
    if (!x)
        return -ENOMEM;
    double *bx = x + n, *abx = x + 2 * n, *cx = x + 3 * n;
    for (int t = 0; t < trials; t++) {
        for (size_t j = 0; j < n; j++) {
            double mag = 0.5 + 0.5 * unit24(&s);
            x[j] = (ch_mix64_next(&s) & 1) ? mag : -mag;
        }
        matvec(B, x, bx, n);
        matvec(A, bx, abx, n);
        matvec(C, x, cx, n);
        double ss = 0.0, maxdiff = 0.0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs(cx[i] - abx[i]);
            ss += abx[i] * abx[i];
            /* NaN in C must fail, and NaN compares false. */
            if (!(d <= maxdiff))
                maxdiff = isnan(d) ? INFINITY : d;
        }
        double scale = n ? sqrt(ss / (double)n) : 1.0;
        if (!(scale > 1e-30))
            scale = 1.0;
        double err = maxdiff / scale;
        if (err > worst)
            worst = err;
    }
    free(x);
    if (rel_err)
        *rel_err = worst;
    return worst <= tol ? 0 : CH_E_NUMERIC;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int report_gflops(wrk_rank_t *r, uint64_t step, uint64_t total, double gflops, double best)
{
    Chorus__Metric m[2] = {CHORUS__METRIC__INIT, CHORUS__METRIC__INIT};
    Chorus__Metric *mp[2] = {&m[0], &m[1]};
    m[0].name = "gflops";
    m[0].value = gflops;
    m[1].name = "gflops_max";
    m[1].value = best;
    return wrk_rank_progress(r, step, total, 0.0, 0.0, 0.0, mp, best > 0 ? 2 : 1);
}

int wrk_diag_run(wrk_rank_t *r)
{
    int64_t n64 = r->spec.diag.gemm_size, rounds = r->spec.diag.rounds;
    float *A = NULL, *B = NULL, *C = NULL;
    double *gf = NULL, rel = 0.0;
    int rc = 0;

    if (n64 < 1 || n64 > DIAG_MAX_N)
        return wrk_rank_fail(r, CH_E_CONFIG, "diag.gemm_size %" PRId64 " not in 1..%d", n64,
                             DIAG_MAX_N);
    if (rounds < 1)
        return wrk_rank_fail(r, CH_E_CONFIG, "diag.rounds %" PRId64 " < 1", rounds);
    size_t n = (size_t)n64;
    openblas_set_num_threads(1);
    A = malloc(n * n * sizeof *A);
    B = malloc(n * n * sizeof *B);
    C = malloc(n * n * sizeof *C);
    gf = calloc((size_t)rounds, sizeof *gf);
    if (!A || !B || !C || !gf) {
        rc = wrk_rank_fail(r, -ENOMEM, "diag: %zu x %zu matrices", n, n);
        goto out;
    }
    /* Every rank and round multiplies different data. */
    uint64_t base = r->spec.train.seed ^ ((uint64_t)r->rank << 32) ^ 0xd1a9ull;
    for (int64_t i = 0; i < rounds; i++) {
        uint64_t s = base + (uint64_t)i * 0x100000001b3ull;
        wrk_diag_fill(A, n * n, s);
        wrk_diag_fill(B, n * n, s ^ 0xb0b0b0b0ull);
        memset(C, 0, n * n * sizeof *C);
        uint64_t t0 = ch_now_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, A,
                    (int)n, B, (int)n, 0.0f, C, (int)n);
        uint64_t dt = ch_now_ns() - t0;
        gf[i] = 2.0 * (double)n * (double)n * (double)n / (double)(dt ? dt : 1); /* per ns = G/s */
        rc = wrk_diag_check(A, B, C, n, s, DIAG_TRIALS, WRK_DIAG_TOL, &rel);
        if (rc == CH_E_NUMERIC) {
            rc = wrk_rank_fail(r, rc,
                               "diag round %" PRId64 " of %" PRId64
                               ": GEMM %zux%zu result wrong (relative error %.3g > %.1g)",
                               i + 1, rounds, n, n, rel, WRK_DIAG_TOL);
            goto out;
        }
        if (rc < 0) {
            rc = wrk_rank_fail(r, rc, "diag round %" PRId64 ": check", i + 1);
            goto out;
        }
        CH_LOGD("diag", "rank=%u round %" PRId64 "/%" PRId64 ": n=%zu %.2f GFLOP/s err=%.2g",
                r->rank, i + 1, rounds, n, gf[i], rel);
        CH_CHECK_GOTO(report_gflops(r, (uint64_t)i + 1, (uint64_t)rounds, gf[i], 0.0), rc, out);
    }
    qsort(gf, (size_t)rounds, sizeof *gf, cmp_double);
    double median = rounds % 2 ? gf[rounds / 2] : 0.5 * (gf[rounds / 2 - 1] + gf[rounds / 2]);
    double best = gf[rounds - 1];
    CH_LOGI("diag", "rank=%u gemm n=%zu rounds=%" PRId64 ": median %.2f GFLOP/s, best %.2f",
            r->rank, n, rounds, median, best);
    rc = report_gflops(r, (uint64_t)rounds, (uint64_t)rounds, median, best);
out:
    free(gf);
    free(C);
    free(B);
    free(A);
    return rc;
}
