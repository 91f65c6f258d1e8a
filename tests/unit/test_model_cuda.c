/* The engine on the CUDA backend (workerd/engine/backend_cuda.c) against the CPU backend:
 * the whole model's loss and gradients, 20 AdamW steps, and a checkpoint written by a GPU
 * trainer resumed by a CPU one.
 *
 * Tolerances (fp32 GEMMs, no TF32): loss within 1e-5 relative and every gradient within
 * 1e-3 relative + 1e-4 of its tensor's largest magnitude after one step (cuBLAS and OpenBLAS
 * sum in different orders; a wrong kernel is off by O(1)); the 20 losses
 * within 1e-4 relative (issue 13) and the final parameters within 1e-3 in relative L2 (AdamW
 * divides by sqrt(v), so a gradient near zero may round to a different update: elementwise
 * bounds would be noise).
 *
 * Without a visible GPU every test that needs one skips with a message; the refusals that
 * touch no device run everywhere. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "support.h"
#include "workerd/engine/backend.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"
#include "workerd/engine/trainer.h"

#define STEPS 20

static const eng_config_t small = {
    .layers = 2, .heads = 4, .embd = 64, .vocab = 100, .padded_vocab = 128, .seq_len = 32};

// ----------------------------------------------------------------------------
// helpers

/* The CUDA backend on GPU 0, or the test skipped with the reason. */
static eng_backend_t *need_gpu(void)
{
    int n = 0;
    int rc = eng_backend_cuda_devices(&n);
    if (rc < 0) {
        cr_skip_test("CUDA runtime failed (%s): GPU engine test skipped", ch_strerror(rc));
    }
    if (n == 0) {
        cr_skip_test("no CUDA device visible: GPU engine test skipped");
    }
    eng_backend_t *be = NULL;
    cr_assert_eq(eng_backend_cuda_create(0, &be), 0, "eng_backend_cuda_create");
    return be;
}

static eng_model_t *model_on(const eng_backend_t *be, uint32_t B, uint64_t seed)
{
    eng_model_opts_t opts = {.backend = be};
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_create_opts(&small, &opts, B, seed, &m), 0);
    return m;
}

/* a host copy of n floats of m's backend memory; caller frees */
static float *host_copy(const eng_model_t *m, const float *p, size_t n)
{
    const eng_backend_t *be = eng_model_backend(m);
    float *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    cr_assert_eq(be->copy(be, h, p, n * sizeof *h, ENG_COPY_D2H), 0, "copy back");
    return h;
}

static void tokens(int32_t *x, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        x[i] = (int32_t)(ch_mix64_next(&s) % small.vocab);
    }
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1.0));
}

/* Each tensor of got within rtol |want| + atol max|want of that tensor|. */
static void expect_tensors_close(const eng_model_t *m, const float *got, const float *want,
                                 double rtol, double atol, const char *what)
{
    for (size_t t = 0; t < eng_model_ntensors(m); t++) {
        const eng_tensor_t *ti = eng_model_tensor(m, t);
        const float *g = got + ti->offset, *w = want + ti->offset;
        double maxabs = 0.0;
        for (size_t i = 0; i < ti->numel; i++) {
            maxabs = fmax(maxabs, fabs(w[i]));
        }
        for (size_t i = 0; i < ti->numel; i++) {
            double err = fabs((double)g[i] - w[i]);
            cr_assert(err <= rtol * fabs(w[i]) + atol * maxabs + 1e-30,
                      "%s %s[%zu]: cuda %.9g cpu %.9g (max |cpu| %.3g)", what, ti->name, i, g[i],
                      w[i], maxabs);
        }
    }
}

// ----------------------------------------------------------------------------
// no device needed

Test(model_cuda, a_gpu_that_is_not_there_is_enodev)
{
    int n = 0;
    cr_assert_eq(eng_backend_cuda_devices(&n), 0);
    eng_backend_t *be = (eng_backend_t *)1;
    cr_expect_eq(eng_backend_cuda_create(n, &be), -ENODEV, "device %d of %d visible", n, n);
    cr_expect_null(be);
    cr_expect_eq(eng_backend_cuda_create(-1, &be), -ENODEV);
}

// ----------------------------------------------------------------------------
// the whole model: loss and gradients

