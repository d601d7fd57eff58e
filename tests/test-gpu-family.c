/* test-gpu-family.c — the CUDA ops that Phi-4 and Gemma 3 need, against the CPU backend (the
 * reference) on random inputs, by normalised error (max |gpu - cpu| / max |cpu|), GPU outputs
 * poisoned with NaN first so that an element left unwritten fails:
 * - Phi-4-mini's partial rotary (rope_dim 96 of head_dim 128) with longrope: the plain rope,
 *   rope + kv_store (decode: one kernel) and the qkv GEMV's rope epilogue, with sequences on
 *   the short and the long set in one batch and the long set chosen by seq_rope_len, then
 *   attention over the cache they wrote (the dimensions that pass through included);
 * - Gemma 3's per-layer RoPE sets (layer 0 local: a base, factor and sliding window of its
 *   own; layer 1 global) at head_dim 256: the same ops per layer, prefill attention on the
 *   kernels that take head_dim 256 (no tiled prefill kernel has it);
 * - GeGLU: the glu op, the gate_up epilogue in decode (the fused GEMVs, with and without the
 *   norm) and in prefill (cuBLASLt's bf16 chain where present);
 * - the scaled embedding; post-norms: x += rmsnorm(o) * w, whose add is deferred into the
 *   next norm although that norm writes the add's delta (h), in decode and prefill;
 * - gpt-oss (hidden 2880, head_dim 64, layer 0 sliding over 128 keys, layer 1 full): attention
 *   sinks on every attention kernel the backend picks — the tiled prefill, the cluster and the
 *   warp decode kernels (split and merged, and one split writing the output itself), the
 *   decode kernels on a short prefill, and with 16 query heads a kv head the split kernel —
 *   and its clamped SwiGLU (a limit of 1.5, which most inputs pass) wherever GeGLU runs above.
 * Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/expand.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/driver.h"
#include "harness.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float urand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
}

enum { F = 192, V = 500, LAYERS = 2, BS = 16, NBLK = 64, MAXB = 24, LONG_AFTER = 64 };

static atlas_backend *cpu, *gpu;
static int32_t tables[2][MAXB];
static int D = 256;             /* hidden: gpt-oss's 2880 for its part */
static int batch_blocks = MAXB; /* the batches' max_blocks (a short one: one attention split) */

typedef struct buf {
    float *cpu;
    void *gpu;
    size_t n;
} buf;

static buf buf_make(size_t n) {
    buf b = {NULL, NULL, n};
    CHECK_OK(cpu->ops->alloc(cpu, n * 4, (void **)&b.cpu));
    CHECK_OK(gpu->ops->alloc(gpu, n * 4, &b.gpu));
    return b;
}

static void buf_free(buf *b) {
    cpu->ops->free(cpu, b->cpu);
    gpu->ops->free(gpu, b->gpu);
}

static void buf_random(buf *b, float scale) {
    float *h = malloc(b->n * 4);
    for (size_t i = 0; i < b->n; i++) h[i] = urand() * scale;
    memcpy(b->cpu, h, b->n * 4);
    CHECK_OK(ATLAS_CU(cuMemcpyHtoD, CUDA_PTR(b->gpu), h, b->n * 4));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize)); /* the backend's stream does not wait for stream 0 */
    free(h);
}

static void buf_poison(buf *b) {
    CHECK_OK(ATLAS_CU(cuMemsetD32, CUDA_PTR(b->gpu), 0x7fc00000u, b->n));
    CHECK_OK(ATLAS_CU(cuCtxSynchronize));
}

static void buf_check(const char *what, buf *b, size_t n, double tol) {
    float *h = malloc(n * 4);
    CHECK_OK(gpu->ops->download(gpu, h, b->gpu, n));
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)h[i] - b->cpu[i]);
        if (!(d <= md)) md = d; /* NaN wins */
        if (fabs(b->cpu[i]) > ma) ma = fabs(b->cpu[i]);
    }
    double e = ma > 0 ? md / ma : md;
    CHECK_MSG(e <= tol, "%s: normalised error %.3g > %.1g", what, e, tol);
    printf("  %-52s %.2e\n", what, e);
    free(h);
}

