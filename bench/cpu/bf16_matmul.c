/* bench/cpu/bf16_matmul.c — the CPU backend's bf16 matmul, one thread, each kernel this CPU
 * has (AVX2 tiles, AVX-512 F32, NEON, AVX512_BF16 dot products) on the same weight and tokens, runs
 * interleaved, each timed in the thread's CPU time, median of 5; and each kernel's largest
 * error against a double sum over the fp32 activations, relative to the largest output.
 *   cc ... -Isrc bench/cpu/bf16_matmul.c build/libatlas.a ... && ./bf16_matmul ROWS COLS N ITERS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "cpu_time.h"

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? atoll(argv[1]) : 3072, cols = argc > 2 ? atoll(argv[2]) : 1024;
    int n = argc > 3 ? atoi(argv[3]) : 1, iters = argc > 4 ? atoi(argv[4]) : 20;
    atlas_backend_geom geom = {.hidden = (int)cols, .n_heads = 1, .n_kv_heads = 1,
                               .head_dim = 8, .intermediate = (int)cols, .vocab_size = 8,
                               .n_layers = 1, .rms_eps = 1e-5f, .max_position = 16};
    double inv[4] = {1, 1, 1, 1};
    geom.rope_inv_freq = inv;
    atlas_backend *be = NULL;
    if (atlas_backend_cpu_create(&geom, 1, &be)) return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    uint16_t *wb = malloc((size_t)(rows * cols) * 2);
    float *x = malloc((size_t)(cols * n) * 4), *out = malloc((size_t)(rows * n) * 4);
    srand(1);
    for (int64_t i = 0; i < rows * cols; i++)
        wb[i] = atlas_f32_to_bf16(((float)rand() / RAND_MAX - 0.5f) * 0.06f);
    for (int64_t i = 0; i < cols * n; i++) x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    atlas_weight_src sb = {.name = "bf16", .dtype = ATLAS_DTYPE_BF16, .n_dims = 2,
                           .shape = {rows, cols}, .nbytes = (size_t)(rows * cols) * 2, .data = wb};
    const atlas_weight_src *pb = &sb;
    atlas_weight *w = NULL;
    if (be->ops->weight_load(be, &pb, 1, &w)) return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    /* the error: 64 rows of the first token against a double sum */
    double want[64], wmax = 0;
    for (int r = 0; r < 64; r++) {
        want[r] = 0;
        for (int64_t i = 0; i < cols; i++) want[r] += (double)atlas_bf16_to_f32(wb[r * cols + i]) * x[i];
        if (fabs(want[r]) > wmax) wmax = fabs(want[r]);
    }
    const char *names[] = {"avx2", "f32", "neon", "dot"};
    double t[4][5] = {{0}}, err[4] = {0};
    cpu_backend *cb = (cpu_backend *)be;
    for (int rep = 0; rep < 5; rep++)
        for (int kd = 0; kd <= CPU_BF16_DOT; kd++) {
            if (kd && !cpu_bf16_kind_supported((cpu_bf16_kind)kd)) continue;
            cb->bf16 = (cpu_bf16_kind)kd;
            double t0 = cpu_ms();
            for (int i = 0; i < iters; i++) be->ops->matmul(be, out, x, w, NULL, n);
            t[kd][rep] = (cpu_ms() - t0) / iters;
            for (int r = 0; r < 64; r++)
                if (fabs(out[r] - want[r]) / wmax > err[kd]) err[kd] = fabs(out[r] - want[r]) / wmax;
        }
    printf("%lld x %lld, %d token(s), one thread, CPU ms a matmul (median of 5 interleaved):\n",
           (long long)rows, (long long)cols, n);
    for (int kd = 0; kd <= CPU_BF16_DOT; kd++) {
        if (kd && !cpu_bf16_kind_supported((cpu_bf16_kind)kd)) continue;
        qsort(t[kd], 5, sizeof(double), cmp);
        double gmacs = (double)rows * cols * n / (t[kd][2] * 1e6);
        printf("  %-4s %8.3f ms  %6.1f GMAC/s  %5.1f GB/s of weights  err %.2e  (%.2fx avx2)\n",
               names[kd], t[kd][2], gmacs, rows * cols * 2.0 / (t[kd][2] * 1e6), err[kd],
               t[0][2] / t[kd][2]);
    }
    be->ops->weight_free(be, w);
    be->ops->destroy(be);
    return 0;
}
