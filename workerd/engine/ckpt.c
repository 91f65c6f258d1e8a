/* Checkpoint shards of a model (ckpt.h): the model's tensor table as checkpoint pieces,
 * saved and restored by the piece side (ckpt_piece.c). */
#include "workerd/engine/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* One piece per tensor of m: its TP slice, the whole of it; p, m, v point into the slabs
 * (m, v NULL when o is). *out malloc'd. */
static int model_pieces(eng_model_t *m, const eng_optim_t *o, eng_ckpt_piece_t **out, size_t *n)
{
    size_t nt = eng_model_ntensors(m);
    eng_ckpt_piece_t *pieces = calloc(nt ? nt : 1, sizeof *pieces);
    if (!pieces)
        return -ENOMEM;
    float *params = eng_model_params(m);
    for (size_t i = 0; i < nt; i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        eng_ckpt_piece_t *pc = &pieces[i];
        snprintf(pc->name, sizeof pc->name, "%s", t->name);
        pc->slice.ndim = t->ndim;
        memcpy(pc->slice.shape, t->shape, sizeof t->shape);
        memcpy(pc->slice.lo, t->lo, sizeof t->lo);
        memcpy(pc->slice.hi, t->hi, sizeof t->hi);
        pc->slice.parts = t->parts;
        pc->a = 0;
        pc->b = t->numel;
        pc->p = params + t->offset;
        pc->m = o ? o->m + t->offset : NULL;
        pc->v = o ? o->v + t->offset : NULL;
    }
    *out = pieces;
    *n = nt;
    return 0;
}

int eng_ckpt_save(const char *dir, const eng_ckpt_meta_t *meta, eng_model_t *m,
                  const eng_optim_t *o, uint64_t *bytes, uint64_t *checksum, char *err,
                  size_t errlen)
{
    eng_ckpt_piece_t *pieces = NULL;
    size_t n = 0;
    if (o->n != eng_model_nparams(m))
        return ch_errf(err, errlen, -EINVAL, "checkpoint: optimizer state does not match model");
    int rc = model_pieces(m, o, &pieces, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "checkpoint: %s", ch_strerror(rc));
    rc = eng_ckpt_save_pieces(dir, meta, pieces, n, o->t, bytes, checksum, err, errlen);
    free(pieces);
    return rc;
}

int eng_ckpt_restore(const char *step_dir, const eng_ckpt_meta_t *expect, eng_model_t *m,
                     eng_optim_t *o, uint64_t *step, char *err, size_t errlen)
{
    eng_ckpt_piece_t *pieces = NULL;
    size_t n = 0;
    uint64_t t = 0;
    if (o->n != eng_model_nparams(m))
        return ch_errf(err, errlen, -EINVAL, "checkpoint: optimizer state does not match model");
    int rc = model_pieces(m, o, &pieces, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "checkpoint: %s", ch_strerror(rc));
    rc = eng_ckpt_restore_pieces(step_dir, expect, pieces, n, &t, step, err, errlen);
    if (rc == 0)
        o->t = t;
    free(pieces);
    return rc;
}
