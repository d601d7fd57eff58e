/* test-gpu-moe.c — the CUDA backend's mixture-of-experts ops (moe_route, moe_experts;
 * kernels/moe.cu, src/backend/cuda/ops_moe.c) against the CPU backend's on the same weights
 * and inputs: E = 8 experts with k = 2 (Mixtral's routing, renormalised) and E = 128 with
 * k = 8 (Qwen3-MoE's, with norm_topk_prob off and on), at 1, 3, 16, 64 and 300 tokens, which
 * take both of the GPU's paths (a GEMV a slot up to 16 slots, grouped by expert above),
 * hidden and expert widths that are not multiples of the tiles. Every batch is a decode step
 * (a token a sequence), so up to 64 tokens the ops run inside a captured CUDA graph, which the
 * second step with new inputs replays. The expert ids must be equal and the weights within
 * 1e-5 (5e-5 at hidden 2880): each token's hidden state is drawn again until the router's
 * logits have clear margins among its k + 1 largest (else fp32 rounding in another order
 * could swap two near-equal experts and the test would say nothing about the kernels).
 * Also: every token
 * routed to the same two experts (many tiles of one expert), and passes of 100 tokens
 * (cuda_workspace.moe_chunk). After the experts, the residual add and the next norm as the
 * model's layer goes on (the GPU defers the add into that norm's kernel). And gpt-oss's
 * experts at its hidden 2880 (not a multiple of the grouped kernels' 128-row tiles) with
 * E = 32, k = 4: a router bias and top-k-then-softmax routing, gate_up and down biases, and
 * the clamped SwiGLU with a limit of 3 so that many gate and up values pass it on both
 * sides; the same with the experts in MXFP4 as gpt-oss publishes them (e2m1 codes, a
 * power-of-two scale a row's 32 columns, gate_up as one part an expert), which the GPU reads
 * packed. GPU outputs are poisoned with NaN first. Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/driver.h"
#include "core/dtype.h"
#include "core/error.h"
#include "harness.h"

static uint64_t rng = 0x51afd7ed558ccd1full;
static float urand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
}

enum { MAXD = 2880, MAXN = 300, MAXE = 128, MAXK = 8 };

static atlas_backend *cpu, *gpu;
static int D, F;              /* the configuration's hidden and expert widths */
static const uint16_t *rbias; /* the router's bias (bf16 [E]) while one is in use, or NULL */

/* A weight of `parts` bf16 tensors [rows, cols] each, loaded on both backends; host[] keeps
 * the values (bf16-rounded) of the first part's rows when keep is set (the router). */
typedef struct weight {
    atlas_weight *cpu, *gpu;
    uint16_t *data;
    float *scales;    /* MXFP4's, or NULL */
    atlas_wquant *q;  /* MXFP4's, one a part, or NULL */
} weight;

static weight weight_make(int parts, int64_t rows, int64_t cols, float scale) {
    weight w = {NULL, NULL, NULL, NULL, NULL};
    size_t per = (size_t)rows * cols;
    w.data = malloc(per * parts * 2);
    for (size_t i = 0; i < per * parts; i++) w.data[i] = atlas_f32_to_bf16(urand() * scale);
    atlas_weight_src *src = calloc((size_t)parts, sizeof *src);
    const atlas_weight_src **v = calloc((size_t)parts, sizeof *v);
    for (int p = 0; p < parts; p++) {
        src[p] = (atlas_weight_src){.name = "expert", .dtype = ATLAS_DTYPE_BF16, .n_dims = 2,
                                    .shape = {rows, cols}, .data = w.data + per * p,
                                    .nbytes = per * 2};
        v[p] = &src[p];
    }
    CHECK_OK(cpu->ops->weight_load(cpu, v, parts, &w.cpu));
    CHECK_OK(gpu->ops->weight_load(gpu, v, parts, &w.gpu));
    CHECK_OK(gpu->ops->weights_done(gpu));
    free(src);
    free(v);
    return w;
}

/* `parts` MXFP4 tensors [rows, cols] (random e2m1 codes, scales 2^-4 .. 2^-6 a row's 32
 * columns: products near the bf16 experts' at hidden 2880), loaded on both backends.
 * cols % 32 == 0. */
