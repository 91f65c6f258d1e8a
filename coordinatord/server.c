/* Listeners and links; see server.h. */
#include "server.h"

#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "logs.h"
#include "rpc.h"

// ---------------------------------------------------------------------------------------
// Links

static void link_unlist(coord_server_t *s, coord_link_t *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else if (s->links == l)
        s->links = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* The queue of TCP links still in their handshake (server.h: COORD_UNAUTH_MAX). */
static void unauth_push(coord_server_t *s, coord_link_t *l)
{
    l->unauth = 1;
    l->uprev = s->unauth_newest;
    l->unext = NULL;
    if (s->unauth_newest)
        s->unauth_newest->unext = l;
    else
        s->unauth_oldest = l;
    s->unauth_newest = l;
    s->n_unauth++;
}

static void unauth_drop(coord_server_t *s, coord_link_t *l)
{
    if (!l->unauth)
        return;
    if (l->uprev)
        l->uprev->unext = l->unext;
    else
        s->unauth_oldest = l->unext;
    if (l->unext)
        l->unext->uprev = l->uprev;
    else
        s->unauth_newest = l->uprev;
    l->uprev = l->unext = NULL;
    l->unauth = 0;
    s->n_unauth--;
}

/* Room for one more unauthenticated connection: close the oldest one at the cap. */
static void unauth_make_room(coord_t *c)
{
    coord_server_t *s = &c->srv;
    while (s->n_unauth >= s->max_unauth && s->unauth_oldest) {
        coord_link_t *old = s->unauth_oldest;
        uint32_t quiet = 0;
        unauth_drop(s, old);
        s->unauth_evicted++;
        if (ch_ratelimit_ok(&s->unauth_cap_log, ch_now_ms(), &quiet))
            CH_LOGW("net",
                    "%zu unauthenticated connections, the cap: closing the oldest, peer %s "
                    "(%llu closed at the cap so far; %u lines not logged)",
                    s->max_unauth, coord_link_peer(old), (unsigned long long)s->unauth_evicted,
                    quiet);
        coord_link_close(old);
    }
}

/* Off srv's list of corked links (its sends were written, or it is gone). */
static void cork_unlist(coord_server_t *s, coord_link_t *l)
{
    if (!l->corked)
        return;
    if (l->cprev)
        l->cprev->cnext = l->cnext;
    else if (s->corked == l)
        s->corked = l->cnext;
    if (l->cnext)
        l->cnext->cprev = l->cprev;
    l->cprev = l->cnext = NULL;
    l->corked = 0;
}

int coord_link_send(coord_link_t *l, Chorus__Envelope *env)
{
    if (!l->conn)
        return -EPIPE;
    /* A loop turn answers many requests of one node at once (a rendezvous key all its
     * ranks wait for, their KvSets read together): one write for them, not one each. */
    if (!l->corked && ch_conn_is_ready(l->conn)) {
        coord_server_t *s = &l->c->srv;
        ch_conn_cork(l->conn);
        l->corked = 1;
        l->cprev = NULL;
        l->cnext = s->corked;
        if (s->corked)
            s->corked->cprev = l;
        s->corked = l;
    }
    return ch_conn_send(l->conn, env);
}

void coord_server_flush(coord_t *c)
{
    while (c->srv.corked) {
        coord_link_t *l = c->srv.corked;
        cork_unlist(&c->srv, l);
        (void)ch_conn_uncork(l->conn); /* a failed write closes the link */
    }
}

void coord_link_error(coord_link_t *l, uint64_t rid, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Chorus__Error e = CHORUS__ERROR__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    e.code = code;
    e.message = msg;
    env.request_id = rid;
    env.body_case = CHORUS__ENVELOPE__BODY_ERROR;
    env.error = &e;
    coord_link_send(l, &env);
}

void coord_link_close(coord_link_t *l)
{
    l->closing = 1;
    if (l->conn)
        ch_conn_close(l->conn);
}

const char *coord_link_peer(const coord_link_t *l)
{
    return l->conn ? ch_conn_peer(l->conn) : "?";
}

/* Root, the daemon's own user, or a member of ctl-group (primary or supplementary). */
static int ctl_allowed(const coord_t *c, uid_t uid, gid_t gid)
{
    if (uid == 0 || uid == c->uid)
        return 1;
    if (!c->have_ctl_gid)
        return 0;
    if (gid == c->ctl_gid)
        return 1;
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res)
        return 0;
    gid_t groups[256];
    int ng = 256, ok = 0;
    if (getgrouplist(res->pw_name, res->pw_gid, groups, &ng) < 0)
        ng = 256; /* more groups than we look at: check the first 256 */
    for (int i = 0; i < ng && !ok; i++)
        ok = groups[i] == c->ctl_gid;
    return ok;
}

