/* tests/test-fault.c — fault injection (src/core/fault.h): every allocation and file read of
 * the library fails once, one site at a time, as SQLite tests allocation failure.
 *
 * The walk: one request through the engine on the CPU with the embedded default model
 * (models/default) — engine create, the chat template's load and render, the tokenizer's
 * load and an encode, the model's load
 * (config, tokenizer, weights, KV cache), prefill and a few greedy decode steps with the
 * sampler and the detokenizer, then a seeded sampled request with logprobs (the backend's
 * sample op), engine free. A clean run records its N hits (about 400, 82
 * distinct sites); then the hits are failed one per run: the run must end in success with
 * the clean run's tokens (the failure was absorbed) or in a clean error, a status with a
 * message, never a crash or a hang; everything is freed each time (LeakSanitizer checks it
 * at exit in the ASan build). To keep CI short, a hit is failed when its pair (site, the
 * site before it) is new: the ~300 others are the same code in the same context again (each
 * layer's tensors, each token's step). Every distinct site is failed at least once (checked);
 * -a fails all N hits (under two minutes under ASan), -v prints each run.
 *
 * The swap: an engine with max_resident 1 and two models; with the first resident, a fault
 * armed at one of the sites of a request for the second (its load, which first releases the
 * first, then prefill and decode; every N/12-th hit) fails that request cleanly, and the
 * next requests for both models, disarmed, are served with their clean tokens.  The engine
 * keeps released models' prefix KV in host memory (host_cache), so a swap's sites include
 * the store's: saving at a release, copying back at the next request.
 *
 * --step-ahead on (ctest's test-fault-ahead) walks with the greedy request's steps queued
 * ahead on the CPU (engine/step.c's run_ahead and the model's host queue), as a GPU runs
 * them by default.
 *
 * -d cuda (ctest's test-gpu-fault) runs both on the GPU, where the CUDA backend's sites join
 * the walk: its device allocations (the registry's cuMemAlloc), the pinned memory of its
 * batch staging and its kernel launches, those of decode steps captured into CUDA graphs
 * too (the first, middle and last launch of each run of launches is failed besides the
 * pairs). A clean warm-up of both models comes first (the driver grows the context lazily),
 * then the device's free memory is the baseline: after every run, its engine freed, free
 * memory must be back at it exactly, as after the 200 releases of test-gpu-host; in the
 * swap, after each point with the first model resident again, at what it was in that state
 * before the faults. The CUDA sites failed are listed; at least one device allocation and
 * one launch must be among them. The host's pinned staging pool is allocated once a
 * process, by the warm-up, so its site is not walked. Without a usable GPU (or a build
 * without kernels) -d cuda is skipped (exit 77) with the reason.
 *
 * The walk needs an ATLAS_FAULT build (.ci/run's ASan build is one); elsewhere it is
 * skipped (exit 77). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "atlas/host.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "core/fault.h"
#include "harness.h"

enum { MAX_IDS = 64, N_DECODE = 4, SWAP_POINTS = 12, MAX_HITS = 16384, AROUND = 10 };

static char default_dir[1024];
static int verbose;  /* -v: each fault's site and outcome */
static int walk_all; /* -a: fail every hit of the walk, not one of each pair of sites */
static atlas_device device = ATLAS_DEVICE_CPU; /* -d cpu | cuda */
static const char messages[] = "[{\"role\": \"user\", \"content\": \"The quick brown fox\"}]";

/* ---- one request's events --------------------------------------------------------------- */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t ids[MAX_IDS];
    int n_ids, done, n_ends;
    atlas_finish finish;
    atlas_status status;
    char msg[512];
} coll;

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->type == ATLAS_EVENT_TOKEN) {
        if (c->n_ids < MAX_IDS) c->ids[c->n_ids++] = ev->id;
    } else {
        c->n_ends++;
        c->done = 1;
        c->finish = ev->finish;
        c->status = ev->status;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message ? ev->message : "");
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* What one run ended in: ATLAS_OK with ids, or a status and its message. */
typedef struct outcome {
    atlas_status status;
    char msg[512];
    int32_t ids[MAX_IDS];
    int n_ids;
} outcome;