static weight weight_make_fp4(int parts, int64_t rows, int64_t cols) {
    weight w = {NULL, NULL, NULL, NULL, NULL};
    size_t per = (size_t)rows * cols / 2, groups = (size_t)rows * (cols / 32);
    uint8_t *codes = malloc(per * parts);
    w.data = (uint16_t *)codes;
    w.scales = malloc(groups * parts * sizeof(float));
    w.q = calloc((size_t)parts, sizeof *w.q);
    for (size_t i = 0; i < per * parts; i++) codes[i] = (uint8_t)((urand() + 1.0f) * 128.0f);
    for (size_t i = 0; i < groups * parts; i++)
        w.scales[i] = ldexpf(1.0f, -4 - (int)((urand() + 1.0f) * 1.5f));
    atlas_weight_src *src = calloc((size_t)parts, sizeof *src);
    const atlas_weight_src **v = calloc((size_t)parts, sizeof *v);
    for (int p = 0; p < parts; p++) {
        w.q[p] = (atlas_wquant){.format = ATLAS_WFMT_FP4_E2M1, .block_rows = 1,
                                .block_cols = 32, .scale_cols = (int)(cols / 32),
                                .scales = w.scales + groups * p};
        src[p] = (atlas_weight_src){.name = "expert.fp4", .dtype = ATLAS_DTYPE_U8, .n_dims = 2,
                                    .shape = {rows, cols}, .data = codes + per * p,
                                    .nbytes = per, .quant = &w.q[p]};
        v[p] = &src[p];
    }
    CHECK_OK(cpu->ops->weight_load(cpu, v, parts, &w.cpu));
    CHECK_OK(gpu->ops->weight_load(gpu, v, parts, &w.gpu));
    CHECK_OK(gpu->ops->weights_done(gpu));
    free(src);
    free(v);
    return w;
}

/* A vector [n] of offset + scale * U(-1, 1) (a norm's near 1, a bias), on both backends. */
static weight weight_make_1d(int n, float offset, float scale) {
    weight w = {NULL, NULL, malloc((size_t)n * 2), NULL, NULL};
    for (int i = 0; i < n; i++) w.data[i] = atlas_f32_to_bf16(offset + scale * urand());
    atlas_weight_src src = {.name = "norm", .dtype = ATLAS_DTYPE_BF16, .n_dims = 1,
                            .shape = {n}, .data = w.data, .nbytes = (size_t)n * 2};
    const atlas_weight_src *v[] = {&src};
    CHECK_OK(cpu->ops->weight_load(cpu, v, 1, &w.cpu));
    CHECK_OK(gpu->ops->weight_load(gpu, v, 1, &w.gpu));
    CHECK_OK(gpu->ops->weights_done(gpu));
    return w;
}

static void weight_free(weight *w) {
    cpu->ops->weight_free(cpu, w->cpu);
    gpu->ops->weight_free(gpu, w->gpu);
    free(w->data);
    free(w->scales);
    free(w->q);
}

/* n sequences of one token each: a decode step (graphed up to 64 tokens). */
static void begin(int n) {
    static int32_t tokens[MAXN], pos[MAXN], start[MAXN + 1], ctx[MAXN], table[MAXN];
    for (int i = 0; i < n; i++) tokens[i] = i % 16, pos[i] = 0, start[i] = i, ctx[i] = 1,
                                table[i] = i;
    start[n] = n;
    atlas_batch b = {.n_tokens = n, .tokens = tokens, .positions = pos, .n_seqs = n,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table, .max_blocks = 1};
    CHECK_OK(cpu->ops->begin_batch(cpu, &b, 16));
    CHECK_OK(gpu->ops->begin_batch(gpu, &b, 16));
}

static void to_gpu(void *dst, const void *src, size_t bytes) {
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, CUDA_PTR(dst), src, bytes));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize)); /* the backend's stream does not wait for stream 0 */
}

static void from_gpu(void *dst, const void *src, size_t bytes) {
    CHECK_OK(gpu->ops->sync(gpu));
    CHECK_OK(ATLAS_CU(cuMemcpyDtoH, dst, CUDA_PTR(src), bytes));
}

static double norm_err(const float *got, const float *want, size_t n) {
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= md)) md = d; /* NaN wins */
        if (fabs(want[i]) > ma) ma = fabs(want[i]);
    }
    return ma > 0 ? md / ma : md;
}

/* h[n, D]: each row drawn until the router's k + 1 largest logits (float64 over the bf16
 * weights) are at least 0.01 apart. */
