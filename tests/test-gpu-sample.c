/* tests/test-gpu-sample.c — the CUDA sample op (kernels/sample.cu) against the float64
 * reference of sample_ref.c (test-sample-op checks that reference and the chi-square on the
 * CPU): on fixed rows (vocabularies of 1,000, 32,000, 128,256 and 151,936; peaked and flat),
 * every configuration of sref_case (temperature, top-k, top-p, min-p, the penalties,
 * logit_bias, all of them, greedy with penalties) draws 20,480 times, 256 rows a launch
 * with counters 0, 1, ...:
 * - no draw outside the reference's support (but an id that float32 rounding may put on
 *   either side of a threshold), and every id expected 20 times or more drawn;
 * - Pearson's chi-square against the reference, small bins pooled: p >= 1e-4;
 * - each draw's logprob and the top 5 ids and logprobs of the raw row within 1e-4 of the
 *   float64 log-softmax; greedy draws the reference's argmax every time;
 * - a launch mixing every configuration gives each row the id it gets alone (a row's draw
 *   depends on its seed and counter only).
 * It prints what a launch of 256 rows of 151,936 takes (a figure to read, not a check).
 * Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/driver.h"
#include "core/clock.h"
#include "harness.h"
#include "sample_ref.h"

enum { N_DRAWS = 20480, R = 256, MAX_V = 151936 };

static uint64_t rng = 0x853c49e6748fea9bull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static atlas_backend *gpu;
static CUdeviceptr pristine, work; /* [R, MAX_V] each: the row R times, and the op's copy */
static atlas_sample_row q[R];
static atlas_sample_adj adj[R * 8];
static atlas_sample_out out[R];

/* peaked: a spread of logits with six far above; flat: within [-0.5, 0.5]. */
static void make_row(float *row, int v, int peaked) {
    for (int i = 0; i < v; i++)
        row[i] = peaked ? (float)(2 * (urand() + urand() + urand() - 1.5)) : (float)(urand() - 0.5);
    for (int k = 0; peaked && k < 6; k++) row[(int)(urand() * v)] = 6.0f + (float)k * 0.7f;
}

/* The row on the device R times (pristine), from which every launch starts. */
static void upload(const float *row, int v) {
    float *h = malloc(sizeof(float) * (size_t)R * v);
    for (int r = 0; r < R; r++) memcpy(h + (size_t)r * v, row, sizeof(float) * v);
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, pristine, h, sizeof(float) * (size_t)R * v));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize));
    free(h);
}

/* One launch of n rows q[0 .. n) over a fresh copy of the row. */
static atlas_status launch(int v, int n, int n_adj) {
    atlas_status st = ATLAS_CU(cuMemcpyDtoD, work, pristine, sizeof(float) * (size_t)n * v);
    if (st == ATLAS_OK) st = ATLAS_CU(cuCtxSynchronize); /* the backend's stream waits for none */
    if (st == ATLAS_OK) st = gpu->ops->sample(gpu, out, (void *)(uintptr_t)work, n, v, q, adj, n_adj);
    return st;
}

typedef struct tally {
    long *obs;
    int outside, lp_bad, top_bad, greedy_bad;
    double lp_err;
} tally;

/* The logprobs of draw o against the float64 log-softmax lp and its top 5 ids. */
static void check_logprobs(const atlas_sample_out *o, const double *lp, const int32_t *top5,
                           tally *t) {
    double e = fabs(o->logprob - lp[o->id]);
    if (e > t->lp_err) t->lp_err = e;
    t->lp_bad += !(e <= 1e-4);
    int bad = o->n_top != 5;
    for (int i = 0; i < 5 && !bad; i++)
        bad = o->top_ids[i] != top5[i] || !(fabs(o->top_logprobs[i] - lp[top5[i]]) <= 1e-4);
    t->top_bad += bad;
}

