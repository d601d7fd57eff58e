/* server/format.c — engine events as OpenAI JSON: chat.completion / text_completion
 * objects, their streaming chunks (SSE "data: {...}\n\n" ... "data: [DONE]\n\n"), logprobs
 * in both APIs' shapes, and tool calls parsed out of the generated text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/tokenizer.h"
#include "server/errors.h"
#include "server/gen_internal.h"

atlas_status atlas_gen_format_init(atlas_gen *g, const int32_t *ids, size_t n_ids) {
    if (g->o.harmony && g->o.kind == ATLAS_API_CHAT) {
        ATLAS_TRY(atlas_harmony_new(g->tok, ids, n_ids, &g->hp));
        g->calls = json_array();
    } else if (g->o.reasoning && g->o.kind == ATLAS_API_CHAT) {
        ATLAS_TRY(atlas_reasoning_new(g->o.reasoning_inside, &g->rp));
    }
    if (g->o.tools != ATLAS_TOOLCALL_NONE && !g->hp) {
        ATLAS_TRY(atlas_toolcall_parser_new(g->o.tools, &g->tp));
        g->calls = json_array();
    }
    if (g->o.logprobs)
        g->lp = g->o.kind == ATLAS_API_CHAT
                    ? json_array()
                    : json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                                "top_logprobs", "text_offset");
    if (((g->o.tools || g->hp) && !g->calls) || (g->o.logprobs && !g->lp))
        return atlas_fail(ATLAS_ERR_NOMEM, "request: out of memory");
    return ATLAS_OK;
}

void atlas_gen_format_free(atlas_gen *g) {
    if (g->o.dialect && g->o.dialect->free) g->o.dialect->free(g->o.dialect_ctx);
    atlas_reasoning_free(g->rp);
    atlas_harmony_free(g->hp);
    free(g->reasoning);
    atlas_toolcall_parser_free(g->tp);
    json_decref(g->calls);
    json_decref(g->lp);
    free(g->text);
    free(g->stop_string);
    free(g->out);
}

/* --- pieces ------------------------------------------------------------------------------ */

static const char *finish_name(const atlas_gen *g) {
    switch (g->finish) {
    case ATLAS_FINISH_STOP: return g->n_calls > 0 ? "tool_calls" : "stop";
    case ATLAS_FINISH_LENGTH: return "length";
    default: return "stop";
    }
}

/* The token's own text and bytes (OpenAI's "token" and "bytes"), or "token_id:N" when the
 * request asked (vLLM's return_tokens_as_token_ids). */
static json_t *token_json(const atlas_gen *g, int32_t id, json_t **bytes) {
    const char *b = "";
    size_t n = 0;
    if (atlas_tokenizer_token_bytes(g->tok, id, &b, &n) != ATLAS_OK) b = "", n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)b[i]));
    }
    if (g->o.tokens_as_ids) return json_sprintf("token_id:%d", (int)id);
    return atlas_json_text(b, n);
}

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}. */
static json_t *chat_logprob(const atlas_gen *g, const atlas_gen_event *e) {
    json_t *bytes, *top = json_array();
    json_t *tok = token_json(g, e->id, &bytes);
    for (int i = 0; i < e->n_top && i < g->o.top_logprobs; i++) {
        json_t *tb, *tt = token_json(g, e->top[i].id, &tb);
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", tt, "logprob",
                                             (double)e->top[i].logprob, "bytes", tb));
    }
    return json_pack("{s:o, s:f, s:o, s:o}", "token", tok, "logprob", (double)e->logprob,
                     "bytes", bytes, "top_logprobs", top);
}

/* Completions: appends to {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static void completion_logprob(const atlas_gen *g, json_t *lp, const atlas_gen_event *e,
                               size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), token_json(g, e->id, NULL));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(e->logprob));
    json_t *top = json_object();
    for (int i = 0; i < e->n_top && i < g->o.top_logprobs; i++) {
        json_t *t = token_json(g, e->top[i].id, NULL);
        if (t && json_string_length(t) > 0 && !json_object_get(top, json_string_value(t)))
            json_object_set_new(top, json_string_value(t), json_real(e->top[i].logprob));
        json_decref(t);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

json_t *atlas_gen_format_usage(const atlas_gen *g) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", g->usage.prompt_tokens,
                     "completion_tokens", g->usage.completion_tokens, "total_tokens",
                     g->usage.prompt_tokens + g->usage.completion_tokens,
                     "prompt_tokens_details", "cached_tokens", g->usage.cached_tokens);
}

/* Runs text through the tool-call parser when there is one: *out is the plain text to
 * release (malloc'd), new calls are appended to calls. */
