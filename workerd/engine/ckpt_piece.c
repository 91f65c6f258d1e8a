/* Checkpoint pieces (ckpt_piece.h): a rank's shard file as pieces, and the reader that joins the
 * pieces of any layout (ckpt_file.h). No model: chorusctl links this side.
 *
 * Theory of operation. A shard file holds, per piece, the parameters under the Hugging
 * Face name and the Adam state as "optim.m.<name>" / "optim.v.<name>". A piece that is
 * the whole tensor is stored in its Hugging Face shape (wte unpadded), as files written
 * before sliced layouts existed are; any other piece is stored as three 1-D tensors of
 * b - a elements, with metadata "slice.<name>" = eng_slice_format(slice, a, b).
 *
 * The reader indexes every stored piece of every shard of the step by name (sorted, the
 * preferred rank's first). A requested piece equal to a stored one (geometry and range)
 * is copied from it; otherwise all distinct stored pieces of the tensor are written into
 * the full tensor with a coverage bitmap, and the requested pieces are read back out of
 * it. Each shard is checked against the manifest's checksum before its data is first
 * used; when a tensor turns out not covered, every shard is checked first, so a corrupt
 * file is reported as such rather than as a hole. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "workerd/engine/ckpt_piece.h"

enum { KP, KM, KV, NKINDS }; /* parameters, Adam m, Adam v */
static const char *const kind_prefix[NKINDS] = {"", "optim.m.", "optim.v."};

/* A piece is stored whole (in the Hugging Face shape, no slice metadata) when it holds
 * every element of the tensor: all columns of every part, all rows (padding may follow),
 * the whole range. Its first full_numel elements are then the tensor in order. */
static int piece_is_whole(const eng_slice_t *s, size_t a, size_t b)
{
    int last = s->ndim == 2 ? 1 : 0;
    int rows = s->ndim == 1 || (s->lo[0] == 0 && s->hi[0] >= s->shape[0]);
    return rows && s->lo[last] == 0 && (size_t)s->hi[last] * s->parts == s->shape[last] && a == 0 &&
           b == eng_slice_numel(s);
}

static int slice_equal(const eng_slice_t *x, size_t xa, size_t xb, const eng_slice_t *y, size_t ya,
                       size_t yb)
{
    return x->ndim == y->ndim && x->shape[0] == y->shape[0] && x->shape[1] == y->shape[1] &&
           x->lo[0] == y->lo[0] && x->lo[1] == y->lo[1] && x->hi[0] == y->hi[0] &&
           x->hi[1] == y->hi[1] && x->parts == y->parts && xa == ya && xb == yb;
}

static void shape_str(const eng_slice_t *s, char *out, size_t cap)
{
    if (s->ndim == 2)
        snprintf(out, cap, "[%" PRIu32 ", %" PRIu32 "]", s->shape[0], s->shape[1]);
    else
        snprintf(out, cap, "[%" PRIu32 "]", s->shape[0]);
}

static int check_piece(const eng_ckpt_piece_t *pc, char *err, size_t errlen)
{
    if (eng_slice_check(&pc->slice) < 0 || pc->a > pc->b || pc->b > eng_slice_numel(&pc->slice))
        return ch_errf(err, errlen, -EINVAL, "tensor %s: inconsistent slice or range", pc->name);
    return 0;
}

// ----------------------------------------------------------------------------
// save

static int add_piece(ch_st_writer_t *w, int kind, const eng_ckpt_piece_t *pc, char *slice_text,
                     size_t cap)
{
    const float *data[NKINDS] = {pc->p, pc->m, pc->v};
    char name[96];
    uint64_t shape[2];
    uint32_t ndim = 1;
    if ((size_t)snprintf(name, sizeof name, "%s%s", kind_prefix[kind], pc->name) >= sizeof name)
        return -ENAMETOOLONG;
    if (piece_is_whole(&pc->slice, pc->a, pc->b)) {
        ndim = pc->slice.ndim;
        shape[0] = pc->slice.shape[0];
        shape[1] = pc->slice.shape[1];
    } else {
        shape[0] = pc->b - pc->a;
        int rc = kind == KP ? eng_slice_format(&pc->slice, pc->a, pc->b, slice_text, cap) : 0;
        if (rc < 0)
            return rc;
    }
    return ch_st_writer_add(w, name, CH_ST_F32, ndim, shape, data[kind]);
}

