/* tests/test-engine.c — the engine on the CPU backend with the fixture models
 * (tests/data/tiny-llama3, tiny-qwen3): greedy output matches transformers' reference ids
 * (prompt 6, ~500 tokens, prefilled in chunks of 64); at temperature 0 (and seeded sampling)
 * a request's output is identical alone and in a batch of 32; a tiny KV pool preempts and
 * still completes every sequence right; cancel frees a running and a queued request's blocks
 * at once; stop strings; submit's errors (unknown model, prompt past the context, full queue);
 * swaps of two models with max_resident 1 under requests from two threads, every answer
 * right, RSS stable, swapping a bounded share of the time; a failed load errors its requests
 * only; load/unload by hand; prefix caching; LRU residency with three models; unload refused
 * while a sequence runs; gpu_memory; drain_timeout_ms pausing a victim. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "atlas/tokenizer.h"
#include "core/clock.h"
#include "harness.h"
#include "format/safetensors.h"

enum { MAX_IDS = 1024, N_GREEDY = 24, N_PROMPTS = 7 };

/* ---- collecting one request's events ---------------------------------------------------- */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t ids[MAX_IDS];
    int n_ids;
    char text[8192];
    size_t n_text;
    int n_events, done, n_ends;
    atlas_finish finish;
    atlas_status status;
    char msg[512];
    char stop_string[64];
    atlas_usage usage;
    float logprob_sum;
    atlas_top_logprob top[MAX_IDS][8]; /* the first 8 top logprobs of each token event */
    int n_top[MAX_IDS];
} coll;

static coll *coll_new(void) {
    coll *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

static void coll_free(coll *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->n_text + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->n_text, ev->text, ev->text_len);
        c->n_text += ev->text_len;
    }
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (c->n_ids < MAX_IDS) {
            int k = ev->n_top < 8 ? ev->n_top : 8;
            if (k > 0) memcpy(c->top[c->n_ids], ev->top, (size_t)k * sizeof *ev->top);
            c->n_top[c->n_ids] = k;
            c->ids[c->n_ids++] = ev->id;
        }
        c->logprob_sum += ev->logprob;
        c->n_events++;
    } else {
        c->n_ends++;
        c->done = 1;
        c->finish = ev->finish;
        c->status = ev->status;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message);
        snprintf(c->stop_string, sizeof c->stop_string, "%s",
                 ev->stop_string ? ev->stop_string : "");
        c->usage = ev->usage;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void coll_wait(coll *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* Waits until at least n tokens have arrived (or the end). */
static void coll_wait_tokens(coll *c, int n) {
    pthread_mutex_lock(&c->mu);
    while (!c->done && c->n_ids < n) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ---- fixtures --------------------------------------------------------------------------- */

typedef struct ref_prompt {
    const int32_t *ids;
    int n;
    const int32_t *greedy; /* [N_GREEDY] */
    int n_sure;            /* greedy steps before the first margin < 1e-3 */
} ref_prompt;

typedef struct fixture {
    const char *name;
    char dir[1024];
    atlas_st *st;
    ref_prompt p[N_PROMPTS];
} fixture;

static int fixture_open(fixture *f, const char *name) {
    f->name = name;
    snprintf(f->dir, sizeof f->dir, "%s/%s", harness_data_dir(), name);
    char path[1100], key[64];
    snprintf(path, sizeof path, "%s/tokenizer.json", f->dir);
    if (!harness_require_file(path)) return 0;
    snprintf(path, sizeof path, "%s/reference.safetensors", f->dir);
    CHECK_OK(atlas_st_open_file(path, &f->st));
    if (!f->st) return 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(key, sizeof key, "p%d.ids", i);
        const atlas_tensor_view *v = atlas_st_find(f->st, key);
        snprintf(key, sizeof key, "p%d.greedy_ids", i);
        const atlas_tensor_view *g = atlas_st_find(f->st, key);
        snprintf(key, sizeof key, "p%d.greedy_margins", i);
        const atlas_tensor_view *m = atlas_st_find(f->st, key);
        CHECK(v && g && m);
        if (!v || !g || !m) return 0;
        f->p[i].ids = v->data;
        f->p[i].n = (int)v->shape[0];
        f->p[i].greedy = g->data;
        const float *margins = m->data;
        int k = 0;
        while (k < N_GREEDY && margins[k] >= 1e-3f) k++;
        f->p[i].n_sure = k;
    }
    return 1;
}

static atlas_request greedy_request(const char *model, const int32_t *ids, int n, int max) {
    atlas_request r = {.model = model, .prompt = ids, .n_prompt = (size_t)n, .max_tokens = max,
                       .ignore_eos = 1};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    return r;
}

static atlas_engine *engine_new(const atlas_engine_model *models, int n,
                                const atlas_engine_params *over) {
    atlas_engine_params p = over ? *over : atlas_engine_default_params();
    p.models = models;
    p.n_models = n;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

/* Submits and waits; returns the collector (caller frees).  A failed submit reads as an
 * ERROR end (no CHECK here: the swap test calls this from two threads). */
static coll *run_one(atlas_engine *e, const atlas_request *r) {
    coll *c = coll_new();
    atlas_status st = atlas_engine_submit(e, r, on_event, c, NULL);
    if (st != ATLAS_OK) {
        c->done = 1;
        c->finish = ATLAS_FINISH_ERROR;
        c->status = st;
        snprintf(c->msg, sizeof c->msg, "submit: %s", atlas_last_error());
    }
    coll_wait(c);
    return c;
}

static int same_ids(const coll *a, const coll *b) {
    return a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, (size_t)a->n_ids * sizeof *a->ids);
}

/* The reference's greedy ids, as far as both the output and the reference's margins go. */
static int matches_reference(const coll *c, const ref_prompt *p) {
    for (int k = 0; k < p->n_sure && k < c->n_ids; k++)
        if (c->ids[k] != p->greedy[k]) return 0;
    return c->n_ids > 0;
}

static void check_kv_empty(atlas_engine *e, const char *when) {
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.kv_blocks_used == 0 && m.running == 0 && m.queue_len == 0,
              "%s: %d blocks used, %d running, %d queued", when, m.kv_blocks_used, m.running,
              m.queue_len);
}

