/* workerd/engine/ckpt_piece: checkpoints as pieces of any layout. A synthetic GPT-2's full
 * tensors are cut as the ranks of a layout hold them (tensor-parallel slices as model.c
 * cuts them, pipeline stages, ZeRO-3 ranges of each rank's flat buffer), saved as one shard
 * per rank with a manifest, and restored into other layouts bit for bit; holes, corrupt
 * shards and uncommitted steps are refused; export joins any layout; init_from loads a
 * Hugging Face file into any layout; files written by the model-based save reshard too. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cr_assert_eq(ts_tmpdir("ckpt_piece", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(ckpt_piece, .init = setup, .fini = teardown);

/* padded_vocab 16: divisible by tp 1, 2 and 4 */
static const ch_model_cfg_t CFG = {
    .layers = 2, .heads = 2, .embd = 8, .vocab = 13, .padded_vocab = 16, .seq_len = 4};

#define MAXT 40
enum { NONE, COL, ROW }; /* ROW also cuts wte's vocab rows */

typedef struct spec {
    char name[64];
    uint32_t ndim, d0, d1, rows0, parts;
    int split, block; /* block -1: wte (both ends), -2: wpe (first stage), -3: ln_f (last) */
} spec_t;

/* The model's full tensors: p, m, v for each. */
typedef struct full {
    spec_t spec[MAXT];
    size_t n;
    float *t[MAXT][3];
} full_t;

typedef struct layout {
    uint32_t tp, pp, dp;
} layout_t;

static void add(full_t *f, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1,
                uint32_t rows0, int split, uint32_t parts, int block)
{
    spec_t *s = &f->spec[f->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    s->d0 = d0;
    s->d1 = d1;
    s->rows0 = rows0;
    s->split = split;
    s->parts = parts;
    s->block = block;
}

/* GPT-2's tensors, as model.c's table lists them. */
static void gpt2(full_t *f)
{
    uint32_t C = CFG.embd;
    char name[64];
    memset(f, 0, sizeof *f);
    add(f, "wte.weight", 2, CFG.vocab, C, CFG.padded_vocab, ROW, 1, -1);
    add(f, "wpe.weight", 2, CFG.seq_len, C, CFG.seq_len, NONE, 1, -2);
    static const struct {
        const char *suffix;
        uint32_t ndim, rows, cols, parts;
        int split;
    } blk[] = {
        {"ln_1.weight", 1, 1, 0, 1, NONE},       {"ln_1.bias", 1, 1, 0, 1, NONE},
        {"attn.c_attn.weight", 2, 1, 3, 3, COL}, {"attn.c_attn.bias", 1, 3, 0, 3, COL},
        {"attn.c_proj.weight", 2, 1, 1, 1, ROW}, {"attn.c_proj.bias", 1, 1, 0, 1, NONE},
        {"ln_2.weight", 1, 1, 0, 1, NONE},       {"ln_2.bias", 1, 1, 0, 1, NONE},
        {"mlp.c_fc.weight", 2, 1, 4, 1, COL},    {"mlp.c_fc.bias", 1, 4, 0, 1, COL},
        {"mlp.c_proj.weight", 2, 4, 1, 1, ROW},  {"mlp.c_proj.bias", 1, 1, 0, 1, NONE},
    };
    for (uint32_t l = 0; l < CFG.layers; l++)
        for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
            snprintf(name, sizeof name, "h.%u.%s", l, blk[i].suffix);
            add(f, name, blk[i].ndim, blk[i].rows * C, blk[i].cols * C, blk[i].rows * C,
                blk[i].split, blk[i].parts, (int)l);
        }
    add(f, "ln_f.weight", 1, C, 0, C, NONE, 1, -3);
    add(f, "ln_f.bias", 1, C, 0, C, NONE, 1, -3);
}

static size_t full_numel(const spec_t *s)
{
    return (size_t)s->d0 * (s->ndim == 2 ? s->d1 : 1);
}

/* Distinct values for every element of every tensor and kind. */
static void make_values(full_t *f, uint64_t seed)
{
    for (size_t i = 0; i < f->n; i++)
        for (int k = 0; k < 3; k++) {
            size_t n = full_numel(&f->spec[i]);
            f->t[i][k] = malloc(n * sizeof(float));
            for (size_t e = 0; e < n; e++)
                f->t[i][k][e] = (float)(seed * 1000003u + i * 7919u + (uint64_t)k * 104729u + e) *
                                1e-3f * (k == 2 ? 1e-3f : 1.0f);
        }
}

