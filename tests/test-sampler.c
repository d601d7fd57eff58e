/* tests/test-sampler.c — each sampler transform in isolation, distributions over many seeded
 * draws, reproducibility, penalties as HF (repetition) and OpenAI (presence, frequency)
 * define them, and logprobs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/sampler.h"
#include "harness.h"

#define N_DRAWS 100000

static atlas_sampler *make(atlas_sampler_params p) {
    atlas_sampler *s = NULL;
    CHECK_OK(atlas_sampler_create(&p, &s));
    return s;
}

/* Draws n tokens from fixed logits[vocab] (copied each time: sample overwrites them) and
 * returns the frequency of each id in freq[vocab]. */
static void draw(atlas_sampler *s, const float *logits, int vocab, int n, double *freq) {
    float *buf = malloc((size_t)vocab * sizeof *buf);
    memset(freq, 0, (size_t)vocab * sizeof *freq);
    for (int i = 0; i < n; i++) {
        memcpy(buf, logits, (size_t)vocab * sizeof *buf);
        int32_t id = -1;
        CHECK_OK(atlas_sampler_sample(s, buf, vocab, NULL, 0, &id));
        if (id < 0 || id >= vocab) {
            CHECK_MSG(0, "id %d", (int)id);
            break;
        }
        freq[id] += 1.0 / n;
    }
    free(buf);
}

/* Frequencies within 4.5 standard deviations of the expected probabilities. */
static void check_freq(const double *freq, const double *want, int vocab, int n) {
    for (int i = 0; i < vocab; i++) {
        double sd = sqrt(want[i] * (1 - want[i]) / n) + 1e-9;
        CHECK_MSG(fabs(freq[i] - want[i]) <= 4.5 * sd, "id %d: freq %.5f want %.5f", i, freq[i],
                  want[i]);
    }
}

static void test_params(void) {
    atlas_sampler_params p = atlas_sampler_default_params();
    CHECK(p.temperature == 1.0f && p.top_p == 1.0f && p.top_k == 0 && p.min_p == 0.0f);
    CHECK(p.repetition_penalty == 1.0f && p.presence_penalty == 0 && p.frequency_penalty == 0);
    atlas_sampler *s = NULL;
    p.temperature = -1;
    CHECK(atlas_sampler_create(&p, &s) == ATLAS_ERR_INVALID && !s);
    CHECK(strstr(atlas_last_error(), "temperature") != NULL);
    p = atlas_sampler_default_params();
    p.top_p = 0;
    CHECK(atlas_sampler_create(&p, &s) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "top_p") != NULL);
    p = atlas_sampler_default_params();
    p.repetition_penalty = 0;
    CHECK(atlas_sampler_create(&p, &s) == ATLAS_ERR_INVALID);
    p = atlas_sampler_default_params();
    p.min_p = 1.5f;
    CHECK(atlas_sampler_create(&p, &s) == ATLAS_ERR_INVALID);
    p = atlas_sampler_default_params();
    atlas_logit_bias neg = {-3, 1.0f};
    p.logit_bias = &neg;
    p.n_logit_bias = 1;
    CHECK(atlas_sampler_create(&p, &s) == ATLAS_ERR_RANGE);
    atlas_sampler_free(NULL);
}

