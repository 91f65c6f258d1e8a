/* Hostile peers for the hardening tests (issue 11): each attack runs from this process
 * against a coordinator on loopback, with every wait bounded, and leaves its sockets
 * open so the test can measure the daemon while the attack lasts. */
#ifndef A_ATTACK_H
#define A_ATTACK_H

#include <stddef.h>
#include <sys/types.h>

#include "common/auth.h"

/* Resident set of a process in KiB (VmRSS), or a negative code. */
long a_rss_kb(pid_t pid);
/* Peak resident set of a process in KiB (VmHWM), or a negative code. */
long a_peak_rss_kb(pid_t pid);
/* Open file descriptors of a process, or a negative code. */
int a_fd_count(pid_t pid);

/* Open n connections to addr that never authenticate: each announces a frame of
 * frame_len bytes and sends up to bytes_each of it (a send blocked for more than
 * timeout_ms, or refused, ends that connection's part). fds gets the n sockets (-1
 * where the connect failed); returns how many the server cut before all was sent. */
int a_unauth_flood(const char *addr, int n, uint32_t frame_len, size_t bytes_each, int timeout_ms,
                   int *fds);

/* Authenticate as a control client and pipeline up to n ListJobs requests without ever
 * reading a reply; stops when a send stays blocked for timeout_ms (the server stopped
 * reading us). *fd_out keeps the socket open; returns the number of requests sent. */
int a_pipeline_unread(const char *addr, const ch_key_t *key, int n, int timeout_ms, int *fd_out);

/* Read whole frames from fd until want have come or none comes for timeout_ms; returns
 * how many came (their contents are not checked). */
int a_read_frames(int fd, int want, int timeout_ms);

/* Close the fds (those >= 0). */
void a_close_all(int *fds, int n);

#endif
