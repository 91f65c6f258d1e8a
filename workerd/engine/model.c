/* GPT-2 for one rank (model.h, DESIGN §7): the tensor table, memory, activations per
 * micro-batch and the whole-model passes; the passes over each part are model_stage.c.
 *
 * Theory of operation. Parameters live in one slab in Hugging Face order: wte, wpe,
 * then for each block the twelve h.{l}.* tensors (so a block's parameters are one
 * contiguous range, the unit a ZeRO-3 shard splits), then ln_f. A model object may hold
 * one pipeline stage: its table is the subset of those rows it holds, in the same order
 * (a last stage without the embedding keeps wte for its tied LM head). Gradients use the
 * same layout. Each held block reads its parameters and accumulates its gradients at a
 * base pointer, its slab range unless eng_model_set_block_params/grads moved it.
 *
 * Activations belong to an eng_acts_t per micro-batch (B <= max_B sequences of up to
 * seq_len tokens, one backend allocation); a forward over B x T uses a prefix of each of
 * its buffers. What only one backward at a time needs (the gradient scratch and the
 * logits buffer) belongs to the model. eng_model_forward/backward run on an acts the
 * model makes on first use. */
#include "workerd/engine/model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gpt2.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/plan.h"
#include "common/rng.h"
#include "kernels/attention.h"
#include "workerd/engine/mem.h"
#include "workerd/engine/model_impl.h"

#define LOGITS_BUDGET ((size_t)64 << 20) /* floats held for logits: 256 MiB */
#define INIT_STD      0.02f

// ----------------------------------------------------------------------------
// tensors of one block, in slab order

enum init_kind { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_RESID };

/* How each of a block's tensors (common/gpt2.h's ch_gpt2_block, same order) is initialised and
 * split by tensor parallelism. */
typedef struct block_tensor_spec {
    enum init_kind init;
    eng_split_t split;
} block_tensor_spec_t;

static const block_tensor_spec_t block_specs[NBLOCK_TENSORS] = {
    [LN1W] = {INIT_ONE, ENG_SPLIT_NONE},      [LN1B] = {INIT_ZERO, ENG_SPLIT_NONE},
    [QKVW] = {INIT_NORMAL, ENG_SPLIT_COLUMN}, [QKVB] = {INIT_ZERO, ENG_SPLIT_COLUMN},
    [ATTPROJW] = {INIT_RESID, ENG_SPLIT_ROW}, [ATTPROJB] = {INIT_ZERO, ENG_SPLIT_NONE},
    [LN2W] = {INIT_ONE, ENG_SPLIT_NONE},      [LN2B] = {INIT_ZERO, ENG_SPLIT_NONE},
    [FCW] = {INIT_NORMAL, ENG_SPLIT_COLUMN},  [FCB] = {INIT_ZERO, ENG_SPLIT_COLUMN},
    [FCPROJW] = {INIT_RESID, ENG_SPLIT_ROW},  [FCPROJB] = {INIT_ZERO, ENG_SPLIT_NONE},
};
_Static_assert(NBLOCK_TENSORS == CH_GPT2_BLOCK_TENSORS, "one list of a block's tensors");

// ----------------------------------------------------------------------------
// parameter table and initialisation

/* Add a tensor of full shape [d0, d1] (1-D: [d0]) holding this rank's slice of it under
 * split (eng_tensor_t's lo/hi/parts). rows0: the rows the slice is cut from (wte: the
 * padded vocab; otherwise d0). */
static void add_tensor(eng_model_t *m, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1,
                       uint32_t rows0, int block, eng_split_t split, uint32_t parts,
                       enum init_kind init)
{
    uint32_t p = m->tp, r = m->tpr;
    m->init[m->ntensors] = (uint8_t)init;
    eng_tensor_t *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->lo[0] = 0;
    t->hi[0] = rows0;
    t->lo[1] = 0;
    t->hi[1] = ndim == 2 ? d1 : 0;
    t->parts = 1;
    int last = ndim == 2 ? 1 : 0; /* the dimension a column split cuts */
    if (split == ENG_SPLIT_COLUMN) {
        uint32_t w = t->shape[last] / parts / p;
        t->parts = parts;
        t->lo[last] = r * w;
        t->hi[last] = (r + 1) * w;
    } else if (split == ENG_SPLIT_ROW || split == ENG_SPLIT_VOCAB) {
        uint32_t w = rows0 / p;
        t->lo[0] = r * w;
        t->hi[0] = (r + 1) * w;
    }
    size_t numel = (size_t)(t->hi[0] - t->lo[0]) * t->parts;
    if (ndim == 2) {
        numel *= t->hi[1] - t->lo[1];
    }
    t->offset = m->nparams;
    t->numel = numel;
    t->decay = ndim == 2;
    t->block = block;
    t->split = split;
    t->tp_replicated = split == ENG_SPLIT_NONE && p > 1;
    t->tp_counter = 0;
    /* ZeRO-3 gathers a tensor outside blocks whole, its padding with it */
    m->nparams += m->external && block < 0 ? m->dp * ch_layout_shard_len(numel, m->dp) : numel;
}

/* t is ZeRO-3 sharded: its unit (t itself, or its block's range, where t starts at
 * unit_off) has S floats per DP rank, this rank's shard of it at `base` in the shards;
 * the rank owns what of t falls in [d*S, (d+1)*S) of the unit. */
