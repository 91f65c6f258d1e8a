/* The interleaved 1F1B schedule's program and buffer layout (pipe_il.h). */
#include "common/pipe_il.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define NONE UINT32_MAX

ch_il_prog_t ch_il_prog(uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m)
{
    ch_il_prog_t g = {stages, stage, chunks, m, m * chunks, 0};
    uint32_t w = (stages - stage - 1) * 2 + (chunks - 1) * stages;
    g.warm = m == stages || w > g.total ? g.total : w;
    return g;
}

/* The k-th forward runs chunk (k / stages) % chunks, the k-th backward the chunks in
 * reverse; both micro-batch (k / (stages * chunks)) * stages + k % stages. */
void ch_il_op(const ch_il_prog_t *g, uint32_t j, int *fwd, uint32_t *c, uint32_t *mb)
{
    uint32_t T = g->total, W = g->warm, k;
    if (j < W) {
        *fwd = 1;
        k = j;
    } else if (j < W + 2 * (T - W)) {
        uint32_t d = j - W;
        *fwd = !(d & 1u);
        k = *fwd ? W + d / 2 : d / 2;
    } else {
        *fwd = 0;
        k = (T - W) + (j - W - 2 * (T - W));
    }
    *c = (k / g->stages) % g->chunks;
    if (!*fwd)
        *c = g->chunks - 1 - *c;
    *mb = (k / (g->stages * g->chunks)) * g->stages + k % g->stages;
}

uint32_t ch_il_msg(const ch_il_prog_t *g, uint32_t kind, uint32_t c, uint32_t mb)
{
    return (kind * g->chunks + c) * g->m + mb;
}

int ch_il_send(const ch_il_prog_t *g, int fwd, uint32_t c, uint32_t mb, uint32_t *to, uint32_t *id)
{
    uint32_t S = g->stages, s = g->stage;
    if (fwd) {
        if (s == S - 1 && c == g->chunks - 1)
            return 0;
        *to = (s + 1) % S;
        *id = ch_il_msg(g, 0, s == S - 1 ? c + 1 : c, mb);
    } else {
        if (s == 0 && c == 0)
            return 0;
        *to = (s + S - 1) % S;
        *id = ch_il_msg(g, 1, s == 0 ? c - 1 : c, mb);
    }
    return 1;
}

uint32_t ch_il_launch(const ch_il_layout_t *l, uint32_t k)
{
    const ch_il_xfer_t *x = l->xfer;
    return k + 1 < l->nxfer && x[k + 1].at == x[k].at && x[k + 1].send != x[k].send ? 2 : 1;
}

uint32_t ch_il_peer_index(const ch_il_layout_t *l, uint32_t peer)
{
    return l->npeers > 1 && l->peers[1] == peer ? 1 : 0;
}

void ch_il_layout_free(ch_il_layout_t *l)
{
    for (int i = 0; i < 2; i++)
        free(l->seq[i]);
    free(l->slot);
    free(l->recv);
    free(l->send);
    free(l->xfer);
    memset(l, 0, sizeof *l);
}

/* The walk's working state (ch_il_layout). */
typedef struct walk {
    ch_il_layout_t *l;
    uint32_t *sop[2];       /* the op of peers[i] that sends seq[i][k] */
    uint32_t *prev_bwd;     /* [chunks * m] the previous stage's backward op of (c, mb) */
    unsigned char *arrived; /* [2 * chunks * m] */
    unsigned char *slot_busy, *recv_busy, *send_busy;
    uint32_t *send_peer, *send_proof; /* a send buffer is free once seq[peer][proof] is pulled */
    uint32_t cur[2];
} walk_t;

/* The lowest free of busy[], taken; *hw the count ever used. */
static uint32_t take(unsigned char *busy, uint32_t *hw)
{
    uint32_t i = 0;
    while (busy[i])
        i++;
    busy[i] = 1;
    *hw = i + 1 > *hw ? i + 1 : *hw;
    return i;
}

/* What peer sends this stage, in its order, with the op that sends each. */
static void peer_sends(walk_t *w, uint32_t i)
{
    ch_il_layout_t *l = w->l;
    ch_il_prog_t p = ch_il_prog(l->g.stages, l->peers[i], l->g.chunks, l->g.m);
    for (uint32_t j = 0; j < 2 * p.total; j++) {
        int fwd;
        uint32_t c, mb, to, id;
        ch_il_op(&p, j, &fwd, &c, &mb);
        if (ch_il_send(&p, fwd, c, mb, &to, &id) && to == l->g.stage) {
            w->sop[i][l->nseq[i]] = j;
            l->seq[i][l->nseq[i]++] = id;
        }
    }
}

