/* chorus-bench-parallel: the 3D engine's parallel efficiency on this machine (issue 9,
 * Deliver 8), in one run, every layout on the same model, seed and global batch:
 *   1. TP=2 and PP=2 (m = 8, 16) step-time efficiency against one rank with the same total
 *      threads: 2 ranks of 1 OpenBLAS thread each against one rank with 2 (efficiency = one
 *      rank's step time over the layout's, as tokens/s over tokens/s); one rank with 1
 *      thread is measured beside it, and the ratio is also given against the faster of the
 *      two one-rank runs (the reference at its best);
 *   2. the measured bubble (eng_step_info_t.bubble: time blocked on pipeline send/recv
 *      over the step) per stage, for 1F1B against (p-1)/(m+p-1) and ZB-H1 against
 *      (p-1)/(3m+p-1), for p in {2, 4} and m in {4, 8, 16} (micro-batch size = global
 *      batch / m), interleaved (v = 2) against (p-1)/(v m+p-1), and ZB-H1's stage-0 bubble over
 *      1F1B's (measured in turns; also from the formulas at each one's measured passes, with
 *      ZB-H1's weight pass over its input pass, W/B). Stage 0's figure is
 * the one to compare: it idles only inside the schedule (waiting for gradients in the steady state
 * and cool-down), while later stages idle partly after their last backward, in the step's closing
 * all-reduces (the tied-wte sum with stage 0, the loss over the column), which the trainer counts
 * as time.zero, not pp_wait; the per-stage line also shows (pp_wait + zero) / step;
 *   3. ZeRO-3, reshard per-use and per-step, against replicated data parallelism
 *      (eng_trainer_opts_t.replicate_dp) at dp = 2 and 4, micro-batch size 2;
 *   4. resident state bytes per rank (eng_trainer_memory) against 16Ψ/N and against
 *      common/plan.h's ch_plan_stage (state and gathered) for N = 1, 2, 4 ranks, and each
 *      rank's measured high-water mark of backend memory over a step (eng_trainer_mem,
 *      the allocator's ledger) against the plan's per-rank total;
 *   5. for every layout run, each rank's step time split as eng_step_info_t.time;
 *   6. activation recomputation (--only=recompute): one rank of a GPT-2-shaped model (embd 768,
 *      12 heads, --rc-seq, --rc-layers blocks, 2 sequences a step of one each) under
 *      parallel.recompute = none, selective and full, in turns: step time against none, and
 *      activation bytes per block measured (the allocator's activation high-water mark less
 *      the embedding's and head's buffers, over the blocks) against the plan's.
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
 * Timing: the layouts compared with one another are measured in turns. Each holds its
 * trainers from the start (its ranks' threads block between rounds), and round k of every
 * layout of the group runs before round k + 1 of any: W warm-up steps in round 0, then S
 * timed steps a round (a step's time: the slowest rank's). A layout's figure is its best
 * round's mean (best of K, --reps: the machine is shared, and turns make both sides of a
 * ratio see the same load); that round's bubble and breakdown are reported with the load
 * average (/proc/loadavg) after it, and the load at the start and end of the bench.
 * Comparisons end with RESULT lines (DESIGN §12) and the goal, met or not, as text:
 * nothing here passes or fails on a timing.
 *
 * Flags (--name=value): layers embd heads seq vocab (model), batch (global sequences a
 * step; a multiple of 16), warmup (W), steps (S), reps (K), only
 * (eff|bubble|zero|mem|recompute), pin, rc-layers and rc-seq (section 6's blocks, 2, and
 * sequence length, 1024), pp and m (section 2 at that p / m only), zb-pair (section 2 runs
 * 1f1b and zb-h1 alone), gpt2-shape (embd 384, 6 heads, seq 512: GPT-2's head size and
 * attention-to-linear work, T/(6C) = 0.22, with GEMMs of 4x the default's rows and 1.5x its
 * width; flags after it override), paced (GFLOP/s) and paced-bw (GB/s, default GFLOP/s / 8):
 * every rank on a paced device of that speed (paced.h), so that each pipeline stage has a
 * device of its own whatever the cores (for section 2; the host's share of each device's
 * time and the time the host overran are printed beside the bubble). Section 2 also prints
 * each stage's pass times per micro-batch (eng_step_info_t.pass) and the formulas at those
 * times (bubble_at_times), beside the ideal ones. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
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
#include "paced.h"
#include "support.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/trainer.h"

enum { MAXR = 8, MAXSTEPS = 64, MAXREPS = 16, MAXRUNS = 48, COLL_TIMEOUT_MS = 600000 };

typedef struct opts {
    uint32_t layers, embd, heads, seq, vocab, batch;
    uint32_t warmup, steps, reps;
    const char *only;
    int pin;
    int balanced;               /* --balanced: parallel.stage_split = balanced */
    uint32_t rc_layers, rc_seq; /* section 6's blocks and sequence length */
    uint32_t only_p, only_m;    /* --pp, --m: section 2 at this p / m only (0: all) */
    int zb_pair;                /* --zb-pair: section 2 without interleaved */
    double paced_gflops;        /* --paced: every rank on a paced device (paced.h), GFLOP/s */
    double paced_gbps;          /* --paced-bw: its bytes, GB/s (default: GFLOP/s / 8) */
} opts_t;

/* One layout to run: tp x pp x dp with m micro-batches per DP rank (micro-batch size =
 * batch / (dp * m)), OpenBLAS threads, ZeRO-3 policy or replicated DP; create_only: the
 * trainers are created (memory) and no step runs. */
typedef struct cfg {
    uint32_t tp, pp, dp, m, threads;
    ch_reshard_t reshard;
    int replicate, create_only;
    ch_schedule_t sched; /* parallel.schedule (1f1b unless set) */
    uint32_t v;          /* interleaved: parallel.virtual_stages */
    ch_recompute_t rc;   /* parallel.recompute */
    int gpt2;            /* section 6's model: GPT-2's width at --seq, --rc-layers, 2 sequences */
} cfg_t;

/* What a layout measured: its best round's mean step time (slowest rank per step), each
 * rank's means over that round's timed steps, and each rank's memory. */
typedef struct result {
    cfg_t c;
    uint32_t world, rounds;
    double step_s, load1;
    double round_s[MAXREPS];
    eng_step_info_t mean[MAXR]; /* seconds, bubble and time.* averaged over the steps */
    eng_trainer_memory_t mem[MAXR];
    eng_mem_stats_t measured[MAXR]; /* the allocator's ledger after the last round */
    int stepped;                    /* measured holds a step's high-water mark */
    paced_stats_t paced[MAXR];      /* --paced: each rank's device over the best round */
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
    char line[128] = "?\n";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(line, sizeof line, f))
            snprintf(line, sizeof line, "?\n");
        fclose(f);
    }
    printf("load (%s, /proc/loadavg, %ld cpus): %s", when, sysconf(_SC_NPROCESSORS_ONLN), line);
}

