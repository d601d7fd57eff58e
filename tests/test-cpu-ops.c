/* test-cpu-ops.c — every op of the CPU backend against a naive double-precision reference on
 * random inputs (normalised error: max |got - want| / max |want|), with shapes that are not
 * multiples of the SIMD width, fused weights of mixed dtypes, several threads, a paged KV
 * cache with scrambled block tables, GQA and a sliding window; partial rotary with longrope's
 * two frequency sets chosen per sequence; and the thread pool itself. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/expand.h"
#include "core/threadpool.h"
#include "harness.h"

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* xorshift64: uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)urand();
}

static double norm_err(const float *got, const double *want, size_t n) {
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (!(d <= md)) md = d; /* NaN wins */
        if (fabs(want[i]) > ma) ma = fabs(want[i]);
    }
    return ma > 0 ? md / ma : md;
}

#define CHECK_ERR(what, got, want, n)                                                        \
    do {                                                                                     \
        double e_ = norm_err(got, want, n);                                                  \
        CHECK_MSG(e_ <= 2e-6, "%s: normalised error %.3g", what, e_);                        \
    } while (0)

/* A tensor of random values stored as dtype; *vals receives the exact values it holds. */
typedef struct tensor {
    atlas_weight_src src;
    void *data;
    double *vals;
} tensor;

static void tensor_make(tensor *t, const char *name, atlas_dtype dt, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (cols ? cols : 1);
    t->data = malloc(n * atlas_dtype_size(dt));
    t->vals = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        float f = (float)urand();
        if (dt == ATLAS_DTYPE_F32) {
            ((float *)t->data)[i] = f;
            t->vals[i] = f;
        } else if (dt == ATLAS_DTYPE_BF16) {
            uint16_t h = atlas_f32_to_bf16(f);
            ((uint16_t *)t->data)[i] = h;
            t->vals[i] = atlas_bf16_to_f32(h);
        } else { /* F16: multiples of 1/1024 in [-1, 1) are exact (and normal) in half */
            float v = floorf(f * 1024.0f) / 1024.0f;
            uint16_t h = 0;
            uint32_t u;
            memcpy(&u, &v, 4);
            if (v != 0.0f) { /* rebias the exponent, keep the top 10 mantissa bits */
                int e = (int)((u >> 23) & 0xff) - 127 + 15;
                h = (uint16_t)(((u >> 16) & 0x8000u) | ((uint32_t)e << 10) | ((u >> 13) & 0x3ffu));
            }
            ((uint16_t *)t->data)[i] = h;
            t->vals[i] = v;
        }
    }
    t->src = (atlas_weight_src){.name = name, .dtype = dt, .n_dims = cols ? 2 : 1,
                                .shape = {rows, cols}, .data = t->data,
                                .nbytes = n * atlas_dtype_size(dt)};
}

static void tensor_free(tensor *t) {
    free(t->data);
    free(t->vals);
}

static const double inv_freq[5] = {1.0, 0.25, 0.0625, 0.015625, 0.00390625};

static atlas_backend_geom geom(int window) {
    return (atlas_backend_geom){.hidden = 20, .n_heads = 4, .n_kv_heads = 2, .head_dim = 10,
                                .intermediate = 36, .vocab_size = 50, .n_layers = 2,
                                .rms_eps = 1e-5f, .rope_inv_freq = inv_freq,
                                .rope_attn_factor = 1.0, .max_position = 64,
                                .sliding_window = window};
}

/* Fused weight of three dtypes, with a fused bias, times n tokens. */
static void test_matmul(atlas_backend *be, int n, int64_t k, int64_t r0, int64_t r1, int64_t r2) {
    tensor p[3], b[3];
    atlas_dtype dts[3] = {ATLAS_DTYPE_BF16, ATLAS_DTYPE_F16, ATLAS_DTYPE_F32};
    int64_t rows[3] = {r0, r1, r2}, m = r0 + r1 + r2;
    const atlas_weight_src *pv[3], *bv[3];
    for (int i = 0; i < 3; i++) {
        tensor_make(&p[i], "w", dts[i], rows[i], k);
        tensor_make(&b[i], "b", dts[2 - i], rows[i], 0);
        pv[i] = &p[i].src;
        bv[i] = &b[i].src;
    }
    atlas_weight *w = NULL, *bias = NULL;
    CHECK_OK(be->ops->weight_load(be, pv, 3, &w));
    CHECK_OK(be->ops->weight_load(be, bv, 3, &bias));
    float *x = malloc(sizeof(float) * n * k), *out = malloc(sizeof(float) * n * m);
    double *want = malloc(sizeof(double) * n * m);
    fill(x, (size_t)n * k);
    for (int t = 0; t < n; t++)
        for (int64_t r = 0, part = 0, base = 0; r < m; r++) {
            while (r - base >= rows[part]) base += rows[part++];
            double s = b[part].vals[r - base];
            for (int64_t i = 0; i < k; i++) s += p[part].vals[(r - base) * k + i] * x[t * k + i];
            want[t * m + r] = s;
        }
    if (w && bias) {
        CHECK_OK(be->ops->matmul(be, out, x, w, bias, n));
        char what[64];
        snprintf(what, sizeof what, "matmul n=%d k=%lld m=%lld", n, (long long)k, (long long)m);
        CHECK_ERR(what, out, want, (size_t)n * m);
    }
    be->ops->weight_free(be, w);
    be->ops->weight_free(be, bias);
    for (int i = 0; i < 3; i++) {
        tensor_free(&p[i]);
        tensor_free(&b[i]);
    }
    free(x);
    free(out);
    free(want);
}

/* A weight of two bf16 parts (r0 + r1 rows of k) times n tokens through each bf16 kernel this
 * CPU runs (the AVX2 / plain tiles, AVX-512, NEON): against a double sum and the plain path
 * (cpu_matmul_plain) within 2e-6, and each token alone bitwise its row of the batch. The
 * kernel with bf16 activations (DOT) is held to the double sum over x rounded to bf16. */
