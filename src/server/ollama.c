/* server/ollama.c — POST /api/chat and /api/generate: Ollama's request translated into the
 * OpenAI-shaped body that the chat and completion routes run (api.c: the chat template, the
 * shield, tool calls, reasoning, constraints), and the generation written back as Ollama
 * writes it, a JSON object or NDJSON lines, through a gen dialect (gen.h). */
#include "server/ollama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atlas/engine.h"
#include "atlas/harmony.h"
#include "atlas/reasoning.h"
#include "atlas/shield.h"
#include "atlas/template.h"
#include "server/api.h"
#include "server/errors.h"
#include "server/gen_internal.h"

/* --- the answer: Ollama's objects and NDJSON lines ---------------------------------------- */

static const atlas_gen_dialect chat_dialect, generate_dialect;

/* Now as Ollama writes "created_at": RFC 3339 in UTC, to the nanosecond. */
static void time_now(char out[48]) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 48, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 48 - n, ".%09ldZ", ts.tv_nsec);
}

/* OpenAI's tool calls (arguments in a JSON string) as Ollama's: the arguments an object. */
static json_t *ollama_calls(const json_t *calls) {
    json_t *out = json_array();
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const json_t *a = json_object_get(fn, "arguments");
        json_t *args = json_is_string(a) ? json_loadb(json_string_value(a), json_string_length(a),
                                                      JSON_DECODE_ANY, NULL)
                                         : NULL;
        if (!json_is_object(args)) { /* not an object: pass the text on rather than lose it */
            json_decref(args);
            args = json_deep_copy(a);
        }
        json_array_append_new(
            out, json_pack("{s:O*, s:{s:O*, s:O*, s:o*}}", "id", json_object_get(c, "id"),
                           "function", "index", json_object_get(c, "index"), "name",
                           json_object_get(fn, "name"), "arguments", args));
    }
    return out;
}

/* The model, the time, and what the text says: /api/generate's "response" and "thinking",
 * /api/chat's "message". */
static json_t *ollama_object(const atlas_gen *g, const char *reasoning, size_t rn,
                             const char *text, size_t tn, const json_t *calls) {
    char t[48];
    time_now(t);
    json_t *v = json_pack("{s:s, s:s}", "model", g->model, "created_at", t);
    if (!v) return NULL;
    json_t *into = v;
    if (g->o.dialect == &generate_dialect) {
        json_object_set_new(v, "response", atlas_json_text(text, tn));
    } else {
        into = json_pack("{s:s, s:o}", "role", "assistant", "content", atlas_json_text(text, tn));
        json_object_set_new(v, "message", into);
        if (json_array_size(calls)) json_object_set_new(into, "tool_calls", ollama_calls(calls));
    }
    if (rn) json_object_set_new(into, "thinking", atlas_json_text(reasoning, rn));
    json_object_set_new(v, "done", json_false());
    return v;
}

static json_int_t ns(double s) { return (json_int_t)(s > 0 ? s * 1e9 : 0); }

/* The final object's fields: why it ended, the token counts and the durations in
 * nanoseconds.  The load of a model that was not resident counts in prompt_eval_duration
 * (the engine loads it on the request's way in), so load_duration is 0. */
static json_t *ollama_done(atlas_gen *g, json_t *v) {
    if (!v) return NULL;
    double now = atlas_http_now();
    pthread_mutex_lock(&g->mu);
    double first = g->t_first > 0 ? g->t_first : now;
    pthread_mutex_unlock(&g->mu);
    json_object_set_new(v, "done", json_true());
    json_object_set_new(v, "done_reason",
                        json_string(g->finish == ATLAS_FINISH_LENGTH ? "length" : "stop"));
    json_object_set_new(v, "total_duration", json_integer(ns(now - g->t_start)));
    json_object_set_new(v, "load_duration", json_integer(0));
    json_object_set_new(v, "prompt_eval_count", json_integer(g->usage.prompt_tokens));
    json_object_set_new(v, "prompt_eval_duration", json_integer(ns(first - g->t_start)));
    json_object_set_new(v, "eval_count", json_integer(g->usage.completion_tokens));
    json_object_set_new(v, "eval_duration", json_integer(ns(now - first)));
    return v;
}

static atlas_status write_line(atlas_gen *g, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "NDJSON line: out of memory");
    size_t n = strlen(s);
    s[n] = '\n'; /* the NUL becomes the line's end */
    atlas_status st = atlas_gen_write(g, s, n + 1);
    free(s);
    return st;
}

