/* server/log.h — the server's log (atlas_server_params.log_*): lines on a descriptor, as
 * text or JSON, kept or dropped by level.  Each line goes out in one write(2), so the lines
 * of requests answered at once never interleave.  Internal to src/server.
 *
 * A request's line: method, path, model, status, tokens in and out, time to the first
 * token and in all (ms), the client's address.  What it is given is all it writes: no
 * header, key or text of a prompt or answer ever reaches it.  Whatever bytes a field holds,
 * the line is written: bytes that are not UTF-8 become U+FFFD. */
#ifndef ATLAS_SERVER_LOG_H
#define ATLAS_SERVER_LOG_H

#include <stdarg.h>
#include <stdbool.h>

#include <jansson.h>

#include "atlas/server.h"
#include "atlas/status.h"

typedef struct atlas_log atlas_log;

/* What the line of one request says; filled as the request is answered. */
typedef struct atlas_log_request {
    char method[8];
    char path[256];     /* the URL's path, no query string (atlas_utf8_clean: cut, UTF-8) */
    char client[48];    /* the client's address, "-" when unknown */
    char model[128];    /* the model the request named ("" when none), as path */
    int status;
    long tokens_in, tokens_out; /* prompt and generated tokens (0 when none) */
    double ttft_ms;     /* from arrival to the first generated token; < 0: none */
    double total_ms;    /* from arrival to the end of the answer */
    char reason[512];   /* a 5xx's reason (the model could not load: why), "" otherwise; the
                           engine's and loader's messages, which hold no request text */
} atlas_log_request;

/* A log writing to fd (-1: nowhere) lines of level and more severe. *out is the caller's
 * (atlas_log_free). ATLAS_ERR_INVALID for a format or level out of range. */
atlas_status atlas_log_create(int fd, atlas_log_format format, atlas_log_level level,
                              atlas_log **out);
void atlas_log_free(atlas_log *l);

/* start_ms (atlas_server_params.start_ms, 0: none): the first 2xx answer to a request naming
 * a model writes a line of its own, the seconds since, once. */
void atlas_log_set_start(atlas_log *l, double start_ms);

/* Whether a line of level would be written (l NULL: no). Any thread. */
bool atlas_log_enabled(const atlas_log *l, atlas_log_level level);

/* A line of free text (msg, in JSON the "msg" field), printf-style, when level passes the
 * log's; atlas_log_vmessage with always set writes it whatever the log's level. Any
 * thread. */
void atlas_log_message(atlas_log *l, atlas_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void atlas_log_vmessage(atlas_log *l, atlas_log_level level, bool always, const char *fmt,
                        va_list ap);

/* A line of free text with fields of its own: in JSON msg and the fields of obj (taken,
 * may be NULL); as text the message alone.  Written whatever the log's level when always. */
void atlas_log_fields(atlas_log *l, atlas_log_level level, bool always, json_t *obj,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* The line of an answered request, at ERROR for a 5xx, WARN for a 4xx, INFO otherwise. Any
 * thread. */
void atlas_log_request_done(atlas_log *l, const atlas_log_request *r);

/* The line of a request as it arrives (DEBUG): method, path, client, body bytes. */
void atlas_log_request_start(atlas_log *l, const atlas_log_request *r, size_t body_bytes);

#endif
