/* server/ollama_models.c — Ollama's routes about models and the server: /api/tags (every
 * served model), /api/ps (the resident ones), /api/show, /api/version, GET / ("Ollama is
 * running"), names with Ollama's ":latest" tag, and errors in Ollama's {"error": "..."}. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "atlas/engine.h"
#include "atlas/harmony.h"
#include "atlas/reasoning.h"
#include "atlas/template.h"
#include "atlas/toolcall.h"
#include "atlas/version.h"
#include "server/api.h"
#include "server/embed.h"
#include "server/errors.h"
#include "server/ollama.h"

enum { MAX_MODELS = 64 };

atlas_status atlas_ollama_model(atlas_server *s, const char *want, const char **name) {
    const char *param = NULL;
    atlas_status st = atlas_api_model(s, NULL, want, name, &param);
    static const char tag[] = ":latest";
    size_t n = strlen(want), t = sizeof tag - 1;
    if (st == ATLAS_ERR_NOT_FOUND && n > t && !strcmp(want + n - t, tag)) {
        char bare[512];
        if (n - t < sizeof bare) {
            memcpy(bare, want, n - t);
            bare[n - t] = '\0';
            st = atlas_api_model(s, NULL, bare, name, &param);
        }
    }
    if (st == ATLAS_ERR_NOT_FOUND)
        return atlas_fail(ATLAS_ERR_NOT_FOUND, "model '%.200s' not found", want);
    return st;
}

/* --- what Ollama says of a model -------------------------------------------------------- */

/* The family Ollama names from config.json's architecture: "Qwen3ForCausalLM" -> "qwen3". */
static void family_of(const char *arch, char *out, size_t cap) {
    size_t n = 0;
    const char *end = strstr(arch, "For");
    size_t len = end ? (size_t)(end - arch) : strlen(arch);
    for (; n < len && n + 1 < cap; n++)
        out[n] = (char)(arch[n] >= 'A' && arch[n] <= 'Z' ? arch[n] - 'A' + 'a' : arch[n]);
    out[n] = '\0';
}

/* "494.03M", "8.0B": the parameter count as Ollama writes it ("" when not known). */
static void param_size(int64_t n, char out[32]) {
    if (n <= 0) out[0] = '\0';
    else if (n >= 1000000000) snprintf(out, 32, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000) snprintf(out, 32, "%.2fM", (double)n / 1e6);
    else snprintf(out, 32, "%.2fK", (double)n / 1e3);
}

/* The bytes of the model's weight files (*.safetensors in its directory). */
static json_int_t weight_file_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    json_int_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!stat(path, &st)) sum += (json_int_t)st.st_size;
    }
    closedir(d);
    return sum;
}

static void iso_time(time_t t, char out[32]) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* When the model's config.json last changed (Ollama's "modified_at"). */
static void modified_at(const char *dir, char out[32]) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    iso_time(stat(path, &st) ? 0 : st.st_mtime, out);
}

/* Ollama's "digest" names a model's manifest; atlas has none, so it names the directory: 64
 * hex digits of FNV-1a over its path (stable, not a hash of the files). */
static void digest_of(const char *dir, char out[65]) {
    for (int k = 0; k < 4; k++) {
        uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)k * 0x9E3779B97F4A7C15ull;
        for (const unsigned char *p = (const unsigned char *)dir; *p; p++)
            h = (h ^ *p) * 0x100000001b3ull;
        snprintf(out + 16 * k, 17, "%016llx", (unsigned long long)h);
    }
}

/* The name Ollama's clients see: with ":latest" when the served name has no tag. */
static json_t *tagged_name(const char *name) {
    return strchr(name, ':') ? json_string(name) : json_sprintf("%s:latest", name);
}

static json_t *details_json(const atlas_engine_model_status *m) {
    char family[64], size[32];
    family_of(m->architecture, family, sizeof family);
    param_size(m->n_params, size);
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format",
                     "safetensors", "family", family, "families", family, "parameter_size",
                     size, "quantization_level", m->dtype);
}

/* One model as /api/tags lists it. */
static json_t *entry_json(const atlas_engine_model_status *m) {
    char when[32], digest[65];
    modified_at(m->dir, when);
    digest_of(m->dir, digest);
    json_t *name = tagged_name(m->name);
    return json_pack("{s:O, s:o, s:s, s:I, s:s, s:o}", "name", name, "model", name,
                     "modified_at", when, "size",
                     m->weight_bytes ? (json_int_t)m->weight_bytes : weight_file_bytes(m->dir),
                     "digest", digest, "details", details_json(m));
}

/* Every model or none: a list that silently lacks one would be read as the server not
 * serving it. */
static void reply_list(atlas_http_reply *r, json_t *list) {
    json_t *v = list ? json_pack("{s:o}", "models", list) : NULL;
    if (v) atlas_http_reply_json(r, 200, v);
    else atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOMEM, NULL,
                               "the model list: out of memory");
}

