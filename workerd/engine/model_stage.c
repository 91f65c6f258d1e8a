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
 * held for at most `logits_budget_rows` rows at a time in one buffer per model (the memory
 * budget). When a micro-batch fits, the forward keeps its logits and the backward reuses
 * them if no other forward has replaced them since. When it does not fit (ENG_HEAD_FUSED),
 * the forward runs the head's backward too, chunk by chunk (kn_lmhead_fwdbwd): each
 * chunk's logits are computed once, turned into the unscaled dlogits in place and consumed
 * at once by the two backward SGEMMs; what the backward needs is then dx [N,C] and
 * dwte [V,C], unscaled, which it multiplies by the loss scale. The scratch lives in the
 * logits buffer: a chunk of rows*Vp floats (head_fused picks rows from the memory budget and
 * the SGEMMs' cache blocking), V*C floats for dwte, plus C floats (4*C bytes: 3 KiB for
 * GPT-2) per token row; for GPT-2 at B8 T256, 4 chunks of 512 rows, all inside the
 * budget's 256 MiB buffer (it grows only when a chunk of HEAD_MIN_ROWS does not fit). If another
 * head forward ran in between, or the head is not ENG_HEAD_FUSED (model_impl.h), the backward
 * recomputes each chunk's logits (the same kernel on the same inputs: the same bits). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "kernels/xent.h"
#include "workerd/engine/mem.h"
#include "workerd/engine/model_impl.h"
#include "workerd/engine/tp.h"

// ----------------------------------------------------------------------------
// one transformer block: x [N,C] -> out [N,C]
//
// Megatron's split inside a block over the TP group of p ranks (Cl = C/p, NHl = NH/p):
// c_attn and c_fc are column parallel (this rank computes its heads' q, k, v and its
// quarter of the MLP's hidden units from the whole input: f before them), attn.c_proj and
// mlp.c_proj row parallel (partial products all-reduced: g after them). Their biases are
// replicated and added once: rank 0 of the group seeds its partial product with them.
// LayerNorms are replicated; every rank computes them on the same all-reduced bits, so
// their parameters and gradients stay identical across the group. With p = 1 f and g
// are nothing and this is the plain GPT-2 block.

/* The bias of a row-parallel layer, on the one rank that adds it. */
static const float *row_bias(const eng_model_t *m, uint32_t l, int i)
{
    return m->tpr == 0 ? P(m, l, i) : NULL;
}

/* Where the forward writes a kept activation: its own buffer, or (bf16_acts: kept packed)
 * the staging scratch it is cast from. */
static float *act_out(float *kept, float *stage)
{
    return kept != NULL ? kept : stage;
}

/* bf16_acts: the packed cast of an activation just written (dst NULL: kept as it is). */
static int pack(const eng_model_t *m, kn_bf16_t *dst, const float *src, size_t n)
{
    return dst != NULL ? eng_bf16_cast(m->be, dst, src, n, 1) : 0;
}

/* A kept activation for the kernel about to read it: x itself, or its packed cast x16
 * widened into the wide scratch (exact: the values are bf16). io: only a weight gradient's
 * GEMM reads it, which an input pass does not run: x as it is. */
static int kept_input(const eng_model_t *m, const float *x, const kn_bf16_t *x16, size_t n, int io,
                      const float **out)
{
    *out = x;
    if (x != NULL || x16 == NULL || io)
        return 0;
    *out = m->wide;
    return eng_bf16_cast(m->be, m->wide, x16, n, 0);
}

