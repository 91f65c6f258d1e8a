/* Small helpers shared by every binary: clocks, random bytes, file helpers. */
#ifndef CH_UTIL_H
#define CH_UTIL_H

#include <stddef.h>
#include <stdint.h>

uint64_t ch_now_ms(void);  /* CLOCK_MONOTONIC, milliseconds */
uint64_t ch_now_ns(void);  /* CLOCK_MONOTONIC, nanoseconds */
uint64_t ch_wall_ms(void); /* CLOCK_REALTIME, milliseconds since the epoch */

/* Read a whole file (at most max bytes, else CH_E_TOOBIG). *out is malloc'd, NUL-terminated;
 * the caller frees it. */
int ch_file_read(const char *path, size_t max, char **out, size_t *len);
/* Write atomically: temp file in the same directory, fsync, rename, fsync the directory. */
int ch_file_write_atomic(const char *path, const void *data, size_t len, int mode);
/* write(2) all of data, retrying on EINTR and short writes. */
int ch_write_full(int fd, const void *data, size_t len);
/* fsync the directory holding path (after a rename into it). */
int ch_fsync_dir_of(const char *path);
/* mkdir -p */
int ch_mkdirs(const char *path, int mode);

/* Parse "HOST:PORT" into host (NUL-terminated, at most hostlen) and port. */
int ch_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
