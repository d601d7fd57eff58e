/* backend/cuda/backend_cuda.c — the op table on the GPU: create/destroy, memory, the paged
 * KV cache, the ops recorded as commands. The weights are weight_load.c's, the batch and its
 * results stage.c's, the queue and graphs plan.c's. See cuda_backend.h for the layout of the
 * state and the command scheme. */
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_tier.h"
#include "core/error.h"

/* --- memory ----------------------------------------------------------------------------------- */

static atlas_status cuda_alloc(atlas_backend *be, size_t bytes, void **out) {
    CUdeviceptr p = 0;
    *out = NULL;
    ATLAS_TRY(atlas_registry_alloc(cuda_of(be)->mod.reg, bytes, "activations", &p));
    *out = (void *)(uintptr_t)p;
    return ATLAS_OK;
}

/* A failed free is kept by the registry: destroy reports it (backend.h). */
static void cuda_free(atlas_backend *be, void *p) {
    if (p) atlas_registry_free(cuda_of(be)->mod.reg, CUDA_PTR(p));
}

/* --- KV cache --------------------------------------------------------------------------------- */

static atlas_status cuda_kv_create(atlas_backend *be, int n_blocks, int block_size, atlas_kv **out) {
    cuda_backend *cb = cuda_of(be);
    const atlas_backend_geom *g = &be->geom;
    *out = NULL;
    if (n_blocks < 1 || block_size < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: kv cache of %d blocks of %d", n_blocks,
                          block_size);
    if (be->kv_size != 2 && be->kv_size != 1)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: a KV cache of %zu-byte elements (the "
                          "CUDA backend has bf16 and FP8 e4m3)", be->kv_size);
    if (be->kv_size == 1) ATLAS_TRY(cuda_kv8_ready(cb)); /* the FP8 cache's kernels */
    atlas_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->es = (int)be->kv_size;
    kv->layer_elems = (size_t)n_blocks * block_size * g->n_kv_heads * g->head_dim;
    size_t bytes = kv->layer_elems * 2 * (size_t)kv->es * (size_t)g->n_layers;
    atlas_status st = atlas_registry_alloc(cb->mod.reg, bytes, "kv cache", &kv->base);
    /* in stream order after the allocation, on the load's stream: no host wait */
    if (st == ATLAS_OK)
        st = ATLAS_CU(cuMemsetD8Async, kv->base, 0, bytes, atlas_registry_stream(cb->mod.reg));
    if (st != ATLAS_OK) {
        char msg[512]; /* the load's error, not the free's (which destroy reports, if any) */
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        atlas_registry_free(cb->mod.reg, kv->base);
        free(kv);
        return atlas_fail(st, "%s", msg);
    }
    cb->wt.kv_bytes += bytes;
    *out = kv;
    return ATLAS_OK;
}

/* A failed free is kept by the registry: destroy reports it (backend.h). */
static void cuda_kv_free(atlas_backend *be, atlas_kv *kv) {
    if (!kv) return;
    cuda_of(be)->wt.kv_bytes -= kv->layer_elems * 2 * (size_t)kv->es * (size_t)be->geom.n_layers;
    atlas_registry_free(cuda_of(be)->mod.reg, kv->base);
    free(kv);
}

/* Block b's rows in the cache: one a (layer, K or V), rows = 2 * n_layers of row bytes each,
 * pitch bytes apart; the host image keeps them in that order, back to back. */
typedef struct kv_rows {
    size_t row, pitch;
    int rows;
} kv_rows;

static kv_rows kv_rows_of(atlas_backend *be, const atlas_kv *kv) {
    size_t per_block = kv->layer_elems / (size_t)kv->n_blocks;
    return (kv_rows){.row = per_block * be->kv_size, .pitch = kv->layer_elems * be->kv_size,
                     .rows = 2 * be->geom.n_layers};
}

/* One block's rows between device and host: a strided copy where the driver has it and the
 * pitch is within its limit (CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2^31 - 1), else a copy a row. */
