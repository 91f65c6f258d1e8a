/* Strict INI reader. Each line, after trimming whitespace, is one of: empty, a full-line
 * comment ('#' or ';' first), "[section]", or "key = value". Anything else is an error that
 * names the line. There are no inline comments (a value may contain '#'), no quoting and no
 * continuation lines: what the line says after '=' (trimmed) is the value, possibly empty.
 * Keys before the first section header are reported with section "". */
#include "common/ini.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/* Trim s in place; returns the first non-space character. */
static char *trim(char *s)
{
    while (is_space(*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && is_space(s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Section and key names: letters, digits, '_', '-', '.'. */
static int is_name(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

static int parse_line(char *line, int lineno, char **section, ch_ini_cb cb, void *ud, char *err,
                      size_t errlen)
{
    char *s = trim(line);
    if (*s == '\0' || *s == '#' || *s == ';')
        return 0;
    if (*s == '[') {
        char *close = strchr(s, ']');
        if (close == NULL || close[1] != '\0') {
            snprintf(err, errlen, "line %d: bad section header '%s'", lineno, s);
            return CH_E_CONFIG;
        }
        *close = '\0';
        char *name = trim(s + 1);
        if (!is_name(name)) {
            snprintf(err, errlen, "line %d: bad section name '%s'", lineno, name);
            return CH_E_CONFIG;
        }
        *section = name;
        return 0;
    }
    char *eq = strchr(s, '=');
    if (eq == NULL) {
        snprintf(err, errlen, "line %d: expected '[section]' or 'key = value', got '%s'", lineno,
                 s);
        return CH_E_CONFIG;
    }
    *eq = '\0';
    char *key = trim(s);
    char *value = trim(eq + 1);
    if (!is_name(key)) {
        snprintf(err, errlen, "line %d: bad key '%s'", lineno, key);
        return CH_E_CONFIG;
    }
    if (errlen > 0)
        err[0] = '\0';
    int rc = cb(ud, *section, key, value, lineno, err, errlen);
    if (rc < 0 && errlen > 0 && err[0] == '\0')
        snprintf(err, errlen, "line %d: [%s] %s: %s", lineno, *section, key, ch_strerror(rc));
    return rc < 0 ? rc : 0;
}

int ch_ini_parse(const char *text, ch_ini_cb cb, void *ud, char *err, size_t errlen)
{
    if (errlen > 0)
        err[0] = '\0';
    /* One mutable copy: lines, sections, keys and values are NUL-terminated in place. */
    char *buf = strdup(text);
    if (buf == NULL)
        return -ENOMEM;
    char *section = "";
    int rc = 0;
    int lineno = 1;
    for (char *line = buf; line != NULL; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        rc = parse_line(line, lineno, &section, cb, ud, err, errlen);
        if (rc < 0)
            break;
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(buf);
    return rc;
}
