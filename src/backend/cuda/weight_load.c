/* backend/cuda/weight_load.c — the weights' entries of the op table: weight_load queues each
 * weight's upload through the host's staging pool, weights_done waits for them; the state is
 * cuda_backend.wt (cuda_backend.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_tier.h"
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
    return atlas_tier_upload(cb->dev.host, cb->wt.load.tier, dst, bytes, fill_queued, &q, sizeof q);
}

/* Queues srcs (any number of them) to land at dst: a fused weight at once, the stacked experts
 * of a mixture-of-experts layer (E or 2E parts) CUDA_FUSE_MAX parts at a time, each group at
 * its rows; row: the elements of a source's row (1 for 1-D sources). */
static atlas_status stage_all(cuda_backend *cb, CUdeviceptr dst,
                              const atlas_weight_src *const *srcs, int n, size_t row) {
    size_t at = 0;
    for (int i = 0; i < n; i += CUDA_FUSE_MAX) {
        int m = n - i < CUDA_FUSE_MAX ? n - i : CUDA_FUSE_MAX;
        size_t part = 0;
        for (int j = i; j < i + m; j++) part += (size_t)srcs[j]->shape[0] * row * 2;
        ATLAS_TRY(stage_srcs(cb, dst + at, part, srcs + i, m));
        at += part;
    }
    return ATLAS_OK;
}

/* --- quantized weights (kernels/quant.cu) ---------------------------------------------------
 * The codes go up as stored, the parts of a fused weight one after another (its rows stack);
 * the scale grids (and INT4's zeros, and g_idx) likewise, as float32 / int32. Each is queued
 * for the loader threads like a dense weight: the model keeps what they read until
 * weights_done. */

/* One queued upload of concatenated pieces: each the bytes of a source (read through it) or
 * of memory the model keeps until weights_done. */
typedef struct queued_parts {
    atlas_weight_src srcs[CUDA_FUSE_MAX];
    const void *mem[CUDA_FUSE_MAX];
    size_t bytes[CUDA_FUSE_MAX];
    float div[CUDA_FUSE_MAX]; /* > 0: mem is float32, each divided by it and rounded to bf16 */
    bool zero[CUDA_FUSE_MAX]; /* zero bytes (the rest of a region a stored grid begins) */
    int n;
} queued_parts;

/* Bytes [from, from + n) of the floats src[i] / div, each rounded to bf16 (an NVFP4 scale
 * without its global factor: the e4m3 value it was, exactly). */
static void copy_divided(char *d, const float *src, size_t from, size_t n, float div) {
    for (size_t b = from; b < from + n;) {
        size_t o = b % 4, take = 4 - o < from + n - b ? 4 - o : from + n - b;
        float v = atlas_bf16_to_f32(atlas_f32_to_bf16(src[b / 4] / div));
        memcpy(d + (b - from), (const char *)&v + o, take);
        b += take;
    }
}

static atlas_status fill_parts(void *dst, size_t offset, size_t bytes, void *user) {
    const queued_parts *q = user;
    size_t at = 0, end = offset + bytes;
    for (int i = 0; i < q->n && at < end; at += q->bytes[i++]) {
        size_t lo = offset > at ? offset : at, hi = end < at + q->bytes[i] ? end : at + q->bytes[i];
        if (lo >= hi) continue;
        char *d = (char *)dst + (lo - offset);
        if (q->zero[i]) memset(d, 0, hi - lo);
        else if (q->mem[i] && q->div[i] > 0.0f) copy_divided(d, q->mem[i], lo - at, hi - lo, q->div[i]);
        else if (q->mem[i]) memcpy(d, (const char *)q->mem[i] + (lo - at), hi - lo);
        else ATLAS_TRY(atlas_cuda_read_bytes(d, &q->srcs[i], lo - at, hi - lo));
    }
    return ATLAS_OK;
}

