/* Hostile and mistaken peers are refused, each with a line in the coordinator's log,
 * while the daemon keeps serving: a wrong key, garbage bytes, an oversized frame, a bad
 * tag, a replayed sequence number, a control-socket client of another user. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/client.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/msg.h"
#include "harness.h"
#include "support.h"

TestSuite(security, .fini = h_teardown, .timeout = 60);

static h_cluster_t C;
static char coord_log[PATH_MAX + 32];
static size_t log_mark;

static void up(void)
{
    cr_assert_eq(h_cluster_up(&C, 1, 1), 0);
    snprintf(coord_log, sizeof coord_log, "%s/coordinatord.log", C.dir);
    log_mark = h_file_size(coord_log);
}

/* The daemon logged a line naming this peer (its port) and the reason. */
static int logged(void *ud)
{
    const char **want = ud;
    return h_file_has_since(coord_log, log_mark, want[0]) &&
           h_file_has_since(coord_log, log_mark, want[1]);
}

static void expect_logged(int port, const char *reason)
{
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", port);
    const char *want[2] = {peer, reason};
    cr_assert(h_wait_until(logged, want, 3000, 10),
              "coordinator log has no line with '%s' and '%s'", peer, reason);
}

/* The daemon still serves: over the control socket and over TCP with the key. */
static void expect_serving(void)
{
    h_out_t o;
    cr_assert_eq(h_ctl(&C, &o, "nodes", NULL), 0);
    cr_assert_eq(o.status, 0, "nodes over the socket: exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "node1"), "%s", o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(NULL, &o, "--coordinator", C.addr, "--key", C.key, "nodes", NULL), 0);
    cr_assert_eq(o.status, 0, "nodes over TCP: exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "alive"), "%s", o.out);
    h_out_free(&o);
}

static Chorus__Envelope list_nodes_env(Chorus__ListNodes *ln)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    env.list_nodes = ln;
    env.request_id = 1;
    return env;
}

Test(security, wrong_key_is_refused)
{
    char other[PATH_MAX + 32];
    ch_key_t bad;
    ch_client_t *cl = NULL;
    h_out_t o;

    up();
    cr_assert_eq(ch_auth_global_init(), 0);
    snprintf(other, sizeof other, "%s/other.key", C.dir);
    cr_assert_eq(ch_key_generate(other), 0);
    cr_assert_eq(ch_key_load(other, &bad), 0);

    /* As a worker would: the client sees that the server cannot prove the same key. */
    int rc = ch_client_connect_tcp(C.addr, &bad, "worker", 3000, &cl);
    cr_assert(rc < 0, "a client with the wrong key got in");
    cr_assert_eq(rc, CH_E_AUTH, "wrong key: %s", ch_strerror(rc));

    /* A peer that answers the challenge with a wrong proof is cut and logged. */
    int fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    int port = h_local_port(fd);
    ch_session_t s;
    rc = h_raw_handshake(fd, &bad, "worker", 1, &s);
    cr_assert(rc < 0, "a wrong proof was accepted");
    cr_assert(h_peer_closed(fd, 3000), "connection left open after a wrong proof");
    close(fd);
    expect_logged(port, ch_strerror(CH_E_AUTH));

    /* chorusctl with the wrong key says so (config error), and the right key works. */
    cr_assert_eq(h_ctl(NULL, &o, "--coordinator", C.addr, "--key", other, "nodes", NULL), 0);
    cr_assert_eq(o.status, 78, "wrong key: exit %d: %s", o.status, o.err);
    h_out_free(&o);
    expect_serving();
}

Test(security, garbage_bytes_are_refused)
{
    up();
    /* Not a frame at all: the header reads as a huge length. */
    int fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    int port = h_local_port(fd);
    const char http[] = "GET / HTTP/1.1\r\nHost: chorus\r\n\r\n";
    cr_assert_eq(h_send_all(fd, http, sizeof http - 1), 0);
    cr_assert(h_peer_closed(fd, 3000), "connection left open after garbage");
    close(fd);
    expect_logged(port, "closing");

    /* A well-formed frame whose payload is not an Envelope. */
    uint8_t frame[CH_FRAME_HDR + 24 + CH_FRAME_TAG];
    memset(frame, 0xff, sizeof frame);
    ch_frame_put_header(frame, 24);
    fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    port = h_local_port(fd);
    cr_assert_eq(h_send_all(fd, frame, sizeof frame), 0);
    cr_assert(h_peer_closed(fd, 3000), "connection left open after an undecodable frame");
    close(fd);
    expect_logged(port, ch_strerror(CH_E_FRAME));
    expect_serving();
}

Test(security, oversized_frame_is_refused)
{
    up();
    int fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    int port = h_local_port(fd);
    uint8_t hdr[CH_FRAME_HDR];
    ch_frame_put_header(hdr, CH_FRAME_MAX_DEFAULT + 1);
    cr_assert_eq(h_send_all(fd, hdr, sizeof hdr), 0);
    cr_assert(h_peer_closed(fd, 3000), "connection left open after an oversized header");
    close(fd);
    expect_logged(port, ch_strerror(CH_E_TOOBIG));
    expect_serving();
}

Test(security, bad_tag_is_refused)
{
    ch_key_t key;
    ch_session_t s;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__Envelope *resp = NULL;
    uint8_t *frame = NULL;
    size_t len = 0;

    up();
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(ch_key_load(C.key, &key), 0);
    int fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    int port = h_local_port(fd);
    cr_assert_eq(h_raw_handshake(fd, &key, "ctl", 0, &s), 0, "handshake with the right key");

    /* One correct request first: this hand-made session is a real one. */
    Chorus__Envelope env = list_nodes_env(&ln);
    cr_assert_eq(ch_msg_encode(&s, &env, &frame, &len), 0);
    cr_assert_eq(h_send_all(fd, frame, len), 0);
    free(frame);
    cr_assert_eq(h_raw_recv(fd, &s, 3000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_NODE_LIST);
    ch_msg_free(resp);

    /* Then the next one with one bit of its tag flipped. */
    env = list_nodes_env(&ln);
    env.request_id = 2;
    cr_assert_eq(ch_msg_encode(&s, &env, &frame, &len), 0);
    frame[len - 1] ^= 0x01;
    cr_assert_eq(h_send_all(fd, frame, len), 0);
    free(frame);
    cr_assert(h_peer_closed(fd, 3000), "connection left open after a bad tag");
    close(fd);
    expect_logged(port, ch_strerror(CH_E_AUTH));
    expect_serving();
}

Test(security, replayed_sequence_number_is_refused)
{
    ch_key_t key;
    ch_session_t s;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    Chorus__Envelope *resp = NULL;
    uint8_t *frame = NULL;
    size_t len = 0;

    up();
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(ch_key_load(C.key, &key), 0);
    int fd = h_tcp_connect(C.addr);
    cr_assert(fd >= 0);
    int port = h_local_port(fd);
    cr_assert_eq(h_raw_handshake(fd, &key, "ctl", 0, &s), 0);
    Chorus__Envelope env = list_nodes_env(&ln);
    cr_assert_eq(ch_msg_encode(&s, &env, &frame, &len), 0);
    cr_assert_eq(h_send_all(fd, frame, len), 0);
    cr_assert_eq(h_raw_recv(fd, &s, 3000, &resp), 0);
    cr_assert_eq(resp->body_case, CHORUS__ENVELOPE__BODY_NODE_LIST);
    ch_msg_free(resp);

    /* The very same bytes again: a valid tag, an old sequence number. */
    cr_assert_eq(h_send_all(fd, frame, len), 0);
    free(frame);
    cr_assert(h_peer_closed(fd, 3000), "connection left open after a replay");
    close(fd);
    expect_logged(port, ch_strerror(CH_E_REPLAY));
    expect_serving();
}

Test(security, control_socket_refuses_other_users)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to act as another user");
    if (ts_tmp_reachable_by(65534, 65534) < 0)
        cr_skip_test("uid 65534 can reach neither $CHORUS_TEST_TMP nor /tmp");
    up();
    /* Let uid 65534 reach the socket file, so the refusal is the daemon's own
     * SO_PEERCRED check and not the file system's. */
    cr_assert_eq(chmod(C.dir, 0755), 0);
    cr_assert_eq(chmod(C.sock, 0666), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        ch_client_t *cl = NULL;
        Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
        Chorus__Envelope env = list_nodes_env(&ln), *resp = NULL;
        if (setgid(65534) < 0 || setuid(65534) < 0)
            _exit(3);
        if (ch_client_connect_unix(C.sock, 2000, &cl) < 0)
            _exit(2); /* the kernel refused: not what this test is after */
        int rc = ch_client_call(cl, &env, 3000, &resp);
        int accepted = rc == 0 && resp && resp->body_case == CHORUS__ENVELOPE__BODY_NODE_LIST;
        _exit(accepted ? 0 : 1);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "child died");
    cr_assert_neq(WEXITSTATUS(st), 0, "uid 65534 was served on the control socket");
    cr_assert_eq(WEXITSTATUS(st), 1, "child could not try (status %d)", WEXITSTATUS(st));
    const char *want[2] = {"65534", "refused"};
    cr_assert(h_wait_until(logged, want, 3000, 10), "no log line about uid 65534");
    expect_serving();
}
