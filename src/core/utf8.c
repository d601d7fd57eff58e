/* core/utf8.c — see atlas/utf8.h. */
#include "atlas/utf8.h"

#include <string.h>
#include <utf8proc.h>

size_t atlas_utf8_clean(char *dst, size_t cap, const char *src, size_t n) {
    static const char replacement[] = "\xEF\xBF\xBD";
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)src + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        const char *piece = src + i;
        if (k <= 0 || cp == 0) { /* utf8proc checks overlong forms and surrogates too */
            piece = replacement;
            k = 1;
        }
        size_t len = piece == replacement ? 3 : (size_t)k;
        if (o + len >= cap) break;
        memcpy(dst + o, piece, len);
        o += len;
        i += (size_t)k;
    }
    dst[o] = '\0';
    return o;
}
