/* server/http.h — the HTTP transport (libmicrohttpd, optionally over TLS): event-driven
 * connections (epoll threads read headers and bodies, so an idle or slow connection holds
 * no thread), limits on connections in all and per source address, deadlines for a
 * request's headers and body, request bodies up to a size limit, framing checks, CORS
 * response headers, and replies: a whole body, or a stream of server-sent events.  It knows
 * no routes and no API: every request, once its body is in, goes to the dispatch function
 * that atlas_http_start was given, which runs on a worker thread (the connection is
 * suspended meanwhile) and may block.  Internal to src/server. */
#ifndef ATLAS_SERVER_HTTP_H
#define ATLAS_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "atlas/status.h"
#include "server/log.h"

struct MHD_Connection;
typedef struct atlas_http atlas_http;

/* One HTTP request, from its first header to the last byte of its response. */
typedef struct atlas_http_call {
    atlas_http *http;
    void *ctx;       /* the dispatch context given to atlas_http_start */
    struct MHD_Connection *conn;
    int fd;          /* a duplicate of the connection's socket, to notice a client that
                        went away; open while the request is answered (-1 before) */
    char method[8];
    char *url;       /* path only, malloc'd */
    char *body;      /* NUL-terminated, malloc'd */
    size_t len, cap;
    bool too_large;  /* the body passed max_body: the rest is discarded, the answer is 413 */
    size_t dropped;  /* bytes discarded so far */
    bool answered;
    double t_start;  /* atlas_http_now() when the headers arrived */
    /* the access log's line: method, path and client set here, the model, tokens and
     * times by whoever answers (server.c, gen.c), written once the answer is made */
    atlas_log_request log;
    /* the transport's own: the worker queue, the reply waiting for the connection to be
     * resumed, and a stream's pump */
    struct atlas_http_call *next_job;
    int stage;
    struct atlas_http_reply *reply;
    struct atlas_http_pump *pump;
    bool dispatched;
} atlas_http_call;

/* What read returns besides a count of bytes: the stream is over (after its last bytes), or
 * it failed and the connection is to be dropped. */
enum { ATLAS_HTTP_STREAM_END = -1, ATLAS_HTTP_STREAM_ERROR = -2 };

/* A body made piece by piece.  read runs on the worker thread that answered the request and
 * may block until bytes are ready (at most max of them); close runs once on that thread,
 * after the last read (the stream ended, failed, or the client left). */
typedef struct atlas_http_stream {
    ssize_t (*read)(void *ctx, char *buf, size_t max);
    void (*close)(void *ctx);
    void *ctx;
} atlas_http_stream;

/* What the dispatch function answers: a body, or a stream of server-sent events. */
typedef struct atlas_http_reply {
    int status;
    char *body;                /* malloc'd; the reply owns it */
    size_t len;
    const char *ctype;         /* static string; a stream's, NULL: text/event-stream */
    int retry_after;           /* seconds for a Retry-After header; 0: none */
    atlas_http_stream stream;  /* read non-NULL: an SSE body; the reply owns ctx */
    bool preflight;            /* a CORS preflight's 204: the Allow-Methods/Headers too */
    char allow[32];            /* a 405's Allow header: the methods the path takes ("" none) */
    char reason[512];          /* a 5xx's message, for the access log ("" otherwise) */
    const char *headers[16];   /* more headers: static name, value pairs, NULL after the last */
} atlas_http_reply;

/* Answers one request into r (which starts zeroed).  Runs on a worker thread, many at once,
 * and may block; ctx is what atlas_http_start was given. */
typedef void (*atlas_http_dispatch)(void *ctx, atlas_http_call *call, atlas_http_reply *r);

typedef struct atlas_http_params {
    const char *host;     /* as given, for messages */
    int port;             /* as given, for messages */
    int listen_fd;        /* the listening socket (server/listen.h); the daemon serves a
                             duplicate of it, the caller keeps and closes its own */
    bool v6;              /* listen_fd is an IPv6 socket */
    size_t max_body;      /* bytes of a request body; larger ones are flagged too_large */
    int max_connections;
    int max_per_ip;       /* open connections from one source address (0: no cap) */
    int timeout_s;        /* idle timeout; also the deadline for the next request's headers
                             on a kept-alive connection */
    int header_timeout_s; /* a new connection's request headers must be in by then */
    int body_timeout_s;   /* a request's body must be in this long after its headers */
    const char *cors;     /* "local", "*", "none" or a comma-separated list of origins */
    const char *cert_file, *key_file; /* PEM files: HTTPS (TLS 1.2 or 1.3); NULL: HTTP */
    atlas_log *log;       /* for the requests the transport refuses itself (NULL: none);
                             borrowed, it must outlive the daemon */
} atlas_http_params;

/* Starts listening; every request goes to dispatch(ctx, ...).  The strings in p are copied;
 * ctx must outlive the daemon. */
atlas_status atlas_http_start(const atlas_http_params *p, atlas_http_dispatch dispatch,
                              void *ctx, atlas_http **out);
/* The bound TCP port. */
int atlas_http_port(const atlas_http *h);
/* Stops accepting connections; those open go on until atlas_http_stop. */
void atlas_http_quiesce(atlas_http *h);
/* Waits for the workers (each ends its request), closes every connection, stops the
 * daemon's threads and frees h.  NULL: no-op. */
void atlas_http_stop(atlas_http *h);

/* A request header's value, NULL when absent. */
const char *atlas_http_header(const atlas_http_call *call, const char *name);
/* A query argument's value (?name=value), NULL when absent. */
const char *atlas_http_query(const atlas_http_call *call, const char *name);
/* Whether the page that sent call (its Origin header) may read the answer, by the daemon's
 * CORS rule: the value for Access-Control-Allow-Origin, or NULL. */
const char *atlas_http_cors_allow(const atlas_http_call *call);
/* Whether the call's Origin header names the origin the call was sent to: this server's
 * scheme and the Host header (a page the server served, or one on another server that the
 * same name reaches: the caller decides which names to trust). */
bool atlas_http_origin_is_host(const atlas_http_call *call);

/* Sets r to a JSON body (takes ownership of v: it is decref'd). */
void atlas_http_reply_json(atlas_http_reply *r, int status, json_t *v);
void atlas_http_reply_text(atlas_http_reply *r, int status, const char *ctype, char *text,
                           size_t len);

/* True when the client on socket fd closed its connection (checked without blocking). */
bool atlas_http_client_gone(int fd);

double atlas_http_now(void); /* monotonic seconds: the clock of atlas_http_call.t_start */

/* Matches a URL path against a route pattern: exact, or with one "{}" segment (a model id,
 * which may itself hold '/') copied into arg[cap].  False when it does not fit. */
bool atlas_http_route_match(const char *pattern, const char *url, char *arg, size_t cap);

#endif
