/* chorus-rank: one rank process (DESIGN §1). workerd spawns it from the binary next to its
 * own, once per slot, with the link to workerd on fd 3; see rank.h. Not run by hand. */
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "workerd/rank/evalproc.h"
#include "workerd/rank/rank.h"

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        ch_config_version(stdout, "chorus-rank"); /* what an install or package check asks */
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], WRK_EVAL_ARG) == 0)
        return wrk_rank_eval_main(argc, argv); /* a rank's evaluation child (evalproc.h) */
    return wrk_rank_main(argc, argv);
}