static void draw_h(float *h, int n, const weight *router, int E, int k) {
    for (int t = 0; t < n; t++) {
        float *x = h + (size_t)t * D;
        for (int tries = 0; tries < 1000; tries++) {
            double l[MAXE], top[MAXK + 1];
            for (int c = 0; c < D; c++) x[c] = urand();
            for (int e = 0; e < E; e++) {
                l[e] = rbias ? atlas_bf16_to_f32(rbias[e]) : 0;
                for (int c = 0; c < D; c++)
                    l[e] += (double)atlas_bf16_to_f32(router->data[(size_t)e * D + c]) * x[c];
            }
            int m = k < E ? k + 1 : k, ok = 1;
            for (int j = 0; j < m; j++) { /* the m largest, by selection */
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (l[e] > -1e300 && (best < 0 || l[e] > l[best])) best = e;
                top[j] = l[best];
                l[best] = -1e301;
                if (j > 0 && top[j - 1] - top[j] < 0.01) ok = 0;
            }
            if (ok) break;
        }
    }
}

typedef struct bufs {
    float *h_cpu, *o_cpu, *w_cpu, *x_cpu, *n_cpu;
    int32_t *i_cpu;
    void *h_gpu, *o_gpu, *w_gpu, *i_gpu, *x_gpu, *n_gpu;
    weight norm; /* [D] */
} bufs;

/* The GPU's ids and weights against the CPU's, then its experts' output. */
static void compare(const char *what, const bufs *b, int n, int k, double tol) {
    static int32_t ids[MAXN * MAXK];
    static float wts[MAXN * MAXK], out[MAXN * MAXD];
    size_t slots = (size_t)n * k;
    from_gpu(ids, b->i_gpu, slots * 4);
    from_gpu(wts, b->w_gpu, slots * 4);
    from_gpu(out, b->o_gpu, (size_t)n * D * 4);
    int bad = 0;
    for (size_t s = 0; s < slots; s++) bad += ids[s] != b->i_cpu[s];
    CHECK_MSG(bad == 0, "%s: %d of %zu expert ids differ (first slot: gpu %d, cpu %d)", what,
              bad, slots, ids[0], b->i_cpu[0]);
    double ew = norm_err(wts, b->w_cpu, slots), eo = norm_err(out, b->o_cpu, (size_t)n * D);
    /* the logits are fp32 sums of d products in another order: their rounding grows with d */
    double wtol = D > 1024 ? 5e-5 : 1e-5;
    CHECK_MSG(ew <= wtol, "%s: routing weights: normalised error %.3g", what, ew);
    CHECK_MSG(eo <= tol, "%s: experts: normalised error %.3g > %.1g", what, eo, tol);
    printf("  %-44s weights %.2e  out %.2e\n", what, ew, eo);
}

static void poison(const bufs *b, int n, int k) {
    CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(b->o_gpu), 0x7fc00000u, (size_t)n * D));
    CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(b->w_gpu), 0x7fc00000u, (size_t)n * k));
    CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(b->i_gpu), 0xffffffffu, (size_t)n * k));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize));
}

/* After the experts, as the model's layer goes on: x += out (the add, which the GPU defers
 * into the next norm), then the next norm of x; its output compared. */
static void add_norm(const char *what, const bufs *b, int n, double tol) {
    static float got[MAXN * MAXD];
    CHECK_OK(cpu->ops->add(cpu, b->x_cpu, b->o_cpu, n, D));
    CHECK_OK(cpu->ops->rmsnorm(cpu, b->n_cpu, b->x_cpu, b->norm.cpu, n, D));
    CHECK_OK(gpu->ops->add(gpu, b->x_gpu, b->o_gpu, n, D));
    CHECK_OK(gpu->ops->rmsnorm(gpu, b->n_gpu, b->x_gpu, b->norm.gpu, n, D));
    from_gpu(got, b->n_gpu, (size_t)n * D * 4);
    double e = norm_err(got, b->n_cpu, (size_t)n * D);
    CHECK_MSG(e <= tol, "%s: the next norm after the residual add: normalised error %.3g", what,
              e);
}

/* A layer's weights: router, experts, and their biases (gpt-oss; NULL weights: none). */
typedef struct layer {
    weight router, gu, dn, rb, gub, db;
} layer;

static atlas_weight *side(const weight *w, int gpu_side) {
    return gpu_side ? w->gpu : w->cpu; /* NULL for a bias the layer does not have */
}

static void experts(const bufs *b, const layer *L, int n) {
    CHECK_OK(cpu->ops->moe_experts(cpu, b->o_cpu, b->h_cpu, L->gu.cpu, side(&L->gub, 0),
                                   L->dn.cpu, side(&L->db, 0), b->i_cpu, b->w_cpu, n));
    CHECK_OK(gpu->ops->moe_experts(gpu, b->o_gpu, b->h_gpu, L->gu.gpu, side(&L->gub, 1),
                                   L->dn.gpu, side(&L->db, 1), b->i_gpu, b->w_gpu, n));
}

