/* engine/sample_rows.c — a sampled step's rows for the backend's sample op (backend.h): each
 * sequence's parameters, its seed with the position it draws at, and its history and
 * logit_bias turned into the op's adjustments (the distinct ids it holds, with the times
 * each was generated, and the bias), so that the device never sees a whole history.
 * Called by step.c on the scheduler thread. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine_internal.h"

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* By id, then by the order given (held in count while sorting): repeated ids sum in it. */
static int cmp_bias(const void *a, const void *b) {
    const atlas_sample_adj *x = a, *y = b;
    if (x->id != y->id) return (x->id > y->id) - (x->id < y->id);
    return (x->count > y->count) - (x->count < y->count);
}

atlas_status atlas_engine_seq_sampling(seq *s, const atlas_sampler_params *sp) {
    s->sp = *sp;
    s->sp.logit_bias = NULL;
    s->sp.n_logit_bias = 0;
    s->n_bias = 0;
    if (sp->n_logit_bias <= 0) return ATLAS_OK;
    s->bias = malloc((size_t)sp->n_logit_bias * sizeof *s->bias);
    if (!s->bias) return atlas_fail(ATLAS_ERR_NOMEM, "request: logit_bias");
    for (int i = 0; i < sp->n_logit_bias; i++)
        s->bias[i] = (atlas_sample_adj){sp->logit_bias[i].id, 0, i, sp->logit_bias[i].bias};
    qsort(s->bias, (size_t)sp->n_logit_bias, sizeof *s->bias, cmp_bias);
    for (int i = 0; i < sp->n_logit_bias; i++) {
        if (s->n_bias > 0 && s->bias[s->n_bias - 1].id == s->bias[i].id)
            s->bias[s->n_bias - 1].bias += s->bias[i].bias;
        else
            s->bias[s->n_bias++] = s->bias[i];
        s->bias[s->n_bias - 1].count = 0;
    }
    return ATLAS_OK;
}

int atlas_engine_seq_on_host(const seq *s) {
    int g = s->n_tokens - s->n_prompt;
    return s->matcher || g < s->n_forced ||
           (s->think_budget && s->think_in &&
            (s->think_forcing >= 0 || s->think_used >= s->think_budget));
}

static atlas_status grow(void **p, size_t *cap, size_t need, size_t size, const char *what) {
    if (need <= *cap) return ATLAS_OK;
    size_t n = *cap * 2 > need ? *cap * 2 : need;
    void *q = realloc(*p, n * size);
    if (!q) return atlas_fail(ATLAS_ERR_NOMEM, "engine: %s of %zu", what, n);
    *p = q;
    *cap = n;
    return ATLAS_OK;
}

/* s's history as sorted keys id * 2 + (generated): the whole of it when the repetition
 * penalty is on, its generated part for presence and frequency only, else none. */
static atlas_status history_keys(atlas_engine *e, const seq *s, size_t *n_keys) {
    const atlas_sampler_params *sp = &s->sp;
    int rep = sp->repetition_penalty != 1.0f;
    int pf = sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
    int from = rep ? 0 : pf ? s->n_prompt : s->n_tokens;
    size_t n = (size_t)(s->n_tokens - from);
    ATLAS_TRY(grow((void **)&e->smp_keys, &e->smp_keys_cap, n, sizeof *e->smp_keys,
                   "history keys"));
    for (size_t i = 0; i < n; i++) {
        int t = from + (int)i;
        e->smp_keys[i] = (uint32_t)s->tokens[t] * 2u + (t >= s->n_prompt);
    }
    if (n > 1) qsort(e->smp_keys, n, sizeof *e->smp_keys, cmp_u32); /* (none: no buffer yet) */
    *n_keys = n;
    return ATLAS_OK;
}

/* Appends s's adjustments to e->smp_adj at *n: its history's distinct ids merged with its
 * logit_bias, by increasing id. */
