/* bench/cpu/int4_gemv.c — one-token matmul on the CPU backend: bf16 against INT4 (groups of
 * 128, zero points) of the same shape, runs interleaved, each timed in the thread's CPU time
 * (the dev machine is shared: CPU time is the steadier figure), median of 5.
 *   cc ... bench/cpu/int4_gemv.c build/libatlas.a ... && ./int4_gemv ROWS COLS ITERS [ACT]
 * ACT: fp32 (the default) or int8 (`--cpu-activations int8`: the INT4 weights times int8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/model.h"
#include "backend/backend.h"
#include "cpu_time.h"

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? atoll(argv[1]) : 2048, cols = argc > 2 ? atoll(argv[2]) : 768;
    int iters = argc > 3 ? atoi(argv[3]) : 200, g = 128;
    atlas_backend_geom geom = {.hidden = (int)cols, .n_heads = 1, .n_kv_heads = 1,
                               .head_dim = 8, .intermediate = (int)cols, .vocab_size = 8,
                               .n_layers = 1, .rms_eps = 1e-5f, .max_position = 16};
    double inv[4] = {1, 1, 1, 1};
    geom.rope_inv_freq = inv;
    atlas_backend *be = NULL;
    if (atlas_backend_cpu_create(&geom, 1, &be)) return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    if (argc > 4 && !strcmp(argv[4], "int8") && atlas_backend_cpu_set_activations(be, ATLAS_CPU_ACT_INT8))
        return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    uint16_t *wb = malloc((size_t)(rows * cols) * 2);
    uint8_t *wq = malloc((size_t)(rows * cols / 2));
    int64_t ns = rows * ((cols + g - 1) / g);
    float *s = malloc((size_t)ns * 4), *z = malloc((size_t)ns * 4), *x = malloc((size_t)cols * 4);
    float *out = malloc((size_t)rows * 4);
    srand(1);
    for (int64_t i = 0; i < rows * cols; i++) wb[i] = (uint16_t)(0x3c00 + rand() % 0x200);
    for (int64_t i = 0; i < rows * cols / 2; i++) wq[i] = (uint8_t)rand();
    for (int64_t i = 0; i < ns; i++) s[i] = 0.01f, z[i] = 8.0f;
    for (int64_t i = 0; i < cols; i++) x[i] = (float)(rand() % 100) / 100.0f;
    atlas_wquant q = {ATLAS_WFMT_INT4, 1, g, (int)((cols + g - 1) / g), s, z, NULL};
    atlas_weight_src sb = {.name = "bf16", .dtype = ATLAS_DTYPE_BF16, .n_dims = 2,
                           .shape = {rows, cols}, .nbytes = (size_t)(rows * cols) * 2, .data = wb};
    atlas_weight_src sq = {.name = "int4", .dtype = ATLAS_DTYPE_U8, .n_dims = 2,
                           .shape = {rows, cols}, .nbytes = (size_t)(rows * cols / 2),
                           .data = wq, .quant = &q};
    const atlas_weight_src *pb = &sb, *pq = &sq;
    atlas_weight *w[2] = {NULL, NULL};
    if (be->ops->weight_load(be, &pb, 1, &w[0]) || be->ops->weight_load(be, &pq, 1, &w[1]))
        return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    double t[2][5];
    for (int rep = 0; rep < 5; rep++)
        for (int f = 0; f < 2; f++) {
            double t0 = cpu_ms();
            for (int i = 0; i < iters; i++) be->ops->matmul(be, out, x, w[f], NULL, 1);
            t[f][rep] = (cpu_ms() - t0) / iters;
        }
    for (int f = 0; f < 2; f++) qsort(t[f], 5, sizeof(double), cmp);
    printf("%lld x %lld, one token, CPU ms a matmul (median of 5 interleaved): bf16 %.4f, "
           "INT4 g%d %.4f: %.2fx\n", (long long)rows, (long long)cols, t[0][2], g, t[1][2],
           t[0][2] / t[1][2]);
    return 0;
}