static void test_bf16_kernels(atlas_backend *be, int n, int64_t k, int64_t r0, int64_t r1) {
    tensor p[2];
    int64_t rows[2] = {r0, r1}, m = r0 + r1;
    const atlas_weight_src *pv[2];
    for (int i = 0; i < 2; i++) {
        tensor_make(&p[i], "w", ATLAS_DTYPE_BF16, rows[i], k);
        pv[i] = &p[i].src;
    }
    atlas_weight *w = NULL;
    CHECK_OK(be->ops->weight_load(be, pv, 2, &w));
    float *x = malloc(sizeof(float) * n * k), *out = malloc(sizeof(float) * n * m);
    float *plain = malloc(sizeof(float) * n * m), *one = malloc(sizeof(float) * m);
    double *want = malloc(sizeof(double) * n * m), *dplain = malloc(sizeof(double) * n * m);
    double *want_bx = malloc(sizeof(double) * n * m);
    fill(x, (size_t)n * k);
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < m; r++) {
            const double *wv = r < r0 ? p[0].vals + r * k : p[1].vals + (r - r0) * k;
            double s = 0, sb = 0;
            for (int64_t i = 0; i < k; i++) {
                s += wv[i] * x[t * k + i];
                sb += wv[i] * atlas_bf16_to_f32(atlas_f32_to_bf16(x[t * k + i]));
            }
            want[t * m + r] = s;
            want_bx[t * m + r] = sb;
        }
    cpu_backend *cb = (cpu_backend *)be;
    cpu_bf16_kind saved = cb->bf16;
    if (w) CHECK_OK(cpu_matmul_plain(be, plain, x, w, NULL, n));
    for (size_t i = 0; i < (size_t)n * m; i++) dplain[i] = plain[i];
    for (int kind = CPU_BF16_NONE; w && kind <= CPU_BF16_DOT; kind++) {
        if (kind != CPU_BF16_NONE && !cpu_bf16_kind_supported((cpu_bf16_kind)kind)) continue;
        cb->bf16 = (cpu_bf16_kind)kind;
        char what[96];
        snprintf(what, sizeof what, "bf16 kind %d, n=%d k=%lld m=%lld+%lld", kind, n,
                 (long long)k, (long long)r0, (long long)r1);
        CHECK_OK(be->ops->matmul(be, out, x, w, NULL, n));
        if (kind == CPU_BF16_DOT) {
            CHECK_ERR(what, out, want_bx, (size_t)n * m);
        } else {
            CHECK_ERR(what, out, want, (size_t)n * m);
            CHECK_ERR(what, out, dplain, (size_t)n * m);
        }
        for (int t = 0; t < n; t++) {
            CHECK_OK(be->ops->matmul(be, one, x + (size_t)t * k, w, NULL, 1));
            CHECK_MSG(!memcmp(one, out + (size_t)t * m, sizeof(float) * m),
                      "%s: token %d alone is not its row of the batch", what, t);
        }
        if (kind != CPU_BF16_DOT) { /* bf16 activations without DOT: x rounded, this kernel */
            cb->round_x = 1;
            CHECK_OK(be->ops->matmul(be, out, x, w, NULL, n));
            cb->round_x = 0;
            CHECK_ERR(what, out, want_bx, (size_t)n * m);
        }
    }
    cb->bf16 = saved;
    be->ops->weight_free(be, w);
    for (int i = 0; i < 2; i++) tensor_free(&p[i]);
    free(x), free(out), free(plain), free(one), free(want), free(dplain), free(want_bx);
}

static void ref_rmsnorm(double *out, const double *x, const double *w, int d, double eps) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) out[i] = w[i] * x[i] * r;
}

static void test_norms(atlas_backend *be) {
    enum { R = 5, D = 20 };
    tensor wt;
    tensor_make(&wt, "norm", ATLAS_DTYPE_BF16, D, 0);
    const atlas_weight_src *v = &wt.src;
    atlas_weight *w = NULL;
    CHECK_OK(be->ops->weight_load(be, &v, 1, &w));
    float x[R * D], delta[R * D], out[R * D];
    double want[R * D], xd[R * D], res[R * D];
    fill(x, R * D);
    fill(delta, R * D);
    for (int i = 0; i < R * D; i++) xd[i] = x[i];
    for (int r = 0; r < R; r++) ref_rmsnorm(want + r * D, xd + r * D, wt.vals, D, 1e-5);
    CHECK_OK(be->ops->rmsnorm(be, out, x, w, R, D));
    CHECK_ERR("rmsnorm", out, want, R * D);
    for (int i = 0; i < R * D; i++) res[i] = (double)x[i] + delta[i];
    for (int r = 0; r < R; r++) ref_rmsnorm(want + r * D, res + r * D, wt.vals, D, 1e-5);
    CHECK_OK(be->ops->add_rmsnorm(be, x, delta, out, w, R, D));
    CHECK_ERR("add_rmsnorm: out", out, want, R * D);
    CHECK_ERR("add_rmsnorm: residual", x, res, R * D);
    be->ops->weight_free(be, w);
    tensor_free(&wt);
}

