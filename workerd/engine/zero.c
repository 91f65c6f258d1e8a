/* ZeRO-3 for one rank's stage (zero.h). */
#include "workerd/engine/zero.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/log.h"

/* One tensor of a block: where it sits in the block's flat range. The same for every
 * block of the stage (same shapes and TP slice), so kept once. */
typedef struct zero_tensor {
    size_t off, numel;
    int decay, replicated;
    eng_slice_t slice;
    const char *suffix; /* after "h.<l>." */
} zero_tensor_t;

struct eng_zero {
    eng_model_t *m;
    const eng_backend_t *be;
    wrk_coll_group_t *dp; /* NULL: a group of one */
    wrk_coll_t *coll;     /* dp's context (buffers the collectives read); NULL with dp */
    uint32_t dpn, d;
    ch_reshard_t policy;
    uint32_t first, nb; /* the stage's blocks [first, first + nb) */
    size_t count, S, padded;
    zero_tensor_t *tensors; /* the tensors of one block, in block order */
    size_t ntensors;
    float *p, *g, *am, *av; /* owned shards: nb * S each, block i at i * S */
    /* gathered buffers: per-use 2, per-step nb; which block each holds (-1: none), whether
     * its contents are there, and its gather in flight */
    uint32_t nbuf;
    float **buf;
    int64_t *holds;
    uint8_t *valid;
    wrk_coll_req_t **req;
    float *full_g; /* padded: the block's unsharded gradient during its backward */
};

static int zalloc(const eng_zero_t *z, size_t floats, float **out)
{
    void *p = NULL;
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    int rc = z->coll ? wrk_coll_mem_alloc(z->coll, bytes, &p) : z->be->alloc(z->be, bytes, &p);
    *out = p;
    /* the collectives' memory is the backend's kind (host for UCX, the GPU's for NCCL) */
    return rc == 0 ? z->be->memset(z->be, p, 0, bytes) : rc;
}

static void zfree(const eng_zero_t *z, float *p)
{
    if (!p)
        return;
    if (z->coll)
        wrk_coll_mem_free(z->coll, p);
    else
        z->be->free(z->be, p);
}

/* Wait for buffer s's gather in flight, if any. */
static int drain(eng_zero_t *z, uint32_t s)
{
    int rc = 0;
    if (z->req[s]) {
        rc = wrk_coll_wait(z->req[s], -1);
        wrk_coll_req_free(z->req[s]);
        z->req[s] = NULL;
        z->valid[s] = rc == 0;
    }
    return rc;
}

static int drain_all(eng_zero_t *z)
{
    int rc = 0;
    for (uint32_t s = 0; s < z->nbuf; s++) {
        int r = drain(z, s);
        rc = rc < 0 ? rc : r;
    }
    return rc;
}

static uint32_t slot_of(const eng_zero_t *z, uint32_t l)
{
    uint32_t i = l - z->first;
    return z->policy == CH_RESHARD_PER_STEP ? i : i & 1u;
}

/* Start gathering block l into its buffer; wait for it when `now`. */
static int gather(eng_zero_t *z, uint32_t l, int now)
{
    uint32_t s = slot_of(z, l);
    int rc = drain(z, s); /* whatever the buffer was receiving */
    if (rc < 0)
        return rc;
    if (z->holds[s] == (int64_t)l && z->valid[s])
        return 0;
    const float *shard = z->p + (size_t)(l - z->first) * z->S;
    z->holds[s] = l;
    z->valid[s] = 0;
    if (!z->dp) {
        rc = z->be->copy(z->be, z->buf[s], shard, z->count * sizeof(float), ENG_COPY_D2D);
        z->valid[s] = rc == 0;
        return rc;
    }
    rc = wrk_coll_allgather(z->dp, shard, z->buf[s], z->S, WRK_COLL_F32, now ? NULL : &z->req[s]);
    if (rc == 0 && now)
        z->valid[s] = 1;
    return rc;
}

/* Block l's full parameters in place for its pass (dir +1 forward, -1 backward), and the
 * next block of the pass prefetched. */
