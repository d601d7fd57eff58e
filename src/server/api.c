/* server/api.c — POST /v1/chat/completions and POST /v1/completions: request JSON -> chat
 * template -> token ids -> engine, answered whole or streamed (gen.c, format.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/harmony.h"
#include "atlas/reasoning.h"
#include "atlas/shield.h"
#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "server/api.h"
#include "server/errors.h"
#include "server/gen.h"
#include "server/schema.h"

/* --- model lookup, shared with api_misc.c --------------------------------------------- */

atlas_status atlas_api_model(atlas_server *s, const json_t *body, const char *name_or_null,
                             const char **name, const char **param) {
    const char *want = name_or_null;
    if (!want && body) ATLAS_TRY(atlas_param_string(body, "model", &want, param));
    atlas_engine_model_status ms[64];
    int n = atlas_engine_models(s->engine, ms, 64);
    if (n > 64) n = 64;
    if (n == 0) return atlas_fail(ATLAS_ERR_NOT_FOUND, "the server has no model");
    if (!want) { /* OpenAI requires "model"; with one obvious default, take it */
        *name = ms[0].name;
        return ATLAS_OK;
    }
    const char *target = atlas_api_alias(s, want);
    for (int pass = 0; pass < 2; pass++, want = target)
        for (int i = 0; want && i < n; i++)
            if (!strcmp(ms[i].name, want)) {
                *name = ms[i].name; /* valid while the engine lives */
                return ATLAS_OK;
            }
    want = name_or_null ? name_or_null : json_string_value(json_object_get(body, "model"));
    *param = "model";
    return atlas_fail(ATLAS_ERR_NOT_FOUND, "the model '%.200s' does not exist", want);
}

const char *atlas_api_alias(const atlas_server *s, const char *name) {
    for (int i = 0; i < s->n_aliases; i++) {
        const char *a = s->aliases[i], *eq = strchr(a, '=');
        size_t k = (size_t)(eq - a);
        bool prefix = k > 0 && a[k - 1] == '*'; /* "claude-*": every name it begins */
        if (prefix ? !strncmp(name, a, k - 1) : strlen(name) == k && !strncmp(name, a, k))
            return eq + 1;
    }
    return NULL;
}

/* The tool-call format of a model: the operator's, else from its template, else its
 * architecture. */
static atlas_toolcall_format tool_format(atlas_server *s, const char *model,
                                         const atlas_template *tmpl) {
    atlas_engine_model_status ms[64];
    int n = atlas_engine_models(s->engine, ms, 64);
    const char *arch = NULL; /* config.json's, as the engine read it */
    for (int i = 0; i < n && i < 64; i++) {
        if (strcmp(ms[i].name, model)) continue;
        atlas_toolcall_format f; /* checked by atlas_engine_create */
        if (ms[i].tool_call_format && atlas_toolcall_format_parse(ms[i].tool_call_format, &f) == ATLAS_OK)
            return f;
        if (ms[i].architecture[0]) arch = ms[i].architecture;
    }
    return atlas_toolcall_format_detect(tmpl ? atlas_template_source(tmpl) : NULL, arch);
}

/* --- messages ----------------------------------------------------------------------------- */

/* Tool-call arguments given as a JSON string holding an object become that object, as the
 * template would make them (atlas/template.h), but before the shield: parsed after it, a
 * \u003c in the string would spell a control token the shield never saw. */
static atlas_status parse_arguments(json_t *m) {
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
        json_t *fn = json_object_get(c, "function");
        const json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args)) continue;
        json_t *j = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY,
                               NULL);
        if (json_is_object(j) && json_object_set_new(fn, "arguments", j))
            return atlas_fail(ATLAS_ERR_NOMEM, "messages: out of memory");
        if (!json_is_object(j)) json_decref(j);
    }
    return ATLAS_OK;
}

/* A copy of the messages with what templates cannot read made plain: content given as an
 * array of text parts is joined into one string, "developer" becomes "system", and
 * tool-call arguments in a JSON string become the object it holds. */
