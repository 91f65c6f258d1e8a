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

int ctl_arg_set(int argc, char **argv, int *i, char **assignment)
{
    if (strcmp(argv[*i], "--set") == 0 && *i + 1 < argc) {
        *assignment = argv[++*i];
        return 1;
    }
    if (strncmp(argv[*i], "--set=", 6) == 0) {
        *assignment = argv[*i] + 6;
        return 1;
    }
    return 0;
}

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

int ctl_cmd_jobfile(ctl_t *ctl, int argc, char **argv)
{
    (void)ctl;
    int tmpl = 0, markdown = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--template") == 0)
            tmpl = 1;
        else if (strcmp(argv[i], "--markdown") == 0)
            markdown = 1;
        else {
            ctl_errf("jobfile: unknown argument %s", argv[i]);
            return CTL_EXIT_USAGE;
        }
    }
    if (!tmpl) {
        ctl_errf("jobfile: usage: chorusctl jobfile --template [--markdown]");
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
