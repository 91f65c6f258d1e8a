/* safetensors reader (validating, mmap'd) and atomic streaming writer (safetensors.h). */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/json.h"
#include "kernels/bf16.h"
#include "common/log.h"
#include "common/util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* The reference implementation refuses headers over 100 MB; so do we. */
#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    size_t size;
} dtypes[CH_ST_NDTYPES] = {
    [CH_ST_BOOL] = {"BOOL", 1}, [CH_ST_U8] = {"U8", 1},   [CH_ST_I8] = {"I8", 1},
    [CH_ST_I16] = {"I16", 2},   [CH_ST_U16] = {"U16", 2}, [CH_ST_F16] = {"F16", 2},
    [CH_ST_BF16] = {"BF16", 2}, [CH_ST_I32] = {"I32", 4}, [CH_ST_U32] = {"U32", 4},
    [CH_ST_F32] = {"F32", 4},   [CH_ST_I64] = {"I64", 8}, [CH_ST_U64] = {"U64", 8},
    [CH_ST_F64] = {"F64", 8},
};

const char *ch_st_dtype_name(ch_st_dtype_t d)
{
    return (unsigned)d < CH_ST_NDTYPES ? dtypes[d].name : "?";
}

size_t ch_st_dtype_size(ch_st_dtype_t d)
{
    return (unsigned)d < CH_ST_NDTYPES ? dtypes[d].size : 0;
}

static int dtype_parse(const char *s, ch_st_dtype_t *out)
{
    for (int i = 0; i < CH_ST_NDTYPES; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (ch_st_dtype_t)i;
            return 0;
        }
    }
    return CH_E_FORMAT;
}

// ----------------------------------------------------------------------------
// checksum

#define H1 0x9E3779B185EBCA87ull
#define H2 0xC2B2AE3D27D4EB4Full
#define H3 0x165667B19E3779F9ull
#define H4 0x85EBCA77C2B2AE63ull

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t lane_round(uint64_t acc, uint64_t in)
{
    return rotl64(acc + in * H2, 31) * H1;
}

void ch_hash64_init(ch_hash64_t *h)
{
    memset(h, 0, sizeof *h);
    h->lane[0] = H1 + H2;
    h->lane[1] = H2;
    h->lane[2] = 0;
    h->lane[3] = (uint64_t)0 - H1;
}

static void stripe(ch_hash64_t *h, const unsigned char *p)
{
    for (int i = 0; i < 4; i++)
        h->lane[i] = lane_round(h->lane[i], load64(p + 8 * i));
}

void ch_hash64_update(ch_hash64_t *h, const void *data, size_t len)
{
    const unsigned char *p = data;
    h->total += len;
    if (h->nstash) {
        size_t take = 32 - h->nstash < len ? 32 - h->nstash : len;
        memcpy(h->stash + h->nstash, p, take);
        h->nstash += take;
        p += take;
        len -= take;
        if (h->nstash < 32)
            return;
        stripe(h, h->stash);
        h->nstash = 0;
    }
    for (; len >= 32; p += 32, len -= 32)
        stripe(h, p);
    memcpy(h->stash, p, len);
    h->nstash = len;
}

uint64_t ch_hash64_final(const ch_hash64_t *h)
{
    uint64_t x = rotl64(h->lane[0], 1) + rotl64(h->lane[1], 7) + rotl64(h->lane[2], 12) +
                 rotl64(h->lane[3], 18);
    for (int i = 0; i < 4; i++)
        x = (x ^ lane_round(0, h->lane[i])) * H1 + H4;
    x += h->total;
    size_t i = 0;
    for (; i + 8 <= h->nstash; i += 8)
        x = rotl64(x ^ lane_round(0, load64(h->stash + i)), 27) * H1 + H4;
    for (; i < h->nstash; i++)
        x = rotl64(x ^ (h->stash[i] * 0x27D4EB2F165667C5ull), 11) * H1;
    x ^= x >> 33;
    x *= H2;
    x ^= x >> 29;
    x *= H3;
    x ^= x >> 32;
    return x;
}

