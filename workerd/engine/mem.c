/* The memory ledger (mem.h). */
#include "workerd/engine/mem.h"

#include <errno.h>
#include <stdlib.h>

typedef struct view {
    eng_backend_t table; /* first: a view's eng_backend_t * is its struct view * */
    eng_mem_t *ledger;
    eng_mem_kind_t kind;
} view_t;

typedef struct block {
    const void *p;
    size_t bytes;
    eng_mem_kind_t kind;
} block_t;

struct eng_mem {
    const eng_backend_t *inner;
    view_t views[ENG_MEM_NKINDS];
    block_t *blocks; /* live blocks, unordered */
    size_t n, cap;
    eng_mem_stats_t st;
};

static int counted_alloc(const eng_backend_t *be, size_t bytes, void **out);
static void counted_free(const eng_backend_t *be, void *p);

static eng_mem_t *ledger_of(const eng_backend_t *be)
{
    return be != NULL && be->alloc == counted_alloc ? ((const view_t *)be)->ledger : NULL;
}

static int record(eng_mem_t *m, eng_mem_kind_t kind, const void *p, size_t bytes)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        block_t *b = realloc(m->blocks, cap * sizeof *b);
        if (b == NULL)
            return -ENOMEM;
        m->blocks = b;
        m->cap = cap;
    }
    m->blocks[m->n++] = (block_t){p, bytes, kind};
    eng_mem_stats_t *s = &m->st;
    s->cur[kind] += bytes;
    s->peak[kind] = s->cur[kind] > s->peak[kind] ? s->cur[kind] : s->peak[kind];
    s->total += bytes;
    s->total_peak = s->total > s->total_peak ? s->total : s->total_peak;
    s->total_max = s->total > s->total_max ? s->total : s->total_max;
    return 0;
}

static void unrecord(eng_mem_t *m, const void *p)
{
    for (size_t i = 0; i < m->n; i++) {
        if (m->blocks[i].p == p) {
            m->st.cur[m->blocks[i].kind] -= m->blocks[i].bytes;
            m->st.total -= m->blocks[i].bytes;
            m->blocks[i] = m->blocks[--m->n];
            return;
        }
    }
}

static int counted_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    const view_t *v = (const view_t *)be;
    const eng_backend_t *in = v->ledger->inner;
    int rc = in->alloc(in, bytes, out);
    if (rc == 0 && (rc = record(v->ledger, v->kind, *out, bytes)) < 0) {
        in->free(in, *out);
        *out = NULL;
    }
    return rc;
}

static void counted_free(const eng_backend_t *be, void *p)
{
    const view_t *v = (const view_t *)be;
    if (p == NULL)
        return;
    unrecord(v->ledger, p);
    v->ledger->inner->free(v->ledger->inner, p);
}

int eng_mem_create(const eng_backend_t *be, eng_mem_t **out)
{
    eng_mem_t *m = calloc(1, sizeof *m);
    *out = NULL;
    if (m == NULL)
        return -ENOMEM;
    m->inner = be;
    for (int k = 0; k < ENG_MEM_NKINDS; k++) {
        m->views[k].table = *be;
        m->views[k].table.alloc = counted_alloc;
        m->views[k].table.free = counted_free;
        m->views[k].ledger = m;
        m->views[k].kind = (eng_mem_kind_t)k;
    }
    *out = m;
    return 0;
}

void eng_mem_destroy(eng_mem_t *m)
{
    if (m == NULL)
        return;
    free(m->blocks);
    free(m);
}

const eng_backend_t *eng_mem_backend(eng_mem_t *m, eng_mem_kind_t kind)
{
    return &m->views[kind].table;
}

const eng_backend_t *eng_mem_view(const eng_backend_t *be, eng_mem_kind_t kind)
{
    eng_mem_t *m = ledger_of(be);
    return m != NULL ? &m->views[kind].table : be;
}

void eng_mem_note(const eng_backend_t *be, eng_mem_kind_t kind, const void *p, size_t bytes)
{
    eng_mem_t *m = ledger_of(be);
    if (m != NULL && p != NULL)
        (void)record(m, kind, p, bytes); /* a ledger out of memory undercounts */
}

void eng_mem_forget(const eng_backend_t *be, const void *p)
{
    eng_mem_t *m = ledger_of(be);
    if (m != NULL && p != NULL)
        unrecord(m, p);
}

void eng_mem_stats(const eng_mem_t *m, eng_mem_stats_t *out)
{
    *out = m->st;
}

void eng_mem_mark(eng_mem_t *m)
{
    for (int k = 0; k < ENG_MEM_NKINDS; k++)
        m->st.peak[k] = m->st.cur[k];
    m->st.total_peak = m->st.total;
}

const char *eng_mem_kind_name(eng_mem_kind_t kind)
{
    static const char *const names[ENG_MEM_NKINDS] = {"params",   "grads", "optim",
                                                      "gathered", "acts",  "scratch"};
    return kind < ENG_MEM_NKINDS ? names[kind] : "?";
}
