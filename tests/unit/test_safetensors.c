/* common/safetensors: round trip, format details, hostile files, checksum. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "support.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("st", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

/* Write a file made of a raw header (as given) and data bytes. */
static void write_raw(const char *path, const char *hdr, size_t datalen)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint64_t n = strlen(hdr);
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, n, f);
    for (size_t i = 0; i < datalen; i++)
        fputc((int)(i & 0xff), f);
    fclose(f);
}

static int open_raw(const char *hdr, size_t datalen, char *err, size_t errlen)
{
    char path[600];
    snprintf(path, sizeof path, "%s/raw.safetensors", dir);
    write_raw(path, hdr, datalen);
    ch_st_file_t *f = NULL;
    int rc = ch_st_open(path, &f, err, errlen);
    ch_st_close(f);
    return rc;
}

Test(safetensors, round_trip_with_metadata_and_alignment)
{
    char path[600];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float w[6] = {1, -2, 3.5f, 4, 5, 6e-9f}, b[3] = {0.25f, -0.5f, 7};
    uint16_t odd[3] = {1, 2, 3}; /* 6 bytes: the F32 after it lands unaligned */
    float after[2] = {42, 43};
    ch_st_writer_t *wr = NULL;
    cr_assert_eq(ch_st_writer_create(path, &wr), 0);
    uint64_t s23[2] = {2, 3}, s3[1] = {3}, s2[1] = {2};
    cr_assert_eq(ch_st_writer_add(wr, "h.0.w", CH_ST_F32, 2, s23, w), 0);
    cr_assert_eq(ch_st_writer_add(wr, "h.0.b", CH_ST_F32, 1, s3, b), 0);
    cr_assert_eq(ch_st_writer_add(wr, "odd", CH_ST_U16, 1, s3, odd), 0);
    cr_assert_eq(ch_st_writer_add(wr, "after", CH_ST_F32, 1, s2, after), 0);
    cr_expect_eq(ch_st_writer_add(wr, "odd", CH_ST_U16, 1, s3, odd), -EEXIST);
    cr_assert_eq(ch_st_writer_meta(wr, "format", "pt"), 0);
    cr_assert_eq(ch_st_writer_meta(wr, "quote", "a\"b\\c"), 0);
    uint64_t bytes = 0, sum = 0;
    char err[256];
    cr_assert_eq(ch_st_writer_finish(wr, &bytes, &sum, err, sizeof err), 0, "%s", err);

    /* the header length makes the data 8-byte aligned, and the checksum is the file's */
    FILE *fp = fopen(path, "rb");
    uint64_t hlen;
    cr_assert_eq(fread(&hlen, 8, 1, fp), 1);
    fclose(fp);
    cr_expect_eq((8 + hlen) % 8, 0);
    uint64_t fsum = 0, fbytes = 0;
    cr_assert_eq(ch_hash64_file(path, &fsum, &fbytes), 0);
    cr_expect_eq(fsum, sum);
    cr_expect_eq(fbytes, bytes);
    cr_expect_eq(bytes, 8 + hlen + sizeof w + sizeof b + sizeof odd + sizeof after);

    ch_st_file_t *f = NULL;
    cr_assert_eq(ch_st_open(path, &f, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_st_count(f), 4);
    const ch_st_tensor_t *t = ch_st_find(f, "h.0.w");
    cr_assert_not_null(t);
    cr_expect_eq(t->ndim, 2);
    cr_expect_eq(t->shape[0], 2);
    cr_expect_eq(t->shape[1], 3);
    float got[6];
    cr_assert_eq(ch_st_read_f32(f, t, got, err, sizeof err), 0);
    cr_expect_eq(memcmp(got, w, sizeof w), 0);
    t = ch_st_find(f, "after");
    cr_assert_eq(ch_st_read_f32(f, t, got, err, sizeof err), 0);
    cr_expect_eq(got[0], 42.0f);
    cr_expect_eq(got[1], 43.0f);
    t = ch_st_find(f, "odd");
    cr_expect_eq(ch_st_read_f32(f, t, got, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "odd") != NULL);
    cr_expect_str_eq(ch_st_meta(f, "format"), "pt");
    cr_expect_str_eq(ch_st_meta(f, "quote"), "a\"b\\c");
    cr_expect_null(ch_st_meta(f, "none"));
    cr_expect_null(ch_st_find(f, "none"));
    ch_st_close(f);
    /* no temporary left behind */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    cr_expect_neq(access(tmp, F_OK), 0);
}

Test(safetensors, reads_half_precision_as_float)
{
    /* F16: 1.0 = 0x3c00, -2.0 = 0xc000, 2^-24 (smallest subnormal) = 0x0001, inf = 0x7c00.
     * BF16: 1.0 = 0x3f80, -3.0 = 0xc040. */
    char path[600];
    snprintf(path, sizeof path, "%s/h.safetensors", dir);
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7c00}, bf[2] = {0x3f80, 0xc040};
    ch_st_writer_t *wr = NULL;
    uint64_t s4[1] = {4}, s2[1] = {2};
    cr_assert_eq(ch_st_writer_create(path, &wr), 0);
    cr_assert_eq(ch_st_writer_add(wr, "h", CH_ST_F16, 1, s4, h), 0);
    cr_assert_eq(ch_st_writer_add(wr, "bf", CH_ST_BF16, 1, s2, bf), 0);
    char err[256];
    cr_assert_eq(ch_st_writer_finish(wr, NULL, NULL, err, sizeof err), 0);
    ch_st_file_t *f = NULL;
    cr_assert_eq(ch_st_open(path, &f, err, sizeof err), 0, "%s", err);
    float got[4];
    cr_assert_eq(ch_st_read_f32(f, ch_st_find(f, "h"), got, err, sizeof err), 0);
    cr_expect_eq(got[0], 1.0f);
    cr_expect_eq(got[1], -2.0f);
    cr_expect_eq(got[2], 0x1p-24f);
    cr_expect(got[3] > 3e38f);
    cr_assert_eq(ch_st_read_f32(f, ch_st_find(f, "bf"), got, err, sizeof err), 0);
    cr_expect_eq(got[0], 1.0f);
    cr_expect_eq(got[1], -3.0f);
    ch_st_close(f);
}