int ch_hash64_file(const char *path, uint64_t *out, uint64_t *bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    size_t cap = 1u << 20;
    unsigned char *buf = malloc(cap);
    ch_hash64_t h;
    ch_hash64_init(&h);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    for (;;) {
        size_t got = 0;
        rc = ch_read_full(fd, buf, cap, &got);
        if (rc < 0)
            goto out;
        ch_hash64_update(&h, buf, got);
        if (got < cap)
            break; /* end of file */
    }
    *out = ch_hash64_final(&h);
    if (bytes)
        *bytes = h.total;
out:
    free(buf);
    close(fd);
    return rc;
}

// ----------------------------------------------------------------------------
// reader

struct ch_st_file {
    char *path;
    void *map;
    size_t size;
    ch_json_t *header;
    ch_st_tensor_t *tensors; /* sorted by begin */
    size_t ntensors;
    const ch_json_t *meta; /* "__metadata__" object or NULL */
};

static int cmp_begin(const void *a, const void *b)
{
    const ch_st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Fill t from the header entry e (an object member named t->name). */
static int parse_entry(const char *path, const ch_json_t *e, ch_st_tensor_t *t, char *err,
                       size_t errlen)
{
    const char *name = e->key;
    if (e->type != CH_JSON_OBJECT)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\": entry is not an object", path,
                       name);
    for (size_t i = 0; i < e->nkids; i++) {
        const char *k = e->kids[i]->key;
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\": unknown field \"%s\"",
                           path, name, k);
    }
    const char *dt = ch_json_get_str(e, "dtype");
    const ch_json_t *shape = ch_json_get(e, "shape");
    const ch_json_t *offs = ch_json_get(e, "data_offsets");
    if (!dt || dtype_parse(dt, &t->dtype) < 0)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\": missing or unknown dtype",
                       path, name);
    if (!shape || shape->type != CH_JSON_ARRAY || shape->nkids > CH_ST_MAX_DIMS)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: tensor \"%s\": shape must be an array of at most %d integers", path,
                       name, CH_ST_MAX_DIMS);
    if (!offs || offs->type != CH_JSON_ARRAY || offs->nkids != 2 ||
        ch_json_u64(offs->kids[0], &t->begin) < 0 || ch_json_u64(offs->kids[1], &t->end) < 0 ||
        t->begin > t->end)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: tensor \"%s\": data_offsets must be [begin, end] with begin <= end",
                       path, name);
    t->name = name;
    t->ndim = (uint32_t)shape->nkids;
    uint64_t numel = 1;
    int overflow = 0;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (ch_json_u64(shape->kids[d], &t->shape[d]) < 0)
            return ch_errf(err, errlen, CH_E_FORMAT,
                           "%s: tensor \"%s\": shape entry %u is not a non-negative integer", path,
                           name, d);
        if (t->shape[d] && numel > UINT64_MAX / t->shape[d])
            overflow = 1;
        numel *= t->shape[d];
    }
    uint64_t esz = ch_st_dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / esz)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\": shape overflows", path, name);
    t->numel = numel;
    if (numel * esz != t->end - t->begin)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: tensor \"%s\": %s shape holds %llu bytes but data_offsets span %llu",
                       path, name, dt, (unsigned long long)(numel * esz),
                       (unsigned long long)(t->end - t->begin));
    return 0;
}

