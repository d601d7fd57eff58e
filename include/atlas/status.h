/* atlas/status.h — the one status type and the per-thread error message.
 *
 * Every call that can fail returns an atlas_status: ATLAS_OK (0) or a negative code.
 * On failure it also leaves a message saying what failed and where (file, tensor,
 * JSON path, byte offset) that atlas_last_error() returns on the same thread.
 *
 * The codes are stable: a code's value never changes and none is reused; new codes are
 * added at the end, with the next negative value.  An embedder may store or compare them
 * and must treat an unknown negative code as a failure (atlas_status_str names it).
 *
 * Threads: every function here may be called from any thread; the message is the calling
 * thread's own.  Ownership: the strings returned are atlas's, never freed by the caller. */
#ifndef ATLAS_STATUS_H
#define ATLAS_STATUS_H

#include "atlas/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum atlas_status {
    ATLAS_OK = 0,
    ATLAS_ERR_INVALID = -1,     /* bad argument or request from the caller */
    ATLAS_ERR_IO = -2,          /* a file could not be opened, read or mapped */
    ATLAS_ERR_FORMAT = -3,      /* malformed input: file, JSON, template */
    ATLAS_ERR_UNSUPPORTED = -4, /* well-formed but not supported (architecture, dtype, construct) */
    ATLAS_ERR_NOMEM = -5,       /* host memory exhausted */
    ATLAS_ERR_DEVICE_NOMEM = -6,/* device memory exhausted: recoverable */
    ATLAS_ERR_BUSY = -7,        /* live handles prevent the operation; the message gives the count */
    ATLAS_ERR_NOT_FOUND = -8,   /* a named thing (model, tensor, file, symbol) does not exist */
    ATLAS_ERR_NO_DEVICE = -9,   /* no usable GPU/driver: the CPU backend is used instead */
    ATLAS_ERR_DEVICE = -10,     /* a driver call failed; the message names the call and error */
    ATLAS_ERR_RANGE = -11,      /* a value is out of range (token id, context length, ...) */
    ATLAS_ERR_INTERNAL = -12,   /* a bug in atlas: please report */
    ATLAS_ERR_UNAVAILABLE = -13,/* not now: a model failed to load and is retried later */
    /* New codes go here, -14 next; the values above never change. */
} atlas_status;

/* Static string for a status, e.g. "ATLAS_ERR_BUSY" ("ATLAS_ERR_UNKNOWN" for a value that
 * is not a code). Never NULL. */
ATLAS_API const char *atlas_status_str(atlas_status status);

/* The message left by the last failing call on this thread ("" if none); this thread's
 * buffer, valid until the next atlas call on this thread (copy it to keep it). */
ATLAS_API const char *atlas_last_error(void);

/* Empties this thread's message, so that a later failure cannot be read with an older
 * message (a thread that serves one request after another). Any thread. */
ATLAS_API void atlas_error_clear(void);

/* ---- reporting failures the same way --------------------------------------------------
 * For code layered on atlas (a server, a tool) that returns atlas_status and leaves its
 * messages where atlas_last_error() finds them.  The message is per thread, like errno: it
 * is set on the thread that fails and read on that thread, and each atlas call that fails
 * replaces it (messages longer than about 1 KiB are cut). */

#if defined(__GNUC__)
#define ATLAS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ATLAS_PRINTF(a, b)
#endif

/* Sets this thread's message from fmt and returns status, so that callers can write
 * `return atlas_fail(ATLAS_ERR_IO, "%s: open: %s", path, strerror(errno));`. */
ATLAS_API atlas_status atlas_fail(atlas_status status, const char *fmt, ...) ATLAS_PRINTF(2, 3);

/* Prefixes this thread's message with fmt and ": " and returns status: adds where, one
 * level up (`return atlas_fail_wrap(st, "loading %s", dir);` yields "loading DIR: PATH:
 * open: No such file or directory"). */
ATLAS_API atlas_status atlas_fail_wrap(atlas_status status, const char *fmt, ...)
    ATLAS_PRINTF(2, 3);

/* Evaluates expr (an atlas_status); returns it from the enclosing function if it failed. */
#define ATLAS_TRY(expr)                                                                    \
    do {                                                                                   \
        atlas_status atlas_try_st_ = (expr);                                               \
        if (atlas_try_st_ != ATLAS_OK) return atlas_try_st_;                               \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
