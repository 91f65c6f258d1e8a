/* The stage API (model.h): the embedding, a range of transformer blocks and the head, each
 * forward and backward on explicit buffers and one micro-batch's acts. The whole-model
 * passes (model.c) are these three in a row.
 *
 * Theory of operation. A block's forward saves in the acts what its backward needs,
 * including a pointer to its input x (for the first block of a range, the caller's
 * buffer; for the others, the previous block's output in the acts). Its backward takes
 * the gradient of its output in dres and leaves the gradient of its input there (the
 * residual stream's gradient flows through one buffer); the intermediate gradients share
 * the model's two scratch buffers, [N,4C] and [N,C], so one backward runs at a time.
 *
 * The LM head is tied to wte and fused with the loss (kernels/xent.h). Its logits are
 * held for at most `logits_rows` rows at a time in one buffer per model: when a
 * micro-batch fits, the backward reuses the forward's logits if no other forward has
 * replaced them since; otherwise the forward keeps only each row's log-sum-exp and the
 * backward recomputes each chunk's logits (the same kernel on the same inputs: the same
 * bits; bounded memory). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "workerd/engine/model_impl.h"

// ----------------------------------------------------------------------------
// one transformer block: x [N,C] -> out [N,C]

static void block_forward(eng_model_t *m, eng_acts_t *a, uint32_t l, const float *x, float *out)
{
    const eng_backend_t *be = m->be;
    block_acts_t *b = &a->blk[l - m->part.first];
    int C = (int)m->cfg.embd, NH = (int)m->cfg.heads, B = (int)a->B, T = (int)a->T, N = B * T;
    be->layernorm_fwd(be, b->ln1, b->ln1_mean, b->ln1_rstd, x, P(m, l, LN1W), P(m, l, LN1B), N, C);
    be->matmul_fwd(be, b->qkv, b->ln1, P(m, l, QKVW), P(m, l, QKVB), N, C, 3 * C);
    be->attention_fwd(be, b->atty, b->att, b->qkv, B, T, C, NH);
    be->matmul_fwd(be, b->res2, b->atty, P(m, l, ATTPROJW), P(m, l, ATTPROJB), N, C, C);
    be->residual_fwd(be, b->res2, b->res2, x, (size_t)N * C);
    be->layernorm_fwd(be, b->ln2, b->ln2_mean, b->ln2_rstd, b->res2, P(m, l, LN2W), P(m, l, LN2B),
                      N, C);
    be->matmul_fwd(be, b->fch, b->ln2, P(m, l, FCW), P(m, l, FCB), N, C, 4 * C);
    be->gelu_fwd(be, b->fch_gelu, b->fch, (size_t)N * 4 * C);
    be->matmul_fwd(be, out, b->fch_gelu, P(m, l, FCPROJW), P(m, l, FCPROJB), N, 4 * C, C);
    be->residual_fwd(be, out, out, b->res2, (size_t)N * C);
    b->x = x;
    b->live = 1;
}

/* dres: in, gradient of the block's output; out, gradient of its input x. */
static void block_backward(eng_model_t *m, eng_acts_t *a, uint32_t l, float *dres)
{
    const eng_backend_t *be = m->be;
    block_acts_t *b = &a->blk[l - m->part.first];
    int C = (int)m->cfg.embd, NH = (int)m->cfg.heads, B = (int)a->B, T = (int)a->T, N = B * T;
    float *dbig = m->dbig, *dsmall = m->dsmall;
    // MLP branch: res3 = res2 + gelu(ln2(res2) @ Wfc + bfc) @ Wproj + bproj
    be->matmul_bwd(be, dbig, G(m, l, FCPROJW), G(m, l, FCPROJB), dres, b->fch_gelu,
                   P(m, l, FCPROJW), N, 4 * C, C);
    be->gelu_bwd(be, dbig, b->fch, dbig, (size_t)N * 4 * C);
    be->matmul_bwd(be, dsmall, G(m, l, FCW), G(m, l, FCB), dbig, b->ln2, P(m, l, FCW), N, C, 4 * C);
    be->layernorm_bwd(be, dres, G(m, l, LN2W), G(m, l, LN2B), dsmall, b->res2, P(m, l, LN2W),
                      b->ln2_mean, b->ln2_rstd, N, C);
    // attention branch: res2 = x + attn(ln1(x)) @ Wproj + bproj
    be->matmul_bwd(be, dsmall, G(m, l, ATTPROJW), G(m, l, ATTPROJB), dres, b->atty,
                   P(m, l, ATTPROJW), N, C, C);
    be->attention_bwd(be, dbig, m->datt, dsmall, b->qkv, b->att, B, T, C, NH);
    be->matmul_bwd(be, dsmall, G(m, l, QKVW), G(m, l, QKVB), dbig, b->ln1, P(m, l, QKVW), N, C,
                   3 * C);
    be->layernorm_bwd(be, dres, G(m, l, LN1W), G(m, l, LN1B), dsmall, b->x, P(m, l, LN1W),
                      b->ln1_mean, b->ln1_rstd, N, C);
    b->live = 0;
}