/* Allocates `bytes` for `what` of weight w and queues q's pieces into it. */
static atlas_status quant_upload(cuda_backend *cb, atlas_weight *w, CUdeviceptr *ptr,
                                 queued_parts *q, const char *name) {
    size_t bytes = 0;
    for (int i = 0; i < q->n; i++) bytes += q->bytes[i];
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, bytes, name, ptr));
    w->bytes += bytes;
    cb->wt.load.pending = true;
    cb->wt.load.staged_bytes += bytes;
    return atlas_tier_upload(cb->dev.host, cb->wt.load.tier, *ptr, bytes, fill_parts, q,
                             sizeof *q);
}

/* log2 of a power of two v, or -1. */
static int shift_of(int64_t v) {
    for (int s = 0; s < 62; s++)
        if (v == (int64_t)1 << s) return s;
    return -1;
}

static void quant_free_bufs(cuda_backend *cb, atlas_weight *w) {
    CUdeviceptr *b[] = {&w->ptr, &w->scales, &w->zeros, &w->g_idx, &w->rowscale};
    for (int i = 0; i < 5; i++)
        if (*b[i]) atlas_registry_free(cb->mod.reg, *b[i]);
    free(w->host);
}

/* NVFP4 (parts with a global factor): the scales go up without it (copy_divided) and each
 * part's factor becomes its rows' rowscale (1 for a part without one), so that the tensor-core
 * kernels multiply exact bf16 weights and apply the factor to the fp32 product. */
static atlas_status quant_rowscale(cuda_backend *cb, atlas_weight *w,
                                   const atlas_weight_src *const *srcs, int n, queued_parts *sc) {
    bool any = false;
    for (int i = 0; i < n; i++) any |= srcs[i]->quant->global > 0.0f;
    if (!any) return ATLAS_OK;
    w->host = malloc((size_t)w->rows * sizeof(float));
    if (!w->host) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        float f = srcs[i]->quant->global > 0.0f ? srcs[i]->quant->global : 1.0f;
        sc->div[i] = srcs[i]->quant->global;
        for (int64_t r = 0; r < srcs[i]->shape[0]; r++) w->host[at + r] = f;
        at += srcs[i]->shape[0];
    }
    queued_parts rs = {.n = 1, .mem = {w->host}, .bytes = {(size_t)w->rows * sizeof(float)}};
    return quant_upload(cb, w, &w->rowscale, &rs, "weight rowscale");
}

/* --- INT4 as stored (backend.h atlas_int4_order), repacked on the device ------------------
 * Its codes upload into their region of the weight as any codes do (GPTQ's and AWQ's take the
 * bytes the packed layout takes), its stored scales and zeros into the start of their rows'
 * regions of the float32 grids; weights_done then copies each region to a scratch buffer and
 * the kernels (kernels/quant.cu atlas_int4_repack_*) write it back in the kernels' layout. The
 * host only moves bytes: a repack on the host's cores held an 8B GPTQ load to 1.4 GB/s
 * (bench/RESULTS.md). */

/* The stored grids' sizes for a part of rows x cols in its groups. */
static atlas_status stored_check(const atlas_weight_src *v) {
    const atlas_wquant *q = v->quant;
    const atlas_weight_src *s = q->stored_scales, *z = q->stored_zeros;
    int64_t rows = v->shape[0], cols = v->shape[1], groups = q->scale_cols;
    if (!s || !z || (s->dtype != ATLAS_DTYPE_F32 && s->dtype != ATLAS_DTYPE_F16 &&
                     s->dtype != ATLAS_DTYPE_BF16) ||
        s->nbytes != (size_t)(groups * rows) * atlas_dtype_size(s->dtype) ||
        z->nbytes != (size_t)(groups * rows / 2) || rows % 8 || cols % 8 ||
        v->nbytes != (size_t)(rows * cols / 2) || rows > INT_MAX || groups > INT_MAX)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: INT4 as stored, %lld x %lld in "
                          "%lld groups, with %zu bytes of codes, %zu of scales (%s), %zu of "
                          "zeros", v->name, (long long)rows, (long long)cols, (long long)groups,
                          v->nbytes, s ? s->nbytes : 0, s ? atlas_dtype_name(s->dtype) : "none",
                          z ? z->nbytes : 0);
    return ATLAS_OK;
}

