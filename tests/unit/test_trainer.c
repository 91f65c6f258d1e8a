/* workerd/trainer: resume bit-identity, learning on the built-in corpus (and the demo
 * job learning to add), init_from, refusals. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "corpus.h"
#include "err.h"
#include "safetensors.h"
#include "trainer.h"
#include "support.h"
#include "util.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("trainer", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(trainer, .init = setup, .fini = teardown, .timeout = 240);

static void tiny_spec(ch_jobspec_t *j)
{
    ch_jobspec_defaults(j);
    strcpy(j->name, "tiny");
    j->model.layers = 2;
    j->model.heads = 2;
    j->model.embd = 32;
    j->model.vocab = 32;
    j->model.seq_len = 32;
    j->parallel.microbatches = 2;
    j->parallel.micro_batch_size = 4;
    j->train.steps = 30;
    j->train.lr = 3e-3;
    j->train.warmup = 5;
    j->train.seed = 77;
    snprintf(j->checkpoint.dir, sizeof j->checkpoint.dir, "%s", dir);
    j->checkpoint.every = 20;
    j->checkpoint.keep = 2;
}

static wrk_trainer_t *make(const ch_jobspec_t *j)
{
    wrk_trainer_t *t = NULL;
    char err[512];
    wrk_trainer_opts_t opts = {.job_id = NULL, .peak_flops = 1e9};
    cr_assert_eq(wrk_trainer_create(j, &opts, &t, err, sizeof err), 0, "%s", err);
    return t;
}

/* Run to the end, checkpointing when due; losses[s] for every step run. */
static void run(wrk_trainer_t *t, double *losses)
{
    char err[512];
    while (wrk_trainer_next_step(t) < wrk_trainer_total_steps(t)) {
        wrk_step_info_t info;
        cr_assert_eq(wrk_trainer_step(t, &info), 0);
        cr_assert(isfinite(info.loss));
        cr_expect_gt(info.tokens_per_s, 0);
        cr_expect_gt(info.mfu, 0);
        losses[info.step] = info.loss;
        if (wrk_trainer_checkpoint_due(t))
            cr_assert_eq(wrk_trainer_checkpoint(t, NULL, NULL, err, sizeof err), 0, "%s", err);
    }
}

Test(trainer, resume_is_bit_identical_to_the_uninterrupted_run)
{
    ch_jobspec_t j;
    tiny_spec(&j);
    double la[30] = {0}, lb[30] = {0};
    wrk_trainer_t *a = make(&j);
    run(a, la);
    cr_expect_lt(la[29], la[0]);

    wrk_trainer_t *b = make(&j);
    char err[512];
    cr_assert_eq(wrk_trainer_resume(b, 20, err, sizeof err), 0, "%s", err);
    cr_expect_eq(wrk_trainer_next_step(b), 20);
    run(b, lb);
    for (int s = 20; s < 30; s++)
        cr_expect_eq(la[s], lb[s], "loss of step %d: %.9g vs %.9g", s, la[s], lb[s]);

    size_t n = eng_model_nparams(wrk_trainer_model(a));
    cr_expect_eq(memcmp(eng_model_params(wrk_trainer_model(a)),
                        eng_model_params(wrk_trainer_model(b)), n * sizeof(float)),
                 0, "parameters differ");
    cr_expect_eq(memcmp(wrk_trainer_optim(a)->m, wrk_trainer_optim(b)->m, n * sizeof(float)), 0,
                 "Adam m differs");
    cr_expect_eq(memcmp(wrk_trainer_optim(a)->v, wrk_trainer_optim(b)->v, n * sizeof(float)), 0,
                 "Adam v differs");
    cr_expect_eq(wrk_trainer_optim(a)->t, wrk_trainer_optim(b)->t);
    wrk_trainer_destroy(a);
    wrk_trainer_destroy(b);

    /* every 20 and the last step were written, and keep = 2 kept both */
    uint64_t latest = 0;
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/tiny/step-00000020/manifest.json", dir);
    cr_expect_eq(access(sdir, F_OK), 0);
    cr_assert_eq(wrk_ckpt_latest(dir, "tiny", &latest), 0);
    cr_expect_eq(latest, 30);
}

Test(trainer, learns_the_arithmetic_corpus)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j); /* vocab 32, seq_len 64, builtin data */
    j.model.layers = 2;
    j.model.heads = 4;
    j.model.embd = 64;
    j.parallel.micro_batch_size = 8;
    j.train.steps = 120;
    j.train.lr = 3e-3;
    j.train.warmup = 10;
    wrk_trainer_t *t = make(&j);
    double losses[120];
    run(t, losses);
    double first = losses[0], last = 0;
    for (int s = 110; s < 120; s++)
        last += losses[s] / 10;
    cr_expect_gt(first, 3.0, "initial loss %.3f should be near ln(32) = 3.47", first);
    /* below ln(13) = 2.56: better than guessing uniformly among the corpus's characters */
    cr_expect_lt(last, 0.75 * first, "loss went from %.3f to %.3f", first, last);
    cr_expect_lt(last, log(13.0), "loss went from %.3f to %.3f", first, last);
    double acc = -1;
    wrk_corpus_sample_t samples[2];
    cr_assert_eq(wrk_corpus_eval(wrk_trainer_model(t), 8, 1, 32, &acc, samples, 2), 0);
    cr_expect(acc >= 0 && acc <= 1);
    cr_expect(strchr(samples[0].text, '=') != NULL, "%s", samples[0].text);
    cr_log_info("loss %.3f -> %.3f, answer accuracy %.2f (e.g. %s)", first, last, acc,
                samples[0].text);
    wrk_trainer_destroy(t);
}

