/* server/server.c — starting and stopping the server (atlas/server.h), and the route table
 * that it hands the HTTP transport as its dispatch function: CORS preflights, the API key,
 * shutdown, body limits and JSON bodies, then the endpoint (api.c, api_misc.c). */
#include <arpa/inet.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "atlas/engine.h"
#include "atlas/utf8.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/errors.h"
#include "server/embed.h"
#include "server/gen.h"
#include "server/ollama.h"
#include "server/page.h"
#include "server/respstore.h"
#include "server/responses.h"
#include "server/state.h"

static const double STOP_GRACE_S = 3.0; /* for requests in flight to answer at shutdown */

atlas_server_params atlas_server_default_params(void) {
    atlas_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body = 4u << 20;
    p.max_connections = 2048;
    p.max_connections_per_ip = 256;
    p.timeout_s = 30;
    p.header_timeout_s = 10;
    p.body_timeout_s = 60;
    p.reasoning = true;
    p.cors = "local";
    p.responses_max = 1024;
    p.responses_ttl_s = 3600;
    p.log_fd = -1;
    p.log_format = ATLAS_LOG_TEXT;
    p.log_level = ATLAS_LOG_INFO;
    return p;
}


/* --- routing --------------------------------------------------------------------------- */

/* GET /: the chat page for a browser (its Accept asks for HTML), else what Ollama answers
 * there, which is how its clients find a server. */
static void root(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    if (atlas_page_wanted(call)) atlas_page_get(call, body, arg, r);
    else atlas_ollama_root(call, body, arg, r);
}

typedef struct route {
    const char *method;
    const char *path;   /* exact, or with one "{}" segment for a model id */
    atlas_api_handler fn;
    atlas_route_id id;
    bool open;          /* reachable without the API key */
} route;

static const route routes[] = {
    {"POST", "/v1/chat/completions", atlas_api_chat, ATLAS_ROUTE_CHAT, false},
    {"POST", "/v1/completions", atlas_api_completions, ATLAS_ROUTE_COMPLETIONS, false},
    {"POST", "/v1/messages", atlas_api_messages, ATLAS_ROUTE_MESSAGES, false},
    {"POST", "/v1/messages/count_tokens", atlas_api_count_tokens, ATLAS_ROUTE_COUNT_TOKENS,
     false},
    {"GET", "/v1/models", atlas_api_models, ATLAS_ROUTE_MODELS, false},
    {"POST", "/v1/models/{}/load", atlas_api_model_load, ATLAS_ROUTE_MODEL_LOAD, false},
    {"POST", "/v1/models/{}/unload", atlas_api_model_unload, ATLAS_ROUTE_MODEL_UNLOAD, false},
    {"GET", "/v1/models/{}", atlas_api_model_get, ATLAS_ROUTE_MODELS, false},
    {"POST", "/v1/responses", atlas_responses_create, ATLAS_ROUTE_RESPONSES, false},
    {"POST", "/v1/embeddings", atlas_api_embeddings, ATLAS_ROUTE_EMBEDDINGS, false},
    {"GET", "/v1/responses/{}/input_items", atlas_responses_input_items, ATLAS_ROUTE_RESPONSES,
     false},
    {"GET", "/v1/responses/{}", atlas_responses_get, ATLAS_ROUTE_RESPONSES, false},
    {"DELETE", "/v1/responses/{}", atlas_responses_delete, ATLAS_ROUTE_RESPONSES, false},
    {"GET", "/health", atlas_api_health, ATLAS_ROUTE_HEALTH, true},
    {"GET", "/metrics", atlas_api_metrics, ATLAS_ROUTE_METRICS, false},
    {"POST", "/tokenize", atlas_api_tokenize, ATLAS_ROUTE_TOKENIZE, false},
    {"POST", "/detokenize", atlas_api_detokenize, ATLAS_ROUTE_DETOKENIZE, false},
    {"POST", "/apply-template", atlas_api_apply_template, ATLAS_ROUTE_TEMPLATE, false},
    /* Ollama's API (ollama.h); GET / is how its clients find a server (and where a browser
     * finds the chat page), so it needs no key */
    {"POST", "/api/chat", atlas_ollama_chat, ATLAS_ROUTE_OLLAMA_CHAT, false},
    {"POST", "/api/generate", atlas_ollama_generate, ATLAS_ROUTE_OLLAMA_GENERATE, false},
    {"GET", "/api/tags", atlas_ollama_tags, ATLAS_ROUTE_OLLAMA, false},
    {"GET", "/api/ps", atlas_ollama_ps, ATLAS_ROUTE_OLLAMA, false},
    {"POST", "/api/show", atlas_ollama_show, ATLAS_ROUTE_OLLAMA, false},
    {"GET", "/api/version", atlas_ollama_version, ATLAS_ROUTE_OLLAMA, false},
    {"POST", "/api/embed", atlas_ollama_embed, ATLAS_ROUTE_OLLAMA, false},
    {"POST", "/api/embeddings", atlas_ollama_embed, ATLAS_ROUTE_OLLAMA, false},
    {"GET", "/", root, ATLAS_ROUTE_OLLAMA, true},
    /* the chat page's scripts and styles (page.h): a page loads them without a key */
    {"GET", "/ui/{}", atlas_page_get, ATLAS_ROUTE_OTHER, true},
};
enum { N_ROUTES = sizeof routes / sizeof routes[0] };

