/* server/log.c — see log.h. */
#include "server/log.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atlas/utf8.h"

struct atlas_log {
    int fd;
    atlas_log_format format;
    atlas_log_level level;
    double start_ms;   /* the process's start (CLOCK_MONOTONIC ms); 0: no first-answer line */
    atomic_bool told;  /* the first answer was logged */
};

static const char *const level_names[] = {"error", "warn", "info", "debug"};

atlas_status atlas_log_create(int fd, atlas_log_format format, atlas_log_level level,
                              atlas_log **out) {
    *out = NULL;
    if (format != ATLAS_LOG_TEXT && format != ATLAS_LOG_JSON)
        return atlas_fail(ATLAS_ERR_INVALID, "server params: log_format %d (text 0, json 1)",
                          (int)format);
    if (level < ATLAS_LOG_ERROR || level > ATLAS_LOG_DEBUG)
        return atlas_fail(ATLAS_ERR_INVALID, "server params: log_level %d (error 0 .. debug 3)",
                          (int)level);
    atlas_log *l = calloc(1, sizeof *l);
    if (!l) return atlas_fail(ATLAS_ERR_NOMEM, "server log: out of memory");
    *l = (atlas_log){.fd = fd, .format = format, .level = level};
    *out = l;
    return ATLAS_OK;
}

void atlas_log_free(atlas_log *l) { free(l); }

void atlas_log_set_start(atlas_log *l, double start_ms) {
    if (l) l->start_ms = start_ms;
}

/* The process's start to its first answer, the end of a start-up (bench/gpu/start.sh reads
 * it). */
static void first_answer(atlas_log *l, const atlas_log_request *r) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double s = (ts.tv_sec * 1e3 + ts.tv_nsec / 1e6 - l->start_ms) / 1e3;
    json_t *o = json_pack("{s:f}", "since_start_s", round(s * 1e3) / 1e3);
    atlas_log_fields(l, ATLAS_LOG_INFO, false, o, "start: first answer %.3f s after the process "
                     "started (its request took %.1f ms)", s, r->total_ms);
}

bool atlas_log_enabled(const atlas_log *l, atlas_log_level level) {
    return l && l->fd >= 0 && level <= l->level;
}

/* "2025-01-31T12:00:00.123Z": UTC, milliseconds. */
static void timestamp(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
}

/* The whole line in one write (retried only on EINTR and short writes): a line is never
 * split by another thread's. A log that cannot be written is dropped silently: the server
 * goes on serving. */
static void emit(const atlas_log *l, const char *line, size_t n) {
    while (n > 0) {
        ssize_t w = write(l->fd, line, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        line += w;
        n -= (size_t)w;
    }
}

/* Text format: a value with no spaces, quotes or control bytes as is, else quoted with
 * those escaped; client-supplied strings (a path, a model name) cannot forge a field or a
 * line. */
static void text_value(char *out, size_t cap, const char *v) {
    bool plain = *v != '\0';
    for (const unsigned char *c = (const unsigned char *)v; *c && plain; c++)
        plain = *c > 0x20 && *c != '"' && *c != '\\' && *c != 0x7f && *c != '=';
    size_t n = 0;
    if (plain) {
        snprintf(out, cap, "%s", v);
        return;
    }
    out[n++] = '"';
    /* a cut falls before a character, never inside one: room is checked at its first byte */
    for (const unsigned char *c = (const unsigned char *)v;
         *c && ((*c & 0xC0) == 0x80 || n + 6 < cap); c++) {
        if (*c == '"' || *c == '\\') out[n++] = '\\', out[n++] = (char)*c;
        else if (*c < 0x20 || *c == 0x7f) n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *c);
        else out[n++] = (char)*c;
    }
    out[n++] = '"';
    out[n] = '\0';
}

/* JSON format: obj with time and level first, as one line. Takes obj. */
static void emit_json(const atlas_log *l, atlas_log_level level, json_t *obj) {
    char ts[40];
    timestamp(ts, sizeof ts);
    json_t *line = json_pack("{s:s, s:s}", "time", ts, "level", level_names[level]);
    if (line && obj) json_object_update(line, obj);
    json_decref(obj);
    char *s = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6))
                   : NULL;
    json_decref(line);
    if (!s) return;
    size_t n = strlen(s);
    char *nl = realloc(s, n + 2);
    if (!nl) {
        free(s);
        return;
    }
    nl[n] = '\n';
    emit(l, nl, n + 1);
    free(nl);
}

/* One line of the server's own: msg (cleaned to valid UTF-8, on one line), in JSON with the
 * fields of extra (taken, may be NULL). */