static atlas_status repack_add(cuda_load *ld, const cuda_repack *r) {
    if (ld->n_repacks == ld->cap_repacks) {
        int cap = ld->cap_repacks ? 2 * ld->cap_repacks : 64;
        cuda_repack *g = realloc(ld->repacks, (size_t)cap * sizeof *g);
        if (!g) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
        ld->repacks = g;
        ld->cap_repacks = cap;
    }
    ld->repacks[ld->n_repacks++] = *r;
    return ATLAS_OK;
}

/* A weight freed before weights_done (a failed load) is not repacked. */
static void repack_drop(cuda_load *ld, const atlas_weight *w) {
    int k = 0;
    for (int i = 0; i < ld->n_repacks; i++)
        if (ld->repacks[i].w != w) ld->repacks[k++] = ld->repacks[i];
    ld->n_repacks = k;
}

/* Both grids made at their final size and each part's stored scales and zeros queued into
 * its rows' regions, the rest of a region zero: the host tier records and copies back whole
 * regions. Each part is queued for weights_done's repack, but on a host tier's hit, whose
 * image holds the bytes repacked already. */
static atlas_status stored_upload(cuda_backend *cb, atlas_weight *w,
                                  const atlas_weight_src *const *srcs, int n) {
    cuda_load *ld = &cb->wt.load;
    size_t grid = (size_t)w->rows * w->scols * sizeof(float);
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, grid, "weight scales", &w->scales));
    w->bytes += grid;
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, grid, "weight zeros", &w->zeros));
    w->bytes += grid;
    bool hit = atlas_tier_use_hit(ld->tier);
    size_t at = 0, code_at = 0;
    for (int i = 0; i < n; i++) {
        const atlas_wquant *q = srcs[i]->quant;
        const atlas_weight_src *g[2] = {q->stored_scales, q->stored_zeros};
        size_t region = (size_t)srcs[i]->shape[0] * w->scols * sizeof(float);
        CUdeviceptr dst[2] = {w->scales + at, w->zeros + at};
        for (int k = 0; k < 2; k++) {
            queued_parts p = {.n = 2, .bytes = {g[k]->nbytes, region - g[k]->nbytes},
                              .zero = {false, true}};
            p.srcs[0] = *g[k];
            ld->pending = true;
            ld->staged_bytes += region;
            ATLAS_TRY(atlas_tier_upload(cb->dev.host, ld->tier, dst[k], region, fill_parts, &p,
                                        sizeof p));
        }
        atlas_dtype sd = g[0]->dtype;
        cuda_repack r = {.w = w, .codes = w->ptr + code_at, .scales = dst[0], .zeros = dst[1],
                         .rows = (int)srcs[i]->shape[0], .cols = (int)w->cols,
                         .groups = w->scols, .awq = q->order == ATLAS_INT4_AWQ,
                         .sdt = sd == ATLAS_DTYPE_F32 ? 0 : sd == ATLAS_DTYPE_F16 ? 1 : 2,
                         .zero_add = q->zero_add};
        if (!hit) ATLAS_TRY(repack_add(ld, &r));
        at += region;
        code_at += srcs[i]->nbytes;
    }
    return ATLAS_OK;
}

/* A part's bytes in scratch: its codes; its stored scales, then (256-aligned) its zeros. */
static size_t repack_codes(const cuda_repack *r) { return (size_t)r->rows * r->cols / 2; }
static size_t repack_scales(const cuda_repack *r) {
    return (size_t)r->rows * r->groups * (r->sdt ? 2 : 4);
}
static size_t repack_zeros_at(const cuda_repack *r) {
    return (repack_scales(r) + 255) & ~(size_t)255;
}
static size_t repack_zeros(const cuda_repack *r) { return (size_t)r->rows * r->groups / 2; }

/* One part's regions through scratch and back, in stream s's order (no programmatic
 * dependent launch: the kernels' pdl_wait returns at once). */
