/* backend/cuda/sample_cuda.c — the sample op (backend.h) on the device: the rows' parameters
 * and adjustments go up in one copy, kernels/sample.cu samples every row in one launch (a
 * block a row), and only the ids and logprobs come back; the logits never leave the
 * device.  The state is cuda_backend.ws's d_smp and h_smp. */
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/fault.h"

_Static_assert(sizeof(atlas_sample_row) == 64, "kernels/sample.cu's sample_row");
_Static_assert(sizeof(atlas_sample_adj) == 16, "kernels/sample.cu's sample_adj");
_Static_assert(sizeof(atlas_sample_out) == 12 + 8 * ATLAS_SAMPLE_MAX_TOP,
               "kernels/sample.cu's sample_out");

/* The buffers of a call, device and pinned host alike: rows, adjustments, the adjusted
 * logits' raw values (device only), outputs; each region 16-byte aligned. */
typedef struct smp_layout {
    size_t rows, adj, raw, out, total;
} smp_layout;

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

static smp_layout layout(int rows, int n_adj) {
    smp_layout l;
    l.rows = 0;
    l.adj = up16((size_t)rows * sizeof(atlas_sample_row));
    l.raw = l.adj + up16((size_t)n_adj * sizeof(atlas_sample_adj));
    l.out = l.raw + up16((size_t)n_adj * sizeof(float));
    l.total = l.out + up16((size_t)rows * sizeof(atlas_sample_out));
    return l;
}

static atlas_status smp_grow(cuda_backend *cb, size_t bytes) {
    if (bytes <= cb->ws.smp_bytes) return ATLAS_OK;
    if (bytes < ((size_t)64 << 10)) bytes = (size_t)64 << 10;
    if (bytes < 2 * cb->ws.smp_bytes) bytes = 2 * cb->ws.smp_bytes;
    if (cb->ws.h_smp) {
        ATLAS_REGISTRY_KEEP(cb->mod.reg, "sampling (pinned)", cuMemFreeHost, cb->ws.h_smp);
        cb->ws.h_smp = NULL;
    }
    if (cb->ws.d_smp) ATLAS_TRY(atlas_registry_free(cb->mod.reg, cb->ws.d_smp));
    cb->ws.d_smp = 0;
    cb->ws.smp_bytes = 0;
    if (ATLAS_FAULT_HERE()) /* a fault site (core/fault.h), before asking the driver */
        return atlas_cu_check(ATLAS_CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc (injected fault)",
                              __FILE__, __LINE__);
    ATLAS_CU_TRY(cuMemHostAlloc, &cb->ws.h_smp, bytes, 0);
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, bytes, "sampling", &cb->ws.d_smp));
    cb->ws.smp_bytes = bytes;
    return ATLAS_OK;
}

atlas_status cuda_sample(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                         int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                         int n_adj) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(atlas_sample_check(p, rows, adj, n_adj, vocab));
    if (rows == 0) return ATLAS_OK;
    ATLAS_TRY(cuda_ready(cb));
    ATLAS_TRY(cuda_sample_ready(cb));
    ATLAS_TRY(cuda_flush(cb)); /* the batch's commands: the logits */
    smp_layout l = layout(rows, n_adj);
    ATLAS_TRY(smp_grow(cb, l.total));
    char *h = cb->ws.h_smp;
    memcpy(h + l.rows, p, (size_t)rows * sizeof *p);
    if (n_adj > 0) memcpy(h + l.adj, adj, (size_t)n_adj * sizeof *adj);
    ATLAS_CU_TRY(cuMemcpyHtoDAsync, cb->ws.d_smp, h, l.raw, cb->dev.stream);
    CUdeviceptr d_out = cb->ws.d_smp + l.out, d_rows = cb->ws.d_smp + l.rows;
    CUdeviceptr d_adj = cb->ws.d_smp + l.adj, d_raw = cb->ws.d_smp + l.raw;
    CUdeviceptr d_logits = CUDA_PTR(logits);
    void *args[] = {&d_out, &d_logits, &vocab, &d_rows, &d_adj, &d_raw};
    cb->plan.pdl_fence = true; /* after a copy: a plain launch */
    ATLAS_TRY(cuda_launch(cb, cb->mod.fn.sample, (unsigned)rows, 1, 1, CUDA_SAMPLE_THREADS, 0, args));
    ATLAS_CU_TRY(cuMemcpyDtoHAsync, h + l.out, d_out, l.total - l.out, cb->dev.stream);
    ATLAS_TRY(cuda_sync(be));
    const atlas_sample_out *o = (const atlas_sample_out *)(const void *)(h + l.out);
    for (int r = 0; r < rows; r++)
        if (!(p[r].flags & ATLAS_SAMPLE_SKIP)) out[r] = o[r];
    return ATLAS_OK;
}
