/* Handshake proofs, frame tags, replay refusal, key files and keygen. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/msg.h"
#include "support.h"

static char tmpdir[512];

static void setup(void)
{
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(ts_tmpdir("test_auth", tmpdir, sizeof tmpdir), 0);
}

static void teardown(void)
{
    cr_assert_eq(ts_rmrf(tmpdir), 0);
}

TestSuite(auth, .init = setup, .fini = teardown);

static void write_file(const char *path, const void *data, size_t n, int mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    cr_assert_eq(fchmod(fd, (mode_t)mode), 0);
    close(fd);
}

static void fill_key(ch_key_t *k, uint8_t base)
{
    for (int i = 0; i < CH_KEY_LEN; i++)
        k->bytes[i] = (uint8_t)(base + i);
}

Test(auth, proofs_verify_and_wrong_key_fails)
{
    ch_key_t k, bad;
    fill_key(&k, 1);
    fill_key(&bad, 2);
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN], p[CH_PROOF_LEN], pbad[CH_PROOF_LEN];
    ch_auth_nonce(nc);
    ch_auth_nonce(ns);
    cr_assert(memcmp(nc, ns, CH_NONCE_LEN) != 0);

    ch_auth_proof(&k, "chorus-s", nc, ns, p);
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-s", nc, ns, p, sizeof p), 0);
    /* Wrong label (a server proof replayed as a client proof), truncated proof. */
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-c", nc, ns, p, sizeof p), CH_E_AUTH);
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-s", nc, ns, p, sizeof p - 1), CH_E_AUTH);
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-s", nc, ns, NULL, 0), CH_E_AUTH);
    /* Swapped nonces. */
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-s", ns, nc, p, sizeof p), CH_E_AUTH);

    ch_auth_proof(&bad, "chorus-s", nc, ns, pbad);
    cr_assert_eq(ch_auth_check_proof(&k, "chorus-s", nc, ns, pbad, sizeof pbad), CH_E_AUTH);
}

static void keyed_pair(ch_session_t *cli, ch_session_t *srv, const ch_key_t *kc, const ch_key_t *ks,
                       int mac)
{
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN];
    ch_auth_nonce(nc);
    ch_auth_nonce(ns);
    ch_session_init_keyed(cli, 0, kc, nc, ns, mac);
    ch_session_init_keyed(srv, 1, ks, nc, ns, mac);
}

static void tags_verify_both_directions_with(int mac)
{
    ch_key_t k;
    fill_key(&k, 7);
    ch_session_t c, s;
    keyed_pair(&c, &s, &k, &k, mac);
    cr_assert(memcmp(c.skey, s.skey, sizeof c.skey) == 0);
    const uint8_t msg[] = "payload bytes";
    uint8_t tag[16];
    ch_session_tag(&c, 1, msg, sizeof msg, tag);
    cr_assert_eq(ch_session_accept(&s, 1, msg, sizeof msg, tag), 0);
    ch_session_tag(&s, 1, msg, sizeof msg, tag);
    cr_assert_eq(ch_session_accept(&c, 1, msg, sizeof msg, tag), 0);
    /* A frame reflected back to its sender fails: direction is in the tag. */
    ch_session_tag(&c, 2, msg, sizeof msg, tag);
    cr_assert_eq(ch_session_accept(&c, 2, msg, sizeof msg, tag), CH_E_AUTH);
    /* Empty payload is taggable. */
    ch_session_tag(&c, 5, NULL, 0, tag);
    cr_assert_eq(ch_session_accept(&s, 5, NULL, 0, tag), 0);
}

Test(auth, tags_verify_both_directions)
{
    tags_verify_both_directions_with(CH_MAC_HMAC_SHA256);
    tags_verify_both_directions_with(CH_MAC_POLY1305);
}

static void tampered_payload_seq_or_key_fails_with(int mac)
{
    ch_key_t k, other;
    fill_key(&k, 7);
    fill_key(&other, 9);
    ch_session_t c, s;
    keyed_pair(&c, &s, &k, &k, mac);
    uint8_t msg[32];
    memset(msg, 'x', sizeof msg);
    uint8_t tag[16];
    ch_session_tag(&c, 3, msg, sizeof msg, tag);
    msg[10] ^= 1;
    cr_assert_eq(ch_session_accept(&s, 3, msg, sizeof msg, tag), CH_E_AUTH);
    msg[10] ^= 1;
    cr_assert_eq(ch_session_accept(&s, 4, msg, sizeof msg, tag), CH_E_AUTH);
    tag[0] ^= 0x80;
    cr_assert_eq(ch_session_accept(&s, 3, msg, sizeof msg, tag), CH_E_AUTH);
    tag[0] ^= 0x80;
    cr_assert_eq(s.recv_seq, 0, "failed checks must not advance seq");
    cr_assert_eq(ch_session_accept(&s, 3, msg, sizeof msg, tag), 0);

    ch_session_t c2, s2;
    keyed_pair(&c2, &s2, &k, &other, mac);
    ch_session_tag(&c2, 1, msg, sizeof msg, tag);
    cr_assert_eq(ch_session_accept(&s2, 1, msg, sizeof msg, tag), CH_E_AUTH);
}

