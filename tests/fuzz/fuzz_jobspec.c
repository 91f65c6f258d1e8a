/* Fuzz target: job files (common/jobspec.h).
 *
 * Input: job file text, optionally followed by NUL-separated "section.key=value"
 * overrides (as chorusctl submit --set applies them). A spec that parses must format to
 * canonical text that parses back to the identical struct (specs compare with memcmp:
 * defaults zero the padding and string tails) and formats to the identical text;
 * validation (without file checks) must give the same verdict on both, and any error
 * must leave a message. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "fuzz.h"

#define MAX_SETS 8

static void check_err(int rc, const char *err, size_t errlen)
{
    FUZZ_ASSERT(memchr(err, '\0', errlen) != NULL);
    if (rc < 0)
        FUZZ_ASSERT(rc == CH_E_CONFIG || rc == -ENOMEM);
    if (rc == CH_E_CONFIG)
        FUZZ_ASSERT(err[0] != '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    size_t used = strlen(text) + 1;
    ch_jobspec_t *j = malloc(sizeof *j), *k = malloc(sizeof *k);
    char err[512] = "", err2[512] = "";
    char *canon = NULL, *canon2 = NULL;
    FUZZ_ASSERT(j && k);

    int rc = ch_jobspec_parse(text, j, err, sizeof err);
    check_err(rc, err, sizeof err);
    for (int i = 0; rc == 0 && i < MAX_SETS && used < size; i++) {
        char *set = fuzz_cstr(data + used, size - used);
        used += strlen(set) + 1;
        ch_jobspec_t before = *j;
        err[0] = '\0';
        int src = ch_jobspec_set(j, set, err, sizeof err);
        check_err(src, err, sizeof err);
        if (src < 0) /* a refused override changes nothing */
            FUZZ_ASSERT(memcmp(&before, j, sizeof before) == 0);
        free(set);
    }
    if (rc < 0)
        goto out;

    err[0] = '\0';
    int vrc = ch_jobspec_validate(j, 0, err, sizeof err);
    check_err(vrc, err, sizeof err);

    FUZZ_ASSERT(ch_jobspec_format(j, &canon) == 0);
    rc = ch_jobspec_parse(canon, k, err2, sizeof err2);
    if (rc != 0)
        fuzz_fail(__FILE__, __LINE__, err2);
    FUZZ_ASSERT(memcmp(j, k, sizeof *j) == 0);
    FUZZ_ASSERT(ch_jobspec_format(k, &canon2) == 0);
    FUZZ_ASSERT(strcmp(canon, canon2) == 0);
    err2[0] = '\0';
    FUZZ_ASSERT(ch_jobspec_validate(k, 0, err2, sizeof err2) == vrc);
    FUZZ_ASSERT(strcmp(err, err2) == 0);
out:
    free(canon);
    free(canon2);
    free(j);
    free(k);
    free(text);
    return 0;
}
