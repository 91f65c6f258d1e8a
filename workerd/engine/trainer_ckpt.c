/* The trainer's checkpoint side (trainer.h): the pieces this rank holds, init_from,
 * resume, and writing and committing a checkpoint. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/util.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/trainer.h"
#include "workerd/engine/trainer_impl.h"
#include "workerd/engine/zero.h"

// ----------------------------------------------------------------------------
// pieces: what this rank holds, for checkpoints and init_from (ckpt.h)

/* The stores of the table's owned ranges (model.h): the slab with the optimizer's state in its
 * layout, and ZeRO-3's shards. */
void eng_trainer_stores(const eng_trainer_t *t, eng_store_t st[ENG_NSTORES])
{
    st[ENG_STORE_SLAB] = (eng_store_t){.p = eng_model_params(t->model),
                                       .g = eng_model_grads(t->model),
                                       .m = t->optim.m,
                                       .v = t->optim.v};
    st[ENG_STORE_SHARDS] = t->zero ? eng_zero_store(t->zero) : (eng_store_t){0};
}

/* Every piece this rank holds (writers_only: those it writes into a checkpoint). */
static int pieces_of(const eng_trainer_t *t, int writers_only, eng_ckpt_piece_t **out, size_t *n)
{
    eng_store_t st[ENG_NSTORES];
    eng_trainer_stores(t, st);
    return eng_ckpt_pieces(t->model, st, writers_only, out, n);
}

/* Host copies of pieces in backend memory, for the checkpoint files (which read and write
 * the host's): every p, m and v of pc that is not NULL is pointed at a host buffer, the
 * backend pointers kept in st. With `fill` the buffers get the pieces' contents first (a
 * save); stage_back copies them back after a restore. A backend of host memory stages
 * nothing. */
typedef struct staged {
    float *host; /* one buffer for every piece */
    float **dev; /* 3 per piece: p, m, v (NULL: not staged) */
} staged_t;

static void stage_free(staged_t *st)
{
    free(st->host);
    free(st->dev);
    memset(st, 0, sizeof *st);
}

static int stage_pieces(const eng_trainer_t *t, eng_ckpt_piece_t *pc, size_t n, int fill,
                        staged_t *st)
{
    const eng_backend_t *be = t->be;
    memset(st, 0, sizeof *st);
    if (be->host_memory || n == 0)
        return 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (pc[i].b - pc[i].a) * (size_t)(!!pc[i].p + !!pc[i].m + !!pc[i].v);
    st->host = malloc((total ? total : 1) * sizeof *st->host);
    st->dev = calloc(3 * n, sizeof *st->dev);
    if (!st->host || !st->dev) {
        stage_free(st);
        return -ENOMEM;
    }
    float *h = st->host;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        float **ptr[3] = {&pc[i].p, &pc[i].m, &pc[i].v};
        size_t len = pc[i].b - pc[i].a;
        for (int k = 0; k < 3 && rc == 0; k++) {
            if (!*ptr[k])
                continue;
            st->dev[3 * i + (size_t)k] = *ptr[k];
            if (fill && len)
                rc = be->copy(be, h, *ptr[k], len * sizeof *h, ENG_COPY_D2H);
            *ptr[k] = h;
            h += len;
        }
    }
    if (rc < 0)
        stage_free(st);
    return rc;
}

/* The host copies back into the pieces' backend memory (after a restore filled them);
 * then, under ZeRO-3, the restored shards of the tensors outside blocks gathered into the
 * model's slab, which the passes read. */
static int stage_back(const eng_trainer_t *t, const eng_ckpt_piece_t *pc, size_t n,
                      const staged_t *st)
{
    int rc = 0;
    for (size_t i = 0; st->dev && i < n && rc == 0; i++) {
        const float *host[3] = {pc[i].p, pc[i].m, pc[i].v};
        size_t bytes = (pc[i].b - pc[i].a) * sizeof(float);
        for (int k = 0; k < 3 && rc == 0; k++)
            if (st->dev[3 * i + (size_t)k] && bytes)
                rc = t->be->copy(t->be, st->dev[3 * i + (size_t)k], host[k], bytes, ENG_COPY_H2D);
    }
    if (rc == 0 && t->zero)
        rc = eng_zero_gather_rest(t->zero);
    return rc;
}

int eng_trainer_init_from(eng_trainer_t *t, const char *path, char *err, size_t errlen)
{
    eng_ckpt_piece_t *pc = NULL;
    size_t n = 0;
    staged_t st;
    int rc = pieces_of(t, 0, &pc, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "init_from: %s", ch_strerror(rc));
    for (size_t i = 0; i < n; i++)
        pc[i].m = pc[i].v = NULL;
    if ((rc = stage_pieces(t, pc, n, 0, &st)) < 0) {
        free(pc);
        return ch_errf(err, errlen, rc, "init_from: host copies: %s", ch_strerror(rc));
    }
    rc = eng_ckpt_load_hf(path, pc, n, err, errlen);
    if (rc == 0 && (rc = stage_back(t, pc, n, &st)) < 0)
        ch_errf(err, errlen, rc, "init_from: copying the weights to %s memory: %s", t->be->name,
                ch_strerror(rc));
    stage_free(&st);
    free(pc);
    return rc;
}

