/* server/errors.c — the one place where failures become HTTP statuses and OpenAI's error
 * JSON {"error": {"message", "type", "param", "code"}} (the types OpenAI's API returns:
 * invalid_request_error, authentication_error, not_found_error, rate_limit_error,
 * server_error), and that JSON in Anthropic's shape for its routes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/utf8.h"
#include "server/errors.h"

int atlas_api_error_http(atlas_status st, const char **type) {
    switch (st) {
    case ATLAS_ERR_INVALID:
    case ATLAS_ERR_FORMAT:
    case ATLAS_ERR_RANGE:
    case ATLAS_ERR_UNSUPPORTED:
        *type = "invalid_request_error";
        return 400;
    case ATLAS_ERR_NOT_FOUND:
        *type = "not_found_error";
        return 404;
    case ATLAS_ERR_BUSY: /* the engine's queue is full: come back later */
        *type = "rate_limit_error";
        return 429;
    case ATLAS_ERR_NOMEM:
    case ATLAS_ERR_UNAVAILABLE:  /* a model that failed to load, in its back-off */
    case ATLAS_ERR_DEVICE_NOMEM: /* no room for the model or the request now */
        *type = "server_error";
        return 503;
    case ATLAS_OK:
    case ATLAS_ERR_IO:
    case ATLAS_ERR_NO_DEVICE:
    case ATLAS_ERR_DEVICE:
    case ATLAS_ERR_INTERNAL:
        break;
    }
    *type = "server_error";
    return 500;
}

static const char *status_code(atlas_status st) {
    switch (st) {
    case ATLAS_ERR_NOT_FOUND: return "model_not_found";
    case ATLAS_ERR_RANGE: return "context_length_exceeded";
    case ATLAS_ERR_BUSY: return "queue_full";
    case ATLAS_ERR_UNAVAILABLE: return "model_unavailable";
    default: return NULL;
    }
}

/* Messages quote client input (a model name, a URL): bytes that are not UTF-8 become
 * U+FFFD so that the error itself is valid JSON, and every valid character is kept. */
static json_t *utf8_string(const char *s) {
    json_t *v = json_string(s);
    if (v) return v;
    size_t n = strlen(s);
    char *copy = malloc(3 * n + 1);
    if (!copy) return json_string("(out of memory)");
    size_t len = atlas_utf8_clean(copy, 3 * n + 1, s, n);
    v = json_stringn(copy, len);
    free(copy);
    return v;
}

void atlas_api_error_reply(atlas_http_reply *r, atlas_api_error kind, atlas_status st,
                           const char *param, const char *message) {
    const char *type = "invalid_request_error", *code = NULL;
    int http = 400;
    switch (kind) {
    case ATLAS_API_ERR_STATUS:
        http = atlas_api_error_http(st, &type);
        code = status_code(st);
        /* a range error that is not about the context is a plain bad value */
        if (st == ATLAS_ERR_RANGE && param) code = "invalid_value";
        break;
    case ATLAS_API_ERR_AUTH:
        http = 401, type = "authentication_error", code = "invalid_api_key";
        break;
    case ATLAS_API_ERR_TOO_LARGE:
        http = 413, code = "request_too_large";
        break;
    case ATLAS_API_ERR_NO_ROUTE:
        http = 404, type = "not_found_error", code = "unknown_url";
        break;
    case ATLAS_API_ERR_METHOD:
        http = 405, code = "method_not_allowed";
        break;
    case ATLAS_API_ERR_FORBIDDEN:
        http = 403, type = "permission_error", code = "origin_not_allowed";
        break;
    case ATLAS_API_ERR_SHUTDOWN:
        http = 503, type = "server_error", code = "shutting_down";
        break;
    case ATLAS_API_ERR_MODEL_BUSY:
        http = 409, code = "model_busy";
        break;
    case ATLAS_API_ERR_CLIENT_GONE:
        http = 499, type = "invalid_request_error", code = "client_closed_request";
        break;
    }
    if (!message || !*message) message = "request failed";
    json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message", utf8_string(message), "type",
                            type, "param", param ? utf8_string(param) : json_null(), "code",
                            code ? json_string(code) : json_null());
    atlas_http_reply_json(r, http, json_pack("{s:o}", "error", err));
    if (http == 429) r->retry_after = 1;
    if (http == 503) r->retry_after = 5;
    /* the operator sees why in the access line (a 4xx's message may quote the request, a
     * 5xx's is the server's own: a model that cannot load, a failure inside) */
    if (http >= 500) snprintf(r->reason, sizeof r->reason, "%s", message);
}

void atlas_api_error_fail(atlas_http_reply *r, atlas_status st, const char *param) {
    atlas_api_error_reply(r, ATLAS_API_ERR_STATUS, st, param, atlas_last_error());
}

/* Anthropic's type (and status, in *http) for an error of OpenAI's shape. */
static const char *anthropic_type(int *http, const char *code) {
    switch (*http) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: /* a model that failed to load is the server's fault, not a busy moment */
        if (code && !strcmp(code, "model_unavailable")) break;
        *http = 529;
        return "overloaded_error";
    default:
        if (*http < 500) return "invalid_request_error"; /* 405, 409, 499 */
        break;
    }
    *http = 500;
    return "api_error";
}

void atlas_api_error_to_anthropic(atlas_http_reply *r) {
    if (r->stream.read || r->status < 400 || !r->body) return;
    json_t *v = json_loadb(r->body, r->len, 0, NULL);
    json_t *err = json_object_get(v, "error");
    const char *msg = json_string_value(json_object_get(err, "message"));
    if (!msg) { /* not one of ours: leave it */
        json_decref(v);
        return;
    }
    int http = r->status, retry = r->retry_after;
    const char *type = anthropic_type(&http, json_string_value(json_object_get(err, "code")));
    json_t *out = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type,
                            "message", utf8_string(msg));
    json_decref(v);
    if (!out) return;
    free(r->body);
    r->body = NULL;
    atlas_http_reply_json(r, http, out);
    r->retry_after = retry;
}
