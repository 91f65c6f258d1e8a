/* The interleaved 1F1B schedule's program and the buffers it needs (Megatron's interleaved
 * schedule, Narayanan et al. 2021): workerd/engine/pipeline_il.c runs it, common/plan.c counts
 * its memory from the same layout, so the plan and the engine cannot disagree.
 *
 * Theory of operation. Stage s of `stages` holds `chunks` model chunks (virtual stage
 * c * stages + s) and runs total = chunks * m chunk forwards and as many backwards: a warm-up of
 * (stages - s - 1) * 2 + (chunks - 1) * stages forwards (all of them when m == stages), then one
 * forward and one backward at a time, then the cool-down's backwards. At most warm + 1
 * chunk-activations are alive at once (a forward fills one, its backward frees it), never a
 * number that grows with m: Megatron's memory. Messages travel on a ring (the last stage sends
 * chunk c's output to stage 0's chunk c + 1) and each receiver pulls its neighbour's messages in
 * the order the neighbour sends them, only when it needs one (the programs of both are known
 * to both, so no tags).
 *
 * ch_il_layout walks one step of a stage's program once and hands every (chunk, micro-batch)
 * its chunk-activation slot, every received message its receive buffer and every input
 * gradient its send buffer, each the lowest free one:
 * - a slot from the chunk's forward to the end of its backward;
 * - a receive buffer from the message's pull to the end of the backward that reads it (a
 *   chunk's input is read again by its backward);
 * - a send buffer from the input gradient's backward until its receiver certainly has it: the
 *   receiver pulls it at the latest when its own backward of that micro-batch starts, so any
 *   message the receiver sends from that op on, once pulled here, proves it. Reusing a buffer
 *   then never waits on a peer (no deadlock); one never proven stays taken until the step ends.
 * A forward's output is sent from its slot: its backward needs the gradient the receiver
 * computes from it, so the send is done before the slot is freed.
 *
 * NCCL (a send holds its stream until the peer's stream reaches the receive) needs more than
 * the order of each pair: two neighbours that each queue a send to the other deadlock. So the
 * layout also orders the step's transfers globally (xfer): every stage runs every stage's
 * program against buffered messages (the receivers pulling as above) and logs each transfer
 * when its receiver pulls it; a send then happens at the point of its sender's program where
 * that sender stood at that moment, a receive where its receiver needed it. The stages run in
 * simulated time (a forward 1, a backward 2; ops in the order they end, pulls first), so that
 * the sender stands where the real one does when the receiver needs the message (a
 * stage run as far as its messages allow would send only after all it could run first,
 * and its neighbour would wait that long). Each stage does its transfers in that one order
 * (on NCCL the engine groups a send with the receive next to it at the same point, as
 * Megatron's send_forward_recv_backward, and a send alone keeps its place on the stream; on
 * the host transports every send is left in flight where it stands and the host waits for
 * receives only): the earliest unfinished transfer is then always at the head of both its
 * ends' streams, so none waits for ever. Receives stay where the layout pulls them (its
 * buffers hold) and sends only finish earlier than the layout assumes. */
#ifndef CH_PIPE_IL_H
#define CH_PIPE_IL_H

#include <stdint.h>

typedef struct ch_il_prog {
    uint32_t stages, stage, chunks, m, total, warm;
} ch_il_prog_t;

/* Stage `stage`'s program (stages >= 2, chunks >= 1, m a multiple of stages). */
ch_il_prog_t ch_il_prog(uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m);
/* Op j (0 .. 2 * total) of g: *fwd whether a forward, of chunk *c and micro-batch *mb. */
void ch_il_op(const ch_il_prog_t *g, uint32_t j, int *fwd, uint32_t *c, uint32_t *mb);
/* The id of a message as its receiving stage names it: kind 0 the input of its chunk c for
 * mb, kind 1 the gradient of that chunk's output; ids < 2 * chunks * m. */
uint32_t ch_il_msg(const ch_il_prog_t *g, uint32_t kind, uint32_t c, uint32_t mb);
/* What op (fwd, c, mb) of g's stage sends: 1 with *to and *id; 0 when it sends nothing (the
 * last chunk of the last stage's forward, chunk 0 of stage 0's backward). */
int ch_il_send(const ch_il_prog_t *g, int fwd, uint32_t c, uint32_t mb, uint32_t *to, uint32_t *id);

/* One transfer of a stage's step (above): at program point `at` (before op at; 2 * total:
 * after the last op) send message id, made by op `op`, to stage peer (send 1) or receive it
 * from stage peer (send 0, op unused). */
typedef struct ch_il_xfer {
    uint32_t at, peer, id, op, send;
} ch_il_xfer_t;

/* One step of a stage laid out (above). Arrays indexed by c * m + mb are per (chunk,
 * micro-batch); by message id, per message received. */
typedef struct ch_il_layout {
    ch_il_prog_t g;
    uint32_t peers[2], npeers; /* the ring neighbours: previous, next (one when stages == 2) */
    uint32_t nseq[2];
    uint32_t *seq[2]; /* message ids peers[i] sends this stage, in its order */
    uint32_t *slot;   /* [chunks * m] chunk-activation slot */
    uint32_t *recv;   /* [2 * chunks * m] receive buffer of each message id */
    uint32_t *send;   /* [chunks * m] send buffer of the input gradient (UINT32_MAX: none) */
    uint32_t slots;   /* chunk-activations alive at once: warm + 1, or total */
    uint32_t recvs;   /* receive buffers */
    uint32_t sends;   /* input-gradient send buffers */
    uint32_t nxfer;
    ch_il_xfer_t *xfer; /* this stage's transfers, in the step's global order */
} ch_il_layout_t;

/* Lay out stage `stage`'s step; 0, -EINVAL (stages < 2, chunks < 1, m not a positive
 * multiple of stages, stage >= stages) or -ENOMEM. ch_il_layout_free releases it. */
int ch_il_layout(ch_il_layout_t *l, uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m);
void ch_il_layout_free(ch_il_layout_t *l);
/* How many of l->xfer from k go as one launch: 2 when xfer k and k + 1 are at the same point,
 * one a send and the other a receive (one grouped exchange), else 1. */
uint32_t ch_il_launch(const ch_il_layout_t *l, uint32_t k);
/* Index of peer in l->peers. */
uint32_t ch_il_peer_index(const ch_il_layout_t *l, uint32_t peer);

#endif