static atlas_status kv_copy_block(atlas_backend *be, const atlas_kv *kv, int32_t id,
                                  void *dst_host, const void *src_host) {
    const atlas_driver *d = atlas_driver_get();
    cuda_backend *cb = cuda_of(be);
    kv_rows r = kv_rows_of(be, kv);
    if (id < 0 || id >= kv->n_blocks)
        return atlas_fail(ATLAS_ERR_RANGE, "cuda: kv block %d of %d", id, kv->n_blocks);
    CUdeviceptr at = kv->base + (size_t)id * r.row;
    if (d->cuMemcpy2DAsync && r.pitch <= (size_t)INT32_MAX) {
        ATLAS_CUDA_MEMCPY2D c = {.WidthInBytes = r.row, .Height = (size_t)r.rows};
        if (dst_host) {
            c.srcMemoryType = ATLAS_CU_MEMORYTYPE_DEVICE, c.srcDevice = at, c.srcPitch = r.pitch;
            c.dstMemoryType = ATLAS_CU_MEMORYTYPE_HOST, c.dstHost = dst_host, c.dstPitch = r.row;
        } else {
            c.srcMemoryType = ATLAS_CU_MEMORYTYPE_HOST, c.srcHost = src_host, c.srcPitch = r.row;
            c.dstMemoryType = ATLAS_CU_MEMORYTYPE_DEVICE, c.dstDevice = at, c.dstPitch = r.pitch;
        }
        ATLAS_CU_TRY(cuMemcpy2DAsync, &c, cb->dev.stream);
        return ATLAS_OK;
    }
    for (int i = 0; i < r.rows; i++) {
        CUdeviceptr dev = at + (size_t)i * r.pitch;
        if (dst_host)
            ATLAS_CU_TRY(cuMemcpyDtoHAsync, (char *)dst_host + (size_t)i * r.row, dev, r.row,
                         cb->dev.stream);
        else
            ATLAS_CU_TRY(cuMemcpyHtoDAsync, dev, (const char *)src_host + (size_t)i * r.row,
                         r.row, cb->dev.stream);
    }
    return ATLAS_OK;
}

/* The queued commands run first: the copies follow them on the stream. */
static atlas_status cuda_kv_save(atlas_backend *be, const atlas_kv *kv, const int32_t *ids,
                                 int n, void *const *host) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_flush(cb));
    for (int i = 0; i < n; i++) ATLAS_TRY(kv_copy_block(be, kv, ids[i], host[i], NULL));
    ATLAS_CU_TRY(cuStreamSynchronize, cb->dev.stream);
    return ATLAS_OK;
}

/* Pageable host memory: the driver has taken each row's bytes when its call returns, and
 * the copies run before the next op on the stream. */
static atlas_status cuda_kv_restore(atlas_backend *be, atlas_kv *kv, const int32_t *ids, int n,
                                    const void *const *host) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_flush(cb));
    for (int i = 0; i < n; i++) ATLAS_TRY(kv_copy_block(be, kv, ids[i], NULL, host[i]));
    return ATLAS_OK;
}

/* --- ops: recorded as commands ---------------------------------------------------------------- */

static atlas_status cmd4(atlas_backend *be, int op, int n, int d, int layer, const void *p0,
                         const void *p1, const void *p2, const void *p3) {
    return cuda_cmd4(cuda_of(be), op, n, d, layer, p0, p1, p2, p3);
}

static atlas_status cuda_embed(atlas_backend *be, void *x, const atlas_weight *table) {
    cuda_backend *cb = cuda_of(be); /* p[2]: the ids staged tokens v < 0 name, or NULL */
    cb->plan.pending_delta = NULL; /* a new residual stream (a forward that failed may have
                                      left an add deferred) */
    return cmd4(be, CUDA_OP_EMBED, cb->batch.n_tokens, 0, 0, x, table,
                (const void *)(uintptr_t)cb->batch.tok_ids, NULL);
}

/* A norm of x: the residual add deferred into it (add, matmul_residual: backend.h's
 * hand-off guarantees this norm is of the same residual) is its delta. */
static atlas_status norm_cmd(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                             int rows, int d, int link) {
    cuda_backend *cb = cuda_of(be);
    const void *delta = cb->plan.pending_delta;
    cb->plan.pending_delta = NULL;
    return cuda_cmd_linked(cb, CUDA_OP_ADD_RMSNORM, rows, d, 0, link, 0, x, delta, out, w);
}

static atlas_status cuda_rmsnorm(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                                 int rows, int d) {
    return norm_cmd(be, out, x, w, rows, d, 0);
}

/* Deferred into the next norm (backend.h): no kernel of its own. That norm may write delta
 * (Gemma 3's post-norms: the delta is the norm output h that the next norm writes again):
 * atlas_add_rmsnorm reads each row's delta before its block barrier and writes that row's
 * output after it, a row a block, so the sum is taken before h is overwritten; the decode
 * fusions never take such a norm (the one after a residual GEMV adds that GEMV's output, and
 * the on-the-fly norm GEMV takes only a norm without a delta). */
