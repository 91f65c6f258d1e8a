/* Rendezvous store: immediate and parked gets, timeouts, limits, generations, scale. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "kv.h"

typedef struct answer {
    void *who;
    uint64_t rid;
    int code;
    char val[64];
    size_t len;
} answer_t;

typedef struct sink {
    answer_t a[64];
    size_t n, total;
} sink_t;

static void on_reply(void *ud, void *who, uint64_t rid, int code, const uint8_t *val, size_t len)
{
    sink_t *s = ud;
    s->total++;
    if (s->n == 64)
        return;
    answer_t *a = &s->a[s->n++];
    a->who = who;
    a->rid = rid;
    a->code = code;
    a->len = len;
    memset(a->val, 0, sizeof(a->val));
    if (val)
        memcpy(a->val, val, len < sizeof(a->val) - 1 ? len : sizeof(a->val) - 1);
}

static const uint8_t *B(const char *s)
{
    return (const uint8_t *)s;
}

Test(kv, get_after_set_answers_at_once)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int link;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "addr/0", B("hello"), 5), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "addr/0", 1000, 0, &link, 7), 0);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.a[0].who, &link);
    cr_assert_eq(s.a[0].rid, 7);
    cr_assert_eq(s.a[0].code, 0);
    cr_assert_str_eq(s.a[0].val, "hello");
    cr_assert_eq(coord_kv_keys(kv), 1);
    /* Overwrite. */
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "addr/0", B("bye"), 3), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "addr/0", 0, 0, &link, 8), 0);
    cr_assert_str_eq(s.a[1].val, "bye");
    cr_assert_eq(coord_kv_keys(kv), 1);
    coord_kv_destroy(kv);
}

Test(kv, parked_get_is_answered_by_set)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int a, b;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 2, "nccl-id", 5000, 100, &a, 1), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 2, "nccl-id", 5000, 100, &b, 2), 0);
    cr_assert_eq(s.n, 0);
    cr_assert_eq(coord_kv_waiters(kv), 2);
    cr_assert_eq(coord_kv_keys(kv), 0, "a placeholder is not a key");
    cr_assert_eq(coord_kv_set(kv, "j1", 2, "nccl-id", B("ID"), 2), 0);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.a[0].code, 0);
    cr_assert_eq(s.a[1].code, 0);
    cr_assert_str_eq(s.a[0].val, "ID");
    cr_assert_eq(coord_kv_waiters(kv), 0);
    uint64_t d;
    cr_assert_eq(coord_kv_next_deadline(kv, &d), 0);
    coord_kv_destroy(kv);
}

Test(kv, timeout_answers_etimedout_in_deadline_order)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int w;
    uint64_t d = 0;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "late", 300, 1000, &w, 3), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "soon", 100, 1000, &w, 1), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "mid", 200, 1000, &w, 2), 0);
    cr_assert_eq(coord_kv_next_deadline(kv, &d), 1);
    cr_assert_eq(d, 1100);
    coord_kv_expire(kv, 1099);
    cr_assert_eq(s.n, 0);
    coord_kv_expire(kv, 1250);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.a[0].rid, 1);
    cr_assert_eq(s.a[0].code, -ETIMEDOUT);
    cr_assert_eq(s.a[1].rid, 2);
    cr_assert_eq(coord_kv_next_deadline(kv, &d), 1);
    cr_assert_eq(d, 1300);
    /* Timeout 0: answered at once, nothing parked. */
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "nothing", 0, 1250, &w, 9), 0);
    cr_assert_eq(s.a[2].rid, 9);
    cr_assert_eq(s.a[2].code, -ETIMEDOUT);
    cr_assert_eq(coord_kv_waiters(kv), 1);
    coord_kv_destroy(kv);
}

