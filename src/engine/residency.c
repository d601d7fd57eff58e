/* engine/residency.c — which models are loaded: load and unload commands, loading a model
 * when it is wanted, and making room by releasing the least recently used one.  Called by
 * the scheduler loop (sched.c); calls running.c and seq.c below it.
 *
 * A model is released only through atlas_model_release, and the model handle contract
 * (atlas/model.h) is what keeps a model with live requests resident: every running sequence
 * holds a handle on its model (running.c), so a release while any runs is refused with
 * ATLAS_ERR_BUSY and nothing is unloaded.  A refusal is the normal course of a drain, not an
 * error: the model admits no more requests, and the release is tried again once one of its
 * sequences has left (md->release_refused is cleared then).  A refusal while none of the
 * engine's sequences runs on it would be a handle leaked somewhere: that alone is an error. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "backend/cuda/host.h"
#include "backend/cuda/host_tier.h"
#include "engine/engine_internal.h"
#include "model/forward.h"

void atlas_engine_cmd_complete(atlas_engine *e, eng_cmd *c, atlas_status st, const char *msg) {
    eng_cmd **p = &e->cmds;
    while (*p && *p != c) p = &(*p)->next;
    if (*p) *p = c->next;
    c->st = st;
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "");
    c->done = 1;
    pthread_cond_broadcast(&e->cmd_done);
}

/* Completes every pending command of kind for model. */
static void cmds_complete(atlas_engine *e, cmd_kind kind, int model, atlas_status st,
                          const char *msg) {
    for (eng_cmd *c = e->cmds, *next; c; c = next) {
        next = c->next;
        if (c->kind == kind && c->model == model) atlas_engine_cmd_complete(e, c, st, msg);
    }
}

/* Tells the engine's client of a residency event (atlas_engine_params.on_residency), with
 * e->mu dropped for the call.  Under e->mu. */
static void tell(atlas_engine *e, const atlas_residency_event *ev) {
    if (!e->p.on_residency) return;
    pthread_mutex_unlock(&e->mu);
    e->p.on_residency(e->p.on_residency_user, ev);
    pthread_mutex_lock(&e->mu);
}

static int has_cmd(const atlas_engine *e, cmd_kind kind, int model) {
    for (const eng_cmd *c = e->cmds; c; c = c->next)
        if (c->kind == kind && c->model == model) return 1;
    return 0;
}

static int wanted_model(const atlas_engine *e);

/* Why md is being released: the engine stops, it was asked to, or another model needs its
 * room (*other: that one). */
static const char *release_reason(const atlas_engine *e, const eng_model *md,
                                  const char **other) {
    *other = NULL;
    if (e->stop) return "shutdown";
    if (md->unload_asked || has_cmd(e, CMD_UNLOAD, (int)(md - e->models))) return "unload";
    if (md->expiring) return "keep_alive";
    int i = (int)(md - e->models);
    int w = e->load.victim == i || e->load.rel_model == i ? e->load.model : wanted_model(e);
    if (w >= 0) *other = e->models[w].name;
    return "swap";
}

/* Why md cannot be released now (its release was refused).  Under e->mu. */
static atlas_status refused(const eng_model *md, const atlas_model *m, const char *why) {
    int n = atlas_model_handles(m) - 1;
    if (md->n_running == 0)
        return atlas_fail(ATLAS_ERR_INTERNAL, "engine: releasing model '%s': %d handle(s) "
                          "on it held by no request of the engine (a leak): %s", md->name, n,
                          why);
    return atlas_fail(ATLAS_ERR_BUSY, "engine: model '%s' has %d request(s) in flight; it "
                      "admits no more and is released when they have ended", md->name, n);
}

/* A release's error as kept and told: without the server's paths (room for the list). */
static void release_msg(char *msg, size_t n, atlas_status st, const char *dir) {
    snprintf(msg, n, "%s", st == ATLAS_OK ? "" : atlas_last_error());
    if (st != ATLAS_OK && st != ATLAS_ERR_BUSY) atlas_engine_strip_dir(msg, dir);
}

static atlas_status release_done(atlas_engine *e, eng_model *md, atlas_model *m,
                                 atlas_status st, const char *msg, double dt);

/* md's prefix cache to host memory before its model m goes, where there is a store for it;
 * for a release that will go through (no request holds a handle).  Under e->mu (dropped
 * while copying). */
static void save_prefix(atlas_engine *e, eng_model *md, atlas_model *m) {
    if (!e->kv_host || e->stop || !md->kv_ident_set) return;
    atlas_kv_host_moved saved = {0};
    atlas_engine_kv_host_share(e, 0);
    pthread_mutex_unlock(&e->mu);
    atlas_kv_host_save(e->kv_host, (int)(md - e->models), &md->kv_ident, m, &md->pool, &saved);
    pthread_mutex_lock(&e->mu);
    atlas_engine_kv_host_count(e, &saved, 0);
}

atlas_status atlas_engine_release_model(atlas_engine *e, eng_model *md) {
    atlas_model *m = md->m;
    if (md->release_refused) return refused(md, m, "its last release was refused");
    /* md->releasing keeps it reported resident while the lock is dropped */
    md->m = NULL;
    md->releasing = m;
    if (atlas_model_handles(m) == 1) save_prefix(e, md, m); /* handles: this thread's alone */
    pthread_mutex_unlock(&e->mu);
    double t0 = atlas_engine_now();
    atlas_status st = atlas_model_release(m);
    double dt = atlas_engine_now() - t0;
    char msg[1024];
    release_msg(msg, sizeof msg, st, md->dir);
    pthread_mutex_lock(&e->mu);
    return release_done(e, md, m, st, msg, dt);
}

