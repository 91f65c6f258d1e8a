/* /proc readings for metrics and pid checks; see procmetrics.h. */
#include "common/procmetrics.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"

int ch_proc_stat(int pid, ch_proc_stat_t *st)
{
    char path[64], *text = NULL;
    size_t n = 0;
    unsigned long long ut = 0, stt = 0, start = 0, rss = 0;
    char state = '?';
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int rc = ch_file_read(path, 4096, &text, &n);
    if (rc < 0)
        return rc;
    const char *p = strrchr(text, ')'); /* comm may hold spaces and parentheses */
    if (!p || sscanf(p + 2, /* fields 3..24 of proc(5): 3 state, 14 utime, 15 stime, 22 start,
                             * 24 rss */
                     "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu %*s %*s %*s %*s "
                     "%*s %*s %llu %*s %llu",
                     &state, &ut, &stt, &start, &rss) != 5)
        rc = CH_E_FORMAT;
    free(text);
    if (rc < 0)
        return rc;
    st->utime = ut;
    st->stime = stt;
    st->start_ticks = start;
    st->rss_pages = rss;
    st->state = state;
    return 0;
}

/* Appends to buf at *len; a failed fit marks *len past cap for good. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    *len = n < 0 ? cap : *len + (size_t)n;
}

/* Seconds since the epoch at boot (btime of /proc/stat), NAN when not there. */
static double boot_time(void)
{
    char *text = NULL;
    size_t n = 0;
    double boot = NAN;
    if (ch_file_read("/proc/stat", 1 << 16, &text, &n) == 0) {
        const char *bt = strstr(text, "\nbtime ");
        if (bt)
            boot = strtod(bt + 7, NULL);
    }
    free(text);
    return boot;
}

size_t ch_procmetrics_render(char *buf, size_t cap)
{
    ch_proc_stat_t st;
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    size_t len = 0;
    if (cap == 0)
        return 0;
    buf[0] = 0;
    if (tick > 0 && ch_proc_stat(0, &st) == 0) {
        double boot = boot_time();
        put(buf, cap, &len,
            "# HELP process_cpu_seconds_total User and system CPU time.\n"
            "# TYPE process_cpu_seconds_total counter\n"
            "process_cpu_seconds_total %.2f\n"
            "# HELP process_resident_memory_bytes Resident memory.\n"
            "# TYPE process_resident_memory_bytes gauge\n"
            "process_resident_memory_bytes %llu\n",
            (double)(st.utime + st.stime) / (double)tick,
            (unsigned long long)st.rss_pages * (unsigned long long)page);
        if (isfinite(boot))
            put(buf, cap, &len,
                "# HELP process_start_time_seconds Start time since the epoch.\n"
                "# TYPE process_start_time_seconds gauge\n"
                "process_start_time_seconds %.2f\n",
                boot + (double)st.start_ticks / (double)tick);
    }
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));)
        fds += e->d_name[0] != '.';
    if (d) {
        closedir(d);
        put(buf, cap, &len,
            "# HELP process_open_fds Open file descriptors.\n"
            "# TYPE process_open_fds gauge\nprocess_open_fds %d\n",
            fds - 1 /* the directory's own */);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        put(buf, cap, &len,
            "# HELP process_max_fds Descriptor limit.\n"
            "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
            (unsigned long long)rl.rlim_cur);
    if (len >= cap) {
        buf[0] = 0;
        return 0;
    }
    return len;
}
