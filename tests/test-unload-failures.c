/* tests/test-unload-failures.c — every failure of an unload reported, through a fake driver
 * that fails the calls a test picks (CI has no GPU; tests/test-registry.c has the fake's
 * plain form).  The fake counts live device allocations, pinned buffers and modules; a test
 * arms it to fail the Nth cuMemFree, cuModuleUnload, cuMemFreeHost or cuEventDestroy from
 * then on, and checks that the registry's release, atlas_model_release and the engine's
 * metrics report each one, and that every other free still happened.  The model and engine
 * parts load tests/data/tiny-qwen3 onto the CUDA backend, so they need a build with kernels
 * (nothing is launched). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "backend/backend.h"
#include "backend/cuda/registry.h"
#include "harness.h"
#include "model/forward.h"

/* --- the fake driver ---------------------------------------------------------------------- */

enum { FK_FREE, FK_UNLOAD, FK_FREE_HOST, FK_EVENT, FK_ALLOC, FK_KINDS };
enum { FK_ILLEGAL_ADDRESS = 700, FK_MAX_FAILS = 4, FK_MAX_KEPT = 64 };

static struct {
    pthread_mutex_t mu;
    long live_allocs, live_hosts, live_modules; /* made and not (successfully) freed */
    long calls[FK_KINDS];                      /* since the last fk_arm */
    long fail_at[FK_KINDS][FK_MAX_FAILS];      /* 1-based call numbers that fail */
    int failed[FK_KINDS];
    void *kept[FK_MAX_KEPT];                   /* what a failed free left, freed at the end */
    int n_kept;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local CUcontext fk_current;
static char fk_ctx, fk_stream, fk_function;
static int fk_events;

/* 1 when this call of kind is one the test picked to fail (keeping p, if any). */
static int fk_fails(int kind, void *p) {
    pthread_mutex_lock(&fk.mu);
    long n = ++fk.calls[kind];
    int fail = 0;
    for (int k = 0; k < FK_MAX_FAILS; k++) fail |= fk.fail_at[kind][k] == n;
    if (fail) {
        fk.failed[kind]++;
        if (p && fk.n_kept < FK_MAX_KEPT) fk.kept[fk.n_kept++] = p;
    }
    pthread_mutex_unlock(&fk.mu);
    return fail;
}

/* Counts calls from zero again; calls a and b (0: none) of kind fail. */
static void fk_arm(int kind, long a, long b) {
    pthread_mutex_lock(&fk.mu);
    for (int k = 0; k < FK_KINDS; k++) fk.calls[k] = fk.failed[k] = 0;
    fk.fail_at[kind][0] = a;
    fk.fail_at[kind][1] = b;
    pthread_mutex_unlock(&fk.mu);
}

static void fk_disarm(void) {
    pthread_mutex_lock(&fk.mu);
    memset(fk.fail_at, 0, sizeof fk.fail_at);
    for (int k = 0; k < FK_KINDS; k++) fk.calls[k] = fk.failed[k] = 0;
    pthread_mutex_unlock(&fk.mu);
}

static CUresult f_ok0(void) { return 0; }
static CUresult f_init(unsigned int flags) { return 0; }
static CUresult f_version(int *v) { *v = 13000; return 0; }
static CUresult f_err_name(CUresult e, const char **name) {
    *name = e == FK_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_FAKE";
    return 0;
}
static CUresult f_err_string(CUresult e, const char **text) {
    *text = "fake error";
    return 0;
}
static CUresult f_dev_get(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
static CUresult f_dev_count(int *n) { *n = 1; return 0; }
static CUresult f_dev_name(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return 0;
}
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
    *v = a == ATLAS_CU_ATTR_COMPUTE_CAPABILITY_MAJOR  ? 9
         : a == ATLAS_CU_ATTR_MULTIPROCESSOR_COUNT    ? 132
         : a == ATLAS_CU_ATTR_L2_CACHE_SIZE           ? 50 << 20
         : a == ATLAS_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ? 232448
                                                      : 0;
    return 0;
}
static CUresult f_total_mem(size_t *b, CUdevice d) { *b = (size_t)80 << 30; return 0; }
static CUresult f_mem_info(size_t *free_b, size_t *total) {
    *free_b = *total = (size_t)80 << 30;
    return 0;
}
static CUresult f_retain(CUcontext *c, CUdevice d) { *c = (CUcontext)&fk_ctx; return 0; }
static CUresult f_release(CUdevice d) { return 0; }
static CUresult f_set_current(CUcontext c) { fk_current = c; return 0; }
static CUresult f_get_current(CUcontext *c) { *c = fk_current; return 0; }
static CUresult f_stream_create(CUstream *s, unsigned int flags) {
    *s = (CUstream)&fk_stream;
    return 0;
}
static CUresult f_stream(CUstream s) { return 0; }
static CUresult f_stream_wait(CUstream s, CUevent e, unsigned int flags) { return 0; }
static CUresult f_event_create(CUevent *e, unsigned int flags) {
    *e = (CUevent)(uintptr_t)(0x1000 + 16 * ++fk_events); /* never dereferenced */
    return 0;
}
static CUresult f_event_record(CUevent e, CUstream s) { return 0; }
static CUresult f_event(CUevent e) { return 0; }
static CUresult f_event_destroy(CUevent e) {
    return fk_fails(FK_EVENT, NULL) ? FK_ILLEGAL_ADDRESS : 0;
}

static CUresult f_alloc(CUdeviceptr *p, size_t bytes) {
    if (fk_fails(FK_ALLOC, NULL)) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    void *q = NULL;
    if (posix_memalign(&q, 256, bytes ? bytes : 1)) return 2;
    pthread_mutex_lock(&fk.mu);
    fk.live_allocs++;
    pthread_mutex_unlock(&fk.mu);
    *p = (CUdeviceptr)(uintptr_t)q;
    return 0;
}
static CUresult f_free(CUdeviceptr p) {
    if (fk_fails(FK_FREE, (void *)(uintptr_t)p)) return FK_ILLEGAL_ADDRESS;
    free((void *)(uintptr_t)p);
    pthread_mutex_lock(&fk.mu);
    fk.live_allocs--;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_host_alloc(void **p, size_t bytes, unsigned int flags) {
    *p = malloc(bytes);
    if (!*p) return 2;
    pthread_mutex_lock(&fk.mu);
    fk.live_hosts++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_free_host(void *p) {
    if (fk_fails(FK_FREE_HOST, p)) return FK_ILLEGAL_ADDRESS;
    free(p);
    pthread_mutex_lock(&fk.mu);
    fk.live_hosts--;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_host_dptr(CUdeviceptr *d, void *p, unsigned int flags) {
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
static CUresult f_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return f_htod(dst, src, n);
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}
static CUresult f_memset8(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n);
    return 0;
}
static CUresult f_memset8_async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
    return f_memset8(dst, v, n);
}
static CUresult f_memset32_async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
    for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)dst)[i] = v;
    return 0;
}

