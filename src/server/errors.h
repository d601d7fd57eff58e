/* server/errors.h — the one place where failures become HTTP statuses and error bodies in
 * the client's dialect: OpenAI's {"error": {"message", "type", "param", "code"}}.  Every
 * module of the server answers its errors through here; this calls only the transport's
 * reply helpers.  Internal to src/server. */
#ifndef ATLAS_SERVER_ERRORS_H
#define ATLAS_SERVER_ERRORS_H

#include "atlas/status.h"
#include "server/http.h"

/* Kinds of API errors that do not come from an atlas_status. */
typedef enum atlas_api_error {
    ATLAS_API_ERR_STATUS = 0,  /* use the atlas_status */
    ATLAS_API_ERR_AUTH,        /* 401 */
    ATLAS_API_ERR_TOO_LARGE,   /* 413 */
    ATLAS_API_ERR_NO_ROUTE,    /* 404 */
    ATLAS_API_ERR_METHOD,      /* 405 */
    ATLAS_API_ERR_FORBIDDEN,   /* 403: a cross-origin page the server does not allow */
    ATLAS_API_ERR_SHUTDOWN,    /* 503 */
    ATLAS_API_ERR_MODEL_BUSY,  /* 409: an unload while requests run on the model (it is
                                  released when they end) */
    ATLAS_API_ERR_CLIENT_GONE, /* 499 (nginx's): the client left before the answer; nobody
                                  reads it, but the metrics must not count a server error */
} atlas_api_error;

/* Sets r to the error: its HTTP status, Retry-After when coming back helps, and the body.
 * param (the request field at fault) may be NULL; message quotes client input safely. */
void atlas_api_error_reply(atlas_http_reply *r, atlas_api_error kind, atlas_status st,
                           const char *param, const char *message);
/* The HTTP status and OpenAI "type" for an atlas_status. */
int atlas_api_error_http(atlas_status st, const char **type);
/* Rewrites r, an error answered by atlas_api_error_reply (OpenAI's shape), into Anthropic's
 * {"type": "error", "error": {"type", "message"}}: 400, 401, 403, 404, 413 and 429 keep their
 * status (invalid_request_error, authentication_error, permission_error, not_found_error,
 * request_too_large, rate_limit_error); a 503 that coming back later cures (no room on the
 * device, the server shutting down) is 529 overloaded_error; other 5xx are 500 api_error.
 * Anything else (a success, a stream) is left as it is. */
void atlas_api_error_to_anthropic(atlas_http_reply *r);
/* Shorthand: kind STATUS with this thread's atlas_last_error() as the message. */
void atlas_api_error_fail(atlas_http_reply *r, atlas_status st, const char *param);

#endif