static atlas_status normalize_messages(const json_t *in, json_t **out, const char **param) {
    *param = "messages";
    if (!json_is_array(in) || json_array_size(in) == 0)
        return atlas_fail(ATLAS_ERR_INVALID, "'messages' must be a non-empty array");
    json_t *msgs = json_deep_copy(in);
    if (!msgs) return atlas_fail(ATLAS_ERR_NOMEM, "messages: out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            json_decref(msgs);
            return atlas_fail(ATLAS_ERR_INVALID, "'messages[%zu]' must be an object with a "
                                                 "string 'role'",
                              i);
        }
        if (!strcmp(role, "developer")) json_object_set_new(m, "role", json_string("system"));
        atlas_status st = parse_arguments(m);
        if (st != ATLAS_OK) {
            json_decref(msgs);
            return st;
        }
        json_t *c = json_object_get(m, "content");
        if (json_is_array(c)) {
            char *joined = NULL;
            size_t len = 0, cap = 0;
            size_t k;
            json_t *part;
            json_array_foreach(c, k, part) {
                const char *type = json_string_value(json_object_get(part, "type"));
                const char *text = json_string_value(json_object_get(part, "text"));
                if (!type || strcmp(type, "text") != 0 || !text) {
                    /* an image for a vision-language checkpoint (Gemma 3) says so: only its
                     * text model runs */
                    atlas_status st =
                        type && (!strncmp(type, "image", 5) || !strncmp(type, "input_", 6))
                            ? atlas_fail(ATLAS_ERR_INVALID, "'messages[%zu].content[%zu]': "
                                         "\"%.32s\" parts are not supported: atlas runs text "
                                         "models (a vision-language checkpoint's text model "
                                         "only)", i, k, type)
                            : atlas_fail(ATLAS_ERR_INVALID, "'messages[%zu].content[%zu]': only "
                                         "{\"type\": \"text\", \"text\": ...} parts are "
                                         "supported", i, k);
                    free(joined);
                    json_decref(msgs); /* type was in it */
                    return st;
                }
                if (atlas_buf_printf(&joined, &len, &cap, "%s%s", k ? "\n" : "", text)) {
                    free(joined);
                    json_decref(msgs);
                    return atlas_fail(ATLAS_ERR_NOMEM, "messages: out of memory");
                }
            }
            json_object_set_new(m, "content", json_string(joined ? joined : ""));
            free(joined);
        } else if (c && !json_is_string(c) && !json_is_null(c)) {
            json_decref(msgs);
            return atlas_fail(ATLAS_ERR_INVALID, "'messages[%zu].content' must be a string, an "
                                                 "array of text parts or null",
                              i);
        }
    }
    *out = msgs;
    *param = NULL;
    return ATLAS_OK;
}

/* The function a tool_choice object names, NULL when it has none. */
static const char *named_function(const json_t *choice) {
    return json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
}

/* A forced choice ("required" or a named function) needs tools, and a named one must be
 * among them. */
static atlas_status check_forced_choice(const json_t *tools, const json_t *choice) {
    if (json_is_string(choice)) {
        if (!tools && !strcmp(json_string_value(choice), "required"))
            return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' is \"required\" but there are "
                                                 "no 'tools'");
        return ATLAS_OK;
    }
    if (!json_is_object(choice)) return ATLAS_OK;
    const char *type = json_string_value(json_object_get(choice, "type"));
    const char *name = named_function(choice);
    if (!name || (type && strcmp(type, "function") != 0))
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' must be {\"type\": \"function\", "
                                             "\"function\": {\"name\": ...}}");
    if (!tools)
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' names '%.100s' but there are no "
                                             "'tools'", name);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                    name))
            return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_INVALID, "tool_choice names '%.100s', which is not in 'tools'",
                      name);
}

static atlas_status check_tools(const json_t *body, const json_t **tools, bool *parse,
                                const char **param) {
    *tools = json_object_get(body, "tools");
    if (json_is_null(*tools)) *tools = NULL;
    *parse = false;
    if (*tools) {
        *param = "tools";
        if (!json_is_array(*tools))
            return atlas_fail(ATLAS_ERR_INVALID, "'tools' must be an array");
        size_t i;
        json_t *t;
        json_array_foreach(*tools, i, t) {
            if (!json_is_string(json_object_get(json_object_get(t, "function"), "name")))
                return atlas_fail(ATLAS_ERR_INVALID, "'tools[%zu].function.name' must be a "
                                                     "string",
                                  i);
        }
        if (json_array_size(*tools) == 0) *tools = NULL;
    }
    const json_t *choice = json_object_get(body, "tool_choice");
    *param = "tool_choice";
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))
            return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' must be \"none\", \"auto\", "
                                                 "\"required\" or a function");
        *parse = *tools && strcmp(c, "none") != 0;
    } else if (json_is_object(choice) || !choice || json_is_null(choice)) {
        *parse = *tools != NULL;
    } else {
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' must be a string or an object");
    }
    ATLAS_TRY(check_forced_choice(*tools, choice));
    *param = NULL;
    return ATLAS_OK;
}

/* --- forced tool calls --------------------------------------------------------------------- */

/* name as it appears inside a JSON string (malloc'd, without the quotes). */
static char *json_escaped(const char *name) {
    json_t *j = json_string(name);
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!d) return NULL;
    size_t n = strlen(d);
    memmove(d, d + 1, n - 2); /* drop the quotes */
    d[n - 2] = 0;
    return d;
}

/* The text around one call in each format; the name goes between head and middle, the
 * arguments object between middle and tail (the shapes the tool-call parser reads). */
static void call_shape(atlas_toolcall_format f, const char **head, const char **middle,
                       const char **tail) {
    switch (f) {
    case ATLAS_TOOLCALL_LLAMA3:
        *head = "{\"name\": \"", *middle = "\", \"parameters\": ", *tail = "}";
        return;
    case ATLAS_TOOLCALL_MISTRAL:
        *head = "[TOOL_CALLS][{\"name\": \"", *middle = "\", \"arguments\": ", *tail = "}]";
        return;
    default:
        *head = "<tool_call>\n{\"name\": \"", *middle = "\", \"arguments\": ";
        *tail = "}\n</tool_call>";
        return;
    }
}

/* The calls a reply may make: per tool (the first of each name), a key, lead then its name
 * as the call writes it and the closing quote, and the program of the rest of the call: the
 * arguments, which follow the function's parameters (schema.h) when it has "strict": true,
 * else any object (its optional parameters stay optional). */
