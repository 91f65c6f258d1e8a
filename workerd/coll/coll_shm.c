/* Same-host shared-memory collectives: the segment and the step engine (coll_shm.h). */
#include "workerd/coll/coll_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/err.h"
#include "common/log.h"

#define SEG_MAGIC    0x48534843u /* "CHSH" */
#define SLOTS        4
#define LINE         128          /* counters one per line, no false sharing */
#define PIECE_MAX    (128u << 10) /* per member per step: fits L2 with the rest */
#define PIECE_MIN    (16u << 10)
#define SLOT_TARGET  (256u << 10)       /* stage bytes per member per slot */
#define STREAM_BYTES ((size_t)4u << 20) /* operations this large write results past the cache */
#define ZC_MIN_BYTES (1u << 20)         /* smaller ones are not worth the extra handshake */
#define PEER_MAPS    8                  /* cached mappings of each member's buffers */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "counters in shared memory must be lock-free");

typedef struct seg_hdr {
    uint32_t magic, n, slots, pad;
    uint64_t piece_bytes, size;
} seg_hdr_t;

/* A buffer in registered memory, as another process finds it. serial 0: not registered. */
typedef struct buf_ref {
    int32_t fd, pad;
    uint64_t serial, size, off;
} buf_ref_t;

typedef struct ctl {
    _Alignas(LINE) _Atomic uint64_t posted;    /* steps whose pieces are in this member's slots */
    _Alignas(LINE) _Atomic uint64_t reduced;   /* steps whose result piece is in its slot */
    _Alignas(LINE) _Atomic uint64_t done;      /* steps this member has finished reading */
    _Alignas(LINE) _Atomic uint64_t announced; /* announcements whose descriptor follows */
    int32_t pid, pad;
    buf_ref_t send, recv;
    _Alignas(LINE) _Atomic uint64_t finished; /* zero-copy operations done with all buffers */
} ctl_t;

typedef struct reg_ent {
    char *p;
    size_t size;
    int fd;
    uint64_t serial;
} reg_ent_t;

struct wrk_shm_reg {
    reg_ent_t *e;
    size_t n, cap;
    uint64_t serial;
};

typedef struct peer_map {
    int fd;
    uint64_t serial, size;
    char *base;
} peer_map_t;

struct wrk_shm {
    uint32_t n, me;
    int fd; /* member 0 until sealed, else -1 */
    char *map;
    size_t size, piece_bytes, slot_bytes;
    ctl_t *ctl; /* n */
    char *data;
    uint64_t assigned;  /* steps numbered so far */
    uint64_t tickets;   /* operations numbered so far */
    uint64_t running;   /* ticket of the operation allowed to run */
    uint64_t announces; /* announcing operations numbered so far */
    wrk_shm_reg_t *reg; /* borrowed */
    peer_map_t *maps;   /* n * PEER_MAPS */
    uint32_t *map_next; /* n: round-robin eviction */
    float *scratch;     /* piece_bytes: a zero-copy reduction's accumulator */
};

enum { PH_ANNOUNCE, PH_DECIDE, PH_ZC, PH_ZC_WAIT, PH_STEPS };

// ----------------------------------------------------------------------------
// registered memory

static size_t page_round(size_t bytes)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return ((bytes ? bytes : 1) + pg - 1) / pg * pg;
}

/* A memfd of size bytes whose pages are reserved now: a memory limit shows up here, not as
 * SIGBUS at the first touch. */
static int memfd_sized(const char *name, size_t size, int *out)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = ftruncate(fd, (off_t)size) < 0 ? -errno : -posix_fallocate(fd, 0, (off_t)size);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int wrk_shm_reg_create(wrk_shm_reg_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : -ENOMEM;
}

void wrk_shm_reg_destroy(wrk_shm_reg_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        munmap(r->e[i].p, r->e[i].size);
        close(r->e[i].fd);
    }
    free(r->e);
    free(r);
}

int wrk_shm_mem_alloc(wrk_shm_reg_t *r, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes < ZC_MIN_BYTES)
        return -ERANGE; /* never zero-copy: not worth a descriptor and a mapping */
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        reg_ent_t *e = realloc(r->e, cap * sizeof *e);
        if (!e)
            return -ENOMEM;
        r->e = e, r->cap = cap;
    }
    size_t size = page_round(bytes);
    int fd = -1;
    int rc = memfd_sized("chorus-buf", size, &fd);
    if (rc < 0)
        return rc;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        close(fd);
        return rc;
    }
    r->e[r->n++] = (reg_ent_t){.p = p, .size = size, .fd = fd, .serial = ++r->serial};
    *out = p;
    return 0;
}

