/* server/api_misc.c — the endpoints around generation: models (list, retrieve, load,
 * unload), health, Prometheus metrics, and tokenize / detokenize / apply-template shaped as
 * vLLM's (/tokenize: {"count", "max_model_len", "tokens"}) and llama.cpp's
 * (/apply-template: {"prompt"}) servers shape them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/engine.h"
#include "atlas/shield.h"
#include "atlas/tokenizer.h"
#include "server/api.h"
#include "server/errors.h"

enum { MAX_MODELS = 64 };

/* The server a request came to (the dispatch context). */
static atlas_server *server_of(const atlas_http_call *call) { return call->ctx; }

/* A model's state (engine.h) into v: "state", and after failed loads their count and when
 * the next try comes. */
static void model_state_json(json_t *v, const atlas_engine_model_status *m) {
    json_object_set_new(v, "state", json_string(m->state ? m->state : "unloaded"));
    if (m->failed_loads > 0) {
        json_object_set_new(v, "failed_loads", json_integer(m->failed_loads));
        json_object_set_new(v, "retry_in_s", json_real((double)(int)(m->retry_in_s * 10) / 10));
    }
}

/* A keep-alive in seconds as Ollama writes it: -1 forever, 0 released after its requests. */
static json_t *keep_json(int64_t ms) {
    if (ms == ATLAS_KEEP_ALIVE_FOREVER) return json_integer(-1);
    if (ms == ATLAS_KEEP_ALIVE_NONE) return json_integer(0);
    return json_real((double)ms / 1e3);
}

/* What the model is served with (its own settings, the flags' filled in), and its
 * keep-alive now: the last request's, and while it waits idle, the seconds left. */
static json_t *settings_json(const atlas_engine_model_status *m) {
    json_t *v = json_pack("{s:i, s:i, s:I, s:I, s:s, s:i, s:b}", "ctx_size", m->ctx_size,
                          "parallel", m->parallel, "kv_tokens", (json_int_t)m->kv_tokens,
                          "kv_memory", (json_int_t)m->kv_bytes, "kv_dtype", m->kv_dtype,
                          "batch_tokens", m->batch_tokens, "pinned", m->pinned);
    if (!v) return NULL;
    json_object_set_new(v, "keep_alive", keep_json(m->keep_alive_ms));
    json_object_set_new(v, "keep_alive_now", keep_json(m->keep_alive_now_ms));
    if (m->expires_in_s >= 0)
        json_object_set_new(v, "expires_in_s", json_real(round(m->expires_in_s * 10) / 10));
    /* whose template and which tool-call format; the template's path is the server's, so it
     * is not shown */
    json_object_set_new(v, "chat_template", json_string(m->chat_template ? "operator" : "model"));
    json_object_set_new(v, "tool_call_format", json_string(m->tool_call_format &&
                                                           *m->tool_call_format
                                                               ? m->tool_call_format : "auto"));
    return v;
}

/* Strings from the engine are written through atlas_json_text: a name keeps the engine's
 * rule (UTF-8), but a directory need not be UTF-8, and json_pack would fail on it.  NULL
 * only when out of memory. */
static json_t *model_json(atlas_server *s, const atlas_engine_model_status *m) {
    int ctx = 0;
    if (atlas_engine_ctx_size(s->engine, m->name, &ctx) != ATLAS_OK) ctx = 0;
    json_t *v = json_pack("{s:o, s:s, s:I, s:s, s:o, s:b, s:i, s:i}", "id",
                          atlas_json_text(m->name, strlen(m->name)), "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "atlas", "root",
                          atlas_json_text(m->dir, strlen(m->dir)), "resident", m->resident,
                          "running", m->running, "waiting", m->waiting);
    if (v && ctx > 0) json_object_set_new(v, "max_model_len", json_integer(ctx));
    if (v && m->last_error[0])
        json_object_set_new(v, "last_error", atlas_json_text(m->last_error, strlen(m->last_error)));
    if (v) model_state_json(v, m);
    if (v) { /* what it takes: resident now, and when resident (estimated before a load) */
        json_object_set_new(v, "resident_bytes", json_integer((json_int_t)m->resident_bytes));
        json_object_set_new(v, "memory_bytes", json_integer((json_int_t)m->memory_bytes));
        if (m->last_load_s > 0)
            json_object_set_new(v, "last_load_s", json_real(round(m->last_load_s * 1e3) / 1e3));
    }
    if (v) json_object_set_new(v, "settings", settings_json(m));
    return v;
}

