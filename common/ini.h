/* A strict INI reader: "[section]", "key = value", '#' or ';' comments, blank lines.
 * Used by daemon configs and job files. Errors name the line. */
#ifndef CH_INI_H
#define CH_INI_H

#include <stddef.h>

/* Called for each key; section is "" for keys before the first header. Return 0 to go
 * on or a negative code to stop (the parse then returns that code, with whatever the
 * callback wrote into err). */
typedef int (*ch_ini_cb)(void *ud, const char *section, const char *key, const char *value,
                         int line, char *err, size_t errlen);

int ch_ini_parse(const char *text, ch_ini_cb cb, void *ud, char *err, size_t errlen);

#endif
