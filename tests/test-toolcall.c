/* tests/test-toolcall.c — tool calls out of realistic model outputs (Hermes/Qwen, Llama 3,
 * Mistral), whole and streamed piece by piece, malformed ones left as text, and a
 * randomized check that streaming agrees with the one-shot parse and never loses text. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/template.h"
#include "atlas/toolcall.h"
#include "harness.h"

/* Parses text whole; checks the content and the calls' names/arguments (NULL-terminated
 * pairs in want). */
static void expect(atlas_toolcall_format f, const char *text, const char *content, const char *const *want) {
    char *got = NULL;
    json_t *calls = NULL;
    CHECK_OK(atlas_toolcall_parse(f, text, &got, &calls));
    if (!got || !calls) return;
    CHECK_MSG(!strcmp(got, content), "%s: content [%s], expected [%s]", text, got, content);
    size_t n = 0;
    while (want && want[2 * n]) n++;
    CHECK_MSG(json_array_size(calls) == n, "%s: %zu calls, expected %zu", text, json_array_size(calls), n);
    for (size_t i = 0; i < n && i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i);
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *type = json_string_value(json_object_get(c, "type"));
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        CHECK(type && !strcmp(type, "function"));
        CHECK_MSG(name && !strcmp(name, want[2 * i]), "call %zu name %s", i, name ? name : "(null)");
        CHECK_MSG(args && !strcmp(args, want[2 * i + 1]), "call %zu arguments [%s], expected [%s]", i,
                  args ? args : "(null)", want[2 * i + 1]);
        if (f == ATLAS_TOOLCALL_MISTRAL) CHECK_MSG(id && strlen(id) == 9, "mistral id %s", id ? id : "(null)");
        else CHECK_MSG(id && !strncmp(id, "call_", 5) && strlen(id) == 29, "id %s", id ? id : "(null)");
    }
    free(got);
    json_decref(calls);
}

static const char *const WEATHER[] = {"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", NULL};

