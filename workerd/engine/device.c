/* The device object (device.h). The one place in the engine's callers where a CUDA build
 * and a CPU one differ: backend_cuda's entry points exist only in the former. */
#include "workerd/engine/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "chorus/config.h"
#include "common/err.h"
#include "workerd/engine/stage.h"

struct eng_device {
    ch_device_t kind;
    int gpu;
    eng_backend_t *be; /* owned; NULL on the CPU */
};

#if CHORUS_HAVE_CUDA
static int open_gpu(eng_device_t *d, const eng_device_opts_t *o, char *err, size_t errlen)
{
    int rc = eng_backend_cuda_create(o->gpu, &d->be);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "GPU %d: %s", o->gpu, ch_strerror(rc));
    eng_backend_cuda_set_tf32(d->be, o->tf32);
    /* bf16: the trainer wraps this backend in the bf16 rounding (backend_bf16.h) */
    eng_backend_cuda_set_bf16(d->be, o->bf16);
    if (o->B > 0 && (rc = eng_backend_cuda_reserve(d->be, o->B, o->T, o->C, o->NH)) < 0)
        return ch_errf(err, errlen, rc, "GPU %d: scratch: %s", o->gpu, ch_strerror(rc));
    return 0;
}

static void close_gpu(eng_device_t *d)
{
    eng_backend_cuda_destroy(d->be);
}

static void *gpu_stream(const eng_device_t *d)
{
    return eng_backend_cuda_stream(d->be);
}
#else
static int open_gpu(eng_device_t *d, const eng_device_opts_t *o, char *err, size_t errlen)
{
    (void)d, (void)o;
    return ch_errf(err, errlen, -ENOTSUP, "this build has no CUDA backend");
}

static void close_gpu(eng_device_t *d)
{
    (void)d;
}

static void *gpu_stream(const eng_device_t *d)
{
    (void)d;
    return NULL;
}
#endif

int eng_device_open(ch_device_t kind, const eng_device_opts_t *o, eng_device_t **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    eng_device_t *d = calloc(1, sizeof *d);
    if (!d)
        return ch_errf(err, errlen, -ENOMEM, "out of memory");
    d->kind = kind;
    d->gpu = kind == CH_DEVICE_CUDA ? o->gpu : -1;
    if (kind == CH_DEVICE_CUDA) {
        int rc = open_gpu(d, o, err, errlen);
        if (rc < 0) {
            eng_device_close(d);
            return rc;
        }
    }
    *out = d;
    return 0;
}

void eng_device_close(eng_device_t *d)
{
    if (!d)
        return;
    if (d->be)
        close_gpu(d);
    free(d);
}

ch_device_t eng_device_kind(const eng_device_t *d)
{
    return d->kind;
}

int eng_device_gpu(const eng_device_t *d)
{
    return d->gpu;
}

eng_backend_t *eng_device_backend(const eng_device_t *d)
{
    return d->be;
}

int eng_device_coll_config(const eng_device_t *d, int shared, wrk_coll_config_t *cfg,
                           wrk_coll_stage_t *stage)
{
    cfg->backend = d->be != NULL ? WRK_COLL_NCCL : WRK_COLL_UCX;
    if (d->be != NULL && shared) {
        eng_stage_of(d->be, stage);
        cfg->backend = WRK_COLL_UCX;
        cfg->stage = stage;
        return 1;
    }
    if (cfg->backend == WRK_COLL_NCCL) {
        cfg->device = d->gpu;
        cfg->stream = gpu_stream(d);
    }
    return 0;
}
