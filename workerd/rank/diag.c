/* GEMM self-check job kind (see diag.h). One BLAS thread per rank: a slot is a core,
 * and the GFLOP/s reported is per slot. Shapes: A, B, C are n x n, row-major.
 *
 * A rank on a GPU (wrk_rank_on_gpu) checks its GPU instead: the same seeded products through
 * the engine's CUDA backend (cuBLAS), in fp32 and then with TF32 tensor cores, each verified
 * on the host with Freivalds' test (TF32 against a looser tolerance: 10 mantissa bits), and
 * reports "tflops" and "tflops_tf32" (median over diag.rounds). */
#include "workerd/rank/diag.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chorus/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "workerd/engine/backend.h"
#include "workerd/rank/rank.h"

#define DIAG_MAX_N  32768
#define DIAG_TRIALS 2
#define GPU_REPS    3    /* products per timed GPU round */
#define TF32_TOL    1e-2 /* TF32 keeps 10 mantissa bits: ~1e-3 relative per product */

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

static double median_of(double *x, int64_t n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#if CHORUS_HAVE_CUDA
/* rounds products of fresh n x n data on be (TF32 or not) into *tflops (median); A, B, C are
 * host staging, dA, dB, dC device buffers of n*n floats each. */
static int gpu_rounds(wrk_rank_t *r, eng_backend_t *be, int tf32, size_t n, float *A, float *B,
                      float *C, float *dA, float *dB, float *dC, double *gf, double *tflops)
{
    int64_t rounds = r->spec.diag.rounds;
    size_t bytes = n * n * sizeof *A;
    double rel = 0.0, tol = tf32 ? TF32_TOL : WRK_DIAG_TOL;
    const char *prec = tf32 ? "tf32" : "fp32";
    uint64_t base = r->spec.train.seed ^ ((uint64_t)r->rank << 32) ^ 0x9d1aull;
    int rc = 0;
    eng_backend_cuda_set_tf32(be, tf32);
    for (int64_t i = 0; i < rounds && rc == 0; i++) {
        uint64_t s = base + (uint64_t)i * 0x100000001b3ull;
        wrk_diag_fill(A, n * n, s);
        wrk_diag_fill(B, n * n, s ^ 0xb0b0b0b0ull);
        CH_CHECK_GOTO(be->copy(be, dA, A, bytes, ENG_COPY_H2D), rc, out);
        CH_CHECK_GOTO(be->copy(be, dB, B, bytes, ENG_COPY_H2D), rc, out);
        be->matmul_fwd(be, dC, dA, dB, NULL, (int)n, (int)n, (int)n); /* warm-up */
        CH_CHECK_GOTO(eng_backend_cuda_sync(be), rc, out);
        uint64_t t0 = ch_now_ns();
        for (int k = 0; k < GPU_REPS; k++)
            be->matmul_fwd(be, dC, dA, dB, NULL, (int)n, (int)n, (int)n);
        CH_CHECK_GOTO(eng_backend_cuda_sync(be), rc, out);
        uint64_t dt = ch_now_ns() - t0;
        gf[i] = 2e-3 * GPU_REPS * (double)n * (double)n * (double)n / (double)(dt ? dt : 1);
        CH_CHECK_GOTO(be->copy(be, C, dC, bytes, ENG_COPY_D2H), rc, out);
        rc = wrk_diag_check(A, B, C, n, s, DIAG_TRIALS, tol, &rel);
        if (rc == CH_E_NUMERIC)
            return wrk_rank_fail(r, rc,
                                 "diag GPU %s round %" PRId64 ": GEMM %zux%zu result wrong "
                                 "(relative error %.3g > %.1g)",
                                 prec, i + 1, n, n, rel, tol);
        CH_LOGD("diag", "rank=%u GPU %s round %" PRId64 ": n=%zu %.2f TFLOP/s err=%.2g", r->rank,
                prec, i + 1, n, gf[i], rel);
    }
    *tflops = median_of(gf, rounds);
out:
    if (rc < 0 && rc != CH_E_NUMERIC)
        rc = wrk_rank_fail(r, rc, "diag GPU %s GEMM: %s", prec, ch_strerror(rc));
    return rc;
}
#endif

/* The GPU's GEMM self-check (file comment). */
static int gpu_diag(wrk_rank_t *r, size_t n)
{
    char err[256];
    int device = -1;
    int rc = wrk_rank_gpu(r, "device", &device, err, sizeof err);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "diag: %s", err);
#if CHORUS_HAVE_CUDA
    eng_backend_t *be = NULL;
    float *A = NULL, *B = NULL, *C = NULL;
    void *dA = NULL, *dB = NULL, *dC = NULL;
    int64_t rounds = r->spec.diag.rounds;
    double *gf = calloc((size_t)rounds, sizeof *gf), fp32 = 0.0, tf32 = 0.0;
    size_t bytes = n * n * sizeof(float);
    A = malloc(bytes);
    B = malloc(bytes);
    C = malloc(bytes);
    if (!A || !B || !C || !gf) {
        rc = wrk_rank_fail(r, -ENOMEM, "diag: %zu x %zu matrices", n, n);
        goto out;
    }
    if ((rc = eng_backend_cuda_create(device, &be)) < 0) {
        rc = wrk_rank_fail(r, rc, "diag: GPU %d: %s", device, ch_strerror(rc));
        goto out;
    }
    if ((rc = be->alloc(be, bytes, &dA)) < 0 || (rc = be->alloc(be, bytes, &dB)) < 0 ||
        (rc = be->alloc(be, bytes, &dC)) < 0) {
        rc = wrk_rank_fail(r, rc, "diag: GPU %d: 3 x %zu bytes", device, bytes);
        goto out;
    }
    CH_CHECK_GOTO(gpu_rounds(r, be, 0, n, A, B, C, dA, dB, dC, gf, &fp32), rc, out);
    CH_CHECK_GOTO(gpu_rounds(r, be, 1, n, A, B, C, dA, dB, dC, gf, &tf32), rc, out);
    CH_LOGI("diag",
            "rank=%u GPU %d gemm n=%zu rounds=%" PRId64
            ": median %.2f TFLOP/s fp32, %.2f TFLOP/s tf32 (cuBLAS), products verified",
            r->rank, device, n, rounds, fp32, tf32);
    Chorus__Metric m[2] = {CHORUS__METRIC__INIT, CHORUS__METRIC__INIT};
    Chorus__Metric *mp[2] = {&m[0], &m[1]};
    m[0].name = "tflops";
    m[0].value = fp32;
    m[1].name = "tflops_tf32";
    m[1].value = tf32;
    rc = wrk_rank_progress(r, (uint64_t)rounds, (uint64_t)rounds, 0.0, 0.0, 0.0, mp, 2);
out:
    if (be != NULL) {
        be->free(be, dC);
        be->free(be, dB);
        be->free(be, dA);
        eng_backend_cuda_destroy(be);
    }
    free(gf);
    free(C);
    free(B);
    free(A);
#else
    (void)n;
#endif
    return rc;
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
    if (wrk_rank_on_gpu(r))
        return gpu_diag(r, n);
    CH_LOGI("diag",
            "rank=%u: GPU check skipped: this rank computes on the CPU (train.device, "
            "workerd --device)",
            r->rank);
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
    double median = median_of(gf, rounds);
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
