/* atlas/utf8.h — bytes that someone else chose (a client's URL or JSON, a directory's name)
 * made into valid UTF-8 before they reach a log line, a JSON string, a Prometheus label or a
 * terminal: what the server and the atlas command do with them, there for an embedder too.
 *
 * Ownership: the caller's buffers.  Threads: any thread; no state. */
#ifndef ATLAS_UTF8_H
#define ATLAS_UTF8_H

#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies the n bytes of src into dst (cap bytes, cap >= 1, always NUL-terminated) as valid
 * UTF-8: each byte that starts no valid sequence (overlong forms and surrogates included),
 * and each NUL, becomes U+FFFD; valid characters are kept as they are.  When dst is too
 * small the copy ends before the first character that does not fit, never inside one.
 * Returns the bytes written, the NUL not counted; at most 3 n. */
ATLAS_API size_t atlas_utf8_clean(char *dst, size_t cap, const char *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
