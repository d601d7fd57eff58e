/* tests/test-engine-think.c — the thinking budget (atlas_request.think_budget) through the
 * engine with the tiny-qwen3 fixture (random weights, its real tokenizer, CPU backend):
 * - a block the prompt opened closes with "</think>" right after the budget's tokens, which
 *   are those the same request gives without a budget (the same seed, and greedy, where the
 *   budget takes the sampling path instead of the argmax one), and the reply goes on after;
 * - a block opened by the reply counts from its opening tag on;
 * - a closing tag of several ids is forced whole; a block closed early spends only what it
 *   used, and one opened once the budget is spent is closed at once;
 * - bad fields are refused (negative budget, no closing ids, ids outside the vocabulary, a
 *   budget with a constraint).
 * Random weights never write "</think>" by themselves (one id of 151k), so a closing tag
 * where the budget ends is the budget's doing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/tokenizer.h"
#include "engine_wait.h"
#include "harness.h"

enum { MAX_IDS = 64 };

typedef struct coll {
    int32_t ids[MAX_IDS];
    int n;
    atlas_finish finish;
} coll;

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    if (ev->type == ATLAS_EVENT_TOKEN && c->n < MAX_IDS) c->ids[c->n++] = ev->id;
    if (ev->type == ATLAS_EVENT_END) {
        c->finish = ev->finish;
    }
}

/* Submits r and waits for its end into *c. */
static atlas_status run(atlas_engine *e, const atlas_request *r, coll *c) {
    memset(c, 0, sizeof *c);
    return engine_wait_run(e, r, on_event, c);
}

static const int32_t *prompt;
static size_t n_prompt;
static int32_t open_id, close_id;

static atlas_request request(int max_tokens, float temperature, uint64_t seed) {
    atlas_request r = {.model = "qwen", .prompt = prompt, .n_prompt = n_prompt,
                       .max_tokens = max_tokens};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.think_open = &open_id;
    r.n_think_open = 1;
    r.think_close = &close_id;
    r.n_think_close = 1;
    return r;
}

static int count(const coll *c, int32_t id) {
    int k = 0;
    for (int i = 0; i < c->n; i++) k += c->ids[i] == id;
    return k;
}

/* The prompt opened the block: budget tokens as without one, then "</think>", then more. */
static void test_inside(atlas_engine *e, float temperature) {
    const int budget = 5, max = 12;
    coll free_run, c;
    atlas_request r = request(max, temperature, 7);
    r.think_inside = 1;
    CHECK_OK(run(e, &r, &free_run));
    CHECK(free_run.n == max && free_run.finish == ATLAS_FINISH_LENGTH);
    CHECK_MSG(count(&free_run, close_id) == 0, "random weights closed the block themselves");
    r.think_budget = budget;
    CHECK_OK(run(e, &r, &c));
    CHECK_MSG(c.n == max && c.finish == ATLAS_FINISH_LENGTH, "%d tokens, finish %d", c.n,
              (int)c.finish);
    CHECK_MSG(!memcmp(c.ids, free_run.ids, budget * sizeof *c.ids),
              "temperature %.0f: the budget's tokens differ from the free run's", temperature);
    CHECK_MSG(c.ids[budget] == close_id, "temperature %.0f: token %d is %d, not </think>",
              temperature, budget, (int)c.ids[budget]);
    CHECK(count(&c, close_id) == 1);
    /* without think_inside and no opening tag written, the budget never applies */
    r.think_inside = 0;
    CHECK_OK(run(e, &r, &c));
    CHECK(c.n == max && count(&c, close_id) == 0);
}

