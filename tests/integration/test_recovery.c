/* Automatic recovery (DESIGN §9), one failure kind per test, on real daemons: a rank
 * killed, a workerd killed and restarted, a node lost for good with a spare idle, the
 * coordinator killed and restarted, a hang (SIGSTOP) caught by fault.step_timeout, a
 * rank stuck before its first step, a finished rank's report surviving a coordinator
 * crash, and a queued job that no longer fits not blocking the queue. Each training job
 * is the demo-size model, checkpointing every few steps; each must complete by itself
 * (or fail naming its cause) with the restart in its history. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json.h"
#include "harness.h"
#include "recovery_util.h"

TestSuite(recovery, .fini = h_teardown, .timeout = 120);

#define EVERY 10

/* The job's status document (ch_json_free). */
static ch_json_t *status(const h_cluster_t *c, const char *id)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    cr_assert_not_null(js, "status %s", id);
    return js;
}

/* The job completed after exactly `restarts` restarts, the last of `cause`, resumed from
 * a committed step with at most EVERY steps lost. */
static void check_recovered(const h_cluster_t *c, const char *id, int restarts, const char *cause)
{
    rt_job_t w;
    cr_assert(rt_wait(&w, c, id, NULL, 0, 0, 60000), "job %s never ended (%s: %s)", id, w.state,
              w.reason);
    ch_json_t *js = status(c, id);
    cr_assert_str_eq(h_json_str(js, "state"), "completed", "%s: %s", id, h_json_str(js, "reason"));
    cr_assert_eq(h_json_num(js, "restarts"), (double)restarts);
    cr_assert_eq(h_json_num(js, "generation"), (double)(restarts + 1));
    const ch_json_t *hist = ch_json_get(js, "history");
    cr_assert(hist && hist->nkids == (size_t)restarts, "history of %zu entries",
              hist ? hist->nkids : 0);
    if (restarts > 0) {
        const ch_json_t *h = h_json_at(hist, hist->nkids - 1);
        cr_assert_str_eq(h_json_str(h, "cause"), cause, "reason: %s", h_json_str(h, "reason"));
        double from = h_json_num(h, "resumed_from"), lost = h_json_num(h, "steps_lost");
        double took = h_json_num(h, "recover_s");
        fprintf(stderr, "%s: %s (%s) resumed from %g, %g steps lost, recovered in %.2f s\n", id,
                cause, h_json_str(h, "reason"), from, lost, took);
        cr_assert(from >= 0 && (long)from % EVERY == 0, "resumed from %g", from);
        cr_assert(lost >= 0 && lost <= EVERY, "%g steps lost", lost);
        cr_assert(took > 0 && took < 30, "recovered in %g s", took);
    }
    ch_json_free(js);
}

static void submit_train(const h_cluster_t *c, const char *name, int dp, int steps,
                         const char *fault, char id[64])
{
    char text[2048], file[96];
    cr_assert_eq(rt_job_text(c, text, sizeof text, name, dp, steps, EVERY, fault), 0);
    snprintf(file, sizeof file, "%s.ini", name);
    cr_assert_eq(rt_submit(c, file, text, id, 64), 0);
}

