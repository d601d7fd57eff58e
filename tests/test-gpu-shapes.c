/* test-gpu-shapes.c — the CUDA forward against the CPU backend on small random-weight models
 * of every geometry the supported architectures publish or allow (written at run time into
 * a mkdtemp directory: config.json and model.safetensors, bf16): head_dim 64/80/96/128/256,
 * groups of 1 (MHA) to 64 (MQA) query heads a kv head, non-power-of-two groups (3, 5, 7),
 * qkv bias, o_proj and MLP biases (Llama's attention_bias and mlp_bias, Qwen3's
 * attention_bias), q/k norm, tied and untied embeddings, sliding windows (Mistral on every layer,
 * Qwen2 from max_window_layers on). Each prompt is prefilled as the engine does it, in chunks
 * of B tokens against the cache already written (every chunk but the last asks for no logit
 * row), at lengths 1, 7, B - 1, B, B + 1 and 2B + 3 (some shapes also at 2,600, 5,000 or
 * 8,192: past the cluster decode attention's 4,096 slots), then decoded a token a step; a
 * second sequence is prefilled in chunks batched with the first one's decode steps. Logits
 * within 2e-2 (max |gpu - cpu| / max |cpu|, the bound for bf16 against fp32) at the
 * last prompt position and at every decode step. A shape the CPU runs and the GPU cannot is
 * refused at load with the limit named. Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atlas/model.h"
#include "core/dtype.h"
#include "harness.h"
#include "model/forward.h"

enum { VOCAB = 512, LAYERS = 2, BLOCK = 16, DECODE = 4 };
#define TOL 2e-2

typedef struct shape {
    const char *name, *arch; /* config.json "architectures"[0] */
    int hidden, H, K, hd, inter;
    int tied;
    int window;      /* sliding_window (0: none) */
    int window_from; /* Qwen2: max_window_layers (layers from here on slide) */
    int B;           /* tokens a prefill chunk */
    int long_len;    /* 0, or a long prompt prefilled in chunks of long_B */
    int long_B;
    int biases;      /* Llama: attention_bias and mlp_bias; Qwen3: attention_bias */
} shape;

/* Published shapes at reduced hidden/intermediate widths (the head layout is what selects the
 * kernels), and made-up ones for the features no listed model has. */