/* Paths of another API's dialect: every error answered there (the key, the body, the route
 * itself) is rewritten into that API's shape. */
static const struct {
    const char *path;
    bool prefix; /* every path it begins, else that path only */
    void (*reshape)(atlas_http_reply *r);
} dialects[] = {
    {"/v1/messages", true, atlas_api_error_to_anthropic}, /* and count_tokens */
    {"/api/", true, atlas_ollama_error_reshape},
    {"/api", false, atlas_ollama_error_reshape},
    {"/", false, atlas_ollama_error_reshape}, /* how Ollama's clients find a server */
};

static void reshape_errors(const atlas_http_call *call, atlas_http_reply *r) {
    for (size_t i = 0; i < sizeof dialects / sizeof dialects[0]; i++) {
        const char *p = dialects[i].path;
        if (dialects[i].prefix ? !strncmp(call->url, p, strlen(p)) : !strcmp(call->url, p)) {
            dialects[i].reshape(r);
            return;
        }
    }
}

/* The client's key against ours, in time that depends only on the lengths' maximum: a
 * bearer token, or Anthropic's x-api-key header. */
static bool key_ok(const atlas_server *s, const char *header, const char *x_api_key) {
    if (!s->api_key) return true;
    static const char bearer[] = "Bearer "; /* the scheme's case does not matter (RFC 9110) */
    const char *k = x_api_key;
    if (header && !strncasecmp(header, bearer, sizeof bearer - 1)) k = header + sizeof bearer - 1;
    if (!k) return false;
    size_t n = strlen(k), m = s->api_key_len, longest = n > m ? n : m;
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < longest; i++) {
        unsigned char a = i < n ? (unsigned char)k[i] : 0;
        unsigned char b = i < m ? (unsigned char)s->api_key[i] : 0;
        diff |= (unsigned)(a ^ b);
    }
    return diff == 0;
}

static json_t *parse_body(atlas_http_call *call, atlas_http_reply *r) {
    json_error_t e;
    if (call->len == 0) {
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_INVALID, NULL,
                              "the request body is empty: a JSON object is required");
        return NULL;
    }
    json_t *v = json_loadb(call->body, call->len, JSON_REJECT_DUPLICATES, &e);
    if (!v) {
        char msg[400];
        snprintf(msg, sizeof msg, "malformed JSON body at line %d column %d (byte %d): %s",
                 e.line, e.column, e.position, e.text);
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_FORMAT, NULL, msg);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, ATLAS_ERR_INVALID, NULL,
                              "the request body must be a JSON object");
        return NULL;
    }
    return v;
}

