/* A process as /proc shows it, for the daemons' Prometheus endpoints and for telling a
 * live process from a reused pid: the process_* family every Prometheus client library
 * exports (CPU seconds, resident memory, start time, open and maximum descriptors), and the
 * start time of any pid, which with the pid names one process for the machine's uptime. */
#ifndef CH_PROCMETRICS_H
#define CH_PROCMETRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ch_proc_stat {
    uint64_t utime, stime; /* clock ticks */
    uint64_t start_ticks;  /* clock ticks after boot: with the pid, one process */
    uint64_t rss_pages;
    char state; /* R, S, D, ...; Z: exited, not yet reaped */
} ch_proc_stat_t;

/* Fields of /proc/PID/stat (pid 0: this process). 0, -ENOENT when no such process, or
 * CH_E_FORMAT when the file does not parse. */
int ch_proc_stat(int pid, ch_proc_stat_t *st);

/* The process_* family for this process, Prometheus text with HELP and TYPE lines, into buf
 * (NUL-terminated). Returns its length, or 0 when it did not fit (buf then holds ""). 1 KiB
 * is enough. A figure /proc does not give is left out, not made up. */
size_t ch_procmetrics_render(char *buf, size_t cap);

#endif
