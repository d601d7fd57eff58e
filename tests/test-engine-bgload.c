/* tests/test-engine-bgload.c — a model loads beside the resident ones, on the CPU with the
 * fixture models (tests/data/tiny-qwen3 as a, tiny-llama3 as b).  b's load is made slow the
 * way a slow disk would make it: the engine's load progress callback, which the loader
 * calls as it reads, sleeps for b so that its reads take half a second.  So:
 * - with a resident and streaming, b's load runs while a keeps producing tokens: a's tokens
 *   arrive all through the load and its largest gap there is a small part of the load's
 *   time; b's requests queue meanwhile (b shows as loading) and are answered once it has
 *   loaded; the load's event says a kept serving beside it;
 * - a load that fails (a truncated checkpoint) fails the requests that waited for it with
 *   its error, and a serves on;
 * - with room for one model (max_resident 1) but memory for both, b loads while a drains:
 *   a's running request keeps producing tokens during the load, b admits nothing until a
 *   is released, and the swap's own time (from a's release) is a small part of the load;
 * - with room for two models, a streaming and b idle, c's swap releases b on the loader
 *   thread before c's (slow) load: b's release is told as soon as it is over, long before
 *   c has loaded, with the swap and c as its reason, while a keeps producing tokens;
 * - the engine freed while a model loads waits for the load and frees what it loaded. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "harness.h"

enum { SLOW_MS = 500, MAX_STAMPS = 1 << 16 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request's events: when each token came, and how it ended. */
typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_tokens, done;
    double *stamps; /* [MAX_STAMPS] */
    atlas_finish finish;
    atlas_status status;
    char msg[512];
} coll;

static void coll_init(coll *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->stamps = calloc(MAX_STAMPS, sizeof *c->stamps);
}