static const shape SHAPES[] = {
    /* Qwen2.5-0.5B: hidden 896, 14 / 2 heads of 64, qkv bias, tied (the fused bias) */
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", 896, 14, 2, 64, 256, 1, 0, 0, 64, 5000, 512, 0},
    /* Qwen2.5-7B heads: 28 / 4 of 128, qkv bias, untied */
    {"qwen2.5-7b", "Qwen2ForCausalLM", 512, 28, 4, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    /* Llama 3.1 8B heads (32 / 8 of 128), untied */
    {"llama3-8b", "LlamaForCausalLM", 512, 32, 8, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    /* the same group and head_dim with fewer heads, long: cluster -> split at 4096 slots */
    {"llama-g4-long", "LlamaForCausalLM", 256, 8, 2, 128, 256, 0, 0, 0, 64, 5000, 512, 0},
    /* Llama 3.2 1B heads (32 / 8 of 64), tied */
    {"llama3.2-1b", "LlamaForCausalLM", 512, 32, 8, 64, 256, 1, 0, 0, 64, 0, 0, 0},
    /* Llama 3.2 3B heads (24 / 8 of 128: group 3) */
    {"llama3.2-3b", "LlamaForCausalLM", 384, 24, 8, 128, 256, 1, 0, 0, 64, 0, 0, 0},
    /* Llama 2 7B: MHA (group 1) */
    {"llama2-mha", "LlamaForCausalLM", 256, 16, 16, 128, 256, 0, 0, 0, 64, 2600, 512, 0},
    /* Qwen3-0.6B heads (16 / 8 of 128), q/k norm, tied */
    {"qwen3-0.6b", "Qwen3ForCausalLM", 256, 16, 8, 128, 256, 1, 0, 0, 64, 0, 0, 0},
    /* Qwen3 group 8 (32B: 64 / 8), untied */
    {"qwen3-g8", "Qwen3ForCausalLM", 256, 16, 2, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    /* made up: head_dim 80 (group 3) and 96 (group 5), 256 (q/k norm; MQA of 16 and 32) */
    {"hd80-g3", "LlamaForCausalLM", 256, 12, 4, 80, 256, 0, 0, 0, 64, 2600, 512, 0},
    {"hd96-g5", "LlamaForCausalLM", 256, 10, 2, 96, 256, 1, 0, 0, 64, 0, 0, 0},
    {"hd256-g2", "Qwen3ForCausalLM", 256, 8, 4, 256, 256, 0, 0, 0, 64, 0, 0, 0},
    {"hd256-mqa16", "LlamaForCausalLM", 256, 16, 1, 256, 256, 0, 0, 0, 64, 0, 0, 0},
    {"hd256-mqa32", "LlamaForCausalLM", 256, 32, 1, 256, 256, 0, 0, 0, 64, 0, 0, 0},
    /* MQA: one kv head for 32 (hd 64 and 128) and 64 query heads */
    {"mqa32-hd64", "LlamaForCausalLM", 256, 32, 1, 64, 256, 1, 0, 0, 64, 0, 0, 0},
    {"mqa32-hd128", "LlamaForCausalLM", 256, 32, 1, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    {"mqa64-hd128", "LlamaForCausalLM", 256, 64, 1, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    /* group 7 at head_dim 128 with one kv head less: 7 / 1 */
    {"g7-mqa", "LlamaForCausalLM", 256, 7, 1, 128, 256, 0, 0, 0, 64, 0, 0, 0},
    /* sliding windows: Mistral on every layer, Qwen2 from layer 1 (max_window_layers) */
    {"mistral-window32", "MistralForCausalLM", 256, 8, 2, 128, 256, 0, 32, 0, 64, 0, 0, 0},
    {"qwen2-window32", "Qwen2ForCausalLM", 256, 14, 2, 64, 256, 1, 32, 1, 64, 0, 0, 0},
    /* Mistral v0.1: a 4,096-token window, run at 8,192 tokens */
    {"mistral-v0.1", "MistralForCausalLM", 256, 4, 1, 128, 256, 0, 4096, 0, 64, 8192, 512, 0},
    /* biases on every projection (q/k/v/o, gate/up/down): the plain matmul's bias behind o
     * and down, the gate_up bias in the decode GEMV's swiglu epilogue and in the prefill
     * matmuls (the bf16 prefill MLP chain takes no bias and steps aside) */
    {"llama-biases", "LlamaForCausalLM", 256, 8, 2, 128, 384, 0, 0, 0, 64, 0, 0, 1},
    /* Qwen3's attention_bias: q/k/v before the q/k norm, o after attention */
    {"qwen3-attn-bias", "Qwen3ForCausalLM", 256, 16, 8, 128, 256, 1, 0, 0, 64, 0, 0, 1},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static uint64_t rng;
static float urand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
}

static int is_arch(const shape *s, const char *a) { return !strcmp(s->arch, a); }

/* --- the checkpoint ------------------------------------------------------------------------- */

typedef struct tdesc {
    char name[96];
    int64_t rows, cols; /* cols 0: 1-D */
    float scale, offset; /* values offset + scale * U(-1, 1) */
} tdesc;

static int add(tdesc *t, int n, const char *name, int64_t rows, int64_t cols, float scale,
               float offset) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].rows = rows;
    t[n].cols = cols;
    t[n].scale = scale;
    t[n].offset = offset;
    return n + 1;
}

/* The tensors of shape s (at most 20 a layer + 3). */
static int tensors(const shape *s, tdesc *t) {
    int n = 0, d = s->hidden, hd = s->hd, q = s->H * hd, kv = s->K * hd, f = s->inter;
    int bias = is_arch(s, "Qwen2ForCausalLM") || s->biases, qk = is_arch(s, "Qwen3ForCausalLM");
    int mlp_bias = s->biases && is_arch(s, "LlamaForCausalLM");
    float sd = sqrtf(3.0f / (float)d); /* projections: unit-variance outputs for unit inputs */
    n = add(t, n, "model.embed_tokens.weight", VOCAB, d, 1.0f, 0);
    n = add(t, n, "model.norm.weight", d, 0, 0.1f, 1.0f);
    if (!s->tied) n = add(t, n, "lm_head.weight", VOCAB, d, sd, 0);
    for (int l = 0; l < LAYERS; l++) {
        char p[64], nm[96];
        snprintf(p, sizeof p, "model.layers.%d.", l);
#define NM(x) (snprintf(nm, sizeof nm, "%s%s", p, x), nm)
        n = add(t, n, NM("input_layernorm.weight"), d, 0, 0.1f, 1.0f);
        n = add(t, n, NM("self_attn.q_proj.weight"), q, d, sd, 0);
        n = add(t, n, NM("self_attn.k_proj.weight"), kv, d, sd, 0);
        n = add(t, n, NM("self_attn.v_proj.weight"), kv, d, sd, 0);
        if (bias) {
            n = add(t, n, NM("self_attn.q_proj.bias"), q, 0, 0.5f, 0);
            n = add(t, n, NM("self_attn.k_proj.bias"), kv, 0, 0.5f, 0);
            n = add(t, n, NM("self_attn.v_proj.bias"), kv, 0, 0.5f, 0);
        }
        if (qk) {
            n = add(t, n, NM("self_attn.q_norm.weight"), hd, 0, 0.1f, 1.0f);
            n = add(t, n, NM("self_attn.k_norm.weight"), hd, 0, 0.1f, 1.0f);
        }
        n = add(t, n, NM("self_attn.o_proj.weight"), d, q, sqrtf(3.0f / (float)q), 0);
        if (s->biases) n = add(t, n, NM("self_attn.o_proj.bias"), d, 0, 0.5f, 0);
        n = add(t, n, NM("post_attention_layernorm.weight"), d, 0, 0.1f, 1.0f);
        n = add(t, n, NM("mlp.gate_proj.weight"), f, d, sd, 0);
        n = add(t, n, NM("mlp.up_proj.weight"), f, d, sd, 0);
        n = add(t, n, NM("mlp.down_proj.weight"), d, f, sqrtf(3.0f / (float)f), 0);
        if (mlp_bias) {
            n = add(t, n, NM("mlp.gate_proj.bias"), f, 0, 0.5f, 0);
            n = add(t, n, NM("mlp.up_proj.bias"), f, 0, 0.5f, 0);
            n = add(t, n, NM("mlp.down_proj.bias"), d, 0, 0.5f, 0);
        }
#undef NM
    }
    return n;
}

static int write_file(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

static int write_config(const char *dir, const shape *s) {
    char cfg[2048];
    int qwen2 = is_arch(s, "Qwen2ForCausalLM");
    char window[160] = ""; /* Mistral: every layer, or null; Qwen: use_sliding_window */
    if (is_arch(s, "MistralForCausalLM") && s->window)
        snprintf(window, sizeof window, "\"sliding_window\": %d, ", s->window);
    else if (is_arch(s, "MistralForCausalLM"))
        snprintf(window, sizeof window, "\"sliding_window\": null, ");
    if (qwen2 || is_arch(s, "Qwen3ForCausalLM"))
        snprintf(window, sizeof window, "\"use_sliding_window\": %s, \"sliding_window\": %d, "
                 "\"max_window_layers\": %d, ", s->window ? "true" : "false",
                 s->window ? s->window : 4096, s->window_from);
    const char *biases = "";
    if (s->biases && is_arch(s, "LlamaForCausalLM"))
        biases = "\"attention_bias\": true, \"mlp_bias\": true, ";
    else if (s->biases)
        biases = "\"attention_bias\": true, ";
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
             "\"intermediate_size\": %d, \"vocab_size\": %d, \"tie_word_embeddings\": %s, %s%s"
             "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
             "\"max_position_embeddings\": 32768, \"torch_dtype\": \"bfloat16\"}\n",
             s->arch, s->hidden, LAYERS, s->H, s->K, s->hd, s->inter, VOCAB,
             s->tied ? "true" : "false", window, biases);
    return write_file(dir, "config.json", cfg);
}

/* model.safetensors: the tensors' header, then their bf16 values from the random stream. */
static int write_weights(const char *dir, const shape *s) {
    tdesc *t = calloc(3 + 20 * LAYERS, sizeof *t);
    int n = tensors(s, t);
    size_t cap = 256 + (size_t)n * 200, off = 0;
    char *hdr = malloc(cap), path[600];
    size_t len = (size_t)snprintf(hdr, cap, "{");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)t[i].rows * (t[i].cols ? t[i].cols : 1) * 2;
        char shp[48];
        if (t[i].cols) snprintf(shp, sizeof shp, "%lld,%lld", (long long)t[i].rows, (long long)t[i].cols);
        else snprintf(shp, sizeof shp, "%lld", (long long)t[i].rows);
        len += (size_t)snprintf(hdr + len, cap - len,
                                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                                i ? "," : "", t[i].name, shp, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    if (f) {
        uint64_t hl = len;
        ok &= fwrite(&hl, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len;
        for (int i = 0; i < n && ok; i++) {
            size_t cnt = (size_t)t[i].rows * (t[i].cols ? t[i].cols : 1);
            uint16_t *v = malloc(cnt * 2);
            for (size_t j = 0; j < cnt; j++)
                v[j] = atlas_f32_to_bf16(t[i].offset + t[i].scale * urand());
            ok &= fwrite(v, 2, cnt, f) == cnt;
            free(v);
        }
        ok &= fclose(f) == 0;
    }
    free(hdr);
    free(t);
    return ok;
}

/* --- running both backends ------------------------------------------------------------------ */

/* A sequence's blocks: table[i] = ((base + i) * 37) mod n_blocks, n_blocks coprime to 37,
 * so that sequences with disjoint [base, base + max_blocks) never share a block and
 * consecutive positions land in scattered blocks. */
typedef struct seq {
    int32_t *table;
    int ctx;
} seq;

typedef struct run {
    atlas_model *m[2]; /* cpu, cuda */
    int max_blocks, n_blocks;
    float *logits[2];  /* [2, VOCAB] each: a batch's logit rows */
} run;

static void seq_init(const run *r, seq *s, int base) {
    s->table = malloc((size_t)r->max_blocks * 4);
    for (int i = 0; i < r->max_blocks; i++)
        s->table[i] = (int32_t)(((int64_t)(base + i) * 37) % r->n_blocks);
    s->ctx = 0;
}

/* One batch on both backends: for each of n_seqs sequences count[k] tokens tok[k] (at its
 * context), logit rows: the last token of the sequences with want[k]. The logits' error is
 * checked; returns the CPU's argmax of the first logit row (-1: none). */
static int step(run *r, const char *what, seq **sq, int n_seqs, const int32_t *const *tok,
                const int *count, const int *want) {
    int total = 0, n_logits = 0;
    for (int k = 0; k < n_seqs; k++) total += count[k];
    int32_t *tokens = malloc((size_t)total * 4), *pos = malloc((size_t)total * 4);
    int32_t start[3], ctx[2], rows[2];
    int32_t *table = malloc((size_t)n_seqs * r->max_blocks * 4);
    int t = 0;
    for (int k = 0; k < n_seqs; k++) {
        start[k] = t;
        for (int i = 0; i < count[k]; i++, t++) {
            tokens[t] = tok[k][i];
            pos[t] = sq[k]->ctx + i;
        }
        ctx[k] = sq[k]->ctx + count[k];
        if (want[k]) rows[n_logits++] = t - 1;
        memcpy(table + (size_t)k * r->max_blocks, sq[k]->table, (size_t)r->max_blocks * 4);
    }
    start[n_seqs] = t;
    atlas_batch b = {.n_tokens = total, .tokens = tokens, .positions = pos, .n_seqs = n_seqs,
                     .seq_start = start, .seq_ctx = ctx, .block_table = table,
                     .max_blocks = (ctx[n_seqs - 1] > ctx[0] ? ctx[n_seqs - 1] : ctx[0]) /
                                       BLOCK + 1,
                     .n_logits = n_logits, .logit_rows = rows};
    if (b.max_blocks > r->max_blocks) b.max_blocks = r->max_blocks;
    /* the table rows are max_blocks apart: repack them at the batch's width */
    for (int k = 1; k < n_seqs; k++)
        memmove(table + (size_t)k * b.max_blocks, table + (size_t)k * r->max_blocks,
                (size_t)b.max_blocks * 4);
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        atlas_status st = atlas_model_forward(r->m[i], &b, r->logits[i]);
        CHECK_MSG(st == ATLAS_OK, "%s on %s: %s", what, i ? "cuda" : "cpu", atlas_last_error());
        ok &= st == ATLAS_OK;
    }
    int best = -1;
    if (ok) {
        for (int k = 0; k < n_seqs; k++) sq[k]->ctx = ctx[k];
        for (int j = 0; j < n_logits; j++) {
            double e = harness_rel_err(r->logits[1] + (size_t)j * VOCAB,
                                       r->logits[0] + (size_t)j * VOCAB, VOCAB);
            CHECK_MSG(e <= TOL, "%s, logit row %d: gpu vs cpu %.3g > %.0e", what, j, e, TOL);
            if (e > TOL || getenv("ATLAS_TEST_VERBOSE"))
                printf("    %s row %d: %.2e\n", what, j, e);
        }
        if (n_logits) best = harness_argmax(r->logits[0], VOCAB);
    }
    free(tokens);
    free(pos);
    free(table);
    return best;
}

static void random_tokens(int32_t *t, int n) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((urand() + 1.0f) * 0.5f * (VOCAB - 1));
}

/* A prompt of len tokens in chunks of B (the last one's logits compared), then DECODE steps
 * of the CPU's argmax. */
static void prompt_run(run *r, const shape *s, int len, int B, int base) {
    seq q;
    seq_init(r, &q, base);
    int32_t *ids = malloc((size_t)len * 4);
    random_tokens(ids, len);
    char what[128];
    int next = -1;
    for (int at = 0; at < len; at += B) {
        int n = len - at < B ? len - at : B, want = at + n == len;
        const int32_t *tok = ids + at;
        seq *sp = &q;
        snprintf(what, sizeof what, "%s len %d chunk at %d", s->name, len, at);
        next = step(r, what, &sp, 1, &tok, &n, &want);
        if (!want) CHECK(next == -1);
    }
    double worst = 0;
    for (int i = 0; i < DECODE && next >= 0; i++) {
        int32_t tok1 = next;
        const int32_t *tp = &tok1;
        int one = 1, want = 1;
        seq *sp = &q;
        snprintf(what, sizeof what, "%s len %d decode %d", s->name, len, i);
        next = step(r, what, &sp, 1, &tp, &one, &want);
        double e = harness_rel_err(r->logits[1], r->logits[0], VOCAB);
        if (e > worst) worst = e;
    }
    printf("  %-18s len %5d (chunks of %d) + %d decode steps: worst decode error %.2e\n",
           s->name, len, B, DECODE, worst);
    free(ids);
    free(q.table);
}

/* Sequence A (B + 1 tokens, then a token a step) decodes beside sequence B's prefill of 2B + 3
 * tokens in chunks of B: the engine's mixed batches, decode token first or last in turn;
 * only B's last chunk asks for its logit row. */
static void mixed_run(run *r, const shape *s, int B) {
    seq a, b;
    seq_init(r, &a, 0);
    seq_init(r, &b, r->max_blocks);
    int la = B + 1, lb = 2 * B + 3;
    int32_t *ia = malloc((size_t)la * 4), *ib = malloc((size_t)lb * 4);
    random_tokens(ia, la);
    random_tokens(ib, lb);
    char what[128];
    int next = -1;
    for (int at = 0; at < la; at += B) {
        int n = la - at < B ? la - at : B, want = at + n == la;
        const int32_t *tok = ia + at;
        seq *sp = &a;
        snprintf(what, sizeof what, "%s mixed: A's chunk at %d", s->name, at);
        next = step(r, what, &sp, 1, &tok, &n, &want);
    }
    for (int at = 0, k = 0; at < lb && next >= 0; at += B, k++) {
        int n = lb - at < B ? lb - at : B, one = 1;
        int32_t tok1 = next;
        const int32_t *toks[2];
        int count[2], want[2];
        seq *sp[2];
        int da = k % 2 == 0 ? 0 : 1; /* A's decode token first, then last */
        sp[da] = &a, toks[da] = &tok1, count[da] = one, want[da] = 1;
        sp[1 - da] = &b, toks[1 - da] = ib + at, count[1 - da] = n, want[1 - da] = at + n == lb;
        snprintf(what, sizeof what, "%s mixed: A decode + B's chunk at %d", s->name, at);
        int best = step(r, what, sp, 2, toks, count, want);
        /* the first logit row is A's when it comes first, else B's (or A's alone) */
        if (da == 0 || !want[0]) next = best;
        else next = harness_argmax(r->logits[0] + VOCAB, VOCAB);
    }
    printf("  %-18s mixed: %d-token prefill in chunks of %d beside decode steps\n", s->name,
           lb, B);
    free(ia);
    free(ib);
    free(a.table);
    free(b.table);
}

static atlas_model *load(const char *dir, atlas_device dev, int batch, int n_blocks,
                         atlas_status *st) {
    atlas_model_params p = atlas_model_default_params();
    p.device = dev;
    p.load_tokenizer = 0;
    p.kv_block_size = BLOCK;
    p.kv_blocks = n_blocks;
    p.max_batch_tokens = batch;
    atlas_model *m = NULL;
    *st = atlas_model_load(dir, &p, &m);
    return m;
}

static void test_shape(const shape *s, int index) {
    char dir[512];
    if (!harness_mkdtemp(dir, sizeof dir, "shapes")) return;
    rng = 0x9e3779b97f4a7c15ull + (uint64_t)index * 0x632be59bd9b4e019ull;
    CHECK(write_config(dir, s));
    CHECK(write_weights(dir, s));
    int longest = s->long_len > 2 * s->B + 3 ? s->long_len : 2 * s->B + 3;
    int max_blocks = (longest + DECODE + BLOCK) / BLOCK + 1;
    int batch = s->long_B > s->B ? s->long_B : s->B;
    run r = {{NULL, NULL}, max_blocks, 0, {NULL, NULL}};
    r.n_blocks = 2 * max_blocks + 1;
    while (r.n_blocks % 37 == 0) r.n_blocks++;
    atlas_status st;
    r.m[0] = load(dir, ATLAS_DEVICE_CPU, batch + 1, r.n_blocks, &st);
    CHECK_MSG(st == ATLAS_OK, "%s on cpu: %s", s->name, atlas_last_error());
    r.m[1] = load(dir, ATLAS_DEVICE_CUDA, batch + 1, r.n_blocks, &st);
    CHECK_MSG(st == ATLAS_OK, "%s on cuda: %s", s->name, atlas_last_error());
    if (r.m[0] && r.m[1]) {
        printf("%s: %s, hidden %d, heads %d / %d of %d (group %d)%s%s%s, window %d\n", s->name,
               s->arch, s->hidden, s->H, s->K, s->hd, s->H / s->K,
               is_arch(s, "Qwen2ForCausalLM") ? ", qkv bias" : "",
               is_arch(s, "Qwen3ForCausalLM") ? ", q/k norm" : "",
               s->biases ? ", attention/MLP biases" : "", s->window);
        r.logits[0] = malloc(2 * VOCAB * sizeof(float));
        r.logits[1] = malloc(2 * VOCAB * sizeof(float));
        int B = s->B, lens[] = {1, 7, B - 1, B, B + 1, 2 * B + 3};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
            prompt_run(&r, s, lens[i], B, (int)i * 7);
        mixed_run(&r, s, B);
        if (s->long_len) prompt_run(&r, s, s->long_len, s->long_B, 3);
        free(r.logits[0]);
        free(r.logits[1]);
    }
    CHECK_OK(atlas_model_release(r.m[0]));
    CHECK_OK(atlas_model_release(r.m[1]));
    harness_rm_rf(dir);
}

/* head_dim 12: the CPU runs it, the GPU's kernels move 8 bf16 at a time and refuse it at
 * load, naming the limit. */
static void test_refused(void) {
    static const shape s = {"hd12", "LlamaForCausalLM", 48, 4, 2, 12, 64, 0, 0, 0, 16, 0, 0, 0};
    char dir[512];
    if (!harness_mkdtemp(dir, sizeof dir, "shapes")) return;
    rng = 12345;
    CHECK(write_config(dir, &s));
    CHECK(write_weights(dir, &s));
    atlas_status st;
    atlas_model *c = load(dir, ATLAS_DEVICE_CPU, 16, 8, &st);
    CHECK_OK(st);
    atlas_model *g = load(dir, ATLAS_DEVICE_CUDA, 16, 8, &st);
    CHECK_MSG(st == ATLAS_ERR_UNSUPPORTED && !g, "head_dim 12 on cuda: %s, %s",
              atlas_status_str(st), atlas_last_error());
    CHECK_MSG(strstr(atlas_last_error(), "head_dim 12") != NULL, "%s", atlas_last_error());
    printf("hd12: refused on cuda: %s\n", atlas_last_error());
    CHECK_OK(atlas_model_release(c));
    CHECK_OK(atlas_model_release(g));
    harness_rm_rf(dir);
}

int main(int argc, char **argv) {
    /* the first shape decides whether there is a GPU at all */
    char dir[512];
    if (!harness_mkdtemp(dir, sizeof dir, "shapes")) return 1;
    rng = 1;
    CHECK(write_config(dir, &SHAPES[0]) && write_weights(dir, &SHAPES[0]));
    atlas_status st;
    atlas_model *probe = load(dir, ATLAS_DEVICE_CUDA, 64, 64, &st);
    harness_rm_rf(dir);
    HARNESS_SKIP_NO_DEVICE(st);
    CHECK_MSG(st == ATLAS_OK, "probe: %s", atlas_last_error());
    CHECK_OK(atlas_model_release(probe));
    /* argv[1]: only the shapes whose name contains it */
    for (int i = 0; i < N_SHAPES; i++)
        if (argc < 2 || strstr(SHAPES[i].name, argv[1])) test_shape(&SHAPES[i], i);
    test_refused();
    return harness_finish();
}
