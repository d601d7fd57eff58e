/* tests/test-unload-failures.c — every failure of an unload reported, through the fake
 * driver (tests/fake_cuda.h) failing the calls a test picks (CI has no GPU).  The fake counts
 * live device allocations, pinned buffers and modules; a test arms it to fail the Nth
 * cuMemFree, cuModuleUnload, cuMemFreeHost or cuEventDestroy from then on, and checks that
 * the registry's release, atlas_model_release and the engine's metrics report each one, and
 * that every other free still happened.  The model and engine
 * parts load tests/data/tiny-qwen3 onto the CUDA backend, so they need a build with kernels
 * (nothing is launched).  It runs twice: with the fake's memory pools (stream-ordered
 * cuMemAllocFromPoolAsync / cuMemFreeAsync) and, given --no-pools, without (cuMemAlloc /
 * cuMemFree after a context synchronise). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "backend/backend.h"
#include "backend/cuda/host.h"
#include "backend/cuda/registry.h"
#include "fake_cuda.h"
#include "harness.h"
#include "model/forward.h"

/* --- the fake driver (tests/fake_cuda.h) -------------------------------------------------- */

static fake_cuda_stats stats(void) { return fake_cuda_get_stats(); }

/* Counts calls from zero again; calls a and b (0: none) of c fail. */
static void arm(fake_cuda_call c, long a, long b) {
    fake_cuda_disarm();
    fake_cuda_fail(c, a);
    if (b) fake_cuda_fail(c, b);
}

/* --- helpers ------------------------------------------------------------------------------ */

#define HAS(s) CHECK_MSG(strstr(atlas_last_error(), (s)) != NULL, "want '%s' in: %s", (s), \
                         atlas_last_error())

/* The driver's free and allocation as the messages name them (main sets them). */
static int pools = 1;
static const char *FREE_CALL = "cuMemFreeAsync", *ALLOC_CALL = "cuMemAllocFromPoolAsync";

/* HAS of "CALL" followed by rest. */
static const char *with_call(const char *call, const char *rest) {
    static char buf[4][256];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s%s", call, rest);
    return b;
}

/* --- the registry: failed frees before the release are kept for its message --------------- */

