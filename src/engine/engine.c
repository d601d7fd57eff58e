/* engine/engine.c — the engine's public calls (atlas/engine.h): creating it, submitting
 * and cancelling requests, models by hand, tokenizers and templates, metrics.  The top of
 * the engine: it starts the scheduler thread (sched.c) and hands it work through the queue
 * and the command list; nothing below calls back into this file. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stdint.h>
#include <utf8proc.h>

#include "atlas/toolcall.h"
#include "core/error.h"
#include "core/file.h"
#include "core/memdir.h"
#include "backend/cuda/driver.h"
#include "backend/cuda/host_tier.h"
#include "atlas/host.h"
#include "engine/engine_internal.h"
#include "model/pooling.h"

static void hist_init(atlas_engine_hist *h, const double *bounds) {
    memset(h, 0, sizeof *h);
    memcpy(h->bounds, bounds, sizeof h->bounds);
}

atlas_engine_params atlas_engine_default_params(void) {
    return (atlas_engine_params){.max_resident = 1, .parallel = 32, .queue_limit = 256,
                                 .kv_block_size = 16, .batch_tokens = 512,
                                 .drain_timeout_ms = 30000, .gpu_memory_utilization = 0.9,
                                 .device = ATLAS_DEVICE_AUTO};
}

/* ---- create / free ---------------------------------------------------------------------- */

/* A model name as a message shows it: what breaks the rule escaped (\n, \xFF, \u0085), so
 * are a quote and a backslash; cut after 80 bytes. */
static void name_shown(char *out, size_t cap, const char *name) {
    size_t o = 0, n = strlen(name);
    for (size_t i = 0; i < n && o + 16 < cap;) {
        if (i >= 80) {
            o += (size_t)snprintf(out + o, cap - o, "...");
            break;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)name + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) o += (size_t)snprintf(out + o, cap - o, "\\x%02X", (unsigned char)name[i]);
        else if (cp == '\n') o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (cp < 0x20 || cp == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02X", cp);
        else if (cp >= 0x80 && cp < 0xa0) o += (size_t)snprintf(out + o, cap - o, "\\u%04X", cp);
        else if (cp == '"' || cp == '\\') o += (size_t)snprintf(out + o, cap - o, "\\%c", cp);
        else o += (size_t)snprintf(out + o, cap - o, "%.*s", (int)k, name + i);
        i += k > 0 ? (size_t)k : 1;
    }
    out[o] = '\0';
}

#define NAME_RULE "a model name is 1 to %d bytes of UTF-8 without control characters"

atlas_status atlas_engine_check_name(const char *name) {
    if (!name || !*name)
        return atlas_fail(ATLAS_ERR_INVALID, "an empty model name: " NAME_RULE,
                          ATLAS_ENGINE_NAME_MAX);
    char shown[128];
    name_shown(shown, sizeof shown, name);
    size_t n = strlen(name);
    if (n > ATLAS_ENGINE_NAME_MAX)
        return atlas_fail(ATLAS_ERR_INVALID, "model name \"%s\": %zu bytes long: " NAME_RULE,
                          shown, n, ATLAS_ENGINE_NAME_MAX);
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)name + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return atlas_fail(ATLAS_ERR_INVALID, "model name \"%s\": not UTF-8 at byte %zu: "
                              NAME_RULE, shown, i, ATLAS_ENGINE_NAME_MAX);
        if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0))
            return atlas_fail(ATLAS_ERR_INVALID, "model name \"%s\": control character U+%04X "
                              "at byte %zu: " NAME_RULE, shown, (unsigned)cp, i,
                              ATLAS_ENGINE_NAME_MAX);
        i += (size_t)k;
    }
    return ATLAS_OK;
}

/* A model's own settings, each checked as the params' one is, naming the model. */
static atlas_status model_settings_check(const atlas_engine_params *p,
                                         const atlas_engine_model *m) {
    int par = m->parallel ? m->parallel : p->parallel;
    int bt = m->batch_tokens ? m->batch_tokens : p->batch_tokens;
    if (m->parallel < 0 || m->ctx_size < 0 || m->batch_tokens < 0 ||
        m->keep_alive_ms < ATLAS_KEEP_ALIVE_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': parallel %d, ctx_size %d, "
                          "batch_tokens %d, keep_alive_ms %lld: out of range", m->name,
                          m->parallel, m->ctx_size, m->batch_tokens,
                          (long long)m->keep_alive_ms);
    if (bt < par)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': batch_tokens %d must hold one "
                          "decode token of each of the %d parallel sequences", m->name, bt, par);
    return ATLAS_OK;
}

