/* Strict JSON (RFC 8259) through jansson: a parser into a plain tree, a document
 * builder for writers (chorusctl --json), and a string builder for hand-shaped files.
 *
 * This is the only module that includes jansson.h. Used for safetensors headers,
 * checkpoint manifests and anything else Chorus reads that a peer or a file could have
 * made hostile: the size is checked before parsing, nesting depth and value count are
 * checked by a linear pre-scan before jansson recurses, duplicate object keys are refused
 * (JSON_REJECT_DUPLICATES), strings may not hold \u0000, and every failure is
 * CH_E_FORMAT or CH_E_TOOBIG with a reason that names the byte offset. An integer
 * written without fraction or exponent is kept exactly as a 64-bit signed integer
 * (jansson's json_int_t); one outside int64_t is refused rather than rounded. */
#ifndef CH_JSON_H
#define CH_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

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
    char *key;     /* member name when this node is an object member, else NULL */
    int boolean;   /* CH_JSON_BOOL */
    double number; /* CH_JSON_NUMBER */
    int is_int;    /* CH_JSON_NUMBER written as an integer: integer holds it exactly */
    int64_t integer;
    char *str;        /* CH_JSON_STRING (UTF-8, NUL-terminated) and CH_JSON_NUMBER (canonical
                         text: the integer, or the double as %.17g) */
    size_t len;       /* length of str */
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
/* A number node written as a non-negative integer (no fraction or exponent): 0 and
 * *out, else CH_E_FORMAT. The parser refuses integers above INT64_MAX. */
int ch_json_u64(const ch_json_t *num, uint64_t *out);

/* ---- building a document ----
 * Values are added in document order, as a streaming writer would emit them; the tree is
 * jansson's and the text is jansson's dump. Errors (out of memory, a value where none
 * can go, nesting over CH_JB_MAX_DEPTH) are sticky and returned by ch_jb_finish. Object
 * members keep their order; a repeated key replaces the earlier value. A double that is
 * NaN or infinite becomes null (JSON has no spelling for it); a uint64 above INT64_MAX,
 * which json_int_t cannot hold, becomes a double. */
#define CH_JB_MAX_DEPTH 64

typedef struct ch_jb ch_jb_t;

int ch_jb_create(ch_jb_t **out);
void ch_jb_destroy(ch_jb_t *b);
void ch_jb_obj_begin(ch_jb_t *b);
void ch_jb_obj_end(ch_jb_t *b);
void ch_jb_arr_begin(ch_jb_t *b);
void ch_jb_arr_end(ch_jb_t *b);
/* Inside an object: the next value's key (copied). */
void ch_jb_key(ch_jb_t *b, const char *key);
void ch_jb_str(ch_jb_t *b, const char *s); /* NULL adds null; invalid UTF-8 is an error */
void ch_jb_int(ch_jb_t *b, int64_t v);
void ch_jb_uint(ch_jb_t *b, uint64_t v);
void ch_jb_double(ch_jb_t *b, double v);
void ch_jb_bool(ch_jb_t *b, int v);
void ch_jb_null(ch_jb_t *b);

enum { CH_JB_PRETTY = 0, CH_JB_LINE = 1 };
/* The finished document as text: CH_JB_PRETTY indents two spaces per level, CH_JB_LINE
 * is one line. Every container must be closed. 0 and *out (malloc'd, NUL-terminated,
 * caller frees; *len its length, may be NULL), or the sticky error. Leaves b as it was. */
int ch_jb_finish(ch_jb_t *b, int style, char **out, size_t *len);

/* ---- writing by hand: into a ch_buf_t (buf.h) ---- */
/* s as a quoted JSON string: escapes ", \, and control characters. */
void ch_jw_str(ch_buf_t *w, const char *s);

#endif