static void on_ready(ch_conn_t *conn, void *ud)
{
    coord_link_t *l = ud;
    coord_t *c = l->c;
    l->conn = conn;
    coord_no_nap(c);
    unauth_drop(&c->srv, l);
    if (l->is_unix) {
        pid_t pid = 0;
        uid_t uid = (uid_t)-1;
        gid_t gid = (gid_t)-1;
        int rc = ch_conn_peer_cred(conn, &pid, &uid, &gid);
        if (rc < 0 || !ctl_allowed(c, uid, gid)) {
            /* A local user may connect at will: within the pre-authentication budget. */
            uint32_t quiet = 0;
            if (ch_ratelimit_ok(&c->srv.unauth_log, ch_now_ms(), &quiet))
                CH_LOGW("net",
                        "control socket: peer pid %d uid %d refused (allowed: root, uid %d%s%s)"
                        " (%" PRIu32 " similar lines left out)",
                        (int)pid, (int)uid, (int)c->uid, c->have_ctl_gid ? ", group " : "",
                        c->have_ctl_gid ? c->cfg.ctl_group : "", quiet);
            coord_link_error(l, 0, -EACCES,
                             "permission denied: uid %d is not allowed on the control socket",
                             (int)uid);
            ch_conn_close(conn);
            return;
        }
        l->role = COORD_ROLE_CTL;
        l->cred = coord_users_cred(&c->users, 1, uid, gid);
        return;
    }
    const char *role = ch_conn_role(conn);
    if (strcmp(role, "worker") == 0) {
        l->role = COORD_ROLE_WORKER;
    } else if (strcmp(role, "ctl") == 0) {
        l->role = COORD_ROLE_CTL;
        l->cred = coord_users_cred(&c->users, 0, 0, 0);
    } else {
        CH_LOGW("net", "peer %s: unknown role \"%s\"; closing", ch_conn_peer(conn), role);
        coord_link_error(l, 0, -EPERM, "unknown role \"%s\" (expected worker or ctl)", role);
        ch_conn_close(conn);
    }
}

/* What a worker sends without waiting for an answer: progress, heartbeats, rank events. */
static int reports_only(const Chorus__Envelope *env)
{
    return env->body_case == CHORUS__ENVELOPE__BODY_NODE_PROGRESS ||
           env->body_case == CHORUS__ENVELOPE__BODY_HEARTBEAT ||
           env->body_case == CHORUS__ENVELOPE__BODY_RANK_EVENT;
}

static void on_msg(ch_conn_t *conn, Chorus__Envelope *env, void *ud)
{
    coord_link_t *l = ud;
    (void)conn;
    /* a worker's report may wait for the turn's nap; anything it waits an answer for (a
     * registration, the rendezvous store) and a control client's question may not */
    if (l->role == COORD_ROLE_WORKER && reports_only(env))
        l->c->turn_msgs++;
    else
        coord_no_nap(l->c);
    if (l->role && !l->closing && !l->c->stopping)
        coord_rpc_dispatch(l->c, l, env);
}

