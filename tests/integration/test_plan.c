/* chorusctl plan: the numbers a user checks before launching a job, computed locally
 * (no cluster), and bad job files refused exactly as submit refuses them. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "support.h"

TestSuite(plan, .timeout = 60);

/* GPT-2 124M (Hugging Face's "gpt2"). */
static const char gpt2_124m[] = "[job]\nname = gpt2-124m\n"
                                "[model]\nlayers = 12\nheads = 12\nembd = 768\n"
                                "vocab = 50257\nseq_len = 1024\n"
                                "[parallel]\ntp = 1\npp = 1\ndp = 1\n"
                                "microbatches = 1\nmicro_batch_size = 8\n";

static void write_job(char *path, size_t n, const char *name, const char *text)
{
    char dir[PATH_MAX];
    cr_assert_eq(ts_tmpdir("plan", dir, sizeof dir), 0);
    snprintf(path, n, "%s/%s", dir, name);
    cr_assert_eq(h_write_file(path, text), 0);
}

static const ch_json_t *stage(const ch_json_t *plan, size_t i)
{
    const ch_json_t *s = h_json_at(ch_json_get(plan, "stages"), i);
    cr_assert_not_null(s, "no stage %zu", i);
    return s;
}

static int is_true(const ch_json_t *obj, const char *key)
{
    const ch_json_t *v = ch_json_get(obj, key);
    cr_assert(v && v->type == CH_JSON_BOOL, "%s is not a boolean", key);
    return v->boolean;
}

Test(plan, gpt2_124m_on_one_rank)
{
    char job[PATH_MAX + 32];
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);

    ch_json_t *p = h_ctl_json(NULL, "plan", job, "--json", NULL);
    cr_assert_not_null(p);
    /* 12 blocks of 12C² + 13C, wte V·C, wpe T·C, ln_f 2C; the head is tied to wte. */
    cr_assert_eq(h_json_num(p, "params_total"), 124439808.0);
    cr_assert_eq(h_json_num(ch_json_get(p, "model"), "padded_vocab"), 50304.0);
    cr_assert_eq(h_json_num(p, "params_total_padded"), 124475904.0);
    cr_assert_eq(h_json_num(p, "world_size"), 1.0);
    cr_assert_eq(h_json_num(p, "tokens_per_step"), 8.0 * 1024);
    cr_assert_eq(h_json_num(p, "bubble_fraction"), 0.0);
    cr_assert_eq(ch_json_get(p, "warnings")->nkids, 0);
    /* DESIGN §7: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), V the padded vocab. */
    double B = 8, s = 1024, l = 12, h = 768, V = 50304;
    double flops = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    cr_assert_float_eq(h_json_num(p, "flops_per_step"), flops, flops * 1e-9);

    cr_assert_eq(ch_json_get(p, "stages")->nkids, 1);
    const ch_json_t *s0 = stage(p, 0);
    cr_assert_eq(h_json_num(s0, "first_block"), 0.0);
    cr_assert_eq(h_json_num(s0, "last_block"), 11.0);
    cr_assert(is_true(s0, "embeddings") && is_true(s0, "lm_head"));
    /* One rank holds everything, padded wte rows included, and owns all of it. */
    cr_assert_eq(h_json_num(s0, "params_per_rank"), 124475904.0);
    cr_assert_eq(h_json_num(s0, "params_owned_per_rank"), 124475904.0);
    const ch_json_t *mem = ch_json_get(s0, "memory");
    cr_assert_not_null(mem);
    cr_assert_eq(h_json_num(mem, "state_bytes"), 16.0 * 124475904);
    cr_assert_eq(h_json_num(mem, "total_bytes"), h_json_num(mem, "state_bytes") +
                                                     h_json_num(mem, "gathered_bytes") +
                                                     h_json_num(mem, "activation_bytes"));
    cr_assert_eq(h_json_num(p, "memory_peak_bytes"), h_json_num(mem, "total_bytes"));
    ch_json_free(p);

    h_out_t o;
    cr_assert_eq(h_ctl(NULL, &o, "plan", job, NULL), 0);
    cr_assert_eq(o.status, 0, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "124,439,808") && h_has(o.out, "50304"), "%s", o.out);
    h_out_free(&o);
}

