/* Training jobs through the daemons: a small GPT on the built-in corpus learns, reports
 * progress and checkpoints; `chorusctl export` turns its last checkpoint into a file a
 * new job starts from (train.init_from); a malformed token file is refused with a reason
 * that names it. One node, one rank: these check the engine end to end, not parallelism. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tokens.h"
#include "harness.h"

TestSuite(train, .fini = h_teardown, .timeout = 120);

#define VOCAB 32 /* the job-file default, which the built-in corpus uses */

/* A world-size-1 train job on a tiny model; extra is appended to [train]. */
static void write_job(const char *path, const char *name, const char *extra)
{
    char text[2 * PATH_MAX];
    snprintf(text, sizeof text,
             "[job]\nname = %s\nkind = train\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 64\nseq_len = 32\n"
             "[parallel]\nmicro_batch_size = 4\n"
             "[train]\n%s",
             name, extra);
    cr_assert_eq(h_write_file(path, text), 0);
}

/* A 30-step train job of the same tiny model under the [parallel] lines given, with a
 * checkpoint every 10 steps under ckpt. */
static void write_ckpt_job(const char *path, const char *name, const char *parallel,
                           const char *ckpt)
{
    char text[2 * PATH_MAX];
    snprintf(text, sizeof text,
             "[job]\nname = %s\nkind = train\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 64\nseq_len = 32\n"
             "[parallel]\n%s\n"
             "[train]\nsteps = 30\n[checkpoint]\ndir = %s\nevery = 10\n",
             name, parallel, ckpt);
    cr_assert_eq(h_write_file(path, text), 0);
}

/* Submit, wait, require success, and return the job's status (ch_json_free). */
static ch_json_t *run_ok(const h_cluster_t *c, const char *job, char *id, size_t n)
{
    h_out_t o;
    int st = h_submit_wait(c, &o, job, id, n);
    cr_assert_eq(st, 0, "submit --wait %s: exit %d\n%s%s", job, st, o.out, o.err);
    h_out_free(&o);
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    cr_assert_not_null(js);
    cr_assert_str_eq(h_json_str(js, "state"), "completed", "%s: reason: %s", id,
                     h_json_str(js, "reason"));
    return js;
}

Test(train, builtin_corpus_learns_checkpoints_and_exports)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX], extra[PATH_MAX + 128], ckpt[PATH_MAX], jobdir[PATH_MAX + 64],
        model[PATH_MAX], id[64], id2[64], id3[64];

    cr_assert_eq(h_cluster_up(&c, 1, 1), 0, "local up failed");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", c.dir);

    /* (a) 30 steps with a checkpoint every 10. */
    snprintf(job, sizeof job, "%s/train.ini", c.dir);
    snprintf(extra, sizeof extra, "steps = 30\n[checkpoint]\ndir = %s\nevery = 10\n", ckpt);
    write_job(job, "train-small", extra);
    ch_json_t *js = run_ok(&c, job, id, sizeof id);
    double loss = h_json_num(js, "loss"), tps = h_json_num(js, "tokens_per_s");
    double mfu = h_json_num(js, "mfu");
    fprintf(stderr, "train %s: 30 steps, loss %.4f (ln vocab %.4f), %.0f tokens/s, MFU %.3f\n", id,
            loss, log(VOCAB), tps, mfu);
    cr_assert_eq(h_json_num(js, "step"), 30.0);
    cr_assert_eq(h_json_num(js, "total_steps"), 30.0);
    cr_assert_eq(h_json_num(js, "world_size"), 1.0);
    cr_assert(isfinite(loss) && loss < log(VOCAB) - 0.3,
              "loss %g after 30 steps: no better than a uniform guess (%g)", loss, log(VOCAB));
    cr_assert(tps > 0, "tokens_per_s %g", tps);
    cr_assert(mfu > 0 && mfu <= 1, "mfu %g is not a fraction of peak", mfu);
    cr_assert_eq(h_json_num(js, "last_checkpoint_step"), 30.0, "last checkpoint %g",
                 h_json_num(js, "last_checkpoint_step"));
    ch_json_free(js);

    /* (b) export the newest checkpoint of the job and start a new job from it. */
    snprintf(jobdir, sizeof jobdir, "%s/train-small", ckpt); /* the run folder: job.name */
    snprintf(model, sizeof model, "%s/model.safetensors", c.dir);
    cr_assert_eq(h_ctl(NULL, &o, "export", jobdir, "--out", model, NULL), 0);
    cr_assert_eq(o.status, 0, "export: exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "step-00000030"), "export did not take the newest step: %s", o.out);
    h_out_free(&o);
    cr_assert(h_file_size(model) > 0, "export wrote nothing to %s", model);

    /* Its first loss, against a fresh model's on the same first batch. */
    snprintf(job, sizeof job, "%s/fresh.ini", c.dir);
    write_job(job, "fresh", "steps = 1\n");
    js = run_ok(&c, job, id2, sizeof id2);
    double fresh = h_json_num(js, "loss");
    ch_json_free(js);
    snprintf(job, sizeof job, "%s/init.ini", c.dir);
    snprintf(extra, sizeof extra, "steps = 1\ninit_from = %s\n", model);
    write_job(job, "from-export", extra);
    js = run_ok(&c, job, id3, sizeof id3);
    double init = h_json_num(js, "loss");
    ch_json_free(js);
    fprintf(stderr, "first loss: fresh %.4f, from the export %.4f (end of %s: %.4f)\n", fresh, init,
            id, loss);
    cr_assert(isfinite(fresh) && fabs(fresh - log(VOCAB)) < 0.3,
              "a fresh model's first loss %g is far from ln(vocab) %g", fresh, log(VOCAB));
    cr_assert(isfinite(init) && init < fresh - 0.5 * (fresh - loss),
              "from the export the first loss is %g: the fresh model has %g and the trained "
              "one ended at %g",
              init, fresh, loss);
}