static atlas_status release_text(atlas_gen *g, const char *text, size_t len, bool end,
                                 char **out, json_t *calls) {
    *out = NULL;
    if (g->tp) {
        if (len) ATLAS_TRY(atlas_toolcall_parser_feed(g->tp, text, len, out, calls));
        if (!end) {
            if (!*out && !(*out = strdup("")))
                return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
            return ATLAS_OK;
        }
        char *rest = NULL;
        ATLAS_TRY(atlas_toolcall_parser_finish(g->tp, &rest, calls));
        if (!rest && !(rest = strdup(""))) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        if (!*out) {
            *out = rest;
            return ATLAS_OK;
        }
        size_t a = strlen(*out), b = strlen(rest);
        char *both = realloc(*out, a + b + 1);
        if (!both) {
            free(rest);
            return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        }
        memcpy(both + a, rest, b + 1);
        free(rest);
        *out = both;
        return ATLAS_OK;
    }
    *out = malloc(len + 1);
    if (!*out) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    memcpy(*out, text, len);
    (*out)[len] = '\0';
    return ATLAS_OK;
}

/* Appends each call's arguments to *content (a malloc'd string): calls of a request that
 * asked for none are text, as in the formats read from text. */
static atlas_status calls_as_text(json_t *calls, char **content) {
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const char *a = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
        size_t n = strlen(*content), k = a ? strlen(a) : 0;
        char *grown = realloc(*content, n + k + 1);
        if (!grown) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        memcpy(grown + n, a ? a : "", k + 1);
        *content = grown;
    }
    json_array_clear(calls);
    return ATLAS_OK;
}

/* A Harmony reply: e's id (or the id that ended it) through the parser, its text counted as
 * released.  Calls go to calls when the request has tools, else to the content. */
static atlas_status split_harmony(atlas_gen *g, const atlas_gen_event *e, bool end,
                                  char **reasoning, char **out, json_t *calls) {
    *reasoning = *out = NULL;
    g->released += e->text_len;
    json_t *got = json_array();
    if (!got) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    atlas_status st = ATLAS_OK;
    int32_t id = end ? e->stop_id : e->id;
    if (id >= 0) st = atlas_harmony_feed(g->hp, id, g->released, reasoning, out, got);
    if (st == ATLAS_OK && end) {
        char *a = NULL, *b = NULL;
        st = atlas_harmony_finish(g->hp, g->released, &a, &b, got);
        if (st == ATLAS_OK && (!*reasoning || !*out)) { /* no id fed before */
            free(*reasoning), free(*out);
            *reasoning = a, *out = b, a = b = NULL;
        } else if (st == ATLAS_OK) {
            char *r2 = NULL, *o2 = NULL;
            if (asprintf(&r2, "%s%s", *reasoning, a) < 0) r2 = NULL;
            if (asprintf(&o2, "%s%s", *out, b) < 0) o2 = NULL;
            free(*reasoning), free(*out);
            *reasoning = r2, *out = o2;
            if (!r2 || !o2) st = atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
        }
        free(a), free(b);
    }
    if (st == ATLAS_OK && g->o.tools != ATLAS_TOOLCALL_HARMONY) st = calls_as_text(got, out);
    if (st == ATLAS_OK && json_array_extend(calls, got)) st = atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    json_decref(got);
    if (st != ATLAS_OK) {
        free(*reasoning), free(*out);
        *reasoning = *out = NULL;
    }
    return st;
}

/* The reasoning splitter first (when on), then the tool-call parser over the content:
 * *reasoning (NULL when the splitter is off) and *out are malloc'd. */
