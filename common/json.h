/* A small strict JSON (RFC 8259) parser into a tree, and a string builder for writers.
 *
 * Used for safetensors headers, checkpoint manifests and anything else Chorus reads
 * that a peer or a file could have made hostile: input is bounded (size, nesting depth,
 * node count), duplicate object keys are refused, and every failure is CH_E_FORMAT with
 * a reason that names the byte offset. Numbers keep their source text as well as a
 * double, so 64-bit integers (file offsets) can be read exactly. */
#ifndef CH_JSON_H
#define CH_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CH_JSON_NULL = 0,
    CH_JSON_BOOL,
    CH_JSON_NUMBER,
    CH_JSON_STRING,
    CH_JSON_ARRAY,
    CH_JSON_OBJECT,
} ch_json_type_t;

typedef struct ch_json ch_json_t;
struct ch_json {
    ch_json_type_t type;
    char *key;        /* member name when this node is an object member, else NULL */
    int boolean;      /* CH_JSON_BOOL */
    double number;    /* CH_JSON_NUMBER */
    char *str;        /* CH_JSON_STRING (UTF-8, NUL-terminated) and CH_JSON_NUMBER (its text) */
    size_t len;       /* length of str (a string may hold \u0000) */
    ch_json_t **kids; /* CH_JSON_ARRAY elements / CH_JSON_OBJECT members, in source order */
    size_t nkids;
};

typedef struct ch_json_limits {
    size_t max_bytes; /* input size */
    size_t max_depth; /* nesting of arrays/objects */
    size_t max_nodes; /* values in the whole document */
} ch_json_limits_t;

/* Defaults: 100 MiB, depth 64, 4 M nodes. */
ch_json_limits_t ch_json_default_limits(void);

/* Parse exactly one JSON value (surrounding whitespace allowed) from text[0..len).
 * limits may be NULL (defaults). *out is owned by the caller (ch_json_free).
 * CH_E_FORMAT with "offset N: reason" in err; CH_E_TOOBIG over a limit; -ENOMEM. */
int ch_json_parse(const char *text, size_t len, const ch_json_limits_t *limits, ch_json_t **out,
                  char *err, size_t errlen);
void ch_json_free(ch_json_t *j);

/* Lookups; NULL when absent or not of the asked shape. Returned nodes are borrowed. */
const ch_json_t *ch_json_get(const ch_json_t *obj, const char *key);
const char *ch_json_get_str(const ch_json_t *obj, const char *key);
/* A number node holding an exact non-negative integer (no fraction, exponent or sign)
 * that fits in 64 bits: 0 and *out, else CH_E_FORMAT. */
int ch_json_u64(const ch_json_t *num, uint64_t *out);

/* ---- writing ----
 * A growing string. Errors are sticky: after a failed append, further appends do nothing
 * and ch_jw_finish returns the error. */
typedef struct ch_jw {
    char *buf;
    size_t len, cap;
    int err;
} ch_jw_t;

void ch_jw_init(ch_jw_t *w);
void ch_jw_raw(ch_jw_t *w, const char *s);
void ch_jw_printf(ch_jw_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a quoted JSON string: escapes ", \, and control characters. */
void ch_jw_str(ch_jw_t *w, const char *s);
/* 0 and *out (malloc'd, NUL-terminated, caller frees; *len its length), or the sticky
 * error. Releases the builder either way. */
int ch_jw_finish(ch_jw_t *w, char **out, size_t *len);
void ch_jw_fini(ch_jw_t *w);

#endif
