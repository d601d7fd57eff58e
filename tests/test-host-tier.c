/* tests/test-host-tier.c — the host tier of released models' weights (backend/cuda/
 * host_tier.h) through the fake driver (tests/fake_cuda.h: "device" memory is host memory,
 * copies are memcpy; CI has no GPU).  A load's uploads go through staging and pin nothing;
 * once its model serves (atlas_tier_fill_start; the engine's LOADED event comes first), the
 * fill pins the image and copies the uploads back from the device; a second
 * load of the same key replays it and calls no fill (no file read), and the device bytes are
 * the same; a fill stopped by its model's release keeps nothing; a size that differs from the image's is an error and drops it;
 * the budget evicts least recently used whole entries and keeps their chunks for the next
 * fill; a fill out of room gives up and the load still lands; budget 0 and a GPU that shares
 * the host's memory (a child process, the host bound there as integrated) keep nothing.  With
 * kernels in the binary, tests/data/tiny-qwen3 is loaded, released and loaded again from the
 * tier with its file changed in place (same size and time): the weights are the first
 * load's, so nothing was read; a new time makes it read the files again; and a load beside a
 * serving model has its kernel modules loaded at the scheduler's quiet point. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "backend/cuda/cuda_backend.h"
#include "format/safetensors.h"
#include "model/model_internal.h"
#include "backend/cuda/host_tier.h"
#include "fake_cuda.h"
#include "harness.h"

#define MIB ((size_t)1 << 20)

static atomic_long fills; /* bytes the fill function wrote: the "file reads" */

/* Byte i of upload `seed`: seed + i * 7 (mod 256). */
static atlas_status fill_pattern(void *dst, size_t offset, size_t bytes, void *user) {
    int seed = *(const int *)user;
    for (size_t i = 0; i < bytes; i++) ((unsigned char *)dst)[i] = (unsigned char)(seed + (offset + i) * 7);
    atomic_fetch_add(&fills, (long)bytes);
    return ATLAS_OK;
}

static int device_is(CUdeviceptr p, size_t bytes, int seed) {
    const unsigned char *d = (const unsigned char *)(uintptr_t)p;
    for (size_t i = 0; i < bytes; i++)
        if (d[i] != (unsigned char)(seed + i * 7)) return 0;
    return 1;
}

/* One "load": uploads of sizes[n] (seeds base + i) through the tier for key; returns 1 when
 * it was a hit.  Checks the device bytes and frees them. */
static int load(atlas_host *h, uint64_t key, size_t budget, const size_t *sizes, int n,
                int base) {
    size_t expect = 0;
    for (int i = 0; i < n; i++) expect += sizes[i];
    atlas_tier_use *u = NULL;
    CHECK_OK(atlas_host_tier_open(h, key, budget, expect, &u));
    int hit = atlas_tier_use_hit(u);
    atlas_tier_stats t0, t1;
    atlas_host_tier_stats(&t0);
    CUdeviceptr d[8] = {0};
    for (int i = 0; i < n; i++) {
        CHECK_OK(ATLAS_CU(cuMemAlloc, &d[i], sizes[i]));
        int seed = base + i;
        CHECK_OK(atlas_tier_upload(h, u, d[i], sizes[i], fill_pattern, &seed, sizeof seed));
    }
    atlas_status st = atlas_host_upload_wait(h);
    CHECK_OK(st);
    atlas_host_tier_stats(&t1);
    CHECK_MSG(t1.pinned == t0.pinned, "the load pinned %zu bytes", t1.pinned - t0.pinned);
    atlas_tier_fill_end(atlas_tier_close(h, u, st == ATLAS_OK), 1); /* the fill, waited for */
    for (int i = 0; i < n; i++) {
        CHECK_MSG(device_is(d[i], sizes[i], base + i), "upload %d of key %llu", i,
                  (unsigned long long)key);
        atlas_driver_get()->cuMemFree(d[i]);
    }
    return hit;
}