static int parse_header(ch_st_file_t *f, const char *hdr, size_t hlen, char *err, size_t errlen)
{
    char jerr[160];
    ch_json_limits_t lim = ch_json_default_limits();
    lim.max_bytes = ST_MAX_HEADER;
    int rc = ch_json_parse(hdr, hlen, &lim, &f->header, jerr, sizeof jerr);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: header is not valid JSON: %s", f->path, jerr);
    const ch_json_t *root = f->header;
    if (root->type != CH_JSON_OBJECT)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: header is not a JSON object", f->path);
    f->tensors = calloc(root->nkids ? root->nkids : 1, sizeof *f->tensors);
    if (!f->tensors)
        return -ENOMEM;
    for (size_t i = 0; i < root->nkids; i++) {
        const ch_json_t *e = root->kids[i];
        if (strcmp(e->key, "__metadata__") == 0) {
            if (e->type != CH_JSON_OBJECT)
                return ch_errf(err, errlen, CH_E_FORMAT, "%s: __metadata__ is not an object",
                               f->path);
            for (size_t k = 0; k < e->nkids; k++)
                if (e->kids[k]->type != CH_JSON_STRING)
                    return ch_errf(err, errlen, CH_E_FORMAT,
                                   "%s: __metadata__ value \"%s\" is not a string", f->path,
                                   e->kids[k]->key);
            f->meta = e;
            continue;
        }
        rc = parse_entry(f->path, e, &f->tensors[f->ntensors], err, errlen);
        if (rc < 0)
            return rc;
        f->ntensors++;
    }
    return 0;
}

static int check_offsets(ch_st_file_t *f, uint64_t data_size, char *err, size_t errlen)
{
    qsort(f->tensors, f->ntensors, sizeof *f->tensors, cmp_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < f->ntensors; i++) {
        const ch_st_tensor_t *t = &f->tensors[i];
        if (t->end > data_size)
            return ch_errf(err, errlen, CH_E_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the end of the "
                           "data (%llu bytes)",
                           f->path, t->name, (unsigned long long)t->begin,
                           (unsigned long long)t->end, (unsigned long long)data_size);
        if (t->begin < pos)
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"",
                           f->path, t->name, f->tensors[i - 1].name);
        if (t->begin > pos)
            return ch_errf(err, errlen, CH_E_FORMAT,
                           "%s: gap in the data before tensor \"%s\" (offset %llu, expected %llu)",
                           f->path, t->name, (unsigned long long)t->begin, (unsigned long long)pos);
        pos = t->end;
    }
    if (pos != data_size)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: tensors cover %llu bytes but the data section holds %llu", f->path,
                       (unsigned long long)pos, (unsigned long long)data_size);
    return 0;
}

int ch_st_open(const char *path, ch_st_file_t **out, char *err, size_t errlen)
{
    int rc = 0;
    ch_st_file_t *f = NULL;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        rc = -ENOMEM;
        goto out;
    }
    CH_CHECK_GOTO(ch_file_map(path, &f->map, &f->size, err, errlen), rc, out);
    if (f->size < 8) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: %zu bytes is too short for a safetensors file",
                     path, f->size);
        goto out;
    }
    const unsigned char *base = f->map;
    uint64_t hlen = load64(base);
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8) {
        rc = ch_errf(err, errlen, CH_E_FORMAT,
                     "%s: the header length does not fit in the file (%zu bytes, limit %u)", path,
                     f->size, ST_MAX_HEADER);
        goto out;
    }
    if (hlen < 2 || base[8] != '{') {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: header does not start with '{'", path);
        goto out;
    }
    CH_CHECK_GOTO(parse_header(f, (const char *)base + 8, (size_t)hlen, err, errlen), rc, out);
    uint64_t data_size = f->size - 8 - hlen;
    CH_CHECK_GOTO(check_offsets(f, data_size, err, errlen), rc, out);
    for (size_t i = 0; i < f->ntensors; i++)
        f->tensors[i].data = base + 8 + hlen + f->tensors[i].begin;
    *out = f;
    f = NULL;
out:
    ch_st_close(f);
    return rc;
}

void ch_st_close(ch_st_file_t *f)
{
    if (!f)
        return;
    ch_file_unmap(f->map, f->size);
    ch_json_free(f->header);
    free(f->tensors);
    free(f->path);
    free(f);
}

const char *ch_st_path(const ch_st_file_t *f)
{
    return f->path;
}

size_t ch_st_count(const ch_st_file_t *f)
{
    return f->ntensors;
}

const ch_st_tensor_t *ch_st_at(const ch_st_file_t *f, size_t i)
{
    return i < f->ntensors ? &f->tensors[i] : NULL;
}

