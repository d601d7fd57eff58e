/* tests/test-engine-constraint.c — constrained requests through the engine with the fixture
 * models (random weights, real tokenizers, CPU backend):
 * - a literal program gives exactly its text at temperature 0 (so the greedy fast path,
 *   which would ignore the mask, is not taken) and ends with STOP without an eos;
 *   max_tokens and stop strings still end it first, stop ids cannot (they are masked
 *   until the program is complete); an empty program is refused;
 * - a JSON object program, sampled, ends with STOP and its text parses as an object;
 * - constrained and plain requests batched together give what they give alone;
 *   random weights wander (a string may go on for thousands of tokens), so the sampled
 *   requests carry a logit_bias towards a few closing tokens: the mask still decides
 *   which tokens are possible, the bias only makes the walks end;
 * - the Hermes (tiny-qwen3) and Llama 3 (tiny-llama3) tool-call programs give text that the
 *   tool-call parser turns into exactly one call of the named function;
 * - free text with a trigger: once the (forced) text reaches a strict tool's name, the rest
 *   of its call follows the program, and the text may end after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "atlas/constraint.h"
#include "atlas/engine.h"
#include "atlas/tokenizer.h"
#include "atlas/toolcall.h"
#include "engine_wait.h"
#include "harness.h"

typedef struct coll {
    char text[16384];
    size_t n_text;
    int n_tokens;
    float logprob_min;
    atlas_finish finish;
    char msg[512];
    char stop_string[64];
    int32_t stop_id;
} coll;

static void on_event(const atlas_event *ev, void *user) {
    coll *c = user;
    if (c->n_text + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->n_text, ev->text, ev->text_len);
        c->n_text += ev->text_len;
        c->text[c->n_text] = 0;
    }
    if (ev->type == ATLAS_EVENT_TOKEN) {
        c->n_tokens++;
        if (ev->logprob < c->logprob_min) c->logprob_min = ev->logprob;
    } else {
        c->finish = ev->finish;
        c->stop_id = ev->stop_id;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message);
        snprintf(c->stop_string, sizeof c->stop_string, "%s",
                 ev->stop_string ? ev->stop_string : "");
    }
}

/* Submits r and waits for its end into *c. */
static atlas_status run(atlas_engine *e, const atlas_request *r, coll *c) {
    memset(c, 0, sizeof *c);
    return engine_wait_run(e, r, on_event, c);
}

static atlas_request request(const char *model, const int32_t *ids, size_t n, int max_tokens,
                             float temperature, uint64_t seed) {
    atlas_request r = {.model = model, .prompt = ids, .n_prompt = n, .max_tokens = max_tokens};
    r.sampling = atlas_sampler_default_params();
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return r;
}

/* A logit_bias towards tokens that close strings and containers (see the top). */
static atlas_logit_bias closing_bias[8];
static int n_closing_bias;

static void closing_bias_init(const atlas_tokenizer *tok, float bias) {
    const char *closers[] = {"\"", "}", "]", "\":", "1", "\"}", ",", " \""};
    n_closing_bias = 0;
    for (int i = 0; i < 8; i++) {
        int32_t id = atlas_tokenizer_token_id(tok, closers[i]);
        if (id >= 0) closing_bias[n_closing_bias++] = (atlas_logit_bias){id, bias};
    }
    CHECK(n_closing_bias >= 5);
}

static atlas_request biased(atlas_request r) {
    r.sampling.logit_bias = closing_bias;
    r.sampling.n_logit_bias = n_closing_bias;
    return r;
}