static CUresult f_module_load(CUmodule *m, const void *image) {
    *m = (CUmodule)malloc(16); /* an object of its own, so that a leak would show */
    if (!*m) return 2;
    pthread_mutex_lock(&fk.mu);
    fk.live_modules++;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_module_unload(CUmodule m) {
    if (fk_fails(FK_UNLOAD, m)) return FK_ILLEGAL_ADDRESS;
    free(m);
    pthread_mutex_lock(&fk.mu);
    fk.live_modules--;
    pthread_mutex_unlock(&fk.mu);
    return 0;
}
static CUresult f_get_function(CUfunction *fn, CUmodule m, const char *name) {
    *fn = (CUfunction)&fk_function;
    return 0;
}
static CUresult f_func_set(CUfunction fn, CUfunction_attribute a, int v) { return 0; }
static CUresult f_func_get(int *v, CUfunction_attribute a, CUfunction fn) {
    *v = 0;
    return 0;
}
static CUresult f_occupancy(int *blocks, CUfunction fn, int bs, size_t smem) {
    *blocks = 2;
    return 0;
}

/* Kernels and graphs: nothing runs (the one batch a test stages only copies its ids). */
static CUresult f_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                         void **extra) {
    return 0;
}
static char fk_graph, fk_graph_exec;
static CUresult f_begin_capture(CUstream s, CUstreamCaptureMode mode) { return 0; }
static CUresult f_end_capture(CUstream s, CUgraph *g) {
    *g = (CUgraph)&fk_graph;
    return 0;
}
static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    *st = (CUstreamCaptureStatus)0;
    return 0;
}
static CUresult f_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    *e = (CUgraphExec)&fk_graph_exec;
    return 0;
}
static CUresult f_graph_launch(CUgraphExec e, CUstream s) { return 0; }
static CUresult f_graph_exec_destroy(CUgraphExec e) { return 0; }
static CUresult f_graph_destroy(CUgraph g) { return 0; }

