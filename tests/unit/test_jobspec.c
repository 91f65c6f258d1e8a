/* Job files: parsing, --set overrides, every validation rule, and the canonical text. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/tokens.h"
#include "common/gpt2.h"
#include "common/plan.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "support.h"

static void expect_has(const char *err, const char *needle)
{
    cr_expect(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
}

Test(jobspec, defaults_are_valid)
{
    ch_jobspec_t j;
    char err[256] = "";
    ch_jobspec_defaults(&j);
    cr_assert_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(j.name, "job");
    cr_expect_eq(j.kind, CH_JOB_TRAIN);
    cr_expect_eq(j.model.layers, 4);
    cr_expect_eq(j.model.embd, 128);
    cr_expect_eq(j.parallel.micro_batch_size, 8);
    cr_expect_eq(j.parallel.reshard, CH_RESHARD_PER_USE);
    cr_expect_eq(j.train.steps, 300);
    cr_expect_eq(j.train.lr, 1e-3);
    cr_expect_eq(j.train.lr_min, -1);
    cr_expect_eq(j.train.seed, 1337);
    cr_expect_eq(j.train.device, CH_DEVICE_CPU);
    cr_expect_str_eq(j.train.data, "builtin");
    cr_expect_eq(j.checkpoint.keep, 3);
    cr_expect_eq(j.fault.step_timeout_s, 300);
    cr_expect_eq(j.diag.bytes, 1048576);
    cr_expect_eq(ch_jobspec_lr_min(&j), 1e-4, "lr_min -1 means lr / 10");
    j.train.lr_min = 0;
    cr_expect_eq(ch_jobspec_lr_min(&j), 0);
    cr_expect_str_eq(ch_job_kind_name(CH_JOB_DIAG), "diag");
    cr_expect_str_eq(ch_job_kind_name(CH_JOB_TRAIN), "train");
}

Test(jobspec, parse_every_section)
{
    const char *text =
        "# a full job\n"
        "[job]\nname = gpt2-small.v1\nkind = diag\n"
        "[model]\nlayers = 12\nheads = 12\nembd = 768\nvocab = 50257\nseq_len = 1024\n"
        "[parallel]\ntp = 1\npp = 3\ndp = 4\nmicrobatches = 8\n"
        "micro_batch_size = 2\nreshard = per-step\n"
        "[train]\nsteps = 5000\nlr = 6e-4\nlr_min = 6e-5\nwarmup = 700\n"
        "seed = 18446744073709551615\ndata = /data/fineweb train.bin\n"
        "init_from =\ndevice = cuda\nprecision = tf32\n"
        "[checkpoint]\ndir = /ckpt\nevery = 100\nkeep = 5\n"
        "[fault]\nmax_restarts = 0\nstep_timeout = 60\n"
        "[diag]\nrounds = 2\ngemm_size = 8192\ncollectives = on\nbytes = 0\n";
    ch_jobspec_t j;
    char err[256] = "";
    cr_assert_eq(ch_jobspec_parse(text, &j, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(j.name, "gpt2-small.v1");
    cr_expect_eq(j.kind, CH_JOB_DIAG);
    cr_expect(j.model.layers == 12 && j.model.heads == 12 && j.model.embd == 768);
    cr_expect(j.model.vocab == 50257 && j.model.seq_len == 1024);
    cr_expect(j.parallel.tp == 1 && j.parallel.pp == 3 && j.parallel.dp == 4);
    cr_expect(j.parallel.microbatches == 8 && j.parallel.micro_batch_size == 2);
    cr_expect_eq(j.parallel.reshard, CH_RESHARD_PER_STEP);
    cr_expect_eq(j.train.steps, 5000);
    cr_expect_eq(j.train.lr, 6e-4);
    cr_expect_eq(j.train.lr_min, 6e-5);
    cr_expect_eq(j.train.warmup, 700);
    cr_expect_eq(j.train.seed, UINT64_MAX);
    cr_expect_str_eq(j.train.data, "/data/fineweb train.bin");
    cr_expect_str_eq(j.train.init_from, "");
    cr_expect_eq(j.train.device, CH_DEVICE_CUDA);
    cr_expect_eq(j.train.precision, CH_PRECISION_TF32);
    cr_expect_str_eq(j.checkpoint.dir, "/ckpt");
    cr_expect(j.checkpoint.every == 100 && j.checkpoint.keep == 5);
    cr_expect(j.fault.max_restarts == 0 && j.fault.step_timeout_s == 60);
    cr_expect(j.diag.rounds == 2 && j.diag.gemm_size == 8192 && j.diag.collectives == 1);
    cr_expect_eq(j.diag.bytes, 0);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof(err)), 0, "%s", err);
    ch_layout_t l = ch_jobspec_layout(&j);
    cr_expect(l.tp == 1 && l.pp == 3 && l.dp == 4);
}

Test(jobspec, partial_file_keeps_defaults)
{
    ch_jobspec_t j, d;
    char err[256] = "";
    memset(&j, 0x77, sizeof(j)); /* parse starts from the defaults, whatever j held */
    cr_assert_eq(ch_jobspec_parse("[model]\nlayers = 8\n", &j, err, sizeof(err)), 0, "%s", err);
    ch_jobspec_defaults(&d);
    d.model.layers = 8;
    cr_expect_eq(memcmp(&j, &d, sizeof(j)), 0);
}

