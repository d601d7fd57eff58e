/* fuzz/fuzz-server-format.c — libFuzzer target for the server's output side: engine events
 * (token text of any bytes, token ids in and out of the vocabulary, logprobs, top
 * alternatives, every finish) formatted as OpenAI SSE chunks and as whole responses, for
 * both APIs, with and without tool-call parsing, logprobs, usage, echo and the reasoning
 * splitter; plus the route
 * parser and the error JSON over the input as a URL path.  Input: FLAGS then events, each
 * [kind][len][id lo][id hi][len bytes of text].  Every SSE chunk must be "data: JSON\n\n"
 * with valid JSON, and a finished stream must end in "data: [DONE]\n\n". */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/tokenizer.h"
#include "fuzz_fixture.h"
#include "server/errors.h"
#include "server/gen_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static atlas_tokenizer *tok;
static atlas_server srv; /* only its metrics are used by the formatting */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[4096];
    fuzz_fixture_dir(dir, sizeof dir, "tiny-qwen3", __FILE__);
    if (atlas_tokenizer_load(dir, &tok) != ATLAS_OK) {
        fprintf(stderr, "fuzz-server-format: %s: %s\n", dir, atlas_last_error());
        abort();
    }
    atlas_server_metrics_init(&srv.metrics);
    return 0;
}

/* Each "data: " line of out must hold valid JSON (or [DONE]). */
static void check_sse(const char *out, size_t len, bool done) {
    size_t i = 0;
    bool saw_done = false;
    while (i < len) {
        if (len - i < 6 || memcmp(out + i, "data: ", 6) != 0) abort();
        const char *end = strstr(out + i, "\n\n");
        if (!end) abort();
        size_t n = (size_t)(end - out) - i - 6;
        if (n == 6 && !memcmp(out + i + 6, "[DONE]", 6)) {
            saw_done = true;
        } else {
            /* token text may hold NUL bytes: "\u0000" is valid JSON, so allow it */
            json_t *v = json_loadb(out + i + 6, n, JSON_ALLOW_NUL, NULL);
            if (!json_is_object(v)) abort();
            json_decref(v);
        }
        i = (size_t)(end - out) + 2;
    }
    if (done && !saw_done) abort();
}

static atlas_gen *gen_new(uint8_t flags) {
    atlas_gen *g = calloc(1, sizeof *g);
    if (!g) abort();
    g->srv = &srv;
    g->tok = tok;
    g->o.kind = flags & 1 ? ATLAS_API_COMPLETION : ATLAS_API_CHAT;
    g->o.logprobs = flags & 2;
    g->o.top_logprobs = g->o.logprobs ? 5 : 0;
    g->o.include_usage = flags & 4;
    g->o.tools = (atlas_toolcall_format)((flags >> 3) & 3);
    g->model = "tiny-qwen3";
    g->echo = g->o.kind == ATLAS_API_COMPLETION && (flags & 32) ? "echo \xff text" : NULL;
    g->o.reasoning = flags & 64; /* the <think> splitter (chat only) */
    g->o.reasoning_inside = flags & 128;
    snprintf(g->id, sizeof g->id, "chatcmpl-fuzz");
    if (atlas_gen_format_init(g, NULL, 0) != ATLAS_OK) abort();
    return g;
}

static void gen_free(atlas_gen *g) {
    atlas_gen_format_free(g);
    free(g);
}

/* The next event from the input, or NULL at its end. */
static atlas_gen_event *next_event(const uint8_t *d, size_t size, size_t *pos) {
    if (size - *pos < 4) return NULL;
    const uint8_t *h = d + *pos;
    size_t len = h[1];
    if (len > size - *pos - 4) len = size - *pos - 4;
    int n_top = (h[0] >> 4) & 7;
    atlas_gen_event *e = calloc(1, sizeof *e + (size_t)n_top * sizeof e->top[0] + len + 1);
    if (!e) abort();
    e->type = h[0] & 1 ? ATLAS_EVENT_END : ATLAS_EVENT_TOKEN;
    e->finish = (atlas_finish)((h[0] >> 1) & 3);
    e->status = e->finish == ATLAS_FINISH_ERROR ? ATLAS_ERR_INTERNAL : ATLAS_OK;
    e->message = e->finish == ATLAS_FINISH_ERROR ? "fuzz \"error\"\n" : NULL;
    e->id = (int32_t)(h[2] | h[3] << 8) - 1000; /* negative and past the vocabulary too */
    e->logprob = -(float)h[2] / 7.0f;
    e->n_top = n_top;
    for (int i = 0; i < n_top; i++) e->top[i] = (atlas_top_logprob){e->id + i, -(float)i};
    e->text = (char *)(e->top + n_top);
    memcpy(e->text, h + 4, len);
    e->text_len = len;
    e->usage.prompt_tokens = h[2];
    e->usage.completion_tokens = h[3];
    *pos += 4 + len;
    return e;
}

static void route(const uint8_t *data, size_t size) {
    static const char *patterns[] = {"/v1/chat/completions", "/v1/models/{}/load",
                                     "/v1/models/{}/unload", "/v1/models/{}", "/health"};
    char *url = malloc(size + 1);
    if (!url) abort();
    memcpy(url, data, size);
    url[size] = '\0';
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        char arg[16];
        if (atlas_http_route_match(patterns[i], url, arg, sizeof arg) && strlen(arg) >= sizeof arg)
            abort();
    }
    /* the error JSON quotes client input (URLs, model names): it must stay valid JSON */
    for (int kind = ATLAS_API_ERR_STATUS; kind <= ATLAS_API_ERR_SHUTDOWN; kind++) {
        atlas_http_reply r = {0};
        atlas_api_error_reply(&r, (atlas_api_error)kind, ATLAS_ERR_NOT_FOUND, url, url);
        json_t *v = json_loadb(r.body, r.len, 0, NULL);
        if (!json_is_object(json_object_get(v, "error")) || r.status < 400) abort();
        json_decref(v);
        free(r.body);
    }
    free(url);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 14) return 0;
    route(data, size);
    atlas_gen *s = gen_new(data[0]), *w = gen_new(data[0]);
    size_t pos = 1;
    bool ended = false;
    atlas_gen_event *e;
    while (!ended && (e = next_event(data, size, &pos))) {
        ended = e->type == ATLAS_EVENT_END;
        atlas_status st = atlas_gen_format_event(s, e);
        if (st != ATLAS_OK && !*atlas_last_error()) abort();
        if (st == ATLAS_OK) check_sse(s->out, s->out_len, ended && e->finish <= ATLAS_FINISH_LENGTH);
        s->out_len = 0; /* as if sent */
        st = atlas_gen_format_collect(w, e);
        if (st != ATLAS_OK && !*atlas_last_error()) abort();
        if (ended) {
            w->usage = e->usage;
            w->finish = e->finish;
            json_t *v = atlas_gen_format_response(w);
            if (!v) abort();
            char *txt = json_dumps(v, JSON_COMPACT);
            if (!txt) abort();
            free(txt);
            json_decref(v);
        }
        free(e);
    }
    if (!ended) atlas_gen_format_abort(s, "the client went away");
    gen_free(s);
    gen_free(w);
    return 0;
}