/* ---- tests ------------------------------------------------------------------------------ */

/* An engine of f's model that prefills in chunks of 64 tokens, contexts of 1,024. */
static atlas_engine *engine_chunked(const fixture *f) {
    atlas_engine_model mod = {.name = f->name, .dir = f->dir}; /* copied by create */
    atlas_engine_params p = atlas_engine_default_params();
    p.batch_tokens = 64;
    p.ctx_size = 1024;
    return engine_new(&mod, 1, &p);
}

/* Every reference prompt, greedy, in chunks of 64 prompt tokens. */
static void test_reference(const fixture *f) {
    atlas_engine *e = engine_chunked(f);
    if (!e) return;
    for (int i = 0; i < N_PROMPTS; i++) {
        atlas_request r = greedy_request(f->name, f->p[i].ids, f->p[i].n, N_GREEDY);
        coll *c = run_one(e, &r);
        CHECK_MSG(c->finish == ATLAS_FINISH_LENGTH && c->n_ids == N_GREEDY,
                  "%s p%d: finish %d, %d ids (%s)", f->name, i, c->finish, c->n_ids, c->msg);
        CHECK_MSG(matches_reference(c, &f->p[i]), "%s p%d (%d tokens): greedy ids differ from "
                  "the reference in the first %d", f->name, i, f->p[i].n, f->p[i].n_sure);
        CHECK(c->usage.prompt_tokens == f->p[i].n && c->usage.completion_tokens == N_GREEDY);
        /* the streamed text is the decode of the ids */
        const atlas_tokenizer *tok = NULL;
        CHECK_OK(atlas_engine_tokenizer(e, f->name, &tok));
        char *text = NULL;
        size_t len = 0;
        if (tok) CHECK_OK(atlas_tokenizer_decode(tok, c->ids, (size_t)c->n_ids, true, &text, &len));
        CHECK_MSG(text && len == c->n_text && !memcmp(text, c->text, len),
                  "%s p%d: streamed text differs from the decode", f->name, i);
        free(text);
        coll_free(c);
    }
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.prompt_tokens >= (uint64_t)f->p[6].n && m.loads == 1);
    CHECK(m.finished_length == N_PROMPTS && m.ttft.n == N_PROMPTS);
    check_kv_empty(e, "reference");
    atlas_engine_free(e);
}

/* Teacher forcing after a chunked prefill: prompt 6 but its last 20 tokens is the prompt
 * (7-8 chunks of 64), the next 16 are forced; at each forced step the top 8 must be the
 * reference's top 8 at that position, their logprobs apart by what its logits are. */
static void test_forced(const fixture *f) {
    atlas_engine *e = engine_chunked(f);
    if (!e) return;
    const ref_prompt *rp = &f->p[6];
    const atlas_tensor_view *ti = atlas_st_find(f->st, "p6.topk_ids");
    const atlas_tensor_view *tv = atlas_st_find(f->st, "p6.topk_values");
    enum { FORCED = 16 };
    const int PROMPT = rp->n - 20;
    CHECK(ti && tv && PROMPT > 400);
    if (!ti || !tv || PROMPT <= 400) return;
    const int32_t *ref_ids = ti->data;
    const float *ref_v = tv->data;
    atlas_request r = greedy_request(f->name, rp->ids, PROMPT, FORCED);
    r.forced = rp->ids + PROMPT;
    r.n_forced = FORCED;
    r.top_logprobs = 8;
    coll *c = run_one(e, &r);
    CHECK_MSG(c->n_ids == FORCED, "%s: %d forced tokens came back (%s)", f->name, c->n_ids, c->msg);
    double worst = 0;
    for (int j = 0; j < c->n_ids && j < FORCED; j++) {
        CHECK_MSG(c->ids[j] == rp->ids[PROMPT + j], "%s: forced token %d is %d, want %d",
                  f->name, j, c->ids[j], rp->ids[PROMPT + j]);
        const int32_t *want = ref_ids + (size_t)(PROMPT - 1 + j) * 8;
        const float *wv = ref_v + (size_t)(PROMPT - 1 + j) * 8;
        CHECK(c->n_top[j] == 8);
        for (int k = 0; k < c->n_top[j]; k++) {
            CHECK_MSG(c->top[j][k].id == want[k], "%s: step %d: top %d is %d, want %d", f->name,
                      j, k, c->top[j][k].id, want[k]);
            double d = fabs((c->top[j][k].logprob - c->top[j][0].logprob) - (wv[k] - wv[0]));
            if (d > worst) worst = d;
        }
    }
    printf("%s: %d forced steps after a prompt of %d in chunks of 64: top-8 logprob gaps within "
           "%.2e of the reference's logits\n", f->name, FORCED, PROMPT, worst);
    CHECK_MSG(worst < 1e-3, "%s: forced steps: %g", f->name, worst);
    coll_free(c);
    check_kv_empty(e, "forced");
    atlas_engine_free(e);
}

/* Prefix caching: the second run of prompt 6 (~500 tokens) reuses its full blocks and still
 * gives the reference ids; a prompt that shares only its first 300 tokens reuses 288 of
 * them (18 blocks of 16) and answers as a fresh engine does; under a new cache_salt the
 * same prompt reuses nothing, then its own salt's blocks. */
