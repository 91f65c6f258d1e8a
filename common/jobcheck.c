/* A job's checks at submit beyond its fields (jobcheck.h): the files it reads and the
 * memory a rank needs. */
#include "common/jobcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/gpt2.h"
#include "common/plan.h"
#include "common/tokens.h"

/* A readable regular file, for train.data and train.init_from. */
static int check_file(const char *field, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0)
        goto fail;
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: cannot read %s: not a regular file", field, path);
        return CH_E_CONFIG;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        goto fail;
    close(fd);
    return 0;
fail:
    snprintf(err, errlen, "%s: cannot read %s: %s", field, path, strerror(errno));
    return CH_E_CONFIG;
}

/* The plan's memory per rank (common/plan.h) against CH_JOBSPEC_RANK_BYTES_MAX, naming
 * the field that weighs most: a model that cannot fit any rank is refused at submit, not
 * when its ranks fail to allocate. */
int ch_jobcheck_memory(const ch_jobspec_t *j, char *err, size_t errlen)
{
    if (j->kind != CH_JOB_TRAIN)
        return 0;
    ch_model_cfg_t m = ch_plan_model_of(j);
    ch_plan_t p;
    int rc = ch_plan_peak(&m, ch_jobspec_layout(j), j->parallel.micro_batch_size,
                          j->parallel.microbatches, j->parallel.reshard, &p);
    if (rc == -EINVAL)
        return 0; /* a zero field, already named by validate_fields */
    if (rc == 0 && p.total_bytes <= CH_JOBSPEC_RANK_BYTES_MAX)
        return 0;
    /* What dominates the peak stage: what grows with its blocks (state, gathered blocks,
     * activations), its wte slice, or the attention scores (seq_len squared; on CUDA one
     * log-sum-exp a row). */
    double row = m.att_row ? m.att_row : j->model.seq_len;
    double attn = 4.0 * j->parallel.micro_batch_size * (j->model.heads / j->parallel.tp) *
                  (double)j->model.seq_len * row * p.blocks * p.in_flight;
    double layers =
        16.0 * p.blocks * p.block_shard + p.gathered_bytes + p.act_mb_bytes * p.in_flight - attn;
    double vocab = 16.0 * p.padded_vocab * j->model.embd / j->parallel.tp;
    const char *field = "model.layers";
    if (vocab >= layers && vocab >= attn)
        field = "model.vocab";
    else if (attn >= layers && attn >= vocab)
        field = "model.seq_len";
    snprintf(err, errlen,
             "%s: the model needs %.3g GiB per rank (stage %u of layers %" PRIu32 ", embd %" PRIu32
             ", vocab %" PRIu32 ", seq_len %" PRIu32 "), over the %.0f GiB a rank may use",
             field, p.total_bytes / 1073741824.0, p.stage, j->model.layers, j->model.embd,
             j->model.vocab, j->model.seq_len, CH_JOBSPEC_RANK_BYTES_MAX / 1073741824.0);
    return CH_E_CONFIG;
}

/* Every file of a data source is checked (format, size, every token < vocab) so a bad
 * file is refused at submit, before anything is queued, rather than when ranks start. */
static int check_source(const char *field, const char *source, const ch_jobspec_t *j, char *err,
                        size_t errlen)
{
    char why[512] = "";
    ch_source_kind_t kind = ch_tokens_source_kind(source);
    if (kind == CH_SOURCE_FILE || kind == CH_SOURCE_TEXT) {
        const char *path = source + (kind == CH_SOURCE_TEXT ? strlen(CH_TOKENS_TEXT_PREFIX) : 0);
        int frc = check_file(field, path, err, errlen);
        if (frc < 0)
            return frc;
    }
    int rc = ch_tokens_source_check(source, j->model.vocab, j->model.seq_len, why, sizeof why);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_CONFIG, "%s: %s", field, why[0] ? why : ch_strerror(rc));
    return 0;
}

/* init_from against [model]: each tensor's name and shape (wpe may hold more positions). */
static int check_init(const ch_jobspec_t *j, char *err, size_t errlen)
{
    char why[512] = "";
    ch_model_cfg_t m = ch_plan_model_of(j);
    int rc = ch_gpt2_check_file(j->train.init_from, &m, why, sizeof why);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_CONFIG, "train.init_from: %s",
                       why[0] ? why : ch_strerror(rc));
    return 0;
}

int ch_jobcheck_files(const ch_jobspec_t *j, char *err, size_t errlen)
{
    int rc = 0;
    if (ch_tokens_source_kind(j->train.data) != CH_SOURCE_BUILTIN && j->kind == CH_JOB_TRAIN)
        rc = check_source("train.data", j->train.data, j, err, errlen);
    if (rc == 0 && j->train.val_data[0] && j->kind == CH_JOB_TRAIN)
        rc = check_source("train.val_data", j->train.val_data, j, err, errlen);
    if (rc == 0 && j->train.init_from[0] != '\0') {
        rc = check_file("train.init_from", j->train.init_from, err, errlen);
        if (rc == 0 && j->kind == CH_JOB_TRAIN)
            rc = check_init(j, err, errlen);
    }
    return rc;
}
