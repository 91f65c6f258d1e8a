/* Fuzz target: the INI reader (common/ini.h).
 *
 * Every key the reader reports must be well formed (section "" or a name, key a name,
 * value trimmed and single-line, line numbers increasing). Written back as canonical
 * "[section]" / "key = value" lines, the keys must read back identically. A callback
 * that refuses the key "stop" checks that its code stops the parse and that the reader
 * fills in a message when the callback left none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/ini.h"
#include "fuzz.h"

typedef struct entry {
    char *section, *key, *value;
} entry_t;

typedef struct rec {
    entry_t *e;
    size_t n, cap;
    int last_line;
    int stop_line; /* line of a "stop" key, 0 if none */
} rec_t;

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static int is_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return 0;
    return 1;
}

static int on_key(void *ud, const char *section, const char *key, const char *value, int line,
                  char *err, size_t errlen)
{
    rec_t *r = ud;
    FUZZ_ASSERT(section[0] == '\0' || is_name(section));
    FUZZ_ASSERT(is_name(key));
    size_t vl = strlen(value);
    FUZZ_ASSERT(vl == 0 || (!is_space(value[0]) && !is_space(value[vl - 1])));
    FUZZ_ASSERT(strchr(value, '\n') == NULL);
    FUZZ_ASSERT(line > r->last_line);
    FUZZ_ASSERT(errlen > 0 && err[0] == '\0');
    r->last_line = line;
    if (strcmp(key, "stop") == 0) {
        r->stop_line = line;
        return CH_E_CONFIG; /* no message of its own: the reader must write one */
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 16;
        r->e = realloc(r->e, r->cap * sizeof *r->e);
        FUZZ_ASSERT(r->e != NULL);
    }
    entry_t *e = &r->e[r->n++];
    e->section = strdup(section);
    e->key = strdup(key);
    e->value = strdup(value);
    FUZZ_ASSERT(e->section && e->key && e->value);
    return 0;
}

static void rec_free(rec_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->e[i].section);
        free(r->e[i].key);
        free(r->e[i].value);
    }
    free(r->e);
}

/* Canonical text for the recorded keys; caller frees. */
static char *render(const rec_t *r)
{
    size_t len = 1;
    for (size_t i = 0; i < r->n; i++)
        len += strlen(r->e[i].section) + strlen(r->e[i].key) + strlen(r->e[i].value) + 8;
    char *out = malloc(len), *p = out;
    FUZZ_ASSERT(out != NULL);
    const char *section = "";
    for (size_t i = 0; i < r->n; i++) {
        const entry_t *e = &r->e[i];
        if (strcmp(e->section, section) != 0) {
            p += sprintf(p, "[%s]\n", e->section);
            section = e->section;
        }
        p += sprintf(p, "%s = %s\n", e->key, e->value);
    }
    *p = '\0';
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    char err[256];
    rec_t r = {0}, r2 = {0};
    int rc = ch_ini_parse(text, on_key, &r, err, sizeof err);
    FUZZ_ASSERT(memchr(err, '\0', sizeof err) != NULL);
    FUZZ_ASSERT(rc == 0 || rc == CH_E_CONFIG || rc == -ENOMEM);
    if (rc == 0)
        FUZZ_ASSERT(err[0] == '\0' && r.stop_line == 0);
    else
        FUZZ_ASSERT(err[0] != '\0');
    if (r.stop_line)
        FUZZ_ASSERT(rc == CH_E_CONFIG && r.last_line == r.stop_line);

    /* Whatever was read before any error reads back the same from canonical text. */
    char *canon = render(&r);
    FUZZ_ASSERT(ch_ini_parse(canon, on_key, &r2, err, sizeof err) == 0);
    FUZZ_ASSERT(r2.n == r.n);
    for (size_t i = 0; i < r.n; i++) {
        FUZZ_ASSERT(strcmp(r.e[i].section, r2.e[i].section) == 0);
        FUZZ_ASSERT(strcmp(r.e[i].key, r2.e[i].key) == 0);
        FUZZ_ASSERT(strcmp(r.e[i].value, r2.e[i].value) == 0);
    }
    free(canon);
    rec_free(&r);
    rec_free(&r2);
    free(text);
    return 0;
}