Test(model_cuda, loss_and_gradients_match_the_cpu_model)
{
    eng_backend_t *gpu = need_gpu();
    const uint32_t B = 4, T = small.seq_len;
    size_t N = (size_t)B * T;
    int32_t *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    cr_assert(in && tg);
    tokens(in, N, 1), tokens(tg, N, 2);
    eng_model_t *cpu = model_on(NULL, B, 42), *cu = model_on(gpu, B, 42);
    cr_assert_eq(strcmp(eng_model_backend(cu)->name, "cuda"), 0);
    cr_assert_eq(eng_model_backend(cu)->host_memory, 0);
    size_t n = eng_model_nparams(cpu);
    cr_assert_eq(eng_model_nparams(cu), n);

    /* the same initialisation, copied in */
    float *p = host_copy(cu, eng_model_params(cu), n);
    cr_expect_eq(memcmp(p, eng_model_params(cpu), n * sizeof *p), 0, "initial parameters");

    float lc = 0, lg = 0;
    cr_assert_eq(eng_model_forward(cpu, in, tg, B, T, &lc), 0);
    cr_assert_eq(eng_model_forward(cu, in, tg, B, T, &lg), 0);
    cr_expect(fabsf(lg - lc) <= 1e-5f * fabsf(lc), "loss: cuda %.9g cpu %.9g", lg, lc);
    cr_expect(fabsf(lc - logf((float)small.vocab)) < 0.5f, "an untrained model's loss %.4g", lc);
    cr_assert_eq(eng_model_backward(cpu, 1.0f / (float)N), 0);
    cr_assert_eq(eng_model_backward(cu, 1.0f / (float)N), 0);
    float *g = host_copy(cu, eng_model_grads(cu), n);
    expect_tensors_close(cpu, g, eng_model_grads(cpu), 1e-3, 1e-4, "gradient");

    /* logits without targets: backend memory, the CPU's values */
    cr_assert_eq(eng_model_forward(cpu, in, NULL, B, T, NULL), 0);
    cr_assert_eq(eng_model_forward(cu, in, NULL, B, T, NULL), 0);
    size_t nl = N * small.padded_vocab;
    float *lgt = host_copy(cu, eng_model_logits(cu), nl);
    const float *want = eng_model_logits(cpu);
    for (size_t i = 0; i < nl; i++) {
        cr_assert(fabsf(lgt[i] - want[i]) <= 1e-4f * fabsf(want[i]) + 1e-5f, "logit %zu", i);
    }
    free(lgt);
    free(g);
    free(p);
    eng_model_destroy(cu);
    eng_model_destroy(cpu);
    eng_backend_cuda_destroy(gpu);
    free(tg);
    free(in);
}

// ----------------------------------------------------------------------------
// 20 training steps

/* One step as the trainer takes it (trainer.h): zero, forward, backward at 1/N, clip to
 * 1.0, AdamW. On a device model the clip goes through a host copy of the gradients (the
 * backend table has no sum of squares yet). */
static float train_step(eng_model_t *m, eng_optim_t *o, const int32_t *in, const int32_t *tg,
                        uint32_t B, uint32_t T, double lr)
{
    const eng_backend_t *be = eng_model_backend(m);
    size_t n = eng_model_nparams(m), N = (size_t)B * T;
    float loss = 0;
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward(m, in, tg, B, T, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / (float)N), 0);
    if (be->host_memory) {
        eng_grad_clip(eng_model_grads(m), n, o->max_grad_norm);
    } else {
        float *g = host_copy(m, eng_model_grads(m), n);
        eng_grad_clip(g, n, o->max_grad_norm);
        cr_assert_eq(be->copy(be, eng_model_grads(m), g, n * sizeof *g, ENG_COPY_H2D), 0);
        free(g);
    }
    cr_assert_eq(eng_optim_step(o, m, lr), 0);
    return loss;
}

Test(model_cuda, twenty_adamw_steps_track_the_cpu_run)
{
    eng_backend_t *gpu = need_gpu();
    const uint32_t B = 4, T = small.seq_len;
    size_t N = (size_t)B * T;
    int32_t *in = malloc(N * sizeof *in), *tg = malloc(N * sizeof *tg);
    cr_assert(in && tg);
    eng_model_t *cpu = model_on(NULL, B, 7), *cu = model_on(gpu, B, 7);
    size_t n = eng_model_nparams(cpu);
    eng_optim_t oc, og;
    cr_assert_eq(eng_optim_init(&oc, n), 0);
    cr_assert_eq(eng_optim_init(&og, n), 0);
    /* the GPU run's Adam state in device memory: eng_optim_step runs the model's backend */
    free(og.m), free(og.v);
    void *dm = NULL, *dv = NULL;
    cr_assert_eq(gpu->alloc(gpu, n * sizeof(float), &dm), 0);
    cr_assert_eq(gpu->alloc(gpu, n * sizeof(float), &dv), 0);
    cr_assert_eq(gpu->memset(gpu, dm, 0, n * sizeof(float)), 0);
    cr_assert_eq(gpu->memset(gpu, dv, 0, n * sizeof(float)), 0);
    og.m = dm, og.v = dv;

    float first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        tokens(in, N, 100 + (uint64_t)s);
        tokens(tg, N, 200 + (uint64_t)s);
        for (size_t i = 0; i + 1 < N; i++) {
            tg[i] = in[i + 1]; /* a learnable signal: the next input token */
        }
        double lr = 3e-3;
        float lc = train_step(cpu, &oc, in, tg, B, T, lr);
        float lg = train_step(cu, &og, in, tg, B, T, lr);
        cr_expect(fabsf(lg - lc) <= 1e-4f * fabsf(lc), "step %d loss: cuda %.9g cpu %.9g", s, lg,
                  lc);
        first = s == 0 ? lc : first;
        last = lc;
    }
    cr_expect_lt(last, first, "the CPU run learns (%.4g -> %.4g)", first, last);
    float *p = host_copy(cu, eng_model_params(cu), n);
    double d = rel_l2(p, eng_model_params(cpu), n);
    cr_expect_lt(d, 1e-3, "parameters after %d steps: relative L2 distance %.3g", STEPS, d);
    free(p);

    gpu->free(gpu, dv);
    gpu->free(gpu, dm);
    og.m = og.v = NULL;
    eng_optim_fini(&og);
    eng_optim_fini(&oc);
    eng_model_destroy(cu);
    eng_model_destroy(cpu);
    eng_backend_cuda_destroy(gpu);
    free(tg);
    free(in);
}