static void free_values(full_t *f)
{
    for (size_t i = 0; i < f->n; i++)
        for (int k = 0; k < 3; k++)
            free(f->t[i][k]);
}

/* model.c's add_tensor: the slice TP rank r of p holds. padded: the vocab rows of wte. */
static eng_slice_t tp_slice(const spec_t *sp, uint32_t padded, uint32_t p, uint32_t r)
{
    eng_slice_t s;
    memset(&s, 0, sizeof s);
    uint32_t rows0 = sp->block == -1 ? padded : sp->rows0;
    s.ndim = sp->ndim;
    s.shape[0] = sp->d0;
    s.shape[1] = sp->ndim == 2 ? sp->d1 : 0;
    s.hi[0] = rows0;
    s.hi[1] = s.shape[1];
    s.parts = 1;
    int last = sp->ndim == 2 ? 1 : 0;
    if (sp->split == COL) {
        uint32_t w = s.shape[last] / sp->parts / p;
        s.parts = sp->parts;
        s.lo[last] = r * w;
        s.hi[last] = (r + 1) * w;
    } else if (sp->split == ROW) {
        uint32_t w = rows0 / p;
        s.lo[0] = r * w;
        s.hi[0] = (r + 1) * w;
    }
    return s;
}

static int on_stage(const spec_t *sp, uint32_t pp, uint32_t stage)
{
    uint32_t per = CFG.layers / pp; /* the tests' pp divides layers */
    if (sp->block >= 0)
        return (uint32_t)sp->block / per == stage;
    return sp->block == -1   ? stage == 0 || stage == pp - 1
           : sp->block == -2 ? stage == 0
                             : stage == pp - 1;
}

/* Rank = (stage * dp + d) * tp + t. Its pieces: the TP slices of its stage's tensors in
 * table order as one flat buffer, of which ZeRO rank d holds [N d / dp, N (d+1) / dp);
 * pieces cut from it (empty ones kept: a == b). p, m, v malloc'd, filled from f when fill,
 * else NaN. */
static size_t rank_pieces(const full_t *f, layout_t l, uint32_t padded, uint32_t rank, int fill,
                          eng_ckpt_piece_t *out)
{
    uint32_t t = rank % l.tp, d = rank / l.tp % l.dp, stage = rank / l.tp / l.dp;
    size_t n = 0, total = 0;
    for (size_t i = 0; i < f->n; i++)
        if (on_stage(&f->spec[i], l.pp, stage)) {
            eng_slice_t s = tp_slice(&f->spec[i], padded, l.tp, t);
            total += eng_slice_numel(&s);
        }
    size_t lo = total * d / l.dp, hi = total * (d + 1) / l.dp, off = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (!on_stage(&f->spec[i], l.pp, stage))
            continue;
        eng_ckpt_piece_t *pc = &out[n++];
        memset(pc, 0, sizeof *pc);
        snprintf(pc->name, sizeof pc->name, "%s", f->spec[i].name);
        pc->slice = tp_slice(&f->spec[i], padded, l.tp, t);
        size_t numel = eng_slice_numel(&pc->slice);
        size_t a = lo > off ? lo - off : 0, b = hi > off ? hi - off : 0;
        pc->a = a < numel ? a : numel;
        pc->b = b < numel ? b : numel;
        if (pc->b < pc->a)
            pc->b = pc->a;
        off += numel;
        float **dst[3] = {&pc->p, &pc->m, &pc->v};
        for (int k = 0; k < 3; k++) {
            *dst[k] = malloc((pc->b - pc->a + 1) * sizeof(float));
            if (fill)
                eng_slice_read(&pc->slice, pc->a, pc->b, f->t[i][k], *dst[k]);
            else
                for (size_t e = 0; e < pc->b - pc->a; e++)
                    (*dst[k])[e] = NAN;
        }
    }
    return n;
}

static void free_pieces(eng_ckpt_piece_t *pc, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(pc[i].p);
        free(pc[i].m);
        free(pc[i].v);
    }
}

