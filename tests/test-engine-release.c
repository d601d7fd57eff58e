/* tests/test-engine-release.c — releasing a model while requests run on it, on the CPU with
 * the fixture models (tests/data/tiny-llama3, tiny-qwen3).  Every running request holds a
 * handle on its model (atlas/model.h), so:
 * - atlas_engine_unload while one runs is refused with ATLAS_ERR_BUSY and the count in the
 *   message, the request goes on, the model admits no more and is released once the last
 *   one has ended (here: cancelled, as when the client goes away); a load before then
 *   takes the deferred unload back; an unload with nothing running is granted at once;
 * - a swap (max_resident 1) with drain_timeout_ms 0 lets the running request of the old
 *   model finish before the other model is loaded: the refused release is counted, never an
 *   error;
 * - with a drain timeout the running requests are paused instead and resumed, recomputed,
 *   when their model is back: two long requests on two models take turns and both end with
 *   the ids they have alone, and a long request keeps its turns while short requests for
 *   the other model keep coming (no starvation either way), and a timeout shorter than a
 *   recompute still lets each paused sequence recompute and advance; the default is 30 s;
 * - a model too large for the memory budget evicts nothing: checked before any release. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "atlas/engine.h"
#include "harness.h"

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_tokens, done;
    int32_t ids[8]; /* the first generated ids */
    uint64_t hash;  /* of every generated id, in order */
    atlas_finish finish;
    atlas_status status;
    char msg[512];
} coll;

