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

/* --precision bf16: what the engine allocates: the same fp32 state, fewer activation bytes
 * (those only GEMMs read kept as 2-byte casts), and at dp 1 the packed working copy, 2 bytes
 * a parameter (common/plan.h); the job's own precision otherwise. */
Test(plan, bf16_precision)
{
    char job[PATH_MAX + 32];
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);
    ch_json_t *f = h_ctl_json(NULL, "plan", job, "--json", NULL);
    ch_json_t *b = h_ctl_json(NULL, "plan", job, "--precision", "bf16", "--json", NULL);
    cr_assert_not_null(f);
    cr_assert_not_null(b);
    cr_expect_str_eq(h_json_str(f, "precision"), "fp32");
    cr_expect_str_eq(h_json_str(b, "precision"), "bf16");
    const ch_json_t *mf = ch_json_get(stage(f, 0), "memory"),
                    *mb = ch_json_get(stage(b, 0), "memory");
    cr_expect_eq(h_json_num(mb, "state_bytes"), h_json_num(mf, "state_bytes"));
    cr_expect_eq(h_json_num(mf, "working_bytes"), 0.0);
    cr_expect_eq(h_json_num(mb, "working_bytes"), 2.0 * h_json_num(stage(b, 0), "params_per_rank"));
    cr_expect_gt(h_json_num(mb, "working_bytes"), 0.0);
    cr_expect_lt(h_json_num(mb, "activation_bytes"), h_json_num(mf, "activation_bytes"));
    cr_expect_eq(h_json_num(mb, "total_bytes"),
                 h_json_num(mb, "state_bytes") + h_json_num(mb, "gathered_bytes") +
                     h_json_num(mb, "working_bytes") + h_json_num(mb, "activation_bytes"));
    ch_json_free(f);
    ch_json_free(b);
    h_out_t o;
    cr_assert_eq(h_ctl(NULL, &o, "plan", job, "--precision", "fp16", NULL), 0);
    cr_expect_neq(o.status, 0);
    cr_expect(h_has(o.err, "--precision: expected fp32, tf32 or bf16"), "%s", o.err);
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
     * every tensor: 6 · 1,773,120 + 9,682,944 (wte) + 393,216 (wpe) on stage 0, + 9,682,944
     * + 2 · 384 (ln_f) on stage 1. */
    ch_json_t *p = h_ctl_json(NULL, "plan", job, "--set", "parallel.tp=2", "--set", "parallel.pp=2",
                              "--set", "parallel.dp=2", "--json", NULL);
    cr_assert_not_null(p);
    cr_assert_eq(h_json_num(ch_json_get(p, "model"), "padded_vocab"), 50432.0);
    cr_assert_eq(h_json_num(p, "params_per_block_rank"), 3546240.0);
    cr_assert_eq(h_json_num(stage(p, 0), "params_per_rank"), 41429760.0);
    cr_assert_eq(h_json_num(stage(p, 1), "params_per_rank"), 40644864.0);
    cr_assert_eq(h_json_num(stage(p, 0), "params_owned_per_rank"), 20714880.0);
    cr_assert_eq(h_json_num(stage(p, 1), "params_owned_per_rank"), 20322432.0);
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

// ----------------------------------------------------------------------------
// plan --auto: the planner (common/planner.h) behind the CLI

TestSuite(plan_auto, .fini = h_teardown, .timeout = 120);

/* Megatron-LM's 1T model; its file asks for batch 3072 as dp 1 x 3072 x 1 and a layout
 * that could never run (the planner ignores it). */
static const char gpt_1t[] = "[job]\nname = gpt-1t\n"
                             "[model]\nlayers = 128\nheads = 160\nembd = 25600\n"
                             "vocab = 51200\nseq_len = 2048\n"
                             "[parallel]\ntp = 1\npp = 1\ndp = 1\n"
                             "microbatches = 3072\nmicro_batch_size = 1\n";

static const ch_json_t *layout_at(const ch_json_t *p, size_t i)
{
    const ch_json_t *l = h_json_at(ch_json_get(p, "layouts"), i);
    cr_assert_not_null(l, "no layout %zu", i);
    return l;
}

