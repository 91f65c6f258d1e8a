/* Scheduler (fair share, fairshare.h) and admission; see scheduler.h. */
#include "scheduler.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/plan.h"
#include "common/util.h"
#include "coord.h"
#include "placement.h"
#include "recovery.h"
#include "straggler.h"

/* The memory one rank of spec needs (common/plan.h's peak stage) in p, with its in-memory
 * checkpoints (checkpoint.memory_every: host memory, counted into p->total_bytes too so the
 * refusal names the sum); 0 for a diag job or a plan that cannot be made (validation
 * refuses those). */
static double rank_bytes(const ch_jobspec_t *spec, ch_plan_t *p)
{
    if (spec->kind != CH_JOB_TRAIN)
        return 0;
    ch_model_cfg_t m = ch_plan_model_of(spec);
    if (ch_plan_peak(&m, ch_jobspec_layout(spec), spec->parallel.micro_batch_size,
                     spec->parallel.microbatches, spec->parallel.reshard, p) < 0)
        return 0;
    if (spec->checkpoint.memory_every > 0)
        p->total_bytes += ch_plan_memckpt_bytes(&m, ch_jobspec_layout(spec));
    return p->total_bytes;
}

/* Whether a slot of n holds a rank needing `need` bytes (its memory / its slots); a node
 * that did not report its memory is not checked. */
static int node_fits(const coord_node_t *n, double need)
{
    return need <= 0 || n->memory_bytes == 0 || (double)n->memory_bytes / n->slots >= need;
}

/* Whether n can run spec's ranks: a training job on train.device = cuda needs a node that
 * registered with a GPU (workerd --device cuda); anything else runs on any node. */
static int node_serves(const coord_node_t *n, const ch_jobspec_t *spec)
{
    return spec->kind != CH_JOB_TRAIN || spec->train.device != CH_DEVICE_CUDA ||
           n->device == CH_DEVICE_CUDA;
}

/* Nodes usable for placement of spec: alive ones (not dead when idle) that serve it, with
 * their free slots (all slots when idle), whose slots hold `need` bytes each. */
static size_t gather(coord_t *c, const ch_jobspec_t *spec, int idle, double need,
                     coord_place_node_t *pn, coord_node_t **nodes)
{
    size_t k = 0;
    for (size_t i = 0; i < c->nodes.n; i++) {
        coord_node_t *n = c->nodes.v[i];
        if (idle ? n->state == COORD_NODE_DEAD : n->state != COORD_NODE_ALIVE)
            continue;
        if (!node_fits(n, need) || !node_serves(n, spec))
            continue;
        pn[k].name = n->name;
        pn[k].rack = n->rack;
        pn[k].free_slots = idle ? n->slots : coord_node_free(n);
        if (pn[k].free_slots == 0)
            continue;
        nodes[k++] = n;
    }
    return k;
}

/* "3.2 GiB", or "512.0 MiB" below a GiB. */
static void fmt_bytes(double b, char *out, size_t len)
{
    if (b >= 1073741824.0)
        snprintf(out, len, "%.1f GiB", b / 1073741824.0);
    else
        snprintf(out, len, "%.1f MiB", b / 1048576.0);
}

/* The job's ranks need more memory than the slots of the non-dead nodes that reported
 * theirs can hold (k nodes of pn passed the filter, holding too few slots): name the
 * need, the plan's stage and the best node. */
