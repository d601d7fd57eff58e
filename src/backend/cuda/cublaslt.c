/* backend/cuda/cublaslt.c — cuBLASLt, loaded at run time when present (libcublasLt.so.13 or
 * .12), for the large matmuls of prefill. Optional: without it the engine uses its own mma
 * kernel (kernels/gemm.cu). The types and enum values below mirror cublasLt.h (CUDA 12/13)
 * so that no CUDA header is needed to build.
 *
 * out[n, m] = x[n, k] @ w[m, k]^T is, in cuBLAS's column-major terms,
 * D (m x n, ld m) = op(A = w as k x m, ld k)^T * (B = x as k x n, ld k): the "TN" case. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"
#include "core/clock.h"
#include "core/error.h"

typedef int lt_status;
typedef struct lt_opaque *lt_handle, *lt_desc, *lt_layout, *lt_pref;
typedef struct { uint64_t data[8]; } lt_algo;
typedef struct {
    lt_algo algo;
    size_t workspace;
    lt_status state;
    float waves;
    int reserved[4];
} lt_heuristic;

enum { LT_R_32F = 0, LT_R_16BF = 14, LT_R_8F_E4M3 = 28, LT_COMPUTE_32F = 68, LT_OP_N = 0,
       LT_OP_T = 1, LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_A_SCALE_POINTER = 17,
       LT_DESC_B_SCALE_POINTER = 18, LT_DESC_A_SCALE_MODE = 31, LT_DESC_B_SCALE_MODE = 32,
       LT_SCALE_VEC128 = 4, LT_SCALE_BLK128x128 = 5, LT_PREF_MAX_WORKSPACE = 1, LT_CACHE = 32,
       LT_NO_ALGO = -1 /* the heuristic found no algorithm: not a cuBLASLt status */ };

typedef struct lt_entry {
    int n, m, k, out_type, in_type, ok;
    lt_algo algo;
    size_t workspace;
} lt_entry;

struct cuda_lt {
    lt_handle h;
    char version[32];
    lt_entry cache[LT_CACHE];
    int next;
    lt_status (*create)(lt_handle *);
    lt_status (*destroy)(lt_handle);
    size_t (*get_version)(void);
    lt_status (*desc_create)(lt_desc *, int, int);
    lt_status (*desc_destroy)(lt_desc);
    lt_status (*desc_set)(lt_desc, int, const void *, size_t);
    lt_status (*layout_create)(lt_layout *, int, uint64_t, uint64_t, int64_t);
    lt_status (*layout_destroy)(lt_layout);
    lt_status (*pref_create)(lt_pref *);
    lt_status (*pref_destroy)(lt_pref);
    lt_status (*pref_set)(lt_pref, int, const void *, size_t);
    lt_status (*heuristic)(lt_handle, lt_desc, lt_layout, lt_layout, lt_layout, lt_layout,
                           lt_pref, int, lt_heuristic *, int *);
    lt_status (*matmul)(lt_handle, lt_desc, const void *, const void *, lt_layout, const void *,
                        lt_layout, const void *, const void *, lt_layout, void *, lt_layout,
                        const lt_algo *, void *, size_t, CUstream);
};

/* The library, opened once for the process and never closed (docs/ARCHITECTURE.md,
 * "Globals"): opening it took 100-300 ms of a model load on the H200 machine, in every load. */
static pthread_mutex_t lt_lib_lock = PTHREAD_MUTEX_INITIALIZER;
static void *lt_lib;
static char lt_lib_error[256];

static atlas_status lt_library(void **out) {
    pthread_mutex_lock(&lt_lib_lock);
    if (!lt_lib && !lt_lib_error[0]) {
        const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
        for (size_t i = 0; i < 3 && !lt_lib; i++) lt_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lt_lib) snprintf(lt_lib_error, sizeof lt_lib_error, "%s", dlerror());
        atlas_host_mark_cublaslt(atlas_now_ms()); /* for the start's log (atlas_host_times) */
    }
    *out = lt_lib;
    atlas_status st = lt_lib ? ATLAS_OK
                             : atlas_fail(ATLAS_ERR_NOT_FOUND, "cuBLASLt: %s", lt_lib_error);
    pthread_mutex_unlock(&lt_lib_lock);
    return st;
}

