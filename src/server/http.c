/* server/http.c — libmicrohttpd glue: the daemon (epoll threads, keep-alive, connection
 * limits, HTTPS), framing checks and request bodies with a size limit, handing each whole
 * request to a worker, and turning its reply into an HTTP response (JSON, text, or an SSE
 * stream).  Connection deadlines, workers and stream pumps are in http_conn.c.  What a
 * request means is the dispatch function's business. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "atlas/utf8.h"
#include "server/http_conn.h"

double atlas_http_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int atlas_http_port(const atlas_http *h) { return h->port; }

const char *atlas_http_header(const atlas_http_call *call, const char *name) {
    return MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND, name);
}

const char *atlas_http_query(const atlas_http_call *call, const char *name) {
    return MHD_lookup_connection_value(call->conn, MHD_GET_ARGUMENT_KIND, name);
}

void atlas_http_reply_json(atlas_http_reply *r, int status, json_t *v) {
    free(r->body);
    r->body = v ? json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(v);
    r->status = status;
    r->ctype = "application/json";
    if (!r->body) { /* out of memory: still answer, in plain text */
        r->status = 500;
        r->ctype = "text/plain";
        r->body = strdup("out of memory\n");
    }
    r->len = r->body ? strlen(r->body) : 0;
}

void atlas_http_reply_text(atlas_http_reply *r, int status, const char *ctype, char *text,
                           size_t len) {
    free(r->body);
    r->body = text;
    r->len = len;
    r->status = status;
    r->ctype = ctype;
}