int wrk_shm_mem_free(wrk_shm_reg_t *r, void *p)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].p == p) {
            munmap(r->e[i].p, r->e[i].size);
            close(r->e[i].fd);
            r->e[i] = r->e[--r->n];
            return 0;
        }
    return -ENOENT;
}

/* The registered allocation holding [p, p + bytes), or serial 0. */
static buf_ref_t reg_find(const wrk_shm_reg_t *r, const void *p, size_t bytes)
{
    const char *c = p;
    for (size_t i = 0; r && i < r->n; i++) {
        const reg_ent_t *e = &r->e[i];
        if (c >= e->p && c <= e->p + e->size && bytes <= (size_t)(e->p + e->size - c))
            return (buf_ref_t){
                .fd = e->fd, .serial = e->serial, .size = e->size, .off = (uint64_t)(c - e->p)};
    }
    return (buf_ref_t){0};
}

/* Member k's registered buffer ref, mapped here (cached per allocation). */
static int map_peer(wrk_shm_t *s, uint32_t k, int32_t pid, const buf_ref_t *ref, size_t bytes,
                    char **out)
{
    if (ref->off > ref->size || bytes > ref->size - ref->off)
        return CH_E_FORMAT;
    peer_map_t *m = &s->maps[(size_t)k * PEER_MAPS], *slot = NULL;
    for (int i = 0; i < PEER_MAPS; i++) {
        if (m[i].base && m[i].fd == ref->fd && m[i].serial == ref->serial &&
            m[i].size == ref->size) {
            *out = m[i].base + ref->off;
            return 0;
        }
        if (m[i].base && m[i].fd == ref->fd) /* the descriptor was reused: stale */
            slot = &m[i];
    }
    if (!slot)
        slot = &m[s->map_next[k]++ % PEER_MAPS];
    if (slot->base)
        munmap(slot->base, slot->size);
    slot->base = NULL;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)ref->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st; /* a shorter file would fault (SIGBUS) past its end */
    void *p = MAP_FAILED;
    int rc = fstat(fd, &st) < 0 ? -errno : (uint64_t)st.st_size < ref->size ? CH_E_FORMAT : 0;
    if (rc == 0 &&
        (p = mmap(NULL, ref->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        rc = -errno;
    close(fd);
    if (rc < 0)
        return rc;
    *slot = (peer_map_t){.fd = ref->fd, .serial = ref->serial, .size = ref->size, .base = p};
    *out = slot->base + ref->off;
    return 0;
}

// ----------------------------------------------------------------------------
// segment

static size_t piece_bytes_for(uint32_t n)
{
    size_t p = SLOT_TARGET / n;
    p = p < PIECE_MIN ? PIECE_MIN : p > PIECE_MAX ? PIECE_MAX : p;
    return p & ~(size_t)63;
}

static size_t data_offset(uint32_t n)
{
    size_t end = LINE + (size_t)n * sizeof(ctl_t);
    return (end + 4095) & ~(size_t)4095;
}

/* This process's side of a segment for member me of n: geometry, mapping cache, scratch. */
static wrk_shm_t *state_new(uint32_t n, uint32_t me, wrk_shm_reg_t *reg)
{
    wrk_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->n = n, s->me = me, s->reg = reg, s->fd = -1;
    s->piece_bytes = piece_bytes_for(n);
    s->slot_bytes = ((size_t)n + 1) * s->piece_bytes; /* n stage pieces, one result piece */
    s->size = data_offset(n) + (size_t)n * SLOTS * s->slot_bytes;
    s->maps = calloc((size_t)n * PEER_MAPS, sizeof *s->maps);
    s->map_next = calloc(n, sizeof *s->map_next);
    s->scratch = aligned_alloc(64, s->piece_bytes);
    if (!s->maps || !s->map_next || !s->scratch) {
        free(s->scratch);
        free(s->map_next);
        free(s->maps);
        free(s);
        return NULL;
    }
    return s;
}

static int map_segment(wrk_shm_t *s, int fd)
{
    void *m = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return -errno;
    s->map = m;
    s->ctl = (ctl_t *)(s->map + LINE);
    s->data = s->map + data_offset(s->n);
    return 0;
}

int wrk_shm_create(uint32_t n, wrk_shm_reg_t *reg, wrk_shm_t **out, char *ref)
{
    *out = NULL;
    if (n < 2 || n > WRK_SHM_MAX_MEMBERS)
        return -EINVAL;
    wrk_shm_t *s = state_new(n, 0, reg);
    if (!s)
        return -ENOMEM;
    int rc = 0;
    CH_CHECK_GOTO(memfd_sized("chorus-coll", s->size, &s->fd), rc, fail);
    CH_CHECK_GOTO(map_segment(s, s->fd), rc, fail);
    seg_hdr_t h = {
        .magic = SEG_MAGIC, .n = n, .slots = SLOTS, .piece_bytes = s->piece_bytes, .size = s->size};
    memcpy(s->map, &h, sizeof h);
    snprintf(ref, WRK_SHM_REF_MAX, "/proc/%d/fd/%d", (int)getpid(), s->fd);
    *out = s;
    return 0;
fail:
    wrk_shm_destroy(s);
    return rc;
}

int wrk_shm_attach(const char *ref, uint32_t n, uint32_t me, wrk_shm_reg_t *reg, wrk_shm_t **out)
{
    *out = NULL;
    if (n < 2 || n > WRK_SHM_MAX_MEMBERS || me == 0 || me >= n)
        return -EINVAL;
    wrk_shm_t *s = state_new(n, me, reg);
    if (!s)
        return -ENOMEM;
    int rc = 0;
    int fd = open(ref, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto fail;
    }
    if ((size_t)st.st_size != s->size) {
        rc = CH_E_FORMAT;
        goto fail;
    }
    CH_CHECK_GOTO(map_segment(s, fd), rc, fail);
    seg_hdr_t h;
    memcpy(&h, s->map, sizeof h);
    if (h.magic != SEG_MAGIC || h.n != n || h.slots != SLOTS || h.piece_bytes != s->piece_bytes ||
        h.size != s->size) {
        rc = CH_E_FORMAT;
        goto fail;
    }
    close(fd);
    *out = s;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    wrk_shm_destroy(s);
    return rc;
}

void wrk_shm_seal(wrk_shm_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

void wrk_shm_destroy(wrk_shm_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < (size_t)s->n * PEER_MAPS; i++)
        if (s->maps[i].base)
            munmap(s->maps[i].base, s->maps[i].size);
    if (s->map)
        munmap(s->map, s->size);
    wrk_shm_seal(s);
    free(s->scratch);
    free(s->map_next);
    free(s->maps);
    free(s);
}

// ----------------------------------------------------------------------------
// copies

/* Results of large operations bypass the cache (streaming stores): they are not read again
 * soon, and an ordinary store would first read every destination line from memory. */
static void copy_out(void *dst, const void *src, size_t bytes, int stream)
{
#if defined(__x86_64__)
    if (stream && bytes >= 4096) {
        char *d = dst;
        const char *p = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, p, head);
        d += head, p += head, bytes -= head;
        size_t i = 0;
        for (; i + 64 <= bytes; i += 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(p + i));
            __m128i x1 = _mm_loadu_si128((const __m128i *)(p + i + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(p + i + 32));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(p + i + 48));
            _mm_stream_si128((__m128i *)(d + i), x0);
            _mm_stream_si128((__m128i *)(d + i + 16), x1);
            _mm_stream_si128((__m128i *)(d + i + 32), x2);
            _mm_stream_si128((__m128i *)(d + i + 48), x3);
        }
        memcpy(d + i, p + i, bytes - i);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, bytes);
}

