/* server/anthropic.c — Anthropic's Messages API: the request translated to an OpenAI chat
 * body (then api.c's chat preparation), and the engine's events shaped as Anthropic's
 * message and stream events (a dialect of gen.h). */
#include "server/anthropic.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/tokenizer.h"
#include "server/api.h"
#include "server/errors.h"
#include "server/gen_internal.h"

/* --- the request ------------------------------------------------------------------------ */

static atlas_status oom(void) { return atlas_fail(ATLAS_ERR_NOMEM, "messages: out of memory"); }

/* A block type atlas does not serve, or one that does not belong where it is. */
static atlas_status bad_block(const char *where, const char *type) {
    if (type && (!strcmp(type, "image") || !strcmp(type, "document")))
        return atlas_fail(ATLAS_ERR_INVALID, "%s: %s blocks are not supported: atlas serves "
                                             "text models", where, type);
    return atlas_fail(ATLAS_ERR_INVALID, "%s: a block of type '%.60s' is not supported here",
                      where, type ? type : "(none)");
}

/* Appends text to *acc (joined by newlines, as the chat route joins text parts). */
static atlas_status join(json_t **acc, const char *text) {
    if (!*acc) {
        *acc = json_string(text);
        return *acc ? ATLAS_OK : oom();
    }
    json_t *j = json_sprintf("%s\n%s", json_string_value(*acc), text);
    if (!j) return oom();
    json_decref(*acc);
    *acc = j;
    return ATLAS_OK;
}

/* A string, or an array of text blocks, as one string (*out, new; "" when empty). */
static atlas_status text_of(const json_t *c, const char *where, json_t **out) {
    *out = NULL;
    if (!c || json_is_string(c)) {
        *out = json_string(c ? json_string_value(c) : "");
        return *out ? ATLAS_OK : oom();
    }
    if (!json_is_array(c))
        return atlas_fail(ATLAS_ERR_INVALID, "%s must be a string or an array of blocks", where);
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        const char *text = json_string_value(json_object_get(b, "text"));
        if (!type || strcmp(type, "text") || !text) {
            char w[96];
            snprintf(w, sizeof w, "%s[%zu]", where, i);
            json_decref(*out);
            *out = NULL;
            return bad_block(w, type);
        }
        atlas_status st = join(out, text);
        if (st != ATLAS_OK) return st;
    }
    if (!*out && !(*out = json_string(""))) return oom();
    return ATLAS_OK;
}

/* One user message's blocks: tool results become "tool" messages (first, as Messages puts
 * them), the text one user message after them. */
static atlas_status user_blocks(const json_t *c, size_t m, json_t *msgs) {
    json_t *text = NULL;
    atlas_status st = ATLAS_OK;
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        char where[80];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", m, i);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (type && !strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
            st = join(&text, json_string_value(json_object_get(b, "text")));
        } else if (type && !strcmp(type, "tool_result")) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            json_t *content = NULL;
            char cw[96];
            snprintf(cw, sizeof cw, "%s.content", where);
            if (!id) st = atlas_fail(ATLAS_ERR_INVALID, "%s.tool_use_id must be a string", where);
            if (st == ATLAS_OK) st = text_of(json_object_get(b, "content"), cw, &content);
            if (st == ATLAS_OK &&
                json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "tool",
                                                      "tool_call_id", id, "content", content)))
                st = oom();
        } else {
            st = bad_block(where, type);
        }
        if (st != ATLAS_OK) break;
    }
    if (st == ATLAS_OK && text &&
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", text)))
        st = oom();
    json_decref(text);
    return st;
}

/* One assistant message's blocks: text, the thinking it showed (back into the prompt as the
 * template expects a reasoning_content), tool calls; redacted thinking has nothing to show. */
