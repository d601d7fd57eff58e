/* server/responses.c — POST /v1/responses as a chat request: "input" (a string or items),
 * "instructions", the conversation of "previous_response_id", function tools, "tool_choice",
 * "text.format" and the sampling fields become a /v1/chat/completions body that the chat
 * route prepares and runs (api.c), answered in the Responses dialect (responses_out.c); and
 * the stored responses' routes: GET and DELETE /v1/responses/{id}, GET .../input_items. */
#include "server/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api.h"
#include "server/errors.h"
#include "server/respstore.h"
#include "server/schema.h"
#include "atlas/constraint.h"

/* --- input items ------------------------------------------------------------------------- */

/* A message's content: a string, or text parts joined by newlines, into *text (malloc'd).
 * where names it in errors ("input[2].content"). */
static atlas_status content_text(const json_t *c, const char *where, char **text) {
    *text = NULL;
    if (json_is_string(c)) {
        *text = strdup(json_string_value(c));
        return *text ? ATLAS_OK : atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory");
    }
    if (!json_is_array(c))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a string or an array of parts", where);
    size_t len = 0, cap = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *t = json_object_get(part, type && !strcmp(type, "refusal") ? "refusal"
                                                                                 : "text");
        bool ok = type && (!strcmp(type, "input_text") || !strcmp(type, "output_text") ||
                           !strcmp(type, "text") || !strcmp(type, "refusal"));
        if (!ok || !json_is_string(t)) {
            free(*text);
            *text = NULL;
            return atlas_fail(ATLAS_ERR_INVALID, "'%s[%zu]': a part of type '%.40s' is not "
                                                 "supported: atlas reads text parts "
                                                 "(input_text, output_text) only",
                              where, k, type ? type : "(none)");
        }
        if (atlas_buf_printf(text, &len, &cap, "%s%s", k ? "\n" : "", json_string_value(t))) {
            free(*text);
            *text = NULL;
            return atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory");
        }
    }
    if (!*text && !(*text = strdup(""))) return atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory");
    return ATLAS_OK;
}

/* A string field an item must have. */
static atlas_status need_string(const json_t *item, const char *key, const char *where) {
    if (json_is_string(json_object_get(item, key))) return ATLAS_OK;
    return atlas_fail(ATLAS_ERR_INVALID, "'%s.%s' must be a string", where, key);
}

/* Checks one input item, which the conversion below then reads without checking. */
static atlas_status check_item(const json_t *item, const char *where) {
    if (!json_is_object(item))
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be an object", where);
    const char *type = json_string_value(json_object_get(item, "type"));
    char sub[64];
    if (!type || !strcmp(type, "message")) {
        const char *role = json_string_value(json_object_get(item, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "system") && strcmp(role, "developer")))
            return atlas_fail(ATLAS_ERR_INVALID, "'%s.role' must be \"user\", \"assistant\", "
                                                 "\"system\" or \"developer\"", where);
        char *text;
        snprintf(sub, sizeof sub, "%s.content", where);
        ATLAS_TRY(content_text(json_object_get(item, "content"), sub, &text));
        free(text);
        return ATLAS_OK;
    }
    if (!strcmp(type, "function_call")) {
        ATLAS_TRY(need_string(item, "call_id", where));
        ATLAS_TRY(need_string(item, "name", where));
        return need_string(item, "arguments", where);
    }
    if (!strcmp(type, "function_call_output")) {
        ATLAS_TRY(need_string(item, "call_id", where));
        char *text;
        snprintf(sub, sizeof sub, "%s.output", where);
        ATLAS_TRY(content_text(json_object_get(item, "output"), sub, &text));
        free(text);
        return ATLAS_OK;
    }
    if (!strcmp(type, "reasoning")) { /* summary, content and encrypted_content: all optional */
        const json_t *c = json_object_get(item, "content"), *sm = json_object_get(item, "summary");
        if ((c && !json_is_array(c) && !json_is_null(c)) || (sm && !json_is_array(sm)))
            return atlas_fail(ATLAS_ERR_INVALID, "'%s': a reasoning item's 'summary' and "
                                                 "'content' must be arrays", where);
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_INVALID, "'%s': items of type '%.40s' are not supported "
                                         "(message, function_call, function_call_output, "
                                         "reasoning)", where, type);
}