/* One step of n tokens: route and experts on both backends, compared, then the residual add
 * and the next norm (all of it one graph up to 64 tokens). */
static void step(const bufs *b, const layer *L, int n, int E, int k, const char *tag) {
    char what[96];
    begin(n);
    draw_h(b->h_cpu, n, &L->router, E, k);
    to_gpu(b->h_gpu, b->h_cpu, (size_t)n * D * 4);
    poison(b, n, k);
    CHECK_OK(cpu->ops->moe_route(cpu, b->i_cpu, b->w_cpu, b->h_cpu, L->router.cpu,
                                 side(&L->rb, 0), n));
    CHECK_OK(gpu->ops->moe_route(gpu, b->i_gpu, b->w_gpu, b->h_gpu, L->router.gpu,
                                 side(&L->rb, 1), n));
    experts(b, L, n);
    for (size_t i = 0; i < (size_t)n * D; i++) b->x_cpu[i] = urand();
    to_gpu(b->x_gpu, b->x_cpu, (size_t)n * D * 4);
    snprintf(what, sizeof what, "d=%d E=%d k=%d n=%d %s", D, E, k, n, tag);
    /* a GEMV a slot reads h in fp32 (1e-4); grouped, h and the activations are bf16 */
    double tol = (size_t)n * k <= 16 ? 1e-4 : 1.5e-2;
    add_norm(what, b, n, tol); /* queued behind the experts: one flush, one graph */
    compare(what, b, n, k, tol);
}

/* Every token to experts 3 and 5 (weights 0.75, 0.25): 300 rows of one expert, many tiles. */
static void skewed(const bufs *b, const layer *L, int n, int k) {
    begin(n);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            b->i_cpu[t * k + j] = j == 0 ? 5 : j == 1 ? 3 : 6 + j;
            b->w_cpu[t * k + j] = j == 0 ? 0.75f : j == 1 ? 0.25f : 0.01f;
        }
    for (size_t i = 0; i < (size_t)n * D; i++) b->h_cpu[i] = urand();
    to_gpu(b->h_gpu, b->h_cpu, (size_t)n * D * 4);
    poison(b, n, k);
    to_gpu(b->i_gpu, b->i_cpu, (size_t)n * k * 4);
    to_gpu(b->w_gpu, b->w_cpu, (size_t)n * k * 4);
    experts(b, L, n);
    compare("every token to experts 5 and 3", b, n, k, 1.5e-2);
}

