/* tests/test-gpu-host.c — the two lifetimes on a real GPU (label "gpu"): one context for the
 * process, 200 model release/load cycles in it with device memory back to its baseline after
 * every release, release refused while a handle is live, rebinding refused.  Prints the
 * timings that make the case for in-process swapping (bench/RESULTS.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/registry.h"
#include "harness.h"

enum { CYCLES = 200, N_WEIGHTS = 4 };
static const size_t model_weight_bytes[2] = {(size_t)16 << 20, (size_t)24 << 20}; /* each */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n ? v[n / 2] : 0;
}

/* A stand-in for a model: every embedded module, the probe kernels, N_WEIGHTS uploaded
 * weights and a checked kernel run over the first one. */
typedef struct fake_model {
    atlas_registry *reg;
    CUfunction affine;
    CUdeviceptr w[N_WEIGHTS], out;
} fake_model;

static atlas_status model_load(atlas_host *h, int which, const uint32_t *src, fake_model *m,
                               double *modules_ms) {
    memset(m, 0, sizeof *m);
    double t0 = now_ms();
    ATLAS_TRY(atlas_registry_create(h, &m->reg));
    int n = 0;
    const atlas_kernel_image *img = atlas_kernel_images(&n);
    for (int i = 0; i < n; i++) ATLAS_TRY(atlas_registry_load_module(m->reg, img[i].name));
    ATLAS_TRY(atlas_registry_function(m->reg, "atlas_probe_affine_u32", &m->affine));
    if (modules_ms) *modules_ms = now_ms() - t0;
    size_t bytes = model_weight_bytes[which];
    for (int i = 0; i < N_WEIGHTS; i++) {
        ATLAS_TRY(atlas_registry_alloc(m->reg, bytes, "weight", &m->w[i]));
        ATLAS_TRY(atlas_host_upload_copy(h, m->w[i], src, bytes));
    }
    ATLAS_TRY(atlas_registry_alloc(m->reg, bytes, "activations", &m->out));
    return atlas_host_upload_wait(h);
}

/* out = w[0] * 2 + 1 on the GPU; checks a few words. */
static atlas_status model_run(atlas_host *h, fake_model *m, const uint32_t *src, int which,
                              int *ok) {
    uint32_t n = (uint32_t)(model_weight_bytes[which] / 4);
    void *args[] = {&m->out, &m->w[0], &n};
    ATLAS_CU_TRY(cuLaunchKernel, m->affine, (n + 255) / 256, 1, 1, 256, 1, 1, 0,
                 atlas_host_stream(h), args, NULL);
    ATLAS_CU_TRY(cuStreamSynchronize, atlas_host_stream(h));
    uint32_t got[4];
    size_t at[4] = {0, 1, n / 2, n - 1};
    *ok = 1;
    for (int i = 0; i < 4; i++) {
        ATLAS_CU_TRY(cuMemcpyDtoH, &got[i], m->out + at[i] * 4, 4);
        *ok &= got[i] == src[at[i]] * 2u + 1u;
    }
    return ATLAS_OK;
}

