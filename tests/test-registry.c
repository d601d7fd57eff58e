/* tests/test-registry.c — the host and the per-model registry through the fake driver
 * (tests/fake_cuda.h): CI has no GPU.  The fake counts contexts, modules and allocations
 * (backed by malloc, so that copies are real) and injects failures; tests/test-gpu-host.c
 * runs the same paths on a real GPU.  The registry's tests run with the fake's memory pools
 * (stream-ordered allocation) and again, in a child, on a device without them. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/registry.h"
#include "fake_cuda.h"
#include "harness.h"

/* --- helpers ------------------------------------------------------------------------------ */

#define HAS(s) CHECK_MSG(strstr(atlas_last_error(), (s)) != NULL, "want '%s' in: %s", (s), \
                         atlas_last_error())

static void install_fake(int device_count) { CHECK_OK(fake_cuda_install(device_count)); }

static fake_cuda_stats stats(void) { return fake_cuda_get_stats(); }

/* Whether the device has memory pools (the fake's default), and the calls messages name. */
static int pools = 1;
static const char *free_call(void) { return pools ? "cuMemFreeAsync" : "cuMemFree"; }

/* HAS of a+b. */
#define HAS2(a, b) do { char want_[256]; snprintf(want_, sizeof want_, "%s%s", (a), (b)); \
                        HAS(want_); } while (0)

/* The thread's current context, through the driver as atlas sees it. */
static CUcontext current(void) {
    CUcontext c = NULL;
    atlas_driver_get()->cuCtxGetCurrent(&c);
    return c;
}

/* --- host binding ------------------------------------------------------------------------- */

static void scenario_no_device(void) {
    install_fake(0);
    atlas_host *h = NULL;
    CHECK(atlas_host_get(0, &h) == ATLAS_ERR_NO_DEVICE && h == NULL);
    HAS("no CUDA device");
    CHECK(strcmp(atlas_host_unavailable_reason(), "no CUDA device") == 0);
}