static void test_tier(atlas_host *h) {
    size_t budget = 16 * MIB, chunk = atlas_host_tier_chunk_for(budget);
    CHECK(chunk == MIB);
    CHECK(*atlas_host_tier_off_reason(h) == '\0');
    /* sizes that straddle chunks (3.5 MiB in three uploads: 4 chunks) */
    const size_t a[3] = {MIB + 4096, 2 * MIB - 8192, MIB / 2 + 4096};
    atomic_store(&fills, 0);
    CHECK(!load(h, 11, budget, a, 3, 1)); /* a miss: filled, the image kept */
    long first = atomic_load(&fills);
    CHECK(first == (long)(a[0] + a[1] + a[2]));
    atlas_tier_stats ts;
    atlas_host_tier_stats(&ts);
    CHECK(ts.entries == 1 && ts.held == a[0] + a[1] + a[2] && ts.pinned == 4 * MIB);
    CHECK(fake_cuda_get_stats().bad_copies == 0); /* every copy from pinned memory */
    /* the same key: replayed, no fill called, the same bytes (seeds 1.. checked in load) */
    CHECK(load(h, 11, budget, a, 3, 1));
    CHECK(atomic_load(&fills) == first);
    atlas_host_tier_stats(&ts);
    CHECK(ts.hits == 1);

    /* a size the image did not record: an error, and the image dropped */
    atlas_tier_use *u = NULL;
    CHECK_OK(atlas_host_tier_open(h, 11, budget, 0, &u));
    CHECK(atlas_tier_use_hit(u));
    CUdeviceptr d = 0;
    CHECK_OK(ATLAS_CU(cuMemAlloc, &d, a[0] + 2));
    int seed = 1;
    CHECK(atlas_tier_upload(h, u, d, a[0] + 2, fill_pattern, &seed, sizeof seed) ==
          ATLAS_ERR_INTERNAL);
    CHECK_MSG(strstr(atlas_last_error(), "recorded"), "%s", atlas_last_error());
    (void)atlas_host_upload_wait(h);
    CHECK(atlas_tier_close(h, u, 0) == NULL);
    atlas_driver_get()->cuMemFree(d);
    atlas_host_tier_stats(&ts);
    CHECK(ts.entries == 0 && ts.pinned == 4 * MIB); /* its chunks kept for the next fill */
    CHECK(!load(h, 11, budget, a, 3, 1));

    /* room for three images of 4 MiB and a half: a fourth evicts the least recently used */
    const size_t b[2] = {2 * MIB, 2 * MIB + 4096};
    CHECK(!load(h, 12, budget, b, 2, 20));
    CHECK(!load(h, 13, budget, b, 2, 30));
    CHECK(load(h, 11, budget, a, 3, 1)); /* 11 used: 12 is now the least recent */
    long before = atomic_load(&fills);
    CHECK(!load(h, 14, budget, b, 2, 40));
    atlas_host_tier_stats(&ts);
    CHECK_MSG(ts.entries == 3 && ts.evicted == 1 && ts.pinned <= budget, "%d entries, %llu "
              "evicted, %zu pinned", ts.entries, (unsigned long long)ts.evicted, ts.pinned);
    CHECK(load(h, 11, budget, a, 3, 1) && load(h, 13, budget, b, 2, 30) &&
          load(h, 14, budget, b, 2, 40));
    CHECK(atomic_load(&fills) == before + (long)(b[0] + b[1]));
    CHECK(!load(h, 12, budget, b, 2, 20)); /* evicted whole: read again */

    /* a load larger than it said: the fill gives up, the load lands through staging */
    const size_t big[2] = {8 * MIB, 9 * MIB};
    atlas_tier_stats t0;
    atlas_host_tier_stats(&t0);
    atlas_tier_use *v = NULL;
    CHECK_OK(atlas_host_tier_open(h, 16, budget, MIB, &v));
    CHECK(v && !atlas_tier_use_hit(v));
    CUdeviceptr dd[2];
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ATLAS_CU(cuMemAlloc, &dd[i], big[i]));
        int s = 60 + i;
        CHECK_OK(atlas_tier_upload(h, v, dd[i], big[i], fill_pattern, &s, sizeof s));
    }
    CHECK_OK(atlas_host_upload_wait(h));
    CHECK(atlas_tier_close(h, v, 1) == NULL); /* given up: no fill goes on */
    for (int i = 0; i < 2; i++) {
        CHECK(device_is(dd[i], big[i], 60 + i));
        atlas_driver_get()->cuMemFree(dd[i]);
    }
    atlas_host_tier_stats(&ts);
    CHECK(ts.abandoned == t0.abandoned + 1 && ts.pinned <= budget);
    CHECK(!load(h, 16, budget, big, 2, 60)); /* nothing was kept of it */

    /* budget 0: off, and the pinned chunks go back */
    CHECK_OK(atlas_host_tier_open(h, 11, 0, 0, &u));
    CHECK(!u);
    atlas_host_tier_stats(&ts);
    CHECK(ts.pinned == 0 && ts.entries == 0);
    CHECK(!load(h, 11, 0, a, 3, 1));
    /* nothing pinned now; pinned memory short: the fill gives up, the load lands through
     * staging */
    atlas_host_tier_stats(&t0);
    fake_cuda_disarm();
    fake_cuda_fail(FAKE_CU_HOST_ALLOC, 1);
    const size_t c[2] = {3 * MIB, 3 * MIB};
    CHECK(!load(h, 17, budget, c, 2, 70));
    CHECK(fake_cuda_failed(FAKE_CU_HOST_ALLOC) == 1);
    fake_cuda_disarm();
    atlas_host_tier_stats(&ts);
    CHECK(ts.abandoned == t0.abandoned + 1 && ts.entries == t0.entries);
    CHECK(!load(h, 17, budget, c, 2, 70) && load(h, 17, budget, c, 2, 70)); /* kept now */

    /* two loads read one image together */
    atlas_tier_use *r1 = NULL, *r2 = NULL;
    CHECK_OK(atlas_host_tier_open(h, 17, budget, 0, &r1));
    CHECK_OK(atlas_host_tier_open(h, 17, budget, 0, &r2));
    CHECK(atlas_tier_use_hit(r1) && atlas_tier_use_hit(r2));
    CHECK(atlas_tier_close(h, r1, 1) == NULL && atlas_tier_close(h, r2, 1) == NULL);

    /* a fill its model's release stops: whatever it reached, nothing half-kept, and its
     * pinned chunks within the budget */
    atlas_host_tier_stats(&t0);
    CHECK_OK(atlas_host_tier_open(h, 18, budget, 0, &u));
    CHECK(u && !atlas_tier_use_hit(u));
    CUdeviceptr s1 = 0;
    CHECK_OK(ATLAS_CU(cuMemAlloc, &s1, 5 * MIB));
    int s18 = 90;
    CHECK_OK(atlas_tier_upload(h, u, s1, 5 * MIB, fill_pattern, &s18, sizeof s18));
    CHECK_OK(atlas_host_upload_wait(h));
    atlas_tier_use *running = atlas_tier_close(h, u, 1);
    CHECK(running != NULL);
    atlas_tier_fill_start(running);
    atlas_tier_fill_end(running, 0);
    atlas_driver_get()->cuMemFree(s1);
    atlas_host_tier_stats(&ts);
    CHECK_MSG((ts.entries == t0.entries && ts.held == t0.held) ||
              (ts.entries == t0.entries + 1 && ts.held == t0.held + 5 * MIB),
              "%d entries holding %zu bytes, before %d holding %zu", ts.entries, ts.held,
              t0.entries, t0.held);
    CHECK(ts.pinned <= budget && ts.abandoned == t0.abandoned);

    /* a fill waits for atlas_tier_fill_start (the model serves): closed, it pins nothing;
     * its model released before that keeps nothing and gives nothing up */
    atlas_host_tier_stats(&t0);
    long pins = fake_cuda_calls(FAKE_CU_HOST_ALLOC);
    CHECK_OK(atlas_host_tier_open(h, 19, budget, 0, &u));
    CHECK_OK(ATLAS_CU(cuMemAlloc, &s1, 3 * MIB));
    CHECK_OK(atlas_tier_upload(h, u, s1, 3 * MIB, fill_pattern, &s18, sizeof s18));
    CHECK_OK(atlas_host_upload_wait(h));
    running = atlas_tier_close(h, u, 1);
    CHECK(running != NULL);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    atlas_host_tier_stats(&ts);
    CHECK_MSG(ts.filling == t0.filling + 3 * chunk && ts.pinned == t0.pinned &&
              fake_cuda_calls(FAKE_CU_HOST_ALLOC) == pins, "filling %zu, pinned %zu (before "
              "%zu, %zu): the fill ran before it was started", ts.filling, ts.pinned,
              t0.filling, t0.pinned);
    atlas_tier_fill_end(running, 0);
    atlas_host_tier_stats(&ts);
    CHECK(ts.filling == t0.filling && ts.entries == t0.entries && ts.held == t0.held &&
          ts.abandoned == t0.abandoned && ts.fills == t0.fills);
    /* and started, it fills */
    CHECK_OK(atlas_host_tier_open(h, 19, budget, 0, &u));
    CHECK(u && !atlas_tier_use_hit(u));
    CHECK_OK(atlas_tier_upload(h, u, s1, 3 * MIB, fill_pattern, &s18, sizeof s18));
    CHECK_OK(atlas_host_upload_wait(h));
    running = atlas_tier_close(h, u, 1);
    atlas_tier_fill_start(running);
    atlas_tier_fill_end(running, 1);
    atlas_driver_get()->cuMemFree(s1);
    atlas_host_tier_stats(&ts);
    CHECK(ts.fills == t0.fills + 1 && ts.filling == t0.filling);

    CHECK(fake_cuda_get_stats().bad_copies == 0);
}