static void memory_refusal(coord_t *c, const ch_jobspec_t *spec, const ch_plan_t *p, size_t k,
                           const coord_place_node_t *pn, char *err, size_t errlen)
{
    const coord_node_t *best = NULL;
    char need[32], per[32], mem[32];
    uint64_t slots = 0;
    for (size_t i = 0; i < c->nodes.n; i++) {
        const coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_DEAD || n->memory_bytes == 0)
            continue;
        if (!best || (double)n->memory_bytes / n->slots > (double)best->memory_bytes / best->slots)
            best = n;
    }
    for (size_t i = 0; i < k; i++)
        slots += pn[i].free_slots;
    fmt_bytes(p->total_bytes, need, sizeof need);
    fmt_bytes(best ? (double)best->memory_bytes / best->slots : 0, per, sizeof per);
    fmt_bytes(best ? (double)best->memory_bytes : 0, mem, sizeof mem);
    int n = snprintf(err, errlen, "model: needs %s per rank (stage %u of tp %u pp %u dp %u%s), ",
                     need, p->stage, spec->parallel.tp, spec->parallel.pp, spec->parallel.dp,
                     spec->checkpoint.memory_every > 0
                         ? "; with checkpoint.memory_every's copies in host memory"
                         : "");
    if (n < 0 || (size_t)n >= errlen)
        return;
    if (k == 0)
        snprintf(err + n, errlen - (size_t)n, "nodes offer at most %s per slot (%s: %s / %u slots)",
                 per, best ? best->name : "-", mem, best ? best->slots : 0);
    else
        snprintf(err + n, errlen - (size_t)n,
                 "nodes with that much per slot hold %llu slots (best %s: %s / %u slots), "
                 "the job needs %u ranks",
                 (unsigned long long)slots, best ? best->name : "-", mem, best ? best->slots : 0,
                 ch_layout_world(ch_jobspec_layout(spec)));
}

/* The vocab padded for tp (ch_layout_padded_vocab: a multiple of 128·tp from 8192 tokens,
 * else of 8·tp) must still be a 32-bit token count: each TP rank holds padded/tp rows of
 * wte and of the vocab-parallel logits. (heads % tp, layers >= pp and memory are checked
 * by ch_jobspec_validate before this.) */
static int check_vocab(const ch_jobspec_t *spec, char *err, size_t errlen)
{
    uint64_t tp = spec->parallel.tp ? spec->parallel.tp : 1;
    uint64_t mult = (spec->model.vocab >= 8192 ? 128u : 8u) * tp;
    uint64_t padded = (spec->model.vocab + mult - 1) / mult * mult;
    if (padded <= UINT32_MAX)
        return 0;
    snprintf(err, errlen,
             "model.vocab: %u padded for tp %llu (to a multiple of %llu) is %llu tokens, over "
             "the %u a 32-bit vocab holds",
             spec->model.vocab, (unsigned long long)tp, (unsigned long long)mult,
             (unsigned long long)padded, UINT32_MAX);
    return CH_E_CONFIG;
}

int coord_sched_admit(coord_t *c, const ch_jobspec_t *spec, char *err, size_t errlen)
{
    ch_layout_t l = ch_jobspec_layout(spec);
    uint32_t world = ch_layout_world(l);
    uint64_t total = 0;
    uint32_t largest = 0;
    int rc;

    if (spec->kind == CH_JOB_TRAIN && (rc = check_vocab(spec, err, errlen)) < 0)
        return rc;

    for (size_t i = 0; i < c->nodes.n; i++) {
        const coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_DEAD || !node_serves(n, spec))
            continue;
        total += n->slots;
        if (n->slots > largest)
            largest = n->slots;
    }
    if (spec->kind == CH_JOB_TRAIN && spec->train.device == CH_DEVICE_CUDA && world > total) {
        snprintf(err, errlen,
                 "train.device: cuda: world size %u (tp %u x pp %u x dp %u) needs one GPU slot "
                 "per rank; the cluster's GPU nodes (workerd --device cuda) offer %llu",
                 world, l.tp, l.pp, l.dp, (unsigned long long)total);
        return CH_E_CAPACITY;
    }
    if (world > total) {
        snprintf(err, errlen,
                 "parallel: world size %u (tp %u x pp %u x dp %u) exceeds the cluster's %llu slots",
                 world, l.tp, l.pp, l.dp, (unsigned long long)total);
        return CH_E_CAPACITY;
    }
    coord_place_node_t *pn = calloc(c->nodes.n, sizeof(*pn));
    coord_node_t **nodes = calloc(c->nodes.n, sizeof(*nodes));
    coord_place_rank_t *pl = calloc(world, sizeof(*pl));
    if (!pn || !nodes || !pl) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    size_t k = gather(c, spec, 1, 0, pn, nodes);
    rc = coord_placement(l, pn, k, pl);
    ch_plan_t plan;
    double need = rank_bytes(spec, &plan);
    if (rc == 0 && need > 0) {
        /* Against memory: the nodes whose slots hold a rank each. */
        k = gather(c, spec, 1, need, pn, nodes);
        rc = coord_placement(l, pn, k, pl);
        if (rc == CH_E_CAPACITY)
            memory_refusal(c, spec, &plan, k, pn, err, errlen);
        else if (rc < 0)
            snprintf(err, errlen, "placement: %s", ch_strerror(rc));
    } else if (rc == CH_E_CAPACITY) {
        uint64_t groups = 0;
        for (size_t i = 0; i < k; i++)
            groups += pn[i].free_slots / l.tp;
        snprintf(err, errlen,
                 "parallel.tp: a tensor-parallel group of %u ranks must sit on one node; the "
                 "cluster's nodes hold %llu such groups (largest node: %u slots), the job needs %u",
                 l.tp, (unsigned long long)groups, largest, l.pp * l.dp);
    } else if (rc < 0) {
        snprintf(err, errlen, "placement: %s", ch_strerror(rc));
    }
