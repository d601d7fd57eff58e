/* test-moe.c — mixture-of-experts models (Qwen3MoeForCausalLM, MixtralForCausalLM) on
 * checkpoints written here, through the CPU forward, against a forward written out below
 * from transformers' formulas in float64 (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock:
 * softmax over every expert, the top k, divided by their sum when norm_topk_prob or
 * Mixtral; each chosen expert's SwiGLU MLP times its weight, summed):
 * - Qwen3-MoE, three layers with the middle one dense (mlp_only_layers), six experts of
 *   which each token takes two, norm_topk_prob on: a 20-token prefill, a 9-token one decoded
 *   step by step to 20, and two sequences in one batch, each as alone. The tokens must not
 *   all take the same experts, and every routing must have a clear margin at its k-th
 *   expert (else float32 and float64 could choose differently and the test would say
 *   nothing).
 * - The same weights with norm_topk_prob off: its own reference, and other logits.
 * - Mixtral's tensor names (block_sparse_moe, w1/w3/w2), MixtralConfig's defaults (rms_norm_eps
 *   1e-5, rope_theta 1e6), every layer MoE.
 * - Which layers are MoE layers (decoder_sparse_step, mlp_only_layers, no experts).
 * - The ops alone: equal router probabilities take the lower expert index, with and without
 *   renormalisation.
 * - A missing expert, a stray tensor (transformers 5's fused experts beside the published
 *   ones) and tensor parallelism fail the load, named; the survey counts k of E experts in
 *   the bytes a token reads.
 * transformers' own references for these shapes are made on a GPU machine
 * (tools/conformance/shapes.py: qwen3-moe, mixtral). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "backend/backend.h"
#include "ckpt.h"
#include "core/dtype.h"
#include "harness.h"
#include "model/model_internal.h"

enum { BLOCK = 16, MAX_BLOCKS = 4, MAX_TOK = 24, MAXW = 32, MAXE = 8, MAX_T = 64 };

/* Deterministic values from the name and the index: norms near 1, the embedding in [-1, 1),
 * routers in [-3, 3) (clear margins between experts), the rest in [-0.5, 0.5). */
static float fill_value(void *user, const char *name, int64_t i) {
    (void)user;
    float u = ckpt_unit(name, i);
    if (strstr(name, "norm.weight")) return 1.0f + 0.25f * u;
    if (strstr(name, "embed_tokens")) return u;
    if (strstr(name, ".gate.weight")) return 3.0f * u;
    return 0.5f * u;
}

static double W(const char *name, int64_t i) { return ckpt_bf16(fill_value(NULL, name, i)); }

static void linear(const char *name, int rows, int cols, const double *in, double *out) {
    ckpt_ref_linear(fill_value, NULL, name, rows, cols, in, out);
}

static void rmsnorm(const char *w, const double *x, int d, double eps, double *out) {
    ckpt_ref_rmsnorm(fill_value, NULL, w, 0, 0.0, x, d, eps, out);
}

/* rotate-half of one head, frequencies and angles in float32 as transformers has them */
static void rotate(double *x, int hd, int pos, double theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow(theta, 2.0 * i / hd));
        float angle = inv * (float)pos;
        double c = (float)cos((double)angle), s = (float)sin((double)angle);
        double x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

static bool mixtral(const atlas_config *c) { return c->arch == ATLAS_ARCH_MIXTRAL; }

/* Layer l's tensor `what`; an expert's (e >= 0) in the family's spelling: which 0 gate, 1
 * up, 2 down. */
static const char *lname(const atlas_config *c, int l, const char *what, char *buf, size_t cap) {
    snprintf(buf, cap, "model.layers.%d.%s", l, what);
    return buf;
}

static const char *ename(const atlas_config *c, int l, int e, int which, char *buf, size_t cap) {
    static const char *const q[3] = {"gate_proj", "up_proj", "down_proj"}, *m[3] = {"w1", "w3",
                                                                                   "w2"};
    snprintf(buf, cap, "model.layers.%d.%s.experts.%d.%s.weight", l,
             mixtral(c) ? "block_sparse_moe" : "mlp", e, mixtral(c) ? m[which] : q[which]);
    return buf;
}

