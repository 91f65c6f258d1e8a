/* Cluster key files, handshake proofs and per-frame tags (auth.h), all on libsodium:
 * HMAC-SHA256, and ChaCha20-Poly1305 for the tags of peers that offer it. Secrets are
 * compared with sodium_memcmp and wiped after use. */
#include "common/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"

#define LABEL_LEN 8 /* "chorus-s", "chorus-c", "chorus-k" */

int ch_auth_global_init(void)
{
    return sodium_init() < 0 ? -EIO : 0;
}

/* ---------------------------------------------------------------- key files */

static int parse_key(const uint8_t *buf, size_t n, ch_key_t *key)
{
    if (n == CH_KEY_LEN) {
        memcpy(key->bytes, buf, CH_KEY_LEN);
        return 0;
    }
    if (n == 2 * CH_KEY_LEN + 1 && buf[n - 1] == '\n')
        n--;
    if (n != 2 * CH_KEY_LEN)
        return CH_E_CONFIG;
    size_t bin_len = 0;
    const char *end = NULL;
    if (sodium_hex2bin(key->bytes, CH_KEY_LEN, (const char *)buf, n, NULL, &bin_len, &end) != 0 ||
        bin_len != CH_KEY_LEN || end != (const char *)buf + n) {
        sodium_memzero(key, sizeof *key);
        return CH_E_CONFIG;
    }
    return 0;
}

int ch_key_load(const char *path, ch_key_t *key)
{
    int rc = 0, fd = -1;
    uint8_t buf[2 * CH_KEY_LEN + 2]; /* one byte more than the longest valid file */
    size_t n = 0;
    struct stat st;

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = CH_E_CONFIG;
        goto out;
    }
    /* as ssh does with its keys: whoever owns the file could replace the cluster's key */
    if ((st.st_mode & 077) || (st.st_uid != geteuid() && st.st_uid != 0)) {
        rc = CH_E_KEYPERM;
        goto out;
    }
    rc = ch_read_full(fd, buf, sizeof buf, &n);
    if (rc < 0)
        goto out;
    rc = parse_key(buf, n, key);
out:
    sodium_memzero(buf, sizeof buf);
    if (fd >= 0)
        close(fd);
    return rc;
}

int ch_key_generate(const char *path)
{
    int rc = 0, fd = -1, created = 0;
    uint8_t raw[CH_KEY_LEN];
    char hex[2 * CH_KEY_LEN + 2];

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    created = 1;
    if (fchmod(fd, 0600) < 0) {
        rc = -errno;
        goto out;
    }
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(hex, sizeof hex - 1, raw, sizeof raw);
    hex[2 * CH_KEY_LEN] = '\n';
    rc = ch_write_full(fd, hex, 2 * CH_KEY_LEN + 1);
    if (rc < 0)
        goto out;
    if (fsync(fd) < 0) {
        rc = -errno;
        goto out;
    }
out:
    sodium_memzero(raw, sizeof raw);
    sodium_memzero(hex, sizeof hex);
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc < 0 && created)
        unlink(path);
    return rc;
}

/* ---------------------------------------------------------------- handshake */

void ch_auth_nonce(uint8_t nonce[CH_NONCE_LEN])
{
    randombytes_buf(nonce, CH_NONCE_LEN);
}

/* HMAC(key, label | nc | ns): proofs and the session key share this shape. */
static void hmac_nonces(const uint8_t *key, const char *label, const uint8_t *nc, const uint8_t *ns,
                        uint8_t out[crypto_auth_hmacsha256_BYTES])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, CH_KEY_LEN);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label));
    crypto_auth_hmacsha256_update(&st, nc, CH_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, ns, CH_NONCE_LEN);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

uint64_t ch_auth_mac64(const ch_key_t *key, const void *msg, size_t len)
{
    uint8_t mac[crypto_auth_hmacsha256_BYTES];
    uint64_t v = 0;
    crypto_auth_hmacsha256(mac, msg, len, key->bytes);
    memcpy(&v, mac, sizeof v);
    return v;
}

void ch_auth_proof(const ch_key_t *key, const char *label, const uint8_t nc[CH_NONCE_LEN],
                   const uint8_t ns[CH_NONCE_LEN], uint8_t out[CH_PROOF_LEN])
{
    hmac_nonces(key->bytes, label, nc, ns, out);
}

int ch_auth_check_proof(const ch_key_t *key, const char *label, const uint8_t nc[CH_NONCE_LEN],
                        const uint8_t ns[CH_NONCE_LEN], const uint8_t *proof, size_t len)
{
    uint8_t want[CH_PROOF_LEN];
    int rc = 0;
    if (!proof || len != CH_PROOF_LEN)
        return CH_E_AUTH;
    hmac_nonces(key->bytes, label, nc, ns, want);
    if (sodium_memcmp(want, proof, CH_PROOF_LEN) != 0)
        rc = CH_E_AUTH;
    sodium_memzero(want, sizeof want);
    return rc;
}

