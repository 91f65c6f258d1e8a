/* Error codes. Every fallible Chorus function returns 0 or a negative code:
 * either a negated errno (-EINVAL, -ENOMEM, -ETIMEDOUT, ...) or one of the
 * CH_E_* codes below, which name a failure source errno has no word for.
 * Each foreign library's errors are converted in exactly one function, kept in
 * the one module that wraps that library (ch_err_from_uv here, the SQLite one in
 * coordinatord/store.c, the UCX one in workerd/coll_ucx.c, ...). */
#ifndef CH_ERR_H
#define CH_ERR_H

#include <errno.h>
#include <stddef.h>

enum {
    CH_E_BASE = 10000,
    CH_E_AUTH = -(CH_E_BASE + 1),    /* authentication failed (wrong key, bad tag) */
    CH_E_REPLAY = -(CH_E_BASE + 2),  /* sequence number not increasing */
    CH_E_FRAME = -(CH_E_BASE + 3),   /* malformed frame or undecodable payload */
    CH_E_TOOBIG = -(CH_E_BASE + 4),  /* frame or value over its size limit */
    CH_E_CONFIG = -(CH_E_BASE + 5),  /* bad configuration or job file */
    CH_E_KEYPERM = -(CH_E_BASE + 6), /* key file readable by group/others, or not ours */
    CH_E_SQLITE = -(CH_E_BASE + 7),
    CH_E_UCX = -(CH_E_BASE + 8),
    CH_E_CUDA = -(CH_E_BASE + 9),
    CH_E_NCCL = -(CH_E_BASE + 10),
    CH_E_FORMAT = -(CH_E_BASE + 11), /* bad file contents (safetensors, tokens, json) */
    CH_E_STATE = -(CH_E_BASE + 12),  /* operation not valid in the current state */
    CH_E_NOTFOUND = -(CH_E_BASE + 13),
    CH_E_ABORTED = -(CH_E_BASE + 14),  /* operation aborted (collective abort, peer failure) */
    CH_E_NUMERIC = -(CH_E_BASE + 15),  /* a numeric self-check failed */
    CH_E_CAPACITY = -(CH_E_BASE + 16), /* not enough slots/memory for the request */
    CH_E_LAST = -(CH_E_BASE + 17),
};

/* Name any code: CH_E_*, negated errno, or a libuv code. Never NULL. */
const char *ch_strerror(int rc);

/* Write a message into err (when err and errlen are set) and return rc: the idiom of
 * functions that report "what went wrong" next to their code. */
int ch_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The class of a failure code that a restart cannot change: "permission" (EACCES, EPERM,
 * EROFS), "missing" (ENOENT, ENOTDIR), "does_not_fit" (ENOMEM, CH_E_CAPACITY), "bad_input"
 * (CH_E_CONFIG, CH_E_FORMAT: a job or data file that does not parse); NULL for any other
 * code. Ranks and workerd tag their failures with it; the coordinator decides, seeing
 * every node, whether the job can heal. */
const char *ch_err_lasting(int rc);

/* Convert a libuv status (already a negative errno on Linux) to a Chorus code. */
int ch_err_from_uv(int uv_status);

#endif