static void test_elementwise(atlas_backend *be) {
    enum { N = 3, F = 36, D = 20, V = 50 };
    float gu[N * 2 * F], out[N * F];
    double want[N * F];
    fill(gu, N * 2 * F);
    for (int t = 0; t < N; t++)
        for (int i = 0; i < F; i++) {
            double g = gu[t * 2 * F + i];
            want[t * F + i] = g / (1 + exp(-g)) * gu[t * 2 * F + F + i];
        }
    CHECK_OK(be->ops->swiglu(be, out, gu, N, F));
    CHECK_ERR("swiglu", out, want, N * F);

    /* embed, gather_rows, download and argmax read the staged batch */
    tensor table;
    tensor_make(&table, "model.embed_tokens.weight", ATLAS_DTYPE_BF16, V, D);
    const atlas_weight_src *tv = &table.src;
    atlas_weight *tw = NULL;
    CHECK_OK(be->ops->weight_load(be, &tv, 1, &tw));
    int32_t tokens[N] = {7, 0, 49}, pos[N] = {0, 1, 2}, start[2] = {0, N}, ctx[1] = {N},
            table_ids[1] = {0}, rows[2] = {2, 0};
    atlas_batch b = {N, tokens, pos, 1, start, ctx, table_ids, 1, 2, rows, NULL, 0};
    CHECK_OK(be->ops->begin_batch(be, &b, 16));
    float x[N * D], g[2 * D], host[2 * D];
    double wx[N * D], wg[2 * D];
    CHECK_OK(be->ops->embed(be, x, tw));
    for (int t = 0; t < N; t++)
        for (int i = 0; i < D; i++) wx[t * D + i] = table.vals[tokens[t] * D + i];
    CHECK_ERR("embed", x, wx, N * D);
    CHECK_OK(be->ops->gather_rows(be, g, x, D));
    for (int i = 0; i < D; i++) {
        wg[i] = wx[2 * D + i];
        wg[D + i] = wx[i];
    }
    CHECK_ERR("gather_rows", g, wg, 2 * D);
    CHECK_OK(be->ops->download(be, host, g, 2 * D));
    CHECK_ERR("download", host, wg, 2 * D);
    int32_t ids[N];
    float logits[N * V];
    fill(logits, N * V);
    logits[0 * V + 17] = 5.0f;
    logits[1 * V + 0] = 5.0f;
    logits[2 * V + 49] = 5.0f;
    CHECK_OK(be->ops->argmax(be, ids, logits, N, V));
    CHECK(ids[0] == 17 && ids[1] == 0 && ids[2] == 49);
    CHECK_OK(be->ops->sync(be));
    be->ops->weight_free(be, tw);
    tensor_free(&table);
}

/* Paged attention: the test keeps every sequence's K/V history itself and compares. */
enum { H = 4, K = 2, HD = 10, QKV = (H + 2 * K) * HD, BS = 4, MAXB = 12, NSEQ = 3, NBLK = 40,
       MAXCTX = MAXB * BS };

typedef struct hist {
    double k[MAXCTX][K * HD], v[MAXCTX][K * HD];
    int32_t table[MAXB];
    int ctx;
} hist;

static void ref_rope(double *x, int pos) {
    for (int i = 0; i < HD / 2; i++) {
        float angle = (float)inv_freq[i] * (float)pos;
        double c = cos(angle), s = sin(angle), x1 = x[i], x2 = x[i + HD / 2];
        x[i] = x1 * c - x2 * s;
        x[i + HD / 2] = x2 * c + x1 * s;
    }
}

/* sinks: a logit per head joining the denominator (NULL: none). */
static void ref_attention(double *out, const double *q, const hist *h, int pos, int window,
                          const double *sinks) {
    for (int hh = 0; hh < H; hh++) {
        int kv = hh / (H / K), start = window && pos - window + 1 > 0 ? pos - window + 1 : 0;
        double sc[MAXCTX], mx = sinks ? sinks[hh] : -INFINITY, sum = 0;
        for (int p = start; p <= pos; p++) {
            double s = 0;
            for (int i = 0; i < HD; i++) s += q[hh * HD + i] * h->k[p][kv * HD + i];
            sc[p] = s / sqrt(HD);
            if (sc[p] > mx) mx = sc[p];
        }
        if (sinks) sum = exp(sinks[hh] - mx);
        for (int p = start; p <= pos; p++) sum += (sc[p] = exp(sc[p] - mx));
        for (int i = 0; i < HD; i++) {
            double a = 0;
            for (int p = start; p <= pos; p++) a += sc[p] * h->v[p][kv * HD + i];
            out[hh * HD + i] = a / sum;
        }
    }
}

/* One batch: count[s] new tokens of each sequence after what it has cached. */
typedef struct attn_case {
    int window, with_qk_norm;
    atlas_weight *qn, *kn, *sinks;
    const double *qn_vals, *kn_vals, *sink_vals;
    int kv_bf16; /* the cache holds bf16 (1) or FP8 e4m3 (2): the reference's history is
                    rounded the same way */
} attn_case;

static double round_bf16(double x) { return atlas_bf16_to_f32(atlas_f32_to_bf16((float)x)); }

/* The FP8 cache's scales of the test's two layers (k, v of layer 0, then of layer 1, the one
 * the test runs): K's small enough that some keys saturate at 448, V's large enough that some
 * values are subnormal codes. */
static const float FP8_SCALES[4] = {0.5f, 0.25f, 0.002f, 1.9f};

/* e4m3(x / scale) * scale in float64: what an FP8 cache gives back for x (vLLM's rule). */
static double round_fp8(float x, float scale) {
    return (double)atlas_e4m3_to_f32(atlas_f32_to_e4m3(x / scale)) * (double)scale;
}

