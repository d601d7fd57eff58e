/* test-families.c — the families beyond Llama's on checkpoints written here, through the CPU
 * forward, against a forward written out below from the formulas in float64 (every position
 * of every sequence, causal attention over all of them):
 * - Phi3ForCausalLM in Phi-4-mini's form at a tiny scale: fused qkv_proj and gate_up_proj,
 *   half of each head rotated (partial_rotary_factor 0.5), longrope with original_max 64 of
 *   256. A sequence whose context is past 64 rotates with the long factors, one within it
 *   with the short ones, chosen per sequence (docs/ENGINE.md): an 80-token prompt in one
 *   prefill (all long), a 50-token prefill decoded token by token to 80 (short below 64, long
 *   after, the cached keys kept as they were rotated), and a long and a short prompt in one
 *   batch, each as it is alone; the 80 in chunks of 30 as in one prefill when the batch
 *   gives the sequence's length (seq_rope_len, as the engine does), and not without. The
 *   two factor sets must give different logits.
 * - Separate q/k/v tensors where the family ships them fused fail the load, named.
 * (tests/test-tp.c runs this family over two ranks.)
 * - Gemma3ForCausalLM at a tiny scale: norms as 1 + w, q/k norms, post-norms around attention
 *   and MLP, GeGLU (tanh), the embedding scaled by sqrt(hidden), query_pre_attn_scalar not
 *   head_dim, and two sliding layers (window 4, local RoPE base 10,000) before a full one
 *   (base 1e6): a 20-token prefill and a 9-token one decoded step by step to 20. The same
 *   weights as a Gemma3ForConditionalGeneration in both key spellings (a vision tower and
 *   projector beside them, ignored) give the same logits; a vision tensor in a
 *   Gemma3ForCausalLM checkpoint fails the load, named; tensor parallelism is refused.
 * The reference takes RoPE frequencies and angles in float32, as transformers does; the rest
 * is float64. transformers' own references for these shapes are made on a GPU machine
 * (tools/conformance/shapes.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "ckpt.h"
#include "harness.h"
#include "model/model_internal.h"
#include "model/shard.h"

enum { BLOCK = 16, MAX_BLOCKS = 8, MAX_TOK = 96, MAXW = 64 };

/* Deterministic values from the name and the index: norms near 1, the embedding in [-1, 1),
 * the rest in [-0.5, 0.5) scaled down so that 80 positions stay well conditioned. */
static float fill_value(void *user, const char *name, int64_t i) {
    (void)user;
    float u = ckpt_unit(name, i);
    if (strstr(name, "norm.weight")) return 1.0f + 0.25f * u;
    if (strstr(name, "embed_tokens")) return u;
    return 0.5f * u;
}

static double W(const char *name, int64_t i) { return ckpt_bf16(fill_value(NULL, name, i)); }

/* out[rows] = W[rows, cols] @ in, W named "model.layers.L.<w>" */
static void linear(int l, const char *w, int rows, int cols, const double *in, double *out) {
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.%s", l, w);
    ckpt_ref_linear(fill_value, NULL, n, rows, cols, in, out);
}

static void rmsnorm(const char *w, const double *x, int d, double eps, double *out) {
    ckpt_ref_rmsnorm(fill_value, NULL, w, 0, 0.0, x, d, eps, out);
}

/* transformers' Phi3 rotation of one head: rotate-half over the first rot dims, with the
 * longrope frequencies 1 / (ext_i * theta^(2i/rot)) and cos/sin scaled by attn. */
static void rotate(double *x, int rot, int pos, const double *ext, double theta, double attn) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / (ext[i] * pow(theta, 2.0 * i / rot)));
        float angle = inv * (float)pos;
        double c = (double)(float)cos((double)angle) * attn;
        double s = (double)(float)sin((double)angle) * attn;
        double x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

typedef struct phi_ref {
    const atlas_config *c;
    const double *shorts, *longs;
} phi_ref;

/* Logits [n, V] of tokens[0..n) of one sequence; long_at[p]: position p was rotated with the
 * long factors (its key in the cache too). */
