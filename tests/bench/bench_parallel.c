/* chorus-bench-parallel: the 3D engine's parallel efficiency on this machine (issue 9,
 * Deliver 8), in one run, every layout on the same model, seed and global batch:
 *   1. the measured 1F1B bubble (eng_step_info_t.bubble: time blocked on pipeline
 *      send/recv over the step) per stage, against (p-1)/(m+p-1), for p in {2, 4} and
 *      m in {4, 8, 16} (micro-batch size = global batch / m);
 *   2. TP=2 and PP=2 (m = 8, 16) step-time efficiency against one rank with the same total
 *      threads: one rank with 2 OpenBLAS threads vs 2 ranks of 1 thread each
 *      (efficiency = one rank's step time / the layout's; one rank with 1 thread is shown
 *      beside it);
 *   3. ZeRO-3, reshard per-use and per-step, against replicated data parallelism
 *      (eng_trainer_opts_t.replicate_dp) at dp = 2 and 4;
 *   4. resident state bytes per rank (eng_trainer_memory) against 16Ψ/N and against
 *      common/plan.h's ch_plan_stage (state and gathered) for N = 1, 2, 4 ranks;
 *   5. for every layout run, each rank's step time split as eng_step_info_t.time.
 *
 * Ranks are threads of this process, meeting through an in-process rendezvous table
 * (tests/unit/support.c) over the UCX collectives on loopback, as tests/unit/test_layouts.c
 * runs them. Thread placement: OpenBLAS's thread count is process-wide
 * (kn_blas_set_threads), so a layout of R ranks runs with 1 OpenBLAS thread per rank (each
 * rank's GEMMs run on its own thread) and the one-rank baseline with 2 (OpenBLAS's own
 * pool); threads are not pinned (the kernel places them on the cores) unless --pin puts
 * rank r on CPU r mod ncpu. Layouts of 4 ranks therefore share 2 cores: their waits (and
 * the measured bubble) include time a neighbour spent descheduled.
 *
 * Timing: each layout runs W warm-up steps, then K windows of S steps; a step's time is the
 * slowest rank's; the window with the lowest mean step time is the layout's figure (best
 * of K: the machine is shared), and its steps' bubble and breakdown are reported. The load
 * average (/proc/loadavg) is printed with every layout and at the start and end.
 * Comparisons end with RESULT lines (DESIGN §12) and the goal, met or not, as text:
 * nothing here passes or fails on a timing.
 *
 * Flags (--name=value): layers embd heads seq vocab (model), batch (global sequences a
 * step; divisible by 16), warmup, steps (S), reps (K), only (bubble|eff|zero|mem), pin. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/layout.h"
#include "common/plan.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "support.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/trainer.h"

enum { MAXR = 8, MAXSTEPS = 256, MAXRUNS = 48, COLL_TIMEOUT_MS = 600000 };

typedef struct opts {
    uint32_t layers, embd, heads, seq, vocab, batch;
    uint32_t warmup, steps, reps;
    const char *only;
    int pin;
} opts_t;

/* One layout to run: tp x pp x dp with m micro-batches per DP rank (micro-batch size =
 * batch / (dp * m)), OpenBLAS threads, ZeRO-3 policy or replicated DP; steps 0: create the
 * trainers only (memory). */
typedef struct cfg {
    uint32_t tp, pp, dp, m, threads;
    ch_reshard_t reshard;
    int replicate, create_only;
} cfg_t;

typedef struct rank_run {
    uint32_t rank;
    const cfg_t *c;
    const ch_jobspec_t *spec;
    ts_rdzv_table_t *table;
    int pin;
    eng_step_info_t info[MAXSTEPS];
    uint32_t steps_done;
    eng_trainer_memory_t mem;
    int rc;
    char msg[512];
} rank_run_t;

/* What a layout measured: the best window's mean step time (slowest rank per step), each
 * rank's means over that window, and each rank's memory. */
typedef struct result {
    cfg_t c;
    uint32_t world;
    double step_s, load1;
    eng_step_info_t mean[MAXR]; /* seconds, bubble and time.* averaged over the window */
    eng_trainer_memory_t mem[MAXR];
} result_t;

