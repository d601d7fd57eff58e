/* core/error.h — recording failures: the internal rest of atlas/status.h.  Internal.
 *
 * Usage:  if (!f) return atlas_fail(ATLAS_ERR_IO, "%s: open: %s", path, strerror(errno));
 * and, one level up, to add where:  return atlas_fail_wrap(st, "loading %s", dir);
 * which yields "loading DIR: PATH: open: No such file or directory". */
#ifndef ATLAS_CORE_ERROR_H
#define ATLAS_CORE_ERROR_H

#include "atlas/status.h"

/* atlas_fail, atlas_fail_wrap, atlas_error_clear (and ATLAS_PRINTF) are declared in
 * atlas/status.h: code layered on atlas reports its errors with them too. */

/* Evaluates expr (an atlas_status); returns it from the enclosing function if it failed. */
#define ATLAS_TRY(expr)                                                                    \
    do {                                                                                   \
        atlas_status atlas_try_st_ = (expr);                                               \
        if (atlas_try_st_ != ATLAS_OK) return atlas_try_st_;                               \
    } while (0)

#endif