static atlas_status repack_one(cuda_backend *cb, cuda_repack *r, CUdeviceptr scratch,
                               CUstream s) {
    const cuda_fns *fn = &cb->mod.fn;
    int rows = r->rows, cols = r->cols, k8 = cols / 8;
    ATLAS_CU_TRY(cuMemcpyDtoDAsync, scratch, r->codes, repack_codes(r), s);
    if (r->awq) {
        void *a[] = {&r->codes, &scratch, &cols, &rows};
        ATLAS_CU_TRY(cuLaunchKernel, fn->repack_awq, (unsigned)((rows + 255) / 256),
                     (unsigned)((cols + 63) / 64), 1, 256, 1, 1, 0, s, a, NULL);
    } else {
        void *a[] = {&r->codes, &scratch, &k8, &rows};
        ATLAS_CU_TRY(cuLaunchKernel, fn->repack_gptq, (unsigned)((rows + 31) / 32),
                     (unsigned)((k8 + 31) / 32), 1, 256, 1, 1, 0, s, a, NULL);
    }
    CUdeviceptr sz = scratch + repack_zeros_at(r);
    ATLAS_CU_TRY(cuMemcpyDtoDAsync, scratch, r->scales, repack_scales(r), s);
    ATLAS_CU_TRY(cuMemcpyDtoDAsync, sz, r->zeros, repack_zeros(r), s);
    long long n = (long long)rows * r->groups, blocks = (n + 255) / 256;
    void *a[] = {&r->scales, &r->zeros, &scratch, &sz, &r->groups, &rows, &r->sdt, &r->awq,
                 &r->zero_add};
    ATLAS_CU_TRY(cuLaunchKernel, fn->repack_grids, (unsigned)(blocks < 4096 ? blocks : 4096), 1,
                 1, 256, 1, 1, 0, s, a, NULL);
    return ATLAS_OK;
}

/* The load's INT4 parts as stored, repacked once their uploads have landed, through one
 * scratch buffer of the largest part's size (freed before returning). On the registry's
 * stream, where the scratch is allocated: the copy stream while the model loads, not the
 * serving stream that another model's thread may be capturing into a graph. */
static atlas_status repack_all(cuda_backend *cb) {
    cuda_load *ld = &cb->wt.load;
    size_t need = 0;
    for (int i = 0; i < ld->n_repacks; i++) {
        const cuda_repack *r = &ld->repacks[i];
        size_t c = repack_codes(r), g = repack_zeros_at(r) + repack_zeros(r);
        if (c > need) need = c;
        if (g > need) need = g;
    }
    CUdeviceptr scratch = 0;
    CUstream s = atlas_registry_stream(cb->mod.reg);
    atlas_status st = atlas_registry_alloc(cb->mod.reg, need, "INT4 repack scratch", &scratch);
    if (st != ATLAS_OK)
        return atlas_fail_wrap(st, "cuda: repacking INT4 weights: a scratch buffer of %.1f MiB "
                               "(their largest part)", need / 1048576.0);
    for (int i = 0; st == ATLAS_OK && i < ld->n_repacks; i++)
        st = repack_one(cb, &ld->repacks[i], scratch, s);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, s);
    char msg[512]; /* the repack's error, not the free's */
    snprintf(msg, sizeof msg, "%s", st != ATLAS_OK ? atlas_last_error() : "");
    atlas_status fs = atlas_registry_free(cb->mod.reg, scratch);
    if (st != ATLAS_OK) return atlas_fail(st, "cuda: repacking INT4 weights: %s", msg);
    return fs;
}

