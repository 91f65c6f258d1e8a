/* chorusctl logs JOB [--rank R] [--generation G] [--follow] [--dir DIR]: print the rank
 * logs of a job. workerd writes rank r of generation g to RUN_DIR/JOB/g<g>/rank-<r>.log
 * and serves it over its link to the coordinator (a LogRead, one chunk at a time), so this
 * works from any machine that reaches the coordinator, as the job's owner or root. Every
 * generation is shown, oldest first, so a restarted job's earlier failures stay visible
 * (an older generation's log is read from the node its rank runs on now). --follow prints
 * the current generation as it grows, each line prefixed with its rank when there are
 * several, moving to the next generation on a restart, until the job ends.
 *
 * --dir DIR reads a local cluster's files directly: `local up` gives node N the run dir
 * DIR/N, so the files are DIR/<node>/JOB/g<g>/... */
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/client.h"
#include "common/err.h"
#include "common/msg.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"

#define LOG_MAX (256u << 20)

/* Rank and node of DIR/<node>/JOB/g<g>/rank-<r>.log. */
static int parse_log_path(const char *path, size_t dirlen, char *node, size_t n, long *rank)
{
    const char *p = path + dirlen + 1, *slash = strchr(p, '/');
    const char *base = strrchr(path, '/');
    if (!slash || !base || (size_t)(slash - p) >= n)
        return -EINVAL;
    memcpy(node, p, (size_t)(slash - p));
    node[slash - p] = '\0';
    char num[32];
    if (sscanf(base, "/rank-%31[0-9].log", num) != 1)
        return -EINVAL;
    return ctl_parse_long(num, 0, INT32_MAX, rank);
}

static int by_rank(const void *a, const void *b)
{
    const char *pa = strrchr(*(char *const *)a, '/'), *pb = strrchr(*(char *const *)b, '/');
    long ra = strtol(pa + 6, NULL, 10), rb = strtol(pb + 6, NULL, 10);
    return (ra > rb) - (ra < rb);
}

/* Print (or add to j) every log of one generation; returns how many. */
static size_t show_generation(const char *dir, const char *job, uint64_t gen, long rank,
                              ctl_json_t *j, int many)
{
    char pattern[PATH_MAX], rk[32] = "*";
    glob_t g;
    size_t shown = 0;

    if (rank >= 0)
        snprintf(rk, sizeof rk, "%ld", rank);
    snprintf(pattern, sizeof pattern, "%s/*/%s/g%" PRIu64 "/rank-%s.log", dir, job, gen, rk);
    if (glob(pattern, 0, NULL, &g) != 0)
        return 0;
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_rank);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *text = NULL, node[256];
        size_t len = 0;
        long r = 0;
        if (parse_log_path(g.gl_pathv[i], strlen(dir), node, sizeof node, &r) < 0 ||
            ch_file_read(g.gl_pathv[i], LOG_MAX, &text, &len) < 0)
            continue;
        if (j) {
            ctl_json_obj_begin(j);
            ctl_json_kint(j, "rank", r);
            ctl_json_kuint(j, "generation", gen);
            ctl_json_kstr(j, "node", node);
            ctl_json_kstr(j, "path", g.gl_pathv[i]);
            ctl_json_kstr(j, "text", text);
            ctl_json_obj_end(j);
        } else {
            if (many)
                printf("==> rank %ld, generation %" PRIu64 ", %s (%s) <==\n", r, gen, node,
                       g.gl_pathv[i]);
            fwrite(text, 1, len, stdout);
            if (many && len && text[len - 1] != '\n')
                printf("\n");
        }
        free(text);
        shown++;
    }
    globfree(&g);
    return shown;
}