static void test_literal(atlas_engine *e, const int32_t *prompt, size_t n) {
    const char *want = "Hello, constrained world!";
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    atlas_request r = request("qwen", prompt, n, 100, 0, 1);
    r.constraint = c;
    coll out;
    CHECK(run(e, &r, &out) == ATLAS_ERR_INVALID); /* empty program */
    CHECK_OK(atlas_constraint_add_literal(c, want, strlen(want)));
    r.logprobs = 1;
    CHECK_OK(run(e, &r, &out));
    atlas_constraint_free(c); /* the engine copied it; later requests reuse r */
    r.constraint = NULL;
    CHECK_MSG(out.finish == ATLAS_FINISH_STOP && !strcmp(out.text, want),
              "finish %d text '%s' %s", out.finish, out.text, out.msg);
    CHECK(out.stop_id == -1 && out.n_tokens >= 3);
    /* logprobs are of the raw logits: a forced token of a random model is not likely */
    CHECK(out.logprob_min < -1.0f);

    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, want, strlen(want)));
    r = request("qwen", prompt, n, 2, 0, 1);
    r.constraint = c;
    CHECK_OK(run(e, &r, &out));
    CHECK(out.finish == ATLAS_FINISH_LENGTH && out.n_tokens == 2);
    CHECK(!strncmp(out.text, want, out.n_text) && out.n_text > 0);
    /* stop ids are masked while the program is incomplete: make every first token that
     * spells more than "H" a stop id; the text must still come out whole */
    int32_t stop_ids[8];
    int n_stop_ids = 0;
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "qwen", &tok));
    for (size_t len = 2; len <= 6; len++) {
        char piece[8];
        memcpy(piece, want, len);
        piece[len] = 0;
        int32_t id = atlas_tokenizer_token_id(tok, piece);
        if (id >= 0) stop_ids[n_stop_ids++] = id;
    }
    CHECK(n_stop_ids >= 2);
    r = request("qwen", prompt, n, 100, 0, 1);
    r.constraint = c;
    r.stop_ids = stop_ids;
    r.n_stop_ids = n_stop_ids;
    CHECK_OK(run(e, &r, &out));
    CHECK_MSG(out.finish == ATLAS_FINISH_STOP && out.stop_id == -1 && !strcmp(out.text, want),
              "finish %d stop id %d text '%s'", out.finish, out.stop_id, out.text);
    const char *stop[] = {"constrained"};
    r = request("qwen", prompt, n, 100, 0.8f, 7);
    r.constraint = c;
    r.stop = stop;
    r.n_stop = 1;
    CHECK_OK(run(e, &r, &out));
    CHECK(out.finish == ATLAS_FINISH_STOP && !strcmp(out.stop_string, "constrained") &&
          !strcmp(out.text, "Hello, "));
    atlas_constraint_free(c);
}

static void test_json(atlas_engine *e, const int32_t *prompt, size_t n) {
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_json_object(c));
    for (uint64_t seed = 1; seed <= 3; seed++) {
        atlas_request r = biased(request("qwen", prompt, n, 1000, 1.0f, seed));
        r.constraint = c;
        coll out;
        CHECK_OK(run(e, &r, &out));
        CHECK_MSG(out.finish == ATLAS_FINISH_STOP, "seed %llu: finish %d after %d tokens: %s",
                  (unsigned long long)seed, out.finish, out.n_tokens, out.msg);
        json_error_t err;
        json_t *j = json_loadb(out.text, out.n_text, 0, &err);
        CHECK_MSG(json_is_object(j), "seed %llu: %s: %s", (unsigned long long)seed, err.text,
                  out.text);
        json_decref(j);
        printf("json seed %llu: %d tokens, %zu bytes\n", (unsigned long long)seed,
               out.n_tokens, out.n_text);
    }
    atlas_constraint_free(c);
}

/* Several constrained and unconstrained requests at once (masks are computed for the batch
 * while its forward pass runs): each gives what it gives alone. */
static void test_batch(atlas_engine *e, const int32_t *prompt, size_t n) {
    enum { N = 6 };
    atlas_constraint *json = NULL, *lit = NULL;
    CHECK_OK(atlas_constraint_new(&json));
    CHECK_OK(atlas_constraint_add_json_object(json));
    CHECK_OK(atlas_constraint_new(&lit));
    CHECK_OK(atlas_constraint_add_literal(lit, "{\"ok\": true}", 12));
    atlas_request r[N];
    for (int i = 0; i < N; i++) {
        r[i] = biased(request("qwen", prompt, n, 300, 1.0f, 100 + (uint64_t)i));
        r[i].constraint = i % 3 == 0 ? json : i % 3 == 1 ? lit : NULL;
        if (!r[i].constraint) r[i].max_tokens = 12;
    }
    coll alone[N];
    for (int i = 0; i < N; i++) CHECK_OK(run(e, &r[i], &alone[i]));
    static coll together[N];
    static engine_wait waits[N];
    for (int i = 0; i < N; i++) {
        memset(&together[i], 0, sizeof together[i]);
        CHECK_OK(engine_wait_submit(&waits[i], e, &r[i], on_event, &together[i]));
    }
    atlas_constraint_free(json); /* copied by submit */
    atlas_constraint_free(lit);
    for (int i = 0; i < N; i++) {
        coll *c = &together[i];
        engine_wait_end(&waits[i]);
        CHECK_MSG(c->finish == alone[i].finish && !strcmp(c->text, alone[i].text),
                  "request %d: '%s' in the batch, '%s' alone", i, c->text, alone[i].text);
        if (i % 3 != 2) CHECK(c->finish == ATLAS_FINISH_STOP);
        if (i % 3 == 1) CHECK(!strcmp(c->text, "{\"ok\": true}"));
    }
}

