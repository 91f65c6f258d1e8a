/* workerd's queue of rank events held while the coordinator link is down (evqueue.h): a
 * queued event owns all of its memory, so the caller's event may go away at once. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "workerd/evqueue.h"

/* An event with every kind of pointer field a RankEvent has: strings, repeated metrics. */
static Chorus__RankEvent *heap_event(void)
{
    Chorus__RankEvent *ev = calloc(1, sizeof *ev);
    chorus__rank_event__init(ev);
    ev->kind = CHORUS__RANK_EVENT_KIND__RANK_FAILED;
    ev->job_id = strdup("job-7");
    ev->message = strdup("rank 3: nccl timeout");
    ev->timeout_group = strdup("tp");
    ev->cause_class = strdup("transient");
    ev->rank = 3;
    ev->step = 41;
    ev->n_metrics = 1;
    ev->metrics = calloc(1, sizeof *ev->metrics);
    ev->metrics[0] = calloc(1, sizeof **ev->metrics);
    chorus__metric__init(ev->metrics[0]);
    ev->metrics[0]->name = strdup("step_ms");
    ev->metrics[0]->value = 12.5;
    ev->n_group_entered = 1;
    ev->group_entered = calloc(1, sizeof *ev->group_entered);
    ev->group_entered[0] = calloc(1, sizeof **ev->group_entered);
    chorus__metric__init(ev->group_entered[0]);
    ev->group_entered[0]->name = strdup("dp");
    ev->group_entered[0]->value = 17;
    return ev;
}

/* Frees and scribbles: whatever a copy still shared with it would read garbage. */
static void wipe_event(Chorus__RankEvent *ev)
{
    char *strs[] = {ev->job_id,      ev->message,          ev->timeout_group,
                    ev->cause_class, ev->metrics[0]->name, ev->group_entered[0]->name};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        memset(strs[i], 'X', strlen(strs[i]));
        free(strs[i]);
    }
    ev->metrics[0]->value = -1;
    ev->group_entered[0]->value = -1;
    free(ev->metrics[0]);
    free(ev->metrics);
    free(ev->group_entered[0]);
    free(ev->group_entered);
    free(ev);
}

Test(evqueue, a_queued_event_keeps_every_field_after_the_original_is_gone)
{
    wrk_evq_t q;
    cr_assert_eq(wrk_evq_init(&q), 0);
    Chorus__RankEvent *ev = heap_event();
    wrk_evq_push(&q, ev);
    wipe_event(ev);

    Chorus__RankEvent *got = wrk_evq_front(&q);
    cr_assert_not_null(got);
    cr_assert_str_eq(got->job_id, "job-7");
    cr_assert_str_eq(got->message, "rank 3: nccl timeout");
    cr_assert_str_eq(got->timeout_group, "tp");
    cr_assert_str_eq(got->cause_class, "transient");
    cr_assert_eq(got->rank, 3);
    cr_assert_eq(got->step, 41);
    cr_assert_eq(got->n_metrics, 1);
    cr_assert_str_eq(got->metrics[0]->name, "step_ms");
    cr_assert_float_eq(got->metrics[0]->value, 12.5, 0);
    cr_assert_eq(got->n_group_entered, 1);
    cr_assert_str_eq(got->group_entered[0]->name, "dp");
    cr_assert_float_eq(got->group_entered[0]->value, 17, 0);
    wrk_evq_fini(&q);
}