static atlas_status params_check(const atlas_engine_params *p) {
    if (p->n_models < 1 || !p->models)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: no models configured");
    if (p->max_resident < 1 && p->max_resident != ATLAS_MAX_RESIDENT_AUTO)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: max_resident %d: must be >= 1, or "
                          "ATLAS_MAX_RESIDENT_AUTO", p->max_resident);
    if (p->parallel < 1 || p->queue_limit < 1 || p->kv_block_size < 1 || p->ctx_size < 0 ||
        p->kv_blocks < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: parallel %d, queue_limit %d, "
                          "kv_block_size %d, ctx_size %d, kv_blocks %d: out of range",
                          p->parallel, p->queue_limit, p->kv_block_size, p->ctx_size,
                          p->kv_blocks);
    if (!(p->gpu_memory_utilization > 0 && p->gpu_memory_utilization <= 1))
        return atlas_fail(ATLAS_ERR_INVALID, "engine: gpu_memory_utilization %g: must be in "
                          "(0, 1]", p->gpu_memory_utilization);
    if (p->drain_timeout_ms < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: drain_timeout_ms %d: must be >= 0",
                          p->drain_timeout_ms);
    if (p->batch_tokens < p->parallel)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: batch_tokens %d must hold one decode "
                          "token of each of the %d parallel sequences", p->batch_tokens,
                          p->parallel);
    if (p->kv_dtype < ATLAS_KV_DTYPE_AUTO || p->kv_dtype > ATLAS_KV_DTYPE_FP8)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: kv_dtype %d: not an atlas_kv_dtype",
                          (int)p->kv_dtype);
    if (p->step_ahead < ATLAS_STEP_AHEAD_AUTO || p->step_ahead > ATLAS_STEP_AHEAD_OFF)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: step_ahead %d: not an atlas_step_ahead",
                          (int)p->step_ahead);
    if (p->keep_alive_ms < ATLAS_KEEP_ALIVE_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: keep_alive_ms %lld: out of range",
                          (long long)p->keep_alive_ms);
    for (int i = 0; i < p->n_models; i++) {
        const atlas_engine_model *m = &p->models[i];
        if (!m->name || !*m->name || !m->dir)
            return atlas_fail(ATLAS_ERR_INVALID, "engine: models[%d]: name and dir required", i);
        ATLAS_TRY(model_settings_check(p, m));
        if (atlas_engine_check_name(m->name) != ATLAS_OK)
            return atlas_fail_wrap(ATLAS_ERR_INVALID, "engine: models[%d]", i);
        atlas_toolcall_format f;
        if (m->tool_call_format && *m->tool_call_format &&
            atlas_toolcall_format_parse(m->tool_call_format, &f) != ATLAS_OK)
            return atlas_fail_wrap(ATLAS_ERR_INVALID, "engine: model '%s'", m->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(p->models[j].name, m->name))
                return atlas_fail(ATLAS_ERR_INVALID, "engine: models[%d]: name '%s' used twice",
                                  i, m->name);
    }
    return ATLAS_OK;
}

/* Bytes of the *.safetensors files in dir: the weights, before loading them. */
static size_t weight_file_bytes(const char *dir) {
    size_t n_mem;
    const atlas_memdir_file *mem = atlas_memdir_files(dir, &n_mem);
    if (mem) { /* a directory held in memory (atlas/memdir.h) */
        size_t total = 0;
        for (size_t i = 0; i < n_mem; i++) {
            size_t n = strlen(mem[i].name);
            if (n >= 12 && !strcmp(mem[i].name + n - 12, ".safetensors")) total += mem[i].size;
        }
        return total;
    }
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t total = 0;
    struct dirent *ent;
    char path[4096];
    while ((ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n < 12 || strcmp(ent->d_name + n - 12, ".safetensors")) continue;
        if (!strcmp(ent->d_name, "reference.safetensors")) continue; /* test fixtures */
        struct stat st;
        if (atlas_path_join(path, sizeof path, dir, ent->d_name) == ATLAS_OK &&
            stat(path, &st) == 0)
            total += (size_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* The operator's template is read now, so that one that does not parse stops the start
 * (naming its file and line) instead of failing every chat request later. */
static atlas_status model_overrides(eng_model *md, const atlas_engine_model *src) {
    if (src->tool_call_format && *src->tool_call_format &&
        !(md->tool_call_format = strdup(src->tool_call_format)))
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: model '%s'", src->name);
    if (!src->chat_template) return ATLAS_OK;
    if (!(md->chat_template = strdup(src->chat_template)))
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: model '%s'", src->name);
    atlas_status st = atlas_template_load_file(src->dir, src->chat_template, &md->tmpl);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "engine: model '%s'", src->name);
    md->tmpl_tried = 1;
    md->tmpl_st = ATLAS_OK;
    return ATLAS_OK;
}

/* The operator's Matryoshka widths replace the config's (an embedding model only). */
static atlas_status model_matryoshka(eng_model *md, const atlas_engine_model *src) {
    if (src->n_matryoshka_dims <= 0) return ATLAS_OK;
    if (md->cfg.pooling == ATLAS_POOL_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': matryoshka dimensions for a "
                          "model that is not an embedding model (no sentence-transformers "
                          "modules.json)", src->name);
    if (src->n_matryoshka_dims > ATLAS_ENGINE_MAX_MATRYOSHKA ||
        src->n_matryoshka_dims > ATLAS_MAX_MATRYOSHKA || !src->matryoshka_dims)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': %d matryoshka dimensions: "
                          "1 to %d", src->name, src->n_matryoshka_dims,
                          ATLAS_ENGINE_MAX_MATRYOSHKA);
    for (int i = 0; i < src->n_matryoshka_dims; i++) {
        int w = src->matryoshka_dims[i];
        if (w < 1 || w > md->cfg.hidden)
            return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': matryoshka dimension %d "
                              "outside 1..%d (its hidden_size)", src->name, w, md->cfg.hidden);
        md->cfg.matryoshka[i] = w;
    }
    md->cfg.n_matryoshka = src->n_matryoshka_dims;
    md->cfg.matryoshka_any = false;
    return ATLAS_OK;
}