static atlas_status assistant_blocks(const json_t *c, size_t m, json_t *msgs) {
    json_t *text = NULL, *thinking = NULL, *calls = json_array();
    atlas_status st = calls ? ATLAS_OK : oom();
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        if (st != ATLAS_OK) break;
        char where[80];
        snprintf(where, sizeof where, "messages[%zu].content[%zu]", m, i);
        const char *type = json_string_value(json_object_get(b, "type"));
        const json_t *input = json_object_get(b, "input");
        if (type && !strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
            st = join(&text, json_string_value(json_object_get(b, "text")));
        } else if (type && !strcmp(type, "thinking") &&
                   json_is_string(json_object_get(b, "thinking"))) {
            st = join(&thinking, json_string_value(json_object_get(b, "thinking")));
        } else if (type && !strcmp(type, "redacted_thinking")) {
            continue;
        } else if (type && !strcmp(type, "tool_use")) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            if (!id || !name || (input && !json_is_object(input)))
                st = atlas_fail(ATLAS_ERR_INVALID, "%s: a tool_use block needs a string 'id' "
                                                   "and 'name' and an object 'input'", where);
            else if (json_array_append_new(
                         calls, json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", id, "type",
                                          "function", "function", "name", name, "arguments",
                                          input ? input : json_object())))
                st = oom();
        } else {
            st = bad_block(where, type);
        }
    }
    json_t *msg = NULL;
    if (st == ATLAS_OK && !(msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                            text ? json_incref(text) : json_string(""))))
        st = oom();
    if (st == ATLAS_OK && thinking) json_object_set(msg, "reasoning_content", thinking);
    if (st == ATLAS_OK && json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
    if (st == ATLAS_OK && json_array_append(msgs, msg)) st = oom();
    json_decref(msg);
    json_decref(text);
    json_decref(thinking);
    json_decref(calls);
    return st;
}

static atlas_status messages(const json_t *body, json_t *msgs) {
    const json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        json_t *text;
        ATLAS_TRY(text_of(sys, "system", &text));
        if (json_string_length(text) &&
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
                                                  text)))
            return oom();
        if (!json_string_length(text)) json_decref(text);
    }
    const json_t *in = json_object_get(body, "messages");
    if (!json_is_array(in) || json_array_size(in) == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "messages: must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(in, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        bool user = role && !strcmp(role, "user");
        if (!role || (!user && strcmp(role, "assistant")))
            return atlas_fail(ATLAS_ERR_INVALID, "messages[%zu].role must be \"user\" or "
                                                 "\"assistant\"", i);
        if (json_is_string(c)) {
            if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c)))
                return oom();
        } else if (json_is_array(c)) {
            ATLAS_TRY(user ? user_blocks(c, i, msgs) : assistant_blocks(c, i, msgs));
        } else {
            return atlas_fail(ATLAS_ERR_INVALID, "messages[%zu].content must be a string or an "
                                                 "array of content blocks", i);
        }
    }
    return ATLAS_OK;
}

/* Messages' tools ({name, description, input_schema}) as OpenAI function tools. */
static atlas_status tools(const json_t *in, json_t *out) {
    if (!in || json_is_null(in)) return ATLAS_OK;
    if (!json_is_array(in)) return atlas_fail(ATLAS_ERR_INVALID, "tools: must be an array");
    json_t *list = json_array();
    if (!list || json_object_set_new(out, "tools", list)) return oom();
    size_t i;
    json_t *t;
    json_array_foreach(in, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        const json_t *schema = json_object_get(t, "input_schema");
        if (type && strcmp(type, "custom"))
            return atlas_fail(ATLAS_ERR_INVALID, "tools[%zu]: the tool type '%.60s' (one "
                                                 "Anthropic runs itself) is not supported: "
                                                 "give a custom tool with an input_schema",
                              i, type);
        if (!name || (schema && !json_is_object(schema)))
            return atlas_fail(ATLAS_ERR_INVALID, "tools[%zu]: a tool needs a string 'name' and "
                                                 "an object 'input_schema'", i);
        json_t *fn = json_pack("{s:s, s:O}", "name", name, "parameters",
                               schema ? schema : json_object());
        const json_t *desc = json_object_get(t, "description");
        if (fn && json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
        if (fn && json_is_true(json_object_get(t, "strict")))
            json_object_set_new(fn, "strict", json_true());
        if (!fn || json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function",
                                                         "function", fn)))
            return oom();
    }
    return ATLAS_OK;
}

