/* Rendezvous store; see kv.h for the theory of operation. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* ---------------------------------------------------------------------------------------
 * A small chained hash table over byte-string keys. Structs that live in one embed
 * hent_t as their first member. */

typedef struct hent {
    struct hent *next;
    uint64_t hash;
    uint8_t *key;
    size_t klen;
} hent_t;

typedef struct htab {
    hent_t **b;
    size_t nb, n;
} htab_t;

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static hent_t *tab_find(const htab_t *t, const uint8_t *key, size_t klen, uint64_t h)
{
    if (t->nb == 0)
        return NULL;
    for (hent_t *e = t->b[h & (t->nb - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    return NULL;
}

/* Keep the load factor <= 1; sizes are powers of two. */
static int tab_insert(htab_t *t, hent_t *e)
{
    if (t->n + 1 > t->nb) {
        size_t nb = t->nb ? t->nb * 2 : 16;
        hent_t **b = calloc(nb, sizeof(*b));
        if (!b)
            return -ENOMEM;
        for (size_t i = 0; i < t->nb; i++) {
            for (hent_t *x = t->b[i], *next; x; x = next) {
                next = x->next;
                x->next = b[x->hash & (nb - 1)];
                b[x->hash & (nb - 1)] = x;
            }
        }
        free(t->b);
        t->b = b;
        t->nb = nb;
    }
    hent_t **head = &t->b[e->hash & (t->nb - 1)];
    e->next = *head;
    *head = e;
    t->n++;
    return 0;
}

static void tab_remove(htab_t *t, hent_t *e)
{
    for (hent_t **p = &t->b[e->hash & (t->nb - 1)]; *p; p = &(*p)->next) {
        if (*p == e) {
            *p = e->next;
            t->n--;
            return;
        }
    }
}

static int hent_init(hent_t *e, const uint8_t *key, size_t klen, uint64_t h)
{
    e->key = malloc(klen ? klen : 1);
    if (!e->key)
        return -ENOMEM;
    memcpy(e->key, key, klen);
    e->klen = klen;
    e->hash = h;
    e->next = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Namespaces, entries, waiters. */

typedef struct entry entry_t;

typedef struct waiter {
    struct waiter *prev, *next; /* on the entry */
    entry_t *e;
    void *who;
    uint64_t rid;
    uint64_t deadline;
    size_t hidx; /* index in the heap */
} waiter_t;

typedef struct ns {
    hent_t h; /* key: job '\0' gen (8 bytes) */
    htab_t entries;
    int open;       /* coord_kv_open_gen ran: members and caps are set */
    void **members; /* sorted; who may touch the keys */
    size_t n_members;
    size_t max_keys, max_bytes, max_waiters;
    size_t bytes, waiters; /* values held, gets parked */
} ns_t;

struct entry {
    hent_t h; /* key: the user's key */
    ns_t *ns;
    int has; /* 0: placeholder for waiters */
    uint8_t *val;
    size_t len;
    waiter_t *waiters;
};

struct coord_kv {
    coord_kv_reply_fn reply;
    void *ud;
    htab_t spaces;
    waiter_t **heap;
    size_t nheap, capheap;
    size_t nkeys;
};

int coord_kv_create(coord_kv_reply_fn reply, void *ud, coord_kv_t **out)
{
    coord_kv_t *kv = calloc(1, sizeof(*kv));
    *out = NULL;
    if (!kv)
        return -ENOMEM;
    kv->reply = reply;
    kv->ud = ud;
    *out = kv;
    return 0;
}

/* ---- deadline heap ---- */

static void heap_swap(coord_kv_t *kv, size_t a, size_t b)
{
    waiter_t *t = kv->heap[a];
    kv->heap[a] = kv->heap[b];
    kv->heap[b] = t;
    kv->heap[a]->hidx = a;
    kv->heap[b]->hidx = b;
}

static void heap_up(coord_kv_t *kv, size_t i)
{
    while (i > 0 && kv->heap[(i - 1) / 2]->deadline > kv->heap[i]->deadline) {
        heap_swap(kv, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(coord_kv_t *kv, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < kv->nheap && kv->heap[l]->deadline < kv->heap[m]->deadline)
            m = l;
        if (r < kv->nheap && kv->heap[r]->deadline < kv->heap[m]->deadline)
            m = r;
        if (m == i)
            return;
        heap_swap(kv, i, m);
        i = m;
    }
}

static int heap_push(coord_kv_t *kv, waiter_t *w)
{
    if (kv->nheap == kv->capheap) {
        size_t cap = kv->capheap ? kv->capheap * 2 : 64;
        waiter_t **h = realloc(kv->heap, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        kv->heap = h;
        kv->capheap = cap;
    }
    w->hidx = kv->nheap;
    kv->heap[kv->nheap++] = w;
    heap_up(kv, w->hidx);
    return 0;
}

static void heap_remove(coord_kv_t *kv, waiter_t *w)
{
    size_t i = w->hidx, last = --kv->nheap;
    if (i != last) {
        heap_swap(kv, i, last);
        heap_down(kv, i);
        heap_up(kv, i);
    }
}

/* ---- entries ---- */

static size_t ns_key(const char *job, uint64_t gen, uint8_t *buf, size_t cap)
{
    size_t n = strnlen(job, cap - 9);
    memcpy(buf, job, n);
    buf[n] = 0;
    memcpy(buf + n + 1, &gen, 8);
    return n + 9;
}

static void ns_default_caps(ns_t *ns)
{
    ns->max_keys = COORD_KV_KEYS_DEFAULT;
    ns->max_bytes = COORD_KV_BYTES_DEFAULT;
    ns->max_waiters = COORD_KV_WAITERS_DEFAULT;
}

static ns_t *ns_get(coord_kv_t *kv, const char *job, uint64_t gen, int create)
{
    uint8_t key[CH_RDZV_KEY_MAX + 16];
    size_t klen = ns_key(job, gen, key, sizeof(key));
    uint64_t h = fnv1a(key, klen);
    ns_t *ns = (ns_t *)tab_find(&kv->spaces, key, klen, h);
    if (ns || !create)
        return ns;
    ns = calloc(1, sizeof(*ns));
    if (!ns)
        return NULL;
    ns_default_caps(ns);
    if (hent_init(&ns->h, key, klen, h) < 0 || tab_insert(&kv->spaces, &ns->h) < 0) {
        free(ns->h.key);
        free(ns);
        return NULL;
    }
    return ns;
}

static entry_t *entry_get(coord_kv_t *kv, ns_t *ns, const char *key, int create)
{
    size_t klen = strlen(key);
    uint64_t h = fnv1a((const uint8_t *)key, klen);
    entry_t *e = (entry_t *)tab_find(&ns->entries, (const uint8_t *)key, klen, h);
    if (e || !create || ns->entries.n >= ns->max_keys)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    if (hent_init(&e->h, (const uint8_t *)key, klen, h) < 0 ||
        tab_insert(&ns->entries, &e->h) < 0) {
        free(e->h.key);
        free(e);
        return NULL;
    }
    e->ns = ns;
    return e;
}

static void entry_free(coord_kv_t *kv, entry_t *e)
{
    if (e->has)
        kv->nkeys--;
    e->ns->bytes -= e->len;
    free(e->val);
    free(e->h.key);
    free(e);
}

static void waiter_unlink(entry_t *e, waiter_t *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        e->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
}

/* Remove a waiter from its entry and the heap; a placeholder left without waiters goes. */
static void waiter_drop(coord_kv_t *kv, waiter_t *w)
{
    entry_t *e = w->e;
    waiter_unlink(e, w);
    heap_remove(kv, w);
    e->ns->waiters--;
    free(w);
    if (!e->has && !e->waiters) {
        tab_remove(&e->ns->entries, &e->h);
        entry_free(kv, e);
    }
}

static int check_key(const char *key)
{
    size_t n = strnlen(key, CH_RDZV_KEY_MAX + 1);
    if (n == 0)
        return -EINVAL;
    return n > CH_RDZV_KEY_MAX ? CH_E_TOOBIG : 0;
}

int coord_kv_set(coord_kv_t *kv, const char *job, uint64_t gen, const char *key, const uint8_t *val,
                 size_t len)
{
    int rc = check_key(key);
    if (rc < 0)
        return rc;
    if (len > CH_RDZV_VALUE_MAX)
        return CH_E_TOOBIG;
    ns_t *ns = ns_get(kv, job, gen, 1);
    if (!ns)
        return -ENOMEM;
    entry_t *e = entry_get(kv, ns, key, 1);
    if (!e)
        return ns->entries.n >= ns->max_keys ? -ENOSPC : -ENOMEM;
    if (ns->bytes - e->len + len > ns->max_bytes) {
        if (!e->has && !e->waiters) {
            tab_remove(&ns->entries, &e->h);
            entry_free(kv, e);
        }
        return -ENOSPC;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM; /* a placeholder just made stays, empty: harmless, freed with the gen */
    if (len)
        memcpy(copy, val, len);
    ns->bytes = ns->bytes - e->len + len;
    free(e->val);
    e->val = copy;
    e->len = len;
    if (!e->has)
        kv->nkeys++;
    e->has = 1;
    /* Answer every parked get; the entry now holds a value, so waiter_drop keeps it. */
    while (e->waiters) {
        waiter_t *w = e->waiters;
        kv->reply(kv->ud, w->who, w->rid, 0, e->val, e->len);
        waiter_drop(kv, w);
    }
    return 0;
}

int coord_kv_get(coord_kv_t *kv, const char *job, uint64_t gen, const char *key,
                 uint32_t timeout_ms, uint64_t now_ms, void *waiter, uint64_t request_id)
{
    int rc = check_key(key);
    if (rc < 0)
        return rc;
    ns_t *ns = ns_get(kv, job, gen, timeout_ms > 0);
    entry_t *e = ns ? entry_get(kv, ns, key, timeout_ms > 0) : NULL;
    if (timeout_ms > 0 && ns && (!e || (!e->has && ns->waiters >= ns->max_waiters))) {
        if (e && !e->waiters) {
            tab_remove(&ns->entries, &e->h);
            entry_free(kv, e);
        }
        return ns->waiters >= ns->max_waiters || ns->entries.n >= ns->max_keys ? -ENOSPC : -ENOMEM;
    }
    if (e && e->has) {
        kv->reply(kv->ud, waiter, request_id, 0, e->val, e->len);
        return 0;
    }
    if (timeout_ms == 0) {
        kv->reply(kv->ud, waiter, request_id, -ETIMEDOUT, NULL, 0);
        return 0;
    }
    if (!e)
        return -ENOMEM;
    waiter_t *w = calloc(1, sizeof(*w));
    if (w) {
        w->e = e;
        w->who = waiter;
        w->rid = request_id;
        w->deadline = now_ms + timeout_ms;
    }
    if (!w || heap_push(kv, w) < 0) {
        free(w);
        if (!e->waiters) {
            tab_remove(&ns->entries, &e->h);
            entry_free(kv, e);
        }
        return -ENOMEM;
    }
    w->next = e->waiters;
    if (e->waiters)
        e->waiters->prev = w;
    e->waiters = w;
    ns->waiters++;
    return 0;
}

void coord_kv_expire(coord_kv_t *kv, uint64_t now_ms)
{
    while (kv->nheap > 0 && kv->heap[0]->deadline <= now_ms) {
        waiter_t *w = kv->heap[0];
        kv->reply(kv->ud, w->who, w->rid, -ETIMEDOUT, NULL, 0);
        waiter_drop(kv, w);
    }
}

int coord_kv_next_deadline(const coord_kv_t *kv, uint64_t *deadline_ms)
{
    if (kv->nheap == 0)
        return 0;
    *deadline_ms = kv->heap[0]->deadline;
    return 1;
}

/* Free a namespace's entries; answer waiters with code unless code is 0 (forget). */
static void ns_free(coord_kv_t *kv, ns_t *ns, int code)
{
    for (size_t i = 0; i < ns->entries.nb; i++) {
        for (hent_t *x = ns->entries.b[i], *next; x; x = next) {
            entry_t *e = (entry_t *)x;
            next = x->next;
            while (e->waiters) {
                waiter_t *w = e->waiters;
                if (code)
                    kv->reply(kv->ud, w->who, w->rid, code, NULL, 0);
                waiter_unlink(e, w);
                heap_remove(kv, w);
                free(w);
            }
            entry_free(kv, e);
        }
    }
    free(ns->entries.b);
    free(ns->members);
    free(ns->h.key);
    free(ns);
}

void coord_kv_drop_gen(coord_kv_t *kv, const char *job, uint64_t gen)
{
    ns_t *ns = ns_get(kv, job, gen, 0);
    if (!ns)
        return;
    tab_remove(&kv->spaces, &ns->h);
    ns_free(kv, ns, CH_E_ABORTED);
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

int coord_kv_open_gen(coord_kv_t *kv, const char *job, uint64_t gen, void *const *members, size_t n,
                      size_t max_keys, size_t max_bytes, size_t max_waiters)
{
    ns_t *ns = ns_get(kv, job, gen, 1);
    void **m = malloc((n ? n : 1) * sizeof(*m));
    if (!ns || !m) {
        free(m);
        return -ENOMEM;
    }
    if (n)
        memcpy(m, members, n * sizeof(*m));
    qsort(m, n, sizeof(*m), cmp_ptr);
    free(ns->members);
    ns->members = m;
    ns->n_members = n;
    ns->max_keys = max_keys;
    ns->max_bytes = max_bytes;
    ns->max_waiters = max_waiters;
    ns->open = 1;
    return 0;
}

int coord_kv_gen_is_open(coord_kv_t *kv, const char *job, uint64_t gen)
{
    ns_t *ns = ns_get(kv, job, gen, 0);
    return ns && ns->open;
}

int coord_kv_allowed(coord_kv_t *kv, const char *job, uint64_t gen, const void *who)
{
    ns_t *ns = ns_get(kv, job, gen, 0);
    if (!ns || !ns->open)
        return 0;
    return bsearch(&who, ns->members, ns->n_members, sizeof(*ns->members), cmp_ptr) != NULL;
}

void coord_kv_drop_waiter(coord_kv_t *kv, void *waiter)
{
    /* Rare (a link closed): collect first, since removal reorders the heap. */
    size_t n = 0;
    for (size_t i = 0; i < kv->nheap; i++)
        n += kv->heap[i]->who == waiter;
    if (n == 0)
        return;
    waiter_t **list = malloc(n * sizeof(*list));
    if (!list) {
        /* Out of memory: fall back to removing one at a time from the top of a scan. */
        for (size_t i = 0; i < kv->nheap;) {
            if (kv->heap[i]->who == waiter) {
                waiter_drop(kv, kv->heap[i]);
                i = 0;
            } else {
                i++;
            }
        }
        return;
    }
    n = 0;
    for (size_t i = 0; i < kv->nheap; i++)
        if (kv->heap[i]->who == waiter)
            list[n++] = kv->heap[i];
    for (size_t i = 0; i < n; i++)
        waiter_drop(kv, list[i]);
    free(list);
}

void coord_kv_destroy(coord_kv_t *kv)
{
    if (!kv)
        return;
    for (size_t i = 0; i < kv->spaces.nb; i++) {
        for (hent_t *x = kv->spaces.b[i], *next; x; x = next) {
            next = x->next;
            ns_free(kv, (ns_t *)x, 0);
        }
    }
    free(kv->spaces.b);
    free(kv->heap);
    free(kv);
}

size_t coord_kv_keys(const coord_kv_t *kv)
{
    return kv->nkeys;
}

size_t coord_kv_waiters(const coord_kv_t *kv)
{
    return kv->nheap;
}
