/* Helpers shared by the recovery tests and the recovery benchmark's trials: training job
 * files of the demo-size model, waits on a job's state through the control socket, the
 * pid of a rank process (from its workerd's log), and byte comparison of two files.
 * Header-only (static functions) so the benchmark can include it without the test
 * harness's Criterion dependency. */
#ifndef H_RECOVERY_UTIL_H
#define H_RECOVERY_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/json.h"
#include "common/msg.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "harness.h"

/* The demo's model (deploy/jobs/demo.ini) with its global batch of 64 sequences split
 * over dp ranks; checkpoints every `every` steps under DIR/ckpt. extra goes to [fault]. */
static inline int rt_job_text(const h_cluster_t *c, char *out, size_t n, const char *name, int dp,
                              int steps, int every, const char *fault)
{
    int k = snprintf(out, n,
                     "[job]\nname = %s\nkind = train\n"
                     "[model]\nlayers = 2\nheads = 4\nembd = 64\nseq_len = 16\n"
                     "[parallel]\ndp = %d\nmicro_batch_size = %d\n"
                     "[train]\nsteps = %d\nlr = 0.002\nwarmup = 20\nseed = 1337\n"
                     "[checkpoint]\ndir = %s/ckpt\nevery = %d\nkeep = 3\n"
                     "[fault]\n%s",
                     name, dp, 64 / dp, steps, c->dir, every, fault ? fault : "");
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* Write text to DIR/file and submit it; the job id into id. 0 or -1. */
static inline int rt_submit(const h_cluster_t *c, const char *file, const char *text, char *id,
                            size_t n)
{
    char path[PATH_MAX + 64];
    h_out_t o;
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    if (h_write_file(path, text) < 0 || h_ctl(c, &o, "submit", path, NULL) < 0)
        return -1;
    int ok = o.status == 0 && o.out && sscanf(o.out, "%63s", id) == 1;
    if (!ok)
        fprintf(stderr, "submit %s: exit %d: %s\n", file, o.status, o.err ? o.err : "");
    h_out_free(&o);
    (void)n;
    return ok ? 0 : -1;
}

/* A job's state as seen through the control socket. */
typedef struct rt_job {
    const h_cluster_t *c;
    const char *id;
    /* the condition waited for */
    const char *want;  /* a state, or NULL for "any" */
    uint64_t min_step; /* and step >= this */
    uint64_t min_gen;  /* and generation >= this */
    /* what was seen last */
    char state[32];
    char reason[512];
    uint64_t step, gen;
    uint32_t restarts;
} rt_job_t;

static inline int rt_job_ended(const char *state)
{
    return strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0 ||
           strcmp(state, "cancelled") == 0;
}

static inline int rt_job_poll(void *ud)
{
    rt_job_t *w = ud;
    Chorus__Envelope *r = NULL;
    if (h_job_query(w->c, w->id, &r) < 0)
        return 0;
    snprintf(w->state, sizeof w->state, "%s", r->job_info->state);
    snprintf(w->reason, sizeof w->reason, "%s", r->job_info->reason);
    w->step = r->job_info->step;
    w->gen = r->job_info->generation;
    w->restarts = r->job_info->restarts;
    ch_msg_free(r);
    if (w->want && strcmp(w->state, w->want) != 0)
        return rt_job_ended(w->state) ? -1 : 0; /* ended otherwise: stop waiting */
    if (!w->want && !rt_job_ended(w->state))
        return 0;
    return w->step >= w->min_step && w->gen >= w->min_gen;
}

/* Wait until job id is in state want (NULL: ended) with step >= min_step and generation
 * >= min_gen; 1 when it is, else 0 (w holds what was seen). */
static inline int rt_wait(rt_job_t *w, const h_cluster_t *c, const char *id, const char *want,
                          uint64_t min_step, uint64_t min_gen, int timeout_ms)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->id = id;
    w->want = want;
    w->min_step = min_step;
    w->min_gen = min_gen;
    return h_wait_until(rt_job_poll, w, timeout_ms, 5) > 0;
}

/* The pid of rank `rank` of generation gen of job id, from node<i>'s workerd log
 * ("job=j1 gen=1 rank=0 local=0 pid=123 started"); -1 when not (yet) there. */