static void *side_of(const buf *b, int side) { return side ? b->gpu : (void *)b->cpu; }

/* A bf16 weight [rows, cols] (cols 0: 1-D) of uniform values around offset, on both sides. */
typedef struct weight {
    atlas_weight *w[2]; /* cpu, gpu */
    void *data;         /* the source's bytes (and scales), kept while the weights are */
    float *scales;
} weight;

static weight weight_make(const char *name, int64_t rows, int64_t cols, float offset) {
    weight w = {{NULL, NULL}, NULL, NULL};
    size_t n = (size_t)rows * (cols ? cols : 1);
    uint16_t *data = malloc(n * 2);
    for (size_t i = 0; i < n; i++) data[i] = atlas_f32_to_bf16(urand() * 0.5f + offset);
    w.data = data;
    atlas_weight_src src = {.name = name, .dtype = ATLAS_DTYPE_BF16, .n_dims = cols ? 2 : 1,
                            .shape = {rows, cols}, .data = w.data, .nbytes = n * 2};
    const atlas_weight_src *v[1] = {&src};
    CHECK_OK(cpu->ops->weight_load(cpu, v, 1, &w.w[0]));
    CHECK_OK(gpu->ops->weight_load(gpu, v, 1, &w.w[1]));
    return w;
}

/* The same in FP8 (e4m3) with a float32 scale a row: the quantized GEMV's epilogue. */
static weight weight_fp8(const char *name, int64_t rows, int64_t cols) {
    weight w = {{NULL, NULL}, NULL, NULL};
    size_t n = (size_t)(rows * cols);
    uint8_t *codes = malloc(n);
    float *scales = malloc((size_t)rows * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        codes[i] = (uint8_t)((urand() + 1.0f) * 127.5f);
        if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1; /* not e4m3's NaN */
    }
    for (int64_t r = 0; r < rows; r++) scales[r] = 1e-3f * (1.5f + urand());
    atlas_wquant q = {.format = ATLAS_WFMT_FP8_E4M3, .block_rows = 1, .block_cols = (int)cols,
                      .scale_cols = 1, .scales = scales};
    atlas_weight_src src = {.name = name, .dtype = ATLAS_DTYPE_F8_E4M3, .n_dims = 2,
                            .shape = {rows, cols}, .data = codes, .nbytes = n, .quant = &q};
    const atlas_weight_src *v[1] = {&src};
    CHECK_OK(cpu->ops->weight_load(cpu, v, 1, &w.w[0]));
    CHECK_OK(gpu->ops->weight_load(gpu, v, 1, &w.w[1]));
    w.data = codes;
    w.scales = scales;
    return w;
}

static void weight_free(weight *w) {
    cpu->ops->weight_free(cpu, w->w[0]);
    gpu->ops->weight_free(gpu, w->w[1]);
    free(w->data);
    free(w->scales);
}

/* A batch of seq 0 (n0 tokens from start0) and seq 1 (n1 from start1; none when 0);
 * rope_len0 > 0: seq 0's seq_rope_len (longrope's length when larger than its context). */