typedef struct bench {
    opts_t o;
    result_t runs[MAXRUNS];
    int nruns;
} bench_t;

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static void print_load(const char *when)
{
    char line[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(line, sizeof line, f))
            snprintf(line, sizeof line, "?\n");
        fclose(f);
    }
    printf("load (%s, /proc/loadavg, %ld cpus): %s", when, sysconf(_SC_NPROCESSORS_ONLN), line);
}

static const char *cfg_name(const cfg_t *c, char *buf, size_t n)
{
    const char *z = c->dp == 1                          ? ""
                    : c->replicate                      ? "_replicated"
                    : c->reshard == CH_RESHARD_PER_STEP ? "_zero3_per_step"
                                                        : "_zero3_per_use";
    snprintf(buf, n, "tp%u_pp%u_dp%u_m%u%s_blas%u", c->tp, c->pp, c->dp, c->m, z, c->threads);
    return buf;
}

static void spec_for(const opts_t *o, const cfg_t *c, ch_jobspec_t *j)
{
    ch_jobspec_defaults(j);
    snprintf(j->name, sizeof j->name, "bench-parallel");
    j->model.layers = o->layers;
    j->model.heads = o->heads;
    j->model.embd = o->embd;
    j->model.vocab = o->vocab;
    j->model.seq_len = o->seq;
    j->parallel.tp = c->tp;
    j->parallel.pp = c->pp;
    j->parallel.dp = c->dp;
    j->parallel.microbatches = c->m;
    j->parallel.micro_batch_size = o->batch / (c->dp * c->m);
    j->parallel.reshard = c->reshard;
    j->train.steps = c->create_only ? 1 : o->warmup + o->steps * o->reps;
    j->train.lr = 3e-4;
    j->train.warmup = 2;
    j->train.seed = 1337;
    j->checkpoint.dir[0] = 0;
    j->checkpoint.every = 0;
}

// ----------------------------------------------------------------------------
// one layout: its ranks as threads

static void *rank_main(void *arg)
{
    rank_run_t *d = arg;
    wrk_coll_t *coll = NULL;
    eng_groups_t *g = NULL;
    eng_trainer_t *t = NULL;
    ch_layout_t l = ch_jobspec_layout(d->spec);
    uint32_t world = ch_layout_world(l);
    if (d->pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)(d->rank % (uint32_t)sysconf(_SC_NPROCESSORS_ONLN)), &set);
        sched_setaffinity(0, sizeof set, &set); /* this thread */
    }
    if (world > 1) {
        d->rc = ts_coll_create(d->table, d->rank, world, COLL_TIMEOUT_MS, &coll);
        if (d->rc == 0)
            d->rc = eng_groups_create(coll, l, d->rank, &g);
    }
    /* peak_flops given: no SGEMM measured at create (MFU is not reported here) */
    eng_trainer_opts_t opts = {.peak_flops = 1e9, .groups = g, .replicate_dp = d->c->replicate};
    if (d->rc == 0)
        d->rc = eng_trainer_create(d->spec, &opts, &t, d->msg, sizeof d->msg);
    if (d->rc == 0)
        eng_trainer_memory(t, &d->mem);
    while (d->rc == 0 && !d->c->create_only &&
           eng_trainer_next_step(t) < eng_trainer_total_steps(t))
        d->rc = eng_trainer_step(t, &d->info[d->steps_done++]);
    eng_trainer_destroy(t);
    eng_groups_destroy(g);
    wrk_coll_destroy(coll);
    return NULL;
}

static void print_breakdown(const result_t *r)
{
    for (uint32_t i = 0; i < r->world; i++) {
        ch_coord_t k = ch_layout_coord((ch_layout_t){r->c.tp, r->c.pp, r->c.dp}, i);
        const eng_step_info_t *x = &r->mean[i];
        printf("    rank %u (tp %u, stage %u, dp %u): step %.3f s = compute %.3f + tp %.3f + "
               "pp_wait %.3f + zero %.3f + optim %.3f + idle %.3f; bubble %.3f\n",
               i, k.tp, k.pp, k.dp, x->seconds, x->time.compute, x->time.tp, x->time.pp_wait,
               x->time.zero, x->time.optim, x->time.idle, x->bubble);
    }
}