Test(plan_auto, gpt2_on_one_node_is_pure_dp)
{
    char job[PATH_MAX + 32];
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);

    /* The file's batch: 1 x 1 x 8 sequences. */
    ch_json_t *p = h_ctl_json(NULL, "plan", "--auto", job, "--nodes", "1", "--slots-per-node", "8",
                              "--json", NULL);
    cr_assert_not_null(p);
    cr_assert_eq(h_json_num(p, "global_batch"), 8.0);
    cr_assert_eq(h_json_num(p, "params_total"), 124439808.0);
    cr_assert_eq(h_json_num(ch_json_get(p, "cluster"), "slots"), 8.0);
    cr_assert_eq(h_json_num(ch_json_get(p, "cluster"), "mem_per_slot"), 80.0 * 1073741824);
    cr_assert_str_eq(h_json_str(p, "recompute"), "none");
    const ch_json_t *best = layout_at(p, 0);
    cr_assert_eq(h_json_num(best, "tp"), 1.0);
    cr_assert_eq(h_json_num(best, "pp"), 1.0);
    cr_assert_eq(h_json_num(best, "dp"), 8.0);
    cr_assert_eq(h_json_num(best, "microbatches") * h_json_num(best, "micro_batch_size"), 1.0);
    cr_assert_gt(h_json_num(best, "tokens_per_s"), 0.0);
    size_t n = ch_json_get(p, "layouts")->nkids;
    cr_assert(n >= 2 && n <= 5, "top 5 by default, got %zu", n);
    for (size_t i = 1; i < n; i++)
        cr_assert_geq(h_json_num(layout_at(p, i), "step_s"),
                      h_json_num(layout_at(p, i - 1), "step_s"));
    ch_json_free(p);

    /* The table, and the --set line that launches the best. */
    h_out_t o;
    cr_assert_eq(h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "1", "--slots-per-node", "8",
                       "--top", "3", NULL),
                 0);
    cr_assert_eq(o.status, 0, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "TOKENS/S") && h_has(o.out, "MEM/RANK") &&
                  h_has(o.out, "--set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=8"),
              "%s", o.out);
    h_out_free(&o);
}

Test(plan_auto, megatron_1t_layout_and_refusal)
{
    char job[PATH_MAX + 32];
    write_job(job, sizeof job, "gpt-1t.ini", gpt_1t);

    /* 384 nodes of 8 A100s (the defaults), with recomputation as Megatron ran it. */
    ch_json_t *p =
        h_ctl_json(NULL, "plan", "--auto", job, "--nodes", "384", "--slots-per-node", "8",
                   "--recompute", "full", "--mem-per-slot", "80GiB", "--tp-busbw", "300GB",
                   "--dp-busbw", "25e9", "--flops-per-slot", "312T", "--json", NULL);
    cr_assert_not_null(p);
    cr_assert_eq(h_json_num(p, "global_batch"), 3072.0);
    cr_assert_eq(h_json_num(ch_json_get(p, "cluster"), "dp_busbw"), 25e9);
    cr_assert_eq(h_json_num(ch_json_get(p, "cluster"), "flops_per_slot"), 312e12);
    int found = 0;
    for (size_t i = 0; i < 3; i++) {
        const ch_json_t *l = layout_at(p, i);
        found |= h_json_num(l, "tp") == 8 && h_json_num(l, "pp") == 64 && h_json_num(l, "dp") == 6;
    }
    cr_assert(found, "Megatron's TP=8 PP=64 DP=6 is not in the top 3");
    ch_json_free(p);

    /* As the engine runs today (no recomputation) it fits nowhere: exit 1 with the reason,
     * and the JSON document still lists every refusal. */
    h_out_t o;
    cr_assert_eq(
        h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "384", "--slots-per-node", "8", NULL), 0);
    cr_assert_eq(o.status, 1, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "no layout fits") && h_has(o.err, "activations") &&
                  h_has(o.err, "usable"),
              "%s", o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "384", "--slots-per-node", "8",
                       "--json", NULL),
                 0);
    cr_assert_eq(o.status, 1);
    ch_json_t *j = NULL;
    cr_assert_eq(ch_json_parse(o.out, strlen(o.out), NULL, &j, NULL, 0), 0, "%s", o.out);
    cr_assert_eq(ch_json_get(j, "layouts")->nkids, 0);
    const ch_json_t *r0 = h_json_at(ch_json_get(j, "refused"), 0);
    cr_assert_not_null(r0);
    cr_assert(strstr(h_json_str(r0, "reason"), "does not fit"), "%s", h_json_str(r0, "reason"));
    ch_json_free(j);
    h_out_free(&o);

    /* --verbose names each refused layout. */
    cr_assert_eq(h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "384", "--slots-per-node", "8",
                       "--verbose", NULL),
                 0);
    cr_assert(h_has(o.out, "refused tp 8 pp 64 dp 6: does not fit"), "%s", o.out);
    h_out_free(&o);
}