static atlas_status failed(outcome *o, atlas_status st, const char *where) {
    o->status = st;
    snprintf(o->msg, sizeof o->msg, "%s: %s", where, atlas_last_error());
    return st;
}

/* Submits a request for model name with the messages and waits for its end: greedy, or
 * (sampled) seeded sampling with a penalty, logprobs and top logprobs. */
static atlas_status request(atlas_engine *e, const char *name, int sampled, outcome *o) {
    const atlas_tokenizer *tok = NULL;
    atlas_status st = atlas_engine_tokenizer(e, name, &tok);
    if (st != ATLAS_OK) return failed(o, st, "tokenizer");
    /* the server's way: the chat template renders the messages, then they are encoded */
    const atlas_template *tpl = NULL;
    st = atlas_engine_template(e, name, &tpl);
    if (st != ATLAS_OK) return failed(o, st, "template");
    char *text = NULL;
    st = atlas_template_render_str(tpl, messages, NULL, true, NULL, &text);
    if (st != ATLAS_OK) return failed(o, st, "render");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    st = atlas_tokenizer_encode(tok, text, strlen(text), false, &ids, &n_ids);
    free(text);
    if (st != ATLAS_OK) return failed(o, st, "encode");
    atlas_request r = {0};
    r.model = name;
    r.prompt = ids;
    r.n_prompt = n_ids;
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = 0;
    r.max_tokens = N_DECODE;
    r.ignore_eos = 1;
    if (sampled) {
        r.sampling.temperature = 0.8f, r.sampling.top_p = 0.9f, r.sampling.seed = 11;
        r.sampling.repetition_penalty = 1.1f;
        r.logprobs = 1, r.top_logprobs = 2;
    }
    coll c = {0};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    st = atlas_engine_submit(e, &r, on_event, &c, NULL);
    free(ids);
    if (st != ATLAS_OK) {
        failed(o, st, "submit");
    } else {
        pthread_mutex_lock(&c.mu);
        while (!c.done) pthread_cond_wait(&c.cv, &c.mu);
        pthread_mutex_unlock(&c.mu);
        /* an end's message goes to the client: it names no path of the server's */
        CHECK_MSG(!strstr(c.msg, default_dir) && !strstr(c.msg, harness_data_dir()),
                  "a path in the message to the client: %s", c.msg);
        o->status = c.finish == ATLAS_FINISH_ERROR ? c.status : ATLAS_OK;
        if (c.finish == ATLAS_FINISH_ERROR && o->status == ATLAS_OK) o->status = ATLAS_ERR_INTERNAL;
        snprintf(o->msg, sizeof o->msg, "%s", c.msg);
        o->n_ids = c.n_ids;
        memcpy(o->ids, c.ids, sizeof c.ids);
        st = o->status;
    }
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return st;
}

static atlas_step_ahead step_ahead = ATLAS_STEP_AHEAD_AUTO;

static atlas_engine_params engine_params(const atlas_engine_model *models, int n) {
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = n;
    p.max_resident = 1;
    p.device = device;
    p.n_threads = 1; /* no workers: the sites are reached in one order, run after run */
    p.ctx_size = 64;
    p.kv_blocks = 8;
    p.step_ahead = step_ahead;
    return p;
}

/* The walked run: engine, tokenizer, load, prefill, decode, free. */
static void walk_run(outcome *o) {
    memset(o, 0, sizeof *o);
    atlas_engine_model models[] = {{.name = "default", .dir = default_dir}};
    atlas_engine_params p = engine_params(models, 1);
    atlas_engine *e = NULL;
    atlas_status st = atlas_engine_create(&p, &e);
    if (st != ATLAS_OK) {
        failed(o, st, "engine create");
        CHECK(e == NULL);
        return;
    }
    /* A command the scheduler thread answers: its start (the batch buffers) is over before
     * this thread goes on, so the two reach their sites in one order. */
    st = atlas_engine_unload(e, "default");
    if (st != ATLAS_OK) {
        failed(o, st, "unload");
    } else if (request(e, "default", 0, o) == ATLAS_OK) { /* then a sampled one, appended */
        outcome s;
        memset(&s, 0, sizeof s);
        if (request(e, "default", 1, &s) != ATLAS_OK) {
            o->status = s.status;
            snprintf(o->msg, sizeof o->msg, "%s", s.msg);
        }
        memcpy(o->ids + o->n_ids, s.ids, (size_t)s.n_ids * sizeof *s.ids);
        o->n_ids += s.n_ids;
    }
    atlas_engine_free(e);
}

