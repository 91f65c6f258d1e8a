/* ZeRO-3 for one rank's stage (zero.h). */
#include "workerd/engine/zero.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/log.h"
#include "kernels/bf16.h"
#include "workerd/engine/backend_bf16.h"
#include "workerd/engine/coll_bf16.h"
#include "workerd/engine/mem.h"

struct eng_zero {
    eng_model_t *m;
    const eng_backend_t *be;
    wrk_coll_group_t *dp; /* NULL: a group of one */
    wrk_coll_t *coll;     /* dp's context (buffers the collectives read); NULL with dp */
    uint32_t dpn, d;
    ch_reshard_t policy;
    eng_model_part_t part; /* the stage's blocks: nb of them, in the part's order */
    uint32_t nb;
    size_t count, S, padded;
    /* owned shards, the table's ENG_STORE_SHARDS: those of the tensors outside blocks
     * (`rest` floats), then the blocks', the block at position i (eng_part_pos) at rest + i * S */
    size_t rest;
    float *p, *g, *am, *av;
    /* gathered buffers: per-use 2, per-step nb; which block each holds (-1: none), whether
     * its contents are there, and its gather in flight */
    uint32_t nbuf;
    float **buf;
    int64_t *holds;
    uint8_t *valid;
    wrk_coll_req_t **req;
    /* padded: a block's unsharded gradient during its backward, two used alternately (one
     * with a group): block l's reduce-scatter reads fg[c] while the next block's backward
     * writes fg[c ^ 1]; it is waited, and its shard added, when that backward ends */
    float *fg[2];
    uint32_t cur;           /* the buffer the next backward writes */
    wrk_coll_req_t *rs_req; /* the reduce-scatter in flight; NULL: none (or waited) */
    int64_t rs_block;       /* its block; -1: nothing pending */
    uint32_t rs_buf;        /* its buffer */
    int bf16_reduce;     /* optim.grad_reduce = bf16: z->be is a bf16 wrapper's (backend_bf16.h) */
    eng_bf16_msg_t rs16; /* its packed reduce-scatters (host memory) */
    /* train.precision = bf16 (eng_zero_set_bf16_gather): the gathers move bf16, through per
     * slot packed buffers (padded 2-byte elements) and one for the tensors outside blocks
     * (pk_rest_len elements); NULL: fp32 gathers. Exact: a bf16 run's kernels read every
     * parameter rounded to bf16 (backend_bf16.h), and rounding twice is rounding once */
    kn_bf16_t **pk;
    kn_bf16_t *pk_rest;
    size_t pk_rest_len;
};

/* floats of kind (mem.h), zeroed: the collectives' memory, or the backend's without a
 * group */
static int zalloc(const eng_zero_t *z, eng_mem_kind_t kind, size_t floats, float **out)
{
    void *p = NULL;
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    const eng_backend_t *be = eng_mem_view(z->be, kind);
    int rc = z->coll ? wrk_coll_mem_alloc(z->coll, bytes, &p) : be->alloc(be, bytes, &p);
    *out = p;
    if (rc == 0 && z->coll)
        eng_mem_note(z->be, kind, p, bytes);
    /* the collectives' memory is the backend's kind (host for UCX, the GPU's for NCCL) */
    return rc == 0 ? z->be->memset(z->be, p, 0, bytes) : rc;
}

static void zfree(const eng_zero_t *z, float *p)
{
    if (!p)
        return;
    if (z->coll) {
        eng_mem_forget(z->be, p);
        wrk_coll_mem_free(z->coll, p);
    } else {
        z->be->free(z->be, p);
    }
}

/* Wait for buffer s's gather in flight, if any: in stream order (the kernels that read the
 * buffer wait on the device, NCCL), on the host when the host unpacks it (bf16). */