static void coll_init(coll *c) {
    memset(c, 0, sizeof *c);
    c->hash = 1469598103934665603ull;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static void coll_destroy(coll *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (c->n_tokens < 8) c->ids[c->n_tokens] = ev->id;
        c->n_tokens++;
        c->hash = (c->hash ^ (uint32_t)ev->id) * 1099511628211ull;
    } else {
        c->done = 1;
        c->finish = ev->finish;
        c->status = ev->status;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Waits until n tokens have arrived or the request ended. */
static void coll_wait_tokens(coll *c, int n) {
    pthread_mutex_lock(&c->mu);
    while (!c->done && c->n_tokens < n) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void coll_wait(coll *c) { coll_wait_tokens(c, 1 << 30); }

static int coll_tokens(coll *c, int *done) {
    pthread_mutex_lock(&c->mu);
    int n = c->n_tokens;
    *done = c->done;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const int32_t PROMPT[] = {9, 17, 33, 65, 129, 7};

/* A greedy request that runs until max tokens (0: until the context is full). */
static atlas_request request(const char *model, int max) {
    atlas_request r = {.model = model, .prompt = PROMPT,
                       .n_prompt = sizeof PROMPT / sizeof *PROMPT, .max_tokens = max,
                       .ignore_eos = 1};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    return r;
}

static atlas_engine *engine_new(const atlas_engine_model *models, int n, int max_resident,
                                int ctx, int drain_ms) {
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = n;
    p.max_resident = max_resident;
    p.drain_timeout_ms = drain_ms;
    p.ctx_size = ctx;
    p.parallel = 4;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

static int resident(atlas_engine *e, int i, int *running) {
    atlas_engine_model_status st[2];
    int n = atlas_engine_models(e, st, 2);
    if (running) *running = st[i].running;
    return i < n && st[i].resident;
}

static atlas_engine_metrics metrics(atlas_engine *e) {
    atlas_engine_metrics m;
    atlas_engine_get_metrics(e, &m);
    return m;
}

/* Waits up to 10 s for model i's residency to become want. */
static int wait_resident(atlas_engine *e, int i, int want) {
    for (int k = 0; k < 1000; k++) {
        if (resident(e, i, NULL) == want) return 1;
        sleep_ms(10);
    }
    return 0;
}

static void test_unload_refused(const char *dir) {
    atlas_engine_model mod = {.name = "a", .dir = dir};
    atlas_engine *e = engine_new(&mod, 1, 1, 32768, 0);
    if (!e) return;

    /* a request running until it is cancelled: the unload is refused, nothing changes */
    atlas_request r = request("a", 0);
    coll c1, c2, c3;
    coll_init(&c1);
    coll_init(&c2);
    coll_init(&c3);
    atlas_request_handle *h1 = NULL, *h2 = NULL;
    CHECK_OK(atlas_engine_submit(e, &r, on_event, &c1, &h1));
    coll_wait_tokens(&c1, 2);
    atlas_status st = atlas_engine_unload(e, "a");
    CHECK_MSG(st == ATLAS_ERR_BUSY, "unload while a request runs: %s (%s)",
              atlas_status_str(st), atlas_last_error());
    CHECK_MSG(strstr(atlas_last_error(), "'a' has 1 request(s) in flight") != NULL, "%s",
              atlas_last_error());
    int running = 0, done = 0;
    CHECK(resident(e, 0, &running) && running == 1);
    atlas_engine_metrics m = metrics(e);
    CHECK_MSG(m.release_busy == 1 && m.unloads == 0 && m.finished_error == 0,
              "release_busy %llu, unloads %llu", (unsigned long long)m.release_busy,
              (unsigned long long)m.unloads);

    /* draining: a second request waits instead of joining the first */
    CHECK_OK(atlas_engine_submit(e, &r, on_event, &c2, &h2));
    sleep_ms(100);
    int n1 = coll_tokens(&c1, &done);
    CHECK_MSG(!done && coll_tokens(&c2, &done) == 0 && !done,
              "while draining the second request was admitted");
    CHECK(n1 > 2); /* the first went on meanwhile */

    /* the first ends (cancelled: the client went away): the deferred release happens, then
     * the waiting request loads the model again */
    atlas_engine_cancel(h1);
    coll_wait(&c1);
    CHECK(c1.finish == ATLAS_FINISH_CANCELLED);
    coll_wait_tokens(&c2, 2);
    m = metrics(e);
    CHECK_MSG(m.unloads == 1 && m.loads == 2, "unloads %llu, loads %llu",
              (unsigned long long)m.unloads, (unsigned long long)m.loads);

    /* refused again, then taken back by a load: the model stays after the request ends */
    CHECK(atlas_engine_unload(e, "a") == ATLAS_ERR_BUSY);
    CHECK_OK(atlas_engine_load(e, "a"));
    atlas_engine_cancel(h2);
    coll_wait(&c2);
    CHECK(c2.finish == ATLAS_FINISH_CANCELLED);
    sleep_ms(100);
    CHECK_MSG(resident(e, 0, NULL) && metrics(e).unloads == 1,
              "a load did not take back the deferred unload");

    /* a request that finishes by itself, then nothing runs: the unload is granted */
    atlas_request s = request("a", 8);
    CHECK_OK(atlas_engine_submit(e, &s, on_event, &c3, NULL));
    coll_wait(&c3);
    CHECK(c3.finish == ATLAS_FINISH_LENGTH && c3.n_tokens == 8);
    CHECK_OK(atlas_engine_unload(e, "a"));
    CHECK(!resident(e, 0, NULL));
    m = metrics(e);
    CHECK(m.unloads == 2 && m.release_busy == 2 && m.finished_error == 0);
    CHECK_OK(atlas_engine_unload(e, "a")); /* not resident: nothing to do */
    atlas_engine_handle_free(h1);
    atlas_engine_handle_free(h2);
    atlas_engine_free(e);
    coll_destroy(&c1);
    coll_destroy(&c2);
    coll_destroy(&c3);
}

/* max_resident 1, no drain timeout: a request for b while one runs on a waits until a's has
 * finished (its model's release is refused meanwhile), then b is swapped in. */
static void test_swap_drains(const char *dir_a, const char *dir_b) {
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 1, 4096, 0);
    if (!e) return;
    CHECK_OK(atlas_engine_load(e, "a"));
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "b", &tok)); /* so that submitting for b is quick */
    coll ca, cb;
    coll_init(&ca);
    coll_init(&cb);
    atlas_request ra = request("a", 2000), rb = request("b", 4);
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca, NULL));
    coll_wait_tokens(&ca, 2);
    CHECK_OK(atlas_engine_submit(e, &rb, on_event, &cb, NULL));
    int a_done = 0;
    int n_a = coll_tokens(&ca, &a_done);
    fprintf(stderr, "a had %d of its 2000 tokens when b came\n", n_a);
    coll_wait(&cb);
    n_a = coll_tokens(&ca, &a_done);
    CHECK_MSG(a_done && n_a == 2000 && ca.finish == ATLAS_FINISH_LENGTH,
              "b was served before a's request ended (%d tokens, done %d)", n_a, a_done);
    CHECK_MSG(cb.finish == ATLAS_FINISH_LENGTH && cb.n_tokens == 4, "b: %s", cb.msg);
    CHECK(wait_resident(e, 1, 1) && !resident(e, 0, NULL));
    atlas_engine_metrics m = metrics(e);
    CHECK_MSG(m.release_busy >= 1 && m.load_failures == 0 && m.finished_error == 0,
              "release_busy %llu, load failures %llu, errors %llu",
              (unsigned long long)m.release_busy, (unsigned long long)m.load_failures,
              (unsigned long long)m.finished_error);
    CHECK(m.loads == 2 && m.unloads == 1);
    atlas_engine_free(e);
    coll_destroy(&ca);
    coll_destroy(&cb);
}

