/* Same-host shared-memory collectives: the segment and the step engine (coll_shm.h). */
#include "coll_shm.h"

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

#include "err.h"
#include "log.h"

#define SEG_MAGIC    0x48534843u /* "CHSH" */
#define SLOTS        4
#define LINE         128          /* counters one per line, no false sharing */
#define PIECE_MAX    (128u << 10) /* per member per step: fits L2 with the rest */
#define PIECE_MIN    (16u << 10)
#define SLOT_TARGET  (256u << 10)       /* stage bytes per member per slot */
#define STREAM_BYTES ((size_t)4u << 20) /* operations this large write results past the cache */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "counters in shared memory must be lock-free");

typedef struct seg_hdr {
    uint32_t magic, n, slots, pad;
    uint64_t piece_bytes, size;
} seg_hdr_t;

typedef struct ctl {
    _Alignas(LINE) _Atomic uint64_t posted;  /* steps whose pieces are in this member's slots */
    _Alignas(LINE) _Atomic uint64_t reduced; /* steps whose result piece is in its slot */
    _Alignas(LINE) _Atomic uint64_t done;    /* steps this member has finished reading */
} ctl_t;

struct wrk_shm {
    uint32_t n, me;
    int fd; /* member 0 until sealed, else -1 */
    char *map;
    size_t size, piece_bytes, slot_bytes;
    ctl_t *ctl; /* n */
    char *data;
    uint64_t assigned; /* steps numbered so far */
    uint64_t head;     /* first step of the operation allowed to run */
};

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

/* The segment's geometry for n members; returns its size. */
static size_t geometry(wrk_shm_t *s, uint32_t n)
{
    s->n = n;
    s->piece_bytes = piece_bytes_for(n);
    s->slot_bytes = ((size_t)n + 1) * s->piece_bytes; /* n stage pieces, one result piece */
    return data_offset(n) + (size_t)n * SLOTS * s->slot_bytes;
}

static int map_segment(wrk_shm_t *s, int fd, size_t size)
{
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return -errno;
    s->map = m;
    s->size = size;
    s->ctl = (ctl_t *)(s->map + LINE);
    s->data = s->map + data_offset(s->n);
    return 0;
}

int wrk_shm_create(uint32_t n, wrk_shm_t **out, char *ref)
{
    *out = NULL;
    if (n < 2 || n > WRK_SHM_MAX_MEMBERS)
        return -EINVAL;
    wrk_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    size_t size = geometry(s, n);
    int rc = 0;
    s->fd = memfd_create("chorus-coll", MFD_CLOEXEC);
    if (s->fd < 0) {
        rc = -errno;
        goto fail;
    }
    /* Reserve the pages now: a memory limit shows up here, not as SIGBUS mid-collective. */
    if (ftruncate(s->fd, (off_t)size) < 0) {
        rc = -errno;
        goto fail;
    }
    int e = posix_fallocate(s->fd, 0, (off_t)size);
    if (e) {
        rc = -e;
        goto fail;
    }
    CH_CHECK_GOTO(map_segment(s, s->fd, size), rc, fail);
    seg_hdr_t h = {
        .magic = SEG_MAGIC, .n = n, .slots = SLOTS, .piece_bytes = s->piece_bytes, .size = size};
    memcpy(s->map, &h, sizeof h);
    snprintf(ref, WRK_SHM_REF_MAX, "/proc/%d/fd/%d", (int)getpid(), s->fd);
    *out = s;
    return 0;
fail:
    if (s->fd >= 0)
        close(s->fd);
    free(s);
    return rc;
}

int wrk_shm_attach(const char *ref, uint32_t n, uint32_t me, wrk_shm_t **out)
{
    *out = NULL;
    if (n < 2 || n > WRK_SHM_MAX_MEMBERS || me == 0 || me >= n)
        return -EINVAL;
    wrk_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->me = me;
    s->fd = -1;
    size_t size = geometry(s, n);
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
    if ((size_t)st.st_size != size) {
        rc = CH_E_FORMAT;
        goto fail;
    }
    CH_CHECK_GOTO(map_segment(s, fd, size), rc, fail);
    seg_hdr_t h;
    memcpy(&h, s->map, sizeof h);
    if (h.magic != SEG_MAGIC || h.n != n || h.slots != SLOTS || h.piece_bytes != s->piece_bytes ||
        h.size != size) {
        munmap(s->map, s->size);
        rc = CH_E_FORMAT;
        goto fail;
    }
    close(fd);
    *out = s;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    free(s);
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
    munmap(s->map, s->size);
    wrk_shm_seal(s);
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
    const float *own = (const float *)((const char *)op->a.sendbuf + off * e);
    float *acc = (float *)result(s, op->me, t);
    for (uint32_t k = 1; k < op->n; k++) {
        const float *x = k == op->me ? own : (const float *)stage(s, k, t, op->me);
        const float *prev = k > 1 ? acc : op->me == 0 ? own : (const float *)stage(s, 0, t, op->me);
        wrk_coll_reduce(op->a.op, acc, prev, x, len);
    }
    size_t dst = op->a.kind == WRK_COLL_OP_ALLREDUCE ? off : off - (size_t)op->me * op->blk;
    copy_out((char *)op->a.recvbuf + dst * e, acc, len * e, stream_of(op));
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
    op->base = op->post = op->red = op->gath = s->assigned;
    op->end = op->base + (steps ? steps : 1);
    s->assigned = op->end;
}

int wrk_shm_op_advance(wrk_shm_t *s, wrk_shm_op_t *op, int *moved)
{
    *moved = 0;
    if (s->head != op->base)
        return 1; /* the group's previous operation is still running */
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
    if (op->gath < op->end)
        return 1;
    stream_fence();
    s->head = op->end;
    return 0;
}
