/* bench/cmd/bench_cuda.c — what `atlas bench` measures inside the CUDA backend: read
 * bandwidth and matrix rate of the device, GEMV rates and chains, the last decode graph's
 * replay (timed with events on the backend's stream, median of several runs after a warm-up,
 * on data that is not zeros: zeros flatter the tensor cores), the memory it holds, the
 * reference loader, where the thread runs. Outside the library: it reads the backend's state
 * (backend/cuda/cuda_backend.h), which no other front end may. */
#include "bench_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/file.h"
#include "core/threadpool.h"
#include "format/safetensors.h"

enum { REPS = 9 };

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef atlas_status (*bench_fn)(cuda_backend *cb, void *ctx);

/* Median milliseconds of REPS runs of fn after one warm-up. */
static atlas_status time_median(cuda_backend *cb, bench_fn fn, void *ctx, double *ms) {
    CUevent e0 = NULL, e1 = NULL;
    float t[REPS];
    atlas_status st = ATLAS_CU(cuEventCreate, &e0, ATLAS_CU_EVENT_DEFAULT);
    if (st == ATLAS_OK) st = ATLAS_CU(cuEventCreate, &e1, ATLAS_CU_EVENT_DEFAULT);
    if (st == ATLAS_OK) st = fn(cb, ctx);
    for (int i = 0; i < REPS && st == ATLAS_OK; i++) {
        st = ATLAS_CU(cuEventRecord, e0, cb->dev.stream);
        if (st == ATLAS_OK) st = fn(cb, ctx);
        if (st == ATLAS_OK) st = ATLAS_CU(cuEventRecord, e1, cb->dev.stream);
        if (st == ATLAS_OK) st = ATLAS_CU(cuEventSynchronize, e1);
        if (st == ATLAS_OK) st = ATLAS_CU(cuEventElapsedTime, &t[i], e0, e1);
    }
    const atlas_driver *d = atlas_driver_get();
    if (e0) d->cuEventDestroy(e0);
    if (e1) d->cuEventDestroy(e1);
    if (st != ATLAS_OK) return st;
    qsort(t, REPS, sizeof *t, cmp_float);
    *ms = t[REPS / 2];
    return ATLAS_OK;
}

static atlas_status fill(cuda_backend *cb, CUfunction f, CUdeviceptr p, size_t bytes, unsigned seed) {
    long long n = (long long)(bytes / 4);
    void *a[] = {&p, &n, &seed};
    return ATLAS_CU(cuLaunchKernel, f, 4096, 1, 1, 256, 1, 1, 0, cb->dev.stream, a, NULL);
}

typedef struct read_ctx {
    CUfunction probe;
    CUdeviceptr buf, sink;
    long long n16;
    unsigned grid;
} read_ctx;

static atlas_status run_read(cuda_backend *cb, void *ctx) {
    read_ctx *r = ctx;
    void *a[] = {&r->sink, &r->buf, &r->n16};
    return ATLAS_CU(cuLaunchKernel, r->probe, r->grid, 1, 1, 512, 1, 1, 0, cb->dev.stream, a, NULL);
}

typedef struct h2d_ctx {
    CUdeviceptr dst;
    const void *src;
    size_t bytes;
} h2d_ctx;

static atlas_status run_h2d(cuda_backend *cb, void *ctx) {
    h2d_ctx *c = ctx;
    return ATLAS_CU(cuMemcpyHtoDAsync, c->dst, c->src, c->bytes, cb->dev.stream);
}

/* Host-to-device rate from pinned memory: the floor of any model load (weights must cross
 * the bus once), reported beside load and swap times. */
static atlas_status measure_h2d(cuda_backend *cb, CUdeviceptr dst, size_t bytes,
                               atlas_bench_ceilings *out) {
    void *src = NULL;
    ATLAS_TRY(ATLAS_CU(cuMemHostAlloc, &src, bytes, ATLAS_CU_MEMHOSTALLOC_PORTABLE));
    memset(src, 0x5a, bytes); /* fault the pages in before timing */
    h2d_ctx c = {dst, src, bytes};
    double ms = 0;
    atlas_status st = time_median(cb, run_h2d, &c, &ms);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, cb->dev.stream);
    atlas_driver_get()->cuMemFreeHost(src);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "bench: timing %zu-byte host-to-device copies", bytes);
    out->h2d_bytes = bytes;
    out->h2d_gbps = (double)bytes / (ms * 1e6);
    return ATLAS_OK;
}

typedef struct gemm_ctx {
    CUdeviceptr out, x, w, xb;
    int n;
    int use_lt;
} gemm_ctx;

