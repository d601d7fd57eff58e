/* backend/cpu/cpu_sample.c — the sample op on the CPU: each row through the sampler
 * (atlas/sampler.h, the reference), its adjustments turned back into the history and
 * logit_bias the sampler takes. */
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

atlas_status cpu_sample(atlas_backend *be, atlas_sample_out *out, void *logits, int rows,
                        int vocab, const atlas_sample_row *p, const atlas_sample_adj *adj,
                        int n_adj) {
    (void)be;
    ATLAS_TRY(atlas_sample_check(p, rows, adj, n_adj, vocab));
    sample_scratch x = {0};
    atlas_sampler_params dp = atlas_sampler_default_params();
    atlas_status st = atlas_sampler_create(&dp, &x.s);
    if (st == ATLAS_OK && !(x.row = malloc((size_t)vocab * sizeof *x.row)))
        st = atlas_fail(ATLAS_ERR_NOMEM, "sample: a row of %d", vocab);
    for (int r = 0; r < rows && st == ATLAS_OK; r++) {
        if (p[r].flags & ATLAS_SAMPLE_SKIP) continue;
        float *row = (float *)logits + (size_t)r * vocab;
        st = sample_one(&x, &p[r], adj + p[r].adj0, row, vocab, &out[r]);
        if (st != ATLAS_OK) st = atlas_fail_wrap(st, "sample: row %d", r);
    }
    atlas_sampler_free(x.s);
    free(x.row);
    free(x.hist);
    free(x.bias);
    return st;
}