static void scenario_bad_ordinal_then_retain_failure(void) {
    install_fake(2);
    atlas_host *h = NULL;
    CHECK(atlas_host_get(2, &h) == ATLAS_ERR_NO_DEVICE);
    HAS("GPU 2 requested, but the driver sees 2 device(s)");
    /* a failed context retain leaves nothing bound and nothing retained; a retry works */
    fake_cuda_fail_next(FAKE_CU_RETAIN);
    CHECK(atlas_host_get(1, &h) == ATLAS_ERR_DEVICE_NOMEM);
    HAS("cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    HAS("src/backend/cuda/host.c:");
    CHECK(stats().retains == 0);
    CHECK_OK(atlas_host_get(1, &h));
    CHECK(h && atlas_host_properties(h)->ordinal == 1);
    CHECK(strcmp(atlas_host_properties(h)->name, "Fake GPU 1") == 0);
    CHECK(atlas_host_get(0, &h) == ATLAS_ERR_INVALID);
    HAS("GPU 0 requested, but this process is bound to GPU 1");
}

static void *thread_get_host(void *arg) {
    atlas_host *h = NULL;
    atlas_driver_get()->cuCtxSetCurrent(NULL);
    atlas_status st = atlas_host_get(0, &h);
    int ok = st == ATLAS_OK && h == arg && current() == atlas_host_context(h);
    return ok ? arg : NULL;
}

static void test_host(atlas_host **out) {
    atlas_host *h = NULL, *h2 = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    CHECK(h != NULL);
    if (!h) exit(harness_finish());
    const atlas_host_props *p = atlas_host_properties(h);
    CHECK(strcmp(p->name, "Fake GPU 0") == 0);
    CHECK(p->cc_major == 9 && p->cc_minor == 0 && p->sm_count == 132);
    CHECK(p->total_mem == FAKE_CUDA_TOTAL_MEM && p->driver_version == 13000);
    CHECK(stats().retains == 1);
    CHECK(current() == atlas_host_context(h));

    /* same ordinal: the same host, no second context */
    CHECK_OK(atlas_host_get(0, &h2));
    CHECK(h2 == h);
    CHECK(stats().retains == 1 && atlas_host_context_retains(h) == 1);
    CHECK(atlas_host_contexts_created() == 1);

    /* another ordinal: refused, naming both, and nothing changes */
    h2 = (atlas_host *)&h2;
    CHECK(atlas_host_get(1, &h2) == ATLAS_ERR_INVALID && h2 == NULL);
    HAS("GPU 1 requested, but this process is bound to GPU 0");
    CHECK(stats().retains == 1);

    /* another thread gets the same host, with the context made current there */
    pthread_t t;
    void *ret = NULL;
    CHECK(pthread_create(&t, NULL, thread_get_host, h) == 0);
    CHECK(pthread_join(t, &ret) == 0);
    CHECK(ret == h);
    CHECK(stats().retains == 1);

    atlas_driver d = fake_cuda_table();
    CHECK(atlas_driver_install_for_test(&d, 13000) == ATLAS_ERR_INVALID);
    *out = h;
}

/* --- registry ----------------------------------------------------------------------------- */

static void test_modules(atlas_host *h) {
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    CHECK_OK(atlas_registry_load_image(r, "norm", "FAKEMOD:rmsnorm_bf16,add_rmsnorm_bf16"));
    CHECK_OK(atlas_registry_load_image(r, "rope", "FAKEMOD:rope_bf16"));
    CHECK(atlas_registry_module_count(r) == 2 && stats().modules_loaded == 2);

    CUfunction a = NULL, b = NULL, c = NULL;
    CHECK_OK(atlas_registry_function(r, "rope_bf16", &a));
    CHECK_OK(atlas_registry_function(r, "add_rmsnorm_bf16", &b));
    CHECK(a && b && a != b);
    long calls = fake_cuda_calls(FAKE_CU_GET_FUNCTION);
    CHECK_OK(atlas_registry_function(r, "rope_bf16", &c)); /* cached: no driver call */
    CHECK(c == a && fake_cuda_calls(FAKE_CU_GET_FUNCTION) == calls);
    CHECK(atlas_registry_function_count(r) == 2);

    CHECK(atlas_registry_function(r, "gemm_bf16", &c) == ATLAS_ERR_NOT_FOUND && c == NULL);
    HAS("no kernel 'gemm_bf16' in the loaded modules (norm, rope)");

    CHECK(atlas_registry_load_image(r, "junk", "\x7f" "ELF garbage") == ATLAS_ERR_DEVICE);
    HAS("registry: loading kernel module 'junk': cuModuleLoadData failed: "
        "CUDA_ERROR_INVALID_IMAGE");
    HAS("(src/backend/cuda/registry.c:");
    CHECK(atlas_registry_load_image(r, "rope", "FAKEMOD:x") == ATLAS_ERR_INVALID);
    HAS("module 'rope' is already loaded");
    CHECK(atlas_registry_module_count(r) == 2);

#ifdef ATLAS_HAVE_KERNELS
    int n = 0;
    const atlas_kernel_image *img = atlas_kernel_images(&n);
    CHECK(n >= 1);
    int probe = 0;
    for (int i = 0; i < n; i++) probe |= strcmp(img[i].name, "probe") == 0 && img[i].size > 0;
    CHECK(probe);
    CHECK_OK(atlas_registry_load_module(r, "probe"));
    CHECK_OK(atlas_registry_load_module(r, "probe")); /* twice: loaded once */
    CHECK(atlas_registry_module_count(r) == 3 && stats().modules_loaded == 3);
    CHECK(atlas_registry_load_module(r, "no_such") == ATLAS_ERR_NOT_FOUND);
    HAS("no kernel module 'no_such' in this binary");
#else
    CHECK(atlas_registry_load_module(r, "probe") == ATLAS_ERR_NOT_FOUND);
    HAS("built without CUDA kernels");
#endif

    int loaded = stats().modules_loaded;
    CHECK_OK(atlas_registry_release(r));
    CHECK(stats().modules_unloaded == loaded);
    CHECK_OK(atlas_registry_release(NULL));
}

static void test_allocations(atlas_host *h) {
    size_t free0 = 0, total = 0;
    CHECK_OK(atlas_host_mem_info(h, &free0, &total));
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    CUdeviceptr w = 0, kv = 0, ws = 0, x = 0;
    CHECK_OK(atlas_registry_alloc(r, 1000, "layers.0.qkv", &w));
    CHECK_OK(atlas_registry_alloc(r, 4096, "kv cache", &kv));
    CHECK_OK(atlas_registry_alloc(r, 512, "workspace", &ws));
    CHECK(w && kv && ws);
    CHECK(atlas_registry_alloc_count(r) == 3 && atlas_registry_alloc_bytes(r) == 5608);

    size_t free1 = 0;
    CHECK_OK(atlas_host_mem_info(h, &free1, &total));
    CHECK(free0 - free1 == 5608);

    CHECK_OK(atlas_registry_free(r, kv));
    CHECK(atlas_registry_alloc_count(r) == 2 && atlas_registry_alloc_bytes(r) == 1512);
    CHECK(atlas_registry_free(r, kv) == ATLAS_ERR_INVALID); /* not twice */
    HAS("was not allocated by this registry");
    CHECK_OK(atlas_registry_free(r, 0));
    CHECK(atlas_registry_alloc(r, 0, "empty", &x) == ATLAS_ERR_INVALID);

    /* out of memory: a recoverable error naming the buffer; nothing else changes */
    fake_cuda_fail_next(FAKE_CU_ALLOC);
    x = 1;
    CHECK(atlas_registry_alloc(r, (size_t)200 << 30, "layers.7.gate_up", &x) ==
          ATLAS_ERR_DEVICE_NOMEM);
    CHECK(x == 0);
    HAS2(pools ? "for layers.7.gate_up: cuMemAllocFromPoolAsync" : "for layers.7.gate_up: cuMemAlloc",
         " failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    CHECK(atlas_registry_alloc_count(r) == 2);

    /* handles: release refused while another is live, and nothing is unloaded */
    CHECK_OK(atlas_registry_load_image(r, "probe", "FAKEMOD:fill"));
    int unloaded = stats().modules_unloaded;
    CHECK(atlas_registry_ref(r) == r);
    atlas_registry_ref(r);
    CHECK(atlas_registry_handles(r) == 3);
    CHECK(atlas_registry_release(r) == ATLAS_ERR_BUSY);
    HAS("release refused: 2 other handle(s) live");
    atlas_registry_unref(r);
    CHECK(atlas_registry_release(r) == ATLAS_ERR_BUSY);
    HAS("1 other handle(s)");
    CHECK(stats().modules_unloaded == unloaded && atlas_registry_alloc_count(r) == 2);
    CUfunction fn = NULL;
    CHECK_OK(atlas_registry_function(r, "fill", &fn)); /* still usable */
    atlas_registry_unref(r);
    atlas_registry_unref(NULL);
    CHECK(atlas_registry_handles(r) == 1);
    CHECK_OK(atlas_registry_release(r));
    CHECK(stats().modules_unloaded == unloaded + 1);

    /* device memory back to where it was */
    size_t free2 = 0;
    CHECK_OK(atlas_host_mem_info(h, &free2, &total));
    CHECK(free2 == free0);
}

/* Every failure of a release is reported, all of them, and the registry is still freed. */
static void test_release_failures(atlas_host *h) {
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    CHECK_OK(atlas_registry_load_image(r, "norm", "FAKEMOD:rmsnorm"));
    CHECK_OK(atlas_registry_load_image(r, "attention", "FAKEMOD:attn"));
    CUmodule attention = stats().last_module;
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_OK(atlas_registry_alloc(r, 64, "embed_tokens", &a));
    CHECK_OK(atlas_registry_alloc(r, 128, "lm_head", &b));
    CHECK_OK(atlas_registry_alloc(r, 256, "kv cache", &c));
    fake_cuda_fail_handle(FAKE_CU_FREE, a);
    fake_cuda_fail_handle(FAKE_CU_FREE, c);
    fake_cuda_fail_handle(FAKE_CU_MODULE_UNLOAD, (uintptr_t)attention);
    fake_cuda_fail_next(FAKE_CU_SYNC); /* the context synchronise, made without pools only */
    atlas_status st = atlas_registry_release(r);
    CHECK(st == ATLAS_ERR_DEVICE);
    HAS(pools ? "registry release (3 allocation(s), 2 module(s)): 3 failure(s)"
              : "registry release (3 allocation(s), 2 module(s)): 4 failure(s)");
    if (!pools) HAS("cuCtxSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK(fake_cuda_failed(FAKE_CU_SYNC) == !pools);
    HAS2(free_call(), " 'embed_tokens' (64 bytes): CUDA_ERROR_ILLEGAL_ADDRESS");
    HAS2(free_call(), " 'kv cache' (256 bytes): CUDA_ERROR_ILLEGAL_ADDRESS");
    HAS("cuModuleUnload 'attention': CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK(strstr(atlas_last_error(), "lm_head") == NULL); /* it was freed */
    CHECK(strstr(atlas_last_error(), "'norm'") == NULL);
    printf("release failures: %s\n", atlas_last_error());

    /* the fake keeps what it refused to free: clean it up so the sanitizers see no leak */
    fake_cuda_disarm();
    const atlas_driver *d = atlas_driver_get();
    CHECK(d->cuMemFree(a) == 0 && d->cuMemFree(c) == 0);
    CHECK(d->cuModuleUnload(attention) == 0);
}

/* Many failures: the message stays bounded and counts what it could not list. */
static void test_release_many_failures(atlas_host *h) {
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    CUdeviceptr p[40];
    char name[64];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.qkv_proj.weight", i);
        CHECK_OK(atlas_registry_alloc(r, 16, name, &p[i]));
    }
    /* the context synchronise fails (without pools), or the last free (with them); every
     * other free works */
    if (pools) fake_cuda_fail_handle(FAKE_CU_FREE, p[39]);
    else fake_cuda_fail_next(FAKE_CU_SYNC);
    CHECK(atlas_registry_release(r) == ATLAS_ERR_DEVICE);
    HAS("1 failure(s)");
    fake_cuda_disarm();
    if (pools) CHECK(atlas_driver_get()->cuMemFree(p[39]) == 0);
    CHECK_OK(atlas_registry_create(h, &r));
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.qkv_proj.weight", i);
        CHECK_OK(atlas_registry_alloc(r, 16, name, &p[i]));
        fake_cuda_fail_handle(FAKE_CU_FREE, p[i]);
    }
    for (int i = 4; i < 40; i++) CHECK_OK(atlas_registry_alloc(r, 16, "x", &p[i]));
    CHECK(atlas_registry_release(r) == ATLAS_ERR_DEVICE);
    HAS("4 failure(s)");
    HAS("model.layers.0.self_attn");
    HAS("model.layers.3.self_attn");
    fake_cuda_disarm();
    for (int i = 0; i < 4; i++) CHECK(atlas_driver_get()->cuMemFree(p[i]) == 0);
}

/* Stream-ordered allocation: a registry allocates and frees on the copy stream while it
 * loads, after the serving stream's work; on the serving stream once handed over; a release
 * synchronises no context, frees in stream order and trims the pool. */
static void test_pool_order(atlas_host *h) {
    CUstream serving = atlas_host_stream(h), copy = atlas_host_copy_stream(h);
    CHECK(atlas_host_pool(h) != NULL && serving != copy);
    CHECK(stats().live_pools == 1 && stats().pool_threshold == 0 &&
          stats().pool_internal_deps == 0);
    fake_cuda_disarm();
    long allocs0 = stats().pool_allocs, frees0 = stats().pool_frees;

    /* a load: the copy stream waits for the serving stream (whose frees it may reuse) */
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    if (!r) return;
    CHECK(atlas_registry_stream(r) == copy);
    CHECK(stats().last_wait_stream == copy && stats().last_wait_after == serving);
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_OK(atlas_registry_alloc(r, 4096, "layers.0.qkv", &a));
    CHECK_OK(atlas_registry_alloc(r, 8192, "kv cache", &b));
    CHECK(stats().pool_allocs == allocs0 + 2 && stats().last_alloc_stream == copy);
    /* a free while loading: on the copy stream, after a wait for the serving stream */
    long wait0 = stats().last_wait_seq;
    CHECK_OK(atlas_registry_free(r, a));
    CHECK(stats().last_free_stream == copy && stats().pool_frees == frees0 + 1);
    CHECK(stats().last_wait_seq > wait0 && stats().last_wait_seq < stats().last_free_seq);
    CHECK(stats().last_wait_stream == copy && stats().last_wait_after == serving);

    /* handed over: the serving stream waits for the load's work, and serves from now */
    CHECK_OK(atlas_registry_set_stream(r, serving));
    CHECK(atlas_registry_stream(r) == serving);
    CHECK(stats().last_wait_stream == serving && stats().last_wait_after == copy);
    wait0 = stats().last_wait_seq;
    CHECK_OK(atlas_registry_alloc(r, 512, "workspace", &c));
    CHECK(stats().last_alloc_stream == serving);
    CHECK_OK(atlas_registry_free(r, c)); /* ordered after the serving stream's work: no wait */
    CHECK(stats().last_free_stream == serving && stats().last_wait_seq == wait0);
    CHECK_OK(atlas_registry_set_stream(r, serving)); /* again: nothing */
    CHECK(stats().last_wait_seq == wait0);

    /* the release: no context synchronise, ordered frees, the pool trimmed */
    long trims0 = stats().pool_trims;
    CHECK_OK(atlas_registry_alloc(r, 256, "activations", &c));
    CHECK_OK(atlas_registry_release(r));
    CHECK(fake_cuda_calls(FAKE_CU_SYNC) == 0);
    CHECK(stats().pool_frees == frees0 + 4 && stats().last_free_stream == serving);
    CHECK(stats().pool_trims == trims0 + 1);

    /* a load that fails: released from the copy stream, after the serving stream's work */
    CHECK_OK(atlas_registry_create(h, &r));
    CHECK_OK(atlas_registry_alloc(r, 100, "embed_tokens", &a));
    fake_cuda_disarm(); /* first_free_seq counts from here */
    wait0 = stats().last_wait_seq;
    CHECK_OK(atlas_registry_release(r));
    CHECK(stats().last_free_stream == copy && stats().last_wait_seq > wait0 &&
          stats().last_wait_seq < stats().first_free_seq);
    CHECK(stats().last_wait_stream == copy && stats().last_wait_after == serving);
    CHECK(fake_cuda_calls(FAKE_CU_SYNC) == 0 && stats().pool_trims == trims0 + 2);

    /* memory info gives back what the pool holds first */
    size_t free_b = 0, total = 0;
    CHECK_OK(atlas_host_mem_info(h, &free_b, &total));
    CHECK(stats().pool_trims == trims0 + 3 && free_b == total - stats().live_bytes);
}

/* A device without memory pools: the registry's paths with cuMemAlloc and cuMemFree. */
static void scenario_no_pools(void) {
    pools = 0;
    fake_cuda_set_pools(0);
    install_fake(1);
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (!h) return;
    CHECK(atlas_host_pool(h) == NULL && stats().live_pools == 0);
    test_allocations(h);
    test_release_failures(h);
    test_release_many_failures(h);
    CHECK(stats().pool_allocs == 0 && stats().pool_frees == 0 && stats().live_bytes == 0);
}

/* Weight uploads through the pinned staging pool, packed and chunked. */
typedef struct f32_to_u16 {
    const float *src;
} f32_to_u16;

static atlas_status fill_u16(void *dst, size_t offset, size_t bytes, void *user) {
    const f32_to_u16 *c = user;
    uint16_t *o = dst;
    for (size_t i = 0; i < bytes / 2; i++) o[i] = (uint16_t)c->src[offset / 2 + i];
    return ATLAS_OK;
}

static void test_upload(atlas_host *h) {
    CHECK(atlas_host_staging_bytes(h) == 0); /* lazily allocated */
    CHECK(atlas_host_set_staging(h, 0, 4096) == ATLAS_ERR_INVALID);
    /* odd sizes: chunks end mid-piece of the parallel copy (2 MiB pieces) */
    size_t stage = ((size_t)5 << 20) + 4096;
    CHECK_OK(atlas_host_set_staging(h, 3, stage));
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));

    enum { N = (13 << 20) + 777 };
    unsigned char *src = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + (i >> 12));
    CUdeviceptr big = 0, small[5];
    CHECK_OK(atlas_registry_alloc(r, N, "big", &big));
    CHECK_OK(atlas_host_upload_copy(h, big, src, N));
    for (int k = 0; k < 5; k++) {
        CHECK_OK(atlas_registry_alloc(r, 100 + k, "small", &small[k]));
        CHECK_OK(atlas_host_upload_copy(h, small[k], src + k, 100 + (size_t)k));
    }
    float conv_src[3000];
    for (int i = 0; i < 3000; i++) conv_src[i] = (float)(i % 1000);
    CUdeviceptr conv = 0;
    CHECK_OK(atlas_registry_alloc(r, 6000, "converted", &conv));
    f32_to_u16 ctx = {conv_src};
    CHECK_OK(atlas_host_upload(h, conv, 6000, fill_u16, &ctx));
    CHECK_OK(atlas_host_upload_wait(h));
    CHECK(atlas_host_staging_bytes(h) == 3 * stage);
    CHECK(atlas_host_set_staging(h, 2, 8192) == ATLAS_ERR_BUSY);

    const atlas_driver *d = atlas_driver_get();
    CHECK(d->cuMemcpyDtoH(back, big, N) == 0 && memcmp(back, src, N) == 0);
    for (int k = 0; k < 5; k++)
        CHECK(d->cuMemcpyDtoH(back, small[k], 100 + (size_t)k) == 0 &&
              memcmp(back, src + k, 100 + (size_t)k) == 0);
    uint16_t u[3000];
    CHECK(d->cuMemcpyDtoH(u, conv, sizeof u) == 0);
    int same = 1;
    for (int i = 0; i < 3000; i++) same &= u[i] == (uint16_t)(i % 1000);
    CHECK(same);
    free(src);
    free(back);
    CHECK_OK(atlas_registry_release(r));
}