Test(auth, tampered_payload_seq_or_key_fails)
{
    tampered_payload_seq_or_key_fails_with(CH_MAC_HMAC_SHA256);
    tampered_payload_seq_or_key_fails_with(CH_MAC_POLY1305);
}

static void replayed_and_old_seq_refused_with(int mac)
{
    ch_key_t k;
    fill_key(&k, 3);
    ch_session_t c, s;
    keyed_pair(&c, &s, &k, &k, mac);
    const uint8_t msg[] = "m";
    uint8_t t5[16], t3[16];
    ch_session_tag(&c, 5, msg, sizeof msg, t5);
    ch_session_tag(&c, 3, msg, sizeof msg, t3);
    cr_assert_eq(ch_session_accept(&s, 5, msg, sizeof msg, t5), 0);
    cr_assert_eq(ch_session_accept(&s, 5, msg, sizeof msg, t5), CH_E_REPLAY);
    cr_assert_eq(ch_session_accept(&s, 3, msg, sizeof msg, t3), CH_E_REPLAY);
    cr_assert_eq(s.recv_seq, 5);
}

Test(auth, replayed_and_old_seq_refused)
{
    replayed_and_old_seq_refused_with(CH_MAC_HMAC_SHA256);
    replayed_and_old_seq_refused_with(CH_MAC_POLY1305);
}

/* The two frame tags of one handshake: different session keys and different tags, so
 * neither end accepts a frame tagged as the other kind; the server picks
 * ChaCha20-Poly1305 only when it is offered. */
Test(auth, the_two_tags_do_not_mix)
{
    ch_key_t k;
    fill_key(&k, 5);
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN];
    ch_auth_nonce(nc);
    ch_auth_nonce(ns);
    ch_session_t ch, sh, cp, sp;
    ch_session_init_keyed(&ch, 0, &k, nc, ns, CH_MAC_HMAC_SHA256);
    ch_session_init_keyed(&sh, 1, &k, nc, ns, CH_MAC_HMAC_SHA256);
    ch_session_init_keyed(&cp, 0, &k, nc, ns, CH_MAC_POLY1305);
    ch_session_init_keyed(&sp, 1, &k, nc, ns, CH_MAC_POLY1305);
    cr_assert(memcmp(ch.skey, cp.skey, sizeof ch.skey) != 0, "one session key for both tags");
    const uint8_t msg[] = "a frame's payload";
    uint8_t th[16], tp[16];
    ch_session_tag(&ch, 1, msg, sizeof msg, th);
    ch_session_tag(&cp, 1, msg, sizeof msg, tp);
    cr_assert(memcmp(th, tp, sizeof th) != 0);
    cr_assert_eq(ch_session_accept(&sp, 1, msg, sizeof msg, th), CH_E_AUTH);
    cr_assert_eq(ch_session_accept(&sh, 1, msg, sizeof msg, tp), CH_E_AUTH);
    cr_assert_eq(ch_session_accept(&sp, 1, msg, sizeof msg, tp), 0);
    cr_assert_eq(ch_session_accept(&sh, 1, msg, sizeof msg, th), 0);
    /* A Poly1305 tag depends on every payload byte, the seq and the direction. */
    uint8_t big[4096], t1[16], t2[16];
    memset(big, 0x33, sizeof big);
    ch_session_tag(&cp, 9, big, sizeof big, t1);
    big[sizeof big - 1] ^= 1;
    ch_session_tag(&cp, 9, big, sizeof big, t2);
    cr_assert(memcmp(t1, t2, sizeof t1) != 0, "the last byte is not covered");
    ch_session_tag(&cp, 10, big, sizeof big, t1);
    cr_assert(memcmp(t1, t2, sizeof t1) != 0, "the seq is not covered");
    ch_session_tag(&sp, 9, big, sizeof big, t1);
    cr_assert(memcmp(t1, t2, sizeof t1) != 0, "the direction is not covered");

    cr_assert_eq(ch_auth_pick_mac(0), CH_MAC_HMAC_SHA256);
    cr_assert_eq(ch_auth_pick_mac(1u << CH_MAC_POLY1305), CH_MAC_POLY1305);
    cr_assert_eq(ch_auth_pick_mac(1u << 7), CH_MAC_HMAC_SHA256, "an unknown tag is not picked");
    /* A client takes HMAC-SHA256 or what it offered, never a tag it does not know. */
    cr_assert(ch_auth_mac_acceptable(CH_MAC_HMAC_SHA256));
    cr_assert(ch_auth_mac_acceptable(CH_MAC_POLY1305));
    cr_assert_not(ch_auth_mac_acceptable(7));
    cr_assert_not(ch_auth_mac_acceptable(32));
    cr_assert_not(ch_auth_mac_acceptable(0xffffffffu));
}

