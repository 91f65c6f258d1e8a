/* The Hugging Face round trip: a GPT-2 file shaped as HF publishes one (names, 1,024
 * positions, fp16) initialises a job with a shorter seq_len (wpe cropped); the trained
 * checkpoint exports as a folder with model.safetensors and a GPT-2 config.json, in fp32,
 * fp16 or bf16; the exported file initialises a job again. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gpt2.h"
#include "common/json.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "support.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/export.h"
#include "workerd/engine/trainer.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("export", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(export, .init = setup, .fini = teardown, .timeout = 240);

static void small_gpt2(ch_jobspec_t *j)
{
    ch_jobspec_defaults(j);
    strcpy(j->name, "hf");
    j->model.layers = 2;
    j->model.heads = 2;
    j->model.embd = 32;
    j->model.vocab = 64;
    j->model.seq_len = 32;
    j->train.steps = 3;
    j->parallel.micro_batch_size = 2;
    snprintf(j->checkpoint.dir, sizeof j->checkpoint.dir, "%s/ckpt", dir);
}

static eng_trainer_t *make(const ch_jobspec_t *j)
{
    eng_trainer_t *t = NULL;
    char err[512];
    eng_trainer_opts_t opts = {.peak_flops = 1e9};
    cr_assert_eq(eng_trainer_create(j, &opts, &t, err, sizeof err), 0, "%s", err);
    return t;
}

/* tensor `name` of the model equals the file's (its first rows for wpe), as floats */
static void expect_tensor_from_file(eng_model_t *m, ch_st_file_t *f, const char *name,
                                    const char *file_name)
{
    const eng_tensor_t *t = eng_model_find(m, name);
    const ch_st_tensor_t *st = ch_st_find(f, file_name);
    cr_assert(t && st, "%s / %s", name, file_name);
    float *v = malloc(st->numel * sizeof *v);
    char err[256];
    cr_assert_eq(ch_st_read_f32(f, st, v, err, sizeof err), 0, "%s", err);
    size_t n = t->numel;
    if (strcmp(name, "wte.weight") == 0)
        n = st->numel; /* the model's wte has padding rows */
    cr_expect_eq(memcmp(eng_model_params(m) + t->offset, v, n * sizeof *v), 0, "%s differs", name);
    free(v);
}

