/* test-gptoss.c — gpt-oss (GptOssForCausalLM) on checkpoints written here in the Hub's
 * tensor layout, through the CPU forward, against a forward written out below in float64 from
 * transformers' modeling_gpt_oss.py:
 * - q/k/v/o biases; YaRN (not truncated) RoPE; a sliding layer (window 4) then a full one as
 *   layer_types says; a learned sink per head joining each softmax's denominator;
 * - the router: a linear with its bias, the top k of the logits, then a softmax over the k;
 * - the experts as stacked tensors, gate and up interleaved in the even and odd columns,
 *   with their biases, and the clamped SwiGLU ((clamp(up) + 1) * g * sigmoid(1.702 g),
 *   g = min(gate, swiglu_limit)) with a limit that both halves reach;
 * - the experts in bf16 (gate_up_proj [E, d, 2f], x @ W) and in MXFP4 (_blocks [E, out,
 *   in/32, 16] and e8m0 _scales, as transformers' convert_moe_packed_tensors reads them):
 *   a 20-token prefill, a 9-token one decoded step by step to 20, and two sequences in one
 *   batch, each as alone. Every routing has a clear margin at its k-th expert and the tokens
 *   do not all take the same experts (else the test would say nothing).
 * - the route op alone: the router's bias counts, equal logits take the lower expert index,
 *   the weights are the softmax of the k chosen logits.
 * - GptOssConfig's defaults, and what is refused: experts_per_token disagreeing, MXFP4
 *   experts without quantization_config, a missing sink.
 * - its tokenizer's shape: o200k's Split regex before a byte-level BPE loads, and the Harmony
 *   tokens (<|start|>, <|channel|>, <|message|>, <|end|>, <|call|>, <|return|>) marked special
 *   are matched in text as one id each and dropped by a decode that skips special tokens.
 * transformers' own references for these shapes are made on a GPU machine
 * (tools/conformance/shapes.py: gpt-oss, gpt-oss-mxfp4, gpt-oss-20b). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "atlas/tokenizer.h"
#include "backend/backend.h"
#include "ckpt.h"
#include "core/dtype.h"
#include "harness.h"
#include "model/config.h"
#include "model/forward.h"

enum { D = 64, F = 32, E = 4, KU = 2, H = 4, KV = 2, HD = 16, L = 2, V = 32, WIN = 4 };
enum { BLOCK = 16, MAX_BLOCKS = 4, MAX_TOK = 24, MAX_T = 64 };
static const double LIMIT = 1.0, ALPHA = 1.702, EPS = 1e-5, THETA = 150000.0;
static const double YARN_FACTOR = 4.0;
static const int YARN_ORIG = 64;

#define CONFIG_HEAD                                                                           \
    "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 64, "                     \
    "\"intermediate_size\": 32, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "       \
    "\"experts_per_token\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "      \
    "\"head_dim\": 16, \"num_hidden_layers\": 2, \"vocab_size\": 32, \"rms_norm_eps\": 1e-5, " \
    "\"sliding_window\": 4, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "  \
    "\"swiglu_limit\": 1.0, \"rope_theta\": 150000, \"max_position_embeddings\": 256, "        \
    "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 32.0, "      \
    "\"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 64}, "    \
    "\"attention_bias\": true, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", "    \
    "\"initial_context_length\": 4096, \"router_aux_loss_coef\": 0.9"

static const char *bf16_config = CONFIG_HEAD "}";
static const char *mxfp4_config =
    CONFIG_HEAD ", \"quantization_config\": {\"quant_method\": \"mxfp4\", "
    "\"modules_to_not_convert\": [\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", "
    "\"model.embed_tokens\", \"lm_head\"]}}";

/* ---- the checkpoint's values ---------------------------------------------------------- */

/* Float tensors: norms near 1, the embedding in [-1, 1), routers in [-3, 3) (clear margins),
 * sinks in [-2, 2), the rest in [-0.5, 0.5). */