Test(recovery, killed_rank_restarts_from_the_last_checkpoint)
{
    h_cluster_t c;
    h_out_t o;
    char id[64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    submit_train(&c, "rank-kill", 1, 80, NULL, id);
    cr_assert(rt_wait(&w, &c, id, "running", 25, 1, 30000), "%s: %s", w.state, w.reason);
    cr_assert_eq(h_ctl(&c, &o, "kill-rank", id, "0", NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    h_out_free(&o);
    check_recovered(&c, id, 1, "rank_exit");
}

Test(recovery, killed_workerd_restarted_by_its_supervisor)
{
    h_cluster_t c;
    char id[64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    submit_train(&c, "workerd-kill", 2, 80, NULL, id);
    cr_assert(rt_wait(&w, &c, id, "running", 25, 1, 30000), "%s: %s", w.state, w.reason);
    cr_assert_eq(h_kill_wait(h_pid(&c, "node1"), SIGKILL, 2000), 0);
    cr_assert_eq(h_worker_restart(&c, 1), 0); /* as systemd would, at once */
    /* Back before dead-after: its ranks died with it (PDEATHSIG), which its Register says. */
    check_recovered(&c, id, 1, "workerd_restart");
}

Test(recovery, node_lost_for_good_moves_to_the_spare)
{
    h_cluster_t c;
    char id[64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 3, 1), 0);
    submit_train(&c, "node-lost", 2, 80, NULL, id);
    cr_assert(rt_wait(&w, &c, id, "running", 25, 1, 30000), "%s: %s", w.state, w.reason);
    ch_json_t *js = status(&c, id);
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    cr_assert(ranks && ranks->nkids == 2);
    char victim[32];
    snprintf(victim, sizeof victim, "%s", h_json_str(h_json_at(ranks, 1), "node"));
    ch_json_free(js);
    cr_assert_eq(h_kill_wait(h_pid(&c, victim), SIGKILL, 2000), 0);
    /* The survivor's collective fails at once, the node is declared dead a second later:
     * the restart names the node, the culprit, not the survivor. */
    check_recovered(&c, id, 1, "node_lost");
    js = status(&c, id);
    ranks = ch_json_get(js, "ranks");
    for (size_t i = 0; i < ranks->nkids; i++)
        cr_assert_str_neq(h_json_str(h_json_at(ranks, i), "node"), victim);
    ch_json_free(js);
}

Test(recovery, coordinator_restart_readopts_the_running_job)
{
    h_cluster_t c;
    char id[64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    submit_train(&c, "coord-kill", 2, 80, NULL, id);
    cr_assert(rt_wait(&w, &c, id, "running", 25, 1, 30000), "%s: %s", w.state, w.reason);
    cr_assert_eq(h_kill_wait(h_pid(&c, "coordinatord"), SIGKILL, 2000), 0);
    cr_assert_eq(h_coord_restart(&c), 0);
    /* The ranks kept training; the restarted coordinator re-adopts them. */
    check_recovered(&c, id, 0, NULL);
}

Test(recovery, hang_caught_by_step_timeout)
{
    h_cluster_t c;
    char id[64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    submit_train(&c, "hang", 1, 80, "step_timeout = 2\n", id);
    cr_assert(rt_wait(&w, &c, id, "running", 25, 1, 30000), "%s: %s", w.state, w.reason);
    pid_t pid = rt_rank_pid(&c, 1, id, 1, 0);
    cr_assert(pid > 0, "no pid for rank 0");
    uint64_t t0 = ch_now_ms();
    cr_assert_eq(kill(pid, SIGSTOP), 0);
    cr_assert(rt_wait(&w, &c, id, "starting", 0, 2, 10000) || w.gen >= 2, "%s: %s", w.state,
              w.reason);
    long ms = (long)(ch_now_ms() - t0);
    fprintf(stderr, "hang detected and restarted after %ld ms (step_timeout 2 s)\n", ms);
    cr_assert(ms < 2000 + 1500, "took %ld ms", ms);
    check_recovered(&c, id, 1, "hang");
}

Test(recovery, step_timeout_covers_the_time_before_the_first_step)
{
    h_cluster_t c;
    char id[64], fifo[PATH_MAX + 16], text[2048], fault[PATH_MAX + 64];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    snprintf(fifo, sizeof fifo, "%s/nobody-writes.bin", c.dir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_assert_eq(rt_job_text(&c, text, sizeof text, "fifo", 1, 20, EVERY,
                             "step_timeout = 1\nmax_restarts = 0\n"),
                 0);
    /* The data file is a FIFO: opening it blocks before the first step. */
    char *data = strstr(text, "seed = 1337\n");
    cr_assert_not_null(data);
    snprintf(fault, sizeof fault, "%s", data + strlen("seed = 1337\n"));
    snprintf(data, sizeof text - (size_t)(data - text), "seed = 1337\ndata = %s\n%s", fifo, fault);
    /* chorusctl refuses a data file that is not a regular file; a rank must cope anyway. */
    cr_assert_eq(h_submit_raw(&c, text, id, sizeof id), 0);
    cr_assert(rt_wait(&w, &c, id, NULL, 0, 0, 15000), "job still %s", w.state);
    cr_assert_str_eq(w.state, "failed");
    cr_assert(h_has(w.reason, "first step") && h_has(w.reason, "step_timeout"), "%s", w.reason);
}

Test(recovery, final_report_survives_a_coordinator_crash)
{
    h_cluster_t c;
    char id[64], log[PATH_MAX + 16];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    submit_train(&c, "last-words", 1, 40, NULL, id);
    cr_assert(rt_wait(&w, &c, id, "running", 1, 1, 30000), "%s: %s", w.state, w.reason);
    /* The coordinator hears nothing more; the rank finishes and exits 0; then it dies. */
    pid_t coord = h_pid(&c, "coordinatord");
    cr_assert_eq(kill(coord, SIGSTOP), 0);
    snprintf(log, sizeof log, "%s/node1.log", c.dir);
    char needle[96];
    snprintf(needle, sizeof needle, "job=%s gen=1 rank=0", id);
    uint64_t end = ch_now_ms() + 30000;
    int exited = 0;
    while (!exited && ch_now_ms() < end) {
        char *text = NULL;
        size_t len = 0;
        if (ch_file_read(log, 64u << 20, &text, &len) == 0) {
            for (char *p = strstr(text, needle); p && !exited; p = strstr(p + 1, needle)) {
                char *eol = strchr(p, '\n');
                char *q = strstr(p, "exited code=0");
                exited = q && (!eol || q < eol);
            }
        }
        free(text);
        usleep(20000);
    }
    cr_assert(exited, "rank 0 did not exit");
    cr_assert_eq(h_kill_wait(coord, SIGKILL, 2000), 0);
    cr_assert_eq(h_coord_restart(&c), 0);
    cr_assert(rt_wait(&w, &c, id, NULL, 0, 0, 15000), "job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "%s", w.reason);
}

Test(recovery, queued_job_that_no_longer_fits_does_not_block_the_queue)
{
    h_cluster_t c;
    h_out_t o;
    char busy[64], big[64], small[64], text[2048];
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 3, 1), 0);
    snprintf(text, sizeof text,
             "[job]\nname = busy\nkind = diag\n[diag]\nrounds = 100000000\ngemm_size = 32\n");
    cr_assert_eq(rt_submit(&c, "busy.ini", text, busy, sizeof busy), 0);
    cr_assert(rt_wait(&w, &c, busy, "running", 0, 1, 20000), "%s", w.state);
    snprintf(text, sizeof text,
             "[job]\nname = big\nkind = diag\n[parallel]\ndp = 3\n[diag]\nrounds = 2\n");
    cr_assert_eq(rt_submit(&c, "big.ini", text, big, sizeof big), 0);
    cr_assert(rt_wait(&w, &c, big, "queued", 0, 0, 5000), "%s", w.state);
    /* node3 goes for good: big (3 ranks) cannot fit the 2 alive slots any more. */
    cr_assert_eq(h_kill_wait(h_pid(&c, "node3"), SIGKILL, 2000), 0);
    char st[32];
    uint64_t end = ch_now_ms() + 5000;
    while (ch_now_ms() < end &&
           (h_node_state(&c, "node3", st, sizeof st) < 0 || strcmp(st, "dead")))
        usleep(20000);
    snprintf(text, sizeof text, "[job]\nname = small\nkind = diag\n[diag]\nrounds = 2\n");
    cr_assert_eq(rt_submit(&c, "small.ini", text, small, sizeof small), 0);
    cr_assert(rt_wait(&w, &c, small, "completed", 0, 0, 20000), "small is %s: %s", w.state,
              w.reason);
    cr_assert(rt_wait(&w, &c, big, "queued", 0, 0, 1000), "%s", w.state);
    cr_assert(h_has(w.reason, "slots") && h_has(w.reason, "needs 3"), "big waits: '%s'", w.reason);
    cr_assert_eq(h_ctl(&c, &o, "cancel", busy, NULL), 0);
    h_out_free(&o);
}

Test(recovery, bad_fault_settings_are_refused_naming_the_field)
{
    h_cluster_t c;
    h_out_t o;
    char path[PATH_MAX + 16];
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    static const char *const bad[][2] = {
        {"max_restarts = -1\n", "max_restarts"},
        {"max_restarts = 100000\n", "max_restarts"},
        {"step_timeout = -5\n", "step_timeout"},
    };
    snprintf(path, sizeof path, "%s/bad.ini", c.dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "[job]\nname = bad\nkind = diag\n[fault]\n%s", bad[i][0]);
        cr_assert_eq(h_write_file(path, text), 0);
        cr_assert_eq(h_ctl(&c, &o, "submit", path, NULL), 0);
        cr_assert_neq(o.status, 0, "%s accepted", bad[i][0]);
        cr_assert(h_has(o.err, bad[i][1]), "%s: stderr '%s'", bad[i][0], o.err);
        h_out_free(&o);
    }
}