/* Refusals name the weight and what the kernels take; the CPU runs every layout. */
static atlas_status quant_check(const atlas_weight_src *const *srcs, int n, int64_t rows,
                                int64_t cols) {
    const atlas_wquant *q0 = srcs[0]->quant;
    const char *name = srcs[0]->name, *fmt = atlas_wformat_name(q0->format);
    int e = q0->format == ATLAS_WFMT_FP8_E4M3 ? 16 : 32;
    if (q0->format != ATLAS_WFMT_FP8_E4M3 && q0->format != ATLAS_WFMT_INT4 &&
        q0->format != ATLAS_WFMT_FP4_E2M1)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: format %s", name, fmt);
    if (cols % e)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s (%s): %lld columns, the "
                          "kernels take multiples of %d; run with --device cpu", name, fmt,
                          (long long)cols, e);
    if (rows > INT_MAX / 2 || cols > INT_MAX / 2)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: %lld x %lld", name,
                          (long long)rows, (long long)cols);
    for (int i = 0; i < n; i++) {
        const atlas_wquant *q = srcs[i]->quant;
        if (!q || q->format != q0->format || q->block_rows != q0->block_rows ||
            q->block_cols != q0->block_cols || q->scale_cols != q0->scale_cols ||
            !q->g_idx != !q0->g_idx)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: fused parts of different "
                              "formats or scale layouts (%s)", name, srcs[i]->name);
        if (q0->format == ATLAS_WFMT_INT4 && q->order != q0->order)
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: fused INT4 parts in two "
                              "orders (%s)", name, srcs[i]->name);
        if (q0->format == ATLAS_WFMT_INT4 && q->order == ATLAS_INT4_PACKED && !q->zeros)
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: INT4 without zeros", name);
        if (q0->format == ATLAS_WFMT_INT4 && q->order != ATLAS_INT4_PACKED)
            ATLAS_TRY(stored_check(srcs[i]));
        /* a scale block that a part's rows do not fill would shift the next part's scales */
        if (n > 1 && i < n - 1 && srcs[i]->shape[0] % q->block_rows)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: part %s of %lld rows "
                              "in scale blocks of %d rows cannot be fused; run with --device "
                              "cpu", name, srcs[i]->name, (long long)srcs[i]->shape[0],
                              q->block_rows);
    }
    for (int i = 1; q0->g_idx && n > 3 && i < n; i++) /* the kernels tell 3 g_idx apart */
        if (memcmp(srcs[i]->quant->g_idx, q0->g_idx, (size_t)cols * sizeof(int32_t)))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: %d fused parts with "
                              "their own g_idx (at most 3)", name, n);
    int cs = shift_of(q0->block_cols);
    if (!q0->g_idx && q0->scale_cols > 1 && (cs < 4))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s (%s): scale groups of %d "
                          "columns; the kernels take powers of two from 16; run with "
                          "--device cpu", name, fmt, q0->block_cols);
    if (q0->block_rows > 1 && shift_of(q0->block_rows) < 0 && (n > 1 || q0->block_rows < rows))
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s (%s): scale blocks of %d "
                          "rows; the kernels take powers of two", name, fmt, q0->block_rows);
    return ATLAS_OK;
}