typedef struct tool_calls {
    int n;
    char **keys;
    atlas_constraint **rest;
} tool_calls;

static void tool_calls_free(tool_calls *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->keys[i]);
        atlas_constraint_free(t->rest[i]);
    }
    free(t->keys);
    free(t->rest);
}

static const char *tool_name(const json_t *tools, size_t i) {
    return json_string_value(
        json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
}

/* One tool's key and program, unless a tool of its name came before. */
static atlas_status add_call(atlas_toolcall_format f, const json_t *tools, size_t i,
                             const char *lead, tool_calls *t, const char **param) {
    const char *head, *middle, *tail, *name = tool_name(tools, i);
    call_shape(f, &head, &middle, &tail);
    for (size_t k = 0; k < i; k++)
        if (!strcmp(tool_name(tools, k), name)) return ATLAS_OK; /* the first one counts */
    const json_t *fn = json_object_get(json_array_get(tools, i), "function");
    const json_t *args = json_is_true(json_object_get(fn, "strict"))
                             ? json_object_get(fn, "parameters") : NULL;
    char *esc = json_escaped(name), where[64];
    snprintf(where, sizeof where, "tools[%zu].function.parameters", i);
    atlas_constraint *c = NULL;
    atlas_status st = esc ? atlas_constraint_new(&c) : atlas_fail(ATLAS_ERR_NOMEM, "tools");
    if (st == ATLAS_OK) /* middle starts with the name's closing quote, which the key has */
        st = atlas_constraint_add_literal(c, middle + 1, strlen(middle + 1));
    if (st == ATLAS_OK) {
        st = args ? atlas_schema_append(args, where, c) : atlas_constraint_add_json_object(c);
        if (st != ATLAS_OK && args) *param = "tools";
    }
    if (st == ATLAS_OK) st = atlas_constraint_add_literal(c, tail, strlen(tail));
    char *key = NULL;
    if (st == ATLAS_OK && asprintf(&key, "%s%s\"", lead, esc) < 0)
        key = NULL, st = atlas_fail(ATLAS_ERR_NOMEM, "tools");
    if (st == ATLAS_OK) {
        t->keys[t->n] = key;
        t->rest[t->n++] = c;
    } else {
        atlas_constraint_free(c);
    }
    free(esc);
    return st;
}

static atlas_status collect_calls(atlas_toolcall_format f, const json_t *tools, const char *only,
                                  bool strict_only, const char *lead, tool_calls *t,
                                  const char **param) {
    size_t n = json_array_size(tools);
    t->n = 0;
    t->keys = calloc(n, sizeof *t->keys);
    t->rest = calloc(n, sizeof *t->rest);
    if (!t->keys || !t->rest) return atlas_fail(ATLAS_ERR_NOMEM, "tools");
    atlas_status st = ATLAS_OK;
    for (size_t i = 0; st == ATLAS_OK && i < n; i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (only && strcmp(tool_name(tools, i), only)) continue;
        if (strict_only && !json_is_true(json_object_get(fn, "strict"))) continue;
        st = add_call(f, tools, i, lead, t, param);
    }
    return st;
}

/* tool_choice "required" or a named function (checked by check_tools): the reply must be
 * exactly one call in the model's tool-call format, of that function or of any tool.  Under
 * "auto", when some tools are strict, the reply is free text in which a call of a strict
 * tool, once its name is written, is held to its parameters (as OpenAI enforces strict
 * tools either way); *lazy says so.  A response_format decides the reply alone. */
static atlas_status tool_constraint(atlas_toolcall_format f, const char *model,
                                    const json_t *body, atlas_gen_params *gp, bool *lazy,
                                    const char **param) {
    const json_t *choice = json_object_get(body, "tool_choice");
    const json_t *tools = json_object_get(body, "tools");
    bool required = json_is_string(choice) && !strcmp(json_string_value(choice), "required");
    bool forced = required || json_is_object(choice);
    *lazy = false;
    if (json_array_size(tools) == 0 || (!forced && (gp->constraint || f == ATLAS_TOOLCALL_NONE)))
        return ATLAS_OK;
    if (f == ATLAS_TOOLCALL_HARMONY && !forced) /* strict tools: the calls' frame is tokens */
        return ATLAS_OK;
    *param = "tool_choice";
    if (f == ATLAS_TOOLCALL_HARMONY)
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' forces a tool call, which the "
                                             "harmony format of '%s' cannot do: its calls are "
                                             "framed by special tokens a constraint does not "
                                             "write; use \"auto\"", model);
    if (f == ATLAS_TOOLCALL_NONE)
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' forces a tool call, but the chat "
                                             "template of '%s' has no tool-call format atlas "
                                             "knows", model);
    if (gp->constraint)
        return atlas_fail(ATLAS_ERR_INVALID, "'tool_choice' forces a tool call: it cannot be "
                                             "combined with a 'response_format' of JSON");
    const char *head, *middle, *tail;
    call_shape(f, &head, &middle, &tail);
    tool_calls t = {0};
    atlas_constraint *c = NULL;
    atlas_status st = collect_calls(f, tools, required || !forced ? NULL : named_function(choice),
                                    !forced, forced ? "" : head, &t, param);
    if (st == ATLAS_OK && t.n) st = atlas_constraint_new(&c);
    if (st == ATLAS_OK && c && forced) {
        st = atlas_constraint_add_literal(c, head, strlen(head));
        if (st == ATLAS_OK)
            st = atlas_constraint_add_alternatives(c, (const char *const *)t.keys,
                                                   (const atlas_constraint *const *)t.rest, t.n);
    } else if (st == ATLAS_OK && c) {
        st = atlas_constraint_add_free_text(c, (const char *const *)t.keys,
                                            (const atlas_constraint *const *)t.rest, t.n);
        *lazy = true;
    }
    tool_calls_free(&t);
    if (st != ATLAS_OK) {
        atlas_constraint_free(c);
        *lazy = false;
        return st;
    }
    gp->constraint = c;
    *param = NULL;
    return ATLAS_OK;
}

