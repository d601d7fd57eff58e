/* tests/test-sample-op.c — the sample op (backend.h) on the CPU backend, and the float64
 * reference and chi-square test that test-gpu-sample holds the GPU to (sample_ref.c):
 * - the reference: the incomplete gamma against closed forms and chi-square's critical
 *   values, the pooling of small bins, a distribution worked by hand;
 * - the op against the sampler called directly with the real history (prompt and generated
 *   tokens with repeats) and logit_bias: the same ids and logprobs, row by row;
 * - its draws: 20,000 a configuration against the reference (support and chi-square);
 * - its argument checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/sampler.h"
#include "backend/backend.h"
#include "harness.h"
#include "sample_ref.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

static void test_reference(void) {
    for (double x = 0.1; x < 30; x *= 1.7) {
        CHECK(near(sref_gamma_q(1, x), exp(-x), 1e-12));
        CHECK(near(sref_gamma_q(0.5, x), erfc(sqrt(x)), 1e-12));
        double q5 = 0, t = 1; /* Q(5, x) = e^-x sum_{k<5} x^k / k! */
        for (int k = 0; k < 5; k++, t *= x / k) q5 += t;
        CHECK_MSG(near(sref_gamma_q(5, x), exp(-x) * q5, 1e-12), "Q(5, %g)", x);
    }
    /* chi-square's 5% critical values at 1, 10 and 100 degrees of freedom */
    CHECK(near(sref_gamma_q(0.5, 3.841458820694124 / 2), 0.05, 1e-9));
    CHECK(near(sref_gamma_q(5, 18.307038053275146 / 2), 0.05, 1e-9));
    CHECK(near(sref_gamma_q(50, 124.34211340400407 / 2), 0.05, 1e-9));
    /* bins 0.5, 0.3 alone (expecting 50 and 30), the rest pooled two by two (expecting 8),
     * the last one short, joining the pool before (12); 0 is no bin */
    double p[8] = {0.5, 0.3, 0.04, 0.04, 0.04, 0.04, 0.04, 0};
    long exact[8] = {50, 30, 4, 4, 4, 4, 4, 0}, off[8] = {40, 40, 4, 4, 4, 4, 4, 0};
    double stat;
    int dof;
    CHECK(sref_chi2(exact, p, 8, 100, &stat, &dof) == 1.0 && stat == 0 && dof == 3);
    double pv = sref_chi2(off, p, 8, 100, &stat, &dof), h = stat / 2;
    CHECK_MSG(near(stat, 100.0 / 50 + 100.0 / 30, 1e-12) && dof == 3 &&
                  near(pv, erfc(sqrt(h)) + 2 * sqrt(h / M_PI) * exp(-h), 1e-12),
              "stat %g dof %d p %g", stat, dof, pv);
    /* logits 2, 1, 0, -1: top-k 3 then top-p 0.7 keeps e^2 / (e^2 + e) and e / (e^2 + e) */
    float l[4] = {2, 1, 0, -1};
    double d[4];
    atlas_sample_row q = {.temperature = 1, .top_k = 3, .top_p = 0.7f, .repetition_penalty = 1};
    CHECK(sref_dist(l, 4, &q, NULL, d, NULL) == 2);
    CHECK(near(d[0], exp(2) / (exp(2) + exp(1)), 1e-15) && d[2] == 0 && d[3] == 0);
    atlas_sample_adj a = {1, 1, 2, 1.5f}; /* (1 + 1.5) / 1.25 - 0.5 - 2 * 0.25 = 1 */
    q = (atlas_sample_row){.temperature = 0.5f, .top_p = 1, .repetition_penalty = 1.25f,
                           .presence_penalty = 0.5f, .frequency_penalty = 0.25f, .n_adj = 1};
    CHECK(sref_dist(l, 4, &q, &a, d, NULL) == 4);
    CHECK(near(d[1] / d[0], exp(-2), 1e-12) && near(d[2] / d[0], exp(-4), 1e-12));
    q.temperature = 0;
    CHECK(sref_dist(l, 4, &q, &a, d, NULL) == 1 && d[0] == 1); /* ties: the lower id */
}

