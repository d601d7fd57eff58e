/* server/http.h — what the HTTP layer (http.c) hands to the endpoint handlers, and the one
 * table of API errors (errors.c).  Internal to src/server. */
#ifndef ATLAS_SERVER_HTTP_H
#define ATLAS_SERVER_HTTP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "atlas/status.h"
#include "server/metrics.h"
#include "server/server.h"

struct MHD_Daemon;
struct MHD_Connection;
typedef struct atlas_gen atlas_gen; /* server/gen.h */

struct atlas_server {
    struct MHD_Daemon *mhd;
    atlas_engine *engine;
    char *host;
    char *api_key;
    size_t api_key_len;
    char *cors;                   /* atlas_server_params.cors, copied */
    atlas_server_params p;
    int port;
    atomic_bool stopping;
    atomic_uint_fast64_t next_id; /* for "chatcmpl-..." ids */
    int64_t created;              /* unix time the server started: /v1/models "created" */
    atlas_server_metrics metrics;
};

/* One HTTP request, from its first header to the last byte of its response. */
typedef struct atlas_http_call {
    atlas_server *srv;
    struct MHD_Connection *conn;
    int fd;          /* the connection's socket: to notice a client that went away */
    char method[8];
    char *url;       /* path only, malloc'd */
    char *body;      /* NUL-terminated, malloc'd */
    size_t len, cap;
    bool too_large;  /* the body passed max_body: the rest is discarded, the answer is 413 */
    size_t dropped;  /* bytes discarded so far */
    bool answered;
    double t_start;  /* monotonic seconds when the headers arrived */
} atlas_http_call;

/* What a handler answers: a body, or a stream of server-sent events fed by gen. */
typedef struct atlas_http_reply {
    int status;
    char *body;            /* malloc'd; the reply owns it */
    size_t len;
    const char *ctype;     /* static string */
    int retry_after;       /* seconds for a Retry-After header; 0: none */
    atlas_gen *stream;     /* non-NULL: SSE body; the reply owns one reference */
    bool preflight;        /* a CORS preflight's 204: the Allow-Methods/Headers too */
} atlas_http_reply;

/* Kinds of API errors that do not come from an atlas_status. */
typedef enum atlas_api_error {
    ATLAS_API_ERR_STATUS = 0,  /* use the atlas_status */
    ATLAS_API_ERR_AUTH,        /* 401 */
    ATLAS_API_ERR_TOO_LARGE,   /* 413 */
    ATLAS_API_ERR_NO_ROUTE,    /* 404 */
    ATLAS_API_ERR_METHOD,      /* 405 */
    ATLAS_API_ERR_FORBIDDEN,   /* 403: a cross-origin page the server does not allow */
    ATLAS_API_ERR_SHUTDOWN,    /* 503 */
} atlas_api_error;

/* The one place where failures become HTTP statuses and OpenAI error JSON:
 * {"error": {"message", "type", "param", "code"}}.  param may be NULL. */
void atlas_api_error_reply(atlas_http_reply *r, atlas_api_error kind, atlas_status st,
                           const char *param, const char *message);
/* The HTTP status and OpenAI "type" for an atlas_status. */
int atlas_api_status_http(atlas_status st, const char **type);
/* Shorthand: kind STATUS with atlas_last_error() as the message. */
void atlas_api_fail_reply(atlas_http_reply *r, atlas_status st, const char *param);

/* Sets r to a JSON body (takes ownership of v: it is decref'd). */
void atlas_http_reply_json(atlas_http_reply *r, int status, json_t *v);
void atlas_http_reply_text(atlas_http_reply *r, int status, const char *ctype, char *text,
                           size_t len);

/* True when the client of call closed its connection (checked without blocking). */
bool atlas_http_client_gone(const atlas_http_call *call);

double atlas_now(void); /* monotonic seconds */

/* Matches a URL path against a route pattern: exact, or with one "{}" segment (a model id,
 * which may itself hold '/') copied into arg[cap].  False when it does not fit. */
bool atlas_http_route_match(const char *pattern, const char *url, char *arg, size_t cap);

/* Endpoint handlers (api_*.c).  body is the parsed JSON body (NULL for GET). */
typedef void (*atlas_http_handler)(atlas_http_call *call, json_t *body, const char *arg,
                                   atlas_http_reply *r);
void atlas_api_chat(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_completions(atlas_http_call *call, json_t *body, const char *arg,
                           atlas_http_reply *r);
void atlas_api_models(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_model_get(atlas_http_call *call, json_t *body, const char *arg,
                         atlas_http_reply *r);
void atlas_api_model_load(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);
void atlas_api_model_unload(atlas_http_call *call, json_t *body, const char *arg,
                            atlas_http_reply *r);
void atlas_api_health(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_metrics(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r);
void atlas_api_tokenize(atlas_http_call *call, json_t *body, const char *arg,
                        atlas_http_reply *r);
void atlas_api_detokenize(atlas_http_call *call, json_t *body, const char *arg,
                          atlas_http_reply *r);
void atlas_api_apply_template(atlas_http_call *call, json_t *body, const char *arg,
                              atlas_http_reply *r);

#endif