static void test_hermes(void) {
    const atlas_toolcall_format H = ATLAS_TOOLCALL_HERMES;
    expect(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>", "", WEATHER);
    const char *two[] = {"get_weather", "{\"city\": \"Paris\"}", "get_time", "{\"tz\": \"CET\"}", NULL};
    expect(H, "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
           "Let me check both.\n\n", two);
    expect(H, "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
           "<think>\nThe user wants the weather.\n</think>\n\n", WEATHER);
    /* arguments given as a JSON string stay that string */
    const char *str_args[] = {"f", "{\"a\":1}", NULL};
    expect(H, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":1}\"}</tool_call>", "", str_args);
    const char *no_args[] = {"ping", "{}", NULL};
    expect(H, "<tool_call>{\"name\": \"ping\"}</tool_call>", "", no_args);
    /* unterminated at the end of generation, but complete JSON: a call */
    expect(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n", "", WEATHER);
    /* malformed: left as text */
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>not json at all</tool_call> and more",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1, 2]}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"argum",
        "I would use <tool> tags, or <tool_call",
        "</tool_call> stray close",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect(H, bad[i], bad[i], NULL);
    /* a good call after a malformed one */
    const char *after[] = {"f", "{}", NULL};
    expect(H, "<tool_call>{bad}</tool_call>x<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "<tool_call>{bad}</tool_call>x", after);
}

static void test_llama3(void) {
    const atlas_toolcall_format L = ATLAS_TOOLCALL_LLAMA3;
    expect(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}", "", WEATHER);
    expect(L, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}", "", WEATHER);
    expect(L, "\n  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}  \n", "", WEATHER);
    const char *two[] = {"a", "{\"x\": 1}", "b", "{}", NULL};
    expect(L, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}", "", two);
    const char *plain[] = {
        "The weather in Paris is sunny.",
        "{\"answer\": 42}",
        "{\"name\": \"f\", \"parameters\": {",
        "{\"name\": \"f\", \"parameters\": {}} and then some prose",
        "<|python_tag|>print('hi')",
        "   ",
        "<|python",
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) expect(L, plain[i], plain[i], NULL);
}

static void test_mistral(void) {
    const atlas_toolcall_format M = ATLAS_TOOLCALL_MISTRAL;
    expect(M, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}]", "", WEATHER);
    expect(M, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}, \"id\": \"abcdefghi\"}]", "", WEATHER);
    expect(M, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}", "", WEATHER);
    const char *two[] = {"a", "{}", "b", "{\"k\": true}", NULL};
    expect(M, "Sure.[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"k\": true}", "Sure.", two);
    expect(M, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"k\": true}}]", "", two);
    const char *bad[] = {"[TOOL_CALLS][{\"name\": ", "[TOOL_CALLS]", "[TOOL_CALLS][]", "[TOOL_CALLS]f[ARGS]oops",
                         "Plain answer with [TOOL brackets]", "[TOOL_CALLS][{\"name\": \"a\"}, 5]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect(M, bad[i], bad[i], NULL);
}

/* Streams text in pieces of `chunk` bytes; returns the joined text and fills calls. */
static char *stream(atlas_toolcall_format f, const char *text, size_t chunk, json_t *calls) {
    atlas_toolcall_parser *p = NULL;
    if (atlas_toolcall_parser_new(f, &p) != ATLAS_OK) return NULL;
    size_t n = strlen(text), o = 0;
    char *all = calloc(1, n + 64);
    bool ok = all != NULL;
    for (size_t i = 0; ok && i <= n; i += chunk) {
        char *piece = NULL;
        size_t len = i + chunk <= n ? chunk : n - i;
        atlas_status st = i < n ? atlas_toolcall_parser_feed(p, text + i, len, &piece, calls)
                                : atlas_toolcall_parser_finish(p, &piece, calls);
        ok = st == ATLAS_OK && o + strlen(piece) < n + 64;
        if (ok) {
            memcpy(all + o, piece, strlen(piece));
            o += strlen(piece);
        }
        free(piece);
        if (i < n && i + chunk > n) i = n - chunk; /* so that the next round finishes */
    }
    atlas_toolcall_parser_free(p);
    if (!ok) {
        free(all);
        return NULL;
    }
    return all;
}

static void test_streaming(void) {
    /* plain text is released at once; a possible marker start is held back */
    atlas_toolcall_parser *p = NULL;
    json_t *calls = json_array();
    char *t = NULL;
    CHECK_OK(atlas_toolcall_parser_new(ATLAS_TOOLCALL_HERMES, &p));
    CHECK_OK(atlas_toolcall_parser_feed(p, "Hello", 5, &t, calls));
    CHECK(t && !strcmp(t, "Hello"));
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, " <tool_c", 8, &t, calls));
    CHECK(t && !strcmp(t, " "));
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, "all>{\"name\": \"f\", \"arguments\": {}}", 34, &t, calls));
    CHECK(t && !strcmp(t, ""));
    free(t);
    CHECK(json_array_size(calls) == 0);
    CHECK_OK(atlas_toolcall_parser_feed(p, "</tool_call> bye", 16, &t, calls));
    CHECK(t && !strcmp(t, " bye"));
    free(t);
    CHECK(json_array_size(calls) == 1); /* yielded as soon as it closed */
    CHECK_OK(atlas_toolcall_parser_finish(p, &t, calls));
    CHECK(t && !strcmp(t, ""));
    free(t);
    atlas_toolcall_parser_free(p);
    json_decref(calls);
    atlas_toolcall_parser_free(NULL);

    /* Llama 3: prose starts streaming with its first character */
    calls = json_array();
    CHECK_OK(atlas_toolcall_parser_new(ATLAS_TOOLCALL_LLAMA3, &p));
    CHECK_OK(atlas_toolcall_parser_feed(p, "  ", 2, &t, calls));
    CHECK(t && !strcmp(t, ""));
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, "Sun", 3, &t, calls));
    CHECK(t && !strcmp(t, "  Sun"));
    free(t);
    atlas_toolcall_parser_free(p);
    json_decref(calls);

    /* Llama 3: a JSON reply that is not a call is released once its object closes */
    calls = json_array();
    CHECK_OK(atlas_toolcall_parser_new(ATLAS_TOOLCALL_LLAMA3, &p));
    CHECK_OK(atlas_toolcall_parser_feed(p, "{\"answer\": ", 11, &t, calls));
    CHECK(t && !strcmp(t, "")); /* could still be a call */
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, "42}", 3, &t, calls));
    CHECK_MSG(t && !strcmp(t, "{\"answer\": 42}"), "got [%s]", t ? t : "(null)");
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, " more", 5, &t, calls));
    CHECK(t && !strcmp(t, " more"));
    free(t);
    atlas_toolcall_parser_free(p);
    /* a call followed by prose: text as soon as the prose starts after a closed object */
    CHECK_OK(atlas_toolcall_parser_new(ATLAS_TOOLCALL_LLAMA3, &p));
    CHECK_OK(atlas_toolcall_parser_feed(p, "{\"name\": \"f\", \"parameters\": {}}", 31, &t, calls));
    CHECK(t && !strcmp(t, "")); /* a complete call: held until the end */
    free(t);
    CHECK_OK(atlas_toolcall_parser_feed(p, " so}", 4, &t, calls));
    CHECK_MSG(t && !strcmp(t, "{\"name\": \"f\", \"parameters\": {}} so}"), "got [%s]", t ? t : "(null)");
    free(t);
    CHECK(json_array_size(calls) == 0);
    atlas_toolcall_parser_free(p);
    json_decref(calls);

    /* every chunk size gives the same result as the whole text */
    const char *texts[] = {
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\nDone <tool_",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "ok [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
    };
    atlas_toolcall_format fmts[] = {ATLAS_TOOLCALL_HERMES, ATLAS_TOOLCALL_LLAMA3, ATLAS_TOOLCALL_MISTRAL};
    const char *content[] = {"Let me check.\n\nDone <tool_", "", "ok "};
    for (int k = 0; k < 3; k++) {
        for (size_t chunk = 1; chunk < 12; chunk++) {
            json_t *c = json_array();
            char *got = stream(fmts[k], texts[k], chunk, c);
            CHECK_MSG(got && !strcmp(got, content[k]), "format %d chunk %zu: [%s]", k, chunk, got ? got : "(null)");
            CHECK_MSG(json_array_size(c) == 1, "format %d chunk %zu: %zu calls", k, chunk, json_array_size(c));
            free(got);
            json_decref(c);
        }
    }
}

