/* Aligned text tables for chorusctl's human output: cells are collected row by row,
 * then printed with each column as wide as its widest cell. */
#ifndef CTL_TABLE_H
#define CTL_TABLE_H

#include <stddef.h>
#include <stdio.h>

typedef struct ctl_table {
    size_t ncols;
    size_t ncells, cap;
    char **cells; /* row-major, ncols per row; owned */
} ctl_table_t;

void ctl_table_init(ctl_table_t *t, size_t ncols);
void ctl_table_fini(ctl_table_t *t);
/* Append one cell (printf-style); rows wrap every ncols cells. -ENOMEM on failure. */
int ctl_table_cell(ctl_table_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print: columns separated by two spaces, no trailing blanks. */
void ctl_table_print(const ctl_table_t *t, FILE *f);

#endif