/* Sum of nsrc float arrays in order ((s0 + s1) + s2) + ..., stored to every dst in one pass
 * (dst d with streaming stores when bit d of stream is set). The same bits as
 * wrk_coll_reduce in that order. 1 when it ran (x86-64, every dst 16-byte aligned), else 0. */
static int sum_to_all(float *const *dst, uint32_t ndst, const float *const *src, uint32_t nsrc,
                      size_t len, unsigned stream)
{
#if defined(__x86_64__)
    for (uint32_t d = 0; d < ndst; d++)
        if ((uintptr_t)dst[d] & 15)
            return 0;
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        __m128 v = _mm_add_ps(_mm_loadu_ps(src[0] + i), _mm_loadu_ps(src[1] + i));
        for (uint32_t k = 2; k < nsrc; k++)
            v = _mm_add_ps(v, _mm_loadu_ps(src[k] + i));
        for (uint32_t d = 0; d < ndst; d++) {
            if (stream >> d & 1)
                _mm_stream_ps(dst[d] + i, v);
            else
                _mm_store_ps(dst[d] + i, v);
        }
    }
    for (; i < len; i++) {
        float v = src[0][i] + src[1][i];
        for (uint32_t k = 2; k < nsrc; k++)
            v += src[k][i];
        for (uint32_t d = 0; d < ndst; d++)
            dst[d][i] = v;
    }
    return 1;
