/* workerd/ckpt and workerd/export with a model: bit-exact round trip, refusals, keep-K
 * pruning, export to a Hugging Face GPT-2 file (pieces of other layouts:
 * test_ckpt_piece.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "support.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/optim.h"
#include "model_pieces.h"
#include "workerd/engine/export.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("ckpt", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(ckpt, .init = setup, .fini = teardown);

static const eng_config_t CFG = {
    .layers = 2, .heads = 2, .embd = 16, .vocab = 13, .padded_vocab = 16, .seq_len = 8};

static eng_model_t *model(uint64_t seed)
{
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_create(&CFG, 2, seed, &m), 0);
    return m;
}

static void meta_for(eng_ckpt_meta_t *meta, uint64_t step)
{
    memset(meta, 0, sizeof *meta);
    strcpy(meta->job, "j1");
    meta->step = step;
    meta->layout = (ch_layout_t){1, 1, 1};
    meta->world = 1;
    meta->cfg = CFG;
    meta->seed = 11;
    meta->data_seed = 11;
}

/* A model and an optimizer state that look trained: random m, v and t. */
static void trained(eng_model_t **m, eng_optim_t *o, uint64_t seed)
{
    *m = model(seed);
    cr_assert_eq(eng_optim_init(o, eng_model_nparams(*m)), 0);
    uint64_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < o->n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        o->m[i] = (float)((double)(x % 100000) * 1e-7 - 5e-3);
        o->v[i] = (float)((double)(x % 77777) * 1e-9);
    }
    o->t = 5;
    /* wte's padding rows never get a gradient, so their Adam state stays zero */
    const eng_tensor_t *wte = eng_model_find(*m, "wte.weight");
    size_t real = (size_t)wte->shape[0] * wte->shape[1];
    memset(o->m + wte->offset + real, 0, (wte->numel - real) * sizeof(float));
    memset(o->v + wte->offset + real, 0, (wte->numel - real) * sizeof(float));
}

static void save(eng_model_t *m, eng_optim_t *o, uint64_t step, int commit)
{
    eng_ckpt_meta_t meta;
    eng_ckpt_file_t file = {0, 0, 0};
    char err[512];
    meta_for(&meta, step);
    eng_ckpt_piece_t *pc = NULL;
    size_t n = model_pieces(m, o, &pc);
    cr_assert_eq(
        eng_ckpt_save_pieces(dir, &meta, pc, n, o->t, &file.bytes, &file.checksum, err, sizeof err),
        0, "%s", err);
    free(pc);
    cr_expect_gt(file.bytes, 3 * eng_model_nparams(m) * 3); /* params + m + v, roughly */
    if (commit)
        cr_assert_eq(eng_ckpt_write_manifest(dir, &meta, &file, 1, err, sizeof err), 0, "%s", err);
}

Test(ckpt, restore_is_bit_exact)
{
    eng_model_t *m;
    eng_optim_t o;
    trained(&m, &o, 3);
    save(m, &o, 5, 1);

    eng_model_t *m2 = model(99); /* different init: everything must come from the file */
    eng_optim_t o2;
    cr_assert_eq(eng_optim_init(&o2, eng_model_nparams(m2)), 0);
    eng_ckpt_meta_t expect;
    meta_for(&expect, 0);
    char sdir[1024], err[512];
    cr_assert_eq(eng_ckpt_step_dir(dir, "j1", 5, sdir, sizeof sdir), 0);
    cr_expect(strstr(sdir, "/j1/step-00000005") != NULL);
    uint64_t step = 0;
    cr_assert_eq(restore_model(sdir, &expect, m2, &o2, &step, err, sizeof err), 0, "%s", err);
    cr_expect_eq(step, 5);
    cr_expect_eq(o2.t, 5);
    size_t n = eng_model_nparams(m);
    cr_expect_eq(memcmp(eng_model_params(m), eng_model_params(m2), n * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.m, o2.m, n * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.v, o2.v, n * sizeof(float)), 0);

    /* the shard carries HF names, Adam state names and metadata */
    char path[1100];
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", sdir);
    ch_st_file_t *f = NULL;
    cr_assert_eq(ch_st_open(path, &f, err, sizeof err), 0, "%s", err);
    const ch_st_tensor_t *wte = ch_st_find(f, "wte.weight");
    cr_assert_not_null(wte);
    cr_expect_eq(wte->shape[0], 13); /* unpadded */
    cr_expect_not_null(ch_st_find(f, "optim.m.h.1.mlp.c_fc.weight"));
    cr_expect_not_null(ch_st_find(f, "optim.v.ln_f.bias"));
    cr_expect_str_eq(ch_st_meta(f, "step"), "5");
    cr_expect_str_eq(ch_st_meta(f, "layout.tp"), "1");
    cr_expect_str_eq(ch_st_meta(f, "model.embd"), "16");
    ch_st_close(f);

    eng_optim_fini(&o);
    eng_optim_fini(&o2);
    eng_model_destroy(m);
    eng_model_destroy(m2);
}