/* Block l's forward arithmetic on x into out, its activations into b (no hook). */
static int block_compute(eng_model_t *m, eng_acts_t *a, uint32_t l, const float *x, float *out)
{
    const eng_backend_t *be = m->be;
    block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
    int C = (int)m->cfg.embd, Cl = (int)m->Cl, NHl = (int)m->NHl, B = (int)a->B, T = (int)a->T;
    int N = B * T;
    size_t NC = (size_t)N * C, NH4 = (size_t)N * 4 * Cl;
    /* bf16_acts: each written where it lives until its last reader here, then packed */
    float *ln1 = act_out(b->ln1, m->wide), *qkv = act_out(b->qkv, m->wide2);
    float *atty = act_out(b->atty, m->wide), *res2 = act_out(b->res2, m->resid);
    float *ln2 = act_out(b->ln2, m->wide), *fch = act_out(b->fch, m->wide2);
    float *fch_gelu = act_out(b->fch_gelu, m->wide);
    int rc = 0;
    be->layernorm_fwd(be, ln1, b->ln1_mean, b->ln1_rstd, x, P(m, l, LN1W), P(m, l, LN1B), N, C);
    CH_CHECK_GOTO(eng_tp_f_forward(m->tpg, ln1, NC), rc, done);
    CH_CHECK_GOTO(pack(m, b->ln1_16, ln1, NC), rc, done);
    be->matmul_fwd(be, qkv, ln1, P(m, l, QKVW), P(m, l, QKVB), N, C, 3 * Cl);
    CH_CHECK_GOTO(pack(m, b->qkv_16, qkv, (size_t)N * 3 * Cl), rc, done);
    /* b->att NULL (selective): nothing kept, the backward scratch lent to the forward */
    be->attention_fwd(be, atty, b->att, m->datt, qkv, B, T, Cl, NHl);
    CH_CHECK_GOTO(pack(m, b->atty_16, atty, (size_t)N * Cl), rc, done);
    be->matmul_fwd(be, res2, atty, P(m, l, ATTPROJW), row_bias(m, l, ATTPROJB), N, Cl, C);
    CH_CHECK_GOTO(eng_tp_g_forward(m->tpg, m->tp_bf16, res2, NC), rc, done);
    be->residual_fwd(be, res2, res2, x, NC);
    CH_CHECK_GOTO(pack(m, b->res2_16, res2, NC), rc, done);
    be->layernorm_fwd(be, ln2, b->ln2_mean, b->ln2_rstd, res2, P(m, l, LN2W), P(m, l, LN2B), N, C);
    CH_CHECK_GOTO(eng_tp_f_forward(m->tpg, ln2, NC), rc, done);
    CH_CHECK_GOTO(pack(m, b->ln2_16, ln2, NC), rc, done);
    be->matmul_fwd(be, fch, ln2, P(m, l, FCW), P(m, l, FCB), N, C, 4 * Cl);
    CH_CHECK_GOTO(pack(m, b->fch_16, fch, NH4), rc, done);
    be->gelu_fwd(be, fch_gelu, fch, NH4);
    CH_CHECK_GOTO(pack(m, b->fch_gelu_16, fch_gelu, NH4), rc, done);
    be->matmul_fwd(be, out, fch_gelu, P(m, l, FCPROJW), row_bias(m, l, FCPROJB), N, 4 * Cl, C);
    CH_CHECK_GOTO(eng_tp_g_forward(m->tpg, m->tp_bf16, out, NC), rc, done);
    be->residual_fwd(be, out, out, res2, NC);
done:
    return rc;
}

static int block_forward(eng_model_t *m, eng_acts_t *a, uint32_t l, const float *x, float *out)
{
    block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
    int rc = eng_model_block_event(m, l, ENG_BLOCK_FORWARD);
    if (rc == 0) {
        rc = block_compute(m, a, l, x, out);
    }
    if (rc == 0) {
        b->x = x;
        b->out = out;
        b->live = 1;
    }
    return rc;
}

/* What parallel.recompute left out of block l's activations, made again for its backward:
 * the same kernels on the same inputs, the same bits (full: the whole forward, rewriting
 * the output it already wrote). Selective has nothing to do here: its att is NULL and the
 * attention backward recomputes the probabilities itself, a block of query rows at a
 * time, just before it uses them (backend.h). */
static int block_recompute(eng_model_t *m, eng_acts_t *a, uint32_t l)
{
    block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
    if (m->recompute == CH_RECOMPUTE_FULL) {
        return block_compute(m, a, l, b->x, b->out);
    }
    return 0;
}

/* A copy of an output gradient the weight pass will read (dst NULL: a whole backward,
 * which reads it at once). Only the residual stream's gradient is copied: the LayerNorm
 * backward then adds onto it in place. */
static int keep_grad(const eng_backend_t *be, float *dst, const float *src, size_t n)
{
    return dst != NULL ? be->copy(be, dst, src, n * sizeof(float), ENG_COPY_D2D) : 0;
}

/* Block l's gradient base for tensor i; NULL in an input pass (split backward), which
 * writes no gradient. */
static float *GW(const eng_model_t *m, uint32_t l, int i, int input_only)
{
    return input_only ? NULL : G(m, l, i);
}