// ----------------------------------------------------------------------------
// checkpoints

static void fill_meta(const eng_trainer_t *t, eng_ckpt_meta_t *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->job, sizeof m->job, "%s", t->job);
    m->step = t->next_step;
    m->layout = ch_jobspec_layout(&t->spec);
    m->rank = t->rank;
    m->world = ch_layout_world(m->layout); /* every rank of the job, tp * pp * dp */
    m->cfg = t->cfg;
    m->seed = t->spec.train.seed;
    m->data_seed = eng_data_seed(t->data);
}

int eng_trainer_resume(eng_trainer_t *t, uint64_t step, char *err, size_t errlen)
{
    char sdir[CH_PATH_LEN];
    if (!t->spec.checkpoint.dir[0])
        return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: not set, nothing to resume from");
    int rc = eng_ckpt_step_dir(t->spec.checkpoint.dir, t->job, step, sdir, sizeof sdir);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "checkpoint.dir: path too long");
    uint64_t next = t->next_step;
    rc = eng_trainer_resume_dir(t, sdir, err, errlen);
    if (rc == 0 && t->next_step != step) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: holds step %" PRIu64 ", expected %" PRIu64,
                     sdir, t->next_step, step);
        t->next_step = next;
    }
    return rc;
}

int eng_trainer_resume_dir(eng_trainer_t *t, const char *sdir, char *err, size_t errlen)
{
    eng_ckpt_meta_t expect;
    uint64_t got = 0, optim_t = 0;
    eng_ckpt_piece_t *pc = NULL;
    size_t n = 0;
    int rc;
    fill_meta(t, &expect);
    rc = pieces_of(t, 0, &pc, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "resume: %s", ch_strerror(rc));
    staged_t st;
    if ((rc = stage_pieces(t, pc, n, 0, &st)) < 0) {
        free(pc);
        return ch_errf(err, errlen, rc, "resume: host copies: %s", ch_strerror(rc));
    }
    rc = eng_ckpt_restore_pieces(sdir, &expect, pc, n, &optim_t, &got, err, errlen);
    if (rc == 0 && (rc = stage_back(t, pc, n, &st)) < 0)
        ch_errf(err, errlen, rc, "resume: copying the state to %s memory: %s", t->be->name,
                ch_strerror(rc));
    stage_free(&st);
    free(pc);
    if (rc < 0)
        return rc;
    if (got > (uint64_t)t->spec.train.steps)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: holds step %" PRIu64 ", past train.steps %" PRId64, sdir, got,
                       t->spec.train.steps);
    /* wte's padding rows are zero and stay so (they never receive gradient) */
    t->optim.t = optim_t;
    t->next_step = got;
    return 0;
}

void eng_trainer_request_checkpoint(eng_trainer_t *t)
{
    t->ckpt_asked = 1;
}

int eng_trainer_checkpoint_due(const eng_trainer_t *t)
{
    const ch_jobspec_t *s = &t->spec;
    if (!s->checkpoint.dir[0] || t->next_step == 0)
        return 0;
    if (t->next_step == (uint64_t)s->train.steps || t->ckpt_now)
        return 1;
    return s->checkpoint.every > 0 && t->next_step % (uint64_t)s->checkpoint.every == 0;
}

/* Every rank has written its shard: rank 0 writes the manifest naming all of them and
 * prunes; the others wait until it has, so a checkpoint a rank reports is committed. The
 * files' sizes and checksums are gathered in rank order, tp fastest, then dp, then pp. */
