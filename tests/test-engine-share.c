/* tests/test-engine-share.c — the prefix cache shared while it fills, on the CPU backend with
 * tests/data/tiny-llama3:
 * - 64 requests submitted together with one 2,000-token prefix and a suffix each compute at
 *   most the prefix once, their suffixes and one step's budget of prompt tokens (the
 *   engine's prompt_tokens counter), report the prefix as cached, and answer greedily token
 *   for token as each does alone (under its own cache_salt, nothing shared);
 * - in a pool too small for all of them, requests sharing a prefix are preempted and
 *   resumed and still answer as alone, while others sharing it are cancelled;
 * every block is back in the pool after each.
 * With --step-ahead on, the same with steps queued ahead, planned behind the step queued
 * before (step.c's run_ahead), as a GPU serves them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "engine_wait.h"
#include "harness.h"

enum { N_REQ = 64, PREFIX = 2000, MAX_SUFFIX = 12, N_OUT = 4, BUDGET = 512, MAX_OUT = 48 };

typedef struct answer {
    int32_t ids[MAX_OUT];
    int n_ids, cached, done;
    atlas_finish finish;
    char msg[256];
} answer;

static void on_event(const atlas_event *ev, void *user) {
    answer *a = user;
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (a->n_ids < MAX_OUT) a->ids[a->n_ids++] = ev->id;
        return;
    }
    a->finish = ev->finish;
    a->cached = ev->usage.cached_tokens;
    snprintf(a->msg, sizeof a->msg, "%s", ev->message);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE); /* read by a test that polls it */
}

/* Request i's prompt: a shared prefix of `prefix` tokens, then its own suffix (its first
 * token differs from every other request's), of 3 to MAX_SUFFIX tokens. */
static int prompt_of(int i, int prefix, int32_t *out) {
    for (int k = 0; k < prefix; k++) out[k] = 1000 + (k * 7919) % 20000;
    int n = 3 + i % (MAX_SUFFIX - 2);
    for (int k = 0; k < n; k++) out[prefix + k] = 30000 + i * 50 + k;
    return prefix + n;
}

static atlas_request request_of(const int32_t *ids, int n, int max, const char *salt) {
    atlas_request r = {.model = "tiny", .prompt = ids, .n_prompt = (size_t)n,
                       .max_tokens = max, .ignore_eos = 1, .cache_salt = salt};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    return r;
}

static char dir[1024];
static atlas_step_ahead step_ahead = ATLAS_STEP_AHEAD_AUTO;

static atlas_engine *engine_new(int parallel, int ctx, int budget, int kv_blocks) {
    static atlas_engine_model mod = {.name = "tiny"};
    mod.dir = dir;
    atlas_engine_params p = atlas_engine_default_params();
    p.models = &mod;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.parallel = parallel;
    p.queue_limit = 4 * parallel;
    p.ctx_size = ctx;
    p.batch_tokens = budget;
    p.kv_blocks = kv_blocks;
    p.step_ahead = step_ahead;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (e) CHECK_OK(atlas_engine_load(e, "tiny")); /* nothing is admitted while it loads */
    return e;
}

static void test_together(void) {
    atlas_engine *e = engine_new(N_REQ, 2048, BUDGET, 0);
    if (!e) return;

    static int32_t prompts[N_REQ][PREFIX + MAX_SUFFIX];
    static answer together[N_REQ], alone[N_REQ];
    static engine_wait w[N_REQ];
    int n[N_REQ], suffixes = 0;
    for (int i = 0; i < N_REQ; i++) {
        n[i] = prompt_of(i, PREFIX, prompts[i]);
        suffixes += n[i] - PREFIX;
    }
    atlas_engine_metrics m0, m1;
    atlas_engine_get_metrics(e, &m0);
    for (int i = 0; i < N_REQ; i++) {
        atlas_request r = request_of(prompts[i], n[i], N_OUT, NULL);
        CHECK_OK(engine_wait_submit(&w[i], e, &r, on_event, &together[i]));
    }
    for (int i = 0; i < N_REQ; i++) engine_wait_end(&w[i]);
    atlas_engine_get_metrics(e, &m1);
    uint64_t computed = m1.prompt_tokens - m0.prompt_tokens;
    printf("%d requests sharing a %d-token prefix: %llu prompt tokens computed (bound %d)\n",
           N_REQ, PREFIX, (unsigned long long)computed, PREFIX + suffixes + BUDGET);
    CHECK_MSG(computed <= (uint64_t)(PREFIX + suffixes + BUDGET),
              "%llu prompt tokens computed for a %d-token prefix and %d of suffixes",
              (unsigned long long)computed, PREFIX, suffixes);
    int sharing = 0;
    for (int i = 0; i < N_REQ; i++) {
        CHECK_MSG(together[i].finish == ATLAS_FINISH_LENGTH && together[i].n_ids == N_OUT,
                  "request %d: finish %d, %d ids (%s)", i, together[i].finish,
                  together[i].n_ids, together[i].msg);
        /* blocks of 16: the whole prefix, or nothing for the one that computed it */
        CHECK_MSG(together[i].cached == 0 || together[i].cached == PREFIX, "request %d: %d cached",
                  i, together[i].cached);
        sharing += together[i].cached == PREFIX;
    }
    CHECK_MSG(sharing >= N_REQ - 1, "%d of %d requests found the prefix cached", sharing, N_REQ);
    CHECK(m1.kv_blocks_used == 0);
    uint64_t ahead = m1.steps_ahead - m0.steps_ahead, steps = m1.steps - m0.steps;
    printf("  in %llu steps, %llu of them queued behind another\n", (unsigned long long)steps,
           (unsigned long long)ahead);
    /* a step of prompt chunks alone (the prefix's) has no logit row to queue ids of */
    CHECK_MSG(step_ahead == ATLAS_STEP_AHEAD_ON ? ahead >= N_REQ / 4 : ahead == 0,
              "%llu of %llu steps queued ahead (step_ahead %d)", (unsigned long long)ahead,
              (unsigned long long)steps, (int)step_ahead);

    /* each alone, under a salt of its own: nothing cached, the same answer */
    for (int i = 0; i < N_REQ; i++) {
        char salt[32];
        snprintf(salt, sizeof salt, "alone-%d", i);
        atlas_request r = request_of(prompts[i], n[i], N_OUT, salt);
        CHECK_OK(engine_wait_run(e, &r, on_event, &alone[i]));
        CHECK(alone[i].cached == 0 && alone[i].n_ids == N_OUT);
        CHECK_MSG(!memcmp(alone[i].ids, together[i].ids, N_OUT * sizeof *alone[i].ids),
                  "request %d answers otherwise alone than among the others", i);
    }
    atlas_engine_metrics m2;
    atlas_engine_get_metrics(e, &m2);
    CHECK(m2.kv_blocks_used == 0);
    atlas_engine_free(e);
}

