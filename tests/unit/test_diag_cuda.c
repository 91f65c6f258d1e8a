/* workerd/rank on a GPU: which GPU a rank takes (wrk_rank_gpu), the diag job's cuBLAS GEMM
 * self-check with its TFLOP/s, and its collectives over NCCL. Without a visible GPU the
 * device tests skip with a message, and the refusals (a cuda rank with no GPU) are checked
 * instead. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "common/msg.h"
#include "support.h"
#include "workerd/engine/backend.h"
#include "workerd/rank/rank.h"

static int gpus(void)
{
    int n = 0;
    cr_assert_eq(eng_backend_cuda_devices(&n), 0);
    return n;
}

static void need_gpu(void)
{
    if (gpus() == 0) {
        cr_skip_test("no CUDA device visible: GPU diag test skipped");
    }
}

/* A one-rank diag job on device `device` whose events go to *peer (the workerd end). */
static void rank_init(wrk_rank_t *r, ch_device_t device, ch_client_t **peer)
{
    memset(r, 0, sizeof *r);
    ch_jobspec_defaults(&r->spec);
    r->spec.kind = CH_JOB_DIAG;
    r->spec.diag.gemm_size = 512;
    r->spec.diag.rounds = 2;
    r->rank = 0, r->world_size = 1, r->local_rank = 0, r->local_world_size = 1;
    snprintf(r->job_id, sizeof r->job_id, "j-gpu");
    r->device = device;
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(ch_client_from_fd(sv[0], &r->link), 0);
    cr_assert_eq(ch_client_from_fd(sv[1], peer), 0);
}

/* The value of metric `name` in the events waiting on peer; 0 when never sent. */
static double metric(ch_client_t *peer, const char *name)
{
    double v = 0;
    Chorus__Envelope *env = NULL;
    while (ch_client_recv(peer, 0, &env) == 0) {
        Chorus__RankEvent *ev = env->rank_event;
        cr_assert_not_null(ev);
        for (size_t m = 0; m < ev->n_metrics; m++) {
            if (strcmp(ev->metrics[m]->name, name) == 0) {
                v = ev->metrics[m]->value;
            }
        }
        ch_msg_free(env);
    }
    return v;
}

// ----------------------------------------------------------------------------
// which GPU

Test(rank_gpu, who_asks_for_a_gpu)
{
    wrk_rank_t r;
    memset(&r, 0, sizeof r);
    ch_jobspec_defaults(&r.spec);
    r.device = CH_DEVICE_CUDA;
    cr_expect_eq(wrk_rank_on_gpu(&r), 0, "a train job on a GPU node runs where train.device says");
    r.spec.kind = CH_JOB_DIAG;
    cr_expect_eq(wrk_rank_on_gpu(&r), 1, "a diag job checks the node's GPU");
    r.device = CH_DEVICE_CPU;
    cr_expect_eq(wrk_rank_on_gpu(&r), 0);
    r.spec.train.device = CH_DEVICE_CUDA;
    cr_expect_eq(wrk_rank_on_gpu(&r), 1);
}

Test(rank_gpu, local_rank_picks_the_gpu_or_the_refusal_says_why)
{
    wrk_rank_t r;
    memset(&r, 0, sizeof r);
    char err[256] = "";
    int device = 7, n = gpus();
    unsetenv("CUDA_VISIBLE_DEVICES");
    if (n == 0) {
        cr_expect_eq(wrk_rank_gpu(&r, "train.device", &device, err, sizeof err), CH_E_CONFIG);
        cr_expect_str_eq(err, "train.device: cuda requested but no GPU visible "
                              "(CUDA_VISIBLE_DEVICES=unset)");
        cr_expect_eq(device, -1);
        return;
    }
    r.local_rank = (uint32_t)n - 1;
    cr_expect_eq(wrk_rank_gpu(&r, "train.device", &device, err, sizeof err), 0, "%s", err);
    cr_expect_eq(device, n - 1);
    r.local_rank = (uint32_t)n;
    cr_expect_eq(wrk_rank_gpu(&r, "train.device", &device, err, sizeof err), -ENODEV);
    cr_expect(strstr(err, "one GPU per rank") != NULL, "%s", err);
    /* more ranks on the node than GPUs: they share (host-staged collectives), round robin */
    r.local_world_size = (uint32_t)n + 1;
    cr_expect(wrk_rank_gpu_shared(&r));
    cr_expect_eq(wrk_rank_gpu(&r, "train.device", &device, err, sizeof err), 0, "%s", err);
    cr_expect_eq(device, 0);
    setenv("CHORUS_COLL_STAGED", "0", 1); /* sharing forbidden: the refusal again */
    cr_expect_eq(wrk_rank_gpu(&r, "train.device", &device, err, sizeof err), -ENODEV);
    unsetenv("CHORUS_COLL_STAGED");
}

Test(rank_gpu, a_cuda_diag_without_a_gpu_fails_naming_why)
{
    if (gpus() > 0) {
        cr_skip_test("a GPU is visible: the refusal cannot be seen here (the GPU tests run)");
    }
    wrk_rank_t r;
    ch_client_t *peer = NULL;
    rank_init(&r, CH_DEVICE_CUDA, &peer);
    cr_expect_eq(wrk_diag_run(&r), CH_E_CONFIG);
    cr_expect(strstr(r.detail, "cuda requested but no GPU visible") != NULL, "%s", r.detail);
    ch_client_destroy(peer);
    ch_client_destroy(r.link);
}

// ----------------------------------------------------------------------------
// the diag job on a GPU

Test(diag_gpu, gemm_self_check_reports_tflops, .timeout = 120)
{
    need_gpu();
    wrk_rank_t r;
    ch_client_t *peer = NULL;
    rank_init(&r, CH_DEVICE_CUDA, &peer);
    cr_assert_eq(wrk_diag_run(&r), 0, "%s", r.detail);
    double fp32 = metric(peer, "tflops");
    cr_expect_gt(fp32, 0, "tflops reported");
    ch_client_destroy(peer);
    ch_client_destroy(r.link);
    /* printed for tests/gpu/check.sh: n = 512 is a smoke size, not the peak */
    printf("RESULT diag_gpu_gemm n=512 fp32_tflops=%.2f\n", fp32);
}

Test(diag_gpu, collectives_over_nccl_on_one_gpu, .timeout = 120)
{
    need_gpu();
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    wrk_rank_t r;
    ch_client_t *peer = NULL;
    rank_init(&r, CH_DEVICE_CUDA, &peer);
    r.spec.diag.collectives = 1;
    r.spec.diag.bytes = 1 << 20;
    r.rdzv = (ch_rdzv_t){.ud = &table, .set = ts_rdzv_table_set, .get = ts_rdzv_table_get};
    cr_expect_eq(wrk_diag_coll_run(&r), 0, "%s", r.detail);
    ch_client_destroy(peer);
    ch_client_destroy(r.link);
    ts_rdzv_table_fini(&table);
}
