/* core/fault_alloc.h — force-included (-include) into every C source of the library in an
 * ATLAS_FAULT build only (CMakeLists.txt), so that every allocation is a fault site without
 * editing its call: the C library's allocators become core/fault.h's wrappers, which count
 * the site by file and line. The system headers are included first so that their
 * declarations are not rewritten. core/fault.c, which wraps the real ones, undoes this. */
#ifndef ATLAS_CORE_FAULT_ALLOC_H
#define ATLAS_CORE_FAULT_ALLOC_H

#include <stdlib.h>
#include <string.h>

#include "core/fault.h"

#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#undef aligned_alloc
#define malloc(n) atlas_fault_malloc((n), __FILE__, __LINE__)
#define calloc(c, n) atlas_fault_calloc((c), (n), __FILE__, __LINE__)
#define realloc(p, n) atlas_fault_realloc((p), (n), __FILE__, __LINE__)
#define strdup(s) atlas_fault_strdup((s), __FILE__, __LINE__)
#define strndup(s, n) atlas_fault_strndup((s), (n), __FILE__, __LINE__)
#define aligned_alloc(a, n) atlas_fault_aligned_alloc((a), (n), __FILE__, __LINE__)

#endif