static int use(eng_zero_t *z, uint32_t l, int dir)
{
    uint32_t s = slot_of(z, l);
    int rc = 0;
    if (z->holds[s] == (int64_t)l && z->req[s])
        rc = drain(z, s);
    else if (!(z->holds[s] == (int64_t)l && z->valid[s]))
        rc = gather(z, l, 1);
    if (rc == 0)
        rc = eng_model_set_block_params(z->m, l, z->buf[s]);
    int64_t next = (int64_t)l + dir;
    if (rc == 0 && next >= (int64_t)z->first && next < (int64_t)(z->first + z->nb)) {
        uint32_t ns = slot_of(z, (uint32_t)next);
        if (!(z->holds[ns] == next && (z->valid[ns] || z->req[ns])))
            rc = gather(z, (uint32_t)next, 0);
    }
    return rc;
}

/* The block's unsharded gradient summed over the DP group; this rank's shard of it added
 * to its reduced gradient. */
static int scatter(eng_zero_t *z, uint32_t l)
{
    float *g = z->g + (size_t)(l - z->first) * z->S;
    const float *part = z->full_g;
    int rc = 0;
    if (z->dp) {
        /* in place: this rank's shard of the sum lands on its own range */
        part = z->full_g + (size_t)z->d * z->S;
        rc = wrk_coll_reduce_scatter(z->dp, z->full_g, (float *)part, z->S, WRK_COLL_F32,
                                     WRK_COLL_SUM, NULL);
    }
    if (rc < 0)
        return rc;
    if (z->be->axpy) {
        z->be->axpy(z->be, g, part, z->S, 1.0f); /* g + 1 * part: the sum's bits */
    } else if (z->be->host_memory) {
        for (size_t k = 0; k < z->S; k++)
            g[k] += part[k];
    } else {
        return -ENOTSUP; /* eng_zero_create refuses such a backend */
    }
    return 0;
}