static atlas_status model_init(atlas_engine *e, int i, const atlas_engine_model *src) {
    eng_model *md = &e->models[i];
    md->name = strdup(src->name);
    md->dir = strdup(src->dir);
    md->parallel = src->parallel ? src->parallel : e->p.parallel;
    md->batch_tokens = src->batch_tokens ? src->batch_tokens : e->p.batch_tokens;
    md->kv_memory = src->kv_memory ? src->kv_memory : e->p.kv_memory;
    md->pinned = src->pinned != 0;
    md->kv_type = e->p.kv_dtype;
    if (src->kv_dtype && *src->kv_dtype) {
        md->kv_f32_asked = !strcmp(src->kv_dtype, "f32");
        if (md->kv_f32_asked) md->kv_type = ATLAS_KV_DTYPE_AUTO;
        else if (atlas_model_kv_dtype_parse(src->kv_dtype, &md->kv_type) != ATLAS_OK)
            return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': kv_dtype '%.40s': not "
                              "a KV cache type atlas has (auto, bf16, fp8, fp8_e4m3, f32)",
                              src->name, src->kv_dtype);
    }
    md->keep_ms = src->keep_alive_ms ? src->keep_alive_ms
                  : e->p.keep_alive_ms ? e->p.keep_alive_ms : ATLAS_KEEP_ALIVE_FOREVER;
    md->keep_now_ms = md->keep_ms;
    md->running = calloc((size_t)md->parallel, sizeof *md->running);
    if (!md->name || !md->dir || !md->running)
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: model '%s'", src->name);
    atlas_status st = atlas_config_load(src->dir, &md->cfg);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "engine: model '%s'", src->name);
    atlas_step_cost_init(&md->cost, &md->cfg);
    long max_ctx = atlas_config_max_context(&md->cfg);
    md->max_ctx = max_ctx < INT32_MAX / 2 ? (int)max_ctx : INT32_MAX / 2;
    int ctx = src->ctx_size ? src->ctx_size : e->p.ctx_size;
    if (ctx > md->max_ctx)
        return atlas_fail(ATLAS_ERR_INVALID, "engine: model '%s': ctx_size %d exceeds the "
                          "model's maximum of %d tokens", src->name, ctx, md->max_ctx);
    md->ctx = ctx ? ctx : md->max_ctx;
    md->weight_bytes = weight_file_bytes(src->dir);
    ATLAS_TRY(model_matryoshka(md, src));
    return model_overrides(md, src);
}

static void model_destroy(eng_model *md) {
    atlas_constraint_vocab_free(md->cvocab);
    atlas_tokenizer_free(md->tok);
    atlas_template_free(md->tmpl);
    free(md->name);
    free(md->dir);
    free(md->chat_template);
    free(md->tool_call_format);
    free(md->running);
}

void atlas_engine_free(atlas_engine *e);

static void *warm_main(void *arg);

atlas_status atlas_engine_create(const atlas_engine_params *p, atlas_engine **out) {
    *out = NULL;
    ATLAS_TRY(params_check(p));
    atlas_engine *e = calloc(1, sizeof *e);
    if (!e) return atlas_fail(ATLAS_ERR_NOMEM, "engine: out of memory");
    e->p = *p;
    e->p.models = NULL;
    e->models = calloc((size_t)p->n_models, sizeof *e->models);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->tok_mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->cmd_done, NULL);
    static const double lat[ATLAS_ENGINE_HIST_BUCKETS] = {
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120};
    static const double swap[ATLAS_ENGINE_HIST_BUCKETS] = {
        0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2, 3, 5, 10, 30, 60};
    hist_init(&e->metrics.ttft, lat);
    hist_init(&e->metrics.itl, lat);
    hist_init(&e->metrics.swap, swap);
    if (!e->models) {
        atlas_engine_free(e);
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: out of memory");
    }
    e->n_models = p->n_models;
    e->load.model = e->load.victim = e->load.replaced = e->load.rel_model = -1;
    int warm = 0;
    for (int i = 0; i < p->n_models; i++) {
        atlas_status st = model_init(e, i, &p->models[i]);
        if (st != ATLAS_OK) {
            atlas_engine_free(e);
            return st;
        }
        warm |= e->models[i].warm = p->models[i].warm != 0;
    }
    /* before the pools, which may wait for the GPU's set-up */
    if (warm) e->warm_started = pthread_create(&e->warm_thread, NULL, warm_main, e) == 0;
    atlas_status pst = atlas_engine_size_pools(e);
    if (pst != ATLAS_OK) {
        atlas_engine_free(e);
        return pst;
    }
    if (p->host_cache) {
        /* with a GPU the store's images are pinned memory (kv_host.h) */
        atlas_host *host = atlas_engine_gpu_host(e);
        atlas_status hst = atlas_kv_host_create(p->host_cache, p->n_models, host, &e->kv_host);
        if (hst != ATLAS_OK) {
            atlas_engine_free(e);
            return hst;
        }
    }
    if (pthread_create(&e->thread, NULL, atlas_engine_sched_main, e) != 0) {
        atlas_engine_free(e);
        return atlas_fail(ATLAS_ERR_NOMEM, "engine: cannot start the scheduler thread");
    }
    e->thread_started = 1;
    *out = e;
    return ATLAS_OK;
}

