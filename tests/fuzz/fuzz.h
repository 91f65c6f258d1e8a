/* Shared by the fuzz targets (tests/fuzz/fuzz_<parser>.c), the smoke driver and the seed
 * maker: the libFuzzer entry point, an assertion that aborts, scratch files for parsers
 * that read from a path, and the fixed key that keyed-session seeds are tagged with.
 *
 * A target returns 0 for every input. Bad input must come back as an error code from the
 * parser; a broken invariant (a roundtrip that does not hold, an output that contradicts
 * the input) calls FUZZ_ASSERT, which prints where and aborts, so both libFuzzer and the
 * smoke driver report it as a crash with the input that caused it. */
#ifndef CH_FUZZ_H
#define CH_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.pb-c.h"
#include "common/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((noreturn)) void fuzz_fail(const char *file, int line, const char *what);
#define FUZZ_ASSERT(cond) ((cond) ? (void)0 : fuzz_fail(__FILE__, __LINE__, #cond))

/* data[0..size) as a NUL-terminated string (cut at the first NUL byte); caller frees. */
char *fuzz_cstr(const uint8_t *data, size_t size);

/* out = name in this process's scratch directory (made on first use under
 * $CHORUS_FUZZ_TMP, /dev/shm, $TMPDIR or /tmp; emptied and removed at exit). */
void fuzz_tmp_path(char *out, size_t outlen, const char *name);
/* Replace path's contents with data. Aborts on I/O failure (the harness, not the parser). */
void fuzz_write_file(const char *path, const void *data, size_t len);

/* Both ends of a keyed session made from a fixed key and fixed nonces, as after a
 * handshake: client->server frames tagged by *client are accepted by *server. */
void fuzz_keyed_pair(ch_session_t *client, ch_session_t *server);

/* Message-sequence inputs (fuzz_coord.c, fuzz_agent.c): records of
 * [op: 1 byte][len: 2 bytes, little-endian][a protobuf Envelope of len bytes]; a record
 * cut short ends the input. fuzz_next_msg returns 1 with *op and *env (NULL when the bytes
 * do not decode; else free with chorus__envelope__free_unpacked) and advances, 0 at the
 * end. fuzz_put_msg appends one record (seed makers). */
int fuzz_next_msg(const uint8_t **data, size_t *size, uint8_t *op, Chorus__Envelope **env);
void fuzz_put_msg(uint8_t *buf, size_t cap, size_t *len, uint8_t op, const Chorus__Envelope *env);

#endif