/* "input" as a list of items (a string is one user message), each checked and given an id
 * when it has none (input_items lists them by id). */
static atlas_status input_items(const json_t *in, const char *rid, json_t **items) {
    *items = NULL;
    json_t *list = json_is_string(in)
                       ? json_pack("[{s:s, s:s, s:[{s:s, s:O}]}]", "type", "message", "role",
                                   "user", "content", "type", "input_text", "text", in)
                       : json_is_array(in) ? json_deep_copy(in) : NULL;
    if (!json_is_string(in) && !json_is_array(in))
        return atlas_fail(ATLAS_ERR_INVALID, "'input' must be a string or an array of items");
    if (!list) return atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory");
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        atlas_status st = check_item(item, where);
        if (st != ATLAS_OK) {
            json_decref(list);
            return st;
        }
        if (!json_object_get(item, "type")) json_object_set_new(item, "type", json_string("message"));
        const json_t *c = json_object_get(item, "content");
        if (json_is_string(c)) /* listed as OpenAI lists them: as parts */
            json_object_set_new(item, "content",
                                json_pack("[{s:s, s:O}]", "type",
                                          strcmp(json_string_value(json_object_get(item, "role")),
                                                 "assistant") ? "input_text" : "output_text",
                                          "text", c));
        if (!json_is_string(json_object_get(item, "id")))
            json_object_set_new(item, "id", json_sprintf("in_%s_%zu", rid + 5, i));
    }
    *items = list;
    return ATLAS_OK;
}

/* --- items -> chat messages ---------------------------------------------------------------- */

/* A reasoning item's text: its reasoning_text content, else its summary (an item that
 * carries only encrypted_content, made by another server, has none to give back). */
static atlas_status reasoning_text(const json_t *item, char **text) {
    const json_t *c = json_object_get(item, "content");
    if (!json_array_size(c)) c = json_object_get(item, "summary");
    size_t len = 0, cap = 0, k;
    json_t *part;
    *text = NULL;
    json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        if (t && atlas_buf_printf(text, &len, &cap, "%s%s", len ? "\n" : "", t)) {
            free(*text);
            return atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory");
        }
    }
    return ATLAS_OK;
}

/* The assistant message that reasoning, text and calls of one turn gather into: the last
 * message when it is the assistant's and can still take what comes (reasoning only before
 * its text and calls, text only before its calls), else a new one. */
static json_t *assistant(json_t *msgs, const char *adding) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    bool has_text = json_string_length(json_object_get(last, "content")) > 0;
    bool has_calls = json_object_get(last, "tool_calls") != NULL;
    bool has_reasoning = json_object_get(last, "reasoning_content") != NULL;
    bool fits = role && !strcmp(role, "assistant") && !has_calls &&
                (!strcmp(adding, "tool_calls") ||
                 (!strcmp(adding, "content") && !has_text) ||
                 (!strcmp(adding, "reasoning") && !has_text && !has_reasoning));
    if (fits) return last;
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    if (m && json_array_append_new(msgs, m)) return NULL;
    return m;
}

static atlas_status add_item(json_t *msgs, const json_t *item) {
    const char *type = json_string_value(json_object_get(item, "type"));
    const char *role = json_string_value(json_object_get(item, "role"));
    char *text = NULL;
    json_t *m = NULL;
    int fail = 0;
    if (!type || !strcmp(type, "message")) {
        ATLAS_TRY(content_text(json_object_get(item, "content"), "input", &text));
        if (!strcmp(role, "assistant")) {
            m = assistant(msgs, "content");
            fail = !m || json_object_set_new(m, "content", json_string(text));
        } else {
            fail = json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content",
                                                         text));
        }
    } else if (!strcmp(type, "function_call")) {
        m = assistant(msgs, "tool_calls");
        json_t *calls = json_object_get(m, "tool_calls");
        if (m && !calls) json_object_set_new(m, "tool_calls", calls = json_array());
        fail = !calls || json_array_append_new(
                             calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                              json_object_get(item, "call_id"), "type",
                                              "function", "function", "name",
                                              json_object_get(item, "name"), "arguments",
                                              json_object_get(item, "arguments")));
    } else if (!strcmp(type, "function_call_output")) {
        ATLAS_TRY(content_text(json_object_get(item, "output"), "input", &text));
        fail = json_array_append_new(msgs, json_pack("{s:s, s:O, s:s}", "role", "tool",
                                                     "tool_call_id",
                                                     json_object_get(item, "call_id"),
                                                     "content", text));
    } else { /* reasoning: the chain of thought goes back where the template puts it */
        ATLAS_TRY(reasoning_text(item, &text));
        if (text) {
            m = assistant(msgs, "reasoning");
            fail = !m || json_object_set_new(m, "reasoning_content", json_string(text));
        }
    }
    free(text);
    return fail ? atlas_fail(ATLAS_ERR_NOMEM, "input: out of memory") : ATLAS_OK;
}

