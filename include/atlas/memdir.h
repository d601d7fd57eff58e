/* atlas/memdir.h — a model directory held in memory: how a program ships a model inside its
 * own binary (the atlas command's default model is one, embedded with .incbin).
 *
 * atlas_memdir_add("@embedded/tiny", files, n) makes that path a directory of the n files
 * for every load by path in atlas: atlas_model_load, atlas_tokenizer_load,
 * atlas_template_load, an engine's or a server's model dir.  A file's bytes are read from
 * memory; the weights, which loaders map and read with pread, go through a sealed memfd
 * made for each load (anonymous memory, never a file on disk).  The directory has exactly
 * these files: any other name in it does not exist.
 *
 * Pick a path that no real directory has (a leading '@' by convention): a registered path
 * shadows the file system.  A directory stays registered for the life of the process.
 *
 * Ownership: the file bytes are borrowed for the life of the process (static data, or
 * memory never freed); dir and the names are copied.  Threads: any thread, also while
 * other threads load. */
#ifndef ATLAS_MEMDIR_H
#define ATLAS_MEMDIR_H

#include <stddef.h>

#include "atlas/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct atlas_memdir_file {
    const char *name; /* a plain file name, e.g. "config.json" (no '/') */
    const void *data; /* size bytes, kept as they are for the life of the process */
    size_t size;
} atlas_memdir_file;

/* Registers dir as a directory of files[0..n-1].  ATLAS_ERR_INVALID when dir is empty or
 * ends in '/', when dir is already registered, or when a name is empty, has a '/' or is
 * given twice; ATLAS_ERR_NOMEM. */
ATLAS_API atlas_status atlas_memdir_add(const char *dir, const atlas_memdir_file *files,
                                        size_t n);

#ifdef __cplusplus
}
#endif
#endif
