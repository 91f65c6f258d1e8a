/* chorusctl export CKPT_DIR --out DIR|FILE.safetensors [--dtype fp32|fp16|bf16]:
 * consolidate a committed checkpoint into a Hugging Face GPT-2 (DESIGN §8): a folder with
 * model.safetensors and config.json (what transformers' from_pretrained loads), or, when
 * --out ends in .safetensors, that one file. CKPT_DIR is either one step
 * directory (DIR/JOB/step-00000020) or a job's checkpoint directory (DIR/JOB), in which
 * case its newest committed step is exported. Runs locally: it reads the files, it does
 * not talk to the coordinator. */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "ctl.h"
#include "json.h"
#include "workerd/engine/ckpt_file.h"
#include "workerd/engine/export.h"

/* A job directory holds step-* directories; a step directory holds the shards. */
static int resolve_step_dir(const char *in, char *out, size_t outlen)
{
    char probe[PATH_MAX], pbuf[PATH_MAX], bbuf[PATH_MAX];
    struct stat st;
    uint64_t step = 0;

    snprintf(probe, sizeof probe, "%s/manifest.json", in);
    if (stat(probe, &st) == 0) {
        snprintf(out, outlen, "%s", in);
        return 0;
    }
    snprintf(pbuf, sizeof pbuf, "%s", in);
    snprintf(bbuf, sizeof bbuf, "%s", in);
    const char *dir = dirname(pbuf), *job = basename(bbuf);
    int rc = eng_ckpt_latest(dir, job, &step);
    if (rc < 0)
        return rc;
    return eng_ckpt_step_dir(dir, job, step, out, outlen);
}

enum { OPT_OUT = 256, OPT_DTYPE };

const ctl_opt_t ctl_opts_export[] = {
    {"out", OPT_OUT, "DIR|FILE.safetensors", "where to write (required)"},
    {"dtype", OPT_DTYPE, "fp32|fp16|bf16", "the weights' type (fp32)"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_export(ctl_t *ctl, int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *dtype_s = "fp32";
    ctl_args_t a;
    const char *val;
    int c;
    if (ctl_args_begin(&a, "export", ctl_opts_export, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &val)) > 0) {
        if (c == OPT_OUT)
            out = val;
        else
            dtype_s = val;
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (a.npos > 1) {
        ctl_errf("export: unexpected argument '%s'", a.pos[1]);
        ctl_usage("export");
        return CTL_EXIT_USAGE;
    }
    src = a.npos == 1 ? a.pos[0] : NULL;
    ch_st_dtype_t dtype = CH_ST_F32;
    if (strcmp(dtype_s, "fp16") == 0)
        dtype = CH_ST_F16;
    else if (strcmp(dtype_s, "bf16") == 0)
        dtype = CH_ST_BF16;
    else if (strcmp(dtype_s, "fp32") != 0) {
        ctl_errf("export: --dtype: expected fp32, fp16 or bf16, got '%s'", dtype_s);
        return CTL_EXIT_USAGE;
    }
    if (!src || !out) {
        ctl_usage("export");
        return CTL_EXIT_USAGE;
    }
    size_t olen = strlen(out), sfx = strlen(".safetensors");
    int hf_dir = !(olen > sfx && strcmp(out + olen - sfx, ".safetensors") == 0);

    char step_dir[PATH_MAX], err[512] = "";
    int rc = resolve_step_dir(src, step_dir, sizeof step_dir);
    if (rc < 0) {
        ctl_errf("export: %s: no committed checkpoint here (%s)", src, ch_strerror(rc));
        return CTL_EXIT_FAILED;
    }
    rc = eng_export_as(step_dir, out, dtype, hf_dir, err, sizeof err);
    if (rc < 0) {
        ctl_errf("export: %s", err[0] ? err : ch_strerror(rc));
        return rc == CH_E_CONFIG ? CTL_EXIT_CONFIG : CTL_EXIT_FAILED;
    }
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "checkpoint", step_dir);
        ctl_json_kstr(&j, "out", out);
        ctl_json_kstr(&j, "dtype", dtype_s);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else {
        printf("exported %s -> %s\n", step_dir, out);
    }
    return CTL_EXIT_OK;
}