/* Queued uploads: the loader threads fill pieces of several uploads at once, each with its
 * own copy of the context; a failed copy is reported by the next wait, and only by it. */
typedef struct ramp_ctx {
    unsigned seed;
} ramp_ctx;

static unsigned char ramp_byte(unsigned seed, size_t i) {
    return (unsigned char)(seed * 31u + i * 7u + (i >> 11));
}

static atlas_status fill_ramp(void *dst, size_t offset, size_t bytes, void *user) {
    const ramp_ctx *c = user;
    for (size_t i = 0; i < bytes; i++) ((unsigned char *)dst)[i] = ramp_byte(c->seed, offset + i);
    return ATLAS_OK;
}

static void test_upload_queue(atlas_host *h) {
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    size_t stage = atlas_host_staging_bytes(h) / 3; /* test_upload's pool: 3 buffers */
    enum { U = 24 };
    CUdeviceptr dst[U];
    size_t size[U];
    for (int k = 0; k < U; k++) {
        /* empty, small, exactly a buffer, several buffers and a bit */
        size[k] = k % 4 == 0 ? 0 : k % 4 == 1 ? 1 + (size_t)k * 37 : k % 4 == 2 ? stage
                : stage * (size_t)(1 + k % 3) + 513;
        CHECK_OK(atlas_registry_alloc(r, size[k] ? size[k] : 1, "queued", &dst[k]));
        ramp_ctx c = {(unsigned)k + 1};
        CHECK_OK(atlas_host_upload_queue(h, dst[k], size[k], fill_ramp, &c, sizeof c));
        c.seed = 999; /* the queue holds its own copy */
    }
    CHECK_OK(atlas_host_upload_wait(h));
    const atlas_driver *d = atlas_driver_get();
    int same = 1;
    for (int k = 0; k < U; k++) {
        unsigned char *back = malloc(size[k] + 1);
        CHECK(d->cuMemcpyDtoH(back, dst[k], size[k]) == 0);
        for (size_t i = 0; i < size[k]; i++) same &= back[i] == ramp_byte((unsigned)k + 1, i);
        free(back);
    }
    CHECK(same);

    /* one failed piece: the wait says which bytes, the next wait is clean */
    ramp_ctx c = {5};
    fake_cuda_fail_next(FAKE_CU_HTOD_ASYNC);
    CHECK_OK(atlas_host_upload_queue(h, dst[3], size[3], fill_ramp, &c, sizeof c));
    CHECK(atlas_host_upload_wait(h) == ATLAS_ERR_DEVICE);
    HAS("uploading bytes");
    HAS("cuMemcpyHtoDAsync");
    CHECK_OK(atlas_host_upload_queue(h, dst[3], size[3], fill_ramp, &c, sizeof c));
    CHECK_OK(atlas_host_upload_wait(h));
    for (int k = 0; k < U; k++) CHECK_OK(atlas_registry_free(r, dst[k]));
    CHECK_OK(atlas_registry_release(r));
}