static atlas_status cuda_add(atlas_backend *be, void *resid, const void *delta, int n, int d) {
    (void)resid; (void)n; (void)d;
    cuda_of(be)->plan.pending_delta = delta;
    return ATLAS_OK;
}

/* The fused ops, recorded as the plain commands they stand for with the links that say so
 * (cuda_backend.h CUDA_LINK_*); cuda_exec_fused picks each group's kernels. */
static atlas_status cuda_rmsnorm_matmul(atlas_backend *be, void *out, void *h, const void *x,
                                        const atlas_weight *norm, const atlas_weight *w,
                                        const atlas_weight *bias, int n, int d, int row0,
                                        const atlas_epilogue *epi) {
    cuda_backend *cb = cuda_of(be);
    atlas_epi_kind kind = epi ? epi->kind : ATLAS_EPI_NONE;
    if (norm) {
        ATLAS_TRY(norm_cmd(be, h, x, norm, n, d, CUDA_LINK_FEEDS));
        row0 = 0;
    }
    bool glu = kind == ATLAS_EPI_SWIGLU || kind == ATLAS_EPI_GLU;
    int link = CUDA_LINK_MIRROR | (glu                         ? CUDA_LINK_SWIGLU
                                   : kind == ATLAS_EPI_ROPE_KV ? CUDA_LINK_ROPE_KV
                                                               : 0);
    const char *in = (const char *)h + (size_t)row0 * d * sizeof(float);
    ATLAS_TRY(cuda_cmd_linked(cb, CUDA_OP_MATMUL, n, 0, 0, link, row0, out, in, w, bias));
    switch (kind) {
    case ATLAS_EPI_NONE:
        return ATLAS_OK;
    case ATLAS_EPI_SWIGLU: /* the command's layer is its activation (cuda_cmd) */
    case ATLAS_EPI_GLU:
        return cuda_cmd_linked(cb, CUDA_OP_SWIGLU, n, epi->f,
                               kind == ATLAS_EPI_GLU ? (int)be->geom.glu : ATLAS_GLU_SILU,
                               CUDA_LINK_CHAIN, 0, epi->act, out, NULL, NULL);
    case ATLAS_EPI_ROPE_KV:
        ATLAS_TRY(cuda_cmd_linked(cb, CUDA_OP_ROPE, n, 0, epi->layer, CUDA_LINK_KV, 0, out, NULL,
                                  NULL, NULL));
        return cmd4(be, CUDA_OP_KV_STORE, cb->batch.n_tokens, 0, epi->layer, out, epi->kv,
                    NULL, NULL);
    }
    return atlas_fail(ATLAS_ERR_INTERNAL, "cuda: rmsnorm_matmul epilogue %d", (int)kind);
}

static atlas_status cuda_matmul_residual(atlas_backend *be, void *resid, void *tmp,
                                         const void *x, const atlas_weight *w, int n, int d) {
    ATLAS_TRY(cuda_cmd_linked(cuda_of(be), CUDA_OP_MATMUL, n, 0, 0, CUDA_LINK_RESID, 0, tmp, x,
                              w, NULL));
    return cuda_add(be, resid, tmp, n, d);
}

static atlas_status cuda_rope_kv_store(atlas_backend *be, void *qkv, atlas_kv *kv, int layer,
                                       int n) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(cuda_cmd_linked(cb, CUDA_OP_ROPE, n, 0, layer, CUDA_LINK_KV, 0, qkv, NULL, NULL,
                              NULL));
    return cmd4(be, CUDA_OP_KV_STORE, cb->batch.n_tokens, 0, layer, qkv, kv, NULL, NULL);
}

static atlas_status cuda_add_rmsnorm(atlas_backend *be, void *resid, const void *delta, void *out,
                                     const atlas_weight *w, int n, int d) {
    return cmd4(be, CUDA_OP_ADD_RMSNORM, n, d, 0, resid, delta, out, w);
}

static atlas_status cuda_matmul(atlas_backend *be, void *out, const void *x, const atlas_weight *w,
                                const atlas_weight *bias, int n) {
    return cmd4(be, CUDA_OP_MATMUL, n, 0, 0, out, x, w, bias);
}