static atlas_status run_gemm(cuda_backend *cb, void *ctx) {
    gemm_ctx *g = ctx;
    if (g->use_lt)
        return cuda_lt_matmul(cb->mod.lt, cb->dev.stream, g->out, 0, g->xb, g->w, g->n, g->n, g->n,
                              cb->ws.lt_ws, cb->ws.lt_ws_bytes);
    CUdeviceptr bias = 0;
    void *a[] = {&g->out, &g->x, &g->w, &bias, &g->n, &g->n, &g->n};
    unsigned blocks = (unsigned)((g->n + 127) / 128);
    return ATLAS_CU(cuLaunchKernel, cb->mod.fn.gemm, blocks, blocks, 1, 256, 1, 1, 0,
                    cb->dev.stream, a, NULL);
}

static atlas_status measure(cuda_backend *cb, size_t read_bytes, int n, atlas_bench_ceilings *out,
                            CUdeviceptr *bufs) {
    CUfunction probe, fillf;
    ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, "bench"));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_read_probe", &probe));
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_fill_pattern", &fillf));
    const atlas_host_props *hp = atlas_host_properties(cb->dev.host);
    snprintf(out->device, sizeof out->device, "%.200s (sm_%d%d, %d SMs)", hp->name, hp->cc_major,
             hp->cc_minor, hp->sm_count);

    read_ctx r = {probe, 0, 0, (long long)(read_bytes / 16), (unsigned)hp->sm_count * 4};
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, read_bytes, "bench read buffer", &bufs[0]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, (size_t)r.grid * 4, "bench sink", &bufs[1]));
    r.buf = bufs[0];
    r.sink = bufs[1];
    ATLAS_TRY(fill(cb, fillf, r.buf, read_bytes, 1));
    double ms;
    ATLAS_TRY(time_median(cb, run_read, &r, &ms));
    out->read_bytes = read_bytes;
    out->read_gbps = (double)read_bytes / (ms * 1e6);
    /* pinned memory can be scarce (GB10, containers): the copy rate is optional */
    if (measure_h2d(cb, r.buf, read_bytes < ((size_t)1 << 30) ? read_bytes : (size_t)1 << 30,
                    out) != ATLAS_OK)
        fprintf(stderr, "bench: host-to-device rate not measured: %s\n", atlas_last_error());

    size_t nn = (size_t)n * n;
    gemm_ctx g = {0, 0, 0, 0, n, 0};
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, nn * 4, "bench gemm out", &bufs[2]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, nn * 4, "bench gemm x", &bufs[3]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, nn * 2, "bench gemm w", &bufs[4]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, nn * 2, "bench gemm x bf16", &bufs[5]));
    g.out = bufs[2], g.x = bufs[3], g.w = bufs[4], g.xb = bufs[5];
    ATLAS_TRY(fill(cb, fillf, g.x, nn * 4, 2));
    ATLAS_TRY(fill(cb, fillf, g.w, nn * 2, 3));
    ATLAS_TRY(fill(cb, fillf, g.xb, nn * 2, 4));
    double flop = 2.0 * n * (double)n * n;
    out->gemm_size = n;
    ATLAS_TRY(time_median(cb, run_gemm, &g, &ms));
    out->own_tflops = flop / (ms * 1e9);
    snprintf(out->lt_version, sizeof out->lt_version, "%s", cuda_lt_version(cb->mod.lt));
    if (cb->mod.lt) {
        g.use_lt = 1;
        ATLAS_TRY(time_median(cb, run_gemm, &g, &ms));
        out->lt_tflops = flop / (ms * 1e9);
    }
    return ATLAS_OK;
}

/* m's backend as the CUDA backend; else ATLAS_ERR_INVALID, "bench: <what> the CUDA
 * backend". */
static atlas_status bench_backend(atlas_model *m, const char *what, cuda_backend **cb) {
    *cb = NULL;
    atlas_backend *be = m ? atlas_model_backend(m) : NULL;
    if (!be || strcmp(be->ops->name, "cuda") != 0)
        return atlas_fail(ATLAS_ERR_INVALID, "bench: %s the CUDA backend", what);
    *cb = (cuda_backend *)be;
    return ATLAS_OK;
}

atlas_status atlas_bench_ceilings_measure(atlas_model *m, size_t read_bytes, int gemm_size,
                                          atlas_bench_ceilings *out) {
    memset(out, 0, sizeof *out);
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "the ceilings need", &cb));
    ATLAS_TRY(cuda_ready(cb));
    ATLAS_TRY(atlas_host_upload_wait(cb->dev.host));
    CUdeviceptr bufs[6] = {0};
    atlas_status st = measure(cb, read_bytes, gemm_size, out, bufs);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, cb->dev.stream);
    for (int i = 0; i < 6; i++) {
        atlas_status fs = atlas_registry_free(cb->mod.reg, bufs[i]);
        if (st == ATLAS_OK) st = fs;
    }
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "bench: measuring the device");
    return ATLAS_OK;
}

atlas_status atlas_bench_memory_get(atlas_model *m, atlas_bench_memory *out) {
    memset(out, 0, sizeof *out);
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "memory use needs", &cb));
    out->staged_bytes = cb->wt.load.staged_bytes;
    out->total = atlas_registry_alloc_bytes(cb->mod.reg);
    out->weights = cb->wt.weight_bytes;
    out->kv = cb->wt.kv_bytes;
    out->workspace = out->total - out->weights - out->kv;
    return ATLAS_OK;
}

