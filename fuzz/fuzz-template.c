/* fuzz/fuzz-template.c — libFuzzer target for chat templates and the tool-call parser.
 * Input: TEMPLATE [\0 MESSAGES_JSON]. The template is parsed and rendered with the
 * messages (or a stock conversation with tool calls when they are absent or not an array);
 * the messages also go through a Qwen-style template, and the rendered text through every
 * tool-call format, whole and streamed. Errors are fine; crashes, leaks and sanitizer
 * reports are not, nor a failure without a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/template.h"
#include "atlas/toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char STOCK_MESSAGES[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"22\"}]";
static const char STOCK_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";
/* Qwen-like: attribute access, methods, namespace, tojson, loops over whatever came in */
static const char QWEN_LIKE[] =
    "{%- set ns = namespace(last=messages|length - 1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' and message.content is string %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content.split('</think>')[-1].lstrip('\\n') }}{% endif %}"
    "{%- for tc in message.tool_calls or [] %}<tool_call>{{ tc.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{%- endfor %}{{ tools | tojson(indent=2) if tools }}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static void check_failed(atlas_status st) {
    if (st != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
}

static void toolcalls(const char *text) {
    for (int f = ATLAS_TOOLCALL_NONE; f <= ATLAS_TOOLCALL_MISTRAL; f++) {
        char *content = NULL;
        json_t *calls = NULL;
        if (atlas_toolcall_parse((atlas_toolcall_format)f, text, &content, &calls) != ATLAS_OK) abort();
        if (json_array_size(calls) == 0 && strcmp(content, text)) abort(); /* no text lost */
        free(content);
        json_decref(calls);
        atlas_toolcall_parser *p = NULL;
        if (atlas_toolcall_parser_new((atlas_toolcall_format)f, &p) != ATLAS_OK) abort();
        json_t *arr = json_array();
        size_t n = strlen(text);
        for (size_t i = 0; i < n; i += 3) {
            char *piece = NULL;
            if (atlas_toolcall_parser_feed(p, text + i, n - i < 3 ? n - i : 3, &piece, arr) != ATLAS_OK) abort();
            free(piece);
        }
        char *rest = NULL;
        if (atlas_toolcall_parser_finish(p, &rest, arr) != ATLAS_OK) abort();
        free(rest);
        json_decref(arr);
        atlas_toolcall_parser_free(p);
    }
}

static void render(const atlas_template *t, const char *messages, const char *tools) {
    char *out = NULL;
    atlas_status st = atlas_template_render_str(t, messages, tools, true, "{\"enable_thinking\": false}", &out);
    check_failed(st);
    if (st == ATLAS_OK) {
        if (!out) abort();
        if (strlen(out) < 4096) toolcalls(out);
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    const char *tmpl = buf;
    size_t tl = strlen(tmpl);
    const char *messages = tl < size ? buf + tl + 1 : NULL;
    json_t *j = messages ? json_loads(messages, 0, NULL) : NULL;
    if (!json_is_array(j)) messages = NULL;
    json_decref(j);

    atlas_template *t = NULL;
    atlas_status st = atlas_template_parse(tmpl, "fuzz", "<s>", "</s>", &t);
    check_failed(st);
    if (st == ATLAS_OK) {
        render(t, messages ? messages : STOCK_MESSAGES, STOCK_TOOLS);
        render(t, messages ? messages : STOCK_MESSAGES, NULL);
        atlas_template_free(t);
    }
    if (messages) {
        if (atlas_template_parse(QWEN_LIKE, "qwen-like", NULL, "<|im_end|>", &t) != ATLAS_OK) abort();
        render(t, messages, STOCK_TOOLS);
        atlas_template_free(t);
    }
    if (size < 4096) toolcalls(buf); /* the raw input as model output too */
    free(buf);
    return 0;
}
