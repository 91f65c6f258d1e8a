/* What a rank's engine holds in backend memory, measured (DESIGN §7): a ledger that counts
 * the current and high-water bytes of every allocation by kind, so a rank reports what it
 * holds rather than what the plan (common/plan.h) computes it should.
 *
 * Theory of operation. A ledger wraps a backend: for each kind it offers a view, a copy of
 * the backend's table (the same ud, so the same stream and kernels) whose alloc and free
 * go to the backend and record the block's size and kind. A module allocates a kind
 * through eng_mem_view(be, kind) of whatever backend it was given: the ledger's view of
 * that kind when be is one of a ledger's views, else be itself (uncounted). A block may be
 * freed through any view of its ledger. Memory from elsewhere (the collectives'
 * allocator) is recorded with eng_mem_note / eng_mem_forget. One thread drives a ledger. */
#ifndef ENG_MEM_H
#define ENG_MEM_H

#include <stddef.h>

#include "workerd/engine/backend.h"

typedef enum eng_mem_kind {
    ENG_MEM_PARAMS,   /* parameters a rank keeps: the slab, or ZeRO-3's owned shards */
    ENG_MEM_GRADS,    /* their gradients */
    ENG_MEM_OPTIM,    /* Adam m and v */
    ENG_MEM_GATHERED, /* ZeRO-3's gathered copies and unsharded gradients */
    ENG_MEM_ACTS,     /* what forwards keep for backwards, and the pipeline's [B,T,C] */
    ENG_MEM_SCRATCH,  /* used once at a time: backward scratch, logits, reductions */
    ENG_MEM_NKINDS,
} eng_mem_kind_t;

typedef struct eng_mem_stats {
    size_t cur[ENG_MEM_NKINDS];  /* bytes held now, by kind */
    size_t peak[ENG_MEM_NKINDS]; /* each kind's own high-water mark since the last mark */
    size_t total, total_peak;    /* all kinds now; the high-water mark of that sum since the
                                    last mark (the trainer marks each step's start) */
    size_t total_max;            /* the high-water mark of the sum since the ledger began */
} eng_mem_stats_t;

typedef struct eng_mem eng_mem_t;

/* A ledger over be (borrowed for the ledger's life). 0 or -ENOMEM. */
int eng_mem_create(const eng_backend_t *be, eng_mem_t **out);
/* Every block must have been freed (or forgotten) first. */
void eng_mem_destroy(eng_mem_t *m);
/* The ledger's view of kind: pass it as the backend of whatever allocates. */
const eng_backend_t *eng_mem_backend(eng_mem_t *m, eng_mem_kind_t kind);
/* be's view of kind when be is a ledger's view; else be. */
const eng_backend_t *eng_mem_view(const eng_backend_t *be, eng_mem_kind_t kind);
/* Count (forget) a block of bytes at p obtained elsewhere, when be is a ledger's view;
 * nothing otherwise. */
void eng_mem_note(const eng_backend_t *be, eng_mem_kind_t kind, const void *p, size_t bytes);
void eng_mem_forget(const eng_backend_t *be, const void *p);
void eng_mem_stats(const eng_mem_t *m, eng_mem_stats_t *out);
/* Start a new window: the peaks become what is held now. */
void eng_mem_mark(eng_mem_t *m);
/* "params", "grads", "optim", "gathered", "acts", "scratch" */
const char *eng_mem_kind_name(eng_mem_kind_t kind);

#endif