atlas_status atlas_bench_graph_counts(atlas_model *m, uint64_t *captures, uint64_t *replays) {
    *captures = *replays = 0;
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "graph counts need", &cb));
    *captures = cb->plan.graph_captures;
    *replays = cb->plan.graph_replays;
    return ATLAS_OK;
}

atlas_status atlas_bench_fp8_act(atlas_model *m, bool on, bool *on_after) {
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "FP8 activations need", &cb));
    const atlas_wquant *l = &cb->wt.qlayout;
    if (l->format != ATLAS_WFMT_FP8_E4M3 || l->block_rows != 128 || l->block_cols != 128)
        return atlas_fail(ATLAS_ERR_INVALID, "bench: FP8 activations need FP8 weights in "
                          "128 x 128 blocks");
    if (on_after) *on_after = cb->plan.fp8_act;
    cb->plan.fp8_act = on;
    return ATLAS_OK;
}

atlas_status atlas_bench_int8_x(atlas_model *m, bool on, bool *was) {
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "int8 activations need", &cb));
    const atlas_wquant *l = &cb->wt.qlayout;
    if (l->format != ATLAS_WFMT_INT4 || l->scale_cols < 0 ||
        !cb->mod.fn.qgemv1s[CUDA_Q_INT4][CUDA_QGEMV_SX - CUDA_QGEMV_S])
        return atlas_fail(ATLAS_ERR_INVALID, "bench: int8 activations need INT4 weights in "
                          "groups");
    ATLAS_TRY(ATLAS_CU(cuStreamSynchronize, cb->dev.stream));
    cuda_plan_drop_graphs(cb);
    if (was) *was = cb->plan.int8_x;
    cb->plan.int8_x = on;
    return ATLAS_OK;
}

typedef struct gemv_ctx {
    CUfunction f;
    CUdeviceptr out, x, w;
    int n, m, k, rows_per_block, threads;
} gemv_ctx;

static atlas_status run_gemv(cuda_backend *cb, void *ctx) {
    gemv_ctx *g = ctx;
    CUdeviceptr bias = 0;
    void *a[] = {&g->out, &g->x, &g->w, &bias, &g->n, &g->m, &g->k};
    unsigned blocks = (unsigned)((g->m + g->rows_per_block - 1) / g->rows_per_block);
    return ATLAS_CU(cuLaunchKernel, g->f, blocks, 1, 1, (unsigned)g->threads, 1, 1, 0,
                    cb->dev.stream, a, NULL);
}

static atlas_status run_graph(cuda_backend *cb, void *ctx) {
    return ATLAS_CU(cuGraphLaunch, ((cuda_graph *)ctx)->exec, cb->dev.stream);
}

/* What record launches on the stream, captured in one graph and replayed; *us: a replay's
 * time / len (the launches it holds). */
typedef atlas_status (*record_fn)(cuda_backend *cb, void *ctx);
static atlas_status time_captured(cuda_backend *cb, record_fn record, void *ctx, int len,
                                  double *us) {
    const atlas_driver *d = atlas_driver_get();
    ATLAS_CU_TRY(cuStreamBeginCapture, cb->dev.stream, ATLAS_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    atlas_status st = record(cb, ctx);
    CUgraph graph = NULL;
    atlas_status end = ATLAS_CU(cuStreamEndCapture, cb->dev.stream, &graph);
    if (st == ATLAS_OK) st = end;
    cuda_graph g;
    memset(&g, 0, sizeof g);
    if (st == ATLAS_OK) st = ATLAS_CU(cuGraphInstantiateWithFlags, &g.exec, graph, 0);
    if (graph) d->cuGraphDestroy(graph);
    double ms = 0;
    if (st == ATLAS_OK) st = time_median(cb, run_graph, &g, &ms);
    if (g.exec) d->cuGraphExecDestroy(g.exec);
    *us = ms * 1e3 / len;
    return st;
}

typedef struct chain_ctx {
    const CUdeviceptr *bufs;
    atlas_weight **ws; /* the quantized chain's weights */
    int m, k, len, ng;
} chain_ctx;

static atlas_status record_gemvs(cuda_backend *cb, void *ctx) {
    chain_ctx *c = ctx;
    CUdeviceptr bias = 0, out = c->bufs[2], x = c->bufs[1];
    int n = 1, m = c->m, k = c->k, groups = (m + 3) / 4, ng = c->ng;
    if (ng < 0) ng = cuda_gemv_ng_for_grid(cb, groups, -ng);
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < c->len && st == ATLAS_OK; i++) {
        CUdeviceptr w = c->bufs[0] + (size_t)i * m * k * 2;
        void *a[] = {&out, &x, &w, &bias, &n, &m, &k, NULL};
        st = cuda_gemv_rows(cb, cb->mod.fn.gemv1b, cb->mod.fn.gemv1c[0], groups, ng, a, 8);
    }
    return st;
}