// ----------------------------------------------------------------------------
// checks shared with model.c

int eng_model_check_tokens(const int32_t *tok, size_t n, uint32_t vocab)
{
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || (uint32_t)tok[i] >= vocab) {
            return -EINVAL;
        }
    }
    return 0;
}

static int in_flight(const eng_acts_t *a)
{
    uint32_t n = a->m->part.last - a->m->part.first;
    int live = a->embed_live || a->head_live;
    for (uint32_t i = 0; i < n && !live; i++) {
        live = a->blk[i].live;
    }
    return live;
}

int eng_model_check_shape(eng_acts_t *a, uint32_t B, uint32_t T)
{
    if (B == 0 || T == 0 || B > a->max_B || T > a->m->cfg.seq_len) {
        return -EINVAL;
    }
    if (in_flight(a) && (B != a->B || T != a->T)) {
        return -EINVAL;
    }
    a->B = B;
    a->T = T;
    return 0;
}

// ----------------------------------------------------------------------------
// embedding

int eng_model_embed_forward(eng_model_t *m, eng_acts_t *a, const int32_t *inputs, uint32_t B,
                            uint32_t T, float *out)
{
    if (!m->part.embedding || a->m != m || inputs == NULL || out == NULL) {
        return -EINVAL;
    }
    int rc = eng_model_check_shape(a, B, T);
    size_t N = (size_t)B * T;
    if (rc == 0) {
        rc = eng_model_check_tokens(inputs, N, m->cfg.vocab);
    }
    if (rc == 0) {
        rc = m->be->copy(m->be, a->inputs, inputs, N * sizeof *inputs, ENG_COPY_H2D);
    }
    if (rc < 0) {
        return rc;
    }
    m->be->encoder_fwd(m->be, out, a->inputs, m->params + m->wte, m->params + m->wpe, (int)B,
                       (int)T, (int)m->cfg.embd);
    a->embed_live = 1;
    return 0;
}

int eng_model_embed_backward(eng_model_t *m, eng_acts_t *a, const float *dout)
{
    if (!m->part.embedding || a->m != m || dout == NULL) {
        return -EINVAL;
    }
    if (!a->embed_live) {
        return CH_E_STATE;
    }
    m->be->encoder_bwd(m->be, m->grads + m->wte, m->grads + m->wpe, dout, a->inputs, (int)a->B,
                       (int)a->T, (int)m->cfg.embd);
    a->embed_live = 0;
    return 0;
}

// ----------------------------------------------------------------------------
// blocks

static int check_range(const eng_model_t *m, const eng_acts_t *a, uint32_t first, uint32_t last)
{
    return a->m == m && first < last && first >= m->part.first && last <= m->part.last ? 0
                                                                                       : -EINVAL;
}

int eng_model_blocks_forward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                             const float *x, float *y, uint32_t B, uint32_t T)
{
    int rc = check_range(m, a, first, last);
    if (rc == 0 && (x == NULL || y == NULL || x == y)) {
        rc = -EINVAL;
    }
    if (rc == 0) {
        rc = eng_model_check_shape(a, B, T);
    }
    if (rc < 0) {
        return rc;
    }
    for (uint32_t l = first; l < last; l++) {
        float *out = l + 1 == last ? y : a->blk[l - m->part.first].res3;
        block_forward(m, a, l, x, out);
        x = out;
    }
    return 0;
}