static void expect_parse_error(const char *text, const char *needle)
{
    ch_jobspec_t j;
    char err[256] = "";
    cr_expect_eq(ch_jobspec_parse(text, &j, err, sizeof(err)), CH_E_CONFIG, "parsed: %s", text);
    expect_has(err, needle);
}

Test(jobspec, unknown_sections_and_keys)
{
    expect_parse_error("[model]\nlayers = 2\nlayer = 3\n", "line 3: unknown key [model] layer");
    expect_parse_error("[job]\nname = x\n[modle]\nlayers = 2\n", "line 4: unknown section [modle]");
    expect_parse_error("name = x\n", "line 1: key name is outside any section");
    expect_parse_error("[train]\nsteps = 10\nsteps = 20\n", "line 3: [train] steps: already set");
    expect_parse_error("[train]\nsteps 10\n", "line 2");
}

Test(jobspec, bad_values_name_the_field)
{
    expect_parse_error("[train]\nsteps = -5\n", "line 2: [train] steps: must be >= 1, got -5");
    expect_parse_error("[model]\nlayers = 12x\n", "[model] layers: expected an integer");
    expect_parse_error("[model]\nlayers = \n", "[model] layers: expected an integer");
    expect_parse_error("[model]\nlayers = 4294967296\n", "[model] layers");
    expect_parse_error("[model]\nheads = -1\n", "[model] heads: must be >= 1, got -1");
    expect_parse_error("[train]\nsteps = 99999999999999999999\n", "[train] steps: integer out");
    expect_parse_error("[train]\nlr = fast\n", "[train] lr: expected a number");
    expect_parse_error("[train]\nlr = 1e999\n", "[train] lr: number out of range");
    expect_parse_error("[train]\nlr = nan\n", "[train] lr");
    expect_parse_error("[train]\nseed = -1\n", "[train] seed");
    expect_parse_error("[train]\nseed = 18446744073709551616\n", "[train] seed");
    expect_parse_error("[diag]\ncollectives = maybe\n", "[diag] collectives");
    expect_parse_error("[diag]\ngemm_size = 9000\n",
                       "[diag] gemm_size: must be between 1 and 8192, got 9000");
    expect_parse_error("[job]\nkind = eval\n", "[job] kind: expected train or diag");
    expect_parse_error("[parallel]\nreshard = sometimes\n", "[parallel] reshard");
    expect_parse_error("[parallel]\nstage_split = greedy\n",
                       "[parallel] stage_split: expected even, balanced or auto, got 'greedy'");
    expect_parse_error("[parallel]\nschedule = gpipe\n",
                       "[parallel] schedule: expected 1f1b, interleaved or zb-h1, got 'gpipe'");
    expect_parse_error("[parallel]\nvirtual_stages = 0\n", "[parallel] virtual_stages: must be");
    expect_parse_error("[train]\ndevice = gpu\n",
                       "[train] device: expected cpu or cuda, got 'gpu'");
    expect_parse_error("[train]\nprecision = fp16\n",
                       "[train] precision: expected fp32, tf32 or bf16, got 'fp16'");
    char big[2200];
    int n = snprintf(big, sizeof(big), "[train]\ndata = ");
    memset(big + n, 'x', 2000);
    big[n + 2000] = '\0';
    expect_parse_error(big, "[train] data: too long");
}