/* Runs r to its end in c (initialised here; the caller destroys it). */
static void run_one(atlas_engine *e, const atlas_request *r, coll *c) {
    coll_init(c);
    atlas_status st = atlas_engine_submit(e, r, on_event, c, NULL);
    if (st != ATLAS_OK) { /* refused at once: as an ERROR end */
        c->done = 1;
        c->finish = ATLAS_FINISH_ERROR;
        c->status = st;
        snprintf(c->msg, sizeof c->msg, "submit: %s", atlas_last_error());
        return;
    }
    coll_wait(c);
}

/* Bytes of dir/model.safetensors, 0 when it cannot be read. */
static size_t weights_size(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

/* With max_resident 1 and a memory budget between the two models' needs, a request for
 * the larger fails with DEVICE_NOMEM before anything is evicted: the smaller one stays
 * resident and serves on, its tokens as before. */
static void test_budget_before_evict(const char *dir_a, const char *dir_b) {
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = mods;
    p.n_models = 2;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.max_resident = 1;
    p.ctx_size = 512;
    p.kv_blocks = 64;
    p.gpu_memory = (size_t)1 << 40;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return;
    atlas_engine_model_status ms[2];
    CHECK(atlas_engine_models(e, ms, 2) == 2);
    atlas_engine_free(e);
    size_t need[2] = {weights_size(dir_a) + ms[0].kv_bytes, weights_size(dir_b) + ms[1].kv_bytes};
    CHECK(need[0] && need[1] && need[0] != need[1]);
    int small = need[0] < need[1] ? 0 : 1, large = 1 - small;
    p.gpu_memory = (need[0] + need[1]) / 2;
    e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return;
    coll first, c;
    atlas_request r = request(mods[small].name, 4);
    run_one(e, &r, &first);
    CHECK(first.finish == ATLAS_FINISH_LENGTH && first.n_tokens == 4);
    r = request(mods[large].name, 4);
    run_one(e, &r, &c);
    CHECK_MSG(c.finish == ATLAS_FINISH_ERROR && c.status == ATLAS_ERR_DEVICE_NOMEM, "%d %s",
              c.status, c.msg);
    coll_destroy(&c);
    atlas_engine_metrics m = metrics(e);
    CHECK(atlas_engine_models(e, ms, 2) == 2 && ms[small].resident && !ms[large].resident);
    CHECK_MSG(m.unloads == 0 && m.loads == 1, "loads %llu unloads %llu",
              (unsigned long long)m.loads, (unsigned long long)m.unloads);
    r = request(mods[small].name, 4);
    run_one(e, &r, &c);
    CHECK(c.finish == ATLAS_FINISH_LENGTH && c.n_tokens == 4 &&
          !memcmp(c.ids, first.ids, sizeof(int32_t) * 4));
    coll_destroy(&c);
    coll_destroy(&first);
    atlas_engine_free(e);
}

/* ---- pausing after a drain timeout ------------------------------------------------------ */

/* long enough for several turns of DRAIN_MS each (a model being swapped out goes on while
 * the other loads beside it, and a turn is at least twice a load), short enough that a
 * sanitizer build's recomputes stay within the test's time */
enum { LONG = 1000, DRAIN_MS = 100 };

static uint64_t pauses(atlas_engine *e) { return metrics(e).preemptions; }

/* Two long requests, on a and on b, submitted together (max_resident 1): instead of b
 * waiting for all of a, they take turns of at least the drain timeout, each paused (KV
 * dropped with its model) and recomputed when its model is back; both end with the ids
 * they have alone. */
static void test_pause_turns(atlas_engine *e, const coll *alone_a, const coll *alone_b) {
    atlas_engine_metrics m0 = metrics(e);
    double t0 = now_s();
    atlas_request ra = request("a", LONG), rb = request("b", LONG);
    coll ca, cb;
    coll_init(&ca);
    coll_init(&cb);
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca, NULL));
    coll_wait_tokens(&ca, 2);
    CHECK_OK(atlas_engine_submit(e, &rb, on_event, &cb, NULL));
    coll_wait_tokens(&cb, 1);
    int a_done = 0, n_a = coll_tokens(&ca, &a_done);
    CHECK_MSG(!a_done, "b's first token came after a's request ended: a was not paused");
    coll_wait(&ca);
    coll_wait(&cb);
    CHECK_MSG(ca.finish == ATLAS_FINISH_LENGTH && ca.n_tokens == LONG && ca.hash == alone_a->hash,
              "a: finish %d, %d tokens, %s ids as alone (%s)", ca.finish, ca.n_tokens,
              ca.hash == alone_a->hash ? "the same" : "other", ca.msg);
    CHECK_MSG(cb.finish == ATLAS_FINISH_LENGTH && cb.n_tokens == LONG && cb.hash == alone_b->hash,
              "b: finish %d, %d tokens, %s ids as alone (%s)", cb.finish, cb.n_tokens,
              cb.hash == alone_b->hash ? "the same" : "other", cb.msg);
    atlas_engine_metrics m = metrics(e);
    uint64_t n_pauses = m.preemptions - m0.preemptions, n_loads = m.loads - m0.loads;
    fprintf(stderr, "turns: a had %d tokens at b's first; %llu pauses, %llu loads in %.2f s\n",
            n_a, (unsigned long long)n_pauses, (unsigned long long)n_loads, now_s() - t0);
    CHECK_MSG(n_pauses >= 2 && n_loads >= 3 && m.finished_error == m0.finished_error,
              "both should have been paused: %llu pauses, %llu loads",
              (unsigned long long)n_pauses, (unsigned long long)n_loads);
    coll_destroy(&ca);
    coll_destroy(&cb);
}

