/* GPT-2 for one rank (model.h, DESIGN §7).
 *
 * Theory of operation. Parameters live in one slab in Hugging Face order: wte, wpe,
 * then for each block the twelve h.{l}.* tensors (so a block's parameters are one
 * contiguous range, the unit a ZeRO-3 shard splits), then ln_f. Gradients use the same
 * layout. Activations for max_B sequences of seq_len tokens are allocated once; a
 * forward over B x T (B <= max_B, T <= seq_len) uses a prefix of each buffer.
 *
 * Forward and backward are written per transformer block (block_forward,
 * block_backward) so a pipeline stage can run any range of blocks on one micro-batch.
 * A block's backward takes the gradient of its output in dres and leaves the gradient of
 * its input there (the residual stream's gradient flows through one buffer); the
 * intermediate gradients share two scratch buffers, [N,4C] and [N,C].
 *
 * The LM head is tied to wte and fused with the loss (kernels/xent.h). Its logits are
 * held for at most `logits_rows` rows at a time (a budget of LOGITS_BUDGET floats):
 * when a micro-batch fits, the backward reuses the forward's logits; when it does not,
 * the forward keeps only each row's log-sum-exp and the backward recomputes each chunk's
 * logits (one extra head matmul for all but the last chunk, bounded memory). */
#include "workerd/engine/model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"

#define LOGITS_BUDGET ((size_t)64 << 20) /* floats held for logits: 256 MiB */
#define INIT_STD      0.02f

// ----------------------------------------------------------------------------
// tensors of one block, in slab order

enum {
    LN1W,
    LN1B,
    QKVW,
    QKVB,
    ATTPROJW,
    ATTPROJB,
    LN2W,
    LN2B,
    FCW,
    FCB,
    FCPROJW,
    FCPROJB,
    NBLOCK_TENSORS
};

enum init_kind { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_RESID };

typedef struct block_tensor_spec {
    const char *suffix;
    uint32_t ndim;
    uint32_t rows, cols; /* shape in units of C (cols unused when ndim == 1) */
    enum init_kind init;
    eng_split_t split;
} block_tensor_spec_t;

static const block_tensor_spec_t block_specs[NBLOCK_TENSORS] = {
    [LN1W] = {"ln_1.weight", 1, 1, 0, INIT_ONE, ENG_SPLIT_NONE},
    [LN1B] = {"ln_1.bias", 1, 1, 0, INIT_ZERO, ENG_SPLIT_NONE},
    [QKVW] = {"attn.c_attn.weight", 2, 1, 3, INIT_NORMAL, ENG_SPLIT_COLUMN},
    [QKVB] = {"attn.c_attn.bias", 1, 3, 0, INIT_ZERO, ENG_SPLIT_COLUMN},
    [ATTPROJW] = {"attn.c_proj.weight", 2, 1, 1, INIT_RESID, ENG_SPLIT_ROW},
    [ATTPROJB] = {"attn.c_proj.bias", 1, 1, 0, INIT_ZERO, ENG_SPLIT_NONE},
    [LN2W] = {"ln_2.weight", 1, 1, 0, INIT_ONE, ENG_SPLIT_NONE},
    [LN2B] = {"ln_2.bias", 1, 1, 0, INIT_ZERO, ENG_SPLIT_NONE},
    [FCW] = {"mlp.c_fc.weight", 2, 1, 4, INIT_NORMAL, ENG_SPLIT_COLUMN},
    [FCB] = {"mlp.c_fc.bias", 1, 4, 0, INIT_ZERO, ENG_SPLIT_COLUMN},
    [FCPROJW] = {"mlp.c_proj.weight", 2, 4, 1, INIT_RESID, ENG_SPLIT_ROW},
    [FCPROJB] = {"mlp.c_proj.bias", 1, 1, 0, INIT_ZERO, ENG_SPLIT_NONE},
};

/* Activations of one block for N = B*T positions. */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
    float *qkv;                       /* [N,3C] */
    float *att;                       /* [B,NH,T,T] softmax probabilities */
    float *atty;                      /* [N,C] attention output before c_proj */
    float *res2;                      /* [N,C] x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N,C], [N], [N] */
    float *fch, *fch_gelu;            /* [N,4C] */
    float *res3;                      /* [N,C] block output */
} block_acts_t;

struct eng_model {
    eng_config_t cfg;
    const eng_backend_t *be; /* kernels and memory (borrowed) */
    uint32_t max_B;
    uint64_t seed;