/* "chat_template_kwargs": an object none of whose names the renderer sets itself. */
static atlas_status check_kwargs(const json_t *body, const json_t **kwargs, const char **param) {
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    *kwargs = NULL;
    if (!kw || json_is_null(kw)) return ATLAS_OK;
    *param = "chat_template_kwargs";
    if (!json_is_object(kw))
        return atlas_fail(ATLAS_ERR_INVALID, "'chat_template_kwargs' must be an object");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)kw, k, v) {
        (void)v;
        if (atlas_template_reserved(k))
            return atlas_fail(ATLAS_ERR_INVALID, "'chat_template_kwargs.%s': '%s' is set by the "
                                                 "server or is a builtin of the chat template; a "
                                                 "keyword argument may not replace it", k, k);
    }
    *kwargs = kw;
    *param = NULL;
    return ATLAS_OK;
}

/* "reasoning_effort" (OpenAI's: "low", "medium" or "high") reaches the template as its
 * keyword argument of that name, as vLLM and llama.cpp pass it (gpt-oss's system message
 * says "Reasoning: high"); a chat_template_kwargs that says otherwise is refused.  *merged:
 * a new object (kwargs and the effort) or NULL when the body has none. */
static atlas_status effort_kwargs(const json_t *body, const json_t *kwargs, json_t **merged,
                                  const char **param) {
    *merged = NULL;
    const char *effort = NULL;
    ATLAS_TRY(atlas_param_string(body, "reasoning_effort", &effort, param));
    if (!effort) return ATLAS_OK;
    *param = "reasoning_effort";
    if (strcmp(effort, "low") && strcmp(effort, "medium") && strcmp(effort, "high"))
        return atlas_fail(ATLAS_ERR_INVALID, "'reasoning_effort' must be \"low\", \"medium\" or "
                                             "\"high\", not '%.40s'", effort);
    const char *kw = json_string_value(json_object_get(kwargs, "reasoning_effort"));
    if (json_object_get(kwargs, "reasoning_effort") && (!kw || strcmp(kw, effort)))
        return atlas_fail(ATLAS_ERR_INVALID, "'reasoning_effort' is '%s' but "
                                             "'chat_template_kwargs.reasoning_effort' says otherwise",
                          effort);
    *merged = kwargs ? json_deep_copy(kwargs) : json_object();
    if (!*merged || json_object_set_new(*merged, "reasoning_effort", json_string(effort))) {
        json_decref(*merged);
        *merged = NULL;
        return atlas_fail(ATLAS_ERR_NOMEM, "reasoning_effort: out of memory");
    }
    *param = NULL;
    return ATLAS_OK;
}

/* A Harmony template (gpt-oss's) reads an assistant turn's reasoning as "thinking": it comes
 * from "reasoning_content" (what atlas answers) or "reasoning" (vLLM's newer name) when the
 * message has no "thinking" of its own.  The template refuses a turn with tool calls that
 * has both content and thinking; there the content is dropped, as llama.cpp does, the
 * reasoning being what the model wrote before its call. */
static void harmony_thinking(json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant") || json_object_get(m, "thinking")) continue;
        json_t *r = json_object_get(m, "reasoning_content");
        if (!json_is_string(r)) r = json_object_get(m, "reasoning");
        if (!json_is_string(r) || json_string_length(r) == 0) continue;
        json_object_set(m, "thinking", r);
        if (json_array_size(json_object_get(m, "tool_calls"))) json_object_del(m, "content");
    }
}

/* A shielded copy of v into *out, NULL for NULL; param names v when that fails. */
static atlas_status shielded_copy(const atlas_tokenizer *shield, const json_t *v, const char *name,
                                  json_t **out, const char **param) {
    *out = NULL;
    if (!v) return ATLAS_OK;
    *param = name;
    if (!(*out = json_deep_copy(v))) return atlas_fail(ATLAS_ERR_NOMEM, "%s: out of memory", name);
    ATLAS_TRY(atlas_shield_json(shield, *out));
    *param = NULL;
    return ATLAS_OK;
}

/* vLLM's "continue_final_message" (and an Anthropic prefill): the last message, the
 * assistant's text so far, is rendered open, the reply continuing it. It needs no
 * generation prompt (one asked for as well is refused, as vLLM does). */
