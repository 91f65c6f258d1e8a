/* Fuzz target: daemon configuration (common/config.h) with a small table.
 *
 * Input: config file text, then NUL-separated command-line arguments. The file is written
 * to a scratch path and passed with --config; arguments that would name another config
 * file are dropped (the target must not read arbitrary paths, or block on a FIFO).
 * A load must succeed, ask for help (1) or fail with CH_E_CONFIG and a message. On
 * success every string is terminated within its field, and the result written back as an
 * INI file (when each string value survives INI trimming) must load to the same struct. */
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "fuzz.h"

#define MAX_ARGS 12

typedef struct cfg {
    char listen[CH_OPT_STRLEN];
    char data_dir[CH_OPT_STRLEN];
    long slots;
    long heartbeat_ms;
    int auth;
    int verbose;
} cfg_t;

static const ch_opt_t table[] = {
    {"listen", CH_OPT_STR, offsetof(cfg_t, listen), "0.0.0.0:7070", "address to listen on"},
    {"data-dir", CH_OPT_STR, offsetof(cfg_t, data_dir), NULL, "state directory"},
    {"slots", CH_OPT_INT, offsetof(cfg_t, slots), "8", "ranks this node can run"},
    {"heartbeat-ms", CH_OPT_INT, offsetof(cfg_t, heartbeat_ms), "1000", "heartbeat period"},
    {"auth", CH_OPT_BOOL, offsetof(cfg_t, auth), "yes", "require the cluster key"},
    {"verbose", CH_OPT_BOOL, offsetof(cfg_t, verbose), NULL, "log more"},
    {NULL, 0, 0, NULL, NULL},
};

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/* Can an INI line carry this string value unchanged? */
static int ini_safe(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '\n') == NULL && (n == 0 || (!is_space(s[0]) && !is_space(s[n - 1])));
}

static void check_strings(const cfg_t *c)
{
    FUZZ_ASSERT(memchr(c->listen, '\0', sizeof c->listen) != NULL);
    FUZZ_ASSERT(memchr(c->data_dir, '\0', sizeof c->data_dir) != NULL);
    FUZZ_ASSERT(c->auth == 0 || c->auth == 1);
    FUZZ_ASSERT(c->verbose == 0 || c->verbose == 1);
}

/* The loaded values as a config file under [node]; reloading it must agree. */
static void check_reload(const cfg_t *c, const char *path)
{
    if (!ini_safe(c->listen) || !ini_safe(c->data_dir))
        return;
    char text[4 * CH_OPT_STRLEN];
    int n = snprintf(text, sizeof text,
                     "# written back\n[node]\nlisten = %s\ndata-dir = %s\nslots = %ld\n"
                     "heartbeat-ms = %ld\nauth = %s\nverbose = %s\n",
                     c->listen, c->data_dir, c->slots, c->heartbeat_ms, c->auth ? "yes" : "no",
                     c->verbose ? "on" : "off");
    FUZZ_ASSERT(n > 0 && (size_t)n < sizeof text);
    fuzz_write_file(path, text, (size_t)n);
    cfg_t d;
    memset(&d, 0, sizeof d);
    char err[512] = "";
    char *argv[] = {"fuzz", "--config", (char *)path, NULL};
    int rc = ch_config_load(table, "node", &d, 3, argv, err, sizeof err);
    if (rc != 0)
        fuzz_fail(__FILE__, __LINE__, err);
    FUZZ_ASSERT(strcmp(c->listen, d.listen) == 0 && strcmp(c->data_dir, d.data_dir) == 0);
    FUZZ_ASSERT(c->slots == d.slots && c->heartbeat_ms == d.heartbeat_ms);
    FUZZ_ASSERT(c->auth == d.auth && c->verbose == d.verbose);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int env_cleared;
    if (!env_cleared) { /* the caller's environment must not leak into the verdicts */
        unsetenv("CHORUS_CONFIG");
        for (const ch_opt_t *o = table; o->name; o++) {
            char var[64] = "CHORUS_";
            for (size_t i = 0; o->name[i]; i++)
                var[7 + i] = o->name[i] == '-' ? '_' : (char)(o->name[i] & ~0x20);
            unsetenv(var);
        }
        env_cleared = 1;
    }

    char path[600], path2[600];
    fuzz_tmp_path(path, sizeof path, "node.conf");
    fuzz_tmp_path(path2, sizeof path2, "reload.conf");
    char *text = fuzz_cstr(data, size);
    size_t used = strlen(text) + 1;
    fuzz_write_file(path, text, strlen(text));

    char *args[MAX_ARGS + 4] = {"fuzz", "--config", path};
    int argc = 3;
    while (argc < MAX_ARGS + 3 && used < size) {
        char *a = fuzz_cstr(data + used, size - used);
        used += strlen(a) + 1;
        if (strncmp(a, "--config", 8) == 0) {
            free(a);
            continue;
        }
        args[argc++] = a;
    }
    args[argc] = NULL;

    cfg_t c;
    memset(&c, 0, sizeof c);
    char err[512] = "";
    int rc = ch_config_load(table, "node", &c, argc, args, err, sizeof err);
    FUZZ_ASSERT(memchr(err, '\0', sizeof err) != NULL);
    FUZZ_ASSERT(rc == 0 || rc == 1 || rc == CH_E_CONFIG);
    if (rc == CH_E_CONFIG)
        FUZZ_ASSERT(err[0] != '\0');
    if (rc == 0) {
        check_strings(&c);
        check_reload(&c, path2);
    }
    for (int i = 3; i < argc; i++)
        free(args[i]);
    free(text);
    return 0;
}