/* What follows md's release of m (st and dt its result, msg its error): refused, the model
 * is back; else its pool, the counts and the RELEASED event.  Under e->mu (dropped for the
 * event). */
static atlas_status release_done(atlas_engine *e, eng_model *md, atlas_model *m,
                                 atlas_status st, const char *msg, double dt) {
    size_t bytes = md->est_bytes;
    md->releasing = NULL;
    if (st == ATLAS_ERR_BUSY) {
        md->m = m;
        md->release_refused = 1;
        e->metrics.release_busy++;
        st = refused(md, m, msg);
        if (st != ATLAS_ERR_BUSY)
            snprintf(md->last_error, sizeof md->last_error, "%.250s", atlas_last_error());
        return st;
    }
    atlas_kv_pool_destroy(&md->pool);
    e->metrics.unloads++;
    if (st != ATLAS_OK) { /* the model is gone all the same: counted and kept, not returned */
        e->metrics.unload_failures++;
        snprintf(md->last_error, sizeof md->last_error, "releasing: %.240s", msg);
    }
    atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_RELEASED, .model = md->name,
                                .seconds = dt, .bytes = bytes,
                                .error = st == ATLAS_OK ? "" : md->last_error};
    ev.reason = release_reason(e, md, &ev.other);
    md->unload_asked = 0;
    md->expiring = 0;
    md->served = 0;
    md->idle_since = 0;
    md->draining = 0;
    md->drain_since = 0;
    md->computed_at = 0;
    tell(e, &ev);
    return ATLAS_OK;
}

/* What a failed load tells the requests that waited for it: the server's model is
 * unavailable (HTTP 503), not the request bad, whatever was wrong with the files; a lack of
 * memory stays itself. */
static atlas_status load_failure(atlas_status st) {
    return st == ATLAS_ERR_NOMEM || st == ATLAS_ERR_DEVICE_NOMEM ? st : ATLAS_ERR_UNAVAILABLE;
}

/* Ends every waiting request for model (and its load commands) with an error. */
static void fail_model_requests(atlas_engine *e, int model, atlas_status st, const char *msg) {
    eng_model *md = &e->models[model];
    snprintf(md->last_error, sizeof md->last_error, "%s", msg);
    atlas_engine_end_waiting(e, model, ATLAS_FINISH_ERROR, st, msg);
    cmds_complete(e, CMD_LOAD, model, st, msg);
    atlas_engine_flush_done(e);
}

static void tell_failed(atlas_engine *e, const eng_model *md, double seconds, const char *msg) {
    atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_LOAD_FAILED, .model = md->name,
                                .reason = msg, .seconds = seconds};
    tell(e, &ev);
}

/* A load of model that did not happen: counted, told, and its requests failed with msg. */
static void refuse_load(atlas_engine *e, int model, atlas_status st, const char *msg) {
    e->metrics.load_failures++;
    tell_failed(e, &e->models[model], 0, msg);
    fail_model_requests(e, model, st, msg);
}

/* The model's progress callback, naming the model for the engine's. */
typedef struct load_progress {
    const atlas_engine_params *p;
    const char *name;
} load_progress;

static void on_load_progress(void *user, uint64_t done, uint64_t total) {
    const load_progress *lp = user;
    lp->p->load_progress(lp->p->load_progress_user, lp->name, done, total);
}

/* load_checked's release of a model it refuses: a failure to free is counted by the caller
 * (under e->mu), the load's error is the one reported. */
static atlas_status load_checked(atlas_engine *e, eng_model *md, atlas_model **out,
                                 int *release_failed) {
    atlas_model_params mp = atlas_model_default_params();
    mp.device = e->p.device;
    mp.gpu = e->p.gpu;
    mp.kernels = e->p.kernels;
    mp.n_threads = e->p.n_threads;
    mp.cpu_activations = e->p.cpu_activations;
    mp.gpu_activations = e->p.gpu_activations;
    mp.kv_dtype = md->kv_type;
    mp.kv_blocks = md->kv_blocks;
    mp.kv_block_size = e->p.kv_block_size;
    mp.max_batch_tokens = md->batch_tokens;
    mp.load_tokenizer = 0; /* the engine keeps its own, resident or not */
    mp.no_memory_check = e->p.no_memory_check;
    mp.host_cache = e->p.host_cache;
    load_progress lp = {&e->p, md->name};
    if (e->p.load_progress) mp.progress = on_load_progress, mp.progress_user = &lp;
    atlas_model *m = NULL;
    ATLAS_TRY(atlas_model_load(md->dir, &mp, &m));
    int bs = atlas_model_kv_block_size(m), nb = atlas_model_kv_blocks(m);
    atlas_status st = ATLAS_OK;
    if (bs != e->p.kv_block_size || (long)nb * bs < md->ctx ||
        atlas_model_max_batch_tokens(m) < md->batch_tokens ||
        atlas_model_vocab_size(m) != md->cfg.vocab_size)
        st = atlas_fail(ATLAS_ERR_INTERNAL, "model gave %d KV blocks of %d tokens, batches of "
                        "%d, vocab %d; the engine asked %d of %d, %d, %d", nb, bs,
                        atlas_model_max_batch_tokens(m), atlas_model_vocab_size(m),
                        md->kv_blocks, e->p.kv_block_size, md->batch_tokens,
                        md->cfg.vocab_size);
    if (st != ATLAS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", atlas_last_error());
        *release_failed += atlas_model_release(m) != ATLAS_OK;
        return atlas_fail(st, "%s", msg);
    }
    *out = m;
    return ATLAS_OK;
}