static void test_prefix_cache(const fixture *f) {
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.batch_tokens = 64;
    p.ctx_size = 1024;
    atlas_engine *e = engine_new(&mod, 1, &p), *fresh = engine_new(&mod, 1, &p);
    if (!e || !fresh) return;
    const ref_prompt *rp = &f->p[6];
    atlas_request r = greedy_request(f->name, rp->ids, rp->n, N_GREEDY);
    coll *first = run_one(e, &r), *second = run_one(e, &r);
    CHECK(first->usage.cached_tokens == 0);
    CHECK_MSG(second->usage.cached_tokens == (rp->n - 1) / 16 * 16, "cached %d of %d",
              second->usage.cached_tokens, rp->n);
    CHECK(matches_reference(first, rp) && matches_reference(second, rp));
    CHECK(same_ids(first, second));
    atlas_request r300 = greedy_request(f->name, rp->ids, 300, N_GREEDY);
    coll *part = run_one(e, &r300), *want = run_one(fresh, &r300);
    CHECK_MSG(part->usage.cached_tokens == 288, "cached %d", part->usage.cached_tokens);
    CHECK(want->usage.cached_tokens == 0 && want->n_ids == N_GREEDY);
    CHECK_MSG(same_ids(part, want), "a cached prefix changed the output");
    const char *salts[] = {"tenant-a", "tenant-b", "tenant-a", NULL};
    for (int i = 0; i < 4; i++) {
        r.cache_salt = salts[i];
        coll *c = run_one(e, &r);
        CHECK_MSG(c->usage.cached_tokens == (i < 2 ? 0 : (rp->n - 1) / 16 * 16) &&
                  same_ids(c, first), "salt run %d: cached %d", i, c->usage.cached_tokens);
        coll_free(c);
    }
    char long_salt[ATLAS_ENGINE_MAX_CACHE_SALT + 2] = {0};
    memset(long_salt, 's', sizeof long_salt - 1);
    r.cache_salt = long_salt;
    coll *refused = run_one(e, &r);
    CHECK_MSG(refused->status == ATLAS_ERR_INVALID && strstr(refused->msg, "cache_salt"), "%s",
              refused->msg);
    coll_free(refused);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.cached_tokens >= (uint64_t)(288 + second->usage.cached_tokens));
    CHECK(m.kv_blocks_cached > 0 && m.kv_blocks_used == 0);
    coll_free(first);
    coll_free(second);
    coll_free(part);
    coll_free(want);
    atlas_engine_free(e);
    atlas_engine_free(fresh);
}

/* Request i of the batch test: a prompt prefix, greedy or seeded sampling, some with
 * logprobs (which makes the whole batch take the full-logits path). */
static atlas_request batch_request(const fixture *f, int i) {
    const ref_prompt *p = &f->p[i % 6];
    int n = p->n - (i / 6) % 3;
    if (n < 1) n = 1;
    atlas_request r = greedy_request(f->name, p->ids, n, 6 + i % 5);
    if (i % 4 == 3) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = 1000 + (uint64_t)i;
    }
    if (i % 3 == 1) {
        r.logprobs = 1;
        r.top_logprobs = 3;
    }
    return r;
}

/* Greedy decode steps queued a step ahead (sched.c run_ahead): sequences that all decode
 * greedily, ending at different steps (max_tokens, an eos taken as a stop id), give the ids
 * they give alone, and their KV blocks come back. */
static void test_ahead(const fixture *f) {
    enum { N = 5 };
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.ctx_size = 1024;
    atlas_engine *e = engine_new(&mod, 1, &p);
    if (!e) return;
    static const int max[N] = {1, 2, 7, 16, 40};
    coll *alone[N], *together[N];
    for (int i = 0; i < N; i++) {
        atlas_request r = greedy_request(f->name, f->p[i].ids, f->p[i].n, max[i]);
        alone[i] = run_one(e, &r);
    }
    /* a stop id: request 4's 10th token ends it there */
    int32_t stop = alone[N - 1]->n_ids >= 10 ? alone[N - 1]->ids[9] : 0;
    atlas_engine_metrics m0, m1;
    atlas_engine_get_metrics(e, &m0);
    for (int i = 0; i < N; i++) {
        atlas_request r = greedy_request(f->name, f->p[i].ids, f->p[i].n, max[i]);
        if (i == N - 1) r.stop_ids = &stop, r.n_stop_ids = 1;
        together[i] = coll_new();
        CHECK_OK(atlas_engine_submit(e, &r, on_event, together[i], NULL));
    }
    for (int i = 0; i < N; i++) {
        coll_wait(together[i]);
        int n = i == N - 1 ? 10 : max[i]; /* the stop id counts, without an event */
        int k = 0;
        while (k < n && k < alone[i]->n_ids && alone[i]->ids[k] != stop) k++;
        if (i < N - 1) k = n;
        CHECK_MSG(together[i]->n_ids == (i == N - 1 ? k : n) &&
                      !memcmp(together[i]->ids, alone[i]->ids, (size_t)together[i]->n_ids * 4),
                  "%s request %d: %d ids together, %d alone", f->name, i, together[i]->n_ids,
                  alone[i]->n_ids);
        coll_free(together[i]);
        coll_free(alone[i]);
    }
    atlas_engine_get_metrics(e, &m1);
    CHECK(m1.finished_stop == m0.finished_stop + 1);
    check_kv_empty(e, "ahead");
    atlas_engine_free(e);
}

