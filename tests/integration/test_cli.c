/* chorusctl's conventions, as a user meets them: `help COMMAND` and `COMMAND --help` give
 * that command's usage, bash completion offers commands and each command's flags, and every
 * --json document says its schema. */
#include <criterion/criterion.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "harness.h"
#include "support.h"

TestSuite(cli, .fini = h_teardown, .timeout = 120);

Test(cli, help_and_command_help_give_the_commands_usage)
{
    h_out_t a, b, o;
    cr_assert_eq(h_ctl(NULL, &a, "help", "submit", NULL), 0);
    cr_expect_eq(a.status, 0);
    cr_expect(strncmp(a.out, "usage: chorusctl submit JOBFILE", 31) == 0, "%s", a.out);
    cr_assert_eq(h_ctl(NULL, &b, "submit", "--help", NULL), 0);
    cr_expect_eq(b.status, 0);
    cr_expect_str_eq(b.out, a.out, "help submit and submit --help differ");
    h_out_free(&a);
    h_out_free(&b);

    cr_assert_eq(h_ctl(NULL, &o, "help", "logs", NULL), 0);
    cr_expect(strstr(o.out, "-f, --follow") && strstr(o.out, "--generation G"),
              "help lists the command's options from its table: %s", o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "help", "plan", NULL), 0);
    cr_expect(strstr(o.out, "chorusctl plan JOBFILE") && strstr(o.out, "chorusctl plan --auto"),
              "both plan forms: %s", o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "help", "no-such-command", NULL), 0);
    cr_expect_eq(o.status, 2, "an unknown command is a usage error");
    cr_expect(strstr(o.err, "unknown command 'no-such-command'"), "%s", o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "--version", NULL), 0);
    cr_expect_eq(o.status, 0);
    cr_expect(strncmp(o.out, "chorusctl (Chorus) ", 19) == 0, "%s", o.out);
    h_out_free(&o);
}