uint64_t atlas_engine_dir_sig(const char *dir) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over each file's name, size and mtime */
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        uint64_t v[3] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                         (uint64_t)st.st_mtim.tv_nsec};
        uint64_t f = 1469598103934665603ull; /* per file, then summed: readdir's order varies */
        for (const char *c = de->d_name; *c; c++) f = (f ^ (unsigned char)*c) * 1099511628211ull;
        for (int i = 0; i < 3; i++) f = (f ^ v[i]) * 1099511628211ull;
        h += f;
    }
    closedir(d);
    return h;
}

/* Remembers a failed load of md: the next requests fail at once during the back-off. */
static void remember_failure(atlas_engine *e, eng_model *md) {
    pthread_mutex_unlock(&e->mu);
    uint64_t sig = atlas_engine_dir_sig(md->dir);
    pthread_mutex_lock(&e->mu);
    int shift = md->fail_count < 6 ? md->fail_count : 6;
    double backoff = (double)(1 << shift);
    md->fail_count++;
    md->fail_until = atlas_engine_now() + (backoff < 60 ? backoff : 60);
    md->fail_sig = sig;
}

void atlas_engine_model_failed(atlas_engine *e, int model, const char *msg) {
    eng_model *md = &e->models[model];
    pthread_mutex_lock(&e->mu);
    snprintf(md->last_error, sizeof md->last_error, "%s", msg);
    e->metrics.load_failures++;
    remember_failure(e, md);
    pthread_mutex_unlock(&e->mu);
}

void atlas_engine_strip_dir(char *s, const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "models/x/" is "models/x" */
    if (n == 0) return;
    static const char bare[] = "the model's directory";
    char out[400];
    size_t o = 0;
    for (const char *p = s; *p && o + sizeof bare < sizeof out;) {
        if (!strncmp(p, dir, n)) {
            if (p[n] == '/') {
                p += n + 1;
                continue;
            }
            memcpy(out + o, bare, sizeof bare - 1);
            o += sizeof bare - 1;
            p += n;
            continue;
        }
        out[o++] = *p++;
    }
    out[o] = '\0';
    strcpy(s, out);
}

/* ---- the loader thread ------------------------------------------------------------------ */

/* A load runs on a thread of its own, one at a time, while the scheduler goes on stepping the
 * resident models; the loading model's requests wait in the queue (admission skips a model
 * that is not resident).  The thread reads only what atlas_engine_create fixed (the model's
 * directory, name and sizes, e->p) and writes only e->load's result, then hands it over
 * under e->mu and wakes the scheduler, which installs the model (finish_load): residency,
 * pools, metrics and events stay the scheduler's alone. */
/* Runs the release handed over in ld (ld->rel_m, of the model in dir) on this thread: its
 * result into ld's rel_ fields, which the scheduler reads only once rel_done is set (under
 * e->mu, by the caller).  Not under e->mu. */
static void release_run(eng_load *ld, const char *dir) {
    double t0 = atlas_engine_now();
    ld->rel_st = atlas_model_release(ld->rel_m);
    ld->rel_dt = atlas_engine_now() - t0;
    release_msg(ld->rel_msg, sizeof ld->rel_msg, ld->rel_st, dir);
}

