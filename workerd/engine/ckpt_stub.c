/* TEMPORARY (branch zero only): until the ckpt branch lands. */
#include <errno.h>
#include "common/err.h"
#include "workerd/engine/ckpt.h"
int eng_ckpt_save_pieces(const char *dir, const eng_ckpt_meta_t *meta,
                         const eng_ckpt_piece_t *pieces, size_t n, uint64_t optim_t,
                         uint64_t *bytes, uint64_t *checksum, char *err, size_t errlen)
{
    (void)dir, (void)meta, (void)pieces, (void)n, (void)optim_t, (void)bytes, (void)checksum;
    return ch_errf(err, errlen, -ENOTSUP, "stub");
}
int eng_ckpt_restore_pieces(const char *step_dir, const eng_ckpt_meta_t *expect,
                            eng_ckpt_piece_t *pieces, size_t n, uint64_t *optim_t,
                            uint64_t *step, char *err, size_t errlen)
{
    (void)step_dir, (void)expect, (void)pieces, (void)n, (void)optim_t, (void)step;
    return ch_errf(err, errlen, -ENOTSUP, "stub");
}
int eng_ckpt_load_hf(const char *path, eng_ckpt_piece_t *pieces, size_t n, char *err,
                     size_t errlen)
{
    (void)path, (void)pieces, (void)n;
    return ch_errf(err, errlen, -ENOTSUP, "stub");
}
