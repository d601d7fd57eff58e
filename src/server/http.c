/* server/http.c — libmicrohttpd glue: the daemon (one thread per connection, keep-alive,
 * connection limit and timeout), request bodies with a size limit, the API key, routing,
 * and turning a handler's reply into an HTTP response (JSON, text, or an SSE stream). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "server/gen.h"
#include "server/http.h"

double atlas_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

atlas_server_params atlas_server_default_params(void) {
    atlas_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body = 4u << 20;
    p.max_connections = 512;
    p.timeout_s = 30;
    p.reasoning = true;
    p.cors = "local";
    return p;
}

int atlas_server_port(const atlas_server *s) { return s->port; }

void atlas_http_reply_json(atlas_http_reply *r, int status, json_t *v) {
    free(r->body);
    r->body = v ? json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(v);
    if (!r->body) { /* out of memory: still answer */
        status = 500;
        r->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                         "\"param\":null,\"code\":null}}");
    }
    r->len = r->body ? strlen(r->body) : 0;
    r->status = status;
    r->ctype = "application/json";
}

void atlas_http_reply_text(atlas_http_reply *r, int status, const char *ctype, char *text,
                           size_t len) {
    free(r->body);
    r->body = text;
    r->len = len;
    r->status = status;
    r->ctype = ctype;
}

