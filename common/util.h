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
/* The same in two halves, for writers that stream: ch_file_tmp_open makes a temporary file
 * next to path with the given mode (*fd, *tmp: its name, malloc'd); ch_file_tmp_commit
 * fsyncs, closes and renames it over path, then fsyncs the directory. Commit and
 * ch_file_tmp_abort always close fd and free tmp, and remove the temporary unless it was
 * renamed. */
int ch_file_tmp_open(const char *path, int mode, int *fd, char **tmp);
int ch_file_tmp_commit(int fd, char *tmp, const char *path);
void ch_file_tmp_abort(int fd, char *tmp);
/* write(2) all of data, retrying on EINTR and short writes. */
int ch_write_full(int fd, const void *data, size_t len);
/* read(2) until len bytes or end of file, retrying on EINTR and short reads: 0 and *got
 * (len, or less when end of file came first), or -errno (*got then holds what was read). */
int ch_read_full(int fd, void *buf, size_t len, size_t *got);
/* fsync the directory holding path (after a rename into it). */
int ch_fsync_dir_of(const char *path);
/* mkdir -p */
int ch_mkdirs(const char *path, int mode);
/* rm -r: path and, when it is a directory, everything under it (symbolic links removed,
 * never followed). 0 (also when path does not exist) or the first -errno met. */
int ch_rmtree(const char *path);
/* Map a regular file read-only (private). On success *map and *size describe the whole file;
 * an empty file gives *map == NULL, *size == 0 (nothing to map), which callers needing a
 * minimum size reject with their own message. Errors: -errno from open or mmap, CH_E_FORMAT
 * when path is not a regular file; err (errlen bytes, may be NULL) then gets
 * "<path>: <reason>". Release with ch_file_unmap. */
int ch_file_map(const char *path, void **map, size_t *size, char *err, size_t errlen);
/* Undo ch_file_map; a NULL map is a no-op. */
void ch_file_unmap(void *map, size_t size);

/* Parse "HOST:PORT" into host (NUL-terminated, at most hostlen) and port. */
int ch_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
