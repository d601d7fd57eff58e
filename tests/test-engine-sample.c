/* tests/test-engine-sample.c — seeded sampling through the engine on the CPU backend (the
 * tiny-llama3 fixture), where every sampled row goes through the backend's sample op:
 * - a request with every transform (temperature, top-k, top-p, min-p, the three penalties,
 *   logit_bias, logprobs) gives the ids and logprobs of a loop that runs the model and calls
 *   the sampler with the real history at each token's position (atlas_sampler_sample_at):
 *   the engine's adjustments and counters are the sampler's history and stream;
 * - the same seed gives the same tokens alone, again, and beside batch-mates of other seeds,
 *   parameters, a greedy one and a teacher-forced one (the host path) in the same steps;
 * - another seed gives other tokens. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/model.h"
#include "atlas/sampler.h"
#include "engine_wait.h"
#include "harness.h"
#include "model/forward.h"

enum { MAX = 16, NP = 12, MATES = 6 };

typedef struct got {
    int32_t ids[MAX];
    float lps[MAX];
    int n;
    atlas_finish finish;
} got;

static void on_event(const atlas_event *ev, void *user) {
    got *g = user;
    if (ev->type == ATLAS_EVENT_TOKEN && g->n < MAX) {
        g->lps[g->n] = ev->logprob;
        g->ids[g->n++] = ev->id;
    } else if (ev->type == ATLAS_EVENT_END) {
        g->finish = ev->finish;
    }
}

static const int32_t prompt[NP] = {3, 17, 42, 5, 9, 17, 23, 42, 8, 1, 17, 30};
static const atlas_logit_bias bias[2] = {{5, 2.0f}, {9, -100.0f}};

static atlas_request sampled(const char *model, uint64_t seed) {
    atlas_request r = {.model = model, .prompt = prompt, .n_prompt = NP, .max_tokens = MAX,
                       .ignore_eos = 1, .logprobs = 1};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 50;
    r.sampling.top_p = 0.95f;
    r.sampling.min_p = 0.02f;
    r.sampling.repetition_penalty = 1.2f;
    r.sampling.presence_penalty = 0.3f;
    r.sampling.frequency_penalty = 0.2f;
    r.sampling.logit_bias = bias;
    r.sampling.n_logit_bias = 2;
    r.sampling.seed = seed;
    return r;
}

/* The request run by hand: the model's logits, the sampler with the real history. */
static void reference(const char *dir, const atlas_request *r, got *want) {
    atlas_model_params mp = atlas_model_default_params();
    mp.device = ATLAS_DEVICE_CPU;
    mp.n_threads = 2;
    mp.load_tokenizer = 0;
    mp.kv_block_size = 16;
    mp.kv_tokens = 64;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &mp, &m));
    atlas_sampler *s = NULL;
    CHECK_OK(atlas_sampler_create(&r->sampling, &s));
    if (!m || !s) goto out;
    atlas_sampler_set_prompt_len(s, NP);
    int V = atlas_model_vocab_size(m), n = NP;
    int32_t toks[NP + MAX], pos[NP], table[4] = {0, 1, 2, 3};
    memcpy(toks, prompt, sizeof prompt);
    float *logits = malloc(sizeof(float) * V), *work = malloc(sizeof(float) * V);
    for (int k = 0; k < MAX; k++) {
        int first = k == 0 ? 0 : n - 1, len = n - first; /* the prompt, then one token */
        for (int i = 0; i < len; i++) pos[i] = first + i;
        int32_t start[2] = {0, len}, ctx = n, row = len - 1;
        atlas_batch b = {.n_tokens = len, .tokens = toks + first, .positions = pos,
                         .n_seqs = 1, .seq_start = start, .seq_ctx = &ctx,
                         .block_table = table, .max_blocks = 4, .n_logits = 1,
                         .logit_rows = &row};
        CHECK_OK(atlas_model_forward(m, &b, logits));
        memcpy(work, logits, sizeof(float) * V);
        int32_t id = -1;
        CHECK_OK(atlas_sampler_sample_at(s, work, V, toks, (size_t)n, (uint64_t)n, &id));
        CHECK_OK(atlas_sampler_logprobs(logits, V, id, &want->lps[k], 0, NULL, NULL, NULL));
        want->ids[want->n++] = id;
        toks[n++] = id;
    }
    free(logits);
    free(work);
out:
    atlas_sampler_free(s);
    if (m) CHECK_OK(atlas_model_release(m));
}

static int same(const got *a, const got *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

/* Batch-mate i of the seeded request: other seeds and parameters, a greedy one and a
 * teacher-forced one (its ids chosen on the host). */
static atlas_request mate(const char *model, int i, const int32_t *forced) {
    atlas_request r = sampled(model, 7000 + (uint64_t)i);
    r.prompt = prompt + i % 3;
    r.n_prompt = (size_t)(NP - i % 3);
    r.max_tokens = MAX - i;
    r.logprobs = i % 2;
    r.top_logprobs = i % 3 == 0 ? 4 : 0;
    if (i == 1) r.sampling = atlas_sampler_default_params(), r.sampling.temperature = 0;
    if (i == 2) r.sampling.n_logit_bias = 0, r.sampling.top_k = 0;
    if (i == 3) r.forced = forced, r.n_forced = 5;
    return r;
}

int main(void) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tiny-llama3", harness_data_dir());
    if (!harness_require_file(harness_data_path("tiny-llama3/tokenizer.json")))
        return harness_finish();
    atlas_engine_model mod = {.name = "tiny", .dir = dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &mod;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return harness_finish();
    atlas_request r = sampled("tiny", 42);
    got alone = {0}, again = {0}, want = {0}, other = {0};
    CHECK_OK(engine_wait_run(e, &r, on_event, &alone));
    CHECK_OK(engine_wait_run(e, &r, on_event, &again));
    CHECK_MSG(alone.n == MAX && same(&alone, &again), "%d ids, then again otherwise", alone.n);
    reference(dir, &r, &want);
    CHECK_MSG(same(&alone, &want), "the engine's draws are not the sampler's at each position");
    for (int k = 0; k < alone.n && k < want.n; k++)
        CHECK_MSG(fabsf(alone.lps[k] - want.lps[k]) <= 1e-6f, "token %d: logprob %g, want %g", k,
                  alone.lps[k], want.lps[k]);
    /* beside batch-mates, submitted together so that they share steps */
    engine_wait w[MATES + 1];
    got mates[MATES], beside = {0};
    memset(mates, 0, sizeof mates);
    int32_t forced[5] = {11, 12, 13, 14, 15};
    for (int i = 0; i < MATES; i++) {
        atlas_request m = mate("tiny", i, forced);
        CHECK_OK(engine_wait_submit(&w[i], e, &m, on_event, &mates[i]));
    }
    CHECK_OK(engine_wait_submit(&w[MATES], e, &r, on_event, &beside));
    for (int i = 0; i <= MATES; i++) engine_wait_end(&w[i]);
    CHECK_MSG(same(&alone, &beside), "the seeded request drew otherwise beside batch-mates");
    CHECK(mates[3].n >= 5 && !memcmp(mates[3].ids, forced, sizeof forced));
    for (int i = 0; i < MATES; i++) CHECK(mates[i].n == MAX - i);
    r.sampling.seed = 43;
    CHECK_OK(engine_wait_run(e, &r, on_event, &other));
    CHECK_MSG(other.n == MAX && !same(&alone, &other), "seeds 42 and 43 drew the same ids");
    atlas_engine_free(e);
    return harness_finish();
}