void atlas_engine_free(atlas_engine *e) {
    if (!e) return;
    if (e->warm_started) pthread_join(e->warm_thread, NULL);
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_broadcast(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    atlas_engine_sched_shutdown(e);
    for (int i = 0; i < e->n_models; i++) model_destroy(&e->models[i]);
    atlas_kv_host_free(e->kv_host);
    free(e->models);
    free(e->waiting);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->tok_mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->cmd_done);
    free(e);
}

/* ---- lookups ---------------------------------------------------------------------------- */

/* The tokenizers and templates of the models with warm, read in order (atlas_engine_model.warm);
 * each is kept under tok_mu, so a request that needs one meanwhile waits for its parse. */
static void *warm_main(void *arg) {
    atlas_engine *e = arg;
    for (int i = 0; i < e->n_models; i++) {
        const atlas_template *t;
        if (e->models[i].warm && atlas_engine_ensure_tokenizer(e, i) == ATLAS_OK)
            (void)atlas_engine_template(e, e->models[i].name, &t);
    }
    atlas_error_clear(); /* a failure is the first use's to report */
    return NULL;
}

static atlas_status find_model(const atlas_engine *e, const char *name, int *out) {
    for (int i = 0; name && i < e->n_models; i++)
        if (!strcmp(e->models[i].name, name)) {
            *out = i;
            return ATLAS_OK;
        }
    return atlas_fail(ATLAS_ERR_NOT_FOUND, "model '%s' is not configured", name ? name : "");
}

/* Loads the tokenizer (and the eos list that needs it) once. */
atlas_status atlas_engine_ensure_tokenizer(atlas_engine *e, int model) {
    eng_model *md = &e->models[model];
    atlas_status st = ATLAS_OK;
    pthread_mutex_lock(&e->tok_mu);
    if (!md->tok) {
        atlas_tokenizer *tok = NULL;
        st = atlas_tokenizer_load(md->dir, &tok);
        if (st == ATLAS_OK) st = atlas_tokenizer_set_vocab_size(tok, (size_t)md->cfg.vocab_size);
        if (st == ATLAS_OK) {
            md->n_eos = 0;
            for (int i = 0; i < md->cfg.n_eos; i++) md->eos[md->n_eos++] = md->cfg.eos_ids[i];
            int32_t te = atlas_tokenizer_eos_id(tok);
            int have = 0;
            for (int i = 0; i < md->n_eos; i++) have |= md->eos[i] == te;
            if (te >= 0 && !have) md->eos[md->n_eos++] = te;
            md->tok = tok;
        } else {
            atlas_tokenizer_free(tok);
        }
    }
    pthread_mutex_unlock(&e->tok_mu);
    if (st != ATLAS_OK) {
        /* the model's files are at fault, not the request: the model is failed as a load
         * that failed is (a client's 503, /health "degraded"), its message naming its files */
        char msg[400];
        snprintf(msg, sizeof msg, "model '%s': tokenizer: %s", md->name, atlas_last_error());
        atlas_engine_strip_dir(msg, md->dir);
        atlas_engine_model_failed(e, model, msg);
        st = atlas_fail(ATLAS_ERR_UNAVAILABLE, "%s", msg);
    }
    return st;
}

/* The model's tokenizer sorted for constraint masks (tens of ms for a 150k vocabulary):
 * built on the first constrained request and kept.  Special tokens get no bytes: the
 * detokenizer leaves them out of the text, which must be what the matcher saw. */
static atlas_status ensure_cvocab(atlas_engine *e, int model, const atlas_constraint_vocab **out) {
    eng_model *md = &e->models[model];
    ATLAS_TRY(atlas_engine_ensure_tokenizer(e, model));
    atlas_status st = ATLAS_OK;
    pthread_mutex_lock(&e->tok_mu);
    if (!md->cvocab) st = atlas_constraint_vocab_from_tokenizer(md->tok, true, &md->cvocab);
    *out = md->cvocab;
    pthread_mutex_unlock(&e->tok_mu);
    if (st != ATLAS_OK) return atlas_fail_wrap(st, "model '%s': constraint vocabulary", md->name);
    return ATLAS_OK;
}

atlas_status atlas_engine_tokenizer(atlas_engine *e, const char *name,
                                    const atlas_tokenizer **out) {
    int i = -1;
    *out = NULL;
    ATLAS_TRY(find_model(e, name, &i));
    ATLAS_TRY(atlas_engine_ensure_tokenizer(e, i));
    *out = e->models[i].tok;
    return ATLAS_OK;
}

atlas_status atlas_engine_template(atlas_engine *e, const char *name,
                                   const atlas_template **out) {
    int i = -1;
    *out = NULL;
    ATLAS_TRY(find_model(e, name, &i));
    eng_model *md = &e->models[i];
    pthread_mutex_lock(&e->tok_mu);
    if (!md->tmpl_tried) {
        md->tmpl_st = atlas_template_load(md->dir, &md->tmpl);
        if (md->tmpl_st != ATLAS_OK)
            snprintf(md->tmpl_err, sizeof md->tmpl_err, "%s", atlas_last_error());
        md->tmpl_tried = 1;
    }
    atlas_status st = md->tmpl_st;
    *out = md->tmpl;
    pthread_mutex_unlock(&e->tok_mu);
    if (st != ATLAS_OK) return atlas_fail(st, "model '%s': %s", name, md->tmpl_err);
    return ATLAS_OK;
}