out:
    free(pl);
    free(nodes);
    free(pn);
    return rc;
}

/* Why j cannot start now, for its reason field. */
static void wait_reason(coord_t *c, const coord_job_t *j, const coord_place_node_t *pn, size_t k,
                        char *why, size_t len)
{
    uint64_t free_slots = 0, alive = 0;
    for (size_t i = 0; i < k; i++)
        free_slots += pn[i].free_slots;
    for (size_t i = 0; i < c->nodes.n; i++)
        if (c->nodes.v[i]->state == COORD_NODE_ALIVE)
            alive += c->nodes.v[i]->slots;
    const char *what = j->state == COORD_JOB_RECOVERING ? "restart waits" : "waits";
    if (j->spec.parallel.tp > 1)
        snprintf(why, len,
                 "%s for slots: needs %u (tensor-parallel groups of %u on one node), %llu free "
                 "of %llu on alive nodes",
                 what, j->world, j->spec.parallel.tp, (unsigned long long)free_slots,
                 (unsigned long long)alive);
    else
        snprintf(why, len, "%s for slots: needs %u, %llu free of %llu on alive nodes", what,
                 j->world, (unsigned long long)free_slots, (unsigned long long)alive);
    size_t n = strlen(why);
    if (j->state == COORD_JOB_RECOVERING && j->spec.fault.elastic && n < len &&
        !coord_sched_fits(c, &j->spec))
        snprintf(why + n, len - n,
                 "; fault.elastic: no smaller dp keeps the global batch and fits");
}

int coord_sched_fits(coord_t *c, const ch_jobspec_t *spec)
{
    ch_plan_t plan;
    double need = rank_bytes(spec, &plan);
    uint64_t groups = 0;
    uint32_t tp = spec->parallel.tp ? spec->parallel.tp : 1;
    for (size_t i = 0; i < c->nodes.n; i++) {
        const coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_ALIVE && node_fits(n, need) && node_serves(n, spec))
            groups += n->slots / tp;
    }
    /* Placement succeeds whenever the nodes hold pp x dp TP groups (placement.h). */
    return groups >= (uint64_t)spec->parallel.pp * spec->parallel.dp;
}

/* Try to start j (queued, or recovering with its old ranks gone); 1 when started, 0 when
 * it must wait (its reason says why), < 0 on error. */