static void coll_destroy(coll *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->stamps);
}

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    double t = now_s();
    pthread_mutex_lock(&c->mu);
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (c->n_tokens < MAX_STAMPS) c->stamps[c->n_tokens] = t;
        c->n_tokens++;
    } else {
        c->done = 1;
        c->finish = ev->finish;
        c->status = ev->status;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void coll_wait_tokens(coll *c, int n) {
    pthread_mutex_lock(&c->mu);
    while (!c->done && c->n_tokens < n) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void coll_wait(coll *c) { coll_wait_tokens(c, 1 << 30); }

static int coll_count(coll *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->n_tokens;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Tokens of c in [t0, t1], and the largest gap there (from t0 to the first, between them,
 * from the last to t1, or the whole interval when none came). */
static int tokens_in(coll *c, double t0, double t1, double *gap) {
    pthread_mutex_lock(&c->mu);
    int n = 0, count = c->n_tokens < MAX_STAMPS ? c->n_tokens : MAX_STAMPS;
    double last = t0;
    *gap = 0;
    for (int i = 0; i < count; i++) {
        double t = c->stamps[i];
        if (t < t0 || t > t1) continue;
        if (t - last > *gap) *gap = t - last;
        last = t;
        n++;
    }
    if (t1 - last > *gap) *gap = t1 - last;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* What the engine told: b's load (its progress and residency events), a's release. */
typedef struct watch {
    pthread_mutex_t mu;
    const char *slow;      /* the model whose load is slowed */
    double load_begin;     /* its first progress call */
    double loaded_at, released_at; /* LOADED of slow, RELEASED of the other */
    char rel_model[16], rel_reason[16], rel_other[16]; /* that RELEASED's */
    double load_s, swap_s;
    int beside, failed_beside, n_failed;
    int read_all;          /* its last progress call (done == total) has returned */
    char other[64], failed[512];
} watch;

/* A slow disk: b's reads take SLOW_MS in all, spread over them, whatever the number of
 * progress calls; it waits, the scheduler must not. */
static void on_progress(void *user, const char *model, uint64_t done, uint64_t total) {
    watch *w = user;
    if (strcmp(model, w->slow)) return;
    pthread_mutex_lock(&w->mu);
    if (w->load_begin == 0) w->load_begin = now_s();
    double due = w->load_begin + SLOW_MS / 1e3 * (total ? (double)done / (double)total : 1);
    pthread_mutex_unlock(&w->mu);
    double left = due - now_s();
    if (left > 0) sleep_ms((int)(left * 1e3) + 1);
    if (done == total) {
        pthread_mutex_lock(&w->mu);
        w->read_all = 1;
        pthread_mutex_unlock(&w->mu);
    }
}

static void on_residency(void *user, const atlas_residency_event *ev) {
    watch *w = user;
    double t = now_s();
    pthread_mutex_lock(&w->mu);
    if (ev->kind == ATLAS_RESIDENCY_LOADED && !strcmp(ev->model, w->slow)) {
        w->loaded_at = t;
        w->load_s = ev->seconds;
        w->swap_s = ev->swap_seconds;
        w->beside = ev->beside;
        snprintf(w->other, sizeof w->other, "%s", ev->other ? ev->other : "");
    } else if (ev->kind == ATLAS_RESIDENCY_RELEASED && strcmp(ev->model, w->slow)) {
        w->released_at = t;
        snprintf(w->rel_model, sizeof w->rel_model, "%s", ev->model);
        snprintf(w->rel_reason, sizeof w->rel_reason, "%s", ev->reason ? ev->reason : "");
        snprintf(w->rel_other, sizeof w->rel_other, "%s", ev->other ? ev->other : "");
    } else if (ev->kind == ATLAS_RESIDENCY_LOAD_FAILED) {
        w->n_failed++;
        w->failed_beside = ev->beside;
        snprintf(w->failed, sizeof w->failed, "%s", ev->reason ? ev->reason : "");
    }
    pthread_mutex_unlock(&w->mu);
}

static watch watch_get(watch *w) {
    pthread_mutex_lock(&w->mu);
    watch copy = *w;
    pthread_mutex_unlock(&w->mu);
    return copy;
}

static atlas_engine *engine_new(const atlas_engine_model *mods, int n, int max_resident,
                                int drain_ms, watch *w) {
    atlas_engine_params p = atlas_engine_default_params();
    p.models = mods;
    p.n_models = n;
    p.max_resident = max_resident;
    p.drain_timeout_ms = drain_ms;
    p.ctx_size = 4096;
    p.parallel = 4;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.load_progress = on_progress;
    p.load_progress_user = w;
    p.on_residency = on_residency;
    p.on_residency_user = w;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

static const int32_t PROMPT[] = {9, 17, 33, 65, 129, 7};

/* A greedy request; max 0: until the context is full (the test cancels it). */
static atlas_request request(const char *model, int max) {
    atlas_request r = {.model = model, .prompt = PROMPT,
                       .n_prompt = sizeof PROMPT / sizeof *PROMPT, .max_tokens = max,
                       .ignore_eos = 1};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    return r;
}

/* Model i's state as /v1/models shows it. */
static const char *state_of(atlas_engine *e, int i) {
    atlas_engine_model_status st[3];
    int n = atlas_engine_models(e, st, 3);
    return i < n ? st[i].state : "";
}

/* a streams; three requests for b come while b is not loaded. */
static void test_tokens_during_load(const char *dir_a, const char *dir_b) {
    watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .slow = "b"};
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 2, 30000, &w);
    if (!e) return;
    CHECK_OK(atlas_engine_load(e, "a"));
    const atlas_tokenizer *tok = NULL; /* read now: b's first submit would wait for it */
    CHECK_OK(atlas_engine_tokenizer(e, "b", &tok));
    coll ca, cb[3];
    coll_init(&ca);
    atlas_request ra = request("a", 0), rb = request("b", 4);
    atlas_request_handle *ha = NULL;
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca, &ha));
    coll_wait_tokens(&ca, 5);
    for (int k = 0; k < 3; k++) {
        coll_init(&cb[k]);
        CHECK_OK(atlas_engine_submit(e, &rb, on_event, &cb[k], NULL));
    }
    int seen_loading = 0;
    for (int k = 0; k < 500 && !seen_loading; k++) {
        seen_loading = !strcmp(state_of(e, 1), "loading");
        if (!seen_loading) sleep_ms(2);
    }
    int b_early = 0;
    for (int k = 0; k < 3; k++) b_early += coll_count(&cb[k]) > 0;
    CHECK_MSG(seen_loading && !b_early, "b seen loading: %d; b's requests with tokens while "
              "it loaded: %d", seen_loading, b_early);
    CHECK_MSG(!strcmp(state_of(e, 0), "resident"), "a: %s", state_of(e, 0));
    for (int k = 0; k < 3; k++) coll_wait(&cb[k]);
    watch got = watch_get(&w);
    atlas_engine_cancel(ha);
    coll_wait(&ca);
    atlas_engine_handle_free(ha);

    double t0 = got.load_begin, t1 = got.loaded_at, load = t1 - t0, gap = 0;
    int n_a = tokens_in(&ca, t0, t1, &gap);
    fprintf(stderr, "beside: b loaded in %.3f s (event %.3f s); a gave %d tokens meanwhile, "
            "its largest gap %.1f ms\n", load, got.load_s, n_a, gap * 1e3);
    CHECK_MSG(t0 > 0 && t1 > t0 && got.load_s >= 0.3, "b's load: began %.3f, loaded %.3f, "
              "%.3f s: not slowed as the test needs", t0, t1, got.load_s);
    CHECK_MSG(n_a >= 10 && gap < 0.4 * load, "a gave %d tokens during b's %.3f s load, the "
              "largest gap %.3f s", n_a, load, gap);
    CHECK_MSG(got.beside == 1 && !got.other[0], "LOADED: beside %d, other '%s'", got.beside,
              got.other);
    for (int k = 0; k < 3; k++) {
        CHECK_MSG(cb[k].finish == ATLAS_FINISH_LENGTH && cb[k].n_tokens == 4, "b %d: %d %s", k,
                  cb[k].finish, cb[k].msg);
        CHECK_MSG(cb[k].stamps[0] >= t1, "b %d's first token %.3f s before its model loaded",
                  k, t1 - cb[k].stamps[0]);
        coll_destroy(&cb[k]);
    }
    CHECK(ca.finish == ATLAS_FINISH_CANCELLED);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.loads == 2 && m.load_failures == 0 && m.swaps == 0 && m.resident_models == 2,
              "loads %llu, failures %llu, swaps %llu, resident %d", (unsigned long long)m.loads,
              (unsigned long long)m.load_failures, (unsigned long long)m.swaps,
              m.resident_models);
    coll_destroy(&ca);
    atlas_engine_free(e);
}