static atlas_status split_text(atlas_gen *g, const atlas_gen_event *e, bool end,
                               char **reasoning, char **out, json_t *calls) {
    const char *text = e->text;
    size_t len = e->text_len;
    *reasoning = NULL;
    if (g->hp) return split_harmony(g, e, end, reasoning, out, calls);
    if (!g->rp) return release_text(g, text, len, end, out, calls);
    char *content = NULL;
    ATLAS_TRY(atlas_reasoning_feed(g->rp, text, len, end, reasoning, &content));
    atlas_status st = release_text(g, content, strlen(content), end, out, calls);
    free(content);
    if (st != ATLAS_OK) {
        free(*reasoning);
        *reasoning = NULL;
    }
    return st;
}

/* Gives each new call its index (the streaming delta needs it). */
static void number_calls(atlas_gen *g, json_t *calls) {
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) json_object_set_new(c, "index", json_integer(g->n_calls++));
}

void atlas_gen_format_observe_end(atlas_gen *g) {
    atlas_server_metrics_observe(&g->srv->metrics, &g->srv->metrics.e2e,
                                 atlas_http_now() - g->t_start);
}

/* --- streaming ---------------------------------------------------------------------------- */

static atlas_status emit(atlas_gen *g, json_t *v) {
    if (!v) return atlas_fail(ATLAS_ERR_NOMEM, "SSE chunk: out of memory");
    char *s = json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(v);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "SSE chunk: out of memory");
    int rc = atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "data: %s\n\n", s);
    free(s);
    return rc ? atlas_fail(ATLAS_ERR_NOMEM, "SSE chunk: out of memory") : ATLAS_OK;
}

/* A chunk with one choice (choice may be NULL: the usage chunk has none). */
static json_t *chunk(const atlas_gen *g, json_t *choice) {
    bool chat = g->o.kind == ATLAS_API_CHAT;
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", g->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)g->created, "model", g->model, "choices");
    if (!c) {
        json_decref(choice);
        return NULL;
    }
    if (choice) json_array_append_new(json_object_get(c, "choices"), choice);
    if (g->o.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

atlas_status atlas_gen_write(atlas_gen *g, const char *s, size_t n) {
    return atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "%.*s", (int)n, s)
               ? atlas_fail(ATLAS_ERR_NOMEM, "stream: out of memory")
               : ATLAS_OK;
}

static json_t *choice(const atlas_gen *g, json_t *delta_or_text, json_t *logprobs,
                      const char *finish) {
    bool chat = g->o.kind == ATLAS_API_CHAT;
    return json_pack("{s:i, s:o, s:o, s:o}", "index", g->index, chat ? "delta" : "text",
                     delta_or_text, "logprobs", logprobs ? logprobs : json_null(),
                     "finish_reason", finish ? json_string(finish) : json_null());
}

static atlas_status stream_token(atlas_gen *g, const atlas_gen_event *e, bool end) {
    bool chat = g->o.kind == ATLAS_API_CHAT;
    json_t *calls = json_array();
    char *text = NULL, *reasoning = NULL;
    atlas_status st = split_text(g, e, end, &reasoning, &text, calls);
    if (st != ATLAS_OK) {
        json_decref(calls);
        return st;
    }
    size_t rn = reasoning ? strlen(reasoning) : 0;
    if (g->o.dialect) { /* another dialect writes the same pieces its own way */
        number_calls(g, calls);
        atlas_gen_piece p = {reasoning ? reasoning : "", rn, text, strlen(text), calls};
        if (rn || p.text_len || json_array_size(calls)) st = g->o.dialect->piece(g, &p);
        free(text);
        free(reasoning);
        json_decref(calls);
        return st;
    }
    json_t *lp = NULL;
    if (e->type == ATLAS_EVENT_TOKEN && g->o.logprobs) {
        if (chat) {
            lp = json_pack("{s:[o]}", "content", chat_logprob(g, e));
        } else {
            lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                           "top_logprobs", "text_offset");
            completion_logprob(g, lp, e, g->text_offset);
        }
    }
    size_t n = strlen(text);
    if (n || lp || rn) {
        json_t *body = chat ? json_object() : atlas_json_text(text, n);
        if (chat && rn) json_object_set_new(body, "reasoning_content", atlas_json_text(reasoning, rn));
        if (chat && (n || !rn)) json_object_set_new(body, "content", atlas_json_text(text, n));
        st = emit(g, chunk(g, choice(g, body, lp, NULL)));
    }
    g->text_offset += n;
    free(text);
    free(reasoning);
    if (st == ATLAS_OK && json_array_size(calls)) {
        number_calls(g, calls);
        st = emit(g, chunk(g, choice(g, json_pack("{s:O}", "tool_calls", calls), NULL, NULL)));
    }
    json_decref(calls);
    return st;
}

