/* The layout planner (planner.h has the theory of operation). */
#include "common/planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define F32 4.0 /* bytes */
#define GIB 1073741824.0
/* The largest micro-batch tried (sequences): bounds the search for huge global batches. */
#define MBS_MAX 65536

void ch_planner_cluster_defaults(ch_planner_cluster_t *c, uint32_t nodes, uint32_t slots_per_node)
{
    memset(c, 0, sizeof *c);
    c->nodes = nodes;
    c->slots_per_node = slots_per_node;
    c->mem_per_slot = CH_PLANNER_MEM_PER_SLOT;
    c->flops_per_slot = CH_PLANNER_FLOPS_PER_SLOT;
    c->mfu = CH_PLANNER_MFU;
    c->tp_busbw = CH_PLANNER_TP_BUSBW;
    c->dp_busbw = CH_PLANNER_DP_BUSBW;
}

// ----------------------------------------------------------------------------
// the cluster

static uint32_t node_slots(const ch_planner_cluster_t *c, uint32_t i)
{
    return c->node_slots ? c->node_slots[i] : c->slots_per_node;
}

/* TP groups of tp ranks the cluster can place, each inside one node. */
static uint64_t tp_groups(const ch_planner_cluster_t *c, uint32_t tp)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < c->nodes; i++)
        n += node_slots(c, i) / tp;
    return n;
}

/* The smallest and largest node. */
static void node_range(const ch_planner_cluster_t *c, uint32_t *lo, uint32_t *hi, uint64_t *sum)
{
    *lo = UINT32_MAX;
    *hi = 0;
    *sum = 0;
    for (uint32_t i = 0; i < c->nodes; i++) {
        uint32_t s = node_slots(c, i);
        *lo = s < *lo ? s : *lo;
        *hi = s > *hi ? s : *hi;
        *sum += s;
    }
}

static int positive(double v)
{
    return v > 0 && isfinite(v);
}

static int check_inputs(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                        const ch_planner_opts_t *o, char *err, size_t errlen)
{
    uint32_t lo, hi;
    uint64_t sum;
    if (!m->layers || !m->heads || !m->embd || !m->vocab || !m->seq_len)
        return ch_errf(err, errlen, -EINVAL, "model: a dimension is 0");
    if (!c->nodes)
        return ch_errf(err, errlen, -EINVAL, "cluster: no nodes");
    node_range(c, &lo, &hi, &sum);
    if (hi == 0)
        return ch_errf(err, errlen, -EINVAL, "cluster: no slots");
    if (!positive(c->mem_per_slot) || !positive(c->flops_per_slot) || !positive(c->tp_busbw) ||
        !positive(c->dp_busbw))
        return ch_errf(err, errlen, -EINVAL,
                       "cluster: memory, FLOP/s and bandwidths must be positive numbers");
    if (!(c->mfu > 0 && c->mfu <= 1))
        return ch_errf(err, errlen, -EINVAL, "cluster: mfu must be in (0, 1], got %g", c->mfu);
    if (!(o->mem_reserve >= 0 && o->mem_reserve < 1))
        return ch_errf(err, errlen, -EINVAL, "mem_reserve must be in [0, 1), got %g",
                       o->mem_reserve);
    if (o->global_batch == 0 || (double)o->global_batch > CH_PLANNER_BATCH_MAX)
        return ch_errf(err, errlen, -EINVAL, "global batch: must be 1 to 2^53 sequences");
    return 0;
}

// ----------------------------------------------------------------------------
// one layout

/* Everything fixed for one evaluation. */
typedef struct ctx {
    const ch_model_cfg_t *m;
    const ch_planner_cluster_t *c;
    const ch_planner_opts_t *o;
    uint32_t node_min; /* slots of the smallest node */
} ctx_t;

/* Time of collectives, after nccl-tests' bus bandwidth: all-reduce moves 2(n−1)/n of the
 * buffer through each rank, reduce-scatter and all-gather (n−1)/n of the whole buffer. */
static double allreduce_s(double bytes, uint32_t n, double busbw)
{
    return n > 1 ? 2.0 * (n - 1) / n * bytes / busbw : 0;
}