static float fill_value(void *user, const char *name, int64_t i) {
    (void)user;
    float u = ckpt_unit(name, i);
    if (strstr(name, "norm.weight")) return 1.0f + 0.25f * u;
    if (strstr(name, "embed_tokens")) return u;
    if (strstr(name, "router.")) return 3.0f * u;
    if (strstr(name, "sinks")) return 2.0f * u;
    return 0.5f * u;
}

/* U8 tensors: any code in the blocks, scales 2^-4 .. 2^-2 (e8m0 123 .. 125). */
static uint8_t byte_value(const char *name, int64_t i) {
    float u = ckpt_unit(name, i);
    if (strstr(name, "_scales")) return (uint8_t)(123 + (int)((u + 1.0f) * 1.5f));
    return (uint8_t)((u + 1.0f) * 128.0f);
}

static double W(const char *name, int64_t i) { return ckpt_bf16(fill_value(NULL, name, i)); }

static const double FP4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

/* Expert e's weight of layer l from input `in` to output `out` of gate_up (gu) or down, as
 * the checkpoint stores it: bf16 [E, in, out], or MXFP4 [E, out, in/32, 16] with scales. */
static double expert_w(int mx, int l, int e, int gu, int out, int in) {
    int n_in = gu ? D : F, n_out = gu ? 2 * F : D;
    char nm[96];
    const char *what = gu ? "gate_up_proj" : "down_proj";
    if (!mx) {
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%s", l, what);
        return W(nm, ((int64_t)e * n_in + in) * n_out + out);
    }
    int64_t row = (int64_t)e * n_out + out, g = in / 32;
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%s_blocks", l, what);
    uint8_t b = byte_value(nm, (row * (n_in / 32) + g) * 16 + (in % 32) / 2);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%s_scales", l, what);
    uint8_t s = byte_value(nm, row * (n_in / 32) + g);
    return FP4[in % 2 ? b >> 4 : b & 15] * ldexp(1.0, (int)s - 127);
}

/* ---- the reference, in float64 -------------------------------------------------------- */

static void linear_b(int l, const char *what, int rows, int cols, const double *in,
                     double *out) {
    char nm[96], bn[96];
    snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, what);
    snprintf(bn, sizeof bn, "model.layers.%d.%s.bias", l, what);
    ckpt_ref_linear(fill_value, NULL, nm, rows, cols, in, out);
    for (int i = 0; i < rows; i++) out[i] += W(bn, i);
}

static void rmsnorm(const char *w, const double *x, double *out) {
    ckpt_ref_rmsnorm(fill_value, NULL, w, 0, 0.0, x, D, EPS, out);
}

/* transformers' _compute_yarn_parameters with truncate false, in float32 where it is. */
static void yarn(float *inv, double *attn) {
    int dim = HD;
    double base = THETA, fdim = dim;
    double low = fdim * log(YARN_ORIG / (32.0 * 2 * M_PI)) / (2 * log(base));
    double high = fdim * log(YARN_ORIG / (1.0 * 2 * M_PI)) / (2 * log(base));
    low = low < 0 ? 0 : low, high = high > dim - 1 ? dim - 1 : high;
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        float pos = (float)pow(base, (double)(float)(2 * i) / dim);
        float extra = 1.0f / pos, inter = 1.0f / ((float)YARN_FACTOR * pos);
        float ramp = (float)((i - low) / (high - low));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
    *attn = (float)(0.1 * log(YARN_FACTOR) + 1.0);
}

static void rotate(double *x, int pos) {
    float inv[HD / 2];
    double attn;
    yarn(inv, &attn);
    for (int i = 0; i < HD / 2; i++) {
        float angle = inv[i] * (float)pos;
        double c = (float)((float)cos((double)angle) * (float)attn);
        double s = (float)((float)sin((double)angle) * (float)attn);
        double x1 = x[i], x2 = x[i + HD / 2];
        x[i] = x1 * c - x2 * s;
        x[i + HD / 2] = x2 * c + x1 * s;
    }
}