/* Every model or none: a list that silently lacks one would be read as the server not
 * serving it. */
void atlas_api_models(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)body, (void)arg;
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(server_of(call)->engine, ms, MAX_MODELS);
    json_t *data = json_array();
    for (int i = 0; data && i < n && i < MAX_MODELS; i++)
        if (json_array_append_new(data, model_json(server_of(call), &ms[i])) != 0)
            json_decref(data), data = NULL;
    if (!data) {
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOMEM, NULL,
                              "/v1/models: out of memory");
        return;
    }
    atlas_http_reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static bool find_model(atlas_http_call *call, const char *name, atlas_engine_model_status *out,
                       atlas_http_reply *r) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(server_of(call)->engine, ms, MAX_MODELS);
    for (int i = 0; i < n && i < MAX_MODELS; i++)
        if (!strcmp(ms[i].name, name)) {
            *out = ms[i];
            return true;
        }
    char msg[300];
    snprintf(msg, sizeof msg, "the model '%.200s' does not exist", name);
    atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOT_FOUND, "model", msg);
    return false;
}

void atlas_api_model_get(atlas_http_call *call, json_t *body, const char *arg,
                         atlas_http_reply *r) {
    (void)body;
    atlas_engine_model_status m;
    if (find_model(call, arg, &m, r))
        atlas_http_reply_json(r, 200, model_json(server_of(call), &m));
}

static void load_or_unload(atlas_http_call *call, const char *name, bool load,
                           atlas_http_reply *r) {
    atlas_engine_model_status m;
    if (!find_model(call, name, &m, r)) return;
    double t0 = atlas_http_now();
    atlas_status st = load ? atlas_engine_load(server_of(call)->engine, m.name)
                           : atlas_engine_unload(server_of(call)->engine, m.name);
    if (st == ATLAS_ERR_BUSY && !load) { /* not the queue: requests still run on it */
        atlas_api_error_reply(r, ATLAS_API_ERR_MODEL_BUSY, st, NULL, atlas_last_error());
        return;
    }
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, NULL);
        return;
    }
    double dt = atlas_http_now() - t0;
    if (!find_model(call, name, &m, r)) return;
    json_t *v = model_json(server_of(call), &m);
    json_object_set_new(v, load ? "load_s" : "unload_s", json_real(dt));
    atlas_http_reply_json(r, 200, v);
}

void atlas_api_model_load(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r) {
    (void)body;
    load_or_unload(call, arg, true, r);
}

void atlas_api_model_unload(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r) {
    (void)body;
    load_or_unload(call, arg, false, r);
}