static atlas_status final_message(const json_t *body, const json_t *msgs, bool *cont,
                                  bool *gen_prompt, const char **param) {
    ATLAS_TRY(atlas_param_bool(body, "continue_final_message", cont, param));
    if (!*cont) return ATLAS_OK;
    *param = "continue_final_message";
    if (json_is_true(json_object_get(body, "add_generation_prompt")))
        return atlas_fail(ATLAS_ERR_INVALID, "'continue_final_message' and "
                                             "'add_generation_prompt' cannot both be true");
    const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    const json_t *content = json_object_get(last, "content");
    if (!role || strcmp(role, "assistant") || !json_is_string(content) ||
        !json_string_length(content) || json_object_get(last, "tool_calls"))
        return atlas_fail(ATLAS_ERR_INVALID, "'continue_final_message' needs an assistant "
                                             "message with text (and no tool calls) last");
    *gen_prompt = false;
    *param = NULL;
    return ATLAS_OK;
}

/* Cuts prompt right after the last message's text (as shielded in msgs), so that the reply
 * continues it: where the template closes the turn after it, that goes. cuts (may be NULL)
 * past the end go too. A template that does not print the text as sent cannot continue it. */
static atlas_status cut_after_final(const json_t *msgs, const char *model, char *prompt,
                                    size_t **cuts, size_t *n_cuts, const char **param) {
    const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *text = json_string_value(json_object_get(last, "content"));
    size_t tl = text ? strlen(text) : 0;
    const char *at = NULL, *stop = prompt + strlen(prompt);
    /* the text as sent, else without its trailing whitespace (templates that trim it) */
    for (int pass = 0; pass < 2 && !at; pass++) {
        if (pass) while (tl && strchr(" \t\r\n", text[tl - 1])) tl--;
        for (const char *p = prompt; tl && (p = memmem(p, (size_t)(stop - p), text, tl)); p++)
            at = p;
    }
    if (!at) {
        *param = "continue_final_message";
        return atlas_fail(ATLAS_ERR_INVALID, "the chat template of '%s' does not print the "
                                             "final assistant message as sent, so it cannot be "
                                             "continued", model);
    }
    size_t end = (size_t)(at - prompt) + tl;
    prompt[end] = '\0';
    while (cuts && *n_cuts && (*cuts)[*n_cuts - 1] >= end) (*n_cuts)--;
    return ATLAS_OK;
}

atlas_status atlas_api_render_template(const atlas_template *tmpl, const char *model,
                                       const atlas_tokenizer *shield, const json_t *body,
                                       bool tools_ok, char **prompt, size_t **cuts,
                                       size_t *n_cuts, bool *parse_tools, const char **param) {
    const json_t *tools = NULL, *kwargs = NULL;
    bool parse = false;
    *prompt = NULL;
    if (cuts) *cuts = NULL, *n_cuts = 0;
    if (tools_ok) ATLAS_TRY(check_tools(body, &tools, &parse, param));
    if (parse_tools) *parse_tools = parse;
    json_t *msgs = NULL; /* set on success (gcc -O2 cannot see it through ATLAS_TRY) */
    ATLAS_TRY(normalize_messages(json_object_get(body, "messages"), &msgs, param));
    bool gen_prompt = true, cont = false;
    json_t *effort = NULL; /* kwargs with reasoning_effort, when the body has one */
    atlas_status st = atlas_param_bool(body, "add_generation_prompt", &gen_prompt, param);
    if (st == ATLAS_OK) st = final_message(body, msgs, &cont, &gen_prompt, param);
    if (st == ATLAS_OK) st = check_kwargs(body, &kwargs, param);
    if (st == ATLAS_OK) st = effort_kwargs(body, kwargs, &effort, param);
    if (effort) kwargs = effort;
    if (st == ATLAS_OK && atlas_harmony_template(atlas_template_source(tmpl))) harmony_thinking(msgs);
    /* every client string that reaches the template, object keys included, may not spell the
     * model's control tokens */
    json_t *tools_sh = NULL, *kwargs_sh = NULL;
    if (st == ATLAS_OK && shield) {
        *param = "messages";
        st = atlas_shield_json(shield, msgs);
        if (st == ATLAS_OK) *param = NULL;
        if (st == ATLAS_OK) st = shielded_copy(shield, tools, "tools", &tools_sh, param);
        if (st == ATLAS_OK)
            st = shielded_copy(shield, kwargs, "chat_template_kwargs", &kwargs_sh, param);
    }
    if (st == ATLAS_OK) {
        atlas_template_input in = {msgs, shield ? tools_sh : tools, shield ? kwargs_sh : kwargs,
                                   gen_prompt};
        st = cuts ? atlas_template_render_pieces(tmpl, &in, prompt, cuts, n_cuts)
                  : atlas_template_render(tmpl, &in, prompt);
        if (st != ATLAS_OK) {
            *param = "messages";
            st = atlas_fail_wrap(ATLAS_ERR_INVALID, "rendering the chat template of '%s'", model);
        }
        if (st == ATLAS_OK && cont) st = cut_after_final(msgs, model, *prompt, cuts, n_cuts, param);
    }
    json_decref(msgs);
    json_decref(tools_sh);
    json_decref(kwargs_sh);
    json_decref(effort);
    return st;
}