static void test_batch_vs_alone(const fixture *f) {
    enum { N = 32 };
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine *e = engine_new(&mod, 1, NULL);
    if (!e) return;
    coll *alone[N], *batch[N];
    double t0 = (atlas_now_ms() / 1e3);
    for (int i = 0; i < N; i++) {
        atlas_request r = batch_request(f, i);
        alone[i] = run_one(e, &r);
    }
    double t_alone = (atlas_now_ms() / 1e3) - t0;
    t0 = (atlas_now_ms() / 1e3);
    atlas_request_handle *h[N];
    for (int i = 0; i < N; i++) {
        atlas_request r = batch_request(f, i);
        batch[i] = coll_new();
        CHECK_OK(atlas_engine_submit(e, &r, on_event, batch[i], &h[i]));
    }
    int same = 0, n_greedy = 0;
    for (int i = 0; i < N; i++) {
        coll_wait(batch[i]);
        /* Greedy and seeded (i % 4 == 3) requests alike: the CPU backend's logits are
         * bitwise batch-invariant (test-forward checks it), so both must agree exactly. */
        n_greedy += i % 4 != 3;
        CHECK_MSG(same_ids(alone[i], batch[i]) && alone[i]->n_text == batch[i]->n_text &&
                      !memcmp(alone[i]->text, batch[i]->text, alone[i]->n_text),
                  "%s request %d: alone and in a batch of %d differ", f->name, i, N);
        same += same_ids(alone[i], batch[i]);
        CHECK(batch[i]->n_ends == 1 && batch[i]->finish == ATLAS_FINISH_LENGTH);
        CHECK(batch[i]->n_events == 6 + i % 5);
        if (i % 3 == 1) { /* bitwise-equal logits give bitwise-equal logprobs */
            CHECK(batch[i]->logprob_sum < 0);
            CHECK_MSG(!memcmp(&alone[i]->logprob_sum, &batch[i]->logprob_sum, sizeof(float)),
                      "%s request %d: logprobs alone %.9g, in the batch %.9g", f->name, i,
                      alone[i]->logprob_sum, batch[i]->logprob_sum);
        }
        atlas_engine_handle_free(h[i]);
    }
    double t_batch = (atlas_now_ms() / 1e3) - t0;
    CHECK(same == N && n_greedy == 24);
    fprintf(stderr, "%s: 32 requests one at a time %.3f s, all at once %.3f s\n", f->name,
            t_alone, t_batch);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.steps < 2 * 32 * 16, "%llu steps: the batch did not batch",
              (unsigned long long)m.steps);
    check_kv_empty(e, "batch");
    atlas_engine_free(e);
    for (int i = 0; i < N; i++) {
        coll_free(alone[i]);
        coll_free(batch[i]);
    }
}

/* 8 sequences of up to 31 tokens (2 blocks each) in a pool of 10 blocks of 16: preemption must happen, and
 * every sequence must still give its reference continuation. */
static void test_preemption(const fixture *f) {
    enum { N = 8 };
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.ctx_size = 128;
    p.kv_blocks = 10;
    p.parallel = 8;
    p.batch_tokens = 32;
    atlas_engine *e = engine_new(&mod, 1, &p);
    if (!e) return;
    coll *c[N];
    for (int i = 0; i < N; i++) {
        const ref_prompt *rp = &f->p[i % 6];
        atlas_request r = greedy_request(f->name, rp->ids, rp->n, 16);
        c[i] = coll_new();
        CHECK_OK(atlas_engine_submit(e, &r, on_event, c[i], NULL));
    }
    for (int i = 0; i < N; i++) {
        coll_wait(c[i]);
        CHECK_MSG(c[i]->finish == ATLAS_FINISH_LENGTH && c[i]->n_ids == 16,
                  "preemption: request %d finish %d (%s)", i, c[i]->finish, c[i]->msg);
        CHECK_MSG(matches_reference(c[i], &f->p[i % 6]), "preemption: request %d differs", i);
        coll_free(c[i]);
    }
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.preemptions > 0, "no preemption with a pool of %d blocks", m.kv_blocks_total);
    CHECK(m.finished_error == 0 && m.kv_blocks_total == 10);
    check_kv_empty(e, "preemption");
    atlas_engine_free(e);
}

static void test_cancel_and_errors(const fixture *f) {
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.ctx_size = 2048;
    p.parallel = 1;
    p.queue_limit = 1;
    atlas_engine *e = engine_new(&mod, 1, &p);
    if (!e) return;
    atlas_request r = greedy_request(f->name, f->p[1].ids, f->p[1].n, 0); /* to the end */
    coll *a = coll_new(), *b = coll_new(), *c = coll_new();
    atlas_request_handle *ha = NULL, *hb = NULL, *hc = NULL;
    CHECK_OK(atlas_engine_submit(e, &r, on_event, a, &ha));
    coll_wait_tokens(a, 3);
    CHECK_OK(atlas_engine_submit(e, &r, on_event, b, &hb)); /* waits: parallel is 1 */
    CHECK(atlas_engine_submit(e, &r, on_event, c, &hc) == ATLAS_ERR_BUSY && !hc);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.kv_blocks_used > 0 && m.running == 1 && m.queue_len == 1);
    CHECK(m.requests_rejected == 1);
    atlas_engine_cancel(hb);
    coll_wait(b);
    CHECK(b->finish == ATLAS_FINISH_CANCELLED && b->n_ids == 0);
    atlas_engine_cancel(ha);
    coll_wait(a);
    CHECK(a->finish == ATLAS_FINISH_CANCELLED && a->n_ends == 1);
    CHECK(a->n_ids > 0 && a->n_ids < 2000);
    check_kv_empty(e, "after cancel");
    atlas_engine_cancel(ha); /* after the end: nothing */
    atlas_engine_handle_free(ha);
    atlas_engine_handle_free(hb);
    atlas_engine_handle_free(NULL);

    /* submit's own errors */
    atlas_request bad = r;
    bad.model = "nope";
    CHECK(atlas_engine_submit(e, &bad, on_event, c, NULL) == ATLAS_ERR_NOT_FOUND);
    int32_t *longp = calloc(3000, sizeof *longp);
    bad = greedy_request(f->name, longp, 3000, 4);
    CHECK(atlas_engine_submit(e, &bad, on_event, c, NULL) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "3000") && strstr(atlas_last_error(), "2048"), "%s",
              atlas_last_error());
    free(longp);
    int32_t big = 1 << 30;
    bad = greedy_request(f->name, &big, 1, 4);
    CHECK(atlas_engine_submit(e, &bad, on_event, c, NULL) == ATLAS_ERR_RANGE);
    bad = greedy_request(f->name, f->p[0].ids, 0, 4);
    CHECK(atlas_engine_submit(e, &bad, on_event, c, NULL) == ATLAS_ERR_INVALID);
    bad = greedy_request(f->name, f->p[0].ids, f->p[0].n, 4);
    bad.sampling.top_p = 2;
    CHECK(atlas_engine_submit(e, &bad, on_event, c, NULL) == ATLAS_ERR_INVALID);
    CHECK(c->n_ends == 0);
    int ctx = 0;
    CHECK_OK(atlas_engine_ctx_size(e, f->name, &ctx));
    CHECK(ctx == 2048);
    atlas_engine_free(e);
    coll_free(a);
    coll_free(b);
    coll_free(c);
}