Test(jobspec, set_overrides)
{
    ch_jobspec_t j;
    char err[256] = "";
    ch_jobspec_defaults(&j);
    cr_assert_eq(ch_jobspec_set(&j, "train.steps=20", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, " parallel.tp = 2 ", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "train.lr=3e-4", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "checkpoint.dir=/a=b", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "train.init_from=", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "job.kind=diag", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "train.device=cuda", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(j.train.device, CH_DEVICE_CUDA);
    cr_expect_eq(j.parallel.stage_split, CH_SPLIT_EVEN, "even by default");
    cr_assert_eq(ch_jobspec_set(&j, "parallel.stage_split=balanced", err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(j.parallel.stage_split, CH_SPLIT_BALANCED);
    cr_expect_eq(j.train.steps, 20);
    cr_expect_eq(j.parallel.tp, 2);
    cr_expect_eq(j.train.lr, 3e-4);
    cr_expect_str_eq(j.checkpoint.dir, "/a=b");
    cr_expect_eq(j.kind, CH_JOB_DIAG);

    /* a file then overrides, as chorusctl submit does */
    cr_assert_eq(ch_jobspec_parse("[train]\nsteps = 50\n", &j, err, sizeof(err)), 0);
    cr_assert_eq(ch_jobspec_set(&j, "train.steps=60", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(j.train.steps, 60);

    ch_jobspec_t before = j;
    cr_expect_eq(ch_jobspec_set(&j, "train.steps=-5", err, sizeof(err)), CH_E_CONFIG);
    cr_expect_str_eq(err, "train.steps: must be >= 1, got -5");
    cr_expect_eq(ch_jobspec_set(&j, "model.layer=3", err, sizeof(err)), CH_E_CONFIG);
    cr_expect_str_eq(err, "unknown key model.layer");
    cr_expect_eq(ch_jobspec_set(&j, "nosuch.steps=3", err, sizeof(err)), CH_E_CONFIG);
    cr_expect_str_eq(err, "unknown key nosuch.steps");
    cr_expect_eq(ch_jobspec_set(&j, "steps=3", err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "section.key=value");
    cr_expect_eq(ch_jobspec_set(&j, "train.steps", err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "section.key=value");
    cr_expect_eq(ch_jobspec_set(&j, "train.lr=0.1x", err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.lr: expected a number");
    cr_expect_eq(ch_jobspec_set(&j, "train.data=a\nb", err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.data: contains a control character");
    cr_expect_eq(memcmp(&before, &j, sizeof(j)), 0, "failed overrides change nothing");
}

/* Validation: each rule, with the field it names. */
static void expect_invalid(const ch_jobspec_t *j, const char *needle)
{
    char err[512] = "";
    cr_expect_eq(ch_jobspec_validate(j, 0, err, sizeof(err)), CH_E_CONFIG, "valid, expected '%s'",
                 needle);
    expect_has(err, needle);
}

#define INVALID(stmt, needle)                                                                      \
    do {                                                                                           \
        ch_jobspec_t j;                                                                            \
        ch_jobspec_defaults(&j);                                                                   \
        stmt;                                                                                      \
        expect_invalid(&j, needle);                                                                \
    } while (0)

#define VALID(stmt)                                                                                \
    do {                                                                                           \
        ch_jobspec_t j;                                                                            \
        char err[512] = "";                                                                        \
        ch_jobspec_defaults(&j);                                                                   \
        stmt;                                                                                      \
        cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof(err)), 0, "%s: %s", #stmt, err);       \
    } while (0)

Test(jobspec, validate_job_and_model)
{
    INVALID(j.name[0] = '\0', "job.name");
    INVALID(strcpy(j.name, "my job"), "job.name");
    INVALID(strcpy(j.name, "a/b"), "job.name");
    INVALID(memset(j.name, 'a', sizeof(j.name)), "job.name");
    VALID(memset(j.name, 'a', 63); j.name[63] = '\0');
    VALID(strcpy(j.name, "A-z_0.9"));
    INVALID(j.kind = (ch_job_kind_t)7, "job.kind");
    INVALID(j.model.layers = 0, "model.layers: must be >= 1, got 0");
    INVALID(j.model.heads = 0, "model.heads: must be >= 1, got 0");
    INVALID(j.model.embd = 0, "model.embd");
    INVALID((j.model.embd = 100, j.model.heads = 3),
            "model.embd: 100 is not divisible by model.heads 3");
    INVALID(j.model.vocab = 1, "model.vocab: must be >= 2, got 1");
    VALID(j.model.vocab = 2);
    INVALID(j.model.seq_len = 0, "model.seq_len");
}

Test(jobspec, validate_parallel)
{
    INVALID((j.model.heads = 12, j.model.embd = 768, j.parallel.tp = 5),
            "parallel.tp: model.heads 12 is not divisible by tp 5");
    VALID((j.model.heads = 12, j.model.embd = 768, j.parallel.tp = 4));
    INVALID((j.model.layers = 2, j.parallel.pp = 4),
            "parallel.pp: model.layers 2 is less than pp 4");
    VALID((j.model.layers = 4, j.parallel.pp = 4));
    INVALID(j.parallel.tp = 0, "parallel.tp: must be >= 1");
    INVALID(j.parallel.pp = 0, "parallel.pp: must be >= 1");
    INVALID(j.parallel.dp = 0, "parallel.dp: must be >= 1");
    INVALID(j.parallel.microbatches = 0, "parallel.microbatches: must be >= 1");
    INVALID(j.parallel.micro_batch_size = 0, "parallel.micro_batch_size: must be >= 1");
    INVALID(j.parallel.reshard = (ch_reshard_t)9, "parallel.reshard");
    INVALID(j.parallel.stage_split = (ch_stage_split_t)4, "parallel.stage_split: bad split 4");
    INVALID((j.parallel.dp = 300000, j.parallel.tp = 4, j.model.heads = 4), "world size");
}

/* parallel.schedule and virtual_stages: each refusal names the field to change */
Test(jobspec, validate_schedule)
{
    VALID((j.parallel.pp = 2, j.parallel.schedule = CH_SCHEDULE_ZBH1));
    INVALID(j.parallel.schedule = (ch_schedule_t)7, "parallel.schedule: bad schedule 7");
    INVALID((j.parallel.pp = 2, j.parallel.virtual_stages = 2),
            "parallel.virtual_stages: 2 chunks per rank need parallel.schedule = interleaved, "
            "not 1f1b");
    INVALID((j.parallel.schedule = CH_SCHEDULE_ZBH1, j.parallel.recompute = CH_RECOMPUTE_FULL),
            "parallel.recompute: full cannot combine with parallel.schedule = zb-h1");
    /* the CUDA kernels run either half of a split backward; selective drops only the
     * probabilities, which no weight pass reads */
    VALID((j.parallel.pp = 2, j.parallel.schedule = CH_SCHEDULE_ZBH1,
           j.train.device = CH_DEVICE_CUDA));
    VALID((j.parallel.pp = 2, j.parallel.schedule = CH_SCHEDULE_ZBH1,
           j.parallel.recompute = CH_RECOMPUTE_SELECTIVE));
    INVALID((j.parallel.pp = 2, j.parallel.schedule = CH_SCHEDULE_ZBH1,
             j.parallel.recompute = CH_RECOMPUTE_FULL, j.train.device = CH_DEVICE_CUDA),
            "parallel.recompute: full cannot combine with parallel.schedule = zb-h1 (a block's "
            "weight pass reads its layer inputs");
    /* Megatron's rules; CPU only */
    INVALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2),
            "parallel.virtual_stages: interleaved needs pp >= 2 and virtual_stages >= 2");
    INVALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2,
             j.parallel.virtual_stages = 2, j.parallel.microbatches = 3),
            "parallel.microbatches: 3 is not a multiple of pp 2");
    INVALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2,
             j.parallel.virtual_stages = 3, j.parallel.microbatches = 4),
            "parallel.virtual_stages: model.layers 4 is not divisible by pp x virtual_stages = 6");
    /* its transfers in one global order (common/pipe_il.h): no deadlock on NCCL */
    VALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2,
           j.parallel.virtual_stages = 2, j.parallel.microbatches = 4,
           j.train.device = CH_DEVICE_CUDA));
    VALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2,
           j.parallel.virtual_stages = 2, j.parallel.microbatches = 4,
           j.parallel.recompute = CH_RECOMPUTE_FULL));
    VALID((j.parallel.schedule = CH_SCHEDULE_INTERLEAVED, j.parallel.pp = 2,
           j.parallel.virtual_stages = 2, j.parallel.microbatches = 4));
}

/* The canonical text carries the schedule keys across processes. */
Test(jobspec, schedule_round_trip)
{
    ch_jobspec_t j, back;
    char err[256] = "", *text = NULL;
    ch_jobspec_defaults(&j);
    cr_expect_eq(j.parallel.schedule, CH_SCHEDULE_1F1B, "1f1b by default");
    cr_expect_eq(j.parallel.virtual_stages, 1);
    cr_assert_eq(ch_jobspec_set(&j, "parallel.schedule=zb-h1", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_set(&j, "parallel.stage_split=auto", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ch_jobspec_format(&j, &text), 0);
    cr_expect(strstr(text, "schedule = zb-h1\n") != NULL, "%s", text);
    cr_expect(strstr(text, "stage_split = auto\n") != NULL, "%s", text);
    ch_jobspec_defaults(&back);
    cr_assert_eq(ch_jobspec_parse(text, &back, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(back.parallel.schedule, CH_SCHEDULE_ZBH1);
    cr_expect_eq(back.parallel.stage_split, CH_SPLIT_AUTO);
    free(text);
}

Test(jobspec, validate_train)
{
    INVALID(j.train.steps = 0, "train.steps: must be >= 1, got 0");
    INVALID(j.train.steps = -5, "train.steps: must be >= 1, got -5");
    INVALID(j.train.lr = 0, "train.lr: must be > 0");
    INVALID(j.train.lr = -1e-3, "train.lr: must be > 0");
    INVALID(j.train.lr = NAN, "train.lr");
    INVALID(j.train.lr_min = -0.5, "train.lr_min");
    INVALID(j.train.lr_min = 2e-3, "train.lr_min");
    VALID(j.train.lr_min = 0);
    VALID(j.train.lr_min = 1e-3);
    VALID(j.train.lr_min = -1);
    INVALID(j.train.warmup = -1, "train.warmup");
    INVALID(j.train.warmup = 301, "train.warmup: must be between 0 and train.steps 300, got 301");
    VALID(j.train.warmup = 300);
    INVALID(j.train.data[0] = '\t', "train.data: contains a control character");
    INVALID(j.train.device = (ch_device_t)7, "train.device: bad device 7");
    VALID(j.train.device = CH_DEVICE_CUDA);
    INVALID(j.train.precision = (ch_precision_t)5, "train.precision: bad precision 5");
    INVALID(j.train.precision = CH_PRECISION_TF32, "train.precision: tf32 is a GPU's");
    VALID((j.train.device = CH_DEVICE_CUDA, j.train.precision = CH_PRECISION_TF32));
    VALID((j.train.device = CH_DEVICE_CUDA, j.parallel.tp = 2));
    VALID(
        (j.train.device = CH_DEVICE_CUDA, j.parallel.tp = 2, j.parallel.pp = 2, j.parallel.dp = 2));
}

Test(jobspec, validate_checkpoint_fault_diag)
{
    INVALID(j.checkpoint.every = -1, "checkpoint.every");
    INVALID(j.checkpoint.keep = 0, "checkpoint.keep: must be >= 1");
    INVALID(j.checkpoint.every = 10, "checkpoint.dir: required when checkpoint.every is 10");
    VALID((j.checkpoint.every = 10, strcpy(j.checkpoint.dir, "/tmp/ck")));
    INVALID(j.fault.max_restarts = -1, "fault.max_restarts");
    VALID(j.fault.max_restarts = 0);
    INVALID(j.fault.step_timeout_s = -1, "fault.step_timeout");
    INVALID(j.diag.rounds = 0, "diag.rounds");
    INVALID(j.diag.gemm_size = 0, "diag.gemm_size: must be between 1 and 8192, got 0");
    INVALID(j.diag.gemm_size = 8193, "diag.gemm_size");
    VALID(j.diag.gemm_size = 8192);
    INVALID(j.diag.bytes = -1, "diag.bytes");
    INVALID(j.diag.bytes = (1ll << 30) + 1, "diag.bytes");
    VALID(j.diag.bytes = 1ll << 30);
}

Test(jobspec, check_files)
{
    ch_jobspec_t j;
    char err[512] = "";
    ch_jobspec_defaults(&j);
    strcpy(j.train.data, "/nonexistent/x/y");
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof(err)), 0, "files unchecked: %s", err);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    cr_expect_str_eq(err, "train.data: cannot read /nonexistent/x/y: No such file or directory");

    strcpy(j.train.data, "/");
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.data: cannot read /: not a regular file");

    char path[] = "/tmp/test_jobspec.XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    /* An empty file is readable but holds no tokens: refused at submit. */
    strcpy(j.train.data, path);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.data: ");
    expect_has(err, path);

    /* A token file with enough tokens, all < vocab, is accepted; a token >= vocab is not. */
    uint16_t tok[200];
    for (size_t i = 0; i < 200; i++)
        tok[i] = (uint16_t)(i % j.model.vocab);
    cr_assert_eq(ch_tokens_write(path, tok, 200), 0);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), 0, "%s", err);
    tok[150] = (uint16_t)j.model.vocab;
    cr_assert_eq(ch_tokens_write(path, tok, 200), 0);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.data: ");
    /* Too short for one sequence of seq_len + 1 tokens. */
    cr_assert_eq(ch_tokens_write(path, tok, 10), 0);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "fewer than seq_len + 1");
    j.train.data[0] = '\0';
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), 0, "%s", err);

    strcpy(j.train.init_from, "/nonexistent/gpt2.safetensors");
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.init_from: cannot read /nonexistent/gpt2.safetensors");
    /* a token file is no GPT-2 safetensors file */
    strcpy(j.train.init_from, path);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof(err)), CH_E_CONFIG);
    expect_has(err, "train.init_from: ");
    unlink(path);
}