static void begin(int n0, int n1, int start0, int start1, int rope_len0) {
    static int32_t tokens[512], pos[512], rows[2], start[3], ctx[2], rope_len[2];
    int n = n0 + n1;
    for (int t = 0; t < n; t++) {
        tokens[t] = (int32_t)((t * 7919u + 13u) % V);
        pos[t] = t < n0 ? start0 + t : start1 + t - n0;
    }
    start[0] = 0;
    start[1] = n0;
    start[2] = n;
    ctx[0] = start0 + n0;
    ctx[1] = start1 + n1;
    rope_len[0] = rope_len0;
    rope_len[1] = 0;
    rows[0] = n - 1;
    atlas_batch b = {.n_tokens = n, .tokens = tokens, .positions = pos, .n_seqs = n1 ? 2 : 1,
                     .seq_start = start, .seq_ctx = ctx, .block_table = &tables[0][0],
                     .max_blocks = batch_blocks, .n_logits = 1, .logit_rows = rows,
                     .seq_rope_len = rope_len0 > 0 ? rope_len : NULL};
    CHECK_OK(cpu->ops->begin_batch(cpu, &b, BS));
    CHECK_OK(gpu->ops->begin_batch(gpu, &b, BS));
}

/* The two backends of geometry g, with a KV cache each; false when either failed. */
static bool pair_make(const atlas_backend_geom *g, atlas_kv **kv) {
    CHECK_OK(atlas_backend_cuda_create(g, NULL, &gpu));
    CHECK_OK(atlas_backend_cpu_create(g, 4, &cpu));
    if (!gpu || !cpu) return false;
    CHECK_OK(cpu->ops->kv_create(cpu, NBLK, BS, &kv[0]));
    CHECK_OK(gpu->ops->kv_create(gpu, NBLK, BS, &kv[1]));
    return kv[0] && kv[1];
}

static void pair_free(atlas_kv **kv) {
    if (kv[0]) cpu->ops->kv_free(cpu, kv[0]);
    if (kv[1]) gpu->ops->kv_free(gpu, kv[1]);
    if (gpu) gpu->ops->destroy(gpu);
    if (cpu) cpu->ops->destroy(cpu);
    cpu = gpu = NULL;
}

/* Attention of the batch's n tokens at layer l over the cache, compared; sinks (NULL: none)
 * a weight [H] of logits. */
static void check_attention_sinks(atlas_kv **kv, buf *qkv, buf *att, int n, int l,
                                  const char *tag, const weight *sinks) {
    const atlas_backend_geom *g = &gpu->geom;
    char what[200];
    buf_poison(att);
    CHECK_OK(cpu->ops->attention(cpu, att->cpu, qkv->cpu, kv[0], l, sinks ? sinks->w[0] : NULL));
    CHECK_OK(gpu->ops->attention(gpu, att->gpu, qkv->gpu, kv[1], l, sinks ? sinks->w[1] : NULL));
    snprintf(what, sizeof what, "%s layer %d: attention", tag, l);
    /* the GPU's cache is bf16, the CPU's fp32 */
    buf_check(what, att, (size_t)n * g->n_heads * g->head_dim, 2e-2);
}

static void check_attention(atlas_kv **kv, buf *qkv, buf *att, int n, int l, const char *tag) {
    check_attention_sinks(kv, qkv, att, n, l, tag, NULL);
}

/* Every place RoPE is applied, per layer: the plain op on a prefill of both sequences (seq 0
 * of 40 tokens, seq 1 of 70: longrope's short and long sets in one batch), rope +
 * kv_store of a decode step of both (one kernel, in a graph, twice: a replay), and the qkv
 * GEMV's epilogue (rmsnorm_matmul) of one sequence, its long set chosen by seq_rope_len
 * (5000) and then its short one; attention over what each wrote. */