    size_t nparams;
    float *params, *grads;
    float *own_grads; /* grads unless the caller lent a buffer (eng_model_lend_grads) */
    eng_tensor_t *tensors;
    size_t ntensors;
    size_t wte, wpe, lnfw, lnfb; /* slab offsets */
    size_t *block_off;           /* [L][NBLOCK_TENSORS] slab offsets */

    float *acts;       /* one allocation holding everything below */
    float *encoded;    /* [N,C] */
    block_acts_t *blk; /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *lse, *losses;         /* [N] */
    float *dres, *dsmall, *dbig; /* backward: [N,C], [N,C], [N,4C] */
    float *datt;                 /* backward attention scratch [T,T] */
    int32_t *inputs, *targets;   /* copies of the last forward's [N] */

    float *logits;             /* [logits_cap, Vp] */
    size_t logits_cap;         /* rows the logits buffer holds */
    size_t logits_budget_rows; /* rows allowed for chunked training forwards */

    uint32_t B, T;    /* shape of the last forward */
    int have_targets; /* last forward had targets (backward allowed) */
    int logits_valid; /* logits buffer holds all B*T rows of the last forward */
};

static float *P(eng_model_t *m, uint32_t l, int i)
{
    return m->params + m->block_off[(size_t)l * NBLOCK_TENSORS + i];
}

static float *G(eng_model_t *m, uint32_t l, int i)
{
    return m->grads + m->block_off[(size_t)l * NBLOCK_TENSORS + i];
}

// ----------------------------------------------------------------------------
// parameter table and initialisation

static void add_tensor(eng_model_t *m, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1,
                       size_t numel, int block, eng_split_t split)
{
    eng_tensor_t *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->offset = m->nparams;
    t->numel = numel;
    t->decay = ndim == 2;
    t->block = block;
    t->split = split;
    m->nparams += numel;
}

static void build_table(eng_model_t *m)
{
    const eng_config_t *c = &m->cfg;
    uint32_t C = c->embd;
    char name[64];
    m->wte = m->nparams;
    add_tensor(m, "wte.weight", 2, c->vocab, C, (size_t)c->padded_vocab * C, -1, ENG_SPLIT_VOCAB);
    m->wpe = m->nparams;
    add_tensor(m, "wpe.weight", 2, c->seq_len, C, (size_t)c->seq_len * C, -1, ENG_SPLIT_NONE);
    for (uint32_t l = 0; l < c->layers; l++) {
        for (int i = 0; i < NBLOCK_TENSORS; i++) {
            const block_tensor_spec_t *s = &block_specs[i];
            uint32_t d0 = s->rows * C, d1 = s->cols * C;
            size_t numel = s->ndim == 2 ? (size_t)d0 * d1 : d0;
            snprintf(name, sizeof name, "h.%u.%s", l, s->suffix);
            m->block_off[(size_t)l * NBLOCK_TENSORS + i] = m->nparams;
            add_tensor(m, name, s->ndim, d0, d1, numel, (int)l, s->split);
        }
    }
    m->lnfw = m->nparams;
    add_tensor(m, "ln_f.weight", 1, C, 0, C, -1, ENG_SPLIT_NONE);
    m->lnfb = m->nparams;
    add_tensor(m, "ln_f.bias", 1, C, 0, C, -1, ENG_SPLIT_NONE);
}