static void own_shard(eng_tensor_t *t, size_t unit_off, size_t S, uint32_t d, size_t base)
{
    size_t lo = (size_t)d * S, hi = lo + S;
    size_t a = unit_off > lo ? unit_off : lo;
    size_t b = unit_off + t->numel < hi ? unit_off + t->numel : hi;
    b = b > a ? b : a;
    t->dp_sharded = 1;
    t->store = ENG_STORE_SHARDS;
    t->shard_base = base;
    t->shard_len = S;
    t->own_lo = a - unit_off;
    t->own_hi = b - unit_off;
    t->own_at = base + (a - lo);
}

/* Who owns which copy of each tensor (eng_tensor_t): the tie of wte, the DP ranges, and
 * from them which rank writes and counts what. Under ZeRO-3 every tensor is sharded
 * (model.h: external_blocks); otherwise every DP rank holds everything. */
static void assign_owners(eng_model_t *m)
{
    size_t S = ch_layout_shard_len(m->blk_numel, m->dp), base = 0;
    for (size_t i = 0; i < m->ntensors; i++) { /* the units outside blocks come first */
        eng_tensor_t *t = &m->tensors[i];
        if (t->split == ENG_SPLIT_VOCAB && !(m->part.embedding && m->part.head)) {
            t->tie = m->part.embedding ? ENG_TIE_ORIGINAL : ENG_TIE_COPY;
        }
        if (m->external && t->block < 0) {
            size_t St = ch_layout_shard_len(t->numel, m->dp);
            own_shard(t, 0, St, m->dpr, base);
            base += St;
        }
    }
    for (size_t i = 0; i < m->ntensors; i++) {
        eng_tensor_t *t = &m->tensors[i];
        if (m->external && t->block >= 0) {
            own_shard(t, t->offset, S, m->dpr,
                      base + (size_t)eng_part_pos(&m->part, (uint32_t)t->block) * S);
        } else if (!m->external) {
            t->store = ENG_STORE_SLAB;
            t->own_lo = 0;
            t->own_hi = t->numel;
            t->own_at = t->offset;
        }
        t->written = t->tie != ENG_TIE_COPY && (t->dp_sharded || m->dpr == 0);
        t->counted = t->written && (!t->tp_replicated || m->tpr == t->tp_counter);
    }
}

eng_slice_t eng_tensor_slice(const eng_tensor_t *t)
{
    eng_slice_t s = {.ndim = t->ndim, .parts = t->parts};
    memcpy(s.shape, t->shape, sizeof s.shape);
    memcpy(s.lo, t->lo, sizeof s.lo);
    memcpy(s.hi, t->hi, sizeof s.hi);
    return s;
}

static void build_table(eng_model_t *m)
{
    const eng_config_t *c = &m->cfg;
    const eng_model_part_t *p = &m->part;
    uint32_t C = c->embd;
    char name[64];
    m->wte = m->wpe = m->lnfw = m->lnfb = SIZE_MAX;
    if (p->embedding || p->head) {
        m->wte = m->nparams;
        add_tensor(m, "wte.weight", 2, c->vocab, C, c->padded_vocab, -1, ENG_SPLIT_VOCAB, 1,
                   INIT_NORMAL);
    }
    if (p->embedding) {
        m->wpe = m->nparams;
        add_tensor(m, "wpe.weight", 2, c->seq_len, C, c->seq_len, -1, ENG_SPLIT_NONE, 1,
                   INIT_NORMAL);
    }
    for (uint32_t bi = 0; bi < p->nblocks; bi++) {
        uint32_t l = eng_part_block(p, bi);
        size_t base = m->nparams;
        m->blk_slab[bi] = base;
        for (int i = 0; i < NBLOCK_TENSORS; i++) {
            const block_tensor_spec_t *s = &block_specs[i];
            const ch_gpt2_block_tensor_t *g = &ch_gpt2_block[i];
            uint32_t d0 = g->rows * C, d1 = g->cols * C;
            snprintf(name, sizeof name, "h.%u.%s", l, g->suffix);
            m->blk_off[i] = m->nparams - base;
            add_tensor(m, name, g->cols ? 2 : 1, d0, d1, d0, (int)l, s->split,
                       i == QKVW || i == QKVB ? 3 : 1, s->init);
        }
        m->blk_numel = m->nparams - base;
        if (m->external) {
            /* offsets within the block; the slab holds no block */
            for (size_t t = m->ntensors - NBLOCK_TENSORS; t < m->ntensors; t++) {
                m->tensors[t].offset -= base;
            }
            m->nparams = base;
        }
    }
    if (p->head) {
        m->lnfw = m->nparams;
        add_tensor(m, "ln_f.weight", 1, C, 0, C, -1, ENG_SPLIT_NONE, 1, INIT_ONE);
        m->lnfb = m->nparams;
        add_tensor(m, "ln_f.bias", 1, C, 0, C, -1, ENG_SPLIT_NONE, 1, INIT_ZERO);
    }
}

/* Fill dst (t->numel floats, the slice's layout) with the slice's elements of the full
 * tensor: element (row, col) of the full tensor is drawn at index row * cols + col, so a
 * slice equals the same elements of the whole tensor. Rows past shape[0] (wte's padded
 * vocab) are zero. */