void atlas_api_health(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)body, (void)arg;
    atlas_engine_metrics em;
    atlas_engine_get_metrics(server_of(call)->engine, &em);
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(server_of(call)->engine, ms, MAX_MODELS);
    /* each model's state; "degraded" (still 200: the server serves the others) while one's
     * last load failed */
    json_t *states = json_array();
    bool failed = false;
    for (int i = 0; i < n && i < MAX_MODELS; i++) {
        json_t *v = json_pack("{s:o, s:i, s:i}", "id",
                              atlas_json_text(ms[i].name, strlen(ms[i].name)), "running",
                              ms[i].running, "waiting", ms[i].waiting);
        if (!v) break; /* out of memory: said below, never a model left out */
        model_state_json(v, &ms[i]);
        if (ms[i].last_error[0] && ms[i].failed_loads > 0)
            json_object_set_new(v, "last_error",
                                atlas_json_text(ms[i].last_error, strlen(ms[i].last_error)));
        failed |= ms[i].failed_loads > 0;
        if (json_array_append_new(states, v) != 0) break;
    }
    if (!states || (int)json_array_size(states) < (n < MAX_MODELS ? n : MAX_MODELS)) {
        json_decref(states);
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOMEM, NULL,
                              "/health: out of memory");
        return;
    }
    json_t *v = json_pack("{s:s, s:i, s:i, s:i, s:i, s:o}", "status",
                          em.device_lost ? "error" : failed ? "degraded" : "ok", "models", n,
                          "resident", em.resident_models, "running", em.running, "queued",
                          em.queue_len, "model_states", states);
    /* a lost GPU context serves nothing on the GPU again: a 503 tells a supervisor's probe to
     * restart the process, and says why */
    if (v && em.device_lost)
        json_object_set_new(v, "error", atlas_json_text(em.device_error, strlen(em.device_error)));
    atlas_http_reply_json(r, em.device_lost ? 503 : 200, v);
}

/* --- /metrics ----------------------------------------------------------------------------- */

static int print_ehist(char **b, size_t *l, size_t *c, const char *name, const char *help,
                       const atlas_engine_hist *h) {
    return atlas_metrics_print_hist(b, l, c, name, help, h->bounds, h->counts,
                                    ATLAS_ENGINE_HIST_BUCKETS, h->sum, h->n);
}

/* Loads and their weights' bytes by where they read them from: the host tier, the page
 * cache (every page of the files cached before the load) or the disk. */
