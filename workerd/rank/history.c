/* The run's folder and history at the rank (history.h). */
#include "workerd/rank/history.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#define HISTORY_MAX (1ull << 30)

int wrk_history_prepare(wrk_rank_t *r, ch_run_resume_t *res)
{
    char err[CH_PATH_LEN + 256], folder[CH_PATH_LEN];
    const ch_jobspec_t *s = &r->spec;
    ch_run_t run;
    int rc = ch_run_check(s, 1, res, err, sizeof err);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "%s", err);
    if (r->rank != 0 || !s->checkpoint.dir[0] || ch_run_folder(s, folder, sizeof folder) < 0)
        return 0;
    rc = ch_run_read(folder, &run, err, sizeof err);
    if (rc != -ENOENT)
        return rc < 0 ? wrk_rank_fail(r, rc, "%s", err) : 0;
    memset(&run, 0, sizeof run);
    snprintf(run.id, sizeof run.id, "%s", s->checkpoint.run_id);
    if (!run.id[0])
        ch_run_new_id(run.id); /* a job file written before run ids */
    snprintf(run.name, sizeof run.name, "%s", s->name);
    run.created_ms = ch_wall_ms();
    run.layers = s->model.layers;
    run.heads = s->model.heads;
    run.embd = s->model.embd;
    run.vocab = s->model.vocab;
    run.seq_len = s->model.seq_len;
    snprintf(run.resumed_from, sizeof run.resumed_from, "%s", res->step_dir);
    rc = ch_run_write(folder, &run, err, sizeof err);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "checkpoint.dir: %s", err);
    CH_LOGI("train", "job=%s gen=%" PRIu64 " rank=0: run %s in %s", r->job_id, r->generation,
            run.id, folder);
    return 0;
}

/* The lines of text[0..len) whose "step" is at most `from`, in place; returns the length kept. */
static size_t keep_upto(char *text, size_t len, uint64_t from)
{
    size_t out = 0;
    for (size_t at = 0; at < len;) {
        char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        const char *k = strstr(text + at, "\"step\": ");
        uint64_t step = UINT64_MAX;
        if (nl && k && k < nl)
            step = strtoull(k + 8, NULL, 10);
        if (step <= from) { /* a torn last line (no newline) goes too */
            memmove(text + out, text + at, end - at);
            out += end - at;
        }
        at = end;
    }
    return out;
}

void wrk_history_open(wrk_rank_t *r, uint64_t from, wrk_history_t *h)
{
    char folder[CH_PATH_LEN], path[CH_PATH_LEN + 32];
    char *text = NULL;
    size_t len = 0;
    h->f = NULL;
    if (r->rank != 0 || !r->spec.checkpoint.dir[0] ||
        ch_run_folder(&r->spec, folder, sizeof folder) < 0)
        return;
    snprintf(path, sizeof path, "%s/" CH_RUN_METRICS, folder);
    int rc = ch_file_read(path, HISTORY_MAX, &text, &len);
    if (rc == 0) {
        size_t kept = keep_upto(text, len, from);
        if (kept != len)
            rc = ch_file_write_atomic(path, text, kept, 0644);
    } else if (rc == -ENOENT) {
        rc = 0;
    }
    free(text);
    if (rc == 0 && !(h->f = fopen(path, "a")))
        rc = -errno;
    if (rc < 0)
        CH_LOGW("train", "job=%s rank=0: %s: %s; the run goes on without its history", r->job_id,
                path, ch_strerror(rc));
}

/* A number, or null for NaN and infinities (JSON has no spelling for them). */
static const char *num(char *buf, size_t n, double v)
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, n, "%.9g", v);
    return buf;
}

void wrk_history_step(wrk_history_t *h, const wrk_rank_t *r, const eng_step_info_t *i)
{
    char l[32], g[32];
    if (!h->f)
        return;
    fprintf(h->f,
            "{\"step\": %" PRIu64 ", \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.6g, \"step_s\": %.6g, \"compute_s\": %.6g, "
            "\"tp_s\": %.6g, \"pp_wait_s\": %.6g, \"zero_s\": %.6g, \"optim_s\": %.6g, "
            "\"idle_s\": %.6g, \"generation\": %" PRIu64 ", \"job\": \"%s\", \"time_ms\": %" PRIu64
            "}\n",
            i->step + 1, num(l, sizeof l, i->loss), i->lr, num(g, sizeof g, i->grad_norm),
            i->tokens_per_s, i->mfu, i->seconds, i->time.compute, i->time.tp, i->time.pp_wait,
            i->time.zero, i->time.optim, i->time.idle, r->generation, r->job_id, ch_wall_ms());
    fflush(h->f);
}

void wrk_history_close(wrk_history_t *h)
{
    if (h->f)
        fclose(h->f);
    h->f = NULL;
}