static int same_ids(const outcome *a, const outcome *b) {
    return a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, (size_t)a->n_ids * sizeof *a->ids);
}

/* A run with a fault: success with the clean tokens, or an error with a message. */
static void check_outcome(const outcome *o, const outcome *clean, long n, const char *site,
                          int fired, int *n_errors) {
    if (o->status == ATLAS_OK) {
        CHECK_MSG(same_ids(o, clean), "fault %ld at %s: succeeded with other tokens (%d)", n,
                  site, o->n_ids);
        return;
    }
    (*n_errors)++;
    CHECK_MSG(fired, "fault %ld did not fire, yet the run failed: %s", n, o->msg);
    CHECK_MSG(o->msg[0] != '\0', "fault %ld at %s: status %s without a message", n, site,
              atlas_status_str(o->status));
}

static int same_site(atlas_fault_site a, atlas_fault_site b) {
    return a.line == b.line && a.file && b.file && !strcmp(a.file, b.file);
}

static int is_launch(atlas_fault_site s) {
    return s.file && strstr(s.file, "backend/cuda/ops_cuda.c") != NULL;
}

/* Which hits of a traced run to fail: the first hit of each pair (site, the site before it).
 * The rest repeat code already failed in the same context — the binding of each layer's
 * tensors, each token's steps — and are walked only with -a (all). Kernel launches come in
 * runs of one site (one launch function for every kernel), where the pairs would fail only
 * a run's first two: the first, middle and last launch of each run are failed too, so that
 * a decode step's launches fail while it is captured into a graph. */
static long pick_hits(const atlas_fault_site *trace, long n, long *picked) {
    long k = 0, run0 = -1, run1 = -1; /* the current run of launches, first and last hit */
    for (long h = 0; h < n; h++) {
        atlas_fault_site prev = h > 0 ? trace[h - 1] : (atlas_fault_site){NULL, 0};
        int seen = 0;
        for (long g = 0; g < h && !seen && !walk_all; g++) {
            atlas_fault_site gprev = g > 0 ? trace[g - 1] : (atlas_fault_site){NULL, 0};
            seen = same_site(trace[g], trace[h]) &&
                   (same_site(gprev, prev) || (!gprev.file && !prev.file));
        }
        if (is_launch(trace[h]) && h > run1) { /* a run starts */
            run0 = run1 = h;
            while (run1 + 1 < n && is_launch(trace[run1 + 1])) run1++;
        }
        if (h <= run1 && (h == run0 || h == (run0 + run1) / 2 || h == run1)) seen = 0;
        if (!seen) picked[k++] = h + 1;
    }
    return k;
}

static void site_name(atlas_fault_site site, char *buf, size_t cap) {
    const char *base = strrchr(site.file, '/');
    snprintf(buf, cap, "%s:%d", base ? base + 1 : site.file, site.line);
}

/* ---- device memory and the CUDA sites (-d cuda) ------------------------------------------- */

static atlas_host *host;     /* -d cuda: the process's GPU */
static size_t mem_base;      /* free device memory after the warm-up */
static long long mem_worst;  /* the largest difference from a baseline seen, in bytes */
static long mem_checks, mem_off;

/* Free device memory now must be `base` exactly: a run that left anything on the device
 * (or freed what it did not own) shows as a difference. */