/* A GPU that shares the host's memory: no tier, the load still lands. */
static void unified(void) {
    fake_cuda_set_unified(1);
    CHECK_OK(fake_cuda_install(1));
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (!h) return;
    CHECK(atlas_host_properties(h)->integrated == 1 &&
          atlas_host_properties(h)->host_page_tables == 1);
    const char *why = atlas_host_tier_off_reason(h);
    CHECK_MSG(strstr(why, "integrated") && strstr(why, "same DRAM"), "%s", why);
    atlas_tier_use *u = NULL;
    CHECK_OK(atlas_host_tier_open(h, 11, 64 * MIB, MIB, &u));
    CHECK(!u);
    const size_t a[1] = {MIB + 12};
    atomic_store(&fills, 0);
    CHECK(!load(h, 11, 64 * MIB, a, 1, 3));
    CHECK(!load(h, 11, 64 * MIB, a, 1, 3)); /* read again: nothing was kept */
    CHECK(atomic_load(&fills) == (long)(2 * a[0]));
    atlas_tier_stats ts;
    atlas_host_tier_stats(&ts);
    CHECK(ts.pinned == 0 && ts.entries == 0);
#ifdef ATLAS_HAVE_KERNELS
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.kv_tokens = 256;
    p.host_cache = 64 * MIB;
    atlas_model *m = NULL;
    for (int i = 0; i < 2; i++) {
        CHECK_OK(atlas_model_load(harness_data_path("tiny-qwen3"), &p, &m));
        if (!m) return;
        atlas_model_info info;
        atlas_model_get_info(m, &info);
        CHECK(strcmp(info.load_source, "host") != 0 && strstr(info.host_tier, "integrated"));
        CHECK_OK(atlas_model_release(m));
    }
#endif
}