static void roundtrip(const ch_jobspec_t *j)
{
    char *text = NULL, *again = NULL, err[256] = "";
    ch_jobspec_t back;
    cr_assert_eq(ch_jobspec_format(j, &text), 0);
    cr_assert_eq(ch_jobspec_parse(text, &back, err, sizeof(err)), 0, "%s\n%s", err, text);
    cr_expect_eq(memcmp(j, &back, sizeof(back)), 0, "struct differs after:\n%s", text);
    cr_expect_eq(back.train.lr, j->train.lr);
    cr_expect_eq(back.train.lr_min, j->train.lr_min);
    cr_assert_eq(ch_jobspec_format(&back, &again), 0);
    cr_expect_str_eq(again, text, "the canonical text is stable");
    free(text);
    free(again);
}

Test(jobspec, format_roundtrip)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    roundtrip(&j);

    char *text = NULL;
    cr_assert_eq(ch_jobspec_format(&j, &text), 0);
    expect_has(text, "[job]\nname = job\nkind = train\n");
    expect_has(text, "\n[train]\nsteps = 300\nlr = 0.001\nlr_min = -1\n");
    expect_has(text, "init_from =\ndevice = cpu\nprecision = fp32\n");
    expect_has(text, "[diag]\nrounds = 5\ngemm_size = 256\ncollectives = no\nbytes = 1048576\n");
    free(text);

    strcpy(j.name, "x.y_z-9");
    j.kind = CH_JOB_DIAG;
    j.model.vocab = 50257;
    j.parallel.tp = 4;
    j.parallel.reshard = CH_RESHARD_PER_STEP;
    j.parallel.stage_split = CH_SPLIT_BALANCED;
    j.train.steps = INT64_MAX;
    j.train.lr = 0.1 + 0.2;
    j.train.lr_min = 1.0 / 3.0 * 1e-5;
    j.train.seed = UINT64_MAX;
    strcpy(j.train.data, "/data/my tokens#1.bin");
    strcpy(j.train.init_from, "/m/gpt2;ok.safetensors");
    strcpy(j.checkpoint.dir, "/ck");
    j.train.device = CH_DEVICE_CUDA;
    j.train.precision = CH_PRECISION_TF32;
    j.checkpoint.every = 7;
    j.diag.collectives = 1;
    j.diag.bytes = 0;
    roundtrip(&j);

    j.train.lr = 5e-324; /* smallest denormal */
    j.train.lr_min = 0;
    roundtrip(&j);
    j.train.lr = 1.7976931348623157e308;
    roundtrip(&j);
}