bool atlas_http_client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
    if (pfd.revents & POLLIN) { /* a pipelined request, or the end of the stream */
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

/* --- route patterns and CORS ------------------------------------------------------------ */

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
static const char *cors_allow(const char *rule, const char *origin) {
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

const char *atlas_http_cors_allow(const atlas_http_call *call) {
    return cors_allow(call->http->cors, atlas_http_header(call, "Origin"));
}

bool atlas_http_origin_is_host(const atlas_http_call *call) {
    const char *origin = atlas_http_header(call, "Origin"), *host = atlas_http_header(call, "Host");
    const char *scheme = call->http->tls ? "https://" : "http://";
    size_t n = strlen(scheme);
    return origin && host && *host && !strncmp(origin, scheme, n) && !strcasecmp(origin + n, host);
}


/* A body over max_body is read and dropped, so that the client, still writing it, sees the
 * 413 (most clients do not read before they finish writing); one that declares more than
 * this is refused at once instead.  A chunked body, of unknown size, is drained up to the
 * body deadline. */
enum { DRAIN_MAX = 64 << 20 };

/* An error body of the transport's own, in the API's shape (errors.c's, for the routes). */
static void reply_error(atlas_http_reply *r, int status, const char *code, const char *msg) {
    json_t *err = json_pack("{s:s, s:s, s:n, s:s?}", "message", msg, "type",
                            status == 413 || status < 500 ? "invalid_request_error"
                                                          : "server_error",
                            "param", "code", code);
    atlas_http_reply_json(r, status, err ? json_pack("{s:o}", "error", err) : NULL);
}

/* --- replies ------------------------------------------------------------------------------ */

static void add_headers(atlas_http_call *call, atlas_http_reply *r, struct MHD_Response *resp) {
    /* Tells keep-alive clients when we drop an idle connection, so that they stop reusing
     * it before (a client that writes into a connection as we close it sees EPIPE); not on
     * a connection that closes after this reply (the client's "Connection: close", a refused
     * body's) */
    const char *conn = atlas_http_header(call, "Connection");
    if (!call->too_large && !(conn && strcasestr(conn, "close"))) {
        char ka[32];
        snprintf(ka, sizeof ka, "timeout=%d", call->http->timeout_s);
        MHD_add_response_header(resp, "Keep-Alive", ka);
    }
    const char *allow = atlas_http_cors_allow(call);
    if (allow) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
        if (strcmp(allow, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (r->preflight) {
        const char *want = atlas_http_header(call, "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                want && *want ? want : "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    if (r->allow[0]) MHD_add_response_header(resp, "Allow", r->allow);
    for (size_t i = 0; i + 1 < sizeof r->headers / sizeof r->headers[0] && r->headers[i]; i += 2)
        MHD_add_response_header(resp, r->headers[i], r->headers[i + 1]);
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
}

/* Queues r (a body, or call->pump's stream) on the connection; on its thread. */
static enum MHD_Result send_reply(atlas_http_call *call, atlas_http_reply *r) {
    struct MHD_Response *resp;
    if (call->pump) {
        struct atlas_http_pump *p = call->pump;
        call->pump = NULL;
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                 atlas_http_pump_read, p, atlas_http_pump_free);
        if (!resp) {
            atlas_http_pump_free(p); /* the worker sees it closed and ends the stream */
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", r->ctype ? r->ctype : "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) return MHD_NO;
        r->body = NULL;
        MHD_add_response_header(resp, "Content-Type", r->ctype ? r->ctype : "text/plain");
    }
    add_headers(call, r, resp);
    /* a refused body may still be on its way: do not read it as the next request */
    if (call->too_large) MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(call->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    call->answered = true;
    return ok;
}

/* The client's address as text, for the access log. */
static void client_addr(struct MHD_Connection *conn, char *buf, size_t cap) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    snprintf(buf, cap, "-");
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)cap);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)cap);
}

/* The access log's line of a request the transport answers itself (no dispatch). */
static void log_refused(atlas_http_call *c, int status) {
    c->log.status = status;
    c->log.total_ms = (atlas_http_now() - c->t_start) * 1e3;
    atlas_log_request_done(c->http->access, &c->log);
}

static atlas_http_call *call_new(atlas_http *h, struct MHD_Connection *conn, const char *url,
                                 const char *method) {
    atlas_http_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->http = h;
    c->ctx = h->ctx;
    c->conn = conn;
    c->url = strdup(url);
    c->reply = calloc(1, sizeof *c->reply);
    snprintf(c->method, sizeof c->method, "%s", method);
    c->fd = -1;
    c->t_start = atlas_http_now();
    snprintf(c->log.method, sizeof c->log.method, "%s", method);
    /* the decoded path holds whatever bytes the client escaped: cut it on a character */
    atlas_utf8_clean(c->log.path, sizeof c->log.path, url, strlen(url));
    client_addr(conn, c->log.client, sizeof c->log.client);
    c->log.ttft_ms = -1;
    if (!c->url || !c->reply) {
        free(c->url);
        free(c->reply);
        free(c);
        return NULL;
    }
    return c;
}

/* Answers on the connection's thread: for what needs no waiting (framing errors, a body
 * refused before it is read). */
static enum MHD_Result answer_now(atlas_http_call *c) {
    c->http->dispatch(c->ctx, c, c->reply);
    if (c->reply->stream.read) { /* not for this path: no dispatch streams a refusal */
        c->reply->stream.close(c->reply->stream.ctx);
        c->reply->stream = (atlas_http_stream){0};
    }
    return send_reply(c, c->reply);
}

/* The body is in: a worker answers while the connection is suspended (dispatch may wait
 * for the engine); the connection's thread sends the reply once resumed. */
static enum MHD_Result hand_off(atlas_http_call *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* a duplicate: the request polls it to notice a client that left, and it must not
     * become another connection's socket while the request still looks */
    c->fd = ci ? dup(ci->connect_fd) : -1;
    atlas_http_set_phase(c->conn, ATLAS_HTTP_BUSY);
    MHD_suspend_connection(c->conn);
    c->dispatched = true;
    atomic_fetch_add(&c->http->in_flight, 1);
    if (atlas_http_submit(c->http, c)) return MHD_YES;
    MHD_resume_connection(c->conn);
    reply_error(c->reply, 503, NULL, "the server is shutting down");
    log_refused(c, 503);
    return send_reply(c, c->reply);
}

/* --- framing ------------------------------------------------------------------------------ */

/* What the request's headers say about its body's length. */
typedef struct framing {
    int n_cl, n_te;
    bool cl_bad;          /* a Content-Length that is not a number (e.g. "-1", "5, 5") */
    bool cl_huge;         /* one past 2^64 */
    bool te_other;        /* a transfer coding besides chunked */
} framing;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
        f->te_other |= strcasecmp(value ? value : "", "chunked") != 0;
        return MHD_YES;
    }
    if (strcasecmp(key, "Content-Length") != 0) return MHD_YES;
    const char *v = value ? value : "";
    size_t n = strspn(v, "0123456789");
    bool bad = n == 0 || v[n] != '\0';
    bool huge = !bad && (n > 20 || (n == 20 && strcmp(v, "18446744073709551615") > 0));
    f->n_cl++;
    f->cl_bad |= bad;
    f->cl_huge |= huge;
    return MHD_YES;
}

/* Refuses a request whose body length is ambiguous (which proxies and servers could read
 * differently: request smuggling).  MHD_YES/MHD_NO when it answered, -1 when the request
 * may go on.  A first Content-Length that is not a number never comes here: libmicrohttpd
 * answers it itself (docs/SERVER.md, "HTTP framing"). */
static int check_framing(atlas_http_call *c) {
    framing f = {0};
    MHD_get_connection_values(c->conn, MHD_HEADER_KIND, scan_header, &f);
    const char *msg = NULL;
    if (f.n_cl > 1) msg = "more than one Content-Length header";
    else if (f.cl_bad || f.cl_huge) msg = "the Content-Length is not a number";
    else if (f.n_cl && f.n_te) msg = "both Content-Length and Transfer-Encoding";
    else if (f.n_te > 1 || f.te_other) msg = "a Transfer-Encoding other than chunked";
    if (!msg) return -1;
    reply_error(c->reply, 400, NULL, msg);
    log_refused(c, 400);
    return send_reply(c, c->reply); /* early: libmicrohttpd skips the body and closes */
}