const ch_st_tensor_t *ch_st_find(const ch_st_file_t *f, const char *name)
{
    for (size_t i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *ch_st_meta(const ch_st_file_t *f, const char *key)
{
    return f->meta ? ch_json_get_str(f->meta, key) : NULL;
}

size_t ch_st_meta_count(const ch_st_file_t *f)
{
    return f->meta ? f->meta->nkids : 0;
}

void ch_st_meta_at(const ch_st_file_t *f, size_t i, const char **key, const char **value)
{
    *key = f->meta->kids[i]->key;
    *value = f->meta->kids[i]->str;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int ch_st_read_f32(const ch_st_file_t *f, const ch_st_tensor_t *t, float *dst, char *err,
                   size_t errlen)
{
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case CH_ST_F32:
        memcpy(dst, p, t->numel * 4);
        return 0;
    case CH_ST_F64:
        for (uint64_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    case CH_ST_BF16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    case CH_ST_F16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    default:
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\": dtype %s is not a float type",
                       f->path, t->name, ch_st_dtype_name(t->dtype));
    }
}

/* Round to nearest even, as torch's .half() does; overflow to infinity, NaN kept. */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xFF, man = x & 0x7FFFFFu;
    if (exp == 0xFF)
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1F)
        return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) { /* subnormal or zero: shift the implicit bit in */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
        uint32_t r = man >> shift, rest = man & ((1u << shift) - 1);
        if (rest > half || (rest == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1)))
        r++; /* may carry into the exponent, up to infinity: correct */
    return (uint16_t)(sign | r);
}

int ch_st_convert_f32(ch_st_dtype_t dtype, const float *src, void *dst, size_t n)
{
    unsigned char *out = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (dtype) {
        case CH_ST_F32:
            memcpy(out + 4 * i, &src[i], 4);
            continue;
        case CH_ST_F16:
            h = f32_to_f16(src[i]);
            break;
        case CH_ST_BF16:
            h = kn_bf16_from_f32(src[i]); /* kernels/bf16.h: header-only */
            break;
        default:
            return -EINVAL;
        }
        memcpy(out + 2 * i, &h, 2);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// writer

typedef struct wentry {
    char *name;
    ch_st_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[CH_ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
} wentry_t;

struct ch_st_writer {
    char *path;
    wentry_t *e;
    size_t n, cap;
    char **meta; /* key, value pairs */
    size_t nmeta;
};

int ch_st_writer_create(const char *path, ch_st_writer_t **out)
{
    ch_st_writer_t *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return -ENOMEM;
    }
    *out = w;
    return 0;
}

void ch_st_writer_destroy(ch_st_writer_t *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    for (size_t i = 0; i < 2 * w->nmeta; i++)
        free(w->meta[i]);
    free(w->meta);
    free(w->e);
    free(w->path);
    free(w);
}

int ch_st_writer_add(ch_st_writer_t *w, const char *name, ch_st_dtype_t dtype, uint32_t ndim,
                     const uint64_t *shape, const void *data)
{
    if ((unsigned)dtype >= CH_ST_NDTYPES || ndim > CH_ST_MAX_DIMS || !*name ||
        strcmp(name, "__metadata__") == 0)
        return -EINVAL;
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return -EEXIST;
    uint64_t nbytes = ch_st_dtype_size(dtype);
    for (uint32_t d = 0; d < ndim; d++) {
        if (shape[d] && nbytes > UINT64_MAX / shape[d])
            return -EOVERFLOW;
        nbytes *= shape[d];
    }
    if (w->n == w->cap) {
        size_t ncap = w->cap ? 2 * w->cap : 64;
        wentry_t *e = realloc(w->e, ncap * sizeof *e);
        if (!e)
            return -ENOMEM;
        w->e = e;
        w->cap = ncap;
    }
    wentry_t *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name)))
        return -ENOMEM;
    e->dtype = dtype;
    e->ndim = ndim;
    memcpy(e->shape, shape, ndim * sizeof *shape);
    e->nbytes = nbytes;
    e->data = data;
    w->n++;
    return 0;
}

