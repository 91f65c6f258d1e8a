/* workerd/rank/diag: the GEMM self-check accepts a correct BLAS product and catches a
 * product with a single wrong element, wherever it is and whatever its size; the
 * collectives diag job checks and reports every group's figures. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "common/err.h"
#include "common/msg.h"
#include "common/util.h"
#include "support.h"
#include "workerd/rank/diag.h"
#include "workerd/rank/peak.h"
#include "workerd/rank/rank.h"

typedef struct mats {
    size_t n;
    float *A, *B, *C;
} mats_t;

/* Seeded A, B and C = A*B from the BLAS, as a diag round makes them. */
static mats_t make(size_t n, uint64_t seed)
{
    mats_t m = {n, malloc(n * n * sizeof(float)), malloc(n * n * sizeof(float)),
                malloc(n * n * sizeof(float))};
    cr_assert(m.A && m.B && m.C);
    wrk_diag_fill(m.A, n * n, seed);
    wrk_diag_fill(m.B, n * n, seed + 1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, m.A,
                (int)n, m.B, (int)n, 0.0f, m.C, (int)n);
    return m;
}

static void drop(mats_t *m)
{
    free(m->A);
    free(m->B);
    free(m->C);
}

Test(diag, fill_is_seeded_and_in_range)
{
    float a[1000], b[1000], c[1000];
    wrk_diag_fill(a, 1000, 7);
    wrk_diag_fill(b, 1000, 7);
    wrk_diag_fill(c, 1000, 8);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "same seed, same data");
    cr_expect_neq(memcmp(a, c, sizeof a), 0, "other seed, other data");
    double mean = 0;
    for (int i = 0; i < 1000; i++) {
        cr_assert(a[i] >= -1.0f && a[i] < 1.0f);
        mean += a[i] / 1000.0;
    }
    cr_expect_lt(fabs(mean), 0.1);
}

Test(diag, accepts_correct_products)
{
    size_t sizes[] = {1, 7, 64, 257};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        mats_t m = make(sizes[i], 100 + i);
        double err = -1;
        cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 5, 2, WRK_DIAG_TOL, &err), 0,
                     "n=%zu rejected (err %g)", m.n, err);
        /* fp32 rounding sits orders of magnitude below the tolerance. */
        cr_expect_lt(err, WRK_DIAG_TOL / 100, "n=%zu err %g", m.n, err);
        drop(&m);
    }
}

Test(diag, rejects_one_corrupted_element)
{
    mats_t m = make(128, 42);
    size_t where[] = {0, 128 * 128 - 1, 37 * 128 + 101, 64 * 128 + 3};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        float keep = m.C[where[i]];
        /* An error of a tenth of a typical element (|C| ~ sqrt(128)/3 ~ 3.8). */
        m.C[where[i]] = keep + 0.4f;
        double err = 0;
        cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 9, 2, WRK_DIAG_TOL, &err), CH_E_NUMERIC,
                     "corruption at %zu not caught (err %g)", where[i], err);
        cr_expect_gt(err, WRK_DIAG_TOL);
        m.C[where[i]] = keep;
    }
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 9, 2, WRK_DIAG_TOL, NULL), 0,
                 "restored product accepted again");
    drop(&m);
}

Test(diag, rejects_nan_and_swapped_operands)
{
    mats_t m = make(48, 3);
    m.C[100] = NAN;
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 1, 2, WRK_DIAG_TOL, NULL), CH_E_NUMERIC);
    drop(&m);

    /* B*A is not A*B: a transposition bug in a GEMM call is caught. */
    m = make(48, 4);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 48, 48, 48, 1.0f, m.B, 48, m.A, 48, 0.0f,
                m.C, 48);
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 1, 2, WRK_DIAG_TOL, NULL), CH_E_NUMERIC);
    drop(&m);
}

// ----------------------------------------------------------------------------
// wrk_diag_coll_run: a diag job on a 2x2 layout (TP 2, PP 2), ranks as threads with their
// event link to a socketpair the test reads afterwards

typedef struct diag_rank {
    wrk_rank_t r;
    int peer_fd; /* the workerd end of the link */
    int rc;
} diag_rank_t;

static void *diag_main(void *arg)
{
    diag_rank_t *d = arg;
    d->rc = wrk_diag_coll_run(&d->r);
    return NULL;
}

