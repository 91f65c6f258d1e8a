/* Streaming JSON writer (see json.h). Layout: every member or element on its own line,
 * indented two spaces per level; empty containers stay on one line ("[]"). */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

void ctl_json_init(ctl_json_t *j, FILE *f)
{
    j->f = f;
    j->depth = 0;
    j->count[0] = 0;
    j->after_key = 0;
}

void ctl_json_finish(ctl_json_t *j)
{
    fputc('\n', j->f);
    fflush(j->f);
}

static void indent(ctl_json_t *j)
{
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++)
        fputs("  ", j->f);
}

/* Separator and indentation before a value (or a key) at the current level. */
static void before_value(ctl_json_t *j)
{
    if (j->after_key) {
        j->after_key = 0;
        return;
    }
    if (j->depth > 0) {
        if (j->count[j->depth] > 0)
            fputc(',', j->f);
        indent(j);
    }
    j->count[j->depth]++;
}

static void open_level(ctl_json_t *j, char c)
{
    before_value(j);
    fputc(c, j->f);
    if (j->depth + 1 < CTL_JSON_MAX_DEPTH)
        j->depth++;
    j->count[j->depth] = 0;
}

static void close_level(ctl_json_t *j, char c)
{
    int had = j->count[j->depth] > 0;
    if (j->depth > 0)
        j->depth--;
    if (had)
        indent(j);
    fputc(c, j->f);
}

void ctl_json_obj_begin(ctl_json_t *j)
{
    open_level(j, '{');
}

void ctl_json_obj_end(ctl_json_t *j)
{
    close_level(j, '}');
}

void ctl_json_arr_begin(ctl_json_t *j)
{
    open_level(j, '[');
}

void ctl_json_arr_end(ctl_json_t *j)
{
    close_level(j, ']');
}

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\b':
            fputs("\\b", f);
            break;
        case '\f':
            fputs("\\f", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

void ctl_json_key(ctl_json_t *j, const char *key)
{
    before_value(j);
    put_string(j->f, key);
    fputs(": ", j->f);
    j->after_key = 1;
}

void ctl_json_str(ctl_json_t *j, const char *s)
{
    before_value(j);
    if (s)
        put_string(j->f, s);
    else
        fputs("null", j->f);
}

void ctl_json_int(ctl_json_t *j, int64_t v)
{
    before_value(j);
    fprintf(j->f, "%" PRId64, v);
}

void ctl_json_uint(ctl_json_t *j, uint64_t v)
{
    before_value(j);
    fprintf(j->f, "%" PRIu64, v);
}

/* Shortest of %.15g / %.17g that reads back as the same double. */
static void put_double(FILE *f, double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, sizeof buf, "%.17g", v);
    fputs(buf, f);
}

void ctl_json_double(ctl_json_t *j, double v)
{
    before_value(j);
    if (!isfinite(v))
        fputs("null", j->f);
    else
        put_double(j->f, v);
}

void ctl_json_bool(ctl_json_t *j, int v)
{
    before_value(j);
    fputs(v ? "true" : "false", j->f);
}

void ctl_json_null(ctl_json_t *j)
{
    before_value(j);
    fputs("null", j->f);
}

void ctl_json_kstr(ctl_json_t *j, const char *key, const char *s)
{
    ctl_json_key(j, key);
    ctl_json_str(j, s);
}

void ctl_json_kint(ctl_json_t *j, const char *key, int64_t v)
{
    ctl_json_key(j, key);
    ctl_json_int(j, v);
}

void ctl_json_kuint(ctl_json_t *j, const char *key, uint64_t v)
{
    ctl_json_key(j, key);
    ctl_json_uint(j, v);
}

void ctl_json_kdouble(ctl_json_t *j, const char *key, double v)
{
    ctl_json_key(j, key);
    ctl_json_double(j, v);
}
