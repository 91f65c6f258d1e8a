/* train.skip_steps: parsing and the step -> batch map; see skipsteps.h. */
#include "skipsteps.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* list into v (ascending); the count, or -1 with why. */
static int parse(const char *list, uint64_t *v, char *why, size_t whylen)
{
    int n = 0;
    const char *p = list ? list : "";
    while (*p == ' ')
        p++;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') {
            snprintf(why, whylen, "expected batch numbers separated by commas, got '%s'", list);
            return -1;
        }
        errno = 0;
        unsigned long long b = strtoull(p, &end, 10);
        if (n == CH_SKIP_MAX) {
            snprintf(why, whylen, "more than %d batches: '%s'", CH_SKIP_MAX, list);
            return -1;
        }
        if (errno || (n > 0 && b <= v[n - 1])) {
            snprintf(why, whylen, "batch numbers must ascend: '%s'", list);
            return -1;
        }
        v[n++] = b;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',')
            p++;
        while (*p == ' ')
            p++;
    }
    return n;
}

int ch_skip_check(const char *list, char *why, size_t whylen)
{
    uint64_t v[CH_SKIP_MAX];
    return parse(list, v, why, whylen) < 0 ? CH_E_CONFIG : 0;
}

uint64_t ch_skip_batch_of(const char *list, uint64_t step)
{
    uint64_t v[CH_SKIP_MAX];
    char why[8];
    int n = parse(list, v, why, sizeof why);
    uint64_t b = step;
    for (int i = 0; i < n; i++) /* ascending: each skipped batch at or before b moves it on */
        if (v[i] <= b)
            b++;
    return b;
}

int ch_skip_add(char *list, size_t len, uint64_t batch)
{
    uint64_t v[CH_SKIP_MAX];
    char why[8], out[CH_SKIP_MAX * 21 + 1];
    int n = parse(list, v, why, sizeof why), i = 0;
    if (n < 0)
        n = 0;
    for (int k = 0; k < n; k++)
        if (v[k] == batch)
            return 0;
    if (n == CH_SKIP_MAX)
        return CH_E_CONFIG;
    size_t w = 0;
    int put = 0;
    for (int k = 0; k <= n; k++) {
        uint64_t x;
        if (!put && (i == n || batch < v[i])) {
            x = batch;
            put = 1;
        } else {
            x = v[i++];
        }
        w += (size_t)snprintf(out + w, sizeof out - w, "%s%" PRIu64, w ? "," : "", x);
    }
    if (w + 1 > len)
        return CH_E_CONFIG;
    memcpy(list, out, w + 1);
    return 0;
}
