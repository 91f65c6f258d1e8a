/* Helpers shared by the unit tests: scratch directories under $CHORUS_TEST_TMP. */
#ifndef TS_SUPPORT_H
#define TS_SUPPORT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Make a fresh directory $CHORUS_TEST_TMP/<tag>.XXXXXX (base /tmp when the variable is unset
 * or empty; the base is created with mode 0755 if missing) and write its path to out (n
 * bytes). 0 or a negative errno. The caller removes it with ts_rmrf. */
int ts_tmpdir(const char *tag, char *out, size_t n);

/* rm -rf dir: remove the tree, not following symlinks or crossing mounts. 0 (also when dir
 * is already gone) or the negative errno of the first failure. */
int ts_rmrf(const char *dir);

/* An in-process rendezvous store (ch_rdzv_t set/get) for ranks run as threads of one test:
 * a list under a mutex, get waits on a condition variable up to its timeout. */
typedef struct ts_kv {
    struct ts_kv *next;
    char *key;
    void *val;
    size_t len;
} ts_kv_t;

typedef struct ts_rdzv_table {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ts_kv_t *head;
} ts_rdzv_table_t;

void ts_rdzv_table_init(ts_rdzv_table_t *t);
void ts_rdzv_table_fini(ts_rdzv_table_t *t);
int ts_rdzv_table_set(void *ud, const char *key, const void *val, size_t len);
/* The newest value of key; -ETIMEDOUT after timeout_ms. Caller frees *val. */
int ts_rdzv_table_get(void *ud, const char *key, int timeout_ms, void **val, size_t *len);

/* Run fn on n threads, thread i getting (char *)ranks + i * stride, and join them all.
 * For tests whose ranks are threads; 0 or the first pthread_create error. */
int ts_run_threads(void *ranks, size_t stride, uint32_t n, void *(*fn)(void *));

/* A UCX collectives context for rank `rank` of n meeting through table (support_coll.c,
 * linked only into the tests of rooms that use the collectives). */
typedef struct wrk_coll wrk_coll_t;
int ts_coll_create(ts_rdzv_table_t *table, uint32_t rank, uint32_t n, int timeout_ms,
                   wrk_coll_t **out);
/* The configuration ts_coll_create uses, for a caller that changes it before
 * wrk_coll_create (another backend table, host staging). */
struct wrk_coll_config;
void ts_coll_config(ts_rdzv_table_t *table, uint32_t rank, uint32_t n, int timeout_ms,
                    struct wrk_coll_config *cfg);

#endif