/* The methods the routes of pattern take, as an Allow header lists them ("GET, POST"). */
static void allowed_methods(const char *pattern, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < N_ROUTES; i++)
        if (!strcmp(routes[i].path, pattern) && !strstr(out, routes[i].method))
            used += (size_t)snprintf(out + used, cap - used, "%s%s%s", used ? ", " : "",
                                     routes[i].method,
                                     !strcmp(routes[i].method, "GET") ? ", HEAD" : "");
}

/* OPTIONS for a known path (pattern): without an Origin, not a browser's preflight but a
 * client asking what the path takes: 204 with Allow. A preflight: 204 with what the browser
 * asked to use, when the Origin may; 403 otherwise. No API key: browsers send none with a
 * preflight. */
static void preflight(atlas_http_call *call, const char *pattern, atlas_http_reply *r) {
    if (!atlas_http_header(call, "Origin")) {
        allowed_methods(pattern, r->allow, sizeof r->allow);
        r->status = 204;
        return;
    }
    if (!atlas_http_cors_allow(call)) {
        const char *origin = atlas_http_header(call, "Origin");
        char msg[200];
        snprintf(msg, sizeof msg, "cross-origin requests from '%.100s' are not allowed "
                                  "(atlas serve --cors-origin)", origin ? origin : "");
        atlas_api_error_reply(r, ATLAS_API_ERR_FORBIDDEN, ATLAS_OK, NULL, msg);
        return;
    }
    r->status = 204;
    r->preflight = true;
}

/* Whether name (a Host header's name, port and brackets removed: n bytes) is in list. */
static bool host_listed(const char *list, const char *name, size_t n) {
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if ((len == 1 && *p == '*') || (len == n && !strncasecmp(p, name, n))) return true;
        p = end ? end + 1 : p + len;
    }
    return false;
}

/* localhost, or an address in 127/8 or ::1 as an address (a DNS name such as
 * 127.0.0.1.example.com is another site's, whatever it resolves to). */
static bool is_loopback(const char *name, size_t n) {
    if (n == 9 && !strncasecmp(name, "localhost", 9)) return true;
    char buf[64];
    unsigned char a[sizeof(struct in6_addr)];
    if (n >= sizeof buf) return false;
    memcpy(buf, name, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET, buf, a) == 1) return a[0] == 127;
    return inet_pton(AF_INET6, buf, a) == 1 && !memcmp(a, &in6addr_loopback, sizeof a);
}

/* The name of a Host header (n bytes at *name): its port and an IPv6 address's brackets
 * removed; false when it is malformed. */
static bool host_name(const char *host, const char **name, size_t *n) {
    *name = host;
    if (*host == '[') { /* [::1]:8080 */
        const char *close = strchr(host, ']');
        if (!close) return false;
        *name = host + 1;
        *n = (size_t)(close - *name);
    } else {
        const char *colon = strchr(host, ':');
        *n = colon ? (size_t)(colon - host) : strlen(host);
    }
    return true;
}

/* The Host header against the allow-list: a page on another site that rebinds its DNS name
 * to this machine sends its own name. Loopback binds answer the loopback names and the bound
 * address; other binds any name unless allowed_hosts lists them. No Host (HTTP/1.0): allowed,
 * as a browser always sends one. */
static bool host_ok(const atlas_server *s, const char *host) {
    if (!host) return true;
    const char *name;
    size_t n;
    if (!host_name(host, &name, &n)) return false;
    if (host_listed(s->allowed_hosts, name, n)) return true;
    size_t bn = strlen(s->host), an = strlen(s->listen.addr);
    if (!s->listen.loopback) return !s->allowed_hosts;
    return is_loopback(name, n) || (n == bn && !strncasecmp(name, s->host, n)) ||
           (n == an && !strncasecmp(name, s->listen.addr, n));
}

/* Whether a request comes from a page of this server's own origin (the chat page): its Origin
 * is the scheme and Host it was sent to, by a name that a rebinding site cannot have. A
 * loopback bind answers only such names (host_ok); other binds trust an address, the name
 * they were bound by and the names --allowed-hosts lists, not any name at all, as a site
 * whose DNS name is made to point here would be its own origin too. */