static void test_rope(atlas_kv **kv, const char *tag) {
    const atlas_backend_geom *g = &gpu->geom;
    int q = (g->n_heads + 2 * g->n_kv_heads) * g->head_dim;
    char what[96];
    buf qkv = buf_make((size_t)110 * q), att = buf_make((size_t)110 * g->n_heads * g->head_dim);
    buf x = buf_make(D), h = buf_make(D);
    weight norm = weight_make("norm", D, 0, 1.0f), wqkv = weight_make("wqkv", q, D, 0);
    for (int l = 0; l < LAYERS; l++) {
        begin(40, 70, 0, 0, 0);
        buf_random(&qkv, 2.0f);
        CHECK_OK(cpu->ops->rope(cpu, qkv.cpu, 110, l));
        CHECK_OK(gpu->ops->rope(gpu, qkv.gpu, 110, l));
        snprintf(what, sizeof what, "%s layer %d: rope, prefill 40 + 70", tag, l);
        buf_check(what, &qkv, (size_t)110 * q, 1e-5);
        CHECK_OK(cpu->ops->kv_store(cpu, qkv.cpu, kv[0], l));
        CHECK_OK(gpu->ops->kv_store(gpu, qkv.gpu, kv[1], l));
        check_attention(kv, &qkv, &att, 110, l, tag);
        for (int rep = 0; rep < 2; rep++) {
            begin(1, 1, 40 + rep, 70 + rep, 0);
            buf_random(&qkv, 2.0f);
            for (int i = 0; i < 2; i++)
                CHECK_OK(atlas_op_rope_kv_store(i ? gpu : cpu, side_of(&qkv, i), kv[i], l, 2));
            snprintf(what, sizeof what, "%s layer %d: rope_kv_store, decode step %d", tag, l, rep);
            buf_check(what, &qkv, (size_t)2 * q, 1e-5);
            check_attention(kv, &qkv, &att, 2, l, tag);
        }
        for (int rep = 0; rep < 2; rep++) { /* seq 0 at 42, 43: the long set, then short */
            begin(1, 0, 42 + rep, 0, rep ? 0 : 5000);
            buf_random(&x, 2.0f);
            buf_poison(&qkv);
            for (int i = 0; i < 2; i++) {
                atlas_backend *be = i ? gpu : cpu;
                atlas_epilogue epi = {.kind = ATLAS_EPI_ROPE_KV, .kv = kv[i], .layer = l};
                CHECK_OK(atlas_op_rmsnorm_matmul(be, side_of(&qkv, i), side_of(&h, i),
                                                 side_of(&x, i), norm.w[i], wqkv.w[i], NULL, 1,
                                                 D, 0, &epi));
            }
            snprintf(what, sizeof what, "%s layer %d: qkv GEMV + rope epilogue, %s set", tag, l,
                     rep ? "short" : "long");
            buf_check(what, &qkv, (size_t)q, 1e-4);
            check_attention(kv, &qkv, &att, 1, l, tag);
        }
    }
    buf *all[] = {&qkv, &att, &x, &h};
    for (int i = 0; i < 4; i++) buf_free(all[i]);
    weight_free(&norm);
    weight_free(&wqkv);
}

static const char *act_name(void) {
    return gpu->geom.glu == ATLAS_GLU_SWIGLU_CLAMP ? "clamped SwiGLU" : "GeGLU";
}

/* The gated activation: the glu op over 37 rows; the gate_up epilogue of one row (the fused
 * GEMVs: with the norm, then without, then of an FP8 gate_up) and of 150 rows (prefill), then
 * of the FP8 gate_up on the streaming one-row kernel, then of the FP8 gate_up over 150 rows
 * (from its bf16 scratch copy, the product in fp32), each followed by the down matmul that
 * reads its act, as the model runs them. */
