/* Rendezvous store (DESIGN §3): key/value per (job, generation), for UCX worker
 * addresses and NCCL unique ids. Knows nothing of links or the network: a parked
 * KvGet is identified by an opaque waiter pointer plus the request id, and every answer
 * goes through the reply callback given at creation.
 *
 * Theory of operation. Namespaces (job, generation) live in a hash table; each holds a
 * hash table of entries. An entry exists once set, or earlier as a placeholder holding
 * the list of waiters parked on it. Every waiter is also in one min-heap ordered by
 * deadline, so set, get and expiry cost O(1) expected (+ O(log W) for the heap) whatever
 * the number of ranks. Dropping a generation frees its namespace and answers its
 * waiters with CH_E_ABORTED. Values are at most CH_RDZV_VALUE_MAX bytes, keys at most
 * CH_RDZV_KEY_MAX. */
#ifndef COORD_KV_H
#define COORD_KV_H

#include <stddef.h>
#include <stdint.h>

#include "common/rdzv.h"

typedef struct coord_kv coord_kv_t;

/* Caps of a generation that was not opened with its own (tests, or a job of one rank). */
#define COORD_KV_KEYS_DEFAULT    4096
#define COORD_KV_BYTES_DEFAULT   (16u << 20)
#define COORD_KV_WAITERS_DEFAULT 16384

/* Answer one parked or immediate get: code 0 with the value (borrowed for the call), or
 * -ETIMEDOUT / CH_E_ABORTED with no value. Must not call back into the store. */
typedef void (*coord_kv_reply_fn)(void *ud, void *waiter, uint64_t request_id, int code,
                                  const uint8_t *val, size_t len);

int coord_kv_create(coord_kv_reply_fn reply, void *ud, coord_kv_t **out);
/* Frees everything; parked waiters are forgotten without an answer. */
void coord_kv_destroy(coord_kv_t *kv);

/* Who may use a generation's keys (members: opaque principals, e.g. the nodes running
 * its ranks; copied) and how much it may hold: keys (placeholders of parked gets
 * included), bytes of values, parked gets. Before its first use; again to replace. */
int coord_kv_open_gen(coord_kv_t *kv, const char *job, uint64_t gen, void *const *members, size_t n,
                      size_t max_keys, size_t max_bytes, size_t max_waiters);
int coord_kv_gen_is_open(coord_kv_t *kv, const char *job, uint64_t gen);
/* 1 when the generation was opened and who is one of its members. */
int coord_kv_allowed(coord_kv_t *kv, const char *job, uint64_t gen, const void *who);

/* Store (overwrite) key; answers every waiter parked on it. CH_E_TOOBIG for a value over
 * CH_RDZV_VALUE_MAX or a key over CH_RDZV_KEY_MAX; -EINVAL for an empty key; -ENOSPC
 * past the generation's caps on keys or bytes. */
int coord_kv_set(coord_kv_t *kv, const char *job, uint64_t gen, const char *key, const uint8_t *val,
                 size_t len);
/* Answer at once when key exists (reply called before this returns); else park the
 * waiter until now_ms + timeout_ms (timeout 0: answer -ETIMEDOUT at once). -ENOSPC past
 * the generation's caps on keys or parked gets. */
int coord_kv_get(coord_kv_t *kv, const char *job, uint64_t gen, const char *key,
                 uint32_t timeout_ms, uint64_t now_ms, void *waiter, uint64_t request_id);
/* Answer -ETIMEDOUT to every waiter whose deadline is <= now_ms. */
void coord_kv_expire(coord_kv_t *kv, uint64_t now_ms);
/* 1 and the earliest deadline when a waiter is parked, else 0. */
int coord_kv_next_deadline(const coord_kv_t *kv, uint64_t *deadline_ms);
/* The generation ended: free its keys, answer its waiters CH_E_ABORTED. */
void coord_kv_drop_gen(coord_kv_t *kv, const char *job, uint64_t gen);
/* The waiter's link is gone: forget its parked requests without answering. */
void coord_kv_drop_waiter(coord_kv_t *kv, void *waiter);

/* Counts, for tests and metrics. */
size_t coord_kv_keys(const coord_kv_t *kv);
size_t coord_kv_waiters(const coord_kv_t *kv);

#endif
