/* Daemon configuration: one table per daemon drives the config file, the flags, the
 * environment and the --help text (Redis's config table). Precedence, lowest first:
 * defaults, the INI file (--config FILE, keys under [<section>] or at top level),
 * environment (CHORUS_<NAME>, dashes as underscores, upper case), flags (--name VALUE
 * or --name=VALUE). */
#ifndef CH_CONFIG_H
#define CH_CONFIG_H

#include <stddef.h>
#include <stdio.h>

typedef enum { CH_OPT_STR, CH_OPT_INT, CH_OPT_BOOL } ch_opt_type_t;

typedef struct ch_opt {
    const char *name;  /* "listen": --listen, key listen, env CHORUS_LISTEN */
    ch_opt_type_t type;
    size_t offset;     /* into the config struct: char[CH_OPT_STRLEN], long, or int */
    const char *def;   /* default as text, NULL for empty */
    const char *help;
} ch_opt_t;

#define CH_OPT_STRLEN 256

/* Fill cfg from the table. Unknown flags or keys, bad numbers: CH_E_CONFIG with the
 * option named in err. "--help" returns 1 (caller prints usage and exits 0). */
int ch_config_load(const ch_opt_t *table, const char *section, void *cfg, int argc, char **argv,
                   char *err, size_t errlen);
void ch_config_usage(FILE *f, const char *prog, const ch_opt_t *table);

#endif