#else
    (void)dst, (void)ndst, (void)src, (void)nsrc, (void)len, (void)stream;
    return 0;
#endif
}

static void stream_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

// ----------------------------------------------------------------------------
// steps

static char *stage(const wrk_shm_t *s, uint32_t m, uint64_t t, uint32_t b)
{
    return s->data + ((size_t)m * SLOTS + t % SLOTS) * s->slot_bytes + (size_t)b * s->piece_bytes;
}

static char *result(const wrk_shm_t *s, uint32_t m, uint64_t t)
{
    return stage(s, m, t, s->n);
}

/* Piece of block b at step t: its length in elements (maybe 0) and its element offset in
 * the operation's full vector (allreduce: the vector; reduce_scatter: the send buffer;
 * allgather: the receive buffer; broadcast: the buffer). */
static size_t piece_of(const wrk_shm_op_t *op, uint32_t b, uint64_t t, size_t *off)
{
    size_t start = (size_t)(t - op->base) * op->piece;
    size_t bfirst = (size_t)b * op->blk, blen = op->blk;
    if (op->a.kind == WRK_COLL_OP_ALLREDUCE)
        blen = bfirst >= op->a.count            ? 0
               : op->a.count - bfirst < op->blk ? op->a.count - bfirst
                                                : op->blk;
    if (op->a.kind == WRK_COLL_OP_BROADCAST)
        bfirst = 0;
    *off = bfirst + start;
    return blen > start ? (blen - start < op->piece ? blen - start : op->piece) : 0;
}

static uint64_t load(_Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_acquire);
}

static void publish(_Atomic uint64_t *v, uint64_t step)
{
    atomic_store_explicit(v, step, memory_order_release);
}

/* Every member's counter (at offset field of ctl_t) is past step t. */
static int all_past(const wrk_shm_t *s, size_t field, uint64_t t)
{
    for (uint32_t k = 0; k < s->n; k++)
        if (load((_Atomic uint64_t *)((char *)&s->ctl[k] + field)) <= t)
            return 0;
    return 1;
}

static int reduces(const wrk_shm_op_t *op)
{
    return op->a.kind == WRK_COLL_OP_ALLREDUCE || op->a.kind == WRK_COLL_OP_REDUCE_SCATTER;
}

static int stream_of(const wrk_shm_op_t *op)
{
    return op->a.count * op->esz * (op->a.kind == WRK_COLL_OP_ALLGATHER ? op->n : 1) >=
           STREAM_BYTES;
}

static int post_ready(const wrk_shm_t *s, uint64_t t)
{
    return t < SLOTS || all_past(s, offsetof(ctl_t, done), t - SLOTS);
}

static int reduce_ready(const wrk_shm_t *s, const wrk_shm_op_t *op, uint64_t t)
{
    return !reduces(op) || all_past(s, offsetof(ctl_t, posted), t);
}

static int gather_ready(const wrk_shm_t *s, const wrk_shm_op_t *op, uint64_t t)
{
    switch (op->a.kind) {
    case WRK_COLL_OP_REDUCE_SCATTER:
        return 1;
    case WRK_COLL_OP_BROADCAST:
        return load(&s->ctl[op->a.peer].reduced) > t;
    default:
        return all_past(s, offsetof(ctl_t, reduced), t);
    }
}