bool atlas_http_client_gone(const atlas_http_call *call) {
    if (call->fd < 0) return false;
    struct pollfd pfd = {.fd = call->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
    if (pfd.revents & POLLIN) { /* a pipelined request, or the end of the stream */
        char c;
        ssize_t n = recv(call->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

/* --- routing --------------------------------------------------------------------------- */

typedef struct route {
    const char *method;
    const char *path;   /* exact, or with one "{}" segment for a model id */
    atlas_http_handler fn;
    atlas_route_id id;
    bool open;          /* reachable without the API key */
} route;

static const route routes[] = {
    {"POST", "/v1/chat/completions", atlas_api_chat, ATLAS_ROUTE_CHAT, false},
    {"POST", "/v1/completions", atlas_api_completions, ATLAS_ROUTE_COMPLETIONS, false},
    {"GET", "/v1/models", atlas_api_models, ATLAS_ROUTE_MODELS, false},
    {"POST", "/v1/models/{}/load", atlas_api_model_load, ATLAS_ROUTE_MODEL_LOAD, false},
    {"POST", "/v1/models/{}/unload", atlas_api_model_unload, ATLAS_ROUTE_MODEL_UNLOAD, false},
    {"GET", "/v1/models/{}", atlas_api_model_get, ATLAS_ROUTE_MODELS, false},
    {"GET", "/health", atlas_api_health, ATLAS_ROUTE_HEALTH, true},
    {"GET", "/metrics", atlas_api_metrics, ATLAS_ROUTE_METRICS, false},
    {"POST", "/tokenize", atlas_api_tokenize, ATLAS_ROUTE_TOKENIZE, false},
    {"POST", "/detokenize", atlas_api_detokenize, ATLAS_ROUTE_DETOKENIZE, false},
    {"POST", "/apply-template", atlas_api_apply_template, ATLAS_ROUTE_TEMPLATE, false},
};
enum { N_ROUTES = sizeof routes / sizeof routes[0] };

/* Matches url against a pattern; the "{}" segment (a model id, which may itself hold '/',
 * as in "org/name") is copied into arg. */
bool atlas_http_route_match(const char *pattern, const char *url, char *arg, size_t cap) {
    const char *hole = strstr(pattern, "{}");
    if (!hole) return strcmp(pattern, url) == 0;
    size_t pre = (size_t)(hole - pattern), post = strlen(hole + 2), n = strlen(url);
    if (n < pre + post + 1 || strncmp(pattern, url, pre) != 0 ||
        strcmp(url + n - post, hole + 2) != 0)
        return false;
    size_t alen = n - pre - post;
    if (alen >= cap) return false;
    memcpy(arg, url + pre, alen);
    arg[alen] = '\0';
    return true;
}

/* The client's key against ours, in time that depends only on the lengths' maximum. */
static bool key_ok(const atlas_server *s, const char *header) {
    if (!s->api_key) return true;
    static const char bearer[] = "Bearer ";
    if (!header || strncmp(header, bearer, sizeof bearer - 1) != 0) return false;
    const char *k = header + sizeof bearer - 1;
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

/* --- CORS ------------------------------------------------------------------------------- */

/* "http(s)://localhost|127.0.0.1|[::1]" and an optional ":port". */
static bool origin_local(const char *o) {
    static const char *const hosts[] = {"localhost", "127.0.0.1", "[::1]"};
    if (!strncmp(o, "http://", 7)) o += 7;
    else if (!strncmp(o, "https://", 8)) o += 8;
    else return false;
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        size_t n = strlen(hosts[i]);
        if (strncmp(o, hosts[i], n) != 0) continue;
        const char *p = o + n;
        if (*p == '\0') return true;
        if (*p++ != ':' || !*p) return false;
        while (*p >= '0' && *p <= '9') p++;
        return *p == '\0';
    }
    return false;
}

/* Whether a page of this Origin may read the server's answers (the value to send back as
 * Access-Control-Allow-Origin, or NULL). */
static const char *cors_allow(const atlas_server *s, const char *origin) {
    const char *rule = s->cors;
    if (!origin || !*origin || !strcmp(rule, "none")) return NULL;
    if (!strcmp(rule, "*")) return "*";
    if (!strcmp(rule, "local")) return origin_local(origin) ? origin : NULL;
    size_t n = strlen(origin);
    for (const char *p = rule; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, origin, n)) return origin;
        p += len + (end != NULL);
    }
    return NULL;
}

/* A preflight (OPTIONS) for a known path: 204 with what the browser asked to use, when
 * the Origin may; 403 otherwise. No API key: browsers send none with a preflight. */
static void preflight(atlas_http_call *call, atlas_http_reply *r) {
    const char *origin = MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND, "Origin");
    if (!cors_allow(call->srv, origin)) {
        char msg[200];
        snprintf(msg, sizeof msg, "cross-origin requests from '%.100s' are not allowed "
                                  "(atlas serve --cors-origin)", origin ? origin : "");
        atlas_api_error_reply(r, ATLAS_API_ERR_FORBIDDEN, ATLAS_OK, NULL, msg);
        return;
    }
    r->status = 204;
    r->preflight = true;
}

static atlas_route_id dispatch(atlas_http_call *call, atlas_http_reply *r) {
    atlas_server *s = call->srv;
    char arg[512];
    bool path_known = false;
    if (!strcmp(call->method, "OPTIONS")) {
        for (int i = 0; i < N_ROUTES && !path_known; i++)
            path_known = atlas_http_route_match(routes[i].path, call->url, arg, sizeof arg);
        if (path_known) {
            preflight(call, r);
            return ATLAS_ROUTE_OTHER;
        }
    }
    for (int i = 0; i < N_ROUTES; i++) {
        const route *rt = &routes[i];
        arg[0] = '\0';
        if (!atlas_http_route_match(rt->path, call->url, arg, sizeof arg)) continue;
        path_known = true;
        if (strcmp(rt->method, call->method) != 0) continue;
        const char *auth =
            MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND, "Authorization");
        if (!rt->open && !key_ok(s, auth)) {
            atlas_api_error_reply(r, ATLAS_API_ERR_AUTH, ATLAS_OK, NULL,
                                  auth ? "invalid API key" : "missing API key: send "
                                                             "\"Authorization: Bearer KEY\"");
            return rt->id;
        }
        if (atomic_load(&s->stopping)) {
            atlas_api_error_reply(r, ATLAS_API_ERR_SHUTDOWN, ATLAS_OK, NULL,
                                  "the server is shutting down");
            return rt->id;
        }
        if (call->too_large) {
            char msg[160];
            snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes",
                     s->p.max_body);
            atlas_api_error_reply(r, ATLAS_API_ERR_TOO_LARGE, ATLAS_OK, NULL, msg);
            return rt->id;
        }
        json_t *body = NULL;
        if (!strcmp(call->method, "POST") && !(call->len == 0 && strstr(rt->path, "{}"))) {
            body = parse_body(call, r);
            if (!body) return rt->id;
        }
        atlas_error_clear();
        rt->fn(call, body, arg, r);
        json_decref(body);
        return rt->id;
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s %.120s: %s", call->method, call->url,
             path_known ? "method not allowed" : "no such endpoint");
    atlas_api_error_reply(r, path_known ? ATLAS_API_ERR_METHOD : ATLAS_API_ERR_NO_ROUTE,
                          ATLAS_OK, NULL, msg);
    return ATLAS_ROUTE_OTHER;
}

