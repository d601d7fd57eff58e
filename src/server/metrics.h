/* server/metrics.h — what the server counts itself (HTTP requests, request latency);
 * /metrics prints these beside the engine's own snapshot, in Prometheus text format.
 * Internal to src/server.  All calls are thread-safe. */
#ifndef ATLAS_SERVER_METRICS_H
#define ATLAS_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum { ATLAS_HIST_BUCKETS = 16 };

/* A latency histogram with fixed bucket bounds (seconds). */
typedef struct atlas_histogram {
    const double *bounds;              /* [ATLAS_HIST_BUCKETS], increasing */
    uint64_t counts[ATLAS_HIST_BUCKETS + 1]; /* the last one is +Inf */
    uint64_t n;
    double sum;
} atlas_histogram;

typedef enum atlas_route_id {
    ATLAS_ROUTE_CHAT, ATLAS_ROUTE_COMPLETIONS, ATLAS_ROUTE_MODELS, ATLAS_ROUTE_MODEL_LOAD,
    ATLAS_ROUTE_MODEL_UNLOAD, ATLAS_ROUTE_HEALTH, ATLAS_ROUTE_METRICS, ATLAS_ROUTE_TOKENIZE,
    ATLAS_ROUTE_DETOKENIZE, ATLAS_ROUTE_TEMPLATE, ATLAS_ROUTE_RESPONSES, ATLAS_ROUTE_EMBEDDINGS,
    ATLAS_ROUTE_OLLAMA_CHAT,
    ATLAS_ROUTE_OLLAMA_GENERATE, ATLAS_ROUTE_OLLAMA, ATLAS_ROUTE_MESSAGES,
    ATLAS_ROUTE_COUNT_TOKENS, ATLAS_ROUTE_OTHER, ATLAS_ROUTE_COUNT
} atlas_route_id;

/* What the generations of one model (or of all: the totals) came to, counted at their
 * ends. */
typedef struct atlas_model_series {
    char *name;                 /* NULL for the totals */
    uint64_t requests;          /* generations ended */
    uint64_t prefix_queries;    /* prompt tokens looked up in the prefix cache */
    uint64_t prefix_hits;       /* of them found there */
    atlas_histogram queue;      /* submit to the first step that computed it */
    atlas_histogram prefill;    /* that step to the first token */
    atlas_histogram decode;     /* the first token to the last */
    atlas_histogram ttft;       /* submit to the first token */
    atlas_histogram itl;        /* between consecutive tokens */
} atlas_model_series;

/* One generation's gaps between tokens, kept by its own thread and merged at its end so
 * that a token costs no lock. */
typedef struct atlas_itl_local {
    uint64_t counts[ATLAS_HIST_BUCKETS + 1];
    uint64_t n;
    double sum, t_last;
} atlas_itl_local;

typedef struct atlas_server_metrics {
    pthread_mutex_t mu;
    uint64_t requests[ATLAS_ROUTE_COUNT][5]; /* by route and status class 1xx..5xx */
    int64_t active_requests;                 /* generations in flight */
    atlas_histogram e2e;                     /* request arrival to its last token */
    atlas_model_series total;
    atlas_model_series *models;              /* [n_models], by first end */
    int n_models;
} atlas_server_metrics;

/* A token of a generation arrived at time now (seconds). */
void atlas_itl_local_token(atlas_itl_local *t, double now);
/* A generation of model ended: its queue time, time to first token (0: none; both as
 * atlas_event gives them), its decode time (-1: no token), usage and gaps between tokens. */
void atlas_server_metrics_end(atlas_server_metrics *m, const char *model, double queue_s,
                              double ttft_s, double decode_s, int prompt_tokens,
                              int cached_tokens, const atlas_itl_local *itl);

void atlas_server_metrics_init(atlas_server_metrics *m);
void atlas_server_metrics_destroy(atlas_server_metrics *m);
void atlas_server_metrics_request(atlas_server_metrics *m, atlas_route_id route, int http);
void atlas_server_metrics_observe(atlas_server_metrics *m, atlas_histogram *h, double seconds);
const char *atlas_route_name(atlas_route_id route);

/* Appends the server's metrics in Prometheus text format to *buf (malloc'd, grown). */
/* Appends one Prometheus histogram (n_bounds bounds, n_bounds + 1 counts, the last +Inf)
 * to the growing buffer *b (length *l, capacity *c); non-zero when out of memory. */
int atlas_metrics_print_hist(char **b, size_t *l, size_t *c, const char *name, const char *help,
                             const double *bounds, const uint64_t *counts, int n_bounds,
                             double sum, uint64_t n);
int atlas_server_metrics_print(atlas_server_metrics *m, char **buf, size_t *len, size_t *cap);

/* Appends v as the value of a label, between the quotes the caller writes: made valid
 * UTF-8 (atlas_utf8_clean), then backslash, double quote and newline escaped as the
 * Prometheus text format requires; a model's name may hold any of them. 0, or -1 when out
 * of memory. */
int atlas_metrics_print_label(char **b, size_t *l, size_t *c, const char *v);

/* Which histogram of atlas_model_series. */
typedef enum atlas_series_hist {
    ATLAS_SERIES_QUEUE, ATLAS_SERIES_PREFILL, ATLAS_SERIES_DECODE, ATLAS_SERIES_TTFT,
    ATLAS_SERIES_ITL
} atlas_series_hist;

/* Appends the lines of histogram `which` of every model's series, labelled model_name
 * (escaped), without HELP and TYPE: for a family whose totals another source printed. */
int atlas_server_metrics_print_models(atlas_server_metrics *m, atlas_series_hist which,
                                      const char *name, char **b, size_t *l, size_t *c);

/* printf-append to a growing buffer; returns 0, or -1 when out of memory. */
int atlas_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