/* --- MHD callbacks ------------------------------------------------------------------------ */

/* The headers are in: checks, and a body refused before it is read. */
static enum MHD_Result on_headers(atlas_http *h, struct MHD_Connection *conn, const char *url,
                                  const char *method, void **ctx) {
    atlas_http_call *c = call_new(h, conn, url, method);
    if (!c) return MHD_NO;
    *ctx = c;
    atlas_http_set_phase(conn, ATLAS_HTTP_BODY);
    int framed = check_framing(c);
    if (framed >= 0) return (enum MHD_Result)framed;
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Expect");
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (declared <= h->max_body) return MHD_YES;
    c->too_large = true;
    /* a client waiting for "100 Continue" has sent nothing yet: no need to drain */
    if (declared > DRAIN_MAX || (expect && !strcasecmp(expect, "100-continue")))
        return answer_now(c);
    return MHD_YES;
}

/* A piece of the body: kept, or dropped once past max_body. */
static enum MHD_Result on_upload(atlas_http_call *c, const char *upload, size_t n) {
    if (c->too_large || c->len + n > c->http->max_body) {
        c->too_large = true;
        c->dropped += n;
        return MHD_YES; /* the body deadline bounds how long this goes on */
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx) {
    (void)version;
    atlas_http *h = cls;
    atlas_http_call *c = *ctx;
    if (!c) return on_headers(h, conn, url, method, ctx);
    if (c->stage == ATLAS_HTTP_STAGE_READY) { /* a worker answered: resumed */
        c->stage = ATLAS_HTTP_STAGE_READING;
        return send_reply(c, c->reply);
    }
    if (c->answered) { /* the body of a refused request: drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        return on_upload(c, upload, n);
    }
    if (c->stage == ATLAS_HTTP_STAGE_QUEUED) return MHD_YES; /* not expected: suspended */
    return hand_off(c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                         enum MHD_RequestTerminationCode why) {
    (void)cls, (void)why;
    atlas_http_call *c = *ctx;
    atlas_http_set_phase(conn, ATLAS_HTTP_IDLE);
    if (!c) return;
    if (c->dispatched) atomic_fetch_sub(&c->http->in_flight, 1);
    if (c->pump) atlas_http_pump_free(c->pump); /* answered but never sent: end the stream */
    if (c->fd >= 0) close(c->fd);
    if (c->reply) {
        if (c->reply->stream.close) c->reply->stream.close(c->reply->stream.ctx);
        free(c->reply->body);
        free(c->reply);
    }
    free(c->url);
    free(c->body);
    free(c);
    *ctx = NULL;
}

/* libmicrohttpd's diagnostics are not printed (library code does not print): the last one
 * is kept for the error of a failed start. */
static void on_log(void *cls, const char *fmt, va_list ap) {
    atlas_http *h = cls;
    pthread_mutex_lock(&h->cmu); /* the epoll threads log at once */
    vsnprintf(h->log, sizeof h->log, fmt, ap);
    size_t n = strlen(h->log);
    while (n && (h->log[n - 1] == '\n' || h->log[n - 1] == '.')) h->log[--n] = '\0';
    pthread_mutex_unlock(&h->cmu);
}

/* --- start and stop --------------------------------------------------------------------- */

static atlas_status bound_port(atlas_http *h) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t n = sizeof ss;
    if (!di || getsockname(di->listen_fd, (struct sockaddr *)&ss, &n) != 0)
        return atlas_fail(ATLAS_ERR_INTERNAL, "getsockname on the listening socket failed");
    h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    return ATLAS_OK;
}

/* A whole PEM file, NUL-terminated and malloc'd. */
static atlas_status read_pem(const char *what, const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return atlas_fail(ATLAS_ERR_IO, "%s %s: %s", what, path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (size_t n; buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += n;
        if (len + 1 == cap && len < (1u << 20)) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) free(buf);
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return atlas_fail(ATLAS_ERR_NOMEM, "%s %s: out of memory", what, path);
    buf[len] = '\0';
    if (!strstr(buf, "-----BEGIN ")) {
        free(buf);
        return atlas_fail(ATLAS_ERR_FORMAT, "%s %s: not a PEM file", what, path);
    }
    *out = buf;
    return ATLAS_OK;
}

static const double STOP_FLUSH_S = 2.0; /* for answers made at shutdown to be written */

/* TLS 1.2 and 1.3 only, GnuTLS's default ciphers of those. */
static const char TLS_PRIORITIES[] = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2";

/* Threads that read connections: one a core, at most 4 (they only move bytes). */
static unsigned poll_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : n > 4 ? 4u : (unsigned)n;
}

/* The daemon on p->listen_fd.  It is handed a duplicate, closed by MHD_stop_daemon; the
 * caller's descriptor stays the caller's whether the start succeeds or not. */
static atlas_status start_daemon(atlas_http *h, const atlas_http_params *p, const char *cert,
                                 const char *key) {
    unsigned flags = MHD_USE_EPOLL | MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | (p->v6 ? MHD_USE_IPv6 : 0) |
                     (cert ? MHD_USE_TLS : 0);
    int fd = fcntl(p->listen_fd, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return atlas_fail(ATLAS_ERR_IO, "listening on %s port %d: dup: %s", p->host, p->port,
                          strerror(errno));
    struct MHD_OptionItem tls[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)key},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)TLS_PRIORITIES},
        {MHD_OPTION_END, 0, NULL},
    };
    h->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_THREAD_POOL_SIZE, poll_threads(),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(p->max_per_ip > 0 ? p->max_per_ip : 0),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, atlas_http_on_connection, h,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
        MHD_OPTION_ARRAY, cert ? tls : tls + 3, MHD_OPTION_END);
    if (h->mhd) return ATLAS_OK;
    int err = errno;
    close(fd);
    if (cert)
        return atlas_fail(ATLAS_ERR_INVALID, "HTTPS on %s port %d failed: %s", p->host, p->port,
                          h->log[0] ? h->log : "the certificate or key was refused");
    return atlas_fail(ATLAS_ERR_IO, "listening on %s port %d failed: %s", p->host, p->port,
                      h->log[0] ? h->log : strerror(err));
}