/* The tool-call program of the design: head, the name, middle, an object, tail. */
static void tool_call(atlas_engine *e, const char *model, const int32_t *prompt, size_t n,
                      atlas_toolcall_format format, const char *head, const char *middle,
                      const char *tail) {
    const char *names[] = {"get_weather", "get_time", "get"};
    atlas_constraint *c = NULL;
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, head, strlen(head)));
    CHECK_OK(atlas_constraint_add_choice(c, names + 1, 1)); /* the named one: get_time */
    CHECK_OK(atlas_constraint_add_literal(c, middle, strlen(middle)));
    CHECK_OK(atlas_constraint_add_json_object(c));
    CHECK_OK(atlas_constraint_add_literal(c, tail, strlen(tail)));
    int done = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        atlas_request r = biased(request(model, prompt, n, 1000, 1.0f, seed));
        r.constraint = c;
        coll out;
        CHECK_OK(run(e, &r, &out));
        CHECK_MSG(out.finish == ATLAS_FINISH_STOP, "%s seed %llu: finish %d: %s", model,
                  (unsigned long long)seed, out.finish, out.msg);
        printf("%s tool call seed %llu: %d tokens, %zu bytes\n", model,
               (unsigned long long)seed, out.n_tokens, out.n_text);
        char *content = NULL;
        json_t *calls = NULL;
        CHECK_OK(atlas_toolcall_parse(format, out.text, &content, &calls));
        CHECK_MSG(json_array_size(calls) == 1, "%s seed %llu: %zu calls in %s", model,
                  (unsigned long long)seed, json_array_size(calls), out.text);
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        CHECK(name && !strcmp(name, "get_time"));
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        CHECK(json_is_object(a));
        done += json_is_object(a) && name && !strcmp(name, "get_time");
        json_decref(a);
        CHECK(content && strspn(content, " \n") == strlen(content));
        free(content);
        json_decref(calls);
    }
    CHECK(done == 3);
    /* "required": a choice among all names, the prefix "get" told apart by the quote */
    atlas_constraint_free(c);
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_literal(c, head, strlen(head)));
    CHECK_OK(atlas_constraint_add_choice(c, names, 3));
    CHECK_OK(atlas_constraint_add_literal(c, middle, strlen(middle)));
    CHECK_OK(atlas_constraint_add_json_object(c));
    CHECK_OK(atlas_constraint_add_literal(c, tail, strlen(tail)));
    atlas_request r = biased(request(model, prompt, n, 1000, 1.0f, 11));
    r.constraint = c;
    coll out;
    CHECK_OK(run(e, &r, &out));
    json_t *calls = NULL;
    char *content = NULL;
    CHECK_OK(atlas_toolcall_parse(format, out.text, &content, &calls));
    const char *name = json_string_value(
        json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name"));
    CHECK_MSG(out.finish == ATLAS_FINISH_STOP && json_array_size(calls) == 1 && name &&
                  (!strcmp(name, "get") || !strcmp(name, "get_time") ||
                   !strcmp(name, "get_weather")),
              "required: %s", out.text);
    free(content);
    json_decref(calls);
    atlas_constraint_free(c);
}

/* Free text with a trigger (a strict tool under tool_choice "auto"): the text is forced up to
 * the call's name, then the program holds the rest of the call to its schema, then the text
 * is free again (eos allowed). */