/* Each element is a function of (seed, name, index in the Hugging Face tensor) only. */
static void init_params(eng_model_t *m)
{
    const eng_config_t *c = &m->cfg;
    float resid_std = INIT_STD / sqrtf(2.0f * (float)c->layers);
    memset(m->params, 0, m->nparams * sizeof(float)); /* biases, padded wte rows */
    for (size_t i = 0; i < m->ntensors; i++) {
        const eng_tensor_t *t = &m->tensors[i];
        float *p = m->params + t->offset;
        size_t real = t->ndim == 2 ? (size_t)t->shape[0] * t->shape[1] : t->shape[0];
        enum init_kind kind = INIT_NORMAL; /* wte, wpe */
        if (t->block >= 0) {
            kind = block_specs[(i - 2) % NBLOCK_TENSORS].init; /* table order: wte, wpe, blocks */
        } else if (t->offset == m->lnfw) {
            kind = INIT_ONE;
        } else if (t->offset == m->lnfb) {
            kind = INIT_ZERO;
        }
        if (kind == INIT_ONE) {
            for (size_t j = 0; j < real; j++) {
                p[j] = 1.0f;
            }
        } else if (kind == INIT_NORMAL || kind == INIT_RESID) {
            ch_rng_fill_normal(p, real, m->seed, t->name, 0,
                               kind == INIT_RESID ? resid_std : INIT_STD);
        }
    }
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

/* Carve the activation buffers out of one allocation; with base NULL only count. */
static size_t carve(eng_model_t *m, float *base)
{
    const eng_config_t *c = &m->cfg;
    size_t N = (size_t)m->max_B * c->seq_len, C = c->embd, T = c->seq_len;
    size_t off = 0;
#define TAKE(ptr, n)                                                                               \
    do {                                                                                           \
        if (base != NULL)                                                                          \
            (ptr) = base + off;                                                                    \
        off += ((size_t)(n) + 15) & ~(size_t)15;                                                   \
    } while (0)
    TAKE(m->encoded, N * C);
    for (uint32_t l = 0; l < c->layers; l++) {
        block_acts_t *a = &m->blk[l];
        TAKE(a->ln1, N * C);
        TAKE(a->ln1_mean, N);
        TAKE(a->ln1_rstd, N);
        TAKE(a->qkv, N * 3 * C);
        TAKE(a->att, (size_t)m->max_B * c->heads * T * T);
        TAKE(a->atty, N * C);
        TAKE(a->res2, N * C);
        TAKE(a->ln2, N * C);
        TAKE(a->ln2_mean, N);
        TAKE(a->ln2_rstd, N);
        TAKE(a->fch, N * 4 * C);
        TAKE(a->fch_gelu, N * 4 * C);
        TAKE(a->res3, N * C);
    }
    TAKE(m->lnf, N * C);
    TAKE(m->lnf_mean, N);
    TAKE(m->lnf_rstd, N);
    TAKE(m->lse, N);
    TAKE(m->losses, N);
    TAKE(m->dres, N * C);
    TAKE(m->dsmall, N * C);
    TAKE(m->dbig, N * 4 * C);
    TAKE(m->datt, T * T);
#undef TAKE
    return off;
}

static float *alloc_floats(const eng_model_t *m, size_t n)
{
    void *p = NULL;
    if (m->be->alloc(m->be, n * sizeof(float), &p) < 0) {
        return NULL;
    }
    return p;
}

int eng_model_create(const eng_config_t *cfg, uint32_t max_B, uint64_t seed, eng_model_t **out)
{
    return eng_model_create_opts(cfg, NULL, max_B, seed, out);
}

int eng_model_create_opts(const eng_config_t *cfg, const eng_model_opts_t *opts, uint32_t max_B,
                          uint64_t seed, eng_model_t **out)
{
    *out = NULL;
    int rc = check_config(cfg, max_B);
    if (rc < 0) {
        return rc;
    }
    eng_model_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return -ENOMEM;
    }
    m->cfg = *cfg;
    m->be = opts && opts->backend ? opts->backend : eng_backend_cpu();
    m->max_B = max_B;
    m->seed = seed;
    size_t L = cfg->layers, N = (size_t)max_B * cfg->seq_len;
    rc = -ENOMEM;
    m->tensors = calloc(2 + L * NBLOCK_TENSORS + 2, sizeof *m->tensors);
    m->block_off = calloc(L * NBLOCK_TENSORS, sizeof *m->block_off);
    m->blk = calloc(L, sizeof *m->blk);
    m->inputs = malloc(N * sizeof *m->inputs);
    m->targets = malloc(N * sizeof *m->targets);
    if (!m->tensors || !m->block_off || !m->blk || !m->inputs || !m->targets) {
        goto fail;
    }
    build_table(m);
    m->params = alloc_floats(m, m->nparams);
    m->grads = m->own_grads = alloc_floats(m, m->nparams);
    m->acts = alloc_floats(m, carve(m, NULL));
    size_t budget_rows = LOGITS_BUDGET / cfg->padded_vocab;
    m->logits_budget_rows = budget_rows == 0 ? 1 : budget_rows < N ? budget_rows : N;
    m->logits_cap = m->logits_budget_rows;
    m->logits = alloc_floats(m, m->logits_cap * cfg->padded_vocab);
    if (!m->params || !m->grads || !m->acts || !m->logits) {
        goto fail;
    }
    carve(m, m->acts);
    init_params(m);
    m->be->memset(m->be, m->grads, 0, m->nparams * sizeof(float));
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
    m->be->free(m->be, m->logits);
    m->be->free(m->be, m->acts);
    m->be->free(m->be, m->own_grads);
    m->be->free(m->be, m->params);
    free(m->targets);
    free(m->inputs);
    free(m->blk);
    free(m->block_off);
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

size_t eng_model_nparams(const eng_model_t *m)
{
    return m->nparams;
}

float *eng_model_params(eng_model_t *m)
{
    return m->params;
}

void eng_model_lend_grads(eng_model_t *m, float *buf)
{
    m->be->copy(m->be, buf, m->grads, m->nparams * sizeof(float), ENG_COPY_D2D);
    m->grads = buf;
    m->be->free(m->be, m->own_grads);
    m->own_grads = NULL;
}

float *eng_model_grads(eng_model_t *m)
{
    return m->grads;
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
    return m->logits_valid ? m->logits : NULL;
}

void eng_model_zero_grad(eng_model_t *m)
{
    m->be->memset(m->be, m->grads, 0, m->nparams * sizeof(float));
}

// ----------------------------------------------------------------------------
// one transformer block: x [N,C] -> blk[l].res3 [N,C]

static void block_forward(eng_model_t *m, uint32_t l, const float *x, int B, int T)
{
    block_acts_t *a = &m->blk[l];
    int C = (int)m->cfg.embd, NH = (int)m->cfg.heads, N = B * T;
    m->be->layernorm_fwd(m->be, a->ln1, a->ln1_mean, a->ln1_rstd, x, P(m, l, LN1W), P(m, l, LN1B),
                         N, C);
    m->be->matmul_fwd(m->be, a->qkv, a->ln1, P(m, l, QKVW), P(m, l, QKVB), N, C, 3 * C);
    m->be->attention_fwd(m->be, a->atty, a->att, a->qkv, B, T, C, NH);
    m->be->matmul_fwd(m->be, a->res2, a->atty, P(m, l, ATTPROJW), P(m, l, ATTPROJB), N, C, C);
    m->be->residual_fwd(m->be, a->res2, a->res2, x, (size_t)N * C);
    m->be->layernorm_fwd(m->be, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, P(m, l, LN2W),
                         P(m, l, LN2B), N, C);
    m->be->matmul_fwd(m->be, a->fch, a->ln2, P(m, l, FCW), P(m, l, FCB), N, C, 4 * C);
    m->be->gelu_fwd(m->be, a->fch_gelu, a->fch, (size_t)N * 4 * C);
    m->be->matmul_fwd(m->be, a->res3, a->fch_gelu, P(m, l, FCPROJW), P(m, l, FCPROJB), N, 4 * C, C);
    m->be->residual_fwd(m->be, a->res3, a->res3, a->res2, (size_t)N * C);
}

/* dres: in, gradient of the block's output; out, gradient of its input x. */
static void block_backward(eng_model_t *m, uint32_t l, const float *x, float *dres, int B, int T)
{
    block_acts_t *a = &m->blk[l];
    int C = (int)m->cfg.embd, NH = (int)m->cfg.heads, N = B * T;
    float *dbig = m->dbig, *dsmall = m->dsmall;
    // MLP branch: res3 = res2 + gelu(ln2(res2) @ Wfc + bfc) @ Wproj + bproj
    m->be->matmul_bwd(m->be, dbig, G(m, l, FCPROJW), G(m, l, FCPROJB), dres, a->fch_gelu,
                      P(m, l, FCPROJW), N, 4 * C, C);
    m->be->gelu_bwd(m->be, dbig, a->fch, dbig, (size_t)N * 4 * C);
    m->be->matmul_bwd(m->be, dsmall, G(m, l, FCW), G(m, l, FCB), dbig, a->ln2, P(m, l, FCW), N, C,
                      4 * C);
    m->be->layernorm_bwd(m->be, dres, G(m, l, LN2W), G(m, l, LN2B), dsmall, a->res2, P(m, l, LN2W),
                         a->ln2_mean, a->ln2_rstd, N, C);
    // attention branch: res2 = x + attn(ln1(x)) @ Wproj + bproj
    m->be->matmul_bwd(m->be, dsmall, G(m, l, ATTPROJW), G(m, l, ATTPROJB), dres, a->atty,
                      P(m, l, ATTPROJW), N, C, C);
    m->be->attention_bwd(m->be, dbig, m->datt, dsmall, a->qkv, a->att, B, T, C, NH);
    m->be->matmul_bwd(m->be, dsmall, G(m, l, QKVW), G(m, l, QKVB), dbig, a->ln1, P(m, l, QKVW), N,
                      C, 3 * C);
    m->be->layernorm_bwd(m->be, dres, G(m, l, LN1W), G(m, l, LN1B), dsmall, x, P(m, l, LN1W),
                         a->ln1_mean, a->ln1_rstd, N, C);
}

static const float *block_input(const eng_model_t *m, uint32_t l)
{
    return l == 0 ? m->encoded : m->blk[l - 1].res3;
}

// ----------------------------------------------------------------------------
// forward / backward

static int check_tokens(const int32_t *tok, size_t n, uint32_t vocab)
{
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || (uint32_t)tok[i] >= vocab) {
            return -EINVAL;
        }
    }
    return 0;
}