Test(auth, plain_session_zero_tags_and_increasing_seq)
{
    ch_session_t c, s;
    ch_session_init_plain(&c, 0);
    ch_session_init_plain(&s, 1);
    const uint8_t msg[] = "plain";
    uint8_t tag[16];
    ch_session_tag(&c, 1, msg, sizeof msg, tag);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(tag[i], 0);
    cr_assert_eq(ch_session_accept(&s, 1, msg, sizeof msg, tag), 0);
    cr_assert_eq(ch_session_accept(&s, 1, msg, sizeof msg, tag), CH_E_REPLAY);
    tag[3] = 1;
    cr_assert_eq(ch_session_accept(&s, 2, msg, sizeof msg, tag), CH_E_AUTH);
}

static void msg_roundtrip_and_replay_through_envelopes_with(int mac)
{
    ch_key_t k;
    fill_key(&k, 11);
    ch_session_t c, s;
    keyed_pair(&c, &s, &k, &k, mac);
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    hb.time_ms = 1234;
    hb.free_slots = 3;
    env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    env.request_id = 77;

    uint8_t *f1 = NULL, *f2 = NULL;
    size_t n1 = 0, n2 = 0;
    cr_assert_eq(ch_msg_encode(&c, &env, &f1, &n1), 0);
    cr_assert_eq(env.seq, 1);
    cr_assert_eq(ch_msg_encode(&c, &env, &f2, &n2), 0);
    cr_assert_eq(env.seq, 2);
    const uint8_t *payload = f1 + CH_FRAME_HDR;
    size_t plen = n1 - CH_FRAME_HDR - CH_FRAME_TAG;

    Chorus__Envelope *out = NULL;
    cr_assert_eq(ch_msg_decode(&s, payload, plen, payload + plen, &out), 0);
    cr_assert_eq(out->body_case, CHORUS__ENVELOPE__BODY_HEARTBEAT);
    cr_assert_eq(out->heartbeat->time_ms, 1234);
    cr_assert_eq(out->request_id, 77);
    cr_assert_str_eq(ch_msg_name(out), "heartbeat");
    ch_msg_free(out);
    /* Same frame again: replay. */
    cr_assert_eq(ch_msg_decode(&s, payload, plen, payload + plen, &out), CH_E_REPLAY);
    cr_assert_null(out);
    /* Next frame fine; garbage payload is CH_E_FRAME. */
    size_t plen2 = n2 - CH_FRAME_HDR - CH_FRAME_TAG;
    cr_assert_eq(ch_msg_decode(&s, f2 + CH_FRAME_HDR, plen2, f2 + CH_FRAME_HDR + plen2, &out), 0);
    ch_msg_free(out);
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff};
    uint8_t zt[16] = {0};
    cr_assert_eq(ch_msg_decode(&s, junk, sizeof junk, zt, &out), CH_E_FRAME);
    free(f1);
    free(f2);
}

Test(auth, msg_roundtrip_and_replay_through_envelopes)
{
    msg_roundtrip_and_replay_through_envelopes_with(CH_MAC_HMAC_SHA256);
    msg_roundtrip_and_replay_through_envelopes_with(CH_MAC_POLY1305);
}