static void meta_for(eng_ckpt_meta_t *m, const char *job, uint64_t step, layout_t l,
                     uint32_t padded, uint32_t rank)
{
    memset(m, 0, sizeof *m);
    snprintf(m->job, sizeof m->job, "%s", job);
    m->step = step;
    m->layout = (ch_layout_t){.tp = l.tp, .pp = l.pp, .dp = l.dp};
    m->rank = rank;
    m->world = l.tp * l.pp * l.dp;
    m->cfg = CFG;
    m->cfg.padded_vocab = padded;
    m->seed = 1;
    m->data_seed = 2;
}

/* Save step 5 of job in layout l, every rank, and commit it unless told not to. skip: a
 * tensor rank skip_rank leaves out (NULL: none). */
static void save_layout(const full_t *f, const char *job, layout_t l, int commit, const char *skip,
                        uint32_t skip_rank)
{
    uint32_t world = l.tp * l.pp * l.dp;
    eng_ckpt_file_t files[16];
    eng_ckpt_meta_t meta;
    eng_ckpt_piece_t pieces[MAXT];
    char err[512];
    for (uint32_t r = 0; r < world; r++) {
        size_t n = rank_pieces(f, l, CFG.padded_vocab, r, 1, pieces);
        size_t keep = 0;
        for (size_t i = 0; i < n; i++) {
            if (skip && r == skip_rank && strcmp(pieces[i].name, skip) == 0) {
                free_pieces(&pieces[i], 1);
                continue;
            }
            pieces[keep++] = pieces[i];
        }
        meta_for(&meta, job, 5, l, CFG.padded_vocab, r);
        files[r].rank = r;
        cr_assert_eq(eng_ckpt_save_pieces(dir, &meta, pieces, keep, 42, &files[r].bytes,
                                          &files[r].checksum, err, sizeof err),
                     0, "%s", err);
        free_pieces(pieces, keep);
    }
    meta_for(&meta, job, 5, l, CFG.padded_vocab, 0);
    if (commit)
        cr_assert_eq(eng_ckpt_write_manifest(dir, &meta, files, world, err, sizeof err), 0, "%s",
                     err);
}

static void step_dir(const char *job, char *out, size_t n)
{
    cr_assert_eq(eng_ckpt_step_dir(dir, job, 5, out, n), 0);
}

/* Every piece holds exactly f's elements (p, m, v). */
static void expect_pieces(const full_t *f, const eng_ckpt_piece_t *pc, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < f->n && strcmp(f->spec[k].name, pc[i].name) != 0)
            k++;
        cr_assert_lt(k, f->n);
        float *want = malloc((pc[i].b - pc[i].a + 1) * sizeof *want);
        const float *got[3] = {pc[i].p, pc[i].m, pc[i].v};
        for (int kind = 0; kind < 3; kind++) {
            eng_slice_read(&pc[i].slice, pc[i].a, pc[i].b, f->t[k][kind], want);
            cr_expect_eq(memcmp(got[kind], want, (pc[i].b - pc[i].a) * sizeof *want), 0,
                         "%s: %s kind %d", what, pc[i].name, kind);
        }
        free(want);
    }
}

/* Restore every rank of layout l (wte padded to padded rows) from job's step 5. */
static void restore_layout(const full_t *f, const char *job, layout_t l, uint32_t padded)
{
    char sdir[1024], err[512], what[128];
    eng_ckpt_piece_t pieces[MAXT];
    step_dir(job, sdir, sizeof sdir);
    for (uint32_t r = 0; r < l.tp * l.pp * l.dp; r++) {
        eng_ckpt_meta_t expect;
        uint64_t t = 0, step = 0;
        size_t n = rank_pieces(f, l, padded, r, 0, pieces);
        meta_for(&expect, job, 0, l, padded, r);
        cr_assert_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                     0, "%s", err);
        cr_expect_eq(t, 42);
        cr_expect_eq(step, 5);
        snprintf(what, sizeof what, "%s into tp%u pp%u dp%u rank %u", job, l.tp, l.pp, l.dp, r);
        expect_pieces(f, pieces, n, what);
        free_pieces(pieces, n);
    }
}

static const layout_t LAYOUTS[] = {
    {1, 1, 1}, /* whole */
    {2, 1, 1}, /* tensor parallel */
    {1, 1, 3}, /* ZeRO-3 over 3 ranks */
    {2, 1, 2}, /* tp 2 x ZeRO ranges */
    {2, 2, 2}, /* all three */
    {4, 2, 1}, /* tp 4 x pp 2 */
};
#define NLAYOUTS (sizeof LAYOUTS / sizeof LAYOUTS[0])