/* tool_choice {"type": auto | any | tool (with "name") | none}. */
static atlas_status tool_choice(const json_t *c, json_t *out) {
    if (!c || json_is_null(c)) return ATLAS_OK;
    const char *type = json_string_value(json_object_get(c, "type"));
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *v = NULL;
    if (type && !strcmp(type, "auto")) v = json_string("auto");
    else if (type && !strcmp(type, "any")) v = json_string("required");
    else if (type && !strcmp(type, "none")) v = json_string("none");
    else if (type && !strcmp(type, "tool") && name)
        v = json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name);
    else
        return atlas_fail(ATLAS_ERR_INVALID, "tool_choice: must be {\"type\": \"auto\"}, "
                                             "{\"type\": \"any\"}, {\"type\": \"none\"} or "
                                             "{\"type\": \"tool\", \"name\": ...}");
    return json_object_set_new(out, "tool_choice", v) ? oom() : ATLAS_OK;
}

/* thinking {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}: the template's
 * enable_thinking (Qwen3's switch; templates without one ignore it). */
static atlas_status thinking(const json_t *t, json_t *out) {
    if (!t || json_is_null(t)) return ATLAS_OK;
    const char *type = json_string_value(json_object_get(t, "type"));
    const json_t *budget = json_object_get(t, "budget_tokens");
    bool on = type && !strcmp(type, "enabled");
    if (!type || (!on && strcmp(type, "disabled")))
        return atlas_fail(ATLAS_ERR_INVALID, "thinking: 'type' must be \"enabled\" or "
                                             "\"disabled\"");
    if (on && (!json_is_integer(budget) || json_integer_value(budget) < 1))
        return atlas_fail(ATLAS_ERR_INVALID, "thinking.budget_tokens: must be a positive "
                                             "integer");
    return json_object_set_new(out, "chat_template_kwargs",
                               json_pack("{s:b}", "enable_thinking", on))
               ? oom()
               : ATLAS_OK;
}

/* The sampling fields, checked by the chat route's own parser under the same names. */
static atlas_status sampling(const json_t *body, bool count, json_t *out) {
    /* Messages' own, and atlas's sampling extensions of the chat route (seed for
     * reproducible answers, logit_bias, min_p) */
    static const char *const same[] = {"model", "temperature", "top_p", "top_k", "stream",
                                       "seed", "logit_bias", "min_p"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        json_t *v = json_object_get(body, same[i]);
        if (v && json_object_set(out, same[i], v)) return oom();
    }
    const json_t *max = json_object_get(body, "max_tokens");
    if (!count && !json_is_integer(max))
        return atlas_fail(ATLAS_ERR_INVALID, "max_tokens: a required integer");
    if (!count && json_object_set(out, "max_tokens", (json_t *)max)) return oom();
    if (count) json_object_del(out, "stream");
    const json_t *stop = json_object_get(body, "stop_sequences");
    if (!stop || json_is_null(stop)) return ATLAS_OK;
    size_t i;
    json_t *s;
    json_array_foreach(stop, i, s) {
        if (!json_is_string(s))
            return atlas_fail(ATLAS_ERR_INVALID, "stop_sequences[%zu]: must be a string", i);
    }
    if (!json_is_array(stop))
        return atlas_fail(ATLAS_ERR_INVALID, "stop_sequences: must be an array of strings");
    return json_array_size(stop) && json_object_set(out, "stop", (json_t *)stop) ? oom()
                                                                                  : ATLAS_OK;
}

atlas_status atlas_anthropic_to_chat(const json_t *body, bool count, json_t **out) {
    json_t *o = json_pack("{s:[]}", "messages");
    if (!o) return oom();
    atlas_status st = messages(body, json_object_get(o, "messages"));
    /* an assistant message last is a prefill: the reply continues it, as Anthropic's does */
    const json_t *msgs = json_object_get(o, "messages"), *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (st == ATLAS_OK && role && !strcmp(role, "assistant") &&
        json_object_set_new(o, "continue_final_message", json_true()))
        st = oom();
    if (st == ATLAS_OK) st = tools(json_object_get(body, "tools"), o);
    if (st == ATLAS_OK) st = tool_choice(json_object_get(body, "tool_choice"), o);
    if (st == ATLAS_OK) st = thinking(json_object_get(body, "thinking"), o);
    if (st == ATLAS_OK) st = sampling(body, count, o);
    if (st != ATLAS_OK) {
        json_decref(o);
        o = NULL;
    }
    *out = o;
    return st;
}

