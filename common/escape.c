/* Terminal- and log-safe copies of peer-supplied strings; see escape.h. */
#include "common/escape.h"

#include <stdint.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p (at most n bytes) that is not a C1 control, or
 * 0 when the bytes there must be escaped. Overlong forms and surrogates are invalid. */
static size_t utf8_ok(const unsigned char *p, size_t n)
{
    size_t want = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
    if (p[0] < 0xc2 || p[0] > 0xf4 || n < want)
        return 0;
    uint32_t cp = p[0] & (0x3f >> (want - 1));
    for (size_t i = 1; i < want; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[want] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f)
        return 0;
    return want;
}

size_t ch_escape_n(char *out, size_t cap, const char *in, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)in;
    size_t o = 0, i = 0;
    if (cap == 0)
        return 0;
    while (i < len) {
        char esc[4];
        const char *src = (const char *)p + i;
        size_t take = 1, put = 1;
        if (p[i] == '\\') {
            src = "\\\\";
            put = 2;
        } else if (p[i] >= 0x80 && (take = put = utf8_ok(p + i, len - i)) != 0) {
            /* a valid multi-byte character: as it is */
        } else if (p[i] < 0x20 || p[i] >= 0x7f) {
            esc[0] = '\\';
            esc[1] = 'x';
            esc[2] = hex[p[i] >> 4];
            esc[3] = hex[p[i] & 15];
            src = esc;
            take = 1;
            put = 4;
        }
        if (o + put >= cap)
            break;
        memcpy(out + o, src, put);
        o += put;
        i += take;
    }
    out[o] = '\0';
    return o;
}

char *ch_escape(char *out, size_t cap, const char *in)
{
    ch_escape_n(out, cap, in ? in : "", in ? strlen(in) : 0);
    return out;
}