Test(ckpt_piece, every_layout_restores_into_every_other_bit_exactly)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 3);
    char job[32];
    for (size_t s = 0; s < NLAYOUTS; s++) {
        snprintf(job, sizeof job, "from%zu", s);
        save_layout(&f, job, LAYOUTS[s], 1, NULL, 0);
        for (size_t t = 0; t < NLAYOUTS; t++)
            restore_layout(&f, job, LAYOUTS[t], CFG.padded_vocab);
        /* padded_vocab may differ: tp 1 needs no padding */
        restore_layout(&f, job, (layout_t){1, 1, 2}, CFG.vocab);
    }
    free_values(&f);
}

Test(ckpt_piece, sliced_pieces_are_stored_with_their_slice)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 4);
    save_layout(&f, "meta", (layout_t){2, 1, 2}, 1, NULL, 0);
    char path[1200], sdir[1024], err[512];
    step_dir("meta", sdir, sizeof sdir);
    snprintf(path, sizeof path, "%s/rank-00001.safetensors", sdir);
    ch_st_file_t *st = NULL;
    cr_assert_eq(ch_st_open(path, &st, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(ch_st_meta(st, "shard"), "pieces");
    cr_expect_str_eq(ch_st_meta(st, "layout.tp"), "2");
    const char *text = ch_st_meta(st, "slice.h.0.attn.c_attn.weight");
    cr_assert_not_null(text);
    eng_slice_t s;
    size_t a, b;
    cr_assert_eq(eng_slice_parse(text, &s, &a, &b), 0);
    cr_expect_eq(s.parts, 3);
    cr_expect_eq(s.lo[1], 4); /* tp rank 1 of 2: columns 4..8 of each of q, k, v */
    const ch_st_tensor_t *t = ch_st_find(st, "optim.v.h.0.attn.c_attn.weight");
    cr_assert_not_null(t);
    cr_expect_eq(t->ndim, 1);
    cr_expect_eq(t->numel, b - a);
    ch_st_close(st);
    free_values(&f);
}

Test(ckpt_piece, same_layout_reads_only_its_own_shard)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 5);
    layout_t l = {2, 1, 2};
    save_layout(&f, "own", l, 1, NULL, 0);
    char sdir[1024], path[1200], err[512];
    step_dir("own", sdir, sizeof sdir);
    /* corrupt rank 3's shard: a byte of its data */
    snprintf(path, sizeof path, "%s/rank-00003.safetensors", sdir);
    FILE *fp = fopen(path, "r+b");
    cr_assert_not_null(fp);
    fseek(fp, -8, SEEK_END);
    int c = fgetc(fp);
    fseek(fp, -8, SEEK_END);
    fputc(c ^ 0x10, fp);
    fclose(fp);

    eng_ckpt_piece_t pieces[MAXT];
    eng_ckpt_meta_t expect;
    uint64_t t, step;
    for (uint32_t r = 0; r < 3; r++) { /* ranks 0..2 resume without touching rank 3's file */
        size_t n = rank_pieces(&f, l, CFG.padded_vocab, r, 0, pieces);
        meta_for(&expect, "own", 0, l, CFG.padded_vocab, r);
        cr_assert_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                     0, "%s", err);
        expect_pieces(&f, pieces, n, "same layout");
        free_pieces(pieces, n);
    }
    /* rank 3 itself, and any other layout, need the corrupt file */
    layout_t targets[] = {l, {1, 1, 1}};
    uint32_t ranks[] = {3, 0};
    for (int i = 0; i < 2; i++) {
        size_t n = rank_pieces(&f, targets[i], CFG.padded_vocab, ranks[i], 0, pieces);
        meta_for(&expect, "own", 0, targets[i], CFG.padded_vocab, ranks[i]);
        cr_expect_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                     CH_E_FORMAT);
        cr_expect(strstr(err, "rank-00003.safetensors") && strstr(err, "checksum"), "%s", err);
        free_pieces(pieces, n);
    }
    free_values(&f);
}

