/* chorus-bench-reference: run the Chorus trainer from a GPT-2 safetensors file on a token
 * file and write the resulting weights, for comparison with the independent PyTorch
 * implementation in tests/reference/ (see tests/reference/README.md).
 *
 *   chorus-bench-reference INIT.safetensors TOKENS.bin STEPS OUT.safetensors
 *       [--heads N] [--batch B] [--microbatches K] [--lr X]
 *       [--lr-min X] [--warmup N] [--seed S]
 *
 * Layers, width, vocab and seq_len come from the file. One line per step:
 * "step S loss L lr X grad_norm G". Without arguments it trains a small model on the
 * built-in corpus for a few seconds and prints a RESULT line (loss after / before). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/safetensors.h"
#include "workerd/engine/trainer.h"

static int usage(void)
{
    fprintf(stderr, "usage: chorus-bench-reference INIT.safetensors TOKENS.bin STEPS "
                    "OUT.safetensors [--heads N] [--batch B] [--microbatches K] "
                    "[--lr X] [--lr-min X] [--warmup N] [--seed S] [--val VAL_SOURCE] "
                    "[--eval-tokens N]\n(TOKENS and VAL_SOURCE: any train.data form, e.g. "
                    "text:FILE)\n");
    return 2;
}

/* Model shape from a GPT-2 file: layers = number of h.N.ln_1.weight, C and V from wte,
 * seq_len from wpe. */
static int shape_from_file(const char *path, ch_jobspec_t *j)
{
    char err[512], name[64];
    ch_st_file_t *f = NULL;
    int rc = ch_st_open(path, &f, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    const ch_st_tensor_t *wte = ch_st_find(f, "wte.weight"), *wpe = ch_st_find(f, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2) {
        fprintf(stderr, "%s: wte.weight / wpe.weight missing\n", path);
        ch_st_close(f);
        return CH_E_FORMAT;
    }
    j->model.vocab = (uint32_t)wte->shape[0];
    j->model.embd = (uint32_t)wte->shape[1];
    j->model.seq_len = (uint32_t)wpe->shape[0];
    uint32_t l = 0;
    for (;; l++) {
        snprintf(name, sizeof name, "h.%u.ln_1.weight", l);
        if (!ch_st_find(f, name))
            break;
    }
    j->model.layers = l;
    ch_st_close(f);
    return 0;
}

static int write_weights(eng_trainer_t *t, const char *out)
{
    eng_model_t *m = eng_trainer_model(t);
    ch_st_writer_t *w = NULL;
    char err[512];
    int rc = ch_st_writer_create(out, &w);
    for (size_t i = 0; rc == 0 && i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *e = eng_model_tensor(m, i);
        uint64_t shape[2] = {e->shape[0], e->shape[1]};
        rc = ch_st_writer_add(w, e->name, CH_ST_F32, e->ndim, shape,
                              eng_model_params(m) + e->offset);
    }
    if (rc < 0) {
        ch_st_writer_destroy(w);
        fprintf(stderr, "%s: %s\n", out, ch_strerror(rc));
        return rc;
    }
    rc = ch_st_writer_finish(w, NULL, NULL, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    return rc;
}

static int run(const ch_jobspec_t *j, const char *init, const char *out, double *first,
               double *last)
{
    char err[1024];
    eng_trainer_t *t = NULL;
    eng_trainer_opts_t opts = {.job_id = NULL, .peak_flops = 1e9};
    int rc = eng_trainer_create(j, &opts, &t, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    if (init && (rc = eng_trainer_init_from(t, init, err, sizeof err)) < 0) {
        fprintf(stderr, "%s\n", err);
        goto out;
    }
    while (eng_trainer_next_step(t) < eng_trainer_total_steps(t)) {
        eng_step_info_t info;
        rc = eng_trainer_step(t, &info);
        if (rc < 0) {
            fprintf(stderr, "step %" PRIu64 ": %s\n", eng_trainer_next_step(t), ch_strerror(rc));
            goto out;
        }
        if (init)
            printf("step %" PRIu64 " loss %.9g lr %.9g grad_norm %.9g\n", info.step, info.loss,
                   info.lr, info.grad_norm);
        if (init && !isnan(info.val_loss))
            printf("val_loss %.9g after step %" PRIu64 "\n", info.val_loss, info.step);
        if (info.step == 0)
            *first = info.loss;
        *last = info.loss;
    }
    if (out)
        rc = write_weights(t, out);
out:
    eng_trainer_destroy(t);
    return rc;
}

int main(int argc, char **argv)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    strcpy(j.name, "reference");
    j.train.warmup = 0;
    double first = 0, last = 0;
    if (argc == 1) {
        j.model.layers = 2;
        j.model.embd = 64;
        j.train.steps = 100;
        j.train.lr = 3e-3;
        if (run(&j, NULL, NULL, &first, &last) < 0)
            return 1;
        printf("RESULT name=builtin_loss_100_steps value=%.4f unit=nats ref=initial_loss "
               "ref_value=%.4f ratio=%.4f\n",
               last, first, last / first);
        return 0;
    }
    if (argc < 5)
        return usage();
    const char *init = argv[1], *out = argv[4];
    snprintf(j.train.data, sizeof j.train.data, "%s", argv[2]);
    j.train.steps = atoll(argv[3]);
    j.parallel.micro_batch_size = 4;
    j.model.heads = 4;
    if (shape_from_file(init, &j) < 0)
        return 1;
    for (int i = 5; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--heads"))
            j.model.heads = (uint32_t)atoi(v);
        else if (!strcmp(k, "--batch"))
            j.parallel.micro_batch_size = (uint32_t)atoi(v);
        else if (!strcmp(k, "--microbatches"))
            j.parallel.microbatches = (uint32_t)atoi(v);
        else if (!strcmp(k, "--lr"))
            j.train.lr = atof(v);
        else if (!strcmp(k, "--lr-min"))
            j.train.lr_min = atof(v);
        else if (!strcmp(k, "--warmup"))
            j.train.warmup = atoll(v);
        else if (!strcmp(k, "--seed"))
            j.train.seed = strtoull(v, NULL, 0);
        else if (!strcmp(k, "--val"))
            snprintf(j.train.val_data, sizeof j.train.val_data, "%s", v);
        else if (!strcmp(k, "--eval-tokens"))
            j.train.eval_tokens = atoll(v);
        else
            return usage();
    }
    return run(&j, init, out, &first, &last) < 0 ? 1 : 0;
}
