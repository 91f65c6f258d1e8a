/* Checkpoint files without the model (ckpt_file.h): paths, shard metadata, manifests,
 * pruning, verification. chorusctl links this side only.
 *
 * Shard metadata keys (all strings): format, job, step, rank, world, layout.tp,
 * layout.pp, layout.dp, model.layers, model.heads, model.embd, model.vocab,
 * model.padded_vocab, model.seq_len, seed, data.seed, data.step (the next step to read:
 * sampling is stateless, so this is the step), optim.t, shard = "full" (every tensor
 * whole) or "pieces", and slice.<name> for every piece that is not a whole tensor
 * (ckpt_piece.c). */
#include "workerd/engine/ckpt_file.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"

#define MANIFEST "manifest.json"

int eng_ckpt_step_dir(const char *dir, const char *job, uint64_t step, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%s/%s/step-%08" PRIu64, dir, job, step);
    return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

int eng_ckpt_shard_path(const char *step_dir, uint32_t rank, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%s/rank-%05" PRIu32 ".safetensors", step_dir, rank);
    return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

// save

int eng_ckpt_put_meta(ch_st_writer_t *w, const eng_ckpt_meta_t *m, uint64_t optim_t,
                      const char *shard)
{
    char v[32];
    int rc = 0;
#define META_U(key, val)                                                                           \
    do {                                                                                           \
        snprintf(v, sizeof v, "%" PRIu64, (uint64_t)(val));                                        \
        if (rc == 0)                                                                               \
            rc = ch_st_writer_meta(w, key, v);                                                     \
    } while (0)
    rc = ch_st_writer_meta(w, "format", ENG_CKPT_FORMAT);
    if (rc == 0)
        rc = ch_st_writer_meta(w, "job", m->job);
    if (rc == 0)
        rc = ch_st_writer_meta(w, "shard", shard);
    META_U("step", m->step);
    META_U("rank", m->rank);
    META_U("world", m->world);
    META_U("layout.tp", m->layout.tp);
    META_U("layout.pp", m->layout.pp);
    META_U("layout.dp", m->layout.dp);
    META_U("model.layers", m->cfg.layers);
    META_U("model.heads", m->cfg.heads);
    META_U("model.embd", m->cfg.embd);
    META_U("model.vocab", m->cfg.vocab);
    META_U("model.padded_vocab", m->cfg.padded_vocab);
    META_U("model.seq_len", m->cfg.seq_len);
    META_U("seed", m->seed);
    META_U("data.seed", m->data_seed);
    META_U("data.step", m->step);
    META_U("optim.t", optim_t);
#undef META_U
    return rc;
}

int eng_ckpt_write_manifest(const char *dir, const eng_ckpt_meta_t *meta,
                            const eng_ckpt_file_t *files, size_t nfiles, char *err, size_t errlen)
{
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN + 32];
    char *text = NULL;
    size_t len = 0;
    int rc = eng_ckpt_step_dir(dir, meta->job, meta->step, sdir, sizeof sdir);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: checkpoint path too long", dir);
    snprintf(path, sizeof path, "%s/" MANIFEST, sdir);
    ch_buf_t j;
    ch_buf_init(&j);
    ch_buf_puts(&j, "{\n  \"format\": \"" ENG_CKPT_FORMAT "\",\n  \"job\": ");
    ch_jw_str(&j, meta->job);
    ch_buf_printf(&j,
                  ",\n  \"step\": %" PRIu64 ",\n  \"layout\": {\"tp\": %" PRIu32
                  ", \"pp\": %" PRIu32 ", \"dp\": %" PRIu32 "},\n  \"world\": %" PRIu32
                  ",\n  \"files\": [",
                  meta->step, meta->layout.tp, meta->layout.pp, meta->layout.dp, meta->world);
    for (size_t i = 0; i < nfiles; i++)
        ch_buf_printf(&j,
                      "%s\n    {\"rank\": %" PRIu32 ", \"file\": \"rank-%05" PRIu32
                      ".safetensors\", \"bytes\": %" PRIu64 ", \"checksum\": \"%016" PRIx64 "\"}",
                      i ? "," : "", files[i].rank, files[i].rank, files[i].bytes,
                      files[i].checksum);
    ch_buf_puts(&j, "\n  ]\n}\n");
    rc = ch_buf_finish(&j, &text, &len);
    if (rc == 0)
        rc = ch_file_write_atomic(path, text, len, 0644);
    free(text);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", path, ch_strerror(rc));
    return 0;
}

// ----------------------------------------------------------------------------
// listing and pruning

static int parse_step_name(const char *name, uint64_t *step)
{
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 13)
        return -1;
    uint64_t v = 0;
    for (int i = 5; i < 13; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *step = v;
    return 0;
}

static int committed(const char *dir, const char *job, uint64_t step)
{
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN + 32];
    if (eng_ckpt_step_dir(dir, job, step, sdir, sizeof sdir) < 0)
        return 0;
    snprintf(path, sizeof path, "%s/" MANIFEST, sdir);
    return access(path, F_OK) == 0;
}