int eng_ckpt_save_pieces(const char *dir, const eng_ckpt_meta_t *meta,
                         const eng_ckpt_piece_t *pieces, size_t n, uint64_t optim_t,
                         uint64_t *bytes, uint64_t *checksum, char *err, size_t errlen)
{
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN + 32], key[80], text[256];
    ch_st_writer_t *w = NULL;
    int rc = 0, whole = 1;

    for (size_t i = 0; i < n; i++) {
        if ((rc = check_piece(&pieces[i], err, errlen)) < 0)
            return rc;
        if (!pieces[i].p || !pieces[i].m || !pieces[i].v)
            return ch_errf(err, errlen, -EINVAL, "tensor %s: a saved piece needs p, m and v",
                           pieces[i].name);
    }
    CH_CHECK_GOTO(eng_ckpt_step_dir(dir, meta->job, meta->step, sdir, sizeof sdir), rc, fail);
    CH_CHECK_GOTO(ch_mkdirs(sdir, 0755), rc, fail);
    CH_CHECK_GOTO(eng_ckpt_shard_path(sdir, meta->rank, path, sizeof path), rc, fail);
    CH_CHECK_GOTO(ch_st_writer_create(path, &w), rc, fail);
    /* all parameters, then all m, then all v, as files have always been laid out */
    for (int k = 0; k < NKINDS; k++) {
        for (size_t i = 0; i < n; i++) {
            const eng_ckpt_piece_t *pc = &pieces[i];
            if (pc->a == pc->b)
                continue; /* nothing held: nothing stored */
            text[0] = '\0';
            CH_CHECK_GOTO(add_piece(w, k, pc, text, sizeof text), rc, fail);
            if (!text[0])
                continue;
            whole = 0;
            snprintf(key, sizeof key, "slice.%s", pc->name);
            CH_CHECK_GOTO(ch_st_writer_meta(w, key, text), rc, fail);
        }
    }
    CH_CHECK_GOTO(eng_ckpt_put_meta(w, meta, optim_t, whole ? "full" : "pieces"), rc, fail);
    /* finish destroys the writer and names the file in err on failure */
    return ch_st_writer_finish(w, bytes, checksum, err, errlen);
fail:
    ch_st_writer_destroy(w);
    return ch_errf(err, errlen, rc, "%s/%s/step-%08" PRIu64 ": checkpoint: %s", dir, meta->job,
                   meta->step, ch_strerror(rc));
}

// ----------------------------------------------------------------------------
// the reader

typedef struct shard {
    ch_st_file_t *f;
    eng_ckpt_file_t want; /* the manifest's entry */
    int verified;
} shard_t;

typedef struct entry {
    const char *name; /* the parameters' tensor name, in the shard's mapping */
    uint32_t shard, preferred;
    eng_slice_t slice;
    size_t a, b;
    const ch_st_tensor_t *t[NKINDS];
} entry_t;

struct eng_ckpt_reader {
    char dir[CH_PATH_LEN];
    shard_t *shards;
    size_t nshards;
    entry_t *entries; /* sorted by name, the preferred rank's first */
    size_t nentries, cap;
    eng_ckpt_meta_t meta;
    uint64_t optim_t;
};

static int cmp_entry(const void *x, const void *y)
{
    const entry_t *a = x, *b = y;
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    if (a->preferred != b->preferred)
        return a->preferred ? -1 : 1;
    return a->shard < b->shard ? -1 : a->shard > b->shard;
}