static bool own_origin(const atlas_server *s, const atlas_http_call *call) {
    const char *host = atlas_http_header(call, "Host"), *name;
    size_t n;
    if (!atlas_http_origin_is_host(call) || !host_name(host, &name, &n)) return false;
    if (s->listen.loopback || host_listed(s->allowed_hosts, name, n)) return true;
    char buf[64];
    unsigned char addr[sizeof(struct in6_addr)];
    if (n < sizeof buf) {
        memcpy(buf, name, n);
        buf[n] = '\0';
        if (inet_pton(AF_INET, buf, addr) == 1 || inet_pton(AF_INET6, buf, addr) == 1)
            return true;
    }
    return n == strlen(s->host) && !strncasecmp(name, s->host, n);
}

/* The checks every route shares, then its handler; false when one of them answered. */
static bool admit(atlas_server *s, atlas_http_call *call, const route *rt, atlas_http_reply *r,
                  json_t **body) {
    const char *auth = atlas_http_header(call, "Authorization");
    *body = NULL;
    const char *host = atlas_http_header(call, "Host");
    if (!host_ok(s, host)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the Host '%.100s' is not served here (atlas serve "
                                  "--allowed-hosts)", host);
        atlas_api_error_reply(r, ATLAS_API_ERR_FORBIDDEN, ATLAS_OK, NULL, msg);
        return false;
    }
    /* a page of another origin may post a "simple" request without a preflight: refuse
     * every state-changing request from an origin the CORS rule does not allow */
    const char *origin = atlas_http_header(call, "Origin");
    if (origin && strcmp(call->method, "GET") && strcmp(call->method, "HEAD") &&
        !atlas_http_cors_allow(call) && !own_origin(s, call)) {
        char msg[200];
        snprintf(msg, sizeof msg, "cross-origin requests from '%.100s' are not allowed "
                                  "(atlas serve --cors-origin)", origin);
        atlas_api_error_reply(r, ATLAS_API_ERR_FORBIDDEN, ATLAS_OK, NULL, msg);
        return false;
    }
    const char *x_key = atlas_http_header(call, "x-api-key");
    if (!rt->open && !key_ok(s, auth, x_key)) {
        atlas_api_error_reply(r, ATLAS_API_ERR_AUTH, ATLAS_OK, NULL,
                              auth || x_key ? "invalid API key"
                                            : "missing API key: send \"Authorization: Bearer "
                                              "KEY\" or \"x-api-key: KEY\"");
        return false;
    }
    if (atomic_load(&s->stopping)) {
        atlas_api_error_reply(r, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, NULL,
                              "the server is shutting down");
        return false;
    }
    if (call->too_large) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes",
                 s->p.max_body);
        atlas_api_error_reply(r, ATLAS_API_ERR_TOO_LARGE, ATLAS_OK, NULL, msg);
        return false;
    }
    if (!strcmp(call->method, "POST") && !(call->len == 0 && strstr(rt->path, "{}"))) {
        *body = parse_body(call, r);
        if (!*body) return false;
    }
    return true;
}

/* The model a request names, for its log line: the route's (/v1/models/{id}) or the
 * body's "model", as the client wrote it (it may name none that is served), cut on a
 * character and made valid UTF-8. */
static void note_model(atlas_http_call *call, const char *arg, const json_t *body) {
    bool model_id = arg[0] && !strncmp(call->url, "/v1/models/", 11); /* not a response id */
    const char *m = model_id ? arg : json_string_value(json_object_get(body, "model"));
    if (m) atlas_utf8_clean(call->log.model, sizeof call->log.model, m, strlen(m));
}

/* The route of this method and URL.  The first route whose path matches names the resource
 * (the table lists /v1/models/{}/load before /v1/models/{}, whose id could swallow
 * "NAME/load"); *pattern is its path, for a 405's Allow when none of its methods is this. */
