/* tests/test-engine-ahead.c — decode steps queued a step ahead through the engine
 * (engine/step.c's run_ahead; the tiny-llama3 fixture) on the CPU backend with step_ahead ON
 * (the CPU computes a queued step at once, so AUTO never queues there), and with `-d cuda`
 * (ctest's test-gpu-ahead) on the GPU with AUTO, where a sampled step's draw runs on the
 * device (kernels/sample.cu's atlas_sample_ids) and its ids are the next step's tokens:
 * - a plain sampled request (temperature, top-k, top-p, min-p; ids only) draws the ids of
 *   the same request with logprobs, whose steps are never queued, and its steps were
 *   queued (steps_ahead); a plain greedy one likewise against greedy with logprobs;
 * - beside batch-mates submitted together (plain greedy and plain sampled ones of other
 *   seeds and lengths: queued steps with greedy and sampled rows, sequences ending inside
 *   a run; one with logprobs, whose steps are not queued; one that stops at an id) each
 *   mate ends where it asked to, and on the CPU, whose sums do not depend on the batch,
 *   the seeded request draws the ids it drew alone;
 * - OFF queues nothing, with the same ids, and so does AUTO on the CPU; a value outside the
 *   enum is refused at create. */
#include <stdio.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/host.h"
#include "atlas/sampler.h"
#include "engine_wait.h"
#include "harness.h"

enum { MAX = 40, NP = 12, MATES = 6 };

typedef struct got {
    int32_t ids[MAX];
    int n;
    atlas_finish finish;
} got;

static void on_event(const atlas_event *ev, void *user) {
    got *g = user;
    if (ev->type == ATLAS_EVENT_TOKEN && g->n < MAX) g->ids[g->n++] = ev->id;
    else if (ev->type == ATLAS_EVENT_END) g->finish = ev->finish;
}

static const int32_t prompt[NP] = {3, 17, 42, 5, 9, 17, 23, 42, 8, 1, 17, 30};