/* Where block_backward's intermediate gradients go: the model's scratch for a whole
 * backward; for an input pass, those the weight pass reads straight into their kept slots
 * in the block's acts (the kernel that makes one writes there and the next reads it from
 * there: no copy, the same arithmetic, the same bits). */
typedef struct bwd_bufs {
    float *fc;      /* [N,4Cl] c_fc's output gradient, through the GELU */
    float *ln2;     /* [N,C] ln_2's output gradient (c_fc's input, summed over the group) */
    float *qkv;     /* [N,3Cl] c_attn's output gradient */
    float *ln1;     /* [N,C] ln_1's output gradient */
    float *fcproj;  /* copies of the residual gradient: mlp.c_proj's output gradient */
    float *attproj; /* attn.c_proj's */
} bwd_bufs_t;

static bwd_bufs_t bwd_bufs(const eng_model_t *m, const block_acts_t *b, int input_only)
{
    if (input_only)
        return (bwd_bufs_t){b->g_fc, b->g_ln2, b->g_qkv, b->g_ln1, b->g_fcproj, b->g_attproj};
    return (bwd_bufs_t){m->dbig, m->dsmall, m->dbig, m->dsmall, NULL, NULL};
}

/* dres: in, gradient of the block's output; out, gradient of its input x. input_only (a
 * split backward's input pass): the kernels write the input gradients alone and the
 * output gradients the weight pass reads stay in the block's acts (bwd_bufs). */
static int block_backward(eng_model_t *m, eng_acts_t *a, uint32_t l, float *dres, int input_only)
{
    const eng_backend_t *be = m->be;
    block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
    int C = (int)m->cfg.embd, Cl = (int)m->Cl, NHl = (int)m->NHl, B = (int)a->B, T = (int)a->T;
    int N = B * T, io = input_only;
    size_t NC = (size_t)N * C;
    const float *in = NULL; /* each weight gradient's kept input (kept_input) */
    bwd_bufs_t d = bwd_bufs(m, b, io);
    int rc = eng_model_block_event(m, l, io ? ENG_BLOCK_BACKWARD_INPUT : ENG_BLOCK_BACKWARD);
    if (rc == 0) {
        rc = block_recompute(m, a, l);
    }
    if (rc < 0) {
        return rc;
    }
    // MLP branch: res3 = res2 + g(gelu(f(ln2(res2)) @ Wfc + bfc) @ Wproj) + bproj
    CH_CHECK_GOTO(eng_tp_g_backward(m->tpg, dres, NC), rc, done);
    CH_CHECK_GOTO(keep_grad(be, d.fcproj, dres, NC), rc, done);
    CH_CHECK_GOTO(kept_input(m, b->fch_gelu, b->fch_gelu_16, (size_t)N * 4 * Cl, io, &in), rc,
                  done);
    be->matmul_bwd(be, d.fc, GW(m, l, FCPROJW, io), GW(m, l, FCPROJB, io), dres, in,
                   P(m, l, FCPROJW), N, 4 * Cl, C);
    CH_CHECK_GOTO(kept_input(m, b->fch, b->fch_16, (size_t)N * 4 * Cl, 0, &in), rc, done);
    be->gelu_bwd(be, d.fc, in, d.fc, (size_t)N * 4 * Cl);
    CH_CHECK_GOTO(kept_input(m, b->ln2, b->ln2_16, NC, io, &in), rc, done);
    be->matmul_bwd(be, d.ln2, GW(m, l, FCW, io), GW(m, l, FCB, io), d.fc, in, P(m, l, FCW), N, C,
                   4 * Cl);
    CH_CHECK_GOTO(eng_tp_f_backward(m->tpg, m->tp_bf16, d.ln2, NC), rc, done);
    CH_CHECK_GOTO(kept_input(m, b->res2, b->res2_16, NC, 0, &in), rc, done);
    be->layernorm_bwd(be, dres, GW(m, l, LN2W, io), GW(m, l, LN2B, io), d.ln2, in, P(m, l, LN2W),
                      b->ln2_mean, b->ln2_rstd, N, C);
    // attention branch: res2 = x + g(attn(f(ln1(x))) @ Wproj) + bproj
    CH_CHECK_GOTO(eng_tp_g_backward(m->tpg, dres, NC), rc, done);
    CH_CHECK_GOTO(keep_grad(be, d.attproj, dres, NC), rc, done);
    CH_CHECK_GOTO(kept_input(m, b->atty, b->atty_16, (size_t)N * Cl, io, &in), rc, done);
    be->matmul_bwd(be, m->dsmall, GW(m, l, ATTPROJW, io), GW(m, l, ATTPROJB, io), dres, in,
                   P(m, l, ATTPROJW), N, Cl, C);
    CH_CHECK_GOTO(kept_input(m, b->qkv, b->qkv_16, (size_t)N * 3 * Cl, 0, &in), rc, done);
    be->attention_bwd(be, d.qkv, m->datt, m->dsmall, in, b->att, B, T, Cl, NHl);
    CH_CHECK_GOTO(kept_input(m, b->ln1, b->ln1_16, NC, io, &in), rc, done);
    be->matmul_bwd(be, d.ln1, GW(m, l, QKVW, io), GW(m, l, QKVB, io), d.qkv, in, P(m, l, QKVW), N,
                   C, 3 * Cl);
    CH_CHECK_GOTO(eng_tp_f_backward(m->tpg, m->tp_bf16, d.ln1, NC), rc, done);
    be->layernorm_bwd(be, dres, GW(m, l, LN1W, io), GW(m, l, LN1B, io), d.ln1, b->x, P(m, l, LN1W),
                      b->ln1_mean, b->ln1_rstd, N, C);
    if (io) {
        b->wpending = 1; /* live until the weight pass */
    } else {
        b->live = 0;
        rc = eng_model_block_event(m, l, ENG_BLOCK_BACKWARD_DONE);
    }
done:
    return rc;
}