static atlas_status ollama_piece(atlas_gen *g, const atlas_gen_piece *p) {
    return write_line(g, ollama_object(g, p->reasoning, p->reasoning_len, p->text, p->text_len,
                                       p->calls));
}

static atlas_status ollama_end(atlas_gen *g) {
    return write_line(g, ollama_done(g, ollama_object(g, "", 0, "", 0, NULL)));
}

static atlas_status ollama_stream_error(atlas_gen *g, atlas_http_reply *err, const char *why) {
    (void)err;
    return write_line(g, json_pack("{s:o}", "error", atlas_json_text(why, strlen(why))));
}

static json_t *ollama_response(atlas_gen *g) {
    return ollama_done(g, ollama_object(g, g->reasoning ? g->reasoning : "", g->reasoning_len,
                                        g->text ? g->text : "", g->text_len, g->calls));
}

static const atlas_gen_dialect chat_dialect = {.stream_type = "application/x-ndjson",
                                               .piece = ollama_piece,
                                               .end = ollama_end,
                                               .error = ollama_stream_error,
                                               .response = ollama_response};
static const atlas_gen_dialect generate_dialect = {.stream_type = "application/x-ndjson",
                                                   .piece = ollama_piece,
                                                   .end = ollama_end,
                                                   .error = ollama_stream_error,
                                                   .response = ollama_response};

/* --- the request: Ollama's fields into an OpenAI-shaped body ------------------------------- */

/* What a request asks besides the OpenAI body. */
typedef struct ollama_req {
    json_t *oa;          /* the OpenAI-shaped body */
    const char *model;   /* the served model's name */
    bool stream;         /* Ollama's default: true */
    int64_t keep_ms;     /* keep_alive (atlas_request.keep_alive_ms); 0: the model's */
    bool unload;         /* keep_alive 0: release the model once the request ends */
    bool load_only;      /* no prompt or messages: load (or, with keep_alive 0, unload) */
    int64_t num_ctx;     /* 0: the model's context */
} ollama_req;

/* Options atlas maps onto its sampler: Ollama's name, the OpenAI field, the range. */
static const struct {
    const char *name, *field;
    double lo, hi;
    bool integer;
} sampling[] = {
    {"temperature", "temperature", 0, 2, false},
    {"top_p", "top_p", 0, 1, false},
    {"top_k", "top_k", -1, 2147483647.0, true},
    {"min_p", "min_p", 0, 1, false},
    {"seed", "seed", -9.2e18, 9.2e18, true},
    {"repeat_penalty", "repetition_penalty", 0.01, 10, false},
    {"presence_penalty", "presence_penalty", -2, 2, false},
    {"frequency_penalty", "frequency_penalty", -2, 2, false},
};

/* Options about how Ollama runs a model (threads, GPU layers, memory mapping): atlas decides
 * those by its own flags, and none changes what is generated, so they are taken and left. */
static const char *const runtime_options[] = {
    "num_keep", "num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock", "num_thread",
    "numa",     "low_vram",  "f16_kv",  "vocab_only", "logits_all", "mirostat_tau", "mirostat_eta",
};

/* Options of samplers atlas does not have: their neutral value is taken, another refused. */
static const struct {
    const char *name;
    double neutral;
} neutral_options[] = {{"mirostat", 0}, {"typical_p", 1}, {"tfs_z", 1},
                       {"penalize_newline", 0}, {"repeat_last_n", -1}};

static atlas_status set_field(json_t *oa, const char *key, json_t *v) {
    if (!v || json_object_set_new(oa, key, v))
        return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    return ATLAS_OK;
}

static atlas_status copy_sampling(const json_t *opts, json_t *oa, const char **param) {
    for (size_t i = 0; i < sizeof sampling / sizeof sampling[0]; i++) {
        bool has = false;
        if (sampling[i].integer) {
            int64_t x = 0;
            ATLAS_TRY(atlas_param_int(opts, sampling[i].name, (int64_t)sampling[i].lo,
                                      (int64_t)sampling[i].hi, &x, &has, param));
            if (has) ATLAS_TRY(set_field(oa, sampling[i].field, json_integer((json_int_t)x)));
        } else {
            double x = 0;
            ATLAS_TRY(atlas_param_number(opts, sampling[i].name, sampling[i].lo, sampling[i].hi,
                                         &x, &has, param));
            if (has) ATLAS_TRY(set_field(oa, sampling[i].field, json_real(x)));
        }
    }
    return ATLAS_OK;
}