static void test_glu(void) {
    char what[96];
    buf gu = buf_make((size_t)150 * 2 * F), act = buf_make((size_t)150 * F);
    buf x = buf_make((size_t)150 * D), h = buf_make((size_t)150 * D);
    buf out = buf_make((size_t)150 * D);
    weight norm = weight_make("norm", D, 0, 1.0f), wgu = weight_make("wgu", 2 * F, D, 0);
    weight wdn = weight_make("wdown", D, F, 0), wq = weight_fp8("wgu.fp8", 2 * F, D);
    begin(37, 0, 0, 0, 0);
    buf_random(&gu, 3.0f);
    buf_poison(&act);
    CHECK_OK(cpu->ops->glu(cpu, act.cpu, gu.cpu, 37, F));
    CHECK_OK(gpu->ops->glu(gpu, act.gpu, gu.gpu, 37, F));
    snprintf(what, sizeof what, "%s: glu op, 37 rows", act_name());
    buf_check(what, &act, (size_t)37 * F, 1e-5);
    int ns[] = {1, 1, 1, 150, 1, 150};
    for (int c = 0; c < 6; c++) {
        int n = ns[c], with_norm = c != 1;
        weight *w = c == 2 || c >= 4 ? &wq : &wgu;
        /* 4: the FP8 gate_up on the streaming kernel (norm and GLU in it) */
        ((cuda_backend *)gpu)->plan.qgemv_ng = c == 4 ? CUDA_QGEMV_S : 0;
        begin(n, 0, 0, 0, 0);
        buf_random(&x, 2.0f);
        buf *outs[] = {&gu, &act, &out, &h}; /* h: every case writes it (norm or the GEMV) */
        for (int i = 0; i < 4; i++) buf_poison(outs[i]);
        for (int i = 0; i < 2; i++) {
            atlas_backend *be = i ? gpu : cpu;
            atlas_epilogue epi = {.kind = ATLAS_EPI_GLU, .act = side_of(&act, i), .f = F};
            if (!with_norm) CHECK_OK(be->ops->rmsnorm(be, side_of(&h, i), side_of(&x, i),
                                                      norm.w[i], n, D));
            CHECK_OK(atlas_op_rmsnorm_matmul(be, side_of(&gu, i), side_of(&h, i), side_of(&x, i),
                                             with_norm ? norm.w[i] : NULL, w->w[i], NULL, n, D,
                                             0, &epi));
            CHECK_OK(be->ops->matmul(be, side_of(&out, i), side_of(&act, i), wdn.w[i], NULL, n));
        }
        /* 150 rows: the dense weight's gate_up and act rounded to bf16 (prefill's chain: the
         * clamped SwiGLU's case 8.9e-3 on an H100); the FP8 weight's scratch copy rounds
         * each weight to bf16 as well (its case through the bf16 chain was 1.02e-2) */
        double tol = n == 1 ? 1e-4 : c == 5 ? 2e-2 : 1e-2;
        const char *how = c == 0   ? ", norm"
                          : c == 1 ? ""
                          : c == 2 ? ", norm, fp8"
                          : c == 4 ? ", norm, fp8 streamed"
                          : c == 5 ? ", norm, fp8"
                                   : "";
        snprintf(what, sizeof what, "%s epilogue, %d row%s%s: down", act_name(), n,
                 n > 1 ? "s" : "", how);
        buf_check(what, &out, (size_t)n * D, tol);
        if (n == 1) { /* prefill's bf16 chain leaves gate_up and act its own (backend.h) */
            snprintf(what, sizeof what, "%s epilogue, 1 row%s: act", act_name(), how);
            buf_check(what, &act, F, tol);
            snprintf(what, sizeof what, "%s epilogue, 1 row%s: gate_up", act_name(), how);
            buf_check(what, &gu, 2 * F, tol);
        }
        if (c == 4) { /* the norm's output, which the GEMV's block 0 writes */
            snprintf(what, sizeof what, "%s epilogue, 1 row%s: h", act_name(), how);
            buf_check(what, &h, D, tol);
        }
    }
    ((cuda_backend *)gpu)->plan.qgemv_ng = 0;
    buf *all[] = {&gu, &act, &x, &h, &out};
    for (int i = 0; i < 5; i++) buf_free(all[i]);
    weight_free(&norm);
    weight_free(&wgu);
    weight_free(&wdn);
    weight_free(&wq);
}

/* Gemma 3's layer tail as forward.c's normed_residual runs it, twice (attention's output
 * then the MLP's): o = att @ wo; h = rmsnorm(o) * post; x += h (deferred into the next norm,
 * which writes h again), then the next norm and matmul, and at the end the final norm. */
