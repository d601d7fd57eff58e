/* server/responses_out.c — a chat answer told as OpenAI's Responses API: the response object
 * with its output items (reasoning, message, function_call), and, streamed, the typed events
 * the official SDK accumulates, each with its sequence_number.  The chat formatter
 * (format.c) hands over the pieces it would have sent (a gen dialect, gen.h); this keeps
 * the output items as they are made, so that the streamed and the whole answer are the same
 * object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/gen_internal.h"
#include "server/metrics.h"
#include "server/respstore.h"
#include "server/responses.h"

enum { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE };

typedef struct out_ctx {
    atlas_respstore *store;      /* NULL: not kept */
    char id[48];
    json_t *echo, *input, *history;
    json_t *output;              /* the items made so far */
    json_t *usage;               /* OpenAI's chat usage, NULL until the end */
    char finish[16];             /* the chat finish_reason */
    int seq;                     /* the next sequence_number */
    int open;                    /* the item being streamed */
    char *text;                  /* its text so far */
    size_t len, cap;
} out_ctx;

static void ctx_free(void *p) {
    out_ctx *x = p;
    if (!x) return;
    json_decref(x->echo);
    json_decref(x->input);
    json_decref(x->history);
    json_decref(x->output);
    json_decref(x->usage);
    free(x->text);
    free(x);
}

/* --- items and the response object ------------------------------------------------------- */

static json_t *item_id(const out_ctx *x, const char *prefix) {
    return json_sprintf("%s_%s_%zu", prefix, x->id + 5, json_array_size(x->output));
}

static json_t *reasoning_item(const out_ctx *x, const char *text) {
    return json_pack("{s:o, s:s, s:[], s:[{s:s, s:s}]}", "id", item_id(x, "rs"), "type",
                     "reasoning", "summary", "content", "type", "reasoning_text", "text", text);
}

static json_t *message_item(const out_ctx *x, const char *text, const char *status) {
    return json_pack("{s:o, s:s, s:s, s:s, s:[{s:s, s:s, s:[], s:[]}]}", "id",
                     item_id(x, "msg"), "type", "message", "status", status, "role",
                     "assistant", "content", "type", "output_text", "text", text, "annotations",
                     "logprobs");
}

/* A chat tool call {"id", "function": {"name", "arguments"}} as a function_call item. */
static json_t *call_item(const out_ctx *x, const json_t *call, const char *status) {
    const json_t *fn = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    return json_pack("{s:o, s:s, s:s, s:s?, s:s?, s:s}", "id", item_id(x, "fc"), "type",
                     "function_call", "status", status, "call_id",
                     json_string_value(json_object_get(call, "id")), "name",
                     json_string_value(json_object_get(fn, "name")), "arguments",
                     args ? args : "{}");
}

/* Chat usage {prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens} in the
 * Responses shape. */
static json_t *usage_of(const json_t *u) {
    json_int_t in = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(u, "completion_tokens"));
    json_int_t cached = json_integer_value(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", in,
                     "input_tokens_details", "cached_tokens", cached, "output_tokens", out,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens", in + out);
}

