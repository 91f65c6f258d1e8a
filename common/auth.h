/* Authentication and per-frame integrity (DESIGN §3), on libsodium.
 *
 * Theory of operation. Both ends hold the same 32-byte cluster key.
 *   client -> server  AuthHello{nc}                      (untagged)
 *   server -> client  AuthChallenge{ns, HMAC(K, "chorus-s"|nc|ns)}   (untagged)
 *   client -> server  AuthProof{HMAC(K, "chorus-c"|nc|ns)}           (untagged)
 *   server -> client  AuthResult{ok}                     (first tagged frame)
 * Each side checks the other's proof in constant time, so neither can be fooled by a
 * peer without the key. From then on every frame carries a 16-byte tag over its payload,
 * keyed by a session key S derived from both nonces, and bound to dir = 'C' for
 * client-to-server or 'S' for the reverse and to the Envelope's seq, which must be greater
 * than the last one accepted from that peer, so a replayed or reordered frame is refused.
 * The tag is one of two, picked by the server from what AuthHello offers:
 *   CH_MAC_HMAC_SHA256: S = HMAC(K, "chorus-k"|nc|ns), tag = HMAC(S, dir|seq BE|payload);
 *     what every peer can make, and all an older peer offers.
 *   CH_MAC_POLY1305: S = HMAC(K, "chorus-p"|nc|ns), tag = the Poly1305 tag of libsodium's
 *     ChaCha20-Poly1305 (IETF) over an empty message with the payload as additional data,
 *     nonce = dir|0|0|0|seq BE: a third to a quarter of HMAC-SHA256's cost on a frame,
 *     which is what the coordinator spends most per message on. seq never repeats in a
 *     direction, so no nonce repeats under one S.
 * The pick is not in the server's proof, but S depends on it: a peer that changed it in
 * flight leaves the two ends with different keys, and the first tagged frame fails.
 * A session with auth disabled (Unix control socket checked by SO_PEERCRED; the
 * workerd<->rank socketpair) sends zero tags and still enforces increasing seq. */
#ifndef CH_AUTH_H
#define CH_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define CH_KEY_LEN   32
#define CH_NONCE_LEN 32
#define CH_PROOF_LEN 32

typedef struct ch_key {
    uint8_t bytes[CH_KEY_LEN];
} ch_key_t;

/* Must be called once per process before any other function here (sodium_init). */
int ch_auth_global_init(void);

/* Load a key file: exactly 32 raw bytes or 64 hex characters (+ optional newline).
 * CH_E_KEYPERM when the file is accessible by group or others (must be 0600 or 0400) or
 * owned by a user other than the effective one and root. */
int ch_key_load(const char *path, ch_key_t *key);
/* Create a new random key file with mode 0600. -EEXIST if the file exists. */
int ch_key_generate(const char *path);
/* The first 8 bytes of HMAC-SHA256(key, msg) as an integer: a tag that only holders of
 * key can make (launch tokens, coordinatord/launch.h). */
uint64_t ch_auth_mac64(const ch_key_t *key, const void *msg, size_t len);

/* Frame tags (AuthChallenge.mac; bit 1 << mac in AuthHello.macs). */
enum { CH_MAC_HMAC_SHA256 = 0, CH_MAC_POLY1305 = 1 };
/* AuthHello.macs of this build: ChaCha20-Poly1305, unless CHORUS_FRAME_MAC=hmac-sha256
 * in the environment (read once) asks for HMAC-SHA256 only. */
uint32_t ch_auth_macs_offered(void);
/* The server's pick from a client's AuthHello.macs. */
int ch_auth_pick_mac(uint32_t offered);
/* Whether a server's pick (AuthChallenge.mac) is one this client may use: HMAC-SHA256, or
 * a tag it offered. */
int ch_auth_mac_acceptable(uint32_t mac);

typedef struct ch_session {
    int enabled; /* 0: no key, tags are zero */
    int is_server;
    int mac;          /* CH_MAC_* */
    uint8_t skey[32]; /* session key */
    /* CH_MAC_HMAC_SHA256 only: the HMAC-SHA256 state keyed with skey
     * (crypto_auth_hmacsha256_state, opaque here): each frame's tag starts from a copy
     * instead of hashing the key's pads again */
    _Alignas(8) uint8_t hmac0[256];
    uint64_t send_seq; /* last seq sent */
    uint64_t recv_seq; /* last seq accepted */
} ch_session_t;

void ch_auth_nonce(uint8_t nonce[CH_NONCE_LEN]);
/* label is "chorus-s" (server proof) or "chorus-c" (client proof). */
void ch_auth_proof(const ch_key_t *key, const char *label, const uint8_t nc[CH_NONCE_LEN],
                   const uint8_t ns[CH_NONCE_LEN], uint8_t out[CH_PROOF_LEN]);
/* Constant-time check of a received proof; CH_E_AUTH on mismatch or wrong length. */
int ch_auth_check_proof(const ch_key_t *key, const char *label, const uint8_t nc[CH_NONCE_LEN],
                        const uint8_t ns[CH_NONCE_LEN], const uint8_t *proof, size_t len);

/* Session without auth (tags zero). */
void ch_session_init_plain(ch_session_t *s, int is_server);
/* Session keyed from the handshake nonces, tagging frames with mac (CH_MAC_*). */
void ch_session_init_keyed(ch_session_t *s, int is_server, const ch_key_t *key,
                           const uint8_t nc[CH_NONCE_LEN], const uint8_t ns[CH_NONCE_LEN], int mac);
/* Tag for an outgoing payload carrying sequence number seq. */
void ch_session_tag(const ch_session_t *s, uint64_t seq, const uint8_t *payload, size_t len,
                    uint8_t tag[16]);
/* Verify an incoming payload whose Envelope carried seq: CH_E_AUTH for a bad tag,
 * CH_E_REPLAY when seq <= the last accepted one. Accepts and records seq on success. */
int ch_session_accept(ch_session_t *s, uint64_t seq, const uint8_t *payload, size_t len,
                      const uint8_t tag[16]);

#endif