/* dir_b's files, its checkpoint cut to half, in a new directory (out). */
static int make_truncated(const char *dir_b, char *out, size_t cap) {
    if (!harness_mkdtemp(out, cap, "bgload")) return 0;
    char cmd[8192], path[1100];
    snprintf(cmd, sizeof cmd, "cp '%s'/config.json '%s'/tokenizer.json '%s'/tokenizer_config.json "
             "'%s'/model.safetensors '%s'/", dir_b, dir_b, dir_b, dir_b, out);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    struct stat st;
    int ok = system(cmd) == 0 && stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0;
    CHECK_MSG(ok, "%s, then cut to half", cmd);
    return ok;
}

/* a streams; the requests for c, whose checkpoint is cut short, fail with its load's error
 * (the first waits for the load; the second may come after it failed, and is refused at
 * once with the same error) and a goes on. */
static void test_failed_load(const char *dir_a, const char *dir_b) {
    char bad[512];
    if (!make_truncated(dir_b, bad, sizeof bad)) return;
    watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .slow = "c"};
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "c", .dir = bad}};
    atlas_engine *e = engine_new(mods, 2, 2, 30000, &w);
    if (!e) {
        harness_rm_rf(bad);
        return;
    }
    CHECK_OK(atlas_engine_load(e, "a"));
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "c", &tok));
    coll ca, cc[2];
    coll_init(&ca);
    atlas_request ra = request("a", 0), rc = request("c", 4);
    atlas_request_handle *ha = NULL;
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca, &ha));
    coll_wait_tokens(&ca, 5);
    for (int k = 0; k < 2; k++) {
        coll_init(&cc[k]);
        /* the second may come after the failure, which is remembered: refused at once */
        atlas_status st = atlas_engine_submit(e, &rc, on_event, &cc[k], NULL);
        if (st != ATLAS_OK) {
            CHECK_MSG(k == 1 && st == ATLAS_ERR_UNAVAILABLE, "c %d: %s", k, atlas_last_error());
            cc[k].done = 1;
            cc[k].finish = ATLAS_FINISH_ERROR;
            cc[k].status = st;
            snprintf(cc[k].msg, sizeof cc[k].msg, "%s", atlas_last_error());
        }
    }
    for (int k = 0; k < 2; k++) {
        coll_wait(&cc[k]);
        CHECK_MSG(cc[k].finish == ATLAS_FINISH_ERROR && cc[k].status == ATLAS_ERR_UNAVAILABLE &&
                      strstr(cc[k].msg, "loading model 'c'") &&
                      strstr(cc[k].msg, "model.safetensors") && !strstr(cc[k].msg, bad),
                  "c %d: finish %d, %s: %s", k, cc[k].finish, atlas_status_str(cc[k].status),
                  cc[k].msg);
        coll_destroy(&cc[k]);
    }
    int n = coll_count(&ca);
    coll_wait_tokens(&ca, n + 20); /* a serves on */
    CHECK_MSG(coll_count(&ca) >= n + 20 && !ca.done, "a after c's failure: %d tokens, done %d "
              "(%s)", coll_count(&ca), ca.done, ca.msg);
    watch got = watch_get(&w);
    CHECK_MSG(got.n_failed == 1 && got.failed_beside == 1 &&
                  strstr(got.failed, "loading model 'c'"),
              "LOAD_FAILED %d times, beside %d: %s", got.n_failed, got.failed_beside,
              got.failed);
    atlas_engine_cancel(ha);
    coll_wait(&ca);
    atlas_engine_handle_free(ha);
    CHECK(ca.finish == ATLAS_FINISH_CANCELLED);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK(m.load_failures == 1 && m.resident_models == 1 && !strcmp(state_of(e, 1), "failed"));
    coll_destroy(&ca);
    atlas_engine_free(e);
    harness_rm_rf(bad);
}

