/* backend/sampler.c — logit transforms, seeded draws and logprobs (see atlas/sampler.h).
 * The reference of the backends' sample op (backend.h): the CPU backend's op calls it, and
 * the CUDA kernel (kernels/sample.cu) is held to its distribution.
 *
 * Sorting the whole vocabulary (128k-152k ids) for every token would cost more than a
 * small model's forward, so nothing here sorts more than it must: top-k is a quickselect,
 * top-p sorts only the one probability bucket where the nucleus ends,
 * min-p and plain temperature sampling are linear scans. */
#include "atlas/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct cand {
    float v; /* logit, then probability */
    int32_t id;
} cand;

struct atlas_sampler {
    atlas_sampler_params p;
    atlas_logit_bias *bias; /* [p.n_logit_bias], owned */
    uint64_t rng[4];        /* xoshiro256** state */
    size_t prompt_len;
    int32_t *hist; /* scratch copy of the history, sorted to count repeats */
    size_t hist_cap;
    cand *c; /* scratch candidates [c_cap] */
    int c_cap;
};

/* ---- random numbers: splitmix64 seeds xoshiro256** (Blackman and Vigna) ---------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* ---- the counter-based stream: Philox-4x32-10 (Salmon et al., SC'11) ------------------- */

static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0], n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    c[1] = (uint32_t)p1;
    c[3] = (uint32_t)p0;
    c[0] = n0;
    c[2] = n2;
}

void atlas_sampler_philox(uint32_t ctr[4], const uint32_t key[2]) {
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r > 0) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
        philox_round(ctr, k);
    }
}

double atlas_sampler_uniform(uint64_t seed, uint64_t counter) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    atlas_sampler_philox(c, key);
    return (double)(((uint64_t)c[0] << 21) ^ (c[1] >> 11)) * 0x1.0p-53;
}

/* ---- create / free ---------------------------------------------------------------------- */

atlas_sampler_params atlas_sampler_default_params(void) {
    atlas_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

static atlas_status params_check(const atlas_sampler_params *p) {
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: temperature %g: must be >= 0",
                          (double)p->temperature);
    if (p->top_k < 0)
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: top_k %d: must be >= 0", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: top_p %g: must be in (0, 1]",
                          (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: min_p %g: must be in [0, 1]",
                          (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: repetition_penalty %g: must be > 0",
                          (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: presence/frequency penalty not finite");
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return atlas_fail(ATLAS_ERR_INVALID, "sampler: logit_bias: %d entries, array %p",
                          p->n_logit_bias, (const void *)p->logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].id < 0)
            return atlas_fail(ATLAS_ERR_RANGE, "sampler: logit_bias[%d]: id %d is negative", i,
                              (int)p->logit_bias[i].id);
        if (!isfinite(p->logit_bias[i].bias))
            return atlas_fail(ATLAS_ERR_INVALID, "sampler: logit_bias[%d]: bias not finite", i);
    }
    return ATLAS_OK;
}

/* Takes params (checked) into s: its bias copied, its generator seeded. */
static atlas_status set_params(atlas_sampler *s, const atlas_sampler_params *params) {
    atlas_logit_bias *bias = NULL;
    if (params->n_logit_bias > 0) {
        bias = malloc((size_t)params->n_logit_bias * sizeof *bias);
        if (!bias) return atlas_fail(ATLAS_ERR_NOMEM, "sampler: out of memory");
        memcpy(bias, params->logit_bias, (size_t)params->n_logit_bias * sizeof *bias);
    }
    free(s->bias);
    s->bias = bias;
    s->p = *params;
    s->p.logit_bias = s->bias;
    uint64_t x = params->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return ATLAS_OK;
}

atlas_status atlas_sampler_create(const atlas_sampler_params *params, atlas_sampler **out) {
    *out = NULL;
    ATLAS_TRY(params_check(params));
    atlas_sampler *s = calloc(1, sizeof *s);
    if (!s) return atlas_fail(ATLAS_ERR_NOMEM, "sampler: out of memory");
    atlas_status st = set_params(s, params);
    if (st != ATLAS_OK) {
        free(s);
        return st;
    }
    *out = s;
    return ATLAS_OK;
}

atlas_status atlas_sampler_reset(atlas_sampler *s, const atlas_sampler_params *params) {
    ATLAS_TRY(params_check(params));
    ATLAS_TRY(set_params(s, params));
    s->prompt_len = 0;
    return ATLAS_OK;
}

void atlas_sampler_free(atlas_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->hist);
    free(s->c);
    free(s);
}

void atlas_sampler_set_prompt_len(atlas_sampler *s, size_t n) { s->prompt_len = n; }