static void test_post_norms(int n) {
    char what[96];
    buf x = buf_make((size_t)n * D), h = buf_make((size_t)n * D), att = buf_make((size_t)n * D);
    buf o = buf_make((size_t)n * D), gu = buf_make((size_t)n * 2 * F);
    buf act = buf_make((size_t)n * F);
    weight post = weight_make("post", D, 0, 1.0f), post2 = weight_make("post2", D, 0, 1.0f);
    weight pre = weight_make("pre", D, 0, 1.0f), fin = weight_make("final", D, 0, 1.0f);
    weight wo = weight_make("wo", D, D, 0), wgu = weight_make("wgu", 2 * F, D, 0);
    weight wdn = weight_make("wdown", D, F, 0);
    begin(n, 0, 0, 0, 0);
    buf_random(&x, 2.0f);
    buf_random(&att, 1.0f);
    buf *outs[] = {&h, &o, &gu, &act};
    for (int i = 0; i < 4; i++) buf_poison(outs[i]);
    for (int i = 0; i < 2; i++) {
        atlas_backend *be = i ? gpu : cpu;
        void *xb = side_of(&x, i), *hb = side_of(&h, i), *ob = side_of(&o, i);
        atlas_epilogue epi = {.kind = ATLAS_EPI_GLU, .act = side_of(&act, i), .f = F};
        CHECK_OK(be->ops->matmul(be, ob, side_of(&att, i), wo.w[i], NULL, n));
        CHECK_OK(be->ops->rmsnorm(be, hb, ob, post.w[i], n, D));
        CHECK_OK(be->ops->add(be, xb, hb, n, D));
        CHECK_OK(atlas_op_rmsnorm_matmul(be, side_of(&gu, i), hb, xb, pre.w[i], wgu.w[i], NULL,
                                         n, D, 0, &epi));
        CHECK_OK(be->ops->matmul(be, ob, side_of(&act, i), wdn.w[i], NULL, n));
        CHECK_OK(be->ops->rmsnorm(be, hb, ob, post2.w[i], n, D));
        CHECK_OK(be->ops->add(be, xb, hb, n, D));
        CHECK_OK(be->ops->rmsnorm(be, hb, xb, fin.w[i], n, D));
    }
    double tol = n == 1 ? 1e-4 : 1e-2;
    snprintf(what, sizeof what, "post-norms, %d row%s: MLP output o", n, n > 1 ? "s" : "");
    buf_check(what, &o, (size_t)n * D, tol);
    snprintf(what, sizeof what, "post-norms, %d row%s: residual x", n, n > 1 ? "s" : "");
    buf_check(what, &x, (size_t)n * D, tol);
    snprintf(what, sizeof what, "post-norms, %d row%s: final norm h", n, n > 1 ? "s" : "");
    buf_check(what, &h, (size_t)n * D, tol);
    buf *all[] = {&x, &h, &att, &o, &gu, &act};
    for (int i = 0; i < 6; i++) buf_free(all[i]);
    weight *ws[] = {&post, &post2, &pre, &fin, &wo, &wgu, &wdn};
    for (int i = 0; i < 7; i++) weight_free(ws[i]);
}

static void test_embed_scale(void) {
    weight emb = weight_make("embed", V, D, 0);
    buf x = buf_make((size_t)37 * D);
    begin(30, 7, 0, 0, 0);
    buf_poison(&x);
    CHECK_OK(cpu->ops->embed(cpu, x.cpu, emb.w[0]));
    CHECK_OK(gpu->ops->embed(gpu, x.gpu, emb.w[1]));
    buf_check("embed * sqrt(hidden)", &x, (size_t)37 * D, 0);
    buf_free(&x);
    weight_free(&emb);
}

