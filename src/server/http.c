/* server/http.c — libmicrohttpd glue: the daemon (one thread per connection, keep-alive,
 * connection limit and timeout), request bodies with a size limit, and turning a reply into
 * an HTTP response (JSON, text, or an SSE stream).  What a request means is the dispatch
 * function's business. */
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

#include "server/http.h"

struct atlas_http {
    struct MHD_Daemon *mhd;
    atlas_http_dispatch dispatch;
    void *ctx;
    char *cors;        /* atlas_http_params.cors, copied */
    size_t max_body;
    int timeout_s;
    int port;
};

double atlas_http_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int atlas_http_port(const atlas_http *h) { return h->port; }

const char *atlas_http_header(const atlas_http_call *call, const char *name) {
    return MHD_lookup_connection_value(call->conn, MHD_HEADER_KIND, name);
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

enum { DRAIN_MAX = 64 << 20 }; /* bytes of a too-large body still read (and dropped) */

/* --- MHD callbacks ---------------------------------------------------------------------- */

/* A stream as libmicrohttpd's content reader sees it, with the socket to uncork. */
typedef struct sse {
    atlas_http_stream s;
    int fd;
} sse;

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse *x = cls;
    ssize_t n = x->s.read(x->s.ctx, buf, max);
    if (n == ATLAS_HTTP_STREAM_END) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* Each event goes out now: libmicrohttpd corks the socket while it builds a response of
     * unknown size, which would hold tokens back by up to 200 ms. */
    int off = 0, on = 1;
    if (n > 0 && x->fd >= 0) {
        setsockopt(x->fd, IPPROTO_TCP, TCP_CORK, &off, sizeof off);
        setsockopt(x->fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    return n;
}

static void sse_free(void *cls) {
    sse *x = cls;
    x->s.close(x->s.ctx);
    free(x);
}

static enum MHD_Result send_reply(atlas_http_call *call, atlas_http_reply *r) {
    struct MHD_Response *resp;
    if (r->stream.read) {
        sse *x = malloc(sizeof *x);
        if (x) *x = (sse){r->stream, call->fd};
        resp = x ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, x,
                                                     sse_free)
                 : NULL;
        if (!resp) {
            free(x);
            r->stream.close(r->stream.ctx);
            r->stream = (atlas_http_stream){0};
            return MHD_NO;
        }
        r->stream = (atlas_http_stream){0}; /* MHD owns it now: sse_free releases it */
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
    snprintf(ka, sizeof ka, "timeout=%d", call->http->timeout_s);
    MHD_add_response_header(resp, "Keep-Alive", ka);
    const char *allow = atlas_http_cors_allow(call);
    if (allow) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
        if (strcmp(allow, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (r->preflight) {
        const char *want = atlas_http_header(call, "Access-Control-Request-Headers");
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

static atlas_http_call *call_new(atlas_http *h, struct MHD_Connection *conn, const char *url,
                                 const char *method) {
    atlas_http_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->http = h;
    c->ctx = h->ctx;
    c->conn = conn;
    c->url = strdup(url);
    snprintf(c->method, sizeof c->method, "%s", method);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    c->t_start = atlas_http_now();
    if (!c->url) {
        free(c);
        return NULL;
    }
    return c;
}

/* Hands the request to the dispatch function and sends what it answers. */
static enum MHD_Result answer(atlas_http_call *c) {
    atlas_http_reply r = {0};
    c->http->dispatch(c->ctx, c, &r);
    enum MHD_Result ok = send_reply(c, &r);
    free(r.body);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx) {
    atlas_http *h = cls;
    atlas_http_call *c = *ctx;
    if (!c) { /* headers are in; the body (if any) follows in later calls */
        c = call_new(h, conn, url, method);
        if (!c) return MHD_NO;
        *ctx = c;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        /* Too large: a body of reasonable size is read and dropped so that the client,
         * still writing it, sees the 413 (most clients do not read before they finish
         * writing); a huge one is refused at once and the connection closed. */
        if (declared > h->max_body) c->too_large = true;
        if (declared > h->max_body && declared > DRAIN_MAX) return answer(c);
        return MHD_YES;
    }
    if (c->answered) { /* the body of a refused request: drop it */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_large || c->len + n > h->max_body) {
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
    return answer(c);
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

atlas_status atlas_http_start(const atlas_http_params *p, atlas_http_dispatch dispatch,
                              void *ctx, atlas_http **out) {
    *out = NULL;
    struct sockaddr_storage ss;
    bool v6 = false;
    atlas_status st = bind_addr(p->host, p->port, &ss, &v6);
    if (st != ATLAS_OK) return st;
    atlas_http *h = calloc(1, sizeof *h);
    if (!h || !(h->cors = strdup(p->cors ? p->cors : "none"))) {
        free(h);
        return atlas_fail(ATLAS_ERR_NOMEM, "server: out of memory");
    }
    h->dispatch = dispatch;
    h->ctx = ctx;
    h->max_body = p->max_body;
    h->timeout_s = p->timeout_s;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    h->mhd = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, &ss,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_END);
    if (!h->mhd) {
        int err = errno;
        atlas_http_stop(h);
        return atlas_fail(ATLAS_ERR_IO, "listening on %s port %d failed: %s", p->host, p->port,
                          strerror(err));
    }
    st = bound_port(h);
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
    if (h->mhd) MHD_stop_daemon(h->mhd);
    free(h->cors);
    free(h);
}