static atlas_status cuda_qk_norm(atlas_backend *be, void *qkv, const atlas_weight *q_norm,
                                 const atlas_weight *k_norm, int n) {
    return cmd4(be, CUDA_OP_QK_NORM, n, 0, 0, qkv, q_norm, k_norm, NULL);
}

static atlas_status cuda_rope(atlas_backend *be, void *qkv, int n, int layer) {
    return cmd4(be, CUDA_OP_ROPE, n, 0, layer, qkv, NULL, NULL, NULL);
}

static atlas_status cuda_kv_store(atlas_backend *be, const void *qkv, atlas_kv *kv, int layer) {
    return cmd4(be, CUDA_OP_KV_STORE, cuda_of(be)->batch.n_tokens, 0, layer, qkv, kv, NULL, NULL);
}

/* p[3]: the sinks (NULL: none), one bf16 logit a query head. */
static atlas_status cuda_attention(atlas_backend *be, void *out, const void *qkv, const atlas_kv *kv,
                                   int layer, const atlas_weight *sinks) {
    if (sinks && (sinks->fmt != ATLAS_WFMT_DENSE || sinks->rows * sinks->cols != be->geom.n_heads))
        return atlas_fail(ATLAS_ERR_INTERNAL, "cuda attention: sinks of %lld elements (%s) for "
                          "%d heads", (long long)(sinks->rows * sinks->cols),
                          atlas_wformat_name(sinks->fmt), be->geom.n_heads);
    return cmd4(be, CUDA_OP_ATTENTION, cuda_of(be)->batch.n_tokens, 0, layer, out, qkv, kv, sinks);
}

/* The command's layer is its gate activation (cuda_cmd). */
static atlas_status cuda_swiglu(atlas_backend *be, void *out, const void *gate_up, int n, int f) {
    return cmd4(be, CUDA_OP_SWIGLU, n, f, ATLAS_GLU_SILU, out, gate_up, NULL, NULL);
}

static atlas_status cuda_glu(atlas_backend *be, void *out, const void *gate_up, int n, int f) {
    return cmd4(be, CUDA_OP_SWIGLU, n, f, (int)be->geom.glu, out, gate_up, NULL, NULL);
}

static atlas_status cuda_gather_rows(atlas_backend *be, void *out, const void *x, int d) {
    return cmd4(be, CUDA_OP_GATHER, cuda_of(be)->batch.n_logits, d, 0, out, x, NULL, NULL);
}

/* Mixture of experts (run by ops_moe.c): the weights are bf16 [rows, cols] matrices, the
 * experts' also MXFP4 (fp4: weight_load took them as quant_load_experts lays them out; a
 * quantized router, which weight_load cannot tell from another weight, is refused here);
 * the biases (gpt-oss; NULL: none) bf16 vectors of rows * cols elements. */
static atlas_status moe_weight(const char *what, const atlas_weight *w, int64_t rows,
                               int64_t cols, bool fp4) {
    if (w && w->fmt != ATLAS_WFMT_DENSE && !(fp4 && w->fmt == ATLAS_WFMT_FP4_E2M1))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: a mixture-of-experts %s stored %s: the "
                          "GPU kernels read bf16 (and MXFP4 experts); run with --device cpu", what,
                          atlas_wformat_name(w->fmt));
    if (w && w->rows == rows && w->cols == cols) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_INTERNAL, "cuda moe: %s of [%lld, %lld], want [%lld, %lld]",
                      what, w ? (long long)w->rows : 0LL, w ? (long long)w->cols : 0LL,
                      (long long)rows, (long long)cols);
}

static atlas_status moe_bias(const char *what, const atlas_weight *b, int64_t elems) {
    if (!b || (b->fmt == ATLAS_WFMT_DENSE && b->rows * b->cols == elems)) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_INTERNAL, "cuda moe: %s of %lld elements (%s), want %lld bf16",
                      what, (long long)(b->rows * b->cols), atlas_wformat_name(b->fmt),
                      (long long)elems);
}

static atlas_status moe_cmd(cuda_backend *cb, int op, int n, const void *const p[8]) {
    cuda_cmd c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.n = n;
    memcpy(c.p, p, sizeof c.p);
    return cuda_submit(cb, &c);
}

static atlas_status cuda_moe_route(atlas_backend *be, int32_t *ids, float *wts, const void *h,
                                   const atlas_weight *router, const atlas_weight *bias, int n) {
    ATLAS_TRY(moe_weight("router", router, be->geom.n_experts, be->geom.hidden, false));
    ATLAS_TRY(moe_bias("router bias", bias, be->geom.n_experts));
    const void *p[8] = {ids, wts, h, router, bias, NULL, NULL, NULL};
    return moe_cmd(cuda_of(be), CUDA_OP_MOE_ROUTE, n, p);
}