enum { DRAIN_MAX = 64 << 20 }; /* bytes of a too-large body still read (and dropped) */
static const double STOP_GRACE_S = 3.0; /* for requests in flight to answer at shutdown */

/* --- MHD callbacks ---------------------------------------------------------------------- */

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = atlas_gen_sse_read(cls, buf, max);
    /* Each event goes out now: libmicrohttpd corks the socket while it builds a response of
     * unknown size, which would hold tokens back by up to 200 ms. */
    int fd = atlas_gen_fd(cls), off = 0, on = 1;
    if (n > 0 && fd >= 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_CORK, &off, sizeof off);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    return n;
}

static void sse_free(void *cls) { atlas_gen_sse_close(cls); }

static enum MHD_Result send_reply(atlas_http_call *call, atlas_http_reply *r) {
    struct MHD_Response *resp;
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read,
                                                 r->stream, sse_free);
        if (!resp) {
            atlas_gen_sse_close(r->stream);
            r->stream = NULL;
            return MHD_NO;
        }
        r->stream = NULL; /* MHD owns it now: sse_free releases it */
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) return MHD_NO;
        r->body = NULL;
        MHD_add_response_header(resp, "Content-Type", r->ctype ? r->ctype : "text/plain");
    }
    /* Tells keep-alive clients when we drop an idle connection, so that they stop reusing
     * it before (a client that writes into a connection as we close it sees EPIPE). */
    char ka[32];
    snprintf(ka, sizeof ka, "timeout=%d", call->srv->p.timeout_s);
    MHD_add_response_header(resp, "Keep-Alive", ka);
    const char *origin = MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND, "Origin");
    const char *allow = cors_allow(call->srv, origin);
    if (allow) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
        if (strcmp(allow, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (r->preflight) {
        const char *want = MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND,
                                                       "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                want && *want ? want : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    enum MHD_Result ok = MHD_queue_response(call->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    call->answered = true;
    return ok;
}

static atlas_http_call *call_new(atlas_server *s, struct MHD_Connection *conn, const char *url,
                                 const char *method) {
    atlas_http_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    c->conn = conn;
    c->url = strdup(url);
    snprintf(c->method, sizeof c->method, "%s", method);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    c->t_start = atlas_now();
    if (!c->url) {
        free(c);
        return NULL;
    }
    return c;
}

static enum MHD_Result answer_now(atlas_http_call *c, atlas_route_id id, atlas_http_reply *r) {
    atlas_server_metrics_request(&c->srv->metrics, id, r->status);
    enum MHD_Result ok = send_reply(c, r);
    free(r->body);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx) {
    atlas_server *s = cls;
    atlas_http_call *c = *ctx;
    if (!c) { /* headers are in; the body (if any) follows in later calls */
        c = call_new(s, conn, url, method);
        if (!c) return MHD_NO;
        *ctx = c;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        /* Too large: a body of reasonable size is read and dropped so that the client,
         * still writing it, sees the 413 (most clients do not read before they finish
         * writing); a huge one is refused at once and the connection closed. */
        if (declared > s->p.max_body) c->too_large = true;
        if (declared > s->p.max_body && declared > DRAIN_MAX) {
            atlas_http_reply r = {0};
            atlas_route_id id = dispatch(c, &r);
            return answer_now(c, id, &r);
        }
        return MHD_YES;
    }
    if (c->answered) { /* the body of a refused request: drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_large || c->len + n > s->p.max_body) {
            c->too_large = true;
            c->dropped += n;
            return c->dropped > DRAIN_MAX ? MHD_NO : MHD_YES; /* MHD_NO closes it */
        }
        if (c->len + n + 1 > c->cap) {
            size_t want = c->cap ? c->cap : 4096;
            while (want < c->len + n + 1) want *= 2;
            char *grown = realloc(c->body, want);
            if (!grown) return MHD_NO;
            c->body = grown;
            c->cap = want;
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        c->body[c->len] = '\0';
        return MHD_YES;
    }
    atlas_http_reply r = {0};
    atlas_route_id id = dispatch(c, &r);
    return answer_now(c, id, &r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                         enum MHD_RequestTerminationCode why) {
    (void)cls, (void)conn, (void)why;
    atlas_http_call *c = *ctx;
    if (!c) return;
    free(c->url);
    free(c->body);
    free(c);
    *ctx = NULL;
}

/* libmicrohttpd's diagnostics are dropped: library code does not print. */
static void on_log(void *cls, const char *fmt, va_list ap) { (void)cls, (void)fmt, (void)ap; }

/* --- start and stop --------------------------------------------------------------------- */

static atlas_status bind_addr(const char *host, int port, struct sockaddr_storage *ss,
                              bool *v6) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (port < 0 || port > 65535) return atlas_fail(ATLAS_ERR_RANGE, "port %d: not in 0..65535", port);
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = false;
        return ATLAS_OK;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = true;
        return ATLAS_OK;
    }
    return atlas_fail(ATLAS_ERR_INVALID, "host '%s': not a numeric IPv4 or IPv6 address", host);
}

static atlas_status bound_port(atlas_server *s) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t n = sizeof ss;
    if (!di || getsockname(di->listen_fd, (struct sockaddr *)&ss, &n) != 0)
        return atlas_fail(ATLAS_ERR_INTERNAL, "getsockname on the listening socket failed");
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    return ATLAS_OK;
}