Test(export, hugging_face_round_trip)
{
    char hf[700], out[700], file[800], err[512] = "";
    ch_jobspec_t j;
    small_gpt2(&j);
    ch_model_cfg_t cfg = ch_plan_model_of(&j);
    snprintf(hf, sizeof hf, "%s/gpt2.safetensors", dir);
    cr_assert_eq(ts_write_gpt2(hf, &cfg, 1024, CH_ST_F16, 1), 0);

    /* init_from: HF names and fp16, 1,024 positions cropped to seq_len 32 */
    eng_trainer_t *t = make(&j);
    cr_assert_eq(eng_trainer_init_from(t, hf, err, sizeof err), 0, "%s", err);
    ch_st_file_t *f = NULL;
    cr_assert_eq(ch_st_open(hf, &f, err, sizeof err), 0, "%s", err);
    eng_model_t *m = eng_trainer_model(t);
    expect_tensor_from_file(m, f, "wpe.weight", "transformer.wpe.weight");
    expect_tensor_from_file(m, f, "wte.weight", "transformer.wte.weight");
    expect_tensor_from_file(m, f, "h.1.mlp.c_proj.weight", "transformer.h.1.mlp.c_proj.weight");
    ch_st_close(f);

    /* train, checkpoint, export as an HF folder in fp16 */
    while (eng_trainer_next_step(t) < eng_trainer_total_steps(t)) {
        eng_step_info_t info;
        cr_assert_eq(eng_trainer_step(t, &info), 0);
    }
    cr_assert_eq(eng_trainer_checkpoint(t, NULL, NULL, err, sizeof err), 0, "%s", err);
    char step_dir[700];
    cr_assert_eq(eng_ckpt_step_dir(j.checkpoint.dir, "hf", 3, step_dir, sizeof step_dir), 0);
    snprintf(out, sizeof out, "%s/exported", dir);
    cr_assert_eq(eng_export_as(step_dir, out, CH_ST_F16, 1, err, sizeof err), 0, "%s", err);

    /* config.json: what transformers' GPT2Config reads */
    char *text = NULL;
    size_t len = 0;
    snprintf(file, sizeof file, "%s/config.json", out);
    cr_assert_eq(ch_file_read(file, 1 << 16, &text, &len), 0);
    ch_json_t *cj = NULL;
    cr_assert_eq(ch_json_parse(text, len, NULL, &cj, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(ch_json_get_str(cj, "model_type"), "gpt2");
    cr_expect_str_eq(ch_json_get_str(cj, "activation_function"), "gelu_new");
    cr_expect_str_eq(ch_json_get_str(cj, "torch_dtype"), "float16");
    const char *keys[] = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"};
    const uint64_t want[] = {64, 32, 32, 2, 2};
    for (int k = 0; k < 5; k++) {
        uint64_t v = 0;
        cr_expect_eq(ch_json_u64(ch_json_get(cj, keys[k]), &v), 0, "%s", keys[k]);
        cr_expect_eq(v, want[k], "%s", keys[k]);
    }
    ch_json_free(cj);
    free(text);

    /* model.safetensors: every GPT-2 tensor in F16 with HF's name and shape */
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    cr_assert_eq(ch_st_open(file, &f, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_st_count(f), ch_gpt2_count(&cfg));
    for (size_t i = 0; i < ch_gpt2_count(&cfg); i++) {
        ch_gpt2_tensor_t g;
        ch_gpt2_tensor(&cfg, i, &g);
        const ch_st_tensor_t *st = ch_st_find(f, g.name);
        cr_assert_not_null(st, "%s missing", g.name);
        cr_expect_eq(st->dtype, CH_ST_F16);
        cr_expect_eq(st->shape[0], g.shape[0], "%s", g.name);
    }
    ch_st_close(f);
    cr_expect_eq(ch_gpt2_check_file(file, &cfg, err, sizeof err), 0, "%s", err);

    /* the exported file starts a job again: the trained weights rounded to fp16 */
    ch_jobspec_t j2 = j;
    j2.train.seed = 999;
    eng_trainer_t *back = make(&j2);
    cr_assert_eq(eng_trainer_init_from(back, file, err, sizeof err), 0, "%s", err);
    size_t n = eng_model_nparams(m);
    const float *p = eng_model_params(m);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) { /* within half an fp16 unit (2^-11 relative; subnormals) */
        float got = eng_model_params(eng_trainer_model(back))[i];
        if (fabsf(got - p[i]) > fabsf(p[i]) / 2048 + 3e-8f)
            differ++;
    }
    cr_expect_eq(differ, 0, "%zu of %zu parameters are not the fp16 rounding", differ, n);
    eng_trainer_destroy(back);

    /* bf16 and fp32 too */
    snprintf(out, sizeof out, "%s/bf16", dir);
    cr_assert_eq(eng_export_as(step_dir, out, CH_ST_BF16, 1, err, sizeof err), 0, "%s", err);
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    cr_assert_eq(ch_st_open(file, &f, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_st_find(f, "wte.weight")->dtype, CH_ST_BF16);
    ch_st_close(f);
    eng_trainer_destroy(t);
}

Test(export, a_file_of_the_wrong_shape_is_refused_naming_the_tensor)
{
    char hf[700], err[512] = "";
    ch_jobspec_t j;
    small_gpt2(&j);
    ch_model_cfg_t cfg = ch_plan_model_of(&j);
    cfg.embd = 16;
    snprintf(hf, sizeof hf, "%s/narrow.safetensors", dir);
    cr_assert_eq(ts_write_gpt2(hf, &cfg, 1024, CH_ST_F16, 0), 0);
    eng_trainer_t *t = make(&j);
    cr_expect_eq(eng_trainer_init_from(t, hf, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "wte.weight") && strstr(err, "[64, 16]") && strstr(err, "[64, 32]"), "%s",
              err);
    eng_trainer_destroy(t);
}