/* Stop strings: the text ends right before the first one; held-back text that turns out not
 * to be a stop string is released. */
static void test_stop_strings(const fixture *f) {
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine *e = engine_new(&mod, 1, NULL);
    if (!e) return;
    atlas_request r = greedy_request(f->name, f->p[0].ids, f->p[0].n, 20);
    coll *full = run_one(e, &r);
    CHECK(full->n_text > 8);
    if (full->n_text > 8) {
        /* a stop string taken from the middle of the output */
        char stop[8];
        size_t at = full->n_text / 2;
        while (at < full->n_text && ((unsigned char)full->text[at] & 0xC0) == 0x80) at++;
        size_t sl = full->n_text - at < 3 ? full->n_text - at : 3;
        while (at + sl < full->n_text && ((unsigned char)full->text[at + sl] & 0xC0) == 0x80)
            sl++;
        memcpy(stop, full->text + at, sl);
        stop[sl] = 0;
        char *first = memmem(full->text, full->n_text, stop, sl);
        size_t want = first ? (size_t)(first - full->text) : 0;
        const char *stops[2] = {"\x01never", stop};
        r.stop = stops;
        r.n_stop = 2;
        coll *c = run_one(e, &r);
        CHECK_MSG(c->finish == ATLAS_FINISH_STOP && !strcmp(c->stop_string, stop),
                  "stop: finish %d '%s'", c->finish, c->stop_string);
        CHECK_MSG(c->n_text == want && !memcmp(c->text, full->text, want),
                  "stop: text %zu bytes, want %zu", c->n_text, want);
        coll_free(c);
        /* a stop string that never matches: nothing lost */
        const char *never[1] = {"\x01\x02"};
        r.stop = never;
        r.n_stop = 1;
        c = run_one(e, &r);
        CHECK(c->n_text == full->n_text && !memcmp(c->text, full->text, c->n_text));
        CHECK(c->finish == ATLAS_FINISH_LENGTH);
        coll_free(c);
    }
    /* a stop id: the first generated token */
    r = greedy_request(f->name, f->p[0].ids, f->p[0].n, 20);
    r.stop_ids = &full->ids[2];
    r.n_stop_ids = 1;
    coll *c = run_one(e, &r);
    CHECK(c->finish == ATLAS_FINISH_STOP && c->n_ids == 2 && c->usage.completion_tokens == 3);
    coll_free(c);
    /* a first token that adds no text (the lone first byte of a 3-byte UTF-8 sequence, forced
     * by logit_bias), with a stop string to look for: the output buffer is empty then, not
     * NULL (memmove / memmem of a NULL buffer is what UBSan caught in server-hostile) */
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load(f->dir, &tok));
    int32_t lone = tok ? atlas_tokenizer_token_id(tok, "\xc3\xa2") : -1; /* byte 0xE2 */
    CHECK_MSG(lone >= 0, "%s: no token for the byte 0xE2", f->name);
    if (lone >= 0) {
        atlas_logit_bias bias = {lone, 100.0f};
        const char *stops[1] = {"\x01never"};
        r = greedy_request(f->name, f->p[0].ids, f->p[0].n, 1);
        r.sampling.logit_bias = &bias;
        r.sampling.n_logit_bias = 1;
        r.stop = stops;
        r.n_stop = 1;
        c = run_one(e, &r);
        CHECK_MSG(c->finish == ATLAS_FINISH_LENGTH && c->n_ids == 1 && c->ids[0] == lone,
                  "lone byte: finish %d, %d ids (first %d, want %d): %s", c->finish, c->n_ids,
                  c->n_ids ? c->ids[0] : -1, lone, c->msg);
        coll_free(c);
    }
    atlas_tokenizer_free(tok);
    coll_free(full);
    atlas_engine_free(e);
}

/* ---- swaps ------------------------------------------------------------------------------ */

typedef struct swap_client {
    atlas_engine *e;
    const fixture *f;
    int n, wrong, failed;
} swap_client;

static void *swap_thread(void *arg) {
    swap_client *sc = arg;
    for (int i = 0; i < sc->n; i++) {
        const ref_prompt *p = &sc->f->p[i % 6];
        atlas_request r = greedy_request(sc->f->name, p->ids, p->n, 4);
        coll *c = run_one(sc->e, &r);
        if (c->finish != ATLAS_FINISH_LENGTH) {
            sc->failed++;
            fprintf(stderr, "swap: %s request %d: finish %d: %s\n", sc->f->name, i, c->finish,
                    c->msg);
        } else if (!matches_reference(c, p)) {
            sc->wrong++;
        }
        coll_free(c);
    }
    return NULL;
}