Test(coll, diag_checks_and_reports, .timeout = 60)
{
    enum { N = 4 };
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    diag_rank_t d[N];
    pthread_t th[N];
    memset(d, 0, sizeof d);
    for (uint32_t i = 0; i < N; i++) {
        wrk_rank_t *r = &d[i].r;
        ch_jobspec_defaults(&r->spec);
        r->spec.kind = CH_JOB_DIAG;
        r->spec.parallel.tp = 2, r->spec.parallel.pp = 2, r->spec.parallel.dp = 1;
        r->spec.diag.collectives = 1;
        r->spec.diag.bytes = 256 << 10;
        r->spec.diag.rounds = 2;
        r->rank = i, r->world_size = N, r->local_rank = i, r->local_world_size = N;
        snprintf(r->job_id, sizeof r->job_id, "j-test");
        r->device = CH_DEVICE_CPU;
        r->rdzv = (ch_rdzv_t){.ud = &table, .set = ts_rdzv_table_set, .get = ts_rdzv_table_get};
        int sv[2];
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        cr_assert_eq(ch_client_from_fd(sv[0], &r->link), 0);
        d[i].peer_fd = sv[1];
    }
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, diag_main, &d[i]), 0);
    for (uint32_t i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < N; i++) {
        cr_expect_eq(d[i].rc, 0, "rank %u: %s (%s)", i, ch_strerror(d[i].rc), d[i].r.detail);
        ch_client_t *peer = NULL;
        cr_assert_eq(ch_client_from_fd(d[i].peer_fd, &peer), 0);
        int busbw_tp = 0, algbw_world = 0, events = 0;
        Chorus__Envelope *env = NULL;
        while (ch_client_recv(peer, 0, &env) == 0) {
            Chorus__RankEvent *ev = env->rank_event;
            cr_assert_not_null(ev);
            cr_expect_eq(ev->kind, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS);
            events++;
            for (size_t m = 0; m < ev->n_metrics; m++) {
                const char *name = ev->metrics[m]->name;
                double v = ev->metrics[m]->value;
                cr_expect(v > 0, "%s = %g", name, v);
                busbw_tp += strcmp(name, "busbw.tp.allreduce") == 0;
                algbw_world += strcmp(name, "algbw.world.allgather") == 0;
            }
            ch_msg_free(env);
        }
        cr_expect_eq(events, 4, "rank %u: %d progress events (one per group)", i, events);
        cr_expect_eq(busbw_tp, 1, "rank %u: busbw.tp.allreduce reported %d times", i, busbw_tp);
        cr_expect_eq(algbw_world, 1, "rank %u: algbw.world.allgather reported %d times", i,
                     algbw_world);
        ch_client_destroy(peer);
        ch_client_destroy(d[i].r.link);
    }
    ts_rdzv_table_fini(&table);
}

// ----------------------------------------------------------------------------
// the node's cached SGEMM peak (peak.h)

/* A rank finds the figure cached in its node's run directory (three levels above its own)
 * for its thread count and does not measure; a malformed file is refused. */
Test(peak, the_cached_figure_is_used_per_thread_count)
{
    char dir[256], path[512];
    cr_assert_eq(ts_tmpdir("peak", dir, sizeof dir), 0);
    wrk_rank_t r = {0};
    snprintf(r.run_dir, sizeof r.run_dir, "%s/job-1/g1/rank-0/", dir);
    cr_assert_eq(wrk_peak_path(dir, 3, path, sizeof path), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "flops=1.250000e+11 n=2048 seconds=3.0\n");
    fclose(f);
    cr_assert_eq(wrk_peak_flops(&r, 3), 1.25e11);
    double got = 0;
    cr_assert_eq(wrk_peak_read(path, &got), 0);
    cr_assert_eq(got, 1.25e11);
    cr_assert_eq(wrk_peak_path(dir, 4, path, sizeof path), 0);
    cr_assert_eq(wrk_peak_read(path, &got), -ENOENT);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "flops=fast\n");
    fclose(f);
    cr_assert_eq(wrk_peak_read(path, &got), CH_E_FORMAT);
    /* a measurement is at least five runs, however short the time asked */
    cr_assert_gt(wrk_peak_measure(64, 0.0), 0.0);
    ts_rmrf(dir);
}

/* A restart's rank (generation > 1) takes a short measurement's figure (1024^3) as it is,
 * rather than keeping the whole job waiting for a full one; a first generation measures
 * again when the cached figure came from a smaller matrix than it would use. */
Test(peak, a_restart_takes_a_short_figure_a_first_generation_measures_again)
{
    char dir[256], path[512], *text = NULL;
    size_t len = 0;
    cr_assert_eq(ts_tmpdir("peak", dir, sizeof dir), 0);
    wrk_rank_t r = {0};
    snprintf(r.run_dir, sizeof r.run_dir, "%s/job-1/g2/rank-0/", dir);
    cr_assert_eq(wrk_peak_path(dir, 1, path, sizeof path), 0);
    static const char shortfig[] = "flops=1.000000e+11 n=1024 seconds=0.12\n";
    cr_assert_eq(ch_file_write_atomic(path, shortfig, sizeof shortfig - 1, 0644), 0);
    r.generation = 2;
    cr_assert_eq(wrk_peak_flops(&r, 1), 1e11);
    /* a first generation of a job with a 2 s step timeout measures 1024^3 too: taken */
    r.generation = 1;
    r.spec.fault.step_timeout_s = 2;
    cr_assert_eq(wrk_peak_flops(&r, 1), 1e11);
    /* ... but not a figure from 512^3: measured again, and the cache says so */
    static const char tiny[] = "flops=1.000000e+11 n=512 seconds=0.1\n";
    cr_assert_eq(ch_file_write_atomic(path, tiny, sizeof tiny - 1, 0644), 0);
    double got = wrk_peak_flops(&r, 1);
    cr_assert(got > 0 && got != 1e11, "%g", got);
    cr_assert_eq(ch_file_read(path, 4096, &text, &len), 0);
    cr_assert_not_null(strstr(text, "n=1024"), "%s", text);
    free(text);
    ts_rmrf(dir);
}