/* len GEMVs of one shape, each on its own slice of w, captured in one graph; *us: a replay's
 * time / len. ng 0: the block kernel (atlas_gemv1b), > 0 gemv1c with ng row groups a block,
 * -B gemv1c with ng from a grid of B blocks an SM (the decode's: B = 2). */
static atlas_status gemv_chain(cuda_backend *cb, const CUdeviceptr *bufs, int m, int k, int len,
                               int ng, double *us) {
    chain_ctx c = {bufs, NULL, m, k, len, ng};
    return time_captured(cb, record_gemvs, &c, len, us);
}

typedef struct qmm_ctx {
    cuda_backend *cb;
    void *out, *x;
    atlas_weight *w;
    int n;
} qmm_ctx;

/* The matmul command run at once: the op table's matmul only records it (launched at the
 * next flush), which timed nothing but the recording. */
static atlas_status run_qmm(cuda_backend *cb, void *ctx) {
    qmm_ctx *q = ctx;
    cuda_cmd c;
    memset(&c, 0, sizeof c);
    c.op = CUDA_OP_MATMUL;
    c.n = q->n;
    c.p[0] = q->out;
    c.p[1] = q->x;
    c.p[2] = q->w;
    return cuda_exec(cb, &c);
}

/* One synthetic weight of rows x cols in layout l (codes of every value but FP8's NaN). */
static atlas_status qweight_make(cuda_backend *cb, const atlas_wquant *l, int rows, int cols,
                                 atlas_weight **w) {
    bool fp8 = l->format == ATLAS_WFMT_FP8_E4M3, gidx = l->scale_cols < 0;
    int bc = l->block_cols > 0 && l->block_cols < cols ? l->block_cols : cols;
    int br = l->block_rows > 0 && l->block_rows < rows ? l->block_rows : rows;
    int scols = (cols + bc - 1) / bc, grows = (rows + br - 1) / br;
    size_t nb = fp8 ? (size_t)rows * cols : (size_t)rows * cols / 2, ns = (size_t)grows * scols;
    uint8_t *codes = malloc(nb);
    float *sc = malloc(ns * 4), *zs = malloc(ns * 4);
    int32_t *gi = malloc((size_t)cols * 4);
    atlas_status st = codes && sc && zs && gi ? ATLAS_OK : atlas_fail(ATLAS_ERR_NOMEM, "bench: "
                                                                      "out of memory");
    for (size_t i = 0; st == ATLAS_OK && i < nb; i++) codes[i] = (uint8_t)((i * 2654435761u) >> 13) & 0x77;
    for (size_t i = 0; st == ATLAS_OK && i < ns; i++) {
        sc[i] = 1e-3f;
        zs[i] = 8.0f;
    }
    for (int i = 0; st == ATLAS_OK && i < cols; i++) gi[i] = i / bc;
    atlas_wquant q = {.format = l->format, .block_rows = br, .block_cols = bc,
                      .scale_cols = scols, .scales = sc,
                      .zeros = l->format == ATLAS_WFMT_INT4 ? zs : NULL,
                      .g_idx = gidx ? gi : NULL, .global = l->global};
    atlas_weight_src src = {.name = "bench qweight", .dtype = fp8 ? ATLAS_DTYPE_F8_E4M3 : ATLAS_DTYPE_U8,
                            .n_dims = 2, .shape = {rows, cols}, .nbytes = nb, .data = codes,
                            .quant = &q};
    const atlas_weight_src *v[] = {&src};
    if (st == ATLAS_OK) st = cb->base.ops->weight_load(&cb->base, v, 1, w);
    if (st == ATLAS_OK) st = cb->base.ops->weights_done(&cb->base);
    free(codes);
    free(sc);
    free(zs);
    free(gi);
    return st;
}

static atlas_status record_qgemvs(cuda_backend *cb, void *ctx) {
    chain_ctx *c = ctx; /* bufs[0]: x, bufs[1]: out */
    atlas_status st = ATLAS_OK;
    for (int i = 0; i < c->len && st == ATLAS_OK; i++)
        st = cuda_qgemv1(cb, c->ws[i], c->bufs[1], c->bufs[0], c->ng);
    return st;
}

/* len one-row matmuls of quantized weights ws[len] (ng as cuda_qgemv1 takes it) captured in
 * one graph; *us: a replay's time / len. */
static atlas_status qgemv_chain(cuda_backend *cb, atlas_weight **ws, int len,
                                const CUdeviceptr *bufs, int ng, double *us) {
    chain_ctx c = {bufs, ws, 0, 0, len, ng};
    return time_captured(cb, record_qgemvs, &c, len, us);
}

