/* Test helpers that need the collectives (support.h): linked into the tests of the
 * rooms that use them. */
#include "support.h"

#include "workerd/coll/coll.h"

void ts_coll_config(ts_rdzv_table_t *table, uint32_t rank, uint32_t n, int timeout_ms,
                    wrk_coll_config_t *cfg)
{
    wrk_coll_config_defaults(cfg);
    cfg->rank = rank;
    cfg->world_size = n;
    cfg->rdzv = (ch_rdzv_t){.ud = table, .set = ts_rdzv_table_set, .get = ts_rdzv_table_get};
    cfg->timeout_ms = timeout_ms;
}

int ts_coll_create(ts_rdzv_table_t *table, uint32_t rank, uint32_t n, int timeout_ms,
                   wrk_coll_t **out)
{
    wrk_coll_config_t cfg;
    ts_coll_config(table, rank, n, timeout_ms, &cfg);
    return wrk_coll_create(&cfg, out);
}
