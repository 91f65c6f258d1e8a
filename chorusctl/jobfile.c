/* Job files on the client, shared by submit and plan: read, parse over the defaults,
 * apply --set overrides and validate with file checks, so that both commands refuse a
 * bad file with the same message and exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/util.h"
#include "ctl.h"

#define JOBFILE_MAX (1u << 20)

int ctl_jobfile_load(const char *file, char *const *sets, int nsets, ch_jobspec_t *spec)
{
    char err[512] = "", *text = NULL;
    size_t len = 0;

    int rc = ch_file_read(file, JOBFILE_MAX, &text, &len);
    if (rc < 0) {
        ctl_errf("%s: %s", file, ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    ch_jobspec_defaults(spec);
    rc = ch_jobspec_check_text(text, len, err, sizeof err);
    if (rc == 0)
        rc = ch_jobspec_parse(text, spec, err, sizeof err);
    free(text);
    for (int i = 0; rc == 0 && i < nsets; i++)
        rc = ch_jobspec_set(spec, sets[i], err, sizeof err);
    if (rc == 0)
        rc = ch_jobspec_validate(spec, 1, err, sizeof err);
    if (rc < 0) {
        ctl_errf("%s: %s", file, err[0] ? err : ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    return CTL_EXIT_OK;
}

enum { OPT_TEMPLATE = 256, OPT_MARKDOWN };

const ctl_opt_t ctl_opts_jobfile[] = {
    {"template", OPT_TEMPLATE, NULL, "print the template (required)"},
    {"markdown", OPT_MARKDOWN, NULL, "as the Markdown reference docs/jobfile.md"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_jobfile(ctl_t *ctl, int argc, char **argv)
{
    (void)ctl;
    ctl_args_t a;
    const char *val;
    int tmpl = 0, markdown = 0, c;
    if (ctl_args_begin(&a, "jobfile", ctl_opts_jobfile, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &val)) > 0) {
        tmpl |= c == OPT_TEMPLATE;
        markdown |= c == OPT_MARKDOWN;
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (!tmpl || a.npos != 0) {
        ctl_usage("jobfile");
        return CTL_EXIT_USAGE;
    }
    char *text = NULL;
    int rc = ch_jobspec_template(markdown, &text);
    if (rc < 0) {
        ctl_errf("jobfile: %s", ch_strerror(rc));
        return CTL_EXIT_FAILED;
    }
    fputs(text, stdout);
    free(text);
    return CTL_EXIT_OK;
}
