/* Job files (DESIGN §10). One table lists every field with its section, key, type, place in
 * ch_jobspec_t and, for integers, its allowed range; that table drives parsing, --set
 * overrides, range validation and the canonical text, so a new field is one row here.
 * Rules that relate two fields (heads %% tp, warmup <= steps, ...) are in jobrules.c. */
#include "common/jobspec.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "common/skipsteps.h"
#include "common/jobcheck.h"
#include "common/jobrules.h"
#include "common/jobspec_doc.h"
#include "common/ini.h"

#define GEMM_SIZE_MAX  8192
#define DIAG_BYTES_MAX (1ll << 30)
/* A job's restart history is kept whole: bound it. 0 disables restarts. */
#define MAX_RESTARTS       1000
#define VIRTUAL_STAGES_MAX 64 /* model chunks per pipeline rank */
/* Seconds; 0 disables the hang check. A week. */
#define STEP_TIMEOUT_MAX (7ll * 24 * 3600)

typedef enum {
    F_STR,
    F_U32,
    F_I64,
    F_U64,
    F_DBL,
    F_BOOL,
    F_KIND,
    F_RESHARD,
    F_DEVICE,
    F_PRECISION,
    F_SPLIT,
    F_NONFINITE,
    F_STRAGGLER,
    F_RECOMPUTE,
    F_SCHEDULE,
    F_GRAD_REDUCE
} ftype_t;

typedef struct field {
    const char *section, *key;
    ftype_t type;
    size_t off, size;   /* size: of the char array for F_STR */
    long long min, max; /* F_U32 and F_I64 */
} field_t;

#define JF(sec, key, type, member, min, max)                                                       \
    {                                                                                              \
        sec, key, type, offsetof(ch_jobspec_t, member), sizeof(((ch_jobspec_t *)0)->member), min,  \
            max                                                                                    \
    }