static atlas_status stream_error(atlas_gen *g, atlas_api_error kind, atlas_status status,
                                 const char *msg) {
    atlas_http_reply r = {0};
    atlas_api_error_reply(&r, kind, status, NULL, msg);
    if (g->o.dialect) {
        g->done_sent = true;
        atlas_status st = g->o.dialect->error(g, &r, msg && *msg ? msg : "request failed");
        free(r.body);
        return st;
    }
    int rc = atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "data: %s\n\ndata: [DONE]\n\n",
                              r.body ? r.body : "{}");
    free(r.body);
    g->done_sent = true;
    if (g->group) g->group->done = true; /* one error ends the whole stream */
    return rc ? atlas_fail(ATLAS_ERR_NOMEM, "SSE: out of memory") : ATLAS_OK;
}

static atlas_status stream_end(atlas_gen *g, const atlas_gen_event *e) {
    g->usage = e->usage;
    g->finish = e->finish;
    if (e->stop_string && !g->stop_string && !(g->stop_string = strdup(e->stop_string)))
        return atlas_fail(ATLAS_ERR_NOMEM, "SSE: out of memory");
    atlas_gen_format_observe_end(g);
    ATLAS_TRY(stream_token(g, e, true));
    if (e->finish == ATLAS_FINISH_ERROR)
        return stream_error(g, ATLAS_API_ERR_STATUS, e->status ? e->status : ATLAS_ERR_INTERNAL,
                            e->message);
    if (e->finish == ATLAS_FINISH_CANCELLED)
        return stream_error(g, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK,
                            "the request was cancelled: the server is shutting down");
    if (g->o.dialect) { /* one choice: no group */
        g->done_sent = true;
        return g->o.dialect->end(g);
    }
    bool chat = g->o.kind == ATLAS_API_CHAT;
    ATLAS_TRY(emit(g, chunk(g, choice(g, chat ? json_object() : json_string(""), NULL,
                                      finish_name(g)))));
    atlas_gen_group *G = g->group;
    if (G) { /* one usage chunk and one [DONE] once every choice has ended */
        if (g->index % G->per_prompt == 0) G->usage.prompt_tokens += g->usage.prompt_tokens;
        G->usage.completion_tokens += g->usage.completion_tokens;
        G->usage.cached_tokens += g->usage.cached_tokens;
        if (++G->n_ended < G->n) return ATLAS_OK;
        g->usage = G->usage;
        G->done = true;
    }
    if (g->o.include_usage) {
        json_t *c = chunk(g, NULL);
        if (c) json_object_set_new(c, "usage", atlas_gen_format_usage(g));
        ATLAS_TRY(emit(g, c));
    }
    g->done_sent = true;
    return atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "data: [DONE]\n\n")
               ? atlas_fail(ATLAS_ERR_NOMEM, "SSE: out of memory")
               : ATLAS_OK;
}

atlas_status atlas_gen_format_event(atlas_gen *g, const atlas_gen_event *e) {
    if (!g->began) {
        g->began = true;
        /* the prompt's split into cached and computed tokens, for a dialect's first event
         * (Anthropic's message_start) */
        g->start_usage = e->usage;
        if (g->o.dialect) {
            if (g->o.dialect->begin) ATLAS_TRY(g->o.dialect->begin(g));
        } else if (g->o.kind == ATLAS_API_CHAT)
            ATLAS_TRY(emit(g, chunk(g, choice(g, json_pack("{s:s, s:s}", "role", "assistant",
                                                           "content", ""),
                                              NULL, NULL))));
        else if (g->echo && *g->echo)
            ATLAS_TRY(emit(g, chunk(g, choice(g, atlas_json_text(g->echo, strlen(g->echo)),
                                              NULL, NULL))));
        if (g->echo) g->text_offset = strlen(g->echo);
    }
    if (e->type == ATLAS_EVENT_END) return stream_end(g, e);
    return stream_token(g, e, false);
}

