/* Requests the front end composes from the backend's (coll_impl.h):
 *
 * - A SENDRECV on a backend without a grouped form (UCX) is its two halves, a SEND and a
 *   RECV started back to back: UCX progresses every posted request, so they already move
 *   together there. NCCL has the grouped form (ncclGroupStart/End).
 * - Under host staging (wrk_coll_config_t.stage) a request on device buffers copies its
 *   input to a host buffer, runs the same operation on host buffers, and copies the result
 *   back to the device when the host operation is done.
 *
 * part[1] set: the request is two halves (part[0] the send, part[1] the receive); part[0]
 * alone: the request is staged and part[0] is the operation on its host buffers. */
#include "workerd/coll/coll_impl.h"

#include <errno.h>
#include <stdlib.h>

static wrk_coll_req_t *part_new(const wrk_coll_req_t *r, const wrk_coll_args_t *a)
{
    wrk_coll_req_t *p = calloc(1, sizeof *p);
    if (p) {
        p->g = r->g;
        p->a = *a;
        p->rc = 1;
    }
    return p;
}

/* Start r on the backend: as it is, grouped, or as two halves. */
static int backend_start(wrk_coll_req_t *r)
{
    const wrk_coll_backend_t *ops = r->g->c->ops;
    if (r->a.kind != WRK_COLL_OP_SENDRECV)
        return ops->start(r);
    if (ops->start_sendrecv)
        return ops->start_sendrecv(r);
    const wrk_coll_args_t *a = &r->a;
    wrk_coll_args_t s = {.kind = WRK_COLL_OP_SEND,
                         .sendbuf = a->sendbuf,
                         .count = a->count,
                         .dt = a->dt,
                         .peer = a->peer};
    wrk_coll_args_t v = {.kind = WRK_COLL_OP_RECV,
                         .recvbuf = a->recvbuf,
                         .count = a->rcount,
                         .dt = a->dt,
                         .peer = a->rpeer};
    r->part[0] = part_new(r, &s);
    r->part[1] = part_new(r, &v);
    int rc = r->part[0] && r->part[1] ? 0 : -ENOMEM;
    if (rc == 0)
        rc = ops->start(r->part[0]);
    if (rc == 0)
        rc = ops->start(r->part[1]);
    if (rc < 0)
        wrk_coll_front_fini(r);
    return rc;
}

/* Bytes a staged request copies in (device -> host) and out (host -> device). */
static void stage_sizes(const wrk_coll_req_t *r, size_t *in, size_t *out)
{
    const wrk_coll_args_t *a = &r->a;
    size_t esz = wrk_coll_dtype_size(a->dt), n = r->g->n, c = a->count * esz;
    *in = *out = 0;
    switch (a->kind) {
    case WRK_COLL_OP_SEND:
        *in = c;
        break;
    case WRK_COLL_OP_RECV:
        *out = c;
        break;
    case WRK_COLL_OP_SENDRECV:
        *in = c;
        *out = a->rcount * esz;
        break;
    case WRK_COLL_OP_ALLREDUCE:
        *in = *out = c;
        break;
    case WRK_COLL_OP_REDUCE_SCATTER:
        *in = n * c;
        *out = c;
        break;
    case WRK_COLL_OP_ALLGATHER:
        *in = c;
        *out = n * c;
        break;
    case WRK_COLL_OP_BROADCAST: /* one buffer: the root's goes in, everyone's comes out */
        *out = c;
        break;
    case WRK_COLL_OP_BARRIER:
        break;
    }
}

static int stage_start(wrk_coll_req_t *r)
{
    wrk_coll_t *c = r->g->c;
    wrk_coll_args_t a = r->a;
    size_t in, out;
    stage_sizes(r, &in, &out);
    r->host_in = in ? malloc(in) : NULL;
    r->host_out = out ? malloc(out) : NULL;
    if ((in && !r->host_in) || (out && !r->host_out))
        return -ENOMEM;
    int rc = 0;
    if (in)
        rc = c->stage.copy(c->stage.ud, r->host_in, a.sendbuf, in, 0);
    if (a.kind == WRK_COLL_OP_BROADCAST && a.peer == r->g->me && out)
        rc = c->stage.copy(c->stage.ud, r->host_out, a.recvbuf, out, 0);
    if (rc < 0)
        return rc;
    a.sendbuf = a.kind == WRK_COLL_OP_BROADCAST ? r->host_out : r->host_in;
    a.recvbuf = r->host_out;
    if (!(r->part[0] = part_new(r, &a)))
        return -ENOMEM;
    return backend_start(r->part[0]);
}

int wrk_coll_front_start(wrk_coll_req_t *r)
{
    int rc = r->g->c->stage.copy ? stage_start(r) : backend_start(r);
    if (rc < 0)
        wrk_coll_front_fini(r);
    return rc;
}

/* Test a part, keeping its outcome once known. */
static int part_test(wrk_coll_req_t *p)
{
    if (p->rc > 0)
        p->rc = wrk_coll_front_test(p);
    return p->rc;
}

int wrk_coll_front_test(wrk_coll_req_t *r)
{
    if (r->part[1]) {
        int a = part_test(r->part[0]), b = part_test(r->part[1]);
        return a < 0 ? a : b < 0 ? b : a || b;
    }
    if (!r->part[0])
        return r->g->c->ops->test(r);
    int rc = part_test(r->part[0]);
    if (rc != 0 || !r->host_out)
        return rc;
    wrk_coll_t *c = r->g->c;
    size_t in, out;
    stage_sizes(r, &in, &out);
    return c->stage.copy(c->stage.ud, r->a.recvbuf, r->host_out, out, 1);
}

void wrk_coll_front_fini(wrk_coll_req_t *r)
{
    int composed = r->part[0] != NULL || r->part[1] != NULL;
    for (int i = 0; i < 2; i++) {
        if (r->part[i]) {
            wrk_coll_front_fini(r->part[i]);
            free(r->part[i]);
            r->part[i] = NULL;
        }
    }
    if (!composed && r->be)
        r->g->c->ops->req_fini(r);
    free(r->host_in);
    free(r->host_out);
    r->host_in = r->host_out = NULL;
}