static atlas_status quant_load(cuda_backend *cb, const atlas_weight_src *const *srcs, int n,
                               int64_t rows, int64_t cols, atlas_weight **out) {
    ATLAS_TRY(quant_check(srcs, n, rows, cols));
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    ATLAS_TRY(cuda_quant_ready(cb));
    const atlas_wquant *q0 = srcs[0]->quant;
    atlas_weight *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    w->rows = rows;
    w->cols = cols;
    w->fmt = q0->format;
    w->scols = q0->scale_cols;
    w->rsh = q0->block_rows >= rows && n == 1 ? 31 : shift_of(q0->block_rows);
    w->csh = q0->scale_cols == 1 ? 31 : shift_of(q0->block_cols);
    w->p1 = w->p2 = INT_MAX;
    queued_parts codes = {.n = n}, sc = {.n = n}, zs = {.n = n}, gi = {.n = 1};
    bool same_gidx = true;
    int64_t at = 0, part_row[CUDA_FUSE_MAX];
    for (int i = 0; i < n; i++) {
        const atlas_weight_src *v = srcs[i];
        const atlas_wquant *q = v->quant;
        int64_t grid_rows = (v->shape[0] + q->block_rows - 1) / q->block_rows;
        codes.srcs[i] = *v;
        codes.bytes[i] = v->nbytes;
        sc.mem[i] = q->scales;
        sc.bytes[i] = (size_t)grid_rows * q->scale_cols * sizeof(float);
        zs.mem[i] = q->zeros;
        zs.bytes[i] = sc.bytes[i];
        if (q->g_idx && memcmp(q->g_idx, q0->g_idx, (size_t)cols * sizeof(int32_t)))
            same_gidx = false;
        part_row[i] = at;
        at += v->shape[0];
    }
    if (q0->g_idx) { /* one g_idx, or one a part when they differ (quant_check: <= 3 parts) */
        gi.n = same_gidx ? 1 : n;
        for (int i = 0; i < gi.n; i++) {
            gi.mem[i] = srcs[i]->quant->g_idx;
            gi.bytes[i] = (size_t)cols * sizeof(int32_t);
        }
        if (!same_gidx) {
            w->p1 = n > 1 ? (int)part_row[1] : INT_MAX;
            w->p2 = n > 2 ? (int)part_row[2] : INT_MAX;
        }
    }
    atlas_status st = quant_upload(cb, w, &w->ptr, &codes, srcs[0]->name);
    bool stored = q0->format == ATLAS_WFMT_INT4 && q0->order != ATLAS_INT4_PACKED;
    if (st == ATLAS_OK && stored) st = stored_upload(cb, w, srcs, n);
    if (st == ATLAS_OK && q0->format == ATLAS_WFMT_FP4_E2M1)
        st = quant_rowscale(cb, w, srcs, n, &sc);
    if (st == ATLAS_OK && !stored) st = quant_upload(cb, w, &w->scales, &sc, "weight scales");
    if (st == ATLAS_OK && q0->zeros) st = quant_upload(cb, w, &w->zeros, &zs, "weight zeros");
    if (st == ATLAS_OK && q0->g_idx) st = quant_upload(cb, w, &w->g_idx, &gi, "weight g_idx");
    if (st != ATLAS_OK) {
        char msg[512]; /* the load's error, not the free's (which destroy reports, if any) */
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        if (cb->wt.load.pending) (void)atlas_host_upload_wait(cb->dev.host);
        repack_drop(&cb->wt.load, w);
        quant_free_bufs(cb, w);
        free(w);
        return atlas_fail(st, "cuda: loading weight %s: %s", srcs[0]->name, msg);
    }
    if (!cb->wt.has_q) {
        cb->wt.has_q = true;
        cb->wt.qlayout = *q0;
        cb->wt.qlayout.scales = cb->wt.qlayout.zeros = NULL;
        cb->wt.qlayout.g_idx = NULL;
        cb->wt.qlayout.stored_scales = cb->wt.qlayout.stored_zeros = NULL;
        cb->wt.qlayout.global = q0->global > 0.0f ? 1.0f : 0.0f;
        if (q0->g_idx) cb->wt.qlayout.scale_cols = -1; /* act-order: groups of block_cols */
    }
    size_t deq = (size_t)rows * cols * 2;
    if (deq > cb->wt.deq_need) cb->wt.deq_need = deq;
    cb->wt.weight_bytes += w->bytes;
    *out = w;
    return ATLAS_OK;
}

/* Whether srcs are a mixture-of-experts layer's stacked experts (backend.h moe_experts):
 * gate|up of 2E parts [f, d] (or E parts [2f, d]: gpt-oss's, each expert's gate then up
 * rows), or down of E parts [d, f]. */
static bool expert_stack(const atlas_backend_geom *g, const atlas_weight_src *const *srcs,
                         int n) {
    int64_t E = g->n_experts, f = g->expert_ffn, d = g->hidden;
    if (E < 1 || (n != 2 * E && n != E) || srcs[0]->n_dims != 2) return false;
    int64_t rows = srcs[0]->shape[0], cols = srcs[0]->shape[1];
    bool ok = n == 2 * E ? rows == f && cols == d
                         : (rows == 2 * f && cols == d) || (rows == d && cols == f);
    if (!ok) return false;
    for (int i = 0; i < n; i++)
        if (srcs[i]->n_dims != 2 || srcs[i]->shape[0] != rows || srcs[i]->shape[1] != cols)
            return false;
    return true;
}

/* A stacked expert weight in MXFP4 (gpt-oss as published): the parts' codes one after
 * another ([rows, cols / 2] bytes) and their float32 scales likewise ([rows, cols / 32]),
 * CUDA_FUSE_MAX parts a queued piece, read packed by the MoE kernels (kernels/moe.cu): no
 * bf16 scratch copy is planned for them. Other quantized experts are refused by name. */