#ifdef ATLAS_HAVE_KERNELS
/* Waits (10 s at most) for a fill after the load to be kept: fills past `before`. */
static void wait_fill(uint64_t before) {
    atlas_tier_stats ts;
    for (int i = 0; i < 1000; i++) {
        atlas_host_tier_stats(&ts);
        if (ts.fills > before) return;
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    CHECK_MSG(0, "no fill kept after 10 s");
}

static uint64_t fills_now(void) {
    atlas_tier_stats ts;
    atlas_host_tier_stats(&ts);
    return ts.fills;
}

static atlas_model *load_model(const char *dir, const char *want) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CUDA;
    p.load_tokenizer = 0;
    p.kv_tokens = 256;
    p.host_cache = 256 * MIB;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return NULL;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    CHECK_MSG(want ? !strcmp(info.load_source, want) : strcmp(info.load_source, "host") != 0,
              "loaded from %s", info.load_source);
    if (!want) { /* a fill: it waits for the model to serve, its room reserved */
        atlas_tier_stats t0, t1;
        atlas_host_tier_stats(&t0);
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
        atlas_host_tier_stats(&t1);
        CHECK_MSG(t1.filling > 0 && t1.filling == t0.filling && t1.fills == t0.fills,
                  "filling %zu then %zu before the fill was started", t0.filling, t1.filling);
    }
    atlas_model_start_tier_fill(m);
    atlas_model_start_tier_fill(m); /* once: a second call does nothing */
    return m;
}