/* Pull peer's messages until message id has arrived, each into the lowest free buffer. */
static int pull(walk_t *w, uint32_t peer, uint32_t id)
{
    ch_il_layout_t *l = w->l;
    uint32_t i = ch_il_peer_index(l, peer);
    while (!w->arrived[id]) {
        if (w->cur[i] >= l->nseq[i])
            return CH_E_STATE; /* the programs disagree: never */
        uint32_t got = l->seq[i][w->cur[i]++];
        l->recv[got] = take(w->recv_busy, &l->recvs);
        w->arrived[got] = 1;
    }
    return 0;
}

/* The input gradient of (c, mb)'s send buffer: the lowest one free or proven received. */
static uint32_t take_send(walk_t *w, uint32_t id)
{
    ch_il_layout_t *l = w->l;
    const uint32_t n = l->g.chunks * l->g.m, p = ch_il_peer_index(l, l->peers[0]);
    uint32_t b = 0;
    while (w->send_busy[b] &&
           (w->send_proof[b] == NONE || w->cur[w->send_peer[b]] <= w->send_proof[b]))
        b++;
    w->send_busy[b] = 1;
    l->sends = b + 1 > l->sends ? b + 1 : l->sends;
    /* the previous stage pulls it by its backward of that (chunk, micro-batch) */
    uint32_t use = w->prev_bwd[id - n], k = 0;
    while (k < l->nseq[p] && w->sop[p][k] < use)
        k++;
    w->send_peer[b] = p;
    w->send_proof[b] = k < l->nseq[p] ? k : NONE;
    return b;
}

static int walk_op(walk_t *w, uint32_t j)
{
    ch_il_layout_t *l = w->l;
    const ch_il_prog_t *g = &l->g;
    int fwd, rc = 0;
    uint32_t c, mb, to, id;
    ch_il_op(g, j, &fwd, &c, &mb);
    uint32_t at = c * g->m + mb;
    int first = g->stage == 0 && c == 0, last = g->stage == g->stages - 1 && c == g->chunks - 1;
    if (fwd) {
        if (!first)
            rc = pull(w, l->peers[0], ch_il_msg(g, 0, c, mb));
        l->slot[at] = take(w->slot_busy, &l->slots);
        return rc;
    }
    if (!last)
        rc = pull(w, l->peers[l->npeers - 1], ch_il_msg(g, 1, c, mb));
    l->send[at] = ch_il_send(g, 0, c, mb, &to, &id) ? take_send(w, id) : NONE;
    w->slot_busy[l->slot[at]] = 0;
    if (!first)
        w->recv_busy[l->recv[ch_il_msg(g, 0, c, mb)]] = 0;
    if (!last)
        w->recv_busy[l->recv[ch_il_msg(g, 1, c, mb)]] = 0;
    return rc;
}

static void walk_free(walk_t *w)
{
    free(w->sop[0]);
    free(w->sop[1]);
    free(w->prev_bwd);
    free(w->arrived);
    free(w->slot_busy);
    free(w->recv_busy);
    free(w->send_busy);
    free(w->send_peer);
    free(w->send_proof);
}

/* The global order's run of every stage (order_xfers): buffered messages, one queue per
 * sender and direction (1: to the next stage, the only one when stages == 2), each message
 * with the time its sender made it. Time: a forward costs 1, a backward 2 (its two
 * matrix products per forward one). */
typedef struct ring {
    ch_il_prog_t *g;
    uint32_t *pos;          /* [stages] ops done */
    uint64_t *clock;        /* [stages] the time each stage's ops done take */
    unsigned char *arrived; /* [stages][2 * chunks * m] */
    uint32_t *q;            /* [stages][2][2 * chunks * m][2]: message id, its op */
    uint64_t *made;         /* [stages][2][2 * chunks * m]: the sender's clock after its op */
    uint32_t *head, *tail;  /* [stages][2] */
    size_t n;               /* 2 * chunks * m */
} ring_t;