static void mem_check(size_t base, const char *after, long n, const char *site) {
    if (!host) return;
    size_t free_b = 0, total = 0;
    atlas_status st = atlas_host_mem_info(host, &free_b, &total);
    CHECK_MSG(st == ATLAS_OK, "device memory after %s %ld: %s", after, n, atlas_last_error());
    if (st != ATLAS_OK) return;
    long long diff = (long long)base - (long long)free_b; /* > 0: less free than before */
    mem_checks++;
    if (llabs(diff) > llabs(mem_worst)) mem_worst = diff;
    if (diff != 0) mem_off++;
    CHECK_MSG(diff == 0, "device memory after %s %ld (%s): %lld bytes less free than the "
              "baseline", after, n, site, diff);
}

/* The kinds of CUDA site, told by the call the injected failure names (atlas_cu_check's
 * message) or by the status: a launch site is the only site of ops_cuda.c. */
enum { KIND_HOST, KIND_DEVICE_ALLOC, KIND_PINNED, KIND_LAUNCH, N_KINDS };
static const char *const kind_names[N_KINDS] = {"host allocation", "device allocation",
                                                "pinned memory", "kernel launch"};
typedef struct cuda_site {
    char name[64];
    int kind;
} cuda_site;
static cuda_site cuda_sites[256];
static int n_cuda_sites;

/* Records the site of a fired fault when it is the CUDA backend's. */
static void note_cuda_site(atlas_fault_site at, const outcome *o) {
    if (!at.file || !strstr(at.file, "backend/cuda/")) return;
    char name[64];
    site_name(at, name, sizeof name);
    int kind = KIND_HOST;
    if (is_launch(at) || strstr(o->msg, "cuLaunchKernel"))
        kind = KIND_LAUNCH;
    else if (strstr(o->msg, "cuMemAlloc (injected") ||
             (strstr(name, "registry.c") && o->status == ATLAS_ERR_DEVICE_NOMEM))
        kind = KIND_DEVICE_ALLOC;
    else if (strstr(o->msg, "cuMemHostAlloc (injected") || o->status == ATLAS_ERR_DEVICE_NOMEM)
        kind = KIND_PINNED;
    for (int i = 0; i < n_cuda_sites; i++) {
        if (strcmp(cuda_sites[i].name, name)) continue;
        if (cuda_sites[i].kind == KIND_HOST) cuda_sites[i].kind = kind; /* an absorbed one */
        return;
    }
    if (n_cuda_sites < (int)(sizeof cuda_sites / sizeof *cuda_sites)) {
        snprintf(cuda_sites[n_cuda_sites].name, sizeof cuda_sites[0].name, "%s", name);
        cuda_sites[n_cuda_sites++].kind = kind;
    }
}

/* The CUDA sites failed: listed, and at least one device allocation and one launch. */
static void report_cuda_sites(void) {
    if (!host) return;
    int per_kind[N_KINDS] = {0};
    printf("cuda: %d distinct sites of backend/cuda failed:", n_cuda_sites);
    for (int i = 0; i < n_cuda_sites; i++) {
        per_kind[cuda_sites[i].kind]++;
        printf(" %s (%s)%s", cuda_sites[i].name, kind_names[cuda_sites[i].kind],
               i + 1 < n_cuda_sites ? "," : "");
    }
    printf("\ncuda: %d device allocation, %d pinned memory, %d launch, %d host allocation "
           "sites\n", per_kind[KIND_DEVICE_ALLOC], per_kind[KIND_PINNED], per_kind[KIND_LAUNCH],
           per_kind[KIND_HOST]);
    CHECK_MSG(per_kind[KIND_DEVICE_ALLOC] > 0, "no device allocation site was failed");
    CHECK_MSG(per_kind[KIND_LAUNCH] > 0, "no kernel launch site was failed");
    printf("device memory: %ld checks against a baseline (%zu MiB free after the warm-up), "
           "%ld off it; worst difference %lld bytes\n", mem_checks, mem_base >> 20, mem_off,
           mem_worst);
}

/* ---- the walk ----------------------------------------------------------------------------- */

/* The walk's record: the sites that failed, runs, how they ended. */
typedef struct walk_log {
    char (*fired)[64];
    long n_fired, n_runs;
    int n_errors;
} walk_log;