/* One layer's attention of tokens [0, n): rotated, causal, the last WIN positions on the
 * sliding layer, each head's sink in the softmax's denominator. */
static void attention_ref(int l, double (*qkv)[(H + 2 * KV) * HD], int n, double (*att)[H * HD]) {
    double sc[MAX_TOK];
    char sn[96];
    snprintf(sn, sizeof sn, "model.layers.%d.self_attn.sinks", l);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H + KV; hh++) rotate(qkv[t] + hh * HD, t);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H; hh++) {
            const double *q = qkv[t] + hh * HD;
            int kvh = hh / (H / KV), s0 = l == 0 && t - WIN + 1 > 0 ? t - WIN + 1 : 0;
            double sink = W(sn, hh), mx = sink, sum = 0;
            for (int s = s0; s <= t; s++) {
                double dot = 0;
                for (int i = 0; i < HD; i++) dot += q[i] * qkv[s][(H + kvh) * HD + i];
                sc[s] = dot / sqrt((double)HD);
                if (sc[s] > mx) mx = sc[s];
            }
            sum = exp(sink - mx);
            for (int s = s0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
            for (int i = 0; i < HD; i++) {
                double acc = 0;
                for (int s = s0; s <= t; s++) acc += sc[s] * qkv[s][(H + KV + kvh) * HD + i];
                att[t][hh * HD + i] = acc / sum;
            }
        }
}

/* What the reference saw: the smallest margin of a k-th expert's logit over the next, whether
 * the tokens took different experts, and how often each clamp bit. */
typedef struct ref_log {
    double min_gap;
    int first[KU], have_first, differs, gate_clamped, up_clamped;
} ref_log;

/* GptOssMLP of h[D] into out[D]. */
static void moe_ref(int mx, int l, const double *h, double *out, ref_log *log) {
    double logits[E], w[KU], gu[2 * F], a[F], y[D];
    int ids[KU], taken[E] = {0};
    char nm[96];
    linear_b(l, "mlp.router", E, D, h, logits);
    for (int j = 0; j < KU; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || logits[e] > logits[best])) best = e;
        ids[j] = best, taken[best] = 1, w[j] = logits[best];
    }
    double next = -1e300, sum = 0;
    for (int e = 0; e < E; e++) next = !taken[e] && logits[e] > next ? logits[e] : next;
    if (logits[ids[KU - 1]] - next < log->min_gap) log->min_gap = logits[ids[KU - 1]] - next;
    for (int j = 0; j < KU; j++) {
        if (log->have_first) log->differs |= log->first[j] != ids[j];
        else log->first[j] = ids[j];
    }
    log->have_first = 1;
    for (int j = 0; j < KU; j++) sum += w[j] = exp(w[j] - logits[ids[0]]);
    for (int i = 0; i < D; i++) out[i] = 0;
    for (int j = 0; j < KU; j++) {
        int e = ids[j];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        for (int o = 0; o < 2 * F; o++) {
            double acc = W(nm, (int64_t)e * 2 * F + o);
            for (int i = 0; i < D; i++) acc += h[i] * expert_w(mx, l, e, 1, o, i);
            gu[o] = acc;
        }
        for (int i = 0; i < F; i++) {
            double g = gu[2 * i], u = gu[2 * i + 1];
            log->gate_clamped += g > LIMIT, log->up_clamped += fabs(u) > LIMIT;
            g = g > LIMIT ? LIMIT : g;
            u = u > LIMIT ? LIMIT : u < -LIMIT ? -LIMIT : u;
            a[i] = (u + 1) * g / (1 + exp(-ALPHA * g));
        }
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_bias", l);
        for (int o = 0; o < D; o++) {
            double acc = W(nm, (int64_t)e * D + o);
            for (int i = 0; i < F; i++) acc += a[i] * expert_w(mx, l, e, 0, o, i);
            y[o] = acc;
        }
        for (int o = 0; o < D; o++) out[o] += w[j] / sum * y[o];
    }
}