/* Random texts built from marker fragments: no crash, streaming == whole, and when no call
 * was found the text comes back unchanged. */
static void test_random(void) {
    static const char *frags[] = {"<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":", "\"f\"", "[TOOL_CALLS]", "[ARGS]",
                                  "<|python_tag|>", "abc", " ", "\n", ",", "\"arguments\"", "[", "]", "<tool", "é", ";",
                                  "{\"name\": \"g\", \"arguments\": {}}", "\"parameters\"", "<", "[TOOL"};
    unsigned seed = 12345;
    int agree = 0, total = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char text[512];
        size_t o = 0;
        int nfr = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 12;
        for (int i = 0; i < nfr; i++) {
            const char *f = frags[((seed = seed * 1103515245u + 12345u) >> 16) % (sizeof frags / sizeof frags[0])];
            if (o + strlen(f) + 1 >= sizeof text) break;
            memcpy(text + o, f, strlen(f));
            o += strlen(f);
        }
        text[o] = 0;
        atlas_toolcall_format fmt = (atlas_toolcall_format)(iter % 4);
        char *whole = NULL;
        json_t *calls = NULL;
        CHECK_OK(atlas_toolcall_parse(fmt, text, &whole, &calls));
        size_t chunk = 1 + ((seed = seed * 1103515245u + 12345u) >> 16) % 7;
        json_t *c2 = json_array();
        char *streamed = stream(fmt, text, chunk, c2);
        total++;
        if (whole && streamed && !strcmp(whole, streamed) && json_array_size(calls) == json_array_size(c2)) agree++;
        else fprintf(stderr, "disagree (format %d chunk %zu): [%s] -> [%s] vs [%s]\n", fmt, chunk, text, whole ? whole : "", streamed ? streamed : "");
        if (whole && calls && json_array_size(calls) == 0)
            CHECK_MSG(!strcmp(whole, text), "format %d lost text: [%s] -> [%s]", fmt, text, whole);
        free(whole);
        free(streamed);
        json_decref(calls);
        json_decref(c2);
    }
    CHECK_MSG(agree == total, "%d of %d random texts agree", agree, total);
}