static int print_sources(char **b, size_t *l, size_t *c, const atlas_engine_metrics *m) {
    const char *src[3] = {"host", "page_cache", "disk"};
    uint64_t n[3] = {m->loads_host, m->loads_page_cache, m->loads_disk};
    uint64_t bytes[3] = {m->load_bytes_host, m->load_bytes_page_cache, m->load_bytes_disk};
    int rc = atlas_buf_printf(b, l, c, "# HELP atlas_model_loads_by_source_total Model loads "
                              "by where their weights were read from.\n# TYPE "
                              "atlas_model_loads_by_source_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= atlas_buf_printf(b, l, c, "atlas_model_loads_by_source_total{source=\"%s\"} "
                               "%llu\n", src[i], (unsigned long long)n[i]);
    rc |= atlas_buf_printf(b, l, c, "# HELP atlas_model_load_bytes_total Weight bytes loaded, "
                           "by where they were read from.\n# TYPE atlas_model_load_bytes_total "
                           "counter\n");
    for (int i = 0; i < 3; i++)
        rc |= atlas_buf_printf(b, l, c, "atlas_model_load_bytes_total{source=\"%s\"} %llu\n",
                               src[i], (unsigned long long)bytes[i]);
    return rc;
}

#define COUNTER(name, help, v)                                                                 \
    atlas_buf_printf(&b, &l, &c, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %llu\n", \
                     (unsigned long long)(v))
#define GAUGE(name, help, fmt, v)                                                              \
    atlas_buf_printf(&b, &l, &c, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)

static int print_engine(const atlas_engine_metrics *m, atlas_server_metrics *sm, char **bp,
                        size_t *lp, size_t *cp) {
    char *b = *bp;
    size_t l = *lp, c = *cp;
    int rc = 0;
    rc |= COUNTER("atlas_requests_submitted_total", "Requests the engine accepted.", m->requests_submitted);
    rc |= COUNTER("atlas_requests_rejected_total", "Requests refused because the queue was full.", m->requests_rejected);
    rc |= atlas_buf_printf(&b, &l, &c,
                           "# HELP atlas_requests_finished_total Finished requests by reason.\n"
                           "# TYPE atlas_requests_finished_total counter\n"
                           "atlas_requests_finished_total{reason=\"stop\"} %llu\n"
                           "atlas_requests_finished_total{reason=\"length\"} %llu\n"
                           "atlas_requests_finished_total{reason=\"cancelled\"} %llu\n"
                           "atlas_requests_finished_total{reason=\"error\"} %llu\n",
                           (unsigned long long)m->finished_stop, (unsigned long long)m->finished_length,
                           (unsigned long long)m->finished_cancelled, (unsigned long long)m->finished_error);
    rc |= COUNTER("atlas_prompt_tokens_total", "Prompt tokens prefilled.", m->prompt_tokens);
    rc |= COUNTER("atlas_generation_tokens_total", "Tokens generated.", m->generated_tokens);
    rc |= COUNTER("atlas_steps_total", "Forward passes.", m->steps);
    rc |= COUNTER("atlas_steps_ahead_total", "Forward passes queued while the one before ran (--step-ahead).", m->steps_ahead);
    rc |= COUNTER("atlas_preemptions_total", "Sequences preempted for KV blocks or paused for a swap.", m->preemptions);
    rc |= GAUGE("atlas_queue_length", "Requests waiting to start.", "%d", m->queue_len);
    rc |= GAUGE("atlas_running_sequences", "Sequences in the running batches.", "%d", m->running);
    rc |= GAUGE("atlas_batch_tokens", "Tokens in the last forward pass.", "%d", m->last_batch_tokens);
    rc |= GAUGE("atlas_kv_blocks_used", "KV cache blocks in use.", "%d", m->kv_blocks_used);
    rc |= GAUGE("atlas_kv_blocks_total", "KV cache blocks of the resident models.", "%d", m->kv_blocks_total);
    rc |= GAUGE("atlas_kv_usage_ratio", "Share of the KV cache in use.", "%.6f",
                m->kv_blocks_total ? (double)m->kv_blocks_used / m->kv_blocks_total : 0.0);
    rc |= GAUGE("atlas_resident_models", "Models loaded now.", "%d", m->resident_models);
    rc |= COUNTER("atlas_model_loads_total", "Model loads (swaps included).", m->loads);
    rc |= COUNTER("atlas_model_load_failures_total", "Model loads that failed.", m->load_failures);
    rc |= COUNTER("atlas_model_unloads_total", "Model releases.", m->unloads);
    rc |= COUNTER("atlas_model_unload_failures_total", "Model releases that failed to free something (the model is gone all the same).", m->unload_failures);
    rc |= COUNTER("atlas_model_release_refused_total", "Model releases refused while requests ran on the model (it drained first; not an error).", m->release_busy);
    rc |= GAUGE("atlas_last_swap_seconds", "From the old model's release to the new one serving.", "%.6f", m->last_swap_s);
    rc |= COUNTER("atlas_model_swaps_total", "Loads that released another model to make room.", m->swaps);
    rc |= atlas_buf_printf(&b, &l, &c, "# HELP atlas_model_swap_seconds_total Seconds spent "
                           "swapping, from the first release to the new model serving.\n# TYPE "
                           "atlas_model_swap_seconds_total counter\natlas_model_swap_seconds_total "
                           "%.6f\n", m->swap_seconds);
    rc |= COUNTER("atlas_kv_host_saved_blocks_total", "Prefix KV blocks copied to host memory at model releases.", m->kv_host_saved_blocks);
    rc |= COUNTER("atlas_kv_host_saved_bytes_total", "Bytes of prefix KV copied to host memory.", m->kv_host_saved_bytes);
    rc |= COUNTER("atlas_kv_host_restored_blocks_total", "Prefix KV blocks copied back from host memory for requests.", m->kv_host_restored_blocks);
    rc |= COUNTER("atlas_kv_host_restored_bytes_total", "Bytes of prefix KV copied back from host memory.", m->kv_host_restored_bytes);
    rc |= COUNTER("atlas_kv_host_dropped_blocks_total", "Prefix KV blocks dropped from host memory (for room, or their model came back changed).", m->kv_host_dropped_blocks);
    rc |= GAUGE("atlas_kv_host_blocks", "Prefix KV blocks held in host memory.", "%d", m->kv_host_blocks);
    rc |= GAUGE("atlas_kv_host_bytes", "Bytes of host memory the prefix KV blocks take.", "%zu", m->kv_host_bytes);
    rc |= GAUGE("atlas_kv_host_budget_bytes", "Bytes of host memory the prefix KV blocks may take now (--host-cache less the weights' host tier).", "%zu", m->kv_host_budget);
    rc |= print_sources(&b, &l, &c, m);
    rc |= GAUGE("atlas_host_tier_bytes", "Bytes of released models' weights kept in pinned host memory.", "%zu", m->host_tier_bytes);
    rc |= GAUGE("atlas_host_tier_pinned_bytes", "Pinned host memory the weights' host tier holds, free chunks included.", "%zu", m->host_tier_pinned);
    rc |= GAUGE("atlas_host_tier_models", "Models whose weights the host tier keeps.", "%d", m->host_tier_models);
    rc |= COUNTER("atlas_host_tier_evicted_total", "Weight images evicted from the host tier for room.", m->host_tier_evicted);
    rc |= COUNTER("atlas_device_contexts_created_total", "GPU contexts the process created: 1 once it used the GPU, for its life (no swap makes another).", m->device_contexts);
    rc |= GAUGE("atlas_device_lost", "1 once the GPU returned a sticky error (its context can run nothing more until a restart).", "%d", m->device_lost);
    rc |= GAUGE("atlas_memory_budget_bytes", "Bytes the resident models may take (0: no limit).", "%zu", m->memory_budget);
    rc |= print_ehist(&b, &l, &c, "atlas_time_to_first_token_seconds",
                      "From submit to the first generated token.", &m->ttft);
    rc |= atlas_server_metrics_print_models(sm, ATLAS_SERIES_TTFT,
                                            "atlas_time_to_first_token_seconds", &b, &l, &c);
    rc |= print_ehist(&b, &l, &c, "atlas_inter_token_latency_seconds",
                      "Between consecutive tokens of a sequence.", &m->itl);
    rc |= atlas_server_metrics_print_models(sm, ATLAS_SERIES_ITL,
                                            "atlas_inter_token_latency_seconds", &b, &l, &c);
    rc |= print_ehist(&b, &l, &c, "atlas_swap_duration_seconds", "Each model swap or load.",
                      &m->swap);
    *bp = b, *lp = l, *cp = c;
    return rc;
}

/* Per model: its context and its KV pool's capacity in tokens.  The model's name is a label
 * value: a directory's name under --models-dir may hold a quote, a backslash or bytes that
 * are not UTF-8, so it goes out escaped. */
static int print_models(atlas_engine *engine, char **bp, size_t *lp, size_t *cp) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS), rc = 0;
    rc |= atlas_buf_printf(bp, lp, cp, "# HELP atlas_model_kv_capacity_tokens Tokens the "
                           "model's KV pool holds.\n# TYPE atlas_model_kv_capacity_tokens gauge\n");
    for (int i = 0; i < n && i < MAX_MODELS; i++) {
        rc |= atlas_buf_printf(bp, lp, cp, "atlas_model_kv_capacity_tokens{model=\"");
        rc |= atlas_metrics_print_label(bp, lp, cp, ms[i].name);
        rc |= atlas_buf_printf(bp, lp, cp, "\"} %ld\n", ms[i].kv_tokens);
    }
    rc |= atlas_buf_printf(bp, lp, cp, "# HELP atlas_model_context_tokens Tokens a sequence of "
                           "the model may hold.\n# TYPE atlas_model_context_tokens gauge\n");
    for (int i = 0; i < n && i < MAX_MODELS; i++) {
        rc |= atlas_buf_printf(bp, lp, cp, "atlas_model_context_tokens{model=\"");
        rc |= atlas_metrics_print_label(bp, lp, cp, ms[i].name);
        rc |= atlas_buf_printf(bp, lp, cp, "\"} %d\n", ms[i].ctx_size);
    }
    return rc;
}