/* The weight pass of block l (split backward): the parameter gradients block_backward
 * accumulates, from the output gradients its input pass kept; the kernels read no
 * parameter and no input gradient. */
static int block_weight(eng_model_t *m, eng_acts_t *a, uint32_t l)
{
    const eng_backend_t *be = m->be;
    block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
    int C = (int)m->cfg.embd, Cl = (int)m->Cl, N = (int)(a->B * a->T);
    size_t NC = (size_t)N * C;
    const float *in = NULL;
    int rc = eng_model_block_event(m, l, ENG_BLOCK_BACKWARD_WEIGHT);
    if (rc < 0) {
        return rc;
    }
    CH_CHECK_GOTO(kept_input(m, b->fch_gelu, b->fch_gelu_16, (size_t)N * 4 * Cl, 0, &in), rc, done);
    be->matmul_bwd(be, NULL, G(m, l, FCPROJW), G(m, l, FCPROJB), b->g_fcproj, in, NULL, N, 4 * Cl,
                   C);
    CH_CHECK_GOTO(kept_input(m, b->ln2, b->ln2_16, NC, 0, &in), rc, done);
    be->matmul_bwd(be, NULL, G(m, l, FCW), G(m, l, FCB), b->g_fc, in, NULL, N, C, 4 * Cl);
    CH_CHECK_GOTO(kept_input(m, b->res2, b->res2_16, NC, 0, &in), rc, done);
    be->layernorm_bwd(be, NULL, G(m, l, LN2W), G(m, l, LN2B), b->g_ln2, in, NULL, b->ln2_mean,
                      b->ln2_rstd, N, C);
    CH_CHECK_GOTO(kept_input(m, b->atty, b->atty_16, (size_t)N * Cl, 0, &in), rc, done);
    be->matmul_bwd(be, NULL, G(m, l, ATTPROJW), G(m, l, ATTPROJB), b->g_attproj, in, NULL, N, Cl,
                   C);
    CH_CHECK_GOTO(kept_input(m, b->ln1, b->ln1_16, NC, 0, &in), rc, done);
    be->matmul_bwd(be, NULL, G(m, l, QKVW), G(m, l, QKVB), b->g_qkv, in, NULL, N, C, 3 * Cl);
    be->layernorm_bwd(be, NULL, G(m, l, LN1W), G(m, l, LN1B), b->g_ln1, b->x, NULL, b->ln1_mean,
                      b->ln1_rstd, N, C);
    b->wpending = 0;
    b->live = 0;
    rc = eng_model_block_event(m, l, ENG_BLOCK_BACKWARD_DONE);
done:
    return rc;
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
    uint32_t n = a->m->part.nblocks;
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

/* Vocab-parallel embedding (kernels/tp.h): this rank writes the wte rows of the tokens in
 * its vocab slice and zero for the others, rank 0 adds the positions, and the sum over the
 * group is the embedding: tp.h's g (its backward a copy: dout is the same on every rank).
 * Adding zeros is exact: the same bits as one rank's lookup; under bf16 the sum moves and
 * rounds as bf16, the single-rank lookup's round(wte + wpe) (two nonzero terms at most). */
static int embed_tp_forward(eng_model_t *m, eng_acts_t *a, float *out)
{
    const eng_backend_t *k = m->tpk;
    int C = (int)m->cfg.embd, Vl = (int)m->Vl, v0 = (int)(m->tpr * m->Vl);
    const float *wpe = m->tpr == 0 ? m->params + m->wpe : NULL;
    k->tp_embed_fwd(k, out, a->inputs, m->params + m->wte, wpe, v0, Vl, (int)a->B, (int)a->T, C);
    return eng_tp_g_forward(m->tpg, m->tp_bf16, out, (size_t)a->B * a->T * C);
}

/* Its backward: the rows of this rank's tokens, and every position (wpe is replicated and
 * dout is the same on every rank). */
static void embed_tp_backward(eng_model_t *m, eng_acts_t *a, const float *dout)
{
    const eng_backend_t *k = m->tpk;
    int C = (int)m->cfg.embd, Vl = (int)m->Vl, v0 = (int)(m->tpr * m->Vl);
    k->tp_embed_bwd(k, m->grads + m->wte, m->grads + m->wpe, dout, a->inputs, v0, Vl, (int)a->B,
                    (int)a->T, C);
}

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
    if (m->head == ENG_HEAD_VOCAB_PARALLEL) {
        rc = embed_tp_forward(m, a, out);
    } else {
        m->be->encoder_fwd(m->be, out, a->inputs, m->params + m->wte, m->params + m->wpe, (int)B,
                           (int)T, (int)m->cfg.embd);
    }
    a->embed_live = rc == 0;
    return rc;
}

