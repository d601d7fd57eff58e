/* tests/test-harmony.c — Harmony replies read from token ids (atlas/harmony.h): reasoning,
 * content and tool calls, whole and released a token at a time with the text split inside
 * characters, held back to the released count (a stop string's cut), the prompt's state,
 * malformed sequences (each with a stated outcome), and random id sequences that must never
 * crash nor invent text. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/harmony.h"
#include "atlas/tokenizer.h"
#include "harness.h"

static atlas_tokenizer *tok;

typedef struct reply {
    char reasoning[1024], content[1024];
    json_t *calls;
} reply;

static int32_t *encode(const char *text, size_t *n) {
    int32_t *ids = NULL;
    *n = 0;
    CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), false, &ids, n));
    return ids;
}

static void add(char *dst, char *s) {
    if (s && strlen(dst) + strlen(s) < 1024) strcat(dst, s);
    free(s);
}

/* Runs the reply text (encoded with its special tokens) after prompt, one id at a time;
 * released: the bytes shown at each step, the whole decoded text when lag is SIZE_MAX, else
 * lag bytes fewer; cut: the released count at the end (SIZE_MAX: everything). */
static reply run(const char *prompt, const char *text, size_t lag, size_t cut) {
    reply r = {.calls = json_array()};
    size_t np, n;
    int32_t *p = encode(prompt, &np), *ids = encode(text, &n);
    atlas_harmony *h = NULL;
    CHECK_OK(atlas_harmony_new(tok, p, np, &h));
    size_t total = 0;
    for (size_t i = 0; h && i < n; i++) {
        const char *b;
        size_t len;
        if (!atlas_tokenizer_is_special(tok, ids[i]) &&
            atlas_tokenizer_token_bytes(tok, ids[i], &b, &len) == ATLAS_OK)
            total += len;
        size_t rel = lag == SIZE_MAX ? total : (total > lag ? total - lag : 0);
        char *a = NULL, *c = NULL;
        CHECK_OK(atlas_harmony_feed(h, ids[i], rel, &a, &c, r.calls));
        add(r.reasoning, a);
        add(r.content, c);
    }
    char *a = NULL, *c = NULL;
    if (h) CHECK_OK(atlas_harmony_finish(h, cut == SIZE_MAX ? total : cut, &a, &c, r.calls));
    add(r.reasoning, a);
    add(r.content, c);
    atlas_harmony_free(h);
    free(p);
    free(ids);
    return r;
}

static const char *call_field(const reply *r, size_t i, const char *key) {
    json_t *fn = json_object_get(json_array_get(r->calls, i), "function");
    return json_string_value(json_object_get(fn, key));
}

static void expect(const char *what, reply r, const char *reasoning, const char *content,
                   const char *name, const char *args) {
    CHECK_MSG(!strcmp(r.reasoning, reasoning), "%s: reasoning [%s], expected [%s]", what, r.reasoning, reasoning);
    CHECK_MSG(!strcmp(r.content, content), "%s: content [%s], expected [%s]", what, r.content, content);
    CHECK_MSG(json_array_size(r.calls) == (name ? 1u : 0u), "%s: %zu calls", what, json_array_size(r.calls));
    if (name && json_array_size(r.calls) == 1) {
        const char *nm = call_field(&r, 0, "name"), *ar = call_field(&r, 0, "arguments");
        const char *id = json_string_value(json_object_get(json_array_get(r.calls, 0), "id"));
        CHECK_MSG(nm && !strcmp(nm, name), "%s: name %s", what, nm ? nm : "(null)");
        CHECK_MSG(ar && !strcmp(ar, args), "%s: arguments [%s]", what, ar ? ar : "(null)");
        CHECK_MSG(id && !strncmp(id, "call_", 5) && strlen(id) == 29, "%s: id %s", what, id ? id : "(null)");
    }
    json_decref(r.calls);
}

static const char GEN[] = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
static const char CHAT[] = "<|channel|>analysis<|message|>Hmm, r\xc3\xa9sum\xc3\xa9 \xe2\x82\xac<|end|>"
                           "<|start|>assistant<|channel|>final<|message|>Hello w\xc3\xb6rld<|return|>";