static atlas_status quant_load_experts(cuda_backend *cb, const atlas_weight_src *const *srcs,
                                       int n, atlas_weight **out) {
    const atlas_wquant *q0 = srcs[0]->quant;
    int64_t rows = 0, cols = srcs[0]->shape[1];
    for (int i = 0; i < n; i++) rows += srcs[i]->shape[0];
    if (q0->format != ATLAS_WFMT_FP4_E2M1 || q0->block_rows != 1 || q0->block_cols != 32 ||
        q0->scale_cols != cols / 32 || q0->global > 0.0f)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: quantized mixture-of-experts "
                          "weights (%s, scale blocks of %d x %d): the GPU kernels read bf16 or "
                          "MXFP4 experts; run with --device cpu", srcs[0]->name,
                          atlas_wformat_name(q0->format), q0->block_rows, q0->block_cols);
    ATLAS_TRY(quant_check(srcs, n, rows, cols));
    for (int i = 0; i < n; i++)
        if (srcs[i]->nbytes != (size_t)(srcs[i]->shape[0] * cols / 2))
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: %zu bytes of codes for "
                              "[%lld, %lld]", srcs[i]->name, srcs[i]->nbytes,
                              (long long)srcs[i]->shape[0], (long long)cols);
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    atlas_weight *w = calloc(1, sizeof *w);
    if (!w) return atlas_fail(ATLAS_ERR_NOMEM, "cuda: out of memory");
    *w = (atlas_weight){.rows = rows, .cols = cols, .fmt = q0->format, .scols = q0->scale_cols,
                        .rsh = 0, .csh = 5, .p1 = INT_MAX, .p2 = INT_MAX};
    size_t cbytes = (size_t)rows * cols / 2, sbytes = (size_t)rows * (cols / 32) * sizeof(float);
    atlas_status st = atlas_registry_alloc(cb->mod.reg, cbytes, srcs[0]->name, &w->ptr);
    if (st == ATLAS_OK) st = atlas_registry_alloc(cb->mod.reg, sbytes, "weight scales", &w->scales);
    size_t cat = 0, sat = 0;
    for (int i = 0; st == ATLAS_OK && i < n; i += CUDA_FUSE_MAX) {
        queued_parts c = {.n = n - i < CUDA_FUSE_MAX ? n - i : CUDA_FUSE_MAX}, s = {.n = c.n};
        size_t cb_ = 0, sb = 0;
        for (int j = 0; j < c.n; j++) {
            const atlas_weight_src *v = srcs[i + j];
            c.srcs[j] = *v;
            cb_ += c.bytes[j] = v->nbytes;
            s.mem[j] = v->quant->scales;
            sb += s.bytes[j] = (size_t)v->shape[0] * (cols / 32) * sizeof(float);
        }
        cb->wt.load.pending = true;
        cb->wt.load.staged_bytes += cb_ + sb;
        st = atlas_tier_upload(cb->dev.host, cb->wt.load.tier, w->ptr + cat, cb_, fill_parts,
                               &c, sizeof c);
        if (st == ATLAS_OK)
            st = atlas_tier_upload(cb->dev.host, cb->wt.load.tier, w->scales + sat, sb,
                                   fill_parts, &s, sizeof s);
        cat += cb_, sat += sb;
    }
    if (st != ATLAS_OK) {
        char msg[512]; /* the load's error, not the free's (which destroy reports, if any) */
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        if (cb->wt.load.pending) (void)atlas_host_upload_wait(cb->dev.host);
        quant_free_bufs(cb, w);
        free(w);
        return atlas_fail(st, "cuda: loading weight %s: %s", srcs[0]->name, msg);
    }
    w->bytes = cbytes + sbytes;
    cb->wt.weight_bytes += w->bytes;
    *out = w;
    return ATLAS_OK;
}