/* The certificate and key for HTTPS (both or neither), read from their files. */
static atlas_status load_tls(const atlas_http_params *p, char **cert, char **key) {
    *cert = *key = NULL;
    bool c = p->cert_file && *p->cert_file, k = p->key_file && *p->key_file;
    if (!c && !k) return ATLAS_OK;
    if (c != k)
        return atlas_fail(ATLAS_ERR_INVALID, "HTTPS needs both a certificate and a key "
                                             "(--ssl-certfile and --ssl-keyfile)");
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return atlas_fail(ATLAS_ERR_UNSUPPORTED, "HTTPS: this libmicrohttpd was built "
                                                 "without TLS (GnuTLS)");
    atlas_status st = read_pem("certificate", p->cert_file, cert);
    if (st == ATLAS_OK) st = read_pem("key", p->key_file, key);
    return st;
}

atlas_status atlas_http_start(const atlas_http_params *p, atlas_http_dispatch dispatch,
                              void *ctx, atlas_http **out) {
    *out = NULL;
    char *cert = NULL, *key = NULL;
    atlas_status st = p->listen_fd >= 0 ? ATLAS_OK
                      : atlas_fail(ATLAS_ERR_INVALID, "server: no listening socket");
    if (st == ATLAS_OK) st = load_tls(p, &cert, &key);
    atlas_http *h = st == ATLAS_OK ? calloc(1, sizeof *h) : NULL;
    if (st == ATLAS_OK && (!h || !(h->cors = strdup(p->cors ? p->cors : "none"))))
        st = atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    if (st == ATLAS_OK) {
        h->dispatch = dispatch;
        h->ctx = ctx;
        h->max_body = p->max_body;
        h->timeout_s = p->timeout_s;
        h->header_timeout_s = p->header_timeout_s;
        h->body_timeout_s = p->body_timeout_s;
        h->tls = cert != NULL;
        h->access = p->log;
        st = atlas_http_conn_init(h, p->max_connections);
    }
    if (st == ATLAS_OK) st = start_daemon(h, p, cert, key);
    if (st == ATLAS_OK) st = bound_port(h);
    if (key) memset(key, 0, strlen(key)); /* the daemon keeps its own copy */
    free(cert);
    free(key);
    if (st != ATLAS_OK) {
        atlas_http_stop(h);
        return st;
    }
    *out = h;
    return ATLAS_OK;
}

void atlas_http_quiesce(atlas_http *h) {
    MHD_socket lfd = MHD_quiesce_daemon(h->mhd);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
}

void atlas_http_stop(atlas_http *h) {
    if (!h) return;
    /* the workers first: each resumes its connection (libmicrohttpd must not be stopped
     * with a connection suspended) */
    atlas_http_workers_stop(h);
    /* and the answers they made are written (or their clients gone) before the daemon
     * closes every connection */
    for (double until = atlas_http_now() + STOP_FLUSH_S;
         h->mhd && atomic_load(&h->in_flight) > 0 && atlas_http_now() < until;) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (h->mhd) MHD_stop_daemon(h->mhd);
    atlas_http_conn_fini(h);
    free(h->cors);
    free(h);
}
