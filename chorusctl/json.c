/* chorusctl's JSON output over common/json.h's document builder (see json.h). */
#include "json.h"

#include <errno.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/json.h"
#include "ctl.h"

static void init(ctl_json_t *j, FILE *f, int style)
{
    j->f = f;
    j->style = style;
    j->depth = 0;
    j->top_array = 0;
    if (ch_jb_create(&j->b) < 0)
        j->b = NULL;
}

void ctl_json_init(ctl_json_t *j, FILE *f)
{
    init(j, f, CH_JB_PRETTY);
}

void ctl_json_init_line(ctl_json_t *j, FILE *f)
{
    init(j, f, CH_JB_LINE);
}

int ctl_json_finish(ctl_json_t *j)
{
    char *text = NULL;
    int rc = j->b ? ch_jb_finish(j->b, j->style, &text, NULL) : -ENOMEM;
    if (rc < 0) {
        ctl_errf("JSON output: %s", ch_strerror(rc));
    } else {
        fputs(text, j->f);
        fputc('\n', j->f);
        fflush(j->f);
    }
    free(text);
    ch_jb_destroy(j->b);
    j->b = NULL;
    return rc;
}

/* Without a builder every call below is a no-op; finish then reports -ENOMEM. */

void ctl_json_obj_begin(ctl_json_t *j)
{
    if (!j->b)
        return;
    int record = j->depth == 0 || (j->depth == 1 && j->top_array);
    ch_jb_obj_begin(j->b);
    j->depth++;
    if (record)
        ctl_json_kint(j, "schema", CTL_JSON_SCHEMA);
}

void ctl_json_obj_end(ctl_json_t *j)
{
    if (j->b) {
        ch_jb_obj_end(j->b);
        j->depth--;
    }
}

void ctl_json_arr_begin(ctl_json_t *j)
{
    if (j->b) {
        ch_jb_arr_begin(j->b);
        j->top_array |= j->depth == 0;
        j->depth++;
    }
}

void ctl_json_arr_end(ctl_json_t *j)
{
    if (j->b) {
        ch_jb_arr_end(j->b);
        j->depth--;
    }
}

void ctl_json_key(ctl_json_t *j, const char *key)
{
    if (j->b)
        ch_jb_key(j->b, key);
}

void ctl_json_str(ctl_json_t *j, const char *s)
{
    if (j->b)
        ch_jb_str(j->b, s);
}

void ctl_json_int(ctl_json_t *j, int64_t v)
{
    if (j->b)
        ch_jb_int(j->b, v);
}

void ctl_json_uint(ctl_json_t *j, uint64_t v)
{
    if (j->b)
        ch_jb_uint(j->b, v);
}

void ctl_json_double(ctl_json_t *j, double v)
{
    if (j->b)
        ch_jb_double(j->b, v);
}

void ctl_json_bool(ctl_json_t *j, int v)
{
    if (j->b)
        ch_jb_bool(j->b, v);
}

void ctl_json_null(ctl_json_t *j)
{
    if (j->b)
        ch_jb_null(j->b);
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