static const route *find_route(const atlas_http_call *call, char *arg, size_t cap,
                               const char **pattern) {
    *pattern = NULL;
    arg[0] = '\0'; /* an exact path leaves it empty; a path with {} fills it when it matches */
    for (int i = 0; i < N_ROUTES; i++) {
        const route *rt = &routes[i];
        if (*pattern && strcmp(rt->path, *pattern)) continue;
        if (!atlas_http_route_match(rt->path, call->url, arg, cap)) continue;
        *pattern = rt->path;
        /* HEAD wherever GET is (RFC 9110): the transport sends the headers alone */
        if (!strcmp(rt->method, call->method) ||
            (!strcmp(call->method, "HEAD") && !strcmp(rt->method, "GET")))
            return rt;
    }
    return NULL;
}

static atlas_route_id route_call(atlas_server *s, atlas_http_call *call, atlas_http_reply *r) {
    char arg[512];
    const char *pattern;
    const route *rt = find_route(call, arg, sizeof arg, &pattern);
    if (!strcmp(call->method, "OPTIONS") && pattern) {
        preflight(call, pattern, r);
        return ATLAS_ROUTE_OTHER;
    }
    if (rt) {
        json_t *body;
        bool admitted = admit(s, call, rt, r, &body);
        note_model(call, arg, body);
        if (admitted) {
            /* this thread served earlier requests: a failure must not report their message */
            atlas_error_clear();
            rt->fn(call, body, arg, r);
        }
        json_decref(body);
        return rt->id;
    }
    char msg[240];
    if (pattern) {
        allowed_methods(pattern, r->allow, sizeof r->allow);
        snprintf(msg, sizeof msg, "%s %.120s: method not allowed (it takes %s)", call->method,
                 call->url, r->allow);
    } else {
        snprintf(msg, sizeof msg, "%s %.120s: no such endpoint", call->method, call->url);
    }
    atlas_api_error_reply(r, pattern ? ATLAS_API_ERR_METHOD : ATLAS_API_ERR_NO_ROUTE, ATLAS_OK,
                          NULL, msg);
    return ATLAS_ROUTE_OTHER;
}

/* The transport's dispatch function: route, answer, count, log (a stream's line is its
 * own, written as it closes: gen.c). */
static void dispatch(void *ctx, atlas_http_call *call, atlas_http_reply *r) {
    atlas_server *s = ctx;
    atlas_log_request_start(s->log, &call->log, call->len + call->dropped);
    atlas_route_id id = route_call(s, call, r);
    reshape_errors(call, r);
    atlas_server_metrics_request(&s->metrics, id, r->status);
    if (r->stream.read) return;
    call->log.status = r->status;
    snprintf(call->log.reason, sizeof call->log.reason, "%s", r->reason);
    call->log.total_ms = (atlas_http_now() - call->t_start) * 1e3;
    atlas_log_request_done(s->log, &call->log);
}

void atlas_server_log(atlas_server *s, atlas_log_level level, const char *fmt, ...) {
    if (!s) return;
    va_list ap;
    va_start(ap, fmt);
    atlas_log_vmessage(s->log, level, true, fmt, ap);
    va_end(ap);
}

/* --- the models' residency in the log ------------------------------------------------- */

/* Where a load read its weights from, as the log says it. */
static const char *source_text(const char *source) {
    if (!source) return "?";
    if (!strcmp(source, "host")) return "the host tier (no file read)";
    if (!strcmp(source, "page_cache")) return "the page cache";
    return source;
}

static const char *why_text(const atlas_residency_event *ev, char *buf, size_t cap) {
    const char *r = ev->reason ? ev->reason : "";
    if (!strcmp(r, "request")) return "for a request";
    if (!strcmp(r, "load")) return "asked to load";
    if (!strcmp(r, "unload")) return "asked to unload";
    if (!strcmp(r, "shutdown")) return "the server stops";
    if (!strcmp(r, "keep_alive")) return "idle past its keep-alive";
    if (!strcmp(r, "swap")) {
        snprintf(buf, cap, "to make room for %.200s", ev->other ? ev->other : "another model");
        return buf;
    }
    return r;
}