/* What the reference saw of the routing: the smallest margin between the k-th and the
 * next expert's logits, and whether any two tokens took different experts. */
typedef struct route_log {
    double min_gap;
    int first[MAXE], have_first, differs;
} route_log;

/* One MoE block of h[d] into out[d], as transformers' sparse MoE block. */
static void moe_ref(const atlas_config *c, int l, const double *h, double *out, route_log *rlog) {
    int E = c->n_experts, k = c->n_experts_used, d = c->hidden, f = c->expert_ffn;
    double p[MAXE], mx = -1e300, sum = 0, g[MAXW], u[MAXW], a[MAXW], y[MAXW], wsum = 0;
    int ids[MAXE] = {0}, taken[MAXE] = {0};
    char nm[128];
    snprintf(nm, sizeof nm, "model.layers.%d.%s.gate.weight", l,
             mixtral(c) ? "block_sparse_moe" : "mlp");
    linear(nm, E, d, h, p);
    for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < E; e++) sum += p[e] = exp(p[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        ids[j] = best, taken[best] = 1, wsum += p[best];
    }
    double next = 0, gap; /* in logits: float32's error is relative to them */
    for (int e = 0; e < E; e++) next = !taken[e] && p[e] > next ? p[e] : next;
    gap = next > 0 ? log(p[ids[k - 1]] / next) : 1e9;
    if (gap < rlog->min_gap) rlog->min_gap = gap;
    for (int j = 0; j < k; j++) {
        if (!rlog->have_first) rlog->first[j] = ids[j];
        else rlog->differs |= rlog->first[j] != ids[j];
    }
    rlog->have_first = 1;
    for (int j = 0; j < d; j++) out[j] = 0;
    for (int j = 0; j < k; j++) {
        int e = ids[j];
        double w = c->moe_norm_topk ? p[e] / wsum : p[e];
        linear(ename(c, l, e, 0, nm, sizeof nm), f, d, h, g);
        linear(ename(c, l, e, 1, nm, sizeof nm), f, d, h, u);
        for (int i = 0; i < f; i++) a[i] = g[i] / (1 + exp(-g[i])) * u[i];
        linear(ename(c, l, e, 2, nm, sizeof nm), d, f, a, y);
        for (int i = 0; i < d; i++) out[i] += w * y[i];
    }
}

/* One layer's attention of tokens [0, n): q/k normed (Qwen3-MoE), rotated, causal. */
static void attention_ref(const atlas_config *c, int l, double (*qkv)[3 * MAXW], int n,
                          double (*att)[MAXW]) {
    int H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim;
    double sc[MAX_TOK];
    char qn[96], kn[96];
    lname(c, l, "self_attn.q_norm.weight", qn, sizeof qn);
    lname(c, l, "self_attn.k_norm.weight", kn, sizeof kn);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H + K; hh++) {
            double *x = qkv[t] + hh * hd;
            if (c->qk_norm) rmsnorm(hh < H ? qn : kn, x, hd, c->rms_eps, x);
            rotate(x, hd, t, c->rope.theta);
        }
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < H; hh++) {
            const double *q = qkv[t] + hh * hd;
            int kvh = hh / (H / K);
            double mx = -1e300, sum = 0;
            for (int s = 0; s <= t; s++) {
                double dot = 0;
                for (int i = 0; i < hd; i++) dot += q[i] * qkv[s][(H + kvh) * hd + i];
                sc[s] = dot / sqrt((double)hd);
                if (sc[s] > mx) mx = sc[s];
            }
            for (int s = 0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int s = 0; s <= t; s++) acc += sc[s] * qkv[s][(H + K + kvh) * hd + i];
                att[t][hh * hd + i] = acc / sum;
            }
        }
}