static atlas_status cuda_moe_experts(atlas_backend *be, void *out, const void *h,
                                     const atlas_weight *gate_up, const atlas_weight *gate_up_bias,
                                     const atlas_weight *down, const atlas_weight *down_bias,
                                     const int32_t *ids, const float *wts, int n) {
    int64_t E = be->geom.n_experts, f = be->geom.expert_ffn, d = be->geom.hidden;
    ATLAS_TRY(moe_weight("experts' gate_up", gate_up, E * 2 * f, d, true));
    ATLAS_TRY(moe_weight("experts' down", down, E * d, f, true));
    if (gate_up->fmt != down->fmt) /* the kernels are picked for both at once (ops_moe.c) */
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: experts' gate_up stored %s and down "
                          "%s: the GPU kernels take both in one format; run with --device cpu",
                          atlas_wformat_name(gate_up->fmt), atlas_wformat_name(down->fmt));
    ATLAS_TRY(moe_bias("experts' gate_up bias", gate_up_bias, E * 2 * f));
    ATLAS_TRY(moe_bias("experts' down bias", down_bias, E * d));
    const void *p[8] = {out, h, gate_up, down, ids, wts, gate_up_bias, down_bias};
    return moe_cmd(cuda_of(be), CUDA_OP_MOE_EXPERTS, n, p);
}

/* --- create / destroy ------------------------------------------------------------------------- */

/* Every failure of the teardown goes to the registry (the graphs', the workspace's, the
 * frees' before), whose release reports them all with its own.  What here may wait beyond
 * the serving stream, on a release beside serving: cuMemFreeHost of the workspace's pinned
 * buffers and the registry's cuModuleUnload may synchronise the device (the driver does not
 * say); by then the model's unload has waited for the serving stream (its sync), so at most a
 * load's copies in flight are waited for, bounded by the staging pool (32 x 16 MiB, about
 * 10 ms at 55 GB/s).  Device memory itself is freed in stream order (registry.c). */
static atlas_status cuda_destroy(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    if (!cb) return ATLAS_OK;
    atlas_registry *reg = cb->mod.reg;
    /* a context that cannot be made current fails the calls below: release reports it */
    if (cb->dev.host) atlas_host_make_current(cb->dev.host);
    if (cb->wt.load.tier) { /* a load that failed: its fill is dropped once its copies end */
        (void)atlas_host_upload_wait(cb->dev.host); /* the load's failure, reported already */
        atlas_tier_close(cb->dev.host, cb->wt.load.tier, 0);
    }
    atlas_tier_fill_end(cb->wt.load.tier_fill, 0); /* a model with no weight freed */
    cuda_plan_release(cb);
    atlas_registry_keep(reg, cuda_lt_free(cb->mod.lt));
    cuda_workspace_release(cb);
    free(cb->mod.inv_freq);
    free(cb->mod.layer_window);
    free(cb->mod.layer_rope_set);
    free(cb->mod.kv_scales);
    free(cb->wt.load.repacks);
    free(cb);
    atlas_status st = atlas_registry_release(reg); /* frees every allocation left */
    if (st == ATLAS_ERR_BUSY) /* a handle on the registry leaked: its memory stays theirs */
        st = atlas_fail_wrap(ATLAS_ERR_INTERNAL, "cuda: destroying the backend");
    return st;
}

static const atlas_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .weight_load = cuda_weight_load,
    .weight_free = cuda_weight_free,
    .weights_done = cuda_weights_done,
    .host_tier = cuda_host_tier,
    .loaded = cuda_loaded,
    .tier_fill = cuda_tier_fill,
    .kv_create = cuda_kv_create,
    .kv_free = cuda_kv_free,
    .kv_save = cuda_kv_save,
    .kv_restore = cuda_kv_restore,
    .begin_batch = cuda_begin_batch,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add_rmsnorm = cuda_add_rmsnorm,
    .matmul = cuda_matmul,
    .qk_norm = cuda_qk_norm,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .glu = cuda_glu,
    .add = cuda_add,
    .moe_route = cuda_moe_route,
    .moe_experts = cuda_moe_experts,
    .gather_rows = cuda_gather_rows,
    .download = cuda_download,
    .argmax = cuda_argmax,
    .argmax_queue = cuda_argmax_queue,
    .argmax_collect = cuda_argmax_collect,
    .argmax_ready = cuda_argmax_ready,
    .sample_queue = cuda_sample_queue,
    .sample = cuda_sample,
    .sync = cuda_sync,
    .destroy = cuda_destroy,
    .rmsnorm_matmul = cuda_rmsnorm_matmul,
    .matmul_residual = cuda_matmul_residual,
    .rope_kv_store = cuda_rope_kv_store,
};

