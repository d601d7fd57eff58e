/* backend/cuda/weight_load.c — the weights' entries of the op table: weight_load queues each
 * weight's upload through the host's staging pool, weights_done waits for them; the state is
 * cuda_backend.wt (cuda_backend.h). */
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/weight_fill.h"
#include "core/dtype.h"
#include "core/error.h"

/* Every weight goes through the host's pinned staging pool: weight_load queues it for the
 * host's loader threads, which read each piece (through the source's reader: the model's
 * pread) and convert it to bf16 into a pinned buffer and copy it on (host.h); weights_done
 * waits for them. (Copying bf16 straight out of
 * the registered file mapping by the copy engine, alone or mixed with staging, measured
 * slower on the H200 and was removed: bench/RESULTS.md.) */

/* A queued upload's context (atlas_host_upload_queue copies it): the sources themselves, as
 * the caller's may live on its stack. */
typedef struct queued_fill {
    atlas_weight_src srcs[CUDA_FUSE_MAX];
    int n;
} queued_fill;

static atlas_status fill_queued(void *dst, size_t offset, size_t bytes, void *user) {
    const queued_fill *q = user;
    const atlas_weight_src *v[CUDA_FUSE_MAX];
    for (int i = 0; i < q->n; i++) v[i] = &q->srcs[i];
    return atlas_cuda_fill_weight(v, q->n, dst, offset, offset, offset + bytes);
}

/* Queues srcs (n of them, fused; bytes of bf16 in all) for the host's loader threads, to
 * land at dst. */
static atlas_status stage_srcs(cuda_backend *cb, CUdeviceptr dst, size_t bytes,
                               const atlas_weight_src *const *srcs, int n) {
    if (n > CUDA_FUSE_MAX) /* the model fuses at most qkv's 3 */
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: a weight fused from %d tensors (at "
                          "most %d)", n, CUDA_FUSE_MAX);
    queued_fill q = {.n = n};
    for (int i = 0; i < n; i++) q.srcs[i] = *srcs[i];
    cb->wt.load.staged_bytes += bytes;
    return atlas_host_upload_queue(cb->dev.host, dst, bytes, fill_queued, &q, sizeof q);
}

atlas_status cuda_weight_load(atlas_backend *be, const atlas_weight_src *const *srcs, int n,
                              atlas_weight **out) {
    cuda_backend *cb = cuda_of(be);
    *out = NULL;
    if (n < 1) return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight_load of %d tensors", n);
    int dims = srcs[0]->n_dims;
    int64_t rows = 0, cols = dims == 2 ? srcs[0]->shape[1] : 0;
    for (int i = 0; i < n; i++) {
        const atlas_weight_src *v = srcs[i];
        /* 2-D sources stack their rows (same columns); 1-D ones (biases, norms) concatenate
         * whatever their lengths: q|k|v biases of H*hd, K*hd and K*hd under GQA */
        if (v->n_dims != dims || (dims != 1 && dims != 2) || (dims == 2 && v->shape[1] != cols))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: shape does not fuse with %s",
                              v->name, srcs[0]->name);
        /* a quantized weight uploaded as bf16 would read 2-4x the bytes it should: refused
         * until the kernels that read the packed bytes exist */
        if (v->quant)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: %s weights need the CUDA "
                              "kernels for quantized formats, not built yet; run with "
                              "--device cpu", v->name, atlas_wformat_name(v->quant->format));
        if (v->dtype != ATLAS_DTYPE_BF16 && v->dtype != ATLAS_DTYPE_F16 &&
            v->dtype != ATLAS_DTYPE_F32)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: dtype %s", v->name,
                              atlas_dtype_name(v->dtype));
        int64_t elems = 1;
        for (int d = 0; d < v->n_dims; d++) elems *= v->shape[d];
        if (v->nbytes != (size_t)elems * atlas_dtype_size(v->dtype) || (!v->data && v->nbytes))
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: %zu bytes at %p for %lld "
                              "elements of %s", v->name, v->nbytes, v->data, (long long)elems,
                              atlas_dtype_name(v->dtype));
        if (dims == 2) rows += v->shape[0];
        else cols += v->shape[0];
    }
    if (dims == 1) rows = 1; /* one row of all the sources' elements */
    if (dims == 2 && cols % 8)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: %lld columns, want a multiple "
                          "of 8", srcs[0]->name, (long long)cols);
    atlas_weight *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    w->rows = rows;
    w->cols = cols;
    size_t bytes = (size_t)rows * cols * 2;
    atlas_status st = atlas_registry_alloc(cb->mod.reg, bytes, srcs[0]->name, &w->ptr);
    if (st == ATLAS_OK) {
        cb->wt.load.pending = true;
        st = stage_srcs(cb, w->ptr, bytes, srcs, n); /* the fused weight at once */
    }
    if (st != ATLAS_OK) {
        char msg[512]; /* the load's error, not the free's (which destroy reports, if any) */
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        atlas_registry_free(cb->mod.reg, w->ptr);
        free(w);
        return atlas_fail(st, "cuda: loading weight %s: %s", srcs[0]->name, msg);
    }
    cb->wt.weight_bytes += bytes;
    *out = w;
    return ATLAS_OK;
}

/* A failed free is kept by the registry: destroy reports it (backend.h). */
void cuda_weight_free(atlas_backend *be, atlas_weight *w) {
    if (!w) return;
    cuda_load *ld = &cuda_of(be)->wt.load;
    /* a failed load: the loader threads may still be writing to it.  The wait's own failure
     * is the upload's, which weights_done (or the next begin_batch) reported already. */
    if (ld->pending) (void)atlas_host_upload_wait(cuda_of(be)->dev.host);
    cuda_of(be)->wt.weight_bytes -= (size_t)w->rows * w->cols * 2;
    atlas_registry_free(cuda_of(be)->mod.reg, w->ptr);
    free(w);
}

/* Waits for the queued uploads: the weights are on the device (also called by every
 * begin_batch, for weights loaded without a weights_done: at once when nothing was loaded
 * since). */
atlas_status cuda_weights_done(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    cuda_load *ld = &cb->wt.load;
    if (cb->mod.ready && !ld->pending) return ATLAS_OK;
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    ATLAS_TRY(cuda_ready(cb)); /* made at create already: returns at once */
    ld->pending = false;
    return atlas_host_upload_wait(cb->dev.host);
}