/* When each step of a load ended, in ms after it began (the steps it had), so that what a
 * load holds up beside serving can be matched to its steps (bench/gpu/beside.py). */
static json_t *load_steps(const atlas_model_load_times *t) {
    json_t *o = json_object();
    const struct { const char *name; double at; } steps[] = {
        {"config", t->config}, {"files", t->files},   {"backend", t->backend},
        {"weights", t->weights}, {"kv", t->kv}, {"tokenizer", t->tokenizer}, {"end", t->end}};
    for (size_t i = 0; o && t->begin > 0 && i < sizeof steps / sizeof steps[0]; i++)
        if (steps[i].at > 0)
            json_object_set_new(o, steps[i].name,
                                json_real(round((steps[i].at - t->begin) * 10) / 10));
    return o;
}

void atlas_server_log_residency(atlas_server *s, const atlas_residency_event *ev) {
    if (!s || !ev || !ev->model) return;
    static const char *const names[] = {"model_loaded", "model_load_failed", "model_released",
                                        "model_draining"};
    if ((unsigned)ev->kind > ATLAS_RESIDENCY_DRAINING) return;
    json_t *o = json_pack("{s:s, s:s, s:s?, s:s?}", "event", names[ev->kind], "model",
                          ev->model, "reason", ev->reason, "for", ev->other);
    double gib = ev->bytes / 1073741824.0;
    char buf[256], swap[300] = "", err[400] = "", beside[80] = "";
    const char *why = why_text(ev, buf, sizeof buf);
    if (o && ev->kind != ATLAS_RESIDENCY_DRAINING)
        json_object_set_new(o, "duration_ms", json_real(round(ev->seconds * 1e4) / 10));
    if (ev->beside > 0 && ev->kind <= ATLAS_RESIDENCY_LOAD_FAILED) { /* they kept serving */
        snprintf(beside, sizeof beside, "; beside %d resident model%s that kept serving",
                 ev->beside, ev->beside == 1 ? "" : "s");
        if (o) json_object_set_new(o, "serving_beside", json_integer(ev->beside));
    }
    if (o && ev->bytes) json_object_set_new(o, "bytes", json_integer((json_int_t)ev->bytes));
    switch (ev->kind) {
    case ATLAS_RESIDENCY_LOADED:
        if (ev->other) {
            snprintf(swap, sizeof swap, "; swapped in for %.200s in %.2f s (release and load)",
                     ev->other, ev->swap_seconds);
            if (o) json_object_set_new(o, "swap_ms", json_real(round(ev->swap_seconds * 1e4) / 10));
        }
        if (ev->source && o) json_object_set_new(o, "source", json_string(ev->source));
        if (o && ev->times) json_object_set_new(o, "steps_ms", load_steps(ev->times));
        if (o && ev->times && ev->times->repack_ms > 0)
            json_object_set_new(o, "repack_ms", json_real(round(ev->times->repack_ms * 10) / 10));
        if (ev->tier_off && *ev->tier_off) {
            snprintf(err, sizeof err, "; no host tier: %.300s", ev->tier_off);
            if (o) json_object_set_new(o, "host_tier_off", json_string(ev->tier_off));
        }
        atlas_log_fields(s->log, ATLAS_LOG_INFO, true, o, "model %s: loaded in %.2f s (%.2f GiB "
                         "of weights and KV cache) from %s, %s%s%s%s", ev->model, ev->seconds,
                         gib, source_text(ev->source), why, swap, beside, err);
        break;
    case ATLAS_RESIDENCY_LOAD_FAILED:
        atlas_log_fields(s->log, ATLAS_LOG_ERROR, true, o, "model %s: load failed after %.2f s: "
                         "%s%s", ev->model, ev->seconds, why, beside);
        break;
    case ATLAS_RESIDENCY_RELEASED:
        if (ev->error && *ev->error) {
            snprintf(err, sizeof err, "; it failed to free: %.300s", ev->error);
            if (o) json_object_set_new(o, "error", json_string(ev->error));
        }
        atlas_log_fields(s->log, ev->error && *ev->error ? ATLAS_LOG_ERROR : ATLAS_LOG_INFO, true,
                         o, "model %s: released in %.2f s (%.2f GiB), %s%s", ev->model,
                         ev->seconds, gib, why, err);
        break;
    case ATLAS_RESIDENCY_DRAINING:
        if (o) json_object_set_new(o, "running", json_integer(ev->running));
        atlas_log_fields(s->log, ATLAS_LOG_INFO, true, o, "model %s: draining, %d request(s) "
                         "still running, %s", ev->model, ev->running, why);
        break;
    }
}