/* The RoPE geometry: rotated dimensions, the sets and each layer's set (as the CPU checks). */
static atlas_status check_rope(const atlas_backend_geom *g) {
    if (g->rope_dim < 0 || g->rope_dim > g->head_dim || g->rope_dim % 2)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: rope_dim %d of head_dim %d: want an even "
                          "count up to head_dim", g->rope_dim, g->head_dim);
    if (g->n_rope_sets < 0 || g->n_rope_sets >= ATLAS_MAX_ROPE_SETS)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: %d RoPE sets beyond the first (at most %d)",
                          g->n_rope_sets, ATLAS_MAX_ROPE_SETS - 1);
    for (int l = 0; g->layer_rope_set && l < g->n_layers; l++)
        if (g->layer_rope_set[l] > g->n_rope_sets)
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: layer %d rotates with RoPE set %d of %d",
                              l, g->layer_rope_set[l], 1 + g->n_rope_sets);
    return ATLAS_OK;
}

/* The shapes the kernels take; a model the CPU runs and these refuse fails its load with the
 * limit named. Every tuned kernel falls back to a general one inside them (ops_cuda.c): the
 * tiled prefill attention (head_dim 64/80/96/128) to the split kernel, the cluster decode
 * attention (64/128, <= 8 heads a kv head, <= 4096 slots) to the warp kernel (64/128/256,
 * <= 8 heads) and that to the split kernel, which takes any group in blocks of heads. */
static atlas_status check_geom(const atlas_backend_geom *g) {
    if (g->n_kv_heads < 1 || g->n_heads < 1 || g->n_heads % g->n_kv_heads)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: %d query heads for %d kv heads: want "
                          "whole groups", g->n_heads, g->n_kv_heads);
    /* K/V rows, weight rows and activations move 8 bf16 (16 bytes) at a time; the rope
     * tables are made from a stack copy of 3 x hd/2 <= 512 frequencies (rope_setup) */
    if (g->head_dim % 8 || g->head_dim < 8 || g->head_dim > 1024)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: head_dim %d: the kernels take multiples "
                          "of 8 from 8 to 1024", g->head_dim);
    ATLAS_TRY(check_rope(g));
    if (g->hidden % 8 || g->intermediate % 8)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: hidden %d, intermediate %d: the kernels "
                          "take multiples of 8", g->hidden, g->intermediate);
    /* kernels/moe.cu: a block's shared arrays hold every expert and a token's choices; the
     * expert weights' rows move 16 bytes at a time */
    if (g->n_experts && (g->n_experts > 1024 || g->n_experts_used < 1 ||
                         g->n_experts_used > 64 || g->n_experts_used > g->n_experts ||
                         g->expert_ffn % 8 || g->expert_ffn < 8))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: %d experts, %d a token, %d columns "
                          "each: the kernels take up to 1024 experts, 1 to 64 a token, "
                          "columns a multiple of 8", g->n_experts, g->n_experts_used,
                          g->expert_ffn);
    int G = g->n_heads / g->n_kv_heads;
    if (cuda_attn_split_heads(G, g->head_dim, CUDA_ARCH_ATTN_SMEM_MIN) < 1)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: head_dim %d: one query head of the split "
                          "attention kernel needs more than its %d KiB of shared memory",
                          g->head_dim, CUDA_ARCH_ATTN_SMEM_MIN / 1024);
    return ATLAS_OK;
}

/* ATLAS_SKIP_* (backend.h) as bits of cuda_op. */
static unsigned skip_bits(unsigned skip) {
    static const struct { unsigned bit; int op; } ops[] = {
        {ATLAS_SKIP_NORM, CUDA_OP_ADD_RMSNORM}, {ATLAS_SKIP_MATMUL, CUDA_OP_MATMUL},
        {ATLAS_SKIP_ROPE, CUDA_OP_ROPE}, {ATLAS_SKIP_KV_STORE, CUDA_OP_KV_STORE},
        {ATLAS_SKIP_ATTENTION, CUDA_OP_ATTENTION}, {ATLAS_SKIP_SWIGLU, CUDA_OP_SWIGLU}};
    unsigned out = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (skip & ops[i].bit) out |= 1u << ops[i].op;
    return out;
}