static void attention_step(atlas_backend *be, atlas_kv *kv, hist *hs, const int *count,
                           const attn_case *c) {
    int window = c->window, with_qk_norm = c->with_qk_norm;
    const double *qn_vals = c->qn_vals, *kn_vals = c->kn_vals;
    int n = 0;
    for (int s = 0; s < NSEQ; s++) n += count[s];
    int32_t tokens[64] = {0}, pos[64], start[NSEQ + 1], ctx[NSEQ], table[NSEQ * MAXB];
    float *qkv = malloc(sizeof(float) * n * QKV), *out = malloc(sizeof(float) * n * H * HD);
    double *want = malloc(sizeof(double) * n * H * HD);
    fill(qkv, (size_t)n * QKV);
    int t = 0;
    for (int s = 0; s < NSEQ; s++) {
        start[s] = t;
        for (int i = 0; i < count[s]; i++, t++) pos[t] = hs[s].ctx + i;
        ctx[s] = hs[s].ctx + count[s];
        memcpy(table + s * MAXB, hs[s].table, sizeof hs[s].table);
    }
    start[NSEQ] = n;
    atlas_batch b = {n, tokens, pos, NSEQ, start, ctx, table, MAXB, 0, NULL, NULL, 0};
    CHECK_OK(be->ops->begin_batch(be, &b, BS));
    /* the reference: q/k norm and rope of every row, the history, then attention */
    double *roped = malloc(sizeof(double) * n * QKV);
    for (int s = 0, t2 = 0; s < NSEQ; s++)
        for (int i = 0; i < count[s]; i++, t2++) {
            double *r = roped + t2 * QKV;
            for (int j = 0; j < QKV; j++) r[j] = qkv[t2 * QKV + j];
            for (int hh = 0; with_qk_norm && hh < H + K; hh++)
                ref_rmsnorm(r + hh * HD, r + hh * HD, hh < H ? qn_vals : kn_vals, HD, 1e-5);
            for (int hh = 0; hh < H + K; hh++) ref_rope(r + hh * HD, pos[t2]);
            memcpy(hs[s].k[pos[t2]], r + H * HD, sizeof hs[s].k[0]);
            memcpy(hs[s].v[pos[t2]], r + (H + K) * HD, sizeof hs[s].v[0]);
        }
    if (with_qk_norm) CHECK_OK(be->ops->qk_norm(be, qkv, c->qn, c->kn, n));
    CHECK_OK(be->ops->rope(be, qkv, n, 0));
    CHECK_ERR(with_qk_norm ? "qk_norm + rope" : "rope", qkv, roped, (size_t)n * QKV);
    /* a bf16 cache rounds the backend's fp32 k and v: the reference's history takes those
     * (rounding its own, a hair off them, would now and then round the other way) */
    for (int s = 0, t2 = 0; c->kv_bf16 && s < NSEQ; s++)
        for (int i = 0; i < count[s]; i++, t2++)
            for (int x = 0; x < K * HD; x++) {
                float kx = qkv[t2 * QKV + H * HD + x], vx = qkv[t2 * QKV + (H + K) * HD + x];
                hs[s].k[pos[t2]][x] = c->kv_bf16 == 2 ? round_fp8(kx, FP8_SCALES[2]) : round_bf16(kx);
                hs[s].v[pos[t2]][x] = c->kv_bf16 == 2 ? round_fp8(vx, FP8_SCALES[3]) : round_bf16(vx);
            }
    for (int s = 0, t2 = 0; s < NSEQ; s++)
        for (int i = 0; i < count[s]; i++, t2++)
            ref_attention(want + t2 * H * HD, roped + t2 * QKV, &hs[s], pos[t2], window,
                          c->sink_vals);
    CHECK_OK(be->ops->kv_store(be, qkv, kv, 1));
    CHECK_OK(be->ops->attention(be, out, qkv, kv, 1, c->sinks));
    free(roped);
    cpu_backend *cb = (cpu_backend *)be;
    char what[128];
    snprintf(what, sizeof what, "attention (kind %d, rows %d, window %d, qk_norm %d, sinks %d, "
             "%d tokens, kv %s)", (int)cb->attn, cb->attn_rows, window, with_qk_norm, !!c->sinks,
             n, c->kv_bf16 == 2 ? "fp8" : c->kv_bf16 ? "bf16" : "fp32");
    CHECK_ERR(what, out, want, (size_t)n * H * HD);
    /* and against the plain path */
    cpu_attn_kind kind = cb->attn;
    cb->attn = CPU_ATTN_PLAIN;
    float *plain = malloc(sizeof(float) * n * H * HD);
    CHECK_OK(be->ops->attention(be, plain, qkv, kv, 1, c->sinks));
    cb->attn = kind;
    for (size_t i = 0; i < (size_t)n * H * HD; i++) want[i] = plain[i];
    CHECK_ERR(what, out, want, (size_t)n * H * HD);
    free(plain);
    for (int s = 0; s < NSEQ; s++) hs[s].ctx = ctx[s];
    free(qkv);
    free(out);
    free(want);
}

/* The test runs layer 1: from_layer 2 means that layer does not slide. kind and rows: the
 * attention path and its tile rows (small ones: several query blocks a sequence). */
static void test_attention(int window, int from_layer, int with_qk_norm, int threads,
                           cpu_attn_kind kind, int rows, int with_sinks, int kv_bf16) {
    atlas_backend_geom g = geom(window);
    g.sliding_from_layer = from_layer;
    if (kv_bf16 == 2) g.kv_scales = FP8_SCALES;
    if (from_layer > 1) window = 0;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, threads, &be));
    if (!be) return;
    ((cpu_backend *)be)->attn = kind;
    ((cpu_backend *)be)->attn_rows = rows;
    be->kv_size = kv_bf16 == 2 ? 1 : kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    atlas_kv *kv = NULL;
    CHECK_OK(be->ops->kv_create(be, NBLK, BS, &kv));
    tensor qn, kn, sk;
    tensor_make(&qn, "q_norm", ATLAS_DTYPE_BF16, HD, 0);
    tensor_make(&kn, "k_norm", ATLAS_DTYPE_F32, HD, 0);
    tensor_make(&sk, "sinks", ATLAS_DTYPE_F32, H, 0);
    const atlas_weight_src *qv = &qn.src, *kvv = &kn.src, *sv = &sk.src;
    atlas_weight *qw = NULL, *kw = NULL, *sw = NULL;
    CHECK_OK(be->ops->weight_load(be, &qv, 1, &qw));
    CHECK_OK(be->ops->weight_load(be, &kvv, 1, &kw));
    CHECK_OK(be->ops->weight_load(be, &sv, 1, &sw));
    attn_case c = {window, with_qk_norm, qw, kw, with_sinks ? sw : NULL, qn.vals, kn.vals,
                   with_sinks ? sk.vals : NULL, kv_bf16};
    static hist hs[NSEQ];
    memset(hs, 0, sizeof hs);
    for (int s = 0; s < NSEQ; s++) /* blocks 39, 16, 33, 10, ...: scattered, all distinct */
        for (int i = 0; i < MAXB; i++) hs[s].table[i] = (int32_t)((NBLK - 1 + (s * MAXB + i) * 17) % NBLK);
    /* the last step is big enough (160 items) to be split over threads */
    int steps[5][NSEQ] = {{5, 3, 1}, {1, 4, 2}, {9, 1, 1}, {1, 1, 7}, {16, 12, 12}};
    for (int i = 0; i < 5 && kv && qw && kw && sw; i++)
        attention_step(be, kv, hs, steps[i], &c);
    be->ops->weight_free(be, qw);
    be->ops->weight_free(be, kw);
    be->ops->weight_free(be, sw);
    tensor_free(&qn);
    tensor_free(&kn);
    tensor_free(&sk);
    be->ops->kv_free(be, kv);
    be->ops->destroy(be);
}