/* Short requests for b keep coming, each as soon as the one before has ended, while a long
 * one runs on a: each b is answered within the drain timeout plus the swaps, and a, paused
 * again and again, still gets its turns (it is wanted first once b's model is loaded) and
 * ends with the ids it has alone. */
static void test_no_starvation(atlas_engine *e, const coll *alone_a) {
    uint64_t p0 = pauses(e);
    double t0 = now_s();
    atlas_request ra = request("a", LONG), rb = request("b", 4);
    coll ca;
    coll_init(&ca);
    CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca, NULL));
    coll_wait_tokens(&ca, 2);
    int n_b = 0, bad_b = 0, a_done = 0;
    double worst = 0;
    for (; n_b < 1000 && (coll_tokens(&ca, &a_done), !a_done); n_b++) {
        double t0 = now_s();
        coll cb;
        run_one(e, &rb, &cb);
        double dt = now_s() - t0;
        if (dt > worst) worst = dt;
        bad_b += cb.finish != ATLAS_FINISH_LENGTH || cb.n_tokens != 4;
        coll_destroy(&cb);
    }
    coll_wait(&ca);
    uint64_t n_pauses = pauses(e) - p0;
    fprintf(stderr, "starvation: %d requests for b while a ran, the slowest %.3f s; %llu "
            "pauses in %.2f s\n", n_b, worst, (unsigned long long)n_pauses, now_s() - t0);
    CHECK_MSG(ca.finish == ATLAS_FINISH_LENGTH && ca.n_tokens == LONG && ca.hash == alone_a->hash,
              "a: finish %d, %d tokens, %s ids as alone (%s)", ca.finish, ca.n_tokens,
              ca.hash == alone_a->hash ? "the same" : "other", ca.msg);
    CHECK_MSG(n_b >= 2 && bad_b == 0 && n_pauses >= 2, "%d requests for b (%d failed), a paused "
              "%llu times", n_b, bad_b, (unsigned long long)n_pauses);
    /* generous for a loaded machine: without the timeout b would wait for all of a */
    CHECK_MSG(worst < DRAIN_MS / 1e3 + 2.0, "a request for b took %.3f s", worst);
    coll_destroy(&ca);
}

