/* server/page.c — the chat page's files (page.h), with the headers that keep model output
 * and other sites out of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/errors.h"
#include "server/page.h"

/* Scripts, styles and requests only from this origin, no inline script (the page builds its
 * DOM from text, so a model's answer that holds markup stays text even if a bug let it
 * through), images from here or data: URLs, no framing by another site. */
static const char CSP[] = "default-src 'self'; script-src 'self'; style-src 'self'; "
                          "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                          "form-action 'none'; frame-ancestors 'none'";

static const char *type_of(const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (dot && !strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (dot && !strcmp(dot, ".svg")) return "image/svg+xml";
    return "application/octet-stream";
}

/* Whether a comma-separated Accept value lists text/html (with any parameters, but not
 * with q=0, which refuses it). */
bool atlas_page_wanted(const atlas_http_call *call) {
    const char *accept = atlas_http_header(call, "Accept");
    for (const char *p = accept; p && *p;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= 9 && !strncasecmp(p, "text/html", 9) &&
            (len == 9 || p[9] == ';' || p[9] == ' ')) {
            const char *q = memmem(p, len, "q=", 2);
            return !q || strtod(q + 2, NULL) > 0;
        }
        p = end ? end + 1 : p + len;
    }
    return false;
}

/* Whether an If-None-Match header (a list of ETags, or "*") holds etag. */
static bool etag_matches(const char *header, const char *etag) {
    if (!header) return false;
    if (!strcmp(header, "*")) return true;
    size_t n = strlen(etag);
    for (const char *p = strstr(header, etag); p; p = strstr(p + 1, etag))
        if ((p == header || p[-1] == ' ' || p[-1] == ',' || p[-1] == '/') &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ' '))
            return true;
    return false;
}

void atlas_page_get(atlas_http_call *call, json_t *body, const char *arg, atlas_http_reply *r) {
    (void)body;
    const char *want = arg && *arg ? arg : "index.html";
    size_t n;
    const atlas_page_file *files = atlas_page_files(&n), *f = NULL;
    for (size_t i = 0; i < n && !f; i++)
        if (!strcmp(files[i].name, want)) f = &files[i];
    if (!f) {
        char msg[200];
        snprintf(msg, sizeof msg, "GET /ui/%.100s: the page has no such file", want);
        atlas_api_error_reply(r, ATLAS_API_ERR_NO_ROUTE, ATLAS_OK, NULL, msg);
        return;
    }
    /* the same URL / answers Ollama's clients otherwise; the files change with the binary,
     * so a browser asks each time and is told 304 while its copy is current */
    static const char *const headers[] = {
        "Content-Security-Policy", CSP, "X-Content-Type-Options", "nosniff",
        "Referrer-Policy", "no-referrer", "Cache-Control", "no-cache", "Vary", "Accept"};
    memcpy(r->headers, headers, sizeof headers);
    r->headers[sizeof headers / sizeof headers[0]] = "ETag";
    r->headers[sizeof headers / sizeof headers[0] + 1] = f->etag;
    if (etag_matches(atlas_http_header(call, "If-None-Match"), f->etag)) {
        atlas_http_reply_text(r, 304, type_of(f->name), NULL, 0);
        return;
    }
    char *copy = malloc(f->len ? f->len : 1);
    if (!copy) {
        atlas_api_error_fail(r, atlas_fail(ATLAS_ERR_NOMEM, "the page: out of memory"), NULL);
        return;
    }
    memcpy(copy, f->data, f->len);
    atlas_http_reply_text(r, 200, type_of(f->name), copy, f->len);
}