/* ---- penalties -------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Copies ids[n] into the scratch buffer and sorts it, so that repeats are runs. */
static atlas_status hist_sorted(atlas_sampler *s, const int32_t *ids, size_t n, int vocab) {
    if (n > s->hist_cap) {
        int32_t *h = realloc(s->hist, n * sizeof *h);
        if (!h) return atlas_fail(ATLAS_ERR_NOMEM, "sampler: history of %zu tokens", n);
        s->hist = h;
        s->hist_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return atlas_fail(ATLAS_ERR_RANGE, "sampler: history[%zu]: id %d outside [0, %d)",
                              i, (int)ids[i], vocab);
        s->hist[i] = ids[i];
    }
    if (n > 1) qsort(s->hist, n, sizeof *s->hist, cmp_i32); /* (none: no buffer yet) */
    return ATLAS_OK;
}

static atlas_status apply_penalties(atlas_sampler *s, float *logits, int vocab,
                                    const int32_t *history, size_t n_history) {
    float rep = s->p.repetition_penalty;
    if (rep != 1.0f && n_history > 0) {
        ATLAS_TRY(hist_sorted(s, history, n_history, vocab));
        for (size_t i = 0; i < n_history; i++) {
            if (i > 0 && s->hist[i] == s->hist[i - 1]) continue;
            float *l = &logits[s->hist[i]];
            *l = *l > 0 ? *l / rep : *l * rep;
        }
    }
    float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    size_t start = s->prompt_len < n_history ? s->prompt_len : n_history;
    size_t n = n_history - start;
    if ((pres != 0.0f || freq != 0.0f) && n > 0) {
        ATLAS_TRY(hist_sorted(s, history + start, n, vocab));
        for (size_t i = 0; i < n;) {
            size_t j = i;
            while (j < n && s->hist[j] == s->hist[i]) j++;
            logits[s->hist[i]] -= pres + freq * (float)(j - i);
            i = j;
        }
    }
    return ATLAS_OK;
}

/* ---- candidate selection ---------------------------------------------------------------- */

/* a ranks before b: larger value, then lower id (deterministic ties). */
static int cand_before(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return cand_before(x, y) ? -1 : cand_before(y, x) ? 1 : 0;
}

static void cand_swap(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Reorders c[n] so that its k best come first (in no particular order). */
static void select_top_k(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand_swap(&c[(lo + hi) / 2], &c[hi]);
        cand pivot = c[hi];
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (cand_before(&c[i], &pivot)) cand_swap(&c[i], &c[store++]);
        cand_swap(&c[store], &c[hi]);
        if (store == k - 1 || store == k) return;
        if (store < k) lo = store + 1;
        else hi = store - 1;
    }
}

/* Logits to probabilities in place; returns the largest probability. */
static float softmax(cand *c, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = c[i].v > mx ? c[i].v : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].v = expf(c[i].v - mx);
        sum += c[i].v;
    }
    float pmax = 0;
    for (int i = 0; i < n; i++) {
        c[i].v = (float)(c[i].v / sum);
        pmax = c[i].v > pmax ? c[i].v : pmax;
    }
    return pmax;
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* For 0 <= p <= pmax: about 64 * log2(pmax / p), from the float bits (exponent and the top
 * 6 mantissa bits), which order like the values do for non-negative floats. */
static int prob_bucket(float p, uint32_t top_bits, int n_buckets) {
    uint32_t d = (top_bits - float_bits(p)) >> 17;
    return d < (uint32_t)n_buckets ? (int)d : n_buckets - 1;
}

/* Keeps the smallest most-likely set with mass >= top_p; returns its size.  The kept
 * candidates end up first, in an order fixed by the logits (not necessarily sorted). */
static int apply_top_p(cand *c, int n, float top_p, float pmax) {
    int lo = 0, m = n; /* c[0 .. lo) are in the nucleus for certain; c[lo .. m) may be */
    double cum = 0;
    if (n > 1024) {
        /* One pass buckets the candidates by log2(p_max / p) in steps of 1/64 and sums
         * each bucket's mass.  The nucleus is a prefix of the sorted order: it holds every
         * bucket before the one where the running mass reaches top_p, and a part of that
         * one, which is the only one that needs sorting. */
        enum { N_BUCKETS = 2048 };
        double mass[N_BUCKETS] = {0};
        uint32_t top_bits = float_bits(pmax);
        for (int i = 0; i < n; i++) mass[prob_bucket(c[i].v, top_bits, N_BUCKETS)] += c[i].v;
        int last = 0;
        for (; last < N_BUCKETS - 1; last++) {
            if (cum + mass[last] >= top_p) break;
            cum += mass[last];
        }
        for (int i = 0; i < n; i++)
            if (prob_bucket(c[i].v, top_bits, N_BUCKETS) < last) cand_swap(&c[i], &c[lo++]);
        m = lo;
        for (int i = lo; i < n; i++)
            if (prob_bucket(c[i].v, top_bits, N_BUCKETS) == last) cand_swap(&c[i], &c[m++]);
    }
    qsort(c + lo, (size_t)(m - lo), sizeof *c, cmp_cand);
    for (int i = lo; i < m; i++) {
        cum += c[i].v;
        if (cum >= top_p) return i + 1;
    }
    return m;
}

static int apply_min_p(cand *c, int n, float min_p, float pmax) {
    float thr = min_p * pmax;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].v >= thr) c[m++] = c[i];
    return m; /* >= 1: the most likely candidate always passes */
}