static void fill_slice(const eng_model_t *m, const eng_tensor_t *t, enum init_kind kind, float std,
                       float *dst)
{
    uint32_t cols = t->ndim == 2 ? t->shape[1] : 1;
    uint32_t rlo = t->ndim == 2 ? t->lo[0] : 0, rhi = t->ndim == 2 ? t->hi[0] : 1;
    uint32_t clo = t->lo[t->ndim - 1], chi = t->hi[t->ndim - 1];
    uint32_t part_w = (t->ndim == 2 ? t->shape[1] : t->shape[0]) / t->parts;
    size_t w = chi - clo;
    for (uint32_t r = rlo; r < rhi; r++) {
        for (uint32_t q = 0; q < t->parts; q++, dst += w) {
            if (t->ndim == 2 && r >= t->shape[0]) {
                memset(dst, 0, w * sizeof *dst);
                continue;
            }
            uint64_t first = (uint64_t)r * cols + (uint64_t)q * part_w + clo;
            if (kind == INIT_ONE) {
                for (size_t j = 0; j < w; j++) {
                    dst[j] = 1.0f;
                }
            } else {
                ch_rng_fill_normal(dst, w, m->seed, t->name, first, std);
            }
        }
    }
}

/* Each element is a function of (seed, name, index in the Hugging Face tensor) only. On a
 * backend without host memory each tensor is made on the host and copied in. */
static int init_params(eng_model_t *m)
{
    const eng_backend_t *be = m->be;
    float resid_std = INIT_STD / sqrtf(2.0f * (float)m->cfg.layers);
    float *host = NULL;
    size_t cap = 0;
    /* biases */
    int rc = be->memset(be, m->params, 0, m->nparams * sizeof(float));
    for (size_t i = 0; rc == 0 && i < m->ntensors; i++) {
        const eng_tensor_t *t = &m->tensors[i];
        enum init_kind kind = (enum init_kind)m->init[i];
        float *p = m->params + t->offset;
        if (kind == INIT_ZERO || (m->external && t->block >= 0)) {
            continue;
        }
        if (!be->host_memory && t->numel > cap) {
            free(host);
            cap = t->numel;
            host = malloc(cap * sizeof *host);
            if (host == NULL) {
                rc = -ENOMEM;
                break;
            }
        }
        float *dst = be->host_memory ? p : host;
        fill_slice(m, t, kind, kind == INIT_RESID ? resid_std : INIT_STD, dst);
        if (!be->host_memory) {
            rc = be->copy(be, p, host, t->numel * sizeof(float), ENG_COPY_H2D);
        }
    }
    free(host);
    return rc;
}

int eng_model_init_block(const eng_model_t *m, uint32_t l, float *dst)
{
    int64_t pos = eng_part_pos(&m->part, l);
    if (pos < 0) {
        return -EINVAL;
    }
    float resid_std = INIT_STD / sqrtf(2.0f * (float)m->cfg.layers);
    size_t first = (m->part.embedding ? 2 : m->part.head ? 1 : 0) + (size_t)pos * NBLOCK_TENSORS;
    for (int i = 0; i < NBLOCK_TENSORS; i++) {
        const eng_tensor_t *t = &m->tensors[first + (size_t)i];
        enum init_kind kind = (enum init_kind)m->init[first + (size_t)i];
        float *p = dst + m->blk_off[i];
        if (kind == INIT_ZERO) {
            memset(p, 0, t->numel * sizeof *p);
        } else {
            fill_slice(m, t, kind, kind == INIT_RESID ? resid_std : INIT_STD, p);
        }
    }
    return 0;
}

void eng_model_set_block_hook(eng_model_t *m, eng_block_hook_t hook, void *ctx)
{
    m->hook = hook;
    m->hook_ctx = ctx;
}

// ----------------------------------------------------------------------------
// create / destroy

static int check_config(const eng_config_t *c, uint32_t max_B)
{
    if (c->layers == 0 || c->heads == 0 || c->embd == 0 || c->vocab == 0 || c->seq_len == 0 ||
        max_B == 0 || c->embd % c->heads != 0 || c->padded_vocab < c->vocab ||
        c->vocab > (uint32_t)INT32_MAX) {
        return -EINVAL;
    }
    /* the kernels index rows and columns with int */
    size_t N = (size_t)max_B * c->seq_len;
    if (N > INT_MAX / 4 || (size_t)c->embd * 4 > INT_MAX || c->padded_vocab > INT_MAX) {
        return -EINVAL;
    }
    return 0;
}

/* The part of the model opts ask for: stage `stage` of `pp` (DESIGN §5). */
static int part_of(const eng_config_t *c, const eng_model_opts_t *opts, eng_model_part_t *p)
{
    uint32_t pp = opts && opts->pp > 1 ? opts->pp : 1, s = opts ? opts->stage : 0, count = 0;
    if (s >= pp || pp > c->layers) {
        return -EINVAL;
    }
    uint32_t v = opts && opts->virtual_stages > 1 ? opts->virtual_stages : 1;
    if (v > 1) { /* chunk c: virtual stage c * pp + s, evenly split */
        if (c->layers % (pp * v) != 0)
            return -EINVAL;
        count = c->layers / (pp * v);
        p->first = s * count;
    } else {
        ch_layout_stage_blocks(c->layers, pp, s, ch_plan_head_blocks(c), &p->first, &count);
    }
    p->chunks = v;
    p->chunk_len = count;
    p->stride = v > 1 ? pp * count : count;
    p->nblocks = v * count;
    p->last = p->first + (v - 1) * p->stride + count;
    p->embedding = s == 0;
    p->head = s == pp - 1;
    return 0;
}