void coord_link_gone(coord_t *c, coord_link_t *l, int reason)
{
    coord_kv_drop_waiter(c->kv, l);
    coord_logs_link_gone(c, l);
    if (l->node && l->node->link == l) {
        CH_LOGI("net", "node=%s link %s closed%s%s", l->node->name, coord_link_peer(l),
                reason ? ": " : "", reason ? ch_strerror(reason) : "");
        if (c->stopping)
            l->node->link = NULL;
        else
            coord_node_link_closed(c, l->node);
    }
}

static void on_close(ch_conn_t *conn, int reason, void *ud)
{
    coord_link_t *l = ud;
    coord_t *c = l->c;
    (void)conn;
    link_unlist(&c->srv, l);
    unauth_drop(&c->srv, l);
    cork_unlist(&c->srv, l);
    coord_link_gone(c, l, reason);
    free(l);
}

static void on_connection(uv_stream_t *server, int status)
{
    coord_t *c = server->data;
    int is_unix = server == (uv_stream_t *)&c->srv.pipe;
    coord_no_nap(c);
    if (status < 0) {
        CH_LOGW("net", "accept: %s", ch_strerror(ch_err_from_uv(status)));
        return;
    }
    coord_link_t *l = calloc(1, sizeof(*l));
    if (!l) {
        CH_LOGE("net", "accept: out of memory");
        return;
    }
    l->c = c;
    l->is_unix = is_unix;
    l->log_rl.burst = COORD_PEER_LOG_BURST;
    l->log_rl.window_ms = COORD_PEER_LOG_WINDOW_MS;
    if (!is_unix)
        unauth_make_room(c);
    ch_conn_opts_t opts = {.key = is_unix ? NULL : &c->key,
                           .is_server = 1,
                           .max_frame = COORD_FRAME_IN_MAX,
                           .unauth_log = &c->srv.unauth_log};
    ch_conn_cbs_t cbs = {.ready_cb = on_ready, .msg_cb = on_msg, .close_cb = on_close};
    ch_conn_t *conn = NULL;
    int rc = ch_conn_accept(c->loop, server, &opts, &cbs, l, &conn);
    if (rc < 0) {
        CH_LOGW("net", "accept: %s", ch_strerror(rc));
        free(l);
        return;
    }
    l->conn = conn;
    l->next = c->srv.links;
    if (l->next)
        l->next->prev = l;
    c->srv.links = l;
    if (!is_unix && !l->role)
        unauth_push(&c->srv, l);
}

// ---------------------------------------------------------------------------------------
// Listeners

int coord_addr_parse(const char *hostport, struct sockaddr_storage *ss)
{
    char host[128];
    int port = 0, rc;
    if (ch_parse_hostport(hostport, host, sizeof(host), &port) < 0)
        return CH_E_CONFIG;
    memset(ss, 0, sizeof(*ss));
    if (strchr(host, ':'))
        rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss);
    else
        rc = uv_ip4_addr(host, port, (struct sockaddr_in *)ss);
    return rc < 0 ? CH_E_CONFIG : 0;
}

void coord_addr_name(const uv_tcp_t *tcp, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    memset(&ss, 0, sizeof(ss));
    uv_tcp_getsockname(tcp, (struct sockaddr *)&ss, &len);
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
}

static int listen_tcp(coord_t *c)
{
    struct sockaddr_storage ss;
    int rc = coord_addr_parse(c->cfg.listen, &ss);
    if (rc < 0) {
        CH_LOGE("net", "listen: bad address \"%s\" (expected IP:PORT)", c->cfg.listen);
        return rc;
    }
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_init(c->loop, &c->srv.tcp)), rc, out);
    c->srv.tcp.data = c;
    c->srv.tcp_open = 1;
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_bind(&c->srv.tcp, (struct sockaddr *)&ss, 0)), rc, out);
    CH_CHECK_GOTO(ch_err_from_uv(uv_listen((uv_stream_t *)&c->srv.tcp, 511, on_connection)), rc,
                  out);
    coord_addr_name(&c->srv.tcp, c->srv.addr, sizeof(c->srv.addr));
    CH_LOGI("net", "listening on %s (workers and remote chorusctl, cluster key)", c->srv.addr);
