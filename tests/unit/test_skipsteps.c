/* train.skip_steps: the step -> batch map a rewound run reads by (common/skipsteps.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/skipsteps.h"

/* The map, checked against the definition: step s reads the s-th batch not listed. */
static uint64_t reference(const uint64_t *skip, int n, uint64_t step)
{
    uint64_t seen = 0;
    for (uint64_t b = 0;; b++) {
        int listed = 0;
        for (int i = 0; i < n; i++)
            listed |= skip[i] == b;
        if (!listed && seen++ == step)
            return b;
    }
}

Test(skipsteps, every_step_reads_the_next_batch_not_listed)
{
    static const uint64_t skip[] = {0, 3, 4, 9};
    for (uint64_t s = 0; s < 20; s++) {
        cr_expect_eq(ch_skip_batch_of("", s), s);
        cr_expect_eq(ch_skip_batch_of("0,3,4,9", s), reference(skip, 4, s), "step %llu",
                     (unsigned long long)s);
    }
    cr_expect_eq(ch_skip_batch_of("3", 2), 2, "steps before a skipped batch read the same data");
    cr_expect_eq(ch_skip_batch_of("3", 3), 4);
}

Test(skipsteps, add_keeps_the_list_ascending_and_refuses_a_full_one)
{
    char list[512] = "";
    cr_assert_eq(ch_skip_add(list, sizeof list, 7), 0);
    cr_assert_eq(ch_skip_add(list, sizeof list, 3), 0);
    cr_assert_eq(ch_skip_add(list, sizeof list, 12), 0);
    cr_assert_eq(ch_skip_add(list, sizeof list, 7), 0);
    cr_expect_str_eq(list, "3,7,12");
    cr_expect_eq(ch_skip_check(list, NULL, 0), 0);
    char small[4] = "3";
    cr_expect_eq(ch_skip_add(small, sizeof small, 100), CH_E_CONFIG);
    cr_expect_str_eq(small, "3", "a list that does not fit is left as it was");
    list[0] = '\0';
    for (int i = 0; i < CH_SKIP_MAX; i++)
        cr_assert_eq(ch_skip_add(list, sizeof list, (uint64_t)i * 1000), 0);
    cr_expect_eq(ch_skip_add(list, sizeof list, 1), CH_E_CONFIG);
}

Test(skipsteps, check_refuses_what_is_not_an_ascending_list)
{
    char why[128];
    cr_expect_eq(ch_skip_check("", why, sizeof why), 0);
    cr_expect_eq(ch_skip_check("1, 2,5", why, sizeof why), 0);
    cr_expect_eq(ch_skip_check("2,2", why, sizeof why), CH_E_CONFIG);
    cr_expect(strstr(why, "ascend"), "%s", why);
    cr_expect_eq(ch_skip_check("1;x", why, sizeof why), CH_E_CONFIG);
    cr_expect_eq(ch_skip_check("-1", why, sizeof why), CH_E_CONFIG);
}