void atlas_ollama_tags(atlas_http_call *call, json_t *body, const char *arg,
                       atlas_http_reply *r) {
    (void)body, (void)arg;
    atlas_server *s = call->ctx;
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(s->engine, ms, MAX_MODELS);
    json_t *list = json_array();
    for (int i = 0; list && i < n && i < MAX_MODELS; i++)
        if (json_array_append_new(list, entry_json(&ms[i])) != 0) json_decref(list), list = NULL;
    reply_list(r, list);
}

/* The resident models.  "expires_at" is when an idle model's keep-alive runs out; a model
 * kept until a swap or an unload needs its place (or still serving) has a date far ahead,
 * as Ollama writes it for keep_alive -1. */
void atlas_ollama_ps(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)body, (void)arg;
    atlas_server *s = call->ctx;
    atlas_engine_model_status ms[MAX_MODELS];
    int n = atlas_engine_models(s->engine, ms, MAX_MODELS);
    json_t *list = json_array();
    for (int i = 0; list && i < n && i < MAX_MODELS; i++) {
        if (!ms[i].resident) continue;
        json_t *v = entry_json(&ms[i]);
        json_int_t bytes = (json_int_t)(ms[i].weight_bytes + ms[i].kv_bytes);
        json_object_set_new(v, "size", json_integer(bytes));
        json_object_set_new(v, "size_vram",
                            json_integer(strcmp(ms[i].backend, "cuda") ? 0 : bytes));
        char at[32] = "2318-01-01T00:00:00Z";
        if (ms[i].expires_in_s >= 0) iso_time(time(NULL) + (time_t)(ms[i].expires_in_s + 0.5), at);
        json_object_set_new(v, "expires_at", json_string(at));
        json_object_set_new(v, "context_length", json_integer(ms[i].ctx_size));
        if (json_array_append_new(list, v) != 0) json_decref(list), list = NULL;
    }
    reply_list(r, list);
}

/* What the model can do, as Ollama's "capabilities" says it. */
static json_t *capabilities(atlas_server *s, const atlas_engine_model_status *m,
                            const atlas_template *tmpl) {
    atlas_engine_embedding emb;
    if (atlas_engine_embedding_info(s->engine, m->name, &emb) == ATLAS_OK && emb.is_embedding)
        return json_pack("[s]", "embedding"); /* as Ollama names an embedding model */
    const char *src = tmpl ? atlas_template_source(tmpl) : NULL;
    json_t *caps = json_pack("[s]", "completion");
    atlas_toolcall_format f = src ? atlas_toolcall_format_detect(src, m->architecture)
                                  : ATLAS_TOOLCALL_NONE;
    if (m->tool_call_format) atlas_toolcall_format_parse(m->tool_call_format, &f);
    if (f != ATLAS_TOOLCALL_NONE)
        json_array_append_new(caps, json_string("tools"));
    if (src && (atlas_reasoning_template_thinks(src) || atlas_harmony_template(src)))
        json_array_append_new(caps, json_string("thinking"));
    return caps;
}

void atlas_ollama_show(atlas_http_call *call, json_t *body, const char *arg,
                       atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    const char *want = NULL, *name = NULL, *param = NULL;
    atlas_status st = atlas_param_string(body, "model", &want, &param);
    if (st == ATLAS_OK && !want) st = atlas_param_string(body, "name", &want, &param);
    if (st == ATLAS_OK && !want) st = atlas_fail(ATLAS_ERR_INVALID, "'model' is required");
    if (st == ATLAS_OK) st = atlas_ollama_model(s, want, &name);
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, "model");
        return;
    }
    atlas_engine_model_status ms[MAX_MODELS], *m = NULL;
    int n = atlas_engine_models(s->engine, ms, MAX_MODELS);
    for (int i = 0; i < n && i < MAX_MODELS && !m; i++)
        if (!strcmp(ms[i].name, name)) m = &ms[i];
    if (!m) { /* past the first MAX_MODELS */
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_NOT_FOUND, "model",
                              "model not listed: the server serves too many to show it");
        return;
    }
    const atlas_template *tmpl = NULL; /* none: a model for raw prompts only */
    if (atlas_engine_template(s->engine, name, &tmpl) != ATLAS_OK) tmpl = NULL;
    int ctx = 0;
    if (atlas_engine_ctx_size(s->engine, name, &ctx) != ATLAS_OK) ctx = 0;
    char family[64], when[32], key[96];
    family_of(m->architecture, family, sizeof family);
    modified_at(m->dir, when);
    snprintf(key, sizeof key, "%s.context_length", family);
    json_t *info = json_pack("{s:s, s:i}", "general.architecture", family, key, ctx);
    if (m->n_params > 0)
        json_object_set_new(info, "general.parameter_count", json_integer(m->n_params));
    char *mf = NULL; /* the directory need not be UTF-8: through atlas_json_text */
    if (asprintf(&mf, "# served by atlas from %s\nFROM %s\n", m->dir, m->dir) < 0) mf = NULL;
    json_t *v = json_pack("{s:o, s:s, s:s, s:o, s:o, s:o, s:s}", "modelfile",
                          mf ? atlas_json_text(mf, strlen(mf)) : NULL,
                          "parameters", "", "template", tmpl ? atlas_template_source(tmpl) : "",
                          "details", details_json(m), "model_info", info, "capabilities",
                          capabilities(s, m, tmpl), "modified_at", when);
    free(mf);
    atlas_http_reply_json(r, 200, v);
}

