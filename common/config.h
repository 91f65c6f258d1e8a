/* Daemon configuration: one table per daemon drives the config file, the flags, the
 * environment and the --help text (Redis's config table). Precedence, lowest first:
 * defaults, the INI file (--config FILE, keys under [<section>] or at top level),
 * environment (CHORUS_<NAME>, dashes as underscores, upper case), flags (--name VALUE
 * or --name=VALUE; a bool flag alone means yes, --no-name means no). Keys in other
 * sections of the file are ignored, so one file can serve several daemons. "config" and
 * "help" are reserved names. */
#ifndef CH_CONFIG_H
#define CH_CONFIG_H

#include <stddef.h>
#include <stdio.h>

typedef enum { CH_OPT_STR, CH_OPT_INT, CH_OPT_BOOL } ch_opt_type_t;

typedef struct ch_opt {
    const char *name; /* "listen": --listen, key listen, env CHORUS_LISTEN */
    ch_opt_type_t type;
    size_t offset;   /* into the config struct: char[CH_OPT_STRLEN], long, or int */
    const char *def; /* default as text, NULL for empty */
    const char *help;
} ch_opt_t;

#define CH_OPT_STRLEN 256

/* The table ends with an entry whose name is NULL.
 * Fill cfg from the table. Unknown flags or keys, bad numbers: CH_E_CONFIG with the
 * option named in err. "--help" returns 1 (caller prints usage and exits 0), "--version" 2
 * (caller prints ch_config_version and exits 0). */
int ch_config_load(const ch_opt_t *table, const char *section, void *cfg, int argc, char **argv,
                   char *err, size_t errlen);
void ch_config_usage(FILE *f, const char *prog, const ch_opt_t *table);
/* "PROG (Chorus) VERSION": every binary's --version line, the version from the build. */
void ch_config_version(FILE *f, const char *prog);

/* Value parsers shared with the job file reader. Booleans: yes/no, true/false, on/off,
 * 1/0 (any case). Integers: base 10, whole string, no junk; -EINVAL for junk, -ERANGE
 * for overflow. */
int ch_config_parse_bool(const char *s, int *out);
int ch_config_parse_i64(const char *s, long long *out);

#endif
