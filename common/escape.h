/* Escaping of strings that came from a peer (failure messages, names, reasons) before
 * they reach a terminal or a log: one function, so chorusctl's output and the daemons'
 * log lines make the same bytes visible in the same way (the status page escapes for
 * HTML on its own). */
#ifndef CH_ESCAPE_H
#define CH_ESCAPE_H

#include <stddef.h>

/* Copy len bytes of in to out (cap bytes, always NUL-terminated when cap > 0), making
 * visible everything a terminal could act on: C0 controls, DEL, the C1 controls
 * (U+0080..U+009F, e.g. the 8-bit CSI) and bytes that are not valid UTF-8 become \xNN,
 * and a backslash becomes \\ (so no peer can write a look-alike escape). Printable ASCII
 * and valid UTF-8 pass unchanged. Stops on a character boundary when out is full.
 * Returns the bytes written, not counting the NUL. */
size_t ch_escape_n(char *out, size_t cap, const char *in, size_t len);
/* ch_escape_n of a NUL-terminated string (NULL reads as ""); returns out, so a call can
 * stand where the string would: printf("%s", ch_escape(buf, sizeof buf, reason)). */
char *ch_escape(char *out, size_t cap, const char *in);

#endif
