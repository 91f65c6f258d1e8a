/* The 1F1B pipeline schedule (DESIGN §5; PipeDream-Flush as Megatron-LM runs it).
 *
 * Theory of operation. Stage s of p runs m micro-batches of one step:
 *   warm-up    w = min(p - s - 1, m) forwards,
 *   steady     m - w times: the forward of micro-batch w + i, then the backward of i,
 *   cool-down  the backwards of the last w micro-batches.
 * So at most min(p - s, m) micro-batches are in flight on stage s (their activations held),
 * and slot (mb % slots) holds micro-batch mb. A forward takes its input from the previous
 * stage (none on stage 0), runs the stage step and sends its output to the next stage (none
 * on the last, which computes the loss); a backward takes the output's gradient from the
 * next stage (none on the last), runs the stage's backward and sends the input's gradient
 * back (none on stage 0). In the steady state every send travels with the receive that
 * follows it as one grouped exchange (p2p.h: a forward's output with the next backward's
 * gradient, a backward's input gradient with the next forward's input), as Megatron does:
 * on NCCL a send completes only when the peer's stream reaches the matching receive, and
 * two neighbours each queueing [send][recv] would wait on each other for ever. Warm-up and
 * cool-down sends go alone and non-blocking, completed only before their buffer is reused.
 *
 * ZB-H1 (parallel.schedule = zb-h1; Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
 * The backward is split into the input-gradient pass B (ops->backward: what the previous
 * stage waits for) and the weight-gradient pass W (ops->weight). F and B run in 1F1B's
 * order with 1F1B's exchanges, so the gradients travel upstream as soon as each B is done;
 * stage s defers its W passes so that up to s of them are pending (stage 0 none, the last
 * stage p - 1), runs one W after each later B, and the s left over at the end of the step,
 * where 1F1B's later stages stand idle waiting for the earlier ones to drain. W passes run
 * in micro-batch order, so each parameter's gradient is summed in 1F1B's order: the same
 * bits. A micro-batch's activations live from its F to its W: at most p on any stage
 * ((p - s) in flight and s pending), 1F1B's stage-0 peak. Stage 0 keeps its backward
 * whole: it has no gradient to send, so its W would follow its B at once. In the steady state the
 * input gradient goes alone and non-blocking, the due W runs, and then the next input is received,
 * so W overlaps the neighbour's reception of the gradient.
 *
 * The schedule sees the model only through the stage step (eng_stage_ops_t): it owns the
 * [B,T,C] buffers that cross stages, never the model. The bubble is the time blocked on
 * point-to-point over the step's time. */
#ifndef ENG_PIPELINE_H
#define ENG_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "common/pipe_il.h"
#include "workerd/engine/backend.h"
#include "workerd/engine/p2p.h"

typedef struct eng_stage_ops {
    void *ctx;
    /* Forward of micro-batch mb in slot: x is the input received from the previous stage
     * (NULL on stage 0). y (NULL on the last stage): *y set to the output to send, count
     * floats of the backend's memory the stage keeps untouched until its next forward on
     * the same slot (the send is complete by then); the stage's own activations, so no
     * buffer of the schedule holds a copy. x stays untouched until the backward of mb on
     * the same slot returns. */
    int (*forward)(void *ctx, uint32_t mb, uint32_t slot, const float *x, const float **y);
    /* Backward of mb: dy the gradient of its output (NULL on the last stage), dx written
     * with the gradient of its input (NULL on stage 0). ZB-H1: the input-gradient pass. */
    int (*backward)(void *ctx, uint32_t mb, uint32_t slot, const float *dy, float *dx);
    /* ZB-H1 only, where eng_pipeline_splits: mb's weight-gradient pass, after its
     * backward, in micro-batch order; x of mb stays untouched until it returns. */
    int (*weight)(void *ctx, uint32_t mb, uint32_t slot);
    /* Interleaved only: forward and backward as above of model chunk `chunk` of the stage
     * (its blocks of virtual stage chunk * stages + stage). x NULL only on chunk 0 of stage 0,
     * y NULL only on the last chunk of the last stage (the loss), dy and dx likewise. */
    int (*chunk_forward)(void *ctx, uint32_t chunk, uint32_t mb, uint32_t slot, const float *x,
                         const float **y);
    int (*chunk_backward)(void *ctx, uint32_t chunk, uint32_t mb, uint32_t slot, const float *dy,
                          float *dx);
} eng_stage_ops_t;

/* The schedules (parallel.schedule) */
typedef enum { ENG_PIPE_1F1B = 0, ENG_PIPE_ZBH1 = 1, ENG_PIPE_INTERLEAVED = 2 } eng_pipe_schedule_t;

enum { ENG_PIPE_IL_LONE = 4 }; /* interleaved: lone sends in flight at most (eng_pipe_il_t) */

/* The interleaved schedule's state (pipeline_il.c): the step's layout (common/pipe_il.h:
 * which slot, receive buffer and send buffer each op uses), the buffers and the sends. */
