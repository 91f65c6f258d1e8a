/* Where a rank's piece of a tensor sits in the full tensor (slice.h).
 *
 * A slice is a sequence of runs: for each row r in [lo[0], hi[0]) and each part q in
 * [0, parts), the w = hi[1] - lo[1] columns that start at full element
 * r * cols + q * (cols / parts) + lo[1] (1-D: one row, columns lo[0] .. hi[0]). Flat index
 * k of the slice is run k / w, column k % w. Reading and writing walk the runs that
 * overlap [a, b); rows at or past shape[0] are padding. */
#include "workerd/engine/slice.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The geometry in run form. */
typedef struct runs {
    uint32_t rlo, rhi; /* rows */
    uint32_t clo, w;   /* first column within a part, run width */
    uint32_t parts, part_w;
    size_t cols;   /* columns of the full tensor (1-D: n) */
    uint32_t rows; /* rows of the full tensor; rows past it are padding */
} runs_t;

static runs_t runs_of(const eng_slice_t *s)
{
    runs_t g;
    int two = s->ndim == 2;
    g.rlo = two ? s->lo[0] : 0;
    g.rhi = two ? s->hi[0] : 1;
    g.clo = s->lo[two];
    g.w = s->hi[two] - s->lo[two];
    g.parts = s->parts ? s->parts : 1;
    g.cols = two ? s->shape[1] : s->shape[0];
    g.part_w = (uint32_t)(g.cols / g.parts);
    g.rows = two ? s->shape[0] : 1;
    return g;
}

eng_slice_t eng_slice_whole(uint32_t ndim, uint32_t d0, uint32_t d1)
{
    eng_slice_t s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    s.shape[0] = d0;
    s.hi[0] = d0;
    if (ndim == 2) {
        s.shape[1] = d1;
        s.hi[1] = d1;
    }
    s.parts = 1;
    return s;
}

size_t eng_slice_numel(const eng_slice_t *s)
{
    runs_t g = runs_of(s);
    return (size_t)(g.rhi - g.rlo) * g.parts * g.w;
}

size_t eng_slice_full_numel(const eng_slice_t *s)
{
    return (size_t)s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
}

int eng_slice_check(const eng_slice_t *s)
{
    if (s->ndim != 1 && s->ndim != 2)
        return -EINVAL;
    int last = s->ndim == 2 ? 1 : 0;
    if (s->parts == 0 || s->shape[last] % s->parts != 0)
        return -EINVAL;
    if (s->lo[last] > s->hi[last] || s->hi[last] > s->shape[last] / s->parts)
        return -EINVAL;
    if (s->ndim == 2 && s->lo[0] > s->hi[0]) /* rows may run into padding */
        return -EINVAL;
    if (s->ndim == 1 && (s->shape[1] || s->lo[1] || s->hi[1]))
        return -EINVAL;
    /* the slice's size fits (metadata read from a file); parts * w <= shape[last] and the
     * full tensor's two uint32 dimensions fit in 64 bits */
    runs_t g = runs_of(s);
    size_t rows = g.rhi - g.rlo, row = (size_t)g.parts * g.w;
    if (rows && row > SIZE_MAX / rows)
        return -EINVAL;
    return 0;
}

/* The run holding slice element k < b: where it starts in the full tensor (pad set for
 * padding rows) and how many elements of [k, b) it holds. */
typedef struct run {
    size_t f, n;
    int pad;
} run_t;

static run_t run_at(const runs_t *g, size_t k, size_t b)
{
    size_t run = k / g->w, col = k % g->w;
    size_t r = g->rlo + run / g->parts, q = run % g->parts;
    run_t x;
    x.n = g->w - col < b - k ? g->w - col : b - k;
    x.pad = r >= g->rows;
    x.f = x.pad ? 0 : r * g->cols + q * g->part_w + g->clo + col;
    return x;
}

void eng_slice_read(const eng_slice_t *s, size_t a, size_t b, const float *full, float *dst)
{
    runs_t g = runs_of(s);
    for (size_t k = a; k < b;) {
        run_t x = run_at(&g, k, b);
        if (x.pad)
            memset(dst + (k - a), 0, x.n * sizeof *dst);
        else
            memcpy(dst + (k - a), full + x.f, x.n * sizeof *dst);
        k += x.n;
    }
}