/* a streams (an endless request, its first tokens come), then one 4-token request for slow
 * (its tokenizer read first: the submit would wait for it); a's handle. */
static atlas_request_handle *stream_then(atlas_engine *e, const char *slow, coll *ca,
                                         coll *cs) {
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, slow, &tok));
    coll_init(ca);
    coll_init(cs);
    atlas_request ra = request("a", 0), rs = request(slow, 4);
    atlas_request_handle *ha = NULL;
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, ca, &ha));
    coll_wait_tokens(ca, 5);
    CHECK_OK(atlas_engine_submit(e, &rs, on_event, cs, NULL));
    return ha;
}

/* max_resident 1, no drain timeout: b loads while a's running request goes on, waits for a's
 * release and only then serves. */
static void test_load_while_draining(const char *dir_a, const char *dir_b) {
    watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .slow = "b"};
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 1, 0, &w);
    if (!e) return;
    CHECK_OK(atlas_engine_load(e, "a"));
    coll ca, cb;
    atlas_request_handle *ha = stream_then(e, "b", &ca, &cb);
    /* b's weights are in (its files all read) while a still drains; b shows "loading" until
     * it may serve, so that no more than max_resident models show resident */
    int both = 0;
    for (int k = 0; k < 2500 && !both; k++) {
        both = watch_get(&w).read_all;
        if (!both) sleep_ms(2);
    }
    sleep_ms(50); /* the loader hands the model over */
    CHECK_MSG(both && !strcmp(state_of(e, 1), "loading") && !strcmp(state_of(e, 0), "draining"),
              "b %s (files read: %d), a %s", state_of(e, 1), both, state_of(e, 0));
    sleep_ms(100);
    int b_tokens = coll_count(&cb);
    watch got = watch_get(&w);
    double t_loaded = now_s(), gap = 0;
    int n_a = tokens_in(&ca, got.load_begin, t_loaded, &gap);
    CHECK_MSG(b_tokens == 0 && got.loaded_at == 0, "b served (%d tokens) or said loaded "
              "before a was released", b_tokens);
    CHECK_MSG(n_a >= 10 && gap < 0.4 * (t_loaded - got.load_begin), "a gave %d tokens during "
              "b's load and wait, the largest gap %.3f s", n_a, gap);
    atlas_engine_cancel(ha); /* a's request ends: a goes, b serves */
    coll_wait(&ca);
    coll_wait(&cb);
    atlas_engine_handle_free(ha);
    got = watch_get(&w);
    fprintf(stderr, "draining: b loaded in %.3f s beside a; swap %.3f s after a's release\n",
            got.load_s, got.swap_s);
    CHECK_MSG(cb.finish == ATLAS_FINISH_LENGTH && cb.n_tokens == 4 &&
                  cb.stamps[0] >= got.released_at && got.released_at > 0,
              "b: finish %d, %d tokens (%s)", cb.finish, cb.n_tokens, cb.msg);
    CHECK_MSG(!strcmp(got.other, "a") && got.beside == 1 && got.load_s >= 0.3 &&
                  got.swap_s < 0.5 * got.load_s && got.loaded_at >= got.released_at,
              "LOADED: other '%s', beside %d, load %.3f s, swap %.3f s", got.other, got.beside,
              got.load_s, got.swap_s);
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.swaps == 1 && m.loads == 2 && m.unloads == 1 && m.resident_models == 1 &&
                  m.swap_seconds < 0.5 * got.load_s,
              "swaps %llu (%.3f s), loads %llu, unloads %llu, resident %d",
              (unsigned long long)m.swaps, m.swap_seconds, (unsigned long long)m.loads,
              (unsigned long long)m.unloads, m.resident_models);
    coll_destroy(&ca);
    coll_destroy(&cb);
    atlas_engine_free(e);
}