Test(ckpt, resumes_other_layouts_refuses_other_models_and_corruption)
{
    eng_model_t *m;
    eng_optim_t o;
    trained(&m, &o, 4);
    save(m, &o, 7, 1);
    char sdir[1024], err[512];
    uint64_t step;
    eng_ckpt_step_dir(dir, "j1", 7, sdir, sizeof sdir);

    /* another layout reshards at load: rank 1 of dp 2 (a replica) gets the same model */
    eng_ckpt_meta_t expect;
    meta_for(&expect, 0);
    expect.layout.dp = 2;
    expect.world = 2;
    expect.rank = 1;
    eng_model_t *m2 = model(98);
    eng_optim_t o2;
    cr_assert_eq(eng_optim_init(&o2, eng_model_nparams(m2)), 0);
    cr_expect_eq(restore_model(sdir, &expect, m2, &o2, &step, err, sizeof err), 0, "%s", err);
    size_t n = eng_model_nparams(m);
    cr_expect_eq(memcmp(eng_model_params(m), eng_model_params(m2), n * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.v, o2.v, n * sizeof(float)), 0);
    eng_optim_fini(&o2);
    eng_model_destroy(m2);

    meta_for(&expect, 0);
    expect.cfg.seq_len = 16;
    cr_expect_eq(restore_model(sdir, &expect, m, &o, &step, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "seq_len") != NULL, "%s", err);

    /* flip one byte of the data: the manifest's checksum catches it */
    char path[1100];
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", sdir);
    FILE *fp = fopen(path, "r+b");
    fseek(fp, -100, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -100, SEEK_END);
    fputc(c ^ 0x40, fp);
    fclose(fp);
    meta_for(&expect, 0);
    cr_expect_eq(restore_model(sdir, &expect, m, &o, &step, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "checksum") != NULL, "%s", err);

    snprintf(sdir, sizeof sdir, "%s/j1/step-00000099", dir);
    cr_expect_eq(restore_model(sdir, &expect, m, &o, &step, err, sizeof err), -ENOENT);
    eng_optim_fini(&o);
    eng_model_destroy(m);
}

static int exists(uint64_t step)
{
    char sdir[1024];
    eng_ckpt_step_dir(dir, "j1", step, sdir, sizeof sdir);
    return access(sdir, F_OK) == 0;
}

Test(ckpt, keeps_the_last_k_committed_steps)
{
    eng_model_t *m;
    eng_optim_t o;
    trained(&m, &o, 5);
    uint64_t latest = 0;
    cr_expect_eq(eng_ckpt_latest(dir, "j1", &latest), CH_E_NOTFOUND);
    save(m, &o, 5, 0); /* never committed (a crash between shard and commit) */
    for (uint64_t s = 10; s <= 40; s += 10) {
        save(m, &o, s, 1);
        cr_assert_eq(eng_ckpt_prune(dir, "j1", 2), 0);
    }
    save(m, &o, 50, 0); /* in flight: not committed yet, newer than what is kept */
    cr_assert_eq(eng_ckpt_prune(dir, "j1", 2), 0);
    cr_expect_not(exists(5));
    cr_expect_not(exists(10));
    cr_expect_not(exists(20));
    cr_expect(exists(30));
    cr_expect(exists(40));
    cr_expect(exists(50));
    cr_assert_eq(eng_ckpt_latest(dir, "j1", &latest), 0);
    cr_expect_eq(latest, 40);
    /* keep <= 0 keeps everything */
    cr_assert_eq(eng_ckpt_prune(dir, "j1", 0), 0);
    cr_expect(exists(30));
    eng_optim_fini(&o);
    eng_model_destroy(m);
}

Test(ckpt, export_writes_a_gpt2_file)
{
    eng_model_t *m;
    eng_optim_t o;
    trained(&m, &o, 6);
    save(m, &o, 9, 1);
    char sdir[1024], out[1024], err[512];
    eng_ckpt_step_dir(dir, "j1", 9, sdir, sizeof sdir);
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    cr_assert_eq(eng_export(sdir, out, err, sizeof err), 0, "%s", err);

    ch_st_file_t *f = NULL;
    cr_assert_eq(ch_st_open(out, &f, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_st_count(f), eng_model_ntensors(m));
    cr_expect_str_eq(ch_st_meta(f, "format"), "pt");
    cr_expect_str_eq(ch_st_meta(f, "n_layer"), "2");
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        const ch_st_tensor_t *st = ch_st_find(f, t->name);
        cr_assert_not_null(st, "%s", t->name);
        cr_expect_eq(st->shape[0], t->shape[0]);
        size_t n = st->numel;
        float *buf = malloc(n * sizeof *buf);
        cr_assert_eq(ch_st_read_f32(f, st, buf, err, sizeof err), 0);
        cr_expect_eq(memcmp(buf, eng_model_params(m) + t->offset, n * sizeof *buf), 0, "%s",
                     t->name);
        free(buf);
    }
    const ch_st_tensor_t *wte = ch_st_find(f, "wte.weight");
    cr_expect_eq(wte->shape[0], 13);
    cr_expect_eq(wte->shape[1], 16);
    ch_st_close(f);

    /* a directory without a shard is an error naming it */
    char empty[1024];
    snprintf(empty, sizeof empty, "%s/j1/step-00000001", dir);
    ch_mkdirs(empty, 0755);
    cr_expect_lt(eng_export(empty, out, err, sizeof err), 0);
    cr_expect(strstr(err, "step-00000001") != NULL, "%s", err);
    eng_optim_fini(&o);
    eng_model_destroy(m);
}