atlas_status atlas_engine_embedding_info(atlas_engine *e, const char *name,
                                         atlas_engine_embedding *out) {
    int i = 0;
    *out = (atlas_engine_embedding){0};
    ATLAS_TRY(find_model(e, name, &i));
    const atlas_config *c = &e->models[i].cfg; /* read at create, never changed */
    if (c->pooling == ATLAS_POOL_NONE) return ATLAS_OK;
    *out = (atlas_engine_embedding){.is_embedding = 1, .pooling = atlas_pooling_name(c->pooling),
                                    .normalize = c->normalize, .dims = c->hidden,
                                    .matryoshka = c->matryoshka, .n_matryoshka = c->n_matryoshka,
                                    .matryoshka_any = c->matryoshka_any};
    return ATLAS_OK;
}

atlas_status atlas_engine_ctx_size(atlas_engine *e, const char *name, int *out) {
    int i = -1;
    ATLAS_TRY(find_model(e, name, &i));
    *out = e->models[i].ctx;
    return ATLAS_OK;
}

atlas_status atlas_engine_generation_defaults(atlas_engine *e, const char *name,
                                              atlas_generation_defaults *out) {
    int i = -1;
    *out = (atlas_generation_defaults){0};
    ATLAS_TRY(find_model(e, name, &i));
    atlas_config_generation_defaults(&e->models[i].cfg, out);
    return ATLAS_OK;
}

/* ---- requests --------------------------------------------------------------------------- */

/* The thinking budget's fields (atlas_request.think_budget). */
static atlas_status check_think(const atlas_request *r, int V) {
    if (r->think_budget < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "request: think_budget %d is negative",
                          r->think_budget);
    if (r->think_budget == 0) return ATLAS_OK;
    if (r->constraint)
        return atlas_fail(ATLAS_ERR_INVALID, "request: think_budget with a constraint (its "
                          "program would refuse the closing tag)");
    if (r->n_think_open < 0 || r->n_think_open > ATLAS_ENGINE_MAX_THINK_IDS ||
        (r->n_think_open > 0 && !r->think_open))
        return atlas_fail(ATLAS_ERR_INVALID, "request: think_open has %d ids: 0..%d",
                          r->n_think_open, ATLAS_ENGINE_MAX_THINK_IDS);
    if (r->n_think_close < 1 || r->n_think_close > ATLAS_ENGINE_MAX_THINK_IDS ||
        !r->think_close)
        return atlas_fail(ATLAS_ERR_INVALID, "request: think_close has %d ids: 1..%d",
                          r->n_think_close, ATLAS_ENGINE_MAX_THINK_IDS);
    for (int i = 0; i < r->n_think_open + r->n_think_close; i++) {
        int close = i >= r->n_think_open;
        int32_t id = close ? r->think_close[i - r->n_think_open] : r->think_open[i];
        if (id < 0 || id >= V)
            return atlas_fail(ATLAS_ERR_RANGE, "request: %s[%d] = %d outside the vocabulary "
                              "(0..%d)", close ? "think_close" : "think_open",
                              close ? i - r->n_think_open : i, (int)id, V - 1);
    }
    return ATLAS_OK;
}

/* An embedding model computes vectors and nothing else, and only an embedding model does. */
static atlas_status check_embed(const eng_model *md, const atlas_request *r) {
    bool model_embeds = md->cfg.pooling != ATLAS_POOL_NONE;
    if (r->embed && !model_embeds)
        return atlas_fail(ATLAS_ERR_INVALID, "model '%s' is not an embedding model (its "
                          "directory has no sentence-transformers modules.json with a Pooling "
                          "module): it generates text", md->name);
    if (!r->embed && model_embeds)
        return atlas_fail(ATLAS_ERR_INVALID, "model '%s' is an embedding model: it makes "
                          "embeddings (/v1/embeddings, /api/embed), not text", md->name);
    if (r->embed && r->n_prompt > (size_t)md->ctx)
        return atlas_fail(ATLAS_ERR_RANGE, "request: the input has %zu tokens, the context "
                          "of model '%s' holds %d", r->n_prompt, md->name, md->ctx);
    return ATLAS_OK;
}