static atlas_status seq_adj(atlas_engine *e, const seq *s, size_t *n) {
    size_t nk;
    ATLAS_TRY(history_keys(e, s, &nk));
    ATLAS_TRY(grow((void **)&e->smp_adj, &e->smp_adj_cap, *n + nk + (size_t)s->n_bias,
                   sizeof *e->smp_adj, "sampling adjustments"));
    atlas_sample_adj *out = e->smp_adj + *n;
    size_t m = 0, k = 0;
    int b = 0;
    while (k < nk || b < s->n_bias) {
        int32_t hid = k < nk ? (int32_t)(e->smp_keys[k] >> 1) : INT32_MAX;
        int32_t id = b < s->n_bias && s->bias[b].id < hid ? s->bias[b].id : hid;
        atlas_sample_adj a = {id, 0, 0, 0.0f};
        for (; k < nk && (int32_t)(e->smp_keys[k] >> 1) == id; k++) {
            a.seen = 1;
            a.count += (int32_t)(e->smp_keys[k] & 1u);
        }
        if (b < s->n_bias && s->bias[b].id == id) a.bias = s->bias[b++].bias;
        out[m++] = a;
    }
    *n += m;
    return ATLAS_OK;
}

/* e->smp_rows and e->smp_out of n rows at least. */
static atlas_status smp_fit(atlas_engine *e, int n) {
    if (n <= e->smp_cap) return ATLAS_OK;
    atlas_sample_row *r = realloc(e->smp_rows, (size_t)n * sizeof *r);
    if (r) e->smp_rows = r;
    atlas_sample_out *o = realloc(e->smp_out, (size_t)n * sizeof *o);
    if (o) e->smp_out = o;
    if (!r || !o) return atlas_fail(ATLAS_ERR_NOMEM, "engine: %d sampling rows", n);
    e->smp_cap = n;
    return ATLAS_OK;
}

atlas_status atlas_engine_sample_rows(atlas_engine *e, int n_logits, int *n_adj_out,
                                      int *n_host) {
    ATLAS_TRY(smp_fit(e, n_logits));
    size_t n_adj = 0;
    int row = 0;
    *n_host = 0;
    for (int i = 0; i < e->n_plan; i++) {
        const seq *s = e->plan[i].s;
        if (!e->plan[i].logits) continue;
        atlas_sample_row *q = &e->smp_rows[row++];
        memset(q, 0, sizeof *q);
        if (atlas_engine_seq_on_host(s)) {
            q->flags = ATLAS_SAMPLE_SKIP;
            ++*n_host;
            continue;
        }
        const atlas_sampler_params *sp = &s->sp;
        size_t adj0 = n_adj;
        ATLAS_TRY(seq_adj(e, s, &n_adj));
        if (n_adj > INT32_MAX) return atlas_fail(ATLAS_ERR_RANGE, "engine: %zu adjustments", n_adj);
        *q = (atlas_sample_row){.seed = sp->seed, .counter = (uint64_t)s->n_tokens,
                                .temperature = sp->temperature, .top_p = sp->top_p,
                                .min_p = sp->min_p, .repetition_penalty = sp->repetition_penalty,
                                .presence_penalty = sp->presence_penalty,
                                .frequency_penalty = sp->frequency_penalty, .top_k = sp->top_k,
                                .adj0 = (int32_t)adj0, .n_adj = (int32_t)(n_adj - adj0),
                                .n_top = s->top_logprobs,
                                .flags = s->logprobs || s->top_logprobs ? ATLAS_SAMPLE_LOGPROB : 0};
    }
    *n_adj_out = (int)n_adj;
    return ATLAS_OK;
}

atlas_status atlas_engine_queued_rows(atlas_engine *e, const plan_entry *p, int n) {
    ATLAS_TRY(smp_fit(e, n));
    for (int i = 0, row = 0; i < n; i++) {
        if (!p[i].logits) continue;
        const seq *s = p[i].s;
        const atlas_sampler_params *sp = &s->sp;
        /* the counter is the position of the token drawn (sample_rows' n_tokens when nothing
         * is queued): the step's last position + 1 */
        atlas_sample_row *r = &e->smp_rows[row++];
        *r = (atlas_sample_row){.seed = sp->seed, .counter = (uint64_t)(p[i].pos0 + p[i].n),
                                .top_p = 1.0f, .repetition_penalty = 1.0f};
        if (s->plain_sampled) { /* else temperature 0: the argmax */
            r->temperature = sp->temperature;
            r->top_p = sp->top_p;
            r->min_p = sp->min_p;
            r->top_k = sp->top_k;
        }
    }
    return ATLAS_OK;
}