static void add(eng_step_info_t *acc, const eng_step_info_t *x, double w)
{
    acc->seconds += x->seconds * w;
    acc->bubble += x->bubble * w;
    acc->time.compute += x->time.compute * w;
    acc->time.tp += x->time.tp * w;
    acc->time.pp_wait += x->time.pp_wait * w;
    acc->time.zero += x->time.zero * w;
    acc->time.optim += x->time.optim * w;
    acc->time.idle += x->time.idle * w;
}

/* Run c (or find it run already: a layout is measured once per run of the bench). */
static const result_t *measure(bench_t *b, const cfg_t *c)
{
    for (int i = 0; i < b->nruns; i++) {
        const cfg_t *x = &b->runs[i].c;
        if (x->tp == c->tp && x->pp == c->pp && x->dp == c->dp && x->threads == c->threads &&
            x->reshard == c->reshard && x->replicate == c->replicate &&
            (c->create_only || (!x->create_only && x->m == c->m)))
            return &b->runs[i];
    }
    if (b->nruns == MAXRUNS) {
        fprintf(stderr, "bench-parallel: more than %d layouts\n", MAXRUNS);
        exit(1);
    }
    const opts_t *o = &b->o;
    ch_jobspec_t spec;
    spec_for(o, c, &spec);
    result_t *r = &b->runs[b->nruns];
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->world = c->tp * c->pp * c->dp;
    rank_run_t *ranks = calloc(r->world, sizeof *ranks);
    ts_rdzv_table_t table;
    char name[96];
    cfg_name(c, name, sizeof name);
    if (!ranks) {
        fprintf(stderr, "bench-parallel: out of memory\n");
        exit(1);
    }
    ts_rdzv_table_init(&table);
    for (uint32_t i = 0; i < r->world; i++)
        ranks[i] = (rank_run_t){.rank = i, .c = c, .spec = &spec, .table = &table, .pin = o->pin};
    kn_blas_set_threads((int)c->threads);
    uint64_t t0 = ch_now_ns();
    int rc = ts_run_threads(ranks, sizeof *ranks, r->world, rank_main);
    ts_rdzv_table_fini(&table);
    for (uint32_t i = 0; rc == 0 && i < r->world; i++)
        if (ranks[i].rc < 0) {
            fprintf(stderr, "bench-parallel: %s rank %u: %s %s\n", name, i,
                    ch_strerror(ranks[i].rc), ranks[i].msg);
            rc = ranks[i].rc;
        }
    if (rc < 0) {
        fprintf(stderr, "bench-parallel: %s failed (%s)\n", name, ch_strerror(rc));
        exit(1);
    }
    for (uint32_t i = 0; i < r->world; i++)
        r->mem[i] = ranks[i].mem;
    r->load1 = load1();
    if (!c->create_only) {
        /* the window whose mean step (slowest rank per step) is lowest */
        double best = INFINITY;
        uint32_t bw = 0;
        for (uint32_t w = 0; w < o->reps; w++) {
            double sum = 0;
            for (uint32_t s = 0; s < o->steps; s++) {
                uint32_t at = o->warmup + w * o->steps + s;
                double slowest = 0;
                for (uint32_t i = 0; i < r->world; i++)
                    slowest = fmax(slowest, ranks[i].info[at].seconds);
                sum += slowest;
            }
            if (sum / o->steps < best)
                best = sum / o->steps, bw = w;
        }
        r->step_s = best;
        for (uint32_t i = 0; i < r->world; i++)
            for (uint32_t s = 0; s < o->steps; s++)
                add(&r->mean[i], &ranks[i].info[o->warmup + bw * o->steps + s], 1.0 / o->steps);
        printf("  %s: %u rank(s), step %.3f s (best of %u windows of %u steps), run %.1f s, "
               "load1 %.2f\n",
               name, r->world, r->step_s, o->reps, o->steps, (double)(ch_now_ns() - t0) * 1e-9,
               r->load1);
        print_breakdown(r);
    }
    fflush(stdout);
    free(ranks);
    b->nruns++;
    return r;
}