/* The model in float64: logits [n, V] of one sequence. */
static void forward_ref(int mx, const int32_t *tok, int n, double *logits, ref_log *log) {
    static double x[MAX_TOK][D], qkv[MAX_TOK][(H + 2 * KV) * HD], att[MAX_TOK][H * HD];
    double h[D], o[D];
    char nm[96];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < D; j++) x[t][j] = W("model.embed_tokens.weight", (int64_t)tok[t] * D + j);
    for (int l = 0; l < L; l++) {
        for (int t = 0; t < n; t++) {
            snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
            rmsnorm(nm, x[t], h);
            linear_b(l, "self_attn.q_proj", H * HD, D, h, qkv[t]);
            linear_b(l, "self_attn.k_proj", KV * HD, D, h, qkv[t] + H * HD);
            linear_b(l, "self_attn.v_proj", KV * HD, D, h, qkv[t] + (H + KV) * HD);
        }
        attention_ref(l, qkv, n, att);
        for (int t = 0; t < n; t++) {
            linear_b(l, "self_attn.o_proj", D, H * HD, att[t], o);
            for (int j = 0; j < D; j++) x[t][j] += o[j];
            snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
            rmsnorm(nm, x[t], h);
            moe_ref(mx, l, h, o, log);
            for (int j = 0; j < D; j++) x[t][j] += o[j];
        }
    }
    for (int t = 0; t < n; t++) {
        rmsnorm("model.norm.weight", x[t], h);
        ckpt_ref_linear(fill_value, NULL, "lm_head.weight", V, D, h, logits + (size_t)t * V);
    }
}

/* ---- checkpoints ---------------------------------------------------------------------- */

typedef struct tensor {
    char name[96];
    int u8, n_dims;
    int64_t shape[4];
} tensor;

static int64_t count_of(const tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

/* DIR/model.safetensors with the n tensors (bf16 from fill_value, U8 from byte_value). */
static int write_st(const char *dir, const tensor *t, int n) {
    char path[700], *h = malloc((size_t)n * 200 + 64);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t used = 1;
    uint64_t off = 0;
    strcpy(h, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)count_of(&t[i]) * (t[i].u8 ? 1 : 2);
        char shape[80] = "";
        for (int j = 0; j < t[i].n_dims; j++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", j ? "," : "",
                     (long long)t[i].shape[j]);
        used += (size_t)sprintf(h + used, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name,
                                t[i].u8 ? "U8" : "BF16", shape, (unsigned long long)off,
                                (unsigned long long)(off + bytes));
        off += bytes;
    }
    strcpy(h + used++, "}");
    while (used % 8) strcpy(h + used++, " ");
    FILE *f = fopen(path, "wb");
    uint64_t hl = used;
    int ok = f && fwrite(&hl, 8, 1, f) == 1 && fwrite(h, 1, used, f) == used;
    for (int i = 0; ok && i < n; i++)
        for (int64_t j = 0; ok && j < count_of(&t[i]); j++) {
            if (t[i].u8) {
                uint8_t b = byte_value(t[i].name, j);
                ok = fwrite(&b, 1, 1, f) == 1;
            } else {
                uint16_t v = atlas_f32_to_bf16(fill_value(NULL, t[i].name, j));
                ok = fwrite(&v, 2, 1, f) == 1;
            }
        }
    if (f && fclose(f)) ok = 0;
    free(h);
    CHECK_MSG(ok, "writing %s", path);
    return ok;
}

enum { MAX_TENSORS = 64 };

