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
 * The schedule sees the model only through the stage step (eng_stage_ops_t): it owns the
 * [B,T,C] buffers that cross stages, never the model. The bubble is the time blocked on
 * point-to-point over the step's time. */
#ifndef ENG_PIPELINE_H
#define ENG_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

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
     * with the gradient of its input (NULL on stage 0). */
    int (*backward)(void *ctx, uint32_t mb, uint32_t slot, const float *dy, float *dx);
} eng_stage_ops_t;

typedef struct eng_pipeline {
    uint32_t stage, stages, slots;
    size_t count; /* floats in one activation, B*T*C */
    eng_p2p_t p2p;
    const eng_backend_t *be; /* whose memory the buffers are (borrowed) */
    float *x, *dx, *dy;      /* slots * count each (dy: count), zeroed at init */
    eng_p2p_req_t *ysend, *dxsend;
} eng_pipeline_t;

/* Slots the schedule needs on stage s of p with m micro-batches: min(p - s, m). */
uint32_t eng_pipeline_slots(uint32_t stages, uint32_t stage, uint32_t m);
/* Buffers for micro-batches of count floats on stage `stage` of `stages` running at most m
 * micro-batches, in backend be's memory (the model's: the stage step hands them to its
 * kernels; NULL: the CPU backend), over the column pp (borrowed) with neighbours prev and
 * next. */
int eng_pipeline_init(eng_pipeline_t *p, const eng_backend_t *be, wrk_coll_group_t *pp,
                      uint32_t stages, uint32_t stage, int32_t prev, int32_t next, uint32_t m,
                      size_t count);
void eng_pipeline_fini(eng_pipeline_t *p);
/* Run one step's m micro-batches through ops in 1F1B order. *wait_ns (may be NULL): time
 * blocked on point-to-point during the step. */
int eng_pipeline_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m, uint64_t *wait_ns);

#endif