/* The embedding as the device holds it (malloc'd). */
static unsigned char *embed_bytes(const atlas_model *m, size_t *n) {
    const atlas_weight *w = m->w.embed;
    *n = w->bytes;
    unsigned char *b = malloc(w->bytes);
    memcpy(b, (const void *)(uintptr_t)w->ptr, w->bytes);
    return b;
}

/* Rewrites the embedding's bytes in dir's checkpoint in place, its size, inode and times
 * kept (touch: a new modification time instead). */
static void rewrite_embedding(const char *dir, int touch) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat before;
    CHECK(stat(path, &before) == 0);
    atlas_st *st = NULL;
    CHECK_OK(atlas_st_open_file(path, &st));
    if (!st) return;
    const atlas_tensor_view *v = atlas_st_find(st, "model.embed_tokens.weight");
    CHECK(v != NULL);
    size_t off = v ? (size_t)v->file_offset : 0, n = v ? v->nbytes : 0;
    atlas_st_free(st);
    FILE *f = fopen(path, "r+b");
    CHECK(f && fseek(f, (long)off, SEEK_SET) == 0);
    for (size_t i = 0; f && i < n; i++) fputc((int)(i * 13 + 5) & 0x3f, f);
    if (f) fclose(f);
    struct timespec t[2] = {before.st_atim, before.st_mtim};
    if (touch) t[1].tv_sec += 10;
    CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
}

/* The LOADED events' sources, in order. */
static char sources[8][16];
static int n_sources;
static void on_residency(void *user, const atlas_residency_event *ev) {
    (void)user;
    if (ev->kind == ATLAS_RESIDENCY_LOADED && n_sources < 8)
        snprintf(sources[n_sources++], sizeof sources[0], "%s", ev->source ? ev->source : "");
}

/* Two models swapped through the engine, one resident at a time, --host-cache on: "a" (kept
 * by test_model's last load) and its load again come from the tier, "b" from its files, and
 * the events and counts say so. */
/* An engine on the fake GPU serving "a" (dir) and "b" (a copy of tiny-qwen3 made in dir2),
 * small; NULL on failure (checked). */
