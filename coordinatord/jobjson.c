/* One job as JSON (jobjson.h). */
#include "jobjson.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/json.h"
#include "coord.h"

static void kv_num(ch_jb_t *b, const char *key, double v)
{
    ch_jb_key(b, key);
    ch_jb_double(b, v); /* NaN and infinities become null */
}

static void status_fields(ch_jb_t *b, const coord_job_t *j)
{
    ch_jb_key(b, "id");
    ch_jb_str(b, j->id);
    ch_jb_key(b, "name");
    ch_jb_str(b, j->name);
    ch_jb_key(b, "kind");
    ch_jb_str(b, ch_job_kind_name(j->spec.kind));
    ch_jb_key(b, "state");
    ch_jb_str(b, coord_job_state_name(j->state));
    ch_jb_key(b, "reason");
    ch_jb_str(b, j->reason);
    ch_jb_key(b, "step");
    ch_jb_uint(b, j->step);
    ch_jb_key(b, "total_steps");
    ch_jb_uint(b, j->total_steps);
    kv_num(b, "loss", j->step ? j->loss : (double)NAN);
    ch_jb_key(b, "generation");
    ch_jb_uint(b, j->generation);
    ch_jb_key(b, "restarts");
    ch_jb_uint(b, j->restarts);
    ch_jb_key(b, "world_size");
    ch_jb_uint(b, j->world);
    ch_jb_key(b, "layout");
    ch_jb_obj_begin(b);
    ch_jb_key(b, "tp");
    ch_jb_uint(b, j->spec.parallel.tp);
    ch_jb_key(b, "pp");
    ch_jb_uint(b, j->spec.parallel.pp);
    ch_jb_key(b, "dp");
    ch_jb_uint(b, j->spec.parallel.dp);
    ch_jb_obj_end(b);
    ch_jb_key(b, "last_checkpoint_step");
    if (j->last_ckpt_step >= 0)
        ch_jb_int(b, j->last_ckpt_step);
    else
        ch_jb_null(b);
    kv_num(b, "tokens_per_s", j->tokens_per_s);
    kv_num(b, "mfu", j->mfu);
    ch_jb_key(b, "run_id");
    ch_jb_str(b, j->spec.checkpoint.run_id);
}

int coord_page_job_json(coord_t *c, const char *id, ch_buf_t *out)
{
    coord_job_t *j = coord_job_find(c, id);
    ch_jb_t *b = NULL;
    char *text = NULL;
    enum { MAXP = COORD_SERIES_RECENT + COORD_SERIES_HISTORY };
    coord_point_t *pts = NULL;
    if (!j)
        return CH_E_NOTFOUND;
    int rc = ch_jb_create(&b);
    if (rc == 0 && !(pts = malloc(sizeof *pts * MAXP)))
        rc = -ENOMEM;
    if (rc < 0)
        goto out;
    const coord_series_t *s = coord_series_get(c, j);
    size_t n = s ? coord_series_points(s, pts, MAXP) : 0;
    ch_jb_obj_begin(b);
    status_fields(b, j);
    ch_jb_key(b, "series");
    ch_jb_arr_begin(b);
    for (size_t i = 0; i < n; i++) {
        ch_jb_obj_begin(b);
        ch_jb_key(b, "step");
        ch_jb_uint(b, pts[i].step);
        kv_num(b, "loss", pts[i].loss);
        kv_num(b, "tokens_per_s", pts[i].tokens_per_s);
        kv_num(b, "mfu", pts[i].mfu);
        kv_num(b, "step_ms", pts[i].step_ms);
        ch_jb_obj_end(b);
    }
    ch_jb_arr_end(b);
    ch_jb_obj_end(b);
    rc = ch_jb_finish(b, CH_JB_PRETTY, &text, NULL);
    if (rc == 0)
        ch_buf_puts(out, text);
out:
    free(text);
    free(pts);
    ch_jb_destroy(b);
    return rc;
}