/* Issue 11 class 9: bytes that are not a job file are refused before parsing. */
Test(jobspec, check_text_refuses_nul_binary_and_empty)
{
    char err[256] = "";
    const char ok[] = "# a job\n[job]\r\nname = a\tb\n";
    cr_assert_eq(ch_jobspec_check_text(ok, sizeof ok - 1, err, sizeof err), 0, "%s", err);
    const char nul[] = "[job]\nname = a\0b\n";
    cr_assert_eq(ch_jobspec_check_text(nul, sizeof nul - 1, err, sizeof err), CH_E_CONFIG);
    cr_assert(strstr(err, "NUL byte at offset 14"), "%s", err);
    const char bin[] = "[job]\n\x1b[2J";
    cr_assert_eq(ch_jobspec_check_text(bin, sizeof bin - 1, err, sizeof err), CH_E_CONFIG);
    cr_assert(strstr(err, "binary"), "%s", err);
    cr_assert_eq(ch_jobspec_check_text("", 0, err, sizeof err), CH_E_CONFIG);
    cr_assert(strstr(err, "no [section]"), "%s", err);
    cr_assert_eq(ch_jobspec_check_text("\n# nothing\n", 11, err, sizeof err), CH_E_CONFIG);
}

/* Issue 11 class 9: a model no rank could hold is refused at validation, naming the
 * field that makes it so, with no overflow on the way (vocab 2^32 - 1 pads past 2^32). */
