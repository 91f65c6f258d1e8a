/* Bringing data and weights: bad data sources and a Hugging Face file of the wrong shape
 * are refused at submit naming the field and the reason, with nothing queued; a byte-level
 * job on a text file reports its validation loss; the example job files plan. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gpt2.h"
#include "common/plan.h"
#include "common/safetensors.h"
#include "common/tokens.h"
#include "harness.h"
#include "support.h"

TestSuite(data, .fini = h_teardown, .timeout = 180);

#define MODEL "[model]\nlayers = 2\nheads = 2\nembd = 32\nvocab = 256\nseq_len = 32\n"

static void write_tokens(const char *path, size_t n, uint16_t top)
{
    uint16_t *t = malloc(n * sizeof *t);
    cr_assert_not_null(t);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint16_t)(i % 200);
    t[n / 2] = top;
    cr_assert_eq(ch_tokens_write(path, t, n), 0);
    free(t);
}

/* Some text: sentences that vary, so there is something to learn. */
static void write_text(const char *path, size_t sentences, unsigned seed)
{
    static const char *who[] = {"The king", "A fool", "My lord", "The queen", "Our friend"};
    static const char *does[] = {"speaks of", "weeps for", "laughs at", "waits on", "dreams of"};
    static const char *what[] = {"the crown", "his horse", "the storm", "her letters", "the sea"};
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (size_t i = 0; i < sentences; i++) {
        unsigned r = (unsigned)(i * 2654435761u + seed);
        fprintf(f, "%s %s %s.\n", who[r % 5], does[(r >> 8) % 5], what[(r >> 16) % 5]);
    }
    fclose(f);
}

typedef struct bad {
    const char *what, *key, *file, *field, *reason; /* the line: key = [text:]DIR/file */
} bad_t;

