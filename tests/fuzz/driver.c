/* Smoke driver: runs one fuzz target without libFuzzer, so every build (gcc, and the
 * ASan/UBSan CI build) exercises it under ctest.
 *
 *   fuzz-smoke-<parser> [-n N] [-s SEED] PATH...
 *
 * Each PATH is a seed file or a directory of them (read in name order). The driver runs
 * the target on every seed, then on N variants made by a fixed-seed PRNG: bit flips,
 * byte overwrites with boundary values, 32/64-bit boundary integers, truncations,
 * insertions, deletions, duplicated chunks and splices of two seeds. The same arguments
 * always run the same inputs, so a failure reproduces. An input that aborts or faults is
 * written to ./fuzz-crash-<parser> from the signal handler; a sanitizer report exits
 * without a signal, so for those set CHORUS_FUZZ_KEEP=1 to write every input there
 * before running it. Replay with `fuzz-smoke-<parser> -n 0 FILE` or the libFuzzer
 * binary. CHORUS_FUZZ_ITERS overrides N. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
#include "fuzz.h"

#define INPUT_MAX   (256u << 10)
#define MAX_MUTANTS 6

typedef struct seed {
    uint8_t *data;
    size_t len;
} seed_t;

typedef struct corpus {
    seed_t *s;
    size_t n, cap;
} corpus_t;

// ----------------------------------------------------------------------------
// seeds

static int load_file(corpus_t *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz-smoke: cannot open %s\n", path);
        return -1;
    }
    uint8_t *buf = malloc(INPUT_MAX), *fit = NULL;
    size_t n = buf ? fread(buf, 1, INPUT_MAX, f) : 0;
    fclose(f);
    if (buf)
        fit = realloc(buf, n ? n : 1);
    if (fit && c->n == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 64;
        seed_t *s = realloc(c->s, ncap * sizeof *s);
        if (s) {
            c->s = s;
            c->cap = ncap;
        }
    }
    if (!fit || c->n == c->cap) {
        free(fit ? fit : buf);
        fprintf(stderr, "fuzz-smoke: out of memory at %s\n", path);
        return -1;
    }
    c->s[c->n].data = fit;
    c->s[c->n].len = n;
    c->n++;
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int load_path(corpus_t *c, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz-smoke: no such seed file or directory %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return load_file(c, path);
    struct dirent **names = NULL;
    int n = scandir(path, &names, NULL, by_name), rc = 0;
    for (int i = 0; i < n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, names[i]->d_name);
        if (rc == 0 && stat(full, &st) == 0 && S_ISREG(st.st_mode))
            rc = load_file(c, full);
        free(names[i]);
    }
    free(names);
    return n < 0 ? -1 : rc;
}

// ----------------------------------------------------------------------------
// mutations

static uint64_t rng_next(uint64_t *s)
{
    return ch_mix64_next(s);
}

static size_t below(uint64_t *s, size_t n)
{
    return n ? (size_t)(rng_next(s) % n) : 0;
}

/* Bytes that parsers here treat specially: structure, whitespace, signs, boundaries. */
static const uint8_t special[] = {0,   1,    '\n', '\r', ' ',  '\t', '=',  '[',  ']',  '{', '}',
                                  '"', ':',  ',',  '\\', '#',  ';',  '-',  '+',  '0',  '9', 'e',
                                  '.', 0x7f, 0x80, 0xbf, 0xc0, 0xe0, 0xed, 0xf0, 0xf4, 0xff};
static const uint64_t boundary[] = {0,          1,          2,          0x7f,
                                    0x80,       0xff,       0x100,      0x7fff,
                                    0xffff,     0x10000,    0x7fffffff, 0x80000000,
                                    0xffffffff, 1ull << 32, UINT64_MAX, UINT64_MAX / 2,
                                    20240520,   1024,       16u << 20,  (16u << 20) + 1};

static void put_int(uint8_t *p, size_t room, uint64_t v, int bytes, int big_endian)
{
    for (int i = 0; i < bytes && (size_t)i < room; i++) {
        int shift = 8 * (big_endian ? bytes - 1 - i : i);
        p[i] = (uint8_t)(v >> shift);
    }
}

/* Insert n bytes at pos (contents left to the caller); returns the new length. */
static size_t make_room(uint8_t *buf, size_t len, size_t pos, size_t n)
{
    if (len + n > INPUT_MAX)
        n = INPUT_MAX - len;
    memmove(buf + pos + n, buf + pos, len - pos);
    return len + n;
}