static atlas_status add_items(json_t *msgs, const json_t *items) {
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) ATLAS_TRY(add_item(msgs, item));
    return ATLAS_OK;
}

/* --- tools, tool_choice, text.format ----------------------------------------------------- */

/* Responses' flat function tools {"type": "function", "name", "parameters", "strict"} as
 * chat's {"type": "function", "function": {...}}; strict is true unless the tool says
 * otherwise, as OpenAI's Responses API has it. */
static atlas_status chat_tools(const json_t *tools, json_t *chat) {
    if (!tools || json_is_null(tools)) return ATLAS_OK;
    if (!json_is_array(tools)) return atlas_fail(ATLAS_ERR_INVALID, "'tools' must be an array");
    json_t *out = json_array();
    json_object_set_new(chat, "tools", out);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") != 0)
            return atlas_fail(ATLAS_ERR_INVALID, "'tools[%zu]': tools of type '%.40s' are not "
                                                 "supported: only \"function\"",
                              i, type ? type : "(none)");
        if (!json_is_string(json_object_get(t, "name")))
            return atlas_fail(ATLAS_ERR_INVALID, "'tools[%zu].name' must be a string", i);
        json_t *fn = json_deep_copy(t);
        json_object_del(fn, "type");
        if (!json_is_boolean(json_object_get(fn, "strict")))
            json_object_set_new(fn, "strict", json_true());
        if (!json_object_get(fn, "parameters"))
            json_object_set_new(fn, "parameters", json_pack("{s:s, s:{}}", "type", "object",
                                                            "properties"));
        if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
            return atlas_fail(ATLAS_ERR_NOMEM, "tools: out of memory");
    }
    return ATLAS_OK;
}

/* "auto", "none", "required", or {"type": "function", "name": N}. */
static atlas_status chat_tool_choice(const json_t *choice, json_t *chat) {
    if (!choice || json_is_null(choice)) return ATLAS_OK;
    if (json_is_string(choice)) return json_object_set(chat, "tool_choice", (json_t *)choice)
                                           ? atlas_fail(ATLAS_ERR_NOMEM, "out of memory")
                                           : ATLAS_OK;
    const char *type = json_string_value(json_object_get(choice, "type"));
    const json_t *name = json_object_get(choice, "name");
    if (!type || strcmp(type, "function") != 0 || !json_is_string(name))
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' must be \"auto\", \"none\", "
                                             "\"required\" or {\"type\": \"function\", "
                                             "\"name\": ...}");
    json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function",
                                                       "function", "name", name));
    return ATLAS_OK;
}

/* "text": {"format": {"type": "text" | "json_object" | "json_schema", "schema": S}} as chat's
 * response_format; the schema is checked here, so that its errors name text.format. */
static atlas_status chat_format(const json_t *text, json_t *chat, const char **param) {
    const json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f)) return ATLAS_OK;
    *param = "text.format";
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type)
        return atlas_fail(ATLAS_ERR_INVALID, "'text.format' must be an object with a string "
                                             "'type'");
    if (!strcmp(type, "json_schema")) {
        const json_t *schema = json_object_get(f, "schema");
        if (!json_is_object(schema))
            return atlas_fail(ATLAS_ERR_INVALID, "'text.format.schema' must be an object");
        atlas_constraint *c = NULL;
        ATLAS_TRY(atlas_schema_program(schema, "text.format.schema", &c));
        atlas_constraint_free(c);
        json_object_set_new(chat, "response_format",
                            json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema",
                                      "schema", schema));
    } else if (!strcmp(type, "json_object") || !strcmp(type, "text")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", type));
    } else {
        return atlas_fail(ATLAS_ERR_INVALID, "'text.format' of type '%.60s': the type must be "
                                             "\"text\", \"json_object\" or \"json_schema\"",
                          type);
    }
    *param = NULL;
    return ATLAS_OK;
}

