/* tests/test-gpu-lost.c — a GPU context lost to a kernel's fault, on a real GPU (label
 * "gpu"): a model runs a request on the GPU, then a kernel reads and writes through an
 * address that is not mapped.  The driver's sticky error is recorded with its cause, the
 * engine's metrics say the GPU is lost, a new request is refused at once with
 * ATLAS_ERR_UNAVAILABLE and the cause, the server on the engine (a real socket) answers
 * /health and a completion with 503 and the cause, and freeing the engine reports its failed
 * releases without hanging or crashing.  The process's context cannot be used again, which is
 * why this is a program of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/server.h"
#include "backend/cuda/registry.h"
#include "engine_wait.h"
#include "harness.h"
#include "http_once.h"

#define HAS(s) CHECK_MSG(strstr(atlas_last_error(), (s)) != NULL, "want '%s' in: %s", (s), \
                          atlas_last_error())

#ifdef ATLAS_HAVE_KERNELS
typedef struct got {
    int tokens;
    atlas_status status;
    atlas_finish finish;
} got;

static void on_event(const atlas_event *ev, void *user) {
    got *g = user;
    if (ev->type == ATLAS_EVENT_TOKEN) g->tokens++;
    if (ev->type == ATLAS_EVENT_END) {
        g->status = ev->status;
        g->finish = ev->finish;
    }
}

static void on_event_ignore(const atlas_event *ev, void *user) {
    (void)ev;
    (void)user;
}

#endif

int main(void) {
#ifndef ATLAS_HAVE_KERNELS
    printf("SKIP: this build has no kernels (configured without nvcc)\n");
    return 77;
#else
    atlas_host *h = NULL;
    atlas_status st = atlas_host_get(0, &h);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    if (!h) return harness_finish();

    atlas_engine_model em = {.name = "tiny", .dir = harness_data_path("tiny-qwen3")};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &em;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CUDA;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return harness_finish();

    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    atlas_request req = {.model = "tiny", .prompt = prompt, .n_prompt = 5, .max_tokens = 4};
    req.sampling = atlas_sampler_default_params();
    req.sampling.temperature = 0;
    got g = {0};
    CHECK_OK(engine_wait_run(e, &req, on_event, &g));
    CHECK_MSG(g.status == ATLAS_OK && g.tokens == 4, "before the fault: %d tokens, status %d",
              g.tokens, (int)g.status);
    atlas_engine_metrics mt;
    atlas_engine_get_metrics(e, &mt);
    CHECK(!mt.device_lost && !mt.device_error[0]);
    atlas_server_params sp = atlas_server_default_params();
    sp.port = 0;
    atlas_server *srv = NULL;
    CHECK_OK(atlas_server_start(e, &sp, &srv));
    int port = srv ? atlas_server_port(srv) : 0, status = 0;
    char *resp = http_once(port, "GET", "/health", NULL, &status);
    CHECK_MSG(status == 200, "/health before the fault: %d %s", status, resp ? resp : "");
    free(resp);

    /* the fault: the probe kernel (out = in * 2 + 1) through pointers nothing maps */
    atlas_registry *reg = NULL;
    CHECK_OK(atlas_registry_create(h, &reg));
    CHECK_OK(atlas_registry_load_module(reg, "probe"));
    CUfunction affine = NULL;
    CHECK_OK(atlas_registry_function(reg, "atlas_probe_affine_u32", &affine));
    CUdeviceptr bad_out = 0x1000, bad_in = 0x2000;
    uint32_t n = 1u << 20;
    void *args[] = {&bad_out, &bad_in, &n};
    st = ATLAS_CU(cuLaunchKernel, affine, (n + 255) / 256, 1, 1, 256, 1, 1, 0,
                  atlas_host_stream(h), args, NULL);
    if (st == ATLAS_OK) st = ATLAS_CU(cuStreamSynchronize, atlas_host_stream(h));
    CHECK(st == ATLAS_ERR_DEVICE);
    char msg[512] = "";
    CHECK_MSG(atlas_cu_lost(msg, sizeof msg) && strstr(msg, "CUDA_ERROR_ILLEGAL_ADDRESS"),
              "the driver's error: %s", msg);
    printf("lost: %s\n", msg);

    atlas_engine_get_metrics(e, &mt);
    CHECK_MSG(mt.device_lost && strstr(mt.device_error, "CUDA_ERROR_ILLEGAL_ADDRESS"),
              "metrics: lost %d, '%s'", mt.device_lost, mt.device_error);
    uint64_t errors0 = mt.finished_error;
    st = atlas_engine_submit(e, &req, on_event_ignore, NULL, NULL);
    CHECK_MSG(st == ATLAS_ERR_UNAVAILABLE, "submit after the loss: %d", (int)st);
    HAS("model 'tiny' cannot run: the GPU's context was lost to ");
    HAS("CUDA_ERROR_ILLEGAL_ADDRESS");
    atlas_engine_get_metrics(e, &mt);
    CHECK(mt.finished_error == errors0); /* refused, never run into the lost context */

    /* what a client and a load balancer see */
    resp = http_once(port, "GET", "/health", NULL, &status);
    CHECK_MSG(status == 503 && resp && strstr(resp, "\"error\"") &&
                  strstr(resp, "CUDA_ERROR_ILLEGAL_ADDRESS"),
              "/health after the fault: %d %s", status, resp ? resp : "");
    free(resp);
    resp = http_once(port, "POST", "/v1/completions",
                     "{\"model\": \"tiny\", \"prompt\": \"hi\", \"max_tokens\": 2}", &status);
    CHECK_MSG(status == 503 && resp && strstr(resp, "the GPU's context was lost"),
              "a completion after the fault: %d %s", status, resp ? resp : "");
    free(resp);
    atlas_server_stop(srv);

    /* the teardown's releases fail (the context is gone): reported, not a hang or a crash */
    st = atlas_registry_release(reg);
    printf("the probe's registry released: %s%s%s\n", atlas_status_str(st),
           st == ATLAS_OK ? "" : " ", st == ATLAS_OK ? "" : atlas_last_error());
    atlas_engine_free(e);
    printf("engine freed after the loss\n");
    return harness_finish();
#endif
}