Test(kv, limits)
{
    sink_t s = {0};
    coord_kv_t *kv;
    static uint8_t big[CH_RDZV_VALUE_MAX + 1];
    char key[CH_RDZV_KEY_MAX + 2];
    int w;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "v", big, CH_RDZV_VALUE_MAX), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "v", big, CH_RDZV_VALUE_MAX + 1), CH_E_TOOBIG);
    memset(key, 'k', sizeof(key));
    key[CH_RDZV_KEY_MAX] = 0;
    cr_assert_eq(coord_kv_set(kv, "j1", 1, key, B("x"), 1), 0);
    key[CH_RDZV_KEY_MAX] = 'k';
    key[CH_RDZV_KEY_MAX + 1] = 0;
    cr_assert_eq(coord_kv_set(kv, "j1", 1, key, B("x"), 1), CH_E_TOOBIG);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, key, 10, 0, &w, 1), CH_E_TOOBIG);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "", B("x"), 1), -EINVAL);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "empty-value", NULL, 0), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "empty-value", 10, 0, &w, 2), 0);
    cr_assert_eq(s.a[0].code, 0);
    cr_assert_eq(s.a[0].len, 0);
    coord_kv_destroy(kv);
}

Test(kv, generations_are_separate_and_dropped)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int w;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "k", B("gen1"), 4), 0);
    cr_assert_eq(coord_kv_set(kv, "j2", 1, "k", B("other"), 5), 0);
    /* Generation 2 does not see generation 1's key. */
    cr_assert_eq(coord_kv_get(kv, "j1", 2, "k", 0, 0, &w, 1), 0);
    cr_assert_eq(s.a[0].code, -ETIMEDOUT);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "pending", 1000, 0, &w, 2), 0);
    coord_kv_drop_gen(kv, "j1", 1);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.a[1].rid, 2);
    cr_assert_eq(s.a[1].code, CH_E_ABORTED);
    cr_assert_eq(coord_kv_waiters(kv), 0);
    cr_assert_eq(coord_kv_keys(kv), 1);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "k", 0, 0, &w, 3), 0);
    cr_assert_eq(s.a[2].code, -ETIMEDOUT);
    cr_assert_eq(coord_kv_get(kv, "j2", 1, "k", 0, 0, &w, 4), 0);
    cr_assert_str_eq(s.a[3].val, "other");
    coord_kv_drop_gen(kv, "j9", 9); /* unknown: nothing happens */
    coord_kv_destroy(kv);
}

Test(kv, dropping_a_waiter_forgets_only_its_requests)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int a, b;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    for (int i = 0; i < 10; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i % 3);
        cr_assert_eq(
            coord_kv_get(kv, "j1", 1, key, 1000u + (uint32_t)i, 0, i % 2 ? &a : &b, (uint64_t)i),
            0);
    }
    coord_kv_drop_waiter(kv, &a);
    cr_assert_eq(coord_kv_waiters(kv), 5);
    cr_assert_eq(s.n, 0);
    coord_kv_expire(kv, 10000);
    cr_assert_eq(s.n, 5);
    for (size_t i = 0; i < s.n; i++)
        cr_assert_eq(s.a[i].who, &b);
    coord_kv_destroy(kv);
}