static void phi_forward(const phi_ref *r, const int32_t *tok, int n, const int *long_at,
                        double *logits) {
    const atlas_config *c = r->c;
    int d = c->hidden, H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim, f = c->intermediate;
    int qkv_w = (H + 2 * K) * hd;
    static double x[MAX_TOK][MAXW], qkv[MAX_TOK][3 * MAXW];
    double h[MAXW], att[MAXW], o[MAXW], gu[2 * MAXW], a[MAXW], sc[MAX_TOK];
    double attn = c->rope.attention_factor;
    char nm[128];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            x[t][j] = W("model.embed_tokens.weight", (int64_t)tok[t] * d + j);
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        for (int t = 0; t < n; t++) {
            rmsnorm(nm, x[t], d, c->rms_eps, h);
            linear(l, "self_attn.qkv_proj.weight", qkv_w, d, h, qkv[t]);
            for (int hh = 0; hh < H + K; hh++)
                rotate(qkv[t] + hh * hd, c->rope_dim, t, long_at[t] ? r->longs : r->shorts,
                       c->rope.theta, attn);
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < H; hh++) {
                const double *q = qkv[t] + hh * hd;
                int kvh = hh / (H / K);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    const double *k = qkv[s] + (H + kvh) * hd;
                    double dot = 0;
                    for (int i = 0; i < hd; i++) dot += q[i] * k[i];
                    sc[s] = dot / sqrt((double)hd);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int s = 0; s <= t; s++) acc += sc[s] * qkv[s][(H + K + kvh) * hd + i];
                    att[hh * hd + i] = acc / sum;
                }
            }
            linear(l, "self_attn.o_proj.weight", d, H * hd, att, o);
            for (int j = 0; j < d; j++) x[t][j] += o[j];
            snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
            rmsnorm(nm, x[t], d, c->rms_eps, h);
            linear(l, "mlp.gate_up_proj.weight", 2 * f, d, h, gu);
            for (int i = 0; i < f; i++) a[i] = gu[i] / (1 + exp(-gu[i])) * gu[f + i];
            linear(l, "mlp.down_proj.weight", d, f, a, o);
            for (int j = 0; j < d; j++) x[t][j] += o[j];
            snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        }
    }
    const char *head = c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (int t = 0; t < n; t++) {
        rmsnorm("model.norm.weight", x[t], d, c->rms_eps, h);
        for (int v = 0; v < c->vocab_size; v++) {
            double acc = 0;
            for (int j = 0; j < d; j++) acc += W(head, (int64_t)v * d + j) * h[j];
            logits[(size_t)t * c->vocab_size + v] = acc;
        }
    }
}

