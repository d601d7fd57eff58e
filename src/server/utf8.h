/* server/utf8.h — bytes that a client or the file system chose (a URL's path, a model's
 * name) made into valid UTF-8 before they reach a log line, a JSON string or /metrics.
 * Internal to src/server. */
#ifndef ATLAS_SERVER_UTF8_H
#define ATLAS_SERVER_UTF8_H

#include <stddef.h>

/* Copies the n bytes of src into dst (cap bytes, cap >= 1, always NUL-terminated) as valid
 * UTF-8: each byte that starts no valid sequence, and each NUL, becomes U+FFFD.  When dst
 * is too small the copy ends before the first character that does not fit, never inside
 * one.  Returns the bytes written, the NUL not counted; at most 3 n. */
size_t atlas_utf8_clean(char *dst, size_t cap, const char *src, size_t n);

#endif