/* --- start and stop --------------------------------------------------------------------- */

/* Copies the aliases ("NAME=MODEL"); atlas_server_serve checks that each names a model the
 * engine serves. */
static atlas_status copy_aliases(atlas_server *s, const char *const *a, int n) {
    if (n <= 0) return ATLAS_OK;
    if (!(s->aliases = calloc((size_t)n, sizeof *s->aliases)))
        return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    for (int i = 0; i < n; i++) {
        const char *eq = a[i] ? strchr(a[i], '=') : NULL;
        if (!eq || eq == a[i] || !eq[1])
            return atlas_fail(ATLAS_ERR_INVALID, "alias '%s': expected NAME=MODEL",
                              a[i] ? a[i] : "(null)");
        if (!(s->aliases[i] = strdup(a[i])))
            return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
        s->n_aliases = i + 1;
    }
    return ATLAS_OK;
}

/* Whether every alias names a model the engine serves. */
static atlas_status check_aliases(const atlas_server *s, atlas_engine *engine) {
    atlas_engine_model_status ms[64];
    int k = atlas_engine_models(engine, ms, 64);
    for (int i = 0; i < s->n_aliases; i++) {
        const char *eq = strchr(s->aliases[i], '=');
        bool served = false;
        for (int j = 0; j < k && j < 64; j++) served |= !strcmp(ms[j].name, eq + 1);
        if (!served)
            return atlas_fail(ATLAS_ERR_INVALID, "alias '%s': no model '%s' is served",
                              s->aliases[i], eq + 1);
    }
    return ATLAS_OK;
}

atlas_status atlas_server_create(const atlas_server_params *params, atlas_server **out) {
    *out = NULL;
    atlas_server_params p = params ? *params : atlas_server_default_params();
    if (!p.host) p.host = "127.0.0.1";
    if (p.max_body == 0 || p.max_connections < 1 || p.timeout_s < 1 ||
        p.header_timeout_s < 1 || p.body_timeout_s < 1 || p.max_connections_per_ip < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "server params: max_body, max_connections and "
                                             "the timeouts must be positive");
    atlas_server *s = calloc(1, sizeof *s);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    s->listen.fd = -1;
    s->host = strdup(p.host);
    s->api_key = p.api_key && *p.api_key ? strdup(p.api_key) : NULL;
    s->api_key_len = s->api_key ? strlen(s->api_key) : 0;
    s->cors = strdup(p.cors ? p.cors : "none");
    s->allowed_hosts = p.allowed_hosts && *p.allowed_hosts ? strdup(p.allowed_hosts) : NULL;
    s->p = p;
    s->p.allowed_hosts = s->allowed_hosts;
    s->p.host = s->host;
    s->p.api_key = s->api_key;
    s->p.cors = s->cors;
    s->p.aliases = NULL;
    s->p.n_aliases = 0;
    s->created = (int64_t)time(NULL);
    atomic_init(&s->stopping, false);
    atomic_init(&s->next_id, 1);
    atlas_server_metrics_init(&s->metrics);
    atlas_status st = atlas_log_create(p.log_fd, p.log_format, p.log_level, &s->log);
    if (st == ATLAS_OK) atlas_log_set_start(s->log, p.start_ms);
    if (st == ATLAS_OK &&
        (!s->host || !s->cors || (p.api_key && *p.api_key && !s->api_key) ||
         (p.allowed_hosts && *p.allowed_hosts && !s->allowed_hosts)))
        st = atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    if (st == ATLAS_OK) st = copy_aliases(s, p.aliases, p.n_aliases);
    if (st == ATLAS_OK)
        st = atlas_respstore_new(p.responses_max, p.responses_ttl_s, &s->responses);
    if (st == ATLAS_OK) st = atlas_listen_open(s->host, p.port, &s->listen);
    if (st != ATLAS_OK) {
        atlas_server_stop(s);
        return st;
    }
    *out = s;
    return ATLAS_OK;
}