static void *loader_main(void *arg) {
    atlas_engine *e = arg;
    eng_load *ld = &e->load;
    pthread_mutex_lock(&e->mu);
    eng_model *md = ld->model >= 0 ? &e->models[ld->model] : NULL; /* NULL: a release alone */
    const char *rel_dir = ld->rel_m ? e->models[ld->rel_model].dir : NULL;
    pthread_mutex_unlock(&e->mu);
    atlas_error_clear();
    /* a load on the GPU holds the device's memory pool until it is over: the victim's
     * memory stays mapped for the newcomer (atlas_host_pool_hold) */
    atlas_host *pool = md ? atlas_engine_gpu_host(e) : NULL;
    if (pool && atlas_host_pool_hold(pool) != ATLAS_OK) {
        pool = NULL;
        atlas_error_clear(); /* the load goes on, mapping its memory as before */
    }
    if (rel_dir) { /* the room first: handed over for the scheduler to install */
        release_run(ld, rel_dir);
        pthread_mutex_lock(&e->mu);
        ld->rel_done = 1;
        ld->t_start = atlas_engine_now(); /* the load's own time starts now: the swap has both */
        ld->done = md == NULL;
        pthread_cond_broadcast(&e->wake);
        pthread_mutex_unlock(&e->mu);
        atlas_error_clear();
    }
    if (!md) return NULL;
    uint64_t files = atlas_engine_dir_sig(md->dir); /* before reading them */
    atlas_model *m = NULL;
    int release_failed = 0;
    atlas_status st = load_checked(e, md, &m, &release_failed);
    char err[400];
    /* clients see this message: it names the model and its files, never the server's paths */
    snprintf(err, sizeof err, "%s", atlas_last_error());
    atlas_engine_strip_dir(err, md->dir);
    /* what the load left unused goes back to the driver (its message read first) */
    if (pool && atlas_host_pool_unhold(pool) != ATLAS_OK) atlas_error_clear();
    static const char wrapped[] = "loading model the model's directory: "; /* model.c's */
    const char *w = strncmp(err, wrapped, sizeof wrapped - 1) ? err : err + sizeof wrapped - 1;
    double t_end = atlas_engine_now();
    pthread_mutex_lock(&e->mu);
    snprintf(ld->msg, sizeof ld->msg, "loading model '%s': %s", md->name, w);
    ld->m = m;
    ld->files = files;
    ld->st = st;
    ld->release_failed = release_failed;
    ld->t_end = t_end;
    ld->done = 1;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Installs the release the loader thread ran (e->load.rel_done), before its load or alone:
 * the model's pool, counts and RELEASED event, as atlas_engine_release_model's own (its
 * result stays in e->load: the thread writes nothing more of it).  Under e->mu. */
static void release_install(atlas_engine *e) {
    eng_load *ld = &e->load;
    if (!ld->rel_done) return;
    ld->rel_done = 0;
    (void)release_done(e, &e->models[ld->rel_model], ld->rel_m, ld->rel_st, ld->rel_msg,
                       ld->rel_dt); /* for ld->model, or alone (model -1) */
    ld->rel_model = -1;
    ld->rel_m = NULL;
}

/* Takes idle md out of service for the loader thread to release, before its load (start_load
 * with rel) or alone (start_release): its prefix cache goes to host memory first, as in
 * atlas_engine_release_model, and it is reported resident (releasing) until release_install.
 * Under e->mu (dropped while saving). */
static void release_handoff(atlas_engine *e, eng_model *md) {
    atlas_model *m = md->m;
    md->m = NULL;
    md->releasing = m;
    save_prefix(e, md, m);
}

/* Whether md can go to the loader thread to be released: idle, its last release not
 * refused, and no handle out but the engine's (the release cannot be refused there). */
static int idle_release_ok(const eng_model *md) {
    return md->n_running == 0 && !md->release_refused && atlas_model_handles(md->m) == 1;
}

/* No loader thread could start: the release handed over in e->load runs here and is
 * installed.  Under e->mu (dropped meanwhile). */
static void release_here(atlas_engine *e) {
    eng_load *ld = &e->load;
    pthread_mutex_unlock(&e->mu);
    release_run(ld, e->models[ld->rel_model].dir);
    pthread_mutex_lock(&e->mu);
    ld->rel_done = 1;
    release_install(e);
}

/* e->load is over once its thread is joined and no victim drains for it. */
static void load_settle(atlas_engine *e) {
    if (!e->load.active && e->load.victim < 0) e->load.model = -1;
}

/* Starts loading model (room was made, or is being made by victim, draining, or is made by
 * the thread releasing rel first: release_handoff) on the loader thread.  t0: when the swap
 * began (the release before it); replaced: the model released last to make room for it, -1
 * if none.  Returns 1 (worked).  Under e->mu. */
static int start_load(atlas_engine *e, int model, double t0, int replaced, int victim, int rel) {
    eng_model *md = &e->models[model];
    eng_load *ld = &e->load;
    *ld = (eng_load){.model = model, .victim = victim, .replaced = replaced, .t0 = t0,
                     .why = has_cmd(e, CMD_LOAD, model) ? "load" : "request",
                     .t_start = atlas_engine_now(), .rel_model = rel,
                     .rel_m = rel >= 0 ? e->models[rel].releasing : NULL};
    for (int i = 0; i < e->n_models; i++) ld->beside += i != model && e->models[i].m;
    /* room for the image it may fill: none when it came from the tier last time, or when
     * its weights are larger than the whole budget (the tier then keeps no image of them) */
    int fills = !(md->load_source && !strcmp(md->load_source, "host")) &&
                md->weight_bytes <= e->p.host_cache;
    atlas_engine_kv_host_share(e, fills ? md->weight_bytes : 0);
    md->loading = 1; /* for the status (/health) */
    if (pthread_create(&ld->thread, NULL, loader_main, e) == 0) {
        ld->active = 1;
        return 1;
    }
    md->loading = 0;
    ld->victim = -1;
    if (ld->rel_m) release_here(e); /* no thread to release it */
    load_settle(e);
    char msg[512];
    snprintf(msg, sizeof msg, "loading model '%s': cannot start the loader thread", md->name);
    refuse_load(e, model, ATLAS_ERR_UNAVAILABLE, msg);
    return 1;
}

/* The model of e->load, loaded, may serve from now (its victim, if any, is gone): its turn
 * starts, the swap is counted from the victim's release to now, the LOADED event is told
 * and its load commands return.  Under e->mu (dropped for the event). */
static void announce_loaded(atlas_engine *e) {
    eng_load *ld = &e->load;
    int model = ld->model;
    eng_model *md = &e->models[model];
    md->held = 0;
    md->loaded_at = atlas_engine_now();
    md->last_used = ++e->clock;
    double dt = md->loaded_at - ld->t0;
    e->metrics.last_swap_s = dt;
    atlas_engine_hist_observe(&e->metrics.swap, dt);
    atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_LOADED, .model = md->name,
                                .reason = ld->why, .seconds = md->last_load_s,
                                .bytes = md->est_bytes, .beside = ld->beside,
                                .source = md->load_source, .tier_off = md->tier_off,
                                .times = &md->load_times};
    if (ld->replaced >= 0) {
        ev.other = e->models[ld->replaced].name, ev.swap_seconds = dt;
        e->metrics.swaps++;
        e->metrics.swap_seconds += dt;
    }
    load_settle(e);
    tell(e, &ev); /* before the load command returns and the requests run */
    cmds_complete(e, CMD_LOAD, model, ATLAS_OK, NULL);
    /* the host tier's image fills from here, beside serving: its pinning holds the driver's
     * other calls, which the load's own (the KV cache, the activations) must not wait for */
    atlas_model_start_tier_fill(md->m);
}

/* What md's KV blocks are good for as just loaded (m, from files); its blocks kept in host
 * memory from a load of other files or settings are dropped.  Under e->mu. */
static void kv_host_ident(atlas_engine *e, eng_model *md, atlas_model *m,
                          const atlas_model_info *info, uint64_t files) {
    atlas_kv_host_ident id = {.files = files, .block_bytes = atlas_model_kv_block_bytes(m),
                              .block_size = atlas_model_kv_block_size(m),
                              .n_layers = info->n_layers, .n_kv_heads = info->n_kv_heads,
                              .head_dim = info->head_dim};
    snprintf(id.kv_dtype, sizeof id.kv_dtype, "%s", md->kv_dtype);
    snprintf(id.backend, sizeof id.backend, "%s", info->backend ? info->backend : "");
    md->kv_ident = id;
    md->kv_ident_set = 1;
    atlas_kv_host_moved mv;
    atlas_kv_host_check(e->kv_host, (int)(md - e->models), &id, &mv);
    atlas_engine_kv_host_count(e, &mv, 0);
}

