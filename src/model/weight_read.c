/* model/weight_read.c — see weight_read.h. */
#include "model/weight_read.h"

#include <string.h>

#include "core/file.h"

_Static_assert((int)ATLAS_WEIGHT_MAX_DIMS >= (int)ATLAS_MAX_DIMS, "a view's shape fits a source's");

atlas_status atlas_weight_file_read(void *ctx, void *dst, uint64_t offset, size_t n) {
    const atlas_weight_file *f = ctx;
    return atlas_file_read_at(f->fd, dst, n, f->offset + offset);
}

void atlas_weight_src_of_view(const atlas_tensor_view *v, atlas_weight_file *file,
                              atlas_weight_src *src) {
    memset(src, 0, sizeof *src);
    src->name = v->name;
    src->dtype = v->dtype;
    src->n_dims = v->n_dims;
    for (int i = 0; i < v->n_dims; i++) src->shape[i] = v->shape[i];
    src->nbytes = v->nbytes;
    src->data = v->data;
    if (v->fd >= 0) {
        *file = (atlas_weight_file){.fd = v->fd, .offset = v->file_offset};
        src->read = atlas_weight_file_read;
        src->ctx = file;
    }
}