/* Phi-4-mini's RoPE: 96 of 128 dimensions rotate, longrope's short and long factors. */
static void phi4_mini(void) {
    enum { HD = 128, ROT = 96 };
    double inv[ROT / 2], inv_long[ROT / 2];
    for (int i = 0; i < ROT / 2; i++) {
        double base = pow(10000.0, -2.0 * i / ROT);
        inv[i] = base / (1.0 + 0.05 * i);
        inv_long[i] = base / (1.0 + 0.7 * i);
    }
    atlas_backend_geom g = {.hidden = D, .n_heads = 4, .n_kv_heads = 2, .head_dim = HD,
                            .intermediate = F, .vocab_size = V, .n_layers = LAYERS,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv, .rope_attn_factor = 1.19,
                            .rope_dim = ROT, .rope_inv_freq_long = inv_long,
                            .rope_long_after = LONG_AFTER, .max_position = 4096};
    atlas_kv *kv[2] = {NULL, NULL};
    printf("Phi-4-mini: partial rotary %d of %d, longrope past %d\n", ROT, HD, LONG_AFTER);
    if (pair_make(&g, kv)) test_rope(kv, "phi4-mini");
    pair_free(kv);
}

/* Gemma 3 (1B's head_dim 256, 4 heads for 1 kv head): layer 0 local (RoPE set 1, base 1e4,
 * factor 0.75 so that the set's own factor shows; window 24), layer 1 global (base 1e6). */
static void gemma3(void) {
    enum { HD = 256 };
    double inv[HD / 2], inv_local[HD / 2];
    for (int i = 0; i < HD / 2; i++) {
        inv[i] = pow(1000000.0, -2.0 * i / HD);
        inv_local[i] = pow(10000.0, -2.0 * i / HD);
    }
    int32_t window[LAYERS] = {24, 0};
    uint8_t set[LAYERS] = {1, 0};
    atlas_backend_geom g = {.hidden = D, .n_heads = 4, .n_kv_heads = 1, .head_dim = HD,
                            .intermediate = F, .vocab_size = V, .n_layers = LAYERS,
                            .rms_eps = 1e-6f, .rope_inv_freq = inv, .rope_attn_factor = 1.0,
                            .max_position = 4096, .layer_window = window,
                            .layer_rope_set = set, .n_rope_sets = 1,
                            .rope_sets = {{.inv_freq = inv_local, .attn_factor = 0.75}},
                            .attn_scale = 0.0625f, .embed_scale = sqrtf((float)D),
                            .glu = ATLAS_GLU_GELU_TANH, .post_norms = 1};
    atlas_kv *kv[2] = {NULL, NULL};
    printf("Gemma 3: head_dim %d, layer 0 local (window 24, its own RoPE set)\n", HD);
    if (pair_make(&g, kv)) {
        test_rope(kv, "gemma3");
        test_glu();
        test_embed_scale();
        test_post_norms(1);
        test_post_norms(1); /* a replay of the decode graph */
        test_post_norms(150);
    }
    pair_free(kv);
}

/* Random q, k, v for the batch's n tokens, k and v into the cache, then attention with the
 * sinks (what: the batch, for the message). */
static void sinks_step(atlas_kv **kv, buf *qkv, buf *att, const weight *sinks, int n, int l,
                       const char *what) {
    char tag[128];
    buf_random(qkv, 2.0f);
    CHECK_OK(cpu->ops->kv_store(cpu, qkv->cpu, kv[0], l));
    CHECK_OK(gpu->ops->kv_store(gpu, qkv->gpu, kv[1], l));
    snprintf(tag, sizeof tag, "gpt-oss G=%d, %s,", gpu->geom.n_heads / gpu->geom.n_kv_heads, what);
    check_attention_sinks(kv, qkv, att, n, l, tag, sinks);
}

/* Attention sinks per layer (0 sliding over 128 keys, 1 full) on each kernel the backend
 * picks: a prefill of 200 + 70 tokens (the tiled kernel; seq 0's late queries see only their
 * window), a decode step of both sequences on the cluster kernel (where the device has
 * clusters) and on the warp kernel (the split kernel at G = 16), a prefill of 5 + 5 (the
 * decode kernels over 10 tokens), and a decode step of a 21-key context whose batch has one
 * split (its kernel writes the output itself). The sinks, 2.5 to 3.5, weigh as much as tens
 * of keys. */