void atlas_engine_kv_host_share(atlas_engine *e, size_t coming) {
    if (!e->kv_host) return;
    atlas_tier_stats ts;
    atlas_host_tier_stats(&ts);
    /* a tier with no budget is one no load used (the CPU) or one off on this GPU: nothing
     * coming for it */
    size_t held = ts.pinned + ts.filling + (ts.budget ? coming : 0), cap = e->p.host_cache;
    atlas_kv_host_moved mv = {.dropped = atlas_kv_host_set_budget(e->kv_host,
                                                                  held < cap ? cap - held : 0)};
    atlas_engine_kv_host_count(e, &mv, 0);
}

/* Where md's load read its weights from, counted; the KV store's share follows the tier's
 * new image.  Under e->mu. */
static void count_source(atlas_engine *e, eng_model *md, const atlas_model_info *info) {
    md->load_source = info->load_source;
    md->tier_off = info->host_tier;
    md->load_times = info->times;
    atlas_engine_metrics *x = &e->metrics;
    int host = !strcmp(info->load_source, "host"), cached = !strcmp(info->load_source,
                                                                     "page_cache");
    *(host ? &x->loads_host : cached ? &x->loads_page_cache : &x->loads_disk) += 1;
    *(host ? &x->load_bytes_host : cached ? &x->load_bytes_page_cache : &x->load_bytes_disk) +=
        info->weight_bytes;
    atlas_engine_kv_host_share(e, 0);
}

/* Installs what the loader thread loaded (its thread has handed over: e->load.done), or
 * fails the model's requests with its error.  A failed load stops its victim's drain: the
 * victim admits again, having lost nothing.  Under e->mu (dropped meanwhile). */
static void finish_load(atlas_engine *e) {
    eng_load *ld = &e->load;
    pthread_join(ld->thread, NULL); /* it has handed over: only its return is left */
    ld->active = 0;
    release_install(e); /* its release before it, told first */
    if (ld->model < 0) { /* a release alone (start_release) */
        load_settle(e);
        return;
    }
    int model = ld->model;
    eng_model *md = &e->models[model];
    md->loading = 0;
    atlas_model *m = ld->m;
    atlas_status st = ld->st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ld->msg);
    int release_failed = ld->release_failed;
    ld->m = NULL;
    if (st == ATLAS_OK) {
        atlas_kv_pool_params kp = {.n_blocks = atlas_model_kv_blocks(m),
                                   .block_size = atlas_model_kv_block_size(m)};
        st = atlas_kv_pool_init(&md->pool, &kp);
        if (st != ATLAS_OK) {
            snprintf(msg, sizeof msg, "loading model '%s': %s", md->name, atlas_last_error());
            pthread_mutex_unlock(&e->mu);
            release_failed += atlas_model_release(m) != ATLAS_OK;
            pthread_mutex_lock(&e->mu);
        }
    }
    e->metrics.unload_failures += (uint64_t)release_failed;
    if (st != ATLAS_OK) {
        e->metrics.load_failures++;
        atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_LOAD_FAILED, .model = md->name,
                                    .reason = msg, .seconds = ld->t_end - ld->t_start,
                                    .beside = ld->beside};
        tell(e, &ev); /* said before its requests end */
        fail_model_requests(e, model, load_failure(st), msg);
        remember_failure(e, md);
        ld->victim = -1;
        load_settle(e);
        return;
    }
    md->fail_count = 0;
    md->fail_until = 0;
    atlas_model_info info;
    atlas_model_get_info(m, &info);
    md->est_bytes = info.weight_bytes + info.kv_bytes;
    kv_host_ident(e, md, m, &info, ld->files);
    count_source(e, md, &info);
    md->m = m;
    md->last_load_s = ld->t_end - ld->t_start;
    md->last_error[0] = 0;
    md->release_refused = 0;
    e->metrics.loads++;
    md->held = ld->victim >= 0;
    if (!md->held) announce_loaded(e); /* else once its victim is released (drive_victim) */
}

void atlas_engine_load_abandon(atlas_engine *e) {
    eng_load *ld = &e->load;
    if (!ld->active) return;
    pthread_mutex_unlock(&e->mu);
    pthread_join(ld->thread, NULL);
    pthread_mutex_lock(&e->mu);
    ld->active = 0;
    release_install(e);
    if (ld->model < 0) return; /* a release alone */
    e->models[ld->model].loading = 0;
    atlas_model *m = ld->m;
    ld->m = NULL;
    ld->victim = -1;
    load_settle(e);
    if (!m) return;
    pthread_mutex_unlock(&e->mu);
    int failed = atlas_model_release(m) != ATLAS_OK;
    pthread_mutex_lock(&e->mu);
    e->metrics.unload_failures += (uint64_t)failed;
}

/* ---- residency -------------------------------------------------------------------------- */

/* Pauses every running sequence of md (newest first, so that the oldest ends up at the
 * front of the queue); each drops its handle on the model.  Under e->mu. */
static void pause_all(atlas_engine *e, eng_model *md) {
    double budget = 0;
    while (md->n_running > 0) atlas_engine_preempt(e, md, md->running[md->n_running - 1], &budget);
    atlas_engine_flush_done(e);
}

/* A model's turn: what it serves from its load before its work may be paused or it be
 * released for another, max(drain_timeout_ms, twice its last load), so that two models
 * wanted at once spend at most a third of the time swapping.  0: no limit. */