static const field_t fields[] = {
    JF("job", "name", F_STR, name, 0, 0),
    JF("job", "kind", F_KIND, kind, 0, 0),
    JF("job", "owner_uid", F_I64, owner.uid, -1, UINT32_MAX - 1),
    JF("job", "owner_gid", F_I64, owner.gid, -1, UINT32_MAX - 1),
    JF("job", "run_uid", F_I64, run_as.uid, -1, UINT32_MAX - 1),
    JF("job", "run_gid", F_I64, run_as.gid, -1, UINT32_MAX - 1),
    JF("job", "priority", F_I64, priority, -1000000, 1000000),
    JF("model", "layers", F_U32, model.layers, 1, UINT32_MAX),
    JF("model", "heads", F_U32, model.heads, 1, UINT32_MAX),
    JF("model", "embd", F_U32, model.embd, 1, UINT32_MAX),
    JF("model", "vocab", F_U32, model.vocab, 2, UINT32_MAX),
    JF("model", "seq_len", F_U32, model.seq_len, 1, UINT32_MAX),
    JF("parallel", "tp", F_U32, parallel.tp, 1, UINT32_MAX),
    JF("parallel", "pp", F_U32, parallel.pp, 1, UINT32_MAX),
    JF("parallel", "dp", F_U32, parallel.dp, 1, UINT32_MAX),
    JF("parallel", "microbatches", F_U32, parallel.microbatches, 1, UINT32_MAX),
    JF("parallel", "micro_batch_size", F_U32, parallel.micro_batch_size, 1, UINT32_MAX),
    JF("parallel", "reshard", F_RESHARD, parallel.reshard, 0, 0),
    JF("parallel", "stage_split", F_SPLIT, parallel.stage_split, 0, 0),
    JF("parallel", "global_batch_size", F_U32, parallel.global_batch_size, 0, UINT32_MAX),
    JF("parallel", "recompute", F_RECOMPUTE, parallel.recompute, 0, 0),
    JF("parallel", "schedule", F_SCHEDULE, parallel.schedule, 0, 0),
    JF("parallel", "virtual_stages", F_U32, parallel.virtual_stages, 1, VIRTUAL_STAGES_MAX),
    JF("train", "steps", F_I64, train.steps, 1, LLONG_MAX),
    JF("train", "lr", F_DBL, train.lr, 0, 0),
    JF("train", "lr_min", F_DBL, train.lr_min, 0, 0),
    JF("train", "warmup", F_I64, train.warmup, 0, LLONG_MAX),
    JF("train", "seed", F_U64, train.seed, 0, 0),
    JF("train", "data", F_STR, train.data, 0, 0),
    JF("train", "init_from", F_STR, train.init_from, 0, 0),
    JF("train", "device", F_DEVICE, train.device, 0, 0),
    JF("train", "precision", F_PRECISION, train.precision, 0, 0),
    JF("train", "emulate", F_BOOL, train.emulate, 0, 0),
    JF("train", "val_data", F_STR, train.val_data, 0, 0),
    JF("train", "eval_every", F_I64, train.eval_every, 0, LLONG_MAX),
    JF("train", "eval_tokens", F_I64, train.eval_tokens, 1, LLONG_MAX),
    JF("optim", "weight_decay", F_DBL, optim.weight_decay, 0, 0),
    JF("optim", "beta1", F_DBL, optim.beta1, 0, 0),
    JF("optim", "beta2", F_DBL, optim.beta2, 0, 0),
    JF("optim", "eps", F_DBL, optim.eps, 0, 0),
    JF("optim", "grad_clip", F_DBL, optim.grad_clip, 0, 0),
    JF("optim", "grad_reduce", F_GRAD_REDUCE, optim.grad_reduce, 0, 0),
    JF("train", "resume", F_STR, train.resume, 0, 0),
    JF("train", "log_every", F_I64, train.log_every, 0, LLONG_MAX),
    JF("train", "skip_steps", F_STR, train.skip_steps, 0, 0),
    JF("checkpoint", "dir", F_STR, checkpoint.dir, 0, 0),
    JF("checkpoint", "every", F_I64, checkpoint.every, 0, LLONG_MAX),
    JF("checkpoint", "keep", F_I64, checkpoint.keep, 1, LLONG_MAX),
    JF("checkpoint", "memory_every", F_I64, checkpoint.memory_every, 0, LLONG_MAX),
    JF("checkpoint", "run_id", F_STR, checkpoint.run_id, 0, 0),
    JF("fault", "max_restarts", F_I64, fault.max_restarts, 0, MAX_RESTARTS),
    JF("fault", "step_timeout", F_I64, fault.step_timeout_s, 0, STEP_TIMEOUT_MAX),
    JF("fault", "elastic", F_BOOL, fault.elastic, 0, 0),
    JF("fault", "backoff", F_DBL, fault.backoff, 0, 0),
    JF("fault", "backoff_max", F_DBL, fault.backoff_max, 0, 0),
    JF("fault", "crash_loop", F_I64, fault.crash_loop, 0, MAX_RESTARTS),
    JF("fault", "nonfinite", F_NONFINITE, fault.nonfinite, 0, 0),
    JF("fault", "straggler", F_STRAGGLER, fault.straggler, 0, 0),
    JF("diag", "rounds", F_I64, diag.rounds, 1, LLONG_MAX),
    JF("diag", "gemm_size", F_I64, diag.gemm_size, 1, GEMM_SIZE_MAX),
    JF("diag", "collectives", F_BOOL, diag.collectives, 0, 0),
    JF("diag", "bytes", F_I64, diag.bytes, 0, DIAG_BYTES_MAX),
};

#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

void ch_jobspec_defaults(ch_jobspec_t *j)
{
    memset(j, 0, sizeof(*j)); /* also zeroes padding and string tails: specs compare with memcmp */
    strcpy(j->name, "job");
    j->kind = CH_JOB_TRAIN;
    j->owner.uid = j->owner.gid = j->run_as.uid = j->run_as.gid = -1;
    j->model.layers = 4;
    j->model.heads = 4;
    j->model.embd = 128;
    j->model.vocab = 32;
    j->model.seq_len = 64;
    j->parallel.tp = 1;
    j->parallel.pp = 1;
    j->parallel.dp = 1;
    j->parallel.microbatches = 1;
    j->parallel.micro_batch_size = 8;
    j->parallel.reshard = CH_RESHARD_PER_USE;
    j->parallel.virtual_stages = 1;
    j->train.steps = 300;
    j->train.lr = 1e-3;
    j->train.lr_min = -1;
    j->train.warmup = 0;
    j->train.seed = 1337;
    strcpy(j->train.data, "builtin");
    j->train.device = CH_DEVICE_CPU;
    j->train.precision = CH_PRECISION_FP32;
    j->train.eval_every = 0;
    j->train.eval_tokens = 65536;
    j->optim.weight_decay = 0.1;
    j->optim.beta1 = 0.9;
    j->optim.beta2 = 0.95;
    j->optim.eps = 1e-8;
    j->optim.grad_clip = 1.0;
    j->train.log_every = 10;
    j->checkpoint.every = 0;
    j->checkpoint.keep = 3;
    j->fault.max_restarts = 3;
    j->fault.step_timeout_s = 300;
    j->fault.backoff = 1;
    j->fault.backoff_max = 60;
    j->fault.crash_loop = 5;
    j->diag.rounds = 5;
    j->diag.gemm_size = 256;
    j->diag.collectives = 0;
    j->diag.bytes = 1048576;
}