Test(jobspec, absurd_models_are_refused_naming_the_field)
{
    ch_jobspec_t j;
    char err[512] = "";
    ch_jobspec_defaults(&j);
    j.model.layers = 1000000000;
    cr_assert_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    cr_assert(strncmp(err, "model.layers:", 13) == 0, "%s", err);
    ch_jobspec_defaults(&j);
    j.model.vocab = UINT32_MAX;
    cr_assert_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    cr_assert(strncmp(err, "model.vocab:", 12) == 0, "%s", err);
    ch_jobspec_defaults(&j);
    j.model.seq_len = 1u << 20;
    j.parallel.micro_batch_size = 64;
    cr_assert_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    cr_assert(strncmp(err, "model.seq_len:", 14) == 0, "%s", err);
    /* GPT-2 124M at 8 x 1024 is fine. */
    ch_jobspec_defaults(&j);
    j.model.layers = 12;
    j.model.heads = 12;
    j.model.embd = 768;
    j.model.vocab = 50257;
    j.model.seq_len = 1024;
    j.parallel.micro_batch_size = 8;
    cr_assert_eq(ch_jobspec_validate(&j, 0, err, sizeof err), 0, "%s", err);
}

// ---------------------------------------------------------------------------------------
// data sources, the optimizer section, the global batch, init_from's shapes, the template

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(jobspec, data_sources_refused_at_submit_with_the_field)
{
    char dir[512], path[640], glob[640], err[512] = "";
    cr_assert_eq(ts_tmpdir("jobspec-src", dir, sizeof dir), 0);
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    j.model.vocab = 256;
    j.model.seq_len = 16;
    uint16_t tok[100];
    for (int i = 0; i < 100; i++)
        tok[i] = (uint16_t)(i % 256);

    /* a glob that matches nothing */
    snprintf(glob, sizeof glob, "%s/shard_*.bin", dir);
    strcpy(j.train.data, glob);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.data: ");
    expect_has(err, "matches no file");
    /* two good shards: accepted */
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/shard_%d.bin", dir, k);
        cr_assert_eq(ch_tokens_write(path, tok, 100), 0);
    }
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), 0, "%s", err);
    /* an empty shard among them: refused naming it */
    snprintf(path, sizeof path, "%s/shard_2.bin", dir);
    write_text(path, "");
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.data: ");
    expect_has(err, "shard_2.bin");
    /* a token >= vocab in a shard */
    tok[50] = 300;
    cr_assert_eq(ch_tokens_write(path, tok, 100), 0);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "not below the model vocab 256");
    unlink(path);
    /* a missing file (no glob) */
    snprintf(j.train.data, sizeof j.train.data, "%s/missing.bin", dir);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.data: cannot read");

    /* text: a 0-byte file refused; a text file accepted at vocab 256, refused below */
    snprintf(path, sizeof path, "%s/input.txt", dir);
    write_text(path, "");
    snprintf(j.train.data, sizeof j.train.data, "text:%s", path);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.data: ");
    expect_has(err, "empty (0 bytes)");
    write_text(path, "First Citizen:\nBefore we proceed any further, hear me speak.\n");
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), 0, "%s", err);
    j.model.vocab = 100;
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "model.vocab must be >= 256");
    j.model.vocab = 256;

    /* val_data: the same checks under its own name; eval_every needs it */
    snprintf(j.train.val_data, sizeof j.train.val_data, "%s/val_*.bin", dir);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.val_data: ");
    j.train.val_data[0] = '\0';
    j.train.eval_every = 10;
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.eval_every: 10 needs train.val_data");
    ts_rmrf(dir);
}

Test(jobspec, optim_keys_default_to_the_old_constants_and_are_checked)
{
    ch_jobspec_t j;
    char err[512] = "";
    cr_assert_eq(ch_jobspec_parse("[job]\nname = x\n", &j, err, sizeof err), 0, "%s", err);
    cr_expect_eq(j.optim.weight_decay, 0.1);
    cr_expect_eq(j.optim.beta1, 0.9);
    cr_expect_eq(j.optim.beta2, 0.95);
    cr_expect_eq(j.optim.eps, 1e-8);
    cr_expect_eq(j.optim.grad_clip, 1.0);
    cr_assert_eq(ch_jobspec_parse("[optim]\nweight_decay = 0\nbeta1 = 0.8\nbeta2 = 0.999\n"
                                  "eps = 1e-6\ngrad_clip = 0\n",
                                  &j, err, sizeof err),
                 0, "%s", err);
    cr_expect_eq(j.optim.beta2, 0.999);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), 0, "%s", err);
    j.optim.beta2 = 1.0;
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "optim.beta2: must be >= 0 and < 1, got 1");
    j.optim.beta2 = 0.95;
    j.optim.eps = 0;
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "optim.eps");
    j.optim.eps = 1e-8;
    j.optim.weight_decay = -0.1;
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "optim.weight_decay");
}

