/* coordinatord/series: bounded memory over any number of steps, every step of a short
 * run kept, rewinding on a resume, the heat map's rows, and the saved form (round trip,
 * hostile blobs refused). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "series.h"

static coord_point_t point(uint64_t step)
{
    coord_point_t p = {step, 10.0f / (float)step, 1000.0f, 0.5f, 4.0f, NAN};
    return p;
}

Test(series, a_short_run_keeps_every_step)
{
    coord_series_t *s = NULL;
    coord_point_t out[COORD_SERIES_RECENT + COORD_SERIES_HISTORY];
    cr_assert_eq(coord_series_create(1, 2, &s), 0);
    for (uint64_t k = 1; k <= 100; k++) {
        coord_point_t p = point(k);
        coord_series_add_point(s, &p);
    }
    size_t n = coord_series_points(s, out, sizeof out / sizeof out[0]);
    cr_assert_eq(n, 100);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i].step, i + 1);
    coord_series_free(s);
}

Test(series, a_long_run_stays_bounded_recent_in_full_history_thinned)
{
    coord_series_t *s = NULL;
    enum { MAXP = COORD_SERIES_RECENT + COORD_SERIES_HISTORY };
    coord_point_t out[MAXP];
    cr_assert_eq(coord_series_create(1, 1, &s), 0);
    const uint64_t steps = 1000000;
    for (uint64_t k = 1; k <= steps; k++) {
        coord_point_t p = point(k);
        coord_series_add_point(s, &p);
    }
    size_t n = coord_series_points(s, out, MAXP);
    cr_assert_leq(n, MAXP);
    cr_expect_gt(n, COORD_SERIES_RECENT + COORD_SERIES_HISTORY / 4, "history too thin: %zu", n);
    /* In step order; the last RECENT are the last steps, one by one. */
    for (size_t i = 1; i < n; i++)
        cr_expect_lt(out[i - 1].step, out[i].step);
    for (size_t i = 0; i < COORD_SERIES_RECENT; i++)
        cr_expect_eq(out[n - 1 - i].step, steps - i);
    /* The history reaches back to the start of the run. */
    cr_expect_lt(out[0].step, steps / 100, "oldest kept step %llu",
                 (unsigned long long)out[0].step);
    coord_series_free(s);
}

Test(series, a_resume_from_a_checkpoint_rewinds_the_curve)
{
    coord_series_t *s = NULL;
    coord_point_t out[64];
    cr_assert_eq(coord_series_create(1, 2, &s), 0);
    for (uint64_t k = 1; k <= 30; k++) {
        coord_point_t p = point(k);
        coord_series_add_point(s, &p);
        coord_series_add_heat(s, k, 1, 5.0f);
    }
    for (uint64_t k = 21; k <= 25; k++) { /* resumed from the checkpoint at step 20 */
        coord_point_t p = point(k);
        coord_series_add_point(s, &p);
    }
    size_t n = coord_series_points(s, out, 64);
    cr_assert_eq(n, 25);
    cr_expect_eq(out[24].step, 25);
    cr_expect(isnan(coord_series_heat_at(s, 28, 1)), "heat of a step run again is stale");
    cr_expect_eq(coord_series_heat_at(s, 20, 1), 5.0f);
    coord_series_free(s);
}

Test(series, heat_rows_are_the_last_steps_in_order)
{
    coord_series_t *s = NULL;
    uint64_t steps[COORD_SERIES_HEAT_STEPS];
    cr_assert_eq(coord_series_create(1, 3, &s), 0);
    for (uint64_t k = 1; k <= 100; k++)
        for (uint32_t r = 0; r < 3; r++)
            coord_series_add_heat(s, k, r, (float)(k * 10 + r));
    coord_series_add_heat(s, 50, 0, 1.0f);  /* late and older than its row: dropped */
    coord_series_add_heat(s, 100, 7, 1.0f); /* no such rank: dropped */
    size_t n = coord_series_heat_rows(s, steps, COORD_SERIES_HEAT_STEPS);
    cr_assert_eq(n, COORD_SERIES_HEAT_STEPS);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(steps[i], 100 - COORD_SERIES_HEAT_STEPS + 1 + i);
    cr_expect_eq(coord_series_heat_at(s, 100, 2), 1002.0f);
    cr_expect(isnan(coord_series_heat_at(s, 50, 0)));
    coord_series_free(s);
}

Test(series, saved_form_round_trips_and_refuses_damage)
{
    coord_series_t *s = NULL, *back = NULL;
    void *blob = NULL;
    size_t len = 0;
    coord_point_t a[600], b[600];
    cr_assert_eq(coord_series_create(7, 4, &s), 0);
    for (uint64_t k = 1; k <= 3000; k++) {
        coord_point_t p = point(k);
        coord_series_add_point(s, &p);
        coord_series_add_heat(s, k, (uint32_t)(k % 4), (float)k);
    }
    cr_assert_eq(coord_series_encode(s, &blob, &len), 0);
    cr_assert_eq(coord_series_decode(7, blob, len, &back), 0);
    size_t na = coord_series_points(s, a, 600), nb = coord_series_points(back, b, 600);
    cr_assert_eq(na, nb);
    cr_expect_eq(memcmp(a, b, na * sizeof a[0]), 0);
    cr_expect_eq(back->stride, s->stride);
    cr_expect_eq(coord_series_heat_at(back, 3000, 0), 3000.0f);
    /* Adding after a reload continues the same series. */
    coord_point_t p = point(3001);
    coord_series_add_point(back, &p);
    nb = coord_series_points(back, b, 600);
    cr_expect_eq(b[nb - 1].step, 3001);
    cr_expect_eq(b[nb - 2].step, 3000);
    coord_series_free(back);

    unsigned char *bytes = blob;
    for (size_t cut = 0; cut < len; cut += len / 50 + 1)
        cr_expect_eq(coord_series_decode(7, blob, cut, &back), CH_E_FORMAT, "cut at %zu", cut);
    for (size_t at = 0; at < 32; at++) { /* header fields */
        bytes[at] ^= 0x5a;
        int rc = coord_series_decode(7, blob, len, &back);
        if (rc == 0)
            coord_series_free(back); /* a change that still describes a valid series */
        else
            cr_expect_eq(rc, CH_E_FORMAT);
        bytes[at] ^= 0x5a;
    }
    free(blob);
    coord_series_free(s);
}