const char *ch_job_kind_name(ch_job_kind_t k)
{
    return k == CH_JOB_DIAG ? "diag" : "train";
}

double ch_jobspec_lr_min(const ch_jobspec_t *j)
{
    return j->train.lr_min < 0 ? j->train.lr / 10 : j->train.lr_min;
}

const char *ch_precision_name(ch_precision_t p)
{
    return p == CH_PRECISION_TF32 ? "tf32" : p == CH_PRECISION_BF16 ? "bf16" : "fp32";
}

const char *ch_nonfinite_name(ch_nonfinite_t p)
{
    return p == CH_NONFINITE_SKIP ? "skip" : p == CH_NONFINITE_REWIND ? "rewind" : "fail";
}

const char *ch_straggler_name(ch_straggler_t p)
{
    return p == CH_STRAGGLER_REPLACE ? "replace" : "report";
}

const char *ch_recompute_name(ch_recompute_t r)
{
    return r == CH_RECOMPUTE_FULL ? "full" : r == CH_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

const char *ch_stage_split_name(ch_stage_split_t s)
{
    return s == CH_SPLIT_AUTO ? "auto" : s == CH_SPLIT_BALANCED ? "balanced" : "even";
}

const char *ch_schedule_name(ch_schedule_t s)
{
    return s == CH_SCHEDULE_ZBH1 ? "zb-h1" : s == CH_SCHEDULE_INTERLEAVED ? "interleaved" : "1f1b";
}

static const char *reshard_name(ch_reshard_t r)
{
    return r == CH_RESHARD_PER_STEP ? "per-step" : "per-use";
}

static const field_t *find_field(const char *section, const char *key)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (strcmp(fields[i].section, section) == 0 && strcmp(fields[i].key, key) == 0)
            return &fields[i];
    return NULL;
}

static int known_section(const char *section)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (strcmp(fields[i].section, section) == 0)
            return 1;
    return 0;
}

// ---------------------------------------------------------------------------------------
// one field: check and store. Reasons are written without the field name; callers prefix it.

static int check_int(const field_t *f, long long v, char *why, size_t whylen)
{
    if (v >= f->min && v <= f->max)
        return 0;
    if (v < f->min && (f->max == LLONG_MAX || f->max == UINT32_MAX))
        snprintf(why, whylen, "must be >= %lld, got %lld", f->min, v);
    else
        snprintf(why, whylen, "must be between %lld and %lld, got %lld", f->min, f->max, v);
    return CH_E_CONFIG;
}

static int check_str(const field_t *f, const char *v, char *why, size_t whylen)
{
    if (strlen(v) >= f->size) {
        snprintf(why, whylen, "too long (at most %zu characters)", f->size - 1);
        return CH_E_CONFIG;
    }
    for (const char *p = v; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            snprintf(why, whylen, "contains a control character");
            return CH_E_CONFIG;
        }
    }
    if (f->off == offsetof(ch_jobspec_t, train.skip_steps))
        return ch_skip_check(v, why, whylen);
    return 0;
}

static int parse_int(const field_t *f, const char *v, long long *out, char *why, size_t whylen)
{
    int rc = ch_config_parse_i64(v, out);
    if (rc == -ERANGE) {
        snprintf(why, whylen, "integer out of range, got '%s'", v);
        return CH_E_CONFIG;
    }
    if (rc < 0) {
        snprintf(why, whylen, "expected an integer, got '%s'", v);
        return CH_E_CONFIG;
    }
    return check_int(f, *out, why, whylen);
}

static int parse_u64(const char *v, uint64_t *out, char *why, size_t whylen)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0') {
        snprintf(why, whylen, "expected a non-negative integer, got '%s'", v);
        return CH_E_CONFIG;
    }
    if (errno == ERANGE) {
        snprintf(why, whylen, "integer out of range, got '%s'", v);
        return CH_E_CONFIG;
    }
    *out = x;
    return 0;
}