static void install_fake(void) {
    atlas_driver d;
    memset(&d, 0, sizeof d);
    d.cuInit = f_init;
    d.cuDriverGetVersion = f_version;
    d.cuGetErrorName = f_err_name;
    d.cuGetErrorString = f_err_string;
    d.cuDeviceGet = f_dev_get;
    d.cuDeviceGetCount = f_dev_count;
    d.cuDeviceGetName = f_dev_name;
    d.cuDeviceGetAttribute = f_dev_attr;
    d.cuDeviceTotalMem = f_total_mem;
    d.cuDevicePrimaryCtxRetain = f_retain;
    d.cuDevicePrimaryCtxRelease = f_release;
    d.cuCtxSetCurrent = f_set_current;
    d.cuCtxGetCurrent = f_get_current;
    d.cuCtxSynchronize = f_ok0;
    d.cuStreamCreate = f_stream_create;
    d.cuStreamDestroy = f_stream;
    d.cuStreamSynchronize = f_stream;
    d.cuStreamWaitEvent = f_stream_wait;
    d.cuEventCreate = f_event_create;
    d.cuEventRecord = f_event_record;
    d.cuEventSynchronize = f_event;
    d.cuEventQuery = f_event;
    d.cuEventDestroy = f_event_destroy;
    d.cuMemAlloc = f_alloc;
    d.cuMemFree = f_free;
    d.cuMemGetInfo = f_mem_info;
    d.cuMemcpyHtoD = f_htod;
    d.cuMemcpyHtoDAsync = f_htod_async;
    d.cuMemcpyDtoH = f_dtoh;
    d.cuMemsetD8 = f_memset8;
    d.cuMemsetD8Async = f_memset8_async;
    d.cuMemsetD32Async = f_memset32_async;
    d.cuMemHostAlloc = f_host_alloc;
    d.cuMemFreeHost = f_free_host;
    d.cuMemHostGetDevicePointer = f_host_dptr;
    d.cuModuleLoadData = f_module_load;
    d.cuModuleUnload = f_module_unload;
    d.cuModuleGetFunction = f_get_function;
    d.cuFuncSetAttribute = f_func_set;
    d.cuFuncGetAttribute = f_func_get;
    d.cuOccupancyMaxActiveBlocksPerMultiprocessor = f_occupancy;
    d.cuLaunchKernel = f_launch;
    d.cuStreamBeginCapture = f_begin_capture;
    d.cuStreamEndCapture = f_end_capture;
    d.cuStreamIsCapturing = f_is_capturing;
    d.cuGraphInstantiateWithFlags = f_instantiate;
    d.cuGraphLaunch = f_graph_launch;
    d.cuGraphExecDestroy = f_graph_exec_destroy;
    d.cuGraphDestroy = f_graph_destroy;
    CHECK_OK(atlas_driver_install_for_test(&d, 13000));
}

/* Frees what the failed frees left, so that the sanitizers see no leak; every one of them
 * is counted live until then. */