/* A row's real history: n_prompt prompt tokens, then generated ones, repeats in both. */
enum { V = 1000, HIST = 40, PROMPT = 25 };

/* The op's adjustments of a history (and biases), counted here apart from the engine. */
static int history_adj(const int32_t *h, int n, int prompt, const atlas_logit_bias *b, int nb,
                       atlas_sample_adj *adj) {
    static atlas_sample_adj by_id[V];
    memset(by_id, 0, sizeof by_id);
    for (int i = 0; i < n; i++) {
        by_id[h[i]].seen = 1;
        by_id[h[i]].count += i >= prompt;
    }
    for (int i = 0; i < nb; i++) by_id[b[i].id].bias += b[i].bias;
    int m = 0;
    for (int id = 0; id < V; id++)
        if (by_id[id].seen || by_id[id].bias != 0)
            adj[m] = by_id[id], adj[m++].id = id;
    return m;
}

static void test_against_sampler(atlas_backend *be) {
    enum { ROWS = 24 };
    float *logits = malloc(sizeof(float) * ROWS * V), *work = malloc(sizeof(float) * V);
    atlas_sample_row q[ROWS];
    atlas_sample_adj *adj = malloc(sizeof *adj * ROWS * (HIST + 4));
    atlas_sample_out out[ROWS];
    int32_t hist[ROWS][HIST];
    atlas_logit_bias bias[ROWS][3];
    int n_adj = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < V; i++) logits[(size_t)r * V + i] = (float)(4 * urand() - 2);
        for (int i = 0; i < HIST; i++) hist[r][i] = (int32_t)(urand() * 60); /* repeats */
        for (int i = 0; i < 3; i++) bias[r][i] = (atlas_logit_bias){(int32_t)(urand() * V),
                                                                    (float)(6 * urand() - 3)};
        q[r] = (atlas_sample_row){.seed = 77 + (uint64_t)r, .counter = 1000 + (uint64_t)r,
                                  .temperature = r % 6 == 5 ? 0 : 0.5f + (float)urand(),
                                  .top_k = r % 3 ? (int)(urand() * 300) : 0,
                                  .top_p = r % 4 ? 0.5f + 0.5f * (float)urand() : 1,
                                  .min_p = r % 5 ? 0.05f * (float)urand() : 0,
                                  .repetition_penalty = 1 + (float)urand(),
                                  .presence_penalty = (float)urand() - 0.5f,
                                  .frequency_penalty = (float)urand() - 0.5f,
                                  .adj0 = n_adj, .n_top = r % 7, .flags = r % 2};
        q[r].n_adj = history_adj(hist[r], HIST, PROMPT, bias[r], 3, adj + n_adj);
        n_adj += q[r].n_adj;
    }
    q[3].flags = ATLAS_SAMPLE_SKIP;
    out[3].id = -7;
    float *raw = malloc(sizeof(float) * ROWS * V);
    memcpy(raw, logits, sizeof(float) * ROWS * V);
    CHECK_OK(be->ops->sample(be, out, logits, ROWS, V, q, adj, n_adj));
    CHECK(out[3].id == -7); /* skipped: untouched */
    atlas_sampler *s = NULL;
    for (int r = 0; r < ROWS; r++) {
        if (r == 3) continue;
        const float *row = raw + (size_t)r * V;
        atlas_sampler_params sp = {.temperature = q[r].temperature, .top_k = q[r].top_k,
                                   .top_p = q[r].top_p, .min_p = q[r].min_p,
                                   .repetition_penalty = q[r].repetition_penalty,
                                   .presence_penalty = q[r].presence_penalty,
                                   .frequency_penalty = q[r].frequency_penalty,
                                   .seed = q[r].seed, .logit_bias = bias[r], .n_logit_bias = 3};
        atlas_sampler_free(s);
        s = NULL;
        CHECK_OK(atlas_sampler_create(&sp, &s));
        atlas_sampler_set_prompt_len(s, PROMPT);
        memcpy(work, row, sizeof(float) * V);
        int32_t id = -1, top_ids[ATLAS_SAMPLE_MAX_TOP];
        float lp, top_lps[ATLAS_SAMPLE_MAX_TOP];
        int n_top = 0;
        CHECK_OK(atlas_sampler_sample_at(s, work, V, hist[r], HIST, q[r].counter, &id));
        CHECK_OK(atlas_sampler_logprobs(row, V, id, &lp, q[r].n_top, top_ids, top_lps, &n_top));
        CHECK_MSG(out[r].id == id, "row %d: op %d, sampler %d", r, out[r].id, id);
        CHECK(out[r].logprob == ((q[r].flags & ATLAS_SAMPLE_LOGPROB) ? lp : 0.0f));
        CHECK(out[r].n_top == n_top && n_top == q[r].n_top);
        for (int i = 0; i < n_top; i++)
            CHECK(out[r].top_ids[i] == top_ids[i] && out[r].top_logprobs[i] == top_lps[i]);
    }
    atlas_sampler_free(s);
    free(raw);
    free(logits);
    free(work);
    free(adj);
}