/* The source tree: CHORUS_SRC_DIR as ctest sets it, else where this file was compiled. */
static void src_path(const char *rel, char *out, size_t cap)
{
    const char *src = getenv("CHORUS_SRC_DIR");
    if (src && *src) {
        snprintf(out, cap, "%s/%s", src, rel);
        return;
    }
    const char *here = __FILE__, *tail = strstr(here, "tests/unit/");
    int root = tail ? (int)(tail - here) : 0;
    snprintf(out, cap, "%.*s%s", root, here, rel);
}

Test(trainer, the_demo_job_learns_to_add)
{
    /* deploy/jobs/demo.ini as the quick-start runs it: its model must end up answering
     * the sums, not only lowering the loss (about 30 s on one core). */
    char path[1024], err[512], *text = NULL;
    src_path("deploy/jobs/demo.ini", path, sizeof path);
    cr_assert_eq(ch_file_read(path, 1 << 16, &text, NULL), 0, "%s", path);
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    cr_assert_eq(ch_jobspec_parse(text, &j, err, sizeof err), 0, "%s: %s", path, err);
    free(text);
    cr_assert(strcmp(j.train.data, "builtin") == 0, "demo data: %s", j.train.data);
    wrk_trainer_t *t = make(&j);
    double *losses = calloc(wrk_trainer_total_steps(t), sizeof *losses);
    cr_assert_not_null(losses);
    run(t, losses);
    double acc = -1;
    wrk_corpus_sample_t samples[3];
    cr_assert_eq(wrk_corpus_eval(wrk_trainer_model(t), j.parallel.micro_batch_size, 2, 256, &acc,
                                 samples, 3),
                 0);
    cr_expect_geq(acc, 0.9, "answer accuracy %.3f after %" PRIu64 " steps (e.g. %s %s %s)", acc,
                  wrk_trainer_total_steps(t), samples[0].text, samples[1].text, samples[2].text);
    cr_log_info("demo job: answer accuracy %.3f (e.g. %s)", acc, samples[0].text);
    free(losses);
    wrk_trainer_destroy(t);
}

Test(trainer, refuses_parallel_layouts_for_now)
{
    ch_jobspec_t j;
    tiny_spec(&j);
    j.parallel.dp = 2;
    wrk_trainer_t *t = NULL;
    char err[512] = "";
    cr_expect_eq(wrk_trainer_create(&j, NULL, &t, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "3D parallel training needs the parallel engine") != NULL, "%s", err);
    cr_expect_null(t);
}

Test(trainer, init_from_a_hugging_face_file)
{
    ch_jobspec_t j;
    tiny_spec(&j);
    wrk_trainer_t *src = make(&j);
    eng_model_t *m = wrk_trainer_model(src);
    /* write the model as HF's GPT2LMHeadModel does: "transformer." names, plus extras */
    char path[700], err[512];
    snprintf(path, sizeof path, "%s/hf.safetensors", dir);
    ch_st_writer_t *w = NULL;
    cr_assert_eq(ch_st_writer_create(path, &w), 0);
    char names[64][96];
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        uint64_t shape[2] = {t->shape[0], t->shape[1]};
        snprintf(names[i], sizeof names[i], "transformer.%s", t->name);
        cr_assert_eq(ch_st_writer_add(w, names[i], CH_ST_F32, t->ndim, shape,
                                      eng_model_params(m) + t->offset),
                     0);
    }
    float mask[4] = {1, 0, 1, 1};
    uint64_t s4[1] = {4};
    cr_assert_eq(ch_st_writer_add(w, "transformer.h.0.attn.bias", CH_ST_F32, 1, s4, mask), 0);
    cr_assert_eq(ch_st_writer_finish(w, NULL, NULL, err, sizeof err), 0);

    ch_jobspec_t j2 = j;
    j2.train.seed = 12345; /* a different init, overwritten by the file */
    wrk_trainer_t *dst = make(&j2);
    size_t n = eng_model_nparams(m);
    cr_expect_neq(
        memcmp(eng_model_params(m), eng_model_params(wrk_trainer_model(dst)), n * sizeof(float)),
        0);
    cr_assert_eq(wrk_trainer_init_from(dst, path, err, sizeof err), 0, "%s", err);
    cr_expect_eq(
        memcmp(eng_model_params(m), eng_model_params(wrk_trainer_model(dst)), n * sizeof(float)),
        0);
    wrk_trainer_destroy(dst);

    /* a model of another width does not fit the file */
    ch_jobspec_t j3 = j;
    j3.model.embd = 64;
    wrk_trainer_t *other = make(&j3);
    cr_expect_eq(wrk_trainer_init_from(other, path, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "hf.safetensors") != NULL && strstr(err, "shape") != NULL, "%s", err);
    wrk_trainer_destroy(other);
    wrk_trainer_destroy(src);
}