static void log_xfer(ch_il_layout_t *l, uint32_t at, uint32_t peer, uint32_t id, uint32_t op,
                     uint32_t send)
{
    l->xfer[l->nxfer++] = (ch_il_xfer_t){at, peer, id, op, send};
}

/* The queue stage r's next op pulls from, when it lacks its message (else -1). */
static int64_t ring_need(const ring_t *w, uint32_t S, uint32_t r)
{
    const ch_il_prog_t *g = &w->g[r];
    int fwd;
    uint32_t c, mb;
    ch_il_op(g, w->pos[r], &fwd, &c, &mb);
    int first = r == 0 && c == 0, last = r == S - 1 && c == g->chunks - 1;
    if (fwd ? first : last)
        return -1;
    uint32_t from = fwd ? (r + S - 1) % S : (r + 1) % S;
    if (w->arrived[r * w->n + ch_il_msg(g, fwd ? 0 : 1, c, mb)])
        return -1;
    return from * 2 + (r == (from + 1) % S);
}

/* When stage r's next event happens, as a sort key: a pull (its next op lacks its message)
 * at twice the later of its clock and the time the message was made; an op at twice the
 * time it ends, + 1. Ops go in the order they end, so a receiver that needs a message at
 * time T pulls it before its sender runs an op ending after T: the send is logged at a
 * point the sender reaches by T, never one op late (at unit times stage 0 then idles
 * exactly the schedule's (p-1)/(v m+p-1), test_pipeline); 0 when the stage has finished
 * or waits for a message not yet sent. */
static int ring_ready(const ring_t *w, uint32_t S, uint32_t r, uint64_t *t)
{
    if (w->pos[r] >= 2 * w->g[r].total)
        return 0;
    int64_t qi = ring_need(w, S, r);
    if (qi < 0) {
        int fwd;
        uint32_t c, mb;
        ch_il_op(&w->g[r], w->pos[r], &fwd, &c, &mb);
        *t = 2 * (w->clock[r] + (fwd ? 1 : 2)) + 1;
        return 1;
    }
    if (w->head[qi] == w->tail[qi])
        return 0;
    uint64_t made = w->made[(size_t)qi * w->n + w->head[qi]];
    *t = 2 * (made > w->clock[r] ? made : w->clock[r]);
    return 1;
}

/* Stage r's next event (ring_ready said it can): the next message pulled from the queue
 * its next op waits on, or that op run. */
static void ring_step(ring_t *w, ch_il_layout_t *l, uint32_t r)
{
    const uint32_t S = l->g.stages, me = l->g.stage;
    const ch_il_prog_t *g = &w->g[r];
    int64_t qi = ring_need(w, S, r);
    if (qi >= 0) {
        uint32_t from = (uint32_t)qi / 2, *h = &w->head[qi];
        uint64_t made = w->made[(size_t)qi * w->n + *h];
        const uint32_t *e = &w->q[((size_t)qi * w->n + (*h)++) * 2];
        w->arrived[r * w->n + e[0]] = 1;
        w->clock[r] = made > w->clock[r] ? made : w->clock[r];
        if (from == me)
            log_xfer(l, w->pos[from], r, e[0], e[1], 1);
        else if (r == me)
            log_xfer(l, w->pos[r], from, e[0], 0, 0);
        return;
    }
    int fwd;
    uint32_t c, mb, to, id;
    ch_il_op(g, w->pos[r], &fwd, &c, &mb);
    w->clock[r] += fwd ? 1 : 2;
    if (ch_il_send(g, fwd, c, mb, &to, &id)) {
        uint32_t out = r * 2 + (to == (r + 1) % S), k = w->tail[out]++;
        uint32_t *e = &w->q[((size_t)out * w->n + k) * 2];
        e[0] = id;
        e[1] = w->pos[r];
        w->made[(size_t)out * w->n + k] = w->clock[r];
    }
    w->pos[r]++;
}

/* The step's transfers in one global order (pipe_il.h), this stage's logged in l->xfer.
 * The stages run in simulated time, the earliest-ready one an op at a time, so that each
 * send is logged where its sender stands when the receiver needs the message: about when
 * the real sender gets there, rather than after all it could run before the receiver
 * started (a stage run as far as its messages allow would place the first sends of the
 * step after its whole warm-up, and hold its neighbour back for as long). */