/* A tag's ids as the tokenizer writes it (one id where the tag is an added token, as Qwen3's
 * are); more than the engine follows leaves the budget unenforceable, an error here. */
static atlas_status tag_ids(const atlas_tokenizer *tok, const char *tag, int32_t *out,
                            int *n) {
    int32_t *ids = NULL;
    size_t k = 0;
    ATLAS_TRY(atlas_tokenizer_encode(tok, tag, strlen(tag), false, &ids, &k));
    atlas_status st = ATLAS_OK;
    if (k < 1 || k > ATLAS_ENGINE_MAX_THINK_IDS)
        st = atlas_fail(ATLAS_ERR_INVALID, "thinking.budget_tokens: the model writes '%s' as "
                        "%zu tokens, at most %d can be followed", tag, k,
                        ATLAS_ENGINE_MAX_THINK_IDS);
    else memcpy(out, ids, k * sizeof *ids);
    *n = (int)k;
    free(ids);
    return st;
}

/* thinking.budget_tokens (checked by thinking() above) as the engine's think budget, on a
 * reply the reasoning splitter reads as a think block, or on a Harmony reply's analysis
 * message (closed by the header of the final one); where a constraint decides the reply
 * there is no block to close. */
static atlas_status think_budget(const json_t *body, atlas_api_chat_req *q,
                                 const char **param) {
    const json_t *t = json_object_get(body, "thinking");
    json_int_t budget = json_integer_value(json_object_get(t, "budget_tokens"));
    const char *type = json_string_value(json_object_get(t, "type"));
    bool harmony = q->o.harmony;
    if (!type || strcmp(type, "enabled") || budget < 1 || !(q->o.reasoning || harmony) ||
        q->gp.constraint)
        return ATLAS_OK;
    *param = "thinking.budget_tokens";
    atlas_gen_params *gp = &q->gp;
    ATLAS_TRY(tag_ids(q->tok, harmony ? "<|channel|>analysis<|message|>" : "<think>",
                      gp->think_open, &gp->n_think_open));
    ATLAS_TRY(tag_ids(q->tok, harmony ? "<|end|><|start|>assistant<|channel|>final<|message|>"
                                      : "</think>", gp->think_close, &gp->n_think_close));
    *param = NULL;
    gp->think_budget = budget < INT32_MAX ? (int)budget : INT32_MAX;
    gp->think_inside = q->o.reasoning_inside;
    return ATLAS_OK;
}

/* --- the answer ------------------------------------------------------------------------- */

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING };

/* A stream's state: the content block open, the next block's index, and the thinking's
 * signature so far. */
typedef struct anthropic_stream {
    int open;
    int index;
    uint64_t sig;
} anthropic_stream;

/* A thinking block's signature: Messages asks one for every block, for the client to send
 * back; atlas has nothing to verify with it, so it is a hash (FNV-1a) of the text, and one
 * sent back is accepted unread. */
static uint64_t fnv(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}
static const uint64_t FNV_BASIS = 0xcbf29ce484222325ull;

static json_t *signature(uint64_t h) {
    return json_sprintf("atlas-%016llx", (unsigned long long)h);
}

static json_t *message_id(const atlas_gen *g) {
    const char *dash = strchr(g->id, '-');
    return json_sprintf("msg_%s", dash ? dash + 1 : g->id);
}

static const char *stop_reason(const atlas_gen *g) {
    if (g->finish == ATLAS_FINISH_LENGTH) return "max_tokens";
    if (g->n_calls > 0) return "tool_use";
    return g->stop_string ? "stop_sequence" : "end_turn";
}

/* Prefix-cache hits are Messages' cache reads; input_tokens counts the rest, as there. */
static json_t *usage(const atlas_gen *g, int prompt, int cached) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", prompt - cached, "output_tokens",
                     g->usage.completion_tokens, "cache_read_input_tokens", cached,
                     "cache_creation_input_tokens", 0);
}

/* A parsed tool call ({"id", "function": {"name", "arguments": JSON text}}) as a tool_use
 * block; its input is {} until filled (streaming sends it as a delta). */
