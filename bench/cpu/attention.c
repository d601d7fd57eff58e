/* bench/cpu/attention.c — the CPU backend's prefill attention, one thread, each path this CPU
 * has (plain, AVX2, AVX-512 or NEON tiles) on the same cache and queries (Qwen3-0.6B's heads:
 * 16 q / 8 kv of 128), one sequence of N tokens from position 0, runs interleaved, each timed
 * in the thread's CPU time, median of 5; and each path's largest difference from the plain
 * one, relative to the largest output.
 *   cc ... -Isrc bench/cpu/attention.c build/libatlas.a ... && ./attention N */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "cpu_time.h"

enum { H = 16, K = 8, HD = 128, QKV = (H + 2 * K) * HD, BS = 16 };
static const char *names[] = {"plain", "avx2", "avx512", "neon"}; /* by cpu_attn_kind */

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 512, nb = (n + BS - 1) / BS;
    double inv[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv[i] = pow(1e6, -2.0 * i / HD);
    atlas_backend_geom g = {.hidden = 1024, .n_heads = H, .n_kv_heads = K, .head_dim = HD,
                            .intermediate = 3072, .vocab_size = 8, .n_layers = 1,
                            .rms_eps = 1e-6f, .rope_inv_freq = inv, .rope_attn_factor = 1.0,
                            .max_position = n};
    atlas_backend *be = NULL;
    atlas_kv *kv = NULL;
    if (atlas_backend_cpu_create(&g, 1, &be) || be->ops->kv_create(be, nb, BS, &kv))
        return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    int32_t *tok = calloc(n, 4), *pos = malloc(4 * n), *table = malloc(4 * nb);
    int32_t start[2] = {0, n}, ctx = n, row = n - 1;
    for (int i = 0; i < n; i++) pos[i] = i;
    for (int i = 0; i < nb; i++) table[i] = i;
    float *qkv = malloc(sizeof(float) * n * QKV), *out[4], *plain = NULL;
    srand(1);
    for (size_t i = 0; i < (size_t)n * QKV; i++) qkv[i] = (float)rand() / RAND_MAX * 4 - 2;
    atlas_batch b = {n, tok, pos, 1, start, &ctx, table, nb, 1, &row, NULL, 0};
    if (be->ops->begin_batch(be, &b, BS) || be->ops->kv_store(be, qkv, kv, 0))
        return fprintf(stderr, "%s\n", atlas_last_error()), 1;
    cpu_backend *cb = (cpu_backend *)be;
    double ms[4][5];
    for (int r = 0; r < 5; r++)
        for (int kind = 0; kind < 4; kind++) {
            if (!cpu_attn_kind_supported((cpu_attn_kind)kind)) continue;
            if (!r) out[kind] = malloc(sizeof(float) * n * H * HD);
            cb->attn = (cpu_attn_kind)kind;
            double t0 = cpu_ms();
            if (be->ops->attention(be, out[kind], qkv, kv, 0, NULL))
                return fprintf(stderr, "%s\n", atlas_last_error()), 1;
            ms[kind][r] = cpu_ms() - t0;
        }
    plain = out[CPU_ATTN_PLAIN];
    for (int kind = 0; kind < 4; kind++) {
        if (!cpu_attn_kind_supported((cpu_attn_kind)kind)) continue;
        double md = 0, mx = 0;
        for (size_t i = 0; i < (size_t)n * H * HD; i++) {
            if (fabs(out[kind][i] - plain[i]) > md) md = fabs(out[kind][i] - plain[i]);
            if (fabs(plain[i]) > mx) mx = fabs(plain[i]);
        }
        qsort(ms[kind], 5, sizeof(double), cmp);
        printf("%-6s %d tokens: %8.2f ms (%.2f-%.2f), %.2f GFLOP/s, vs plain %.2g\n",
               names[kind], n, ms[kind][2], ms[kind][0],
               ms[kind][4], 4.0 * H * HD * n * (n + 1) / 2 / ms[kind][2] / 1e6, md / mx);
    }
    return 0;
}