static void test_pause(const char *dir_a, const char *dir_b) {
    CHECK(atlas_engine_default_params().drain_timeout_ms == 30000);
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 1, 4096, DRAIN_MS);
    if (!e) return;
    atlas_request ra = request("a", LONG), rb = request("b", LONG);
    coll alone_a, alone_b;
    double t0 = now_s();
    run_one(e, &ra, &alone_a);
    run_one(e, &rb, &alone_b);
    fprintf(stderr, "alone: a and b in %.2f s\n", now_s() - t0);
    CHECK(alone_a.finish == ATLAS_FINISH_LENGTH && alone_a.n_tokens == LONG);
    CHECK(alone_b.finish == ATLAS_FINISH_LENGTH && alone_b.n_tokens == LONG);
    test_pause_turns(e, &alone_a, &alone_b);
    test_no_starvation(e, &alone_a);
    atlas_engine_free(e);
    coll_destroy(&alone_a);
    coll_destroy(&alone_b);
}

/* Waits up to seconds for c's end; 1: it came. */
static int coll_wait_for(coll *c, double seconds) {
    double until = now_s() + seconds;
    int done = 0;
    while (coll_tokens(c, &done), !done && now_s() < until) sleep_ms(10);
    return done;
}

/* A drain timeout shorter than a recompute: each turn must still let the paused sequences
 * recompute and go on (the clock waits for their prompts), or neither model would ever
 * advance.  Prompts of 300 tokens prefilled 64 at a time, a timeout of 2 ms; the replies are
 * long enough to outlast a turn, which is at least twice a load, and the other model's load,
 * which runs beside it. */
enum { TOKENS = 400 };
static void test_pause_progress(const char *dir_a, const char *dir_b) {
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a}, {.name = "b", .dir = dir_b}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = mods;
    p.n_models = 2;
    p.max_resident = 1;
    p.drain_timeout_ms = 2;
    p.ctx_size = 2048;
    p.parallel = 4;
    p.batch_tokens = 64;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return;
    static int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = 100 + (i * 7) % 1000;
    atlas_request r[2];
    coll alone[2], c[2];
    atlas_request_handle *h[2] = {NULL, NULL};
    double t_alone = now_s();
    for (int k = 0; k < 2; k++) {
        r[k] = request(mods[k].name, TOKENS);
        r[k].prompt = prompt;
        r[k].n_prompt = 300;
        run_one(e, &r[k], &alone[k]);
        CHECK(alone[k].finish == ATLAS_FINISH_LENGTH && alone[k].n_tokens == TOKENS);
    }
    /* a livelock never ends; a slow build (sanitizers, plain C on an older CPU) needs their
     * time again and every turn's recompute of a growing context, so the wait scales */
    t_alone = now_s() - t_alone;
    double limit = t_alone * 4 > 60 ? t_alone * 4 : 60;
    uint64_t p0 = pauses(e);
    double t0 = now_s();
    for (int k = 0; k < 2; k++) { /* both at once: a is loaded, and b wants its turn */
        coll_init(&c[k]);
        CHECK_OK(atlas_engine_submit(e, &r[k], on_event, &c[k], &h[k]));
    }
    for (int k = 0; k < 2; k++) {
        int ended = coll_wait_for(&c[k], limit);
        CHECK_MSG(ended, "%s: %d of %d tokens after %.0f s (alone: %.1f s): paused before it "
                  "could advance", mods[k].name, c[k].n_tokens, TOKENS, limit, t_alone);
        atlas_engine_cancel(h[k]);
        coll_wait(&c[k]);
        CHECK_MSG(!ended || (c[k].finish == ATLAS_FINISH_LENGTH && c[k].hash == alone[k].hash),
                  "%s: finish %d, %d tokens (%s)", mods[k].name, c[k].finish, c[k].n_tokens,
                  c[k].msg);
        atlas_engine_handle_free(h[k]);
        coll_destroy(&c[k]);
        coll_destroy(&alone[k]);
    }
    fprintf(stderr, "progress: %llu pauses in %.2f s\n", (unsigned long long)(pauses(e) - p0),
            now_s() - t0);
    CHECK(pauses(e) - p0 >= 1);
    atlas_engine_free(e);
}