/* The model's tensors as the Hub publishes gpt-oss's, into t; the count. */
static int tensors_of(int mx, tensor *t) {
    int n = 0;
#define ADD(u, nd, s0, s1, s2, s3, ...)                                                       \
    (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__),                                     \
     t[n].u8 = u, t[n].n_dims = nd, t[n].shape[0] = s0, t[n].shape[1] = s1,                  \
     t[n].shape[2] = s2, t[n].shape[3] = s3, n++)
    ADD(0, 2, V, D, 0, 0, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        const char *p = "model.layers";
        ADD(0, 1, D, 0, 0, 0, "%s.%d.input_layernorm.weight", p, l);
        ADD(0, 1, D, 0, 0, 0, "%s.%d.post_attention_layernorm.weight", p, l);
        const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
        for (int i = 0; i < 3; i++) {
            int rows = (i ? KV : H) * HD;
            ADD(0, 2, rows, D, 0, 0, "%s.%d.self_attn.%s.weight", p, l, proj[i]);
            ADD(0, 1, rows, 0, 0, 0, "%s.%d.self_attn.%s.bias", p, l, proj[i]);
        }
        ADD(0, 2, D, H * HD, 0, 0, "%s.%d.self_attn.o_proj.weight", p, l);
        ADD(0, 1, D, 0, 0, 0, "%s.%d.self_attn.o_proj.bias", p, l);
        ADD(0, 1, H, 0, 0, 0, "%s.%d.self_attn.sinks", p, l);
        ADD(0, 2, E, D, 0, 0, "%s.%d.mlp.router.weight", p, l);
        ADD(0, 1, E, 0, 0, 0, "%s.%d.mlp.router.bias", p, l);
        if (mx) {
            ADD(1, 4, E, 2 * F, D / 32, 16, "%s.%d.mlp.experts.gate_up_proj_blocks", p, l);
            ADD(1, 3, E, 2 * F, D / 32, 0, "%s.%d.mlp.experts.gate_up_proj_scales", p, l);
            ADD(1, 4, E, D, F / 32, 16, "%s.%d.mlp.experts.down_proj_blocks", p, l);
            ADD(1, 3, E, D, F / 32, 0, "%s.%d.mlp.experts.down_proj_scales", p, l);
        } else {
            ADD(0, 3, E, D, 2 * F, 0, "%s.%d.mlp.experts.gate_up_proj", p, l);
            ADD(0, 3, E, F, D, 0, "%s.%d.mlp.experts.down_proj", p, l);
        }
        ADD(0, 2, E, 2 * F, 0, 0, "%s.%d.mlp.experts.gate_up_proj_bias", p, l);
        ADD(0, 2, E, D, 0, 0, "%s.%d.mlp.experts.down_proj_bias", p, l);
    }
    ADD(0, 1, D, 0, 0, 0, "model.norm.weight");
    ADD(0, 2, V, D, 0, 0, "lm_head.weight");
#undef ADD
    return n;
}

/* dir/config.json and the tensors of the model (mx: MXFP4 experts), less `drop`. */
static int write_model(const char *dir, const char *config, int mx, const char *drop) {
    static tensor t[MAX_TENSORS];
    int n = tensors_of(mx, t), k = 0;
    for (int i = 0; i < n; i++)
        if (!drop || strcmp(t[i].name, drop)) t[k++] = t[i];
    return ckpt_write_text(dir, "config.json", config) && write_st(dir, t, k);
}

/* ---- runs ----------------------------------------------------------------------------- */

/* One batch of n_seqs sequences (tests/ckpt.h's ckpt_feed, blocks in order). */
static atlas_status feed(atlas_model *m, int n_seqs, const int32_t *tokens, const int *ctx0,
                         const int *count, float *logits) {
    return ckpt_feed(m, n_seqs, tokens, ctx0, count, NULL, MAX_BLOCKS, false, logits);
}

static void compare(const char *what, const float *got, const double *ref, int n) {
    float want[MAX_T * V];
    for (int i = 0; i < n * V; i++) want[i] = (float)ref[i];
    double e = harness_rel_err(got, want, n * V);
    CHECK_MSG(e <= 1e-5, "%s: logits error %.3g against the float64 forward", what, e);
    printf("%s: %d positions, logits error %.2e\n", what, n, e);
}

enum { N = 20, P = 9, S = 11 };

static void tokens(int32_t *tok, int n, int mul, int add) {
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * mul + add) % V);
}