static int parse_double(const char *v, double *out, char *why, size_t whylen)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (v[0] == '\0' || *end != '\0' || end == v) {
        snprintf(why, whylen, "expected a number, got '%s'", v);
        return CH_E_CONFIG;
    }
    if (!isfinite(x) || (errno == ERANGE && fabs(x) == HUGE_VAL)) {
        snprintf(why, whylen, "number out of range, got '%s'", v);
        return CH_E_CONFIG;
    }
    *out = x;
    return 0;
}

/* Parse text v into field f of j. j is written only on success. */
static int set_field(const field_t *f, ch_jobspec_t *j, const char *v, char *why, size_t whylen)
{
    char *p = (char *)j + f->off;
    long long i = 0;
    int rc = 0;
    switch (f->type) {
    case F_STR:
        rc = check_str(f, v, why, whylen);
        if (rc == 0) {
            memset(p, 0, f->size);
            memcpy(p, v, strlen(v));
        }
        return rc;
    case F_U32:
        rc = parse_int(f, v, &i, why, whylen);
        if (rc == 0)
            *(uint32_t *)p = (uint32_t)i;
        return rc;
    case F_I64:
        rc = parse_int(f, v, &i, why, whylen);
        if (rc == 0)
            *(int64_t *)p = (int64_t)i;
        return rc;
    case F_U64:
        return parse_u64(v, (uint64_t *)p, why, whylen);
    case F_DBL:
        return parse_double(v, (double *)p, why, whylen);
    case F_BOOL:
        if (ch_config_parse_bool(v, (int *)p) == 0)
            return 0;
        snprintf(why, whylen, "expected yes/no/true/false/on/off/1/0, got '%s'", v);
        return CH_E_CONFIG;
    case F_KIND:
        if (strcmp(v, "train") == 0 || strcmp(v, "diag") == 0) {
            *(ch_job_kind_t *)p = v[0] == 'd' ? CH_JOB_DIAG : CH_JOB_TRAIN;
            return 0;
        }
        snprintf(why, whylen, "expected train or diag, got '%s'", v);
        return CH_E_CONFIG;
    case F_RESHARD:
        if (strcmp(v, "per-use") == 0 || strcmp(v, "per-step") == 0) {
            *(ch_reshard_t *)p = v[4] == 's' ? CH_RESHARD_PER_STEP : CH_RESHARD_PER_USE;
            return 0;
        }
        snprintf(why, whylen, "expected per-use or per-step, got '%s'", v);
        return CH_E_CONFIG;
    case F_SPLIT:
        for (int k = CH_SPLIT_EVEN; k <= CH_SPLIT_AUTO; k++) {
            if (strcmp(v, ch_stage_split_name((ch_stage_split_t)k)) == 0) {
                *(ch_stage_split_t *)p = (ch_stage_split_t)k;
                return 0;
            }
        }
        snprintf(why, whylen, "expected even, balanced or auto, got '%s'", v);
        return CH_E_CONFIG;
    case F_SCHEDULE:
        for (int k = CH_SCHEDULE_1F1B; k <= CH_SCHEDULE_ZBH1; k++) {
            if (strcmp(v, ch_schedule_name((ch_schedule_t)k)) == 0) {
                *(ch_schedule_t *)p = (ch_schedule_t)k;
                return 0;
            }
        }
        snprintf(why, whylen, "expected 1f1b, interleaved or zb-h1, got '%s'", v);
        return CH_E_CONFIG;
    case F_NONFINITE:
        for (int k = CH_NONFINITE_FAIL; k <= CH_NONFINITE_REWIND; k++)
            if (strcmp(v, ch_nonfinite_name((ch_nonfinite_t)k)) == 0) {
                *(ch_nonfinite_t *)p = (ch_nonfinite_t)k;
                return 0;
            }
        snprintf(why, whylen, "expected fail, skip or rewind, got '%s'", v);
        return CH_E_CONFIG;
    case F_STRAGGLER:
        if (strcmp(v, "report") == 0 || strcmp(v, "replace") == 0) {
            *(ch_straggler_t *)p =
                v[2] == 'p' && v[3] == 'l' ? CH_STRAGGLER_REPLACE : CH_STRAGGLER_REPORT;
            return 0;
        }
        snprintf(why, whylen, "expected report or replace, got '%s'", v);
        return CH_E_CONFIG;
    case F_RECOMPUTE:
        for (int r = CH_RECOMPUTE_NONE; r <= CH_RECOMPUTE_SELECTIVE; r++) {
            if (strcmp(v, ch_recompute_name((ch_recompute_t)r)) == 0) {
                *(ch_recompute_t *)p = (ch_recompute_t)r;
                return 0;
            }
        }
        snprintf(why, whylen, "expected none, selective or full, got '%s'", v);
        return CH_E_CONFIG;
    case F_DEVICE:
        if (ch_device_parse(v, (ch_device_t *)p) == 0)
            return 0;
        snprintf(why, whylen, "expected cpu or cuda, got '%s'", v);
        return CH_E_CONFIG;
    case F_PRECISION:
        for (int k = CH_PRECISION_FP32; k <= CH_PRECISION_BF16; k++)
            if (strcmp(v, ch_precision_name((ch_precision_t)k)) == 0) {
                *(ch_precision_t *)p = (ch_precision_t)k;
                return 0;
            }
        snprintf(why, whylen, "expected fp32, tf32 or bf16, got '%s'", v);
        return CH_E_CONFIG;
    case F_GRAD_REDUCE:
        if (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0) {
            *(ch_precision_t *)p = v[0] == 'b' ? CH_PRECISION_BF16 : CH_PRECISION_FP32;
            return 0;
        }
        snprintf(why, whylen, "expected fp32 or bf16, got '%s'", v);
        return CH_E_CONFIG;
    }
    snprintf(why, whylen, "bad field type");
    return -EINVAL;
}