static const char *policy_name(const cfg_t *c)
{
    return c->dp == 1                          ? ""
           : c->replicate                      ? "_replicated"
           : c->reshard == CH_RESHARD_PER_STEP ? "_zero3_per_step"
                                               : "_zero3_per_use";
}

static const char *cfg_name(const cfg_t *c, char *buf, size_t n)
{
    snprintf(buf, n, "tp%u_pp%u_dp%u_m%u%s_blas%u%s%s%s", c->tp, c->pp, c->dp, c->m, policy_name(c),
             c->threads,
             c->sched == CH_SCHEDULE_ZBH1          ? "_zb-h1"
             : c->sched == CH_SCHEDULE_INTERLEAVED ? "_interleaved_v2"
                                                   : "",
             c->gpt2 ? "_gpt2_recompute_" : "", c->gpt2 ? ch_recompute_name(c->rc) : "");
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
    j->parallel.stage_split = o->balanced ? CH_SPLIT_BALANCED : CH_SPLIT_EVEN;
    j->parallel.tp = c->tp;
    j->parallel.pp = c->pp;
    j->parallel.dp = c->dp;
    j->parallel.microbatches = c->m;
    j->parallel.micro_batch_size = o->batch / (c->dp * c->m);
    j->parallel.reshard = c->reshard;
    j->parallel.schedule = c->sched;
    j->parallel.virtual_stages = c->v ? c->v : 1;
    j->parallel.recompute = c->rc;
    if (c->gpt2) { /* GPT-2 124M's width, fewer blocks, one sequence a micro-batch */
        j->model.layers = o->rc_layers;
        j->model.embd = 768;
        j->model.heads = 12;
        j->model.seq_len = o->rc_seq;
        j->parallel.microbatches = c->m;
        j->parallel.micro_batch_size = 1;
    }
    j->train.steps = o->warmup + o->steps * o->reps;
    j->train.lr = 3e-4;
    j->train.warmup = 0;
    j->train.seed = 1337;
    j->checkpoint.dir[0] = 0;
    j->checkpoint.every = 0;
}

// ----------------------------------------------------------------------------
// a live layout: its ranks as threads holding their trainers, stepping a round when told

typedef struct live live_t;

typedef struct rank_run {
    uint32_t rank;
    live_t *lv;
    eng_step_info_t info[MAXSTEPS];
    uint32_t steps_done;
    eng_trainer_memory_t mem;
    eng_mem_stats_t measured; /* after its last step */
    paced_stats_t paced;      /* --paced: its device over its last round's timed steps */
    int rc;
    char msg[512];
} rank_run_t;

/* Rounds are posted by the bench's thread: the ranks run round k once posted > k (round 0
 * with the warm-up steps before its timed ones), and count themselves in `done`. */
struct live {
    result_t *r;
    const opts_t *o;
    ch_jobspec_t spec;
    ts_rdzv_table_t table;
    rank_run_t *ranks;
    pthread_t *th;
    uint32_t started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t posted, ready, done;
    int quit;
};

static void live_count(live_t *lv, uint32_t *counter)
{
    pthread_mutex_lock(&lv->mu);
    (*counter)++;
    pthread_cond_broadcast(&lv->cv);
    pthread_mutex_unlock(&lv->mu);
}

static void rank_steps(rank_run_t *d, eng_trainer_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n && d->rc == 0; i++)
        d->rc = eng_trainer_step(t, &d->info[d->steps_done++]);
    eng_trainer_mem(t, &d->measured);
}

static void *rank_main(void *arg)
{
    rank_run_t *d = arg;
    live_t *lv = d->lv;
    const cfg_t *c = &lv->r->c;
    wrk_coll_t *coll = NULL;
    eng_groups_t *g = NULL;
    eng_trainer_t *t = NULL;
    ch_layout_t l = ch_jobspec_layout(&lv->spec);
    if (lv->o->pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)(d->rank % (uint32_t)sysconf(_SC_NPROCESSORS_ONLN)), &set);
        sched_setaffinity(0, sizeof set, &set); /* this thread */
    }
    if (ch_layout_world(l) > 1) {
        d->rc = ts_coll_create(&lv->table, d->rank, ch_layout_world(l), COLL_TIMEOUT_MS, &coll);
        if (d->rc == 0)
            d->rc = eng_groups_create(coll, l, d->rank, &g);
    }
    /* peak_flops given: no SGEMM measured at create (MFU is not reported here) */
    eng_trainer_opts_t opts = {.peak_flops = 1e9, .groups = g, .replicate_dp = c->replicate};
    eng_backend_t *pb = NULL;
    if (d->rc == 0 && lv->o->paced_gflops > 0) {
        d->rc = paced_create(eng_backend_cpu(), lv->o->paced_gflops * 1e9, lv->o->paced_gbps * 1e9,
                             &pb);
        opts.backend = pb;
    }
    if (d->rc == 0)
        d->rc = eng_trainer_create(&lv->spec, &opts, &t, d->msg, sizeof d->msg);
    if (d->rc == 0)
        eng_trainer_memory(t, &d->mem);
    live_count(lv, &lv->ready);
    for (uint32_t k = 0;; k++) {
        pthread_mutex_lock(&lv->mu);
        while (!lv->quit && lv->posted <= k)
            pthread_cond_wait(&lv->cv, &lv->mu);
        int quit = lv->quit;
        pthread_mutex_unlock(&lv->mu);
        if (quit)
            break;
        rank_steps(d, t, k == 0 ? lv->o->warmup : 0);
        if (pb)
            paced_reset(pb);
        rank_steps(d, t, lv->o->steps);
        if (pb)
            paced_stats(pb, &d->paced);
        live_count(lv, &lv->done);
    }
    eng_trainer_destroy(t);
    paced_destroy(pb);
    eng_groups_destroy(g);
    wrk_coll_destroy(coll);
    return NULL;
}

static void die(const char *what, const live_t *lv, int rc)
{
    char name[96];
    fprintf(stderr, "bench-parallel: %s: %s", cfg_name(&lv->r->c, name, sizeof name), what);
    for (uint32_t i = 0; lv->ranks && i < lv->r->world; i++)
        if (lv->ranks[i].rc < 0)
            fprintf(stderr, "; rank %u: %s %s", i, ch_strerror(lv->ranks[i].rc), lv->ranks[i].msg);
    fprintf(stderr, " (%s)\n", ch_strerror(rc));
    exit(1);
}