/* Whether be has the vocab-parallel entries (backend.h's tp_*). */
static int has_tp_kernels(const eng_backend_t *be)
{
    return be->tp_embed_fwd && be->tp_embed_bwd && be->tp_xent_max && be->tp_xent_sums &&
           be->tp_xent_finish && be->tp_xent_bwd;
}

/* Tensor parallelism's conditions: heads (hence C and 4C) and the padded vocab divide by
 * tp, a group of tp members holding this rank at tp_rank, and the vocab-parallel
 * embedding and head's kernels (the backend's, or the CPU's on host memory). */
static int check_tp(const eng_config_t *c, const eng_model_opts_t *opts)
{
    if (opts == NULL || opts->tp <= 1) {
        return 0;
    }
    const eng_backend_t *be = opts->backend ? opts->backend : eng_backend_cpu();
    uint32_t p = opts->tp;
    if (c->heads % p != 0 || c->padded_vocab % p != 0 || opts->tp_rank >= p ||
        opts->tp_group == NULL || wrk_coll_group_size(opts->tp_group) != p ||
        wrk_coll_group_index(opts->tp_group) != opts->tp_rank) {
        return -EINVAL;
    }
    return eng_model_tp_runs_on(be) ? 0 : -ENOTSUP;
}

int eng_model_tp_runs_on(const eng_backend_t *be)
{
    return be->host_memory || has_tp_kernels(be);
}

/* n floats of kind (mem.h: counted when the backend is a ledger's view) */
static int alloc_floats(const eng_model_t *m, eng_mem_kind_t kind, size_t n, float **out)
{
    void *p = NULL;
    const eng_backend_t *be = eng_mem_view(m->be, kind);
    int rc = be->alloc(be, n * sizeof(float), &p);
    *out = p;
    return rc;
}

static int alloc_work(eng_model_t *m); /* the recompute set, with the activations below */

_Static_assert(KN_ATTENTION_QBLOCK == CH_PLAN_ATT_QBLOCK,
               "the plan's attention query block is the kernel's");

/* The backward scratch: dres, dsmall [N,C], dbig [N,4C/tp] (this rank's MLP hidden units,
 * or its heads' q, k, v), datt [T,T] (selective: at least the attention's scratch without
 * att, which its forward uses too; common/plan.c counts the same). */
static int alloc_scratch(eng_model_t *m)
{
    size_t N = (size_t)m->max_B * m->cfg.seq_len, C = m->cfg.embd, T = m->cfg.seq_len;
    size_t NC = (N * C + 15) & ~(size_t)15, NCl = (N * m->Cl + 15) & ~(size_t)15;
    size_t datt = T * T;
    if (m->recompute == CH_RECOMPUTE_SELECTIVE && KN_ATTENTION_NOATT_SCRATCH(T) > datt) {
        datt = KN_ATTENTION_NOATT_SCRATCH(T);
    }
    int rc = alloc_floats(m, ENG_MEM_SCRATCH, 2 * NC + 4 * NCl + datt, &m->scratch);
    if (rc == 0) {
        m->dres = m->scratch;
        m->dsmall = m->dres + NC;
        m->dbig = m->dsmall + NC;
        m->datt = m->dbig + 4 * NCl;
    }
    return rc;
}

int eng_model_create(const eng_config_t *cfg, uint32_t max_B, uint64_t seed, eng_model_t **out)
{
    return eng_model_create_opts(cfg, NULL, max_B, seed, out);
}

