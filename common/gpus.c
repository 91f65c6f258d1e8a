/* GPU counting for `slots = auto` / `device = auto` (gpus.h). */
#include "common/gpus.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

int ch_gpus_present(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* One entry of CUDA_VISIBLE_DEVICES: an index below present, or a UUID (which only the driver
 * can resolve: counted as one GPU while there are GPUs left to stand for). -1 when invalid. */
static int entry_index(const char *s, size_t len, int present)
{
    if (len > 4 && (strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0))
        return present > 0 ? present : -1; /* no index: never collides with a number */
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9' || v > 100000)
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return len > 0 && v < present ? v : -1;
}

int ch_gpus_visible(int present, const char *visible)
{
    if (present <= 0)
        return 0;
    if (!visible)
        return present;
    char seen[4096] = {0};
    int n = 0;
    const char *p = visible;
    while (*p && n < present) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, ",");
        while (len > 0 && p[len - 1] == ' ')
            len--;
        int idx = entry_index(p, len, present);
        if (idx < 0 || (idx < present && idx < (int)sizeof seen && seen[idx]))
            break;
        if (idx < present && idx < (int)sizeof seen)
            seen[idx] = 1;
        n++;
        p += strcspn(p, ",");
        if (*p == ',')
            p++;
    }
    return n;
}