// ---------------------------------------------------------------------------------------
// parse and --set

/* parallel.global_batch_size, when set, decides microbatches: global / (dp x B). */
static int derive_microbatches(ch_jobspec_t *j, char *err, size_t errlen)
{
    uint32_t g = j->parallel.global_batch_size;
    uint64_t per = (uint64_t)j->parallel.dp * j->parallel.micro_batch_size;
    if (g == 0 || per == 0)
        return 0;
    if (g % per != 0) {
        snprintf(err, errlen,
                 "parallel.global_batch_size: %" PRIu32 " sequences is not divisible by dp %" PRIu32
                 " x micro_batch_size %" PRIu32 " = %" PRIu64,
                 g, j->parallel.dp, j->parallel.micro_batch_size, per);
        return CH_E_CONFIG;
    }
    j->parallel.microbatches = (uint32_t)(g / per);
    return 0;
}

typedef struct parse_ctx {
    ch_jobspec_t *j;
    int seen[NFIELDS]; /* line of the first assignment, 0 if none */
} parse_ctx_t;

static int parse_key(void *ud, const char *section, const char *key, const char *value, int line,
                     char *err, size_t errlen)
{
    parse_ctx_t *c = ud;
    if (section[0] == '\0') {
        snprintf(err, errlen, "line %d: key %s is outside any section", line, key);
        return CH_E_CONFIG;
    }
    if (!known_section(section)) {
        snprintf(err, errlen, "line %d: unknown section [%s]", line, section);
        return CH_E_CONFIG;
    }
    const field_t *f = find_field(section, key);
    if (f == NULL) {
        snprintf(err, errlen, "line %d: unknown key [%s] %s", line, section, key);
        return CH_E_CONFIG;
    }
    size_t idx = (size_t)(f - fields);
    if (c->seen[idx] != 0) {
        snprintf(err, errlen, "line %d: [%s] %s: already set at line %d", line, section, key,
                 c->seen[idx]);
        return CH_E_CONFIG;
    }
    c->seen[idx] = line;
    char why[256];
    int rc = set_field(f, c->j, value, why, sizeof(why));
    if (rc < 0)
        snprintf(err, errlen, "line %d: [%s] %s: %s", line, section, key, why);
    return rc;
}

