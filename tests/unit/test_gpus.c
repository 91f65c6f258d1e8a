/* slots = auto / device = auto: GPUs counted from the driver's folder and narrowed by
 * CUDA_VISIBLE_DEVICES as the CUDA runtime narrows them. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/gpus.h"
#include "support.h"

Test(gpus, the_drivers_folder_counts_one_entry_per_gpu)
{
    char dir[PATH_MAX], sub[PATH_MAX + 32];
    cr_assert_eq(ts_tmpdir("gpus", dir, sizeof dir), 0);
    cr_expect_eq(ch_gpus_present(dir), 0, "an empty folder lists no GPU");
    const char *bus[] = {"0000:17:00.0", "0000:3d:00.0", "0000:63:00.0"};
    for (int i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/%s", dir, bus[i]);
        cr_assert_eq(mkdir(sub, 0755), 0);
    }
    cr_expect_eq(ch_gpus_present(dir), 3);
    snprintf(sub, sizeof sub, "%s/nope", dir);
    cr_expect_eq(ch_gpus_present(sub), 0, "no driver: no GPU (a CPU node)");
    ts_rmrf(dir);
}

Test(gpus, cuda_visible_devices_narrows_as_the_runtime_does)
{
    cr_expect_eq(ch_gpus_visible(8, NULL), 8, "unset: every GPU");
    cr_expect_eq(ch_gpus_visible(0, NULL), 0, "no GPU stays no GPU");
    cr_expect_eq(ch_gpus_visible(0, "0,1"), 0, "indices of GPUs that do not exist");
    cr_expect_eq(ch_gpus_visible(8, ""), 0, "empty hides every GPU");
    cr_expect_eq(ch_gpus_visible(8, "-1"), 0, "-1 hides every GPU");
    cr_expect_eq(ch_gpus_visible(8, "0,2, 5"), 3);
    cr_expect_eq(ch_gpus_visible(2, "0,7,1"), 1, "read up to the first index out of range");
    cr_expect_eq(ch_gpus_visible(8, "1,1,2"), 1, "a repeated index ends the list");
    cr_expect_eq(ch_gpus_visible(8, "3,x,4"), 1, "a non-number ends the list");
    cr_expect_eq(ch_gpus_visible(4, "GPU-8e6b2f1c-aaaa,GPU-1234"), 2, "UUIDs count one each");
    cr_expect_eq(ch_gpus_visible(1, "0,1,2,3"), 1, "never more than the driver lists");
}
