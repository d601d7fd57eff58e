/* cli/chat_http.c — the HTTP/1.1 client of `atlas chat --url` (cli/chat_http.h). A request
 * is written whole on a fresh connection; the response is read through poll() so that a
 * Ctrl-C (the caller's cancel flag) is seen within a tenth of a second, its body is taken
 * apart by Content-Length, chunked framing or the connection's end, and a streamed body is
 * split into server-sent events whose JSON deltas go to the caller as text. Kept this small
 * on purpose: plain HTTP to a server one runs oneself needs no TLS, redirects or proxies. */
#include "cli/chat_http.h"

#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct chat_http {
    char host[256];   /* as written in the URL, without brackets for IPv6 */
    char port[16];
    char prefix[512]; /* the URL's path without a trailing "/" or "/v1" */
    char *api_key;
};

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return 1;
}

int chat_http_create(const char *url, const char *api_key, chat_http **out, char *err,
                     size_t errcap) {
    *out = NULL;
    if (!strncasecmp(url, "https://", 8))
        return fail(err, errcap, "--url %s: https is not supported (atlas chat speaks plain "
                    "HTTP; serve without TLS on a local port)", url);
    if (strncasecmp(url, "http://", 7))
        return fail(err, errcap, "--url %s: want http://HOST[:PORT][/PATH]", url);
    chat_http *h = calloc(1, sizeof *h);
    if (!h) return fail(err, errcap, "out of memory");
    const char *p = url + 7, *host_end, *after;
    if (*p == '[') { /* [IPv6]:port */
        host_end = strchr(p, ']');
        if (!host_end) goto bad;
        p++;
        after = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        after = host_end;
    }
    size_t hl = (size_t)(host_end - p);
    if (hl == 0 || hl >= sizeof h->host) goto bad;
    memcpy(h->host, p, hl);
    if (*after == ':') {
        after++;
        size_t pl = strspn(after, "0123456789");
        if (pl == 0 || pl >= sizeof h->port || (after[pl] && after[pl] != '/')) goto bad;
        memcpy(h->port, after, pl);
        after += pl;
    } else if (*after && *after != '/') {
        goto bad;
    } else {
        strcpy(h->port, "80");
    }
    size_t ql = strlen(after);
    while (ql && after[ql - 1] == '/') ql--;
    if (ql >= 3 && !strncmp(after + ql - 3, "/v1", 3)) ql -= 3;
    if (ql >= sizeof h->prefix || memchr(after, '?', ql) || memchr(after, ' ', ql)) goto bad;
    memcpy(h->prefix, after, ql);
    if (api_key && !(h->api_key = strdup(api_key))) {
        chat_http_free(h);
        return fail(err, errcap, "out of memory");
    }
    *out = h;
    return 0;
bad:
    chat_http_free(h);
    return fail(err, errcap, "--url %s: want http://HOST[:PORT][/PATH]", url);
}

void chat_http_free(chat_http *h) {
    if (!h) return;
    free(h->api_key);
    free(h);
}

/* --- the connection: writing a request, reading through poll() -------------------------- */

enum { RD_STOP = 2, RD_OK = 1, RD_EOF = 0, RD_ERR = -1, RD_CANCEL = -2 };

typedef struct rd {
    int fd;
    char buf[16384];
    size_t pos, len;
    volatile sig_atomic_t *cancel;
    char *err;
    size_t errcap;
} rd;

static int rd_fill(rd *r) {
    for (;;) {
        if (r->cancel && *r->cancel) return RD_CANCEL;
        struct pollfd p = {r->fd, POLLIN, 0};
        int n = poll(&p, 1, 100);
        if (n < 0 && errno != EINTR) {
            fail(r->err, r->errcap, "poll: %s", strerror(errno));
            return RD_ERR;
        }
        if (n <= 0) continue;
        ssize_t got = recv(r->fd, r->buf, sizeof r->buf, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got < 0) {
            fail(r->err, r->errcap, "reading the response: %s", strerror(errno));
            return RD_ERR;
        }
        r->pos = 0;
        r->len = (size_t)got;
        return got ? RD_OK : RD_EOF;
    }
}

