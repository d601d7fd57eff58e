/* test-gpu-quant.c — the CUDA backend's matmul of quantized weights (kernels/quant.cu) against
 * the CPU backend's (the reference: each element dequantized exactly in fp32) on the same
 * sources: every format and scale layout the kernels take (FP8 in 2-D blocks with short edge
 * blocks, per channel and per tensor; INT4 in groups of 32/64/128 and one a row, with GPTQ's
 * act-order g_idx, different in each fused part; FP4 with scales per 16 and per 32), fused
 * parts (NVFP4's with their own global factors), a bias, 1 row (the fp32 GEMV: bound 1e-5),
 * 2 to 64 (the tensor-core kernels: 1e-4 where their bf16 weights are exact, else 2e-2;
 * act-order's fp32 GEMV up to 8) and more (dequantized to bf16 for the bf16 matmuls: 2e-2),
 * one row again through each one-row kernel (one row group a block, several, the streaming
 * kernels), INT4 as GPTQ and AWQ store it repacked on the device (byte for byte), and refusals
 * of what the kernels do not take. GPU outputs are poisoned with NaN first. Skips without a
 * GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/status.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/driver.h"
#include "core/dtype.h"
#include "core/error.h"
#include "harness.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float urand(void) { return (float)((int)(next() % 20001) - 10000) / 10000.0f; }

static atlas_backend *cpu, *gpu;

/* One part of a quantized weight: its source and the memory behind it. */
typedef struct qpart {
    atlas_weight_src src;
    atlas_wquant q;
    void *codes;
    float *scales, *zeros;
    int32_t *g_idx;
} qpart;

/* rows x k in format f, scale blocks br x bc (INT4 / FP4: br 1); gidx: INT4 act-order (groups
 * of bc, columns assigned to them in a shuffled order); global > 0: NVFP4's scales, e4m3
 * values times that float32 factor (as model/quant.c makes them). */
static void qpart_make_g(qpart *p, const char *name, atlas_wformat f, int64_t rows, int64_t k,
                         int br, int bc, bool gidx, float global) {
    memset(p, 0, sizeof *p);
    bool fp8 = f == ATLAS_WFMT_FP8_E4M3;
    size_t nb = fp8 ? (size_t)(rows * k) : (size_t)(rows * k / 2);
    int scols = (int)((k + bc - 1) / bc);
    int64_t grows = (rows + br - 1) / br;
    uint8_t *c = malloc(nb);
    for (size_t i = 0; i < nb; i++) {
        c[i] = (uint8_t)next();
        if (fp8 && (c[i] & 0x7f) == 0x7f) c[i] ^= 1; /* not e4m3's NaN */
    }
    p->codes = c;
    p->scales = malloc((size_t)(grows * scols) * sizeof(float));
    for (int64_t i = 0; i < grows * scols; i++)
        p->scales[i] = global > 0.0f ? ldexpf((float)(8 + next() % 8) / 8.0f,
                                              (int)(next() % 8) - 4) * global
                                     : (float)(next() % 1000 + 1) * (fp8 ? 1e-4f : 2e-3f);
    if (f == ATLAS_WFMT_INT4) {
        p->zeros = malloc((size_t)(grows * scols) * sizeof(float));
        for (int64_t i = 0; i < grows * scols; i++) p->zeros[i] = (float)(next() % 16);
    }
    if (gidx) {
        p->g_idx = malloc((size_t)k * sizeof(int32_t));
        for (int64_t i = 0; i < k; i++) p->g_idx[i] = (int32_t)(i / bc);
        for (int64_t i = k - 1; i > 0; i--) { /* shuffled: act-order */
            int64_t j = next() % (uint32_t)(i + 1);
            int32_t t = p->g_idx[i];
            p->g_idx[i] = p->g_idx[j];
            p->g_idx[j] = t;
        }
    }
    p->q = (atlas_wquant){.format = f, .block_rows = br, .block_cols = bc, .scale_cols = scols,
                          .scales = p->scales, .zeros = p->zeros, .g_idx = p->g_idx,
                          .global = global};
    p->src = (atlas_weight_src){.name = name, .dtype = fp8 ? ATLAS_DTYPE_F8_E4M3 : ATLAS_DTYPE_U8,
                                .n_dims = 2, .shape = {rows, k}, .nbytes = nb, .data = c,
                                .quant = &p->q};
}