static int drain(eng_zero_t *z, uint32_t s)
{
    int rc = 0;
    if (z->req[s]) {
        /* the kernels (or the cast back) reading the buffer wait on the device */
        rc = wrk_coll_wait_stream(z->req[s], -1);
        wrk_coll_req_free(z->req[s]);
        z->req[s] = NULL;
        if (rc == 0 && z->pk)
            rc = eng_bf16_cast(z->be, z->buf[s], z->pk[s], z->padded, 0);
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
    uint32_t i = (uint32_t)eng_part_pos(&z->part, l);
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
    const float *shard = z->p + z->rest + (size_t)eng_part_pos(&z->part, l) * z->S;
    z->holds[s] = l;
    z->valid[s] = 0;
    if (!z->dp) {
        rc = z->be->copy(z->be, z->buf[s], shard, z->count * sizeof(float), ENG_COPY_D2D);
        z->valid[s] = rc == 0;
        return rc;
    }
    if (z->pk) { /* in place: this rank's packed shard at its own block */
        kn_bf16_t *mine = z->pk[s] + (size_t)z->d * z->S;
        rc = eng_bf16_cast(z->be, mine, shard, z->S, 1);
        if (rc == 0)
            rc = wrk_coll_allgather(z->dp, mine, z->pk[s], z->S, WRK_COLL_BF16, &z->req[s]);
        if (now) /* the cast back waits on the device */
            rc = wrk_coll_ordered(rc, &z->req[s]);
        if (rc == 0 && now)
            rc = eng_bf16_cast(z->be, z->buf[s], z->pk[s], z->padded, 0);
    } else {
        rc = wrk_coll_allgather(z->dp, shard, z->buf[s], z->S, WRK_COLL_F32, &z->req[s]);
        if (now) { /* used at once: its kernels wait on the device, the host goes on */
            rc = wrk_coll_ordered(rc, &z->req[s]);
        }
    }
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
    if (rc == 0 && next >= 0 && eng_part_pos(&z->part, (uint32_t)next) >= 0) {
        uint32_t ns = slot_of(z, (uint32_t)next);
        if (!(z->holds[ns] == next && (z->valid[ns] || z->req[ns])))
            rc = gather(z, (uint32_t)next, 0);
    }
    return rc;
}

/* full (dpn * S floats) reduce-scattered over the DP group into part, started: *req is
 * what the caller waits (in stream order) before it reads part, NULL when it is there
 * already; grad_reduce = bf16: moved and summed as bf16 (coll_bf16.h, there at return),
 * or on a backend that cannot cast, its inputs rounded (and its output, at rs_finish). */
static int rs_start(eng_zero_t *z, float *full, float *part, size_t S, wrk_coll_req_t **req)
{
    *req = NULL;
    if (z->bf16_reduce && eng_bf16_castable(z->be)) /* its buffer: eng_zero_set_bf16_reduce */
        return eng_bf16_reduce_scatter(z->dp, full, part, S, &z->rs16);
    if (z->bf16_reduce)
        eng_backend_bf16_round(z->be, full, (size_t)z->dpn * S);
    return wrk_coll_reduce_scatter(z->dp, full, part, S, WRK_COLL_F32, WRK_COLL_SUM, req);
}

/* The reduce-scatter rs_start began (req, may be NULL) waited in stream order (the axpy
 * after it waits on the device, not the host), and this rank's shard part of the sum (S
 * floats) added to its reduced gradient g. */
static int rs_finish(eng_zero_t *z, wrk_coll_req_t **req, float *part, size_t S, float *g)
{
    int rc = wrk_coll_ordered(0, req); /* frees it, *req = NULL */
    if (rc < 0)
        return rc;
    if (z->dp && z->bf16_reduce && !eng_bf16_castable(z->be))
        eng_backend_bf16_round(z->be, part, S);
    if (z->be->axpy) {
        z->be->axpy(z->be, g, part, S, 1.0f); /* g + 1 * part: the sum's bits */
    } else if (z->be->host_memory) {
        for (size_t k = 0; k < S; k++)
            g[k] += part[k];
    } else {
        return -ENOTSUP; /* eng_zero_create refuses such a backend */
    }
    return 0;
}

/* A unit's unsharded gradient full (dpn * S floats) summed over the DP group in place;
 * this rank's shard of it added to its reduced gradient g (S floats). */
static int reduce_into(eng_zero_t *z, float *full, size_t S, float *g)
{
    /* in place: this rank's shard of the sum lands on its own range */
    float *part = z->dp ? full + (size_t)z->d * S : full;
    wrk_coll_req_t *r = NULL;
    int rc = z->dp ? rs_start(z, full, part, S, &r) : 0;
    if (rc == 0)
        return rs_finish(z, &r, part, S, g);
    wrk_coll_req_free(r);
    return rc;
}

/* The block's reduce-scatter still pending, if any: waited and its shard added. The adds
 * into the reduced gradients keep the order of the blocks' backwards (at most one
 * pending, finished before the next starts waiting), so a block's micro-batches add in
 * the same order as when each was reduced at once: the same bits. */
static int rs_drain(eng_zero_t *z)
{
    if (z->rs_block < 0)
        return 0;
    size_t at = (size_t)eng_part_pos(&z->part, (uint32_t)z->rs_block) * z->S;
    int rc =
        rs_finish(z, &z->rs_req, z->fg[z->rs_buf] + (size_t)z->d * z->S, z->S, z->g + z->rest + at);
    z->rs_block = -1; /* rs_finish freed the request */
    return rc;
}

/* After block l's backward: its reduce-scatter started, not waited (the next block's
 * backward writes the other buffer meanwhile), and the previous block's finished. A group
 * of one adds at once. */
static int scatter(eng_zero_t *z, uint32_t l)
{
    uint32_t c = z->cur;
    float *g = z->g + z->rest + (size_t)eng_part_pos(&z->part, l) * z->S;
    if (!z->dp)
        return reduce_into(z, z->fg[c], z->S, g);
    wrk_coll_req_t *r = NULL;
    int rc = rs_start(z, z->fg[c], z->fg[c] + (size_t)z->d * z->S, z->S, &r);
    int prev = rs_drain(z); /* the older first: the adds' order */
    if (rc < 0) {
        wrk_coll_req_free(r);
        return rc;
    }
    z->rs_req = r;
    z->rs_block = l;
    z->rs_buf = c;
    z->cur = c ^ 1u;
    return prev;
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
    case ENG_BLOCK_BACKWARD_INPUT:
    case ENG_BLOCK_BACKWARD_WEIGHT:
        /* a split backward's input pass reads the parameters, its weight pass writes the
         * gradient: one block's unsharded gradient at a time either way */
        if (ev != ENG_BLOCK_BACKWARD_WEIGHT)
            rc = use(z, l, -1);
        if (rc == 0 && ev != ENG_BLOCK_BACKWARD_INPUT) /* its reduce-scatter was waited */
            rc = z->be->memset(z->be, z->fg[z->cur], 0, z->padded * sizeof(float));
        if (rc == 0 && ev != ENG_BLOCK_BACKWARD_INPUT)
            rc = eng_model_set_block_grads(z->m, l, z->fg[z->cur]);
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

/* Where the table puts this rank's shards (model.h, external_blocks with dp): z->rest,
 * the floats of the tensors outside blocks before the first block's shard; 0 when the
 * table shards the blocks otherwise than over z's group (S per block). */
static int table_agrees(eng_zero_t *z)
{
    for (size_t i = 0; i < eng_model_ntensors(z->m); i++) {
        const eng_tensor_t *t = eng_model_tensor(z->m, i);
        if (t->block != (int)z->part.first)
            continue;
        z->rest = t->shard_base;
        return t->dp_sharded && t->shard_len == z->S;
    }
    return 0;
}

/* Each tensor outside blocks is a unit of its own: in the model's slab at its offset,
 * padded to dpn * shard_len; this rank's shard at shard_base. */
#define FOR_EACH_REST(z, t)                                                                        \
    for (size_t t##_i = 0; t##_i < eng_model_ntensors((z)->m); t##_i++)                            \
        if ((t = eng_model_tensor((z)->m, t##_i))->block < 0)

/* The owned shards of the tensors outside blocks, from the model's slab. */
static int init_rest(eng_zero_t *z)
{
    const float *params = eng_model_params(z->m);
    const eng_tensor_t *t;
    int rc = 0;
    FOR_EACH_REST(z, t)
    {
        size_t at = t->offset + (size_t)z->d * t->shard_len;
        if (rc == 0)
            rc = z->be->copy(z->be, z->p + t->shard_base, params + at, t->shard_len * sizeof(float),
                             ENG_COPY_D2D);
    }
    return rc;
}

int eng_zero_create(eng_model_t *m, wrk_coll_group_t *dp, ch_reshard_t policy, eng_zero_t **out)
{
    *out = NULL;
    eng_model_part_t part = eng_model_part(m);
    float *base = NULL;
    size_t count = 0;
    const eng_backend_t *be = eng_model_backend(m);
    if (part.nblocks == 0)
        return -EINVAL;
    if (!be->host_memory && !be->axpy)
        return -ENOTSUP;
    if (eng_model_block_params(m, part.first, &base, &count) < 0 || base != NULL)
        return -EINVAL; /* not created with external_blocks */
    eng_zero_t *z = calloc(1, sizeof *z);
    if (!z)
        return -ENOMEM;
    z->m = m;
    z->rs_block = -1; /* no reduce-scatter pending (eng_zero_destroy reads it) */
    z->be = be;
    z->dp = dp;
    z->coll = dp ? wrk_coll_group_context(dp) : NULL;
    z->dpn = dp ? wrk_coll_group_size(dp) : 1;
    z->d = dp ? wrk_coll_group_index(dp) : 0;
    z->policy = policy;
    z->part = part;
    z->nb = part.nblocks;
    z->count = count;
    z->S = ch_layout_shard_len(count, z->dpn);
    z->padded = z->S * z->dpn;
    z->nbuf = policy == CH_RESHARD_PER_STEP ? z->nb : (z->nb < 2 ? z->nb : 2);
    int rc = table_agrees(z) ? -ENOMEM : -EINVAL;
    float *tmp = NULL;
    if (rc == -EINVAL)
        goto fail;
    z->buf = calloc(z->nbuf, sizeof *z->buf);
    z->holds = malloc(z->nbuf * sizeof *z->holds);
    z->valid = calloc(z->nbuf, 1);
    z->req = calloc(z->nbuf, sizeof *z->req);
    tmp = malloc(z->padded * sizeof *tmp);
    if (!z->buf || !z->holds || !z->valid || !z->req || !tmp)
        goto fail;
    size_t shards = z->rest + (size_t)z->nb * z->S;
    CH_CHECK_GOTO(zalloc(z, ENG_MEM_PARAMS, shards, &z->p), rc, fail);
    CH_CHECK_GOTO(zalloc(z, ENG_MEM_GRADS, shards, &z->g), rc, fail);
    CH_CHECK_GOTO(zalloc(z, ENG_MEM_OPTIM, shards, &z->am), rc, fail);
    CH_CHECK_GOTO(zalloc(z, ENG_MEM_OPTIM, shards, &z->av), rc, fail);
    for (uint32_t k = 0; k < (dp ? 2u : 1u); k++)
        CH_CHECK_GOTO(zalloc(z, ENG_MEM_GATHERED, z->padded, &z->fg[k]), rc, fail);
    if (!dp)
        z->fg[1] = z->fg[0]; /* a group of one reduces at once: one buffer */
    for (uint32_t s = 0; s < z->nbuf; s++) {
        CH_CHECK_GOTO(zalloc(z, ENG_MEM_GATHERED, z->padded, &z->buf[s]), rc, fail);
        z->holds[s] = -1;
    }
    /* each rank makes its own shard of the initial parameters (the padding stays zero) */
    memset(tmp, 0, z->padded * sizeof *tmp);
    size_t lo = (size_t)z->d * z->S;
    for (uint32_t i = 0; i < z->nb; i++) {
        CH_CHECK_GOTO(eng_model_init_block(m, eng_part_block(&part, i), tmp), rc, fail);
        CH_CHECK_GOTO(be->copy(be, z->p + z->rest + (size_t)i * z->S, tmp + lo, z->S * sizeof *tmp,
                               be->host_memory ? ENG_COPY_D2D : ENG_COPY_H2D),
                      rc, fail);
    }
    CH_CHECK_GOTO(init_rest(z), rc, fail);
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
    rs_drain(z);
    eng_model_set_block_hook(z->m, NULL, NULL);
    for (uint32_t i = 0; i < z->nb; i++) {
        eng_model_set_block_params(z->m, eng_part_block(&z->part, i), NULL);
        eng_model_set_block_grads(z->m, eng_part_block(&z->part, i), NULL);
    }
    for (uint32_t s = 0; z->buf && s < z->nbuf; s++)
        zfree(z, z->buf[s]);
    for (uint32_t s = 0; z->pk && s < z->nbuf; s++)
        zfree(z, (float *)z->pk[s]);
    zfree(z, (float *)z->pk_rest);
    free(z->pk);
    eng_bf16_msg_free(&z->rs16);
    zfree(z, z->p);
    zfree(z, z->g);
    zfree(z, z->am);
    zfree(z, z->av);
    zfree(z, z->fg[0]);
    if (z->fg[1] != z->fg[0])
        zfree(z, z->fg[1]);
    free(z->buf);
    free(z->holds);
    free(z->valid);
    free(z->req);
    free(z);
}

// ----------------------------------------------------------------------------
// the step

void eng_zero_begin_step(eng_zero_t *z)
{
    drain_all(z);
    rs_drain(z); /* an evaluation's last block (its gradient zero) */
    for (uint32_t s = 0; s < z->nbuf; s++) {
        z->holds[s] = -1;
        z->valid[s] = 0;
    }
    for (uint32_t i = 0; i < z->nb; i++)
        eng_model_set_block_params(z->m, eng_part_block(&z->part, i), NULL);
}

void eng_zero_end_step(eng_zero_t *z)
{
    drain_all(z);
    rs_drain(z);
}

/* One tensor outside blocks gathered in bf16 (shard_len elements a member) into full. */
static int gather_rest_bf16(eng_zero_t *z, const float *shard, float *full, size_t shard_len)
{
    kn_bf16_t *mine = z->pk_rest + (size_t)z->d * shard_len;
    int rc = eng_bf16_cast(z->be, mine, shard, shard_len, 1);
    wrk_coll_req_t *r = NULL; /* the cast back waits on the device */
    if (rc == 0)
        rc = wrk_coll_ordered(
            wrk_coll_allgather(z->dp, mine, z->pk_rest, shard_len, WRK_COLL_BF16, &r), &r);
    if (rc == 0)
        rc = eng_bf16_cast(z->be, full, z->pk_rest, (size_t)z->dpn * shard_len, 0);
    return rc;
}

int eng_zero_gather_rest(eng_zero_t *z)
{
    float *params = eng_model_params(z->m);
    const eng_tensor_t *t;
    int rc = 0;
    FOR_EACH_REST(z, t)
    {
        const float *shard = z->p + t->shard_base;
        if (rc == 0 && z->dp && z->pk)
            rc = gather_rest_bf16(z, shard, params + t->offset, t->shard_len);
        else if (rc == 0 && z->dp) {
            wrk_coll_req_t *r = NULL;
            rc = wrk_coll_ordered(wrk_coll_allgather(z->dp, shard, params + t->offset, t->shard_len,
                                                     WRK_COLL_F32, &r),
                                  &r);
        } else if (rc == 0)
            rc = z->be->copy(z->be, params + t->offset, shard, t->shard_len * sizeof(float),
                             ENG_COPY_D2D);
    }
    return rc;
}

void eng_zero_drop_grads(eng_zero_t *z)
{
    drain_all(z);
    rs_drain(z); /* its add lands before the zeroing */
    z->be->memset(z->be, z->g, 0, (z->rest + (size_t)z->nb * z->S) * sizeof(float));
}

int eng_zero_reduce_rest(eng_zero_t *z)
{
    float *grads = eng_model_grads(z->m);
    const eng_tensor_t *t;
    int rc = rs_drain(z); /* the pass's last block: every block's reduced gradient is whole */
    FOR_EACH_REST(z, t)
    {
        if (rc == 0)
            rc = reduce_into(z, grads + t->offset, t->shard_len, z->g + t->shard_base);
    }
    if (rc == 0)
        rc = z->be->memset(z->be, grads, 0, eng_model_nparams(z->m) * sizeof(float));
    return rc;
}

eng_store_t eng_zero_store(const eng_zero_t *z)
{
    return (eng_store_t){.p = z->p, .g = z->g, .m = z->am, .v = z->av};
}

void eng_zero_bytes(const eng_zero_t *z, size_t *state, size_t *gathered)
{
    *state = 4 * (z->rest + (size_t)z->nb * z->S) * sizeof(float);
    /* the blocks' buffers, and the model's slab: the tensors outside blocks gathered, and
     * their unsharded gradients */
    size_t fgs = z->fg[1] != z->fg[0] ? 2 : 1;
    *gathered = (((size_t)z->nbuf + fgs) * z->padded + 2 * eng_model_nparams(z->m)) * sizeof(float);
    if (z->pk) /* the bf16 gathers' packed buffers */
        *gathered += ((size_t)z->nbuf * z->padded + z->pk_rest_len) * sizeof(kn_bf16_t);
}

/* The largest of the tensors outside blocks, gathered (dpn shards) */
static size_t rest_max(eng_zero_t *z)
{
    const eng_tensor_t *t;
    size_t rest = 0;
    FOR_EACH_REST(z, t)
    {
        size_t n = (size_t)z->dpn * t->shard_len;
        rest = n > rest ? n : rest;
    }
    return rest;
}

int eng_zero_set_bf16_reduce(eng_zero_t *z, int on)
{
    z->bf16_reduce = on;
    if (!on || !z->dp || !eng_bf16_castable(z->be))
        return 0;
    size_t rest = rest_max(z);
    eng_bf16_msg_init(&z->rs16, z->be);
    return eng_bf16_msg_reserve(&z->rs16, z->dp, rest > z->padded ? rest : z->padded);
}

int eng_zero_set_bf16_gather(eng_zero_t *z, int on)
{
    if (!on || z->pk || !z->dp)
        return 0;
    if (!eng_bf16_castable(z->be))
        return -ENOTSUP; /* no cast in the backend's memory: fp32 gathers */
    size_t rest = rest_max(z);
    z->pk = calloc(z->nbuf, sizeof *z->pk);
    if (!z->pk)
        return -ENOMEM;
    /* 2-byte elements in float-sized allocations: zalloc's units, rounded up */
    int rc = zalloc(z, ENG_MEM_GATHERED, (rest + 1) / 2, (float **)&z->pk_rest);
    for (uint32_t s = 0; rc == 0 && s < z->nbuf; s++)
        rc = zalloc(z, ENG_MEM_GATHERED, (z->padded + 1) / 2, (float **)&z->pk[s]);
    z->pk_rest_len = rest;
    if (rc < 0) { /* back to fp32 gathers */
        for (uint32_t s = 0; s < z->nbuf; s++)
            zfree(z, (float *)z->pk[s]);
        zfree(z, (float *)z->pk_rest);
        free(z->pk);
        z->pk = NULL;
        z->pk_rest = NULL;
        z->pk_rest_len = 0;
    }
    return rc;
}

size_t eng_zero_shard_len(const eng_zero_t *z)
{
    return z->S;
}
