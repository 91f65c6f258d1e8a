/* chorusctl logs JOB [--rank R] [--dir DIR]: print the rank logs of a job run by a local
 * cluster. workerd writes rank r of generation g to RUN_DIR/JOB/g<g>/rank-<r>.log, and
 * `local up` gives node N the run dir DIR/N, so the files are DIR/<node>/JOB/g<g>/...;
 * DIR defaults to the directory of the control socket. Every generation is shown, oldest
 * first, so a restarted job's earlier failures stay visible. */
#include <glob.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int ctl_cmd_logs(ctl_t *ctl, int argc, char **argv)
{
    const char *job = NULL, *dir = NULL;
    char sockdir[PATH_MAX];
    long rank = -1;
    ch_client_t *cl = NULL;
    Chorus__Envelope *resp = NULL;

    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--rank") == 0 && i + 1 < argc) {
            if (ctl_parse_long(argv[++i], 0, INT32_MAX, &rank) < 0)
                goto usage;
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (argv[i][0] != '-' && !job) {
            job = argv[i];
        } else {
            goto usage;
        }
    }
    if (!job)
        goto usage;
    if (!dir) {
        const char *s = ctl->coordinator ? NULL : ctl->socket_path;
        size_t n = s ? strlen(s) : 0;
        if (n < 9 || strcmp(s + n - 9, "/ctl.sock") != 0 || n >= sizeof sockdir) {
            ctl_errf("logs reads a local cluster's files: pass --dir DIR (the 'local up' dir)");
            return CTL_EXIT_USAGE;
        }
        snprintf(sockdir, sizeof sockdir, "%s", s);
        dir = dirname(sockdir);
    }
    int st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        return st;
    st = ctl_query_job(ctl, cl, job, &resp);
    ch_client_destroy(cl);
    if (st != CTL_EXIT_OK)
        return st;
    const Chorus__JobInfo *ji = resp->job_info;
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
        ctl_errf("%s: no rank logs under %s/*/%s/", job, dir, ji->id);
        st = CTL_EXIT_FAILED;
    }
    ch_msg_free(resp);
    return st;
usage:
    ctl_errf("usage: chorusctl logs JOB [--rank R] [--dir DIR]");
    return CTL_EXIT_USAGE;
}
