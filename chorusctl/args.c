/* One option parser for every command: getopt_long over the command's row of options, so
 * `--opt value`, `--opt=value`, options after positional words and `--` (the end of the
 * options) work alike everywhere. The same rows drive `help COMMAND` and bash completion
 * (main.c). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"

int ctl_args_begin(ctl_args_t *a, const char *cmd, const ctl_opt_t *opts, int argc, char **argv)
{
    size_t n = 0, s = 0;
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->argc = argc + 1; /* getopt's argv[0]: the command's name, argv[-1] (see ctl.h) */
    a->argv = argv - 1;
    /* '-': positional words come back in order as 1 (options may follow them whatever
     * POSIXLY_CORRECT says); ':': a missing value returns ':', not '?' */
    a->shorts[s++] = '-';
    a->shorts[s++] = ':';
    for (; opts && opts[n].name; n++) {
        if (n >= CTL_OPTS_MAX) {
            ctl_errf("%s: too many options", cmd);
            return -1;
        }
        a->lopts[n] = (struct option){opts[n].name, opts[n].arg ? required_argument : no_argument,
                                      NULL, opts[n].key};
        if (opts[n].key < 256) {
            a->shorts[s++] = (char)opts[n].key;
            if (opts[n].arg)
                a->shorts[s++] = ':';
        }
    }
    a->shorts[s] = '\0';
    a->lopts[n] = (struct option){0};
    optind = 0; /* glibc: start afresh */
    opterr = 0; /* we say it, with the command's usage */
    return 0;
}

/* The word getopt stopped at, for messages. */
static const char *args_bad_word(const ctl_args_t *a, char *buf, size_t n)
{
    if (optopt && optopt < 256) {
        snprintf(buf, n, "-%c", optopt);
        return buf;
    }
    return optind > 0 && optind <= a->argc ? a->argv[optind - 1] : "?";
}

int ctl_args_next(ctl_args_t *a, const char **val)
{
    char buf[8];
    optopt = 0;
    int c;
    /* positional words move down to argv[1...], in order (never past the one being read) */
    while ((c = getopt_long(a->argc, a->argv, a->shorts, a->lopts, NULL)) == 1)
        a->argv[1 + a->npos++] = optarg;
    *val = optarg;
    if (c == -1) { /* the words after "--" are positional too */
        while (optind < a->argc)
            a->argv[1 + a->npos++] = a->argv[optind++];
        a->pos = a->argv + 1;
        return 0;
    }
    const char *word = c == '?' || c == ':' ? args_bad_word(a, buf, sizeof buf) : NULL;
    if (c == '?' && strchr(word, '='))
        ctl_errf("%s: unknown option '%s' (or a flag given a value)", a->cmd, word);
    else if (c == '?')
        ctl_errf("%s: unknown option '%s'", a->cmd, word);
    else if (c == ':')
        ctl_errf("%s: %s needs a value", a->cmd, word);
    else
        return c;
    ctl_usage(a->cmd);
    return -1;
}

int ctl_args_words(const char *cmd, int *argc, char ***argv)
{
    ctl_args_t a;
    const char *val;
    if (ctl_args_begin(&a, cmd, NULL, *argc, *argv) < 0 || ctl_args_next(&a, &val) != 0)
        return CTL_EXIT_USAGE;
    *argc = a.npos;
    *argv = a.pos;
    return CTL_EXIT_OK;
}