Test(jobspec, global_batch_size_derives_microbatches)
{
    ch_jobspec_t j;
    char err[512] = "";
    cr_assert_eq(ch_jobspec_parse("[parallel]\nglobal_batch_size = 64\ndp = 2\n"
                                  "micro_batch_size = 8\n",
                                  &j, err, sizeof err),
                 0, "%s", err);
    cr_expect_eq(j.parallel.microbatches, 4);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), 0, "%s", err);
    /* --set of dp keeps the global batch: microbatches follows */
    cr_assert_eq(ch_jobspec_set(&j, "parallel.dp=4", err, sizeof err), 0, "%s", err);
    cr_expect_eq(j.parallel.microbatches, 2);
    cr_expect_eq(ch_jobspec_set(&j, "parallel.dp=3", err, sizeof err), CH_E_CONFIG);
    expect_has(err, "parallel.global_batch_size: 64 sequences is not divisible by dp 3");
    /* not dividing: refused at parse */
    cr_expect_eq(ch_jobspec_parse("[parallel]\nglobal_batch_size = 60\nmicro_batch_size = 8\n", &j,
                                  err, sizeof err),
                 CH_E_CONFIG);
    expect_has(err, "parallel.global_batch_size");
    /* microbatches given too, and disagreeing: refused by validate */
    cr_assert_eq(ch_jobspec_parse("[parallel]\nglobal_batch_size = 64\nmicrobatches = 2\n", &j, err,
                                  sizeof err),
                 0, "%s", err);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "leave microbatches out");
    /* unset: the old meaning */
    cr_assert_eq(ch_jobspec_parse("[parallel]\nmicrobatches = 3\n", &j, err, sizeof err), 0);
    cr_expect_eq(j.parallel.microbatches, 3);
    cr_expect_eq(j.parallel.global_batch_size, 0);
}

Test(jobspec, init_from_checked_against_the_model)
{
    char dir[512], path[640], err[512] = "";
    cr_assert_eq(ts_tmpdir("jobspec-hf", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/gpt2.safetensors", dir);
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    j.model.layers = 2;
    j.model.heads = 2;
    j.model.embd = 16;
    j.model.vocab = 64;
    j.model.seq_len = 32;
    ch_model_cfg_t m = ch_plan_model_of(&j);
    /* HF's layout: transformer. prefix, fp16, 1,024 positions: accepted (wpe cropped) */
    cr_assert_eq(ts_write_gpt2(path, &m, 1024, CH_ST_F16, 1), 0);
    strcpy(j.train.init_from, path);
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), 0, "%s", err);
    /* fewer positions than seq_len: refused naming the tensor and both shapes */
    j.model.seq_len = 2048;
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "train.init_from: ");
    expect_has(err, "tensor transformer.wpe.weight has shape [1024, 16]");
    expect_has(err, "needs [2048, 16] or more rows");
    j.model.seq_len = 32;
    /* another width */
    j.model.embd = 32;
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "tensor transformer.wte.weight has shape [64, 16]");
    expect_has(err, "needs [64, 32]");
    j.model.embd = 16;
    /* fewer layers in [model] than in the file, and more */
    j.model.layers = 1;
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "h.1.ln_1.weight, more blocks than [model] layers = 1");
    j.model.layers = 3;
    cr_expect_eq(ch_jobspec_validate(&j, 1, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "tensor h.2.ln_1.weight is missing");
    ts_rmrf(dir);
}

Test(jobspec, template_documents_every_key_and_parses_to_the_defaults)
{
    char *ini = NULL, *md = NULL, err[512] = "";
    ch_jobspec_t j, def;
    cr_assert_eq(ch_jobspec_template(0, &ini), 0);
    cr_assert_eq(ch_jobspec_template(1, &md), 0);
    cr_expect_null(strstr(ini, "(undocumented)"), "a key without documentation");
    cr_assert_eq(ch_jobspec_parse(ini, &j, err, sizeof err), 0, "%s", err);
    ch_jobspec_defaults(&def);
    cr_expect_eq(memcmp(&j, &def, sizeof j), 0, "the template's values are the defaults");
    /* every key of the canonical text appears in both, with its range and unit */
    char *canon = NULL;
    cr_assert_eq(ch_jobspec_format(&def, &canon), 0);
    for (char *line = strtok(canon, "\n"); line; line = strtok(NULL, "\n")) {
        char key[64], cell[80];
        if (line[0] == '[' || sscanf(line, "%63s =", key) != 1 || strstr(key, "_uid") ||
            strstr(key, "_gid"))
            continue;
        snprintf(cell, sizeof cell, "| `%s` |", key);
        cr_expect_not_null(strstr(md, cell), "%s missing from the markdown", key);
    }
    cr_expect_not_null(strstr(md, "| `global_batch_size` | `0` | sequences | >= 0 |"));
    cr_expect_not_null(strstr(ini, "# AdamW's second-moment decay.\n#   unit: -; range: 0 <= "
                                   "beta2 < 1\nbeta2 = 0.95\n"));
    free(canon);
    /* docs/jobfile.md is this output */
    const char *src = getenv("CHORUS_SRC_DIR");
    if (src && src[0]) {
        char path[1024], *doc = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/docs/jobfile.md", src);
        cr_assert_eq(ch_file_read(path, 1 << 20, &doc, &len), 0, "cannot read %s", path);
        cr_expect_str_eq(doc, md,
                         "docs/jobfile.md differs from `chorusctl jobfile --template --markdown`: "
                         "regenerate it");
        free(doc);
    }
    free(ini);
    free(md);
}