static long rss_kb(void) {
    FILE *fp = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (fp) {
        if (fscanf(fp, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(fp);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void swap_round(atlas_engine *e, const fixture *a, const fixture *b, int n) {
    swap_client ca = {e, a, n, 0, 0}, cb = {e, b, n, 0, 0};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, swap_thread, &ca);
    pthread_create(&tb, NULL, swap_thread, &cb);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_MSG(ca.failed + cb.failed == 0, "swaps: %d failed", ca.failed + cb.failed);
    CHECK_MSG(ca.wrong + cb.wrong == 0, "swaps: %d wrong answers", ca.wrong + cb.wrong);
}

static void test_swaps(const fixture *a, const fixture *b) {
    atlas_engine_model mods[2] = {{.name = a->name, .dir = a->dir}, {.name = b->name, .dir = b->dir}};
    atlas_engine_params p = atlas_engine_default_params();
    p.max_resident = 1;
    p.ctx_size = 1024;
    p.drain_timeout_ms = 1; /* turns of twice a load: swaps as often as the rule allows */
    atlas_engine *e = engine_new(mods, 2, &p);
    if (!e) return;
    swap_round(e, a, b, 5); /* warm-up: allocator pools, tokenizers */
    atlas_engine_metrics m0, m1;
    atlas_engine_get_metrics(e, &m0);
    long rss0 = rss_kb();
    double t0 = (atlas_now_ms() / 1e3);
    swap_round(e, a, b, 30);
    double elapsed = (atlas_now_ms() / 1e3) - t0;
    long rss1 = rss_kb();
    atlas_engine_get_metrics(e, &m1);
    uint64_t swaps = m1.loads - m0.loads;
    CHECK_MSG(swaps >= 6, "only %llu swaps", (unsigned long long)swaps);
    CHECK(m1.swaps - m0.swaps == swaps);
    /* no thrash: each client always has a request queued, yet a model serves twice its last
     * load before it goes, so swapping takes well under the whole time */
    double swapping = m1.swap_seconds - m0.swap_seconds;
    CHECK_MSG(swapping <= 0.6 * elapsed, "%.3f s of %.3f s swapping over %llu swaps", swapping,
              elapsed, (unsigned long long)swaps);
    /* release_busy counts the releases refused while a victim's requests ran: a drain */
    CHECK(m1.load_failures == 0 && m1.finished_error == 0);
    CHECK(m1.resident_models == 1 && m1.unloads + 1 == m1.loads);
    CHECK(m1.swap.n == m1.loads && m1.last_swap_s > 0);
    CHECK_MSG(rss1 - rss0 < 16 * 1024, "RSS grew by %ld kB over %llu swaps", rss1 - rss0,
              (unsigned long long)swaps);
    fprintf(stderr, "swaps: %llu, mean %.2f ms, RSS %ld -> %ld kB\n",
            (unsigned long long)swaps, 1e3 * m1.swap.sum / (double)m1.swap.n, rss0, rss1);
    check_kv_empty(e, "swaps");

    /* logprobs on a's vocabulary (several rows), then on b's larger one (one row) */
    coll *lc[5];
    for (int i = 0; i < 5; i++) {
        const fixture *f = i < 4 ? a : b;
        atlas_request r = greedy_request(f->name, f->p[i].ids, f->p[i].n, 3);
        r.logprobs = 1;
        r.top_logprobs = ATLAS_ENGINE_MAX_TOP_LOGPROBS;
        lc[i] = coll_new();
        CHECK_OK(atlas_engine_submit(e, &r, on_event, lc[i], NULL));
        if (i == 3)
            for (int k = 0; k < 4; k++) coll_wait(lc[k]);
    }
    for (int i = 0; i < 5; i++) {
        coll_wait(lc[i]);
        CHECK(lc[i]->finish == ATLAS_FINISH_LENGTH && lc[i]->logprob_sum < 0);
        coll_free(lc[i]);
    }

    /* by hand */
    atlas_engine_model_status st[2];
    CHECK(atlas_engine_models(e, st, 2) == 2);
    CHECK(st[0].resident + st[1].resident == 1);
    CHECK_OK(atlas_engine_load(e, a->name));
    CHECK(atlas_engine_models(e, st, 2) == 2 && st[0].resident && !st[1].resident);
    CHECK_OK(atlas_engine_unload(e, a->name));
    CHECK(atlas_engine_models(e, st, 2) == 2 && !st[0].resident && !st[1].resident);
    CHECK_OK(atlas_engine_unload(e, a->name));
    CHECK(atlas_engine_load(e, "nope") == ATLAS_ERR_NOT_FOUND);
    atlas_engine_free(e);
}

static int resident(atlas_engine *e, int i) {
    atlas_engine_model_status st[3];
    return atlas_engine_models(e, st, 3) == 3 && st[i].resident;
}

/* Three models (two names share a directory) with max_resident 2: the least recently used
 * one leaves; unload is refused while a sequence runs and done after; a gpu_memory too
 * small for any model fails its requests with DEVICE_NOMEM. */
static void test_residency(const fixture *a, const fixture *b) {
    atlas_engine_model mods[3] = {{.name = "a", .dir = a->dir}, {.name = "b", .dir = b->dir}, {.name = "c", .dir = a->dir}};
    atlas_engine_params p = atlas_engine_default_params();
    p.max_resident = 2;
    p.ctx_size = 512;
    atlas_engine *e = engine_new(mods, 3, &p);
    if (!e) return;
    const char *seq_names[4] = {"a", "b", "a", "c"};
    for (int k = 0; k < 4; k++) {
        const fixture *f = seq_names[k][0] == 'b' ? b : a;
        atlas_request r = greedy_request(seq_names[k], f->p[0].ids, f->p[0].n, 4);
        coll *c = run_one(e, &r);
        CHECK(c->finish == ATLAS_FINISH_LENGTH && matches_reference(c, &f->p[0]));
        coll_free(c);
    }
    CHECK_MSG(resident(e, 0) && !resident(e, 1) && resident(e, 2),
              "LRU: want a and c resident, b evicted");
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.loads == 3 && m.unloads == 1 && m.resident_models == 2);

    /* unload while a sequence runs: refused (BUSY), the sequence finishes (not cancelled),
     * then the model is released (tests/test-engine-release.c has the rest) */
    atlas_request r = greedy_request("a", a->p[1].ids, a->p[1].n, 400);
    coll *c = coll_new();
    CHECK_OK(atlas_engine_submit(e, &r, on_event, c, NULL));
    coll_wait_tokens(c, 2);
    CHECK(atlas_engine_unload(e, "a") == ATLAS_ERR_BUSY);
    coll_wait(c);
    CHECK(c->finish == ATLAS_FINISH_LENGTH && c->n_ids == 400);
    for (int k = 0; k < 500 && resident(e, 0); k++) usleep(10000);
    CHECK(!resident(e, 0) && resident(e, 2));
    coll_free(c);
    atlas_engine_free(e);

    p.gpu_memory = 1000;
    e = engine_new(mods, 3, &p);
    if (!e) return;
    r = greedy_request("b", b->p[0].ids, b->p[0].n, 4);
    c = run_one(e, &r);
    CHECK(c->finish == ATLAS_FINISH_ERROR && c->status == ATLAS_ERR_DEVICE_NOMEM);
    CHECK_MSG(strstr(c->msg, "memory budget") != NULL, "%s", c->msg);
    coll_free(c);
    CHECK(atlas_engine_load(e, "a") == ATLAS_ERR_DEVICE_NOMEM);
    atlas_engine_free(e);
}

/* drain_timeout_ms: a request for b while a long one runs on a (max_resident 1) pauses
 * a's sequence, serves b, then brings a back and recomputes: a's output is unchanged. */
static void test_pause_swap(const fixture *a, const fixture *b) {
    atlas_engine_model mods[2] = {{.name = a->name, .dir = a->dir}, {.name = b->name, .dir = b->dir}};
    atlas_engine_params p = atlas_engine_default_params();
    p.max_resident = 1;
    p.ctx_size = 1024;
    p.drain_timeout_ms = 20;
    atlas_engine *e = engine_new(mods, 2, &p);
    if (!e) return;
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, b->name, &tok)); /* so that submitting for b is quick */
    atlas_request ra = greedy_request(a->name, a->p[2].ids, a->p[2].n, 400);
    coll *alone = run_one(e, &ra);
    coll *ca = coll_new();
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, ca, NULL));
    coll_wait_tokens(ca, 3);
    atlas_request rb = greedy_request(b->name, b->p[0].ids, b->p[0].n, 4);
    coll *cb = run_one(e, &rb);
    int a_done_before_b = 0;
    pthread_mutex_lock(&ca->mu);
    a_done_before_b = ca->done;
    pthread_mutex_unlock(&ca->mu);
    CHECK_MSG(!a_done_before_b, "b waited for a's sequence: it was not paused");
    CHECK(cb->finish == ATLAS_FINISH_LENGTH && matches_reference(cb, &b->p[0]));
    coll_wait(ca);
    CHECK(ca->finish == ATLAS_FINISH_LENGTH && same_ids(ca, alone));
    CHECK(ca->n_text == alone->n_text && !memcmp(ca->text, alone->text, ca->n_text));
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.preemptions >= 1 && m.loads >= 3, "%llu preemptions, %llu loads",
              (unsigned long long)m.preemptions, (unsigned long long)m.loads);
    coll_free(alone);
    coll_free(ca);
    coll_free(cb);
    atlas_engine_free(e);
}

