/* Aligned text tables (see table.h). */
#include "table.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"

void ctl_table_init(ctl_table_t *t, size_t ncols)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols;
}

void ctl_table_fini(ctl_table_t *t)
{
    for (size_t i = 0; i < t->ncells; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}

int ctl_table_cell(ctl_table_t *t, const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;

    if (t->ncells == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 32;
        char **cells = realloc(t->cells, cap * sizeof *cells);
        if (!cells)
            return -ENOMEM;
        t->cells = cells;
        t->cap = cap;
    }
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -ENOMEM;
    /* Cells quote the coordinator (job names, reasons, node names): escaped, so no peer
     * writes terminal controls or a fake row. */
    size_t cap = 4 * (size_t)n + 1;
    char *esc = malloc(cap);
    if (!esc) {
        free(s);
        return -ENOMEM;
    }
    ch_escape_n(esc, cap, s, (size_t)n);
    free(s);
    t->cells[t->ncells++] = esc;
    return 0;
}

void ctl_table_print(const ctl_table_t *t, FILE *f)
{
    size_t *width = calloc(t->ncols ? t->ncols : 1, sizeof *width);
    size_t linecap = 1;
    if (!width)
        return;
    for (size_t i = 0; i < t->ncells; i++) {
        size_t w = strlen(t->cells[i]);
        if (w > width[i % t->ncols])
            width[i % t->ncols] = w;
    }
    for (size_t c = 0; c < t->ncols; c++)
        linecap += width[c] + 2;
    char *line = malloc(linecap);
    if (!line) {
        free(width);
        return;
    }
    for (size_t row = 0; row * t->ncols < t->ncells; row++) {
        size_t len = 0;
        for (size_t c = 0; c < t->ncols && row * t->ncols + c < t->ncells; c++) {
            const char *cell = t->cells[row * t->ncols + c];
            size_t n = strlen(cell);
            memcpy(line + len, cell, n);
            memset(line + len + n, ' ', width[c] - n + 2);
            len += width[c] + 2;
        }
        while (len > 0 && line[len - 1] == ' ') /* no trailing blanks */
            len--;
        fprintf(f, "%.*s\n", (int)len, line);
    }
    free(line);
    free(width);
}