static atlas_request plain(const char *model, uint64_t seed, float temperature, int max) {
    atlas_request r = {.model = model, .prompt = prompt, .n_prompt = NP, .max_tokens = max,
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

static atlas_device device = ATLAS_DEVICE_CPU;

static atlas_engine *make(const char *dir, atlas_step_ahead mode) {
    static atlas_engine_model mod;
    mod = (atlas_engine_model){.name = "tiny", .dir = dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &mod;
    p.n_models = 1;
    p.device = device;
    p.n_threads = 2;
    p.step_ahead = mode;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

/* r run plainly and with logprobs (never queued): the same ids, and steps queued in the
 * first only when `queues`. */
static void versus_stepped(atlas_engine *e, atlas_request r, int queues, const char *what,
                           got *out) {
    got stepped = {0};
    memset(out, 0, sizeof *out);
    uint64_t a0 = ahead(e);
    CHECK_OK(engine_wait_run(e, &r, on_event, out));
    uint64_t a1 = ahead(e);
    CHECK_MSG(queues ? a1 - a0 >= (uint64_t)r.max_tokens / 2 : a1 == a0,
              "%s: %llu steps queued ahead for %d tokens", what,
              (unsigned long long)(a1 - a0), r.max_tokens);
    r.logprobs = 1;
    CHECK_OK(engine_wait_run(e, &r, on_event, &stepped));
    CHECK_MSG(ahead(e) == a1, "%s: a request with logprobs had steps queued ahead", what);
    CHECK_MSG(out->n == r.max_tokens && same(out, &stepped),
              "%s: queued ids differ from the stepped ones (%d and %d ids)", what, out->n,
              stepped.n);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "-d") && !strcmp(argv[2], "cuda")) {
        device = ATLAS_DEVICE_CUDA;
    } else if (argc != 1) {
        fprintf(stderr, "usage: test-engine-ahead [-d cuda]\n");
        return 2;
    }
    if (device == ATLAS_DEVICE_CUDA) {
#ifndef ATLAS_HAVE_KERNELS
        printf("SKIP: this build has no kernels (configured without nvcc)\n");
        return 77;
#endif
        atlas_host *h = NULL;
        atlas_status st = atlas_host_get(0, &h);
        HARNESS_SKIP_NO_DEVICE(st);
        CHECK_OK(st);
        if (!h) return harness_finish();
    }
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tiny-llama3", harness_data_dir());
    if (!harness_require_file(harness_data_path("tiny-llama3/tokenizer.json")))
        return harness_finish();
    /* the GPU queues with AUTO, the default */
    atlas_engine *e = make(dir, device == ATLAS_DEVICE_CUDA ? ATLAS_STEP_AHEAD_AUTO
                                                          : ATLAS_STEP_AHEAD_ON);
    if (!e) return harness_finish();

    atlas_request r = plain("tiny", 42, 0.9f, MAX), g = plain("tiny", 5, 0.0f, MAX);
    got sampled, greedy;
    versus_stepped(e, r, 1, "plain sampled", &sampled);
    versus_stepped(e, g, 1, "plain greedy", &greedy);
    got greedy_ids = {0};
    for (int i = 0; i < MAX; i++) /* not all the argmax: the draws were used */
        if (sampled.ids[i] != greedy.ids[i]) greedy_ids.n++;
    CHECK_MSG(greedy_ids.n > 0, "%d sampled ids, each the argmax", MAX);

    /* beside batch-mates, submitted together so that they share steps */
    engine_wait w[MATES + 1];
    got mates[MATES], beside = {0};
    memset(mates, 0, sizeof mates);
    atlas_request m[MATES];
    for (int i = 0; i < MATES; i++)
        m[i] = plain("tiny", 900 + (uint64_t)i, i % 2 ? 0.7f + 0.1f * (float)i : 0.0f,
                     MAX - 5 * i);
    m[1].sampling.top_k = 0, m[1].sampling.min_p = 0.0f; /* top-p only */
    m[2].logprobs = 1, m[2].max_tokens = 6; /* no step is queued while it runs */
    m[3].n_prompt = NP - 4;
    /* greedy on the full prompt: on the CPU its ids are greedy's, so it stops where greedy
     * first drew its 11th id, inside a run of queued steps */
    m[4].max_tokens = MAX;
    int32_t stop_id = greedy.ids[10];
    int first = 0;
    while (greedy.ids[first] != stop_id) first++;
    m[4].stop_ids = &stop_id, m[4].n_stop_ids = 1;
    uint64_t a0 = ahead(e);
    for (int i = 0; i < MATES; i++)
        CHECK_OK(engine_wait_submit(&w[i], e, &m[i], on_event, &mates[i]));
    CHECK_OK(engine_wait_submit(&w[MATES], e, &r, on_event, &beside));
    for (int i = 0; i <= MATES; i++) engine_wait_end(&w[i]);
    uint64_t mates_ahead = ahead(e) - a0;
    CHECK_MSG(mates_ahead >= MAX / 4, "the mates' steps: %llu queued ahead",
              (unsigned long long)mates_ahead);
    for (int i = 0; i < MATES; i++)
        if (i != 4)
            CHECK_MSG(mates[i].n == m[i].max_tokens && mates[i].finish == ATLAS_FINISH_LENGTH,
                      "mate %d: %d tokens (finish %d), asked %d", i, mates[i].n,
                      (int)mates[i].finish, m[i].max_tokens);
    /* it ends at the stop id (not among the ids it gives) before its length, or never drew
     * it and runs to its length */
    int at = 0;
    while (at < mates[4].n && mates[4].ids[at] != stop_id) at++;
    CHECK_MSG(at == mates[4].n && (mates[4].finish == ATLAS_FINISH_STOP ? mates[4].n < MAX
                                                                        : mates[4].n == MAX),
              "the mate with a stop id %d (given at %d): %d tokens, finish %d", stop_id, at,
              mates[4].n, (int)mates[4].finish);
    /* the same ids as alone: the CPU's sums do not depend on the batch (cpu_bf16.c); a GPU's
     * kernels do, from one row to several, so there only the rows' endings are compared */
    if (device == ATLAS_DEVICE_CPU) {
        CHECK_MSG(same(&sampled, &beside), "the seeded request drew otherwise beside mates");
        CHECK_MSG(mates[4].finish == ATLAS_FINISH_STOP && mates[4].n == first &&
                      !memcmp(mates[4].ids, greedy.ids, 4 * (size_t)first),
                  "the greedy mate with a stop id drew otherwise than greedy alone");
        got alone0 = {0};
        CHECK_OK(engine_wait_run(e, &m[0], on_event, &alone0));
        CHECK_MSG(same(&alone0, &mates[0]), "a greedy mate's ids changed beside sampled ones");
    }
    atlas_engine_free(e);

    /* OFF, and AUTO on the CPU: nothing queued, the same ids */
    for (int k = device == ATLAS_DEVICE_CUDA; k < 2; k++) {
        atlas_engine *e2 = make(dir, k ? ATLAS_STEP_AHEAD_OFF : ATLAS_STEP_AHEAD_AUTO);
        if (!e2) continue;
        got again = {0};
        CHECK_OK(engine_wait_run(e2, &r, on_event, &again));
        CHECK_MSG(ahead(e2) == 0 && same(&again, &sampled), "step_ahead %s: %llu queued, ids %s",
                  k ? "off" : "auto", (unsigned long long)ahead(e2),
                  same(&again, &sampled) ? "the same" : "otherwise");
        atlas_engine_free(e2);
    }
    atlas_engine_model mod = {.name = "tiny", .dir = dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &mod;
    p.n_models = 1;
    p.device = device;
    p.step_ahead = (atlas_step_ahead)7;
    atlas_engine *bad = NULL;
    CHECK(atlas_engine_create(&p, &bad) == ATLAS_ERR_INVALID && !bad);
    printf("steps queued ahead on the %s: sampled and greedy ids equal the stepped ones, "
           "alone and beside %d mates (%llu of their steps queued ahead)\n",
           device == ATLAS_DEVICE_CUDA ? "GPU" : "CPU", MATES, (unsigned long long)mates_ahead);
    return harness_finish();
}
