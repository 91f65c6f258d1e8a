/* Daemon config: defaults < file < environment < flags, errors that name the option, --help. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "common/err.h"

typedef struct cfg {
    char listen[CH_OPT_STRLEN];
    long heartbeat_ms;
    int verbose;
    char name[CH_OPT_STRLEN];
    long dead_after_ms;
} cfg_t;

static const ch_opt_t table[] = {
    {"listen", CH_OPT_STR, offsetof(cfg_t, listen), "127.0.0.1:7070", "address to listen on"},
    {"heartbeat-ms", CH_OPT_INT, offsetof(cfg_t, heartbeat_ms), "1000", "heartbeat period"},
    {"verbose", CH_OPT_BOOL, offsetof(cfg_t, verbose), NULL, "log more"},
    {"name", CH_OPT_STR, offsetof(cfg_t, name), NULL, "node name"},
    {"dead-after-ms", CH_OPT_INT, offsetof(cfg_t, dead_after_ms), "5000", "declare dead after"},
    {NULL, 0, 0, NULL, NULL},
};

static void clean_env(void)
{
    const char *vars[] = {"CHORUS_CONFIG",  "CHORUS_LISTEN",        "CHORUS_HEARTBEAT_MS",
                          "CHORUS_VERBOSE", "CHORUS_DEAD_AFTER_MS", "CHORUS_NAME"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

/* Writes text to a fresh file under CHORUS_TEST_TMP (or /tmp); returns its path. */
static char *write_file(const char *text)
{
    const char *base = getenv("CHORUS_TEST_TMP");
    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    mkdir(base, 0700);
    static char path[512];
    snprintf(path, sizeof(path), "%s/test_config.XXXXXX", base);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp %s", path);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static int load(cfg_t *c, char *err, size_t errlen, int argc, char **argv)
{
    memset(c, 0x5a, sizeof(*c));
    return ch_config_load(table, "coordinatord", c, argc, argv, err, errlen);
}

#define ARGV(...)         ((char *[]){"prog", __VA_ARGS__})
#define ARGC(...)         ((int)(sizeof(ARGV(__VA_ARGS__)) / sizeof(char *)))
#define LOAD(c, err, ...) load(c, err, sizeof(err), ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

Test(config, defaults_without_arguments, .init = clean_env)
{
    cfg_t c;
    char err[256];
    char *argv[] = {"prog"};
    cr_assert_eq(load(&c, err, sizeof(err), 1, argv), 0, "%s", err);
    cr_expect_str_eq(c.listen, "127.0.0.1:7070");
    cr_expect_eq(c.heartbeat_ms, 1000);
    cr_expect_eq(c.verbose, 0);
    cr_expect_str_eq(c.name, "");
    cr_expect_eq(c.dead_after_ms, 5000);
}

Test(config, flag_forms, .init = clean_env)
{
    cfg_t c;
    char err[256];
    int rc = LOAD(&c, err, "--listen", "0.0.0.0:9", "--heartbeat-ms=100", "--verbose",
                  "--name=", "--dead-after-ms", "-3");
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_str_eq(c.listen, "0.0.0.0:9");
    cr_expect_eq(c.heartbeat_ms, 100);
    cr_expect_eq(c.verbose, 1);
    cr_expect_str_eq(c.name, "");
    cr_expect_eq(c.dead_after_ms, -3);

    cr_assert_eq(LOAD(&c, err, "--verbose=off"), 0, "%s", err);
    cr_expect_eq(c.verbose, 0);
    cr_assert_eq(LOAD(&c, err, "--verbose", "--no-verbose"), 0, "%s", err);
    cr_expect_eq(c.verbose, 0);
    cr_assert_eq(LOAD(&c, err, "--heartbeat-ms=1", "--heartbeat-ms=2"), 0, "%s", err);
    cr_expect_eq(c.heartbeat_ms, 2, "the last flag wins");
}

Test(config, precedence_file_env_flag, .init = clean_env)
{
    char *path = write_file("# shared by both daemons\n"
                            "name = from-top-level\n"
                            "[coordinatord]\n"
                            "listen = 10.0.0.1:1\n"
                            "heartbeat-ms = 200\n"
                            "verbose = yes\n"
                            "[workerd]\n"
                            "slots = 8\n");
    cfg_t c;
    char err[256];
    cr_assert_eq(LOAD(&c, err, "--config", path), 0, "%s", err);
    cr_expect_str_eq(c.listen, "10.0.0.1:1");
    cr_expect_eq(c.heartbeat_ms, 200);
    cr_expect_eq(c.verbose, 1);
    cr_expect_str_eq(c.name, "from-top-level");
    cr_expect_eq(c.dead_after_ms, 5000, "untouched keys keep the default");

    setenv("CHORUS_HEARTBEAT_MS", "300", 1);
    setenv("CHORUS_LISTEN", "10.0.0.2:2", 1);
    setenv("CHORUS_DEAD_AFTER_MS", "777", 1);
    cr_assert_eq(LOAD(&c, err, "--listen=10.0.0.3:3", "--config", path), 0, "%s", err);
    cr_expect_str_eq(c.listen, "10.0.0.3:3", "flag beats environment");
    cr_expect_eq(c.heartbeat_ms, 300, "environment beats file");
    cr_expect_eq(c.dead_after_ms, 777, "dashes become underscores in the variable");

    setenv("CHORUS_CONFIG", path, 1);
    unsetenv("CHORUS_HEARTBEAT_MS");
    cr_assert_eq(LOAD(&c, err, "--name", "flagged"), 0, "%s", err);
    cr_expect_eq(c.heartbeat_ms, 200, "CHORUS_CONFIG names the file");
    cr_expect_str_eq(c.name, "flagged");
    unlink(path);
}

static void expect_error(cfg_t *c, int argc, char **argv, const char *needle)
{
    char err[512] = "";
    int rc = load(c, err, sizeof(err), argc, argv);
    cr_expect_eq(rc, CH_E_CONFIG, "rc %d for %s", rc, argv[1]);
    cr_expect(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
}

Test(config, bad_flags_name_the_option, .init = clean_env)
{
    cfg_t c;
    expect_error(&c, ARGC("--bogus", "1"), ARGV("--bogus", "1"), "--bogus");
    expect_error(&c, ARGC("--bogus=1"), ARGV("--bogus=1"), "--bogus");
    expect_error(&c, ARGC("--no-listen"), ARGV("--no-listen"), "--no-listen");
    expect_error(&c, ARGC("--heartbeat-ms", "fast"), ARGV("--heartbeat-ms", "fast"),
                 "--heartbeat-ms");
    expect_error(&c, ARGC("--heartbeat-ms=12x"), ARGV("--heartbeat-ms=12x"), "--heartbeat-ms");
    expect_error(&c, ARGC("--heartbeat-ms=99999999999999999999"),
                 ARGV("--heartbeat-ms=99999999999999999999"), "out of range");
    expect_error(&c, ARGC("--verbose=maybe"), ARGV("--verbose=maybe"), "--verbose");
    expect_error(&c, ARGC("--listen"), ARGV("--listen"), "--listen");
    expect_error(&c, ARGC("stray"), ARGV("stray"), "stray");
    expect_error(&c, ARGC("-x"), ARGV("-x"), "-x");
    char longv[400];
    memset(longv, 'a', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = '\0';
    expect_error(&c, ARGC("--name", longv), ARGV("--name", longv), "--name");
}

Test(config, bad_file_and_env_name_the_source, .init = clean_env)
{
    cfg_t c;
    char *path = write_file("[coordinatord]\nlisten = x\nlisen = y\n");
    expect_error(&c, ARGC("--config", path), ARGV("--config", path), "line 3: unknown key 'lisen'");
    unlink(path);

    path = write_file("heartbeat-ms = soon\n");
    expect_error(&c, ARGC("--config", path), ARGV("--config", path), "heartbeat-ms");
    unlink(path);

    path = write_file("[coordinatord]\nnot an assignment\n");
    expect_error(&c, ARGC("--config", path), ARGV("--config", path), "line 2");
    unlink(path);

    expect_error(&c, ARGC("--config", "/nonexistent/chorus.conf"),
                 ARGV("--config", "/nonexistent/chorus.conf"), "/nonexistent/chorus.conf");

    setenv("CHORUS_DEAD_AFTER_MS", "later", 1);
    expect_error(&c, ARGC("--verbose"), ARGV("--verbose"), "CHORUS_DEAD_AFTER_MS");
}

Test(config, help_returns_one, .init = clean_env)
{
    cfg_t c;
    char err[256];
    cr_expect_eq(LOAD(&c, err, "--help"), 1);
    cr_expect_eq(LOAD(&c, err, "--verbose", "-h"), 1);
    cr_expect_eq(LOAD(&c, err, "--listen", "x", "--help", "--config", "/nonexistent"), 1,
                 "help wins before the file is read");
}

/* A daemon asked its version answers it, however broken the rest of the line or its
 * config file: an install check runs `coordinatord --version` before any config exists. */
Test(config, version_returns_two_before_the_file_is_read, .init = clean_env)
{
    cfg_t c;
    char err[256];
    cr_expect_eq(LOAD(&c, err, "--version"), 2);
    cr_expect_eq(LOAD(&c, err, "--config", "/nonexistent", "-V"), 2);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ch_config_version(f, "workerd");
    fclose(f);
    cr_expect(strncmp(buf, "workerd (Chorus) ", 17) == 0 && strchr(buf, '.') != NULL, "%s", buf);
    free(buf);
}

Test(config, usage_lists_every_option_with_default_and_help)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    ch_config_usage(f, "coordinatord", table);
    fclose(f);
    cr_expect(strstr(buf, "coordinatord") != NULL);
    cr_expect(strstr(buf, "--config") != NULL);
    cr_expect(strstr(buf, "--help") != NULL);
    for (const ch_opt_t *o = table; o->name != NULL; o++) {
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", o->name);
        cr_expect(strstr(buf, flag) != NULL, "usage lacks %s:\n%s", flag, buf);
        cr_expect(strstr(buf, o->help) != NULL, "usage lacks help of %s", o->name);
        if (o->def != NULL)
            cr_expect(strstr(buf, o->def) != NULL, "usage lacks default of %s", o->name);
    }
    cr_expect(strstr(buf, "CHORUS_HEARTBEAT_MS") != NULL);
    free(buf);
}

Test(config, value_parsers)
{
    int b = -1;
    const char *yes[] = {"yes", "TRUE", "on", "1"}, *no[] = {"no", "False", "OFF", "0"};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(ch_config_parse_bool(yes[i], &b), 0);
        cr_expect_eq(b, 1);
        cr_expect_eq(ch_config_parse_bool(no[i], &b), 0);
        cr_expect_eq(b, 0);
    }
    cr_expect_eq(ch_config_parse_bool("", &b), -EINVAL);
    cr_expect_eq(ch_config_parse_bool("2", &b), -EINVAL);
    long long v = 0;
    cr_expect_eq(ch_config_parse_i64("-42", &v), 0);
    cr_expect_eq(v, -42);
    cr_expect_eq(ch_config_parse_i64("+7", &v), 0);
    cr_expect_eq(v, 7);
    cr_expect_eq(ch_config_parse_i64("9223372036854775807", &v), 0);
    cr_expect_eq(v, 9223372036854775807ll);
    cr_expect_eq(ch_config_parse_i64("9223372036854775808", &v), -ERANGE);
    cr_expect_eq(ch_config_parse_i64("", &v), -EINVAL);
    cr_expect_eq(ch_config_parse_i64("-", &v), -EINVAL);
    cr_expect_eq(ch_config_parse_i64(" 1", &v), -EINVAL);
    cr_expect_eq(ch_config_parse_i64("1 ", &v), -EINVAL);
    cr_expect_eq(ch_config_parse_i64("0x10", &v), -EINVAL);
    cr_expect_eq(ch_config_parse_i64("1e3", &v), -EINVAL);
}