/* profile's qchain: the o, gate_up and down shapes, 8 weights each (more than L2 holds of o). */
static atlas_status qchains(cuda_backend *cb, atlas_bench_profile *out, CUdeviceptr *bufs) {
    enum { LEN = 8 };
    static const int ngs[ATLAS_BENCH_QCHAINS] = {0, CUDA_QGEMV_X8, CUDA_QGEMV_S, CUDA_QGEMV_S4,
                                                 CUDA_QGEMV_SX};
    for (int c = 0; c < 3; c++) {
        atlas_weight *ws[LEN] = {0};
        atlas_status st = ATLAS_OK;
        int len = 0;
        for (; len < LEN && st == ATLAS_OK; len++)
            st = qweight_make(cb, &cb->wt.qlayout, out->m[1 + c], out->k[1 + c], &ws[len]);
        out->qchain_len[c] = len;
        out->qchain_bytes[c] = ws[0] ? (double)ws[0]->bytes : 0.0;
        for (int v = 0; v < ATLAS_BENCH_QCHAINS && st == ATLAS_OK; v++)
            st = qgemv_chain(cb, ws, len, bufs, ngs[v], &out->qchain_us[v][c]);
        for (int i = 0; i < LEN; i++)
            if (ws[i]) cb->base.ops->weight_free(&cb->base, ws[i]);
        ATLAS_TRY(st);
    }
    return ATLAS_OK;
}

/* The quantized matmuls of the model's layout on its first four shapes (profile's qgbps). */
static atlas_status qprofile(cuda_backend *cb, atlas_bench_profile *out, CUdeviceptr *bufs) {
    const atlas_wquant *l = &cb->wt.qlayout;
    out->qfmt = l->format == ATLAS_WFMT_FP8_E4M3 ? "fp8"
                : l->format == ATLAS_WFMT_INT4   ? (l->scale_cols < 0 ? "int4-actorder" : "int4")
                : l->global > 0.0f               ? "nvfp4"
                                                 : "fp4";
    out->q_bc = l->block_cols;
    size_t kmax = 0, mmax = 0;
    for (int i = 0; i < 4; i++) {
        kmax = (size_t)out->k[i] > kmax ? (size_t)out->k[i] : kmax;
        mmax = (size_t)out->m[i] > mmax ? (size_t)out->m[i] : mmax;
    }
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, 64 * kmax * 4, "qprofile x", &bufs[0]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, 64 * mmax * 4, "qprofile out", &bufs[1]));
    ATLAS_TRY(ATLAS_CU(cuMemsetD32, bufs[0], 0x3c000000u, 64 * kmax)); /* x = 2^-7 */
    /* the profile's variants: n rows, on the tensor-core kernels at every n they take,
     * (scratch 1) every n > 1 through the scratch copy, (2) the tensor-core kernels on x
     * split once (plan.qmma_split) with INT4's one tile of 16 rows a block, (3) the same
     * without INT4's chunk kernels (plan.qmma_chunk), or (4, 5) with INT4's 2 or 4 tiles a
     * block (plan.qmma_wide; 8 and 16 rows) */
    static const struct { int n, scratch; } runs[ATLAS_BENCH_QRUNS] = {
        {1, 0},  {16, 0}, {64, 0}, {16, 1}, {64, 1}, {32, 0}, {32, 1},
        {16, 2}, {32, 2}, {64, 2}, {16, 3}, {32, 3}, {16, 4}, {16, 5}, {8, 2}, {8, 4}, {8, 5}};
    bool split0 = cb->plan.qmma_split, chunk0 = cb->plan.qmma_chunk;
    int wide0 = cb->plan.qmma_wide;
    for (int i = 0; i < 4; i++) {
        atlas_weight *w = NULL;
        atlas_status st = qweight_make(cb, l, out->m[i], out->k[i], &w);
        if (st == ATLAS_OK) st = cuda_deq_reserve(cb);
        for (int v = 0; v < ATLAS_BENCH_QRUNS && st == ATLAS_OK; v++) {
            qmm_ctx c = {cb, (void *)(uintptr_t)bufs[1], (void *)(uintptr_t)bufs[0], w,
                         runs[v].n};
            cb->plan.qmma_max = runs[v].scratch == 1 ? 1 : CUDA_QMMA_MAX;
            cb->plan.qmma_split = runs[v].scratch >= 2;
            cb->plan.qmma_chunk = runs[v].scratch == 3 ? false : chunk0;
            cb->plan.qmma_wide = runs[v].scratch == 4 ? 2 : runs[v].scratch == 5 ? 4 : 0;
            double t = 0;
            st = time_median(cb, run_qmm, &c, &t);
            out->qgbps[v][i] = t > 0 ? (double)w->bytes / (t * 1e6) : 0.0;
        }
        cb->plan.qmma_max = 0;
        cb->plan.qmma_split = split0;
        cb->plan.qmma_chunk = chunk0;
        cb->plan.qmma_wide = wide0;
        if (w) cb->base.ops->weight_free(&cb->base, w);
        ATLAS_TRY(st);
    }
    return qchains(cb, out, bufs);
}

