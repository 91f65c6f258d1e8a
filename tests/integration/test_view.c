/* What an operator sees (issue 14): `chorusctl watch` on a terminal, a pipe and --json;
 * the status page's structure, limits and survival of a coordinator restart; the page in
 * a real browser (headless Chromium, skipped when it is not installed). */
#include <criterion/criterion.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/msg.h"
#include "common/util.h"
#include "harness.h"
#include "support.h"

TestSuite(view, .fini = h_teardown, .timeout = 180);

// ----------------------------------------------------------------------------
// helpers

/* A small train job over world = dp ranks. */
static void write_job(const h_cluster_t *c, char *path, size_t n, const char *name, int dp,
                      int steps)
{
    char text[512];
    snprintf(path, n, "%s/%s.ini", c->dir, name);
    snprintf(text, sizeof text,
             "[job]\nname = %s\nkind = train\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 64\nseq_len = 32\n"
             "[parallel]\ndp = %d\nmicro_batch_size = 4\n"
             "[train]\nsteps = %d\ndata = builtin\n",
             name, dp, steps);
    cr_assert_eq(h_write_file(path, text), 0);
}

static void submit(const h_cluster_t *c, const char *job, char *id, size_t n)
{
    h_out_t o;
    cr_assert_eq(h_ctl(c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "submit: %s", o.err);
    snprintf(id, n, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
}

/* Everything fd yields until EOF or the deadline; malloc'd, NUL-terminated. */
static char *read_all(int fd, int timeout_ms)
{
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    cr_assert_not_null(buf);
    for (;;) {
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            break;
        struct pollfd q = {fd, POLLIN, 0};
        if (poll(&q, 1, (int)(deadline - now)) <= 0)
            continue;
        if (len + 4096 + 1 > cap)
            cr_assert_not_null(buf = realloc(buf, cap *= 2));
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0 && !(r < 0 && errno == EINTR))
            break; /* EOF; a pty reads EIO once the child is gone */
        if (r > 0)
            len += (size_t)r;
    }
    buf[len] = '\0';
    return buf;
}

/* Read two streams at once to EOF (or the deadline), so that neither writer blocks. */
static void read_both(int a, char **out_a, int b, char **out_b, int timeout_ms)
{
    int fd[2] = {a, b};
    size_t len[2] = {0, 0}, cap[2] = {1 << 16, 1 << 16};
    char *buf[2] = {malloc(cap[0]), malloc(cap[1])};
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    cr_assert(buf[0] && buf[1]);
    while (fd[0] >= 0 || fd[1] >= 0) {
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            break;
        struct pollfd q[2] = {{fd[0], POLLIN, 0}, {fd[1], POLLIN, 0}};
        if (poll(q, 2, (int)(deadline - now)) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (fd[i] < 0 || !(q[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (len[i] + 4096 + 1 > cap[i])
                cr_assert_not_null(buf[i] = realloc(buf[i], cap[i] *= 2));
            ssize_t r = read(fd[i], buf[i] + len[i], cap[i] - len[i] - 1);
            if (r > 0)
                len[i] += (size_t)r;
            else if (!(r < 0 && errno == EINTR))
                fd[i] = -1; /* EOF; a pty reads EIO once the child is gone */
        }
    }
    buf[0][len[0]] = buf[1][len[1]] = '\0';
    *out_a = buf[0];
    *out_b = buf[1];
}

static int wait_exit(pid_t pid)
{
    int st = 0;
    for (int i = 0; i < 1000 && waitpid(pid, &st, WNOHANG) == 0; i++)
        usleep(10000);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* One HTTP exchange: send req as is, read the answer to EOF. Returns the status code
 * (-1 on a transport failure); *body (if given) is the whole answer, malloc'd. */
static int http(const char *addr, const char *req, char **body)
{
    int fd = h_tcp_connect(addr);
    if (fd < 0)
        return -1;
    if (h_send_all(fd, req, strlen(req)) < 0) {
        close(fd);
        return -1;
    }
    char *text = read_all(fd, 10000);
    close(fd);
    int code = -1;
    if (sscanf(text, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    if (body)
        *body = text;
    else
        free(text);
    return code;
}

static int get(const char *addr, const char *path, char **body)
{
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: test\r\n\r\n", path);
    return http(addr, req, body);
}

/* The d attribute of the path with this id: its number of vertices (M and L). */
static size_t path_vertices(const char *page, const char *id)
{
    char key[64];
    snprintf(key, sizeof key, "id=\"%s\"", id);
    const char *p = strstr(page, key);
    if (!p || !(p = strstr(p, " d=\"")))
        return 0;
    size_t n = 0;
    for (p += 4; *p && *p != '"'; p++)
        n += *p == 'M' || *p == 'L';
    return n;
}

static int job_state_is(const h_cluster_t *c, const char *id, const char *state)
{
    Chorus__Envelope *r = NULL;
    if (h_job_query(c, id, &r) < 0)
        return 0;
    int yes = strcmp(r->job_info->state, state) == 0;
    ch_msg_free(r);
    return yes;
}

// ----------------------------------------------------------------------------
// watch

/* promtool (Debian package prometheus) finds nothing to say about the exposition, when it
 * is installed; otherwise the format is only as checked above. */
static void promtool_check(const char *dir, const char *body)
{
    char path[PATH_MAX + 16], cmd[PATH_MAX + 64];
    if (access("/usr/bin/promtool", X_OK) != 0) {
        fprintf(stderr, "promtool not installed (Debian package prometheus): not run\n");
        return;
    }
    snprintf(path, sizeof path, "%s/metrics.txt", dir);
    cr_assert_eq(h_write_file(path, body), 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < '%s' 2>&1", path);
    h_out_t o;
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(h_run(&o, 30000, argv), 0);
    cr_expect_eq(o.status, 0, "promtool check metrics:\n%s%s", o.out, o.err);
    cr_expect_str_eq(o.out, "", "promtool has remarks");
    h_out_free(&o);
}

Test(view, watch_redraws_on_a_terminal_lines_in_a_pipe_json_per_update)
{
    h_cluster_t c;
    char job[PATH_MAX], id[32], ctl[PATH_MAX];
    cr_assert_eq(h_cluster_up(&c, 2, 2), 0);
    write_job(&c, job, sizeof job, "watched", 2, 150);
    submit(&c, job, id, sizeof id);
    h_bin("chorusctl", ctl);

    /* The same job followed on a pseudo-terminal and, at once, as a JSON stream. */
    int master = -1;
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    pid_t tty = forkpty(&master, NULL, NULL, &ws);
    cr_assert(tty >= 0, "forkpty: %s", strerror(errno));
    if (tty == 0) {
        execl(ctl, ctl, "--socket", c.sock, "watch", id, (char *)NULL);
        _exit(127);
    }
    int pj[2];
    cr_assert_eq(pipe(pj), 0);
    pid_t js = fork();
    if (js == 0) {
        dup2(pj[1], STDOUT_FILENO);
        close(pj[0]);
        execl(ctl, ctl, "--socket", c.sock, "watch", id, "--json", (char *)NULL);
        _exit(127);
    }
    close(pj[1]);
    char *json = NULL, *term = NULL;
    read_both(pj[0], &json, master, &term, 90000);
    close(pj[0]);
    close(master);
    int json_st = wait_exit(js), tty_st = wait_exit(tty);

    /* Terminal: one bar redrawn in place ("\r" + erase line), ending completed at 100%. */
    size_t redraws = count(term, "\r\033[2K");
    fprintf(stderr, "watch on a pty: %zu redraws, %zu bytes\n", redraws, strlen(term));
    cr_expect_eq(tty_st, 0, "watch exit %d on a pty:\n%s", tty_st, term);
    cr_expect_geq(redraws, 3, "too few in-place redraws:\n%s", term);
    const char *last = term;
    for (const char *p = strstr(term, "\r\033[2K"); p; p = strstr(p + 1, "\r\033[2K"))
        last = p;
    cr_expect(h_has(last, "completed") && h_has(last, "100%") && h_has(last, "step 150/150"),
              "last redraw: %s", last);
    cr_expect(h_has(term, "loss ") && h_has(term, "tok/s ") && h_has(term, "ETA "), "%s", term);

    /* JSON: one object per line, steps never going back, the last one completed. */
    cr_expect_eq(json_st, 0, "watch --json exit %d", json_st);
    size_t lines = 0;
    double prev = -1;
    const char *final_state = "";
    static char state[32];
    for (char *line = strtok(json, "\n"); line; line = strtok(NULL, "\n")) {
        ch_json_t *j = NULL;
        char err[160];
        cr_assert_eq(ch_json_parse(line, strlen(line), NULL, &j, err, sizeof err), 0,
                     "line %zu is not JSON (%s): %s", lines, err, line);
        cr_expect_eq(j->type, CH_JSON_OBJECT);
        cr_expect_str_eq(h_json_str(j, "id"), id);
        double step = h_json_num(j, "step");
        cr_expect(step >= prev, "step went back: %g after %g", step, prev);
        prev = step;
        snprintf(state, sizeof state, "%s", h_json_str(j, "state"));
        final_state = state;
        cr_expect_not_null(ch_json_get(j, "eta_s"));
        cr_expect_not_null(ch_json_get(j, "restarts"));
        ch_json_free(j);
        lines++;
    }
    cr_expect_geq(lines, 3, "only %zu JSON updates", lines);
    cr_expect_str_eq(final_state, "completed");
    cr_expect_eq(prev, 150.0);
    free(json);
    free(term);

    /* A pipe: plain lines, no carriage returns; the ended job gives one and exit 0. */
    h_out_t o;
    cr_assert_eq(h_ctl(&c, &o, "watch", id, NULL), 0);
    cr_expect_eq(o.status, 0);
    cr_expect_null(strchr(o.out, '\r'), "carriage return in piped output: %s", o.out);
    cr_expect_null(strchr(o.out, '\033'), "escape code in piped output: %s", o.out);
    cr_expect(h_has(o.out, "completed") && o.out[strlen(o.out) - 1] == '\n', "%s", o.out);
    h_out_free(&o);

    /* A cancelled job: watch exits 1. */
    write_job(&c, job, sizeof job, "cancelled", 1, 100000);
    submit(&c, job, id, sizeof id);
    cr_assert_eq(h_ctl(&c, &o, "cancel", id, NULL), 0);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "watch", id, NULL), 0);
    cr_expect_eq(o.status, 1, "watch of a cancelled job: exit %d: %s", o.status, o.out);
    h_out_free(&o);
}

// ----------------------------------------------------------------------------
// the page

Test(view, job_page_draws_every_step_and_the_layout_and_survives_a_restart)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX], id[32], addr[64];
    char *page = NULL;
    cr_assert_eq(h_cluster_up(&c, 2, 2), 0);
    write_job(&c, job, sizeof job, "paged", 2, 30);
    cr_assert_eq(h_submit_wait(&c, &o, job, id, sizeof id), 0);
    h_out_free(&o);
    cr_assert_eq(h_metrics_addr(&c, addr, sizeof addr), 0);

    cr_assert_eq(get(addr, "/", &page), 200, "%s", page);
    cr_expect(h_has(page, "<tr class=\"node\"><td>node1") && h_has(page, "node2"), "%s", page);
    cr_expect(h_has(page, "/jobs/j1"), "no link to the job");
    free(page);

    char path[64];
    snprintf(path, sizeof path, "/jobs/%s", id);
    cr_assert_eq(get(addr, path, &page), 200);
    cr_expect_eq(path_vertices(page, "loss-path"), 30, "loss path: one point per step");
    cr_expect_eq(path_vertices(page, "tps-path"), 30);
    cr_expect(h_has(page, "data-world=\"2\"") && count(page, "class=\"rank ") == 2, "grid");
    cr_expect_eq(count(page, "class=\"rank exited\""), 2, "a completed job's ranks have exited");
    cr_expect(h_has(page, "id=\"heatmap\" width"), "no heat map");
    cr_expect(h_has(page, "no restarts"), "restart history");
    cr_expect_null(strstr(page, "<script"), "the page runs no script");
    cr_expect_eq(count(page, "http://"), count(page, "xmlns=\"http://www.w3.org/2000/svg\""),
                 "the page refers to nothing outside");
    free(page);

    /* the same job as JSON, for scripts: the status fields and the series */
    char jpath[80];
    snprintf(jpath, sizeof jpath, "/jobs/%s.json", id);
    cr_assert_eq(get(addr, jpath, &page), 200, "%s", page);
    ch_json_t *js = NULL;
    char why[256] = "";
    const char *body = strstr(page, "\r\n\r\n"); /* after the headers */
    cr_assert_not_null(body);
    cr_expect(h_has(page, "application/json"), "content type");
    body += 4;
    cr_assert_eq(ch_json_parse(body, strlen(body), NULL, &js, why, sizeof why), 0, "%s", why);
    cr_expect_str_eq(h_json_str(js, "state"), "completed");
    cr_expect_eq(h_json_num(js, "step"), 30.0);
    const ch_json_t *series = ch_json_get(js, "series");
    cr_expect(series && series->nkids == 30, "series: one point per step");
    cr_expect(series && series->nkids && isfinite(h_json_num(h_json_at(series, 29), "loss")));
    ch_json_free(js);
    free(page);

    /* Restart the coordinator: the curve comes back from SQLite. */
    pid_t coord = h_pid(&c, "coordinatord");
    cr_assert_eq(h_kill_wait(coord, SIGTERM, 10000), 0);
    cr_assert_eq(h_coord_restart(&c), 0);
    cr_assert_eq(h_metrics_addr(&c, addr, sizeof addr), 0);
    cr_assert_eq(get(addr, path, &page), 200);
    cr_expect_eq(path_vertices(page, "loss-path"), 30, "after a restart");
    free(page);
}

Test(view, bad_requests_get_404_405_413)
{
    h_cluster_t c;
    char addr[64], big[12000];
    char *body = NULL;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    cr_assert_eq(h_metrics_addr(&c, addr, sizeof addr), 0);
    cr_expect_eq(get(addr, "/nope", NULL), 404);
    cr_expect_eq(get(addr, "/jobs/j999", NULL), 404);
    cr_expect_eq(get(addr, "/jobs/%3Cscript%3E", NULL), 404);
    cr_expect_eq(get(addr, "/../etc/passwd", NULL), 404);
    cr_expect_eq(http(addr, "POST /metrics HTTP/1.0\r\n\r\n", NULL), 405);
    cr_expect_eq(http(addr, "GET / HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello", NULL), 413);
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "GET / HTTP/1.0\r\nX: ", 19);
    big[sizeof big - 1] = '\0';
    cr_expect_eq(http(addr, big, NULL), 413, "oversized head");
    cr_expect_eq(get(addr, "/metrics", &body), 200);
    cr_expect(h_has(body, "chorus_nodes{state=\"alive\"} 1"), "%s", body);
    cr_expect(h_has(body, "chorus_build_info{version=\"" CHORUS_VERSION "\"} 1"), "%s", body);
    cr_expect(h_has(body, "\nprocess_resident_memory_bytes ") &&
                  h_has(body, "\nprocess_cpu_seconds_total ") && h_has(body, "\nprocess_open_fds "),
              "process_* metrics: %s", body);
    cr_expect(!h_has(body, "{job=\""), "a job label would clash with the scrape's: %s", body);
    char *ok = NULL;
    cr_expect_eq(get(addr, "/healthz", &ok), 200);
    const char *ok_body = ok ? strstr(ok, "\r\n\r\n") : NULL; /* get() keeps the head */
    cr_expect(ok_body && strcmp(ok_body + 4, "ok\n") == 0, "/healthz said %s", ok ? ok : "-");
    free(ok);
    const char *text = strstr(body, "\r\n\r\n");
    cr_assert_not_null(text);
    promtool_check(c.dir, text + 4);

    /* Every metric the Grafana dashboard queries is one /metrics declares. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/deploy/grafana-dashboard.json", getenv("CHORUS_SRC_DIR"));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char dash[1 << 16];
    size_t n = fread(dash, 1, sizeof dash - 1, f);
    fclose(f);
    dash[n] = '\0';
    ch_json_t *d = NULL;
    char err[160];
    cr_assert_eq(ch_json_parse(dash, n, NULL, &d, err, sizeof err), 0, "dashboard: %s", err);
    ch_json_free(d);
    size_t names = 0;
    for (const char *p = strstr(dash, "chorus_"); p; p = strstr(p + 1, "chorus_")) {
        char name[64], help[96];
        if (p > dash && (p[-1] == '_' || p[-1] == '-'))
            continue; /* part of another word (a uid) */
        snprintf(name, sizeof name, "%.*s", (int)strspn(p, "abcdefghijklmnopqrstuvwxyz_"), p);
        snprintf(help, sizeof help, "# TYPE %s ", name);
        cr_expect(strstr(body, help) != NULL, "the dashboard queries %s, which /metrics lacks",
                  name);
        names++;
    }
    cr_expect_geq(names, 10, "only %zu metric names in the dashboard", names);
    free(body);
}

/* Hardening issue 11 class 8: a flood of idle connections to the HTTP address must not
 * stop the control socket; the limit is logged; idle connections are closed. */
Test(view, idle_connection_flood_leaves_the_control_socket_alone)
{
    enum { FLOOD = 1100 };
    h_cluster_t c;
    struct rlimit rl, old;
    char addr[64], log[PATH_MAX + 32];
    static int fds[FLOOD];

    /* The coordinator runs with a common descriptor limit (1024); this process needs
     * more than the flood. */
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    if (old.rlim_max < FLOOD + 200)
        cr_skip("descriptor hard limit %llu is too low for the flood",
                (unsigned long long)old.rlim_max);
    rl = old;
    rl.rlim_cur = 1024;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    int up = h_cluster_up(&c, 1, 1);
    rl.rlim_cur = old.rlim_max < 4096 ? old.rlim_max : 4096;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    cr_assert_eq(up, 0);
    cr_assert_eq(h_metrics_addr(&c, addr, sizeof addr), 0);
    snprintf(log, sizeof log, "%s/coordinatord.log", c.dir);

    /* One idle connection is closed by the server after its idle time. */
    int idle = h_tcp_connect(addr);
    cr_assert_geq(idle, 0);
    uint64_t t0 = ch_now_ms();
    cr_expect(h_peer_closed(idle, 8000), "an idle connection stayed open");
    uint64_t idle_ms = ch_now_ms() - t0;
    close(idle);
    cr_expect(idle_ms >= 4000, "closed after %llu ms", (unsigned long long)idle_ms);

    size_t off = h_file_size(log);
    int opened = 0;
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        cr_assert_geq(fds[i], 0, "socket %d: %s", i, strerror(errno));
        char host[64];
        int port = 0;
        cr_assert_eq(ch_parse_hostport(addr, host, sizeof host, &port), 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &sa.sin_addr);
        if (connect(fds[i], (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EINPROGRESS)
            opened++;
    }
    fprintf(stderr, "flood: %d of %d connections under way\n", opened, FLOOD);

    /* The control socket answers, promptly, every time. */
    for (int k = 0; k < 5; k++) {
        h_out_t o;
        uint64_t s = ch_now_ms();
        cr_assert_eq(h_ctl(&c, &o, "nodes", NULL), 0);
        uint64_t ms = ch_now_ms() - s;
        cr_expect_eq(o.status, 0, "nodes during the flood: %s", o.err);
        cr_expect_lt(ms, 2000, "nodes took %llu ms during the flood", (unsigned long long)ms);
        h_out_free(&o);
    }
    cr_expect(h_file_has_since(log, off, "connection limit"), "the limit was not logged");

    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    /* Once the flood is gone the page answers again. */
    int code = -1;
    for (int k = 0; k < 100 && code != 200; k++) {
        code = get(addr, "/metrics", NULL);
        if (code != 200)
            usleep(100000);
    }
    cr_expect_eq(code, 200, "metrics after the flood");
    setrlimit(RLIMIT_NOFILE, &old);
}

// ----------------------------------------------------------------------------
// a real browser

static int find_chromium(char *exe, size_t n)
{
    const char *env = getenv("CHORUS_CHROMIUM");
    const char *cands[] = {env, "/usr/bin/chromium", "/usr/bin/chromium-browser",
                           "/usr/bin/google-chrome"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (cands[i] && *cands[i] && access(cands[i], X_OK) == 0) {
            snprintf(exe, n, "%s", cands[i]);
            return 1;
        }
    }
    return 0;
}

Test(view, chromium_renders_the_job_page)
{
    char exe[PATH_MAX];
    if (!find_chromium(exe, sizeof exe))
        cr_skip("no chromium (Debian package chromium) installed");
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX], id[32], addr[64], url[128], profile[PATH_MAX], shot[PATH_MAX],
        size[] = "--window-size=1000,1400";
    cr_assert_eq(h_cluster_up(&c, 2, 2), 0);
    write_job(&c, job, sizeof job, "browsed", 4, 40);
    cr_assert_eq(h_submit_wait(&c, &o, job, id, sizeof id), 0);
    h_out_free(&o);
    cr_assert(job_state_is(&c, id, "completed"));
    cr_assert_eq(h_metrics_addr(&c, addr, sizeof addr), 0);
    snprintf(url, sizeof url, "http://%s/jobs/%s", addr, id);
    snprintf(profile, sizeof profile, "--user-data-dir=%s/chromium", c.dir);
    snprintf(shot, sizeof shot, "--screenshot=%s/status-page.png", c.dir);

    /* One run: the DOM as the browser built it on stdout, and a picture of it. */
    setenv("DBUS_SESSION_BUS_ADDRESS", "disabled:", 1); /* no session bus to wait for */
    char *argv[] = {exe,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--hide-scrollbars",
                    profile,
                    size,
                    shot,
                    "--dump-dom",
                    url,
                    NULL};
    uint64_t t0 = ch_now_ms();
    cr_assert_eq(h_run(&o, 90000, argv), 0);
    fprintf(stderr, "chromium: %.1f s\n", (double)(ch_now_ms() - t0) / 1e3);
    cr_assert_eq(o.status, 0, "chromium: %s", o.err);
    cr_expect_eq(path_vertices(o.out, "loss-path"), 40, "the loss path has a point per step");
    cr_expect(h_has(o.out, "data-world=\"4\""), "no layout grid");
    cr_expect_eq(count(o.out, "class=\"rank "), 4, "the grid has world-size cells");
    cr_expect(h_has(o.out, "<svg id=\"heatmap\""), "no heat map in the DOM");
    h_out_free(&o);

    char png[PATH_MAX + 32], head[8] = {0};
    snprintf(png, sizeof png, "%s/status-page.png", c.dir);
    FILE *f = fopen(png, "rb");
    cr_assert_not_null(f, "no screenshot at %s", png);
    cr_expect_eq(fread(head, 1, 8, f), 8);
    fclose(f);
    cr_expect(memcmp(head, "\x89PNG\r\n\x1a\n", 8) == 0, "the screenshot is not a PNG");
    cr_expect_gt(h_file_size(png), 10000, "the screenshot is nearly empty");
    const char *keep = getenv("CHORUS_SCREENSHOT_OUT"); /* docs/status-page.png */
    if (keep && *keep) {
        char *cp_argv[] = {"/bin/cp", png, (char *)keep, NULL};
        cr_expect_eq(h_run(&o, 10000, cp_argv), 0);
        h_out_free(&o);
    }
}

// ----------------------------------------------------------------------------
// workerd's own /metrics

/* A loopback port below the ephemeral range that is free now (a random ephemeral one can
 * be taken by an outgoing connection before the daemon binds it). */
static int free_port(void)
{
    for (int i = 0; i < 2000; i++) {
        int port = 15000 + (int)((getpid() * 7 + i) % 5000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    cr_assert_fail("no free port");
    return -1;
}

typedef struct scrape {
    const char *addr, *needle;
} scrape_t;

static int scrape_has(void *ud)
{
    scrape_t *s = ud;
    char *body = NULL;
    int yes = get(s->addr, "/metrics", &body) == 200 && h_has(body, s->needle);
    free(body);
    return yes;
}

typedef struct job_ref {
    const h_cluster_t *c;
    const char *id;
} job_ref_t;

static int job_completed(void *ud)
{
    job_ref_t *j = ud;
    return job_state_is(j->c, j->id, "completed");
}

Test(view, workerd_metrics_count_its_ranks_and_pass_promtool)
{
    h_cluster_t c;
    char exe[PATH_MAX], run[PATH_MAX], log[PATH_MAX], port[16], addr[64], job[PATH_MAX], id[32];
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    h_bin("workerd", exe);
    snprintf(run, sizeof run, "%s/watched.run", c.dir);
    snprintf(log, sizeof log, "%s/watched.log", c.dir);
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(addr, sizeof addr, "127.0.0.1:%s", port);
    pid_t w = fork();
    cr_assert(w >= 0);
    if (w == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed assertion ends the test process */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(exe, "workerd", "--coordinator", c.addr, "--key", c.key, "--run-dir", run, "--name",
              "watched", "--slots", "1", "--device", "cpu", "--threads", "1", "--metrics-port",
              port, (char *)NULL);
        _exit(127);
    }
    scrape_t idle = {addr, "\nchorus_workerd_registered 1\n"};
    cr_expect(h_wait_until(scrape_has, &idle, 20000, 100) > 0, "workerd never registered (%s)",
              log);

    /* Two ranks over two one-slot nodes: one runs under the watched workerd. */
    write_job(&c, job, sizeof job, "scraped", 2, 150);
    submit(&c, job, id, sizeof id);
    scrape_t busy = {addr, "\nchorus_workerd_ranks 1\n"};
    cr_expect(h_wait_until(scrape_has, &busy, 60000, 50) > 0, "no running rank on /metrics");
    /* The rank is on the record a restarted workerd checks (workerd/adopt.h). */
    char state[PATH_MAX + 16], needle[64];
    snprintf(state, sizeof state, "%s/ranks.state", run);
    snprintf(needle, sizeof needle, " %s ", id);
    cr_expect(h_file_has_since(state, 0, needle), "%s does not list job %s", state, id);
    job_ref_t jr = {&c, id};
    cr_expect(h_wait_until(job_completed, &jr, 120000, 200) > 0, "job %s did not complete", id);
    scrape_t done = {addr, "chorus_workerd_rank_exits_total{outcome=\"done\"} 1\n"};
    cr_expect(h_wait_until(scrape_has, &done, 10000, 100) > 0, "the rank's exit is not counted");
    cr_expect(!h_file_has_since(state, 0, needle), "%s still lists the reaped rank", state);

    char *body = NULL, *ok = NULL;
    cr_expect_eq(get(addr, "/metrics", &body), 200);
    cr_assert_not_null(body);
    cr_expect(h_has(body, "\nchorus_workerd_ranks 0\n"), "%s", body);
    cr_expect(h_has(body, "\nchorus_workerd_rank_starts_total 1\n"), "%s", body);
    cr_expect(h_has(body, "chorus_build_info{version=\"" CHORUS_VERSION "\"} 1"), "%s", body);
    cr_expect(h_has(body, "chorus_workerd_info{node=\"watched\",device=\"cpu\"} 1"), "%s", body);
    cr_expect(h_has(body, "\nchorus_node_memory_total_bytes ") &&
                  h_has(body, "\nchorus_node_gpus ") && h_has(body, "\nprocess_open_fds ") &&
                  h_has(body, "\nprocess_resident_memory_bytes "),
              "%s", body);
    cr_expect_eq(get(addr, "/healthz", &ok), 200);
    cr_expect(ok && h_has(ok, "\r\n\r\nok\n"), "/healthz said %s", ok ? ok : "-");
    cr_expect_eq(get(addr, "/nope", NULL), 404);
    cr_expect_eq(http(addr, "POST /metrics HTTP/1.0\r\n\r\n", NULL), 405);
    const char *text = strstr(body, "\r\n\r\n");
    cr_assert_not_null(text);
    promtool_check(c.dir, text + 4);
    free(body);
    free(ok);
    cr_expect_eq(h_kill_wait(w, SIGTERM, 10000), 0);
    waitpid(w, NULL, 0);
}
