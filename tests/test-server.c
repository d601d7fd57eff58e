/* tests/test-server.c — the server library over real sockets: an engine with the two
 * fixture models, the server on a free loopback port, requests written by hand (HTTP/1.1),
 * answers parsed with jansson.  Also the pieces that need no socket: request-field checks
 * and the one error table.  Under ASan this is the leak check of the request paths. */
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/engine.h"
#include "atlas/server.h"
#include "atlas/utf8.h"
#include "harness.h"
#include "http_once.h"
#include "server/errors.h"
#include "server/http.h"
#include "server/params.h"

static int port;

static int dial(void) { return http_dial(port); }

static char *exchange(const char *method, const char *path, const char *body, int *status) {
    return http_once(port, method, path, body, status);
}

/* The JSON body of a Content-Length answer. */
static json_t *body_json(const char *resp) {
    const char *b = resp ? strstr(resp, "\r\n\r\n") : NULL;
    return b ? json_loads(b + 4, 0, NULL) : NULL;
}

static json_t *request(const char *method, const char *path, const char *body, int *status) {
    char *resp = exchange(method, path, body, status);
    json_t *v = body_json(resp);
    free(resp);
    return v;
}

static const char *error_param(json_t *v) {
    return json_string_value(json_object_get(json_object_get(v, "error"), "param"));
}

