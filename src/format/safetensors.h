/* format/safetensors.h — safetensors checkpoints, mapped read-only.  Internal.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   bytes 0..7    u64 little-endian N: length of the JSON header
 *   bytes 8..8+N  JSON: { "name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...,
 *                         "__metadata__": {str: str} (optional) }
 *   bytes 8+N..   the data; offsets are relative to this point, b <= e, and every tensor's
 *                 byte count must equal product(shape) * dtype size. Ranges must not overlap.
 * A directory holds model.safetensors, or shards listed by model.safetensors.index.json
 * ({"weight_map": {"tensor name": "shard file name"}}). */
#ifndef ATLAS_MODEL_SAFETENSORS_H
#define ATLAS_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "core/dtype.h"

enum { ATLAS_MAX_DIMS = 8 };

typedef struct atlas_tensor_view {
    const char *name;              /* owned by the atlas_st */
    const char *file;              /* path of the shard that holds it; owned by the atlas_st */
    atlas_dtype dtype;
    int n_dims;
    int64_t shape[ATLAS_MAX_DIMS];
    const void *data;              /* points into the mapping; valid until atlas_st_free */
    size_t nbytes;
    int fd;                        /* the shard's descriptor, for reading data with pread
                                      (atlas_file_read_at); -1 for atlas_st_open_memory */
    uint64_t file_offset;          /* where data starts in that file */
} atlas_tensor_view;

typedef struct atlas_st atlas_st; /* a set of mapped safetensors files */

/* Opening reads only the headers (no tensor data is touched), validates them completely and
 * fails with a message naming the file and the tensor or field (ATLAS_ERR_FORMAT for bad
 * bytes, ATLAS_ERR_UNSUPPORTED for a dtype atlas lacks, ATLAS_ERR_IO / ATLAS_ERR_NOT_FOUND for
 * missing files or tensors). On failure *out is NULL. The 8-byte-padded headers that the
 * safetensors library writes keep data 8-byte aligned; other writers may not: a view's data
 * is only guaranteed to be byte-aligned.
 * Tensors are listed shard by shard in offset order; atlas_st_find is a binary search. */

/* Maps one file and validates its header completely. */
atlas_status atlas_st_open_file(const char *path, atlas_st **out);
/* Maps DIR/model.safetensors, or every shard named by DIR/model.safetensors.index.json
 * (and checks every tensor of the index is present in its shard). */
atlas_status atlas_st_open_dir(const char *dir, atlas_st **out);
/* Validates a header held in memory (for the fuzzer and tests): buf is the whole file. The
 * views point into buf, which the caller keeps alive until atlas_st_free. */
atlas_status atlas_st_open_memory(const void *buf, size_t len, const char *name, atlas_st **out);

size_t atlas_st_count(const atlas_st *st);
const atlas_tensor_view *atlas_st_at(const atlas_st *st, size_t i);
/* The i for which atlas_st_at(st, i) == v; atlas_st_count(st) when v is not one of st's. */
size_t atlas_st_index(const atlas_st *st, const atlas_tensor_view *v);
/* NULL when absent (no error set). */
const atlas_tensor_view *atlas_st_find(const atlas_st *st, const char *name);
/* Total bytes of tensor data over all shards. */
size_t atlas_st_total_bytes(const atlas_st *st);
void atlas_st_free(atlas_st *st);

#endif