int eng_model_embed_backward(eng_model_t *m, eng_acts_t *a, const float *dout)
{
    if (!m->part.embedding || a->m != m || dout == NULL) {
        return -EINVAL;
    }
    if (!a->embed_live) {
        return CH_E_STATE;
    }
    if (m->head == ENG_HEAD_VOCAB_PARALLEL) {
        embed_tp_backward(m, a, dout);
    } else {
        m->be->encoder_bwd(m->be, m->grads + m->wte, m->grads + m->wpe, dout, a->inputs, (int)a->B,
                           (int)a->T, (int)m->cfg.embd);
    }
    a->embed_live = 0;
    return 0;
}

// ----------------------------------------------------------------------------
// blocks

static int check_range(const eng_model_t *m, const eng_acts_t *a, uint32_t first, uint32_t last)
{
    if (a->m != m || first >= last)
        return -EINVAL;
    /* one run of held blocks: within one chunk */
    int64_t lo = eng_part_pos(&m->part, first), hi = eng_part_pos(&m->part, last - 1);
    return lo >= 0 && hi - lo == (int64_t)(last - 1 - first) ? 0 : -EINVAL;
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
        float *out = l + 1 == last ? y : a->blk[eng_part_pos(&m->part, l)].res3;
        rc = block_forward(m, a, l, x, out);
        if (rc < 0) {
            return rc;
        }
        x = out;
    }
    return 0;
}

