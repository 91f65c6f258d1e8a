/* Helpers shared by every fuzz target (fuzz.h). */
#include "fuzz.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

void fuzz_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "FUZZ INVARIANT BROKEN at %s:%d: %s\n", file, line, what);
    abort();
}

char *fuzz_cstr(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t n = nul ? (size_t)(nul - data) : size;
    char *s = malloc(n + 1);
    FUZZ_ASSERT(s != NULL);
    memcpy(s, data, n);
    s[n] = '\0';
    return s;
}

// ----------------------------------------------------------------------------
// scratch directory

static char scratch[512];

static void scratch_remove(void)
{
    DIR *d = opendir(scratch);
    if (d) {
        struct dirent *e;
        char path[1024];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", scratch, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(scratch);
}

static void scratch_make(void)
{
    const char *bases[] = {getenv("CHORUS_FUZZ_TMP"), "/dev/shm", getenv("TMPDIR"), "/tmp"};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        if (!bases[i] || !bases[i][0] || access(bases[i], W_OK) != 0)
            continue;
        snprintf(scratch, sizeof scratch, "%s/chorus-fuzz-XXXXXX", bases[i]);
        if (mkdtemp(scratch)) {
            atexit(scratch_remove);
            return;
        }
    }
    fuzz_fail(__FILE__, __LINE__, "no writable scratch directory");
}

void fuzz_tmp_path(char *out, size_t outlen, const char *name)
{
    if (!scratch[0])
        scratch_make();
    int n = snprintf(out, outlen, "%s/%s", scratch, name);
    FUZZ_ASSERT(n > 0 && (size_t)n < outlen);
}

void fuzz_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_ASSERT(fd >= 0);
    FUZZ_ASSERT(ch_write_full(fd, data, len) == 0);
    FUZZ_ASSERT(close(fd) == 0);
}

// ----------------------------------------------------------------------------
// keyed sessions

void fuzz_keyed_pair(ch_session_t *client, ch_session_t *server)
{
    ch_key_t key;
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN];
    for (int i = 0; i < CH_KEY_LEN; i++)
        key.bytes[i] = (uint8_t)(0x40 + i);
    for (int i = 0; i < CH_NONCE_LEN; i++) {
        nc[i] = (uint8_t)(0xC0 ^ i);
        ns[i] = (uint8_t)(0x50 ^ i);
    }
    FUZZ_ASSERT(ch_auth_global_init() == 0);
    /* HMAC-SHA256: the seeds' tags were made with it */
    ch_session_init_keyed(client, 0, &key, nc, ns, CH_MAC_HMAC_SHA256);
    ch_session_init_keyed(server, 1, &key, nc, ns, CH_MAC_HMAC_SHA256);
}

// ----------------------------------------------------------------------------
// message sequences

int fuzz_next_msg(const uint8_t **data, size_t *size, uint8_t *op, Chorus__Envelope **env)
{
    const uint8_t *p = *data;
    if (*size < 3)
        return 0;
    size_t len = (size_t)p[1] | (size_t)p[2] << 8;
    if (*size - 3 < len)
        return 0;
    *op = p[0];
    *env = chorus__envelope__unpack(NULL, len, p + 3);
    *data = p + 3 + len;
    *size -= 3 + len;
    return 1;
}

void fuzz_put_msg(uint8_t *buf, size_t cap, size_t *len, uint8_t op, const Chorus__Envelope *env)
{
    size_t n = env ? chorus__envelope__get_packed_size(env) : 0;
    FUZZ_ASSERT(n <= 0xffff && *len + 3 + n <= cap);
    buf[*len] = op;
    buf[*len + 1] = (uint8_t)n;
    buf[*len + 2] = (uint8_t)(n >> 8);
    if (env)
        chorus__envelope__pack(env, buf + *len + 3);
    *len += 3 + n;
}