static void test_registry(atlas_host *h) {
    long allocs0 = stats().live_allocs, modules0 = stats().live_modules;
    atlas_registry *r = NULL;
    CHECK_OK(atlas_registry_create(h, &r));
    if (!r) return;
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK_OK(atlas_registry_alloc(r, 64, "layers.0.qkv", &a));
    CHECK_OK(atlas_registry_alloc(r, 128, "kv cache", &b));
    CHECK_OK(atlas_registry_alloc(r, 256, "activations", &c));
    CHECK_OK(atlas_registry_load_image(r, "norm", "FAKEMOD:x"));
    CHECK_OK(atlas_registry_load_image(r, "gemv", "FAKEMOD:x"));

    /* a failed free: returned, dropped from the live list (never freed twice), kept */
    arm(FAKE_CU_FREE, 1, 0);
    CHECK(atlas_registry_free(r, a) == ATLAS_ERR_DEVICE);
    HAS("freeing layers.0.qkv");
    HAS(with_call(FREE_CALL, " failed: CUDA_ERROR_ILLEGAL_ADDRESS"));
    CHECK(atlas_registry_alloc_count(r) == 2 && atlas_registry_alloc_bytes(r) == 384);
    /* a failure outside the registry's own memory (an event of the model's), kept */
    CHECK(atlas_registry_keep_cu(r, FAKE_CUDA_ILLEGAL_ADDRESS, "cuEventDestroy", "staging event",
                                 __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    CHECK(atlas_registry_keep_cu(r, 0, "cuEventDestroy", "argmax event", __FILE__,
                                 __LINE__) == ATLAS_OK);

    /* the release: its first cuMemFree (the newest allocation left: the kv cache, 'a' having
     * taken its place) and its first cuModuleUnload (the newest module) fail too */
    arm(FAKE_CU_FREE, 1, 0);
    fake_cuda_fail(FAKE_CU_MODULE_UNLOAD, 1);
    CHECK(atlas_registry_release(r) == ATLAS_ERR_DEVICE);
    printf("registry: %s\n", atlas_last_error());
    HAS("registry release (2 allocation(s), 2 module(s)): 4 failure(s): ");
    HAS(with_call(FREE_CALL, " 'layers.0.qkv' (64 bytes): CUDA_ERROR_ILLEGAL_ADDRESS (registry.c:"));
    HAS("cuEventDestroy 'staging event': CUDA_ERROR_ILLEGAL_ADDRESS (test-unload-failures.c:");
    HAS(with_call(FREE_CALL, " 'kv cache' (128 bytes): CUDA_ERROR_ILLEGAL_ADDRESS"));
    HAS("cuModuleUnload 'gemv': CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK(strstr(atlas_last_error(), "argmax event") == NULL);
    CHECK(strstr(atlas_last_error(), "'activations'") == NULL); /* it was freed */
    /* the first failure is listed first; each free was tried once, the rest all freed */
    CHECK(strstr(atlas_last_error(), "layers.0.qkv") < strstr(atlas_last_error(), "kv cache"));
    CHECK(fake_cuda_calls(FAKE_CU_FREE) == 2 && fake_cuda_calls(FAKE_CU_MODULE_UNLOAD) == 2);
    CHECK(stats().live_allocs == allocs0 + 2 && stats().live_modules == modules0 + 1);
    fake_cuda_disarm();
    fake_cuda_free_failed();
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
    long allocs0 = stats().live_allocs, hosts0 = stats().live_hosts;
    /* a clean unload first: how many frees it makes, and that it leaves nothing */
    m = load_tiny();
    if (!m) return;
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (pools && h) { /* the load allocated on the copy stream, then handed the model over */
        CHECK(stats().last_alloc_stream == atlas_host_copy_stream(h));
        CHECK(stats().last_wait_stream == atlas_host_stream(h) &&
              stats().last_wait_after == atlas_host_copy_stream(h));
    }
    stage_one(m);
    if (pools && h) /* serving: the workspace on the serving stream */
        CHECK(stats().last_alloc_stream == atlas_host_stream(h));
    long allocs = stats().live_allocs - allocs0, modules = stats().live_modules;
    long hosts = stats().live_hosts - hosts0; /* the workspace's (the staging pool stays) */
    fake_cuda_disarm();
    CHECK_OK(atlas_model_release(m));
    long frees = fake_cuda_calls(FAKE_CU_FREE), host_frees = fake_cuda_calls(FAKE_CU_FREE_HOST);
    long events = fake_cuda_calls(FAKE_CU_EVENT_DESTROY);
    CHECK_MSG(frees == allocs && stats().live_allocs == allocs0, "%ld frees of %ld allocations, "
              "%ld live", frees, allocs, stats().live_allocs - allocs0);
    CHECK(stats().live_modules == 0 && fake_cuda_calls(FAKE_CU_MODULE_UNLOAD) == modules);
    CHECK(host_frees == hosts && stats().live_hosts == hosts0 && events > 0);
    /* with pools, nothing synchronised the device: stream-ordered frees, then the pool
     * trimmed; without, the registry's release synchronised the context once */
    CHECK_MSG(fake_cuda_calls(FAKE_CU_SYNC) == (pools ? 0 : 1), "%ld cuCtxSynchronize calls",
              fake_cuda_calls(FAKE_CU_SYNC));
    CHECK(!pools || (stats().pool_frees > 0 && stats().pool_trims > 0));
    printf("model: %ld allocations, %ld modules, %ld pinned buffers, %ld events\n", allocs,
           modules, hosts, events);

    /* the same unload with failures: the 2nd cuMemFree (an activation buffer, freed through
     * the op table's free), the last (inside the registry's release), the 3rd
     * cuModuleUnload, the 1st cuMemFreeHost and the 2nd cuEventDestroy (the workspace) */
    m = load_tiny();
    if (!m) return;
    stage_one(m);
    arm(FAKE_CU_FREE, 2, frees);
    fake_cuda_fail(FAKE_CU_MODULE_UNLOAD, 3);
    fake_cuda_fail(FAKE_CU_FREE_HOST, 1);
    fake_cuda_fail(FAKE_CU_EVENT_DESTROY, 2);
    atlas_status st = atlas_model_release(m);
    const char *msg = atlas_last_error();
    printf("model: %s\n", msg);
    CHECK(st == ATLAS_ERR_DEVICE);
    HAS("releasing model ");
    HAS("5 failure(s): ");
    HAS(with_call(FREE_CALL, " 'activations' ("));
    CHECK_MSG(count_of(msg, with_call(FREE_CALL, " '")) == 2, "two free failures in: %s", msg);
    CHECK_MSG(count_of(msg, "cuModuleUnload '") == 1, "one cuModuleUnload in: %s", msg);
    HAS("cuMemFreeHost '");
    HAS("cuEventDestroy '");
    CHECK_MSG(count_of(msg, "CUDA_ERROR_ILLEGAL_ADDRESS") == 5, "5 failures in: %s", msg);
    /* every free tried once, and every one that did not fail happened */
    CHECK(fake_cuda_failed(FAKE_CU_FREE) == 2 && fake_cuda_failed(FAKE_CU_MODULE_UNLOAD) == 1);
    CHECK(fake_cuda_failed(FAKE_CU_FREE_HOST) == 1 && fake_cuda_failed(FAKE_CU_EVENT_DESTROY) == 1);
    CHECK_MSG(fake_cuda_calls(FAKE_CU_FREE) == frees, "%ld cuMemFree calls, want %ld",
              fake_cuda_calls(FAKE_CU_FREE), frees);
    CHECK(fake_cuda_calls(FAKE_CU_MODULE_UNLOAD) == modules &&
          fake_cuda_calls(FAKE_CU_FREE_HOST) == host_frees &&
          fake_cuda_calls(FAKE_CU_EVENT_DESTROY) == events);
    CHECK_MSG(stats().live_allocs == allocs0 + 2, "%ld allocations live, want the 2 that failed",
              stats().live_allocs - allocs0);
    CHECK(stats().live_modules == 1 && stats().live_hosts == hosts0 + 1);
    fake_cuda_disarm();
    fake_cuda_free_failed();

    /* a load that fails (the device full at its 20th allocation) unloads what it made: the
     * load's error is the status, and a failed free on the way follows it */
    arm(FAKE_CU_ALLOC, 20, 0);
    fake_cuda_fail(FAKE_CU_FREE, 3);
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    atlas_backend_options o = {.no_cublaslt = 1, .no_pdl = 1};
    m = NULL;
    CHECK(atlas_model_load_opts(harness_data_path("tiny-qwen3"), &p, &o, &m) ==
          ATLAS_ERR_DEVICE_NOMEM && !m);
    printf("failed load: %s\n", atlas_last_error());
    HAS(with_call(ALLOC_CALL, " failed: CUDA_ERROR_OUT_OF_MEMORY"));
    HAS("; and then releasing model ");
    HAS(with_call(pools ? "1 failure(s): cuMemFreeAsync" : "1 failure(s): cuMemFree", " '"));
    CHECK(fake_cuda_failed(FAKE_CU_ALLOC) == 1 && fake_cuda_failed(FAKE_CU_FREE) == 1);
    CHECK_MSG(stats().live_allocs == allocs0 + 1 && stats().live_modules == 0,
              "%ld allocations live, want the 1 that failed", stats().live_allocs - allocs0);
    fake_cuda_disarm();
    fake_cuda_free_failed();
}

/* --- the engine: an unload that failed is counted, kept, and the model is gone ------------- */

static void on_event_ignore(const atlas_event *ev, void *user) { (void)ev, (void)user; }

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
    long allocs0 = stats().live_allocs;
    CHECK_OK(atlas_engine_load(e, "tiny"));
    arm(FAKE_CU_FREE, 1, 0);
    CHECK_OK(atlas_engine_unload(e, "tiny")); /* gone all the same */
    atlas_engine_metrics mt;
    atlas_engine_get_metrics(e, &mt);
    CHECK(mt.unloads == 1 && mt.unload_failures == 1);
    atlas_engine_model_status ms;
    CHECK(atlas_engine_models(e, &ms, 1) == 1);
    CHECK(!ms.resident);
    CHECK_MSG(strstr(ms.last_error, "releasing: ") && strstr(ms.last_error, "1 failure(s)") &&
              strstr(ms.last_error, with_call(FREE_CALL, " '")), "last_error: %s", ms.last_error);
    printf("engine: %s\n", ms.last_error);
    CHECK(stats().live_allocs == allocs0 + 1); /* the one that failed; every other was freed */
    fake_cuda_disarm();
    /* loaded again and released cleanly at the end */
    CHECK_OK(atlas_engine_load(e, "tiny"));
    /* a sticky error, as a kernel's fault gives (returned here by hand): a request is refused
     * at once, 503's status, with the cause, not run into the lost context */
    atlas_cu_lost_clear_for_test(); /* the failed frees above returned sticky errors too */
    CHECK(atlas_cu_check(700, "cuStreamSynchronize", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    static const int32_t prompt[] = {1, 2, 3};
    atlas_request req = {.model = "tiny", .prompt = prompt, .n_prompt = 3, .max_tokens = 2};
    req.sampling = atlas_sampler_default_params();
    CHECK(atlas_engine_submit(e, &req, on_event_ignore, NULL, NULL) == ATLAS_ERR_UNAVAILABLE);
    HAS("model 'tiny' cannot run: the GPU's context was lost to cuStreamSynchronize failed: "
        "CUDA_ERROR_ILLEGAL_ADDRESS");
    atlas_cu_lost_clear_for_test();
    CHECK_OK(atlas_engine_unload(e, "tiny"));
    atlas_engine_get_metrics(e, &mt);
    CHECK(mt.unloads == 2 && mt.unload_failures == 1);
    atlas_engine_free(e);
    fake_cuda_free_failed();
    CHECK(stats().live_allocs == allocs0 && stats().live_modules == 0);
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

/* A sticky error, as a kernel's fault gives (here returned by hand): the engine's metrics,
 * which /health and /metrics read, say the GPU is lost and why, whatever the device of the
 * engine's models. */
static void test_device_lost(void) {
    atlas_engine_model em = {.name = "tiny", .dir = harness_data_path("tiny-qwen3")};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &em;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CPU;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return;
    atlas_cu_lost_clear_for_test(); /* the failures armed above returned sticky errors too */
    atlas_engine_metrics mt;
    atlas_engine_get_metrics(e, &mt);
    CHECK(!mt.device_lost && !mt.device_error[0]);
    CHECK(atlas_cu_check(700, "cuStreamSynchronize", __FILE__, __LINE__) == ATLAS_ERR_DEVICE);
    atlas_engine_get_metrics(e, &mt);
    CHECK_MSG(mt.device_lost && strstr(mt.device_error, "cuStreamSynchronize failed: "
                                                        "CUDA_ERROR_ILLEGAL_ADDRESS"),
              "%d: %s", mt.device_lost, mt.device_error);
    atlas_cu_lost_clear_for_test();
    atlas_engine_free(e);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--no-pools")) {
        pools = 0;
        FREE_CALL = "cuMemFree";
        ALLOC_CALL = "cuMemAlloc";
        fake_cuda_set_pools(0);
    }
    CHECK_OK(fake_cuda_install(1));
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (!h) return harness_finish();
    test_registry(h);
    test_model();
    test_engine();
    test_device_lost();
    CHECK(stats().live_allocs == 0 && stats().live_modules == 0);
    /* every device allocation went through the pool, or none did */
    CHECK(stats().live_pools == pools && (stats().pool_allocs > 0) == pools);
    return harness_finish();
}
