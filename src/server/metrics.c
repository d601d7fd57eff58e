/* server/metrics.c — the server's own counters and latency histograms, in Prometheus text. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/utf8.h"

static const double e2e_bounds[ATLAS_HIST_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                       2.5,  5,     10,   20,  40,   80, 160};

static const char *route_names[ATLAS_ROUTE_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/load",
    "/v1/models/unload",    "/health",         "/metrics",   "/tokenize",
    "/detokenize",          "/apply-template", "/v1/responses", "/api/chat",
    "/api/generate",        "/api",            "other"};

const char *atlas_route_name(atlas_route_id route) { return route_names[route]; }

void atlas_server_metrics_init(atlas_server_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->e2e.bounds = e2e_bounds;
}

void atlas_server_metrics_destroy(atlas_server_metrics *m) { pthread_mutex_destroy(&m->mu); }

void atlas_server_metrics_request(atlas_server_metrics *m, atlas_route_id route, int http) {
    int cls = http / 100 - 1;
    if (cls < 0 || cls > 4) cls = 4;
    pthread_mutex_lock(&m->mu);
    m->requests[route][cls]++;
    pthread_mutex_unlock(&m->mu);
}

void atlas_server_metrics_observe(atlas_server_metrics *m, atlas_histogram *h, double s) {
    int b = 0;
    while (b < ATLAS_HIST_BUCKETS && s > h->bounds[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->n++;
    h->sum += s;
    pthread_mutex_unlock(&m->mu);
}

int atlas_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = *cap - *len;
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return -1;
        if (*buf && (size_t)n < room) {
            *len += (size_t)n;
            return 0;
        }
        size_t want = *cap ? *cap * 2 : 4096;
        while (want < *len + (size_t)n + 1) want *= 2;
        char *grown = realloc(*buf, want);
        if (!grown) return -1;
        *buf = grown;
        *cap = want;
    }
}

int atlas_metrics_print_hist(char **b, size_t *l, size_t *c, const char *name, const char *help,
                             const double *bounds, const uint64_t *counts, int n_bounds,
                             double sum, uint64_t n) {
    int rc = atlas_buf_printf(b, l, c, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < n_bounds; i++) {
        cum += counts[i];
        rc |= atlas_buf_printf(b, l, c, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                               (unsigned long long)cum);
    }
    cum += counts[n_bounds];
    rc |= atlas_buf_printf(b, l, c, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n",
                           name, (unsigned long long)cum, name, sum, name, (unsigned long long)n);
    return rc;
}

int atlas_metrics_print_label(char **b, size_t *l, size_t *c, const char *v) {
    size_t n = strlen(v);
    char *clean = malloc(3 * n + 1), *esc = malloc(6 * n + 1);
    int rc = -1;
    if (clean && esc) {
        size_t k = atlas_utf8_clean(clean, 3 * n + 1, v, n), o = 0;
        for (size_t i = 0; i < k; i++) {
            if (clean[i] == '\\' || clean[i] == '"') esc[o++] = '\\', esc[o++] = clean[i];
            else if (clean[i] == '\n') esc[o++] = '\\', esc[o++] = 'n';
            else esc[o++] = clean[i];
        }
        esc[o] = '\0';
        rc = atlas_buf_printf(b, l, c, "%s", esc);
    }
    free(clean);
    free(esc);
    return rc;
}

static int print_hist(char **b, size_t *l, size_t *c, const char *name, const char *help,
                      const atlas_histogram *h) {
    return atlas_metrics_print_hist(b, l, c, name, help, h->bounds, h->counts, ATLAS_HIST_BUCKETS,
                                    h->sum, h->n);
}

int atlas_server_metrics_print(atlas_server_metrics *m, char **b, size_t *l, size_t *c) {
    pthread_mutex_lock(&m->mu);
    int rc = atlas_buf_printf(b, l, c,
                              "# HELP atlas_http_requests_total HTTP requests answered.\n"
                              "# TYPE atlas_http_requests_total counter\n");
    for (int r = 0; r < ATLAS_ROUTE_COUNT; r++)
        for (int k = 0; k < 5; k++)
            if (m->requests[r][k])
                rc |= atlas_buf_printf(b, l, c,
                                       "atlas_http_requests_total{route=\"%s\",code=\"%dxx\"} "
                                       "%llu\n",
                                       route_names[r], k + 1,
                                       (unsigned long long)m->requests[r][k]);
    rc |= atlas_buf_printf(b, l, c,
                           "# HELP atlas_requests_active Generations in flight in the server.\n"
                           "# TYPE atlas_requests_active gauge\natlas_requests_active %lld\n",
                           (long long)m->active_requests);
    rc |= print_hist(b, l, c, "atlas_request_duration_seconds",
                     "From HTTP request arrival to its last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    return rc;
}
