/* The one libuv -> Chorus error conversion (err.h), in the network library. */
#include "common/err.h"

#include <errno.h>
#include <uv.h>

/* libuv's own codes (not errno values): UV_EOF and the getaddrinfo family. */
static int is_uv_only(int rc)
{
    return rc == UV_EOF || (rc <= -3000 && rc > -3100);
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