void atlas_ollama_version(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r) {
    (void)call, (void)body, (void)arg;
    atlas_http_reply_json(r, 200, json_pack("{s:s, s:s}", "version", ATLAS_OLLAMA_VERSION,
                                            "atlas", ATLAS_VERSION_STRING));
}

/* What Ollama answers at its root, which its clients probe to find a server. */
void atlas_ollama_root(atlas_http_call *call, json_t *body, const char *arg,
                       atlas_http_reply *r) {
    (void)call, (void)body, (void)arg;
    char *text = strdup("Ollama is running");
    atlas_http_reply_text(r, 200, "text/plain; charset=utf-8", text, text ? strlen(text) : 0);
}

/* POST /api/embed ({"model", "input", "truncate", "dimensions", "keep_alive", "options"}:
 * {"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}) and the
 * older /api/embeddings ({"model", "prompt"}: {"embedding"}), on embed.h's request model.
 * Ollama cuts an input longer than the context unless "truncate" is false. */
void atlas_ollama_embed(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    bool legacy = !strcmp(call->url, "/api/embeddings");
    const char *want = NULL, *param = NULL;
    atlas_embed_req q = {.truncate = true};
    float *vecs = NULL;
    long tokens = 0;
    atlas_embed_end end = ATLAS_EMBED_DONE;
    atlas_status st = atlas_param_string(body, "model", &want, &param);
    if (st == ATLAS_OK && !want) {
        param = "model";
        st = atlas_fail(ATLAS_ERR_INVALID, "'model' is required");
    }
    if (st == ATLAS_OK) st = atlas_ollama_model(s, want, &q.model);
    if (st == ATLAS_OK) st = atlas_param_bool(body, "truncate", &q.truncate, &param);
    if (st == ATLAS_OK) st = atlas_param_keep_alive(body, &q.keep_alive_ms, &param);
    if (st == ATLAS_OK && !legacy) st = atlas_embed_dimensions(s, body, &q, &param);
    else if (st == ATLAS_OK) st = atlas_embed_dimensions(s, NULL, &q, &param);
    if (st == ATLAS_OK && legacy && !json_is_string(json_object_get(body, "prompt"))) {
        param = "prompt";
        st = atlas_fail(ATLAS_ERR_INVALID, "'prompt' must be a string");
    }
    if (st == ATLAS_OK)
        st = atlas_embed_inputs(s, body, legacy ? "prompt" : "input", &q, &param);
    if (st == ATLAS_OK) st = atlas_embed_run(s, call, &q, &vecs, &tokens, &end, &param);
    call->log.tokens_in = tokens;
    json_t *v = NULL;
    if (vecs && legacy) {
        v = json_pack("{s:o}", "embedding", atlas_embed_floats(vecs, q.dims));
    } else if (vecs) {
        json_t *all = json_array();
        for (int i = 0; all && i < q.count; i++)
            if (json_array_append_new(all, atlas_embed_floats(vecs + (size_t)i * q.dims, q.dims)))
                json_decref(all), all = NULL;
        json_int_t ns = (json_int_t)((atlas_http_now() - call->t_start) * 1e9);
        v = json_pack("{s:s,s:o,s:I,s:I,s:I}", "model", q.model, "embeddings", all,
                      "total_duration", ns, "load_duration", (json_int_t)0,
                      "prompt_eval_count", (json_int_t)tokens);
    }
    if (v) atlas_http_reply_json(r, 200, v);
    else if (vecs) atlas_api_error_fail(r, atlas_fail(ATLAS_ERR_NOMEM, "out of memory"), NULL);
    else atlas_embed_fail(r, st, end, param);
    free(vecs);
    atlas_embed_req_free(&q);
}

/* --- errors ------------------------------------------------------------------------------- */

void atlas_ollama_error_reshape(atlas_http_reply *r) {
    if (r->status < 400 || !r->body || r->stream.read) return;
    json_t *v = json_loadb(r->body, r->len, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    if (msg) {
        int status = r->status, retry = r->retry_after;
        free(r->body);
        r->body = NULL;
        atlas_http_reply_json(r, status, json_pack("{s:s}", "error", msg));
        r->retry_after = retry;
    }
    json_decref(v);
}
