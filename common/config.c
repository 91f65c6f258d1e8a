/* Table-driven daemon configuration (Redis's config table): the same ch_opt_t rows give the
 * defaults, the config-file keys, the environment variables, the flags and the --help text.
 *
 * ch_config_load reads argv twice: a first pass checks the flags' syntax and finds --help
 * and --config without touching cfg; then defaults, file, environment and finally the
 * flags are applied in that order, so each layer overrides the one before. */
#include "common/config.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "common/ini.h"
#include "common/util.h"

#define CONFIG_FILE_MAX (1u << 20)

int ch_config_parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1"};
    static const char *const no[] = {"no", "false", "off", "0"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -EINVAL;
}

int ch_config_parse_i64(const char *s, long long *out)
{
    /* strtoll skips leading spaces and accepts a lone sign; the INI reader already trimmed,
     * so anything but [+-]digits is junk here. */
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    if (!isdigit((unsigned char)*p))
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0')
        return -EINVAL;
    if (errno == ERANGE)
        return -ERANGE;
    *out = v;
    return 0;
}

static const ch_opt_t *find_opt(const ch_opt_t *table, const char *name, size_t len)
{
    for (const ch_opt_t *o = table; o->name != NULL; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

/* Store text into the option's field. `what` names where the value came from ("--listen",
 * "CHORUS_LISTEN", "FILE line 3: listen") for the error. */
static int set_opt(const ch_opt_t *o, void *cfg, const char *value, const char *what, char *err,
                   size_t errlen)
{
    char *field = (char *)cfg + o->offset;
    switch (o->type) {
    case CH_OPT_STR:
        if (strlen(value) >= CH_OPT_STRLEN) {
            snprintf(err, errlen, "%s: value too long (max %d characters)", what,
                     CH_OPT_STRLEN - 1);
            return CH_E_CONFIG;
        }
        strcpy(field, value);
        return 0;
    case CH_OPT_INT: {
        long long v = 0;
        int rc = ch_config_parse_i64(value, &v);
        if (rc == 0 && (v < LONG_MIN || v > LONG_MAX))
            rc = -ERANGE;
        if (rc < 0) {
            snprintf(err, errlen, "%s: %s, got '%s'", what,
                     rc == -ERANGE ? "integer out of range" : "expected an integer", value);
            return CH_E_CONFIG;
        }
        long lv = (long)v;
        memcpy(field, &lv, sizeof(lv));
        return 0;
    }
    case CH_OPT_BOOL: {
        int b = 0;
        if (ch_config_parse_bool(value, &b) < 0) {
            snprintf(err, errlen, "%s: expected yes/no/true/false/on/off/1/0, got '%s'", what,
                     value);
            return CH_E_CONFIG;
        }
        memcpy(field, &b, sizeof(b));
        return 0;
    }
    }
    snprintf(err, errlen, "%s: bad option type in the config table", what);
    return -EINVAL;
}

// ---------------------------------------------------------------------------------------
// flags

/* One flag at argv[*i]. Outputs the option (NULL for --config), its value, and whether it is
 * --help (stop = 1) or --version (stop = 2). Advances *i past a separate value. */
typedef struct flag {
    const ch_opt_t *opt;
    const char *value;
    int stop;
    int is_config;
} flag_t;

static int next_flag(const ch_opt_t *table, int argc, char **argv, int *i, flag_t *f, char *err,
                     size_t errlen)
{
    const char *arg = argv[*i];
    memset(f, 0, sizeof(*f));
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        f->stop = 1;
        return 0;
    }
    if (strcmp(arg, "--version") == 0 || strcmp(arg, "-V") == 0) {
        f->stop = 2;
        return 0;
    }
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
        snprintf(err, errlen, "unexpected argument '%s'", arg);
        return CH_E_CONFIG;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    const ch_opt_t *o = find_opt(table, name, len);
    int negated = 0;
    if (o == NULL && eq == NULL && strncmp(name, "no-", 3) == 0) {
        o = find_opt(table, name + 3, len - 3);
        if (o != NULL && o->type == CH_OPT_BOOL)
            negated = 1;
        else
            o = NULL;
    }
    if (o == NULL && !(len == 6 && strncmp(name, "config", 6) == 0)) {
        snprintf(err, errlen, "unknown option --%.*s", (int)len, name);
        return CH_E_CONFIG;
    }
    f->opt = o;
    f->is_config = o == NULL;
    if (eq != NULL) {
        f->value = eq + 1;
    } else if (negated) {
        f->value = "no";
    } else if (o != NULL && o->type == CH_OPT_BOOL) {
        f->value = "yes";
    } else if (*i + 1 < argc) {
        f->value = argv[++*i];
    } else {
        snprintf(err, errlen, "option --%s needs a value", name);
        return CH_E_CONFIG;
    }
    return 0;
}

/* apply = 0: check syntax, find --help, --version and --config. apply = 1: store the values. */
static int scan_flags(const ch_opt_t *table, void *cfg, int argc, char **argv, int apply,
                      const char **config_path, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        flag_t f;
        int rc = next_flag(table, argc, argv, &i, &f, err, errlen);
        if (rc < 0)
            return rc;
        if (f.stop)
            return f.stop;
        if (f.is_config) {
            *config_path = f.value;
            continue;
        }
        if (apply) {
            char what[CH_OPT_STRLEN];
            snprintf(what, sizeof(what), "--%s", f.opt->name);
            rc = set_opt(f.opt, cfg, f.value, what, err, errlen);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------
// file and environment

typedef struct file_ctx {
    const ch_opt_t *table;
    const char *section;
    void *cfg;
} file_ctx_t;

static int file_key(void *ud, const char *section, const char *key, const char *value, int line,
                    char *err, size_t errlen)
{
    file_ctx_t *c = ud;
    if (section[0] != '\0' && (c->section == NULL || strcmp(section, c->section) != 0))
        return 0; /* another daemon's section */
    const ch_opt_t *o = find_opt(c->table, key, strlen(key));
    if (o == NULL) {
        snprintf(err, errlen, "line %d: unknown key '%s'", line, key);
        return CH_E_CONFIG;
    }
    char what[CH_OPT_STRLEN + 32];
    snprintf(what, sizeof(what), "line %d: %s", line, key);
    return set_opt(o, c->cfg, value, what, err, errlen);
}

static int load_file(const ch_opt_t *table, const char *section, void *cfg, const char *path,
                     char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ch_file_read(path, CONFIG_FILE_MAX, &text, &len);
    if (rc < 0) {
        snprintf(err, errlen, "config file %s: %s", path, ch_strerror(rc));
        return CH_E_CONFIG;
    }
    char ierr[512] = "";
    if (memchr(text, '\0', len) != NULL) {
        snprintf(ierr, sizeof(ierr), "contains NUL bytes");
        rc = CH_E_CONFIG;
    } else {
        file_ctx_t ctx = {table, section, cfg};
        rc = ch_ini_parse(text, file_key, &ctx, ierr, sizeof(ierr));
    }
    if (rc < 0) {
        snprintf(err, errlen, "config file %s: %s", path, ierr);
        rc = CH_E_CONFIG;
    }
    free(text);
    return rc;
}

/* CHORUS_<NAME>: upper case, dashes as underscores. */
static void env_name(const char *name, char *out, size_t outlen)
{
    size_t n = (size_t)snprintf(out, outlen, "CHORUS_");
    for (; *name && n + 1 < outlen; name++, n++)
        out[n] = *name == '-' ? '_' : (char)toupper((unsigned char)*name);
    out[n] = '\0';
}

static int load_env(const ch_opt_t *table, void *cfg, char *err, size_t errlen)
{
    for (const ch_opt_t *o = table; o->name != NULL; o++) {
        char var[CH_OPT_STRLEN];
        env_name(o->name, var, sizeof(var));
        const char *v = getenv(var);
        if (v == NULL)
            continue;
        int rc = set_opt(o, cfg, v, var, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_defaults(const ch_opt_t *table, void *cfg, char *err, size_t errlen)
{
    for (const ch_opt_t *o = table; o->name != NULL; o++) {
        char what[CH_OPT_STRLEN];
        snprintf(what, sizeof(what), "default of %s", o->name);
        const char *def = o->def;
        if (def == NULL)
            def = o->type == CH_OPT_STR ? "" : "0";
        int rc = set_opt(o, cfg, def, what, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------

int ch_config_load(const ch_opt_t *table, const char *section, void *cfg, int argc, char **argv,
                   char *err, size_t errlen)
{
    if (errlen > 0)
        err[0] = '\0';
    const char *config_path = getenv("CHORUS_CONFIG");
    int rc = scan_flags(table, cfg, argc, argv, 0, &config_path, err, errlen);
    if (rc != 0)
        return rc;
    rc = load_defaults(table, cfg, err, errlen);
    if (rc < 0)
        return rc;
    if (config_path != NULL && config_path[0] != '\0') {
        rc = load_file(table, section, cfg, config_path, err, errlen);
        if (rc < 0)
            return rc;
    }
    rc = load_env(table, cfg, err, errlen);
    if (rc < 0)
        return rc;
    return scan_flags(table, cfg, argc, argv, 1, &config_path, err, errlen);
}

void ch_config_usage(FILE *f, const char *prog, const ch_opt_t *table)
{
    fprintf(f, "Usage: %s [OPTIONS]\n\nOptions (flag > environment > config file > default):\n",
            prog);
    fprintf(f, "  --%-22s %s\n", "config FILE",
            "read options from this INI file (env CHORUS_CONFIG)");
    for (const ch_opt_t *o = table; o->name != NULL; o++) {
        char flag[CH_OPT_STRLEN + 16], var[CH_OPT_STRLEN];
        snprintf(flag, sizeof(flag), "%s%s", o->name,
                 o->type == CH_OPT_STR   ? " VALUE"
                 : o->type == CH_OPT_INT ? " N"
                                         : "");
        env_name(o->name, var, sizeof(var));
        const char *def = o->def != NULL ? o->def : "";
        if (o->type == CH_OPT_BOOL && o->def == NULL)
            def = "no";
        fprintf(f, "  --%-22s %s (default: %s%s%s; env %s)\n", flag, o->help ? o->help : "",
                def[0] != '\0' ? "" : "\"", def, def[0] != '\0' ? "" : "\"", var);
    }
    fprintf(f, "  --%-22s %s\n", "help", "print this text and exit");
    fprintf(f, "  --%-22s %s\n", "version", "print the version and exit");
}

void ch_config_version(FILE *f, const char *prog)
{
    fprintf(f, "%s (Chorus) %s\n", prog, CHORUS_VERSION);
}