/* Copy into this member's slot what the others need of step t. */
static void do_post(const wrk_shm_t *s, const wrk_shm_op_t *op, uint64_t t)
{
    const char *src = op->a.sendbuf;
    size_t e = op->esz, off, len;
    switch (op->a.kind) {
    case WRK_COLL_OP_ALLREDUCE:
    case WRK_COLL_OP_REDUCE_SCATTER:
        for (uint32_t b = 0; b < op->n; b++)
            if (b != op->me && (len = piece_of(op, b, t, &off)) > 0)
                memcpy(stage(s, op->me, t, b), src + off * e, len * e);
        break;
    case WRK_COLL_OP_ALLGATHER:
        len = piece_of(op, 0, t, &off);
        memcpy(stage(s, op->me, t, 0), src + off * e, len * e);
        char *own = (char *)op->a.recvbuf + ((size_t)op->me * op->blk + off) * e;
        if (own != src + off * e)
            copy_out(own, src + off * e, len * e, stream_of(op));
        break;
    case WRK_COLL_OP_BROADCAST:
        if (op->me == op->a.peer && (len = piece_of(op, 0, t, &off)) > 0)
            memcpy(stage(s, op->me, t, 0), (const char *)op->a.recvbuf + off * e, len * e);
        break;
    default:
        break;
    }
}

/* Reduce this member's piece of step t in group order into its result slot, then into
 * recvbuf. */
static void do_reduce(const wrk_shm_t *s, const wrk_shm_op_t *op, uint64_t t)
{
    if (!reduces(op))
        return;
    size_t off, len = piece_of(op, op->me, t, &off), e = op->esz;
    if (len == 0)
        return;
    const float *x[WRK_SHM_MAX_MEMBERS];
    for (uint32_t k = 0; k < op->n; k++)
        x[k] = k == op->me ? (const float *)((const char *)op->a.sendbuf + off * e)
                           : (const float *)stage(s, k, t, op->me);
    int ar = op->a.kind == WRK_COLL_OP_ALLREDUCE; /* the others need the result too */
    size_t at = ar ? off : off - (size_t)op->me * op->blk;
    float *out[2] = {(float *)result(s, op->me, t), (float *)((char *)op->a.recvbuf + at * e)};
    unsigned stream = stream_of(op) ? 2u : 0u;
    if (op->a.op == WRK_COLL_SUM && op->a.dt == WRK_COLL_F32 &&
        sum_to_all(out + !ar, 1 + ar, x, op->n, len, stream >> !ar))
        return;
    for (uint32_t k = 1; k < op->n; k++) /* bf16: each partial sum rounds (coll.h) */
        wrk_coll_reduce(op->a.op, op->a.dt, out[0], k > 1 ? out[0] : x[0], x[k], len);
    copy_out(out[1], out[0], len * e, stream != 0);
}

/* Copy out what the others made of step t. */
static void do_gather(const wrk_shm_t *s, const wrk_shm_op_t *op, uint64_t t)
{
    size_t e = op->esz, off, len;
    char *dst = op->a.recvbuf;
    int stream = stream_of(op);
    switch (op->a.kind) {
    case WRK_COLL_OP_ALLREDUCE:
        for (uint32_t b = 0; b < op->n; b++)
            if (b != op->me && (len = piece_of(op, b, t, &off)) > 0)
                copy_out(dst + off * e, result(s, b, t), len * e, stream);
        break;
    case WRK_COLL_OP_ALLGATHER:
        for (uint32_t b = 0; b < op->n; b++)
            if (b != op->me && (len = piece_of(op, b, t, &off)) > 0)
                copy_out(dst + off * e, stage(s, b, t, 0), len * e, stream);
        break;
    case WRK_COLL_OP_BROADCAST:
        if (op->me != op->a.peer && (len = piece_of(op, 0, t, &off)) > 0)
            copy_out(dst + off * e, stage(s, op->a.peer, t, 0), len * e, stream);
        break;
    default:
        break;
    }
}

int wrk_shm_supports(const wrk_coll_args_t *a)
{
    switch (a->kind) {
    case WRK_COLL_OP_ALLREDUCE:
    case WRK_COLL_OP_REDUCE_SCATTER:
    case WRK_COLL_OP_ALLGATHER:
    case WRK_COLL_OP_BROADCAST:
        return a->count > 0;
    default:
        return 0;
    }
}

