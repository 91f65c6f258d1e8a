/* Error names and the one libuv -> Chorus conversion (err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

static const char *const ch_names[] = {
    [1] = "authentication failed",
    [2] = "replayed or out-of-order message",
    [3] = "malformed frame",
    [4] = "over size limit",
    [5] = "configuration error",
    [6] = "key file is accessible by group or others (must be 0600 or 0400)",
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

/* libuv's own codes (not errno values): UV_EOF and the getaddrinfo family. */
static int is_uv_only(int rc)
{
    return rc == UV_EOF || (rc <= -3000 && rc > -3100);
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
    if (is_uv_only(rc))
        return uv_strerror(rc);
    if (rc < 0 && rc > -4096) {
        /* strerrordesc_np is thread-safe and never formats into a shared buffer. */
        const char *s = strerrordesc_np(-rc);
        if (s)
            return s;
    }
    return "unknown error";
}

int ch_err_from_uv(int uv_status)
{
    if (uv_status >= 0)
        return 0;
    if (uv_status == UV_EOF)
        return -EPIPE;
    if (uv_status == UV_EAI_NONAME || uv_status == UV_EAI_NODATA)
        return -ENOENT;
    if (uv_status == UV_EAI_MEMORY)
        return -ENOMEM;
    if (uv_status == UV_EAI_AGAIN)
        return -EAGAIN;
    if (is_uv_only(uv_status))
        return -EHOSTUNREACH;
    return uv_status; /* on Linux every other libuv code is a negated errno */
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