/* dp = 2 on two nodes: each rank trains on its half of the global batch, the job reports
 * the global loss, one manifest commits both ranks' shards, and export takes it. */
Test(train, data_parallel_job_across_two_nodes)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX], ckpt[PATH_MAX], path[PATH_MAX + 128], id[64];
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0, "local up failed");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", c.dir);
    snprintf(job, sizeof job, "%s/dp.ini", c.dir);
    write_ckpt_job(job, "train-dp", "dp = 2\nmicro_batch_size = 2", ckpt);
    ch_json_t *js = run_ok(&c, job, id, sizeof id);
    double loss = h_json_num(js, "loss");
    fprintf(stderr, "train %s: dp=2, 30 steps, loss %.4f, %.0f tokens/s\n", id, loss,
            h_json_num(js, "tokens_per_s"));
    cr_assert_eq(h_json_num(js, "world_size"), 2.0);
    cr_assert_eq(h_json_num(js, "step"), 30.0);
    cr_assert(isfinite(loss) && loss < log(VOCAB) - 0.3,
              "loss %g after 30 steps: no better than a uniform guess (%g)", loss, log(VOCAB));
    cr_assert_eq(h_json_num(js, "last_checkpoint_step"), 30.0);
    ch_json_free(js);
    static const char *const files[] = {"manifest.json", "rank-00000.safetensors",
                                        "rank-00001.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/train-dp/step-00000030/%s", ckpt, files[i]);
        cr_expect(h_file_size(path) > 0, "%s is missing", path);
    }
    snprintf(path, sizeof path, "%s/train-dp", ckpt);
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s/dp.safetensors", c.dir);
    cr_assert_eq(h_ctl(NULL, &o, "export", path, "--out", model, NULL), 0);
    cr_expect_eq(o.status, 0, "export: exit %d: %s", o.status, o.err);
    h_out_free(&o);
    cr_expect(h_file_size(model) > 0, "export wrote nothing to %s", model);
}

/* A pid named in text after `after` (e.g. "in pid "); 0 when absent. */
static long pid_after(const char *text, const char *after)
{
    const char *p = strstr(text, after);
    return p ? strtol(p + strlen(after), NULL, 10) : 0;
}

