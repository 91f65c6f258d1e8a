/* safetensors files (https://huggingface.co/docs/safetensors): reader and writer.
 *
 * Layout: u64 little-endian N | N bytes of JSON header | data. The header maps each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
 * the data section) and may hold "__metadata__": {string: string}. Writers pad the
 * header with spaces so the data starts 8-byte aligned.
 *
 * The reader memory-maps the file and validates everything before handing out a
 * tensor: header length against the file size, JSON, dtypes, shapes, offsets inside
 * the data, ordered, contiguous and non-overlapping, numel * dtype size == end - begin
 * (all overflow-checked). Errors are CH_E_FORMAT with "FILE: reason".
 *
 * The writer streams: tensors are registered with borrowed pointers, and finish()
 * writes header and data to a temporary name, fsyncs, renames and fsyncs the directory,
 * hashing the bytes as they go (ch_hash64), so the caller gets size and checksum
 * without reading the file back. */
#ifndef CH_SAFETENSORS_H
#define CH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CH_ST_BOOL = 0,
    CH_ST_U8,
    CH_ST_I8,
    CH_ST_I16,
    CH_ST_U16,
    CH_ST_F16,
    CH_ST_BF16,
    CH_ST_I32,
    CH_ST_U32,
    CH_ST_F32,
    CH_ST_I64,
    CH_ST_U64,
    CH_ST_F64,
    CH_ST_NDTYPES
} ch_st_dtype_t;

#define CH_ST_MAX_DIMS 8

const char *ch_st_dtype_name(ch_st_dtype_t d); /* "F32" */
size_t ch_st_dtype_size(ch_st_dtype_t d);      /* bytes per element */

typedef struct ch_st_tensor {
    const char *name;
    ch_st_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[CH_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* byte offsets in the data section */
    const void *data;    /* into the mapping; may be unaligned */
} ch_st_tensor_t;

// ----------------------------------------------------------------------------
// reading

typedef struct ch_st_file ch_st_file_t;

/* Map and validate path. *out is owned by the caller (ch_st_close); tensor and
 * metadata pointers stay valid until then. */
int ch_st_open(const char *path, ch_st_file_t **out, char *err, size_t errlen);
void ch_st_close(ch_st_file_t *f);

const char *ch_st_path(const ch_st_file_t *f);
size_t ch_st_count(const ch_st_file_t *f); /* tensors, in data order */
const ch_st_tensor_t *ch_st_at(const ch_st_file_t *f, size_t i);
const ch_st_tensor_t *ch_st_find(const ch_st_file_t *f, const char *name); /* NULL if none */
const char *ch_st_meta(const ch_st_file_t *f, const char *key);            /* NULL if none */
size_t ch_st_meta_count(const ch_st_file_t *f);
void ch_st_meta_at(const ch_st_file_t *f, size_t i, const char **key, const char **value);

/* Copy tensor t into dst[0..numel) as float, converting F32, F16, BF16 and F64.
 * CH_E_FORMAT (naming the file and tensor) for other dtypes. */
int ch_st_read_f32(const ch_st_file_t *f, const ch_st_tensor_t *t, float *dst, char *err,
                   size_t errlen);

// ----------------------------------------------------------------------------
// writing

/* dst[0..n) in dtype (F32, F16 or BF16; round to nearest even) from floats; -EINVAL for
 * another dtype. dst holds n * ch_st_dtype_size(dtype) bytes. */
int ch_st_convert_f32(ch_st_dtype_t dtype, const float *src, void *dst, size_t n);

typedef struct ch_st_writer ch_st_writer_t;

int ch_st_writer_create(const char *path, ch_st_writer_t **out);
/* Register a tensor; data (numel * dtype size bytes) is borrowed until finish. Names
 * must be unique and not "__metadata__". */
int ch_st_writer_add(ch_st_writer_t *w, const char *name, ch_st_dtype_t dtype, uint32_t ndim,
                     const uint64_t *shape, const void *data);
int ch_st_writer_meta(ch_st_writer_t *w, const char *key, const char *value);
/* Write the file atomically. bytes and checksum (ch_hash64 of the whole file) may be
 * NULL. The writer is destroyed either way. */
int ch_st_writer_finish(ch_st_writer_t *w, uint64_t *bytes, uint64_t *checksum, char *err,
                        size_t errlen);
/* Drop a writer without writing. */
void ch_st_writer_destroy(ch_st_writer_t *w);

// ----------------------------------------------------------------------------
// checksum: a 64-bit non-cryptographic hash of byte streams (four multiply-rotate
// lanes over 32-byte stripes, like xxHash64 in shape; not compatible with it).

typedef struct ch_hash64 {
    uint64_t lane[4];
    uint64_t total;
    unsigned char stash[32];
    size_t nstash;
} ch_hash64_t;

void ch_hash64_init(ch_hash64_t *h);
void ch_hash64_update(ch_hash64_t *h, const void *data, size_t len);
uint64_t ch_hash64_final(const ch_hash64_t *h);
/* Hash a whole file's contents. */
int ch_hash64_file(const char *path, uint64_t *out, uint64_t *bytes);

#endif
