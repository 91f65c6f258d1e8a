/* The model's insides, shared by model.c (table, memory, whole-model passes) and
 * model_stage.c (the per-part passes). Private to workerd/engine/model*.c. */
#ifndef ENG_MODEL_IMPL_H
#define ENG_MODEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/engine/coll_bf16.h"
#include "workerd/engine/model.h"

/* Tensors of one block, in slab order. */
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

/* Activations of one block for N = B*T positions. */
typedef struct block_acts {
    const float *x;                   /* [N,C] the block's input (borrowed), for the backward */
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
    float *qkv;                       /* [N,3C] */
    float *att;                       /* [B,NH,T,T] softmax probabilities; NULL: selective */
    float *atty;                      /* [N,C] attention output before c_proj */
    float *res2;                      /* [N,C] x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N,C], [N], [N] */
    float *fch, *fch_gelu;            /* [N,4C] */
    /* bf16_acts: these kept as packed casts instead (the float pointers NULL; the forward
     * writes them in the model's staging scratch: bf16_stage) */
    kn_bf16_t *ln1_16, *qkv_16, *atty_16, *res2_16, *ln2_16, *fch_16, *fch_gelu_16;
    float *res3; /* [N,C] block output, when the caller gives no buffer */
    float *out;  /* where the forward wrote the output (res3 or the caller's) */
    int live;    /* forwarded, backward pending */
    /* split backward (ZB-H1): the output gradients of c_fc's projection [N,C], c_fc
     * [N,4C/tp], ln_2 [N,C], attn.c_proj [N,C], c_attn [N,3C/tp] and ln_1 [N,C] the input
     * pass keeps for the weight pass; wpending: the input pass ran, the weight pass not */
    float *g_fcproj, *g_fc, *g_ln2, *g_attproj, *g_qkv, *g_ln1;
    int wpending;
} block_acts_t;

struct eng_acts {
    eng_model_t *m; /* borrowed */
    uint32_t max_B;
    uint32_t B, T; /* shape of the forward in flight */
    void *mem;     /* one backend allocation holding every buffer below */
    /* embedding */
    int32_t *inputs; /* [N] token ids (backend memory) */
    float *encoded;  /* [N,C] the whole-model path's embedding output */
    int embed_live;
    /* blocks first..last-1 of the model, by position in the part; with a span shorter than
     * the part (eng_acts_create_span), the span's buffers (own) serve the blocks of one
     * run bound at a time, the others zeroed */
    block_acts_t *blk;
    block_acts_t *own; /* [span] the buffers; blk itself when span is the part */
    uint32_t span;
    /* head */
    int32_t *targets;                 /* [N] */
    float *lnf, *lnf_mean, *lnf_rstd; /* [N,C], [N], [N] */
    float *lse, *losses;              /* [N] */
    float *losses_host;               /* [N] host copy for the sum */
    const float *head_x;              /* [N,C] the head's input (borrowed) */
    int head_live;
    /* split head (eng_model_opts_t.split_head): the micro-batch's logits [N,Vp], turned into
     * dlogits by the input pass; wpending: the weight pass has not read them yet */
    float *dlog;
    int head_wpending;
};

/* How the LM head (tied to wte) computes, chosen once at create (head_pick in model.c); the
 * embedding asks it too, since the vocab-parallel head and embedding share one wte slice. */
typedef enum {
    /* logits [rows, Vp] in chunks of logits_budget_rows; the backward recomputes all but the
     * last chunk (lmhead_fwd, lmhead_bwd) */
    ENG_HEAD_WHOLE,
    /* as WHOLE while the rows fit the logits budget; past it the forward runs the backward
     * too, chunk by chunk (lmhead_fwdbwd + axpy; model_stage.c's theory of operation) */
    ENG_HEAD_FUSED,
    /* tp > 1: this rank's vocab slice [rows, Vl] only, vocab-parallel cross-entropy and
     * embedding (kernels/tp.h; Megatron's VocabParallelCrossEntropy) */
    ENG_HEAD_VOCAB_PARALLEL,
} eng_head_t;