/* How many times needle occurs in text before end. */
static int count_before(const char *text, const char *end, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p && p < end; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* tp = 2: rank 0 cannot run the sliced model alone, so it evaluates each committed
 * checkpoint in a child process (another pid) and trains on; the last checkpoint's
 * accuracy is reported before the job completes. */
Test(train, sliced_layout_evaluates_checkpoints_in_a_child_process)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX], ckpt[PATH_MAX], id[64];
    cr_assert_eq(h_cluster_up(&c, 1, 2), 0, "local up failed");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", c.dir);
    snprintf(job, sizeof job, "%s/tp.ini", c.dir);
    write_ckpt_job(job, "train-tp", "tp = 2\nmicro_batch_size = 4", ckpt);
    ch_json_t *js = run_ok(&c, job, id, sizeof id);
    ch_json_free(js);

    cr_assert_eq(h_ctl(&c, &o, "logs", id, "--rank", "0", NULL), 0);
    long rank = pid_after(o.out, "rank=0 (pid "), child = pid_after(o.out, "checkpoint in pid ");
    cr_assert(rank > 0 && child > 0, "rank 0 names no evaluation child:\n%s", o.out);
    cr_expect_neq(rank, child, "the evaluation ran in the rank's own process");
    /* every child spawned, the last checkpoint's too, logged its figure before the rank ended */
    const char *done = strstr(o.out, "rank=0: done");
    cr_assert_not_null(done, "rank 0 did not finish:\n%s", o.out);
    int spawned = count_before(o.out, done, "checkpoint in pid ");
    int measured = count_before(o.out, done, "accuracy=");
    cr_expect(spawned > 0 && measured == spawned,
              "%d evaluations started, %d accuracies logged before rank 0 ended:\n%s", spawned,
              measured, o.out);
    cr_expect(!h_has(o.out, "accuracy not evaluated"), "an evaluation failed:\n%s", o.out);
    h_out_free(&o);

    js = h_ctl_json(&c, "status", id, "--rank", "0", "--metrics", NULL);
    cr_assert_not_null(js);
    const ch_json_t *r0 = h_json_at(ch_json_get(js, "ranks"), 0);
    cr_assert_not_null(r0, "status names no rank 0");
    double acc = h_json_num(r0, "accuracy");
    fprintf(stderr, "train %s: tp=2, accuracy %.3f, rank pid %ld, evaluation pid %ld\n", id, acc,
            rank, child);
    cr_expect(acc >= 0 && acc <= 1, "rank 0 reported no accuracy (%g)", acc);
    ch_json_free(js);
}

/* The bytes of a valid llm.c token file of n tokens below VOCAB, at path. */
static void write_tokens(const char *path, size_t n)
{
    uint16_t tok[4096];
    cr_assert(n <= sizeof tok / sizeof tok[0]);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint16_t)(i * 7 % VOCAB);
    cr_assert_eq(ch_tokens_write(path, tok, n), 0);
}

typedef struct bad_data {
    const char *file;   /* under the cluster dir */
    const char *reason; /* the job's reason (or submit's stderr) must say this */
} bad_data_t;

Test(train, malformed_token_file_is_named)
{
    static const bad_data_t bad[] = {{"truncated.bin", "truncated"}, {"badmagic.bin", "vocab"}};
    h_cluster_t c;
    h_out_t o;
    char path[PATH_MAX], job[PATH_MAX], extra[PATH_MAX + 64], id[64];

    cr_assert_eq(h_cluster_up(&c, 1, 1), 0, "local up failed");

    /* A header announcing 4096 tokens followed by only 500 of them. */
    snprintf(path, sizeof path, "%s/%s", c.dir, bad[0].file);
    write_tokens(path, 4096);
    cr_assert_eq(truncate(path, CH_TOKENS_HEADER + 1000), 0, "%s", strerror(errno));
    /* A good file whose magic was overwritten: read as raw tokens, the header's bytes are
     * tokens far above the vocab. */
    snprintf(path, sizeof path, "%s/%s", c.dir, bad[1].file);
    write_tokens(path, 4096);
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0 && pwrite(fd, "GPT2", 4, 0) == 4);
    close(fd);

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", c.dir, bad[i].file);
        snprintf(job, sizeof job, "%s/bad%zu.ini", c.dir, i);
        snprintf(extra, sizeof extra, "steps = 5\ndata = %s\n", path);
        write_job(job, "bad-data", extra);
        int st = h_submit_wait(&c, &o, job, id, sizeof id);
        if (st == 78) { /* refused at submit */
            cr_assert(h_has(o.err, "train.data") && h_has(o.err, path) &&
                          h_has(o.err, bad[i].reason),
                      "%s: submit refused it without naming train.data, the file and '%s': %s",
                      bad[i].file, bad[i].reason, o.err);
            h_out_free(&o);
            continue;
        }
        cr_assert_eq(st, 1, "%s: submit --wait: exit %d\n%s%s", bad[i].file, st, o.out, o.err);
        h_out_free(&o);
        ch_json_t *js = h_ctl_json(&c, "status", id, NULL);
        cr_assert_not_null(js);
        const char *reason = h_json_str(js, "reason");
        fprintf(stderr, "%s: %s\n", bad[i].file, reason);
        cr_assert_str_eq(h_json_str(js, "state"), "failed");
        cr_assert_eq(h_json_num(js, "step"), 0.0, "%s: trained on it", bad[i].file);
        cr_assert(h_has(reason, path) && h_has(reason, bad[i].reason),
                  "%s: the reason does not name the file and say '%s': %s", bad[i].file,
                  bad[i].reason, reason);
        ch_json_free(js);
    }
}
