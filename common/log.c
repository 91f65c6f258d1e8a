/* Logging (log.h). Each line is formatted into one stack buffer and written with a
 * single write(2) to stderr, so lines from threads and processes never interleave.
 *
 * When stderr is journald's stream (systemd sets JOURNAL_STREAM to its "device:inode"), a
 * line starts with its syslog priority, "<3>" for an error (sd-daemon(3)), so that
 * `journalctl -p err` finds it, and carries no timestamp of its own: the journal stamps
 * every line. A rank process inherits the variable but writes to its log file, whose
 * device and inode differ, so it keeps the timestamps. */
#include "common/log.h"

#include "common/escape.h"
#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX   4096
#define LOG_SUBSYS_MAX 256

/* The only mutable globals in Chorus (STYLE §6). Set at start-up, read afterwards. */
static char g_name[64] = "chorus";
static ch_log_level_t g_level = CH_LOG_INFO;
static char g_subsys[LOG_SUBSYS_MAX]; /* ",net,sched," or "" for all */
static int g_journal;                 /* stderr is journald's stream */

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const char *const journal_prio[] = {"<3>", "<4>", "<6>", "<7>"}; /* err .. debug */

/* Whether stderr is the stream JOURNAL_STREAM names ("device:inode", both decimal). */
static int stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev = 0, ino = 0;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) < 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

int ch_log_level_parse(const char *s, ch_log_level_t *out)
{
    static const struct {
        const char *name;
        ch_log_level_t level;
    } tab[] = {{"error", CH_LOG_ERROR}, {"warn", CH_LOG_WARN},   {"warning", CH_LOG_WARN},
               {"info", CH_LOG_INFO},   {"debug", CH_LOG_DEBUG}, {"trace", CH_LOG_DEBUG}};
    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (strcasecmp(s, tab[i].name) == 0) {
            *out = tab[i].level;
            return 0;
        }
    }
    return -EINVAL;
}

void ch_log_set_level(ch_log_level_t level)
{
    if (level >= CH_LOG_ERROR && level <= CH_LOG_DEBUG)
        g_level = level;
}

void ch_log_init(const char *name)
{
    if (name && *name)
        snprintf(g_name, sizeof g_name, "%s", name);
    ch_log_level_t lv;
    if (ch_log_level_parse(getenv("CHORUS_LOG_LEVEL"), &lv) == 0)
        g_level = lv;
    g_journal = stderr_is_journal();
    const char *sub = getenv("CHORUS_LOG_SUBSYS");
    g_subsys[0] = '\0';
    if (sub && *sub && strcmp(sub, "all") != 0) {
        /* Store as ",a,b," (spaces dropped) so a lookup is one strstr of ",name,". */
        size_t n = 0;
        g_subsys[n++] = ',';
        for (const char *p = sub; *p && n + 2 < sizeof g_subsys; p++) {
            if (*p != ' ')
                g_subsys[n++] = *p;
        }
        g_subsys[n++] = ',';
        g_subsys[n] = '\0';
    }
}

/* Errors always pass the subsystem filter: it narrows chatter, never hides failures. */
int ch_log_enabled(ch_log_level_t level, const char *subsys)
{
    if (level > g_level)
        return 0;
    if (level == CH_LOG_ERROR || !g_subsys[0])
        return 1;
    if (!subsys)
        return 0;
    char key[72];
    int k = snprintf(key, sizeof key, ",%s,", subsys);
    if (k < 0 || (size_t)k >= sizeof key)
        return 0;
    return strstr(g_subsys, key) != NULL;
}

/* "2026-12-03T16:38:36.123Z workerd INFO net: ", or under journald "<6>workerd INFO net: ". */
static int line_head(char *line, size_t size, ch_log_level_t level, const char *subsys)
{
    const char *sub = subsys ? subsys : "-";
    if (g_journal)
        return snprintf(line, size, "%s%s %s %s: ", journal_prio[level], g_name, level_names[level],
                        sub);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    return snprintf(line, size,
                    "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s %s: ", tm.tm_year + 1900,
                    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                    ts.tv_nsec / 1000000L, g_name, level_names[level], sub);
}

void ch_log(ch_log_level_t level, const char *subsys, const char *fmt, ...)
{
    if (level < CH_LOG_ERROR || level > CH_LOG_DEBUG || !ch_log_enabled(level, subsys))
        return;
    int saved_errno = errno;
    char line[LOG_LINE_MAX];
    int n = line_head(line, sizeof line, level, subsys);
    if (n < 0 || (size_t)n >= sizeof line - 8)
        goto out;
    /* The message may quote a peer (a rank's failure, a node's name): newlines become
     * spaces, so one event stays one line, and the rest is escaped (common/escape.h), so
     * no peer writes terminal controls or fake lines into the log. */
    char msg[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    for (size_t i = 0; i < mlen; i++) {
        if (msg[i] == '\n' || msg[i] == '\r')
            msg[i] = ' ';
    }
    size_t room = sizeof line - (size_t)n - 5; /* "...", newline, NUL */
    size_t w = ch_escape_n(line + n, room, msg, mlen);
    n += (int)w;
    if ((size_t)m >= sizeof msg || w + 4 >= room) {
        memcpy(line + n, "...", 3);
        n += 3;
    }
    line[n++] = '\n';
    (void)ch_write_full(2, line, (size_t)n); /* nowhere to report a failed log line */
out:
    errno = saved_errno;
}

int ch_ratelimit_ok(ch_ratelimit_t *rl, uint64_t now_ms, uint32_t *suppressed)
{
    *suppressed = 0;
    if (now_ms - rl->window_start_ms >= rl->window_ms || now_ms < rl->window_start_ms) {
        rl->window_start_ms = now_ms;
        rl->n = 0;
    }
    if (rl->n >= rl->burst) {
        rl->suppressed++;
        return 0;
    }
    rl->n++;
    *suppressed = rl->suppressed;
    rl->suppressed = 0;
    return 1;
}