static double turn_s(const atlas_engine *e, const eng_model *md) {
    if (e->p.drain_timeout_ms == 0) return 0;
    double d = e->p.drain_timeout_ms / 1e3, twice = 2 * md->last_load_s;
    return d > twice ? d : twice;
}

/* Whether md, draining for a swap, has had its turn (turn_s) since the later of the drain's
 * start and its load, so that two models wanted at once take turns instead of pausing each
 * other at every step.  The clock is held while a running sequence
 * computes its prompt or recomputes after a pause: pausing it then would throw that work
 * away, and a turn shorter than a recompute would do so at every turn, so that the paused
 * sequences never advanced.  Each turn thus gives them drain_timeout_ms of new tokens.
 * Under e->mu. */
static int pause_due(atlas_engine *e, eng_model *md) {
    double now = atlas_engine_now();
    if (md->drain_since == 0) md->drain_since = now;
    for (int i = 0; i < md->n_running; i++)
        if (md->running[i]->n_tokens - md->running[i]->n_computed > 1) md->computed_at = now;
    double since = md->drain_since > md->loaded_at ? md->drain_since : md->loaded_at;
    if (md->computed_at > since) since = md->computed_at;
    return e->p.drain_timeout_ms > 0 && now - since >= turn_s(e, md);
}

/* Whether model fits beside the resident models but gone (-1: all of them): the count of
 * --max-resident and the memory budget.  Under e->mu. */
static int fits_without(const atlas_engine *e, int model, int gone) {
    int n = 0;
    size_t bytes = e->models[model].est_bytes;
    for (int i = 0; i < e->n_models; i++)
        if (e->models[i].m && i != gone) {
            n++;
            bytes += e->models[i].est_bytes;
        }
    return (e->p.max_resident == ATLAS_MAX_RESIDENT_AUTO || n < e->p.max_resident) &&
           (e->budget == 0 || bytes <= e->budget);
}

static int fits(const atlas_engine *e, int model) { return fits_without(e, model, -1); }

/* The model that should be loaded next: that of the oldest load command, else that of the
 * oldest waiting request; -1 when every wanted model is resident. */
static int wanted_model(const atlas_engine *e) {
    for (const eng_cmd *c = e->cmds; c; c = c->next)
        if (c->kind == CMD_LOAD && !e->models[c->model].m) return c->model;
    for (int i = 0; i < e->n_waiting; i++)
        if (!e->models[e->waiting[i]->model].m) return e->waiting[i]->model;
    return -1;
}

static int busy(const eng_model *md) { return md->n_running > 0 || md->n_waiting > 0; }

/* The model to release for another: the least recently used idle one, which may go at once,
 * else the least recently used busy one, which drains; never a pinned one. */
static int lru_victim(const atlas_engine *e, int except) {
    int v = -1;
    for (int i = 0; i < e->n_models; i++) {
        const eng_model *md = &e->models[i];
        if (i == except || !md->m || md->pinned) continue;
        if (v < 0 || busy(&e->models[v]) > busy(md) ||
            (busy(&e->models[v]) == busy(md) && md->last_used < e->models[v].last_used))
            v = i;
    }
    return v;
}

/* Load and unload commands.  A load of a resident model completes at once (and takes back
 * an unload deferred until then); an unload releases the model, or, while requests run on
 * it, answers ATLAS_ERR_BUSY with their number and leaves the model draining, to be released
 * once the last has ended (atlas/engine.h, atlas_engine_unload).  Under e->mu (dropped
 * while a model is released). */
int atlas_engine_do_commands(atlas_engine *e) {
    int worked = 0;
    for (eng_cmd *c = e->cmds, *next; c; c = next) {
        next = c->next;
        eng_model *md = &e->models[c->model];
        if (c->kind == CMD_LOAD && md->m) {
            md->unload_asked = 0;
            atlas_engine_cmd_complete(e, c, ATLAS_OK, NULL);
            worked = 1;
        } else if (c->kind == CMD_UNLOAD && !md->loading) { /* after its load, if loading */
            atlas_status st = md->m ? atlas_engine_release_model(e, md) : ATLAS_OK;
            if (st == ATLAS_ERR_BUSY) md->unload_asked = md->draining = 1;
            atlas_engine_cmd_complete(e, c, st, st == ATLAS_OK ? NULL : atlas_last_error());
            if (st == ATLAS_ERR_BUSY) {
                atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_DRAINING,
                                            .model = md->name, .reason = "unload",
                                            .running = md->n_running};
                tell(e, &ev);
            }
            next = e->cmds; /* the list may have changed while unlocked */
            worked = 1;
        }
    }
    for (int i = 0; i < e->n_models; i++) { /* unloads deferred until their requests ended */
        eng_model *md = &e->models[i];
        if (md->unload_asked && md->m && !md->release_refused &&
            atlas_engine_release_model(e, md) == ATLAS_OK)
            worked = 1;
    }
    return worked;
}

/* What can be known of md's load before anything is evicted for it (atlas_model_inspect):
 * its headers and tensors, and that its weights and KV pool fit in what the backend has
 * free plus what releasing the resident models (freeable bytes) gives back; *room_now: they
 * fit in what it has free now, beside the resident models.  Not under e->mu (reads only
 * what does not change). */
