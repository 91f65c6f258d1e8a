/* common/run.c: run folders keyed by job.name, run.json, the newest committed step, and
 * the check of a job against the filesystem (which run it continues, what it refuses). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/run.h"
#include "common/util.h"
#include "support.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("run", dir, sizeof dir), 0);
}

static void teardown(void)
{
    chmod(dir, 0755);
    ts_rmrf(dir);
}

TestSuite(run, .init = setup, .fini = teardown);

static void spec_in(ch_jobspec_t *s, const char *name, const char *resume)
{
    ch_jobspec_defaults(s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->checkpoint.dir, sizeof s->checkpoint.dir, "%s/ckpt", dir);
    snprintf(s->train.resume, sizeof s->train.resume, "%s", resume);
}

/* A committed step of folder: its manifest (the model check reads no shard here: the
 * tests below that need one write it through ch_run_check's refusal path instead). */
static void commit_step(const char *folder, int step)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/step-%08d", folder, step);
    cr_assert_eq(ch_mkdirs(path, 0755), 0);
    snprintf(path, sizeof path, "%s/step-%08d/manifest.json", folder, step);
    cr_assert_eq(ch_file_write_atomic(path, "{}", 2, 0644), 0);
}

Test(run, folder_is_the_job_name_and_run_json_round_trips)
{
    ch_jobspec_t s;
    char folder[1100], err[512] = "";
    spec_in(&s, "gpt", "");
    cr_assert_eq(ch_run_folder(&s, folder, sizeof folder), 0);
    cr_assert(strstr(folder, "/ckpt/gpt") != NULL, "%s", folder);

    ch_run_t a = {0}, b;
    ch_run_new_id(a.id);
    cr_assert(strncmp(a.id, "r-", 2) == 0 && strlen(a.id) == 18, "%s", a.id);
    snprintf(a.name, sizeof a.name, "gpt");
    a.layers = 12;
    a.heads = 12;
    a.embd = 768;
    a.vocab = 50257;
    a.seq_len = 1024;
    cr_assert_eq(ch_mkdirs(folder, 0755), 0);
    cr_assert_eq(ch_run_read(folder, &b, err, sizeof err), -ENOENT);
    cr_assert_eq(ch_run_write(folder, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ch_run_read(folder, &b, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(b.id, a.id);
    cr_expect_eq(b.vocab, 50257);
    cr_expect_eq(b.seq_len, 1024);
}

Test(run, newest_committed_step_ignores_uncommitted_ones)
{
    char folder[600];
    uint64_t step = 0;
    snprintf(folder, sizeof folder, "%s/ckpt/gpt", dir);
    cr_assert_eq(ch_run_latest(folder, &step), CH_E_NOTFOUND);
    commit_step(folder, 20);
    commit_step(folder, 100);
    char partial[700];
    snprintf(partial, sizeof partial, "%s/step-00000200", folder); /* no manifest */
    cr_assert_eq(ch_mkdirs(partial, 0755), 0);
    cr_assert_eq(ch_run_latest(folder, &step), 0);
    cr_expect_eq(step, 100);
}

Test(run, a_fresh_job_is_refused_in_another_runs_folder_and_auto_continues_it)
{
    ch_jobspec_t s;
    ch_run_resume_t res;
    char folder[1100], err[1024] = "";
    spec_in(&s, "gpt", "");
    cr_assert_eq(ch_run_check(&s, 0, &res, err, sizeof err), 0, "%s", err);
    cr_expect_eq(res.run_id[0], '\0', "nothing to continue: a new run");
    cr_expect_eq(res.step_dir[0], '\0');

    ch_run_t run = {.layers = 4, .heads = 4, .embd = 128, .vocab = 32, .seq_len = 64};
    snprintf(run.id, sizeof run.id, "r-00000000000000aa");
    cr_assert_eq(ch_run_folder(&s, folder, sizeof folder), 0);
    cr_assert_eq(ch_mkdirs(folder, 0755), 0);
    cr_assert_eq(ch_run_write(folder, &run, err, sizeof err), 0);
    cr_assert_eq(ch_run_check(&s, 0, &res, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "holds run r-00000000000000aa") && strstr(err, "train.resume = auto"),
              "%s", err);

    spec_in(&s, "gpt", "auto"); /* no committed step yet: the run starts */
    cr_assert_eq(ch_run_check(&s, 0, &res, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(res.run_id, "r-00000000000000aa");
    cr_expect_eq(res.step_dir[0], '\0');

    /* a rank of another run (its job stamped with another id) refuses the folder */
    snprintf(s.checkpoint.run_id, sizeof s.checkpoint.run_id, "r-00000000000000bb");
    cr_assert_eq(ch_run_check(&s, 1, &res, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "not this job's run r-00000000000000bb"), "%s", err);
}

Test(run, a_resume_path_without_a_committed_step_is_refused)
{
    ch_jobspec_t s;
    ch_run_resume_t res;
    char err[1024] = "", empty[600];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    cr_assert_eq(ch_mkdirs(empty, 0755), 0);
    spec_in(&s, "gpt", empty);
    cr_assert_eq(ch_run_check(&s, 0, &res, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "train.resume") && strstr(err, "no committed checkpoint"), "%s", err);
    commit_step(empty, 7); /* a manifest but no shard: its model cannot be checked */
    cr_assert_eq(ch_run_check(&s, 0, &res, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "rank-00000.safetensors"), "%s", err);
}

Test(run, an_unwritable_folder_is_refused_naming_path_and_user)
{
    ch_jobspec_t s;
    char err[1024] = "", ro[600];
    if (geteuid() == 0)
        cr_skip_test("root writes anywhere");
    snprintf(ro, sizeof ro, "%s/ro", dir);
    cr_assert_eq(mkdir(ro, 0555), 0);
    spec_in(&s, "gpt", "");
    snprintf(s.checkpoint.dir, sizeof s.checkpoint.dir, "%s/sub", ro);
    cr_assert_eq(ch_run_check(&s, 0, NULL, err, sizeof err), -EACCES);
    cr_expect(strstr(err, "checkpoint.dir") && strstr(err, ro) && strstr(err, "uid"), "%s", err);
    cr_assert_eq(ch_run_check(&s, 1, NULL, err, sizeof err), -EACCES); /* a rank: mkdir */
    cr_expect(strstr(err, "cannot create"), "%s", err);
    chmod(ro, 0755);
}