int ch_st_writer_meta(ch_st_writer_t *w, const char *key, const char *value)
{
    for (size_t i = 0; i < w->nmeta; i++) {
        if (strcmp(w->meta[2 * i], key) == 0) {
            char *v = strdup(value);
            if (!v)
                return -ENOMEM;
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return 0;
        }
    }
    char **m = realloc(w->meta, (2 * w->nmeta + 2) * sizeof *m);
    if (!m)
        return -ENOMEM;
    w->meta = m;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return -ENOMEM;
    }
    m[2 * w->nmeta] = k;
    m[2 * w->nmeta + 1] = v;
    w->nmeta++;
    return 0;
}

/* The header, padded with spaces so that 8 + its length is a multiple of 8. */
static int build_header(const ch_st_writer_t *w, char **out, size_t *len)
{
    ch_buf_t j;
    ch_buf_init(&j);
    ch_buf_puts(&j, "{");
    int first = 1;
    if (w->nmeta) {
        ch_buf_puts(&j, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i)
                ch_buf_puts(&j, ",");
            ch_jw_str(&j, w->meta[2 * i]);
            ch_buf_puts(&j, ":");
            ch_jw_str(&j, w->meta[2 * i + 1]);
        }
        ch_buf_puts(&j, "}");
        first = 0;
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < w->n; i++) {
        const wentry_t *e = &w->e[i];
        if (!first)
            ch_buf_puts(&j, ",");
        first = 0;
        ch_jw_str(&j, e->name);
        ch_buf_printf(&j, ":{\"dtype\":\"%s\",\"shape\":[", ch_st_dtype_name(e->dtype));
        for (uint32_t d = 0; d < e->ndim; d++)
            ch_buf_printf(&j, "%s%llu", d ? "," : "", (unsigned long long)e->shape[d]);
        ch_buf_printf(&j, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)pos,
                      (unsigned long long)(pos + e->nbytes));
        pos += e->nbytes;
    }
    ch_buf_puts(&j, "}");
    while (j.err == 0 && j.len % 8 != 0)
        ch_buf_puts(&j, " ");
    return ch_buf_finish(&j, out, len);
}

static int write_all(int fd, const void *data, size_t len, ch_hash64_t *h)
{
    ch_hash64_update(h, data, len);
    return ch_write_full(fd, data, len);
}

int ch_st_writer_finish(ch_st_writer_t *w, uint64_t *bytes, uint64_t *checksum, char *err,
                        size_t errlen)
{
    int rc = 0, fd = -1;
    char *hdr = NULL, *tmp = NULL;
    size_t hlen = 0;
    ch_hash64_t h;

    ch_hash64_init(&h);
    CH_CHECK_GOTO(build_header(w, &hdr, &hlen), rc, out);
    CH_CHECK_GOTO(ch_file_tmp_open(w->path, 0644, &fd, &tmp), rc, out);
    unsigned char len8[8];
    uint64_t hl = hlen;
    memcpy(len8, &hl, 8);
    CH_CHECK_GOTO(write_all(fd, len8, 8, &h), rc, out);
    CH_CHECK_GOTO(write_all(fd, hdr, hlen, &h), rc, out);
    for (size_t i = 0; i < w->n; i++)
        CH_CHECK_GOTO(write_all(fd, w->e[i].data, w->e[i].nbytes, &h), rc, out);
    rc = ch_file_tmp_commit(fd, tmp, w->path);
    fd = -1, tmp = NULL; /* closed and freed either way */
    if (rc < 0)
        goto out;
    if (bytes)
        *bytes = h.total;
    if (checksum)
        *checksum = ch_hash64_final(&h);
out:
    if (rc < 0)
        ch_errf(err, errlen, rc, "%s: write failed: %s", w->path, ch_strerror(rc));
    if (fd >= 0)
        ch_file_tmp_abort(fd, tmp);
    free(hdr);
    ch_st_writer_destroy(w);
    return rc;
}