int ch_jobspec_parse(const char *text, ch_jobspec_t *j, char *err, size_t errlen)
{
    parse_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    ch_jobspec_defaults(j);
    c->j = j;
    int rc = ch_ini_parse(text, parse_key, c, err, errlen);
    /* microbatches given beside global_batch_size is checked against it by validate */
    size_t micro = (size_t)(find_field("parallel", "microbatches") - fields);
    if (rc == 0 && !c->seen[micro])
        rc = derive_microbatches(j, err, errlen);
    free(c);
    return rc;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

int ch_jobspec_set(ch_jobspec_t *j, const char *assignment, char *err, size_t errlen)
{
    char *buf = strdup(assignment);
    if (buf == NULL)
        return -ENOMEM;
    int rc = CH_E_CONFIG;
    char *eq = strchr(buf, '=');
    char *dot = eq != NULL ? memchr(buf, '.', (size_t)(eq - buf)) : NULL;
    if (dot == NULL) {
        snprintf(err, errlen, "bad override '%s': expected section.key=value", assignment);
        goto out;
    }
    *eq = '\0';
    *dot = '\0';
    char *section = trim(buf), *key = trim(dot + 1), *value = trim(eq + 1);
    const field_t *f = find_field(section, key);
    if (f == NULL) {
        snprintf(err, errlen, "unknown key %s.%s", section, key);
        goto out;
    }
    char why[256];
    rc = set_field(f, j, value, why, sizeof(why));
    if (rc < 0)
        snprintf(err, errlen, "%s.%s: %s", section, key, why);
    else if (strcmp(section, "parallel") == 0 && strcmp(key, "microbatches") != 0)
        rc = derive_microbatches(j, err, errlen);
out:
    free(buf);
    return rc;
}

// ---------------------------------------------------------------------------------------
// validate

static long long get_int(const field_t *f, const ch_jobspec_t *j)
{
    const char *p = (const char *)j + f->off;
    return f->type == F_U32 ? (long long)*(const uint32_t *)p : (long long)*(const int64_t *)p;
}

/* Every field on its own: ranges, string lengths, enum values. */
static int check_field(const field_t *f, const ch_jobspec_t *j, char *why, size_t whylen)
{
    const char *p = (const char *)j + f->off;
    switch (f->type) {
    case F_U32:
    case F_I64:
        return check_int(f, get_int(f, j), why, whylen);
    case F_STR:
        if (memchr(p, '\0', f->size) == NULL) {
            snprintf(why, whylen, "not NUL-terminated");
            return CH_E_CONFIG;
        }
        return check_str(f, p, why, whylen);
    case F_KIND:
        if (j->kind == CH_JOB_TRAIN || j->kind == CH_JOB_DIAG)
            return 0;
        snprintf(why, whylen, "bad kind %d", (int)j->kind);
        return CH_E_CONFIG;
    case F_RESHARD:
        if (j->parallel.reshard == CH_RESHARD_PER_USE || j->parallel.reshard == CH_RESHARD_PER_STEP)
            return 0;
        snprintf(why, whylen, "bad policy %d", (int)j->parallel.reshard);
        return CH_E_CONFIG;
    case F_SPLIT:
        if (j->parallel.stage_split <= CH_SPLIT_AUTO)
            return 0;
        snprintf(why, whylen, "bad split %d", (int)j->parallel.stage_split);
        return CH_E_CONFIG;
    case F_SCHEDULE:
        if (j->parallel.schedule <= CH_SCHEDULE_ZBH1)
            return 0;
        snprintf(why, whylen, "bad schedule %d", (int)j->parallel.schedule);
        return CH_E_CONFIG;
    case F_RECOMPUTE:
        if (j->parallel.recompute <= CH_RECOMPUTE_SELECTIVE)
            return 0;
        snprintf(why, whylen, "bad recompute %d", (int)j->parallel.recompute);
        return CH_E_CONFIG;
    case F_DEVICE:
        if (j->train.device == CH_DEVICE_CPU || j->train.device == CH_DEVICE_CUDA)
            return 0;
        snprintf(why, whylen, "bad device %d", (int)j->train.device);
        return CH_E_CONFIG;
    case F_NONFINITE:
        if (j->fault.nonfinite <= CH_NONFINITE_REWIND)
            return 0;
        snprintf(why, whylen, "bad policy %d", (int)j->fault.nonfinite);
        return CH_E_CONFIG;
    case F_STRAGGLER:
        if (j->fault.straggler == CH_STRAGGLER_REPORT || j->fault.straggler == CH_STRAGGLER_REPLACE)
            return 0;
        snprintf(why, whylen, "bad policy %d", (int)j->fault.straggler);
        return CH_E_CONFIG;
    case F_PRECISION:
        if (j->train.precision >= CH_PRECISION_FP32 && j->train.precision <= CH_PRECISION_BF16)
            return 0;
        snprintf(why, whylen, "bad precision %d", (int)j->train.precision);
        return CH_E_CONFIG;
    case F_GRAD_REDUCE:
        if (j->optim.grad_reduce == CH_PRECISION_FP32 || j->optim.grad_reduce == CH_PRECISION_BF16)
            return 0;
        snprintf(why, whylen, "bad type %d", (int)j->optim.grad_reduce);
        return CH_E_CONFIG;
    case F_U64:
    case F_DBL:
    case F_BOOL:
        return 0; /* doubles are checked with their relations below */
    }
    return 0;
}

static int validate_fields(const ch_jobspec_t *j, char *err, size_t errlen)
{
    char why[256];
    for (size_t i = 0; i < NFIELDS; i++) {
        int rc = check_field(&fields[i], j, why, sizeof(why));
        if (rc < 0) {
            snprintf(err, errlen, "%s.%s: %s", fields[i].section, fields[i].key, why);
            return rc;
        }
    }
    return 0;
}

int ch_jobspec_check_text(const char *text, size_t len, char *err, size_t errlen)
{
    int section = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == 0) {
            snprintf(err, errlen, "not a job file: NUL byte at offset %zu", i);
            return CH_E_CONFIG;
        }
        if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f) {
            snprintf(err, errlen, "not a job file: binary byte 0x%02x at offset %zu", ch, i);
            return CH_E_CONFIG;
        }
        if (ch == '[' && (i == 0 || text[i - 1] == '\n'))
            section = 1;
    }
    if (!section) {
        snprintf(err, errlen, "not a job file: no [section] (an empty file is not a job)");
        return CH_E_CONFIG;
    }
    return 0;
}