static int same_model(const ch_model_cfg_t *a, const ch_model_cfg_t *b)
{
    return a->layers == b->layers && a->heads == b->heads && a->embd == b->embd &&
           a->vocab == b->vocab && a->seq_len == b->seq_len;
}

/* The stored piece named t->name in shard s of r: its slice, its Adam state. */
static int index_tensor(eng_ckpt_reader_t *r, uint32_t s, uint32_t prefer, const ch_st_tensor_t *t,
                        char *err, size_t errlen)
{
    const ch_st_file_t *f = r->shards[s].f;
    const char *path = ch_st_path(f);
    char key[96];
    entry_t e;
    memset(&e, 0, sizeof e);
    e.name = t->name;
    e.shard = s;
    e.preferred = r->shards[s].want.rank == prefer;
    snprintf(key, sizeof key, "slice.%s", t->name);
    const char *text = ch_st_meta(f, key);
    if (text) {
        if (eng_slice_parse(text, &e.slice, &e.a, &e.b) < 0)
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor %s: bad slice \"%s\"", path,
                           t->name, text);
    } else {
        if (t->ndim < 1 || t->ndim > 2 || t->shape[0] > UINT32_MAX ||
            (t->ndim == 2 && t->shape[1] > UINT32_MAX))
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor %s: not 1-D or 2-D", path,
                           t->name);
        e.slice = eng_slice_whole(t->ndim, (uint32_t)t->shape[0],
                                  t->ndim == 2 ? (uint32_t)t->shape[1] : 0);
        e.b = eng_slice_full_numel(&e.slice);
    }
    for (int k = 0; k < NKINDS; k++) {
        snprintf(key, sizeof key, "%s%s", kind_prefix[k], t->name);
        const ch_st_tensor_t *st = ch_st_find(f, key);
        if (!st)
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor %s missing", path, key);
        if (st->dtype != CH_ST_F32 || st->numel != e.b - e.a)
            return ch_errf(err, errlen, CH_E_FORMAT,
                           "%s: tensor %s is %s with %" PRIu64 " elements, its piece F32 with %zu",
                           path, key, ch_st_dtype_name(st->dtype), st->numel, e.b - e.a);
        e.t[k] = st;
    }
    if (r->nentries == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        entry_t *ne = realloc(r->entries, cap * sizeof *ne);
        if (!ne)
            return ch_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
        r->entries = ne;
        r->cap = cap;
    }
    r->entries[r->nentries++] = e;
    return 0;
}

/* Open shard i of the manifest, check it agrees with the first, index its pieces. */
static int open_shard(eng_ckpt_reader_t *r, uint32_t i, uint32_t prefer, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 32];
    shard_t *s = &r->shards[i];
    eng_ckpt_meta_t m;
    uint64_t t = 0;
    int rc = eng_ckpt_shard_path(r->dir, s->want.rank, path, sizeof path);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: path too long", r->dir);
    if ((rc = ch_st_open(path, &s->f, err, errlen)) < 0)
        return rc;
    if ((rc = eng_ckpt_meta_of(s->f, &m, err, errlen)) < 0 ||
        (rc = eng_ckpt_meta_u64(s->f, "optim.t", &t, err, errlen)) < 0)
        return rc;
    if (i == 0) {
        r->meta = m;
        r->optim_t = t;
    } else if (m.step != r->meta.step || t != r->optim_t || !same_model(&m.cfg, &r->meta.cfg) ||
               strcmp(m.job, r->meta.job) != 0) {
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: job, step, model or optim.t differs from rank %" PRIu32 "'s shard",
                       path, r->shards[0].want.rank);
    }
    if (m.rank != s->want.rank)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: holds rank %" PRIu32, path, m.rank);
    for (size_t k = 0; k < ch_st_count(s->f); k++) {
        const ch_st_tensor_t *st = ch_st_at(s->f, k);
        if (strncmp(st->name, "optim.", 6) != 0 &&
            (rc = index_tensor(r, i, prefer, st, err, errlen)) < 0)
            return rc;
    }
    return 0;
}