/* The healing keys of [fault]: their defaults, their ranges, and the policies not built
 * yet refused with a word saying so. */
Test(jobspec, fault_healing_keys)
{
    ch_jobspec_t j;
    char err[256] = "";
    ch_jobspec_defaults(&j);
    cr_expect(j.fault.backoff == 1 && j.fault.backoff_max == 60 && j.fault.crash_loop == 5);
    cr_expect(j.fault.nonfinite == CH_NONFINITE_FAIL && j.fault.straggler == CH_STRAGGLER_REPORT);
    cr_assert_eq(ch_jobspec_parse("[fault]\nnonfinite = skip\nbackoff = 0.5\ncrash_loop = 0\n", &j,
                                  err, sizeof err),
                 0, "%s", err);
    cr_expect(j.fault.nonfinite == CH_NONFINITE_SKIP && j.fault.backoff == 0.5 &&
              j.fault.crash_loop == 0);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), 0, "%s", err);

    cr_assert_eq(ch_jobspec_parse("[fault]\nnonfinite = rewind\n[train]\nskip_steps = 3, 7\n", &j,
                                  err, sizeof err),
                 0, "%s", err);
    cr_expect(j.fault.nonfinite == CH_NONFINITE_REWIND);
    cr_expect_str_eq(ch_nonfinite_name(j.fault.nonfinite), "rewind");
    cr_expect_eq(ch_jobspec_parse("[train]\nskip_steps = 7,3\n", &j, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "must ascend");
    cr_expect_eq(ch_jobspec_parse("[fault]\nnonfinite = retry\n", &j, err, sizeof err),
                 CH_E_CONFIG);
    expect_has(err, "expected fail, skip or rewind");
    cr_expect_eq(ch_jobspec_parse("[fault]\ncrash_loop = 1001\n", &j, err, sizeof err),
                 CH_E_CONFIG);
    expect_has(err, "[fault] crash_loop: must be between 0 and 1000");

    cr_assert_eq(ch_jobspec_parse("[fault]\nstraggler = replace\n", &j, err, sizeof err), 0);
    cr_expect(j.fault.straggler == CH_STRAGGLER_REPLACE);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), 0, "%s", err);

    cr_assert_eq(ch_jobspec_parse("[fault]\nbackoff = 10\nbackoff_max = 5\n", &j, err, sizeof err),
                 0);
    cr_expect_eq(ch_jobspec_validate(&j, 0, err, sizeof err), CH_E_CONFIG);
    expect_has(err, "fault.backoff_max");
}

/* Issue 23: bf16 on a GPU, on the CPU only as the emulation a test names; grad_reduce. */
Test(jobspec, bf16_precision_emulation_and_grad_reduce)
{
    ch_jobspec_t b;
    char why[512] = "";
    ch_jobspec_defaults(&b);
    cr_assert_eq(ch_jobspec_parse("[train]\nprecision = bf16\nemulate = yes\n"
                                  "[optim]\ngrad_reduce = bf16\n",
                                  &b, why, sizeof why),
                 0, "%s", why);
    cr_expect_eq(b.train.precision, CH_PRECISION_BF16);
    cr_expect_eq(b.train.emulate, 1);
    cr_expect_eq(b.optim.grad_reduce, CH_PRECISION_BF16);
    cr_expect_eq(ch_jobspec_validate(&b, 0, why, sizeof why), 0, "%s", why);
    char *text = NULL;
    cr_assert_eq(ch_jobspec_format(&b, &text), 0);
    cr_expect_not_null(strstr(text, "precision = bf16\nemulate = yes\n"), "%s", text);
    cr_expect_not_null(strstr(text, "grad_reduce = bf16\n"), "%s", text);
    free(text);
    expect_parse_error("[optim]\ngrad_reduce = fp16\n",
                       "[optim] grad_reduce: expected fp32 or bf16, got 'fp16'");
    INVALID(j.train.precision = CH_PRECISION_BF16, "train.precision: bf16 computes on a GPU");
    VALID((j.train.precision = CH_PRECISION_BF16, j.train.device = CH_DEVICE_CUDA));
    VALID((j.train.precision = CH_PRECISION_BF16, j.train.emulate = 1));
    INVALID(j.train.emulate = 1, "train.emulate: emulates bf16 on the CPU");
    INVALID((j.train.precision = CH_PRECISION_BF16, j.train.device = CH_DEVICE_CUDA,
             j.train.emulate = 1),
            "train.emulate");
    INVALID(j.optim.grad_reduce = CH_PRECISION_BF16, "optim.grad_reduce: bf16 reductions need");
    INVALID(j.optim.grad_reduce = CH_PRECISION_TF32, "optim.grad_reduce: bad type 1");
    VALID((j.train.precision = CH_PRECISION_BF16, j.train.emulate = 1,
           j.optim.grad_reduce = CH_PRECISION_BF16));
}
