/* coordinatord/runs.c: the submit-time check runs as the job's user (a child process takes
 * its uid when the coordinator is root), stamps the run id, and refuses a folder another
 * active job writes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/run.h"
#include "common/util.h"
#include "coord.h"
#include "runs.h"
#include "support.h"

static char dir[512];
static coord_t coord; /* no jobs, no loop: what coord_runs_stamp reads */

static void setup(void)
{
    memset(&coord, 0, sizeof coord);
    cr_assert_eq(ts_tmpdir("runs", dir, sizeof dir), 0);
}

static void teardown(void)
{
    char ro[600];
    snprintf(ro, sizeof ro, "%s/closed", dir);
    chmod(ro, 0755);
    ts_rmrf(dir);
}

TestSuite(runs, .init = setup, .fini = teardown);

static void train_spec(ch_jobspec_t *s, const char *ckpt)
{
    ch_jobspec_defaults(s);
    snprintf(s->name, sizeof s->name, "gpt");
    snprintf(s->checkpoint.dir, sizeof s->checkpoint.dir, "%s", ckpt);
    s->owner.uid = s->run_as.uid = (int64_t)geteuid();
    s->owner.gid = s->run_as.gid = (int64_t)getegid();
}

Test(runs, stamps_a_new_run_and_keeps_a_continued_ones_id)
{
    ch_jobspec_t s;
    char ckpt[600], folder[1100], err[512] = "";
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    train_spec(&s, ckpt);
    cr_assert_eq(coord_runs_stamp(&coord, &s, err, sizeof err), 0, "%s", err);
    cr_assert(strncmp(s.checkpoint.run_id, "r-", 2) == 0, "%s", s.checkpoint.run_id);

    ch_run_t run = {.layers = 4, .heads = 4, .embd = 128, .vocab = 32, .seq_len = 64};
    snprintf(run.id, sizeof run.id, "r-00000000000000cc");
    cr_assert_eq(ch_run_folder(&s, folder, sizeof folder), 0);
    cr_assert_eq(ch_mkdirs(folder, 0755), 0);
    cr_assert_eq(ch_run_write(folder, &run, err, sizeof err), 0);
    train_spec(&s, ckpt);
    snprintf(s.train.resume, sizeof s.train.resume, "auto");
    cr_assert_eq(coord_runs_stamp(&coord, &s, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(s.checkpoint.run_id, "r-00000000000000cc");
}

/* The Slurm case: root submits, the job runs as nobody, who cannot create the folder. As
 * another user the check is the same with that user's own permissions. */
Test(runs, refuses_a_folder_the_jobs_user_cannot_write_naming_path_and_user)
{
    ch_jobspec_t s;
    char closed[600], ckpt[700], err[1024] = "";
    snprintf(closed, sizeof closed, "%s/closed", dir);
    cr_assert_eq(mkdir(closed, geteuid() == 0 ? 0700 : 0555), 0);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", closed);
    train_spec(&s, ckpt);
    const char *who = "uid";
    if (geteuid() == 0) { /* the job's user: nobody */
        s.run_as.uid = s.run_as.gid = 65534;
        who = "(uid 65534)";
    }
    cr_assert_eq(coord_runs_stamp(&coord, &s, err, sizeof err), -EACCES, "%s", err);
    cr_expect(strstr(err, "checkpoint.dir") && strstr(err, closed) && strstr(err, who), "%s", err);
}
