/* bench/cpu/prefill_cpu.c — CPU prefill speed in CPU time, for a machine shared with other
 * work: wall time there measures the neighbours, while the CPU time of the process (all its
 * threads) divided by the thread count is what the prefill costs on cores of its own.
 *
 *   prefill_cpu [--cpu-activations fp32|bf16] DIR THREADS REPS N...
 * loads the checkpoint in DIR on the CPU backend, runs one untimed prefill of the first N,
 * then REPS rounds of a prefill of each N (one sequence of random ids from position 0) and
 * prints, a length a line, the median over rounds of N / (CPU seconds / THREADS) and of the
 * wall rate. Build: cc -O2 -Iinclude -Isrc bench/cpu/prefill_cpu.c build/libatlas.a and the
 * libraries bench/cpu/run.sh names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/model.h"
#include "model/forward.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static atlas_status prefill(atlas_model *m, const int32_t *ids, int n, int32_t *table,
                            int max_blocks) {
    int32_t *pos = malloc(sizeof(int32_t) * n), start[2] = {0, n}, ctx = n, row = n - 1, next;
    for (int i = 0; i < n; i++) pos[i] = i;
    atlas_batch b = {.n_tokens = n, .tokens = ids, .positions = pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = table,
                     .max_blocks = max_blocks, .n_logits = 1, .logit_rows = &row};
    atlas_status st = atlas_model_forward_argmax(m, &b, &next);
    free(pos);
    return st;
}

int main(int argc, char **argv) {
    atlas_cpu_activations act = ATLAS_CPU_ACT_FP32;
    if (argc > 2 && !strcmp(argv[1], "--cpu-activations")) {
        act = !strcmp(argv[2], "bf16") ? ATLAS_CPU_ACT_BF16 : ATLAS_CPU_ACT_FP32;
        argc -= 2, argv += 2;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: prefill_cpu [--cpu-activations fp32|bf16] DIR THREADS REPS N...\n");
        return 2;
    }
    int threads = atoi(argv[2]), reps = atoi(argv[3]), nl = argc - 4, most = 0;
    int *lens = malloc(sizeof(int) * nl);
    for (int i = 0; i < nl; i++) {
        lens[i] = atoi(argv[4 + i]);
        if (lens[i] > most) most = lens[i];
    }
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = threads;
    p.cpu_activations = act;
    p.load_tokenizer = 0;
    p.kv_tokens = most + 16;
    atlas_model *m = NULL;
    if (atlas_model_load(argv[1], &p, &m) != ATLAS_OK) {
        fprintf(stderr, "prefill_cpu: %s\n", atlas_last_error());
        return 1;
    }
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    int max_blocks = atlas_model_kv_blocks(m);
    int32_t *ids = malloc(sizeof(int32_t) * most), *table = malloc(sizeof(int32_t) * max_blocks);
    for (int i = 0; i < max_blocks; i++) table[i] = i;
    uint64_t rng = 88172645463325252ull;
    for (int i = 0; i < most; i++)
        ids[i] = (int32_t)((rng = rng * 6364136223846793005ull + 1) >> 33) % info.vocab_size;
    if (prefill(m, ids, lens[0], table, max_blocks) != ATLAS_OK) goto fail;
    double *cpu = malloc(sizeof(double) * reps * nl), *wall = malloc(sizeof(double) * reps * nl);
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < nl; i++) {
            double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            if (prefill(m, ids, lens[i], table, max_blocks) != ATLAS_OK) goto fail;
            cpu[i * reps + r] = lens[i] / ((clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / threads);
            wall[i * reps + r] = lens[i] / (clock_s(CLOCK_MONOTONIC) - w0);
        }
    for (int i = 0; i < nl; i++) {
        qsort(cpu + i * reps, reps, sizeof(double), cmp);
        qsort(wall + i * reps, reps, sizeof(double), cmp);
        printf("prefill %d: %.1f tok/s in CPU time / %d threads (%.1f-%.1f), wall %.1f tok/s\n",
               lens[i], cpu[i * reps + reps / 2], threads, cpu[i * reps],
               cpu[i * reps + reps - 1], wall[i * reps + reps / 2]);
    }
    atlas_model_release(m);
    return 0;
fail:
    fprintf(stderr, "prefill_cpu: %s\n", atlas_last_error());
    return 1;
}
