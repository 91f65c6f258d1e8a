/* A model's checkpoint pieces from its tensor table (ckpt.h). */
#include "workerd/engine/ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static float *at_or_null(float *base, size_t at)
{
    return base != NULL ? base + at : NULL;
}

int eng_ckpt_pieces(const eng_model_t *m, const eng_store_t stores[ENG_NSTORES], int writers_only,
                    eng_ckpt_piece_t **out, size_t *n)
{
    size_t nt = eng_model_ntensors(m), k = 0;
    eng_ckpt_piece_t *pc = calloc(nt ? nt : 1, sizeof *pc);
    if (pc == NULL)
        return -ENOMEM;
    for (int s = 0; s < ENG_NSTORES; s++) {
        const eng_store_t *st = &stores[s];
        for (size_t i = 0; i < nt && st->p != NULL; i++) {
            const eng_tensor_t *x = eng_model_tensor(m, i);
            if (x->store != (eng_store_id_t)s || x->own_lo == x->own_hi ||
                (writers_only && !x->written))
                continue;
            eng_ckpt_piece_t *q = &pc[k++];
            snprintf(q->name, sizeof q->name, "%s", x->name);
            q->slice = eng_tensor_slice(x);
            q->a = x->own_lo;
            q->b = x->own_hi;
            q->p = st->p + x->own_at;
            q->m = at_or_null(st->m, x->own_at);
            q->v = at_or_null(st->v, x->own_at);
        }
    }
    *out = pc;
    *n = k;
    return 0;
}