void atlas_gen_format_abort(atlas_gen *g, const char *why) {
    g->out_off = g->out_len = 0;
    stream_error(g, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, why);
}

/* --- the whole response ------------------------------------------------------------------- */

static atlas_status append_to(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t want = *cap ? *cap * 2 : 256;
        while (want < *len + n + 1) want *= 2;
        char *grown = realloc(*buf, want);
        if (!grown) return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
        *buf = grown;
        *cap = want;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return ATLAS_OK;
}

static atlas_status append_text(atlas_gen *g, const char *s, size_t n) {
    return append_to(&g->text, &g->text_len, &g->text_cap, s, n);
}

atlas_status atlas_gen_format_collect(atlas_gen *g, const atlas_gen_event *e) {
    if (!g->began) {
        g->began = true;
        if (g->echo) ATLAS_TRY(append_text(g, g->echo, strlen(g->echo)));
    }
    if (g->o.logprobs && e->type == ATLAS_EVENT_TOKEN) {
        if (g->o.kind == ATLAS_API_CHAT) json_array_append_new(g->lp, chat_logprob(g, e));
        else completion_logprob(g, g->lp, e, g->text_len);
    }
    if (e->stop_string && !g->stop_string && !(g->stop_string = strdup(e->stop_string)))
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    char *text = NULL, *reasoning = NULL;
    ATLAS_TRY(split_text(g, e, e->type == ATLAS_EVENT_END, &reasoning, &text, g->calls));
    atlas_status st = append_text(g, text, strlen(text));
    if (st == ATLAS_OK && reasoning && *reasoning)
        st = append_to(&g->reasoning, &g->reasoning_len, &g->reasoning_cap, reasoning,
                       strlen(reasoning));
    free(text);
    free(reasoning);
    return st;
}

json_t *atlas_gen_format_response(atlas_gen *g) {
    number_calls(g, g->calls);
    return g->o.dialect ? g->o.dialect->response(g) : atlas_gen_format_openai(g);
}

json_t *atlas_gen_format_openai(atlas_gen *g) {
    bool chat = g->o.kind == ATLAS_API_CHAT;
    json_t *ch;
    if (chat) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                g->n_calls && g->text_len == 0
                                    ? json_null()
                                    : atlas_json_text(g->text ? g->text : "", g->text_len));
        if (g->reasoning_len)
            json_object_set_new(msg, "reasoning_content",
                                atlas_json_text(g->reasoning, g->reasoning_len));
        if (g->n_calls) {
            size_t i;
            json_t *c;
            json_array_foreach(g->calls, i, c) json_object_del(c, "index");
            json_object_set(msg, "tool_calls", g->calls);
        }
        ch = json_pack("{s:i, s:o, s:o?, s:s}", "index", 0, "message", msg, "logprobs",
                       g->lp ? json_pack("{s:O}", "content", g->lp) : NULL, "finish_reason",
                       finish_name(g));
    } else {
        ch = json_pack("{s:i, s:o, s:O?, s:s}", "index", 0, "text",
                       atlas_json_text(g->text ? g->text : "", g->text_len), "logprobs", g->lp,
                       "finish_reason", finish_name(g));
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g->id, "object",
                     chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)g->created, "model", g->model, "choices", ch, "usage",
                     atlas_gen_format_usage(g));
}

json_t *atlas_gen_format_batch(atlas_gen **gs, int n, int per_prompt) {
    json_t *v = atlas_gen_format_response(gs[0]);
    json_t *choices = json_object_get(v, "choices");
    atlas_usage sum = gs[0]->usage;
    for (int i = 1; i < n && v; i++) {
        json_t *one = atlas_gen_format_response(gs[i]);
        json_t *ch = json_array_get(json_object_get(one, "choices"), 0);
        json_object_set_new(ch, "index", json_integer(i));
        json_array_append(choices, ch);
        json_decref(one);
        if (i % per_prompt == 0) /* the n choices of a prompt share it */
            sum.prompt_tokens += gs[i]->usage.prompt_tokens;
        sum.completion_tokens += gs[i]->usage.completion_tokens;
        sum.cached_tokens += gs[i]->usage.cached_tokens;
    }
    gs[0]->usage = sum;
    json_object_set_new(v, "usage", atlas_gen_format_usage(gs[0]));
    return v;
}
