/* What a rank tells workerd: a diag job's progress reports rate-limited at the source, so
 * a tiny job running thousands of rounds a second cannot flood workerd and the
 * coordinator, while the last round and every new kind of metric still arrive. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/client.h"
#include "common/msg.h"
#include "common/util.h"
#include "workerd/rank/rank.h"

/* rank r's link and the peer workerd would hold. */
static void link_pair(wrk_rank_t *r, ch_client_t **peer)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(ch_client_from_fd(sv[0], &r->link), 0);
    cr_assert_eq(ch_client_from_fd(sv[1], peer), 0);
}

/* Reports the peer received: how many, and the last step. */
static int drain(ch_client_t *peer, uint64_t *last_step, int *named_other)
{
    Chorus__Envelope *env = NULL;
    int n = 0;
    while (ch_client_recv(peer, 0, &env) == 0) {
        const Chorus__RankEvent *ev = env->rank_event;
        n++;
        *last_step = ev->step;
        for (size_t m = 0; m < ev->n_metrics; m++)
            *named_other += strcmp(ev->metrics[m]->name, "other") == 0;
        ch_msg_free(env);
    }
    return n;
}

Test(rank, progress_is_rate_limited_at_the_source)
{
    enum { STEPS = 20000 };
    static wrk_rank_t r; /* large: off the stack */
    ch_client_t *peer = NULL;
    Chorus__Metric m = CHORUS__METRIC__INIT, o = CHORUS__METRIC__INIT, *mp = &m, *op = &o;
    m.name = "gflops";
    o.name = "other";
    memset(&r, 0, sizeof r);
    snprintf(r.job_id, sizeof r.job_id, "j1");
    link_pair(&r, &peer);

    uint64_t t0 = ch_now_ms(), last = 0;
    int received = 0, other = 0;
    for (uint64_t s = 1; s <= STEPS; s++) {
        /* one report in a thousand names another metric: it goes out whatever the rate */
        int odd = s % 1000 == 500;
        cr_assert_eq(wrk_rank_progress(&r, s, STEPS, 1.0, 0, 0, odd ? &op : &mp, 1), 0);
        received += drain(peer, &last, &other); /* keep the socket buffer empty */
    }
    uint64_t ms = ch_now_ms() - t0;
    received += drain(peer, &last, &other);
    /* at most one per window, plus the odd ones, the ones right after them and the last */
    uint64_t bound = ms / WRK_RANK_PROGRESS_MIN_MS + 1 + 2 * (STEPS / 1000) + 1;
    cr_assert(received <= (int)bound, "%d reports for %d steps in %llu ms (bound %llu)", received,
              STEPS, (unsigned long long)ms, (unsigned long long)bound);
    cr_assert_eq(other, STEPS / 1000, "reports naming another metric were left out");
    cr_assert_eq(last, STEPS, "the last step was not reported");
    ch_client_destroy(peer);
    ch_client_destroy(r.link);
}
