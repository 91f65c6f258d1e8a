/* Collective self-check jobs (`[diag] collectives = yes`) on a local cluster: every rank
 * checks allreduce, reduce_scatter, allgather, broadcast and barrier in each group of the
 * layout and reports their bus bandwidth as "busbw.<group>.<op>" in GB/s (workerd/diag_coll.c),
 * which `status --json` shows per rank. The figures are printed for the CI log. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

TestSuite(collectives, .fini = h_teardown, .timeout = 120);

static const char *const timed_ops[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
enum { NOPS = sizeof timed_ops / sizeof timed_ops[0] };

/* A diag job with collective checks timed on 1 MiB buffers, in layout tp x pp x dp. */
static void write_job(const char *path, const char *name, int tp, int pp, int dp)
{
    char text[512];
    snprintf(text, sizeof text,
             "[job]\nname = %s\nkind = diag\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 64\n"
             "[parallel]\ntp = %d\npp = %d\ndp = %d\n"
             "[diag]\nrounds = 1\ngemm_size = 64\ncollectives = yes\nbytes = 1048576\n",
             name, tp, pp, dp);
    cr_assert_eq(h_write_file(path, text), 0);
}

/* Run the job to completion and check that every rank reports a positive busbw for each
 * op in each of the named groups (groups of one member time nothing and are not named). */
static void run_and_check(const char *name, int tp, int pp, int dp, const char *const groups[],
                          size_t ngroups)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX + 16], id[64], metric[64];
    int world = tp * pp * dp;

    cr_assert_eq(h_cluster_up(&c, 2, 2), 0, "local up failed");
    snprintf(job, sizeof job, "%s/%s.ini", c.dir, name);
    write_job(job, name, tp, pp, dp);

    int st = h_submit_wait(&c, &o, job, id, sizeof id);
    cr_assert_eq(st, 0, "submit --wait: exit %d\n%s%s", st, o.out, o.err);
    cr_assert(id[0] == 'j', "no job id in: %s", o.out);
    h_out_free(&o);

    ch_json_t *js = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(js);
    cr_assert_str_eq(h_json_str(js, "state"), "completed", "reason: %s", h_json_str(js, "reason"));
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    cr_assert(ranks && ranks->type == CH_JSON_ARRAY && ranks->nkids == (size_t)world,
              "want %d ranks", world);
    fprintf(stderr, "collectives %s (tp=%d pp=%d dp=%d, 1 MiB, UCX on 127.0.0.1), busbw GB/s:\n",
            name, tp, pp, dp);
    /* Every rank's figures are printed before any is judged, so a failure shows them all. */
    char bad[128] = "";
    for (size_t i = 0; i < ranks->nkids; i++) {
        const ch_json_t *r = h_json_at(ranks, i);
        double rank = h_json_num(r, "rank");
        fprintf(stderr, "  rank %g on %s:", rank, h_json_str(r, "node"));
        for (size_t g = 0; g < ngroups; g++) {
            for (size_t k = 0; k < NOPS; k++) {
                snprintf(metric, sizeof metric, "busbw.%s.%s", groups[g], timed_ops[k]);
                double v = h_json_num(r, metric);
                fprintf(stderr, " %s=%.3f", metric + strlen("busbw."), v);
                if (!(v > 0) && !bad[0])
                    snprintf(bad, sizeof bad, "rank %g reports %s = %g (nan: absent)", rank, metric,
                             v);
            }
        }
        fprintf(stderr, "\n");
    }
    cr_assert_eq(bad[0], '\0', "%s", bad);
    ch_json_free(js);
}

Test(collectives, tp_and_dp_groups_report_bus_bandwidth)
{
    static const char *const groups[] = {"world", "tp", "dp"};
    run_and_check("coll-tp2-dp2", 2, 1, 2, groups, sizeof groups / sizeof groups[0]);
}

Test(collectives, pipeline_groups_report_bus_bandwidth)
{
    static const char *const groups[] = {"world", "pp", "dp"};
    run_and_check("coll-pp2-dp2", 1, 2, 2, groups, sizeof groups / sizeof groups[0]);
}