static int has_fired(const walk_log *w, const char *name) {
    for (long f = 0; f < w->n_fired; f++)
        if (!strcmp(w->fired[f], name)) return 1;
    return 0;
}

/* The sites of a run with a fault armed, so that the one that fired is known by its path. */
static atlas_fault_site run_trace[MAX_HITS];

/* Arms hit n with the run's sites traced. */
static void arm_traced(long n) {
    atlas_fault_trace(run_trace, MAX_HITS);
    atlas_fault_arm(n);
}

/* Disarms; returns whether hit n fired, with its site's name and place. */
static long run_hits; /* the hits of the last run with a fault armed */
static int disarm_traced(long n, char *site, size_t cap, atlas_fault_site *at) {
    int fired = atlas_fault_fired(site, cap);
    run_hits = atlas_fault_hits();
    atlas_fault_arm(0);
    atlas_fault_trace(NULL, 0);
    *at = fired && n <= MAX_HITS ? run_trace[n - 1] : (atlas_fault_site){NULL, 0};
    return fired;
}

/* Where the site name was first reached in the last run with a fault armed (its hit), 0 if
 * it was not. */
static long landed(const char *name) {
    for (long i = 0; i < run_hits && i < MAX_HITS; i++) {
        char s[64];
        if (!run_trace[i].file) continue;
        site_name(run_trace[i], s, sizeof s);
        if (!strcmp(s, name)) return i + 1;
    }
    return 0;
}

/* One run with hit n failing; returns whether the failure fired at want (NULL: anywhere). */
static int fail_hit(long n, const outcome *clean, walk_log *w, const char *want) {
    arm_traced(n);
    outcome o;
    walk_run(&o);
    char site[64];
    atlas_fault_site at;
    int fired = disarm_traced(n, site, sizeof site, &at);
    w->n_runs++;
    if (fired && !has_fired(w, site)) snprintf(w->fired[w->n_fired++], 64, "%s", site);
    if (verbose)
        printf("%ld %s: %s %s\n", n, fired ? site : "(not reached)", atlas_status_str(o.status),
               o.msg);
    fflush(stdout);
    check_outcome(&o, clean, n, site, fired, &w->n_errors);
    if (fired) note_cuda_site(at, &o);
    mem_check(mem_base, "fault", n, fired ? site : "not reached");
    return fired && (!want || !strcmp(site, want));
}

static void test_walk(void) {
    outcome clean;
    static atlas_fault_site trace[MAX_HITS];
    atlas_fault_trace(trace, MAX_HITS);
    atlas_fault_arm(0);
    walk_run(&clean);
    long n_sites = atlas_fault_hits();
    atlas_fault_trace(NULL, 0);
    CHECK_MSG(clean.status == ATLAS_OK, "clean run: %s", clean.msg);
    CHECK(clean.n_ids == 2 * N_DECODE);
    CHECK(n_sites > 100 && n_sites <= MAX_HITS);
    mem_check(mem_base, "the clean run", 0, "none");
    if (n_sites > MAX_HITS) n_sites = MAX_HITS;
    static long picked[MAX_HITS];
    static char fired[MAX_HITS][64];
    walk_log w = {fired, 0, 0, 0};
    long n_picked = pick_hits(trace, n_sites, picked);
    for (long k = 0; k < n_picked; k++) fail_hit(picked[k], &clean, &w, NULL);
    long n_first = w.n_runs;
    /* The scheduler thread and the caller's both reach sites, and an allocation retried at
     * the next step (admission's) adds hits: the n-th hit of a run is not always the clean
     * run's. A site that was not failed is tried again where it moved to. */
    int missing = 0, n_sites_distinct = 0;
    for (long h = 0; h < n_sites; h++) {
        int dup = 0;
        for (long g = 0; g < h && !dup; g++) dup = same_site(trace[g], trace[h]);
        if (dup) continue;
        n_sites_distinct++;
        char name[64];
        site_name(trace[h], name, sizeof name);
        int ok = has_fired(&w, name);
        /* chased: armed where the last run reached it, or one hit later when it ended first
         * (the CUDA host's loader threads read the weights while the load goes on: on the
         * GPU every hit of a load lands where the threads happen to be) */
        for (long a = 0, n = h + 1; a <= 2 * AROUND && !ok; a++) {
            ok = fail_hit(n, &clean, &w, name);
            long q = ok ? 0 : landed(name);
            n = q > 0 && q != n ? q : n + 1;
        }
        /* then its later hits in the clean run, for a site hit more than once */
        for (long g = h + 1, tries = 0; g < n_sites && tries < 2 * AROUND && !ok; g++)
            if (same_site(trace[g], trace[h])) ok = fail_hit(g + 1, &clean, &w, name), tries++;
        if (!ok) {
            printf("  not failed: %s (hit %ld)\n", name, h + 1);
            missing++;
        }
    }
    printf("walk: %ld hits of %d distinct sites; %ld runs failed one hit each (%s, then %ld "
           "again for sites the order of threads had moved): %d ended in a clean error, the "
           "rest absorbed the failure; %d distinct sites never failed\n", n_sites,
           n_sites_distinct, w.n_runs, walk_all ? "all" : "one of each pair of successive sites",
           w.n_runs - n_first, w.n_errors, missing);
    CHECK(missing == 0);
}