/* Each attention path this CPU runs, the tiled ones with tiles of 64, 5 and 3 rows (query
 * blocks of one token and of several, key blocks cut anywhere), windows, qk norms and sinks. */
static void test_attention_paths(int threads) {
    for (int kind = CPU_ATTN_PLAIN; kind <= CPU_ATTN_NEON; kind++) {
        if (!cpu_attn_kind_supported((cpu_attn_kind)kind)) continue;
        static const int tile_rows[3] = {64, 5, 3}; /* the plain path has no tiles */
        for (int ri = 0; ri < (kind == CPU_ATTN_PLAIN ? 1 : 3); ri++) {
            int rows = tile_rows[ri];
            test_attention(0, 0, 0, threads, (cpu_attn_kind)kind, rows, 0, 0);
            test_attention(0, 0, 1, threads, (cpu_attn_kind)kind, rows, 1, 0);
            test_attention(3, 0, 0, threads, (cpu_attn_kind)kind, rows, 0, 0);
            test_attention(5, 1, 1, threads, (cpu_attn_kind)kind, rows, 1, 0);
            test_attention(3, 2, 0, threads, (cpu_attn_kind)kind, rows, 0, 0);
            /* a bf16 cache (the bf16 and int8 activation modes) */
            test_attention(0, 0, 1, threads, (cpu_attn_kind)kind, rows, 1, 1);
            test_attention(3, 0, 0, threads, (cpu_attn_kind)kind, rows, 0, 1);
            /* an FP8 cache (--kv-cache-dtype fp8), with the layer's scales */
            test_attention(0, 0, 1, threads, (cpu_attn_kind)kind, rows, 1, 2);
            test_attention(3, 0, 0, threads, (cpu_attn_kind)kind, rows, 0, 2);
        }
    }
}

static void test_weight_errors(atlas_backend *be) {
    tensor a, b;
    tensor_make(&a, "model.layers.0.self_attn.q_proj.weight", ATLAS_DTYPE_BF16, 4, 8);
    tensor_make(&b, "model.layers.0.self_attn.k_proj.weight", ATLAS_DTYPE_BF16, 4, 6);
    const atlas_weight_src *v[2] = {&a.src, &b.src};
    atlas_weight *w = NULL;
    CHECK(be->ops->weight_load(be, v, 2, &w) == ATLAS_ERR_FORMAT && !w);
    CHECK(strstr(atlas_last_error(), "k_proj") != NULL);
    b.src.dtype = ATLAS_DTYPE_I32;
    b.src.shape[1] = 8;
    CHECK(be->ops->weight_load(be, v, 2, &w) == ATLAS_ERR_UNSUPPORTED && !w);
    CHECK(strstr(atlas_last_error(), "k_proj.weight: dtype I32") != NULL);
    /* a source whose byte count is not its shape's */
    b.src.dtype = ATLAS_DTYPE_BF16;
    b.src.nbytes -= 2; /* 4 x 8 elements of bf16 would be 64 */
    CHECK(be->ops->weight_load(be, v, 2, &w) == ATLAS_ERR_INVALID && !w);
    CHECK(strstr(atlas_last_error(), "k_proj.weight: 46 bytes") != NULL);
    tensor_free(&a);
    tensor_free(&b);
}

/* ---- the thread pool --------------------------------------------------------------------- */

typedef struct pool_job {
    atomic_int *hits;
    atomic_int calls;
    int max_thread;
} pool_job;

static void pool_fn(void *ctx, int64_t begin, int64_t end, int thread) {
    pool_job *j = ctx;
    atomic_fetch_add(&j->calls, 1);
    if (thread > j->max_thread) j->max_thread = thread; /* racy max is fine: checked < size */
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&j->hits[i], 1);
}