/* 20,000 draws of each configuration on one row, 500 rows a call (counters 0, 1, ...):
 * every draw inside the reference's support (but ids at a threshold's float32 rounding),
 * and chi-square p >= 1e-4. */
static void test_distribution(atlas_backend *be) {
    enum { N = 20000, R = 500 };
    float *row = malloc(sizeof(float) * V), *batch = malloc(sizeof(float) * R * V);
    for (int i = 0; i < V; i++) row[i] = (float)(3 * urand() * urand());
    double *p = malloc(sizeof *p * V);
    unsigned char *unsure = malloc(V);
    long *obs = malloc(sizeof *obs * V);
    atlas_sample_row *q = malloc(sizeof *q * R);
    atlas_sample_adj *adj = malloc(sizeof *adj * R * 8), one[8];
    atlas_sample_out *out = malloc(sizeof *out * R);
    int32_t top[8];
    sref_top8(row, V, top);
    for (int c = 0; c < SREF_CASES; c++) {
        atlas_sample_row base;
        sref_case(c, top, &base, one);
        CHECK(sref_dist(row, V, &base, one, p, unsure) > 0);
        memset(obs, 0, sizeof *obs * V);
        int outside = 0;
        for (int done = 0; done < N; done += R) {
            for (int r = 0; r < R; r++) {
                q[r] = base;
                q[r].seed = 1234;
                q[r].counter = (uint64_t)(done + r);
                q[r].adj0 = r * base.n_adj;
                memcpy(adj + r * base.n_adj, one, sizeof *one * (size_t)base.n_adj);
                memcpy(batch + (size_t)r * V, row, sizeof(float) * V);
            }
            CHECK_OK(be->ops->sample(be, out, batch, R, V, q, adj, R * base.n_adj));
            for (int r = 0; r < R; r++) {
                obs[out[r].id]++;
                outside += p[out[r].id] == 0 && !unsure[out[r].id];
            }
        }
        double stat;
        int dof;
        double pv = sref_chi2(obs, p, V, N, &stat, &dof);
        fprintf(stderr, "cpu %-11s: chi2 %.1f, %d dof, p %.3g\n", sref_case_name[c], stat, dof,
                pv);
        CHECK_MSG(outside == 0, "%s: %d draws outside the support", sref_case_name[c], outside);
        CHECK_MSG(pv >= 1e-4, "%s: chi-square p %.3g", sref_case_name[c], pv);
        if (c == 0) { /* the test has the power to tell temperature 0.7 from 0.8 */
            base.temperature = 0.8f;
            CHECK(sref_dist(row, V, &base, one, p, NULL) > 0);
            pv = sref_chi2(obs, p, V, N, &stat, &dof);
            CHECK_MSG(pv < 1e-4, "temperature 0.7's draws pass for 0.8's: p %.3g", pv);
        }
    }
    free(row), free(batch), free(p), free(unsure), free(obs), free(q), free(adj), free(out);
}