Test(data, bad_data_and_weights_are_refused_at_submit_and_nothing_is_queued)
{
    h_cluster_t c;
    h_out_t o;
    char p[PATH_MAX], job[PATH_MAX + 32], line[3 * PATH_MAX];
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    snprintf(p, sizeof p, "%s/s_000.bin", c.dir);
    write_tokens(p, 500, 7);
    snprintf(p, sizeof p, "%s/s_001.bin", c.dir);
    cr_assert_eq(h_write_file(p, ""), 0); /* an empty shard */
    snprintf(p, sizeof p, "%s/empty.txt", c.dir);
    cr_assert_eq(h_write_file(p, ""), 0);
    snprintf(p, sizeof p, "%s/big.bin", c.dir);
    write_tokens(p, 500, 256); /* one token >= vocab 256 */
    ch_model_cfg_t narrow = {.layers = 2, .heads = 2, .embd = 16, .vocab = 256, .seq_len = 32};
    snprintf(p, sizeof p, "%s/hf.safetensors", c.dir);
    cr_assert_eq(ts_write_gpt2(p, &narrow, 1024, CH_ST_F16, 1), 0);

    const bad_t bad[] = {
        {"an empty shard", "data = ", "s_*.bin", "train.data", "s_001.bin"},
        {"a missing file", "data = ", "missing.bin", "train.data", "No such file"},
        {"a glob matching nothing", "data = ", "fineweb_*.bin", "train.data", "matches no file"},
        {"an empty text file", "data = text:", "empty.txt", "train.data", "empty (0 bytes)"},
        {"a token >= vocab", "data = ", "big.bin", "train.data", "not below the model vocab 256"},
        {"an empty validation file", "val_data = text:", "empty.txt", "train.val_data", "empty"},
        {"an HF file of another width", "init_from = ", "hf.safetensors", "train.init_from",
         "transformer.wte.weight has shape [256, 16]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bad_t *b = &bad[i];
        char text[4 * PATH_MAX];
        snprintf(line, sizeof line, "%s%s/%s", b->key, c.dir, b->file);
        snprintf(text, sizeof text, MODEL "[train]\nsteps = 5\n%s\n", line);
        snprintf(job, sizeof job, "%s/bad%zu.ini", c.dir, i);
        cr_assert_eq(h_write_file(job, text), 0);
        for (int plan = 0; plan < 2; plan++) { /* submit, and plan the same way */
            cr_assert_eq(h_ctl(&c, &o, plan ? "plan" : "submit", job, NULL), 0);
            cr_expect_eq(o.status, 78, "%s: exit %d (%s)", b->what, o.status, o.err);
            cr_expect(h_has(o.err, b->field) && h_has(o.err, b->reason),
                      "%s: stderr does not name '%s' and '%s': %s", b->what, b->field, b->reason,
                      o.err);
            if (!plan)
                cr_expect_eq(o.out[0], '\0', "%s: printed a job id: %s", b->what, o.out);
            h_out_free(&o);
        }
    }
    /* the HF message names both shapes */
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_expect(h_has(o.err, "needs [256, 32]"), "%s", o.err);
    h_out_free(&o);
    ch_json_t *jobs = h_ctl_json(&c, "jobs", NULL);
    cr_assert_not_null(jobs);
    cr_expect_null(h_json_at(jobs, 0), "a refused job was queued");
    ch_json_free(jobs);
}

Test(data, a_byte_level_job_reports_its_validation_loss)
{
    h_cluster_t c;
    h_out_t o;
    char train[PATH_MAX], val[PATH_MAX], job[PATH_MAX + 32], text[4 * PATH_MAX], id[64];
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    snprintf(train, sizeof train, "%s/train.txt", c.dir);
    snprintf(val, sizeof val, "%s/val.txt", c.dir);
    write_text(train, 2000, 1);
    write_text(val, 200, 99);
    snprintf(text, sizeof text,
             "[job]\nname = bytes\n" MODEL "[parallel]\nmicro_batch_size = 4\n"
             "[train]\nsteps = 20\nlr = 3e-3\nwarmup = 2\ndata = text:%s\nval_data = text:%s\n"
             "eval_every = 10\neval_tokens = 1024\n",
             train, val);
    snprintf(job, sizeof job, "%s/bytes.ini", c.dir);
    cr_assert_eq(h_write_file(job, text), 0);
    cr_assert_eq(h_submit_wait(&c, &o, job, id, sizeof id), 0, "%s", o.err);
    h_out_free(&o);
    ch_json_t *st = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(st);
    double v = h_json_num(st, "val_loss"), loss = h_json_num(st, "loss");
    cr_expect(v > 0.5 && v < 5.5, "val_loss %g: below ln 256 = 5.55 after 20 steps", v);
    cr_expect(loss > 0 && loss < 5.5, "loss %g", loss);
    cr_expect_eq(h_json_num(st, "val_step"), 20);
    ch_json_free(st);
    cr_assert_eq(h_ctl(&c, &o, "status", id, NULL), 0);
    cr_expect(h_has(o.out, "val loss"), "%s", o.out);
    h_out_free(&o);
}

/* A GPT-2 safetensors header with every tensor of c in F16 (wpe: `positions` rows) and a
 * sparse data section: the shape check reads the header only, so a 124M-shaped file costs
 * no disk. */
static void write_sparse_gpt2(const char *path, const ch_model_cfg_t *c, uint64_t positions)
{
    char *hdr = malloc(1 << 20);
    cr_assert_not_null(hdr);
    size_t at = (size_t)sprintf(hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (size_t i = 0; i < ch_gpt2_count(c); i++) {
        ch_gpt2_tensor_t t;
        ch_gpt2_tensor(c, i, &t);
        if (i == 1)
            t.shape[0] = positions;
        uint64_t bytes = 2 * t.shape[0] * (t.ndim > 1 ? t.shape[1] : 1);
        if (t.ndim > 1)
            at += (size_t)sprintf(hdr + at,
                                  ",\"%s\":{\"dtype\":\"F16\",\"shape\":[%lu,%lu],"
                                  "\"data_offsets\":[%lu,%lu]}",
                                  t.name, (unsigned long)t.shape[0], (unsigned long)t.shape[1],
                                  (unsigned long)off, (unsigned long)(off + bytes));
        else
            at += (size_t)sprintf(hdr + at,
                                  ",\"%s\":{\"dtype\":\"F16\",\"shape\":[%lu],"
                                  "\"data_offsets\":[%lu,%lu]}",
                                  t.name, (unsigned long)t.shape[0], (unsigned long)off,
                                  (unsigned long)(off + bytes));
        off += bytes;
    }
    hdr[at++] = '}';
    while (at % 8)
        hdr[at++] = ' ';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    uint64_t n = at;
    cr_assert_eq(write(fd, &n, 8), 8);
    cr_assert_eq(write(fd, hdr, at), (ssize_t)at);
    cr_assert_eq(ftruncate(fd, (off_t)(8 + at + off)), 0);
    close(fd);
    free(hdr);
}

Test(data, the_example_jobs_plan)
{
    h_out_t o;
    char tmp[PATH_MAX], ini[PATH_MAX], shard[PATH_MAX + 32], hf[PATH_MAX + 32];
    char set_data[2 * PATH_MAX], set_val[2 * PATH_MAX], set_init[2 * PATH_MAX];
    cr_assert_eq(ts_tmpdir("data-examples", tmp, sizeof tmp), 0);
    const char *src = getenv("CHORUS_SRC_DIR");
    cr_assert(src && src[0]);

    /* gpt2-124m.ini: llm.c-style shards and the published GPT-2's shapes (fp16, 1,024
     * positions) */
    for (int k = 0; k < 2; k++) {
        snprintf(shard, sizeof shard, "%s/fineweb_train_%06d.bin", tmp, k + 1);
        write_tokens(shard, 5000, 50256);
    }
    snprintf(shard, sizeof shard, "%s/fineweb_val_000000.bin", tmp);
    write_tokens(shard, 5000, 50256);
    ch_model_cfg_t gpt2 = {.layers = 12, .heads = 12, .embd = 768, .vocab = 50257, .seq_len = 1024};
    snprintf(hf, sizeof hf, "%s/model.safetensors", tmp);
    write_sparse_gpt2(hf, &gpt2, 1024);
    snprintf(ini, sizeof ini, "%s/deploy/jobs/gpt2-124m.ini", src);
    snprintf(set_data, sizeof set_data, "train.data=%s/fineweb_train_*.bin", tmp);
    snprintf(set_val, sizeof set_val, "train.val_data=%s/fineweb_val_*.bin", tmp);
    snprintf(set_init, sizeof set_init, "train.init_from=%s", hf);
    cr_assert_eq(
        h_ctl(NULL, &o, "plan", ini, "--set", set_data, "--set", set_val, "--set", set_init, NULL),
        0);
    cr_expect_eq(o.status, 0, "gpt2-124m.ini: exit %d: %s", o.status, o.err);
    h_out_free(&o);
    /* the same file at seq_len 2048 does not fit the published wpe */
    cr_assert_eq(h_ctl(NULL, &o, "plan", ini, "--set", set_data, "--set", set_val, "--set",
                       set_init, "--set", "model.seq_len=2048", NULL),
                 0);
    cr_expect_eq(o.status, 78);
    cr_expect(h_has(o.err, "wpe.weight has shape [1024, 768]"), "%s", o.err);
    h_out_free(&o);

    /* shakespeare-char.ini on a text file */
    snprintf(shard, sizeof shard, "%s/input.txt", tmp);
    write_text(shard, 500, 3);
    snprintf(ini, sizeof ini, "%s/deploy/jobs/shakespeare-char.ini", src);
    snprintf(set_data, sizeof set_data, "train.data=text:%s", shard);
    snprintf(set_val, sizeof set_val, "train.val_data=text:%s", shard);
    cr_assert_eq(h_ctl(NULL, &o, "plan", ini, "--set", set_data, "--set", set_val, NULL), 0);
    cr_expect_eq(o.status, 0, "shakespeare-char.ini: exit %d: %s", o.status, o.err);
    h_out_free(&o);
    ts_rmrf(tmp);
}
