/* Helpers shared by the unit tests: scratch directories under $CHORUS_TEST_TMP. */
#ifndef TS_SUPPORT_H
#define TS_SUPPORT_H

#include <stddef.h>

/* Make a fresh directory $CHORUS_TEST_TMP/<tag>.XXXXXX (base /tmp when the variable is unset
 * or empty; the base is created with mode 0755 if missing) and write its path to out (n
 * bytes). 0 or a negative errno. The caller removes it with ts_rmrf. */
int ts_tmpdir(const char *tag, char *out, size_t n);

/* rm -rf dir: remove the tree, not following symlinks or crossing mounts. 0 (also when dir
 * is already gone) or the negative errno of the first failure. */
int ts_rmrf(const char *dir);

#endif