/* --- the request ------------------------------------------------------------------------- */

/* Fields that mean the same in a chat body (atlas's and vLLM's sampling extensions too). */
static const char *const same_fields[] = {
    "model", "temperature", "top_p", "stream", "seed", "top_k", "min_p", "logit_bias",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "cache_salt",
    "chat_template_kwargs", NULL};

/* The chat fields a Responses request names otherwise. */
static const char *const renamed[][2] = {
    {"messages", "input"}, {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"}};
enum { N_RENAMED = sizeof renamed / sizeof renamed[0] };

/* What a chat failure's param is called in a Responses request. */
static const char *responses_param(const char *p) {
    if (!p) return NULL;
    for (int i = 0; i < N_RENAMED; i++)
        if (!strcmp(p, renamed[i][0])) return renamed[i][1];
    return p;
}

/* A chat failure st, its message's quoted chat field names ('messages') made the request's
 * own ('input'). */
static atlas_status responses_failure(atlas_status st) {
    char msg[1024], out[1024];
    snprintf(msg, sizeof msg, "%s", atlas_last_error());
    for (int i = 0; i < N_RENAMED; i++) {
        char from[40], to[40];
        snprintf(from, sizeof from, "'%s", renamed[i][0]);
        snprintf(to, sizeof to, "'%s", renamed[i][1]);
        size_t o = 0, fl = strlen(from), tl = strlen(to);
        for (const char *p = msg; *p && o + 1 < sizeof out;) {
            bool name = !strncmp(p, from, fl) && (p[fl] == '\'' || p[fl] == '[' || p[fl] == '.');
            if (name && o + tl + 1 < sizeof out) {
                memcpy(out + o, to, tl);
                o += tl;
                p += fl;
            } else {
                out[o++] = *p++;
            }
        }
        out[o] = '\0';
        memcpy(msg, out, o + 1);
    }
    return atlas_fail(st, "%s", msg);
}

/* Features of OpenAI's service that atlas does not have, refused rather than ignored. */
static atlas_status refuse_unsupported(const json_t *req, const char **param) {
    bool background = false;
    ATLAS_TRY(atlas_param_bool(req, "background", &background, param));
    *param = "background";
    if (background)
        return atlas_fail(ATLAS_ERR_INVALID, "'background' responses are not supported: send "
                                             "the request with \"stream\": true instead");
    static const char *const none[] = {"conversation", "prompt", NULL};
    for (int i = 0; none[i]; i++) {
        const json_t *v = json_object_get(req, none[i]);
        *param = none[i];
        if (v && !json_is_null(v))
            return atlas_fail(ATLAS_ERR_INVALID, "'%s' is not supported: send the "
                                                 "conversation as 'input' or continue it with "
                                                 "'previous_response_id'", none[i]);
    }
    /* asked for and not given, these would change what the client gets without a word */
    const json_t *top = json_object_get(req, "top_logprobs");
    *param = "top_logprobs";
    if (top && !json_is_null(top) && !(json_is_integer(top) && json_integer_value(top) == 0))
        return atlas_fail(ATLAS_ERR_INVALID, "'top_logprobs' is not supported on /v1/responses: "
                                             "use /v1/chat/completions' logprobs");
    const json_t *calls = json_object_get(req, "max_tool_calls");
    *param = "max_tool_calls";
    if (calls && !json_is_null(calls))
        return atlas_fail(ATLAS_ERR_INVALID, "'max_tool_calls' is not supported: a reply makes "
                                             "the calls its model writes");
    *param = NULL;
    return ATLAS_OK;
}

/* The request's fields that its response object repeats, with OpenAI's defaults. */
static json_t *echo_fields(const json_t *req, bool store) {
    json_t *e = json_pack("{s:I, s:o, s:o, s:o, s:f, s:f, s:o, s:s, s:o, s:b, s:o, s:o, s:s,"
                          " s:o, s:o}",
                          "created_at", (json_int_t)time(NULL), "instructions", json_null(),
                          "max_output_tokens", json_null(), "previous_response_id", json_null(),
                          "temperature", 1.0, "top_p", 1.0, "tools", json_array(),
                          "tool_choice", "auto", "text",
                          json_pack("{s:{s:s}}", "format", "type", "text"),
                          "parallel_tool_calls", 1, "metadata", json_object(), "reasoning",
                          json_pack("{s:n, s:n}", "effort", "summary"), "truncation",
                          "disabled", "user", json_null(), "store", json_boolean(store));
    static const char *const kept[] = {"instructions", "max_output_tokens",
                                       "previous_response_id", "temperature", "top_p", "tools",
                                       "tool_choice", "text", "parallel_tool_calls", "metadata",
                                       "reasoning", "truncation", "user", NULL};
    for (int i = 0; e && kept[i]; i++) {
        const json_t *v = json_object_get(req, kept[i]);
        if (v && !json_is_null(v)) json_object_set_new(e, kept[i], json_deep_copy(v));
    }
    return e;
}

/* The chat body for req: its messages are the instructions, the conversation that
 * previous_response_id ended (*history) and the input items (*input). */
static atlas_status chat_body(atlas_server *s, const json_t *req, const char *rid, json_t *chat,
                              json_t **input, json_t **history, const char **param) {
    const char *instructions = NULL, *prev = NULL;
    ATLAS_TRY(atlas_param_string(req, "instructions", &instructions, param));
    ATLAS_TRY(atlas_param_string(req, "previous_response_id", &prev, param));
    *param = "previous_response_id";
    if (prev && atlas_respstore_get(s->responses, prev, NULL, NULL, history) != ATLAS_OK)
        return atlas_fail(ATLAS_ERR_INVALID, "previous response '%.100s' is not stored (it "
                                             "was made with \"store\": false, deleted, or "
                                             "is older than atlas serve --responses-ttl)", prev);
    if (!prev && !(*history = json_array())) return atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    *param = "input";
    const json_t *in = json_object_get(req, "input");
    if (!in || json_is_null(in)) return atlas_fail(ATLAS_ERR_INVALID, "'input' is required");
    ATLAS_TRY(input_items(in, rid, input));
    json_t *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    if (instructions)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                              instructions));
    ATLAS_TRY(add_items(msgs, *history));
    ATLAS_TRY(add_items(msgs, *input));
    for (int i = 0; same_fields[i]; i++) {
        json_t *v = json_object_get(req, same_fields[i]);
        if (v) json_object_set(chat, same_fields[i], v);
    }
    const json_t *max = json_object_get(req, "max_output_tokens");
    if (max) json_object_set(chat, "max_tokens", (json_t *)max);
    *param = "tools";
    ATLAS_TRY(chat_tools(json_object_get(req, "tools"), chat));
    *param = "tool_choice";
    ATLAS_TRY(chat_tool_choice(json_object_get(req, "tool_choice"), chat));
    *param = "text";
    const json_t *text = json_object_get(req, "text");
    if (text && !json_is_null(text) && !json_is_object(text))
        return atlas_fail(ATLAS_ERR_INVALID, "'text' must be an object");
    ATLAS_TRY(chat_format(text, chat, param));
    *param = NULL;
    return ATLAS_OK;
}