static void test_threadpool(void) {
    for (int threads = 1; threads <= 4; threads++) {
        atlas_threadpool *p = NULL;
        CHECK_OK(atlas_threadpool_create(threads, &p));
        if (!p) continue;
        CHECK(atlas_threadpool_size(p) == threads);
        static atomic_int hits[1000];
        for (int round = 0; round < 50; round++) {
            int n = (round * 37) % 1000, chunk = round % 7;
            for (int i = 0; i < n; i++) atomic_store(&hits[i], 0);
            pool_job j = {hits, 0, 0};
            atlas_threadpool_for(p, n, chunk, pool_fn, &j);
            int bad = 0;
            for (int i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
            CHECK_MSG(bad == 0, "threads %d n %d: %d items not run exactly once", threads, n, bad);
            CHECK(j.max_thread < threads && atomic_load(&j.calls) <= threads);
        }
        atlas_threadpool_free(p);
    }
    atlas_threadpool_free(NULL);
}

/* The fused ops of backend.h on a backend without kernels of its own (the CPU: expand.c):
 * bit for bit the plain ops the model called before it said its fusions (add_rmsnorm; norm,
 * matmul, rope, kv_store; matmul then swiglu). */
static void test_fused_expand(atlas_backend *be) {
    enum { N = 3, D = 20, QKV = 80, F = 36, BS = 4, MAXB = 2 };
    tensor tn, tq, tb, tgu, to;
    tensor_make(&tn, "norm", ATLAS_DTYPE_BF16, D, 0);
    tensor_make(&tq, "wqkv", ATLAS_DTYPE_BF16, QKV, D);
    tensor_make(&tb, "bqkv", ATLAS_DTYPE_F32, QKV, 0);
    tensor_make(&tgu, "wgu", ATLAS_DTYPE_BF16, 2 * F, D);
    tensor_make(&to, "wo", ATLAS_DTYPE_BF16, D, 40);
    tensor *ts[] = {&tn, &tq, &tb, &tgu, &to};
    atlas_weight *w[5] = {NULL};
    for (int i = 0; i < 5; i++) {
        const atlas_weight_src *v = &ts[i]->src;
        CHECK_OK(be->ops->weight_load(be, &v, 1, &w[i]));
    }
    atlas_kv *kv[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) CHECK_OK(be->ops->kv_create(be, 4, BS, &kv[i]));
    int32_t tokens[N] = {0}, pos[N] = {0, 1, 2}, start[2] = {0, N}, ctx[1] = {N};
    int32_t table[MAXB] = {1, 3};
    atlas_batch b = {N, tokens, pos, 1, start, ctx, table, MAXB, 0, NULL, NULL, 0};
    CHECK_OK(be->ops->begin_batch(be, &b, BS));
    /* [0]: the plain ops, [1]: the fused ones */
    float x[2][N * D], h[2][N * D], o[2][N * D], qkv[2][N * QKV];
    float gu[2][N * 2 * F], act[2][N * F], a2[2][N * 40];
    fill(x[0], N * D);
    memcpy(x[1], x[0], sizeof x[0]);
    /* norm + qkv (+ bias) + rope + kv_store, then attention of each cache */
    CHECK_OK(be->ops->rmsnorm(be, h[0], x[0], w[0], N, D));
    CHECK_OK(be->ops->matmul(be, qkv[0], h[0], w[1], w[2], N));
    CHECK_OK(be->ops->rope(be, qkv[0], N, 0));
    CHECK_OK(be->ops->kv_store(be, qkv[0], kv[0], 0));
    CHECK_OK(be->ops->attention(be, a2[0], qkv[0], kv[0], 0, NULL));
    atlas_epilogue rk = {.kind = ATLAS_EPI_ROPE_KV, .kv = kv[1], .layer = 0};
    CHECK_OK(atlas_op_rmsnorm_matmul(be, qkv[1], h[1], x[1], w[0], w[1], w[2], N, D, 0, &rk));
    CHECK_OK(be->ops->attention(be, a2[1], qkv[1], kv[1], 0, NULL));
    CHECK(!memcmp(h[0], h[1], sizeof h[0]) && !memcmp(qkv[0], qkv[1], sizeof qkv[0]) &&
          !memcmp(a2[0], a2[1], sizeof a2[0]));
    /* rope_kv_store alone (qk_norm between the matmul and it) into layer 1 */
    CHECK_OK(be->ops->rope(be, qkv[0], N, 0));
    CHECK_OK(be->ops->kv_store(be, qkv[0], kv[0], 1));
    CHECK_OK(atlas_op_rope_kv_store(be, qkv[1], kv[1], 1, N));
    CHECK_OK(be->ops->attention(be, a2[0], qkv[0], kv[0], 1, NULL));
    CHECK_OK(be->ops->attention(be, a2[1], qkv[1], kv[1], 1, NULL));
    CHECK(!memcmp(qkv[0], qkv[1], sizeof qkv[0]) && !memcmp(a2[0], a2[1], sizeof a2[0]));
    /* matmul + add_rmsnorm against matmul_residual then the norm (add, then rmsnorm) */
    CHECK_OK(be->ops->matmul(be, o[0], a2[0], w[4], NULL, N));
    CHECK_OK(be->ops->add_rmsnorm(be, x[0], o[0], h[0], w[0], N, D));
    CHECK_OK(atlas_op_matmul_residual(be, x[1], o[1], a2[1], w[4], N, D));
    CHECK_OK(be->ops->rmsnorm(be, h[1], x[1], w[0], N, D));
    CHECK(!memcmp(o[0], o[1], sizeof o[0]) && !memcmp(x[0], x[1], sizeof x[0]) &&
          !memcmp(h[0], h[1], sizeof h[0]));
    /* norm + gate_up + swiglu over all rows, then without the norm over rows 1.. of h */
    atlas_epilogue sw[2] = {{.kind = ATLAS_EPI_SWIGLU, .act = act[1], .f = F}};
    CHECK_OK(be->ops->rmsnorm(be, h[0], x[0], w[0], N, D));
    CHECK_OK(be->ops->matmul(be, gu[0], h[0], w[3], NULL, N));
    CHECK_OK(be->ops->swiglu(be, act[0], gu[0], N, F));
    CHECK_OK(atlas_op_rmsnorm_matmul(be, gu[1], h[1], x[1], w[0], w[3], NULL, N, D, 0, &sw[0]));
    CHECK(!memcmp(h[0], h[1], sizeof h[0]) && !memcmp(gu[0], gu[1], sizeof gu[0]) &&
          !memcmp(act[0], act[1], sizeof act[0]));
    CHECK_OK(be->ops->matmul(be, gu[0], h[0] + D, w[3], NULL, N - 1));
    CHECK_OK(be->ops->swiglu(be, act[0], gu[0], N - 1, F));
    CHECK_OK(atlas_op_rmsnorm_matmul(be, gu[1], h[1], NULL, NULL, w[3], NULL, N - 1, D, 1, &sw[0]));
    CHECK(!memcmp(gu[0], gu[1], sizeof(float) * (N - 1) * 2 * F) &&
          !memcmp(act[0], act[1], sizeof(float) * (N - 1) * F));
    /* a plain add, then a norm: add_rmsnorm's bits */
    CHECK_OK(be->ops->add_rmsnorm(be, x[0], o[0], h[0], w[0], N, D));
    CHECK_OK(be->ops->add(be, x[1], o[1], N, D));
    CHECK_OK(be->ops->rmsnorm(be, h[1], x[1], w[0], N, D));
    CHECK(!memcmp(x[0], x[1], sizeof x[0]) && !memcmp(h[0], h[1], sizeof h[0]));
    for (int i = 0; i < 2; i++) be->ops->kv_free(be, kv[i]);
    for (int i = 0; i < 5; i++) {
        be->ops->weight_free(be, w[i]);
        tensor_free(ts[i]);
    }
}

/* Partial rotary (the first 6 of 10 dims of a head) with longrope's two frequency sets and
 * an attention factor: a sequence whose length (seq_ctx, or seq_rope_len when larger) is
 * past 5 rotates with the long set, the others with the short one; dims 6..9 pass. */
static void test_rope_partial(void) {
    static const double shorts[3] = {1.0, 0.3, 0.05}, longs[3] = {0.5, 0.1, 0.01};
    atlas_backend_geom g = geom(0);
    g.rope_dim = 6, g.rope_inv_freq = shorts, g.rope_inv_freq_long = longs;
    g.rope_long_after = 5, g.rope_attn_factor = 1.2;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
    if (!be) return;
    enum { N = 5 };
    int32_t tokens[N] = {0}, pos[N] = {0, 1, 2, 4, 5}, start[3] = {0, 3, N}, ctx[2] = {3, 6};
    int32_t table[2 * MAXB] = {0}, rope_len[2] = {9, 0};
    for (int pass = 0; pass < 2; pass++) { /* without seq_rope_len, then with it */
        table[MAXB] = 1;
        atlas_batch b = {N, tokens, pos, 2, start, ctx, table, MAXB, 0, NULL,
                         pass ? rope_len : NULL, 0};
        CHECK_OK(be->ops->begin_batch(be, &b, BS));
        float *qkv = malloc(sizeof(float) * N * QKV);
        double *want = malloc(sizeof(double) * N * QKV);
        fill(qkv, (size_t)N * QKV);
        for (int t = 0; t < N; t++) {
            int seq = t >= 3, len = pass && rope_len[seq] > ctx[seq] ? rope_len[seq] : ctx[seq];
            const double *inv = len > 5 ? longs : shorts;
            for (int hh = 0; hh < H + K; hh++) {
                const float *x = qkv + t * QKV + hh * HD;
                double *w = want + t * QKV + hh * HD;
                for (int i = 0; i < HD; i++) w[i] = x[i];
                for (int i = 0; i < 3; i++) {
                    float angle = (float)inv[i] * (float)pos[t];
                    double c = (float)cos(angle) * 1.2f, sn = (float)sin(angle) * 1.2f;
                    w[i] = x[i] * c - x[i + 3] * sn;
                    w[i + 3] = x[i + 3] * c + x[i] * sn;
                }
            }
            for (int i = (H + K) * HD; i < QKV; i++) want[t * QKV + i] = qkv[t * QKV + i];
        }
        CHECK_OK(be->ops->rope(be, qkv, N, 0));
        CHECK_ERR(pass ? "partial longrope, seq_rope_len" : "partial longrope", qkv, want,
                  (size_t)N * QKV);
        free(qkv);
        free(want);
    }
    be->ops->destroy(be);
    g.rope_dim = 7; /* odd: refused */
    CHECK(atlas_backend_cpu_create(&g, 1, &be) == ATLAS_ERR_INVALID && !be);
}

/* Gemma 3's additions, on values small enough to check by hand: GeGLU (tanh), a norm weight
 * loaded as 1 + w, the scaled embedding, and a layer's own RoPE set and window. */
static void test_gemma_ops(void) {
    static const double set1[5] = {0.5, 0.125, 0.03125, 0.0078125, 0.001953125};
    static const int32_t window[2] = {0, 2};
    static const uint8_t sets[2] = {0, 1};
    atlas_backend_geom g = geom(0);
    g.glu = ATLAS_GLU_GELU_TANH, g.embed_scale = 2.5f, g.layer_window = window;
    g.n_rope_sets = 1, g.rope_sets[0] = (atlas_rope_set){set1, 1.0}, g.layer_rope_set = sets;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
    if (!be) return;
    /* gelu_tanh(1) * 3 and gelu_tanh(-2) * 0.5 (torch's gelu(approximate="tanh")) */
    float gu[4] = {1.0f, -2.0f, 3.0f, 0.5f}, act[2];
    CHECK_OK(be->ops->glu(be, act, gu, 1, 2));
    CHECK_MSG(fabs(act[0] - 2.5235759718248305) < 1e-6 && fabs(act[1] + 0.02270115295611247) < 1e-7,
              "geglu: %.9g %.9g", act[0], act[1]);
    /* rmsnorm([3, 4]) * (1 + [0.5, -0.25]) */
    float wv[2] = {0.5f, -0.25f}, x[2] = {3.0f, 4.0f}, out[2];
    atlas_weight_src ws = {.name = "norm", .dtype = ATLAS_DTYPE_F32, .n_dims = 1, .shape = {2},
                           .data = wv, .nbytes = sizeof wv, .offset = 1.0f};
    const atlas_weight_src *wp = &ws;
    atlas_weight *w = NULL;
    CHECK_OK(be->ops->weight_load(be, &wp, 1, &w));
    if (w) {
        CHECK_OK(be->ops->rmsnorm(be, out, x, w, 1, 2));
        double r = 1.0 / sqrt(12.5 + 1e-5);
        CHECK_MSG(fabs(out[0] - 3 * r * 1.5) < 1e-6 && fabs(out[1] - 4 * r * 0.75) < 1e-6,
                  "1 + w norm: %.9g %.9g", out[0], out[1]);
        be->ops->weight_free(be, w);
    }
    /* the layers' windows, and layer 1 rotating with set 1 */
    CHECK(atlas_geom_window(&be->geom, 0) == 0 && atlas_geom_window(&be->geom, 1) == 2);
    int32_t tok[1] = {0}, pos[1] = {3}, start[2] = {0, 1}, ctx[1] = {4}, table[MAXB] = {0};
    atlas_batch b = {1, tok, pos, 1, start, ctx, table, MAXB, 0, NULL, NULL, 0};
    CHECK_OK(be->ops->begin_batch(be, &b, BS));
    for (int layer = 0; layer < 2; layer++) {
        float *qkv = calloc(QKV, sizeof(float));
        qkv[0] = 1.0f; /* (x0, x5) = (1, 0) of head 0 turns by inv[0] * 3 */
        CHECK_OK(be->ops->rope(be, qkv, 1, layer));
        float angle = (float)(layer ? set1[0] : inv_freq[0]) * 3.0f;
        CHECK_MSG(fabs(qkv[0] - cosf(angle)) < 1e-6 && fabs(qkv[HD / 2] - sinf(angle)) < 1e-6,
                  "rope of layer %d: %g %g", layer, qkv[0], qkv[HD / 2]);
        free(qkv);
    }
    /* the embedding times 2.5 */
    float table_v[2 * 20];
    for (int i = 0; i < 40; i++) table_v[i] = (float)i / 8;
    atlas_weight_src es = {.name = "embed", .dtype = ATLAS_DTYPE_F32, .n_dims = 2,
                           .shape = {2, 20}, .data = table_v, .nbytes = sizeof table_v};
    const atlas_weight_src *ep = &es;
    atlas_weight *e = NULL;
    tok[0] = 1;
    CHECK_OK(be->ops->begin_batch(be, &b, BS));
    CHECK_OK(be->ops->weight_load(be, &ep, 1, &e));
    float row[20];
    if (e) {
        CHECK_OK(be->ops->embed(be, row, e));
        CHECK(row[0] == 2.5f * 20 / 8 && row[19] == 2.5f * 39 / 8);
        be->ops->weight_free(be, e);
    }
    be->ops->destroy(be);
    uint8_t bad[2] = {0, 2}; /* a set the geometry does not have */
    g.layer_rope_set = bad;
    CHECK(atlas_backend_cpu_create(&g, 1, &be) == ATLAS_ERR_INVALID && !be);
}

int main(void) {
    test_threadpool();
    for (int threads = 1; threads <= 3; threads += 2) {
        atlas_backend_geom g = geom(0);
        atlas_backend *be = NULL;
        CHECK_OK(atlas_backend_cpu_create(&g, threads, &be));
        if (!be) continue;
        CHECK(be->act_size == 4 && !strcmp(be->ops->name, "cpu"));
        test_matmul(be, 1, 20, 7, 5, 6);
        test_matmul(be, 2, 37, 3, 1, 2);
        test_matmul(be, 5, 36, 40, 17, 9);
        test_matmul(be, 9, 40, 130, 64, 106); /* 40: the widest input of this geometry */
        test_matmul(be, 1, 40, 130, 64, 106); /* one token: the decode path */
        test_matmul(be, 1, 40, 2000, 1100, 1500); /* ... big enough to be split over threads */
        test_matmul(be, 64, 40, 130, 64, 106);    /* prefill split over threads */
        test_matmul(be, 1, 33, 9, 3, 1);
        test_norms(be);
        test_elementwise(be);
        test_weight_errors(be);
        be->ops->destroy(be);
        test_attention_paths(threads);
    }
    for (int threads = 1; threads <= 3; threads += 2) { /* last: the random stream above */
        atlas_backend_geom g = geom(0);
        atlas_backend *be = NULL;
        CHECK_OK(atlas_backend_cpu_create(&g, threads, &be));
        if (!be) continue;
        test_fused_expand(be);
        be->ops->destroy(be);
    }
    atlas_backend_geom bad = geom(0);
    bad.n_kv_heads = 3;
    atlas_backend *be = NULL;
    CHECK(atlas_backend_cpu_create(&bad, 1, &be) == ATLAS_ERR_INVALID && !be);
    test_rope_partial(); /* after the checks that share the random stream */
    for (int threads = 1; threads <= 3; threads += 2) {
        atlas_backend_geom g = geom(0);
        g.intermediate = 1100; /* the scratch: rows up to 1,100 columns */
        atlas_backend *bb = NULL;
        CHECK_OK(atlas_backend_cpu_create(&g, threads, &bb));
        if (!bb) continue;
        /* k: under, at, over and far from the 32-column chunk; odd rows; tokens past 4x4
         * tiles and, at k 1,100, past one block of packed tokens (60) */
        test_bf16_kernels(bb, 1, 1, 1, 2);
        test_bf16_kernels(bb, 1, 31, 7, 9);
        test_bf16_kernels(bb, 3, 32, 8, 5);
        test_bf16_kernels(bb, 5, 33, 13, 4);
        test_bf16_kernels(bb, 9, 100, 37, 11);
        test_bf16_kernels(bb, 1, 1100, 301, 299);
        test_bf16_kernels(bb, 70, 1100, 21, 6);
        bb->ops->destroy(bb);
    }
    test_gemma_ops();
    return harness_finish();
}