static void result_line(const char *name, double v, const char *unit, const char *ref, double ref_v)
{
    printf("RESULT name=%s value=%.4g unit=%s ref=%s ref_value=%.4g ratio=%.3f\n", name, v, unit,
           ref, ref_v, ref_v != 0 ? v / ref_v : 0.0);
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// 1. the 1F1B bubble

static void bench_bubble(bench_t *b)
{
    static const uint32_t ps[] = {2, 4}, ms[] = {4, 8, 16};
    printf("\n== 1F1B bubble: pipeline send/recv wait over the step, mean over the best window; "
           "1 OpenBLAS thread per rank ==\n");
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < 3; k++) {
            uint32_t p = ps[i], m = ms[k];
            cfg_t c = {.tp = 1, .pp = p, .dp = 1, .m = m, .threads = 1};
            const result_t *r = measure(b, &c);
            double theory = (double)(p - 1) / (m + p - 1), worst = 0, sum = 0;
            printf("    p=%u m=%u: theory %.3f; per stage", p, m, theory);
            for (uint32_t s = 0; s < p; s++) {
                printf(" %.3f", r->mean[s].bubble);
                sum += r->mean[s].bubble;
                worst = fmax(worst, fabs(r->mean[s].bubble - theory));
            }
            double s0 = r->mean[0].bubble;
            printf("; stage 0 %+.1f points, worst stage %.1f points from theory (goal: within 3): "
                   "%s\n",
                   100 * (s0 - theory), 100 * worst, fabs(s0 - theory) <= 0.03 ? "met" : "missed");
            char name[64];
            snprintf(name, sizeof name, "bubble_p%u_m%u_stage0", p, m);
            result_line(name, s0, "fraction", "1f1b_(p-1)/(m+p-1)", theory);
            snprintf(name, sizeof name, "bubble_p%u_m%u_stage_mean", p, m);
            result_line(name, sum / p, "fraction", "1f1b_(p-1)/(m+p-1)", theory);
        }
}

// ----------------------------------------------------------------------------
// 2. TP=2 and PP=2 against one rank with the same threads

static void efficiency(bench_t *b, const char *what, const cfg_t *c)
{
    cfg_t one2 = {.tp = 1, .pp = 1, .dp = 1, .m = c->m, .threads = 2};
    cfg_t one1 = one2;
    one1.threads = 1;
    const result_t *base = measure(b, &one2), *single = measure(b, &one1), *r = measure(b, c);
    double eff = base->step_s / r->step_s;
    printf("    %s m=%u: %.3f s; one rank 2 threads %.3f s, 1 thread %.3f s (2 threads: %.2fx); "
           "efficiency %.3f (goal >= 0.85: %s)\n",
           what, c->m, r->step_s, base->step_s, single->step_s, single->step_s / base->step_s, eff,
           eff >= 0.85 ? "met" : "missed");
    char name[64];
    snprintf(name, sizeof name, "%s_m%u_tokens_per_s", what, c->m);
    /* tokens/s over one rank's: the efficiency */
    double tokens = (double)b->o.batch * b->o.seq;
    result_line(name, tokens / r->step_s, "tokens/s", "one_rank_2_blas_threads",
                tokens / base->step_s);
}

static void bench_eff(bench_t *b)
{
    printf("\n== TP=2 and PP=2 step-time efficiency: 2 ranks x 1 OpenBLAS thread against one "
           "rank x 2 (ratio = one rank's step time / the layout's) ==\n");
    cfg_t tp2 = {.tp = 2, .pp = 1, .dp = 1, .m = 8, .threads = 1};
    efficiency(b, "tp2", &tp2);
    for (uint32_t m = 8; m <= 16; m *= 2) {
        cfg_t pp2 = {.tp = 1, .pp = 2, .dp = 1, .m = m, .threads = 1};
        efficiency(b, "pp2", &pp2);
    }
}

// ----------------------------------------------------------------------------
// 3. ZeRO-3 against replicated data parallelism

static void bench_zero(bench_t *b)
{
    printf("\n== ZeRO-3 against replicated data parallelism: micro-batch size 2, 1 OpenBLAS "
           "thread per rank ==\n");
    for (uint32_t dp = 2; dp <= 4; dp *= 2) {
        uint32_t m = b->o.batch / dp / 2;
        cfg_t rep = {.tp = 1, .pp = 1, .dp = dp, .m = m, .threads = 1, .replicate = 1};
        const result_t *base = measure(b, &rep);
        for (int pol = 0; pol < 2; pol++) {
            cfg_t z = rep;
            z.replicate = 0;
            z.reshard = pol ? CH_RESHARD_PER_STEP : CH_RESHARD_PER_USE;
            const result_t *r = measure(b, &z);
            double ratio = r->step_s / base->step_s;
            const char *pn = pol ? "per_step" : "per_use";
            printf("    dp=%u %s: %.3f s against replicated %.3f s: %.3fx (goal <= 1.15: %s)\n", dp,
                   pn, r->step_s, base->step_s, ratio, ratio <= 1.15 ? "met" : "missed");
            char name[64];
            snprintf(name, sizeof name, "zero3_%s_dp%u_step", pn, dp);
            result_line(name, r->step_s, "s", "replicated_dp", base->step_s);
        }
    }
}

