/* The meaning of every job-file key (jobspec_doc.h). Keep one row per row of jobspec.c's
 * field table; test_jobspec checks that each key has one. */
#include "common/jobspec_doc.h"

#include <string.h>

static const ch_jobspec_doc_t docs[] = {
    {"job", "name", "text", "1-63 of A-Z a-z 0-9 . _ -",
     "The job's name; its run's checkpoints go under checkpoint.dir/<name>/ (train.resume)."},
    {"job", "kind", "", "train | diag",
     "train: train the model; diag: check the nodes' GEMMs and collectives."},
    {"job", "priority", "", "-1000000 to 1000000",
     "Higher starts first, before fair share; only root and the admin group may set it."},
    {"job", "owner_uid", "uid", NULL,
     "Written by the coordinator from the submitter's credentials (-1: unset); not for users."},
    {"job", "owner_gid", "gid", NULL, "As owner_uid, the submitter's group."},
    {"job", "run_uid", "uid", NULL,
     "Whom the ranks run as; written by the coordinator (-1: unset)."},
    {"job", "run_gid", "gid", NULL, "As run_uid, the ranks' group."},
    {"model", "layers", "blocks", NULL, "Transformer blocks (GPT-2 124M: 12)."},
    {"model", "heads", "", NULL, "Attention heads; must divide embd, and tp must divide it."},
    {"model", "embd", "channels", NULL, "Model width C (GPT-2 124M: 768)."},
    {"model", "vocab", "tokens", NULL,
     "Vocabulary size; every token of the data must be below it (GPT-2: 50257; text: 256)."},
    {"model", "seq_len", "tokens", NULL,
     "Sequence length T; init_from's wpe may hold more positions (cropped)."},
    {"parallel", "tp", "ranks", NULL, "Tensor-parallel degree (Megatron); divides model.heads."},
    {"parallel", "pp", "stages", NULL, "Pipeline stages (1F1B); at most model.layers."},
    {"parallel", "dp", "ranks", NULL,
     "Data-parallel degree; dp > 1 shards parameters, gradients and Adam state (ZeRO-3)."},
    {"parallel", "microbatches", "micro-batches", NULL,
     "Micro-batches per step per DP rank (gradient accumulation, the pipeline's m); derived "
     "when global_batch_size is set."},
    {"parallel", "micro_batch_size", "sequences", NULL, "Sequences in one micro-batch (B)."},
    {"parallel", "reshard", "", "per-use | per-step",
     "ZeRO-3: free gathered parameters after each use (least memory) or keep them for the "
     "step's micro-batches (less traffic)."},
    {"parallel", "stage_split", "", "even | balanced | auto",
     "How pipeline stages share the blocks: evenly, or counting the LM head's cost; auto: "
     "balanced when its busiest stage still fits the memory budget, else even."},
    {"parallel", "schedule", "", "1f1b | interleaved | zb-h1",
     "Pipeline schedule. zb-h1: each backward split into input- and weight-gradient passes, "
     "the weight passes deferred into the cool-down, the LM head's too on the last stage when "
     "its micro-batches' logits fit 256 MiB (tp 1; they are kept until their weight pass) "
     "(same bits as 1f1b; cpu or cuda; not "
     "with recompute = full). interleaved: Megatron's interleaved 1F1B over virtual_stages chunks "
     "per rank, "
     "bubble (pp-1)/(virtual_stages x microbatches+pp-1), each rank keeping only its warm-up "
     "depth of chunk activations, (pp-stage-1) x 2+(virtual_stages-1) x pp+1, whatever "
     "microbatches; its sends and receives go in one order every rank derives, a send grouped "
     "with the receive beside it, so it runs on NCCL too."},
    {"parallel", "virtual_stages", "chunks", NULL,
     "Model chunks per pipeline rank (interleaved only): microbatches a multiple of pp, "
     "model.layers divisible by pp x virtual_stages."},
    {"parallel", "recompute", "", "none | selective | full",
     "Activation recomputation, same bits as none: selective makes the attention probabilities "
     "again in the backward; full keeps only each block's output and reruns its forward."},
    {"parallel", "global_batch_size", "sequences", NULL,
     "Sequences per step; 0: dp x microbatches x micro_batch_size. When set, microbatches = "
     "global_batch_size / (dp x micro_batch_size), refused when that does not divide."},
    {"train", "steps", "steps", NULL, "Optimizer steps to run."},
    {"train", "lr", "", "> 0", "Peak learning rate."},
    {"train", "lr_min", "", "-1, or 0 to lr",
     "Where the cosine ends at the last step; -1: lr / 10. lr_min = lr with warmup 0: "
     "constant."},
    {"train", "warmup", "steps", "0 to steps", "Linear warm-up from lr / warmup to lr."},
    {"train", "seed", "", "0 to 2^64-1",
     "Seeds the initial weights and the data sampling; same seed, same run on any layout."},
    {"train", "data", "path", "builtin | text:FILE | FILE | GLOB",
     "Training tokens: the built-in arithmetic corpus; a text file read as bytes (vocab 256); "
     "an llm.c or raw uint16 token file (random windows); or a glob of llm.c shards, sorted "
     "and read in order. See docs/data.md."},
    {"train", "init_from", "path", "",
     "A GPT-2 safetensors file (Hugging Face names; F32, F16 or BF16) to start from; checked "
     "against [model] at submit; wpe cropped to seq_len."},
    {"train", "device", "", "cpu | cuda", "Where each rank computes (cuda: one GPU per rank)."},
    {"train", "precision", "", "fp32 | tf32 | bf16",
     "The GEMMs' arithmetic; tf32 needs device = cuda. bf16: mixed precision, bf16 parameter "
     "copies, GEMM inputs and activations with fp32 accumulation, reductions, gradients and "
     "master weights; device = cuda, or emulate = yes. State and checkpoints stay fp32."},
    {"train", "emulate", "", "yes | no",
     "Tests only, slow: emulate precision = bf16's rounding on device = cpu (the CPU reference "
     "of the GPU's arithmetic). Not a fast path."},
    {"train", "resume", "", "\"\" | auto | PATH",
     "\"\": a fresh run; auto: continue this run's newest committed checkpoint under any "
     "coordinator (full state, any layout); PATH: continue from that checkpoint."},
    {"train", "log_every", "steps", NULL,
     "Rank 0 logs a loss line every this many steps; 0: never."},
    {"train", "skip_steps", "batches", "\"\" | B1,B2,...",
     "Data batches no step reads, ascending (step s reads the s-th batch not listed); "
     "fault.nonfinite = rewind appends the batch of a step whose loss was not finite."},
    {"train", "val_data", "path", "\"\" | text:FILE | FILE | GLOB",
     "Validation tokens (same forms as data, read in order from the start); \"\": no "
     "validation loss."},
    {"train", "eval_every", "steps", NULL,
     "Validation loss every this many steps and after the last; 0: after the last only. "
     "Needs val_data."},
    {"train", "eval_tokens", "tokens", NULL,
     "Tokens each validation reads (rounded down to whole global batches, at least one): "
     "the same tokens on every layout."},
    {"optim", "weight_decay", "", "0 to 1e9",
     "AdamW's decoupled weight decay, on 2-D weights only (not biases, LayerNorms)."},
    {"optim", "beta1", "", "0 <= beta1 < 1", "AdamW's first-moment decay."},
    {"optim", "beta2", "", "0 <= beta2 < 1", "AdamW's second-moment decay."},
    {"optim", "eps", "", "0 < eps <= 1", "AdamW's epsilon."},
    {"optim", "grad_clip", "", "0 to 1e9",
     "Clip the global gradient norm to this (clip_grad_norm_); 0: no clipping."},
    {"optim", "grad_reduce", "", "fp32 | bf16",
     "The data-parallel gradient reduction's type; bf16 (precision = bf16 only) rounds the "
     "gradients to bf16 before and after it. Accumulation stays fp32."},
    {"checkpoint", "dir", "path", "", "Where checkpoints go; \"\": none."},
    {"checkpoint", "every", "steps", NULL,
     "A checkpoint every this many steps (and after the last); 0: only after the last."},
    {"checkpoint", "keep", "checkpoints", NULL, "Committed checkpoints kept; older are pruned."},
    {"checkpoint", "memory_every", "steps", NULL,
     "In-memory peer checkpoints every this many steps: each rank keeps its latest state in "
     "its node's memory (workerd --memory-dir) and a copy on a rank of another node; a restart "
     "resumes from the newest step complete in memory, else from disk; 0: off."},
    {"checkpoint", "run_id", "", NULL,
     "Written by the coordinator at submit: the run this job continues or starts (run.json); "
     "not for users."},
    {"fault", "max_restarts", "restarts", NULL, "Restarts before the job fails; 0: none."},
    {"fault", "step_timeout", "seconds", NULL,
     "A rank without progress this long (first step included) is a failure; 0: never."},
    {"fault", "elastic", "", "yes | no",
     "A restart that no longer fits may continue with a smaller dp (same global batch)."},
    {"fault", "backoff", "seconds", NULL,
     "A restart after a failure waits this long, doubling each failure in a row; reset once a "
     "generation completes a step."},
    {"fault", "backoff_max", "seconds", NULL, "The longest wait between restarts."},
    {"fault", "crash_loop", "generations", NULL,
     "That many generations in a row failing before their first step stop the job; 0: never."},
    {"fault", "nonfinite", "", "fail | skip | rewind",
     "A step whose loss or gradient norm is NaN or infinite: fail the job naming the step, "
     "skip its update, or rewind: restart from the last checkpoint with that step's batch "
     "added to train.skip_steps."},
    {"fault", "straggler", "", "report | replace",
     "A rank whose compute stays above its peers': report it (status, watch, log, metric), "
     "or replace: restart with its node's ranks on an idle spare node (none idle: report)."},
    {"diag", "rounds", "rounds", NULL, "diag jobs: measurement rounds."},
    {"diag", "gemm_size", "n", NULL, "diag jobs: n x n SGEMM size."},
    {"diag", "collectives", "", "yes | no", "diag jobs: also measure collectives."},
    {"diag", "bytes", "bytes", NULL, "diag jobs: message size of the collectives."},
};

const ch_jobspec_doc_t *ch_jobspec_doc(const char *section, const char *key)
{
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++)
        if (strcmp(docs[i].section, section) == 0 && strcmp(docs[i].key, key) == 0)
            return &docs[i];
    return NULL;
}