static double gather_s(double bytes, uint32_t n, double busbw)
{
    return n > 1 ? (double)(n - 1) / n * bytes / busbw : 0;
}

/* Memory of stage s with the options' recomputation (plan.h counts it). */
static int stage_memory(const ctx_t *x, ch_layout_t l, uint32_t mbs, uint32_t mb,
                        ch_reshard_t reshard, uint32_t s, ch_plan_t *p)
{
    return ch_plan_stage_rc(x->m, l, mbs, mb, reshard, x->o->recompute, s, p);
}

/* Per micro-batch on stage p: work on the critical path and the stage's DP traffic of a
 * whole step. */
static void stage_time(const ctx_t *x, ch_layout_t l, uint32_t mbs, uint32_t mb,
                       ch_reshard_t reshard, const ch_plan_t *p, double bw_dp, double bw_pp,
                       double *compute, double *tp, double *p2p, double *dp_step)
{
    const ch_model_cfg_t *m = x->m;
    const double C = m->embd, T = m->seq_len, B = mbs, r = x->o->recompute == CH_RECOMPUTE_FULL;
    const double blk = 72.0 * T * C * C * (1 + T / (6 * C)), head = 6.0 * T * C * p->padded_vocab;
    const double act = F32 * B * T * C;

    *compute = B * (p->blocks * blk * (1 + r / 3) + (p->head ? head : 0)) /
               (l.tp * x->c->flops_per_slot * x->c->mfu);
    *tp = (p->blocks * (4 + 2 * r) + p->embeddings + p->head) *
          allreduce_s(act, l.tp, x->c->tp_busbw);
    *p2p = l.pp > 1 ? 2 * act / bw_pp : 0;
    const double S = F32 * p->blocks * p->block_tp;
    const double gathers = reshard == CH_RESHARD_PER_USE ? 2.0 * mb : 1.0;
    *dp_step = (mb + gathers) * gather_s(S, l.dp, bw_dp);
}

static void fmt_gib(char *buf, size_t n, double bytes)
{
    snprintf(buf, n, "%.1f GiB", bytes / GIB);
}

/* Evaluate one split of a valid (tp, pp, dp). Returns 0 when it fits, CH_E_CAPACITY
 * (reason set) when it does not, CH_E_TOOBIG when its figures overflow. */