/* `NAME{model_name="MODEL"} ` (the value follows). */
static int model_sample(char **b, size_t *l, size_t *c, const char *name, const char *model) {
    int rc = atlas_buf_printf(b, l, c, "%s{model_name=\"", name);
    rc |= atlas_metrics_print_label(b, l, c, model);
    return rc | atlas_buf_printf(b, l, c, "\"} ");
}

static double waiting_of(const atlas_engine_model_status *m) { return m->waiting; }
static double running_of(const atlas_engine_model_status *m) { return m->running; }
static double usage_of(const atlas_engine_model_status *m) {
    return m->kv_blocks ? (double)m->kv_blocks_used / m->kv_blocks : 0.0;
}

/* One gauge family: HELP, TYPE, the unlabelled total, then each model's value (fmt prints
 * one double: "%.0f" for counts). */
static int gauge(char **b, size_t *l, size_t *c, const char *name, const char *help,
                 const char *fmt, double total, const atlas_engine_model_status *ms, int n,
                 double (*value)(const atlas_engine_model_status *)) {
    int rc = atlas_buf_printf(b, l, c, "# HELP %s %s\n# TYPE %s gauge\n%s ", name, help, name,
                              name);
    rc |= atlas_buf_printf(b, l, c, fmt, total);
    for (int i = 0; i < n; i++) {
        rc |= model_sample(b, l, c, name, ms[i].name);
        rc |= atlas_buf_printf(b, l, c, fmt, value(&ms[i]));
    }
    return rc;
}