/* The response object: the request's echoed fields, then what this answer made. */
static json_t *response_object(const out_ctx *x, const char *status, json_t *error) {
    json_t *r = json_deep_copy(x->echo);
    if (!r) {
        json_decref(error);
        return NULL;
    }
    bool cut = !strcmp(status, "incomplete");
    json_object_set_new(r, "id", json_string(x->id));
    json_object_set_new(r, "object", json_string("response"));
    json_object_set_new(r, "status", json_string(status));
    json_object_set_new(r, "error", error ? error : json_null());
    json_object_set_new(r, "incomplete_details",
                        cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(r, "output", json_deep_copy(x->output));
    json_object_set_new(r, "usage", x->usage ? usage_of(x->usage) : json_null());
    return r;
}

/* The finished response: kept (with the conversation it ends) when the request asked. */
static json_t *finish(out_ctx *x, const char *status) {
    json_t *r = response_object(x, status, NULL);
    if (!r || !x->store) return r;
    json_t *history = json_deep_copy(x->history);
    if (history && !json_array_extend(history, x->input) &&
        !json_array_extend(history, x->output))
        atlas_respstore_put(x->store, x->id, r, x->input, history);
    json_decref(history); /* a response that could not be kept is still answered */
    return r;
}

static const char *final_status(const out_ctx *x) {
    return !strcmp(x->finish, "length") ? "incomplete" : "completed";
}

/* A message cut by max_output_tokens is incomplete, as in the response that holds it. */
static const char *item_status(const out_ctx *x) {
    return !strcmp(x->finish, "length") ? "incomplete" : "completed";
}

/* --- the whole answer ---------------------------------------------------------------------- */

/* The output items of a chat message: its reasoning, its text (also when empty, unless the
 * reply is tool calls), its tool calls. */
static atlas_status add_message_items(out_ctx *x, const json_t *msg) {
    const char *reasoning = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *text = json_string_value(json_object_get(msg, "content"));
    const json_t *calls = json_object_get(msg, "tool_calls");
    if (reasoning && *reasoning && json_array_append_new(x->output, reasoning_item(x, reasoning)))
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    if (((text && *text) || json_array_size(calls) == 0) &&
        json_array_append_new(x->output, message_item(x, text ? text : "", item_status(x))))
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        if (json_array_append_new(x->output, call_item(x, c, "completed")))
            return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    }
    return ATLAS_OK;
}

static json_t *whole(out_ctx *x, json_t *completion) {
    const json_t *choice = json_array_get(json_object_get(completion, "choices"), 0);
    const char *fin = json_string_value(json_object_get(choice, "finish_reason"));
    snprintf(x->finish, sizeof x->finish, "%s", fin ? fin : "stop");
    json_decref(x->usage);
    x->usage = json_incref(json_object_get(completion, "usage"));
    json_t *r = NULL;
    if (add_message_items(x, json_object_get(choice, "message")) == ATLAS_OK)
        r = finish(x, final_status(x));
    json_decref(completion);
    return r;
}

/* --- the stream ---------------------------------------------------------------------------- */

typedef struct sse {
    char **out;
    size_t *len, *cap;
} sse;

/* One event: "event: TYPE" and its data, which v (taken) holds without its type and
 * sequence_number. */
static atlas_status event(out_ctx *x, sse *s, const char *type, json_t *v) {
    if (!v) return atlas_fail(ATLAS_ERR_NOMEM, "response event: out of memory");
    json_object_set_new(v, "type", json_string(type));
    json_object_set_new(v, "sequence_number", json_integer(x->seq++));
    char *d = json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(v);
    if (!d) return atlas_fail(ATLAS_ERR_NOMEM, "response event: out of memory");
    int rc = atlas_buf_printf(s->out, s->len, s->cap, "event: %s\ndata: %s\n\n", type, d);
    free(d);
    return rc ? atlas_fail(ATLAS_ERR_NOMEM, "response event: out of memory") : ATLAS_OK;
}

/* The fields that place an event on the item being streamed. */
static json_t *at_item(const out_ctx *x, bool part) {
    const json_t *item = json_array_get(x->output, json_array_size(x->output) - 1);
    json_t *v = json_pack("{s:O, s:I}", "item_id", json_object_get(item, "id"), "output_index",
                          (json_int_t)json_array_size(x->output) - 1);
    if (v && part) json_object_set_new(v, "content_index", json_integer(0));
    return v;
}

static atlas_status item_added(out_ctx *x, sse *s, json_t *item) {
    if (!item || json_array_append_new(x->output, item))
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    return event(x, s, "response.output_item.added",
                 json_pack("{s:I, s:O}", "output_index",
                           (json_int_t)json_array_size(x->output) - 1, "item", item));
}

/* Opens a reasoning or message item: the item, then its one content part. */
static atlas_status open_item(out_ctx *x, sse *s, int kind) {
    bool think = kind == OPEN_REASONING;
    json_t *item = think ? reasoning_item(x, "") : message_item(x, "", "in_progress");
    if (item) json_array_clear(json_object_get(item, "content")); /* the part comes next */
    ATLAS_TRY(item_added(x, s, item));
    json_t *part = think ? json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "")
                         : json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text",
                                     "", "annotations", "logprobs");
    json_t *v = at_item(x, true);
    if (v && part) json_object_set(v, "part", part);
    json_array_append_new(json_object_get(item, "content"), part);
    x->open = kind;
    x->len = 0;
    return event(x, s, "response.content_part.added", v);
}