static atlas_status check_request(const atlas_engine *e, const eng_model *md,
                                  const atlas_request *r) {
    int V = md->cfg.vocab_size;
    if (r->n_prompt < 1 || !r->prompt)
        return atlas_fail(ATLAS_ERR_INVALID, "request: the prompt is empty");
    ATLAS_TRY(check_embed(md, r));
    if (!r->embed && r->n_prompt >= (size_t)md->ctx)
        return atlas_fail(ATLAS_ERR_RANGE, "request: the prompt has %zu tokens, the context "
                          "of model '%s' holds %d (prompt and at least one generated token)",
                          r->n_prompt, md->name, md->ctx);
    if (r->max_tokens > 0 && r->n_prompt + (size_t)r->max_tokens > (size_t)md->ctx)
        return atlas_fail(ATLAS_ERR_RANGE, "request: the prompt has %zu tokens and max_tokens "
                          "is %d: %zu in all, the context of model '%s' holds %d", r->n_prompt,
                          r->max_tokens, r->n_prompt + (size_t)r->max_tokens, md->name, md->ctx);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= V)
            return atlas_fail(ATLAS_ERR_RANGE, "request: prompt[%zu] = %d outside the "
                              "vocabulary (0..%d)", i, (int)r->prompt[i], V - 1);
    if (r->n_stop_ids < 0 || (r->n_stop_ids > 0 && !r->stop_ids) || r->n_stop < 0 ||
        (r->n_stop > 0 && !r->stop))
        return atlas_fail(ATLAS_ERR_INVALID, "request: stop ids / stop strings");
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= V)
            return atlas_fail(ATLAS_ERR_RANGE, "request: stop_ids[%d] = %d outside the "
                              "vocabulary (0..%d)", i, (int)r->stop_ids[i], V - 1);
    if (r->n_forced < 0 || (r->n_forced > 0 && !r->forced))
        return atlas_fail(ATLAS_ERR_INVALID, "request: forced tokens");
    for (int i = 0; i < r->n_forced; i++)
        if (r->forced[i] < 0 || r->forced[i] >= V)
            return atlas_fail(ATLAS_ERR_RANGE, "request: forced[%d] = %d outside the "
                              "vocabulary (0..%d)", i, (int)r->forced[i], V - 1);
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !*r->stop[i])
            return atlas_fail(ATLAS_ERR_INVALID, "request: stop[%d] is empty", i);
    for (int i = 0; i < r->sampling.n_logit_bias; i++)
        if (r->sampling.logit_bias && r->sampling.logit_bias[i].id >= V)
            return atlas_fail(ATLAS_ERR_RANGE, "request: logit_bias[%d]: id %d outside the "
                              "vocabulary (0..%d)", i, (int)r->sampling.logit_bias[i].id, V - 1);
    if (r->constraint && atlas_constraint_n_segments(r->constraint) == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "request: the constraint program is empty");
    if (r->cache_salt && strlen(r->cache_salt) > ATLAS_ENGINE_MAX_CACHE_SALT)
        return atlas_fail(ATLAS_ERR_INVALID, "request: cache_salt is %zu bytes long: at most "
                          "%d", strlen(r->cache_salt), ATLAS_ENGINE_MAX_CACHE_SALT);
    if (r->keep_alive_ms < ATLAS_KEEP_ALIVE_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "request: keep_alive_ms %lld: out of range",
                          (long long)r->keep_alive_ms);
    if (r->top_logprobs < 0 || r->top_logprobs > ATLAS_ENGINE_MAX_TOP_LOGPROBS)
        return atlas_fail(ATLAS_ERR_INVALID, "request: top_logprobs %d outside 0..%d",
                          r->top_logprobs, ATLAS_ENGINE_MAX_TOP_LOGPROBS);
    (void)e;
    return check_think(r, V);
}

/* Copies the request into a new sequence (refs 1: the engine's). */
static atlas_status seq_create(atlas_engine *e, int model, const atlas_request *r,
                               atlas_event_cb cb, void *user, seq **out) {
    eng_model *md = &e->models[model];
    seq *s = calloc(1, sizeof *s);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    atomic_init(&s->refs, 1);
    s->e = e;
    s->model = model;
    s->cb = cb;
    s->user = user;
    s->cap = md->ctx;
    s->n_prompt = s->n_tokens = (int)r->n_prompt;
    int room = md->ctx - s->n_prompt;
    s->max_tokens = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
    s->embed = r->embed != 0;
    if (s->embed) {
        s->pool = calloc((size_t)md->cfg.hidden, sizeof *s->pool);
        s->vec = calloc((size_t)md->cfg.hidden, sizeof *s->vec);
    }
    s->logprobs = r->logprobs;
    s->top_logprobs = r->top_logprobs;
    s->ignore_eos = r->ignore_eos;
    const atlas_sampler_params *sp = &r->sampling;
    int plain = sp->repetition_penalty == 1.0f && sp->presence_penalty == 0.0f &&
                sp->frequency_penalty == 0.0f && sp->n_logit_bias == 0 && !r->logprobs &&
                r->top_logprobs == 0 && !r->constraint && !r->n_forced && /* masks need the logits */
                !r->think_budget && /* the closing tag is forced in sample_row */
                !r->embed;
    s->plain_greedy = plain && sp->temperature == 0.0f;
    s->plain_sampled = plain && sp->temperature > 0.0f;
    s->think_budget = r->think_budget;
    if (r->think_budget) {
        if (r->n_think_open)
            memcpy(s->think_open, r->think_open,
                   (size_t)r->n_think_open * sizeof *r->think_open);
        memcpy(s->think_close, r->think_close,
               (size_t)r->n_think_close * sizeof *r->think_close);
        s->n_think_open = r->n_think_open;
        s->n_think_close = r->n_think_close;
        s->think_in = r->think_inside != 0;
    }
    s->think_forcing = -1;
    s->stop_string = -1;
    s->stop_id = -1;
    s->plan = -1;
    s->q_row = -1;
    s->t_submit = atlas_engine_now();
    s->keep_alive_ms = r->keep_alive_ms;
    s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
    s->stop_ids = malloc((size_t)(r->n_stop_ids + 1) * sizeof *s->stop_ids);
    s->stop = calloc((size_t)r->n_stop + 1, sizeof *s->stop);
    s->forced = malloc((size_t)(r->n_forced + 1) * sizeof *s->forced);
    atlas_status st = ATLAS_OK;
    if (!s->tokens || !s->stop_ids || !s->stop || !s->forced ||
        (s->embed && !(s->pool && s->vec)))
        st = atlas_fail(ATLAS_ERR_NOMEM, "request");
    for (int i = 0; st == ATLAS_OK && i < r->n_stop; i++, s->n_stop++)
        if (!(s->stop[i] = strdup(r->stop[i]))) st = atlas_fail(ATLAS_ERR_NOMEM, "request");
    if (st == ATLAS_OK) {
        memcpy(s->tokens, r->prompt, r->n_prompt * sizeof *s->tokens);
        if (r->n_stop_ids)
            memcpy(s->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *s->stop_ids);
        s->n_stop_ids = r->n_stop_ids;
        if (r->n_forced) memcpy(s->forced, r->forced, (size_t)r->n_forced * sizeof *s->forced);
        s->n_forced = r->n_forced;
        st = atlas_kv_table_init(&s->kv, (md->ctx + e->p.kv_block_size - 1) /
                                             e->p.kv_block_size,
                                 r->cache_salt, r->cache_salt ? strlen(r->cache_salt) : 0);
    }
    if (st == ATLAS_OK) st = atlas_sampler_create(&r->sampling, &s->sampler);
    if (st == ATLAS_OK) atlas_sampler_set_prompt_len(s->sampler, r->n_prompt);
    if (st == ATLAS_OK) st = atlas_engine_seq_sampling(s, &r->sampling);
    if (st == ATLAS_OK) st = atlas_detok_create(md->tok, true, &s->detok);
    if (st == ATLAS_OK && r->constraint) {
        const atlas_constraint_vocab *v = NULL;
        st = ensure_cvocab(e, model, &v);
        if (st == ATLAS_OK) st = atlas_constraint_matcher_new(r->constraint, v, &s->matcher);
        if (st == ATLAS_OK && !(s->allowed = malloc((size_t)md->cfg.vocab_size)))
            st = atlas_fail(ATLAS_ERR_NOMEM, "request: constraint mask");
        if (st != ATLAS_OK && st != ATLAS_ERR_NOMEM)
            st = atlas_fail_wrap(st, "request: constraint");
    }
    if (st != ATLAS_OK) {
        atlas_engine_seq_unref(s);
        return st;
    }
    *out = s;
    return ATLAS_OK;
}