void eng_slice_write(const eng_slice_t *s, size_t a, size_t b, const float *src, float *full,
                     uint8_t *covered)
{
    runs_t g = runs_of(s);
    for (size_t k = a; k < b;) {
        run_t x = run_at(&g, k, b);
        if (!x.pad) {
            memcpy(full + x.f, src + (k - a), x.n * sizeof *src);
            for (size_t i = x.f; covered && i < x.f + x.n; i++)
                covered[i / 8] |= (uint8_t)(1u << (i % 8));
        }
        k += x.n;
    }
}

// ----------------------------------------------------------------------------
// text form: "shape=[C,3C] lo=[0,0] hi=[C,C/2] parts=3 range=[a,b)" (1-D: one number
// in each bracket)

int eng_slice_format(const eng_slice_t *s, size_t a, size_t b, char *out, size_t cap)
{
    int n;
    if (eng_slice_check(s) < 0 || a > b || b > eng_slice_numel(s))
        return -EINVAL;
    if (s->ndim == 2)
        n = snprintf(out, cap,
                     "shape=[%" PRIu32 ",%" PRIu32 "] lo=[%" PRIu32 ",%" PRIu32 "] hi=[%" PRIu32
                     ",%" PRIu32 "] parts=%" PRIu32 " range=[%zu,%zu)",
                     s->shape[0], s->shape[1], s->lo[0], s->lo[1], s->hi[0], s->hi[1], s->parts, a,
                     b);
    else
        n = snprintf(out, cap,
                     "shape=[%" PRIu32 "] lo=[%" PRIu32 "] hi=[%" PRIu32 "] parts=%" PRIu32
                     " range=[%zu,%zu)",
                     s->shape[0], s->lo[0], s->hi[0], s->parts, a, b);
    return n < 0 || (size_t)n >= cap ? -ENOSPC : 0;
}

/* Expect the literal lit at *p and step over it. */
static int lit(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n) != 0)
        return -EINVAL;
    *p += n;
    return 0;
}

/* A decimal number without sign or leading zeros (the canonical form), at most max. */
static int num(const char **p, uint64_t max, uint64_t *out)
{
    const char *q = *p;
    uint64_t v = 0;
    if (*q < '0' || *q > '9' || (q[0] == '0' && q[1] >= '0' && q[1] <= '9'))
        return -EINVAL;
    for (; *q >= '0' && *q <= '9'; q++) {
        unsigned d = (unsigned)(*q - '0');
        if (v > (max - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    *p = q;
    *out = v;
    return 0;
}

/* "[x]" or "[x,y]" of ndim numbers into v. ndim 0: learn it from the text. */
static int list(const char **p, uint32_t *ndim, uint32_t v[2])
{
    uint64_t x;
    int rc = lit(p, "[");
    for (uint32_t i = 0; rc == 0 && i < 2; i++) {
        if ((rc = num(p, UINT32_MAX, &x)) < 0)
            break;
        v[i] = (uint32_t)x;
        if (**p == ']' && (*ndim == 0 || *ndim == i + 1)) {
            *ndim = i + 1;
            return lit(p, "]");
        }
        rc = i == 0 ? lit(p, ",") : -EINVAL;
    }
    return rc < 0 ? rc : -EINVAL;
}

int eng_slice_parse(const char *text, eng_slice_t *s, size_t *a, size_t *b)
{
    eng_slice_t t;
    uint64_t parts = 0, ra = 0, rb = 0;
    const char *p = text;
    memset(&t, 0, sizeof t);
    int rc = lit(&p, "shape=");
    if (rc == 0)
        rc = list(&p, &t.ndim, t.shape);
    if (rc == 0)
        rc = lit(&p, " lo=");
    if (rc == 0)
        rc = list(&p, &t.ndim, t.lo);
    if (rc == 0)
        rc = lit(&p, " hi=");
    if (rc == 0)
        rc = list(&p, &t.ndim, t.hi);
    if (rc == 0)
        rc = lit(&p, " parts=");
    if (rc == 0)
        rc = num(&p, UINT32_MAX, &parts);
    if (rc == 0)
        rc = lit(&p, " range=[");
    if (rc == 0)
        rc = num(&p, SIZE_MAX, &ra);
    if (rc == 0)
        rc = lit(&p, ",");
    if (rc == 0)
        rc = num(&p, SIZE_MAX, &rb);
    if (rc == 0)
        rc = lit(&p, ")");
    if (rc < 0 || *p != '\0')
        return -EINVAL;
    t.parts = (uint32_t)parts;
    if (eng_slice_check(&t) < 0 || ra > rb || rb > eng_slice_numel(&t))
        return -EINVAL;
    *s = t;
    *a = (size_t)ra;
    *b = (size_t)rb;
    return 0;
}