/* num_predict: -1 (until a stop) and -2 (until the context is full) both leave max_tokens
 * out, which means the latter here; N > 0 is max_tokens. */
static atlas_status copy_lengths(const json_t *opts, json_t *oa, ollama_req *q,
                                 const char **param) {
    int64_t n = -1;
    bool has = false;
    ATLAS_TRY(atlas_param_int(opts, "num_predict", -2, INT32_MAX, &n, &has, param));
    if (has && n == 0) {
        *param = "num_predict";
        return atlas_fail(ATLAS_ERR_INVALID, "'options.num_predict' must be -1, -2 or at least "
                                             "1, got 0");
    }
    if (n > 0) ATLAS_TRY(set_field(oa, "max_tokens", json_integer((json_int_t)n)));
    ATLAS_TRY(atlas_param_int(opts, "num_ctx", 1, INT32_MAX, &q->num_ctx, NULL, param));
    const json_t *stop = json_object_get(opts, "stop");
    if (stop && !json_is_null(stop)) ATLAS_TRY(set_field(oa, "stop", json_deep_copy(stop)));
    return ATLAS_OK;
}

static bool listed(const char *key) {
    for (size_t i = 0; i < sizeof sampling / sizeof sampling[0]; i++)
        if (!strcmp(key, sampling[i].name)) return true;
    for (size_t i = 0; i < sizeof runtime_options / sizeof runtime_options[0]; i++)
        if (!strcmp(key, runtime_options[i])) return true;
    return !strcmp(key, "num_predict") || !strcmp(key, "num_ctx") || !strcmp(key, "stop");
}

/* "options": each known one checked and mapped; an unknown one, or a sampler atlas does not
 * have set to anything but its neutral value, is refused by name. */
static atlas_status parse_options(const json_t *body, json_t *oa, ollama_req *q,
                                  const char **param) {
    const json_t *opts = json_object_get(body, "options");
    if (!opts || json_is_null(opts)) return ATLAS_OK;
    *param = "options";
    if (!json_is_object(opts)) return atlas_fail(ATLAS_ERR_INVALID, "'options' must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)opts, key, v) {
        if (listed(key)) continue;
        size_t i = 0, n = sizeof neutral_options / sizeof neutral_options[0];
        while (i < n && strcmp(key, neutral_options[i].name)) i++;
        if (i == n)
            return atlas_fail(ATLAS_ERR_INVALID, "'options.%.100s' is not an option atlas knows "
                                                 "(docs/SERVER.md lists them)", key);
        double x = json_is_boolean(v) ? json_is_true(v) : json_number_value(v);
        if (!json_is_null(v) && (!(json_is_number(v) || json_is_boolean(v)) ||
                                 x != neutral_options[i].neutral))
            return atlas_fail(ATLAS_ERR_INVALID, "'options.%s': atlas has no such sampler; only "
                                                 "%g (off) is taken", key,
                              neutral_options[i].neutral);
    }
    *param = NULL;
    ATLAS_TRY(copy_sampling(opts, oa, param));
    return copy_lengths(opts, oa, q, param);
}

/* "format": "json" (one JSON object) or a JSON schema, through the same constraints as
 * OpenAI's response_format. */
static atlas_status parse_format(const json_t *body, json_t *oa, const char **param) {
    const json_t *f = json_object_get(body, "format");
    if (!f || json_is_null(f) || (json_is_string(f) && !*json_string_value(f))) return ATLAS_OK;
    *param = "format";
    json_t *rf;
    if (json_is_string(f) && !strcmp(json_string_value(f), "json"))
        rf = json_pack("{s:s}", "type", "json_object");
    else if (json_is_object(f))
        rf = json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema", "schema", f);
    else
        return atlas_fail(ATLAS_ERR_INVALID, "'format' must be \"json\" or a JSON schema object");
    ATLAS_TRY(set_field(oa, "response_format", rf));
    *param = NULL;
    return ATLAS_OK;
}

/* "think": true or false (or "high", "medium", "low", taken as true) sets the template's
 * enable_thinking; true for a model whose template cannot think is refused, as Ollama
 * does.  Absent: the template's default.  A Harmony model (gpt-oss) always reasons: a level
 * is its reasoning_effort, and a boolean changes nothing, as in Ollama. */