/* A 20-token prefill, 9 then one a step, and two sequences in one batch. */
static void run_model(atlas_model *m, int mx, const char *what) {
    int zero = 0, n = N, p = P;
    int32_t tok[N + S];
    static double ref[N * V], ref2[S * V];
    static float got[(N + S) * V];
    ref_log log = {.min_gap = 1e9};
    tokens(tok, N, 7, 3);
    forward_ref(mx, tok, N, ref, &log);
    CHECK_MSG(log.differs, "%s: every token took the same experts", what);
    /* float32's logits are within ~1e-5 of float64's here: 1e-3 cannot flip */
    CHECK_MSG(log.min_gap > 1e-3, "%s: a routing without a margin (%.2g)", what, log.min_gap);
    CHECK_MSG(log.gate_clamped > 0 && log.up_clamped > 0, "%s: the clamps never bit (%d, %d)",
              what, log.gate_clamped, log.up_clamped);
    printf("%s: closest routing margin %.3f; gate clamped %d times, up %d\n", what,
           log.min_gap, log.gate_clamped, log.up_clamped);
    char msg[160];
    snprintf(msg, sizeof msg, "%s prefill of 20", what);
    CHECK_OK(feed(m, 1, tok, &zero, &n, got));
    compare(msg, got, ref, N);
    CHECK_OK(feed(m, 1, tok, &zero, &p, got));
    for (int q = P, one = 1; q < N; q++)
        CHECK_OK(feed(m, 1, tok + q, &q, &one, got + (size_t)q * V));
    snprintf(msg, sizeof msg, "%s prefill of 9, decode to 20", what);
    compare(msg, got, ref, N);
    tokens(tok + N, S, 5, 1);
    forward_ref(mx, tok + N, S, ref2, &log);
    int ctx0[2] = {0, 0}, count[2] = {N, S};
    CHECK_OK(feed(m, 2, tok, ctx0, count, got));
    snprintf(msg, sizeof msg, "%s batch, sequence of 20", what);
    compare(msg, got, ref, N);
    snprintf(msg, sizeof msg, "%s batch, sequence of 11", what);
    compare(msg, got + (size_t)N * V, ref2, S);
}

static void test_model(int mx) {
    char dir[600];
    const char *what = mx ? "gpt-oss (MXFP4 experts)" : "gpt-oss (bf16 experts)";
    if (!harness_mkdtemp(dir, sizeof dir, mx ? "gptoss-mxfp4" : "gptoss")) return;
    atlas_model_params p = ckpt_params(MAX_T, BLOCK, MAX_BLOCKS);
    atlas_model *m = NULL;
    if (write_model(dir, mx ? mxfp4_config : bf16_config, mx, NULL)) {
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (m) run_model(m, mx, what);
        if (m) CHECK_OK(atlas_model_release(m));
        atlas_model_survey s;
        CHECK_OK(atlas_model_inspect(dir, &p, &s));
        CHECK_MSG(strstr(s.formats, mx ? "experts MXFP4 e2m1 group 32" : "experts BF16"), "%s",
                  s.formats);
        CHECK(s.n_experts == E && s.n_experts_used == KU && s.expert_ffn == F &&
              s.n_moe_layers == L);
    }
    harness_rm_rf(dir);
}