/* Wait until *counter reaches the world; exit if a rank failed. */
static void live_wait(live_t *lv, const uint32_t *counter, const char *what)
{
    pthread_mutex_lock(&lv->mu);
    while (*counter < lv->r->world)
        pthread_cond_wait(&lv->cv, &lv->mu);
    pthread_mutex_unlock(&lv->mu);
    for (uint32_t i = 0; i < lv->r->world; i++)
        if (lv->ranks[i].rc < 0)
            die(what, lv, lv->ranks[i].rc);
}

/* Start r's ranks and wait until each holds its trainer; r's memory filled. */
static void live_start(live_t *lv, result_t *r, const opts_t *o)
{
    memset(lv, 0, sizeof *lv);
    lv->r = r;
    lv->o = o;
    spec_for(o, &r->c, &lv->spec);
    ts_rdzv_table_init(&lv->table);
    pthread_mutex_init(&lv->mu, NULL);
    pthread_cond_init(&lv->cv, NULL);
    lv->ranks = calloc(r->world, sizeof *lv->ranks);
    lv->th = calloc(r->world, sizeof *lv->th);
    if (!lv->ranks || !lv->th)
        die("out of memory", lv, -ENOMEM);
    kn_blas_set_threads((int)r->c.threads);
    for (uint32_t i = 0; i < r->world; i++) {
        lv->ranks[i] = (rank_run_t){.rank = i, .lv = lv};
        int e = pthread_create(&lv->th[i], NULL, rank_main, &lv->ranks[i]);
        if (e != 0)
            die("pthread_create", lv, -e);
        lv->started++;
    }
    live_wait(lv, &lv->ready, "create");
    for (uint32_t i = 0; i < r->world; i++)
        r->mem[i] = lv->ranks[i].mem;
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
    acc->pass.fwd += x->pass.fwd * w;
    acc->pass.bwd += x->pass.bwd * w;
    acc->pass.weight += x->pass.weight * w;
}

/* Round k (0-based) of lv: its ranks step, then its result takes the round if best. */
static void live_round(live_t *lv, uint32_t k)
{
    result_t *r = lv->r;
    const opts_t *o = lv->o;
    kn_blas_set_threads((int)r->c.threads);
    pthread_mutex_lock(&lv->mu);
    lv->done = 0;
    lv->posted = k + 1;
    pthread_cond_broadcast(&lv->cv);
    pthread_mutex_unlock(&lv->mu);
    live_wait(lv, &lv->done, "step");
    for (uint32_t i = 0; i < r->world; i++)
        r->measured[i] = lv->ranks[i].measured;
    r->stepped = 1;
    uint32_t first = o->warmup + k * o->steps;
    double mean = 0;
    for (uint32_t s = 0; s < o->steps; s++) {
        double slowest = 0;
        for (uint32_t i = 0; i < r->world; i++)
            slowest = fmax(slowest, lv->ranks[i].info[first + s].seconds);
        mean += slowest / o->steps;
    }
    r->round_s[r->rounds++] = mean;
    if (r->rounds > 1 && mean >= r->step_s)
        return;
    r->step_s = mean;
    r->load1 = load1();
    for (uint32_t i = 0; i < r->world; i++) {
        r->paced[i] = lv->ranks[i].paced;
        memset(&r->mean[i], 0, sizeof r->mean[i]);
        for (uint32_t s = 0; s < o->steps; s++)
            add(&r->mean[i], &lv->ranks[i].info[first + s], 1.0 / o->steps);
    }
}

static void live_stop(live_t *lv)
{
    pthread_mutex_lock(&lv->mu);
    lv->quit = 1;
    pthread_cond_broadcast(&lv->cv);
    pthread_mutex_unlock(&lv->mu);
    for (uint32_t i = 0; i < lv->started; i++)
        pthread_join(lv->th[i], NULL);
    ts_rdzv_table_fini(&lv->table);
    pthread_cond_destroy(&lv->cv);
    pthread_mutex_destroy(&lv->mu);
    free(lv->ranks);
    free(lv->th);
}

static int same_cfg(const cfg_t *x, const cfg_t *c)
{
    return x->tp == c->tp && x->pp == c->pp && x->dp == c->dp && x->threads == c->threads &&
           x->reshard == c->reshard && x->replicate == c->replicate && x->sched == c->sched &&
           x->v == c->v && x->rc == c->rc && x->gpt2 == c->gpt2 &&
           (c->create_only || (!x->create_only && x->m == c->m));
}

/* The result of c (a timed run for a create_only c's memory will do); NULL if not run. */
static const result_t *find(const bench_t *b, const cfg_t *c)
{
    for (int i = 0; i < b->nruns; i++)
        if (same_cfg(&b->runs[i].c, c))
            return &b->runs[i];
    return NULL;
}

static void print_result(const result_t *r)
{
    char name[96];
    printf("  %s: %u rank(s), step %.3f s (best of %u rounds:", cfg_name(&r->c, name, sizeof name),
           r->world, r->step_s, r->rounds);
    for (uint32_t k = 0; k < r->rounds; k++)
        printf(" %.3f", r->round_s[k]);
    printf("), load1 %.2f\n", r->load1);
    for (uint32_t i = 0; i < r->world; i++) {
        ch_coord_t k = ch_layout_coord((ch_layout_t){r->c.tp, r->c.pp, r->c.dp}, i);
        const eng_step_info_t *x = &r->mean[i];
        printf("    rank %u (tp %u, stage %u, dp %u): step %.3f s = compute %.3f + tp %.3f + "
               "pp_wait %.3f + zero %.3f + optim %.3f + idle %.3f; bubble %.3f\n",
               i, k.tp, k.pp, k.dp, x->seconds, x->time.compute, x->time.tp, x->time.pp_wait,
               x->time.zero, x->time.optim, x->time.idle, x->bubble);
    }
}

/* Measure the layouts of cfgs not measured yet, in turns: every layout of the group holds
 * its trainers from the start, and round k of each runs before round k + 1 of any
 * (create-only layouts: created, measured, stopped). */
