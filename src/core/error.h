/* core/error.h — recording failures, for the library's own files.  Internal.
 *
 * Everything is in atlas/status.h (atlas_fail, atlas_fail_wrap, atlas_error_clear,
 * ATLAS_TRY), public because code layered on atlas reports its errors the same way; this
 * header stays the library's one include for it.
 *
 * Usage:  if (!f) return atlas_fail(ATLAS_ERR_IO, "%s: open: %s", path, strerror(errno));
 * and, one level up, to add where:  return atlas_fail_wrap(st, "loading %s", dir);
 * which yields "loading DIR: PATH: open: No such file or directory". */
#ifndef ATLAS_CORE_ERROR_H
#define ATLAS_CORE_ERROR_H

#include "atlas/status.h"

#endif