/* Step numbers of DIR/JOB/step-* in ascending order; *steps malloc'd. */
static int list_steps(const char *dir, const char *job, uint64_t **steps, size_t *n)
{
    char jdir[CH_PATH_LEN];
    *steps = NULL;
    *n = 0;
    if ((size_t)snprintf(jdir, sizeof jdir, "%s/%s", dir, job) >= sizeof jdir)
        return -ENAMETOOLONG;
    DIR *d = opendir(jdir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t s;
        if (parse_step_name(e->d_name, &s) < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            uint64_t *ns = realloc(*steps, cap * sizeof *ns);
            if (!ns) {
                rc = -ENOMEM;
                break;
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (size_t k = i; k > 0 && (*steps)[k - 1] > (*steps)[k]; k--) {
            uint64_t t = (*steps)[k];
            (*steps)[k] = (*steps)[k - 1];
            (*steps)[k - 1] = t;
        }
    if (rc < 0) {
        free(*steps);
        *steps = NULL;
        *n = 0;
    }
    return rc;
}

static int remove_step_dir(const char *dir, const char *job, uint64_t step)
{
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN + 300];
    int rc = eng_ckpt_step_dir(dir, job, step, sdir, sizeof sdir);
    if (rc < 0)
        return rc;
    DIR *d = opendir(sdir);
    if (!d)
        return -errno;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        if (unlink(path) < 0 && rc == 0)
            rc = -errno;
    }
    closedir(d);
    if (rmdir(sdir) < 0 && rc == 0)
        rc = -errno;
    if (rc < 0)
        CH_LOGW("ckpt", "cannot remove %s: %s", sdir, ch_strerror(rc));
    return rc;
}

int eng_ckpt_prune(const char *dir, const char *job, int64_t keep)
{
    uint64_t *steps = NULL;
    size_t n = 0;
    if (keep <= 0)
        return 0;
    int rc = list_steps(dir, job, &steps, &n);
    if (rc < 0)
        return rc;
    /* the keep-th newest committed step; everything older goes, committed or not (an
     * uncommitted older step can never be committed any more) */
    int64_t kept = 0;
    uint64_t oldest_kept = 0;
    for (size_t i = n; i-- > 0 && kept < keep;) {
        if (committed(dir, job, steps[i])) {
            kept++;
            oldest_kept = steps[i];
        }
    }
    for (size_t i = 0; kept == keep && i < n && steps[i] < oldest_kept; i++) {
        int r = remove_step_dir(dir, job, steps[i]);
        rc = rc ? rc : r;
    }
    free(steps);
    return rc;
}

int eng_ckpt_latest(const char *dir, const char *job, uint64_t *step)
{
    uint64_t *steps = NULL;
    size_t n = 0;
    int rc = list_steps(dir, job, &steps, &n);
    if (rc < 0)
        return rc;
    rc = CH_E_NOTFOUND;
    for (size_t i = n; i-- > 0;) {
        if (committed(dir, job, steps[i])) {
            *step = steps[i];
            rc = 0;
            break;
        }
    }
    free(steps);
    return rc;
}

// ----------------------------------------------------------------------------
// restore

int eng_ckpt_meta_u64(const ch_st_file_t *f, const char *key, uint64_t *out, char *err,
                      size_t errlen)
{
    const char *v = ch_st_meta(f, key);
    char *end = NULL;
    if (!v || !*v || *v == '-')
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: checkpoint metadata \"%s\" missing",
                       ch_st_path(f), key);
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: checkpoint metadata \"%s\" = \"%s\" is not a number", ch_st_path(f),
                       key, v);
    *out = x;
    return 0;
}

int eng_ckpt_meta_of(const ch_st_file_t *f, eng_ckpt_meta_t *meta, char *err, size_t errlen)
{
    const char *fmt = ch_st_meta(f, "format"), *job = ch_st_meta(f, "job");
    if (!fmt || strcmp(fmt, ENG_CKPT_FORMAT) != 0 || !job)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: not a Chorus checkpoint shard (format %s)",
                       ch_st_path(f), fmt ? fmt : "missing");
    memset(meta, 0, sizeof *meta);
    snprintf(meta->job, sizeof meta->job, "%s", job);
    struct {
        const char *key;
        uint64_t max;
        void *dst;
        int is32;
    } fields[] = {
        {"step", UINT64_MAX, &meta->step, 0},
        {"rank", UINT32_MAX, &meta->rank, 1},
        {"world", UINT32_MAX, &meta->world, 1},
        {"layout.tp", UINT32_MAX, &meta->layout.tp, 1},
        {"layout.pp", UINT32_MAX, &meta->layout.pp, 1},
        {"layout.dp", UINT32_MAX, &meta->layout.dp, 1},
        {"model.layers", UINT32_MAX, &meta->cfg.layers, 1},
        {"model.heads", UINT32_MAX, &meta->cfg.heads, 1},
        {"model.embd", UINT32_MAX, &meta->cfg.embd, 1},
        {"model.vocab", UINT32_MAX, &meta->cfg.vocab, 1},
        {"model.padded_vocab", UINT32_MAX, &meta->cfg.padded_vocab, 1},
        {"model.seq_len", UINT32_MAX, &meta->cfg.seq_len, 1},
        {"seed", UINT64_MAX, &meta->seed, 0},
        {"data.seed", UINT64_MAX, &meta->data_seed, 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        uint64_t v = 0;
        int rc = eng_ckpt_meta_u64(f, fields[i].key, &v, err, errlen);
        if (rc < 0)
            return rc;
        if (v > fields[i].max)
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: checkpoint metadata \"%s\" out of range",
                           ch_st_path(f), fields[i].key);
        if (fields[i].is32)
            *(uint32_t *)fields[i].dst = (uint32_t)v;
        else
            *(uint64_t *)fields[i].dst = v;
    }
    return 0;
}

