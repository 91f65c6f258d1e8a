/* Where a restart's time goes: the end of each phase of the restart under way (recovery.h,
 * coord_recovery_phase), for status's history[].phases and chorus-bench-recovery. Kept in
 * memory only: a restarted coordinator times the restarts it runs itself. */
#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "recovery.h"

static const char *const PHASES[COORD_PHASES] = {
    "kill_confirm", "placement", "rank_start", "comm_setup", "ckpt_load", "first_step", "redo"};

const char *coord_phase_name(coord_phase_t p)
{
    return p < COORD_PHASES ? PHASES[p] : "?";
}

double coord_phase_s(const coord_restart_t *h, coord_phase_t p)
{
    if (p >= COORD_PHASES || !h->phase_ms[p])
        return -1;
    uint64_t from = p == 0 ? h->time_ms : h->phase_ms[p - 1];
    if (!from)
        return -1;
    return h->phase_ms[p] > from ? (double)(h->phase_ms[p] - from) / 1000.0 : 0.0;
}

/* The one line a finished restart logs: each phase and the whole. */
static void log_phases(const coord_job_t *j, const coord_restart_t *h)
{
    char line[512];
    size_t n = 0;
    for (int p = 0; p < COORD_PHASES && n < sizeof line; p++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%s %.3f s", p ? ", " : "", PHASES[p],
                              coord_phase_s(h, (coord_phase_t)p));
    CH_LOGI("recovery",
            "job=%s gen=%" PRIu64 " restart after step %" PRIu64 " took %.3f s past it: %s", j->id,
            j->generation, h->failed_step,
            (double)(h->phase_ms[COORD_PHASE_PAST] - h->time_ms) / 1000.0, line);
}

void coord_recovery_phase(coord_t *c, coord_job_t *j, coord_phase_t p)
{
    (void)c;
    if (!j->n_history || p >= COORD_PHASES)
        return;
    coord_restart_t *h = &j->history[j->n_history - 1];
    if (h->phase_ms[p] || h->phase_ms[COORD_PHASE_PAST])
        return;
    if (p == COORD_PHASE_KILLED ? h->resumed_from >= 0 || h->failed_gen != j->generation
                                : !h->phase_ms[COORD_PHASE_KILLED] ||
                                      (p > COORD_PHASE_PLACED && h->failed_gen >= j->generation))
        return; /* not this coordinator's restart, or the failed generation's last words */
    int per_rank = p == COORD_PHASE_COMM || p == COORD_PHASE_LOADED;
    if (per_rank && ++h->phase_ranks[p] < j->world)
        return;
    h->phase_ms[p] = ch_wall_ms();
    if (p == COORD_PHASE_PAST)
        log_phases(j, h);
}