static atlas_status profile(cuda_backend *cb, atlas_bench_profile *out, CUdeviceptr *bufs) {
    const atlas_backend_geom *g = &cb->base.geom;
    int d = g->hidden, qd = g->n_heads * g->head_dim, f = g->intermediate;
    const char *names[] = {"qkv", "o", "gate_up", "down", "lm_head"};
    int ms[] = {qd + 2 * g->n_kv_heads * g->head_dim, d, 2 * f, d, g->vocab_size};
    int ks[] = {d, qd, d, f, d};
    size_t most = 0, kmax = 0, mmax = 0;
    for (int i = 0; i < ATLAS_BENCH_SHAPES; i++) {
        out->name[i] = names[i];
        out->m[i] = ms[i];
        out->k[i] = ks[i];
        size_t b = (size_t)ms[i] * ks[i] * 2;
        most = b > most ? b : most;
        kmax = (size_t)ks[i] > kmax ? (size_t)ks[i] : kmax;
        mmax = (size_t)ms[i] > mmax ? (size_t)ms[i] : mmax;
    }
    CUfunction fillf;
    ATLAS_TRY(atlas_registry_function(cb->mod.reg, "atlas_fill_pattern", &fillf));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, most, "profile w", &bufs[0]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, 8 * kmax * 4, "profile x", &bufs[1]));
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, 8 * mmax * 4, "profile out", &bufs[2]));
    ATLAS_TRY(fill(cb, fillf, bufs[0], most, 5));
    ATLAS_TRY(fill(cb, fillf, bufs[1], 8 * kmax * 4, 6));
    struct { CUfunction f; int n, rows, threads; } vs[ATLAS_BENCH_GEMVS] = {
        {cb->mod.fn.gemv1b, 1, 4, 256}, {cb->mod.fn.gemv8, 8, 8, 128},
        {cb->mod.fn.gemv_mma, 8, 16, 128}};
    for (int v = 0; v < ATLAS_BENCH_GEMVS; v++)
        for (int i = 0; i < ATLAS_BENCH_SHAPES; i++) {
            if (vs[v].f == cb->mod.fn.gemv_mma && ks[i] % 32) continue; /* not for this shape */
            gemv_ctx c = {vs[v].f, bufs[2], bufs[1], bufs[0], vs[v].n, ms[i], ks[i], vs[v].rows,
                          vs[v].threads};
            double t;
            ATLAS_TRY(time_median(cb, run_gemv, &c, &t));
            out->gbps[v][i] = (double)ms[i] * ks[i] * 2 / (t * 1e6);
        }
    for (int c = 0; c < 2; c++) { /* o and gate_up */
        int i = c + 1, ngs[ATLAS_BENCH_CHAINS] = {0, 2, 4, 8, -2, -4};
        size_t b = (size_t)ms[i] * ks[i] * 2;
        out->chain_shape[c] = i;
        out->chain_len[c] = most / b < 16 ? (int)(most / b) : 16;
        for (int v = 0; v < ATLAS_BENCH_CHAINS; v++)
            ATLAS_TRY(gemv_chain(cb, bufs, ms[i], ks[i], out->chain_len[c], ngs[v],
                                 &out->chain_us[v][c]));
    }
    cuda_graph *last = NULL;
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++)
        if (cb->plan.graphs[i].exec && (!last || cb->plan.graphs[i].last_use > last->last_use))
            last = &cb->plan.graphs[i];
    if (last) {
        ATLAS_TRY(time_median(cb, run_graph, last, &out->graph_ms));
        out->graph_nodes = last->n_cmds;
    }
    return cb->wt.has_q ? qprofile(cb, out, bufs + 3) : ATLAS_OK;
}

atlas_status atlas_bench_profile_decode(atlas_model *m, atlas_bench_profile *out) {
    memset(out, 0, sizeof *out);
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "the profile needs", &cb));
    ATLAS_TRY(cuda_ready(cb));
    ATLAS_TRY(atlas_registry_load_module(cb->mod.reg, "bench"));
    CUdeviceptr bufs[5] = {0};
    atlas_status st = profile(cb, out, bufs);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, cb->dev.stream);
    for (int i = 0; i < 5; i++) {
        atlas_status fs = atlas_registry_free(cb->mod.reg, bufs[i]);
        if (st == ATLAS_OK) st = fs;
    }
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "bench: profiling decode");
    return ATLAS_OK;
}

/* --- the host CPU against the GPU ---------------------------------------------------------- */

/* The first line of a sysfs file, newline dropped ("" when unreadable). */
static void read_line(const char *path, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)cap, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/* Whether a cpulist ("0-55,112-167") holds cpu. */
static bool cpulist_has(const char *list, int cpu) {
    const char *p = list;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return false;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        if (cpu >= a && cpu <= b) return true;
        if (*end != ',') break;
        p = end + 1;
    }
    return false;
}