/* One header or chunk-size line without its CRLF into line[cap]. */
static int rd_line(rd *r, char *line, size_t cap) {
    size_t n = 0;
    for (;;) {
        if (r->pos == r->len) {
            int rc = rd_fill(r);
            if (rc == RD_EOF) fail(r->err, r->errcap, "the server closed the connection "
                                   "in the middle of the response's head");
            if (rc != RD_OK) return rc == RD_EOF ? RD_ERR : rc;
        }
        char c = r->buf[r->pos++];
        if (c == '\n') break;
        if (n + 1 >= cap) {
            fail(r->err, r->errcap, "a response line longer than %zu bytes", cap);
            return RD_ERR;
        }
        line[n++] = c;
    }
    if (n && line[n - 1] == '\r') n--;
    line[n] = 0;
    return RD_OK;
}

typedef int (*sink_fn)(void *user, const char *data, size_t len); /* non-zero: stop reading */

/* Passes want bytes (SIZE_MAX: until the connection ends) to sink; RD_STOP when the sink
 * wants no more. */
static int rd_body(rd *r, size_t want, sink_fn sink, void *user) {
    while (want) {
        if (r->pos == r->len) {
            int rc = rd_fill(r);
            if (rc == RD_EOF && want == (size_t)-1) return RD_OK;
            if (rc == RD_EOF) fail(r->err, r->errcap, "the server closed the connection "
                                   "before the answer ended");
            if (rc != RD_OK) return rc == RD_EOF ? RD_ERR : rc;
        }
        size_t n = r->len - r->pos;
        if (want != (size_t)-1 && n > want) n = want;
        int stop = sink(user, r->buf + r->pos, n);
        r->pos += n;
        if (want != (size_t)-1) want -= n;
        if (stop) return RD_STOP;
    }
    return RD_OK;
}

static int rd_chunked(rd *r, sink_fn sink, void *user) {
    char line[256];
    for (;;) {
        int rc = rd_line(r, line, sizeof line);
        if (rc != RD_OK) return rc;
        char *end;
        errno = 0;
        unsigned long long size = strtoull(line, &end, 16);
        if (end == line || errno || (*end && *end != ';') || size > ((size_t)1 << 40)) {
            fail(r->err, r->errcap, "a bad chunk size line '%.40s'", line);
            return RD_ERR;
        }
        if (size == 0) return RD_OK; /* trailers are not read: the connection is closed */
        if ((rc = rd_body(r, (size_t)size, sink, user)) != RD_OK) return rc == RD_STOP ? RD_OK : rc;
        if ((rc = rd_line(r, line, sizeof line)) != RD_OK) return rc;
    }
}