/* Blocks [first, last)'s backward, whole or its input pass (block_backward). */
static int blocks_backward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                           const float *dy, float *dx, int input_only)
{
    int rc = check_range(m, a, first, last);
    if (rc == 0 && (dy == NULL || dx == NULL || (input_only && !m->split_backward))) {
        rc = -EINVAL;
    }
    for (uint32_t l = first; rc == 0 && l < last; l++) {
        const block_acts_t *b = &a->blk[eng_part_pos(&m->part, l)];
        if (!b->live || b->wpending) {
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
    for (uint32_t l = last; rc == 0 && l-- > first;) {
        rc = block_backward(m, a, l, dx, input_only);
    }
    return rc;
}

int eng_model_blocks_backward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                              const float *dy, float *dx)
{
    return blocks_backward(m, a, first, last, dy, dx, 0);
}

int eng_model_blocks_backward_input(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                                    const float *dy, float *dx)
{
    return blocks_backward(m, a, first, last, dy, dx, 1);
}

int eng_model_blocks_backward_weight(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last)
{
    int rc = check_range(m, a, first, last);
    if (rc == 0 && !m->split_backward) {
        rc = -EINVAL;
    }
    for (uint32_t l = first; rc == 0 && l < last; l++) {
        if (!a->blk[eng_part_pos(&m->part, l)].wpending) {
            rc = CH_E_STATE;
        }
    }
    /* the backward's block order, so ZeRO-3 reduce-scatters as it does */
    for (uint32_t l = last; rc == 0 && l-- > first;) {
        rc = block_weight(m, a, l);
    }
    return rc;
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
    const eng_backend_t *be = eng_mem_view(m->be, ENG_MEM_SCRATCH);
    int rc = be->alloc(be, N * m->Vl * sizeof(float), &bigger);
    if (rc < 0) {
        return rc;
    }
    m->be->free(m->be, m->logits);
    m->logits = bigger;
    m->logits_cap = N;
    return 0;
}

/* This rank's vocab slice: its first column v0 and how many of its Vl columns are real. */
static void tp_slice(const eng_model_t *m, int *v0, int *valid)
{
    long first = (long)m->tpr * m->Vl, real = (long)m->cfg.vocab - first;
    *v0 = (int)first;
    *valid = (int)(real < 0 ? 0 : real > (long)m->Vl ? (long)m->Vl : real);
}

/* Vocab-parallel cross-entropy over rows [r, r+n) (kernels/tp.h; Megatron's
 * VocabParallelCrossEntropy): logits [n, Vl] of this rank's vocab slice only, the row max
 * all-reduced (max), then the sums of exponentials and the target's logit (held by one
 * rank, zero elsewhere) all-reduced (sum): lse and the loss without full logits. The
 * per-row values live in m->tp_rows (backend memory, the collectives' buffers). */
static int head_tp_loss(eng_model_t *m, eng_acts_t *a, size_t r, size_t n)
{
    const eng_backend_t *be = m->be, *k = m->tpk;
    int C = (int)m->cfg.embd, Vl = (int)m->Vl, v0, valid;
    tp_slice(m, &v0, &valid);
    float *mx = m->tp_rows, *sum = mx + n, *tl = sum + n;
    be->lmhead_fwd(be, m->logits, NULL, NULL, a->lnf + r * C, m->params + m->wte, NULL, (int)n, C,
                   Vl, Vl);
    k->tp_xent_max(k, mx, m->logits, (int)n, Vl, valid);
    int rc = eng_tp_allreduce(m->tpg, mx, n, WRK_COLL_MAX);
    if (rc == 0) {
        k->tp_xent_sums(k, sum, tl, m->logits, mx, a->targets + r, v0, (int)n, Vl, valid);
        rc = eng_tp_allreduce(m->tpg, sum, 2 * n, WRK_COLL_SUM);
    }
    if (rc == 0) {
        k->tp_xent_finish(k, a->lse + r, a->losses + r, mx, sum, tl, (int)n);
    }
    return rc;
}

/* Its backward over rows [r, r+n), the chunk's logits in m->logits: dlogits in place (zero
 * on padded columns), this rank's part of dx into m->dsmall (summed over the group by the
 * caller) and the gradient of its wte rows. */
static void head_tp_backward(eng_model_t *m, eng_acts_t *a, float scale, size_t r, size_t n)
{
    const eng_backend_t *be = m->be, *k = m->tpk;
    int C = (int)m->cfg.embd, Vl = (int)m->Vl, v0, valid;
    tp_slice(m, &v0, &valid);
    const float *wte = m->params + m->wte;
    k->tp_xent_bwd(k, m->logits, a->lse + r, a->targets + r, scale, v0, (int)n, Vl, valid);
    /* dx [n,C] = dlogits [n,Vl] @ wte [Vl,C]; dwte [Vl,C] += dlogits^T @ x */
    be->matmul_fwd(be, m->dsmall + r * C, m->logits, wte, NULL, (int)n, Vl, C);
    be->matmul_bwd(be, m->tp_dlog, m->grads + m->wte, NULL, a->lnf + r * C, m->logits, wte, (int)n,
                   Vl, C);
}

/* Logits of n rows of x (ln_f's output) into m->logits, no loss: [n, Vp] (the padding
 * columns zero), or this rank's vocab slice [n, Vl] under the vocab-parallel head. */
static void head_logits(eng_model_t *m, const float *x, size_t n)
{
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    if (m->head == ENG_HEAD_VOCAB_PARALLEL)
        V = Vp = (int)m->Vl;
    be->lmhead_fwd(be, m->logits, NULL, NULL, x, m->params + m->wte, NULL, (int)n, C, V, Vp);
}

/* The fused head's chunk: as many rows as the logits budget (memory) leaves after its dwte
 * and dx, but at least HEAD_MIN_ROWS: the dwte SGEMM's inner dimension is the chunk's rows,
 * and below OpenBLAS's K block (sized for the L2 cache; 256-384 on x86-64) each chunk
 * streams the whole [V,C] dwte through memory for too little work. Measured on the 2-core
 * VM at GPT-2 B8 T256: 512-row chunks 12.5-16 s, 166-row (32 MiB of logits, an L3's
 * worth) 16-20 s, the old recomputing path 14-23 s (under load). Chunks balanced. */
#define HEAD_MIN_ROWS 384

/* Whether a head forward of N rows with targets takes the fused path, and its chunk rows. */
static int head_fused(const eng_model_t *m, size_t N, size_t *rows)
{
    if (m->head != ENG_HEAD_FUSED || N <= m->logits_budget_rows)
        return 0;
    size_t Vp = m->cfg.padded_vocab, budget = m->logits_budget_rows * Vp;
    size_t fixed = ((size_t)m->cfg.vocab + N) * m->cfg.embd;
    size_t r = budget > fixed ? (budget - fixed) / Vp : 0;
    r = r < HEAD_MIN_ROWS ? HEAD_MIN_ROWS : r;
    r = r > N ? N : r;
    size_t chunks = (N + r - 1) / r;
    *rows = (N + chunks - 1) / chunks;
    return 1;
}

/* The fused scratch in m->logits: the chunk's logits, then dwte [V,C], then dx [N,C]. */
static void head_fused_bufs(const eng_model_t *m, size_t rows, float **dwte, float **dx)
{
    *dwte = m->logits + rows * m->cfg.padded_vocab;
    *dx = *dwte + (size_t)m->cfg.vocab * m->cfg.embd;
}

static int head_fused_forward(eng_model_t *m, eng_acts_t *a, size_t rows)
{
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    size_t N = (size_t)a->B * a->T;
    size_t need = rows * (size_t)Vp + ((size_t)V + N) * (size_t)C;
    int rc = logits_for(m, (need + (size_t)Vp - 1) / (size_t)Vp);
    if (rc < 0)
        return rc;
    float *dwte, *dx;
    head_fused_bufs(m, rows, &dwte, &dx);
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        be->lmhead_fwdbwd(be, dx + r * C, dwte, m->logits, a->lse + r, a->losses + r,
                          a->lnf + r * C, m->params + m->wte, a->targets + r, r > 0, (int)n, C, V,
                          Vp);
    }
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
    if (m->split_head) { /* the whole micro-batch's logits, kept in a for its backward */
        be->lmhead_fwd(be, a->dlog, a->lse, a->losses, a->lnf, wte, a->targets, (int)N, C, V, Vp);
    } else if (head_fused(m, N, &rows)) {
        rc = head_fused_forward(m, a, rows);
    } else {
        for (size_t r = 0; rc == 0 && r < N; r += rows) {
            size_t n = N - r < rows ? N - r : rows;
            if (m->head == ENG_HEAD_VOCAB_PARALLEL) {
                rc = head_tp_loss(m, a, r, n);
            } else {
                be->lmhead_fwd(be, m->logits, a->lse + r, a->losses + r, a->lnf + r * C, wte,
                               a->targets + r, (int)n, C, V, Vp);
            }
        }
    }
    /* loss NULL: the token losses stay in the backend's memory (eng_acts_losses), no wait */
    if (rc == 0 && loss != NULL) {
        rc = be->copy(be, a->losses_host, a->losses, N * sizeof(float), ENG_COPY_D2H);
    }
    if (rc < 0) {
        return rc;
    }
    if (loss != NULL) {
        *loss = kn_loss_mean(a->losses_host, N);
    }
    m->logits_of = m->split_head ? NULL : a;
    m->logits_all = !m->split_head && N <= m->logits_budget_rows;
    a->head_live = 1;
    return 0;
}