static int eval_split(const ctx_t *x, ch_layout_t l, uint32_t mbs, ch_reshard_t reshard,
                      ch_planner_layout_t *out, char *reason, size_t reasonlen)
{
    const uint64_t per_dp = x->o->global_batch / l.dp;
    const uint32_t mb = (uint32_t)(per_dp / mbs);
    const double usable = x->c->mem_per_slot * (1 - x->o->mem_reserve);
    ch_plan_t st[3], mid; /* the first and last stage, a middle one; the peak middle one */
    uint32_t nst = l.pp > 1 ? 2 : 1;

    memset(out, 0, sizeof *out);
    out->split.tp = l.tp;
    out->split.pp = l.pp;
    out->split.dp = l.dp;
    out->world = l.tp * l.pp * l.dp;
    out->split.microbatches = mb;
    out->split.micro_batch_size = mbs;
    out->reshard = reshard;
    for (uint32_t i = 0; i < nst; i++) {
        int rc = stage_memory(x, l, mbs, mb, reshard, i == 0 ? 0 : l.pp - 1, &st[i]);
        if (rc < 0)
            return ch_errf(reason, reasonlen, CH_E_TOOBIG,
                           "too large to plan: over 2^53 parameters or bytes per rank");
    }
    /* the peak: the first stage of the most memory, as ch_plan_peak (a middle stage, which
     * holds what it receives, can pass stage 0 when the embedding is small) */
    const ch_plan_t *peak = &st[0];
    for (uint32_t s = 1; s < l.pp; s++) {
        const ch_plan_t *p = &st[1];
        if (s + 1 < l.pp) {
            if (stage_memory(x, l, mbs, mb, reshard, s, &st[2]) < 0)
                return ch_errf(reason, reasonlen, CH_E_TOOBIG,
                               "too large to plan: over 2^53 parameters or bytes per rank");
            p = &st[2];
        }
        if (p->total_bytes > peak->total_bytes) {
            mid = *p;
            peak = p == &st[2] ? &mid : p;
        }
    }
    out->peak_stage = peak->stage;
    out->mem_bytes = peak->total_bytes;
    out->state_bytes = peak->state_bytes;
    out->gathered_bytes = peak->gathered_bytes;
    out->act_bytes = peak->act_bytes;
    out->bubble = peak->bubble;

    /* Groups inside one node talk at tp_busbw (rank order: TP fastest, then DP, PP). */
    const double bw_dp = (uint64_t)l.tp * l.dp <= x->node_min ? x->c->tp_busbw : x->c->dp_busbw;
    const double bw_pp = out->world <= x->node_min ? x->c->tp_busbw : x->c->dp_busbw;
    double slot = 0;
    for (uint32_t i = 0; i < nst; i++) {
        double comp, tp, p2p, dp_step;
        stage_time(x, l, mbs, mb, reshard, &st[i], bw_dp, bw_pp, &comp, &tp, &p2p, &dp_step);
        double s = fmax(comp + tp + p2p, dp_step / mb);
        if (s > slot || i == 0) {
            slot = s;
            out->compute_s = comp;
            out->tp_s = tp;
            out->p2p_s = p2p;
            out->dp_s = dp_step / mb;
        }
    }
    /* What cannot overlap: the pipeline's first gather and last reduce-scatter (one block
     * each), the embeddings' gradients over dp, the tied wte between first and last stage. */
    const double wte = F32 * st[0].padded_vocab * x->m->embd / l.tp;
    double exposed = 2 * gather_s(F32 * st[0].block_tp, l.dp, bw_dp) +
                     allreduce_s(wte, l.dp, bw_dp) + (l.pp > 1 ? allreduce_s(wte, 2, bw_pp) : 0);
    out->step_s = ((double)mb + l.pp - 1) * slot + exposed;
    out->tokens_per_s = (double)x->o->global_batch * x->m->seq_len / out->step_s;
    /* Model FLOPs of the step (ch_plan's, over the whole global batch). */
    out->mfu = st[0].flops / (out->step_s * out->world * x->c->flops_per_slot);

    if (out->mem_bytes <= usable)
        return 0;
    char need[32], have[32], state[32], gath[32], acts[32];
    fmt_gib(need, sizeof need, out->mem_bytes);
    fmt_gib(have, sizeof have, usable);
    fmt_gib(state, sizeof state, out->state_bytes);
    fmt_gib(gath, sizeof gath, out->gathered_bytes);
    fmt_gib(acts, sizeof acts, out->act_bytes);
    return ch_errf(reason, reasonlen, CH_E_CAPACITY,
                   "does not fit: %s per rank on stage %u (state %s, gathered %s, activations "
                   "%s at micro_batch_size %u, %s) > %s usable",
                   need, out->peak_stage, state, gath, acts, mbs,
                   reshard == CH_RESHARD_PER_STEP ? "per-step" : "per-use", have);
}

/* Why (tp, pp, dp) cannot run on this model and cluster, or 0. */
static int check_layout(const ctx_t *x, ch_layout_t l, uint32_t node_max, char *reason,
                        size_t reasonlen)
{
    if (!l.tp || !l.pp || !l.dp)
        return ch_errf(reason, reasonlen, -EINVAL, "tp, pp and dp must be at least 1");
    if (x->m->heads % l.tp)
        return ch_errf(reason, reasonlen, -EINVAL, "tp %u does not divide model.heads %u", l.tp,
                       x->m->heads);
    if (l.tp > node_max)
        return ch_errf(reason, reasonlen, -EINVAL,
                       "tp %u is more than the %u slots of the largest node (a TP group stays "
                       "inside one node)",
                       l.tp, node_max);
    if (l.pp > x->m->layers)
        return ch_errf(reason, reasonlen, -EINVAL, "pp %u is more than model.layers %u", l.pp,
                       x->m->layers);
    if (x->o->global_batch % l.dp)
        return ch_errf(reason, reasonlen, -EINVAL,
                       "dp %u does not divide the global batch of %llu sequences", l.dp,
                       (unsigned long long)x->o->global_batch);
    if ((uint64_t)l.pp * l.dp > tp_groups(x->c, l.tp))
        return ch_errf(reason, reasonlen, -EINVAL,
                       "the cluster holds %llu groups of tp %u ranks inside nodes, fewer than "
                       "pp × dp = %llu",
                       (unsigned long long)tp_groups(x->c, l.tp), l.tp,
                       (unsigned long long)l.pp * l.dp);
    return 0;
}

