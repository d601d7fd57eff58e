/* tests/cuda-trace/fake_libs.c — the two libraries the CUDA backend opens with dlopen, faked
 * for trace.c: built once as libcuda.so.1 (cuLaunchKernelEx: the backend looks it up in the
 * loaded driver with RTLD_NOLOAD, so the trace program links it) and once as
 * libcublasLt.so.13 (-DFAKE_LT). Each call goes to the trace program's log (trace_*, exported
 * by the program). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_LT
int trace_launch_ex(const void *config, void *f, void **params, void **extra);
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    return trace_launch_ex(config, f, params, extra);
}
#else
void trace_lt_matmul(const char *desc, const void *a, const void *b, const void *c, const void *d,
                     const void *ws, size_t ws_bytes);
typedef struct { int type; uint64_t rows, cols; int64_t ld; } layout;
typedef struct { int compute, scale, ta, tb; } desc;
int cublasLtCreate(void **h) { *h = malloc(1); return 0; }
int cublasLtDestroy(void *h) { free(h); return 0; }
size_t cublasLtGetVersion(void) { return 130000; }
int cublasLtMatmulDescCreate(desc **d, int compute, int scale) {
    *d = calloc(1, sizeof **d);
    (*d)->compute = compute;
    (*d)->scale = scale;
    return 0;
}
int cublasLtMatmulDescDestroy(desc *d) { free(d); return 0; }
int cublasLtMatmulDescSetAttribute(desc *d, int attr, const void *v, size_t n) {
    int x = 0;
    memcpy(&x, v, n < sizeof x ? n : sizeof x);
    if (attr == 3) d->ta = x;
    else if (attr == 4) d->tb = x;
    return 0;
}
int cublasLtMatrixLayoutCreate(layout **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    *l = malloc(sizeof **l);
    **l = (layout){type, rows, cols, ld};
    return 0;
}
int cublasLtMatrixLayoutDestroy(layout *l) { free(l); return 0; }
int cublasLtMatmulPreferenceCreate(void **p) { *p = malloc(1); return 0; }
int cublasLtMatmulPreferenceDestroy(void *p) { free(p); return 0; }
int cublasLtMatmulPreferenceSetAttribute(void *p, int a, const void *v, size_t n) {
    (void)p; (void)a; (void)v; (void)n;
    return 0;
}
typedef struct { uint64_t data[8]; size_t workspace; int state; float waves; int reserved[4]; } heur;
int cublasLtMatmulAlgoGetHeuristic(void *h, void *d, void *a, void *b, void *c, void *dd, void *p,
                                   int want, heur *res, int *found) {
    (void)h; (void)d; (void)a; (void)b; (void)c; (void)dd; (void)p; (void)want;
    memset(res, 0, sizeof *res);
    *found = 1;
    return 0;
}
int cublasLtMatmul(void *h, desc *d, const void *alpha, const void *A, layout *la, const void *B,
                   layout *lb, const void *beta, const void *C, layout *lc, void *D, layout *ld,
                   const void *algo, void *ws, size_t ws_bytes, void *stream) {
    (void)h; (void)algo; (void)stream;
    char s[256];
    snprintf(s, sizeof s, "compute %d scale %d op %d,%d alpha %g beta %g A %d[%llu,%llu;%lld] "
             "B %d[%llu,%llu;%lld] C %d[%llu,%llu;%lld] D %d[%llu,%llu;%lld]", d->compute,
             d->scale, d->ta, d->tb, (double)*(const float *)alpha, (double)*(const float *)beta,
             la->type, (unsigned long long)la->rows, (unsigned long long)la->cols,
             (long long)la->ld, lb->type, (unsigned long long)lb->rows,
             (unsigned long long)lb->cols, (long long)lb->ld, lc->type,
             (unsigned long long)lc->rows, (unsigned long long)lc->cols, (long long)lc->ld,
             ld->type, (unsigned long long)ld->rows, (unsigned long long)ld->cols,
             (long long)ld->ld);
    trace_lt_matmul(s, A, B, C, D, ws, ws_bytes);
    return 0;
}
#endif