/* A local cluster's files under dir (--dir). */
static int logs_local(const ctl_t *ctl, const Chorus__JobInfo *ji, const char *dir, long rank)
{
    ctl_json_t j;
    size_t shown = 0;
    int many = rank < 0 || ji->generation > 0;
    if (ctl->json) {
        ctl_json_init(&j, stdout);
        ctl_json_arr_begin(&j);
    }
    for (uint64_t g = 0; g <= ji->generation; g++)
        shown += show_generation(dir, ji->id, g, rank, ctl->json ? &j : NULL, many);
    if (ctl->json) {
        ctl_json_arr_end(&j);
        ctl_json_finish(&j);
    }
    if (shown == 0 && !ctl->json) {
        ctl_errf("%s: no rank logs under %s/*/%s/", ji->id, dir, ji->id);
        return CTL_EXIT_FAILED;
    }
    return CTL_EXIT_OK;
}

// ----------------------------------------------------------------------------
// served by workerd

#define CHUNK          (256u << 10)
#define FOLLOW_IDLE_MS 250

/* One chunk of rank r's log of generation g from offset: 0 and *out (a LogChunk), or a
 * negative code (the Error's; its message into err). */
static int read_chunk(ch_client_t *cl, const char *job, uint64_t g, uint32_t r, uint64_t off,
                      Chorus__Envelope **out, char *err, size_t errlen)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__LogRead lr = CHORUS__LOG_READ__INIT;
    lr.job_id = (char *)job;
    lr.generation = g;
    lr.rank = r;
    lr.offset = off;
    lr.max_bytes = CHUNK;
    req.body_case = CHORUS__ENVELOPE__BODY_LOG_READ;
    req.log_read = &lr;
    int rc = ch_client_call(cl, &req, CTL_CALL_TIMEOUT_MS, &resp);
    if (resp && resp->body_case == CHORUS__ENVELOPE__BODY_ERROR) {
        snprintf(err, errlen, "%s", resp->error->message ? resp->error->message : "");
        rc = resp->error->code < 0 ? resp->error->code : CH_E_FORMAT;
    } else if (rc == 0 && (!resp || resp->body_case != CHORUS__ENVELOPE__BODY_LOG_CHUNK)) {
        snprintf(err, errlen, "unexpected reply %s", resp ? ch_msg_name(resp) : "none");
        rc = CH_E_FORMAT;
    } else if (rc < 0) {
        snprintf(err, errlen, "%s", ch_strerror(rc));
    }
    if (rc < 0) {
        if (resp)
            ch_msg_free(resp);
        return rc;
    }
    *out = resp;
    return 0;
}

/* Print data, each line prefixed with "[rank R] " when prefix; *bol: at a line's start. */
static void print_prefixed(const uint8_t *data, size_t len, long prefix, int *bol)
{
    for (size_t i = 0; i < len; i++) {
        if (*bol && prefix >= 0)
            printf("[rank %ld] ", prefix);
        putchar(data[i]);
        *bol = data[i] == '\n';
    }
}

/* The whole log of rank r in generation g: 1 shown, 0 none there, or an exit status
 * (negative) after a message. */