atlas_status atlas_api_render_chat(atlas_server *s, const char *model, const json_t *body,
                                   bool tools_ok, char **prompt, size_t **cuts, size_t *n_cuts,
                                   const atlas_template **tmpl_out, bool *parse_tools,
                                   const char **param) {
    const atlas_template *tmpl = NULL;
    atlas_status st = atlas_engine_template(s->engine, model, &tmpl);
    if (st == ATLAS_ERR_NOT_FOUND) /* the client can still use /v1/completions */
        return atlas_fail(ATLAS_ERR_INVALID, "the model '%s' has no chat template: use "
                                             "/v1/completions", model);
    if (st != ATLAS_OK) /* the server's files are at fault, not the request */
        return atlas_fail_wrap(ATLAS_ERR_INTERNAL, "the chat template of '%s'", model);
    if (tmpl_out) *tmpl_out = tmpl;
    const atlas_tokenizer *tok = NULL;
    ATLAS_TRY(atlas_engine_tokenizer(s->engine, model, &tok));
    return atlas_api_render_template(tmpl, model, tok, body, tools_ok, prompt, cuts, n_cuts,
                                     parse_tools, param);
}

/* --- the two generation endpoints ---------------------------------------------------------- */

/* Starts one generation and answers with it (whole or streamed); a failure to start is
 * answered as an error. */
static void start_and_reply(atlas_http_call *call, const atlas_gen_opts *o,
                            const atlas_gen_params *gp, const atlas_tokenizer *tok,
                            const int32_t *ids, size_t n, atlas_http_reply *r) {
    atlas_gen *g;
    atlas_status st = atlas_gen_start(call, o, gp, tok, ids, n, &g);
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, st == ATLAS_ERR_NOT_FOUND ? "model" : NULL);
        return;
    }
    atlas_gen_reply(g, r);
}

/* count prompts x gp->n choices (prompt-major, as OpenAI numbers them), run at once in the
 * engine and answered together, as one JSON response or one stream whose chunks carry the
 * choice index; choice j of a prompt samples with seed sp.seed + j. */
static void start_choices(atlas_http_call *call, atlas_gen_opts *o, atlas_gen_params *gp,
                          const atlas_tokenizer *tok, int32_t *const *ids, const size_t *n,
                          char *const *echo, int count, atlas_http_reply *r) {
    atlas_gen *gs[ATLAS_MAX_CHOICES];
    int per = gp->n > 0 ? gp->n : 1, total = 0;
    uint64_t seed = gp->sp.seed;
    for (int i = 0; i < count; i++) {
        o->echo = echo ? echo[i] : NULL;
        for (int j = 0; j < per; j++) {
            gp->sp.seed = seed + (uint64_t)j;
            atlas_status st = atlas_gen_start(call, o, gp, tok, ids[i], n[i], &gs[total]);
            if (st != ATLAS_OK) {
                gp->sp.seed = seed;
                atlas_api_error_fail(r, st, st == ATLAS_ERR_NOT_FOUND ? "model" : NULL);
                for (int k = 0; k < total; k++) atlas_gen_release(gs[k]);
                return;
            }
            total++;
        }
    }
    gp->sp.seed = seed;
    if (!gp->stream) {
        atlas_gen_finish_batch(gs, total, per, r);
        return;
    }
    atlas_status st = atlas_gen_group_make(gs, total, per);
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, NULL);
        for (int k = 0; k < total; k++) atlas_gen_release(gs[k]);
        return;
    }
    atlas_gen_reply(gs[0], r); /* the stream owns every member now */
}

/* An embedding model makes vectors only: a generation on it is refused before its template
 * (which it may lack) is looked at, naming what it is. */
static atlas_status generative(atlas_server *s, const char *model, const char **param) {
    atlas_engine_embedding info;
    ATLAS_TRY(atlas_engine_embedding_info(s->engine, model, &info));
    if (!info.is_embedding) return ATLAS_OK;
    *param = "model";
    return atlas_fail(ATLAS_ERR_INVALID, "model '%s' is an embedding model: it makes "
                      "embeddings (POST /v1/embeddings, /api/embed), not text", model);
}

