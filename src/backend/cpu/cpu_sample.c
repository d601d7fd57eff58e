/* backend/cpu/cpu_sample.c — the sample op on the CPU: each row through the sampler
 * (atlas/sampler.h, the reference), its adjustments turned back into the history and
 * logit_bias the sampler takes; the rows spread over the backend's threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/sampler.h"
#include "backend/cpu/cpu.h"
#include "core/error.h"

/* Scratch of one op call, sized for its largest row. */
typedef struct sample_scratch {
    atlas_sampler *s;
    float *row;              /* [vocab]: the row the sampler transforms */
    int32_t *hist;           /* a row's history: the seen ids once (its "prompt"), then each
                                generated one count times */
    atlas_logit_bias *bias;
    size_t hist_cap;
    int bias_cap;
} sample_scratch;

static atlas_status scratch_fit(sample_scratch *x, const atlas_sample_adj *a, int n) {
    size_t h = 0;
    for (int j = 0; j < n; j++) h += (size_t)a[j].seen + (size_t)a[j].count;
    if (h > x->hist_cap) {
        int32_t *p = realloc(x->hist, h * sizeof *p);
        if (!p) return atlas_fail(ATLAS_ERR_NOMEM, "sample: a history of %zu", h);
        x->hist = p;
        x->hist_cap = h;
    }
    if (n > x->bias_cap) {
        atlas_logit_bias *b = realloc(x->bias, (size_t)n * sizeof *b);
        if (!b) return atlas_fail(ATLAS_ERR_NOMEM, "sample: %d biases", n);
        x->bias = b;
        x->bias_cap = n;
    }
    return ATLAS_OK;
}

/* Row q through the sampler: its id into o, the logprobs of raw (untouched) after. */
static atlas_status sample_one(sample_scratch *x, const atlas_sample_row *q,
                               const atlas_sample_adj *a, const float *raw, int vocab,
                               atlas_sample_out *o) {
    ATLAS_TRY(scratch_fit(x, a, q->n_adj));
    size_t n_seen = 0, n_hist = 0;
    int n_bias = 0;
    for (int j = 0; j < q->n_adj; j++) {
        if (a[j].seen) x->hist[n_seen++] = a[j].id;
        if (a[j].bias != 0.0f) x->bias[n_bias++] = (atlas_logit_bias){a[j].id, a[j].bias};
    }
    n_hist = n_seen;
    for (int j = 0; j < q->n_adj; j++)
        for (int c = 0; c < a[j].count; c++) x->hist[n_hist++] = a[j].id;
    atlas_sampler_params sp = {.temperature = q->temperature, .top_k = q->top_k,
                               .top_p = q->top_p, .min_p = q->min_p,
                               .repetition_penalty = q->repetition_penalty,
                               .presence_penalty = q->presence_penalty,
                               .frequency_penalty = q->frequency_penalty, .seed = q->seed,
                               .logit_bias = x->bias, .n_logit_bias = n_bias};
    ATLAS_TRY(atlas_sampler_reset(x->s, &sp));
    atlas_sampler_set_prompt_len(x->s, n_seen);
    memcpy(x->row, raw, (size_t)vocab * sizeof *raw);
    ATLAS_TRY(atlas_sampler_sample_at(x->s, x->row, vocab, x->hist, n_hist, q->counter, &o->id));
    int n_top = 0;
    float lp = 0;
    if ((q->flags & ATLAS_SAMPLE_LOGPROB) || q->n_top > 0) /* a pass over the row in double */
        ATLAS_TRY(atlas_sampler_logprobs(raw, vocab, o->id, &lp, q->n_top, o->top_ids,
                                         o->top_logprobs, &n_top));
    o->logprob = (q->flags & ATLAS_SAMPLE_LOGPROB) ? lp : 0.0f;
    o->n_top = n_top;
    return ATLAS_OK;
}

/* A call's rows, taken by the pool's threads in ranges, each thread with scratch of its own
 * (made at its first row); the failure of the lowest row is the one reported, as a loop
 * over the rows would report it. */
typedef struct sample_job {
    sample_scratch *x; /* [threads] */
    atlas_sample_out *out;
    const float *logits;
    int vocab;
    const atlas_sample_row *p;
    const atlas_sample_adj *adj;
    pthread_mutex_t mu;
    int failed_row; /* -1: none */
    atlas_status st;
    char why[512];
} sample_job;

static atlas_status scratch_make(sample_scratch *x, int vocab) {
    if (x->s) return ATLAS_OK;
    atlas_sampler_params dp = atlas_sampler_default_params();
    ATLAS_TRY(atlas_sampler_create(&dp, &x->s));
    if (!(x->row = malloc((size_t)vocab * sizeof *x->row)))
        return atlas_fail(ATLAS_ERR_NOMEM, "sample: a row of %d", vocab);
    return ATLAS_OK;
}

static void sample_range(void *ctx, int64_t begin, int64_t end, int thread) {
    sample_job *j = ctx;
    sample_scratch *x = &j->x[thread];
    for (int64_t r = begin; r < end; r++) {
        if (j->p[r].flags & ATLAS_SAMPLE_SKIP) continue;
        atlas_status st = scratch_make(x, j->vocab);
        if (st == ATLAS_OK)
            st = sample_one(x, &j->p[r], j->adj + j->p[r].adj0,
                            j->logits + (size_t)r * j->vocab, j->vocab, &j->out[r]);
        if (st == ATLAS_OK) continue;
        pthread_mutex_lock(&j->mu);
        if (j->failed_row < 0 || r < j->failed_row) {
            j->failed_row = (int)r;
            j->st = st;
            snprintf(j->why, sizeof j->why, "%s", atlas_last_error());
        }
        pthread_mutex_unlock(&j->mu);
        return;
    }
}

atlas_status cpu_sample(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                        int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                        int n_adj) {
    cpu_backend *cb = (cpu_backend *)be;
    ATLAS_TRY(atlas_sample_check(p, rows, adj, n_adj, vocab));
    if (rows == 0) return ATLAS_OK;
    int threads = atlas_threadpool_size(cb->pool);
    sample_job j = {.x = calloc((size_t)threads, sizeof *j.x), .out = out, .logits = logits,
                    .vocab = vocab, .p = p, .adj = adj, .failed_row = -1};
    if (!j.x) return atlas_fail(ATLAS_ERR_NOMEM, "sample: scratch of %d threads", threads);
    if (pthread_mutex_init(&j.mu, NULL) != 0) {
        free(j.x);
        return atlas_fail(ATLAS_ERR_NOMEM, "sample: a lock for %d rows", rows);
    }
    /* a row is a few ms of a large vocabulary's passes: worth a thread of its own */
    atlas_threadpool_for(cb->pool, rows, 1, sample_range, &j);
    pthread_mutex_destroy(&j.mu);
    for (int t = 0; t < threads; t++) {
        atlas_sampler_free(j.x[t].s);
        free(j.x[t].row);
        free(j.x[t].hist);
        free(j.x[t].bias);
    }
    free(j.x);
    if (j.failed_row >= 0)
        return atlas_fail(j.st, "sample: row %d: %s", j.failed_row, j.why);
    return ATLAS_OK;
}