static void measure_group(bench_t *b, const cfg_t *cfgs, size_t n)
{
    int first = b->nruns;
    for (size_t i = 0; i < n; i++) {
        if (find(b, &cfgs[i]))
            continue;
        if (b->nruns == MAXRUNS) {
            fprintf(stderr, "bench-parallel: more than %d layouts\n", MAXRUNS);
            exit(1);
        }
        result_t *r = &b->runs[b->nruns++];
        memset(r, 0, sizeof *r);
        r->c = cfgs[i];
        r->world = r->c.tp * r->c.pp * r->c.dp;
    }
    int count = b->nruns - first;
    live_t *lv = calloc(count ? (size_t)count : 1, sizeof *lv);
    if (!lv) {
        fprintf(stderr, "bench-parallel: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < count; i++) {
        live_start(&lv[i], &b->runs[first + i], &b->o);
        if (b->runs[first + i].c.create_only)
            live_stop(&lv[i]);
    }
    for (uint32_t k = 0; k < b->o.reps; k++)
        for (int i = 0; i < count; i++)
            if (!b->runs[first + i].c.create_only)
                live_round(&lv[i], k);
    for (int i = 0; i < count; i++)
        if (!b->runs[first + i].c.create_only) {
            live_stop(&lv[i]);
            print_result(&b->runs[first + i]);
        }
    free(lv);
    fflush(stdout);
}

static const result_t *get(const bench_t *b, const cfg_t *c)
{
    const result_t *r = find(b, c);
    if (!r) {
        fprintf(stderr, "bench-parallel: a layout was not measured\n");
        exit(1);
    }
    return r;
}

static void result_line(const char *name, double v, const char *unit, const char *ref, double ref_v)
{
    printf("RESULT name=%s value=%.4g unit=%s ref=%s ref_value=%.4g ratio=%.3f\n", name, v, unit,
           ref, ref_v, ref_v != 0 ? v / ref_v : 0.0);
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// 1. TP=2 and PP=2 against one rank with the same threads

static void efficiency(const bench_t *b, const char *what, const cfg_t *c)
{
    cfg_t one2 = {.tp = 1, .pp = 1, .dp = 1, .m = c->m, .threads = 2}, one1 = one2;
    one1.threads = 1;
    const result_t *base = get(b, &one2), *single = get(b, &one1), *r = get(b, c);
    double best = fmin(base->step_s, single->step_s);
    double eff = base->step_s / r->step_s, eff_best = best / r->step_s;
    printf("    %s m=%u: %.3f s; one rank 2 threads %.3f s, 1 thread %.3f s; efficiency %.3f "
           "against 2 threads (goal >= 0.85: %s), %.3f against the faster one-rank run\n",
           what, c->m, r->step_s, base->step_s, single->step_s, eff, eff >= 0.85 ? "met" : "missed",
           eff_best);
    char name[64];
    double tokens = (double)b->o.batch * b->o.seq;
    snprintf(name, sizeof name, "%s_m%u_tokens_per_s", what, c->m);
    result_line(name, tokens / r->step_s, "tokens/s", "one_rank_2_blas_threads",
                tokens / base->step_s);
    snprintf(name, sizeof name, "%s_m%u_tokens_per_s_vs_best_one_rank", what, c->m);
    result_line(name, tokens / r->step_s, "tokens/s",
                single->step_s < base->step_s ? "one_rank_1_blas_thread"
                                              : "one_rank_2_blas_threads",
                tokens / best);
}

static void bench_eff(bench_t *b)
{
    printf("\n== TP=2 and PP=2 step-time efficiency: 2 ranks x 1 OpenBLAS thread against one "
           "rank x 2 threads (efficiency = one rank's step time / the layout's) ==\n");
    const cfg_t cfgs[] = {
        {.tp = 1, .pp = 1, .dp = 1, .m = 8, .threads = 2},
        {.tp = 1, .pp = 1, .dp = 1, .m = 8, .threads = 1},
        {.tp = 2, .pp = 1, .dp = 1, .m = 8, .threads = 1},
        {.tp = 1, .pp = 2, .dp = 1, .m = 8, .threads = 1},
        {.tp = 1, .pp = 1, .dp = 1, .m = 16, .threads = 2},
        {.tp = 1, .pp = 1, .dp = 1, .m = 16, .threads = 1},
        {.tp = 1, .pp = 2, .dp = 1, .m = 16, .threads = 1},
    };
    measure_group(b, cfgs, sizeof cfgs / sizeof cfgs[0]);
    efficiency(b, "tp2", &cfgs[2]);
    efficiency(b, "pp2", &cfgs[3]);
    efficiency(b, "pp2", &cfgs[6]);
}

// ----------------------------------------------------------------------------
// 2. the pipeline bubble, per schedule

/* Each schedule's stage-0 bubble formula: 1F1B (p-1)/(m+p-1); ZB-H1 (p-1)/(3m+p-1), the
 * paper's (p-1)(T_F+T_B-T_W) with T_F = T_B = T_W (common/plan.h). */
static double bubble_theory(ch_schedule_t sched, uint32_t p, uint32_t m)
{
    /* interleaved (v = 2 here): (p-1)/(v m+p-1), each chunk's passes 1/v of a stage's */
    uint32_t k = sched == CH_SCHEDULE_ZBH1 ? 3 : sched == CH_SCHEDULE_INTERLEAVED ? 2 : 1;
    return (double)(p - 1) / (k * m + p - 1);
}

/* The schedule's own timeline at the passes' measured times (eng_step_info_t.pass, per
 * micro-batch), where the formulas assume equal stages and T_F = T_B = T_W: each stage runs
 * its passes in pipeline.c's order (1F1B: p - s - 1 warm-up forwards, then a forward and a
 * backward each, then the remaining backwards; ZB-H1: past stage 0 each backward is its
 * input pass, the weight passes run once more than s of them are pending, the rest at the
 * end), a forward waiting for the previous stage's, a backward for the next stage's, messages
 * taking no time. Stage 0's idle share of the slowest stage's finish. Interleaved: 0 (not
 * modelled). */
static double bubble_at_times(const result_t *r)
{
    enum { MAXM = 64 };
    uint32_t p = r->c.pp, m = r->c.m;
    int zb = r->c.sched == CH_SCHEDULE_ZBH1;
    if ((r->c.sched != CH_SCHEDULE_1F1B && !zb) || p > MAXR || m > MAXM)
        return 0;
    /* per stage: its ops in order (kind 0 F, 1 B, 2 W; micro-batch), and their end times */
    struct op {
        uint8_t kind;
        uint32_t mb;
    } ops[MAXR][3 * MAXM];
    uint32_t n[MAXR] = {0}, at[MAXR] = {0};
    double fend[MAXR][MAXM], bend[MAXR][MAXM], t[MAXR] = {0}, busy[MAXR] = {0};
    for (uint32_t s = 0; s < p; s++)
        for (uint32_t i = 0; i < m; i++)
            fend[s][i] = bend[s][i] = -1; /* not run yet */
    for (uint32_t s = 0; s < p; s++) {
        uint32_t warm = p - s - 1 < m ? p - s - 1 : m, w = 0, split = zb && s > 0;
        for (uint32_t i = 0; i < warm; i++)
            ops[s][n[s]++] = (struct op){0, i};
        for (uint32_t i = 0; i < m; i++) {
            if (warm + i < m)
                ops[s][n[s]++] = (struct op){0, warm + i};
            ops[s][n[s]++] = (struct op){1, i};
            for (; split && w + s < i + 1; w++)
                ops[s][n[s]++] = (struct op){2, w};
        }
        for (; split && w < m; w++)
            ops[s][n[s]++] = (struct op){2, w};
    }
    for (int moved = 1; moved;) { /* advance every stage as far as its inputs allow */
        moved = 0;
        for (uint32_t s = 0; s < p; s++) {
            const eng_step_info_t *x = &r->mean[s];
            int split = zb && s > 0;
            for (; at[s] < n[s]; at[s]++) {
                struct op o = ops[s][at[s]];
                double ready = 0, dur = o.kind == 0   ? x->pass.fwd
                                        : o.kind == 2 ? x->pass.weight
                                                      : x->pass.bwd + (split ? 0 : x->pass.weight);
                if (o.kind == 0 && s > 0) {
                    if (fend[s - 1][o.mb] < 0)
                        break;
                    ready = fend[s - 1][o.mb];
                } else if (o.kind == 1) {
                    double dep = s + 1 < p ? bend[s + 1][o.mb] : fend[s][o.mb];
                    if (dep < 0)
                        break;
                    ready = dep;
                }
                t[s] = fmax(t[s], ready) + dur;
                busy[s] += dur;
                if (o.kind == 0)
                    fend[s][o.mb] = t[s];
                else if (o.kind == 1)
                    bend[s][o.mb] = t[s];
                moved = 1;
            }
        }
    }
    double end = 0;
    for (uint32_t s = 0; s < p; s++)
        end = fmax(end, t[s]);
    return end > 0 ? 1 - busy[0] / end : 0;
}

/* How well the paced devices held (paced.h): the host's share of each rank's device time
 * (its real kernels), and the intervals whose kernels overran their charge. */
static void print_paced(const result_t *r)
{
    uint64_t late = 0, n = 0;
    double over = 0, dev = 0;
    printf("      paced device: host busy / device time per rank");
    for (uint32_t s = 0; s < r->world; s++) {
        const paced_stats_t *x = &r->paced[s];
        printf(" %.2f", x->paced_ns ? (double)x->busy_ns / (double)x->paced_ns : 0);
        late += x->late;
        n += x->intervals;
        over += (double)x->late_ns;
        dev += (double)x->paced_ns;
    }
    double f = dev > 0 ? over / dev : 0;
    printf("; %llu of %llu intervals overran, by %.2f%% of the device's time%s\n",
           (unsigned long long)late, (unsigned long long)n, 100 * f,
           f > 0.01 ? " (over 1%: the host's cores, not the devices, set part of the step)" : "");
}

static void bench_bubble(bench_t *b)
{
    enum { NP = 2, NM = 3, NS = 3, N = NP * NM * NS };
    static const uint32_t ps[NP] = {2, 4}, ms[NM] = {4, 8, 16};
    static const ch_schedule_t ss[NS] = {CH_SCHEDULE_1F1B, CH_SCHEDULE_ZBH1,
                                         CH_SCHEDULE_INTERLEAVED};
    cfg_t cfgs[N];
    size_t n = 0;
    for (size_t i = 0; i < N; i++) {
        uint32_t p = ps[i / (NM * NS)], m = ms[i / NS % NM];
        if ((b->o.only_p && p != b->o.only_p) || (b->o.only_m && m != b->o.only_m) ||
            (b->o.zb_pair && ss[i % NS] == CH_SCHEDULE_INTERLEAVED))
            continue;
        cfgs[n++] = (cfg_t){.tp = 1,
                            .pp = p,
                            .dp = 1,
                            .m = m,
                            .threads = 1,
                            .sched = ss[i % NS],
                            .v = ss[i % NS] == CH_SCHEDULE_INTERLEAVED ? 2 : 0};
    }
    printf("\n== pipeline bubble (1f1b, zb-h1%s): pipeline send/recv wait over the step, 1 "
           "OpenBLAS thread per rank; each p, m measured in turns across the schedules ==\n",
           b->o.zb_pair ? "" : ", interleaved v=2");
    if (b->o.paced_gflops > 0)
        printf("    on paced devices (one per rank, kernels asleep on the host): %.1f GFLOP/s, "
               "%.1f GB/s\n",
               b->o.paced_gflops, b->o.paced_gbps);
    measure_group(b, cfgs, n);
    for (size_t i = 0; i < n; i++) {
        const result_t *r = get(b, &cfgs[i]);
        uint32_t p = cfgs[i].pp, m = cfgs[i].m;
        const char *sn = ch_schedule_name(cfgs[i].sched);
        double theory = bubble_theory(cfgs[i].sched, p, m), sum = 0, s0 = r->mean[0].bubble;
        printf("    %s p=%u m=%u: theory %.3f; bubble per stage", sn, p, m, theory);
        for (uint32_t s = 0; s < p; s++) {
            printf(" %.3f", r->mean[s].bubble);
            sum += r->mean[s].bubble;
        }
        printf("; (pp_wait + zero) / step per stage");
        for (uint32_t s = 0; s < p; s++)
            printf(" %.3f", (r->mean[s].time.pp_wait + r->mean[s].time.zero) / r->mean[s].seconds);
        printf("; stage 0 %+.1f points from theory (goal: within 3): %s\n", 100 * (s0 - theory),
               fabs(s0 - theory) <= 0.03 ? "met" : "missed");
        printf("      passes per micro-batch (ms) per stage, F/B/W:");
        for (uint32_t s = 0; s < p; s++)
            printf(" %.1f/%.1f/%.1f", 1e3 * r->mean[s].pass.fwd, 1e3 * r->mean[s].pass.bwd,
                   1e3 * r->mean[s].pass.weight);
        double at = bubble_at_times(r);
        if (at > 0)
            printf("; formula at these times %.3f, stage 0 %+.1f points from it", at,
                   100 * (s0 - at));
        printf("\n");
        if (b->o.paced_gflops > 0)
            print_paced(r);
        char name[64], ref[48];
        snprintf(ref, sizeof ref, "%s_formula", sn);
        if (cfgs[i].sched == CH_SCHEDULE_INTERLEAVED)
            sn = "interleaved_v2";
        snprintf(name, sizeof name, "bubble_%s_p%u_m%u_stage0", sn, p, m);
        result_line(name, s0, "fraction", ref, theory);
        snprintf(name, sizeof name, "bubble_%s_p%u_m%u_stage_mean", sn, p, m);
        result_line(name, sum / p, "fraction", ref, theory);
        if (at > 0) {
            snprintf(name, sizeof name, "bubble_%s_p%u_m%u_stage0_vs_pass_times", sn, p, m);
            snprintf(ref, sizeof ref, "%s_formula_at_measured_passes", sn);
            result_line(name, s0, "fraction", ref, at);
        }
        if (cfgs[i].sched != CH_SCHEDULE_ZBH1)
            continue;
        /* the pair measured in turns: zb-h1's stage-0 bubble and step over 1f1b's */
        const result_t *f = get(b, &cfgs[i - 1]);
        double ratio = f->mean[0].bubble > 0 ? s0 / f->mean[0].bubble : 0;
        /* the same ratio from the formulas at each schedule's measured passes, and ZB-H1's
         * weight pass against its input pass (the paper's T_W = T_B makes it 1) */
        double fat = bubble_at_times(f), rat = fat > 0 ? at / fat : 0, wb = 0;
        for (uint32_t s = 1; s < p; s++)
            wb += r->mean[s].pass.bwd > 0 ? r->mean[s].pass.weight / r->mean[s].pass.bwd / (p - 1)
                                          : 0;
        printf("    zb-h1 / 1f1b p=%u m=%u: stage-0 bubble ratio %.3f%s, formulas at the measured "
               "passes %.3f (W/B %.2f), step %.3f s / %.3f s\n",
               p, m, ratio,
               p == 4 && m == 8 ? (ratio <= 0.5 ? " (goal <= 0.5: met)" : " (goal <= 0.5: missed)")
                                : "",
               rat, wb, r->step_s, f->step_s);
        snprintf(name, sizeof name, "bubble_zb-h1_over_1f1b_p%u_m%u_stage0", p, m);
        result_line(name, s0, "fraction", "1f1b_measured", f->mean[0].bubble);
        snprintf(name, sizeof name, "bubble_zb-h1_over_1f1b_p%u_m%u_at_passes", p, m);
        result_line(name, at, "fraction", "1f1b_formula_at_measured_passes", fat);
    }
}

// ----------------------------------------------------------------------------
// 3. ZeRO-3 against replicated data parallelism

static void bench_zero(bench_t *b)
{
    printf("\n== ZeRO-3 against replicated data parallelism: micro-batch size 2, 1 OpenBLAS "
           "thread per rank ==\n");
    cfg_t cfgs[6];
    for (size_t i = 0; i < 6; i++) {
        uint32_t dp = i < 3 ? 2 : 4;
        cfgs[i] = (cfg_t){.tp = 1,
                          .pp = 1,
                          .dp = dp,
                          .m = b->o.batch / dp / 2,
                          .threads = 1,
                          .replicate = i % 3 == 0,
                          .reshard = i % 3 == 2 ? CH_RESHARD_PER_STEP : CH_RESHARD_PER_USE};
    }
    measure_group(b, cfgs, 6);
    for (size_t i = 0; i < 6; i++) {
        if (cfgs[i].replicate)
            continue;
        const result_t *base = get(b, &cfgs[i / 3 * 3]), *r = get(b, &cfgs[i]);
        double ratio = r->step_s / base->step_s;
        const char *pn = cfgs[i].reshard == CH_RESHARD_PER_STEP ? "per_step" : "per_use";
        printf("    dp=%u %s: %.3f s against replicated %.3f s: %.3fx (goal <= 1.15: %s)\n",
               cfgs[i].dp, pn, r->step_s, base->step_s, ratio, ratio <= 1.15 ? "met" : "missed");
        char name[64];
        snprintf(name, sizeof name, "zero3_%s_dp%u_step", pn, cfgs[i].dp);
        result_line(name, r->step_s, "s", "replicated_dp", base->step_s);
    }
}

// ----------------------------------------------------------------------------
// 4. resident state per rank

/* A stepped layout's high-water mark of backend memory per rank, as its allocator counted
 * it (eng_trainer_mem), against the plan's per-rank total (chorusctl plan's figure). */
static void peak_of(const result_t *r, const ch_model_cfg_t *mc, const ch_jobspec_t *spec,
                    const char *tag)
{
    const double MiB = 1024.0 * 1024.0;
    ch_layout_t l = ch_jobspec_layout(spec);
    double worst = 0, at = 0, at_plan = 0;
    char name[96];
    printf("      peak per rank, measured (plan) MiB:");
    for (uint32_t k = 0; k < r->world; k++) {
        ch_plan_t p;
        if (ch_plan_stage(mc, l, spec->parallel.micro_batch_size, spec->parallel.microbatches,
                          r->c.reshard, ch_layout_coord(l, k).pp, &p) < 0)
            continue;
        double got = (double)r->measured[k].total_peak, rel = fabs(p.total_bytes / got - 1);
        printf(" r%u %.2f (%.2f)", k, got / MiB, p.total_bytes / MiB);
        if (rel >= worst)
            worst = rel, at = got, at_plan = p.total_bytes;
    }
    printf("; plan off by %.2f%% at worst (goal within 10%%: %s)%s\n", 100 * worst,
           worst <= 0.10 ? "met" : "missed",
           r->c.replicate ? " (replicated: the plan assumes ZeRO-3)" : "");
    snprintf(name, sizeof name, "peak_bytes_%s_worst_rank_vs_plan", tag);
    result_line(name, at / MiB, "MiB", "ch_plan_stage", at_plan / MiB);
}

/* One layout's memory: each rank against ch_plan_stage, the peak rank's state against
 * 16Ψ/N; with steps run, the measured peak against the plan's. */
static void memory_of(const bench_t *b, const cfg_t *c)
{
    const double MiB = 1024.0 * 1024.0;
    const result_t *r = get(b, c);
    ch_jobspec_t spec;
    spec_for(&b->o, &r->c, &spec);
    ch_model_cfg_t mc = ch_plan_model_of(&spec);
    ch_layout_t l = ch_jobspec_layout(&spec);
    double psi = 0, worst_state = 0, worst_gathered = 0, peak = 0, peak_plan = 0;
    char name[96], tag[64];
    snprintf(tag, sizeof tag, "tp%u_pp%u_dp%u%s", c->tp, c->pp, c->dp, policy_name(c));
    printf("    %s (N=%u), state+gathered MiB:", tag, r->world);
    for (uint32_t k = 0; k < r->world; k++) {
        ch_plan_t p;
        if (ch_plan_stage(&mc, l, spec.parallel.micro_batch_size, spec.parallel.microbatches,
                          c->reshard, ch_layout_coord(l, k).pp, &p) < 0) {
            fprintf(stderr, "bench-parallel: ch_plan_stage %s failed\n", tag);
            exit(1);
        }
        psi = p.params_total;
        double st = (double)r->mem[k].state_bytes, ga = (double)r->mem[k].gathered_bytes;
        if (st > peak)
            peak = st, peak_plan = p.state_bytes;
        worst_state = fmax(worst_state, fabs(st / p.state_bytes - 1));
        worst_gathered = fmax(worst_gathered, fabs(ga - p.gathered_bytes) / MiB);
        printf(" r%u %.2f+%.2f (plan %.2f+%.2f)", k, st / MiB, ga / MiB, p.state_bytes / MiB,
               p.gathered_bytes / MiB);
    }
    double ideal = 16.0 * psi / r->world, ratio = peak / ideal;
    printf("\n      peak rank's state %.2f MiB, 16Ψ/N %.2f MiB (Ψ = %.0f): %.3f (goal within 10%%: "
           "%s)",
           peak / MiB, ideal / MiB, psi, ratio, fabs(ratio - 1) <= 0.10 ? "met" : "missed");
    if (c->replicate)
        printf("; replicated: ch_plan_stage (ZeRO-3) does not apply\n");
    else
        printf("; against ch_plan_stage: state off by %.1f%% at worst, gathered by %.2f MiB\n",
               100 * worst_state, worst_gathered);
    if (r->stepped)
        peak_of(r, &mc, &spec, tag);
    snprintf(name, sizeof name, "state_bytes_%s_peak_rank", tag);
    result_line(name, peak / MiB, "MiB", "16Psi/N", ideal / MiB);
    if (!c->replicate) {
        snprintf(name, sizeof name, "state_bytes_%s_peak_rank_vs_plan", tag);
        result_line(name, peak / MiB, "MiB", "ch_plan_stage", peak_plan / MiB);
    }
}

static void bench_mem(bench_t *b)
{
    /* N = 1, 2, 4; ZeRO-3 in both policies; replicated DP for contrast; micro-batch size 2.
     * Each layout steps, so its allocator's high-water mark is measured. */
    cfg_t cfgs[] = {
        {1, 1, 1, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {2, 1, 1, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 2, 1, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 2, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 2, 0, 1, CH_RESHARD_PER_STEP, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 2, 0, 1, CH_RESHARD_PER_USE, 1, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 4, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 4, 0, 1, CH_RESHARD_PER_STEP, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 1, 4, 0, 1, CH_RESHARD_PER_USE, 1, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {2, 2, 1, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 4, 1, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {2, 1, 2, 0, 1, CH_RESHARD_PER_USE, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
        {1, 2, 2, 0, 1, CH_RESHARD_PER_STEP, 0, 0, CH_SCHEDULE_1F1B, 0, CH_RECOMPUTE_NONE, 0},
    };
    size_t n = sizeof cfgs / sizeof cfgs[0];
    for (size_t i = 0; i < n; i++)
        cfgs[i].m = b->o.batch / cfgs[i].dp / 2;
    printf("\n== Resident state per rank (eng_trainer_memory: parameters, gradients, Adam m "
           "and v; gathered: ZeRO-3's gathered blocks and unsharded gradient, wte, wpe, ln_f and "
           "theirs) against 16Ψ/N and ch_plan_stage; each rank's measured peak (eng_trainer_mem) "
           "against the plan's total ==\n");
    measure_group(b, cfgs, n);
    for (size_t i = 0; i < n; i++)
        memory_of(b, &cfgs[i]);
}

// ----------------------------------------------------------------------------
// 6. activation recomputation

static void bench_recompute(bench_t *b)
{
    static const ch_recompute_t modes[3] = {CH_RECOMPUTE_NONE, CH_RECOMPUTE_SELECTIVE,
                                            CH_RECOMPUTE_FULL};
    const double MiB = 1024.0 * 1024.0, L = b->o.rc_layers, N = b->o.rc_seq, C = 768;
    /* the embedding's and head's buffers (common/plan.c: first and last stage) */
    const double outside = 4 * (N + N * C) + 4 * (N * C + 5 * N);
    cfg_t cfgs[3];
    for (int i = 0; i < 3; i++)
        cfgs[i] =
            (cfg_t){.tp = 1, .pp = 1, .dp = 1, .m = 2, .threads = 2, .rc = modes[i], .gpt2 = 1};
    printf("\n== activation recomputation: one rank, 2 OpenBLAS threads, GPT-2 width (768, 12 "
           "heads) at seq %u, %u blocks, 2 sequences a step; none, selective and full in turns; "
           "activations per block = (measured activation peak - embedding's and head's "
           "buffers) / blocks ==\n",
           b->o.rc_seq, b->o.rc_layers);
    measure_group(b, cfgs, 3);
    const result_t *base = get(b, &cfgs[0]);
    double none_blk = ((double)base->measured[0].peak[ENG_MEM_ACTS] - outside) / L;
    for (int i = 0; i < 3; i++) {
        const result_t *r = get(b, &cfgs[i]);
        ch_jobspec_t spec;
        spec_for(&b->o, &r->c, &spec);
        ch_model_cfg_t mc = ch_plan_model_of(&spec);
        ch_plan_t p;
        if (ch_plan_stage_rc(&mc, ch_jobspec_layout(&spec), 1, 2, r->c.reshard, r->c.rc, 0, &p) < 0)
            exit(1);
        double blk = ((double)r->measured[0].peak[ENG_MEM_ACTS] - outside) / L;
        double plan_blk = (p.act_mb_bytes - outside) / L, t = r->step_s / base->step_s;
        double cut = none_blk / blk, att = 4.0 * 12 * N * N; /* one sequence's T x T */
        const char *mn = ch_recompute_name(modes[i]);
        printf("    %s: step %.3f s (%.3fx none), activations per block %.2f MiB (plan %.2f), "
               "%.2fx less than none, recompute scratch peak %.2f MiB",
               mn, r->step_s, t, blk / MiB, plan_blk / MiB, cut,
               (double)r->measured[0].peak[ENG_MEM_SCRATCH] / MiB);
        if (modes[i] == CH_RECOMPUTE_SELECTIVE)
            printf("; T x T probabilities %.2f MiB a block, %s dropped; goal <= 1.1x: %s",
                   att / MiB, fabs(none_blk - blk - att) < 1024 ? "all" : "NOT all",
                   t <= 1.1 ? "met" : "missed");
        if (modes[i] == CH_RECOMPUTE_FULL)
            printf("; goal >= 4x less for <= 1.4x: %s", cut >= 4 && t <= 1.4 ? "met" : "missed");
        printf("\n");
        char name[64];
        snprintf(name, sizeof name, "recompute_%s_step", mn);
        result_line(name, r->step_s, "s", "recompute_none", base->step_s);
        snprintf(name, sizeof name, "recompute_%s_act_bytes_per_block", mn);
        result_line(name, blk / MiB, "MiB", "recompute_none", none_blk / MiB);
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
                  .steps = 1,
                  .reps = 3,
                  .rc_layers = 2,
                  .rc_seq = 1024};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (parse_u32(a, "--layers", &o->layers) || parse_u32(a, "--embd", &o->embd) ||
            parse_u32(a, "--heads", &o->heads) || parse_u32(a, "--seq", &o->seq) ||
            parse_u32(a, "--vocab", &o->vocab) || parse_u32(a, "--batch", &o->batch) ||
            parse_u32(a, "--warmup", &o->warmup) || parse_u32(a, "--steps", &o->steps) ||
            parse_u32(a, "--reps", &o->reps) || parse_u32(a, "--rc-layers", &o->rc_layers) ||
            parse_u32(a, "--rc-seq", &o->rc_seq) || parse_u32(a, "--pp", &o->only_p) ||
            parse_u32(a, "--m", &o->only_m))
            continue;
        if (strncmp(a, "--paced=", 8) == 0 || strncmp(a, "--paced-bw=", 11) == 0) {
            int bw = a[7] == '-';
            char *end = NULL;
            double v = strtod(strchr(a, '=') + 1, &end);
            if (*end || !(v > 0 && v < 1e6)) {
                fprintf(stderr, "bench-parallel: %s: a positive rate (GFLOP/s, GB/s)\n", a);
                exit(2);
            }
            *(bw ? &o->paced_gbps : &o->paced_gflops) = v;
            continue;
        }
        if (strncmp(a, "--only=", 7) == 0)
            o->only = a + 7;
        else if (strcmp(a, "--pin") == 0)
            o->pin = 1;
        else if (strcmp(a, "--balanced") == 0)
            o->balanced = 1;
        else if (strcmp(a, "--zb-pair") == 0)
            o->zb_pair = 1;
        else if (strcmp(a, "--gpt2-shape") == 0) {
            /* GPT-2's head size and its attention-to-linear work, T/(6C) = 0.22 at T 1024,
             * C 768: C 384, T 512 keep both (flags after this one override) */
            o->embd = 384;
            o->heads = 6;
            o->seq = 512;
        } else {
            fprintf(stderr,
                    "usage: chorus-bench-parallel [--layers=8] [--embd=256] [--heads=8] "
                    "[--seq=128] [--vocab=512] [--batch=16 (global sequences, a multiple of "
                    "16)] [--warmup=1] [--steps=1] [--reps=3] "
                    "[--only=eff|bubble|zero|mem|recompute] [--pin] [--balanced] "
                    "[--rc-layers=2] [--rc-seq=1024] [--pp=2|4] [--m=4|8|16] [--zb-pair] "
                    "[--gpt2-shape] [--paced=GFLOPS [--paced-bw=GBPS]]\n");
            exit(2);
        }
    }
    if (o->only && strcmp(o->only, "eff") && strcmp(o->only, "bubble") && strcmp(o->only, "zero") &&
        strcmp(o->only, "mem") && strcmp(o->only, "recompute")) {
        fprintf(stderr, "bench-parallel: --only=%s: eff, bubble, zero, mem or recompute\n",
                o->only);
        exit(2);
    }
    if (o->paced_gflops > 0 && o->paced_gbps <= 0)
        o->paced_gbps = o->paced_gflops / 8;
    if (o->paced_gbps > 0 && o->paced_gflops <= 0) {
        fprintf(stderr, "bench-parallel: --paced-bw needs --paced\n");
        exit(2);
    }
    if (o->batch % 16 || o->layers < 4 || o->heads % 2 ||
        o->warmup + o->steps * o->reps > MAXSTEPS || o->reps > MAXREPS) {
        fprintf(stderr,
                "bench-parallel: --batch must be a multiple of 16, --layers >= 4, --heads "
                "even, warmup + steps * reps <= %d, reps <= %d\n",
                MAXSTEPS, MAXREPS);
        exit(2);
    }
}

static int wanted(const opts_t *o, const char *section)
{
    return !o->only || strcmp(o->only, section) == 0;
}

int main(int argc, char **argv)
{
    bench_t b = {0};
    parse(argc, argv, &b.o);
    const opts_t *o = &b.o;
    uint64_t t0 = ch_now_ns();
    printf("chorus-bench-parallel: GPT %u layers x %u embd, %u heads, seq %u, vocab %u; global "
           "batch %u sequences for every layout; each layout: best of %u rounds (in turns with "
           "the layouts it is compared with) of %u warm-up + %u timed step(s)\n",
           o->layers, o->embd, o->heads, o->seq, o->vocab, o->batch, o->reps, o->warmup, o->steps);
    /* a block's attention matmuls (QK^T and AV: 2 T C multiply-adds per token, not halved for
     * the causal mask) against its linear layers' 12 C^2 */
    printf("attention / linear work per block: T/(6C) = %.3f (GPT-2 124M at T 1024: 0.222)\n",
           (double)o->seq / (6.0 * o->embd));
    printf("placement: ranks are threads of this process (UCX loopback collectives); OpenBLAS "
           "threads process-wide: 1 per rank for multi-rank layouts, 2 or 1 for one rank; %s\n",
           o->pin ? "rank r pinned to CPU r mod ncpu" : "threads not pinned");
    print_load("start");
    if (wanted(o, "eff"))
        bench_eff(&b);
    if (wanted(o, "bubble"))
        bench_bubble(&b);
    if (wanted(o, "zero"))
        bench_zero(&b);
    if (wanted(o, "mem"))
        bench_mem(&b);
    if (wanted(o, "recompute"))
        bench_recompute(&b);
    printf("\n");
    print_load("end");
    printf("total %.1f s\n", (double)(ch_now_ns() - t0) * 1e-9);
    return 0;
}