static void qpart_make(qpart *p, const char *name, atlas_wformat f, int64_t rows, int64_t k,
                       int br, int bc, bool gidx) {
    qpart_make_g(p, name, f, rows, k, br, bc, gidx, 0.0f);
}

static void qpart_free(qpart *p) {
    free(p->codes);
    free(p->scales);
    free(p->zeros);
    free(p->g_idx);
}

static double norm_err(const float *got, const float *want, size_t n) {
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= md)) md = d; /* NaN wins */
        if (fabs(want[i]) > ma) ma = fabs(want[i]);
    }
    return ma > 0 ? md / ma : md;
}

/* FP8 in 128 x 128 blocks on FP8 tensor cores (plan.fp8_act) at row counts past 4 and not
 * multiples of 4 (the last rows on the few-row kernels), against the CPU's weight-only
 * product: x rounded to e4m3 leaves about 3% of the largest output (bound 0.1); each row's
 * groups of 128 columns scaled apart (1x to 9x) so that a scale applied to another row or
 * group is an error far past it. Where cuBLASLt has the matmul (12.9+ on sm_90+) the plan
 * must stay on. */
static void fp8_act(const char *what, atlas_weight *wc, atlas_weight *wg, atlas_weight *bc,
                    atlas_weight *bg, int64_t k, int64_t m, void *dx, void *dout, float *x,
                    float *want, float *got) {
    cuda_backend *cb = (cuda_backend *)gpu;
    enum { N = 80 };
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < k; c++) x[r * k + c] *= (float)(1 + (r * 7 + c / 128 * 3) % 9);
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, CUDA_PTR(dx), x, (size_t)(N * k) * 4));
    const char *v = cuda_lt_version(cb->mod.lt);
    int major = 0, minor = 0;
    bool has = cb->mod.lt && sscanf(v, "%d.%d", &major, &minor) == 2 &&
               (major > 12 || (major == 12 && minor >= 9)) && cb->dev.arch.cc_major >= 9 &&
               !cb->dev.arch.portable;
    static const int ns[] = {8, 66, N};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        cb->plan.qmma_max = 1; /* every row count past the tensor-core kernels */
        cb->plan.fp8_act = true;
        CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(dout), 0x7fc00000u, (size_t)(n * m)));
        CHECK_OK(cpu->ops->matmul(cpu, want, x, wc, bc, n));
        CHECK_OK(gpu->ops->matmul(gpu, dout, dx, wg, bg, n));
        CHECK_OK(gpu->ops->download(gpu, got, dout, (size_t)(n * m)));
        double e = norm_err(got, want, (size_t)(n * m));
        CHECK_MSG(e <= 0.1, "%s, %d rows, fp8 activations: normalised error %.3g > 0.1", what, n,
                  e);
        CHECK_MSG(!has || cb->plan.fp8_act, "%s: cuBLASLt %s on sm_%d%d has no FP8 block matmul "
                  "(%s)", what, v, cb->dev.arch.cc_major, cb->dev.arch.cc_minor,
                  atlas_last_error());
        printf("  %-44s n=%-3d fp8 activations %.2e (%s)\n", what, n, e,
               k % 512 ? "k not of 4 whole blocks a row of scales: the scratch copy"
               : cb->plan.fp8_act ? "FP8 tensor cores" : "no FP8 matmul: the scratch copy");
    }
    cb->plan.qmma_max = 0;
    cb->plan.fp8_act = false;
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < k; c++) x[r * k + c] /= (float)(1 + (r * 7 + c / 128 * 3) % 9);
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, CUDA_PTR(dx), x, (size_t)(N * k) * 4));
}

/* The parts fused (and a bias) on both backends, then out = x @ w^T for each row count.
 * mma_bound: the bound of the tensor-core kernels (2 .. cuda_qmma_max rows): 1e-4 where
 * their bf16 weights are exact (a scale a chunk applied to fp32 partial sums, or NVFP4's
 * e4m3 scales with the global factor a rowscale), else 2e-2 (code x scale rounded). */