/* A directory whose config and tokenizer are fine but whose weights are cut short. */
static void make_bad_dir(const fixture *f, char *out, size_t cap) {
    snprintf(out, cap, "/tmp/atlas-test-engine-%d", (int)getpid());
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/tokenizer.json "
             "%s/tokenizer_config.json %s/ && head -c 1000 %s/model.safetensors > "
             "%s/model.safetensors", out, f->dir, f->dir, f->dir, out, f->dir, out);
    CHECK(system(cmd) == 0);
}

/* Context and KV memory: the default context is the model's maximum and the pool holds at
 * most parallel of them; a small kv_memory lowers the context and says so; a context above
 * the model's maximum is refused at create; a request whose prompt and max_tokens exceed
 * the context is refused naming both. */
static void test_memory(const fixture *f) {
    atlas_engine_model mod = {.name = f->name, .dir = f->dir};
    atlas_engine_params p = atlas_engine_default_params();
    p.parallel = 4;
    atlas_engine *e = engine_new(&mod, 1, &p);
    if (!e) return;
    atlas_engine_model_status ms;
    CHECK(atlas_engine_models(e, &ms, 1) == 1);
    CHECK_MSG(ms.ctx_size == 131072 && ms.max_ctx == 131072 && !ms.note[0],
              "tiny-llama3: context %d of %d (%s)", ms.ctx_size, ms.max_ctx, ms.note);
    CHECK_MSG(ms.kv_tokens > 0 && ms.kv_tokens <= 4L * 131072, "kv tokens %ld", ms.kv_tokens);
    CHECK(ms.kv_bytes == (size_t)ms.kv_tokens * 2 * 4 * 2 * 1 * 8); /* fp32 K and V, 2 layers */
    atlas_engine_free(e);

    /* 20,480 bytes: 160 tokens of 128 bytes */
    p.kv_memory = 20480;
    e = engine_new(&mod, 1, &p);
    if (!e) return;
    CHECK(atlas_engine_models(e, &ms, 1) == 1);
    CHECK_MSG(ms.ctx_size == 160 && ms.kv_tokens == 160 && strstr(ms.note, "lowered from 131072 "
              "to 160"), "context %d, kv %ld: %s", ms.ctx_size, ms.kv_tokens, ms.note);
    int32_t ids[200] = {0};
    for (int i = 0; i < 200; i++) ids[i] = 100 + i;
    atlas_request r = greedy_request(f->name, ids, 150, 20);
    CHECK(atlas_engine_submit(e, &r, on_event, NULL, NULL) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "150 tokens and max_tokens is 20: 170 in all") &&
              strstr(atlas_last_error(), "holds 160"), "%s", atlas_last_error());
    r = greedy_request(f->name, ids, 200, 1);
    CHECK(atlas_engine_submit(e, &r, on_event, NULL, NULL) == ATLAS_ERR_RANGE);
    r = greedy_request(f->name, ids, 150, 10);
    coll *c = run_one(e, &r);
    CHECK_MSG(c->finish == ATLAS_FINISH_LENGTH && c->n_ids == 10, "%d ids: %s", c->n_ids, c->msg);
    coll_free(c);
    atlas_engine_free(e);

    p.kv_memory = 0;
    p.ctx_size = 131073;
    atlas_engine *bad = NULL;
    p.models = &mod;
    p.n_models = 1;
    p.device = ATLAS_DEVICE_CPU;
    CHECK(atlas_engine_create(&p, &bad) == ATLAS_ERR_INVALID && !bad);
    CHECK_MSG(strstr(atlas_last_error(), "ctx_size 131073 exceeds the model's maximum of 131072"),
              "%s", atlas_last_error());
    p.ctx_size = 0;
    p.gpu_memory_utilization = 1.5;
    CHECK(atlas_engine_create(&p, &bad) == ATLAS_ERR_INVALID && !bad);
}