static int hook(void *ctx, uint32_t l, eng_block_event_t ev)
{
    eng_zero_t *z = ctx;
    int rc = 0;
    switch (ev) {
    case ENG_BLOCK_FORWARD:
        rc = use(z, l, +1);
        break;
    case ENG_BLOCK_BACKWARD:
        rc = use(z, l, -1);
        if (rc == 0)
            rc = z->be->memset(z->be, z->full_g, 0, z->padded * sizeof(float));
        if (rc == 0)
            rc = eng_model_set_block_grads(z->m, l, z->full_g);
        break;
    case ENG_BLOCK_BACKWARD_DONE:
        rc = scatter(z, l);
        eng_model_set_block_grads(z->m, l, NULL);
        break;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// create / destroy

/* The tensors of block `first` in block order, from the model's table. */
static int index_tensors(eng_zero_t *z)
{
    const eng_model_t *m = z->m;
    z->tensors = calloc(16, sizeof *z->tensors);
    if (!z->tensors)
        return -ENOMEM;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "h.%u.", z->first); /* the suffix follows */
    for (size_t i = 0; i < eng_model_ntensors(m) && z->ntensors < 16; i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        if (t->block != (int)z->first)
            continue;
        zero_tensor_t *zt = &z->tensors[z->ntensors++];
        zt->off = t->offset; /* within the block: external_blocks */
        zt->numel = t->numel;
        zt->decay = t->decay;
        zt->replicated = t->split == ENG_SPLIT_NONE;
        zt->suffix = t->name + plen;
        zt->slice.ndim = t->ndim;
        zt->slice.shape[0] = t->shape[0];
        zt->slice.shape[1] = t->shape[1];
        memcpy(zt->slice.lo, t->lo, sizeof t->lo);
        memcpy(zt->slice.hi, t->hi, sizeof t->hi);
        zt->slice.parts = t->parts;
    }
    return 0;
}

int eng_zero_create(eng_model_t *m, wrk_coll_group_t *dp, ch_reshard_t policy, eng_zero_t **out)
{
    *out = NULL;
    eng_model_part_t part = eng_model_part(m);
    float *base = NULL;
    size_t count = 0;
    const eng_backend_t *be = eng_model_backend(m);
    if (part.last <= part.first)
        return -EINVAL;
    if (!be->host_memory && !be->axpy)
        return -ENOTSUP;
    if (eng_model_block_params(m, part.first, &base, &count) < 0 || base != NULL)
        return -EINVAL; /* not created with external_blocks */
    eng_zero_t *z = calloc(1, sizeof *z);
    if (!z)
        return -ENOMEM;
    z->m = m;
    z->be = be;
    z->dp = dp;
    z->coll = dp ? wrk_coll_group_context(dp) : NULL;
    z->dpn = dp ? wrk_coll_group_size(dp) : 1;
    z->d = dp ? wrk_coll_group_index(dp) : 0;
    z->policy = policy;
    z->first = part.first;
    z->nb = part.last - part.first;
    z->count = count;
    z->S = ch_layout_shard_len(count, z->dpn);
    z->padded = z->S * z->dpn;
    z->nbuf = policy == CH_RESHARD_PER_STEP ? z->nb : (z->nb < 2 ? z->nb : 2);
    int rc = index_tensors(z);
    float *tmp = NULL;
    if (rc < 0)
        goto fail;
    rc = -ENOMEM;
    z->buf = calloc(z->nbuf, sizeof *z->buf);
    z->holds = malloc(z->nbuf * sizeof *z->holds);
    z->valid = calloc(z->nbuf, 1);
    z->req = calloc(z->nbuf, sizeof *z->req);
    tmp = malloc(z->padded * sizeof *tmp);
    if (!z->buf || !z->holds || !z->valid || !z->req || !tmp)
        goto fail;
    size_t shards = (size_t)z->nb * z->S;
    CH_CHECK_GOTO(zalloc(z, shards, &z->p), rc, fail);
    CH_CHECK_GOTO(zalloc(z, shards, &z->g), rc, fail);
    CH_CHECK_GOTO(zalloc(z, shards, &z->am), rc, fail);
    CH_CHECK_GOTO(zalloc(z, shards, &z->av), rc, fail);
    CH_CHECK_GOTO(zalloc(z, z->padded, &z->full_g), rc, fail);
    for (uint32_t s = 0; s < z->nbuf; s++) {
        CH_CHECK_GOTO(zalloc(z, z->padded, &z->buf[s]), rc, fail);
        z->holds[s] = -1;
    }
    /* each rank makes its own shard of the initial parameters (the padding stays zero) */
    memset(tmp, 0, z->padded * sizeof *tmp);
    size_t lo = (size_t)z->d * z->S;
    for (uint32_t i = 0; i < z->nb; i++) {
        CH_CHECK_GOTO(eng_model_init_block(m, z->first + i, tmp), rc, fail);
        CH_CHECK_GOTO(be->copy(be, z->p + (size_t)i * z->S, tmp + lo, z->S * sizeof *tmp,
                               be->host_memory ? ENG_COPY_D2D : ENG_COPY_H2D),
                      rc, fail);
    }
    free(tmp);
    eng_model_set_block_hook(m, hook, z);
    *out = z;
    return 0;
fail:
    free(tmp);
    eng_zero_destroy(z);
    return rc;
}

void eng_zero_destroy(eng_zero_t *z)
{
    if (!z)
        return;
    if (z->req)
        drain_all(z);
    eng_model_set_block_hook(z->m, NULL, NULL);
    for (uint32_t i = 0; i < z->nb; i++) {
        eng_model_set_block_params(z->m, z->first + i, NULL);
        eng_model_set_block_grads(z->m, z->first + i, NULL);
    }
    for (uint32_t s = 0; z->buf && s < z->nbuf; s++)
        zfree(z, z->buf[s]);
    zfree(z, z->p);
    zfree(z, z->g);
    zfree(z, z->am);
    zfree(z, z->av);
    zfree(z, z->full_g);
    free(z->buf);
    free(z->holds);
    free(z->valid);
    free(z->req);
    free(z->tensors);
    free(z);
}

// ----------------------------------------------------------------------------
// the step

void eng_zero_begin_step(eng_zero_t *z)
{
    drain_all(z);
    for (uint32_t s = 0; s < z->nbuf; s++) {
        z->holds[s] = -1;
        z->valid[s] = 0;
    }
    for (uint32_t i = 0; i < z->nb; i++)
        eng_model_set_block_params(z->m, z->first + i, NULL);
}

/* For each tensor t of a block that the owned shard covers: [lo, hi), the covered range
 * in block offsets (the shard starts at block offset d * S). */
#define FOR_EACH_OWNED(z, t, lo, hi)                                                               \
    for (size_t t##_i = 0, lo, hi; t##_i < (z)->ntensors; t##_i++)                                 \
        if ((t = &(z)->tensors[t##_i]),                                                            \
            (lo = t->off > (size_t)(z)->d * (z)->S ? t->off : (size_t)(z)->d * (z)->S),            \
            (hi = t->off + t->numel < (size_t)((z)->d + 1) * (z)->S                                \
                      ? t->off + t->numel                                                          \
                      : (size_t)((z)->d + 1) * (z)->S),                                            \
            lo < hi)

double eng_zero_sumsq(const eng_zero_t *z, int count_replicated)
{
    /* pieces that follow each other in the shards are summed as one run: one backend call
     * (on a GPU, one result copied back) per run, not per tensor */
    double sq = 0;
    size_t base = (size_t)z->d * z->S, run_lo = 0, run_hi = 0;
    for (uint32_t i = 0; i < z->nb; i++) {
        const zero_tensor_t *t;
        FOR_EACH_OWNED(z, t, lo, hi)
        {
            if (t->replicated && !count_replicated)
                continue;
            size_t at = (size_t)i * z->S + (lo - base); /* in the shards' slab */
            if (at != run_hi) {
                sq += eng_sumsq_on(z->be, z->g + run_lo, run_hi - run_lo);
                run_lo = at;
            }
            run_hi = at + (hi - lo);
        }
    }
    return sq + eng_sumsq_on(z->be, z->g + run_lo, run_hi - run_lo);
}

void eng_zero_adamw(eng_zero_t *z, const eng_optim_t *o, double lr, float grad_coef)
{
    const eng_backend_t *be = z->be;
    size_t base = (size_t)z->d * z->S;
    drain_all(z); /* no gather may still read the shards */
    for (uint32_t i = 0; i < z->nb; i++) {
        const zero_tensor_t *t;
        FOR_EACH_OWNED(z, t, lo, hi)
        {
            size_t at = (size_t)i * z->S + (lo - base);
            eng_adamw_piece(be, o, z->p + at, z->g + at, z->am + at, z->av + at, hi - lo, lr,
                            t->decay ? o->weight_decay : 0.0, grad_coef, 1);
        }
    }
}

void eng_zero_drop_grads(eng_zero_t *z)
{
    drain_all(z);
    z->be->memset(z->be, z->g, 0, (size_t)z->nb * z->S * sizeof(float));
}

int eng_zero_pieces(const eng_zero_t *z, eng_ckpt_piece_t **out, size_t *n)
{
    size_t cap = (size_t)z->nb * z->ntensors, k = 0;
    eng_ckpt_piece_t *pc = calloc(cap ? cap : 1, sizeof *pc);
    if (!pc)
        return -ENOMEM;
    size_t base = (size_t)z->d * z->S;
    for (uint32_t i = 0; i < z->nb; i++) {
        const zero_tensor_t *t;
        FOR_EACH_OWNED(z, t, lo, hi)
        {
            size_t at = (size_t)i * z->S + (lo - base);
            eng_ckpt_piece_t *q = &pc[k++];
            snprintf(q->name, sizeof q->name, "h.%u.%s", z->first + i, t->suffix);
            q->slice = t->slice;
            q->a = lo - t->off;
            q->b = hi - t->off;
            q->p = z->p + at;
            q->m = z->am + at;
            q->v = z->av + at;
        }
    }
    *out = pc;
    *n = k;
    return 0;
}

void eng_zero_bytes(const eng_zero_t *z, size_t *state, size_t *gathered)
{
    *state = 4 * (size_t)z->nb * z->S * sizeof(float);
    *gathered = ((size_t)z->nbuf + 1) * z->padded * sizeof(float);
}

size_t eng_zero_shard_len(const eng_zero_t *z)
{
    return z->S;
}