static void test_checks(atlas_backend *be) {
    float l[4] = {0};
    atlas_sample_out o[2];
    atlas_sample_adj a[2] = {{2, 1, 1, 0}, {1, 1, 0, 0}};
    atlas_sample_row q = {.temperature = 1, .top_p = 1, .repetition_penalty = 1};
    atlas_sample_row bad = q;
    bad.top_p = 0;
    CHECK(be->ops->sample(be, o, l, 1, 4, &bad, NULL, 0) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "row 0: top_p"));
    bad = q, bad.n_top = ATLAS_SAMPLE_MAX_TOP + 1;
    CHECK(be->ops->sample(be, o, l, 1, 4, &bad, NULL, 0) == ATLAS_ERR_RANGE);
    bad = q, bad.n_adj = 2; /* ids not increasing */
    CHECK(be->ops->sample(be, o, l, 1, 4, &bad, a, 2) == ATLAS_ERR_RANGE);
    CHECK(strstr(atlas_last_error(), "adjustment 1"));
    a[1] = (atlas_sample_adj){3, 0, 1, 0}; /* a count without seen */
    CHECK(be->ops->sample(be, o, l, 1, 4, &bad, a, 2) == ATLAS_ERR_INVALID);
    a[1].seen = 1;
    atlas_sample_row two[2] = {bad, bad}; /* two rows on the same adjustments */
    float l2[8] = {0};
    CHECK(be->ops->sample(be, o, l2, 2, 4, two, a, 2) == ATLAS_ERR_INVALID);
    CHECK(strstr(atlas_last_error(), "overlap"));
    bad.adj0 = 1; /* past the end */
    CHECK(be->ops->sample(be, o, l, 1, 4, &bad, a, 2) == ATLAS_ERR_RANGE);
}

/* A NaN logit fails the op with the lowest such row named, however the rows are spread
 * over the threads. */
static void test_nan_rows(atlas_backend *be) {
    enum { ROWS = 9 };
    float *l = malloc(sizeof(float) * ROWS * V);
    atlas_sample_row q[ROWS];
    atlas_sample_out o[ROWS];
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < V; i++) l[(size_t)r * V + i] = (float)urand();
        q[r] = (atlas_sample_row){.seed = 5, .temperature = r % 2 ? 0.8f : 0.0f, .top_p = 0.9f,
                                  .repetition_penalty = 1};
    }
    l[(size_t)7 * V + 11] = NAN;
    l[(size_t)4 * V + 3] = NAN;
    CHECK(be->ops->sample(be, o, l, ROWS, V, q, NULL, 0) == ATLAS_ERR_FORMAT);
    CHECK_MSG(strstr(atlas_last_error(), "row 4:") && strstr(atlas_last_error(), "NaN"), "%s",
              atlas_last_error());
    free(l);
}

int main(void) {
    test_reference();
    atlas_backend_geom g = {.hidden = 8, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = V, .n_layers = 1, .rms_eps = 1e-5f};
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    g.rope_inv_freq = inv_freq;
    g.rope_attn_factor = 1;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
    if (!be) return harness_finish();
    test_against_sampler(be);
    test_distribution(be);
    test_checks(be);
    test_nan_rows(be);
    CHECK_OK(be->ops->destroy(be));
    /* the rows spread over three threads: the same draws as the sampler's, row by row */
    be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 3, &be));
    if (!be) return harness_finish();
    test_against_sampler(be);
    test_nan_rows(be);
    CHECK_OK(be->ops->destroy(be));
    return harness_finish();
}