static atlas_status precheck(atlas_engine *e, const eng_model *md, size_t freeable,
                             int *room_now) {
    *room_now = 0;
    atlas_model_params mp = atlas_model_default_params();
    mp.device = e->p.device;
    mp.gpu = e->p.gpu;
    mp.kv_blocks = md->kv_blocks;
    mp.kv_block_size = e->p.kv_block_size;
    /* the KV pool's element type, as the load will make it (FP8: half bf16's bytes) */
    mp.cpu_activations = e->p.cpu_activations;
    mp.gpu_activations = e->p.gpu_activations;
    mp.kv_dtype = md->kv_type;
    atlas_model_survey sv;
    ATLAS_TRY(atlas_model_inspect(md->dir, &mp, &sv));
    *room_now = !e->p.no_memory_check && sv.available_what[0] &&
                sv.needed_bytes <= sv.available_bytes;
    if (e->p.no_memory_check || !sv.available_what[0] ||
        sv.needed_bytes <= sv.available_bytes + freeable)
        return ATLAS_OK;
    const double g = 1073741824.0;
    return atlas_fail(strcmp(sv.backend, "cpu") ? ATLAS_ERR_DEVICE_NOMEM : ATLAS_ERR_NOMEM,
                      "not enough memory: the weights and the KV cache need %.2f GiB (weights "
                      "%.2f, KV cache %.2f) on the %s, and %.2f GiB is available with the "
                      "resident models released (%s); nothing was evicted or read. Lower the KV "
                      "cache (--kv-memory, --ctx-size) or load anyway with --no-memory-check",
                      sv.needed_bytes / g, sv.weight_bytes / g, sv.kv_bytes / g,
                      strcmp(sv.backend, "cpu") ? "GPU" : "CPU",
                      (sv.available_bytes + freeable) / g, sv.available_what);
}

/* Fails the requests for a model larger than the whole budget; returns 1 (worked). */
static int fail_too_large(atlas_engine *e, int want) {
    eng_model *wm = &e->models[want];
    char msg[512];
    snprintf(msg, sizeof msg, "model '%s' needs %.2f GiB (weights %.2f, KV cache %.2f); %s",
             wm->name, wm->est_bytes / 1073741824.0, wm->weight_bytes / 1073741824.0,
             (wm->est_bytes - wm->weight_bytes) / 1073741824.0, e->budget_what);
    refuse_load(e, want, ATLAS_ERR_DEVICE_NOMEM, msg);
    return 1;
}

/* Drains and releases the model making room for the load in flight (e->load.victim), as
 * the swap below would; once it is gone the newcomer, if loaded, serves.  Its release
 * refused with none of its requests running (a leaked handle) fails the newcomer's requests
 * and unloads the newcomer, which may not stay beside it.  1: did something.  Under e->mu
 * (dropped while releasing). */
static int drive_victim(atlas_engine *e) {
    eng_load *ld = &e->load;
    eng_model *vm = &e->models[ld->victim], *wm = &e->models[ld->model];
    double t_rel = atlas_engine_now();
    atlas_status st = ATLAS_OK;
    if (vm->m) {
        /* queued work and nothing running: it serves them until its turn is over */
        if (vm->n_running == 0 && vm->n_waiting > 0 && t_rel - vm->loaded_at < turn_s(e, vm))
            return 0;
        vm->draining = 1;
        st = atlas_engine_release_model(e, vm);
        if (st == ATLAS_ERR_BUSY) {
            if (!pause_due(e, vm)) return 0;
            pause_all(e, vm); /* their handles dropped: the release cannot be refused now */
            st = atlas_engine_release_model(e, vm);
        }
    }
    if (st != ATLAS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot make room for model '%s': %s", wm->name,
                 atlas_last_error());
        tell_failed(e, wm, 0, msg);
        fail_model_requests(e, ld->model, st, msg);
        wm->unload_asked = 1;
    } else {
        ld->replaced = ld->victim;
        ld->t0 = t_rel; /* the swap's own time runs from this release */
    }
    ld->victim = -1;
    if (wm->held) announce_loaded(e); /* loaded already: it serves from now */
    else load_settle(e);
    return 1;
}

/* Whether the wanted model's load may run while its victim drains: the backend has room for
 * it now (room_now, from precheck) and so has the memory budget, beside every resident
 * model. */
static int room_beside(const atlas_engine *e, int want, int room_now) {
    size_t bytes = e->models[want].est_bytes;
    for (int i = 0; i < e->n_models; i++) bytes += e->models[i].m ? e->models[i].est_bytes : 0;
    return room_now && (e->budget == 0 || bytes <= e->budget);
}

/* A model whose checkpoint is broken, or that would not fit even with every resident model
 * released, must not cost the resident ones their place: its files' headers are read and
 * checked (no tensor data) before anything is evicted.  0: it failed (its requests are
 * ended); *room_now as precheck's.  Under e->mu (dropped meanwhile). */
static int checked_before_evict(atlas_engine *e, int want, int *room_now) {
    eng_model *wm = &e->models[want];
    size_t freeable = 0;
    for (int i = 0; i < e->n_models; i++) freeable += e->models[i].m ? e->models[i].est_bytes : 0;
    pthread_mutex_unlock(&e->mu);
    atlas_status cst = precheck(e, wm, freeable, room_now);
    char why[400], msg[512];
    snprintf(why, sizeof why, "%s", cst == ATLAS_OK ? "" : atlas_last_error());
    pthread_mutex_lock(&e->mu);
    if (cst == ATLAS_OK) return 1;
    atlas_engine_strip_dir(why, wm->dir);
    snprintf(msg, sizeof msg, "loading model '%s': %s", wm->name, why);
    refuse_load(e, want, load_failure(cst), msg);
    remember_failure(e, wm);
    return 0;
}

/* Makes the wanted model resident: loads it when it fits, else lets the least recently
 * used model drain (no admissions) and releases it once its release is no longer refused
 * (its sequences are done, or paused after drain_timeout_ms).  The load runs on the loader
 * thread; where memory allows it beside the draining model, it starts at once and the
 * newcomer admits once that one is released, else after the release.  One load or swap at a
 * time: while one is in flight, it alone moves on.  Under e->mu (dropped while releasing). */