Test(safetensors, hostile_headers_are_format_errors)
{
    struct {
        const char *hdr;
        size_t data;
        const char *why;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "span"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "span"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "cover"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,8]}}",
         8, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775000,"
         "9223372036854775008]}}",
         8, "past the end"},
        /* Over int64: the JSON layer refuses it, naming the offset, before anyone rounds it. */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[18446744073709551600,"
         "18446744073709551608]}}",
         8, "integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown"},
        {"{\"a\":[]}", 0, "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
        {"{\"a\":{\"dtype\":\"F32\",", 8, "JSON"},
        {"[1,2]  ", 0, "start"},
        {"{\"a\":1}xx", 0, "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        int rc = open_raw(cases[i].hdr, cases[i].data, err, sizeof err);
        cr_expect_eq(rc, CH_E_FORMAT, "case %zu accepted: %s", i, cases[i].hdr);
        cr_expect(strstr(err, cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, err,
                  cases[i].why);
        cr_expect(strstr(err, "raw.safetensors") != NULL, "case %zu: '%s' names no file", i, err);
    }
}

Test(safetensors, bad_header_lengths_and_short_files)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/len.safetensors", dir);
    ch_st_file_t *f = NULL;
    uint64_t lens[] = {UINT64_MAX, 1ull << 40, 64, 0};
    for (size_t i = 0; i < 4; i++) {
        FILE *fp = fopen(path, "wb");
        fwrite(&lens[i], 8, 1, fp);
        fputs("{}      ", fp);
        fclose(fp);
        cr_expect_eq(ch_st_open(path, &f, err, sizeof err), CH_E_FORMAT, "length %llu",
                     (unsigned long long)lens[i]);
    }
    FILE *fp = fopen(path, "wb");
    fputs("abc", fp);
    fclose(fp);
    cr_expect_eq(ch_st_open(path, &f, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "too short") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    cr_expect_eq(ch_st_open(path, &f, err, sizeof err), -ENOENT);
    cr_expect(strstr(err, "missing.safetensors") != NULL);
}

Test(safetensors, empty_file_of_tensors_and_zero_size_tensor)
{
    char err[256];
    cr_expect_eq(open_raw("{}      ", 0, err, sizeof err), 0, "%s", err);
    cr_expect_eq(open_raw("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                          4, err, sizeof err),
                 0, "%s", err);
}

Test(safetensors, every_truncation_of_a_valid_file_is_refused)
{
    char path[600], cut[600], err[512];
    snprintf(path, sizeof path, "%s/full.safetensors", dir);
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    float x[4] = {1, 2, 3, 4};
    uint64_t s4[1] = {4};
    ch_st_writer_t *wr = NULL;
    cr_assert_eq(ch_st_writer_create(path, &wr), 0);
    cr_assert_eq(ch_st_writer_add(wr, "x", CH_ST_F32, 1, s4, x), 0);
    cr_assert_eq(ch_st_writer_finish(wr, NULL, NULL, err, sizeof err), 0);
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(path, 1 << 20, &buf, &len), 0);
    for (size_t n = 0; n < len; n++) {
        FILE *fp = fopen(cut, "wb");
        fwrite(buf, 1, n, fp);
        fclose(fp);
        ch_st_file_t *f = NULL;
        cr_expect_eq(ch_st_open(cut, &f, err, sizeof err), CH_E_FORMAT, "%zu of %zu bytes", n, len);
        cr_expect_null(f);
    }
    free(buf);
}

Test(safetensors, hash_is_stream_split_independent_and_sensitive)
{
    unsigned char data[1000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 31 + 7);
    ch_hash64_t h;
    ch_hash64_init(&h);
    ch_hash64_update(&h, data, sizeof data);
    uint64_t whole = ch_hash64_final(&h);
    size_t cuts[] = {1, 7, 31, 32, 33, 100, 999};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        ch_hash64_init(&h);
        ch_hash64_update(&h, data, cuts[c]);
        ch_hash64_update(&h, data + cuts[c], sizeof data - cuts[c]);
        cr_expect_eq(ch_hash64_final(&h), whole, "split at %zu", cuts[c]);
    }
    data[500] ^= 1;
    ch_hash64_init(&h);
    ch_hash64_update(&h, data, sizeof data);
    cr_expect_neq(ch_hash64_final(&h), whole);
    ch_hash64_init(&h);
    ch_hash64_update(&h, data, sizeof data - 1);
    cr_expect_neq(ch_hash64_final(&h), whole);
}