int eng_model_create_opts(const eng_config_t *cfg, const eng_model_opts_t *opts, uint32_t max_B,
                          uint64_t seed, eng_model_t **out)
{
    eng_model_part_t part;
    *out = NULL;
    int rc = check_config(cfg, max_B);
    if (rc == 0) {
        rc = part_of(cfg, opts, &part);
    }
    if (rc == 0) {
        rc = check_tp(cfg, opts);
    }
    if (rc == 0 && opts != NULL && opts->dp > 1 && opts->dp_rank >= opts->dp) {
        rc = -EINVAL;
    }
    if (rc == 0 && opts != NULL && opts->split_backward && opts->recompute == CH_RECOMPUTE_FULL) {
        rc = -EINVAL; /* the weight pass reads the layer inputs full recomputation drops */
    }
    if (rc == 0 && opts != NULL && opts->split_head &&
        (!opts->split_backward || !part.head || opts->tp > 1)) {
        rc = -EINVAL;
    }
    if (rc < 0) {
        return rc;
    }
    eng_model_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return -ENOMEM;
    }
    m->cfg = *cfg;
    m->be = opts && opts->backend ? opts->backend : eng_backend_cpu();
    m->part = part;
    m->max_B = max_B;
    m->seed = seed;
    m->tp = opts && opts->tp > 1 ? opts->tp : 1;
    m->tpr = m->tp > 1 ? opts->tp_rank : 0;
    m->tpg = m->tp > 1 ? opts->tp_group : NULL;
    if (m->tpg && opts->tp_bf16 && eng_bf16_castable(m->be)) {
        if ((m->tp_bf16 = calloc(1, sizeof *m->tp_bf16)) == NULL) {
            free(m);
            return -ENOMEM;
        }
        eng_bf16_msg_init(m->tp_bf16, m->be);
    }
    m->tpk = has_tp_kernels(m->be) ? m->be : eng_backend_cpu();
    m->head = m->tp > 1                                             ? ENG_HEAD_VOCAB_PARALLEL
              : m->be->lmhead_fwdbwd != NULL && m->be->axpy != NULL ? ENG_HEAD_FUSED
                                                                    : ENG_HEAD_WHOLE;
    m->external = opts != NULL && opts->external_blocks;
    m->dp = opts && opts->dp > 1 ? opts->dp : 1;
    m->recompute = opts ? opts->recompute : CH_RECOMPUTE_NONE;
    m->split_backward = opts != NULL && opts->split_backward;
    m->split_head = opts != NULL && opts->split_head;
    m->bf16_acts = opts != NULL && opts->bf16_acts && eng_bf16_castable(m->be);
    m->dpr = m->dp > 1 ? opts->dp_rank : 0;
    m->Cl = cfg->embd / m->tp;
    m->NHl = cfg->heads / m->tp;
    m->Vl = cfg->padded_vocab / m->tp;
    size_t nblocks = part.nblocks, N = (size_t)max_B * cfg->seq_len;
    size_t ntensors = 2 + nblocks * NBLOCK_TENSORS + 2;
    rc = -ENOMEM;
    m->tensors = calloc(ntensors, sizeof *m->tensors);
    m->init = calloc(ntensors, sizeof *m->init);
    m->blk_slab = calloc(nblocks, sizeof *m->blk_slab);
    m->blk_params = calloc(nblocks, sizeof *m->blk_params);
    m->blk_grads = calloc(nblocks, sizeof *m->blk_grads);
    if (!m->tensors || !m->init || !m->blk_slab || !m->blk_params || !m->blk_grads) {
        goto fail;
    }
    build_table(m);
    assign_owners(m);
    /* under ZeRO-3 the slab is the gathered copy of the tensors outside blocks */
    CH_CHECK_GOTO(
        alloc_floats(m, m->external ? ENG_MEM_GATHERED : ENG_MEM_PARAMS, m->nparams, &m->params),
        rc, fail);
    CH_CHECK_GOTO(
        alloc_floats(m, m->external ? ENG_MEM_GATHERED : ENG_MEM_GRADS, m->nparams, &m->own_grads),
        rc, fail);
    m->grads = m->own_grads;
    CH_CHECK_GOTO(alloc_scratch(m), rc, fail);
    if (m->bf16_acts && part.nblocks > 0) { /* [N, max(C, 4C/tp)] */
        size_t wide = 4 * m->Cl > m->cfg.embd ? 4 * m->Cl : m->cfg.embd;
        CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, N * wide, &m->wide), rc, fail);
        CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, N * 4 * m->Cl, &m->wide2), rc, fail);
        CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, N * m->cfg.embd, &m->resid), rc, fail);
    }
    CH_CHECK_GOTO(alloc_work(m), rc, fail);
    if (m->tp_bf16) /* the largest activation all-reduced: N rows of C */
        CH_CHECK_GOTO(eng_bf16_msg_reserve(m->tp_bf16, m->tpg, N * m->cfg.embd), rc, fail);
    if (part.head) {
        size_t budget_rows = LOGITS_BUDGET / m->Vl;
        m->logits_budget_rows = budget_rows == 0 ? 1 : budget_rows < N ? budget_rows : N;
        m->logits_cap = m->logits_budget_rows;
        CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, m->logits_cap * m->Vl, &m->logits), rc,
                      fail);
        if (m->head == ENG_HEAD_VOCAB_PARALLEL) {
            CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, 3 * m->logits_cap, &m->tp_rows), rc,
                          fail);
            CH_CHECK_GOTO(alloc_floats(m, ENG_MEM_SCRATCH, m->logits_cap * m->Vl, &m->tp_dlog), rc,
                          fail);
        }
    }
    for (size_t i = 0; i < nblocks && !m->external; i++) {
        m->blk_params[i] = m->params + m->blk_slab[i];
        m->blk_grads[i] = m->grads + m->blk_slab[i];
    }
    CH_CHECK_GOTO(init_params(m), rc, fail);
    CH_CHECK_GOTO(m->be->memset(m->be, m->grads, 0, m->nparams * sizeof(float)), rc, fail);
    *out = m;
    return 0;
fail:
    eng_model_destroy(m);
    return rc;
}

void eng_model_destroy(eng_model_t *m)
{
    if (m == NULL) {
        return;
    }
    eng_acts_destroy(m->acts);
    if (m->tp_bf16)
        eng_bf16_msg_free(m->tp_bf16);
    free(m->tp_bf16);
    m->be->free(m->be, m->tp_rows);
    m->be->free(m->be, m->tp_dlog);
    m->be->free(m->be, m->logits);
    m->be->free(m->be, m->scratch);
    m->be->free(m->be, m->wide);
    m->be->free(m->be, m->wide2);
    m->be->free(m->be, m->resid);
    m->be->free(m->be, m->work_mem);
    m->be->free(m->be, m->own_grads);
    m->be->free(m->be, m->params);
    free(m->blk_grads);
    free(m->blk_params);
    free(m->blk_slab);
    free(m->init);
    free(m->tensors);
    free(m);
}

// ----------------------------------------------------------------------------
// accessors

const eng_config_t *eng_model_config(const eng_model_t *m)
{
    return &m->cfg;
}

const eng_backend_t *eng_model_backend(const eng_model_t *m)
{
    return m->be;
}

eng_model_part_t eng_model_part(const eng_model_t *m)
{
    return m->part;
}

size_t eng_model_nparams(const eng_model_t *m)
{
    return m->nparams;
}

float *eng_model_params(eng_model_t *m)
{
    return m->params;
}