// ----------------------------------------------------------------------------
// 4. resident state per rank

static void bench_mem(bench_t *b)
{
    /* N = 1, 2, 4 ranks; ZeRO-3 layouts in both policies */
    static const cfg_t layouts[] = {
        {1, 1, 1, 1, 1, CH_RESHARD_PER_USE, 0, 1},  {2, 1, 1, 1, 1, CH_RESHARD_PER_USE, 0, 1},
        {1, 2, 1, 1, 1, CH_RESHARD_PER_USE, 0, 1},  {1, 1, 2, 1, 1, CH_RESHARD_PER_USE, 0, 1},
        {1, 1, 2, 1, 1, CH_RESHARD_PER_STEP, 0, 1}, {1, 1, 2, 1, 1, CH_RESHARD_PER_USE, 1, 1},
        {1, 1, 4, 1, 1, CH_RESHARD_PER_USE, 0, 1},  {1, 1, 4, 1, 1, CH_RESHARD_PER_STEP, 0, 1},
        {2, 2, 1, 1, 1, CH_RESHARD_PER_USE, 0, 1},  {1, 4, 1, 1, 1, CH_RESHARD_PER_USE, 0, 1},
        {2, 1, 2, 1, 1, CH_RESHARD_PER_USE, 0, 1},  {1, 2, 2, 1, 1, CH_RESHARD_PER_STEP, 0, 1},
    };
    const double MiB = 1024.0 * 1024.0;
    printf("\n== Resident state per rank (eng_trainer_memory: parameters, gradients, Adam m "
           "and v; gathered: ZeRO-3's gathered blocks and unsharded gradient) against 16Ψ/N and "
           "ch_plan_stage ==\n");
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const cfg_t *c = &layouts[i];
        /* the micro-batching does not change the state: plan with the first section's */
        cfg_t want = *c;
        want.m = c->dp * 2 <= b->o.batch ? b->o.batch / c->dp / 2 : 1;
        const result_t *r = measure(b, &want);
        ch_jobspec_t spec;
        spec_for(&b->o, &want, &spec);
        ch_model_cfg_t mc = ch_plan_model_of(&spec);
        ch_layout_t l = ch_jobspec_layout(&spec);
        double psi = 0, worst_plan = 0, peak = 0, peak_plan = 0;
        char name[96], tag[64];
        cfg_name(c, tag, sizeof tag);
        *strstr(tag, "_m") = 0;
        if (c->replicate)
            strcat(tag, "_replicated");
        else if (c->dp > 1)
            strcat(tag, c->reshard == CH_RESHARD_PER_STEP ? "_per_step" : "_per_use");
        printf("    %s (N=%u):", tag, r->world);
        for (uint32_t k = 0; k < r->world; k++) {
            ch_plan_t p;
            ch_coord_t co = ch_layout_coord(l, k);
            if (ch_plan_stage(&mc, l, spec.parallel.micro_batch_size, spec.parallel.microbatches,
                              c->reshard, co.pp, &p) < 0) {
                fprintf(stderr, "bench-parallel: ch_plan_stage %s failed\n", tag);
                exit(1);
            }
            psi = p.params_total;
            double st = (double)r->mem[k].state_bytes;
            if (st > peak)
                peak = st, peak_plan = p.state_bytes;
            worst_plan = fmax(worst_plan, fabs(st / p.state_bytes - 1));
            printf(" r%u %.2f+%.2f MiB (plan %.2f+%.2f)", k, st / MiB,
                   (double)r->mem[k].gathered_bytes / MiB, p.state_bytes / MiB,
                   p.gathered_bytes / MiB);
        }
        double ideal = 16.0 * psi / r->world;
        double ratio = peak / ideal;
        printf("\n      peak state %.2f MiB, 16Ψ/N %.2f MiB (Ψ %.0f): %.3f (goal within 10%%: %s); "
               "against ch_plan_stage worst rank %.1f%%\n",
               peak / MiB, ideal / MiB, psi, ratio, fabs(ratio - 1) <= 0.10 ? "met" : "missed",
               100 * worst_plan);
        snprintf(name, sizeof name, "state_bytes_%s_peak_rank", tag);
        result_line(name, peak / MiB, "MiB", "16Psi/N", ideal / MiB);
        if (!c->replicate) {
            snprintf(name, sizeof name, "state_bytes_%s_peak_rank_vs_plan", tag);
            result_line(name, peak / MiB, "MiB", "ch_plan_stage", peak_plan / MiB);
        }
    }
}

