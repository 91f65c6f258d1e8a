/* train.skip_steps: the data batches a run no longer reads (fault.nonfinite = rewind).
 *
 * The list is text, "B1,B2,..." of batch numbers (0-based, each the batch a step would
 * have read in a run without the list), strictly ascending. Step s reads the s-th batch
 * not on the list, so a rewound run replays the steps before a skipped batch on the very
 * same data and every later step one batch further on. The coordinator appends the batch
 * of a step whose loss was not finite; the ranks map steps to batches with it. */
#ifndef CH_SKIPSTEPS_H
#define CH_SKIPSTEPS_H

#include <stddef.h>
#include <stdint.h>

/* The most batches a list may name (a run that needs more is diverging, not unlucky). */
#define CH_SKIP_MAX 32

/* Check a list: 0, or CH_E_CONFIG with why ("" is the empty list). */
int ch_skip_check(const char *list, char *why, size_t whylen);
/* The batch step reads under list (a list that does not check counts as empty). */
uint64_t ch_skip_batch_of(const char *list, uint64_t step);
/* Add batch to list (capacity len, kept ascending; already there: unchanged). 0, or
 * CH_E_CONFIG when the list is full or would not fit len. */
int ch_skip_add(char *list, size_t len, uint64_t batch);

#endif