/* What a gateway's model-server protocol reads (the Gateway API Inference Extension): queued
 * and running requests, the KV cache's use as a fraction, and its geometry; the totals
 * unlabelled, then each model labelled model_name. */
static int print_gateway(atlas_engine *engine, const atlas_engine_metrics *em, char **b,
                         size_t *l, size_t *c) {
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS), rc = 0;
    if (n > MAX_MODELS) n = MAX_MODELS;
    rc |= gauge(b, l, c, "atlas_num_requests_waiting", "Requests waiting to start.", "%.0f\n",
                em->queue_len, ms, n, waiting_of);
    rc |= gauge(b, l, c, "atlas_num_requests_running", "Sequences running.", "%.0f\n",
                em->running, ms, n, running_of);
    rc |= gauge(b, l, c, "atlas_kv_cache_usage_perc", "KV cache blocks in use, 0 to 1.",
                "%.6f\n",
                em->kv_blocks_total ? (double)em->kv_blocks_used / em->kv_blocks_total : 0.0,
                ms, n, usage_of);
    /* an info metric: the geometry is in the labels, the value is always 1 */
    long blocks = 0;
    for (int i = 0; i < n; i++) blocks += ms[i].kv_blocks;
    rc |= atlas_buf_printf(b, l, c, "# HELP atlas_cache_config_info The KV cache's geometry.\n"
                           "# TYPE atlas_cache_config_info gauge\n"
                           "atlas_cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%ld\"} 1\n",
                           n ? ms[0].kv_block_size : 0, blocks);
    for (int i = 0; i < n; i++) {
        rc |= atlas_buf_printf(b, l, c, "atlas_cache_config_info{model_name=\"");
        rc |= atlas_metrics_print_label(b, l, c, ms[i].name);
        /* cache_dtype: vLLM's label ("auto" there for the model's type; here what it is) */
        rc |= atlas_buf_printf(b, l, c, "\",block_size=\"%d\",num_gpu_blocks=\"%d\","
                               "cache_dtype=\"%s\"} 1\n", ms[i].kv_block_size, ms[i].kv_blocks,
                               ms[i].kv_dtype);
    }
    return rc;
}

/* Each model's residency: its state, one series a state with 1 on the one it is in (as
 * an enum is exported), the bytes it holds resident, and its last load's seconds. */