/* "resp_" and 32 hex digits: a counter and the clock, as the chat ids. */
static void new_id(atlas_server *s, char *id, size_t cap) {
    uint64_t n = atomic_fetch_add(&s->next_id, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id, cap, "resp_%016llx%016llx", (unsigned long long)n,
             (unsigned long long)((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^
                                  (uint64_t)ts.tv_sec));
}

void atlas_responses_create(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r) {
    (void)arg;
    atlas_server *s = call->ctx;
    const char *param = NULL;
    char id[48];
    new_id(s, id, sizeof id);
    bool store = true;
    json_t *chat = json_object(), *input = NULL, *history = NULL;
    atlas_api_chat_req q;
    memset(&q, 0, sizeof q);
    atlas_status st = chat ? refuse_unsupported(body, &param)
                           : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
    if (st == ATLAS_OK) st = atlas_param_bool(body, "store", &store, &param);
    if (st == ATLAS_OK) st = chat_body(s, body, id, chat, &input, &history, &param);
    if (st == ATLAS_OK) {
        st = atlas_api_chat_prepare(s, chat, &q, &param);
        if (st != ATLAS_OK) st = responses_failure(st);
        param = responses_param(param);
    }
    if (st == ATLAS_OK) {
        json_t *echo = echo_fields(body, store);
        if (echo) json_object_set_new(echo, "model", json_string(q.model));
        st = atlas_responses_dialect(store ? s->responses : NULL, id, echo, input, history,
                                     &q.o);
        input = history = NULL; /* taken */
    }
    if (st == ATLAS_OK) atlas_api_chat_start(call, &q, r);
    else atlas_api_error_fail(r, st, param);
    atlas_api_chat_req_free(&q);
    json_decref(chat);
    json_decref(input);
    json_decref(history);
}

/* --- the stored responses ------------------------------------------------------------------ */

/* 404 in OpenAI's shape for a response id that is not stored. */
static void not_stored(atlas_http_reply *r, const char *id) {
    char msg[200];
    snprintf(msg, sizeof msg, "no response with id '%.100s' is stored", id);
    atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_INVALID, NULL, msg);
    r->status = 404;
}