static void test_failed_load(const fixture *f) {
    char bad[256];
    make_bad_dir(f, bad, sizeof bad);
    atlas_engine_model mods[2] = {{.name = f->name, .dir = f->dir}, {.name = "broken", .dir = bad}};
    atlas_engine_params p = atlas_engine_default_params();
    p.max_resident = 1;
    atlas_engine *e = engine_new(mods, 2, &p);
    if (!e) return;
    enum { N = 6 };
    coll *c[N];
    bool refused[N] = {0}; /* a broken model's failure is remembered: later submits fail */
    for (int i = 0; i < N; i++) {
        const ref_prompt *rp = &f->p[i % 3];
        atlas_request r = greedy_request(i % 2 ? "broken" : f->name, rp->ids, rp->n, 6);
        c[i] = coll_new();
        atlas_status sst = atlas_engine_submit(e, &r, on_event, c[i], NULL);
        refused[i] = i % 2 && sst == ATLAS_ERR_UNAVAILABLE;
        CHECK_MSG(sst == ATLAS_OK || refused[i], "%s", atlas_last_error());
        if (refused[i])
            CHECK_MSG(strstr(atlas_last_error(), "'broken'") &&
                          strstr(atlas_last_error(), "model.safetensors") &&
                          !strstr(atlas_last_error(), bad),
                      "%s", atlas_last_error());
    }
    for (int i = 0; i < N; i++) {
        if (refused[i]) {
            coll_free(c[i]);
            continue;
        }
        coll_wait(c[i]);
        if (i % 2) {
            CHECK(c[i]->finish == ATLAS_FINISH_ERROR && c[i]->status != ATLAS_OK);
            /* the model and its file are named, the server's directory is not */
            CHECK_MSG(strstr(c[i]->msg, "'broken'") && strstr(c[i]->msg, "model.safetensors") &&
                          !strstr(c[i]->msg, bad),
                      "%s", c[i]->msg);
        } else {
            CHECK_MSG(c[i]->finish == ATLAS_FINISH_LENGTH && matches_reference(c[i], &f->p[i % 3]),
                      "request %d for the good model: finish %d (%s)", i, c[i]->finish, c[i]->msg);
        }
        coll_free(c[i]);
    }
    CHECK(atlas_engine_load(e, "broken") != ATLAS_OK);
    CHECK_MSG(strstr(atlas_last_error(), "'broken'") && !strstr(atlas_last_error(), bad), "%s",
              atlas_last_error());
    atlas_engine_model_status st[2];
    atlas_engine_models(e, st, 2);
    CHECK(st[1].last_error[0] != 0 && !st[1].resident);
    /* still serving */
    atlas_request r = greedy_request(f->name, f->p[0].ids, f->p[0].n, 6);
    coll *ok = run_one(e, &r);
    CHECK(ok->finish == ATLAS_FINISH_LENGTH && matches_reference(ok, &f->p[0]));
    coll_free(ok);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.load_failures >= 2);
    atlas_engine_free(e);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", bad);
    CHECK(system(cmd) == 0);

    /* params */
    atlas_engine *x = NULL;
    p = atlas_engine_default_params();
    CHECK(atlas_engine_create(&p, &x) == ATLAS_ERR_INVALID && !x);
    atlas_engine_model missing = {.name = "m", .dir = "/nonexistent/dir"};
    p.models = &missing;
    p.n_models = 1;
    CHECK(atlas_engine_create(&p, &x) != ATLAS_OK && !x);
    CHECK(strstr(atlas_last_error(), "/nonexistent/dir") != NULL);
    atlas_engine_free(NULL);
}

#define TIMED(call)                                                                        \
    do {                                                                                   \
        double t0_ = (atlas_now_ms() / 1e3);                                                              \
        call;                                                                              \
        fprintf(stderr, "%-40s %6.2f s\n", #call, (atlas_now_ms() / 1e3) - t0_);                          \
    } while (0)

int main(void) {
    fixture llama = {0}, qwen = {0};
    if (!fixture_open(&llama, "tiny-llama3") || !fixture_open(&qwen, "tiny-qwen3"))
        return harness_finish();
    TIMED(test_reference(&llama));
    TIMED(test_reference(&qwen));
    TIMED(test_prefix_cache(&qwen));
    TIMED(test_ahead(&llama));
    TIMED(test_ahead(&qwen));
    TIMED(test_forced(&llama));
    TIMED(test_forced(&qwen));
    TIMED(test_batch_vs_alone(&llama));
    TIMED(test_batch_vs_alone(&qwen));
    TIMED(test_preemption(&llama));
    TIMED(test_cancel_and_errors(&llama));
    TIMED(test_stop_strings(&qwen));
    TIMED(test_swaps(&llama, &qwen));
    TIMED(test_residency(&llama, &qwen));
    TIMED(test_pause_swap(&llama, &qwen));
    TIMED(test_memory(&llama));
    TIMED(test_failed_load(&llama));
    atlas_st_free(llama.st);
    atlas_st_free(qwen.st);
    return harness_finish();
}