static int commit(eng_trainer_t *t, const eng_ckpt_meta_t *meta, const eng_ckpt_file_t *mine,
                  char *err, size_t errlen)
{
    ch_layout_t l = ch_jobspec_layout(&t->spec);
    uint32_t n = ch_layout_world(l);
    const eng_backend_t *be = t->be;
    size_t one = sizeof *mine, all = (size_t)n * one;
    eng_ckpt_file_t *files = calloc(n, sizeof *files);
    void *dev = NULL; /* the gathers' buffer: the collectives read the backend's memory */
    int rc = files ? be->alloc(be, all, &dev) : -ENOMEM;
    if (rc < 0) {
        free(files);
        return rc;
    }
    size_t stage_at = (size_t)t->stage * l.dp * l.tp * one;
    size_t tp_at = stage_at + (size_t)t->dpr * l.tp * one;
    char *d = dev;
    /* the gathers are in place: each member's block already at its place */
    files[tp_at / one + t->tpr] = *mine;
    rc = be->copy(be, d, files, all, ENG_COPY_H2D);
    if (rc == 0 && t->tp)
        rc = wrk_coll_allgather(t->tp, d + tp_at + t->tpr * one, d + tp_at, one, WRK_COLL_U8, NULL);
    if (rc < 0)
        goto gather_failed;
    if (t->dp && (rc = wrk_coll_allgather(t->dp, d + tp_at, d + stage_at, one * l.tp, WRK_COLL_U8,
                                          NULL)) < 0)
        goto gather_failed;
    if (t->pp &&
        (rc = wrk_coll_allgather(t->pp, d + stage_at, d, one * l.tp * l.dp, WRK_COLL_U8, NULL)) < 0)
        goto gather_failed;
    if ((rc = be->copy(be, files, d, all, ENG_COPY_D2H)) < 0)
        goto gather_failed;
    if (t->rank == 0) {
        rc = eng_ckpt_write_manifest(t->spec.checkpoint.dir, meta, files, n, err, errlen);
        if (rc == 0 && eng_ckpt_prune(t->spec.checkpoint.dir, t->job, t->spec.checkpoint.keep) < 0)
            CH_LOGW("train", "job=%s pruning old checkpoints failed", t->job);
    }
    /* rank 0's outcome travels with the barrier: a failed commit fails every rank */
    float failed = rc < 0 ? 1.0f : 0.0f;
    wrk_coll_group_t *order[3] = {t->pp, t->dp, t->tp};
    int brc = eng_trainer_reduce_small(t, &failed, 1, WRK_COLL_MAX, order, 3);
    if (rc == 0 && brc < 0)
        rc = ch_errf(err, errlen, brc, "committing the checkpoint: %s", ch_strerror(brc));
    else if (rc == 0 && failed != 0.0f)
        rc = ch_errf(err, errlen, CH_E_STATE, "rank 0 could not commit the checkpoint");
    be->free(be, dev);
    free(files);
    return rc;
gather_failed:
    be->free(be, dev);
    free(files);
    return ch_errf(err, errlen, rc, "gathering the shards' checksums: %s", ch_strerror(rc));
}

/* This rank's shard of step t->next_step under dir (ckpt_file.h's layout): the pieces it
 * writes into a checkpoint (writers_only), or every piece it holds. */
static int save_shard(eng_trainer_t *t, const char *dir, int writers_only, eng_ckpt_meta_t *meta,
                      eng_ckpt_file_t *file, char *err, size_t errlen)
{
    eng_ckpt_piece_t *pc = NULL;
    size_t n = 0;
    fill_meta(t, meta);
    *file = (eng_ckpt_file_t){.rank = t->rank};
    int rc = pieces_of(t, writers_only, &pc, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "checkpoint: %s", ch_strerror(rc));
    staged_t st;
    if ((rc = stage_pieces(t, pc, n, 1, &st)) < 0) {
        free(pc);
        return ch_errf(err, errlen, rc, "checkpoint: host copies of the %s state: %s", t->be->name,
                       ch_strerror(rc));
    }
    rc = eng_ckpt_save_pieces(dir, meta, pc, n, t->optim.t, &file->bytes, &file->checksum, err,
                              errlen);
    stage_free(&st);
    free(pc);
    return rc;
}

int eng_trainer_checkpoint(eng_trainer_t *t, uint64_t *bytes, uint64_t *checksum, char *err,
                           size_t errlen)
{
    eng_ckpt_meta_t meta;
    eng_ckpt_file_t file;
    const char *dir = t->spec.checkpoint.dir;
    if (!dir[0])
        return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: not set");
    int rc = save_shard(t, dir, 1, &meta, &file, err, errlen);
    if (rc < 0)
        return rc;
    rc = commit(t, &meta, &file, err, errlen);
    if (rc < 0)
        return rc;
    t->ckpt_asked = t->ckpt_now = 0;
    if (bytes)
        *bytes = file.bytes;
    if (checksum)
        *checksum = file.checksum;
    return 0;
}

int eng_trainer_save_own(eng_trainer_t *t, const char *dir, int64_t keep, char *err, size_t errlen)
{
    eng_ckpt_meta_t meta;
    eng_ckpt_file_t file;
    int rc = save_shard(t, dir, 0, &meta, &file, err, errlen);
    if (rc == 0)
        rc = eng_ckpt_write_manifest(dir, &meta, &file, 1, err, errlen);
    if (rc == 0 && eng_ckpt_prune(dir, t->job, keep) < 0)
        CH_LOGW("train", "job=%s %s: pruning old steps failed", t->job, dir);
    return rc;
}
