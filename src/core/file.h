/* core/file.h — reading and mapping files, with errors that name the path.  Internal. */
#ifndef ATLAS_CORE_FILE_H
#define ATLAS_CORE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len excludes the NUL).
 * The caller frees *out with free(). Fails with ATLAS_ERR_IO naming the path. */
atlas_status atlas_file_read(const char *path, char **out, size_t *len);

/* Opens path for reading if it is a regular file, without waiting on a FIFO: the
 * descriptor (blocking again, close-on-exec; *st filled), -1 with errno when it cannot be
 * opened, -2 when it is not a regular file (a FIFO, a directory, a device). */
struct stat;
int atlas_file_open_regular(const char *path, struct stat *st);

/* A read-only, shared memory map of a whole file (shared so that the CUDA loader can pin its
 * page cache: file.c), with its descriptor kept open for
 * atlas_file_read_at: reading a page-cached file with pread into a buffer skips the page
 * faults that a memcpy out of the mapping takes (4x faster in a VM: bench/RESULTS.md). */
typedef struct atlas_file_map {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
    int fd;                    /* valid when fd_open */
    bool fd_open;
} atlas_file_map;

atlas_status atlas_file_map_open(const char *path, atlas_file_map *out);
void atlas_file_map_close(atlas_file_map *map); /* safe on a zeroed map */

/* Reads exactly n bytes at offset off of fd into dst (pread, retried on EINTR and short
 * reads). ATLAS_ERR_IO at end of file or on a read error. */
atlas_status atlas_file_read_at(int fd, void *dst, size_t n, uint64_t off);

/* Whether path names something: a file, a directory, or a symbolic link even where what it
 * points to is not there or loops (a broken link is an error for the read that follows to
 * report, not an absence). */
bool atlas_file_exists(const char *path);

/* Bytes of [p, p + n) of a mapping in memory now (mincore: for a file mapping, in the page
 * cache), estimated from one page a stride (the page of each stride's first byte; the
 * stride counted whole when it is in memory); 0 when mincore fails. An exact count looks up
 * every page, about 0.1 us each: longer for a 16 GB checkpoint than reading it from the
 * page cache. */
size_t atlas_mem_resident_sampled(const void *p, size_t n, size_t stride);

/* Joins dir and name into buf ("dir/name"); fails with ATLAS_ERR_RANGE if it does not fit. */
atlas_status atlas_path_join(char *buf, size_t cap, const char *dir, const char *name);

#endif
