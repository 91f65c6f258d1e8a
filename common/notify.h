/* systemd's notification protocol (Type=notify), for both daemons: one datagram to
 * $NOTIFY_SOCKET ('@' for an abstract socket), as sd_notify(3) sends it. Self-contained, so
 * the daemons need no libsystemd. Every call is a no-op returning 0 when NOTIFY_SOCKET is
 * unset (not run by systemd). */
#ifndef CH_NOTIFY_H
#define CH_NOTIFY_H

#include <stdint.h>

/* Send state: "READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1". 0 or a negative errno. */
int ch_notify(const char *state);
/* 1 with *usec = the watchdog interval when WATCHDOG_USEC applies to this process
 * (WATCHDOG_PID unset or ours), else 0. */
int ch_notify_watchdog_usec(uint64_t *usec);

#endif
