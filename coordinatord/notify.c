/* systemd notification wrapper; see notify.h. */
#include "notify.h"

#ifdef CHORUS_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

int coord_notify(const char *state)
{
#ifdef CHORUS_HAVE_SYSTEMD
    int rc = sd_notify(0, state);
    return rc < 0 ? rc : 0;
#else
    (void)state;
    return 0;
#endif
}

int coord_notify_watchdog_usec(uint64_t *usec)
{
#ifdef CHORUS_HAVE_SYSTEMD
    uint64_t u = 0;
    if (sd_watchdog_enabled(0, &u) > 0 && u > 0) {
        *usec = u;
        return 1;
    }
#endif
    (void)usec;
    return 0;
}