static int show_remote(const ctl_t *ctl, ch_client_t *cl, const char *job, uint64_t g, uint32_t r,
                       ctl_json_t *j, int many)
{
    char err[512];
    uint64_t off = 0, size = 1;
    int head = 0, bol = 1;
    char *text = NULL; /* JSON: the whole log */
    size_t tlen = 0;
    int ret;
    while (off < size) {
        Chorus__Envelope *resp = NULL;
        int rc = read_chunk(cl, job, g, r, off, &resp, err, sizeof err);
        if (rc == -ENOENT && !head) {
            ret = 0; /* not on that node: this rank ran elsewhere in generation g */
            goto out;
        }
        if (rc < 0) {
            ctl_errf("%s: rank %u, generation %" PRIu64 ": %s", job, r, g, err);
            ret = -(rc == -ETIMEDOUT || rc == -ENOTCONN ? CTL_EXIT_UNREACHABLE : CTL_EXIT_FAILED);
            goto out;
        }
        const Chorus__LogChunk *lc = resp->log_chunk;
        if (!head && j) {
            ctl_json_obj_begin(j);
            ctl_json_kint(j, "rank", r);
            ctl_json_kuint(j, "generation", g);
            ctl_json_kstr(j, "node", lc->node);
            ctl_json_kstr(j, "path", lc->path);
            ctl_json_key(j, "text");
        } else if (!head && many) {
            printf("==> rank %u, generation %" PRIu64 ", %s (%s) <==\n", r, g, lc->node, lc->path);
        }
        head = 1;
        size = lc->size;
        if (j) { /* the text is one string: gathered whole (a log is small next to memory) */
            char *more = realloc(text, tlen + lc->data.len + 1);
            if (!more) {
                ch_msg_free(resp);
                ctl_errf("out of memory");
                ret = -CTL_EXIT_FAILED;
                goto out;
            }
            text = more;
            memcpy(text + tlen, lc->data.data, lc->data.len);
            tlen += lc->data.len;
            text[tlen] = '\0';
        } else {
            print_prefixed(lc->data.data, lc->data.len, -1, &bol);
        }
        off += lc->data.len;
        if (lc->data.len == 0)
            size = off;
        ch_msg_free(resp);
    }
    if (j && head) {
        ctl_json_str(j, text ? text : "");
        ctl_json_obj_end(j);
    } else if (many && head && !bol) {
        printf("\n");
    }
    ret = head;
out:
    free(text);
    (void)ctl;
    return ret;
}

/* Print what each followed rank's log gained; *grew: whether any did. An exit status. */
static int follow_pass(ch_client_t *cl, const char *job, uint64_t g, uint32_t lo, uint32_t hi,
                       uint64_t *off, int *bol, int many, int *grew)
{
    char err[512];
    for (uint32_t r = lo; r < hi; r++) {
        Chorus__Envelope *resp = NULL;
        int rc = read_chunk(cl, job, g, r, off[r - lo], &resp, err, sizeof err);
        if (rc == -ENOENT)
            continue; /* not started yet */
        if (rc < 0) {
            ctl_errf("%s: rank %u: %s", job, r, err);
            return rc == -ETIMEDOUT || rc == -ENOTCONN ? CTL_EXIT_UNREACHABLE : CTL_EXIT_FAILED;
        }
        const Chorus__LogChunk *lc = resp->log_chunk;
        print_prefixed(lc->data.data, lc->data.len, many ? (long)r : -1, &bol[r - lo]);
        off[r - lo] += lc->data.len;
        *grew |= lc->data.len > 0;
        ch_msg_free(resp);
    }
    fflush(stdout);
    return CTL_EXIT_OK;
}

/* --follow: the current generation (or gen) as it grows, until the job ends. */
static int follow(const ctl_t *ctl, ch_client_t *cl, const char *job, uint64_t gen, long rank)
{
    Chorus__Envelope *resp = NULL;
    uint64_t *off = NULL, g = 0;
    char id[64] = "";
    int *bol = NULL, st = CTL_EXIT_OK, active = 1, last_pass = 0;
    uint32_t lo = 0, hi = 0;
    for (;;) {
        if ((st = ctl_query_job(ctl, cl, job, &resp)) != CTL_EXIT_OK)
            break;
        const Chorus__JobInfo *ji = resp->job_info;
        uint64_t want = gen ? gen : ji->generation;
        active = !ctl_job_state_final(ji->state);
        snprintf(id, sizeof id, "%s", ji->id);
        if (want != g || !off) { /* a restart: the new generation's logs from their start */
            g = want;
            lo = rank >= 0 ? (uint32_t)rank : 0;
            hi = rank >= 0 ? lo + 1 : ji->world_size;
            free(off);
            free(bol);
            off = calloc(hi - lo + 1, sizeof *off);
            bol = calloc(hi - lo + 1, sizeof *bol);
            if (!off || !bol) {
                ctl_errf("out of memory");
                st = CTL_EXIT_FAILED;
                break;
            }
            for (uint32_t i = 0; i < hi - lo; i++)
                bol[i] = 1;
        }
        ch_msg_free(resp);
        resp = NULL;
        int grew = 0;
        if (g > 0 &&
            (st = follow_pass(cl, id, g, lo, hi, off, bol, hi - lo > 1, &grew)) != CTL_EXIT_OK)
            break;
        if (!active && !grew) { /* ended, and one pass after the end found nothing new */
            if (last_pass++)
                break;
            continue;
        }
        if (!grew)
            ctl_pause_ms(FOLLOW_IDLE_MS);
    }
    if (resp)
        ch_msg_free(resp);
    free(off);
    free(bol);
    return st;
}

