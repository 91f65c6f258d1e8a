/* A small streaming JSON writer for chorusctl --json: one document, written as the
 * values arrive, two-space indented. Strings are escaped per RFC 8259 (control
 * characters as \u00XX, bytes >= 0x80 passed through as UTF-8); a double that is NaN
 * or infinite is written as null, since JSON has no spelling for it. */
#ifndef CTL_JSON_H
#define CTL_JSON_H

#include <stdint.h>
#include <stdio.h>

#define CTL_JSON_MAX_DEPTH 32

typedef struct ctl_json {
    FILE *f;
    int depth;
    int count[CTL_JSON_MAX_DEPTH]; /* values written so far at each open level */
    int after_key;                 /* a key was written; its value comes next */
} ctl_json_t;

void ctl_json_init(ctl_json_t *j, FILE *f);
/* Ends the document with a newline. */
void ctl_json_finish(ctl_json_t *j);

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