static json_t *tool_block(const json_t *call, bool with_input) {
    const json_t *fn = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *input = with_input && args ? json_loads(args, 0, NULL) : NULL;
    if (!json_is_object(input)) {
        json_decref(input);
        input = json_object();
    }
    return json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id",
                     json_object_get(call, "id"), "name", json_object_get(fn, "name"), "input",
                     input);
}

/* start: message_start's, whose usage is the prompt's as the end reports it (cached and
 * computed; a client may read input usage there alone). */
static json_t *message(const atlas_gen *g, json_t *content, bool start) {
    int cached = start ? g->start_usage.cached_tokens : g->usage.cached_tokens;
    return json_pack("{s:o, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", message_id(g), "type",
                     "message", "role", "assistant", "model", g->model, "content", content,
                     "stop_reason", start ? json_null() : json_string(stop_reason(g)),
                     "stop_sequence",
                     !start && g->stop_string ? json_string(g->stop_string) : json_null(),
                     "usage", usage(g, !start                       ? g->usage.prompt_tokens
                                       : g->start_usage.prompt_tokens ? g->start_usage.prompt_tokens
                                                                      : g->prompt_tokens,
                                    cached));
}

static json_t *anthropic_response(atlas_gen *g) {
    json_t *content = json_array();
    if (g->reasoning_len)
        json_array_append_new(content,
                              json_pack("{s:s, s:o, s:o}", "type", "thinking", "thinking",
                                        atlas_json_text(g->reasoning, g->reasoning_len),
                                        "signature",
                                        signature(fnv(FNV_BASIS, g->reasoning,
                                                      g->reasoning_len))));
    if (g->text_len)
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 atlas_json_text(g->text, g->text_len)));
    size_t i;
    json_t *c;
    json_array_foreach(g->calls, i, c) json_array_append_new(content, tool_block(c, true));
    return message(g, content, false);
}

/* One SSE event: "event: TYPE" and its data (v, with its "type"). */
static atlas_status sse(atlas_gen *g, const char *type, json_t *v) {
    json_t *o = json_pack("{s:s}", "type", type); /* first, as Anthropic writes it */
    if (!v || !o || json_object_update(o, v)) {
        json_decref(v);
        json_decref(o);
        return oom();
    }
    json_decref(v);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    int rc = s ? atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "event: %s\ndata: %s\n\n",
                                  type, s)
               : -1;
    free(s);
    return rc ? oom() : ATLAS_OK;
}

static atlas_status close_block(atlas_gen *g, anthropic_stream *a) {
    if (a->open == BLOCK_NONE) return ATLAS_OK;
    if (a->open == BLOCK_THINKING)
        ATLAS_TRY(sse(g, "content_block_delta",
                      json_pack("{s:i, s:{s:s, s:o}}", "index", a->index, "delta", "type",
                                "signature_delta", "signature", signature(a->sig))));
    a->open = BLOCK_NONE;
    return sse(g, "content_block_stop", json_pack("{s:i}", "index", a->index++));
}

/* A delta of text or thinking, opening its block first when another one is open. */
static atlas_status delta(atlas_gen *g, anthropic_stream *a, int kind, const char *s) {
    size_t n = strlen(s);
    if (!n) return ATLAS_OK;
    bool think = kind == BLOCK_THINKING;
    if (a->open != kind) {
        ATLAS_TRY(close_block(g, a));
        json_t *block = think ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
                                          "signature", "")
                              : json_pack("{s:s, s:s}", "type", "text", "text", "");
        ATLAS_TRY(sse(g, "content_block_start",
                      json_pack("{s:i, s:o}", "index", a->index, "content_block", block)));
        a->open = kind;
        a->sig = FNV_BASIS;
    }
    if (think) a->sig = fnv(a->sig, s, n);
    return sse(g, "content_block_delta",
               json_pack("{s:i, s:{s:s, s:o}}", "index", a->index, "delta", "type",
                         think ? "thinking_delta" : "text_delta", think ? "thinking" : "text",
                         atlas_json_text(s, n)));
}