/* GptOssConfig's defaults where config.json says only the sizes. */
static void test_config(void) {
    static const char *bare =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 2880, "
        "\"intermediate_size\": 2880, \"num_attention_heads\": 64, \"num_hidden_layers\": 4, "
        "\"vocab_size\": 201088}";
    atlas_config c;
    CHECK_OK(atlas_config_parse(bare, strlen(bare), "bare", &c));
    CHECK(c.arch == ATLAS_ARCH_GPT_OSS && c.head_dim == 64 && c.n_kv_heads == 8 &&
          c.rms_eps == 1e-5 && c.sliding_window == 128 && c.qkv_bias && c.o_bias &&
          c.attn_sinks && c.moe_topk_softmax && c.moe_bias && c.n_experts == 128 &&
          c.n_experts_used == 4 && c.expert_ffn == 2880 && c.swiglu_limit == 7.0 &&
          c.swiglu_alpha == 1.702 && c.act == ATLAS_ACT_SWIGLU_CLAMP && !c.tie_embeddings);
    for (int l = 0; l < 4; l++) {
        CHECK_MSG(atlas_config_layer_sliding(&c, l) == (l % 2 == 0), "layer %d", l);
        CHECK(atlas_config_layer_moe(&c, l));
    }
    CHECK(c.rope.type == ATLAS_ROPE_YARN && c.rope.factor == 32 && c.rope.theta == 150000 &&
          !c.rope.truncate && c.rope.original_max_position == 4096 &&
          atlas_config_max_context(&c) == 131072);
    static const char *split =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 64, "
        "\"intermediate_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"num_hidden_layers\": 2, \"vocab_size\": 32, \"num_experts_per_tok\": 4, \"experts_per_token\": 2}";
    CHECK(atlas_config_parse(split, strlen(split), "split", &c) == ATLAS_ERR_FORMAT);
    CHECK_MSG(strstr(atlas_last_error(), "experts_per_token"), "%s", atlas_last_error());
}

/* MXFP4 experts need quantization_config mxfp4; every sink is needed. */
static void test_refusals(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "gptoss-bad")) return;
    atlas_model_params p = ckpt_params(MAX_T, BLOCK, MAX_BLOCKS);
    atlas_model *m = NULL;
    if (write_model(dir, bf16_config, 1, NULL)) {
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_FORMAT);
        CHECK_MSG(strstr(atlas_last_error(), "gate_up_proj_blocks") &&
                  strstr(atlas_last_error(), "mxfp4"), "%s", atlas_last_error());
    }
    const char *gone = "model.layers.1.self_attn.sinks";
    if (write_model(dir, bf16_config, 0, gone)) {
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND);
        CHECK_MSG(strstr(atlas_last_error(), gone), "%s", atlas_last_error());
    }
    harness_rm_rf(dir);
}

/* ---- the route op alone ----------------------------------------------------------------- */

/* One token of ones through a router whose experts 2 and 3 are alike: with bias b, logits
 * 8 * row + b. want: the two ids chosen, and the logits whose softmax are their weights. */
static void route_case(atlas_backend *be, const atlas_weight *router, const float *bias,
                       const int *want, const double *logit) {
    atlas_weight_src src = {.name = "bias", .dtype = ATLAS_DTYPE_F32, .n_dims = 1,
                            .shape = {4}, .nbytes = 4 * sizeof(float), .data = bias};
    const atlas_weight_src *sp = &src;
    atlas_weight *b = NULL;
    float h[8] = {1, 1, 1, 1, 1, 1, 1, 1}, wts[2];
    int32_t ids[2];
    CHECK_OK(be->ops->weight_load(be, &sp, 1, &b));
    if (b) CHECK_OK(be->ops->moe_route(be, ids, wts, h, router, b, 1));
    double w0 = 1 / (1 + exp(logit[1] - logit[0]));
    CHECK_MSG(b && ids[0] == want[0] && ids[1] == want[1], "experts %d, %d; want %d, %d",
              ids[0], ids[1], want[0], want[1]);
    CHECK_MSG(b && fabs(wts[0] - w0) < 1e-6 && fabs(wts[1] - (1 - w0)) < 1e-6,
              "weights %g %g, want %g %g", wts[0], wts[1], w0, 1 - w0);
    be->ops->weight_free(be, b);
}

