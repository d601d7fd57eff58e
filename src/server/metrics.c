/* server/metrics.c — the server's own counters and latency histograms, in Prometheus text. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/utf8.h"

static const double e2e_bounds[ATLAS_HIST_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                       0.25,  0.5,   1,    2.5,   5,    10,
                                                       20,    40,    80,   160};

static const char *route_names[ATLAS_ROUTE_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/load",
    "/v1/models/unload",    "/health",         "/metrics",   "/tokenize",
    "/detokenize",          "/apply-template", "/v1/responses", "/v1/embeddings",
    "/api/chat",            "/api/generate",   "/api",          "/v1/messages",
    "/v1/messages/count_tokens", "other"};

/* the engine's own (atlas_time_to_first_token_seconds, atlas_inter_token_latency_seconds),
 * whose families the per-model series join */
static const double lat_bounds[ATLAS_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                       0.1,   0.25,   0.5,   1,    2.5,   5,
                                                       10,    25,     60,    120};

const char *atlas_route_name(atlas_route_id route) { return route_names[route]; }

static void series_init(atlas_model_series *s, char *name) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->queue.bounds = s->prefill.bounds = s->decode.bounds = e2e_bounds;
    s->ttft.bounds = s->itl.bounds = lat_bounds;
}

void atlas_server_metrics_init(atlas_server_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->e2e.bounds = e2e_bounds;
    series_init(&m->total, NULL);
}

void atlas_server_metrics_destroy(atlas_server_metrics *m) {
    for (int i = 0; i < m->n_models; i++) free(m->models[i].name);
    free(m->models);
    pthread_mutex_destroy(&m->mu);
}

static int bucket(const double *bounds, double s) {
    int b = 0;
    while (b < ATLAS_HIST_BUCKETS && s > bounds[b]) b++;
    return b;
}

static void hist_add(atlas_histogram *h, double s) {
    h->counts[bucket(h->bounds, s)]++;
    h->n++;
    h->sum += s;
}

void atlas_itl_local_token(atlas_itl_local *t, double now) {
    if (t->t_last > 0) {
        double d = now - t->t_last;
        t->counts[bucket(lat_bounds, d)]++;
        t->n++;
        t->sum += d;
    }
    t->t_last = now;
}

static void series_end(atlas_model_series *s, double queue_s, double ttft_s, double decode_s,
                       int prompt, int cached, const atlas_itl_local *itl) {
    s->requests++;
    s->prefix_queries += prompt > 0 ? (uint64_t)prompt : 0;
    s->prefix_hits += cached > 0 ? (uint64_t)cached : 0;
    /* a request cancelled while queued never ran: it has no queue time to give */
    if (queue_s > 0) hist_add(&s->queue, queue_s);
    if (ttft_s > 0) {
        hist_add(&s->ttft, ttft_s);
        if (ttft_s >= queue_s) hist_add(&s->prefill, ttft_s - queue_s);
    }
    if (decode_s >= 0) hist_add(&s->decode, decode_s);
    if (itl) {
        for (int b = 0; b <= ATLAS_HIST_BUCKETS; b++) s->itl.counts[b] += itl->counts[b];
        s->itl.n += itl->n;
        s->itl.sum += itl->sum;
    }
}

/* The series of model, made on its first end; NULL when out of memory (the totals still
 * count it). */
static atlas_model_series *series_of(atlas_server_metrics *m, const char *model) {
    for (int i = 0; i < m->n_models; i++)
        if (strcmp(m->models[i].name, model) == 0) return &m->models[i];
    char *name = strdup(model);
    atlas_model_series *grown = name ? realloc(m->models, (size_t)(m->n_models + 1) *
                                                              sizeof *m->models)
                                     : NULL;
    if (!grown) {
        free(name);
        return NULL;
    }
    m->models = grown;
    series_init(&m->models[m->n_models], name);
    return &m->models[m->n_models++];
}

void atlas_server_metrics_end(atlas_server_metrics *m, const char *model, double queue_s,
                              double ttft_s, double decode_s, int prompt_tokens,
                              int cached_tokens, const atlas_itl_local *itl) {
    pthread_mutex_lock(&m->mu);
    series_end(&m->total, queue_s, ttft_s, decode_s, prompt_tokens, cached_tokens, itl);
    atlas_model_series *s = model ? series_of(m, model) : NULL;
    if (s) series_end(s, queue_s, ttft_s, decode_s, prompt_tokens, cached_tokens, itl);
    pthread_mutex_unlock(&m->mu);
}

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