static void ctx_init(ctx_t *x, const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                     const ch_planner_opts_t *o, uint32_t *node_max, uint64_t *slots)
{
    x->m = m;
    x->c = c;
    x->o = o;
    node_range(c, &x->node_min, node_max, slots);
}

int ch_planner_eval(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                    const ch_planner_opts_t *o, ch_layout_t l, uint32_t micro_batch_size,
                    ch_reshard_t reshard, ch_planner_layout_t *out, char *reason, size_t reasonlen)
{
    ctx_t x;
    uint32_t node_max;
    uint64_t slots;

    memset(out, 0, sizeof *out);
    int rc = check_inputs(m, c, o, reason, reasonlen);
    if (rc < 0)
        return rc;
    ctx_init(&x, m, c, o, &node_max, &slots);
    rc = check_layout(&x, l, node_max, reason, reasonlen);
    if (rc == 0 && (!micro_batch_size || (o->global_batch / l.dp) % micro_batch_size ||
                    o->global_batch / l.dp / micro_batch_size > UINT32_MAX))
        rc = ch_errf(reason, reasonlen, -EINVAL,
                     "micro_batch_size %u does not split the %llu sequences of a DP rank into "
                     "at most 2^32 - 1 micro-batches",
                     micro_batch_size, (unsigned long long)(o->global_batch / l.dp));
    if (rc < 0)
        return rc;
    rc = eval_split(&x, l, micro_batch_size, reshard, out, reason, reasonlen);
    return rc == CH_E_TOOBIG ? -EINVAL : rc;
}

// ----------------------------------------------------------------------------
// the search

typedef struct grow {
    void *v;
    size_t n, cap, size;
} grow_t;

static void *grow_push(grow_t *g)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        void *v = realloc(g->v, cap * g->size);
        if (!v)
            return NULL;
        g->v = v;
        g->cap = cap;
    }
    return (char *)g->v + g->size * g->n++;
}

/* Faster first; then less memory; then the smaller tp, pp, micro-batch, per-use first. */
static int better(const ch_planner_layout_t *a, const ch_planner_layout_t *b)
{
    if (a->step_s != b->step_s)
        return a->step_s < b->step_s ? -1 : 1;
    if (a->mem_bytes != b->mem_bytes)
        return a->mem_bytes < b->mem_bytes ? -1 : 1;
    if (a->split.tp != b->split.tp)
        return a->split.tp < b->split.tp ? -1 : 1;
    if (a->split.pp != b->split.pp)
        return a->split.pp < b->split.pp ? -1 : 1;
    if (a->split.micro_batch_size != b->split.micro_batch_size)
        return a->split.micro_batch_size < b->split.micro_batch_size ? -1 : 1;
    return (int)a->reshard - (int)b->reshard;
}

static int cmp_layout(const void *a, const void *b)
{
    return better(a, b);
}

static int cmp_refusal(const void *pa, const void *pb)
{
    const ch_planner_refusal_t *a = pa, *b = pb;
    /* Evaluated refusals (some memory figure) first, least memory first. */
    int ea = a->l.mem_bytes > 0, eb = b->l.mem_bytes > 0;
    if (ea != eb)
        return eb - ea;
    if (a->l.mem_bytes != b->l.mem_bytes)
        return a->l.mem_bytes < b->l.mem_bytes ? -1 : 1;
    if (a->l.split.tp != b->l.split.tp)
        return a->l.split.tp < b->l.split.tp ? -1 : 1;
    return a->l.split.pp < b->l.split.pp ? -1 : a->l.split.pp > b->l.split.pp;
}

/* The largest divisor of the global batch at most limit. */
static uint32_t largest_dp(uint64_t batch, uint64_t limit)
{
    for (uint64_t d = limit < batch ? limit : batch; d > 1; d--)
        if (batch % d == 0)
            return (uint32_t)d;
    return 1;
}

