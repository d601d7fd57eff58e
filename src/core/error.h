/* core/error.h — recording failures.  Internal.
 *
 * Usage:  if (!f) return atlas_fail(ATLAS_ERR_IO, "%s: open: %s", path, strerror(errno));
 * and, one level up, to add where:  return atlas_fail_wrap(st, "loading %s", dir);
 * which yields "loading DIR: PATH: open: No such file or directory". */
#ifndef ATLAS_CORE_ERROR_H
#define ATLAS_CORE_ERROR_H

#include "atlas/status.h"

#if defined(__GNUC__)
#define ATLAS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ATLAS_PRINTF(a, b)
#endif

/* Sets this thread's message from fmt and returns status (so callers can `return`). */
atlas_status atlas_fail(atlas_status status, const char *fmt, ...) ATLAS_PRINTF(2, 3);

/* Prefixes this thread's current message with fmt + ": " and returns status. */
atlas_status atlas_fail_wrap(atlas_status status, const char *fmt, ...) ATLAS_PRINTF(2, 3);

/* Clears the message (call at the start of a public entry point if you like). */
void atlas_error_clear(void);

/* Evaluates expr (an atlas_status); returns it from the enclosing function if it failed. */
#define ATLAS_TRY(expr)                                                                    \
    do {                                                                                   \
        atlas_status atlas_try_st_ = (expr);                                               \
        if (atlas_try_st_ != ATLAS_OK) return atlas_try_st_;                               \
    } while (0)

#endif