Test(plan_auto, bad_command_lines)
{
    char job[PATH_MAX + 32];
    h_out_t o;
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);

    const char *bad[][4] = {
        {"--nodes", "4", NULL, NULL},               /* without --slots-per-node */
        {"--nodes", "4", "--slots-per-node", "0"},  /* no slots */
        {"--mem-per-slot", "lots", "--nodes", "1"}, /* not a quantity */
        {"--recompute", "some", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(h_ctl(NULL, &o, "plan", "--auto", job, bad[i][0], bad[i][1], bad[i][2],
                           bad[i][3], NULL),
                     0);
        cr_assert_eq(o.status, 2, "case %zu: exit %d: %s", i, o.status, o.err);
        cr_assert_eq(o.out[0], '\0');
        h_out_free(&o);
    }
    /* A bad model is refused as submit refuses it; so is a diag job. */
    write_job(job, sizeof job, "bad.ini", "[model]\nheads = 12\nembd = 700\n");
    cr_assert_eq(
        h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "1", "--slots-per-node", "8", NULL), 0);
    cr_assert_eq(o.status, 78, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "model.embd"), "%s", o.err);
    h_out_free(&o);
    write_job(job, sizeof job, "diag.ini", "[job]\nkind = diag\n");
    cr_assert_eq(
        h_ctl(NULL, &o, "plan", "--auto", job, "--nodes", "1", "--slots-per-node", "8", NULL), 0);
    cr_assert_eq(o.status, 78, "exit %d: %s", o.status, o.err);
    h_out_free(&o);
    /* No cluster given and no coordinator: unreachable, with a hint. */
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);
    cr_assert_eq(h_ctl(NULL, &o, "--socket", "/nonexistent/ctl.sock", "plan", "--auto", job, NULL),
                 0);
    cr_assert_eq(o.status, 69, "exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "--nodes"), "%s", o.err);
    h_out_free(&o);
}

Test(plan_auto, plans_for_the_coordinators_nodes)
{
    h_cluster_t c;
    char job[PATH_MAX + 32];
    cr_assert_eq(h_cluster_up(&c, 2, 2), 0);
    write_job(job, sizeof job, "gpt2.ini", gpt2_124m);

    /* Batch 8 on 2 nodes x 2 slots: at most 4 ranks, TP groups of at most 2. */
    ch_json_t *p = h_ctl_json(&c, "plan", "--auto", job, "--set", "parallel.micro_batch_size=8",
                              "--json", NULL);
    cr_assert_not_null(p);
    const ch_json_t *cl = ch_json_get(p, "cluster");
    cr_assert_eq(h_json_num(cl, "nodes"), 2.0);
    cr_assert_eq(h_json_num(cl, "slots"), 4.0);
    cr_assert(strstr(h_json_str(cl, "source"), "coordinator"), "%s", h_json_str(cl, "source"));
    size_t n = ch_json_get(p, "layouts")->nkids;
    cr_assert_gt(n, 0);
    for (size_t i = 0; i < n; i++) {
        const ch_json_t *l = layout_at(p, i);
        cr_assert_leq(h_json_num(l, "world_size"), 4.0);
        cr_assert_leq(h_json_num(l, "tp"), 2.0);
    }
    cr_assert_eq(h_json_num(layout_at(p, 0), "world_size"), 4.0, "the whole cluster is used");
    ch_json_free(p);
}
