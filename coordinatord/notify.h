/* systemd notification (Type=notify): the only module that includes sd-daemon.h.
 * Every call is a no-op returning 0 when NOTIFY_SOCKET is unset or libsystemd was not
 * found at build time. */
#ifndef COORD_NOTIFY_H
#define COORD_NOTIFY_H

#include <stdint.h>

int coord_notify(const char *state); /* "READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1" */
/* 1 with the watchdog interval when WATCHDOG_USEC applies to this process, else 0. */
int coord_notify_watchdog_usec(uint64_t *usec);

#endif