Test(ckpt_piece, an_element_no_shard_holds_is_refused_naming_the_tensor)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 6);
    save_layout(&f, "hole", (layout_t){2, 1, 2}, 1, "h.1.mlp.c_fc.weight", 2);
    char sdir[1024], err[512];
    step_dir("hole", sdir, sizeof sdir);
    eng_ckpt_piece_t pieces[MAXT];
    eng_ckpt_meta_t expect;
    uint64_t t, step;
    size_t n = rank_pieces(&f, (layout_t){1, 1, 1}, CFG.padded_vocab, 0, 0, pieces);
    meta_for(&expect, "hole", 0, (layout_t){1, 1, 1}, CFG.padded_vocab, 0);
    cr_expect_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                 CH_E_FORMAT);
    cr_expect(strstr(err, "tensor h.1.mlp.c_fc.weight") && strstr(err, "not covered"), "%s", err);
    free_pieces(pieces, n);

    char out[1024];
    snprintf(out, sizeof out, "%s/hole.safetensors", dir);
    cr_expect_eq(eng_export(sdir, out, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "h.1.mlp.c_fc.weight") != NULL, "%s", err);
    free_values(&f);
}

Test(ckpt_piece, a_step_without_manifest_or_another_model_is_refused)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 7);
    save_layout(&f, "uncommitted", (layout_t){2, 1, 1}, 0, NULL, 0);
    char sdir[1024], err[512], out[1024];
    step_dir("uncommitted", sdir, sizeof sdir);
    eng_ckpt_piece_t pieces[MAXT];
    eng_ckpt_meta_t expect;
    uint64_t t, step;
    size_t n = rank_pieces(&f, (layout_t){2, 1, 1}, CFG.padded_vocab, 0, 0, pieces);
    meta_for(&expect, "uncommitted", 0, (layout_t){2, 1, 1}, CFG.padded_vocab, 0);
    cr_expect_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                 -ENOENT);
    cr_expect(strstr(err, "manifest.json") && strstr(err, "not committed"), "%s", err);
    snprintf(out, sizeof out, "%s/x.safetensors", dir);
    cr_expect_eq(eng_export(sdir, out, err, sizeof err), -ENOENT);
    cr_expect(strstr(err, "manifest.json") != NULL, "%s", err);
    cr_expect_eq(eng_ckpt_verify(sdir, 0, err, sizeof err), -ENOENT);

    save_layout(&f, "other", (layout_t){2, 1, 1}, 1, NULL, 0);
    step_dir("other", sdir, sizeof sdir);
    meta_for(&expect, "other", 0, (layout_t){2, 1, 1}, CFG.padded_vocab, 0);
    expect.cfg.embd = 16;
    cr_expect_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                 CH_E_CONFIG);
    cr_expect(strstr(err, "embd") != NULL, "%s", err);
    /* a piece whose geometry does not hold together */
    meta_for(&expect, "other", 0, (layout_t){2, 1, 1}, CFG.padded_vocab, 0);
    pieces[0].b = eng_slice_numel(&pieces[0].slice) + 1;
    cr_expect_eq(eng_ckpt_restore_pieces(sdir, &expect, pieces, n, &t, &step, err, sizeof err),
                 -EINVAL);
    cr_expect(strstr(err, pieces[0].name) != NULL, "%s", err);
    free_pieces(pieces, n);
    free_values(&f);
}

/* out_file holds every tensor of f whole, F32, in Hugging Face shapes. */
static void expect_gpt2_file(const full_t *f, const char *path)
{
    char err[512];
    ch_st_file_t *st = NULL;
    cr_assert_eq(ch_st_open(path, &st, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_st_count(st), f->n);
    cr_expect_str_eq(ch_st_meta(st, "format"), "pt");
    cr_expect_str_eq(ch_st_meta(st, "vocab_size"), "13");
    for (size_t i = 0; i < f->n; i++) {
        const ch_st_tensor_t *t = ch_st_find(st, f->spec[i].name);
        cr_assert_not_null(t, "%s", f->spec[i].name);
        cr_expect_eq(t->ndim, f->spec[i].ndim);
        cr_expect_eq(t->shape[0], f->spec[i].d0, "%s", f->spec[i].name); /* wte: 13 rows */
        cr_assert_eq(t->numel, full_numel(&f->spec[i]));
        float *buf = malloc(t->numel * sizeof *buf);
        cr_assert_eq(ch_st_read_f32(st, t, buf, err, sizeof err), 0, "%s", err);
        cr_expect_eq(memcmp(buf, f->t[i][0], t->numel * sizeof *buf), 0, "%s", f->spec[i].name);
        free(buf);
    }
    ch_st_close(st);
}

Test(ckpt_piece, export_joins_any_layout)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 8);
    char job[32], sdir[1024], out[1024], err[512];
    for (size_t s = 0; s < NLAYOUTS; s++) {
        snprintf(job, sizeof job, "exp%zu", s);
        save_layout(&f, job, LAYOUTS[s], 1, NULL, 0);
        step_dir(job, sdir, sizeof sdir);
        snprintf(out, sizeof out, "%s/%s.safetensors", dir, job);
        cr_assert_eq(eng_export(sdir, out, err, sizeof err), 0, "%s", err);
        expect_gpt2_file(&f, out);
    }
    free_values(&f);
}