out:
    if (rc < 0)
        CH_LOGE("net", "listen on %s: %s", c->cfg.listen, ch_strerror(rc));
    return rc;
}

static int listen_unix(coord_t *c)
{
    const char *path = c->cfg.ctl_socket;
    char dir[CH_OPT_STRLEN];
    struct stat st;
    int rc;

    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        rc = ch_mkdirs(dir, 0755);
        if (rc < 0) {
            CH_LOGE("net", "control socket directory %s: %s", dir, ch_strerror(rc));
            return rc;
        }
    }
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            CH_LOGE("net", "control socket %s exists and is not a socket", path);
            return -EEXIST;
        }
        unlink(path); /* stale socket of a previous run */
    }
    CH_CHECK_GOTO(ch_err_from_uv(uv_pipe_init(c->loop, &c->srv.pipe, 0)), rc, out);
    c->srv.pipe.data = c;
    c->srv.pipe_open = 1;
    mode_t old = umask(0117); /* born 0660: never reachable by others, not even briefly */
    rc = ch_err_from_uv(uv_pipe_bind(&c->srv.pipe, path));
    umask(old);
    if (rc < 0)
        goto out;
    if (chmod(path, 0660) < 0)
        CH_LOGW("net", "chmod 0660 %s: %s", path, ch_strerror(-errno));
    if (c->have_ctl_gid && chown(path, (uid_t)-1, c->ctl_gid) < 0)
        CH_LOGW("net", "chgrp %s %s: %s", c->cfg.ctl_group, path, ch_strerror(-errno));
    CH_CHECK_GOTO(ch_err_from_uv(uv_listen((uv_stream_t *)&c->srv.pipe, 128, on_connection)), rc,
                  out);
    CH_LOGI("net", "control socket %s (root, uid %d%s%s)", path, (int)c->uid,
            c->have_ctl_gid ? ", group " : "", c->have_ctl_gid ? c->cfg.ctl_group : "");
out:
    if (rc < 0)
        CH_LOGE("net", "control socket %s: %s", path, ch_strerror(rc));
    return rc;
}

/* COORD_UNAUTH_MAX, or a quarter of the descriptor limit when that is smaller. */
static size_t unauth_cap(void)
{
    struct rlimit rl;
    size_t cap = COORD_UNAUTH_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < cap)
        cap = rl.rlim_cur / 4 ? (size_t)(rl.rlim_cur / 4) : 1;
    return cap;
}

int coord_server_start(coord_t *c)
{
    c->srv.unauth_log.burst = c->srv.unauth_cap_log.burst = COORD_UNAUTH_LOG_BURST;
    c->srv.unauth_log.window_ms = c->srv.unauth_cap_log.window_ms = COORD_UNAUTH_LOG_WINDOW_MS;
    c->srv.max_unauth = unauth_cap();
    int rc = listen_tcp(c);
    if (rc == 0 && c->cfg.ctl_socket[0])
        rc = listen_unix(c);
    return rc;
}

void coord_server_stop(coord_t *c)
{
    if (c->srv.tcp_open) {
        uv_close((uv_handle_t *)&c->srv.tcp, NULL);
        c->srv.tcp_open = 0;
    }
    if (c->srv.pipe_open) {
        uv_close((uv_handle_t *)&c->srv.pipe, NULL);
        c->srv.pipe_open = 0;
        unlink(c->cfg.ctl_socket);
    }
    for (coord_link_t *l = c->srv.links; l; l = l->next)
        coord_link_close(l);
}

int coord_link_log_ok(coord_link_t *l, uint32_t *suppressed)
{
    return ch_ratelimit_ok(&l->log_rl, ch_now_ms(), suppressed);
}
