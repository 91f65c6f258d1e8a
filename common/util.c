/* Clocks, whole-file I/O and small parsers shared by every binary (util.h). */
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

uint64_t ch_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ch_now_ms(void)
{
    return ch_now_ns() / 1000000ull;
}

uint64_t ch_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

int ch_file_read(const char *path, size_t max, char **out, size_t *len)
{
    int rc = 0, fd = -1;
    char *buf = NULL;
    struct stat st;

    *out = NULL;
    if (len)
        *len = 0;
    if (max > SIZE_MAX / 4)
        max = SIZE_MAX / 4; /* keeps max + 1 and doubling from overflowing */
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = -EISDIR;
        goto out;
    }
    /* Size is only a hint (pipes, /proc report 0): read until EOF, growing as needed. */
    size_t cap = (S_ISREG(st.st_mode) && st.st_size > 0) ? (size_t)st.st_size + 1 : 4096;
    if (cap > max + 1)
        cap = max + 1;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= max + 1) {
                /* Exactly max bytes so far: the file fits only if EOF follows. */
                char c;
                size_t got1 = 0;
                rc = ch_read_full(fd, &c, 1, &got1);
                if (rc < 0)
                    goto out;
                if (got1 == 0)
                    break;
                rc = CH_E_TOOBIG;
                goto out;
            }
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t want = cap - 1 - n, got = 0;
        rc = ch_read_full(fd, buf + n, want, &got);
        if (rc < 0)
            goto out;
        n += got;
        if (got < want)
            break; /* end of file */
    }
    buf[n] = '\0';
    *out = buf;
    buf = NULL;
    if (len)
        *len = n;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return rc;
}

int ch_read_full(int fd, void *buf, size_t len, size_t *got)
{
    char *p = buf;
    *got = 0;
    while (*got < len) {
        ssize_t r = read(fd, p + *got, len - *got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return 0;
}

int ch_write_full(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int ch_fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    int rc = 0;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        rc = -errno;
    } else {
        if (fsync(dfd) < 0)
            rc = -errno;
        close(dfd);
    }
    free(copy);
    return rc;
}

int ch_file_tmp_open(const char *path, int mode, int *fd, char **tmp)
{
    size_t n = strlen(path) + 16;
    char *t = malloc(n);
    if (!t)
        return -ENOMEM;
    snprintf(t, n, "%s.tmp.XXXXXX", path);
    int f = mkostemp(t, O_CLOEXEC);
    if (f < 0) {
        int rc = -errno;
        free(t);
        return rc;
    }
    if (fchmod(f, (mode_t)mode) < 0) {
        int rc = -errno;
        ch_file_tmp_abort(f, t);
        return rc;
    }
    *fd = f;
    *tmp = t;
    return 0;
}

void ch_file_tmp_abort(int fd, char *tmp)
{
    if (fd >= 0)
        close(fd);
    if (tmp)
        unlink(tmp);
    free(tmp);
}

int ch_file_tmp_commit(int fd, char *tmp, const char *path)
{
    if (fsync(fd) < 0) {
        int rc = -errno;
        ch_file_tmp_abort(fd, tmp);
        return rc;
    }
    if (close(fd) < 0) {
        int rc = -errno;
        ch_file_tmp_abort(-1, tmp);
        return rc;
    }
    if (rename(tmp, path) < 0) {
        int rc = -errno;
        ch_file_tmp_abort(-1, tmp);
        return rc;
    }
    free(tmp);
    return ch_fsync_dir_of(path);
}

int ch_file_write_atomic(const char *path, const void *data, size_t len, int mode)
{
    int fd = -1;
    char *tmp = NULL;
    int rc = ch_file_tmp_open(path, mode, &fd, &tmp);
    if (rc < 0)
        return rc;
    rc = ch_write_full(fd, data, len);
    if (rc < 0) {
        ch_file_tmp_abort(fd, tmp);
        return rc;
    }
    return ch_file_tmp_commit(fd, tmp, path);
}

int ch_mkdirs(const char *path, int mode)
{
    size_t n = strlen(path);
    if (n == 0)
        return -EINVAL;
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    int rc = 0;
    /* Create each prefix ending before a '/', then the whole path. */
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, (mode_t)mode) < 0 && errno != EEXIST) {
            rc = -errno;
            break;
        }
        *s = saved;
        if (saved == '\0')
            break;
    }
    if (rc == 0) {
        struct stat st;
        if (stat(path, &st) < 0)
            rc = -errno;
        else if (!S_ISDIR(st.st_mode))
            rc = -ENOTDIR;
    }
    free(p);
    return rc;
}

int ch_file_map(const char *path, void **map, size_t *size, char *err, size_t errlen)
{
    int rc = 0, fd = -1;
    struct stat st;

    *map = NULL;
    *size = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        if (err && errlen)
            snprintf(err, errlen, "%s: %s", path, ch_strerror(rc));
        goto out;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = CH_E_FORMAT;
        if (err && errlen)
            snprintf(err, errlen, "%s: not a regular file", path);
        goto out;
    }
    if (st.st_size == 0) /* mmap refuses length 0 */
        goto out;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = -errno;
        if (err && errlen)
            snprintf(err, errlen, "%s: mmap: %s", path, ch_strerror(rc));
        goto out;
    }
    *map = m;
    *size = (size_t)st.st_size;
out:
    if (fd >= 0)
        close(fd); /* the mapping stays valid */
    return rc;
}

void ch_file_unmap(void *map, size_t size)
{
    if (map)
        munmap(map, size);
}

/* "host:port", "[v6addr]:port", or ":port" (host "0.0.0.0"). */
int ch_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    if (!s || !host || hostlen == 0 || !port)
        return -EINVAL;
    const char *h, *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return -EINVAL;
        h = s + 1;
        hl = (size_t)(end - h);
        colon = end + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return -EINVAL; /* no port, or a bare IPv6 address without brackets */
        h = s;
        hl = (size_t)(colon - s);
    }
    if (hl == 0) {
        h = "0.0.0.0";
        hl = 7;
    }
    if (hl + 1 > hostlen)
        return -ENAMETOOLONG;
    const char *ps = colon + 1;
    if (*ps == '\0')
        return -EINVAL;
    long v = 0;
    for (const char *q = ps; *q; q++) {
        if (*q < '0' || *q > '9')
            return -EINVAL;
        v = v * 10 + (*q - '0');
        if (v > 65535)
            return -ERANGE;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)v;
    return 0;
}

/* Empty the directory open as fd (consumed), depth first. */
static int rm_under(int fd)
{
    DIR *d = fdopendir(fd);
    int rc = 0;
    if (!d) {
        close(fd);
        return -errno;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            continue;
        int sub = errno == EISDIR || errno == EPERM
                      ? openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                      : -1;
        int err = sub < 0 ? -errno : rm_under(sub);
        if (err == 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0)
            err = -errno;
        if (err < 0 && rc == 0)
            rc = err;
    }
    closedir(d);
    return rc;
}

int ch_rmtree(const char *path)
{
    if (unlink(path) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = rm_under(fd);
    if (rmdir(path) < 0 && rc == 0)
        rc = -errno;
    return rc;
}