/* atlas_stage (kernels/rope.cu) makes set 0's table and set 1's. */
_Static_assert(ATLAS_MAX_ROPE_SETS == 2, "the rope tables: sets 0 and 1");

/* The RoPE sets, copied (the caller's arrays are not kept; geom points at the copies): the
 * frequencies as [3][hd/2] (set 0, longrope's long set, set 1; zeros past rope_dim/2) on the
 * host and, in float, on the device (atlas_stage makes the tables from them), and each
 * layer's set. rope_dim 0 becomes head_dim. */
static atlas_status rope_setup(cuda_backend *cb) {
    atlas_backend_geom *g = &cb->base.geom;
    int half = g->head_dim / 2; /* <= 512: check_geom */
    if (!g->rope_dim) g->rope_dim = g->head_dim;
    int rot = g->rope_dim / 2;
    cb->mod.inv_freq = calloc((size_t)3 * half, sizeof(double));
    if (!cb->mod.inv_freq) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    double *f = cb->mod.inv_freq;
    memcpy(f, g->rope_inv_freq, (size_t)rot * sizeof(double));
    if (g->rope_inv_freq_long)
        memcpy(f + half, g->rope_inv_freq_long, (size_t)rot * sizeof(double));
    if (g->n_rope_sets > 0)
        memcpy(f + 2 * half, g->rope_sets[0].inv_freq, (size_t)rot * sizeof(double));
    g->rope_inv_freq = f;
    g->rope_inv_freq_long = g->rope_inv_freq_long ? f + half : NULL;
    if (g->n_rope_sets > 0) g->rope_sets[0].inv_freq = f + 2 * half;
    if (g->layer_rope_set) {
        if (!(cb->mod.layer_rope_set = malloc((size_t)g->n_layers)))
            return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        memcpy(cb->mod.layer_rope_set, g->layer_rope_set, (size_t)g->n_layers);
    }
    g->layer_rope_set = cb->mod.layer_rope_set;
    float inv_f[3 * 512];
    for (int i = 0; i < 3 * half; i++) inv_f[i] = (float)f[i];
    size_t bytes = (size_t)3 * half * sizeof(float);
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, bytes, "rope", &cb->mod.d_inv_freq));
    /* through the staging pool on the copy stream, in stream order after the allocation (a
     * plain cuMemcpyHtoD, on no stream of the pool's, would not be) */
    return atlas_host_upload_copy(cb->dev.host, cb->mod.d_inv_freq, inv_f, bytes);
}