atlas_status atlas_bench_cpu_info_get(atlas_model *m, atlas_bench_cpu_info *out) {
    memset(out, 0, sizeof *out);
    out->gpu_node = out->cpu_node = -1;
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "the CPU info needs", &cb));
    CUdevice dev = atlas_host_device(cb->dev.host);
    int dom = 0, bus = 0, slot = 0;
    ATLAS_CU_TRY(cuDeviceGetAttribute, &dom, ATLAS_CU_ATTR_PCI_DOMAIN_ID, dev);
    ATLAS_CU_TRY(cuDeviceGetAttribute, &bus, ATLAS_CU_ATTR_PCI_BUS_ID, dev);
    ATLAS_CU_TRY(cuDeviceGetAttribute, &slot, ATLAS_CU_ATTR_PCI_DEVICE_ID, dev);
    snprintf(out->pci, sizeof out->pci, "%04x:%02x:%02x.0", dom, bus, slot);
    char path[256], line[64];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", out->pci);
    read_line(path, line, sizeof line);
    if (line[0]) out->gpu_node = atoi(line);
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", out->pci);
    read_line(path, out->gpu_cpus, sizeof out->gpu_cpus);
    out->cpu = sched_getcpu();
    for (int node = 0; node < 64 && out->cpu >= 0; node++) {
        char list[1024];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
        read_line(path, list, sizeof list);
        if (list[0] && cpulist_has(list, out->cpu)) {
            out->cpu_node = node;
            break;
        }
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        size_t len = 0;
        for (int c = 0; c < CPU_SETSIZE && len + 24 < sizeof out->allowed; c++) {
            if (!CPU_ISSET(c, &set) || (c > 0 && CPU_ISSET(c - 1, &set))) continue;
            int e = c;
            while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) e++;
            len += (size_t)snprintf(out->allowed + len, sizeof out->allowed - len,
                                    e > c ? "%s%d-%d" : "%s%d", len ? "," : "", c, e);
        }
    }
    return ATLAS_OK;
}

/* --- the reference loader ------------------------------------------------------------------- */

enum { PROBE_PIECE = 64 << 20, PROBE_THREADS_MAX = 64 };

typedef struct probe_piece {
    int fd;
    uint64_t off;
    size_t n;
} probe_piece;

typedef struct file_probe {
    atlas_host *host;
    const probe_piece *pieces;
    int n_pieces, next;            /* next: the piece the next thread takes (atomic) */
    CUdeviceptr dev;               /* a piece's room for each thread, overwritten */
    void *buf[2 * PROBE_THREADS_MAX];
    CUevent done[2 * PROBE_THREADS_MAX];
    CUstream stream[PROBE_THREADS_MAX];
    pthread_mutex_t lock;
    atlas_status st;               /* the first failure, its message in why */
    char why[512];
} file_probe;

typedef struct probe_thread {
    file_probe *p;
    int t;
} probe_thread;