atlas_status atlas_server_serve(atlas_server *s, atlas_engine *engine) {
    if (!s || !engine || s->http || s->listen.fd < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "server: serve needs a created server that does "
                                             "not serve yet, and an engine");
    ATLAS_TRY(check_aliases(s, engine));
    s->engine = engine;
    const atlas_server_params *p = &s->p;
    atlas_http_params hp = {.host = s->host,
                            .port = p->port,
                            .listen_fd = s->listen.fd,
                            .v6 = s->listen.v6,
                            .max_body = p->max_body,
                            .max_connections = p->max_connections,
                            .max_per_ip = p->max_connections_per_ip,
                            .timeout_s = p->timeout_s,
                            .header_timeout_s = p->header_timeout_s,
                            .body_timeout_s = p->body_timeout_s,
                            .cors = s->cors,
                            .cert_file = p->ssl_certfile,
                            .key_file = p->ssl_keyfile,
                            .log = s->log};
    atlas_status st = atlas_gen_waker_start(&s->waker);
    if (st == ATLAS_OK) st = atlas_http_start(&hp, dispatch, s, &s->http);
    /* the daemon listens on its own descriptor: once it stops (or quiesces) nothing else
     * may keep the socket open, or the kernel would go on accepting into its backlog */
    atlas_listen_close(&s->listen);
    if (st != ATLAS_OK) s->engine = NULL;
    return st;
}

atlas_status atlas_server_start(atlas_engine *engine, const atlas_server_params *params,
                                atlas_server **out) {
    ATLAS_TRY(atlas_server_create(params, out));
    atlas_status st = atlas_server_serve(*out, engine);
    if (st != ATLAS_OK) {
        atlas_server_stop(*out);
        *out = NULL;
    }
    return st;
}

int atlas_server_port(const atlas_server *s) {
    return s->http ? atlas_http_port(s->http) : s->listen.port;
}

const char *atlas_server_address(const atlas_server *s) { return s->listen.addr; }

bool atlas_server_loopback(const atlas_server *s) { return s->listen.loopback; }

void atlas_server_stop(atlas_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    if (s->http) {
        /* No new connections; new requests on open ones get 503.  Requests in flight see
         * `stopping` within one poll period, cancel their engine requests and answer (a
         * stream gets an error event and [DONE]); give them a moment to be written before
         * the transport closes every connection and joins the threads. */
        atlas_http_quiesce(s->http);
        double until = atlas_http_now() + STOP_GRACE_S;
        for (;;) {
            pthread_mutex_lock(&s->metrics.mu);
            int64_t active = s->metrics.active_requests;
            pthread_mutex_unlock(&s->metrics.mu);
            if (active <= 0 || atlas_http_now() > until) break;
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        atlas_http_stop(s->http);
    }
    /* after the workers it wakes are joined: no worker waits for an event any more */
    atlas_gen_waker_stop(s->waker);
    s->waker = NULL;
    atlas_listen_close(&s->listen);
    atlas_server_metrics_destroy(&s->metrics);
    atlas_log_free(s->log);
    atlas_respstore_free(s->responses);
    free(s->host);
    free(s->api_key);
    free(s->cors);
    free(s->allowed_hosts);
    for (int i = 0; i < s->n_aliases; i++) free(s->aliases[i]);
    free(s->aliases);
    free(s);
}