enum { OPT_RANK = 256, OPT_GENERATION, OPT_DIR };

const ctl_opt_t ctl_opts_logs[] = {
    {"rank", OPT_RANK, "R", "rank R only"},
    {"generation", OPT_GENERATION, "G", "generation G only (1 is the first run)"},
    {"follow", 'f', NULL, "the current generation as it grows, until the job ends"},
    {"dir", OPT_DIR, "DIR", "read a local cluster's files (chorusctl local's DIR)"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_logs(ctl_t *ctl, int argc, char **argv)
{
    const char *job = NULL, *dir = NULL;
    long rank = -1, gen = 0;
    int follow_on = 0;
    ch_client_t *cl = NULL;
    Chorus__Envelope *resp = NULL;

    ctl_args_t a;
    const char *val;
    int c;
    if (ctl_args_begin(&a, "logs", ctl_opts_logs, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &val)) > 0) {
        if (c == 'f')
            follow_on = 1;
        else if (c == OPT_DIR)
            dir = val;
        else if (c == OPT_RANK && ctl_parse_long(val, 0, INT32_MAX, &rank) < 0)
            goto usage;
        else if (c == OPT_GENERATION && ctl_parse_long(val, 1, INT32_MAX, &gen) < 0)
            goto usage;
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    job = a.npos == 1 ? a.pos[0] : NULL;
    if (!job || (follow_on && dir))
        goto usage;
    int st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        return st;
    if (follow_on) {
        st = follow(ctl, cl, job, (uint64_t)gen, rank);
        ch_client_destroy(cl);
        return st;
    }
    st = ctl_query_job(ctl, cl, job, &resp);
    if (st != CTL_EXIT_OK) {
        ch_client_destroy(cl);
        return st;
    }
    const Chorus__JobInfo *ji = resp->job_info;
    if (dir) {
        st = logs_local(ctl, ji, dir, rank);
    } else {
        ctl_json_t j;
        int many = rank < 0 || ji->generation > 1 || gen == 0, shown = 0;
        uint64_t g0 = gen ? (uint64_t)gen : 1, g1 = gen ? (uint64_t)gen : ji->generation;
        uint32_t lo = rank >= 0 ? (uint32_t)rank : 0, hi = rank >= 0 ? lo + 1 : ji->world_size;
        if (ctl->json) {
            ctl_json_init(&j, stdout);
            ctl_json_arr_begin(&j);
        }
        for (uint64_t g = g0; g <= g1 && st == CTL_EXIT_OK; g++) {
            for (uint32_t r = lo; r < hi; r++) {
                int got = show_remote(ctl, cl, ji->id, g, r, ctl->json ? &j : NULL, many);
                if (got < 0) {
                    st = -got;
                    break;
                }
                shown += got;
            }
        }
        if (ctl->json) {
            ctl_json_arr_end(&j);
            ctl_json_finish(&j);
        }
        if (st == CTL_EXIT_OK && shown == 0 && !ctl->json) {
            ctl_errf("%s: no rank logs yet", ji->id);
            st = CTL_EXIT_FAILED;
        }
    }
    ch_msg_free(resp);
    ch_client_destroy(cl);
    return st;
usage:
    ctl_usage("logs");
    return CTL_EXIT_USAGE;
}
