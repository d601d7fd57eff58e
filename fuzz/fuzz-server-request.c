/* fuzz/fuzz-server-request.c — libFuzzer target for the server's request bodies, without
 * HTTP or a model: the input is a request body as a client sends it.  It goes through what
 * /v1/chat/completions, /v1/completions, /tokenize, /detokenize and /apply-template do
 * before the engine: the generation parameters of both APIs (logit_bias checked against the
 * vocabulary), the chat template of tests/data/tiny-qwen3 with messages and tools, prompt
 * strings and token-id arrays, token ids back to text.  Input that is not a JSON object
 * becomes the text of the messages, tool-call arguments, prompt and stop of a body.
 * Errors are fine; crashes, leaks, sanitizer reports, and a failure without a message or
 * an empty "param" are not. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/template.h"
#include "atlas/tokenizer.h"
#include "fuzz_fixture.h"
#include "server/api.h"
#include "server/params.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static atlas_tokenizer *tok;
static atlas_template *tmpl;

/* tests/data/tiny-qwen3: from $ATLAS_TEST_DATA, else next to this source file. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[4096];
    fuzz_fixture_dir(dir, sizeof dir, "tiny-qwen3", __FILE__);
    if (atlas_tokenizer_load(dir, &tok) != ATLAS_OK || atlas_template_load(dir, &tmpl) != ATLAS_OK) {
        fprintf(stderr, "fuzz-server-request: %s: %s\n", dir, atlas_last_error());
        abort();
    }
    return 0;
}

static void check(atlas_status st, const char *param) {
    if (st != ATLAS_OK && !*atlas_last_error()) abort(); /* every failure says why */
    if (param && !*param) abort();
}

static void gen_params(const json_t *body) {
    for (int k = ATLAS_API_CHAT; k <= ATLAS_API_COMPLETION; k++) {
        atlas_gen_params gp;
        const char *param = NULL;
        atlas_status st = atlas_gen_params_parse(body, (atlas_api_kind)k, tok, NULL, &gp, &param);
        check(st, param);
        if (st == ATLAS_OK) {
            size_t vocab = atlas_tokenizer_vocab_size(tok);
            for (int i = 0; i < gp.sp.n_logit_bias; i++)
                if (gp.bias[i].id < 0 || (size_t)gp.bias[i].id >= vocab) abort();
            if (gp.n_stop > 16 || gp.top_logprobs < 0 || gp.top_logprobs > 20) abort();
            if (gp.max_tokens < 0 || gp.max_tokens > INT32_MAX) abort();
        }
        atlas_gen_params_free(&gp);
    }
}

static void chat(const json_t *body) {
    char *prompt = NULL;
    bool parse = false;
    const char *param = NULL;
    atlas_status st = atlas_api_render_template(tmpl, "tiny-qwen3", NULL, body, true, &prompt,
                                                NULL, NULL, &parse, &param);
    check(st, param);
    if (st == ATLAS_OK) {
        if (!prompt) abort();
        int32_t *ids = NULL;
        size_t n = 0;
        size_t len = strlen(prompt);
        if (len < (1u << 14)) { /* tokenizing is the tokenizer fuzzer's work; keep it fast */
            check(atlas_tokenizer_encode(tok, prompt, len, false, &ids, &n), NULL);
            free(ids);
        }
    }
    free(prompt);
}

static void completion(const json_t *body) {
    int32_t *ids[ATLAS_API_MAX_PROMPTS] = {0};
    size_t n[ATLAS_API_MAX_PROMPTS] = {0};
    int count = 0;
    const char *param = NULL;
    atlas_status st = atlas_api_completion_prompts(body, tok, ids, n, &count, &param);
    check(st, param);
    if (count < 0 || count > ATLAS_API_MAX_PROMPTS) abort();
    for (int i = 0; i < count; i++) {
        if (st == ATLAS_OK && n[i] == 0) abort();
        if (st == ATLAS_OK) { /* echo: the prompt back as text */
            char *text = NULL;
            size_t len = 0;
            check(atlas_tokenizer_decode(tok, ids[i], n[i], false, &text, &len), NULL);
            json_decref(atlas_json_text(text, len));
            free(text);
        }
        free(ids[i]);
    }
}

static void detokenize(const json_t *body) {
    int32_t *ids = NULL;
    size_t n = 0;
    const char *param = NULL;
    atlas_status st = atlas_api_token_ids(json_object_get(body, "tokens"), tok, &ids, &n, &param);
    check(st, param);
    if (st == ATLAS_OK) {
        char *text = NULL;
        size_t len = 0;
        check(atlas_tokenizer_decode(tok, ids, n, false, &text, &len), NULL);
        json_t *v = atlas_json_text(text, len);
        if (!v) abort(); /* any bytes must become a JSON string */
        json_decref(v);
        free(text);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    json_t *v = atlas_json_text((const char *)data, size); /* any bytes: a JSON string */
    if (!v) abort();
    json_decref(v);
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(body)) { /* not a body: the bytes as the text of every text field */
        json_decref(body);
        json_t *t = atlas_json_text((const char *)data, size);
        body = json_pack("{s:[{s:s, s:O}, {s:s, s:O, s:[{s:s, s:{s:s, s:O}}]}], s:O, s:O, s:O}",
                         "messages", "role", "user", "content", t, "role", "assistant",
                         "content", t, "tool_calls", "type", "function", "function", "name",
                         "f", "arguments", t, "prompt", t, "stop", t, "model", t);
        json_decref(t);
        if (!body) abort();
    }
    gen_params(body);
    chat(body);
    completion(body);
    detokenize(body);
    json_decref(body);
    return 0;
}