int eng_ckpt_reader_open(const char *step_dir, uint32_t prefer, eng_ckpt_reader_t **out, char *err,
                         size_t errlen)
{
    eng_ckpt_file_t *files = NULL;
    size_t n = 0;
    *out = NULL;
    eng_ckpt_reader_t *r = calloc(1, sizeof *r);
    if (!r)
        return ch_errf(err, errlen, -ENOMEM, "%s: out of memory", step_dir);
    int rc = 0;
    if ((size_t)snprintf(r->dir, sizeof r->dir, "%s", step_dir) >= sizeof r->dir) {
        rc = ch_errf(err, errlen, -ENAMETOOLONG, "%s: path too long", step_dir);
        goto out;
    }
    CH_CHECK_GOTO(eng_ckpt_read_manifest(step_dir, &files, &n, err, errlen), rc, out);
    r->shards = calloc(n, sizeof *r->shards);
    if (!r->shards) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", step_dir);
        goto out;
    }
    r->nshards = n;
    for (size_t i = 0; i < n; i++)
        r->shards[i].want = files[i];
    for (uint32_t i = 0; i < n; i++)
        CH_CHECK_GOTO(open_shard(r, i, prefer, err, errlen), rc, out);
    qsort(r->entries, r->nentries, sizeof *r->entries, cmp_entry);
    *out = r;
    r = NULL;
out:
    free(files);
    eng_ckpt_reader_close(r);
    return rc;
}

void eng_ckpt_reader_close(eng_ckpt_reader_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nshards; i++)
        ch_st_close(r->shards[i].f);
    free(r->shards);
    free(r->entries);
    free(r);
}

const eng_ckpt_meta_t *eng_ckpt_reader_meta(const eng_ckpt_reader_t *r)
{
    return &r->meta;
}

uint64_t eng_ckpt_reader_optim_t(const eng_ckpt_reader_t *r)
{
    return r->optim_t;
}

static int verify(eng_ckpt_reader_t *r, uint32_t s, char *err, size_t errlen)
{
    shard_t *sh = &r->shards[s];
    if (sh->verified)
        return 0;
    int rc = eng_ckpt_check_file(ch_st_path(sh->f), &sh->want, err, errlen);
    sh->verified = rc == 0;
    return rc;
}

