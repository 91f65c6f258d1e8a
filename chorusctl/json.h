/* chorusctl --json: one JSON document, built as the values arrive and written by jansson
 * (common/json.h's document builder) when it is finished: two-space indented, or on one
 * line for streams (watch --json prints one document per update). Strings must be UTF-8;
 * a double that is NaN or infinite is written as null, since JSON has no spelling for it.
 * Errors are sticky; ctl_json_finish reports them once.
 *
 * Every document says which version of its shape it has: a top-level object, or each object
 * of a top-level array (nodes, jobs), starts with "schema": CTL_JSON_SCHEMA. Fields may be
 * added under one schema; renaming or removing one, or changing its meaning, takes the next. */
#ifndef CTL_JSON_H
#define CTL_JSON_H

#include <stdint.h>
#include <stdio.h>

struct ch_jb;

#define CTL_JSON_SCHEMA 1

typedef struct ctl_json {
    FILE *f;
    struct ch_jb *b; /* NULL when it could not be made: every call is then a no-op */
    int style;       /* CH_JB_PRETTY or CH_JB_LINE */
    int depth;       /* objects and arrays open */
    int top_array;   /* the document is an array: its objects are the records */
} ctl_json_t;

/* An indented document for f. */
void ctl_json_init(ctl_json_t *j, FILE *f);
/* A one-line document for f (a line of a stream). */
void ctl_json_init_line(ctl_json_t *j, FILE *f);
/* Write the document and a newline, flush, release. 0, or a negative code having printed
 * "chorusctl: JSON output: reason" (nothing is written then). */
int ctl_json_finish(ctl_json_t *j);

void ctl_json_obj_begin(ctl_json_t *j);
void ctl_json_obj_end(ctl_json_t *j);
void ctl_json_arr_begin(ctl_json_t *j);
void ctl_json_arr_end(ctl_json_t *j);
/* Inside an object: the next value's key. */
void ctl_json_key(ctl_json_t *j, const char *key);

void ctl_json_str(ctl_json_t *j, const char *s); /* NULL writes null */
void ctl_json_int(ctl_json_t *j, int64_t v);
void ctl_json_uint(ctl_json_t *j, uint64_t v);
void ctl_json_double(ctl_json_t *j, double v);
void ctl_json_bool(ctl_json_t *j, int v);
void ctl_json_null(ctl_json_t *j);

/* Key and value in one call, for the common object member. */
void ctl_json_kstr(ctl_json_t *j, const char *key, const char *s);
void ctl_json_kint(ctl_json_t *j, const char *key, int64_t v);
void ctl_json_kuint(ctl_json_t *j, const char *key, uint64_t v);
void ctl_json_kdouble(ctl_json_t *j, const char *key, double v);

#endif