/* oss: gpt-oss's experts (biases, top-k-then-softmax, the clamped SwiGLU); 2: in MXFP4. */
static void run_config(int d, int f, int E, int k, int norm, int oss) {
    double inv_freq[4] = {1, 1, 1, 1};
    D = d, F = f;
    atlas_backend_geom g = {.hidden = D, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = D, .vocab_size = 16, .n_layers = 1,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv_freq, .rope_attn_factor = 1,
                            .max_position = 16, .n_experts = E, .n_experts_used = k,
                            .expert_ffn = F, .moe_norm_topk = norm};
    if (oss) {
        g.moe_route = ATLAS_ROUTE_TOPK_SOFTMAX;
        g.glu = ATLAS_GLU_SWIGLU_CLAMP;
        g.glu_alpha = 1.702f, g.glu_limit = 3.0f;
    }
    CHECK_OK(atlas_backend_cuda_create(&g, NULL, &gpu));
    CHECK_OK(atlas_backend_cpu_create(&g, 4, &cpu));
    if (!gpu || !cpu) return;
    printf("d=%d f=%d E=%d k=%d norm_topk %d%s%s\n", D, F, E, k, norm,
           oss ? ", gpt-oss's biases, routing and clamped SwiGLU" : "",
           oss == 2 ? ", MXFP4 experts" : "");
    layer L = {.router = weight_make(1, E, D, 0.5f)};
    if (oss == 2) {
        L.gu = weight_make_fp4(E, 2 * F, D);
        L.dn = weight_make_fp4(E, D, F);
    } else {
        L.gu = weight_make(2 * E, F, D, 0.25f);
        L.dn = weight_make(E, D, F, 0.25f);
    }
    if (oss) {
        L.rb = weight_make_1d(E, 0, 1.0f);
        L.gub = weight_make_1d(E * 2 * F, 0, 1.0f);
        L.db = weight_make_1d(E * D, 0, 1.0f);
        rbias = L.rb.data;
    }
    bufs b;
    b.norm = weight_make_1d(D, 1.0f, 0.25f);
    size_t act = (size_t)MAXN * D * 4;
    CHECK_OK(cpu->ops->alloc(cpu, act, (void **)&b.x_cpu));
    CHECK_OK(cpu->ops->alloc(cpu, act, (void **)&b.n_cpu));
    CHECK_OK(gpu->ops->alloc(gpu, act, &b.x_gpu));
    CHECK_OK(gpu->ops->alloc(gpu, act, &b.n_gpu));
    CHECK_OK(cpu->ops->alloc(cpu, act, (void **)&b.h_cpu));
    CHECK_OK(cpu->ops->alloc(cpu, act, (void **)&b.o_cpu));
    CHECK_OK(cpu->ops->alloc(cpu, MAXN * MAXK * 4, (void **)&b.w_cpu));
    CHECK_OK(cpu->ops->alloc(cpu, MAXN * MAXK * 4, (void **)&b.i_cpu));
    CHECK_OK(gpu->ops->alloc(gpu, act, &b.h_gpu));
    CHECK_OK(gpu->ops->alloc(gpu, act, &b.o_gpu));
    CHECK_OK(gpu->ops->alloc(gpu, MAXN * MAXK * 4, &b.w_gpu));
    CHECK_OK(gpu->ops->alloc(gpu, MAXN * MAXK * 4, &b.i_gpu));
    cuda_backend *cb = (cuda_backend *)gpu;
    int ns[] = {1, 3, 16, 64, 300};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        uint64_t replays = cb->plan.graph_replays;
        step(&b, &L, ns[i], E, k, "");
        step(&b, &L, ns[i], E, k, "again");
        if (ns[i] <= CUDA_GRAPH_MAX_TOKENS)
            CHECK_MSG(cb->plan.graph_replays > replays, "n=%d: the second step replayed no "
                      "graph", ns[i]);
    }
    cb->ws.moe_chunk = 100;
    step(&b, &L, 300, E, k, "in passes of 100");
    cb->ws.moe_chunk = 0;
    if (E == 8 || oss) skewed(&b, &L, 300, k);
    cpu->ops->free(cpu, b.h_cpu), cpu->ops->free(cpu, b.o_cpu);
    cpu->ops->free(cpu, b.w_cpu), cpu->ops->free(cpu, b.i_cpu);
    gpu->ops->free(gpu, b.h_gpu), gpu->ops->free(gpu, b.o_gpu);
    gpu->ops->free(gpu, b.w_gpu), gpu->ops->free(gpu, b.i_gpu);
    cpu->ops->free(cpu, b.x_cpu), cpu->ops->free(cpu, b.n_cpu);
    gpu->ops->free(gpu, b.x_gpu), gpu->ops->free(gpu, b.n_gpu);
    weight_free(&b.norm);
    weight_free(&L.router), weight_free(&L.gu), weight_free(&L.dn);
    if (oss) weight_free(&L.rb), weight_free(&L.gub), weight_free(&L.db);
    rbias = NULL;
    CHECK_OK(cpu->ops->destroy(cpu));
    CHECK_OK(gpu->ops->destroy(gpu));
    cpu = gpu = NULL;
}

int main(void) {
    double inv_freq[4] = {1, 1, 1, 1};
    atlas_backend_geom probe = {.hidden = 264, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                                .intermediate = 264, .vocab_size = 16, .n_layers = 1,
                                .rms_eps = 1e-5f, .rope_inv_freq = inv_freq,
                                .rope_attn_factor = 1, .max_position = 16};
    atlas_status st = atlas_backend_cuda_create(&probe, NULL, &gpu);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    if (st != ATLAS_OK) return harness_finish();
    CHECK_OK(gpu->ops->destroy(gpu));
    gpu = NULL;
    run_config(264, 136, 8, 2, 1, 0);   /* Mixtral's routing */
    run_config(264, 136, 128, 8, 0, 0); /* Qwen3-30B-A3B's, norm_topk_prob off */
    run_config(264, 136, 128, 8, 1, 0); /* and on */
    run_config(2880, 200, 32, 4, 0, 1); /* gpt-oss-20b's hidden, experts and routing */
    run_config(2880, 224, 32, 4, 0, 2); /* and its MXFP4 experts */
    return harness_finish();
}
