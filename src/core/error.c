/* core/error.c — status strings and the per-thread error message.
 * The message buffer is thread-local: it is one of the documented globals
 * (docs/ARCHITECTURE.md, "Globals"), like errno or dlerror. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { ATLAS_ERROR_MAX = 1024 };
static _Thread_local char error_msg[ATLAS_ERROR_MAX];

const char *atlas_status_str(atlas_status status) {
    switch (status) {
    case ATLAS_OK: return "ATLAS_OK";
    case ATLAS_ERR_INVALID: return "ATLAS_ERR_INVALID";
    case ATLAS_ERR_IO: return "ATLAS_ERR_IO";
    case ATLAS_ERR_FORMAT: return "ATLAS_ERR_FORMAT";
    case ATLAS_ERR_UNSUPPORTED: return "ATLAS_ERR_UNSUPPORTED";
    case ATLAS_ERR_NOMEM: return "ATLAS_ERR_NOMEM";
    case ATLAS_ERR_DEVICE_NOMEM: return "ATLAS_ERR_DEVICE_NOMEM";
    case ATLAS_ERR_BUSY: return "ATLAS_ERR_BUSY";
    case ATLAS_ERR_NOT_FOUND: return "ATLAS_ERR_NOT_FOUND";
    case ATLAS_ERR_NO_DEVICE: return "ATLAS_ERR_NO_DEVICE";
    case ATLAS_ERR_DEVICE: return "ATLAS_ERR_DEVICE";
    case ATLAS_ERR_RANGE: return "ATLAS_ERR_RANGE";
    case ATLAS_ERR_INTERNAL: return "ATLAS_ERR_INTERNAL";
    case ATLAS_ERR_UNAVAILABLE: return "ATLAS_ERR_UNAVAILABLE";
    }
    return "ATLAS_ERR_UNKNOWN";
}

const char *atlas_last_error(void) { return error_msg; }

void atlas_error_clear(void) { error_msg[0] = '\0'; }

atlas_status atlas_fail(atlas_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_msg, sizeof error_msg, fmt, ap);
    va_end(ap);
    return status;
}

atlas_status atlas_fail_wrap(atlas_status status, const char *fmt, ...) {
    char prefix[ATLAS_ERROR_MAX];
    char old[ATLAS_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_msg, sizeof old);
    /* prefix, then ": ", then the old message, each cut to what still fits */
    size_t n = strnlen(prefix, sizeof error_msg - 1);
    memcpy(error_msg, prefix, n);
    if (old[0] && n + 2 < sizeof error_msg) {
        memcpy(error_msg + n, ": ", 2);
        n += 2;
        size_t m = strnlen(old, sizeof error_msg - 1 - n);
        memcpy(error_msg + n, old, m);
        n += m;
    }
    error_msg[n] = '\0';
    return status;
}