int eng_model_forward(eng_model_t *m, const int32_t *inputs, const int32_t *targets, uint32_t B,
                      uint32_t T, float *loss)
{
    const eng_config_t *c = &m->cfg;
    if (B == 0 || T == 0 || B > m->max_B || T > c->seq_len || inputs == NULL) {
        return -EINVAL;
    }
    size_t N = (size_t)B * T;
    int C = (int)c->embd, V = (int)c->vocab, Vp = (int)c->padded_vocab;
    if (check_tokens(inputs, N, c->vocab) < 0 ||
        (targets != NULL && check_tokens(targets, N, c->vocab) < 0)) {
        return -EINVAL;
    }
    if (targets == NULL && m->logits_cap < N) {
        // generation/eval wants every row's logits: grow once to the full size
        float *bigger = alloc_floats(m, N * c->padded_vocab);
        if (bigger == NULL) {
            return -ENOMEM;
        }
        m->be->free(m->be, m->logits);
        m->logits = bigger;
        m->logits_cap = N;
    }
    m->have_targets = 0;
    m->logits_valid = 0;
    memcpy(m->inputs, inputs, N * sizeof *inputs);

    m->be->encoder_fwd(m->be, m->encoded, m->inputs, m->params + m->wte, m->params + m->wpe, (int)B,
                       (int)T, C);
    for (uint32_t l = 0; l < c->layers; l++) {
        block_forward(m, l, block_input(m, l), (int)B, (int)T);
    }
    m->be->layernorm_fwd(m->be, m->lnf, m->lnf_mean, m->lnf_rstd, block_input(m, c->layers),
                         m->params + m->lnfw, m->params + m->lnfb, (int)N, C);

    const float *wte = m->params + m->wte;
    if (targets == NULL) {
        m->be->lmhead_fwd(m->be, m->logits, NULL, NULL, m->lnf, wte, NULL, (int)N, C, V, Vp);
        m->logits_valid = 1;
        return 0;
    }
    memcpy(m->targets, targets, N * sizeof *targets);
    size_t rows = m->logits_budget_rows;
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        m->be->lmhead_fwd(m->be, m->logits, m->lse + r, m->losses + r, m->lnf + r * C, wte,
                          m->targets + r, (int)n, C, V, Vp);
    }
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        sum += m->losses[i];
    }
    if (loss != NULL) {
        *loss = (float)(sum / (double)N);
    }
    m->B = B;
    m->T = T;
    m->have_targets = 1;
    m->logits_valid = N <= rows;
    return 0;
}