static void *probe_main(void *arg) {
    probe_thread *pt = arg;
    file_probe *p = pt->p;
    int t = pt->t;
    atlas_status st = atlas_host_make_current(p->host);
    for (int k = 0; st == ATLAS_OK; k++) {
        int i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (i >= p->n_pieces) break;
        int b = 2 * t + (k & 1);
        st = ATLAS_CU(cuEventSynchronize, p->done[b]);
        const probe_piece *pc = &p->pieces[i];
        if (st == ATLAS_OK) st = atlas_file_read_at(pc->fd, p->buf[b], pc->n, pc->off);
        if (st == ATLAS_OK)
            st = ATLAS_CU(cuMemcpyHtoDAsync, p->dev + (size_t)t * PROBE_PIECE, p->buf[b],
                          pc->n, p->stream[t]);
        if (st == ATLAS_OK) st = ATLAS_CU(cuEventRecord, p->done[b], p->stream[t]);
    }
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, p->stream[t]);
    if (st != ATLAS_OK) {
        pthread_mutex_lock(&p->lock);
        if (p->st == ATLAS_OK) {
            p->st = st;
            snprintf(p->why, sizeof p->why, "%s", atlas_last_error());
        }
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* Makes the buffers, streams and events of T threads (freed by probe_free). */
static atlas_status probe_make(file_probe *p, cuda_backend *cb, int T) {
    ATLAS_TRY(atlas_registry_alloc(cb->mod.reg, (size_t)T * PROBE_PIECE, "load probe", &p->dev));
    for (int b = 0; b < 2 * T; b++) {
        ATLAS_CU_TRY(cuMemHostAlloc, &p->buf[b], PROBE_PIECE, ATLAS_CU_MEMHOSTALLOC_PORTABLE);
        memset(p->buf[b], 0, PROBE_PIECE); /* the pool is made before the clock starts */
        ATLAS_CU_TRY(cuEventCreate, &p->done[b],
                     ATLAS_CU_EVENT_DISABLE_TIMING | ATLAS_CU_EVENT_BLOCKING_SYNC);
    }
    for (int t = 0; t < T; t++)
        ATLAS_CU_TRY(cuStreamCreate, &p->stream[t], ATLAS_CU_STREAM_NON_BLOCKING);
    return ATLAS_OK;
}

static void probe_free(file_probe *p, cuda_backend *cb, int T) {
    const atlas_driver *d = atlas_driver_get();
    for (int b = 0; b < 2 * T; b++) {
        if (p->buf[b]) d->cuMemFreeHost(p->buf[b]);
        if (p->done[b]) d->cuEventDestroy(p->done[b]);
    }
    for (int t = 0; t < T; t++)
        if (p->stream[t]) d->cuStreamDestroy(p->stream[t]);
    if (p->dev) (void)atlas_registry_free(cb->mod.reg, p->dev);
}

static atlas_status file_load(cuda_backend *cb, const char *const *paths, int n_paths,
                              int threads, atlas_bench_file_load *out) {
    if (threads < 1 || threads > PROBE_THREADS_MAX)
        return atlas_fail(ATLAS_ERR_INVALID, "bench: load probe with %d threads (1..%d)", threads,
                          PROBE_THREADS_MAX);
    ATLAS_TRY(atlas_host_make_current(cb->dev.host));
    int fds[64], n_fds = 0, n_pieces = 0, cap = 0;
    probe_piece *pieces = NULL;
    atlas_status st = ATLAS_OK;
    for (int f = 0; f < n_paths && st == ATLAS_OK; f++) {
        int fd = n_fds < 64 ? open(paths[f], O_RDONLY) : -1;
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            st = atlas_fail(ATLAS_ERR_IO, "bench: load probe: %s: %s", paths[f],
                            n_fds < 64 ? strerror(errno) : "more than 64 files");
            if (fd >= 0) close(fd);
            break;
        }
        fds[n_fds++] = fd;
        for (uint64_t off = 0; off < (uint64_t)sb.st_size; off += PROBE_PIECE) {
            if (n_pieces == cap) {
                cap = cap ? 2 * cap : 256;
                probe_piece *grown = realloc(pieces, (size_t)cap * sizeof *pieces);
                if (!grown) {
                    st = atlas_fail(ATLAS_ERR_NOMEM, "bench: out of memory");
                    break;
                }
                pieces = grown;
            }
            size_t left = (size_t)((uint64_t)sb.st_size - off);
            pieces[n_pieces++] = (probe_piece){fd, off, left < PROBE_PIECE ? left : PROBE_PIECE};
            out->bytes += pieces[n_pieces - 1].n;
        }
    }
    file_probe *p = st == ATLAS_OK ? calloc(1, sizeof *p) : NULL;
    if (st == ATLAS_OK && !p) st = atlas_fail(ATLAS_ERR_NOMEM, "bench: out of memory");
    if (st == ATLAS_OK) {
        *p = (file_probe){.host = cb->dev.host, .pieces = pieces, .n_pieces = n_pieces};
        pthread_mutex_init(&p->lock, NULL);
        double t0 = atlas_now_ms() / 1e3;
        st = probe_make(p, cb, threads);
        out->setup_s = atlas_now_ms() / 1e3 - t0;
        pthread_t th[PROBE_THREADS_MAX];
        probe_thread pt[PROBE_THREADS_MAX];
        int started = 0;
        t0 = atlas_now_ms() / 1e3;
        for (int t = 0; t < threads && st == ATLAS_OK; t++, started++) {
            pt[t] = (probe_thread){p, t};
            if (pthread_create(&th[t], NULL, probe_main, &pt[t]) != 0)
                st = atlas_fail(ATLAS_ERR_IO, "bench: load probe: starting thread %d", t);
        }
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        out->seconds = atlas_now_ms() / 1e3 - t0;
        if (st == ATLAS_OK && p->st != ATLAS_OK) st = atlas_fail(p->st, "%s", p->why);
        out->gbps = out->seconds > 0 ? out->bytes / 1e9 / out->seconds : 0;
        out->threads = threads;
        out->piece_bytes = PROBE_PIECE;
        probe_free(p, cb, threads);
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
    for (int f = 0; f < n_fds; f++) close(fds[f]);
    free(pieces);
    return st;
}

atlas_status atlas_bench_file_load_measure(atlas_model *m, const char *dir, int threads,
                                           atlas_bench_file_load *out) {
    memset(out, 0, sizeof *out);
    cuda_backend *cb;
    ATLAS_TRY(bench_backend(m, "the load probe needs", &cb));
    if (threads == 0) threads = atlas_cores(16); /* the issue's: 16 threads on 16 cores */
    atlas_st *st = NULL;
    ATLAS_TRY(atlas_st_open_dir(dir, &st));
    const char *paths[64];
    int n = 0;
    for (size_t i = 0; i < atlas_st_count(st); i++) { /* listed shard by shard */
        const char *f = atlas_st_at(st, i)->file;
        if (n < 64 && (n == 0 || strcmp(paths[n - 1], f))) paths[n++] = f;
    }
    atlas_status s = file_load(cb, paths, n, threads, out);
    out->files = n;
    atlas_st_free(st);
    if (s != ATLAS_OK) return atlas_fail_wrap(s, "bench: the reference load");
    return ATLAS_OK;
}
