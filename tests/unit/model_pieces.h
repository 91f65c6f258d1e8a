/* A whole model's checkpoint pieces for the tests that save and restore one model on the
 * CPU (test_ckpt.c, test_ckpt_piece.c): the one piece builder (ckpt.h) on the model's slab
 * and an optimizer's state. Static helpers of those tests, not a library. */
#ifndef TS_MODEL_PIECES_H
#define TS_MODEL_PIECES_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include "workerd/engine/ckpt.h"
#include "workerd/engine/optim.h"

/* The pieces of a whole model on the CPU with optimizer o (ckpt.h, from the model's table). */
static size_t model_pieces(eng_model_t *m, eng_optim_t *o, eng_ckpt_piece_t **pc)
{
    eng_store_t st[ENG_NSTORES] = {
        [ENG_STORE_SLAB] = {eng_model_params(m), eng_model_grads(m), o->m, o->v}};
    size_t n = 0;
    cr_assert_eq(eng_ckpt_pieces(m, st, 1, pc, &n), 0);
    return n;
}

/* Restore step_dir into m and o through those pieces (o->t the checkpoint's). */
static int restore_model(const char *sdir, const eng_ckpt_meta_t *expect, eng_model_t *m,
                         eng_optim_t *o, uint64_t *step, char *err, size_t errlen)
{
    eng_ckpt_piece_t *pc = NULL;
    size_t n = model_pieces(m, o, &pc);
    int rc = eng_ckpt_restore_pieces(sdir, expect, pc, n, &o->t, step, err, errlen);
    free(pc);
    return rc;
}

#endif