/* The reply opens the block (teacher forcing writes the tag): counted from there on. */
static void test_opened(atlas_engine *e) {
    const int budget = 3;
    int32_t forced[2] = {prompt[0], open_id};
    coll free_run, c;
    atlas_request r = request(10, 1.0f, 11);
    r.forced = forced;
    r.n_forced = 2;
    CHECK_OK(run(e, &r, &free_run));
    r.think_budget = budget;
    CHECK_OK(run(e, &r, &c));
    CHECK(c.n == 10 && free_run.n == 10);
    CHECK(!memcmp(c.ids, free_run.ids, (2 + budget) * sizeof *c.ids));
    CHECK_MSG(c.ids[2 + budget] == close_id, "token %d is %d, not </think>", 2 + budget,
              (int)c.ids[2 + budget]);
}

/* A closing tag of two ids, a block closed early, and one reopened once the budget is spent. */
static void test_tags(atlas_engine *e) {
    int32_t two[2] = {close_id, prompt[1]};
    coll c;
    atlas_request r = request(8, 1.0f, 3);
    r.think_inside = 1;
    r.think_budget = 2;
    r.think_close = two;
    r.n_think_close = 2;
    CHECK_OK(run(e, &r, &c));
    CHECK(c.n == 8);
    CHECK_MSG(c.ids[2] == two[0] && c.ids[3] == two[1], "forced %d %d", (int)c.ids[2],
              (int)c.ids[3]);

    /* open, one token, close (1 of 2 spent), open, one token, then the budget closes it */
    int32_t forced[5] = {open_id, prompt[0], close_id, open_id, prompt[1]};
    r = request(10, 1.0f, 5);
    r.forced = forced;
    r.n_forced = 5;
    r.think_budget = 2;
    CHECK_OK(run(e, &r, &c));
    CHECK(c.n == 10 && !memcmp(c.ids, forced, sizeof forced));
    CHECK_MSG(c.ids[5] == close_id, "token 5 is %d, not </think>", (int)c.ids[5]);
    /* spent: a block opened now closes at once */
    int32_t again[4] = {open_id, prompt[0], close_id, open_id};
    r.forced = again;
    r.n_forced = 4;
    r.think_budget = 1;
    CHECK_OK(run(e, &r, &c));
    CHECK_MSG(c.ids[4] == close_id, "token 4 is %d, not </think>", (int)c.ids[4]);
}

static void test_refused(atlas_engine *e) {
    coll c;
    int32_t bad = 1 << 30;
    atlas_request r = request(4, 0.0f, 1);
    r.think_budget = -1;
    CHECK(run(e, &r, &c) == ATLAS_ERR_INVALID);
    r.think_budget = 4;
    r.n_think_close = 0;
    CHECK(run(e, &r, &c) == ATLAS_ERR_INVALID);
    r.n_think_close = ATLAS_ENGINE_MAX_THINK_IDS + 1;
    CHECK(run(e, &r, &c) == ATLAS_ERR_INVALID);
    r.n_think_close = 1;
    r.think_open = &bad;
    CHECK(run(e, &r, &c) == ATLAS_ERR_RANGE);
    r.think_open = &open_id;
    atlas_constraint *k = NULL;
    CHECK_OK(atlas_constraint_new(&k));
    CHECK_OK(atlas_constraint_add_json_object(k));
    r.constraint = k;
    CHECK(run(e, &r, &c) == ATLAS_ERR_INVALID);
    atlas_constraint_free(k);
}

int main(void) {
    char qdir[1024];
    snprintf(qdir, sizeof qdir, "%s/tiny-qwen3", harness_data_dir());
    atlas_engine_model models[] = {{.name = "qwen", .dir = qdir}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.ctx_size = 256;
    p.parallel = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return harness_finish();
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "qwen", &tok));
    open_id = atlas_tokenizer_token_id(tok, "<think>");
    close_id = atlas_tokenizer_token_id(tok, "</think>");
    CHECK(open_id >= 0 && close_id >= 0);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "Why is the sky blue?";
    CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    prompt = ids;
    n_prompt = n;
    if (open_id >= 0 && close_id >= 0 && n >= 2) {
        test_inside(e, 1.0f);
        test_inside(e, 0.0f);
        test_opened(e);
        test_tags(e);
        test_refused(e);
    }
    free(ids);
    atlas_engine_free(e);
    return harness_finish();
}