/* ---- the swap ---------------------------------------------------------------------------- */

/* Waits out the engine's back-off after a failed load of model i. */
static void wait_backoff(atlas_engine *e, int i) {
    for (int tries = 0; tries < 200; tries++) {
        atlas_engine_model_status st[2];
        atlas_engine_models(e, st, 2);
        if (st[i].retry_in_s <= 0) return;
        usleep(50 * 1000);
    }
}

/* An engine serving the default model and tiny-llama3 (engine_params: one resident at a
 * time); NULL, counted as a failure, when it cannot be made. */
static atlas_engine *two_models(void) {
    char llama[1024];
    snprintf(llama, sizeof llama, "%s", harness_data_path("tiny-llama3"));
    atlas_engine_model models[] = {
        {.name = "default", .dir = default_dir},
        {.name = "llama", .dir = llama}};
    atlas_engine_params p = engine_params(models, 2);
    p.host_cache = (size_t)16 << 20; /* a release saves its prefix KV, a request restores it */
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    return e;
}

static void test_swap(void) {
    atlas_engine *e = two_models();
    if (!e) return;
    outcome a, b;
    CHECK_OK(request(e, "default", 0, &a));
    /* loaded once and kept: not part of a swap */
    const atlas_tokenizer *tok = NULL;
    const atlas_template *tpl = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "llama", &tok));
    CHECK_OK(atlas_engine_template(e, "llama", &tpl));
    /* The sites of a swap to the second model: the first's release, the second's load, its
     * prefill and decode. */
    atlas_fault_arm(0);
    CHECK_OK(request(e, "llama", 0, &b));
    long n_swap = atlas_fault_hits();
    CHECK_OK(request(e, "default", 0, &a)); /* and back */
    CHECK(n_swap > 10);
    size_t swap_base = 0, total = 0; /* the first model resident, having served */
    if (host) CHECK_OK(atlas_host_mem_info(host, &swap_base, &total));
    long stride = n_swap / SWAP_POINTS > 1 ? n_swap / SWAP_POINTS : 1;
    int n_errors = 0, n_points = 0, waited = 0;
    for (long n = 1; n <= n_swap; n += stride, n_points++) {
        outcome o;
        arm_traced(n);
        request(e, "llama", 0, &o);
        char site[256];
        atlas_fault_site at;
        int fired = disarm_traced(n, site, sizeof site, &at);
        if (fired) note_cuda_site(at, &o);
        if (verbose)
            printf("swap %ld %s: %s %s\n", n, fired ? site : "(not reached)",
                   atlas_status_str(o.status), o.msg);
        check_outcome(&o, &b, n, site, fired, &n_errors);
        if (o.status != ATLAS_OK) {
            /* A failed load answers requests at once for a back-off (a second at first):
             * wait it out once, as a client would; after that an explicit load, which
             * does not wait, keeps the test short. */
            if (!waited) {
                wait_backoff(e, 1);
                waited = 1;
            } else {
                CHECK_OK(atlas_engine_load(e, "llama"));
            }
        }
        /* the server still serves: both models, disarmed */
        outcome again;
        CHECK_MSG(request(e, "llama", 0, &again) == ATLAS_OK && same_ids(&again, &b),
                  "after fault %ld at %s: %s", n, site, again.msg);
        CHECK_MSG(request(e, "default", 0, &again) == ATLAS_OK && same_ids(&again, &a),
                  "after fault %ld at %s: %s", n, site, again.msg);
        mem_check(swap_base, "swap fault", n, fired ? site : "not reached");
    }
    printf("swap: %ld sites, every %ld-th failed (%d): %d ended in a clean error\n", n_swap,
           stride, n_points, n_errors);
    CHECK(n_errors > 0);
    atlas_engine_free(e);
    mem_check(mem_base, "the swap's engine freed", 0, "none");
}