/* 16 requests with a 160-token prefix in a pool of 40 blocks of 16: they share the prefix
 * and admission counts their prompts only, so their answers outgrow the pool and the newest
 * are preempted, then resumed (the prefix found again); 4 more sharing it are cancelled
 * while they run or wait. */
static void test_preempted(void) {
    enum { N = 16, N_CANCEL = 4, SHORT = 160 };
    atlas_engine *e = engine_new(N + N_CANCEL, 256, 64, 40);
    if (!e) return;
    static int32_t prompts[N + N_CANCEL][SHORT + MAX_SUFFIX];
    static answer got[N + N_CANCEL], alone[N];
    static engine_wait w[N + N_CANCEL];
    atlas_request_handle *h[N_CANCEL] = {0};
    int n[N + N_CANCEL];
    for (int i = 0; i < N + N_CANCEL; i++) {
        n[i] = prompt_of(i, SHORT, prompts[i]);
        atlas_request r = request_of(prompts[i], n[i], MAX_OUT, NULL);
        if (i < N) {
            CHECK_OK(engine_wait_submit(&w[i], e, &r, on_event, &got[i]));
            continue;
        }
        CHECK_OK(atlas_engine_submit(e, &r, on_event, &got[i], &h[i - N]));
    }
    for (int i = 0; i < N_CANCEL; i++) atlas_engine_cancel(h[i]);
    for (int i = 0; i < N; i++) engine_wait_end(&w[i]);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    printf("%d requests sharing a %d-token prefix in 40 blocks: %llu preemptions\n", N, SHORT,
           (unsigned long long)m.preemptions);
    CHECK_MSG(m.preemptions > 0, "no preemption: the test proves nothing of resumption");
    for (int i = 0; i < N; i++) {
        char salt[32];
        snprintf(salt, sizeof salt, "alone-%d", i);
        atlas_request r = request_of(prompts[i], n[i], MAX_OUT, salt);
        CHECK_OK(engine_wait_run(e, &r, on_event, &alone[i]));
        CHECK_MSG(got[i].finish == ATLAS_FINISH_LENGTH && got[i].n_ids == MAX_OUT &&
                      alone[i].n_ids == MAX_OUT,
                  "request %d: finish %d, %d ids (%s)", i, got[i].finish, got[i].n_ids,
                  got[i].msg);
        CHECK_MSG(!memcmp(alone[i].ids, got[i].ids, sizeof got[i].ids),
                  "request %d answers otherwise after a preemption than alone", i);
    }
    for (int i = N; i < N + N_CANCEL; i++) {
        while (!__atomic_load_n(&got[i].done, __ATOMIC_ACQUIRE)) usleep(1000);
        CHECK_MSG(got[i].finish == ATLAS_FINISH_CANCELLED, "request %d: finish %d", i,
                  got[i].finish);
    }
    for (int i = 0; i < N_CANCEL; i++) atlas_engine_handle_free(h[i]);
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.kv_blocks_used == 0, "%d blocks still held", m.kv_blocks_used);
    atlas_engine_free(e);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--step-ahead") && !strcmp(argv[2], "on")) {
        step_ahead = ATLAS_STEP_AHEAD_ON;
    } else if (argc != 1) {
        fprintf(stderr, "usage: test-engine-share [--step-ahead on]\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s/tiny-llama3", harness_data_dir());
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!harness_require_file(path)) return harness_finish();
    test_together();
    test_preempted();
    return harness_finish();
}