/* The entries named name: [*lo, *hi). */
static void find_entries(const eng_ckpt_reader_t *r, const char *name, size_t *lo, size_t *hi)
{
    size_t a = 0, b = r->nentries;
    while (a < b) { /* first entry >= name */
        size_t mid = a + (b - a) / 2;
        if (strcmp(r->entries[mid].name, name) < 0)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = a;
    while (a < r->nentries && strcmp(r->entries[a].name, name) == 0)
        a++;
    *hi = a;
}

/* Stored data as floats: the mapping when aligned, else a copy into *tmp. */
static const float *floats_of(const ch_st_tensor_t *t, float **tmp)
{
    if ((uintptr_t)t->data % _Alignof(float) == 0)
        return t->data;
    free(*tmp);
    *tmp = malloc(t->numel * sizeof(float) + 1);
    if (*tmp)
        memcpy(*tmp, t->data, t->numel * sizeof(float));
    return *tmp;
}

/* The stored piece with exactly pc's geometry and range (the preferred rank's first), or
 * NULL. */
static const entry_t *exact(const eng_ckpt_reader_t *r, size_t lo, size_t hi,
                            const eng_ckpt_piece_t *pc)
{
    for (size_t i = lo; i < hi; i++)
        if (slice_equal(&r->entries[i].slice, r->entries[i].a, r->entries[i].b, &pc->slice, pc->a,
                        pc->b))
            return &r->entries[i];
    return NULL;
}

static int copy_exact(eng_ckpt_reader_t *r, const entry_t *e, eng_ckpt_piece_t *pc, char *err,
                      size_t errlen)
{
    float *dst[NKINDS] = {pc->p, pc->m, pc->v};
    int rc = verify(r, e->shard, err, errlen);
    for (int k = 0; rc == 0 && k < NKINDS; k++)
        if (dst[k])
            memcpy(dst[k], e->t[k]->data, (e->b - e->a) * sizeof(float));
    return rc;
}

/* Join the stored pieces [lo, hi) into full tensors buf[k] (those not NULL), marking the
 * parameters' elements in covered. Pieces equal to an earlier one (replicas) are skipped. */
static int join(eng_ckpt_reader_t *r, size_t lo, size_t hi, float *buf[NKINDS], uint8_t *covered,
                char *err, size_t errlen)
{
    float *tmp = NULL;
    int rc = 0;
    for (size_t i = lo; rc == 0 && i < hi; i++) {
        const entry_t *e = &r->entries[i];
        int dup = 0;
        for (size_t j = lo; j < i && !dup; j++)
            dup = slice_equal(&r->entries[j].slice, r->entries[j].a, r->entries[j].b, &e->slice,
                              e->a, e->b);
        if (dup || (rc = verify(r, e->shard, err, errlen)) < 0)
            continue;
        for (int k = 0; rc == 0 && k < NKINDS; k++) {
            if (!buf[k])
                continue;
            const float *src = floats_of(e->t[k], &tmp);
            if (!src)
                rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", r->dir);
            else
                eng_slice_write(&e->slice, e->a, e->b, src, buf[k], k == KP ? covered : NULL);
        }
    }
    free(tmp);
    return rc;
}

/* Elements of pc's range that are not covered, with buf the joined parameters (pc->p holds
 * its elements of buf already). Writing them back changes nothing in buf and marks in
 * want exactly the elements pc needs. */
static size_t uncovered(const eng_ckpt_piece_t *pc, float *buf, const uint8_t *covered,
                        uint8_t *want, size_t bytes)
{
    size_t missing = 0;
    memset(want, 0, bytes);
    eng_slice_write(&pc->slice, pc->a, pc->b, pc->p, buf, want);
    for (size_t i = 0; i < bytes; i++)
        missing += (size_t)__builtin_popcount((unsigned)(want[i] & (uint8_t)~covered[i]));
    return missing;
}

/* The pieces group[0 .. ng) of one tensor. */
static int fill_tensor(eng_ckpt_reader_t *r, eng_ckpt_piece_t **group, size_t ng, char *err,
                       size_t errlen)
{
    const eng_ckpt_piece_t *p0 = group[0];
    char have[48], need[48];
    float *buf[NKINDS] = {NULL, NULL, NULL};
    uint8_t *covered = NULL, *want = NULL;
    size_t lo, hi, all_exact = 1;
    int rc = 0;

    find_entries(r, p0->name, &lo, &hi);
    if (lo == hi)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor %s: not in any shard", r->dir,
                       p0->name);
    shape_str(&p0->slice, need, sizeof need);
    for (size_t i = 0; i < ng; i++)
        if (group[i]->slice.ndim != p0->slice.ndim ||
            group[i]->slice.shape[0] != p0->slice.shape[0] ||
            group[i]->slice.shape[1] != p0->slice.shape[1])
            return ch_errf(err, errlen, -EINVAL, "tensor %s: pieces disagree on its shape",
                           p0->name);
    for (size_t i = lo; i < hi; i++) {
        const eng_slice_t *s = &r->entries[i].slice;
        if (s->ndim != p0->slice.ndim || s->shape[0] != p0->slice.shape[0] ||
            s->shape[1] != p0->slice.shape[1]) {
            shape_str(s, have, sizeof have);
            return ch_errf(err, errlen, CH_E_FORMAT,
                           "%s: tensor %s has shape %s, the model's is %s",
                           ch_st_path(r->shards[r->entries[i].shard].f), p0->name, have, need);
        }
    }
    for (size_t i = 0; i < ng; i++)
        all_exact &= exact(r, lo, hi, group[i]) != NULL;
    if (all_exact) {
        for (size_t i = 0; rc == 0 && i < ng; i++)
            rc = copy_exact(r, exact(r, lo, hi, group[i]), group[i], err, errlen);
        return rc;
    }

    /* join, then cut */
    size_t full = eng_slice_full_numel(&p0->slice), bytes = (full + 7) / 8;
    int needs[NKINDS] = {1, 0, 0};
    for (size_t i = 0; i < ng; i++) {
        needs[KM] |= group[i]->m != NULL;
        needs[KV] |= group[i]->v != NULL;
    }
    covered = calloc(bytes ? bytes : 1, 1);
    want = calloc(bytes ? bytes : 1, 1);
    int nomem = !covered || !want;
    for (int k = 0; k < NKINDS; k++)
        if (needs[k] && !(buf[k] = calloc(full ? full : 1, sizeof(float))))
            nomem = 1;
    if (nomem) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: tensor %s: out of memory", r->dir, p0->name);
        goto out;
    }
    CH_CHECK_GOTO(join(r, lo, hi, buf, covered, err, errlen), rc, out);
    for (size_t i = 0; i < ng; i++) {
        eng_ckpt_piece_t *pc = group[i];
        eng_slice_read(&pc->slice, pc->a, pc->b, buf[KP], pc->p);
        size_t missing = uncovered(pc, buf[KP], covered, want, bytes);
        if (missing) {
            /* a corrupt shard explains a hole better than the hole does */
            for (uint32_t s = 0; rc == 0 && s < r->nshards; s++)
                rc = verify(r, s, err, errlen);
            if (rc == 0)
                rc = ch_errf(err, errlen, CH_E_FORMAT,
                             "%s: tensor %s: %zu elements not covered by any shard", r->dir,
                             pc->name, missing);
            goto out;
        }
        if (pc->m)
            eng_slice_read(&pc->slice, pc->a, pc->b, buf[KM], pc->m);
        if (pc->v)
            eng_slice_read(&pc->slice, pc->a, pc->b, buf[KV], pc->v);
    }