Test(plan, tp2_pp2_dp2_stages_and_bubble)
{
    char job[PATH_MAX + 32];
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);

    for (unsigned m = 1; m <= 8; m *= 2) {
        char mb[64];
        snprintf(mb, sizeof mb, "parallel.microbatches=%u", m);
        ch_json_t *p =
            h_ctl_json(NULL, "plan", job, "--set", "parallel.tp=2", "--set", "parallel.pp=2",
                       "--set", "parallel.dp=2", "--set", mb, "--json", NULL);
        cr_assert_not_null(p);
        cr_assert_eq(h_json_num(p, "world_size"), 8.0);
        cr_assert_eq(h_json_num(p, "params_total"), 124439808.0, "the total is layout-free");
        /* 1F1B: (pp-1)/(m+pp-1) = 1/(m+1). */
        cr_assert_float_eq(h_json_num(p, "bubble_fraction"), 1.0 / (m + 1), 1e-12, "m=%u", m);
        cr_assert_eq(ch_json_get(p, "warnings")->nkids, m < 2 ? 1u : 0u, "m=%u", m);
        cr_assert_eq(h_json_num(p, "sequences_per_step"), 2.0 * m * 8);

        cr_assert_eq(ch_json_get(p, "stages")->nkids, 2);
        const ch_json_t *s0 = stage(p, 0), *s1 = stage(p, 1);
        cr_assert_eq(h_json_num(s0, "first_block"), 0.0);
        cr_assert_eq(h_json_num(s0, "last_block"), 5.0);
        cr_assert_eq(h_json_num(s1, "first_block"), 6.0);
        cr_assert_eq(h_json_num(s1, "last_block"), 11.0);
        cr_assert_eq(h_json_num(s0, "first_rank"), 0.0);
        cr_assert_eq(h_json_num(s0, "last_rank"), 3.0);
        cr_assert_eq(h_json_num(s1, "first_rank"), 4.0);
        cr_assert_eq(h_json_num(s1, "last_rank"), 7.0);
        cr_assert(is_true(s0, "embeddings") && !is_true(s0, "lm_head"));
        cr_assert(!is_true(s1, "embeddings") && is_true(s1, "lm_head"));
        ch_json_free(p);
    }

    /* Per rank at tp 2 (padded vocab 50432 = a multiple of 128·tp): a block's TP slice is
     * 12C²/2 + 7C/2 + 6C = 3,546,240; stage 0 adds wte/2 (50432·768/2 = 19,365,888) and
     * wpe (786,432); stage 1 adds its wte copy and ln_f (1,536). ZeRO-3 over dp 2 halves
     * the blocks only: 6 · 1,773,120 + what lies outside them. */
    ch_json_t *p = h_ctl_json(NULL, "plan", job, "--set", "parallel.tp=2", "--set", "parallel.pp=2",
                              "--set", "parallel.dp=2", "--json", NULL);
    cr_assert_not_null(p);
    cr_assert_eq(h_json_num(ch_json_get(p, "model"), "padded_vocab"), 50432.0);
    cr_assert_eq(h_json_num(p, "params_per_block_rank"), 3546240.0);
    cr_assert_eq(h_json_num(stage(p, 0), "params_per_rank"), 41429760.0);
    cr_assert_eq(h_json_num(stage(p, 1), "params_per_rank"), 40644864.0);
    cr_assert_eq(h_json_num(stage(p, 0), "params_owned_per_rank"), 30791040.0);
    cr_assert_eq(h_json_num(stage(p, 1), "params_owned_per_rank"), 30006144.0);
    double per_use = h_json_num(ch_json_get(stage(p, 0), "memory"), "gathered_bytes");
    ch_json_free(p);

    /* Keeping the stage's gathered blocks for the step costs memory. */
    p = h_ctl_json(NULL, "plan", job, "--set", "parallel.tp=2", "--set", "parallel.pp=2", "--set",
                   "parallel.dp=2", "--set", "parallel.reshard=per-step", "--json", NULL);
    cr_assert_not_null(p);
    cr_assert_gt(h_json_num(ch_json_get(stage(p, 0), "memory"), "gathered_bytes"), per_use);
    ch_json_free(p);

    h_out_t o;
    cr_assert_eq(h_ctl(NULL, &o, "plan", job, "--set", "parallel.pp=2", NULL), 0);
    cr_assert_eq(o.status, 0, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "warning:") && h_has(o.out, "microbatches"), "%s", o.out);
    h_out_free(&o);
}

Test(plan, bad_job_files_are_refused_like_submit)
{
    char job[PATH_MAX + 32], good[PATH_MAX + 32];
    h_out_t o;

    write_job(job, sizeof job, "bad.ini", "[model]\nheads = 12\nembd = 768\n[parallel]\ntp = 5\n");
    cr_assert_eq(h_ctl(NULL, &o, "plan", job, NULL), 0);
    cr_assert_eq(o.status, 78, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, job) && h_has(o.err, "parallel.tp") && h_has(o.err, "not divisible"),
              "%s", o.err);
    cr_assert_eq(o.out[0], '\0', "printed a plan: %s", o.out);
    h_out_free(&o);

    write_job(job, sizeof job, "unknown.ini", "[model]\nbogus_knob = 3\n");
    cr_assert_eq(h_ctl(NULL, &o, "plan", job, NULL), 0);
    cr_assert_eq(o.status, 78, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "bogus_knob") && h_has(o.err, "unknown key"), "%s", o.err);
    h_out_free(&o);

    /* An override that breaks a good file. */
    write_job(good, sizeof good, "gpt2.ini", gpt2_124m);
    cr_assert_eq(h_ctl(NULL, &o, "plan", good, "--set", "parallel.pp=13", NULL), 0);
    cr_assert_eq(o.status, 78, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "parallel.pp"), "%s", o.err);
    h_out_free(&o);

    cr_assert_eq(h_ctl(NULL, &o, "plan", "/nonexistent/job.ini", NULL), 0);
    cr_assert_eq(o.status, 78, "missing job file: exit %d", o.status);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "plan", NULL), 0);
    cr_assert_eq(o.status, 2, "plan without a file: exit %d", o.status);
    h_out_free(&o);
}