/* max_resident 2, a streaming, b loaded and idle: c's request makes b go, released by the
 * loader thread before it reads c (slowed), the scheduler stepping a meanwhile. */
static void test_release_on_loader(const char *dir_a, const char *dir_b) {
    watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .slow = "c"};
    atlas_engine_model mods[3] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b},
                                  {.name = "c", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 3, 2, 30000, &w);
    if (!e) return;
    CHECK_OK(atlas_engine_load(e, "a"));
    CHECK_OK(atlas_engine_load(e, "b"));
    coll ca, cc;
    atlas_request_handle *ha = stream_then(e, "c", &ca, &cc);
    coll_wait(&cc);
    watch got = watch_get(&w);
    atlas_engine_cancel(ha);
    coll_wait(&ca);
    atlas_engine_handle_free(ha);
    double t0 = got.load_begin, t1 = got.loaded_at, gap = 0;
    int n_a = tokens_in(&ca, t0, t1, &gap);
    fprintf(stderr, "release on the loader: b released %.3f s before c's reads began, c loaded "
            "%.3f s after them; a gave %d tokens meanwhile, its largest gap %.1f ms\n",
            t0 - got.released_at, t1 - t0, n_a, gap * 1e3);
    CHECK_MSG(!strcmp(got.rel_model, "b") && !strcmp(got.rel_reason, "swap") &&
                  !strcmp(got.rel_other, "c"),
              "RELEASED: model '%s', reason '%s', for '%s'", got.rel_model, got.rel_reason,
              got.rel_other);
    /* told when it was over: before c's reads had got far, not with c's LOADED */
    CHECK_MSG(got.released_at > 0 && t0 > 0 && got.released_at < t0 + 0.25 * SLOW_MS / 1e3 &&
                  t1 - got.released_at >= 0.5 * SLOW_MS / 1e3,
              "b released at %+.3f s of c's reads, c loaded at %+.3f s", got.released_at - t0,
              t1 - t0);
    CHECK_MSG(!strcmp(got.other, "b") && got.beside == 1 && got.swap_s >= got.load_s,
              "LOADED: other '%s', beside %d, load %.3f s, swap %.3f s", got.other, got.beside,
              got.load_s, got.swap_s);
    CHECK_MSG(n_a >= 10 && gap < 0.4 * (t1 - t0), "a gave %d tokens during c's load, the "
              "largest gap %.3f s", n_a, gap);
    CHECK_MSG(cc.finish == ATLAS_FINISH_LENGTH && cc.n_tokens == 4, "c: finish %d, %d tokens "
              "(%s)", cc.finish, cc.n_tokens, cc.msg);
    CHECK_MSG(!strcmp(state_of(e, 1), "unloaded"), "b: %s", state_of(e, 1));
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    CHECK_MSG(m.swaps == 1 && m.loads == 3 && m.unloads == 1 && m.unload_failures == 0 &&
                  m.resident_models == 2,
              "swaps %llu, loads %llu, unloads %llu, resident %d", (unsigned long long)m.swaps,
              (unsigned long long)m.loads, (unsigned long long)m.unloads, m.resident_models);
    coll_destroy(&ca);
    coll_destroy(&cc);
    atlas_engine_free(e);
}