static void test_route(void) {
    double inv[4] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = 8, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-6f,
                            .rope_inv_freq = inv, .rope_attn_factor = 1, .n_experts = 4,
                            .n_experts_used = 2, .expert_ffn = 4,
                            .moe_route = ATLAS_ROUTE_TOPK_SOFTMAX};
    float router[4 * 8];
    for (int j = 0; j < 8; j++)
        router[j] = -0.5f, router[8 + j] = 0.75f, router[16 + j] = router[24 + j] = 0.25f;
    atlas_backend *be = NULL;
    CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
    if (!be) return;
    atlas_weight_src src = {.name = "router", .dtype = ATLAS_DTYPE_F32, .n_dims = 2,
                            .shape = {4, 8}, .nbytes = sizeof router, .data = router};
    const atlas_weight_src *sp = &src;
    atlas_weight *w = NULL;
    CHECK_OK(be->ops->weight_load(be, &sp, 1, &w));
    if (w) { /* logits -4, 6, 2.1, 2.1: the tie goes to expert 2; then the bias lifts 0 */
        route_case(be, w, (const float[]){0, 0, 0.1f, 0.1f}, (const int[]){1, 2},
                   (const double[]){6, 2.0 + 0.1f});
        route_case(be, w, (const float[]){7, 0, 0.1f, 0.1f}, (const int[]){1, 0},
                   (const double[]){6, 3});
    }
    be->ops->weight_free(be, w);
    CHECK_OK(be->ops->destroy(be));
}

/* ---- the tokenizer ----------------------------------------------------------------------- */

/* GPT-2's byte-level alphabet: byte b's character, as UTF-8. */
static void byte_char(int b, char out[3]) {
    int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae, cp = b;
    for (int i = 0, n = 0; !printable && i <= b; i++) {
        bool p = (i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae;
        if (i == b) cp = 0x100 + n;
        n += !p;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

/* o200k's pre-tokenizer, as gpt-oss's tokenizer.json has it. */
static const char O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
    "\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}"
    "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *const HARMONY[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                      "<|call|>", "<|return|>"};

static void test_harmony_tokens(void) {
    char dir[600], path[700];
    if (!harness_mkdtemp(dir, sizeof dir, "gptoss-tok")) return;
    json_t *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (int i = 0; i < 6; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                               256 + i, "content", HARMONY[i], "single_word", 0,
                                               "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    json_t *pre = json_pack(
        "{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", O200K, "behavior", "Isolated",
        "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
        "use_regex", 0);
    json_t *root = json_pack("{s:s, s:o, s:n, s:o, s:n, s:{s:s}, s:{s:s, s:o, s:[], s:b}}",
                             "version", "1.0", "added_tokens", added, "normalizer",
                             "pre_tokenizer", pre, "post_processor", "decoder", "type",
                             "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges",
                             "ignore_merges", 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK(root && json_dump_file(root, path, 0) == 0);
    json_decref(root);
    atlas_tokenizer *tok = NULL;
    CHECK_OK(atlas_tokenizer_load_files(path, NULL, &tok));
    const char *text = "<|start|>assistant<|channel|>final<|message|>Hi 42's<|return|>";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok) CHECK_OK(atlas_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    static const int32_t want[] = {256, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 257, 'f',
                                   'i', 'n', 'a', 'l', 258, 'H', 'i', ' ', '4', '2', '\'', 's',
                                   261};
    CHECK_MSG(n == sizeof want / sizeof *want && !memcmp(ids, want, sizeof want),
              "the Harmony tokens are not one id each (%zu ids)", n);
    for (size_t i = 0; tok && i < atlas_tokenizer_added_count(tok); i++) {
        const char *t;
        size_t len;
        int32_t id;
        bool special = false;
        CHECK_OK(atlas_tokenizer_added_token(tok, i, &t, &len, &id, &special));
        CHECK_MSG(special, "%.*s is not special", (int)len, t);
    }
    char *out = NULL;
    size_t len = 0;
    if (n) CHECK_OK(atlas_tokenizer_decode(tok, ids, n, true, &out, &len));
    CHECK_MSG(out && !strcmp(out, "assistantfinalHi 42's"), "decoded '%s'", out ? out : "");
    free(out), free(ids);
    atlas_tokenizer_free(tok);
    harness_rm_rf(dir);
}

int main(void) {
    test_route();
    test_harmony_tokens();
    test_config();
    test_model(0);
    test_model(1);
    test_refusals();
    return harness_finish();
}