/* got[n, V] against the reference's rows [from, from + n) */
static void compare(const char *what, const float *got, const double *ref, int from, int n,
                    int V) {
    float *want = malloc(sizeof(float) * (size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++) want[i] = (float)ref[(size_t)from * V + i];
    double e = harness_rel_err(got, want, n * V);
    CHECK_MSG(e <= 1e-5, "%s: logits error %.3g against the float64 forward", what, e);
    printf("%s: %d positions, logits error %.2e\n", what, n, e);
    free(want);
}

/* One batch of n_seqs sequences, each continuing from ctx0[s] cached tokens with count[s]
 * new ones (tokens of all of them back to back); logits of every new token. */
static atlas_status feed_len(atlas_model *m, int n_seqs, const int32_t *tokens,
                             const int *ctx0, const int *count, const int32_t *rope_len,
                             float *logits) {
    return ckpt_feed(m, n_seqs, tokens, ctx0, count, rope_len, MAX_BLOCKS, true, logits);
}

static atlas_status feed(atlas_model *m, int n_seqs, const int32_t *tokens, const int *ctx0,
                         const int *count, float *logits) {
    return feed_len(m, n_seqs, tokens, ctx0, count, NULL, logits);
}

/* The 80 tokens in chunks of 30 with seq_rope_len 80 (as the engine passes a prompt's
 * length): every position as in one prefill. Without it the first two chunks (contexts 30
 * and 60) rotate with the short factors. */
static void test_phi3_chunks(atlas_model *m, const int32_t *tok, const double *ref, int V) {
    enum { N = 80, C = 30 };
    float *got = malloc(sizeof(float) * N * V);
    int32_t len = N;
    for (int a = 0; a < N; a += C) {
        int n = N - a < C ? N - a : C;
        CHECK_OK(feed_len(m, 1, tok + a, &a, &n, &len, got + (size_t)a * V));
    }
    compare("phi3 80 in chunks of 30, rope length 80", got, ref, 0, N, V);
    for (int a = 0; a < N; a += C) {
        int n = N - a < C ? N - a : C;
        CHECK_OK(feed(m, 1, tok + a, &a, &n, got + (size_t)a * V));
    }
    float *want = malloc(sizeof(float) * N * V);
    for (size_t i = 0; i < (size_t)N * V; i++) want[i] = (float)ref[i];
    double e = harness_rel_err(got, want, N * V);
    CHECK_MSG(e > 1e-2, "phi3 chunks without the rope length: within %.3g of one prefill", e);
    free(want);
    free(got);
}

static const char *phi_config =
    "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
    "\"num_hidden_layers\": 2, \"vocab_size\": 32, \"max_position_embeddings\": 256, "
    "\"original_max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
    "\"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"rope_theta\": 10000.0, "
    "\"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"type\": \"longrope\", "
    "\"short_factor\": [1.0, 1.25], \"long_factor\": [3.0, 7.5]}}";

static void test_phi3_runs(atlas_model *m) {
    const atlas_config *c = &m->cfg;
    static const double shorts[] = {1.0, 1.25}, longs[] = {3.0, 7.5};
    phi_ref r = {c, shorts, longs};
    int V = c->vocab_size, N = 80, P = 50, S = 40;
    CHECK(c->rope_dim == 4 && c->rope.original_max_position == 64 && c->rope.factor == 4.0);
    int32_t tok[MAX_TOK];
    int long_at[MAX_TOK];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7 + 3) % V);
    double *ref = malloc(sizeof(double) * MAX_TOK * V);
    double *ref2 = malloc(sizeof(double) * MAX_TOK * V);
    float *got = malloc(sizeof(float) * 2 * MAX_TOK * V);
    /* one prefill of 80: context 80 > 64, every position long */
    for (int i = 0; i < N; i++) long_at[i] = 1;
    phi_forward(&r, tok, N, long_at, ref);
    int zero = 0;
    CHECK_OK(feed(m, 1, tok, &zero, &N, got));
    compare("phi3 prefill of 80 (long factors)", got, ref, 0, N, V);
    test_phi3_chunks(m, tok, ref, V);
    /* 50 in one prefill (short), then one token a step: long from position 64 on */
    for (int i = 0; i < N; i++) long_at[i] = i < P ? 0 : i + 1 > 64;
    phi_forward(&r, tok, N, long_at, ref2);
    CHECK_OK(feed(m, 1, tok, &zero, &P, got));
    compare("phi3 prefill of 50 (short factors)", got, ref2, 0, P, V);
    for (int p = P, one = 1; p < N; p++)
        CHECK_OK(feed(m, 1, tok + p, &p, &one, got + (size_t)(p - P) * V));
    compare("phi3 decode 50..79 (short to 63, long after)", got, ref2, P, N - P, V);
    float a[32], b[32];
    for (int v = 0; v < V; v++) a[v] = (float)ref[(size_t)(N - 1) * V + v],
                               b[v] = (float)ref2[(size_t)(N - 1) * V + v];
    double e = harness_rel_err(a, b, V);
    CHECK_MSG(e > 1e-2, "phi3: one prefill and step by step agree within %.3g at 80: the "
              "factor sets make no difference", e);
    /* the long and a short prompt in one batch: each as alone (per-sequence choice) */
    int32_t both[2 * MAX_TOK];
    memcpy(both, tok, sizeof(int32_t) * N);
    memcpy(both + N, tok + 5, sizeof(int32_t) * S);
    int ctx0[2] = {0, 0}, count[2] = {N, S};
    CHECK_OK(feed(m, 2, both, ctx0, count, got));
    compare("phi3 batch: the 80-token sequence", got, ref, 0, N, V);
    for (int i = 0; i < S; i++) long_at[i] = 0;
    phi_forward(&r, tok + 5, S, long_at, ref2);
    compare("phi3 batch: the 40-token sequence (short factors)", got + (size_t)N * V, ref2, 0,
            S, V);
    free(ref);
    free(ref2);
    free(got);
}