static void check(const char *what, qpart *parts, int n_parts, bool with_bias, double mma_bound) {
    const atlas_weight_src *v[4];
    int64_t m = 0, k = parts[0].src.shape[1];
    for (int i = 0; i < n_parts; i++) {
        v[i] = &parts[i].src;
        m += parts[i].src.shape[0];
    }
    atlas_weight *wc = NULL, *wg = NULL, *bc = NULL, *bg = NULL;
    CHECK_OK(cpu->ops->weight_load(cpu, v, n_parts, &wc));
    CHECK_OK(gpu->ops->weight_load(gpu, v, n_parts, &wg));
    uint16_t *bias = malloc((size_t)m * 2);
    for (int64_t i = 0; i < m; i++) bias[i] = atlas_f32_to_bf16(urand());
    atlas_weight_src bs = {.name = "bias", .dtype = ATLAS_DTYPE_BF16, .n_dims = 1,
                           .shape = {m}, .nbytes = (size_t)m * 2, .data = bias};
    const atlas_weight_src *bv[] = {&bs};
    if (with_bias) {
        CHECK_OK(cpu->ops->weight_load(cpu, bv, 1, &bc));
        CHECK_OK(gpu->ops->weight_load(gpu, bv, 1, &bg));
    }
    CHECK_OK(gpu->ops->weights_done(gpu));
    CHECK_OK(cuda_deq_reserve((cuda_backend *)gpu)); /* what begin_batch does: no batch here */
    if (!wc || !wg) return;
    enum { NMAX = 80 };
    static const int ns[] = {1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 65, NMAX};
    float *x = malloc((size_t)(NMAX * k) * 4), *want = malloc((size_t)(NMAX * m) * 4);
    float *got = malloc((size_t)(NMAX * m) * 4);
    for (int64_t i = 0; i < NMAX * k; i++) x[i] = urand();
    void *dx = NULL, *dout = NULL;
    CHECK_OK(gpu->ops->alloc(gpu, (size_t)(NMAX * k) * 4, &dx));
    CHECK_OK(gpu->ops->alloc(gpu, (size_t)(NMAX * m) * 4, &dout));
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, CUDA_PTR(dx), x, (size_t)(NMAX * k) * 4));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize));
    /* the plan as every model has it, then the tensor-core kernels at every row count they
     * take (what `atlas bench` times beside the scratch copy), then the same on x split once
     * a matmul, with INT4's chunk kernels (atlas_qmmq*) and without, and with 2 and 4 tiles
     * of 16 rows a block (atlas_qmmw*, up to 16 rows of x) */
    cuda_backend *cb = (cuda_backend *)gpu;
    static const struct { int qmma_max; bool split, chunk; int wide; } plans[] = {
        {0, true, true, -1}, {CUDA_QMMA_MAX, false, true, 0}, {CUDA_QMMA_MAX, true, true, 0},
        {CUDA_QMMA_MAX, true, false, 0}, {CUDA_QMMA_MAX, true, true, 2},
        {CUDA_QMMA_MAX, true, true, 4}};
    const size_t n_ns = sizeof ns / sizeof *ns; /* each plan runs every row count */
    bool split0 = cb->plan.qmma_split, chunk0 = cb->plan.qmma_chunk;
    int wide0 = cb->plan.qmma_wide;
    CHECK(split0 == plans[0].split && chunk0 == plans[0].chunk && wide0 == plans[0].wide);
    for (size_t u = 0; u < sizeof plans / sizeof *plans * n_ns; u++) {
        size_t pl = u / n_ns;
        int n = ns[u % n_ns];
        cb->plan.qmma_max = plans[pl].qmma_max;
        cb->plan.qmma_split = plans[pl].split;
        cb->plan.qmma_chunk = plans[pl].chunk;
        cb->plan.qmma_wide = plans[pl].wide;
        if (pl > 0 && (n < 2 || n > CUDA_QMMA_MAX || parts[0].q.g_idx)) continue;
        CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(dout), 0x7fc00000u, (size_t)(NMAX * m)));
        CHECK_OK(ATLAS_CU(cuCtxSynchronize));
        CHECK_OK(cpu->ops->matmul(cpu, want, x, wc, bc, n));
        CHECK_OK(gpu->ops->matmul(gpu, dout, dx, wg, bg, n));
        CHECK_OK(gpu->ops->download(gpu, got, dout, (size_t)(n * m)));
        /* fp32 GEMVs: 1e-5; the tensor-core kernels and the scratch copy round w to bf16 */
        bool fp32 = n == 1 || (parts[0].q.g_idx && n <= CUDA_QGEMV_MAX);
        bool mma = !parts[0].q.g_idx && n <= cuda_qmma_max(cb);
        double e = norm_err(got, want, (size_t)(n * m));
        double bound = fp32 ? 1e-5 : mma ? mma_bound : 2e-2;
        CHECK_MSG(e <= bound, "%s, %d rows, plan %zu: normalised error %.3g > %.0e", what, n,
                  pl, e, bound);
        if (n == 1 || n == 8 || n == NMAX || (pl > 0 && n == 64))
            printf("  %-44s n=%-3d plan %zu %.2e\n", what, n, pl, e);
    }
    cb->plan.qmma_max = 0;
    cb->plan.qmma_split = split0;
    cb->plan.qmma_chunk = chunk0;
    cb->plan.qmma_wide = wide0;
    if (parts[0].q.format == ATLAS_WFMT_FP8_E4M3 && parts[0].q.block_rows == 128 &&
        parts[0].q.block_cols == 128)
        fp8_act(what, wc, wg, bc, bg, k, m, dx, dout, x, want, got);
    /* one row through each one-row kernel: the one-group kernel (ng 0), several row groups a
     * block (3: the last block short, groups of more than one item where k is long enough),
     * the decode's default, the int8-x kernel and the streaming ones (8 and 4 stages, int8 x;
     * the one-group kernel where they do not take the layout); no bias (cuda_qgemv1 takes
     * none) */
    CHECK_OK(cpu->ops->matmul(cpu, want, x, wc, NULL, 1));
    static const int ngs[] = {0, 3, -CUDA_QGEMV_BPS, CUDA_QGEMV_X8, CUDA_QGEMV_S, CUDA_QGEMV_S4,
                              CUDA_QGEMV_SX};
    for (size_t t = 0; t < sizeof ngs / sizeof *ngs; t++) {
        CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(dout), 0x7fc00000u, (size_t)m));
        CHECK_OK(cuda_qgemv1((cuda_backend *)gpu, wg, CUDA_PTR(dout), CUDA_PTR(dx), ngs[t]));
        CHECK_OK(gpu->ops->download(gpu, got, dout, (size_t)m));
        double e = norm_err(got, want, (size_t)m);
        /* INT4 against int8 x (X8, SX): x rounded to 1/254 of its 32 columns' largest value */
        bool x8 = (ngs[t] == CUDA_QGEMV_X8 || ngs[t] == CUDA_QGEMV_SX) &&
                  parts[0].q.format == ATLAS_WFMT_INT4 && !parts[0].q.g_idx;
        double bound = x8 ? 1e-2 : 1e-5;
        CHECK_MSG(e <= bound, "%s, one row, ng %d: normalised error %.3g > %.0e", what, ngs[t], e,
                  bound);
        if (x8) printf("  %-44s int8 x %.2e\n", what, e);
    }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dout);
    cpu->ops->weight_free(cpu, wc);
    gpu->ops->weight_free(gpu, wg);
    if (bc) cpu->ops->weight_free(cpu, bc);
    if (bg) gpu->ops->weight_free(gpu, bg);
    free(bias);
    free(x);
    free(want);
    free(got);
}