static void test_params(void) {
    const char *param = NULL;
    atlas_gen_params gp;
    json_t *b = json_loads("{\"temperature\": 3}", 0, NULL);
    CHECK(atlas_gen_params_parse(b, ATLAS_API_CHAT, NULL, NULL, &gp, &param) == ATLAS_ERR_INVALID);
    CHECK(param && !strcmp(param, "temperature"));
    CHECK(strstr(atlas_last_error(), "temperature") != NULL);
    atlas_gen_params_free(&gp);
    json_decref(b);
    b = json_loads("{\"max_completion_tokens\": 7, \"stop\": [\"a\", \"b\"], \"seed\": 5, "
                   "\"logit_bias\": {\"42\": -100}, \"logprobs\": true, \"top_logprobs\": 2, "
                   "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                   0, NULL);
    CHECK_OK(atlas_gen_params_parse(b, ATLAS_API_CHAT, NULL, NULL, &gp, &param));
    CHECK(gp.max_tokens == 7 && gp.n_stop == 2 && gp.sp.seed == 5);
    CHECK(gp.sp.n_logit_bias == 1 && gp.bias[0].id == 42 && gp.bias[0].bias == -100.0f);
    CHECK(gp.logprobs && gp.top_logprobs == 2 && gp.stream && gp.include_usage);
    atlas_gen_params_free(&gp);
    json_decref(b);
    b = json_loads("{\"n\": 3}", 0, NULL);
    CHECK_OK(atlas_gen_params_parse(b, ATLAS_API_COMPLETION, NULL, NULL, &gp, &param));
    CHECK(gp.n == 3);
    atlas_gen_params_free(&gp);
    json_decref(b);
    static const char *bad_n[] = {"{\"n\": 0}", "{\"n\": 17}", "{\"n\": 2.5}",
                                  "{\"n\": \"2\"}"};
    for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
        b = json_loads(bad_n[i], 0, NULL);
        CHECK(atlas_gen_params_parse(b, ATLAS_API_COMPLETION, NULL, NULL, &gp, &param) ==
              ATLAS_ERR_INVALID);
        CHECK_MSG(param && !strcmp(param, "n"), "%s: param %s", bad_n[i], param ? param : "-");
        atlas_gen_params_free(&gp);
        json_decref(b);
    }
    /* invalid UTF-8 becomes U+FFFD, valid text is kept */
    json_t *t = atlas_json_text("a\xff" "b\xc3\xa9", 5);
    CHECK(t && !strcmp(json_string_value(t), "a\xef\xbf\xbd" "b\xc3\xa9"));
    json_decref(t);
    /* a cut falls before a character; overlong forms, surrogates and NUL are replaced */
    char cut[8];
    CHECK(atlas_utf8_clean(cut, sizeof cut, "abcde\xe2\x82\xac", 8) == 5 && !strcmp(cut, "abcde"));
    CHECK(atlas_utf8_clean(cut, sizeof cut, "ab\xe2\x82\xac", 5) == 5 && !strcmp(cut, "ab\xe2\x82\xac"));
    CHECK(atlas_utf8_clean(cut, sizeof cut, "a\xe2\x82", 3) == 7 &&
          !strcmp(cut, "a\xef\xbf\xbd\xef\xbf\xbd"));
    char wide[32];
    CHECK(atlas_utf8_clean(wide, sizeof wide, "\xc0\xaf\xed\xa0\x80x\0y", 8) == 20 &&
          !strcmp(wide, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx\xef\xbf\xbdy"));
    CHECK(atlas_utf8_clean(wide, 1, "abc", 3) == 0 && wide[0] == '\0');
    const char *type;
    CHECK(atlas_api_error_http(ATLAS_ERR_NOT_FOUND, &type) == 404);
    CHECK(atlas_api_error_http(ATLAS_ERR_BUSY, &type) == 429 && !strcmp(type, "rate_limit_error"));
    CHECK(atlas_api_error_http(ATLAS_ERR_RANGE, &type) == 400);
    CHECK(atlas_api_error_http(ATLAS_ERR_INTERNAL, &type) == 500);
}

/* Limits on what a client may ask for, each refused naming the field (issue 6 item 4). */
static void expect_refused(const char *body, const char *field, const char *what) {
    const char *param = NULL;
    atlas_gen_params gp;
    json_t *b = json_loads(body, JSON_ALLOW_NUL, NULL); /* the HTTP layer refuses NUL, but */
    CHECK(b != NULL);
    CHECK(atlas_gen_params_parse(b, ATLAS_API_CHAT, NULL, NULL, &gp, &param) == ATLAS_ERR_INVALID);
    CHECK(param && !strcmp(param, field));
    CHECK(strstr(atlas_last_error(), what) != NULL);
    atlas_gen_params_free(&gp);
    json_decref(b);
}

static void test_limits(void) {
    char body[2048];
    snprintf(body, sizeof body, "{\"stop\": [\"%0*d\"]}", ATLAS_MAX_STOP_BYTES + 1, 0);
    expect_refused(body, "stop", "at most 512");
    snprintf(body, sizeof body, "{\"stop\": \"%0*d\"}", ATLAS_MAX_STOP_BYTES, 0);
    const char *param = NULL;
    atlas_gen_params gp;
    json_t *b = json_loads(body, 0, NULL);
    CHECK_OK(atlas_gen_params_parse(b, ATLAS_API_CHAT, NULL, NULL, &gp, &param)); /* at the limit */
    CHECK(gp.n_stop == 1 && strlen(gp.stop[0]) == ATLAS_MAX_STOP_BYTES);
    atlas_gen_params_free(&gp);
    json_decref(b);
    expect_refused("{\"stop\": \"a\\u0000b\"}", "stop", "NUL");
    expect_refused("{\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
                   "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", "stop", "at most 16");
    expect_refused("{\"logit_bias\": {\" 5\": 1}}", "logit_bias", "not a token id");
    expect_refused("{\"logit_bias\": {\"+5\": 1}}", "logit_bias", "not a token id");
    expect_refused("{\"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs", "between");
    expect_refused("{\"max_tokens\": 1e300}", "max_tokens", "integer");
    expect_refused("{\"max_tokens\": 2147483648}", "max_tokens", "between");
    /* the route matcher: ids may hold '/', never overflow arg */
    char arg[8];
    CHECK(atlas_http_route_match("/v1/models/{}/load", "/v1/models/org/m/load", arg, sizeof arg));
    CHECK(!strcmp(arg, "org/m"));
    CHECK(!atlas_http_route_match("/v1/models/{}/load", "/v1/models/12345678/load", arg, sizeof arg));
    CHECK(!atlas_http_route_match("/v1/models/{}/load", "/v1/models//load", arg, sizeof arg));
    CHECK(!atlas_http_route_match("/v1/models/{}", "/v1/models/", arg, sizeof arg));
}

static void test_endpoints(void) {
    int st;
    json_t *v = request("GET", "/health", NULL, &st);
    CHECK(st == 200 && !strcmp(json_string_value(json_object_get(v, "status")), "ok"));
    json_decref(v);
    v = request("GET", "/v1/models", NULL, &st);
    CHECK(st == 200 && json_array_size(json_object_get(v, "data")) == 2);
    json_decref(v);

    v = request("POST", "/v1/chat/completions",
                "{\"model\": \"qwen\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                "\"max_tokens\": 5, \"temperature\": 0, \"ignore_eos\": true}",
                &st);
    CHECK_MSG(st == 200, "status %d", st);
    json_t *usage = json_object_get(v, "usage");
    CHECK(json_integer_value(json_object_get(usage, "completion_tokens")) == 5);
    json_t *choice = json_array_get(json_object_get(v, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(choice, "finish_reason")), "length"));
    json_decref(v);

    char *resp = exchange("POST", "/v1/completions",
                          "{\"model\": \"llama\", \"prompt\": \"Hello\", \"max_tokens\": 4, "
                          "\"temperature\": 0, \"stream\": true, \"ignore_eos\": true}",
                          &st);
    CHECK(st == 200 && resp && strstr(resp, "text/event-stream"));
    CHECK(resp && strstr(resp, "data: [DONE]\n\n"));
    int chunks = 0;
    for (const char *p = resp; p && (p = strstr(p, "data: {")); p++) chunks++;
    CHECK_MSG(chunks >= 5, "%d chunks", chunks); /* 4 tokens + the finish */
    free(resp);

    v = request("POST", "/v1/chat/completions", "{\"model\": \"llama\", \"messages\": [", &st);
    CHECK(st == 400 && json_object_get(v, "error"));
    json_decref(v);
    v = request("POST", "/v1/chat/completions",
                "{\"model\": \"llama\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                "\"max_tokens\": -3}",
                &st);
    CHECK(st == 400 && error_param(v) && !strcmp(error_param(v), "max_tokens"));
    json_decref(v);
    v = request("POST", "/v1/completions", "{\"model\": \"gpt-9\", \"prompt\": \"x\"}", &st);
    CHECK(st == 404 && error_param(v) && !strcmp(error_param(v), "model"));
    json_decref(v);
    char *big = malloc(300000);
    memset(big, ' ', 299999);
    big[0] = '{', big[299998] = '}', big[299999] = '\0';
    v = request("POST", "/v1/completions", big, &st);
    CHECK(st == 413);
    json_decref(v);
    free(big);
}

/* A stream whose client leaves after the first bytes: the engine must see a cancel. */
static void test_disconnect(atlas_engine *e) {
    atlas_engine_metrics m0, m1;
    atlas_engine_get_metrics(e, &m0);
    int fd = dial();
    const char *body = "{\"model\": \"llama\", \"prompt\": \"Go\", \"max_tokens\": 500, "
                       "\"ignore_eos\": true, \"stream\": true}";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    CHECK(write(fd, head, (size_t)n) == n);
    char buf[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    CHECK(poll(&p, 1, 20000) == 1 && read(fd, buf, sizeof buf) > 0);
    close(fd);
    for (int i = 0; i < 100; i++) {
        atlas_engine_get_metrics(e, &m1);
        if (m1.finished_cancelled > m0.finished_cancelled && m1.running == 0) break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK_MSG(m1.finished_cancelled == m0.finished_cancelled + 1, "cancelled %llu -> %llu",
              (unsigned long long)m0.finished_cancelled,
              (unsigned long long)m1.finished_cancelled);
    CHECK(m1.running == 0);
}

int main(void) {
    test_params();
    test_limits();
    char llama[4096], qwen[4096];
    snprintf(llama, sizeof llama, "%s", harness_data_path("tiny-llama3"));
    snprintf(qwen, sizeof qwen, "%s", harness_data_path("tiny-qwen3"));
    if (!harness_require_file(harness_data_path("tiny-llama3/tokenizer.json")) ||
        !harness_require_file(harness_data_path("tiny-qwen3/tokenizer.json")))
        return harness_finish();
    atlas_engine_model models[] = {{.name = "llama", .dir = llama}, {.name = "qwen", .dir = qwen}};
    atlas_engine_params ep = atlas_engine_default_params();
    ep.models = models;
    ep.n_models = 2;
    ep.max_resident = 2;
    ep.parallel = 4;
    ep.ctx_size = 512;
    ep.device = ATLAS_DEVICE_CPU;
    ep.n_threads = 2;
    atlas_engine *e = NULL;
    CHECK_OK(atlas_engine_create(&ep, &e));
    atlas_server_params sp = atlas_server_default_params();
    sp.port = 0;
    sp.max_body = 200000;
    atlas_server *s = NULL;
    CHECK_OK(atlas_server_start(e, &sp, &s));
    if (s) {
        port = atlas_server_port(s);
        CHECK(port > 0);
        test_endpoints();
        test_disconnect(e);
    }
    atlas_server_stop(s);
    atlas_engine_free(e);
    return harness_finish();
}