/* Closes the open item: its text done, its part done, the item done, as the whole answer
 * has it. */
static atlas_status close_item(out_ctx *x, sse *s) {
    if (x->open == OPEN_NONE) return ATLAS_OK;
    bool think = x->open == OPEN_REASONING;
    x->open = OPEN_NONE;
    size_t k = json_array_size(x->output) - 1;
    json_t *item = json_array_get(x->output, k);
    json_t *part = json_array_get(json_object_get(item, "content"), 0);
    json_t *text = json_stringn(x->text ? x->text : "", x->len);
    if (!text) return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    json_object_set_new(part, "text", text);
    if (!think) json_object_set_new(item, "status", json_string(item_status(x)));
    json_t *v = at_item(x, true);
    if (v) json_object_set(v, "text", text);
    if (v && !think) json_object_set_new(v, "logprobs", json_array());
    ATLAS_TRY(event(x, s, think ? "response.reasoning_text.done" : "response.output_text.done",
                    v));
    v = at_item(x, true);
    if (v) json_object_set(v, "part", part);
    ATLAS_TRY(event(x, s, "response.content_part.done", v));
    return event(x, s, "response.output_item.done",
                 json_pack("{s:I, s:O}", "output_index", (json_int_t)k, "item", item));
}

/* Text for a reasoning or message item, opening it (and closing the other) as needed. */
static atlas_status stream_text(out_ctx *x, sse *s, int kind, const char *text) {
    if (!text || !*text) return ATLAS_OK;
    if (x->open != kind) {
        ATLAS_TRY(close_item(x, s));
        ATLAS_TRY(open_item(x, s, kind));
    }
    size_t n = strlen(text);
    if (atlas_buf_printf(&x->text, &x->len, &x->cap, "%s", text))
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    json_t *v = at_item(x, true);
    if (v) json_object_set_new(v, "delta", json_stringn(text, n));
    if (v && kind == OPEN_MESSAGE) json_object_set_new(v, "logprobs", json_array());
    return event(x, s, kind == OPEN_MESSAGE ? "response.output_text.delta"
                                            : "response.reasoning_text.delta", v);
}

/* A complete tool call: its item, its arguments in one delta, done. */
static atlas_status stream_call(out_ctx *x, sse *s, const json_t *call) {
    ATLAS_TRY(close_item(x, s));
    json_t *item = call_item(x, call, "in_progress");
    const char *args = json_string_value(json_object_get(item, "arguments"));
    json_t *full = json_string(args ? args : "{}");
    if (item) json_object_set_new(item, "arguments", json_string(""));
    ATLAS_TRY(item_added(x, s, item));
    json_t *v = at_item(x, false);
    if (v) json_object_set(v, "delta", full);
    ATLAS_TRY(event(x, s, "response.function_call_arguments.delta", v));
    json_object_set(item, "arguments", full);
    json_object_set_new(item, "status", json_string("completed"));
    v = at_item(x, false);
    if (v) json_object_set_new(v, "arguments", full), full = NULL;
    if (v) json_object_set(v, "name", json_object_get(item, "name"));
    json_decref(full);
    ATLAS_TRY(event(x, s, "response.function_call_arguments.done", v));
    return event(x, s, "response.output_item.done",
                 json_pack("{s:I, s:O}", "output_index",
                           (json_int_t)json_array_size(x->output) - 1, "item", item));
}

/* The end: what is open closed, an empty message when the reply made no item at all, then
 * response.completed or .incomplete with the whole object. */