static atlas_status parse_think(atlas_server *s, const json_t *body, json_t *oa,
                                const char *model, const char **param) {
    const json_t *t = json_object_get(body, "think");
    if (!t || json_is_null(t)) return ATLAS_OK;
    *param = "think";
    const char *level = json_string_value(t);
    if (!json_is_boolean(t) &&
        !(level && (!strcmp(level, "high") || !strcmp(level, "medium") || !strcmp(level, "low"))))
        return atlas_fail(ATLAS_ERR_INVALID, "'think' must be a boolean or \"high\", \"medium\" "
                                             "or \"low\"");
    bool on = !json_is_false(t);
    const atlas_template *tmpl = NULL;
    if (atlas_engine_template(s->engine, model, &tmpl) == ATLAS_OK &&
        atlas_harmony_template(atlas_template_source(tmpl))) {
        if (level) ATLAS_TRY(set_field(oa, "reasoning_effort", json_string(level)));
        *param = NULL;
        return ATLAS_OK;
    }
    if (on && (!tmpl || !atlas_reasoning_template_thinks(atlas_template_source(tmpl))))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' does not support thinking", model);
    ATLAS_TRY(set_field(oa, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on)));
    *param = NULL;
    return ATLAS_OK;
}

/* The fields both routes share: model, stream, keep_alive, options, format, think. */
static atlas_status parse_common(atlas_server *s, const json_t *body, bool templated,
                                 ollama_req *q, const char **param) {
    const char *want = NULL;
    ATLAS_TRY(atlas_param_string(body, "model", &want, param));
    if (!want || !*want) {
        *param = "model";
        return atlas_fail(ATLAS_ERR_INVALID, "'model' is required");
    }
    *param = "model";
    ATLAS_TRY(atlas_ollama_model(s, want, &q->model));
    *param = NULL;
    q->stream = true;
    ATLAS_TRY(atlas_param_bool(body, "stream", &q->stream, param));
    ATLAS_TRY(atlas_param_keep_alive(body, &q->keep_ms, param));
    q->unload = q->keep_ms == ATLAS_KEEP_ALIVE_NONE;
    q->oa = json_pack("{s:s, s:b}", "model", q->model, "stream", q->stream);
    if (!q->oa) return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    /* the engine keeps the model as the request says, as on the OpenAI routes */
    const json_t *keep = json_object_get(body, "keep_alive");
    if (keep && !json_is_null(keep))
        ATLAS_TRY(set_field(q->oa, "keep_alive", json_deep_copy(keep)));
    ATLAS_TRY(parse_options(body, q->oa, q, param));
    ATLAS_TRY(parse_format(body, q->oa, param));
    if (templated) return parse_think(s, body, q->oa, q->model, param);
    if (json_is_true(json_object_get(body, "think"))) {
        *param = "think";
        return atlas_fail(ATLAS_ERR_INVALID, "'think' needs the chat template: not with 'raw'");
    }
    return ATLAS_OK;
}

/* Ollama's messages as the chat route takes them: "thinking" becomes "reasoning_content"
 * (where templates look for an earlier turn's reasoning), "tool_name" the tool message's
 * "name"; images are refused. */
static atlas_status translate_messages(const json_t *in, json_t *oa, const char **param) {
    *param = "messages";
    if (!json_is_array(in)) return atlas_fail(ATLAS_ERR_INVALID, "'messages' must be an array");
    json_t *msgs = json_deep_copy(in);
    if (!msgs || json_object_set_new(oa, "messages", msgs))
        return atlas_fail(ATLAS_ERR_NOMEM, "messages: out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) continue; /* the chat route says what is wrong with it */
        if (json_array_size(json_object_get(m, "images")))
            return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'messages[%zu].images': this server "
                                                     "serves text models only", i);
        json_object_del(m, "images");
        json_t *th = json_object_get(m, "thinking");
        if (json_is_string(th)) json_object_set(m, "reasoning_content", th);
        json_object_del(m, "thinking");
        json_t *tn = json_object_get(m, "tool_name");
        if (json_is_string(tn) && !json_object_get(m, "name")) json_object_set(m, "name", tn);
        json_object_del(m, "tool_name");
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
            if (json_is_object(c) && !json_object_get(c, "type"))
                json_object_set_new(c, "type", json_string("function"));
        }
    }
    *param = NULL;
    return ATLAS_OK;
}

/* --- the routes ---------------------------------------------------------------------------- */