/* The index of the largest logit, or -1 when one is NaN. */
static int32_t argmax(const float *logits, int vocab) {
    int32_t best = 0;
    bool nan = isnan(logits[0]);
    for (int i = 1; i < vocab; i++) {
        nan |= isnan(logits[i]);
        if (logits[i] > logits[best]) best = i;
    }
    return nan ? -1 : best;
}

/* A NaN logit says nothing to draw from (greedy would take token 0, often the end of the
 * text; a draw the last token): the checkpoint's weights hold a NaN or an infinity, or the
 * arithmetic overflowed. */
static atlas_status nan_logits(void) {
    return atlas_fail(ATLAS_ERR_FORMAT, "sampler: the model's logits hold a NaN (a NaN or "
                                        "infinite weight in the checkpoint, or an overflow)");
}

/* ---- sample ----------------------------------------------------------------------------- */

/* The draw of atlas_sampler_sample with the uniform u in [0, 1) (NAN: the sampler's own
 * stream, taken only when the row is not greedy). */
static atlas_status sample_u(atlas_sampler *s, float *logits, int vocab, const int32_t *history,
                             size_t n_history, double u, int32_t *out_id) {
    if (vocab <= 0) return atlas_fail(ATLAS_ERR_INVALID, "sampler: vocab %d", vocab);
    for (int i = 0; i < s->p.n_logit_bias; i++) {
        if (s->bias[i].id >= vocab)
            return atlas_fail(ATLAS_ERR_RANGE, "sampler: logit_bias[%d]: id %d outside [0, %d)",
                              i, (int)s->bias[i].id, vocab);
        logits[s->bias[i].id] += s->bias[i].bias;
    }
    ATLAS_TRY(apply_penalties(s, logits, vocab, history, n_history));
    if (s->p.temperature == 0.0f) {
        *out_id = argmax(logits, vocab);
        return *out_id < 0 ? nan_logits() : ATLAS_OK;
    }
    if (vocab > s->c_cap) {
        cand *c = realloc(s->c, (size_t)vocab * sizeof *c);
        if (!c) return atlas_fail(ATLAS_ERR_NOMEM, "sampler: %d candidates", vocab);
        s->c = c;
        s->c_cap = vocab;
    }
    cand *c = s->c;
    int n = vocab;
    float inv_t = 1.0f / s->p.temperature;
    bool nan = false;
    for (int i = 0; i < n; i++) {
        nan |= isnan(logits[i]);
        c[i] = (cand){logits[i] * inv_t, i};
    }
    if (nan) return nan_logits();
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top_k(c, n, s->p.top_k);
        n = s->p.top_k;
    }
    float pmax = softmax(c, n);
    if (s->p.top_p < 1.0f) n = apply_top_p(c, n, s->p.top_p, pmax);
    if (s->p.min_p > 0.0f) n = apply_min_p(c, n, s->p.min_p, pmax);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += c[i].v;
    double x = (isnan(u) ? rng_uniform(s->rng) : u) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].v;
        if (x < acc) {
            *out_id = c[i].id;
            return ATLAS_OK;
        }
    }
    *out_id = c[n - 1].id; /* rounding left x at the very top */
    return ATLAS_OK;
}

atlas_status atlas_sampler_sample(atlas_sampler *s, float *logits, int vocab,
                                  const int32_t *history, size_t n_history, int32_t *out_id) {
    return sample_u(s, logits, vocab, history, n_history, NAN, out_id);
}

atlas_status atlas_sampler_sample_at(atlas_sampler *s, float *logits, int vocab,
                                     const int32_t *history, size_t n_history, uint64_t counter,
                                     int32_t *out_id) {
    return sample_u(s, logits, vocab, history, n_history,
                    atlas_sampler_uniform(s->p.seed, counter), out_id);
}

/* ---- logprobs --------------------------------------------------------------------------- */

atlas_status atlas_sampler_logprobs(const float *logits, int vocab, int32_t id, float *logprob,
                                    int n_top, int32_t *top_ids, float *top_logprobs,
                                    int *n_written) {
    if (vocab <= 0) return atlas_fail(ATLAS_ERR_INVALID, "logprobs: vocab %d", vocab);
    if (logprob && (id < 0 || id >= vocab))
        return atlas_fail(ATLAS_ERR_RANGE, "logprobs: id %d outside [0, %d)", (int)id, vocab);
    float mx = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    if (logprob) *logprob = (float)(logits[id] - lse);
    int k = n_top < vocab ? n_top : vocab, have = 0;
    if (k < 0) k = 0;
    /* Insertion into a small sorted list: k is at most a few dozen. */
    for (int i = 0; i < vocab && k > 0; i++) {
        float v = logits[i];
        if (have == k && !(v > logits[top_ids[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && v > logits[top_ids[j - 1]]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int i = 0; i < have; i++) top_logprobs[i] = (float)(logits[top_ids[i]] - lse);
    if (n_written) *n_written = have;
    return ATLAS_OK;
}