static void test_sinks(atlas_kv **kv) {
    const atlas_backend_geom *g = &gpu->geom;
    cuda_backend *cb = (cuda_backend *)gpu;
    void *cluster = cb->dev.cluster_ex;
    int q = (g->n_heads + 2 * g->n_kv_heads) * g->head_dim;
    buf qkv = buf_make((size_t)270 * q), att = buf_make((size_t)270 * g->n_heads * g->head_dim);
    weight sinks = weight_make("sinks", g->n_heads, 0, 3.0f);
    for (int l = 0; l < LAYERS; l++) {
        begin(200, 70, 0, 0, 0);
        sinks_step(kv, &qkv, &att, &sinks, 270, l, "prefill 200 + 70");
        for (int rep = 0; rep < 2; rep++) {
            cb->dev.cluster_ex = rep ? NULL : cluster; /* read by begin_batch's split plan */
            begin(1, 1, 200, 70, 0);
            sinks_step(kv, &qkv, &att, &sinks, 2, l,
                       rep ? "decode, no cluster kernel" : "decode");
        }
        cb->dev.cluster_ex = cluster;
        begin(5, 5, 201, 71, 0);
        sinks_step(kv, &qkv, &att, &sinks, 10, l, "prefill 5 + 5");
        batch_blocks = 2; /* 32 slots: one split */
        begin(1, 0, 20, 0, 0);
        sinks_step(kv, &qkv, &att, &sinks, 1, l, "decode, one split");
        batch_blocks = MAXB;
    }
    buf_free(&qkv);
    buf_free(&att);
    weight_free(&sinks);
}

/* gpt-oss-20b's attention shape at hidden 2880: 64-dim heads, 8 (then 16) query heads a kv
 * head, layer 0 sliding over 128 keys and layer 1 full, YaRN's factor on the tables; its
 * clamped SwiGLU through test_glu (the dense MLP paths: gpt-oss's own MLPs are experts,
 * test-gpu-moe.c, but the activation is one kind of the glu op wherever it runs). */
static void gpt_oss(int G) {
    enum { HD = 64 };
    double inv[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv[i] = pow(150000.0, -2.0 * i / HD);
    int32_t window[LAYERS] = {128, 0};
    D = 2880;
    atlas_backend_geom g = {.hidden = D, .n_heads = 2 * G, .n_kv_heads = 2, .head_dim = HD,
                            .intermediate = F, .vocab_size = V, .n_layers = LAYERS,
                            .rms_eps = 1e-5f, .rope_inv_freq = inv, .rope_attn_factor = 1.35,
                            .max_position = 4096, .layer_window = window,
                            .glu = ATLAS_GLU_SWIGLU_CLAMP, .glu_alpha = 1.702f,
                            .glu_limit = 1.5f, .attn_sinks = 1};
    atlas_kv *kv[2] = {NULL, NULL};
    printf("gpt-oss: hidden %d, head_dim %d, %d query heads a kv head, sinks\n", D, HD, G);
    if (pair_make(&g, kv)) {
        test_sinks(kv);
        if (G == 8) test_glu();
    }
    pair_free(kv);
    D = 256;
}

int main(void) {
    atlas_host *host = NULL;
    atlas_status st = atlas_host_get(0, &host);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_OK(st);
    for (int i = 0; i < MAXB; i++) { /* scrambled, disjoint */
        tables[0][i] = (int32_t)((i * 5 + 3) % NBLK);
        tables[1][i] = (int32_t)((i * 5 + 3 + MAXB * 5) % NBLK);
    }
    phi4_mini();
    gemma3();
    gpt_oss(8);
    gpt_oss(16);
    return harness_finish();
}