/* `NAME{model_name="MODEL"` then `,` or `}` as more labels follow or not. */
static int labelled(char **b, size_t *l, size_t *c, const char *name, const char *suffix,
                    const char *model, bool more) {
    int rc = atlas_buf_printf(b, l, c, "%s%s{model_name=\"", name, suffix);
    rc |= atlas_metrics_print_label(b, l, c, model);
    rc |= atlas_buf_printf(b, l, c, "\"%s", more ? "," : "}");
    return rc;
}

/* A histogram's lines for one model, without HELP and TYPE. */
static int print_hist_model(char **b, size_t *l, size_t *c, const char *name, const char *model,
                            const atlas_histogram *h) {
    int rc = 0;
    uint64_t cum = 0;
    for (int i = 0; i <= ATLAS_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        rc |= labelled(b, l, c, name, "_bucket", model, true);
        if (i < ATLAS_HIST_BUCKETS)
            rc |= atlas_buf_printf(b, l, c, "le=\"%g\"} %llu\n", h->bounds[i],
                                   (unsigned long long)cum);
        else rc |= atlas_buf_printf(b, l, c, "le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    rc |= labelled(b, l, c, name, "_sum", model, false);
    rc |= atlas_buf_printf(b, l, c, " %.6f\n", h->sum);
    rc |= labelled(b, l, c, name, "_count", model, false);
    rc |= atlas_buf_printf(b, l, c, " %llu\n", (unsigned long long)h->n);
    return rc;
}

static const atlas_histogram *series_hist(const atlas_model_series *s, atlas_series_hist w) {
    switch (w) {
    case ATLAS_SERIES_QUEUE: return &s->queue;
    case ATLAS_SERIES_PREFILL: return &s->prefill;
    case ATLAS_SERIES_DECODE: return &s->decode;
    case ATLAS_SERIES_TTFT: return &s->ttft;
    default: return &s->itl;
    }
}

static int print_models_locked(atlas_server_metrics *m, atlas_series_hist which,
                               const char *name, char **b, size_t *l, size_t *c) {
    int rc = 0;
    for (int i = 0; i < m->n_models; i++)
        rc |= print_hist_model(b, l, c, name, m->models[i].name, series_hist(&m->models[i], which));
    return rc;
}

int atlas_server_metrics_print_models(atlas_server_metrics *m, atlas_series_hist which,
                                      const char *name, char **b, size_t *l, size_t *c) {
    pthread_mutex_lock(&m->mu);
    int rc = print_models_locked(m, which, name, b, l, c);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* A family of the totals (unlabelled) and every model's series (labelled). */
static int print_series_hist(atlas_server_metrics *m, atlas_series_hist which, const char *name,
                             const char *help, char **b, size_t *l, size_t *c) {
    int rc = print_hist(b, l, c, name, help, series_hist(&m->total, which));
    return rc | print_models_locked(m, which, name, b, l, c);
}

/* A counter family likewise; off is the counter's offset in atlas_model_series. */
static int print_series_counter(atlas_server_metrics *m, size_t off, const char *name,
                                const char *help, char **b, size_t *l, size_t *c) {
#define AT(s) (*(const uint64_t *)((const char *)(s) + off))
    int rc = atlas_buf_printf(b, l, c, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help,
                              name, name, (unsigned long long)AT(&m->total));
    for (int i = 0; i < m->n_models; i++) {
        rc |= labelled(b, l, c, name, "", m->models[i].name, false);
        rc |= atlas_buf_printf(b, l, c, " %llu\n", (unsigned long long)AT(&m->models[i]));
    }
#undef AT
    return rc;
}

static int print_series(atlas_server_metrics *m, char **b, size_t *l, size_t *c) {
    int rc = print_series_counter(m, offsetof(atlas_model_series, requests),
                                  "atlas_request_success_total",
                                  "Generations ended (any reason).", b, l, c);
    rc |= print_series_counter(m, offsetof(atlas_model_series, prefix_queries),
                               "atlas_prefix_cache_queries_total",
                               "Prompt tokens looked up in the prefix cache.", b, l, c);
    rc |= print_series_counter(m, offsetof(atlas_model_series, prefix_hits),
                               "atlas_prefix_cache_hits_total",
                               "Prompt tokens found in the prefix cache.", b, l, c);
    rc |= print_series_hist(m, ATLAS_SERIES_QUEUE, "atlas_request_queue_time_seconds",
                            "From submit to the first step that computed the request.", b, l, c);
    rc |= print_series_hist(m, ATLAS_SERIES_PREFILL, "atlas_request_prefill_time_seconds",
                            "From the first step of the request to its first token.", b, l, c);
    rc |= print_series_hist(m, ATLAS_SERIES_DECODE, "atlas_request_decode_time_seconds",
                            "From the first token of the request to its last.", b, l, c);
    return rc;
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
    rc |= print_series(m, b, l, c);
    pthread_mutex_unlock(&m->mu);
    return rc;
}