/* No prompt: Ollama loads the model (or, with keep_alive 0, releases it) and says so. */
static void load_only(atlas_server *s, const ollama_req *q, bool chat, atlas_http_reply *r) {
    atlas_status st = q->unload ? atlas_engine_unload(s->engine, q->model)
                                : atlas_engine_load(s->engine, q->model);
    if (st == ATLAS_OK && q->keep_ms && !q->unload) /* kept as asked from the load on */
        st = atlas_engine_keep_alive(s->engine, q->model, q->keep_ms);
    if (st != ATLAS_OK && !(q->unload && st == ATLAS_ERR_BUSY)) { /* busy: released at its end */
        atlas_api_error_fail(r, st, NULL);
        return;
    }
    char t[48];
    time_now(t);
    json_t *v = json_pack("{s:s, s:s, s:b, s:s}", "model", q->model, "created_at", t, "done", 1,
                          "done_reason", q->unload ? "unload" : "load");
    if (chat) json_object_set_new(v, "message", json_pack("{s:s, s:s}", "role", "assistant",
                                                           "content", ""));
    else json_object_set_new(v, "response", json_string(""));
    atlas_http_reply_json(r, 200, v);
    char *line = q->stream && r->status == 200 ? realloc(r->body, r->len + 2) : NULL;
    if (line) { /* a stream of one line */
        memcpy(line + r->len, "\n", 2);
        r->body = line;
        r->len++;
        r->ctype = "application/x-ndjson";
    }
}

/* options.num_ctx below the model's context caps this request's: its prompt must fit, and
 * the reply ends where the prompt and it fill num_ctx. */
static atlas_status apply_num_ctx(atlas_server *s, ollama_req *q, size_t n_prompt,
                                  const char **param) {
    int ctx = 0;
    ATLAS_TRY(atlas_engine_ctx_size(s->engine, q->model, &ctx));
    if (q->num_ctx <= 0 || q->num_ctx >= ctx) return ATLAS_OK;
    if ((int64_t)n_prompt >= q->num_ctx) {
        *param = "num_ctx";
        return atlas_fail(ATLAS_ERR_INVALID, "the prompt is %zu tokens, 'options.num_ctx' %lld: "
                                             "no room for a reply", n_prompt,
                          (long long)q->num_ctx);
    }
    json_int_t room = (json_int_t)(q->num_ctx - (int64_t)n_prompt);
    const json_t *mt = json_object_get(q->oa, "max_tokens");
    if (!mt || json_integer_value(mt) > room) return set_field(q->oa, "max_tokens",
                                                               json_integer(room));
    return ATLAS_OK;
}

/* The rendered prompt's length, for num_ctx (only counted when num_ctx asks for it). */
static atlas_status chat_prompt_tokens(atlas_server *s, ollama_req *q, size_t *n,
                                       const char **param) {
    *n = 0;
    if (q->num_ctx <= 0) return ATLAS_OK;
    atlas_api_chat_req cq;
    atlas_status st = atlas_api_chat_prepare(s, q->oa, &cq, param);
    *n = cq.n;
    atlas_api_chat_req_free(&cq);
    return st;
}

/* Runs the translated request; its keep_alive goes with it to the engine, which releases
 * the model when it has been idle that long (0: once the request has ended). */
static void run(atlas_http_call *call, ollama_req *q, bool chat, const atlas_gen_dialect *d,
                atlas_http_reply *r) {
    atlas_server *s = call->ctx;
    if (chat) {
        const char *param = NULL;
        atlas_api_chat_req cq;
        atlas_status st = atlas_api_chat_prepare(s, q->oa, &cq, &param);
        cq.o.dialect = d;
        if (st == ATLAS_OK) atlas_api_chat_start(call, &cq, r);
        else atlas_api_error_fail(r, st, param);
        atlas_api_chat_req_free(&cq);
    } else {
        atlas_api_completions_run(call, q->oa, d, r);
    }
}