static void test_free_text(atlas_engine *e, const atlas_tokenizer *tok, const int32_t *prompt,
                           size_t n) {
    const char *key = "<tool_call>\n{\"name\": \"get_time\"";
    const char *lead = "Sure. <tool_call>\n{\"name\": \"get_time\"";
    atlas_constraint *rest = NULL, *c = NULL;
    CHECK_OK(atlas_constraint_new(&rest));
    const char *args = ", \"arguments\": {\"utc\": ", *tail = "}}\n</tool_call>";
    CHECK_OK(atlas_constraint_add_literal(rest, args, strlen(args)));
    CHECK_OK(atlas_constraint_add_json_value(rest, ATLAS_CONSTRAINT_JSON_BOOLEAN));
    CHECK_OK(atlas_constraint_add_literal(rest, tail, strlen(tail)));
    CHECK_OK(atlas_constraint_new(&c));
    CHECK_OK(atlas_constraint_add_free_text(c, &key, (const atlas_constraint *const *)&rest, 1));
    int32_t *forced = NULL;
    size_t nf = 0;
    CHECK_OK(atlas_tokenizer_encode(tok, lead, strlen(lead), false, &forced, &nf));
    for (uint64_t seed = 1; seed <= 2; seed++) {
        atlas_request r = biased(request("qwen", prompt, n, (int)nf + 40, 1.0f, seed));
        r.constraint = c;
        r.forced = forced;
        r.n_forced = (int)nf;
        coll out;
        CHECK_OK(run(e, &r, &out));
        CHECK_MSG(out.finish == ATLAS_FINISH_STOP || out.finish == ATLAS_FINISH_LENGTH,
                  "free text: finish %d: %s", out.finish, out.msg);
        char *content = NULL;
        json_t *calls = NULL;
        CHECK_OK(atlas_toolcall_parse(ATLAS_TOOLCALL_HERMES, out.text, &content, &calls));
        json_t *fn = json_object_get(json_array_get(calls, 0), "function");
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")) ?
                                  json_string_value(json_object_get(fn, "arguments")) : "", 0,
                                  NULL);
        CHECK_MSG(json_array_size(calls) >= 1 &&
                      !strcmp(json_string_value(json_object_get(fn, "name")), "get_time") &&
                      json_is_boolean(json_object_get(args, "utc")) && json_object_size(args) == 1,
                  "seed %llu: finish %d after %d tokens (%s): %s", (unsigned long long)seed,
                  out.finish, out.n_tokens, out.msg, out.text);
        CHECK(content && !strncmp(content, "Sure.", 5));
        json_decref(args);
        json_decref(calls);
        free(content);
    }
    free(forced);
    atlas_constraint_free(c);
    atlas_constraint_free(rest);
}

int main(void) {
    char qdir[1024], ldir[1024];
    snprintf(qdir, sizeof qdir, "%s/tiny-qwen3", harness_data_dir());
    snprintf(ldir, sizeof ldir, "%s/tiny-llama3", harness_data_dir());
    atlas_engine_model models[] = {{.name = "qwen", .dir = qdir}, {.name = "llama", .dir = ldir}};
    atlas_engine_params p = atlas_engine_default_params();
    p.models = models;
    p.n_models = 2;
    p.max_resident = 2;
    p.device = ATLAS_DEVICE_CPU;
    p.n_threads = 2;
    p.ctx_size = 1536;
    p.parallel = 4;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&p, &e));
    if (!e) return harness_finish();
    const atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_engine_tokenizer(e, "qwen", &tok));
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "Reply with a JSON object describing the weather in Paris.";
    CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    closing_bias_init(tok, 8.0f);
    test_literal(e, ids, n);
    test_json(e, ids, n);
    test_batch(e, ids, n);
    test_free_text(e, tok, ids, n);
    tool_call(e, "qwen", ids, n, ATLAS_TOOLCALL_HERMES, "<tool_call>\n{\"name\": \"",
              "\", \"arguments\": ", "}\n</tool_call>");
    free(ids);
    CHECK_OK(atlas_engine_tokenizer(e, "llama", &tok));
    CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), true, &ids, &n));
    closing_bias_init(tok, 8.0f);
    tool_call(e, "llama", ids, n, ATLAS_TOOLCALL_LLAMA3, "{\"name\": \"", "\", \"parameters\": ",
              "}");
    free(ids);
    atlas_engine_free(e);
    return harness_finish();
}