float *eng_model_grads(eng_model_t *m)
{
    return m->grads;
}

void eng_model_lend_grads(eng_model_t *m, float *buf)
{
    m->be->copy(m->be, buf, m->grads, m->nparams * sizeof(float), ENG_COPY_D2D);
    for (uint32_t i = 0; i < m->part.nblocks; i++) {
        if (!m->external && m->blk_grads[i] == m->grads + m->blk_slab[i]) {
            m->blk_grads[i] = buf + m->blk_slab[i];
        }
    }
    m->grads = buf;
    m->be->free(m->be, m->own_grads);
    m->own_grads = NULL;
}

size_t eng_model_ntensors(const eng_model_t *m)
{
    return m->ntensors;
}

const eng_tensor_t *eng_model_tensor(const eng_model_t *m, size_t i)
{
    return i < m->ntensors ? &m->tensors[i] : NULL;
}

const eng_tensor_t *eng_model_find(const eng_model_t *m, const char *name)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        if (strcmp(m->tensors[i].name, name) == 0) {
            return &m->tensors[i];
        }
    }
    return NULL;
}

const float *eng_model_logits(const eng_model_t *m)
{
    return m->logits_all ? m->logits : NULL;
}

void eng_model_zero_grad(eng_model_t *m)
{
    m->be->memset(m->be, m->grads, 0, m->nparams * sizeof(float));
}

// ----------------------------------------------------------------------------
// a parameter base per block

static int held(const eng_model_t *m, uint32_t l)
{
    return eng_part_pos(&m->part, l) >= 0;
}

int eng_model_block_params(eng_model_t *m, uint32_t l, float **ptr, size_t *count)
{
    if (!held(m, l)) {
        return -EINVAL;
    }
    *ptr = m->blk_params[eng_part_pos(&m->part, l)];
    *count = m->blk_numel;
    return 0;
}

int eng_model_set_block_params(eng_model_t *m, uint32_t l, float *params)
{
    if (!held(m, l)) {
        return -EINVAL;
    }
    uint32_t i = (uint32_t)eng_part_pos(&m->part, l);
    m->blk_params[i] = params != NULL ? params : m->external ? NULL : m->params + m->blk_slab[i];
    return 0;
}

int eng_model_block_grads(eng_model_t *m, uint32_t l, float **ptr, size_t *count)
{
    if (!held(m, l)) {
        return -EINVAL;
    }
    *ptr = m->blk_grads[eng_part_pos(&m->part, l)];
    *count = m->blk_numel;
    return 0;
}

int eng_model_set_block_grads(eng_model_t *m, uint32_t l, float *grads)
{
    if (!held(m, l)) {
        return -EINVAL;
    }
    uint32_t i = (uint32_t)eng_part_pos(&m->part, l);
    m->blk_grads[i] = grads != NULL ? grads : m->external ? NULL : m->grads + m->blk_slab[i];
    return 0;
}

// ----------------------------------------------------------------------------
// activations per micro-batch