out:
    for (int k = 0; k < NKINDS; k++)
        free(buf[k]);
    free(want);
    free(covered);
    return rc;
}

int eng_ckpt_reader_fill(eng_ckpt_reader_t *r, eng_ckpt_piece_t *pieces, size_t n, char *err,
                         size_t errlen)
{
    uint8_t *done = calloc(n ? n : 1, 1);
    eng_ckpt_piece_t **group = malloc((n ? n : 1) * sizeof *group);
    int rc = 0;
    if (!done || !group) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", r->dir);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        CH_CHECK_GOTO(check_piece(&pieces[i], err, errlen), rc, out);
        done[i] = pieces[i].a == pieces[i].b; /* nothing to fill */
    }
    for (size_t i = 0; i < n; i++) {
        size_t ng = 0;
        for (size_t k = i; !done[i] && k < n; k++)
            if (!done[k] && (k == i || strcmp(pieces[k].name, pieces[i].name) == 0))
                group[ng++] = &pieces[k];
        for (size_t k = 0; k < ng; k++)
            done[group[k] - pieces] = 1;
        if (ng)
            CH_CHECK_GOTO(fill_tensor(r, group, ng, err, errlen), rc, out);
    }
out:
    free(group);
    free(done);
    return rc;
}

// ----------------------------------------------------------------------------
// restore and init_from