/* What bash offers after `words` (the last one being completed). */
static void complete(const char *script, const char *words, char *out, size_t n)
{
    char cmd[1024];
    h_out_t o;
    snprintf(cmd, sizeof cmd,
             "source '%s'; COMP_WORDS=(%s); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); "
             "_chorusctl; echo \"${COMPREPLY[*]}\"",
             script, words);
    char *argv[] = {"/bin/bash", "-c", cmd, NULL};
    cr_assert_eq(h_run(&o, 10000, argv), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    snprintf(out, n, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
}

Test(cli, bash_completion_offers_commands_and_their_flags)
{
    char dir[512], script[600], got[1024];
    h_out_t o;
    cr_assert_eq(ts_tmpdir("cli", dir, sizeof dir), 0);
    snprintf(script, sizeof script, "%s/chorusctl.bash", dir);
    cr_assert_eq(h_ctl(NULL, &o, "completion", "bash", NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    cr_assert_eq(ch_file_write_atomic(script, o.out, strlen(o.out), 0644), 0);
    h_out_free(&o);

    complete(script, "chorusctl su", got, sizeof got);
    cr_expect_str_eq(got, "submit");
    complete(script, "chorusctl --socket /x/ctl.sock wa", got, sizeof got);
    cr_expect_str_eq(got, "watch", "the global option's value is skipped");
    complete(script, "chorusctl status j1 --r", got, sizeof got);
    cr_expect_str_eq(got, "--ranks --rank");
    complete(script, "chorusctl plan x.ini --mem-", got, sizeof got);
    cr_expect_str_eq(got, "--mem-per-slot --mem-reserve", "plan --auto's cluster options");
    complete(script, "chorusctl help ca", got, sizeof got);
    cr_expect_str_eq(got, "cancel");
    cr_expect_eq(ts_rmrf(dir), 0);
}

static void expect_schema(const ch_json_t *obj, const char *what)
{
    cr_assert_not_null(obj, "%s printed no JSON", what);
    cr_expect_eq(h_json_num(obj, "schema"), 1.0, "%s lacks \"schema\": 1", what);
}

Test(cli, every_json_document_carries_its_schema)
{
    char dir[512], key[600], job[700];
    cr_assert_eq(ts_tmpdir("cli", dir, sizeof dir), 0);
    snprintf(key, sizeof key, "%s/k", dir);
    ch_json_t *j = h_ctl_json(NULL, "keygen", key, NULL);
    expect_schema(j, "keygen");
    ch_json_free(j);
    const char *src = getenv("CHORUS_SRC_DIR");
    snprintf(job, sizeof job, "%s/deploy/jobs/demo.ini", src ? src : ".");
    j = h_ctl_json(NULL, "plan", job, NULL);
    expect_schema(j, "plan");
    ch_json_free(j);
    cr_expect_eq(ts_rmrf(dir), 0);

    h_cluster_t c;
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    j = h_ctl_json(&c, "nodes", NULL);
    cr_assert_not_null(j);
    cr_assert_eq(j->type, CH_JSON_ARRAY, "nodes stays an array");
    cr_assert_eq(j->nkids, 2);
    for (size_t i = 0; i < j->nkids; i++)
        expect_schema(h_json_at(j, i), "each node of nodes");
    ch_json_free(j);
    h_cluster_down(&c);
}

/* jobs as squeue shows them: whose, how long, on how many nodes, and only those asked for. */
Test(cli, jobs_show_user_elapsed_nodes_and_filter_by_state_and_user)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX + 16];
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    snprintf(job, sizeof job, "%s/diag.ini", c.dir);
    cr_assert_eq(h_write_file(job, "[job]\nname = tiny\nkind = diag\n[parallel]\ndp = 2\n"
                                   "[diag]\nrounds = 1\ngemm_size = 64\n"),
                 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, "--wait", NULL), 0);
    cr_assert_eq(o.status, 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    struct passwd *pw = getpwuid(getuid());
    cr_assert_not_null(pw);

    cr_assert_eq(h_ctl(&c, &o, "jobs", NULL), 0);
    cr_expect(strstr(o.out, "USER") && strstr(o.out, "ELAPSED") && strstr(o.out, "NODES"), "%s",
              o.out);
    cr_expect(strstr(o.out, pw->pw_name), "the submitter is named: %s", o.out);
    h_out_free(&o);

    ch_json_t *j = h_ctl_json(&c, "jobs", "--state=completed", "--user", pw->pw_name, NULL);
    cr_assert(j && j->nkids == 1, "the completed job of this user");
    const ch_json_t *r = h_json_at(j, 0);
    cr_expect_str_eq(h_json_str(r, "user"), pw->pw_name);
    cr_expect_eq(h_json_num(r, "owner_uid"), (double)getuid());
    cr_expect_eq(h_json_num(r, "nodes"), 2.0, "dp 2 on 2 nodes of 1 slot");
    cr_expect(h_json_num(r, "elapsed_s") >= 0.0);
    ch_json_free(j);
    j = h_ctl_json(&c, "jobs", "--state", "queued,running", NULL);
    cr_assert(j && j->nkids == 0, "the job is neither queued nor running");
    ch_json_free(j);
    j = h_ctl_json(&c, "jobs", "--user", getuid() == 0 ? "65534" : "0", NULL);
    cr_assert(j && j->nkids == 0, "another user has no jobs");
    ch_json_free(j);
    cr_assert_eq(h_ctl(&c, &o, "jobs", "--user", "no-such-user-here", NULL), 0);
    cr_expect_eq(o.status, 2, "an unknown user is a usage error: %s", o.err);
    h_out_free(&o);
    h_cluster_down(&c);
}

static const char *node_state(const h_cluster_t *c, const char *name, const char **reason)
{
    static char state[32];
    ch_json_t *j = h_ctl_json(c, "nodes", NULL);
    state[0] = '\0';
    for (size_t i = 0; j && i < j->nkids; i++) {
        const ch_json_t *n = h_json_at(j, i);
        if (strcmp(h_json_str(n, "name"), name) != 0)
            continue;
        snprintf(state, sizeof state, "%s", h_json_str(n, "state"));
        static char why[128];
        snprintf(why, sizeof why, "%s", h_json_str(n, "drain_reason"));
        *reason = why;
    }
    ch_json_free(j);
    return state;
}

/* A drained node takes no new ranks, says why, and takes them again once resumed. */
Test(cli, drain_keeps_new_ranks_off_a_node_until_resume)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX + 16], id[64] = "";
    const char *reason = "";
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    cr_assert_eq(h_ctl(&c, &o, "drain", "node1", "--reason", "disk swap", NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    h_out_free(&o);
    cr_expect_str_eq(node_state(&c, "node1", &reason), "draining");
    cr_expect_str_eq(reason, "disk swap");

    snprintf(job, sizeof job, "%s/diag.ini", c.dir);
    cr_assert_eq(h_write_file(job, "[job]\nname = two\nkind = diag\n[parallel]\ndp = 2\n"
                                   "[diag]\nrounds = 1\ngemm_size = 64\n"),
                 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, " \n"), o.out);
    h_out_free(&o);
    ch_json_t *st = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(st);
    cr_expect_str_eq(h_json_str(st, "state"), "queued", "two slots needed, one placeable");
    ch_json_free(st);

    cr_assert_eq(h_ctl(&c, &o, "resume", "node1", NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    h_out_free(&o);
    cr_expect_str_eq(node_state(&c, "node1", &reason), "alive");
    cr_assert_eq(h_ctl(&c, &o, "watch", id, NULL), 0);
    cr_expect_eq(o.status, 0, "the job ran once node1 was back: %s%s", o.out, o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "drain", "no-such-node", NULL), 0);
    cr_expect_neq(o.status, 0);
    cr_expect(strstr(o.err, "no node"), "%s", o.err);
    h_out_free(&o);
    h_cluster_down(&c);
}

/* The same command line with "--opt=value" and with "--opt value": the same output. */
static void expect_same_out(const char *what, h_out_t *eq, h_out_t *sp)
{
    cr_expect_eq(eq->status, 0, "%s with --opt=value: %s", what, eq->err);
    cr_expect_eq(sp->status, 0, "%s with --opt value: %s", what, sp->err);
    cr_expect_str_eq(eq->out, sp->out, "%s: --opt=value and --opt value differ", what);
    h_out_free(eq);
    h_out_free(sp);
}

/* One parser for every command: --opt=value is --opt value, and options may follow the
 * positional words. */
Test(cli, opt_equals_value_is_opt_space_value_in_every_command)
{
    h_out_t a, b;
    char job[PATH_MAX + 16];
    const char *src = getenv("CHORUS_SRC_DIR");
    snprintf(job, sizeof job, "%s/deploy/jobs/demo.ini", src ? src : ".");

    cr_assert_eq(h_ctl(NULL, &a, "plan", "--set=train.steps=700", job, "--json", NULL), 0);
    cr_assert_eq(h_ctl(NULL, &b, "plan", job, "--set", "train.steps=700", "--json", NULL), 0);
    expect_same_out("plan --set", &a, &b);
    cr_assert_eq(h_ctl(NULL, &a, "plan", "--auto", job, "--nodes=2", "--slots-per-node=2",
                       "--top=1", "--mem-per-slot=1GiB", "--recompute=full", NULL),
                 0);
    cr_assert_eq(h_ctl(NULL, &b, "plan", "--auto", job, "--nodes", "2", "--slots-per-node", "2",
                       "--top", "1", "--mem-per-slot", "1GiB", "--recompute", "full", NULL),
                 0);
    expect_same_out("plan --auto", &a, &b);
    cr_assert_eq(h_ctl(NULL, &a, "jobfile", "--template", NULL), 0);
    cr_expect_eq(a.status, 0, "%s", a.err);
    h_out_free(&a);

    h_cluster_t c;
    char id[64];
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    snprintf(job, sizeof job, "%s/diag.ini", c.dir);
    cr_assert_eq(h_write_file(job, "[job]\nname = eq\nkind = diag\n[parallel]\ndp = 2\n"
                                   "[diag]\nrounds = 1\ngemm_size = 64\n"),
                 0);
    cr_assert_eq(h_submit_wait(&c, &a, job, id, sizeof id), 0);
    h_out_free(&a);
    cr_assert_eq(h_ctl(&c, &a, "status", id, "--rank=1", "--json", NULL), 0);
    cr_assert_eq(h_ctl(&c, &b, "status", "--rank", "1", id, "--json", NULL), 0);
    expect_same_out("status --rank", &a, &b);
    cr_assert_eq(h_ctl(&c, &a, "jobs", "--state=completed,failed", "--json", NULL), 0);
    cr_assert_eq(h_ctl(&c, &b, "jobs", "--state", "completed,failed", "--json", NULL), 0);
    expect_same_out("jobs --state", &a, &b);
    cr_assert_eq(h_ctl(&c, &a, "drain", "--reason=a b", "node1", NULL), 0);
    cr_expect_eq(a.status, 0, "%s", a.err);
    h_out_free(&a);
    const char *reason = "";
    cr_expect_str_eq(node_state(&c, "node1", &reason), "draining");
    cr_expect_str_eq(reason, "a b");
    h_cluster_down(&c);
}

/* `--` ends the options: a job file named like an option is a file after it, and an
 * option before it. */
Test(cli, double_dash_ends_the_options)
{
    h_cluster_t c;
    h_out_t o;
    char cwd[PATH_MAX], id[64], bin[PATH_MAX], abs[PATH_MAX];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    h_bin("", bin); /* chorusctl's path must hold in the cluster's directory too */
    cr_assert_not_null(realpath(bin, abs));
    cr_assert_eq(setenv("CHORUS_BIN_DIR", abs, 1), 0);
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    cr_assert_eq(chdir(c.dir), 0);
    cr_assert_eq(h_write_file("--weird.ini", "[job]\nname = weird\nkind = diag\n[parallel]\n"
                                             "dp = 2\n[diag]\nrounds = 1\ngemm_size = 64\n"),
                 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", "--weird.ini", NULL), 0);
    cr_expect_eq(o.status, 2, "before --, --weird.ini is an unknown option: %s", o.err);
    cr_expect(strstr(o.err, "unknown option '--weird.ini'"), "%s", o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "plan", "--json", "--", "--weird.ini", NULL), 0);
    cr_expect_eq(o.status, 0, "plan -- --weird.ini: %s", o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "submit", "--wait", "--", "--weird.ini", NULL), 0);
    cr_expect_eq(o.status, 0, "submit --wait -- --weird.ini: %s%s", o.out, o.err);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, " \n"), o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "status", "--", id, NULL), 0);
    cr_expect_eq(o.status, 0, "status -- ID: %s", o.err);
    cr_expect(strstr(o.out, "completed"), "the job of --weird.ini ran: %s", o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "cancel", "--", "--help", NULL), 0);
    cr_expect_neq(o.status, 0, "after --, --help is a job name, not a request for help");
    cr_expect_null(strstr(o.out, "usage:"), "%s", o.out);
    h_out_free(&o);
    cr_assert_eq(chdir(cwd), 0);
    h_cluster_down(&c);
}