/* scales: the caller's geom.kv_scales (NULL: none), copied. */
static atlas_status cuda_setup(cuda_backend *cb, const atlas_backend_options *o,
                               const float *scales) {
    const atlas_backend_geom *g = &cb->base.geom;
    ATLAS_TRY(atlas_registry_create(cb->dev.host, &cb->mod.reg));
    cb->dev.stream = atlas_host_stream(cb->dev.host);
    ATLAS_TRY(rope_setup(cb));
    if (g->layer_window) {
        size_t bytes = (size_t)g->n_layers * sizeof(int32_t);
        if (!(cb->mod.layer_window = malloc(bytes)))
            return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        memcpy(cb->mod.layer_window, g->layer_window, bytes);
        cb->base.geom.layer_window = cb->mod.layer_window;
    }
    if (scales) { /* an FP8 cache's, read by its kernels' launches (cuda_kv_scale) */
        size_t bytes = (size_t)2 * g->n_layers * sizeof(float);
        if (!(cb->mod.kv_scales = malloc(bytes)))
            return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        memcpy(cb->mod.kv_scales, scales, bytes);
        cb->base.geom.kv_scales = cb->mod.kv_scales;
    }
    cb->plan.use_graphs = !o->no_graphs;
    /* the streaming one-row kernels: 1.5-1.8x the one-group kernel's rate at the 8B decode
     * shapes (bench/RESULTS.md); layouts they do not take fall back to it */
    cb->plan.qgemv_ng = CUDA_QGEMV_S;
    /* x in int8 for INT4's one-row GEMVs only where asked: it changes results (8B GPTQ decode
     * 382.7 against 355.9 tok/s on an H100, bench/RESULTS.md) */
    cb->plan.int8_x = o->int8_x != 0;
    /* 9-16 rows of a quantized weight on the tensor cores with x split once a matmul: on an
     * H100 (8B shapes, INT4 g128, 16 rows) 219-341 GB/s against 201-309 with each block
     * splitting it (bench/RESULTS.md) */
    cb->plan.qmma_split = true;
    /* INT4 in groups of 128 or more on the split path: atlas_qmmq*, 72 registers at 16 rows
     * against atlas_qmmp*'s 168 (seven blocks an SM against three) */
    cb->plan.qmma_chunk = true;
    /* up to 16 rows of those through atlas_qmmw, x loaded once for 2 or 4 tiles of 16 weight
     * rows (cuda_qmmw_tiles): on an H100 at 16 rows (8B shapes, GPTQ g128) 274-741 GB/s
     * against qmmq's 234-409 (bench/RESULTS.md) */
    cb->plan.qmma_wide = -1;
    /* Programmatic dependent launch (Hopper and later; kernels/common.cuh): each kernel's
     * launch and first weight loads overlap the previous kernel's tail. On the H200 8B shape
     * it took decode from 178 to 200 tok/s (827b480; it had lost 3% while the slow attention
     * and swiglu-GEMV kernels dominated). */
    const atlas_host_props *hp = atlas_host_properties(cb->dev.host);
    cuda_arch_pick(hp, o->portable != 0, o->no_pdl != 0, &cb->dev.arch);
    ATLAS_TRY(atlas_registry_set_portable(cb->mod.reg, cb->dev.arch.portable));
    if (cb->dev.arch.pdl) cb->dev.launch_ex = cuda_pdl_resolve();
    if (cb->dev.arch.clusters) cb->dev.cluster_ex = cuda_pdl_resolve(); /* cluster attention */
    cb->plan.skip_ops = skip_bits(o->skip_ops);
    cb->mod.want_lt = !o->no_cublaslt; /* read by cuda_ready */
    /* A load's kernel modules (cuModuleLoadData, and each kernel at cuModuleGetFunction where
     * the driver loads them lazily) may need a context synchronise: on the loader thread that
     * waits for the serving stream's queued steps, a step or two, and blocks no step.
     * The kernels and cuBLASLt are made here, before any weight is queued: 3-4 ms alone,
     * where made while the loader threads read they took 80-227 ms of a core the loaders
     * wanted; swaps 34.5-35.8 GB/s against 33.1-34.7 on the same machine (bench/RESULTS.md,
     * 2026-12-03) */
    ATLAS_TRY(cuda_ready(cb));
    if (g->n_experts) ATLAS_TRY(cuda_moe_ready(cb));
    /* no load to hand it over: what was made so far is ordered before the serving stream's
     * work, and what comes later goes there */
    return o->load ? ATLAS_OK : cuda_serving(cb);
}

atlas_status atlas_backend_cuda_create(const atlas_backend_geom *geom,
                                       const atlas_backend_options *opts, atlas_backend **out) {
    *out = NULL;
    const atlas_backend_options defaults = {0};
    const atlas_backend_options *o = opts ? opts : &defaults;
    ATLAS_TRY(check_geom(geom));
    atlas_host *host = NULL;
    ATLAS_TRY(atlas_host_get(o->gpu, &host));
    ATLAS_TRY(atlas_host_make_current(host));
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    cb->base.ops = &cuda_ops;
    cb->base.geom = *geom;
    cb->base.act_size = sizeof(float);
    cb->base.kv_size = 2; /* bf16 */
    cb->base.int4_stored = 1; /* GPTQ and AWQ repacked on the device (weight_load.c) */
    cb->base.geom.kv_scales = NULL; /* cuda_setup keeps a copy */
    cb->dev.host = host;
    atlas_status st = cuda_setup(cb, o, geom->kv_scales);
    if (st != ATLAS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        if (cuda_destroy(&cb->base) != ATLAS_OK) { /* the create's failure, then the unload's */
            char un[400]; /* a copy: atlas_fail writes the buffer atlas_last_error reads */
            snprintf(un, sizeof un, "%s", atlas_last_error());
            return atlas_fail(st, "cuda backend: %s; and unloading what it had made: %s", msg,
                              un);
        }
        return atlas_fail(st, "cuda backend: %s", msg);
    }
    *out = &cb->base;
    return ATLAS_OK;
}