/* The model in float64: logits [n, V] of one sequence. */
static void forward_ref(const atlas_config *c, const int32_t *tok, int n, double *logits,
                        route_log *log) {
    int d = c->hidden, H = c->n_heads, K = c->n_kv_heads, hd = c->head_dim, f = c->intermediate;
    static double x[MAX_TOK][MAXW], qkv[MAX_TOK][3 * MAXW], att[MAX_TOK][MAXW];
    double h[MAXW], o[MAXW], g[MAXW], u[MAXW], a[MAXW];
    char nm[128];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++) x[t][j] = W("model.embed_tokens.weight", (int64_t)tok[t] * d + j);
    for (int l = 0; l < c->n_layers; l++) {
        for (int t = 0; t < n; t++) {
            rmsnorm(lname(c, l, "input_layernorm.weight", nm, sizeof nm), x[t], d, c->rms_eps, h);
            linear(lname(c, l, "self_attn.q_proj.weight", nm, sizeof nm), H * hd, d, h, qkv[t]);
            linear(lname(c, l, "self_attn.k_proj.weight", nm, sizeof nm), K * hd, d, h,
                   qkv[t] + H * hd);
            linear(lname(c, l, "self_attn.v_proj.weight", nm, sizeof nm), K * hd, d, h,
                   qkv[t] + (H + K) * hd);
        }
        attention_ref(c, l, qkv, n, att);
        for (int t = 0; t < n; t++) {
            linear(lname(c, l, "self_attn.o_proj.weight", nm, sizeof nm), d, H * hd, att[t], o);
            for (int j = 0; j < d; j++) x[t][j] += o[j];
            rmsnorm(lname(c, l, "post_attention_layernorm.weight", nm, sizeof nm), x[t], d,
                    c->rms_eps, h);
            if (atlas_config_layer_moe(c, l)) {
                moe_ref(c, l, h, o, log);
            } else {
                linear(lname(c, l, "mlp.gate_proj.weight", nm, sizeof nm), f, d, h, g);
                linear(lname(c, l, "mlp.up_proj.weight", nm, sizeof nm), f, d, h, u);
                for (int i = 0; i < f; i++) a[i] = g[i] / (1 + exp(-g[i])) * u[i];
                linear(lname(c, l, "mlp.down_proj.weight", nm, sizeof nm), d, f, a, o);
            }
            for (int j = 0; j < d; j++) x[t][j] += o[j];
        }
    }
    for (int t = 0; t < n; t++) {
        rmsnorm("model.norm.weight", x[t], d, c->rms_eps, h);
        for (int v = 0; v < c->vocab_size; v++) {
            double acc = 0;
            for (int j = 0; j < d; j++) acc += W("lm_head.weight", (int64_t)v * d + j) * h[j];
            logits[(size_t)t * c->vocab_size + v] = acc;
        }
    }
}

/* ---- checkpoints ---------------------------------------------------------------------- */