/* 20,480 draws of case c on the uploaded row; the checks of the file's comment. */
static void run_case(const float *row, int v, const char *shape, int c, const double *lp,
                     const int32_t *top8, double *p, unsigned char *unsure, tally *t) {
    atlas_sample_row base;
    atlas_sample_adj one[8];
    sref_case(c, top8, &base, one);
    CHECK(sref_dist(row, v, &base, one, p, unsure) > 0);
    memset(t->obs, 0, sizeof(long) * (size_t)v);
    t->outside = t->lp_bad = t->top_bad = t->greedy_bad = 0;
    t->lp_err = 0;
    int argmax = 0;
    for (int i = 1; i < v; i++) argmax = p[i] > p[argmax] ? i : argmax;
    for (int done = 0; done < N_DRAWS; done += R) {
        for (int r = 0; r < R; r++) {
            q[r] = base;
            q[r].seed = 0x5eed + (uint64_t)c;
            q[r].counter = (uint64_t)(done + r);
            q[r].adj0 = r * base.n_adj;
            memcpy(adj + r * base.n_adj, one, sizeof *one * (size_t)base.n_adj);
        }
        atlas_status st = launch(v, R, R * base.n_adj);
        CHECK_OK(st);
        if (st != ATLAS_OK) return;
        for (int r = 0; r < R; r++) {
            const atlas_sample_out *o = &out[r];
            if (o->id < 0 || o->id >= v) {
                t->outside++;
                continue;
            }
            t->obs[o->id]++;
            t->outside += p[o->id] == 0 && !unsure[o->id];
            t->greedy_bad += base.temperature == 0 && o->id != argmax;
            check_logprobs(o, lp, top8, t);
        }
    }
    int missing = 0;
    for (int i = 0; i < v; i++) missing += p[i] * N_DRAWS >= 20 && t->obs[i] == 0;
    double stat;
    int dof;
    double pv = sref_chi2(t->obs, p, v, N_DRAWS, &stat, &dof);
    printf("%6d %-6s %-11s: chi2 %9.1f, %6d dof, p %.3g, logprob err %.2g\n", v, shape,
           sref_case_name[c], stat, dof, pv, t->lp_err);
    const char *nm = sref_case_name[c];
    CHECK_MSG(t->outside == 0, "%d %s %s: %d draws outside the support", v, shape, nm, t->outside);
    CHECK_MSG(missing == 0, "%d %s %s: %d ids expected >= 20 times never drawn", v, shape, nm,
              missing);
    CHECK_MSG(pv >= 1e-4, "%d %s %s: chi-square %.1f, %d dof, p %.3g", v, shape, nm, stat, dof, pv);
    CHECK_MSG(t->lp_bad == 0 && t->top_bad == 0, "%d %s %s: %d logprobs, %d top lists off "
              "(largest error %.3g)", v, shape, nm, t->lp_bad, t->top_bad, t->lp_err);
    CHECK_MSG(t->greedy_bad == 0, "%d %s %s: %d greedy draws not the argmax", v, shape, nm,
              t->greedy_bad);
}

/* Every configuration in one launch (32 counters each) against each alone. */
static void check_mixed(int v, const int32_t *top8) {
    enum { PER = R / SREF_CASES };
    int32_t mixed[R];
    int n_adj = 0;
    for (int r = 0; r < R; r++) {
        atlas_sample_adj one[8];
        sref_case(r % SREF_CASES, top8, &q[r], one);
        q[r].seed = 99, q[r].counter = (uint64_t)(r / SREF_CASES), q[r].adj0 = n_adj;
        memcpy(adj + n_adj, one, sizeof *one * (size_t)q[r].n_adj);
        n_adj += q[r].n_adj;
    }
    CHECK_OK(launch(v, R, n_adj));
    for (int r = 0; r < R; r++) mixed[r] = out[r].id;
    int differ = 0;
    for (int c = 0; c < SREF_CASES; c++) {
        atlas_sample_adj one[8];
        for (int k = 0; k < PER; k++) {
            sref_case(c, top8, &q[k], one);
            q[k].seed = 99, q[k].counter = (uint64_t)k, q[k].adj0 = k * q[k].n_adj;
            memcpy(adj + k * q[k].n_adj, one, sizeof *one * (size_t)q[k].n_adj);
        }
        CHECK_OK(launch(v, PER, PER * q[0].n_adj));
        for (int k = 0; k < PER; k++) differ += out[k].id != mixed[k * SREF_CASES + c];
    }
    CHECK_MSG(differ == 0, "vocab %d: %d rows drew otherwise beside other rows", v, differ);
}