// ----------------------------------------------------------------------------

static int parse_u32(const char *arg, const char *key, uint32_t *out)
{
    size_t n = strlen(key);
    if (strncmp(arg, key, n) != 0 || arg[n] != '=')
        return 0;
    char *end;
    unsigned long v = strtoul(arg + n + 1, &end, 10);
    if (*end || v == 0 || v > 1u << 20) {
        fprintf(stderr, "bench-parallel: %s: a positive integer\n", arg);
        exit(2);
    }
    *out = (uint32_t)v;
    return 1;
}

static void parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.layers = 8,
                  .embd = 256,
                  .heads = 8,
                  .seq = 128,
                  .vocab = 512,
                  .batch = 16,
                  .warmup = 1,
                  .steps = 2,
                  .reps = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (parse_u32(a, "--layers", &o->layers) || parse_u32(a, "--embd", &o->embd) ||
            parse_u32(a, "--heads", &o->heads) || parse_u32(a, "--seq", &o->seq) ||
            parse_u32(a, "--vocab", &o->vocab) || parse_u32(a, "--batch", &o->batch) ||
            parse_u32(a, "--warmup", &o->warmup) || parse_u32(a, "--steps", &o->steps) ||
            parse_u32(a, "--reps", &o->reps))
            continue;
        if (strncmp(a, "--only=", 7) == 0)
            o->only = a + 7;
        else if (strcmp(a, "--pin") == 0)
            o->pin = 1;
        else {
            fprintf(stderr,
                    "usage: chorus-bench-parallel [--layers=8] [--embd=256] [--heads=8] "
                    "[--seq=128] [--vocab=512] [--batch=16 (global sequences, a multiple of "
                    "16)] [--warmup=1] [--steps=2] [--reps=3] [--only=bubble|eff|zero|mem] "
                    "[--pin]\n");
            exit(2);
        }
    }
    if (o->batch % 16 || o->layers < 4 || o->heads % 2 ||
        o->warmup + o->steps * o->reps > MAXSTEPS) {
        fprintf(stderr,
                "bench-parallel: --batch must be a multiple of 16, --layers >= 4, --heads "
                "even, warmup + steps * reps <= %d\n",
                MAXSTEPS);
        exit(2);
    }
}

static int wanted(const opts_t *o, const char *section)
{
    return !o->only || strcmp(o->only, section) == 0;
}

int main(int argc, char **argv)
{
    bench_t b;
    parse(argc, argv, &b.o);
    const opts_t *o = &b.o;
    uint64_t t0 = ch_now_ns();
    printf("chorus-bench-parallel: GPT %u layers x %u embd, %u heads, seq %u, vocab %u; global "
           "batch %u sequences for every layout; %u warm-up step(s), best of %u windows of %u "
           "steps\n",
           o->layers, o->embd, o->heads, o->seq, o->vocab, o->batch, o->warmup, o->reps, o->steps);
    printf("placement: ranks are threads of this process (UCX loopback collectives); OpenBLAS "
           "threads process-wide: 1 per rank for multi-rank layouts, 2 or 1 for one rank; %s\n",
           o->pin ? "rank r pinned to CPU r mod ncpu" : "threads not pinned");
    print_load("start");
    if (wanted(o, "bubble"))
        bench_bubble(&b);
    if (wanted(o, "eff"))
        bench_eff(&b);
    if (wanted(o, "zero"))
        bench_zero(&b);
    if (wanted(o, "mem"))
        bench_mem(&b);
    printf("\n");
    print_load("end");
    printf("total %.1f s\n", (double)(ch_now_ns() - t0) * 1e-9);
    return 0;
}