struct eng_model {
    eng_config_t cfg;
    const eng_backend_t *be; /* kernels and memory (borrowed) */
    eng_model_part_t part;
    uint32_t max_B;
    uint64_t seed;
    /* tensor parallelism: rank tpr of tp in tpg (NULL when tp == 1); local widths */
    uint32_t tp, tpr;
    wrk_coll_group_t *tpg;
    eng_bf16_msg_t *tp_bf16; /* opts' tp_bf16 (a backend that casts): the message; or NULL */
    eng_head_t head;         /* the LM head's strategy (and wte's vocab split) */
    uint32_t dp, dpr;        /* data parallelism: this rank's index in dp (the table's owners) */
    uint32_t Cl, NHl, Vl;    /* C/tp (attention width), heads/tp, padded_vocab/tp */
    float *tp_rows;          /* [3 * logits_cap]: per-row max, sum, target logit */
    /* the vocab-parallel kernels (backend.h's tp_*): be's, or the CPU's on be's host memory
     * when be has none */
    const eng_backend_t *tpk;
    float *tp_dlog; /* [logits_cap, Vl] scratch of the vocab-parallel head's backward */

    size_t nparams;
    float *params, *grads;
    float *own_grads; /* grads unless the caller lent a buffer (eng_model_lend_grads) */
    eng_tensor_t *tensors;
    uint8_t *init; /* [ntensors] enum init_kind */
    size_t ntensors;
    size_t wte, wpe, lnfw, lnfb;     /* slab offsets; SIZE_MAX when not held */
    size_t blk_off[NBLOCK_TENSORS];  /* offset of each tensor within a block's range */
    size_t blk_numel;                /* parameters of one block */
    size_t *blk_slab;                /* [nblocks] slab offset of each held block */
    float **blk_params, **blk_grads; /* [nblocks] each held block's bases */
    int external;                    /* opts->external_blocks: no slab range for blocks */
    eng_block_hook_t hook;           /* around each block's passes; NULL: none */
    void *hook_ctx;

    /* parallel.recompute: what a block's backward recomputes lives in one set for the
     * model (one block's backward at a time; a forward uses it only within a block) */
    ch_recompute_t recompute;
    int split_backward; /* eng_model_opts_t's */
    int split_head;     /* eng_model_opts_t's */
    block_acts_t work;
    void *work_mem;

    /* backward scratch (one backward at a time): [N,C], [N,C], [N,4C], [T,T] */
    float *dres, *dsmall, *dbig, *datt;
    float *scratch; /* the allocation holding them */
    /* bf16_acts (opts): where a block's forward writes each packed activation before
     * casting it: wide [N, max(C, 4C/tp)] (ln1, atty, ln2, fch_gelu), wide2 [N, 4C/tp] (qkv,
     * then fch) and resid [N,C] (res2, read until the block's end); its backward widens
     * them back into wide one at a time, each just before the kernel that reads it */
    int bf16_acts;
    float *wide, *wide2, *resid;

    float *logits;               /* [logits_cap, Vp] (head only) */
    size_t logits_cap;           /* rows the logits buffer holds */
    size_t logits_budget_rows;   /* rows allowed for chunked training forwards */
    const eng_acts_t *logits_of; /* acts whose last chunk of logits the buffer holds */
    int logits_all;              /* the buffer holds every row of the last head forward */

    eng_acts_t *acts; /* eng_model_forward's own, made on first use */
};

static inline float *P(const eng_model_t *m, uint32_t l, int i)
{
    return m->blk_params[eng_part_pos(&m->part, l)] + m->blk_off[i];
}

static inline float *G(const eng_model_t *m, uint32_t l, int i)
{
    return m->blk_grads[eng_part_pos(&m->part, l)] + m->blk_off[i];
}

/* The block hook, if any (model.h). */
static inline int eng_model_block_event(eng_model_t *m, uint32_t l, eng_block_event_t ev)
{
    return m->hook != NULL ? m->hook(m->hook_ctx, l, ev) : 0;
}

/* 0 when (B, T) fits a and agrees with the forward already in flight on it; records it. */
int eng_model_check_shape(eng_acts_t *a, uint32_t B, uint32_t T);
/* 0 when every token is in [0, vocab). */
int eng_model_check_tokens(const int32_t *tok, size_t n, uint32_t vocab);

#endif