static int connect_to(const chat_http *h, char *err, size_t errcap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(h->host, h->port, &hints, &ai);
    if (rc) {
        fail(err, errcap, "%s:%s: %s", h->host, h->port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) fail(err, errcap, "connecting to %s:%s: %s", h->host, h->port, strerror(e));
    return fd;
}

static int send_all(int fd, const char *p, size_t n, char *err, size_t errcap) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail(err, errcap, "sending the request: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A growing byte buffer (a non-200 answer's body, /v1/models). */
typedef struct grow {
    char *p;
    size_t len, cap;
    int oom;
} grow;

static int grow_sink(void *user, const char *data, size_t len) {
    grow *g = user;
    if (g->oom || g->len + len + 1 > ((size_t)64 << 20)) return g->oom = 1;
    if (g->len + len + 1 > g->cap) {
        size_t cap = g->cap ? g->cap : 1024;
        while (cap < g->len + len + 1) cap *= 2;
        char *q = realloc(g->p, cap);
        if (!q) return g->oom = 1;
        g->p = q, g->cap = cap;
    }
    memcpy(g->p + g->len, data, len);
    g->len += len;
    g->p[g->len] = 0;
    return 0;
}

/* The message of an OpenAI error body, {"error": {"message": ...}}, or the body itself. */
static void error_body(const grow *g, int status, char *err, size_t errcap) {
    json_t *j = g->p ? json_loads(g->p, 0, NULL) : NULL;
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    fail(err, errcap, "the server answered %d: %.300s", status, m ? m : g->p ? g->p : "");
    json_decref(j);
}

/* Sends the request, reads the head and passes the body to sink (the status' body, for a
 * status other than 200, goes into err instead). Returns 0, 1 (error) or 2 (cancelled). */
static int exchange(chat_http *h, const char *method, const char *route, const char *body,
                    volatile sig_atomic_t *cancel, sink_fn sink, void *user, char *err,
                    size_t errcap) {
    int fd = connect_to(h, err, errcap);
    if (fd < 0) return 1;
    size_t blen = body ? strlen(body) : 0;
    char auth[600] = "";
    if (h->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %.500s\r\n", h->api_key);
    int v6 = strchr(h->host, ':') != NULL;
    char *head = NULL;
    int hl = asprintf(&head, "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\n%s"
                      "Accept: application/json, text/event-stream\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n", method, h->prefix, route, v6 ? "[" : "",
                      h->host, v6 ? "]" : "", h->port, auth, blen);
    if (hl < 0) {
        close(fd);
        return fail(err, errcap, "out of memory");
    }
    int rc = send_all(fd, head, (size_t)hl, err, errcap);
    free(head);
    if (!rc && blen) rc = send_all(fd, body, blen, err, errcap);
    if (rc) {
        close(fd);
        return 1;
    }
    rd *r = malloc(sizeof *r);
    if (!r) {
        close(fd);
        return fail(err, errcap, "out of memory");
    }
    *r = (rd){.fd = fd, .cancel = cancel, .err = err, .errcap = errcap};
    char line[8192];
    int status = 0, chunked = 0, st;
    size_t length = (size_t)-1;
    st = rd_line(r, line, sizeof line);
    if (st == RD_OK && (sscanf(line, "HTTP/1.%*d %d", &status) != 1 || status < 100)) {
        fail(err, errcap, "not an HTTP response: '%.60s'", line);
        st = RD_ERR;
    }
    while (st == RD_OK && (st = rd_line(r, line, sizeof line)) == RD_OK && line[0]) {
        if (!strncasecmp(line, "Transfer-Encoding:", 18) && strcasestr(line + 18, "chunked"))
            chunked = 1;
        else if (!strncasecmp(line, "Content-Length:", 15))
            length = (size_t)strtoull(line + 15, NULL, 10);
    }
    grow g = {0};
    if (st == RD_OK) {
        sink_fn s = status == 200 ? sink : grow_sink;
        void *u = status == 200 ? user : &g;
        st = chunked ? rd_chunked(r, s, u) : rd_body(r, length, s, u);
        if (st == RD_STOP) st = RD_OK;
        if (st == RD_OK && status != 200) {
            error_body(&g, status, err, errcap);
            st = RD_ERR;
        }
    }
    free(g.p);
    free(r);
    close(fd); /* mid-answer this is what tells the server the client is gone */
    return st == RD_OK ? 0 : st == RD_CANCEL ? 2 : 1;
}

/* --- server-sent events of a streamed chat completion ----------------------------------- */

typedef struct sse {
    chat_http_text_fn fn;
    void *user;
    grow line, data; /* the line being read; the event's data lines */
    int done, failed;
    char *err;
    size_t errcap;
} sse;

/* One event's data: a chunk with choices[0].delta, an error object, or [DONE]. */
static void sse_event(sse *s) {
    if (!s->data.len) return;
    if (!strcmp(s->data.p, "[DONE]")) {
        s->done = 1;
        return;
    }
    json_error_t je;
    json_t *j = json_loads(s->data.p, 0, &je);
    s->data.len = 0;
    if (!j) {
        s->failed = fail(s->err, s->errcap, "a stream event that is not JSON: %s", je.text);
        return;
    }
    const json_t *e = json_object_get(j, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        s->failed = fail(s->err, s->errcap, "the server: %.300s", m ? m : "an error");
    }
    const json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    const json_t *rc = json_object_get(d, "reasoning_content"), *c = json_object_get(d, "content");
    if (json_string_length(rc)) s->fn(s->user, 1, json_string_value(rc), json_string_length(rc));
    if (json_string_length(c)) s->fn(s->user, 0, json_string_value(c), json_string_length(c));
    json_decref(j);
}

static int sse_sink(void *user, const char *data, size_t len) {
    sse *s = user;
    for (size_t i = 0; i < len && !s->done && !s->failed; i++) {
        if (data[i] != '\n') {
            if (grow_sink(&s->line, data + i, 1)) return s->failed = fail(s->err, s->errcap,
                                                                       "out of memory");
            continue;
        }
        char *l = s->line.p ? s->line.p : "";
        size_t n = s->line.len;
        if (n && l[n - 1] == '\r') l[--n] = 0;
        if (n == 0) sse_event(s);
        else if (!strncmp(l, "data:", 5)) {
            const char *v = l + 5 + (l[5] == ' ');
            if ((s->data.len && grow_sink(&s->data, "\n", 1)) ||
                grow_sink(&s->data, v, strlen(v)))
                return s->failed = fail(s->err, s->errcap, "out of memory");
        }
        s->line.len = 0;
    }
    return s->done || s->failed;
}

int chat_http_stream(chat_http *h, const char *body, chat_http_text_fn fn, void *user,
                     volatile sig_atomic_t *cancel, char *err, size_t errcap) {
    sse s = {.fn = fn, .user = user, .err = err, .errcap = errcap};
    int rc = exchange(h, "POST", "/v1/chat/completions", body, cancel, sse_sink, &s, err,
                      errcap);
    if (rc == 0 && s.failed) rc = 1;
    else if (rc == 0 && !s.done)
        rc = fail(err, errcap, "the stream ended without its [DONE] event");
    free(s.line.p);
    free(s.data.p);
    return rc;
}

int chat_http_count(chat_http *h, const char *body, int *count, int *ctx, char *err,
                    size_t errcap) {
    grow g = {0};
    int rc = exchange(h, "POST", "/tokenize", body, NULL, grow_sink, &g, err, errcap);
    json_t *j = rc == 0 && g.p ? json_loads(g.p, 0, NULL) : NULL;
    const json_t *n = json_object_get(j, "count"), *m = json_object_get(j, "max_model_len");
    if (rc == 0 && (!json_is_integer(n) || !json_is_integer(m) || json_integer_value(m) <= 0))
        rc = fail(err, errcap, "POST /tokenize: no count and max_model_len");
    if (rc == 0) *count = (int)json_integer_value(n), *ctx = (int)json_integer_value(m);
    json_decref(j);
    free(g.p);
    return rc ? 1 : 0;
}

int chat_http_first_model(chat_http *h, char **name, char *err, size_t errcap) {
    grow g = {0};
    *name = NULL;
    int rc = exchange(h, "GET", "/v1/models", NULL, NULL, grow_sink, &g, err, errcap);
    json_t *j = rc == 0 && g.p ? json_loads(g.p, 0, NULL) : NULL;
    const char *id = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (rc == 0 && !id) rc = fail(err, errcap, "GET /v1/models listed no model");
    if (rc == 0 && !(*name = strdup(id))) rc = fail(err, errcap, "out of memory");
    json_decref(j);
    free(g.p);
    return rc ? 1 : 0;
}