static int start_head(coord_t *c, coord_job_t *j, coord_place_node_t *pn, coord_node_t **nodes)
{
    coord_place_rank_t *pl = calloc(j->world, sizeof(*pl));
    int rc;
    if (!pl)
        return -ENOMEM;
    ch_plan_t plan;
    size_t k = gather(c, &j->spec, 0, rank_bytes(&j->spec, &plan), pn, nodes);
    size_t kept = coord_straggler_avoid(j, pn, nodes, k);
    rc = coord_placement(ch_jobspec_layout(&j->spec), pn, kept, pl);
    if (rc == CH_E_CAPACITY && kept < k) /* the spare went: the slow node rather than none */
        rc = coord_placement(ch_jobspec_layout(&j->spec), pn, k, pl);
    if (rc == CH_E_CAPACITY) {
        char why[384];
        wait_reason(c, j, pn, k, why, sizeof(why));
        coord_recovery_waiting(c, j, why);
        rc = 0;
        goto out;
    }
    if (rc < 0)
        goto out;
    rc = coord_job_start(c, j, pl, nodes, k);
    if (rc == 0)
        rc = 1;
out:
    free(pl);
    return rc;
}

/* The queued jobs in fair-share order (fairshare.h); NULL when out of memory. */
static coord_job_t **queue_order(coord_t *c, size_t *n)
{
    coord_job_t **q = malloc((c->jobs.n ? c->jobs.n : 1) * sizeof(*q));
    *n = 0;
    if (!q)
        return NULL;
    for (size_t i = 0; i < c->jobs.n; i++)
        if (c->jobs.v[i]->state == COORD_JOB_QUEUED)
            q[(*n)++] = c->jobs.v[i];
    coord_share_order(c, q, *n);
    return q;
}

/* Start queued jobs in order while the next one fits; each one left gets its place and
 * why it waits. */
static void run_queue(coord_t *c, coord_place_node_t *pn, coord_node_t **nodes)
{
    size_t n = 0;
    coord_job_t **q = queue_order(c, &n);
    const coord_job_t *head = NULL;
    uint32_t place = 0;
    char why[384];
    if (!q)
        return;
    for (size_t i = 0; i < n; i++) {
        coord_job_t *j = q[i];
        if (coord_share_hold(c, j, why, sizeof(why))) {
            j->queue_place = ++place;
            coord_recovery_waiting(c, j, why);
            continue;
        }
        if (head) {
            j->queue_place = ++place;
            snprintf(why, sizeof(why),
                     "waits: place %" PRIu32 " in the queue, behind %s (order: priority, then "
                     "each user's fair share of recent use, then first in, first out)",
                     place, head->id);
            coord_recovery_waiting(c, j, why);
            continue;
        }
        int rc = start_head(c, j, pn, nodes);
        if (rc < 0)
            CH_LOGE("sched", "job=%s cannot start: %s", j->id, ch_strerror(rc));
        if (rc == 1) {
            j->queue_place = 0;
            coord_share_started(c, j);
            continue;
        }
        j->queue_place = ++place;
        /* The next job in order waits, so does everyone behind it (no backfill: a big
         * job is never starved); unless it cannot fit the alive nodes at all (nodes died
         * since its admission), which would block the queue for good. */
        if (coord_sched_fits(c, &j->spec))
            head = j;
    }
    free(q);
}

void coord_sched_run(coord_t *c)
{
    coord_place_node_t *pn = NULL;
    coord_node_t **nodes = NULL;

    coord_share_tick(c, ch_now_ms());
    if (c->nodes.n == 0)
        return;
    pn = calloc(c->nodes.n, sizeof(*pn));
    nodes = calloc(c->nodes.n, sizeof(*nodes));
    if (!pn || !nodes)
        goto out;
    /* Restarts first: their jobs held the slots before anything queued now. */
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        if (j->state != COORD_JOB_RECOVERING || !coord_recovery_ready(c, j))
            continue;
        coord_recovery_shrink(c,
                              j); /* fault.elastic: a smaller layout when this one no longer fits */
        int rc = start_head(c, j, pn, nodes);
        if (rc < 0)
            CH_LOGE("sched", "job=%s cannot restart: %s", j->id, ch_strerror(rc));
    }
    run_queue(c, pn, nodes);
out:
    free(nodes);
    free(pn);
}