/* Every tensor of c's model, as published, into t[] (cap of them); the count. */
static int tensors_of(const atlas_config *c, ckpt_extra *t, int cap, char (*names)[128]) {
    int n = 0, d = c->hidden, hd = c->head_dim, H = c->n_heads, K = c->n_kv_heads;
#define ADD(r, co, ...) \
    (n < cap ? (snprintf(names[n], 128, __VA_ARGS__), t[n] = (ckpt_extra){names[n], r, co}, n++) : 0)
    ADD(c->vocab_size, d, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const char *pre = "model.layers";
        ADD(d, 0, "%s.%d.input_layernorm.weight", pre, l);
        ADD(d, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
        ADD(H * hd, d, "%s.%d.self_attn.q_proj.weight", pre, l);
        ADD(K * hd, d, "%s.%d.self_attn.k_proj.weight", pre, l);
        ADD(K * hd, d, "%s.%d.self_attn.v_proj.weight", pre, l);
        ADD(d, H * hd, "%s.%d.self_attn.o_proj.weight", pre, l);
        if (c->qk_norm) {
            ADD(hd, 0, "%s.%d.self_attn.q_norm.weight", pre, l);
            ADD(hd, 0, "%s.%d.self_attn.k_norm.weight", pre, l);
        }
        if (!atlas_config_layer_moe(c, l)) {
            ADD(c->intermediate, d, "%s.%d.mlp.gate_proj.weight", pre, l);
            ADD(c->intermediate, d, "%s.%d.mlp.up_proj.weight", pre, l);
            ADD(d, c->intermediate, "%s.%d.mlp.down_proj.weight", pre, l);
            continue;
        }
        char en[128];
        ADD(c->n_experts, d, "%s.%d.%s.gate.weight", pre, l,
            mixtral(c) ? "block_sparse_moe" : "mlp");
        for (int e = 0; e < c->n_experts; e++) {
            ADD(c->expert_ffn, d, "%s", ename(c, l, e, 0, en, sizeof en));
            ADD(c->expert_ffn, d, "%s", ename(c, l, e, 1, en, sizeof en));
            ADD(d, c->expert_ffn, "%s", ename(c, l, e, 2, en, sizeof en));
        }
    }
    ADD(d, 0, "model.norm.weight");
    ADD(c->vocab_size, d, "lm_head.weight");
#undef ADD
    return n;
}

enum { MAX_TENSORS = 256 };

/* dir/config.json and the model's tensors, less `drop` (NULL: none), plus `extra` (NULL:
 * none, a [8, 16] matrix otherwise). Returns 1, or 0 after a CHECK failed. */
static int write_model(const char *dir, const char *config, atlas_config *c, const char *drop,
                       const char *extra) {
    static ckpt_extra t[MAX_TENSORS];
    static char names[MAX_TENSORS][128];
    CHECK_OK(atlas_config_parse(config, strlen(config), "moe", c));
    int n = tensors_of(c, t, MAX_TENSORS - 1, names), k = 0;
    CHECK(n < MAX_TENSORS - 1);
    for (int i = 0; i < n; i++)
        if (!drop || strcmp(t[i].name, drop)) t[k++] = t[i];
    if (extra) t[k++] = (ckpt_extra){extra, 8, 16};
    return ckpt_write_text(dir, "config.json", config) &&
           ckpt_write_tensors(dir, t, k, fill_value, NULL);
}

/* ---- runs ----------------------------------------------------------------------------- */

/* One batch of n_seqs sequences (tests/ckpt.h's ckpt_feed, blocks in order). */
static atlas_status feed(atlas_model *m, int n_seqs, const int32_t *tokens, const int *ctx0,
                         const int *count, float *logits) {
    return ckpt_feed(m, n_seqs, tokens, ctx0, count, NULL, MAX_BLOCKS, false, logits);
}

static double compare(const char *what, const float *got, const double *ref, int n, int V) {
    float *want = malloc(sizeof(float) * (size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++) want[i] = (float)ref[i];
    double e = harness_rel_err(got, want, n * V);
    CHECK_MSG(e <= 1e-5, "%s: logits error %.3g against the float64 forward", what, e);
    printf("%s: %d positions, logits error %.2e\n", what, n, e);
    free(want);
    return e;
}

enum { N = 20, P = 9, S = 11 };

static void tokens(int32_t *tok, int n, int mul, int add, int V) {
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * mul + add) % V);
}

/* A 20-token prefill, 9 then one a step, and two sequences in one batch; out: the
 * prefill's logits [N, V]. */