// ----------------------------------------------------------------------------
// zero-copy: every member's buffers registered

/* Bytes of the send and receive buffers of an operation. */
static void buffer_bytes(const wrk_shm_op_t *op, size_t *send, size_t *recv)
{
    size_t b = op->a.count * op->esz;
    *send = op->a.kind == WRK_COLL_OP_REDUCE_SCATTER ? b * op->n : b;
    *recv = op->a.kind == WRK_COLL_OP_ALLGATHER ? b * op->n : b;
}

static void announce(wrk_shm_t *s, const wrk_shm_op_t *op)
{
    ctl_t *me = &s->ctl[s->me];
    size_t sb, rb;
    buffer_bytes(op, &sb, &rb);
    me->pid = (int32_t)getpid();
    me->send = reg_find(s->reg, op->a.sendbuf, sb);
    me->recv = reg_find(s->reg, op->a.recvbuf, rb);
    publish(&me->announced, op->announce);
}

/* Every member announced: zero-copy when all buffers are registered (every member reads
 * the same descriptors, so all decide alike). Maps what this member will touch. */
static int decide(wrk_shm_t *s, wrk_shm_op_t *op, int *zc)
{
    *zc = 0;
    for (uint32_t k = 0; k < s->n; k++)
        if (s->ctl[k].send.serial == 0 || s->ctl[k].recv.serial == 0)
            return 0;
    size_t sb, rb;
    buffer_bytes(op, &sb, &rb);
    for (uint32_t k = 0; k < s->n; k++) {
        const ctl_t *c = &s->ctl[k];
        int rc = 0;
        if (k == s->me) {
            op->peer_send[k] = op->a.sendbuf;
            op->peer_recv[k] = op->a.recvbuf;
        } else {
            char *p = NULL;
            rc = map_peer(s, k, c->pid, &c->send, sb, &p);
            op->peer_send[k] = p;
            if (rc == 0 && op->a.kind == WRK_COLL_OP_ALLREDUCE)
                rc = map_peer(s, k, c->pid, &c->recv, rb, &op->peer_recv[k]);
        }
        if (rc < 0) {
            CH_LOGE("coll", "member %u: cannot map member %u's buffer: %s", s->me, k,
                    ch_strerror(rc));
            return rc;
        }
    }
    *zc = 1;
    return 0;
}

/* This member's share, straight between the members' buffers: allreduce: its block,
 * reduced in group order, into every member's receive buffer; reduce_scatter: its block into
 * its own; allgather: the others' blocks into its own. */
static void zero_copy(wrk_shm_t *s, const wrk_shm_op_t *op)
{
    size_t e = op->esz, count = op->a.count, first = 0, len = count;
    int stream = stream_of(op);
    if (op->a.kind == WRK_COLL_OP_ALLGATHER) {
        for (uint32_t k = 0; k < s->n; k++) {
            char *dst = (char *)op->a.recvbuf + (size_t)k * count * e;
            if (dst != op->peer_send[k])
                copy_out(dst, op->peer_send[k], count * e, stream);
        }
        return;
    }
    if (op->a.kind == WRK_COLL_OP_ALLREDUCE) {
        first = (size_t)s->me * op->blk;
        len = first >= count ? 0 : count - first < op->blk ? count - first : op->blk;
    } else {
        first = (size_t)s->me * count; /* reduce_scatter: this member's block of every send */
    }
    for (size_t c = 0; c < len; c += op->piece) {
        size_t m = len - c < op->piece ? len - c : op->piece, off = (first + c) * e;
        const float *src[WRK_SHM_MAX_MEMBERS];
        float *dst[WRK_SHM_MAX_MEMBERS];
        int rs = op->a.kind == WRK_COLL_OP_REDUCE_SCATTER;
        for (uint32_t k = 0; k < s->n; k++) {
            src[k] = (const float *)(op->peer_send[k] + off);
            dst[k] =
                rs ? (float *)((char *)op->a.recvbuf + c * e) : (float *)(op->peer_recv[k] + off);
        }
        if (op->a.op == WRK_COLL_SUM && op->a.dt == WRK_COLL_F32 &&
            sum_to_all(dst, rs ? 1 : s->n, src, s->n, m, stream ? ~0u : 0u))
            continue;
        for (uint32_t k = 1; k < s->n; k++) {
            const void *prev = k > 1 ? (const void *)s->scratch : op->peer_send[0] + off;
            wrk_coll_reduce(op->a.op, op->a.dt, s->scratch, prev, op->peer_send[k] + off, m);
        }
        if (op->a.kind == WRK_COLL_OP_REDUCE_SCATTER)
            copy_out((char *)op->a.recvbuf + c * e, s->scratch, m * e, stream);
        else
            for (uint32_t k = 0; k < s->n; k++)
                copy_out(op->peer_recv[k] + off, s->scratch, m * e, stream);
    }
}