static atlas_engine *two_models(const char *dir, char *dir2, size_t cap, int max_resident,
                                size_t host_cache,
                                void (*cb)(void *, const atlas_residency_event *)) {
    char cmd[1400], out[256];
    dir2[0] = '\0';
    if (!harness_mkdtemp(dir2, cap, "tier2")) return NULL;
    snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'", harness_data_path("tiny-qwen3"), dir2);
    CHECK(harness_run(cmd, out, sizeof out) == 0);
    atlas_engine_model em[2] = {{.name = "a", .dir = dir}, {.name = "b", .dir = dir2}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = em;
    p.n_models = 2;
    p.max_resident = max_resident;
    p.device = ATLAS_DEVICE_CUDA;
    p.ctx_size = 256;
    p.parallel = 1;
    p.kv_blocks = 16;
    p.batch_tokens = 32;
    p.host_cache = host_cache;
    p.on_residency = cb;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

static void test_engine(const char *dir) {
    char dir2[600];
    const size_t host_cache = 256 * MIB;
    atlas_engine *e = two_models(dir, dir2, sizeof dir2, 1, host_cache, on_residency);
    if (e) {
        CHECK_OK(atlas_engine_load(e, "a"));
        uint64_t f0 = fills_now();
        CHECK_OK(atlas_engine_load(e, "b"));
        wait_fill(f0); /* b's image, filled once its load was announced (the engine starts it) */
        CHECK_OK(atlas_engine_load(e, "a"));
        atlas_engine_metrics mt;
        atlas_engine_get_metrics(e, &mt);
        /* the process's tier kept "a" from test_model's last load: only "b" reads files */
        CHECK_MSG(mt.loads == 3 && mt.loads_host == 2 && mt.loads_page_cache + mt.loads_disk == 1,
                  "%llu loads: %llu host, %llu page cache, %llu disk",
                  (unsigned long long)mt.loads, (unsigned long long)mt.loads_host,
                  (unsigned long long)mt.loads_page_cache, (unsigned long long)mt.loads_disk);
        CHECK(mt.load_bytes_host > 0 && mt.host_tier_models >= 2 && mt.host_tier_bytes > 0 &&
              mt.host_tier_pinned <= host_cache);
        /* the KV store gets what the tier's pinned memory leaves */
        CHECK_MSG(mt.kv_host_budget == host_cache - mt.host_tier_pinned,
                  "kv host budget %zu, host cache %zu, tier pinned %zu", mt.kv_host_budget,
                  host_cache, (size_t)mt.host_tier_pinned);
        /* three loads and two releases later, still the one context of the process */
        CHECK_MSG(mt.device_contexts == 1, "%llu contexts", (unsigned long long)mt.device_contexts);
        CHECK(n_sources == 3 && !strcmp(sources[0], "host") && strcmp(sources[1], "host") &&
              !strcmp(sources[2], "host"));

        atlas_engine_free(e);
    }
    if (dir2[0]) harness_rm_rf(dir2);
}

/* A load beside a serving model: the newcomer's kernel modules go in at the scheduler's
 * quiet point (atlas_host_quiet_call), on the thread that steps the served model and
 * announces the load, not on the loader thread; the served request runs to its end. */
static pthread_t quiet_loaded_on;
static atomic_int quiet_loaded;
static void on_residency_quiet(void *user, const atlas_residency_event *ev) {
    (void)user;
    if (ev->kind == ATLAS_RESIDENCY_LOADED && !strcmp(ev->model, "b")) {
        quiet_loaded_on = pthread_self();
        atomic_store(&quiet_loaded, 1);
    }
}

typedef struct quiet_gen {
    atomic_int tokens, ended;
    atlas_finish finish;
} quiet_gen;

static void on_quiet_event(const atlas_event *ev, void *user) {
    quiet_gen *g = user;
    if (ev->type == ATLAS_EVENT_TOKEN) {
        atomic_fetch_add(&g->tokens, 1);
        usleep(1000); /* a slow client: the steps go on while b loads */
        return;
    }
    g->finish = ev->finish;
    if (ev->finish == ATLAS_FINISH_ERROR) fprintf(stderr, "quiet load: a failed: %s\n", ev->message);
    atomic_store(&g->ended, 1);
}

static void test_quiet_load(const char *dir) {
    char dir2[600];
    atlas_engine *e = two_models(dir, dir2, sizeof dir2, 2, 0, on_residency_quiet);
    if (e) {
        CHECK_OK(atlas_engine_load(e, "a"));
        /* forced tokens: the fake's kernels compute nothing for an argmax to read */
        int32_t prompt[] = {1, 2, 3}, forced[200];
        for (int i = 0; i < 200; i++) forced[i] = 100 + i;
        atlas_request rq = {.model = "a", .prompt = prompt, .n_prompt = 3,
                            .sampling = atlas_sampler_default_params(), .max_tokens = 200,
                            .ignore_eos = 1, .forced = forced, .n_forced = 200};
        rq.sampling.temperature = 0;
        quiet_gen g = {0};
        CHECK_OK(atlas_engine_submit(e, &rq, on_quiet_event, &g, NULL));
        for (int i = 0; i < 5000 && atomic_load(&g.tokens) < 5; i++) usleep(1000);
        CHECK_MSG(atomic_load(&g.tokens) >= 5 && !atomic_load(&g.ended), "a: %d tokens, %s (%d)",
                  atomic_load(&g.tokens), atomic_load(&g.ended) ? "ended" : "running",
                  (int)g.finish); /* a serves */
        long modules = fake_cuda_get_stats().modules_loaded;
        CHECK_OK(atlas_engine_load(e, "b"));
        fake_cuda_stats st = fake_cuda_get_stats();
        CHECK_MSG(!atomic_load(&g.ended) && atomic_load(&quiet_loaded) &&
                      st.modules_loaded > modules &&
                      pthread_equal(st.last_module_thread, quiet_loaded_on),
                  "b's %ld modules were loaded %s the scheduler's thread (a %s)",
                  st.modules_loaded - modules,
                  pthread_equal(st.last_module_thread, quiet_loaded_on) ? "on" : "off",
                  atomic_load(&g.ended) ? "had ended: nothing served beside the load"
                                        : "still served");
        for (int i = 0; i < 10000 && !atomic_load(&g.ended); i++) usleep(1000);
        CHECK(atomic_load(&g.ended) && g.finish == ATLAS_FINISH_LENGTH &&
              atomic_load(&g.tokens) == 200);
        atlas_engine_free(e);
    }
    if (dir2[0]) harness_rm_rf(dir2);
}

static void test_model(void) {
    char dir[600], cmd[1400], out[256];
    if (!harness_mkdtemp(dir, sizeof dir, "tier")) return;
    snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'", harness_data_path("tiny-qwen3"), dir);
    CHECK(harness_run(cmd, out, sizeof out) == 0);
    uint64_t f0 = fills_now();
    atlas_model *m = load_model(dir, NULL); /* fills the image after the load */
    if (!m) return;
    wait_fill(f0);
    size_t n = 0, n2 = 0;
    unsigned char *first = embed_bytes(m, &n);
    CHECK_OK(atlas_model_release(m));
    rewrite_embedding(dir, 0); /* the same identity: the tier's image is what loads */
    m = load_model(dir, "host");
    if (m) {
        unsigned char *again = embed_bytes(m, &n2);
        CHECK(n2 == n && !memcmp(first, again, n)); /* not a byte read from the file */
        free(again);
        CHECK_OK(atlas_model_release(m));
    }
    rewrite_embedding(dir, 1); /* a new time: the files are read again */
    f0 = fills_now();
    m = load_model(dir, NULL);
    if (m) {
        wait_fill(f0); /* kept for test_engine's first load */
        unsigned char *changed = embed_bytes(m, &n2);
        CHECK(n2 == n && memcmp(first, changed, n) != 0);
        free(changed);
        CHECK_OK(atlas_model_release(m));
    }
    free(first);
    test_engine(dir);
    test_quiet_load(dir);
    harness_rm_rf(dir);
}
#else
static void test_model(void) {
    printf("model: skipped (built without kernels: no CUDA backend to create)\n");
}
#endif

/* The KV store's pinned images (engine/kv_host.c): atlas_host_alloc_pinned asks the driver
 * for page-locked memory, frees it back, and says out of memory as such. */
static void test_pinned(atlas_host *h) {
    long before = fake_cuda_calls(FAKE_CU_HOST_ALLOC), freed = fake_cuda_calls(FAKE_CU_FREE_HOST);
    void *p = NULL;
    CHECK_OK(atlas_host_alloc_pinned(h, 2 * MIB, &p));
    CHECK(p != NULL && fake_cuda_calls(FAKE_CU_HOST_ALLOC) == before + 1);
    if (p) memset(p, 0x5a, 2 * MIB); /* host memory the process may write */
    atlas_host_free_pinned(h, p);
    atlas_host_free_pinned(h, NULL);
    CHECK(fake_cuda_calls(FAKE_CU_FREE_HOST) == freed + 1);
    fake_cuda_fail_next(FAKE_CU_HOST_ALLOC);
    p = (void *)1;
    CHECK(atlas_host_alloc_pinned(h, 2 * MIB, &p) == ATLAS_ERR_NOMEM && p == NULL);
    CHECK_MSG(strstr(atlas_last_error(), "pinned memory") != NULL, "%s", atlas_last_error());
    atlas_error_clear();
}

/* After atlas_host_start: one context, the times in order, and the staging pool made by
 * its thread (atlas_host_prepare_staging waits for it and makes no second one). */
static void test_start(atlas_host *h) {
    CHECK(atlas_host_context_retains(h) == 1);
    CHECK_OK(atlas_host_prepare_staging(h));
    CHECK(atlas_host_staging_bytes(h) == (size_t)ATLAS_HOST_STAGING_COUNT *
                                             ATLAS_HOST_STAGING_BYTES);
    atlas_host_start_wait(); /* cuBLASLt's thread too (it opens the real library, if any) */
    atlas_host_times t;
    atlas_host_get_times(&t);
    CHECK(t.cublaslt >= t.begin);
    CHECK_MSG(t.begin > 0 && t.begin <= t.context && t.context <= t.streams &&
              t.streams <= t.staging, "begin %.3f, context %.3f, streams %.3f, staging %.3f",
              t.begin, t.context, t.streams, t.staging);
    /* the free memory at bind, taken before anything was allocated: what `atlas serve`'s
     * start checks read instead of asking the driver while the staging pool is pinned */
    const atlas_host_props *hp = atlas_host_properties(h);
    CHECK_MSG(hp->free_at_bind > 0 && hp->free_at_bind <= hp->total_mem, "free at bind %zu of "
              "%zu", hp->free_at_bind, hp->total_mem);
    /* a survey with no_memory_check asks the device nothing (atlas_host_mem_info trims the
     * pool first: counted); without it, it does */
    atlas_model_params mp = atlas_model_default_params();
    mp.device = ATLAS_DEVICE_CUDA;
    mp.no_memory_check = 1;
    atlas_model_survey sv;
    long trims = fake_cuda_get_stats().pool_trims;
    CHECK_OK(atlas_model_inspect(harness_data_path("tiny-qwen3"), &mp, &sv));
    CHECK(!strcmp(sv.backend, "cuda") && sv.available_what[0] == '\0' &&
          sv.available_bytes == 0 && fake_cuda_get_stats().pool_trims == trims);
    mp.no_memory_check = 0;
    CHECK_OK(atlas_model_inspect(harness_data_path("tiny-qwen3"), &mp, &sv));
    CHECK(strstr(sv.available_what, "cuda:0") && fake_cuda_get_stats().pool_trims > trims);
}

int main(void) {
    harness_in_child("a GPU sharing the host's memory", unified);
    CHECK_OK(fake_cuda_install(1));
    /* bound by atlas_host_start's threads, as `atlas serve` binds it */
    atlas_host_start(0);
    atlas_host *h = NULL;
    CHECK_OK(atlas_host_get(0, &h));
    if (!h) return harness_finish();
    test_start(h);
    test_tier(h);
    test_pinned(h);
    test_model();
    return harness_finish();
}
