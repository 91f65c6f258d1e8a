/* Bad job files are refused with the field and the reason, and nothing is queued. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

TestSuite(jobfiles, .fini = h_teardown, .timeout = 60);

typedef struct bad_job {
    const char *what;
    const char *text;
    const char *field;  /* stderr must name it */
    const char *reason; /* and say this */
} bad_job_t;

static const bad_job_t bad_jobs[] = {
    {"unknown key", "[job]\nkind = diag\n[model]\nbogus_knob = 3\n", "bogus_knob", "unknown key"},
    {"heads not divisible by tp",
     "[job]\nkind = diag\n[model]\nheads = 6\nembd = 96\n"
     "[parallel]\ntp = 4\n",
     "parallel.tp", "not divisible"},
    {"more ranks than slots", "[job]\nkind = diag\n[parallel]\ntp = 2\ndp = 4\n", "world size 8",
     "slots"},
    {"negative steps", "[train]\nsteps = -5\n", "steps", "must be"},
    {"missing data file", "[train]\ndata = /nonexistent/chorus/tokens.bin\n", "train.data",
     "No such file"},
};

Test(jobfiles, bad_job_files_are_refused)
{
    h_cluster_t c;
    h_out_t o;
    char path[PATH_MAX + 32];

    cr_assert_eq(h_cluster_up(&c, 2, 2), 0); /* 4 slots */
    for (size_t i = 0; i < sizeof bad_jobs / sizeof bad_jobs[0]; i++) {
        const bad_job_t *b = &bad_jobs[i];
        snprintf(path, sizeof path, "%s/bad%zu.ini", c.dir, i);
        cr_assert_eq(h_write_file(path, b->text), 0);
        cr_assert_eq(h_ctl(&c, &o, "submit", path, NULL), 0);
        cr_assert(o.status == 78 || o.status == 2, "%s: exit %d (stderr: %s)", b->what, o.status,
                  o.err);
        cr_assert(h_has(o.err, b->field) && h_has(o.err, b->reason),
                  "%s: stderr does not name '%s' and '%s': %s", b->what, b->field, b->reason,
                  o.err);
        cr_assert(h_has(o.err, path), "%s: stderr does not name the file: %s", b->what, o.err);
        cr_assert_eq(o.out[0], '\0', "%s: printed a job id: %s", b->what, o.out);
        h_out_free(&o);
    }

    /* An override that breaks a good file is refused the same way. */
    snprintf(path, sizeof path, "%s/good.ini", c.dir);
    cr_assert_eq(h_write_file(path, "[job]\nkind = diag\n[parallel]\ntp = 2\n"), 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", path, "--set", "parallel.tp=3", NULL), 0);
    cr_assert_eq(o.status, 78, "--set tp=3: exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.err, "parallel.tp"), "%s", o.err);
    h_out_free(&o);
    /* A usage error is not a config error. */
    cr_assert_eq(h_ctl(&c, &o, "submit", NULL), 0);
    cr_assert_eq(o.status, 2, "submit without a file: exit %d", o.status);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "submit", "/nonexistent/job.ini", NULL), 0);
    cr_assert_eq(o.status, 78, "missing job file: exit %d", o.status);
    h_out_free(&o);

    ch_json_t *jobs = h_ctl_json(&c, "jobs", NULL);
    cr_assert_not_null(jobs);
    cr_assert_eq(jobs->type, CH_JSON_ARRAY);
    cr_assert_eq(jobs->nkids, 0, "%zu jobs were queued", jobs->nkids);
    ch_json_free(jobs);
}
