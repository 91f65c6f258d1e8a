/* Host staging through a backend's memory entries (stage.h). */
#include "workerd/engine/stage.h"

static int stage_alloc(void *ud, size_t bytes, void **out)
{
    const eng_backend_t *be = ud;
    return be->alloc(be, bytes, out);
}

static void stage_free(void *ud, void *p)
{
    const eng_backend_t *be = ud;
    be->free(be, p);
}

/* The backend's host copies wait for the work queued before them (backend.h), so a staged
 * send sees what the kernels wrote. */
static int stage_copy(void *ud, void *dst, const void *src, size_t bytes, int to_device)
{
    const eng_backend_t *be = ud;
    return be->copy(be, dst, src, bytes, to_device ? ENG_COPY_H2D : ENG_COPY_D2H);
}

void eng_stage_of(const eng_backend_t *be, wrk_coll_stage_t *out)
{
    *out = (wrk_coll_stage_t){
        .ud = (void *)be, .alloc = stage_alloc, .free = stage_free, .copy = stage_copy};
}
