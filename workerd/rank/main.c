/* chorus-rank: one rank process (DESIGN §1). workerd spawns it from the binary next to its
 * own, once per slot, with the link to workerd on fd 3; see rank.h. Not run by hand. */
#include "workerd/rank/rank.h"

int main(int argc, char **argv)
{
    return wrk_rank_main(argc, argv);
}