typedef struct eng_pipe_il {
    ch_il_layout_t lay;
    uint32_t next;          /* the step's next transfer (lay.xfer) */
    unsigned char *arrived; /* per message id, this step */
    float *in;              /* lay.recvs * count: received inputs and output gradients */
    float *dx;              /* lay.sends * count: input gradients to send */
    const float **y;        /* lay.slots: each slot's forward output, sent from there */
    /* sends with no receive beside them, in flight until the request is next used (a ring)
     * or the step ends: the sender goes on at once, as 1F1B's lone sends do (each bf16
     * buffer kept) */
    eng_p2p_req_t lone[ENG_PIPE_IL_LONE];
    uint32_t nlone; /* lone sends started, this step */
    /* eng_p2p_sends_progress (UCX, shm): a send beside a receive is left in flight as a lone
     * one and the host waits for the receive only, and a send may start as soon as its op
     * has made it (below); 0: one grouped exchange, each send at its point (NCCL) */
    int apart;
    uint32_t lat[ENG_PIPE_IL_LONE]; /* apart: each ring request's send's place in lay.xfer */
    uint32_t *sendx;                /* [2 * total] op's send in lay.xfer (UINT32_MAX: none) */
    unsigned char *out;             /* [2 * total] op's send started, this step */
    uint32_t early;                 /* apart: the next op whose send may start early */
} eng_pipe_il_t;

typedef struct eng_pipeline {
    eng_pipe_schedule_t schedule;
    uint32_t stage, stages, slots;
    size_t count; /* floats in one activation, B*T*C */
    eng_p2p_t p2p;
    const eng_backend_t *be; /* whose memory the buffers are (borrowed) */
    float *x, *dx, *dy;      /* slots * count each (dy: count), zeroed at init */
    eng_p2p_req_t *ysend, *dxsend;
    eng_pipe_il_t il; /* ENG_PIPE_INTERLEAVED's */
    /* host time inside ops->forward (and chunk_forward), ops->backward (chunk_backward) and
     * ops->weight, summed since init: the per-pass times the bubble's
     * formulas are written in (on a device, whose kernels run asynchronously, launch time) */
    uint64_t op_ns[3];
} eng_pipeline_t;

/* Which pass an op_ns entry times */
enum { ENG_PIPE_OP_FWD = 0, ENG_PIPE_OP_BWD = 1, ENG_PIPE_OP_WEIGHT = 2 };

/* Whether stage s runs split backwards (ops->weight): ZB-H1 past stage 0. */
int eng_pipeline_splits(eng_pipe_schedule_t sched, uint32_t stage);
/* Slots the schedule needs on stage s of p with m micro-batches: 1F1B min(p - s, m),
 * ZB-H1 min(p, m) (interleaved: eng_pipeline_init_interleaved's p->slots). */
uint32_t eng_pipeline_slots(eng_pipe_schedule_t sched, uint32_t stages, uint32_t stage, uint32_t m);
/* Buffers for micro-batches of count floats on stage `stage` of `stages` running schedule
 * sched with at most m micro-batches, in backend be's memory (the model's: the stage step hands
 * them to its kernels; NULL: the CPU backend), over the column pp (borrowed) with neighbours prev
 * and next. */
int eng_pipeline_init(eng_pipeline_t *p, eng_pipe_schedule_t sched, const eng_backend_t *be,
                      wrk_coll_group_t *pp, uint32_t stages, uint32_t stage, int32_t prev,
                      int32_t next, uint32_t m, size_t count);
/* The interleaved schedule (Megatron's interleaved 1F1B; Narayanan et al. 2021) on stage
 * `stage` of `stages` with `chunks` model chunks per stage and m micro-batches (a multiple of
 * stages): over the ring of the column (stage stages - 1 sends chunk c's output to stage 0's
 * chunk c + 1), each stage runs its m * chunks chunk forwards in groups of `stages`
 * micro-batches per chunk, warm-up (stages - stage - 1) * 2 + (chunks - 1) * stages of them
 * (all when m == stages), then one forward and one backward at a time, then the cool-down.
 * Each receive pulls the neighbour's messages in the order the neighbour's own program
 * sends them (both programs are known to both), so the per-pair ordering of coll.h matches
 * without tags, and every transfer goes in the step's one global order (common/pipe_il.h: on
 * NCCL a send grouped with the receive beside it), so none deadlocks on NCCL's stream order; a
 * send alone, and on the host transports every send, is left in flight, so there the sender
 * waits for its receives only, never for its receiver. Every block
 * sees its micro-batches' backwards in micro-batch order: each gradient is summed in 1F1B's order.
 * Slots are chunk-activations (a forward of one chunk of one micro-batch, its backward freeing it):
 * slots = the warm-up depth + 1 (common/pipe_il.h), whatever m, and the stage step binds slot
 * `slot` to chunk `chunk` at each chunk_forward. */
int eng_pipeline_init_interleaved(eng_pipeline_t *p, const eng_backend_t *be, wrk_coll_group_t *pp,
                                  uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m,
                                  size_t count);
void eng_pipeline_fini(eng_pipeline_t *p);
/* Run one step's m micro-batches through ops in the schedule's order (ops->weight required
 * where eng_pipeline_splits). *wait_ns (may be NULL): time
 * blocked on point-to-point during the step. */
int eng_pipeline_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m, uint64_t *wait_ns);

#endif