static int print_residency(atlas_engine *engine, char **b, size_t *l, size_t *c) {
    static const char *const states[] = {"resident", "draining", "loading", "unloaded",
                                         "failed"};
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(engine, ms, MAX_MODELS), rc = 0;
    if (n > MAX_MODELS) n = MAX_MODELS;
    rc |= atlas_buf_printf(b, l, c, "# HELP atlas_model_state The model's residency state "
                           "(1: the one it is in).\n# TYPE atlas_model_state gauge\n");
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof states / sizeof states[0]; k++) {
            rc |= atlas_buf_printf(b, l, c, "atlas_model_state{model_name=\"");
            rc |= atlas_metrics_print_label(b, l, c, ms[i].name);
            rc |= atlas_buf_printf(b, l, c, "\",state=\"%s\"} %d\n", states[k],
                                   !strcmp(ms[i].state, states[k]));
        }
    rc |= atlas_buf_printf(b, l, c, "# HELP atlas_model_resident_bytes Weights and KV pool "
                           "the model holds resident.\n# TYPE atlas_model_resident_bytes gauge\n");
    for (int i = 0; i < n; i++) {
        rc |= model_sample(b, l, c, "atlas_model_resident_bytes", ms[i].name);
        rc |= atlas_buf_printf(b, l, c, "%zu\n", ms[i].resident_bytes);
    }
    rc |= atlas_buf_printf(b, l, c, "# HELP atlas_model_last_load_seconds The model's last "
                           "load.\n# TYPE atlas_model_last_load_seconds gauge\n");
    for (int i = 0; i < n; i++) {
        rc |= model_sample(b, l, c, "atlas_model_last_load_seconds", ms[i].name);
        rc |= atlas_buf_printf(b, l, c, "%.6f\n", ms[i].last_load_s);
    }
    return rc;
}

void atlas_api_metrics(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)body, (void)arg;
    atlas_engine_metrics em;
    atlas_engine_get_metrics(server_of(call)->engine, &em);
    char *b = NULL;
    size_t l = 0, c = 0;
    int rc = print_engine(&em, &server_of(call)->metrics, &b, &l, &c);
    rc |= print_models(server_of(call)->engine, &b, &l, &c);
    rc |= print_gateway(server_of(call)->engine, &em, &b, &l, &c);
    rc |= print_residency(server_of(call)->engine, &b, &l, &c);
    rc |= atlas_server_metrics_print(&server_of(call)->metrics, &b, &l, &c);
    if (rc) {
        free(b);
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    atlas_http_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b, l);
}

/* --- tokenize, detokenize, apply-template -------------------------------------------------- */

