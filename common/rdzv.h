/* Rendezvous store client interface (DESIGN §3): per (job, generation) key/value
 * store used to exchange UCX worker addresses and NCCL unique ids. In a rank process
 * it is backed by the link to workerd, which relays to coordinatord; tests back it
 * with an in-process table. Values are at most CH_RDZV_VALUE_MAX bytes. */
#ifndef CH_RDZV_H
#define CH_RDZV_H

#include <stddef.h>

#define CH_RDZV_VALUE_MAX (64u << 10)
#define CH_RDZV_KEY_MAX   256

typedef struct ch_rdzv {
    void *ud;
    /* Store value under key (overwrites). */
    int (*set)(void *ud, const char *key, const void *val, size_t len);
    /* Wait up to timeout_ms for key to exist; *val is malloc'd (caller frees).
     * -ETIMEDOUT when it does not appear in time. */
    int (*get)(void *ud, const char *key, int timeout_ms, void **val, size_t *len);
} ch_rdzv_t;

#endif