/* The engine freed while a model loads: the free waits for the load, which cannot be
 * stopped, releases what it loaded, and the request that waited for it ends cancelled. */
static void test_free_while_loading(const char *dir_a, const char *dir_b) {
    watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .slow = "b"};
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 2, 30000, &w);
    if (!e) return;
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "b", &tok));
    coll cb;
    coll_init(&cb);
    atlas_request rb = request("b", 4);
    CHECK_OK(atlas_engine_submit(e, &rb, on_event, &cb, NULL));
    int loading = 0;
    for (int k = 0; k < 500 && !loading; k++) {
        loading = !strcmp(state_of(e, 1), "loading");
        if (!loading) sleep_ms(2);
    }
    CHECK(loading);
    double t0 = now_s();
    atlas_engine_free(e);
    double dt = now_s() - t0;
    watch got = watch_get(&w);
    fprintf(stderr, "free while loading: %.3f s\n", dt);
    CHECK_MSG(cb.done && cb.finish == ATLAS_FINISH_CANCELLED && cb.n_tokens == 0,
              "b: done %d, finish %d, %d tokens", cb.done, cb.finish, cb.n_tokens);
    CHECK_MSG(got.loaded_at == 0 && got.n_failed == 0, "b was said loaded or failed");
    coll_destroy(&cb);
}

int main(void) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s", harness_data_path("tiny-qwen3"));
    snprintf(b, sizeof b, "%s", harness_data_path("tiny-llama3"));
    test_tokens_during_load(a, b);
    test_failed_load(a, b);
    test_load_while_draining(a, b);
    test_release_on_loader(a, b);
    test_free_while_loading(a, b);
    return harness_finish();
}
