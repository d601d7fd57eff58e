/* core/memdir.h — the lookups behind atlas/memdir.h, for core/file.c and the few places
 * that list a directory.  Internal. */
#ifndef ATLAS_CORE_MEMDIR_H
#define ATLAS_CORE_MEMDIR_H

#include <stdbool.h>
#include <stddef.h>

#include "atlas/memdir.h"

/* The registered file whose path is exactly "DIR/NAME", or NULL; *inside (when not NULL)
 * says whether DIR is a registered directory, where a missing name must not be looked up on
 * disk.  Valid for the life of the process (registrations are never removed). */
const atlas_memdir_file *atlas_memdir_file_at(const char *path, bool *inside);

/* The files of registered directory dir (*n of them), or NULL (and *n = 0) when dir is not
 * one.  Valid for the life of the process. */
const atlas_memdir_file *atlas_memdir_files(const char *dir, size_t *n);

/* A sealed memfd holding f's bytes (read-only from then on; the caller closes it), so that
 * the mmap and pread paths of core/file.c work on it as on a file.  ATLAS_ERR_IO naming
 * path, ATLAS_ERR_NOMEM. */
atlas_status atlas_memdir_open_fd(const atlas_memdir_file *f, const char *path, int *fd);

#endif