atlas_status atlas_engine_submit(atlas_engine *e, const atlas_request *req, atlas_event_cb cb,
                                 void *user, atlas_request_handle **out) {
    if (out) *out = NULL;
    if (!cb) return atlas_fail(ATLAS_ERR_INVALID, "request: no callback");
    int model = -1;
    ATLAS_TRY(find_model(e, req->model, &model));
    eng_model *md = &e->models[model];
    ATLAS_TRY(check_request(e, md, req));
    ATLAS_TRY(atlas_engine_ensure_tokenizer(e, model));
    seq *s = NULL;
    ATLAS_TRY(seq_create(e, model, req, cb, user, &s));
    if (out) atomic_fetch_add(&s->refs, 1);
    /* a model that failed to load answers at once until its back-off ends or its files
     * change (read outside the lock: a few stat calls) */
    pthread_mutex_lock(&e->mu);
    bool failed = md->fail_until > 0 && !md->m;
    pthread_mutex_unlock(&e->mu);
    uint64_t sig = failed ? atlas_engine_dir_sig(md->dir) : 0;
    /* after a sticky GPU error every GPU call fails: said at once, with the cause */
    char lost[512];
    bool gpu_lost = e->p.device != ATLAS_DEVICE_CPU && atlas_cu_lost(lost, sizeof lost);
    pthread_mutex_lock(&e->mu);
    atlas_status st = ATLAS_OK;
    double now = atlas_engine_now();
    if (failed && sig != md->fail_sig) md->fail_until = 0; /* new files: try them */
    if (gpu_lost) {
        e->metrics.requests_rejected++;
        st = atlas_fail(ATLAS_ERR_UNAVAILABLE, "model '%s' cannot run: the GPU's context was "
                        "lost to %s; restart atlas to use the GPU again", md->name, lost);
    } else if (md->fail_until > now && !md->m) {
        e->metrics.requests_rejected++;
        st = atlas_fail(ATLAS_ERR_UNAVAILABLE, "model '%s' is unavailable: %s (tried again in "
                        "%.0f s, or when its files change)", md->name, md->last_error,
                        md->fail_until - now + 0.5);
    } else if (e->n_waiting >= e->p.queue_limit) {
        e->metrics.requests_rejected++;
        st = atlas_fail(ATLAS_ERR_BUSY, "engine: the queue is full (%d requests waiting)",
                        e->n_waiting);
    } else {
        st = atlas_engine_queue_back(e, s);
    }
    if (st == ATLAS_OK) {
        e->metrics.requests_submitted++;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
    if (st != ATLAS_OK) {
        if (out) atlas_engine_seq_unref(s);
        atlas_engine_seq_unref(s);
        return st;
    }
    if (out) *out = s;
    return ATLAS_OK;
}

void atlas_engine_cancel(atlas_request_handle *h) {
    if (!h || atomic_load(&h->ended)) return;
    atomic_store(&h->cancel, 1);
    atlas_engine *e = h->e;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void atlas_engine_handle_free(atlas_request_handle *h) { atlas_engine_seq_unref(h); }

/* ---- models by hand --------------------------------------------------------------------- */

static atlas_status run_cmd(atlas_engine *e, cmd_kind kind, const char *name) {
    int model = -1;
    ATLAS_TRY(find_model(e, name, &model));
    eng_cmd c = {.kind = kind, .model = model};
    pthread_mutex_lock(&e->mu);
    eng_cmd **tail = &e->cmds;
    while (*tail) tail = &(*tail)->next;
    *tail = &c;
    pthread_cond_signal(&e->wake);
    while (!c.done) pthread_cond_wait(&e->cmd_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (c.st != ATLAS_OK) return atlas_fail(c.st, "%s", c.msg);
    return ATLAS_OK;
}

atlas_status atlas_engine_load(atlas_engine *e, const char *name) {
    return run_cmd(e, CMD_LOAD, name);
}

atlas_status atlas_engine_unload(atlas_engine *e, const char *name) {
    return run_cmd(e, CMD_UNLOAD, name);
}

/* What /health and /v1/models say a model is doing; under e->mu. */
static void model_state(const eng_model *md, atlas_engine_model_status *out) {
    out->failed_loads = md->fail_count;
    out->retry_in_s = 0;
    if (md->m && md->held) out->state = "loading"; /* loaded, serving once its victim goes */
    else if (md->m || md->releasing) out->state = md->draining ? "draining" : "resident";
    else if (md->loading) out->state = "loading";
    else if (md->fail_count > 0) out->state = "failed";
    else out->state = "unloaded";
    double left = md->fail_until - atlas_engine_now();
    if (!md->m && md->fail_count > 0 && left > 0) out->retry_in_s = left;
}

/* Its settings and, while it waits out a timed keep-alive, the time left; under e->mu. */
static void model_settings(const eng_model *md, atlas_engine_model_status *out) {
    out->parallel = md->parallel;
    out->batch_tokens = md->batch_tokens;
    out->pinned = md->pinned;
    out->keep_alive_ms = md->keep_ms;
    out->keep_alive_now_ms = md->keep_now_ms;
    snprintf(out->kv_dtype, sizeof out->kv_dtype, "%s", md->kv_dtype);
    out->expires_in_s = -1;
    /* The keep-alive loop stamps idle_since on its next round; a model that went idle since
     * then counts from now, so a client asking right after its answer sees its keep-alive. */
    int idle = !md->draining && !md->held && md->n_running == 0 && md->n_waiting == 0;
    if (md->m && !md->pinned && idle && md->keep_now_ms > 0) {
        double now = atlas_engine_now(), since = md->idle_since > 0 ? md->idle_since : now;
        double left = since + md->keep_now_ms / 1e3 - now;
        out->expires_in_s = left > 0 ? left : 0;
    }
}

int atlas_engine_models(atlas_engine *e, atlas_engine_model_status *out, int cap) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_models && i < cap; i++) {
        const eng_model *md = &e->models[i];
        out[i] = (atlas_engine_model_status){.name = md->name, .dir = md->dir,
                                             .resident = (md->m && !md->held) || md->releasing,
                                             .running = md->n_running,
                                             .waiting = md->n_waiting,
                                             .ctx_size = md->ctx, .max_ctx = md->max_ctx,
                                             .kv_tokens = (long)md->kv_blocks * e->p.kv_block_size,
                                             .kv_bytes = (size_t)md->kv_blocks *
                                                         e->p.kv_block_size * md->kv_token_bytes};
        snprintf(out[i].last_error, sizeof out[i].last_error, "%s", md->last_error);
        snprintf(out[i].note, sizeof out[i].note, "%s", md->ctx_note);
        model_state(md, &out[i]);
        snprintf(out[i].architecture, sizeof out[i].architecture, "%s", md->cfg.architecture);
        out[i].chat_template = md->chat_template;
        out[i].tool_call_format = md->tool_call_format;
        model_settings(md, &out[i]);
        out[i].kv_block_size = e->p.kv_block_size;
        out[i].kv_blocks = md->kv_blocks;
        if (md->m || md->releasing) out[i].kv_blocks_used = atlas_kv_pool_used(&md->pool);
        out[i].memory_bytes = md->est_bytes;
        out[i].last_load_s = md->last_load_s;
        if (md->m || md->releasing) out[i].resident_bytes = md->est_bytes;
        if (md->m) {
            atlas_model_info info;
            atlas_model_get_info(md->m, &info);
            snprintf(out[i].backend, sizeof out[i].backend, "%s", info.backend);
            snprintf(out[i].dtype, sizeof out[i].dtype, "%s", info.dtype);
            out[i].n_params = info.n_params;
            out[i].weight_bytes = info.weight_bytes;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return e->n_models;
}

void atlas_engine_get_metrics(atlas_engine *e, atlas_engine_metrics *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->metrics;
    out->memory_budget = e->budget;
    out->queue_len = e->n_waiting;
    atlas_tier_stats ts;
    atlas_host_tier_stats(&ts);
    out->host_tier_bytes = ts.held;
    out->host_tier_pinned = ts.pinned;
    out->host_tier_models = ts.entries;
    out->host_tier_evicted = ts.evicted;
    out->device_contexts = atlas_host_contexts_created();
    out->device_lost = atlas_cu_lost(out->device_error, sizeof out->device_error);
    out->running = 0;
    out->kv_blocks_used = out->kv_blocks_total = out->resident_models = 0;
    out->kv_blocks_cached = 0;
    for (int i = 0; i < e->n_models; i++) {
        const eng_model *md = &e->models[i];
        out->running += md->n_running;
        if (!md->m && !md->releasing) continue;
        out->resident_models++;
        out->kv_blocks_used += atlas_kv_pool_used(&md->pool);
        out->kv_blocks_cached += atlas_kv_pool_cached(&md->pool);
        out->kv_blocks_total += md->pool.n_blocks;
    }
    pthread_mutex_unlock(&e->mu);
}