static void run_model(atlas_model *m, const char *what, float *out) {
    const atlas_config *c = &m->cfg;
    int V = c->vocab_size, zero = 0, n = N, p = P;
    int32_t tok[2 * N];
    double *ref = malloc(sizeof(double) * N * V), *ref2 = malloc(sizeof(double) * S * V);
    float *got = malloc(sizeof(float) * 2 * N * V);
    route_log log = {.min_gap = 1e9};
    tokens(tok, N, 7, 3, V);
    forward_ref(c, tok, N, ref, &log);
    CHECK_MSG(log.differs, "%s: every token took the same experts", what);
    /* float32's logits are within ~1e-5 of float64's here: 1e-3 cannot flip */
    CHECK_MSG(log.min_gap > 1e-3, "%s: a routing without a margin (%.2g)", what, log.min_gap);
    printf("%s: the closest routing has its k-th expert's logit %.3f above the next\n", what,
           log.min_gap);
    char msg[160];
    snprintf(msg, sizeof msg, "%s prefill of 20", what);
    CHECK_OK(feed(m, 1, tok, &zero, &n, got));
    compare(msg, got, ref, N, V);
    memcpy(out, got, sizeof(float) * N * V);
    CHECK_OK(feed(m, 1, tok, &zero, &p, got));
    for (int q = P, one = 1; q < N; q++)
        CHECK_OK(feed(m, 1, tok + q, &q, &one, got + (size_t)q * V));
    snprintf(msg, sizeof msg, "%s prefill of 9, decode to 20", what);
    compare(msg, got, ref, N, V);
    /* two sequences in one batch: each as alone */
    tokens(tok + N, S, 5, 1, V);
    forward_ref(c, tok + N, S, ref2, &log);
    int ctx0[2] = {0, 0}, count[2] = {N, S};
    CHECK_OK(feed(m, 2, tok, ctx0, count, got));
    snprintf(msg, sizeof msg, "%s batch, sequence of 20", what);
    compare(msg, got, ref, N, V);
    snprintf(msg, sizeof msg, "%s batch, sequence of 11", what);
    compare(msg, got + (size_t)N * V, ref2, S, V);
    free(ref), free(ref2), free(got);
}

#define QWEN3_MOE(norm)                                                                        \
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, "                    \
    "\"intermediate_size\": 24, \"moe_intermediate_size\": 12, \"num_experts\": 6, "          \
    "\"num_experts_per_tok\": 2, \"norm_topk_prob\": " norm ", \"mlp_only_layers\": [1], "   \
    "\"decoder_sparse_step\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "    \
    "\"head_dim\": 8, \"num_hidden_layers\": 3, \"vocab_size\": 32, \"rms_norm_eps\": 1e-6, " \
    "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"router_aux_loss_coef\": 0.001, " \
    "\"output_router_logits\": false}"

static void test_qwen3_moe(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "qwen3-moe")) return;
    atlas_config c;
    atlas_model_params p = ckpt_params(MAX_T, BLOCK, MAX_BLOCKS);
    atlas_model *m = NULL;
    float *on = malloc(sizeof(float) * N * 32), *off = malloc(sizeof(float) * N * 32);
    if (write_model(dir, QWEN3_MOE("true"), &c, NULL, NULL)) {
        CHECK(c.n_experts == 6 && c.n_experts_used == 2 && c.expert_ffn == 12 &&
              c.moe_norm_topk && c.qk_norm && atlas_config_layer_moe(&c, 0) &&
              !atlas_config_layer_moe(&c, 1) && atlas_config_layer_moe(&c, 2));
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (m) run_model(m, "qwen3-moe (norm_topk_prob)", on);
        if (m) CHECK_OK(atlas_model_release(m));
    }
    /* the same weights, the top k's probabilities as they are */
    if (ckpt_write_text(dir, "config.json", QWEN3_MOE("false"))) {
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (m) run_model(m, "qwen3-moe (raw top-k)", off);
        if (m) CHECK_OK(atlas_model_release(m));
        double e = harness_rel_err(on, off, N * 32);
        CHECK_MSG(e > 1e-3, "norm_topk_prob on and off within %.3g", e);
    }
    /* the bytes a token reads: k of each layer's E experts, the rest whole */
    atlas_model_survey s;
    CHECK_OK(atlas_model_inspect(dir, &p, &s));
    size_t d = 16, experts = 2 * 6 * 3 * 12 * d * 2, all = s.weight_bytes;
    size_t row = d * 2, embed = 32 * d * 2;
    CHECK_MSG(s.token_weight_bytes == all - embed + row - experts + experts * 2 / 6,
              "a token reads %zu of %zu bytes", s.token_weight_bytes, all);
    CHECK_MSG(strstr(s.formats, "experts BF16"), "%s", s.formats);
    CHECK(s.n_experts == 6 && s.n_experts_used == 2 && s.expert_ffn == 12 &&
          s.n_moe_layers == 2 && s.intermediate == 24);
    free(on), free(off);
    harness_rm_rf(dir);
}