/* An HF file of f's parameters: half the names with "transformer.", plus a causal-mask
 * buffer as GPT-2 files carry (ignored). */
static void write_hf(const full_t *f, const char *path)
{
    ch_st_writer_t *w = NULL;
    char name[96], err[512];
    cr_assert_eq(ch_st_writer_create(path, &w), 0);
    for (size_t i = 0; i < f->n; i++) {
        const spec_t *s = &f->spec[i];
        uint64_t shape[2] = {s->d0, s->d1};
        snprintf(name, sizeof name, "%s%s", i % 2 ? "transformer." : "", s->name);
        cr_assert_eq(ch_st_writer_add(w, name, CH_ST_F32, s->ndim, shape, f->t[i][0]), 0);
    }
    static const float mask[4] = {1, 0, 1, 1};
    uint64_t mshape[2] = {2, 2};
    cr_assert_eq(ch_st_writer_add(w, "h.0.attn.bias", CH_ST_F32, 2, mshape, mask), 0);
    cr_assert_eq(ch_st_writer_finish(w, NULL, NULL, err, sizeof err), 0, "%s", err);
}

Test(ckpt_piece, init_from_loads_a_hf_file_into_any_layout)
{
    full_t f;
    gpt2(&f);
    make_values(&f, 9);
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/gpt2.safetensors", dir);
    write_hf(&f, path);
    eng_ckpt_piece_t pieces[MAXT];
    for (size_t li = 0; li < NLAYOUTS; li++) {
        layout_t l = LAYOUTS[li];
        for (uint32_t r = 0; r < l.tp * l.pp * l.dp; r++) {
            size_t n = rank_pieces(&f, l, CFG.padded_vocab, r, 0, pieces);
            cr_assert_eq(eng_ckpt_load_hf(path, pieces, n, err, sizeof err), 0, "%s", err);
            for (size_t i = 0; i < n; i++) { /* parameters from the file, m and v untouched */
                size_t k = 0;
                while (strcmp(f.spec[k].name, pieces[i].name) != 0)
                    k++;
                size_t cnt = pieces[i].b - pieces[i].a;
                float *want = malloc((cnt + 1) * sizeof *want);
                eng_slice_read(&pieces[i].slice, pieces[i].a, pieces[i].b, f.t[k][0], want);
                cr_expect_eq(memcmp(pieces[i].p, want, cnt * sizeof *want), 0, "%s",
                             pieces[i].name);
                for (size_t e = 0; e < cnt; e++)
                    cr_assert(isnan(pieces[i].m[e]) && isnan(pieces[i].v[e]));
                free(want);
            }
            free_pieces(pieces, n);
        }
    }
    /* a model that does not match the file: both shapes named */
    size_t n = rank_pieces(&f, (layout_t){2, 1, 1}, CFG.padded_vocab, 1, 0, pieces);
    for (size_t i = 0; i < n; i++)
        if (strcmp(pieces[i].name, "wpe.weight") == 0) {
            pieces[i].slice.shape[0] = 8; /* seq_len 8: 4 rows fewer in the file */
            pieces[i].slice.hi[0] = 8;
            pieces[i].b = 8 * CFG.embd;
            free(pieces[i].p);
            pieces[i].p = malloc(pieces[i].b * sizeof(float));
        }
    cr_expect_eq(eng_ckpt_load_hf(path, pieces, n, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "wpe.weight") && strstr(err, "[4, 8]") && strstr(err, "[8, 8]"), "%s",
              err);
    snprintf(pieces[0].name, sizeof pieces[0].name, "h.9.ln_1.weight");
    cr_expect_eq(eng_ckpt_load_hf(path, pieces, n, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "h.9.ln_1.weight") && strstr(err, "missing"), "%s", err);
    free_pieces(pieces, n);
    free_values(&f);
}

// ----------------------------------------------------------------------------
// files written by the model-based save (whole tensors, no slice metadata)