/* A model to be swapped out that has requests queued and none running (its one slot just
 * freed) serves them within its turn instead of going with work left, and goes as soon as
 * it is idle: b's request ends after every one of a's, with one load (b's) and no pause.
 * Without the turn, a would go between its requests and come back for the rest. */
static void test_queued_turn(const char *dir_a, const char *dir_b) {
    atlas_engine_model mods[2] = {{.name = "a", .dir = dir_a, .parallel = 1},
                                  {.name = "b", .dir = dir_b}};
    atlas_engine *e = engine_new(mods, 2, 1, 256, 2000);
    if (!e) return;
    const atlas_tokenizer *tok = NULL; /* read now: b's first submit would wait for it */
    CHECK_OK(atlas_engine_tokenizer(e, "b", &tok));
    CHECK_OK(atlas_engine_load(e, "a")); /* after: a's turn counts from its load */
    atlas_engine_metrics m0 = metrics(e);
    enum { QUEUED = 3 };
    atlas_request ra = request("a", 32), rb = request("b", 4);
    coll ca[QUEUED], cb;
    for (int k = 0; k < QUEUED; k++) {
        coll_init(&ca[k]);
        CHECK_OK(atlas_engine_submit(e, &ra, on_event, &ca[k], NULL));
    }
    coll_init(&cb);
    CHECK_OK(atlas_engine_submit(e, &rb, on_event, &cb, NULL));
    coll_wait(&cb);
    int ended = 0;
    for (int k = 0; k < QUEUED; k++) {
        int done = 0;
        coll_tokens(&ca[k], &done);
        ended += done;
    }
    CHECK_MSG(ended == QUEUED, "%d of a's %d requests had ended when b's did", ended, QUEUED);
    CHECK(cb.finish == ATLAS_FINISH_LENGTH);
    atlas_engine_metrics m1 = metrics(e);
    CHECK_MSG(m1.loads - m0.loads == 1 && m1.preemptions == m0.preemptions,
              "%llu loads, %llu pauses", (unsigned long long)(m1.loads - m0.loads),
              (unsigned long long)(m1.preemptions - m0.preemptions));
    for (int k = 0; k < QUEUED; k++) {
        coll_wait(&ca[k]);
        CHECK(ca[k].finish == ATLAS_FINISH_LENGTH);
        coll_destroy(&ca[k]);
    }
    coll_destroy(&cb);
    atlas_engine_free(e);
}

int main(void) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s", harness_data_path("tiny-llama3"));
    snprintf(b, sizeof b, "%s", harness_data_path("tiny-qwen3"));
    char tok[1100];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", a);
    if (!harness_require_file(tok)) return harness_finish();
    snprintf(tok, sizeof tok, "%s/tokenizer.json", b);
    if (!harness_require_file(tok)) return harness_finish();
    test_unload_refused(a);
    test_swap_drains(a, b);
    test_budget_before_evict(a, b);
    test_pause(a, b);
    test_pause_progress(a, b);
    test_queued_turn(a, b);
    return harness_finish();
}