int eng_model_head_forward(eng_model_t *m, eng_acts_t *a, const float *x, const int32_t *targets,
                           uint32_t B, uint32_t T, float *loss)
{
    if (!m->part.head || a->m != m || x == NULL) {
        return -EINVAL;
    }
    if (a->head_wpending) { /* its dlogits still wait for the weight pass */
        return CH_E_STATE;
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
    int C = (int)m->cfg.embd;
    a->head_live = 0;
    m->logits_of = NULL;
    m->logits_all = 0;
    be->layernorm_fwd(be, a->lnf, a->lnf_mean, a->lnf_rstd, x, m->params + m->lnfw,
                      m->params + m->lnfb, (int)N, C);
    a->head_x = x;
    if (targets == NULL) {
        head_logits(m, a->lnf, N);
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
    size_t N = (size_t)a->B * a->T, rows = m->logits_budget_rows, frows = 0;
    const float *wte = m->params + m->wte;
    float *gwte = m->grads + m->wte;
    int rc = 0;

    if (a->head_wpending) {
        return CH_E_STATE;
    }
    if (m->split_head) { /* the input half: dlogits in place, dx; wte's gradient later */
        be->lmhead_bwd(be, m->dsmall, NULL, a->dlog, a->lse, a->lnf, wte, a->targets, grad_scale,
                       (int)N, C, V, Vp);
        a->head_wpending = 1;
    } else if (m->logits_of == a && head_fused(m, N, &frows)) {
        // the forward left the unscaled gradients: scale them in
        float *dwte_u, *dx_u;
        head_fused_bufs(m, frows, &dwte_u, &dx_u);
        be->axpy(be, gwte, dwte_u, (size_t)V * C, grad_scale);
        rc = be->memset(be, m->dsmall, 0, N * C * sizeof(float));
        if (rc < 0) {
            return rc;
        }
        be->axpy(be, m->dsmall, dx_u, N * C, grad_scale);
    } else {
        // LM head, last chunk first: its logits may still be in the buffer
        for (size_t r = ((N - 1) / rows) * rows, first = 1;; r -= rows, first = 0) {
            size_t n = N - r < rows ? N - r : rows;
            if (!first || m->logits_of != a) {
                head_logits(m, a->lnf + r * C, n);
            }
            if (m->head == ENG_HEAD_VOCAB_PARALLEL) {
                head_tp_backward(m, a, grad_scale, r, n);
            } else {
                be->lmhead_bwd(be, m->dsmall + r * C, gwte, m->logits, a->lse + r, a->lnf + r * C,
                               wte, a->targets + r, grad_scale, (int)n, C, V, Vp);
            }
            if (r == 0) {
                break;
            }
        }
    }
    m->logits_of = NULL;
    m->logits_all = 0;
    a->head_live = 0;

    /* the vocab-parallel head's input gradient: the sum of every slice's part */
    rc = eng_tp_f_backward(m->tpg, m->tp_bf16, m->dsmall, N * C);
    if (rc == 0) {
        rc = be->memset(be, dx, 0, N * C * sizeof(float));
    }
    if (rc < 0) {
        return rc;
    }
    be->layernorm_bwd(be, dx, m->grads + m->lnfw, m->grads + m->lnfb, m->dsmall, a->head_x,
                      m->params + m->lnfw, a->lnf_mean, a->lnf_rstd, (int)N, C);
    return 0;
}

int eng_model_head_backward_weight(eng_model_t *m, eng_acts_t *a)
{
    if (!m->split_head || a->m != m) {
        return -EINVAL;
    }
    if (!a->head_wpending) {
        return CH_E_STATE;
    }
    const eng_backend_t *be = m->be;
    int C = (int)m->cfg.embd, V = (int)m->cfg.vocab, Vp = (int)m->cfg.padded_vocab;
    size_t N = (size_t)a->B * a->T;
    /* the weight half: dwte += dlogits^T @ ln_f's output, as the whole backward adds it */
    be->lmhead_bwd(be, NULL, m->grads + m->wte, a->dlog, NULL, a->lnf, NULL, NULL, 0.0f, (int)N, C,
                   V, Vp);
    a->head_wpending = 0;
    return 0;
}