/* An option a command does not have is refused with that command's usage and status 2,
 * before anything is done (no coordinator is reached: none runs here). */
Test(cli, an_unknown_option_is_a_usage_error_in_every_command)
{
    static const char *const cmds[][3] = {
        {"keygen", "/nonexistent/k", NULL},
        {"nodes", NULL, NULL},
        {"node", "forget", "n1"},
        {"drain", "n1", NULL},
        {"resume", "n1", NULL},
        {"jobs", NULL, NULL},
        {"submit", "x.ini", NULL},
        {"status", "j1", NULL},
        {"watch", "j1", NULL},
        {"cancel", "j1", NULL},
        {"checkpoint", "j1", NULL},
        {"kill-rank", "j1", "0"},
        {"logs", "j1", NULL},
        {"local", "up", NULL},
        {"export", "ckpt", NULL},
        {"jobfile", "--template", NULL},
        {"plan", "x.ini", NULL},
        {"completion", "bash", NULL},
        {"help", "status", NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        h_out_t o;
        char want[64];
        const char *a1 = cmds[i][1], *a2 = a1 ? cmds[i][2] : NULL;
        cr_assert_eq(h_ctl(NULL, &o, cmds[i][0], "--no-such-option", a1, a2, NULL), 0);
        cr_expect_eq(o.status, 2, "%s --no-such-option: status %d: %s", cmds[i][0], o.status,
                     o.err);
        cr_expect(strstr(o.err, "unknown option '--no-such-option'"), "%s: %s", cmds[i][0], o.err);
        snprintf(want, sizeof want, "usage: chorusctl %s", cmds[i][0]);
        cr_expect(strstr(o.err, want), "%s: the command's usage: %s", cmds[i][0], o.err);
        h_out_free(&o);
    }
}