/* Which layers are MoE layers: every decoder_sparse_step-th (1-based) but those of
 * mlp_only_layers, none without experts; more experts a token than there are is refused. */
static void test_layer_kinds(void) {
    static const char *step =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, "
        "\"intermediate_size\": 24, \"num_attention_heads\": 8, \"num_hidden_layers\": 6, "
        "\"vocab_size\": 32, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3, 9]}";
    atlas_config c;
    CHECK_OK(atlas_config_parse(step, strlen(step), "step", &c));
    static const int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++) CHECK_MSG(atlas_config_layer_moe(&c, l) == want[l], "layer %d", l);
    CHECK(c.n_experts == 128 && c.n_experts_used == 8 && c.expert_ffn == 768 &&
          !c.moe_norm_topk && c.head_dim == 2 && c.n_kv_heads == 4);
    static const char *none =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, "
        "\"intermediate_size\": 24, \"num_attention_heads\": 8, \"num_hidden_layers\": 2, "
        "\"vocab_size\": 32, \"num_experts\": 0}";
    CHECK_OK(atlas_config_parse(none, strlen(none), "none", &c));
    CHECK(c.n_experts == 0 && !atlas_config_layer_moe(&c, 0) && !atlas_config_layer_moe(&c, 1));
    static const char *many =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 16, "
        "\"intermediate_size\": 24, \"num_attention_heads\": 8, \"num_hidden_layers\": 2, "
        "\"vocab_size\": 32, \"num_local_experts\": 2, \"num_experts_per_tok\": 3}";
    CHECK(atlas_config_parse(many, strlen(many), "many", &c) == ATLAS_ERR_RANGE);
    CHECK_MSG(strstr(atlas_last_error(), "num_experts_per_tok"), "%s", atlas_last_error());
}

/* What a checkpoint must hold, and may not: each refusal named. */
static void test_refusals(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "moe-bad")) return;
    atlas_config c;
    atlas_model_params p = ckpt_params(MAX_T, BLOCK, MAX_BLOCKS);
    atlas_model *m = NULL;
    const char *gone = "model.layers.2.mlp.experts.5.up_proj.weight";
    if (write_model(dir, QWEN3_MOE("true"), &c, gone, NULL)) {
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_NOT_FOUND);
        CHECK_MSG(strstr(atlas_last_error(), gone), "%s", atlas_last_error());
    }
    const char *fused = "model.layers.0.mlp.experts.gate_up_proj";
    if (write_model(dir, QWEN3_MOE("true"), &c, NULL, fused)) {
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(atlas_last_error(), fused), "%s", atlas_last_error());
    }
    if (write_model(dir, QWEN3_MOE("true"), &c, NULL, NULL)) {
        p.tp_size = 2;
        CHECK(atlas_model_load(dir, &p, &m) == ATLAS_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(atlas_last_error(), "tensor parallelism"), "%s", atlas_last_error());
    }
    harness_rm_rf(dir);
}

static const char *mixtral_config =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 16, "
    "\"intermediate_size\": 12, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"num_hidden_layers\": 2, "
    "\"vocab_size\": 32, \"sliding_window\": null, \"router_jitter_noise\": 0.0}";

