/* tests/test-gpu-kvcopy.c — the CUDA backend's KV block copies to host memory and back
 * (kv_save / kv_restore), on Llama-3-8B's KV geometry (32 layers, 8 kv heads of 128, blocks
 * of 16): blocks saved in a scattered order hold exactly their rows of every layer's K and V
 * as the cache lays them out, blocks restored into other ids land there and nowhere else,
 * and the time of a 4,000-token conversation's blocks (250) each way, from plain and from
 * pinned host memory, is printed (the resumed conversation's first-token target is 60 ms,
 * docs/ENGINE.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "harness.h"

enum { LAYERS = 32, KH = 8, HD = 128, BS = 16, NBLK = 300, N = 250 };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint32_t word(size_t i) { return (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 7); }

/* The host image of block id of a cache whose bytes are all[]: its rows in (layer, K|V)
 * order, each row the block's slots of that layer's pool. */
static int image_is(const uint8_t *img, const uint8_t *all, int id, size_t row, size_t pitch) {
    for (int r = 0; r < 2 * LAYERS; r++)
        if (memcmp(img + (size_t)r * row, all + (size_t)r * pitch + (size_t)id * row, row))
            return 0;
    return 1;
}

/* Times n blocks each way with images at img[i]; returns restore ms. */
static double timed(atlas_backend *be, atlas_kv *kv, const int32_t *ids, void **img,
                    const char *what) {
    double t0 = now_ms();
    CHECK_OK(be->ops->kv_save(be, kv, ids, N, img));
    double t1 = now_ms();
    CHECK_OK(be->ops->kv_restore(be, kv, ids, N, (const void *const *)img));
    CHECK_OK(ATLAS_CU(cuStreamSynchronize, ((cuda_backend *)be)->dev.stream));
    double t2 = now_ms();
    size_t bytes = (size_t)N * 2 * LAYERS * BS * KH * HD * 2;
    printf("%s: %d blocks (%.0f MiB): save %.2f ms (%.1f GB/s), restore %.2f ms (%.1f GB/s)\n",
           what, N, bytes / 1048576.0, t1 - t0, bytes / (t1 - t0) / 1e6, t2 - t1,
           bytes / (t2 - t1) / 1e6);
    return t2 - t1;
}

int main(void) {
#ifndef ATLAS_HAVE_KERNELS
    printf("SKIP: this build has no kernels (configured without nvcc)\n");
    return 77;
#endif
    atlas_host *h = NULL;
    HARNESS_SKIP_NO_DEVICE(atlas_host_get(0, &h));
    double inv_freq[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv_freq[i] = 1.0 / (i + 1);
    atlas_backend_geom g = {.hidden = 4096, .n_heads = 32, .n_kv_heads = KH, .head_dim = HD,
                            .intermediate = 1024, .vocab_size = 1024, .n_layers = LAYERS,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv_freq,
                            .rope_attn_factor = 1.0, .max_position = 8192};
    atlas_backend *be = NULL;
    atlas_kv *kv = NULL;
    CHECK_OK(atlas_backend_cuda_create(&g, NULL, &be));
    if (be) CHECK_OK(be->ops->kv_create(be, NBLK, BS, &kv));
    /* the cache's zeroing runs in stream order on the backend's stream: done before the
     * plain cuMemcpyHtoD below (stream 0 does not wait for it) */
    if (kv) CHECK_OK(be->ops->sync(be));
    if (!kv) {
        if (be) be->ops->destroy(be);
        return harness_finish();
    }
    size_t row = (size_t)BS * KH * HD * be->kv_size, pitch = row * NBLK;
    size_t total = pitch * 2 * LAYERS, img_bytes = row * 2 * LAYERS;
    uint8_t *all = malloc(total), *back = malloc(total), *imgs = malloc(img_bytes * N);
    void **img = malloc(N * sizeof *img);
    int32_t ids[N], to[N];
    for (int i = 0; i < N; i++) { /* scattered, distinct (7 and 11 are prime to 300) */
        ids[i] = (int32_t)((i * 7) % NBLK);
        to[i] = (int32_t)((i * 11 + 5) % NBLK);
        img[i] = imgs + (size_t)i * img_bytes;
    }
    for (size_t i = 0; i < total / 4; i++) ((uint32_t *)all)[i] = word(i);
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, kv->base, all, total));

    CHECK_OK(be->ops->kv_save(be, kv, ids, N, img));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !image_is(img[i], all, ids[i], row, pitch);
    CHECK_MSG(bad == 0, "%d of %d images differ from their blocks", bad, N);

    CHECK_OK(be->ops->kv_restore(be, kv, to, N, (const void *const *)img));
    CHECK_OK(ATLAS_CU(cuMemcpyDtoH, back, kv->base, total));
    /* what the restore wrote: the images at their new ids; every other block as it was */
    uint8_t *want = malloc(total);
    memcpy(want, all, total);
    for (int i = 0; i < N; i++)
        for (int r = 0; r < 2 * LAYERS; r++)
            memcpy(want + (size_t)r * pitch + (size_t)to[i] * row,
                   (uint8_t *)img[i] + (size_t)r * row, row);
    CHECK(!memcmp(back, want, total));
    CHECK(be->ops->kv_save(be, kv, (int32_t[]){NBLK}, 1, img) == ATLAS_ERR_RANGE);

    timed(be, kv, ids, img, "plain memory, scattered blocks");
    void *pinned = NULL;
    if (ATLAS_CU(cuMemHostAlloc, &pinned, img_bytes * N, 0) == ATLAS_OK) {
        void **pimg = malloc(N * sizeof *pimg);
        int32_t run[N];
        for (int i = 0; i < N; i++) pimg[i] = (uint8_t *)pinned + (size_t)i * img_bytes, run[i] = i;
        timed(be, kv, ids, pimg, "pinned memory, scattered blocks");
        timed(be, kv, run, pimg, "pinned memory, consecutive blocks");
        ATLAS_CU(cuMemFreeHost, pinned);
        free(pimg);
    }
    free(want);
    free(all);
    free(back);
    free(imgs);
    free(img);
    be->ops->kv_free(be, kv);
    be->ops->destroy(be);
    return harness_finish();
}