/* Milliseconds the op takes for R rows of case c (the copy of the rows excluded). */
static double time_launch(int v, int c, const int32_t *top8) {
    atlas_sample_adj one[8];
    double ms = 0;
    for (int it = 0; it < 6; it++) {
        int n_adj = 0;
        for (int r = 0; r < R; r++) {
            sref_case(c, top8, &q[r], one);
            q[r].counter = (uint64_t)r, q[r].adj0 = n_adj;
            memcpy(adj + n_adj, one, sizeof *one * (size_t)q[r].n_adj);
            n_adj += q[r].n_adj;
        }
        CHECK_OK(ATLAS_CU(cuMemcpyDtoD, work, pristine, sizeof(float) * (size_t)R * v));
        CHECK_OK(ATLAS_CU(cuCtxSynchronize));
        double t0 = atlas_now_ms();
        CHECK_OK(gpu->ops->sample(gpu, out, (void *)(uintptr_t)work, R, v, q, adj, n_adj));
        if (it > 0) ms += (atlas_now_ms() - t0) / 5; /* the first one loads the module */
    }
    return ms;
}

int main(void) {
    double inv_freq[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = 64, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 64, .vocab_size = MAX_V, .n_layers = 1,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv_freq, .rope_attn_factor = 1,
                            .max_position = 4096};
    atlas_status st = atlas_backend_cuda_create(&g, NULL, &gpu);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    if (st != ATLAS_OK) return harness_finish();
    void *a = NULL, *b = NULL;
    CHECK_OK(gpu->ops->alloc(gpu, sizeof(float) * (size_t)R * MAX_V, &a));
    CHECK_OK(gpu->ops->alloc(gpu, sizeof(float) * (size_t)R * MAX_V, &b));
    pristine = CUDA_PTR(a), work = CUDA_PTR(b);
    float *row = malloc(sizeof(float) * MAX_V);
    double *p = malloc(sizeof(double) * MAX_V), *lp = malloc(sizeof(double) * MAX_V);
    unsigned char *unsure = malloc(MAX_V);
    tally t = {.obs = malloc(sizeof(long) * MAX_V)};
    static const int vocabs[] = {1000, 32000, 128256, 151936};
    for (int vi = 0; vi < 4 && a && b; vi++) {
        int v = vocabs[vi];
        for (int peaked = 1; peaked >= 0; peaked--) {
            make_row(row, v, peaked);
            upload(row, v);
            int32_t top8[8];
            sref_top8(row, v, top8);
            sref_log_softmax(row, v, lp);
            for (int c = 0; c < SREF_CASES; c++)
                run_case(row, v, peaked ? "peaked" : "flat", c, lp, top8, p, unsure, &t);
            if (peaked) check_mixed(v, top8);
            if (peaked && v == MAX_V) {
                printf("the op on %d rows of %d:", R, v);
                for (int c = 0; c < SREF_CASES; c++)
                    printf(" %s %.3f ms", sref_case_name[c], time_launch(v, c, top8));
                printf("\n");
            }
        }
    }
    free(row), free(p), free(lp), free(unsure), free(t.obs);
    if (a) gpu->ops->free(gpu, a);
    if (b) gpu->ops->free(gpu, b);
    CHECK_OK(gpu->ops->destroy(gpu));
    return harness_finish();
}