void atlas_responses_get(atlas_http_call *call, json_t *body, const char *arg,
                         atlas_http_reply *r) {
    (void)body;
    atlas_server *s = call->ctx;
    const char *stream = atlas_http_query(call, "stream");
    if (stream && !strcmp(stream, "true")) {
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_INVALID, "stream",
                              "a stored response is not streamed again: GET it whole");
        return;
    }
    json_t *resp;
    atlas_status st = atlas_respstore_get(s->responses, arg, &resp, NULL, NULL);
    if (st == ATLAS_ERR_NOT_FOUND) not_stored(r, arg);
    else if (st != ATLAS_OK) atlas_api_error_fail(r, st, NULL);
    else atlas_http_reply_json(r, 200, resp);
}

void atlas_responses_delete(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r) {
    (void)body;
    atlas_server *s = call->ctx;
    if (!atlas_respstore_delete(s->responses, arg)) {
        not_stored(r, arg);
        return;
    }
    atlas_http_reply_json(r, 200, json_pack("{s:s, s:s, s:b}", "id", arg, "object", "response",
                                            "deleted", 1));
}

/* The paging of a list: ?limit (1..100, default 20), ?order (asc, or desc: the default),
 * ?after (an item id: the items after it in that order). */
static atlas_status page(atlas_http_call *call, const json_t *items, json_t **out) {
    const char *lim = atlas_http_query(call, "limit"), *order = atlas_http_query(call, "order");
    const char *after = atlas_http_query(call, "after");
    char *end = NULL;
    long limit = lim ? strtol(lim, &end, 10) : 20;
    if ((lim && (*end || end == lim)) || limit < 1 || limit > 100)
        return atlas_fail(ATLAS_ERR_INVALID, "'limit' must be an integer in 1..100");
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        return atlas_fail(ATLAS_ERR_INVALID, "'order' must be \"asc\" or \"desc\"");
    bool desc = !order || !strcmp(order, "desc");
    size_t n = json_array_size(items), start = 0;
    if (after) {
        while (start < n && strcmp(json_string_value(json_object_get(
                                       json_array_get(items, desc ? n - 1 - start : start),
                                       "id")), after))
            start++;
        if (start == n)
            return atlas_fail(ATLAS_ERR_INVALID, "'after': no item '%.100s' in this list", after);
        start++;
    }
    json_t *data = json_array();
    for (size_t k = start; k < n && json_array_size(data) < (size_t)limit; k++)
        json_array_append(data, json_array_get(items, desc ? n - 1 - k : k));
    size_t got = json_array_size(data);
    *out = json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id",
                     json_object_get(json_array_get(data, 0), "id"), "last_id",
                     json_object_get(json_array_get(data, got ? got - 1 : 0), "id"), "has_more",
                     start + got < n);
    return *out ? ATLAS_OK : atlas_fail(ATLAS_ERR_NOMEM, "out of memory");
}

void atlas_responses_input_items(atlas_http_call *call, json_t *body, const char *arg,
                                 atlas_http_reply *r) {
    (void)body;
    atlas_server *s = call->ctx;
    json_t *input, *list = NULL;
    atlas_status st = atlas_respstore_get(s->responses, arg, NULL, &input, NULL);
    if (st == ATLAS_ERR_NOT_FOUND) {
        not_stored(r, arg);
        return;
    }
    if (st == ATLAS_OK) st = page(call, input, &list);
    if (st == ATLAS_OK) atlas_http_reply_json(r, 200, list);
    else atlas_api_error_fail(r, st, NULL);
    json_decref(input);
}
