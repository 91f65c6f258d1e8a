/* Helpers shared by the unit tests (support.h). */
#include "support.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int ts_tmpdir(const char *tag, char *out, size_t n)
{
    const char *base = getenv("CHORUS_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    int rc = ch_mkdirs(base, 0755);
    if (rc < 0)
        return rc;
    int len = snprintf(out, n, "%s/%s.XXXXXX", base, tag);
    if (len < 0 || (size_t)len >= n)
        return -ENAMETOOLONG;
    return mkdtemp(out) ? 0 : -errno;
}

/* Children come before their directory (FTW_DEPTH), so each directory is empty when
 * removed. A failure stops the walk with its (positive) errno, which nftw returns. */
static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int r = (type == FTW_DP) ? rmdir(path) : unlink(path);
    return r < 0 ? errno : 0;
}

int ts_rmrf(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    int rc = nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (rc < 0) /* nftw itself failed */
        return -errno;
    return -rc;
}