static int order_xfers(ch_il_layout_t *l)
{
    const uint32_t S = l->g.stages;
    ring_t w = {.n = 2 * (size_t)l->g.chunks * l->g.m};
    w.g = calloc(S, sizeof *w.g);
    w.pos = calloc(S, sizeof *w.pos);
    w.clock = calloc(S, sizeof *w.clock);
    w.arrived = calloc(S * w.n, 1);
    w.q = calloc(S * 4 * w.n, sizeof *w.q);
    w.made = calloc(S * 2 * w.n, sizeof *w.made);
    w.head = calloc(2 * S, sizeof *w.head);
    w.tail = calloc(2 * S, sizeof *w.tail);
    l->xfer = calloc(2 * w.n, sizeof *l->xfer);
    int rc = w.g && w.pos && w.clock && w.arrived && w.q && w.made && w.head && w.tail && l->xfer
                 ? 0
                 : -ENOMEM;
    for (uint32_t r = 0; rc == 0 && r < S; r++)
        w.g[r] = ch_il_prog(S, r, l->g.chunks, l->g.m);
    while (rc == 0) {
        uint32_t next = S;
        uint64_t best = 0, t;
        for (uint32_t r = 0; r < S; r++)
            if (ring_ready(&w, S, r, &t) && (next == S || t < best))
                next = r, best = t;
        if (next == S)
            break;
        ring_step(&w, l, next);
    }
    for (uint32_t r = 0; rc == 0 && r < S; r++)
        if (w.pos[r] < 2 * w.g[r].total)
            rc = CH_E_STATE; /* the programs disagree: never */
    free(w.g);
    free(w.pos);
    free(w.clock);
    free(w.arrived);
    free(w.q);
    free(w.made);
    free(w.head);
    free(w.tail);
    return rc;
}

int ch_il_layout(ch_il_layout_t *l, uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m)
{
    memset(l, 0, sizeof *l);
    if (stages < 2 || stage >= stages || chunks < 1 || m == 0 || m % stages != 0)
        return -EINVAL;
    l->g = ch_il_prog(stages, stage, chunks, m);
    l->peers[0] = (stage + stages - 1) % stages;
    l->peers[1] = (stage + 1) % stages;
    l->npeers = l->peers[0] == l->peers[1] ? 1 : 2;
    const size_t n = (size_t)chunks * m, ops = 2 * n;
    walk_t w = {.l = l};
    for (uint32_t i = 0; i < l->npeers; i++) {
        l->seq[i] = malloc(ops * sizeof *l->seq[i]);
        w.sop[i] = malloc(ops * sizeof *w.sop[i]);
    }
    l->slot = calloc(n, sizeof *l->slot);
    l->recv = calloc(ops, sizeof *l->recv);
    l->send = calloc(n, sizeof *l->send);
    w.prev_bwd = calloc(n, sizeof *w.prev_bwd);
    w.arrived = calloc(ops, 1);
    w.slot_busy = calloc(n + 1, 1);
    w.recv_busy = calloc(ops + 1, 1);
    w.send_busy = calloc(n + 1, 1);
    w.send_peer = calloc(n + 1, sizeof *w.send_peer);
    w.send_proof = calloc(n + 1, sizeof *w.send_proof);
    int rc = l->seq[0] && w.sop[0] && (l->npeers < 2 || (l->seq[1] && w.sop[1])) && l->slot &&
                     l->recv && l->send && w.prev_bwd && w.arrived && w.slot_busy && w.recv_busy &&
                     w.send_busy && w.send_peer && w.send_proof
                 ? 0
                 : -ENOMEM;
    if (rc == 0) {
        for (uint32_t i = 0; i < l->npeers; i++)
            peer_sends(&w, i);
        ch_il_prog_t p = ch_il_prog(stages, l->peers[0], chunks, m);
        for (uint32_t j = 0; j < 2 * p.total; j++) {
            int fwd;
            uint32_t c, mb;
            ch_il_op(&p, j, &fwd, &c, &mb);
            if (!fwd)
                w.prev_bwd[c * m + mb] = j;
        }
    }
    for (uint32_t j = 0; rc == 0 && j < 2 * l->g.total; j++)
        rc = walk_op(&w, j);
    walk_free(&w);
    if (rc == 0)
        rc = order_xfers(l);
    if (rc < 0)
        ch_il_layout_free(l);
    return rc;
}