static double secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* 10,000 ranks: each parks a get on its neighbour's key, then each sets its own. */
Test(kv, ten_thousand_ranks_stay_fast)
{
    enum { N = 10000 };
    sink_t s = {0};
    coord_kv_t *kv;
    int w;
    char key[32];
    void *member = &w;
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    /* Caps as the coordinator opens a 10,000-rank generation with (rpc.c). */
    cr_assert_eq(
        coord_kv_open_gen(kv, "j1", 1, &member, 1, 16 * N + 64, (N + 16) * 65536ul, 64 * N + 1024),
        0);
    double t0 = secs();
    for (int r = 0; r < N; r++) {
        snprintf(key, sizeof(key), "ucx-addr/%d", (r + 1) % N);
        cr_assert_eq(coord_kv_get(kv, "j1", 1, key, 60000, 0, &w, (uint64_t)r), 0);
    }
    for (int r = 0; r < N; r++) {
        snprintf(key, sizeof(key), "ucx-addr/%d", r);
        cr_assert_eq(coord_kv_set(kv, "j1", 1, key, B("0123456789abcdef"), 16), 0);
    }
    for (int r = 0; r < N; r++) {
        snprintf(key, sizeof(key), "ucx-addr/%d", r);
        cr_assert_eq(coord_kv_get(kv, "j1", 1, key, 60000, 0, &w, (uint64_t)r), 0);
    }
    double dt = secs() - t0;
    cr_assert_eq(s.total, 2 * N);
    cr_assert_eq(coord_kv_waiters(kv), 0);
    cr_assert_eq(coord_kv_keys(kv), N);
    cr_assert_lt(dt, 2.0, "30,000 operations took %.3f s", dt);
    coord_kv_drop_gen(kv, "j1", 1);
    cr_assert_eq(coord_kv_keys(kv), 0);
    coord_kv_destroy(kv);
}

/* Issue 11 class 4: a generation's store belongs to its members and is capped in keys,
 * bytes and parked gets. */
Test(kv, members_and_caps)
{
    sink_t s = {0};
    coord_kv_t *kv;
    int n1, n2, stranger, link;
    void *members[] = {&n2, &n1, &n1};
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    cr_assert_not(coord_kv_gen_is_open(kv, "j1", 1));
    cr_assert_not(coord_kv_allowed(kv, "j1", 1, &n1), "an unopened generation has no members");
    cr_assert_eq(coord_kv_open_gen(kv, "j1", 1, members, 3, 4, 100, 2), 0);
    cr_assert(coord_kv_gen_is_open(kv, "j1", 1));
    cr_assert(coord_kv_allowed(kv, "j1", 1, &n1));
    cr_assert(coord_kv_allowed(kv, "j1", 1, &n2));
    cr_assert_not(coord_kv_allowed(kv, "j1", 1, &stranger));
    cr_assert_not(coord_kv_allowed(kv, "j1", 2, &n1), "members are per generation");

    /* Bytes: 60 + 40 fit 100; 41 more do not; overwriting within the cap does. */
    static uint8_t v[64];
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "a", v, 60), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "b", v, 40), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "c", v, 1), -ENOSPC);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "a", v, 10), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "c", v, 50), 0);
    /* Keys: a, b, c and one more (a parked get's placeholder counts). */
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "d", 1000, 0, &link, 1), 0);
    cr_assert_eq(coord_kv_set(kv, "j1", 1, "e", v, 0), -ENOSPC);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "f", 1000, 0, &link, 2), -ENOSPC);
    /* Parked gets: 2 at most. */
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "d", 1000, 0, &link, 3), 0);
    cr_assert_eq(coord_kv_get(kv, "j1", 1, "d", 1000, 0, &link, 4), -ENOSPC);
    cr_assert_eq(coord_kv_waiters(kv), 2);
    /* Dropping the generation frees it all. */
    coord_kv_drop_gen(kv, "j1", 1);
    cr_assert_eq(coord_kv_keys(kv), 0);
    cr_assert_eq(coord_kv_waiters(kv), 0);
    cr_assert_not(coord_kv_gen_is_open(kv, "j1", 1));
    coord_kv_destroy(kv);
}

Test(kv, unopened_generations_have_default_caps)
{
    sink_t s = {0};
    coord_kv_t *kv;
    char key[32];
    cr_assert_eq(coord_kv_create(on_reply, &s, &kv), 0);
    int rc = 0, i = 0;
    for (; i < COORD_KV_KEYS_DEFAULT + 10 && rc == 0; i++) {
        snprintf(key, sizeof key, "k/%d", i);
        rc = coord_kv_set(kv, "j1", 1, key, B("x"), 1);
    }
    cr_assert_eq(rc, -ENOSPC);
    cr_assert_eq(i, COORD_KV_KEYS_DEFAULT + 1);
    coord_kv_destroy(kv);
}