int eng_model_blocks_backward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                              const float *dy, float *dx)
{
    int rc = check_range(m, a, first, last);
    if (rc == 0 && (dy == NULL || dx == NULL)) {
        rc = -EINVAL;
    }
    for (uint32_t l = first; rc == 0 && l < last; l++) {
        if (!a->blk[l - m->part.first].live) {
            rc = CH_E_STATE;
        }
    }
    if (rc == 0 && dx != dy) {
        size_t n = (size_t)a->B * a->T * m->cfg.embd;
        rc = m->be->copy(m->be, dx, dy, n * sizeof(float), ENG_COPY_D2D);
    }
    if (rc < 0) {
        return rc;
    }
    for (uint32_t l = last; l-- > first;) {
        block_backward(m, a, l, dx);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// head: ln_f, the LM head tied to wte, cross-entropy

/* Generation and evaluation want every row's logits: grow the buffer once to N rows. */
static int logits_for(eng_model_t *m, size_t N)
{
    if (m->logits_cap >= N) {
        return 0;
    }
    void *bigger = NULL;
    int rc = m->be->alloc(m->be, N * m->cfg.padded_vocab * sizeof(float), &bigger);
    if (rc < 0) {
        return rc;
    }
    m->be->free(m->be, m->logits);
    m->logits = bigger;
    m->logits_cap = N;
    return 0;
}

static int head_loss(eng_model_t *m, eng_acts_t *a, const int32_t *targets, float *loss)
{
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    size_t N = (size_t)a->B * a->T, rows = m->logits_budget_rows;
    const float *wte = m->params + m->wte;
    int rc = be->copy(be, a->targets, targets, N * sizeof *targets, ENG_COPY_H2D);
    if (rc < 0) {
        return rc;
    }
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        be->lmhead_fwd(be, m->logits, a->lse + r, a->losses + r, a->lnf + r * C, wte,
                       a->targets + r, (int)n, C, V, Vp);
    }
    rc = be->copy(be, a->losses_host, a->losses, N * sizeof(float), ENG_COPY_D2H);
    if (rc < 0) {
        return rc;
    }
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        sum += a->losses_host[i];
    }
    if (loss != NULL) {
        *loss = (float)(sum / (double)N);
    }
    m->logits_of = a;
    m->logits_all = N <= rows;
    a->head_live = 1;
    return 0;
}

int eng_model_head_forward(eng_model_t *m, eng_acts_t *a, const float *x, const int32_t *targets,
                           uint32_t B, uint32_t T, float *loss)
{
    if (!m->part.head || a->m != m || x == NULL) {
        return -EINVAL;
    }
    int rc = eng_model_check_shape(a, B, T);
    size_t N = (size_t)B * T;
    if (rc == 0 && targets != NULL) {
        rc = eng_model_check_tokens(targets, N, m->cfg.vocab);
    }
    if (rc == 0 && targets == NULL) {
        rc = logits_for(m, N);
    }
    if (rc < 0) {
        return rc;
    }
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    a->head_live = 0;
    m->logits_of = NULL;
    m->logits_all = 0;
    be->layernorm_fwd(be, a->lnf, a->lnf_mean, a->lnf_rstd, x, m->params + m->lnfw,
                      m->params + m->lnfb, (int)N, C);
    a->head_x = x;
    if (targets == NULL) {
        be->lmhead_fwd(be, m->logits, NULL, NULL, a->lnf, m->params + m->wte, NULL, (int)N, C, V,
                       Vp);
        m->logits_all = 1;
        return 0;
    }
    return head_loss(m, a, targets, loss);
}

int eng_model_head_backward(eng_model_t *m, eng_acts_t *a, float grad_scale, float *dx)
{
    if (!m->part.head || a->m != m || dx == NULL) {
        return -EINVAL;
    }
    if (!a->head_live) {
        return CH_E_STATE;
    }
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    size_t N = (size_t)a->B * a->T, rows = m->logits_budget_rows;
    const float *wte = m->params + m->wte;
    float *gwte = m->grads + m->wte;

    // LM head, last chunk first: its logits may still be in the buffer
    for (size_t r = ((N - 1) / rows) * rows, first = 1;; r -= rows, first = 0) {
        size_t n = N - r < rows ? N - r : rows;
        if (!first || m->logits_of != a) {
            be->lmhead_fwd(be, m->logits, NULL, NULL, a->lnf + r * C, wte, NULL, (int)n, C, V, Vp);
        }
        be->lmhead_bwd(be, m->dsmall + r * C, gwte, m->logits, a->lse + r, a->lnf + r * C, wte,
                       a->targets + r, grad_scale, (int)n, C, V, Vp);
        if (r == 0) {
            break;
        }
    }
    m->logits_of = NULL;
    m->logits_all = 0;
    a->head_live = 0;

    int rc = be->memset(be, dx, 0, N * C * sizeof(float));
    if (rc < 0) {
        return rc;
    }
    be->layernorm_bwd(be, dx, m->grads + m->lnfw, m->grads + m->lnfb, m->dsmall, a->head_x,
                      m->params + m->lnfw, a->lnf_mean, a->lnf_rstd, (int)N, C);
    return 0;
}
