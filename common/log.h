/* Logging: one line per event to stderr, "LEVEL subsys: message", filtered by
 * level and optionally by subsystem (CHORUS_LOG_SUBSYS=net,sched). Log settings are
 * the only mutable globals in Chorus (STYLE §6). Lines are written with one write(2),
 * so concurrent threads and processes do not interleave within a line. */
#ifndef CH_LOG_H
#define CH_LOG_H

#include <stdint.h>

typedef enum { CH_LOG_ERROR = 0, CH_LOG_WARN, CH_LOG_INFO, CH_LOG_DEBUG } ch_log_level_t;

/* name is the program name printed in every line ("coordinatord"). Reads
 * CHORUS_LOG_LEVEL (error|warn|info|debug) and CHORUS_LOG_SUBSYS, and JOURNAL_STREAM: when
 * stderr is journald's stream, lines start with a syslog priority ("<3>") instead of a
 * timestamp. Call it again after redirecting stderr. */
void ch_log_init(const char *name);
void ch_log_set_level(ch_log_level_t level);
int ch_log_level_parse(const char *s, ch_log_level_t *out);
int ch_log_enabled(ch_log_level_t level, const char *subsys);
void ch_log(ch_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CH_LOGE(sub, ...) ch_log(CH_LOG_ERROR, sub, __VA_ARGS__)
#define CH_LOGW(sub, ...) ch_log(CH_LOG_WARN, sub, __VA_ARGS__)
#define CH_LOGI(sub, ...) ch_log(CH_LOG_INFO, sub, __VA_ARGS__)
#define CH_LOGD(sub, ...) ch_log(CH_LOG_DEBUG, sub, __VA_ARGS__)

/* A budget of lines per window, for events a peer can repeat at will (a flood of
 * connections that never authenticate). Owned by whoever logs; zero-initialise, then
 * set burst and window_ms. */
typedef struct ch_ratelimit {
    uint32_t burst, window_ms; /* at most burst lines per window_ms */
    uint64_t window_start_ms;
    uint32_t n, suppressed;
} ch_ratelimit_t;

/* 1 when one more line may be logged at now_ms; *suppressed then holds how many were
 * refused since the last allowed line (say so in that line). 0 when over budget. */
int ch_ratelimit_ok(ch_ratelimit_t *rl, uint64_t now_ms, uint32_t *suppressed);

/* Check macro that names its cleanup label at the call site (STYLE §3). */
#define CH_CHECK_GOTO(expr, rc, label)                                                             \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) < 0)                                                                              \
            goto label;                                                                            \
    } while (0)

#endif
