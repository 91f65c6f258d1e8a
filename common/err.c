/* Error names (err.h). The libuv -> Chorus conversion lives in uverr.c, with the network
 * library, so this file links nothing but libc. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const ch_names[] = {
    [1] = "authentication failed",
    [2] = "replayed or out-of-order message",
    [3] = "malformed frame",
    [4] = "over size limit",
    [5] = "configuration error",
    [6] = "key file is accessible by group or others (must be 0600 or 0400), or owned by "
          "another user than this process's or root",
    [7] = "SQLite error",
    [8] = "UCX error",
    [9] = "CUDA error",
    [10] = "NCCL error",
    [11] = "bad file format",
    [12] = "operation not valid in this state",
    [13] = "not found",
    [14] = "aborted",
    [15] = "numeric check failed",
    [16] = "not enough capacity",
};

/* libuv's own codes (not errno values) on Linux: UV_EOF (-4095) and the getaddrinfo family
 * (-3000 .. -3099). Named here without libuv so that the pure library stays pure;
 * ch_err_from_uv (uverr.c) turns them into errno codes wherever libuv is used. */
#define UV_EOF_CODE (-4095)
static int is_uv_only(int rc)
{
    return rc == UV_EOF_CODE || (rc <= -3000 && rc > -3100);
}

const char *ch_strerror(int rc)
{
    if (rc == 0)
        return "success";
    if (rc > CH_E_LAST && rc < -CH_E_BASE) {
        int i = -rc - CH_E_BASE;
        if (i > 0 && i < (int)(sizeof ch_names / sizeof ch_names[0]) && ch_names[i])
            return ch_names[i];
    }
    if (rc == UV_EOF_CODE)
        return "end of file";
    if (is_uv_only(rc))
        return "host name lookup failed";
    if (rc < 0 && rc > -4096) {
        /* strerrordesc_np is thread-safe and never formats into a shared buffer. */
        const char *s = strerrordesc_np(-rc);
        if (s)
            return s;
    }
    return "unknown error";
}

int ch_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *ch_err_lasting(int rc)
{
    switch (rc) {
    case -EACCES:
    case -EPERM:
    case -EROFS:
        return "permission";
    case -ENOENT:
    case -ENOTDIR:
        return "missing";
    case -ENOMEM:
    case CH_E_CAPACITY:
        return "does_not_fit";
    case CH_E_CONFIG:
    case CH_E_FORMAT:
        return "bad_input";
    default:
        return NULL;
    }
}