/* One weight made and checked: rows of each part, columns, format, scale block, act-order. */
static void one(const char *what, atlas_wformat f, const int64_t *rows, int n_parts, int64_t k,
                int br, int bc, bool gidx, bool bias) {
    qpart p[3];
    for (int i = 0; i < n_parts; i++) qpart_make(&p[i], "w", f, rows[i], k, br, bc, gidx);
    /* one scale a tensor-core chunk (64 columns of FP8, 128 of INT4) and row: exact */
    int chunk = f == ATLAS_WFMT_FP8_E4M3 ? 64 : 128;
    bool exact = !gidx && f != ATLAS_WFMT_FP4_E2M1 && (bc >= k || bc % chunk == 0);
    check(what, p, n_parts, bias, exact ? 1e-4 : 2e-2);
    for (int i = 0; i < n_parts; i++) qpart_free(&p[i]);
}

/* NVFP4 fused from parts with their own global factors (q|k|v, gate|up as published). */
static void nvfp4(const char *what, const int64_t *rows, int n_parts, int64_t k, bool bias) {
    qpart p[3];
    static const float globals[3] = {3.0e-4f, 1.7e-3f, 7.1e-5f};
    for (int i = 0; i < n_parts; i++)
        qpart_make_g(&p[i], "w", ATLAS_WFMT_FP4_E2M1, rows[i], k, 1, 16, false, globals[i]);
    check(what, p, n_parts, bias, 1e-4);
    for (int i = 0; i < n_parts; i++) qpart_free(&p[i]);
}