static size_t mutate_once(uint64_t *r, uint8_t *buf, size_t len, const corpus_t *c)
{
    size_t pos = below(r, len + 1), n;
    const seed_t *other;
    switch (below(r, 9)) {
    case 0: /* flip one bit */
        if (len)
            buf[below(r, len)] ^= (uint8_t)(1u << below(r, 8));
        return len;
    case 1: /* overwrite with a special byte */
        if (len)
            buf[below(r, len)] = special[below(r, sizeof special)];
        return len;
    case 2: /* overwrite with a random byte */
        if (len)
            buf[below(r, len)] = (uint8_t)rng_next(r);
        return len;
    case 3: /* boundary integer, 4 or 8 bytes, either byte order */
        if (len) {
            pos = below(r, len);
            put_int(buf + pos, len - pos, boundary[below(r, sizeof boundary / sizeof boundary[0])],
                    below(r, 2) ? 8 : 4, (int)below(r, 2));
        }
        return len;
    case 4: /* truncate */
        return below(r, len + 1);
    case 5: /* insert 1..16 random or special bytes */
        n = 1 + below(r, 16);
        len = make_room(buf, len, pos, n);
        for (size_t i = pos; i < pos + n && i < len; i++)
            buf[i] = below(r, 2) ? (uint8_t)rng_next(r) : special[below(r, sizeof special)];
        return len;
    case 6: /* delete a range */
        n = below(r, len - pos + 1);
        n = n > 64 ? 1 + below(r, 64) : n;
        memmove(buf + pos, buf + pos + n, len - pos - n);
        return len - n;
    case 7: /* duplicate a chunk of this input elsewhere */
        if (len) {
            size_t from = below(r, len), cn = 1 + below(r, len - from < 64 ? len - from : 64);
            uint8_t tmp[64];
            memcpy(tmp, buf + from, cn);
            size_t at = below(r, len + 1);
            size_t nlen = make_room(buf, len, at, cn);
            memcpy(buf + at, tmp, nlen - len);
            len = nlen;
        }
        return len;
    default: /* splice: our head, another seed's tail */
        other = &c->s[below(r, c->n)];
        n = below(r, other->len + 1);
        if (pos + (other->len - n) > INPUT_MAX)
            return len;
        memcpy(buf + pos, other->data + n, other->len - n);
        return pos + (other->len - n);
    }
}

// ----------------------------------------------------------------------------

static const char *target_name(const char *argv0)
{
    const char *slash = strrchr(argv0, '/');
    const char *base = slash ? slash + 1 : argv0;
    const char *dash = strrchr(base, '-');
    return dash ? dash + 1 : base;
}

/* The input being run, for the crash handler (the driver's only globals). */
static char crash_path[256];
static const uint8_t *volatile cur_data;
static volatile size_t cur_len;

static void save_input(const uint8_t *data, size_t len) /* async-signal-safe */
{
    int fd = open(crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w <= 0)
            break;
        data += w;
        len -= (size_t)w;
    }
    close(fd);
}

static void on_crash(int sig)
{
    static const char msg[] = "fuzz-smoke: crashing input saved to ";
    if (cur_data) {
        save_input(cur_data, cur_len);
        (void)!write(2, msg, sizeof msg - 1);
        (void)!write(2, crash_path, strlen(crash_path));
        (void)!write(2, "\n", 1);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run_one(const uint8_t *data, size_t len, int keep)
{
    cur_data = data;
    cur_len = len;
    if (keep)
        save_input(data, len);
    LLVMFuzzerTestOneInput(data, len);
    cur_data = NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    corpus_t c = {0};
    long iters = 1000;
    uint64_t rng = 0x43686f727573ull; /* "Chorus" */
    const char *target = target_name(argv[0]);
    int keep = getenv("CHORUS_FUZZ_KEEP") != NULL;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            iters = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            rng = strtoull(argv[++i], NULL, 0);
        } else if (load_path(&c, argv[i]) < 0) {
            return 2;
        }
    }
    if (getenv("CHORUS_FUZZ_ITERS"))
        iters = strtol(getenv("CHORUS_FUZZ_ITERS"), NULL, 10);
    if (c.n == 0) {
        fprintf(stderr, "usage: %s [-n N] [-s SEED] SEED_FILE_OR_DIR...\n", argv[0]);
        return 2;
    }

    double t0 = now_s();
    snprintf(crash_path, sizeof crash_path, "fuzz-crash-%s", target);
    int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], on_crash);
    for (size_t i = 0; i < c.n; i++)
        run_one(c.s[i].data, c.s[i].len, keep);
    uint8_t *buf = malloc(INPUT_MAX);
    if (!buf)
        return 2;
    for (long it = 0; it < iters; it++) {
        const seed_t *s = &c.s[below(&rng, c.n)];
        size_t len = s->len;
        memcpy(buf, s->data, len);
        size_t nmut = 1 + below(&rng, MAX_MUTANTS);
        for (size_t m = 0; m < nmut; m++)
            len = mutate_once(&rng, buf, len, &c);
        /* A copy of exactly len bytes, so ASan sees any read past the input's end. */
        uint8_t *in = malloc(len ? len : 1);
        if (!in)
            return 2;
        memcpy(in, buf, len);
        run_one(in, len, keep);
        free(in);
    }
    printf("fuzz-smoke-%s: %zu seeds + %ld variants in %.2f s\n", target, c.n, iters, now_s() - t0);
    free(buf);
    for (size_t i = 0; i < c.n; i++)
        free(c.s[i].data);
    free(c.s);
    return 0;
}