int ch_jobspec_validate(const ch_jobspec_t *j, int check_files, char *err, size_t errlen)
{
    int rc = validate_fields(j, err, errlen);
    if (rc == 0)
        rc = ch_jobrules_check(j, err, errlen);
    if (rc < 0 || !check_files)
        return rc;
    return ch_jobcheck_files(j, err, errlen);
}

// ---------------------------------------------------------------------------------------
// canonical text

/* Shortest %.Ng that reads back to the same double (at most 17 digits, always exact). */
static void format_double(double x, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

static void format_field(FILE *f, const field_t *fd, const ch_jobspec_t *j)
{
    const char *p = (const char *)j + fd->off;
    char num[64];
    switch (fd->type) {
    case F_STR: /* no trailing space when empty */
        fprintf(f, "%s =%s%s\n", fd->key, p[0] != '\0' ? " " : "", p);
        return;
    case F_U32:
    case F_I64:
        fprintf(f, "%s = %lld\n", fd->key, get_int(fd, j));
        return;
    case F_U64:
        fprintf(f, "%s = %" PRIu64 "\n", fd->key, *(const uint64_t *)p);
        return;
    case F_DBL:
        format_double(*(const double *)p, num, sizeof(num));
        fprintf(f, "%s = %s\n", fd->key, num);
        return;
    case F_BOOL:
        fprintf(f, "%s = %s\n", fd->key, *(const int *)p ? "yes" : "no");
        return;
    case F_KIND:
        fprintf(f, "%s = %s\n", fd->key, ch_job_kind_name(j->kind));
        return;
    case F_RESHARD:
        fprintf(f, "%s = %s\n", fd->key, reshard_name(j->parallel.reshard));
        return;
    case F_SPLIT:
        fprintf(f, "%s = %s\n", fd->key, ch_stage_split_name(j->parallel.stage_split));
        return;
    case F_SCHEDULE:
        fprintf(f, "%s = %s\n", fd->key, ch_schedule_name(j->parallel.schedule));
        return;
    case F_RECOMPUTE:
        fprintf(f, "%s = %s\n", fd->key, ch_recompute_name(j->parallel.recompute));
        return;
    case F_DEVICE:
        fprintf(f, "%s = %s\n", fd->key, ch_device_name(j->train.device));
        return;
    case F_PRECISION:
        fprintf(f, "%s = %s\n", fd->key, ch_precision_name(j->train.precision));
        return;
    case F_GRAD_REDUCE:
        fprintf(f, "%s = %s\n", fd->key, ch_precision_name(j->optim.grad_reduce));
        return;
    case F_NONFINITE:
        fprintf(f, "%s = %s\n", fd->key, ch_nonfinite_name(j->fault.nonfinite));
        return;
    case F_STRAGGLER:
        fprintf(f, "%s = %s\n", fd->key, ch_straggler_name(j->fault.straggler));
        return;
    }
}

int ch_jobspec_format(const ch_jobspec_t *j, char **out)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return -ENOMEM;
    const char *section = NULL;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (section == NULL || strcmp(section, fields[i].section) != 0) {
            section = fields[i].section;
            fprintf(f, "%s[%s]\n", i == 0 ? "" : "\n", section);
        }
        format_field(f, &fields[i], j);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(buf);
        return -ENOMEM;
    }
    *out = buf;
    return 0;
}