atlas_status atlas_api_chat_prepare(atlas_server *s, const json_t *body, atlas_api_chat_req *q,
                                    const char **param) {
    memset(q, 0, sizeof *q);
    const atlas_template *tmpl = NULL;
    bool parse_tools = false;
    ATLAS_TRY(atlas_api_model(s, body, NULL, &q->model, param));
    ATLAS_TRY(generative(s, q->model, param));
    ATLAS_TRY(atlas_engine_tokenizer(s->engine, q->model, &q->tok));
    atlas_generation_defaults gen;
    ATLAS_TRY(atlas_engine_generation_defaults(s->engine, q->model, &gen));
    ATLAS_TRY(atlas_gen_params_parse(body, ATLAS_API_CHAT, q->tok, &gen, &q->gp, param));
    size_t *cuts = NULL, n_cuts = 0;
    ATLAS_TRY(atlas_api_render_chat(s, q->model, body, true, &q->prompt, &cuts, &n_cuts, &tmpl,
                                    &parse_tools, param));
    atlas_status st = atlas_shield_encode_pieces(q->tok, q->prompt, strlen(q->prompt), cuts,
                                                 n_cuts, false, &q->ids, &q->n);
    free(cuts);
    ATLAS_TRY(st);
    atlas_gen_params *gp = &q->gp;
    q->o = (atlas_gen_opts){.kind = ATLAS_API_CHAT, .model = q->model, .stream = gp->stream,
                            .include_usage = gp->include_usage, .logprobs = gp->logprobs,
                            .top_logprobs = gp->top_logprobs,
                            .tokens_as_ids = gp->tokens_as_ids, .tools = ATLAS_TOOLCALL_NONE};
    atlas_toolcall_format format = tool_format(s, q->model, tmpl);
    if (parse_tools) q->o.tools = format;
    /* a Harmony reply is read from its ids, whatever the request (its channels are not
     * text), unless a response_format holds the reply to JSON text, which has no markers */
    if (format == ATLAS_TOOLCALL_HARMONY && !gp->constraint && atlas_harmony_supported(q->tok)) {
        q->o.harmony = true;
        atlas_harmony_stop_ids(q->tok, gp->stop_ids, &gp->n_stop_ids);
    } else if (format == ATLAS_TOOLCALL_HARMONY && parse_tools) {
        *param = "tools";
        return atlas_fail(ATLAS_ERR_INVALID, "the tool-call format of '%s' is harmony, but its "
                                             "tokenizer lacks Harmony's special tokens", q->model);
    }
    bool lazy = false; /* strict tools under "auto": the reply is free text still */
    if (parse_tools) ATLAS_TRY(tool_constraint(q->o.tools, q->model, body, gp, &lazy, param));
    /* a thinking template's "<think>" block becomes reasoning_content, unless a constraint
     * (forced tool call, response_format) decides what the reply is */
    if (s->p.reasoning && !q->o.harmony && (!gp->constraint || lazy) && tmpl &&
        atlas_reasoning_template_thinks(atlas_template_source(tmpl))) {
        q->o.reasoning = true;
        q->o.reasoning_inside = atlas_reasoning_prompt_open(q->prompt);
    }
    return ATLAS_OK;
}

void atlas_api_chat_req_free(atlas_api_chat_req *q) {
    if (q->o.dialect && q->o.dialect->free) q->o.dialect->free(q->o.dialect_ctx);
    free(q->ids);
    free(q->prompt);
    atlas_gen_params_free(&q->gp);
    memset(q, 0, sizeof *q);
}

void atlas_api_chat_start(atlas_http_call *call, atlas_api_chat_req *q, atlas_http_reply *r) {
    if (!q->o.dialect && q->gp.n > 1) {
        start_choices(call, &q->o, &q->gp, q->tok, &q->ids, &q->n, NULL, 1, r);
        return;
    }
    if (q->gp.n > 1) /* a dialect tells one answer; their bodies have no "n" */
        atlas_api_error_fail(r, atlas_fail(ATLAS_ERR_INVALID, "'n': one choice only here"), "n");
    else start_and_reply(call, &q->o, &q->gp, q->tok, q->ids, q->n, r);
    if (q->gp.n == 1) q->o.dialect_ctx = NULL; /* the gen's now, started or not */
}

/* The deprecated "functions" / "function_call" (before "tools"): refused by name rather than
 * ignored, which would drop a forced call without a word. */
static atlas_status legacy_functions(const json_t *body, const char **param) {
    static const char *const old[] = {"functions", "function_call"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(body, old[i]);
        if (v && !json_is_null(v)) {
            *param = old[i];
            return atlas_fail(ATLAS_ERR_INVALID, "'%s' is the deprecated form of '%s': send "
                                                 "'tools' and 'tool_choice'",
                              old[i], i ? "tool_choice" : "tools");
        }
    }
    return ATLAS_OK;
}

void atlas_api_chat(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)arg;
    const char *param = NULL;
    atlas_api_chat_req q;
    memset(&q, 0, sizeof q);
    atlas_status st = legacy_functions(body, &param);
    if (st == ATLAS_OK) st = atlas_api_chat_prepare(call->ctx, body, &q, &param);
    if (st != ATLAS_OK) atlas_api_error_fail(r, st, param);
    else atlas_api_chat_start(call, &q, r);
    atlas_api_chat_req_free(&q);
}

/* One prompt: a string (tokenized with the special tokens; with split, special tokens'
 * spellings as text) or an array of token ids. where names it in errors ("prompt" or
 * "prompt[2]"). */
static atlas_status one_prompt(const json_t *p, const char *where, const atlas_tokenizer *tok,
                               bool split, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (json_is_string(p)) {
        atlas_text_range all = {0, json_string_length(p)};
        ATLAS_TRY(atlas_tokenizer_encode_ranges(tok, json_string_value(p), all.end, true, &all,
                                                split ? 1 : 0, ids, n));
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        size_t count = json_array_size(p);
        size_t vocab = atlas_tokenizer_vocab_size(tok);
        *ids = malloc(count * sizeof **ids);
        if (!*ids) return atlas_fail(ATLAS_ERR_NOMEM, "prompt: out of memory");
        for (size_t i = 0; i < count; i++) {
            const json_t *v = json_array_get(p, i);
            json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
            if (id < 0 || (size_t)id >= vocab)
                return atlas_fail(ATLAS_ERR_INVALID, "'%s[%zu]' must be a token id in 0..%zu",
                                  where, i, vocab - 1);
            (*ids)[i] = (int32_t)id;
        }
        *n = count;
    } else {
        return atlas_fail(ATLAS_ERR_INVALID, "'%s' must be a non-empty string or array of token "
                                             "ids",
                          where);
    }
    if (*n == 0) return atlas_fail(ATLAS_ERR_INVALID, "'%s' is empty", where);
    return ATLAS_OK;
}

