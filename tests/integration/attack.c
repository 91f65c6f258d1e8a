/* Hostile peers (attack.h). Plain sockets and the harness's hand-made handshake. */
#include "attack.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <dirent.h>

#include "common/frame.h"
#include "common/msg.h"
#include "common/util.h"
#include "harness.h"

static long status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    long kb = -ENOENT;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, strlen(field)) == 0 &&
            sscanf(line + strlen(field), " %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

long a_rss_kb(pid_t pid)
{
    return status_kb(pid, "VmRSS:");
}

long a_peak_rss_kb(pid_t pid)
{
    return status_kb(pid, "VmHWM:");
}

int a_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Send len bytes, waiting at most timeout_ms for room each time; -ETIMEDOUT or the
 * socket's error when it cannot. */
static int send_bounded(int fd, const void *buf, size_t len, int timeout_ms)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd q = {fd, POLLOUT, 0};
            int r = poll(&q, 1, timeout_ms);
            if (r == 0)
                return -ETIMEDOUT;
            if (r < 0 && errno != EINTR)
                return -errno;
            continue;
        }
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int a_unauth_flood(const char *addr, int n, uint32_t frame_len, size_t bytes_each, int timeout_ms,
                   int *fds)
{
    static uint8_t chunk[64 << 10];
    int cut = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = h_tcp_connect(addr);
        if (fds[i] < 0)
            continue;
        uint8_t hdr[CH_FRAME_HDR];
        ch_frame_put_header(hdr, frame_len);
        int rc = send_bounded(fds[i], hdr, sizeof hdr, timeout_ms);
        for (size_t sent = 0; rc == 0 && sent < bytes_each; sent += sizeof chunk) {
            size_t k = bytes_each - sent < sizeof chunk ? bytes_each - sent : sizeof chunk;
            rc = send_bounded(fds[i], chunk, k, timeout_ms);
        }
        cut += rc < 0 && rc != -ETIMEDOUT;
    }
    return cut;
}

int a_pipeline_unread(const char *addr, const ch_key_t *key, int n, int timeout_ms, int *fd_out)
{
    ch_session_t s;
    *fd_out = -1;
    int fd = h_tcp_connect(addr);
    if (fd < 0)
        return fd;
    int rc = h_raw_handshake(fd, key, "ctl", 0, &s);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    /* Our receive buffer is the kernel's default (a fixed small one would keep its
     * window small once we read): unread, it holds ~128 KiB of the replies, and the
     * rest back up in the daemon. */
    int sent = 0;
    for (; sent < n; sent++) {
        Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
        Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
        uint8_t *frame = NULL;
        size_t len = 0;
        env.request_id = (uint64_t)sent + 1;
        env.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
        env.list_jobs = &lj;
        if (ch_msg_encode(&s, &env, &frame, &len) < 0)
            break;
        rc = send_bounded(fd, frame, len, timeout_ms);
        free(frame);
        if (rc < 0)
            break;
    }
    *fd_out = fd;
    return sent;
}

int a_read_frames(int fd, int want, int timeout_ms)
{
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, CH_FRAME_MAX_DEFAULT);
    int got = 0;
    uint8_t chunk[64 << 10];
    while (got < want) {
        const uint8_t *payload, *tag;
        size_t len;
        int rc = ch_frame_reader_next(&r, &payload, &len, &tag);
        if (rc < 0)
            break;
        if (rc > 0) {
            got++;
            continue;
        }
        struct pollfd q = {fd, POLLIN, 0};
        int pr = poll(&q, 1, timeout_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            break;
        ssize_t n = recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0 || ch_frame_reader_feed(&r, chunk, (size_t)n) < 0)
            break;
    }
    ch_frame_reader_fini(&r);
    return got;
}

void a_close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}
