/* What each job-file key means, for ch_jobspec_template (jobspec.c's table has the types,
 * ranges and defaults; this one the words). Internal to common/. */
#ifndef CH_JOBSPEC_DOC_H
#define CH_JOBSPEC_DOC_H

typedef struct ch_jobspec_doc {
    const char *section, *key;
    const char *unit;  /* "sequences", "steps", "" */
    const char *range; /* NULL: from the parser's integer range */
    const char *meaning;
} ch_jobspec_doc_t;

/* NULL when the key has no entry (a test requires one for every key). */
const ch_jobspec_doc_t *ch_jobspec_doc(const char *section, const char *key);

#endif