// ----------------------------------------------------------------------------
// checkpoints: written from a GPU trainer, resumed on the CPU

static char dir[512];

static void ckpt_setup(void)
{
    cr_assert_eq(ts_tmpdir("model_cuda", dir, sizeof dir), 0);
}

static void ckpt_teardown(void)
{
    ts_rmrf(dir);
}

static void ckpt_spec(ch_jobspec_t *j)
{
    ch_jobspec_defaults(j);
    strcpy(j->name, "gpuckpt");
    j->model.layers = 2;
    j->model.heads = 2;
    j->model.embd = 32;
    j->model.vocab = 32;
    j->model.seq_len = 32;
    j->parallel.microbatches = 2;
    j->parallel.micro_batch_size = 4;
    j->train.steps = 8;
    j->train.lr = 3e-3;
    j->train.warmup = 2;
    j->train.seed = 77;
    j->train.device = CH_DEVICE_CUDA;
    snprintf(j->checkpoint.dir, sizeof j->checkpoint.dir, "%s", dir);
    j->checkpoint.every = 4;
    j->checkpoint.keep = 2;
}

static eng_trainer_t *trainer_on(const ch_jobspec_t *j, const eng_backend_t *be)
{
    eng_trainer_t *t = NULL;
    char err[512];
    eng_trainer_opts_t opts = {.job_id = NULL, .peak_flops = 1e9, .backend = be};
    cr_assert_eq(eng_trainer_create(j, &opts, &t, err, sizeof err), 0, "%s", err);
    return t;
}

static void run_to_end(eng_trainer_t *t, double *losses)
{
    char err[512];
    while (eng_trainer_next_step(t) < eng_trainer_total_steps(t)) {
        eng_step_info_t info;
        cr_assert_eq(eng_trainer_step(t, &info), 0);
        losses[info.step] = info.loss;
        if (eng_trainer_checkpoint_due(t)) {
            cr_assert_eq(eng_trainer_checkpoint(t, NULL, NULL, err, sizeof err), 0, "%s", err);
        }
    }
}

Test(model_cuda, a_gpu_checkpoint_resumes_on_the_cpu, .init = ckpt_setup, .fini = ckpt_teardown,
     .timeout = 240)
{
    eng_backend_t *gpu = need_gpu();
    ch_jobspec_t j;
    ckpt_spec(&j);
    double lg[8] = {0}, lc[8] = {0};
    eng_trainer_t *a = trainer_on(&j, gpu);
    /* needs the trainer to honour eng_trainer_opts_t.backend */
    cr_assert_eq(eng_model_backend(eng_trainer_model(a)), gpu,
                 "the trainer ignored opts.backend: its model is not on the GPU");
    run_to_end(a, lg);
    eng_trainer_destroy(a);

    j.train.device = CH_DEVICE_CPU;
    eng_trainer_t *b = trainer_on(&j, NULL);
    char err[512];
    cr_assert_eq(eng_trainer_resume(b, 4, err, sizeof err), 0, "%s", err);
    run_to_end(b, lc);
    for (int s = 4; s < 8; s++) {
        cr_expect(fabs(lc[s] - lg[s]) <= 1e-4 * fabs(lg[s]),
                  "step %d after resuming on the CPU: %.9g, on the GPU %.9g", s, lc[s], lg[s]);
    }
    eng_trainer_destroy(b);
    eng_backend_cuda_destroy(gpu);
}
