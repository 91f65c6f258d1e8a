/* GPT-2 model for one rank (DESIGN §7): parameters in one slab with named views,
 * forward and backward. B = batch (sequences), T = time (tokens), C = channels,
 * V = vocab, Vp = padded vocab, L = layers, NH = heads.
 *
 * Tensor names, shapes and layouts are Hugging Face GPT-2's (wte.weight [V,C],
 * h.{i}.attn.c_attn.weight [C,3C] used as x @ W, ...). Padded vocab rows of wte are
 * zero and never receive gradient; their logits are excluded from the loss.
 * Initialisation is counter-based, keyed by (seed, tensor name, element index), so any
 * rank can create exactly its slice and the model is identical for every layout. */
#ifndef ENG_MODEL_H
#define ENG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/plan.h"
#include "workerd/engine/backend.h"

/* The model's shape (common/plan.h: the arithmetic over it lives there). */
typedef ch_model_cfg_t eng_config_t;

/* How tensor parallelism splits a tensor over the TP group of p ranks (Megatron-LM's
 * ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding). Linear weights are in
 * Hugging Face Conv1D layout, A [in, out], used as Y = XA + b. */
typedef enum eng_split {
    /* Replicated: every rank of the TP group holds it whole (LayerNorms, wpe, the biases
     * of row-parallel layers). */
    ENG_SPLIT_NONE = 0,
    /* Column parallel: A is split along its second dimension as A = [A_1, ..., A_p], and
     * the bias the same way; rank i computes Y_i = X A_i + b_i from the whole X (forward:
     * copy, backward: all-reduce). c_attn is split per head: rank i holds columns
     * [i*C/p, (i+1)*C/p) of each of its q, k and v parts, i.e. heads [i*NH/p, (i+1)*NH/p). */
    ENG_SPLIT_COLUMN,
    /* Row parallel: A is split along its first dimension as A = [A_1; ...; A_p] and X along
     * its second, X = [X_1, ..., X_p]; rank i computes X_i A_i and the partial products are
     * all-reduced (forward: all-reduce, backward: copy) before the bias is added once (the
     * bias itself is ENG_SPLIT_NONE). */
    ENG_SPLIT_ROW,
    /* Vocab parallel: wte [Vp, C] is split along its rows, rank i holding tokens
     * [i*Vp/p, (i+1)*Vp/p); the embedding is all-reduced and the tied LM head and its
     * cross-entropy run vocab-parallel, so no rank ever holds the full logits. */
    ENG_SPLIT_VOCAB,
} eng_split_t;

typedef struct eng_tensor {
    char name[64];     /* "h.3.attn.c_attn.weight" */
    uint32_t ndim;     /* 1 or 2 */
    uint32_t shape[2]; /* full Hugging Face shape (wte: [vocab, C], unpadded) */
    size_t offset;     /* element offset of this rank's piece in the slab */
    size_t numel;      /* elements this rank holds (wte: padded_vocab * C) */
    int decay;         /* 2-D weights: AdamW weight decay applies */
    int block;         /* transformer block index, -1 outside blocks */
    eng_split_t split; /* how tensor parallelism splits it */
} eng_tensor_t;

typedef struct eng_model eng_model_t;

/* Allocate parameters, gradients and activations for micro-batches of up to max_B
 * sequences of cfg->seq_len tokens, and initialise the parameters from seed, on the CPU
 * backend. Caller owns *out (eng_model_destroy). */
int eng_model_create(const eng_config_t *cfg, uint32_t max_B, uint64_t seed, eng_model_t **out);

typedef struct eng_model_opts {
    /* Kernels and memory (borrowed for the model's life): every kernel the model runs and
     * every buffer of parameters, gradients and activations go through it. NULL: the CPU
     * backend. */
    const eng_backend_t *backend;
} eng_model_opts_t;

/* eng_model_create with options (opts NULL: the defaults, as eng_model_create). */
int eng_model_create_opts(const eng_config_t *cfg, const eng_model_opts_t *opts, uint32_t max_B,
                          uint64_t seed, eng_model_t **out);
void eng_model_destroy(eng_model_t *m);

const eng_config_t *eng_model_config(const eng_model_t *m);
const eng_backend_t *eng_model_backend(const eng_model_t *m);
size_t eng_model_nparams(const eng_model_t *m);
float *eng_model_params(eng_model_t *m); /* the slab, nparams floats */
float *eng_model_grads(eng_model_t *m);  /* same layout as params */
/* Keep the gradients in buf (nparams floats, borrowed until the model is destroyed) from
 * now on, e.g. memory the collectives reduce in place; the current ones are copied. */
void eng_model_lend_grads(eng_model_t *m, float *buf);
size_t eng_model_ntensors(const eng_model_t *m);
const eng_tensor_t *eng_model_tensor(const eng_model_t *m, size_t i);
const eng_tensor_t *eng_model_find(const eng_model_t *m, const char *name); /* NULL if none */

/* Forward pass over inputs [B,T] (token ids < vocab). With targets [B,T], *loss is
 * the mean cross-entropy over the B*T tokens; with targets NULL, only logits are made
 * (eng_model_logits). T <= seq_len, B <= max_B. */
int eng_model_forward(eng_model_t *m, const int32_t *inputs, const int32_t *targets, uint32_t B,
                      uint32_t T, float *loss);
/* Backward of the last forward (which had targets): ADDS into the gradients the
 * gradient of (sum of the B*T token losses) * grad_scale. For a global batch of N
 * tokens split into micro-batches, pass grad_scale = 1/N. */
int eng_model_backward(eng_model_t *m, float grad_scale);
void eng_model_zero_grad(eng_model_t *m);
/* Logits [B,T,padded_vocab] of the last forward. */
const float *eng_model_logits(const eng_model_t *m);

#endif
