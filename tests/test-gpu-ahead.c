/* tests/test-gpu-ahead.c — decode steps queued a step ahead through the engine on the GPU
 * (engine/step.c's run_ahead; the tiny-llama3 fixture), where a plain sampled request's
 * steps are queued as greedy ones are:
 * - a plain sampled request (temperature, top-k, top-p, min-p; ids only) draws the ids of
 *   the same request with logprobs, whose every step runs alone through the sample op,
 *   and its steps were queued ahead (the engine's steps_ahead);
 * - the same seed draws the same ids beside plain greedy and plain sampled batch-mates
 *   (greedy and sampled rows in one queued step; some ending inside a run), and the greedy
 *   mate's ids are those of a greedy request alone;
 * - another seed draws other ids. */
#include <stdio.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/host.h"
#include "atlas/sampler.h"
#include "engine_wait.h"
#include "harness.h"

#ifdef ATLAS_HAVE_KERNELS
enum { MAX = 48, NP = 12, MATES = 5 };

typedef struct got {
    int32_t ids[MAX];
    int n;
} got;

static void on_event(const atlas_event *ev, void *user) {
    got *g = user;
    if (ev->type == ATLAS_EVENT_TOKEN && g->n < MAX) g->ids[g->n++] = ev->id;
}

static const int32_t prompt[NP] = {3, 17, 42, 5, 9, 17, 23, 42, 8, 1, 17, 30};

static atlas_request plain(const char *model, uint64_t seed, float temperature) {
    atlas_request r = {.model = model, .prompt = prompt, .n_prompt = NP, .max_tokens = MAX,
                       .ignore_eos = 1};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = temperature;
    r.sampling.top_k = 50;
    r.sampling.top_p = 0.95f;
    r.sampling.min_p = 0.02f;
    r.sampling.seed = seed;
    return r;
}

static int same(const got *a, const got *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

static uint64_t ahead(atlas_engine *e) {
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    return m.steps_ahead;
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
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tiny-llama3", harness_data_dir());
    if (!harness_require_file(harness_data_path("tiny-llama3/tokenizer.json")))
        return harness_finish();
    atlas_engine_model mod = {.name = "tiny", .dir = dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &mod;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CUDA;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return harness_finish();

    atlas_request r = plain("tiny", 42, 0.9f);
    got queued = {0}, alone = {0}, greedy = {0};
    uint64_t a0 = ahead(e);
    CHECK_OK(engine_wait_run(e, &r, on_event, &queued));
    uint64_t a1 = ahead(e);
    CHECK_MSG(a1 - a0 >= MAX / 2, "a plain sampled request of %d tokens: %llu steps queued "
              "ahead", MAX, (unsigned long long)(a1 - a0));
    r.logprobs = 1; /* every step alone: the sample op */
    CHECK_OK(engine_wait_run(e, &r, on_event, &alone));
    CHECK_MSG(ahead(e) == a1, "a request with logprobs had steps queued ahead");
    CHECK_MSG(queued.n == MAX && same(&queued, &alone),
              "queued draws differ from the same draws stepped alone (%d and %d ids)",
              queued.n, alone.n);
    r.logprobs = 0;
    atlas_request g = plain("tiny", 5, 0.0f);
    CHECK_OK(engine_wait_run(e, &g, on_event, &greedy));

    /* beside batch-mates, submitted together so that they share queued steps */
    engine_wait w[MATES + 1];
    got mates[MATES], beside = {0};
    memset(mates, 0, sizeof mates);
    for (int i = 0; i < MATES; i++) {
        atlas_request m = i == 0 ? g : plain("tiny", 900 + (uint64_t)i, 0.6f + 0.2f * (float)i);
        if (i > 1) m.max_tokens = MAX - 9 * i; /* ending inside a run of queued steps */
        CHECK_OK(engine_wait_submit(&w[i], e, &m, on_event, &mates[i]));
    }
    CHECK_OK(engine_wait_submit(&w[MATES], e, &r, on_event, &beside));
    for (int i = 0; i <= MATES; i++) engine_wait_end(&w[i]);
    CHECK_MSG(same(&queued, &beside), "the seeded request drew otherwise beside batch-mates");
    CHECK_MSG(same(&greedy, &mates[0]), "the greedy request's ids changed beside sampled ones");
    for (int i = 2; i < MATES; i++)
        CHECK_MSG(mates[i].n == MAX - 9 * i, "mate %d: %d tokens, asked %d", i, mates[i].n,
                  MAX - 9 * i);
    r.sampling.seed = 43;
    got other = {0};
    CHECK_OK(engine_wait_run(e, &r, on_event, &other));
    CHECK_MSG(other.n == MAX && !same(&queued, &other), "seeds 42 and 43 drew the same ids");
    printf("a plain sampled request: %llu of its steps queued ahead; its %d ids equal the "
           "stepped draws', alone and beside %d mates\n", (unsigned long long)(a1 - a0),
           queued.n, MATES);
    atlas_engine_free(e);
    return harness_finish();
#endif
}