int atlas_engine_do_residency(atlas_engine *e) {
    /* a model the loader thread is releasing shows as draining, as one released here does */
    for (int i = 0; i < e->n_models; i++)
        e->models[i].draining = e->models[i].unload_asked || e->models[i].releasing;
    int worked = 0;
    if (e->load.rel_done) { /* told as soon as it is over, not with the load */
        release_install(e);
        worked = 1;
    }
    if (e->load.active && e->load.done) {
        finish_load(e);
        worked = 1;
    }
    if (e->load.victim >= 0) worked |= drive_victim(e);
    if (e->load.active || e->load.victim >= 0) return worked;
    int want = wanted_model(e);
    if (want < 0) {
        for (int i = 0; i < e->n_models; i++) e->models[i].drain_since = 0;
        return worked;
    }
    eng_model *wm = &e->models[want];
    if (e->budget && wm->est_bytes > e->budget) return fail_too_large(e, want);
    int room_now = 0;
    if (!fits(e, want) && !checked_before_evict(e, want, &room_now)) return 1;
    double t0 = atlas_engine_now();
    int released = -1;
    while (!fits(e, want)) {
        int v = lru_victim(e, want);
        if (v < 0) { /* every resident model is pinned: no room will come */
            char msg[512];
            snprintf(msg, sizeof msg, "cannot make room for model '%s': every resident model "
                     "is pinned (unload one, or raise --max-resident)", wm->name);
            tell_failed(e, wm, 0, msg);
            fail_model_requests(e, want, ATLAS_ERR_UNAVAILABLE, msg);
            return 1;
        }
        eng_model *vm = &e->models[v];
        /* queued work and nothing running (its admissions were held by the drain): it
         * serves them until its turn is over rather than going with work left */
        if (vm->n_running == 0 && vm->n_waiting > 0 &&
            atlas_engine_now() - vm->loaded_at < turn_s(e, vm))
            return worked;
        vm->draining = 1;
        /* idle, and its room alone is enough: the loader thread releases it, while the
         * scheduler steps the others (the release waits for the serving stream) */
        if (idle_release_ok(vm) && fits_without(e, want, v)) {
            release_handoff(e, vm);
            return start_load(e, want, t0, v, -1, v);
        }
        atlas_status st = atlas_engine_release_model(e, vm);
        if (st == ATLAS_ERR_BUSY) { /* its requests hold it: they finish first */
            if (vm->drain_since == 0) { /* the drain begins: said once */
                atlas_residency_event ev = {.kind = ATLAS_RESIDENCY_DRAINING, .model = vm->name,
                                            .reason = "swap", .other = wm->name,
                                            .running = vm->n_running};
                tell(e, &ev);
            }
            if (!pause_due(e, vm)) /* it drains: the newcomer loads meanwhile if it can */
                return room_beside(e, want, room_now) ? start_load(e, want, t0, released, v, -1)
                                                      : worked;
            pause_all(e, vm); /* their handles dropped: the release cannot be refused now */
            st = atlas_engine_release_model(e, vm);
        }
        if (st != ATLAS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "cannot make room for model '%s': %s", wm->name,
                     atlas_last_error());
            tell_failed(e, wm, 0, msg);
            fail_model_requests(e, want, st, msg);
            return 1;
        }
        released = v;
        if (e->models[want].m) return 1; /* loaded by hand meanwhile: cannot, but be safe */
    }
    return start_load(e, want, t0, released, -1, -1);
}

/* Releases idle md on the loader thread, alone (no load after it), so that the models still
 * resident keep stepping meanwhile; installed as a swap's victim's is (release_install).
 * 0: not started (a load or release is in flight, or md is held): the caller releases it
 * here.  Under e->mu. */
static int start_release(atlas_engine *e, eng_model *md) {
    eng_load *ld = &e->load;
    if (ld->active || ld->victim >= 0 || !idle_release_ok(md)) return 0;
    int idx = (int)(md - e->models);
    release_handoff(e, md);
    *ld = (eng_load){.model = -1, .victim = -1, .replaced = -1, .rel_model = idx,
                     .rel_m = md->releasing, .t_start = atlas_engine_now()};
    if (pthread_create(&ld->thread, NULL, loader_main, e) == 0) {
        ld->active = 1;
        return 1;
    }
    release_here(e); /* no thread */
    load_settle(e);
    return 1;
}

/* ---- keep-alive ------------------------------------------------------------------------- */

/* Whether md, resident and idle, has outlived its keep-alive (stamping when it became
 * idle).  A pinned model has none; "none" releases once a request has run on it since its
 * load, so a load by hand stays until its first request ends.  Under e->mu. */
static int keep_alive_over(eng_model *md, double now) {
    if (!md->m || md->pinned || md->draining || md->held || md->n_running > 0 ||
        md->n_waiting > 0) {
        md->idle_since = 0;
        return 0;
    }
    if (md->idle_since == 0) md->idle_since = now;
    if (md->keep_now_ms == ATLAS_KEEP_ALIVE_NONE) return md->served;
    return md->keep_now_ms > 0 && (now - md->idle_since) * 1e3 >= (double)md->keep_now_ms;
}

int atlas_engine_do_keep_alive(atlas_engine *e) {
    double now = atlas_engine_now();
    for (int i = 0; i < e->n_models; i++) {
        eng_model *md = &e->models[i];
        if (!keep_alive_over(md, now)) continue;
        md->expiring = 1;
        if (start_release(e, md)) return 1; /* the scheduler steps the others meanwhile */
        if (atlas_engine_release_model(e, md) == ATLAS_OK) return 1;
        md->expiring = 0; /* refused: a handle is still out; tried again once it is back */
    }
    return 0;
}