atlas_status cuda_lt_open_library(void) {
    void *dl;
    return lt_library(&dl);
}

atlas_status cuda_lt_create(cuda_lt **out) {
    *out = NULL;
    void *dl = NULL;
    ATLAS_TRY(lt_library(&dl));
    cuda_lt *lt = calloc(1, sizeof *lt);
    if (!lt) return atlas_fail(ATLAS_ERR_NOMEM, "cuBLASLt: out of memory");
    struct { void **fp; const char *name; } syms[] = {
        {(void **)&lt->create, "cublasLtCreate"}, {(void **)&lt->destroy, "cublasLtDestroy"},
        {(void **)&lt->get_version, "cublasLtGetVersion"},
        {(void **)&lt->desc_create, "cublasLtMatmulDescCreate"},
        {(void **)&lt->desc_destroy, "cublasLtMatmulDescDestroy"},
        {(void **)&lt->desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&lt->layout_create, "cublasLtMatrixLayoutCreate"},
        {(void **)&lt->layout_destroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&lt->pref_create, "cublasLtMatmulPreferenceCreate"},
        {(void **)&lt->pref_destroy, "cublasLtMatmulPreferenceDestroy"},
        {(void **)&lt->pref_set, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&lt->heuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&lt->matmul, "cublasLtMatmul"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        *syms[i].fp = dlsym(dl, syms[i].name);
        if (!*syms[i].fp) {
            atlas_status st = atlas_fail(ATLAS_ERR_NOT_FOUND, "cuBLASLt: no symbol %s",
                                         syms[i].name);
            free(lt);
            return st;
        }
    }
    lt_status s = lt->create(&lt->h);
    if (s != 0) {
        free(lt);
        return atlas_fail(ATLAS_ERR_DEVICE, "cuBLASLt: cublasLtCreate failed (status %d)", s);
    }
    size_t v = lt->get_version();
    snprintf(lt->version, sizeof lt->version, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    *out = lt;
    return ATLAS_OK;
}

atlas_status cuda_lt_free(cuda_lt *lt) {
    if (!lt) return ATLAS_OK;
    lt_status s = lt->destroy(lt->h);
    free(lt); /* the library stays open: lt_library */
    if (s != 0)
        return atlas_fail(ATLAS_ERR_DEVICE, "cublasLtDestroy failed (status %d) (%s:%d)", (int)s,
                          "cublaslt.c", __LINE__);
    return ATLAS_OK;
}

const char *cuda_lt_version(const cuda_lt *lt) { return lt ? lt->version : "absent"; }

/* A matmul's operands: bf16 x and w, or (fp8) e4m3 codes with their scales, x's a float a
 * row and 128 columns ([k / 128][n], token fastest: VEC128) and w's one a 128 x 128 block
 * ([m / 128][k / 128] row-major: BLK128x128), as cuBLASLt multiplies them on sm_90+. */
typedef struct lt_operands {
    int fp8;
    CUdeviceptr a, a_scales, w, w_scales;
} lt_operands;

static atlas_status lt_run(cuda_lt *lt, CUstream stream, CUdeviceptr out, int out_bf16,
                           const lt_operands *op, int n, int m, int k, CUdeviceptr ws,
                           size_t ws_bytes) {
    int ot = out_bf16 ? LT_R_16BF : LT_R_32F, it = op->fp8 ? LT_R_8F_E4M3 : LT_R_16BF;
    lt_desc desc = NULL;
    lt_layout la = NULL, lb = NULL, lc = NULL;
    lt_pref pref = NULL;
    int ta = LT_OP_T, tb = LT_OP_N;
    lt_status s = lt->desc_create(&desc, LT_COMPUTE_32F, LT_R_32F);
    if (!s) s = lt->desc_set(desc, LT_DESC_TRANSA, &ta, sizeof ta);
    if (!s) s = lt->desc_set(desc, LT_DESC_TRANSB, &tb, sizeof tb);
    if (op->fp8) {
        int32_t am = LT_SCALE_BLK128x128, bm = LT_SCALE_VEC128;
        const void *ap = (const void *)(uintptr_t)op->w_scales;
        const void *bp = (const void *)(uintptr_t)op->a_scales;
        /* a cuBLASLt before 12.9 knows no scale modes: no algorithm, not a failure */
        if (!s && (lt->desc_set(desc, LT_DESC_A_SCALE_MODE, &am, sizeof am) ||
                   lt->desc_set(desc, LT_DESC_B_SCALE_MODE, &bm, sizeof bm)))
            s = LT_NO_ALGO;
        if (!s) s = lt->desc_set(desc, LT_DESC_A_SCALE_POINTER, &ap, sizeof ap);
        if (!s) s = lt->desc_set(desc, LT_DESC_B_SCALE_POINTER, &bp, sizeof bp);
    }
    if (!s) s = lt->layout_create(&la, it, (uint64_t)k, (uint64_t)m, k);
    if (!s) s = lt->layout_create(&lb, it, (uint64_t)k, (uint64_t)n, k);
    if (!s) s = lt->layout_create(&lc, ot, (uint64_t)m, (uint64_t)n, m);
    lt_entry *e = NULL;
    for (int i = 0; i < LT_CACHE && !s; i++)
        if (lt->cache[i].ok && lt->cache[i].n == n && lt->cache[i].m == m &&
            lt->cache[i].k == k && lt->cache[i].out_type == ot && lt->cache[i].in_type == it)
            e = &lt->cache[i];
    if (!s && !e) {
        lt_heuristic res;
        int found = 0;
        s = lt->pref_create(&pref);
        if (!s) s = lt->pref_set(pref, LT_PREF_MAX_WORKSPACE, &ws_bytes, sizeof ws_bytes);
        if (!s) s = lt->heuristic(lt->h, desc, la, lb, lc, lc, pref, 1, &res, &found);
        if (!s && found < 1) s = LT_NO_ALGO;
        if (!s) {
            e = &lt->cache[lt->next];
            lt->next = (lt->next + 1) % LT_CACHE;
            *e = (lt_entry){n, m, k, ot, it, 1, res.algo, res.workspace};
        }
    }
    float one = 1.0f, zero = 0.0f;
    if (!s)
        s = lt->matmul(lt->h, desc, &one, (const void *)(uintptr_t)op->w, la,
                       (const void *)(uintptr_t)op->a, lb, &zero, (void *)(uintptr_t)out, lc,
                       (void *)(uintptr_t)out, lc, &e->algo, (void *)(uintptr_t)ws,
                       e->workspace, stream);
    if (pref) lt->pref_destroy(pref);
    if (lc) lt->layout_destroy(lc);
    if (lb) lt->layout_destroy(lb);
    if (la) lt->layout_destroy(la);
    if (desc) lt->desc_destroy(desc);
    if (s == LT_NO_ALGO)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "cuBLASLt %s: no %s matmul of %d x %d x %d",
                          lt->version, op->fp8 ? "fp8" : "bf16", n, m, k);
    if (s)
        return atlas_fail(ATLAS_ERR_DEVICE, "cuBLASLt: %s matmul %d x %d x %d (%s out) failed "
                          "(status %d)", op->fp8 ? "fp8" : "bf16", n, m, k,
                          out_bf16 ? "bf16" : "fp32", s);
    return ATLAS_OK;
}

atlas_status cuda_lt_matmul(cuda_lt *lt, CUstream stream, CUdeviceptr out, int out_bf16,
                            CUdeviceptr a, CUdeviceptr w, int n, int m, int k, CUdeviceptr ws,
                            size_t ws_bytes) {
    lt_operands op = {.a = a, .w = w};
    return lt_run(lt, stream, out, out_bf16, &op, n, m, k, ws, ws_bytes);
}

atlas_status cuda_lt_matmul_fp8(cuda_lt *lt, CUstream stream, CUdeviceptr out, CUdeviceptr a,
                                CUdeviceptr a_scales, CUdeviceptr w, CUdeviceptr w_scales, int n,
                                int m, int k, CUdeviceptr ws, size_t ws_bytes) {
    lt_operands op = {.fp8 = 1, .a = a, .a_scales = a_scales, .w = w, .w_scales = w_scales};
    return lt_run(lt, stream, out, 0, &op, n, m, k, ws, ws_bytes);
}
