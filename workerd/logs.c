/* Rank logs for chorusctl logs (logs.h). */
#include "workerd/logs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int wrk_logs_read(const char *run_dir, const Chorus__LogRead *lr, Chorus__LogChunk *out, char *path,
                  size_t pathlen, char *err, size_t errlen)
{
    struct stat st;
    int n = snprintf(path, pathlen, "%s/%s/g%" PRIu64 "/rank-%u.log", run_dir, lr->job_id,
                     lr->generation, lr->rank);
    if (n < 0 || (size_t)n >= pathlen)
        return ch_errf(err, errlen, -ENAMETOOLONG, "log path too long");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return ch_errf(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    size_t want =
        lr->max_bytes && lr->max_bytes < WRK_LOGS_CHUNK_MAX ? lr->max_bytes : WRK_LOGS_CHUNK_MAX;
    uint64_t size = (uint64_t)st.st_size;
    size_t len =
        lr->offset < size ? (size_t)(size - lr->offset < want ? size - lr->offset : want) : 0;
    uint8_t *buf = len ? malloc(len) : NULL;
    ssize_t got = 0;
    if (len && !buf) {
        close(fd);
        return ch_errf(err, errlen, -ENOMEM, "out of memory");
    }
    while (len && (got = pread(fd, buf, len, (off_t)lr->offset)) < 0 && errno == EINTR)
        ;
    close(fd);
    if (got < 0) {
        free(buf);
        return ch_errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
    }
    out->data.data = buf;
    out->data.len = (size_t)got;
    out->offset = lr->offset;
    out->size = size;
    out->generation = lr->generation;
    out->rank = lr->rank;
    return 0;
}