static void test_phi3(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "phi3")) return;
    atlas_config c;
    CHECK_OK(atlas_config_parse(phi_config, strlen(phi_config), "phi3", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    CHECK(g.fused_proj);
    if (!ckpt_write_text(dir, "config.json", phi_config) ||
        !ckpt_write_model(dir, &g, NULL, NULL, 0, fill_value, NULL)) {
        harness_rm_rf(dir);
        return;
    }
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 2;
    p.max_batch_tokens = 2 * MAX_TOK;
    p.kv_block_size = BLOCK;
    p.kv_tokens = 2 * MAX_BLOCKS * BLOCK;
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (m) test_phi3_runs(m);
    if (m) CHECK_OK(atlas_model_release(m));
    /* separate q/k/v tensors where the family ships them fused: the load names the missing */
    c.fused_proj = false;
    atlas_shard_geom_from_config(&c, &g);
    if (ckpt_write_model(dir, &g, NULL, NULL, 0, fill_value, NULL)) {
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND);
        CHECK_MSG(strstr(atlas_last_error(), "qkv_proj"), "%s", atlas_last_error());
    }
    harness_rm_rf(dir);
}

/* ---- Gemma 3 ------------------------------------------------------------------------------ */

/* Gemma's weights: norms near 0 (used as 1 + w), the rest as fill_value. The name is the
 * text model's ("model.X") whatever prefix the checkpoint writes it under. */
static float gemma_value(void *user, const char *name, int64_t i) {
    const char *prefix = user;
    char n[160];
    if (prefix && !strncmp(name, prefix, strlen(prefix)))
        snprintf(n, sizeof n, "model.%s", name + strlen(prefix));
    else
        snprintf(n, sizeof n, "%s", name);
    float v = fill_value(NULL, n, i);
    return strstr(n, "norm.weight") ? v - 1.0f : v;
}

static double GW(const char *name, int64_t i) { return ckpt_bf16(gemma_value(NULL, name, i)); }

/* rmsnorm(x) * (1 + w) of d values, w named `w` (j0: its first element) */
static void gnorm(const char *w, int64_t j0, const double *x, int d, double eps, double *out) {
    ckpt_ref_rmsnorm(gemma_value, NULL, w, j0, 1.0, x, d, eps, out);
}

static void glinear(int l, const char *w, int rows, int cols, const double *in, double *out) {
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.%s", l, w);
    ckpt_ref_linear(gemma_value, NULL, n, rows, cols, in, out);
}

static double gelu_tanh(double g) {
    return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
}

/* One layer's attention of tokens [0, n): q/k normed, rotated with the layer's base, softmax
 * over the window (0: all) scaled by scale; out[t] = att[H * hd]. */
static void gemma_attention(const atlas_config *c, int l, double (*qkv)[3 * MAXW], int n,
                            double (*att)[MAXW]) {
    int H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim;
    int sliding = atlas_config_layer_rope_set(c, l), W = sliding ? c->sliding_window : 0;
    double theta = sliding ? c->rope_local.theta : c->rope.theta, one = 1.0, sc[MAX_TOK];
    double ext[MAXW];
    char qn[96], kn[96];
    snprintf(qn, sizeof qn, "model.layers.%d.self_attn.q_norm.weight", l);
    snprintf(kn, sizeof kn, "model.layers.%d.self_attn.k_norm.weight", l);
    for (int i = 0; i < MAXW; i++) ext[i] = one;
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H + K; hh++) {
            double *x = qkv[t] + hh * hd;
            gnorm(hh < H ? qn : kn, 0, x, hd, c->rms_eps, x);
            rotate(x, hd, t, ext, theta, 1.0);
        }
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H; hh++) {
            const double *q = qkv[t] + hh * hd;
            int kvh = hh / (H / K), s0 = W && t - W + 1 > 0 ? t - W + 1 : 0;
            double mx = -1e300, sum = 0;
            for (int s = s0; s <= t; s++) {
                double dot = 0;
                for (int i = 0; i < hd; i++) dot += q[i] * qkv[s][(H + kvh) * hd + i];
                sc[s] = dot * (double)(float)c->attn_scale;
                if (sc[s] > mx) mx = sc[s];
            }
            for (int s = s0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int s = s0; s <= t; s++) acc += sc[s] * qkv[s][(H + K + kvh) * hd + i];
                att[t][hh * hd + i] = acc / sum;
            }
        }
}