static void test_greedy_and_bias(void) {
    atlas_sampler_params p = atlas_sampler_default_params();
    p.temperature = 0;
    atlas_sampler *s = make(p);
    float l[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
    int32_t id = -1;
    CHECK_OK(atlas_sampler_sample(s, l, 5, NULL, 0, &id));
    CHECK(id == 1); /* tie between 1 and 3: lowest id */
    atlas_sampler_free(s);

    atlas_logit_bias bias[2] = {{4, 0.2f}, {1, -100.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    s = make(p);
    bias[0].bias = 50; /* the sampler copied the list: this change must not matter */
    float l2[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
    CHECK_OK(atlas_sampler_sample(s, l2, 5, NULL, 0, &id));
    CHECK(id == 4); /* 2.9 + 0.2 beats 3.0; token 1 pushed down by 100 */
    CHECK(fabsf(l2[4] - 3.1f) < 1e-6f && fabsf(l2[1] + 97.0f) < 1e-5f);
    float l3[3] = {1, 2, 3};
    CHECK(atlas_sampler_sample(s, l3, 3, NULL, 0, &id) == ATLAS_ERR_RANGE); /* id 4 >= 3 */
    atlas_sampler_free(s);

    /* a NaN logit (NaN weights, an overflow) is an error naming it, greedy or drawn, where
     * greedy took token 0 and a draw the last token */
    for (int t = 0; t < 2; t++) {
        p = atlas_sampler_default_params();
        p.temperature = t ? 0.8f : 0.0f;
        s = make(p);
        for (int at = 0; at < 5; at += 4) {
            float ln[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
            ln[at] = NAN;
            CHECK(atlas_sampler_sample(s, ln, 5, NULL, 0, &id) == ATLAS_ERR_FORMAT);
            CHECK(strstr(atlas_last_error(), "NaN") != NULL);
        }
        atlas_sampler_free(s);
    }
}

static void test_penalties(void) {
    atlas_sampler_params p = atlas_sampler_default_params();
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    atlas_sampler *s = make(p);
    /* HF: a positive logit is divided, a negative one multiplied, once per distinct id. */
    float l[4] = {2.0f, -2.0f, 1.0f, 0.5f};
    int32_t hist[3] = {0, 1, 0};
    int32_t id = -1;
    CHECK_OK(atlas_sampler_sample(s, l, 4, hist, 3, &id));
    CHECK(l[0] == 1.0f && l[1] == -4.0f && l[2] == 1.0f && l[3] == 0.5f);
    CHECK(id == 0); /* tie 0 / 2 at 1.0: lowest id */
    int32_t bad[1] = {7};
    float l4[4] = {0};
    CHECK(atlas_sampler_sample(s, l4, 4, bad, 1, &id) == ATLAS_ERR_RANGE);
    atlas_sampler_free(s);

    /* OpenAI: logit -= presence * [count > 0] + frequency * count, generated tokens only. */
    p = atlas_sampler_default_params();
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    s = make(p);
    atlas_sampler_set_prompt_len(s, 2);
    float m[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int32_t h2[6] = {3, 3, /* prompt */ 0, 0, 0, 1};
    CHECK_OK(atlas_sampler_sample(s, m, 4, h2, 6, &id));
    CHECK(fabsf(m[0] - (1.0f - 0.5f - 0.75f)) < 1e-6f);
    CHECK(fabsf(m[1] - (1.0f - 0.5f - 0.25f)) < 1e-6f);
    CHECK(m[2] == 1.0f && m[3] == 1.0f); /* 3 is only in the prompt */
    CHECK(id == 2);
    atlas_sampler_free(s);

    /* Repetition counts the prompt too. */
    p = atlas_sampler_default_params();
    p.temperature = 0;
    p.repetition_penalty = 1.5f;
    s = make(p);
    atlas_sampler_set_prompt_len(s, 2);
    float r[4] = {3.0f, 3.0f, 3.0f, 3.0f};
    CHECK_OK(atlas_sampler_sample(s, r, 4, h2, 6, &id));
    CHECK(r[0] == 2.0f && r[1] == 2.0f && r[2] == 3.0f && r[3] == 2.0f);
    CHECK(id == 2);
    atlas_sampler_free(s);
}

static void softmax_ref(const float *l, int n, float t, double *p) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i] / t);
    for (int i = 0; i < n; i++) sum += p[i] = exp(l[i] / t - mx);
    for (int i = 0; i < n; i++) p[i] /= sum;
}

static void test_temperature(void) {
    float l[5] = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
    double freq[5], want[5];
    float temps[3] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        atlas_sampler_params p = atlas_sampler_default_params();
        p.temperature = temps[t];
        p.seed = 1234 + t;
        atlas_sampler *s = make(p);
        draw(s, l, 5, N_DRAWS, freq);
        softmax_ref(l, 5, temps[t], want);
        check_freq(freq, want, 5, N_DRAWS);
        atlas_sampler_free(s);
    }
}

static void test_top_k_top_p_min_p(void) {
    /* Probabilities 0.5, 0.3, 0.15, 0.05 (ids shuffled so order is not the id order). */
    float l[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    double freq[4];
    atlas_sampler_params p = atlas_sampler_default_params();
    p.seed = 7;
    p.top_k = 2;
    atlas_sampler *s = make(p);
    draw(s, l, 4, N_DRAWS, freq);
    double want_k[4] = {0, 0.5 / 0.8, 0, 0.3 / 0.8};
    check_freq(freq, want_k, 4, N_DRAWS);
    atlas_sampler_free(s);

    p.top_k = 0;
    p.top_p = 0.9f; /* 0.5 + 0.3 = 0.8 < 0.9: needs the 0.15 too */
    s = make(p);
    draw(s, l, 4, N_DRAWS, freq);
    double want_p[4] = {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95};
    check_freq(freq, want_p, 4, N_DRAWS);
    atlas_sampler_free(s);

    p.top_p = 1.0f;
    p.min_p = 0.35f; /* threshold 0.175: keeps 0.5 and 0.3 */
    s = make(p);
    draw(s, l, 4, N_DRAWS, freq);
    check_freq(freq, want_k, 4, N_DRAWS);
    atlas_sampler_free(s);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* A vocabulary the size of Qwen3's, so that top-p takes its bisection path; the nucleus is
 * computed here by a full sort. */
static void test_top_p_large(void) {
    const int V = 151936;
    float *l = malloc(V * sizeof *l), *sorted = malloc(V * sizeof *sorted);
    double *freq = malloc(V * sizeof *freq), *prob = malloc(V * sizeof *prob);
    uint64_t x = 99;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        l[i] = (float)((x >> 40) % 1000) / 1000.0f * 4.0f - 6.0f;
    }
    for (int i = 0; i < 12; i++) l[(i * 7919) % V] = 6.0f + 0.25f * i;
    softmax_ref(l, V, 1.0f, prob);
    for (int i = 0; i < V; i++) sorted[i] = (float)prob[i];
    qsort(sorted, V, sizeof *sorted, cmp_desc);
    const float top_p = 0.8f;
    double cum = 0;
    int m = 0;
    while (m < V && cum < top_p) cum += sorted[m++];
    float cut = sorted[m - 1];
    CHECK(m > 3 && m < 12);

    atlas_sampler_params p = atlas_sampler_default_params();
    p.top_p = top_p;
    p.seed = 42;
    atlas_sampler *s = make(p);
    const int n = 1500;
    draw(s, l, V, n, freq);
    double *want = calloc(V, sizeof *want);
    for (int i = 0; i < V; i++)
        if (prob[i] >= cut) want[i] = prob[i] / cum;
    check_freq(freq, want, V, n);
    atlas_sampler_free(s);
    free(want);
    free(l);
    free(sorted);
    free(freq);
    free(prob);
}

/* A flat distribution (as random weights give): the nucleus holds thousands of ids and
 * ends inside one probability bucket.  Every draw must fall in the nucleus computed here
 * by a full sort, and the draws must spread over it as its probabilities say. */
static int cmp_desc_idx(const void *a, const void *b, void *ctx) {
    const double *p = ctx;
    double x = p[*(const int *)a], y = p[*(const int *)b];
    return (x < y) - (x > y);
}

static void test_top_p_flat(void) {
    const int V = 50000;
    float *l = malloc(V * sizeof *l);
    double *prob = malloc(V * sizeof *prob), *freq = malloc(V * sizeof *freq);
    int *rank = malloc(V * sizeof *rank), *order = malloc(V * sizeof *order);
    uint64_t x = 5;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        l[i] = (float)((x >> 33) % 100000) / 100000.0f * 3.0f;
        order[i] = i;
    }
    softmax_ref(l, V, 1.0f, prob);
    qsort_r(order, V, sizeof *order, cmp_desc_idx, prob);
    const float top_p = 0.5f;
    double cum = 0;
    int m = 0;
    while (m < V && cum < top_p) cum += prob[order[m++]];
    for (int i = 0; i < V; i++) rank[order[i]] = i;
    double upper = 0; /* mass of the nucleus' first half, as a fraction of the nucleus */
    for (int i = 0; i < m / 2; i++) upper += prob[order[i]] / cum;
    CHECK(m > 5000);

    atlas_sampler_params p = atlas_sampler_default_params();
    p.top_p = top_p;
    p.seed = 77;
    atlas_sampler *s = make(p);
    const int n = 1000;
    draw(s, l, V, n, freq);
    double outside = 0, in_upper = 0;
    for (int i = 0; i < V; i++) {
        if (rank[i] >= m + 1) outside += freq[i]; /* + 1: float rounding at the edge */
        if (rank[i] < m / 2) in_upper += freq[i];
    }
    CHECK_MSG(outside == 0, "%.4f of the draws outside the nucleus", outside);
    double sd = sqrt(upper * (1 - upper) / n);
    CHECK_MSG(fabs(in_upper - upper) < 4.5 * sd, "upper half %.4f want %.4f", in_upper, upper);
    atlas_sampler_free(s);
    free(l);
    free(prob);
    free(freq);
    free(rank);
    free(order);
}

static void test_seed(void) {
    float l[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
    atlas_sampler_params p = atlas_sampler_default_params();
    p.seed = 2024;
    atlas_sampler *a = make(p), *b = make(p);
    p.seed = 2025;
    atlas_sampler *c = make(p);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        float la[6], lb[6], lc[6];
        memcpy(la, l, sizeof l);
        memcpy(lb, l, sizeof l);
        memcpy(lc, l, sizeof l);
        int32_t ia, ib, ic;
        CHECK_OK(atlas_sampler_sample(a, la, 6, NULL, 0, &ia));
        CHECK_OK(atlas_sampler_sample(b, lb, 6, NULL, 0, &ib));
        CHECK_OK(atlas_sampler_sample(c, lc, 6, NULL, 0, &ic));
        same_ab &= ia == ib;
        same_ac &= ia == ic;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    atlas_sampler_free(a);
    atlas_sampler_free(b);
    atlas_sampler_free(c);
}

static void test_logprobs(void) {
    float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f, 2.5f};
    double lse = 0;
    for (int i = 0; i < 6; i++) lse += exp(l[i]);
    lse = log(lse);
    float lp = 0, top_lp[4];
    int32_t top[4];
    int n = -1;
    CHECK_OK(atlas_sampler_logprobs(l, 6, 5, &lp, 4, top, top_lp, &n));
    CHECK(n == 4);
    CHECK(fabs(lp - (2.5 - lse)) < 1e-6);
    CHECK(top[0] == 1 && top[1] == 3 && top[2] == 5 && top[3] == 0);
    CHECK(fabs(top_lp[0] - (3.0 - lse)) < 1e-6 && fabs(top_lp[3] - (1.0 - lse)) < 1e-6);
    int32_t all[10];
    float all_lp[10];
    CHECK_OK(atlas_sampler_logprobs(l, 6, 0, NULL, 10, all, all_lp, &n));
    CHECK(n == 6 && all[5] == 2); /* capped at the vocabulary */
    CHECK(atlas_sampler_logprobs(l, 6, 6, &lp, 0, NULL, NULL, &n) == ATLAS_ERR_RANGE);
    CHECK_OK(atlas_sampler_logprobs(l, 6, 2, &lp, 0, NULL, NULL, &n));
    CHECK(n == 0 && fabs(lp - (-2.0 - lse)) < 1e-6);
}

/* The counter-based stream: Philox-4x32-10's known answers (Random123's kat_vectors), the
 * uniform it gives, draws at a counter that never touch the sampler's own stream, and reset. */
static void test_counter_stream(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int i = 0; i < 3; i++) {
        uint32_t c[4] = {kat[i][0], kat[i][1], kat[i][2], kat[i][3]}, k[2] = {kat[i][4], kat[i][5]};
        atlas_sampler_philox(c, k);
        CHECK_MSG(!memcmp(c, kat[i] + 6, sizeof c), "philox known answer %d", i);
    }
    uint32_t c[4] = {7, 0, 0, 0}, k[2] = {42, 0};
    atlas_sampler_philox(c, k);
    double u = atlas_sampler_uniform(42, 7);
    CHECK(u == (double)(((uint64_t)c[0] << 21) ^ (c[1] >> 11)) * 0x1.0p-53);
    double sum = 0;
    for (uint64_t n = 0; n < 4000; n++) {
        double x = atlas_sampler_uniform(9, n);
        CHECK(x >= 0 && x < 1);
        sum += x;
    }
    CHECK(fabs(sum / 4000 - 0.5) < 0.02);
    CHECK(atlas_sampler_uniform(9, 1) != atlas_sampler_uniform(9, 2) &&
          atlas_sampler_uniform(9, 1) != atlas_sampler_uniform(10, 1));
    float l[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, w[6];
    atlas_sampler_params p = atlas_sampler_default_params();
    p.seed = 5;
    atlas_sampler *a = make(p), *b = make(p);
    int32_t at[64], plain_a, plain_b, again;
    for (int i = 0; i < 64; i++) { /* at counter i: the id the uniform picks in id order */
        memcpy(w, l, sizeof l);
        CHECK_OK(atlas_sampler_sample_at(a, w, 6, NULL, 0, (uint64_t)i, &at[i]));
        double x = atlas_sampler_uniform(5, (uint64_t)i), z = 0, acc = 0;
        for (int j = 0; j < 6; j++) z += exp(l[j] - 0.6);
        int want = 5;
        for (int j = 0; j < 6; j++)
            if (x * z < (acc += exp(l[j] - 0.6))) {
                want = j;
                break;
            }
        CHECK_MSG(at[i] == want, "counter %d: %d, want %d", i, at[i], want);
    }
    memcpy(w, l, sizeof l);
    CHECK_OK(atlas_sampler_sample_at(a, w, 6, NULL, 0, 17, &again));
    CHECK(again == at[17]);
    memcpy(w, l, sizeof l);
    CHECK_OK(atlas_sampler_sample(a, w, 6, NULL, 0, &plain_a)); /* its own stream: untouched */
    memcpy(w, l, sizeof l);
    CHECK_OK(atlas_sampler_sample(b, w, 6, NULL, 0, &plain_b));
    CHECK(plain_a == plain_b);
    p.temperature = 0, p.seed = 6;
    CHECK_OK(atlas_sampler_reset(a, &p));
    memcpy(w, l, sizeof l);
    CHECK_OK(atlas_sampler_sample_at(a, w, 6, NULL, 0, 3, &again));
    CHECK(again == 5);
    p.top_p = 2;
    CHECK(atlas_sampler_reset(a, &p) == ATLAS_ERR_INVALID);
    memcpy(w, l, sizeof l);
    CHECK_OK(atlas_sampler_sample_at(a, w, 6, NULL, 0, 3, &again)); /* unchanged: greedy */
    CHECK(again == 5);
    atlas_sampler_free(a);
    atlas_sampler_free(b);
}

int main(void) {
    test_counter_stream();
    test_params();
    test_greedy_and_bias();
    test_penalties();
    test_temperature();
    test_top_k_top_p_min_p();
    test_top_p_large();
    test_top_p_flat();
    test_seed();
    test_logprobs();
    return harness_finish();
}