/* A weight the kernels do not take: refused with a message naming it. */
static void refused(const char *what, atlas_wformat f, int64_t rows, int64_t k, int br, int bc,
                    const char *want) {
    qpart p;
    qpart_make(&p, "w.refused", f, rows, k, br, bc, false);
    const atlas_weight_src *v[] = {&p.src};
    atlas_weight *w = NULL;
    atlas_status st = gpu->ops->weight_load(gpu, v, 1, &w);
    CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && strstr(atlas_last_error(), "w.refused") &&
              strstr(atlas_last_error(), want), "%s: status %d, message %s", what, st,
              atlas_last_error());
    if (w) gpu->ops->weight_free(gpu, w);
    qpart_free(&p);
}

/* INT4 as GPTQ and AWQ store it (backend.h atlas_int4_order), repacked on the device at
 * weights_done: the codes and both grids of every part of a fused weight, downloaded, byte for
 * byte the packed layout and float grids of the same numbers as backend.h defines them (the
 * layout the model's host repack writes and the kernels above are checked on). Scales of
 * random bits (f16 with subnormals, bf16) or random floats; rows not a multiple of the
 * kernels' tiles. */
static void stored(const char *what, atlas_int4_order order, atlas_dtype sdt, float zero_add,
                   const int64_t *rows, int n_parts, int64_t k, int group) {
    static const int awq_nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    int64_t groups = k / group, R = 0;
    for (int p = 0; p < n_parts; p++) R += rows[p];
    size_t es = atlas_dtype_size(sdt), grid = (size_t)(R * groups);
    uint32_t *qw[4] = {0}, *qz[4] = {0};
    uint16_t *sc16[4] = {0};
    float *sc32[4] = {0};
    atlas_weight_src src[4], ssrc[4], zsrc[4];
    atlas_wquant q[4];
    const atlas_weight_src *v[4];
    uint8_t *want = calloc((size_t)(R * k / 2), 1), *got = malloc((size_t)(R * k / 2));
    float *ws = malloc(grid * 4), *wz = malloc(grid * 4), *gs = malloc(grid * 4),
          *gz = malloc(grid * 4);
    int64_t at = 0;
    for (int p = 0; p < n_parts; p++) {
        int64_t r = rows[p];
        size_t words = (size_t)(r * k / 8), zw = (size_t)(groups * r / 8);
        qw[p] = malloc(words * 4);
        qz[p] = malloc(zw * 4);
        if (es == 4) sc32[p] = malloc((size_t)(groups * r) * 4);
        else sc16[p] = malloc((size_t)(groups * r) * 2);
        for (size_t i = 0; i < words; i++) qw[p][i] = next();
        for (size_t i = 0; i < zw; i++) qz[p][i] = next();
        for (int64_t i = 0; i < groups * r; i++) {
            uint32_t b = next();
            if (es == 4) sc32[p][i] = urand() * 1e-2f;
            else if (sdt == ATLAS_DTYPE_F16) sc16[p][i] = (uint16_t)((b & 0x83ff) | (b >> 16) % 31 << 10);
            else sc16[p][i] = atlas_f32_to_bf16(urand() * 1e-2f);
        }
        for (int64_t row = 0; row < r; row++) {
            for (int64_t c = 0; c < k; c++) {
                bool g = order == ATLAS_INT4_GPTQ;
                uint32_t word = g ? qw[p][(c / 8) * r + row] : qw[p][c * (r / 8) + row / 8];
                int nib = g ? (int)(c % 8) : awq_nib[row % 8];
                want[(at + row) * (k / 2) + c / 2] |= (uint8_t)(((word >> (4 * nib)) & 0xf) << (4 * (c & 1)));
            }
            for (int64_t gi = 0; gi < groups; gi++) {
                int64_t si = gi * r + row, o = (at + row) * groups + gi;
                ws[o] = es == 4 ? sc32[p][si] : sdt == ATLAS_DTYPE_F16 ? atlas_f16_to_f32(sc16[p][si])
                                                                       : atlas_bf16_to_f32(sc16[p][si]);
                int nz = order == ATLAS_INT4_GPTQ ? (int)(row % 8) : awq_nib[row % 8];
                wz[o] = (float)((qz[p][gi * (r / 8) + row / 8] >> (4 * nz)) & 0xf) + zero_add;
            }
        }
        ssrc[p] = (atlas_weight_src){.name = "scales", .dtype = sdt, .n_dims = 2,
                                     .shape = {groups, r}, .nbytes = (size_t)(groups * r) * es,
                                     .data = es == 4 ? (void *)sc32[p] : (void *)sc16[p]};
        zsrc[p] = (atlas_weight_src){.name = "qzeros", .dtype = ATLAS_DTYPE_I32, .n_dims = 2,
                                     .shape = {groups, r / 8}, .nbytes = zw * 4, .data = qz[p]};
        q[p] = (atlas_wquant){.format = ATLAS_WFMT_INT4, .block_rows = 1, .block_cols = group,
                              .scale_cols = (int)groups, .order = order,
                              .stored_scales = &ssrc[p], .stored_zeros = &zsrc[p],
                              .zero_add = zero_add};
        src[p] = (atlas_weight_src){.name = what, .dtype = ATLAS_DTYPE_I32, .n_dims = 2,
                                    .shape = {r, k}, .nbytes = words * 4, .quant = &q[p],
                                    .data = qw[p]};
        v[p] = &src[p];
        at += r;
    }
    atlas_weight *w = NULL;
    atlas_status st = gpu->ops->weight_load(gpu, v, n_parts, &w);
    CHECK_OK(st);
    if (st == ATLAS_OK) CHECK_OK(gpu->ops->weights_done(gpu));
    if (st == ATLAS_OK) {
        const atlas_driver *d = atlas_driver_get();
        CHECK(d->cuMemcpyDtoH(got, w->ptr, (size_t)(R * k / 2)) == 0);
        CHECK(d->cuMemcpyDtoH(gs, w->scales, grid * 4) == 0);
        CHECK(d->cuMemcpyDtoH(gz, w->zeros, grid * 4) == 0);
        size_t bad = 0, first = 0;
        for (size_t i = (size_t)(R * k / 2); i-- > 0;)
            if (got[i] != want[i]) bad++, first = i;
        size_t bs = 0, bz = 0;
        for (size_t i = 0; i < grid; i++) {
            bs += memcmp(&gs[i], &ws[i], 4) != 0;
            bz += memcmp(&gz[i], &wz[i], 4) != 0;
        }
        printf("%s %s: %zu of %lld code bytes differ (first at %zu), %zu scales, %zu zeros\n",
               bad || bs || bz ? "FAIL" : "ok", what, bad, (long long)(R * k / 2), first, bs, bz);
        CHECK(bad == 0 && bs == 0 && bz == 0);
        gpu->ops->weight_free(gpu, w);
    }
    for (int p = 0; p < n_parts; p++) free(qw[p]), free(qz[p]), free(sc16[p]), free(sc32[p]);
    free(want), free(got), free(ws), free(wz), free(gs), free(gz);
}