/* transformers' Gemma3ForCausalLM written out in float64: logits [n, V]. */
static void gemma_forward(const atlas_config *c, const int32_t *tok, int n, double *logits) {
    int d = c->hidden, H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim, f = c->intermediate;
    static double x[MAX_TOK][MAXW], qkv[MAX_TOK][3 * MAXW], att[MAX_TOK][MAXW];
    double h[MAXW], o[MAXW], g[MAXW], u[MAXW], a[MAXW];
    char nm[128];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            x[t][j] = GW("model.embed_tokens.weight", (int64_t)tok[t] * d + j) * c->embed_scale;
    for (int l = 0; l < c->n_layers; l++) {
        for (int t = 0; t < n; t++) {
            snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
            gnorm(nm, 0, x[t], d, c->rms_eps, h);
            glinear(l, "self_attn.q_proj.weight", H * hd, d, h, qkv[t]);
            glinear(l, "self_attn.k_proj.weight", K * hd, d, h, qkv[t] + H * hd);
            glinear(l, "self_attn.v_proj.weight", K * hd, d, h, qkv[t] + (H + K) * hd);
        }
        gemma_attention(c, l, qkv, n, att);
        for (int t = 0; t < n; t++) {
            glinear(l, "self_attn.o_proj.weight", d, H * hd, att[t], o);
            snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
            gnorm(nm, 0, o, d, c->rms_eps, o);
            for (int j = 0; j < d; j++) x[t][j] += o[j];
            snprintf(nm, sizeof nm, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            gnorm(nm, 0, x[t], d, c->rms_eps, h);
            glinear(l, "mlp.gate_proj.weight", f, d, h, g);
            glinear(l, "mlp.up_proj.weight", f, d, h, u);
            for (int i = 0; i < f; i++) a[i] = gelu_tanh(g[i]) * u[i];
            glinear(l, "mlp.down_proj.weight", d, f, a, o);
            snprintf(nm, sizeof nm, "model.layers.%d.post_feedforward_layernorm.weight", l);
            gnorm(nm, 0, o, d, c->rms_eps, o);
            for (int j = 0; j < d; j++) x[t][j] += o[j];
        }
    }
    for (int t = 0; t < n; t++) {
        gnorm("model.norm.weight", 0, x[t], d, c->rms_eps, h);
        for (int v = 0; v < c->vocab_size; v++) {
            double acc = 0;
            for (int j = 0; j < d; j++) acc += GW("model.embed_tokens.weight", (int64_t)v * d + j) * h[j];
            logits[(size_t)t * c->vocab_size + v] = acc;
        }
    }
}

#define GEMMA_TEXT                                                                                 \
    "\"hidden_size\": 16, \"intermediate_size\": 24, \"num_attention_heads\": 2, "                 \
    "\"num_key_value_heads\": 1, \"head_dim\": 8, \"num_hidden_layers\": 3, \"vocab_size\": 32, " \
    "\"max_position_embeddings\": 256, \"query_pre_attn_scalar\": 6, \"sliding_window\": 4, "     \
    "\"sliding_window_pattern\": 3, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, " \
    "\"rms_norm_eps\": 1e-06, \"final_logit_softcapping\": null, \"attn_logit_softcapping\": null"

static const char *gemma_config = "{\"architectures\": [\"Gemma3ForCausalLM\"], " GEMMA_TEXT "}";
static const char *gemma_vl_config =
    "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
    "\"text_config\": {\"model_type\": \"gemma3_text\", " GEMMA_TEXT "}, "
    "\"vision_config\": {\"hidden_size\": 8}, \"mm_tokens_per_image\": 4}";

static atlas_model_params gemma_params(void) {
    atlas_model_params p = atlas_model_default_params();
    p.device = ATLAS_DEVICE_CPU;
    p.load_tokenizer = 0;
    p.n_threads = 2;
    p.max_batch_tokens = 2 * MAX_TOK;
    p.kv_block_size = BLOCK;
    p.kv_tokens = 2 * MAX_BLOCKS * BLOCK;
    p.mlp_chunk_tokens = 7; /* prefills take the MLP 7 rows at a time, decode steps at once */
    return p;
}

/* A 20-token prefill, and 9 then one a step to 20: both against the float64 forward. */
static void test_gemma3_runs(atlas_model *m, float *got) {
    const atlas_config *c = &m->cfg;
    enum { N = 20, P = 9 };
    int V = c->vocab_size, zero = 0, n = N, p = P;
    CHECK(atlas_config_layer_rope_set(c, 0) == 1 && atlas_config_layer_rope_set(c, 2) == 0);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 11 + 5) % V);
    double *ref = malloc(sizeof(double) * N * V);
    gemma_forward(c, tok, N, ref);
    CHECK_OK(feed(m, 1, tok, &zero, &n, got));
    compare("gemma3 prefill of 20 (window 4)", got, ref, 0, N, V);
    CHECK_OK(feed(m, 1, tok, &zero, &p, got));
    for (int q = P, one = 1; q < N; q++)
        CHECK_OK(feed(m, 1, tok + q, &q, &one, got + (size_t)q * V));
    compare("gemma3 prefill of 9, decode to 20", got, ref, 0, N, V);
    free(ref);
}

