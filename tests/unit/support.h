/* Helpers shared by the unit tests: scratch directories under $CHORUS_TEST_TMP. */
#ifndef TS_SUPPORT_H
#define TS_SUPPORT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* A rank thread's failure: fmt written into msg (n bytes); -1, for `return fail(...)`. */
int ts_fail(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Make a fresh directory $CHORUS_TEST_TMP/<tag>.XXXXXX (base /tmp when the variable is unset
 * or empty; the base is created with mode 0755 if missing) and write its path to out (n
 * bytes). 0 or a negative errno. The caller removes it with ts_rmrf. */
int ts_tmpdir(const char *tag, char *out, size_t n);

/* Tests that switch to another user (uid/gid) need scratch directories that user can reach.
 * A clone in a 0700 home (/root/chorus) puts $CHORUS_TEST_TMP out of reach, so this points
 * $CHORUS_TEST_TMP, for the rest of this process, at the first of it and /tmp that uid may
 * search; later ts_tmpdir calls land there. 0, or -EACCES when neither is reachable: the
 * caller skips and says why. Needs root (it forks a child that switches user to look). */
int ts_tmp_reachable_by(unsigned uid, unsigned gid);

/* rm -rf dir: remove the tree, not following symlinks or crossing mounts. 0 (also when dir
 * is already gone) or the negative errno of the first failure. */
int ts_rmrf(const char *dir);

/* A GPT-2 safetensors file shaped as Hugging Face writes one: every tensor of cfg with HF
 * names ("transformer." prefixed when `prefixed`), wpe with `positions` rows, in dtype
 * (F32, F16 or BF16), values a deterministic function of the element index (0.02 scale).
 * 0 or a negative code. */
struct ch_model_cfg;
int ts_write_gpt2(const char *path, const struct ch_model_cfg *cfg, uint32_t positions, int dtype,
                  int prefixed);

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