static inline pid_t rt_rank_pid(const h_cluster_t *c, int node, const char *id, uint64_t gen,
                                uint32_t rank)
{
    char path[PATH_MAX + 32], needle[128], *text = NULL;
    size_t len = 0;
    pid_t pid = -1;
    snprintf(path, sizeof path, "%s/node%d.log", c->dir, node);
    snprintf(needle, sizeof needle, "job=%s gen=%llu rank=%u local=", id, (unsigned long long)gen,
             rank);
    if (ch_file_read(path, 64u << 20, &text, &len) < 0)
        return -1;
    for (char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
        char *q = strstr(p, "pid=");
        char *eol = strchr(p, '\n');
        if (q && (!eol || q < eol))
            pid = (pid_t)atoi(q + 4);
    }
    free(text);
    return pid;
}

/* The node (1-based: "node<i>") running rank r of job id now, from `status` of a job of
 * `world` ranks; -1 when the status cannot be read or does not list them. */
static inline int rt_node_of(const h_cluster_t *c, const char *id, uint32_t r, size_t world)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    if (!js)
        return -1;
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    int node = -1;
    if (ranks && ranks->nkids == world && r < world)
        node = atoi(h_json_str(h_json_at(ranks, r), "node") + strlen("node"));
    ch_json_free(js);
    return node;
}

/* Whether two exported models hold the same tensors, bit for bit (names, dtypes, shapes
 * and bytes; the metadata names the job, so it differs). 1 same; 0 different, with the
 * first difference in why. */
static inline int rt_same_weights(const char *a, const char *b, char *why, size_t n)
{
    ch_st_file_t *x = NULL, *y = NULL;
    int same = 0;
    if (ch_st_open(a, &x, why, n) < 0 || ch_st_open(b, &y, why, n) < 0)
        goto out;
    if (ch_st_count(x) != ch_st_count(y)) {
        snprintf(why, n, "%zu tensors against %zu", ch_st_count(x), ch_st_count(y));
        goto out;
    }
    for (size_t i = 0; i < ch_st_count(x); i++) {
        const ch_st_tensor_t *t = ch_st_at(x, i), *u = ch_st_find(y, t->name);
        if (!u || u->dtype != t->dtype || u->numel != t->numel ||
            u->end - u->begin != t->end - t->begin ||
            memcmp(t->data, u->data, t->end - t->begin) != 0) {
            snprintf(why, n, "tensor %s differs", t->name);
            goto out;
        }
    }
    same = 1;
out:
    ch_st_close(x);
    ch_st_close(y);
    return same;
}

/* The largest relative L2 difference ||a - b|| / ||a|| over the tensors of two exported
 * models (same names and shapes, fp32), its tensor's name in worst; 0 means bit for bit
 * the same numbers. -1 (worst says why) when a file cannot be read or the tensors differ
 * in names, types or sizes. */
static inline double rt_worst_rel_l2(const char *pa, const char *pb, char *worst, size_t n)
{
    ch_st_file_t *x = NULL, *y = NULL;
    double max = 0;
    if (ch_st_open(pa, &x, worst, n) < 0 || ch_st_open(pb, &y, worst, n) < 0 ||
        ch_st_count(x) != ch_st_count(y)) {
        max = -1;
        goto out;
    }
    for (size_t i = 0; i < ch_st_count(x) && max >= 0; i++) {
        const ch_st_tensor_t *t = ch_st_at(x, i), *u = ch_st_find(y, t->name);
        if (!u || t->dtype != CH_ST_F32 || u->dtype != CH_ST_F32 || t->numel != u->numel) {
            snprintf(worst, n, "tensor %s: not the same in both", t->name);
            max = -1;
            break;
        }
        double diff = 0, norm = 0;
        for (size_t k = 0; k < t->numel; k++) {
            float a, b;
            memcpy(&a, (const char *)t->data + 4 * k, 4);
            memcpy(&b, (const char *)u->data + 4 * k, 4);
            diff += ((double)a - b) * ((double)a - b);
            norm += (double)a * a;
        }
        double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        if (rel >= max) {
            max = rel;
            snprintf(worst, n, "%s", t->name);
        }
    }
out:
    ch_st_close(x);
    ch_st_close(y);
    return max;
}

#endif