// ----------------------------------------------------------------------------
// operations

void wrk_shm_op_init(wrk_shm_t *s, wrk_shm_op_t *op, const wrk_coll_args_t *a)
{
    memset(op, 0, sizeof *op);
    op->a = *a;
    op->n = s->n, op->me = s->me;
    op->esz = wrk_coll_dtype_size(a->dt);
    op->piece = s->piece_bytes / op->esz;
    op->blk = a->count;
    if (a->kind == WRK_COLL_OP_ALLREDUCE) {
        size_t align = 64 / op->esz; /* blocks start on cache lines of the vector */
        op->blk = (a->count + s->n - 1) / s->n;
        op->blk = (op->blk + align - 1) / align * align;
    }
    uint64_t steps = (op->blk + op->piece - 1) / op->piece;
    op->ticket = s->tickets++;
    op->base = op->post = op->red = op->gath = s->assigned;
    op->end = op->base + (steps ? steps : 1);
    s->assigned = op->end;
    op->phase = PH_STEPS;
    if (a->kind != WRK_COLL_OP_BROADCAST && s->reg && a->count * op->esz >= ZC_MIN_BYTES) {
        op->announce = ++s->announces;
        op->phase = PH_ANNOUNCE;
    }
}

/* The staged path: pipelined steps through this member's slots. 1 while steps remain. */
static int run_steps(wrk_shm_t *s, wrk_shm_op_t *op, int *moved)
{
    ctl_t *me = &s->ctl[s->me];
    for (;;) {
        if (op->gath < op->red && gather_ready(s, op, op->gath)) {
            do_gather(s, op, op->gath);
            publish(&me->done, ++op->gath);
        } else if (op->red < op->post && reduce_ready(s, op, op->red)) {
            do_reduce(s, op, op->red);
            publish(&me->reduced, ++op->red);
        } else if (op->post < op->end && post_ready(s, op->post)) {
            do_post(s, op, op->post);
            publish(&me->posted, ++op->post);
        } else {
            break;
        }
        *moved = 1;
    }
    return op->gath < op->end;
}

int wrk_shm_op_advance(wrk_shm_t *s, wrk_shm_op_t *op, int *moved)
{
    *moved = 0;
    if (s->running != op->ticket)
        return 1; /* the group's previous operation is still running */
    ctl_t *me = &s->ctl[s->me];
    int zc = 0, rc;
    switch (op->phase) {
    case PH_ANNOUNCE:
        announce(s, op);
        op->phase = PH_DECIDE;
        *moved = 1;
        /* fall through */
    case PH_DECIDE:
        if (!all_past(s, offsetof(ctl_t, announced), op->announce - 1))
            return 1;
        if ((rc = decide(s, op, &zc)) < 0)
            return rc;
        op->phase = zc ? PH_ZC : PH_STEPS;
        *moved = 1;
        if (!zc)
            goto steps;
        /* fall through */
    case PH_ZC:
        zero_copy(s, op);
        stream_fence(); /* streaming stores into the others' buffers land before we say so */
        publish(&me->finished, op->announce);
        op->phase = PH_ZC_WAIT;
        *moved = 1;
        /* fall through */
    case PH_ZC_WAIT:
        if (!all_past(s, offsetof(ctl_t, finished), op->announce - 1))
            return 1;
        /* the staged path's steps of this operation count as done everywhere */
        op->post = op->red = op->gath = op->end;
        publish(&me->posted, op->end);
        publish(&me->reduced, op->end);
        publish(&me->done, op->end);
        break;
    default:
    steps:
        if (run_steps(s, op, moved))
            return 1;
        break;
    }
    stream_fence();
    s->running++;
    return 0;
}