// ---------------------------------------------------------------------------------------
// template: every key with its default, unit, range and meaning

/* The integer range of f as text ("1 to 8192", ">= 0"). */
static void int_range(const field_t *f, char *buf, size_t len)
{
    if (f->max == LLONG_MAX || f->max == UINT32_MAX)
        snprintf(buf, len, ">= %lld", f->min);
    else
        snprintf(buf, len, "%lld to %lld", f->min, f->max);
}

/* f's value in j as the canonical text writes it, without "key = ". */
static void value_text(const field_t *f, const ch_jobspec_t *j, char *buf, size_t len)
{
    char *line = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&line, &n);
    buf[0] = '\0';
    if (!m)
        return;
    format_field(m, f, j);
    fclose(m);
    const char *eq = line ? strchr(line, '=') : NULL;
    if (eq) {
        eq += eq[1] == ' ' ? 2 : 1;
        snprintf(buf, len, "%.*s", (int)strcspn(eq, "\n"), eq);
    }
    free(line);
}

/* text as "# " comment lines of at most 92 columns, broken at spaces. */
static void comment_wrapped(FILE *o, const char *text)
{
    const size_t width = 90;
    while (*text) {
        size_t n = strlen(text);
        if (n > width) {
            n = width;
            while (n > 0 && text[n] != ' ')
                n--;
            if (n == 0)
                n = strcspn(text, " ");
        }
        fprintf(o, "# %.*s\n", (int)n, text);
        text += n;
        while (*text == ' ')
            text++;
    }
}

static void template_key(FILE *o, int markdown, const field_t *f, const ch_jobspec_t *def)
{
    const ch_jobspec_doc_t *d = ch_jobspec_doc(f->section, f->key);
    char range[64] = "", value[CH_PATH_LEN + 8];
    if (d && d->range)
        snprintf(range, sizeof range, "%s", d->range);
    else if (f->type == F_U32 || f->type == F_I64)
        int_range(f, range, sizeof range);
    value_text(f, def, value, sizeof value);
    const char *unit = d && d->unit[0] ? d->unit : "-";
    const char *meaning = d ? d->meaning : "(undocumented)";
    if (markdown)
        fprintf(o, "| `%s` | `%s` | %s | %s | %s |\n", f->key, value, unit, range[0] ? range : "-",
                meaning);
    else {
        comment_wrapped(o, meaning);
        fprintf(o, "#   unit: %s; range: %s\n%s = %s\n", unit, range[0] ? range : "any", f->key,
                value);
    }
}

int ch_jobspec_template(int markdown, char **out)
{
    char *buf = NULL;
    size_t len = 0;
    ch_jobspec_t def;
    ch_jobspec_defaults(&def);
    FILE *o = open_memstream(&buf, &len);
    if (!o)
        return -ENOMEM;
    if (markdown)
        fprintf(o, "# Job file keys\n\n"
                   "Every key of a job file with its default, unit, range and meaning. This page "
                   "is the output of\n`chorusctl jobfile --template --markdown`, generated from "
                   "the table the parser uses;\n`chorusctl jobfile --template` prints the same "
                   "as a job file to start from. A key left out\ntakes its default. Rules "
                   "between keys (heads %% tp, warmup <= steps, ...) are checked at submit\nand "
                   "by `chorusctl plan`.\n");
    else
        fprintf(o, "# Chorus job file: every key with its default (chorusctl jobfile "
                   "--template).\n# Keep the keys you change; a key left out takes its "
                   "default.\n");
    const char *section = NULL;
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_t *f = &fields[i];
        if (strcmp(f->section, "job") == 0 && (strstr(f->key, "_uid") || strstr(f->key, "_gid")))
            continue; /* the coordinator's, not the user's */
        if (!section || strcmp(section, f->section) != 0) {
            section = f->section;
            if (markdown)
                fprintf(o,
                        "\n## [%s]\n\n| key | default | unit | range | meaning |\n"
                        "|---|---|---|---|---|\n",
                        section);
            else
                fprintf(o, "\n[%s]\n", section);
        }
        template_key(o, markdown, f, &def);
    }
    int bad = ferror(o);
    if (fclose(o) != 0 || bad) {
        free(buf);
        return -ENOMEM;
    }
    *out = buf;
    return 0;
}
