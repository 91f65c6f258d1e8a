/* The device enum and its two spellings; see device.h. */
#include "common/device.h"

#include <string.h>

#include "common/err.h"

const char *ch_device_name(ch_device_t d)
{
    return d == CH_DEVICE_CUDA ? "cuda" : "cpu";
}

int ch_device_parse(const char *s, ch_device_t *d)
{
    if (s && strcmp(s, "cpu") == 0)
        *d = CH_DEVICE_CPU;
    else if (s && strcmp(s, "cuda") == 0)
        *d = CH_DEVICE_CUDA;
    else
        return CH_E_CONFIG;
    return 0;
}