/* The best split of (tp, pp, dp) into *best (return 1), or 0 with the least-memory refusal
 * in *ref. Micro-batch sizes go up while the per-use policy (the smaller) still fits. */
static int plan_triple(const ctx_t *x, ch_layout_t l, ch_planner_layout_t *best,
                       ch_planner_refusal_t *ref)
{
    const uint64_t per_dp = x->o->global_batch / l.dp;
    int found = 0;

    memset(ref, 0, sizeof *ref);
    for (uint64_t mbs = 1; mbs <= per_dp && mbs <= MBS_MAX; mbs++) {
        if (per_dp % mbs || per_dp / mbs > UINT32_MAX)
            continue;
        int fits_any = 0;
        for (int r = CH_RESHARD_PER_USE; r <= CH_RESHARD_PER_STEP; r++) {
            ch_planner_layout_t cand;
            char why[sizeof ref->reason];
            int rc = eval_split(x, l, (uint32_t)mbs, (ch_reshard_t)r, &cand, why, sizeof why);
            if (rc == 0) {
                fits_any = 1;
                if (!found || better(&cand, best) < 0)
                    *best = cand;
                found = 1;
            } else if (!found && (ref->l.mem_bytes == 0 || cand.mem_bytes < ref->l.mem_bytes ||
                                  rc == CH_E_TOOBIG)) {
                ref->l = cand;
                snprintf(ref->reason, sizeof ref->reason, "%s", why);
                if (rc == CH_E_TOOBIG)
                    return 0;
            }
        }
        if (!fits_any)
            break; /* activations only grow with the micro-batch */
    }
    return found;
}

int ch_planner_run(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                   const ch_planner_opts_t *o, ch_planner_result_t *out, char *err, size_t errlen)
{
    grow_t fit = {.size = sizeof(ch_planner_layout_t)};
    grow_t ref = {.size = sizeof(ch_planner_refusal_t)};
    ctx_t x;
    uint32_t node_max;
    int rc;

    memset(out, 0, sizeof *out);
    rc = check_inputs(m, c, o, err, errlen);
    if (rc < 0)
        return rc;
    ctx_init(&x, m, c, o, &node_max, &out->slots);
    out->usable_bytes = c->mem_per_slot * (1 - o->mem_reserve);
    for (uint64_t tp = 1; tp <= node_max; tp *= 2) {
        ch_layout_t l = {(uint32_t)tp, 1, 1};
        char why[sizeof((ch_planner_refusal_t *)0)->reason];
        if (check_layout(&x, l, node_max, why, sizeof why) < 0) {
            ch_planner_refusal_t *r = grow_push(&ref);
            if (!r)
                goto nomem;
            memset(r, 0, sizeof *r);
            r->l.split.tp = l.tp;
            snprintf(r->reason, sizeof r->reason, "%s", why);
            continue;
        }
        const uint64_t groups = tp_groups(c, l.tp);
        for (uint64_t pp = 1; pp <= m->layers && pp <= groups; pp++) {
            l.pp = (uint32_t)pp;
            l.dp = largest_dp(o->global_batch, groups / pp);
            ch_planner_layout_t best;
            ch_planner_refusal_t no;
            if (plan_triple(&x, l, &best, &no)) {
                ch_planner_layout_t *f = grow_push(&fit);
                if (!f)
                    goto nomem;
                *f = best;
            } else {
                ch_planner_refusal_t *r = grow_push(&ref);
                if (!r)
                    goto nomem;
                *r = no;
            }
        }
    }
    if (fit.n)
        qsort(fit.v, fit.n, fit.size, cmp_layout);
    if (ref.n)
        qsort(ref.v, ref.n, ref.size, cmp_refusal);
    out->layouts = fit.v;
    out->n_layouts = fit.n;
    out->refused = ref.v;
    out->n_refused = ref.n;
    return 0;
nomem:
    free(fit.v);
    free(ref.v);
    return ch_errf(err, errlen, -ENOMEM, "out of memory");
}

void ch_planner_result_free(ch_planner_result_t *r)
{
    free(r->layouts);
    free(r->refused);
    memset(r, 0, sizeof *r);
}
