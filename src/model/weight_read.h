/* model/weight_read.h — a checkpoint tensor as a weight source for the backend's weight_load
 * (backend/backend.h): its bytes in the mapping, and a reader that preads them from the
 * tensor's shard into the staging the backend offers.  The backend knows no files; this is
 * where the model's loading reads them.  Internal. */
#ifndef ATLAS_MODEL_WEIGHT_READ_H
#define ATLAS_MODEL_WEIGHT_READ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "atlas/status.h"
#include "backend/backend.h"
#include "format/safetensors.h"

/* A load's progress, for atlas_model_params.progress: bytes of the weights read so far
 * (counted by whichever thread reads them) out of total. fn NULL: nothing is reported. */
typedef struct atlas_load_progress {
    void (*fn)(void *user, uint64_t done, uint64_t total);
    void *user;
    uint64_t total;
    atomic_uint_least64_t done;
    pthread_mutex_t mu; /* one call of fn at a time */
} atlas_load_progress;

/* Adds n bytes read and reports the sum, unless a call of fn is under way on another
 * thread (that one or the next reports it: done only grows). Any thread; p NULL: nothing. */
void atlas_load_progress_add(atlas_load_progress *p, uint64_t n);
/* Reports done == total: the end of a successful load; on the loading thread, once every
 * read is over. */
void atlas_load_progress_finish(atlas_load_progress *p);

/* Where a tensor's data lies in a file: the reader's context. */
typedef struct atlas_weight_file {
    int fd;          /* the shard's descriptor (the atlas_st's: open until atlas_st_free) */
    const char *path; /* the shard's, for errors (the atlas_st's); NULL: none said */
    uint64_t offset; /* where the tensor's data starts in it */
    atlas_load_progress *progress; /* counts the bytes read; NULL: none */
} atlas_weight_file;

/* atlas_weight_src's reader, ctx an atlas_weight_file: bytes [offset, offset + n) of the
 * tensor with one atlas_file_read_at (pread, retried on short reads); a failure names the
 * shard and the offset in it. Any thread. */
atlas_status atlas_weight_file_read(void *ctx, void *dst, uint64_t offset, size_t n);

/* The source of view v (a whole tensor, or a rank's part of one: model/shard.h). With a
 * descriptor (v->fd >= 0) its reader preads at v->file_offset, and *file, filled here, is
 * its context: the caller keeps *file (and v's mapping) until the backend's weights_done
 * returns. Without one (an in-memory checkpoint, a gathered column band) it has no reader:
 * the backend copies from v->data. src->name and src->data are v's. */
void atlas_weight_src_of_view(const atlas_tensor_view *v, atlas_weight_file *file,
                              atlas_weight_src *src);
/* The same, with the reader counting what it reads into progress (NULL: not counted). */
void atlas_weight_src_of_view_counted(const atlas_tensor_view *v, atlas_weight_file *file,
                                      atlas_load_progress *progress, atlas_weight_src *src);

#endif
