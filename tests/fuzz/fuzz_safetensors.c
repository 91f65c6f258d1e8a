/* Fuzz target: the safetensors reader (common/safetensors.h).
 *
 * The input is a whole file; the reader takes a path, so it is written to a scratch file
 * first. An accepted file must describe itself consistently (tensors in data order,
 * contiguous, each numel * dtype size == end - begin, data inside the mapping, lookups by
 * name and metadata key finding what iteration lists), every float tensor must convert,
 * and writing the tensors and metadata back out with the writer must give a file that
 * opens to the same names, dtypes, shapes, bytes and metadata. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/safetensors.h"
#include "fuzz.h"

static void check_tensors(const ch_st_file_t *f, size_t file_size)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < ch_st_count(f); i++) {
        const ch_st_tensor_t *t = ch_st_at(f, i);
        size_t esz = ch_st_dtype_size(t->dtype);
        FUZZ_ASSERT(t != NULL && esz > 0 && t->ndim <= CH_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t->ndim; d++)
            numel *= t->shape[d]; /* cannot wrap: the reader checked */
        FUZZ_ASSERT(numel == t->numel);
        FUZZ_ASSERT(t->begin == pos && t->end >= t->begin && t->numel * esz == t->end - t->begin);
        FUZZ_ASSERT(t->end <= file_size);
        pos = t->end;
        /* A name with an embedded NUL finds its prefix; both name a tensor. */
        FUZZ_ASSERT(ch_st_find(f, t->name) != NULL);

        char err[256];
        float *dst = malloc(t->numel ? t->numel * sizeof *dst : 1);
        FUZZ_ASSERT(dst != NULL);
        int rc = ch_st_read_f32(f, t, dst, err, sizeof err);
        int is_float = t->dtype == CH_ST_F32 || t->dtype == CH_ST_F16 || t->dtype == CH_ST_BF16 ||
                       t->dtype == CH_ST_F64;
        FUZZ_ASSERT(is_float ? rc == 0 : rc == CH_E_FORMAT);
        if (t->dtype == CH_ST_F32 && t->numel > 0)
            FUZZ_ASSERT(memcmp(dst, t->data, t->numel * 4) == 0);
        free(dst);
    }
    FUZZ_ASSERT(ch_st_at(f, ch_st_count(f)) == NULL);
    for (size_t i = 0; i < ch_st_meta_count(f); i++) {
        const char *k = NULL, *v = NULL;
        ch_st_meta_at(f, i, &k, &v);
        FUZZ_ASSERT(k != NULL && v != NULL && ch_st_meta(f, k) != NULL);
    }
}

/* Write f's tensors (in data order) and metadata to path; 0 or the writer's error. */
static int rewrite(const ch_st_file_t *f, const char *path)
{
    ch_st_writer_t *w = NULL;
    char err[256];
    FUZZ_ASSERT(ch_st_writer_create(path, &w) == 0);
    for (size_t i = 0; i < ch_st_meta_count(f); i++) {
        const char *k = NULL, *v = NULL;
        ch_st_meta_at(f, i, &k, &v);
        FUZZ_ASSERT(ch_st_writer_meta(w, k, v) == 0);
    }
    for (size_t i = 0; i < ch_st_count(f); i++) {
        const ch_st_tensor_t *t = ch_st_at(f, i);
        int rc = ch_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
        if (rc < 0) { /* only a name the writer may refuse: empty after a \u0000 cut */
            FUZZ_ASSERT(rc == -EINVAL && t->name[0] == '\0');
            ch_st_writer_destroy(w);
            return rc;
        }
    }
    return ch_st_writer_finish(w, NULL, NULL, err, sizeof err);
}

static void check_same(const ch_st_file_t *a, const ch_st_file_t *b)
{
    FUZZ_ASSERT(ch_st_count(a) == ch_st_count(b));
    for (size_t i = 0; i < ch_st_count(a); i++) {
        const ch_st_tensor_t *x = ch_st_at(a, i), *y = ch_st_at(b, i);
        FUZZ_ASSERT(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim);
        FUZZ_ASSERT(memcmp(x->shape, y->shape, x->ndim * sizeof x->shape[0]) == 0);
        FUZZ_ASSERT(x->end - x->begin == y->end - y->begin);
        FUZZ_ASSERT(memcmp(x->data, y->data, x->end - x->begin) == 0);
    }
    FUZZ_ASSERT(ch_st_meta_count(a) == ch_st_meta_count(b));
    for (size_t i = 0; i < ch_st_meta_count(a); i++) {
        const char *k = NULL, *v = NULL;
        ch_st_meta_at(a, i, &k, &v);
        const char *v2 = ch_st_meta(b, k);
        FUZZ_ASSERT(v2 != NULL && strcmp(v, v2) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600], path2[600], err[512];
    fuzz_tmp_path(path, sizeof path, "in.safetensors");
    fuzz_tmp_path(path2, sizeof path2, "out.safetensors");
    fuzz_write_file(path, data, size);

    ch_st_file_t *f = NULL, *g = NULL;
    int rc = ch_st_open(path, &f, err, sizeof err);
    FUZZ_ASSERT(memchr(err, '\0', sizeof err) != NULL);
    if (rc < 0) {
        FUZZ_ASSERT(f == NULL && (rc == CH_E_FORMAT || rc == -ENOMEM));
        FUZZ_ASSERT(err[0] != '\0');
        return 0;
    }
    FUZZ_ASSERT(f != NULL && strcmp(ch_st_path(f), path) == 0);
    check_tensors(f, size);

    if (rewrite(f, path2) == 0) {
        rc = ch_st_open(path2, &g, err, sizeof err);
        FUZZ_ASSERT(rc == 0);
        check_tensors(g, (size_t)-1);
        check_same(f, g);
        ch_st_close(g);
    }
    ch_st_close(f);
    return 0;
}