int main(void) {
    double inv_freq[4] = {1, 1, 1, 1};
    /* the CPU backend's matmul scratch is sized by the widest of hidden and intermediate:
     * the widest k below */
    atlas_backend_geom g = {.hidden = 6144, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 6144, .vocab_size = 8, .n_layers = 1,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv_freq, .rope_attn_factor = 1.0,
                            .max_position = 16};
    atlas_status st = atlas_backend_cuda_create(&g, NULL, &gpu);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    if (st != ATLAS_OK) return harness_finish();
    CHECK_OK(atlas_backend_cpu_create(&g, 2, &cpu));
    const atlas_wformat F8 = ATLAS_WFMT_FP8_E4M3, I4 = ATLAS_WFMT_INT4, F4 = ATLAS_WFMT_FP4_E2M1;
    int64_t r1[] = {200}, r3[] = {256, 128, 128}, r3b[] = {96, 32, 32}, r2[] = {130, 66};

    one("fp8 block 128x128, edge blocks", F8, r1, 1, 320, 128, 128, false, false);
    one("fp8 block 128x128, qkv fused, bias", F8, r3, 3, 4096, 128, 128, false, true);
    int64_t r256[] = {256};
    one("fp8 block 128x128, 5 column blocks", F8, r256, 1, 640, 128, 128, false, false);
    one("fp8 per channel", F8, r1, 1, 1040, 1, 1040, false, true);
    one("fp8 per tensor", F8, r1, 1, 512, 200, 512, false, false);
    one("int4 group 128", I4, r1, 1, 4096, 1, 128, false, false);
    one("int4 group 128, two items a row group", I4, r2, 2, 6144, 1, 128, false, false);
    one("int4 group 32, fused, bias", I4, r2, 2, 1024, 1, 32, false, true);
    one("int4 group 64, 3 parts", I4, r3b, 3, 2048, 1, 64, false, false);
    one("int4 one group a row", I4, r1, 1, 544, 1, 544, false, false);
    one("int4 group 128, qkv fused, bias", I4, r3, 3, 1024, 1, 128, false, true);
    /* rows enough that a streaming kernel's block walks several turns of its ring, the last
     * one short (one warp a block: about 16 blocks an SM) */
    int64_t rmany[] = {40003};
    one("int4 group 128, 40,003 rows", I4, rmany, 1, 128, 1, 128, false, false);
    one("int4 act-order g_idx", I4, r1, 1, 1056, 1, 32, true, false);
    one("int4 act-order, a g_idx a part", I4, r3b, 3, 256, 1, 64, true, true);
    one("fp4 scales per 16 (nvfp4)", F4, r1, 1, 1024, 1, 16, false, false);
    one("fp4 scales per 32 (mxfp4), fused", F4, r2, 2, 2880, 1, 32, false, true);
    nvfp4("nvfp4 qkv fused, a global scale a part", r3, 3, 1024, true);
    nvfp4("nvfp4 gate|up fused", r2, 2, 2048, false);

    int64_t rq[] = {264, 136, 40}; /* partial tiles of 32 and 256 rows */
    stored("gptq as stored, f16 scales, qkv fused", ATLAS_INT4_GPTQ, ATLAS_DTYPE_F16, 1.0f, rq,
           3, 352, 32);
    stored("gptq v2 as stored, bf16 scales", ATLAS_INT4_GPTQ, ATLAS_DTYPE_BF16, 0.0f, r1, 1,
           4096, 128);
    stored("awq as stored, f16 scales, fused", ATLAS_INT4_AWQ, ATLAS_DTYPE_F16, 0.0f, rq, 2, 352,
           32);
    stored("awq as stored, f32 scales, 40,000 rows", ATLAS_INT4_AWQ, ATLAS_DTYPE_F32, 0.0f,
           (int64_t[]){40000}, 1, 128, 128);

    refused("fp8 of 40 columns", F8, 16, 40, 1, 40, "multiples of 16");
    refused("int4 of 48 columns", I4, 16, 48, 1, 16, "multiples of 32");
    refused("int4 groups of 96", I4, 16, 192, 1, 96, "groups of 96");

    cpu->ops->destroy(cpu);
    CHECK_OK(gpu->ops->destroy(gpu));
    return harness_finish();
}