Test(ckpt_piece, model_checkpoints_reshard_and_export)
{
    eng_model_t *m = NULL;
    eng_optim_t o;
    cr_assert_eq(eng_model_create(&CFG, 1, 17, &m), 0);
    cr_assert_eq(eng_optim_init(&o, eng_model_nparams(m)), 0);
    for (size_t i = 0; i < o.n; i++) {
        o.m[i] = (float)i * 1e-4f;
        o.v[i] = (float)i * 1e-7f;
    }
    o.t = 42;
    /* Adam state of wte's padding rows stays zero in training */
    const eng_tensor_t *wte = eng_model_find(m, "wte.weight");
    size_t real = (size_t)wte->shape[0] * wte->shape[1];
    memset(o.m + wte->offset + real, 0, (wte->numel - real) * sizeof(float));
    memset(o.v + wte->offset + real, 0, (wte->numel - real) * sizeof(float));

    eng_ckpt_meta_t meta;
    eng_ckpt_file_t file = {0, 0, 0};
    char err[512], sdir[1024], out[1024];
    meta_for(&meta, "old", 5, (layout_t){1, 1, 1}, CFG.padded_vocab, 0);
    eng_ckpt_piece_t *pc = NULL;
    size_t npc = model_pieces(m, &o, &pc);
    cr_assert_eq(eng_ckpt_save_pieces(dir, &meta, pc, npc, o.t, &file.bytes, &file.checksum, err,
                                      sizeof err),
                 0, "%s", err);
    free(pc);
    cr_assert_eq(eng_ckpt_write_manifest(dir, &meta, &file, 1, err, sizeof err), 0, "%s", err);
    step_dir("old", sdir, sizeof sdir);
    ch_st_file_t *st = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/rank-00000.safetensors", sdir);
    cr_assert_eq(ch_st_open(path, &st, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(ch_st_meta(st, "shard"), "full");
    cr_expect_null(ch_st_meta(st, "slice.wte.weight"));
    cr_expect_eq(ch_st_find(st, "optim.m.wte.weight")->shape[0], 13); /* unpadded */
    ch_st_close(st);

    /* the model's tensors are the full tensors */
    full_t f;
    gpt2(&f);
    for (size_t i = 0; i < f.n; i++) {
        const eng_tensor_t *t = eng_model_find(m, f.spec[i].name);
        cr_assert_not_null(t, "%s", f.spec[i].name);
        const float *src[3] = {eng_model_params(m) + t->offset, o.m + t->offset, o.v + t->offset};
        for (int k = 0; k < 3; k++) {
            f.t[i][k] = malloc(full_numel(&f.spec[i]) * sizeof(float));
            memcpy(f.t[i][k], src[k], full_numel(&f.spec[i]) * sizeof(float));
        }
    }
    restore_layout(&f, "old", (layout_t){2, 1, 2}, CFG.padded_vocab);
    restore_layout(&f, "old", (layout_t){2, 2, 1}, CFG.padded_vocab);
    snprintf(out, sizeof out, "%s/old.safetensors", dir);
    cr_assert_eq(eng_export(sdir, out, err, sizeof err), 0, "%s", err);
    expect_gpt2_file(&f, out);

    /* and a sliced step restores into the model */
    save_layout(&f, "sliced", (layout_t){2, 2, 2}, 1, NULL, 0);
    step_dir("sliced", sdir, sizeof sdir);
    eng_model_t *m2 = NULL;
    eng_optim_t o2;
    cr_assert_eq(eng_model_create(&CFG, 1, 99, &m2), 0);
    cr_assert_eq(eng_optim_init(&o2, eng_model_nparams(m2)), 0);
    uint64_t step = 0;
    meta_for(&meta, "sliced", 0, (layout_t){1, 1, 1}, CFG.padded_vocab, 0);
    cr_assert_eq(restore_model(sdir, &meta, m2, &o2, &step, err, sizeof err), 0, "%s", err);
    cr_expect_eq(step, 5);
    cr_expect_eq(o2.t, 42);
    size_t np = eng_model_nparams(m);
    cr_expect_eq(memcmp(eng_model_params(m), eng_model_params(m2), np * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.m, o2.m, np * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.v, o2.v, np * sizeof(float)), 0);

    free_values(&f);
    eng_optim_fini(&o);
    eng_optim_fini(&o2);
    eng_model_destroy(m);
    eng_model_destroy(m2);
}