int eng_model_backward(eng_model_t *m, float grad_scale)
{
    if (!m->have_targets) {
        return CH_E_STATE;
    }
    const eng_config_t *c = &m->cfg;
    int B = (int)m->B, T = (int)m->T, C = (int)c->embd, V = (int)c->vocab;
    int Vp = (int)c->padded_vocab;
    size_t N = (size_t)B * T, rows = m->logits_budget_rows;
    const float *wte = m->params + m->wte;
    float *gwte = m->grads + m->wte;

    // LM head, last chunk first: its logits are still in the buffer
    for (size_t r = ((N - 1) / rows) * rows, first = 1;; r -= rows, first = 0) {
        size_t n = N - r < rows ? N - r : rows;
        if (!first) {
            m->be->lmhead_fwd(m->be, m->logits, NULL, NULL, m->lnf + r * C, wte, NULL, (int)n, C, V,
                              Vp);
        }
        m->be->lmhead_bwd(m->be, m->dsmall + r * C, gwte, m->logits, m->lse + r, m->lnf + r * C,
                          wte, m->targets + r, grad_scale, (int)n, C, V, Vp);
        if (r == 0) {
            break;
        }
    }
    m->logits_valid = 0;
    m->have_targets = 0;

    m->be->memset(m->be, m->dres, 0, N * C * sizeof(float));
    m->be->layernorm_bwd(m->be, m->dres, m->grads + m->lnfw, m->grads + m->lnfb, m->dsmall,
                         block_input(m, c->layers), m->params + m->lnfw, m->lnf_mean, m->lnf_rstd,
                         (int)N, C);
    for (uint32_t l = c->layers; l-- > 0;) {
        block_backward(m, l, block_input(m, l), m->dres, B, T);
    }
    m->be->encoder_bwd(m->be, m->grads + m->wte, m->grads + m->wpe, m->dres, m->inputs, B, T, C);
    return 0;
}
