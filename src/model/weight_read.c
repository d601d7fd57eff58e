/* model/weight_read.c — see weight_read.h. */
#include "model/weight_read.h"

#include <string.h>

#include "core/error.h"
#include "core/file.h"

_Static_assert((int)ATLAS_WEIGHT_MAX_DIMS >= (int)ATLAS_MAX_DIMS, "a view's shape fits a source's");

void atlas_load_progress_add(atlas_load_progress *p, uint64_t n) {
    if (!p || !p->fn) return;
    uint64_t done = atomic_fetch_add(&p->done, n) + n;
    /* a reader never waits on a slow callback (a terminal being drawn): it skips instead */
    if (pthread_mutex_trylock(&p->mu) != 0) return;
    uint64_t now = atomic_load(&p->done);
    p->fn(p->user, now > done ? now : done, p->total);
    pthread_mutex_unlock(&p->mu);
}

void atlas_load_progress_finish(atlas_load_progress *p) {
    if (!p || !p->fn) return;
    pthread_mutex_lock(&p->mu);
    p->fn(p->user, p->total, p->total);
    pthread_mutex_unlock(&p->mu);
}

atlas_status atlas_weight_file_read(void *ctx, void *dst, uint64_t offset, size_t n) {
    const atlas_weight_file *f = ctx;
    atlas_status st = atlas_file_read_at(f->fd, dst, n, f->offset + offset);
    if (st != ATLAS_OK && f->path) return atlas_fail_wrap(st, "%s", f->path);
    if (st == ATLAS_OK) atlas_load_progress_add(f->progress, n);
    return st;
}

void atlas_weight_src_of_view(const atlas_tensor_view *v, atlas_weight_file *file,
                              atlas_weight_src *src) {
    atlas_weight_src_of_view_counted(v, file, NULL, src);
}

void atlas_weight_src_of_view_counted(const atlas_tensor_view *v, atlas_weight_file *file,
                                      atlas_load_progress *progress, atlas_weight_src *src) {
    memset(src, 0, sizeof *src);
    src->name = v->name;
    src->dtype = v->dtype;
    src->n_dims = v->n_dims;
    for (int i = 0; i < v->n_dims; i++) src->shape[i] = v->shape[i];
    src->nbytes = v->nbytes;
    src->data = v->data;
    if (v->fd >= 0) {
        *file = (atlas_weight_file){.fd = v->fd, .path = v->file, .offset = v->file_offset,
                                    .progress = progress};
        src->read = atlas_weight_file_read;
        src->ctx = file;
    }
}