int eng_ckpt_read_manifest(const char *step_dir, eng_ckpt_file_t **files, size_t *nfiles, char *err,
                           size_t errlen)
{
    char mpath[CH_PATH_LEN + 32], jerr[160];
    char *text = NULL;
    size_t len = 0;
    ch_json_t *root = NULL;
    eng_ckpt_file_t *list = NULL;
    *files = NULL;
    *nfiles = 0;
    if ((size_t)snprintf(mpath, sizeof mpath, "%s/" MANIFEST, step_dir) >= sizeof mpath)
        return ch_errf(err, errlen, -ENAMETOOLONG, "%s: path too long", step_dir);
    int rc = ch_file_read(mpath, 1u << 24, &text, &len);
    if (rc == -ENOENT)
        return ch_errf(err, errlen, rc,
                       "%s: no " MANIFEST ": the step is not committed (its shards are not "
                       "loaded unverified)",
                       step_dir);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", mpath, ch_strerror(rc));
    rc = ch_json_parse(text, len, NULL, &root, jerr, sizeof jerr);
    free(text);
    if (rc < 0)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: %s", mpath, jerr);
    const ch_json_t *arr = ch_json_get(root, "files");
    if (!arr || arr->type != CH_JSON_ARRAY || arr->nkids == 0) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: \"files\" missing or empty", mpath);
        goto out;
    }
    list = calloc(arr->nkids, sizeof *list);
    if (!list) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", mpath);
        goto out;
    }
    for (size_t i = 0; i < arr->nkids; i++) {
        const ch_json_t *e = arr->kids[i];
        const char *sum = ch_json_get_str(e, "checksum");
        uint64_t r = 0, bytes = 0;
        char *end = NULL;
        if (ch_json_u64(ch_json_get(e, "rank"), &r) < 0 || r > UINT32_MAX ||
            ch_json_u64(ch_json_get(e, "bytes"), &bytes) < 0 || !sum || strlen(sum) != 16) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: files[%zu]: rank, bytes or checksum bad",
                         mpath, i);
            goto out;
        }
        errno = 0;
        list[i].checksum = strtoull(sum, &end, 16);
        if (errno || *end) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: files[%zu]: checksum \"%s\" not hex", mpath,
                         i, sum);
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (list[k].rank == r) {
                rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: rank %" PRIu64 " listed twice", mpath,
                             r);
                goto out;
            }
        list[i].rank = (uint32_t)r;
        list[i].bytes = bytes;
    }
    *files = list;
    *nfiles = arr->nkids;
    list = NULL;
out:
    free(list);
    ch_json_free(root);
    return rc;
}

int eng_ckpt_check_file(const char *path, const eng_ckpt_file_t *want, char *err, size_t errlen)
{
    uint64_t sum = 0, bytes = 0;
    int rc = ch_hash64_file(path, &sum, &bytes);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", path, ch_strerror(rc));
    if (sum != want->checksum || bytes != want->bytes)
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: checksum %016" PRIx64 " (%" PRIu64
                       " bytes) does not match the manifest's %016" PRIx64 " (%" PRIu64 " bytes)",
                       path, sum, bytes, want->checksum, want->bytes);
    return 0;
}

int eng_ckpt_verify(const char *step_dir, uint32_t rank, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 32];
    eng_ckpt_file_t *files = NULL;
    size_t n = 0;
    int rc = eng_ckpt_shard_path(step_dir, rank, path, sizeof path);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: path too long", step_dir);
    if ((rc = eng_ckpt_read_manifest(step_dir, &files, &n, err, errlen)) < 0)
        return rc;
    rc = ch_errf(err, errlen, CH_E_FORMAT, "%s/" MANIFEST ": no checksum for rank %" PRIu32,
                 step_dir, rank);
    for (size_t i = 0; i < n; i++)
        if (files[i].rank == rank)
            rc = eng_ckpt_check_file(path, &files[i], err, errlen);
    free(files);
    return rc;
}