atlas_status cuda_weight_load(atlas_backend *be, const atlas_weight_src *const *srcs, int n,
                              atlas_weight **out) {
    cuda_backend *cb = cuda_of(be);
    *out = NULL;
    if (n < 1) return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight_load of %d tensors", n);
    if (srcs[0]->quant && expert_stack(&be->geom, srcs, n))
        return quant_load_experts(cb, srcs, n, out);
    if (n > CUDA_FUSE_MAX && srcs[0]->quant) /* quant_load keeps a fused weight's parts apart */
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: a quantized weight fused from %d "
                          "tensors (at most %d)", n, CUDA_FUSE_MAX);
    int dims = srcs[0]->n_dims;
    int64_t rows = 0, cols = dims == 2 ? srcs[0]->shape[1] : 0;
    for (int i = 0; i < n; i++) {
        const atlas_weight_src *v = srcs[i];
        /* 2-D sources stack their rows (same columns); 1-D ones (biases, norms) concatenate
         * whatever their lengths: q|k|v biases of H*hd, K*hd and K*hd under GQA */
        if (v->n_dims != dims || (dims != 1 && dims != 2) || (dims == 2 && v->shape[1] != cols))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: shape does not fuse with %s",
                              v->name, srcs[0]->name);
        if (!v->quant != !srcs[0]->quant)
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuda: weight %s: quantized and dense "
                              "parts fused", v->name);
        if (v->offset != 0 && (v->quant || dims != 1)) /* weight_fill adds it to 1-D ones */
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: an offset on a %s weight "
                              "(only norms, 1-D and dense, take one)", v->name,
                              v->quant ? "quantized" : "2-D");
        if (v->quant) {
            if (dims == 2) rows += v->shape[0];
            continue;
        }
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
    if (srcs[0]->quant) {
        if (dims != 2)
            return atlas_fail(ATLAS_ERR_INVALID, "cuda: weight %s: quantized, %d dims",
                              srcs[0]->name, dims);
        return quant_load(cb, srcs, n, rows, cols, out);
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
    w->bytes = bytes;
    atlas_status st = atlas_registry_alloc(cb->mod.reg, bytes, srcs[0]->name, &w->ptr);
    if (st == ATLAS_OK) {
        cb->wt.load.pending = true;
        st = stage_all(cb, w->ptr, srcs, n, dims == 2 ? (size_t)cols : 1);
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
    /* the host tier's fill copies the weights back while they last: it stops here */
    atlas_tier_fill_end(ld->tier_fill, 0);
    ld->tier_fill = NULL;
    /* a failed load: the loader threads may still be writing to it.  The wait's own failure
     * is the upload's, which weights_done (or the next begin_batch) reported already. */
    if (ld->pending) (void)atlas_host_upload_wait(cuda_of(be)->dev.host);
    repack_drop(ld, w);
    cuda_of(be)->wt.weight_bytes -= w->bytes;
    quant_free_bufs(cuda_of(be), w); /* a dense weight has ptr alone */
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
    atlas_status st = atlas_host_upload_wait(cb->dev.host);
    if (st == ATLAS_OK && ld->n_repacks) st = repack_all(cb);
    ld->n_repacks = 0;
    /* a fill waits for the model to serve (cuda_tier_fill), then copies the weights back */
    ld->tier_fill = atlas_tier_close(cb->dev.host, ld->tier, st == ATLAS_OK);
    ld->tier = NULL;
    return st;
}

atlas_status cuda_serving(cuda_backend *cb) {
    if (atlas_registry_stream(cb->mod.reg) == cb->dev.stream) return ATLAS_OK;
    return atlas_registry_set_stream(cb->mod.reg, cb->dev.stream);
}

atlas_status cuda_loaded(atlas_backend *be) {
    cuda_backend *cb = cuda_of(be);
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    return cuda_serving(cb);
}

void cuda_tier_fill(atlas_backend *be) { atlas_tier_fill_start(cuda_of(be)->wt.load.tier_fill); }

atlas_status cuda_host_tier(atlas_backend *be, uint64_t key, size_t budget, size_t expect,
                            int *hit, const char **off) {
    cuda_backend *cb = cuda_of(be);
    *hit = 0;
    *off = atlas_host_tier_off_reason(cb->dev.host);
    if (cb->wt.load.tier || cb->wt.load.tier_fill || cb->wt.load.pending)
        return atlas_fail(ATLAS_ERR_INVALID, "cuda: the host tier is chosen before the first "
                          "weight loads");
    ATLAS_TRY(atlas_host_tier_open(cb->dev.host, key, budget, expect, &cb->wt.load.tier));
    *hit = atlas_tier_use_hit(cb->wt.load.tier);
    return ATLAS_OK;
}