Test(auth, key_file_hex_and_raw_ok_with_0600_or_0400)
{
    char path[600];
    ch_key_t k;
    snprintf(path, sizeof path, "%s/hex.key", tmpdir);
    const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
    write_file(path, hex, strlen(hex), 0600);
    cr_assert_eq(ch_key_load(path, &k), 0);
    for (int i = 0; i < CH_KEY_LEN; i++)
        cr_assert_eq(k.bytes[i], i);

    snprintf(path, sizeof path, "%s/hex-nonl.key", tmpdir);
    write_file(path, hex, 64, 0400);
    cr_assert_eq(ch_key_load(path, &k), 0);
    cr_assert_eq(k.bytes[31], 31);

    uint8_t raw[CH_KEY_LEN];
    for (int i = 0; i < CH_KEY_LEN; i++)
        raw[i] = (uint8_t)(0xF0 ^ i);
    snprintf(path, sizeof path, "%s/raw.key", tmpdir);
    write_file(path, raw, sizeof raw, 0600);
    cr_assert_eq(ch_key_load(path, &k), 0);
    cr_assert(memcmp(k.bytes, raw, sizeof raw) == 0);
}

Test(auth, key_file_loose_perms_refused)
{
    char path[600];
    ch_key_t k;
    const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
    snprintf(path, sizeof path, "%s/loose.key", tmpdir);
    write_file(path, hex, strlen(hex), 0644);
    cr_assert_eq(ch_key_load(path, &k), CH_E_KEYPERM);
    cr_assert_eq(chmod(path, 0640), 0);
    cr_assert_eq(ch_key_load(path, &k), CH_E_KEYPERM);
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(ch_key_load(path, &k), 0);

    snprintf(path, sizeof path, "%s/missing.key", tmpdir);
    cr_assert_eq(ch_key_load(path, &k), -ENOENT);
}

/* A key file owned by another user (who could replace the cluster's key) is refused, even
 * at 0600; one owned by root or by the process's user is taken. Needs root to chown. */
Test(auth, key_file_of_another_owner_refused)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to give the file another owner");
    char path[600];
    ch_key_t k;
    const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
    snprintf(path, sizeof path, "%s/theirs.key", tmpdir);
    write_file(path, hex, strlen(hex), 0600);
    cr_assert_eq(ch_key_load(path, &k), 0, "root's own key");
    cr_assert_eq(chown(path, 65534, 65534), 0);
    cr_assert_eq(ch_key_load(path, &k), CH_E_KEYPERM, "a key owned by nobody, loaded by root");
    cr_assert_str_eq(ch_strerror(CH_E_KEYPERM),
                     "key file is accessible by group or others (must be 0600 or 0400), or owned "
                     "by another user than this process's or root");
}

Test(auth, key_file_bad_content_refused)
{
    char path[600];
    ch_key_t k;
    static const char *bad[] = {
        "",
        "short\n",
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1\n",    /* 63 hex */
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fzz",   /* 66 */
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1g\n",   /* not hex */
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n\n", /* extra line */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.key", tmpdir, i);
        write_file(path, bad[i], strlen(bad[i]), 0600);
        cr_assert_eq(ch_key_load(path, &k), CH_E_CONFIG, "content %zu accepted", i);
    }
    /* A directory is not a key file. */
    cr_assert_neq(ch_key_load(tmpdir, &k), 0);
}

Test(auth, keygen_creates_0600_and_refuses_overwrite)
{
    char path[600];
    snprintf(path, sizeof path, "%s/new.key", tmpdir);
    cr_assert_eq(ch_key_generate(path), 0);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_eq(st.st_size, 65);
    ch_key_t k1, k2;
    cr_assert_eq(ch_key_load(path, &k1), 0);
    cr_assert_eq(ch_key_generate(path), -EEXIST);
    cr_assert_eq(ch_key_load(path, &k2), 0);
    cr_assert(memcmp(k1.bytes, k2.bytes, CH_KEY_LEN) == 0, "existing key was overwritten");

    char path2[600];
    snprintf(path2, sizeof path2, "%s/new2.key", tmpdir);
    cr_assert_eq(ch_key_generate(path2), 0);
    cr_assert_eq(ch_key_load(path2, &k2), 0);
    cr_assert(memcmp(k1.bytes, k2.bytes, CH_KEY_LEN) != 0, "two keys are equal");
}

Test(auth, strerror_names_codes)
{
    cr_assert_str_eq(ch_strerror(0), "success");
    cr_assert_str_eq(ch_strerror(CH_E_AUTH), "authentication failed");
    cr_assert_str_neq(ch_strerror(CH_E_KEYPERM), "unknown error");
    cr_assert_str_neq(ch_strerror(-ENOENT), "unknown error");
    cr_assert_str_eq(ch_strerror(-12345678), "unknown error");
    cr_assert_eq(ch_err_from_uv(-4095 /* UV_EOF */), -EPIPE);
    cr_assert_eq(ch_err_from_uv(-ECONNREFUSED), -ECONNREFUSED);
}