/* A completed tool call: its own block, the input as one input_json_delta. */
static atlas_status tool_use(atlas_gen *g, anthropic_stream *a, const json_t *call) {
    ATLAS_TRY(close_block(g, a));
    ATLAS_TRY(sse(g, "content_block_start",
                  json_pack("{s:i, s:o}", "index", a->index, "content_block",
                            tool_block(call, false))));
    json_t *b = tool_block(call, true);
    char *js = b ? json_dumps(json_object_get(b, "input"), JSON_COMPACT | JSON_PRESERVE_ORDER)
                 : NULL;
    json_decref(b);
    atlas_status st = js ? sse(g, "content_block_delta",
                               json_pack("{s:i, s:{s:s, s:s}}", "index", a->index, "delta",
                                         "type", "input_json_delta", "partial_json", js))
                         : oom();
    free(js);
    if (st != ATLAS_OK) return st;
    return sse(g, "content_block_stop", json_pack("{s:i}", "index", a->index++));
}

/* The stream's start: the message with no content yet, then a ping, as Anthropic sends. */
static atlas_status anthropic_begin(atlas_gen *g) {
    ATLAS_TRY(sse(g, "message_start", json_pack("{s:o}", "message",
                                                message(g, json_array(), true))));
    return sse(g, "ping", json_object());
}

static atlas_status anthropic_piece(atlas_gen *g, const atlas_gen_piece *p) {
    anthropic_stream *a = g->o.dialect_ctx;
    ATLAS_TRY(delta(g, a, BLOCK_THINKING, p->reasoning));
    ATLAS_TRY(delta(g, a, BLOCK_TEXT, p->text));
    size_t i;
    json_t *c;
    json_array_foreach(p->calls, i, c) ATLAS_TRY(tool_use(g, a, c));
    return ATLAS_OK;
}

static atlas_status anthropic_end(atlas_gen *g) {
    ATLAS_TRY(close_block(g, g->o.dialect_ctx));
    json_t *u = usage(g, g->usage.prompt_tokens, g->usage.cached_tokens);
    ATLAS_TRY(sse(g, "message_delta",
                  json_pack("{s:{s:s, s:o}, s:o}", "delta", "stop_reason", stop_reason(g),
                            "stop_sequence",
                            g->stop_string ? json_string(g->stop_string) : json_null(),
                            "usage", u)));
    return sse(g, "message_stop", json_object());
}

/* An error event ends the stream (Messages has no [DONE]). */
static atlas_status anthropic_error(atlas_gen *g, atlas_http_reply *err, const char *why) {
    (void)why;
    atlas_api_error_to_anthropic(err);
    return atlas_buf_printf(&g->out, &g->out_len, &g->out_cap, "event: error\ndata: %s\n\n",
                            err->body ? err->body : "{}")
               ? oom()
               : ATLAS_OK;
}

static const atlas_gen_dialect anthropic = {.begin = anthropic_begin,
                                            .piece = anthropic_piece,
                                            .end = anthropic_end,
                                            .error = anthropic_error,
                                            .response = anthropic_response,
                                            .free = free};

/* --- the routes ------------------------------------------------------------------------- */

void atlas_api_messages(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r) {
    (void)arg;
    const char *param = NULL;
    json_t *chat = NULL;
    atlas_api_chat_req q = {0};
    atlas_status st = atlas_anthropic_to_chat(body, false, &chat);
    if (st == ATLAS_OK) st = atlas_api_chat_prepare(call->ctx, chat, &q, &param);
    if (st == ATLAS_OK) st = think_budget(body, &q, &param);
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, param);
    } else {
        q.o.dialect = &anthropic;
        if (!(q.o.dialect_ctx = calloc(1, sizeof(anthropic_stream))))
            atlas_api_error_fail(r, oom(), NULL);
        else atlas_api_chat_start(call, &q, r);
    }
    atlas_api_chat_req_free(&q);
    json_decref(chat);
}

/* The prompt's tokens as /v1/messages would render them (tools and system included). */
void atlas_api_count_tokens(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r) {
    (void)arg;
    const char *param = NULL;
    json_t *chat = NULL;
    atlas_api_chat_req q = {0};
    atlas_status st = atlas_anthropic_to_chat(body, true, &chat);
    if (st == ATLAS_OK) st = atlas_api_chat_prepare(call->ctx, chat, &q, &param);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else atlas_http_reply_json(r, 200, json_pack("{s:I}", "input_tokens", (json_int_t)q.n));
    atlas_api_chat_req_free(&q);
    json_decref(chat);
}