void atlas_ollama_chat(atlas_http_call *call, json_t *body, const char *arg,
                       atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    ollama_req q = {0};
    const char *param = NULL;
    size_t n = 0;
    const json_t *msgs = json_object_get(body, "messages");
    atlas_status st = parse_common(s, body, true, &q, &param);
    q.load_only = !msgs || json_is_null(msgs) || (json_is_array(msgs) && !json_array_size(msgs));
    if (st == ATLAS_OK && !q.load_only) st = translate_messages(msgs, q.oa, &param);
    const json_t *tools = json_object_get(body, "tools");
    if (st == ATLAS_OK && tools && !json_is_null(tools))
        st = set_field(q.oa, "tools", json_deep_copy(tools));
    if (st == ATLAS_OK && !q.load_only) st = chat_prompt_tokens(s, &q, &n, &param);
    if (st == ATLAS_OK && !q.load_only) st = apply_num_ctx(s, &q, n, &param);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else if (q.load_only) load_only(s, &q, true, r);
    else run(call, &q, true, &chat_dialect, r);
    json_decref(q.oa);
}

/* Fields of /api/generate that atlas does not serve: refused when given a value. */
static atlas_status refuse_unserved(const json_t *body, const char **param) {
    static const char *const fields[] = {"suffix", "images", "template", "context"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *v = json_object_get(body, fields[i]);
        if (!v || json_is_null(v) || (json_is_string(v) && !*json_string_value(v)) ||
            (json_is_array(v) && json_array_size(v) == 0))
            continue;
        *param = fields[i];
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "'%s' is not served by atlas%s", fields[i],
                          !strcmp(fields[i], "context")
                              ? ": send the conversation through /api/chat"
                              : !strcmp(fields[i], "template")
                                    ? ": the model's own chat template is used (or 'raw')"
                                    : "");
    }
    return ATLAS_OK;
}

/* raw: the prompt as it is, through the completion route (token ids, so that its length is
 * known: without num_predict the reply may fill the context, as Ollama's). */
static atlas_status raw_prompt(atlas_server *s, const json_t *body, ollama_req *q,
                               const char **param) {
    const atlas_tokenizer *tok;
    int32_t *ids = NULL;
    size_t n = 0;
    int count = 0, ctx = 0;
    json_t *p = json_pack("{s:O}", "prompt", json_object_get(body, "prompt"));
    atlas_status st = p ? atlas_engine_tokenizer(s->engine, q->model, &tok)
                        : atlas_fail(ATLAS_ERR_NOMEM, "prompt: out of memory");
    if (st == ATLAS_OK) st = atlas_api_completion_prompts(p, tok, &ids, &n, &count, param);
    json_t *arr = st == ATLAS_OK ? json_array() : NULL;
    for (size_t i = 0; arr && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    if (st == ATLAS_OK) st = set_field(q->oa, "prompt", arr);
    if (st == ATLAS_OK) st = apply_num_ctx(s, q, n, param);
    if (st == ATLAS_OK) st = atlas_engine_ctx_size(s->engine, q->model, &ctx);
    if (st == ATLAS_OK && !json_object_get(q->oa, "max_tokens") && (size_t)ctx > n)
        st = set_field(q->oa, "max_tokens", json_integer((json_int_t)((size_t)ctx - n)));
    free(ids);
    json_decref(p);
    return st;
}

/* Not raw: the prompt (and "system") as a conversation through the model's chat template. */
static atlas_status templated_prompt(atlas_server *s, const json_t *body, ollama_req *q,
                                     const char **param) {
    const char *system = NULL;
    ATLAS_TRY(atlas_param_string(body, "system", &system, param));
    json_t *msgs = json_array();
    if (system && *system)
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content",
                                              json_object_get(body, "system")));
    json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content",
                                          json_object_get(body, "prompt")));
    ATLAS_TRY(set_field(q->oa, "messages", msgs));
    size_t n = 0;
    ATLAS_TRY(chat_prompt_tokens(s, q, &n, param));
    return apply_num_ctx(s, q, n, param);
}

void atlas_ollama_generate(atlas_http_call *call, json_t *body, const char *arg,
                           atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    ollama_req q = {0};
    const char *param = NULL, *prompt = NULL;
    bool raw = false;
    atlas_status st = atlas_param_bool(body, "raw", &raw, &param);
    if (st == ATLAS_OK) st = atlas_param_string(body, "prompt", &prompt, &param);
    if (st == ATLAS_OK) st = refuse_unserved(body, &param);
    if (st == ATLAS_OK) st = parse_common(s, body, !raw, &q, &param);
    q.load_only = !prompt || !*prompt;
    if (st == ATLAS_OK && !q.load_only)
        st = raw ? raw_prompt(s, body, &q, &param) : templated_prompt(s, body, &q, &param);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else if (q.load_only) load_only(s, &q, false, r);
    else run(call, &q, !raw, &generate_dialect, r);
    json_decref(q.oa);
}
