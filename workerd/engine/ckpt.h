/* A model's checkpoint pieces (ckpt_piece.h), built from its tensor table: the one place
 * that turns "who holds which copy" (model.h's eng_tensor_t) into what a rank saves,
 * restores and loads. */
#ifndef ENG_CKPT_H
#define ENG_CKPT_H

#include <stddef.h>

#include "workerd/engine/ckpt_piece.h"
#include "workerd/engine/model.h"

/* The pieces of m this rank holds: for each store in eng_store_id_t order, each tensor of
 * the table in that store whose owned range is not empty, in table order: the tensor's
 * slice, [a, b) = [own_lo, own_hi), p, m and v at the store's arrays + own_at (NULL where the
 * store's array is NULL; a store whose p is NULL holds nothing). writers_only: only the
 * tensors this rank writes into a checkpoint (eng_tensor_t.written). *out malloc'd (one
 * element at least); 0 or -ENOMEM. */
int eng_ckpt_pieces(const eng_model_t *m, const eng_store_t stores[ENG_NSTORES], int writers_only,
                    eng_ckpt_piece_t **out, size_t *n);

#endif