int main(void) {
#ifndef ATLAS_HAVE_KERNELS
    printf("SKIP: this build has no kernels (configured without nvcc)\n");
    return 77; /* ctest's skip (SKIP_RETURN_CODE) */
#endif
    double t0 = now_ms();
    atlas_host *h = NULL;
    atlas_status st = atlas_host_get(0, &h);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    double first_get_ms = now_ms() - t0;
    if (!h) return harness_finish();
    const atlas_host_props *p = atlas_host_properties(h);
    printf("device: %s, cc %d.%d, %d SMs, %.1f GiB, L2 %d MiB, smem opt-in %d KiB, driver %d\n",
           p->name, p->cc_major, p->cc_minor, p->sm_count, p->total_mem / 1073741824.0,
           p->l2_bytes >> 20, p->smem_per_block_optin >> 10, p->driver_version);
    printf("context creation (first use: dlopen + cuInit + primary context + streams): "
           "%.1f ms (atlas_host_get: %.1f ms)\n", p->init_ms, first_get_ms);
    CUcontext ctx = atlas_host_context(h);
    const atlas_driver *d = atlas_driver_get();

    /* rebinding refused; the same ordinal is the same host */
    atlas_host *h2 = NULL;
    CHECK(atlas_host_get(1, &h2) == ATLAS_ERR_INVALID && h2 == NULL);
    CHECK_OK(atlas_host_get(0, &h2));
    CHECK(h2 == h);

    size_t max_bytes = model_weight_bytes[1];
    uint32_t *src = malloc(max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++) src[i] = (uint32_t)(i * 2654435761u);

    /* warm-up: one load/run/release of each model (the driver grows the context lazily) */
    fake_model m;
    int ok = 0;
    double t = now_ms();
    for (int which = 0; which < 2; which++) {
        CHECK_OK(model_load(h, which, src, &m, NULL));
        CHECK_OK(model_run(h, &m, src, which, &ok));
        CHECK(ok);
        CHECK_OK(atlas_registry_release(m.reg));
    }
    printf("warm-up (staging pool %zu MiB pinned, 2 loads): %.1f ms\n",
           atlas_host_staging_bytes(h) >> 20, now_ms() - t);
    size_t base_free = 0, total = 0;
    CHECK_OK(atlas_host_mem_info(h, &base_free, &total));

    /* release refused while another handle is live: nothing unloaded */
    CHECK_OK(model_load(h, 0, src, &m, NULL));
    size_t loaded_free = 0;
    CHECK_OK(atlas_host_mem_info(h, &loaded_free, &total));
    atlas_registry_ref(m.reg);
    CHECK(atlas_registry_release(m.reg) == ATLAS_ERR_BUSY);
    size_t busy_free = 0;
    CHECK_OK(atlas_host_mem_info(h, &busy_free, &total));
    CHECK(busy_free == loaded_free);
    CHECK_OK(model_run(h, &m, src, 0, &ok)); /* still usable */
    CHECK(ok);
    atlas_registry_unref(m.reg);

    /* 200 cycles: release the resident model, check memory, load the other, run it */
    static double release_ms[CYCLES], load_ms[CYCLES], modules_ms[CYCLES], swap_ms[CYCLES];
    int n_modules = atlas_registry_module_count(m.reg);
    int drift = 0, bad_runs = 0;
    long long worst = 0;
    for (int c = 0; c < CYCLES; c++) {
        int next = (c + 1) % 2;
        double a = now_ms();
        atlas_status st = atlas_registry_release(m.reg);
        double b = now_ms();
        CHECK_OK(st);
        size_t fr = 0;
        CHECK_OK(atlas_host_mem_info(h, &fr, &total));
        long long diff = (long long)base_free - (long long)fr;
        if (diff != 0) drift++;
        if (llabs(diff) > llabs(worst)) worst = diff;
        double e = now_ms();
        CHECK_OK(model_load(h, next, src, &m, &modules_ms[c]));
        double f = now_ms();
        CHECK_OK(model_run(h, &m, src, next, &ok));
        bad_runs += !ok;
        release_ms[c] = b - a;
        load_ms[c] = f - e;
        swap_ms[c] = (b - a) + (f - e);
    }
    CHECK_OK(atlas_registry_release(m.reg));
    size_t end_free = 0;
    CHECK_OK(atlas_host_mem_info(h, &end_free, &total));
    CHECK_MSG(drift == 0, "free memory differed from the baseline after %d of %d releases "
              "(worst %lld bytes)", drift, CYCLES, worst);
    CHECK(end_free == base_free);
    CHECK_MSG(bad_runs == 0, "%d runs computed wrong results", bad_runs);

    /* one context the whole time */
    CUcontext cur = NULL;
    CHECK(d->cuCtxGetCurrent(&cur) == 0 && cur == ctx);
    CHECK(atlas_host_context_retains(h) == 1);

    /* module load/unload alone */
    static double mload[50], munload[50];
    for (int i = 0; i < 50; i++) {
        atlas_registry *r = NULL;
        double a = now_ms();
        CHECK_OK(atlas_registry_create(h, &r));
        int n = 0;
        const atlas_kernel_image *img = atlas_kernel_images(&n);
        for (int k = 0; k < n; k++) CHECK_OK(atlas_registry_load_module(r, img[k].name));
        double b = now_ms();
        CHECK_OK(atlas_registry_release(r));
        mload[i] = b - a;
        munload[i] = now_ms() - b;
    }

    /* upload bandwidth through the staging pool, 1 GiB */
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    size_t big = (size_t)1 << 30;
    CUdeviceptr dst = 0;
    unsigned char *hostbuf = malloc(big);
    memset(hostbuf, 7, big);
    double up_ms = 0, dma_ms = 0, memcpy_ms = 0;
    if (atlas_registry_alloc(r, big, "upload", &dst) == ATLAS_OK) {
        double a = now_ms();
        CHECK_OK(atlas_host_upload_copy(h, dst, hostbuf, big));
        CHECK_OK(atlas_host_upload_wait(h));
        up_ms = now_ms() - a;
        /* the two ceilings of that pipeline, measured alike: the copy engine from pinned
         * memory alone, and the CPU's memcpy into pinned memory alone */
        void *pinned = NULL;
        size_t chunk = ATLAS_HOST_STAGING_BYTES;
        CHECK_OK(ATLAS_CU(cuMemHostAlloc, &pinned, chunk, ATLAS_CU_MEMHOSTALLOC_PORTABLE));
        if (pinned) {
            memset(pinned, 1, chunk);
            a = now_ms();
            for (size_t off = 0; off < big; off += chunk)
                CHECK_OK(ATLAS_CU(cuMemcpyHtoDAsync, dst + off, pinned, chunk,
                                  atlas_host_copy_stream(h)));
            CHECK_OK(atlas_host_upload_wait(h));
            dma_ms = now_ms() - a;
            a = now_ms();
            for (size_t off = 0; off < big; off += chunk) memcpy(pinned, hostbuf + off, chunk);
            memcpy_ms = now_ms() - a;
            CHECK_OK(ATLAS_CU(cuMemFreeHost, pinned));
        }
    }
    CHECK_OK(atlas_registry_release(r));
    free(hostbuf);

    double mb = 0;
    for (int i = 0; i < 2; i++) mb += N_WEIGHTS * model_weight_bytes[i] / 2.0 / 1048576.0;
    printf("modules per model: %d (all embedded), %d MiB + %d MiB weights alternating\n",
           n_modules, (int)(N_WEIGHTS * model_weight_bytes[0] >> 20),
           (int)(N_WEIGHTS * model_weight_bytes[1] >> 20));
    printf("module load (%d modules + create): median %.2f ms; unload: median %.2f ms\n",
           n_modules, median(mload, 50), median(munload, 50));
    printf("model release (sync + free + unload): median %.2f ms\n", median(release_ms, CYCLES));
    printf("model load (modules + lookup + alloc + upload %.0f MiB avg): median %.2f ms "
           "(modules part %.2f ms)\n", mb, median(load_ms, CYCLES), median(modules_ms, CYCLES));
    printf("swap = release + load another: median %.2f ms over %d cycles\n",
           median(swap_ms, CYCLES), CYCLES);
    printf("free memory after each release: %s (baseline %zu MiB free of %zu MiB)\n",
           drift ? "DRIFTED" : "at baseline every time", base_free >> 20, total >> 20);
    if (up_ms > 0)
        printf("upload 1 GiB through the pinned staging pool: %.1f ms = %.1f GB/s\n", up_ms,
               1.073741824 / (up_ms / 1e3));
    if (dma_ms > 0)
        printf("ceilings, 1 GiB in 64 MiB pieces: copy engine from pinned memory %.1f GB/s; "
               "CPU memcpy into pinned memory (one thread) %.1f GB/s\n",
               1.073741824 / (dma_ms / 1e3), 1.073741824 / (memcpy_ms / 1e3));
    printf("context retains: %d\n", atlas_host_context_retains(h));
    free(src);
    return harness_finish();
}