static const char CALL[] = "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                           "<|message|>{\"city\": \"Paris\"}<|call|>";

static void test_whole_and_streamed(void) {
    const char *r = "Hmm, r\xc3\xa9sum\xc3\xa9 \xe2\x82\xac", *c = "Hello w\xc3\xb6rld";
    expect("chat", run(GEN, CHAT, SIZE_MAX, SIZE_MAX), r, c, NULL, NULL);
    expect("chat, released 3 bytes late", run(GEN, CHAT, 3, SIZE_MAX), r, c, NULL, NULL);
    expect("chat, released only at the end", run(GEN, CHAT, 100000, SIZE_MAX), r, c, NULL, NULL);
    expect("call", run(GEN, CALL, SIZE_MAX, SIZE_MAX), "", "", "get_weather", "{\"city\": \"Paris\"}");
    expect("call, late", run(GEN, CALL, 5, SIZE_MAX), "", "", "get_weather", "{\"city\": \"Paris\"}");
    expect("recipient before the channel",
           run(GEN, "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>",
               SIZE_MAX, SIZE_MAX), "", "", "lookup", "{}");
    expect("analysis then a call",
           run(GEN, "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary "
                    "to=functions.get_weather<|message|> {\"city\":\"Oslo\"} <|call|>", SIZE_MAX, SIZE_MAX),
           "need weather", "", "get_weather", "{\"city\":\"Oslo\"}");
}

/* Streaming pieces arrive as they can: reasoning before the final channel's text. */
static void test_order(void) {
    size_t np, n;
    int32_t *p = encode(GEN, &np), *ids = encode(CHAT, &n);
    atlas_harmony *h = NULL;
    json_t *calls = json_array();
    CHECK_OK(atlas_harmony_new(tok, p, np, &h));
    bool reasoning_first = true, saw_content = false;
    for (size_t i = 0; h && i < n; i++) {
        char *a = NULL, *c = NULL;
        CHECK_OK(atlas_harmony_feed(h, ids[i], SIZE_MAX, &a, &c, calls));
        if (a && *a && saw_content) reasoning_first = false;
        if (c && *c) saw_content = true;
        free(a);
        free(c);
    }
    CHECK(reasoning_first && saw_content);
    atlas_harmony_free(h);
    json_decref(calls);
    free(p);
    free(ids);
}

/* A stop string cut the reply at a byte: nothing past it, and a call it cut is content. */
static void test_cut(void) {
    /* the headers' text counts: "analysis" (8 bytes), "Hmm, résumé €" (17), "assistant" and
     * "final" (14), then "Hello" */
    expect("cut in the final text", run(GEN, CHAT, 100000, 44), "Hmm, r\xc3\xa9sum\xc3\xa9 \xe2\x82\xac", "Hello",
           NULL, NULL);
    expect("cut in the reasoning", run(GEN, CHAT, 100000, 11), "Hmm", "", NULL, NULL);
    /* "commentary to=functions.get_weather json": 40 bytes of header */
    expect("cut in a call", run(GEN, CALL, 100000, 45), "", "{\"cit", NULL, NULL);
}

static void test_prompt_state(void) {
    expect("prompt opened the final body",
           run("<|start|>assistant<|channel|>final<|message|>", "Hi there<|return|>", SIZE_MAX, SIZE_MAX), "",
           "Hi there", NULL, NULL);
    expect("prompt opened the analysis",
           run("<|start|>assistant<|channel|>analysis<|message|>So", " then<|end|><|start|>assistant<|channel|>"
               "final<|message|>ok", SIZE_MAX, SIZE_MAX), " then", "ok", NULL, NULL);
    expect("prompt inside a header",
           run("<|start|>assistant<|channel|>fin", "al<|message|>done", SIZE_MAX, SIZE_MAX), "", "done", NULL, NULL);
    expect("no Harmony in the prompt", run("plain", "text", SIZE_MAX, SIZE_MAX), "", "text", NULL, NULL);
}

static void test_malformed(void) {
    expect("a call never closed is content",
           run(GEN, "<|channel|>commentary to=functions.f<|message|>{\"a\": 1", SIZE_MAX, SIZE_MAX), "",
           "{\"a\": 1", NULL, NULL);
    expect("arguments that are not a JSON object are content",
           run(GEN, "<|channel|>commentary to=functions.f<|message|>[1, 2]<|call|>", SIZE_MAX, SIZE_MAX), "",
           "[1, 2]", NULL, NULL);
    expect("a built-in tool's call is reasoning",
           run(GEN, "<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|call|>", SIZE_MAX, SIZE_MAX),
           "{\"q\": 1}", "", NULL, NULL);
    expect("a preamble on commentary is content",
           run(GEN, "<|channel|>commentary<|message|>Looking it up<|end|>", SIZE_MAX, SIZE_MAX), "",
           "Looking it up", NULL, NULL);
    expect("a header that never got its body is dropped",
           run(GEN, "<|channel|>final<|end|><|start|>assistant<|channel|>fi", SIZE_MAX, SIZE_MAX), "", "", NULL, NULL);
    expect("<|start|> inside a body ends it",
           run(GEN, "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b", SIZE_MAX,
               SIZE_MAX), "a", "b", NULL, NULL);
    expect("stray markers in a body are ignored",
           run(GEN, "<|channel|>final<|message|>x<|message|>y<|constrain|>z<|return|>", SIZE_MAX, SIZE_MAX), "",
           "xyz", NULL, NULL);
    expect("text between messages is content",
           run(GEN, "<|channel|>final<|message|>a<|end|>b<|message|>c", SIZE_MAX, SIZE_MAX), "", "abc", NULL,
           NULL);
    expect("an empty call body is {}",
           run(GEN, "<|channel|>commentary to=functions.now<|message|><|call|>", SIZE_MAX, SIZE_MAX), "", "", "now",
           "{}");
}

/* Random ids, mostly markers: no crash, no error, and never more text out than decoded. */
static void test_random(void) {
    static const char *marks[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                  "<|constrain|>", "<|call|>", "<|return|>", "analysis",
                                  "final", "commentary", " to=functions.get_weather ", "{}"};
    int32_t pool[12 + 4];
    size_t k = 0;
    for (; k < 12; k++) pool[k] = atlas_tokenizer_token_id(tok, marks[k]);
    pool[k++] = 'a' - 33 + 0; /* a few byte tokens, the two halves of 'é' among them */
    pool[k++] = atlas_tokenizer_token_id(tok, "\xc3\x83");
    pool[k++] = atlas_tokenizer_token_id(tok, "\xc2\xa9");
    pool[k++] = atlas_tokenizer_token_id(tok, "{");
    uint64_t s = 12345;
    int bad = 0;
    for (int t = 0; t < 3000; t++) {
        atlas_harmony *h = NULL;
        json_t *calls = json_array();
        if (atlas_harmony_new(tok, pool, (size_t)(t % 5), &h) != ATLAS_OK) bad++;
        size_t out = 0, dec = 0, n = 1 + (size_t)(t % 40);
        for (size_t i = 0; h && i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            int32_t id = pool[(s >> 33) % (sizeof pool / sizeof *pool)];
            if (id < 0) continue;
            const char *b;
            size_t len;
            if (!atlas_tokenizer_is_special(tok, id) && atlas_tokenizer_token_bytes(tok, id, &b, &len) == ATLAS_OK)
                dec += len;
            char *a = NULL, *c = NULL;
            if (atlas_harmony_feed(h, id, (s >> 20) % 2 ? dec : dec / 2, &a, &c, calls) != ATLAS_OK) bad++;
            out += (a ? strlen(a) : 0) + (c ? strlen(c) : 0);
            free(a);
            free(c);
        }
        char *a = NULL, *c = NULL;
        if (h && atlas_harmony_finish(h, dec, &a, &c, calls) != ATLAS_OK) bad++;
        out += (a ? strlen(a) : 0) + (c ? strlen(c) : 0);
        free(a);
        free(c);
        if (out > dec * 3 + 3) bad++; /* U+FFFD (3 bytes) may stand for one stray byte */
        atlas_harmony_free(h);
        json_decref(calls);
    }
    CHECK_MSG(bad == 0, "%d random sequences failed", bad);
}

static void test_support(void) {
    int32_t ids[2];
    int n = 0;
    CHECK(atlas_harmony_supported(tok));
    atlas_harmony_stop_ids(tok, ids, &n);
    CHECK(n == 2 && ids[0] == atlas_tokenizer_token_id(tok, "<|call|>") &&
          ids[1] == atlas_tokenizer_token_id(tok, "<|return|>"));
    atlas_tokenizer *plain = NULL;
    CHECK_OK(atlas_tokenizer_load(harness_data_path("small/qk-norm"), &plain));
    CHECK(!atlas_harmony_supported(plain));
    atlas_harmony *h = NULL;
    CHECK(atlas_harmony_new(plain, NULL, 0, &h) == ATLAS_ERR_NOT_FOUND && h == NULL);
    atlas_harmony_stop_ids(plain, ids, &n);
    CHECK(n == 0);
    atlas_tokenizer_free(plain);
}

int main(void) {
    CHECK_OK(atlas_tokenizer_load(harness_data_path("harmony/reason"), &tok));
    if (!tok) return harness_finish();
    test_support();
    test_whole_and_streamed();
    test_order();
    test_cut();
    test_prompt_state();
    test_malformed();
    test_random();
    atlas_tokenizer_free(tok);
    return harness_finish();
}