static void test_detect(void) {
    struct {
        const char *dir, *family;
        atlas_toolcall_format want;
    } cases[] = {
        {"tiny-qwen3", NULL, ATLAS_TOOLCALL_HERMES},
        {"templates/qwen2_5", NULL, ATLAS_TOOLCALL_HERMES},
        {"templates/mistral_nemo", NULL, ATLAS_TOOLCALL_MISTRAL},
        {"templates/llama3_2", NULL, ATLAS_TOOLCALL_LLAMA3},
        {"tiny-llama3", "LlamaForCausalLM", ATLAS_TOOLCALL_LLAMA3},
        {"templates/gemma3", "Gemma3ForCausalLM", ATLAS_TOOLCALL_NONE},
        {"templates/gpt_oss", NULL, ATLAS_TOOLCALL_HARMONY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        atlas_template *t = NULL;
        CHECK_OK(atlas_template_load(harness_data_path(cases[i].dir), &t));
        if (!t) continue;
        atlas_toolcall_format f = atlas_toolcall_format_detect(atlas_template_source(t), cases[i].family);
        CHECK_MSG(f == cases[i].want, "%s: detected %s", cases[i].dir, atlas_toolcall_format_name(f));
        atlas_template_free(t);
    }
    CHECK(atlas_toolcall_format_detect(NULL, "Qwen2ForCausalLM") == ATLAS_TOOLCALL_HERMES);
    CHECK(atlas_toolcall_format_detect(NULL, "MistralForCausalLM") == ATLAS_TOOLCALL_MISTRAL);
    CHECK(atlas_toolcall_format_detect(NULL, NULL) == ATLAS_TOOLCALL_NONE);
    CHECK(atlas_toolcall_format_detect(NULL, "GptOssForCausalLM") == ATLAS_TOOLCALL_HARMONY);
    atlas_toolcall_format hf = ATLAS_TOOLCALL_NONE;
    CHECK_OK(atlas_toolcall_format_parse("harmony", &hf));
    CHECK(hf == ATLAS_TOOLCALL_HARMONY);
    atlas_toolcall_parser *hp = NULL; /* read from ids (atlas/harmony.h), not from text */
    CHECK(atlas_toolcall_parser_new(ATLAS_TOOLCALL_HARMONY, &hp) == ATLAS_ERR_INVALID && hp == NULL);
    CHECK(!strcmp(atlas_toolcall_format_name(ATLAS_TOOLCALL_HERMES), "hermes"));
    atlas_toolcall_parser *p = NULL;
    CHECK(atlas_toolcall_parser_new((atlas_toolcall_format)42, &p) == ATLAS_ERR_INVALID && p == NULL);
}

int main(void) {
    test_hermes();
    test_llama3();
    test_mistral();
    test_streaming();
    test_random();
    test_detect();
    return harness_finish();
}