static void fk_free_kept(void) {
    for (int i = 0; i < fk.n_kept; i++) free(fk.kept[i]);
    fk.n_kept = 0;
}

/* --- helpers ------------------------------------------------------------------------------ */

#define HAS(s) CHECK_MSG(strstr(atlas_last_error(), (s)) != NULL, "want '%s' in: %s", (s), \
                         atlas_last_error())

/* --- the registry: failed frees before the release are kept for its message --------------- */

static void test_registry(atlas_host *h) {
    long allocs0 = fk.live_allocs, modules0 = fk.live_modules;
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    if (!r) return;
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_OK(atlas_registry_alloc(r, 64, "layers.0.qkv", &a));
    CHECK_OK(atlas_registry_alloc(r, 128, "kv cache", &b));
    CHECK_OK(atlas_registry_alloc(r, 256, "activations", &c));
    CHECK_OK(atlas_registry_load_image(r, "norm", "x"));
    CHECK_OK(atlas_registry_load_image(r, "gemv", "x"));

    /* a failed free: returned, dropped from the live list (never freed twice), kept */
    fk_arm(FK_FREE, 1, 0);
    CHECK(atlas_registry_free(r, a) == ATLAS_ERR_DEVICE);
    HAS("freeing layers.0.qkv");
    HAS("cuMemFree failed: CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK(atlas_registry_alloc_count(r) == 2 && atlas_registry_alloc_bytes(r) == 384);
    /* a failure outside the registry's own memory (an event of the model's), kept */
    CHECK(atlas_registry_keep_cu(r, FK_ILLEGAL_ADDRESS, "cuEventDestroy", "staging event",
                                 __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    CHECK(atlas_registry_keep_cu(r, 0, "cuEventDestroy", "argmax event", __FILE__,
                                 __LINE__) == ATLAS_OK);

    /* the release: its first cuMemFree (the newest allocation left: the kv cache, 'a' having
     * taken its place) and its first cuModuleUnload (the newest module) fail too */
    fk_arm(FK_FREE, 1, 0);
    fk.fail_at[FK_UNLOAD][0] = 1;
    CHECK(atlas_registry_release(r) == ATLAS_ERR_DEVICE);
    printf("registry: %s\n", atlas_last_error());
    HAS("registry release (2 allocation(s), 2 module(s)): 4 failure(s): ");
    HAS("cuMemFree 'layers.0.qkv' (64 bytes): CUDA_ERROR_ILLEGAL_ADDRESS (registry.c:");
    HAS("cuEventDestroy 'staging event': CUDA_ERROR_ILLEGAL_ADDRESS (test-unload-failures.c:");
    HAS("cuMemFree 'kv cache' (128 bytes): CUDA_ERROR_ILLEGAL_ADDRESS");
    HAS("cuModuleUnload 'gemv': CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK(strstr(atlas_last_error(), "argmax event") == NULL);
    CHECK(strstr(atlas_last_error(), "'activations'") == NULL); /* it was freed */
    /* the first failure is listed first; each free was tried once, the rest all freed */
    CHECK(strstr(atlas_last_error(), "layers.0.qkv") < strstr(atlas_last_error(), "kv cache"));
    CHECK(fk.calls[FK_FREE] == 2 && fk.calls[FK_UNLOAD] == 2);
    CHECK(fk.live_allocs == allocs0 + 2 && fk.live_modules == modules0 + 1);
    fk_disarm();
    fk.live_allocs -= 2, fk.live_modules -= 1;
    fk_free_kept();
}

#ifdef ATLAS_HAVE_KERNELS

/* --- a model on the CUDA backend: atlas_model_release reports every failure ---------------- */

static int count_of(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

static atlas_model *load_tiny(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.kv_tokens = 256;
    p.max_batch_tokens = 32;
    p.mlp_chunk_tokens = 32;
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load_opts(harness_data_path("tiny-qwen3"), &p, &o, &m));
    return m;
}

/* Stages a one-token batch, so that the workspace's pinned buffers and events exist. */
static void stage_one(atlas_model *m) {
    atlas_backend *be = atlas_model_backend(m);
    int32_t tok = 1, pos = 0, start[2] = {0, 1}, ctx = 1, table = 0, rows = 0;
    atlas_batch b = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .n_seqs = 1,
                     .seq_start = start, .seq_ctx = &ctx, .block_table = &table,
                     .max_blocks = 1, .n_logits = 1, .logit_rows = &rows};
    CHECK_OK(be->ops->begin_batch(be, &b, atlas_model_kv_block_size(m)));
}

static void test_model(void) {
    /* the first load makes the host's staging pool, which stays for the process */
    atlas_model *m = load_tiny();
    if (!m) return;
    CHECK_OK(atlas_model_release(m));
    long allocs0 = fk.live_allocs, hosts0 = fk.live_hosts;
    /* a clean unload first: how many frees it makes, and that it leaves nothing */
    m = load_tiny();
    if (!m) return;
    stage_one(m);
    long allocs = fk.live_allocs - allocs0, modules = fk.live_modules;
    long hosts = fk.live_hosts - hosts0; /* the workspace's (the staging pool stays) */
    fk_disarm();
    CHECK_OK(atlas_model_release(m));
    long frees = fk.calls[FK_FREE], host_frees = fk.calls[FK_FREE_HOST];
    long events = fk.calls[FK_EVENT];
    CHECK_MSG(frees == allocs && fk.live_allocs == allocs0, "%ld frees of %ld allocations, "
              "%ld live", frees, allocs, fk.live_allocs - allocs0);
    CHECK(fk.live_modules == 0 && fk.calls[FK_UNLOAD] == modules);
    CHECK(host_frees == hosts && fk.live_hosts == hosts0 && events > 0);
    printf("model: %ld allocations, %ld modules, %ld pinned buffers, %ld events\n", allocs,
           modules, hosts, events);

    /* the same unload with failures: the 2nd cuMemFree (an activation buffer, freed through
     * the op table's free), the last (inside the registry's release), the 3rd
     * cuModuleUnload, the 1st cuMemFreeHost and the 2nd cuEventDestroy (the workspace) */
    m = load_tiny();
    if (!m) return;
    stage_one(m);
    fk_arm(FK_FREE, 2, frees);
    fk.fail_at[FK_UNLOAD][0] = 3;
    fk.fail_at[FK_FREE_HOST][0] = 1;
    fk.fail_at[FK_EVENT][0] = 2;
    atlas_status st = atlas_model_release(m);
    const char *msg = atlas_last_error();
    printf("model: %s\n", msg);
    CHECK(st == ATLAS_ERR_DEVICE);
    HAS("releasing model ");
    HAS("5 failure(s): ");
    HAS("cuMemFree 'activations' (");
    CHECK_MSG(count_of(msg, "cuMemFree '") == 2, "two cuMemFree failures in: %s", msg);
    CHECK_MSG(count_of(msg, "cuModuleUnload '") == 1, "one cuModuleUnload in: %s", msg);
    HAS("cuMemFreeHost '");
    HAS("cuEventDestroy '");
    CHECK_MSG(count_of(msg, "CUDA_ERROR_ILLEGAL_ADDRESS") == 5, "5 failures in: %s", msg);
    /* every free tried once, and every one that did not fail happened */
    CHECK(fk.failed[FK_FREE] == 2 && fk.failed[FK_UNLOAD] == 1);
    CHECK(fk.failed[FK_FREE_HOST] == 1 && fk.failed[FK_EVENT] == 1);
    CHECK_MSG(fk.calls[FK_FREE] == frees, "%ld cuMemFree calls, want %ld", fk.calls[FK_FREE],
              frees);
    CHECK(fk.calls[FK_UNLOAD] == modules && fk.calls[FK_FREE_HOST] == host_frees &&
          fk.calls[FK_EVENT] == events);
    CHECK_MSG(fk.live_allocs == allocs0 + 2, "%ld allocations live, want the 2 that failed",
              fk.live_allocs - allocs0);
    CHECK(fk.live_modules == 1 && fk.live_hosts == hosts0 + 1);
    fk_disarm();
    fk.live_allocs -= 2, fk.live_modules -= 1, fk.live_hosts -= 1;
    fk_free_kept();

    /* a load that fails (the device full at its 20th allocation) unloads what it made: the
     * load's error is the status, and a failed free on the way follows it */
    fk_arm(FK_ALLOC, 20, 0);
    fk.fail_at[FK_FREE][0] = 3;
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    m = NULL;
    CHECK(atlas_model_load_opts(harness_data_path("tiny-qwen3"), &p, &o, &m) ==
          ATLAS_ERR_DEVICE_NOMEM && !m);
    printf("failed load: %s\n", atlas_last_error());
    HAS("cuMemAlloc failed: CUDA_ERROR_FAKE");
    HAS("; and then releasing model ");
    HAS("1 failure(s): cuMemFree '");
    CHECK(fk.failed[FK_ALLOC] == 1 && fk.failed[FK_FREE] == 1);
    CHECK_MSG(fk.live_allocs == allocs0 + 1 && fk.live_modules == 0,
              "%ld allocations live, want the 1 that failed", fk.live_allocs - allocs0);
    fk_disarm();
    fk.live_allocs -= 1;
    fk_free_kept();
}

/* --- the engine: an unload that failed is counted, kept, and the model is gone ------------- */

static void test_engine(void) {
    atlas_engine_model em = {.name = "tiny", .dir = harness_data_path("tiny-qwen3")};
    char dir[600];
    snprintf(dir, sizeof dir, "%s", em.dir);
    em.dir = dir;
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &em;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CUDA;
    p.ctx_size = 256;
    p.parallel = 1;
    p.kv_blocks = 16;
    p.batch_tokens = 32;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return;
    long allocs0 = fk.live_allocs;
    CHECK_OK(atlas_engine_load(e, "tiny"));
    fk_arm(FK_FREE, 1, 0);
    CHECK_OK(atlas_engine_unload(e, "tiny")); /* gone all the same */
    atlas_engine_metrics mt;
    atlas_engine_get_metrics(e, &mt);
    CHECK(mt.unloads == 1 && mt.unload_failures == 1);
    atlas_engine_model_status ms;
    CHECK(atlas_engine_models(e, &ms, 1) == 1);
    CHECK(!ms.resident);
    CHECK_MSG(strstr(ms.last_error, "releasing: ") && strstr(ms.last_error, "1 failure(s)") &&
              strstr(ms.last_error, "cuMemFree '"), "last_error: %s", ms.last_error);
    printf("engine: %s\n", ms.last_error);
    CHECK(fk.live_allocs == allocs0 + 1); /* the one that failed; every other was freed */
    fk_disarm();
    /* loaded again and released cleanly at the end */
    CHECK_OK(atlas_engine_load(e, "tiny"));
    CHECK_OK(atlas_engine_unload(e, "tiny"));
    atlas_engine_get_metrics(e, &mt);
    CHECK(mt.unloads == 2 && mt.unload_failures == 1);
    atlas_engine_free(e);
    fk.live_allocs -= 1;
    fk_free_kept();
    CHECK(fk.live_allocs == allocs0 && fk.live_modules == 0);
}

/* The engine opens cuBLASLt where the machine has the library (it has no option to leave
 * it out), and cublasLtCreate keeps memory that cublasLtDestroy does not give back: the
 * library's, not atlas's (the backend destroys every handle it made). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libcublasLt.so\n"; }

#else
static void test_model(void) {
    printf("model: skipped (built without kernels: no CUDA backend to create)\n");
}
static void test_engine(void) {}
#endif

int main(void) {
    install_fake();
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (!h) return harness_finish();
    test_registry(h);
    test_model();
    test_engine();
    CHECK(fk.live_allocs == 0 && fk.live_modules == 0);
    return harness_finish();
}