/* -d cuda: both models served once before the baseline is taken, so that what the driver
 * sets up on first use (the staging pool, the context's growth) is not counted. */
static void warm_up(void) {
    atlas_engine *e = two_models();
    if (!e) return;
    outcome o;
    CHECK_MSG(request(e, "default", 0, &o) == ATLAS_OK, "warm-up: %s", o.msg);
    CHECK_MSG(request(e, "llama", 0, &o) == ATLAS_OK, "warm-up: %s", o.msg);
    atlas_engine_free(e);
    size_t total = 0;
    CHECK_OK(atlas_host_mem_info(host, &mem_base, &total));
}

/* -d cuda: the GPU, or why it cannot be used (the walk is then skipped). */
static int cuda_usable(char *why, size_t cap) {
    atlas_status st = atlas_host_get(0, &host);
    if (st != ATLAS_OK) {
        snprintf(why, cap, "no CUDA device: %s", atlas_last_error());
        host = NULL;
        return 0;
    }
#ifndef ATLAS_HAVE_KERNELS
    snprintf(why, cap, "this build has no kernels (configured without nvcc)");
    host = NULL;
    return 0;
#endif
    const atlas_host_props *pr = atlas_host_properties(host);
    printf("device: %s (cc %d.%d), %zu MiB\n", pr->name, pr->cc_major, pr->cc_minor,
           pr->total_mem >> 20);
    return 1;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        verbose |= !strcmp(argv[i], "-v");
        if (!strcmp(argv[i], "--step-ahead")) {
            const char *a = i + 1 < argc ? argv[++i] : "";
            if (strcmp(a, "on")) {
                fprintf(stderr, "test-fault: --step-ahead %s: want on\n", a);
                return 2;
            }
            step_ahead = ATLAS_STEP_AHEAD_ON;
        }
        walk_all |= !strcmp(argv[i], "-a");
        if (!strcmp(argv[i], "-d")) {
            const char *d = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(d, "cuda")) {
                device = ATLAS_DEVICE_CUDA;
            } else if (strcmp(d, "cpu")) {
                fprintf(stderr, "test-fault: -d %s: want cpu or cuda\n", d);
                return 2;
            }
        }
    }
    if (!atlas_fault_available()) {
        printf("SKIP: fault injection is not compiled in (configure with -DATLAS_FAULT=ON)\n");
        return 77;
    }
    char why[600];
    if (device == ATLAS_DEVICE_CUDA && !cuda_usable(why, sizeof why)) {
        printf("SKIP: %s\n", why);
        return 77; /* ctest's skip (SKIP_RETURN_CODE): not a pass that ran nothing */
    }
    const char *src = getenv("ATLAS_SOURCE_DIR");
    snprintf(default_dir, sizeof default_dir, "%s/models/default", src && *src ? src : ".");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (host) {
        warm_up();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("warm-up: %.1f s\n",
               (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
        t0 = t1;
    }
    test_walk();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("walk: %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    test_swap();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    printf("swap: %.1f s\n", (double)(t0.tv_sec - t1.tv_sec) + (t0.tv_nsec - t1.tv_nsec) * 1e-9);
    report_cuda_sites();
    return harness_finish();
}