static atlas_status stream_end(out_ctx *x, sse *s) {
    ATLAS_TRY(close_item(x, s));
    bool any_text = false;
    size_t i;
    json_t *it;
    json_array_foreach(x->output, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!strcmp(type, "message") || !strcmp(type, "function_call")) any_text = true;
    }
    if (!any_text) {
        ATLAS_TRY(open_item(x, s, OPEN_MESSAGE));
        ATLAS_TRY(close_item(x, s));
    }
    const char *status = final_status(x);
    json_t *r = finish(x, status);
    return event(x, s, !strcmp(status, "completed") ? "response.completed"
                                                    : "response.incomplete",
                 r ? json_pack("{s:o}", "response", r) : NULL);
}

/* A chat error object {"error": {"message", "code", ...}} as response.failed. */
static atlas_status stream_failed(out_ctx *x, sse *s, const json_t *err) {
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    json_t *r = response_object(x, "failed",
                                json_pack("{s:s, s:s}", "code", code ? code : "server_error",
                                          "message", msg ? msg : "the response failed"));
    return event(x, s, "response.failed", r ? json_pack("{s:o}", "response", r) : NULL);
}

/* The gen's stream bytes, where the events go. */
static sse stream_of(atlas_gen *g) { return (sse){&g->out, &g->out_len, &g->out_cap}; }

static atlas_status responses_begin(atlas_gen *g) {
    out_ctx *x = g->o.dialect_ctx;
    sse s = stream_of(g);
    json_t *r = response_object(x, "in_progress", NULL);
    ATLAS_TRY(event(x, &s, "response.created", r ? json_pack("{s:O}", "response", r) : NULL));
    return event(x, &s, "response.in_progress", r ? json_pack("{s:o}", "response", r) : NULL);
}

static atlas_status responses_piece(atlas_gen *g, const atlas_gen_piece *p) {
    out_ctx *x = g->o.dialect_ctx;
    sse s = stream_of(g);
    ATLAS_TRY(stream_text(x, &s, OPEN_REASONING, p->reasoning));
    ATLAS_TRY(stream_text(x, &s, OPEN_MESSAGE, p->text));
    size_t i;
    json_t *call;
    json_array_foreach(p->calls, i, call) ATLAS_TRY(stream_call(x, &s, call));
    return ATLAS_OK;
}

static atlas_status responses_end(atlas_gen *g) {
    out_ctx *x = g->o.dialect_ctx;
    sse s = stream_of(g);
    snprintf(x->finish, sizeof x->finish, "%s",
             g->finish == ATLAS_FINISH_LENGTH ? "length" : "stop");
    json_decref(x->usage);
    x->usage = atlas_gen_format_usage(g);
    return stream_end(x, &s);
}

/* OpenAI's error object {"error": {"message", "code", ...}} as response.failed. */
static atlas_status responses_error(atlas_gen *g, atlas_http_reply *err, const char *why) {
    sse s = stream_of(g);
    json_t *v = err->body ? json_loads(err->body, 0, NULL) : NULL;
    json_t *e = json_object_get(v, "error");
    if (!e) e = json_pack("{s:s}", "message", why);
    else json_incref(e);
    json_decref(v);
    atlas_status st = stream_failed(g->o.dialect_ctx, &s, e);
    json_decref(e);
    return st;
}

static json_t *responses_response(atlas_gen *g) {
    json_t *completion = atlas_gen_format_openai(g);
    return completion ? whole(g->o.dialect_ctx, completion) : NULL;
}

static const atlas_gen_dialect responses = {.begin = responses_begin,
                                            .piece = responses_piece,
                                            .end = responses_end,
                                            .error = responses_error,
                                            .response = responses_response,
                                            .free = ctx_free};

atlas_status atlas_responses_dialect(atlas_respstore *store, const char *id, json_t *echo,
                                     json_t *input, json_t *history, atlas_gen_opts *o) {
    out_ctx *x = calloc(1, sizeof *x);
    if (x) {
        x->echo = echo, x->input = input, x->history = history;
        x->output = json_array();
    } else {
        json_decref(echo);
        json_decref(input);
        json_decref(history);
    }
    if (!x || !x->output || !echo || !input || !history) {
        ctx_free(x);
        return atlas_fail(ATLAS_ERR_NOMEM, "response: out of memory");
    }
    x->store = store;
    snprintf(x->id, sizeof x->id, "%s", id);
    o->dialect = &responses;
    o->dialect_ctx = x;
    return ATLAS_OK;
}