/* "prompt": one prompt, or an array of prompts (strings or arrays of token ids). */
atlas_status atlas_api_completion_prompts(const json_t *body, const atlas_tokenizer *tok,
                                          int32_t **ids, size_t *n, int *count,
                                          const char **param) {
    bool split = false;
    *count = 0;
    ATLAS_TRY(atlas_param_bool(body, "split_special_tokens", &split, param));
    const json_t *p = json_object_get(body, "prompt");
    *param = "prompt";
    const json_t *first = json_array_get(p, 0);
    if (!json_is_array(p) || json_is_integer(first)) { /* a single prompt */
        *count = 1; /* so that the caller frees what was made, failure or not */
        ATLAS_TRY(one_prompt(p, "prompt", tok, split, &ids[0], &n[0]));
    } else {
        size_t k = json_array_size(p);
        if (k == 0 || k > ATLAS_API_MAX_PROMPTS)
            return atlas_fail(ATLAS_ERR_INVALID, "'prompt' holds %zu prompts: 1 to %d", k,
                              ATLAS_API_MAX_PROMPTS);
        for (size_t i = 0; i < k; i++) {
            char where[32];
            snprintf(where, sizeof where, "prompt[%zu]", i);
            *count = (int)i + 1; /* so that the caller frees what was made */
            ATLAS_TRY(one_prompt(json_array_get(p, i), where, tok, split, &ids[i], &n[i]));
        }
    }
    *param = NULL;
    return ATLAS_OK;
}

/* Starts one generation per prompt and answers them together (not streamed). */
void atlas_api_completions(atlas_http_call *call, json_t *body, const char *arg,
                           atlas_http_reply *r) {
    (void)arg;
    /* an insertion (fill in the middle) asks for text that fits before "suffix": answered
     * with a plain continuation it would be wrong without a word, so it is refused, as vLLM
     * does */
    const json_t *suffix = json_object_get(body, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && !json_string_length(suffix))) {
        atlas_api_error_fail(r, atlas_fail(ATLAS_ERR_INVALID, "'suffix' (insertion, fill in "
                                           "the middle) is not supported: send the text "
                                           "before the insertion point as 'prompt'"),
                             "suffix");
        return;
    }
    atlas_api_completions_run(call, body, NULL, r);
}

void atlas_api_completions_run(atlas_http_call *call, const json_t *body,
                               const atlas_gen_dialect *d, atlas_http_reply *r) {
    atlas_server *s = call->ctx;
    const char *param = NULL, *model;
    const atlas_tokenizer *tok;
    atlas_gen_params gp = {0};
    int32_t *ids[ATLAS_API_MAX_PROMPTS] = {0};
    size_t n[ATLAS_API_MAX_PROMPTS] = {0};
    char *echo[ATLAS_API_MAX_PROMPTS] = {0};
    int count = 0;
    atlas_status st = atlas_api_model(s, body, NULL, &model, &param);
    if (st == ATLAS_OK) st = generative(s, model, &param);
    if (st == ATLAS_OK) st = atlas_engine_tokenizer(s->engine, model, &tok);
    atlas_generation_defaults gen;
    if (st == ATLAS_OK) st = atlas_engine_generation_defaults(s->engine, model, &gen);
    if (st == ATLAS_OK)
        st = atlas_gen_params_parse(body, ATLAS_API_COMPLETION, tok, &gen, &gp, &param);
    if (st == ATLAS_OK) st = atlas_api_completion_prompts(body, tok, ids, n, &count, &param);
    if (st == ATLAS_OK && count * gp.n > ATLAS_MAX_CHOICES) {
        param = "n";
        st = atlas_fail(ATLAS_ERR_INVALID, "%d prompts x 'n' %d = %d choices: at most %d",
                        count, gp.n, count * gp.n, ATLAS_MAX_CHOICES);
    }
    for (int i = 0; st == ATLAS_OK && gp.echo && i < count; i++) {
        size_t len;
        st = atlas_tokenizer_decode(tok, ids[i], n[i], false, &echo[i], &len);
    }
    if (st != ATLAS_OK) {
        atlas_api_error_fail(r, st, param);
    } else {
        atlas_gen_opts o = {.kind = ATLAS_API_COMPLETION, .model = model, .stream = gp.stream,
                            .include_usage = gp.include_usage, .logprobs = gp.logprobs,
                            .top_logprobs = gp.top_logprobs,
                            .tokens_as_ids = gp.tokens_as_ids, .tools = ATLAS_TOOLCALL_NONE,
                            .echo = echo[0], .dialect = d};
        if (count == 1 && gp.n == 1) start_and_reply(call, &o, &gp, tok, ids[0], n[0], r);
        else start_choices(call, &o, &gp, tok, ids, n, echo, count, r);
    }
    for (int i = 0; i < count; i++) {
        free(echo[i]);
        free(ids[i]);
    }
    atlas_gen_params_free(&gp);
}