/* A sticky error (a kernel's fault: the context can run nothing more) is kept, the first
 * one, for /health and the metrics; out of memory and other failures are not sticky. */
static void test_lost(void) {
    atlas_cu_lost_clear_for_test();
    char msg[512] = "x";
    CHECK(atlas_cu_check(2, "cuMemAlloc", __FILE__, __LINE__) == ATLAS_ERR_DEVICE_NOMEM);
    CHECK(atlas_cu_check(1, "cuMemcpyHtoDAsync", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    CHECK(!atlas_cu_lost(msg, sizeof msg) && msg[0] == 0);
    CHECK(atlas_cu_check(719, "cuStreamSynchronize", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    CHECK(atlas_cu_check(700, "cuMemFreeAsync", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    HAS("cuMemFreeAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS"); /* each call says its own */
    CHECK(atlas_cu_lost(msg, sizeof msg));
    CHECK_MSG(strstr(msg, "cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED") &&
              strstr(msg, "tests/test-registry.c:"), "the first: %s", msg);
    CHECK(atlas_cu_lost(NULL, 0));
    atlas_cu_lost_clear_for_test();
    CHECK(!atlas_cu_lost(NULL, 0));
}

int main(void) {
    harness_in_child("no device", scenario_no_device);
    harness_in_child("bad ordinal, retain failure", scenario_bad_ordinal_then_retain_failure);
    harness_in_child("no memory pools", scenario_no_pools);

    install_fake(2);
    test_lost();
    atlas_host *h = NULL;
    test_host(&h);
    test_modules(h);
    test_allocations(h);
    test_release_failures(h);
    test_release_many_failures(h);
    test_pool_order(h);
    test_upload(h);
    test_upload_queue(h);

    /* the end: every module unloaded, every device allocation freed, one context */
    CHECK(stats().modules_loaded == stats().modules_unloaded);
    CHECK(stats().live_bytes == 0);
    CHECK(stats().retains == 1 && stats().releases == 0);
    CHECK(atlas_host_contexts_created() == 1); /* what /metrics counts */
    CHECK(atlas_cu_check(2, "cuMemAlloc", __FILE__, __LINE__) == ATLAS_ERR_DEVICE_NOMEM);
    CHECK(atlas_cu_check(12345, "cuLaunchKernel", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    HAS("cuLaunchKernel failed: CUDA_ERROR_12345 (fake error) (tests/test-registry.c:");
    return harness_finish();
}