void atlas_api_tokenize(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    const char *param = NULL, *model, *text = NULL;
    const atlas_tokenizer *tok;
    char *rendered = NULL;
    size_t *cuts = NULL, n_cuts = 0; /* where the rendered chat's pieces meet */
    int32_t *ids = NULL;
    size_t n = 0;
    bool chat = json_object_get(body, "messages") != NULL, strs = false;
    bool add_special = !chat; /* vLLM's defaults: on for text, off for rendered chats */
    atlas_status st = atlas_api_model(s, body, NULL, &model, &param);
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(s->engine, model, &tok);
    if (st == ATLAS_OK) st = atlas_param_bool(body, "add_special_tokens", &add_special, &param);
    if (st == ATLAS_OK) st = atlas_param_bool(body, "return_token_strs", &strs, &param);
    bool split = false; /* a prompt's special tokens' spellings as text */
    if (st == ATLAS_OK) st = atlas_param_bool(body, "split_special_tokens", &split, &param);
    if (st == ATLAS_OK && chat) {
        st = atlas_api_render_chat(s, model, body, true, &rendered, &cuts, &n_cuts, NULL, NULL,
                                   &param);
        text = rendered;
    } else if (st == ATLAS_OK) {
        st = atlas_param_string(body, "prompt", &text, &param);
        if (st == ATLAS_OK && !text) {
            param = "prompt";
            st = atlas_fail(ATLAS_ERR_INVALID, "'prompt' (a string) or 'messages' is required");
        }
    }
    if (st == ATLAS_OK && chat)
        st = atlas_shield_encode_pieces(tok, text, strlen(text), cuts, n_cuts, add_special,
                                        &ids, &n);
    else if (st == ATLAS_OK) {
        atlas_text_range all = {0, strlen(text)};
        st = atlas_tokenizer_encode_ranges(tok, text, all.end, add_special, &all, split ? 1 : 0,
                                           &ids, &n);
    }
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, param);
    } else {
        int ctx = 0;
        atlas_engine_ctx_size(s->engine, model, &ctx);
        json_t *arr = json_array(), *sa = strs ? json_array() : NULL;
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(arr, json_integer(ids[i]));
            if (sa) {
                const char *b;
                size_t len;
                if (atlas_tokenizer_token_bytes(tok, ids[i], &b, &len) != ATLAS_OK) b = "", len = 0;
                json_array_append_new(sa, atlas_json_text(b, len));
            }
        }
        json_t *v = json_pack("{s:i, s:i, s:o}", "count", (int)n, "max_model_len", ctx, "tokens",
                              arr);
        if (v && sa) json_object_set_new(v, "token_strs", sa);
        atlas_http_reply_json(r, 200, v);
    }
    free(ids);
    free(rendered);
    free(cuts);
}

atlas_status atlas_api_token_ids(const json_t *arr, const atlas_tokenizer *tok, int32_t **ids,
                                 size_t *n, const char **param) {
    *ids = NULL;
    *n = 0;
    *param = "tokens";
    if (!json_is_array(arr))
        return atlas_fail(ATLAS_ERR_INVALID, "'tokens' must be an array of token ids");
    size_t count = json_array_size(arr);
    if (!(*ids = malloc((count ? count : 1) * sizeof **ids)))
        return atlas_fail(ATLAS_ERR_NOMEM, "detokenize: out of memory");
    size_t vocab = atlas_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < count; i++) {
        const json_t *v = json_array_get(arr, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || (size_t)id >= vocab)
            return atlas_fail(ATLAS_ERR_INVALID, "'tokens[%zu]' must be a token id in 0..%zu", i,
                              vocab - 1);
        (*ids)[i] = (int32_t)id;
    }
    *n = count;
    *param = NULL;
    return ATLAS_OK;
}

void atlas_api_detokenize(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    const char *param = NULL, *model;
    const atlas_tokenizer *tok;
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0, n = 0;
    atlas_status st = atlas_api_model(s, body, NULL, &model, &param);
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(s->engine, model, &tok);
    if (st == ATLAS_OK) st = atlas_api_token_ids(json_object_get(body, "tokens"), tok, &ids, &n,
                                                 &param);
    if (st == ATLAS_OK) st = atlas_tokenizer_decode(tok, ids, n, false, &text, &len);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else atlas_http_reply_json(r, 200, json_pack("{s:o}", "prompt", atlas_json_text(text, len)));
    free(text);
    free(ids);
}

void atlas_api_apply_template(atlas_http_call *call, json_t *body, const char *arg,
                              atlas_http_reply *r) {
    (void)arg;
    const char *param = NULL, *model;
    char *prompt = NULL, *text = NULL;
    size_t len = 0;
    const atlas_tokenizer *tok = NULL;
    atlas_status st = atlas_api_model(call->ctx, body, NULL, &model, &param);
    if (st == ATLAS_OK)
        st = atlas_api_render_chat(call->ctx, model, body, true, &prompt, NULL, NULL, NULL, NULL,
                                   &param);
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(server_of(call)->engine, model, &tok);
    if (st == ATLAS_OK) st = atlas_shield_text(tok, prompt, strlen(prompt), &text, &len);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else atlas_http_reply_json(r, 200, json_pack("{s:o}", "prompt", atlas_json_text(text, len)));
    free(prompt);
    free(text);
}