int eng_ckpt_restore_pieces(const char *step_dir, const eng_ckpt_meta_t *expect,
                            eng_ckpt_piece_t *pieces, size_t n, uint64_t *optim_t, uint64_t *step,
                            char *err, size_t errlen)
{
    eng_ckpt_reader_t *r = NULL;
    int rc = eng_ckpt_reader_open(step_dir, expect->rank, &r, err, errlen);
    if (rc < 0)
        return rc;
    const ch_model_cfg_t *a = &eng_ckpt_reader_meta(r)->cfg, *b = &expect->cfg;
    if (!same_model(a, b)) {
        rc = ch_errf(err, errlen, CH_E_CONFIG,
                     "%s: checkpoint model (layers %u heads %u embd %u vocab %u seq_len %u) "
                     "differs from the job's (layers %u heads %u embd %u vocab %u seq_len %u)",
                     step_dir, a->layers, a->heads, a->embd, a->vocab, a->seq_len, b->layers,
                     b->heads, b->embd, b->vocab, b->seq_len);
        goto out;
    }
    CH_CHECK_GOTO(eng_ckpt_reader_fill(r, pieces, n, err, errlen), rc, out);
    *optim_t = eng_ckpt_reader_optim_t(r);
    *step = eng_ckpt_reader_meta(r)->step;
out:
    eng_ckpt_reader_close(r);
    return rc;
}

static const ch_st_tensor_t *find_hf(const ch_st_file_t *f, const char *name)
{
    char prefixed[96];
    const ch_st_tensor_t *st = ch_st_find(f, name);
    if (st)
        return st;
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return ch_st_find(f, prefixed);
}

int eng_ckpt_load_hf(const char *path, eng_ckpt_piece_t *pieces, size_t n, char *err, size_t errlen)
{
    ch_st_file_t *f = NULL;
    const ch_st_tensor_t *cached = NULL; /* the tensor full holds */
    float *full = NULL;
    char have[48], need[48];
    int rc = ch_st_open(path, &f, err, errlen);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        eng_ckpt_piece_t *pc = &pieces[i];
        const eng_slice_t *s = &pc->slice;
        CH_CHECK_GOTO(check_piece(pc, err, errlen), rc, out);
        const ch_st_tensor_t *st = find_hf(f, pc->name);
        if (!st) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" missing", path, pc->name);
            goto out;
        }
        /* wpe with more positions than seq_len is cropped to its first rows, as nanoGPT
         * does with Hugging Face's 1,024-position GPT-2 */
        int crop = s->ndim == 2 && st->ndim == 2 && strcmp(pc->name, "wpe.weight") == 0 &&
                   st->shape[0] > s->shape[0] && st->shape[1] == s->shape[1];
        if (!crop && (st->ndim != s->ndim || st->shape[0] != s->shape[0] ||
                      (s->ndim == 2 && st->shape[1] != s->shape[1]))) {
            eng_slice_t got = {.ndim = st->ndim};
            got.shape[0] = st->ndim ? (uint32_t)st->shape[0] : 0;
            got.shape[1] = st->ndim > 1 ? (uint32_t)st->shape[1] : 0;
            shape_str(&got, have, sizeof have);
            if (st->ndim < 1 || st->ndim > 2)
                snprintf(have, sizeof have, "%u-D", st->ndim);
            shape_str(s, need, sizeof need);
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: tensor \"%s\" has shape %s but the job's model needs %s (check "
                         "[model] against the file)",
                         path, st->name, have, need);
            goto out;
        }
        if (pc->a == pc->b)
            continue;
        if (!crop && piece_is_whole(s, pc->a, pc->b)) { /* straight in; padding rows zero */
            CH_CHECK_GOTO(ch_st_read_f32(f, st, pc->p, err, errlen), rc, out);
            memset(pc->p + st->numel, 0, (pc->b - st->numel) * sizeof(float));
            continue;
        }
        if (st != cached) {
            free(full);
            cached = NULL;
            if (!(full = malloc((st->numel ? st->numel : 1) * sizeof *full))) {
                rc = ch_errf(err, errlen, -ENOMEM, "%s: tensor %s: out of memory", path, st->name);
                goto out;
            }
            CH_CHECK_GOTO(ch_st_read_f32(f, st, full, err, errlen), rc, out);
            cached = st;
        }
        eng_slice_read(s, pc->a, pc->b, full, pc->p);
    }
out:
    free(full);
    ch_st_close(f);
    return rc;
}