static void write_msg(atlas_log *l, atlas_log_level level, const char *raw, json_t *extra) {
    char msg[3 * 2048];
    /* a message may quote a name from the file system: JSON takes only valid UTF-8 */
    atlas_utf8_clean(msg, sizeof msg, raw, strlen(raw));
    for (char *c = msg; *c; c++) /* one line whatever the message holds */
        if (*c == '\n' || *c == '\r') *c = ' ';
    if (l->format == ATLAS_LOG_JSON) {
        json_t *line = json_pack("{s:s}", "msg", msg);
        if (line && extra) json_object_update(line, extra);
        json_decref(extra);
        emit_json(l, level, line);
        return;
    }
    json_decref(extra);
    char ts[40], line[sizeof msg + 64];
    timestamp(ts, sizeof ts);
    int n = snprintf(line, sizeof line, "%s %s %s\n", ts, level_names[level], msg);
    if (n > 0) emit(l, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void atlas_log_vmessage(atlas_log *l, atlas_log_level level, bool always, const char *fmt,
                        va_list ap) {
    if (!atlas_log_enabled(l, always ? ATLAS_LOG_ERROR : level)) return;
    char raw[2048];
    vsnprintf(raw, sizeof raw, fmt, ap);
    write_msg(l, level, raw, NULL);
}

void atlas_log_fields(atlas_log *l, atlas_log_level level, bool always, json_t *obj,
                      const char *fmt, ...) {
    if (!atlas_log_enabled(l, always ? ATLAS_LOG_ERROR : level)) {
        json_decref(obj);
        return;
    }
    char raw[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    write_msg(l, level, raw, obj);
}

void atlas_log_message(atlas_log *l, atlas_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    atlas_log_vmessage(l, level, false, fmt, ap);
    va_end(ap);
}

/* Milliseconds to a tenth, as the text format writes them. */
static double tenth(double ms) { return round(ms * 10) / 10; }

static atlas_log_level level_of(int status) {
    return status >= 500 ? ATLAS_LOG_ERROR : status >= 400 ? ATLAS_LOG_WARN : ATLAS_LOG_INFO;
}

/* A record's fields as valid UTF-8: the path and the model hold whatever bytes the client
 * sent, and JSON takes no other (json_pack would refuse, and the line would be lost). */
#define FIELD_CAP(f) (3 * sizeof ((atlas_log_request *)0)->f)
typedef struct clean_record {
    char method[FIELD_CAP(method)], path[FIELD_CAP(path)], model[FIELD_CAP(model)],
        client[FIELD_CAP(client)], reason[FIELD_CAP(reason)];
} clean_record;

static void clean(const atlas_log_request *r, clean_record *c) {
    atlas_utf8_clean(c->method, sizeof c->method, r->method, strlen(r->method));
    atlas_utf8_clean(c->path, sizeof c->path, r->path, strlen(r->path));
    atlas_utf8_clean(c->model, sizeof c->model, r->model, strlen(r->model));
    atlas_utf8_clean(c->client, sizeof c->client, r->client, strlen(r->client));
    atlas_utf8_clean(c->reason, sizeof c->reason, r->reason, strlen(r->reason));
}

/* Room for a text_value of a cleaned field: four bytes out for each byte of the record (an
 * escape \xNN, or U+FFFD for a byte that is not UTF-8), the quotes and the NUL. */
#define TEXT_CAP(f) (4 * sizeof ((atlas_log_request *)0)->f + 3)

void atlas_log_request_done(atlas_log *l, const atlas_log_request *r) {
    if (l && l->start_ms > 0 && r->status >= 200 && r->status < 300 && r->model[0] &&
        !atomic_exchange(&l->told, true))
        first_answer(l, r);
    atlas_log_level level = level_of(r->status);
    if (!atlas_log_enabled(l, level)) return;
    clean_record c;
    clean(r, &c);
    if (l->format == ATLAS_LOG_JSON) {
        json_t *o = json_pack("{s:s, s:s, s:o, s:i, s:I, s:I, s:o, s:f, s:s}", "method",
                              c.method, "path", c.path, "model",
                              c.model[0] ? json_string(c.model) : json_null(), "status",
                              r->status, "tokens_in", (json_int_t)r->tokens_in, "tokens_out",
                              (json_int_t)r->tokens_out, "ttft_ms",
                              r->ttft_ms >= 0 ? json_real(tenth(r->ttft_ms)) : json_null(),
                              "total_ms", tenth(r->total_ms), "client", c.client);
        if (o && c.reason[0]) json_object_set_new(o, "reason", json_string(c.reason));
        if (o) emit_json(l, level, o);
        return;
    }
    char ts[40], method[TEXT_CAP(method)], path[TEXT_CAP(path)], model[TEXT_CAP(model)],
        client[TEXT_CAP(client)], reason[TEXT_CAP(reason) + 8] = "", ttft[32];
    char line[sizeof method + sizeof path + sizeof model + sizeof client + sizeof reason + 256];
    timestamp(ts, sizeof ts);
    text_value(method, sizeof method, c.method);
    text_value(path, sizeof path, c.path);
    text_value(model, sizeof model, c.model[0] ? c.model : "-");
    text_value(client, sizeof client, c.client);
    if (c.reason[0]) {
        memcpy(reason, " reason=", 8);
        text_value(reason + 8, sizeof reason - 8, c.reason);
    }
    if (r->ttft_ms >= 0) snprintf(ttft, sizeof ttft, "%.1f", r->ttft_ms);
    else snprintf(ttft, sizeof ttft, "-");
    int n = snprintf(line, sizeof line, "%s %s %s %s model=%s status=%d tokens_in=%ld "
                     "tokens_out=%ld ttft_ms=%s total_ms=%.1f client=%s%s\n", ts,
                     level_names[level], method, path, model, r->status, r->tokens_in,
                     r->tokens_out, ttft, r->total_ms, client, reason);
    if (n > 0) emit(l, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void atlas_log_request_start(atlas_log *l, const atlas_log_request *r, size_t body_bytes) {
    if (!atlas_log_enabled(l, ATLAS_LOG_DEBUG)) return;
    clean_record c;
    clean(r, &c);
    if (l->format == ATLAS_LOG_JSON) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I}", "event", "request", "method",
                              c.method, "path", c.path, "client", c.client, "body_bytes",
                              (json_int_t)body_bytes);
        if (o) emit_json(l, ATLAS_LOG_DEBUG, o);
        return;
    }
    char method[TEXT_CAP(method)], path[TEXT_CAP(path)], client[TEXT_CAP(client)];
    text_value(method, sizeof method, c.method);
    text_value(path, sizeof path, c.path);
    text_value(client, sizeof client, c.client);
    atlas_log_message(l, ATLAS_LOG_DEBUG, "request %s %s client=%s body_bytes=%zu", method,
                      path, client, body_bytes);
}