atlas_status atlas_server_start(atlas_engine *engine, const atlas_server_params *params,
                                atlas_server **out) {
    *out = NULL;
    atlas_server_params p = params ? *params : atlas_server_default_params();
    if (!p.host) p.host = "127.0.0.1";
    if (p.max_body == 0 || p.max_connections < 1 || p.timeout_s < 1)
        return atlas_fail(ATLAS_ERR_INVALID, "server params: max_body, max_connections and "
                                             "timeout_s must be positive");
    struct sockaddr_storage ss;
    bool v6 = false;
    ATLAS_TRY(bind_addr(p.host, p.port, &ss, &v6));
    atlas_server *s = calloc(1, sizeof *s);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    s->engine = engine;
    s->host = strdup(p.host);
    s->api_key = p.api_key && *p.api_key ? strdup(p.api_key) : NULL;
    s->api_key_len = s->api_key ? strlen(s->api_key) : 0;
    s->p = p;
    s->p.host = s->host;
    s->p.api_key = s->api_key;
    s->cors = strdup(p.cors ? p.cors : "none");
    s->p.cors = s->cors;
    s->created = (int64_t)time(NULL);
    atomic_init(&s->stopping, false);
    atomic_init(&s->next_id, 1);
    atlas_server_metrics_init(&s->metrics);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &ss,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)p.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_END);
    if (!s->mhd) {
        int err = errno;
        atlas_server_stop(s);
        return atlas_fail(ATLAS_ERR_IO, "listening on %s port %d failed: %s", p.host, p.port,
                          strerror(err));
    }
    atlas_status st = bound_port(s);
    if (st != ATLAS_OK) {
        atlas_server_stop(s);
        return st;
    }
    *out = s;
    return ATLAS_OK;
}

void atlas_server_stop(atlas_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    if (s->mhd) {
        /* No new connections; new requests on open ones get 503.  Requests in flight see
         * `stopping` within one poll period, cancel their engine requests and answer (a
         * stream gets an error event and [DONE]); give them a moment to be written before
         * MHD closes every connection and joins the threads. */
        MHD_socket lfd = MHD_quiesce_daemon(s->mhd);
        if (lfd != MHD_INVALID_SOCKET) close(lfd);
        double until = atlas_now() + STOP_GRACE_S;
        for (;;) {
            pthread_mutex_lock(&s->metrics.mu);
            int64_t active = s->metrics.active_requests;
            pthread_mutex_unlock(&s->metrics.mu);
            if (active <= 0 || atlas_now() > until) break;
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        MHD_stop_daemon(s->mhd);
    }
    atlas_server_metrics_destroy(&s->metrics);
    free(s->host);
    free(s->api_key);
    free(s->cors);
    free(s);
}
