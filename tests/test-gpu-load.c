/* tests/test-gpu-load.c — the weight load on a real GPU (label "gpu"; skips without one): a
 * load and a swap load of each fixture give the same device weights, bit for bit, all of
 * them through the pinned staging pool (the bench's count, bench/cmd/bench_internal.h); with
 * ATLAS_TEST_BIG_MODEL (a multi-shard checkpoint: tools/make_checkpoint.py) the same, timed.
 * tests/test-cuda-upload.c checks the upload through a fake driver on every machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/model.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_internal.h"
#include "harness.h"
#include "model/forward.h"
#include "model/model_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static atlas_model *load(const char *dir) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.max_batch_tokens = 64;
    p.kv_block_size = 16;
    p.kv_tokens = 256;
    atlas_model *m = NULL;
    atlas_status st = atlas_model_load(dir, &p, &m);
    CHECK_MSG(st == ATLAS_OK, "loading %s: %s", dir, atlas_last_error());
    return m;
}

/* Every device weight of a CUDA model, in model order, downloaded into one buffer. */
static unsigned char *download_weights(atlas_model *m, size_t *len) {
    const atlas_model_weights *w = &m->w;
    const atlas_weight **all = malloc(sizeof *all * (3 + 9 * (size_t)w->n_layers));
    int n = 0;
    all[n++] = w->embed;
    all[n++] = w->norm;
    if (w->lm_head != w->embed) all[n++] = w->lm_head;
    for (int l = 0; l < w->n_layers; l++) {
        const atlas_layer_weights *lw = &w->layers[l];
        const atlas_weight *lws[] = {lw->attn_norm, lw->qkv, lw->qkv_bias, lw->q_norm, lw->k_norm,
                                     lw->o, lw->mlp_norm, lw->gate_up, lw->down};
        for (int i = 0; i < 9; i++)
            if (lws[i]) all[n++] = lws[i];
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)all[i]->rows * all[i]->cols * 2;
    unsigned char *buf = malloc(total);
    size_t off = 0;
    for (int i = 0; buf && i < n; i++) {
        size_t b = (size_t)all[i]->rows * all[i]->cols * 2;
        CHECK_OK(ATLAS_CU(cuMemcpyDtoH, buf + off, all[i]->ptr, b));
        off += b;
    }
    free(all);
    *len = total;
    return buf;
}

/* A load and a swap load give the same device weights, bit for bit; every weight went
 * through the staging pool (timed: the big checkpoint is worth reading). */
static void test_load(const char *dir) {
    unsigned char *ref = NULL;
    size_t ref_len = 0;
    for (int i = 0; i < 2; i++) {
        double t0 = now_s();
        atlas_model *g = load(dir);
        double dt = now_s() - t0;
        if (!g) continue;
        atlas_bench_memory mem;
        CHECK_OK(atlas_bench_memory_get(g, &mem));
        printf("%s load %d: %.3f s (%.1f GB/s); %zu bytes staged\n", dir, i + 1, dt,
               mem.staged_bytes / 1e9 / dt, mem.staged_bytes);
        size_t len = 0;
        unsigned char *buf = download_weights(g, &len);
        CHECK_MSG(mem.staged_bytes == len, "%s: %zu bytes staged for %zu bytes of weights", dir,
                  mem.staged_bytes, len);
        if (i == 0) {
            ref = buf;
            ref_len = len;
        } else {
            CHECK_MSG(buf && ref && len == ref_len && !memcmp(buf, ref, len),
                      "%s: the swap load's weights differ from the first load's", dir);
            free(buf);
        }
        CHECK_OK(atlas_model_release(g));
    }
    free(ref);
}

int main(void) {
    char dir[2][512];
    snprintf(dir[0], sizeof dir[0], "%s/tiny-llama3", harness_data_dir());
    snprintf(dir[1], sizeof dir[1], "%s/tiny-qwen3", harness_data_dir());
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    atlas_model *probe = NULL;
    atlas_status st = atlas_model_load(dir[1], &p, &probe);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    CHECK_OK(atlas_model_release(probe));
    test_load(dir[0]);
    test_load(dir[1]);
    const char *big = getenv("ATLAS_TEST_BIG_MODEL");
    if (big && *big) test_load(big);
    else printf("big model: skipped (set ATLAS_TEST_BIG_MODEL to a checkpoint directory)\n");
    return harness_finish();
}