/* ---------------------------------------------------------------- sessions */

uint32_t ch_auth_macs_offered(void)
{
    static int offered = -1; /* read once: a process's links all offer the same */
    if (offered < 0) {
        const char *e = getenv("CHORUS_FRAME_MAC");
        offered = e && strcmp(e, "hmac-sha256") == 0 ? 0 : (int)(1u << CH_MAC_POLY1305);
    }
    return (uint32_t)offered;
}

int ch_auth_pick_mac(uint32_t offered)
{
    return offered & (1u << CH_MAC_POLY1305) ? CH_MAC_POLY1305 : CH_MAC_HMAC_SHA256;
}

int ch_auth_mac_acceptable(uint32_t mac)
{
    return mac == CH_MAC_HMAC_SHA256 || (mac < 32 && (ch_auth_macs_offered() >> mac & 1));
}

void ch_session_init_plain(ch_session_t *s, int is_server)
{
    memset(s, 0, sizeof *s);
    s->is_server = is_server ? 1 : 0;
}

void ch_session_init_keyed(ch_session_t *s, int is_server, const ch_key_t *key,
                           const uint8_t nc[CH_NONCE_LEN], const uint8_t ns[CH_NONCE_LEN], int mac)
{
    ch_session_init_plain(s, is_server);
    s->enabled = 1;
    s->mac = mac == CH_MAC_POLY1305 ? CH_MAC_POLY1305 : CH_MAC_HMAC_SHA256;
    _Static_assert(sizeof s->skey == crypto_aead_chacha20poly1305_ietf_KEYBYTES,
                   "the session key keys ChaCha20-Poly1305");
    hmac_nonces(key->bytes, s->mac == CH_MAC_POLY1305 ? "chorus-p" : "chorus-k", nc, ns, s->skey);
    if (s->mac != CH_MAC_HMAC_SHA256)
        return;
    _Static_assert(sizeof(crypto_auth_hmacsha256_state) <= sizeof s->hmac0,
                   "ch_session_t.hmac0 holds an HMAC-SHA256 state");
    crypto_auth_hmacsha256_init((crypto_auth_hmacsha256_state *)(void *)s->hmac0, s->skey,
                                sizeof s->skey);
}

/* The session's tag of payload (auth.h); zero when auth is off. */
static void tag_dir(const ch_session_t *s, char dir, uint64_t seq, const uint8_t *payload,
                    size_t len, uint8_t tag[16])
{
    if (!s->enabled) {
        memset(tag, 0, 16);
        return;
    }
    if (s->mac == CH_MAC_POLY1305) {
        _Static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == 16, "a 16-byte tag");
        uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES] = {(uint8_t)dir};
        for (int i = 0; i < 8; i++)
            nonce[4 + i] = (uint8_t)(seq >> (56 - 8 * i));
        unsigned char none[1]; /* the empty message's ciphertext: nothing is written */
        unsigned long long taglen = 0;
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(none, tag, &taglen, NULL, 0, payload,
                                                           len, NULL, nonce, s->skey);
        return;
    }
    uint8_t hdr[9], mac[crypto_auth_hmacsha256_BYTES];
    hdr[0] = (uint8_t)dir;
    for (int i = 0; i < 8; i++)
        hdr[1 + i] = (uint8_t)(seq >> (56 - 8 * i));
    crypto_auth_hmacsha256_state st;
    memcpy(&st, s->hmac0, sizeof st); /* init with skey, done once (ch_session_init_keyed) */
    crypto_auth_hmacsha256_update(&st, hdr, sizeof hdr);
    if (len)
        crypto_auth_hmacsha256_update(&st, payload, len);
    crypto_auth_hmacsha256_final(&st, mac);
    memcpy(tag, mac, 16);
    sodium_memzero(&st, sizeof st);
}

void ch_session_tag(const ch_session_t *s, uint64_t seq, const uint8_t *payload, size_t len,
                    uint8_t tag[16])
{
    tag_dir(s, s->is_server ? 'S' : 'C', seq, payload, len, tag);
}

int ch_session_accept(ch_session_t *s, uint64_t seq, const uint8_t *payload, size_t len,
                      const uint8_t tag[16])
{
    uint8_t want[16];
    /* A plain session demands zero tags too: a keyed peer on a plain link is refused
     * rather than silently trusted. */
    tag_dir(s, s->is_server ? 'C' : 'S', seq, payload, len, want);
    if (sodium_memcmp(want, tag, sizeof want) != 0)
        return CH_E_AUTH;
    if (seq <= s->recv_seq)
        return CH_E_REPLAY;
    s->recv_seq = seq;
    return 0;
}