/* n elements of 4 bytes at *off of base (NULL: only count), each buffer 64-byte aligned */
static void take(void **ptr, char *base, size_t *off, size_t n)
{
    if (base != NULL) {
        *ptr = base + *off;
    }
    *off += (n * 4 + 63) & ~(size_t)63;
}
#define TAKE(ptr, n) take((void **)&(ptr), base, &off, (n))
/* n elements of 2 bytes */
#define TAKE16(ptr, n) take((void **)&(ptr), base, &off, ((n) + 1) / 2)
/* activation f of b: its packed cast f_16 (2 bytes an element) when pack, else f itself */
#define TAKE_ACT(pack, f, n)                                                                       \
    do {                                                                                           \
        if (pack)                                                                                  \
            TAKE16(b->f##_16, (n));                                                                \
        else                                                                                       \
            TAKE(b->f, (n));                                                                       \
    } while (0)

/* Which of a block's activations a buffer set holds (parallel.recompute). */
enum { KEEP_ATT = 1, KEEP_REST = 2, KEEP_OUT = 4, KEEP_WPASS = 8 };

/* Floats the backend's attention keeps per sequence, head and query row (backend.h):
 * T probabilities, or a fused attention's one log-sum-exp. */
static size_t att_row(const eng_model_t *m)
{
    int T = (int)m->cfg.seq_len, hs = (int)(m->cfg.embd / m->cfg.heads);
    return m->be->att_row != NULL ? (size_t)m->be->att_row(m->be, T, hs) : (size_t)T;
}

/* Block b's activations in `keep`, for micro-batches of up to max_B sequences. */
static void take_block(const eng_model_t *m, block_acts_t *b, unsigned keep, uint32_t max_B,
                       char *base, size_t *poff)
{
    size_t N = (size_t)max_B * m->cfg.seq_len, C = m->cfg.embd, T = m->cfg.seq_len;
    size_t off = *poff;
    /* the activations packed under bf16_acts; the attention output stays where the forward
     * wrote it when the attention keeps a row summary (a fused attention's backward reads
     * its forward's output there, backend.h's att_row) */
    int pack = m->bf16_acts, pack_atty = pack && att_row(m) == T;
    if (keep & KEEP_REST) {
        TAKE_ACT(pack, ln1, N * C);
        TAKE_ACT(pack, qkv, N * 3 * m->Cl);
        TAKE_ACT(pack, res2, N * C);
        TAKE_ACT(pack, ln2, N * C);
        TAKE_ACT(pack, fch, N * 4 * m->Cl);
        TAKE_ACT(pack, fch_gelu, N * 4 * m->Cl);
        TAKE_ACT(pack_atty, atty, N * m->Cl);
        TAKE(b->ln1_mean, N);
        TAKE(b->ln1_rstd, N);
        TAKE(b->ln2_mean, N);
        TAKE(b->ln2_rstd, N);
    }
    if (keep & KEEP_ATT) {
        TAKE(b->att, (size_t)max_B * m->NHl * T * att_row(m));
    }
    if (keep & KEEP_OUT) {
        TAKE(b->res3, N * C);
    }
    if (keep & KEEP_WPASS) {
        TAKE(b->g_fcproj, N * C);
        TAKE(b->g_fc, N * 4 * m->Cl);
        TAKE(b->g_ln2, N * C);
        TAKE(b->g_attproj, N * C);
        TAKE(b->g_qkv, N * 3 * m->Cl);
        TAKE(b->g_ln1, N * C);
    }
    *poff = off;
}

/* What each block keeps per micro-batch, and what the model's one recompute set holds. */
static unsigned kept_per_block(const eng_model_t *m)
{
    if (m->split_backward) { /* recompute none or selective: no weight pass reads att */
        return KEEP_OUT | KEEP_REST | KEEP_WPASS |
               (m->recompute == CH_RECOMPUTE_SELECTIVE ? 0 : KEEP_ATT);
    }
    return m->recompute == CH_RECOMPUTE_FULL        ? KEEP_OUT
           : m->recompute == CH_RECOMPUTE_SELECTIVE ? KEEP_OUT | KEEP_REST
                                                    : KEEP_OUT | KEEP_REST | KEEP_ATT;
}

/* Point b's recomputed activations at the model's recompute set. */
static void share_work(const eng_model_t *m, block_acts_t *b)
{
    block_acts_t out = *b;
    const block_acts_t *w = &m->work;
    unsigned keep = kept_per_block(m);
    if (!(keep & KEEP_ATT)) {
        out.att = w->att;
    }
    if (!(keep & KEEP_REST)) {
        out.ln1 = w->ln1, out.ln1_mean = w->ln1_mean, out.ln1_rstd = w->ln1_rstd;
        out.qkv = w->qkv, out.atty = w->atty, out.res2 = w->res2;
        out.ln2 = w->ln2, out.ln2_mean = w->ln2_mean, out.ln2_rstd = w->ln2_rstd;
        out.fch = w->fch, out.fch_gelu = w->fch_gelu;
        out.ln1_16 = w->ln1_16, out.qkv_16 = w->qkv_16, out.atty_16 = w->atty_16;
        out.res2_16 = w->res2_16, out.ln2_16 = w->ln2_16, out.fch_16 = w->fch_16;
        out.fch_gelu_16 = w->fch_gelu_16;
    }
    *b = out;
}

/* The model's recompute set (one block's recomputed activations at max_B). Selective keeps
 * no probabilities anywhere: attention_fwd and _bwd get att NULL (backend.h). */
static int alloc_work(eng_model_t *m)
{
    unsigned work = (KEEP_ATT | KEEP_REST) & ~kept_per_block(m);
    if (m->recompute == CH_RECOMPUTE_SELECTIVE) {
        work &= ~(unsigned)KEEP_ATT;
    }
    size_t bytes = 0;
    if (work == 0 || m->part.nblocks == 0) {
        return 0;
    }
    take_block(m, &m->work, work, m->max_B, NULL, &bytes);
    const eng_backend_t *be = eng_mem_view(m->be, ENG_MEM_SCRATCH);
    int rc = be->alloc(be, bytes, &m->work_mem);
    if (rc == 0) {
        bytes = 0;
        take_block(m, &m->work, work, m->max_B, m->work_mem, &bytes);
    }
    return rc;
}

/* Carve a's buffers out of one allocation; with base NULL only count (bytes). */
static size_t carve(eng_acts_t *a, char *base)
{
    const eng_model_t *m = a->m;
    const eng_config_t *c = &m->cfg;
    size_t N = (size_t)a->max_B * c->seq_len, C = c->embd;
    size_t off = 0;
    if (m->part.embedding) {
        TAKE(a->inputs, N);
        TAKE(a->encoded, N * C);
    }
    for (uint32_t i = 0; i < a->span; i++) {
        take_block(m, &a->own[i], kept_per_block(m), a->max_B, base, &off);
        if (base != NULL) {
            share_work(m, &a->own[i]);
        }
    }
    if (m->part.head) {
        TAKE(a->targets, N);
        TAKE(a->lnf, N * C);
        TAKE(a->lnf_mean, N);
        TAKE(a->lnf_rstd, N);
        TAKE(a->lse, N);
        TAKE(a->losses, N);
        if (m->split_head)
            TAKE(a->dlog, N * c->padded_vocab);
    }
    return off;
}
#undef TAKE

int eng_acts_create(eng_model_t *m, uint32_t B, eng_acts_t **out)
{
    return eng_acts_create_span(m, B, m->part.nblocks, out);
}

int eng_acts_create_span(eng_model_t *m, uint32_t B, uint32_t span, eng_acts_t **out)
{
    *out = NULL;
    if (B == 0 || B > m->max_B || span > m->part.nblocks) {
        return -EINVAL;
    }
    eng_acts_t *a = calloc(1, sizeof *a);
    if (a == NULL) {
        return -ENOMEM;
    }
    int rc = -ENOMEM;
    a->m = m;
    a->max_B = B;
    a->span = span;
    a->blk = calloc(m->part.nblocks, sizeof *a->blk);
    a->own = span == m->part.nblocks ? a->blk : calloc(span ? span : 1, sizeof *a->own);
    if (a->blk == NULL || a->own == NULL) {
        goto fail;
    }
    if (m->part.head) {
        a->losses_host = malloc((size_t)B * m->cfg.seq_len * sizeof *a->losses_host);
        if (a->losses_host == NULL) {
            goto fail;
        }
    }
    const eng_backend_t *acts_be = eng_mem_view(m->be, ENG_MEM_ACTS);
    CH_CHECK_GOTO(acts_be->alloc(acts_be, carve(a, NULL), &a->mem), rc, fail);
    carve(a, a->mem);
    *out = a;
    return 0;
fail:
    eng_acts_destroy(a);
    return rc;
}

void eng_acts_destroy(eng_acts_t *a)
{
    if (a == NULL) {
        return;
    }
    if (a->m->logits_of == a) {
        a->m->logits_of = NULL;
    }
    a->m->be->free(a->m->be, a->mem);
    free(a->losses_host);
    if (a->own != a->blk) {
        free(a->own);
    }
    free(a->blk);
    free(a);
}

int eng_acts_bind(eng_acts_t *a, uint32_t first)
{
    const eng_model_t *m = a->m;
    int64_t lo = eng_part_pos(&m->part, first);
    int64_t hi = a->span ? eng_part_pos(&m->part, first + a->span - 1) : lo;
    if (lo < 0 || hi - lo != (int64_t)(a->span ? a->span - 1 : 0)) {
        return -EINVAL;
    }
    if (a->own == a->blk) { /* the whole part: always bound */
        return lo == 0 ? 0 : -EINVAL;
    }
    for (uint32_t i = 0; i < m->part.nblocks; i++) {
        if (a->blk[i].live || a->blk[i].wpending) {
            return CH_E_STATE;
        }
    }
    memset(a->blk, 0, m->part.nblocks * sizeof *a->blk);
    memcpy(a->blk + lo, a->own, a->span * sizeof *a->own);
    return 0;
}

void eng_acts_reset(eng_acts_t *a)
{
    a->embed_live = 0;
    a->head_live = 0;
    a->head_wpending = 0;
    for (uint32_t i = 0; i < a->m->part.nblocks; i++) {
        a->blk[i].live = 0;
        a->blk[i].wpending = 0;
    }
}

float *eng_acts_embed_out(eng_acts_t *a)
{
    return a->m->part.embedding ? a->encoded : NULL;
}

float *eng_acts_blocks_out(eng_acts_t *a)
{
    return a->span > 0 ? a->own[a->span - 1].res3 : NULL;
}

const float *eng_acts_losses(const eng_acts_t *a)
{
    return a->m->part.head ? a->losses : NULL;
}

// ----------------------------------------------------------------------------
// the whole model: embedding -> blocks -> head on one acts

static int whole(const eng_model_t *m)
{
    return m->part.embedding && m->part.head && m->part.first == 0 && m->part.last == m->cfg.layers;
}

int eng_model_forward_acts(eng_model_t *m, eng_acts_t *a, const int32_t *inputs,
                           const int32_t *targets, uint32_t B, uint32_t T, float *loss)
{
    const eng_config_t *c = &m->cfg;
    size_t N = (size_t)B * T;
    if (!whole(m) || a->m != m || inputs == NULL || B == 0 || T == 0 || B > a->max_B ||
        T > c->seq_len) {
        return -EINVAL;
    }
    /* refuse bad tokens before computing anything */
    if (eng_model_check_tokens(inputs, N, c->vocab) < 0 ||
        (targets != NULL && eng_model_check_tokens(targets, N, c->vocab) < 0)) {
        return -EINVAL;
    }
    eng_acts_reset(a);
    float *out = a->blk[c->layers - 1].res3;
    int rc = eng_model_embed_forward(m, a, inputs, B, T, a->encoded);
    if (rc == 0) {
        rc = eng_model_blocks_forward(m, a, 0, c->layers, a->encoded, out, B, T);
    }
    if (rc == 0) {
        rc = eng_model_head_forward(m, a, out, targets, B, T, loss);
    }
    return rc;
}

int eng_model_backward_acts(eng_model_t *m, eng_acts_t *a, float grad_scale)
{
    if (!whole(m) || a->m != m) {
        return -EINVAL;
    }
    int rc = eng_model_head_backward(m, a, grad_scale, m->dres);
    if (rc == 0) {
        rc = eng_model_blocks_backward(m, a, 0, m->cfg.layers, m->dres, m->dres);
    }
    if (rc == 0) {
        rc = eng_model_embed_backward(m, a, m->dres);
    }
    return rc;
}

int eng_model_forward(eng_model_t *m, const int32_t *inputs, const int32_t *targets, uint32_t B,
                      uint32_t T, float *loss)
{
    if (!whole(m)) {
        return -EINVAL;
    }
    if (m->acts == NULL) {
        int rc = eng_acts_create(m, m->max_B, &m->acts);
        if (rc < 0) {
            return rc;
        }
    }
    return eng_model_forward_acts(m, m->acts, inputs, targets, B, T, loss);
}

int eng_model_backward(eng_model_t *m, float grad_scale)
{
    return m->acts != NULL ? eng_model_backward_acts(m, m->acts, grad_scale) : CH_E_STATE;
}