static void test_mixtral(void) {
    char dir[600];
    if (!harness_mkdtemp(dir, sizeof dir, "mixtral")) return;
    atlas_config c;
    atlas_model_params p = ckpt_params(MAX_T, BLOCK, MAX_BLOCKS);
    atlas_model *m = NULL;
    float *got = malloc(sizeof(float) * N * 32);
    if (write_model(dir, mixtral_config, &c, NULL, NULL)) {
        CHECK(c.n_experts == 4 && c.n_experts_used == 2 && c.expert_ffn == 12 &&
              c.moe_norm_topk && !c.qk_norm && c.head_dim == 8 && c.rms_eps == 1e-5 &&
              c.rope.theta == 1e6 && c.sliding_window == 0 && atlas_config_layer_moe(&c, 0) &&
              atlas_config_layer_moe(&c, 1));
        CHECK_OK(atlas_model_load(dir, &p, &m));
        if (m) run_model(m, "mixtral", got);
        if (m) CHECK_OK(atlas_model_release(m));
    }
    free(got);
    harness_rm_rf(dir);
}

/* ---- the ops alone ---------------------------------------------------------------------- */

/* Experts 2 and 3 have the same router row, so the same probability, second to expert 1's:
 * the top two are 1 and 2 (the lower index of the tie), with and without renormalisation. */
static void test_route_ties(void) {
    enum { D = 8, E = 4 };
    double inv[D / 2] = {1, 0.1, 0.01, 0.001};
    atlas_backend_geom g = {.hidden = D, .n_heads = 1, .n_kv_heads = 1, .head_dim = D,
                            .intermediate = 8, .vocab_size = 4, .n_layers = 1, .rms_eps = 1e-6f,
                            .rope_inv_freq = inv, .rope_attn_factor = 1, .n_experts = E,
                            .n_experts_used = 2, .expert_ffn = 4};
    float router[E * D], h[2 * D];
    for (int j = 0; j < D; j++) {
        router[0 * D + j] = -0.5f, router[1 * D + j] = 0.75f;
        router[2 * D + j] = router[3 * D + j] = 0.25f;
        h[j] = 1.0f, h[D + j] = j % 2 ? 1.0f : 0.5f;
    }
    for (int norm = 0; norm < 2; norm++) {
        g.moe_norm_topk = norm;
        atlas_backend *be = NULL;
        CHECK_OK(atlas_backend_cpu_create(&g, 1, &be));
        if (!be) return;
        atlas_weight_src src = {.name = "router", .dtype = ATLAS_DTYPE_F32, .n_dims = 2,
                                .shape = {E, D}, .nbytes = sizeof router, .data = router};
        const atlas_weight_src *sp = &src;
        atlas_weight *w = NULL;
        int32_t ids[4];
        float wts[4];
        CHECK_OK(be->ops->weight_load(be, &sp, 1, &w));
        if (w) CHECK_OK(be->ops->moe_route(be, ids, wts, h, w, NULL, 2));
        for (int t = 0; w && t < 2; t++) {
            double l1 = 0, l2 = 0, l0 = 0, sum;
            for (int j = 0; j < D; j++)
                l0 += -0.5 * h[t * D + j], l1 += 0.75 * h[t * D + j], l2 += 0.25 * h[t * D + j];
            sum = exp(l0) + exp(l1) + 2 * exp(l2);
            double p1 = exp(l1) / sum, p2 = exp(l2) / sum;
            double w1 = norm ? p1 / (p1 + p2) : p1, w2 = norm ? p2 / (p1 + p2) : p2;
            CHECK_MSG(ids[2 * t] == 1 && ids[2 * t + 1] == 2, "token %d: experts %d, %d", t,
                      ids[2 * t], ids[2 * t + 1]);
            CHECK_MSG(fabs(wts[2 * t] - w1) < 1e-6 && fabs(wts[2 * t + 1] - w2) < 1e-6,
                      "token %d (renormalised %d): weights %g %g, want %g %g", t, norm,
                      wts[2 * t], wts[2 * t + 1], w1, w2);
        }
        be->ops->weight_free(be, w);
        CHECK_OK(be->ops->destroy(be));
    }
}

int main(void) {
    test_route_ties();
    test_layer_kinds();
    test_qwen3_moe();
    test_mixtral();
    test_refusals();
    return harness_finish();
}