/* dir holds a Gemma3ForConditionalGeneration with the text weights under prefix: its logits
 * for the 20 tokens must be want's, bit for bit. */
static void gemma3_vl(const char *dir, const char *prefix, const char *vision, const float *want) {
    atlas_config c;
    CHECK_OK(atlas_config_parse(gemma_vl_config, strlen(gemma_vl_config), "vl", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    char t1[96], t2[96];
    snprintf(t1, sizeof t1, "%svision_model.embeddings.patch_embedding.weight", vision);
    snprintf(t2, sizeof t2, "%smm_input_projection_weight", vision[0] == 'm' ?
             "model.multi_modal_projector." : "multi_modal_projector.");
    ckpt_extra extra[] = {{t1, 8, 12}, {t2, 8, 16}};
    if (!ckpt_write_text(dir, "config.json", gemma_vl_config) ||
        !ckpt_write_model_prefixed(dir, &g, prefix, extra, 2, gemma_value, (void *)prefix))
        return;
    atlas_model_params p = gemma_params();
    atlas_model *m = NULL;
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (!m) return;
    enum { N = 20 };
    float *got = malloc(sizeof(float) * N * 32);
    int32_t tok[N];
    int zero = 0, n = N;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 11 + 5) % 32);
    CHECK_OK(feed(m, 1, tok, &zero, &n, got));
    CHECK_MSG(!memcmp(got, want, sizeof(float) * N * 32), "%s: logits differ from "
              "Gemma3ForCausalLM's", prefix);
    CHECK_OK(atlas_model_release(m));
    free(got);
}

static void test_gemma3(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "gemma3")) return;
    atlas_config c;
    CHECK_OK(atlas_config_parse(gemma_config, strlen(gemma_config), "gemma3", &c));
    atlas_shard_geom g;
    atlas_shard_geom_from_config(&c, &g);
    CHECK(g.post_norms && g.qk_norm && g.tie_embeddings);
    if (!ckpt_write_text(dir, "config.json", gemma_config) ||
        !ckpt_write_model(dir, &g, NULL, NULL, 0, gemma_value, NULL)) {
        harness_rm_rf(dir);
        return;
    }
    atlas_model_params p = gemma_params();
    atlas_model *m = NULL;
    float *got = malloc(sizeof(float) * MAX_TOK * 32), *first = malloc(sizeof(float) * 20 * 32);
    CHECK_OK(atlas_model_load(dir, &p, &m));
    if (m) {
        test_gemma3_runs(m, got);
        int32_t tok[20];
        int zero = 0, n = 20;
        for (int i = 0; i < 20; i++) tok[i] = (int32_t)((i * 11 + 5) % 32);
        CHECK_OK(feed(m, 1, tok, &zero, &n, first));
        CHECK_OK(atlas_model_release(m));
    }
    p.tp_size = 2;
    CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(atlas_last_error(), "Gemma3ForCausalLM"), "%s", atlas_last_error());
    /* a vision tensor where no vision tower belongs */
    ckpt_extra stray = {"vision_tower.vision_model.post_layernorm.weight", 8, 0};
    if (ckpt_write_model(dir, &g, NULL, &stray, 1, gemma_value, NULL)) {
        p = gemma_params();
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(atlas_last_error(), "vision_tower"), "%s", atlas_last_error());
    }
    harness_rm_rf(dir);
    /* the vision-language checkpoint's text model, as published and as re-saved */
    if (harness_mkdtemp(dir, sizeof dir, "gemma3-vl")) {
        gemma3_vl(dir, "language_model.model.", "vision_tower.", first);
        harness_rm_rf(dir);
    }
    if (harness_mkdtemp(dir, sizeof dir, "gemma3-vl2")) {
        gemma3_vl(dir, "model.language_model.", "model.vision_tower.", first);
        harness_rm_rf(dir);
    }
    free(got);
    free(first);
}

int main(void) {
    test_phi3();
    test_gemma3();
    return harness_finish();
}
